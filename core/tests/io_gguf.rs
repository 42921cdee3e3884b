//! GGUF: every ggml type round-trips bit for bit; ggml's own reader agrees with our writer;
//! corrupt files fail with errors, never panics.

use std::ffi::CString;
use std::path::Path;

use sdflow_core::dtype::DType;
use sdflow_core::io::{self, gguf, Format};

fn kv() -> Vec<(String, gguf::Value)> {
    use gguf::Value as V;
    vec![
        (
            "general.architecture".into(),
            V::String("sdflow-test".into()),
        ),
        ("general.alignment".into(), V::U32(64)),
        ("u8".into(), V::U8(7)),
        ("i8".into(), V::I8(-7)),
        ("u16".into(), V::U16(65000)),
        ("i16".into(), V::I16(-3000)),
        ("i32".into(), V::I32(-70000)),
        ("f32".into(), V::F32(1.5)),
        ("bool".into(), V::Bool(true)),
        ("u64".into(), V::U64(1 << 40)),
        ("i64".into(), V::I64(-(1 << 40))),
        ("f64".into(), V::F64(0.25)),
        (
            "tokens".into(),
            V::Array(vec![V::String("a".into()), V::String("bc".into())]),
        ),
        (
            "ints".into(),
            V::Array(vec![V::I32(1), V::I32(2), V::I32(3)]),
        ),
        ("empty".into(), V::Array(vec![])),
    ]
}

/// One tensor of every ggml type: shape (3, 2 blocks) with pseudo-random bytes.
fn all_types() -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    DType::all()
        .filter(|d| d.ggml_type().is_some())
        .enumerate()
        .map(|(i, d)| {
            let shape = vec![3, 2 * d.block_size()];
            let n = d.byte_len(6 * d.block_size()).unwrap();
            let bytes = (0..n).map(|b| ((b * 131 + i * 17) % 256) as u8).collect();
            (format!("t.{}", d.name()), d, shape, bytes)
        })
        .collect()
}

fn write(path: &Path, kv: &[(String, gguf::Value)], ts: &[(String, DType, Vec<usize>, Vec<u8>)]) {
    gguf::write(
        path,
        kv,
        ts.iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())),
    )
    .unwrap();
}

#[test]
fn every_ggml_type_round_trips_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let ts = all_types();
    assert!(ts.len() >= 30, "only {} ggml types", ts.len());
    write(&p, &kv(), &ts);
    let src = io::open(&p).unwrap();
    assert_eq!(src.format(), Format::Gguf);
    for (n, d, s, b) in &ts {
        let info = src.get(n).unwrap();
        assert_eq!((&info.dtype, &info.shape), (d, s), "{n}");
        assert_eq!(&*src.read(n).unwrap(), b.as_slice(), "{n}");
    }
    assert_eq!(gguf::read_kv(&p).unwrap(), kv());
    let m = src.metadata();
    assert_eq!(m["general.architecture"], "sdflow-test");
    assert_eq!(m["tokens"], r#"["a", "bc"]"#);
    assert_eq!(m["u64"], (1u64 << 40).to_string());
    let h = gguf::parse(&std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(h.alignment, 64);
    assert!(h
        .tensors
        .iter()
        .all(|t| (t.range.start - h.data_offset) % 64 == 0));
}

#[test]
fn ggml_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let ts = all_types();
    write(&p, &kv(), &ts);
    let ours = gguf::parse(&std::fs::read(&p).unwrap()).unwrap();
    let c = CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: no_alloc reads only the header; the context is freed below.
    unsafe {
        let params = ggml_sys::gguf_init_params {
            no_alloc: true,
            ctx: std::ptr::null_mut(),
        };
        let ctx = ggml_sys::gguf_init_from_file(c.as_ptr(), params);
        assert!(!ctx.is_null(), "ggml rejected our GGUF");
        assert_eq!(ggml_sys::gguf_get_n_tensors(ctx), ts.len() as i64);
        assert_eq!(ggml_sys::gguf_get_data_offset(ctx), ours.data_offset);
        for (i, t) in ours.tensors.iter().enumerate() {
            let name = CString::new(t.name.as_str()).unwrap();
            let id = ggml_sys::gguf_find_tensor(ctx, name.as_ptr());
            assert_eq!(id, i as i64);
            assert_eq!(
                ggml_sys::gguf_get_tensor_type(ctx, id),
                t.dtype.ggml_type().unwrap()
            );
            assert_eq!(
                ggml_sys::gguf_get_tensor_offset(ctx, id) + ours.data_offset,
                t.range.start
            );
            assert_eq!(ggml_sys::gguf_get_tensor_size(ctx, id), t.range.len());
        }
        ggml_sys::gguf_free(ctx);
    }
}

