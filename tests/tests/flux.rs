//! FLUX.1 end to end on tiny random-weight files in the layouts people download (the
//! transformer alone in BFL's names, T5-XXL and CLIP-L alone, the 16-channel ae): the
//! committed workflows, ComfyUI's FLUX nodes, GGUF files, and bad input.

use sdflow_core::dtype::DType;
use sdflow_executor::Workflow;
use sdflow_tests::{with_input, write_flux_models, TestEnv};

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let input = sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_test_png(&input.join("input.png"), 72, 56);
    sdflow_tests::write_mask_png(&input.join("mask.png"), 72, 56, |x, y| (20..52).contains(&x) && (16..40).contains(&y));
    write_flux_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> sdflow_executor::InputValue {
    sdflow_executor::InputValue::Link { node: node.into(), output }
}

fn dev(env: &TestEnv) -> Workflow {
    env.workflow("flux_dev_txt2img.json", 64, 2)
}

#[test]
fn dev_and_schnell_workflows_run() {
    let env = env();
    let (w, h, px) = env.run_saved(&dev(&env), "10");
    assert_eq!((w, h), (64, 64));
    let spread = px.iter().max().unwrap() - px.iter().min().unwrap();
    assert!(spread > 10, "the image is not flat");
    let (w, h, _) = env.run_saved(&env.workflow("flux_schnell.json", 48, 2), "9");
    assert_eq!((w, h), (48, 48));
}

#[test]
fn guidance_seed_and_shift_change_the_image_and_runs_repeat() {
    let env = env();
    let wf = dev(&env);
    let base = env.run_saved_hash(&wf, "10");
    assert_eq!(env.run_saved_hash(&wf, "10"), base, "the same graph gives the same image");
    assert_ne!(env.run_saved_hash(&with_input(&wf, "5", "guidance", serde_json::json!(1.0)), "10"), base);
    assert_ne!(env.run_saved_hash(&with_input(&wf, "8", "seed", serde_json::json!(43)), "10"), base);
    // CLIPTextEncodeFlux with the same prompt for both encoders and guidance 3.5 is the
    // CLIPTextEncode → FluxGuidance pair.
    let mut flux_encode = wf.clone();
    let text = "a lovely cat holding a sign that says \"hello\", (watercolor:1.2)";
    flux_encode.set_input("5", "guidance", sdflow_executor::InputValue::Const(serde_json::json!(3.5))).unwrap();
    let mut spec = sdflow_executor::NodeSpec::new("CLIPTextEncodeFlux");
    spec.inputs.insert("clip".into(), link("2", 0));
    spec.inputs.insert("clip_l".into(), sdflow_executor::InputValue::Const(serde_json::json!(text)));
    spec.inputs.insert("t5xxl".into(), sdflow_executor::InputValue::Const(serde_json::json!(text)));
    spec.inputs.insert("guidance".into(), sdflow_executor::InputValue::Const(serde_json::json!(3.5)));
    flux_encode.nodes.insert("11".into(), spec);
    flux_encode.set_input("8", "positive", link("11", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&flux_encode, "10"), base);
    // ModelSamplingFlux at 1024² is the dev default (μ 1.15); at 256² it shifts less.
    let mut shifted = wf.clone();
    let mut ms = sdflow_executor::NodeSpec::new("ModelSamplingFlux");
    ms.inputs.insert("model".into(), link("1", 0));
    for (k, v) in [("max_shift", 1.15), ("base_shift", 0.5), ("width", 1024.0), ("height", 1024.0)] {
        let v = if k.ends_with("shift") { serde_json::json!(v) } else { serde_json::json!(v as i64) };
        ms.inputs.insert(k.into(), sdflow_executor::InputValue::Const(v));
    }
    shifted.nodes.insert("12".into(), ms);
    shifted.set_input("8", "model", link("12", 0)).unwrap();
    assert_eq!(env.run_saved_hash(&shifted, "10"), base);
    let small = with_input(&with_input(&shifted, "12", "width", serde_json::json!(256)), "12", "height", serde_json::json!(256));
    assert_ne!(env.run_saved_hash(&small, "10"), base);
    // A 4-channel empty latent serves FLUX too (ComfyUI grows empty latents to 16 channels).
    let mut four = wf.clone();
    let mut empty = sdflow_executor::NodeSpec::new("EmptyLatentImage");
    for (k, v) in [("width", 64), ("height", 64), ("batch_size", 1)] {
        empty.inputs.insert(k.into(), sdflow_executor::InputValue::Const(serde_json::json!(v)));
    }
    four.nodes.insert("7".into(), empty);
    assert_eq!(env.run_saved_hash(&four, "10"), base);
}

