//! SD3 / SD3.5: ComfyUI's SD3 text conditioning (`sd3_clip.py`) and its nodes
//! (`comfy_extras/nodes_sd3.py`): TripleCLIPLoader, CLIPTextEncodeSD3 and
//! SkipLayerGuidanceSD3. CLIPLoader and DualCLIPLoader load the same encoders with type
//! `sd3`.
//!
//! The conditioning: CLIP-L's and OpenCLIP-G's penultimate hidden states side by side,
//! zero-padded to T5's width, followed by T5-XXL's tokens (at least 77); the pooled vector
//! is CLIP-L's (raw) then OpenCLIP-G's (projected). Encoders a CLIP lacks give zeros, as
//! ComfyUI's do.

use sdflow_core::placement::Module;
use crate::loaders::TEXT_ENCODERS;
use crate::runtime::Runtime;
use crate::values::{ClipRef, CondEntry, CondList, ModelRef, SlgWindow};
use sdflow_core::models::dit::SkipLayers;
use crate::{err, loaders};
use sdflow_core::detect::ModelFamily;
use sdflow_core::models::clip::{ClipTextConfig, ClipTextModel};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::sd::{encode_prompt_with, Pooled};
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::t5::T5Tokenizer;
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipTokenizer, PadToken};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::PathBuf;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(TripleClipLoader { rt: rt.clone() }));
    registry.register(Arc::new(ClipTextEncodeSd3 { rt: rt.clone() }));
    registry.register(Arc::new(SkipLayerGuidance { dit: false }));
    registry.register(Arc::new(SkipLayerGuidance { dit: true }));
}

/// ComfyUI's T5 `min_length` for SD3: shorter prompts are padded to 77 tokens.
const T5_MIN_TOKENS: usize = 77;
/// The widths ComfyUI fills with zeros for a missing CLIP-L / OpenCLIP-G, and the token
/// width without a T5.
const L_WIDTH: usize = 768;
const G_WIDTH: usize = 1280;
const CONTEXT: usize = 4096;
/// CLIP-L and OpenCLIP-G read their penultimate layer (ComfyUI's `layer_idx=-2`).
const CLIP_SKIP: u32 = 2;

/// An encoder of an SD3 CLIP, ready to run.
struct Loaded<'w> {
    model: ClipTextModel<'w>,
    pad: PadToken,
}

