//! The SD1.x/SD2.x UNet against diffusers' `UNet2DConditionModel` on tiny random weights
//! in the LDM key layout (fixtures from tests/fixtures/models/make_unet.py).

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::sd::unet::{BlockKind, Heads, Unet, UnetConfig};

const PREFIX: &str = "model.diffusion_model";

fn check(name: &str, heads: Heads, linear: bool) {
    let backend = common::backend(2);
    let w = det_weights(&keys(&format!("unet_{name}_tiny_keys.json")), 0.14, &backend);
    let mut cfg = UnetConfig::infer(&w, PREFIX).unwrap();
    assert_eq!(cfg.linear_projection, linear);
    assert_eq!((cfg.in_channels, cfg.model_channels, cfg.middle_depth), (4, 32, 1));
    assert_eq!(cfg.input_blocks.len(), 8);
    assert_eq!(cfg.output_blocks.len(), 9);
    assert!(matches!(cfg.input_blocks[2].kind, BlockKind::Down { channels: 32 }));
    cfg.heads = heads;
    let r = &reference("unet_tiny_ref.json")[name];
    assert_eq!(cfg.context_dim, r["context_dim"].as_i64().unwrap());
    let unet = Unet::new(&w, PREFIX, cfg).unwrap();
    let f = |k: &str| -> Vec<f32> { serde_json::from_value(r[k].clone()).unwrap() };
    let dc = r["context_dim"].as_i64().unwrap();

    if let Some(odd) = r.get("odd") {
        // Sides that do not halve evenly: upsampling follows the skip sizes.
        let g = |k: &str| -> Vec<f32> { serde_json::from_value(odd[k].clone()).unwrap() };
        let ctx = Context::new(16384, 16384).unwrap();
        let mut run = GraphRun::new(&ctx);
        let x = run.input_f32(&[9, 7, 4, 1], g("x")).unwrap();
        let t = run.input_f32(&[1], g("t")).unwrap();
        let c = run.input_f32(&[dc, 7, 1], g("context")).unwrap();
        let out = unet.forward(&ctx, x, t, c).unwrap();
        assert_eq!(out.ne(), [9, 7, 4, 1]);
        let got = run.compute(&backend, &[out], 16384).unwrap().remove(0);
        let err = max_abs_err(&got, &g("out"));
        assert!(err <= 1e-3, "{name} at 9x7: max abs error {err}");
    }
    let ctx = Context::new(16384, 16384).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[12, 8, 4, 2], f("x")).unwrap();
    let t = run.input_f32(&[2], f("t")).unwrap();
    let c = run.input_f32(&[dc, 7, 2], f("context")).unwrap();
    let out = unet.forward(&ctx, x, t, c).unwrap();
    assert_eq!(out.ne(), [12, 8, 4, 2]);
    let got = run.compute(&backend, &[out], 16384).unwrap().remove(0);
    let err = max_abs_err(&got, &f("out"));
    assert!(err <= 1e-3, "{name}: max abs error {err}");
}

#[test]
fn sd1_unet_matches_diffusers() {
    check("sd1", Heads::Count(4), false);
}

#[test]
fn sd2_unet_matches_diffusers() {
    // diffusers' attention_head_dim=[2, 4, 4] is a head count per level: 16-wide heads.
    check("sd2", Heads::Dim(16), true);
}

#[test]
fn unet_rejects_bad_inputs() {
    let backend = common::backend(1);
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    assert!(UnetConfig::infer(&w, "model.nothing").is_err());
    let mut cfg = UnetConfig::infer(&w, PREFIX).unwrap();
    cfg.heads = Heads::Count(5);
    assert!(Unet::new(&w, PREFIX, cfg.clone()).is_err(), "5 heads do not divide 32");
    cfg.heads = Heads::Count(4);
    cfg.context_dim = 40;
    let e = Unet::new(&w, PREFIX, cfg.clone()).err().expect("context width");
    assert!(e.to_string().contains("attn2.to_k"), "{e}");
    cfg.context_dim = 48;
    let unet = Unet::new(&w, PREFIX, cfg).unwrap();
    let ctx = Context::new(256, 256).unwrap();
    let mut run = GraphRun::new(&ctx);
    let t = run.input_f32(&[1], vec![1.0]).unwrap();
    let c = run.input_f32(&[48, 3, 1], vec![0.0; 144]).unwrap();
    let c9 = run.input_f32(&[8, 8, 9, 1], vec![0.0; 576]).unwrap();
    assert!(unet.forward(&ctx, c9, t, c).is_err(), "9 channels into a 4-channel UNet");
}
