//! FLUX.1's conditioning: CLIP-L's pooled vector beside T5-XXL's tokens, ComfyUI's
//! CLIPTextEncodeFlux and FluxGuidance, and Kontext's ReferenceLatent,
//! FluxKontextImageScale and FluxKontextMultiReferenceLatentMethod (its
//! `comfy_extras/nodes_flux.py`, `nodes_edit_model.py`).

use crate::runtime::Runtime;
use crate::values::{ClipRef, CondEntry, CondList, Image, Latent};
use crate::err;
use sdflow_core::models::clip::{ClipTextConfig, ClipTextModel};
use sdflow_core::models::sd::{encode_prompt_with, Pooled};
use sdflow_core::models::conditioning::{Conditioning, Guidance, ReferenceLatent, ReferenceMethod};
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipTokenizer, PadToken};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(ClipTextEncodeFlux { rt: rt.clone() }));
    registry.register(Arc::new(FluxGuidance));
    registry.register(Arc::new(FluxDisableGuidance));
    registry.register(Arc::new(ReferenceLatentNode));
    registry.register(Arc::new(FluxKontextImageScale));
    registry.register(Arc::new(FluxKontextMultiReferenceLatentMethod));
}

/// ComfyUI's T5 `min_length` for FLUX: shorter prompts are padded to 256 tokens.
const T5_MIN_TOKENS: usize = 256;

/// FLUX's conditioning of a prompt pair, as ComfyUI's `FluxClipModel` makes it: T5-XXL's
/// hidden states of `text_t5` (weighted, padded to 256 tokens) as the tokens, and
/// CLIP-L's pooled output of `text_l` (the final-normed end token of its last layer, not
/// projected; first chunk) as the pooled vector, or none without a CLIP-L.
pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, text_l: &str, text_t5: &str) -> Result<Conditioning, NodeError> {
    let mut cond = if clip.sdcpp.is_some() {
        crate::conditioning::sdcpp::flux_t5(rt, clip, text_t5)?
    } else {
        let t5 = clip.t5.as_ref().ok_or_else(|| NodeError::msg(format!("this CLIP ({}) has no T5 encoder", clip.family)))?;
        let weights = rt.pin(clip.place, &t5.weights)?;
        let model = T5Encoder::new(&weights, &t5.prefix, T5Config::infer(&weights, &t5.prefix).map_err(err)?).map_err(err)?;
        let tokens = crate::conditioning::chroma::t5_tokens(t5, text_t5, T5_MIN_TOKENS)?;
        let hidden = rt.with_backend(clip.place, |b| model.encode_weighted(b, &tokens)).map_err(err)?;
        Conditioning::new(hidden, model.config.d_model, tokens.ids.len() as i64).map_err(err)?
    };
    if let Some(enc) = clip.encoders.first() {
        let weights = rt.pin(clip.place, &enc.weights)?;
        let model = ClipTextModel::new(&weights, &enc.prefix, ClipTextConfig::infer(&weights, &enc.prefix, enc.layout).map_err(err)?).map_err(err)?;
        let prompt = tokenize_weighted(text_l, &ClipTokenizer::new(PadToken::EndOfText), rt.embedding_library()?.as_ref(), &ChunkOptions::default()).map_err(err)?;
        let l = rt.with_backend(clip.place, |b| encode_prompt_with(b, &model, &prompt, 1, true, Pooled::Raw)).map_err(err)?;
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
        cond.guidance = Guidance::Scale(guidance(inputs)?);
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
        let out = CondList(list.0.iter().map(|e| e.with_cond(Conditioning { guidance: Guidance::Scale(g), ..(*e.cond).clone() })).collect());
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, out)]))
    }
}

/// ComfyUI's "FluxDisableGuidance": the guidance embedding left out entirely (models
/// that were not distilled with one, e.g. FLUX dev fine-tunes run with real CFG).
struct FluxDisableGuidance;

impl Node for FluxDisableGuidance {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("FluxDisableGuidance")
            .display_name("FluxDisableGuidance")
            .category("advanced/conditioning/flux")
            .description("This node completely disables the guidance embed on Flux and Flux like models")
            .input(InputSpec::link("conditioning", IoType::CONDITIONING))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let list = inputs.downcast::<CondList>("conditioning")?;
        let out = CondList(list.0.iter().map(|e| e.with_cond(Conditioning { guidance: Guidance::Off, ..(*e.cond).clone() })).collect());
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, out)]))
    }
}

/// ComfyUI's "ReferenceLatent": the latent's first sample appended to every entry's
/// reference latents (FLUX.1 Kontext sees them beside the latent it denoises).
struct ReferenceLatentNode;

impl Node for ReferenceLatentNode {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ReferenceLatent")
            .display_name("ReferenceLatent")
            .category("advanced/conditioning/edit_models")
            .description("Adds a reference image's latent to the conditioning, for edit models (FLUX.1 Kontext).")
            .input(InputSpec::link("conditioning", IoType::CONDITIONING))
            .input(InputSpec::link("latent", IoType::LATENT).optional())
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let list = inputs.downcast::<CondList>("conditioning")?;
        if !inputs.contains("latent") {
            return Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, list.clone())]));
        }
        let latent = inputs.downcast::<Latent>("latent")?;
        let [w, h, c, _] = latent.shape.map(|d| d.max(0) as usize);
        let first = latent.samples.get(..w * h * c).filter(|_| w * h * c > 0).ok_or_else(|| NodeError::msg(format!("an empty reference latent {:?}", latent.shape)))?;
        let reference = Arc::new(ReferenceLatent { data: first.to_vec(), channels: c, height: h, width: w });
        let out = CondList(
            list.0
                .iter()
                .map(|e| {
                    let mut cond = (*e.cond).clone();
                    cond.references.push(reference.clone());
                    e.with_cond(cond)
                })
                .collect(),
        );
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, out)]))
    }
}

