//! Image-conditioned models (instruct-pix2pix, inpainting UNets, FLUX Fill) and their
//! three-way guidance: ComfyUI's InstructPixToPixConditioning, InpaintModelConditioning and
//! DualCFGGuider, and ConditioningClearImage for sd.cpp's unconditional image channels.
//!
//! sd-cli's `--cfg-scale C --img-cfg-scale I` is, per step,
//! `uncond + I·(img_cond − uncond) + C·(cond − img_cond)`, where `cond` has the prompt
//! and the image, `img_cond` the negative prompt and the image, and `uncond` the
//! negative prompt without the image. That is DualCFGGuider (regular style) with
//! cond1 = the positive with the image, cond2 = the negative with the image,
//! negative = the negative without it, cfg_conds = C and cfg_cond2_negative = I.

use crate::image::encode_image;
use crate::image::latent::latent_zeros;
use crate::runtime::Runtime;
use crate::sampling::{DualCfg, Guider};
use crate::values::{CondConcat, CondList, Image, Mask, ModelRef, VaeRef};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(InstructPixToPixConditioning { rt: rt.clone() }));
    registry.register(Arc::new(InpaintModelConditioning { rt: rt.clone() }));
    registry.register(Arc::new(DualCfgGuider));
    registry.register(Arc::new(ConditioningClearImage));
}

fn non_empty(inputs: &Inputs, name: &str) -> Result<CondList, NodeError> {
    let c = inputs.downcast::<CondList>(name)?.clone();
    if c.0.is_empty() {
        return Err(NodeError::msg(format!("`{name}` is empty")));
    }
    Ok(c)
}

/// ComfyUI's InstructPixToPixConditioning: the source image, VAE-encoded, becomes the
/// extra input of both conditionings (`concat_latent_image`); the latent to sample is
/// zeros of its size.
struct InstructPixToPixConditioning {
    rt: Arc<Runtime>,
}

impl Node for InstructPixToPixConditioning {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("InstructPixToPixConditioning")
            .display_name("InstructPixToPixConditioning")
            .category("conditioning/instructpix2pix")
            .description("Gives both conditionings the encoded source image, for instruct-pix2pix UNets; outputs an empty latent of its size.")
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("vae", IoType::VAE))
            .input(InputSpec::link("pixels", IoType::IMAGE))
            .output("positive", IoType::CONDITIONING)
            .output("negative", IoType::CONDITIONING)
            .output("latent", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut positive = non_empty(inputs, "positive")?;
        let mut negative = non_empty(inputs, "negative")?;
        let img = inputs.downcast::<Image>("pixels")?;
        let vae = inputs.downcast::<VaeRef>("vae")?;
        // encode_image crops to a multiple of 8, centred, as ComfyUI does here.
        let image = Arc::new(encode_image(&self.rt, ctx, vae, img, &self.rt.vae_tiling)?);
        for e in positive.0.iter_mut().chain(negative.0.iter_mut()) {
            e.concat = CondConcat::Image(image.clone());
        }
        let latent = latent_zeros(image.shape)?;
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, positive), Value::new(IoType::CONDITIONING, negative), Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's InpaintModelConditioning: the image with the masked part greyed out,
/// VAE-encoded, and the mask become both conditionings' extra input (what inpainting UNets
/// and FLUX Fill read); the latent to sample is the whole image's, with the mask as its
/// noise mask unless `noise_mask` is off.
struct InpaintModelConditioning {
    rt: Arc<Runtime>,
}

