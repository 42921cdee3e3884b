//! Qwen-Image (and its Edit models): a dual-stream MMDiT of 60 blocks and nothing else
//! (no single-stream blocks), each block modulating image and text from the timestep
//! alone, with separate q/k/v projections per stream, per-head RMS norms on q and k, one
//! joint attention over [text, image] and GELU-tanh MLPs.
//!
//! Keys are diffusers' names, which the single-file release keeps too
//! (`transformer_blocks.N.attn.add_q_proj`, `img_mod.1`, `txt_norm`, `norm_out.linear`,
//! ...), bare or under `model.diffusion_model.`.
//!
//! Positions are Qwen's "MSRoPE": three rotary axes (frame, row, column; 16/56/56 at θ
//! 10000) with image rows and columns centred on 0, each reference image its own frame,
//! and text tokens on the diagonal just past the image's extent. The model reads σ
//! (embedded at 1000×) and predicts the flow velocity.
//!
//! Qwen-Image-Layered is the same network with one more timestep embedding (an RGB/RGBA
//! flag, always 0 in its pipelines) denoising several frames at once: the image's layers
//! as frames 0, 1, …, the input image before them at frame −1.

pub mod denoiser;

pub use denoiser::{QwenImageDenoiser, QwenImageItem};

use super::dit::{self, rope};
use super::nn::{attention_typed, linear, rms_norm};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GType, GraphRun, Tensor};

/// The weight that tells a file holds a Qwen-Image transformer, relative to its prefix
/// (sd.cpp's signature key).
pub const MARKER: &str = "transformer_blocks.0.img_mod.1.weight";

/// Qwen-Image-Layered's extra timestep embedding (it decomposes an image into RGBA layers
/// denoised as frames).
pub const LAYERED_MARKER: &str = "time_text_embed.addition_t_embedding.weight";

/// The empty tensor that marks an Edit-2511 file (ComfyUI's `default_ref_method`
/// `index_timestep_zero`, sd.cpp's `zero_cond_t`).
pub const ZERO_COND_T_MARKER: &str = "__index_timestep_zero__";

/// The layer and RMS norms' epsilon.
const EPS: f32 = 1e-6;

#[derive(Clone, Debug, PartialEq)]
pub struct QwenImageConfig {
    /// Latent channels (16: the Qwen-Image VAE's).
    pub latent_channels: i64,
    /// Patch side (2: tokens of 2×2 latent pixels).
    pub patch: i64,
    pub hidden: i64,
    pub heads: i64,
    pub head_dim: i64,
    /// Width of the text features (Qwen2.5-VL-7B's hidden size: 3584).
    pub context: i64,
    pub layers: usize,
    /// Head-dimension sections of the rotary embedding per position axis (frame, row,
    /// column); not stored in files: (16, 56, 56) for the released models.
    pub axes: Vec<usize>,
    pub theta: f64,
    /// Qwen-Image-Layered's `addition_t_embedding`: its row 0 joins the timestep
    /// embedding (diffusers' `is_rgb = 0`, sd.cpp's and ComfyUI's default).
    pub additional_t: bool,
    /// The file's `__index_timestep_zero__` flag (ComfyUI's Edit-2511 files; sd.cpp's
    /// `zero_cond_t`): references are modulated as at σ = 0 unless a method is given.
    pub zero_cond_t: bool,
}

/// One image whose tokens the model reads: the frames being denoised first, then the
/// references of an edit, each a `rows` × `cols` grid of patches at position `frame` on
/// the first rotary axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGrid {
    pub rows: usize,
    pub cols: usize,
    pub frame: i32,
}

