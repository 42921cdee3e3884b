//! The typed values on links between these nodes.

use sdflow_core::detect::ModelFamily;
use sdflow_core::models::clip::ClipLayout;
use sdflow_core::models::sd::{Conditioning, Prediction};
use sdflow_core::models::Weights;
use sdflow_core::residency::WeightHandle;
use sdflow_executor::CacheSize;
use std::sync::Arc;

/// MODEL: the diffusion model of a checkpoint, as a residency handle.
#[derive(Clone, Debug)]
pub struct ModelRef {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    pub family: ModelFamily,
    pub prediction: Prediction,
    /// Latent scale of the family's VAE (0.18215 for SD1.x/2.x).
    pub latent_scale: f32,
}

/// CLIP: a text encoder, with the clip-skip set by CLIPSetLastLayer (`None`: the
/// family's default).
#[derive(Clone, Debug)]
pub struct ClipRef {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    pub layout: ClipLayout,
    pub family: ModelFamily,
    pub clip_skip: Option<u32>,
}

/// VAE.
#[derive(Clone, Debug)]
pub struct VaeRef {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
}

// Handles are owned by the residency manager (and small settings cost next to nothing):
// they count nothing against the output cache.
#[macro_export]
#[doc(hidden)]
macro_rules! handle_size {
    ($($t:ty),*) => {$(
        impl sdflow_executor::CacheSize for $t {
            fn cache_bytes(&self) -> usize {
                0
            }
        }
    )*};
}
handle_size!(ModelRef, ClipRef, VaeRef);

/// CONDITIONING: ComfyUI's list of (embedding, options) entries.
#[derive(Clone, Debug)]
pub struct CondList(pub Vec<CondEntry>);

#[derive(Clone, Debug)]
pub struct CondEntry {
    pub cond: Arc<Conditioning>,
    /// ComfyUI's `start_percent`/`end_percent` (ConditioningSetTimestepRange): the entry
    /// guides only while sampling is between these fractions of the schedule.
    pub timestep_range: Option<(f32, f32)>,
}

impl CondEntry {
    pub fn new(cond: Conditioning) -> Self {
        CondEntry { cond: Arc::new(cond), timestep_range: None }
    }
}

impl CacheSize for CondList {
    fn cache_bytes(&self) -> usize {
        self.0.iter().map(|e| e.cond.data.len() * 4).sum()
    }
}

/// LATENT: VAE-space latents (not yet multiplied by the latent scale), dimensions
/// [W, H, C, N] in ggml order, i.e. NCHW in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Latent {
    pub samples: Vec<f32>,
    pub shape: [i64; 4],
    /// Where sampling may change the latent (1) and where it must keep it (0), at any
    /// resolution (resized to the latent when sampling), as ComfyUI's `noise_mask`.
    pub noise_mask: Option<Arc<Mask>>,
}

impl CacheSize for Latent {
    fn cache_bytes(&self) -> usize {
        (self.samples.len() + self.noise_mask.as_ref().map_or(0, |m| m.data.len())) * 4
    }
}

/// IMAGE: ComfyUI's layout, [N, H, W, C] floats in 0..=1.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    pub data: Vec<f32>,
    pub n: usize,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

impl CacheSize for Image {
    fn cache_bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// MASK: [N, H, W] floats in 0..=1 (1 = masked).
#[derive(Clone, Debug, PartialEq)]
pub struct Mask {
    pub data: Vec<f32>,
    pub n: usize,
    pub height: usize,
    pub width: usize,
}

impl CacheSize for Mask {
    fn cache_bytes(&self) -> usize {
        self.data.len() * 4
    }
}

impl Mask {
    /// Bilinear resize of sample `i` (the last one when the mask has fewer samples) to
    /// `w`×`h`, with half-pixel centres like `torch.nn.functional.interpolate`.
    pub fn resized(&self, i: usize, w: usize, h: usize) -> Vec<f32> {
        let i = i.min(self.n.saturating_sub(1));
        let src = &self.data[i * self.height * self.width..(i + 1) * self.height * self.width];
        let (sw, sh) = (self.width as f32, self.height as f32);
        let mut out = Vec::with_capacity(w * h);
        for y in 0..h {
            let fy = ((y as f32 + 0.5) * sh / h as f32 - 0.5).clamp(0.0, sh - 1.0);
            let (y0, dy) = (fy.floor() as usize, fy - fy.floor());
            let y1 = (y0 + 1).min(self.height - 1);
            for x in 0..w {
                let fx = ((x as f32 + 0.5) * sw / w as f32 - 0.5).clamp(0.0, sw - 1.0);
                let (x0, dx) = (fx.floor() as usize, fx - fx.floor());
                let x1 = (x0 + 1).min(self.width - 1);
                let p = |yy: usize, xx: usize| src[yy * self.width + xx];
                out.push(p(y0, x0) * (1.0 - dy) * (1.0 - dx) + p(y0, x1) * (1.0 - dy) * dx + p(y1, x0) * dy * (1.0 - dx) + p(y1, x1) * dy * dx);
            }
        }
        out
    }
}
