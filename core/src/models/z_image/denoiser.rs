//! Z-Image as a k-diffusion denoiser over flow latents. The model reads `1000·(1 − σ)`
//! and predicts the negated velocity (diffusers' `ZImagePipeline`, ComfyUI's Lumina-2
//! `1 − t` and `-img`, sd.cpp's `1000 − t` and `scale(−1)`), so `denoised = x + σ·out`.

use super::{ZImage, ZImageInputs};
use crate::ggml::{Backend, Circular, Context, GraphAllocator, GraphRun};
use crate::models::conditioning::{Conditioning, LatentShape};
use crate::models::dit::{crop, in_groups, pad_to_patches, patchify_hwc, unpatchify_hwc};
use crate::models::{ModelError, Result};

/// One item of [`ZImageDenoiser::denoise_batch`]: a latent (model space, [W, H, C, N]) and
/// the caption features it is denoised under.
#[derive(Clone, Copy, Debug)]
pub struct ZImageItem<'a> {
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
}

pub struct ZImageDenoiser<'w> {
    model: ZImage<'w>,
    alloc: Option<GraphAllocator>,
    /// Seamless tiling on these axes (sd.cpp's `--circular*`): the rotary embedding wraps
    /// the image's rows and columns (the latent is already padded to whole patches by
    /// wrapping around).
    pub circular: Circular,
}

impl<'w> ZImageDenoiser<'w> {
    pub fn new(model: ZImage<'w>) -> Self {
        ZImageDenoiser { model, alloc: None, circular: Circular::NONE }
    }

    pub fn config(&self) -> &super::ZImageConfig {
        &self.model.config
    }

    /// The denoised estimate of each item at noise level `sigma`; items whose captions
    /// have the same token count share one graph.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[ZImageItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape;
        if shape.iter().any(|&d| d < 1) || ch != c.in_channels {
            return Err(ModelError::Input(format!("a {shape:?} latent for a Z-Image model of {} latent channels", c.in_channels)));
        }
        let per = (w * h * ch * n) as usize;
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != per {
                return Err(ModelError::Input(format!("item {k}: latent of {} values for shape {shape:?}", it.x.len())));
            }
            if it.cond.dim != c.caption || it.cond.tokens < 1 {
                return Err(ModelError::Input(format!(
                    "item {k}: {} caption tokens {} wide; this Z-Image model reads {} wide ones (Qwen3-4B's hidden states)",
                    it.cond.tokens, it.cond.dim, c.caption
                )));
            }
            if !it.cond.references.is_empty() {
                return Err(ModelError::Input(format!("item {k}: reference latents on a Z-Image Turbo/Base model (only Omni reads references)")));
            }
        }
        in_groups(items, |it| it.cond.tokens, |members| self.run(backend, shape, sigma, members))
    }

    fn run(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[ZImageItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w0, h0, ch, n] = shape.map(|d| d as usize);
        let p = c.patch as usize;
        let b = items.len() * n;
        let lc = items[0].cond.tokens as usize;
        // Padded to whole patches by wrapping around (ComfyUI's `pad_to_patch_size`), the
        // output cropped back.
        let (h, w) = (h0.div_ceil(p) * p, w0.div_ceil(p) * p);
        let (per0, per) = (ch * h0 * w0, ch * h * w);
        let mut img = Vec::with_capacity(b * per);
        let mut cap = Vec::with_capacity(b * lc * c.caption as usize);
        for it in items {
            for j in 0..n {
                let (padded, _, _) = pad_to_patches(&it.x[j * per0..(j + 1) * per0], [ch, h0, w0], p);
                img.extend(patchify_hwc(&padded, [1, ch, h, w], p)?);
                cap.extend_from_slice(&it.cond.data);
            }
        }
        let (rows, cols) = ((h / p) as i64, (w / p) as i64);
        let blocks = c.layers + c.noise_refiners + c.context_refiners;
        let graph_size = 512 * blocks + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let bi = b as i64;
        let img_t = run.input_f32(&[c.in_channels * c.patch * c.patch, rows * cols, bi], img)?;
        let cap_t = run.input_f32(&[c.caption, lc as i64, bi], cap)?;
        let timesteps = vec![1000.0 * (1.0 - sigma); b];
        let out = self.model.forward(&ctx, &mut run, &ZImageInputs { img: img_t, rows, cols, cap: cap_t, timesteps: &timesteps, circular: self.circular })?;
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let out = run.compute_with(backend, alloc, &[out], graph_size)?.remove(0);
        let out = unpatchify_hwc(&out, [b, ch, h, w], p)?;
        let out: Vec<f32> = if (h, w) == (h0, w0) { out } else { out.chunks_exact(per).flat_map(|s| crop(s, [ch, h, w], h0, w0)).collect() };
        let per = n * per0;
        Ok(items.iter().enumerate().map(|(k, it)| it.x.iter().zip(&out[k * per..(k + 1) * per]).map(|(x, o)| x + sigma * o).collect()).collect())
    }
}
