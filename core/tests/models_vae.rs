//! The KL VAE against diffusers' `AutoencoderKL` on tiny random weights in the LDM key
//! layout (fixtures from tests/fixtures/models/make_vae.py).

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::vae::{Vae, VaeConfig};

#[test]
fn vae_decode_and_encode_match_diffusers() {
    let backend = common::backend(2);
    let w = det_weights(&keys("vae_tiny_keys.json"), 0.14, &backend);
    let cfg = VaeConfig::infer(&w, "first_stage_model").unwrap();
    assert_eq!(cfg.channels, vec![32, 64, 64]);
    assert_eq!((cfg.num_res_blocks, cfg.z_channels, cfg.image_channels), (1, 4, 3));
    assert!(cfg.has_encoder && cfg.has_quant_convs);
    let vae = Vae::new(&w, "first_stage_model", cfg).unwrap();
    let r = reference("vae_tiny_ref.json");
    let f = |k: &str| -> Vec<f32> { serde_json::from_value(r[k].clone()).unwrap() };

    let ctx = Context::new(8192, 8192).unwrap();
    let mut run = GraphRun::new(&ctx);
    let z = run.input_f32(&[6, 8, 4, 1], f("latent")).unwrap();
    let img = vae.decode(&ctx, z).unwrap();
    assert_eq!(img.ne(), [24, 32, 3, 1]);
    let got = run.compute(&backend, &[img], 8192).unwrap().remove(0);
    let err = max_abs_err(&got, &f("decoded"));
    assert!(err <= 1e-3, "decode: max abs error {err}");

    let ctx = Context::new(8192, 8192).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[24, 32, 3, 1], f("image")).unwrap();
    let m = vae.encode_moments(&ctx, x).unwrap();
    assert_eq!(m.ne(), [6, 8, 8, 1]);
    let got = run.compute(&backend, &[m], 8192).unwrap().remove(0);
    let err = max_abs_err(&got, &f("moments"));
    assert!(err <= 1e-3, "encode: max abs error {err}");
}

#[test]
fn vae_rejects_bad_inputs() {
    let backend = common::backend(1);
    let w = det_weights(&keys("vae_tiny_keys.json"), 0.14, &backend);
    let mut cfg = VaeConfig::infer(&w, "first_stage_model").unwrap();
    assert!(VaeConfig::infer(&w, "nothing").is_err());
    let vae = Vae::new(&w, "first_stage_model", cfg.clone()).unwrap();
    let ctx = Context::new(64, 64).unwrap();
    let mut run = GraphRun::new(&ctx);
    let odd = run.input_f32(&[10, 10, 3, 1], vec![0.0; 300]).unwrap();
    assert!(vae.encode_moments(&ctx, odd).is_err(), "10 is not divisible by 4");
    let z3 = run.input_f32(&[4, 4, 3, 1], vec![0.0; 48]).unwrap();
    assert!(vae.decode(&ctx, z3).is_err(), "3-channel latent");
    cfg.channels[1] = 96;
    let e = Vae::new(&w, "first_stage_model", cfg).err().expect("wrong widths");
    assert!(e.to_string().contains("first_stage_model."), "{e}");
}
