//! Every workflow in `workflows/` validates against the node catalogue and runs on a
//! tiny random-weight SD1 checkpoint with the real architecture and key layout.

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{stub, CancelToken, Executor, ExecutorConfig, InputValue, NodeSpec, NullSink, Registry, RunOptions, Workflow};
use sdflow_nodes::Runtime;
use sdflow_tests::{controlnet_apply, node_of, read_png, write_mask_png, write_test_png};
use std::sync::Arc;

struct Env {
    _dir: tempfile::TempDir,
    out: std::path::PathBuf,
    exec: Executor,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    let ckpts = dir.path().join("models/checkpoints");
    // A 9-channel inpainting UNet (mask and masked-image latent as extra input).
    let mut inpaint = SdConfig::tiny_sd1_f8();
    inpaint.unet.in_channels = 9;
    write_checkpoint(&ckpts.join("inpaint.safetensors"), &inpaint, DType::F32, 8, Format::Safetensors).unwrap();
    // SD2's structure: OpenCLIP text encoder, linear transformer projections.
    let mut sd2 = SdConfig::tiny_sd2();
    sd2.vae.ch_mult = vec![1, 1, 2, 2];
    write_checkpoint(&ckpts.join("sd2.safetensors"), &sd2, DType::F16, 9, Format::Safetensors).unwrap();
    // SDXL's structure: two text encoders, ADM size conditioning, per-level depths.
    write_checkpoint(&ckpts.join("sdxl.safetensors"), &SdConfig::tiny_sdxl(), DType::F32, 10, Format::Safetensors).unwrap();
    // The same weights marked as CosXL (EDM v-prediction over σ 0.002..120).
    let mut sdxl_inpaint = SdConfig::tiny_sdxl();
    sdxl_inpaint.unet.in_channels = 9;
    write_checkpoint(&ckpts.join("sdxl_inpaint.safetensors"), &sdxl_inpaint, DType::F32, 11, Format::Safetensors).unwrap();
    let cosxl = SdConfig { edm_vpred: Some((0.002, 120.0)), ..SdConfig::tiny_sdxl() };
    write_checkpoint(&ckpts.join("cosxl.safetensors"), &cosxl, DType::F32, 10, Format::Safetensors).unwrap();
    // workflows/upscale.json's model (a tiny RRDBNet; tests/tests/upscale.rs runs it).
    let upscalers = dir.path().join("models/upscale_models");
    std::fs::create_dir_all(&upscalers).unwrap();
    let rrdb = sdflow_core::models::esrgan::RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_grow: 4, num_blocks: 1, num_upsample: 2, unshuffle: 1 };
    sdflow_core::models::esrgan::write_random(&upscalers.join("RealESRGAN_x4plus.safetensors"), &sdflow_core::models::esrgan::Arch::Rrdb(rrdb), 3).unwrap();
    // workflows/lora.json's LoRA (tests/tests/lora.rs runs it).
    let loras = dir.path().join("models/loras");
    std::fs::create_dir_all(&loras).unwrap();
    let ckpt = sdflow_core::io::open(&ckpts.join("model.safetensors")).unwrap();
    sdflow_core::lora::synth::write_random_lora(ckpt.as_ref(), &loras.join("ink.safetensors"), 4, 0.3, 5, Format::Safetensors).unwrap();
    // workflows/controlnet.json's ControlNet and a second one to stack, for the tiny
    // checkpoint's UNet; one for a wider UNet, which must not fit.
    let controlnets = dir.path().join("models/controlnet");
    std::fs::create_dir_all(&controlnets).unwrap();
    let unet = SdConfig::tiny_sd1_f8().unet;
    sdflow_core::synth::write_controlnet(&controlnets.join("control_v11p_sd15_canny.safetensors"), &unet, 3, 11).unwrap();
    sdflow_core::synth::write_controlnet(&controlnets.join("control_v11f1p_sd15_depth.safetensors"), &unet, 3, 12).unwrap();
    let wide = sdflow_core::synth::UnetConfig { model_channels: 64, ..unet };
    sdflow_core::synth::write_controlnet(&controlnets.join("wide.safetensors"), &wide, 3, 13).unwrap();
    // An SDXL ControlNet (with label_emb) for the tiny SDXL checkpoint.
    sdflow_core::synth::write_controlnet(&controlnets.join("sdxl_canny.safetensors"), &SdConfig::tiny_sdxl().unet, 3, 14).unwrap();
    std::fs::write(controlnets.join("junk.safetensors"), b"\x10\0\0\0\0\0\0\0{not json}").unwrap();
    // workflows/adetailer.json's detector, for validation only (which checks that the file
    // is listed): tests/tests/adetailer.rs runs that workflow with real detector weights.
    let detectors = dir.path().join("models/ultralytics");
    std::fs::create_dir_all(&detectors).unwrap();
    std::fs::write(detectors.join("face_yolov8n.pt"), b"validation only: never loaded").unwrap();
    // workflows/ip_adapter.json's CLIP vision and IP-Adapter (tests/tests/ip_adapter.rs runs it).
    sdflow_tests::write_ip_adapter_models(dir.path());
    // workflows/photomaker.json's files (tests/tests/photomaker.rs runs it).
    sdflow_tests::write_photomaker_models(dir.path());
    let out = dir.path().join("output");
    let input = dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    write_test_png(&input.join("input.png"), 72, 56);
    write_mask_png(&input.join("mask.png"), 72, 56, |x, _| x >= 36);
    write_mask_png(&input.join("empty_mask.png"), 72, 56, |_, _| false);
    write_test_png(&input.join("control.png"), 80, 64);
    // Standalone text encoders taken out of the checkpoints (CLIPLoader, DualCLIPLoader).
    let encoders = dir.path().join("models/text_encoders");
    extract(&ckpts.join("sdxl.safetensors"), "conditioner.embedders.0.transformer.", "", &encoders.join("clip_l.safetensors"));
    extract(&ckpts.join("sdxl.safetensors"), "conditioner.embedders.1.model.", "", &encoders.join("clip_g.safetensors"));
    extract(&ckpts.join("model.safetensors"), "cond_stage_model.transformer.", "", &encoders.join("sd1_clip.safetensors"));
    // The FLUX, SD3 and Z-Image workflows' files (tests/tests/flux.rs, sd3.rs and z_image.rs
    // run them).
    sdflow_tests::write_sd3_models(dir.path());
    sdflow_tests::write_z_image_models(dir.path());
    sdflow_tests::write_flux2_models(dir.path());
    sdflow_tests::write_qwen_image_models(dir.path());
    sdflow_tests::write_wan_models(dir.path());
    // workflows/animatediff.json's motion module and adapter (tests/tests/animatediff.rs runs it).
    sdflow_tests::write_animatediff_models(dir.path());
    let rt = Arc::new(Runtime::new(dir.path().join("models"), &out, 2, None).unwrap().with_input_dir(&input));
    let mut reg = Registry::new();
    stub::register(&mut reg);
    sdflow_nodes::register_all(&mut reg, rt);
    Env { exec: Executor::new(Arc::new(reg), ExecutorConfig::default()), out, _dir: dir }
}

