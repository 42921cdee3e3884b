//! Unit tests of the preset graphs.

use super::graph::*;
use super::*;
use sdflow_executor::{InputValue, NodeSpec};
use serde_json::json;

#[test]
fn lora_tags_are_extracted() {
    let (p, tags) = extract_loras("a cat <lora:ink:0.8>, sketch<lora:style>").unwrap();
    assert_eq!(p, "a cat , sketch");
    assert_eq!(tags, vec![LoraTag { name: "ink".into(), weight: 0.8, high_noise: false }, LoraTag { name: "style".into(), weight: 1.0, high_noise: false }]);
    // Wan2.2's high-noise expert's LoRA.
    let (_, tags) = extract_loras("a fox <lora:|high_noise|motion:0.5>").unwrap();
    assert_eq!(tags, vec![LoraTag { name: "motion".into(), weight: 0.5, high_noise: true }]);
    assert!(extract_loras("a <lora:|high_noise|:1>").is_err());
    assert!(extract_loras("a <lora:x:abc>").is_err());
    assert!(extract_loras("a <lora:x:1").is_err());
    assert!(extract_loras("a <lora::1>").is_err());
}

#[test]
fn output_names_follow_sd_cli() {
    assert_eq!(save_prefix("./output.png"), "output");
    assert_eq!(save_prefix("out/cat_%03d.png"), "cat_");
    assert_eq!(save_prefix("%d.png"), "output");
    let p = output_paths("out/cat_%03d.png", 3, None).unwrap();
    assert_eq!(p, vec![PathBuf::from("out/cat_000.png"), PathBuf::from("out/cat_001.png"), PathBuf::from("out/cat_002.png")]);
    let p = output_paths("x_%d.png", 2, Some(5)).unwrap();
    assert_eq!(p, vec![PathBuf::from("x_5.png"), PathBuf::from("x_6.png")]);
    let p = output_paths("./output.png", 3, None).unwrap();
    assert_eq!(p, vec![PathBuf::from("./output.png"), PathBuf::from("./output_2.png"), PathBuf::from("./output_3.png")]);
    assert_eq!(output_paths("a%5d.png", 1, None).unwrap(), vec![PathBuf::from("a    0.png")]);
    assert!(output_paths("a_%s.png", 1, None).is_err());
    assert!(output_paths("a_%d_%d.png", 1, None).is_err());
    assert!(output_paths("a.png", 1, Some(-1)).is_err());
}

#[test]
fn negative_seeds_are_drawn() {
    assert_eq!(resolve_seed(7), 7);
    let s = resolve_seed(-1);
    assert!(s >= 0);
}

fn base() -> ImgGenParams {
    ImgGenParams { model: Some("m.safetensors".into()), prompt: "a cat".into(), ..Default::default() }
}

#[test]
fn extra_ad_args_go_to_the_node_that_takes_them() {
    let mut p = base();
    p.ad_model = Some("face.pt".into());
    p.extra_ad_args = Some("confidence=0.5, merge_masks=true, mask_blur=8, inpaint_width=768, steps=0, cfg_scale=5, sample_method=euler".into());
    let wf = img_gen(&p).unwrap().workflow;
    let node = |class: &str| wf.nodes.values().find(|n| n.class_type == class).unwrap();
    let (masks, detail) = (node("BboxDetectorMasks"), node("DetailerForEachMask"));
    assert_eq!(masks.inputs["confidence"], InputValue::Const(json!(0.5)));
    assert_eq!(masks.inputs["mask_mode"], InputValue::Const(json!("merge")));
    assert_eq!(detail.inputs["mask_blur"], InputValue::Const(json!(8)));
    assert_eq!(detail.inputs["inpaint_width"], InputValue::Const(json!(768)));
    assert_eq!(detail.inputs["steps"], InputValue::Const(json!(p.steps)), "steps=0 inherits");
    assert_eq!(detail.inputs["cfg"], InputValue::Const(json!(5)));
    assert_eq!(detail.inputs["sampler_name"], InputValue::Const(json!("euler")));
    assert_eq!(detail.inputs["prompt"], InputValue::Const(json!("a cat")));
    p.extra_ad_args = Some("feather=5".into());
    assert!(matches!(img_gen(&p), Err(PresetError::Invalid { .. })), "unknown keys are refused");
}

fn adetailer_base() -> AdetailerParams {
    AdetailerParams {
        model: "m.safetensors".into(),
        init_img: "in.png".into(),
        ad_model: "face.pt".into(),
        extra_ad_args: None,
        ad_prompt: String::new(),
        ad_negative_prompt: String::new(),
        prompt: "a face".into(),
        negative_prompt: "blur".into(),
        width: None,
        height: None,
        steps: 20,
        cfg_scale: 7.0,
        sampling_method: None,
        scheduler: None,
        prediction: None,
        eta: None,
        rng: None,
        seed: 1,
        strength: 0.4,
        output: "out.png".into(),
    }
}

