//! Area and mask conditioning end to end: `workflows/area_composition.json` runs, and
//! in one model evaluation (one Euler step to sigma 0 returns the denoised latent) an
//! area or mask entry changes the latent only where it applies.

use sdflow_executor::{stub, CancelToken, Executor, ExecutorConfig, InputValue, NodeSpec, NullSink, Registry, RunOptions, Workflow};
use sdflow_nodes::values::Latent;
use sdflow_nodes::Runtime;
use serde_json::json;
use std::sync::{Arc, Mutex};

struct Env {
    dir: tempfile::TempDir,
    exec: Executor,
    seen: Arc<Mutex<Vec<Latent>>>,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let input = sdflow_tests::tiny_tree(dir.path());
    // White from x 96 on, at the 192×128 image size: latent cells x ≥ 12.
    sdflow_tests::write_mask_png(&input.join("right.png"), 192, 128, |x, _| x >= 96);
    let rt = Runtime::new(dir.path().join("models"), dir.path().join("output"), 2, None).unwrap().with_input_dir(&input);
    let mut reg = Registry::new();
    stub::register(&mut reg);
    sdflow_nodes::register_all(&mut reg, Arc::new(rt));
    let seen = Arc::new(Mutex::new(Vec::new()));
    reg.register(Arc::new(sdflow_tests::CaptureLatent::new(seen.clone())));
    Env { exec: Executor::new(Arc::new(reg), ExecutorConfig::default()), dir, seen }
}

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

fn l(node: &str) -> InputValue {
    InputValue::link(node, 0)
}

/// The committed workflow at 192×128, the house area at (96, 32) 64×64 pixels (latent
/// cells x 12..20, y 4..12), the KSampler at `steps` Euler steps, its latent captured.
fn composition(env: &Env, steps: i64) -> Workflow {
    let text = std::fs::read_to_string(sdflow_tests::workflows_dir().join("area_composition.json")).unwrap();
    let mut wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    for (input, v) in [("width", 192), ("height", 128)] {
        wf.set_input("10", input, c(json!(v))).unwrap();
    }
    for (input, v) in [("width", 64), ("height", 64), ("x", 96), ("y", 32)] {
        wf.set_input("4", input, c(json!(v))).unwrap();
    }
    wf.set_input("11", "steps", c(json!(steps))).unwrap();
    wf.nodes.insert("30".into(), NodeSpec::new("TestCaptureLatent").with_input("samples", l("11")));
    wf
}

