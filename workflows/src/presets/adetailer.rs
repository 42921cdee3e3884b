//! ADetailer: a detector's finds re-sampled, after img_gen or on an existing image
//! (`sdflow adetailer`).

use sdflow_executor::{InputValue, NodeSpec};
use serde_json::{json, Value as Json};

use super::graph::*;
use super::{extract_loras, invalid, not_supported, resolve_seed, save_prefix, workflow_sampler_name, workflow_scheduler_name, AdetailerParams, Preset, PresetError};

/// ADetailer's detect-and-repair: a detector, its masks and the detail pass over them,
/// with sd.cpp's `--extra-ad-args` keys routed to the node that takes them.
/// The detail pass's prompts and inpaint size (0: the image's side).
pub(super) struct DetailSpec<'a> {
    pub(super) prompt: &'a str,
    pub(super) negative: &'a str,
    pub(super) ad_prompt: &'a str,
    pub(super) ad_negative: &'a str,
    pub(super) inpaint: (i64, i64),
}

#[allow(clippy::too_many_arguments)]
pub(super) fn detailer(b: &mut Builder, image: &Out, model: &Out, clip: &Out, vae: &Out, d: &DetailSpec<'_>, ad_model: &str, extra: Option<&str>, s: &Sampling<'_>, steps: i64, denoise: f64) -> Result<Out, PresetError> {
    let (seed, cfg, sampler, scheduler) = (s.seed, s.cfg, s.sampler, s.scheduler);
    let det = b.extra("ad_detector", "--ad-model", NodeSpec::new("UltralyticsDetectorProvider").with_const("model_name", json!(ad_model)));
    let mut masks = NodeSpec::new("BboxDetectorMasks").with_input("bbox_detector", InputValue::link(det, 0)).with_input("image", link(image));
    let mut n = NodeSpec::new("DetailerForEachMask")
        .with_input("image", link(image))
        .with_input("model", link(model))
        .with_input("clip", link(clip))
        .with_input("vae", link(vae))
        .with_const("prompt", json!(d.prompt))
        .with_const("negative_prompt", json!(d.negative))
        .with_const("ad_prompt", json!(d.ad_prompt))
        .with_const("ad_negative_prompt", json!(d.ad_negative))
        .with_const("seed", json!(seed))
        .with_const("steps", json!(steps))
        .with_const("cfg", json!(cfg))
        .with_const("sampler_name", json!(sampler))
        .with_const("scheduler", json!(scheduler))
        .with_const("denoising_strength", json!(denoise))
        .with_const("inpaint_width", json!(d.inpaint.0))
        .with_const("inpaint_height", json!(d.inpaint.1))
        .with_const("inpaint_padding", json!(32))
        .with_const("mask_blur", json!(4));
    n = s.with_rng(n);
    let mut sampler_name = sampler.to_string();
    const MASK_KEYS: [&str; 12] = ["input_size", "confidence", "nms", "max_detections", "mask_k_largest", "mask_min_ratio", "mask_max_ratio", "dilate_erode", "x_offset", "y_offset", "mask_mode", "sort_by"];
    const DETAIL_KEYS: [&str; 5] = ["mask_blur", "inpaint_padding", "inpaint_width", "inpaint_height", "denoising_strength"];
    for part in extra.unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| invalid("--extra-ad-args", format!("`{part}` is not key=value")))?;
        let (k, v) = (k.trim(), v.trim());
        let value = serde_json::from_str::<Json>(v).unwrap_or_else(|_| json!(v));
        let on = value == json!(true);
        match k {
            _ if MASK_KEYS.contains(&k) => masks = masks.with_const(k, value),
            _ if DETAIL_KEYS.contains(&k) => n = n.with_const(k, value),
            // sd.cpp's boolean spellings of mask_mode.
            "merge_masks" if on => masks = masks.with_const("mask_mode", json!("merge")),
            "invert_mask" if on => masks = masks.with_const("mask_mode", json!("merge_invert")),
            "merge_masks" | "invert_mask" => {}
            // sd.cpp: zero steps and a negative cfg_scale inherit the main generation's.
            "steps" if value.as_i64().is_some_and(|s| s > 0) => n = n.with_const("steps", value),
            "cfg_scale" if value.as_f64().is_some_and(|c| c >= 0.0) => n = n.with_const("cfg", value),
            "steps" | "cfg_scale" => {}
            "sample_method" => {
                sampler_name = workflow_sampler_name(v).to_string();
                n = n.with_const("sampler_name", json!(sampler_name));
            }
            "scheduler" => n = n.with_const("scheduler", json!(workflow_scheduler_name(v))),
            _ => return Err(invalid("--extra-ad-args", format!("unknown key `{k}`"))),
        }
    }
    let masks = b.extra("ad_masks", "--ad-model", masks);
    if let Some(select) = s.select_node(&sampler_name) {
        let select = b.extra("ad_sampler", "--eta", select);
        n = n.with_input("sampler", InputValue::link(select, 0));
    }
    let key = b.extra("ad_detailer", "--ad-model", n.with_input("masks", InputValue::link(masks, 0)));
    Ok(Out(key, 0))
}


