//! safetensors: our writer and reader round trip, sharded indexes, and corrupt files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sdflow_core::dtype::DType;
use sdflow_core::io::{self, safetensors, Format, OpenOptions};

fn tensors() -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    let dtypes = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::Bool,
        DType::F8E4M3,
        DType::F8E5M2,
    ];
    dtypes
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let shape = vec![2, i + 1, 3];
            let n = 6 * (i + 1);
            let bytes: Vec<u8> = (0..d.byte_len(n).unwrap())
                .map(|b| (b * 7 + i) as u8 % 251)
                .collect();
            (format!("layer{i}.{}", d.name()), d, shape, bytes)
        })
        .collect()
}

fn write(
    path: &Path,
    ts: &[(String, DType, Vec<usize>, Vec<u8>)],
    meta: &BTreeMap<String, String>,
) {
    safetensors::write(
        path,
        ts.iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())),
        meta,
    )
    .unwrap();
}

#[test]
fn round_trip_every_dtype_with_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    let ts = tensors();
    let meta = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("ss_v_parameterization".into(), "True".into()),
    ]);
    write(&p, &ts, &meta);
    for mmap in [true, false] {
        let src = io::open_with(&p, &OpenOptions { mmap }).unwrap();
        assert_eq!(src.format(), Format::Safetensors);
        assert_eq!(src.tensors().len(), ts.len());
        assert_eq!(src.metadata(), &meta);
        for (n, d, s, b) in &ts {
            let info = src.get(n).unwrap();
            assert_eq!((&info.dtype, &info.shape), (d, s));
            assert_eq!(&*src.read(n).unwrap(), b.as_slice(), "{n}");
        }
        assert!(matches!(
            src.read("nope"),
            Err(io::IoError::NotFound { .. })
        ));
    }
}

#[test]
fn writer_rejects_what_safetensors_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    let q = vec![0u8; 18];
    let e = safetensors::write(
        &p,
        [("q", DType::Q4_0, vec![32], q.as_slice())],
        &BTreeMap::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("tensor 'q'"), "{e}");
    let e = safetensors::write(
        &p,
        [("w", DType::F32, vec![3], &[0u8; 8][..])],
        &BTreeMap::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("needs Some(12) bytes"), "{e}");
}

fn shard_set(dir: &Path) -> PathBuf {
    let ts = tensors();
    write(
        &dir.join("m-00001-of-00002.safetensors"),
        &ts[..5],
        &BTreeMap::new(),
    );
    write(
        &dir.join("m-00002-of-00002.safetensors"),
        &ts[5..],
        &BTreeMap::new(),
    );
    let map: serde_json::Map<String, serde_json::Value> = ts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = if i < 5 {
                "m-00001-of-00002.safetensors"
            } else {
                "m-00002-of-00002.safetensors"
            };
            (t.0.clone(), f.into())
        })
        .collect();
    let idx = dir.join("m.safetensors.index.json");
    std::fs::write(
        &idx,
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    idx
}

#[test]
fn sharded_index_reads_all_shards() {
    let dir = tempfile::tempdir().unwrap();
    let idx = shard_set(dir.path());
    let src = io::open(&idx).unwrap();
    assert_eq!(src.format(), Format::ShardedSafetensors);
    for (n, _, _, b) in tensors() {
        assert_eq!(&*src.read(&n).unwrap(), b.as_slice());
    }
}

#[test]
fn sharded_index_that_lies_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let idx = shard_set(dir.path());
    let text = std::fs::read_to_string(&idx).unwrap();
    // Point one tensor at the wrong shard.
    let mut j: serde_json::Value = serde_json::from_str(&text).unwrap();
    j["weight_map"]["layer0.f64"] = "m-00002-of-00002.safetensors".into();
    std::fs::write(&idx, j.to_string()).unwrap();
    let e = io::open(&idx).err().unwrap().to_string();
    assert!(e.contains("layer0.f64") && e.contains("index says"), "{e}");
    // A tensor listed but absent, and a shard name escaping the folder.
    j["weight_map"]["layer0.f64"] = "m-00001-of-00002.safetensors".into();
    j["weight_map"]["ghost"] = "m-00001-of-00002.safetensors".into();
    std::fs::write(&idx, j.to_string()).unwrap();
    let e = io::open(&idx).err().unwrap().to_string();
    assert!(e.contains("ghost"), "{e}");
    j["weight_map"]["ghost"] = "../etc/passwd".into();
    std::fs::write(&idx, j.to_string()).unwrap();
    let e = io::open(&idx).err().unwrap().to_string();
    assert!(e.contains("not a plain file name"), "{e}");
}

