//! Textual-inversion embeddings: directory scan, A1111 name matching, lazy loading,
//! and their placement in chunks.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use sdflow_core::text::embeddings::load_embedding_file;
use sdflow_core::text::prompt::EMBEDDING_PLACEHOLDER;
use sdflow_core::text::{
    tokenize_weighted, ChunkOptions, ClipTokenizer, EmbeddingLibrary, TextError,
};

/// Writes a safetensors file of f32 tensors whose values are `seed + index`.
fn write_st(path: &Path, tensors: &[(&str, Vec<usize>, f32)]) {
    let buffers: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, shape, seed)| {
            let n: usize = shape.iter().product();
            let bytes = (0..n)
                .flat_map(|i| (seed + i as f32).to_le_bytes())
                .collect();
            (name.to_string(), shape.clone(), bytes)
        })
        .collect();
    let views: HashMap<String, TensorView> = buffers
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn library() -> (tempfile::TempDir, EmbeddingLibrary) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_st(
        &d.join("mystyle.safetensors"),
        &[("emb_params", vec![2, 768], 0.0)],
    );
    write_st(
        &d.join("bad.safetensors"),
        &[("emb_params", vec![1, 768], 100.0)],
    );
    write_st(
        &d.join("bad-hands.safetensors"),
        &[
            ("clip_l", vec![3, 768], 1.0),
            ("clip_g", vec![3, 1280], 2.0),
        ],
    );
    write_st(
        &d.join("pt_style.safetensors"),
        &[
            ("string_to_param.*", vec![4, 768], 3.0),
            ("name", vec![1], 0.0),
        ],
    );
    std::fs::create_dir(d.join("sub")).unwrap();
    write_st(
        &d.join("sub/deep.safetensors"),
        &[("whatever", vec![768], 5.0)],
    );
    write_st(
        &d.join("huge.safetensors"),
        &[("emb_params", vec![76, 8], 0.0)],
    );
    std::fs::write(d.join("broken.safetensors"), b"not a safetensors file").unwrap();
    write_st(
        &d.join("twotensors.safetensors"),
        &[("a", vec![1, 8], 0.0), ("b", vec![1, 8], 0.0)],
    );
    // Ignored: dot files, empty files, other extensions; and a duplicate stem.
    write_st(
        &d.join(".hidden.safetensors"),
        &[("emb_params", vec![1, 768], 0.0)],
    );
    std::fs::write(d.join("empty.safetensors"), b"").unwrap();
    std::fs::write(d.join("notes.txt"), b"mystyle").unwrap();
    std::fs::write(d.join("mystyle.bin"), b"would lose to the .safetensors").unwrap();
    let lib = EmbeddingLibrary::scan(d, &ClipTokenizer::default()).unwrap();
    (dir, lib)
}

#[test]
fn scan_finds_embedding_files_by_stem() {
    let (_dir, lib) = library();
    let mut names: Vec<&str> = lib.names().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "bad",
            "bad-hands",
            "broken",
            "deep",
            "huge",
            "mystyle",
            "pt_style",
            "twotensors"
        ]
    );
    assert!(lib
        .path_of("mystyle")
        .unwrap()
        .ends_with("mystyle.safetensors"));
    assert!(lib.get("nothing").unwrap().is_none());
}

#[test]
fn scanning_a_missing_directory_names_it() {
    let err = EmbeddingLibrary::scan(Path::new("/no/such/embeddings"), &ClipTokenizer::default())
        .unwrap_err();
    assert!(matches!(err, TextError::EmbeddingDir { .. }));
    assert!(err.to_string().contains("/no/such/embeddings"), "{err}");
}

