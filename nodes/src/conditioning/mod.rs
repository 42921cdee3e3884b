//! Conditioning nodes: prompts encoded and conditioning edited, per model family where the
//! families differ. CLIPTextEncode and the generic editors are here; each family's own
//! encoders and edits sit beside them ([`flux`], [`sd3`], [`chroma`], and sd.cpp's way in
//! [`sdcpp`]), as do the image-derived conditionings ([`pix2pix`], [`controlnet`],
//! [`ip_adapter`], [`photomaker`]).

pub mod chroma;
pub mod controlnet;
pub mod flux;
pub mod ip_adapter;
pub mod llm;
pub mod photomaker;
pub mod pix2pix;
pub mod qwen;
pub mod sd3;
pub mod sdcpp;
pub mod wan;

use crate::runtime::Runtime;
use crate::values::{ClipEncoder, ClipRef, CondArea, CondEntry, CondList, CondMask, Mask};
use crate::err;
use sdflow_core::detect::ModelFamily;
use sdflow_core::models::clip::{ClipLayout, ClipTextConfig, ClipTextModel};
use sdflow_core::models::sd::{encode_prompt, encode_prompt_sdxl};
use sdflow_core::models::conditioning::{Conditioning, SizeCond};
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipSkip, ClipTokenizer, PadToken, TextFamily, TokenizedPrompt};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(ClipTextEncode { rt: rt.clone() }));
    registry.register(Arc::new(ClipTextEncodeSdxl { rt: rt.clone() }));
    registry.register(Arc::new(ClipSetLastLayer));
    for op in [CondOp::Combine, CondOp::Concat, CondOp::Average, CondOp::ZeroOut, CondOp::TimestepRange] {
        registry.register(Arc::new(ConditioningOp(op)));
    }
    for op in [AreaOp::Pixels, AreaOp::Percentage, AreaOp::Strength, AreaOp::Mask] {
        registry.register(Arc::new(ConditioningArea(op)));
    }
}

fn text_family(f: ModelFamily) -> TextFamily {
    match f {
        ModelFamily::Sd2 { .. } => TextFamily::Sd2,
        ModelFamily::Sdxl | ModelFamily::SdxlRefiner => TextFamily::Sdxl,
        _ => TextFamily::Sd1,
    }
}

/// ComfyUI's "CLIP Text Encode (Prompt)", with A1111 emphasis syntax, `BREAK` and
/// textual-inversion embeddings from `<models>/embeddings`.
struct ClipTextEncode {
    rt: Arc<Runtime>,
}

impl Node for ClipTextEncode {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CLIPTextEncode")
            .display_name("CLIP Text Encode (Prompt)")
            .category("conditioning")
            .description("Encodes a prompt with a CLIP text encoder; (word:1.2) emphasis, BREAK and embeddings by file name.")
            .input(InputSpec::string("text", "").multiline().tooltip("The prompt."))
            .input(InputSpec::link("clip", IoType::CLIP))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        let cond = encode_text(&self.rt, clip, inputs.string("text")?)?;
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, cond)]))
    }
}

/// ComfyUI's "CLIPTextEncodeSDXL": separate prompts for the two encoders and SDXL's
/// size conditioning.
struct ClipTextEncodeSdxl {
    rt: Arc<Runtime>,
}

impl Node for ClipTextEncodeSdxl {
    fn schema(&self) -> NodeSchema {
        let size = |name: &str, default: i64| InputSpec::int(name, default).int_range(0, 16384).int_step(1);
        NodeSchema::new("CLIPTextEncodeSDXL")
            .display_name("CLIPTextEncodeSDXL")
            .category("advanced/conditioning")
            .description("Encodes SDXL prompts: text_g with OpenCLIP-G, text_l with CLIP-L, and the size/crop conditioning SDXL was trained with.")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(size("width", 1024).tooltip("The original image width SDXL is told about."))
            .input(size("height", 1024))
            .input(size("crop_w", 0))
            .input(size("crop_h", 0))
            .input(size("target_width", 1024))
            .input(size("target_height", 1024))
            .input(InputSpec::string("text_g", "").multiline())
            .input(InputSpec::string("text_l", "").multiline())
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        if clip.encoders.len() != 2 {
            return Err(NodeError::msg(format!("CLIPTextEncodeSDXL needs SDXL's two text encoders; this CLIP ({}) has {}", clip.family, clip.encoders.len())));
        }
        let size = |name: &str| -> Result<f64, NodeError> {
            let v = inputs.int(name)?;
            if !(0..=16384).contains(&v) {
                return Err(NodeError::msg(format!("{name} {v} is outside 0..=16384")));
            }
            Ok(v as f64)
        };
        let sc = SizeCond {
            width: Some(size("width")?),
            height: Some(size("height")?),
            crop_w: size("crop_w")?,
            crop_h: size("crop_h")?,
            target_width: Some(size("target_width")?),
            target_height: Some(size("target_height")?),
            aesthetic_score: None,
        };
        let mut cond = encode_texts(&self.rt, clip, inputs.string("text_l")?, inputs.string("text_g")?)?;
        cond.size = sc;
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry::new(cond)]))]))
    }
}

