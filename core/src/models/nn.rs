//! Layers shared by the architectures, named after their PyTorch modules.

use super::{Adapter, Result, Weights};
use crate::ggml::{Context, GType, Tensor};

/// From this many keys on, attention runs fused (flash attention): below it the plain
/// product is as fast and exact in f32, which the parity tests rely on.
pub const FLASH_MIN_KEYS: i64 = 1024;

/// `nn.Linear` at `{name}.weight` / `{name}.bias` on x [in, ...] → [out, ...].
pub fn linear<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
    let y = project(ctx, w, &format!("{name}.weight"), x)?;
    let bias = format!("{name}.bias");
    if w.contains(&bias) {
        Ok(ctx.add(y, w.get(&bias)?)?)
    } else {
        Ok(y)
    }
}

/// Check that `{name}.weight` [in, out] and `{name}.bias` [out] are there with these shapes.
pub fn expect_linear(w: &Weights, name: &str, i: i64, o: i64) -> Result<()> {
    w.expect(&format!("{name}.weight"), &[i, o])?;
    w.expect(&format!("{name}.bias"), &[o])?;
    Ok(())
}

/// The weight called `weight` [in, out] times x [in, ...], plus the weight's runtime LoRA
/// branches `scale · up·(down·x)`: two thin products instead of a patched copy of the
/// weight, which is what keeps a quantized checkpoint's weights untouched.
pub fn project<'a>(ctx: &'a Context, w: &'a Weights, weight: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
    let y = ctx.mul_mat(w.get(weight)?, x)?;
    add_adapters(ctx, w, weight, y, 0, |a| {
        let h = ctx.scale(ctx.mul_mat(a.down, x)?, a.scale)?;
        Ok(ctx.mul_mat(a.up, h)?)
    })
}

/// `y` plus `branch(a)` for every runtime adapter `a` of `weight`; a branch that covers
/// only some output rows (one block of a fused q/k/v) is padded with zeros to `y`'s
/// extent along `axis`, the axis that holds the output features.
fn add_adapters<'a>(ctx: &'a Context, w: &'a Weights, weight: &str, mut y: Tensor<'a>, axis: usize, branch: impl Fn(&Adapter<'a>) -> Result<Tensor<'a>>) -> Result<Tensor<'a>> {
    for a in w.adapters(weight) {
        let mut d = branch(&a)?;
        if let Some((first, n)) = a.rows {
            let mut pads = [(0, 0); 4];
            let after = y.ne()[axis] - (first + n) as i64;
            if after < 0 {
                return Err(super::ModelError::Weight { name: weight.to_string(), detail: format!("a LoRA patches rows {first}..{} of {}", first + n, y.ne()[axis]) });
            }
            pads[axis] = (first as i32, after as i32);
            d = ctx.pad(d, pads)?;
        }
        y = ctx.add(y, d)?;
    }
    Ok(y)
}

/// `nn.LayerNorm` over ne[0] with affine weight and bias.
pub fn layer_norm<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
    let y = ctx.norm(x, eps)?;
    let y = ctx.mul(y, w.get(&format!("{name}.weight"))?)?;
    Ok(ctx.add(y, w.get(&format!("{name}.bias"))?)?)
}

/// diffusers' `FeedForward` with GEGLU at `{name}.net.0.proj` / `{name}.net.2` on
/// x [in, ...]: the projection's first half is the value, the second the gate (exact GELU).
pub fn geglu_ff<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
    let p = linear(ctx, w, &format!("{name}.net.0.proj"), x)?;
    let [two_inner, t, b, _] = p.ne();
    let inner = two_inner / 2;
    let nb = p.nb();
    let val = ctx.view(p, [inner, t, b, 1], [nb[1], nb[2], nb[3]], 0)?;
    let gate = ctx.view(p, [inner, t, b, 1], [nb[1], nb[2], nb[3]], inner as usize * 4)?;
    let g = ctx.mul(ctx.cont(val)?, ctx.gelu_erf(ctx.cont(gate)?)?)?;
    linear(ctx, w, &format!("{name}.net.2"), g)
}

