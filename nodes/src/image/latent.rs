//! Latent images.

use crate::runtime::Runtime;
use crate::image::resize::{center_crop, resize_plane, Method};
use crate::values::{Latent, Mask};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, _rt: &Arc<Runtime>) {
    registry.register(Arc::new(EMPTY_LATENT_IMAGE));
    registry.register(Arc::new(EMPTY_SD3_LATENT_IMAGE));
    registry.register(Arc::new(EMPTY_FLUX2_LATENT_IMAGE));
    registry.register(Arc::new(EmptyQwenImageLayeredLatentImage));
    registry.register(Arc::new(EmptyHunyuanLatentVideo));
    registry.register(Arc::new(TrimVideoLatent));
    registry.register(Arc::new(LatentCutToBatch));
    registry.register(Arc::new(SetLatentNoiseMask));
    registry.register(Arc::new(LatentUpscale { by: false }));
    registry.register(Arc::new(LatentUpscale { by: true }));
}

/// The largest latent batch a node will allocate; past it a clear error beats an
/// out-of-memory abort.
pub const MAX_LATENT_BYTES: u64 = 4 << 30;

/// A latent of `shape` after checking it fits [`MAX_LATENT_BYTES`].
pub fn latent_zeros(shape: [i64; 4]) -> Result<Latent, NodeError> {
    let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d).ok()?));
    match n.and_then(|n| n.checked_mul(4)) {
        Some(bytes) if bytes <= MAX_LATENT_BYTES && bytes > 0 => Ok(Latent::new(vec![0.0; bytes as usize / 4], shape)),
        _ => Err(NodeError::msg(format!("a latent of {shape:?} is larger than the {} GiB limit", MAX_LATENT_BYTES >> 30))),
    }
}

/// ComfyUI's "Empty Latent Image" (4 channels: the SD families) and
/// "EmptySD3LatentImage" (16: SD3 and FLUX): zeros at 1/8 of the image size.
struct EmptyLatent {
    name: &'static str,
    display: &'static str,
    channels: i64,
    /// Default width and height, and their step.
    size: i64,
    step: i64,
    /// Image pixels per latent pixel.
    downscale: i64,
}

const EMPTY_LATENT_IMAGE: EmptyLatent = EmptyLatent { name: "EmptyLatentImage", display: "Empty Latent Image", channels: 4, size: 512, step: 8, downscale: 8 };
const EMPTY_SD3_LATENT_IMAGE: EmptyLatent = EmptyLatent { name: "EmptySD3LatentImage", display: "EmptySD3LatentImage", channels: 16, size: 1024, step: 16, downscale: 8 };
/// FLUX.2's: the 32-channel VAE latent's 2×2 patches, 128 channels at 1/16.
const EMPTY_FLUX2_LATENT_IMAGE: EmptyLatent = EmptyLatent { name: "EmptyFlux2LatentImage", display: "Empty Flux 2 Latent", channels: 128, size: 1024, step: 16, downscale: 16 };

impl Node for EmptyLatent {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new(self.name)
            .display_name(self.display)
            .category(match self.channels {
                4 | 128 => "latent",
                _ => "latent/sd3",
            })
            .input(InputSpec::int("width", self.size).int_range(16, 16384).int_step(self.step.into()))
            .input(InputSpec::int("height", self.size).int_range(16, 16384).int_step(self.step.into()))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("batch_size")?);
        if w < 16 || h < 16 || n < 1 {
            return Err(NodeError::msg(format!("{w}x{h} × {n} is not a valid latent size")));
        }
        let f = self.downscale;
        if w < f || h < f {
            return Err(NodeError::msg(format!("{w}x{h} is smaller than one latent pixel ({f}x{f} image pixels)")));
        }
        let latent = latent_zeros([w / f, h / f, self.channels, n])?;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's "EmptyQwenImageLayeredLatentImage": zeros of Qwen-Image's 16 channels at 1/8
/// of the image size in `layers + 1` frames (the composite and its layers).
struct EmptyQwenImageLayeredLatentImage;

impl Node for EmptyQwenImageLayeredLatentImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("EmptyQwenImageLayeredLatentImage")
            .display_name("Empty Qwen Image Layered Latent")
            .category("latent/qwen")
            .input(InputSpec::int("width", 640).int_range(16, 16384).int_step(16))
            .input(InputSpec::int("height", 640).int_range(16, 16384).int_step(16))
            .input(InputSpec::int("layers", 3).int_range(0, 16384).tooltip("Layers to decompose the image into: the latent has layers + 1 frames."))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, layers, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("layers")?, inputs.int("batch_size")?);
        if w < 16 || h < 16 || n < 1 || !(0..=16384).contains(&layers) {
            return Err(NodeError::msg(format!("{w}x{h} × {n} with {layers} layers is not a valid latent size")));
        }
        let frames = layers as usize + 1;
        let mut latent = latent_zeros([w / 8, h / 8, 16 * frames as i64, n])?;
        latent.frames = frames;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's "EmptyHunyuanLatentVideo" (Wan's empty latent): zeros of 16 channels at 1/8 of
