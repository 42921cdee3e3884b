//! sd-server's native request body (`/sdcpp/v1/img_gen`, `/sdcpp/v1/vid_gen`: the schema
//! of `sd_cpp_extra_args`) as the presets' [`ImgGenParams`]. Every field is read on its
//! own, so a wrong type, a value out of range or a field sdflow cannot honour is a 400
//! naming the field by its path (`sample_params.guidance.txt_cfg`).

use std::sync::Arc;

use sdflow_workflows::presets::{self, Family, ImgGenParams, VideoParams, SD_SAMPLERS, SD_SCHEDULERS};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value as Json};

use super::sdcpp_jobs::{Kind, Output};
use super::{a1111, base_params, decode_b64, stem, MaskRule, TempInputs};
use crate::comfy::list_models;
use crate::error::ApiError;
use crate::files::check_image;
use crate::state::AppState;

/// The request fields for the sd-cli flags the presets name in their errors.
pub(super) const SDCPP_FIELDS: &[(&str, &str)] = &[
    ("-W", "width"),
    ("-H", "height"),
    ("--steps", "sample_params.sample_steps"),
    ("--cfg-scale", "sample_params.guidance.txt_cfg"),
    ("--img-cfg-scale", "sample_params.guidance.img_cfg"),
    ("--guidance", "sample_params.guidance.distilled_guidance"),
    ("--slg-scale", "sample_params.guidance.slg.scale"),
    ("--skip-layers", "sample_params.guidance.slg.layers"),
    ("--skip-layer-start", "sample_params.guidance.slg.layer_start"),
    ("--skip-layer-end", "sample_params.guidance.slg.layer_end"),
    ("--sampling-method", "sample_params.sample_method"),
    ("--scheduler", "sample_params.scheduler"),
    ("--eta", "sample_params.eta"),
    ("--sigmas", "sample_params.custom_sigmas"),
    ("--flow-shift", "sample_params.flow_shift"),
    ("-s", "seed"),
    ("-b", "batch_count"),
    ("--clip-skip", "clip_skip"),
    ("-p", "prompt"),
    ("-n", "negative_prompt"),
    ("--strength", "strength"),
    ("-i", "init_image"),
    ("--mask", "mask_image"),
    ("--control-net", "control_image"),
    ("--control-image", "control_image"),
    ("--control-strength", "control_strength"),
    ("-r", "ref_images"),
    ("--increase-ref-index", "increase_ref_index"),
    ("-m", "model"),
    ("--hires", "hires.enabled"),
    ("--hires-upscaler", "hires.upscaler"),
    ("--hires-scale", "hires.scale"),
    ("--hires-width", "hires.target_width"),
    ("--hires-height", "hires.target_height"),
    ("--hires-steps", "hires.steps"),
    ("--hires-denoising-strength", "hires.denoising_strength"),
    ("--hires-sigmas", "hires.custom_sigmas"),
    ("--hires-upscale-tile-size", "hires.upscale_tile_size"),
    ("--vae-tiling", "vae_tiling_params.enabled"),
    ("--vae-tile-size", "vae_tiling_params.tile_size_x"),
    ("--vae-tile-overlap", "vae_tiling_params.target_overlap"),
    ("--vae-relative-tile-size", "vae_tiling_params.rel_size_x"),
    ("--qwen-image-layers", "qwen_image_layers"),
    ("--video-frames", "video_frames"),
    ("--fps", "fps"),
    ("--end-img", "end_image"),
    ("--control-video", "control_frames"),
    ("--vace-strength", "vace_strength"),
    ("--motion-module", "motion_module"),
    ("--clip_vision", "init_image"),
];

