//! ComfyUI's Qwen-Image-Edit text encoders: the prompt and the input images through
//! Qwen2.5-VL (its vision tower reads the images inside the chat template), and the
//! images' VAE latents as reference latents the MMDiT reads beside the one it denoises.
//! TextEncodeQwenImageEdit is the first Edit model's (one image at about a megapixel for
//! both); TextEncodeQwenImageEditPlus is Edit-2509's and 2511's (up to three, each at
//! about 384² for the vision tower and a megapixel, sides multiples of 8, for the VAE).
//! SdCppTextEncodeQwenImageEdit is stable-diffusion.cpp's encoder of the same prompts (the
//! sd-cli presets use it): every Edit model through the Edit-Plus template, the images
//! resized for the vision tower within sd.cpp's pixel bounds, A1111 weights, text positions
//! for the image tokens; its references go to the model through ReferenceLatent.

use std::sync::Arc;

use sdflow_core::models::conditioning::ReferenceLatent;
use sdflow_core::models::llm::prompt::{Family, QWEN_IMAGE_EDIT_PLUS_TEMPLATE, QWEN_IMAGE_EDIT_TEMPLATE};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};

use crate::conditioning::llm::{encode_with_images, vision_input};
use crate::image::resize::Method;
use crate::image::{encode_image, scale_image};
use crate::runtime::Runtime;
use crate::values::{ClipRef, CondEntry, CondList, Image, VaeRef};

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(TextEncodeQwenImageEdit { rt: rt.clone(), plus: false }));
    registry.register(Arc::new(TextEncodeQwenImageEdit { rt: rt.clone(), plus: true }));
    registry.register(Arc::new(SdCppTextEncodeQwenImageEdit { rt: rt.clone() }));
}

struct TextEncodeQwenImageEdit {
    rt: Arc<Runtime>,
    /// TextEncodeQwenImageEditPlus: three optional images, the short template.
    plus: bool,
}

/// `img` scaled by area averaging to about `total` pixels, each side `round(side·s)` and,
/// with `multiple`, rounded to it as ComfyUI's nodes compute them.
fn to_area(img: &Image, total: f64, multiple: Option<f64>) -> Image {
    let scale = (total / (img.width * img.height) as f64).sqrt();
    let side = |v: usize| match multiple {
        Some(m) => ((v as f64 * scale / m).round_ties_even() * m) as usize,
        None => (v as f64 * scale).round_ties_even() as usize,
    };
    scale_image(img, side(img.width).max(1), side(img.height).max(1), Method::Area, false)
}

/// The first sample of `img` encoded by `vae`, as a reference latent.
fn reference(rt: &Runtime, ctx: &ExecContext<'_>, vae: &VaeRef, img: &Image) -> Result<Arc<ReferenceLatent>, NodeError> {
    let first = Image { data: img.data[..img.width * img.height * img.channels].to_vec(), n: 1, ..img.clone() };
    let latent = encode_image(rt, ctx, vae, &first, &rt.vae_tiling)?;
    let [w, h, c, _] = latent.shape.map(|d| d as usize);
    Ok(Arc::new(ReferenceLatent { data: latent.samples, channels: c, height: h, width: w }))
}

impl Node for TextEncodeQwenImageEdit {
    fn schema(&self) -> NodeSchema {
        let s = NodeSchema::new(if self.plus { "TextEncodeQwenImageEditPlus" } else { "TextEncodeQwenImageEdit" })
            .category("advanced/conditioning")
            .description(if self.plus {
                "Qwen-Image-Edit-2509/2511: the prompt and up to three images through Qwen2.5-VL (each about 384x384 for its vision tower), and with a VAE each image's latent (about a megapixel) as a reference."
            } else {
                "Qwen-Image-Edit: the prompt and the image (about a megapixel) through Qwen2.5-VL, and with a VAE the image's latent as a reference."
            })
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::string("prompt", "").multiline())
            .input(InputSpec::link("vae", IoType::VAE).optional());
        let s = if self.plus {
            s.input(InputSpec::link("image1", IoType::IMAGE).optional()).input(InputSpec::link("image2", IoType::IMAGE).optional()).input(InputSpec::link("image3", IoType::IMAGE).optional())
        } else {
            s.input(InputSpec::link("image", IoType::IMAGE).optional())
        };
        s.output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> sdflow_executor::Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        let prompt = inputs.string("prompt")?;
        let vae = if inputs.contains("vae") { Some(inputs.downcast::<VaeRef>("vae")?) } else { None };
        let mut vision = Vec::new();
        let mut references = Vec::new();
        let text = if self.plus {
            let mut pictures = String::new();
            for (k, name) in ["image1", "image2", "image3"].into_iter().enumerate() {
                if !inputs.contains(name) {
                    continue;
                }
                let img = inputs.downcast::<Image>(name)?;
                vision.push(vision_input(&to_area(img, 384.0 * 384.0, None))?);
                if let Some(vae) = vae {
                    references.push(reference(&self.rt, ctx, vae, &to_area(img, 1024.0 * 1024.0, Some(8.0)))?);
                }
                pictures.push_str(&format!("Picture {}: <|vision_start|><|image_pad|><|vision_end|>", k + 1));
            }
            QWEN_IMAGE_EDIT_PLUS_TEMPLATE.replacen("{}", &format!("{pictures}{prompt}"), 1)
        } else if inputs.contains("image") {
            let img = to_area(inputs.downcast::<Image>("image")?, 1024.0 * 1024.0, None);
            vision.push(vision_input(&img)?);
            if let Some(vae) = vae {
                references.push(reference(&self.rt, ctx, vae, &img)?);
            }
            QWEN_IMAGE_EDIT_TEMPLATE.replacen("{}", prompt, 1)
        } else {
            Family::QwenImage.layout(prompt, 0).text
        };
        let mut cond = encode_with_images(&self.rt, clip, &text, &vision)?;
        cond.references.extend(references);
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry::new(cond)]))]))
    }
}

