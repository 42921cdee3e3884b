//! A 4-step Euler run with CFG through the SD denoiser, against k-diffusion's
//! `sample_euler` over the diffusers UNet (fixture from make_unet.py), and batching in
//! the denoiser.

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::models::sd::{BatchItem, IpSide, SdDenoiser};
use sdflow_core::models::conditioning::{Conditioning, Prediction};
use sdflow_core::models::weights::Weights;
use sdflow_core::models::sd::unet::{Heads, Unet, UnetConfig};
use sdflow_core::sampling::rng::CpuRng;
use sdflow_core::sampling::samplers::{sample, SampleOpts, Sampler};
use sdflow_core::sampling::schedule::{DiscreteSchedule, ScheduleOpts, Scheduler};

/// The tiny SD1 UNet of make_unet.py as an eps denoiser.
fn tiny_denoiser(w: &Weights) -> SdDenoiser<'_> {
    let mut cfg = UnetConfig::infer(w, "model.diffusion_model").unwrap();
    cfg.heads = Heads::Count(4);
    SdDenoiser::new(Unet::new(w, "model.diffusion_model", cfg).unwrap(), DiscreteSchedule::sd(), Prediction::Epsilon)
}

/// The fixture's `euler4` case: a field of it, and its cond and uncond.
fn euler4() -> (impl Fn(&str) -> Vec<f32>, Conditioning, Conditioning, serde_json::Value) {
    let r = reference("unet_tiny_ref.json")["euler4"].clone();
    let r2 = r.clone();
    let f = move |k: &str| -> Vec<f32> { serde_json::from_value(r2[k].clone()).unwrap() };
    let cond = Conditioning::new(f("cond"), 48, 7).unwrap();
    let uncond = Conditioning::new(f("uncond"), 48, 7).unwrap();
    (f, cond, uncond, r)
}

#[test]
fn euler_4_steps_with_cfg_matches_k_diffusion() {
    let backend = common::backend(2);
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let (f, cond, uncond, r) = euler4();
    let schedule = DiscreteSchedule::sd();
    let sigmas = Scheduler::Discrete.sigmas(4, &schedule, &ScheduleOpts::default()).unwrap();
    assert!(max_abs_err(&sigmas, &f("sigmas")) < 1e-4, "{sigmas:?}");

    let mut den = tiny_denoiser(&w);
    let cfg_scale = r["cfg"].as_f64().unwrap() as f32;
    let x: Vec<f32> = f("noise").iter().map(|v| v * sigmas[0]).collect();
    let mut calls = 0;
    let mut model = |x: &[f32], sigma: f32| {
        calls += 1;
        den.denoise(&backend, x, [12, 8, 4, 1], sigma, &cond, Some(&uncond), cfg_scale)
    };
    let mut rng = CpuRng::new(0);
    let out = sample(Sampler::Euler, &mut model, x, &sigmas, &mut rng, &SampleOpts::default(), None).unwrap();
    assert_eq!(calls, 4);
    let want = f("out");
    let err = max_abs_err(&out, &want);
    // Values reach ~60 after CFG 7.5; the bound is still the absolute 1e-3.
    assert!(err <= 1e-3, "max abs error {err}");
}

/// `SdDenoiser::denoise_batch`: an item's prediction does not depend on what shares its
/// batch (beyond float rounding), and `denoise_concat`'s CFG is built on it.
#[test]
fn batch_items_are_independent() {
    let backend = common::backend(2);
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let (f, cond, uncond, _) = euler4();
    let mut den = tiny_denoiser(&w);
    let shape = [12, 8, 4, 1];
    let sigma = 3.0;
    let x: Vec<f32> = f("noise").iter().map(|v| v * sigma).collect();
    let y: Vec<f32> = x.iter().rev().copied().collect();
    let a = BatchItem { x: &x, cond: &cond, concat: None, ip: IpSide::Cond, control: &[] };
    let b = BatchItem { x: &y, cond: &uncond, concat: None, ip: IpSide::Uncond, control: &[] };
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
    let un = den.denoise_batch(&backend, shape, sigma, &[BatchItem { x: &x, cond: &uncond, concat: None, ip: IpSide::Uncond, control: &[] }]).unwrap();
    let mixed: Vec<f32> = un[0].iter().zip(&alone[0]).map(|(u, c)| u + 7.5 * (c - u)).collect();
    assert!(max_abs_err(&d.denoised, &mixed) <= 1e-4 * scale.max(1.0) * 7.5);
    // Wrong extra channels are errors.
    assert!(den.denoise_batch(&backend, shape, sigma, &[BatchItem { x: &x, cond: &cond, concat: Some(&x), ip: IpSide::Cond, control: &[] }]).is_err());
    assert!(den.denoise_batch(&backend, shape, sigma, &[BatchItem { x: &x[1..], cond: &cond, concat: None, ip: IpSide::Cond, control: &[] }]).is_err());
}