/// `file` of `dir` rewritten as a GGUF of `dtype` (names kept, or renamed by `rename`).
fn to_gguf(env: &TestEnv, dir: &str, file: &str, out: &str, dtype: DType, rename: &dyn Fn(&str) -> String) {
    let d = env.dir.path().join("models").join(dir);
    let src = sdflow_core::io::open(&d.join(file)).unwrap();
    let mut data = Vec::new();
    for t in src.tensors() {
        let bytes = src.read(&t.name).unwrap().into_owned();
        let target = if t.shape.len() >= 2 && t.shape[t.shape.len() - 1] % 32 == 0 { dtype } else { DType::F32 };
        let bytes = sdflow_core::dtype::convert(t.dtype, &bytes, &t.shape, target).unwrap();
        data.push((rename(&t.name), target, t.shape.clone(), bytes));
    }
    sdflow_core::io::gguf::write(&d.join(out), &[], data.iter().map(|(n, t, s, b)| (n.as_str(), *t, s.clone(), b.as_slice()))).unwrap();
}

/// llama.cpp's name of a Hugging Face T5 encoder tensor.
fn llama_cpp_t5(hf: &str) -> String {
    sdflow_core::models::t5::gguf_name(hf).unwrap_or_else(|| panic!("{hf}"))
}

#[test]
fn gguf_files_load_and_quantized_weights_stay_close() {
    let env = env();
    let wf = dev(&env);
    let base = env.run_saved(&wf, "10").2;
    to_gguf(&env, "diffusion_models", "flux1-dev.safetensors", "flux1-dev-f32.gguf", DType::F32, &|n| n.to_string());
    to_gguf(&env, "diffusion_models", "flux1-dev.safetensors", "flux1-dev-Q8_0.gguf", DType::Q8_0, &|n| n.to_string());
    to_gguf(&env, "text_encoders", "t5xxl_fp16.safetensors", "t5-v1_1-xxl-encoder-f32.gguf", DType::F32, &llama_cpp_t5);
    to_gguf(&env, "text_encoders", "t5xxl_fp16.safetensors", "t5-v1_1-xxl-encoder-Q8_0.gguf", DType::Q8_0, &llama_cpp_t5);
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let gguf = with_input(&with_input(&wf, "1", "unet_name", serde_json::json!("flux1-dev-f32.gguf")), "2", "clip_name1", serde_json::json!("t5-v1_1-xxl-encoder-f32.gguf"));
    assert_eq!(env.run_saved(&gguf, "10").2, base, "f32 GGUF files in llama.cpp/city96 names give the same image");
    let q8 = with_input(&wf, "1", "unet_name", serde_json::json!("flux1-dev-Q8_0.gguf"));
    let px = env.run_saved(&q8, "10").2;
    let diff = px.iter().zip(&base).map(|(a, b)| (*a as i32 - *b as i32).abs()).max().unwrap();
    assert!(diff > 0 && diff < 40, "q8_0 weights compute quantized, close to f32: max pixel difference {diff}");
    // A quantized T5 (city96's Q8_0 layout: matrices and the token table quantized).
    let t5_q8 = with_input(&wf, "2", "clip_name1", serde_json::json!("t5-v1_1-xxl-encoder-Q8_0.gguf"));
    let px = env.run_saved(&t5_q8, "10").2;
    let diff = px.iter().zip(&base).map(|(a, b)| (*a as i32 - *b as i32).abs()).max().unwrap();
    assert!(diff > 0 && diff < 40, "a Q8_0 T5 stays close to f32: max pixel difference {diff}");
    // A LoRA on the Q8_0 model (`auto`: added at run time, the weights stay quantized,
    // q/k/v rows split as diffusers names them) lands close to the LoRA on f32 weights.
    let lora = env.dir.path().join("models/loras/flux_diffusers.safetensors");
    sdflow_tests::write_flux_lora(&lora, "diffusers");
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let with_lora = |w: &Workflow| {
        let mut w = w.clone();
        w.nodes.insert("20".into(), sdflow_executor::NodeSpec::new("LoraLoaderModelOnly").with_input("model", link("1", 0)).with_input("lora_name", sdflow_executor::InputValue::Const(serde_json::json!("flux_diffusers.safetensors"))).with_input("strength_model", sdflow_executor::InputValue::Const(serde_json::json!(1.0))));
        w.set_input("8", "model", link("20", 0)).unwrap();
        env.run_saved(&w, "10").2
    };
    let (f32_lora, q8_lora) = (with_lora(&wf), with_lora(&q8));
    assert_ne!(f32_lora, base);
    let diff = q8_lora.iter().zip(&f32_lora).map(|(a, b)| (*a as i32 - *b as i32).abs()).max().unwrap();
    assert!(diff > 0 && diff < 40, "a LoRA on Q8_0 weights stays close to the LoRA on f32: max pixel difference {diff}");
}

