//! ComfyUI's size, batch and layout nodes for images (`comfy_extras/nodes_images.py`,
//! `nodes_post_processing.py`, `nodes_compositing.py`, `nodes_mask.py`): GetImageSize,
//! ImageScaleToTotalPixels, ImageScaleToMaxDimension, ImageStitch, ImageFromBatch,
//! ResizeAndPadImage, JoinImageWithAlpha and MaskPreview.
//!
//! Sizes follow ComfyUI's arithmetic exactly (Python's `round` rounds half to even, `int`
//! truncates), since one pixel more or less changes everything downstream. Resampling is
//! ImageScale's (`scale_image`) except "lanczos": ComfyUI runs that through 8-bit
//! PIL images, whose byte rounding and clipping after each pass move pixels by up to 0.08
//! on small images, so it is reproduced here ([`comfy_lanczos`]) rather than
//! approximated by ImageScale's float Lanczos.

use crate::image::resize::{resize_plane, Method};
use crate::image::{next_counter, scale_image, write_png, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE};
use crate::runtime::Runtime;
use crate::values::{Image, Mask};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use serde_json::json;
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    for n in [Transform::GetImageSize, Transform::TotalPixels, Transform::MaxDimension, Transform::Stitch, Transform::FromBatch, Transform::ResizeAndPad, Transform::JoinAlpha] {
        registry.register(Arc::new(n));
    }
    registry.register(Arc::new(MaskPreview { rt: rt.clone() }));
}

/// ComfyUI's `MAX_RESOLUTION`, the widgets' upper limit (also the largest side here).
const MAX_RESOLUTION: i128 = 16384;

#[derive(Debug, thiserror::Error)]
pub enum ImageOpError {
    #[error("the batch is empty")]
    EmptyBatch,
    #[error("a {w}x{h} image has no pixels")]
    NoPixels { w: usize, h: usize },
    #[error("the result would be {w}x{h}, which has no pixels")]
    EmptyResult { w: usize, h: usize },
    #[error("the result would be {w}x{h} (batch {n}), beyond the limits of {MAX_IMAGE_SIDE} pixels a side and {} in all", MAX_IMAGE_PIXELS * 16)]
    TooLarge { w: usize, h: usize, n: usize },
    #[error("`{value}` is not one of {options}")]
    UnknownOption { value: String, options: String },
}

fn invalid(input: &str) -> impl Fn(ImageOpError) -> NodeError + '_ {
    move |e| NodeError::InvalidInput { input: input.to_string(), message: e.to_string() }
}

/// An input image with at least one sample and one pixel.
fn check_input(img: &Image) -> Result<(), ImageOpError> {
    if img.n == 0 {
        return Err(ImageOpError::EmptyBatch);
    }
    if img.width == 0 || img.height == 0 {
        return Err(ImageOpError::NoPixels { w: img.width, h: img.height });
    }
    Ok(())
}

/// A result size that has pixels and stays inside the image limits.
fn check_output(w: usize, h: usize, n: usize) -> Result<(), ImageOpError> {
    if w == 0 || h == 0 {
        return Err(ImageOpError::EmptyResult { w, h });
    }
    let side = MAX_IMAGE_SIDE as usize;
    if w > side || h > side || (w as u64) * (h as u64) * (n as u64) > MAX_IMAGE_PIXELS * 16 {
        return Err(ImageOpError::TooLarge { w, h, n });
    }
    Ok(())
}

/// PIL's fixed-point precision for 8-bit resampling (`PRECISION_BITS`, Resample.c).
const PRECISION_BITS: u32 = 22;

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// PIL's Lanczos taps along one axis in 8-bit fixed point: for each output index, the
/// first source index and the weights (`precompute_coeffs` and `normalize_coeffs_8bpc`).
fn pil_lanczos_taps(n_in: usize, n_out: usize) -> Vec<(usize, Vec<i64>)> {
    let scale = n_in as f64 / n_out as f64;
    let filterscale = scale.max(1.0);
    let support = 3.0 * filterscale;
    (0..n_out)
        .map(|o| {
            let center = (o as f64 + 0.5) * scale;
            // C's (int) casts: truncation toward zero.
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(n_in as i64).max(lo as i64) as usize;
            let w: Vec<f64> = (lo..hi)
                .map(|i| {
                    let x = (i as f64 - center + 0.5) / filterscale;
                    if (-3.0..3.0).contains(&x) {
                        sinc(x) * sinc(x / 3.0)
                    } else {
                        0.0
                    }
                })
                .collect();
            let total: f64 = w.iter().sum();
            let one = (1i64 << PRECISION_BITS) as f64;
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if total != 0.0 { k / total } else { k };
                    if k < 0.0 { (-0.5 + k * one) as i64 } else { (0.5 + k * one) as i64 }
                })
                .collect();
            (lo, fixed)
        })
        .collect()
}

