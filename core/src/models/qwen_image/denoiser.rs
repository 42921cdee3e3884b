//! Qwen-Image as a k-diffusion denoiser over flow latents: tokens of 2×2 patches, the
//! model reads σ and predicts the velocity, so `denoised = x − σ·v`. Reference latents
//! (Qwen-Image-Edit) are normalised as the model's latent, cut into patches and follow
//! the image's tokens, reference k as frame k; only the image's outputs are kept.
//!
//! Qwen-Image-Layered denoises a latent of several frames (ComfyUI's [B, C, T, H, W],
//! here channel-major planes [C][T][H][W] per sample: `frames` × the model's channels);
//! its frames are frames 0 … T − 1 and its references count down from −1.

use super::{ImageGrid, QwenImage, QwenImageInputs};
use crate::ggml::{Backend, Circular, Context, GraphAllocator, GraphRun};
use crate::models::conditioning::{Conditioning, LatentShape, ReferenceLatent, ReferenceMethod};
use crate::models::vae::wan::{LATENTS_MEAN, LATENTS_STD};
use crate::models::dit::{channel_major, crop, frame_of, in_groups, pad_to_patches, patchify, unpatchify};
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
    /// Seamless tiling on these axes (sd.cpp's `--circular*`): the rotary embedding wraps
    /// the image's rows and columns (the latent is already padded to whole patches by
    /// wrapping around).
    pub circular: Circular,
    /// Frames per latent (1; Qwen-Image-Layered: its layers + 1), stacked in the
    /// channels as ComfyUI's video latents are.
    pub frames: usize,
}

impl<'w> QwenImageDenoiser<'w> {
    pub fn new(model: QwenImage<'w>) -> Self {
        QwenImageDenoiser { model, alloc: None, circular: Circular::NONE, frames: 1 }
    }

    pub fn config(&self) -> &super::QwenImageConfig {
        &self.model.config
    }