/// sd-cli's adetailer mode inpaints at the image's size, which -W/-H set by resizing
/// the input first; --ad-prompt/--ad-negative-prompt reach the detailer.
#[test]
fn adetailer_mode_works_at_the_image_size() {
    let node = |wf: &Workflow, class: &str| wf.nodes.values().find(|n| n.class_type == class).cloned();
    let mut p = adetailer_base();
    p.ad_prompt = "[PROMPT], sharp eyes".into();
    p.ad_negative_prompt = "lowres".into();
    let wf = adetailer(&p).unwrap().workflow;
    let detail = node(&wf, "DetailerForEachMask").unwrap();
    assert_eq!((&detail.inputs["inpaint_width"], &detail.inputs["inpaint_height"]), (&InputValue::Const(json!(0)), &InputValue::Const(json!(0))));
    assert_eq!(detail.inputs["ad_prompt"], InputValue::Const(json!("[PROMPT], sharp eyes")));
    assert_eq!(detail.inputs["ad_negative_prompt"], InputValue::Const(json!("lowres")));
    assert!(node(&wf, "ImageScale").is_none(), "no -W/-H: the input as it is");

    p.width = Some(640);
    let wf = adetailer(&p).unwrap().workflow;
    let scale = node(&wf, "ImageScale").expect("-W resizes the input");
    assert_eq!((&scale.inputs["width"], &scale.inputs["height"]), (&InputValue::Const(json!(640)), &InputValue::Const(json!(0))), "one side keeps the aspect ratio");
    let detail = node(&wf, "DetailerForEachMask").unwrap();
    let resized = wf.nodes.iter().find(|(_, n)| n.class_type == "ImageScale").map(|(id, _)| id.clone()).unwrap();
    assert_eq!(detail.inputs["image"], InputValue::link(resized.clone(), 0));
    assert_eq!(node(&wf, "BboxDetectorMasks").unwrap().inputs["image"], InputValue::link(resized, 0), "detection sees the resized image");
    assert_eq!(detail.inputs["inpaint_width"], InputValue::Const(json!(0)), "the resized image's size");

    p.extra_ad_args = Some("inpaint_width=512,inpaint_height=512".into());
    let detail = node(&adetailer(&p).unwrap().workflow, "DetailerForEachMask").unwrap();
    assert_eq!(detail.inputs["inpaint_width"], InputValue::Const(json!(512)), "--extra-ad-args wins");

    let mut p = base();
    p.ad_model = Some("face.pt".into());
    p.ad_prompt = "[PROMPT] [SEP] [SKIP]".into();
    let wf = img_gen(&p).unwrap().workflow;
    let detail = node(&wf, "DetailerForEachMask").unwrap();
    assert_eq!(detail.inputs["ad_prompt"], InputValue::Const(json!("[PROMPT] [SEP] [SKIP]")));
    assert_eq!(detail.inputs["inpaint_width"], InputValue::Const(json!(512)), "after generation: sd.cpp's 512x512");
}

#[test]
fn optional_flags_add_nodes_after_the_core_ones() {
    let mut p = base();
    p.prompt = "a cat <lora:ink:0.5>".into();
    p.clip_skip = 2;
    p.vae = Some("v.safetensors".into());
    let preset = img_gen(&p).unwrap();
    let wf = &preset.workflow;
    let classes: Vec<&str> = (1..=wf.nodes.len()).map(|i| wf.nodes[&i.to_string()].class_type.as_str()).collect();
    assert_eq!(classes, ["CheckpointLoaderSimple", "CLIPTextEncode", "CLIPTextEncode", "EmptyLatentImage", "KSampler", "VAEDecode", "SaveImage", "VAELoader", "LoraLoader", "CLIPSetLastLayer"]);
    assert_eq!(wf.nodes["2"].inputs["text"], InputValue::Const(json!("a cat ")));
    assert_eq!(wf.nodes["2"].inputs["clip"], InputValue::link("10", 0));
    assert_eq!(wf.nodes["10"].inputs["stop_at_clip_layer"], InputValue::Const(json!(-2)));
    assert_eq!(wf.nodes["5"].inputs["model"], InputValue::link("9", 0));
    assert_eq!(wf.nodes["6"].inputs["vae"], InputValue::link("8", 0));
    assert_eq!(preset.origins["9"], "<lora:ink:0.5>");
    assert_eq!(preset.save_nodes, vec!["7".to_string()]);
}

#[test]
fn rng_reaches_every_ksampler_only_when_given() {
    let mut p = base();
    p.hires.enabled = true;
    let rngs = |p: &ImgGenParams| -> Vec<Option<InputValue>> {
        let wf = img_gen(p).unwrap().workflow;
        wf.nodes.values().filter(|n| n.class_type == "KSampler").map(|n| n.inputs.get("rng").cloned()).collect()
    };
    assert_eq!(rngs(&p), vec![None, None]);
    p.rng = Some("cuda".into());
    assert_eq!(rngs(&p), vec![Some(InputValue::Const(json!("cuda"))); 2]);
}

/// The node of `class` in `wf`, and the node a link input of it comes from.
fn find<'a>(wf: &'a Workflow, class: &str) -> Vec<&'a NodeSpec> {
    wf.nodes.values().filter(|n| n.class_type == class).collect()
}

fn source<'a>(wf: &'a Workflow, node: &NodeSpec, input: &str) -> (&'a NodeSpec, usize) {
    match &node.inputs[input] {
        InputValue::Link { node, output } => (&wf.nodes[node.as_str()], *output),
        other => panic!("{input} is not a link: {other:?}"),
    }
}

/// `--eta`: every pass (base, hires, pix2pix, detailer) gets a KSamplerSelectAdvanced
/// with it; without, the graphs keep KSampler.
#[test]
fn eta_reaches_every_pass_through_a_sampler_node() {
    let mut p = base();
    p.hires.enabled = true;
    p.rng = Some("cuda".into());
    assert_eq!(find(&img_gen(&p).unwrap().workflow, "KSampler").len(), 2);
    p.eta = Some(0.3);
    let wf = img_gen(&p).unwrap().workflow;
    assert!(find(&wf, "KSampler").is_empty());
    let passes = find(&wf, "SamplerCustom");
    assert_eq!(passes.len(), 2);
    for pass in passes {
        let (select, _) = source(&wf, pass, "sampler");
        assert_eq!((select.class_type.as_str(), &select.inputs["eta"], &select.inputs["sampler_name"]), ("KSamplerSelectAdvanced", &InputValue::Const(json!(0.3)), &InputValue::Const(json!("euler_ancestral"))));
        let (sched, _) = source(&wf, pass, "sigmas");
        assert_eq!(sched.class_type, "BasicScheduler");
        assert_eq!((&pass.inputs["rng"], &pass.inputs["noise_seed"]), (&InputValue::Const(json!("cuda")), &InputValue::Const(json!(42))));
    }
    // The hires pass keeps its denoise on its scheduler.
    assert!(find(&wf, "BasicScheduler").iter().any(|n| n.inputs["denoise"] == InputValue::Const(json!(0.7))));

    let mut q = base();
    q.init_img = Some("in.png".into());
    q.img_cfg_scale = Some(1.5);
    q.eta = Some(0.0);
    let wf = img_gen(&q).unwrap().workflow;
    assert_eq!(find(&wf, "KSamplerSelectAdvanced")[0].inputs["eta"], InputValue::Const(json!(0.0)));

    let mut a = adetailer_base();
    a.eta = Some(0.5);
    a.rng = Some("cpu_portable".into());
    a.extra_ad_args = Some("sample_method=dpm++2m".into());
    let wf = adetailer(&a).unwrap().workflow;
    let det = find(&wf, "DetailerForEachMask")[0];
    let (select, _) = source(&wf, det, "sampler");
    assert_eq!((&select.inputs["sampler_name"], &select.inputs["eta"]), (&InputValue::Const(json!("dpmpp_2m")), &InputValue::Const(json!(0.5))));
    assert_eq!(det.inputs["rng"], InputValue::Const(json!("cpu_portable")));
    for bad in [-0.1, f64::NAN, 1000.0] {
        q.eta = Some(bad);
        assert!(matches!(img_gen(&q), Err(PresetError::Invalid { ref flag, .. }) if flag == "--eta"), "{bad}");
    }
}

