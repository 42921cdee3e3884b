//! The CLIP vision tower against transformers' `CLIPVisionModelWithProjection` on tiny
//! random weights (fixtures from tests/fixtures/models/make_ip_adapter.py).

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::clip::Activation;
use sdflow_core::models::clip_vision::{ClipVisionConfig, ClipVisionModel};

fn f32s(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn vision_tower_matches_transformers() {
    let r = &reference("ip_adapter_ref.json")["vision"];
    let backend = common::backend(2);
    let w = det_weights(&r["keys"], 0.35, &backend);
    let inferred = ClipVisionConfig::infer(&w, "").unwrap();
    assert_eq!((inferred.hidden, inferred.layers, inferred.intermediate, inferred.patch, inferred.image_size, inferred.projection_dim), (64, 3, 128, 8, 32, 48));
    assert_eq!(inferred.tokens(), 17);
    assert_eq!(inferred.activation, Activation::Gelu, "only the 1024-wide ViT-L uses quick-GELU");
    for (key, act) in [("gelu", Activation::Gelu), ("quick_gelu", Activation::QuickGelu)] {
        let cfg = ClipVisionConfig { heads: 2, activation: act, ..inferred.clone() };
        let model = ClipVisionModel::new(&w, "", cfg).unwrap();
        let ctx = Context::new(4096, 4096).unwrap();
        let mut run = GraphRun::new(&ctx);
        let px = run.input_f32(&[32, 32, 3, 2], f32s(&r["pixels"])).unwrap();
        let out = model.forward(&ctx, &mut run, px).unwrap();
        assert_eq!(out.image_embeds.ne(), [48, 2, 1, 1]);
        assert_eq!(out.penultimate.ne(), [64, 17, 2, 1]);
        let got = run.compute(&backend, &[out.image_embeds, out.penultimate], 4096).unwrap();
        let e1 = max_abs_err(&got[0], &f32s(&r[key]["image_embeds"]));
        let e2 = max_abs_err(&got[1], &f32s(&r[key]["penultimate"]));
        eprintln!("{key}: image_embeds max abs error {e1}, penultimate {e2}");
        assert!(e1 <= 1e-3 && e2 <= 1e-3, "{key}: image_embeds {e1}, penultimate hidden states {e2}");
    }
}

#[test]
fn bad_vision_weights_and_inputs_are_errors() {
    let r = &reference("ip_adapter_ref.json")["vision"];
    let backend = common::backend(1);
    let w = det_weights(&r["keys"], 0.35, &backend);
    let e = ClipVisionConfig::infer(&w, "cond_stage_model.").expect_err("no tower there");
    assert!(e.to_string().contains("patch_embedding"), "{e}");
    let cfg = ClipVisionConfig { heads: 2, ..ClipVisionConfig::infer(&w, "").unwrap() };
    let e = ClipVisionModel::new(&w, "", ClipVisionConfig { projection_dim: 32, ..cfg.clone() }).err().expect("projection width");
    assert!(e.to_string().contains("visual_projection.weight"), "{e}");
    let e = ClipVisionModel::new(&w, "", ClipVisionConfig { heads: 3, ..cfg.clone() }).err().expect("heads");
    assert!(e.to_string().contains("heads"), "{e}");
    let model = ClipVisionModel::new(&w, "", cfg).unwrap();
    let ctx = Context::new(4096, 4096).unwrap();
    let mut run = GraphRun::new(&ctx);
    let px = run.input_f32(&[24, 24, 3, 1], vec![0.0; 24 * 24 * 3]).unwrap();
    let e = model.forward(&ctx, &mut run, px).err().expect("wrong image size");
    assert!(e.to_string().contains("32×32"), "{e}");
}
