//! The UNet families' img_gen graph (SD1.x, SD2.x, SDXL): checkpoint or standalone
//! parts, LoRA tags, txt2img / img2img / inpainting / instruct-pix2pix, ControlNet,
//! PhotoMaker, hires fix, then the shared decode-and-save tail.

use sdflow_executor::{InputValue, NodeSpec};
use serde_json::json;

use super::graph::*;
use super::stages::*;
use super::upscale::upscale_node;
use super::{extract_loras, invalid, not_supported, resolve_seed, ImgGenParams, Preset, PresetError};

/// Builds sd-cli's `img_gen` graph.
pub fn img_gen(p: &ImgGenParams) -> Result<Preset, PresetError> {
    check_common(p)?;
    for (given, flag) in [
        (p.t5xxl.is_some(), "--t5xxl"),
        (p.llm.is_some(), "--llm"),
        (p.slg.scale != 0.0, "--slg-scale"),
        (!p.ref_images.is_empty(), "-r"),
        (p.flow_shift.is_some(), "--flow-shift"),
        (p.chroma != super::ChromaParams::default(), "--chroma-* / --model-args chroma_*"),
    ] {
        if given {
            return Err(not_supported(flag, "with a UNet model (SD1.x/SD2.x/SDXL); it applies to the flow-matching transformers (FLUX, Chroma, SD3, Z-Image)"));
        }
    }
    if p.control_image.is_some() != p.control_net.is_some() {
        let (flag, msg) = if p.control_net.is_some() { ("--control-image", "--control-net needs a control image") } else { ("--control-net", "--control-image needs a control net") };
        return Err(PresetError::Missing { flag: flag.into(), msg: msg.into() });
    }
    let seed = resolve_seed(p.seed);
    let (sampler, scheduler) = sampler_names(&p.sampling_method, &p.scheduler);
    let noise_multiplier = p.a1111.as_ref().map_or(1.0, |a| a.noise_multiplier);
    // A noise multiplier is VariationNoise's: the graph samples through it.
    let variation = variation(p)?.or((noise_multiplier != 1.0).then_some((0, 0.0)));
    let sampling = Sampling { seed, cfg: p.cfg_scale, sampler: &sampler, scheduler: &scheduler, rng: p.rng.as_deref(), eta: p.eta, variation, noise_multiplier };
    let (prompt, loras) = extract_loras(&p.prompt)?;
    let mut b = Builder::default();

    // Model, text encoder and VAE sources.
    let ckpt = p.model.as_ref().map(|m| b.core("ckpt", "-m", NodeSpec::new("CheckpointLoaderSimple").with_const("ckpt_name", json!(m))));
    let mut model = match (&p.diffusion_model, &ckpt) {
        (Some(d), _) => {
            let n = NodeSpec::new("UNETLoader").with_const("unet_name", json!(d)).with_const("weight_dtype", json!("default"));
            let key = if ckpt.is_some() { b.extra("unet", "--diffusion-model", n) } else { b.core("unet", "--diffusion-model", n) };
            Out(key, 0)
        }
        (None, Some(c)) => Out(c.clone(), 0),
        (None, None) => return Err(PresetError::Missing { flag: "-m".into(), msg: "the following arguments are required: -m/--model or --diffusion-model".into() }),
    };
    model = prediction_node(&mut b, &model, p.prediction.as_deref())?;
    let mut clip = match (&p.clip_l, &p.clip_g, &ckpt) {
        (Some(l), Some(g), _) => Out(b.extra("clip", "--clip_g", NodeSpec::new("DualCLIPLoader").with_const("clip_name1", json!(l)).with_const("clip_name2", json!(g)).with_const("type", json!("sdxl"))), 0),
        (Some(l), None, _) => Out(b.extra("clip", "--clip_l", NodeSpec::new("CLIPLoader").with_const("clip_name", json!(l)).with_const("type", json!("stable_diffusion"))), 0),
        (None, Some(_), _) => return Err(not_supported("--clip_g", "a clip_g without clip_l (SDXL needs both)")),
        (None, None, Some(c)) => Out(c.clone(), 1),
        (None, None, None) => return Err(PresetError::Missing { flag: "--clip_l".into(), msg: "a standalone --diffusion-model needs its text encoder".into() }),
    };
    let vae = match (&p.vae, &ckpt) {
        (Some(v), _) => Out(b.extra("vae", "--vae", NodeSpec::new("VAELoader").with_const("vae_name", json!(v))), 0),
        (None, Some(c)) => Out(c.clone(), 2),
        (None, None) => return Err(PresetError::Missing { flag: "--vae".into(), msg: "a standalone --diffusion-model needs a VAE".into() }),
    };
    lora_chain(&mut b, p, &loras, &mut model, &mut clip);
    let vae = circular_chain(&mut b, p, &mut model, vae);
    // sd-cli's vid_gen with a motion module: the frames are one latent batch (the caller
    // sets the batch to the frame count), sampled on the checkpoint's own schedule, every
    // version's GroupNorms per frame. One frame is a plain image, as sd.cpp leaves the
    // modules out then.
    let animatediff = p.video.as_ref().filter(|v| v.motion_module.is_some() && v.aligned_frames() > 1);
    if let Some(mm) = animatediff.and_then(|v| v.motion_module.as_ref()) {
        let node = NodeSpec::new("ADE_AnimateDiffLoaderGen1").with_input("model", link(&model)).with_const("model_name", json!(mm)).with_const("beta_schedule", json!("use existing")).with_const("v1_groupnorm", json!("per frame"));
        model = Out(b.core("motion", "--motion-module", node), 0);
    }
    if p.clip_skip > 0 {
        check_range("--clip-skip", p.clip_skip, 1, 24)?;
        let key = b.extra("clip_skip", "--clip-skip", NodeSpec::new("CLIPSetLastLayer").with_input("clip", link(&clip)).with_const("stop_at_clip_layer", json!(-p.clip_skip)));
        clip = Out(key, 0);
    }

    let mut pos = match &p.photo_maker {
        None => Out(b.core("pos", "-p", text_encode(&prompt, &clip, "Prompt")), 0),
        Some(pm) => {
            // sd.cpp: the ID images stacked into the class word before `img`, the file's
            // LoRA on the UNet, the first style-strength percent of steps without the identity.
            let dir = p.pm_id_images_dir.as_ref().ok_or_else(|| PresetError::Missing { flag: "--pm-id-images-dir".into(), msg: "--photo-maker needs a folder of ID images".into() })?;
            if !(0.0..=100.0).contains(&p.pm_style_strength) {
                return Err(invalid("--pm-style-strength", format!("{} is outside 0..=100", p.pm_style_strength)));
            }
            let loader = b.extra("pm", "--photo-maker", NodeSpec::new("PhotoMakerLoader").with_const("photomaker_model_name", json!(pm)));
            let images = b.extra("pm_images", "--pm-id-images-dir", NodeSpec::new("LoadImagesFromDir").with_const("directory", json!(dir)));
            let lora = b.extra("pm_lora", "--photo-maker", NodeSpec::new("PhotoMakerLoraLoader").with_input("model", link(&model)).with_input("photomaker", InputValue::link(loader.clone(), 0)).with_const("strength", json!(1.0)));
            model = Out(lora, 0);
            let mut enc = NodeSpec::new("PhotoMakerEncode")
                .with_input("photomaker", InputValue::link(loader, 0))
                .with_input("image", InputValue::link(images, 0))
                .with_input("clip", link(&clip))
                .with_const("text", json!(prompt))
                .with_const("trigger_word", json!("img"))
                .with_const("style_strength", json!(p.pm_style_strength));
            if let Some(e) = &p.pm_id_embed_path {
                enc = enc.with_const("id_embeds", json!(e));
            }
            enc.title = Some("Prompt".into());
            Out(b.core("pos", "-p", enc), 0)
        }
    };
    let mut neg = Out(b.core("neg", "-n", text_encode(&p.negative_prompt, &clip, "Negative prompt")), 0);
    if p.zero_empty_negative && p.negative_prompt.is_empty() {
        neg = Out(b.extra("neg_zero", "-n \"\" (SDXL)", NodeSpec::new("ConditioningZeroOut").with_input("conditioning", link(&neg))), 0);
    }

    let refiner = refiner_stage(&mut b, p, &prompt, &loras)?;
    let mut refined = false;
    let mut stage = VaeStage::new(&mut b, p, vae.clone())?;

    let (samples, mut title, mut description) = if let Some(img_cfg) = p.img_cfg_scale {
        pix2pix(&mut b, p, img_cfg, &sampling, &model, &vae, &pos, &neg)?
    } else {
        // The latent to sample, and the mode's title and description.
        let (latent, denoise, mut title, mut description) = latent_source(&mut b, p, &stage, &sampling, &model, "EmptyLatentImage", "sd-cli's default mode: a prompt and a negative prompt, sampled from an empty latent with the checkpoint's UNet and decoded with its VAE.");

        if let (Some(cn), Some(ci)) = (&p.control_net, &p.control_image) {
            let loader = b.extra("cn", "--control-net", NodeSpec::new("ControlNetLoader").with_const("control_net_name", json!(cn)));
            let img = b.extra("cn_image", "--control-image", NodeSpec::new("LoadImage").with_const("image", json!(ci)));
            let mut hint = Out(img, 0);
            if p.canny {
                // sd-cli's preprocess_canny arguments (high 0.08, low 0.08), which the Canny
                // node reads the same way.
                let key = b.extra("canny", "--canny", NodeSpec::new("Canny").with_input("image", link(&hint)).with_const("low_threshold", json!(0.08)).with_const("high_threshold", json!(0.08)));
                hint = Out(key, 0);
            }
            let apply = b.extra("cn_apply", "--control-net", NodeSpec::new("ControlNetApplyAdvanced")
                .with_input("positive", link(&pos))
                .with_input("negative", link(&neg))
                .with_input("control_net", InputValue::link(loader, 0))
                .with_input("image", link(&hint))
                .with_const("strength", json!(p.control_strength))
                .with_const("start_percent", json!(0.0))
                .with_const("end_percent", json!(1.0)));
            pos = Out(apply.clone(), 0);
            neg = Out(apply, 1);
        }
        for (i, c) in p.controls.iter().enumerate() {
            if !(c.strength.is_finite() && (0.0..=10.0).contains(&c.strength)) {
                return Err(invalid(c.origin.clone(), format!("strength {} is outside 0..=10", c.strength)));
            }
            if !(0.0..=1.0).contains(&c.start) || !(0.0..=1.0).contains(&c.end) || c.start > c.end {
                return Err(invalid(c.origin.clone(), format!("the range {}..{} is not within 0..=1, start before end", c.start, c.end)));
            }
            let loader = b.extra(&format!("cn_unit{i}"), &c.origin, NodeSpec::new("ControlNetLoader").with_const("control_net_name", json!(c.model)));
            let img = b.extra(&format!("cn_unit{i}_image"), &c.origin, NodeSpec::new("LoadImage").with_const("image", json!(c.image)));
            let apply = b.extra(&format!("cn_unit{i}_apply"), &c.origin, NodeSpec::new("ControlNetApplyAdvanced")
                .with_input("positive", link(&pos))
                .with_input("negative", link(&neg))
                .with_input("control_net", InputValue::link(loader, 0))
                .with_input("image", InputValue::link(img, 0))
                .with_const("strength", json!(c.strength))
                .with_const("start_percent", json!(c.start))
                .with_const("end_percent", json!(c.end)));
            pos = Out(apply.clone(), 0);
            neg = Out(apply, 1);
        }

        let custom = p.sigmas.as_deref().map(|list| if p.init_img.is_some() { CustomSigmas::Strength(list, denoise) } else { CustomSigmas::Whole(list) });
        let origin = if p.sigmas.is_some() { "--sigmas" } else { "img_gen" };
        // The refiner takes the hires pass over when there is one (A1111's default,
        // "second pass"), else the base pass.
        let first = match (&refiner, p.hires.enabled) {
            (Some((r, _)), false) => {
                let (last, used) = refined_pass(&mut b, "sampler", origin, &sampling, &model, p.steps, custom, denoise, &pos, &neg, &latent, r);
                refined = used;
                last
            }
            _ => sample_pass(&mut b, "sampler", origin, &sampling, &model, p.steps, custom, denoise, &pos, &neg, &latent),
        };
        let mut samples = Out(first.clone(), 0);

        if p.hires.enabled {
            let h = &p.hires;
            check_unit("--hires-denoising-strength", h.denoising_strength)?;
            check_range("--hires-steps", h.steps, 0, 10000)?;
            check_range("--hires-width", h.width, 0, 16384)?;
            check_range("--hires-height", h.height, 0, 16384)?;
            if !(h.scale.is_finite() && h.scale > 0.0 && h.scale <= 8.0) {
                return Err(invalid("--hires-scale", format!("{} is outside (0, 8]", h.scale)));
            }
            // The base pass's size, for a target given by one side only.
            let (bw, bh) = (p.width, p.height);
            let target = match (h.width, h.height) {
                (0, 0) => None,
                (w, 0) => Some((w, (w as f64 * bh as f64 / bw as f64).round() as i64)),
                (0, hh) => Some(((hh as f64 * bw as f64 / bh as f64).round() as i64, hh)),
                (w, hh) => Some((w, hh)),
            };
            let latent_method = match h.upscaler.as_str() {
                "Latent" => Some("bilinear"),
                "Latent (bicubic)" => Some("bicubic"),
                "Latent (nearest-exact)" => Some("nearest-exact"),
                "Latent (nearest)" => Some("nearest"),
                "Latent (antialiased)" => Some("bilinear-antialiased"),
                "Latent (bicubic antialiased)" => Some("bicubic-antialiased"),
                _ => None,
            };
            let upscaled = if let Some(method) = latent_method {
                let n = match target {
                    None => NodeSpec::new("LatentUpscaleBy").with_input("samples", link(&samples)).with_const("upscale_method", json!(method)).with_const("scale_by", json!(h.scale)),
                    Some((w, hh)) => NodeSpec::new("LatentUpscale").with_input("samples", link(&samples)).with_const("upscale_method", json!(method)).with_const("width", json!(w)).with_const("height", json!(hh)).with_const("crop", json!("disabled")),
                };
                Out(b.core("hires_upscale", "--hires", n), 0)
            } else {
                // An image-space upscaler: decode, resize (through a model or a filter),
                // encode again.
                let decoded = b.core("hires_decode", "--hires", NodeSpec::new("VAEDecode").with_input("samples", link(&samples)).with_input("vae", link(&vae)));
                let mut img = Out(decoded, 0);
                let method = match h.upscaler.as_str() {
                    "Nearest" => "nearest-exact",
                    "Lanczos" => "lanczos",
                    model_name => {
                        let loader = b.core("hires_model", "--hires-upscaler", NodeSpec::new("UpscaleModelLoader").with_const("model_name", json!(model_name)));
                        let up = b.core("hires_model_upscale", "--hires-upscaler", upscale_node(&loader, &img, 1, h.upscale_tile_size));
                        img = Out(up, 0);
                        "bicubic"
                    }
                };
                let (w, hh) = target.unwrap_or(((bw as f64 * h.scale).round() as i64, (bh as f64 * h.scale).round() as i64));
                let scaled = b.core("hires_scale", "--hires-upscaler", NodeSpec::new("ImageScale").with_input("image", link(&img)).with_const("upscale_method", json!(method)).with_const("width", json!(w)).with_const("height", json!(hh)).with_const("crop", json!("disabled")));
                stage.encode(&mut b, "hires_encode", "--hires", &Out(scaled, 0))
            };
            let steps = if h.steps > 0 { h.steps } else { p.steps };
            let hires_origin = if h.sigmas.is_some() { "--hires-sigmas" } else { "--hires" };
            let hires_sigmas = h.sigmas.as_deref().map(CustomSigmas::Whole);
            let second = match &refiner {
                Some((r, _)) => {
                    let (last, used) = refined_pass(&mut b, "hires_sampler", hires_origin, &sampling, &model, steps, hires_sigmas, h.denoising_strength, &pos, &neg, &upscaled, r);
                    refined = used;
                    last
                }
                None => sample_pass(&mut b, "hires_sampler", hires_origin, &sampling, &model, steps, hires_sigmas, h.denoising_strength, &pos, &neg, &upscaled),
            };
            for (key, title) in [(&second, "Hires pass"), (&first, "Base pass")] {
                if let Some(e) = b.entries.iter_mut().find(|e| &e.key == key) {
                    e.spec.title = Some(title.into());
                }
            }
            samples = Out(second, 0);
            title = "Hires fix".into();
            description = match (latent_method, target) {
                (Some(_), None) => format!("txt2img at a base size, the latent upscaled {}× and sampled again at denoise {} — sd-cli's --hires with a latent upscaler.", h.scale, h.denoising_strength),
                _ => format!("txt2img at a base size, upscaled with {} and sampled again at denoise {} — sd-cli's --hires.", h.upscaler, h.denoising_strength),
            };
        }
        (samples, title, description)
    };
    if p.tiling.enabled && p.init_img.is_none() && !p.hires.enabled {
        title = "Text to image, tiled VAE decode".into();
        description = format!("txt2img with the latent decoded in overlapping {}-pixel tiles (VAE Decode (Tiled), sd-cli's --vae-tiling): bounded memory for large images, tiles cross-faded over their {}-pixel overlap.", stage.tile_px, stage.overlap_px);
    }
    if !p.controls.is_empty() {
        title.push_str(if p.control_net.is_some() { ", ControlNets" } else { ", ControlNet" });
        description.push_str(&format!(" {} ControlNet unit(s) (A1111's ControlNet extension) guide both prompts, each from its control image at the generation size, over its part of the schedule.", p.controls.len()));
    }
    if p.control_net.is_some() {
        title.push_str(", ControlNet");
        description.push_str(if p.canny {
            " A ControlNet (--control-net) guides the prompt and the negative prompt at --control-strength over the whole schedule, from the Canny edges of the control image (--canny, sd.cpp's preprocessing)."
        } else {
            " A ControlNet (--control-net) guides the prompt and the negative prompt at --control-strength over the whole schedule, from the control image as given."
        });
    }
    if p.photo_maker.is_some() {
        title = format!("PhotoMaker identity ({})", title.to_lowercase());
        description.push_str(&format!(
            " PhotoMaker (SDXL), as sd.cpp runs it: every image of the --pm-id-images-dir folder is encoded by the PhotoMaker ID encoder and stacked into the class word before the trigger word `img` (\"a man img\"), the file's LoRA is applied to the UNet, and the first {}% of the steps (--pm-style-strength) are sampled with the prompt without the identity. PhotoMaker v2 also takes the face embeddings of sd.cpp's face_detect.py (--pm-id-embed-path).",
            p.pm_style_strength
        ));
    }
    if let (Some((r, decoder)), true) = (&refiner, refined) {
        // A1111 decodes with the model sampling ended on: the refiner's VAE, unless a VAE
        // file was given for every model.
        if p.vae.is_none() && p.taesd.is_none() {
            stage.decoder = decoder.clone();
        }
        title.push_str(", refiner");
        description.push_str(&format!(" The refiner checkpoint ({}) takes the sampling over after {} of its steps (KSamplerAdvanced: the first part returns its leftover noise, the refiner goes on without adding noise), with the prompts encoded by its own text encoder; its VAE decodes.", r.model_name, r.switch_at));
    }
    let image = stage.decode(&mut b, &samples);
    if let Some(v) = animatediff {
        title = format!("AnimateDiff, {}", title.to_lowercase().replace(" to image", " to video"));
        description.push_str(" The frames are one latent batch sampled through AnimateDiff's motion modules (--motion-module, ADE_AnimateDiffLoaderGen1), which attend along time after every res/attention pair of the UNet, on the checkpoint's own schedule as sd.cpp runs them, and decoded frame by frame.");
        if !super::is_frame_pattern(&p.output) {
            return super::dit::video_tail(b, p, v, image, title, description);
        }
    }
    output_tail(&mut b, p, image, TailModels { model: &model, clip: &clip, vae: &vae }, &sampling, &prompt, &mut title, &mut description)?;
    Ok(b.finish(title, description))
}

