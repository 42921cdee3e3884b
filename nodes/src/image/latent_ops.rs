//! ComfyUI's latent arithmetic, batching and layout nodes: from `nodes.py` LatentFromBatch,
//! RepeatLatentBatch, LatentComposite, LatentBlend, LatentFlip, LatentRotate and
//! LatentCrop; from `comfy_extras/nodes_latent.py` LatentAdd, LatentSubtract,
//! LatentMultiply, LatentInterpolate, LatentConcat, LatentCut, LatentBatch and
//! LatentBatchSeedBehavior; from `nodes_mask.py` LatentCompositeMasked.
//!
//! Each follows ComfyUI's tensor code, including its index clamping and Python slicing,
//! since a latent one cell off shifts the whole picture. The latent's other keys go along
//! as ComfyUI's `samples.copy()` carries them: the noise mask and the batch indices that
//! decide each sample's noise ([`Latent::batch_index`]).

use crate::image::resize::{resize_plane, Method};
use crate::values::{Latent, Mask};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::ops::Range;
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    use LatentOp::*;
    for op in [Add, Subtract, Multiply, Interpolate, Concat, Cut, Batch, BatchSeedBehavior, FromBatch, RepeatBatch, Composite, Blend, Flip, Rotate, Crop, CompositeMasked] {
        registry.register(Arc::new(op));
    }
}

/// ComfyUI's `MAX_RESOLUTION`.
const MAX_RESOLUTION: i128 = 16384;

pub(crate) fn invalid(input: &str, message: impl Into<String>) -> NodeError {
    NodeError::InvalidInput { input: input.to_string(), message: message.into() }
}

/// A tensor's sizes in torch's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dims {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
}

impl Dims {
    fn of(l: &Latent) -> Dims {
        let [w, h, c, n] = l.shape.map(|d| d as usize);
        Dims { n, c, h, w }
    }

    fn shape(self) -> [i64; 4] {
        [self.w as i64, self.h as i64, self.c as i64, self.n as i64]
    }

    fn len(self) -> usize {
        self.n * self.c * self.h * self.w
    }

    fn axis(self, k: usize) -> usize {
        [self.n, self.c, self.h, self.w][k]
    }

    fn with_axis(self, k: usize, v: usize) -> Dims {
        let mut a = [self.n, self.c, self.h, self.w];
        a[k] = v;
        Dims { n: a[0], c: a[1], h: a[2], w: a[3] }
    }

    fn at(self, n: usize, c: usize, y: usize, x: usize) -> usize {
        ((n * self.c + c) * self.h + y) * self.w + x
    }
}

/// The LATENT input `name`, its samples checked against its shape.
fn latent<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Latent, NodeError> {
    let l = inputs.downcast::<Latent>(name)?;
    if l.shape.iter().any(|&d| d < 1) || l.samples.len() as i64 != l.shape.iter().product::<i64>() {
        return Err(invalid(name, format!("a latent of {} values is not {:?}", l.samples.len(), l.shape)));
    }
    Ok(l)
}

fn latent_out(l: Latent) -> Result<Outputs, NodeError> {
    crate::image::latent::latent_zeros(l.shape)?; // the size check
    Ok(Outputs::new(vec![Value::new(IoType::LATENT, l)]))
}

/// Python's `range(len)[start:stop]`: negative ends count from the end, both clamped.
pub(crate) fn py_slice(len: usize, start: i64, stop: i64) -> Range<usize> {
    let norm = |i: i64| if i < 0 { (i + len as i64).max(0) as usize } else { (i as usize).min(len) };
    let (a, b) = (norm(start), norm(stop));
    a..b.max(a)
}

/// ComfyUI's `common_upscale(..., crop="center")` crop: the same margin off both ends,
/// `round((w − w·(new/old)) / 2)` (half to even) on the side that is too long.
pub(crate) fn comfy_center_crop(w: usize, h: usize, ow: usize, oh: usize) -> (usize, usize, usize, usize) {
    let (old, new) = (w as f64 / h as f64, ow as f64 / oh as f64);
    let (mut x, mut y) = (0, 0);
    if old > new {
        x = ((w as f64 - w as f64 * (new / old)) / 2.0).round_ties_even() as usize;
    } else if old < new {
        y = ((h as f64 - h as f64 * (old / new)) / 2.0).round_ties_even() as usize;
    }
    (x, y, w.saturating_sub(2 * x), h.saturating_sub(2 * y))
}

