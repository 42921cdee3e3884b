//! Stages every img_gen builder shares, whatever the family: the LoRA tags, the VAE
//! (plain or tiled, TAESD decoding), the input image, and the tail after decoding
//! (ADetailer, the upscaler, SaveImage).

use sdflow_executor::{InputValue, NodeSpec};
use serde_json::json;

use super::adetailer::{detailer, DetailSpec};
use super::graph::*;
use super::upscale::upscale_chain;
use super::{invalid, save_prefix, ImgGenParams, LoraTag, PresetError};

/// `<lora:name:weight>` tags as LoraLoader nodes over `model` and `clip`, in prompt order.
pub(super) fn lora_chain(b: &mut Builder, p: &ImgGenParams, loras: &[LoraTag], model: &mut Out, clip: &mut Out) {
    for (i, tag) in loras.iter().enumerate() {
        let file = p.lora_files.get(&tag.name).cloned().unwrap_or_else(|| format!("{}.safetensors", tag.name));
        let mut node = NodeSpec::new("LoraLoader")
            .with_input("model", link(model))
            .with_input("clip", link(clip))
            .with_const("lora_name", json!(file))
            .with_const("strength_model", json!(tag.weight))
            .with_const("strength_clip", json!(tag.weight));
        if let Some(m) = &p.lora_apply_mode {
            node = node.with_const("apply_mode", json!(m));
        }
        let key = b.extra(&format!("lora{i}"), &format!("<lora:{}:{}>", tag.name, tag.weight), node);
        *model = Out(key.clone(), 0);
        *clip = Out(key, 1);
    }
}

/// `--circular` / `--circularx` / `--circulary`: the pack's `tiling` choice and the flag
/// that asks for it; `None` when neither axis is circular.
pub(super) fn circular_choice(p: &ImgGenParams) -> Option<(&'static str, &'static str)> {
    match (p.circular_x, p.circular_y) {
        (true, true) => Some(("enable", "--circular")),
        (true, false) => Some(("x_only", "--circularx")),
        (false, true) => Some(("y_only", "--circulary")),
        (false, false) => None,
    }
}

/// `vae` made circular (MakeCircularVAE) when `--circular*` asks for it.
pub(super) fn circular_vae(b: &mut Builder, p: &ImgGenParams, key: &str, vae: Out) -> Out {
    let Some((tiling, flag)) = circular_choice(p) else { return vae };
    let node = NodeSpec::new("MakeCircularVAE").with_input("vae", link(&vae)).with_const("tiling", json!(tiling)).with_const("copy_vae", json!("Make a copy"));
    Out(b.extra(key, flag, node), 0)
}

/// sd-cli's `--circular*` (seamless tiling): SeamlessTile on `model` (after the LoRAs and
/// sampling overrides) and MakeCircularVAE on the returned VAE, so every encode and decode
/// of the run pads circularly as sd.cpp's do.
pub(super) fn circular_chain(b: &mut Builder, p: &ImgGenParams, model: &mut Out, vae: Out) -> Out {
    let Some((tiling, flag)) = circular_choice(p) else { return vae };
    let node = NodeSpec::new("SeamlessTile").with_input("model", link(model)).with_const("tiling", json!(tiling)).with_const("copy_model", json!("Make a copy"));
    *model = Out(b.extra("seamless", flag, node), 0);
    circular_vae(b, p, "circular_vae", vae)
}

/// The VAE that encodes inputs and the decoder of the result (`--taesd` when given: sd.cpp
/// decodes with TAESD and still encodes with the VAE), both tiled under `--vae-tiling`.
pub(super) struct VaeStage<'a> {
    pub(super) vae: Out,
    pub(super) decoder: Out,
    tiling: &'a super::TilingParams,
    /// Tile and overlap in image pixels (ComfyUI's unit; sd.cpp counts latent pixels).
    pub(super) tile_px: i64,
    pub(super) overlap_px: i64,
    taesd: bool,
}

impl<'a> VaeStage<'a> {
    pub(super) fn new(b: &mut Builder, p: &'a ImgGenParams, vae: Out) -> Result<Self, PresetError> {
        let decoder = match &p.taesd {
            Some(t) => {
                let taesd = Out(b.extra("taesd", "--taesd", NodeSpec::new("VAELoader").with_const("vae_name", json!(t))), 0);
                circular_vae(b, p, "circular_taesd", taesd)
            }
            None => vae.clone(),
        };
        if p.tiling.relative.is_some() && !p.tiling.enabled {
            return Err(PresetError::Missing { flag: "--vae-tiling".into(), msg: "--vae-relative-tile-size sizes the tiles of --vae-tiling".into() });
        }
        let (tile_px, overlap_px) = if p.tiling.enabled {
            let (tx, ty) = p.tiling.tile_size;
            // The tiled nodes take 64..=4096 pixels.
            check_range("--vae-tile-size", tx.min(ty), 8, 512)?;
            check_range("--vae-tile-size", tx.max(ty), 8, 512)?;
            if let Some((rx, ry)) = p.tiling.relative {
                if !(rx.is_finite() && ry.is_finite() && rx >= 0.0 && ry >= 0.0) {
                    return Err(invalid("--vae-relative-tile-size", format!("{rx}x{ry} must be non-negative numbers")));
                }
            }
            if !(0.0..1.0).contains(&p.tiling.overlap) {
                return Err(invalid("--vae-tile-overlap", format!("{} is outside 0..1", p.tiling.overlap)));
            }
            let px = tx * 8;
            (px, (px as f64 * p.tiling.overlap).round() as i64)
        } else {
            (0, 0)
        };
        Ok(VaeStage { vae, decoder, tiling: &p.tiling, tile_px, overlap_px, taesd: p.taesd.is_some() })
    }