/// Hand-assembled GGUF headers for corrupt cases.
struct G(Vec<u8>);
impl G {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&n_tensors.to_le_bytes());
        v.extend_from_slice(&n_kv.to_le_bytes());
        G(v)
    }
    fn u32(mut self, x: u32) -> Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn s(self, s: &str) -> Self {
        let mut g = self.u64(s.len() as u64);
        g.0.extend_from_slice(s.as_bytes());
        g
    }
    fn tensor(self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Self {
        let mut g = self.s(name).u32(ne.len() as u32);
        for &d in ne {
            g = g.u64(d);
        }
        g.u32(ty).u64(offset)
    }
    fn data(mut self, n: usize) -> Vec<u8> {
        let pad = (32 - self.0.len() % 32) % 32;
        self.0.extend(std::iter::repeat_n(0u8, pad + n));
        self.0
    }
}

#[test]
fn corrupt_files_are_rejected_with_clear_errors() {
    let ok = G::new(3, 1, 0).tensor("w", &[4, 2], 0, 0).data(32);
    assert!(gguf::parse(&ok).is_ok());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad magic", b"GGUX\x03\0\0\0".to_vec(), "magic"),
        ("version 1", G::new(1, 0, 0).data(0), "version 1"),
        (
            "huge tensor count",
            G::new(3, u64::MAX, 0).data(0),
            "tensor count",
        ),
        (
            "huge kv count",
            G::new(3, 0, 1 << 50).data(0),
            "key/value count",
        ),
        (
            "huge key length",
            G::new(3, 0, 1).u64(1 << 60).data(64),
            "key length",
        ),
        (
            "huge array",
            G::new(3, 0, 1).s("a").u32(9).u32(4).u64(1 << 40).data(64),
            "array length",
        ),
        (
            "nested array",
            G::new(3, 0, 1)
                .s("a")
                .u32(9)
                .u32(9)
                .u64(1)
                .u32(0)
                .u64(0)
                .data(64),
            "nested",
        ),
        (
            "unknown kv type",
            G::new(3, 0, 1).s("a").u32(77).u32(0).data(64),
            "unknown value type",
        ),
        (
            "bad alignment",
            G::new(3, 0, 1).s("general.alignment").u32(4).u32(3).data(0),
            "alignment",
        ),
        (
            "duplicate key",
            G::new(3, 0, 2)
                .s("a")
                .u32(4)
                .u32(1)
                .s("a")
                .u32(4)
                .u32(1)
                .data(0),
            "duplicate",
        ),
        (
            "offset past EOF",
            G::new(3, 1, 0).tensor("w", &[4, 2], 0, 1 << 20).data(32),
            "past the end",
        ),
        (
            "data truncated",
            G::new(3, 1, 0).tensor("w", &[4, 2], 0, 0).data(31),
            "past the end",
        ),
        (
            "misaligned offset",
            G::new(3, 1, 0).tensor("w", &[4, 2], 0, 4).data(64),
            "alignment",
        ),
        (
            "too many dims",
            G::new(3, 1, 0).tensor("w", &[1, 1, 1, 1, 1], 0, 0).data(32),
            "dimensions",
        ),
        (
            "shape overflow",
            G::new(3, 1, 0)
                .tensor("w", &[1 << 62, 1 << 62], 0, 0)
                .data(32),
            "overflows",
        ),
        // A zero dimension must not hide an overflow of the others.
        (
            "zero hides overflow",
            G::new(3, 1, 0)
                .tensor("w", &[0, 1 << 62, 1 << 62], 0, 0)
                .data(32),
            "overflows",
        ),
        (
            "size overflow",
            G::new(3, 1, 0).tensor("w", &[1 << 62, 4], 0, 0).data(32),
            "overflows",
        ),
        (
            "dim > i64",
            G::new(3, 1, 0).tensor("w", &[u64::MAX], 0, 0).data(32),
            "out of range",
        ),
        (
            "unknown type",
            G::new(3, 1, 0).tensor("w", &[4], 99, 0).data(32),
            "unknown ggml type",
        ),
        (
            "removed type",
            G::new(3, 1, 0).tensor("w", &[32], 4, 0).data(32),
            "unknown ggml type",
        ),
        (
            "row not a block multiple",
            G::new(3, 1, 0).tensor("w", &[33], 2, 0).data(64),
            "block size",
        ),
        (
            "duplicate tensor",
            G::new(3, 2, 0)
                .tensor("w", &[4], 0, 0)
                .tensor("w", &[4], 0, 32)
                .data(64),
            "twice",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (what, bytes, needle) in cases {
        let e = gguf::parse(&bytes)
            .err()
            .unwrap_or_else(|| panic!("{what}: parsed"));
        assert!(e.to_string().contains(needle), "{what}: {e}");
        let p = dir.path().join("bad.gguf");
        std::fs::write(&p, &bytes).unwrap();
        let e = io::open(&p).err().unwrap().to_string();
        assert!(e.contains("bad.gguf"), "{what}: {e}");
    }
}

#[test]
fn every_truncation_and_random_flip_fails_cleanly() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let ts: Vec<_> = all_types().into_iter().take(6).collect();
    write(&p, &kv(), &ts);
    let full = std::fs::read(&p).unwrap();
    let last_end = gguf::parse(&full)
        .unwrap()
        .tensors
        .iter()
        .map(|t| t.range.end)
        .max()
        .unwrap();
    for cut in 0..full.len() {
        let r = gguf::parse(&full[..cut]);
        assert_eq!(r.is_ok(), cut >= last_end, "cut at {cut}: {r:?}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..2000 {
        let mut b = full.clone();
        for _ in 0..rng.random_range(1..6) {
            let i = rng.random_range(0..b.len());
            b[i] = rng.random();
        }
        if let Ok(h) = gguf::parse(&b) {
            assert!(h.tensors.iter().all(|t| t.range.end <= b.len()));
        }
    }
}

#[test]
fn writer_checks_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.gguf");
    let e = gguf::write(&p, &[], [("w", DType::Q4_0, vec![2, 33], &[0u8; 36][..])]).unwrap_err();
    assert!(e.to_string().contains("block size"), "{e}");
    let e = gguf::write(&p, &[], [("w", DType::F32, vec![2], &[0u8; 4][..])]).unwrap_err();
    assert!(e.to_string().contains("tensor 'w'"), "{e}");
    let e = gguf::write(&p, &[], [("w", DType::F8E4M3, vec![2], &[0u8; 2][..])]).unwrap_err();
    assert!(e.to_string().contains("no ggml type"), "{e}");
}