/// `common_upscale` on an NCHW tensor: every plane cropped (ComfyUI's centre crop, or not
/// at all) and resampled to `ow`×`oh` as `torch.nn.functional.interpolate` does.
pub(crate) fn upscale_nchw(data: &[f32], d: Dims, ow: usize, oh: usize, method: Method, crop: bool) -> Result<Vec<f32>, String> {
    let (x0, y0, cw, ch) = if crop { comfy_center_crop(d.w, d.h, ow, oh) } else { (0, 0, d.w, d.h) };
    if cw == 0 || ch == 0 || ow == 0 || oh == 0 {
        return Err(format!("a {}x{} plane cannot be cropped and scaled to {ow}x{oh}", d.w, d.h));
    }
    let mut out = Vec::with_capacity(d.n * d.c * ow * oh);
    for plane in data.chunks(d.w * d.h) {
        let src: Vec<f32> = (y0..y0 + ch).flat_map(|y| plane[y * d.w + x0..y * d.w + x0 + cw].iter().copied()).collect();
        out.extend(resize_plane(&src, cw, ch, ow, oh, method));
    }
    Ok(out)
}

/// `repeat_to_batch_size` along the first axis: cycled, then cut, to `n` items of `per`.
pub(crate) fn repeat_to_batch(data: &[f32], per: usize, n: usize) -> Vec<f32> {
    let have = data.len() / per;
    if have == n {
        return data.to_vec();
    }
    (0..n).flat_map(|i| data[(i % have) * per..(i % have + 1) * per].iter().copied()).collect()
}

/// `torch.cat((a, b), dim=axis)` of NCHW tensors that agree off the axis.
fn cat(a: &[f32], da: Dims, b: &[f32], db: Dims, axis: usize) -> (Vec<f32>, Dims) {
    let inner = |d: Dims| (axis + 1..4).map(|k| d.axis(k)).product::<usize>();
    let outer: usize = (0..axis).map(|k| da.axis(k)).product();
    let (ba, bb) = (da.axis(axis) * inner(da), db.axis(axis) * inner(db));
    let mut out = Vec::with_capacity(a.len() + b.len());
    for o in 0..outer {
        out.extend_from_slice(&a[o * ba..(o + 1) * ba]);
        out.extend_from_slice(&b[o * bb..(o + 1) * bb]);
    }
    (out, da.with_axis(axis, da.axis(axis) + db.axis(axis)))
}

/// `torch.narrow(t, axis, start, len)`.
fn narrow(data: &[f32], d: Dims, axis: usize, start: usize, len: usize) -> (Vec<f32>, Dims) {
    let inner: usize = (axis + 1..4).map(|k| d.axis(k)).product();
    let outer: usize = (0..axis).map(|k| d.axis(k)).product();
    let block = d.axis(axis) * inner;
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        out.extend_from_slice(&data[o * block + start * inner..o * block + (start + len) * inner]);
    }
    (out, d.with_axis(axis, len))
}

/// nodes_latent's `reshape_latent_to`: `l` bilinearly scaled (centre crop) to the target's
/// height and width when its channels, height or width differ, then (`repeat_batch`) cycled
/// to the target's batch. Channels must agree: ComfyUI's sums would fail otherwise.
fn reshape_to(target: Dims, l: &Latent, input: &str, repeat_batch: bool) -> Result<(Vec<f32>, Dims), NodeError> {
    let d = Dims::of(l);
    if d.c != target.c {
        return Err(invalid(input, format!("{} channels against {}", d.c, target.c)));
    }
    let (mut data, mut d) = (std::borrow::Cow::Borrowed(&l.samples[..]), d);
    if (d.h, d.w) != (target.h, target.w) {
        data = upscale_nchw(&data, d, target.w, target.h, Method::Bilinear, true).map_err(|m| invalid(input, m))?.into();
        d = Dims { h: target.h, w: target.w, ..d };
    }
    if repeat_batch && d.n != target.n {
        let per = d.c * d.h * d.w;
        return Ok((repeat_to_batch(&data, per, target.n), Dims { n: target.n, ..d }));
    }
    Ok((data.into_owned(), d))
}

/// A mask's samples cycled to `n` (`masks.repeat(ceil(n / m))[:n]`).
fn cycle_mask(m: &Mask, n: usize) -> Mask {
    let per = m.width * m.height;
    Mask { data: repeat_to_batch(&m.data, per, n), n, ..m.clone() }
}

