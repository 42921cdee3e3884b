//! What a saved image carries about how it was made: ComfyUI's `prompt` (API format)
//! and `workflow` (UI format) text chunks, so dropping the PNG on ComfyUI or on our editor
//! reopens the graph, and A1111's `parameters` line, which A1111, sd.cpp and most image
//! browsers show.

use sdflow_executor::{ui, InputValue, NodeSpec, Registry, Workflow};
use serde_json::Value as Json;

/// The PNG text chunks for images a run of `wf` saves.
pub fn png_metadata(wf: &Workflow, registry: &Registry) -> Vec<(String, String)> {
    let mut out = vec![("prompt".to_string(), wf.to_api_json().to_string())];
    if let Ok(ui) = ui::workflow_to_ui(wf, registry) {
        out.push(("workflow".to_string(), ui.to_string()));
    }
    if let Some(p) = a1111_parameters(wf) {
        out.push(("parameters".to_string(), p));
    }
    out
}

/// The text chunks that differ per image of a batch, by batch position: A1111's
/// `parameters` of a graph whose noise is a VariationNoise, each with its image's own seed
/// (and variation seed). Empty when every image carries the same text, or when the batch
/// size cannot be read from the graph.
pub fn per_image_metadata(wf: &Workflow) -> Vec<Vec<(String, String)>> {
    let Some(found) = sampling(wf) else { return Vec::new() };
    if found.variation.is_none() {
        return Vec::new();
    }
    let Some(n) = source(wf, found.latent_from, "latent_image").and_then(|l| batch_len(wf, l, 0)) else { return Vec::new() };
    (0..n).filter_map(|i| Some(vec![("parameters".to_string(), parameters_of(wf, i)?)])).collect()
}

/// How many images a node's output holds, where the graph says it plainly (an empty
/// latent's batch size, a repeat, a loaded image, through the nodes that keep the count).
fn batch_len(wf: &Workflow, node: &NodeSpec, depth: usize) -> Option<usize> {
    const MAX: u64 = 4096;
    if depth > 64 {
        return None;
    }
    let count = |input: &str| constant(node, input).and_then(Json::as_u64).filter(|n| (1..=MAX).contains(n)).map(|n| n as usize);
    let from = |input: &str| source(wf, node, input).and_then(|n| batch_len(wf, n, depth + 1));
    match node.class_type.as_str() {
        "EmptyLatentImage" | "EmptySD3LatentImage" => count("batch_size"),
        "RepeatLatentBatch" => Some(count("amount")? * from("samples")?),
        "LoadImage" => Some(1),
        "VAEEncode" | "VAEEncodeTiled" | "VAEEncodeForInpaint" => from("pixels"),
        "SetLatentNoiseMask" | "LatentUpscale" | "LatentUpscaleBy" | "VAEDecode" | "VAEDecodeTiled" => from("samples"),
        "ImageScale" | "ImageScaleBy" | "ImageUpscaleWithModel" => from("image"),
        "KSampler" | "KSamplerAdvanced" | "SamplerCustom" | "SamplerCustomAdvanced" => from("latent_image"),
        _ => None,
    }
}

fn constant<'a>(node: &'a NodeSpec, input: &str) -> Option<&'a Json> {
    match node.inputs.get(input)? {
        InputValue::Const(v) => Some(v),
        InputValue::Link { .. } => None,
    }
}

/// The node a link input points at.
fn source<'a>(wf: &'a Workflow, node: &NodeSpec, input: &str) -> Option<&'a NodeSpec> {
    match node.inputs.get(input)? {
        InputValue::Link { node, .. } => wf.nodes.get(node),
        InputValue::Const(_) => None,
    }
}

/// A1111's name for a sampler, as its infotext writes it.
fn a1111_sampler(name: &str) -> String {
    match name {
        "euler" => "Euler",
        "euler_ancestral" | "euler_a" => "Euler a",
        "heun" => "Heun",
        "dpm_2" | "dpm2" => "DPM2",
        "lms" => "LMS",
        "dpmpp_2s_ancestral" | "dpm++2s_a" => "DPM++ 2S a",
        "dpmpp_2m" | "dpm++2m" => "DPM++ 2M",
        "dpmpp_2m_sde" | "dpm++2m_sde" => "DPM++ 2M SDE",
        "lcm" => "LCM",
        "ddim" => "DDIM",
        other => other,
    }
    .to_string()
}

/// What a sampling node's graph says, wherever the node keeps it: a KSampler holds it all,
/// the custom-sampling nodes spread it over their SAMPLER, SIGMAS, NOISE and GUIDER inputs.
struct Sampling<'a> {
    /// The node whose `positive`/`negative` inputs are the prompts (the sampler, or its
    /// CFGGuider).
    prompts: &'a NodeSpec,
    /// Where `model` is (the sampler, or its CFGGuider) and where `latent_image` is.
    model_from: &'a NodeSpec,
    latent_from: &'a NodeSpec,
    steps: Option<Json>,
    sampler_name: Option<String>,
    scheduler: Option<String>,
    cfg: Option<Json>,
    seed: Option<Json>,
    /// A VariationNoise's variation seed and strength: the seeds count per image.
    variation: Option<(u64, f64)>,
    eta: Option<Json>,
    denoise: Option<f64>,
}

