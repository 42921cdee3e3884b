//! A1111's img2img preparation as nodes, for the A1111 API's inpainting and resize
//! options: its `images.resize_image` (just resize, crop and resize, resize and fill, with
//! PIL's Lanczos), its masked content "fill" (`masking.fill`: the masked part painted from
//! the surrounding colours by ever finer blurs) and its latent masked contents with its
//! rounded latent mask ("latent noise", "latent nothing"). ComfyUI has none of these, so
//! the names say whose they are.
//!
//! The pixel functions are checked against PIL running A1111's formulas
//! (`tests/fixtures/make_a1111_inpaint.py`).

use crate::image::resize::{resize_plane, Method};
use crate::runtime::Runtime;
use crate::sampling::NoiseSource;
use crate::values::{Image, Latent, Mask, ModelRef};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(A1111ResizeImage));
    registry.register(Arc::new(A1111MaskedFill));
    registry.register(Arc::new(A1111InpaintLatent { rt: rt.clone() }));
}

/// A1111's resize modes of `images.resize_image` (its 3, "latent upscale", resizes the
/// latent instead and is not an image mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    /// 0: stretched to the size.
    Just,
    /// 1: scaled to cover the size, centred, the overhang cut off.
    CropAndResize,
    /// 2: scaled to fit inside, centred, the bands beside it filled by stretching its
    /// edge (PIL's bicubic of a zero-height box: an extrapolation of the 2 edge rows).
    ResizeAndFill,
}

impl ResizeMode {
    pub const NAMES: [&'static str; 3] = ["just resize", "crop and resize", "resize and fill"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "just resize" => ResizeMode::Just,
            "crop and resize" => ResizeMode::CropAndResize,
            "resize and fill" => ResizeMode::ResizeAndFill,
            _ => return None,
        })
    }
}

/// Keys' cubic at A = −0.5, PIL's BICUBIC.
fn bicubic(x: f64) -> f64 {
    let (x, a) = (x.abs(), -0.5);
    if x < 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

/// PIL's taps for a zero-height box at `center` of `n` source rows with its default
/// filter (bicubic, which A1111's bands are resized with): what `resize(..., box=(c, c))`
/// reads for every output row, 1.125 of the edge row less 0.125 of the next.
fn edge_taps(n: usize, center: f64) -> Vec<(usize, f32)> {
    let lo = ((center - 2.0 + 0.5) as i64).max(0) as usize;
    let hi = ((center + 2.0 + 0.5) as i64).clamp(0, n as i64) as usize;
    let w: Vec<f64> = (lo..hi).map(|i| bicubic(i as f64 - center + 0.5)).collect();
    let total: f64 = w.iter().sum();
    let norm = if total != 0.0 { total } else { 1.0 };
    (lo..hi).zip(w).map(|(i, w)| (i, (w / norm) as f32)).collect()
}

/// One channel plane of sample `i`.
fn plane(img: &Image, i: usize, k: usize) -> Vec<f32> {
    let (w, h, c) = (img.width, img.height, img.channels);
    (0..w * h).map(|p| img.data[(i * w * h + p) * c + k]).collect()
}

/// The geometry of `resize_image` for a `w`×`h` source and a `W`×`H` target: the size
/// the source is scaled to and where it is pasted (A1111's integer divisions).
pub fn resize_geometry(mode: ResizeMode, w: usize, h: usize, tw: usize, th: usize) -> (usize, usize, i64, i64) {
    let (ratio, src_ratio) = (tw as f64 / th as f64, w as f64 / h as f64);
    let (sw, sh) = match mode {
        ResizeMode::Just => (tw, th),
        ResizeMode::CropAndResize => (if ratio > src_ratio { tw } else { w * th / h }, if ratio <= src_ratio { th } else { h * tw / w }),
        ResizeMode::ResizeAndFill => (if ratio < src_ratio { tw } else { w * th / h }, if ratio >= src_ratio { th } else { h * tw / w }),
    };
    (sw, sh, (tw / 2) as i64 - (sw / 2) as i64, (th / 2) as i64 - (sh / 2) as i64)
}

/// PIL's 8-bit Lanczos resize of a plane: the rows, then the columns, each pass rounded
/// and clipped to 8 bits as PIL stores it.
fn lanczos_8bit(src: &[f32], w: usize, h: usize, ow: usize, oh: usize) -> Vec<f32> {
    let q = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|v| f32::from(to_u8(v)) / 255.0).collect() };
    let rows = if ow == w { src.to_vec() } else { q(resize_plane(src, w, h, ow, h, Method::Lanczos)) };
    if oh == h {
        rows
    } else {
        q(resize_plane(&rows, ow, h, ow, oh, Method::Lanczos))
    }
}