/// `--vae-tile-size WxH` and `--vae-relative-tile-size` reach both tiled VAE nodes as
/// their optional inputs; square tiles leave the graph ComfyUI's.
#[test]
fn sd_cli_tile_shapes_reach_the_tiled_nodes() {
    let mut p = base();
    p.init_img = Some("in.png".into());
    p.tiling.enabled = true;
    let wf = img_gen(&p).unwrap().workflow;
    for class in ["VAEEncodeTiled", "VAEDecodeTiled"] {
        let n = find(&wf, class)[0];
        assert!(!n.inputs.contains_key("tile_height") && !n.inputs.contains_key("relative_tile_size"), "{class}");
    }
    p.tiling.tile_size = (32, 48);
    p.tiling.relative = Some((0.5, 2.0));
    let wf = img_gen(&p).unwrap().workflow;
    for class in ["VAEEncodeTiled", "VAEDecodeTiled"] {
        let n = find(&wf, class)[0];
        assert_eq!((&n.inputs["tile_size"], &n.inputs["tile_height"]), (&InputValue::Const(json!(256)), &InputValue::Const(json!(384))), "{class}");
        assert_eq!(n.inputs["relative_tile_size"], InputValue::Const(json!("0.5x2")));
    }
    p.tiling.tile_size = (2, 2);
    assert!(matches!(img_gen(&p), Err(PresetError::Invalid { ref flag, .. }) if flag == "--vae-tile-size"));
    p.tiling.tile_size = (32, 32);
    p.tiling.enabled = false;
    assert!(matches!(img_gen(&p), Err(PresetError::Missing { ref flag, .. }) if flag == "--vae-tiling"));
}

/// `--prediction`: a model-sampling node between the loader and every user of MODEL.
#[test]
fn prediction_sets_the_model_sampling() {
    let mut p = base();
    p.hires.enabled = true;
    for (flag, class, sampling) in [("eps", "ModelSamplingDiscrete", "eps"), ("v", "ModelSamplingDiscrete", "v_prediction"), ("edm_v", "ModelSamplingContinuousEDM", "v_prediction")] {
        p.prediction = Some(flag.into());
        let wf = img_gen(&p).unwrap().workflow;
        let node = find(&wf, class);
        assert_eq!(node[0].inputs["sampling"], InputValue::Const(json!(sampling)));
        assert_eq!(source(&wf, node[0], "model").0.class_type, "CheckpointLoaderSimple");
        for ks in find(&wf, "KSampler") {
            assert_eq!(source(&wf, ks, "model").0.class_type, class, "{flag}");
        }
    }
    p.prediction = Some("flux_flow".into());
    assert!(matches!(img_gen(&p), Err(PresetError::NotSupported { ref flag, .. }) if flag == "--prediction flux_flow"));
    let mut a = adetailer_base();
    a.prediction = Some("v".into());
    let wf = adetailer(&a).unwrap().workflow;
    assert_eq!(source(&wf, find(&wf, "DetailerForEachMask")[0], "model").0.class_type, "ModelSamplingDiscrete");
}

/// `--sigmas`: ManualSigmas instead of the scheduler, cut to `--strength` with `-i` as
/// sd-cli cuts it; `--hires-sigmas`: the hires pass's whole schedule.
#[test]
fn custom_sigmas_become_manual_sigmas() {
    let mut p = base();
    p.sigmas = Some(vec![14.6, 7.0, 3.0, 1.0, 0.0]);
    let wf = img_gen(&p).unwrap().workflow;
    let pass = find(&wf, "SamplerCustom")[0];
    let (select, _) = source(&wf, pass, "sampler");
    assert_eq!(select.class_type, "KSamplerSelect");
    let (manual, _) = source(&wf, pass, "sigmas");
    assert_eq!(manual.inputs["sigmas"], InputValue::Const(json!("14.6, 7, 3, 1, 0")));

    // 4 steps at strength 0.5: sd-cli runs t_enc = 2 steps from one sigma earlier,
    // sigmas[1..]; at 0.75 (t_enc 3) the whole list.
    p.init_img = Some("in.png".into());
    for (strength, split) in [(0.5, Some(1)), (0.75, None), (0.2, Some(3)), (1.0, None)] {
        p.strength = strength;
        let wf = img_gen(&p).unwrap().workflow;
        let pass = find(&wf, "SamplerCustom")[0];
        let (node, out) = source(&wf, pass, "sigmas");
        match split {
            Some(step) => {
                assert_eq!((node.class_type.as_str(), out, &node.inputs["step"]), ("SplitSigmas", 1, &InputValue::Const(json!(step))), "{strength}");
                assert_eq!(source(&wf, node, "sigmas").0.class_type, "ManualSigmas");
            }
            None => assert_eq!(node.class_type, "ManualSigmas", "{strength}"),
        }
    }
    assert_eq!(strength_split(5, 0.5), 1);
    assert_eq!(strength_split(21, 0.75), 4, "sd-cli: 20 steps at 0.75 (t_enc 15) start at sigma 4");

    let mut h = base();
    h.hires.enabled = true;
    h.hires.sigmas = Some(vec![3.0, 1.0, 0.0]);
    let wf = img_gen(&h).unwrap().workflow;
    assert_eq!(find(&wf, "KSampler").len(), 1, "the base pass keeps KSampler");
    let pass = find(&wf, "SamplerCustom")[0];
    assert_eq!(pass.title.as_deref(), Some("Hires pass"));
    assert_eq!(source(&wf, pass, "sigmas").0.inputs["sigmas"], InputValue::Const(json!("3, 1, 0")));

    for (flag, list) in [("--sigmas", vec![1.0]), ("--sigmas", vec![2.0, -1.0]), ("--sigmas", vec![f32::INFINITY, 0.0])] {
        let mut q = base();
        q.sigmas = Some(list.clone());
        assert!(matches!(img_gen(&q), Err(PresetError::Invalid { flag: ref f, .. }) if f == flag), "{list:?}");
    }
    let mut q = base();
    q.hires.sigmas = Some(vec![1.0, 0.0]);
    assert!(matches!(img_gen(&q), Err(PresetError::Missing { ref flag, .. }) if flag == "--hires"));
}

