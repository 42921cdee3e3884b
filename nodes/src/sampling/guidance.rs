//! ComfyUI's conditioning math for one guided model evaluation (`comfy/samplers.py`):
//! areas and masks resolved at the latent's size (`resolve_areas_and_cond_masks`), the
//! opposite side given an entry of the same area (`create_cond_with_same_area_if_none`),
//! and each step every active entry run on its region and blended with its weights
//! (`get_area_and_mult`, `calc_cond_batch`), then mixed by CFG or dual CFG.
//!
//! The model is a closure here, so the math is tested on toy denoisers without a UNet.

use crate::values::{CondArea, CondConcat, CondEntry, CondList, Control};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::sampling::samplers::Denoised;
use std::sync::Arc;

/// A region of the latent in cells, in ComfyUI's `area` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub h: usize,
    pub w: usize,
    pub y: usize,
    pub x: usize,
}

/// An entry resolved for sampling a latent of one size.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub cond: Arc<Conditioning>,
    pub timestep_range: Option<(f32, f32)>,
    pub step_range: Option<(f32, f32)>,
    pub strength: f32,
    /// (height, width, y, x) in cells, not yet clamped to the latent (as ComfyUI keeps it).
    pub area: Option<(i64, i64, i64, i64)>,
    /// The mask at latent size, `mask_n` planes, and its strength.
    pub mask: Option<(Arc<Vec<f32>>, usize, f32)>,
    /// The UNet's extra input channels for the whole latent, every sample.
    pub concat: Option<Arc<Vec<f32>>>,
    /// The entry's ControlNets.
    pub control: Option<Arc<Control>>,
}

/// Python's `round` (ties to even), which ComfyUI uses for percentage areas.
fn py_round(v: f64) -> i64 {
    v.round_ties_even() as i64
}

/// Resolve `lists` (ComfyUI's dict order: positive, [middle,] negative) for a `w`×`h`
/// latent. `concat_of` gives the full-size extra channels of an entry's concat source.
pub fn prepare(lists: &[&CondList], w: usize, h: usize, concat_of: &mut dyn FnMut(&CondConcat) -> Result<Option<Arc<Vec<f32>>>, String>) -> Result<Vec<Vec<Prepared>>, String> {
    let mut out: Vec<Vec<Prepared>> = Vec::with_capacity(lists.len());
    for list in lists {
        let mut side = Vec::with_capacity(list.0.len());
        for e in &list.0 {
            side.push(prepare_entry(e, w, h, concat_of)?);
        }
        out.push(side);
    }
    // Every area entry gets a counterpart of the same area on each other side, built
    // from the smallest entry there whose area contains it; lists grow as they are
    // walked, as ComfyUI's do.
    for k in 0..out.len() {
        let mut i = 0;
        while i < out[k].len() {
            let c = out[k][i].clone();
            for kk in 0..out.len() {
                if kk != k {
                    same_area_counterpart(&mut out[kk], &c);
                }
            }
            i += 1;
        }
    }
    Ok(out)
}