/// A1111's `images.resize_image(mode, image, width, height)` with its default img2img
/// upscaler (none: PIL's Lanczos), values clipped to 0..=1 as PIL's 8-bit result is.
pub fn resize_image(img: &Image, mode: ResizeMode, tw: usize, th: usize) -> Result<Image, NodeError> {
    let (w, h, c) = (img.width, img.height, img.channels);
    let (sw, sh, px, py) = resize_geometry(mode, w, h, tw, th);
    if sw == 0 || sh == 0 || tw == 0 || th == 0 || w == 0 || h == 0 {
        return Err(NodeError::msg(format!("cannot resize {w}x{h} to {tw}x{th}")));
    }
    let (ratio, src_ratio) = (tw as f64 / th as f64, w as f64 / h as f64);
    let mut data = vec![0f32; img.n * tw * th * c];
    for i in 0..img.n {
        for k in 0..c {
            let src = plane(img, i, k);
            let resized = lanczos_8bit(&src, w, h, sw, sh);
            let mut out = vec![0f32; tw * th];
            for y in 0..sh {
                let ty = y as i64 + py;
                if !(0..th as i64).contains(&ty) {
                    continue;
                }
                for x in 0..sw {
                    let tx = x as i64 + px;
                    if (0..tw as i64).contains(&tx) {
                        out[ty as usize * tw + tx as usize] = resized[y * sw + x];
                    }
                }
            }
            if mode == ResizeMode::ResizeAndFill {
                if ratio < src_ratio {
                    // Bands above and below: the top and bottom edges stretched.
                    let fill = (th / 2) as i64 - (sh / 2) as i64;
                    if fill > 0 {
                        let fill = fill as usize;
                        for (taps, start) in [(edge_taps(sh, 0.0), 0), (edge_taps(sh, sh as f64), fill + sh)] {
                            let row: Vec<f32> = (0..sw).map(|x| taps.iter().map(|&(r, t)| resized[r * sw + x] * t).sum()).collect();
                            for y in start..(start + fill).min(th) {
                                for x in 0..sw.min(tw) {
                                    out[y * tw + x] = row[x];
                                }
                            }
                        }
                    }
                } else if ratio > src_ratio {
                    let fill = (tw / 2) as i64 - (sw / 2) as i64;
                    if fill > 0 {
                        let fill = fill as usize;
                        for (taps, start) in [(edge_taps(sw, 0.0), 0), (edge_taps(sw, sw as f64), fill + sw)] {
                            let col: Vec<f32> = (0..sh).map(|y| taps.iter().map(|&(q, t)| resized[y * sw + q] * t).sum()).collect();
                            for (y, v) in col.iter().enumerate().take(th) {
                                for x in start..(start + fill).min(tw) {
                                    out[y * tw + x] = *v;
                                }
                            }
                        }
                    }
                }
            }
            for (p, v) in out.into_iter().enumerate() {
                data[(i * tw * th + p) * c + k] = v.clamp(0.0, 1.0);
            }
        }
    }
    Ok(Image { data, n: img.n, height: th, width: tw, channels: c })
}

fn to_u8(v: f32) -> u8 {
    (v * 255.0).round().clamp(0.0, 255.0) as u8
}

