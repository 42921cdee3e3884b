//! Wan 2.1 / 2.2 video transformers (T2V, I2V, FLF2V, TI2V): one stream of video tokens
//! (1×2×2 patches of a latent video) through blocks of self-attention with 3-axis rotary
//! positions (frame, row, column), cross-attention to UMT5 text features (and, for I2V,
//! CLIP-vision image tokens through their own keys and values), and a GELU feed-forward,
//! each modulated by six shift/scale/gate vectors from the timestep.
//!
//! Keys are the Wan release's (what ComfyUI and sd.cpp load: `patch_embedding`,
//! `text_embedding.{0,2}`, `time_embedding.{0,2}`, `time_projection.1`,
//! `blocks.N.{self_attn,cross_attn}.{q,k,v,o,norm_q,norm_k}`, `blocks.N.ffn.{0,2}`,
//! `blocks.N.modulation`, `head.head`, `head.modulation`, `img_emb.proj.*`), bare or under
//! `model.diffusion_model.`; diffusers' names are shown in them by [`diffusers`], and
//! [`layout`] shows the 5-D patch kernel as the matrix it multiplies patches by.
//!
//! The model reads σ·1000 and predicts the flow velocity (`denoised = x − σ·v`).

pub mod denoiser;
pub mod diffusers;

pub use denoiser::{VaceInput, WanDenoiser, WanItem};

use super::dit::{self, rope};
use super::nn::{attention_typed, layer_norm, linear, rms_norm};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GType, GraphRun, Tensor};
use crate::io::{TensorInfo, TensorSource};

/// The weight that tells a file holds a Wan transformer, relative to its prefix.
pub const MARKER: &str = "blocks.0.cross_attn.norm_q.weight";

/// The norms' epsilon (layer norms, q/k RMS norms).
const EPS: f32 = 1e-6;

/// Heads are this wide in every released Wan model (1.3B: 12 heads of 1536, 14B: 40 of
/// 5120, TI2V-5B: 24 of 3072); files do not store the head count.
pub const HEAD_DIM: i64 = 128;

/// Latent frames, rows and columns per patch.
pub const PATCH: [i64; 3] = [1, 2, 2];

/// What a file's image conditioning is, read off its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Text only (Wan2.1 T2V, Wan2.2 T2V experts).
    T2v,
    /// Text, CLIP-vision image tokens and the first frame's latent in the input channels
    /// (Wan2.1 I2V; FLF2V when the image embedding has position tables).
    I2v,
    /// The first frame's latent in the input channels, no CLIP vision (Wan2.2 I2V experts).
    I2vNoClip,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WanConfig {
    /// Channels of the model's input: the noisy latent's and, for I2V, the mask's and the
    /// image latent's after them.
    pub in_channels: i64,
    /// Latent channels (16; Wan2.2 TI2V's VAE: 48).
    pub out_channels: i64,
    pub dim: i64,
    pub heads: i64,
    pub ffn: i64,
    pub layers: usize,
    /// Width of the text features (UMT5-XXL: 4096).
    pub text_dim: i64,
    /// Width of the sinusoidal timestep features (256).
    pub freq_dim: i64,
    /// CLIP-vision token width (1280) when the model reads image tokens.
    pub image_dim: Option<i64>,
    /// Whether the image embedding adds learned positions (FLF2V: 2 × 257 tokens).
    pub image_positions: bool,
    /// Whether a layer norm with weights precedes the cross-attention (`norm3`).
    pub cross_attn_norm: bool,
    pub theta: f64,
    /// Wan VACE: its blocks (`vace_blocks.N`, the n-th after block n·layers/vace_layers)
    /// and the control's channels (96: inactive and reactive latents, 8×8 mask cells).
    pub vace_layers: usize,
    pub vace_in_channels: i64,
}

