//! Qwen-Image end to end on tiny random-weight files (the MMDiT in the release's names,
//! Qwen2.5-VL's language model in Hugging Face's, the Wan-2.1 VAE in Wan's with its 5-D
//! kernels): the committed workflow, image to image through the VAE, and bad combinations.

use sdflow_executor::{InputValue, NodeSpec};
use sdflow_tests::{with_input, write_flux_models, write_qwen_image_models, TestEnv};
use sdflow_core::dtype::DType;
use sdflow_core::synth::Format;
use sdflow_core::synth::dit::QwenImageSynth;
use sdflow_core::synth::write_specs;
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let input = sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_test_png(&input.join("input.png"), 72, 56);
    write_qwen_image_models(dir.path());
    write_flux_models(dir.path());
    // The transformer without one of its weights.
    let q = QwenImageSynth::tiny();
    let specs: Vec<_> = q.tensors().into_iter().filter(|t| t.name != "transformer_blocks.0.attn.to_k.weight").collect();
    let broken = dir.path().join("models/diffusion_models/qwen_image_broken.safetensors");
    write_specs(&broken, &specs, "broken", DType::F32, 61, Format::Safetensors).unwrap();
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::Link { node: node.into(), output }
}

#[test]
fn the_workflow_runs_and_its_inputs_matter() {
    let env = env();
    let wf = env.workflow("qwen_image.json", 48, 3);
    let (w, h, px) = env.run_saved(&wf, "10");
    assert_eq!((w, h), (48, 48));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    let base = env.run_saved_hash(&wf, "10");
    assert_eq!(env.run_saved_hash(&wf, "10"), base, "deterministic");
    for (node, input, v) in [("5", "text", json!("a (red:1.3) fox")), ("6", "text", json!("blurry")), ("4", "shift", json!(1.0)), ("8", "seed", json!(7)), ("8", "cfg", json!(1.0))] {
        assert_ne!(env.run_saved_hash(&with_input(&wf, node, input, v.clone()), "10"), base, "{node}.{input} = {v}");
    }
    // Without the shift node the model samples as ComfyUI's QwenImage does (ModelSamplingFlux).
    let mut unshifted = wf.clone();
    unshifted.set_input("8", "model", link("1", 0)).unwrap();
    assert_ne!(env.run_saved_hash(&unshifted, "10"), base);
    // An odd latent size (40×24 pixels: 5×3 latent pixels) is padded to whole patches.
    let odd = with_input(&with_input(&wf, "7", "width", json!(40)), "7", "height", json!(24));
    assert_eq!(env.run_saved(&odd, "10").0, 40);
}

#[test]
fn image_to_image_goes_through_the_wan_vae() {
    let env = env();
    let mut wf = env.workflow("qwen_image.json", 32, 2);
    // A decoded image encoded again and sampled at half strength.
    wf.nodes.insert("20".into(), NodeSpec::new("VAEEncode").with_input("pixels", link("9", 0)).with_input("vae", link("3", 0)));
    wf.nodes.insert(
        "21".into(),
        NodeSpec::new("KSampler")
            .with_input("model", link("4", 0))
            .with_input("seed", InputValue::Const(json!(3)))
            .with_input("steps", InputValue::Const(json!(2)))
            .with_input("cfg", InputValue::Const(json!(2.5)))
            .with_input("sampler_name", InputValue::Const(json!("euler")))
            .with_input("scheduler", InputValue::Const(json!("simple")))
            .with_input("positive", link("5", 0))
            .with_input("negative", link("6", 0))
            .with_input("latent_image", link("20", 0))
            .with_input("denoise", InputValue::Const(json!(0.5))),
    );
    wf.nodes.insert("22".into(), NodeSpec::new("VAEDecode").with_input("samples", link("21", 0)).with_input("vae", link("3", 0)));
    wf.nodes.insert("23".into(), NodeSpec::new("SaveImage").with_input("images", link("22", 0)).with_input("filename_prefix", InputValue::Const(json!("i2i"))));
    let (w, h, _) = env.run_saved(&wf, "23");
    assert_eq!((w, h), (32, 32));
    let at_half = env.run_saved_hash(&wf, "23");
    assert_ne!(env.run_saved_hash(&with_input(&wf, "21", "denoise", json!(0.8)), "23"), at_half);
}

