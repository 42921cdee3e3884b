//! IP-Adapter end to end: `workflows/ip_adapter.json` on the tiny SD1 checkpoint with a
//! tiny CLIP ViT (224-pixel input) and tiny classic and Plus adapters in the h94 layout.
//! Weight 0 is exactly no adapter, weight 1 changes the image, Plus runs, adapters or
//! vision models that do not fit fail naming the file; the preprocessing is ComfyUI's.

use sdflow_core::synth::{ip_adapter_tensors, write_tensors, ClipVisionSynth, IpAdapterSynth};
use sdflow_executor::{InputValue, NodeSpec, Workflow};
use sdflow_nodes::conditioning::ip_adapter::clip_preprocess;
use sdflow_nodes::values::Image;
use sdflow_tests::{node_of, tiny_tree, write_ip_adapter_models, write_test_png, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_tree(dir.path());
    write_test_png(&input.join("input.png"), 72, 56);
    write_ip_adapter_models(dir.path());
    let models = dir.path().join("models");
    // Misfits: an adapter for a 48-wide context, a vision tower with 24-wide embeddings, a
    // file that is no IP-Adapter.
    let (layers, _) = sdflow_tests::unet_cross_attention(&models.join("checkpoints/model.safetensors"));
    write_tensors(&models.join("ipadapter/wide.safetensors"), &ip_adapter_tensors(IpAdapterSynth::Classic { embed_dim: 32, tokens: 4 }, &layers, 48), 1).unwrap();
    let narrow = ClipVisionSynth { projection_dim: 24, ..ClipVisionSynth::tiny() };
    write_tensors(&models.join("clip_vision/narrow.safetensors"), &narrow.tensors().unwrap(), 2).unwrap();
    std::fs::copy(models.join("clip_vision/CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors"), models.join("ipadapter/not_an_adapter.safetensors")).unwrap();
    // SDXL: its adapter has one layer pair per transformer layer of every block (two in
    // some blocks here), for the 96-wide context of the tiny SDXL.
    let xl = models.join("checkpoints/sdxl.safetensors");
    sdflow_core::synth::write_checkpoint(&xl, &sdflow_core::synth::SdConfig::tiny_sdxl(), sdflow_core::dtype::DType::F32, 10, sdflow_core::synth::Format::Safetensors).unwrap();
    let (layers, cross) = sdflow_tests::unet_cross_attention(&xl);
    let embed_dim = ClipVisionSynth::tiny().projection_dim;
    write_tensors(&models.join("ipadapter/ip-adapter_sdxl.safetensors"), &ip_adapter_tensors(IpAdapterSynth::Classic { embed_dim, tokens: 4 }, &layers, cross), 3).unwrap();
    // A ControlNet for the tiny SD1, to compose with the adapter.
    std::fs::create_dir_all(models.join("controlnet")).unwrap();
    sdflow_core::synth::write_controlnet(&models.join("controlnet/canny.safetensors"), &sdflow_core::synth::SdConfig::tiny_sd1_f8().unet, 3, 11).unwrap();
    TestEnv::with_dir(dir, |rt| rt)
}

fn wf(env: &TestEnv) -> Workflow {
    env.workflow("ip_adapter.json", 64, 2)
}

use sdflow_tests::with_input as set;

#[test]
fn ip_adapter_workflow_runs_and_the_weight_matters() {
    let env = env();
    let wf = wf(&env);
    let (apply, save, sampler) = (node_of(&wf, "IPAdapterAdvanced"), node_of(&wf, "SaveImage"), node_of(&wf, "KSampler"));
    let (w, h, with) = env.run_saved(&set(&wf, &apply, "weight", json!(1.0)), &save);
    assert_eq!((w, h), (64, 64));
    // The same graph with the sampler on the checkpoint's own model.
    let mut plain = wf.clone();
    plain.set_input(&sampler, "model", InputValue::link("1", 0)).unwrap();
    let (_, _, without) = env.run_saved(&plain, &save);
    assert_ne!(with, without, "an image prompt at weight 1 changes the image");
    let (_, _, zero) = env.run_saved(&set(&wf, &apply, "weight", json!(0.0)), &save);
    assert_eq!(zero, without, "weight 0 is exactly no adapter");
    // Outside start_at..end_at the adapter does not act either.
    let late = set(&set(&wf, &apply, "start_at", json!(0.999)), &apply, "weight", json!(1.0));
    let (_, _, late) = env.run_saved(&late, &save);
    assert_ne!(late, with);

    // Plus: the resampler over the hidden states, and a black image as its negative.
    let plus = set(&set(&wf, &apply, "weight", json!(1.0)), &node_of(&wf, "IPAdapterModelLoader"), "ipadapter_file", json!("ip-adapter-plus_sd15.safetensors"));
    let (_, _, plus) = env.run_saved(&plus, &save);
    assert_ne!(plus, without);
    assert_ne!(plus, with);
}

#[test]
fn a_negative_image_replaces_the_unconditional_embedding() {
    let env = env();
    let wf = wf(&env);
    let (apply, save) = (node_of(&wf, "IPAdapterAdvanced"), node_of(&wf, "SaveImage"));
    let (_, _, one) = env.run_saved(&wf, &save);
    let mut neg = wf.clone();
    neg.nodes.insert("20".into(), NodeSpec::new("ImageInvert").with_input("image", InputValue::link("4", 0)));
    neg.set_input(&apply, "image_negative", InputValue::link("20", 0)).unwrap();
    let (_, _, with_neg) = env.run_saved(&neg, &save);
    assert_ne!(with_neg, one);
}

