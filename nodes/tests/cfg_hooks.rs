//! RescaleCFG, CFGNorm, CFGZeroStar, LatentApplyOperationCFG and the LATENT_OPERATION nodes
//! against ComfyUI's own code (`fixtures/cfg_hooks`, written by its `gen.py`: ComfyUI's
//! `sampling_function` under the hooks its real nodes set, on given side predictions), and
//! a sampler run on a tiny SD1 model that applies them at its model call.

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{InputData, IoType, NodeError, Value};
use sdflow_nodes::sampling::cfg_hooks::{guide, LATENT_OPERATION};
use sdflow_nodes::sampling::Sigmas;
use sdflow_nodes::values::{CfgHooks, Latent, LatentOperation, ModelRef, PostCfg, PostCfgHook};
use sdflow_nodes::Runtime;
use serde_json::{json, Value as Json};

mod common;
use common::{c, dims, env};

common::fixture!("fixtures/cfg_hooks/cfg_hooks.json");

/// A fixture tensor's values.
fn data(v: &Json) -> Vec<f32> {
    common::floats(&v["data"])
}

/// A torch [N, C, H, W] shape as sdflow's [W, H, C, N].
fn shape(v: &Json) -> [i64; 4] {
    let s = dims(v);
    [s[3] as i64, s[2] as i64, s[1] as i64, s[0] as i64]
}

fn operation(spec: &Json) -> LatentOperation {
    match spec["op"].as_str().unwrap() {
        "tonemap" => LatentOperation::TonemapReinhard { multiplier: spec["multiplier"].as_f64().unwrap() as f32 },
        _ => LatentOperation::Sharpen { radius: spec["radius"].as_u64().unwrap() as usize, sigma: spec["sigma"].as_f64().unwrap(), alpha: spec["alpha"].as_f64().unwrap() },
    }
}

