//! Z-Image end to end on tiny random-weight files (the transformer alone in the release's
//! names and in diffusers', Qwen3 alone in Hugging Face's, FLUX's ae): the committed Turbo
//! and Base workflows, the text encoder's template and layer, and bad combinations.

use sdflow_executor::{InputValue, NodeSpec};
use sdflow_tests::{with_input, write_z_image_models, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_z_image_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::Link { node: node.into(), output }
}

#[test]
fn the_turbo_workflow_runs_and_its_inputs_matter() {
    let env = env();
    let wf = env.workflow("z_image_turbo.json", 48, 3);
    let (w, h, px) = env.run_saved(&wf, "10");
    assert_eq!((w, h), (48, 48));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    let base = env.run_saved_hash(&wf, "10");
    assert_eq!(env.run_saved_hash(&wf, "10"), base, "deterministic");
    for (node, input, v) in [("5", "text", json!("a (red:1.3) fox")), ("4", "shift", json!(1.0)), ("8", "seed", json!(7)), ("8", "sampler_name", json!("euler"))] {
        assert_ne!(env.run_saved_hash(&with_input(&wf, node, input, v.clone()), "10"), base, "{node}.{input} = {v}");
    }
    // At CFG 1 the zeroed negative is never evaluated: any negative gives the same image.
    let mut other_negative = wf.clone();
    other_negative.nodes.insert("20".into(), NodeSpec::new("CLIPTextEncode").with_input("text", InputValue::Const(json!("blurry"))).with_input("clip", link("2", 0)));
    other_negative.set_input("8", "negative", link("20", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&other_negative, "10"), base);
    // The same transformer in diffusers' names gives the same image.
    let diffusers = with_input(&wf, "1", "unet_name", json!("z_image_turbo_diffusers.safetensors"));
    assert_eq!(env.run_saved_hash(&diffusers, "10"), base);
    // An odd latent size (40×24 pixels: 5×3 latent pixels) is padded to whole patches.
    let odd = with_input(&with_input(&wf, "7", "width", json!(40)), "7", "height", json!(24));
    assert_eq!(env.run_saved(&odd, "10").0, 40);
}

#[test]
fn the_base_workflow_runs_with_real_cfg() {
    let env = env();
    let wf = env.workflow("z_image_base.json", 32, 2);
    let base = env.run_saved_hash(&wf, "10");
    // CFG 4 against the negative prompt: the negative matters.
    assert_ne!(env.run_saved_hash(&with_input(&wf, "6", "text", json!("")), "10"), base);
    assert_ne!(env.run_saved_hash(&with_input(&wf, "8", "cfg", json!(1.0)), "10"), base);
}

#[test]
fn bad_combinations_are_named_errors() {
    let env = env();
    let wf = env.workflow("z_image_turbo.json", 32, 2);
    // T5 is no LLM.
    let e = env.run_err(&with_input(&wf, "2", "clip_name", json!("t5xxl_fp16.safetensors")));
    assert!(e.contains("no LLM text encoder"), "{e}");
    // T5 tokens (Chroma's CLIP) are not the caption features Z-Image reads.
    let e = env.run_err(&with_input(&with_input(&wf, "2", "clip_name", json!("t5xxl_fp16.safetensors")), "2", "type", json!("chroma")));
    assert!(e.contains("Qwen3-4B"), "{e}");
    // SD3's sampling node names the one Z-Image takes.
    let e = env.run_err(&{
        let mut w = wf.clone();
        w.nodes.get_mut("4").unwrap().class_type = "ModelSamplingSD3".into();
        w
    });
    assert!(e.contains("ModelSamplingAuraFlow"), "{e}");
    // A FLUX transformer with Z-Image's text encoder: the widths do not fit.
    let e = env.run_err(&with_input(&wf, "1", "unet_name", json!("flux1-schnell.safetensors")));
    assert!(e.contains("text tokens"), "{e}");
}