/// Whether a sampler node goes on from another's leftover noise (a refiner's or a split
/// schedule's second part): it adds no noise of its own, so it is not the one whose seed
/// and prompts the image is described by.
fn continues(wf: &Workflow, n: &NodeSpec) -> bool {
    match n.class_type.as_str() {
        "KSamplerAdvanced" => constant(n, "add_noise").and_then(Json::as_str) == Some("disable"),
        "SamplerCustom" => constant(n, "add_noise").and_then(Json::as_bool) == Some(false),
        "SamplerCustomAdvanced" => source(wf, n, "noise").is_some_and(|noise| noise.class_type == "DisableNoise" || constant(noise, "add_noise").and_then(Json::as_bool) == Some(false)),
        _ => false,
    }
}

fn sampling(wf: &Workflow) -> Option<Sampling<'_>> {
    let s = |v: Option<&Json>| v.and_then(Json::as_str).map(str::to_string);
    if let Some((_, ks)) = wf.nodes.iter().find(|(_, n)| (n.class_type == "KSampler" || n.class_type == "KSamplerAdvanced") && !continues(wf, n)) {
        return Some(Sampling {
            prompts: ks,
            model_from: ks,
            latent_from: ks,
            steps: constant(ks, "steps").cloned(),
            sampler_name: s(constant(ks, "sampler_name")),
            scheduler: s(constant(ks, "scheduler")),
            cfg: constant(ks, "cfg").cloned(),
            seed: constant(ks, "seed").or_else(|| constant(ks, "noise_seed")).cloned(),
            variation: None,
            eta: None,
            denoise: constant(ks, "denoise").and_then(Json::as_f64),
        });
    }
    let (_, sc) = wf.nodes.iter().find(|(_, n)| (n.class_type == "SamplerCustom" || n.class_type == "SamplerCustomAdvanced") && !continues(wf, n))?;
    let advanced = sc.class_type == "SamplerCustomAdvanced";
    let guider = if advanced { source(wf, sc, "guider").filter(|g| g.class_type == "CFGGuider")? } else { sc };
    let sampler = source(wf, sc, "sampler");
    let sigmas = source(wf, sc, "sigmas");
    let (mut steps, mut scheduler, mut denoise) = (None, None, None);
    match sigmas {
        Some(n) if n.class_type == "BasicScheduler" => {
            steps = constant(n, "steps").cloned();
            scheduler = s(constant(n, "scheduler"));
            denoise = constant(n, "denoise").and_then(Json::as_f64);
        }
        // Typed sigmas: one step fewer than sigmas.
        Some(n) if n.class_type == "ManualSigmas" => {
            let count = constant(n, "sigmas").and_then(Json::as_str).map(|t| t.split(|c: char| c == ',' || c.is_whitespace() || c == '[' || c == ']').filter(|p| !p.is_empty()).count());
            steps = count.filter(|c| *c >= 2).map(|c| Json::from(c - 1));
        }
        _ => {}
    }
    let noise = if advanced { source(wf, sc, "noise").filter(|n| n.class_type == "RandomNoise" || n.class_type == "VariationNoise") } else { None };
    let seed = if advanced { noise.and_then(|n| constant(n, "noise_seed")).cloned() } else { constant(sc, "noise_seed").cloned() };
    let variation = noise.filter(|n| n.class_type == "VariationNoise").and_then(|n| Some((constant(n, "variation_seed")?.as_u64()?, constant(n, "variation_strength")?.as_f64()?)));
    Some(Sampling {
        prompts: guider,
        model_from: guider,
        latent_from: sc,
        steps,
        sampler_name: sampler.and_then(|n| s(constant(n, "sampler_name"))),
        scheduler,
        cfg: constant(guider, "cfg").cloned(),
        seed,
        variation,
        eta: sampler.filter(|n| n.class_type == "KSamplerSelectAdvanced").and_then(|n| constant(n, "eta")).cloned(),
        denoise,
    })
}

/// `prompt\nNegative prompt: …\nSteps: …, Sampler: …, CFG scale: …, Seed: …, Size: WxH,
/// Model: …` from the first KSampler (or custom sampler) whose prompts are plain
/// CLIPTextEncode texts; `None` for graphs without one (A1111's format has no way to say
/// more).
pub fn a1111_parameters(wf: &Workflow) -> Option<String> {
    parameters_of(wf, 0)
}

