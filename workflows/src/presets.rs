//! sd-cli's modes as workflow graphs: typed parameters with sd-cli's defaults, and the
//! functions that turn them into a [`Workflow`]. The CLI (`sdflow img_gen`, ...) and the
//! server build their graphs here, so a flag means the same thing everywhere.
//!
//! The graphs use ComfyUI's node names and input names. A preset emits the node a flag
//! needs even when this build has no such node yet (LoraLoader, VAELoader, ...):
//! [`unsupported_nodes`] then names the flag and the node, so a caller refuses the request
//! instead of running something other than what was asked for.
//!
//! Node ids: the nodes every run of a mode has ("core" nodes: loader, prompts, latent
//! source, sampler, decoder, saver) are numbered first, in graph order, so the graphs for
//! plain flags are exactly the committed files in `workflows/` (whose ids users and tests
//! address with `--set`); nodes that optional flags add are numbered after them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sdflow_executor::{Header, InputValue, NodeSpec, Registry, Workflow};
use serde_json::{json, Value as Json};

/// Why a preset could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PresetError {
    /// A flag asks for something sdflow cannot do yet.
    #[error("not supported yet: {flag} ({reason})")]
    NotSupported { flag: String, reason: String },
    /// A flag's value is malformed or out of range.
    #[error("invalid value for {flag}: {msg}")]
    Invalid { flag: String, msg: String },
    /// A required flag is absent.
    #[error("missing {flag}: {msg}")]
    Missing { flag: String, msg: String },
}

fn not_supported(flag: impl Into<String>, reason: impl Into<String>) -> PresetError {
    PresetError::NotSupported { flag: flag.into(), reason: reason.into() }
}

fn invalid(flag: impl Into<String>, msg: impl Into<String>) -> PresetError {
    PresetError::Invalid { flag: flag.into(), msg: msg.into() }
}

/// sd-cli's sampling methods (`--sampling-method`).
pub const SD_SAMPLERS: [&str; 14] =
    ["euler", "euler_a", "heun", "dpm2", "dpm++2s_a", "dpm++2m", "dpm++2mv2", "ipndm", "ipndm_v", "lcm", "ddim_trailing", "tcd", "res_multistep", "res_2s"];

/// sd-cli's schedulers (`--scheduler`).
pub const SD_SCHEDULERS: [&str; 11] =
    ["discrete", "karras", "exponential", "ays", "gits", "smoothstep", "sgm_uniform", "simple", "kl_optimal", "lcm", "bong_tangent"];

/// The name a workflow spells a sampler with: ComfyUI's where ComfyUI has the same sampler
/// (so the graph opens in ComfyUI), sd.cpp's otherwise (our samplers take both).
pub fn workflow_sampler_name(name: &str) -> &str {
    match name {
        "euler_a" => "euler_ancestral",
        "dpm2" => "dpm_2",
        "dpm++2s_a" => "dpmpp_2s_ancestral",
        "dpm++2m" => "dpmpp_2m",
        other => other,
    }
}

/// The name a workflow spells a scheduler with (ComfyUI's `normal` is sd.cpp's `discrete`).
pub fn workflow_scheduler_name(name: &str) -> &str {
    match name {
        "discrete" | "default" => "normal",
        other => other,
    }
}

/// One `<lora:name:weight>` tag of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraTag {
    pub name: String,
    pub weight: f64,
}

/// Removes sd.cpp's `<lora:name:weight>` tags from `prompt`, returning the prompt without
/// them and the tags in order. A tag without a weight has weight 1, as in sd.cpp.
pub fn extract_loras(prompt: &str) -> Result<(String, Vec<LoraTag>), PresetError> {
    let mut out = String::with_capacity(prompt.len());
    let mut tags = Vec::new();
    let mut rest = prompt;
    while let Some(start) = rest.find("<lora:") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "<lora:".len()..];
        let Some(end) = after.find('>') else {
            return Err(invalid("-p", format!("unterminated LoRA tag `{}`", &rest[start..])));
        };
        let body = &after[..end];
        let (name, weight) = match body.rsplit_once(':') {
            Some((name, w)) => match w.trim().parse::<f64>() {
                Ok(w) if w.is_finite() => (name, w),
                _ => return Err(invalid("-p", format!("LoRA tag `<lora:{body}>`: weight `{w}` is not a number"))),
            },
            None => (body, 1.0),
        };
        if name.trim().is_empty() {
            return Err(invalid("-p", format!("LoRA tag `<lora:{body}>` has no name")));
        }
        tags.push(LoraTag { name: name.trim().to_string(), weight });
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok((out, tags))
}

/// `--hires*`: sd-webui's "Hires. fix", which sd.cpp's flags follow.
#[derive(Debug, Clone, PartialEq)]
pub struct HiresParams {
    /// `--hires`.
    pub enabled: bool,
    /// `--hires-upscaler`: `Latent`, `Latent (nearest)`, `Latent (nearest-exact)`,
    /// `Latent (antialiased)`, `Latent (bicubic)`, `Latent (bicubic antialiased)`,
    /// `Nearest`, `Lanczos`, or an upscale model's name.
    pub upscaler: String,
    /// `--hires-scale`.
    pub scale: f64,
    /// `--hires-width`, `--hires-height`: a target size instead of a scale (0: from the
    /// scale, or from the other side and the aspect ratio).
    pub width: i64,
    pub height: i64,
    /// `--hires-steps` (0: the base pass's steps).
    pub steps: i64,
    /// `--hires-denoising-strength`.
    pub denoising_strength: f64,
    /// `--hires-upscale-tile-size`, for a model upscaler (128).
    pub upscale_tile_size: i64,
    /// `--hires-sigmas`: the hires pass's whole schedule, as given (sd-cli does not cut it
    /// to the denoising strength; its first sigma is the noise added).
    pub sigmas: Option<Vec<f32>>,
}

