//! DifferentialDiffusion against ComfyUI's own code (`fixtures/differential_diffusion`,
//! written by its `gen.py` from ComfyUI's `DifferentialDiffusion.forward` and model
//! samplings): the mask each model call sees, for every model sampling sdflow has, and a
//! KSampler run on a tiny SD1 model that follows ComfyUI's inpainting loop step by step.

use sdflow_core::dtype::DType;
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::sampling::flow::FlowShift;
use sdflow_core::sampling::schedule::{ksampler_sigmas, DiscreteSchedule, ScheduleOpts, Scheduler};
use sdflow_core::sampling::RngKind;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{InputData, IoType, NodeError, Value};
use sdflow_nodes::sampling::differential::DifferentialThreshold;
use sdflow_nodes::sampling::Sigmas;
use sdflow_nodes::values::{DifferentialDiffusion, Latent, Mask, ModelRef};
use serde_json::json;
use std::sync::Arc;

mod common;
use common::{c, env, floats, out, Env};

common::fixture!("fixtures/differential_diffusion/differential_diffusion.json");

fn link(t: IoType, v: impl sdflow_executor::CacheSize) -> InputData {
    InputData::Value(Value::new(t, v))
}

/// A MODEL whose weights are never loaded: enough for the threshold, which reads only the
/// model's sampling.
fn model(env: &Env, family: sdflow_core::detect::ModelFamily, prediction: Prediction, schedule: DiscreteSchedule, flow: Option<FlowShift>) -> ModelRef {
    env.model(family, prediction, schedule, flow, 0.18215, 0.0)
}

/// The model of each ComfyUI model sampling the fixture runs.
fn sampling(env: &Env, kind: &str) -> ModelRef {
    use sdflow_core::detect::ModelFamily::*;
    match kind {
        "discrete" => model(env, Sd1, Prediction::Epsilon, DiscreteSchedule::sd(), None),
        "discrete_zsnr" => model(env, Sd1, Prediction::V, DiscreteSchedule::sd().zero_terminal_snr(), None),
        "edm" => model(env, Sdxl, Prediction::EdmV, DiscreteSchedule::edm(0.002, 120.0).unwrap(), None),
        "sd3" => {
            let shift = FlowShift::Snr(3.0);
            model(env, Sd3, Prediction::Flow, shift.schedule().unwrap(), Some(shift))
        }
        "flux" => {
            let shift = FlowShift::Flux(1.15);
            model(env, Flux, Prediction::Flow, shift.schedule().unwrap(), Some(shift))
        }
        other => panic!("unknown sampling {other}"),
    }
}

/// Every call's mask equals ComfyUI's: the threshold in the model's own timesteps (nearest
/// table index for discrete models, ¼·ln σ for EDM, σ for flows), its ends at the list's
/// first σ and at its last or the model's σ_min, strength's mixing and its falsy 0.
#[test]
fn per_call_masks_match_comfyui() {
    let env = env(2);
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() > 30);
    let mut checked = 0;
    for case in cases {
        let m = sampling(&env, case["sampling"].as_str().unwrap());
        let sigmas = floats(&case["sigmas"]);
        let t = DifferentialThreshold::new(&m, &sigmas);
        let dd = DifferentialDiffusion { strength: case["strength"].as_f64().unwrap() as f32 };
        let mask = floats(&case["mask"]);
        for (sigma, want) in floats(&case["calls"]).into_iter().zip(case["masks"].as_array().unwrap()) {
            let got = dd.apply(&mask, t.at(sigma));
            let want = floats(want);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-6, "{} {sigmas:?} strength {} at sigma {sigma}: {got:?}, ComfyUI {want:?}", case["sampling"], dd.strength);
            }
            checked += 1;
        }
    }
    assert!(checked > 250, "{checked} calls");
}

