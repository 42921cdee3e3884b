//! Z-Image (Tongyi-MAI's S3-DiT, Turbo and Base): one stream of transformer blocks over
//! the caption's and the image's tokens together, after two refiner stacks that see each
//! alone (the image's modulated by the timestep, the caption's not). Blocks are
//! Lumina-2's: sandwich RMS norms around attention and a SwiGLU feed-forward, q/k RMS
//! norms, tanh-gated scale-only adaLN from a 256-wide timestep embedding.
//!
//! Keys are the single-file release's (what ComfyUI and sd.cpp load: `layers.N.attention.qkv`,
//! `noise_refiner.N.*`, `cap_embedder.1`, `x_pad_token`, ...), bare or under
//! `model.diffusion_model.`; diffusers' names are shown in them by [`diffusers`].
//!
//! Both token runs are padded to multiples of 32 with learned pad tokens, and positions
//! run on three rotary axes (caption index, image row, image column) at θ 256. The model
//! reads its timestep reversed (`t = 1000·(1 − σ)`) and predicts the negated flow
//! velocity, which [`denoiser`] turns back.

pub mod denoiser;
pub mod diffusers;

pub use denoiser::{ZImageDenoiser, ZImageItem};

use super::dit::{self, rope};
use super::nn::{attention_typed, linear, rms_norm};
use super::{ModelError, Result, Weights};
use crate::ggml::{Circular, Context, GType, GraphRun, Tensor};

/// The weight that tells a file holds a Z-Image transformer, relative to its prefix
/// (sd.cpp's signature key).
pub const MARKER: &str = "cap_embedder.0.weight";

/// Both token runs are padded to a multiple of this many tokens.
pub const SEQ_MULTIPLE: usize = 32;

/// The RMS norms' epsilon (blocks, q/k norms, caption embedder).
const NORM_EPS: f32 = 1e-5;

#[derive(Clone, Debug, PartialEq)]
pub struct ZImageConfig {
    /// Latent channels (16: FLUX's VAE).
    pub in_channels: i64,
    pub out_channels: i64,
    /// Patch side (2: tokens of 2×2 latent pixels).
    pub patch: i64,
    pub hidden: i64,
    pub heads: i64,
    pub head_dim: i64,
    /// Width of the SwiGLU's hidden layer.
    pub ffn_hidden: i64,
    pub layers: usize,
    pub noise_refiners: usize,
    pub context_refiners: usize,
    /// Width of the caption features (Qwen3-4B's hidden size: 2560).
    pub caption: i64,
    /// Width of the timestep embedding the modulations read (min(hidden, 256)).
    pub t_embed: i64,
    /// Head-dimension sections of the rotary embedding per position axis; not stored in
    /// files: (32, 48, 48) for the released models.
    pub axes: Vec<usize>,
    pub theta: f64,
}

/// The inputs of one evaluation: `B` sequences sharing their caption length.
pub struct ZImageInputs<'a, 'b> {
    /// Image tokens [p·p·C, L, B], each patch's features in (row, column, channel) order.
    pub img: Tensor<'a>,
    /// The image's patch rows and columns (rows · cols = L).
    pub rows: i64,
    pub cols: i64,
    /// Caption features [caption, Lc, B].
    pub cap: Tensor<'a>,
    /// The model's timestep per sequence (`1000·(1 − σ)`).
    pub timesteps: &'b [f32],
    /// Seamless tiling (sd.cpp's `--circular*`): the image's rows and columns wrap around
    /// in the rotary embedding on these axes, as `gen_z_image_pe` wraps them.
    pub circular: Circular,
}

/// A Z-Image transformer over [`Weights`] whose shapes have been checked.
pub struct ZImage<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: ZImageConfig,
}

/// How many blocks `{prefix}{list}.N.` a file holds.
fn count_blocks(w: &Weights, prefix: &str, list: &str) -> usize {
    (0..).take_while(|i| w.contains(&format!("{prefix}{list}.{i}.attention.qkv.weight"))).count()
}