/// RMS norm over ne[0] scaled by the weight at `name` (T5's `T5LayerNorm`, `nn.RMSNorm`).
pub fn rms_norm<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
    Ok(ctx.mul(ctx.rms_norm(x, eps)?, w.get(name)?)?)
}

/// Multi-head attention on projected q [D, Tq, B], k/v [D, Tk, B] with `heads` heads;
/// `mask` [Tk, Tq] is added to the scaled scores. Returns [D, Tq, B].
pub fn attention<'a>(ctx: &'a Context, q: Tensor<'a>, k: Tensor<'a>, v: Tensor<'a>, heads: i64, mask: Option<Tensor<'a>>) -> Result<Tensor<'a>> {
    attention_typed(ctx, q, k, v, heads, mask, GType::F32)
}

/// [`attention`] for a model that computes in `compute` (its projection weights' type):
/// bf16 models may take the CPU's bf16 tile attention.
pub fn attention_typed<'a>(ctx: &'a Context, q: Tensor<'a>, k: Tensor<'a>, v: Tensor<'a>, heads: i64, mask: Option<Tensor<'a>>, compute: GType) -> Result<Tensor<'a>> {
    let [d, tq, b, _] = q.ne();
    let tk = k.ne()[1];
    let dh = d / heads;
    let split = |t: Tensor<'a>, n: i64| -> Result<Tensor<'a>> {
        let t = if t.is_contiguous() { t } else { ctx.cont(t)? };
        Ok(ctx.reshape(t, [dh, heads, n, b])?)
    };
    if mask.is_none() {
        // The CPU op reads the heads of [dh, H, T, B] through strides: no permutes.
        if let Some(out) = ctx.attention_cpu(split(q, tq)?, split(k, tk)?, split(v, tk)?, 1.0 / (dh as f32).sqrt(), compute == GType::BF16)? {
            return Ok(ctx.reshape(out, [d, tq, b, 1])?);
        }
    }
    // `--fa` asks for the fused kernel at every length (where it takes no mask).
    if tk >= FLASH_MIN_KEYS || (ctx.options().flash_attn && mask.is_none()) {
        // Fused attention never materialises the Tq×Tk score matrix (1 GiB per layer
        // for SD at 512²). ggml's CPU kernel wants f16 keys and values.
        let qh = ctx.permute(split(q, tq)?, [0, 2, 1, 3])?; // [dh, Tq, H, B]
        let kh = ctx.cast(ctx.cont(ctx.permute(split(k, tk)?, [0, 2, 1, 3])?)?, GType::F16)?;
        let vh = ctx.cast(ctx.cont(ctx.permute(split(v, tk)?, [0, 2, 1, 3])?)?, GType::F16)?;
        if mask.is_some() {
            return Err(super::ModelError::Input("masked attention over long sequences is not supported yet".into()));
        }
        let out = ctx.flash_attn_ext(qh, kh, vh, None, 1.0 / (dh as f32).sqrt())?; // [dh, H, Tq, B]
        return Ok(ctx.reshape(out, [d, tq, b, 1])?);
    }
    // [dh, T, H, B]
    let qh = ctx.cont(ctx.permute(split(q, tq)?, [0, 2, 1, 3])?)?;
    let kh = ctx.cont(ctx.permute(split(k, tk)?, [0, 2, 1, 3])?)?;
    // [Tk, dh, H, B]: v transposed so the second product contracts over keys.
    let vt = ctx.cont(ctx.permute(split(v, tk)?, [1, 2, 0, 3])?)?;
    let scores = ctx.mul_mat(kh, qh)?; // [Tk, Tq, H, B]
    let probs = ctx.soft_max_ext(scores, mask, 1.0 / (dh as f32).sqrt())?;
    let out = ctx.mul_mat(vt, probs)?; // [dh, Tq, H, B]
    let out = ctx.cont(ctx.permute(out, [0, 2, 1, 3])?)?; // [dh, H, Tq, B]
    Ok(ctx.reshape(out, [d, tq, b, 1])?)
}

/// Reshape a per-channel vector [C] so it broadcasts over [W, H, C, N].
fn per_channel<'a>(ctx: &'a Context, v: Tensor<'a>) -> Result<Tensor<'a>> {
    Ok(ctx.reshape(v, [1, 1, v.ne()[0], 1])?)
}

