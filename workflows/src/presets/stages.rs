//! Stages every img_gen builder shares, whatever the family: the LoRA tags, the VAE
//! (plain or tiled, TAESD decoding), the input image, and the tail after decoding
//! (ADetailer, the upscaler, SaveImage).

use sdflow_executor::{InputValue, NodeSpec};
use serde_json::json;

use super::adetailer::{detailer, DetailSpec};
use super::graph::*;
use super::upscale::upscale_chain;
use super::{invalid, not_supported, save_prefix, ImgGenParams, LoraTag, PresetError};

/// `<lora:name:weight>` tags as LoraLoader nodes over `model` and `clip`, in prompt order.
pub(super) fn lora_chain(b: &mut Builder, p: &ImgGenParams, loras: &[LoraTag], model: &mut Out, clip: &mut Out) {
    // The high-noise expert's tags go to its model (the Wan MoE passes).
    for (i, tag) in loras.iter().enumerate().filter(|(_, t)| !t.high_noise) {
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
    if let Some(paste) = b.paste.take() {
        // A1111's overlay: the result scaled back to its region ("only masked"), and the
        // input laid over it where the mask does not reach.
        let (x, y, source) = match paste.region {
            Some([x, y, w, h]) => (x, y, a1111_resize(b, "uncrop", "inpaint_full_res", &image, w, h, "crop and resize")),
            None => (0, 0, image),
        };
        let node = NodeSpec::new("ImageCompositeMasked").with_input("destination", link(&paste.destination)).with_input("source", link(&source)).with_const("x", json!(x)).with_const("y", json!(y)).with_const("resize_source", json!(false)).with_input("mask", link(&paste.mask));
        image = Out(b.core("overlay", "--mask", node), 0);
    }
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
    let moe = p.video.as_ref().is_some_and(|v| v.high_noise.is_some());
    if let Some(t) = super::extract_loras(&p.prompt)?.1.iter().find(|t| t.high_noise && !moe) {
        return Err(not_supported(format!("<lora:|high_noise|{}>", t.name), "a high-noise LoRA needs a high-noise expert (--high-noise-diffusion-model, vid_gen)"));
    }
    if !p.cfg_scale.is_finite() || p.cfg_scale < 0.0 {
        return Err(invalid("--cfg-scale", format!("{} must be a non-negative number", p.cfg_scale)));
    }
    if p.mask.is_some() && p.init_img.is_none() {
        return Err(PresetError::Missing { flag: "-i".into(), msg: "--mask needs an init image".into() });
    }
    check_eta(p.eta)?;
    if let Some(a) = &p.a1111 {
        if p.init_img.is_none() {
            return Err(PresetError::Missing { flag: "-i".into(), msg: "A1111's img2img options need an init image".into() });
        }
        if a.resize_mode > 3 {
            return Err(invalid("resize_mode", format!("{} is not 0, 1, 2 or 3", a.resize_mode)));
        }
        if a.masked_content > 3 {
            return Err(invalid("inpainting_fill", format!("{} is not 0, 1, 2 or 3", a.masked_content)));
        }
        if a.resize_mode == 3 && p.size_given && p.mask.is_some() && a.region.is_none() {
            return Err(super::not_supported("resize_mode", "3 (latent upscale) with a mask over the whole picture: A1111 lays the input back at its own size over a result of the new size, which fails there"));
        }
        if let Some([x, y, w, h]) = a.region {
            if p.mask.is_none() || x < 0 || y < 0 || w < 1 || h < 1 {
                return Err(invalid("inpaint_full_res", format!("the region {w}x{h} at {x},{y} needs a mask and a positive size")));
            }
        }
        if !(a.noise_multiplier.is_finite() && a.noise_multiplier >= 0.0) {
            return Err(invalid("initial_noise_multiplier", format!("{} must be a non-negative number", a.noise_multiplier)));
        }
    }
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
pub(super) fn latent_source(b: &mut Builder, p: &ImgGenParams, stage: &VaeStage<'_>, s: &Sampling<'_>, model: &Out, empty: &str, txt2img: &str) -> (Out, f64, String, String) {
    if let (Some(a), Some(img)) = (&p.a1111, &p.init_img) {
        return a1111_source(b, p, stage, s, model, img, a);
    }
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

/// A1111's resize modes by A1111ResizeImage's names.
const RESIZE_MODES: [&str; 3] = ["just resize", "crop and resize", "resize and fill"];
/// A1111's masked contents by A1111InpaintLatent's names (0, fill, acts on the image and
/// keeps the latent as encoded).
const MASKED_CONTENTS: [&str; 4] = ["original", "original", "latent noise", "latent nothing"];

fn a1111_resize(b: &mut Builder, key: &str, origin: &str, from: &Out, w: i64, h: i64, mode: &str) -> Out {
    Out(b.core(key, origin, NodeSpec::new("A1111ResizeImage").with_input("image", link(from)).with_const("width", json!(w)).with_const("height", json!(h)).with_const("resize_mode", json!(mode))), 0)
}

/// The A1111 API's img2img input ([`super::A1111Img2Img`]), as A1111's
/// `StableDiffusionProcessingImg2Img.init` prepares it: the image fitted by the resize
/// mode (A1111ResizeImage; mode 3 resizes the encoded latent); with a mask (given blurred,
/// at the input's size) the masked content (A1111MaskedFill before encoding, or
/// A1111InpaintLatent, which also sets A1111's rounded latent mask as the noise mask) and
/// the inpaint area ("only masked": the region cropped and fitted to -W×-H); and for the
/// tail, the overlay ([`PasteBack`]): the input through the mask over the result.
fn a1111_source(b: &mut Builder, p: &ImgGenParams, stage: &VaeStage<'_>, s: &Sampling<'_>, model: &Out, img: &str, a: &super::A1111Img2Img) -> (Out, f64, String, String) {
    let load = Out(b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(img))), 0);
    let (w, h) = (p.width, p.height);
    let mode = RESIZE_MODES[usize::from(a.resize_mode.min(2))];
    let repeat = |b: &mut Builder, latent: Out| -> Out {
        if p.batch_count > 1 {
            Out(b.extra("repeat", "-b", NodeSpec::new("RepeatLatentBatch").with_input("samples", link(&latent)).with_const("amount", json!(p.batch_count))), 0)
        } else {
            latent
        }
    };
    let Some(mask) = &p.mask else {
        let pixels = if p.size_given && a.resize_mode != 3 { a1111_resize(b, "resize", "resize_mode", &load, w, h, mode) } else { load };
        let mut latent = stage.encode(b, "encode", "-i", &pixels);
        if p.size_given && a.resize_mode == 3 {
            latent = Out(b.core("latent_resize", "resize_mode", NodeSpec::new("LatentUpscale").with_input("samples", link(&latent)).with_const("upscale_method", json!("bilinear")).with_const("width", json!(w)).with_const("height", json!(h)).with_const("crop", json!("disabled"))), 0);
        }
        let how = match (p.size_given, a.resize_mode) {
            (false, _) => "at its own size",
            (true, 0) => "stretched to -W×-H (A1111's just resize, Lanczos)",
            (true, 1) => "scaled to cover -W×-H and cut around the centre (A1111's crop and resize)",
            (true, 2) => "scaled to fit -W×-H with the bands beside it filled from its edges (A1111's resize and fill)",
            _ => "encoded at its own size and the latent resized to -W×-H (A1111's just resize, latent upscale)",
        };
        return (repeat(b, latent), p.strength, "Image to image".to_string(), format!("A1111's img2img: the input image {how}, encoded with the VAE, noised to the denoising strength and sampled back with the prompt."));
    };
    let mask_img = Out(b.core("mask", "--mask", NodeSpec::new("LoadImage").with_const("image", json!(mask))), 0);
    let to_mask = |b: &mut Builder, key: &str, from: &Out| Out(b.core(key, "--mask", NodeSpec::new("ImageToMask").with_input("image", link(from)).with_const("channel", json!("red"))), 0);
    let (pixels, m, destination, paste_mask, area) = match a.region {
        None => {
            let (pixels, fitted) = if p.size_given { (a1111_resize(b, "resize", "resize_mode", &load, w, h, mode), a1111_resize(b, "mask_resize", "resize_mode", &mask_img, w, h, mode)) } else { (load, mask_img) };
            let m = to_mask(b, "mask_channel", &fitted);
            // The overlay's mask is the mask doubled (A1111's `mask_for_overlay`): the
            // input shows only where the mask is under one half.
            let doubled = Out(b.core("overlay_mask", "--mask", NodeSpec::new("MaskComposite").with_input("destination", link(&m)).with_input("source", link(&m)).with_const("x", json!(0)).with_const("y", json!(0)).with_const("operation", json!("add"))), 0);
            (pixels.clone(), m, pixels, doubled, "the whole picture".to_string())
        }
        Some([x, y, rw, rh]) => {
            let crop = |b: &mut Builder, key: &str, from: &Out| Out(b.core(key, "inpaint_full_res", NodeSpec::new("ImageCrop").with_input("image", link(from)).with_const("width", json!(rw)).with_const("height", json!(rh)).with_const("x", json!(x)).with_const("y", json!(y))), 0);
            let cut = crop(b, "crop", &load);
            let pixels = a1111_resize(b, "crop_resize", "inpaint_full_res", &cut, w, h, "resize and fill");
            let mcut = crop(b, "mask_crop", &mask_img);
            let mfit = a1111_resize(b, "mask_crop_resize", "inpaint_full_res", &mcut, w, h, "resize and fill");
            let m = to_mask(b, "mask_channel", &mfit);
            let whole = to_mask(b, "overlay_channel", &mask_img);
            let paste_mask = Out(b.core("overlay_mask", "inpaint_full_res", NodeSpec::new("CropMask").with_input("mask", link(&whole)).with_const("x", json!(x)).with_const("y", json!(y)).with_const("width", json!(rw)).with_const("height", json!(rh))), 0);
            (pixels, m, load, paste_mask, format!("only the masked region ({rw}x{rh} at {x},{y}: the mask's box padded and widened to -W:-H, cropped and fitted to -W×-H, and pasted back)"))
        }
    };
    let content = usize::from(a.masked_content.min(3));
    let filled = if content == 0 { Out(b.core("fill", "inpainting_fill", NodeSpec::new("A1111MaskedFill").with_input("image", link(&pixels)).with_input("mask", link(&m))), 0) } else { pixels };
    let enc = stage.encode(b, "encode", "--mask", &filled);
    let latent = repeat(b, enc);
    let mut node = NodeSpec::new("A1111InpaintLatent").with_input("samples", link(&latent)).with_input("mask", link(&m)).with_const("masked_content", json!(MASKED_CONTENTS[content]));
    if content == 2 {
        // The sampler's own initial noise, as A1111 fills with its seeds' noise.
        let noise = match s.variation {
            Some((subseed, strength)) => s.variation_noise(subseed, strength, true),
            None => s.with_rng(NodeSpec::new("RandomNoise").with_const("noise_seed", json!(s.seed))),
        };
        let noise = b.core("fill_noise", "inpainting_fill", noise);
        node = node.with_input("noise", InputValue::link(noise, 0)).with_input("model", link(model));
    }
    let latent = Out(b.core("inpaint", "--mask", node), 0);
    let destination = if p.batch_count > 1 { Out(b.extra("overlay_repeat", "-b", NodeSpec::new("RepeatImageBatch").with_input("image", link(&destination)).with_const("amount", json!(p.batch_count))), 0) } else { destination };
    b.paste = Some(PasteBack { destination, mask: paste_mask, region: a.region });
    let content_words = ["fill (painted from the colours around it, A1111MaskedFill)", "original", "latent noise (the masked latent replaced by the sampler's initial noise)", "latent nothing (the masked latent zeroed)"][content];
    (latent, p.strength, "Inpainting".to_string(), format!("A1111's inpainting of {area}: masked content {content_words}, the mask (white repaints, blurred) rounded at the latent's size holds sampling to the masked part, and the input is laid back over the result through the mask."))
}
