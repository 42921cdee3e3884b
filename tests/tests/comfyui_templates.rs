//! ComfyUI's own template workflows (tests/fixtures/comfyui, see SOURCES.md there), loaded
//! unchanged — subgraphs included — and run on tiny random-weight models saved under the
//! names the templates ask for.

use sdflow_executor::{InputValue, Workflow};
use sdflow_tests::{write_flux_models, TestEnv};
use serde_json::json;

fn flux_env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_flux_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::link(node, output)
}

fn konst(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

#[test]
fn a_subgraph_template_flattens_as_comfyuis_frontend_queues_it() {
    let env = flux_env();
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/flux_dev_full_text_to_image.json")).unwrap();
    let wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    let mut ids: Vec<&str> = wf.nodes.keys().map(String::as_str).collect();
    ids.sort();
    // The subgraph instance 194 holds every node but SaveImage; the note is not a node.
    assert_eq!(ids, ["194:45", "194:46", "194:47", "194:48", "194:49", "194:50", "194:51", "194:52", "9"]);
    let n = |id: &str| &wf.nodes[id];
    assert_eq!(n("9").inputs["images"], link("194:51", 0));
    assert_eq!(n("194:51").inputs["samples"], link("194:50", 0));
    assert_eq!(n("194:51").inputs["vae"], link("194:45", 0));
    assert_eq!(n("194:50").inputs["model"], link("194:46", 0));
    assert_eq!(n("194:50").inputs["positive"], link("194:49", 0));
    assert_eq!(n("194:50").inputs["negative"], link("194:52", 0));
    assert_eq!(n("194:50").inputs["latent_image"], link("194:48", 0));
    assert_eq!(n("194:52").inputs["conditioning"], link("194:49", 0));
    assert_eq!(n("194:49").inputs["clip"], link("194:47", 0));
    // Promoted widgets: the instance stores no values (proxyWidgets era), so the inner
    // nodes' own values are sent.
    assert_eq!(n("194:46").inputs["unet_name"], konst(json!("flux1-dev.safetensors")));
    assert_eq!(n("194:47").inputs["clip_name2"], konst(json!("t5xxl_fp16.safetensors")));
    assert_eq!(n("194:47").inputs["type"], konst(json!("flux")));
    assert_eq!(n("194:48").inputs["width"], konst(json!(1024)));
    assert_eq!(n("194:50").inputs["seed"], konst(json!(0)));
    assert_eq!(n("194:50").inputs["sampler_name"], konst(json!("euler")));
    assert_eq!(n("194:50").inputs["scheduler"], konst(json!("simple")));
    assert!(matches!(&n("194:49").inputs["text"], InputValue::Const(t) if t.as_str().unwrap().starts_with("A fairy tale scene")));
}

#[test]
fn flux_subgraph_templates_run_unchanged() {
    let env = flux_env();
    for name in ["flux_dev_full_text_to_image.json", "flux_dev_checkpoint_example.json"] {
        let wf = env.comfyui_template(name, 32, 2);
        let save = sdflow_tests::node_of(&wf, "SaveImage");
        let (w, h, px) = env.run_saved(&wf, &save);
        assert_eq!((w, h), (32, 32), "{name}");
        assert!(px.iter().max().unwrap() > px.iter().min().unwrap(), "{name}");
    }
    // The same graph from the two templates (they differ only in prompt and seed): with
    // those set alike, the same image.
    let a = env.comfyui_template("flux_dev_full_text_to_image.json", 32, 2);
    let mut b = env.comfyui_template("flux_dev_checkpoint_example.json", 32, 2);
    let (enc_a, enc_b) = (sdflow_tests::node_of(&a, "CLIPTextEncode"), sdflow_tests::node_of(&b, "CLIPTextEncode"));
    let (ks_a, ks_b) = (sdflow_tests::node_of(&a, "KSampler"), sdflow_tests::node_of(&b, "KSampler"));
    b.set_input(&enc_b, "text", a.nodes[&enc_a].inputs["text"].clone()).unwrap();
    b.set_input(&ks_b, "seed", a.nodes[&ks_a].inputs["seed"].clone()).unwrap();
    let save_a = sdflow_tests::node_of(&a, "SaveImage");
    let save_b = sdflow_tests::node_of(&b, "SaveImage");
    assert_eq!(env.run_saved(&a, &save_a).2, env.run_saved(&b, &save_b).2);
}

#[test]
fn the_sdxl_template_runs_unchanged() {
    use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    let ckpt = dir.path().join("models/checkpoints/sd_xl_base_1.0.safetensors");
    write_checkpoint(&ckpt, &SdConfig::tiny_sdxl(), sdflow_core::dtype::DType::F32, 11, Format::Safetensors).unwrap();
    let env = TestEnv::with_dir(dir, |rt| rt);
    let wf = env.comfyui_template("image_sdxl_simple.json", 64, 2);
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    let (w, h, px) = env.run_saved(&wf, &save);
    assert_eq!((w, h), (64, 64));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}