/// Loads a committed workflow and shrinks it to test size.
fn load(env: &Env, name: &str, size: i64, steps: i64) -> Workflow {
    let text = std::fs::read_to_string(sdflow_tests::workflows_dir().join(name)).unwrap();
    let mut wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    assert!(wf.header.as_ref().and_then(|h| h.title.as_ref()).is_some(), "{name} has a title");
    for (id, node) in wf.nodes.clone() {
        match node.class_type.as_str() {
            "EmptyLatentImage" => {
                wf.set_input(&id, "width", InputValue::Const(serde_json::json!(size))).unwrap();
                wf.set_input(&id, "height", InputValue::Const(serde_json::json!(size))).unwrap();
            }
            "KSampler" => wf.set_input(&id, "steps", InputValue::Const(serde_json::json!(steps))).unwrap(),
            "LoadImage" => wf.set_input(&id, "image", InputValue::Const(serde_json::json!("input.png"))).unwrap(),
            _ => {}
        }
    }
    wf
}

#[test]
fn every_workflow_file_validates() {
    let env = env();
    let mut n = 0;
    for e in std::fs::read_dir(sdflow_tests::workflows_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let wf = Workflow::parse(&text, env.exec.registry()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if let Err(report) = env.exec.validate(&wf) {
            panic!("{} does not validate: {}", p.display(), serde_json::to_string_pretty(&report.to_json()).unwrap());
        }
        n += 1;
    }
    assert!(n >= 1);
}

#[test]
fn txt2img_runs_and_saves_an_image() {
    let env = env();
    let wf = load(&env, "txt2img.json", 64, 3);
    let report = env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).unwrap();
    let ui = &report.ui_outputs["7"]["images"][0];
    let path = env.out.join(ui["filename"].as_str().unwrap());
    let (w, h, px) = read_png(&path);
    assert_eq!((w, h), (64, 64));
    // Random weights give noise, but never a blank or constant image.
    let distinct: std::collections::HashSet<_> = px.iter().collect();
    assert!(distinct.len() > 16, "only {} distinct byte values", distinct.len());

    // Same workflow again: everything comes from the cache, the image is the same.
    let again = env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).unwrap();
    assert!(again.executed.is_empty(), "re-ran {:?}", again.executed_ids());

    // A new seed re-runs the sampler and what follows, not the loader or the encoders.
    let mut wf2 = wf.clone();
    wf2.set_input("5", "seed", InputValue::Const(serde_json::json!(43))).unwrap();
    let third = env.exec.run(&wf2, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).unwrap();
    let mut ran = third.executed_ids();
    ran.sort();
    assert_eq!(ran, vec!["5", "6", "7"]);
    let path2 = env.out.join(third.ui_outputs["7"]["images"][0]["filename"].as_str().unwrap());
    assert_ne!(read_png(&path2).2, px, "a different seed gives a different image");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let env = env();
    let mut wf = load(&env, "txt2img.json", 64, 2);
    wf.set_input("5", "sampler_name", InputValue::Const(serde_json::json!("no_such_sampler"))).unwrap();
    assert!(env.exec.validate(&wf).is_err(), "unknown sampler is a validation error");
    let mut wf = load(&env, "txt2img.json", 64, 2);
    wf.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("missing.safetensors"))).unwrap();
    assert!(env.exec.validate(&wf).is_err());
    let mut wf = load(&env, "txt2img.json", 16384, 2);
    wf.set_input("4", "batch_size", InputValue::Const(serde_json::json!(4096))).unwrap();
    let err = env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions::default()).err().expect("huge latent");
    assert!(err.to_string().contains("limit") || format!("{err:?}").contains("limit"), "{err}");
}

fn run_saved(env: &Env, wf: &Workflow, save_node: &str) -> (u32, u32, Vec<u8>) {
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    read_png(&env.out.join(report.ui_outputs[save_node]["images"][0]["filename"].as_str().unwrap()))
}

#[test]
fn img2img_runs_at_the_input_size_and_strength_matters() {
    let env = env();
    let wf = load(&env, "img2img.json", 64, 3);
    let (w, h, a) = run_saved(&env, &wf, "8");
    // 72x56 is already a multiple of 8: the output keeps the input's size.
    assert_eq!((w, h), (72, 56));
    let mut weaker = wf.clone();
    weaker.set_input("6", "denoise", InputValue::Const(serde_json::json!(0.3))).unwrap();
    let (_, _, b) = run_saved(&env, &weaker, "8");
    assert_ne!(a, b, "denoise changes the result");
}

#[test]
fn inpaint_keeps_what_the_mask_does_not_cover() {
    let env = env();
    check_inpaint(&env, load(&env, "inpaint.json", 64, 3));
}

#[test]
fn inpaint_with_a_9_channel_unet() {
    let env = env();
    let mut wf = load(&env, "inpaint.json", 64, 3);
    wf.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("inpaint.safetensors"))).unwrap();
    check_inpaint(&env, wf);
    // A 9-channel UNet cannot sample a plain latent without its extra inputs' shape.
    let mut txt = load(&env, "txt2img.json", 64, 2);
    txt.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("inpaint.safetensors"))).unwrap();
    env.exec.run(&txt, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).unwrap();
}

/// ComfyUI's InpaintModelConditioning on a 9-channel UNet: the mask and the greyed image
/// as the UNet's extra input, the image's latent with the mask as noise mask.
#[test]
fn inpaint_model_conditioning_with_a_9_channel_unet() {
    let env = env();
    let mut wf = load(&env, "inpaint.json", 64, 3);
    wf.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("inpaint.safetensors"))).unwrap();
    let cond = sdflow_executor::NodeSpec::new("InpaintModelConditioning")
        .with_input("positive", InputValue::link("2", 0))
        .with_input("negative", InputValue::link("3", 0))
        .with_input("vae", InputValue::link("1", 2))
        .with_input("pixels", InputValue::link("4", 0))
        .with_input("mask", InputValue::link("5", 0))
        .with_input("noise_mask", InputValue::Const(serde_json::json!(true)));
    wf.nodes.insert("20".into(), cond);
    // A plain encode of the image: what the empty-mask check decodes directly.
    wf.nodes.insert("6".into(), sdflow_executor::NodeSpec::new("VAEEncode").with_input("pixels", InputValue::link("4", 0)).with_input("vae", InputValue::link("1", 2)));
    for (input, out) in [("positive", 0), ("negative", 1), ("latent_image", 2)] {
        wf.set_input("7", input, InputValue::link("20", out)).unwrap();
    }
    let (masked, _) = check_inpaint(&env, wf.clone());
    // The UNet reads the extra input: without it (the latent alone, ComfyUI's own concat of
    // the noise mask and latent) the masked part comes out otherwise.
    let mut plain = wf.clone();
    plain.set_input("7", "positive", InputValue::link("2", 0)).unwrap();
    plain.set_input("7", "negative", InputValue::link("3", 0)).unwrap();
    let (_, _, other) = run_saved(&env, &plain, &node_of(&wf, "SaveImage"));
    assert_ne!(masked, other);
}

