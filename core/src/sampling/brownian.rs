//! Brownian-tree noise: per-step noise that is a fixed function of the seed and the sigma
//! interval, so changing the step count samples the same underlying Brownian path.
//!
//! Semantics follow k-diffusion's `BrownianTreeNoiseSampler`: `noise(sigma, sigma_next)` is
//! `sign * (W(hi) - W(lo)) / sqrt(hi - lo)` for the path `W` on `[sigma_min, sigma_max]`,
//! with `sign = -1` when stepping down. The path itself is ours, not torchsde's: `W` is
//! built by Brownian-bridge bisection from the root interval, each node's normals coming
//! from Philox keyed by the seed and counted by the node's heap index, and below a width of
//! `(sigma_max - sigma_min) * 2^-24` the path is linear. Values therefore match torchsde in
//! distribution and in every structural property, not bit for bit.

use super::rng::{philox4x32_10, PhiloxRng};

/// Bisection depth at which the path becomes linear (relative width 2^-24, f32 resolution).
const MAX_DEPTH: u32 = 24;
/// Counter word that separates tree normals from [`PhiloxRng`]'s own stream.
const TREE_TAG: u32 = 0x4254_5245;

/// A seeded Brownian path over `[t0, t1]`, sampled at arbitrary points.
#[derive(Debug, Clone)]
pub struct BrownianTreeNoise {
    len: usize,
    t0: f64,
    t1: f64,
    key: [u32; 2],
    /// W(t1); W(t0) is zero.
    w_end: Vec<f32>,
}

impl BrownianTreeNoise {
    /// A path for latents of `len` values over `[sigma_min, sigma_max]`.
    pub fn new(len: usize, sigma_min: f32, sigma_max: f32, seed: u64) -> Self {
        let (lo, hi) = if sigma_min <= sigma_max { (sigma_min, sigma_max) } else { (sigma_max, sigma_min) };
        let (t0, t1) = (lo as f64, hi as f64);
        let key = [seed as u32, (seed >> 32) as u32];
        let mut tree = BrownianTreeNoise { len, t0, t1, key, w_end: Vec::new() };
        let scale = ((t1 - t0).max(0.0)).sqrt() as f32;
        // Id 0 is the end point; bisection nodes are numbered from 1 (heap order).
        tree.w_end = tree.node_normals(0).into_iter().map(|z| z * scale).collect();
        tree
    }

    /// For the sigmas a sampler will visit: the smallest positive one to the largest.
    pub fn for_sigmas(len: usize, sigmas: &[f32], seed: u64) -> Self {
        let max = sigmas.iter().copied().fold(0.0f32, f32::max);
        let min = sigmas.iter().copied().filter(|&s| s > 0.0).fold(f32::INFINITY, f32::min);
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
    pub fn w(&self, t: f64) -> Vec<f32> {
        let t = t.clamp(self.t0, self.t1);
        let (mut a, mut b) = (self.t0, self.t1);
        let mut wa = vec![0f32; self.len];
        let mut wb = self.w_end.clone();
        if t == a {
            return wa;
        }
        if t == b {
            return wb;
        }
        let mut id: u64 = 1;
        for _ in 0..MAX_DEPTH {
            let m = 0.5 * (a + b);
            let sd = (0.25 * (b - a)).sqrt() as f32;
            let z = self.node_normals(id);
            let wm: Vec<f32> =
                wa.iter().zip(&wb).zip(&z).map(|((&x, &y), &n)| 0.5 * (x + y) + sd * n).collect();
            if t == m {
                return wm;
            }
            if t < m {
                b = m;
                wb = wm;
                id *= 2;
            } else {
                a = m;
                wa = wm;
                id = id * 2 + 1;
            }
        }
        let f = ((t - a) / (b - a)) as f32;
        wa.iter().zip(&wb).map(|(&x, &y)| x + f * (y - x)).collect()
    }

    /// Unit-variance noise for the step from `sigma` to `sigma_next`.
    pub fn noise(&self, sigma: f32, sigma_next: f32) -> Vec<f32> {
        let (lo, hi, sign) =
            if sigma <= sigma_next { (sigma, sigma_next, 1.0f32) } else { (sigma_next, sigma, -1.0f32) };
        let (lo, hi) = ((lo as f64).clamp(self.t0, self.t1), (hi as f64).clamp(self.t0, self.t1));
        if hi <= lo {
            return vec![0.0; self.len];
        }
        let inv = sign / ((hi - lo).sqrt() as f32);
        let (wl, wh) = (self.w(lo), self.w(hi));
        wh.iter().zip(&wl).map(|(&h, &l)| (h - l) * inv).collect()
    }
}
