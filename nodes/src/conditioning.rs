//! Text conditioning.

use crate::runtime::Runtime;
use crate::values::{ClipRef, CondEntry, CondList};
use crate::err;
use sdflow_core::detect::ModelFamily;
use sdflow_core::models::clip::{ClipLayout, ClipTextConfig, ClipTextModel};
use sdflow_core::models::sd::encode_prompt;
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipSkip, ClipTokenizer, EmbeddingLibrary, PadToken, TextFamily};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(ClipTextEncode { rt: rt.clone() }));
    registry.register(Arc::new(ClipSetLastLayer));
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
        Lane::Device(crate::runtime::DEVICE_LANE.into())
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        let text = inputs.string("text")?;
        let weights = clip.weights.pin().map_err(err)?;
        let config = ClipTextConfig::infer(&weights, &clip.prefix, clip.layout).map_err(err)?;
        let layers = config.layers;
        let model = ClipTextModel::new(&weights, &clip.prefix, config).map_err(err)?;
        let pad = match clip.layout {
            ClipLayout::HuggingFace => PadToken::EndOfText,
            ClipLayout::OpenClip => PadToken::Zero,
        };
        let tokenizer = ClipTokenizer::new(pad);
        let emb_dir = self.rt.models_dir.join("embeddings");
        let library = if emb_dir.is_dir() { Some(EmbeddingLibrary::scan(&emb_dir, &tokenizer).map_err(err)?) } else { None };
        let prompt = tokenize_weighted(text, &tokenizer, library.as_ref(), &ChunkOptions::default()).map_err(err)?;
        let skip = clip.clip_skip.map_or_else(|| ClipSkip::default_for(text_family(clip.family)), |s| ClipSkip::new(s).unwrap_or(ClipSkip::default_for(text_family(clip.family))));
        let skip = (skip.get() as usize).min(layers);
        let cond = self.rt.with_backend(|b| encode_prompt(b, &model, &prompt, skip)).map_err(err)?;
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry { cond: Arc::new(cond) }]))]))
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