#[test]
fn bad_combinations_are_named_errors() {
    let env = env();
    let wf = dev(&env);
    // Two CLIPs for FLUX.
    let e = env.run_err(&with_input(&wf, "2", "clip_name1", serde_json::json!("clip_l.safetensors")));
    assert!(e.contains("both CLIP text encoders") && e.contains("T5-XXL"), "{e}");
    // SD's 4-channel VAE on FLUX's 16-channel latents.
    std::fs::copy(env.dir.path().join("models/checkpoints/model.safetensors"), env.dir.path().join("models/vae/sd_vae.safetensors")).unwrap();
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let e = env.run_err(&with_input(&wf, "3", "vae_name", serde_json::json!("sd_vae.safetensors")));
    assert!(e.contains("a latent of 16 channels for a VAE of 4"), "{e}");
    // An SD checkpoint in the diffusion-model loader.
    std::fs::copy(env.dir.path().join("models/checkpoints/model.safetensors"), env.dir.path().join("models/diffusion_models/sd15.safetensors")).unwrap();
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let e = env.run_err(&with_input(&wf, "1", "unet_name", serde_json::json!("sd15.safetensors")));
    assert!(e.contains("sd15.safetensors") && e.contains("CheckpointLoaderSimple"), "{e}");
    // SD conditioning (CLIP-L's 32-wide tokens) on FLUX.
    let mut sd_text = wf.clone();
    let mut loader = sdflow_executor::NodeSpec::new("CheckpointLoaderSimple");
    loader.inputs.insert("ckpt_name".into(), sdflow_executor::InputValue::Const(serde_json::json!("model.safetensors")));
    sd_text.nodes.insert("20".into(), loader);
    sd_text.set_input("4", "clip", link("20", 1)).unwrap();
    let e = env.run_err(&sd_text);
    assert!(e.contains("T5-XXL"), "{e}");
    // ModelSamplingDiscrete cannot turn FLUX into an eps model.
    let mut eps = wf.clone();
    let mut ms = sdflow_executor::NodeSpec::new("ModelSamplingDiscrete");
    ms.inputs.insert("model".into(), link("1", 0));
    ms.inputs.insert("sampling".into(), sdflow_executor::InputValue::Const(serde_json::json!("eps")));
    ms.inputs.insert("zsnr".into(), sdflow_executor::InputValue::Const(serde_json::json!(false)));
    eps.nodes.insert("21".into(), ms);
    eps.set_input("8", "model", link("21", 0)).unwrap();
    let e = env.run_err(&eps);
    assert!(e.contains("ModelSamplingFlux"), "{e}");
}

fn template(env: &TestEnv, name: &str, size: i64, steps: i64) -> Workflow {
    env.comfyui_template(name, size, steps)
}

#[test]
fn comfyui_flux_templates_load_unchanged_and_run() {
    let env = env();
    for name in ["flux_schnell_full_text_to_image.json", "flux_schnell.json"] {
        let wf = template(&env, name, 32, 2);
        let save = sdflow_tests::node_of(&wf, "SaveImage");
        let (w, h, px) = env.run_saved(&wf, &save);
        assert_eq!((w, h), (32, 32), "{name}");
        assert!(px.iter().max().unwrap() > px.iter().min().unwrap(), "{name}");
    }
}