/// The conditioning of an SD3 CLIP for its three prompts; `None` is a prompt with no
/// tokens at all (CLIPTextEncodeSD3's `empty_padding: none` on an empty field), which
/// differs from the empty prompt.
pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, l: Option<&str>, g: Option<&str>, t5_text: Option<&str>) -> Result<Conditioning, NodeError> {
    if clip.encoders.is_empty() && clip.t5.is_none() {
        return Err(NodeError::msg("this SD3 CLIP has no text encoders (the checkpoint holds none): load clip_l, clip_g and t5xxl with TripleCLIPLoader (sd-cli's --clip_l, --clip_g, --t5xxl)"));
    }
    let pinned = clip.encoders.iter().map(|e| rt.pin(clip.place, &e.weights)).collect::<Result<Vec<_>, _>>()?;
    let mut loaded = Vec::with_capacity(pinned.len());
    for (enc, weights) in clip.encoders.iter().zip(&pinned) {
        let config = ClipTextConfig::infer(weights, &enc.prefix, enc.layout).map_err(err)?;
        loaded.push(ClipTextModel::new(weights, &enc.prefix, config).map_err(err)?);
    }
    // Two encoders come narrower first; one alone is OpenCLIP-G only at G's width.
    let (mut enc_l, mut enc_g) = (None, None);
    for (k, model) in loaded.into_iter().enumerate() {
        let is_g = if clip.encoders.len() == 2 { k == 1 } else { model.config.hidden as usize == G_WIDTH };
        let slot = if is_g { &mut enc_g } else { &mut enc_l };
        *slot = Some(Loaded { model, pad: if is_g { PadToken::Zero } else { PadToken::EndOfText } });
    }
    let t5_weights = clip.t5.as_ref().map(|t| rt.pin(clip.place, &t.weights)).transpose()?;
    let t5_model = match (&clip.t5, &t5_weights) {
        (Some(t), Some(w)) => Some(T5Encoder::new(w, &t.prefix, T5Config::infer(w, &t.prefix).map_err(err)?).map_err(err)?),
        _ => None,
    };
    let width = t5_model.as_ref().map_or(CONTEXT, |m| m.config.d_model as usize);
    let skip = clip.clip_skip.unwrap_or(CLIP_SKIP) as usize;

    let mut rows: Vec<f32> = Vec::new();
    let mut tokens = 0usize;
    let mut pooled = None;
    if l.is_some() || g.is_some() {
        // A prompt with no tokens beside one with some is grown with empty chunks, as
        // ComfyUI evens the two encoders' chunk counts.
        let library = rt.embedding_library()?;
        let tokenize = |e: &Loaded<'_>, text: &str| {
            let tokenizer = ClipTokenizer::new(e.pad);
            tokenize_weighted(text, &tokenizer, library.as_ref(), &ChunkOptions::default()).map(|p| (p, tokenizer.pad())).map_err(err)
        };
        let pl = enc_l.as_ref().map(|e| tokenize(e, l.unwrap_or(""))).transpose()?;
        let pg = enc_g.as_ref().map(|e| tokenize(e, g.unwrap_or(""))).transpose()?;
        let chunks = pl.iter().chain(&pg).map(|p| p.0.chunks.len()).max().unwrap_or(0);
        let run = |e: &Option<Loaded<'_>>, p: Option<(sdflow_core::text::TokenizedPrompt, u32)>, pool: Pooled| -> Result<Option<Conditioning>, NodeError> {
            let (Some(e), Some((p, pad))) = (e, p) else { return Ok(None) };
            let p = p.padded_to(chunks, pad);
            let skip = skip.clamp(1, e.model.config.layers);
            rt.with_backend(clip.place, |b| encode_prompt_with(b, &e.model, &p, skip, false, pool)).map(Some).map_err(err)
        };
        let cl = run(&enc_l, pl, Pooled::Raw)?;
        let cg = run(&enc_g, pg, Pooled::Projected)?;
        let (dl, dg) = (cl.as_ref().map_or(L_WIDTH, |c| c.dim as usize), cg.as_ref().map_or(0, |c| c.dim as usize));
        if (cl.is_some() || cg.is_some()) && dl + dg > width {
            return Err(NodeError::msg(format!("CLIP-L and OpenCLIP-G give {} features per token, more than the {width} of the T5 they join", dl + dg)));
        }
        tokens = match (&cl, &cg) {
            (Some(a), Some(b)) => a.tokens.min(b.tokens) as usize,
            (Some(a), None) | (None, Some(a)) => a.tokens as usize,
            (None, None) => 0,
        };
        for t in 0..tokens {
            let at = rows.len();
            match &cl {
                Some(c) => rows.extend_from_slice(&c.data[t * dl..(t + 1) * dl]),
                // ComfyUI pads a lone OpenCLIP-G with CLIP-L's width of zeros in front.
                None => rows.resize(at + L_WIDTH, 0.0),
            }
            if let Some(c) = &cg {
                rows.extend_from_slice(&c.data[t * dg..(t + 1) * dg]);
            }
            rows.resize(at + width, 0.0);
        }
        let mut p = cl.and_then(|c| c.pooled).unwrap_or_else(|| vec![0.0; L_WIDTH]);
        p.extend(cg.and_then(|c| c.pooled).unwrap_or_else(|| vec![0.0; G_WIDTH]));
        pooled = Some(p);
    }
    if clip.sdcpp.is_some() {
        // sd.cpp: chunk by chunk, CLIP's 77 tokens then T5's 77; zeros where an encoder or
        // a chunk is missing.
        let (t5_rows, t5_width) = match &clip.t5 {
            Some(t5) => {
                let (h, d, _) = crate::conditioning::sdcpp::t5_chunks(rt, clip.place, t5, t5_text.unwrap_or(""), CHUNK, false)?;
                (h, d)
            }
            None => (vec![0.0; CHUNK * width], width),
        };
        if t5_width != width {
            return Err(NodeError::msg(format!("T5 gives {t5_width} features per token; SD3's context is {width} wide")));
        }
        let per = CHUNK * width;
        let n = (rows.len() / per).max(t5_rows.len() / per).max(1);
        let mut out = Vec::with_capacity(2 * n * per);
        for i in 0..n {
            for part in [&rows, &t5_rows] {
                match part.get(i * per..(i + 1) * per) {
                    Some(c) => out.extend_from_slice(c),
                    None => out.resize(out.len() + per, 0.0),
                }
            }
        }
        let mut cond = Conditioning::new(out, width as i64, (2 * n * CHUNK) as i64).map_err(err)?;
        cond.pooled = Some(pooled.unwrap_or_else(|| vec![0.0; L_WIDTH + G_WIDTH]));
        return Ok(cond);
    }
    if let (Some(model), Some(t5)) = (&t5_model, &clip.t5) {
        // No tokens is T5's empty sequence: `</s>` alone, unpadded.
        let ids = match t5_text {
            Some(text) => crate::conditioning::chroma::t5_tokens(t5, text, T5_MIN_TOKENS)?,
            None => T5Tokenizer::shared().map_err(err)?.tokenize_weighted("", 1).map_err(err)?,
        };
        rows.extend(rt.with_backend(clip.place, |b| model.encode_weighted(b, &ids)).map_err(err)?);
        tokens += ids.ids.len();
    }
    if tokens == 0 {
        tokens = 77;
        rows = vec![0.0; tokens * width];
    }
    let mut cond = Conditioning::new(rows, width as i64, tokens as i64).map_err(err)?;
    cond.pooled = Some(pooled.unwrap_or_else(|| vec![0.0; L_WIDTH + G_WIDTH]));
    Ok(cond)
}