#[test]
fn lora_apply_mode_reaches_every_lora_node_only_when_given() {
    let mut p = base();
    p.prompt = "a cat <lora:ink:0.5><lora:pen:1>".into();
    let loras = |p: &ImgGenParams| -> Vec<Option<InputValue>> {
        let wf = img_gen(p).unwrap().workflow;
        wf.nodes.values().filter(|n| n.class_type == "LoraLoader").map(|n| n.inputs.get("apply_mode").cloned()).collect()
    };
    assert_eq!(loras(&p), vec![None, None], "the node's default stays out of the graph");
    p.lora_apply_mode = Some("at_runtime".into());
    assert_eq!(loras(&p), vec![Some(InputValue::Const(json!("at_runtime"))); 2]);
}

#[test]
fn missing_node_classes_name_their_flags() {
    let mut p = base();
    p.upscale_model = Some("esrgan.pth".into());
    p.upscale_repeats = 2;
    let preset = img_gen(&p).unwrap();
    let mut reg = Registry::new();
    sdflow_executor::stub::register(&mut reg);
    let errs: Vec<String> = unsupported_nodes(&preset, &reg).iter().map(|e| e.to_string()).collect();
    assert!(errs.contains(&"not supported yet: --upscale-model (needs node UpscaleModelLoader)".to_string()), "{errs:?}");
    assert!(errs.contains(&"not supported yet: --upscale-model (needs node ImageUpscaleWithModel)".to_string()), "{errs:?}");
    let ups: Vec<_> = preset.workflow.nodes.values().filter(|n| n.class_type == "ImageUpscaleWithModel").collect();
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].inputs["repeats"], InputValue::Const(json!(2)), "--upscale-repeats 2");
}

#[test]
fn bad_values_are_errors() {
    let mut p = base();
    p.width = 0;
    assert!(matches!(img_gen(&p), Err(PresetError::Invalid { .. })));
    let mut p = base();
    p.strength = 1.5;
    assert!(img_gen(&p).is_err());
    let mut p = base();
    p.model = None;
    assert!(matches!(img_gen(&p), Err(PresetError::Missing { .. })));
    let mut p = base();
    p.mask = Some("m.png".into());
    assert!(img_gen(&p).is_err(), "a mask without an image");
    let mut p = base();
    p.tiling.enabled = true;
    p.tiling.overlap = 1.0;
    assert!(matches!(img_gen(&p), Err(PresetError::Invalid { ref flag, .. }) if flag == "--vae-tile-overlap"));
}

#[test]
fn every_sd_cli_latent_upscaler_has_a_latent_method() {
    for (name, method) in [
        ("Latent", "bilinear"),
        ("Latent (nearest)", "nearest"),
        ("Latent (nearest-exact)", "nearest-exact"),
        ("Latent (antialiased)", "bilinear-antialiased"),
        ("Latent (bicubic)", "bicubic"),
        ("Latent (bicubic antialiased)", "bicubic-antialiased"),
    ] {
        let mut p = base();
        p.hires.enabled = true;
        p.hires.upscaler = name.into();
        let wf = img_gen(&p).unwrap_or_else(|e| panic!("{name}: {e}")).workflow;
        assert_eq!(wf.nodes["6"].class_type, "LatentUpscaleBy", "{name}");
        assert_eq!(wf.nodes["6"].inputs["upscale_method"], InputValue::Const(json!(method)), "{name}");
    }
}

#[test]
fn hires_targets_and_image_upscalers() {
    let mut p = base();
    p.height = 768;
    p.hires.enabled = true;
    p.hires.width = 1024;
    let wf = img_gen(&p).unwrap().workflow;
    assert_eq!(wf.nodes["6"].class_type, "LatentUpscale");
    assert_eq!(wf.nodes["6"].inputs["height"], InputValue::Const(json!(1536)), "the other side keeps the aspect ratio");
    assert_eq!(wf.nodes["7"].inputs["denoise"], InputValue::Const(json!(0.7)));

    let mut p = base();
    p.hires.enabled = true;
    p.hires.upscaler = "4x-UltraSharp.pth".into();
    p.hires.steps = 8;
    let wf = img_gen(&p).unwrap().workflow;
    let classes: Vec<&str> = (1..=wf.nodes.len()).map(|i| wf.nodes[&i.to_string()].class_type.as_str()).collect();
    assert_eq!(classes, ["CheckpointLoaderSimple", "CLIPTextEncode", "CLIPTextEncode", "EmptyLatentImage", "KSampler", "VAEDecode", "UpscaleModelLoader", "ImageUpscaleWithModel", "ImageScale", "VAEEncode", "KSampler", "VAEDecode", "SaveImage"]);
    assert_eq!(wf.nodes["9"].inputs["width"], InputValue::Const(json!(1024)), "512 × the default scale 2");
    assert_eq!(wf.nodes["11"].inputs["steps"], InputValue::Const(json!(8)));
    assert_eq!(wf.nodes["11"].inputs["latent_image"], InputValue::link("10", 0));
}

