//! Wan as a k-diffusion denoiser over flow latents: a video latent (ComfyUI's
//! [B, C, T, H, W], here planes [C][T][H][W] per sample, `frames` × the model's channels),
//! cut into 1×2×2 patches frame by frame; the model reads σ·1000 and predicts the
//! velocity, so `denoised = x − σ·v`.
//!
//! I2V models read more channels than they denoise: the items' `concat` (ComfyUI's
//! `concat_mask` and `concat_latent_image`, already in model space) follows the noisy
//! latent's channels.

use super::{VaceTokens, Wan, WanInputs, PATCH};
use crate::ggml::{Backend, Context, GraphAllocator, GraphRun};
use crate::models::conditioning::{Conditioning, LatentShape};
use crate::models::dit::{channel_major, crop, frame_of, in_groups, pad_to_patches, patchify, unpatchify_hwc};
use crate::models::{ModelError, Result};

/// One item of [`WanDenoiser::denoise_batch`]: a latent (model space, [W, H, C·T, N]), the
/// text features it is denoised under, and for I2V models the channels that follow it.
#[derive(Clone, Copy, Debug)]
pub struct WanItem<'a> {
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
    /// [W, H, (in − out)·T, N]: the mask and image latent channels (I2V), frames inside
    /// channels as `x`'s.
    pub concat: Option<&'a [f32]>,
    /// CLIP-vision features [image_dim, tokens] (Wan2.1 I2V / FLF2V).
    pub image: Option<&'a [f32]>,
    /// VACE controls (a VACE model reads at least one).
    pub vace: &'a [VaceInput],
}

/// One VACE control of an item's samples: per sample [vace_in][T][H][W] in model space
/// (the inactive and reactive latents normalised, then the 8×8 mask cells), frames
/// inside channels as the latent's, and the strength its hints are added at.
#[derive(Clone, Debug, PartialEq)]
pub struct VaceInput {
    pub data: Vec<f32>,
    pub strength: f32,
}

pub struct WanDenoiser<'w> {
    model: Wan<'w>,
    alloc: Option<GraphAllocator>,
    /// Latent frames per sample, stacked in the channels.
    pub frames: usize,
    /// Wan 2.2 TI2V: the share of σ each sample's frames are denoised at (ComfyUI's
    /// `WAN22.process_timestep`, the noise mask's mean over each frame; sd.cpp's timestep 0
    /// for a given frame), `frames` per sample; `None`: every frame at σ.
    pub frame_levels: Option<Vec<f32>>,
}

impl<'w> WanDenoiser<'w> {
    pub fn new(model: Wan<'w>) -> Self {
        WanDenoiser { model, alloc: None, frames: 1, frame_levels: None }
    }

    pub fn config(&self) -> &super::WanConfig {
        &self.model.config
    }