#[test]
fn bad_combinations_are_named_errors() {
    let env = env();
    let wf = env.workflow("qwen_image.json", 32, 2);
    // T5 is no LLM.
    let e = env.run_err(&with_input(&wf, "2", "clip_name", json!("t5xxl_fp16.safetensors")));
    assert!(e.contains("no LLM text encoder"), "{e}");
    // SD3's sampling node names the one Qwen-Image takes.
    let e = env.run_err(&{
        let mut w = wf.clone();
        w.nodes.get_mut("4").unwrap().class_type = "ModelSamplingSD3".into();
        w
    });
    assert!(e.contains("ModelSamplingAuraFlow"), "{e}");
    // ModelSamplingFlux takes Qwen-Image (ComfyUI's QwenImage is a FLUX model type);
    // SD3's discrete sampling does not.
    let e = env.run_err(&{
        let mut w = wf.clone();
        w.nodes.get_mut("4").unwrap().class_type = "ModelSamplingDiscrete".into();
        w.set_input("4", "sampling", InputValue::Const(json!("eps"))).unwrap();
        w.set_input("4", "zsnr", InputValue::Const(json!(false))).unwrap();
        w
    });
    assert!(e.contains("rectified flow"), "{e}");
    // A Qwen-Image transformer file that lost one weight names it.
    let e = env.run_err(&with_input(&wf, "1", "unet_name", json!("qwen_image_broken.safetensors")));
    assert!(e.contains("transformer_blocks.0.attn.to_k.weight"), "{e}");
}

/// The edit workflows: the input image read by Qwen2.5-VL's vision tower and given as a
/// reference latent; the prompt, the image and the reference each change the result.
#[test]
fn the_edit_workflows_read_their_image() {
    let env = env();
    sdflow_tests::write_test_png(&env.dir.path().join("input/other.png"), 56, 72);
    for (file, encoder, image) in [("qwen_image_edit.json", "TextEncodeQwenImageEdit", "image"), ("qwen_image_edit_2509.json", "TextEncodeQwenImageEditPlus", "image1")] {
        // The starting image at 0.01 megapixels (113×88: a 112×88 latent image).
        let wf = with_input(&env.workflow(file, 32, 2), "5", "megapixels", json!(0.01));
        assert_eq!(wf.nodes["7"].class_type, encoder);
        let (w, h, _) = env.run_saved(&wf, "13");
        assert_eq!((w, h), (112, 88), "{file}");
        let base = env.run_saved_hash(&wf, "13");
        if encoder == "TextEncodeQwenImageEditPlus" {
            // The encoders are TextEncodeQwenImageEdit's but for the sizes and template;
            // one change shows this one reads its prompt.
            assert_ne!(env.run_saved_hash(&with_input(&wf, "7", "prompt", json!("make it autumn")), "13"), base, "{file}: the prompt");
            continue;
        }
        // Another picture for the encoders (the start latent unchanged): the vision tower
        // and the reference read it.
        let mut other = wf.clone();
        other.nodes.insert("30".into(), NodeSpec::new("LoadImage").with_input("image", InputValue::Const(json!("other.png"))));
        for n in ["7", "8"] {
            other.set_input(n, image, link("30", 0)).unwrap();
        }
        assert_ne!(env.run_saved_hash(&other, "13"), base, "{file}: the image");
        // Without the VAE the image still reaches the vision tower, but no reference latent.
        let mut no_ref = wf.clone();
        for n in ["7", "8"] {
            no_ref.nodes.get_mut(n).unwrap().inputs.remove("vae");
        }
        assert_ne!(env.run_saved_hash(&no_ref, "13"), base, "{file}: the reference latent");
    }
}