/// [`a1111_parameters`] for the image at batch position `index`: with a VariationNoise
/// its own seed and variation seed, as A1111 writes them.
fn parameters_of(wf: &Workflow, index: usize) -> Option<String> {
    let found = sampling(wf)?;
    let text = |input: &str| -> Option<String> {
        let n = source(wf, found.prompts, input)?;
        (n.class_type == "CLIPTextEncode").then(|| constant(n, "text")?.as_str().map(str::to_string))?
    };
    let positive = text("positive")?;
    let mut out = positive;
    if let Some(neg) = text("negative").filter(|t| !t.is_empty()) {
        out.push_str(&format!("\nNegative prompt: {neg}"));
    }
    let mut fields: Vec<String> = Vec::new();
    if let Some(steps) = &found.steps {
        fields.push(format!("Steps: {steps}"));
    }
    if let Some(s) = &found.sampler_name {
        fields.push(format!("Sampler: {}", a1111_sampler(s)));
    }
    if let Some(s) = &found.scheduler {
        fields.push(format!("Schedule type: {s}"));
    }
    if let Some(cfg) = &found.cfg {
        fields.push(format!("CFG scale: {cfg}"));
    }
    // A1111's seeds over a batch: each image's own, the seed fixed and the variation
    // seed counting when there is a variation strength.
    let seeds = found.variation.and_then(|(sub, strength)| {
        let seed = found.seed.as_ref()?.as_u64()?;
        let i = index as u64;
        Some(if strength == 0.0 { (seed.wrapping_add(i), None) } else { (seed, Some((sub.wrapping_add(i), strength))) })
    });
    match (&seeds, &found.seed) {
        (Some((seed, _)), _) => fields.push(format!("Seed: {seed}")),
        (None, Some(seed)) => fields.push(format!("Seed: {seed}")),
        (None, None) => {}
    }
    if let Some(l) = source(wf, found.latent_from, "latent_image").filter(|n| n.class_type == "EmptyLatentImage") {
        if let (Some(w), Some(h)) = (constant(l, "width"), constant(l, "height")) {
            fields.push(format!("Size: {w}x{h}"));
        }
    }
    if let Some(m) = source(wf, found.model_from, "model").filter(|n| n.class_type == "CheckpointLoaderSimple") {
        if let Some(name) = constant(m, "ckpt_name").and_then(Json::as_str) {
            let stem = std::path::Path::new(name).file_stem().map_or(name.to_string(), |s| s.to_string_lossy().into_owned());
            fields.push(format!("Model: {stem}"));
        }
    }
    if let Some((_, Some((sub, strength)))) = seeds {
        fields.push(format!("Variation seed: {sub}, Variation seed strength: {strength}"));
    }
    if let Some(d) = found.denoise.filter(|d| *d < 1.0) {
        fields.push(format!("Denoising strength: {d}"));
    }
    if let Some(eta) = &found.eta {
        fields.push(format!("Eta: {eta}"));
    }
    fields.push("Version: sdflow".to_string());
    out.push('\n');
    out.push_str(&fields.join(", "));
    Some(out)
}

// ---------------------------------------------------------------------------------------
// Reading: what `sdflow metadata` shows, from the file's bytes alone (no model, no image
// decoding).

/// One piece of text an image carries.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MetadataEntry {
    /// Where it was found: `tEXt`, `zTXt`, `iTXt` (PNG chunks), `EXIF` (the TIFF tags of a
    /// JPEG APP1 or WebP EXIF chunk), `COM` (a JPEG comment), `XMP`.
    pub source: String,
    /// The PNG keyword (`parameters`, `prompt`, `workflow`, ...) or the EXIF tag name
    /// (`UserComment`, `ImageDescription`, ...).
    pub key: String,
    pub text: String,
}

/// The metadata of one image file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ImageMetadata {
    /// `png`, `jpeg` or `webp`.
    pub format: &'static str,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub entries: Vec<MetadataEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The OS error is part of the message, not a `source`: a chain printer would repeat it.
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("not a PNG, JPEG or WebP file")]
    Unrecognized,
    #[error("malformed {format} at byte {offset}: {msg}")]
    Malformed { format: &'static str, offset: usize, msg: String },
}

/// Largest file `read_metadata` reads, and the most a compressed text chunk may inflate to.
const MAX_FILE: u64 = 1 << 30;
const MAX_INFLATED: u64 = 64 << 20;

/// Reads the metadata of the image at `path`.
pub fn read_metadata(path: &std::path::Path) -> Result<ImageMetadata, MetadataError> {
    use std::io::Read;
    let io = |error| MetadataError::Io { path: path.display().to_string(), error };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE).read_to_end(&mut bytes).map_err(io)?;
    parse_metadata(&bytes)
}

/// Reads the metadata of an image held in memory.
pub fn parse_metadata(bytes: &[u8]) -> Result<ImageMetadata, MetadataError> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        png_entries(bytes)
    } else if bytes.starts_with(&[0xff, 0xd8]) {
        jpeg_entries(bytes)
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        webp_entries(bytes)
    } else {
        Err(MetadataError::Unrecognized)
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| c as char).collect()
}

