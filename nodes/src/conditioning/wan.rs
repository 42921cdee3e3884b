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
use crate::values::{ClipRef, ClipVisionOutput, CondList, Image, Latent, Mask, VaeRef};
use sdflow_core::models::conditioning::VaceControl;
use sdflow_core::models::vae::wan::{LATENTS_MEAN, WAN22_LATENTS_MEAN};
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
    registry.register(Arc::new(WanFirstLastFrameToVideo { rt: rt.clone() }));
    registry.register(Arc::new(Wan22ImageToVideoLatent { rt: rt.clone() }));
    registry.register(Arc::new(WanVaceToVideo { rt: rt.clone() }));
}

/// ComfyUI's "WanVaceToVideo" (Wan VACE): the control video (grey 0.5 where no frame is
/// given) split by its mask into the part to keep (`inactive`) and the part to regenerate
/// (`reactive`), each through the VAE, with the mask cut into 8×8 cells per latent pixel and
/// resampled to the latent frames (nearest), appended to both conditionings with the
/// strength; a reference image becomes an extra first latent frame (its latent beside the
/// VAE's zero latent, mask 0), which `trim_latent` says to cut after sampling.
struct WanVaceToVideo {
    rt: Arc<Runtime>,
}

impl Node for WanVaceToVideo {
    fn schema(&self) -> NodeSchema {
        video_conditioning_schema("WanVaceToVideo")
            .input(InputSpec::float("strength", 1.0).float_range(0.0, 1000.0).float_step(0.01))
            .input(InputSpec::link("control_video", IoType::IMAGE).optional())
            .input(InputSpec::link("control_masks", IoType::MASK).optional())
            .input(InputSpec::link("reference_image", IoType::IMAGE).optional())
            .output("positive", IoType::CONDITIONING)
            .output("negative", IoType::CONDITIONING)
            .output("latent", IoType::LATENT)
            .output("trim_latent", IoType::INT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, length, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("length")?, inputs.int("batch_size")?);
        let strength = inputs.float("strength")? as f32;
        if w < 16 || h < 16 || w % 8 != 0 || h % 8 != 0 || n < 1 || !(1..=16384).contains(&length) || !(0.0..=1000.0).contains(&strength) {
            return Err(NodeError::msg(format!("WanVaceToVideo: {w}x{h} × {length} frames × {n} at strength {strength}: width and height must be multiples of 8, strength in 0..=1000")));
        }
        let (wu, hu, len) = (w as usize, h as usize, length as usize);
        let vae = inputs.downcast::<VaeRef>("vae")?;
        let image = |name: &str| inputs.contains(name).then(|| inputs.downcast::<Image>(name)).transpose();
        // The control frames at the video's size, grey after the last one given.
        let mut video = vec![0.5f32; len * hu * wu * 3];
        if let Some(cv) = image("control_video")? {
            let scaled = scale_image(cv, wu, hu, Method::Bilinear, true);
            let c = scaled.channels;
            for (p, px) in video.chunks_exact_mut(3).enumerate().take(scaled.n.min(len) * hu * wu) {
                for (k, v) in px.iter_mut().enumerate() {
                    *v = scaled.data[p * c + k.min(c - 1)];
                }
            }
        }
        // The mask per pixel (1: regenerate), 1 after the last one given.
        let mut mask = vec![1.0f32; len * hu * wu];
        if inputs.contains("control_masks") {
            let m = inputs.downcast::<Mask>("control_masks")?;
            let as_image = Image { data: m.data.clone(), n: m.n, height: m.height, width: m.width, channels: 1 };
            let scaled = scale_image(&as_image, wu, hu, Method::Bilinear, true);
            let given = scaled.n.min(len) * hu * wu;
            mask[..given].copy_from_slice(&scaled.data[..given]);
        }
        let part = |reactive: bool| -> Vec<f32> {
            video.iter().enumerate().map(|(i, &v)| {
                let m = mask[i / 3];
                (v - 0.5) * if reactive { m } else { 1.0 - m } + 0.5
            }).collect()
        };
        let frames_of = |data: Vec<f32>| Image { data, n: len, height: hu, width: wu, channels: 3 };
        let (inactive, t) = encode_video(&self.rt, ctx, vae, &frames_of(part(false)))?;
        let (reactive, _) = encode_video(&self.rt, ctx, vae, &frames_of(part(true)))?;
        let latent_frames = video_latent_frames(length) as usize;
        let (lw, lh) = (wu / 8, hu / 8);
        let plane = lw * lh;
        if t != latent_frames || inactive.len() != 16 * t * plane {
            return Err(NodeError::msg(format!("WanVaceToVideo: the VAE gave {} values for {t} latent frames; a Wan 2.1 VAE (16 channels, 8×) is needed for {latent_frames}", inactive.len())));
        }
        // The reference image's latent (with the VAE's zero latent beside it) leads.
        let reference = match image("reference_image")? {
            Some(r) => {
                let scaled = scale_image(&Image { data: r.data[..r.height * r.width * r.channels].to_vec(), n: 1, ..r.clone() }, wu, hu, Method::Bilinear, true);
                let (lat, _) = encode_video(&self.rt, ctx, vae, &scaled)?;
                let mut frame = lat;
                frame.extend(LATENTS_MEAN.iter().flat_map(|&m| std::iter::repeat_n(m, plane)));
                Some(frame)
            }
            None => None,
        };
        let lead = usize::from(reference.is_some());
        let total = t + lead;
        // [32][T'][plane]: channel by channel, the reference frame first.
        let halves = [&inactive, &reactive];
        let frames: Vec<f32> = (0..32)
            .flat_map(|c| {
                let reference = &reference;
                (0..total).flat_map(move |f| match (f, reference) {
                    (0, Some(r)) => r[c * plane..(c + 1) * plane].to_vec(),
                    _ => halves[c / 16][((c % 16) * t + f - lead) * plane..][..plane].to_vec(),
                })
            })
            .collect();
        // [64][T'][plane]: cell (ky, kx) of latent pixel (y, x) is pixel (8y + ky, 8x + kx),
        // the frames resampled to the latent's (nearest-exact), 0 for the reference frame.
        let cells: Vec<f32> = (0..64)
            .flat_map(|cell| {
                let mask = &mask;
                (0..total).flat_map(move |f| {
                    let src = (f >= lead).then(|| ((((f - lead) as f64 + 0.5) * len as f64 / t as f64) as usize).min(len - 1));
                    (0..plane).map(move |p| match src {
                        None => 0.0,
                        Some(s) => mask[(s * hu + (p / lw) * 8 + cell / 8) * wu + (p % lw) * 8 + cell % 8],
                    })
                })
            })
            .collect();
        let control = Arc::new(VaceControl { frames, mask: cells, length: total, height: lh, width: lw, strength });
        let mut latent = latent_zeros([lw as i64, lh as i64, (16 * total) as i64, n])?;
        latent.frames = total;
        let mut out = Vec::new();
        for name in ["positive", "negative"] {
            let list = inputs.downcast::<CondList>(name)?;
            out.push(Value::new(IoType::CONDITIONING, CondList(list.0.iter().map(|e| {
                let mut c = (*e.cond).clone();
                c.vace.push(control.clone());
                e.with_cond(c)
            }).collect())));
        }
        out.push(Value::new(IoType::LATENT, latent));
        out.push(Value::new(IoType::INT, lead as i64));
        Ok(Outputs::new(out))
    }
}