/// The VAE as a diffusers pipeline folder holds it (`vae/`, `AutoencoderKLQwenImage`
/// names as diffusers' converter gives them: the core fixture's table) decodes as the Wan
/// file does.
#[test]
fn a_diffusers_pipelines_vae_folder_is_the_same_vae() {
    use std::collections::BTreeMap;
    let env = env();
    let table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/models/wan_vae_tiny_ref.json")).unwrap()).unwrap();
    let names: BTreeMap<String, String> = serde_json::from_value(table["diffusers_names"].clone()).unwrap();
    let models = env.dir.path().join("models/vae");
    let src = sdflow_core::io::open(&models.join("qwen_image_vae.safetensors")).unwrap();
    let tensors: Vec<(String, sdflow_core::dtype::DType, Vec<usize>, Vec<u8>)> = names
        .iter()
        .map(|(d, w)| {
            let t = src.get(w).unwrap_or_else(|| panic!("the tiny VAE has {w}"));
            (d.clone(), t.dtype, t.shape.clone(), src.read(w).unwrap().to_vec())
        })
        .collect();
    assert_eq!(tensors.len(), src.tensors().len(), "the table names every tensor");
    let folder = models.join("qwen_image_diffusers");
    std::fs::create_dir_all(folder.join("vae")).unwrap();
    std::fs::write(folder.join("model_index.json"), r#"{"_class_name": "QwenImagePipeline"}"#).unwrap();
    sdflow_core::io::safetensors::write(&folder.join("vae/diffusion_pytorch_model.safetensors"), tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let wf = env.workflow("qwen_image.json", 32, 2);
    let base = env.run_saved_hash(&wf, "10");
    assert_eq!(env.run_saved_hash(&with_input(&wf, "3", "vae_name", json!("qwen_image_diffusers")), "10"), base);
}

/// sd.cpp's edit encoder (what sd-cli's `-r` builds) on a Qwen2.5-VL file without its
/// vision tower: named, with where the tower comes from; FLUX.2's CLIP is refused.
#[test]
fn the_sd_cpp_edit_encoder_needs_the_vision_tower() {
    use std::collections::BTreeMap;
    let env = env();
    let enc = env.dir.path().join("models/text_encoders");
    let src = sdflow_core::io::open(&enc.join("qwen_2.5_vl_7b.safetensors")).unwrap();
    let text_only: Vec<(String, DType, Vec<usize>, Vec<u8>)> = src.tensors().iter().filter(|t| !t.name.starts_with("visual.")).map(|t| (t.name.clone(), t.dtype, t.shape.clone(), src.read(&t.name).unwrap().to_vec())).collect();
    sdflow_core::io::safetensors::write(&enc.join("qwen_2.5_vl_text_only.safetensors"), text_only.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let mut wf = env.workflow("qwen_image.json", 32, 2);
    wf.nodes.insert("20".into(), NodeSpec::new("LoadImage").with_input("image", InputValue::Const(json!("input.png"))));
    wf.nodes.insert("21".into(), NodeSpec::new("SdCppTextEncodeQwenImageEdit").with_input("clip", link("2", 0)).with_input("prompt", InputValue::Const(json!("make it snow"))).with_input("image1", link("20", 0)));
    wf.set_input("8", "positive", link("21", 0)).unwrap();
    let base = env.run_saved_hash(&wf, "10");
    let e = env.run_err(&with_input(&wf, "2", "clip_name", json!("qwen_2.5_vl_text_only.safetensors")));
    assert!(e.contains("no vision tower") && e.contains("--llm_vision"), "{e}");
    // Without an image it is the text-to-image template, which needs no tower.
    let mut plain = with_input(&wf, "2", "clip_name", json!("qwen_2.5_vl_text_only.safetensors"));
    plain.nodes.get_mut("21").unwrap().inputs.remove("image1");
    assert_ne!(env.run_saved_hash(&plain, "10"), base);
}

/// The saved images of `node` after running `wf`: (width, height, bytes per pixel) each.
fn saved_images(env: &TestEnv, wf: &sdflow_executor::Workflow, node: &str) -> Vec<(u32, u32, usize, Vec<u8>)> {
    let opts = sdflow_executor::RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(wf, &sdflow_executor::NullSink, &sdflow_executor::CancelToken::new(), &opts).unwrap();
    let images = report.ui_outputs[node]["images"].as_array().unwrap().clone();
    images
        .iter()
        .map(|i| {
            let (w, h, px) = sdflow_tests::read_png(&env.out.join(i["filename"].as_str().unwrap()));
            (w, h, px.len() / (w * h) as usize, px)
        })
        .collect()
}

/// Qwen-Image-Layered as its template runs: the image through the RGBA VAE as a
/// reference, a latent of the composite and 3 layers sampled as frames, cut into a batch
/// and decoded to 4 RGBA images; the layer count, the reference and the prompt matter.
#[test]
fn layered_decomposes_an_image_into_rgba_layers() {
    let env = env();
    let wf = with_input(&env.workflow("qwen_image_layered.json", 32, 2), "5", "megapixels", json!(0.01));
    let images = saved_images(&env, &wf, "17");
    assert_eq!(images.len(), 4, "the composite and 3 layers");
    for (w, h, bpp, px) in &images {
        // 72×56 scaled to 113×88, the latent 14×11 latent pixels.
        assert_eq!((*w, *h, *bpp), (112, 88, 4), "RGBA at the latent's size");
        assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    }
    assert_ne!(images[0].3, images[1].3, "frames differ");
    assert_eq!(saved_images(&env, &wf, "17").iter().map(|i| i.3.clone()).collect::<Vec<_>>(), images.iter().map(|i| i.3.clone()).collect::<Vec<_>>(), "deterministic");
    assert_eq!(saved_images(&env, &with_input(&wf, "12", "layers", json!(1)), "17").len(), 2);
    let prompt = saved_images(&env, &with_input(&wf, "8", "text", json!("a (blue:1.2) bird")), "17");
    assert_ne!(prompt[0].3, images[0].3, "the prompt matters");
    // Without the reference the model sees no image.
    let mut unreferenced = wf.clone();
    unreferenced.set_input("14", "positive", link("8", 0)).unwrap();
    unreferenced.set_input("14", "negative", link("9", 0)).unwrap();
    assert_ne!(saved_images(&env, &unreferenced, "17")[0].3, images[0].3, "the reference matters");
}

#[test]
fn layered_latents_are_named_where_they_do_not_fit() {
    let env = env();
    let wf = with_input(&env.workflow("qwen_image_layered.json", 32, 1), "5", "megapixels", json!(0.01));
    // Frames decoded without cutting them into a batch: the Wan VAE reads them as a
    // video's latent frames, as ComfyUI's VAEDecode does (4 latent frames: 13 frames).
    let mut uncut = wf.clone();
    uncut.set_input("16", "samples", link("14", 0)).unwrap();
    let opts = sdflow_executor::RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(&uncut, &sdflow_executor::NullSink, &sdflow_executor::CancelToken::new(), &opts).unwrap();
    assert_eq!(report.ui_outputs["17"]["images"].as_array().unwrap().len(), 13);
    // A plain Qwen-Image model given the layered latent.
    let e = env.run_err(&with_input(&wf, "1", "unet_name", json!("qwen_image_bf16.safetensors")));
    assert!(e.contains("only Qwen-Image-Layered"), "{e}");
    // A FLUX model given frames.
    let mut flux = with_input(&wf, "1", "unet_name", json!("flux1-dev.safetensors"));
    flux.set_input("14", "model", link("1", 0)).unwrap();
    let e = env.run_err(&flux);
    assert!(e.contains("frames"), "{e}");
}