/// The inputs of one evaluation.
pub struct QwenImageInputs<'a, 'b> {
    /// Image tokens [p·p·C, L, B]: every grid's patches in reading order, grid after grid,
    /// each patch's features in (channel, row, column) order.
    pub img: Tensor<'a>,
    /// The grids `img` holds, the denoised frames first.
    pub grids: &'b [ImageGrid],
    /// How many leading grids are denoised (1; Qwen-Image-Layered: its layers + 1): their
    /// outputs are returned, the references' dropped.
    pub outputs: usize,
    /// Text features [context, Lt, B].
    pub txt: Tensor<'a>,
    /// σ per sequence.
    pub timesteps: &'b [f32],
    /// Qwen-Image-Edit-2511's `zero_cond_t` (ComfyUI's `index_timestep_zero`): the
    /// references' tokens are modulated as at σ = 0, the image's at σ.
    pub ref_timestep_zero: bool,
    /// Seamless tiling (sd.cpp's `--circular*`): the denoised image's rows and columns
    /// wrap around in the rotary embedding on these axes, as `gen_qwen_image_pe` wraps
    /// them (text and references never).
    pub circular: crate::ggml::Circular,
}

/// A Qwen-Image transformer over [`Weights`] whose shapes have been checked.
pub struct QwenImage<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: QwenImageConfig,
}

impl QwenImageConfig {
    /// Read the dimensions off the weights under `prefix` (`""` or `model.diffusion_model.`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a Qwen-Image transformer: no `{}`", at(MARKER))));
        }
        let patch = 2;
        let [fin, hidden, ..] = w.get(&at("img_in.weight"))?.ne();
        let context = w.get(&at("txt_in.weight"))?.ne()[0];
        let head_dim = w.get(&at("transformer_blocks.0.attn.norm_q.weight"))?.ne()[0];
        let out = w.get(&at("proj_out.weight"))?.ne()[1];
        if head_dim < 1 || hidden % head_dim != 0 || fin % (patch * patch) != 0 || out != fin {
            return Err(ModelError::Config(format!(
                "a Qwen-Image transformer of {fin} wide image tokens in, {out} out, {hidden} wide in heads of {head_dim}: not a layout this model has"
            )));
        }
        let layers = (0..).take_while(|i| w.contains(&at(&format!("transformer_blocks.{i}.img_mod.1.weight")))).count();
        Ok(QwenImageConfig {
            latent_channels: fin / (patch * patch),
            patch,
            hidden,
            heads: hidden / head_dim,
            head_dim,
            context,
            layers,
            axes: vec![16, 56, 56],
            theta: 10_000.0,
            additional_t: w.contains(&at(LAYERED_MARKER)),
            zero_cond_t: w.has_marker(&at(ZERO_COND_T_MARKER)),
        })
    }
}

/// Position ids (frame, row, column) of the image tokens of `grids` and of `text` text
/// tokens, as ComfyUI's `QwenImageTransformer2DModel` and sd.cpp's `gen_qwen_image_ids`
/// lay them out: each grid at its frame, its rows and columns centred (−⌊n/2⌋ …
/// ⌈n/2⌉ − 1); text token i sits at m + i on every axis, m the first grid's largest
/// half-extent. diffusers' `QwenEmbedRope` centres odd sides one lower (−⌈n/2⌉ …) and
/// takes m over every grid (its `QwenEmbedLayer3DRope` also over the frame count); for
/// even grids no larger than the first, half as wide as there are frames, all agree.
pub fn position_ids(grids: &[ImageGrid], text: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let centred = |i: usize, n: usize| i as f32 - (n / 2) as f32;
    let img = grids
        .iter()
        .flat_map(|g| (0..g.rows).flat_map(move |r| (0..g.cols).map(move |c| vec![g.frame as f32, centred(r, g.rows), centred(c, g.cols)])))
        .collect();
    let m = grids.first().map_or(0, |g| (g.rows / 2).max(g.cols / 2));
    let txt = (0..text).map(|i| vec![(m + i) as f32; 3]).collect();
    (img, txt)
}

