//! The flow-matching transformers' img_gen graph (FLUX.1 dev/schnell/Fill/Kontext,
//! Chroma, SD3/SD3.5, Z-Image, FLUX.2 klein, Qwen-Image) with sd-cli's semantics, where
//! they differ from ComfyUI's templates:
//! - the schedule is sd.cpp's (`flux`: μ from the latent's pixel count, 4× the token count
//!   ComfyUI uses; SD3, Z-Image and Qwen-Image `discrete`: shift 3; Wan `discrete`: shift
//!   5), written out as ManualSigmas;
//! - Wan (vid_gen) samples a video latent of `--video-frames` (down to 4·k + 1) and writes
//!   the frames as sd-cli does: an `.avi` or `.webp` file at `--fps`, or numbered images;
//! - euler by default, `--cfg-scale` 7 (real CFG with the negative prompt, as sd-cli runs
//!   it), `--guidance` 3.5 on both prompts of a guidance-distilled model;
//! - prompts encoded as sd.cpp encodes them (SdCppConditioner: T5 chunks, mean-restoring
//!   weights, Chroma's masks; Z-Image's LLM encoder always encodes as sd.cpp does);
//! - skip-layer guidance over sd.cpp's step window, FLUX's single blocks numbered after
//!   the double ones;
//! - `-r` references (Kontext, FLUX.2) on both prompts, resized as sd.cpp does (nearest
//!   neighbour to at most 1024² pixels, sides rounded to 16).

use sdflow_core::sampling::flow::{flux2_mu, FlowShift};
use sdflow_executor::{InputValue, NodeSpec};
use serde_json::json;

use super::graph::*;
use super::stages::*;
use super::{extract_loras, invalid, not_supported, resolve_seed, workflow_sampler_name, workflow_scheduler_name, Family, ImgGenParams, Preset, PresetError};

/// sd.cpp's FLUX scheduler bounds (`base_shift`, `max_shift`) over 256..4096 latent pixels.
const FLUX_BASE_SHIFT: f32 = 0.5;
const FLUX_MAX_SHIFT: f32 = 1.15;
/// SD3's (and Z-Image's) default `--flow-shift`.
const SD3_SHIFT: f32 = 3.0;
/// sd.cpp's default `--flow-shift` for Wan.
const WAN_SHIFT: f32 = 5.0;

/// sd.cpp's FLUX μ: linear in `(H/8)·(W/8)` latent pixels through (256, 0.5) and
/// (4096, 1.15), in its f32 arithmetic (1.15 at 512², 3.23 at 1024²).
pub(super) fn flux_mu(width: i64, height: i64) -> f32 {
    let seq = ((height / 8) * (width / 8)) as f32;
    let m = (FLUX_MAX_SHIFT - FLUX_BASE_SHIFT) / (4096.0 - 256.0);
    let b = FLUX_BASE_SHIFT - m * 256.0;
    seq * m + b
}

/// An f32 as the f64 its shortest decimal spells (1.15, not 1.149999976158142).
fn short_f64(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(v as f64)
}

/// sd.cpp's `flux` scheduler: `σ(1 − i/n)` for i < n, then 0.
fn flux_schedule(steps: usize, shift: FlowShift) -> Vec<f32> {
    let mut out: Vec<f32> = (0..steps).map(|i| shift.sigma(1.0 - i as f32 / steps as f32)).collect();
    out.push(0.0);
    out
}

/// sd.cpp's `discrete` scheduler on a flow model: `t_i = 999 − i·999/(n−1)`,
/// `σ((t_i + 1)/1000)`, then 0 (one step: `[σ(1), 0]`).
fn discrete_schedule(steps: usize, shift: FlowShift) -> Vec<f32> {
    let t_to_sigma = |t: f32| shift.sigma((t + 1.0) / 1000.0);
    let mut out: Vec<f32> = if steps == 1 {
        vec![t_to_sigma(999.0)]
    } else {
        let step = 999.0 / (steps - 1) as f32;
        (0..steps).map(|i| t_to_sigma(999.0 - i as f32 * step)).collect()
    };
    out.push(0.0);
    out
}

/// FLUX.2's image tokens for a `width`×`height` image (16×16 pixels each), as sd.cpp
/// counts them.
fn flux2_tokens(width: i64, height: i64) -> f64 {
    ((width / 16) * (height / 16)) as f64
}

/// sd.cpp's `flux2` scheduler: `σ(1 − i/n)` under the empirical μ for i < n (1 at i = 0),
/// then 0.
fn flux2_schedule(steps: usize, width: i64, height: i64) -> Vec<f32> {
    let shift = FlowShift::Flux(flux2_mu(flux2_tokens(width, height), steps));
    let mut out: Vec<f32> = (0..steps).map(|i| if i == 0 { 1.0 } else { shift.sigma(1.0 - i as f32 / steps as f32) }).collect();
    out.push(0.0);
    out
}

/// The area sd.cpp resizes a reference to (at most 1024², at most the output's), its
/// aspect kept and each side rounded to a multiple of 16, in its integer arithmetic.
pub fn ref_image_size(out: (i64, i64), reference: (i64, i64)) -> (i64, i64) {
    sd_cpp_ref_size(out, reference, -1, 16)
}

/// sd.cpp's size of a reference image for the VAE: the output's area, at most
/// `max_pixels` (-1: a megapixel), at the reference's aspect (its integer products as
/// sd.cpp computes them), each side rounded to `factor` (16; Qwen-Image's 32).
fn sd_cpp_ref_size(out: (i64, i64), reference: (i64, i64), max_pixels: i64, factor: i64) -> (i64, i64) {
    let (rw, rh) = (reference.0.max(1), reference.1.max(1));
    let target = if max_pixels > 0 { max_pixels } else { 1024 * 1024 };
    let area = target.min(out.0 * out.1);
    let w = ((area * rw / rh) as f64).sqrt();
    let h = w * rh as f64 / rw as f64;
    let f = factor as f64;
    let round = |v: f64| (((v / f).round() * f) as i64).max(factor);
    (round(w), round(h))
}

