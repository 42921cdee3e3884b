//! ADetailer: the detector nodes ([`detect`]) and the detail pass (here).
//!
//! ADetailer's detail step: DetailerForEachMask re-samples an image once per mask of a
//! MASK batch (BboxDetectorMasks' output), serially, each pass starting from the last
//! one's result, as sd.cpp's detailer and A1111's ADetailer ("inpaint only masked") do:
//!
//! 1. the mask's bounding box, grown by `inpaint_padding` and then to the aspect ratio
//!    of `inpaint_width`×`inpaint_height` (A1111's `expand_crop_region`), clipped to the
//!    image, is cropped from the current image and resized to the inpaint size (aligned
//!    down to the VAE's factor of 8);
//! 2. it is VAE-encoded and inpainted with the cropped mask as noise mask at
//!    `denoising_strength`, seed `seed + index`, with the mask's own prompt;
//! 3. the decode is resized back and blended into the crop by the mask blurred by
//!    `mask_blur` (detect.rs's composite feather); pixels outside the crop, and where the
//!    blurred mask is zero, keep their exact values.
//!
//! Prompts follow ADetailer: `[SEP]` splits `ad_prompt` into one prompt per mask (the
//! last part repeats), `[PROMPT]` is replaced by `prompt`, an empty part is `prompt`
//! itself, and a part that is `[SKIP]` leaves its mask untouched. `ad_negative_prompt`
//! works the same against `negative_prompt`.

pub mod detect;


use crate::conditioning::encode_text;
use crate::detailer::detect::gaussian_blur;
use crate::err;
use crate::image::{decode_latent, encode_image};
use crate::image::resize::{resize_plane, Method};
use crate::runtime::Runtime;
use crate::sampling::{rng_from, rng_input, sample_latent, sampler_from, sampler_names, scheduler_names, Guider, NoiseSource, SamplerChoice};
use crate::values::{ClipRef, CondList, Image, Mask, ModelRef, VaeRef};
use sdflow_core::sampling::schedule::{apply_denoise, ScheduleOpts, Scheduler};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(DetailerForEachMask { rt: rt.clone() }));
}

/// The VAE's spatial factor the inpaint size is aligned to (every supported VAE is f8).
const ALIGN: usize = 8;

/// The prompt ADetailer uses for mask `index`: `None` when that part is `[SKIP]`.
pub fn mask_prompt(ad_prompt: &str, main: &str, index: usize) -> Option<String> {
    let parts: Vec<&str> = ad_prompt.split("[SEP]").map(str::trim).collect();
    let part = parts[index.min(parts.len() - 1)];
    if part == "[SKIP]" {
        return None;
    }
    Some(if part.is_empty() { main.to_string() } else { part.replace("[PROMPT]", main) })
}

/// The bounding box `(x1, y1, x2, y2)` (exclusive ends) of the nonzero pixels.
pub fn mask_bbox(m: &[f32], width: usize, height: usize) -> Option<(usize, usize, usize, usize)> {
    let mut b: Option<(usize, usize, usize, usize)> = None;
    for y in 0..height {
        for x in 0..width {
            if m[y * width + x] > 0.0 {
                let (x1, y1, x2, y2) = b.unwrap_or((x, y, x + 1, y + 1));
                b = Some((x1.min(x), y1.min(y), x2.max(x + 1), y2.max(y + 1)));
            }
        }
    }
    b
}