#[test]
fn tensor_layouts_follow_a1111() {
    let (_dir, lib) = library();
    let e = lib.get("mystyle").unwrap().unwrap();
    assert_eq!((e.num_vectors(), e.vectors.len()), (2, 1));
    assert_eq!(e.vectors[0].key, "emb_params");
    assert_eq!(e.vectors[0].data[..3], [0.0, 1.0, 2.0]);

    let e = lib.get("bad-hands").unwrap().unwrap();
    assert_eq!(e.num_vectors(), 3);
    assert_eq!(e.for_width(768).unwrap().key, "clip_l");
    assert_eq!(e.for_width(1280).unwrap().key, "clip_g");
    assert_eq!(e.for_key("clip_g").unwrap().data.len(), 3 * 1280);
    assert_eq!(e.for_key("clip_g").unwrap().data[0], 2.0);
    assert!(e.for_width(1024).is_none());

    let e = lib.get("pt_style").unwrap().unwrap();
    assert_eq!(
        (e.vectors[0].key.as_str(), e.num_vectors()),
        ("string_to_param.*", 4)
    );

    let e = lib.get("deep").unwrap().unwrap();
    assert_eq!((e.num_vectors(), e.vectors[0].width), (1, 768));
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let (_dir, lib) = library();
    let err = lib.get("broken").unwrap_err();
    assert!(err.to_string().contains("broken.safetensors"), "{err}");
    let err = lib.get("twotensors").unwrap_err();
    assert!(err.to_string().contains("a, b"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mismatch.safetensors");
    write_st(
        &p,
        &[
            ("clip_l", vec![2, 768], 0.0),
            ("clip_g", vec![3, 1280], 0.0),
        ],
    );
    let err = load_embedding_file("mismatch", &p).unwrap_err();
    assert!(err.to_string().contains("vectors"), "{err}");
    let p = dir.path().join("cube.safetensors");
    write_st(&p, &[("emb_params", vec![1, 2, 768], 0.0)]);
    assert!(load_embedding_file("cube", &p)
        .unwrap_err()
        .to_string()
        .contains("[1, 2, 768]"));
}

#[test]
fn embeddings_are_spliced_into_chunks() {
    let (_dir, lib) = library();
    let tok = ClipTokenizer::default();
    let photo = tok.encode("photo")[0];
    let got = tokenize_weighted(
        "a (MyStyle:1.2) photo, bad-hands",
        &tok,
        Some(&lib),
        &ChunkOptions::default(),
    )
    .unwrap();
    assert_eq!(got.chunks.len(), 1);
    let c = &got.chunks[0];
    // BOS, "a", 2 × mystyle, "photo", ",", 3 × bad-hands (longest name wins over "bad"), EOS.
    assert_eq!(
        c.tokens[..10],
        [49406, 320, 0, 0, photo, 267, 0, 0, 0, 49407]
    );
    assert_eq!(EMBEDDING_PLACEHOLDER, 0);
    assert_eq!(
        c.weights[..10],
        [1.0, 1.0, 1.2, 1.2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    );
    let slots: Vec<(usize, &str)> = c
        .embeddings
        .iter()
        .map(|s| (s.position, s.embedding.name.as_str()))
        .collect();
    assert_eq!(slots, [(2, "mystyle"), (6, "bad-hands")]);
    assert_eq!(got.token_count, 8);
    assert!(!got.empty);

    // "bad" alone, and not inside "badly" (a different token).
    let got = tokenize_weighted("bad badly", &tok, Some(&lib), &ChunkOptions::default()).unwrap();
    let slots: Vec<(usize, &str)> = got.chunks[0]
        .embeddings
        .iter()
        .map(|s| (s.position, s.embedding.name.as_str()))
        .collect();
    assert_eq!(slots, [(1, "bad")]);
}

#[test]
fn an_embedding_never_straddles_two_chunks() {
    let (_dir, lib) = library();
    let tok = ClipTokenizer::default();
    let prompt = format!("{} pt_style", vec!["cat"; 73].join(" "));
    let got = tokenize_weighted(&prompt, &tok, Some(&lib), &ChunkOptions::default()).unwrap();
    assert_eq!(got.chunks.len(), 2);
    // 73 cats, then the 4 vectors do not fit in the 2 positions left.
    assert!(got.chunks[0].embeddings.is_empty());
    assert_eq!(got.chunks[0].tokens[74..], [49407, 49407, 49407]);
    assert_eq!(got.chunks[1].embeddings.len(), 1);
    assert_eq!(got.chunks[1].embeddings[0].position, 1);
    assert_eq!(got.chunks[1].tokens[..6], [49406, 0, 0, 0, 0, 49407]);
}

#[test]
fn oversized_and_broken_embeddings_fail_only_when_used() {
    let (_dir, lib) = library();
    let tok = ClipTokenizer::default();
    assert!(
        tokenize_weighted("a plain prompt", &tok, Some(&lib), &ChunkOptions::default()).is_ok()
    );
    match tokenize_weighted("huge", &tok, Some(&lib), &ChunkOptions::default()) {
        Err(TextError::EmbeddingTooLong {
            name,
            vectors: 76,
            max: 75,
        }) => assert_eq!(name, "huge"),
        other => panic!("expected EmbeddingTooLong, got {other:?}"),
    }
    let err =
        tokenize_weighted("a broken one", &tok, Some(&lib), &ChunkOptions::default()).unwrap_err();
    assert!(err.to_string().contains("broken.safetensors"), "{err}");
}

#[test]
fn comfyui_embedding_syntax() {
    let (_dir, lib) = library();
    let tok = ClipTokenizer::default();
    let opts = ChunkOptions::default();
    let photo = tok.encode("photo")[0];
    let slots = |c: &sdflow_core::text::Chunk| -> Vec<(usize, String)> {
        c.embeddings
            .iter()
            .map(|s| (s.position, s.embedding.name.clone()))
            .collect()
    };

    // Trailing commas stay text; the "embedding:" word itself leaves no tokens.
    let got = tokenize_weighted("a embedding:mystyle, photo", &tok, Some(&lib), &opts).unwrap();
    let c = &got.chunks[0];
    assert_eq!(c.tokens[..7], [49406, 320, 0, 0, 267, photo, 49407]);
    assert_eq!(slots(c), [(2, "mystyle".to_string())]);
    assert!(got.missing_embeddings.is_empty());

    // Extension and directories are accepted, and weights apply.
    let got = tokenize_weighted(
        "(embedding:sub/deep.safetensors:1.3) embedding:pt_style.pt",
        &tok,
        Some(&lib),
        &opts,
    )
    .unwrap();
    let c = &got.chunks[0];
    assert_eq!(
        slots(c),
        [(1, "deep".to_string()), (2, "pt_style".to_string())]
    );
    assert_eq!(c.weights[1], 1.3);
    assert_eq!(c.weights[2..6], [1.0; 4]);
    assert_eq!(c.tokens[6], 49407);

    // Unknown names are dropped, as ComfyUI does, and reported.
    let got = tokenize_weighted("embedding:nothing photo", &tok, Some(&lib), &opts).unwrap();
    assert_eq!(got.chunks[0].tokens[..3], [49406, photo, 49407]);
    assert_eq!(got.missing_embeddings, ["nothing"]);

    // Without a library the syntax is ordinary text.
    let got = tokenize_weighted("embedding:mystyle", &tok, None, &opts).unwrap();
    let want = tok.encode("embedding:mystyle");
    assert_eq!(got.chunks[0].tokens[1..=want.len()], want[..]);
    assert!(got.chunks[0].embeddings.is_empty());
}