/// Builds sd-cli's img_gen graph for a flow-matching transformer.
pub(super) fn img_gen(p: &ImgGenParams) -> Result<Preset, PresetError> {
    let family = p.model_info.family;
    check_common(p)?;
    refuse_unet_flags(p, family)?;
    let seed = resolve_seed(p.seed);
    // sd.cpp's defaults for DiTs: euler, and its own flow schedule.
    let sampler = workflow_sampler_name(p.sampling_method.as_deref().unwrap_or("euler")).to_string();
    let own_schedule = match p.scheduler.as_deref() {
        None => true,
        Some("flux") => matches!(family, Family::Flux { .. } | Family::Chroma),
        Some("flux2") => family == Family::Flux2,
        Some("discrete") => true,
        Some(_) => false,
    };
    let scheduler = workflow_scheduler_name(p.scheduler.as_deref().unwrap_or("simple")).to_string();
    let noise_multiplier = p.a1111.as_ref().map_or(1.0, |a| a.noise_multiplier);
    // A noise multiplier is VariationNoise's: the graph samples through it.
    let variation = variation(p)?.or((noise_multiplier != 1.0).then_some((0, 0.0)));
    let sampling = Sampling { seed, cfg: p.cfg_scale, sampler: &sampler, scheduler: &scheduler, rng: p.rng.as_deref(), eta: p.eta, variation, noise_multiplier };
    let (prompt, loras) = extract_loras(&p.prompt)?;
    let mut b = Builder::default();

    let (mut model, mut clip, vae) = loaders(&mut b, p, family)?;
    // The model's own shift, as sd.cpp sets it: FLUX and Chroma from the image size
    // (ModelSamplingFlux with μ as both bounds), SD3 3 unless --flow-shift.
    let shift = match family {
        Family::Sd3 | Family::ZImage | Family::QwenImage | Family::Wan => {
            let s = p.flow_shift.map_or(if family == Family::Wan { WAN_SHIFT } else { SD3_SHIFT }, |s| s as f32);
            if !(s.is_finite() && s > 0.0 && s <= 100.0) {
                return Err(invalid("--flow-shift", format!("{s} is outside (0, 100]")));
            }
            // Qwen-Image's MODEL samples as ComfyUI's FLUX type (μ 1.15); sd.cpp's is this
            // discrete flow.
            // Wan's MODEL samples at ComfyUI's shift 8; sd.cpp's is 5.
            if p.flow_shift.is_some() || matches!(family, Family::QwenImage | Family::Wan) {
                // The same shifted schedule; Z-Image and Qwen-Image are told σ (AuraFlow's
                // node), SD3 and Wan 1000·σ.
                let node = if matches!(family, Family::Sd3 | Family::Wan) { "ModelSamplingSD3" } else { "ModelSamplingAuraFlow" };
                let origin = if p.flow_shift.is_some() { "--flow-shift" } else { "img_gen" };
                model = Out(b.extra("model_sampling", origin, NodeSpec::new(node).with_input("model", link(&model)).with_const("shift", json!(short_f64(s)))), 0);
            }
            FlowShift::Snr(s as f64)
        }
        _ => {
            // sd.cpp's flux scheduler takes no --flow-shift; its other schedulers read it
            // as μ (default 1.15 with a guidance input, else 1).
            let mu = match (own_schedule && p.scheduler.as_deref() != Some("discrete"), p.flow_shift) {
                (true, _) if family == Family::Flux2 => flux2_mu(flux2_tokens(p.width, p.height), p.steps as usize) as f32,
                (true, _) => flux_mu(p.width, p.height),
                (false, Some(s)) => s as f32,
                (false, None) => if matches!(family, Family::Flux { guidance: true, .. }) { FLUX_MAX_SHIFT } else { 1.0 },
            };
            if !(mu.is_finite() && (0.0..=100.0).contains(&mu)) {
                return Err(invalid("--flow-shift", format!("{mu} is outside 0..=100")));
            }
            let mu_json = short_f64(mu);
            let node = NodeSpec::new("ModelSamplingFlux").with_input("model", link(&model)).with_const("max_shift", json!(mu_json)).with_const("base_shift", json!(mu_json)).with_const("width", json!(p.width)).with_const("height", json!(p.height));
            model = Out(b.core("model_sampling", "img_gen", node), 0);
            FlowShift::Flux(mu as f64)
        }
    };
    if p.slg.scale != 0.0 {
        model = skip_layer_guidance(&mut b, p, family, &model)?;
    }
    lora_chain(&mut b, p, &loras, &mut model, &mut clip);
    let vae = circular_chain(&mut b, p, &mut model, vae);
    if let Some(node) = conditioner(p, family, &clip)? {
        clip = Out(b.core("conditioner", "img_gen", node), 0);
    }

    // At --cfg-scale 1 sd.cpp encodes no negative prompt: its guidance reads the positive
    // pass alone, as our samplers do at cfg 1 (they skip the negative pass). So the
    // negative input is the positive conditioning then, not a second T5-XXL encode —
    // unless skip-layer guidance or a CFG++ sampler reads the unconditional pass.
    let negative_unused = p.cfg_scale == 1.0 && p.slg.scale == 0.0 && !sampler.contains("cfg_pp");
    let refs = load_references(&mut b, p, family)?;
    // Qwen-Image's references go to Qwen2.5-VL beside the prompt too (sd.cpp's `qwen`
    // preset), on both prompts.
    let encode = |text: &str, title: &str| -> NodeSpec {
        if !refs.vlm {
            return text_encode(text, &clip, title);
        }
        let mut n = NodeSpec::new("SdCppTextEncodeQwenImageEdit").with_input("clip", link(&clip)).with_const("prompt", json!(text));
        for (i, img) in refs.images.iter().enumerate() {
            n = n.with_input(&format!("image{}", i + 1), link(img));
        }
        let o = &p.ref_options;
        if let Some(m) = &o.vlm_resize_mode {
            n = n.with_const("vlm_resize_mode", json!(m));
        }
        n = n.with_const("vlm_min_size", json!(o.vlm_min_size)).with_const("vlm_max_size", json!(o.vlm_max_size));
        n.title = Some(title.into());
        n
    };
    let mut pos = Out(b.core("pos", "-p", encode(&prompt, "Prompt")), 0);
    let mut neg = (!negative_unused).then(|| Out(b.core("neg", "-n", encode(&p.negative_prompt, "Negative prompt")), 0));
    if matches!(family, Family::Flux { guidance: true, .. }) || (family == Family::Flux2 && p.model_info.flux2_guidance) {
        if !p.guidance.is_finite() || p.guidance < 0.0 {
            return Err(invalid("--guidance", format!("{} must be a non-negative number", p.guidance)));
        }
        for (side, key) in [(Some(&mut pos), "pos_guidance"), (neg.as_mut(), "neg_guidance")] {
            if let Some(side) = side {
                *side = Out(b.core(key, "--guidance", NodeSpec::new("FluxGuidance").with_input("conditioning", link(side)).with_const("guidance", json!(p.guidance))), 0);
            }
        }
    }
    let mut neg = neg.unwrap_or_else(|| pos.clone());
    let stage = VaeStage::new(&mut b, p, vae.clone())?;
    references(&mut b, p, family, &refs.images, &stage, &mut pos, &mut neg)?;

    let empty_description = match family {
        Family::Sd3 => "sd-cli's txt2img with an SD3/SD3.5 MMDiT: CLIP-L, CLIP-G and T5-XXL prompts, euler over sd.cpp's discrete flow schedule (shift 3, --flow-shift), real CFG with the negative prompt at --cfg-scale.",
        Family::Chroma => "sd-cli's txt2img with Chroma: T5-XXL prompts with Chroma's masks, euler over sd.cpp's FLUX schedule (μ from the image size), real CFG with the negative prompt at --cfg-scale; the approximator gets guidance 0.",
        Family::Flux2 if p.model_info.flux2_guidance => "sd-cli's txt2img with FLUX.2 dev: Mistral-Small-3.2's states of three layers (10, 20, 30) of the prompt in its template, zero-padded to 512 rows, the distilled --guidance (3.5), euler over sd.cpp's flux2 schedule (the empirical shift from the token and step counts), CFG with the negative prompt at --cfg-scale (1, as the distilled model runs, skips it).",
        Family::Flux2 => "sd-cli's txt2img with FLUX.2 klein: Qwen3's states of three layers (9, 18, 27) of the prompt in its chat template, padded to 512 tokens, euler over sd.cpp's flux2 schedule (the empirical shift from the token and step counts), CFG with the negative prompt at --cfg-scale (1, as the distilled models run, skips it).",
        Family::ZImage => "sd-cli's txt2img with Z-Image: Qwen3-4B's states of the prompt in its chat template, euler over sd.cpp's discrete flow schedule (shift 3, --flow-shift), real CFG with the negative prompt at --cfg-scale (1, as Turbo runs, skips it).",
        Family::QwenImage => "sd-cli's txt2img with Qwen-Image: Qwen2.5-VL's final states of the prompt in its chat template (the system part dropped), euler over sd.cpp's discrete flow schedule (shift 3, --flow-shift), real CFG with the negative prompt at --cfg-scale.",
        Family::Wan => "sd-cli's vid_gen with a Wan text-to-video model: UMT5-XXL prompts in chunks of 512 tokens with the padding zeroed, euler over sd.cpp's discrete flow schedule (shift 5, --flow-shift), real CFG with the negative prompt at --cfg-scale, the video latent decoded by the Wan VAE one latent frame at a time.",
        _ => "sd-cli's txt2img with FLUX.1: CLIP-L's pooled vector and T5-XXL's tokens, the distilled --guidance (dev), euler over sd.cpp's FLUX schedule (μ from the image size, 4× the token count ComfyUI uses), CFG with the negative prompt at --cfg-scale (1 skips it).",
    };
    let (latent, denoise, mut title, mut description) = match (family, &p.init_img, &p.mask) {
        (Family::Flux { fill: true, .. }, Some(img), Some(mask)) => {
            // FLUX Fill reads the masked image and the mask beside the latent.
            let pixels = init_image(&mut b, p, img);
            let m = b.core("mask", "--mask", NodeSpec::new("LoadImageMask").with_const("image", json!(mask)).with_const("channel", json!("red")));
            let cond = b.core("inpaint", "--mask", NodeSpec::new("InpaintModelConditioning").with_input("positive", link(&pos)).with_input("negative", link(&neg)).with_input("vae", link(&vae)).with_input("pixels", link(&pixels)).with_input("mask", InputValue::link(m, 0)).with_const("noise_mask", json!(true)));
            pos = Out(cond.clone(), 0);
            neg = Out(cond.clone(), 1);
            (Out(cond, 2), p.strength, "Inpainting".to_string(), "sd-cli's --mask with a FLUX.1 Fill model: the masked image and the mask go beside the latent into the model's 384 input channels (InpaintModelConditioning), and sampling is held at the image outside the mask.".to_string())
        }
        (Family::Flux { fill: true, .. }, _, _) => return Err(PresetError::Missing { flag: "--mask".into(), msg: "a FLUX.1 Fill model inpaints: give -i and --mask".into() }),
        (Family::Wan, _, _) => wan_latent(&mut b, p, &vae, &mut pos, &mut neg, empty_description)?,
        (Family::QwenImage, Some(_), _) if p.model_info.qwen_layered => return Err(not_supported("-i", "with a Qwen-Image-Layered model (it decomposes the -r image into layers)")),
        (Family::QwenImage, None, _) if p.model_info.qwen_layered => {
            let empty = NodeSpec::new("EmptyQwenImageLayeredLatentImage").with_const("width", json!(p.width)).with_const("height", json!(p.height)).with_const("layers", json!(p.qwen_image_layers)).with_const("batch_size", json!(p.batch_count));
            let key = b.core("latent", "--qwen-image-layers", empty);
            let description = format!(
                "sd-cli with Qwen-Image-Layered: the -r image, encoded by its RGBA VAE, placed before the frames (index -1, sd.cpp's qwen_layered preset), the composite and {} layers sampled as frames of one latent (Qwen2.5-VL's final states of the prompt, euler over sd.cpp's discrete flow schedule, real CFG at --cfg-scale), the frames cut into a batch and decoded to {} RGBA images, the composite first.",
                p.qwen_image_layers,
                p.qwen_image_layers + 1
            );
            (Out(key, 0), 1.0, "Image into layers".to_string(), description)
        }
        _ => latent_source(&mut b, p, &stage, &sampling, &model, if family == Family::Flux2 { "EmptyFlux2LatentImage" } else { "EmptySD3LatentImage" }, empty_description),
    };
    title = format!("{} {}", family_name(family), title.to_lowercase());
    if !p.ref_images.is_empty() {
        title = format!("{title}, with reference images");
        description.push_str(if family == Family::Flux2 {
            " The -r images are encoded with the VAE and appended to the image tokens at time indices 10, 20, … (ReferenceLatent on both prompts), as FLUX.2 reads them."
        } else {
            " The -r images are encoded with the VAE and appended to the image tokens (ReferenceLatent on both prompts), as FLUX.1 Kontext reads them."
        });
    }

    let custom = match (&p.sigmas, own_schedule) {
        (Some(list), _) => Some(list.clone()),
        (None, true) => {
            let steps = p.steps as usize;
            Some(match (family, p.scheduler.as_deref()) {
                (Family::Flux2, None | Some("flux2")) => flux2_schedule(steps, p.width, p.height),
                (Family::Sd3 | Family::ZImage | Family::QwenImage | Family::Wan, _) | (_, Some("discrete")) => discrete_schedule(steps, shift),
                _ => flux_schedule(steps, shift),
            })
        }
        (None, false) => None,
    };
    let origin = if p.sigmas.is_some() { "--sigmas" } else { "img_gen" };
    let sigmas = custom.as_deref().map(|list| if p.init_img.is_some() { CustomSigmas::Strength(list, denoise) } else { CustomSigmas::Whole(list) });
    let high_noise = p.video.as_ref().and_then(|v| v.high_noise.as_ref());
    let mut sampled = match high_noise {
        Some(h) => {
            let ctx = MoeContext { shift, pos: &pos, neg: &neg, latent: &latent, loras: &loras };
            let out = moe_passes(&mut b, p, h, &sampling, &model, &ctx)?;
            title.push_str(", two experts");
            description.push_str(" A Wan2.2 MoE: the high-noise expert (--high-noise-diffusion-model) samples the schedule's first steps at --high-noise-cfg-scale and hands its noisy latent on, the --diffusion-model expert samples the rest without adding noise.");
            out
        }
        None => Out(sample_pass(&mut b, "sampler", origin, &sampling, &model, p.steps, sigmas, denoise, &pos, &neg, &latent), 0),
    };
    if p.model_info.qwen_layered {
        // sd.cpp decodes each frame as an image.
        let cut = NodeSpec::new("LatentCutToBatch").with_input("samples", link(&sampled)).with_const("dim", json!("t")).with_const("slice_size", json!(1));
        sampled = Out(b.core("frames", "--qwen-image-layers", cut), 0);
    }
    if family == Family::Wan && p.model_info.wan_vace && p.init_img.is_some() {
        // sd.cpp's `ref_image_num`: the reference's latent frame is cut before decoding.
        let trim = NodeSpec::new("TrimVideoLatent").with_input("samples", link(&sampled)).with_input("trim_amount", InputValue::link(latent.0.clone(), 3));
        sampled = Out(b.core("trim", "-i", trim), 0);
    }
    let image = stage.decode(&mut b, &sampled);
    if let (Family::Wan, Some(v)) = (family, &p.video) {
        if v.aligned_frames() > 1 && !super::is_frame_pattern(&p.output) {
            return video_tail(b, p, v, image, title, description);
        }
    }
    output_tail(&mut b, p, image, TailModels { model: &model, clip: &clip, vae: &vae }, &sampling, &prompt, &mut title, &mut description)?;
    Ok(b.finish(title, description))
}