/// ComfyUI's "Wan22ImageToVideoLatent" (Wan 2.2 TI2V-5B): an empty 48-channel video latent
/// at 1/16 of the size; with a start image, its first latent frames are the image encoded
/// by the Wan 2.2 VAE, the others the VAE's mean latent (zeros to the model), and a noise
/// mask of one plane per frame keeps the given frames (0) while the rest are sampled (1).
/// `end_image` (sdflow's, for sd-cli's `--end-img` with TI2V) is encoded alone into the
/// last latent frame, which is kept too.
struct Wan22ImageToVideoLatent {
    rt: Arc<Runtime>,
}

/// The Wan 2.2 VAE's latent width.
const WAN22_CHANNELS: usize = 48;

impl Node for Wan22ImageToVideoLatent {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("Wan22ImageToVideoLatent")
            .display_name("Wan22ImageToVideoLatent")
            .category("conditioning/inpaint")
            .description("An empty Wan 2.2 (TI2V-5B) video latent, its first frames the start image encoded by the Wan 2.2 VAE and kept while the rest are sampled.")
            .input(InputSpec::link("vae", IoType::VAE))
            .input(InputSpec::int("width", 1280).int_range(32, 16384).int_step(32))
            .input(InputSpec::int("height", 704).int_range(32, 16384).int_step(32))
            .input(InputSpec::int("length", 49).int_range(1, 16384).int_step(4))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .input(InputSpec::link("start_image", IoType::IMAGE).optional())
            .input(InputSpec::link("end_image", IoType::IMAGE).optional().tooltip("sdflow: a last frame to keep (sd-cli's --end-img with TI2V), encoded alone into the last latent frame."))
            .output("LATENT", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, length, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("length")?, inputs.int("batch_size")?);
        if w < 16 || h < 16 || w % 16 != 0 || h % 16 != 0 || n < 1 || !(1..=16384).contains(&length) {
            return Err(NodeError::msg(format!("Wan22ImageToVideoLatent: {w}x{h} × {length} frames × {n}: width and height must be multiples of 16 (the Wan 2.2 VAE's blocks)")));
        }
        let frames = video_latent_frames(length) as usize;
        let (lw, lh) = ((w / 16) as usize, (h / 16) as usize);
        let plane = lw * lh;
        let mut latent = latent_zeros([lw as i64, lh as i64, (WAN22_CHANNELS * frames) as i64, n])?;
        latent.frames = frames;
        let image = |name: &str| inputs.contains(name).then(|| inputs.downcast::<Image>(name)).transpose();
        let (start, end) = (image("start_image")?, image("end_image")?);
        if start.is_none() && end.is_none() {
            return Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]));
        }
        // The first `count` images at the video's size through the Wan 2.2 VAE: [C][T'][plane].
        let encode = |img: &Image, count: usize| -> Result<(Vec<f32>, usize), NodeError> {
            let scaled = scale_image(img, w as usize, h as usize, Method::Bilinear, true);
            let frames = Image { data: scaled.data[..count * scaled.height * scaled.width * scaled.channels].to_vec(), n: count, ..scaled };
            let (encoded, t) = encode_video(&self.rt, ctx, inputs.downcast::<VaeRef>("vae")?, &frames)?;
            if encoded.len() != WAN22_CHANNELS * t * plane {
                return Err(NodeError::msg(format!("Wan22ImageToVideoLatent: the VAE gave {} values for {t} latent frames; the Wan 2.2 VAE (wan2.2_vae.safetensors, {WAN22_CHANNELS} channels) is needed", encoded.len())));
            }
            Ok((encoded, t))
        };
        // Per latent frame: the encoded values to keep (and from which frame of which encoding).
        let mut kept: Vec<Option<(usize, usize)>> = vec![None; frames];
        let mut encodings = Vec::new();
        if let Some(s) = start {
            let (e, t) = encode(s, s.n.min(length as usize))?;
            for (f, k) in kept.iter_mut().enumerate().take(t) {
                *k = Some((encodings.len(), f));
            }
            encodings.push((e, t));
        }
        if let Some(e) = end {
            // sd.cpp's TI2V end frame: the last image alone, as a first frame is encoded.
            let last = Image { data: e.data[(e.n - 1) * e.height * e.width * e.channels..].to_vec(), n: 1, ..e.clone() };
            let (enc, t) = encode(&last, 1)?;
            kept[frames - 1] = Some((encodings.len(), 0));
            encodings.push((enc, t));
        }
        // [C][T][plane]: kept frames encoded, the rest the mean (`process_out(0)`).
        let sample: Vec<f32> = (0..WAN22_CHANNELS)
            .flat_map(|c| (0..frames).map(move |t| (c, t)))
            .flat_map(|(c, t)| match kept[t] {
                Some((k, f)) => {
                    let (enc, count) = &encodings[k];
                    enc[(c * count + f) * plane..][..plane].to_vec()
                }
                None => vec![WAN22_LATENTS_MEAN[c]; plane],
            })
            .collect();
        latent.samples = sample.repeat(n as usize);
        let mask: Vec<f32> = kept.iter().flat_map(|k| std::iter::repeat_n(if k.is_some() { 0.0 } else { 1.0 }, plane)).collect();
        latent.noise_mask = Some(Arc::new(Mask { data: mask.repeat(n as usize), n: frames * n as usize, height: lh, width: lw }));
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
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
        image_to_video_schema("WanImageToVideo", &[("clip_vision_output", IoType::CLIP_VISION_OUTPUT), ("start_image", IoType::IMAGE)])
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, length, latent) = empty_video(inputs)?;
        let mut positive = inputs.downcast::<CondList>("positive")?.clone();
        let mut negative = inputs.downcast::<CondList>("negative")?.clone();
        let start = inputs.contains("start_image").then(|| inputs.downcast::<Image>("start_image")).transpose()?;
        let video_image = match start {
            Some(start) => {
                // Latent frames holding a given frame are known, all four sub-frames
                // alike (ComfyUI's one-channel concat_mask).
                let known_frames = (start.n.min(length as usize) - 1) / 4 + 1;
                Some(video_image(&self.rt, ctx, inputs.downcast::<VaeRef>("vae")?, [w, h, length], Some(start), None, |sub| sub / 4 < known_frames)?)
            }
            None => None,
        };
        let clip = match inputs.contains("clip_vision_output").then(|| inputs.downcast::<ClipVisionOutput>("clip_vision_output")).transpose()? {
            Some(o) => Some(Arc::new(ImageTokens { data: o.penultimate[..o.tokens * o.hidden].to_vec(), width: o.hidden })),
            None => None,
        };
        set_image(&mut positive, &video_image, &clip);
        set_image(&mut negative, &video_image, &clip);
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, positive), Value::new(IoType::CONDITIONING, negative), Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's Wan video-conditioning nodes' shared inputs: the conditionings, the VAE and
/// the video's size.
fn video_conditioning_schema(name: &str) -> NodeSchema {
    NodeSchema::new(name)
        .display_name(name)
        .category("conditioning/video_models")
        .input(InputSpec::link("positive", IoType::CONDITIONING))
        .input(InputSpec::link("negative", IoType::CONDITIONING))
        .input(InputSpec::link("vae", IoType::VAE))
        .input(InputSpec::int("width", 832).int_range(16, 16384).int_step(16))
        .input(InputSpec::int("height", 480).int_range(16, 16384).int_step(16))
        .input(InputSpec::int("length", 81).int_range(1, 16384).int_step(4))
        .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
}