#[test]
fn misfits_are_clear_errors() {
    let env = env();
    let wf = wf(&env);
    let (loader, vision) = (node_of(&wf, "IPAdapterModelLoader"), node_of(&wf, "CLIPVisionLoader"));
    let e = env.run_err(&set(&wf, &loader, "ipadapter_file", json!("wide.safetensors")));
    assert!(e.contains("wide.safetensors") && e.contains("48 wide") && e.contains("takes 32"), "{e}");
    let e = env.run_err(&set(&wf, &vision, "clip_name", json!("narrow.safetensors")));
    assert!(e.contains("32-wide image embeddings"), "{e}");
    let e = env.run_err(&set(&wf, &loader, "ipadapter_file", json!("not_an_adapter.safetensors")));
    assert!(e.contains("not_an_adapter.safetensors") && e.contains("not an IP-Adapter"), "{e}");
    assert!(env.exec.validate(&set(&wf, &vision, "clip_name", json!("../ipadapter/ip-adapter_sd15.safetensors"))).is_err(), "only listed files");
    let mut no_vision = wf.clone();
    no_vision.nodes.get_mut(&node_of(&wf, "IPAdapterAdvanced")).unwrap().inputs.remove("clip_vision");
    let e = env.run_err(&no_vision);
    assert!(e.contains("clip_vision"), "{e}");
}

/// ComfyUI's `clip_preprocess` in torch (core/tests/fixtures/models/make_ip_adapter.py):
/// shrinking, enlarging, squashing (crop "none"), an exact-size image, RGBA.
#[test]
fn preprocessing_matches_comfyui() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../core/tests/fixtures/models/ip_adapter_ref.json");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in r["preprocess"].as_array().unwrap() {
        let shape: Vec<usize> = serde_json::from_value(case["shape"].clone()).unwrap();
        let px: Vec<u8> = serde_json::from_value(case["image8"].clone()).unwrap();
        let img = Image { data: px.iter().map(|&v| v as f32 / 255.0).collect(), n: shape[0], height: shape[1], width: shape[2], channels: shape[3] };
        let size = case["size"].as_u64().unwrap() as usize;
        let got = clip_preprocess(&img, size, case["crop"].as_bool().unwrap()).unwrap();
        let want: Vec<f32> = serde_json::from_value(case["out"].clone()).unwrap();
        assert_eq!(got.len(), want.len());
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        eprintln!("{shape:?} → {size} (crop {}): max abs error {err}", case["crop"]);
        assert!(err <= 1e-3, "{shape:?} → {size}: max abs error {err}");
    }
    let grey = Image { data: vec![0.5; 2 * 2], n: 1, height: 2, width: 2, channels: 1 };
    assert!(clip_preprocess(&grey, 8, true).is_err(), "one channel is not RGB");
}

#[test]
fn ip_adapter_runs_on_sdxl() {
    let env = env();
    let wf = wf(&env);
    let (apply, save, sampler) = (node_of(&wf, "IPAdapterAdvanced"), node_of(&wf, "SaveImage"), node_of(&wf, "KSampler"));
    let xl = set(&set(&wf, "1", "ckpt_name", json!("sdxl.safetensors")), &node_of(&wf, "IPAdapterModelLoader"), "ipadapter_file", json!("ip-adapter_sdxl.safetensors"));
    let (_, _, with) = env.run_saved(&set(&xl, &apply, "weight", json!(1.0)), &save);
    let mut plain = xl.clone();
    plain.set_input(&sampler, "model", InputValue::link("1", 0)).unwrap();
    let (_, _, without) = env.run_saved(&plain, &save);
    assert_ne!(with, without, "the image prompt reaches SDXL's cross-attentions");
    let (_, _, zero) = env.run_saved(&set(&xl, &apply, "weight", json!(0.0)), &save);
    assert_eq!(zero, without, "weight 0 is exactly no adapter");
    // The SD1.5 adapter does not fit SDXL's layers: an error naming the file.
    let e = env.run_err(&set(&wf, "1", "ckpt_name", json!("sdxl.safetensors")));
    assert!(e.contains("ip-adapter_sd15"), "{e}");
}

/// IP-Adapter patches the model, ControlNet the conditioning: both act in one sampling,
/// and the image differs from either alone.
#[test]
fn ip_adapter_composes_with_controlnet() {
    let env = env();
    let wf = set(&wf(&env), "5", "weight", json!(1.0));
    let (sampler, save) = (node_of(&wf, "KSampler"), node_of(&wf, "SaveImage"));
    let mut both = wf.clone();
    both.nodes.insert("20".into(), NodeSpec::new("ControlNetLoader").with_input("control_net_name", InputValue::Const(json!("canny.safetensors"))));
    both.nodes.insert("21".into(), sdflow_tests::controlnet_apply(InputValue::link("6", 0), InputValue::link("7", 0), "20", "4", 1.0));
    both.set_input(&sampler, "positive", InputValue::link("21", 0)).unwrap();
    both.set_input(&sampler, "negative", InputValue::link("21", 1)).unwrap();
    let (_, _, composed) = env.run_saved(&both, &save);
    let (_, _, adapter_only) = env.run_saved(&wf, &save);
    let mut control_only = both.clone();
    control_only.set_input(&sampler, "model", InputValue::link("1", 0)).unwrap();
    let (_, _, control_only) = env.run_saved(&control_only, &save);
    assert_ne!(composed, adapter_only, "the ControlNet acts beside the adapter");
    assert_ne!(composed, control_only, "the adapter acts beside the ControlNet");
}