impl ZImageConfig {
    /// Read the dimensions off the weights under `prefix` (`""` or `model.diffusion_model.`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a Z-Image transformer: no `{}`", at(MARKER))));
        }
        let patch = 2;
        let [pin, hidden, ..] = w.get(&at("x_embedder.weight"))?.ne();
        let caption = w.get(&at(MARKER))?.ne()[0];
        let head_dim = w.get(&at("layers.0.attention.q_norm.weight"))?.ne()[0];
        let qkv = w.get(&at("layers.0.attention.qkv.weight"))?.ne()[1];
        let ffn_hidden = w.get(&at("layers.0.feed_forward.w1.weight"))?.ne()[1];
        let out = w.get(&at("final_layer.linear.weight"))?.ne()[1];
        let t_embed = w.get(&at("t_embedder.mlp.2.weight"))?.ne()[1];
        if head_dim < 1 || hidden % head_dim != 0 || qkv != 3 * hidden {
            return Err(ModelError::Config(format!(
                "Z-Image attention of {qkv} q|k|v features over {hidden} wide tokens in heads of {head_dim}: only as many key/value heads as query heads are supported"
            )));
        }
        Ok(ZImageConfig {
            in_channels: pin / (patch * patch),
            out_channels: out / (patch * patch),
            patch,
            hidden,
            heads: hidden / head_dim,
            head_dim,
            ffn_hidden,
            layers: count_blocks(w, prefix, "layers"),
            noise_refiners: count_blocks(w, prefix, "noise_refiner"),
            context_refiners: count_blocks(w, prefix, "context_refiner"),
            caption,
            t_embed,
            axes: vec![32, 48, 48],
            theta: 256.0,
        })
    }
}