impl Node for InpaintModelConditioning {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("InpaintModelConditioning")
            .display_name("InpaintModelConditioning")
            .category("conditioning/inpaint")
            .description("Gives both conditionings the masked image and the mask, for inpainting models (SD inpainting UNets, FLUX.1 Fill); outputs the image's latent.")
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("vae", IoType::VAE))
            .input(InputSpec::link("pixels", IoType::IMAGE))
            .input(InputSpec::link("mask", IoType::MASK))
            .input(InputSpec::boolean("noise_mask", true).tooltip("Sample only inside the mask (the latent's noise mask); off, the whole image is resampled and the model alone keeps the rest."))
            .output("positive", IoType::CONDITIONING)
            .output("negative", IoType::CONDITIONING)
            .output("latent", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut positive = non_empty(inputs, "positive")?;
        let mut negative = non_empty(inputs, "negative")?;
        let img = inputs.downcast::<Image>("pixels")?;
        let vae = inputs.downcast::<VaeRef>("vae")?;
        let mask = inputs.downcast::<Mask>("mask")?;
        if mask.data.is_empty() || img.channels < 3 || img.width < 8 || img.height < 8 {
            return Err(NodeError::msg(format!("inpainting needs an RGB image of at least 8×8 and a non-empty mask; got a {}×{}×{} image", img.width, img.height, img.channels)));
        }
        // The image's centred multiple-of-8 part, as the VAE encodes it; the mask cut alike.
        let (w, h) = (img.width, img.height);
        let (cw, ch) = (w / 8 * 8, h / 8 * 8);
        let (ox, oy) = ((w % 8) / 2, (h % 8) / 2);
        let mut cut = Vec::with_capacity(img.n * cw * ch);
        let mut greyed = img.clone();
        for i in 0..img.n {
            let m = mask.resized(i, w, h);
            for y in oy..oy + ch {
                cut.extend_from_slice(&m[y * w + ox..y * w + ox + cw]);
            }
            for (p, &mv) in m.iter().enumerate() {
                let keep = 1.0 - mv.round();
                for c in 0..3 {
                    let v = &mut greyed.data[(i * w * h + p) * img.channels + c];
                    *v = (*v - 0.5) * keep + 0.5;
                }
            }
        }
        let cut = Arc::new(Mask { data: cut, n: img.n, height: ch, width: cw });
        let masked = Arc::new(encode_image(&self.rt, ctx, vae, &greyed, &self.rt.vae_tiling)?);
        let mut latent = encode_image(&self.rt, ctx, vae, img, &self.rt.vae_tiling)?;
        if inputs.boolean("noise_mask")? {
            latent.noise_mask = Some(cut.clone());
        }
        for e in positive.0.iter_mut().chain(negative.0.iter_mut()) {
            e.concat = CondConcat::Inpaint { image: masked.clone(), mask: cut.clone() };
        }
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, positive), Value::new(IoType::CONDITIONING, negative), Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's DualCFGGuider: `negative + cfg_cond2_negative·(cond2 − negative) +
/// cfg_conds·(cond1 − cond2)` ("regular"), or with the cond1/cond2 CFG nested inside
/// the cond2/negative one ("nested").
struct DualCfgGuider;

impl Node for DualCfgGuider {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("DualCFGGuider")
            .display_name("DualCFGGuider")
            .category("sampling/custom_sampling/guiders")
            .description("Three-way guidance; with InstructPixToPixConditioning it is sd.cpp's image CFG (cfg_cond2_negative = --img-cfg-scale).")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::link("cond1", IoType::CONDITIONING))
            .input(InputSpec::link("cond2", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::float("cfg_conds", 8.0).float_range(0.0, 100.0).float_step(0.1))
            .input(InputSpec::float("cfg_cond2_negative", 8.0).float_range(0.0, 100.0).float_step(0.1))
            .input(InputSpec::combo("style", ["regular", "nested"]))
            .output("GUIDER", IoType::GUIDER)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let scale = |name: &str| -> Result<f32, NodeError> {
            let v = inputs.float(name)?;
            if !v.is_finite() {
                return Err(NodeError::msg(format!("{name} {v} is not a finite number")));
            }
            Ok(v as f32)
        };
        let nested = match inputs.string("style")? {
            "regular" => false,
            "nested" => true,
            other => return Err(NodeError::msg(format!("style `{other}` is not \"regular\" or \"nested\""))),
        };
        let g = Guider {
            model: inputs.downcast::<ModelRef>("model")?.clone(),
            positive: non_empty(inputs, "cond1")?,
            negative: Some(non_empty(inputs, "negative")?),
            cfg: scale("cfg_conds")?,
            dual: Some(DualCfg { middle: non_empty(inputs, "cond2")?, cfg_middle: scale("cfg_cond2_negative")?, nested }),
        };
        Ok(Outputs::new(vec![Value::new(IoType::GUIDER, g)]))
    }
}

/// The conditioning without its image: inpainting and instruct-pix2pix UNets get
/// sd.cpp's unconditional extra channels (a latent of zeros, a mask of ones) instead of
/// the source image or the latent being inpainted. Needed for sd.cpp's image CFG on
/// inpainting models, whose negatives otherwise see the image, as ComfyUI's do.
struct ConditioningClearImage;

impl Node for ConditioningClearImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ConditioningClearImage")
            .display_name("Conditioning (Clear Image)")
            .category("conditioning/instructpix2pix")
            .description("Removes the source image from the conditioning (sd.cpp's unconditional image input), for the negative of image CFG.")
            .input(InputSpec::link("conditioning", IoType::CONDITIONING))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut c = non_empty(inputs, "conditioning")?;
        c.0.iter_mut().for_each(|e| e.concat = CondConcat::Empty);
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, c)]))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn img_cfg_is_dual_cfg() {
        use crate::sampling::guidance::Mix;
        // sd.cpp's formula, written out, against the regular DualCFG mix.
        let (cond, img, uncond) = (0.7f32, -0.2f32, 0.4f32);
        let (c, i) = (7.5f32, 1.5f32);
        let sdcpp = uncond + i * (img - uncond) + c * (cond - img);
        let d = Mix::Dual { cfg: c, cfg_middle: i, nested: false }.mix(vec![cond], Some(vec![img]), Some(vec![uncond]));
        assert!((d.denoised[0] - sdcpp).abs() < 1e-5);
    }
}
