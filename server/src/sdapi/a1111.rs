//! A1111's `/sdapi/v1/*` as sd-server has it: txt2img and img2img (each field's fate in
//! [`super::fields`]), the listing routes, options, progress and PNG info.

use std::sync::Arc;

use axum::extract::State;
use axum::Json as Reply;
use base64::Engine;
use sdflow_workflows::presets::{self, A1111Img2Img, HiresParams, RefinerParams, VariationParams};
use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::{base_params, controlnet, decode_b64, fields, generate, inpaint, pick_checkpoint, stem, AppStateRef, TempInputs, B64};
use crate::comfy::list_models;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::files::check_image;
use crate::state::AppState;

/// A1111's request fields for the sd-cli flags the presets name in their errors.
const A1111_FIELDS: &[(&str, &str)] = &[
    ("-W", "width"),
    ("-H", "height"),
    ("--steps", "steps"),
    ("--cfg-scale", "cfg_scale"),
    ("-s", "seed"),
    ("--subseed", "subseed"),
    ("--subseed-strength", "subseed_strength"),
    ("--refiner", "refiner_checkpoint"),
    ("--refiner-switch-at", "refiner_switch_at"),
    ("-b", "batch_size"),
    ("--clip-skip", "clip_skip"),
    ("--sampling-method", "sampler_name"),
    ("--scheduler", "scheduler"),
    ("--eta", "eta"),
    ("-p", "prompt"),
    ("-n", "negative_prompt"),
    ("--strength", "denoising_strength"),
    ("-i", "init_images"),
    ("--mask", "mask"),
    ("-m", "sd_model_checkpoint"),
    ("--hires", "enable_hr"),
    ("--hires-upscaler", "hr_upscaler"),
    ("--hires-scale", "hr_scale"),
    ("--hires-width", "hr_resize_x"),
    ("--hires-height", "hr_resize_y"),
    ("--hires-steps", "hr_second_pass_steps"),
    ("--hires-denoising-strength", "denoising_strength"),
    ("--circular", "tiling"),
    ("resize_mode", "resize_mode"),
    ("inpainting_fill", "inpainting_fill"),
    ("inpaint_full_res", "inpaint_full_res"),
    ("initial_noise_multiplier", "initial_noise_multiplier"),
];

/// A1111's sampler names (and sd-server's `k_` spellings) in ComfyUI's words; names it
/// does not know pass through for validation to judge.
fn comfy_sampler(name: &str) -> Option<String> {
    let lower = name.trim().to_ascii_lowercase();
    let mapped = match lower.as_str() {
        "" | "default" => return None,
        "euler a" | "k_euler_a" => "euler_ancestral",
        "euler" | "k_euler" => "euler",
        "heun" | "k_heun" => "heun",
        "dpm2" | "k_dpm_2" => "dpm_2",
        // A1111's LMS is k-diffusion's, as sd.cpp's is (ComfyUI's `lms` differs at the
        // last step).
        "lms" | "k_lms" => "k_lms",
        "dpm++ 2s a" | "k_dpmpp_2s_a" => "dpmpp_2s_ancestral",
        "dpm++ 2m" | "k_dpmpp_2m" => "dpmpp_2m",
        "dpm++ 2m sde" | "k_dpmpp_2m_sde" => "dpmpp_2m_sde",
        "lcm" => "lcm",
        "ddim" => "ddim",
        // sd-server's names, sd.cpp's maths.
        "ipndm" => "ipndm_sdcpp",
        "ipndm_v" => "ipndm_v_sdcpp",
        "res multistep" | "k_res_multistep" => "res_multistep",
        _ => return Some(name.trim().to_string()),
    };
    Some(mapped.to_string())
}