fn inflate(data: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(data).take(MAX_INFLATED + 1).read_to_end(&mut out).map_err(|e| format!("bad zlib data: {e}"))?;
    if out.len() as u64 > MAX_INFLATED {
        return Err(format!("inflates to more than {MAX_INFLATED} bytes"));
    }
    Ok(out)
}

fn png_entries(b: &[u8]) -> Result<ImageMetadata, MetadataError> {
    let bad = |offset: usize, msg: String| MetadataError::Malformed { format: "PNG", offset, msg };
    let mut meta = ImageMetadata { format: "png", width: None, height: None, entries: Vec::new() };
    let mut at = 8;
    while at < b.len() {
        let len = be32(b, at).ok_or_else(|| bad(at, "truncated chunk header".into()))? as usize;
        let kind = b.get(at + 4..at + 8).ok_or_else(|| bad(at, "truncated chunk header".into()))?;
        let data = at.checked_add(8 + len).and_then(|end| b.get(at + 8..end)).ok_or_else(|| bad(at, format!("chunk {} of {len} bytes runs past the end of the file", latin1(kind))))?;
        let split = |d: &'static str| -> Result<(String, &[u8]), MetadataError> {
            let nul = data.iter().position(|&c| c == 0).ok_or_else(|| bad(at, format!("{d} chunk without a keyword terminator")))?;
            Ok((latin1(&data[..nul]), &data[nul + 1..]))
        };
        match kind {
            b"IHDR" => {
                meta.width = be32(data, 0);
                meta.height = be32(data, 4);
            }
            b"tEXt" => {
                let (key, text) = split("tEXt")?;
                meta.entries.push(MetadataEntry { source: "tEXt".into(), key, text: latin1(text) });
            }
            b"zTXt" => {
                let (key, rest) = split("zTXt")?;
                let (&method, z) = rest.split_first().ok_or_else(|| bad(at, "zTXt chunk without a compression method".into()))?;
                if method != 0 {
                    return Err(bad(at, format!("zTXt compression method {method}")));
                }
                let text = inflate(z).map_err(|m| bad(at, format!("zTXt `{key}`: {m}")))?;
                meta.entries.push(MetadataEntry { source: "zTXt".into(), key, text: latin1(&text) });
            }
            b"iTXt" => {
                let (key, rest) = split("iTXt")?;
                if rest.len() < 2 {
                    return Err(bad(at, "truncated iTXt chunk".into()));
                }
                let (compressed, rest) = (rest[0] == 1, &rest[2..]);
                // Language tag and translated keyword, both NUL-terminated.
                let lang_end = rest.iter().position(|&c| c == 0).ok_or_else(|| bad(at, "iTXt without a language tag".into()))?;
                let rest = &rest[lang_end + 1..];
                let tk_end = rest.iter().position(|&c| c == 0).ok_or_else(|| bad(at, "iTXt without a translated keyword".into()))?;
                let raw = &rest[tk_end + 1..];
                let bytes = if compressed { inflate(raw).map_err(|m| bad(at, format!("iTXt `{key}`: {m}")))? } else { raw.to_vec() };
                let text = String::from_utf8(bytes).map_err(|_| bad(at, format!("iTXt `{key}` is not UTF-8")))?;
                meta.entries.push(MetadataEntry { source: "iTXt".into(), key, text });
            }
            b"eXIf" => meta.entries.extend(exif_entries(data)),
            b"IEND" => break,
            _ => {}
        }
        at += 12 + len;
    }
    Ok(meta)
}

fn jpeg_entries(b: &[u8]) -> Result<ImageMetadata, MetadataError> {
    let bad = |offset: usize, msg: String| MetadataError::Malformed { format: "JPEG", offset, msg };
    let mut meta = ImageMetadata { format: "jpeg", width: None, height: None, entries: Vec::new() };
    let mut at = 2;
    loop {
        // Fill bytes (0xff runs) may precede a marker.
        while b.get(at) == Some(&0xff) && b.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        let (Some(&0xff), Some(&marker)) = (b.get(at), b.get(at + 1)) else {
            if at >= b.len() {
                break;
            }
            return Err(bad(at, "expected a marker".into()));
        };
        at += 2;
        if marker == 0xd9 || marker == 0xda {
            // End of image, or start of the entropy-coded scan: no more metadata segments.
            break;
        }
        if (0xd0..=0xd7).contains(&marker) || marker == 0x01 {
            continue;
        }
        let len = be16(b, at).ok_or_else(|| bad(at, "truncated segment length".into()))? as usize;
        if len < 2 {
            return Err(bad(at, format!("segment length {len}")));
        }
        let data = b.get(at + 2..at + len).ok_or_else(|| bad(at, format!("segment of {len} bytes runs past the end of the file")))?;
        match marker {
            0xe1 if data.starts_with(b"Exif\0\0") => meta.entries.extend(exif_entries(&data[6..])),
            0xe1 if data.starts_with(b"http://ns.adobe.com/xap/1.0/\0") => {
                meta.entries.push(MetadataEntry { source: "XMP".into(), key: "XMP".into(), text: String::from_utf8_lossy(&data[29..]).into_owned() });
            }
            0xfe => meta.entries.push(MetadataEntry { source: "COM".into(), key: "comment".into(), text: String::from_utf8_lossy(data).into_owned() }),
            0xc0..=0xcf if ![0xc4, 0xc8, 0xcc].contains(&marker) => {
                meta.height = be16(data, 1).map(u32::from);
                meta.width = be16(data, 3).map(u32::from);
            }
            _ => {}
        }
        at += len;
    }
    Ok(meta)
}

