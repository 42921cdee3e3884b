//! FLUX.1's double-stream and single-stream blocks, by BFL's module names; Chroma runs the
//! same blocks with modulations from its approximator, FLUX.2 with modulations shared by
//! all blocks, no biases and SwiGLU MLPs.

use crate::ggml::{Context, GType, GraphRun, Tensor};
use crate::models::dit::{self, rope};
use crate::models::nn::{attention_typed, expect_linear, linear};
use crate::models::{Result, Weights};

/// The rotary tables of the joint sequence (text first, then image).
pub(crate) struct Rope<'a> {
    pub cos: Tensor<'a>,
    pub sin: Tensor<'a>,
}

/// What FLUX's and Chroma's files say alike of their shape: the token widths in and out,
/// the width, heads, MLP width, text width and the count of each kind of block.
pub(crate) struct BlockDims {
    pub in_channels: i64,
    pub out_channels: i64,
    pub hidden: i64,
    pub heads: i64,
    pub mlp_hidden: i64,
    pub context: i64,
    pub depth: usize,
    pub depth_single: usize,
}

/// How many `{prefix}{part}.{i}.{leaf}` there are, from 0 on.
pub(crate) fn count(w: &Weights, prefix: &str, part: &str, leaf: &str) -> usize {
    (0..).take_while(|i| w.contains(&format!("{prefix}{part}.{i}.{leaf}"))).count()
}

/// Read [`BlockDims`] off the weights under `prefix`.
pub(crate) fn block_dims(w: &Weights, prefix: &str) -> Result<BlockDims> {
    let at = |s: &str| format!("{prefix}{s}");
    let img_in = w.get(&at("img_in.weight"))?.ne();
    let head_dim = w.get(&at("double_blocks.0.img_attn.norm.query_norm.scale"))?.ne()[0];
    let hidden = img_in[1];
    if head_dim < 1 || hidden % head_dim != 0 {
        return Err(crate::models::ModelError::Config(format!("head width {head_dim} does not divide the width {hidden}")));
    }
    Ok(BlockDims {
        in_channels: img_in[0],
        out_channels: w.get(&at("final_layer.linear.weight"))?.ne()[1],
        hidden,
        heads: hidden / head_dim,
        mlp_hidden: w.get(&at("double_blocks.0.img_mlp.0.weight"))?.ne()[1],
        context: w.get(&at("txt_in.weight"))?.ne()[0],
        depth: count(w, prefix, "double_blocks", "img_attn.qkv.weight"),
        depth_single: count(w, prefix, "single_blocks", "linear1.weight"),
    })
}

/// How a family's blocks differ from FLUX.1's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Style {
    /// Each block has its own modulation layers (FLUX.1's; Chroma's come from its
    /// approximator, FLUX.2's are shared).
    pub modulated: bool,
    /// Linear layers have biases (not FLUX.2's).
    pub bias: bool,
    pub mlp: Mlp,
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mlp {
    /// FLUX.1: `Linear(d, m) → GELU(tanh) → Linear(m, d)`.
    GeluTanh,
    /// FLUX.2: `Linear(d, 2m)`, SiLU of the first half times the second, `Linear(m, d)`.
    SwiGlu,
}

impl Style {
    pub const FLUX: Style = Style { modulated: true, bias: true, mlp: Mlp::GeluTanh };
    pub const CHROMA: Style = Style { modulated: false, ..Style::FLUX };
    pub const FLUX2: Style = Style { modulated: false, bias: false, mlp: Mlp::SwiGlu };

    /// The width of the MLP's first layer for `m` hidden features.
    pub fn mlp_in(self, m: i64) -> i64 {
        match self.mlp {
            Mlp::GeluTanh => m,
            Mlp::SwiGlu => 2 * m,
        }
    }
}

/// Check `{name}.weight` [in, out] (and `{name}.bias` [out] where the style has biases).
pub(crate) fn expect_projection(w: &Weights, name: &str, i: i64, o: i64, bias: bool) -> Result<()> {
    if bias {
        return expect_linear(w, name, i, o);
    }
    w.expect(&format!("{name}.weight"), &[i, o])?;
    Ok(())
}