impl Default for HiresParams {
    fn default() -> Self {
        HiresParams { enabled: false, upscaler: "Latent".into(), scale: 2.0, width: 0, height: 0, steps: 0, denoising_strength: 0.7, upscale_tile_size: 128, sigmas: None }
    }
}

/// `--vae-tiling` and its options.
#[derive(Debug, Clone, PartialEq)]
pub struct TilingParams {
    pub enabled: bool,
    /// `--vae-tile-size`, in latent pixels (sd.cpp's unit; default 32x32).
    pub tile_size: (i64, i64),
    /// `--vae-tile-overlap`, a fraction of the tile (default 0.5).
    pub overlap: f64,
    /// `--vae-relative-tile-size`: per axis a fraction of the latent side (<= 1) or a
    /// number of tiles (> 1); it overrides `tile_size` where given.
    pub relative: Option<(f64, f64)>,
}

impl Default for TilingParams {
    fn default() -> Self {
        TilingParams { enabled: false, tile_size: (32, 32), overlap: 0.5, relative: None }
    }
}

/// sd-cli's `img_gen` mode: txt2img, img2img (`-i`), inpainting (`--mask`), hires fix,
/// LoRA tags, ControlNet, ESRGAN upscaling of the result. Defaults are sd-cli's.
#[derive(Debug, Clone, PartialEq)]
pub struct ImgGenParams {
    /// `-m`: a full checkpoint (UNet, text encoder, VAE).
    pub model: Option<String>,
    /// `--diffusion-model`: a standalone diffusion model.
    pub diffusion_model: Option<String>,
    /// `--clip_l`, `--clip_g`: standalone text encoders.
    pub clip_l: Option<String>,
    pub clip_g: Option<String>,
    /// `--vae`: a standalone VAE.
    pub vae: Option<String>,
    /// `--taesd`: the tiny autoencoder, decoding instead of the VAE.
    pub taesd: Option<String>,
    /// `--control-net`, `--control-image`, `--control-strength` (0.9).
    pub control_net: Option<String>,
    pub control_image: Option<String>,
    pub control_strength: f64,
    /// `--canny`: edge-detect the control image first.
    pub canny: bool,
    /// `--photo-maker`, `--pm-id-images-dir` (a folder in the input folder),
    /// `--pm-id-embed-path` (PhotoMaker v2's face embeddings, a file in the input
    /// folder), `--pm-style-strength` (20).
    pub photo_maker: Option<String>,
    pub pm_id_images_dir: Option<String>,
    pub pm_id_embed_path: Option<String>,
    pub pm_style_strength: f64,
    /// `--upscale-model`, `--upscale-repeats` (1).
    pub upscale_model: Option<String>,
    pub upscale_repeats: i64,
    /// `--upscale-tile-size` (128).
    pub upscale_tile_size: i64,
    /// `--ad-model`: a detector whose finds are re-sampled (ADetailer: UltralyticsDetectorProvider, BboxDetectorMasks, DetailerForEachMask);
    /// `--extra-ad-args`: `input=value,...` overrides for the detailer node.
    pub ad_model: Option<String>,
    pub extra_ad_args: Option<String>,
    /// `--ad-prompt`, `--ad-negative-prompt`: the detail pass's prompts (empty: the main
    /// ones).
    pub ad_prompt: String,
    pub ad_negative_prompt: String,
    /// `-p`, `-n`. `<lora:name:weight>` tags in the prompt become LoraLoader nodes.
    pub prompt: String,
    pub negative_prompt: String,
    /// sd-cli zeroes an SDXL model's unconditional embeddings when `-n` is empty (not
    /// for EDM-v models): the caller, which can read the model file, says whether this
    /// model is one.
    pub zero_empty_negative: bool,
    /// LoRA file name per tag name; a tag without an entry loads `NAME.safetensors`.
    pub lora_files: BTreeMap<String, String>,
    /// `--lora-apply-mode`: every LoraLoader's `apply_mode`; `None` leaves the input out
    /// (the node's default, auto, as in sd-cli).
    pub lora_apply_mode: Option<String>,
    /// `--rng` (and `--sampler-rng`, which must agree: one generator draws the initial and
    /// every step's noise): the KSamplers' `rng`; `None` leaves the input out (ComfyUI's
    /// CPU noise).
    pub rng: Option<String>,
    pub width: i64,
    pub height: i64,
    /// Whether `-W`/`-H` were given: with `-i` they resize the input image.
    pub size_given: bool,
    pub steps: i64,
    pub cfg_scale: f64,
    /// `--sampling-method` (sd.cpp or ComfyUI name; `None`: euler_a, sd-cli's default for
    /// UNet models).
    pub sampling_method: Option<String>,
    /// `--scheduler` (`None`: discrete).
    pub scheduler: Option<String>,
    /// `--prediction` (eps, v, edm_v; `None`: what the checkpoint says).
    pub prediction: Option<String>,
    /// `--eta` (`None`: each sampler's own, as sd-cli without the flag).
    pub eta: Option<f64>,
    /// `--sigmas`: the base pass's schedule instead of `--steps` and `--scheduler`; with
    /// `-i` cut to `--strength` as sd-cli cuts it.
    pub sigmas: Option<Vec<f32>>,
    /// `-s`: a negative seed asks for a random one (see [`resolve_seed`]).
    pub seed: i64,
    /// `-b`: images per run.
    pub batch_count: i64,
    /// `-i`, `--mask`, `--strength` (0.75).
    pub init_img: Option<String>,
    pub mask: Option<String>,
    pub strength: f64,
    /// `--clip-skip` (≤ 0: the model's default).
    pub clip_skip: i64,
    /// `--img-cfg-scale`: instruct-pix2pix with this image guidance (needs `-i`).
    pub img_cfg_scale: Option<f64>,
    pub hires: HiresParams,
    pub tiling: TilingParams,
    /// `-o` (`./output.png`); its file stem is the SaveImage prefix.
    pub output: String,
}

