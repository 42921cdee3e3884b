//! Chroma's conditioning and ComfyUI's T5TokenizerOptions: Chroma reads T5-XXL alone
//! (CLIPLoader type `chroma`), its prompt unpadded — the tokens and `</s>` (ComfyUI's PixArt
//! T5 tokenizer, `min_length` 1) — and no pooled vector.

use crate::runtime::Runtime;
use crate::values::{ClipRef, T5Options, T5Ref};
use crate::err;
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::t5::{T5Tokenizer, WeightedTokens, T5_PAD};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    registry.register(Arc::new(T5TokenizerOptions));
}

/// `text` tokenized for `t5`: the family's `min_length` padding (FLUX 256, SD3 77, Chroma
/// 1), or T5TokenizerOptions' `min_padding` pads after `</s>` and then its `min_length`.
pub(crate) fn t5_tokens(t5: &T5Ref, text: &str, family_min_length: usize) -> Result<WeightedTokens, NodeError> {
    t5_tokens_with(&T5Tokenizer::shared().map_err(err)?, t5, text, family_min_length)
}

/// [`t5_tokens`] with another T5 vocabulary (Wan's UMT5).
pub(crate) fn t5_tokens_with(tokenizer: &T5Tokenizer, t5: &T5Ref, text: &str, family_min_length: usize) -> Result<WeightedTokens, NodeError> {
    let Some(o) = t5.options else { return tokenizer.tokenize_weighted(text, family_min_length).map_err(err) };
    let mut t = tokenizer.tokenize_weighted(text, 0).map_err(err)?;
    let len = (t.ids.len() + o.min_padding).max(o.min_length);
    t.ids.resize(len, T5_PAD);
    t.weights.resize(len, 1.0);
    Ok(t)
}

/// Chroma's conditioning of `text`: T5-XXL's hidden states (weighted prompts move away from
/// all-padding, ComfyUI's PixArt empty prompt), no pooled vector.
pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<Conditioning, NodeError> {
    if let Some(s) = clip.sdcpp {
        return crate::conditioning::sdcpp::chroma(rt, clip, text, s);
    }
    let t5 = clip.t5.as_ref().ok_or_else(|| NodeError::msg("Chroma's CLIP has no T5 encoder"))?;
    let weights = rt.pin(clip.place, &t5.weights)?;
    let model = T5Encoder::new(&weights, &t5.prefix, T5Config::infer(&weights, &t5.prefix).map_err(err)?).map_err(err)?;
    let tokens = t5_tokens(t5, text, 1)?;
    let empty = vec![T5_PAD; tokens.ids.len()];
    let hidden = rt.with_backend(clip.place, |b| model.encode_weighted_from(b, &tokens, &empty)).map_err(err)?;
    Conditioning::new(hidden, model.config.d_model, tokens.ids.len() as i64).map_err(err)
}

/// ComfyUI's "T5TokenizerOptions": how the CLIP's T5 pads its prompts.
struct T5TokenizerOptions;

impl Node for T5TokenizerOptions {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("T5TokenizerOptions")
            .display_name("T5TokenizerOptions")
            .category("_for_testing/conditioning")
            .description("Sets how the CLIP's T5 pads prompts: min_padding <pad> tokens after </s>, then padding to min_length tokens (Chroma's authors advise min_padding 1). A CLIP without T5 passes unchanged.")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::int("min_padding", 0).int_range(0, 10000))
            .input(InputSpec::int("min_length", 0).int_range(0, 10000))
            .output("CLIP", IoType::CLIP)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let get = |name: &str| -> Result<usize, NodeError> {
            let v = inputs.int(name)?;
            usize::try_from(v).ok().filter(|&v| v <= 10_000).ok_or_else(|| NodeError::msg(format!("{name} {v} is outside 0..=10000")))
        };
        let options = T5Options { min_padding: get("min_padding")?, min_length: get("min_length")? };
        let mut clip = inputs.downcast::<ClipRef>("clip")?.clone();
        if let Some(t5) = &mut clip.t5 {
            t5.options = Some(options);
        }
        Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]))
    }
}