#[test]
fn control_net_feeds_the_sampler() {
    let mut p = base();
    p.control_net = Some("cn.safetensors".into());
    p.control_image = Some("edges.png".into());
    p.canny = true;
    let wf = img_gen(&p).unwrap().workflow;
    let apply = wf.nodes.iter().find(|(_, n)| n.class_type == "ControlNetApplyAdvanced").map(|(id, _)| id.clone()).unwrap();
    assert_eq!(wf.nodes["5"].inputs["positive"], InputValue::link(apply.clone(), 0));
    assert_eq!(wf.nodes["5"].inputs["negative"], InputValue::link(apply.clone(), 1));
    assert_eq!(wf.nodes[&apply].inputs["strength"], InputValue::Const(json!(0.9)));
    let canny = wf.nodes.values().find(|n| n.class_type == "Canny").expect("--canny adds Canny");
    assert_eq!(canny.inputs["high_threshold"], InputValue::Const(json!(0.08)), "sd-cli's threshold");
    let mut p = base();
    p.control_net = Some("cn.safetensors".into());
    assert!(matches!(img_gen(&p), Err(PresetError::Missing { .. })), "a control net without an image");
}

#[test]
fn partial_strength_inpainting_keeps_the_image() {
    let mut p = base();
    p.init_img = Some("in.png".into());
    p.mask = Some("mask.png".into());
    let wf = img_gen(&p).unwrap().workflow;
    let classes: Vec<&str> = (1..=wf.nodes.len()).map(|i| wf.nodes[&i.to_string()].class_type.as_str()).collect();
    assert_eq!(classes, ["CheckpointLoaderSimple", "CLIPTextEncode", "CLIPTextEncode", "LoadImage", "LoadImageMask", "VAEEncode", "SetLatentNoiseMask", "KSampler", "VAEDecode", "SaveImage"]);
    assert_eq!(wf.nodes["8"].inputs["denoise"], InputValue::Const(json!(0.75)));
}

fn flux() -> ImgGenParams {
    ImgGenParams {
        diffusion_model: Some("flux1-dev.safetensors".into()),
        clip_l: Some("clip_l.safetensors".into()),
        t5xxl: Some("t5xxl_fp16.safetensors".into()),
        vae: Some("ae.safetensors".into()),
        prompt: "a cat".into(),
        model_info: ModelInfo { family: Family::Flux { fill: false, guidance: true }, double_blocks: Some(19), ..ModelInfo::default() },
        ..Default::default()
    }
}

fn sigmas_of(wf: &Workflow) -> Vec<f64> {
    let node = find(wf, "ManualSigmas");
    assert_eq!(node.len(), 1, "one ManualSigmas");
    let InputValue::Const(v) = &node[0].inputs["sigmas"] else { panic!("sigmas are a constant") };
    v.as_str().unwrap().split(',').map(|s| s.trim().parse().unwrap()).collect()
}

fn constant<'a>(node: &'a NodeSpec, input: &str) -> &'a serde_json::Value {
    match &node.inputs[input] {
        InputValue::Const(v) => v,
        other => panic!("{input} is {other:?}"),
    }
}

/// sd.cpp's FLUX schedule: μ linear in the latent's pixel count, σ = e^μ/(e^μ + 1/t − 1)
/// at t = 1 − i/n (computed here in f64 from the formula).
#[test]
fn flux_preset_uses_sd_cpps_schedule_and_shift() {
    for (w, h, steps) in [(512, 512, 4), (1024, 1024, 20), (768, 512, 7)] {
        let wf = img_gen(&ImgGenParams { width: w, height: h, steps, ..flux() }).unwrap().workflow;
        let mu = (h / 8 * (w / 8)) as f64 * (0.65 / 3840.0) + (0.5 - 256.0 * 0.65 / 3840.0);
        let want: Vec<f64> = (0..steps).map(|i| 1.0 - i as f64 / steps as f64).map(|t| mu.exp() / (mu.exp() + 1.0 / t - 1.0)).chain([0.0]).collect();
        let got = sigmas_of(&wf);
        assert_eq!(got.len(), want.len());
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() < 2e-6, "{w}x{h}: {got:?} vs {want:?}");
        }
        let ms = find(&wf, "ModelSamplingFlux")[0];
        assert!((constant(ms, "max_shift").as_f64().unwrap() - mu).abs() < 1e-5 && constant(ms, "base_shift") == constant(ms, "max_shift"));
    }
    assert!((super::dit::flux_mu(1024, 1024) - 3.23).abs() < 1e-4, "4× ComfyUI's token count at 1024²");
    let wf = img_gen(&flux()).unwrap().workflow;
    assert_eq!(constant(find(&wf, "KSamplerSelect")[0], "sampler_name"), &json!("euler"), "sd-cli's default sampler for DiTs");
    let guidance = find(&wf, "FluxGuidance");
    assert_eq!(guidance.len(), 2, "guidance on both prompts");
    assert!(guidance.iter().all(|g| constant(g, "guidance") == &json!(3.5)));
    assert_eq!(find(&wf, "SdCppConditioner").len(), 1);
    assert_eq!(find(&wf, "EmptySD3LatentImage").len(), 1);
    assert_eq!(constant(find(&wf, "SamplerCustom")[0], "cfg"), &json!(7.0), "sd-cli's --cfg-scale default");
    // schnell: no guidance input, so no FluxGuidance.
    let schnell = ImgGenParams { model_info: ModelInfo { family: Family::Flux { fill: false, guidance: false }, ..ModelInfo::default() }, ..flux() };
    assert!(find(&img_gen(&schnell).unwrap().workflow, "FluxGuidance").is_empty());
    // Another scheduler: KSampler's, over a model shifted by --flow-shift as μ.
    let wf = img_gen(&ImgGenParams { scheduler: Some("karras".into()), flow_shift: Some(2.0), ..flux() }).unwrap().workflow;
    assert!(find(&wf, "ManualSigmas").is_empty());
    assert_eq!(constant(find(&wf, "KSampler")[0], "scheduler"), &json!("karras"));
    assert_eq!(constant(find(&wf, "ModelSamplingFlux")[0], "max_shift"), &json!(2.0));
}