fn webp_entries(b: &[u8]) -> Result<ImageMetadata, MetadataError> {
    let bad = |offset: usize, msg: String| MetadataError::Malformed { format: "WebP", offset, msg };
    let mut meta = ImageMetadata { format: "webp", width: None, height: None, entries: Vec::new() };
    let end = (le32(b, 4).unwrap_or(0) as usize).saturating_add(8).min(b.len());
    let mut at = 12;
    while at + 8 <= end {
        let kind = &b[at..at + 4];
        let len = le32(b, at + 4).unwrap_or(0) as usize;
        let data = (at + 8).checked_add(len).and_then(|e| b.get(at + 8..e)).ok_or_else(|| bad(at, format!("chunk {} of {len} bytes runs past the end of the file", latin1(kind))))?;
        match kind {
            b"VP8X" if data.len() >= 10 => {
                let w = u32::from_le_bytes([data[4], data[5], data[6], 0]) + 1;
                let h = u32::from_le_bytes([data[7], data[8], data[9], 0]) + 1;
                (meta.width, meta.height) = (Some(w), Some(h));
            }
            b"VP8 " if data.len() >= 10 && meta.width.is_none() => {
                meta.width = Some(u32::from(u16::from_le_bytes([data[6], data[7]]) & 0x3fff));
                meta.height = Some(u32::from(u16::from_le_bytes([data[8], data[9]]) & 0x3fff));
            }
            b"VP8L" if data.len() >= 5 && meta.width.is_none() => {
                let bits = u32::from_le_bytes([data[1], data[2], data[3], data[4]]);
                meta.width = Some((bits & 0x3fff) + 1);
                meta.height = Some(((bits >> 14) & 0x3fff) + 1);
            }
            b"EXIF" => {
                let tiff = data.strip_prefix(b"Exif\0\0").unwrap_or(data);
                meta.entries.extend(exif_entries(tiff));
            }
            b"XMP " => meta.entries.push(MetadataEntry { source: "XMP".into(), key: "XMP".into(), text: String::from_utf8_lossy(data).into_owned() }),
            _ => {}
        }
        at += 8 + len + (len & 1);
    }
    Ok(meta)
}

/// The text tags of a TIFF (EXIF) block: ImageDescription, Make, Model, Software, Artist
/// and XPComment from IFD0, UserComment from the EXIF IFD. A malformed block yields what
/// could be read before the fault.
fn exif_entries(t: &[u8]) -> Vec<MetadataEntry> {
    let little = match t.get(..4) {
        Some(b"II*\0") => true,
        Some(b"MM\0*") => false,
        _ => return Vec::new(),
    };
    let u16_at = |at: usize| t.get(at..at + 2).map(|s| if little { u16::from_le_bytes([s[0], s[1]]) } else { u16::from_be_bytes([s[0], s[1]]) });
    let u32_at = |at: usize| t.get(at..at + 4).map(|s| if little { u32::from_le_bytes([s[0], s[1], s[2], s[3]]) } else { u32::from_be_bytes([s[0], s[1], s[2], s[3]]) });
    let mut out = Vec::new();
    let mut ifds = vec![(u32_at(4).unwrap_or(0) as usize, false)];
    let mut visited = std::collections::HashSet::new();
    while let Some((ifd, is_exif)) = ifds.pop() {
        if ifd == 0 || !visited.insert(ifd) || visited.len() > 8 {
            continue;
        }
        let Some(n) = u16_at(ifd) else { continue };
        for i in 0..n as usize {
            let e = ifd + 2 + i * 12;
            let (Some(tag), Some(ty), Some(count)) = (u16_at(e), u16_at(e + 2), u32_at(e + 4)) else { break };
            let size = match ty {
                1 | 2 | 6 | 7 => 1usize,
                3 | 8 => 2,
                _ => 4,
            }
            .saturating_mul(count as usize);
            let value = if size <= 4 { t.get(e + 8..e + 8 + size) } else { u32_at(e + 8).and_then(|off| t.get(off as usize..(off as usize).saturating_add(size))) };
            let Some(value) = value else { continue };
            let ascii = || String::from_utf8_lossy(value).trim_end_matches('\0').to_string();
            let (key, text) = match (tag, is_exif) {
                (0x8769, false) => {
                    if let Some(off) = u32_at(e + 8) {
                        ifds.push((off as usize, true));
                    }
                    continue;
                }
                (0x010e, false) => ("ImageDescription", ascii()),
                (0x010f, false) => ("Make", ascii()),
                (0x0110, false) => ("Model", ascii()),
                (0x0131, false) => ("Software", ascii()),
                (0x013b, false) => ("Artist", ascii()),
                (0x9c9c, false) => ("XPComment", utf16(value, true).trim_end_matches('\0').to_string()),
                (0x9286, true) => ("UserComment", user_comment(value, little)),
                _ => continue,
            };
            out.push(MetadataEntry { source: "EXIF".into(), key: key.into(), text });
        }
    }
    out
}