/// How sd.cpp bounds a reference image for the vision tower (`--ref-image-args
/// vlm_resize_mode`): by its area or its longest side, or not at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VlmResize {
    Area,
    LongestSide,
    None,
}

/// sd.cpp's vision-tower size of a `width`×`height` image (`resize_image_dims`): each side
/// rounded to a multiple of 28, then brought inside `min`..`max` (pixels for `Area`, a side
/// for `LongestSide`; ≤ 0: Qwen-Image's 384 and 560, squared for `Area`); `min == max` asks
/// for exactly that size.
pub(crate) fn sdcpp_vlm_size(width: usize, height: usize, mode: VlmResize, min: i64, max: i64) -> (usize, usize) {
    const F: f64 = 28.0;
    let (h, w) = (height as f64, width as f64);
    let default = |v: i64, d: f64| if v > 0 { v as f64 } else if mode == VlmResize::Area { d * d } else { d };
    let (min, max) = (default(min, 384.0), default(max, 560.0));
    let mut hb = (h / F).round() * F;
    let mut wb = (w / F).round() * F;
    match mode {
        _ if min == max && mode != VlmResize::None => {
            let beta = if mode == VlmResize::Area { (min / (h * w)).sqrt() } else { min / h.max(w) };
            hb = F.max((h * beta / F).round() * F);
            wb = F.max((w * beta / F).round() * F);
        }
        VlmResize::Area if hb * wb > max => {
            let beta = (h * w / max).sqrt();
            hb = F.max((h / beta / F).floor() * F);
            wb = F.max((w / beta / F).floor() * F);
        }
        VlmResize::Area if hb * wb < min => {
            let beta = (min / (h * w)).sqrt();
            hb = (h * beta / F).ceil() * F;
            wb = (w * beta / F).ceil() * F;
        }
        VlmResize::LongestSide if h.max(w) > max => {
            let beta = max / h.max(w);
            hb = F.max((h * beta / F).floor() * F);
            wb = F.max((w * beta / F).floor() * F);
        }
        VlmResize::LongestSide if h.max(w) < min => {
            let beta = min / h.max(w);
            hb = (h * beta / F).ceil() * F;
            wb = (w * beta / F).ceil() * F;
        }
        _ => {}
    }
    (wb.max(F) as usize, hb.max(F) as usize)
}

/// sd.cpp's `clip_preprocess` of the first sample of `img` to `w`×`h`: scaled (nearest) to
/// cover the size, then centre-cropped.
fn sdcpp_vision_input(img: &Image, w: usize, h: usize) -> Result<sdflow_core::models::llm::vision::VisionInput, NodeError> {
    if img.n == 0 || img.channels < 3 || img.width == 0 || img.height == 0 {
        return Err(NodeError::msg(format!("a {}x{}x{} image cannot go to the vision tower", img.width, img.height, img.channels)));
    }
    let scale = (w as f32 / img.width as f32).max(h as f32 / img.height as f32);
    let (rw, rh) = (((scale * img.width as f32) as usize).max(w), ((scale * img.height as f32) as usize).max(h));
    let first = Image { data: img.data[..img.width * img.height * img.channels].to_vec(), n: 1, ..img.clone() };
    let scaled = scale_image(&first, rw, rh, Method::Nearest, false);
    let (x0, y0) = ((rw - w) / 2, (rh - h) / 2);
    let mut rgb = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let px = ((y + y0) * rw + x + x0) * scaled.channels;
            rgb.extend(scaled.data[px..px + 3].iter().map(|v| v.clamp(0.0, 1.0)));
        }
    }
    sdflow_core::models::llm::vision::VisionInput::from_image(&rgb, w, h).map_err(crate::err)
}