    fn tiled(&self, class: &str, input: &str, from: &Out, vae: &Out) -> NodeSpec {
        let node = NodeSpec::new(class)
            .with_input(input, link(from))
            .with_input("vae", link(vae))
            .with_const("tile_size", json!(self.tile_px))
            .with_const("overlap", json!(self.overlap_px))
            .with_const("temporal_size", json!(64))
            .with_const("temporal_overlap", json!(8));
        sd_cli_tiles(node, self.tiling)
    }

    /// `pixels` encoded with the VAE (a core node: every run of the mode has it).
    pub(super) fn encode(&self, b: &mut Builder, key: &str, origin: &str, pixels: &Out) -> Out {
        let key = if self.tiling.enabled {
            b.core(key, "--vae-tiling", self.tiled("VAEEncodeTiled", "pixels", pixels, &self.vae))
        } else {
            b.core(key, origin, NodeSpec::new("VAEEncode").with_input("pixels", link(pixels)).with_input("vae", link(&self.vae)))
        };
        Out(key, 0)
    }

    /// `samples` decoded with the decoder.
    pub(super) fn decode(&self, b: &mut Builder, samples: &Out) -> Out {
        let key = if self.tiling.enabled {
            b.core("decode", "--vae-tiling", self.tiled("VAEDecodeTiled", "samples", samples, &self.decoder))
        } else {
            b.core("decode", if self.taesd { "--taesd" } else { "img_gen" }, NodeSpec::new("VAEDecode").with_input("samples", link(samples)).with_input("vae", link(&self.decoder)))
        };
        Out(key, 0)
    }
}

/// `-i` loaded, resized to `-W`×`-H` when they were given.
pub(super) fn init_image(b: &mut Builder, p: &ImgGenParams, img: &str) -> Out {
    let load = b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(img)));
    let mut pixels = Out(load, 0);
    if p.size_given {
        let key = b.extra("resize", "-W/-H", NodeSpec::new("ImageScale").with_input("image", link(&pixels)).with_const("upscale_method", json!("bicubic")).with_const("width", json!(p.width)).with_const("height", json!(p.height)).with_const("crop", json!("center")));
        pixels = Out(key, 0);
    }
    pixels
}

/// The models the tail's detail pass samples with.
pub(super) struct TailModels<'a> {
    pub(super) model: &'a Out,
    pub(super) clip: &'a Out,
    pub(super) vae: &'a Out,
}

/// After decoding: ADetailer (`--ad-model`), the upscaler (`--upscale-model`) and
/// SaveImage; `title` and `description` grow by what was added.
pub(super) fn output_tail(b: &mut Builder, p: &ImgGenParams, mut image: Out, m: TailModels<'_>, sampling: &Sampling<'_>, prompt: &str, title: &mut String, description: &mut String) -> Result<(), PresetError> {
    if let Some(ad) = &p.ad_model {
        // sd.cpp's defaults after generation: 512x512 at strength 0.4.
        let d = DetailSpec { prompt, negative: &p.negative_prompt, ad_prompt: &p.ad_prompt, ad_negative: &p.ad_negative_prompt, inpaint: (512, 512) };
        image = detailer(b, &image, m.model, m.clip, m.vae, &d, ad, p.extra_ad_args.as_deref(), sampling, p.steps, 0.4)?;
        title.push_str(", then ADetailer");
        description.push_str(" ADetailer then re-samples what the --ad-model detector finds (BboxDetectorMasks → DetailerForEachMask, one crop per mask at 512x512).");
    } else if p.extra_ad_args.is_some() {
        return Err(PresetError::Missing { flag: "--ad-model".into(), msg: "--extra-ad-args needs a detector model".into() });
    }
    if let Some(um) = &p.upscale_model {
        image = upscale_chain(b, &image, um, p.upscale_repeats, p.upscale_tile_size);
    }
    b.core("save", "-o", NodeSpec::new("SaveImage").with_input("images", link(&image)).with_const("filename_prefix", json!(save_prefix(&p.output))));
    Ok(())
}