#[test]
fn inpaint_with_an_sdxl_inpainting_unet() {
    let env = env();
    let mut wf = load(&env, "inpaint.json", 64, 3);
    wf.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("sdxl_inpaint.safetensors"))).unwrap();
    check_inpaint(&env, wf);
}

/// Runs an inpainting workflow (its LoadImageMask, VAEEncode*, VAEDecode and SaveImage
/// found by class) and returns the masked run's pixels and the plain decode of the
/// encoded input.
fn check_inpaint(env: &Env, wf: Workflow) -> (Vec<u8>, Vec<u8>) {
    let (mask, decode, save) = (node_of(&wf, "LoadImageMask"), node_of(&wf, "VAEDecode"), node_of(&wf, "SaveImage"));
    let encode = wf.nodes.iter().find(|(_, n)| n.class_type.starts_with("VAEEncode")).map(|(id, _)| id.clone()).expect("a VAE encoder");
    let (w, h, masked) = run_saved(env, &wf, &save);
    assert_eq!((w, h), (72, 56));

    // An empty mask: sampling must hand back the encoded image unchanged, so decoding
    // it gives exactly what decoding the encoding directly gives.
    let mut empty = wf.clone();
    empty.set_input(&mask, "image", InputValue::Const(serde_json::json!("empty_mask.png"))).unwrap();
    let (_, _, kept) = run_saved(env, &empty, &save);
    let mut direct = empty.clone();
    direct.set_input(&decode, "samples", InputValue::link(&encode, 0)).unwrap();
    let (_, _, reference) = run_saved(env, &direct, &save);
    // Equal up to the rounding of the last Euler step (x + (x − d)/σ·(0 − σ) ≈ d).
    let worst = kept.iter().zip(&reference).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
    assert!(worst <= 1, "nothing masked, nothing changed (worst pixel difference {worst})");
    assert_ne!(masked, reference, "the masked half was re-sampled");
    (masked, reference)
}

/// Mean absolute difference of two 72x56 RGB images over columns `x0..x1`.
fn column_diff(a: &[u8], b: &[u8], x0: usize, x1: usize) -> f64 {
    let (w, h) = (72, 56);
    let mut sum = 0u64;
    for y in 0..h {
        for i in (y * w + x0) * 3..(y * w + x1) * 3 {
            sum += u64::from(a[i].abs_diff(b[i]));
        }
    }
    sum as f64 / ((x1 - x0) * h * 3) as f64
}

/// sd-cli's default --strength 0.75 with a mask: SetLatentNoiseMask holds the unmasked
/// latent at the image while the masked right half (x ≥ 36) is re-sampled from the
/// partly noised image.
#[test]
fn partial_inpaint_changes_only_the_masked_part() {
    let env = env();
    let wf = load(&env, "inpaint_partial.json", 64, 3);
    let (masked, reference) = check_inpaint(&env, wf.clone());
    let sampler = node_of(&wf, "KSampler");
    assert_eq!(wf.nodes[&sampler].inputs["denoise"], InputValue::Const(serde_json::json!(0.75)), "the file's point: sd-cli's default strength");
    // Another seed re-samples the masked side differently while the unmasked latent is
    // the image's in both runs. The decoder mixes latents across the picture, so the left
    // edge, far from the mask's border, still changes some, but far less.
    let save = node_of(&wf, "SaveImage");
    let mut reseeded = wf.clone();
    reseeded.set_input(&sampler, "seed", InputValue::Const(serde_json::json!(7))).unwrap();
    let (_, _, other) = run_saved(&env, &reseeded, &save);
    let (left, right) = (column_diff(&masked, &other, 0, 16), column_diff(&masked, &other, 48, 72));
    assert!(right > 2.0 * left, "masked side changed by {right:.2} per channel, unmasked side by {left:.2} (vs input: {:.2}, {:.2})", column_diff(&masked, &reference, 0, 16), column_diff(&masked, &reference, 48, 72));
    // The strength is honoured: full denoise gives another picture.
    let mut full = wf.clone();
    full.set_input(&sampler, "denoise", InputValue::Const(serde_json::json!(1.0))).unwrap();
    assert_ne!(run_saved(&env, &full, &save).2, masked, "denoise 1.0 and 0.75 differ");
}

/// Every committed workflow says what it is: a title and a description in its header.
#[test]
fn every_workflow_file_has_a_title_and_a_description() {
    let mut n = 0;
    for e in std::fs::read_dir(sdflow_tests::workflows_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for key in ["title", "description"] {
            let text = doc[key].as_str().unwrap_or("");
            assert!(!text.trim().is_empty(), "{} has no {key}", p.display());
        }
        n += 1;
    }
    assert!(n >= 10, "only {n} workflow files found");
}

#[test]
fn txt2img_on_an_sd2_checkpoint() {
    let env = env();
    let mut wf = load(&env, "txt2img.json", 64, 2);
    wf.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("sd2.safetensors"))).unwrap();
    let (w, h, px) = run_saved(&env, &wf, "7");
    assert_eq!((w, h), (64, 64));
    assert!(px.iter().collect::<std::collections::HashSet<_>>().len() > 16);
}

