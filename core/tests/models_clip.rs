//! CLIP text encoders against transformers' `CLIPTextModel` on tiny random weights
//! (fixtures from tests/fixtures/models/make_clip.py; the weights are regenerated here).

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::clip::{Activation, ClipLayout, ClipTextConfig, ClipTextModel};

/// The fixture's CLIP weights for one layout (`hf` or `openclip`).
fn weights(key: &str, backend: &Backend) -> sdflow_core::models::Weights {
    det_weights(&reference("clip_tiny_ref.json")[format!("{key}_keys")], 0.35, backend)
}

fn check(prefix: &str, layout: ClipLayout, key: &str, act: Activation) {
    let backend = common::backend(2);
    let w = weights(key, &backend);
    let mut cfg = ClipTextConfig::infer(&w, prefix, layout).unwrap();
    assert_eq!((cfg.hidden, cfg.layers, cfg.intermediate, cfg.vocab, cfg.max_positions), (64, 3, 128, 1000, 77));
    cfg.heads = 2;
    cfg.activation = act;
    let model = ClipTextModel::new(&w, prefix, cfg).unwrap();
    let r = reference("clip_tiny_ref.json");
    let tokens: Vec<Vec<i32>> = serde_json::from_value(r["tokens"].clone()).unwrap();
    for skip in [1usize, 2] {
        let ctx = Context::new(4096, 4096).unwrap();
        let mut run = GraphRun::new(&ctx);
        let out = model.forward(&ctx, &mut run, &tokens, skip).unwrap();
        assert_eq!(out.ne(), [64, 8, 2, 1]);
        let got = run.compute(&backend, &[out], 4096).unwrap().remove(0);
        let want: Vec<f32> = serde_json::from_value(r[key][format!("skip{skip}")].clone()).unwrap();
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-3, "{key} clip_skip {skip}: max abs error {err}");
    }
}

#[test]
fn clip_l_hf_layout_matches_transformers() {
    check("cond_stage_model.transformer.text_model", ClipLayout::HuggingFace, "hf", Activation::QuickGelu);
}

#[test]
fn openclip_layout_matches_transformers() {
    check("cond_stage_model.model", ClipLayout::OpenClip, "openclip", Activation::Gelu);
}

#[test]
fn bad_inputs_and_weights_are_errors() {
    let backend = common::backend(1);
    let w = weights("hf", &backend);
    let prefix = "cond_stage_model.transformer.text_model";
    let mut cfg = ClipTextConfig::infer(&w, prefix, ClipLayout::HuggingFace).unwrap();
    cfg.heads = 2;
    let mut wrong = cfg.clone();
    wrong.intermediate = 96;
    let e = ClipTextModel::new(&w, prefix, wrong).err().expect("shape mismatch");
    assert!(e.to_string().contains("mlp.fc1.weight"), "{e}");
    assert!(ClipTextConfig::infer(&w, "nope", ClipLayout::HuggingFace).is_err());
    let model = ClipTextModel::new(&w, prefix, cfg).unwrap();
    let ctx = Context::new(4096, 4096).unwrap();
    let mut run = GraphRun::new(&ctx);
    assert!(model.forward(&ctx, &mut run, &[vec![5; 78]], 1).is_err(), "too long");
    assert!(model.forward(&ctx, &mut run, &[vec![1000]], 1).is_err(), "id outside vocab");
    assert!(model.forward(&ctx, &mut run, &[vec![1, 2], vec![1]], 1).is_err(), "ragged");
    assert!(model.forward(&ctx, &mut run, &[vec![1]], 4).is_err(), "clip_skip");
}