/// sd-cli's vid_gen latent for a Wan model, and the conditioning its images add, by the
/// channels the model reads (sd.cpp's `prepare_video_generation_latents`): a T2V model an
/// empty video; an I2V / FLF2V model (36) a grey video with `-i` as its first frame and
/// `--end-img` as its last through the VAE beside the latent, with the mask of what is
/// given (all four sub-frames of the first latent frame, the last sub-frame of the last),
/// and for Wan 2.1's the images' CLIP-vision states (`--clip_vision`, penultimate layer,
/// the image covering 224² and cut to its centre) — what WanFirstLastFrameToVideo makes;
/// TI2V 5B (48) a Wan 2.2 latent whose first frame is `-i` encoded, kept while the rest are
/// sampled (Wan22ImageToVideoLatent).
fn wan_latent(b: &mut Builder, p: &ImgGenParams, vae: &Out, pos: &mut Out, neg: &mut Out, t2v_description: &str) -> Result<(Out, f64, String, String), PresetError> {
    let frames = p.video.clone().unwrap_or_default().aligned_frames();
    let info = &p.model_info;
    let load = |b: &mut Builder, key: &str, flag: &str, file: &str| Out(b.core(key, flag, NodeSpec::new("LoadImage").with_const("image", json!(file))), 0);
    let sized = |node: NodeSpec| node.with_const("width", json!(p.width)).with_const("height", json!(p.height)).with_const("length", json!(frames)).with_const("batch_size", json!(p.batch_count));
    if !info.wan_vace && p.control_video.is_some() {
        return Err(not_supported("--control-video", "without a Wan VACE model (wan2.1_vace_*: its VACE blocks read the control)"));
    }
    if !info.wan_vace && p.vace_strength != 1.0 {
        return Err(not_supported("--vace-strength", "without a Wan VACE model"));
    }
    match info.wan_in_channels {
        _ if info.wan_vace => {
            for (given, flag) in [(p.end_img.is_some(), "--end-img"), (p.clip_vision.is_some(), "--clip_vision")] {
                if given {
                    return Err(not_supported(flag, "with a Wan VACE model (it reads -i as its reference image and --control-video)"));
                }
            }
            if !(p.vace_strength.is_finite() && (0.0..=1000.0).contains(&p.vace_strength)) {
                return Err(invalid("--vace-strength", format!("{} is outside 0..=1000", p.vace_strength)));
            }
            let mut node = sized(NodeSpec::new("WanVaceToVideo").with_input("positive", link(pos)).with_input("negative", link(neg)).with_input("vae", link(vae))).with_const("strength", json!(p.vace_strength));
            if let Some(dir) = &p.control_video {
                let frames = Out(b.core("control_video", "--control-video", NodeSpec::new("LoadImagesFromDir").with_const("directory", json!(dir))), 0);
                node = node.with_input("control_video", link(&frames));
            }
            if let Some(img) = &p.init_img {
                node = node.with_input("reference_image", link(&load(b, "image", "-i", img)));
            }
            let key = b.core("latent", "--control-video", node);
            (*pos, *neg) = (Out(key.clone(), 0), Out(key.clone(), 1));
            let description = format!(
                "sd-cli's vid_gen with Wan VACE: {} through the Wan VAE as VACE's control (every mask cell 1: the whole video regenerated along it) at --vace-strength{}; UMT5-XXL prompts in chunks of 512 tokens with the padding zeroed, euler over sd.cpp's discrete flow schedule (shift 5), real CFG at --cfg-scale.",
                if p.control_video.is_some() { "the --control-video frames (file-name order, grey after the last)" } else { "a grey control video" },
                if p.init_img.is_some() { ", the -i reference image as an extra first latent frame cut after sampling (TrimVideoLatent)" } else { "" }
            );
            Ok((Out(key, 2), 1.0, "Video with VACE control".to_string(), description))
        }
        Some(48) => {
            if p.clip_vision.is_some() {
                return Err(not_supported("--clip_vision", "with Wan 2.2 TI2V (it reads no CLIP-vision states)"));
            }
            let mut node = sized(NodeSpec::new("Wan22ImageToVideoLatent").with_input("vae", link(vae)));
            if let Some(img) = &p.init_img {
                node = node.with_input("start_image", link(&load(b, "image", "-i", img)));
            }
            // sd.cpp keeps an --end-img as the last latent frame, as it keeps -i as the first.
            if let Some(img) = &p.end_img {
                node = node.with_input("end_image", link(&load(b, "end_image", "--end-img", img)));
            }
            let key = b.core("latent", "--video-frames", node);
            Ok(match (&p.init_img, &p.end_img) {
                (None, None) => (Out(key, 0), 1.0, "Text to video".to_string(), t2v_description.replace("a Wan text-to-video model", "Wan 2.2 TI2V 5B (its 48-channel latent at 1/16)")),
                _ => (Out(key, 0), 1.0, "Text and image to video".to_string(), format!("sd-cli's vid_gen with Wan 2.2 TI2V 5B: {} encoded by the Wan 2.2 VAE, held clean and read at noise level 0 while the other frames are sampled (UMT5-XXL prompts in chunks of 512 tokens with the padding zeroed, euler over sd.cpp's discrete flow schedule, shift 5, real CFG at --cfg-scale).", match (&p.init_img, &p.end_img) {
                    (Some(_), Some(_)) => "the -i image as the first latent frame and the --end-img image as the last",
                    (Some(_), None) => "the -i image as the first latent frame",
                    _ => "the --end-img image as the last latent frame",
                })),
            })
        }
        Some(36) => {
            let Some(start) = &p.init_img else {
                return Err(PresetError::Missing { flag: "-i".into(), msg: "a Wan image-to-video model starts from an image: give -i (and --end-img for its last frame)".into() });
            };
            let mut node = sized(NodeSpec::new("WanFirstLastFrameToVideo").with_input("positive", link(pos)).with_input("negative", link(neg)).with_input("vae", link(vae)));
            let start = load(b, "image", "-i", start);
            node = node.with_input("start_image", link(&start));
            let end = p.end_img.as_ref().map(|e| load(b, "end_image", "--end-img", e));
            if let Some(e) = &end {
                node = node.with_input("end_image", link(e));
            }
            let mut what = "Wan 2.2 I2V".to_string();
            if info.wan_clip {
                let Some(cv) = &p.clip_vision else {
                    return Err(PresetError::Missing { flag: "--clip_vision".into(), msg: "a Wan 2.1 image-to-video model reads the image through CLIP vision ViT-H: give --clip_vision clip_vision_h.safetensors".into() });
                };
                if info.wan_flf && end.is_none() {
                    return Err(PresetError::Missing { flag: "--end-img".into(), msg: "a Wan 2.1 FLF2V model reads a start and an end image (sd.cpp gives it zeros for a missing end)".into() });
                }
                let loader = Out(b.core("clip_vision", "--clip_vision", NodeSpec::new("CLIPVisionLoader").with_const("clip_name", json!(cv))), 0);
                let encode = |b: &mut Builder, key: &str, flag: &str, image: &Out| Out(b.core(key, flag, NodeSpec::new("CLIPVisionEncode").with_input("clip_vision", link(&loader)).with_input("image", link(image)).with_const("crop", json!("center"))), 0);
                node = node.with_input("clip_vision_start_image", link(&encode(b, "clip_vision_start", "--clip_vision", &start)));
                // Only FLF2V reads the end image's states; I2V's video still ends on it.
                if let (true, Some(e)) = (info.wan_flf, &end) {
                    node = node.with_input("clip_vision_end_image", link(&encode(b, "clip_vision_end", "--end-img", e)));
                }
                what = if info.wan_flf { "Wan 2.1 FLF2V" } else { "Wan 2.1 I2V" }.to_string();
            } else if p.clip_vision.is_some() {
                return Err(not_supported("--clip_vision", "with Wan 2.2 I2V (it reads no CLIP-vision states)"));
            }
            let key = b.core("latent", "-i", node);
            (*pos, *neg) = (Out(key.clone(), 0), Out(key.clone(), 1));
            let clip = if info.wan_clip { ", and the images' CLIP-vision states (--clip_vision: the penultimate layer, the image covering 224² cut to its centre)" } else { "" };
            let description = format!("sd-cli's vid_gen with {what}: a grey video with -i as its first frame{} through the Wan VAE beside the latent, with the mask of the given frames{clip}; UMT5-XXL prompts in chunks of 512 tokens with the padding zeroed, euler over sd.cpp's discrete flow schedule (shift 5), real CFG at --cfg-scale.", if end.is_some() { " and --end-img as its last" } else { "" });
            Ok((Out(key, 2), 1.0, if end.is_some() { "First and last frame to video" } else { "Image to video" }.to_string(), description))
        }
        _ => {
            for (given, flag) in [(p.init_img.is_some(), "-i"), (p.end_img.is_some(), "--end-img"), (p.clip_vision.is_some(), "--clip_vision")] {
                if given {
                    return Err(not_supported(flag, "with a Wan text-to-video model (sd.cpp reads -i as VACE's reference image, and VACE is not built; image to video takes an I2V, FLF2V or TI2V model)"));
                }
            }
            let key = b.core("latent", "--video-frames", sized(NodeSpec::new("EmptyHunyuanLatentVideo")));
            Ok((Out(key, 0), 1.0, "Text to video".to_string(), t2v_description.to_string()))
        }
    }
}