/// PIL's `_gaussian_blur_radius`: the box radius whose 3 passes approximate a Gaussian
/// of that radius (Gwosdek et al.).
fn box_radius(radius: f32, passes: u32) -> f32 {
    let sigma2 = radius * radius / passes as f32;
    let big_l = (12.0 * f64::from(sigma2) + 1.0).sqrt() as f32;
    let l = ((f64::from(big_l) - 1.0) / 2.0).floor() as f32;
    let a = (2.0 * l + 1.0) * (l * (l + 1.0) - 3.0 * sigma2) / (6.0 * (sigma2 - (l + 1.0) * (l + 1.0)));
    l + a
}

/// One pass of PIL's box blur along a line of `n` values at `stride` (4 channels each):
/// the window of `radius` (fractional: the two far pixels weighted by the fraction), the
/// edges repeated, in PIL's 24-bit fixed point.
fn box_line(v: &mut [u8], start: usize, n: usize, stride: usize, radius: f32) {
    let r = radius as usize;
    let ww = (16_777_216f32 / (radius * 2.0 + 1.0)) as u64;
    let fw = (16_777_216u64 - (r as u64 * 2 + 1) * ww) / 2;
    let at = |i: i64| start + (i.clamp(0, n as i64 - 1) as usize) * stride;
    for ch in 0..4 {
        let line: Vec<u64> = (0..n as i64).map(|i| u64::from(v[at(i) + ch])).collect();
        let get = |i: i64| line[i.clamp(0, n as i64 - 1) as usize];
        // Prefix sums over the line, the edges counted for the window's overhang.
        let mut prefix = vec![0u64; n + 1];
        for i in 0..n {
            prefix[i + 1] = prefix[i] + line[i];
        }
        let window = |a: i64, b: i64| -> u64 {
            // Sum of get(k) for k in a..=b.
            let mut s = 0;
            if a < 0 {
                s += line[0] * (((-a) as u64).min((b - a + 1) as u64));
            }
            if b >= n as i64 {
                s += line[n - 1] * ((b - n as i64 + 1) as u64).min((b - a + 1) as u64);
            }
            let (lo, hi) = (a.max(0), b.min(n as i64 - 1));
            if lo <= hi {
                s += prefix[hi as usize + 1] - prefix[lo as usize];
            }
            s
        };
        for x in 0..n as i64 {
            let acc = window(x - r as i64, x + r as i64);
            let bulk = acc * ww + (get(x - r as i64 - 1) + get(x + r as i64 + 1)) * fw;
            v[at(x) + ch] = ((bulk + (1 << 23)) >> 24) as u8;
        }
    }
}

/// PIL's `GaussianBlur(radius)` of a 4-channel 8-bit image: 3 box passes along the rows,
/// then 3 along the columns.
fn gaussian_blur_rgba(v: &mut [u8], w: usize, h: usize, radius: f32) {
    if radius == 0.0 {
        return;
    }
    let r = box_radius(radius, 3);
    if r == 0.0 {
        return;
    }
    for _ in 0..3 {
        for y in 0..h {
            box_line(v, y * w * 4, w, 4, r);
        }
    }
    for _ in 0..3 {
        for x in 0..w {
            box_line(v, x * 4, h, w * 4, r);
        }
    }
}

fn shift_div255(a: u32) -> u32 {
    ((a >> 8) + a) >> 8
}

