//! Building blocks the diffusion transformers share: patch packing, position ids, rotary
//! position embeddings over several axes, adaLN modulation and the timestep MLP.
//!
//! Born with FLUX.1, whose blocks SD3, Chroma, Z-Image, Qwen-Image, FLUX.2 and Wan reuse in
//! variations; each family's folder keeps only what is its own.

pub mod diffusers;
pub mod rope;

use super::nn::linear;
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};

/// Blocks a model call leaves out (ComfyUI's skip-layer guidance patches them to pass
/// their inputs through): FLUX's and Chroma's double and single blocks, SD3's joint blocks
/// (double). Indices past the model's last block leave nothing out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SkipLayers {
    pub double: Vec<usize>,
    pub single: Vec<usize>,
}

/// The results of `run` over `items`, called once per group of items with equal `key`
/// (those that can share one graph: same text length, ...), in the items' order.
pub fn in_groups<T: Copy, K: PartialEq>(items: &[T], key: impl Fn(&T) -> K, mut run: impl FnMut(&[T]) -> Result<Vec<Vec<f32>>>) -> Result<Vec<Vec<f32>>> {
    let mut out: Vec<Option<Vec<f32>>> = vec![None; items.len()];
    let mut pending: Vec<usize> = (0..items.len()).collect();
    while let Some(&first) = pending.first() {
        let k0 = key(&items[first]);
        let group: Vec<usize> = pending.iter().copied().filter(|&k| key(&items[k]) == k0).collect();
        pending.retain(|k| !group.contains(k));
        let members: Vec<T> = group.iter().map(|&k| items[k]).collect();
        for (k, d) in group.into_iter().zip(run(&members)?) {
            out[k] = Some(d);
        }
    }
    Ok(out.into_iter().map(|d| d.expect("every item is in a group")).collect())
}

/// A latent [B, C, H, W] (row-major; ggml [W, H, C, B]) as tokens [B, (H/p)·(W/p), C·p·p]
/// (ggml [C·p·p, L, B]), rows of patches in reading order, each patch's features in
/// (channel, row, column) order: einops' `b c (h ph) (w pw) -> b (h w) (c ph pw)`, which
/// FLUX, Chroma and Qwen-Image use. H and W must be multiples of `p`.
pub fn patchify(latent: &[f32], shape: [usize; 4], p: usize) -> Result<Vec<f32>> {
    check_patches(latent.len(), shape, p)?;
    let mut out = Vec::with_capacity(latent.len());
    for row in patch_rows(shape, p) {
        out.extend_from_slice(&latent[row..row + p]);
    }
    Ok(out)
}

/// The inverse of [`patchify`]: tokens back to a latent of `shape` [B, C, H, W].
pub fn unpatchify(tokens: &[f32], shape: [usize; 4], p: usize) -> Result<Vec<f32>> {
    check_patches(tokens.len(), shape, p)?;
    let mut out = vec![0f32; tokens.len()];
    for (row, src) in patch_rows(shape, p).zip(tokens.chunks_exact(p)) {
        out[row..row + p].copy_from_slice(src);
    }
    Ok(out)
}