/// What the two expert passes of a Wan2.2 MoE share with the rest of the graph.
struct MoeContext<'a> {
    shift: FlowShift,
    /// The prompt's LoRA tags; the `|high_noise|` ones go to the high-noise expert.
    loras: &'a [super::LoraTag],
    pos: &'a Out,
    neg: &'a Out,
    latent: &'a Out,
}

/// sd.cpp's Wan2.2 MoE sampling: one discrete schedule of `--steps` + `--high-noise-steps`
/// steps (or `--steps`, split where σ falls below `--moe-boundary`), its first part
/// sampled by the high-noise expert (its own CFG scale and sampler, noise added once), the
/// rest by the low-noise one from that latent.
fn moe_passes(b: &mut Builder, p: &ImgGenParams, h: &super::HighNoiseParams, s: &Sampling<'_>, low: &Out, m: &MoeContext<'_>) -> Result<Out, PresetError> {
    if p.sigmas.is_some() || p.scheduler.as_deref().is_some_and(|s| s != "discrete") {
        return Err(not_supported("--high-noise-diffusion-model", "with --sigmas or a --scheduler other than discrete (the experts split sd.cpp's discrete schedule)"));
    }
    if !(h.boundary.is_finite() && (0.0..=1.0).contains(&h.boundary)) {
        return Err(invalid("--moe-boundary", format!("{} is outside 0..=1", h.boundary)));
    }
    let total = p.steps + h.steps.max(0);
    let schedule = discrete_schedule(total as usize, m.shift);
    let split = if h.steps > 0 { h.steps as usize } else { schedule.iter().position(|&s| (s as f64) < h.boundary).unwrap_or(schedule.len() - 1) };
    let high_model = Out(b.core("high_noise_unet", "--high-noise-diffusion-model", NodeSpec::new("UNETLoader").with_const("unet_name", json!(h.model)).with_const("weight_dtype", json!("default"))), 0);
    let shift = match m.shift {
        FlowShift::Snr(v) => v,
        other => return Err(invalid("--flow-shift", format!("{other:?}: Wan's experts take a plain shift"))),
    };
    let mut high_model = Out(b.core("high_noise_model_sampling", "--high-noise-diffusion-model", NodeSpec::new("ModelSamplingSD3").with_input("model", link(&high_model)).with_const("shift", json!(short_f64(shift as f32)))), 0);
    for (i, tag) in m.loras.iter().filter(|t| t.high_noise).enumerate() {
        let file = p.lora_files.get(&tag.name).cloned().unwrap_or_else(|| format!("{}.safetensors", tag.name));
        let mut node = NodeSpec::new("LoraLoaderModelOnly").with_input("model", link(&high_model)).with_const("lora_name", json!(file)).with_const("strength_model", json!(tag.weight));
        if let Some(mode) = &p.lora_apply_mode {
            node = node.with_const("apply_mode", json!(mode));
        }
        high_model = Out(b.extra(&format!("high_noise_lora{i}"), &format!("<lora:|high_noise|{}:{}>", tag.name, tag.weight), node), 0);
    }
    let sampler = workflow_sampler_name(h.sampling_method.as_deref().unwrap_or("euler")).to_string();
    let high = Sampling { cfg: h.cfg_scale, sampler: &sampler, eta: h.eta, ..*s };
    let mut latent = m.latent.clone();
    if split > 0 {
        latent = Out(sample_pass(b, "high_noise_sampler", "--high-noise-steps", &high, &high_model, split as i64, Some(CustomSigmas::Whole(&schedule[..=split])), 1.0, m.pos, m.neg, &latent), 0);
    }
    if split + 1 < schedule.len() {
        let rest = &schedule[split..];
        let (select, origin) = s.sampler_node(s.sampler);
        let select = b.extra("sampler_select", origin, select);
        let sigmas = b.extra("sampler_sigmas", "--steps", manual_sigmas(rest));
        let node = NodeSpec::new("SamplerCustom")
            .with_input("model", link(low))
            .with_const("add_noise", json!(split == 0))
            .with_const("noise_seed", json!(s.seed))
            .with_const("cfg", json!(s.cfg))
            .with_input("positive", link(m.pos))
            .with_input("negative", link(m.neg))
            .with_input("sampler", InputValue::link(select, 0))
            .with_input("sigmas", InputValue::link(sigmas, 0))
            .with_input("latent_image", link(&latent));
        latent = Out(b.core("sampler", "--diffusion-model", s.with_rng(node)), 0);
    }
    Ok(latent)
}

