//! FLUX.2 as a k-diffusion denoiser over flow latents: `denoised = x − σ·v`, one token per
//! latent pixel (the latent is already the VAE's 2×2 patches, 128 channels) and every
//! item's text batched into one graph. Reference latents (edits) follow the image's
//! tokens, reference k at time index 10·k (diffusers' `_prepare_image_ids`, ComfyUI's
//! `ref_index_scale`, sd.cpp's increasing index); only the image's outputs are kept.

use super::{Flux2, Flux2Inputs};
use crate::ggml::{Backend, Context, GraphAllocator, GraphRun};
use crate::models::conditioning::{Conditioning, Guidance, LatentShape, ReferenceLatent, ReferenceMethod};
use crate::models::dit::{in_groups, patchify, unpatchify};
use crate::models::{ModelError, Result};

/// FLUX.2 dev's guidance when none is set (sd-cli's `--guidance` default).
pub const DEFAULT_GUIDANCE: f32 = 3.5;

/// One item of [`Flux2Denoiser::denoise_batch`]: a latent (model space, [W, H, C, N]) and
/// the conditioning it is denoised under.
#[derive(Clone, Copy, Debug)]
pub struct Flux2Item<'a> {
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
}

pub struct Flux2Denoiser<'w> {
    model: Flux2<'w>,
    alloc: Option<GraphAllocator>,
}

/// How far apart references sit on the time axis.
pub const REF_INDEX_SCALE: f32 = 10.0;

/// Position ids as `Flux2KleinPipeline` makes them: the image's (0, row, column, 0) in
/// reading order, the text's (0, 0, 0, index).
pub fn position_ids(rows: usize, cols: usize, text: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let img = grid_ids(rows, cols, 0.0);
    let txt = (0..text).map(|l| vec![0.0, 0.0, 0.0, l as f32]).collect();
    (img, txt)
}

fn grid_ids(rows: usize, cols: usize, t: f32) -> Vec<Vec<f32>> {
    (0..rows).flat_map(|r| (0..cols).map(move |c| vec![t, r as f32, c as f32, 0.0])).collect()
}

/// The position ids of reference latents: reference k (from 1) a grid at time 10·k.
pub fn reference_ids(refs: &[std::sync::Arc<ReferenceLatent>]) -> Vec<Vec<f32>> {
    refs.iter().enumerate().flat_map(|(k, r)| grid_ids(r.height, r.width, REF_INDEX_SCALE * (k + 1) as f32)).collect()
}

impl<'w> Flux2Denoiser<'w> {
    pub fn new(model: Flux2<'w>) -> Self {
        Flux2Denoiser { model, alloc: None }
    }

    pub fn config(&self) -> &super::Flux2Config {
        &self.model.config
    }

    /// The denoised estimate of each item at noise level `sigma`; items whose text has
    /// the same token count (and guidance switched alike) share one graph.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[Flux2Item<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape;
        if shape.iter().any(|&d| d < 1) || ch != c.in_channels {
            return Err(ModelError::Input(format!("a {shape:?} latent for a FLUX.2 model of {} latent channels (the VAE's 2×2 patches)", c.in_channels)));
        }
        let per = (w * h * ch * n) as usize;
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != per {
                return Err(ModelError::Input(format!("item {k}: latent of {} values for shape {shape:?}", it.x.len())));
            }
            if it.cond.dim != c.context || it.cond.tokens < 1 {
                return Err(ModelError::Input(format!("item {k}: {} text tokens {} wide; this FLUX.2 model reads {} wide ones (three LLM layers side by side)", it.cond.tokens, it.cond.dim, c.context)));
            }
            if let Some(r) = it.cond.references.iter().find(|r| r.channels != ch as usize || r.data.len() != r.channels * r.height * r.width || r.height == 0 || r.width == 0) {
                return Err(ModelError::Input(format!("item {k}: a reference latent of {} values as {}x{}x{}; FLUX.2's latents have {ch} channels (encode it with the FLUX.2 VAE)", r.data.len(), r.channels, r.height, r.width)));
            }
            if let Some(m) = it.cond.reference_method.filter(|m| *m != ReferenceMethod::Index) {
                return Err(ModelError::Input(format!("item {k}: reference method {m:?} on FLUX.2 (it places references by index)")));
            }
        }
        let key = |it: &Flux2Item<'_>| (it.cond.tokens, it.cond.guidance == Guidance::Off, it.cond.references.iter().map(|r| (r.height, r.width)).collect::<Vec<_>>());
        in_groups(items, key, |members| self.run(backend, shape, sigma, members))
    }

    fn run(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[Flux2Item<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.model.config;
        let [w, h, ch, n] = shape.map(|d| d as usize);
        let b = items.len() * n;
        let lt = items[0].cond.tokens as usize;
        let per = ch * h * w;
        let refs = &items[0].cond.references;
        let lr: usize = refs.iter().map(|r| r.height * r.width).sum();
        let mut img = Vec::with_capacity(b * (per + lr * ch));
        let mut txt = Vec::with_capacity(b * lt * c.context as usize);
        let mut guidance = Vec::with_capacity(b);
        for it in items {
            for j in 0..n {
                img.extend(patchify(&it.x[j * per..(j + 1) * per], [1, ch, h, w], 1)?);
                for r in &it.cond.references {
                    img.extend(patchify(&r.data, [1, ch, r.height, r.width], 1)?);
                }
                txt.extend_from_slice(&it.cond.data);
                guidance.push(it.cond.guidance.scale_or(DEFAULT_GUIDANCE).unwrap_or(0.0));
            }
        }
        let (mut img_ids, txt_ids) = position_ids(h, w, lt);
        img_ids.extend(reference_ids(refs));
        let blocks = c.depth + c.depth_single;
        let graph_size = 512 * blocks + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let bi = b as i64;
        let img_t = run.input_f32(&[c.in_channels, (h * w + lr) as i64, bi], img)?;
        let txt_t = run.input_f32(&[c.context, lt as i64, bi], txt)?;
        let timesteps = vec![sigma; b];
        let guidance = (items[0].cond.guidance != Guidance::Off).then_some(&guidance[..]);
        let v = self.model.forward(&ctx, &mut run, &Flux2Inputs { img: img_t, img_ids: &img_ids, txt: txt_t, txt_ids: &txt_ids, timesteps: &timesteps, guidance })?;
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let v = run.compute_with(backend, alloc, &[v], graph_size)?.remove(0);
        // The image's tokens of each sequence, without the references'.
        let v: Vec<f32> = v.chunks_exact((h * w + lr) * ch).flat_map(|s| &s[..h * w * ch]).copied().collect();
        let v = unpatchify(&v, [b, ch, h, w], 1)?;
        let per = n * per;
        Ok(items.iter().enumerate().map(|(k, it)| it.x.iter().zip(&v[k * per..(k + 1) * per]).map(|(x, v)| x - sigma * v).collect()).collect())
    }
}