impl Default for ImgGenParams {
    fn default() -> Self {
        ImgGenParams {
            model: None,
            diffusion_model: None,
            clip_l: None,
            clip_g: None,
            vae: None,
            taesd: None,
            photo_maker: None,
            pm_id_images_dir: None,
            pm_id_embed_path: None,
            pm_style_strength: 20.0,
            control_net: None,
            control_image: None,
            control_strength: 0.9,
            canny: false,
            upscale_model: None,
            upscale_repeats: 1,
            upscale_tile_size: 128,
            ad_model: None,
            extra_ad_args: None,
            ad_prompt: String::new(),
            ad_negative_prompt: String::new(),
            prompt: String::new(),
            negative_prompt: String::new(),
            zero_empty_negative: false,
            lora_files: BTreeMap::new(),
            lora_apply_mode: None,
            rng: None,
            width: 512,
            height: 512,
            size_given: false,
            steps: 20,
            cfg_scale: 7.0,
            sampling_method: None,
            scheduler: None,
            prediction: None,
            eta: None,
            sigmas: None,
            seed: 42,
            batch_count: 1,
            init_img: None,
            mask: None,
            strength: 0.75,
            clip_skip: -1,
            img_cfg_scale: None,
            hires: HiresParams::default(),
            tiling: TilingParams::default(),
            output: "./output.png".into(),
        }
    }
}

/// sd-cli's `upscale` mode: an image through an ESRGAN-style model, `repeats` times.
#[derive(Debug, Clone, PartialEq)]
pub struct UpscaleParams {
    pub init_img: String,
    pub upscale_model: String,
    pub upscale_repeats: i64,
    /// `--upscale-tile-size` (128).
    pub tile_size: i64,
    pub output: String,
}

/// `sdflow adetailer`: re-sample what a detector finds in an existing image.
#[derive(Debug, Clone, PartialEq)]
pub struct AdetailerParams {
    pub model: String,
    pub init_img: String,
    pub ad_model: String,
    pub extra_ad_args: Option<String>,
    /// `--ad-prompt`, `--ad-negative-prompt` (empty: `-p`, `-n`).
    pub ad_prompt: String,
    pub ad_negative_prompt: String,
    pub prompt: String,
    pub negative_prompt: String,
    /// `-W`, `-H`: resize the input first; the detail pass works at the (resized)
    /// image's size either way, as sd-cli's adetailer mode.
    pub width: Option<i64>,
    pub height: Option<i64>,
    pub steps: i64,
    pub cfg_scale: f64,
    pub sampling_method: Option<String>,
    pub scheduler: Option<String>,
    /// `--prediction`, `--eta`, `--rng`: as [`ImgGenParams`]'.
    pub prediction: Option<String>,
    pub eta: Option<f64>,
    pub rng: Option<String>,
    pub seed: i64,
    pub strength: f64,
    pub output: String,
}

/// A built preset: the workflow, and for each node id the flag that put the node there
/// (for refusals that name the flag).
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub workflow: Workflow,
    pub origins: BTreeMap<String, String>,
    /// Ids of the SaveImage nodes, in order.
    pub save_nodes: Vec<String>,
}

/// `-s`: sd-cli draws a random seed for negative values. The seed is fixed here, when
/// the graph is built, so a printed or saved workflow reruns the same image.
pub fn resolve_seed(seed: i64) -> i64 {
    if seed >= 0 {
        return seed;
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    // sd-cli's random seeds are non-negative 31-bit values (from `rand()`).
    (h.finish() & 0x7fff_ffff) as i64
}

/// The SaveImage `filename_prefix` for an `-o` path: its file stem without printf
/// patterns (`out/cat_%03d.png` gives `cat_`).
pub fn save_prefix(output: &str) -> String {
    let name = Path::new(output).file_name().map_or_else(|| output.to_string(), |n| n.to_string_lossy().into_owned());
    let stem = match name.rsplit_once('.') {
        Some((s, _)) if !s.is_empty() => s.to_string(),
        _ => name,
    };
    let mut out = String::new();
    let mut chars = stem.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            if chars.peek() == Some(&'%') {
                chars.next();
                out.push('%');
                continue;
            }
            while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
                chars.next();
            }
            if chars.peek() == Some(&'d') {
                chars.next();
            }
            continue;
        }
        out.push(c);
    }
    let out = out.trim_matches(|c: char| c == '/' || c == '\\').to_string();
    if out.is_empty() {
        "output".into()
    } else {
        out
    }
}

/// Formats one printf `%d` / `%0Nd` / `%Nd` in `pattern` with `index`; `None` when the
/// pattern has no such specifier.
fn format_index(pattern: &str, index: i64) -> Result<Option<String>, PresetError> {
    let mut out = String::new();
    let mut found = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let mut spec = String::new();
        while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
            spec.push(chars.next().unwrap_or('0'));
        }
        if chars.next() != Some('d') {
            return Err(invalid("-o", format!("`{pattern}`: only %d, %0Nd and %Nd patterns are understood")));
        }
        if found {
            return Err(invalid("-o", format!("`{pattern}` has more than one %d")));
        }
        found = true;
        let width: usize = spec.trim_start_matches('0').parse().unwrap_or(0);
        if width > 32 {
            return Err(invalid("-o", format!("`{pattern}`: field width {width} is too large")));
        }
        if spec.starts_with('0') {
            out.push_str(&format!("{index:0width$}"));
        } else {
            out.push_str(&format!("{index:width$}"));
        }
    }
    Ok(found.then_some(out))
}