/// The image-to-video nodes' schema: the shared inputs, then the node's own optional
/// images and CLIP-vision states.
fn image_to_video_schema(name: &str, optional: &[(&str, IoType)]) -> NodeSchema {
    let mut s = video_conditioning_schema(name);
    for (input, ty) in optional {
        s = s.input(InputSpec::link(*input, ty.clone()).optional());
    }
    s
        .output("positive", IoType::CONDITIONING)
        .output("negative", IoType::CONDITIONING)
        .output("latent", IoType::LATENT)
}

/// The image-to-video nodes' size inputs (`width`, `height`, `length`, `batch_size`) and
/// the empty video latent they give (16 channels at 1/8, `(length − 1)/4 + 1` frames).
fn empty_video(inputs: &Inputs) -> Result<(i64, i64, i64, Latent), NodeError> {
    let (w, h, length, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("length")?, inputs.int("batch_size")?);
    if w < 16 || h < 16 || n < 1 || !(1..=16384).contains(&length) {
        return Err(NodeError::msg(format!("{w}x{h} × {length} frames × {n} is not a valid video size")));
    }
    let frames = video_latent_frames(length);
    let mut latent = latent_zeros([w / 8, h / 8, 16 * frames, n])?;
    latent.frames = frames as usize;
    Ok((w, h, length, latent))
}