/// Fields of both modes. `model` (a checkpoint) is sdflow's: sd-server serves one model.
const COMMON: &[&str] = &[
    "prompt", "negative_prompt", "clip_skip", "width", "height", "strength", "seed", "sample_params", "lora", "hires", "vae_tiling_params", "cache_mode", "cache_option", "scm_mask", "scm_policy_dynamic",
    "output_format", "output_compression", "init_image", "model",
];
const IMG_ONLY: &[&str] = &[
    "batch_count", "auto_resize_ref_image", "increase_ref_index", "control_strength", "ip_adapter_strength", "embed_image_metadata", "ref_images", "mask_image", "control_image", "ip_adapter_image",
    "qwen_image_layers",
];
/// `motion_module` (a file of `animatediff_models/`) is sdflow's, for AnimateDiff.
const VID_ONLY: &[&str] = &["video_frames", "fps", "moe_boundary", "vace_strength", "end_image", "control_frames", "high_noise_sample_params", "motion_module"];

/// sd-server's limits, which `/sdcpp/v1/capabilities` reports (sdflow's smallest side is
/// 16: its tests run tiny models).
pub(super) const MIN_SIDE: i64 = 16;
pub(super) const MAX_SIDE: i64 = 4096;
pub(super) const MAX_BATCH: i64 = 8;
const MAX_FRAMES: i64 = 1000;

/// One JSON object of the request, read field by field so each error names its field.
struct Obj<'a> {
    map: &'a Map<String, Json>,
    path: String,
}

impl<'a> Obj<'a> {
    fn name(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn bad(&self, key: &str, msg: impl std::fmt::Display) -> ApiError {
        ApiError::bad(format!("`{}`: {msg}", self.name(key)))
    }

    /// The field as a `T`; absent or null is `None`.
    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ApiError> {
        match self.map.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => T::deserialize(v).map(Some).map_err(|e| self.bad(key, e)),
        }
    }

    /// A number field that must be finite and within `lo..=hi`.
    fn num(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.get::<f64>(key)? {
            Some(v) if !(v.is_finite() && (lo..=hi).contains(&v)) => Err(self.bad(key, format!("{v} is outside {lo}..={hi}"))),
            v => Ok(v),
        }
    }

    /// A whole-number field within `lo..=hi`.
    fn int(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.get::<i64>(key)? {
            Some(v) if !(lo..=hi).contains(&v) => Err(self.bad(key, format!("{v} is outside {lo}..={hi}"))),
            v => Ok(v),
        }
    }

    fn obj(&self, key: &str, known: &[&str]) -> Result<Option<Obj<'a>>, ApiError> {
        match self.map.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::Object(map)) => {
                let o = Obj { map, path: self.name(key) };
                o.known(known)?;
                Ok(Some(o))
            }
            Some(v) => Err(self.bad(key, format!("{v} is not an object"))),
        }
    }

    /// Refuses the first field not in `known`.
    fn known(&self, known: &[&str]) -> Result<(), ApiError> {
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(ApiError::bad(format!("unknown field `{}` (sdflow's sdcpp API takes {})", self.name(k), known.join(", ")))),
            None => Ok(()),
        }
    }

    /// A field only its off value is accepted for (`why` says what sdflow lacks).
    fn off_only(&self, key: &str, is_off: impl Fn(&Json) -> bool, why: &str) -> Result<(), ApiError> {
        match self.map.get(key) {
            Some(v) if !v.is_null() && !is_off(v) => Err(self.bad(key, format!("{v} is not supported ({why})"))),
            _ => Ok(()),
        }
    }
}

/// A request made ready to queue: its parameters, the input files written for it (removed
/// once it has run) and how its result is encoded.
pub(super) struct Request {
    pub params: ImgGenParams,
    pub temp: TempInputs,
    pub output: Output,
}

/// The model a request runs on (`model`, else the server's default) and the modes it
/// supports: sd.cpp's video models only make videos; an SD checkpoint makes videos with an
/// AnimateDiff motion module.
pub(super) fn model_params(state: &AppState, model: Option<&str>) -> Result<(ImgGenParams, bool, bool), ApiError> {
    let p = base_params(state, model).map_err(|e| if model.is_some() { ApiError::bad(format!("`model`: {e}")) } else { e })?;
    let wan = p.model_info.family == Family::Wan;
    let animatediff = p.model_info.family == Family::Unet && !list_models(state, "animatediff_models").is_empty();
    Ok((p, !wan, wan || animatediff))
}