fn raw(header: &str, data: usize) -> Vec<u8> {
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend(std::iter::repeat_n(0u8, data));
    f
}

fn open_bytes(
    dir: &tempfile::TempDir,
    bytes: &[u8],
) -> Result<Box<dyn io::TensorSource>, io::IoError> {
    let p = dir.path().join("x.safetensors");
    std::fs::write(&p, bytes).unwrap();
    io::open(&p)
}

#[test]
fn corrupt_headers_are_rejected_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
    assert!(open_bytes(&dir, &raw(good, 16)).is_ok());
    let mut huge = raw(good, 16);
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut past = raw(good, 16);
    past[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("header length huge", huge),
        ("header length past EOF", past),
        ("data truncated", raw(good, 15)),
        ("trailing bytes", raw(good, 17)),
        (
            "offsets past EOF",
            raw(
                r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,1600]}}"#,
                16,
            ),
        ),
        (
            "shape x dtype != bytes",
            raw(
                r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}}"#,
                16,
            ),
        ),
        (
            "shape product overflows",
            raw(
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}}"#,
                16,
            ),
        ),
        (
            "zero dimension hiding an overflow",
            raw(
                r#"{"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}"#,
                0,
            ),
        ),
        (
            "offsets reversed",
            raw(
                r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}}"#,
                16,
            ),
        ),
        ("not json", raw("{\"w\": nope", 0)),
        (
            "unknown dtype",
            raw(
                r#"{"w":{"dtype":"F99","shape":[2,2],"data_offsets":[0,16]}}"#,
                16,
            ),
        ),
        (
            "unsupported dtype",
            raw(
                r#"{"w":{"dtype":"U16","shape":[2,4],"data_offsets":[0,16]}}"#,
                16,
            ),
        ),
    ];
    for (what, bytes) in cases {
        match open_bytes(&dir, &bytes) {
            Ok(_) => panic!("{what}: opened"),
            Err(e) => assert!(e.to_string().contains("x.safetensors"), "{what}: {e}"),
        }
    }
}

#[test]
fn every_truncation_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, &tensors(), &BTreeMap::new());
    let full = std::fs::read(&p).unwrap();
    for cut in 0..full.len() {
        assert!(
            safetensors::parse(&full[..cut]).is_err(),
            "cut at {cut} parsed"
        );
    }
    assert!(safetensors::parse(&full).is_ok());
}

/// A header 128 + 256·k bytes long starts the file with 0x80, the pickle protocol byte;
/// the `{` at offset 8 still says safetensors, whatever the file is called.
#[test]
fn header_length_with_a_pickle_looking_first_byte() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
    let header = format!("{body:<128}");
    let bytes = raw(&header, 16);
    assert_eq!(bytes[0], 0x80);
    let p = dir.path().join("model.bin");
    std::fs::write(&p, &bytes).unwrap();
    let src = io::open(&p).unwrap();
    assert_eq!(src.tensors().len(), 1);
}

/// Released tensors read back unchanged: the pages come back from the file.
#[test]
fn released_tensors_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3 * 4096u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let header = format!(r#"{{"w":{{"dtype":"F32","shape":[3,4096],"data_offsets":[0,{}]}}}}"#, data.len());
    let mut bytes = raw(&header, 0);
    bytes.extend_from_slice(&data);
    let p = dir.path().join("big.safetensors");
    std::fs::write(&p, &bytes).unwrap();
    let src = io::open(&p).unwrap();
    let before = src.read("w").unwrap().into_owned();
    assert_eq!(before, data);
    src.release("w");
    src.release("no such tensor");
    assert_eq!(src.read("w").unwrap().into_owned(), data);
}