/// The fixture's hooks as the nodes build them: applied one after another to a MODEL.
fn hooks(list: &Json) -> CfgHooks {
    let mut h = CfgHooks::default();
    for hook in list.as_array().unwrap() {
        match hook["kind"].as_str().unwrap() {
            "rescale" => h.rescale = Some(hook["multiplier"].as_f64().unwrap() as f32),
            "norm" => h.post.push(PostCfgHook { kind: PostCfg::Norm { strength: hook["strength"].as_f64().unwrap() as f32 }, after_slg: false }),
            "zero_star" => h.post.push(PostCfgHook { kind: PostCfg::ZeroStar, after_slg: false }),
            _ => h.pre.push(operation(&hook["operation"])),
        }
    }
    h
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

#[test]
fn object_info_matches_comfyui_definitions() {
    let schemas = fixture()["schemas"].as_object().unwrap();
    assert_eq!(schemas.len(), 7);
    common::assert_object_info_matches(&env(2).registry, schemas);
}

/// The guided prediction equals ComfyUI's `sampling_function` for every hook set, at CFG
/// 4.5 and at CFG 1 (where the negative pass is skipped and the hooks see zeros), with and
/// without a negative (BasicGuider).
#[test]
fn guidance_matches_comfyui_sampling_function() {
    let cases = fixture()["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 60);
    for case in cases {
        let h = hooks(&case["hooks"]);
        let cfg = case["cfg"].as_f64().unwrap() as f32;
        let s = shape(&case["x"]);
        // ComfyUI's CFG-1 optimisation skips the negative pass: sdflow's sampler then has none.
        let negative = (case["negative"] == true && cfg != 1.0).then(|| data(&case["negative_pred"]));
        let got = guide(&h, cfg, data(&case["positive"]), negative, &data(&case["x"]), case["sigma"].as_f64().unwrap() as f32, s).unwrap();
        let want = data(&case["out"]);
        let spread = want.iter().fold(1f32, |m, v| m.max(v.abs()));
        let w = worst(&got, &want);
        assert!(w <= 1e-5 * spread, "{} cfg {cfg}: worst difference {w}", case["hooks"]);
    }
}

/// LatentApplyOperation with each operation equals ComfyUI's, and fails where ComfyUI's
/// reflect padding does.
#[test]
fn latent_operations_match_comfyui() {
    let env = env(2);
    let f = fixture();
    let latent = Latent::new(data(&f["latent"]), shape(&f["latent"]));
    for case in f["operations"].as_array().unwrap() {
        let spec = &case["operation"];
        let op = match spec["op"].as_str().unwrap() {
            "tonemap" => env.run("LatentOperationTonemapReinhard", vec![("multiplier", c(spec["multiplier"].clone()))]),
            _ => env.run("LatentOperationSharpen", vec![("sharpen_radius", c(spec["radius"].clone())), ("sigma", c(spec["sigma"].clone())), ("alpha", c(spec["alpha"].clone()))]),
        }
        .unwrap();
        assert_eq!(op.values[0].io_type(), &LATENT_OPERATION);
        assert_eq!(op.values[0].downcast_ref::<LatentOperation>(), Some(&operation(spec)));
        let out = env.run("LatentApplyOperation", vec![("samples", InputData::Value(Value::new(IoType::LATENT, latent.clone()))), ("operation", InputData::Value(op.values[0].clone()))]);
        if case.get("error").is_some() {
            match out {
                Err(NodeError::InvalidInput { input, .. }) => assert_eq!(input, "operation"),
                other => panic!("{spec}: ComfyUI fails; ours {:?}", other.map(|_| ())),
            }
            continue;
        }
        let got = out.unwrap().values[0].downcast_ref::<Latent>().unwrap().samples.clone();
        let want = data(&case["out"]);
        // Sharpening by alpha 2 weighs the centre by about 20: float error grows with it.
        let spread = want.iter().fold(1f32, |m, v| m.max(v.abs()));
        let w = worst(&got, &want);
        assert!(w <= 5e-6 * spread, "{spec}: worst difference {w} (values up to {spread})");
    }
}

/// The nodes put their hooks on the MODEL in order: RescaleCFG's replaces an earlier one,
/// the post-CFG hooks queue, each noting whether skip-layer guidance came before it.
#[test]
fn nodes_set_hooks_in_order() {
    let env = env(2);
    let dir = env.dir.path().join("m.safetensors");
    std::fs::write(&dir, b"x").unwrap();
    let key = sdflow_core::residency::WeightKey::new([&dir], "", sdflow_core::io::WeightType::Stored, sdflow_core::residency::Device::Cpu).unwrap();
    let weights = Runtime::new(env.dir.path(), env.dir.path(), 1, sdflow_core::io::WeightType::Stored)
        .unwrap()
        .residency
        .get_or_load(key, || -> Result<sdflow_core::models::Weights, Box<dyn std::error::Error + Send + Sync>> { Err("unused".into()) })
        .unwrap();
    let mut model = ModelRef {
        weights,
        prefix: String::new(),
        family: sdflow_core::detect::ModelFamily::Sd1,
        prediction: sdflow_core::models::conditioning::Prediction::Epsilon,
        latent: sdflow_nodes::values::LatentFormat::uniform(0.18215, 0.0),
        schedule: sdflow_core::sampling::schedule::DiscreteSchedule::sd(),
        flow: None,
        ip_adapters: Vec::new(),
        motion: None,
        slg: None,
        differential_diffusion: None,
        cfg_hooks: CfgHooks::default(),
        circular: Default::default(),
    };
    let step = |model: &ModelRef, node: &str, extra: Vec<(&str, InputData)>| -> ModelRef {
        let mut inputs = vec![("model", InputData::Value(Value::new(IoType::MODEL, model.clone())))];
        inputs.extend(extra);
        env.run(node, inputs).unwrap().values[0].downcast_ref::<ModelRef>().unwrap().clone()
    };
    model = step(&model, "RescaleCFG", vec![("multiplier", c(json!(0.3)))]);
    model = step(&model, "CFGNorm", vec![("strength", c(json!(0.5)))]);
    model.slg = Some(sdflow_nodes::values::SkipLayerGuidance { layers: Default::default(), scale: 3.0, rescaling: 0.0, percents: (0.0, 1.0), window: sdflow_nodes::values::SlgWindow::Sigmas });
    model = step(&model, "CFGZeroStar", vec![]);
    model = step(&model, "RescaleCFG", vec![("multiplier", c(json!(0.9)))]);
    assert_eq!(model.cfg_hooks.rescale, Some(0.9));
    assert_eq!(model.cfg_hooks.post, vec![PostCfgHook { kind: PostCfg::Norm { strength: 0.5 }, after_slg: false }, PostCfgHook { kind: PostCfg::ZeroStar, after_slg: true }]);
    match env.run("CFGNorm", vec![("model", InputData::Value(Value::new(IoType::MODEL, model))), ("strength", c(json!(-1.0)))]) {
        Err(NodeError::InvalidInput { input, .. }) => assert_eq!(input, "strength"),
        other => panic!("strength -1: {:?}", other.map(|_| ())),
    }
    match env.run("LatentOperationSharpen", vec![("sharpen_radius", c(json!(0))), ("sigma", c(json!(1.0))), ("alpha", c(json!(0.1)))]) {
        Err(NodeError::InvalidInput { input, .. }) => assert_eq!(input, "sharpen_radius"),
        other => panic!("radius 0: {:?}", other.map(|_| ())),
    }
}

/// On a tiny SD1 model, one sampler step with the hooked model gives exactly what `guide`
/// makes of the model's positive and negative predictions taken apart (each a CFG-1 run,
/// which evaluates only its positive side): the sampler applies the hooks at its model
/// call, with the call's CFG scale, σ and input.
#[test]
fn the_sampler_applies_the_hooks() {
    let env = env(2);
    let ckpts = env.dir.path().join("checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let loaded = env.run("CheckpointLoaderSimple", vec![("ckpt_name", c(json!("model.safetensors")))]).unwrap();
    let model = loaded.values[0].downcast_ref::<ModelRef>().unwrap().clone();
    let text = |t: &str| env.run("CLIPTextEncode", vec![("clip", InputData::Value(loaded.values[1].clone())), ("text", c(json!(t)))]).unwrap().values[0].clone();
    let (p, n) = (text("a castle at dusk"), text("flat, grey"));
    let euler = env.run("KSamplerSelect", vec![("sampler_name", c(json!("euler")))]).unwrap().values[0].clone();
    let shape = [8i64, 8, 4, 2];
    let scale = model.latent.scale_at(0, 1);
    let x: Vec<f32> = (0..512).map(|i| ((i * 53 % 89) as f32 / 44.0 - 1.0) * 4.0).collect();
    let sigma = 2.5f32;
    let denoised = |m: &ModelRef, cfg: f64, pos: &Value, neg: &Value| -> Vec<f32> {
        let inputs = vec![
            ("model", InputData::Value(Value::new(IoType::MODEL, m.clone()))),
            ("add_noise", c(json!(false))),
            ("noise_seed", c(json!(0))),
            ("cfg", c(json!(cfg))),
            ("positive", InputData::Value(pos.clone())),
            ("negative", InputData::Value(neg.clone())),
            ("sampler", InputData::Value(euler.clone())),
            ("sigmas", InputData::Value(Value::new(IoType::SIGMAS, Sigmas(vec![sigma, 0.0])))),
            ("latent_image", InputData::Value(Value::new(IoType::LATENT, Latent::new(x.iter().map(|v| v / scale).collect(), shape)))),
        ];
        env.run("SamplerCustom", inputs).unwrap().values[1].downcast_ref::<Latent>().unwrap().samples.iter().map(|v| v * scale).collect()
    };
    let (pos_pred, neg_pred) = (denoised(&model, 1.0, &p, &n), denoised(&model, 1.0, &n, &p));
    let mut hooked = model.clone();
    hooked.cfg_hooks = CfgHooks {
        pre: vec![LatentOperation::TonemapReinhard { multiplier: 1.2 }],
        rescale: Some(0.7),
        post: vec![PostCfgHook { kind: PostCfg::ZeroStar, after_slg: false }, PostCfgHook { kind: PostCfg::Norm { strength: 0.8 }, after_slg: false }],
    };
    for cfg in [5.0f32, 1.0] {
        let got = denoised(&hooked, cfg as f64, &p, &n);
        let negative = (cfg != 1.0).then(|| neg_pred.clone());
        let want = guide(&hooked.cfg_hooks, cfg, pos_pred.clone(), negative, &x, sigma, shape).unwrap();
        let spread = want.iter().fold(1f32, |m, v| m.max(v.abs()));
        let w = worst(&got, &want);
        assert!(w <= 1e-4 * spread, "cfg {cfg}: worst difference {w} (values up to {spread})");
        let plain = denoised(&model, cfg as f64, &p, &n);
        assert!(worst(&plain, &want) > 100.0 * w.max(1e-6), "cfg {cfg}: the hooks change the prediction");
    }
}
