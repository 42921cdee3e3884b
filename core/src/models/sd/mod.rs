//! The Stable Diffusion UNet family (SD1.x, SD2.x, SDXL and their variants): the UNet and
//! what plugs into it (ControlNet, IP-Adapter, PhotoMaker), diffusers pipeline folders, and
//! the denoiser: the UNet wrapped as a k-diffusion model, `denoised = D(x, σ)`, with
//! classifier-free guidance computed in one batched graph.
//!
//! One folder per model family, as the DiT families have theirs (`flux/`); the text
//! encoders (`clip`, `t5`) and VAEs (`vae/`) are shared across families and stay outside.

pub mod controlnet;
pub mod ip_adapter;
pub mod motion;
pub mod photomaker;
pub mod unet;

use crate::models::clip::{ClipTextModel, EncodeOptions};
use self::controlnet::ControlNet;
use self::ip_adapter::{IpAdapter, IpAdapterConfig};
use self::motion::MotionModules;
use self::unet::{ControlResiduals, IpAttention, Motion, Unet, UnetExtras};
use crate::models::conditioning::{Conditioning, LatentShape, Prediction};
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Backend, Circular, Context, GraphAllocator, GraphRun};
use crate::sampling::samplers::Denoised;
use crate::sampling::schedule::DiscreteSchedule;


/// One item of [`SdDenoiser::denoise_batch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchItem<'a> {
    /// The noisy latent, of the batch's shape.
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
    /// The UNet's extra input channels, per sample.
    pub concat: Option<&'a [f32]>,
    /// Which image tokens the IP-Adapters give this item.
    pub ip: IpSide,
    /// ControlNets whose residuals the UNet adds (summed), in stacking order.
    pub control: &'a [ControlInput<'a>],
}

/// One ControlNet applied to a [`BatchItem`].
#[derive(Clone, Copy)]
pub struct ControlInput<'a> {
    pub net: &'a ControlNet<'a>,
    /// Hint images at the item's size times the net's hint scale, [W·s, H·s, C, images]
    /// (ggml order); sample `i` of the item takes image `i % images`, as ComfyUI's
    /// `broadcast_image_to`.
    pub hint: &'a [f32],
    pub images: usize,
    pub strength: f32,
}

impl std::fmt::Debug for ControlInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlInput").field("hint", &self.hint.len()).field("images", &self.images).field("strength", &self.strength).finish_non_exhaustive()
    }
}

impl ControlInput<'_> {
    /// Items whose controls are the same (the same nets, hints and strengths) share a
    /// ControlNet evaluation, and so a batch (ComfyUI's `can_concat_cond`).
    fn same(a: &[Self], b: &[Self]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(a, b)| std::ptr::eq(a.net, b.net) && std::ptr::eq(a.hint, b.hint) && a.images == b.images && a.strength == b.strength)
    }
}

/// The side of classifier-free guidance an item is on, for IP-Adapter: the positive (and
/// any middle) conditioning sees the image's tokens, the negative the unconditional ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IpSide {
    #[default]
    Cond,
    Uncond,
}

/// An IP-Adapter applied while denoising: its weights and the image tokens it adds.
pub struct IpPatch<'w> {
    pub weights: &'w Weights,
    /// Image tokens [width, tokens] (row-major: `tokens` rows of the UNet's context
    /// width) for the conditional side.
    pub cond: Vec<f32>,
    /// The same for the unconditional side: the projection of a zero embedding (classic)
    /// or of a black image's hidden states (Plus), as ComfyUI_IPAdapter_plus makes them.
    pub uncond: Vec<f32>,
    pub tokens: i64,
    /// The weight of the image attention (diffusers' `scale`, ComfyUI's `weight`).
    pub scale: f32,
    /// (first, last) noise level it applies at: active while first ≥ σ ≥ last.
    pub sigmas: (f32, f32),
}