/// The end of sd-cli's vid_gen graph for several frames: the decoded frames written as
/// one video file, `.avi` (Motion-JPEG) or `.webp` as `-o` says, at `--fps`.
pub(super) fn video_tail(mut b: Builder, p: &ImgGenParams, v: &super::VideoParams, frames: Out, title: String, description: String) -> Result<Preset, PresetError> {
    for (given, flag) in [(p.ad_model.is_some(), "--ad-model"), (p.upscale_model.is_some(), "--upscale-model"), (b.paste.is_some(), "--mask")] {
        if given {
            return Err(not_supported(flag, "in the vid_gen mode"));
        }
    }
    if !(1..=1000).contains(&v.fps) {
        return Err(invalid("--fps", format!("{} is outside 1..=1000", v.fps)));
    }
    let path = super::video_output(&p.output)?;
    let format = video_format(&path);
    let save = NodeSpec::new("SaveVideoSdCpp").with_input("images", link(&frames)).with_const("filename_prefix", json!(super::save_prefix(&p.output))).with_const("format", json!(format)).with_const("fps", json!(v.fps));
    b.core("save", "-o", save);
    let container = match format {
        "webp" => "an animated WebP",
        "webm" => "a WebM of VP8 keyframes",
        _ => "a Motion-JPEG AVI",
    };
    let description = format!("{description} {} frames written as {container} at {} fps.", v.aligned_frames(), v.fps);
    Ok(b.finish(format!("{title} ({} frames)", v.aligned_frames()), description))
}

