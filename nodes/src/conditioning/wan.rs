//! Wan's text conditioning: UMT5-XXL alone (CLIPLoader type `wan`), as ComfyUI's Wan
//! text encoder makes it: the prompt's tokens and `</s>`, `<pad>` up to 512 tokens (or
//! T5TokenizerOptions' padding), UMT5 attending to the tokens up to `</s>` only, and the
//! padding's states zeros. Wan's cross-attention has no mask, so those zero rows are part
//! of what the model reads. sd.cpp's way (the sd-cli presets) is in [`super::sdcpp::wan`].
//! WanImageToVideo puts an I2V model's start frames and CLIP-vision states on the
//! conditioning.

use crate::err;
use crate::image::latent::{latent_zeros, video_latent_frames};
use crate::image::resize::Method;
use crate::image::{encode_video, scale_image};
use crate::runtime::Runtime;
use crate::values::{ClipRef, ClipVisionOutput, CondList, Image, VaeRef};
use sdflow_core::models::conditioning::{Conditioning, ImageTokens, VideoImage};
use sdflow_core::models::t5::{T5Config, T5Encoder};
use sdflow_core::text::t5::T5Tokenizer;
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

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

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(WanImageToVideo { rt: rt.clone() }));
}

/// ComfyUI's "WanImageToVideo": an empty video latent, and on both conditionings the
/// start frames' latent over the whole video (the rest grey) with the mask of what is
/// known (`concat_latent_image`, `concat_mask`) and the CLIP-vision states
/// (`clip_vision_output`), which a Wan I2V model reads beside the latent and the text.
struct WanImageToVideo {
    rt: Arc<Runtime>,
}

impl Node for WanImageToVideo {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("WanImageToVideo")
            .display_name("WanImageToVideo")
            .category("conditioning/video_models")
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("vae", IoType::VAE))
            .input(InputSpec::int("width", 832).int_range(16, 16384).int_step(16))
            .input(InputSpec::int("height", 480).int_range(16, 16384).int_step(16))
            .input(InputSpec::int("length", 81).int_range(1, 16384).int_step(4))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .input(InputSpec::link("clip_vision_output", IoType::CLIP_VISION_OUTPUT).optional())
            .input(InputSpec::link("start_image", IoType::IMAGE).optional())
            .output("positive", IoType::CONDITIONING)
            .output("negative", IoType::CONDITIONING)
            .output("latent", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, length, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("length")?, inputs.int("batch_size")?);
        if w < 16 || h < 16 || n < 1 || !(1..=16384).contains(&length) {
            return Err(NodeError::msg(format!("{w}x{h} × {length} frames × {n} is not a valid video size")));
        }
        let frames = video_latent_frames(length) as usize;
        let mut latent = latent_zeros([w / 8, h / 8, 16 * frames as i64, n])?;
        latent.frames = frames;
        let mut positive = inputs.downcast::<CondList>("positive")?.clone();
        let mut negative = inputs.downcast::<CondList>("negative")?.clone();
        let video_image = match inputs.contains("start_image").then(|| inputs.downcast::<Image>("start_image")).transpose()? {
            Some(start) => {
                let vae = inputs.downcast::<VaeRef>("vae")?;
                let (w, h, length) = (w as usize, h as usize, length as usize);
                let given = start.n.min(length);
                let scaled = scale_image(start, w, h, Method::Bilinear, true);
                // The video: the start frames, then grey.
                let c = scaled.channels;
                let mut data = vec![0.5f32; length * h * w * 3];
                for f in 0..given {
                    for p in 0..w * h {
                        for k in 0..3 {
                            data[(f * w * h + p) * 3 + k] = scaled.data[(f * w * h + p) * c + k.min(c - 1)];
                        }
                    }
                }
                let video = Image { data, n: length, height: h, width: w, channels: 3 };
                let (encoded, t) = encode_video(&self.rt, ctx, vae, &video)?;
                if t != frames {
                    return Err(NodeError::msg(format!("the VAE made {t} latent frames of {length} video frames; the latent has {frames}")));
                }
                let (lw, lh) = (w / 8, h / 8);
                let plane = lw * lh;
                // Latent frames holding a given frame are known (ComfyUI's concat_mask 0
                // there), all four sub-frames alike.
                let known_frames = (given - 1) / 4 + 1;
                let known: Vec<f32> = (0..4).flat_map(|_| (0..frames).flat_map(move |f| std::iter::repeat_n(if f < known_frames { 1.0 } else { 0.0 }, plane))).collect();
                Some(Arc::new(VideoImage { latent: encoded, channels: 16, frames, height: lh, width: lw, known }))
            }
            None => None,
        };
        let clip = match inputs.contains("clip_vision_output").then(|| inputs.downcast::<ClipVisionOutput>("clip_vision_output")).transpose()? {
            Some(o) => Some(Arc::new(ImageTokens { data: o.penultimate[..o.tokens * o.hidden].to_vec(), width: o.hidden })),
            None => None,
        };
        for list in [&mut positive, &mut negative] {
            *list = CondList(
                list.0
                    .iter()
                    .map(|e| {
                        let mut c = (*e.cond).clone();
                        if video_image.is_some() {
                            c.video_image = video_image.clone();
                        }
                        if clip.is_some() {
                            c.image_tokens = clip.clone();
                        }
                        e.with_cond(c)
                    })
                    .collect(),
            );
        }
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, positive), Value::new(IoType::CONDITIONING, negative), Value::new(IoType::LATENT, latent)]))
    }
}