pub struct SdDenoiser<'w> {
    unet: Unet<'w>,
    pub schedule: DiscreteSchedule,
    pub prediction: Prediction,
    alloc: Option<GraphAllocator>,
    ip: Vec<IpPatch<'w>>,
    /// The whole image's pixel size, which SDXL's size conditioning defaults to even
    /// when an area conditioning runs the UNet on part of the latent (ComfyUI passes the
    /// noise's size); `None`: the size of the latent each call gets.
    pub image_size: Option<(i64, i64)>,
    /// Seamless tiling: the axes on which every convolution of the UNet (and of the
    /// ControlNets it runs with) pads circularly, as sd.cpp's `set_circular_axes` on the
    /// diffusion model and control net.
    pub circular: Circular,
    /// AnimateDiff's motion modules, and whether the GroupNorms take statistics over a
    /// video's frames: every item's samples are then the frames of one video.
    motion: Option<(MotionModules<'w>, bool)>,
}

impl<'w> SdDenoiser<'w> {
    pub fn new(unet: Unet<'w>, schedule: DiscreteSchedule, prediction: Prediction) -> Self {
        SdDenoiser { unet, schedule, prediction, alloc: None, ip: Vec::new(), image_size: None, circular: Circular::NONE, motion: None }
    }

    /// Denoise each item's samples as the frames of one video through AnimateDiff's
    /// motion modules (checked against the UNet first). A single sample goes through them
    /// too, as AnimateDiff-Evolved runs it (sd.cpp's vid_gen leaves the modules out then).
    /// `norm_across_frames`: [`Motion::norm_across_frames`].
    pub fn with_motion(mut self, modules: MotionModules<'w>, norm_across_frames: bool) -> Result<Self> {
        self.unet.config.check_motion(&modules.config)?;
        self.motion = Some((modules, norm_across_frames));
        Ok(self)
    }

    /// Denoise with IP-Adapters, each checked against the UNet (its layers, their widths,
    /// the width of its tokens) before any graph is built.
    pub fn with_ip_adapters(mut self, patches: Vec<IpPatch<'w>>) -> Result<Self> {
        let width = self.unet.config.context_dim;
        for (i, p) in patches.iter().enumerate() {
            IpAdapter::new(p.weights, IpAdapterConfig::infer(p.weights)?)?.check_unet(&self.unet.config)?;
            let n = (p.tokens * width) as usize;
            if p.tokens < 1 || p.cond.len() != n || p.uncond.len() != n {
                return Err(ModelError::Input(format!(
                    "IP-Adapter {i}: {} and {} token values are not {} tokens of width {width}",
                    p.cond.len(),
                    p.uncond.len(),
                    p.tokens
                )));
            }
        }
        self.ip = patches;
        Ok(self)
    }