/// Reads a request body of `kind` into a [`Request`].
pub(super) fn request(state: &Arc<AppState>, body: &Json, kind: Kind) -> Result<Request, ApiError> {
    let map = body.as_object().ok_or_else(|| ApiError::bad("the request body is not a JSON object"))?;
    let o = Obj { map, path: String::new() };
    let own = if kind == Kind::Img { IMG_ONLY } else { VID_ONLY };
    o.known(&[COMMON, own].concat())?;
    let model = o.get::<String>("model")?;
    let (mut p, img, vid) = model_params(state, model.as_deref())?;
    match kind {
        Kind::Img if !img => return Err(ApiError::bad("loaded model does not support img_gen (it is a video model: use /sdcpp/v1/vid_gen)")),
        Kind::Vid if !vid => return Err(ApiError::bad("loaded model does not support vid_gen (vid_gen runs Wan models, and SD1.x checkpoints with an AnimateDiff motion module in models/animatediff_models)")),
        _ => {}
    }
    let mut temp = TempInputs(Vec::new());

    if let Some(prompt) = o.get::<String>("prompt")? {
        p.prompt = prompt;
    }
    // sd-server reads LoRAs from `lora` only; a tag would be the preset's to read here.
    if p.prompt.contains("<lora:") {
        return Err(o.bad("prompt", "<lora:…> tags are not read by the sdcpp API; list LoRAs in `lora`"));
    }
    if let Some(n) = o.get::<String>("negative_prompt")? {
        p.negative_prompt = n;
    }
    if let Some(c) = o.int("clip_skip", -1, 24)? {
        p.clip_skip = c;
    }
    let width = o.int("width", MIN_SIDE, MAX_SIDE)?;
    let height = o.int("height", MIN_SIDE, MAX_SIDE)?;
    if let Some(w) = width {
        (p.width, p.size_given) = (w, true);
    }
    if let Some(h) = height {
        (p.height, p.size_given) = (h, true);
    }
    if let Some(s) = o.num("strength", 0.0, 1.0)? {
        p.strength = s;
    }
    if let Some(s) = o.get::<i64>("seed")? {
        p.seed = s;
    }
    p.seed = presets::resolve_seed(p.seed);
    if let Some(sp) = o.obj("sample_params", SAMPLE_KEYS)? {
        sample_params(&sp, &mut p, true)?;
    }
    loras(state, &o, &mut p)?;
    hires(state, &o, &mut p)?;
    tiling(&o, &mut p)?;
    o.off_only("cache_mode", |v| matches!(v.as_str(), Some("" | "disabled")), "step caching (easycache, ucache, dbcache, cache-dit, ...) is not implemented; use `disabled`")?;
    for key in ["cache_option", "scm_mask"] {
        o.off_only(key, |v| v.as_str() == Some(""), "step caching is not implemented")?;
    }
    o.get::<bool>("scm_policy_dynamic")?;

    // An image field stored for LoadImage: its name there and its size.
    type Stored = Option<(String, (u32, u32))>;
    let image = |key: &str, temp: &mut TempInputs, mask: Option<MaskRule>| -> Result<Stored, ApiError> {
        let Some(b64) = o.get::<String>(key)? else { return Ok(None) };
        let bytes = decode_b64(&b64, &format!("`{key}`"))?;
        let size = check_image(&bytes, &format!("`{key}`"))?;
        Ok(Some((temp.add(state, &bytes, &format!("`{key}`"), mask)?, size)))
    };
    if let Some((name, (w, h))) = image("init_image", &mut temp, None)? {
        p.init_img = Some(name);
        // Without a size the image keeps its own.
        if width.is_none() && height.is_none() {
            (p.width, p.height) = (i64::from(w), i64::from(h));
        }
    }

    let format = o.get::<String>("output_format")?.map(|f| f.to_ascii_lowercase());
    let compression = o.get::<i64>("output_compression")?.unwrap_or(100).clamp(0, 100);
    let output = match kind {
        Kind::Img => {
            if let Some(b) = o.int("batch_count", 1, MAX_BATCH)? {
                p.batch_count = b;
            }
            if let Some(b) = o.get::<bool>("auto_resize_ref_image")? {
                p.auto_resize_ref_image = b;
            }
            if let Some(b) = o.get::<bool>("increase_ref_index")? {
                p.increase_ref_index = b;
            }
            if let Some(s) = o.num("control_strength", 0.0, 10.0)? {
                p.control_strength = s;
            }
            o.num("ip_adapter_strength", 0.0, 10.0)?;
            o.off_only("ip_adapter_image", |_| false, "sd-server's IP-Adapter (--ip-adapter) is not implemented; the IPAdapter nodes run it in a workflow")?;
            if let Some(l) = o.int("qwen_image_layers", 1, 64)? {
                p.qwen_image_layers = l;
            }
            if let Some((name, _)) = image("mask_image", &mut temp, Some(MaskRule::Luma))? {
                p.mask = Some(name);
            }
            if let Some((name, _)) = image("control_image", &mut temp, None)? {
                p.control_image = Some(name);
            }
            for (i, b64) in o.get::<Vec<String>>("ref_images")?.unwrap_or_default().iter().enumerate() {
                let what = format!("`ref_images[{i}]`");
                let bytes = decode_b64(b64, &what)?;
                let (w, h) = check_image(&bytes, &what)?;
                p.ref_images.push(temp.add(state, &bytes, &what, None)?);
                p.ref_sizes.push((i64::from(w), i64::from(h)));
            }
            let format = format.unwrap_or_else(|| "png".into());
            if !IMG_FORMATS.contains(&format.as_str()) {
                return Err(o.bad("output_format", format!("`{format}` is not one of {}", IMG_FORMATS.join(", "))));
            }
            p.output = "sdcpp.png".into();
            Output { kind, format, compression, embed_metadata: o.get::<bool>("embed_image_metadata")?.unwrap_or(true), fps: 0 }
        }
        Kind::Vid => {
            let frames = o.int("video_frames", 1, MAX_FRAMES)?.unwrap_or(1);
            let fps = o.int("fps", 1, 1000)?.unwrap_or(16);
            let defaults = &state.config.video_defaults;
            let mut high_noise = defaults.high_noise.clone().filter(|_| p.model_info.family == Family::Wan);
            let boundary = o.num("moe_boundary", 0.0, 1.0)?;
            if let Some(v) = o.num("vace_strength", 0.0, 10.0)? {
                p.vace_strength = v;
            }
            // sd-server's high-noise pass: its --high-noise-diffusion-model sampled with
            // these (read without one too, so mistakes are named).
            let hp = o.obj("high_noise_sample_params", SAMPLE_KEYS)?;
            if let Some(h) = high_noise.as_mut() {
                let mut q = p.clone();
                (q.steps, q.cfg_scale, q.sampling_method, q.eta) = (h.steps, h.cfg_scale, h.sampling_method.clone(), h.eta);
                if let Some(hp) = &hp {
                    sample_params(hp, &mut q, false)?;
                }
                (h.steps, h.cfg_scale, h.sampling_method, h.eta) = (q.steps, q.cfg_scale, q.sampling_method, q.eta);
                if let Some(b) = boundary {
                    h.boundary = b;
                }
            } else if let Some(hp) = &hp {
                sample_params(hp, &mut p.clone(), false)?;
            }
            if let Some((name, _)) = image("end_image", &mut temp, None)? {
                p.end_img = Some(name);
            }
            let control: Vec<String> = o.get("control_frames")?.unwrap_or_default();
            if !control.is_empty() {
                let frames: Vec<Vec<u8>> = control.iter().enumerate().map(|(i, f)| decode_b64(f, &format!("`control_frames[{i}]`"))).collect::<Result<_, _>>()?;
                p.control_video = Some(temp.add_folder(state, &frames, "`control_frames`")?);
            }
            let mut video = VideoParams { frames, fps, high_noise, ..VideoParams::default() };
            if p.model_info.family == Family::Unet {
                let modules = list_models(state, "animatediff_models");
                let module = match o.get::<String>("motion_module")? {
                    Some(m) => modules.iter().find(|f| **f == m || stem(f) == m).cloned().ok_or_else(|| o.bad("motion_module", format!("no motion module `{m}` in animatediff_models (have: {})", modules.join(", "))))?,
                    None => defaults.motion_module.clone().unwrap_or_else(|| modules[0].clone()),
                };
                video.motion_module = Some(module);
                // sd.cpp samples AnimateDiff's frames as one latent batch.
                p.batch_count = video.aligned_frames();
            } else {
                o.off_only("motion_module", |_| false, "motion modules animate SD1.x checkpoints; this is a video model")?;
            }
            p.video = Some(video);
            // The frames come back as PNGs and are put in the container here, at the
            // request's quality, as sd-server encodes them.
            p.output = "sdcpp_%05d.png".into();
            let format = format.unwrap_or_else(|| "webm".into());
            if !VID_FORMATS.contains(&format.as_str()) {
                return Err(o.bad("output_format", format!("`{format}` is not one of {}", VID_FORMATS.join(", "))));
            }
            Output { kind, format, compression, embed_metadata: false, fps }
        }
    };
    Ok(Request { params: p, temp, output })
}