fn utf16(b: &[u8], little: bool) -> String {
    let units: Vec<u16> = b.chunks_exact(2).map(|c| if little { u16::from_le_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], c[1]]) }).collect();
    String::from_utf16_lossy(&units)
}

/// EXIF UserComment: an 8-byte character-code prefix, then the text. Writers disagree on
/// the byte order of `UNICODE` (A1111's piexif writes big-endian whatever the TIFF order),
/// so both are tried and the one that reads as more plain text wins.
fn user_comment(v: &[u8], little: bool) -> String {
    let (code, body) = if v.len() >= 8 { v.split_at(8) } else { (&v[..0], v) };
    let text = if code == b"UNICODE\0" {
        let plain = |s: &str| s.chars().filter(|c| c.is_ascii_graphic() || *c == ' ' || *c == '\n').count();
        let (a, b) = (utf16(body, little), utf16(body, !little));
        if plain(&b) > plain(&a) {
            b
        } else {
            a
        }
    } else {
        String::from_utf8_lossy(body).into_owned()
    };
    text.trim_end_matches('\0').to_string()
}

impl ImageMetadata {
    /// The JSON `sdflow metadata --metadata-format json` prints; entries whose text is a
    /// JSON document (ComfyUI's `prompt` and `workflow`) carry it parsed, as `json`.
    pub fn to_json(&self) -> Json {
        let entries: Vec<Json> = self
            .entries
            .iter()
            .map(|e| {
                let mut o = serde_json::json!({ "source": e.source, "key": e.key, "text": e.text });
                if let Ok(v @ (Json::Object(_) | Json::Array(_))) = serde_json::from_str::<Json>(&e.text) {
                    o["json"] = v;
                }
                o
            })
            .collect();
        serde_json::json!({ "format": self.format, "width": self.width, "height": self.height, "entries": entries })
    }

    /// The text form: a header line, then each entry as `[source] key:` and its text.
    pub fn to_text(&self) -> String {
        let size = match (self.width, self.height) {
            (Some(w), Some(h)) => format!(", {w}x{h}"),
            _ => String::new(),
        };
        let mut out = format!("format: {}{size}\n", self.format.to_uppercase());
        if self.entries.is_empty() {
            out.push_str("no text metadata\n");
        }
        for e in &self.entries {
            out.push_str(&format!("[{}] {}:\n{}\n", e.source, e.key, e.text.trim_end()));
        }
        out
    }
}

#[cfg(test)]
mod parameters_tests {
    use super::*;

    fn node(class: &str, inputs: Json) -> NodeSpec {
        let mut n = NodeSpec::new(class);
        for (k, v) in inputs.as_object().unwrap() {
            n.inputs.insert(k.clone(), InputValue::from_json(v.clone()));
        }
        n
    }

