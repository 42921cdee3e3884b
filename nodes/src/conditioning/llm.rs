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
use sdflow_core::models::llm::vision::{VisionConfig, VisionInput, VisionTower};
use sdflow_core::models::llm::{LlmConfig, LlmEncoder};
use sdflow_core::text::llm::LlmTokenizer;
use sdflow_executor::NodeError;

/// `text` conditioned through `clip`'s LLM.
pub(crate) fn encode(rt: &Runtime, clip: &ClipRef, text: &str) -> Result<Conditioning, NodeError> {
    let llm = clip.llm.as_ref().ok_or_else(|| NodeError::msg(format!("this CLIP ({}) has no LLM text encoder", clip.family)))?;
    let weights = rt.pin(clip.place, &llm.weights)?;
    let model = LlmEncoder::new(&weights, &llm.prefix, LlmConfig::infer(&weights, &llm.prefix, None).map_err(err)?).map_err(err)?;
    let prompt = llm.family.layout(text, model.config.layers);
    let tokenizer = llm.family.tokenizer().map_err(err)?;
    let (rows, width) = rt.with_backend(clip.place, |b| model.encode_prompt(b, &tokenizer, &prompt)).map_err(err)?;
    let tokens = rows.len() / width.max(1);
    Conditioning::new(rows, width as i64, tokens as i64).map_err(err)
}

/// `text` (a Qwen template already applied, its `<|image_pad|>`s one per image) with
/// `images` (HWC, 0..1, sides multiples of 28) through `clip`'s Qwen2.5-VL as ComfyUI's
/// Qwen-Image encoder runs it: no A1111 weights, the template cut where ComfyUI cuts it.
pub(crate) fn encode_with_images(rt: &Runtime, clip: &ClipRef, text: &str, images: &[VisionInput]) -> Result<Conditioning, NodeError> {
    let llm = clip.llm.as_ref().ok_or_else(|| NodeError::msg(format!("this CLIP ({}) has no LLM text encoder; Qwen-Image-Edit reads Qwen2.5-VL (CLIPLoader type qwen_image)", clip.family)))?;
    let weights = rt.pin(clip.place, &llm.weights)?;
    let model = LlmEncoder::new(&weights, &llm.prefix, LlmConfig::infer(&weights, &llm.prefix, None).map_err(err)?).map_err(err)?;
    let tokenizer = LlmTokenizer::qwen().map_err(err)?;
    let vision = match (&llm.vision, images.is_empty()) {
        (_, true) => None,
        (Some((handle, prefix)), false) => Some((rt.pin(clip.place, handle)?, prefix)),
        (None, false) => return Err(NodeError::msg("the text encoder has no vision tower (`visual.*`): Qwen-Image-Edit's image prompts need Qwen2.5-VL with it (ComfyUI's qwen_2.5_vl_7b.safetensors)")),
    };
    let tower = match &vision {
        Some((w, prefix)) => Some(VisionTower::new(w, prefix, VisionConfig::infer(w, prefix).map_err(err)?).map_err(err)?),
        None => None,
    };
    let (rows, width) = rt.with_backend(clip.place, |b| model.encode_with_images(b, &tokenizer, text, tower.as_ref(), images)).map_err(err)?;
    let tokens = rows.len() / width.max(1);
    Conditioning::new(rows, width as i64, tokens as i64).map_err(err)
}