pub(super) const IMG_FORMATS: [&str; 3] = ["png", "jpeg", "webp"];
pub(super) const VID_FORMATS: [&str; 3] = ["webm", "webp", "avi"];

const SAMPLE_KEYS: &[&str] = &["scheduler", "sample_method", "sample_steps", "eta", "shifted_timestep", "custom_sigmas", "flow_shift", "guidance", "extra_sample_args"];

/// `sample_params` (or, `main` false, `high_noise_sample_params`, whose steps may be -1).
fn sample_params(o: &Obj, p: &mut ImgGenParams, main: bool) -> Result<(), ApiError> {
    if let Some(m) = o.get::<String>("sample_method")? {
        p.sampling_method = sampler(&m).map_err(|e| o.bad("sample_method", e))?;
    }
    if let Some(s) = o.get::<String>("scheduler")? {
        p.scheduler = scheduler(&s).map_err(|e| o.bad("scheduler", e))?;
    }
    if let Some(s) = o.int("sample_steps", if main { 1 } else { -1 }, 10_000)? {
        p.steps = s;
    }
    if let Some(e) = o.num("eta", -1e3, 1e3)? {
        p.eta = Some(e);
    }
    o.off_only("shifted_timestep", |v| v.as_i64() == Some(0), "NitroFusion timestep shifting is not implemented")?;
    o.off_only("extra_sample_args", |v| v.as_str() == Some(""), "no extra sampler arguments are read")?;
    if let Some(s) = o.get::<Vec<f32>>("custom_sigmas")? {
        if s.iter().any(|x| !x.is_finite()) {
            return Err(o.bad("custom_sigmas", "holds a number that is not finite"));
        }
        p.sigmas = (!s.is_empty()).then_some(s);
    }
    if let Some(f) = o.num("flow_shift", -1e3, 1e3)? {
        p.flow_shift = Some(f);
    }
    let Some(g) = o.obj("guidance", &["txt_cfg", "img_cfg", "distilled_guidance", "slg"])? else { return Ok(()) };
    if let Some(c) = g.num("txt_cfg", -1e3, 1e3)? {
        p.cfg_scale = c;
    }
    // sd.cpp reads img_cfg only with an instruct-pix2pix model, as txt_cfg when unset:
    // the same value (what clients echo) leaves it off.
    if let Some(c) = g.num("img_cfg", -1e3, 1e3)? {
        if c != p.cfg_scale {
            p.img_cfg_scale = Some(c);
        }
    }
    if let Some(d) = g.num("distilled_guidance", -1e3, 1e3)? {
        p.guidance = d;
    }
    if let Some(slg) = g.obj("slg", &["layers", "layer_start", "layer_end", "scale"])? {
        if let Some(l) = slg.get::<Vec<i64>>("layers")? {
            p.slg.layers = l;
        }
        if let Some(v) = slg.num("layer_start", 0.0, 1.0)? {
            p.slg.start = v;
        }
        if let Some(v) = slg.num("layer_end", 0.0, 1.0)? {
            p.slg.end = v;
        }
        if let Some(v) = slg.num("scale", -1e3, 1e3)? {
            p.slg.scale = v;
        }
    }
    Ok(())
}

