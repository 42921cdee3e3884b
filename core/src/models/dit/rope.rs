//! Rotary position embeddings over several position axes (FLUX's `EmbedND`): the head
//! dimension is split into one section per axis, and each section's adjacent pairs rotate
//! by the token's position on that axis times the section's frequencies.

use crate::ggml::{Context, GraphRun, Tensor};
use crate::models::{ModelError, Result};

/// The cos and sin tables [dh/2, 1, L·B] for tokens with positions `ids` (one row of
/// `axes.len()` positions per token, the same for each of `batch` sequences): pair j of
/// an axis of width `dim` turns by `pos · theta^(−2j/dim)`, computed in f64 and rounded
/// once, as BFL's `rope` does.
pub fn tables<'a>(run: &mut GraphRun<'a>, ids: &[Vec<f32>], axes: &[usize], theta: f64, batch: usize) -> Result<(Tensor<'a>, Tensor<'a>)> {
    tables_wrapped(run, ids, &[], axes, theta, batch)
}

/// [`tables`] with positions that wrap around (seamless tiling, sd.cpp's `Rope::rope` with
/// `axis_wrap_dims`): `wraps[i][a]`, when not 0, is the period of token i's position on
/// axis a (the image's patch rows or columns), and each frequency of that axis is rounded
/// to the nearest whole number of turns per period, `2π·round(ω·period/2π)/period`, so the
/// first and last row (or column) are neighbours to attention as any two adjacent ones are.
/// An empty `wraps` wraps nothing.
pub fn tables_wrapped<'a>(run: &mut GraphRun<'a>, ids: &[Vec<f32>], wraps: &[Vec<usize>], axes: &[usize], theta: f64, batch: usize) -> Result<(Tensor<'a>, Tensor<'a>)> {
    let (cos, sin) = cos_sin(ids, wraps, axes, theta)?;
    let half = cos.len() / ids.len().max(1);
    let (cos, sin) = (cos.repeat(batch), sin.repeat(batch));
    let ne = [half as i64, 1, (ids.len() * batch) as i64];
    Ok((run.input_f32(&ne, cos)?, run.input_f32(&ne, sin)?))
}

/// The values of [`tables_wrapped`] for one sequence: per token, per axis, per pair, the
/// cosine and the sine of its angle.
pub fn cos_sin(ids: &[Vec<f32>], wraps: &[Vec<usize>], axes: &[usize], theta: f64) -> Result<(Vec<f32>, Vec<f32>)> {
    if !wraps.is_empty() && (wraps.len() != ids.len() || wraps.iter().any(|w| w.len() != axes.len())) {
        return Err(ModelError::Input(format!("{} rotary wrap rows for {} position ids of {} axes", wraps.len(), ids.len(), axes.len())));
    }
    if axes.iter().any(|&a| a == 0 || a % 2 != 0) {
        return Err(ModelError::Config(format!("rotary axes {axes:?} must be even widths")));
    }
    if let Some(bad) = ids.iter().find(|r| r.len() != axes.len()) {
        return Err(ModelError::Input(format!("a position id of {} axes for rotary axes {axes:?}", bad.len())));
    }
    let half: usize = axes.iter().sum::<usize>() / 2;
    let mut cos = Vec::with_capacity(half * ids.len());
    let mut sin = Vec::with_capacity(half * ids.len());
    for (i, row) in ids.iter().enumerate() {
        for (k, (&pos, &dim)) in row.iter().zip(axes).enumerate() {
            let period = wraps.get(i).map_or(0, |w| w[k]);
            for j in 0..dim / 2 {
                let mut omega = 1.0 / theta.powf((2 * j) as f64 / dim as f64);
                if period > 0 {
                    let tau = std::f64::consts::TAU;
                    omega = tau * (omega * period as f64 / tau).round() / period as f64;
                }
                let a = pos as f64 * omega;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
    }
    Ok((cos, sin))
}

/// x [dh, H, L, B] with each adjacent pair (x₂ⱼ, x₂ⱼ₊₁) rotated by the tables of [`tables`]:
/// (x₂ⱼ·cos − x₂ⱼ₊₁·sin, x₂ⱼ·sin + x₂ⱼ₊₁·cos).
pub fn apply<'a>(ctx: &'a Context, x: Tensor<'a>, cos: Tensor<'a>, sin: Tensor<'a>) -> Result<Tensor<'a>> {
    let [dh, h, l, b] = x.ne();
    if dh % 2 != 0 || cos.ne() != [dh / 2, 1, l * b, 1] {
        return Err(ModelError::Input(format!("rotary tables {:?} for heads {:?}", cos.ne(), x.ne())));
    }
    let x = if x.is_contiguous() { x } else { ctx.cont(x)? };
    // The pair axis outermost, so evens and odds are two contiguous halves.
    let x = ctx.cont(ctx.permute(ctx.reshape(x, [2, dh / 2, h, l * b])?, [3, 0, 1, 2])?)?; // [dh/2, H, LB, 2]
    let nb = x.nb();
    let half = |k: usize| ctx.view(x, [dh / 2, h, l * b, 1], [nb[1], nb[2], nb[3]], k * nb[3]);
    let (x0, x1) = (half(0)?, half(1)?);
    let even = ctx.sub(ctx.mul(x0, cos)?, ctx.mul(x1, sin)?)?;
    let odd = ctx.add(ctx.mul(x0, sin)?, ctx.mul(x1, cos)?)?;
    let y = ctx.concat(even, odd, 3)?; // [dh/2, H, LB, 2]
    let y = ctx.cont(ctx.permute(y, [1, 2, 3, 0])?)?; // [2, dh/2, H, LB]
    Ok(ctx.reshape(y, [dh, h, l, b])?)
}

/// Check that rotary `axes` sections are even and fill a head of width `dh`.
pub fn check_axes(axes: &[usize], dh: i64) -> crate::models::Result<()> {
    if axes.iter().sum::<usize>() as i64 != dh || axes.iter().any(|a| a % 2 != 0) {
        return Err(crate::models::ModelError::Config(format!("rotary axes {axes:?} must be even and sum to the head width {dh}")));
    }
    Ok(())
}
