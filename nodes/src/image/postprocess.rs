//! ComfyUI's pixel-level image nodes: ImageBlend, ImageBlur and ImageSharpen
//! (`comfy_extras/nodes_post_processing.py`); ImageBatch (`nodes.py`); RepeatImageBatch,
//! ImageFlip, ImageRotate and ImageAddNoise (`nodes_images.py`); ImageColorToMask
//! (`nodes_mask.py`); PorterDuffImageComposite and SplitImageWithAlpha
//! (`nodes_compositing.py`).
//!
//! Arithmetic is in f32 in ComfyUI's order (its tensors are float32, Python scalars cast to
//! them), resizes are `common_upscale`'s with its centre crop, and the filters convolve over
//! the reflect-padded image as ComfyUI's `F.pad(..., 'reflect')` then `conv2d` do.

use crate::image::latent_ops::{choice, flip_plane, invalid, quarter_turns, rot90_plane, upscale_nchw, Dims};
use crate::image::resize::Method;
use crate::image::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE};
use crate::values::{Image, Mask};
use sdflow_core::sampling::RngKind;
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    use ImageNode::*;
    for n in [Blend, Blur, Sharpen, Batch, RepeatBatch, Flip, Rotate, AddNoise, ColorToMask, PorterDuff, SplitAlpha] {
        registry.register(Arc::new(n));
    }
}

/// The IMAGE input `name`, its data checked against its size.
fn image<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Image, NodeError> {
    let img = inputs.downcast::<Image>(name)?;
    if img.n == 0 || img.width == 0 || img.height == 0 || img.channels == 0 || img.data.len() != img.n * img.height * img.width * img.channels {
        return Err(invalid(name, format!("{} values are not a {}x{} image of {} channels, batch {}", img.data.len(), img.width, img.height, img.channels, img.n)));
    }
    Ok(img)
}

fn mask<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Mask, NodeError> {
    let m = inputs.downcast::<Mask>(name)?;
    if m.n == 0 || m.width == 0 || m.height == 0 || m.data.len() != m.n * m.height * m.width {
        return Err(invalid(name, format!("{} values are not a {}x{} mask, batch {}", m.data.len(), m.width, m.height, m.n)));
    }
    Ok(m)
}

fn check_size(input: &str, w: usize, h: usize, n: usize) -> Result<(), NodeError> {
    let side = MAX_IMAGE_SIDE as usize;
    if w > side || h > side || (w as u128) * (h as u128) * (n as u128) > (MAX_IMAGE_PIXELS * 16) as u128 {
        return Err(invalid(input, format!("the result would be {w}x{h} (batch {n}), beyond the image limits")));
    }
    Ok(())
}

fn dims(img: &Image) -> Dims {
    Dims { n: img.n, c: img.channels, h: img.height, w: img.width }
}

/// NHWC to NCHW (torch's `movedim(-1, 1)`).
fn to_nchw(img: &Image) -> Vec<f32> {
    let (hw, c) = (img.height * img.width, img.channels);
    let mut out = vec![0f32; img.data.len()];
    for n in 0..img.n {
        for p in 0..hw {
            for k in 0..c {
                out[(n * c + k) * hw + p] = img.data[(n * hw + p) * c + k];
            }
        }
    }
    out
}

fn from_nchw(data: &[f32], d: Dims) -> Image {
    let hw = d.h * d.w;
    let mut out = vec![0f32; data.len()];
    for n in 0..d.n {
        for k in 0..d.c {
            for p in 0..hw {
                out[(n * hw + p) * d.c + k] = data[(n * d.c + k) * hw + p];
            }
        }
    }
    Image { data: out, n: d.n, height: d.h, width: d.w, channels: d.c }
}

/// `common_upscale(image.movedim(-1, 1), w, h, method, "center")` back in NHWC.
fn upscale(img: &Image, w: usize, h: usize, method: Method, input: &str) -> Result<Image, NodeError> {
    let d = dims(img);
    let data = upscale_nchw(&to_nchw(img), d, w, h, method, true).map_err(|m| invalid(input, m))?;
    Ok(from_nchw(&data, Dims { w, h, ..d }))
}