/// An sd.cpp (or ComfyUI) sampler name as the workflow spells it; `default` (what
/// capabilities reports for an unset one) leaves the model's.
pub(super) fn sampler(name: &str) -> Result<Option<String>, String> {
    if matches!(name, "" | "default") {
        return Ok(None);
    }
    let w = presets::workflow_sampler_name(name);
    w.parse::<sdflow_core::sampling::Sampler>().map(|_| Some(w.to_string())).map_err(|_| format!("unknown sampler `{name}` (have: {})", sd_samplers().join(", ")))
}

pub(super) fn scheduler(name: &str) -> Result<Option<String>, String> {
    if matches!(name, "" | "default") {
        return Ok(None);
    }
    let w = presets::workflow_scheduler_name(name);
    w.parse::<sdflow_core::sampling::Scheduler>().map(|_| Some(w.to_string())).map_err(|_| format!("unknown scheduler `{name}` (have: {})", sd_schedulers().join(", ")))
}

/// sd.cpp's sampler names sdflow runs.
pub(super) fn sd_samplers() -> Vec<&'static str> {
    SD_SAMPLERS.iter().copied().filter(|s| presets::workflow_sampler_name(s).parse::<sdflow_core::sampling::Sampler>().is_ok()).collect()
}

/// sd.cpp's scheduler names sdflow runs, with `normal` after `discrete` as sd-server lists them.
pub(super) fn sd_schedulers() -> Vec<&'static str> {
    let mut out = Vec::new();
    for s in SD_SCHEDULERS.iter().copied().filter(|s| presets::workflow_scheduler_name(s).parse::<sdflow_core::sampling::Scheduler>().is_ok()) {
        out.push(s);
        if s == "discrete" {
            out.push("normal");
        }
    }
    out
}