#[test]
fn an_all_in_one_file_without_its_parts_names_them() {
    let env = env();
    // The diffusion model alone in the checkpoint loader.
    let src = env.dir.path().join("models/diffusion_models/flux1-dev.safetensors");
    std::fs::copy(&src, env.dir.path().join("models/checkpoints/flux1-dev-alone.safetensors")).unwrap();
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let mut wf = template(&env, "flux_schnell.json", 32, 1);
    let loader = sdflow_tests::node_of(&wf, "CheckpointLoaderSimple");
    wf = with_input(&wf, &loader, "ckpt_name", serde_json::json!("flux1-dev-alone.safetensors"));
    let e = env.run_err(&wf);
    for part in ["CLIP-L", "--clip_l", "T5-XXL", "--t5xxl", "the VAE", "--vae", "UNETLoader"] {
        assert!(e.contains(part), "{part} in: {e}");
    }
}

#[test]
fn kontext_edits_at_kontexts_resolution_and_the_reference_matters() {
    let env = env();
    let wf = env.workflow("flux_kontext_edit.json", 64, 1);
    let t = std::time::Instant::now();
    let (w, h, px) = env.run_saved(&wf, "13");
    // input.png is 72×56 (1.29): FluxKontextImageScale picks 1184×880 (1.35), the nearest aspect.
    assert_eq!((w, h), (1184, 880), "{:.1} s", t.elapsed().as_secs_f64());
    // Without the reference latent (the same graph, ReferenceLatent bypassed) the image differs.
    let mut plain = wf.clone();
    plain.set_input("9", "conditioning", link("7", 0)).unwrap();
    assert_ne!(env.run_saved(&plain, "13").2, px);
    // FluxKontextMultiReferenceLatentMethod: `offset` is the default placement, `index`
    // another (one reference: index 1 either way, but it sits at the origin either way too,
    // so only `uxo`, which moves it past the image, changes the image).
    let method = |m: &str| {
        let mut w = wf.clone();
        w.nodes.insert("20".into(), sdflow_executor::NodeSpec::new("FluxKontextMultiReferenceLatentMethod").with_input("conditioning", link("9", 0)).with_input("reference_latents_method", sdflow_executor::InputValue::Const(serde_json::json!(m))));
        w.set_input("11", "positive", link("20", 0)).unwrap();
        env.run_saved(&w, "13").2
    };
    assert_eq!(method("offset"), px);
    assert_eq!(method("index"), px);
    assert_ne!(method("uxo/uno"), px);
}

#[test]
fn aura_flow_sampling_shifts_a_flow_model() {
    let env = env();
    let wf = env.workflow("flux_schnell.json", 48, 2);
    let base = env.run_saved_hash(&wf, "9");
    let aura = |shift: f64| {
        let mut w = wf.clone();
        let mut ms = sdflow_executor::NodeSpec::new("ModelSamplingAuraFlow");
        ms.inputs.insert("model".into(), link("1", 0));
        ms.inputs.insert("shift".into(), sdflow_executor::InputValue::Const(serde_json::json!(shift)));
        w.nodes.insert("20".into(), ms);
        w.set_input("7", "model", link("20", 0)).unwrap();
        w
    };
    // schnell samples unshifted: shift 1 is the same image, shift 3 another.
    assert_eq!(env.run_saved_hash(&aura(1.0), "9"), base);
    assert_ne!(env.run_saved_hash(&aura(3.0), "9"), base);
    // An eps UNet is no flow model.
    let mut sd = aura(3.0);
    let mut loader = sdflow_executor::NodeSpec::new("CheckpointLoaderSimple");
    loader.inputs.insert("ckpt_name".into(), sdflow_executor::InputValue::Const(serde_json::json!("model.safetensors")));
    sd.nodes.insert("21".into(), loader);
    sd.set_input("20", "model", link("21", 0)).unwrap();
    let e = env.run_err(&sd);
    assert!(e.contains("needs a flow model"), "{e}");
}