/// the frame size in `(length − 1)/4 + 1` latent frames (the video VAE's 4× temporal
/// compression keeps the first frame alone).
struct EmptyHunyuanLatentVideo;

/// The latent frames of a video of `length` frames under the Wan VAE's 4× temporal
/// compression (the first frame alone, then groups of 4).
pub fn video_latent_frames(length: i64) -> i64 {
    (length - 1) / 4 + 1
}

impl Node for EmptyHunyuanLatentVideo {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("EmptyHunyuanLatentVideo")
            .display_name("EmptyHunyuanLatentVideo")
            .category("latent/video")
            .input(InputSpec::int("width", 848).int_range(16, 16384).int_step(16))
            .input(InputSpec::int("height", 480).int_range(16, 16384).int_step(16))
            .input(InputSpec::int("length", 25).int_range(1, 16384).int_step(4).tooltip("Frames of the video: (length − 1)/4 + 1 latent frames."))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (w, h, length, n) = (inputs.int("width")?, inputs.int("height")?, inputs.int("length")?, inputs.int("batch_size")?);
        if w < 16 || h < 16 || n < 1 || !(1..=16384).contains(&length) {
            return Err(NodeError::msg(format!("{w}x{h} × {length} frames × {n} is not a valid video latent size")));
        }
        let frames = video_latent_frames(length);
        let mut latent = latent_zeros([w / 8, h / 8, 16 * frames, n])?;
        latent.frames = frames as usize;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's "TrimVideoLatent": a video latent without its first `trim_amount` frames
/// (VACE's reference frame); a latent with no frames left is an error.
struct TrimVideoLatent;

impl Node for TrimVideoLatent {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("TrimVideoLatent")
            .display_name("TrimVideoLatent")
            .category("latent/video")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::int("trim_amount", 0).int_range(0, 99999))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let l = inputs.downcast::<Latent>("samples")?;
        let trim = usize::try_from(inputs.int("trim_amount")?).map_err(|_| NodeError::msg("trim_amount must be at least 0"))?;
        if trim == 0 {
            return Ok(Outputs::new(vec![Value::new(IoType::LATENT, l.clone())]));
        }
        let [w, h, _, n] = l.shape.map(|d| d as usize);
        let (c, t) = (l.channels() as usize, l.frames.max(1));
        if trim >= t {
            return Err(NodeError::msg(format!("trim_amount {trim} leaves nothing of a latent of {t} frames")));
        }
        let plane = w * h;
        let keep = t - trim;
        let samples: Vec<f32> = (0..n * c).flat_map(|k| &l.samples[(k * t + trim) * plane..(k * t + t) * plane]).copied().collect();
        // The mask's frames are not tracked per frame here; a noise mask is kept as it is.
        let out = Latent { samples, shape: [w as i64, h as i64, (c * keep) as i64, n as i64], noise_mask: l.noise_mask.clone(), batch_index: l.batch_index.clone(), frames: keep };
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, out)]))
    }
}

/// ComfyUI's "LatentCutToBatch": a latent cut along frames (`t`), columns (`x`) or rows
/// (`y`) into chunks of `slice_size`, the chunks a batch (a remainder that makes no whole
/// chunk is dropped; a latent without frames is returned as it is for `t`). The noise
/// mask stays; batch indices, which no longer match the batch, are dropped.
struct LatentCutToBatch;

impl Node for LatentCutToBatch {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("LatentCutToBatch")
            .display_name("LatentCutToBatch")
            .category("latent/advanced")
            .description("Slice a multi-frame or multi-dimensional latent into uniform chunks and tile them into a batch.")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::combo("dim", ["t", "x", "y"]).tooltip("Dimension along which to slice (t=temporal/time, x=width, y=height)."))
            .input(InputSpec::int("slice_size", 1).int_range(1, 16384).tooltip("Size of each slice chunk along the selected dimension."))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let l = inputs.downcast::<Latent>("samples")?;
        let dim = inputs.string("dim")?;
        let slice = usize::try_from(inputs.int("slice_size")?).ok().filter(|&s| s >= 1).ok_or_else(|| NodeError::msg("slice_size must be at least 1"))?;
        let [w, h, _, n] = l.shape.map(|d| d as usize);
        let (c, t) = (l.channels() as usize, l.frames.max(1));
        let len = match dim {
            "t" => t,
            "x" => w,
            "y" => h,
            other => return Err(NodeError::msg(format!("dim `{other}` is not one of t, x, y"))),
        };
        if dim == "t" && t == 1 {
            return Ok(Outputs::new(vec![Value::new(IoType::LATENT, l.clone())]));
        }
        let slice = slice.min(len);
        let chunks = len / slice;
        // (sample, chunk) → a sample of the chunk's frames, rows or columns.
        let (ow, oh, ot) = match dim {
            "t" => (w, h, slice),
            "x" => (slice, h, t),
            _ => (w, slice, t),
        };
        let mut samples = Vec::with_capacity(n * chunks * c * ot * oh * ow);
        for s in 0..n {
            for k in 0..chunks {
                for ch in 0..c {
                    for f in 0..ot {
                        for y in 0..oh {
                            for x in 0..ow {
                                let (sf, sy, sx) = match dim {
                                    "t" => (k * slice + f, y, x),
                                    "x" => (f, y, k * slice + x),
                                    _ => (f, k * slice + y, x),
                                };
                                samples.push(l.samples[(((s * c + ch) * t + sf) * h + sy) * w + sx]);
                            }
                        }
                    }
                }
            }
        }
        let out = Latent { samples, shape: [ow as i64, oh as i64, (c * ot) as i64, (n * chunks) as i64], noise_mask: l.noise_mask.clone(), batch_index: None, frames: ot };
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, out)]))
    }
}

