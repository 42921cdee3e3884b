//! PolyexponentialScheduler, LaplaceScheduler, VPScheduler, BetaSamplingScheduler,
//! FlipSigmas, SplitSigmasDenoise, ExtendIntermediateSigmas, SamplingPercentToSigma and
//! AddNoise against ComfyUI's own code (`fixtures/sigma_nodes`, written by its `gen.py`),
//! on discrete eps / v (zero terminal SNR), EDM, SD3-flow and FLUX-flow model samplings.

use sdflow_core::detect::ModelFamily;
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::sampling::flow::FlowShift;
use sdflow_core::sampling::schedule::DiscreteSchedule;
use sdflow_executor::{InputData, IoType, NodeError, Outputs, Value};
use sdflow_nodes::sampling::{NoiseSource, Sigmas};
use sdflow_nodes::values::{Latent, ModelRef};
use serde_json::json;

mod common;
use common::{env, floats, latent, Env};

common::fixture!("fixtures/sigma_nodes/sigma_nodes.json");

impl Env {
    /// The fixture's models: their sampling and latent format; weights never loaded.
    fn model_of(&self, kind: &str) -> ModelRef {
        let (family, prediction, schedule, flow, scale, shift) = match kind {
            "sd1" => (ModelFamily::Sd1, Prediction::Epsilon, DiscreteSchedule::sd(), None, 0.18215, 0.0),
            "zsnr" => (ModelFamily::Sd1, Prediction::V, DiscreteSchedule::sd().zero_terminal_snr(), None, 0.18215, 0.0),
            "edm" => (ModelFamily::Sdxl, Prediction::EdmV, DiscreteSchedule::edm(0.002, 120.0).unwrap(), None, 0.13025, 0.0),
            "sd3" => (ModelFamily::Sd3, Prediction::Flow, FlowShift::Snr(3.0).schedule().unwrap(), Some(FlowShift::Snr(3.0)), 1.5305, 0.0609),
            "flux" => (ModelFamily::Flux, Prediction::Flow, FlowShift::Flux(1.15).schedule().unwrap(), Some(FlowShift::Flux(1.15)), 0.3611, 0.1159),
            other => panic!("unknown model {other}"),
        };
        self.model(family, prediction, schedule, flow, scale, shift)
    }
}

fn close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?}, ComfyUI {want:?}");
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= rel * b.abs().max(1.0), "{what}: {got:?}, ComfyUI {want:?}");
    }
}

#[test]
fn object_info_matches_comfyui_definitions() {
    let schemas = fixture()["schemas"].as_object().unwrap();
    assert_eq!(schemas.len(), 9);
    common::assert_object_info_matches(&env(1).registry, schemas);
}

#[test]
fn nodes_match_comfyui() {
    let env = env(1);
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() > 130);
    let (mut errors, mut checked) = (0, 0);
    for case in cases {
        let node = case["node"].as_str().unwrap();
        let what = format!("{node} {}", case["inputs"]);
        let mut inputs = Vec::new();
        for (k, v) in case["inputs"].as_object().unwrap() {
            let data = match k.as_str() {
                "model" => InputData::Value(Value::new(IoType::MODEL, env.model_of(v.as_str().unwrap()))),
                "sigmas" => InputData::Value(Value::new(IoType::SIGMAS, Sigmas(floats(v)))),
                "noise" => InputData::Value(Value::new(IoType::NOISE, NoiseSource::new(v.as_u64().unwrap_or(0), v.as_u64().is_some(), None))),
                "latent_image" => InputData::Value(Value::new(IoType::LATENT, latent(&f["latents"][v.as_str().unwrap()]))),
                _ => InputData::Const(v.clone()),
            };
            inputs.push((k.as_str(), data));
        }
        let got = env.run(node, inputs);
        if case.get("error").is_some() {
            match got {
                Err(NodeError::InvalidInput { .. }) => errors += 1,
                other => panic!("{what}: ComfyUI fails ({}); ours {:?}", case["error"], other.map(|_| ())),
            }
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = case["out"].as_array().unwrap();
        assert_eq!(got.values.len(), want.len(), "{what}");
        for (v, w) in got.values.iter().zip(want) {
            match v.io_type().as_str() {
                "SIGMAS" => close(&v.downcast_ref::<Sigmas>().unwrap().0, &floats(w), 2e-6, &what),
                "FLOAT" => {
                    let (a, b) = (*v.downcast_ref::<f64>().unwrap(), w.as_f64().unwrap());
                    assert!((a - b).abs() <= 2e-6 * b.abs().max(1.0), "{what}: {a}, ComfyUI {b}");
                }
                "LATENT" => {
                    let l = v.downcast_ref::<Latent>().unwrap();
                    close(&l.samples, &floats(&w["data"]), 1e-5, &what);
                }
                t => panic!("{what}: output type {t}"),
            }
        }
        checked += 1;
    }
    assert_eq!(errors, 2, "PolyexponentialScheduler's logarithm of 0, twice");
    assert!(checked > 130);
}

#[test]
fn bad_inputs_are_named() {
    let env = env(1);
    let named = |r: Result<Outputs, NodeError>| match r {
        Err(NodeError::InvalidInput { input, .. }) => input,
        other => panic!("expected an invalid-input error, got {:?}", other.map(|_| ())),
    };
    let model = InputData::Value(Value::new(IoType::MODEL, env.model_of("sd1")));
    let beta = env.run("BetaSamplingScheduler", vec![("model", model), ("steps", InputData::Const(json!(10))), ("alpha", InputData::Const(json!(0.0))), ("beta", InputData::Const(json!(0.6)))]);
    assert_eq!(named(beta), "alpha");
    let vp = env.run("VPScheduler", vec![("steps", InputData::Const(json!(0))), ("beta_d", InputData::Const(json!(19.9))), ("beta_min", InputData::Const(json!(0.1))), ("eps_s", InputData::Const(json!(0.001)))]);
    assert_eq!(named(vp), "steps");
    let sigmas = InputData::Value(Value::new(IoType::SIGMAS, Sigmas(vec![1.0, 0.0])));
    let extend = env.run("ExtendIntermediateSigmas", vec![("sigmas", sigmas), ("steps", InputData::Const(json!(2))), ("start_at_sigma", InputData::Const(json!(-1.0))), ("end_at_sigma", InputData::Const(json!(0.0))), ("spacing", InputData::Const(json!("cubic")))]);
    assert_eq!(named(extend), "spacing");
    let bad = Latent { samples: vec![0.0; 7], shape: [2, 2, 2, 1], noise_mask: None, batch_index: None, frames: 1 };
    let add = env.run(
        "AddNoise",
        vec![
            ("model", InputData::Value(Value::new(IoType::MODEL, env.model_of("sd1")))),
            ("noise", InputData::Value(Value::new(IoType::NOISE, NoiseSource::new(1, true, None)))),
            ("sigmas", InputData::Value(Value::new(IoType::SIGMAS, Sigmas(vec![1.0, 0.0])))),
            ("latent_image", InputData::Value(Value::new(IoType::LATENT, bad))),
        ],
    );
    assert_eq!(named(add), "latent_image");
}