#[test]
fn fill_repaints_inside_the_mask_only() {
    let env = env();
    let wf = env.workflow("flux_fill_inpaint.json", 0, 2);
    let (w, h, _) = env.run_saved(&wf, "12");
    // The 72×56 input (its odd 9×7 latent padded to whole patches inside the model).
    assert_eq!((w, h), (72, 56));
    // The mask covers pixels x 20..52, y 16..40: latent cells x 2..7, y 2..5 (edges blended).
    let inside = |x: usize, y: usize| (2..7).contains(&x) && (2..5).contains(&y);
    let away = |x: usize, y: usize| !(1..8).contains(&x) || !(1..6).contains(&y);
    let compare = |a: &sdflow_nodes::values::Latent, b: &sdflow_nodes::values::Latent, region: &dyn Fn(usize, usize) -> bool| {
        let [lw, lh, ..] = a.shape.map(|d| d as usize);
        a.samples.iter().zip(&b.samples).enumerate().filter(|(i, _)| region(i % lw, (i / lw) % lh)).map(|(_, (p, q))| (p - q).abs()).fold(0f32, f32::max)
    };
    let base = env.run_latent(&wf, "10");
    assert_eq!(base.shape, [9, 7, 16, 1]);
    // Away from the mask the latent is the image's, whatever the prompt; inside it is not.
    let other = env.run_latent(&with_input(&wf, "6", "text", serde_json::json!("a blue bird")), "10");
    assert_eq!(compare(&base, &other, &away), 0.0, "the latent away from the mask stays");
    assert!(compare(&base, &other, &inside) > 1e-3, "the prompt changes the masked part");
    // noise_mask off resamples everything.
    let all = env.run_latent(&with_input(&wf, "9", "noise_mask", serde_json::json!(false)), "10");
    assert!(compare(&base, &all, &away) > 1e-3);
    // The Fill model without InpaintModelConditioning (ComfyUI: zeros for the image, the
    // noise mask for the mask) sees another input; a plain FLUX model ignores the extra one.
    let mut plain_cond = wf.clone();
    plain_cond.set_input("10", "positive", link("7", 0)).unwrap();
    plain_cond.set_input("10", "negative", link("8", 0)).unwrap();
    assert!(compare(&base, &env.run_latent(&plain_cond, "10"), &inside) > 1e-3);
    let dev = with_input(&wf, "1", "unet_name", serde_json::json!("flux1-dev.safetensors"));
    let mut dev_plain = dev.clone();
    dev_plain.set_input("10", "positive", link("7", 0)).unwrap();
    dev_plain.set_input("10", "negative", link("8", 0)).unwrap();
    // (The same noise mask either way: only the conditioning's extra input differs.)
    let with_concat = env.run_latent(&dev, "10");
    let inpaint_latent = env.run_latent(&dev_plain, "10");
    assert_eq!(with_concat.samples, inpaint_latent.samples);
}

#[test]
fn flux_loras_in_every_naming_patch_the_same_weights() {
    let env = env();
    let loras = env.dir.path().join("models/loras");
    std::fs::create_dir_all(&loras).unwrap();
    for naming in ["diffusers", "comfyui"] {
        sdflow_tests::write_flux_lora(&loras.join(format!("flux_{naming}.safetensors")), naming);
    }
    // An SD1 LoRA: nothing in it is FLUX's.
    let ckpt = sdflow_core::io::open(&env.dir.path().join("models/checkpoints/model.safetensors")).unwrap();
    sdflow_core::lora::synth::write_random_lora(ckpt.as_ref(), &loras.join("sd1.safetensors"), 2, 0.1, 1, sdflow_core::synth::Format::Safetensors).unwrap();
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let wf = env.workflow("flux_lora.json", 48, 2);
    let plain = {
        let mut w = wf.clone();
        let model = sdflow_tests::node_of(&wf, "UNETLoader");
        let sampler = sdflow_tests::node_of(&wf, "KSampler");
        w.set_input(&sampler, "model", link(&model, 0)).unwrap();
        env.run_saved_hash(&w, "10")
    };
    let lora = sdflow_tests::node_of(&wf, "LoraLoaderModelOnly");
    let with = |name: &str, extra: &[(&str, serde_json::Value)]| {
        let mut w = with_input(&wf, &lora, "lora_name", serde_json::json!(name));
        for (k, v) in extra {
            w = with_input(&w, &lora, k, v.clone());
        }
        env.run_saved_hash(&w, "10")
    };
    let kohya = with("flux_kohya.safetensors", &[]);
    assert_ne!(kohya, plain, "the LoRA changes the image");
    assert_eq!(with("flux_diffusers.safetensors", &[]), kohya, "diffusers' split q/k/v patch the same rows");
    assert_eq!(with("flux_comfyui.safetensors", &[]), kohya);
    assert_eq!(with("flux_kohya.safetensors", &[("strength_model", serde_json::json!(0.0))]), plain);
    // Merged into the weights or added at run time: the same image (up to rounding).
    let merged = with("flux_kohya.safetensors", &[("apply_mode", serde_json::json!("immediately"))]);
    let runtime = with("flux_kohya.safetensors", &[("apply_mode", serde_json::json!("at_runtime"))]);
    assert_ne!(merged, plain);
    assert_ne!(runtime, plain);
    // A LoRA for another family is a named error.
    let e = env.run_err(&with_input(&wf, &lora, "lora_name", serde_json::json!("sd1.safetensors")));
    assert!(e.contains("sd1.safetensors") && e.contains("another model family"), "{e}");
}