/// The sd.cpp name of a workflow's sampler / scheduler name (`default` when unset).
pub(super) fn sd_sampler_name(workflow: Option<&str>) -> String {
    workflow.map_or_else(|| "default".into(), |w| SD_SAMPLERS.iter().find(|s| presets::workflow_sampler_name(s) == w).map_or(w, |s| s).to_string())
}

pub(super) fn sd_scheduler_name(workflow: Option<&str>) -> String {
    workflow.map_or_else(|| "default".into(), |w| SD_SCHEDULERS.iter().find(|s| presets::workflow_scheduler_name(s) == w).map_or(w, |s| s).to_string())
}

/// `lora`: files of `loras/` by the path capabilities lists (with or without extension),
/// applied as the presets apply a prompt's tags.
fn loras(state: &AppState, o: &Obj, p: &mut ImgGenParams) -> Result<(), ApiError> {
    let list = match o.map.get("lora") {
        None | Some(Json::Null) => return Ok(()),
        Some(Json::Array(a)) => a,
        Some(v) => return Err(o.bad("lora", format!("{v} is not an array"))),
    };
    p.lora_files = a1111::lora_files(state);
    for (i, item) in list.iter().enumerate() {
        let key = format!("lora[{i}]");
        let Json::Object(map) = item else { return Err(o.bad(&key, format!("{item} is not an object"))) };
        let l = Obj { map, path: key };
        l.known(&["path", "multiplier", "is_high_noise"])?;
        let path = l.get::<String>("path")?.ok_or_else(|| l.bad("path", "required"))?;
        let name = path.rsplit_once('.').filter(|(_, ext)| !ext.contains('/')).map_or(path.as_str(), |(s, _)| s);
        if !p.lora_files.contains_key(name) {
            return Err(l.bad("path", format!("no LoRA `{path}` in the loras folder")));
        }
        let multiplier = l.num("multiplier", -100.0, 100.0)?.unwrap_or(1.0);
        if l.get::<bool>("is_high_noise")? == Some(true) {
            if state.config.video_defaults.high_noise.is_none() {
                return Err(l.bad("is_high_noise", "high-noise LoRAs are for a Wan2.2 high-noise expert; start the server with --high-noise-diffusion-model"));
            }
            // sd.cpp's tag for the high-noise expert's LoRAs.
            p.prompt.push_str(&format!(" <lora:|high_noise|{name}:{multiplier}>"));
            continue;
        }
        p.prompt.push_str(&format!(" <lora:{name}:{multiplier}>"));
    }
    Ok(())
}

