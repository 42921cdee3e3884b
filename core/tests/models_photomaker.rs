//! PhotoMaker v1 and v2 ID encoders against TencentARC's modules (fixtures from
//! tests/fixtures/models/make_photomaker.py): the prompt embedding with the class-token
//! rows fused with the ID embeddings of two images.

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::models::sd::photomaker::{expand_trigger, PhotoMaker, PhotoMakerConfig, TriggerError, Version};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipTokenizer, PadToken, CHUNK_LEN};

fn f32s(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn check(version: &str, want: Version) {
    let r = reference("photomaker_ref.json");
    let backend = common::backend(2);
    let w = det_weights(&r[version]["keys"], 0.3, &backend);
    let cfg = PhotoMakerConfig::infer(&w).unwrap();
    assert_eq!(cfg.version(), want);
    assert_eq!(cfg.prefix, "id_encoder.");
    assert_eq!(cfg.embed_dim, 96);
    let pm = PhotoMaker::new(&w, cfg).unwrap();
    let cond = Conditioning::new(f32s(&r["prompt"]), 96, 77).unwrap();
    let positions: Vec<usize> = serde_json::from_value(r[version]["positions"].clone()).unwrap();
    let faces = (want == Version::V2).then(|| f32s(&r["faces"]));
    let out = pm.stack(&backend, &cond, &positions, f32s(&r["pixels"]), 2, faces).unwrap();
    let err = max_abs_err(&out.data, &f32s(&r[version]["out"]));
    eprintln!("{version}: fused prompt max abs error {err}");
    assert!(err <= 1e-3, "{version}: max abs error {err}");
    // Only the class-token rows change.
    let untouched = (0..77).filter(|p| !positions.contains(p)).all(|p| out.data[p * 96..(p + 1) * 96] == cond.data[p * 96..(p + 1) * 96]);
    assert!(untouched);
}

#[test]
fn v1_matches_photomaker_id_encoder() {
    check("v1", Version::V1);
}

#[test]
fn v2_matches_photomaker_id_encoder_v2() {
    check("v2", Version::V2);
}

#[test]
fn v2_without_face_embeddings_is_an_error() {
    let r = reference("photomaker_ref.json");
    let backend = common::backend(1);
    let w = det_weights(&r["v2"]["keys"], 0.3, &backend);
    let pm = PhotoMaker::new(&w, PhotoMakerConfig::infer(&w).unwrap()).unwrap();
    let cond = Conditioning::new(f32s(&r["prompt"]), 96, 77).unwrap();
    let positions: Vec<usize> = serde_json::from_value(r["v2"]["positions"].clone()).unwrap();
    let e = pm.stack(&backend, &cond, &positions, f32s(&r["pixels"]), 2, None).unwrap_err();
    assert!(e.to_string().contains("face ID embeddings"), "{e}");
}

#[test]
fn a_file_without_the_id_encoder_is_refused() {
    let r = reference("photomaker_ref.json");
    let backend = common::backend(1);
    let mut keys = r["v1"]["keys"].clone();
    keys.as_object_mut().unwrap().remove("id_encoder.fuse_module.mlp2.fc1.weight");
    let w = det_weights(&keys, 0.3, &backend);
    let e = PhotoMaker::new(&w, PhotoMakerConfig::infer(&w).unwrap()).err().expect("a missing weight");
    assert!(e.to_string().contains("id_encoder.fuse_module.mlp2.fc1.weight"), "{e}");
    let w = det_weights(&serde_json::json!({"vision_model.pre_layrnorm.weight": [64]}), 0.3, &backend);
    let e = PhotoMakerConfig::infer(&w).unwrap_err();
    assert!(e.to_string().contains("not a PhotoMaker ID encoder"), "{e}");
}

#[test]
fn the_class_word_is_repeated_and_the_trigger_removed() {
    let tok = ClipTokenizer::new(PadToken::EndOfText);
    let img = tok.encode("img")[0];
    let man = tok.encode("man")[0];
    let p = tokenize_weighted("a photo of a (man:1.2) img, smiling", &tok, None, &ChunkOptions::default()).unwrap();
    let (id, pos) = expand_trigger(&p, img, 3, tok.pad()).unwrap();
    assert_eq!(pos, [5, 6, 7]);
    let t = &id.chunks[0].tokens;
    assert!(pos.iter().all(|&i| t[i] == man), "{t:?}");
    assert!(!t.contains(&img));
    assert!(pos.iter().all(|&i| (id.chunks[0].weights[i] - 1.2).abs() < 1e-6));
    assert_eq!(t[8], tok.encode(",")[0]);
    // Repeat 1 is the prompt without the trigger.
    let (plain, pos) = expand_trigger(&p, img, 1, tok.pad()).unwrap();
    assert_eq!(pos, [5]);
    let direct = tokenize_weighted("a photo of a (man:1.2), smiling", &tok, None, &ChunkOptions::default()).unwrap();
    assert_eq!(plain.chunks[0].tokens, direct.chunks[0].tokens);
    // Copies past 75 tokens push the rest of the chunk into a new one.
    let long = format!("{} man img end", vec!["x"; 72].join(" "));
    let p = tokenize_weighted(&long, &tok, None, &ChunkOptions::default()).unwrap();
    let (id, pos) = expand_trigger(&p, img, 4, tok.pad()).unwrap();
    assert_eq!(id.chunks.len(), 2);
    assert_eq!(pos, [73, 74, 75, CHUNK_LEN + 1]);
    assert_eq!(id.chunks[1].tokens[1], man);
    assert_eq!(id.chunks[1].tokens[2], tok.encode("end")[0]);
    // No trigger, or no class word before it.
    let p = tokenize_weighted("a photo of a man", &tok, None, &ChunkOptions::default()).unwrap();
    assert_eq!(expand_trigger(&p, img, 2, tok.pad()).unwrap_err(), TriggerError::NotFound);
    let p = tokenize_weighted("img of a man", &tok, None, &ChunkOptions::default()).unwrap();
    assert_eq!(expand_trigger(&p, img, 2, tok.pad()).unwrap_err(), TriggerError::NoClassWord);
}