impl WanConfig {
    /// Read the dimensions off the weights under `prefix` (after [`layout`]).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a Wan transformer: no `{}`", at(MARKER))));
        }
        let patch = PATCH.iter().product::<i64>();
        let [pin, dim, ..] = w.get(&at("patch_embedding.weight"))?.ne();
        if pin % patch != 0 {
            return Err(ModelError::Weight { name: at("patch_embedding.weight"), detail: format!("{pin} patch features: not whole 1×2×2 patches") });
        }
        let out = w.get(&at("head.head.weight"))?.ne()[1];
        let image_dim = if w.contains(&at("img_emb.proj.1.weight")) { Some(w.get(&at("img_emb.proj.1.weight"))?.ne()[0]) } else { None };
        let vace_layers = (0..).take_while(|i| w.contains(&at(&format!("vace_blocks.{i}.self_attn.q.weight")))).count();
        let vace_in_channels = if w.contains(&at("vace_patch_embedding.weight")) { w.get(&at("vace_patch_embedding.weight"))?.ne()[0] / patch } else { 0 };
        Ok(WanConfig {
            in_channels: pin / patch,
            out_channels: out / patch,
            dim,
            heads: if dim % HEAD_DIM == 0 { dim / HEAD_DIM } else { 1 },
            ffn: w.get(&at("blocks.0.ffn.0.weight"))?.ne()[1],
            layers: (0..).take_while(|i| w.contains(&at(&format!("blocks.{i}.self_attn.q.weight")))).count(),
            text_dim: w.get(&at("text_embedding.0.weight"))?.ne()[0],
            freq_dim: w.get(&at("time_embedding.0.weight"))?.ne()[0],
            image_dim,
            image_positions: w.contains(&at("img_emb.emb_pos")),
            cross_attn_norm: w.contains(&at("blocks.0.norm3.weight")),
            theta: 10_000.0,
            vace_layers,
            vace_in_channels,
        })
    }

    /// The VACE block that follows block `i`, if one does (ComfyUI's and sd.cpp's
    /// `vace_layers_mapping`: every layers/vace_layers-th block from the first).
    pub fn vace_after(&self, i: usize) -> Option<usize> {
        let step = self.layers.checked_div(self.vace_layers)?.max(1);
        (i % step == 0).then_some(i / step).filter(|&n| n < self.vace_layers)
    }

    pub fn head_dim(&self) -> i64 {
        self.dim / self.heads
    }

    /// The rotary sections of a head per axis (frame, row, column): Wan's
    /// `d − 4·(d/6)`, `2·(d/6)`, `2·(d/6)`.
    pub fn axes(&self) -> Vec<usize> {
        let d = self.head_dim() as usize;
        vec![d - 4 * (d / 6), 2 * (d / 6), 2 * (d / 6)]
    }

    /// Wan 2.2 TI2V-5B, the model of the Wan 2.2 VAE's 48-channel latents: given frames
    /// are held clean and read at their own noise level, 0 (ComfyUI's `WAN22`
    /// `process_timestep` / `scale_latent_inpaint`, sd.cpp's "Wan2.2-TI2V-5B").
    pub fn frame_timesteps(&self) -> bool {
        self.out_channels == 48
    }

    pub fn variant(&self) -> Variant {
        match (self.image_dim, self.in_channels > self.out_channels) {
            (Some(_), _) => Variant::I2v,
            (None, true) => Variant::I2vNoClip,
            (None, false) => Variant::T2v,
        }
    }
}

/// The inputs of one evaluation: `B` videos sharing their text length.
pub struct WanInputs<'a, 'b> {
    /// Video tokens [C·4, L, B] (L = frames · rows · cols in that order), each patch's
    /// features in (channel, row, column) order, as the patch kernel reads them.
    pub x: Tensor<'a>,
    pub frames: i64,
    pub rows: i64,
    pub cols: i64,
    /// Text features [text_dim, Lc, B].
    pub context: Tensor<'a>,
    /// CLIP-vision penultimate features [image_dim, Li, B] (I2V models).
    pub image: Option<Tensor<'a>>,
    /// The model's timestep (σ·1000) per video, or per token of every video (Wan2.2
    /// TI2V: B·L values, the first frame's tokens at 0).
    pub timesteps: &'b [f32],
    /// VACE controls, each through every VACE block of its own (ComfyUI's list of
    /// `vace_context`s); none for other models.
    pub vace: &'b [VaceTokens<'a>],
}

/// One VACE control of the videos: its tokens [vace_in·4, L, B], patched as the video's,
/// and its strength per video [1, 1, B].
pub struct VaceTokens<'a> {
    pub tokens: Tensor<'a>,
    pub strength: Tensor<'a>,
}

/// A Wan transformer over [`Weights`] whose shapes have been checked.
pub struct Wan<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: WanConfig,
}