/// `hires`: sd-server's hires fix, as A1111's.
fn hires(state: &AppState, o: &Obj, p: &mut ImgGenParams) -> Result<(), ApiError> {
    let Some(h) = o.obj("hires", &["enabled", "upscaler", "scale", "target_width", "target_height", "steps", "denoising_strength", "custom_sigmas", "upscale_tile_size"])? else { return Ok(()) };
    let hp = &mut p.hires;
    if let Some(e) = h.get::<bool>("enabled")? {
        hp.enabled = e;
    }
    if let Some(u) = h.get::<String>("upscaler")? {
        hp.upscaler = a1111::hr_upscaler(state, &u, "hires.upscaler")?;
    }
    if let Some(s) = h.num("scale", 0.0, 8.0)? {
        hp.scale = s;
    }
    if let Some(w) = h.int("target_width", 0, MAX_SIDE)? {
        hp.width = w;
    }
    if let Some(v) = h.int("target_height", 0, MAX_SIDE)? {
        hp.height = v;
    }
    if let Some(s) = h.int("steps", 0, 10_000)? {
        hp.steps = s;
    }
    if let Some(d) = h.num("denoising_strength", 0.0, 1.0)? {
        hp.denoising_strength = d;
    }
    if let Some(s) = h.get::<Vec<f32>>("custom_sigmas")? {
        hp.sigmas = (!s.is_empty()).then_some(s);
    }
    if let Some(t) = h.int("upscale_tile_size", 0, 4096)? {
        hp.upscale_tile_size = t;
    }
    Ok(())
}

/// `vae_tiling_params`: sd-cli's --vae-tiling and its sizes (0: the default).
fn tiling(o: &Obj, p: &mut ImgGenParams) -> Result<(), ApiError> {
    let Some(t) = o.obj("vae_tiling_params", &["enabled", "temporal_tiling", "tile_size_x", "tile_size_y", "target_overlap", "rel_size_x", "rel_size_y", "extra_tiling_args"])? else { return Ok(()) };
    let tp = &mut p.tiling;
    if let Some(e) = t.get::<bool>("enabled")? {
        tp.enabled = e;
    }
    t.off_only("temporal_tiling", |v| v == &Json::Bool(false), "temporal VAE tiling is not implemented")?;
    t.off_only("extra_tiling_args", |v| v.as_str() == Some(""), "no extra tiling arguments are read")?;
    let x = t.int("tile_size_x", 0, 4096)?.unwrap_or(0);
    let y = t.int("tile_size_y", 0, 4096)?.unwrap_or(0);
    if x > 0 || y > 0 {
        tp.tile_size = (if x > 0 { x } else { y }, if y > 0 { y } else { x });
    }
    if let Some(v) = t.num("target_overlap", 0.0, 0.99)? {
        tp.overlap = v;
    }
    let rx = t.num("rel_size_x", 0.0, 64.0)?.unwrap_or(0.0);
    let ry = t.num("rel_size_y", 0.0, 64.0)?.unwrap_or(0.0);
    if rx > 0.0 || ry > 0.0 {
        tp.relative = Some((if rx > 0.0 { rx } else { ry }, if ry > 0.0 { ry } else { rx }));
    }
    Ok(())
}