/// The resolutions FLUX.1 Kontext was trained at (ComfyUI's `PREFERED_KONTEXT_RESOLUTIONS`).
const KONTEXT_RESOLUTIONS: [(usize, usize); 17] = [
    (672, 1568),
    (688, 1504),
    (720, 1456),
    (752, 1392),
    (800, 1328),
    (832, 1248),
    (880, 1184),
    (944, 1104),
    (1024, 1024),
    (1104, 944),
    (1184, 880),
    (1248, 832),
    (1328, 800),
    (1392, 752),
    (1456, 720),
    (1504, 688),
    (1568, 672),
];

/// ComfyUI's "FluxKontextImageScale": the image resized (Lanczos, centre crop) to the
/// Kontext resolution of the nearest aspect ratio.
struct FluxKontextImageScale;

impl FluxKontextImageScale {
    /// The (width, height) ComfyUI picks: the smallest aspect-ratio difference, ties to the
    /// smaller width (Python's `min` over `(difference, w, h)` tuples).
    fn target(width: usize, height: usize) -> (usize, usize) {
        let aspect = width as f64 / height as f64;
        let key = |&(w, h): &(usize, usize)| ((aspect - w as f64 / h as f64).abs(), w, h);
        let best = KONTEXT_RESOLUTIONS.iter().min_by(|a, b| key(a).partial_cmp(&key(b)).expect("finite ratios")).expect("a list of resolutions");
        *best
    }
}

impl Node for FluxKontextImageScale {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("FluxKontextImageScale")
            .display_name("FluxKontextImageScale")
            .category("advanced/conditioning/flux")
            .description("Resizes the image to the FLUX.1 Kontext training resolution of the nearest aspect ratio.")
            .input(InputSpec::link("image", IoType::IMAGE))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        if img.width == 0 || img.height == 0 {
            return Err(NodeError::msg("an empty image"));
        }
        let (w, h) = Self::target(img.width, img.height);
        let scaled = crate::image::scale_image(img, w, h, crate::image::resize::Method::Lanczos, true);
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, scaled)]))
    }
}

#[cfg(test)]
mod tests {
    use super::FluxKontextImageScale;

    #[test]
    fn kontext_sizes_follow_comfyui() {
        assert_eq!(FluxKontextImageScale::target(512, 512), (1024, 1024));
        assert_eq!(FluxKontextImageScale::target(1920, 1080), (1392, 752));
        assert_eq!(FluxKontextImageScale::target(1080, 1920), (752, 1392));
        assert_eq!(FluxKontextImageScale::target(100, 1000), (672, 1568));
    }
}

/// ComfyUI's "FluxKontextMultiReferenceLatentMethod": how the entries' reference latents are
/// placed in the position ids (offset, the default; index; uxo/uno).
struct FluxKontextMultiReferenceLatentMethod;

impl Node for FluxKontextMultiReferenceLatentMethod {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("FluxKontextMultiReferenceLatentMethod")
            .display_name("Edit Model Reference Method")
            .category("advanced/conditioning/flux")
            .description("Sets where reference latents sit in the model's positions: offset (beside each other, Kontext's default), index (one index each, overlapping), uxo/uno (past the image, diagonally).")
            .input(InputSpec::link("conditioning", IoType::CONDITIONING))
            .input(InputSpec::combo("reference_latents_method", ["offset", "index", "uxo/uno", "index_timestep_zero", "offset_sd.cpp", "negative_index"]).tooltip("index_timestep_zero: index, the references modulated as at sigma 0 (Qwen-Image-Edit-2511). offset_sd.cpp: offset's placement with the offsets in latent pixels, as sd-cli places a second and later -r image. negative_index: -1, -2, ... (Qwen-Image-Layered's default, sd-cli's ref_index_mode=decrease)."))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let method = match inputs.string("reference_latents_method")? {
            "offset" => ReferenceMethod::Offset,
            "index" => ReferenceMethod::Index,
            "offset_sd.cpp" => ReferenceMethod::OffsetLatent,
            "index_timestep_zero" => ReferenceMethod::IndexTimestepZero,
            "negative_index" => ReferenceMethod::NegativeIndex,
            // ComfyUI reads any spelling with uxo or uso as uxo.
            m if m.contains("uxo") || m.contains("uso") => ReferenceMethod::Uxo,
            other => return Err(NodeError::msg(format!("reference_latents_method `{other}` is not one of offset, index, uxo/uno, index_timestep_zero, offset_sd.cpp, negative_index"))),
        };
        let list = inputs.downcast::<CondList>("conditioning")?;
        let out = CondList(list.0.iter().map(|e| e.with_cond(Conditioning { reference_method: Some(method), ..(*e.cond).clone() })).collect());
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, out)]))
    }
}