impl<'w> Wan<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: WanConfig) -> Result<Self> {
        let c = &config;
        if c.heads < 1 || c.dim % c.heads != 0 {
            return Err(ModelError::Config(format!("Wan blocks {} wide in {} heads", c.dim, c.heads)));
        }
        rope::check_axes(&c.axes(), c.head_dim())?;
        let at = |s: &str| format!("{prefix}{s}");
        let lin = |name: &str, i: i64, o: i64| -> Result<()> {
            w.expect(&at(&format!("{name}.weight")), &[i, o])?;
            w.expect(&at(&format!("{name}.bias")), &[o])?;
            Ok(())
        };
        let d = c.dim;
        let patch = PATCH.iter().product::<i64>();
        lin("patch_embedding", c.in_channels * patch, d)?;
        lin("text_embedding.0", c.text_dim, d)?;
        lin("text_embedding.2", d, d)?;
        lin("time_embedding.0", c.freq_dim, d)?;
        lin("time_embedding.2", d, d)?;
        lin("time_projection.1", d, 6 * d)?;
        if c.layers == 0 {
            return Err(ModelError::Config(format!("a Wan transformer without blocks: no `{}`", at("blocks.0.self_attn.q.weight"))));
        }
        if c.vace_layers > c.layers {
            return Err(ModelError::Config(format!("{} VACE blocks for {} blocks", c.vace_layers, c.layers)));
        }
        if c.vace_layers > 0 {
            lin("vace_patch_embedding", c.vace_in_channels * patch, d)?;
            lin("vace_blocks.0.before_proj", d, d)?;
        }
        let blocks = (0..c.layers).map(|i| format!("blocks.{i}")).chain((0..c.vace_layers).map(|n| format!("vace_blocks.{n}")));
        for p in blocks {
            if p.starts_with("vace_") {
                lin(&format!("{p}.after_proj"), d, d)?;
            }
            let mut parts = vec!["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o"];
            if c.image_dim.is_some() {
                parts.extend(["cross_attn.k_img", "cross_attn.v_img"]);
            }
            for part in parts {
                lin(&format!("{p}.{part}"), d, d)?;
            }
            let mut norms = vec!["self_attn.norm_q", "self_attn.norm_k", "cross_attn.norm_q", "cross_attn.norm_k"];
            if c.image_dim.is_some() {
                norms.push("cross_attn.norm_k_img");
            }
            if c.cross_attn_norm {
                norms.push("norm3");
            }
            for n in norms {
                w.expect(&at(&format!("{p}.{n}.weight")), &[d])?;
            }
            lin(&format!("{p}.ffn.0"), d, c.ffn)?;
            lin(&format!("{p}.ffn.2"), c.ffn, d)?;
            w.expect(&at(&format!("{p}.modulation")), &[d, 6, 1])?;
        }
        lin("head.head", d, patch * c.out_channels)?;
        w.expect(&at("head.modulation"), &[d, 2, 1])?;
        if let Some(id) = c.image_dim {
            for norm in [("img_emb.proj.0", id), ("img_emb.proj.4", d)] {
                w.expect(&at(&format!("{}.weight", norm.0)), &[norm.1])?;
                w.expect(&at(&format!("{}.bias", norm.0)), &[norm.1])?;
            }
            lin("img_emb.proj.1", id, id)?;
            lin("img_emb.proj.3", id, d)?;
        }
        Ok(Wan { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The predicted velocity as tokens [4·out_channels, L, B], each patch's features in
    /// (row, column, channel) order (Wan's `unpatchify`).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: &WanInputs<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let patch = PATCH.iter().product::<i64>();
        let [fin, l, b, _] = x.x.ne();
        let [tw, lc, bc, _] = x.context.ne();
        let per_token = x.timesteps.len() as i64 == b * l && l > 1;
        if fin != patch * c.in_channels || tw != c.text_dim || bc != b || x.frames * x.rows * x.cols != l || !(x.timesteps.len() as i64 == b || per_token) {
            return Err(ModelError::Input(format!(
                "video tokens {:?} ({}×{}×{} patches), text {:?} and {} timesteps for a Wan model of {} / {} features",
                x.x.ne(),
                x.frames,
                x.rows,
                x.cols,
                x.context.ne(),
                x.timesteps.len(),
                patch * c.in_channels,
                c.text_dim
            )));
        }
        let w = self.w;
        let d = c.dim;
        // Positions (frame, row, column) from 0, tokens in that order.
        let ids: Vec<Vec<f32>> = (0..x.frames).flat_map(|f| dit::image_ids(x.rows as usize, x.cols as usize, f as f32)).map(|a| a.to_vec()).collect();
        let (cos, sin) = rope::tables(run, &ids, &c.axes(), c.theta, b as usize)?;

        // The timestep embedding: per video [D, 1, B], or per token [D, L, B].
        let tn = x.timesteps.len() as i64;
        let t = run.input_f32(&[tn], x.timesteps.to_vec())?;
        let t_freq = ctx.timestep_embedding(t, c.freq_dim as i32, 10_000)?; // [freq, tn]
        let e = linear(ctx, w, &self.name("time_embedding.2"), ctx.silu(linear(ctx, w, &self.name("time_embedding.0"), t_freq)?)?)?; // [D, tn]
        let e0 = linear(ctx, w, &self.name("time_projection.1"), ctx.silu(e)?)?; // [6D, tn]
        let steps = if per_token { l } else { 1 };
        let e0 = ctx.reshape(e0, [d, 6, steps, b])?;

        let mut context = linear(ctx, w, &self.name("text_embedding.2"), ctx.gelu_tanh_exact(linear(ctx, w, &self.name("text_embedding.0"), x.context)?)?)?;
        let mut image_tokens = 0;
        if let Some(id) = c.image_dim {
            let img = x.image.ok_or_else(|| ModelError::Input("this Wan I2V model reads CLIP-vision image features (clip_vision_output); none were given".into()))?;
            let [iw, li, ib, _] = img.ne();
            if iw != id || ib != b {
                return Err(ModelError::Input(format!("CLIP-vision features {:?} for a Wan model reading {id} wide ones", img.ne())));
            }
            let mut img = img;
            let mut li = li;
            if c.image_positions {
                // FLF2V: as many tokens as there are positions (a start and an end frame's
                // states), each with its position (ComfyUI's slicing: fewer tokens take
                // the first positions, more are cut).
                let pos = dit::table(ctx, run, w.get(&self.name("img_emb.emb_pos"))?)?;
                let n = pos.ne()[1].min(li);
                if n < li {
                    img = dit::rows(ctx, img, 0, n)?;
                    li = n;
                }
                let nb = pos.nb();
                let pos = ctx.view(pos, [id, n, 1, 1], [nb[1], nb[2], nb[3]], 0)?;
                img = ctx.add(img, pos)?;
            }
            let h = layer_norm(ctx, w, &self.name("img_emb.proj.0"), img, 1e-5)?;
            let h = ctx.gelu_erf(linear(ctx, w, &self.name("img_emb.proj.1"), h)?)?;
            let h = linear(ctx, w, &self.name("img_emb.proj.3"), h)?;
            let h = layer_norm(ctx, w, &self.name("img_emb.proj.4"), h, 1e-5)?;
            context = ctx.concat(h, context, 1)?;
            image_tokens = li;
        } else if x.image.is_some() {
            return Err(ModelError::Input("CLIP-vision image features for a Wan model without an image embedding (`img_emb`): only Wan2.1 I2V/FLF2V read them".into()));
        }

        let blk = Block { ctx, w, heads: c.heads, compute: self.compute_type(), cos, sin, image_tokens, lc: lc + image_tokens, cross_norm: c.cross_attn_norm };
        let mut h = linear(ctx, w, &self.name("patch_embedding"), x.x)?; // [D, L, B]
        let modulation = |run: &mut GraphRun<'a>, p: &str| -> Result<Vec<Tensor<'a>>> { six(ctx, ctx.add(e0, ctx.reshape(dit::table(ctx, run, w.get(&format!("{p}.modulation"))?)?, [d, 6, 1, 1])?)?) }; // [D, 6, steps, B]
        // VACE: each control's tokens, embedded; the first VACE block adds the video's.
        if x.vace.is_empty() != (c.vace_layers == 0) {
            return Err(ModelError::Input(if c.vace_layers == 0 { "a VACE control for a Wan model without VACE blocks".into() } else { "this Wan VACE model reads a control (vace_context); none was given".into() }));
        }
        let mut controls = Vec::with_capacity(x.vace.len());
        for v in x.vace {
            let [f, lv, bv, _] = v.tokens.ne();
            if f != c.vace_in_channels * PATCH.iter().product::<i64>() || lv != l || bv != b || v.strength.ne() != [1, 1, b, 1] {
                return Err(ModelError::Input(format!("VACE tokens {:?} (strengths {:?}) for video tokens {:?} and {} control channels", v.tokens.ne(), v.strength.ne(), x.x.ne(), c.vace_in_channels)));
            }
            controls.push(linear(ctx, w, &self.name("vace_patch_embedding"), v.tokens)?);
        }
        let embedded = h;
        for i in 0..c.layers {
            let p = self.name(&format!("blocks.{i}"));
            h = blk.forward(&p, h, context, &modulation(run, &p)?)?;
            let Some(n) = c.vace_after(i) else { continue };
            let p = self.name(&format!("vace_blocks.{n}"));
            for (control, v) in controls.iter_mut().zip(x.vace) {
                if n == 0 {
                    *control = ctx.add(linear(ctx, w, &format!("{p}.before_proj"), *control)?, embedded)?;
                }
                *control = blk.forward(&p, *control, context, &modulation(run, &p)?)?;
                h = ctx.add(h, ctx.mul(linear(ctx, w, &format!("{p}.after_proj"), *control)?, v.strength)?)?;
            }
        }
        // The head's (shift, scale): its two learned rows plus the timestep embedding itself.
        let hm = dit::table(ctx, run, w.get(&self.name("head.modulation"))?)?;
        let e = ctx.reshape(e, [d, steps, b, 1])?;
        let row = |j: usize| -> Result<Tensor<'a>> { Ok(ctx.add(e, ctx.view(hm, [d, 1, 1, 1], [hm.nb()[1], hm.nb()[2], hm.nb()[3]], j * hm.nb()[1])?)?) };
        let h = dit::modulate(ctx, ctx.norm(h, EPS)?, row(0)?, row(1)?)?;
        linear(ctx, w, &self.name("head.head"), h)
    }

    /// The type the projections compute in: bf16 models may take the CPU's bf16 attention.
    fn compute_type(&self) -> GType {
        self.w.get(&self.name("blocks.0.self_attn.q.weight")).map_or(GType::F32, |t| t.dtype())
    }
}