/// Every (sample, channel) plane through `f`, which returns the plane and its width and height.
fn per_plane(img: &Image, f: impl Fn(&[f32]) -> (Vec<f32>, usize, usize)) -> Image {
    let d = dims(img);
    let mut size = (d.w, d.h);
    let mut data = Vec::with_capacity(img.data.len());
    for p in to_nchw(img).chunks(d.w * d.h) {
        let (plane, w, h) = f(p);
        data.extend(plane);
        size = (w, h);
    }
    from_nchw(&data, Dims { w: size.0, h: size.1, ..d })
}

/// torch's float32 `linspace(-1, 1, k)`: the first half counted up from the start, the
/// rest down from the end.
fn linspace(k: usize) -> Vec<f32> {
    if k == 1 {
        return vec![-1.0];
    }
    let step = 2.0f32 / (k - 1) as f32;
    (0..k).map(|i| if i < k / 2 { -1.0 + step * i as f32 } else { 1.0 - step * (k - 1 - i) as f32 }).collect()
}

/// nodes_post_processing's `gaussian_kernel`: exp(−d²/2σ²) over a `k`×`k` grid spanning
/// −1..1 (not pixels), normalised to sum 1.
pub(crate) fn gaussian_kernel(k: usize, sigma: f64) -> Vec<f32> {
    let lin = linspace(k);
    let denom = (2.0 * sigma * sigma) as f32;
    let g: Vec<f32> = (0..k * k)
        .map(|i| {
            let (x, y) = (lin[i / k], lin[i % k]);
            let d = (x * x + y * y).sqrt();
            (-(d * d) / denom).exp()
        })
        .collect();
    let total: f32 = g.iter().sum();
    g.iter().map(|v| v / total).collect()
}

/// The depthwise convolution of each channel with `kernel` (2r+1 square) over the image
/// reflect-padded by r, as ComfyUI's Blur and Sharpen compute it.
fn convolve_reflect(img: &Image, kernel: &[f32], r: usize) -> Image {
    let (w, h, c) = (img.width as isize, img.height as isize, img.channels);
    let k = 2 * r + 1;
    let reflect = |i: isize, n: isize| if i < 0 { -i } else if i >= n { 2 * (n - 1) - i } else { i };
    let mut out = vec![0f32; img.data.len()];
    for n in 0..img.n {
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    let mut acc = 0f32;
                    for i in 0..k {
                        let sy = reflect(y + i as isize - r as isize, h);
                        for j in 0..k {
                            let sx = reflect(x + j as isize - r as isize, w);
                            acc += kernel[i * k + j] * img.data[((n as isize * h + sy) * w + sx) as usize * c + ch];
                        }
                    }
                    out[((n as isize * h + y) * w + x) as usize * c + ch] = acc;
                }
            }
        }
    }
    Image { data: out, ..img.clone() }
}

/// A filter radius: 0 leaves the image as it is (ComfyUI returns it unchanged); reflect
/// padding needs it below both sides.
fn radius(inputs: &Inputs, name: &str, img: &Image) -> Result<usize, NodeError> {
    let r = inputs.int(name)?;
    let r = usize::try_from(r).map_err(|_| invalid(name, format!("must be >= 0, got {r}")))?;
    if r > 0 && (r >= img.height || r >= img.width) {
        return Err(invalid(name, format!("reflect padding by {r} needs an image larger than {r} pixels a side; this one is {}x{}", img.width, img.height)));
    }
    Ok(r)
}

fn sigma(inputs: &Inputs) -> Result<f64, NodeError> {
    let s = inputs.float("sigma")?;
    if !(s > 0.0 && s.is_finite()) {
        return Err(invalid("sigma", format!("must be positive, got {s}")));
    }
    Ok(s)
}

pub const BLEND_MODES: [&str; 6] = ["normal", "multiply", "screen", "overlay", "soft_light", "difference"];

/// nodes_post_processing's `Blend.blend_mode` for one value pair.
fn blend_mode(mode: &str, a: f32, b: f32) -> f32 {
    match mode {
        "normal" => b,
        "multiply" => a * b,
        "screen" => 1.0 - (1.0 - a) * (1.0 - b),
        "overlay" => {
            if a <= 0.5 {
                2.0 * a * b
            } else {
                1.0 - 2.0 * (1.0 - a) * (1.0 - b)
            }
        }
        "soft_light" => {
            if b <= 0.5 {
                a - (1.0 - 2.0 * b) * a * (1.0 - a)
            } else {
                let g = if a <= 0.25 { ((16.0 * a - 12.0) * a + 4.0) * a } else { a.sqrt() };
                a + (2.0 * b - 1.0) * (g - a)
            }
        }
        _ => a - b,
    }
}