    pub fn unet(&self) -> &Unet<'w> {
        &self.unet
    }

    /// (c_skip, c_out, c_in) of k-diffusion's CompVis(V)Denoiser with σ_data = 1.
    fn scalings(&self, sigma: f32) -> (f32, f32, f32) {
        let c_in = 1.0 / (sigma * sigma + 1.0).sqrt();
        match self.prediction {
            Prediction::Epsilon => (1.0, -sigma, c_in),
            Prediction::V | Prediction::EdmV => (1.0 / (sigma * sigma + 1.0), -sigma * c_in, c_in),
            Prediction::Flow => (1.0, -sigma, 1.0),
        }
    }

    /// One guided model evaluation: the denoised latent for `x` (shape `shape`) at
    /// noise level `sigma`. With `uncond`, cond and uncond run as one batch and are
    /// mixed as `uncond + cfg_scale·(cond − uncond)`; `uncond` is returned too, for
    /// the CFG++ samplers. Every sample of the batch shares the conditioning.
    pub fn denoise(&mut self, backend: &Backend, x: &[f32], shape: LatentShape, sigma: f32, cond: &Conditioning, uncond: Option<&Conditioning>, cfg_scale: f32) -> Result<Denoised> {
        self.denoise_concat(backend, x, shape, sigma, cond, uncond, cfg_scale, None)
    }

    /// [`SdDenoiser::denoise`] for UNets that take extra input channels (inpainting:
    /// mask and masked-image latent; instruct-pix2pix: the image latent): `concat` holds
    /// `concat_channels` channels per sample, appended after the (scaled) latent.
    #[allow(clippy::too_many_arguments)]
    pub fn denoise_concat(&mut self, backend: &Backend, x: &[f32], shape: LatentShape, sigma: f32, cond: &Conditioning, uncond: Option<&Conditioning>, cfg_scale: f32, concat: Option<(&[f32], i64)>) -> Result<Denoised> {
        let extra = concat.map_or(0, |c| c.1);
        let want = self.unet.config.in_channels;
        if shape[2] + extra != want {
            return Err(ModelError::Input(format!(
                "the UNet takes {want} input channels; the latent has {} and the extra conditioning {extra}",
                shape[2]
            )));
        }
        let c = concat.map(|c| c.0);
        let mut items = vec![BatchItem { x, cond, concat: c, ip: IpSide::Cond, control: &[] }];
        if let Some(u) = uncond {
            items.push(BatchItem { x, cond: u, concat: c, ip: IpSide::Uncond, control: &[] });
        }
        let mut out = self.denoise_batch(backend, shape, sigma, &items)?;
        let cond_d = out.remove(0);
        match out.pop() {
            None => Ok(Denoised { denoised: cond_d, uncond: None }),
            Some(un_d) => {
                let mixed = un_d.iter().zip(&cond_d).map(|(u, c)| u + cfg_scale * (c - u)).collect();
                Ok(Denoised { denoised: mixed, uncond: Some(un_d) })
            }
        }
    }

    /// Unguided denoised predictions for several (latent, conditioning, extra channels,
    /// controls) items of the same latent shape at one noise level, as few UNet graphs
    /// as the conditionings allow: items whose token counts and controls match run as
    /// one batch, their ControlNets in the same graph. Each
    /// item's `concat` holds the UNet's extra input channels (`in_channels` minus the
    /// latent's) per sample, and must be present exactly when the UNet takes some.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[BatchItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let n_per = (shape[0] * shape[1] * shape[2]) as usize;
        let n = shape[3] as usize;
        let plane = (shape[0] * shape[1]) as usize;
        let want = self.unet.config.in_channels;
        let extra = want - shape[2];
        if n == 0 || shape.iter().any(|&d| d < 1) || extra < 0 {
            return Err(ModelError::Input(format!("latent shape {shape:?} for a UNet of {want} input channels")));
        }
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != n_per * n {
                return Err(ModelError::Input(format!("item {k}: latent of {} values for shape {shape:?}", it.x.len())));
            }
            match (it.concat, extra) {
                (None, 0) => {}
                (Some(c), e) if e > 0 && c.len() == plane * e as usize * n => {}
                (c, _) => {
                    return Err(ModelError::Input(format!(
                        "item {k}: {} extra-channel values; the UNet takes {extra} extra channels for {n} samples of {plane}",
                        c.map_or(0, |c| c.len())
                    )))
                }
            }
        }
        for (k, it) in items.iter().enumerate() {
            for c in it.control {
                let cfg = &c.net.config;
                let sc = cfg.hint_scale();
                if cfg.unet.in_channels != shape[2] {
                    return Err(ModelError::Input(format!("item {k}: the ControlNet takes {} latent channels, the latent has {}", cfg.unet.in_channels, shape[2])));
                }
                if c.images == 0 || c.hint.len() as i64 != shape[0] * sc * shape[1] * sc * cfg.hint_channels * c.images as i64 {
                    return Err(ModelError::Input(format!(
                        "item {k}: a hint of {} values is not {} images of {}x{}x{}",
                        c.hint.len(),
                        c.images,
                        shape[0] * sc,
                        shape[1] * sc,
                        cfg.hint_channels
                    )));
                }
            }
        }
        if !sigma.is_finite() || sigma < 0.0 {
            return Err(ModelError::Input(format!("sigma {sigma}")));
        }
        let (c_skip, c_out, c_in) = self.scalings(sigma);
        let t = match self.prediction {
            // EDM's c_noise; σ = 0 never reaches the model (samplers stop before it).
            Prediction::EdmV => 0.25 * sigma.max(f32::MIN_POSITIVE).ln(),
            _ => self.schedule.sigma_to_t(sigma),
        };
        let mut out: Vec<Option<Vec<f32>>> = vec![None; items.len()];
        // Different token counts cannot share a batch; run them one after another.
        let mut pending: Vec<usize> = (0..items.len()).collect();
        while let Some(&first) = pending.first() {
            let key = (items[first].cond.tokens, items[first].cond.dim);
            let control = items[first].control;
            let (group, rest): (Vec<usize>, Vec<usize>) = pending.iter().partition(|&&k| (items[k].cond.tokens, items[k].cond.dim) == key && ControlInput::same(items[k].control, control));
            pending = rest;
            let mut xin: Vec<f32> = Vec::with_capacity((n_per + plane * extra as usize) * n * group.len());
            let mut ctx_data = Vec::with_capacity(group.iter().map(|&k| items[k].cond.data.len() * n).sum());
            let adm = self.unet.config.adm_in_channels;
            let mut y = Vec::new();
            for &k in &group {
                let it = &items[k];
                if let Some(adm) = adm {
                    let (iw, ih) = self.image_size.unwrap_or((shape[0] * 8, shape[1] * 8));
                    let v = it.cond.adm(adm, iw, ih)?;
                    (0..n).for_each(|_| y.extend_from_slice(&v));
                }
                for i in 0..n {
                    xin.extend(it.x[i * n_per..(i + 1) * n_per].iter().map(|v| v * c_in));
                    if let Some(c) = it.concat {
                        let per = plane * extra as usize;
                        xin.extend_from_slice(&c[i * per..(i + 1) * per]);
                    }
                    ctx_data.extend_from_slice(&it.cond.data);
                }
            }
            let b = (group.len() * n) as i64;
            let y = adm.map(|_| y);
            // Each control's hints for the whole group: sample i of each item takes image i % images.
            let hints: Vec<Vec<f32>> = control
                .iter()
                .map(|c| {
                    let per = c.hint.len() / c.images;
                    (0..group.len()).flat_map(|_| (0..n).flat_map(|i| c.hint[(i % c.images) * per..(i % c.images + 1) * per].iter().copied())).collect()
                })
                .collect();
            let controls: Vec<(&ControlInput<'_>, Vec<f32>)> = control.iter().zip(hints).collect();
            // Every adapter active at this noise level, with each sample's image tokens.
            let ip: Vec<(usize, Vec<f32>)> = (self.ip.iter().enumerate())
                .filter(|(_, p)| sigma <= p.sigmas.0 && sigma >= p.sigmas.1)
                .map(|(a, p)| {
                    let mut v = Vec::with_capacity(p.cond.len() * b as usize);
                    for &k in &group {
                        let side = if items[k].ip == IpSide::Uncond { &p.uncond } else { &p.cond };
                        (0..n).for_each(|_| v.extend_from_slice(side));
                    }
                    (a, v)
                })
                .collect();
            let pred = self.run_unet(backend, xin, [shape[0], shape[1], want, b], shape[2], vec![t; b as usize], ctx_data, key.1, key.0, y, controls, ip, shape[3])?;
            for (&k, p) in group.iter().zip(pred.chunks(n_per * n)) {
                out[k] = Some(items[k].x.iter().zip(p).map(|(xv, pv)| xv * c_skip + pv * c_out).collect());
            }
        }
        Ok(out.into_iter().map(|o| o.expect("every item ran in some group")).collect())
    }

    /// The UNet on `x` (`shape`, of which the first `latent_channels` channels are the
    /// latent), with the residuals of `controls` (each with its hints for the batch).
    #[allow(clippy::too_many_arguments)]
    /// `frames`: samples per item, which the motion modules take as one video.
    fn run_unet(&mut self, backend: &Backend, x: Vec<f32>, shape: LatentShape, latent_channels: i64, t: Vec<f32>, context: Vec<f32>, dim: i64, tokens: i64, y: Option<Vec<f32>>, controls: Vec<(&ControlInput<'_>, Vec<f32>)>, ip: Vec<(usize, Vec<f32>)>, frames: i64) -> Result<Vec<f32>> {
        // A UNet graph is a few thousand nodes, a ControlNet half that; this bounds
        // SD1/SD2 at any size.
        let graph = 32768 + 16384 * controls.len();
        let ctx = Context::new(graph, graph)?;
        ctx.set_circular(self.circular);
        let mut run = GraphRun::new(&ctx);
        let xt = run.input_f32(&shape, x)?;
        let tt = run.input_f32(&[shape[3]], t)?;
        let ct = run.input_f32(&[dim, tokens, shape[3]], context)?;
        let mut extras = UnetExtras::default();
        if let Some((modules, norm_across_frames)) = &self.motion {
            extras.motion = Some(Motion { modules, frames, norm_across_frames: *norm_across_frames });
        }
        if let Some(y) = y {
            let width = y.len() as i64 / shape[3];
            extras.y = Some(run.input_f32(&[width, shape[3]], y)?);
        }
        for (a, data) in ip {
            let p = &self.ip[a];
            let tokens = run.input_f32(&[self.unet.config.context_dim, p.tokens, shape[3]], data)?;
            extras.ip.push(IpAttention { weights: p.weights, tokens, scale: p.scale });
        }
        if !controls.is_empty() {
            // ControlNets see the latent without the UNet's extra channels.
            let xl = if latent_channels == shape[2] {
                xt
            } else {
                let nb = xt.nb();
                ctx.cont(ctx.view(xt, [shape[0], shape[1], latent_channels, shape[3]], [nb[1], nb[2], nb[3]], 0)?)?
            };
            let mut sum: Option<ControlResiduals<'_>> = None;
            for (c, hint) in controls {
                let sc = c.net.config.hint_scale();
                let ht = run.input_f32(&[shape[0] * sc, shape[1] * sc, c.net.config.hint_channels, shape[3]], hint)?;
                let r = c.net.forward(&ctx, xl, ht, tt, ct, extras.y, c.strength)?;
                sum = Some(match sum {
                    None => r,
                    Some(s) => ControlResiduals {
                        skips: s.skips.iter().zip(&r.skips).map(|(a, b)| ctx.add(*a, *b)).collect::<std::result::Result<_, _>>()?,
                        middle: ctx.add(s.middle, r.middle)?,
                    },
                });
            }
            extras.control = sum;
        }
        let out = self.unet.forward_with(&ctx, xt, tt, ct, &extras)?;
        if self.alloc.is_none() {
            self.alloc = Some(GraphAllocator::new(backend)?);
        }
        let alloc = self.alloc.as_mut().expect("allocator just created");
        Ok(run.compute_with(backend, alloc, &[out], graph)?.remove(0))
    }
}