/// PIL's `clip8`: a fixed-point sum back to a byte.
fn clip8(v: i64) -> u8 {
    if v >= 256 << PRECISION_BITS {
        255
    } else if v <= 0 {
        0
    } else {
        (v >> PRECISION_BITS) as u8
    }
}

/// One 8-bit band resampled along rows (`horizontal`) or columns, as PIL's
/// `ImagingResampleHorizontal_8bpc` / `…Vertical_8bpc`.
fn pil_pass(src: &[u8], w: usize, h: usize, taps: &[(usize, Vec<i64>)], horizontal: bool) -> Vec<u8> {
    let half = 1i64 << (PRECISION_BITS - 1);
    let (ow, oh) = if horizontal { (taps.len(), h) } else { (w, taps.len()) };
    let mut out = vec![0u8; ow * oh];
    for y in 0..oh {
        for x in 0..ow {
            let (lo, k) = &taps[if horizontal { x } else { y }];
            let sum = k.iter().enumerate().fold(half, |s, (j, &kj)| {
                let v = if horizontal { src[y * w + lo + j] } else { src[(lo + j) * w + x] };
                s + v as i64 * kj
            });
            out[y * ow + x] = clip8(sum);
        }
    }
    out
}

/// PIL's `MULDIV255`: `a·b/255` rounded, in integers.
fn muldiv255(a: u8, b: u8) -> u8 {
    let t = a as u32 * b as u32 + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// ComfyUI's "lanczos" (`comfy.utils.lanczos`): every image made 8-bit
/// (`clip(255·x).astype(uint8)`, truncating), resized by PIL's LANCZOS — rows then
/// columns, each pass rounded and clipped to bytes, colour premultiplied by alpha for two-
/// and four-channel images (PIL's LA and RGBA) — and read back as `byte / 255`.
pub fn comfy_lanczos(img: &Image, ow: usize, oh: usize) -> Image {
    let (w, h, c) = (img.width, img.height, img.channels);
    let alpha = (c == 2 || c == 4).then_some(c - 1);
    let (tx, ty) = (pil_lanczos_taps(w, ow), pil_lanczos_taps(h, oh));
    let mut data = vec![0f32; img.n * ow * oh * c];
    for i in 0..img.n {
        let px = |p: usize, k: usize| (255.0f32 * img.data[(i * w * h + p) * c + k]).clamp(0.0, 255.0) as u8;
        let mut bands: Vec<Vec<u8>> = (0..c).map(|k| (0..w * h).map(|p| px(p, k)).collect()).collect();
        let same = (ow, oh) == (w, h);
        if let (Some(a), false) = (alpha, same) {
            let (colour, rest) = bands.split_at_mut(a);
            for band in colour {
                for (v, &al) in band.iter_mut().zip(&rest[0]) {
                    *v = muldiv255(*v, al);
                }
            }
        }
        if !same {
            for band in &mut bands {
                let mut cur = std::mem::take(band);
                let mut cw = w;
                if ow != w {
                    cur = pil_pass(&cur, cw, h, &tx, true);
                    cw = ow;
                }
                if oh != h {
                    cur = pil_pass(&cur, cw, h, &ty, false);
                }
                *band = cur;
            }
        }
        if let (Some(a), false) = (alpha, same) {
            for p in 0..ow * oh {
                let av = bands[a][p] as u32;
                if av != 0 && av != 255 {
                    for band in bands.iter_mut().take(a) {
                        band[p] = ((255 * band[p] as u32) / av).min(255) as u8;
                    }
                }
            }
        }
        for (k, band) in bands.iter().enumerate() {
            for (p, &v) in band.iter().enumerate() {
                data[(i * ow * oh + p) * c + k] = v as f32 / 255.0;
            }
        }
    }
    Image { data, n: img.n, height: oh, width: ow, channels: c }
}

/// ComfyUI's `common_upscale` without cropping: PIL's 8-bit Lanczos for "lanczos"
/// ([`comfy_lanczos`]), ImageScale's torch-equivalent resampling for the rest.
fn comfy_upscale(img: &Image, ow: usize, oh: usize, method: Method) -> Image {
    if method == Method::Lanczos {
        comfy_lanczos(img, ow, oh)
    } else {
        scale_image(img, ow, oh, method, false)
    }
}

fn method(inputs: &Inputs, name: &str, allowed: &[&str]) -> Result<Method, NodeError> {
    let v = inputs.string(name)?;
    allowed.contains(&v).then(|| Method::parse(v)).flatten().ok_or_else(|| invalid(name)(ImageOpError::UnknownOption { value: v.into(), options: allowed.join(", ") }))
}

fn count(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    usize::try_from(v).map_err(|_| NodeError::InvalidInput { input: name.into(), message: format!("must be >= 0, got {v}") })
}

/// ImageScaleToTotalPixels' size: `total = int(megapixels·1024²)`, both sides scaled by
/// `√(total / (w·h))` and rounded half to even.
pub fn total_pixels_size(w: usize, h: usize, megapixels: f64) -> (f64, f64) {
    let total = (megapixels * 1024.0 * 1024.0).trunc();
    let scale = (total / (w as f64 * h as f64)).sqrt();
    ((w as f64 * scale).round_ties_even(), (h as f64 * scale).round_ties_even())
}

/// ImageScaleToMaxDimension's size: the longer side becomes `largest`, the other keeps
/// the aspect ratio (rounded half to even).
pub fn max_dimension_size(w: usize, h: usize, largest: usize) -> (usize, usize) {
    let l = largest as f64;
    if h > w {
        (((w as f64 / h as f64) * l).round_ties_even() as usize, largest)
    } else if w > h {
        (largest, ((h as f64 / w as f64) * l).round_ties_even() as usize)
    } else {
        (largest, largest)
    }
}

/// A float size as pixels, checked against the limits before anything is allocated.
fn pixels(w: f64, h: f64, n: usize) -> Result<(usize, usize), ImageOpError> {
    let side = MAX_IMAGE_SIDE as f64;
    if !(w <= side && h <= side) {
        return Err(ImageOpError::TooLarge { w: w.min(usize::MAX as f64) as usize, h: h.min(usize::MAX as f64) as usize, n });
    }
    let (w, h) = (w.max(0.0) as usize, h.max(0.0) as usize);
    check_output(w, h, n)?;
    Ok((w, h))
}

/// The batch grown to `n` samples by repeating its last one (ImageStitch's rule).
fn repeat_last(img: &Image, n: usize) -> Cow<'_, Image> {
    if img.n >= n {
        return Cow::Borrowed(img);
    }
    let per = img.height * img.width * img.channels;
    let mut data = img.data.clone();
    let last = img.data[(img.n - 1) * per..img.n * per].to_vec();
    for _ in img.n..n {
        data.extend_from_slice(&last);
    }
    Cow::Owned(Image { data, n, ..img.clone() })
}

