//! Qwen-Image as a k-diffusion denoiser over flow latents: tokens of 2×2 patches, the
//! model reads σ and predicts the velocity, so `denoised = x − σ·v`.

use super::{ImageGrid, QwenImage, QwenImageInputs};
use crate::ggml::{Backend, Context, GraphAllocator, GraphRun};
use crate::models::conditioning::{Conditioning, LatentShape};
use crate::models::dit::{crop, in_groups, pad_to_patches, patchify, unpatchify};
use crate::models::{ModelError, Result};

/// One item of [`QwenImageDenoiser::denoise_batch`]: a latent (model space, [W, H, C, N])
/// and the text features it is denoised under.
#[derive(Clone, Copy, Debug)]
pub struct QwenImageItem<'a> {
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
}

pub struct QwenImageDenoiser<'w> {
    model: QwenImage<'w>,
    alloc: Option<GraphAllocator>,
}

impl<'w> QwenImageDenoiser<'w> {
    pub fn new(model: QwenImage<'w>) -> Self {
        QwenImageDenoiser { model, alloc: None }
    }

    pub fn config(&self) -> &super::QwenImageConfig {
        &self.model.config
    }

    /// The denoised estimate of each item at noise level `sigma`; items whose texts have
    /// the same token count share one graph.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[QwenImageItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape;
        if shape.iter().any(|&d| d < 1) || ch != c.latent_channels {
            return Err(ModelError::Input(format!("a {shape:?} latent for a Qwen-Image model of {} latent channels", c.latent_channels)));
        }
        let per = (w * h * ch * n) as usize;
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != per {
                return Err(ModelError::Input(format!("item {k}: latent of {} values for shape {shape:?}", it.x.len())));
            }
            if it.cond.dim != c.context || it.cond.tokens < 1 {
                return Err(ModelError::Input(format!(
                    "item {k}: {} text tokens {} wide; this Qwen-Image model reads {} wide ones (Qwen2.5-VL-7B's hidden states)",
                    it.cond.tokens, it.cond.dim, c.context
                )));
            }
            if !it.cond.references.is_empty() {
                return Err(ModelError::Input(format!("item {k}: reference latents (Qwen-Image-Edit) are not supported yet")));
            }
        }
        in_groups(items, |it| it.cond.tokens, |members| self.run(backend, shape, sigma, members))
    }

    fn run(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[QwenImageItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w0, h0, ch, n] = shape.map(|d| d as usize);
        let p = c.patch as usize;
        let b = items.len() * n;
        let lt = items[0].cond.tokens as usize;
        // Padded to whole patches by wrapping around (ComfyUI's `pad_to_patch_size`), the
        // output cropped back.
        let (h, w) = (h0.div_ceil(p) * p, w0.div_ceil(p) * p);
        let (per0, per) = (ch * h0 * w0, ch * h * w);
        let mut img = Vec::with_capacity(b * per);
        let mut txt = Vec::with_capacity(b * lt * c.context as usize);
        for it in items {
            for j in 0..n {
                let (padded, _, _) = pad_to_patches(&it.x[j * per0..(j + 1) * per0], [ch, h0, w0], p);
                img.extend(patchify(&padded, [1, ch, h, w], p)?);
                txt.extend_from_slice(&it.cond.data);
            }
        }
        let grids = [ImageGrid { rows: h / p, cols: w / p }];
        let graph_size = 512 * c.layers + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let bi = b as i64;
        let img_t = run.input_f32(&[c.latent_channels * c.patch * c.patch, (grids[0].rows * grids[0].cols) as i64, bi], img)?;
        let txt_t = run.input_f32(&[c.context, lt as i64, bi], txt)?;
        let timesteps = vec![sigma; b];
        let v = self.model.forward(&ctx, &mut run, &QwenImageInputs { img: img_t, grids: &grids, txt: txt_t, timesteps: &timesteps })?;
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let v = run.compute_with(backend, alloc, &[v], graph_size)?.remove(0);
        let v = unpatchify(&v, [b, ch, h, w], p)?;
        let v: Vec<f32> = if (h, w) == (h0, w0) { v } else { v.chunks_exact(per).flat_map(|s| crop(s, [ch, h, w], h0, w0)).collect() };
        let per = n * per0;
        Ok(items.iter().enumerate().map(|(k, it)| it.x.iter().zip(&v[k * per..(k + 1) * per]).map(|(x, v)| x - sigma * v).collect()).collect())
    }
}