/// The image inputs SdCppTextEncodeQwenImageEdit takes (sd-cli's `-r`, in order).
const SDCPP_IMAGES: [&str; 4] = ["image1", "image2", "image3", "image4"];

/// "SdCppTextEncodeQwenImageEdit": a Qwen-Image(-Edit) prompt and its reference images
/// encoded as stable-diffusion.cpp encodes them.
struct SdCppTextEncodeQwenImageEdit {
    rt: Arc<Runtime>,
}

impl Node for SdCppTextEncodeQwenImageEdit {
    fn schema(&self) -> NodeSchema {
        let mut s = NodeSchema::new("SdCppTextEncodeQwenImageEdit")
            .display_name("sd.cpp Text Encode Qwen Image Edit")
            .category("advanced/conditioning")
            .description("Qwen-Image-Edit as stable-diffusion.cpp conditions it (the sd-cli presets use it): the prompt and up to four images through Qwen2.5-VL in the Edit-Plus template (Picture 1:, 2:, ...), each image resized for the vision tower within sd.cpp's bounds (384x384 to 560x560 pixels by default), A1111 weights in the prompt, the image tokens at text positions. Without images, the text-to-image template. The images' latents go to the model through ReferenceLatent.")
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::string("prompt", "").multiline());
        for name in SDCPP_IMAGES {
            s = s.input(InputSpec::link(name, IoType::IMAGE).optional());
        }
        s.input(InputSpec::combo("vlm_resize_mode", ["area", "longest_side", "none"]).combo_default("area").optional().tooltip("sd-cli's --ref-image-args vlm_resize_mode: bound each image by its area or its longest side."))
            .input(InputSpec::int("vlm_min_size", -1).int_range(-1, 1 << 26).optional().tooltip("Pixels (area) or a side (longest_side); -1: 384x384 or 384."))
            .input(InputSpec::int("vlm_max_size", -1).int_range(-1, 1 << 26).optional().tooltip("Pixels (area) or a side (longest_side); -1: 560x560 or 560."))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> sdflow_executor::Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let clip = inputs.downcast::<ClipRef>("clip")?;
        let prompt = inputs.string("prompt")?;
        let mode = match if inputs.contains("vlm_resize_mode") { inputs.string("vlm_resize_mode")? } else { "area" } {
            "area" => VlmResize::Area,
            "longest_side" => VlmResize::LongestSide,
            "none" => VlmResize::None,
            other => return Err(NodeError::msg(format!("vlm_resize_mode `{other}`: area, longest_side or none"))),
        };
        let int = |name: &str| if inputs.contains(name) { inputs.int(name) } else { Ok(-1) };
        let (min, max) = (int("vlm_min_size")?, int("vlm_max_size")?);
        let mut vision = Vec::new();
        for name in SDCPP_IMAGES {
            if inputs.contains(name) {
                let img = inputs.downcast::<Image>(name)?;
                let (w, h) = sdcpp_vlm_size(img.width, img.height, mode, min, max);
                vision.push(sdcpp_vision_input(img, w, h)?);
            }
        }
        let cond = crate::conditioning::llm::encode_sdcpp_edit(&self.rt, clip, prompt, &vision)?;
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry::new(cond)]))]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sd.cpp's `resize_image_dims` on Qwen-Image's defaults, worked by hand.
    #[test]
    fn vision_sizes_follow_sd_cpp() {
        // 1024x768: 1036x756 rounded is above 560²: scaled to fit, floored to 28.
        assert_eq!(sdcpp_vlm_size(1024, 768, VlmResize::Area, -1, -1), (644, 476));
        // 100x80: below 384²: scaled up, ceiled.
        assert_eq!(sdcpp_vlm_size(100, 80, VlmResize::Area, -1, -1), (448, 364));
        // Inside the bounds: each side rounded to 28.
        assert_eq!(sdcpp_vlm_size(500, 420, VlmResize::Area, -1, -1), (504, 420));
        // Longest side 560 at most.
        assert_eq!(sdcpp_vlm_size(1000, 500, VlmResize::LongestSide, -1, -1), (560, 280));
        // min == max: that exact area.
        assert_eq!(sdcpp_vlm_size(1000, 500, VlmResize::Area, 200_704, 200_704), (644, 308));
        assert_eq!(sdcpp_vlm_size(10, 10, VlmResize::None, -1, -1), (28, 28));
    }
}