/// The files sd-cli writes for `count` images and `-o output`: with a `%d` pattern, the
/// pattern at `begin`, `begin+1`, ... (`begin` defaults to 0); without, `output` itself,
/// then `stem_2.ext`, `stem_3.ext`, ... (`begin` defaults to 1), as sd-cli names a batch.
pub fn output_paths(output: &str, count: usize, begin: Option<i64>) -> Result<Vec<PathBuf>, PresetError> {
    if let Some(b) = begin.filter(|b| *b < 0) {
        return Err(invalid("--output-begin-idx", format!("{b} must be non-negative")));
    }
    if format_index(output, 0)?.is_some() {
        let begin = begin.unwrap_or(0);
        return (0..count as i64).map(|i| Ok(PathBuf::from(format_index(output, begin + i)?.unwrap_or_default()))).collect();
    }
    let begin = begin.unwrap_or(1);
    let path = Path::new(output);
    let stem = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    Ok((0..count as i64)
        .map(|i| {
            if i == 0 {
                return path.to_path_buf();
            }
            let name = match &ext {
                Some(e) => format!("{stem}_{}.{e}", begin + i),
                None => format!("{stem}_{}", begin + i),
            };
            path.with_file_name(name)
        })
        .collect())
}

/// Where a link input comes from, by builder key.
#[derive(Clone)]
struct Out(String, usize);

fn link(o: &Out) -> InputValue {
    InputValue::link(o.0.clone(), o.1)
}

struct Entry {
    key: String,
    core: bool,
    origin: String,
    spec: NodeSpec,
}

/// Builds a graph with symbolic keys, numbered at the end (core nodes first).
#[derive(Default)]
struct Builder {
    entries: Vec<Entry>,
}

impl Builder {
    fn add(&mut self, key: &str, core: bool, origin: &str, spec: NodeSpec) -> String {
        let key = if self.entries.iter().any(|e| e.key == key) { format!("{key}#{}", self.entries.len()) } else { key.to_string() };
        self.entries.push(Entry { key: key.clone(), core, origin: origin.to_string(), spec });
        key
    }

    fn core(&mut self, key: &str, origin: &str, spec: NodeSpec) -> String {
        self.add(key, true, origin, spec)
    }

    fn extra(&mut self, key: &str, origin: &str, spec: NodeSpec) -> String {
        self.add(key, false, origin, spec)
    }

    fn finish(self, title: String, description: String) -> Preset {
        let mut ids = BTreeMap::new();
        let order = self.entries.iter().filter(|e| e.core).chain(self.entries.iter().filter(|e| !e.core));
        for (i, e) in order.enumerate() {
            ids.insert(e.key.clone(), (i + 1).to_string());
        }
        let mut wf = Workflow { header: Some(Header { title: Some(title), description: Some(description), ..Header::default() }), nodes: BTreeMap::new() };
        let mut origins = BTreeMap::new();
        let mut save_nodes = Vec::new();
        for e in self.entries {
            let id = ids[&e.key].clone();
            let mut spec = e.spec;
            for v in spec.inputs.values_mut() {
                if let InputValue::Link { node, .. } = v {
                    if let Some(n) = ids.get(node.as_str()) {
                        *node = n.clone();
                    }
                }
            }
            if spec.class_type == "SaveImage" {
                save_nodes.push(id.clone());
            }
            origins.insert(id.clone(), e.origin);
            wf.nodes.insert(id, spec);
        }
        save_nodes.sort_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX));
        Preset { workflow: wf, origins, save_nodes }
    }
}

fn text_encode(text: &str, clip: &Out, title: &str) -> NodeSpec {
    let mut n = NodeSpec::new("CLIPTextEncode").with_const("text", json!(text)).with_input("clip", link(clip));
    n.title = Some(title.into());
    n
}

/// What every sampling pass of a preset shares: `-s`, `--cfg-scale`, the sampler and
/// scheduler (workflow names), `--rng` and `--eta`.
struct Sampling<'a> {
    seed: i64,
    cfg: f64,
    sampler: &'a str,
    scheduler: &'a str,
    rng: Option<&'a str>,
    eta: Option<f64>,
}

impl Sampling<'_> {
    /// The SAMPLER node `--eta` needs (KSampler takes only a sampler's name).
    fn select_node(&self, sampler: &str) -> Option<NodeSpec> {
        self.eta.map(|eta| NodeSpec::new("KSamplerSelectAdvanced").with_const("sampler_name", json!(sampler)).with_const("eta", json!(eta)).with_const("s_noise", json!(1.0)).with_const("noise", json!("sampler")))
    }

    /// The SAMPLER node of a SamplerCustom pass and the flag it stands for: with `--eta`
    /// its KSamplerSelectAdvanced, else KSamplerSelect.
    fn sampler_node(&self, sampler: &str) -> (NodeSpec, &'static str) {
        match self.select_node(sampler) {
            Some(n) => (n, "--eta"),
            None => (NodeSpec::new("KSamplerSelect").with_const("sampler_name", json!(sampler)), "--sampling-method"),
        }
    }

    /// `node` with `--rng`, left out unless asked for: the nodes' default is ComfyUI's
    /// CPU noise.
    fn with_rng(&self, node: NodeSpec) -> NodeSpec {
        match self.rng {
            Some(r) => node.with_const("rng", json!(r)),
            None => node,
        }
    }
}

