//! SD3 as a k-diffusion denoiser over flow latents: `denoised = x − σ·v`, the latent cut
//! into patches and every item's text batched into one graph.

use super::{Sd3, Sd3Inputs};
use crate::ggml::{Backend, Context, GraphAllocator, GraphRun};
use crate::models::conditioning::{Conditioning, LatentShape};
use crate::models::dit::{crop, in_groups, pad_to_patches, patchify, unpatchify_hwc};
use crate::models::{ModelError, Result};

/// SD3's VAE latent format (ComfyUI's `latent_formats.SD3`): the model sees
/// `(latent − LATENT_SHIFT) · LATENT_SCALE`.
pub const LATENT_SCALE: f32 = 1.5305;
pub const LATENT_SHIFT: f32 = 0.0609;

/// One item of [`Sd3Denoiser::denoise_batch`]: a latent (model space, [W, H, C, N]) and its
/// conditioning (CLIP-L|G and T5 tokens, the pooled CLIP-L|G vector).
#[derive(Clone, Copy, Debug)]
pub struct Sd3Item<'a> {
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
}

pub struct Sd3Denoiser<'w> {
    model: Sd3<'w>,
    alloc: Option<GraphAllocator>,
}

impl<'w> Sd3Denoiser<'w> {
    pub fn new(model: Sd3<'w>) -> Self {
        Sd3Denoiser { model, alloc: None }
    }

    pub fn config(&self) -> &super::Sd3Config {
        &self.model.config
    }

    /// The denoised estimate of each item at noise level `sigma`, the joint blocks in
    /// `skip` left out; items whose text has the same token count share one graph.
    pub fn denoise_batch(
        &mut self,
        backend: &Backend,
        shape: LatentShape,
        sigma: f32,
        items: &[Sd3Item<'_>],
        skip: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape;
        if shape.iter().any(|&d| d < 1) || ch != c.in_channels {
            return Err(ModelError::Input(format!(
                "a {shape:?} latent for an SD3 model of {} latent channels",
                c.in_channels
            )));
        }
        let per = (w * h * ch * n) as usize;
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != per {
                return Err(ModelError::Input(format!(
                    "item {k}: latent of {} values for shape {shape:?}",
                    it.x.len()
                )));
            }
            if it.cond.dim != c.context {
                return Err(ModelError::Input(format!(
                    "item {k}: text tokens {} wide; this SD3 model reads {}",
                    it.cond.dim, c.context
                )));
            }
            if let Some(pooled) = &it.cond.pooled {
                if pooled.len() as i64 != c.pooled {
                    return Err(ModelError::Input(format!("item {k}: a pooled vector of {}; this SD3 model reads {} (CLIP-L and CLIP-G)", pooled.len(), c.pooled)));
                }
            }
        }
        in_groups(items, |it| it.cond.tokens, |members| self.run(backend, shape, sigma, members, skip))
    }

    fn run(
        &mut self,
        backend: &Backend,
        shape: LatentShape,
        sigma: f32,
        items: &[Sd3Item<'_>],
        skip: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w0, h0, ch, n] = shape.map(|d| d as usize);
        let p = c.patch as usize;
        let b = items.len() * n;
        let lt = items[0].cond.tokens as usize;
        // ComfyUI's MMDiT pads a latent to whole patches by wrapping around and crops the
        // output back.
        let (h, w) = (h0.div_ceil(p) * p, w0.div_ceil(p) * p);
        let per0 = ch * h0 * w0;
        let per = ch * h * w;
        let mut img = Vec::with_capacity(b * per);
        let mut txt = Vec::with_capacity(b * lt * c.context as usize);
        let mut y = Vec::with_capacity(b * c.pooled as usize);
        for it in items {
            for j in 0..n {
                let (padded, _, _) = pad_to_patches(&it.x[j * per0..(j + 1) * per0], [ch, h0, w0], p);
                img.extend(patchify(&padded, [1, ch, h, w], p)?);
                txt.extend_from_slice(&it.cond.data);
                match &it.cond.pooled {
                    Some(v) => y.extend_from_slice(v),
                    // ComfyUI's SD3 without CLIP-L and CLIP-G: zeros.
                    None => y.extend(std::iter::repeat_n(0.0, c.pooled as usize)),
                }
            }
        }
        let (rows, cols) = ((h / p) as i64, (w / p) as i64);
        let graph_size = 768 * c.depth + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let bi = b as i64;
        let img_t = run.input_f32(&[c.in_channels * c.patch * c.patch, rows * cols, bi], img)?;
        let txt_t = run.input_f32(&[c.context, lt as i64, bi], txt)?;
        let y_t = run.input_f32(&[c.pooled, bi], y)?;
        let timesteps = vec![sigma; b];
        let inputs = Sd3Inputs {
            img: img_t,
            rows,
            cols,
            txt: txt_t,
            timesteps: &timesteps,
            y: y_t,
            skip,
        };
        let v = self.model.forward(&ctx, &mut run, &inputs)?;
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let v = run
            .compute_with(backend, alloc, &[v], graph_size)?
            .remove(0);
        let v = unpatchify_hwc(&v, [b, ch, h, w], p)?;
        let v: Vec<f32> = if (h, w) == (h0, w0) { v } else { v.chunks_exact(per).flat_map(|s| crop(s, [ch, h, w], h0, w0)).collect() };
        let per = n * per0;
        Ok(items
            .iter()
            .enumerate()
            .map(|(k, it)| {
                it.x.iter()
                    .zip(&v[k * per..(k + 1) * per])
                    .map(|(x, v)| x - sigma * v)
                    .collect()
            })
            .collect())
    }
}