/// The SaveVideoSdCpp `format` for a video file path (its extension: `avi`, `webp`, `webm`).
fn video_format(path: &std::path::Path) -> &'static str {
    match path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).as_deref() {
        Some("webp") => "webp",
        Some("webm") => "webm",
        _ => "avi",
    }
}

/// sd-cli flags that belong to the UNet families.
fn refuse_unet_flags(p: &ImgGenParams, family: Family) -> Result<(), PresetError> {
    let name = family_name(family);
    for (given, flag) in [
        (p.control_net.is_some(), "--control-net"),
        (p.photo_maker.is_some(), "--photo-maker"),
        (p.img_cfg_scale.is_some(), "--img-cfg-scale"),
        (p.hires.enabled, "--hires"),
        (p.clip_skip > 0, "--clip-skip"),
        (p.refiner.is_some(), "--refiner"),
        (!p.controls.is_empty(), "alwayson_scripts.controlnet"),
    ] {
        if given {
            return Err(not_supported(flag, format!("with a {name} model (sdflow runs it on the SD UNets)")));
        }
    }
    let own = match family {
        Family::Sd3 | Family::ZImage | Family::QwenImage | Family::Wan => "sd3_flow",
        Family::Flux2 => "flux2_flow",
        _ => "flux_flow",
    };
    match p.prediction.as_deref() {
        None => Ok(()),
        Some(pr) if pr == own => Ok(()),
        Some(pr) => Err(not_supported(format!("--prediction {pr}"), format!("a {name} model predicts {own}"))),
    }
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::Unet => "UNet",
        Family::Flux { fill: true, .. } => "FLUX.1 Fill",
        Family::Flux { guidance: false, .. } => "FLUX.1 schnell",
        Family::Flux { .. } => "FLUX.1",
        Family::Chroma => "Chroma",
        Family::Sd3 => "SD3",
        Family::ZImage => "Z-Image",
        Family::Flux2 => "FLUX.2",
        Family::QwenImage => "Qwen-Image",
        Family::Wan => "Wan",
    }
}

