//! Chroma end to end on tiny random-weight files (the transformer alone in BFL's names, T5-XXL
//! alone, FLUX's ae): the committed workflow, ComfyUI's template, T5TokenizerOptions and bad
//! input.

use sdflow_executor::{InputValue, NodeSpec, Workflow};
use sdflow_tests::{with_input, write_flux_models, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_flux_models(dir.path());
    let enc = dir.path().join("models/text_encoders");
    // The template's file name for the same T5.
    std::fs::copy(enc.join("t5xxl_fp16.safetensors"), enc.join("t5xxl_fp8_e4m3fn_scaled.safetensors")).unwrap();
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::Link { node: node.into(), output }
}

/// The committed workflow at 48², 3 steps.
fn chroma(env: &TestEnv) -> Workflow {
    let wf = env.workflow("chroma_txt2img.json", 48, 3);
    with_input(&wf, "10", "steps", json!(3))
}

#[test]
fn the_chroma_workflow_runs_and_its_inputs_matter() {
    let env = env();
    let wf = chroma(&env);
    let (w, h, px) = env.run_saved(&wf, "15");
    assert_eq!((w, h), (48, 48));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    let base = env.run_saved_hash(&wf, "15");
    assert_eq!(env.run_saved_hash(&wf, "15"), base);
    for (node, input, v) in [("6", "text", json!("a red fox")), ("7", "text", json!("")), ("8", "cfg", json!(1.0)), ("5", "shift", json!(3.0)), ("11", "noise_seed", json!(7))] {
        assert_ne!(env.run_saved_hash(&with_input(&wf, node, input, v.clone()), "15"), base, "{node}.{input} = {v}");
    }
    // Padding the prompts (Chroma's advised min_padding 1) gives T5 and the model another
    // sequence; T5TokenizerOptions at 0/0 is the unpadded default.
    assert_ne!(env.run_saved_hash(&with_input(&wf, "3", "min_padding", json!(1)), "15"), base);
    let mut direct = wf.clone();
    direct.set_input("6", "clip", link("2", 0)).unwrap();
    direct.set_input("7", "clip", link("2", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&direct, "15"), base);
    // FluxGuidance reaches Chroma's approximator (ComfyUI's Chroma reads guidance, default 0).
    let mut guided = wf.clone();
    guided.nodes.insert("20".into(), NodeSpec::new("FluxGuidance").with_input("conditioning", link("6", 0)).with_input("guidance", InputValue::Const(json!(0.0))));
    guided.set_input("8", "positive", link("20", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&guided, "15"), base);
    assert_ne!(env.run_saved_hash(&with_input(&guided, "20", "guidance", json!(4.0)), "15"), base);
}

#[test]
fn comfyuis_chroma_template_loads_unchanged_and_runs() {
    let env = env();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/image_chroma_text_to_image.json");
    let mut wf = Workflow::parse(&std::fs::read_to_string(path).unwrap(), env.exec.registry()).unwrap();
    if let Err(report) = env.exec.validate(&wf) {
        panic!("does not validate: {}", serde_json::to_string_pretty(&report.to_json()).unwrap());
    }
    let latent = sdflow_tests::node_of(&wf, "EmptySD3LatentImage");
    wf = with_input(&with_input(&wf, &latent, "width", json!(40)), &latent, "height", json!(32));
    let sched = sdflow_tests::node_of(&wf, "BasicScheduler");
    wf = with_input(&wf, &sched, "steps", json!(2));
    let (w, h, px) = env.run_saved(&wf, &sdflow_tests::node_of(&wf, "SaveImage"));
    assert_eq!((w, h), (40, 32));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}

#[test]
fn bad_combinations_are_named_errors() {
    let env = env();
    let wf = chroma(&env);
    // CLIP-L is no T5.
    let e = env.run_err(&with_input(&wf, "2", "clip_name", json!("clip_l.safetensors")));
    assert!(e.contains("Chroma reads T5-XXL alone"), "{e}");
    // FLUX's CLIP (CLIP-L beside T5) on Chroma: its tokens fit, the pooled vector is not read.
    let mut flux_clip = wf.clone();
    flux_clip.nodes.insert("20".into(), NodeSpec::new("DualCLIPLoader").with_input("clip_name1", InputValue::Const(json!("clip_l.safetensors"))).with_input("clip_name2", InputValue::Const(json!("t5xxl_fp16.safetensors"))).with_input("type", InputValue::Const(json!("flux"))));
    flux_clip.set_input("3", "clip", link("20", 0)).unwrap();
    let (_, _, px) = env.run_saved(&flux_clip, "15");
    assert!(!px.is_empty());
    // SD3's sampling node on Chroma names the right one.
    let e = env.run_err(&{
        let mut w = wf.clone();
        w.nodes.get_mut("5").unwrap().class_type = "ModelSamplingSD3".into();
        w
    });
    assert!(e.contains("ModelSamplingAuraFlow"), "{e}");
}
