//! SD3 / SD3.5 end to end on tiny random-weight files in the layouts people download
//! (Stability's checkpoint of MMDiT and VAE, the MMDiT alone, CLIP-L, OpenCLIP-G and T5-XXL
//! alone, ComfyUI's all-in-one): the committed workflow, ComfyUI's SD3 nodes and template,
//! and bad input.

use sdflow_executor::{InputValue, NodeSpec, Workflow};
use sdflow_tests::{with_input, write_sd3_models, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_sd3_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::Link { node: node.into(), output }
}

fn node(class: &str, inputs: &[(&str, InputValue)]) -> NodeSpec {
    let mut spec = NodeSpec::new(class);
    for (k, v) in inputs {
        spec.inputs.insert((*k).into(), v.clone());
    }
    spec
}

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

/// The committed workflow at 48², 3 steps, skip-layer guidance over most of them.
fn sd35(env: &TestEnv) -> Workflow {
    let wf = env.workflow("sd35_txt2img.json", 48, 3);
    with_input(&wf, "3", "end_percent", json!(0.9))
}

#[test]
fn the_sd35_workflow_runs_and_its_inputs_matter() {
    let env = env();
    let wf = sd35(&env);
    let (w, h, px) = env.run_saved(&wf, "9");
    assert_eq!((w, h), (48, 48));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    let base = env.run_saved_hash(&wf, "9");
    assert_eq!(env.run_saved_hash(&wf, "9"), base, "the same graph gives the same image");
    assert_ne!(env.run_saved_hash(&with_input(&wf, "7", "seed", json!(43)), "9"), base);
    assert_ne!(env.run_saved_hash(&with_input(&wf, "4", "text", json!("a red fox")), "9"), base);
    assert_ne!(env.run_saved_hash(&with_input(&wf, "7", "cfg", json!(1.5)), "9"), base);
    // The tiny MMDiT has blocks 0 and 1: SD3.5's advised 7, 8, 9 leave nothing out (as in
    // ComfyUI), so skip-layer guidance adds nothing; block 1 changes the image, scale 0 not.
    let mut plain = wf.clone();
    plain.set_input("7", "model", link("1", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&plain, "9"), base);
    let slg1 = with_input(&wf, "3", "layers", json!("[1]"));
    let with_slg = env.run_saved_hash(&slg1, "9");
    assert_ne!(with_slg, base);
    assert_eq!(env.run_saved_hash(&with_input(&slg1, "3", "scale", json!(0.0)), "9"), base);
    // Outside its window it does nothing either.
    assert_eq!(env.run_saved_hash(&with_input(&with_input(&slg1, "3", "start_percent", json!(0.95)), "3", "end_percent", json!(1.0)), "9"), base);
    // ModelSamplingSD3 at the default shift 3 is the model's own sampling; 6 is another.
    let shifted = |shift: f64| {
        let mut w = plain.clone();
        w.nodes.insert("20".into(), node("ModelSamplingSD3", &[("model", link("1", 0)), ("shift", c(json!(shift)))]));
        w.set_input("7", "model", link("20", 0)).unwrap();
        w
    };
    assert_eq!(env.run_saved_hash(&shifted(3.0), "9"), base);
    assert_ne!(env.run_saved_hash(&shifted(6.0), "9"), base);
}