    /// The denoised estimate of each item at noise level `sigma`; items whose texts have
    /// the same token count share one graph.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[QwenImageItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape;
        if shape.iter().any(|&d| d < 1) || self.frames == 0 || ch != c.latent_channels * self.frames as i64 {
            let frames = if self.frames == 1 { String::new() } else { format!(" × {} frames", self.frames) };
            return Err(ModelError::Input(format!("a {shape:?} latent for a Qwen-Image model of {} latent channels{frames}", c.latent_channels)));
        }
        if self.frames > 1 && !c.additional_t {
            return Err(ModelError::Input(format!("a latent of {} frames: only Qwen-Image-Layered denoises several frames (this model has no `time_text_embed.addition_t_embedding`)", self.frames)));
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
            if let Some(r) = it.cond.references.iter().find(|r| r.channels != c.latent_channels as usize || r.data.len() != r.channels * r.height * r.width || r.height == 0 || r.width == 0) {
                return Err(ModelError::Input(format!("item {k}: a reference latent of {} values as {}x{}x{}; Qwen-Image's latents have {} channels (encode it with its VAE)", r.data.len(), r.channels, r.height, r.width, c.latent_channels)));
            }
            if let Some(m) = it.cond.reference_method.filter(|m| !matches!(m, ReferenceMethod::Index | ReferenceMethod::IndexTimestepZero | ReferenceMethod::NegativeIndex)) {
                return Err(ModelError::Input(format!("item {k}: reference method {m:?} on Qwen-Image (it places references by index)")));
            }
        }
        let key = |it: &QwenImageItem<'_>| (it.cond.tokens, it.cond.references.iter().map(|r| (r.height, r.width)).collect::<Vec<_>>(), it.cond.reference_method);
        in_groups(items, key, |members| self.run(backend, shape, sigma, members))
    }

    fn run(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[QwenImageItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w0, h0, _, n] = shape.map(|d| d as usize);
        let (ch, frames) = (c.latent_channels as usize, self.frames);
        let p = c.patch as usize;
        let b = items.len() * n;
        let lt = items[0].cond.tokens as usize;
        // Padded to whole patches by wrapping around (ComfyUI's `pad_to_patch_size`), the
        // output cropped back.
        let (h, w) = (h0.div_ceil(p) * p, w0.div_ceil(p) * p);
        let (per0, per) = (ch * h0 * w0, ch * h * w);
        let refs = &items[0].cond.references;
        // ComfyUI's `index` counts references up from frame 1, `negative_index` (the
        // layered model's default, sd.cpp's DECREASE) down from −1; an Edit-2511 file's
        // flag makes `index_timestep_zero` its default.
        let default = match (c.additional_t, c.zero_cond_t) {
            (true, _) => ReferenceMethod::NegativeIndex,
            (false, true) => ReferenceMethod::IndexTimestepZero,
            (false, false) => ReferenceMethod::Index,
        };
        let method = items[0].cond.reference_method.unwrap_or(default);
        let step = if method == ReferenceMethod::NegativeIndex { -1 } else { 1 };
        let mut grids: Vec<ImageGrid> = (0..frames as i32).map(|f| ImageGrid { rows: h / p, cols: w / p, frame: f }).collect();
        grids.extend(refs.iter().zip(1..).map(|(r, k)| ImageGrid { rows: r.height.div_ceil(p), cols: r.width.div_ceil(p), frame: step * k }));
        let tokens: usize = grids.iter().map(|g| g.rows * g.cols).sum();
        let width = (c.latent_channels * c.patch * c.patch) as usize;
        let mut img = Vec::with_capacity(b * tokens * width);
        let mut txt = Vec::with_capacity(b * lt * c.context as usize);
        let item_refs: Vec<Vec<f32>> = items.iter().map(|it| it.cond.references.iter().map(|r| reference_tokens(r, p)).collect::<Result<Vec<_>>>().map(|v| v.concat())).collect::<Result<_>>()?;
        let plane = h0 * w0;
        for (it, r) in items.iter().zip(&item_refs) {
            for j in 0..n {
                let sample = &it.x[j * frames * per0..(j + 1) * frames * per0];
                for f in 0..frames {
                    let (padded, _, _) = pad_to_patches(&frame_of(sample, ch, frames, plane, f), [ch, h0, w0], p);
                    img.extend(patchify(&padded, [1, ch, h, w], p)?);
                }
                img.extend_from_slice(r);
                txt.extend_from_slice(&it.cond.data);
            }
        }
        let graph_size = 512 * c.layers + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let bi = b as i64;
        let img_t = run.input_f32(&[width as i64, tokens as i64, bi], img)?;
        let txt_t = run.input_f32(&[c.context, lt as i64, bi], txt)?;
        let timesteps = vec![sigma; b];
        let ref_timestep_zero = method == ReferenceMethod::IndexTimestepZero;
        let v = self.model.forward(&ctx, &mut run, &QwenImageInputs { img: img_t, grids: &grids, outputs: frames, txt: txt_t, timesteps: &timesteps, ref_timestep_zero, circular: self.circular })?;
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let v = run.compute_with(backend, alloc, &[v], graph_size)?.remove(0);
        // Tokens of (sample, frame) in order → planes [C][T][H][W] per sample.
        let v = unpatchify(&v, [b * frames, ch, h, w], p)?;
        let v: Vec<f32> = if (h, w) == (h0, w0) { v } else { v.chunks_exact(per).flat_map(|s| crop(s, [ch, h, w], h0, w0)).collect() };
        let v = channel_major(&v, ch, frames, plane);
        let per = n * frames * per0;
        Ok(items.iter().enumerate().map(|(k, it)| it.x.iter().zip(&v[k * per..(k + 1) * per]).map(|(x, v)| x - sigma * v).collect()).collect())
    }
}

/// A reference latent (VAE space) as the model's tokens: normalised with the VAE's
/// per-channel statistics, padded to whole patches by wrapping around, cut into patches.
fn reference_tokens(r: &ReferenceLatent, p: usize) -> Result<Vec<f32>> {
    if r.channels != LATENTS_MEAN.len() {
        return Err(ModelError::Input(format!("a {}-channel reference latent; the Wan-2.1 VAE's have {}", r.channels, LATENTS_MEAN.len())));
    }
    let plane = r.height * r.width;
    let normed: Vec<f32> = r.data.iter().enumerate().map(|(i, v)| (v - LATENTS_MEAN[i / plane]) / LATENTS_STD[i / plane]).collect();
    let (padded, h, w) = pad_to_patches(&normed, [r.channels, r.height, r.width], p);
    patchify(&padded, [1, r.channels, h, w], p)
}