/// CLIP's and sd.cpp's T5 chunk length for SD3.
const CHUNK: usize = 77;

/// ComfyUI's "TripleCLIPLoader": SD3's CLIP-L, OpenCLIP-G and T5-XXL, in any order.
struct TripleClipLoader {
    rt: Arc<Runtime>,
}

const TRIPLE: [&str; 3] = ["clip_name1", "clip_name2", "clip_name3"];

impl TripleClipLoader {
    fn paths(&self, inputs: &Inputs) -> Result<Vec<PathBuf>, NodeError> {
        TRIPLE.iter().map(|n| self.rt.resolve_model(TEXT_ENCODERS, inputs.string(n)?).map_err(NodeError::msg)).collect()
    }
}

impl Node for TripleClipLoader {
    fn schema(&self) -> NodeSchema {
        let files = self.rt.list_models(TEXT_ENCODERS);
        let mut s = NodeSchema::new("TripleCLIPLoader")
            .display_name("TripleCLIPLoader")
            .category("advanced/loaders")
            .description("Loads SD3's three text encoders, in any order: CLIP-L, OpenCLIP-G and T5-XXL (safetensors or GGUF).");
        for n in TRIPLE {
            s = s.input(InputSpec::combo(n, files.clone()));
        }
        s.output("CLIP", IoType::CLIP)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        let mut all = Vec::new();
        for p in self.paths(inputs)? {
            all.extend(loaders::file_fingerprint(&p)?.unwrap_or_default());
        }
        Ok(Some(all))
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = loaders::sd3_clip(&self.rt, Module::TextEncoder.into(), &self.paths(inputs)?)?;
        Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]))
    }
}

/// ComfyUI's "CLIPTextEncodeSD3": one prompt per encoder.
struct ClipTextEncodeSd3 {
    rt: Arc<Runtime>,
}

impl Node for ClipTextEncodeSd3 {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CLIPTextEncodeSD3")
            .display_name("CLIPTextEncodeSD3")
            .category("advanced/conditioning")
            .description("Encodes SD3 prompts, one per text encoder. empty_padding none: an empty field gives that encoder no tokens; empty_prompt: it encodes the empty prompt.")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::string("clip_l", "").multiline())
            .input(InputSpec::string("clip_g", "").multiline())
            .input(InputSpec::string("t5xxl", "").multiline())
            .input(InputSpec::combo("empty_padding", ["none", "empty_prompt"]))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        if clip.family != ModelFamily::Sd3 {
            return Err(NodeError::msg(format!("CLIPTextEncodeSD3 needs SD3's text encoders (TripleCLIPLoader, or an SD3 checkpoint); this CLIP is {}'s", clip.family)));
        }
        let none = match inputs.string("empty_padding")? {
            "none" => true,
            "empty_prompt" => false,
            other => return Err(NodeError::msg(format!("empty_padding `{other}` is not one of none, empty_prompt"))),
        };
        let field = |name: &str| -> Result<Option<&str>, NodeError> {
            let s = inputs.string(name)?;
            Ok(if s.is_empty() && none { None } else { Some(s) })
        };
        let cond = encode(&self.rt, clip, field("clip_l")?, field("clip_g")?, field("t5xxl")?)?;
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry::new(cond)]))]))
    }
}