fn mask_samples(m: &Mask, range: Range<usize>) -> Mask {
    let per = m.width * m.height;
    Mask { data: m.data[range.start * per..range.end * per].to_vec(), n: range.len(), ..m.clone() }
}

fn nan_to_num(v: f32) -> f32 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(f32::MIN, f32::MAX)
    }
}

#[derive(Clone, Copy, Debug)]
enum LatentOp {
    Add,
    Subtract,
    Multiply,
    Interpolate,
    Concat,
    Cut,
    Batch,
    BatchSeedBehavior,
    FromBatch,
    RepeatBatch,
    Composite,
    Blend,
    Flip,
    Rotate,
    Crop,
    CompositeMasked,
}

const ROTATIONS: [&str; 4] = ["none", "90 degrees", "180 degrees", "270 degrees"];
const FLIPS: [&str; 2] = ["x-axis: vertically", "y-axis: horizontally"];
const CONCAT_DIMS: [&str; 6] = ["x", "-x", "y", "-y", "t", "-t"];
const CUT_DIMS: [&str; 3] = ["x", "y", "t"];

/// The string input `name`, one of `options`.
pub(crate) fn choice<'a>(inputs: &'a Inputs, name: &str, options: &[&str]) -> Result<&'a str, NodeError> {
    let v = inputs.string(name)?;
    if options.contains(&v) {
        Ok(v)
    } else {
        Err(invalid(name, format!("`{v}` is not one of {}", options.join(", "))))
    }
}

/// The quarter turns of "90 degrees" etc., the way ComfyUI reads them (by prefix).
pub(crate) fn quarter_turns(rotation: &str) -> usize {
    match rotation {
        r if r.starts_with("90") => 1,
        r if r.starts_with("180") => 2,
        r if r.starts_with("270") => 3,
        _ => 0,
    }
}

/// `torch.rot90(t, k, dims=[w_axis, h_axis])` of one `h`×`w` plane: quarter turns
/// clockwise; returns the plane and its new width and height.
pub(crate) fn rot90_plane(src: &[f32], w: usize, h: usize, k: usize) -> (Vec<f32>, usize, usize) {
    match k % 4 {
        0 => (src.to_vec(), w, h),
        // Rows of the result are the source's columns, read bottom to top.
        1 => ((0..w).flat_map(|i| (0..h).map(move |j| src[(h - 1 - j) * w + i])).collect(), h, w),
        2 => (src.iter().rev().copied().collect(), w, h),
        _ => ((0..w).flat_map(|i| (0..h).map(move |j| src[j * w + (w - 1 - i)])).collect(), h, w),
    }
}

/// `torch.flip` of one plane along its rows (`vertical`) or columns.
pub(crate) fn flip_plane(src: &[f32], w: usize, h: usize, vertical: bool) -> Vec<f32> {
    (0..h).flat_map(|y| (0..w).map(move |x| if vertical { src[(h - 1 - y) * w + x] } else { src[y * w + (w - 1 - x)] })).collect()
}