/// Encode a laid-out prompt with `clip`: every chunk in one batch, textual-inversion
/// vectors spliced in, then A1111/sd.cpp emphasis — each token's hidden state scaled
/// by its weight and the chunk rescaled to its original mean. Returns `77 × chunks`
/// tokens of conditioning.
pub fn encode_prompt(backend: &Backend, clip: &ClipTextModel<'_>, prompt: &crate::text::TokenizedPrompt, clip_skip: usize) -> Result<Conditioning> {
    encode_prompt_with(backend, clip, prompt, clip_skip, true, Pooled::None)
}

/// Which pooled output [`encode_prompt_with`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooled {
    None,
    /// Through the encoder's text projection (SDXL's OpenCLIP-G).
    Projected,
    /// The final-normed end token itself (FLUX's CLIP-L).
    Raw,
}

/// [`encode_prompt`] with the hidden states' final layer norm optional (`final_norm`)
/// and the first chunk's pooled output (ComfyUI and sd.cpp pool the first chunk only)
/// in [`Conditioning::pooled`] as `pooled` asks.
pub fn encode_prompt_with(backend: &Backend, clip: &ClipTextModel<'_>, prompt: &crate::text::TokenizedPrompt, clip_skip: usize, final_norm: bool, pooled: Pooled) -> Result<Conditioning> {
    let d = clip.config.hidden;
    let vocab = clip.config.vocab as i32;
    let mut extra: Vec<f32> = Vec::new();
    let mut tokens: Vec<Vec<i32>> = Vec::with_capacity(prompt.chunks.len());
    for chunk in &prompt.chunks {
        let mut ids: Vec<i32> = chunk.tokens.iter().map(|&t| t as i32).collect();
        for slot in &chunk.embeddings {
            let v = slot.embedding.for_width(d as usize).ok_or_else(|| {
                ModelError::Input(format!("embedding `{}` has no {d}-wide vectors for this text encoder", slot.embedding.name))
            })?;
            for r in 0..v.rows {
                let pos = slot.position + r;
                if pos >= ids.len() {
                    return Err(ModelError::Input(format!("embedding `{}` runs past its chunk", slot.embedding.name)));
                }
                ids[pos] = vocab + (extra.len() as i64 / d) as i32;
                extra.extend_from_slice(&v.data[r * d as usize..(r + 1) * d as usize]);
            }
        }
        tokens.push(ids);
    }
    const GRAPH: usize = 8192;
    let ctx = Context::new(GRAPH, GRAPH)?;
    let mut run = GraphRun::new(&ctx);
    // The end token's position: the first `<|endoftext|>` (what ComfyUI's argmax over
    // the ids finds), the last position if a chunk has none.
    let eos = crate::text::tokenizer::EOS_TOKEN as i32;
    let pooled_at = (pooled != Pooled::None).then(|| tokens.iter().map(|ids| ids.iter().position(|&i| i == eos).unwrap_or(ids.len() - 1)).collect());
    let opts = EncodeOptions { clip_skip, final_norm, pooled_at, project_pooled: pooled == Pooled::Projected };
    let out = clip.encode(&ctx, &mut run, &tokens, &opts, &extra)?;
    let mut outs: Vec<_> = vec![out.hidden];
    outs.extend(out.pooled);
    let mut results = run.compute(backend, &outs, GRAPH)?;
    let mut hidden = results.remove(0);
    let pooled = results.pop().map(|p| {
        let width = p.len() / tokens.len();
        p[..width].to_vec()
    });
    let t = tokens[0].len();
    for (chunk, values) in prompt.chunks.iter().zip(hidden.chunks_mut(t * d as usize)) {
        crate::models::conditioning::emphasize(values, &chunk.weights, d as usize);
    }
    let mut cond = Conditioning::new(hidden, d, (t * prompt.chunks.len()) as i64)?;
    cond.pooled = pooled;
    Ok(cond)
}

