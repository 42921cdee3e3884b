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

use sdflow_executor::{Registry, Workflow};

mod adetailer;
mod dit;
mod graph;
mod params;
mod sd;
mod stages;
mod upscale;

pub use adetailer::adetailer;
pub use dit::ref_image_size;
pub use params::{ANIMATEDIFF_MAX_FRAMES, A1111Img2Img, AdetailerParams, ChromaParams, ControlUnit, Family, HiresParams, ImgGenParams, ModelInfo, RefOptions, SlgParams, TilingParams, RefinerParams, UpscaleParams, VariationParams, VideoParams, HighNoiseParams};
pub use upscale::upscale;

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
        // ComfyUI's dpm_2 drops the next-to-last sigma in KSampler; sd.cpp's keeps it.
        "dpm++2s_a" => "dpmpp_2s_ancestral",
        "dpm++2m" => "dpmpp_2m",
        // ComfyUI's samplers of these names differ from sd.cpp's (ComfyUI's return the
        // denoised estimate at a last sigma of 0; its ipndm_v coefficients differ), and
        // a workflow name means ComfyUI's.
        "ipndm" => "ipndm_sdcpp",
        "ipndm_v" => "ipndm_v_sdcpp",
        "lms" => "k_lms",
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
    /// sd.cpp's `<lora:|high_noise|name:weight>`: for Wan2.2's high-noise expert.
    pub high_noise: bool,
}

/// Removes sd.cpp's `<lora:name:weight>` tags from `prompt`, returning the prompt without
/// them and the tags in order. A tag without a weight has weight 1, as in sd.cpp; a name
/// after `|high_noise|` is the high-noise expert's LoRA.
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
        let (name, high_noise) = match name.trim().strip_prefix("|high_noise|") {
            Some(n) => (n.trim(), true),
            None => (name.trim(), false),
        };
        if name.is_empty() {
            return Err(invalid("-p", format!("LoRA tag `<lora:{body}>` has no name")));
        }
        tags.push(LoraTag { name: name.to_string(), weight, high_noise });
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok((out, tags))
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

/// Whether `-o` holds a printf `%d` pattern (sd-cli then writes a video as numbered
/// images).
pub fn is_frame_pattern(output: &str) -> bool {
    matches!(format_index(output, 0), Ok(Some(_)))
}

/// The file sd-cli writes a video of several frames to for `-o output`: `.avi` and
/// `.webp` as given, any other extension (`.png`, none) replaced by `.avi`. `.webm`
/// (VP8) is refused: sdflow writes no WebM yet.
pub fn video_output(output: &str) -> Result<PathBuf, PresetError> {
    let path = Path::new(output);
    match path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).as_deref() {
        Some("avi" | "webp" | "webm") => Ok(path.to_path_buf()),
        _ => Ok(path.with_extension("avi")),
    }
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

/// Builds sd-cli's `img_gen` graph with the builder of the model's family.
pub fn img_gen(p: &ImgGenParams) -> Result<Preset, PresetError> {
    if p.model_info.family != Family::Wan {
        for (given, flag) in [(p.end_img.is_some(), "--end-img"), (p.clip_vision.is_some(), "--clip_vision"), (p.control_video.is_some(), "--control-video"), (p.vace_strength != 1.0, "--vace-strength")] {
            if given {
                return Err(not_supported(flag, "without a Wan image-to-video model (vid_gen's; unCLIP is not implemented, and IP-Adapter's image encoder is a workflow node, CLIPVisionLoader)"));
            }
        }
    }
    match p.model_info.family {
        Family::Unet => sd::img_gen(p),
        Family::Flux { .. } | Family::Chroma | Family::Sd3 | Family::ZImage | Family::Flux2 | Family::QwenImage | Family::Wan => dit::img_gen(p),
    }
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
mod tests;