/// Inputs the fuzzer found (a zero dimension hiding an overflowing shape; a data section
/// starting past EOF): both must be clean errors.
#[test]
fn fuzzer_regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/io");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("gguf_fuzz_")
        {
            let e = gguf::parse(&std::fs::read(&p).unwrap()).unwrap_err();
            assert!(
                e.to_string().contains("overflows") || e.to_string().contains("past the end"),
                "{e}"
            );
            n += 1;
        }
    }
    assert_eq!(n, 2);
}

/// ComfyUI-GGUF's `comfy.gguf.orig_shape.*`: a tensor stored flattened (a 5-D kernel GGUF
/// cannot hold, rows of 256 to quantize) reads in its own shape where its type can take
/// that shape; otherwise, or when the entry does not fit, as stored.
#[test]
fn comfyui_orig_shapes_are_restored_where_the_type_allows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orig.gguf");
    let dims = |d: &[i32]| gguf::Value::Array(d.iter().map(|&v| gguf::Value::I32(v)).collect());
    let kv = vec![
        ("comfy.gguf.orig_shape.kernel".to_string(), dims(&[8, 4, 1, 2, 4])),
        ("comfy.gguf.orig_shape.q_ok".to_string(), dims(&[2, 8, 32])),
        ("comfy.gguf.orig_shape.q_split".to_string(), dims(&[32, 16])),
        ("comfy.gguf.orig_shape.wrong".to_string(), dims(&[3, 100])),
    ];
    let f32s = |n: usize| vec![0u8; n * 4];
    let q8 = sdflow_core::dtype::from_f32(&vec![0.5; 512], 256, DType::Q8_0).unwrap();
    let ts = vec![
        ("kernel".to_string(), DType::F32, vec![1, 256], f32s(256)),
        ("q_ok".to_string(), DType::Q8_0, vec![2, 256], q8.clone()),
        ("q_split".to_string(), DType::Q8_0, vec![2, 256], q8),
        ("wrong".to_string(), DType::F32, vec![1, 256], f32s(256)),
    ];
    write(&path, &kv, &ts);
    let src = io::open(&path).unwrap();
    let shape = |n: &str| src.get(n).unwrap().shape.clone();
    assert_eq!(shape("kernel"), vec![8, 4, 1, 2, 4]);
    assert_eq!(shape("q_ok"), vec![2, 8, 32]);
    // 16 is not a whole Q8_0 block (32): kept as stored.
    assert_eq!(shape("q_split"), vec![2, 256]);
    assert_eq!(shape("wrong"), vec![1, 256]);
}

/// A 5-D tensor (Wan's patch kernel) is written as sd.cpp's convert writes it, its first two
/// axes merged, with its own shape under ComfyUI-GGUF's key: ggml and sd.cpp read the 4-D
/// tensor, and we read the 5-D one back.
#[test]
fn five_dimensional_tensors_are_written_as_sdcpp_and_comfyui_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.gguf");
    let values: Vec<u8> = (0..8 * 4 * 2 * 2).flat_map(|i| (i as f32).to_le_bytes()).collect();
    write(&path, &[], &[("patch_embedding.weight".to_string(), DType::F32, vec![8, 4, 1, 2, 2], values.clone())]);
    let raw = gguf::parse(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(raw.tensors[0].shape, vec![32, 1, 2, 2]);
    assert!(raw.kv.iter().any(|(k, _)| k == "comfy.gguf.orig_shape.patch_embedding.weight"));
    let src = io::open(&path).unwrap();
    assert_eq!(src.get("patch_embedding.weight").unwrap().shape, vec![8, 4, 1, 2, 2]);
    assert_eq!(&*src.read("patch_embedding.weight").unwrap(), &values[..]);
    // Six axes stay refused.
    let e = gguf::write(&path, &[], [("w", DType::F32, vec![1, 1, 1, 1, 1, 2], &[0u8; 8][..])]).unwrap_err();
    assert!(e.to_string().contains("dimensions"), "{e}");
}