impl Node for LatentOp {
    fn schema(&self) -> NodeSchema {
        let l = |name: &str| InputSpec::link(name, IoType::LATENT);
        let s = match self {
            LatentOp::Add => NodeSchema::new("LatentAdd").category("latent/advanced").input(l("samples1")).input(l("samples2")),
            LatentOp::Subtract => NodeSchema::new("LatentSubtract").category("latent/advanced").input(l("samples1")).input(l("samples2")),
            LatentOp::Multiply => NodeSchema::new("LatentMultiply").category("latent/advanced").input(l("samples")).input(InputSpec::float("multiplier", 1.0).float_range(-10.0, 10.0).float_step(0.01)),
            LatentOp::Interpolate => NodeSchema::new("LatentInterpolate").category("latent/advanced").input(l("samples1")).input(l("samples2")).input(InputSpec::float("ratio", 1.0).float_range(0.0, 1.0).float_step(0.01)),
            LatentOp::Concat => NodeSchema::new("LatentConcat").category("latent/advanced").input(l("samples1")).input(l("samples2")).input(InputSpec::combo("dim", CONCAT_DIMS)),
            LatentOp::Cut => NodeSchema::new("LatentCut")
                .category("latent/advanced")
                .input(l("samples"))
                .input(InputSpec::combo("dim", CUT_DIMS))
                .input(InputSpec::int("index", 0).int_range(-MAX_RESOLUTION, MAX_RESOLUTION).int_step(1))
                .input(InputSpec::int("amount", 1).int_range(1, MAX_RESOLUTION).int_step(1)),
            LatentOp::Batch => NodeSchema::new("LatentBatch").category("latent/batch").input(l("samples1")).input(l("samples2")),
            LatentOp::BatchSeedBehavior => NodeSchema::new("LatentBatchSeedBehavior").category("latent/advanced").input(l("samples")).input(InputSpec::combo("seed_behavior", ["random", "fixed"]).combo_default("fixed")),
            LatentOp::FromBatch => NodeSchema::new("LatentFromBatch")
                .display_name("Latent From Batch")
                .category("latent/batch")
                .input(l("samples"))
                .input(InputSpec::int("batch_index", 0).int_range(0, 63))
                .input(InputSpec::int("length", 1).int_range(1, 64)),
            LatentOp::RepeatBatch => NodeSchema::new("RepeatLatentBatch").display_name("Repeat Latent Batch").category("latent/batch").input(l("samples")).input(InputSpec::int("amount", 1).int_range(1, 64)),
            LatentOp::Composite => NodeSchema::new("LatentComposite")
                .display_name("Latent Composite")
                .category("latent")
                .input(l("samples_to"))
                .input(l("samples_from"))
                .input(InputSpec::int("x", 0).int_range(0, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::int("y", 0).int_range(0, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::int("feather", 0).int_range(0, MAX_RESOLUTION).int_step(8)),
            LatentOp::Blend => NodeSchema::new("LatentBlend").display_name("Latent Blend").category("_for_testing").input(l("samples1")).input(l("samples2")).input(InputSpec::float("blend_factor", 0.5).float_range(0.0, 1.0).float_step(0.01)),
            LatentOp::Flip => NodeSchema::new("LatentFlip").display_name("Flip Latent").category("latent/transform").input(l("samples")).input(InputSpec::combo("flip_method", FLIPS)),
            LatentOp::Rotate => NodeSchema::new("LatentRotate").display_name("Rotate Latent").category("latent/transform").input(l("samples")).input(InputSpec::combo("rotation", ROTATIONS)),
            LatentOp::Crop => NodeSchema::new("LatentCrop")
                .display_name("Crop Latent")
                .category("latent/transform")
                .input(l("samples"))
                .input(InputSpec::int("width", 512).int_range(64, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::int("height", 512).int_range(64, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::int("x", 0).int_range(0, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::int("y", 0).int_range(0, MAX_RESOLUTION).int_step(8)),
            LatentOp::CompositeMasked => NodeSchema::new("LatentCompositeMasked")
                .category("latent")
                .input(l("destination"))
                .input(l("source"))
                .input(InputSpec::int("x", 0).int_range(0, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::int("y", 0).int_range(0, MAX_RESOLUTION).int_step(8))
                .input(InputSpec::boolean("resize_source", false))
                .input(InputSpec::link("mask", IoType::MASK).optional()),
        };
        s.output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        match self {
            LatentOp::Add | LatentOp::Subtract => {
                let (a, b) = (latent(inputs, "samples1")?, latent(inputs, "samples2")?);
                let (b, _) = reshape_to(Dims::of(a), b, "samples2", true)?;
                let sub = matches!(self, LatentOp::Subtract);
                let samples = a.samples.iter().zip(&b).map(|(x, y)| if sub { x - y } else { x + y }).collect();
                latent_out(Latent { samples, ..a.clone() })
            }
            LatentOp::Multiply => {
                let l = latent(inputs, "samples")?;
                let k = inputs.float("multiplier")? as f32;
                latent_out(Latent { samples: l.samples.iter().map(|v| v * k).collect(), ..l.clone() })
            }
            LatentOp::Interpolate => {
                let (a, b) = (latent(inputs, "samples1")?, latent(inputs, "samples2")?);
                let d = Dims::of(a);
                // ComfyUI divides [N, C, H, W] by norms of shape [N, H, W], which torch lines
                // up with the channel axis: one sample gets the per-pixel norm, N = C samples
                // get sample c's norm on channel c, and other batches fail there.
                if d.n != 1 && d.n != d.c {
                    return Err(invalid("samples1", format!("ComfyUI's LatentInterpolate takes one sample or as many samples as channels ({}); this latent has {}", d.c, d.n)));
                }
                let (b, _) = reshape_to(d, b, "samples2", true)?;
                let ratio = inputs.float("ratio")?;
                let (r, rest) = (ratio as f32, (1.0 - ratio) as f32);
                let hw = d.h * d.w;
                let norms = |v: &[f32]| -> Vec<f32> { (0..d.n * hw).map(|i| (0..d.c).map(|c| v[(i / hw * d.c + c) * hw + i % hw].powi(2)).sum::<f32>().sqrt()).collect() };
                let (m1, m2) = (norms(&a.samples), norms(&b));
                // The norm lined up with (sample n, channel c) at pixel p.
                let at = |m: &[f32], c: usize, p: usize| m[if d.n == 1 { p } else { c * hw + p }];
                let mut t = vec![0f32; d.len()];
                for (i, v) in t.iter_mut().enumerate() {
                    let (c, p) = (i / hw % d.c, i % hw);
                    *v = nan_to_num(a.samples[i] / at(&m1, c, p)) * r + nan_to_num(b[i] / at(&m2, c, p)) * rest;
                }
                let mt = norms(&t);
                let samples = t
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let (c, p) = (i / hw % d.c, i % hw);
                        nan_to_num(v / at(&mt, c, p)) * (at(&m1, c, p) * r + at(&m2, c, p) * rest)
                    })
                    .collect();
                latent_out(Latent { samples, ..a.clone() })
            }
            LatentOp::Concat => {
                let (a, b) = (latent(inputs, "samples1")?, latent(inputs, "samples2")?);
                let dim = choice(inputs, "dim", &CONCAT_DIMS)?;
                let (da, db) = (Dims::of(a), Dims::of(b));
                let b_data = repeat_to_batch(&b.samples, db.c * db.h * db.w, da.n);
                let db = Dims { n: da.n, ..db };
                let axis = match dim.trim_start_matches('-') {
                    "x" => 3,
                    "y" => 2,
                    _ => 1,
                };
                if (1..4).any(|k| k != axis && da.axis(k) != db.axis(k)) {
                    return Err(invalid("samples2", format!("its {}x{}, {} channels cannot be joined on `{dim}` to {}x{}, {} channels", db.w, db.h, db.c, da.w, da.h, da.c)));
                }
                let (samples, d) = if dim.starts_with('-') { cat(&b_data, db, &a.samples, da, axis) } else { cat(&a.samples, da, &b_data, db, axis) };
                latent_out(Latent { samples, shape: d.shape(), ..a.clone() })
            }
            LatentOp::Cut => {
                let l = latent(inputs, "samples")?;
                let d = Dims::of(l);
                let axis = match choice(inputs, "dim", &CUT_DIMS)? {
                    "x" => 3,
                    "y" => 2,
                    _ => 1,
                };
                let size = d.axis(axis) as i64;
                let (index, amount) = (inputs.int("index")?, inputs.int("amount")?);
                if amount < 1 {
                    return Err(invalid("amount", format!("must be at least 1, got {amount}")));
                }
                let (start, len) = if index >= 0 {
                    let i = index.min(size - 1);
                    (i, (size - i).min(amount))
                } else {
                    let i = index.max(-size);
                    (i + size, (-i).min(amount))
                };
                let (samples, d) = narrow(&l.samples, d, axis, start as usize, len as usize);
                latent_out(Latent { samples, shape: d.shape(), ..l.clone() })
            }
            LatentOp::Batch => {
                let (a, b) = (latent(inputs, "samples1")?, latent(inputs, "samples2")?);
                let da = Dims::of(a);
                let (b_data, db) = reshape_to(da, b, "samples2", false)?;
                let (samples, d) = cat(&a.samples, da, &b_data, db, 0);
                let first = a.batch_index.clone().unwrap_or_else(|| (0..da.n).collect());
                let second = b.batch_index.clone().unwrap_or_else(|| (0..db.n).collect());
                latent_out(Latent { samples, shape: d.shape(), batch_index: Some([first, second].concat()), ..a.clone() })
            }
            LatentOp::BatchSeedBehavior => {
                let l = latent(inputs, "samples")?;
                let batch_index = match choice(inputs, "seed_behavior", &["random", "fixed"])? {
                    "random" => None,
                    _ => Some(vec![l.batch_index.as_ref().and_then(|b| b.first().copied()).unwrap_or(0); Dims::of(l).n]),
                };
                latent_out(Latent { batch_index, ..l.clone() })
            }
            LatentOp::FromBatch => {
                let l = latent(inputs, "samples")?;
                let d = Dims::of(l);
                let (bi, length) = (inputs.int("batch_index")?, inputs.int("length")?);
                if bi < 0 {
                    return Err(invalid("batch_index", format!("must be >= 0, got {bi}")));
                }
                if length < 1 {
                    return Err(invalid("length", format!("must be at least 1, got {length}")));
                }
                let start = (bi as usize).min(d.n - 1);
                let len = (length as usize).min(d.n - start);
                let per = d.c * d.h * d.w;
                let samples = l.samples[start * per..(start + len) * per].to_vec();
                let noise_mask = l.noise_mask.as_ref().map(|m| {
                    if m.n == 1 {
                        m.clone()
                    } else {
                        let m = if m.n < d.n { cycle_mask(m, d.n) } else { (**m).clone() };
                        Arc::new(mask_samples(&m, py_slice(m.n, start as i64, (start + len) as i64)))
                    }
                });
                let batch_index = Some(match &l.batch_index {
                    None => (start..start + len).collect(),
                    Some(b) => b[py_slice(b.len(), start as i64, (start + len) as i64)].to_vec(),
                });
                latent_out(Latent { samples, shape: Dims { n: len, ..d }.shape(), noise_mask, batch_index, frames: l.frames })
            }
            LatentOp::RepeatBatch => {
                let l = latent(inputs, "samples")?;
                let amount = inputs.int("amount")?;
                if amount < 1 {
                    return Err(invalid("amount", format!("must be at least 1, got {amount}")));
                }
                let amount = amount as usize;
                let d = Dims::of(l);
                let n = d.n.checked_mul(amount).filter(|&n| n <= i64::MAX as usize).ok_or_else(|| invalid("amount", format!("{amount} copies are too many")))?;
                crate::image::latent::latent_zeros(Dims { n, ..d }.shape()).map_err(|e| invalid("amount", e.to_string()))?;
                let samples = l.samples.repeat(amount);
                // ComfyUI repeats a mask of several samples whole, like the latent.
                let noise_mask = l.noise_mask.as_ref().map(|m| if m.n > 1 { Arc::new(Mask { data: m.data.repeat(amount), n: m.n * amount, ..(**m).clone() }) } else { m.clone() });
                let batch_index = l.batch_index.as_ref().map(|b| {
                    let (lo, hi) = (b.iter().min().copied().unwrap_or(0), b.iter().max().copied().unwrap_or(0));
                    let offset = hi - lo + 1;
                    (0..amount).flat_map(|i| b.iter().map(move |x| x + i * offset)).collect()
                });
                latent_out(Latent { samples, shape: Dims { n: d.n * amount, ..d }.shape(), noise_mask, batch_index, frames: l.frames })
            }
            LatentOp::Composite => {
                let (to, from) = (latent(inputs, "samples_to")?, latent(inputs, "samples_from")?);
                let (x, y, feather) = (inputs.int("x")?, inputs.int("y")?, inputs.int("feather")?);
                for (name, v) in [("x", x), ("y", y), ("feather", feather)] {
                    if v < 0 {
                        return Err(invalid(name, format!("must be >= 0, got {v}")));
                    }
                }
                let (x, y, feather) = ((x / 8) as usize, (y / 8) as usize, (feather / 8) as usize);
                let (dt, df) = (Dims::of(to), Dims::of(from));
                if x >= dt.w || y >= dt.h {
                    return Err(invalid(if x >= dt.w { "x" } else { "y" }, format!("({}, {}) is outside the {}x{} latent", x * 8, y * 8, dt.w * 8, dt.h * 8)));
                }
                broadcastable(df, dt, "samples_from")?;
                // The part of `from` that fits: [:, :, :H − y, :W − x].
                let (fh, fw) = (df.h.min(dt.h - y), df.w.min(dt.w - x));
                let mut mask = vec![1f32; fh * fw];
                for t in 0..feather {
                    let k = ((1.0 / feather as f64) * (t + 1) as f64) as f32;
                    let mut scale_rows = |r: Range<usize>| r.for_each(|row| mask[row * fw..(row + 1) * fw].iter_mut().for_each(|m| *m *= k));
                    if y != 0 {
                        scale_rows(py_slice(fh, t as i64, t as i64 + 1));
                    }
                    if y + fh < dt.h {
                        scale_rows(py_slice(fh, fh as i64 - 1 - t as i64, fh as i64 - t as i64));
                    }
                    let mut scale_cols = |r: Range<usize>| r.for_each(|col| (0..fh).for_each(|row| mask[row * fw + col] *= k));
                    if x != 0 {
                        scale_cols(py_slice(fw, t as i64, t as i64 + 1));
                    }
                    if x + fw < dt.w {
                        scale_cols(py_slice(fw, fw as i64 - 1 - t as i64, fw as i64 - t as i64));
                    }
                }
                let mut samples = to.samples.clone();
                for n in 0..dt.n {
                    for c in 0..dt.c {
                        for row in 0..fh {
                            for col in 0..fw {
                                let src = from.samples[df.at(n.min(df.n - 1), c.min(df.c - 1), row, col)];
                                let o = dt.at(n, c, y + row, x + col);
                                samples[o] = if feather == 0 {
                                    src
                                } else {
                                    let m = mask[row * fw + col];
                                    src * m + samples[o] * (1.0 - m)
                                };
                            }
                        }
                    }
                }
                latent_out(Latent { samples, ..to.clone() })
            }
            LatentOp::Blend => {
                let (a, b) = (latent(inputs, "samples1")?, latent(inputs, "samples2")?);
                let factor = inputs.float("blend_factor")?;
                let (da, db) = (Dims::of(a), Dims::of(b));
                let (b_data, db) = if da != db {
                    let data = upscale_nchw(&b.samples, db, da.w, da.h, Method::Bicubic, true).map_err(|m| invalid("samples2", m))?;
                    (data, Dims { h: da.h, w: da.w, ..db })
                } else {
                    (b.samples.clone(), db)
                };
                broadcastable(db, da, "samples2")?;
                let (f, rest) = (factor as f32, (1.0 - factor) as f32);
                let mut samples = a.samples.clone();
                for n in 0..da.n {
                    for c in 0..da.c {
                        for p in 0..da.h * da.w {
                            let o = da.at(n, c, 0, 0) + p;
                            samples[o] = samples[o] * f + b_data[db.at(n.min(db.n - 1), c.min(db.c - 1), 0, 0) + p] * rest;
                        }
                    }
                }
                latent_out(Latent { samples, ..a.clone() })
            }
            LatentOp::Flip => {
                let l = latent(inputs, "samples")?;
                let vertical = choice(inputs, "flip_method", &FLIPS)?.starts_with('x');
                let d = Dims::of(l);
                let samples = l.samples.chunks(d.w * d.h).flat_map(|p| flip_plane(p, d.w, d.h, vertical)).collect();
                latent_out(Latent { samples, ..l.clone() })
            }
            LatentOp::Rotate => {
                let l = latent(inputs, "samples")?;
                let k = quarter_turns(choice(inputs, "rotation", &ROTATIONS)?);
                let d = Dims::of(l);
                let mut size = (d.w, d.h);
                let mut samples = Vec::with_capacity(l.samples.len());
                for p in l.samples.chunks(d.w * d.h) {
                    let (plane, w, h) = rot90_plane(p, d.w, d.h, k);
                    samples.extend(plane);
                    size = (w, h);
                }
                latent_out(Latent { samples, shape: Dims { w: size.0, h: size.1, ..d }.shape(), ..l.clone() })
            }
            LatentOp::Crop => {
                let l = latent(inputs, "samples")?;
                let d = Dims::of(l);
                let (width, height, x, y) = (inputs.int("width")?, inputs.int("height")?, inputs.int("x")?, inputs.int("y")?);
                // Python's floor division, and ComfyUI's clamp of the corner to 8 cells from
                // the far edge (which goes negative, counting from the end, on small latents).
                let (mut x, mut y) = (x.div_euclid(8), y.div_euclid(8));
                if x > d.w as i64 - 8 {
                    x = d.w as i64 - 8;
                }
                if y > d.h as i64 - 8 {
                    y = d.h as i64 - 8;
                }
                let (cols, rows) = (py_slice(d.w, x, x + width.div_euclid(8)), py_slice(d.h, y, y + height.div_euclid(8)));
                if cols.is_empty() || rows.is_empty() {
                    return Err(invalid(if cols.is_empty() { "width" } else { "height" }, format!("a {width}x{height} crop at ({}, {}) of a {}x{} latent is empty", x * 8, y * 8, d.w * 8, d.h * 8)));
                }
                let samples = l.samples.chunks(d.w * d.h).flat_map(|p| rows.clone().flat_map(|r| p[r * d.w + cols.start..r * d.w + cols.end].iter().copied())).collect();
                latent_out(Latent { samples, shape: Dims { w: cols.len(), h: rows.len(), ..d }.shape(), ..l.clone() })
            }
            LatentOp::CompositeMasked => {
                let (dst, src) = (latent(inputs, "destination")?, latent(inputs, "source")?);
                let (x, y) = (inputs.int("x")?, inputs.int("y")?);
                for (name, v) in [("x", x), ("y", y)] {
                    if v < 0 {
                        return Err(invalid(name, format!("must be >= 0, got {v}")));
                    }
                }
                let mask = if inputs.contains("mask") { Some(inputs.downcast::<Mask>("mask")?) } else { None };
                if mask.is_some_and(|m| m.n == 0 || m.width == 0 || m.height == 0 || m.data.len() != m.n * m.width * m.height) {
                    return Err(invalid("mask", "the mask is empty or malformed"));
                }
                let samples = composite(dst, src, (x as usize, y as usize), mask, 8, inputs.boolean("resize_source")?)?;
                latent_out(Latent { samples, ..dst.clone() })
            }
        }
    }
}

/// Whether `from` can be assigned or added onto `to` as torch broadcasts it: each of its
/// batch and channel sizes equal, or 1.
fn broadcastable(from: Dims, to: Dims, input: &str) -> Result<(), NodeError> {
    for (what, f, t) in [("samples", from.n, to.n), ("channels", from.c, to.c)] {
        if f != t && f != 1 {
            return Err(invalid(input, format!("{f} {what} against {t}")));
        }
    }
    Ok(())
}

/// nodes_mask's `composite` for latents (multiplier 8) on NCHW data: `source` (cycled to the
/// destination's batch, scaled to it with `resize`) pasted at (x, y)/`multiplier`, blended by
/// `mask` scaled bilinearly to the source.
fn composite(dst: &Latent, src: &Latent, (x, y): (usize, usize), mask: Option<&Mask>, multiplier: usize, resize: bool) -> Result<Vec<f32>, NodeError> {
    let (dd, ds) = (Dims::of(dst), Dims::of(src));
    if ds.c != dd.c {
        return Err(invalid("source", format!("{} channels against the destination's {}", ds.c, dd.c)));
    }
    let (src_data, ds) = if resize {
        (upscale_nchw(&src.samples, ds, dd.w, dd.h, Method::Bilinear, false).map_err(|m| invalid("source", m))?, Dims { w: dd.w, h: dd.h, ..ds })
    } else {
        (src.samples.clone(), ds)
    };
    let per = ds.c * ds.h * ds.w;
    let src_data = repeat_to_batch(&src_data, per, dd.n);
    let ds = Dims { n: dd.n, ..ds };
    let x = x.min(dd.w * multiplier);
    let y = y.min(dd.h * multiplier);
    let (left, top) = (x / multiplier, y / multiplier);
    let (vw, vh) = ((dd.w - left).min(ds.w), (dd.h - top).min(ds.h));
    let masks: Option<Vec<Vec<f32>>> = mask.map(|m| {
        let planes: Vec<Vec<f32>> = (0..m.n).map(|i| resize_plane(&m.data[i * m.width * m.height..(i + 1) * m.width * m.height], m.width, m.height, ds.w, ds.h, Method::Bilinear)).collect();
        (0..ds.n).map(|i| planes[i % planes.len()].clone()).collect()
    });
    let mut out = dst.samples.clone();
    for n in 0..dd.n {
        for c in 0..dd.c {
            for row in 0..vh {
                for col in 0..vw {
                    let k = masks.as_ref().map_or(1.0, |m| m[n][row * ds.w + col]);
                    let o = dd.at(n, c, top + row, left + col);
                    out[o] = k * src_data[ds.at(n, c, row, col)] + (1.0 - k) * out[o];
                }
            }
        }
    }
    Ok(out)
}
