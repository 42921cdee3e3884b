//! ModelSamplingDiscrete / ModelSamplingContinuousEDM (sd-cli's `--prediction`) against
//! what the loader reads from a checkpoint's marker keys (`v_pred`, `ztsnr`): the same
//! weights with a prediction set by the node or by the markers give the same image.

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, PredictionMarkers, SdConfig};
use sdflow_executor::{InputValue, NodeSpec, Workflow};
use sdflow_tests::{tiny_tree, with_input, TestEnv};
use serde_json::json;

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

/// The tiny tree's checkpoint (seed 7) and two copies of its weights with markers:
/// `vpred.safetensors` (v_pred) and `zsnr.safetensors` (v_pred + ztsnr).
fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    tiny_tree(dir.path());
    let ckpts = dir.path().join("models/checkpoints");
    for (name, ztsnr) in [("vpred.safetensors", false), ("zsnr.safetensors", true)] {
        let cfg = SdConfig { markers: PredictionMarkers { v_pred: true, ztsnr }, ..SdConfig::tiny_sd1_f8() };
        write_checkpoint(&ckpts.join(name), &cfg, DType::F32, 7, Format::Safetensors).unwrap();
    }
    TestEnv::with_dir(dir, |rt| rt)
}

/// txt2img at 64², 3 steps, from checkpoint `ckpt`, its MODEL through `sampling` (a node
/// taking `model`) when given.
fn run(env: &TestEnv, ckpt: &str, sampling: Option<NodeSpec>) -> u64 {
    let mut wf: Workflow = with_input(&env.workflow("txt2img.json", 64, 3), "1", "ckpt_name", json!(ckpt));
    if let Some(node) = sampling {
        wf.nodes.insert("30".into(), node.with_input("model", InputValue::link("1", 0)));
        wf.set_input("5", "model", InputValue::link("30", 0)).unwrap();
    }
    env.run_saved_hash(&wf, "7")
}

fn discrete(sampling: &str, zsnr: bool) -> Option<NodeSpec> {
    Some(NodeSpec::new("ModelSamplingDiscrete").with_input("sampling", c(json!(sampling))).with_input("zsnr", c(json!(zsnr))))
}

#[test]
fn prediction_overrides_equal_the_checkpoints_markers() {
    let env = env();
    let eps = run(&env, "model.safetensors", None);
    assert_eq!(run(&env, "model.safetensors", discrete("eps", false)), eps, "eps on an eps model changes nothing");
    let v = run(&env, "model.safetensors", discrete("v_prediction", false));
    assert_ne!(v, eps);
    assert_eq!(run(&env, "vpred.safetensors", None), v, "the v_pred key means v-prediction");
    assert_eq!(run(&env, "vpred.safetensors", discrete("eps", false)), eps, "and the node overrides it");
    let zsnr = run(&env, "model.safetensors", discrete("v_prediction", true));
    assert_ne!(zsnr, v);
    assert_eq!(run(&env, "zsnr.safetensors", None), zsnr, "v_pred + ztsnr: the zero-terminal-SNR schedule");
    assert_eq!(run(&env, "zsnr.safetensors", discrete("v_prediction", false)), v);
}

#[test]
fn continuous_edm_sets_the_sigma_range() {
    let env = env();
    let edm = |hi: f64, lo: f64| Some(NodeSpec::new("ModelSamplingContinuousEDM").with_input("sampling", c(json!("v_prediction"))).with_input("sigma_max", c(json!(hi))).with_input("sigma_min", c(json!(lo))));
    let cosxl = run(&env, "model.safetensors", edm(120.0, 0.002));
    assert_ne!(cosxl, run(&env, "model.safetensors", discrete("v_prediction", false)));
    assert_ne!(cosxl, run(&env, "model.safetensors", edm(80.0, 0.002)));
    let mut wf = env.workflow("txt2img.json", 64, 3);
    wf.nodes.insert("30".into(), edm(0.001, 0.002).unwrap().with_input("model", InputValue::link("1", 0)));
    wf.set_input("5", "model", InputValue::link("30", 0)).unwrap();
    let err = env.run_err(&wf);
    assert!(err.contains("ModelSamplingContinuousEDM") && err.contains("sigma_min"), "{err}");
}