/// A1111's schedule types ("Automatic", "Karras", ...) in ComfyUI's words.
fn comfy_scheduler(name: &str) -> Option<String> {
    let lower = name.trim().to_ascii_lowercase();
    match lower.as_str() {
        "" | "automatic" | "default" => None,
        "uniform" | "discrete" => Some("normal".into()),
        "sgm uniform" => Some("sgm_uniform".into()),
        "kl optimal" => Some("kl_optimal".into()),
        "align your steps" => Some("ays".into()),
        other => Some(other.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(default)]
pub struct A1111Request {
    prompt: String,
    negative_prompt: String,
    width: Option<i64>,
    height: Option<i64>,
    steps: Option<i64>,
    cfg_scale: Option<f64>,
    sampler_name: String,
    /// A1111's older name for `sampler_name`.
    sampler_index: String,
    scheduler: String,
    /// A1111's eta: the noise of the ancestral samplers and DDIM's eta (unset: each
    /// sampler's own).
    eta: Option<f64>,
    seed: i64,
    /// A1111's variation seed (-1: random) and how far each image's noise turns towards
    /// its noise.
    subseed: i64,
    subseed_strength: f64,
    /// A1111's refiner: a checkpoint (as `sd_model_checkpoint` names one; empty or
    /// `None`: none) that takes over after `refiner_switch_at` of the steps.
    refiner_checkpoint: Option<String>,
    refiner_switch_at: Option<f64>,
    /// A1111's extensions' arguments: ControlNet's units (the rest are refused).
    alwayson_scripts: Json,
    batch_size: i64,
    /// Batches of `batch_size`: A1111 makes n_iter × batch_size images, seeds counting up.
    n_iter: i64,
    clip_skip: i64,
    denoising_strength: Option<f64>,
    enable_hr: bool,
    hr_scale: Option<f64>,
    hr_upscaler: String,
    /// A1111's name; sd-server's is `hr_steps`.
    hr_second_pass_steps: Option<i64>,
    hr_steps: Option<i64>,
    hr_resize_x: i64,
    hr_resize_y: i64,
    send_images: bool,
    /// sd-server's structured LoRAs: a file in `loras/` (with or without its extension)
    /// and its weight.
    lora: Vec<LoraItem>,
    init_images: Vec<String>,
    mask: Option<String>,
    inpainting_mask_invert: Json,
    mask_blur: Option<f64>,
    mask_blur_x: Option<f64>,
    mask_blur_y: Option<f64>,
    /// A1111's img2img options (its API's defaults when absent: resize mode 0, masked
    /// content 0 "fill", inpaint area "only masked" with padding 0, multiplier 1).
    resize_mode: Json,
    inpainting_fill: Json,
    inpaint_full_res: Json,
    inpaint_full_res_padding: Json,
    initial_noise_multiplier: Json,
    override_settings: Json,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoraItem {
    path: String,
    #[serde(default = "one")]
    multiplier: f64,
    #[serde(default)]
    is_high_noise: bool,
}

fn one() -> f64 {
    1.0
}

impl Default for A1111Request {
    fn default() -> Self {
        A1111Request {
            prompt: String::new(),
            negative_prompt: String::new(),
            width: None,
            height: None,
            steps: None,
            cfg_scale: None,
            sampler_name: String::new(),
            sampler_index: String::new(),
            scheduler: String::new(),
            eta: None,
            seed: -1,
            subseed: -1,
            subseed_strength: 0.0,
            refiner_checkpoint: None,
            refiner_switch_at: None,
            alwayson_scripts: Json::Null,
            batch_size: 1,
            n_iter: 1,
            clip_skip: -1,
            denoising_strength: None,
            enable_hr: false,
            hr_scale: None,
            hr_upscaler: String::new(),
            hr_second_pass_steps: None,
            hr_steps: None,
            hr_resize_x: 0,
            hr_resize_y: 0,
            send_images: true,
            lora: Vec::new(),
            init_images: Vec::new(),
            mask: None,
            inpainting_mask_invert: Json::Null,
            mask_blur: None,
            mask_blur_x: None,
            mask_blur_y: None,
            resize_mode: Json::Null,
            inpainting_fill: Json::Null,
            inpaint_full_res: Json::Null,
            inpaint_full_res_padding: Json::Null,
            initial_noise_multiplier: Json::Null,
            override_settings: Json::Null,
        }
    }
}

/// A whole-number field in `lo..=hi`, `default` when absent.
fn int_field(v: &Json, name: &str, default: i64, hi: i64) -> Result<i64, ApiError> {
    match v {
        Json::Null => Ok(default),
        v => v.as_i64().filter(|n| (0..=hi).contains(n)).ok_or_else(|| ApiError::bad(format!("`{name}`: {v} is not a whole number in 0..={hi}"))),
    }
}

/// A1111's `hr_upscaler` as the presets name it: a latent mode, `Nearest`, `Lanczos`
/// (also for A1111's `None`, which resizes with Lanczos), or a model of `upscale_models/`
/// by file name or stem.
pub(super) fn hr_upscaler(state: &AppState, name: &str, field: &str) -> Result<String, ApiError> {
    let name = name.trim();
    match name {
        "" => return Ok("Latent".into()),
        "None" => return Ok("Lanczos".into()),
        "Nearest" | "Lanczos" => return Ok(name.into()),
        n if n.starts_with("Latent") => return Ok(n.into()),
        _ => {}
    }
    let models = list_models(state, "upscale_models");
    models.iter().find(|m| *m == name || stem(m) == name).cloned().ok_or_else(|| {
        let have: Vec<&str> = models.iter().map(|m| stem(m)).collect();
        ApiError::bad(format!("`{field}`: no upscaler `{name}` (have: Latent modes, None, Nearest, Lanczos{}{})", if have.is_empty() { "" } else { ", " }, have.join(", ")))
    })
}

/// Every LoRA of `loras/` by the names a prompt tag may use (its path without extension,
/// and its bare stem), so `<lora:ink:0.8>` finds `style/ink.pt`.
pub(super) fn lora_files(state: &AppState) -> std::collections::BTreeMap<String, String> {
    let mut map = std::collections::BTreeMap::new();
    for file in list_models(state, "loras") {
        let no_ext = file.rsplit_once('.').map_or(file.as_str(), |(s, _)| s).to_string();
        map.entry(stem(&file).to_string()).or_insert_with(|| file.clone());
        map.entry(no_ext).or_insert(file);
    }
    map
}

async fn a1111(state: Arc<AppState>, body: Json, img2img: bool) -> Result<Reply<Json>, ApiError> {
    let map = body.as_object().ok_or_else(|| ApiError::bad("the request is not a JSON object"))?;
    fields::check(map).map_err(ApiError::bad)?;
    let req: A1111Request =
        serde_json::from_value(body.clone()).map_err(|e| ApiError::bad(format!("request: {e}")))?;
    fields::check_overrides(&req.override_settings).map_err(ApiError::bad)?;
    if req.prompt.is_empty() {
        return Err(ApiError::bad("`prompt` required"));
    }
    for (name, v) in [("batch_size", req.batch_size), ("n_iter", req.n_iter)] {
        if !(1..=100).contains(&v) {
            return Err(ApiError::bad(format!("`{name}`: {v} is outside 1..=100")));
        }
    }
    let overrides = &req.override_settings;
    let mut p = base_params(&state, overrides.get("sd_model_checkpoint").and_then(Json::as_str))?;
    let clip_skip = match overrides.get("CLIP_stop_at_last_layers") {
        Some(v) if req.clip_skip <= 0 => v.as_i64().ok_or_else(|| ApiError::bad(format!("`override_settings.CLIP_stop_at_last_layers`: {v} is not a whole number")))?,
        None if req.clip_skip <= 0 => state.sdapi_options.lock().clip_skip.unwrap_or(req.clip_skip),
        _ => req.clip_skip,
    };
    let sampler = if req.sampler_name.trim().is_empty() { &req.sampler_index } else { &req.sampler_name };
    p.prompt = req.prompt.clone();
    if !req.negative_prompt.is_empty() {
        p.negative_prompt = req.negative_prompt.clone();
    }
    if let Some(s) = comfy_sampler(sampler) {
        p.sampling_method = Some(s);
    }
    if let Some(s) = comfy_scheduler(&req.scheduler) {
        p.scheduler = Some(s);
    }
    p.eta = req.eta.or(p.eta);
    p.seed = presets::resolve_seed(req.seed);
    p.batch_count = req.batch_size * req.n_iter;
    // A1111's seeds: image i of the n_iter × batch_size images has seed + i (the seed
    // itself for all when there is a variation strength) and variation seed subseed + i;
    // each image's noise comes from its own seed (VariationNoise).
    if !(req.subseed_strength.is_finite() && (0.0..=1.0).contains(&req.subseed_strength)) {
        return Err(ApiError::bad(format!("`subseed_strength`: {} is outside 0..=1", req.subseed_strength)));
    }
    let subseed = presets::resolve_seed(req.subseed);
    if p.batch_count > 1 || req.subseed_strength != 0.0 {
        p.variation = Some(VariationParams { subseed, strength: req.subseed_strength });
    }
    // A1111's refiner; without `refiner_switch_at` A1111 switches at once.
    let refiner = req.refiner_checkpoint.as_deref().map(str::trim).filter(|n| !matches!(*n, "" | "None" | "none"));
    if let Some(name) = refiner {
        let model = pick_checkpoint(&state, Some(name)).map_err(|e| ApiError::bad(format!("`refiner_checkpoint`: {e}")))?;
        let switch_at = req.refiner_switch_at.unwrap_or(0.0);
        if !(switch_at.is_finite() && (0.0..=1.0).contains(&switch_at)) {
            return Err(ApiError::bad(format!("`refiner_switch_at`: {switch_at} is outside 0..=1")));
        }
        p.refiner = Some(RefinerParams { model, switch_at });
    }
    let count = p.batch_count;
    let all_seeds: Vec<i64> = (0..count).map(|i| if req.subseed_strength == 0.0 { p.seed + i } else { p.seed }).collect();
    let all_subseeds: Vec<i64> = (0..count).map(|i| subseed + i).collect();
    if clip_skip > 0 {
        p.clip_skip = clip_skip;
    }
    p.lora_files = lora_files(&state);
    p.output = "sdapi.png".into();
    for l in &req.lora {
        if l.is_high_noise {
            return Err(ApiError::bad(format!("`lora`: {}: high-noise LoRAs are for Wan2.2 video models", l.path)));
        }
        let name = l.path.rsplit_once('.').filter(|(_, ext)| !ext.contains('/')).map_or(l.path.as_str(), |(s, _)| s);
        if !p.lora_files.contains_key(name) {
            return Err(ApiError::bad(format!("`lora`: no LoRA `{}` in the loras folder", l.path)));
        }
        p.prompt.push_str(&format!(" <lora:{name}:{}>", l.multiplier));
    }
    if let Some(s) = req.steps {
        p.steps = s;
    }
    if let Some(c) = req.cfg_scale {
        p.cfg_scale = c;
    }
    match (req.width, req.height) {
        (Some(w), Some(h)) => {
            (p.width, p.height, p.size_given) = (w, h, true);
        }
        (None, None) => {}
        _ => return Err(ApiError::bad("`width` and `height` go together")),
    }
    if req.enable_hr {
        if img2img {
            return Err(ApiError::bad("`enable_hr`: the hires fix is a txt2img option"));
        }
        p.hires = HiresParams {
            enabled: true,
            upscaler: hr_upscaler(&state, &req.hr_upscaler, "hr_upscaler")?,
            scale: req.hr_scale.unwrap_or(2.0),
            width: req.hr_resize_x,
            height: req.hr_resize_y,
            steps: req.hr_second_pass_steps.or(req.hr_steps).unwrap_or(0),
            denoising_strength: req.denoising_strength.unwrap_or(0.7),
            ..HiresParams::default()
        };
    }
    let mut temp = TempInputs(Vec::new());
    // The output's size, which ControlNet's control images are fitted to.
    let mut size = (p.width, p.height);
    let mut init_bytes = None;
    let mut extra = serde_json::Map::new();
    if img2img {
        let first = req
            .init_images
            .first()
            .ok_or_else(|| ApiError::bad("img2img needs `init_images`"))?;
        let bytes = decode_b64(first, "init_images[0]")?;
        let (iw, ih) = check_image(&bytes, "init_images[0]")?;
        p.init_img = Some(temp.add(&state, &bytes, "init_images[0]", None)?);
        if !p.size_given {
            // Without a size the image keeps its own (A1111 would take 512x512).
            (p.width, p.height) = (i64::from(iw), i64::from(ih));
            size = (p.width, p.height);
        }
        init_bytes = Some(bytes);
        let mut a = A1111Img2Img { resize_mode: int_field(&req.resize_mode, "resize_mode", 0, 3)? as u8, ..A1111Img2Img::default() };
        a.noise_multiplier = match &req.initial_noise_multiplier {
            Json::Null => 1.0,
            v => v.as_f64().filter(|m| m.is_finite() && *m >= 0.0).ok_or_else(|| ApiError::bad(format!("`initial_noise_multiplier`: {v} is not a non-negative number")))?,
        };
        if a.noise_multiplier != 1.0 {
            extra.insert("Noise multiplier".into(), json!(a.noise_multiplier));
        }
        if let Some(mask) = req.mask.as_deref().filter(|m| !m.is_empty()) {
            let bytes = decode_b64(mask, "mask")?;
            let invert = match &req.inpainting_mask_invert {
                Json::Null => false,
                Json::Bool(b) => *b,
                v => v.as_i64().ok_or_else(|| ApiError::bad(format!("`inpainting_mask_invert`: {v} is not 0, 1 or a boolean")))? != 0,
            };
            // A1111's `mask_blur` sets both sides; else `mask_blur_x`/`_y`, 4 by default.
            let blur_x = req.mask_blur.or(req.mask_blur_x).unwrap_or(4.0);
            let blur_y = req.mask_blur.or(req.mask_blur_y).unwrap_or(4.0);
            for (name, v) in [("mask_blur_x", blur_x), ("mask_blur_y", blur_y)] {
                if !(0.0..=64.0).contains(&v) {
                    return Err(ApiError::bad(format!("`{}`: {v} is outside 0..=64", if req.mask_blur.is_some() { "mask_blur" } else { name })));
                }
            }
            let masked_content = int_field(&req.inpainting_fill, "inpainting_fill", 0, 3)?;
            let full_res = match &req.inpaint_full_res {
                Json::Null => true,
                Json::Bool(b) => *b,
                v => v.as_i64().filter(|n| (0..=1).contains(n)).ok_or_else(|| ApiError::bad(format!("`inpaint_full_res`: {v} is not a boolean, 0 or 1")))? != 0,
            };
            let padding = int_field(&req.inpaint_full_res_padding, "inpaint_full_res_padding", 0, 16384)?;
            check_image(&bytes, "mask")?;
            let img = image::load_from_memory(&bytes).map_err(|e| ApiError::bad(format!("mask: {e}")))?;
            let m = inpaint::blur(&inpaint::binary_mask(&img, invert), blur_x, blur_y);
            let mut masked = true;
            if full_res {
                if m.dimensions() != (iw, ih) {
                    return Err(ApiError::bad(format!("`mask`: {}x{} is not the size of init_images[0] ({iw}x{ih}), which inpaint area \"only masked\" (`inpaint_full_res`) cuts both at", m.width(), m.height())));
                }
                match inpaint::crop_region(&m, padding) {
                    Some(r) => {
                        let (x1, y1, x2, y2) = inpaint::expand_crop_region(r, p.width, p.height, i64::from(iw), i64::from(ih));
                        a.region = Some([x1, y1, x2 - x1, y2 - y1]);
                        extra.insert("Inpaint area".into(), json!("Only masked"));
                        extra.insert("Masked area padding".into(), json!(padding));
                    }
                    // A1111 runs a blank mask as plain img2img.
                    None => masked = false,
                }
            } else if m.dimensions() != (iw, ih) && !p.size_given {
                // A1111 fits the mask to the output size, which is the input's here.
                p.size_given = true;
            }
            if masked {
                if a.resize_mode == 3 && p.size_given && a.region.is_none() {
                    return Err(ApiError::bad("`resize_mode`: 3 (just resize, latent upscale) with a mask over the whole picture fails in A1111 (it lays the input back at its own size over a result of the new size); use 0, 1 or 2, or inpaint area only masked"));
                }
                a.masked_content = masked_content as u8;
                if masked_content != 1 {
                    extra.insert("Masked content".into(), json!(["fill", "original", "latent noise", "latent nothing"][masked_content as usize]));
                }
                if invert {
                    extra.insert("Mask mode".into(), json!("Inpaint not masked"));
                }
                if blur_x > 0.0 || blur_y > 0.0 {
                    // A1111's `mask_blur`: the blur when both sides have the same.
                    extra.insert("Mask blur".into(), if blur_x == blur_y { json!(blur_x) } else { Json::Null });
                }
                p.mask = Some(temp.store(&state, &image::DynamicImage::ImageLuma8(m), "mask")?);
            }
        }
        if a.resize_mode != 0 {
            extra.insert("Resize mode".into(), json!(["Just resize", "Crop and resize", "Resize and fill", "Just resize (latent upscale)"][usize::from(a.resize_mode)]));
        }
        p.a1111 = Some(a);
        if let Some(d) = req.denoising_strength {
            p.strength = d.min(1.0);
        }
    } else if !req.init_images.is_empty() || req.mask.is_some() {
        return Err(ApiError::bad("`init_images` and `mask` belong to img2img (/sdapi/v1/img2img)"));
    } else {
        // img2img's options, which change nothing in txt2img but at their defaults.
        for (name, v, default) in [("resize_mode", &req.resize_mode, 0.0), ("initial_noise_multiplier", &req.initial_noise_multiplier, 1.0)] {
            if !(v.is_null() || v.as_f64() == Some(default)) {
                return Err(ApiError::bad(format!("`{name}`: {v} is an img2img option (/sdapi/v1/img2img)")));
            }
        }
    }
    // A1111's `tiling` (checked a boolean by `fields`): seamless tiling on both axes.
    if body.get("tiling") == Some(&Json::Bool(true)) {
        (p.circular_x, p.circular_y) = (true, true);
    }
    match &req.alwayson_scripts {
        Json::Null => {}
        Json::Object(scripts) => {
            for (name, args) in scripts {
                if name.eq_ignore_ascii_case("controlnet") {
                    if p.a1111.as_ref().is_some_and(|a| a.region.is_some()) && !args.is_null() && args.get("args").and_then(Json::as_array).is_some_and(|a| !a.is_empty()) {
                        return Err(ApiError::bad("`alwayson_scripts.controlnet`: ControlNet units with inpaint area \"only masked\" (`inpaint_full_res`) are not supported (the extension crops the control image to the masked region); use inpaint_full_res: false"));
                    }
                    let (w, h) = (u32::try_from(size.0).unwrap_or(0), u32::try_from(size.1).unwrap_or(0));
                    if !(16..=16384).contains(&w) || !(16..=16384).contains(&h) {
                        return Err(ApiError::bad(format!("`width`, `height`: {}x{} is outside 16..=16384", size.0, size.1)));
                    }
                    let cx = controlnet::UnitContext { size: (w, h), init_image: init_bytes.as_deref(), hires: req.enable_hr };
                    p.controls = controlnet::units(&state, args, &cx, &mut temp)?;
                } else if !(args.is_null() || args.as_object().is_some_and(|o| o.is_empty())) {
                    return Err(ApiError::bad(format!("`alwayson_scripts.{name}`: A1111 scripts and extensions other than ControlNet are not supported")));
                }
            }
        }
        other => return Err(ApiError::bad(format!("`alwayson_scripts`: {other} is not an object of scripts"))),
    }
    let images = generate(&state, &p, A1111_FIELDS).await?;
    drop(temp);
    if let Some(r) = &p.refiner {
        extra.insert("Refiner".into(), json!(stem(&r.model)));
        extra.insert("Refiner switch at".into(), json!(r.switch_at));
        extra.insert("Refiner switch by sampling steps".into(), json!(true));
    }
    let info = json!({
        "prompt": p.prompt,
        "negative_prompt": p.negative_prompt,
        "seed": p.seed,
        "all_seeds": all_seeds,
        "subseed": subseed,
        "all_subseeds": all_subseeds,
        "subseed_strength": req.subseed_strength,
        "width": p.width,
        "height": p.height,
        "steps": p.steps,
        "cfg_scale": p.cfg_scale,
        "batch_size": req.batch_size,
        "n_iter": req.n_iter,
        "sampler_name": p.sampling_method.clone().unwrap_or_else(|| "euler_ancestral".into()),
        "scheduler": p.scheduler.clone().unwrap_or_else(|| "normal".into()),
        "denoising_strength": if img2img || req.enable_hr { json!(if img2img { p.strength } else { p.hires.denoising_strength }) } else { Json::Null },
        "sd_model_name": stem(p.model.as_deref().or(p.diffusion_model.as_deref()).unwrap_or("")),
        "extra_generation_params": Json::Object(extra),
        "version": concat!("sdflow ", env!("CARGO_PKG_VERSION")),
    });
    let sent = if req.send_images { images.iter().map(|b| B64.encode(b)).collect::<Vec<_>>() } else { Vec::new() };
    Ok(Reply(json!({
        "images": sent,
        "parameters": body,
        // A1111 sends `info` as a JSON document inside a string.
        "info": info.to_string(),
    })))
}

pub async fn txt2img(
    State(state): AppStateRef,
    JsonBody(body): JsonBody<Json>,
) -> Result<Reply<Json>, ApiError> {
    a1111(state, body, false).await
}

pub async fn img2img(
    State(state): AppStateRef,
    JsonBody(body): JsonBody<Json>,
) -> Result<Reply<Json>, ApiError> {
    a1111(state, body, true).await
}

pub async fn samplers() -> Reply<Json> {
    let list: Vec<Json> = sdflow_nodes::sampling::sampler_names()
        .into_iter()
        .map(|n| {
            let a1111 = a1111_name(&n);
            let mut aliases = vec![n.clone()];
            if a1111 != n {
                aliases.push(a1111.clone());
            }
            json!({ "name": n, "aliases": aliases, "options": {} })
        })
        .collect();
    Reply(json!(list))
}

fn a1111_name(comfy: &str) -> String {
    [
        "euler a",
        "euler",
        "heun",
        "dpm2",
        "lms",
        "dpm++ 2s a",
        "dpm++ 2m",
        "dpm++ 2m sde",
        "lcm",
        "ddim",
    ]
    .iter()
    .find(|a| comfy_sampler(a).as_deref() == Some(comfy))
    .map(|a| a.to_string())
    .unwrap_or_else(|| comfy.to_string())
}

pub async fn schedulers() -> Reply<Json> {
    let list: Vec<Json> = sdflow_nodes::sampling::scheduler_names()
        .into_iter()
        .map(|n| json!({ "name": n, "label": n, "aliases": [n] }))
        .collect();
    Reply(json!(list))
}

pub async fn sd_models(State(state): AppStateRef) -> Reply<Json> {
    let list: Vec<Json> = list_models(&state, "checkpoints")
        .into_iter()
        .map(|m| json!({ "title": m, "model_name": stem(&m), "hash": null, "sha256": null, "filename": m, "config": null }))
        .collect();
    Reply(json!(list))
}

pub async fn loras(State(state): AppStateRef) -> Reply<Json> {
    let list: Vec<Json> = list_models(&state, "loras")
        .into_iter()
        .map(|m| json!({ "name": stem(&m), "path": m }))
        .collect();
    Reply(json!(list))
}

pub async fn upscalers(State(state): AppStateRef) -> Reply<Json> {
    let mut list: Vec<Json> = ["None", "Lanczos", "Nearest"]
        .iter()
        .map(|n| json!({ "name": n, "model_name": null, "model_path": null, "model_url": null, "scale": 4 }))
        .collect();
    for m in list_models(&state, "upscale_models") {
        let mut entry =
            json!({ "name": stem(&m), "model_name": stem(&m), "model_path": m, "model_url": null });
        // A file whose scale cannot be read from its header gets none rather than a guess;
        // loading it is where its error is reported.
        if let Some(scale) = upscaler_scale(&state, &m) {
            entry["scale"] = json!(scale);
        }
        list.push(entry);
    }
    Reply(json!(list))
}

/// A1111's latent upscale modes, the `hr_upscaler` names the hires fix takes.
pub async fn latent_upscale_modes() -> Reply<Json> {
    let modes = ["Latent", "Latent (antialiased)", "Latent (bicubic)", "Latent (bicubic antialiased)", "Latent (nearest)", "Latent (nearest-exact)"];
    Reply(json!(modes.iter().map(|m| json!({ "name": m })).collect::<Vec<_>>()))
}

/// The textual-inversion embeddings of `embeddings/`, by the name a prompt uses.
pub async fn embeddings(State(state): AppStateRef) -> Reply<Json> {
    let loaded: serde_json::Map<String, Json> = list_models(&state, "embeddings").iter().map(|f| (stem(f).to_string(), json!({ "step": null, "sd_checkpoint": null, "sd_checkpoint_name": null }))).collect();
    Reply(json!({ "loaded": loaded, "skipped": {} }))
}

/// The options sdflow keeps (the model, CLIP skip) and the fixed ones clients read.
pub async fn get_options(State(state): AppStateRef) -> Reply<Json> {
    let options = state.sdapi_options.lock().clone();
    let model = pick_checkpoint(&state, None).ok();
    Reply(json!({
        "sd_model_checkpoint": model.as_deref().map(stem),
        "CLIP_stop_at_last_layers": options.clip_skip.unwrap_or(1),
        "samples_format": "png",
        "sd_vae": "Automatic",
    }))
}

/// Sets the model later requests use when they name none (`sd_model_checkpoint`, checked
/// against `checkpoints/`) and CLIP skip; other options as `override_settings` takes them.
pub async fn post_options(State(state): AppStateRef, JsonBody(body): JsonBody<Json>) -> Result<Reply<Json>, ApiError> {
    fields::check_overrides(&body).map_err(ApiError::bad)?;
    let model = match body.get("sd_model_checkpoint") {
        None => None,
        Some(v) => Some(pick_checkpoint(&state, Some(v.as_str().ok_or_else(|| ApiError::bad(format!("`sd_model_checkpoint`: {v} is not a string")))?))?),
    };
    let clip_skip = match body.get("CLIP_stop_at_last_layers") {
        None => None,
        Some(v) => Some(v.as_i64().filter(|n| (1..=12).contains(n)).ok_or_else(|| ApiError::bad(format!("`CLIP_stop_at_last_layers`: {v} is not a whole number in 1..=12")))?),
    };
    let mut options = state.sdapi_options.lock();
    if model.is_some() {
        options.checkpoint = model;
    }
    if clip_skip.is_some() {
        options.clip_skip = clip_skip;
    }
    Ok(Reply(Json::Null))
}

/// The running prompt's progress, A1111's way: the fraction of its current sampler's
/// steps, the time left at that pace, the queue, and the latest preview.
pub async fn progress(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    let (running, pending) = state.queue.snapshot()?;
    // Copied out (the preview's pixels are shared, not copied) so the sampler's events
    // never wait on the encoding below.
    let (job, started, step, preview) = {
        let live = state.live.lock();
        (live.prompt_id.clone(), live.started, live.step, live.preview.clone())
    };
    let (step, steps) = step.unwrap_or((0, 0));
    let fraction = if steps > 0 { step as f64 / steps as f64 } else { 0.0 };
    let elapsed = started.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let eta = if fraction > 0.0 { elapsed / fraction - elapsed } else { 0.0 };
    let current_image = preview.and_then(|p| {
        let mut image = Vec::new();
        crate::ws::write_preview_image(&p, &mut image).ok().map(|_| B64.encode(&image))
    });
    Ok(Reply(json!({
        "progress": fraction,
        "eta_relative": eta,
        "state": {
            "skipped": false,
            "interrupted": false,
            "job": job.unwrap_or_default(),
            "job_count": running.len() + pending.len(),
            "job_timestamp": "",
            "job_no": 0,
            "sampling_step": step,
            "sampling_steps": steps,
        },
        "current_image": current_image,
        "textinfo": null,
    })))
}

/// A1111's interrupt, and its skip: both stop the running prompt (sdflow runs a request's
/// whole batch as one prompt, so there is no single image to skip to the next of).
pub async fn interrupt(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    state.queue.interrupt(None)?;
    Ok(Reply(json!({})))
}

/// A1111's script lists: of the extensions sdflow has ControlNet (its `alwayson_scripts`
/// units); no other script runs, which is how clients probing for extensions learn they
/// are absent.
pub async fn scripts() -> Reply<Json> {
    Reply(json!({ "txt2img": ["controlnet"], "img2img": ["controlnet"] }))
}

/// Model lists are read from the folders on every request: nothing to refresh.
pub async fn refresh() -> Reply<Json> {
    Reply(Json::Null)
}

/// A1111's PNG info: the image's generation text (`parameters`), that text's fields, and
/// every other text entry (ComfyUI's `prompt` and `workflow` included).
pub async fn png_info(JsonBody(body): JsonBody<Json>) -> Result<Reply<Json>, ApiError> {
    let image = body.get("image").and_then(Json::as_str).ok_or_else(|| ApiError::bad("`image` required (a base64 image)"))?;
    let bytes = decode_b64(image, "image")?;
    let meta = sdflow_workflows::metadata::parse_metadata(&bytes).map_err(|e| ApiError::bad(format!("`image`: {e}")))?;
    let info = meta.entries.iter().find(|e| e.key == "parameters").map(|e| e.text.clone()).unwrap_or_default();
    let items: serde_json::Map<String, Json> = meta.entries.iter().filter(|e| e.key != "parameters").map(|e| (e.key.clone(), json!(e.text))).collect();
    Ok(Reply(json!({ "info": info, "items": items, "parameters": infotext_fields(&info) })))
}

/// A1111's generation text as its fields: `Prompt`, `Negative prompt`, then each
/// `Key: value` of the last line (values in quotes may hold commas).
fn infotext_fields(text: &str) -> serde_json::Map<String, Json> {
    let mut out = serde_json::Map::new();
    if text.trim().is_empty() {
        return out;
    }
    let mut lines: Vec<&str> = text.trim_end().lines().collect();
    let last = lines.last().copied().unwrap_or("");
    let settings = last.contains("Steps: ");
    if settings {
        lines.pop();
    }
    let (mut prompt, mut negative) = (Vec::new(), Vec::new());
    let mut in_negative = false;
    for line in lines {
        if let Some(rest) = line.strip_prefix("Negative prompt:") {
            in_negative = true;
            negative.push(rest.trim_start());
        } else if in_negative {
            negative.push(line);
        } else {
            prompt.push(line);
        }
    }
    out.insert("Prompt".into(), json!(prompt.join("\n")));
    out.insert("Negative prompt".into(), json!(negative.join("\n")));
    if settings {
        let mut rest = last;
        while let Some((key, after)) = rest.split_once(": ") {
            let key = key.trim_start_matches([',', ' ']).to_string();
            let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
                let end = quoted.find('"').unwrap_or(quoted.len());
                (&quoted[..end], quoted.get(end + 1..).unwrap_or(""))
            } else {
                after.split_once(", ").map_or((after, ""), |(v, n)| (v, n))
            };
            out.insert(key, json!(value.trim()));
            rest = next;
        }
    }
    out
}

/// The upscale factor of model `name`, from the tensor shapes in its header.
fn upscaler_scale(state: &AppState, name: &str) -> Option<i64> {
    let path = state.runtime.resolve_model("upscale_models", name).ok()?;
    let src = sdflow_core::io::open(&path)
        .map_err(|e| tracing::debug!("{name}: {e}"))
        .ok()?;
    sdflow_core::models::esrgan::scale_of(src.as_ref())
        .map_err(|e| tracing::debug!("{name}: {e}"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infotext_splits_into_a1111s_fields() {
        let f = infotext_fields("a cat, oil\npainting\nNegative prompt: blurry\nSteps: 20, Sampler: DPM++ 2M, Lora hashes: \"ink: 1a2b, pen: 3c\", Seed: 5, Size: 512x768");
        assert_eq!(f["Prompt"], "a cat, oil\npainting");
        assert_eq!(f["Negative prompt"], "blurry");
        assert_eq!(f["Steps"], "20");
        assert_eq!(f["Sampler"], "DPM++ 2M");
        assert_eq!(f["Lora hashes"], "ink: 1a2b, pen: 3c");
        assert_eq!(f["Seed"], "5");
        assert_eq!(f["Size"], "512x768");
        assert!(infotext_fields("").is_empty());
    }
}
