//! A 4-step Euler run with CFG through the SD denoiser, against k-diffusion's
//! `sample_euler` over the diffusers UNet (fixture from make_unet.py).

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::ggml::Backend;
use sdflow_core::models::sd::{Conditioning, Prediction, SdDenoiser};
use sdflow_core::models::unet::{Heads, Unet, UnetConfig};
use sdflow_core::sampling::rng::CpuRng;
use sdflow_core::sampling::samplers::{sample, SampleOpts, Sampler};
use sdflow_core::sampling::schedule::{DiscreteSchedule, ScheduleOpts, Scheduler};

#[test]
fn euler_4_steps_with_cfg_matches_k_diffusion() {
    let backend = Backend::cpu(2).unwrap();
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let mut cfg = UnetConfig::infer(&w, "model.diffusion_model").unwrap();
    cfg.heads = Heads::Count(4);
    let unet = Unet::new(&w, "model.diffusion_model", cfg).unwrap();
    let r = &reference("unet_tiny_ref.json")["euler4"];
    let f = |k: &str| -> Vec<f32> { serde_json::from_value(r[k].clone()).unwrap() };

    let schedule = DiscreteSchedule::sd();
    let sigmas = Scheduler::Discrete.sigmas(4, &schedule, &ScheduleOpts::default()).unwrap();
    assert!(max_abs_err(&sigmas, &f("sigmas")) < 1e-4, "{sigmas:?}");

    let mut den = SdDenoiser::new(unet, schedule, Prediction::Epsilon);
    let cond = Conditioning::new(f("cond"), 48, 7).unwrap();
    let uncond = Conditioning::new(f("uncond"), 48, 7).unwrap();
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