fn prepare_entry(e: &CondEntry, w: usize, h: usize, concat_of: &mut dyn FnMut(&CondConcat) -> Result<Option<Arc<Vec<f32>>>, String>) -> Result<Prepared, String> {
    let mut area = e.area.map(|a| match a {
        CondArea::Cells { height, width, y, x } => (height, width, y, x),
        CondArea::Fraction { height, width, y, x } => {
            (py_round(height * h as f64).max(1), py_round(width * w as f64).max(1), py_round(y * h as f64), py_round(x * w as f64))
        }
    });
    let mut mask = None;
    if let Some(m) = &e.mask {
        if m.mask.n == 0 || m.mask.width == 0 || m.mask.height == 0 || m.mask.data.len() != m.mask.n * m.mask.width * m.mask.height {
            return Err(format!("the conditioning mask of {}×{}×{} has {} values", m.mask.n, m.mask.height, m.mask.width, m.mask.data.len()));
        }
        let planes: Vec<f32> = (0..m.mask.n).flat_map(|i| m.mask.resized(i, w, h)).collect();
        if m.area_to_bounds {
            let mut bounds = vec![0f32; w * h];
            for p in planes.chunks(w * h) {
                bounds.iter_mut().zip(p).for_each(|(b, v)| *b = b.max(v.abs()));
            }
            let (mut x0, mut y0, mut x1, mut y1) = (usize::MAX, usize::MAX, 0, 0);
            for (i, _) in bounds.iter().enumerate().filter(|(_, v)| **v != 0.0) {
                let (y, x) = (i / w, i % w);
                (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
            }
            area = Some(if x0 == usize::MAX {
                // An all-zero mask: the smallest area, which contributes nothing anyway.
                (8, 8, 0, 0)
            } else {
                (((y1 - y0 + 1) as i64).max(8), ((x1 - x0 + 1) as i64).max(8), y0 as i64, x0 as i64)
            });
        }
        mask = Some((Arc::new(planes), m.mask.n, m.strength));
    }
    Ok(Prepared { cond: e.cond.clone(), timestep_range: e.timestep_range, step_range: e.step_range, strength: e.strength, area, mask, concat: concat_of(&e.concat)?, control: e.control.clone() })
}

fn same_area_counterpart(conds: &mut Vec<Prepared>, c: &Prepared) {
    let Some(ca) = c.area else { return };
    let inside = |a: (i64, i64, i64, i64)| ca.2 >= a.2 && ca.3 >= a.3 && ca.0 + ca.2 <= a.0 + a.2 && ca.1 + ca.3 <= a.1 + a.3;
    let mut smallest: Option<usize> = None;
    for (i, x) in conds.iter().enumerate() {
        match (x.area, smallest.map(|s| conds[s].area)) {
            (Some(a), None) if inside(a) => smallest = Some(i),
            (Some(a), Some(None)) if inside(a) => smallest = Some(i),
            (Some(a), Some(Some(s))) if inside(a) && s.0 * s.1 > a.0 * a.1 => smallest = Some(i),
            (None, None) => smallest = Some(i),
            _ => {}
        }
    }
    let Some(s) = smallest else { return };
    if conds[s].area == Some(ca) {
        return;
    }
    let mut out = c.clone();
    out.cond = conds[s].cond.clone();
    out.concat = conds[s].concat.clone();
    conds.push(out);
}

/// ComfyUI's `apply_empty_x_to_equal_area` for `control`: the controls of positive
/// entries marked `apply_to_uncond` (the old ControlNetApply) go onto the negative's
/// entries without an area, unless some negative entry without an area has a control of
/// its own; the k-th such control onto the (k mod count)-th control-less entry, replacing
/// its control, or as a copy when that entry already got one.
pub fn apply_controls_to_uncond(positive: &[Prepared], negative: &mut Vec<Prepared>) {
    let given: Vec<Arc<Control>> = positive.iter().filter(|p| p.area.is_none()).filter_map(|p| p.control.clone()).filter(|c| c.apply_to_uncond).collect();
    if negative.iter().any(|n| n.area.is_none() && n.control.is_some()) {
        return;
    }
    let free: Vec<usize> = (0..negative.len()).filter(|&i| negative[i].area.is_none()).collect();
    if free.is_empty() {
        return;
    }
    for (k, c) in given.into_iter().enumerate() {
        let at = free[k % free.len()];
        if negative[at].control.is_some() {
            let copy = Prepared { control: Some(c), ..negative[at].clone() };
            negative.push(copy);
        } else {
            negative[at].control = Some(c);
        }
    }
}

/// One entry's model evaluation at one step: its region and per-sample weights.
struct Job<'a> {
    side: usize,
    p: &'a Prepared,
    region: Region,
    /// `n` planes of `region.h × region.w`.
    mult: Vec<f32>,
}