impl<'w> QwenImage<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: QwenImageConfig) -> Result<Self> {
        let c = &config;
        rope::check_axes(&c.axes, c.head_dim)?;
        if c.layers == 0 {
            return Err(ModelError::Config(format!("a Qwen-Image transformer without blocks: no `{prefix}{MARKER}`")));
        }
        if c.additional_t {
            w.expect(&format!("{prefix}{LAYERED_MARKER}"), &[c.hidden, 2])?;
        }
        let at = |s: &str| format!("{prefix}{s}");
        let lin = |name: &str, i: i64, o: i64| -> Result<()> {
            w.expect(&at(&format!("{name}.weight")), &[i, o])?;
            w.expect(&at(&format!("{name}.bias")), &[o])?;
            Ok(())
        };
        let (d, tok) = (c.hidden, c.patch * c.patch * c.latent_channels);
        lin("img_in", tok, d)?;
        w.expect(&at("txt_norm.weight"), &[c.context])?;
        lin("txt_in", c.context, d)?;
        lin("time_text_embed.timestep_embedder.linear_1", 256, d)?;
        lin("time_text_embed.timestep_embedder.linear_2", d, d)?;
        for i in 0..c.layers {
            let p = format!("transformer_blocks.{i}");
            for s in ["img", "txt"] {
                lin(&format!("{p}.{s}_mod.1"), d, 6 * d)?;
                lin(&format!("{p}.{s}_mlp.net.0.proj"), d, 4 * d)?;
                lin(&format!("{p}.{s}_mlp.net.2"), 4 * d, d)?;
            }
            for proj in ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"] {
                lin(&format!("{p}.attn.{proj}"), d, d)?;
            }
            for norm in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
                w.expect(&at(&format!("{p}.attn.{norm}.weight")), &[c.head_dim])?;
            }
        }
        lin("norm_out.linear", d, 2 * d)?;
        lin("proj_out", d, tok)?;
        Ok(QwenImage { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The predicted velocity of the denoised frames' tokens [p·p·C, L₀, B] (the first
    /// `outputs` grids'; the references' outputs are dropped).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: &QwenImageInputs<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [fin, l, b, _] = x.img.ne();
        let [cw, lt, bt, _] = x.txt.ne();
        let grid_tokens: usize = x.grids.iter().map(|g| g.rows * g.cols).sum();
        if fin != c.patch * c.patch * c.latent_channels || cw != c.context || bt != b || x.outputs == 0 || x.outputs > x.grids.len() || grid_tokens as i64 != l || x.timesteps.len() as i64 != b {
            return Err(ModelError::Input(format!(
                "image tokens {:?} for grids {:?}, text {:?} and {} timesteps for a Qwen-Image model of {} / {} wide tokens",
                x.img.ne(),
                x.grids,
                x.txt.ne(),
                x.timesteps.len(),
                c.patch * c.patch * c.latent_channels,
                c.context
            )));
        }
        let (img_ids, txt_ids) = position_ids(x.grids, lt as usize);
        let ids: Vec<Vec<f32>> = txt_ids.into_iter().chain(img_ids).collect();
        let wraps: Vec<Vec<usize>> = if x.circular.any() {
            let g = x.grids[0];
            let period = vec![0, if x.circular.y { g.rows } else { 0 }, if x.circular.x { g.cols } else { 0 }];
            let first = lt as usize..lt as usize + x.outputs * g.rows * g.cols;
            (0..ids.len()).map(|i| if first.contains(&i) { period.clone() } else { vec![0; 3] }).collect()
        } else {
            Vec::new()
        };
        let (cos, sin) = rope::tables_wrapped(run, &ids, &wraps, &c.axes, c.theta, b as usize)?;
        let pe = Rope { cos, sin };

        let embed = |run: &mut GraphRun<'a>, sigmas: Vec<f32>| -> Result<Tensor<'a>> {
            let t = run.input_f32(&[b], sigmas.iter().map(|s| s * 1000.0).collect())?;
            let t_freq = ctx.timestep_embedding(t, 256, 10_000)?;
            let h = ctx.silu(linear(ctx, self.w, &self.name("time_text_embed.timestep_embedder.linear_1"), t_freq)?)?;
            let mut temb = linear(ctx, self.w, &self.name("time_text_embed.timestep_embedder.linear_2"), h)?; // [D, B]
            if c.additional_t {
                let flag = run.input_i32(&[b], vec![0; b as usize])?;
                temb = ctx.add(temb, ctx.get_rows(self.w.get(&self.name(LAYERED_MARKER))?, flag)?)?;
            }
            Ok(ctx.silu(temb)?)
        };
        let temb_act = embed(run, x.timesteps.to_vec())?;
        let first = x.grids[..x.outputs].iter().map(|g| (g.rows * g.cols) as i64).sum::<i64>();
        // The references' own modulation, from σ = 0, for the tokens past the image's.
        let refs = if x.ref_timestep_zero && first < l { Some((embed(run, vec![0.0; b as usize])?, first)) } else { None };

        let mut img = linear(ctx, self.w, &self.name("img_in"), x.img)?;
        let txt = rms_norm(ctx, self.w, &self.name("txt_norm.weight"), x.txt, EPS)?;
        let mut txt = linear(ctx, self.w, &self.name("txt_in"), txt)?;
        let blk = Block { ctx, w: self.w, heads: c.heads, compute: self.compute_type() };
        for i in 0..c.layers {
            (img, txt) = blk.forward(&self.name(&format!("transformer_blocks.{i}")), img, txt, temb_act, refs, &pe)?;
        }
        let img = if first == l { img } else { dit::rows(ctx, img, 0, first)? };
        // AdaLayerNormContinuous: (scale, shift), in that order.
        let m = dit::chunks(ctx, linear(ctx, self.w, &self.name("norm_out.linear"), temb_act)?, 2)?;
        let img = dit::modulate(ctx, ctx.norm(img, EPS)?, m[1], m[0])?;
        linear(ctx, self.w, &self.name("proj_out"), img)
    }

    /// The type the projections compute in: bf16 models may take the CPU's bf16 attention.
    fn compute_type(&self) -> GType {
        self.w.get(&self.name("transformer_blocks.0.attn.to_q.weight")).map_or(GType::F32, |t| t.dtype())
    }
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
    /// `QwenImageTransformerBlock` at `p`: image [D, L, B] and text [D, Lt, B] modulated
    /// by the activated timestep embedding `t` [D, B] (shift, scale, gate for attention,
    /// then for the MLP), attending jointly over [text, image]. With `refs` (`zero_cond_t`),
    /// the image tokens from its index on are modulated by its embedding instead.
    fn forward(&self, p: &str, img: Tensor<'a>, txt: Tensor<'a>, t: Tensor<'a>, refs: Option<(Tensor<'a>, i64)>, pe: &Rope<'a>) -> Result<(Tensor<'a>, Tensor<'a>)> {
        let ctx = self.ctx;
        let img_mod = |t: Tensor<'a>| -> Result<Vec<Tensor<'a>>> { dit::chunks(ctx, linear(ctx, self.w, &format!("{p}.img_mod.1"), t)?, 6) };
        let img_m = img_mod(t)?;
        let ref_m = match refs {
            Some((t0, first)) => Some((img_mod(t0)?, first)),
            None => None,
        };
        // One image modulation (shift k, scale k + 1) or gate (k) over its rows: the
        // image's from `t`, the references' from σ = 0 when they have their own.
        let split = |x: Tensor<'a>, f: &dyn Fn(Tensor<'a>, &[Tensor<'a>]) -> Result<Tensor<'a>>| -> Result<Tensor<'a>> {
            match &ref_m {
                None => f(x, &img_m),
                Some((m0, first)) => {
                    let l = x.ne()[1];
                    let a = f(dit::rows(ctx, x, 0, *first)?, &img_m)?;
                    let b = f(dit::rows(ctx, x, *first, l - first)?, m0)?;
                    Ok(ctx.concat(a, b, 1)?)
                }
            }
        };
        let txt_m = dit::chunks(ctx, linear(ctx, self.w, &format!("{p}.txt_mod.1"), t)?, 6)?;
        let img_n = split(ctx.norm(img, EPS)?, &|x, m| dit::modulate(ctx, x, m[0], m[1]))?;
        let txt_n = dit::modulate(ctx, ctx.norm(txt, EPS)?, txt_m[0], txt_m[1])?;
        let (img_a, txt_a) = self.attention(p, img_n, txt_n, pe)?;
        let img = ctx.add(img, split(img_a, &|y, m| Ok(ctx.mul(y, m[2])?))?)?;
        let txt = dit::gated(ctx, txt, txt_m[2], txt_a)?;
        let img_f = self.mlp(&format!("{p}.img_mlp"), split(ctx.norm(img, EPS)?, &|x, m| dit::modulate(ctx, x, m[3], m[4]))?)?;
        let txt_f = self.mlp(&format!("{p}.txt_mlp"), dit::modulate(ctx, ctx.norm(txt, EPS)?, txt_m[3], txt_m[4])?)?;
        let img = ctx.add(img, split(img_f, &|y, m| Ok(ctx.mul(y, m[5])?))?)?;
        Ok((img, dit::gated(ctx, txt, txt_m[5], txt_f)?))
    }

    fn attention(&self, p: &str, img: Tensor<'a>, txt: Tensor<'a>, pe: &Rope<'a>) -> Result<(Tensor<'a>, Tensor<'a>)> {
        let (ctx, w) = (self.ctx, self.w);
        let [d, l, b, _] = img.ne();
        let lt = txt.ne()[1];
        let dh = d / self.heads;
        // One stream's projection, as heads [dh, H, L, B], RMS-normed where `norm` says.
        let heads = |x: Tensor<'a>, proj: &str, norm: Option<&str>| -> Result<Tensor<'a>> {
            let n = x.ne()[1];
            let t = ctx.reshape(linear(ctx, w, &format!("{p}.attn.{proj}"), x)?, [dh, self.heads, n, b])?;
            match norm {
                Some(norm) => rms_norm(ctx, w, &format!("{p}.attn.{norm}.weight"), t, EPS),
                None => Ok(t),
            }
        };
        // Text first, as the reference concatenates; rotary positions over the joint run.
        let joint = |t: Tensor<'a>, i: Tensor<'a>, rotate: bool| -> Result<Tensor<'a>> {
            let j = ctx.concat(t, i, 2)?;
            let j = if rotate { rope::apply(ctx, j, pe.cos, pe.sin)? } else { j };
            Ok(ctx.reshape(j, [d, lt + l, b, 1])?)
        };
        let q = joint(heads(txt, "add_q_proj", Some("norm_added_q"))?, heads(img, "to_q", Some("norm_q"))?, true)?;
        let k = joint(heads(txt, "add_k_proj", Some("norm_added_k"))?, heads(img, "to_k", Some("norm_k"))?, true)?;
        let v = joint(heads(txt, "add_v_proj", None)?, heads(img, "to_v", None)?, false)?;
        let a = attention_typed(ctx, q, k, v, self.heads, None, self.compute)?;
        let txt_a = linear(ctx, w, &format!("{p}.attn.to_add_out"), dit::rows(ctx, a, 0, lt)?)?;
        let img_a = linear(ctx, w, &format!("{p}.attn.to_out.0"), dit::rows(ctx, a, lt, l)?)?;
        Ok((img_a, txt_a))
    }

    /// `net.2(gelu_tanh(net.0.proj(x)))`.
    fn mlp(&self, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let h = self.ctx.gelu_tanh_exact(linear(self.ctx, self.w, &format!("{p}.net.0.proj"), x)?)?;
        linear(self.ctx, self.w, &format!("{p}.net.2"), h)
    }
}