/// The image on a larger canvas filled with `value` (`torch.nn.functional.pad`).
fn pad(img: &Image, top: usize, bottom: usize, left: usize, right: usize, value: f32) -> Image {
    let (w, h, c) = (img.width + left + right, img.height + top + bottom, img.channels);
    let mut data = vec![value; img.n * w * h * c];
    for i in 0..img.n {
        for y in 0..img.height {
            let src = ((i * img.height + y) * img.width) * c;
            let dst = ((i * h + y + top) * w + left) * c;
            data[dst..dst + img.width * c].copy_from_slice(&img.data[src..src + img.width * c]);
        }
    }
    Image { data, n: img.n, height: h, width: w, channels: c }
}

/// The image with channels of ones appended up to `c` (ImageStitch's and
/// `image_alpha_fix`'s opaque alpha).
fn with_channels(img: &Image, c: usize) -> Cow<'_, Image> {
    if img.channels >= c {
        return Cow::Borrowed(img);
    }
    let data = img.data.chunks(img.channels).flat_map(|p| p.iter().copied().chain(std::iter::repeat_n(1.0, c - img.channels))).collect();
    Cow::Owned(Image { data, channels: c, ..img.clone() })
}

/// Images of one batch size, channel count and height (`horizontal`) or width, side by
/// side or stacked (`torch.cat` on the width or height axis).
fn concat(parts: &[&Image], horizontal: bool) -> Image {
    let (n, c) = (parts[0].n, parts[0].channels);
    let (w, h) = if horizontal { (parts.iter().map(|p| p.width).sum(), parts[0].height) } else { (parts[0].width, parts.iter().map(|p| p.height).sum()) };
    let mut data = Vec::with_capacity(n * w * h * c);
    for i in 0..n {
        if horizontal {
            for y in 0..h {
                for p in parts {
                    let row = ((i * p.height + y) * p.width) * c;
                    data.extend_from_slice(&p.data[row..row + p.width * c]);
                }
            }
        } else {
            for p in parts {
                let per = p.height * p.width * c;
                data.extend_from_slice(&p.data[i * per..(i + 1) * per]);
            }
        }
    }
    Image { data, n, height: h, width: w, channels: c }
}