/// The pass's schedule when it is not `--steps` of `--scheduler`.
enum CustomSigmas<'a> {
    /// `--sigmas` with `-i`: cut to the strength as sd-cli's img2img cuts its schedule.
    Strength(&'a [f32], f64),
    /// `--hires-sigmas`, or `--sigmas` without `-i`: the schedule as given.
    Whole(&'a [f32]),
}

/// One sampling pass: KSampler, or SamplerCustom when `--eta` or custom sigmas ask for
/// more than KSampler's inputs (its SAMPLER a KSamplerSelectAdvanced, its SIGMAS a
/// ManualSigmas), so that the plain graphs stay ComfyUI's KSampler graphs.
#[allow(clippy::too_many_arguments)]
fn sample_pass(b: &mut Builder, key: &str, origin: &str, s: &Sampling<'_>, model: &Out, steps: i64, sigmas: Option<CustomSigmas<'_>>, denoise: f64, pos: &Out, neg: &Out, latent: &Out) -> String {
    if s.eta.is_none() && sigmas.is_none() {
        let node = NodeSpec::new("KSampler")
            .with_input("model", link(model))
            .with_const("seed", json!(s.seed))
            .with_const("steps", json!(steps))
            .with_const("cfg", json!(s.cfg))
            .with_const("sampler_name", json!(s.sampler))
            .with_const("scheduler", json!(s.scheduler))
            .with_input("positive", link(pos))
            .with_input("negative", link(neg))
            .with_input("latent_image", link(latent))
            .with_const("denoise", json!(denoise));
        return b.core(key, origin, s.with_rng(node));
    }
    let (select, select_origin) = s.sampler_node(s.sampler);
    let select = b.extra(&format!("{key}_select"), select_origin, select);
    let schedule = match sigmas {
        None => Out(b.extra(&format!("{key}_sigmas"), "--scheduler", NodeSpec::new("BasicScheduler").with_input("model", link(model)).with_const("scheduler", json!(s.scheduler)).with_const("steps", json!(steps)).with_const("denoise", json!(denoise))), 0),
        Some(CustomSigmas::Whole(list)) => Out(b.extra(&format!("{key}_sigmas"), origin, manual_sigmas(list)), 0),
        Some(CustomSigmas::Strength(list, strength)) => {
            let manual = b.extra(&format!("{key}_sigmas"), origin, manual_sigmas(list));
            match strength_split(list.len(), strength) {
                0 => Out(manual, 0),
                step => Out(b.extra(&format!("{key}_split"), "--strength", NodeSpec::new("SplitSigmas").with_input("sigmas", InputValue::link(manual, 0)).with_const("step", json!(step))), 1),
            }
        }
    };
    let node = NodeSpec::new("SamplerCustom")
        .with_input("model", link(model))
        .with_const("add_noise", json!(true))
        .with_const("noise_seed", json!(s.seed))
        .with_const("cfg", json!(s.cfg))
        .with_input("positive", link(pos))
        .with_input("negative", link(neg))
        .with_input("sampler", InputValue::link(select, 0))
        .with_input("sigmas", link(&schedule))
        .with_input("latent_image", link(latent));
    b.core(key, origin, s.with_rng(node))
}

fn manual_sigmas(list: &[f32]) -> NodeSpec {
    let text: Vec<String> = list.iter().map(f32::to_string).collect();
    NodeSpec::new("ManualSigmas").with_const("sigmas", json!(text.join(", ")))
}

/// Where sd-cli's img2img starts in a custom schedule of `len` sigmas at `strength`: it
/// runs the last `t_enc = floor(steps * strength)` steps (at most `steps - 1`), from one
/// sigma earlier. SplitSigmas' `step`: its low half is what runs.
fn strength_split(len: usize, strength: f64) -> usize {
    if strength >= 1.0 || len < 2 {
        return 0;
    }
    let steps = len - 1;
    let t_enc = ((steps as f32 * strength as f32) as usize).min(steps - 1);
    steps - t_enc - 1
}

fn check_range(flag: &str, v: i64, lo: i64, hi: i64) -> Result<(), PresetError> {
    if v < lo || v > hi {
        return Err(invalid(flag, format!("{v} is outside {lo}..={hi}")));
    }
    Ok(())
}

/// sd-cli's tile options beyond ComfyUI's square `tile_size`, as the tiled nodes' optional
/// inputs; left out when not given, so the plain graphs stay ComfyUI's.
fn sd_cli_tiles(mut node: NodeSpec, t: &TilingParams) -> NodeSpec {
    let (tx, ty) = t.tile_size;
    if tx != ty {
        node = node.with_const("tile_height", json!(ty * 8));
    }
    if let Some((rx, ry)) = t.relative {
        node = node.with_const("relative_tile_size", json!(format!("{rx}x{ry}")));
    }
    node
}

/// `--prediction`: what the model predicts, set over the loader's MODEL (ComfyUI's
/// model-sampling nodes; sd-cli's names).
fn prediction_node(b: &mut Builder, model: &Out, prediction: Option<&str>) -> Result<Out, PresetError> {
    let Some(p) = prediction else { return Ok(model.clone()) };
    let node = match p {
        "eps" | "v" => NodeSpec::new("ModelSamplingDiscrete").with_input("model", link(model)).with_const("sampling", json!(if p == "eps" { "eps" } else { "v_prediction" })).with_const("zsnr", json!(false)),
        // sd.cpp's EDMVDenoiser range (CosXL's).
        "edm_v" => NodeSpec::new("ModelSamplingContinuousEDM").with_input("model", link(model)).with_const("sampling", json!("v_prediction")).with_const("sigma_max", json!(120.0)).with_const("sigma_min", json!(0.002)),
        "sd3_flow" | "flux_flow" | "flux2_flow" => return Err(not_supported(format!("--prediction {p}"), "flow-matching models (SD3, FLUX) are not implemented")),
        other => return Err(invalid("--prediction", format!("`{other}` is not one of eps, v, edm_v, sd3_flow, flux_flow, flux2_flow"))),
    };
    Ok(Out(b.extra("model_sampling", "--prediction", node), 0))
}

fn check_eta(eta: Option<f64>) -> Result<(), PresetError> {
    match eta {
        Some(e) if !(e.is_finite() && (0.0..=100.0).contains(&e)) => Err(invalid("--eta", format!("{e} is outside 0..=100"))),
        _ => Ok(()),
    }
}

fn check_sigmas(flag: &str, list: Option<&[f32]>) -> Result<(), PresetError> {
    let Some(list) = list else { return Ok(()) };
    if list.len() < 2 {
        return Err(invalid(flag, format!("needs at least 2 sigmas (a start and an end), got {}", list.len())));
    }
    if let Some(v) = list.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
        return Err(invalid(flag, format!("{v} is not a finite sigma >= 0")));
    }
    Ok(())
}