pub const PORTER_DUFF_MODES: [&str; 18] = [
    "ADD", "CLEAR", "DARKEN", "DST", "DST_ATOP", "DST_IN", "DST_OUT", "DST_OVER", "LIGHTEN", "MULTIPLY", "OVERLAY", "SCREEN", "SRC", "SRC_ATOP", "SRC_IN", "SRC_OUT", "SRC_OVER", "XOR",
];

/// nodes_compositing's `porter_duff_composite` at one pixel: colours `s`, `d` and alphas
/// (already `1 − mask`) premultiplied, composited, and brought back; returns the colours
/// and the output alpha.
fn porter_duff(mode: &str, s: &[f32], sa: f32, d: &[f32], da: f32, out: &mut [f32]) -> f32 {
    let alpha = match mode {
        "ADD" => (sa + da).clamp(0.0, 1.0),
        "CLEAR" => 0.0,
        "DARKEN" | "LIGHTEN" | "OVERLAY" | "SCREEN" => sa + da - sa * da,
        "DST" | "SRC_ATOP" => da,
        "DST_ATOP" | "SRC" => sa,
        "DST_IN" | "SRC_IN" | "MULTIPLY" => sa * da,
        "DST_OUT" => (1.0 - sa) * da,
        "DST_OVER" => da + (1.0 - da) * sa,
        "SRC_OUT" => (1.0 - da) * sa,
        "SRC_OVER" => sa + (1.0 - sa) * da,
        _ => (1.0 - da) * sa + (1.0 - sa) * da,
    };
    for (k, o) in out.iter_mut().enumerate() {
        let (si, di) = (s[k] * sa, d[k] * da);
        let v = match mode {
            "ADD" => (si + di).clamp(0.0, 1.0),
            "CLEAR" => 0.0,
            "DARKEN" => (1.0 - da) * si + (1.0 - sa) * di + si.min(di),
            "DST" => di,
            "DST_ATOP" => sa * di + (1.0 - da) * si,
            "DST_IN" => di * sa,
            "DST_OUT" => (1.0 - sa) * di,
            "DST_OVER" => di + (1.0 - da) * si,
            "LIGHTEN" => (1.0 - da) * si + (1.0 - sa) * di + si.max(di),
            "MULTIPLY" => si * di,
            "OVERLAY" => {
                if 2.0 * di < da {
                    2.0 * si * di
                } else {
                    sa * da - 2.0 * (da - si) * (sa - di)
                }
            }
            "SCREEN" => si + di - si * di,
            "SRC" => si,
            "SRC_ATOP" => da * si + (1.0 - sa) * di,
            "SRC_IN" => si * da,
            "SRC_OUT" => (1.0 - da) * si,
            "SRC_OVER" => si + (1.0 - sa) * di,
            _ => (1.0 - da) * si + (1.0 - sa) * di,
        };
        *o = if alpha > 1e-5 { v / alpha } else { 0.0 }.clamp(0.0, 1.0);
    }
    alpha
}

#[derive(Clone, Copy, Debug)]
enum ImageNode {
    Blend,
    Blur,
    Sharpen,
    Batch,
    RepeatBatch,
    Flip,
    Rotate,
    AddNoise,
    ColorToMask,
    PorterDuff,
    SplitAlpha,
}

fn image_out(img: Image) -> Outputs {
    Outputs::new(vec![Value::new(IoType::IMAGE, img)])
}