fn job<'a>(side: usize, p: &'a Prepared, w: usize, h: usize, n: usize) -> Result<Job<'a>, String> {
    let region = match p.area {
        None => Region { h, w, y: 0, x: 0 },
        Some((ah, aw, y, x)) => {
            let (rh, rw) = (ah.min(h as i64 - y), aw.min(w as i64 - x));
            if y < 0 || x < 0 || rh < 1 || rw < 1 {
                return Err(format!("a conditioning area of {ah}×{aw} cells at ({x}, {y}) lies outside the {w}×{h} latent"));
            }
            Region { h: rh as usize, w: rw as usize, y: y as usize, x: x as usize }
        }
    };
    let size = region.h * region.w;
    let mut mult = Vec::with_capacity(size * n);
    match &p.mask {
        Some((planes, mn, ms)) => {
            if n % mn != 0 && *mn < n {
                return Err(format!("a conditioning mask of {mn} samples does not fit a batch of {n}"));
            }
            for i in 0..n {
                let plane = &planes[(i % mn) * w * h..(i % mn + 1) * w * h];
                for y in region.y..region.y + region.h {
                    mult.extend(plane[y * w + region.x..y * w + region.x + region.w].iter().map(|m| m * ms * p.strength));
                }
            }
        }
        None => {
            let mut one = vec![p.strength; size];
            if p.area.is_some() {
                // Feathered edges where the area does not reach the latent's border.
                let scale = |rr: usize, t: usize| ((1.0f64 / rr as f64) * (t + 1) as f64) as f32;
                let rr = 8.min(region.h / 4);
                for t in 0..rr {
                    if region.y != 0 {
                        one[t * region.w..(t + 1) * region.w].iter_mut().for_each(|v| *v *= scale(rr, t));
                    }
                    if region.y + region.h < h {
                        let r = region.h - 1 - t;
                        one[r * region.w..(r + 1) * region.w].iter_mut().for_each(|v| *v *= scale(rr, t));
                    }
                }
                let rr = 8.min(region.w / 4);
                for t in 0..rr {
                    for row in one.chunks_mut(region.w) {
                        if region.x != 0 {
                            row[t] *= scale(rr, t);
                        }
                        if region.x + region.w < w {
                            row[region.w - 1 - t] *= scale(rr, t);
                        }
                    }
                }
            }
            for _ in 0..n {
                mult.extend_from_slice(&one);
            }
        }
    }
    Ok(Job { side, p, region, mult })
}

/// One model input of [`calc_cond_batch`]: a region's latent and extra channels.
pub struct ModelItem<'a> {
    pub x: Vec<f32>,
    pub cond: &'a Conditioning,
    pub concat: Option<Vec<f32>>,
    /// The index in `sides` of the side the item belongs to.
    pub side: usize,
    /// The entry's ControlNets; their hints are the whole hint image resized to the
    /// region, as ComfyUI's `get_control` does for an area's crop of the latent.
    pub control: Option<&'a Arc<Control>>,
}

/// Crop `c` channels of every sample of a `w`×`h` tensor to `r`.
fn crop(v: &[f32], w: usize, h: usize, c: usize, n: usize, r: Region) -> Vec<f32> {
    let mut out = Vec::with_capacity(r.h * r.w * c * n);
    for plane in v.chunks(w * h).take(c * n) {
        for y in r.y..r.y + r.h {
            out.extend_from_slice(&plane[y * w + r.x..y * w + r.x + r.w]);
        }
    }
    out
}