fn check_unit(flag: &str, v: f64) -> Result<(), PresetError> {
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(flag, format!("{v} is outside 0..=1")));
    }
    Ok(())
}

fn sampler_names(method: &Option<String>, scheduler: &Option<String>) -> (String, String) {
    let sampler = workflow_sampler_name(method.as_deref().unwrap_or("euler_a")).to_string();
    let scheduler = workflow_scheduler_name(scheduler.as_deref().unwrap_or("discrete")).to_string();
    (sampler, scheduler)
}

/// ADetailer's detect-and-repair: a detector, its masks and the detail pass over them,
/// with sd.cpp's `--extra-ad-args` keys routed to the node that takes them.
#[allow(clippy::too_many_arguments)]
/// The detail pass's prompts and inpaint size (0: the image's side).
struct DetailSpec<'a> {
    prompt: &'a str,
    negative: &'a str,
    ad_prompt: &'a str,
    ad_negative: &'a str,
    inpaint: (i64, i64),
}

#[allow(clippy::too_many_arguments)]
fn detailer(b: &mut Builder, image: &Out, model: &Out, clip: &Out, vae: &Out, d: &DetailSpec<'_>, ad_model: &str, extra: Option<&str>, s: &Sampling<'_>, steps: i64, denoise: f64) -> Result<Out, PresetError> {
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

/// Builds sd-cli's `img_gen` graph.
pub fn img_gen(p: &ImgGenParams) -> Result<Preset, PresetError> {
    check_range("-W", p.width, 16, 16384)?;
    check_range("-H", p.height, 16, 16384)?;
    check_range("--steps", p.steps, 1, 10000)?;
    check_range("-b", p.batch_count, 1, 4096)?;
    check_unit("--strength", p.strength)?;
    check_range("--upscale-repeats", p.upscale_repeats, 1, 16)?;
    if !p.cfg_scale.is_finite() || p.cfg_scale < 0.0 {
        return Err(invalid("--cfg-scale", format!("{} must be a non-negative number", p.cfg_scale)));
    }
    if p.mask.is_some() && p.init_img.is_none() {
        return Err(PresetError::Missing { flag: "-i".into(), msg: "--mask needs an init image".into() });
    }
    if p.control_image.is_some() != p.control_net.is_some() {
        let (flag, msg) = if p.control_net.is_some() { ("--control-image", "--control-net needs a control image") } else { ("--control-net", "--control-image needs a control net") };
        return Err(PresetError::Missing { flag: flag.into(), msg: msg.into() });
    }
    let seed = resolve_seed(p.seed);
    let (sampler, scheduler) = sampler_names(&p.sampling_method, &p.scheduler);
    check_eta(p.eta)?;
    for (flag, list) in [("--sigmas", &p.sigmas), ("--hires-sigmas", &p.hires.sigmas)] {
        check_sigmas(flag, list.as_deref())?;
    }
    if p.hires.sigmas.is_some() && !p.hires.enabled {
        return Err(PresetError::Missing { flag: "--hires".into(), msg: "--hires-sigmas is the hires pass's schedule".into() });
    }
    let sampling = Sampling { seed, cfg: p.cfg_scale, sampler: &sampler, scheduler: &scheduler, rng: p.rng.as_deref(), eta: p.eta };
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
    // sd.cpp decodes with TAESD when given, and still encodes with the VAE.
    let decoder = match &p.taesd {
        Some(t) => Out(b.extra("taesd", "--taesd", NodeSpec::new("VAELoader").with_const("vae_name", json!(t))), 0),
        None => vae.clone(),
    };

    for (i, tag) in loras.iter().enumerate() {
        let file = p.lora_files.get(&tag.name).cloned().unwrap_or_else(|| format!("{}.safetensors", tag.name));
        let mut node = NodeSpec::new("LoraLoader")
            .with_input("model", link(&model))
            .with_input("clip", link(&clip))
            .with_const("lora_name", json!(file))
            .with_const("strength_model", json!(tag.weight))
            .with_const("strength_clip", json!(tag.weight));
        if let Some(m) = &p.lora_apply_mode {
            node = node.with_const("apply_mode", json!(m));
        }
        let key = b.extra(&format!("lora{i}"), &format!("<lora:{}:{}>", tag.name, tag.weight), node);
        model = Out(key.clone(), 0);
        clip = Out(key, 1);
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

    if p.tiling.relative.is_some() && !p.tiling.enabled {
        return Err(PresetError::Missing { flag: "--vae-tiling".into(), msg: "--vae-relative-tile-size sizes the tiles of --vae-tiling".into() });
    }
    let (tile_px, overlap_px) = if p.tiling.enabled {
        let (tx, ty) = p.tiling.tile_size;
        // The tiled nodes take 64..=4096 pixels.
        check_range("--vae-tile-size", tx.min(ty), 8, 512)?;
        check_range("--vae-tile-size", tx.max(ty), 8, 512)?;
        if let Some((rx, ry)) = p.tiling.relative {
            if !(rx.is_finite() && ry.is_finite() && rx >= 0.0 && ry >= 0.0) {
                return Err(invalid("--vae-relative-tile-size", format!("{rx}x{ry} must be non-negative numbers")));
            }
        }
        if !(0.0..1.0).contains(&p.tiling.overlap) {
            return Err(invalid("--vae-tile-overlap", format!("{} is outside 0..1", p.tiling.overlap)));
        }
        // sd.cpp counts tiles in latent pixels; ComfyUI's tiled nodes in image pixels.
        let px = tx * 8;
        (px, (px as f64 * p.tiling.overlap).round() as i64)
    } else {
        (0, 0)
    };
    let encode = |b: &mut Builder, key: &str, origin: &str, pixels: &Out| -> String {
        if p.tiling.enabled {
            b.core(key, "--vae-tiling", sd_cli_tiles(NodeSpec::new("VAEEncodeTiled").with_input("pixels", link(pixels)).with_input("vae", link(&vae)).with_const("tile_size", json!(tile_px)).with_const("overlap", json!(overlap_px)).with_const("temporal_size", json!(64)).with_const("temporal_overlap", json!(8)), &p.tiling))
        } else {
            b.core(key, origin, NodeSpec::new("VAEEncode").with_input("pixels", link(pixels)).with_input("vae", link(&vae)))
        }
    };

    let (samples, mut title, mut description) = if let Some(img_cfg) = p.img_cfg_scale {
        pix2pix(&mut b, p, img_cfg, &sampling, &model, &vae, &pos, &neg)?
    } else {
        // The latent to sample, and the mode's title and description.
        let (latent, denoise, mut title, mut description) = match &p.init_img {
            None => {
                let key = b.core("latent", "-W/-H", NodeSpec::new("EmptyLatentImage").with_const("width", json!(p.width)).with_const("height", json!(p.height)).with_const("batch_size", json!(p.batch_count)));
                (Out(key, 0), 1.0, "Text to image".to_string(), "sd-cli's default mode: a prompt and a negative prompt, sampled from an empty latent with the checkpoint's UNet and decoded with its VAE.".to_string())
            }
            Some(img) => {
                let load = b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(img)));
                let mut pixels = Out(load, 0);
                if p.size_given {
                    let key = b.extra("resize", "-W/-H", NodeSpec::new("ImageScale").with_input("image", link(&pixels)).with_const("upscale_method", json!("bicubic")).with_const("width", json!(p.width)).with_const("height", json!(p.height)).with_const("crop", json!("center")));
                    pixels = Out(key, 0);
                }
                let out = match &p.mask {
                    None => {
                        let enc = encode(&mut b, "encode", "-i", &pixels);
                        (Out(enc, 0), p.strength, "Image to image".to_string(), "sd-cli's img2img (-i, --strength): the input image is encoded with the VAE, noised to the denoise strength and sampled back with the prompt.".to_string())
                    }
                    Some(mask) => {
                        let m = b.core("mask", "--mask", NodeSpec::new("LoadImageMask").with_const("image", json!(mask)).with_const("channel", json!("red")));
                        if p.strength >= 1.0 {
                            let enc = b.core("encode", "--mask", NodeSpec::new("VAEEncodeForInpaint").with_input("pixels", link(&pixels)).with_input("vae", link(&vae)).with_input("mask", InputValue::link(m, 0)).with_const("grow_mask_by", json!(6)));
                            (Out(enc, 0), 1.0, "Inpainting".to_string(), "sd-cli's --mask mode: the masked part of the input image (mask.png's red channel, white = repaint) is greyed, encoded and re-sampled with the prompt; outside the mask the latent is held at the image. Works with normal checkpoints (latent blending) and 9-channel inpainting checkpoints (mask and masked image as extra UNet input).".to_string())
                        } else {
                            // Below full strength the masked region keeps the image's content
                            // as a start, so it is encoded as is, not greyed.
                            let enc = encode(&mut b, "encode", "--mask", &pixels);
                            let key = b.core("noise_mask", "--mask", NodeSpec::new("SetLatentNoiseMask").with_input("samples", InputValue::link(enc, 0)).with_input("mask", InputValue::link(m, 0)));
                            (Out(key, 0), p.strength, "Inpainting".to_string(), format!("sd-cli's --mask mode at --strength {}: the input image is encoded, noised to the strength and re-sampled where the mask (red channel, white = repaint) is set; elsewhere the latent is held at the image.", p.strength))
                        }
                    }
                };
                if p.batch_count > 1 {
                    let key = b.extra("repeat", "-b", NodeSpec::new("RepeatLatentBatch").with_input("samples", link(&out.0)).with_const("amount", json!(p.batch_count)));
                    (Out(key, 0), out.1, out.2, out.3)
                } else {
                    out
                }
            }
        };

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

        let custom = p.sigmas.as_deref().map(|list| if p.init_img.is_some() { CustomSigmas::Strength(list, denoise) } else { CustomSigmas::Whole(list) });
        let first = sample_pass(&mut b, "sampler", if p.sigmas.is_some() { "--sigmas" } else { "img_gen" }, &sampling, &model, p.steps, custom, denoise, &pos, &neg, &latent);
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
                Out(encode(&mut b, "hires_encode", "--hires", &Out(scaled, 0)), 0)
            };
            let steps = if h.steps > 0 { h.steps } else { p.steps };
            let second = sample_pass(&mut b, "hires_sampler", if h.sigmas.is_some() { "--hires-sigmas" } else { "--hires" }, &sampling, &model, steps, h.sigmas.as_deref().map(CustomSigmas::Whole), h.denoising_strength, &pos, &neg, &upscaled);
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
        description = format!("txt2img with the latent decoded in overlapping {tile_px}-pixel tiles (VAE Decode (Tiled), sd-cli's --vae-tiling): bounded memory for large images, tiles cross-faded over their {overlap_px}-pixel overlap.");
    }
    let decoded = if p.tiling.enabled {
        b.core("decode", "--vae-tiling", sd_cli_tiles(NodeSpec::new("VAEDecodeTiled").with_input("samples", link(&samples)).with_input("vae", link(&decoder)).with_const("tile_size", json!(tile_px)).with_const("overlap", json!(overlap_px)).with_const("temporal_size", json!(64)).with_const("temporal_overlap", json!(8)), &p.tiling))
    } else {
        b.core("decode", if p.taesd.is_some() { "--taesd" } else { "img_gen" }, NodeSpec::new("VAEDecode").with_input("samples", link(&samples)).with_input("vae", link(&decoder)))
    };
    let mut image = Out(decoded, 0);
    if let Some(ad) = &p.ad_model {
        // sd.cpp's defaults after generation: 512x512 at strength 0.4.
        let d = DetailSpec { prompt: &prompt, negative: &p.negative_prompt, ad_prompt: &p.ad_prompt, ad_negative: &p.ad_negative_prompt, inpaint: (512, 512) };
        image = detailer(&mut b, &image, &model, &clip, &vae, &d, ad, p.extra_ad_args.as_deref(), &sampling, p.steps, 0.4)?;
    } else if p.extra_ad_args.is_some() {
        return Err(PresetError::Missing { flag: "--ad-model".into(), msg: "--extra-ad-args needs a detector model".into() });
    }
    if let Some(um) = &p.upscale_model {
        image = upscale_chain(&mut b, &image, um, p.upscale_repeats, p.upscale_tile_size);
    }
    b.core("save", "-o", NodeSpec::new("SaveImage").with_input("images", link(&image)).with_const("filename_prefix", json!(save_prefix(&p.output))));
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
    if p.ad_model.is_some() {
        title.push_str(", then ADetailer");
        description.push_str(" ADetailer then re-samples what the --ad-model detector finds (BboxDetectorMasks → DetailerForEachMask, one crop per mask at 512x512).");
    }
    Ok(b.finish(title, description))
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
    for (given, flag) in [(p.mask.is_some(), "--mask"), (p.hires.enabled, "--hires"), (p.control_net.is_some(), "--control-net"), (p.size_given, "-W/-H"), (p.batch_count > 1, "-b")] {
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

fn upscale_chain(b: &mut Builder, image: &Out, model_name: &str, repeats: i64, tile_size: i64) -> Out {
    let loader = b.extra("upscale_model", "--upscale-model", NodeSpec::new("UpscaleModelLoader").with_const("model_name", json!(model_name)));
    let key = b.extra("upscale", "--upscale-model", upscale_node(&loader, image, repeats, tile_size));
    Out(key, 0)
}

/// ImageUpscaleWithModel with sd-cli's tiling and repeat count as inputs.
fn upscale_node(loader: &str, image: &Out, repeats: i64, tile_size: i64) -> NodeSpec {
    NodeSpec::new("ImageUpscaleWithModel").with_input("upscale_model", InputValue::link(loader, 0)).with_input("image", link(image)).with_const("tile_size", json!(tile_size)).with_const("repeats", json!(repeats))
}

/// Builds sd-cli's `upscale` graph.
pub fn upscale(p: &UpscaleParams) -> Result<Preset, PresetError> {
    check_range("--upscale-repeats", p.upscale_repeats, 1, 16)?;
    check_range("--upscale-tile-size", p.tile_size, 16, 4096)?;
    let mut b = Builder::default();
    let img = b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(p.init_img)));
    let loader = b.core("upscale_model", "--upscale-model", NodeSpec::new("UpscaleModelLoader").with_const("model_name", json!(p.upscale_model)));
    let up = b.core("upscale", "--upscale-model", upscale_node(&loader, &Out(img, 0), p.upscale_repeats, p.tile_size));
    b.core("save", "-o", NodeSpec::new("SaveImage").with_input("images", InputValue::link(up, 0)).with_const("filename_prefix", json!(save_prefix(&p.output))));
    Ok(b.finish("Upscale with a model".into(), "sd-cli's --upscale-model: an ESRGAN / Real-ESRGAN upscaler (RRDBNet x4plus, x4plus-anime-6B, or the compact animevideov3) from models/upscale_models enlarges an image tile by tile (--upscale-tile-size, --upscale-repeats).".into()))
}