/// A Qwen-Image prompt with `images` (already sized for the vision tower) as sd.cpp
/// encodes it: the Edit-Plus template with numbered pictures (the text-to-image template
/// without images), A1111 weights, text positions, the system part dropped.
pub(crate) fn encode_sdcpp_edit(rt: &Runtime, clip: &ClipRef, text: &str, images: &[VisionInput]) -> Result<Conditioning, NodeError> {
    let llm = clip.llm.as_ref().ok_or_else(|| NodeError::msg(format!("this CLIP ({}) has no LLM text encoder; Qwen-Image-Edit reads Qwen2.5-VL (CLIPLoader type qwen_image)", clip.family)))?;
    if llm.family != sdflow_core::models::llm::Family::QwenImage {
        return Err(NodeError::msg(format!("this CLIP is {}'s; Qwen-Image-Edit reads Qwen2.5-VL (CLIPLoader type qwen_image)", clip.family)));
    }
    let weights = rt.pin(clip.place, &llm.weights)?;
    let model = LlmEncoder::new(&weights, &llm.prefix, LlmConfig::infer(&weights, &llm.prefix, None).map_err(err)?).map_err(err)?;
    let tokenizer = LlmTokenizer::qwen().map_err(err)?;
    if images.is_empty() {
        let prompt = llm.family.layout(text, model.config.layers);
        let (rows, width) = rt.with_backend(clip.place, |b| model.encode_prompt(b, &tokenizer, &prompt)).map_err(err)?;
        return Conditioning::new(rows.clone(), width as i64, (rows.len() / width.max(1)) as i64).map_err(err);
    }
    let vision = match &llm.vision {
        Some((handle, prefix)) => (rt.pin(clip.place, handle)?, prefix),
        None => return Err(NodeError::msg("the text encoder has no vision tower (`visual.*`): Qwen-Image-Edit's reference images need Qwen2.5-VL with it (ComfyUI's qwen_2.5_vl_7b.safetensors, or sd-cli's --llm_vision)")),
    };
    let tower = VisionTower::new(&vision.0, vision.1, VisionConfig::infer(&vision.0, vision.1).map_err(err)?).map_err(err)?;
    let prompt = sdflow_core::models::llm::prompt::qwen_image_edit_layout(text, images.len(), model.config.layers);
    let (rows, width) = rt.with_backend(clip.place, |b| model.encode_prompt_with_images(b, &tokenizer, &prompt, Some(&tower), images)).map_err(err)?;
    let tokens = rows.len() / width.max(1);
    Conditioning::new(rows, width as i64, tokens as i64).map_err(err)
}

/// An image as ComfyUI's `process_qwen2vl_images` prepares it for the vision tower: each
/// side rounded to a multiple of 28 (kept within 3136 and 12845056 pixels), bilinear
/// resampling, the first sample's RGB.
pub(crate) fn vision_input(img: &crate::values::Image) -> Result<VisionInput, NodeError> {
    const FACTOR: f64 = 28.0;
    const MIN_PIXELS: f64 = 3136.0;
    const MAX_PIXELS: f64 = 12_845_056.0;
    if img.n == 0 || img.channels < 3 || img.width == 0 || img.height == 0 {
        return Err(NodeError::msg(format!("a {}x{}x{} image cannot go to the vision tower", img.width, img.height, img.channels)));
    }
    let (h, w) = (img.height as f64, img.width as f64);
    let (mut hb, mut wb) = ((h / FACTOR).round_ties_even() * FACTOR, (w / FACTOR).round_ties_even() * FACTOR);
    if hb * wb > MAX_PIXELS {
        let beta = (h * w / MAX_PIXELS).sqrt();
        hb = FACTOR.max((h / beta / FACTOR).floor() * FACTOR);
        wb = FACTOR.max((w / beta / FACTOR).floor() * FACTOR);
    } else if hb * wb < MIN_PIXELS {
        let beta = (MIN_PIXELS / (h * w)).sqrt();
        hb = (h * beta / FACTOR).ceil() * FACTOR;
        wb = (w * beta / FACTOR).ceil() * FACTOR;
    }
    let first = crate::values::Image { data: img.data[..img.width * img.height * img.channels].to_vec(), n: 1, ..img.clone() };
    let scaled = crate::image::scale_image(&first, wb as usize, hb as usize, crate::image::resize::Method::Bilinear, false);
    let rgb: Vec<f32> = scaled.data.chunks_exact(scaled.channels).flat_map(|p| p[..3].iter().copied()).collect();
    VisionInput::from_image(&rgb, scaled.width, scaled.height).map_err(err)
}