/// CLIPTextEncode's encoding of `text`, shared with nodes that encode prompts they build
/// themselves (the detailer's per-mask prompts).
pub(crate) fn encode_text(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<CondList, NodeError> {
    let cond = encode_texts(rt, clip, text, text)?;
    Ok(CondList(vec![CondEntry::new(cond)]))
}

/// The conditioning of `clip` for a prompt: SD1/SD2 encode `text_l` with their one
/// encoder; SDXL encodes `text_l` with CLIP-L and `text_g` with OpenCLIP-G.
/// FLUX encodes `text_l` with CLIP-L (its pooled vector) and `text_g` with T5-XXL; SD3
/// `text_l` with CLIP-L and `text_g` with OpenCLIP-G and T5-XXL.
fn encode_texts(rt: &Runtime, clip: &ClipRef, text_l: &str, text_g: &str) -> Result<Conditioning, NodeError> {
    if clip.llm.is_some() {
        return crate::conditioning::llm::encode(rt, clip, text_l);
    }
    if clip.family == ModelFamily::Chroma {
        return crate::conditioning::chroma::encode(rt, clip, text_g);
    }
    if clip.family == ModelFamily::Wan {
        return crate::conditioning::wan::encode(rt, clip, text_g);
    }
    if clip.family == ModelFamily::Sd3 {
        return crate::conditioning::sd3::encode(rt, clip, Some(text_l), Some(text_g), Some(text_g));
    }
    if clip.t5.is_some() {
        return crate::conditioning::flux::encode(rt, clip, text_l, text_g);
    }
    encode_texts_with(rt, clip, text_l, text_g, &mut |p, _| Ok(p))
}

/// [`encode_texts`] with each encoder's tokenized prompt passed through `edit` (with the
/// tokenizer's padding token) before encoding: PhotoMaker rewrites the class word.
pub(crate) fn encode_texts_with(rt: &Runtime, clip: &ClipRef, text_l: &str, text_g: &str, edit: &mut dyn FnMut(TokenizedPrompt, u32) -> Result<TokenizedPrompt, NodeError>) -> Result<Conditioning, NodeError> {
    let family = text_family(clip.family);
    let skip = clip.clip_skip.map_or_else(|| ClipSkip::default_for(family), |s| ClipSkip::new(s).unwrap_or(ClipSkip::default_for(family)));
    if clip.t5.is_some() || clip.llm.is_some() {
        return Err(NodeError::msg(format!("this prompt rewriting (PhotoMaker) needs an SD text encoder, not {}'s", clip.family)));
    }
    let pinned = clip.encoders.iter().map(|e| rt.pin(clip.place, &e.weights)).collect::<Result<Vec<_>, _>>()?;
    let mut models = Vec::with_capacity(pinned.len());
    for (enc, weights) in clip.encoders.iter().zip(&pinned) {
        let config = ClipTextConfig::infer(weights, &enc.prefix, enc.layout).map_err(err)?;
        models.push(ClipTextModel::new(weights, &enc.prefix, config).map_err(err)?);
    }
    // One tokenization per encoder: they share the vocabulary (and so the embedding
    // names' tokens, scanned once) and differ in padding.
    let library = rt.embedding_library()?;
    let tokenize = |enc: &ClipEncoder, text: &str| {
        let tokenizer = ClipTokenizer::new(pad_token(clip, enc));
        let prompt = tokenize_weighted(text, &tokenizer, library.as_ref(), &ChunkOptions::default()).map_err(err)?;
        Ok::<_, NodeError>((prompt, tokenizer.pad()))
    };
    let mut tokenize = |enc: &ClipEncoder, text: &str| {
        let (prompt, pad) = tokenize(enc, text)?;
        Ok::<_, NodeError>((edit(prompt, pad)?, pad))
    };
    match models.as_slice() {
        [model] => {
            let (prompt, _) = tokenize(&clip.encoders[0], text_l)?;
            let skip = (skip.get() as usize).saturating_sub(clip.encoders[0].dropped_layers).clamp(1, model.config.layers);
            rt.with_backend(clip.place, |b| encode_prompt(b, model, &prompt, skip)).map_err(err)
        }
        [l, g] => {
            let ((pl, pad_l), (pg, pad_g)) = (tokenize(&clip.encoders[0], text_l)?, tokenize(&clip.encoders[1], text_g)?);
            // Different prompts may chunk differently; ComfyUI pads the shorter with
            // empty chunks.
            let (nl, ng) = (pl.chunks.len(), pg.chunks.len());
            let (pl, pg) = (pl.padded_to(ng, pad_l), pg.padded_to(nl, pad_g));
            rt.with_backend(clip.place, |b| encode_prompt_sdxl(b, (l, &pl), (g, &pg), skip.get() as usize)).map_err(err)
        }
        _ => Err(NodeError::msg(format!("a CLIP of {} text encoders", models.len()))),
    }
}

/// The token that pads `enc`'s prompts. OpenCLIP (SD2's ViT-H, SDXL's second encoder,
/// ViT-G) pads with zeros and CLIP-L with end-of-text, whatever the key layout: a Hugging
/// Face-named ViT-H or ViT-G (a diffusers folder, ComfyUI's clip_g) is still OpenCLIP.
fn pad_token(clip: &ClipRef, enc: &ClipEncoder) -> PadToken {
    let second = clip.encoders.len() > 1 && std::ptr::eq(enc, &clip.encoders[1]);
    if enc.layout == ClipLayout::OpenClip || matches!(clip.family, ModelFamily::Sd2 { .. }) || second {
        PadToken::Zero
    } else {
        PadToken::EndOfText
    }
}

/// ComfyUI's "CLIP Set Last Layer": -1 is the last layer, -2 the penultimate (A1111's
/// clip skip 2), …
struct ClipSetLastLayer;

impl Node for ClipSetLastLayer {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CLIPSetLastLayer")
            .display_name("CLIP Set Last Layer")
            .category("conditioning")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::int("stop_at_clip_layer", -1).int_range(-24, -1).int_step(1))
            .output("CLIP", IoType::CLIP)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut clip = inputs.downcast::<ClipRef>("clip")?.clone();
        let stop = inputs.int("stop_at_clip_layer")?;
        if !(-24..=-1).contains(&stop) {
            return Err(NodeError::msg(format!("stop_at_clip_layer {stop} is outside -24..=-1")));
        }
        clip.clip_skip = Some((-stop) as u32);
        Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]))
    }
}

