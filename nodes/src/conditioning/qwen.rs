//! ComfyUI's Qwen-Image-Edit text encoders: the prompt and the input images through
//! Qwen2.5-VL (its vision tower reads the images inside the chat template), and the
//! images' VAE latents as reference latents the MMDiT reads beside the one it denoises.
//! TextEncodeQwenImageEdit is the first Edit model's (one image at about a megapixel for
//! both); TextEncodeQwenImageEditPlus is Edit-2509's and 2511's (up to three, each at
//! about 384² for the vision tower and a megapixel, sides multiples of 8, for the VAE).

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