/// Check the weights of `double` double-stream and `single` single-stream blocks under
/// `prefix`, `d` wide with `m`-wide MLPs and `dh`-wide heads, as `style` has them.
pub(crate) fn expect_blocks(w: &Weights, prefix: &str, (d, m, dh): (i64, i64, i64), double: usize, single: usize, style: Style) -> Result<()> {
    let modulated = style.modulated;
    let lin = |name: String, i: i64, o: i64| expect_projection(w, &format!("{prefix}{name}"), i, o, style.bias);
    let norms = |p: String| -> Result<()> {
        for n in ["query_norm", "key_norm"] {
            w.expect(&format!("{prefix}{p}.{n}.scale"), &[dh])?;
        }
        Ok(())
    };
    for i in 0..double {
        for s in ["img", "txt"] {
            let p = format!("double_blocks.{i}.{s}");
            if modulated {
                lin(format!("{p}_mod.lin"), d, 6 * d)?;
            }
            lin(format!("{p}_attn.qkv"), d, 3 * d)?;
            norms(format!("{p}_attn.norm"))?;
            lin(format!("{p}_attn.proj"), d, d)?;
            lin(format!("{p}_mlp.0"), d, style.mlp_in(m))?;
            lin(format!("{p}_mlp.2"), m, d)?;
        }
    }
    for i in 0..single {
        let p = format!("single_blocks.{i}");
        lin(format!("{p}.linear1"), d, 3 * d + style.mlp_in(m))?;
        lin(format!("{p}.linear2"), d + m, d)?;
        norms(format!("{p}.norm"))?;
        if modulated {
            lin(format!("{p}.modulation.lin"), d, 3 * d)?;
        }
    }
    Ok(())
}

/// BFL's timestep (and distilled guidance) embedding under `prefix`: `time_in` of σ and,
/// when the model embeds guidance and the call gives it, `guidance_in` of the scale, each
/// at 1000× through `timestep_embedding` → MLPEmbedder; summed, [D, B].
pub(crate) fn time_guidance<'a>(ctx: &'a Context, run: &mut GraphRun<'a>, w: &'a Weights, prefix: &str, timesteps: &[f32], guidance: Option<&[f32]>, guidance_embed: bool) -> Result<Tensor<'a>> {
    let b = timesteps.len() as i64;
    let embed = |run: &mut GraphRun<'a>, v: &[f32], name: &str| -> Result<Tensor<'a>> {
        let t = run.input_f32(&[b], v.iter().map(|s| s * 1000.0).collect())?;
        dit::mlp_embedder(ctx, w, &format!("{prefix}{name}"), ctx.timestep_embedding(t, 256, 10_000)?)
    };
    let vec = embed(run, timesteps, "time_in")?;
    match (guidance_embed, guidance) {
        (true, Some(g)) if g.len() as i64 == b => Ok(ctx.add(vec, embed(run, g, "guidance_in")?)?),
        (true, Some(g)) => Err(crate::models::ModelError::Input(format!("{} guidance values for {b} sequences", g.len()))),
        // No guidance: the embedder is left out (ComfyUI's FluxDisableGuidance); a model
        // without one (schnell, klein) ignores a value, as sd.cpp and ComfyUI do.
        _ => Ok(vec),
    }
}

/// BFL's `LastLayer` under `prefix` on image tokens [D, L, B]: LayerNorm without affine,
/// shifted and scaled by `final_layer.adaLN_modulation.1` of `vec` (already SiLU'd), then
/// `final_layer.linear`.
pub(crate) fn last_layer<'a>(ctx: &'a Context, w: &'a Weights, prefix: &str, img: Tensor<'a>, vec: Tensor<'a>) -> Result<Tensor<'a>> {
    let m = dit::chunks(ctx, linear(ctx, w, &format!("{prefix}final_layer.adaLN_modulation.1"), vec)?, 2)?;
    let img = dit::modulate(ctx, ctx.norm(img, 1e-6)?, m[0], m[1])?;
    linear(ctx, w, &format!("{prefix}final_layer.linear"), img)
}

/// The count check every FLUX-style forward makes of its position ids and timesteps.
pub(crate) fn check_ids(img_ids: usize, txt_ids: usize, timesteps: usize, (l, lt, b): (i64, i64, i64)) -> Result<()> {
    if img_ids as i64 != l || txt_ids as i64 != lt || timesteps as i64 != b {
        return Err(crate::models::ModelError::Input(format!("{img_ids} image ids, {txt_ids} text ids and {timesteps} timesteps for {l} image and {lt} text tokens in {b} sequences")));
    }
    Ok(())
}