/// `list` with the video's known frames and the image tokens set on every conditioning.
fn set_image(list: &mut CondList, video_image: &Option<Arc<VideoImage>>, clip: &Option<Arc<ImageTokens>>) {
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

/// The known frames of a `length`-frame video of `w`×`h` (`size`) for a Wan I2V model: the
/// start frames first and the end frames last (each scaled to the size, centre-cropped),
/// grey between, encoded by the Wan VAE; `known(sub)` says which of the 4·T latent
/// sub-frames are given (sub-frame 4·t + c is channel c of latent frame t).
fn video_image(rt: &Runtime, ctx: &ExecContext<'_>, vae: &VaeRef, [w, h, length]: [i64; 3], start: Option<&Image>, end: Option<&Image>, known: impl Fn(usize) -> bool) -> Result<Arc<VideoImage>, NodeError> {
    let (w, h, length) = (w as usize, h as usize, length as usize);
    let mut data = vec![0.5f32; length * h * w * 3];
    let mut place = |img: &Image, at_end: bool| {
        let given = img.n.min(length);
        // The end frames are the last `given` of the image batch, at the video's end.
        let first = if at_end { img.n - given } else { 0 };
        let scaled = scale_image(img, w, h, Method::Bilinear, true);
        let c = scaled.channels;
        for f in 0..given {
            let to = if at_end { length - given + f } else { f };
            for p in 0..w * h {
                for k in 0..3 {
                    data[(to * w * h + p) * 3 + k] = scaled.data[((first + f) * w * h + p) * c + k.min(c - 1)];
                }
            }
        }
    };
    if let Some(s) = start {
        place(s, false);
    }
    if let Some(e) = end {
        place(e, true);
    }
    let video = Image { data, n: length, height: h, width: w, channels: 3 };
    let (latent, frames) = encode_video(rt, ctx, vae, &video)?;
    let want = video_latent_frames(length as i64) as usize;
    if frames != want {
        return Err(NodeError::msg(format!("the VAE made {frames} latent frames of {length} video frames; the latent has {want}")));
    }
    let plane = (w / 8) * (h / 8);
    let known: Vec<f32> = (0..4).flat_map(|c| (0..frames).map(move |t| 4 * t + c)).flat_map(|sub| std::iter::repeat_n(if known(sub) { 1.0 } else { 0.0 }, plane)).collect();
    Ok(Arc::new(VideoImage { latent, channels: 16, frames, height: h / 8, width: w / 8, known }))
}

/// ComfyUI's "WanFirstLastFrameToVideo": WanImageToVideo with an end image too (Wan2.1
/// FLF2V): the start frames known through the first latent frame's sub-frames up to the
/// count given (+ 3), the end frames through the last sub-frames; both images' CLIP-vision
/// states, start then end.
struct WanFirstLastFrameToVideo {
    rt: Arc<Runtime>,
}

impl Node for WanFirstLastFrameToVideo {
    fn schema(&self) -> NodeSchema {
        image_to_video_schema(
            "WanFirstLastFrameToVideo",
            &[("clip_vision_start_image", IoType::CLIP_VISION_OUTPUT), ("clip_vision_end_image", IoType::CLIP_VISION_OUTPUT), ("start_image", IoType::IMAGE), ("end_image", IoType::IMAGE)],
        )
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, length, latent) = empty_video(inputs)?;
        let frames = latent.frames;
        let image = |name: &str| inputs.contains(name).then(|| inputs.downcast::<Image>(name)).transpose();
        let (start, end) = (image("start_image")?, image("end_image")?);
        let video_image = if start.is_some() || end.is_some() {
            let subs = 4 * frames;
            let n_start = start.map_or(0, |s| s.n.min(length as usize) + 3);
            let n_end = end.map_or(0, |e| e.n.min(length as usize));
            Some(video_image(&self.rt, ctx, inputs.downcast::<VaeRef>("vae")?, [w, h, length], start, end, |sub| sub < n_start || sub + n_end >= subs)?)
        } else {
            None
        };
        let clip = |name: &str| inputs.contains(name).then(|| inputs.downcast::<ClipVisionOutput>(name)).transpose();
        let tokens = match (clip("clip_vision_start_image")?, clip("clip_vision_end_image")?) {
            (None, None) => None,
            (a, b) => {
                let parts: Vec<&ClipVisionOutput> = [a, b].into_iter().flatten().collect();
                if parts.windows(2).any(|p| p[0].hidden != p[1].hidden) {
                    return Err(NodeError::msg("the start and end images' CLIP-vision states differ in width"));
                }
                let data = parts.iter().flat_map(|o| o.penultimate[..o.tokens * o.hidden].iter().copied()).collect();
                Some(Arc::new(ImageTokens { data, width: parts[0].hidden }))
            }
        };
        let mut positive = inputs.downcast::<CondList>("positive")?.clone();
        let mut negative = inputs.downcast::<CondList>("negative")?.clone();
        set_image(&mut positive, &video_image, &tokens);
        set_image(&mut negative, &video_image, &tokens);
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, positive), Value::new(IoType::CONDITIONING, negative), Value::new(IoType::LATENT, latent)]))
    }
}