#[test]
fn skip_layer_guidance_runs_on_flux() {
    let env = env();
    let wf = dev(&env);
    let wf = with_input(&wf, "8", "steps", serde_json::json!(3));
    let base = env.run_saved_hash(&wf, "10");
    let slg = |double: &str, single: &str, scale: f64, rescale: f64| {
        let mut w = wf.clone();
        let spec = sdflow_executor::NodeSpec::new("SkipLayerGuidanceDiT")
            .with_input("model", link("1", 0))
            .with_input("double_layers", sdflow_executor::InputValue::Const(serde_json::json!(double)))
            .with_input("single_layers", sdflow_executor::InputValue::Const(serde_json::json!(single)))
            .with_input("scale", sdflow_executor::InputValue::Const(serde_json::json!(scale)))
            .with_input("start_percent", sdflow_executor::InputValue::Const(serde_json::json!(0.01)))
            .with_input("end_percent", sdflow_executor::InputValue::Const(serde_json::json!(0.9)))
            .with_input("rescaling_scale", sdflow_executor::InputValue::Const(serde_json::json!(rescale)));
        w.nodes.insert("20".into(), spec);
        w.set_input("8", "model", link("20", 0)).unwrap();
        env.run_saved_hash(&w, "10")
    };
    // The tiny model has double block 0 and single block 0: the defaults 7, 8, 9 leave out
    // nothing, so the guidance adds nothing; block 0 of either kind does, scale 0 not.
    assert_eq!(slg("7, 8, 9", "7, 8, 9", 3.0, 0.0), base);
    let double = slg("0", "", 3.0, 0.0);
    let single = slg("", "0", 3.0, 0.0);
    assert_ne!(double, base);
    assert_ne!(single, base);
    assert_ne!(double, single);
    assert_eq!(slg("0", "0", 0.0, 0.0), base);
    assert_ne!(slg("0", "", 3.0, 0.7), double, "rescaling pulls the result back");
    // An SD UNet has no blocks to skip.
    let mut sd = wf.clone();
    sd.nodes.insert("21".into(), sdflow_executor::NodeSpec::new("CheckpointLoaderSimple").with_input("ckpt_name", sdflow_executor::InputValue::Const(serde_json::json!("model.safetensors"))));
    sd.nodes.insert("20".into(), sdflow_executor::NodeSpec::new("SkipLayerGuidanceDiT").with_input("model", link("21", 0)).with_input("double_layers", sdflow_executor::InputValue::Const(serde_json::json!("1"))).with_input("single_layers", sdflow_executor::InputValue::Const(serde_json::json!(""))).with_input("scale", sdflow_executor::InputValue::Const(serde_json::json!(3.0))).with_input("start_percent", sdflow_executor::InputValue::Const(serde_json::json!(0.0))).with_input("end_percent", sdflow_executor::InputValue::Const(serde_json::json!(1.0))).with_input("rescaling_scale", sdflow_executor::InputValue::Const(serde_json::json!(0.0))));
    sd.set_input("8", "model", link("20", 0)).unwrap();
    let e = env.run_err(&sd);
    assert!(e.contains("SkipLayerGuidanceDiT") && e.contains("SD1"), "{e}");
}