    /// The graph sd-cli's presets build for `--eta` (SamplerCustom over KSamplerSelectAdvanced
    /// and BasicScheduler), and ComfyUI's SamplerCustomAdvanced with a guider and typed
    /// sigmas, give the same A1111 fields a KSampler would.
    #[test]
    fn custom_sampling_graphs_have_parameters() {
        let mut wf = Workflow::new();
        wf.nodes.insert("1".into(), node("CheckpointLoaderSimple", serde_json::json!({"ckpt_name": "sub/sd15.safetensors"})));
        wf.nodes.insert("2".into(), node("CLIPTextEncode", serde_json::json!({"text": "a cat", "clip": ["1", 1]})));
        wf.nodes.insert("3".into(), node("CLIPTextEncode", serde_json::json!({"text": "blurry", "clip": ["1", 1]})));
        wf.nodes.insert("4".into(), node("EmptyLatentImage", serde_json::json!({"width": 64, "height": 96, "batch_size": 1})));
        wf.nodes.insert("5".into(), node("KSamplerSelectAdvanced", serde_json::json!({"sampler_name": "euler_ancestral", "eta": 0.5, "s_noise": 1.0, "noise": "gpu"})));
        wf.nodes.insert("6".into(), node("BasicScheduler", serde_json::json!({"model": ["1", 0], "scheduler": "karras", "steps": 12, "denoise": 0.75})));
        wf.nodes.insert("7".into(), node("SamplerCustom", serde_json::json!({"model": ["1", 0], "add_noise": true, "noise_seed": 9, "cfg": 6.5, "positive": ["2", 0], "negative": ["3", 0], "sampler": ["5", 0], "sigmas": ["6", 0], "latent_image": ["4", 0]})));
        let p = a1111_parameters(&wf).unwrap();
        assert_eq!(p, "a cat\nNegative prompt: blurry\nSteps: 12, Sampler: Euler a, Schedule type: karras, CFG scale: 6.5, Seed: 9, Size: 64x96, Model: sd15, Denoising strength: 0.75, Eta: 0.5, Version: sdflow");

        wf.nodes.remove("7");
        wf.nodes.insert("8".into(), node("CFGGuider", serde_json::json!({"model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "cfg": 4.0})));
        wf.nodes.insert("9".into(), node("RandomNoise", serde_json::json!({"noise_seed": 77})));
        wf.nodes.insert("10".into(), node("ManualSigmas", serde_json::json!({"sigmas": "14.6, 7.0, 2.0, 0"})));
        wf.nodes.insert("11".into(), node("KSamplerSelect", serde_json::json!({"sampler_name": "dpmpp_2m"})));
        wf.nodes.insert("12".into(), node("SamplerCustomAdvanced", serde_json::json!({"noise": ["9", 0], "guider": ["8", 0], "sampler": ["11", 0], "sigmas": ["10", 0], "latent_image": ["4", 0]})));
        let p = a1111_parameters(&wf).unwrap();
        assert_eq!(p, "a cat\nNegative prompt: blurry\nSteps: 3, Sampler: DPM++ 2M, CFG scale: 4.0, Seed: 77, Size: 64x96, Model: sd15, Version: sdflow");
        assert!(per_image_metadata(&wf).is_empty(), "RandomNoise: one text for the batch");

        // A1111's seeds: each image of the batch its own, as A1111's infotext has them.
        wf.nodes.insert("4".into(), node("EmptyLatentImage", serde_json::json!({"width": 64, "height": 96, "batch_size": 3})));
        wf.nodes.insert("9".into(), node("VariationNoise", serde_json::json!({"noise_seed": 77, "variation_seed": 5, "variation_strength": 0.0})));
        let seeds: Vec<String> = per_image_metadata(&wf).into_iter().map(|m| m[0].1.split(", ").find(|f| f.starts_with("Seed")).unwrap().to_string()).collect();
        assert_eq!(seeds, ["Seed: 77", "Seed: 78", "Seed: 79"]);
        wf.nodes.insert("9".into(), node("VariationNoise", serde_json::json!({"noise_seed": 77, "variation_seed": 5, "variation_strength": 0.25})));
        let texts = per_image_metadata(&wf);
        assert_eq!(texts.len(), 3);
        assert!(texts[2][0].1.ends_with("Seed: 77, Size: 64x96, Model: sd15, Variation seed: 7, Variation seed strength: 0.25, Version: sdflow"), "{}", texts[2][0].1);
        assert_eq!(a1111_parameters(&wf), Some(texts[0][0].1.clone()));
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    fn png_chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        // CRCs are not checked when reading metadata, so any value does.
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&[0, 0, 0, 0]);
        out
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn tiff_with_user_comment(comment: &[u8], little: bool) -> Vec<u8> {
        let w16 = |v: u16| if little { v.to_le_bytes() } else { v.to_be_bytes() };
        let w32 = |v: u32| if little { v.to_le_bytes() } else { v.to_be_bytes() };
        let mut t: Vec<u8> = if little { b"II*\0".to_vec() } else { b"MM\0*".to_vec() };
        t.extend(w32(8));
        // IFD0 at 8: ImageDescription (inline "hi\0") and the EXIF IFD pointer.
        t.extend(w16(2));
        t.extend(w16(0x010e));
        t.extend(w16(2));
        t.extend(w32(3));
        t.extend(b"hi\0\0");
        t.extend(w16(0x8769));
        t.extend(w16(4));
        t.extend(w32(1));
        t.extend(w32(8 + 2 + 24 + 4));
        t.extend(w32(0));
        // EXIF IFD: UserComment pointing after itself.
        let data_at = t.len() + 2 + 12 + 4;
        t.extend(w16(1));
        t.extend(w16(0x9286));
        t.extend(w16(7));
        t.extend(w32(comment.len() as u32));
        t.extend(w32(data_at as u32));
        t.extend(w32(0));
        t.extend_from_slice(comment);
        t
    }

    #[test]
    fn png_text_chunks() {
        let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = 64u32.to_be_bytes().to_vec();
        ihdr.extend(48u32.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        f.extend(png_chunk(b"IHDR", &ihdr));
        f.extend(png_chunk(b"tEXt", b"parameters\0a cat\nSteps: 20"));
        let mut z = b"prompt\0\0".to_vec();
        z.extend(zlib(b"{\"1\": {}}"));
        f.extend(png_chunk(b"zTXt", &z));
        let mut i = b"workflow\0\x01\0en\0\0".to_vec();
        i.extend(zlib("{\"nodes\": [\"é\"]}".as_bytes()));
        f.extend(png_chunk(b"iTXt", &i));
        f.extend(png_chunk(b"IEND", b""));
        let m = parse_metadata(&f).unwrap();
        assert_eq!((m.format, m.width, m.height), ("png", Some(64), Some(48)));
        let keys: Vec<(&str, &str, &str)> = m.entries.iter().map(|e| (e.source.as_str(), e.key.as_str(), e.text.as_str())).collect();
        assert_eq!(keys, [("tEXt", "parameters", "a cat\nSteps: 20"), ("zTXt", "prompt", "{\"1\": {}}"), ("iTXt", "workflow", "{\"nodes\": [\"é\"]}")]);
        let j = m.to_json();
        assert_eq!(j["entries"][1]["json"], serde_json::json!({"1": {}}));
        assert!(m.to_text().starts_with("format: PNG, 64x48\n[tEXt] parameters:\na cat\n"));

        // A chunk whose length runs past the end is an error, not a panic.
        let mut cut = f.clone();
        cut.truncate(40);
        assert!(matches!(parse_metadata(&cut), Err(MetadataError::Malformed { .. })));
    }

    #[test]
    fn jpeg_exif_user_comment_and_comment() {
        let mut comment = b"UNICODE\0".to_vec();
        for u in "a cat\nSteps: 20".encode_utf16() {
            comment.extend(u.to_be_bytes());
        }
        for little in [false, true] {
            let tiff = tiff_with_user_comment(&comment, little);
            let mut f = vec![0xff, 0xd8];
            let mut app1 = b"Exif\0\0".to_vec();
            app1.extend(&tiff);
            f.extend([0xff, 0xe1]);
            f.extend(((app1.len() + 2) as u16).to_be_bytes());
            f.extend(&app1);
            f.extend([0xff, 0xfe]);
            f.extend(((b"made by hand".len() + 2) as u16).to_be_bytes());
            f.extend(b"made by hand");
            // SOF0: precision, height 30, width 40, 1 component.
            f.extend([0xff, 0xc0, 0, 11, 8, 0, 30, 0, 40, 1, 1, 0x11, 0]);
            f.extend([0xff, 0xda, 0, 2, 0xff, 0xd9]);
            let m = parse_metadata(&f).unwrap();
            assert_eq!((m.format, m.width, m.height), ("jpeg", Some(40), Some(30)));
            let got: Vec<(&str, &str)> = m.entries.iter().map(|e| (e.key.as_str(), e.text.as_str())).collect();
            assert!(got.contains(&("UserComment", "a cat\nSteps: 20")), "{got:?} (little-endian TIFF: {little})");
            assert!(got.contains(&("ImageDescription", "hi")), "{got:?}");
            assert!(got.contains(&("comment", "made by hand")), "{got:?}");
        }
        // A truncated segment is reported with its offset.
        assert!(matches!(parse_metadata(&[0xff, 0xd8, 0xff, 0xe1, 0x10, 0x00, 1, 2]), Err(MetadataError::Malformed { format: "JPEG", offset: 4, .. })));
        assert!(matches!(parse_metadata(b"GIF89a"), Err(MetadataError::Unrecognized)));
    }

    #[test]
    fn webp_exif_and_xmp_chunks() {
        let mut comment = b"ASCII\0\0\0".to_vec();
        comment.extend(b"a cat, Steps: 20");
        let tiff = tiff_with_user_comment(&comment, true);
        let chunk = |kind: &[u8], data: &[u8]| {
            let mut c = kind.to_vec();
            c.extend((data.len() as u32).to_le_bytes());
            c.extend(data);
            if data.len() % 2 == 1 {
                c.push(0);
            }
            c
        };
        let mut body = b"WEBP".to_vec();
        body.extend(chunk(b"VP8X", &[0x08, 0, 0, 0, 99, 0, 0, 49, 0, 0]));
        body.extend(chunk(b"VP8L", &[0x2f, 0, 0, 0, 0]));
        body.extend(chunk(b"EXIF", &tiff));
        body.extend(chunk(b"XMP ", b"<x:xmpmeta>odd</x:xmpmeta>"));
        let mut f = b"RIFF".to_vec();
        f.extend((body.len() as u32).to_le_bytes());
        f.extend(body);
        let m = parse_metadata(&f).unwrap();
        assert_eq!((m.format, m.width, m.height), ("webp", Some(100), Some(50)));
        let got: Vec<(&str, &str, &str)> = m.entries.iter().map(|e| (e.source.as_str(), e.key.as_str(), e.text.as_str())).collect();
        assert!(got.contains(&("EXIF", "UserComment", "a cat, Steps: 20")), "{got:?}");
        assert!(got.contains(&("XMP", "XMP", "<x:xmpmeta>odd</x:xmpmeta>")), "{got:?}");
        // A chunk claiming more bytes than the file has.
        let mut bad = f.clone();
        let n = bad.len();
        bad.truncate(n - 10);
        let len = (bad.len() - 8) as u32;
        bad[4..8].copy_from_slice(&len.to_le_bytes());
        assert!(parse_metadata(&bad).is_err());
    }
}