/// Custom sampling and KSamplerAdvanced give exactly KSampler's image for the same
/// sampler, schedule, seed and cfg; and a two-stage KSamplerAdvanced split (leftover noise
/// handed on, no new noise) equals one pass for a deterministic sampler.
#[test]
fn custom_and_advanced_samplers_agree_with_ksampler() {
    let env = env();
    let steps = 4;
    let mut base = load(&env, "txt2img.json", 64, steps);
    base.set_input("5", "sampler_name", InputValue::Const(serde_json::json!("euler"))).unwrap();
    let (_, _, reference) = run_saved(&env, &base, "7");
    let c = |v: serde_json::Value| InputValue::Const(v);

    let mut custom = base.clone();
    custom.nodes.remove("5");
    custom.nodes.insert("10".into(), NodeSpec::new("KSamplerSelect").with_input("sampler_name", c(serde_json::json!("euler"))));
    custom.nodes.insert(
        "11".into(),
        NodeSpec::new("BasicScheduler").with_input("model", InputValue::link("1", 0)).with_input("scheduler", c(serde_json::json!("normal"))).with_input("steps", c(serde_json::json!(steps))).with_input("denoise", c(serde_json::json!(1.0))),
    );
    custom.nodes.insert("12".into(), NodeSpec::new("RandomNoise").with_input("noise_seed", c(serde_json::json!(42))));
    custom.nodes.insert(
        "13".into(),
        NodeSpec::new("CFGGuider").with_input("model", InputValue::link("1", 0)).with_input("positive", InputValue::link("2", 0)).with_input("negative", InputValue::link("3", 0)).with_input("cfg", c(serde_json::json!(7.0))),
    );
    custom.nodes.insert(
        "14".into(),
        NodeSpec::new("SamplerCustomAdvanced")
            .with_input("noise", InputValue::link("12", 0))
            .with_input("guider", InputValue::link("13", 0))
            .with_input("sampler", InputValue::link("10", 0))
            .with_input("sigmas", InputValue::link("11", 0))
            .with_input("latent_image", InputValue::link("4", 0)),
    );
    custom.set_input("6", "samples", InputValue::link("14", 0)).unwrap();
    assert_eq!(run_saved(&env, &custom, "7").2, reference, "SamplerCustomAdvanced");

    let advanced = |start: i64, end: i64, noise: &str, leftover: &str, latent: InputValue| {
        NodeSpec::new("KSamplerAdvanced")
            .with_input("model", InputValue::link("1", 0))
            .with_input("add_noise", c(serde_json::json!(noise)))
            .with_input("noise_seed", c(serde_json::json!(42)))
            .with_input("steps", c(serde_json::json!(steps)))
            .with_input("cfg", c(serde_json::json!(7.0)))
            .with_input("sampler_name", c(serde_json::json!("euler")))
            .with_input("scheduler", c(serde_json::json!("normal")))
            .with_input("positive", InputValue::link("2", 0))
            .with_input("negative", InputValue::link("3", 0))
            .with_input("latent_image", latent)
            .with_input("start_at_step", c(serde_json::json!(start)))
            .with_input("end_at_step", c(serde_json::json!(end)))
            .with_input("return_with_leftover_noise", c(serde_json::json!(leftover)))
    };
    let mut one = base.clone();
    one.nodes.insert("5".into(), advanced(0, 10000, "enable", "disable", InputValue::link("4", 0)));
    assert_eq!(run_saved(&env, &one, "7").2, reference, "KSamplerAdvanced, all steps");

    let mut two = base.clone();
    two.nodes.insert("20".into(), advanced(0, 2, "enable", "enable", InputValue::link("4", 0)));
    two.nodes.insert("5".into(), advanced(2, 10000, "disable", "disable", InputValue::link("20", 0)));
    let (_, _, split) = run_saved(&env, &two, "7");
    let worst = split.iter().zip(&reference).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
    assert!(worst <= 1, "two-stage split differs by {worst}");
}

/// Saved PNGs carry the graph (ComfyUI's `prompt` and `workflow` chunks) and A1111's
/// `parameters`; the embedded prompt re-opens as the same workflow.
#[test]
fn saved_images_embed_the_workflow_and_parameters() {
    let env = env();
    let wf = load(&env, "txt2img.json", 64, 2);
    let opts = RunOptions { output_dir: Some(env.out.clone()), metadata: sdflow_workflows::metadata::png_metadata(&wf, env.exec.registry()), ..Default::default() };
    let report = env.exec.run(&wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    let path = env.out.join(report.ui_outputs["7"]["images"][0]["filename"].as_str().unwrap());
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
    let reader = dec.read_info().unwrap();
    let info = reader.info();
    let mut text: std::collections::BTreeMap<String, String> = info.uncompressed_latin1_text.iter().map(|t| (t.keyword.clone(), t.text.clone())).collect();
    for t in &info.utf8_text {
        text.insert(t.keyword.clone(), t.get_text().unwrap());
    }
    let prompt = Workflow::parse(&text["prompt"], env.exec.registry()).unwrap();
    assert_eq!(prompt.to_api_json(), wf.to_api_json());
    let ui = Workflow::parse(&text["workflow"], env.exec.registry()).unwrap();
    assert_eq!(ui.nodes.len(), wf.nodes.len());
    let params = &text["parameters"];
    assert!(params.starts_with("a lovely cat, (watercolor:1.2)\nNegative prompt: blurry, low quality\n"), "{params}");
    assert!(params.contains("Steps: 2, Sampler: Euler a, Schedule type: normal, CFG scale: 7.0, Seed: 42, Size: 64x64, Model: model"), "{params}");
}

/// The conditioning list nodes, each checked against an identity it must satisfy.
#[test]
fn conditioning_nodes() {
    let env = env();
    let mut base = load(&env, "txt2img.json", 64, 3);
    base.set_input("5", "sampler_name", InputValue::Const(serde_json::json!("euler"))).unwrap();
    let (_, _, reference) = run_saved(&env, &base, "7");
    let c = |v: serde_json::Value| InputValue::Const(v);
    let l = |n: &str| InputValue::link(n, 0);
    let close = |a: &[u8], b: &[u8]| a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0) <= 1;
    let with_positive = |extra: Vec<(&str, NodeSpec)>, positive: &str| {
        let mut wf = base.clone();
        for (id, n) in extra {
            wf.nodes.insert(id.to_string(), n);
        }
        wf.set_input("5", "positive", l(positive)).unwrap();
        wf
    };

    // A prompt combined with itself averages two equal predictions.
    let wf = with_positive(vec![("20", NodeSpec::new("ConditioningCombine").with_input("conditioning_1", l("2")).with_input("conditioning_2", l("2")))], "20");
    assert!(close(&run_saved(&env, &wf, "7").2, &reference), "combine with itself");

    // Split over the schedule at 0.5: at every step the same prompt guides.
    let range = |a: f64, b: f64| NodeSpec::new("ConditioningSetTimestepRange").with_input("conditioning", l("2")).with_input("start", c(serde_json::json!(a))).with_input("end", c(serde_json::json!(b)));
    let wf = with_positive(
        vec![("21", range(0.0, 0.5)), ("22", range(0.5, 1.0)), ("23", NodeSpec::new("ConditioningCombine").with_input("conditioning_1", l("21")).with_input("conditioning_2", l("22")))],
        "23",
    );
    assert!(close(&run_saved(&env, &wf, "7").2, &reference), "timestep ranges covering the schedule");

    // A range that leaves the end uncovered is an error, not a silent blank.
    let wf = with_positive(vec![("24", range(0.0, 0.3))], "24");
    assert!(env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).is_err());

    // Average at strength 1 is the `to` side.
    let avg = NodeSpec::new("ConditioningAverage").with_input("conditioning_to", l("2")).with_input("conditioning_from", l("3")).with_input("conditioning_to_strength", c(serde_json::json!(1.0)));
    let wf = with_positive(vec![("25", avg)], "25");
    assert_eq!(run_saved(&env, &wf, "7").2, reference, "average at strength 1");

    // Zeroed and concatenated prompts run and change the picture.
    let wf = with_positive(vec![("26", NodeSpec::new("ConditioningZeroOut").with_input("conditioning", l("2")))], "26");
    assert_ne!(run_saved(&env, &wf, "7").2, reference, "zeroed prompt");
    let wf = with_positive(vec![("27", NodeSpec::new("ConditioningConcat").with_input("conditioning_to", l("2")).with_input("conditioning_from", l("3")))], "27");
    assert_ne!(run_saved(&env, &wf, "7").2, reference, "154-token prompt");
}