/// `nn.Conv2d` at `{name}.weight` [k, k, in, out] / `{name}.bias` on x [W, H, in, N].
/// On the axes the context makes circular ([`Context::set_circular`]) the padding wraps
/// around (PyTorch's `padding_mode="circular"`, sd.cpp's `ggml_ext_conv_2d` with
/// `circular_x/y`): the input is padded first and the convolution pads only the other axes.
pub fn conv2d<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>> {
    let weight = format!("{name}.weight");
    let (x, pad) = circular_padded(ctx, x, pad)?;
    let y = ctx.conv_2d(w.get(&weight)?, x, (stride, stride), pad, (1, 1))?;
    // LoCon at runtime: `down` takes the layer's stride and padding (or, with a Tucker
    // `mid` kernel, is 1×1 and `mid` takes them), `up` is 1×1.
    let y = add_adapters(ctx, w, &weight, y, 2, |a| {
        let h = match a.mid {
            None => ctx.conv_2d(a.down, x, (stride, stride), pad, (1, 1))?,
            Some(mid) => ctx.conv_2d(mid, ctx.conv_2d(a.down, x, (1, 1), (0, 0), (1, 1))?, (stride, stride), pad, (1, 1))?,
        };
        Ok(ctx.conv_2d(a.up, ctx.scale(h, a.scale)?, (1, 1), (0, 0), (1, 1))?)
    })?;
    let bias = format!("{name}.bias");
    if w.contains(&bias) {
        Ok(ctx.add(y, per_channel(ctx, w.get(&bias)?)?)?)
    } else {
        Ok(y)
    }
}

/// x [W, H, C, N] padded by `pad` around on the axes the context makes circular, and the
/// padding a convolution then adds itself on each axis (the other axes': zeros).
pub fn circular_padded<'a>(ctx: &'a Context, x: Tensor<'a>, pad: i32) -> Result<(Tensor<'a>, (i32, i32))> {
    let c = ctx.circular();
    if pad > 0 && c.any() {
        let (px, py) = (if c.x { 0 } else { pad }, if c.y { 0 } else { pad });
        let wrap = |on: bool| if on { (pad, pad) } else { (0, 0) };
        Ok((ctx.pad_circular(x, [wrap(c.x), wrap(c.y), (0, 0), (0, 0)])?, (px, py)))
    } else {
        Ok((x, (pad, pad)))
    }
}

/// [`group_norm`], or with `frames` its statistics over each run of `frames` images of
/// the batch together (a video's frames: PyTorch's GroupNorm on `b c f h w`).
pub fn group_norm_over<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, groups: i32, eps: f32, frames: Option<i64>) -> Result<Tensor<'a>> {
    let Some(f) = frames.filter(|&f| f > 1) else { return group_norm(ctx, w, name, x, groups, eps) };
    let [wd, ht, c, b] = x.ne();
    if b % f != 0 {
        return Err(super::ModelError::Input(format!("{name}: a batch of {b} is not a whole number of {f}-frame videos")));
    }
    // ggml normalises over ne0, ne1 and a group of ne2, per ne3: [W·H, F, C, videos].
    let t = ctx.cont(ctx.permute(ctx.reshape(x, [wd * ht, c, f, b / f])?, [0, 2, 1, 3])?)?;
    let t = ctx.group_norm(t, groups, eps)?;
    let y = ctx.reshape(ctx.cont(ctx.permute(t, [0, 2, 1, 3])?)?, [wd, ht, c, b])?;
    let y = ctx.mul(y, per_channel(ctx, w.get(&format!("{name}.weight"))?)?)?;
    Ok(ctx.add(y, per_channel(ctx, w.get(&format!("{name}.bias"))?)?)?)
}

/// `nn.GroupNorm` with affine weight and bias on x [W, H, C, N].
pub fn group_norm<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, groups: i32, eps: f32) -> Result<Tensor<'a>> {
    let y = ctx.group_norm(x, groups, eps)?;
    let y = ctx.mul(y, per_channel(ctx, w.get(&format!("{name}.weight"))?)?)?;
    Ok(ctx.add(y, per_channel(ctx, w.get(&format!("{name}.bias"))?)?)?)
}
