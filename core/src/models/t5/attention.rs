//! T5's self-attention: unscaled scores plus a learned bias per head and relative-position
//! bucket.

use crate::ggml::{Context, Tensor};
use crate::models::nn::project;
use crate::models::{Result, Weights};

/// The bucket of key position − query position `relative` in a bidirectional T5 encoder
/// with `buckets` buckets: half for keys before the query, half after; in each half, the
/// first half of the buckets are exact distances, the rest log-spaced up to `max_distance`.
///
/// The log-spaced index is computed in f32, as `transformers` computes it, so that
/// distances on a bucket boundary (16, 32, 64 with T5's 32/128) truncate the same way.
pub fn relative_position_bucket(relative: i64, buckets: i64, max_distance: i64) -> i64 {
    let half = buckets / 2;
    let base = if relative > 0 { half } else { 0 };
    let n = relative.abs();
    let max_exact = half / 2;
    if n < max_exact {
        return base + n;
    }
    let log_ratio = (n as f32 / max_exact as f32).ln() / ((max_distance as f64 / max_exact as f64).ln() as f32);
    let large = max_exact + (log_ratio * (half - max_exact) as f32) as i64;
    base + large.min(half - 1)
}

/// The bucket of every (query, key) pair of a length-`t` sequence, key fastest: the
/// row-major [Tq, Tk] table that indexes the bias embedding.
pub(super) fn bucket_table(t: i64, buckets: i64, max_distance: i64) -> Vec<i32> {
    let mut out = Vec::with_capacity((t * t) as usize);
    for q in 0..t {
        for k in 0..t {
            out.push(relative_position_bucket(k - q, buckets, max_distance) as i32);
        }
    }
    out
}

/// The position bias [Tk, Tq, H] of embedding `table` (stored [buckets, heads], ggml
/// [H, buckets]) for the bucket ids `buckets` [Tq·Tk].
pub(super) fn position_bias<'a>(ctx: &'a Context, table: Tensor<'a>, buckets: Tensor<'a>, t: i64) -> Result<Tensor<'a>> {
    let heads = table.ne()[0];
    let rows = ctx.get_rows(table, buckets)?; // [H, Tq·Tk], f32
    let rows = ctx.reshape(rows, [heads, t, t, 1])?; // [H, Tk, Tq]
    Ok(ctx.cont(ctx.permute(rows, [2, 0, 1, 3])?)?) // [Tk, Tq, H]
}

/// Self-attention of x [D, T, B] with `heads` heads: the projections `weight("q")` ...
/// `weight("o")`, scores unscaled (T5 folds the scale into its weights) plus `bias`
/// [Tk, Tq, H] and, if given, `key_mask` [Tk, 1, 1, B].
pub(super) fn self_attention<'a>(ctx: &'a Context, w: &'a Weights, weight: &dyn Fn(&str) -> String, x: Tensor<'a>, heads: i64, bias: Tensor<'a>, key_mask: Option<Tensor<'a>>) -> Result<Tensor<'a>> {
    let [_, t, b, _] = x.ne();
    let q = project(ctx, w, &weight("q"), x)?;
    let k = project(ctx, w, &weight("k"), x)?;
    let v = project(ctx, w, &weight("v"), x)?;
    let inner = q.ne()[0];
    let dh = inner / heads;
    let heads_of = |m: Tensor<'a>| ctx.reshape(m, [dh, heads, t, b]);
    let qh = ctx.cont(ctx.permute(heads_of(q)?, [0, 2, 1, 3])?)?; // [dh, T, H, B]
    let kh = ctx.cont(ctx.permute(heads_of(k)?, [0, 2, 1, 3])?)?;
    let vt = ctx.cont(ctx.permute(heads_of(v)?, [1, 2, 0, 3])?)?; // [T, dh, H, B]
    let mut scores = ctx.mul_mat(kh, qh)?; // [Tk, Tq, H, B]
    if let Some(m) = key_mask {
        scores = ctx.add(scores, m)?;
    }
    let probs = ctx.soft_max_ext(scores, Some(bias), 1.0)?;
    let out = ctx.mul_mat(vt, probs)?; // [dh, Tq, H, B]
    let out = ctx.cont(ctx.permute(out, [0, 2, 1, 3])?)?; // [dh, H, Tq, B]
    let out = ctx.reshape(out, [inner, t, b, 1])?;
    project(ctx, w, &weight("o"), out)
}