/// The region to re-sample: `bbox` grown by `pad` on every side and clipped to the image,
/// then grown along its short side to the aspect ratio of `tw`×`th`, shifted back inside
/// the image where it overflows (A1111's `get_crop_region` + `expand_crop_region`).
pub fn crop_region(bbox: (usize, usize, usize, usize), pad: usize, width: usize, height: usize, tw: usize, th: usize) -> (usize, usize, usize, usize) {
    let (x1, y1) = (bbox.0.saturating_sub(pad) as i64, bbox.1.saturating_sub(pad) as i64);
    let (x2, y2) = ((bbox.2 + pad).min(width) as i64, (bbox.3 + pad).min(height) as i64);
    let (mut x1, mut y1, mut x2, mut y2) = (x1, y1, x2, y2);
    let (w, h) = (width as i64, height as i64);
    let ratio_crop = (x2 - x1) as f64 / (y2 - y1) as f64;
    let ratio_target = tw as f64 / th as f64;
    // Grow one axis by `diff`, split around the centre, then slide it back inside [0, n).
    let grow = |a: &mut i64, b: &mut i64, diff: i64, n: i64| {
        *a -= diff / 2;
        *b += diff - diff / 2;
        if *b > n {
            *a -= *b - n;
            *b = n;
        }
        if *a < 0 {
            *b -= *a;
            *a = 0;
        }
        *b = (*b).min(n);
    };
    if ratio_crop > ratio_target {
        let diff = ((x2 - x1) as f64 / ratio_target) as i64 - (y2 - y1);
        grow(&mut y1, &mut y2, diff.max(0), h);
    } else {
        let diff = ((y2 - y1) as f64 * ratio_target) as i64 - (x2 - x1);
        grow(&mut x1, &mut x2, diff.max(0), w);
    }
    (x1 as usize, y1 as usize, x2 as usize, y2 as usize)
}

/// Resample every channel of a one-image HWC buffer.
fn resize_hwc(data: &[f32], w: usize, h: usize, c: usize, ow: usize, oh: usize, method: Method) -> Vec<f32> {
    let mut out = vec![0f32; ow * oh * c];
    for k in 0..c {
        let plane: Vec<f32> = (0..w * h).map(|p| data[p * c + k]).collect();
        for (p, v) in resize_plane(&plane, w, h, ow, oh, method).into_iter().enumerate() {
            out[p * c + k] = v;
        }
    }
    out
}

/// The detail pass's settings, read and checked once.
struct Settings {
    seed: u64,
    sigmas: Vec<f32>,
    cfg: f32,
    sampler: SamplerChoice,
    rng: Option<sdflow_core::sampling::RngKind>,
    /// As given: 0 stands for the image's side.
    inpaint: (usize, usize),
    padding: usize,
    blur: u32,
}

/// "DetailerForEachMask" (after Impact Pack's DetailerForEach): ADetailer's crop,
/// re-sample and paste back for each mask of a batch. See the module docs.
struct DetailerForEachMask {
    rt: Arc<Runtime>,
}

impl DetailerForEachMask {
    fn settings(inputs: &Inputs) -> Result<Settings, NodeError> {
        let int = |n: &str, min: i64| -> Result<usize, NodeError> {
            let v = inputs.int(n)?;
            if v < min {
                return Err(NodeError::msg(format!("{n} {v} must be at least {min}")));
            }
            Ok(v as usize)
        };
        let (iw, ih) = (int("inpaint_width", 0)?, int("inpaint_height", 0)?);
        let steps = int("steps", 1)?;
        let denoise = inputs.float("denoising_strength")? as f32;
        if !(0.0..=1.0).contains(&denoise) {
            return Err(NodeError::msg(format!("denoising_strength {denoise} is outside 0..=1")));
        }
        let blur = int("mask_blur", 0)?;
        let scheduler = Scheduler::from_str(inputs.string("scheduler")?).map_err(err)?;
        let schedule = &inputs.downcast::<ModelRef>("model")?.schedule;
        let sigmas = apply_denoise(scheduler, steps, denoise, schedule, &ScheduleOpts::default()).map_err(err)?;
        Ok(Settings {
            seed: inputs.uint("seed")?,
            sigmas,
            cfg: inputs.float("cfg")? as f32,
            // A SAMPLER input (KSamplerSelectAdvanced: sd-cli's --eta) overrides sampler_name.
            sampler: if inputs.contains("sampler") { inputs.downcast::<SamplerChoice>("sampler")?.clone() } else { sampler_from(inputs)? },
            rng: rng_from(inputs)?,
            inpaint: (iw, ih),
            padding: int("inpaint_padding", 0)?,
            blur: u32::try_from(blur).map_err(|_| NodeError::msg(format!("mask_blur {blur} is too large")))?,
        })
    }
}