/// Builds the `adetailer` graph: detect in an existing image and re-sample the finds.
pub fn adetailer(p: &AdetailerParams) -> Result<Preset, PresetError> {
    check_range("--steps", p.steps, 1, 10000)?;
    check_unit("--strength", p.strength)?;
    let seed = resolve_seed(p.seed);
    let (sampler, scheduler) = sampler_names(&p.sampling_method, &p.scheduler);
    check_eta(p.eta)?;
    let sampling = Sampling { seed, cfg: p.cfg_scale, sampler: &sampler, scheduler: &scheduler, rng: p.rng.as_deref(), eta: p.eta, variation: None, noise_multiplier: 1.0 };
    let (prompt, loras) = extract_loras(&p.prompt)?;
    if !loras.is_empty() {
        return Err(not_supported("<lora:...>", "LoRA tags in adetailer prompts"));
    }
    let mut b = Builder::default();
    let ckpt = b.core("ckpt", "-m", NodeSpec::new("CheckpointLoaderSimple").with_const("ckpt_name", json!(p.model)));
    let (model, clip, vae) = (Out(ckpt.clone(), 0), Out(ckpt.clone(), 1), Out(ckpt, 2));
    let model = prediction_node(&mut b, &model, p.prediction.as_deref())?;
    let mut img = Out(b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(p.init_img))), 0);
    let (w, h) = (p.width.unwrap_or(0), p.height.unwrap_or(0));
    if w != 0 || h != 0 {
        check_range("-W", w, 0, 16384)?;
        check_range("-H", h, 0, 16384)?;
        // As img_gen's -i with -W/-H; one side alone keeps the aspect ratio.
        let resize = NodeSpec::new("ImageScale").with_input("image", link(&img)).with_const("upscale_method", json!("bicubic")).with_const("width", json!(w)).with_const("height", json!(h)).with_const("crop", json!("center"));
        img = Out(b.extra("resize", "-W/-H", resize), 0);
    }
    // The detail pass runs at the image's size (0), which -W/-H just set.
    let d = DetailSpec { prompt: &prompt, negative: &p.negative_prompt, ad_prompt: &p.ad_prompt, ad_negative: &p.ad_negative_prompt, inpaint: (0, 0) };
    let image = detailer(&mut b, &img, &model, &clip, &vae, &d, &p.ad_model, p.extra_ad_args.as_deref(), &sampling, p.steps, p.strength)?;
    b.core("save", "-o", NodeSpec::new("SaveImage").with_input("images", link(&image)).with_const("filename_prefix", json!(save_prefix(&p.output))));
    Ok(b.finish("ADetailer".into(), "sd-cli's adetailer mode: repairs an existing image. BboxDetectorMasks finds regions (faces, hands, ...) with the --ad-model detector and makes one mask per find; DetailerForEachMask then re-samples them in turn: each mask's box, padded by inpaint_padding, is cropped, inpainted at inpaint_width x inpaint_height (0: the image's size, as sd-cli; -W/-H resize the image first) with --strength and seed + mask index, and pasted back feathered by mask_blur. ad_prompt takes ADetailer's [SEP] (one prompt per mask), [PROMPT] (the main prompt) and [SKIP].".into()))
}