#[test]
fn node_schema_and_inputs() {
    let env = env(2);
    let info = env.registry.schema("DifferentialDiffusion").unwrap().object_info();
    assert_eq!(info["display_name"], "Differential Diffusion");
    assert_eq!(info["category"], "_for_testing");
    assert_eq!(info["input_order"], json!({"required": ["model"], "optional": ["strength"]}));
    assert_eq!(info["input"]["optional"]["strength"], json!(["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}]));
    assert_eq!((info["output"].clone(), info["output_name"].clone()), (json!(["MODEL"]), json!(["MODEL"])));
    let m = sampling(&env, "discrete");
    let patched = env.run("DifferentialDiffusion", vec![("model", link(IoType::MODEL, m.clone()))]).unwrap();
    assert_eq!(out::<ModelRef>(&patched, 0).differential_diffusion, Some(DifferentialDiffusion { strength: 1.0 }), "strength is optional, 1 by default");
    match env.run("DifferentialDiffusion", vec![("model", link(IoType::MODEL, m)), ("strength", c(json!(1.5)))]) {
        Err(NodeError::InvalidInput { input, .. }) => assert_eq!(input, "strength"),
        other => panic!("strength 1.5: {other:?}"),
    }
}

/// A KSampler (euler, karras, 4 steps at denoise 0.6, CFG 2.5) on a tiny SD1 model with a
/// graded noise mask, under DifferentialDiffusion, against ComfyUI's loop rebuilt here:
/// at each step the mask is ComfyUI's (from the fixture), the input outside it is the image
/// noised to the step's σ, the model's prediction is taken there by a one-step run of the
/// same model without any mask, and the prediction outside the mask is the image.
#[test]
fn ksampler_follows_comfyui_step_masks() {
    let env = env(2);
    let ckpts = env.dir.path().join("checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let loaded = env.run("CheckpointLoaderSimple", vec![("ckpt_name", c(json!("model.safetensors")))]).unwrap();
    let (model, clip) = (out::<ModelRef>(&loaded, 0), loaded.values[1].clone());
    let text = |t: &str| env.run("CLIPTextEncode", vec![("clip", InputData::Value(clip.clone())), ("text", c(json!(t)))]).unwrap().values[0].clone();
    let (positive, negative) = (text("a red fox"), text("blurry"));

    let f = fixture();
    let toy = &f["toy"];
    let (w, h) = (toy["width"].as_u64().unwrap() as usize, toy["height"].as_u64().unwrap() as usize);
    let (steps, denoise) = (toy["steps"].as_u64().unwrap() as usize, toy["denoise"].as_f64().unwrap() as f32);
    let sigmas = floats(&toy["sigmas"]);
    let ours = ksampler_sigmas("karras".parse::<Scheduler>().unwrap(), steps, denoise, &model.schedule, &ScheduleOpts::default(), false).unwrap();
    assert_eq!(ours.len(), sigmas.len());
    for (a, b) in ours.iter().zip(&sigmas) {
        assert!((a - b).abs() <= 1e-5 * b.max(1.0), "KSampler's sigmas {ours:?}, ComfyUI's {sigmas:?}");
    }

    let channels = 4;
    let per = w * h * channels;
    let latent: Vec<f32> = (0..per).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 3.0).collect();
    let mask = Mask { data: floats(&toy["mask"]), n: 1, height: h, width: w };
    let shape = [w as i64, h as i64, channels as i64, 1];
    let masked = Latent { samples: latent.clone(), shape, noise_mask: Some(Arc::new(mask.clone())), batch_index: None, frames: 1 };
    let (seed, cfg) = (42u64, 2.5);
    let ksampler = |m: &ModelRef| -> Vec<f32> {
        let inputs = vec![
            ("model", link(IoType::MODEL, m.clone())),
            ("seed", c(json!(seed))),
            ("steps", c(json!(steps))),
            ("cfg", c(json!(cfg))),
            ("sampler_name", c(json!("euler"))),
            ("scheduler", c(json!("karras"))),
            ("positive", InputData::Value(positive.clone())),
            ("negative", InputData::Value(negative.clone())),
            ("latent_image", link(IoType::LATENT, masked.clone())),
            ("denoise", c(json!(denoise))),
        ];
        out::<Latent>(&env.run("KSampler", inputs).unwrap(), 0).samples
    };
    // The guided prediction at (x, σ) in model space: one euler step to 0 without noise,
    // whose denoised output is the prediction.
    let euler = env.run("KSamplerSelect", vec![("sampler_name", c(json!("euler")))]).unwrap().values[0].clone();
    let scale = model.latent.scale_at(0, 1);
    let predict = |x: &[f32], sigma: f32| -> Vec<f32> {
        let inputs = vec![
            ("model", link(IoType::MODEL, model.clone())),
            ("add_noise", c(json!(false))),
            ("noise_seed", c(json!(0))),
            ("cfg", c(json!(cfg))),
            ("positive", InputData::Value(positive.clone())),
            ("negative", InputData::Value(negative.clone())),
            ("sampler", InputData::Value(euler.clone())),
            ("sigmas", link(IoType::SIGMAS, Sigmas(vec![sigma, 0.0]))),
            ("latent_image", link(IoType::LATENT, Latent::new(x.iter().map(|v| v / scale).collect(), shape))),
        ];
        out::<Latent>(&env.run("SamplerCustom", inputs).unwrap(), 1).samples.iter().map(|v| v * scale).collect()
    };

    for strength in ["1.0", "0.4"] {
        let mut dd_model = model.clone();
        dd_model.differential_diffusion = Some(DifferentialDiffusion { strength: strength.parse().unwrap() });
        let got = ksampler(&dd_model);

        // ComfyUI's KSamplerX0Inpaint under euler, with the fixture's per-step masks.
        let step_masks: Vec<Vec<f32>> = toy["strength"][strength].as_array().unwrap().iter().map(floats).collect();
        let image: Vec<f32> = latent.iter().map(|v| v * scale).collect();
        let noise = RngKind::Cpu.seeded(seed).randn(per);
        let mut x: Vec<f32> = image.iter().zip(&noise).map(|(l, n)| l + n * sigmas[0]).collect();
        for (i, m) in step_masks.iter().enumerate() {
            let (sigma, next) = (sigmas[i], sigmas[i + 1]);
            let k = |p: usize| m[p % (w * h)];
            let x_in: Vec<f32> = (0..per).map(|p| x[p] * k(p) + (image[p] + noise[p] * sigma) * (1.0 - k(p))).collect();
            let d: Vec<f32> = predict(&x_in, sigma).iter().enumerate().map(|(p, v)| v * k(p) + image[p] * (1.0 - k(p))).collect();
            for p in 0..per {
                x[p] += (x[p] - d[p]) / sigma * (next - sigma);
            }
        }
        let want: Vec<f32> = x.iter().map(|v| v / scale).collect();
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let spread = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-4 * spread.max(1.0), "strength {strength}: worst difference {worst} (values up to {spread})");

        // The patch matters here: the plain mask gives another result.
        let plain = ksampler(&model);
        let apart = plain.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(apart > 100.0 * worst.max(1e-6), "strength {strength}: without the patch only {apart} apart");
    }
}