/// A1111's seeds for [`Sampling::variation`](super::graph::Sampling): the variation seed
/// (a negative one drawn at random, as `-s`) and its strength, checked.
pub(super) fn variation(p: &ImgGenParams) -> Result<Option<(i64, f64)>, PresetError> {
    let Some(v) = &p.variation else { return Ok(None) };
    if !(v.strength.is_finite() && (0.0..=1.0).contains(&v.strength)) {
        return Err(invalid("--subseed-strength", format!("{} is outside 0..=1", v.strength)));
    }
    Ok(Some((super::resolve_seed(v.subseed), v.strength)))
}

/// The checks of flag values every family's img_gen makes first.
pub(super) fn check_common(p: &ImgGenParams) -> Result<(), PresetError> {
    check_range("-W", p.width, 16, 16384)?;
    check_range("-H", p.height, 16, 16384)?;
    check_range("--steps", p.steps, 1, 10000)?;
    check_range("-b", p.batch_count, 1, 4096)?;
    check_unit("--strength", p.strength)?;
    check_range("--upscale-repeats", p.upscale_repeats, 1, 16)?;
    if !p.cfg_scale.is_finite() || p.cfg_scale < 0.0 {
        return Err(invalid("--cfg-scale", format!("{} must be a non-negative number", p.cfg_scale)));
    }
    if p.mask.is_some() && p.init_img.is_none() {
        return Err(PresetError::Missing { flag: "-i".into(), msg: "--mask needs an init image".into() });
    }
    check_eta(p.eta)?;
    for (flag, list) in [("--sigmas", &p.sigmas), ("--hires-sigmas", &p.hires.sigmas)] {
        check_sigmas(flag, list.as_deref())?;
    }
    if p.hires.sigmas.is_some() && !p.hires.enabled {
        return Err(PresetError::Missing { flag: "--hires".into(), msg: "--hires-sigmas is the hires pass's schedule".into() });
    }
    Ok(())
}

/// The latent to sample, with the mode's denoise, title and description: `empty`'s latent
/// (txt2img), `-i` encoded (img2img), or with `--mask` inpainting (greyed and encoded at
/// strength 1, else held outside the mask by SetLatentNoiseMask); `-b` repeats an input.
pub(super) fn latent_source(b: &mut Builder, p: &ImgGenParams, stage: &VaeStage<'_>, empty: &str, txt2img: &str) -> (Out, f64, String, String) {
    match &p.init_img {
        None => {
            let key = b.core("latent", "-W/-H", NodeSpec::new(empty).with_const("width", json!(p.width)).with_const("height", json!(p.height)).with_const("batch_size", json!(p.batch_count)));
            (Out(key, 0), 1.0, "Text to image".to_string(), txt2img.to_string())
        }
        Some(img) => {
            let pixels = init_image(b, p, img);
            let out = match &p.mask {
                None => {
                    let enc = stage.encode(b, "encode", "-i", &pixels);
                    (enc, p.strength, "Image to image".to_string(), "sd-cli's img2img (-i, --strength): the input image is encoded with the VAE, noised to the denoise strength and sampled back with the prompt.".to_string())
                }
                Some(mask) => {
                    let m = b.core("mask", "--mask", NodeSpec::new("LoadImageMask").with_const("image", json!(mask)).with_const("channel", json!("red")));
                    if p.strength >= 1.0 {
                        let enc = b.core("encode", "--mask", NodeSpec::new("VAEEncodeForInpaint").with_input("pixels", link(&pixels)).with_input("vae", link(&stage.vae)).with_input("mask", InputValue::link(m, 0)).with_const("grow_mask_by", json!(6)));
                        (Out(enc, 0), 1.0, "Inpainting".to_string(), "sd-cli's --mask mode: the masked part of the input image (mask.png's red channel, white = repaint) is greyed, encoded and re-sampled with the prompt; outside the mask the latent is held at the image. Works with normal checkpoints (latent blending) and 9-channel inpainting checkpoints (mask and masked image as extra UNet input).".to_string())
                    } else {
                        // Below full strength the masked region keeps the image's content
                        // as a start, so it is encoded as is, not greyed.
                        let enc = stage.encode(b, "encode", "--mask", &pixels);
                        let key = b.core("noise_mask", "--mask", NodeSpec::new("SetLatentNoiseMask").with_input("samples", link(&enc)).with_input("mask", InputValue::link(m, 0)));
                        (Out(key, 0), p.strength, "Inpainting".to_string(), format!("sd-cli's --mask mode at --strength {}: the input image is encoded, noised to the strength and re-sampled where the mask (red channel, white = repaint) is set; elsewhere the latent is held at the image.", p.strength))
                    }
                }
            };
            if p.batch_count > 1 {
                let key = b.extra("repeat", "-b", NodeSpec::new("RepeatLatentBatch").with_input("samples", link(&out.0)).with_const("amount", json!(p.batch_count)));
                (Out(key, 0), out.1, out.2, out.3)
            } else {
                out
            }
        }
    }
}