/// The diffusion model, text encoders and VAE: each flag's file, else what `-m` holds.
fn loaders(b: &mut Builder, p: &ImgGenParams, family: Family) -> Result<(Out, Out, Out), PresetError> {
    let name = family_name(family);
    let info = &p.model_info;
    // -m through CheckpointLoaderSimple where it holds more than the diffusion model.
    let ckpt = match &p.model {
        Some(m) if p.diffusion_model.is_none() && (info.has_text_encoders || info.has_vae) => Some(b.core("ckpt", "-m", NodeSpec::new("CheckpointLoaderSimple").with_const("ckpt_name", json!(m)))),
        Some(m) if p.diffusion_model.is_some() && (info.has_text_encoders || info.has_vae) => Some(b.extra("ckpt", "-m", NodeSpec::new("CheckpointLoaderSimple").with_const("ckpt_name", json!(m)))),
        _ => None,
    };
    let unet = |b: &mut Builder, flag: &str, file: &str| Out(b.core("unet", flag, NodeSpec::new("UNETLoader").with_const("unet_name", json!(file)).with_const("weight_dtype", json!("default"))), 0);
    let model = match (&p.diffusion_model, &ckpt, &p.model) {
        (Some(d), _, _) => unet(b, "--diffusion-model", d),
        (None, Some(c), _) => Out(c.clone(), 0),
        (None, None, Some(m)) => unet(b, "-m", m),
        (None, None, None) => return Err(PresetError::Missing { flag: "-m".into(), msg: "the following arguments are required: -m/--model or --diffusion-model".into() }),
    };
    let from_ckpt = |what: &str, flags: &str| -> Result<&String, PresetError> {
        match &ckpt {
            Some(c) if info.has_text_encoders || what == "VAE" => Ok(c),
            _ => Err(PresetError::Missing { flag: flags.into(), msg: format!("the {name} model file holds no {what}; give {flags}") }),
        }
    };
    let files = |list: &[&Option<String>]| list.iter().filter_map(|f| (*f).clone()).collect::<Vec<String>>();
    // Every missing part is named at once.
    let mut clip = || -> Result<Out, PresetError> {
        Ok(match family {
        Family::Sd3 => {
            let given = files(&[&p.clip_l, &p.clip_g, &p.t5xxl]);
            let node = match given.as_slice() {
                [] => None,
                [one] => Some(NodeSpec::new("CLIPLoader").with_const("clip_name", json!(one)).with_const("type", json!("sd3"))),
                [a, c] => Some(NodeSpec::new("DualCLIPLoader").with_const("clip_name1", json!(a)).with_const("clip_name2", json!(c)).with_const("type", json!("sd3"))),
                all => Some(NodeSpec::new("TripleCLIPLoader").with_const("clip_name1", json!(all[0])).with_const("clip_name2", json!(all[1])).with_const("clip_name3", json!(all[2]))),
            };
            match node {
                Some(n) => Out(b.core("clip", "--clip_l/--clip_g/--t5xxl", n), 0),
                None => Out(from_ckpt("text encoders", "--clip_l, --clip_g and --t5xxl")?.clone(), 1),
            }
        }
        Family::ZImage | Family::Flux2 | Family::QwenImage => {
            for (given, flag) in [(p.clip_l.is_some(), "--clip_l"), (p.clip_g.is_some(), "--clip_g"), (p.t5xxl.is_some(), "--t5xxl")] {
                if given {
                    return Err(not_supported(flag, format!("with a {name} model (it reads an LLM alone: --llm)")));
                }
            }
            // ComfyUI's CLIPLoader types: Z-Image's template, FLUX.2's three layers,
            // Qwen-Image's system prompt.
            let ty = match family {
                Family::ZImage => "lumina2",
                Family::QwenImage => "qwen_image",
                _ => "flux2",
            };
            match (&p.llm, &p.llm_vision) {
                (_, Some(_)) if family != Family::QwenImage => return Err(not_supported("--llm_vision", format!("with a {name} model (the vision tower is Qwen-Image-Edit's)"))),
                (Some(l), Some(v)) => Out(b.core("clip", "--llm/--llm_vision", NodeSpec::new("DualCLIPLoader").with_const("clip_name1", json!(l)).with_const("clip_name2", json!(v)).with_const("type", json!(ty))), 0),
                (Some(l), None) => Out(b.core("clip", "--llm", NodeSpec::new("CLIPLoader").with_const("clip_name", json!(l)).with_const("type", json!(ty))), 0),
                (None, Some(_)) => return Err(PresetError::Missing { flag: "--llm".into(), msg: "--llm_vision is Qwen2.5-VL's vision tower; give its language model as --llm".into() }),
                (None, None) => Out(from_ckpt("LLM text encoder", "--llm")?.clone(), 1),
            }
        }
        Family::Wan => {
            for (given, flag) in [(p.clip_l.is_some(), "--clip_l"), (p.clip_g.is_some(), "--clip_g")] {
                if given {
                    return Err(not_supported(flag, "with a Wan model (it reads UMT5-XXL alone: --t5xxl)"));
                }
            }
            match &p.t5xxl {
                Some(t) => Out(b.core("clip", "--t5xxl", NodeSpec::new("CLIPLoader").with_const("clip_name", json!(t)).with_const("type", json!("wan"))), 0),
                None => Out(from_ckpt("UMT5-XXL", "--t5xxl")?.clone(), 1),
            }
        }
        Family::Chroma => {
            for (given, flag) in [(p.clip_l.is_some(), "--clip_l"), (p.clip_g.is_some(), "--clip_g")] {
                if given {
                    return Err(not_supported(flag, "with a Chroma model (it reads T5-XXL alone: --t5xxl)"));
                }
            }
            match &p.t5xxl {
                Some(t) => Out(b.core("clip", "--t5xxl", NodeSpec::new("CLIPLoader").with_const("clip_name", json!(t)).with_const("type", json!("chroma"))), 0),
                None => Out(from_ckpt("T5-XXL", "--t5xxl")?.clone(), 1),
            }
        }
        _ => {
            if p.clip_g.is_some() {
                return Err(not_supported("--clip_g", format!("with a {name} model (it reads CLIP-L and T5-XXL)")));
            }
            match (&p.clip_l, &p.t5xxl) {
                (Some(l), Some(t)) => Out(b.core("clip", "--clip_l/--t5xxl", NodeSpec::new("DualCLIPLoader").with_const("clip_name1", json!(l)).with_const("clip_name2", json!(t)).with_const("type", json!("flux"))), 0),
                (None, None) => Out(from_ckpt("text encoders", "--clip_l and --t5xxl")?.clone(), 1),
                (Some(_), None) => return Err(PresetError::Missing { flag: "--t5xxl".into(), msg: format!("a {name} model reads CLIP-L and T5-XXL; give both") }),
                (None, Some(_)) => return Err(PresetError::Missing { flag: "--clip_l".into(), msg: format!("a {name} model reads CLIP-L and T5-XXL; give both") }),
            }
        }
    })
    };
    let clip = clip();
    let vae = match (&p.vae, &ckpt) {
        (Some(v), _) => Ok(Out(b.core("vae", "--vae", NodeSpec::new("VAELoader").with_const("vae_name", json!(v))), 0)),
        (None, Some(c)) if info.has_vae => Ok(Out(c.clone(), 2)),
        _ => Err(PresetError::Missing { flag: "--vae".into(), msg: format!("the {name} model file holds no VAE; give its VAE (ae.safetensors for FLUX, Chroma and Z-Image; qwen_image_vae.safetensors for Qwen-Image)") }),
    };
    match (clip, vae) {
        (Ok(clip), Ok(vae)) => Ok((model, clip, vae)),
        (Err(PresetError::Missing { flag: f1, msg: m1 }), Err(PresetError::Missing { flag: f2, msg: m2 })) => Err(PresetError::Missing { flag: format!("{f1}, {f2}"), msg: format!("{m1}; {m2}") }),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// SdCppConditioner: prompts encoded as sd.cpp encodes them, with Chroma's mask flags;
/// none for an LLM encoder, which has one way to encode.
fn conditioner(p: &ImgGenParams, family: Family, clip: &Out) -> Result<Option<NodeSpec>, PresetError> {
    let c = &p.chroma;
    if family != Family::Chroma && *c != super::ChromaParams::default() {
        return Err(not_supported("--chroma-* / --model-args chroma_*", format!("with a {} model (Chroma's masks)", family_name(family))));
    }
    let llm = matches!(family, Family::ZImage | Family::Flux2 | Family::QwenImage);
    if p.llm_vision.is_some() && !llm {
        return Err(not_supported("--llm_vision", format!("with a {} model (the vision tower is Qwen-Image-Edit's)", family_name(family))));
    }
    if p.llm.is_some() && !llm {
        return Err(not_supported("--llm", format!("with a {} model (the LLM text encoders go to Z-Image, FLUX.2 and Qwen-Image)", family_name(family))));
    }
    if llm {
        return Ok(None);
    }
    if !(0..=512).contains(&c.t5_mask_pad) {
        return Err(invalid("chroma_t5_mask_pad", format!("{} is outside 0..=512", c.t5_mask_pad)));
    }
    let mut n = NodeSpec::new("SdCppConditioner").with_input("clip", link(clip));
    if family == Family::Chroma {
        n = n.with_const("chroma_use_dit_mask", json!(c.dit_mask)).with_const("chroma_use_t5_mask", json!(c.t5_mask)).with_const("chroma_t5_mask_pad", json!(c.t5_mask_pad));
    }
    Ok(Some(n))
}

/// `--slg-scale`: SkipLayerGuidanceSD3 (SD3's joint blocks) or SkipLayerGuidanceDiT (FLUX's
/// double blocks, then its single blocks numbered after them) over sd.cpp's step window.
fn skip_layer_guidance(b: &mut Builder, p: &ImgGenParams, family: Family, model: &Out) -> Result<Out, PresetError> {
    let s = &p.slg;
    if !(s.scale.is_finite() && s.scale > 0.0 && s.scale <= 10.0) {
        return Err(invalid("--slg-scale", format!("{} is outside (0, 10]", s.scale)));
    }
    for (flag, v) in [("--skip-layer-start", s.start), ("--skip-layer-end", s.end)] {
        if !(0.0..=1.0).contains(&v) {
            return Err(invalid(flag, format!("{v} is outside 0..=1")));
        }
    }
    if let Some(l) = s.layers.iter().find(|l| **l < 0) {
        return Err(invalid("--skip-layers", format!("{l} is not a block index")));
    }
    let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let node = match family {
        Family::ZImage | Family::Flux2 | Family::QwenImage | Family::Wan => return Err(not_supported("--slg-scale", format!("with a {} model (skip-layer guidance runs on SD3, FLUX.1 and Chroma)", family_name(family)))),
        Family::Sd3 => NodeSpec::new("SkipLayerGuidanceSD3").with_input("model", link(model)).with_const("layers", json!(list(&s.layers))),
        _ => {
            let depth = p.model_info.double_blocks.unwrap_or(19) as i64;
            let (double, single): (Vec<i64>, Vec<i64>) = s.layers.iter().partition(|l| **l < depth);
            let single: Vec<i64> = single.iter().map(|l| l - depth).collect();
            NodeSpec::new("SkipLayerGuidanceDiT").with_input("model", link(model)).with_const("double_layers", json!(list(&double))).with_const("single_layers", json!(list(&single))).with_const("rescaling_scale", json!(0.0))
        }
    };
    let node = node.with_const("scale", json!(s.scale)).with_const("start_percent", json!(s.start)).with_const("end_percent", json!(s.end)).with_const("window", json!("steps"));
    Ok(Out(b.extra("slg", "--slg-scale", node), 0))
}

/// `-r`: each reference loaded, resized as sd.cpp does unless told not to, encoded and
/// given to both prompts; `--increase-ref-index` numbers them 1, 2, ….
/// `-r`'s images as loaded, and whether they go to the text encoder's vision tower.
struct References {
    images: Vec<Out>,
    vlm: bool,
}

/// Qwen2.5-VL reads at most this many references (SdCppTextEncodeQwenImageEdit's inputs).
const VLM_REFERENCES: usize = 4;

/// LoadImage of each `-r` image, and sd.cpp's choice of where they go: the model always
/// (`pass_to_dit`), Qwen-Image's vision tower too (`pass_to_vlm`, its preset's default).
fn load_references(b: &mut Builder, p: &ImgGenParams, family: Family) -> Result<References, PresetError> {
    if p.ref_images.is_empty() {
        return Ok(References { images: Vec::new(), vlm: false });
    }
    if !matches!(family, Family::Flux { .. } | Family::Chroma | Family::Flux2 | Family::QwenImage) {
        return Err(not_supported("-r", format!("with a {} model (reference images go to FLUX.1 Kontext, FLUX.2 and Qwen-Image)", family_name(family))));
    }
    // Qwen-Image-Layered's encoder has no vision tower in sd.cpp: its references go to
    // the model only, whatever its preset says.
    let layered = p.model_info.qwen_layered;
    let vlm = !layered && p.ref_options.pass_to_vlm.unwrap_or(family == Family::QwenImage);
    if vlm && family != Family::QwenImage {
        return Err(not_supported("--ref-image-args pass_to_vlm", format!("with a {} model (Qwen-Image-Edit's encoder reads images)", family_name(family))));
    }
    if vlm && p.ref_images.len() > VLM_REFERENCES {
        return Err(not_supported("-r", format!("{} reference images for Qwen2.5-VL: at most {VLM_REFERENCES} (or --ref-image-args pass_to_vlm=false)", p.ref_images.len())));
    }
    if !vlm && !p.ref_options.pass_to_dit {
        return Err(invalid("--ref-image-args", "pass_to_dit=false and pass_to_vlm=false leave the reference images unread"));
    }
    let images = p.ref_images.iter().enumerate().map(|(i, img)| Out(b.extra(&format!("ref{i}"), "-r", NodeSpec::new("LoadImage").with_const("image", json!(img))), 0)).collect();
    Ok(References { images, vlm })
}

/// The references' latents on both prompts (ReferenceLatent), as sd.cpp resizes them.
fn references(b: &mut Builder, p: &ImgGenParams, family: Family, images: &[Out], stage: &VaeStage<'_>, pos: &mut Out, neg: &mut Out) -> Result<(), PresetError> {
    if images.is_empty() || !p.ref_options.pass_to_dit {
        return Ok(());
    }
    if p.ref_sizes.len() != p.ref_images.len() && p.auto_resize_ref_image {
        return Err(invalid("-r", "the reference images' sizes are unknown (the caller reads them)"));
    }
    let mode = p.ref_options.ref_index_mode.as_deref();
    if family == Family::QwenImage && mode == Some("fixed") {
        return Err(not_supported("--ref-image-args ref_index_mode=fixed", "with a Qwen-Image model (it numbers its references: increase)"));
    }
    if family != Family::QwenImage && mode == Some("decrease") {
        return Err(not_supported("--ref-image-args ref_index_mode=decrease", format!("with a {} model (Qwen-Image's references count down: the Layered model's layout)", family_name(family))));
    }
    // Qwen-Image's latents are 2×2 patches of an 8× VAE: sides of 32.
    let factor = if family == Family::QwenImage { 32 } else { 16 };
    for (i, loaded) in images.iter().enumerate() {
        let mut pixels = loaded.clone();
        if p.auto_resize_ref_image {
            let (w, h) = sd_cpp_ref_size((p.width, p.height), p.ref_sizes[i], p.ref_options.vae_input_max_pixels, factor);
            let scale = NodeSpec::new("ImageScale").with_input("image", link(&pixels)).with_const("upscale_method", json!("nearest")).with_const("width", json!(w)).with_const("height", json!(h)).with_const("crop", json!("disabled"));
            pixels = Out(b.extra(&format!("ref{i}_scale"), "-r", scale), 0);
        }
        let enc = NodeSpec::new("VAEEncode").with_input("pixels", link(&pixels)).with_input("vae", link(&stage.vae));
        let latent = b.extra(&format!("ref{i}_encode"), "-r", enc);
        for (side, key) in [(&mut *pos, "pos"), (&mut *neg, "neg")] {
            *side = Out(b.extra(&format!("ref{i}_{key}"), "-r", NodeSpec::new("ReferenceLatent").with_input("conditioning", link(side)).with_input("latent", InputValue::link(latent.clone(), 0))), 0);
        }
    }
    // sd.cpp's index modes: 1, 2, … (ComfyUI's index), or index 1 placed by offsets in
    // latent pixels, which differs from ComfyUI's offset from the second image on.
    // FLUX.2 and Qwen-Image always number their references (sd.cpp's `flux2` and `qwen`
    // presets; the models' own layouts).
    // Qwen-Image: its references count up from frame 1 (Layered: down from −1, the
    // model's own layout, whatever the mode), `decrease` counts them down, and
    // `qwen_image_zero_cond_t` (Edit-2511) modulates them at timestep 0.
    let layered = p.model_info.qwen_layered;
    let method = match (p.increase_ref_index, p.ref_images.len()) {
        _ if family == Family::QwenImage && p.qwen_zero_cond_t => {
            if layered || mode == Some("decrease") {
                return Err(not_supported("--model-args qwen_image_zero_cond_t", "with references counted down (Qwen-Image-Layered, ref_index_mode=decrease)"));
            }
            Some(("index_timestep_zero", "--model-args"))
        }
        _ if family == Family::QwenImage && !layered && mode == Some("decrease") => Some(("negative_index", "--ref-image-args")),
        _ if matches!(family, Family::Flux2 | Family::QwenImage) => None,
        (true, _) => Some(("index", "--increase-ref-index")),
        (false, 2..) => Some(("offset_sd.cpp", "-r")),
        (false, _) => None,
    };
    if let Some((method, origin)) = method {
        for (side, key) in [(pos, "pos"), (neg, "neg")] {
            *side = Out(b.extra(&format!("ref_index_{key}"), origin, NodeSpec::new("FluxKontextMultiReferenceLatentMethod").with_input("conditioning", link(side)).with_const("reference_latents_method", json!(method))), 0);
        }
    }
    Ok(())
}