/// A1111's `masking.fill`: the image with its masked part (mask 1) cut out (premultiplied
/// alpha `1 − mask`), blurred at radii 256, 64, 16, 4, 2 and 0 and each blur laid over the
/// last (1, 1, 2, 4, 2 and 1 times), the result's colour without its alpha. In PIL's 8-bit
/// arithmetic, as A1111 runs it.
pub fn fill(img: &Image, mask: &Mask) -> Result<Image, NodeError> {
    let (w, h) = (img.width, img.height);
    if img.channels < 3 {
        return Err(NodeError::msg("fill needs an RGB image"));
    }
    let m_planes: Vec<Vec<f32>> = (0..mask.n).map(|i| if (mask.width, mask.height) == (w, h) { mask.data[i * w * h..(i + 1) * w * h].to_vec() } else { mask.resized(i, w, h) }).collect();
    let mut data = Vec::with_capacity(img.data.len());
    for i in 0..img.n {
        let m = &m_planes[i % m_planes.len().max(1)];
        // RGBa: the opaque image pasted on transparent black through the inverted mask.
        let mut masked = vec![0u8; w * h * 4];
        for p in 0..w * h {
            let keep = 255 - u32::from(to_u8(m[p]));
            for k in 0..3 {
                let s = u32::from(to_u8(img.data[(i * w * h + p) * img.channels + k]));
                let t = s * keep + 128;
                masked[p * 4 + k] = (((t >> 8) + t) >> 8) as u8;
            }
            masked[p * 4 + 3] = keep as u8;
        }
        let mut out = vec![0u8; w * h * 4];
        for (radius, repeats) in [(256.0, 1), (64.0, 1), (16.0, 2), (4.0, 4), (2.0, 2), (0.0, 1)] {
            let mut blurred = masked.clone();
            gaussian_blur_rgba(&mut blurred, w, h, radius);
            // RGBa → RGBA.
            for px in blurred.chunks_mut(4) {
                let a = u32::from(px[3]);
                if a != 0 && a != 255 {
                    for c in px.iter_mut().take(3) {
                        *c = ((255 * u32::from(*c)) / a).min(255) as u8;
                    }
                }
            }
            for _ in 0..repeats {
                // PIL's alpha_composite: `blurred` over `out`.
                for (d, s) in out.chunks_mut(4).zip(blurred.chunks(4)) {
                    let sa = u32::from(s[3]);
                    if sa == 0 {
                        continue;
                    }
                    let blend = u32::from(d[3]) * (255 - sa);
                    let outa255 = sa * 255 + blend;
                    let coef1 = sa * 255 * 255 * (1 << 7) / outa255;
                    let coef2 = 255 * (1 << 7) - coef1;
                    for k in 0..3 {
                        let t = u32::from(s[k]) * coef1 + u32::from(d[k]) * coef2;
                        d[k] = (shift_div255(t + (0x80 << 7)) >> 7) as u8;
                    }
                    d[3] = shift_div255(outa255 + 0x80) as u8;
                }
            }
        }
        for p in 0..w * h {
            for k in 0..img.channels {
                data.push(if k < 3 { f32::from(out[p * 4 + k]) / 255.0 } else { img.data[(i * w * h + p) * img.channels + k] });
            }
        }
    }
    Ok(Image { data, ..img.clone() })
}

/// A1111's latent mask: the mask resized to the latent (PIL's bicubic, 8-bit) and rounded
/// (half to even), 1 where to repaint; one plane per mask sample.
pub fn latent_mask(mask: &Mask, lw: usize, lh: usize) -> Mask {
    let mut data = Vec::with_capacity(mask.n * lw * lh);
    for i in 0..mask.n {
        let src = &mask.data[i * mask.width * mask.height..(i + 1) * mask.width * mask.height];
        let r = resize_plane(src, mask.width, mask.height, lw, lh, Method::BicubicAntialiased);
        data.extend(r.into_iter().map(|v| (f32::from(to_u8(v)) / 255.0).round_ties_even()));
    }
    Mask { data, n: mask.n, height: lh, width: lw }
}

struct A1111ResizeImage;

impl Node for A1111ResizeImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("A1111ResizeImage")
            .display_name("Resize Image (A1111)")
            .category("image/upscaling")
            .description("A1111's images.resize_image with its default img2img upscaler (Lanczos): just resize stretches; crop and resize scales to cover and cuts the overhang around the centre; resize and fill scales to fit and fills the bands beside it by stretching the image's edge.")
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::int("width", 512).int_range(1, crate::image::MAX_IMAGE_SIDE as i128))
            .input(InputSpec::int("height", 512).int_range(1, crate::image::MAX_IMAGE_SIDE as i128))
            .input(InputSpec::combo("resize_mode", ResizeMode::NAMES))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let mode = ResizeMode::parse(inputs.string("resize_mode")?).ok_or_else(|| NodeError::msg("unknown resize_mode"))?;
        let (w, h) = (inputs.int("width")?, inputs.int("height")?);
        let (w, h) = (usize::try_from(w).unwrap_or(0), usize::try_from(h).unwrap_or(0));
        if (w as u64) * (h as u64) > crate::image::MAX_IMAGE_PIXELS {
            return Err(NodeError::msg(format!("{w}x{h} is larger than the image limit")));
        }
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, resize_image(img, mode, w, h)?)]))
    }
}