/// A latent [B, C, H, W] as tokens [B, (H/p)·(W/p), p·p·C] whose features are in (row,
/// column, channel) order: the inverse of [`unpatchify_hwc`] (Z-Image's `_patchify_image`).
pub fn patchify_hwc(latent: &[f32], [b, c, h, w]: [usize; 4], p: usize) -> Result<Vec<f32>> {
    check_patches(latent.len(), [b, c, h, w], p)?;
    let (hp, wp) = (h / p, w / p);
    let mut out = Vec::with_capacity(latent.len());
    for bi in 0..b {
        for r in 0..hp {
            for q in 0..wp {
                for pr in 0..p {
                    for pc in 0..p {
                        out.extend((0..c).map(|ci| latent[((bi * c + ci) * h + r * p + pr) * w + q * p + pc]));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Tokens [B, L, p·p·C] whose features are in (row, column, channel) order (SD3's
/// `unpatchify`: `n h w p q c -> n c (h p) (w q)`) back to a latent of `shape` [B, C, H, W].
pub fn unpatchify_hwc(tokens: &[f32], [b, c, h, w]: [usize; 4], p: usize) -> Result<Vec<f32>> {
    check_patches(tokens.len(), [b, c, h, w], p)?;
    let (hp, wp) = (h / p, w / p);
    let mut out = vec![0f32; tokens.len()];
    let mut src = tokens.iter();
    for bi in 0..b {
        for r in 0..hp {
            for q in 0..wp {
                for pr in 0..p {
                    for pc in 0..p {
                        for ci in 0..c {
                            out[((bi * c + ci) * h + r * p + pr) * w + q * p + pc] = *src.next().expect("sizes checked");
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Where each run of `p` latent values starts, in token order: per token, per channel, per
/// patch row (the order of [`patchify`]'s features).
fn patch_rows([b, c, h, w]: [usize; 4], p: usize) -> impl Iterator<Item = usize> {
    let (hp, wp) = (h / p, w / p);
    (0..b).flat_map(move |bi| {
        (0..hp).flat_map(move |r| (0..wp).flat_map(move |q| (0..c).flat_map(move |ci| (0..p).map(move |pr| ((bi * c + ci) * h + r * p + pr) * w + q * p))))
    })
}

fn check_patches(len: usize, [b, c, h, w]: [usize; 4], p: usize) -> Result<()> {
    if p == 0 || h % p != 0 || w % p != 0 || b.checked_mul(c).and_then(|n| n.checked_mul(h)).and_then(|n| n.checked_mul(w)) != Some(len) {
        return Err(ModelError::Input(format!("a {b}x{c}x{h}x{w} latent of {len} values in {p}x{p} patches: sizes must be multiples of {p}")));
    }
    Ok(())
}

/// A [C, H, W] latent padded at the bottom and right to multiples of `p` by wrapping
/// around (ComfyUI's `pad_to_patch_size`, circular), with its new height and width.
pub fn pad_to_patches(x: &[f32], [c, h, w]: [usize; 3], p: usize) -> (Vec<f32>, usize, usize) {
    let (h2, w2) = (h.div_ceil(p) * p, w.div_ceil(p) * p);
    let mut out = Vec::with_capacity(c * h2 * w2);
    for ci in 0..c {
        for y in 0..h2 {
            let row = (ci * h + y % h) * w;
            out.extend((0..w2).map(|x0| x[row + x0 % w]));
        }
    }
    (out, h2, w2)
}

/// The top-left [C, H, W] of a [C, H2, W2] latent: [`pad_to_patches`] undone.
pub fn crop(x: &[f32], [c, h2, w2]: [usize; 3], h: usize, w: usize) -> Vec<f32> {
    (0..c).flat_map(|ci| (0..h).flat_map(move |y| (0..w).map(move |x0| (ci, y, x0)))).map(|(ci, y, x0)| x[(ci * h2 + y) * w2 + x0]).collect()
}

/// Frame `f` of one sample of a latent of `frames` frames kept in its channels (ComfyUI's
/// [C, T, H, W]: each channel's frames together), as planar [C][H][W].
pub fn frame_of(sample: &[f32], channels: usize, frames: usize, plane: usize, f: usize) -> Vec<f32> {
    (0..channels).flat_map(|k| &sample[(k * frames + f) * plane..(k * frames + f + 1) * plane]).copied().collect()
}

/// Planes of `frames` [C][H][W] frames per sample back in ComfyUI's [C][T][H][W] order per
/// sample: the inverse of taking every [`frame_of`] in turn.
pub fn channel_major(frame_major: &[f32], channels: usize, frames: usize, plane: usize) -> Vec<f32> {
    if frames == 1 {
        return frame_major.to_vec();
    }
    let per = channels * plane;
    frame_major.chunks_exact(frames * per).flat_map(|s| (0..channels).flat_map(move |k| (0..frames).flat_map(move |f| &s[f * per + k * plane..f * per + (k + 1) * plane]))).copied().collect()
}

/// Position ids (index, row, column) of an image's `rows` × `cols` patch grid in reading
/// order: FLUX's image ids (`index` 0 for the image itself; Kontext gives references
/// their own).
pub fn image_ids(rows: usize, cols: usize, index: f32) -> Vec<[f32; 3]> {
    (0..rows).flat_map(|r| (0..cols).map(move |c| [index, r as f32, c as f32])).collect()
}

/// `chunks` equal slices of a modulation vector m [chunks·D, B], each as a contiguous
/// [D, 1, B] that broadcasts over a sequence [D, L, B].
pub fn chunks<'a>(ctx: &'a Context, m: Tensor<'a>, chunks: usize) -> Result<Vec<Tensor<'a>>> {
    let [n, b, _, _] = m.ne();
    if n % chunks as i64 != 0 {
        return Err(ModelError::Input(format!("a modulation of {n} values does not split in {chunks}")));
    }
    let d = n / chunks as i64;
    let row = m.nb()[1];
    (0..chunks)
        .map(|j| Ok(ctx.cont(ctx.view(m, [d, 1, b, 1], [row, row, row * b as usize], j * d as usize * 4)?)?))
        .collect()
}

/// adaLN: `x·(1 + scale) + shift`, scale and shift [D, 1, B] over x [D, L, B].
pub fn modulate<'a>(ctx: &'a Context, x: Tensor<'a>, shift: Tensor<'a>, scale: Tensor<'a>) -> Result<Tensor<'a>> {
    Ok(ctx.add(ctx.add(x, ctx.mul(x, scale)?)?, shift)?)
}

/// `x + gate·y`, gate [D, 1, B].
pub fn gated<'a>(ctx: &'a Context, x: Tensor<'a>, gate: Tensor<'a>, y: Tensor<'a>) -> Result<Tensor<'a>> {
    Ok(ctx.add(x, ctx.mul(y, gate)?)?)
}

/// `Linear → SiLU → Linear` at `{name}.in_layer` / `{name}.out_layer` (BFL's MLPEmbedder).
pub fn mlp_embedder<'a>(ctx: &'a Context, w: &'a Weights, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
    let h = ctx.silu(linear(ctx, w, &format!("{name}.in_layer"), x)?)?;
    linear(ctx, w, &format!("{name}.out_layer"), h)
}

/// A learned table t (modulation rows, pad tokens) readable by f32 arithmetic, in its own
/// shape: quantized files quantize these tables too (sd.cpp's convert and ours skip only
/// biases, scales and embeddings), elementwise ops take no quantized second operand, and
/// get_rows dequantizes on every backend. Float tables come back as they are.
pub fn table<'a>(ctx: &'a Context, run: &mut GraphRun<'a>, t: Tensor<'a>) -> Result<Tensor<'a>> {
    if !t.dtype().is_quantized() {
        return Ok(t);
    }
    let ne = t.ne();
    let n = ne[1] * ne[2] * ne[3];
    let ids = run.input_i32(&[n], (0..n as i32).collect())?;
    let rows = ctx.get_rows(ctx.reshape(t, [ne[0], n, 1, 1])?, ids)?;
    Ok(ctx.reshape(rows, ne)?)
}

/// `[D, L, B]` rows `from..from + n` of a sequence, contiguous.
pub fn rows<'a>(ctx: &'a Context, x: Tensor<'a>, from: i64, n: i64) -> Result<Tensor<'a>> {
    let [d, _, b, _] = x.ne();
    let nb = x.nb();
    Ok(ctx.cont(ctx.view(x, [d, n, b, 1], [nb[1], nb[2], nb[3]], from as usize * nb[1])?)?)
}

/// Features `from..from + n` of every token of x [F, L, B], contiguous [n, L, B]: one
/// part of a fused projection.
pub fn features<'a>(ctx: &'a Context, x: Tensor<'a>, from: i64, n: i64) -> Result<Tensor<'a>> {
    let [_, l, b, _] = x.ne();
    let nb = x.nb();
    Ok(ctx.cont(ctx.view(x, [n, l, b, 1], [nb[1], nb[2], nb[3]], from as usize * nb[0])?)?)
}