#[test]
fn hires_fix_samples_again_at_the_upscaled_size() {
    let env = env();
    let wf = load(&env, "hires_fix.json", 64, 2);
    let (w, h, _) = run_saved(&env, &wf, "9");
    assert_eq!((w, h), (96, 96), "64 × 1.5");
    // An image-space resize of the result, through ImageScale with a centre crop.
    let mut scaled = wf.clone();
    scaled.nodes.insert(
        "20".into(),
        NodeSpec::new("ImageScale")
            .with_input("image", InputValue::link("8", 0))
            .with_input("upscale_method", InputValue::Const(serde_json::json!("area")))
            .with_input("width", InputValue::Const(serde_json::json!(40)))
            .with_input("height", InputValue::Const(serde_json::json!(30)))
            .with_input("crop", InputValue::Const(serde_json::json!("center"))),
    );
    scaled.set_input("9", "images", InputValue::link("20", 0)).unwrap();
    let (w, h, _) = run_saved(&env, &scaled, "9");
    assert_eq!((w, h), (40, 30));
}

/// sd-cli's `--hires` with each non-model upscaler, as the preset builds it: the image
/// filters (Lanczos through ImageScale) and torch's latent modes sd-webui names.
#[test]
fn hires_fix_runs_with_every_filter_upscaler() {
    let env = env();
    let mut seen = Vec::new();
    for upscaler in ["Lanczos", "Nearest", "Latent (nearest)", "Latent (antialiased)", "Latent (bicubic antialiased)"] {
        let mut p = sdflow_workflows::presets::ImgGenParams { model: Some("model.safetensors".into()), prompt: "a cat".into(), width: 64, height: 64, steps: 2, ..Default::default() };
        p.hires.enabled = true;
        p.hires.upscaler = upscaler.into();
        p.hires.scale = 1.5;
        let preset = sdflow_workflows::presets::img_gen(&p).unwrap_or_else(|e| panic!("{upscaler}: {e}"));
        if let Err(report) = env.exec.validate(&preset.workflow) {
            panic!("{upscaler}: {}", serde_json::to_string_pretty(&report.to_json()).unwrap());
        }
        let (w, h, px) = run_saved(&env, &preset.workflow, &preset.save_nodes[0]);
        assert_eq!((w, h), (96, 96), "{upscaler}: 64 × 1.5");
        seen.push(px);
    }
    // The Lanczos and nearest image resizes, and the three latent modes, differ.
    for i in 0..seen.len() {
        for j in i + 1..seen.len() {
            assert_ne!(seen[i], seen[j], "upscalers {i} and {j} gave the same image");
        }
    }
}

/// workflows/hires_fix_model.json: the base image goes through the upscale model (the
/// tiny RRDBNet, ×4), is resized to the hires size and sampled again.
#[test]
fn hires_fix_with_a_model_upscaler_runs() {
    let env = env();
    let mut wf = load(&env, "hires_fix_model.json", 64, 2);
    let (scale, save) = (node_of(&wf, "ImageScale"), node_of(&wf, "SaveImage"));
    // The preset's target is 2 × 512; at test size 2 × 64.
    for k in ["width", "height"] {
        wf.set_input(&scale, k, InputValue::Const(serde_json::json!(128))).unwrap();
    }
    let (w, h, with_model) = run_saved(&env, &wf, &save);
    assert_eq!((w, h), (128, 128));
    // Without the model (the decoded base image resized directly) the result differs:
    // the upscaler's output is what the hires pass starts from.
    let mut plain = wf.clone();
    let decoded = wf.nodes[&node_of(&wf, "ImageUpscaleWithModel")].inputs["image"].clone();
    assert!(matches!(decoded, InputValue::Link { .. }), "{decoded:?}");
    plain.set_input(&scale, "image", decoded).unwrap();
    plain.nodes.remove(&node_of(&wf, "ImageUpscaleWithModel"));
    plain.nodes.remove(&node_of(&wf, "UpscaleModelLoader"));
    let (_, _, without) = run_saved(&env, &plain, &save);
    assert_ne!(with_model, without);
}

/// The noise generator (sd.cpp's `--rng`) as a sampler input: absent is ComfyUI's CPU
/// noise; each other generator gives another image; KSampler and RandomNoise draw alike;
/// an unknown name is a validation error.
#[test]
fn noise_generators_are_chosen_per_sampler() {
    let env = env();
    let c = |v: serde_json::Value| InputValue::Const(v);
    let mut base = load(&env, "txt2img.json", 64, 2);
    base.set_input("5", "sampler_name", c(serde_json::json!("euler"))).unwrap();
    let with = |rng: &str| {
        let mut wf = base.clone();
        wf.set_input("5", "rng", c(serde_json::json!(rng))).unwrap();
        wf
    };
    let (_, _, default) = run_saved(&env, &base, "7");
    assert_eq!(run_saved(&env, &with("cpu"), "7").2, default, "no rng input is ComfyUI's cpu noise");
    let cuda = run_saved(&env, &with("cuda"), "7").2;
    let std_default = run_saved(&env, &with("std_default"), "7").2;
    let portable = run_saved(&env, &with("cpu_portable"), "7").2;
    for (name, img) in [("cuda", &cuda), ("std_default", &std_default), ("cpu_portable", &portable)] {
        assert_ne!(img, &default, "{name} draws other noise than cpu");
    }
    assert_ne!(cuda, std_default);
    assert_ne!(cuda, portable);

    // SamplerCustom draws its noise through the same generator as KSampler.
    let konst = |name: &str| match &base.nodes["5"].inputs[name] {
        InputValue::Const(v) => v.clone(),
        other => panic!("KSampler {name} is {other:?}"),
    };
    let mut custom = base.clone();
    custom.nodes.remove("5");
    custom.nodes.insert("10".into(), NodeSpec::new("KSamplerSelect").with_input("sampler_name", c(serde_json::json!("euler"))));
    custom.nodes.insert(
        "11".into(),
        NodeSpec::new("BasicScheduler").with_input("model", InputValue::link("1", 0)).with_input("scheduler", c(serde_json::json!("normal"))).with_input("steps", c(serde_json::json!(2))).with_input("denoise", c(serde_json::json!(1.0))),
    );
    custom.nodes.insert(
        "14".into(),
        NodeSpec::new("SamplerCustom")
            .with_input("model", InputValue::link("1", 0))
            .with_input("add_noise", c(serde_json::json!(true)))
            .with_input("noise_seed", c(konst("seed")))
            .with_input("cfg", c(konst("cfg")))
            .with_input("positive", InputValue::link("2", 0))
            .with_input("negative", InputValue::link("3", 0))
            .with_input("rng", c(serde_json::json!("cuda")))
            .with_input("sampler", InputValue::link("10", 0))
            .with_input("sigmas", InputValue::link("11", 0))
            .with_input("latent_image", InputValue::link("4", 0)),
    );
    custom.set_input("6", "samples", InputValue::link("14", 0)).unwrap();
    assert_eq!(run_saved(&env, &custom, "7").2, cuda, "SamplerCustom with rng cuda");

    let bad = with("mersenne");
    assert!(env.exec.validate(&bad).is_err(), "an unknown generator is a validation error");
}