impl<'w> ZImage<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: ZImageConfig) -> Result<Self> {
        let c = &config;
        rope::check_axes(&c.axes, c.head_dim)?;
        let at = |s: &str| format!("{prefix}{s}");
        let lin = |name: &str, i: i64, o: i64| -> Result<()> {
            w.expect(&at(&format!("{name}.weight")), &[i, o])?;
            w.expect(&at(&format!("{name}.bias")), &[o])?;
            Ok(())
        };
        let bare = |name: &str, i: i64, o: i64| w.expect(&at(&format!("{name}.weight")), &[i, o]).map(|_| ());
        let (d, p2) = (c.hidden, c.patch * c.patch);
        lin("x_embedder", p2 * c.in_channels, d)?;
        w.expect(&at("cap_embedder.0.weight"), &[c.caption])?;
        lin("cap_embedder.1", c.caption, d)?;
        let mid = w.get(&at("t_embedder.mlp.0.weight"))?.ne()[1];
        lin("t_embedder.mlp.0", 256, mid)?;
        lin("t_embedder.mlp.2", mid, c.t_embed)?;
        for pad in ["x_pad_token", "cap_pad_token"] {
            let t = w.get(&at(pad))?;
            if t.n_elements() != d {
                return Err(ModelError::Weight { name: at(pad), detail: format!("{:?}: one {d} wide token expected", t.ne()) });
            }
        }
        let blocks = [("layers", c.layers, true), ("noise_refiner", c.noise_refiners, true), ("context_refiner", c.context_refiners, false)];
        for (list, n, modulated) in blocks {
            for i in 0..n {
                let p = format!("{list}.{i}");
                bare(&format!("{p}.attention.qkv"), d, 3 * d)?;
                bare(&format!("{p}.attention.out"), d, d)?;
                for norm in ["q_norm", "k_norm"] {
                    w.expect(&at(&format!("{p}.attention.{norm}.weight")), &[c.head_dim])?;
                }
                bare(&format!("{p}.feed_forward.w1"), d, c.ffn_hidden)?;
                bare(&format!("{p}.feed_forward.w3"), d, c.ffn_hidden)?;
                bare(&format!("{p}.feed_forward.w2"), c.ffn_hidden, d)?;
                for norm in ["attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"] {
                    w.expect(&at(&format!("{p}.{norm}.weight")), &[d])?;
                }
                if modulated {
                    lin(&format!("{p}.adaLN_modulation.0"), c.t_embed, 4 * d)?;
                }
            }
        }
        if c.layers == 0 {
            return Err(ModelError::Config(format!("a Z-Image transformer without blocks: no `{}`", at("layers.0.attention.qkv.weight"))));
        }
        lin("final_layer.linear", d, p2 * c.out_channels)?;
        lin("final_layer.adaLN_modulation.1", c.t_embed, d)?;
        Ok(ZImage { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The model's output tokens [p·p·out_channels, L, B] (the negated flow velocity,
    /// patchified as the input).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: &ZImageInputs<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [fin, l, b, _] = x.img.ne();
        let [cw, lc, bc, _] = x.cap.ne();
        if fin != c.patch * c.patch * c.in_channels || cw != c.caption || bc != b || x.rows * x.cols != l || x.timesteps.len() as i64 != b {
            return Err(ModelError::Input(format!(
                "image tokens {:?} ({}×{} patches), caption {:?} and {} timesteps for a Z-Image model of {} / {} features",
                x.img.ne(),
                x.rows,
                x.cols,
                x.cap.ne(),
                x.timesteps.len(),
                fin,
                c.caption
            )));
        }
        let (lc_pad, l_pad) = (padded(lc as usize), padded(l as usize));
        // Positions as the reference numbers them: caption tokens (pads included) 1, 2, …
        // on the first axis; image tokens one past the caption there, with their row and
        // column; image pads at the origin.
        let cap_ids: Vec<Vec<f32>> = (0..lc_pad).map(|i| vec![(i + 1) as f32, 0.0, 0.0]).collect();
        let index = (lc_pad + 1) as f32;
        let img_ids: Vec<Vec<f32>> = dit::image_ids(x.rows as usize, x.cols as usize, index)
            .into_iter()
            .map(|a| a.to_vec())
            .chain(std::iter::repeat_n(vec![0.0; 3], l_pad - l as usize))
            .collect();
        let joint_ids: Vec<Vec<f32>> = cap_ids.iter().chain(&img_ids).cloned().collect();
        // The image's own tokens wrap at its rows and columns; caption and pads never.
        let (img_wrap, joint_wrap): (Vec<Vec<usize>>, Vec<Vec<usize>>) = if x.circular.any() {
            let period = vec![0, if x.circular.y { x.rows as usize } else { 0 }, if x.circular.x { x.cols as usize } else { 0 }];
            let img: Vec<Vec<usize>> = (0..l_pad).map(|i| if i < l as usize { period.clone() } else { vec![0; 3] }).collect();
            let joint = std::iter::repeat_n(vec![0; 3], lc_pad).chain(img.iter().cloned()).collect();
            (img, joint)
        } else {
            (Vec::new(), Vec::new())
        };
        let bu = b as usize;
        let rope_of = |run: &mut GraphRun<'a>, ids: &[Vec<f32>], wraps: &[Vec<usize>]| -> Result<Rope<'a>> {
            let (cos, sin) = rope::tables_wrapped(run, ids, wraps, &c.axes, c.theta, bu)?;
            Ok(Rope { cos, sin })
        };
        let (cap_pe, img_pe, joint_pe) = (rope_of(run, &cap_ids, &[])?, rope_of(run, &img_ids, &img_wrap)?, rope_of(run, &joint_ids, &joint_wrap)?);

        let t = run.input_f32(&[b], x.timesteps.to_vec())?;
        let t_freq = ctx.timestep_embedding(t, 256, 10_000)?;
        let h = ctx.silu(linear(ctx, self.w, &self.name("t_embedder.mlp.0"), t_freq)?)?;
        let t_emb = linear(ctx, self.w, &self.name("t_embedder.mlp.2"), h)?; // [t_embed, B]

        let blk = Block { ctx, w: self.w, heads: c.heads, compute: self.compute_type() };
        let mut img = linear(ctx, self.w, &self.name("x_embedder"), x.img)?;
        img = self.pad(ctx, run, img, "x_pad_token", l_pad)?;
        for i in 0..c.noise_refiners {
            img = blk.forward(&self.name(&format!("noise_refiner.{i}")), img, &img_pe, Some(t_emb))?;
        }
        let cap = rms_norm(ctx, self.w, &self.name("cap_embedder.0.weight"), x.cap, NORM_EPS)?;
        let mut cap = linear(ctx, self.w, &self.name("cap_embedder.1"), cap)?;
        cap = self.pad(ctx, run, cap, "cap_pad_token", lc_pad)?;
        for i in 0..c.context_refiners {
            cap = blk.forward(&self.name(&format!("context_refiner.{i}")), cap, &cap_pe, None)?;
        }
        let mut joint = ctx.concat(cap, img, 1)?;
        for i in 0..c.layers {
            joint = blk.forward(&self.name(&format!("layers.{i}")), joint, &joint_pe, Some(t_emb))?;
        }
        let img = dit::rows(ctx, joint, lc_pad as i64, l)?;
        let scale = linear(ctx, self.w, &self.name("final_layer.adaLN_modulation.1"), ctx.silu(t_emb)?)?;
        let scale = ctx.reshape(scale, [c.hidden, 1, b, 1])?;
        let img = scale_only(ctx, ctx.norm(img, 1e-6)?, scale)?;
        linear(ctx, self.w, &self.name("final_layer.linear"), img)
    }

    /// x [D, L, B] followed by copies of the learned pad token up to `to` tokens.
    fn pad<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: Tensor<'a>, token: &str, to: usize) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let [d, l, b, _] = x.ne();
        let extra = to as i64 - l;
        if extra == 0 {
            return Ok(x);
        }
        let token = ctx.reshape(dit::table(ctx, run, self.w.get(&self.name(token))?)?, [d, 1, 1, 1])?;
        let zeros = run.input_f32(&[d, extra, b], vec![0.0; (d * extra * b) as usize])?;
        Ok(ctx.concat(x, ctx.add(zeros, token)?, 1)?)
    }

    /// The type the projections compute in: bf16 models may take the CPU's bf16 attention.
    fn compute_type(&self) -> GType {
        self.w.get(&self.name("layers.0.attention.qkv.weight")).map_or(GType::F32, |t| t.dtype())
    }
}