    /// The denoised estimate of each item at noise level `sigma`; items whose texts (and
    /// image features) have the same token counts share one graph.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[WanItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape;
        let frames = self.frames as i64;
        if shape.iter().any(|&d| d < 1) || frames < 1 || ch != c.out_channels * frames {
            return Err(ModelError::Input(format!("a {shape:?} latent of {frames} frames for a Wan model of {} latent channels", c.out_channels)));
        }
        let per = (w * h * ch * n) as usize;
        if let Some(l) = &self.frame_levels {
            if l.len() as i64 != n * frames {
                return Err(ModelError::Input(format!("{} frame noise levels for {n} samples of {frames} frames", l.len())));
            }
        }
        let extra = (w * h * (c.in_channels - c.out_channels) * frames * n) as usize;
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != per {
                return Err(ModelError::Input(format!("item {k}: latent of {} values for shape {shape:?}", it.x.len())));
            }
            if it.cond.dim != c.text_dim || it.cond.tokens < 1 {
                return Err(ModelError::Input(format!("item {k}: {} text tokens {} wide; this Wan model reads {} wide ones (UMT5-XXL's)", it.cond.tokens, it.cond.dim, c.text_dim)));
            }
            match (extra, it.concat) {
                (0, Some(_)) => return Err(ModelError::Input(format!("item {k}: image channels for a Wan model that reads none (a text-to-video model)"))),
                (e, None) if e > 0 => {
                    return Err(ModelError::Input(format!(
                        "item {k}: this Wan model reads {} input channels: the latent's {} and an image's mask and latent (WanImageToVideo)",
                        c.in_channels, c.out_channels
                    )))
                }
                (e, Some(x)) if x.len() != e => return Err(ModelError::Input(format!("item {k}: {} image-channel values; this latent needs {e}", x.len()))),
                _ => {}
            }
            if c.vace_layers == 0 && !it.vace.is_empty() {
                return Err(ModelError::Input(format!("item {k}: a VACE control (WanVaceToVideo) for a Wan model without VACE blocks")));
            }
            let vace_len = (w * h * c.vace_in_channels * frames * n) as usize;
            if let Some(v) = it.vace.iter().find(|v| v.data.len() != vace_len) {
                return Err(ModelError::Input(format!("item {k}: a VACE control of {} values; this latent needs {vace_len} ({} channels × {frames} frames)", v.data.len(), c.vace_in_channels)));
            }
            if let (Some(id), Some(img)) = (c.image_dim, it.image) {
                if img.is_empty() || img.len() % id as usize != 0 {
                    return Err(ModelError::Input(format!("item {k}: {} CLIP-vision values are not whole {id} wide tokens", img.len())));
                }
            }
        }
        let key = |it: &WanItem<'_>| (it.cond.tokens, it.image.map(|i| i.len()), it.vace.len());
        in_groups(items, key, |members| self.run(backend, shape, sigma, members))
    }

    fn run(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[WanItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w0, h0, _, n] = shape.map(|d| d as usize);
        let (out_ch, in_ch, frames) = (c.out_channels as usize, c.in_channels as usize, self.frames);
        let p = PATCH[1] as usize;
        let b = items.len() * n;
        let lc = items[0].cond.tokens as usize;
        // Padded to whole patches by wrapping around (ComfyUI's `pad_to_patch_size`), the
        // output cropped back.
        let (h, w) = (h0.div_ceil(p) * p, w0.div_ceil(p) * p);
        let plane = h0 * w0;
        let (rows, cols) = (h / p, w / p);
        let tokens = frames * rows * cols;
        let mut x = Vec::with_capacity(b * tokens * in_ch * p * p);
        let mut text = Vec::with_capacity(b * lc * c.text_dim as usize);
        let mut image = Vec::new();
        let extra = in_ch - out_ch;
        for it in items {
            for j in 0..n {
                let sample = &it.x[j * out_ch * frames * plane..(j + 1) * out_ch * frames * plane];
                let concat = it.concat.map(|e| &e[j * extra * frames * plane..(j + 1) * extra * frames * plane]);
                for f in 0..frames {
                    let mut planes = frame_of(sample, out_ch, frames, plane, f);
                    if let Some(e) = concat {
                        planes.extend(frame_of(e, extra, frames, plane, f));
                    }
                    let (padded, _, _) = pad_to_patches(&planes, [in_ch, h0, w0], p);
                    x.extend(patchify(&padded, [1, in_ch, h, w], p)?);
                }
                text.extend_from_slice(&it.cond.data);
                if let Some(i) = it.image {
                    image.extend_from_slice(i);
                }
            }
        }
        let graph_size = 256 * c.layers + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let bi = b as i64;
        let x_t = run.input_f32(&[(in_ch * p * p) as i64, tokens as i64, bi], x)?;
        let text_t = run.input_f32(&[c.text_dim, lc as i64, bi], text)?;
        let image_t = match (c.image_dim, items[0].image) {
            (Some(id), Some(i)) => Some(run.input_f32(&[id, i.len() as i64 / id, bi], image)?),
            _ => None,
        };
        // Per token when frames are denoised at levels of their own (each frame's tokens
        // alike), else one per video.
        // Each VACE control's tokens, patched as the video's, and its strength per video.
        let vin = c.vace_in_channels as usize;
        let mut vace = Vec::with_capacity(items[0].vace.len());
        for k in 0..items[0].vace.len() {
            let mut tokens = Vec::with_capacity(b * frames * rows * cols * vin * p * p);
            let mut strength = Vec::with_capacity(b);
            for it in items {
                let control = &it.vace[k];
                for j in 0..n {
                    let sample = &control.data[j * vin * frames * plane..(j + 1) * vin * frames * plane];
                    for f in 0..frames {
                        let (padded, _, _) = pad_to_patches(&frame_of(sample, vin, frames, plane, f), [vin, h0, w0], p);
                        tokens.extend(patchify(&padded, [1, vin, h, w], p)?);
                    }
                    strength.push(control.strength);
                }
            }
            vace.push(VaceTokens { tokens: run.input_f32(&[(vin * p * p) as i64, (frames * rows * cols) as i64, bi], tokens)?, strength: run.input_f32(&[1, 1, bi], strength)? });
        }
        let timesteps: Vec<f32> = match &self.frame_levels {
            None => vec![sigma * 1000.0; b],
            Some(levels) => (0..b).flat_map(|k| (0..frames).flat_map(move |f| std::iter::repeat_n(sigma * 1000.0 * levels[(k % n) * frames + f], rows * cols))).collect(),
        };
        let inputs = WanInputs { x: x_t, frames: frames as i64, rows: rows as i64, cols: cols as i64, context: text_t, image: image_t, timesteps: &timesteps, vace: &vace };
        let v = self.model.forward(&ctx, &mut run, &inputs)?;
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let v = run.compute_with(backend, alloc, &[v], graph_size)?.remove(0);
        // Tokens of (sample, frame) in order → planes [C][T][H][W] per sample.
        let v = unpatchify_hwc(&v, [b * frames, out_ch, h, w], p)?;
        let per0 = out_ch * plane;
        let v: Vec<f32> = if (h, w) == (h0, w0) { v } else { v.chunks_exact(out_ch * h * w).flat_map(|s| crop(s, [out_ch, h, w], h0, w0)).collect() };
        let v = channel_major(&v, out_ch, frames, plane);
        let per = n * frames * per0;
        Ok(items.iter().enumerate().map(|(k, it)| it.x.iter().zip(&v[k * per..(k + 1) * per]).map(|(x, v)| x - sigma * v).collect()).collect())
    }
}