/// ComfyUI's "SkipLayerGuidanceSD3" (SkipLayerGuidanceDiT on the joint blocks) and
/// "SkipLayerGuidanceDiT" (double and single blocks: FLUX, Chroma; SD3's joint blocks are its
/// double ones).
struct SkipLayerGuidance {
    dit: bool,
}

impl Node for SkipLayerGuidance {
    fn schema(&self) -> NodeSchema {
        let s = if self.dit {
            NodeSchema::new("SkipLayerGuidanceDiT")
                .display_name("SkipLayerGuidanceDiT")
                .description("Skip-layer guidance for DiTs: while sampling is between start and end, the positive prompt also runs without the given double blocks (FLUX's double-stream, SD3's joint) and single blocks, and the result moves away from that by scale; rescaling_scale pulls its spread back toward the positive's.")
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::string("double_layers", "7, 8, 9"))
                .input(InputSpec::string("single_layers", "7, 8, 9"))
        } else {
            NodeSchema::new("SkipLayerGuidanceSD3")
                .display_name("SkipLayerGuidanceSD3")
                .description("Skip-layer guidance (sd-cli's --slg-scale, --skip-layers): while sampling is between start and end, the positive prompt also runs without the given joint blocks and the result moves away from that by scale.")
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::string("layers", "7, 8, 9").tooltip("The joint blocks to leave out, counted from 0."))
        };
        let s = s
            .category("advanced/guidance")
            .input(InputSpec::float("scale", 3.0).float_range(0.0, 10.0).float_step(0.1))
            .input(InputSpec::float("start_percent", 0.01).float_range(0.0, 1.0).float_step(0.001))
            .input(InputSpec::float("end_percent", 0.15).float_range(0.0, 1.0).float_step(0.001));
        let s = if self.dit { s.input(InputSpec::float("rescaling_scale", 0.0).float_range(0.0, 10.0).float_step(0.01)) } else { s };
        s.input(InputSpec::combo("window", ["sigmas", "steps"]).optional().tooltip("sigmas (ComfyUI): while σ is between the model's σ at start_percent and at end_percent. steps (sd-cli): at the steps k, counted from 1, with floor(start·(steps+1)) < k < floor(end·(steps+1))."))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let dits = [ModelFamily::Sd3, ModelFamily::Flux, ModelFamily::Chroma];
        if !dits.contains(&model.family) || (!self.dit && model.family != ModelFamily::Sd3) {
            let what = if self.dit { "a DiT's blocks (SD3, FLUX, Chroma)" } else { "an MMDiT's joint blocks (SD3)" };
            return Err(NodeError::msg(format!("{} leaves out {what}; this model is {}", if self.dit { "SkipLayerGuidanceDiT" } else { "SkipLayerGuidanceSD3" }, model.family)));
        }
        let layers = if self.dit {
            SkipLayers { double: parse_layers(inputs.string("double_layers")?)?, single: parse_layers(inputs.string("single_layers")?)? }
        } else {
            SkipLayers { double: parse_layers(inputs.string("layers")?)?, single: Vec::new() }
        };
        let scale = inputs.float("scale")? as f32;
        let (start, end) = (inputs.float("start_percent")? as f32, inputs.float("end_percent")? as f32);
        let rescaling = if self.dit { inputs.float("rescaling_scale")? as f32 } else { 0.0 };
        for (name, v) in [("scale", scale), ("start_percent", start), ("end_percent", end), ("rescaling_scale", rescaling)] {
            if !v.is_finite() || v < 0.0 || (name.ends_with("percent") && v > 1.0) {
                return Err(NodeError::msg(format!("{name} {v} is out of range")));
            }
        }
        let mut m = model.clone();
        let window = match inputs.contains("window").then(|| inputs.string("window")).transpose()? {
            None | Some("sigmas") => SlgWindow::Sigmas,
            Some("steps") => SlgWindow::Steps,
            Some(other) => return Err(NodeError::msg(format!("window `{other}` is not one of sigmas, steps"))),
        };
        m.slg = Some(crate::values::SkipLayerGuidance { layers, scale, rescaling, percents: (start, end), window });
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, m)]))
    }
}

/// Every run of digits in `text` as a block index (ComfyUI reads `\d+`: "7, 8, 9",
/// "[7,8,9]" and "7 8 9" are the same).
pub(crate) fn parse_layers(text: &str) -> Result<Vec<usize>, NodeError> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| NodeError::msg(format!("layers: `{s}` is not a block index"))))
        .collect()
}