/// A1111's refiner: its checkpoint, the prompt's LoRA tags over it, CLIP skip, and the
/// prompts encoded by its text encoder; with its VAE, for decoding.
fn refiner_stage(b: &mut Builder, p: &ImgGenParams, prompt: &str, loras: &[super::LoraTag]) -> Result<Option<(Refine, Out)>, PresetError> {
    let Some(r) = &p.refiner else { return Ok(None) };
    if !(r.switch_at.is_finite() && (0.0..=1.0).contains(&r.switch_at)) {
        return Err(invalid("--refiner-switch-at", format!("{} is outside 0..=1", r.switch_at)));
    }
    for (given, flag) in [(p.img_cfg_scale.is_some(), "--img-cfg-scale"), (p.photo_maker.is_some(), "--photo-maker"), (p.control_net.is_some() || !p.controls.is_empty(), "ControlNet")] {
        if given {
            return Err(not_supported("--refiner", format!("with {flag}")));
        }
    }
    let loader = b.extra("refiner", "--refiner", NodeSpec::new("CheckpointLoaderSimple").with_const("ckpt_name", json!(r.model)));
    let (mut model, mut clip) = (Out(loader.clone(), 0), Out(loader.clone(), 1));
    lora_chain(b, p, loras, &mut model, &mut clip);
    if p.clip_skip > 0 {
        clip = Out(b.extra("refiner_clip_skip", "--clip-skip", NodeSpec::new("CLIPSetLastLayer").with_input("clip", link(&clip)).with_const("stop_at_clip_layer", json!(-p.clip_skip))), 0);
    }
    let pos = Out(b.extra("refiner_pos", "-p", text_encode(prompt, &clip, "Refiner prompt")), 0);
    let mut neg = Out(b.extra("refiner_neg", "-n", text_encode(&p.negative_prompt, &clip, "Refiner negative prompt")), 0);
    if p.zero_empty_negative && p.negative_prompt.is_empty() {
        neg = Out(b.extra("refiner_neg_zero", "-n \"\" (SDXL)", NodeSpec::new("ConditioningZeroOut").with_input("conditioning", link(&neg))), 0);
    }
    Ok(Some((Refine { model, pos, neg, switch_at: r.switch_at, model_name: r.model.clone() }, Out(loader, 2))))
}