/// ComfyUI's "Set Latent Noise Mask": sampling changes the latent only where the mask is 1.
struct SetLatentNoiseMask;

impl Node for SetLatentNoiseMask {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SetLatentNoiseMask")
            .display_name("Set Latent Noise Mask")
            .category("latent/inpaint")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::link("mask", IoType::MASK))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut latent = inputs.downcast::<Latent>("samples")?.clone();
        let mask = inputs.downcast::<Mask>("mask")?;
        if mask.data.is_empty() {
            return Err(NodeError::msg("the mask is empty"));
        }
        latent.noise_mask = Some(Arc::new(mask.clone()));
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// Upscale every (sample, channel) plane of a latent to `ow`×`oh`, with an optional
/// centred crop to the target's aspect ratio first.
fn resize_latent(l: &Latent, ow: usize, oh: usize, method: Method, crop: bool) -> Result<Latent, NodeError> {
    let [w, h, c, n] = l.shape;
    let (w, h) = (w as usize, h as usize);
    let shape = [ow as i64, oh as i64, c, n];
    latent_zeros(shape)?; // the size check
    let (x0, y0, cw, ch) = if crop { center_crop(w, h, ow, oh) } else { (0, 0, w, h) };
    let mut samples = Vec::with_capacity(ow * oh * (c * n) as usize);
    for plane in l.samples.chunks(w * h) {
        let src: Vec<f32> = (y0..y0 + ch).flat_map(|y| plane[y * w + x0..y * w + x0 + cw].iter().copied()).collect();
        samples.extend(resize_plane(&src, cw, ch, ow, oh, method));
    }
    Ok(Latent { samples, shape, noise_mask: l.noise_mask.clone(), batch_index: l.batch_index.clone(), frames: l.frames })
}

/// ComfyUI's "Upscale Latent" (to a pixel size) and "Upscale Latent By" (a factor).
struct LatentUpscale {
    by: bool,
}

impl Node for LatentUpscale {
    fn schema(&self) -> NodeSchema {
        let s = NodeSchema::new(if self.by { "LatentUpscaleBy" } else { "LatentUpscale" })
            .display_name(if self.by { "Upscale Latent By" } else { "Upscale Latent" })
            .category("latent")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::combo("upscale_method", Method::LATENT_NAMES));
        let s = if self.by {
            s.input(InputSpec::float("scale_by", 1.5).float_range(0.01, 8.0).float_step(0.01))
        } else {
            s.input(InputSpec::int("width", 512).int_range(0, 16384).int_step(8))
                .input(InputSpec::int("height", 512).int_range(0, 16384).int_step(8))
                .input(InputSpec::combo("crop", ["disabled", "center"]))
        };
        s.output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let l = inputs.downcast::<Latent>("samples")?;
        let method = Method::parse(inputs.string("upscale_method")?).ok_or_else(|| NodeError::msg("unknown upscale_method"))?;
        let (w, h) = (l.shape[0] as f64, l.shape[1] as f64);
        let (ow, oh, crop) = if self.by {
            let s = inputs.float("scale_by")?;
            if !(s > 0.0 && s.is_finite()) {
                return Err(NodeError::msg(format!("scale_by {s} must be positive")));
            }
            ((w * s).round(), (h * s).round(), false)
        } else {
            // 0 keeps the aspect ratio from the other side, as ComfyUI.
            let (pw, ph) = (inputs.int("width")? as f64 / 8.0, inputs.int("height")? as f64 / 8.0);
            let crop = inputs.string("crop")? == "center";
            match (pw > 0.0, ph > 0.0) {
                (false, false) => (w, h, false),
                (true, false) => (pw, (h * pw / w).round(), crop),
                (false, true) => ((w * ph / h).round(), ph, crop),
                (true, true) => (pw, ph, crop),
            }
        };
        let (ow, oh) = ((ow as usize).max(1), (oh as usize).max(1));
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, resize_latent(l, ow, oh, method, crop)?)]))
    }
}