pub(crate) struct Blocks<'a> {
    pub ctx: &'a Context,
    pub w: &'a Weights,
    pub heads: i64,
    pub compute: GType,
    /// Text tokens the attention reads as keys, of how many (Chroma's text mask: the
    /// T5 padding past these is no key for any token); `None`: all.
    pub text_keys: Option<(i64, i64)>,
    pub mlp: Mlp,
}

/// q, k, v of one stream, heads split: [dh, H, L, B] (q and k RMS-normed), v [D, L, B].
struct Qkv<'a> {
    q: Tensor<'a>,
    k: Tensor<'a>,
    v: Tensor<'a>,
}

impl<'a> Blocks<'a> {
    /// Split a fused q|k|v projection [3D(+more), L, B] into heads, q and k normed by
    /// `{norm}.query_norm` / `{norm}.key_norm` (BFL's `QKNorm`: RMS norms with a scale).
    fn qkv(&self, fused: Tensor<'a>, d: i64, norm: &str) -> Result<Qkv<'a>> {
        let ctx = self.ctx;
        let [_, l, b, _] = fused.ne();
        let dh = d / self.heads;
        let head = |j: i64, which: &str| -> Result<Tensor<'a>> {
            let t = ctx.reshape(dit::features(ctx, fused, j * d, d)?, [dh, self.heads, l, b])?;
            let t = ctx.rms_norm(t, 1e-6)?;
            Ok(ctx.mul(t, self.w.get(&format!("{norm}.{which}.scale"))?)?)
        };
        Ok(Qkv { q: head(0, "query_norm")?, k: head(1, "key_norm")?, v: dit::features(ctx, fused, 2 * d, d)? })
    }

    /// Attention over the joint sequence of `parts` (in sequence order), rotary embedded;
    /// returns [D, L, B].
    fn attend(&self, parts: &[&Qkv<'a>], pe: &Rope<'a>) -> Result<Tensor<'a>> {
        let ctx = self.ctx;
        let join = |f: &dyn Fn(&Qkv<'a>) -> Tensor<'a>, dim: usize| -> Result<Tensor<'a>> {
            let mut t = f(parts[0]);
            for p in &parts[1..] {
                t = ctx.concat(t, f(p), dim)?;
            }
            Ok(t)
        };
        let q = rope::apply(ctx, join(&|p| p.q, 2)?, pe.cos, pe.sin)?;
        let k = rope::apply(ctx, join(&|p| p.k, 2)?, pe.cos, pe.sin)?;
        let v = join(&|p| p.v, 1)?;
        let [dh, h, l, b] = q.ne();
        let flat = |t: Tensor<'a>| ctx.reshape(t, [dh * h, l, b, 1]);
        let (q, mut k, mut v) = (flat(q)?, flat(k)?, v);
        // Masked text keys left out: the same softmax as masking them, without a mask.
        if let Some((lt, valid)) = self.text_keys.filter(|&(lt, valid)| valid < lt) {
            let keep = |t: Tensor<'a>| -> Result<Tensor<'a>> { Ok(ctx.concat(dit::rows(ctx, t, 0, valid)?, dit::rows(ctx, t, lt, l - lt)?, 1)?) };
            k = keep(k)?;
            v = keep(v)?;
        }
        Ok(attention_typed(ctx, q, k, v, self.heads, None, self.compute)?)
    }

    /// `Linear → activation → Linear` at `{name}.0` / `{name}.2`.
    fn mlp(&self, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let h = self.activate(linear(self.ctx, self.w, &format!("{name}.0"), x)?)?;
        linear(self.ctx, self.w, &format!("{name}.2"), h)
    }

