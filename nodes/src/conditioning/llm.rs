//! The conditioning of the families whose text encoder is an LLM (CLIPLoader type
//! `lumina2`: Z-Image's Qwen3-4B): the family's chat template around the prompt, A1111
//! weights inside the prompt, the hidden states the family takes (sd.cpp's `LLMEmbedder`).
//!
//! ComfyUI encodes the same template and layer, so an unweighted prompt conditions alike in
//! both; a weighted one follows sd.cpp (each token's state scaled, the mean kept), where
//! ComfyUI moves the state away from an empty prompt's.

use crate::err;
use crate::runtime::Runtime;
use crate::values::ClipRef;
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::llm::{LlmConfig, LlmEncoder};
use sdflow_core::text::qwen::QwenTokenizer;
use sdflow_executor::NodeError;

/// `text` conditioned through `clip`'s LLM.
pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<Conditioning, NodeError> {
    let llm = clip.llm.as_ref().ok_or_else(|| NodeError::msg(format!("this CLIP ({}) has no LLM text encoder", clip.family)))?;
    let weights = rt.pin(clip.place, &llm.weights)?;
    let model = LlmEncoder::new(&weights, &llm.prefix, LlmConfig::infer(&weights, &llm.prefix, None).map_err(err)?).map_err(err)?;
    let prompt = llm.family.layout(text, model.config.layers);
    let tokenizer = QwenTokenizer::shared().map_err(err)?;
    let (rows, width) = rt.with_backend(clip.place, |b| model.encode_prompt(b, &tokenizer, &prompt)).map_err(err)?;
    let tokens = rows.len() / width.max(1);
    Conditioning::new(rows, width as i64, tokens as i64).map_err(err)
}