/// A FLUX.1 dev in diffusers' names (its tensors split and renamed from the BFL file)
/// loads through UNETLoader and makes the same image as the BFL file.
#[test]
fn a_diffusers_named_transformer_runs_as_its_bfl_twin() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_flux_models(dir.path());
    let models = dir.path().join("models/diffusion_models");
    let hidden = sdflow_core::io::open(&models.join("flux1-dev.safetensors")).unwrap().get("img_in.weight").unwrap().shape[0];
    sdflow_tests::write_diffusers_twin(&models.join("flux1-dev.safetensors"), &models.join("flux1-dev-diffusers.safetensors"), &sdflow_core::models::flux::diffusers::LAYOUT, hidden);
    let twin_src = sdflow_core::io::open(&models.join("flux1-dev-diffusers.safetensors")).unwrap();
    assert!(twin_src.get(sdflow_core::models::flux::diffusers::DIFFUSERS_MARKER).is_some() && !twin_src.tensors().iter().any(|t| t.name.starts_with("double_blocks.")));
    drop(twin_src);
    let env = TestEnv::with_dir(dir, |rt| rt);
    let wf = dev(&env);
    let (_, _, bfl) = env.run_saved(&wf, "10");
    let mut twin = wf.clone();
    twin.set_input("1", "unet_name", sdflow_executor::InputValue::Const(serde_json::json!("flux1-dev-diffusers.safetensors"))).unwrap();
    let (_, _, diffusers) = env.run_saved(&twin, "10");
    assert_eq!(bfl, diffusers);
}

/// A FLUX.1 diffusers pipeline folder (`FluxPipeline`: transformer/, vae/, text_encoder/,
/// text_encoder_2/) made from ComfyUI's all-in-one file loads through
/// CheckpointLoaderSimple and makes exactly that file's image.
#[test]
fn a_pipeline_folder_runs_as_its_all_in_one_twin() {
    let env = env();
    let ckpts = env.dir.path().join("models/checkpoints");
    let ckpt = ckpts.join("flux1-schnell-fp8.safetensors");
    let hidden = sdflow_core::io::open(&ckpt).unwrap().get("model.diffusion_model.img_in.weight").unwrap().shape[0];
    sdflow_tests::write_dit_pipeline_folder(&ckpt, &ckpts.join("FLUX.1-schnell"), &sdflow_core::models::flux::diffusers::LAYOUT, hidden, "FluxPipeline");
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let wf = template(&env, "flux_schnell.json", 32, 2);
    let (loader, save) = (sdflow_tests::node_of(&wf, "CheckpointLoaderSimple"), sdflow_tests::node_of(&wf, "SaveImage"));
    let (_, _, single) = env.run_saved(&wf, &save);
    let (_, _, folder) = env.run_saved(&with_input(&wf, &loader, "ckpt_name", serde_json::json!("FLUX.1-schnell")), &save);
    assert_eq!(single, folder);
    // Without its T5 the folder names what is missing, as the single file does.
    std::fs::remove_dir_all(ckpts.join("FLUX.1-schnell/text_encoder_2")).unwrap();
    let e = env.run_err(&with_input(&wf, &loader, "ckpt_name", serde_json::json!("FLUX.1-schnell")));
    assert!(e.contains("FLUX.1-schnell") && e.contains("T5-XXL") && e.contains("--t5xxl"), "{e}");
    // A transformer of another architecture.
    let transformer = ckpts.join("FLUX.1-schnell/transformer/diffusion_pytorch_model.safetensors");
    sdflow_core::io::safetensors::write(&transformer, [("mystery.weight", DType::F32, vec![1], &[0u8; 4][..])], &Default::default()).unwrap();
    let e = env.run_err(&with_input(&wf, &loader, "ckpt_name", serde_json::json!("FLUX.1-schnell")));
    assert!(e.contains("FLUX.1-schnell") && e.contains("neither a FLUX.1 nor an SD3 transformer"), "{e}");
}