#[test]
fn loaders_and_encoders_agree_across_layouts() {
    let env = env();
    let wf = sd35(&env);
    let base = env.run_saved_hash(&wf, "9");
    // UNETLoader on Stability's checkpoint (the MMDiT under `model.diffusion_model.`), and on
    // the MMDiT alone in bare names (other random weights, so another image).
    let models = env.dir.path().join("models");
    std::fs::copy(models.join("checkpoints/sd3.5_medium.safetensors"), models.join("diffusion_models/sd3.5_medium_stability.safetensors")).unwrap();
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let unet = |file: &str| {
        let mut w = wf.clone();
        w.nodes.insert("20".into(), node("UNETLoader", &[("unet_name", c(json!(file))), ("weight_dtype", c(json!("default")))]));
        w.set_input("3", "model", link("20", 0)).unwrap();
        w
    };
    assert_eq!(env.run_saved_hash(&unet("sd3.5_medium_stability.safetensors"), "9"), base);
    let (_, _, px) = env.run_saved(&unet("sd3.5_medium.safetensors"), "9");
    // The bare MMDiT's diffusers-named twin makes the same image.
    let dm = models.join("diffusion_models");
    let hidden = sdflow_core::io::open(&dm.join("sd3.5_medium.safetensors")).unwrap().get("context_embedder.weight").unwrap().shape[0];
    sdflow_tests::write_diffusers_twin(&dm.join("sd3.5_medium.safetensors"), &dm.join("sd3.5_medium_diffusers.safetensors"), &sdflow_core::models::sd3::diffusers::LAYOUT, hidden);
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let (_, _, twin) = env.run_saved(&unet("sd3.5_medium_diffusers.safetensors"), "9");
    assert_eq!(twin, px, "diffusers' names load as Stability's");
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
    // The encoders in another order, and through DualCLIPLoader + CLIPLoader's `sd3` types.
    let reordered = with_input(&with_input(&wf, "2", "clip_name1", json!("t5xxl_fp16.safetensors")), "2", "clip_name3", json!("clip_l.safetensors"));
    assert_eq!(env.run_saved_hash(&reordered, "9"), base);
    // CLIPTextEncodeSD3 with the prompt in every field is CLIPTextEncode.
    let text = "a bottle with a pink and red galaxy inside it on top of a wooden table";
    let mut sd3_encode = wf.clone();
    sd3_encode.nodes.insert(
        "21".into(),
        node("CLIPTextEncodeSD3", &[("clip", link("2", 0)), ("clip_l", c(json!(text))), ("clip_g", c(json!(text))), ("t5xxl", c(json!(text))), ("empty_padding", c(json!("none")))]),
    );
    sd3_encode.set_input("7", "positive", link("21", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&sd3_encode, "9"), base);
    // An empty T5 field: `none` gives T5 no prompt (one token), `empty_prompt` the empty one.
    let empty_t5 = |padding: &str| with_input(&with_input(&sd3_encode, "21", "t5xxl", json!("")), "21", "empty_padding", json!(padding));
    let (none, padded) = (env.run_saved_hash(&empty_t5("none"), "9"), env.run_saved_hash(&empty_t5("empty_prompt"), "9"));
    assert_ne!(none, padded);
    assert_ne!(none, base);
    // Without a T5 (DualCLIPLoader sd3 of CLIP-L and -G): CLIP tokens alone, 4096 wide, which
    // this tiny MMDiT (128-wide context) names as a mismatch.
    let mut dual = wf.clone();
    dual.nodes.insert("22".into(), node("DualCLIPLoader", &[("clip_name1", c(json!("clip_g.safetensors"))), ("clip_name2", c(json!("clip_l.safetensors"))), ("type", c(json!("sd3")))]));
    dual.set_input("4", "clip", link("22", 0)).unwrap();
    dual.set_input("5", "clip", link("22", 0)).unwrap();
    let e = env.run_err(&dual);
    assert!(e.contains("text tokens 4096 wide"), "{e}");
}

#[test]
fn comfyuis_sd35_template_loads_unchanged_and_runs() {
    let env = env();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/sd3.5_simple_example.json");
    let mut wf = Workflow::parse(&std::fs::read_to_string(path).unwrap(), env.exec.registry()).unwrap();
    if let Err(report) = env.exec.validate(&wf) {
        panic!("does not validate: {}", serde_json::to_string_pretty(&report.to_json()).unwrap());
    }
    let latent = sdflow_tests::node_of(&wf, "EmptySD3LatentImage");
    wf = with_input(&with_input(&wf, &latent, "width", json!(32)), &latent, "height", json!(40));
    let sampler = sdflow_tests::node_of(&wf, "KSampler");
    wf = with_input(&wf, &sampler, "steps", json!(2));
    let (w, h, px) = env.run_saved(&wf, &sdflow_tests::node_of(&wf, "SaveImage"));
    assert_eq!((w, h), (32, 40));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}