fn run(env: &Env, wf: &Workflow) -> Latent {
    let opts = RunOptions { output_dir: Some(env.dir.path().join("output")), ..Default::default() };
    let before = env.seen.lock().unwrap().len();
    env.exec.run(wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    let seen = env.seen.lock().unwrap();
    assert_eq!(seen.len(), before + 1, "the capture ran");
    seen.last().unwrap().clone()
}

/// (largest difference inside, largest outside `inside`), relative to the largest
/// value of `a`. Entries of another region size run in their own UNet batch, so
/// outside their region nothing moves at all; entries batched with the others change
/// the batch, and so the rounding (not more: `core/tests/denoise_batch.rs`).
fn compare(a: &Latent, b: &Latent, inside: impl Fn(usize, usize) -> bool) -> (f32, f32) {
    assert_eq!(a.shape, b.shape);
    let [w, h, ..] = a.shape.map(|d| d as usize);
    let scale = a.samples.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (mut d_in, mut d_out) = (0f32, 0f32);
    for (i, (x, y)) in a.samples.iter().zip(&b.samples).enumerate() {
        let d = (x - y).abs() / scale;
        if inside(i % w, (i / w) % h) {
            d_in = d_in.max(d);
        } else {
            d_out = d_out.max(d);
        }
    }
    (d_in, d_out)
}

/// Float rounding of a different batch, relative.
const ROUNDING: f32 = 1e-5;

#[test]
fn area_composition_runs() {
    let env = env();
    let wf = composition(&env, 2);
    let latent = run(&env, &wf);
    assert_eq!(latent.shape, [24, 16, 4, 1]);
    assert!(latent.samples.iter().all(|v| v.is_finite()));
    let (_, _, px) = {
        let opts = RunOptions { output_dir: Some(env.dir.path().join("output")), ..Default::default() };
        let report = env.exec.run(&wf, &NullSink, &CancelToken::new(), &opts).unwrap();
        sdflow_tests::read_png(&env.dir.path().join("output").join(report.ui_outputs["13"]["images"][0]["filename"].as_str().unwrap()))
    };
    assert_eq!(px.len(), 192 * 128 * 3);
}

#[test]
fn an_area_changes_only_its_region() {
    let env = env();
    let mut alone = composition(&env, 1);
    alone.set_input("11", "positive", l("2")).unwrap();
    let reference = run(&env, &alone);

    // The house area added to the whole-image prompt.
    let mut with_area = composition(&env, 1);
    with_area.set_input("11", "positive", l("7")).unwrap();
    let (inside, outside) = compare(&reference, &run(&env, &with_area), |x, y| (12..20).contains(&x) && (4..12).contains(&y));
    assert!(inside > 1e-3, "the area changes its region ({inside})");
    assert_eq!(outside, 0.0, "and nothing else");

    // The sky band: the top 40% of 16 rows, rows 0..6 (Python's round(6.4)).
    let mut with_sky = composition(&env, 1);
    with_sky.set_input("8", "conditioning_1", l("2")).unwrap();
    with_sky.set_input("11", "positive", l("8")).unwrap();
    let (inside, outside) = compare(&reference, &run(&env, &with_sky), |_, y| y < 6);
    assert!(inside > 1e-3, "{inside}");
    assert_eq!(outside, 0.0);

    // An area covering the whole latent at strength 1 is the prompt without one (up to
    // the rounding of the negative's same-area counterpart, run in a larger batch).
    let mut whole = composition(&env, 1);
    for (input, v) in [("width", 192), ("height", 128), ("x", 0), ("y", 0)] {
        whole.set_input("4", input, c(json!(v))).unwrap();
    }
    whole.set_input("4", "conditioning", l("2")).unwrap();
    whole.set_input("11", "positive", l("4")).unwrap();
    let (_, worst) = compare(&reference, &run(&env, &whole), |_, _| false);
    assert!(worst < ROUNDING, "whole-latent area: worst relative difference {worst}");
}

#[test]
fn a_mask_changes_only_where_it_is_set() {
    let env = env();
    let mut alone = composition(&env, 1);
    alone.set_input("11", "positive", l("2")).unwrap();
    let reference = run(&env, &alone);

    let mut masked = composition(&env, 1);
    masked.nodes.insert("31".into(), NodeSpec::new("LoadImageMask").with_input("image", c(json!("right.png"))).with_input("channel", c(json!("red"))));
    let set_mask = NodeSpec::new("ConditioningSetMask")
        .with_input("conditioning", l("3"))
        .with_input("mask", l("31"))
        .with_input("strength", c(json!(1.0)))
        .with_input("set_cond_area", c(json!("default")));
    masked.nodes.insert("32".into(), set_mask);
    masked.nodes.insert("33".into(), NodeSpec::new("ConditioningCombine").with_input("conditioning_1", l("2")).with_input("conditioning_2", l("32")));
    masked.set_input("11", "positive", l("33")).unwrap();
    let (inside, outside) = compare(&reference, &run(&env, &masked), |x, _| x >= 11);
    assert!(inside > 1e-3, "the mask's half changes ({inside})");
    assert!(outside < ROUNDING, "the other half does not ({outside})");

    // "mask bounds" runs the masked prompt on the box only: the same confinement.
    masked.set_input("32", "set_cond_area", c(json!("mask bounds"))).unwrap();
    let (inside, outside) = compare(&reference, &run(&env, &masked), |x, _| x >= 11);
    assert!(inside > 1e-3, "{inside}");
    assert_eq!(outside, 0.0, "a 16×12-cell box runs in its own batch");
}
