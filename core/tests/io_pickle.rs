//! PyTorch checkpoints: real torch fixtures (zip, legacy, deflated) and corrupt or malicious
//! ones. Fixtures come from tests/fixtures/io/make_fixtures.py.

use std::path::{Path, PathBuf};

use sdflow_core::dtype::{self, DType};
use sdflow_core::io::{self, pickle, Format, OpenOptions, TensorSource};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/io")
        .join(name)
}

/// make_fixtures.py's `values`: `(arange(n) - n/2) * 0.25`, times 4 and truncated for ints.
fn expected(shape: &[usize], dt: DType) -> Vec<f64> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|k| {
            let base = (k as f64 - n as f64 / 2.0) * 0.25;
            match dt {
                DType::Bool => f64::from(u8::from(k % 3 == 0)),
                DType::I64 | DType::I32 | DType::I16 | DType::I8 => (base * 4.0).trunc(),
                _ => base,
            }
        })
        .collect()
}

const STATE: &[(&str, &[usize], DType)] = &[
    ("conv.weight", &[4, 3, 2, 2], DType::F32),
    ("conv.bias", &[4], DType::F16),
    ("norm.weight", &[8], DType::BF16),
    ("double", &[2, 3], DType::F64),
    ("ids", &[5], DType::I64),
    ("i32", &[3], DType::I32),
    ("i16", &[3], DType::I16),
    ("i8", &[6], DType::I8),
    ("mask", &[7], DType::Bool),
    ("scalar", &[], DType::F32),
];