pub const STITCH_DIRECTIONS: [&str; 4] = ["right", "down", "left", "up"];
pub const STITCH_COLORS: [&str; 5] = ["white", "black", "red", "green", "blue"];

/// ImageStitch: `b` joined to `a` on the side `direction` names, with `spacing` pixels
/// (made even) of `color` between them.
pub fn stitch(a: &Image, b: &Image, direction: &str, match_size: bool, spacing: usize, color: &str) -> Result<Image, ImageOpError> {
    check_input(a)?;
    check_input(b)?;
    let unknown = |v: &str, o: &[&str]| ImageOpError::UnknownOption { value: v.into(), options: o.join(", ") };
    let horizontal = match direction {
        "left" | "right" => true,
        "up" | "down" => false,
        d => return Err(unknown(d, &STITCH_DIRECTIONS)),
    };
    // White and black are one value for every colour channel, the others RGB triples.
    let (scalar, rgb) = match color {
        "white" => (Some(1.0), [1.0; 3]),
        "black" => (Some(0.0), [0.0; 3]),
        "red" => (None, [1.0, 0.0, 0.0]),
        "green" => (None, [0.0, 1.0, 0.0]),
        "blue" => (None, [0.0, 0.0, 1.0]),
        c => return Err(unknown(c, &STITCH_COLORS)),
    };
    let n = a.n.max(b.n);
    // The smaller batch grows to the larger: bound that before it is allocated.
    check_output(a.width, a.height, n)?;
    check_output(b.width, b.height, n)?;
    let (a, b) = (repeat_last(a, n), repeat_last(b, n));
    let (a, b): (Cow<'_, Image>, Cow<'_, Image>) = if match_size {
        let aspect = b.width as f64 / b.height as f64;
        let (tw, th) = if horizontal { ((a.height as f64 * aspect).trunc(), a.height as f64) } else { (a.width as f64, (a.width as f64 / aspect).trunc()) };
        let (tw, th) = pixels(tw, th, n)?;
        let scaled = comfy_lanczos(&b, tw, th);
        (a, Cow::Owned(scaled))
    } else {
        // The other side padded, centred, to the larger of the two; triples pad with 0.
        let value = scalar.unwrap_or(0.0);
        fn grow(img: Cow<'_, Image>, target: usize, horizontal: bool, value: f32) -> Cow<'_, Image> {
            let len = if horizontal { img.height } else { img.width };
            if len == target {
                return img;
            }
            let (lo, hi) = ((target - len) / 2, target - len - (target - len) / 2);
            Cow::Owned(if horizontal { pad(&img, lo, hi, 0, 0, value) } else { pad(&img, 0, 0, lo, hi, value) })
        }
        let target = if horizontal { a.height.max(b.height) } else { a.width.max(b.width) };
        (grow(a, target, horizontal, value), grow(b, target, horizontal, value))
    };
    let c = a.channels.max(b.channels);
    let (a, b) = (with_channels(&a, c).into_owned(), with_channels(&b, c).into_owned());
    let spacing = spacing + spacing % 2;
    let (w, h) = if horizontal { (a.width + spacing + b.width, a.height) } else { (a.width, a.height + spacing + b.height) };
    check_output(w, h, n)?;
    let gap = (spacing > 0).then(|| {
        let mut px = vec![0f32; c];
        for (k, v) in px.iter_mut().enumerate().take(3) {
            *v = scalar.unwrap_or(rgb[k]);
        }
        if c == 4 {
            px[3] = 1.0;
        }
        let (gw, gh) = if horizontal { (spacing, a.height) } else { (a.width, spacing) };
        Image { data: (0..n * gw * gh).flat_map(|_| px.iter().copied()).collect(), n, height: gh, width: gw, channels: c }
    });
    let (first, second) = if matches!(direction, "left" | "up") { (&b, &a) } else { (&a, &b) };
    let mut parts = vec![first];
    if let Some(g) = &gap {
        parts.push(g);
    }
    parts.push(second);
    Ok(concat(&parts, horizontal))
}

/// ImageFromBatch: `length` samples from `batch_index`, both clamped into the batch.
pub fn from_batch(img: &Image, batch_index: usize, length: usize) -> Result<Image, ImageOpError> {
    check_input(img)?;
    let start = batch_index.min(img.n - 1);
    let len = length.min(img.n - start);
    if len == 0 {
        return Err(ImageOpError::EmptyResult { w: img.width, h: img.height });
    }
    let per = img.height * img.width * img.channels;
    Ok(Image { data: img.data[start * per..(start + len) * per].to_vec(), n: len, ..img.clone() })
}

/// ResizeAndPadImage: scaled (aspect kept, sides truncated) to fit `tw`×`th`, centred on
/// a canvas of `pad_value`.
pub fn resize_and_pad(img: &Image, tw: usize, th: usize, pad_value: f32, method: Method) -> Result<Image, ImageOpError> {
    check_input(img)?;
    check_output(tw, th, img.n)?;
    let scale = (tw as f64 / img.width as f64).min(th as f64 / img.height as f64);
    let (nw, nh) = (((img.width as f64 * scale).trunc() as usize).min(tw), ((img.height as f64 * scale).trunc() as usize).min(th));
    check_output(nw, nh, img.n)?;
    let resized = comfy_upscale(img, nw, nh, method);
    let (top, left) = ((th - nh) / 2, (tw - nw) / 2);
    Ok(pad(&resized, top, th - nh - top, left, tw - nw - left, pad_value))
}

/// JoinImageWithAlpha: the first three channels and `1 − alpha` (bilinearly resized to the
/// image) as the fourth, for as many samples as both batches have.
pub fn join_alpha(img: &Image, alpha: &Mask) -> Result<Image, ImageOpError> {
    check_input(img)?;
    let n = img.n.min(alpha.n);
    if n == 0 {
        return Err(ImageOpError::EmptyBatch);
    }
    if alpha.width == 0 || alpha.height == 0 {
        return Err(ImageOpError::NoPixels { w: alpha.width, h: alpha.height });
    }
    let (w, h, c) = (img.width, img.height, img.channels);
    let keep = c.min(3);
    let mut data = Vec::with_capacity(n * w * h * (keep + 1));
    for i in 0..n {
        let plane = &alpha.data[i * alpha.width * alpha.height..(i + 1) * alpha.width * alpha.height];
        let a = resize_plane(plane, alpha.width, alpha.height, w, h, Method::Bilinear);
        for (p, av) in a.iter().enumerate() {
            let px = &img.data[(i * w * h + p) * c..(i * w * h + p) * c + keep];
            data.extend_from_slice(px);
            data.push(1.0 - av);
        }
    }
    Ok(Image { data, n, height: h, width: w, channels: keep + 1 })
}

#[derive(Clone, Copy, Debug)]
enum Transform {
    GetImageSize,
    TotalPixels,
    MaxDimension,
    Stitch,
    FromBatch,
    ResizeAndPad,
    JoinAlpha,
}

const TOTAL_PIXELS_METHODS: [&str; 5] = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"];
/// ComfyUI lists "bilinear" twice here; kept so the choices read the same.
const MAX_DIMENSION_METHODS: [&str; 6] = ["area", "lanczos", "bilinear", "nearest-exact", "bilinear", "bicubic"];
const PAD_METHODS: [&str; 5] = ["area", "bicubic", "nearest-exact", "bilinear", "lanczos"];

fn image_out(img: Image) -> Outputs {
    Outputs::new(vec![Value::new(IoType::IMAGE, img)])
}

impl Node for Transform {
    fn schema(&self) -> NodeSchema {
        let image = || InputSpec::link("image", IoType::IMAGE);
        match self {
            Transform::GetImageSize => NodeSchema::new("GetImageSize")
                .display_name("Get Image Size")
                .category("image")
                .description("Returns width and height of the image, and passes it through unchanged.")
                .input(image())
                .output("width", IoType::INT)
                .output("height", IoType::INT)
                .output("batch_size", IoType::INT),
            Transform::TotalPixels => NodeSchema::new("ImageScaleToTotalPixels")
                .display_name("Scale Image to Total Pixels")
                .category("image/upscaling")
                .input(image())
                .input(InputSpec::combo("upscale_method", TOTAL_PIXELS_METHODS))
                .input(InputSpec::float("megapixels", 1.0).float_range(0.01, 16.0).float_step(0.01))
                .output("IMAGE", IoType::IMAGE),
            Transform::MaxDimension => NodeSchema::new("ImageScaleToMaxDimension")
                .category("image/upscaling")
                .input(image())
                .input(InputSpec::combo("upscale_method", MAX_DIMENSION_METHODS))
                .input(InputSpec::int("largest_size", 512).int_range(0, MAX_RESOLUTION))
                .output("IMAGE", IoType::IMAGE),
            Transform::Stitch => NodeSchema::new("ImageStitch")
                .display_name("Image Stitch")
                .category("image/transform")
                .description("\nStitches image2 to image1 in the specified direction.\nIf image2 is not provided, returns image1 unchanged.\nOptional spacing can be added between images.\n")
                .input(InputSpec::link("image1", IoType::IMAGE))
                .input(InputSpec::combo("direction", STITCH_DIRECTIONS).combo_default("right"))
                .input(InputSpec::boolean("match_image_size", true))
                .input(InputSpec::int("spacing_width", 0).int_range(0, 1024).int_step(2))
                .input(InputSpec::combo("spacing_color", STITCH_COLORS).combo_default("white"))
                .input(InputSpec::link("image2", IoType::IMAGE).optional())
                .output("IMAGE", IoType::IMAGE),
            Transform::FromBatch => NodeSchema::new("ImageFromBatch")
                .category("image/batch")
                .input(image())
                .input(InputSpec::int("batch_index", 0).int_range(0, 4095))
                .input(InputSpec::int("length", 1).int_range(1, 4096))
                .output("IMAGE", IoType::IMAGE),
            Transform::ResizeAndPad => NodeSchema::new("ResizeAndPadImage")
                .category("image/transform")
                .input(image())
                .input(InputSpec::int("target_width", 512).int_range(1, MAX_RESOLUTION))
                .input(InputSpec::int("target_height", 512).int_range(1, MAX_RESOLUTION))
                .input(InputSpec::combo("padding_color", ["white", "black"]))
                .input(InputSpec::combo("interpolation", PAD_METHODS))
                .output("IMAGE", IoType::IMAGE),
            Transform::JoinAlpha => NodeSchema::new("JoinImageWithAlpha")
                .display_name("Join Image with Alpha")
                .category("mask/compositing")
                .input(image())
                .input(InputSpec::link("alpha", IoType::MASK))
                .output("IMAGE", IoType::IMAGE),
        }
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let bad = invalid("image");
        match self {
            Transform::GetImageSize => {
                let img = inputs.downcast::<Image>("image")?;
                Ok(Outputs::new(vec![Value::int(img.width as i64), Value::int(img.height as i64), Value::int(img.n as i64)]))
            }
            Transform::TotalPixels => {
                let img = inputs.downcast::<Image>("image")?;
                let m = method(inputs, "upscale_method", &TOTAL_PIXELS_METHODS)?;
                let mp = inputs.float("megapixels")?;
                if !mp.is_finite() || mp < 0.0 {
                    return Err(NodeError::InvalidInput { input: "megapixels".into(), message: format!("must be a positive number, got {mp}") });
                }
                check_input(img).map_err(&bad)?;
                let (w, h) = total_pixels_size(img.width, img.height, mp);
                let (w, h) = pixels(w, h, img.n).map_err(invalid("megapixels"))?;
                Ok(image_out(comfy_upscale(img, w, h, m)))
            }
            Transform::MaxDimension => {
                let img = inputs.downcast::<Image>("image")?;
                let m = method(inputs, "upscale_method", &MAX_DIMENSION_METHODS)?;
                let largest = count(inputs, "largest_size")?;
                check_input(img).map_err(&bad)?;
                let (w, h) = max_dimension_size(img.width, img.height, largest);
                check_output(w, h, img.n).map_err(invalid("largest_size"))?;
                Ok(image_out(comfy_upscale(img, w, h, m)))
            }
            Transform::Stitch => {
                let a = inputs.downcast::<Image>("image1")?;
                if !inputs.contains("image2") {
                    return Ok(Outputs::new(vec![inputs.value("image1")?.clone()]));
                }
                let b = inputs.downcast::<Image>("image2")?;
                let (direction, color) = (inputs.string("direction")?, inputs.string("spacing_color")?);
                for (name, v, options) in [("direction", direction, &STITCH_DIRECTIONS[..]), ("spacing_color", color, &STITCH_COLORS[..])] {
                    if !options.contains(&v) {
                        return Err(invalid(name)(ImageOpError::UnknownOption { value: v.into(), options: options.join(", ") }));
                    }
                }
                let spacing = count(inputs, "spacing_width")?;
                let out = stitch(a, b, direction, inputs.boolean("match_image_size")?, spacing, color).map_err(invalid(if spacing > MAX_IMAGE_SIDE as usize { "spacing_width" } else { "image2" }))?;
                Ok(image_out(out))
            }
            Transform::FromBatch => {
                let img = inputs.downcast::<Image>("image")?;
                let length = count(inputs, "length")?;
                if length == 0 {
                    return Err(NodeError::InvalidInput { input: "length".into(), message: "must be at least 1".into() });
                }
                Ok(image_out(from_batch(img, count(inputs, "batch_index")?, length).map_err(&bad)?))
            }
            Transform::ResizeAndPad => {
                let img = inputs.downcast::<Image>("image")?;
                let pad_value = match inputs.string("padding_color")? {
                    "black" => 0.0,
                    "white" => 1.0,
                    other => return Err(invalid("padding_color")(ImageOpError::UnknownOption { value: other.into(), options: "white, black".into() })),
                };
                let m = method(inputs, "interpolation", &PAD_METHODS)?;
                Ok(image_out(resize_and_pad(img, count(inputs, "target_width")?, count(inputs, "target_height")?, pad_value, m).map_err(&bad)?))
            }
            Transform::JoinAlpha => {
                let img = inputs.downcast::<Image>("image")?;
                let alpha = inputs.downcast::<Mask>("alpha")?;
                Ok(image_out(join_alpha(img, alpha).map_err(invalid("alpha"))?))
            }
        }
    }
}

/// ComfyUI's MaskPreview: the mask as a grey RGB image in the temp folder, shown like
/// Preview Image (`{"images": [{filename, subfolder, type: "temp"}]}`). Bytes are rounded
/// as Preview Image writes them here; ComfyUI's SaveImage truncates, so a preview pixel
/// can be one level brighter than ComfyUI's.
struct MaskPreview {
    rt: Arc<Runtime>,
}

/// File prefix of mask previews: apart from Preview Image's, so the two never take the
/// same counter when they run side by side.
const MASK_PREVIEW_PREFIX: &str = "ComfyUI_temp_mask";

impl Node for MaskPreview {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("MaskPreview").category("mask").input(InputSpec::link("mask", IoType::MASK)).output_node()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mask = inputs.downcast::<Mask>("mask")?;
        if mask.n > 0 && (mask.width == 0 || mask.height == 0) {
            return Err(invalid("mask")(ImageOpError::NoPixels { w: mask.width, h: mask.height }));
        }
        let dir = ctx.output_dir().map_or_else(|| self.rt.output_dir.clone(), Path::to_path_buf).join("temp");
        std::fs::create_dir_all(&dir).map_err(|e| NodeError::msg(format!("{}: {e}", dir.display())))?;
        let per = mask.width * mask.height;
        let mut files = Vec::with_capacity(mask.n);
        let mut text = ctx.metadata().to_vec();
        text.push(("software".into(), "sdflow".into()));
        for (i, counter) in (0..mask.n).zip(next_counter(&dir, MASK_PREVIEW_PREFIX)..) {
            ctx.check_cancelled()?;
            let grey = Image { data: mask.data[i * per..(i + 1) * per].iter().flat_map(|&v| [v; 3]).collect(), n: 1, height: mask.height, width: mask.width, channels: 3 };
            let name = format!("{MASK_PREVIEW_PREFIX}_{counter:05}_.png");
            write_png(&dir.join(&name), &grey, 0, &text)?;
            files.push(json!({"filename": name, "subfolder": "", "type": "temp"}));
        }
        Ok(Outputs::none().with_ui(json!({"images": files})))
    }
}