/// The conditioning list operations that need no model: Combine, Concat, Average,
/// ZeroOut and SetTimestepRange, named and shaped as ComfyUI's.
#[derive(Clone, Copy)]
enum CondOp {
    Combine,
    Concat,
    Average,
    ZeroOut,
    TimestepRange,
}

struct ConditioningOp(CondOp);

fn cond_of(inputs: &Inputs, name: &str) -> Result<CondList, NodeError> {
    let c = inputs.downcast::<CondList>(name)?.clone();
    if c.0.is_empty() {
        return Err(NodeError::msg(format!("`{name}` is empty")));
    }
    Ok(c)
}

/// `data` rows of `dim` padded with zeros or cut to `tokens` rows (ComfyUI's Average).
fn fit_tokens(c: &Conditioning, tokens: i64) -> Vec<f32> {
    let mut v = c.data.clone();
    v.resize((tokens * c.dim) as usize, 0.0);
    v
}

impl Node for ConditioningOp {
    fn schema(&self) -> NodeSchema {
        let c = IoType::CONDITIONING;
        let s = match self.0 {
            CondOp::Combine => NodeSchema::new("ConditioningCombine")
                .display_name("Conditioning (Combine)")
                .input(InputSpec::link("conditioning_1", c.clone()))
                .input(InputSpec::link("conditioning_2", c.clone())),
            CondOp::Concat => NodeSchema::new("ConditioningConcat")
                .display_name("Conditioning (Concat)")
                .input(InputSpec::link("conditioning_to", c.clone()))
                .input(InputSpec::link("conditioning_from", c.clone())),
            CondOp::Average => NodeSchema::new("ConditioningAverage")
                .display_name("ConditioningAverage")
                .input(InputSpec::link("conditioning_to", c.clone()))
                .input(InputSpec::link("conditioning_from", c.clone()))
                .input(InputSpec::float("conditioning_to_strength", 1.0).float_range(0.0, 1.0).float_step(0.01)),
            CondOp::ZeroOut => NodeSchema::new("ConditioningZeroOut").display_name("ConditioningZeroOut").input(InputSpec::link("conditioning", c.clone())),
            CondOp::TimestepRange => NodeSchema::new("ConditioningSetTimestepRange")
                .display_name("ConditioningSetTimestepRange")
                .input(InputSpec::link("conditioning", c.clone()))
                .input(InputSpec::float("start", 0.0).float_range(0.0, 1.0).float_step(0.001))
                .input(InputSpec::float("end", 1.0).float_range(0.0, 1.0).float_step(0.001)),
        };
        s.category("conditioning").output("CONDITIONING", c)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let out = match self.0 {
            CondOp::Combine => {
                let mut a = cond_of(inputs, "conditioning_1")?;
                a.0.extend(cond_of(inputs, "conditioning_2")?.0);
                a
            }
            CondOp::Concat | CondOp::Average => {
                let to = cond_of(inputs, "conditioning_to")?;
                let from = cond_of(inputs, "conditioning_from")?;
                let f = &from.0[0].cond;
                if from.0.len() > 1 {
                    tracing::warn!("conditioning_from has {} entries; only the first is used (as ComfyUI)", from.0.len());
                }
                let strength = if matches!(self.0, CondOp::Average) { inputs.float("conditioning_to_strength")? as f32 } else { 0.0 };
                let mut entries = Vec::with_capacity(to.0.len());
                for e in &to.0 {
                    let t = &e.cond;
                    if t.dim != f.dim {
                        return Err(NodeError::msg(format!("conditioning widths differ: {} and {}", t.dim, f.dim)));
                    }
                    // The `to` side's pooled output and size stay (ComfyUI's Concat);
                    // Average mixes the pooled outputs too.
                    let mut c = if matches!(self.0, CondOp::Concat) {
                        let mut data = t.data.clone();
                        data.extend_from_slice(&f.data);
                        Conditioning::new(data, t.dim, t.tokens + f.tokens)
                    } else {
                        let fv = fit_tokens(f, t.tokens);
                        Conditioning::new(t.data.iter().zip(&fv).map(|(a, b)| a * strength + b * (1.0 - strength)).collect(), t.dim, t.tokens)
                    }
                    .map_err(err)?;
                    c.size = t.size;
                    c.pooled = match (&t.pooled, &f.pooled, self.0) {
                        (Some(pt), Some(pf), CondOp::Average) if pt.len() == pf.len() => Some(pt.iter().zip(pf).map(|(a, b)| a * strength + b * (1.0 - strength)).collect()),
                        (None, Some(pf), CondOp::Average) => Some(pf.clone()),
                        (pt, _, _) => pt.clone(),
                    };
                    entries.push(e.with_cond(c));
                }
                CondList(entries)
            }
            CondOp::ZeroOut => {
                let c = cond_of(inputs, "conditioning")?;
                CondList(
                    c.0.iter()
                        .map(|e| {
                            let pooled = e.cond.pooled.as_ref().map(|p| vec![0.0; p.len()]);
                            e.with_cond(Conditioning { data: vec![0.0; e.cond.data.len()], pooled, ..(*e.cond).clone() })
                        })
                        .collect(),
                )
            }
            CondOp::TimestepRange => {
                let (start, end) = (inputs.float("start")? as f32, inputs.float("end")? as f32);
                if !(0.0..=1.0).contains(&start) || !(0.0..=1.0).contains(&end) {
                    return Err(NodeError::msg(format!("start {start} and end {end} must lie in 0..=1")));
                }
                let mut c = cond_of(inputs, "conditioning")?;
                c.0.iter_mut().for_each(|e| e.timestep_range = Some((start, end)));
                c
            }
        };
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, out)]))
    }
}