impl Node for DetailerForEachMask {
    fn schema(&self) -> NodeSchema {
        let side = |n: &str| InputSpec::int(n, 512).int_range(0, 4096).int_step(8);
        NodeSchema::new("DetailerForEachMask")
            .display_name("Detailer (for each mask)")
            .category("ImpactPack/Detailer")
            .description("ADetailer's detail step: for each mask, crops its padded box, inpaints it at inpaint_width x inpaint_height with the mask's own prompt ([SEP], [PROMPT], [SKIP]) and seed + index, and pastes it back feathered by mask_blur.")
            .input(InputSpec::link("image", IoType::IMAGE).tooltip("One image to repair."))
            .input(InputSpec::link("masks", IoType::MASK).tooltip("One mask per region, processed in order (BboxDetectorMasks)."))
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::link("vae", IoType::VAE))
            .input(InputSpec::string("prompt", "").multiline().tooltip("The main prompt, what [PROMPT] and empty parts stand for."))
            .input(InputSpec::string("negative_prompt", "").multiline())
            .input(InputSpec::string("ad_prompt", "").multiline().tooltip("Per-mask prompts split by [SEP] (the last repeats); [SKIP] skips that mask; empty uses the main prompt."))
            .input(InputSpec::string("ad_negative_prompt", "").multiline().tooltip("As ad_prompt, against negative_prompt."))
            .input(InputSpec::seed("seed").tooltip("Mask i uses seed + i."))
            .input(InputSpec::int("steps", 20).int_range(1, 10000))
            .input(InputSpec::float("cfg", 7.0).float_range(0.0, 100.0).float_step(0.1))
            .input(InputSpec::combo("sampler_name", sampler_names()))
            .input(InputSpec::combo("scheduler", scheduler_names()))
            .input(InputSpec::float("denoising_strength", 0.4).float_range(0.0, 1.0).float_step(0.01))
            .input(side("inpaint_width").tooltip("Width the crop is re-sampled at (aligned down to 8); 0: the image's width, as sd-cli's adetailer mode."))
            .input(side("inpaint_height"))
            .input(InputSpec::int("inpaint_padding", 32).int_range(0, 4096).tooltip("Pixels of context around the mask's box."))
            .input(InputSpec::int("mask_blur", 4).int_range(0, 256).tooltip("Feather radius of the paste-back."))
            .input(InputSpec::link("sampler", IoType::SAMPLER).optional().tooltip("A sampler with its options (KSamplerSelectAdvanced, SamplerEulerAncestral, ...), used instead of sampler_name."))
            .input(rng_input())
            .output("IMAGE", IoType::IMAGE)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let masks = inputs.downcast::<Mask>("masks")?;
        let model = inputs.downcast::<ModelRef>("model")?;
        let clip = inputs.downcast::<ClipRef>("clip")?;
        let vae = inputs.downcast::<VaeRef>("vae")?;
        let s = Self::settings(inputs)?;
        if img.n != 1 || img.channels != 3 {
            return Err(NodeError::msg(format!("DetailerForEachMask takes one RGB image, got {} of {} channels", img.n, img.channels)));
        }
        let (w, h) = (img.width, img.height);
        if masks.width != w || masks.height != h || masks.n == 0 || masks.data.len() != masks.n * w * h {
            return Err(NodeError::msg(format!("masks are {}x{}x{}; the image is {w}x{h} and needs one or more masks of its size", masks.n, masks.width, masks.height)));
        }
        let (main, main_neg) = (inputs.string("prompt")?, inputs.string("negative_prompt")?);
        let (ad, ad_neg) = (inputs.string("ad_prompt")?, inputs.string("ad_negative_prompt")?);
        let mut encoded: HashMap<String, CondList> = HashMap::new();
        let mut encode = |text: &str| -> Result<CondList, NodeError> {
            if let Some(c) = encoded.get(text) {
                return Ok(c.clone());
            }
            let c = encode_text(&self.rt, clip, text)?;
            encoded.insert(text.to_string(), c.clone());
            Ok(c)
        };
        // The VAE works in blocks of 8: the crop is resized to an aligned size so the
        // decode covers it exactly.
        let aligned = |v: usize, side: usize| {
            let v = if v == 0 { side } else { v };
            (v / ALIGN * ALIGN).max(ALIGN)
        };
        let (tw, th) = (aligned(s.inpaint.0, w), aligned(s.inpaint.1, h));
        let mut cur = img.data.clone();
        for i in 0..masks.n {
            ctx.check_cancelled()?;
            let Some(positive) = mask_prompt(ad, main, i) else { continue };
            let negative = mask_prompt(ad_neg, main_neg, i).unwrap_or_default();
            let m = &masks.data[i * w * h..(i + 1) * w * h];
            let Some(bbox) = mask_bbox(m, w, h) else { continue };
            let (x1, y1, x2, y2) = crop_region(bbox, s.padding, w, h, tw, th);
            let (cw, ch) = (x2 - x1, y2 - y1);
            let feather = gaussian_blur(m, w, h, s.blur);
            let crop: Vec<f32> = (y1..y2).flat_map(|y| cur[(y * w + x1) * 3..(y * w + x2) * 3].iter().copied()).collect();
            let crop_mask: Vec<f32> = (y1..y2).flat_map(|y| feather[y * w + x1..y * w + x2].iter().copied()).collect();
            let resized = Image { data: resize_hwc(&crop, cw, ch, 3, tw, th, Method::Bicubic).into_iter().map(|v| v.clamp(0.0, 1.0)).collect(), n: 1, height: th, width: tw, channels: 3 };
            let mut latent = encode_image(&self.rt, ctx, vae, &resized, &self.rt.vae_tiling)?;
            latent.noise_mask = Some(Arc::new(Mask { data: crop_mask.clone(), n: 1, height: ch, width: cw }));
            let guider = Guider { model: model.clone(), positive: encode(&positive)?, negative: Some(encode(&negative)?), cfg: s.cfg, dual: None };
            let (out, _) = sample_latent(&self.rt, ctx, &guider, &s.sampler, &s.sigmas, NoiseSource::new(s.seed.wrapping_add(i as u64), true, s.rng), &latent)?;
            let decoded = decode_latent(&self.rt, ctx, &out, vae, &self.rt.vae_tiling)?;
            let back = resize_hwc(&decoded.data, decoded.width, decoded.height, 3, cw, ch, Method::Bicubic);
            for y in 0..ch {
                for x in 0..cw {
                    let a = crop_mask[y * cw + x];
                    if a <= 0.0 {
                        continue;
                    }
                    let p = ((y1 + y) * w + x1 + x) * 3;
                    for k in 0..3 {
                        cur[p + k] = cur[p + k] * (1.0 - a) + back[(y * cw + x) * 3 + k].clamp(0.0, 1.0) * a;
                    }
                }
            }
        }
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, Image { data: cur, n: 1, height: h, width: w, channels: 3 })]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_split_repeat_and_skip() {
        let ad = "[PROMPT], face [SEP] [SKIP] [SEP] hands";
        assert_eq!(mask_prompt(ad, "a photo", 0).as_deref(), Some("a photo, face"));
        assert_eq!(mask_prompt(ad, "a photo", 1), None);
        assert_eq!(mask_prompt(ad, "a photo", 2).as_deref(), Some("hands"));
        assert_eq!(mask_prompt(ad, "a photo", 7).as_deref(), Some("hands"), "the last part repeats");
        assert_eq!(mask_prompt("", "a photo", 3).as_deref(), Some("a photo"), "empty inherits the main prompt");
    }

    #[test]
    fn bbox_of_nonzero_pixels() {
        let mut m = vec![0f32; 10 * 6];
        assert_eq!(mask_bbox(&m, 10, 6), None);
        m[2 * 10 + 3] = 1.0;
        m[4 * 10 + 7] = 0.5;
        assert_eq!(mask_bbox(&m, 10, 6), Some((3, 2, 8, 5)));
    }

    #[test]
    fn crop_region_pads_then_matches_the_aspect() {
        // A 20x10 box padded by 5 is 30x20; a square target grows it to 30x30.
        assert_eq!(crop_region((40, 40, 60, 50), 5, 200, 200, 512, 512), (35, 30, 65, 60));
        // Against the top edge the growth slides down instead of leaving the image.
        assert_eq!(crop_region((40, 0, 60, 10), 5, 200, 200, 512, 512), (35, 0, 65, 30));
        // Larger than the image: clipped to it.
        assert_eq!(crop_region((0, 0, 100, 20), 0, 100, 50, 512, 512), (0, 0, 100, 50));
    }
}