fn run_err(env: &Env, wf: &Workflow) -> String {
    let e = env.exec.run(wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).expect_err("the run fails");
    format!("{e} {e:?}")
}

/// workflows/controlnet.json: the ControlNet changes the picture; at strength 0, or
/// outside its schedule range, it is as if it were not there.
#[test]
fn controlnet_guides_and_respects_strength_and_range() {
    let env = env();
    let wf = load(&env, "controlnet.json", 64, 3);
    let (apply, save, sampler) = (node_of(&wf, "ControlNetApplyAdvanced"), node_of(&wf, "SaveImage"), node_of(&wf, "KSampler"));
    let (w, h, controlled) = run_saved(&env, &wf, &save);
    assert_eq!((w, h), (64, 64));
    let mut plain = wf.clone();
    plain.set_input(&sampler, "positive", InputValue::link("2", 0)).unwrap();
    plain.set_input(&sampler, "negative", InputValue::link("3", 0)).unwrap();
    let (_, _, reference) = run_saved(&env, &plain, &save);
    assert_ne!(controlled, reference, "the ControlNet changes the image");
    let mut off = wf.clone();
    off.set_input(&apply, "strength", InputValue::Const(serde_json::json!(0.0))).unwrap();
    assert_eq!(run_saved(&env, &off, &save).2, reference, "strength 0");
    let mut never = wf.clone();
    never.set_input(&apply, "end_percent", InputValue::Const(serde_json::json!(0.0))).unwrap();
    assert_eq!(run_saved(&env, &never, &save).2, reference, "a range that covers no step");
    let mut late = wf.clone();
    late.set_input(&apply, "start_percent", InputValue::Const(serde_json::json!(0.5))).unwrap();
    let (_, _, half) = run_saved(&env, &late, &save);
    assert!(half != reference && half != controlled, "active for the second half only");

    // The old single-conditioning node on the prompt (and, as ComfyUI, the negative).
    let mut old = plain.clone();
    old.nodes.insert(
        "20".into(),
        NodeSpec::new("ControlNetApply").with_input("conditioning", InputValue::link("2", 0)).with_input("control_net", InputValue::link("8", 0)).with_input("image", InputValue::link("10", 0)).with_input("strength", InputValue::Const(serde_json::json!(0.9))),
    );
    old.set_input(&sampler, "positive", InputValue::link("20", 0)).unwrap();
    assert_eq!(run_saved(&env, &old, &save).2, controlled, "ControlNetApply = ControlNetApplyAdvanced on both over the whole schedule");
}

/// Two ControlNetApplyAdvanced in a chain: both residuals add up.
#[test]
fn stacked_controlnets_differ_from_one() {
    let env = env();
    let wf = load(&env, "controlnet.json", 64, 3);
    let (apply, save, sampler) = (node_of(&wf, "ControlNetApplyAdvanced"), node_of(&wf, "SaveImage"), node_of(&wf, "KSampler"));
    let (_, _, one) = run_saved(&env, &wf, &save);
    let mut two = wf.clone();
    two.nodes.insert("20".into(), NodeSpec::new("ControlNetLoader").with_input("control_net_name", InputValue::Const(serde_json::json!("control_v11f1p_sd15_depth.safetensors"))));
    let second = |strength: f64| controlnet_apply(InputValue::link(&apply, 0), InputValue::link(&apply, 1), "20", "9", strength);
    two.nodes.insert("21".into(), second(0.7));
    two.set_input(&sampler, "positive", InputValue::link("21", 0)).unwrap();
    two.set_input(&sampler, "negative", InputValue::link("21", 1)).unwrap();
    let (_, _, stacked) = run_saved(&env, &two, &save);
    assert_ne!(stacked, one, "a second ControlNet adds its residuals");
    let mut only_second = two.clone();
    only_second.set_input(&apply, "strength", InputValue::Const(serde_json::json!(0.0))).unwrap();
    let (_, _, second_alone) = run_saved(&env, &only_second, &save);
    assert!(second_alone != stacked && second_alone != one);
    // The same ControlNet file applied twice at half strength is it once at full
    // strength (the residuals scale linearly), up to rounding.
    let mut halves = wf.clone();
    halves.set_input(&apply, "strength", InputValue::Const(serde_json::json!(0.45))).unwrap();
    halves.nodes.insert("21".into(), second(0.45).with_input("control_net", InputValue::link("8", 0)).with_input("image", InputValue::link("10", 0)));
    halves.set_input(&sampler, "positive", InputValue::link("21", 0)).unwrap();
    halves.set_input(&sampler, "negative", InputValue::link("21", 1)).unwrap();
    let (_, _, twice) = run_saved(&env, &halves, &save);
    let worst = twice.iter().zip(&one).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
    assert!(worst <= 2, "two half-strength applications vs one: worst pixel difference {worst}");
}