/// ComfyUI's area and mask nodes: where an entry guides, and how strongly.
#[derive(Clone, Copy)]
enum AreaOp {
    /// ConditioningSetArea: pixels, stored as latent cells (÷ 8, rounded down).
    Pixels,
    /// ConditioningSetAreaPercentage: fractions of the latent, resolved when sampling.
    Percentage,
    /// ConditioningSetAreaStrength.
    Strength,
    /// ConditioningSetMask.
    Mask,
}

struct ConditioningArea(AreaOp);

/// ComfyUI's MAX_RESOLUTION.
const MAX_RESOLUTION: i64 = 16384;

impl Node for ConditioningArea {
    fn schema(&self) -> NodeSchema {
        let c = IoType::CONDITIONING;
        let strength = InputSpec::float("strength", 1.0).float_range(0.0, 10.0).float_step(0.01);
        let s = match self.0 {
            AreaOp::Pixels => NodeSchema::new("ConditioningSetArea")
                .display_name("Conditioning (Set Area)")
                .description("Makes the conditioning guide only a rectangle of the image (pixels, multiples of 8), blended in with feathered edges.")
                .input(InputSpec::link("conditioning", c.clone()))
                .input(InputSpec::int("width", 64).int_range(64, MAX_RESOLUTION as i128).int_step(8))
                .input(InputSpec::int("height", 64).int_range(64, MAX_RESOLUTION as i128).int_step(8))
                .input(InputSpec::int("x", 0).int_range(0, MAX_RESOLUTION as i128).int_step(8))
                .input(InputSpec::int("y", 0).int_range(0, MAX_RESOLUTION as i128).int_step(8))
                .input(strength),
            AreaOp::Percentage => NodeSchema::new("ConditioningSetAreaPercentage")
                .display_name("Conditioning (Set Area with Percentage)")
                .description("ConditioningSetArea with the rectangle as fractions of the image.")
                .input(InputSpec::link("conditioning", c.clone()))
                .input(InputSpec::float("width", 1.0).float_range(0.0, 1.0).float_step(0.01))
                .input(InputSpec::float("height", 1.0).float_range(0.0, 1.0).float_step(0.01))
                .input(InputSpec::float("x", 0.0).float_range(0.0, 1.0).float_step(0.01))
                .input(InputSpec::float("y", 0.0).float_range(0.0, 1.0).float_step(0.01))
                .input(strength),
            AreaOp::Strength => NodeSchema::new("ConditioningSetAreaStrength")
                .display_name("ConditioningSetAreaStrength")
                .input(InputSpec::link("conditioning", c.clone()))
                .input(strength),
            AreaOp::Mask => NodeSchema::new("ConditioningSetMask")
                .display_name("Conditioning (Set Mask)")
                .description("Weights the conditioning's guidance by a mask; \"mask bounds\" also runs the model only on the mask's bounding box.")
                .input(InputSpec::link("conditioning", c.clone()))
                .input(InputSpec::link("mask", IoType::MASK))
                .input(strength)
                .input(InputSpec::combo("set_cond_area", ["default", "mask bounds"])),
        };
        s.category("conditioning").output("CONDITIONING", c)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut c = cond_of(inputs, "conditioning")?;
        let strength = inputs.float("strength")? as f32;
        if !(0.0..=10.0).contains(&strength) {
            return Err(NodeError::msg(format!("strength {strength} is outside 0..=10")));
        }
        match self.0 {
            AreaOp::Pixels => {
                let mut v = [0i64; 4];
                for (slot, (name, min)) in v.iter_mut().zip([("height", 64), ("width", 64), ("y", 0), ("x", 0)]) {
                    let p = inputs.int(name)?;
                    if !(min..=MAX_RESOLUTION).contains(&p) {
                        return Err(NodeError::msg(format!("{name} {p} is outside {min}..={MAX_RESOLUTION}")));
                    }
                    *slot = p / 8;
                }
                let area = CondArea::Cells { height: v[0], width: v[1], y: v[2], x: v[3] };
                c.0.iter_mut().for_each(|e| (e.area, e.strength) = (Some(area), strength));
            }
            AreaOp::Percentage => {
                let mut v = [0f64; 4];
                for (slot, name) in v.iter_mut().zip(["height", "width", "y", "x"]) {
                    let f = inputs.float(name)?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(NodeError::msg(format!("{name} {f} is outside 0..=1")));
                    }
                    *slot = f;
                }
                let area = CondArea::Fraction { height: v[0], width: v[1], y: v[2], x: v[3] };
                c.0.iter_mut().for_each(|e| (e.area, e.strength) = (Some(area), strength));
            }
            AreaOp::Strength => c.0.iter_mut().for_each(|e| e.strength = strength),
            AreaOp::Mask => {
                let mask = inputs.downcast_arc::<Mask>("mask")?;
                if mask.n == 0 || mask.width == 0 || mask.height == 0 {
                    return Err(NodeError::msg("the mask is empty"));
                }
                let area_to_bounds = match inputs.string("set_cond_area")? {
                    "default" => false,
                    "mask bounds" => true,
                    other => return Err(NodeError::msg(format!("set_cond_area `{other}` is not \"default\" or \"mask bounds\""))),
                };
                let m = CondMask { mask, strength, area_to_bounds };
                c.0.iter_mut().for_each(|e| e.mask = Some(m.clone()));
            }
        }
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, c)]))
    }
}