fn values(src: &dyn TensorSource, name: &str) -> Vec<f64> {
    let info = src.get(name).unwrap_or_else(|| panic!("missing {name}"));
    let bytes = src.read(name).unwrap();
    dtype::to_f32(info.dtype, &bytes, info.n_elements())
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

fn check_state_dict(src: &dyn TensorSource) {
    assert_eq!(src.format(), Format::Pickle);
    for &(name, shape, dt) in STATE {
        let info = src
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing; have {:?}", names(src)));
        assert_eq!(info.dtype, dt, "{name}");
        assert_eq!(info.shape, shape, "{name}");
        assert_eq!(values(src, name), expected(shape, dt), "{name}");
    }
    let u8s = src.get("u8").unwrap();
    assert_eq!((u8s.dtype, u8s.shape.clone()), (DType::U8, vec![2, 2]));
    assert_eq!(&*src.read("u8").unwrap(), &[0, 1, 2, 3]);
    // big[3:5] of a (10, 4) tensor: a view at storage offset 12 sharing big's storage.
    let big = expected(&[10, 4], DType::F32);
    assert_eq!(values(src, "view.rows"), big[12..20].to_vec());
    assert_eq!(values(src, "view.base"), big);
    // Training state next to "state_dict" is not a tensor and the prefix is dropped.
    assert!(src.get("epoch").is_none() && src.get("state_dict.conv.weight").is_none());
    assert_eq!(src.tensors().len(), STATE.len() + 3);
}

fn names(src: &dyn TensorSource) -> Vec<String> {
    src.tensors().iter().map(|t| t.name.clone()).collect()
}

#[test]
fn zip_checkpoint_from_real_torch() {
    let src = io::open(&fixture("zip.ckpt")).unwrap();
    check_state_dict(&*src);
    // STORED entries are served straight from the mmap.
    assert!(matches!(
        src.read("conv.weight").unwrap(),
        io::TensorBytes::Borrowed(_)
    ));
}

#[test]
fn zip_checkpoint_without_mmap() {
    let src = io::open_with(&fixture("zip.ckpt"), &OpenOptions { mmap: false }).unwrap();
    check_state_dict(&*src);
}

#[test]
fn legacy_checkpoint_from_real_torch() {
    let src = io::open(&fixture("legacy.ckpt")).unwrap();
    check_state_dict(&*src);
}

#[test]
fn deflated_zip_entries_are_decompressed() {
    let src = io::open(&fixture("deflated.ckpt")).unwrap();
    check_state_dict(&*src);
}

#[test]
fn nested_dicts_flatten_to_dotted_names() {
    let src = io::open(&fixture("nested.pt")).unwrap();
    assert_eq!(names(&*src), ["model.a", "model.b.c"]);
    assert_eq!(values(&*src, "model.a"), [1.0, 1.0]);
    assert_eq!(src.get("model.b.c").unwrap().dtype, DType::F16);
}

fn open_err(name: &str) -> String {
    match io::open(&fixture(name)) {
        Ok(_) => panic!("{name} opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn non_contiguous_strides_are_rejected_naming_the_tensor() {
    for f in ["noncontig.pt", "noncontig_legacy.pt"] {
        let e = open_err(f);
        assert!(
            e.contains(f) && e.contains("tensor 't'") && e.contains("not contiguous"),
            "{e}"
        );
    }
}

#[test]
fn storage_types_outside_the_allowlist_are_rejected() {
    let e = open_err("unknown_storage.ckpt");
    assert!(
        e.contains("torch.EvilXStorage")
            && e.contains("allowlist")
            && e.contains("unknown_storage.ckpt"),
        "{e}"
    );
}

#[test]
fn zip_entry_smaller_than_its_storage_is_rejected() {
    let e = open_err("short_entry.ckpt");
    assert!(e.contains("data/0") && e.contains("holds"), "{e}");
}

#[test]
fn torch_pickle_with_os_system_reduce_runs_nothing() {
    let marker = Path::new("/tmp/sdflow_pwned_fixture_5b1e");
    let _ = std::fs::remove_file(marker);
    let src = io::open(&fixture("evil.ckpt")).unwrap();
    // The REDUCE of posix.system became None: only the real tensor is there.
    assert_eq!(names(&*src), ["w"]);
    assert!(!marker.exists(), "the payload ran");
    // The bare pickle has no torch magic and is refused before anything else.
    assert!(io::open(&fixture("evil_raw.pkl")).is_err());
    assert!(!marker.exists());
}

/// Minimal pickle assembly for hand-made payloads.
struct P(Vec<u8>);
impl P {
    fn new() -> Self {
        P(vec![0x80, 2])
    }
    fn op(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn s(mut self, s: &str) -> Self {
        self.0.push(b'X');
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn global(self, m: &str, n: &str) -> Self {
        self.op(format!("c{m}\n{n}\n").as_bytes())
    }
    fn int(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&[0x8a, 8]);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// `key: _rebuild_tensor_v2(storage(key_s, FloatStorage, numel), offset, size, stride)`
    /// inside an open dict (after `}(`).
    fn tensor(
        self,
        name: &str,
        storage: &str,
        numel: i64,
        offset: i64,
        size: &[i64],
        stride: &[i64],
    ) -> Self {
        let mut p = self
            .s(name)
            .global("torch._utils", "_rebuild_tensor_v2")
            .op(b"((")
            .s("storage")
            .global("torch", "FloatStorage")
            .s(storage)
            .s("cpu")
            .int(numel)
            .op(b"NtQ") // legacy 6-field persistent id: view metadata None
            .int(offset)
            .op(b"(");
        for &d in size {
            p = p.int(d);
        }
        p = p.op(b"t(");
        for &d in stride {
            p = p.int(d);
        }
        p.op(b"t\x89)tR")
    }
}

fn legacy_file(main: &[u8], keys: &[&str], storages: &[(u64, usize)]) -> Vec<u8> {
    let mut f = vec![
        0x80, 2, 0x8a, 10, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.',
    ];
    f.extend_from_slice(&[0x80, 2, b'M', 0xe9, 0x03, b'.']);
    f.extend_from_slice(&P::new().op(b"}.").0);
    f.extend_from_slice(main);
    let mut k = P::new().op(b"(");
    for key in keys {
        k = k.s(key);
    }
    f.extend_from_slice(&k.op(b"l.").0);
    for &(numel, bytes) in storages {
        f.extend_from_slice(&numel.to_le_bytes());
        f.extend(std::iter::repeat_n(0u8, bytes));
    }
    f
}

fn write_tmp(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn handmade_legacy_file_reads() {
    let main = P::new()
        .op(b"}(")
        .tensor("w", "k0", 6, 2, &[2, 2], &[2, 1])
        .op(b"u.")
        .0;
    let dir = tempfile::tempdir().unwrap();
    let p = write_tmp(&dir, "ok.pt", &legacy_file(&main, &["k0"], &[(6, 24)]));
    let src = io::open(&p).unwrap();
    let w = src.get("w").unwrap();
    assert_eq!(
        (w.dtype, w.shape.clone(), w.byte_len()),
        (DType::F32, vec![2, 2], 16)
    );
}

#[test]
fn lying_sizes_and_offsets_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "shape product overflows",
            legacy_file(
                &P::new()
                    .op(b"}(")
                    .tensor("w", "k0", 4, 0, &[1 << 62, 1 << 62], &[1 << 62, 1])
                    .op(b"u.")
                    .0,
                &["k0"],
                &[(4, 16)],
            ),
            "overflows",
        ),
        (
            "view past its storage",
            legacy_file(
                &P::new()
                    .op(b"}(")
                    .tensor("w", "k0", 4, 3, &[4], &[1])
                    .op(b"u.")
                    .0,
                &["k0"],
                &[(4, 16)],
            ),
            "outside its storage",
        ),
        (
            "huge storage offset",
            legacy_file(
                &P::new()
                    .op(b"}(")
                    .tensor("w", "k0", 4, i64::MAX, &[4], &[1])
                    .op(b"u.")
                    .0,
                &["k0"],
                &[(4, 16)],
            ),
            "outside its storage",
        ),
        (
            "storage data past EOF",
            legacy_file(
                &P::new()
                    .op(b"}(")
                    .tensor("w", "k0", 4, 0, &[4], &[1])
                    .op(b"u.")
                    .0,
                &["k0"],
                &[(1 << 60, 16)],
            ),
            "past the end",
        ),
        (
            "storage smaller than its id says",
            legacy_file(
                &P::new()
                    .op(b"}(")
                    .tensor("w", "k0", 8, 0, &[4], &[1])
                    .op(b"u.")
                    .0,
                &["k0"],
                &[(4, 16)],
            ),
            "holds 4 elements",
        ),
        (
            "negative size",
            legacy_file(
                &P::new()
                    .op(b"}(")
                    .tensor("w", "k0", 4, 0, &[-4], &[1])
                    .op(b"u.")
                    .0,
                &["k0"],
                &[(4, 16)],
            ),
            "non-negative",
        ),
    ];
    for (what, bytes, needle) in cases {
        let p = write_tmp(&dir, "bad.pt", &bytes);
        let e = match io::open(&p) {
            Ok(_) => panic!("{what}: opened"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(needle) && e.contains("bad.pt"), "{what}: {e}");
    }
}

#[test]
fn reduce_of_any_other_callable_yields_none_and_runs_nothing() {
    let marker = std::env::temp_dir().join(format!(
        "sdflow_pwned_{}_{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let cmd = format!("touch {}", marker.display());
    for (m, n) in [
        ("posix", "system"),
        ("os", "system"),
        ("builtins", "eval"),
        ("subprocess", "call"),
    ] {
        // {"w": tensor, "x": <callable>(cmd)} as the object pickle of a legacy file.
        let main = P::new()
            .op(b"}(")
            .tensor("w", "k0", 4, 0, &[4], &[1])
            .s("x")
            .global(m, n)
            .s(&cmd)
            .op(b"\x85R")
            .op(b"u.")
            .0;
        let u = pickle::unpickle(&main, 0).unwrap();
        assert_eq!(
            u.tensors
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>(),
            ["w"]
        );
        // Also as the whole object: a None root has no tensors.
        let root = P::new().global(m, n).s(&cmd).op(b"\x85R.").0;
        assert!(pickle::unpickle(&root, 0).unwrap().tensors.is_empty());
        // STACK_GLOBAL + NEWOBJ + BUILD are inert too.
        let p = P::new().s(m).s(n).op(b"\x93").s(&cmd).op(b"\x85\x81}b.").0;
        assert!(pickle::unpickle(&p, 0).unwrap().tensors.is_empty());
    }
    assert!(!marker.exists(), "a pickle payload ran");
}

#[test]
fn every_truncation_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["zip.ckpt", "legacy.ckpt"] {
        let full = std::fs::read(fixture(f)).unwrap();
        for cut in (0..full.len()).step_by(7) {
            let p = write_tmp(&dir, f, &full[..cut]);
            match io::open(&p) {
                Err(e) => assert!(e.to_string().contains(f), "{e}"),
                // Cutting only trailing padding/zip comment can leave a readable file; every
                // tensor must then still read.
                Ok(src) => {
                    for t in src.tensors() {
                        src.read(&t.name).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn random_byte_flips_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for f in ["zip.ckpt", "legacy.ckpt"] {
        let full = std::fs::read(fixture(f)).unwrap();
        for _ in 0..400 {
            let mut b = full.clone();
            for _ in 0..rng.random_range(1..8) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            if let Ok(parsed) = pickle::parse(&b) {
                for (_, _, _, loc) in parsed.tensors {
                    if let pickle::ParsedLoc::Range { start, len } = loc {
                        assert!(start + len <= b.len());
                    }
                }
            }
        }
    }
}

#[test]
fn pickled_modules_flatten_like_their_state_dict() {
    // {"model": Net() with _parameters {w}, _modules {sub: Sub() with _buffers {b} and a
    // plain attribute holding a tensor}} — as Ultralytics pickles a whole DetectionModel.
    let main = P::new()
        .op(b"}(")
        .s("model")
        .global("some.module", "Net")
        .op(b")\x81}(")
        .s("_parameters")
        .op(b"}(")
        .tensor("w", "k0", 4, 0, &[4], &[1])
        .op(b"u")
        .s("_modules")
        .op(b"}(")
        .s("sub")
        .global("some.module", "Sub")
        .op(b")\x81}(")
        .s("_buffers")
        .op(b"}(")
        .tensor("b", "k1", 2, 0, &[2], &[1])
        .op(b"u")
        .s("cache")
        .op(b"}(")
        .tensor("hidden", "k2", 2, 0, &[2], &[1])
        .op(b"u")
        .op(b"ub") // Sub's state, BUILD
        .op(b"u") // _modules
        .op(b"ub") // Net's state, BUILD
        .op(b"u.")
        .0;
    let u = pickle::unpickle(&main, 0).unwrap();
    let names: Vec<&str> = u.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["model.w", "model.sub.b"]);
    // An object whose state is not a module's contributes nothing, and a second BUILD
    // does not replace the first state.
    let p = P::new()
        .global("some.module", "Thing")
        .op(b")\x81}(")
        .tensor("x", "k0", 4, 0, &[4], &[1])
        .op(b"ub}(")
        .s("_parameters")
        .op(b"}(")
        .tensor("y", "k1", 4, 0, &[4], &[1])
        .op(b"uub.")
        .0;
    assert!(pickle::unpickle(&p, 0).unwrap().tensors.is_empty());
}
