//! `SdDenoiser::denoise_batch`: an item's prediction does not depend on what shares its
//! batch (beyond float rounding), and `denoise_concat`'s CFG is built on it.

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::ggml::Backend;
use sdflow_core::models::sd::{BatchItem, Conditioning, Prediction, SdDenoiser};
use sdflow_core::models::unet::{Heads, Unet, UnetConfig};
use sdflow_core::sampling::schedule::DiscreteSchedule;

#[test]
fn batch_items_are_independent() {
    let backend = Backend::cpu(2).unwrap();
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let mut cfg = UnetConfig::infer(&w, "model.diffusion_model").unwrap();
    cfg.heads = Heads::Count(4);
    let unet = Unet::new(&w, "model.diffusion_model", cfg).unwrap();
    let r = &reference("unet_tiny_ref.json")["euler4"];
    let f = |k: &str| -> Vec<f32> { serde_json::from_value(r[k].clone()).unwrap() };
    let mut den = SdDenoiser::new(unet, DiscreteSchedule::sd(), Prediction::Epsilon);
    let cond = Conditioning::new(f("cond"), 48, 7).unwrap();
    let uncond = Conditioning::new(f("uncond"), 48, 7).unwrap();
    let shape = [12, 8, 4, 1];
    let sigma = 3.0;
    let x: Vec<f32> = f("noise").iter().map(|v| v * sigma).collect();
    let y: Vec<f32> = x.iter().rev().copied().collect();
    let a = BatchItem { x: &x, cond: &cond, concat: None };
    let b = BatchItem { x: &y, cond: &uncond, concat: None };
    let alone = den.denoise_batch(&backend, shape, sigma, &[a]).unwrap();
    let pair = den.denoise_batch(&backend, shape, sigma, &[a, b]).unwrap();
    let three = den.denoise_batch(&backend, shape, sigma, &[b, a, b]).unwrap();
    let scale = alone[0].iter().fold(0f32, |m, v| m.max(v.abs()));
    for (what, got) in [("pair", &pair[0]), ("three", &three[1])] {
        let e = max_abs_err(got, &alone[0]);
        eprintln!("{what}: max abs difference {e} (values up to {scale})");
        assert!(e <= 1e-5 * scale.max(1.0), "{what}: {e}");
    }
    assert_eq!(pair[1].len(), x.len());
    // CFG from the batch equals the mix of the separate predictions.
    let d = den.denoise_concat(&backend, &x, shape, sigma, &cond, Some(&uncond), 7.5, None).unwrap();
    let un = den.denoise_batch(&backend, shape, sigma, &[BatchItem { x: &x, cond: &uncond, concat: None }]).unwrap();
    let mixed: Vec<f32> = un[0].iter().zip(&alone[0]).map(|(u, c)| u + 7.5 * (c - u)).collect();
    assert!(max_abs_err(&d.denoised, &mixed) <= 1e-4 * scale.max(1.0) * 7.5);
    // Wrong extra channels are errors.
    assert!(den.denoise_batch(&backend, shape, sigma, &[BatchItem { x: &x, cond: &cond, concat: Some(&x) }]).is_err());
    assert!(den.denoise_batch(&backend, shape, sigma, &[BatchItem { x: &x[1..], cond: &cond, concat: None }]).is_err());
}