/// `--img-cfg-scale`: an instruct-pix2pix checkpoint edits the input image by the prompt;
/// DualCFGGuider mixes the text and image guidance as sd.cpp does.
#[allow(clippy::too_many_arguments)]
fn pix2pix(b: &mut Builder, p: &ImgGenParams, img_cfg: f64, s: &Sampling<'_>, model: &Out, vae: &Out, pos: &Out, neg: &Out) -> Result<(Out, String, String), PresetError> {
    let Some(img) = &p.init_img else {
        return Err(PresetError::Missing { flag: "-i".into(), msg: "--img-cfg-scale (instruct-pix2pix) edits an init image".into() });
    };
    if !img_cfg.is_finite() || img_cfg < 0.0 {
        return Err(invalid("--img-cfg-scale", format!("{img_cfg} must be a non-negative number")));
    }
    for (given, flag) in [(p.mask.is_some(), "--mask"), (p.hires.enabled, "--hires"), (p.control_net.is_some(), "--control-net"), (!p.controls.is_empty(), "alwayson_scripts.controlnet"), (p.size_given, "-W/-H"), (p.batch_count > 1, "-b")] {
        if given {
            return Err(not_supported(flag, "with --img-cfg-scale (instruct-pix2pix)"));
        }
    }
    if let Some(e) = b.entries.iter_mut().find(|e| e.key == pos.0) {
        e.spec.title = Some("Instruction".into());
    }
    let load = b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(img)));
    let cond = b.core("pix2pix", "--img-cfg-scale", NodeSpec::new("InstructPixToPixConditioning").with_input("positive", link(pos)).with_input("negative", link(neg)).with_input("vae", link(vae)).with_input("pixels", InputValue::link(load, 0)));
    let mut guider = NodeSpec::new("DualCFGGuider")
        .with_input("model", link(model))
        .with_input("cond1", InputValue::link(cond.clone(), 0))
        .with_input("cond2", InputValue::link(cond.clone(), 1))
        .with_input("negative", link(neg))
        .with_const("cfg_conds", json!(p.cfg_scale))
        .with_const("cfg_cond2_negative", json!(img_cfg))
        .with_const("style", json!("regular"));
    guider.title = Some("cfg and img-cfg".into());
    let guider = b.core("guider", "--img-cfg-scale", guider);
    let (select, select_origin) = s.sampler_node(s.sampler);
    let select = b.core("sampler_select", select_origin, select);
    // The whole schedule: instruct-pix2pix samples from pure noise, as at strength 1.
    let sigmas = match &p.sigmas {
        Some(list) => b.core("scheduler", "--sigmas", manual_sigmas(list)),
        None => b.core("scheduler", "--scheduler", NodeSpec::new("BasicScheduler").with_input("model", link(model)).with_const("scheduler", json!(s.scheduler)).with_const("steps", json!(p.steps)).with_const("denoise", json!(1.0))),
    };
    let noise = b.core("noise", "-s", s.with_rng(NodeSpec::new("RandomNoise").with_const("noise_seed", json!(s.seed))));
    let out = b.core("sampler", "--img-cfg-scale", NodeSpec::new("SamplerCustomAdvanced")
        .with_input("noise", InputValue::link(noise, 0))
        .with_input("guider", InputValue::link(guider, 0))
        .with_input("sampler", InputValue::link(select, 0))
        .with_input("sigmas", InputValue::link(sigmas, 0))
        .with_input("latent_image", InputValue::link(cond, 2)));
    Ok((Out(out, 0), "Instruct-pix2pix".into(), "Edits the input image by instruction with an instruct-pix2pix (8-channel) checkpoint. sd-cli's --cfg-scale and --img-cfg-scale: DualCFGGuider mixes uncond + img_cfg·(image-only − uncond) + cfg·(prompt and image − image-only), where the negative prompt without the image is the uncond.".into()))
}
