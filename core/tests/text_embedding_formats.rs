//! Embedding files in every format the model-file reader handles: an A1111 `.pt`
//! (fixtures/text/a1111_embedding.pt, made by fixtures/text/gen_embedding_pt.py without
//! torch), the same pickle as `.bin`, and GGUF.

use std::path::Path;

use half::f16;
use sdflow_core::dtype::DType;
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipTokenizer, EmbeddingLibrary};

const PT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/text/a1111_embedding.pt"
);

/// The values gen_embedding_pt.py stores.
fn pt_values() -> Vec<f32> {
    (0..2 * 768)
        .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
        .collect()
}

#[test]
fn a1111_pt_and_bin_embeddings() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(PT, dir.path().join("a1111_style.pt")).unwrap();
    std::fs::copy(PT, dir.path().join("as_bin.bin")).unwrap();
    let tok = ClipTokenizer::default();
    let lib = EmbeddingLibrary::scan(dir.path(), &tok).unwrap();
    for name in ["a1111_style", "as_bin"] {
        let e = lib.get(name).unwrap().unwrap();
        assert_eq!(e.vectors.len(), 1, "{name}");
        let v = &e.vectors[0];
        // string_to_token.* (an int64 tensor) is ignored; string_to_param.* is the embedding.
        assert_eq!(
            (v.key.as_str(), v.rows, v.width),
            ("string_to_param.*", 2, 768)
        );
        assert_eq!(v.data, pt_values());
    }
    let got = tokenize_weighted(
        "a (a1111_style:0.8)",
        &tok,
        Some(&lib),
        &ChunkOptions::default(),
    )
    .unwrap();
    let c = &got.chunks[0];
    assert_eq!(c.tokens[..5], [49406, 320, 0, 0, 49407]);
    assert_eq!(c.weights[2..4], [0.8, 0.8]);
    assert_eq!(c.embeddings[0].position, 2);
}

fn write_gguf(path: &Path, name: &str, shape: Vec<usize>, values: &[f32]) {
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect();
    sdflow_core::io::gguf::write(path, &[], [(name, DType::F16, shape, bytes.as_slice())]).unwrap();
}

#[test]
fn gguf_embeddings() {
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<f32> = (0..3 * 1024).map(|i| (i % 7) as f32 * 0.5).collect();
    write_gguf(
        &dir.path().join("sd2style.gguf"),
        "emb_params",
        vec![3, 1024],
        &values,
    );
    let lib = EmbeddingLibrary::scan(dir.path(), &ClipTokenizer::default()).unwrap();
    let e = lib.get("sd2style").unwrap().unwrap();
    assert_eq!(e.num_vectors(), 3);
    let v = e.for_width(1024).unwrap();
    assert_eq!(v.data, values);
}

#[test]
fn a_non_float_tensor_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ints.gguf");
    let bytes = vec![0u8; 4 * 8];
    sdflow_core::io::gguf::write(
        &p,
        &[],
        [("emb_params", DType::I32, vec![1, 8], bytes.as_slice())],
    )
    .unwrap();
    let lib = EmbeddingLibrary::scan(dir.path(), &ClipTokenizer::default()).unwrap();
    let err = lib.get("ints").unwrap_err().to_string();
    assert!(
        err.contains("ints.gguf") && err.contains("emb_params"),
        "{err}"
    );
}
