//! stable-diffusion.cpp's text conditioning for FLUX, SD3 and Chroma, and the
//! SdCppConditioner node that asks for it (the sd-cli presets put it after the CLIP
//! loader, so a preset's image is sd-cli's). Where sd.cpp differs from ComfyUI:
//! - T5 runs in chunks, each encoded alone: FLUX 255 tokens + `</s>` padded to 256, SD3
//!   76 + `</s>` padded to 77, Chroma 511 + `</s>` padded to 512 (ComfyUI: one sequence);
//! - weights scale each token and rescale the chunk to its original mean, A1111's way
//!   (ComfyUI moves tokens away from the empty prompt);
//! - SD3's context interleaves the chunks: [CLIP-L|G 0, T5 0, CLIP-L|G 1, T5 1, …];
//! - a missing encoder gives zeros of its chunk's shape;
//! - an empty prompt is T5's `▁` and `</s>`;
//! - Chroma: T5 padded to 512, optionally masked inside T5, and the DiT attends to the
//!   prompt, `</s>` and `chroma_t5_mask_pad` pads only (unless its mask is off).
//!
//! `BREAK` is dropped as in every sdflow T5 prompt (sd.cpp tokenizes the word "BREAK" with
//! weight −1 here).

use crate::runtime::Runtime;
use crate::values::{ClipRef, SdCppText, T5Ref};
use crate::err;
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::t5::{T5Tokenizer, WeightedTokens};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    registry.register(Arc::new(SdCppConditioner));
}

/// T5-XXL's width, for the zeros of a missing encoder.
pub(crate) const T5_WIDTH: usize = 4096;

/// The prompt's T5 (or UMT5) tokens and weights as sd.cpp reads them: without `</s>`,
/// and the vocabulary's `▁` for an empty prompt.
fn t5_prompt(tokenizer: &T5Tokenizer, text: &str) -> Result<WeightedTokens, NodeError> {
    let mut t = tokenizer.tokenize_weighted(text, 0).map_err(err)?;
    t.ids.pop();
    t.weights.pop();
    if t.ids.is_empty() {
        t.ids.push(tokenizer.id("▁").ok_or_else(|| NodeError::msg("the T5 vocabulary has no `▁`"))?);
        t.weights.push(1.0);
    }
    Ok(t)
}

/// `text` through `t5` in sd.cpp's chunks of `chunk` tokens: hidden states, their width,
/// and how many leading tokens are the prompt and `</s>`s.
pub(crate) fn t5_chunks(rt: &Runtime, place: crate::runtime::Place, t5: &T5Ref, text: &str, chunk: usize, mask: bool) -> Result<(Vec<f32>, usize, usize), NodeError> {
    t5_chunks_with(rt, place, t5, &T5Tokenizer::shared().map_err(err)?, text, chunk, mask)
}

fn t5_chunks_with(rt: &Runtime, place: crate::runtime::Place, t5: &T5Ref, tokenizer: &T5Tokenizer, text: &str, chunk: usize, mask: bool) -> Result<(Vec<f32>, usize, usize), NodeError> {
    let weights = rt.pin(place, &t5.weights)?;
    let model = T5Encoder::new(&weights, &t5.prefix, T5Config::infer(&weights, &t5.prefix).map_err(err)?).map_err(err)?;
    let tokens = t5_prompt(tokenizer, text)?;
    let (hidden, content) = rt.with_backend(place, |b| model.encode_chunked(b, &tokens, chunk, mask)).map_err(err)?;
    Ok((hidden, model.config.d_model as usize, content))
}

