//! Wan's text conditioning: UMT5-XXL alone (CLIPLoader type `wan`), as ComfyUI's Wan
//! text encoder makes it: the prompt's tokens and `</s>`, `<pad>` up to 512 tokens (or
//! T5TokenizerOptions' padding), UMT5 attending to the tokens up to `</s>` only, and the
//! padding's states zeros. Wan's cross-attention has no mask, so those zero rows are part
//! of what the model reads. sd.cpp's way (the sd-cli presets) is in [`super::sdcpp::wan`].

use crate::err;
use crate::runtime::Runtime;
use crate::values::ClipRef;
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::t5::T5Tokenizer;
use sdflow_executor::NodeError;

/// ComfyUI's `min_length` for Wan's UMT5 tokenizer (the reference's `text_len`).
pub const TEXT_LEN: usize = 512;

pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<Conditioning, NodeError> {
    if clip.sdcpp.is_some() {
        return super::sdcpp::wan(rt, clip, text);
    }
    let t5 = clip.t5.as_ref().ok_or_else(|| NodeError::msg("Wan's CLIP has no UMT5 encoder"))?;
    let weights = rt.pin(clip.place, &t5.weights)?;
    let model = T5Encoder::new(&weights, &t5.prefix, T5Config::infer(&weights, &t5.prefix).map_err(err)?).map_err(err)?;
    let tokens = super::chroma::t5_tokens_with(&T5Tokenizer::umt5().map_err(err)?, t5, text, TEXT_LEN)?;
    let hidden = rt.with_backend(clip.place, |b| model.encode_zero_masked(b, &tokens)).map_err(err)?;
    Conditioning::new(hidden, model.config.d_model, tokens.ids.len() as i64).map_err(err)
}