/// SD3: sd.cpp's discrete flow schedule (t from 999 to 0, shift 3 or --flow-shift).
#[test]
fn sd3_preset_uses_the_discrete_flow_schedule() {
    let sd3 = ImgGenParams {
        model: Some("sd3.5_medium.safetensors".into()),
        clip_l: Some("clip_l.safetensors".into()),
        clip_g: Some("clip_g.safetensors".into()),
        t5xxl: Some("t5xxl.safetensors".into()),
        model_info: ModelInfo { family: Family::Sd3, has_vae: true, ..ModelInfo::default() },
        steps: 3,
        ..base()
    };
    let wf = img_gen(&sd3).unwrap().workflow;
    let shifted = |s: f64, x: f64| s * x / (1.0 + (s - 1.0) * x);
    let want = [shifted(3.0, 1.0), shifted(3.0, 0.5005), shifted(3.0, 0.001), 0.0];
    for (g, e) in sigmas_of(&wf).iter().zip(want) {
        assert!((g - e).abs() < 2e-6, "{g} vs {e}");
    }
    assert_eq!(find(&wf, "TripleCLIPLoader").len(), 1);
    assert_eq!(find(&wf, "CheckpointLoaderSimple").len(), 1, "-m holds the MMDiT and the VAE");
    assert!(find(&wf, "ModelSamplingSD3").is_empty(), "shift 3 is the model's own");
    let wf = img_gen(&ImgGenParams { flow_shift: Some(6.0), ..sd3.clone() }).unwrap().workflow;
    assert_eq!(constant(find(&wf, "ModelSamplingSD3")[0], "shift"), &json!(6.0));
    assert!((sigmas_of(&wf)[1] - shifted(6.0, 0.5005)).abs() < 2e-6);
    // SLG over sd.cpp's step window on the joint blocks.
    let wf = img_gen(&ImgGenParams { slg: SlgParams { scale: 2.5, ..SlgParams::default() }, ..sd3.clone() }).unwrap().workflow;
    let slg = find(&wf, "SkipLayerGuidanceSD3")[0];
    assert_eq!((constant(slg, "layers"), constant(slg, "window"), constant(slg, "end_percent")), (&json!("7, 8, 9"), &json!("steps"), &json!(0.2)));
    // Without a VAE in -m or --vae, the flag is named.
    let no_vae = ImgGenParams { model_info: ModelInfo { family: Family::Sd3, ..ModelInfo::default() }, ..sd3 };
    assert!(matches!(img_gen(&no_vae), Err(PresetError::Missing { flag, .. }) if flag == "--vae"));
}

#[test]
fn flux_skip_layers_past_the_double_blocks_are_single_blocks() {
    let p = ImgGenParams { slg: SlgParams { scale: 3.0, layers: vec![7, 8, 20, 21], start: 0.01, end: 0.2 }, ..flux() };
    let wf = img_gen(&p).unwrap().workflow;
    let slg = find(&wf, "SkipLayerGuidanceDiT")[0];
    assert_eq!((constant(slg, "double_layers"), constant(slg, "single_layers")), (&json!("7, 8"), &json!("1, 2")));
}

#[test]
fn references_are_resized_as_sd_cpp_and_reach_both_prompts() {
    assert_eq!(super::ref_image_size((1024, 1024), (1536, 1024)), (1248, 832));
    assert_eq!(super::ref_image_size((512, 512), (640, 480)), (592, 448), "capped at the output's area");
    let p = ImgGenParams { ref_images: vec!["a.png".into(), "b.png".into()], ref_sizes: vec![(1536, 1024), (300, 200)], width: 1024, height: 1024, ..flux() };
    let wf = img_gen(&p).unwrap().workflow;
    let scales = find(&wf, "ImageScale");
    assert_eq!((constant(scales[0], "width"), constant(scales[0], "height")), (&json!(1248), &json!(832)));
    assert_eq!(find(&wf, "ReferenceLatent").len(), 4, "two references on each prompt");
    assert!(find(&wf, "FluxKontextMultiReferenceLatentMethod").iter().all(|n| constant(n, "reference_latents_method") == &json!("offset_sd.cpp")), "index 1, sd.cpp's offsets");
    assert_eq!(constant(scales[0], "upscale_method"), &json!("nearest"));
    let wf = img_gen(&ImgGenParams { increase_ref_index: true, auto_resize_ref_image: false, ..p }).unwrap().workflow;
    assert!(find(&wf, "ImageScale").is_empty());
    assert!(find(&wf, "FluxKontextMultiReferenceLatentMethod").iter().all(|n| constant(n, "reference_latents_method") == &json!("index")));
}

#[test]
fn dit_presets_refuse_what_does_not_apply() {
    let cases: Vec<(ImgGenParams, &str)> = vec![
        (ImgGenParams { control_net: Some("cn.safetensors".into()), control_image: Some("c.png".into()), ..flux() }, "--control-net"),
        (ImgGenParams { clip_g: Some("g.safetensors".into()), ..flux() }, "--clip_g"),
        (ImgGenParams { t5xxl: None, ..flux() }, "--t5xxl"),
        (ImgGenParams { model_info: ModelInfo { family: Family::Flux { fill: true, guidance: true }, ..ModelInfo::default() }, ..flux() }, "--mask"),
        (ImgGenParams { prediction: Some("eps".into()), ..flux() }, "--prediction eps"),
        (ImgGenParams { chroma: ChromaParams { dit_mask: false, ..ChromaParams::default() }, ..flux() }, "--chroma-* / --model-args chroma_*"),
        (ImgGenParams { t5xxl: Some("t5.safetensors".into()), ..base() }, "--t5xxl"),
        (ImgGenParams { ref_images: vec!["r.png".into()], ..base() }, "-r"),
    ];
    for (p, flag) in cases {
        let e = img_gen(&p).unwrap_err();
        let named = match &e {
            PresetError::NotSupported { flag: f, .. } | PresetError::Missing { flag: f, .. } | PresetError::Invalid { flag: f, .. } => f.clone(),
        };
        assert_eq!(named, flag, "{e}");
    }
}