/// Builds the `adetailer` graph: detect in an existing image and re-sample the finds.
pub fn adetailer(p: &AdetailerParams) -> Result<Preset, PresetError> {
    check_range("--steps", p.steps, 1, 10000)?;
    check_unit("--strength", p.strength)?;
    let seed = resolve_seed(p.seed);
    let (sampler, scheduler) = sampler_names(&p.sampling_method, &p.scheduler);
    check_eta(p.eta)?;
    let sampling = Sampling { seed, cfg: p.cfg_scale, sampler: &sampler, scheduler: &scheduler, rng: p.rng.as_deref(), eta: p.eta };
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

/// The nodes of `preset` that `registry` lacks, each as the refusal naming the flag that
/// asked for it. Empty when the registry can run the graph's node types.
pub fn unsupported_nodes(preset: &Preset, registry: &Registry) -> Vec<PresetError> {
    let mut ids: Vec<&String> = preset.workflow.nodes.keys().collect();
    ids.sort_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX));
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for id in ids {
        let class = &preset.workflow.nodes[id].class_type;
        if registry.get(class).is_some() {
            continue;
        }
        let flag = preset.origins.get(id).cloned().unwrap_or_else(|| format!("node {id}"));
        if seen.insert((flag.clone(), class.clone())) {
            out.push(not_supported(flag, format!("needs node {class}")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_tags_are_extracted() {
        let (p, tags) = extract_loras("a cat <lora:ink:0.8>, sketch<lora:style>").unwrap();
        assert_eq!(p, "a cat , sketch");
        assert_eq!(tags, vec![LoraTag { name: "ink".into(), weight: 0.8 }, LoraTag { name: "style".into(), weight: 1.0 }]);
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
}