/// Swapping the ControlNet re-runs its loader and what follows, never the checkpoint
/// loader: the base model's weights stay loaded.
#[test]
fn swapping_the_controlnet_keeps_the_base_model() {
    let env = env();
    let wf = load(&env, "controlnet.json", 64, 2);
    let (loader, cn_loader, save) = (node_of(&wf, "CheckpointLoaderSimple"), node_of(&wf, "ControlNetLoader"), node_of(&wf, "SaveImage"));
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let first = env.exec.run(&wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    assert!(first.executed_ids().contains(&loader.as_str()));
    let mut swapped = wf.clone();
    swapped.set_input(&cn_loader, "control_net_name", InputValue::Const(serde_json::json!("control_v11f1p_sd15_depth.safetensors"))).unwrap();
    let second = env.exec.run(&swapped, &NullSink, &CancelToken::new(), &opts).unwrap();
    let ran = second.executed_ids();
    assert!(ran.contains(&cn_loader.as_str()) && ran.contains(&save.as_str()), "{ran:?}");
    assert!(!ran.contains(&loader.as_str()), "the checkpoint loader re-ran: {ran:?}");
    let image = |r: &sdflow_executor::RunReport| read_png(&env.out.join(r.ui_outputs[&save]["images"][0]["filename"].as_str().unwrap())).2;
    assert_ne!(image(&first), image(&second), "the other ControlNet guides differently");
}

/// An area entry with a ControlNet: the hint is resized to the area (ComfyUI's
/// get_control on the area's crop of the latent).
#[test]
fn controlnet_with_an_area_runs() {
    let env = env();
    let wf = load(&env, "controlnet.json", 128, 2);
    let (save, sampler) = (node_of(&wf, "SaveImage"), node_of(&wf, "KSampler"));
    let (_, _, whole) = run_saved(&env, &wf, &save);
    let mut area = wf.clone();
    area.nodes.insert(
        "20".into(),
        NodeSpec::new("ConditioningSetArea")
            .with_input("conditioning", InputValue::link("11", 0))
            .with_input("width", InputValue::Const(serde_json::json!(64)))
            .with_input("height", InputValue::Const(serde_json::json!(72)))
            .with_input("x", InputValue::Const(serde_json::json!(32)))
            .with_input("y", InputValue::Const(serde_json::json!(8)))
            .with_input("strength", InputValue::Const(serde_json::json!(1.0))),
    );
    area.nodes.insert("21".into(), NodeSpec::new("ConditioningCombine").with_input("conditioning_1", InputValue::link("11", 0)).with_input("conditioning_2", InputValue::link("20", 0)));
    area.set_input(&sampler, "positive", InputValue::link("21", 0)).unwrap();
    let (_, _, with_area) = run_saved(&env, &area, &save);
    assert_ne!(with_area, whole);
}

#[test]
fn controlnet_errors_name_the_problem() {
    let env = env();
    let wf = load(&env, "controlnet.json", 64, 2);
    let loader = node_of(&wf, "ControlNetLoader");
    let mut missing = wf.clone();
    missing.set_input(&loader, "control_net_name", InputValue::Const(serde_json::json!("missing.safetensors"))).unwrap();
    assert!(env.exec.validate(&missing).is_err(), "a missing file fails validation");
    let mut junk = wf.clone();
    junk.set_input(&loader, "control_net_name", InputValue::Const(serde_json::json!("junk.safetensors"))).unwrap();
    let e = run_err(&env, &junk);
    assert!(e.contains("junk.safetensors"), "{e}");
    let mut wide = wf.clone();
    wide.set_input(&loader, "control_net_name", InputValue::Const(serde_json::json!("wide.safetensors"))).unwrap();
    let e = run_err(&env, &wide);
    assert!(e.contains("wide.safetensors") && e.contains("skip widths"), "{e}");
    // Not a ControlNet: a checkpoint put in models/controlnet.
    std::fs::copy(env._dir.path().join("models/checkpoints/model.safetensors"), env._dir.path().join("models/controlnet/ckpt.safetensors")).unwrap();
    let mut ckpt = wf.clone();
    ckpt.set_input(&loader, "control_net_name", InputValue::Const(serde_json::json!("ckpt.safetensors"))).unwrap();
    let e = run_err(&env, &ckpt);
    assert!(e.contains("not a ControlNet"), "{e}");
}

#[test]
fn sdxl_txt2img_runs_and_size_conditioning_matters() {
    let env = env();
    let wf = load(&env, "sdxl_txt2img.json", 64, 2);
    let (w, h, px) = run_saved(&env, &wf, "7");
    assert_eq!((w, h), (64, 64));
    let distinct: std::collections::HashSet<_> = px.iter().collect();
    assert!(distinct.len() > 16, "only {} distinct byte values", distinct.len());
    // The size SDXL is told about reaches the UNet through the ADM vector.
    let mut other = wf.clone();
    other.set_input("2", "width", InputValue::Const(serde_json::json!(512))).unwrap();
    assert_ne!(run_saved(&env, &other, "7").2, px, "CLIPTextEncodeSDXL's width changes the image");
    // The prompts of the two encoders both count.
    let mut other = wf.clone();
    other.set_input("2", "text_g", InputValue::Const(serde_json::json!("a red bicycle"))).unwrap();
    assert_ne!(run_saved(&env, &other, "7").2, px, "text_g changes the image");
    let mut other = wf.clone();
    other.set_input("2", "text_l", InputValue::Const(serde_json::json!("a red bicycle"))).unwrap();
    assert_ne!(run_saved(&env, &other, "7").2, px, "text_l changes the image");
    // An SDXL embedding brings one set of vectors per encoder (clip_l 32 wide, clip_g 64).
    let emb_dir = env.out.parent().unwrap().join("models/embeddings");
    std::fs::create_dir_all(&emb_dir).unwrap();
    let (l, g): (Vec<f32>, Vec<f32>) = ((0..64).map(|i| (i as f32 * 0.37).sin()).collect(), (0..128).map(|i| (i as f32 * 0.11).cos()).collect());
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (lb, gb) = (bytes(&l), bytes(&g));
    sdflow_core::io::safetensors::write(
        &emb_dir.join("xlstyle.safetensors"),
        [("clip_l", DType::F32, vec![2, 32], lb.as_slice()), ("clip_g", DType::F32, vec![2, 64], gb.as_slice())].into_iter(),
        &Default::default(),
    )
    .unwrap();
    let mut with_emb = wf.clone();
    let prompt = "a lighthouse on a cliff at dawn, oil painting, xlstyle";
    with_emb.set_input("2", "text_g", InputValue::Const(serde_json::json!(prompt))).unwrap();
    with_emb.set_input("2", "text_l", InputValue::Const(serde_json::json!(prompt))).unwrap();
    let mut plain = with_emb.clone();
    plain.set_input("2", "text_g", InputValue::Const(serde_json::json!(prompt.replace("xlstyle", "xlstyles")))).unwrap();
    plain.set_input("2", "text_l", InputValue::Const(serde_json::json!(prompt.replace("xlstyle", "xlstyles")))).unwrap();
    assert_ne!(run_saved(&env, &with_emb, "7").2, run_saved(&env, &plain, "7").2, "the embedding's vectors are used");
    // An SD1-style embedding (one 32-wide set) has nothing for OpenCLIP-G: the run says so.
    sdflow_core::io::safetensors::write(&emb_dir.join("lonly.safetensors"), [("emb_params", DType::F32, vec![2, 32], lb.as_slice())].into_iter(), &Default::default()).unwrap();
    let mut one_width = wf.clone();
    one_width.set_input("2", "text_g", InputValue::Const(serde_json::json!("lonly"))).unwrap();
    let err = env.exec.run(&one_width, &NullSink, &CancelToken::new(), &RunOptions::default()).err().expect("no G vectors");
    assert!(format!("{err:?}").contains("lonly") && format!("{err:?}").contains("64-wide"), "{err:?}");
}

#[test]
fn sdxl_and_sd1_conditioning_do_not_mix() {
    let env = env();
    // CLIPTextEncodeSDXL on an SD1 CLIP: refused, naming the node's need.
    let mut wf = load(&env, "sdxl_txt2img.json", 64, 2);
    wf.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("model.safetensors"))).unwrap();
    let err = env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions::default()).err().expect("SD1 CLIP into CLIPTextEncodeSDXL");
    assert!(format!("{err:?}").contains("two text encoders"), "{err:?}");
    // SD1 prompts for an SDXL UNet: the widths differ, and the run says so.
    let mut sd1 = load(&env, "txt2img.json", 64, 2);
    let mut xl_model = NodeSpec::new("CheckpointLoaderSimple");
    xl_model.inputs.insert("ckpt_name".into(), InputValue::Const(serde_json::json!("sdxl.safetensors")));
    sd1.nodes.insert("9".into(), xl_model);
    sd1.set_input("5", "model", InputValue::Link { node: "9".into(), output: 0 }).unwrap();
    assert!(env.exec.run(&sd1, &NullSink, &CancelToken::new(), &RunOptions::default()).is_err(), "768-style context into an SDXL UNet");
}