/// FLUX's T5 tokens as sd.cpp makes them (chunks of 256; zeros without a T5).
pub(crate) fn flux_t5(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<Conditioning, NodeError> {
    let (hidden, d) = match &clip.t5 {
        Some(t5) => {
            let (h, d, _) = t5_chunks(rt, clip.place, t5, text, 256, false)?;
            (h, d)
        }
        None => (vec![0.0; 256 * T5_WIDTH], T5_WIDTH),
    };
    let tokens = (hidden.len() / d) as i64;
    Conditioning::new(hidden, d as i64, tokens).map_err(err)
}

/// Chroma's conditioning as sd.cpp makes it.
pub(crate) fn chroma(rt: &Runtime, clip: &ClipRef, text: &str, s: SdCppText) -> Result<Conditioning, NodeError> {
    let t5 = clip.t5.as_ref().ok_or_else(|| NodeError::msg("Chroma's CLIP has no T5 encoder"))?;
    let (hidden, d, content) = t5_chunks(rt, clip.place, t5, text, 512, s.chroma_t5_mask)?;
    let tokens = hidden.len() / d;
    let mut cond = Conditioning::new(hidden, d as i64, tokens as i64).map_err(err)?;
    if s.chroma_dit_mask {
        cond.text_keys = Some((content + s.chroma_t5_mask_pad).min(tokens) as i64);
    }
    Ok(cond)
}

/// Wan's conditioning as sd.cpp makes it: UMT5 in chunks of 511 tokens + `</s>` padded to
/// 512, each encoded alone with its padding masked, and the padding's states zeros
/// (`zero_out_masked`).
pub(crate) fn wan(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<Conditioning, NodeError> {
    const CHUNK: usize = 512;
    let t5 = clip.t5.as_ref().ok_or_else(|| NodeError::msg("Wan's CLIP has no UMT5 encoder"))?;
    let tokenizer = T5Tokenizer::umt5().map_err(err)?;
    let prompt = t5_prompt(&tokenizer, text)?.ids.len();
    let (mut hidden, d, _) = t5_chunks_with(rt, clip.place, t5, &tokenizer, text, CHUNK, true)?;
    for (k, chunk) in hidden.chunks_exact_mut(CHUNK * d).enumerate() {
        let real = (prompt - k * (CHUNK - 1)).min(CHUNK - 1) + 1;
        chunk[real * d..].fill(0.0);
    }
    let tokens = (hidden.len() / d) as i64;
    Conditioning::new(hidden, d as i64, tokens).map_err(err)
}

/// "SdCppConditioner": the CLIP's prompts encoded as stable-diffusion.cpp encodes them.
struct SdCppConditioner;

impl Node for SdCppConditioner {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SdCppConditioner")
            .display_name("sd.cpp Text Conditioning")
            .category("advanced/conditioning")
            .description("Makes the text encode nodes encode prompts as stable-diffusion.cpp does for FLUX, SD3 and Chroma (the sd-cli presets use it): T5 in chunks encoded alone (256, 77 interleaved with CLIP's chunks, 512 tokens), A1111 weights rescaled to each chunk's mean, zeros for missing encoders, and Chroma's T5 and DiT masks. SD1.x/SD2.x/SDXL prompts are already encoded alike.")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::boolean("chroma_use_dit_mask", true).optional().tooltip("Chroma: the model attends to the prompt, </s> and chroma_t5_mask_pad pads only."))
            .input(InputSpec::boolean("chroma_use_t5_mask", false).optional().tooltip("Chroma: T5 does not attend to the padding."))
            .input(InputSpec::int("chroma_t5_mask_pad", 1).int_range(0, 512).optional().tooltip("Chroma: how many pads after </s> the model still attends to."))
            .output("CLIP", IoType::CLIP)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let flag = |name: &str, default: bool| if inputs.contains(name) { inputs.boolean(name) } else { Ok(default) };
        let pad = if inputs.contains("chroma_t5_mask_pad") { inputs.int("chroma_t5_mask_pad")? } else { 1 };
        let pad = usize::try_from(pad).ok().filter(|&p| p <= 512).ok_or_else(|| NodeError::msg(format!("chroma_t5_mask_pad {pad} is outside 0..=512")))?;
        let mut clip = inputs.downcast::<ClipRef>("clip")?.clone();
        clip.sdcpp = Some(SdCppText { chroma_dit_mask: flag("chroma_use_dit_mask", true)?, chroma_t5_mask: flag("chroma_use_t5_mask", false)?, chroma_t5_mask_pad: pad });
        Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]))
    }
}