/// The denoised prediction of each side of `sides` (`None`: the side is skipped) for
/// the latent `x` of `shape` ([W, H, C, N]), entries filtered by `active`. `model` runs
/// a batch of items of one region shape ([w, h, C, N]) and returns their denoised
/// predictions; regions of equal size are batched up to `budget` latent cells.
#[allow(clippy::too_many_arguments)]
pub fn calc_cond_batch<E>(
    sides: &[Option<&[Prepared]>],
    x: &[f32],
    shape: [i64; 4],
    extra_channels: usize,
    active: &dyn Fn(&Prepared) -> bool,
    budget: usize,
    model: &mut dyn FnMut(&[ModelItem<'_>], [i64; 4]) -> Result<Vec<Vec<f32>>, E>,
) -> Result<Vec<Option<Vec<f32>>>, CalcError<E>> {
    let [w, h, c, n] = shape.map(|d| d as usize);
    let mut jobs = Vec::new();
    for (s, list) in sides.iter().enumerate() {
        for p in list.iter().flat_map(|l| l.iter()).filter(|p| active(p)) {
            jobs.push(job(s, p, w, h, n).map_err(CalcError::Input)?);
        }
    }
    let mut out: Vec<Option<(Vec<f32>, Vec<f32>)>> = sides.iter().map(|s| s.map(|_| (vec![0f32; x.len()], vec![1e-37f32; x.len()]))).collect();
    let mut pending: Vec<usize> = (0..jobs.len()).collect();
    while let Some(&first) = pending.first() {
        let size = (jobs[first].region.h, jobs[first].region.w);
        let mut batch = Vec::new();
        let mut cells = 0;
        pending.retain(|&k| {
            let r = jobs[k].region;
            let take = (r.h, r.w) == size && (batch.is_empty() || cells + r.h * r.w * n <= budget);
            if take {
                batch.push(k);
                cells += r.h * r.w * n;
            }
            !take
        });
        let items: Vec<ModelItem<'_>> = batch
            .iter()
            .map(|&k| {
                let j = &jobs[k];
                ModelItem { x: crop(x, w, h, c, n, j.region), cond: &j.p.cond, concat: j.p.concat.as_ref().map(|cc| crop(cc, w, h, extra_channels, n, j.region)), side: j.side, control: j.p.control.as_ref() }
            })
            .collect();
        let preds = model(&items, [size.1 as i64, size.0 as i64, c as i64, n as i64]).map_err(CalcError::Model)?;
        for (&k, d) in batch.iter().zip(&preds) {
            let j = &jobs[k];
            let (acc, count) = out[j.side].as_mut().expect("jobs only for evaluated sides");
            let r = j.region;
            for i in 0..n {
                let m = &j.mult[i * r.h * r.w..(i + 1) * r.h * r.w];
                for ch in 0..c {
                    let src = &d[(i * c + ch) * r.h * r.w..(i * c + ch + 1) * r.h * r.w];
                    let base = (i * c + ch) * w * h;
                    for yy in 0..r.h {
                        for xx in 0..r.w {
                            let o = base + (r.y + yy) * w + r.x + xx;
                            let k = yy * r.w + xx;
                            acc[o] += src[k] * m[k];
                            count[o] += m[k];
                        }
                    }
                }
            }
        }
    }
    Ok(out.into_iter().map(|o| o.map(|(a, c)| a.iter().zip(&c).map(|(a, c)| a / c).collect())).collect())
}

#[derive(Debug)]
pub enum CalcError<E> {
    Input(String),
    Model(E),
}

/// How the sides are mixed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mix {
    /// Positive only.
    Positive,
    /// `negative + cfg·(positive − negative)`.
    Cfg { cfg: f32 },
    /// ComfyUI's DualCFGGuider, which is sd.cpp's image-CFG guidance:
    /// regular `negative + cfg_middle·(middle − negative) + cfg·(positive − middle)`;
    /// nested `negative + cfg_middle·((middle + cfg·(positive − middle)) − negative)`.
    Dual { cfg: f32, cfg_middle: f32, nested: bool },
}

impl Mix {
    /// Which of (positive, middle, negative) must be evaluated: ComfyUI's skipping of
    /// passes whose weight vanishes (cfg 1), and sd.cpp's of the middle pass when both
    /// scales agree (its weight is then zero). `need_negative`: the sampler reads the
    /// unconditional prediction (CFG++).
    pub fn passes(self, need_negative: bool) -> (bool, bool) {
        match self {
            Mix::Positive => (false, need_negative),
            Mix::Cfg { cfg } => (false, cfg != 1.0 || need_negative),
            Mix::Dual { cfg, cfg_middle, nested: false } => (cfg != cfg_middle, cfg_middle != 1.0 || need_negative),
            Mix::Dual { cfg, cfg_middle, nested: true } => (cfg != 1.0, cfg_middle != 1.0 || need_negative),
        }
    }

    /// Mix the side predictions (positive, middle, negative); skipped ones are `None`.
    pub fn mix(self, pos: Vec<f32>, mid: Option<Vec<f32>>, neg: Option<Vec<f32>>) -> Denoised {
        let denoised = match (self, &mid, &neg) {
            (Mix::Cfg { cfg }, _, Some(u)) => u.iter().zip(&pos).map(|(u, c)| u + (c - u) * cfg).collect(),
            (Mix::Dual { cfg, cfg_middle, nested: false }, Some(m), Some(u)) => {
                u.iter().zip(m).zip(&pos).map(|((u, m), p)| u + (m - u) * cfg_middle + (p - m) * cfg).collect()
            }
            (Mix::Dual { cfg, nested: false, .. }, Some(m), None) => m.iter().zip(&pos).map(|(m, p)| m + (p - m) * cfg).collect(),
            (Mix::Dual { cfg, nested: false, .. }, None, Some(u)) => u.iter().zip(&pos).map(|(u, p)| u + (p - u) * cfg).collect(),
            (Mix::Dual { cfg, cfg_middle, nested: true }, Some(m), Some(u)) => {
                u.iter().zip(m).zip(&pos).map(|((u, m), p)| u + ((m + (p - m) * cfg) - u) * cfg_middle).collect()
            }
            (Mix::Dual { cfg, nested: true, .. }, Some(m), None) => m.iter().zip(&pos).map(|(m, p)| m + (p - m) * cfg).collect(),
            (Mix::Dual { cfg_middle, nested: true, .. }, None, Some(u)) => u.iter().zip(&pos).map(|(u, p)| u + (p - u) * cfg_middle).collect(),
            _ => pos,
        };
        Denoised { denoised, uncond: neg }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{CondMask, Mask};

    fn cond(v: f32) -> Conditioning {
        Conditioning::new(vec![v; 4], 2, 2).unwrap()
    }

    /// A toy model whose output depends on the conditioning, the input and the position
    /// inside the region it is given, so wrong crops or placements show.
    fn toy(items: &[ModelItem<'_>], shape: [i64; 4]) -> Result<Vec<Vec<f32>>, ()> {
        let (w, h) = (shape[0] as usize, shape[1] as usize);
        Ok(items
            .iter()
            .map(|it| it.x.iter().enumerate().map(|(i, v)| v * 0.5 + it.cond.data[0] + 0.01 * ((i % w) + 2 * ((i / w) % h)) as f32).collect())
            .collect())
    }

    fn run(lists: &[&CondList], x: &[f32], shape: [i64; 4]) -> Vec<Vec<f32>> {
        let prepared = prepare(lists, shape[0] as usize, shape[1] as usize, &mut |_| Ok(None)).unwrap();
        let sides: Vec<Option<&[Prepared]>> = prepared.iter().map(|p| Some(p.as_slice())).collect();
        calc_cond_batch(&sides, x, shape, 0, &|_| true, usize::MAX, &mut toy).unwrap().into_iter().map(Option::unwrap).collect()
    }

    fn area(e: &CondEntry, h: i64, w: i64, y: i64, x: i64, s: f32) -> CondEntry {
        CondEntry { area: Some(CondArea::Cells { height: h, width: w, y, x }), strength: s, ..e.clone() }
    }

    #[test]
    fn whole_latent_area_at_strength_one_is_no_area() {
        let shape = [12, 10, 2, 2];
        let x: Vec<f32> = (0..480).map(|i| (i as f32 * 0.37).sin()).collect();
        let plain = CondList(vec![CondEntry::new(cond(0.3))]);
        let whole = CondList(vec![area(&plain.0[0], 10, 12, 0, 0, 1.0)]);
        assert_eq!(run(&[&plain], &x, shape), run(&[&whole], &x, shape));
        // Fractions of 1 and areas past the border clamp to the same.
        let big = CondList(vec![area(&plain.0[0], 100, 100, 0, 0, 1.0)]);
        assert_eq!(run(&[&plain], &x, shape), run(&[&big], &x, shape));
    }

    #[test]
    fn an_area_changes_only_its_region() {
        let shape = [16, 16, 1, 1];
        let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.11).cos()).collect();
        let base = CondEntry::new(cond(0.2));
        let other = CondEntry::new(cond(-1.0));
        let alone = run(&[&CondList(vec![base.clone()])], &x, shape);
        let with = run(&[&CondList(vec![base.clone(), area(&other, 8, 8, 4, 4, 1.0)])], &x, shape);
        for y in 0..16 {
            for xx in 0..16 {
                let i = y * 16 + xx;
                let inside = (4..12).contains(&y) && (4..12).contains(&xx);
                if inside {
                    assert_ne!(alone[0][i], with[0][i], "({xx}, {y}) is inside the area");
                } else {
                    assert_eq!(alone[0][i], with[0][i], "({xx}, {y}) is outside the area");
                }
            }
        }
        // In the middle of the area (past the 2-cell feather), both weigh 1: the mean of
        // the two predictions, the area's computed on its own crop (local position).
        let i = 7 * 16 + 7;
        let local = 0.01 * (3 + 2 * 3) as f32;
        let expect = (alone[0][i] + (x[i] * 0.5 - 1.0 + local)) / 2.0;
        assert!((with[0][i] - expect).abs() < 1e-6, "{} vs {expect}", with[0][i]);
    }

    #[test]
    fn feathering_follows_comfyui() {
        // A 16-wide area at x 8 of a 32-wide latent: rr = min(8, 16 / 4) = 4, ramps
        // 1/4, 2/4, 3/4, 4/4 from each inner edge; none at the latent's own border.
        let p = Prepared { cond: Arc::new(cond(0.0)), timestep_range: None, step_range: None, strength: 2.0, area: Some((4, 16, 0, 8)), mask: None, concat: None, control: None };
        let j = job(0, &p, 32, 8, 1).unwrap();
        let row: Vec<f32> = j.mult[..16].to_vec();
        assert_eq!(&row[..4], &[0.5, 1.0, 1.5, 2.0]);
        assert_eq!(&row[12..], &[2.0, 1.5, 1.0, 0.5]);
        // The bottom edge (y 0 + 4 < 8) is feathered with rr = 1: a factor of 1.
        assert_eq!(j.region, Region { h: 4, w: 16, y: 0, x: 8 });
    }

    #[test]
    fn a_mask_weights_by_its_values_and_bounds_crop() {
        let shape = [8, 8, 1, 1];
        let x: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
        let base = CondEntry::new(cond(0.5));
        let mut m = vec![0f32; 64];
        for y in 2..5 {
            for xx in 1..4 {
                m[y * 8 + xx] = 1.0;
            }
        }
        let mask = Arc::new(Mask { data: m.clone(), n: 1, height: 8, width: 8 });
        let masked = |bounds: bool| CondEntry { mask: Some(CondMask { mask: mask.clone(), strength: 1.0, area_to_bounds: bounds }), ..CondEntry::new(cond(2.0)) };
        let alone = run(&[&CondList(vec![base.clone()])], &x, shape);
        let with = run(&[&CondList(vec![base.clone(), masked(false)])], &x, shape);
        for i in 0..64 {
            if m[i] == 0.0 {
                assert_eq!(alone[0][i], with[0][i]);
            } else {
                let own = x[i] * 0.5 + 2.0 + 0.01 * ((i % 8) + 2 * (i / 8)) as f32;
                assert!((with[0][i] - (alone[0][i] + own) / 2.0).abs() < 1e-6);
            }
        }
        // "mask bounds": the box is 3×3, widened to 8×8 from its corner and clamped to
        // the latent: a region of 6 rows × 7 columns at (1, 2).
        let p = prepare(&[&CondList(vec![masked(true)])], 8, 8, &mut |_| Ok(None)).unwrap();
        assert_eq!(p[0][0].area, Some((8, 8, 2, 1)));
        assert_eq!(job(0, &p[0][0], 8, 8, 1).unwrap().region, Region { h: 6, w: 7, y: 2, x: 1 });
    }

    #[test]
    fn the_other_side_gets_an_entry_of_the_same_area() {
        let pos = CondList(vec![CondEntry::new(cond(1.0)), area(&CondEntry::new(cond(2.0)), 4, 4, 2, 2, 0.5)]);
        let neg = CondList(vec![CondEntry::new(cond(-1.0))]);
        let p = prepare(&[&pos, &neg], 8, 8, &mut |_| Ok(None)).unwrap();
        assert_eq!(p[0].len(), 2);
        assert_eq!(p[1].len(), 2);
        let copy = &p[1][1];
        assert_eq!(copy.area, Some((4, 4, 2, 2)));
        assert_eq!(copy.strength, 0.5);
        assert_eq!(copy.cond.data[0], -1.0, "the negative's embedding");
    }

    #[test]
    fn percentage_areas_round_like_python() {
        let e = CondEntry { area: Some(CondArea::Fraction { height: 0.5, width: 0.25, y: 0.3125, x: 0.5 }), ..CondEntry::new(cond(0.0)) };
        let p = prepare(&[&CondList(vec![e])], 10, 8, &mut |_| Ok(None)).unwrap();
        // 0.25·10 = 2.5 → 2 and 0.3125·8 = 2.5 → 2 (ties to even), 0.5·8 = 4, 0.5·10 = 5.
        assert_eq!(p[0][0].area, Some((4, 2, 2, 5)));
    }

    #[test]
    fn mixes() {
        let (p, m, u) = (vec![3.0f32], vec![2.0f32], vec![1.0f32]);
        let d = Mix::Dual { cfg: 4.0, cfg_middle: 1.5, nested: false }.mix(p.clone(), Some(m.clone()), Some(u.clone()));
        assert_eq!(d.denoised, vec![1.0 + 1.5 * 1.0 + 4.0 * 1.0]);
        let d = Mix::Dual { cfg: 4.0, cfg_middle: 1.5, nested: true }.mix(p.clone(), Some(m), Some(u.clone()));
        assert_eq!(d.denoised, vec![1.0 + 1.5 * ((2.0 + 4.0) - 1.0)]);
        // Equal scales drop the middle pass: the same as plain CFG.
        assert_eq!(Mix::Dual { cfg: 4.0, cfg_middle: 4.0, nested: false }.passes(false), (false, true));
        let d = Mix::Dual { cfg: 4.0, cfg_middle: 4.0, nested: false }.mix(p.clone(), None, Some(u.clone()));
        assert_eq!(d.denoised, Mix::Cfg { cfg: 4.0 }.mix(p, None, Some(u)).denoised);
        assert_eq!(Mix::Dual { cfg: 1.0, cfg_middle: 1.0, nested: false }.passes(false), (false, false));
        assert_eq!(Mix::Dual { cfg: 3.0, cfg_middle: 1.0, nested: false }.passes(false), (true, false));
    }
}