#[test]
fn bad_combinations_are_named_errors() {
    let env = env();
    let wf = sd35(&env);
    // Stability's checkpoint has no text encoders: its CLIP names TripleCLIPLoader.
    let mut own_clip = wf.clone();
    own_clip.set_input("4", "clip", link("1", 1)).unwrap();
    let e = env.run_err(&own_clip);
    assert!(e.contains("TripleCLIPLoader"), "{e}");
    // Two T5s, two CLIP-Ls.
    let e = env.run_err(&with_input(&wf, "2", "clip_name1", json!("t5xxl_fp16.safetensors")));
    assert!(e.contains("both T5 encoders"), "{e}");
    let e = env.run_err(&with_input(&wf, "2", "clip_name2", json!("clip_l.safetensors")));
    assert!(e.contains("both 32-wide"), "{e}");
    // SD3 sampling nodes on FLUX, FLUX's on SD3, SLG on FLUX.
    let mut flux = wf.clone();
    flux.nodes.insert("20".into(), node("UNETLoader", &[("unet_name", c(json!("flux1-dev.safetensors"))), ("weight_dtype", c(json!("default")))]));
    flux.set_input("3", "model", link("20", 0)).unwrap();
    let e = env.run_err(&flux);
    assert!(e.contains("SkipLayerGuidanceSD3") && e.contains("FLUX"), "{e}");
    let mut ms = wf.clone();
    ms.nodes.insert("20".into(), node("ModelSamplingAuraFlow", &[("model", link("1", 0)), ("shift", c(json!(3.0)))]));
    ms.set_input("3", "model", link("20", 0)).unwrap();
    let e = env.run_err(&ms);
    assert!(e.contains("ModelSamplingSD3"), "{e}");
    let mut ms = wf.clone();
    ms.nodes.insert("20".into(), node("ModelSamplingFlux", &[("model", link("1", 0)), ("max_shift", c(json!(1.15))), ("base_shift", c(json!(0.5))), ("width", c(json!(1024))), ("height", c(json!(1024)))]));
    ms.set_input("3", "model", link("20", 0)).unwrap();
    let e = env.run_err(&ms);
    assert!(e.contains("needs a FLUX.1, Chroma, FLUX.2 or Qwen-Image model"), "{e}");
    // FLUX's text encoders on SD3's model: the T5 tokens alone fit, the pooled vector not.
    let mut flux_clip = wf.clone();
    flux_clip.nodes.insert("21".into(), node("DualCLIPLoader", &[("clip_name1", c(json!("clip_l.safetensors"))), ("clip_name2", c(json!("t5xxl_fp16.safetensors"))), ("type", c(json!("flux")))]));
    flux_clip.set_input("4", "clip", link("21", 0)).unwrap();
    flux_clip.set_input("5", "clip", link("21", 0)).unwrap();
    let e = env.run_err(&flux_clip);
    assert!(e.contains("pooled vector"), "{e}");
}

/// An SD3.5 diffusers pipeline folder (`StableDiffusion3Pipeline`: transformer/, vae/,
/// text_encoder/ CLIP-L, text_encoder_2/ OpenCLIP-G with its projection, text_encoder_3/
/// T5-XXL) made from ComfyUI's all-in-one file loads through CheckpointLoaderSimple and
/// makes exactly that file's image.
#[test]
fn a_pipeline_folder_runs_as_its_all_in_one_twin() {
    let env = env();
    let ckpts = env.dir.path().join("models/checkpoints");
    let ckpt = ckpts.join("sd3.5_large_fp8_scaled.safetensors");
    let hidden = sdflow_core::io::open(&ckpt).unwrap().get("model.diffusion_model.context_embedder.weight").unwrap().shape[0];
    sdflow_tests::write_dit_pipeline_folder(&ckpt, &ckpts.join("stable-diffusion-3.5-medium"), &sdflow_core::models::sd3::diffusers::LAYOUT, hidden, "StableDiffusion3Pipeline");
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/sd3.5_simple_example.json");
    let mut wf = Workflow::parse(&std::fs::read_to_string(path).unwrap(), env.exec.registry()).unwrap();
    let latent = sdflow_tests::node_of(&wf, "EmptySD3LatentImage");
    wf = with_input(&with_input(&wf, &latent, "width", json!(32)), &latent, "height", json!(32));
    let sampler = sdflow_tests::node_of(&wf, "KSampler");
    wf = with_input(&wf, &sampler, "steps", json!(2));
    let (loader, save) = (sdflow_tests::node_of(&wf, "CheckpointLoaderSimple"), sdflow_tests::node_of(&wf, "SaveImage"));
    let (_, _, single) = env.run_saved(&wf, &save);
    let (_, _, folder) = env.run_saved(&with_input(&wf, &loader, "ckpt_name", json!("stable-diffusion-3.5-medium")), &save);
    assert_eq!(single, folder);
}