struct A1111MaskedFill;

impl Node for A1111MaskedFill {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("A1111MaskedFill")
            .display_name("Masked Fill (A1111)")
            .category("image/inpaint")
            .description("A1111's masked content \"fill\" (masking.fill): the masked part of the image (mask 1) is painted from the colours around it, by blurs of the unmasked part at radii 256 down to 0 laid over each other.")
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::link("mask", IoType::MASK))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let mask = inputs.downcast::<Mask>("mask")?;
        if mask.data.is_empty() {
            return Err(NodeError::msg("the mask is empty"));
        }
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, fill(img, mask)?)]))
    }
}

/// A1111's masked content at the latent: the latent mask (the mask at latent size,
/// rounded) becomes the noise mask, and under it the latent is kept ("original", also
/// for "fill", which acts on the image), zeroed ("latent nothing") or replaced by the
/// initial noise of the sampler's NOISE in the model's latent space ("latent noise").
struct A1111InpaintLatent {
    rt: Arc<Runtime>,
}

const CONTENTS: [&str; 3] = ["original", "latent noise", "latent nothing"];

impl Node for A1111InpaintLatent {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("A1111InpaintLatent")
            .display_name("Inpaint Latent (A1111)")
            .category("latent/inpaint")
            .description("A1111's inpainting latent: the mask resized to the latent (bicubic) and rounded is the noise mask (sampling changes only where it is 1); under it the latent is kept (original; also for fill, which acts on the image), zeroed (latent nothing) or replaced by the sampler's initial noise (latent noise: give the same NOISE and the MODEL, whose latent scale the noise is taken out of).")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::link("mask", IoType::MASK))
            .input(InputSpec::combo("masked_content", CONTENTS))
            .input(InputSpec::link("noise", IoType::NOISE).optional())
            .input(InputSpec::link("model", IoType::MODEL).optional())
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let latent = inputs.downcast::<Latent>("samples")?;
        let mask = inputs.downcast::<Mask>("mask")?;
        if mask.data.is_empty() {
            return Err(NodeError::msg("the mask is empty"));
        }
        let content = inputs.string("masked_content")?;
        let [lw, lh, c, _] = latent.shape;
        let (lw, lh, c) = (lw as usize, lh as usize, c as usize);
        let lm = latent_mask(mask, lw, lh);
        let plane = lw * lh;
        let m_at = |i: usize, p: usize| lm.data[(i % lm.n) * plane + p];
        let mut out = latent.clone();
        match content {
            "original" => {}
            "latent nothing" => {
                for (idx, v) in out.samples.iter_mut().enumerate() {
                    *v *= 1.0 - m_at(idx / (plane * c), idx % plane);
                }
            }
            "latent noise" => {
                let (Some(_), Some(_)) = (inputs.get("noise"), inputs.get("model")) else {
                    return Err(NodeError::msg("latent noise needs the sampler's noise and the model"));
                };
                let noise = inputs.downcast::<NoiseSource>("noise")?;
                let model = inputs.downcast::<ModelRef>("model")?;
                let (drawn, _, _) = NoiseSource { add: true, ..*noise }.draw(self.rt.rng, latent)?;
                for (idx, v) in out.samples.iter_mut().enumerate() {
                    let m = m_at(idx / (plane * c), idx % plane);
                    // Unit noise in the model's space is ε / scale + shift in the latent's.
                    let raw = model.latent.value_from_model(drawn[idx], idx, plane);
                    *v = *v * (1.0 - m) + raw * m;
                }
            }
            other => return Err(NodeError::msg(format!("unknown masked_content {other}"))),
        }
        out.noise_mask = Some(Arc::new(lm));
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, out)]))
    }
}