#[test]
fn cosxl_edm_v_prediction_is_read_from_the_checkpoint() {
    let env = env();
    let wf = load(&env, "sdxl_txt2img.json", 64, 2);
    let (_, _, xl) = run_saved(&env, &wf, "7");
    let mut cos = wf.clone();
    cos.set_input("1", "ckpt_name", InputValue::Const(serde_json::json!("cosxl.safetensors"))).unwrap();
    let (w, h, px) = run_saved(&env, &cos, "7");
    assert_eq!((w, h), (64, 64));
    // Same weights, another prediction type and noise range: another image.
    assert_ne!(px, xl, "the edm_vpred keys change sampling");
}

/// An SDXL ControlNet (with label_emb, taking the ADM vector y) on the SDXL workflow;
/// an SD1 ControlNet does not fit the SDXL UNet.
#[test]
fn sdxl_controlnet_runs() {
    let env = env();
    let wf = load(&env, "sdxl_txt2img.json", 64, 2);
    let (_, _, plain) = run_saved(&env, &wf, "7");
    let with = |name: &str| {
        let mut w = wf.clone();
        w.nodes.insert("20".into(), NodeSpec::new("ControlNetLoader").with_input("control_net_name", InputValue::Const(serde_json::json!(name))));
        w.nodes.insert("21".into(), NodeSpec::new("LoadImage").with_input("image", InputValue::Const(serde_json::json!("input.png"))));
        w.nodes.insert("22".into(), controlnet_apply(InputValue::link("2", 0), InputValue::link("3", 0), "20", "21", 0.8));
        w.set_input("5", "positive", InputValue::link("22", 0)).unwrap();
        w.set_input("5", "negative", InputValue::link("22", 1)).unwrap();
        w
    };
    let (w, h, controlled) = run_saved(&env, &with("sdxl_canny.safetensors"), "7");
    assert_eq!((w, h), (64, 64));
    assert_ne!(controlled, plain, "the SDXL ControlNet changes the image");
    let e = run_err(&env, &with("control_v11p_sd15_canny.safetensors"));
    assert!(e.contains("control_v11p_sd15_canny.safetensors") && e.contains("another model family"), "{e}");
}

/// Tensors of `ckpt` under `from`, renamed to start with `to`, written as a standalone file.
fn extract(ckpt: &std::path::Path, from: &str, to: &str, out: &std::path::Path) {
    let src = sdflow_core::io::open(ckpt).unwrap();
    let parts: Vec<(String, DType, Vec<usize>, Vec<u8>)> = src
        .tensors()
        .iter()
        .filter_map(|t| t.name.strip_prefix(from).map(|rest| (format!("{to}{rest}"), t.dtype, t.shape.clone(), src.read(&t.name).unwrap().to_vec())))
        .collect();
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    sdflow_core::io::safetensors::write(out, parts.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())), &Default::default()).unwrap();
}

/// sd-cli's --clip_l/--clip_g: standalone text encoders (ComfyUI's Hugging Face-named
/// clip_l, an OpenCLIP-named G) give exactly the checkpoint's own conditioning.
#[test]
fn standalone_text_encoders_load_as_the_checkpoints_own() {
    let env = env();
    let wf = load(&env, "sdxl_txt2img.json", 64, 2);
    let (_, _, own) = run_saved(&env, &wf, "7");
    let mut dual = wf.clone();
    let mut loader = NodeSpec::new("DualCLIPLoader");
    // G first: the loader orders them as SDXL concatenates them.
    for (k, v) in [("clip_name1", "clip_g.safetensors"), ("clip_name2", "clip_l.safetensors"), ("type", "sdxl")] {
        loader.inputs.insert(k.into(), InputValue::Const(serde_json::json!(v)));
    }
    dual.nodes.insert("20".into(), loader);
    for n in ["2", "3"] {
        dual.set_input(n, "clip", InputValue::Link { node: "20".into(), output: 0 }).unwrap();
    }
    assert_eq!(run_saved(&env, &dual, "7").2, own, "DualCLIPLoader gives the checkpoint's conditioning");

    let wf = load(&env, "txt2img.json", 64, 2);
    let (_, _, own) = run_saved(&env, &wf, "7");
    let mut single = wf.clone();
    let mut loader = NodeSpec::new("CLIPLoader");
    for (k, v) in [("clip_name", "sd1_clip.safetensors"), ("type", "stable_diffusion")] {
        loader.inputs.insert(k.into(), InputValue::Const(serde_json::json!(v)));
    }
    single.nodes.insert("20".into(), loader);
    for n in ["2", "3"] {
        single.set_input(n, "clip", InputValue::Link { node: "20".into(), output: 0 }).unwrap();
    }
    assert_eq!(run_saved(&env, &single, "7").2, own, "CLIPLoader gives the checkpoint's conditioning");
    // ComfyUI's `device: cpu` (here, where everything is on the CPU, the same image); an
    // unknown device is named.
    let mut on_cpu = single.clone();
    on_cpu.set_input("20", "device", InputValue::Const(serde_json::json!("cpu"))).unwrap();
    assert_eq!(run_saved(&env, &on_cpu, "7").2, own, "device cpu");
    let mut gpu = single.clone();
    gpu.set_input("20", "device", InputValue::Const(serde_json::json!("gpu"))).unwrap();
    let e = env.exec.run(&gpu, &NullSink, &CancelToken::new(), &RunOptions::default()).err().expect("an unknown device");
    assert!(format!("{e:?}").contains("device") && format!("{e:?}").contains("gpu"), "{e:?}");
    // Two CLIP-L files are no SDXL pair.
    let mut twice = dual.clone();
    twice.set_input("20", "clip_name1", InputValue::Const(serde_json::json!("clip_l.safetensors"))).unwrap();
    let e = env.exec.run(&twice, &NullSink, &CancelToken::new(), &RunOptions::default()).err().expect("two CLIP-L");
    assert!(format!("{e:?}").contains("OpenCLIP-G"), "{e:?}");
}