impl Node for ImageNode {
    fn schema(&self) -> NodeSchema {
        let img = |name: &str| InputSpec::link(name, IoType::IMAGE);
        let s = match self {
            ImageNode::Blend => NodeSchema::new("ImageBlend")
                .display_name("Image Blend")
                .category("image/postprocessing")
                .input(img("image1"))
                .input(img("image2"))
                .input(InputSpec::float("blend_factor", 0.5).float_range(0.0, 1.0).float_step(0.01))
                .input(InputSpec::combo("blend_mode", BLEND_MODES)),
            ImageNode::Blur => NodeSchema::new("ImageBlur")
                .display_name("Image Blur")
                .category("image/postprocessing")
                .input(img("image"))
                .input(InputSpec::int("blur_radius", 1).int_range(1, 31).int_step(1))
                .input(InputSpec::float("sigma", 1.0).float_range(0.1, 10.0).float_step(0.1)),
            ImageNode::Sharpen => NodeSchema::new("ImageSharpen")
                .display_name("Image Sharpen")
                .category("image/postprocessing")
                .input(img("image"))
                .input(InputSpec::int("sharpen_radius", 1).int_range(1, 31).int_step(1))
                .input(InputSpec::float("sigma", 1.0).float_range(0.1, 10.0).float_step(0.01))
                .input(InputSpec::float("alpha", 1.0).float_range(0.0, 5.0).float_step(0.01)),
            ImageNode::Batch => NodeSchema::new("ImageBatch").display_name("Batch Images").category("image").input(img("image1")).input(img("image2")),
            ImageNode::RepeatBatch => NodeSchema::new("RepeatImageBatch").category("image/batch").input(img("image")).input(InputSpec::int("amount", 1).int_range(1, 4096)),
            ImageNode::Flip => NodeSchema::new("ImageFlip").category("image/transform").input(img("image")).input(InputSpec::combo("flip_method", ["x-axis: vertically", "y-axis: horizontally"])),
            ImageNode::Rotate => NodeSchema::new("ImageRotate").category("image/transform").input(img("image")).input(InputSpec::combo("rotation", ["none", "90 degrees", "180 degrees", "270 degrees"])),
            ImageNode::AddNoise => NodeSchema::new("ImageAddNoise")
                .category("image")
                .input(img("image"))
                .input(InputSpec::seed("seed").control_after_generate().tooltip("The random seed used for creating the noise."))
                .input(InputSpec::float("strength", 0.5).float_range(0.0, 1.0).float_step(0.01)),
            ImageNode::ColorToMask => {
                return NodeSchema::new("ImageColorToMask")
                    .category("mask")
                    .input(img("image"))
                    .input(InputSpec::int("color", 0).int_range(0, 0xFF_FFFF).int_step(1).extra("display", "color".into()))
                    .output("MASK", IoType::MASK)
            }
            ImageNode::PorterDuff => {
                return NodeSchema::new("PorterDuffImageComposite")
                    .display_name("Porter-Duff Image Composite")
                    .category("mask/compositing")
                    .input(img("source"))
                    .input(InputSpec::link("source_alpha", IoType::MASK))
                    .input(img("destination"))
                    .input(InputSpec::link("destination_alpha", IoType::MASK))
                    .input(InputSpec::combo("mode", PORTER_DUFF_MODES).combo_default("DST"))
                    .output("IMAGE", IoType::IMAGE)
                    .output("MASK", IoType::MASK)
            }
            ImageNode::SplitAlpha => {
                return NodeSchema::new("SplitImageWithAlpha").display_name("Split Image with Alpha").category("mask/compositing").input(img("image")).output("IMAGE", IoType::IMAGE).output("MASK", IoType::MASK)
            }
        };
        s.output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        match self {
            ImageNode::Blend => {
                let (a, b) = (image(inputs, "image1")?, image(inputs, "image2")?);
                let factor = inputs.float("blend_factor")?;
                let mode = choice(inputs, "blend_mode", &BLEND_MODES)?;
                // node_helpers.image_alpha_fix: the second image loses channels the first
                // lacks; a first with more gets one opaque channel more (its own quirk),
                // after which only a one-channel second image still broadcasts.
                let mut a = a.clone();
                let b = if a.channels < b.channels {
                    let data = b.data.chunks(b.channels).flat_map(|p| p[..a.channels].iter().copied()).collect();
                    Image { data, channels: a.channels, ..b.clone() }
                } else {
                    if a.channels > b.channels {
                        a = Image { data: a.data.chunks(a.channels).flat_map(|p| p.iter().copied().chain([1.0])).collect(), channels: a.channels + 1, ..a };
                    }
                    b.clone()
                };
                if b.channels != a.channels && b.channels != 1 {
                    return Err(invalid("image2", format!("{} channels do not blend with image1's {} (ComfyUI's alpha fix pads image1)", b.channels, a.channels)));
                }
                let b = if (a.n, a.height, a.width, a.channels) != (b.n, b.height, b.width, b.channels) { upscale(&b, a.width, a.height, Method::Bicubic, "image2")? } else { b };
                if b.n != a.n && b.n != 1 {
                    return Err(invalid("image2", format!("a batch of {} does not blend with image1's {}", b.n, a.n)));
                }
                let (f, rest) = (factor as f32, (1.0 - factor) as f32);
                let c = a.channels;
                let per = a.height * a.width;
                let mut data = a.data.clone();
                for n in 0..a.n {
                    for p in 0..per {
                        for k in 0..c {
                            let o = (n * per + p) * c + k;
                            let bv = b.data[(n.min(b.n - 1) * per + p) * b.channels + k.min(b.channels - 1)];
                            data[o] = (a.data[o] * rest + blend_mode(mode, a.data[o], bv) * f).clamp(0.0, 1.0);
                        }
                    }
                }
                Ok(image_out(Image { data, ..a }))
            }
            ImageNode::Blur => {
                let img = image(inputs, "image")?;
                let r = radius(inputs, "blur_radius", img)?;
                let s = sigma(inputs)?;
                if r == 0 {
                    return Ok(Outputs::new(vec![inputs.value("image")?.clone()]));
                }
                Ok(image_out(convolve_reflect(img, &gaussian_kernel(2 * r + 1, s), r)))
            }
            ImageNode::Sharpen => {
                let img = image(inputs, "image")?;
                let r = radius(inputs, "sharpen_radius", img)?;
                let (s, alpha) = (sigma(inputs)?, inputs.float("alpha")?);
                if r == 0 {
                    return Ok(Outputs::new(vec![inputs.value("image")?.clone()]));
                }
                let k = 2 * r + 1;
                let scale = -(alpha * 10.0) as f32;
                let mut kernel: Vec<f32> = gaussian_kernel(k, s).iter().map(|v| v * scale).collect();
                let total: f32 = kernel.iter().sum();
                kernel[r * k + r] = kernel[r * k + r] - total + 1.0;
                let mut out = convolve_reflect(img, &kernel, r);
                out.data.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
                Ok(image_out(out))
            }
            ImageNode::Batch => {
                let (a, b) = (image(inputs, "image1")?, image(inputs, "image2")?);
                if b.channels != a.channels {
                    return Err(invalid("image2", format!("{} channels do not batch with image1's {}", b.channels, a.channels)));
                }
                let b = if (b.height, b.width) != (a.height, a.width) { upscale(b, a.width, a.height, Method::Bilinear, "image2")? } else { b.clone() };
                check_size("image2", a.width, a.height, a.n + b.n)?;
                Ok(image_out(Image { data: [&a.data[..], &b.data[..]].concat(), n: a.n + b.n, ..a.clone() }))
            }
            ImageNode::RepeatBatch => {
                let img = image(inputs, "image")?;
                let amount = inputs.int("amount")?;
                let amount = usize::try_from(amount).ok().filter(|&a| a >= 1).ok_or_else(|| invalid("amount", format!("must be at least 1, got {amount}")))?;
                let n = img.n.checked_mul(amount).ok_or_else(|| invalid("amount", "too many copies"))?;
                check_size("amount", img.width, img.height, n)?;
                Ok(image_out(Image { data: img.data.repeat(amount), n, ..img.clone() }))
            }
            ImageNode::Flip => {
                let img = image(inputs, "image")?;
                let vertical = choice(inputs, "flip_method", &["x-axis: vertically", "y-axis: horizontally"])?.starts_with('x');
                Ok(image_out(per_plane(img, |p| (flip_plane(p, img.width, img.height, vertical), img.width, img.height))))
            }
            ImageNode::Rotate => {
                let img = image(inputs, "image")?;
                let k = quarter_turns(choice(inputs, "rotation", &["none", "90 degrees", "180 degrees", "270 degrees"])?);
                Ok(image_out(per_plane(img, |p| rot90_plane(p, img.width, img.height, k))))
            }
            ImageNode::AddNoise => {
                let img = image(inputs, "image")?;
                let strength = inputs.float("strength")? as f32;
                // torch.manual_seed(seed) and a CPU randn of the image's size.
                let noise = RngKind::Cpu.seeded(inputs.uint("seed")?).randn(img.data.len());
                let data = img.data.iter().zip(&noise).map(|(v, n)| (v + strength * n).clamp(0.0, 1.0)).collect();
                Ok(image_out(Image { data, ..img.clone() }))
            }
            ImageNode::ColorToMask => {
                let img = image(inputs, "image")?;
                if img.channels < 3 {
                    return Err(invalid("image", format!("needs red, green and blue channels; it has {}", img.channels)));
                }
                let color = inputs.int("color")?;
                let byte = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round_ties_even() as i64;
                let data = img.data.chunks(img.channels).map(|p| if (byte(p[0]) << 16) + (byte(p[1]) << 8) + byte(p[2]) == color { 1.0 } else { 0.0 }).collect();
                Ok(Outputs::new(vec![Value::new(IoType::MASK, Mask { data, n: img.n, height: img.height, width: img.width })]))
            }
            ImageNode::PorterDuff => {
                let (src, dst) = (image(inputs, "source")?, image(inputs, "destination")?);
                let (sa, da) = (mask(inputs, "source_alpha")?, mask(inputs, "destination_alpha")?);
                let mode = choice(inputs, "mode", &PORTER_DUFF_MODES)?;
                if src.channels != dst.channels {
                    return Err(invalid("source", format!("{} channels against the destination's {}", src.channels, dst.channels)));
                }
                let n = src.n.min(dst.n).min(sa.n).min(da.n);
                let (w, h, c) = (dst.width, dst.height, dst.channels);
                let sample = |img: &Image, i: usize| Image { data: img.data[i * img.height * img.width * img.channels..(i + 1) * img.height * img.width * img.channels].to_vec(), n: 1, ..img.clone() };
                let plane = |m: &Mask, i: usize| Image { data: m.data[i * m.height * m.width..(i + 1) * m.height * m.width].to_vec(), n: 1, height: m.height, width: m.width, channels: 1 };
                let (mut images, mut alphas) = (Vec::with_capacity(n * w * h * c), Vec::with_capacity(n * w * h));
                for i in 0..n {
                    let d_img = sample(dst, i);
                    let mut d_alpha = plane(da, i);
                    if (d_alpha.height, d_alpha.width) != (h, w) {
                        d_alpha = upscale(&d_alpha, w, h, Method::Bicubic, "destination_alpha")?;
                    }
                    let mut s_img = sample(src, i);
                    if (s_img.height, s_img.width) != (h, w) {
                        s_img = upscale(&s_img, w, h, Method::Bicubic, "source")?;
                    }
                    let mut s_alpha = plane(sa, i);
                    if (s_alpha.height, s_alpha.width) != (d_alpha.height, d_alpha.width) {
                        s_alpha = upscale(&s_alpha, d_alpha.width, d_alpha.height, Method::Bicubic, "source_alpha")?;
                    }
                    let mut px = vec![0f32; c];
                    for p in 0..w * h {
                        let out_alpha = porter_duff(mode, &s_img.data[p * c..(p + 1) * c], 1.0 - s_alpha.data[p], &d_img.data[p * c..(p + 1) * c], 1.0 - d_alpha.data[p], &mut px);
                        images.extend_from_slice(&px);
                        alphas.push(1.0 - out_alpha);
                    }
                }
                Ok(Outputs::new(vec![Value::new(IoType::IMAGE, Image { data: images, n, height: h, width: w, channels: c }), Value::new(IoType::MASK, Mask { data: alphas, n, height: h, width: w })]))
            }
            ImageNode::SplitAlpha => {
                let img = image(inputs, "image")?;
                let keep = img.channels.min(3);
                let data = img.data.chunks(img.channels).flat_map(|p| p[..keep].iter().copied()).collect();
                let alpha = img.data.chunks(img.channels).map(|p| 1.0 - if img.channels > 3 { p[3] } else { 1.0 }).collect();
                Ok(Outputs::new(vec![
                    Value::new(IoType::IMAGE, Image { data, channels: keep, ..img.clone() }),
                    Value::new(IoType::MASK, Mask { data: alpha, n: img.n, height: img.height, width: img.width }),
                ]))
            }
        }
    }
}