    /// The MLP's activation of its first layer's output h [F, L, B].
    fn activate(&self, h: Tensor<'a>) -> Result<Tensor<'a>> {
        let ctx = self.ctx;
        match self.mlp {
            Mlp::GeluTanh => Ok(ctx.gelu_tanh_exact(h)?),
            Mlp::SwiGlu => {
                let m = h.ne()[0] / 2;
                Ok(ctx.mul(ctx.silu(dit::features(ctx, h, 0, m)?)?, dit::features(ctx, h, m, m)?)?)
            }
        }
    }

    /// FLUX's modulations of double block `p` from the SiLU'd conditioning vector `vec`
    /// [D, B]: six [D, 1, B] chunks each for the image and the text.
    pub fn double_mods(&self, p: &str, vec: Tensor<'a>) -> Result<(Vec<Tensor<'a>>, Vec<Tensor<'a>>)> {
        let (ctx, w) = (self.ctx, self.w);
        let im = dit::chunks(ctx, linear(ctx, w, &format!("{p}.img_mod.lin"), vec)?, 6)?;
        let tm = dit::chunks(ctx, linear(ctx, w, &format!("{p}.txt_mod.lin"), vec)?, 6)?;
        Ok((im, tm))
    }

    /// FLUX's three modulation chunks of single block `p`.
    pub fn single_mods(&self, p: &str, vec: Tensor<'a>) -> Result<Vec<Tensor<'a>>> {
        dit::chunks(self.ctx, linear(self.ctx, self.w, &format!("{p}.modulation.lin"), vec)?, 3)
    }

    /// BFL's `DoubleStreamBlock` at `p` on img [D, L, B], txt [D, Lt, B], modulated by `im`
    /// and `tm` (shift, scale, gate of the attention, then of the MLP; [D, 1, B] each).
    pub fn double(&self, p: &str, img: Tensor<'a>, txt: Tensor<'a>, im: &[Tensor<'a>], tm: &[Tensor<'a>], pe: &Rope<'a>) -> Result<(Tensor<'a>, Tensor<'a>)> {
        let (ctx, w) = (self.ctx, self.w);
        let d = img.ne()[0];
        let lt = txt.ne()[1];
        let stream = |x: Tensor<'a>, m: &[Tensor<'a>], s: &str| -> Result<Qkv<'a>> {
            let h = dit::modulate(ctx, ctx.norm(x, 1e-6)?, m[0], m[1])?;
            self.qkv(linear(ctx, w, &format!("{p}.{s}_attn.qkv"), h)?, d, &format!("{p}.{s}_attn.norm"))
        };
        let (iq, tq) = (stream(img, &im, "img")?, stream(txt, &tm, "txt")?);
        let a = self.attend(&[&tq, &iq], pe)?;
        let l = img.ne()[1];
        let finish = |x: Tensor<'a>, a: Tensor<'a>, m: &[Tensor<'a>], s: &str| -> Result<Tensor<'a>> {
            let x = dit::gated(ctx, x, m[2], linear(ctx, w, &format!("{p}.{s}_attn.proj"), a)?)?;
            let h = dit::modulate(ctx, ctx.norm(x, 1e-6)?, m[3], m[4])?;
            dit::gated(ctx, x, m[5], self.mlp(&format!("{p}.{s}_mlp"), h)?)
        };
        let img = finish(img, dit::rows(ctx, a, lt, l)?, &im, "img")?;
        let txt = finish(txt, dit::rows(ctx, a, 0, lt)?, &tm, "txt")?;
        Ok((img, txt))
    }

    /// BFL's `SingleStreamBlock` at `p` on the joint sequence x [D, L, B], modulated by `m`
    /// (shift, scale, gate).
    pub fn single(&self, p: &str, x: Tensor<'a>, m: &[Tensor<'a>], pe: &Rope<'a>) -> Result<Tensor<'a>> {
        let (ctx, w) = (self.ctx, self.w);
        let d = x.ne()[0];
        let h = dit::modulate(ctx, ctx.norm(x, 1e-6)?, m[0], m[1])?;
        let fused = linear(ctx, w, &format!("{p}.linear1"), h)?;
        let mlp_in = fused.ne()[0] - 3 * d;
        let qkv = self.qkv(fused, d, &format!("{p}.norm"))?;
        let a = self.attend(&[&qkv], pe)?;
        let mlp = self.activate(dit::features(ctx, fused, 3 * d, mlp_in)?)?;
        let out = linear(ctx, w, &format!("{p}.linear2"), ctx.concat(a, mlp, 0)?)?;
        dit::gated(ctx, x, m[2], out)
    }
}
