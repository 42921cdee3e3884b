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

// Handles are owned by the residency manager; they cost the output cache nothing.
macro_rules! handle_size {
    ($($t:ty),*) => {$(
        impl CacheSize for $t {
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
}

impl CacheSize for Latent {
    fn cache_bytes(&self) -> usize {
        self.samples.len() * 4
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
