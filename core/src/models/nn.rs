//! Layers shared by the architectures, named after their PyTorch modules.

use super::{Result, Weights};
use crate::ggml::{Context, GType, Tensor};

/// From this many keys on, attention runs fused (flash attention): below it the plain
/// product is as fast and exact in f32, which the parity tests rely on.
pub const FLASH_MIN_KEYS: i64 = 1024;

/// `nn.Linear` at `{name}.weight` / `{name}.bias` on x [in, ...] → [out, ...].
pub fn linear<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
    let y = ctx.mul_mat(w.get(&format!("{name}.weight"))?, x)?;
    let bias = format!("{name}.bias");
    if w.contains(&bias) {
        Ok(ctx.add(y, w.get(&bias)?)?)
    } else {
        Ok(y)
    }
}

/// `nn.LayerNorm` over ne[0] with affine weight and bias.
pub fn layer_norm<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
    let y = ctx.norm(x, eps)?;
    let y = ctx.mul(y, w.get(&format!("{name}.weight"))?)?;
    Ok(ctx.add(y, w.get(&format!("{name}.bias"))?)?)
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
    if tk >= FLASH_MIN_KEYS {
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
pub fn conv2d<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>> {
    let k = w.get(&format!("{name}.weight"))?;
    let y = ctx.conv_2d(k, x, (stride, stride), (pad, pad), (1, 1))?;
    let bias = format!("{name}.bias");
    if w.contains(&bias) {
        Ok(ctx.add(y, per_channel(ctx, w.get(&bias)?)?)?)
    } else {
        Ok(y)
    }
}

/// `nn.GroupNorm` with affine weight and bias on x [W, H, C, N].
pub fn group_norm<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>, groups: i32, eps: f32) -> Result<Tensor<'a>> {
    let y = ctx.group_norm(x, groups, eps)?;
    let y = ctx.mul(y, per_channel(ctx, w.get(&format!("{name}.weight"))?)?)?;
    Ok(ctx.add(y, per_channel(ctx, w.get(&format!("{name}.bias"))?)?)?)
}
