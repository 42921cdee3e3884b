//! Brownian-tree noise: per-step noise that is a fixed function of the seed and the sigma
//! interval, so changing the step count samples the same underlying Brownian path.
//!
//! Semantics follow k-diffusion's `BrownianTreeNoiseSampler`: `noise(sigma, sigma_next)` is
//! `sign * (W(hi) - W(lo)) / sqrt(hi - lo)` for the path `W` on `[sigma_min, sigma_max]`,
//! with `sign = -1` when stepping down. The path itself is ours, not torchsde's: `W` is
//! built by Brownian-bridge bisection from the root interval, each node's normals coming
//! from Philox keyed by the seed and counted by the node's heap index, and below a width of
//! `(sigma_max - sigma_min) * 2^-20` the path is linear. Values therefore match torchsde in
//! distribution and in every structural property, not bit for bit.

use super::rng::{philox4x32_10, PhiloxRng};

/// Bisection depth at which the path becomes linear: leaves of relative width 2^-20
/// (1.4e-5 over SD's sigma range, far below the gap between any two schedule sigmas, which
/// is what keeps the increments Gaussian with the right variance).
const MAX_DEPTH: u32 = 20;
/// Counter word that separates tree normals from [`PhiloxRng`]'s own stream.
const TREE_TAG: u32 = 0x4254_5245;

/// One bisection interval on the way down to a query point.
#[derive(Debug, Clone)]
struct Level {
    a: f64,
    b: f64,
    id: u64,
    wa: Vec<f32>,
    wb: Vec<f32>,
}

/// Recent `W(t)` values kept: a sampler's step `i` needs `W(sigma_{i+1})` and the
/// `W(sigma_i)` that step `i - 1` computed.
const MEMO: usize = 4;

/// A seeded Brownian path over `[t0, t1]`, sampled at arbitrary points.
///
/// The descent path of the last query is kept, so a query near the previous one (the next
/// sigma of a schedule) only bisects below their common ancestor.
#[derive(Debug, Clone)]
pub struct BrownianTreeNoise {
    len: usize,
    t0: f64,
    t1: f64,
    key: [u32; 2],
    path: Vec<Level>,
    memo: Vec<(f64, Vec<f32>)>,
}

impl BrownianTreeNoise {
    /// A path for latents of `len` values over `[sigma_min, sigma_max]`.
    pub fn new(len: usize, sigma_min: f32, sigma_max: f32, seed: u64) -> Self {
        let (lo, hi) = if sigma_min <= sigma_max {
            (sigma_min, sigma_max)
        } else {
            (sigma_max, sigma_min)
        };
        let (t0, t1) = (lo as f64, hi as f64);
        let key = [seed as u32, (seed >> 32) as u32];
        let mut tree = BrownianTreeNoise {
            len,
            t0,
            t1,
            key,
            path: Vec::new(),
            memo: Vec::new(),
        };
        let scale = ((t1 - t0).max(0.0)).sqrt() as f32;
        // Id 0 is the end point W(t1); bisection nodes are numbered from 1 (heap order).
        let w_end = tree
            .node_normals(0)
            .into_iter()
            .map(|z| z * scale)
            .collect();
        tree.path.push(Level {
            a: t0,
            b: t1,
            id: 1,
            wa: vec![0.0; len],
            wb: w_end,
        });
        tree
    }

    /// For the sigmas a sampler will visit: the smallest positive one to the largest.
    pub fn for_sigmas(len: usize, sigmas: &[f32], seed: u64) -> Self {
        let max = sigmas.iter().copied().fold(0.0f32, f32::max);
        let min = sigmas
            .iter()
            .copied()
            .filter(|&s| s > 0.0)
            .fold(f32::INFINITY, f32::min);
        let min = if min.is_finite() { min } else { 0.0 };
        Self::new(len, min, max, seed)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn node_normals(&self, id: u64) -> Vec<f32> {
        (0..self.len)
            .map(|i| {
                let g = philox4x32_10([id as u32, (id >> 32) as u32, i as u32, TREE_TAG], self.key);
                PhiloxRng::box_muller(g[0], g[1])
            })
            .collect()
    }

    /// W(t), by bisecting from the root with Brownian-bridge midpoints.
    pub fn w(&mut self, t: f64) -> Vec<f32> {
        let t = t.clamp(self.t0, self.t1);
        if let Some((_, v)) = self.memo.iter().find(|(mt, _)| *mt == t) {
            return v.clone();
        }
        let v = self.descend(t);
        if self.memo.len() == MEMO {
            self.memo.remove(0);
        }
        self.memo.push((t, v.clone()));
        v
    }

    fn descend(&mut self, t: f64) -> Vec<f32> {
        // Keep the cached levels whose interval still contains t (they are nested).
        let keep = self
            .path
            .iter()
            .take_while(|l| l.a <= t && t <= l.b)
            .count()
            .max(1);
        self.path.truncate(keep);
        loop {
            let depth = self.path.len() - 1;
            let level = &self.path[depth];
            if t == level.a {
                return level.wa.clone();
            }
            if t == level.b {
                return level.wb.clone();
            }
            if depth as u32 >= MAX_DEPTH {
                let f = ((t - level.a) / (level.b - level.a)) as f32;
                return level
                    .wa
                    .iter()
                    .zip(&level.wb)
                    .map(|(&x, &y)| x + f * (y - x))
                    .collect();
            }
            let m = 0.5 * (level.a + level.b);
            let sd = (0.25 * (level.b - level.a)).sqrt() as f32;
            let z = self.node_normals(level.id);
            let level = &self.path[depth];
            let wm: Vec<f32> = level
                .wa
                .iter()
                .zip(&level.wb)
                .zip(&z)
                .map(|((&x, &y), &n)| 0.5 * (x + y) + sd * n)
                .collect();
            if t == m {
                return wm;
            }
            let next = if t < m {
                Level {
                    a: level.a,
                    b: m,
                    id: level.id * 2,
                    wa: level.wa.clone(),
                    wb: wm,
                }
            } else {
                Level {
                    a: m,
                    b: level.b,
                    id: level.id * 2 + 1,
                    wa: wm,
                    wb: level.wb.clone(),
                }
            };
            self.path.push(next);
        }
    }

    /// Unit-variance noise for the step from `sigma` to `sigma_next`.
    pub fn noise(&mut self, sigma: f32, sigma_next: f32) -> Vec<f32> {
        let (lo, hi, sign) = if sigma <= sigma_next {
            (sigma, sigma_next, 1.0f32)
        } else {
            (sigma_next, sigma, -1.0f32)
        };
        let (lo, hi) = (
            (lo as f64).clamp(self.t0, self.t1),
            (hi as f64).clamp(self.t0, self.t1),
        );
        if hi <= lo {
            return vec![0.0; self.len];
        }
        let inv = sign / ((hi - lo).sqrt() as f32);
        let wl = self.w(lo);
        let wh = self.w(hi);
        wh.iter().zip(&wl).map(|(&h, &l)| (h - l) * inv).collect()
    }
}