/// The k-th rows of a modulation m [D, K, S, B] (S = 1 or one per token) as K tensors that
/// broadcast over a sequence [D, L, B]: [D, 1, B] or [D, L, B].
fn six<'a>(ctx: &'a Context, m: Tensor<'a>) -> Result<Vec<Tensor<'a>>> {
    let [d, k, s, b] = m.ne();
    let nb = m.nb();
    (0..k)
        .map(|j| {
            let v = ctx.view(m, [d, s, b, 1], [nb[2], nb[3], nb[3] * b as usize], j as usize * nb[1])?;
            Ok(ctx.cont(v)?)
        })
        .collect()
}

struct Block<'a> {
    ctx: &'a Context,
    w: &'a Weights,
    heads: i64,
    compute: GType,
    cos: Tensor<'a>,
    sin: Tensor<'a>,
    /// How many of the context's first tokens are image tokens (I2V).
    image_tokens: i64,
    lc: i64,
    cross_norm: bool,
}

impl<'a> Block<'a> {
    /// `WanAttentionBlock` at `p` on x [D, L, B] with the six modulation rows `m`.
    fn forward(&self, p: &str, x: Tensor<'a>, context: Tensor<'a>, m: &[Tensor<'a>]) -> Result<Tensor<'a>> {
        let ctx = self.ctx;
        let y = self.self_attention(p, dit::modulate(ctx, ctx.norm(x, EPS)?, m[0], m[1])?)?;
        let x = dit::gated(ctx, x, m[2], y)?;
        let n = if self.cross_norm { layer_norm(ctx, self.w, &format!("{p}.norm3"), x, EPS)? } else { x };
        let x = ctx.add(x, self.cross_attention(p, n, context)?)?;
        let y = self.ffn(p, dit::modulate(ctx, ctx.norm(x, EPS)?, m[3], m[4])?)?;
        dit::gated(ctx, x, m[5], y)
    }

    fn self_attention(&self, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let [d, l, b, _] = x.ne();
        let dh = d / self.heads;
        let rotated = |part: &str| -> Result<Tensor<'a>> {
            let t = rms_norm(ctx, w, &format!("{p}.self_attn.norm_{part}.weight"), linear(ctx, w, &format!("{p}.self_attn.{part}"), x)?, EPS)?;
            let t = rope::apply(ctx, ctx.reshape(t, [dh, self.heads, l, b])?, self.cos, self.sin)?;
            Ok(ctx.reshape(t, [d, l, b, 1])?)
        };
        let (q, k) = (rotated("q")?, rotated("k")?);
        let v = linear(ctx, w, &format!("{p}.self_attn.v"), x)?;
        let a = attention_typed(ctx, q, k, v, self.heads, None, self.compute)?;
        linear(ctx, w, &format!("{p}.self_attn.o"), a)
    }

    /// Cross-attention to the text (and, for I2V, separately to the image tokens that
    /// lead the context, the two results summed).
    fn cross_attention(&self, p: &str, x: Tensor<'a>, context: Tensor<'a>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let a = format!("{p}.cross_attn");
        let q = rms_norm(ctx, w, &format!("{a}.norm_q.weight"), linear(ctx, w, &format!("{a}.q"), x)?, EPS)?;
        let text = dit::rows(ctx, context, self.image_tokens, self.lc - self.image_tokens)?;
        let k = rms_norm(ctx, w, &format!("{a}.norm_k.weight"), linear(ctx, w, &format!("{a}.k"), text)?, EPS)?;
        let v = linear(ctx, w, &format!("{a}.v"), text)?;
        let mut out = attention_typed(ctx, q, k, v, self.heads, None, self.compute)?;
        if self.image_tokens > 0 {
            let img = dit::rows(ctx, context, 0, self.image_tokens)?;
            let k = rms_norm(ctx, w, &format!("{a}.norm_k_img.weight"), linear(ctx, w, &format!("{a}.k_img"), img)?, EPS)?;
            let v = linear(ctx, w, &format!("{a}.v_img"), img)?;
            out = ctx.add(out, attention_typed(ctx, q, k, v, self.heads, None, self.compute)?)?;
        }
        linear(ctx, w, &format!("{a}.o"), out)
    }

    fn ffn(&self, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let h = ctx.gelu_tanh_exact(linear(ctx, w, &format!("{p}.ffn.0"), x)?)?;
        linear(ctx, w, &format!("{p}.ffn.2"), h)
    }
}

/// `src` with a Wan transformer (under any prefix; diffusers' names shown in the release's
/// by [`diffusers`]) whose patch kernel — 5-D [D, C, 1, 2, 2] as released, or 4-D
/// [D·C, 1, 2, 2] as sd.cpp's convert writes GGUF files — is shown as the [D, C·4] matrix
/// it multiplies patches by; any other source as it is.
pub fn layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let src = diffusers::single_file(src)?;
    // The video's patch kernel and VACE's, each with its output width (sd.cpp's 4-D
    // kernel has it only in its bias).
    let mut kernels: Vec<(String, usize)> = Vec::new();
    for t in src.tensors().iter().filter(|t| t.name.ends_with("patch_embedding.weight") && t.shape.len() >= 4) {
        let bad = |why: &str| ModelError::Weight { name: t.name.clone(), detail: format!("{:?}: {why}", t.shape) };
        let (out, patch) = match t.shape[..] {
            [o, _, pt, ph, pw] => (o, [pt, ph, pw]),
            [oc, pt, ph, pw] => {
                let bias = t.name.replace(".weight", ".bias");
                let o = src.get(&bias).and_then(|b| b.shape.first().copied()).ok_or_else(|| bad(&format!("a 4-D patch kernel (sd.cpp's convert) needs `{bias}` for its width")))?;
                if o == 0 || oc % o != 0 {
                    return Err(bad(&format!("not whole kernels of `{bias}`'s width {o}")));
                }
                (o, [pt, ph, pw])
            }
            _ => continue,
        };
        if patch.map(|v| v as i64) != PATCH {
            return Err(bad("only 1×2×2 patches (every released Wan model) are supported"));
        }
        kernels.push((t.name.clone(), out));
    }
    if kernels.is_empty() {
        return Ok(src);
    }
    let renamed = crate::io::Assembled::renamed(src, |t: &TensorInfo| {
        let mut info = t.clone();
        if let Some((_, out)) = kernels.iter().find(|(n, _)| *n == t.name) {
            info.shape = vec![*out, t.shape.iter().product::<usize>() / out];
        }
        Some(info)
    })
    .map_err(|name| ModelError::Config(format!("two tensors named `{name}`")))?;
    Ok(Box::new(renamed))
}