/// SDXL's text conditioning: CLIP-L's and OpenCLIP-G's penultimate hidden states (no
/// final norm), side by side per token (768 + 1280 = 2048 wide), and G's pooled
/// output. The two prompts are one prompt tokenized with each encoder's padding.
pub fn encode_prompt_sdxl(
    backend: &Backend,
    l: (&ClipTextModel<'_>, &crate::text::TokenizedPrompt),
    g: (&ClipTextModel<'_>, &crate::text::TokenizedPrompt),
    clip_skip: usize,
) -> Result<Conditioning> {
    let cl = encode_prompt_with(backend, l.0, l.1, clip_skip.min(l.0.config.layers), false, Pooled::None)?;
    let cg = encode_prompt_with(backend, g.0, g.1, clip_skip.min(g.0.config.layers), false, Pooled::Projected)?;
    if cl.tokens != cg.tokens {
        return Err(ModelError::Input(format!("the two encoders' prompts differ in length: {} and {} tokens", cl.tokens, cg.tokens)));
    }
    let (dl, dg) = (cl.dim as usize, cg.dim as usize);
    let mut data = Vec::with_capacity(cl.data.len() + cg.data.len());
    for (a, b) in cl.data.chunks(dl).zip(cg.data.chunks(dg)) {
        data.extend_from_slice(a);
        data.extend_from_slice(b);
    }
    let mut cond = Conditioning::new(data, (dl + dg) as i64, cl.tokens)?;
    cond.pooled = cg.pooled;
    Ok(cond)
}