#[test]
fn chroma_preset_passes_its_mask_flags() {
    let p = ImgGenParams {
        diffusion_model: Some("chroma.safetensors".into()),
        t5xxl: Some("t5xxl.safetensors".into()),
        vae: Some("ae.safetensors".into()),
        model_info: ModelInfo { family: Family::Chroma, ..ModelInfo::default() },
        chroma: ChromaParams { dit_mask: true, t5_mask: true, t5_mask_pad: 3 },
        ..base()
    };
    let wf = img_gen(&p).unwrap().workflow;
    let c = find(&wf, "SdCppConditioner")[0];
    assert_eq!((constant(c, "chroma_use_dit_mask"), constant(c, "chroma_use_t5_mask"), constant(c, "chroma_t5_mask_pad")), (&json!(true), &json!(true), &json!(3)));
    assert_eq!(constant(find(&wf, "CLIPLoader")[0], "type"), &json!("chroma"));
    assert!(find(&wf, "FluxGuidance").is_empty(), "sd.cpp gives Chroma guidance 0");
}

/// A diffusion model alone, without the flags that give its other parts: each is named.
#[test]
fn every_missing_part_is_named_at_once() {
    let bare = ImgGenParams { clip_l: None, t5xxl: None, vae: None, ..flux() };
    match img_gen(&bare) {
        Err(PresetError::Missing { flag, msg }) => {
            assert_eq!(flag, "--clip_l and --t5xxl, --vae");
            assert!(msg.contains("no text encoders") && msg.contains("no VAE"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a1111_seeds_sample_through_variation_noise_on_every_pass() {
    let mut p = base();
    p.batch_count = 3;
    p.seed = 5;
    p.variation = Some(VariationParams { subseed: 9, strength: 0.25 });
    p.hires.enabled = true;
    let wf = img_gen(&p).unwrap().workflow;
    assert!(find(&wf, "KSampler").is_empty());
    let passes = find(&wf, "SamplerCustomAdvanced");
    assert_eq!(passes.len(), 2, "base and hires passes");
    for pass in passes {
        let (noise, _) = source(&wf, pass, "noise");
        assert_eq!(noise.class_type, "VariationNoise");
        assert_eq!((constant(noise, "noise_seed"), constant(noise, "variation_seed"), constant(noise, "variation_strength")), (&json!(5), &json!(9), &json!(0.25)));
        assert_eq!(source(&wf, pass, "guider").0.class_type, "CFGGuider");
    }
    p.variation = Some(VariationParams { subseed: 9, strength: 1.5 });
    assert!(matches!(img_gen(&p), Err(PresetError::Invalid { flag, .. }) if flag == "--subseed-strength"));
}

#[test]
fn a_refiner_takes_the_last_pass_over_at_its_switch_step() {
    assert_eq!((switch_step(20, 0.8), switch_step(10, 0.7), switch_step(3, 0.5), switch_step(4, 0.0), switch_step(4, 1.0)), (16, 7, 2, 0, 4));
    let mut p = base();
    p.steps = 10;
    p.prompt = "a cat <lora:ink:0.5>".into();
    p.refiner = Some(RefinerParams { model: "r.safetensors".into(), switch_at: 0.8 });
    let wf = img_gen(&p).unwrap().workflow;
    let passes = find(&wf, "KSamplerAdvanced");
    assert_eq!(passes.len(), 2);
    let (first, second) = if constant(passes[0], "add_noise") == "enable" { (passes[0], passes[1]) } else { (passes[1], passes[0]) };
    assert_eq!((constant(first, "start_at_step"), constant(first, "end_at_step"), constant(first, "return_with_leftover_noise")), (&json!(0), &json!(8), &json!("enable")));
    assert_eq!((constant(second, "add_noise"), constant(second, "start_at_step")), (&json!("disable"), &json!(8)));
    assert_eq!(source(&wf, second, "latent_image").0, first);
    // The refiner's own model under the same LoRA, its own prompts, its VAE decoding.
    let (lora, _) = source(&wf, second, "model");
    assert_eq!(lora.class_type, "LoraLoader");
    let (loader, _) = source(&wf, lora, "model");
    assert_eq!(constant(loader, "ckpt_name"), &json!("r.safetensors"));
    let (pos, _) = source(&wf, second, "positive");
    assert_eq!(source(&wf, source(&wf, pos, "clip").0, "clip").0, loader);
    let decode = find(&wf, "VAEDecode")[0];
    assert_eq!(source(&wf, decode, "vae"), (loader, 2));

    // img2img: KSampler's denoise schedule, addressed by steps.
    p.init_img = Some("in.png".into());
    p.strength = 0.5;
    let wf = img_gen(&p).unwrap().workflow;
    let steps: Vec<(i64, i64, i64)> = find(&wf, "KSamplerAdvanced").iter().map(|n| (constant(n, "steps").as_i64().unwrap(), constant(n, "start_at_step").as_i64().unwrap(), constant(n, "end_at_step").as_i64().unwrap())).collect();
    assert!(steps.contains(&(20, 10, 18)) && steps.contains(&(20, 18, 10000)), "{steps:?}");

    // With A1111's seeds or --eta: the schedule split between custom samplers.
    p.init_img = None;
    p.variation = Some(VariationParams { subseed: 3, strength: 0.0 });
    let wf = img_gen(&p).unwrap().workflow;
    let split = find(&wf, "SplitSigmas")[0];
    assert_eq!(constant(split, "step"), &json!(8));
    let passes = find(&wf, "SamplerCustomAdvanced");
    let adds: Vec<_> = passes.iter().map(|n| source(&wf, n, "noise").0.inputs.get("add_noise").cloned()).collect();
    assert!(adds.contains(&None) && adds.contains(&Some(InputValue::Const(json!(false)))), "{adds:?}");
    // A switch at 0 is the refiner alone, at 1 the model alone.
    p.variation = None;
    p.refiner = Some(RefinerParams { model: "r.safetensors".into(), switch_at: 0.0 });
    let wf = img_gen(&p).unwrap().workflow;
    let ks = find(&wf, "KSampler");
    assert_eq!(constant(source(&wf, source(&wf, ks[0], "model").0, "model").0, "ckpt_name"), &json!("r.safetensors"));
    p.refiner = Some(RefinerParams { model: "r.safetensors".into(), switch_at: 1.0 });
    let wf = img_gen(&p).unwrap().workflow;
    assert_eq!(find(&wf, "KSampler").len(), 1);
    assert_eq!(source(&wf, find(&wf, "VAEDecode")[0], "vae").0.inputs["ckpt_name"], InputValue::Const(json!("m.safetensors")));
    p.refiner = Some(RefinerParams { model: "r.safetensors".into(), switch_at: 2.0 });
    assert!(matches!(img_gen(&p), Err(PresetError::Invalid { flag, .. }) if flag == "--refiner-switch-at"));
}

#[test]
fn a1111_img2img_builds_its_preparation_and_overlay() {
    let mut p = base();
    p.init_img = Some("in.png".into());
    p.mask = Some("mask.png".into());
    (p.width, p.height, p.size_given) = (64, 48, true);
    p.a1111 = Some(A1111Img2Img { resize_mode: 2, masked_content: 3, region: None, noise_multiplier: 1.0 });
    let wf = img_gen(&p).unwrap().workflow;
    let find = |class: &str| wf.nodes.iter().filter(|(_, n)| n.class_type == class).map(|(id, _)| id.clone()).collect::<Vec<_>>();
    // Image and mask fitted by the resize mode, the latent zeroed under the mask, and the
    // input laid back through the doubled mask.
    assert_eq!(find("A1111ResizeImage").len(), 2);
    assert!(find("A1111ResizeImage").iter().all(|id| wf.nodes[id].inputs["resize_mode"] == InputValue::Const(json!("resize and fill"))));
    let inpaint = &wf.nodes[&find("A1111InpaintLatent")[0]];
    assert_eq!(inpaint.inputs["masked_content"], InputValue::Const(json!("latent nothing")));
    assert!(find("A1111MaskedFill").is_empty() && find("RandomNoise").is_empty());
    let overlay = &wf.nodes[&find("ImageCompositeMasked")[0]];
    let InputValue::Link { node, .. } = &overlay.inputs["mask"] else { panic!() };
    assert_eq!(wf.nodes[node].class_type, "MaskComposite");
    assert_eq!(wf.nodes[&find("SaveImage")[0]].inputs["images"], InputValue::link(find("ImageCompositeMasked")[0].clone(), 0));

    // Only masked: the region cut out and pasted back at its place; latent noise reads the
    // sampler's noise and the model.
    p.a1111 = Some(A1111Img2Img { resize_mode: 0, masked_content: 2, region: Some([8, 4, 40, 30]), noise_multiplier: 1.0 });
    let wf = img_gen(&p).unwrap().workflow;
    let find = |class: &str| wf.nodes.iter().filter(|(_, n)| n.class_type == class).map(|(_, n)| n.clone()).collect::<Vec<_>>();
    assert!(find("ImageCrop").iter().all(|n| n.inputs["x"] == InputValue::Const(json!(8)) && n.inputs["width"] == InputValue::Const(json!(40))));
    let overlay = &find("ImageCompositeMasked")[0];
    assert_eq!((&overlay.inputs["x"], &overlay.inputs["y"]), (&InputValue::Const(json!(8)), &InputValue::Const(json!(4))));
    assert!(find("A1111InpaintLatent")[0].inputs.contains_key("noise") && find("RandomNoise").len() == 1);

    // Without a mask, mode 3 resizes the latent; a noise multiplier samples through
    // VariationNoise.
    p.mask = None;
    p.a1111 = Some(A1111Img2Img { resize_mode: 3, noise_multiplier: 0.5, ..A1111Img2Img::default() });
    let wf = img_gen(&p).unwrap().workflow;
    assert!(wf.nodes.values().any(|n| n.class_type == "LatentUpscale"));
    let noise = wf.nodes.values().find(|n| n.class_type == "VariationNoise").unwrap();
    assert_eq!(noise.inputs["initial_noise_multiplier"], InputValue::Const(json!(0.5)));

    // Out-of-range values are refused by the A1111 field.
    for (a, mask, flag) in [
        (A1111Img2Img { resize_mode: 4, ..A1111Img2Img::default() }, false, "resize_mode"),
        (A1111Img2Img { masked_content: 7, ..A1111Img2Img::default() }, true, "inpainting_fill"),
        (A1111Img2Img { resize_mode: 3, ..A1111Img2Img::default() }, true, "resize_mode"),
        (A1111Img2Img { region: Some([0, 0, 0, 9]), ..A1111Img2Img::default() }, true, "inpaint_full_res"),
        (A1111Img2Img { noise_multiplier: f64::NAN, ..A1111Img2Img::default() }, false, "initial_noise_multiplier"),
    ] {
        p.mask = mask.then(|| "mask.png".to_string());
        p.a1111 = Some(a);
        match img_gen(&p) {
            Err(PresetError::Invalid { flag: f, .. } | PresetError::NotSupported { flag: f, .. }) => assert_eq!(f, flag),
            other => panic!("{flag}: {:?}", other.map(|_| ())),
        }
    }
}
