//! FLUX.1's conditioning: CLIP-L's pooled vector beside T5-XXL's tokens, ComfyUI's
//! CLIPTextEncodeFlux and FluxGuidance (its `comfy_extras/nodes_flux.py`).

use crate::runtime::Runtime;
use crate::values::{ClipRef, CondEntry, CondList};
use crate::err;
use sdflow_core::models::clip::{ClipTextConfig, ClipTextModel};
use sdflow_core::models::sd::{encode_prompt_with, Pooled};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::t5::T5Tokenizer;
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipTokenizer, PadToken};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(ClipTextEncodeFlux { rt: rt.clone() }));
    registry.register(Arc::new(FluxGuidance));
}

/// ComfyUI's T5 `min_length` for FLUX: shorter prompts are padded to 256 tokens.
const T5_MIN_TOKENS: usize = 256;

/// FLUX's conditioning of a prompt pair, as ComfyUI's `FluxClipModel` makes it: T5-XXL's
/// hidden states of `text_t5` (weighted, padded to 256 tokens) as the tokens, and
/// CLIP-L's pooled output of `text_l` (the final-normed end token of its last layer, not
/// projected; first chunk) as the pooled vector, or none without a CLIP-L.
pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, text_l: &str, text_t5: &str) -> Result<Conditioning, NodeError> {
    let t5 = clip.t5.as_ref().ok_or_else(|| NodeError::msg(format!("this CLIP ({}) has no T5 encoder", clip.family)))?;
    let weights = t5.weights.pin().map_err(err)?;
    let model = T5Encoder::new(&weights, &t5.prefix, T5Config::infer(&weights, &t5.prefix).map_err(err)?).map_err(err)?;
    let tokens = T5Tokenizer::shared().map_err(err)?.tokenize_weighted(text_t5, T5_MIN_TOKENS).map_err(err)?;
    let hidden = rt.with_backend(|b| model.encode_weighted(b, &tokens)).map_err(err)?;
    let mut cond = Conditioning::new(hidden, model.config.d_model, tokens.ids.len() as i64).map_err(err)?;
    if let Some(enc) = clip.encoders.first() {
        let weights = enc.weights.pin().map_err(err)?;
        let model = ClipTextModel::new(&weights, &enc.prefix, ClipTextConfig::infer(&weights, &enc.prefix, enc.layout).map_err(err)?).map_err(err)?;
        let prompt = tokenize_weighted(text_l, &ClipTokenizer::new(PadToken::EndOfText), rt.embedding_library()?.as_ref(), &ChunkOptions::default()).map_err(err)?;
        let l = rt.with_backend(|b| encode_prompt_with(b, &model, &prompt, 1, true, Pooled::Raw)).map_err(err)?;
        cond.pooled = l.pooled;
    }
    Ok(cond)
}

/// ComfyUI's "CLIPTextEncodeFlux": separate prompts for CLIP-L and T5-XXL, and the
/// distilled guidance.
struct ClipTextEncodeFlux {
    rt: Arc<Runtime>,
}

impl Node for ClipTextEncodeFlux {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CLIPTextEncodeFlux")
            .display_name("CLIPTextEncodeFlux")
            .category("advanced/conditioning/flux")
            .description("Encodes FLUX prompts: clip_l with CLIP-L (the pooled vector), t5xxl with T5-XXL (the tokens), and sets the distilled guidance.")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::string("clip_l", "").multiline())
            .input(InputSpec::string("t5xxl", "").multiline())
            .input(guidance_input())
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        if clip.t5.is_none() {
            return Err(NodeError::msg(format!("CLIPTextEncodeFlux needs FLUX's text encoders (DualCLIPLoader type flux); this CLIP is {}'s", clip.family)));
        }
        let mut cond = encode(&self.rt, clip, inputs.string("clip_l")?, inputs.string("t5xxl")?)?;
        cond.guidance = Some(guidance(inputs)?);
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry::new(cond)]))]))
    }
}

fn guidance_input() -> InputSpec {
    InputSpec::float("guidance", 3.5).float_range(0.0, 100.0).float_step(0.1).tooltip("The distilled guidance FLUX.1 dev embeds (sd-cli's --guidance).")
}

fn guidance(inputs: &Inputs) -> Result<f32, NodeError> {
    let g = inputs.float("guidance")?;
    if !(0.0..=100.0).contains(&g) {
        return Err(NodeError::msg(format!("guidance {g} is outside 0..=100")));
    }
    Ok(g as f32)
}

/// ComfyUI's "FluxGuidance": the distilled guidance of every entry.
struct FluxGuidance;

impl Node for FluxGuidance {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("FluxGuidance")
            .display_name("FluxGuidance")
            .category("advanced/conditioning/flux")
            .input(InputSpec::link("conditioning", IoType::CONDITIONING))
            .input(guidance_input())
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let g = guidance(inputs)?;
        let list = inputs.downcast::<CondList>("conditioning")?;
        let out = CondList(list.0.iter().map(|e| e.with_cond(Conditioning { guidance: Some(g), ..(*e.cond).clone() })).collect());
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, out)]))
    }
}