/// `n` rounded up to whole multiples of [`SEQ_MULTIPLE`].
pub fn padded(n: usize) -> usize {
    n.div_ceil(SEQ_MULTIPLE) * SEQ_MULTIPLE
}

/// `x·(1 + scale)`, scale [D, 1, B] over x [D, L, B].
fn scale_only<'a>(ctx: &'a Context, x: Tensor<'a>, scale: Tensor<'a>) -> Result<Tensor<'a>> {
    Ok(ctx.add(x, ctx.mul(x, scale)?)?)
}

struct Rope<'a> {
    cos: Tensor<'a>,
    sin: Tensor<'a>,
}

struct Block<'a> {
    ctx: &'a Context,
    w: &'a Weights,
    heads: i64,
    compute: GType,
}

impl<'a> Block<'a> {
    /// Lumina-2's `JointTransformerBlock` at `p` on x [D, L, B]; modulated by the
    /// timestep embedding `t` [t_embed, B] when given (scale and tanh gate of the
    /// attention, then of the feed-forward).
    fn forward(&self, p: &str, x: Tensor<'a>, pe: &Rope<'a>, t: Option<Tensor<'a>>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let norm = |name: &str, x: Tensor<'a>| rms_norm(ctx, w, &format!("{p}.{name}.weight"), x, NORM_EPS);
        let mods = match t {
            Some(t) => Some(dit::chunks(ctx, linear(ctx, w, &format!("{p}.adaLN_modulation.0"), t)?, 4)?),
            None => None,
        };
        let scaled = |h: Tensor<'a>, k: usize| -> Result<Tensor<'a>> {
            match &mods {
                Some(m) => scale_only(ctx, h, m[k]),
                None => Ok(h),
            }
        };
        let gated = |x: Tensor<'a>, y: Tensor<'a>, k: usize| -> Result<Tensor<'a>> {
            match &mods {
                Some(m) => Ok(ctx.add(x, ctx.mul(y, ctx.tanh(m[k])?)?)?),
                None => Ok(ctx.add(x, y)?),
            }
        };
        let a = self.attention(p, scaled(norm("attention_norm1", x)?, 0)?, pe)?;
        let x = gated(x, norm("attention_norm2", a)?, 1)?;
        let f = self.feed_forward(p, scaled(norm("ffn_norm1", x)?, 2)?)?;
        gated(x, norm("ffn_norm2", f)?, 3)
    }

    fn attention(&self, p: &str, x: Tensor<'a>, pe: &Rope<'a>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let [d, l, b, _] = x.ne();
        let dh = d / self.heads;
        let qkv = linear(ctx, w, &format!("{p}.attention.qkv"), x)?;
        let head = |j: i64, norm: Option<&str>| -> Result<Tensor<'a>> {
            let t = ctx.reshape(dit::features(ctx, qkv, j * d, d)?, [dh, self.heads, l, b])?;
            match norm {
                Some(n) => {
                    let t = rms_norm(ctx, w, &format!("{p}.attention.{n}.weight"), t, NORM_EPS)?;
                    let t = rope::apply(ctx, t, pe.cos, pe.sin)?;
                    Ok(ctx.reshape(t, [d, l, b, 1])?)
                }
                None => Ok(ctx.reshape(t, [d, l, b, 1])?),
            }
        };
        let (q, k, v) = (head(0, Some("q_norm"))?, head(1, Some("k_norm"))?, head(2, None)?);
        let a = attention_typed(ctx, q, k, v, self.heads, None, self.compute)?;
        linear(ctx, w, &format!("{p}.attention.out"), a)
    }

    /// SwiGLU: `w2(silu(w1·x) ⊙ w3·x)`.
    fn feed_forward(&self, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let g = ctx.silu(linear(ctx, w, &format!("{p}.feed_forward.w1"), x)?)?;
        let u = linear(ctx, w, &format!("{p}.feed_forward.w3"), x)?;
        linear(ctx, w, &format!("{p}.feed_forward.w2"), ctx.mul(g, u)?)
    }
}
