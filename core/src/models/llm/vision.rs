//! Qwen2.5-VL's vision tower (what Qwen-Image-Edit's text encoder sees an image through):
//! 14-pixel patches of two identical frames embedded linearly, RMS-normed pre-norm blocks
//! with 2-D rotary positions (rows on the first half of each rotated pair's angles,
//! columns on the second), window attention in 112-pixel windows except every eighth
//! block, SwiGLU MLPs with biases, and a merger that joins each 2×2 block of patches
//! into one token of the language model's width.
//!
//! Keys are Hugging Face's under `visual.` (ComfyUI's `qwen_2.5_vl_7b.safetensors`) or
//! `model.visual.`, or llama.cpp's mmproj names (`v.blk.N.attn_q`, `mm.0`, …: sd-cli's
//! `--llm_vision` files); [`vision_layout`] shows either in Hugging Face's names, the 5-D
//! patch kernel as the matrix it is (an mmproj file's two frame kernels as two).
//!
//! Patches travel in the processor's order — 2×2 merge blocks in reading order, each
//! block's four patches in reading order — and the window permutation happens on the
//! host, so the graph sees each window as a contiguous run.

use super::super::nn::{attention, linear, rms_norm};
use super::super::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};
use crate::io::{TensorInfo, TensorSource};

/// Pixels per patch side.
pub const PATCH: usize = 14;
/// Frames per patch: an image is its own two frames.
pub const TEMPORAL_PATCH: usize = 2;
/// Patches per merged token side.
pub const MERGE: usize = 2;
/// Window attention's window side in pixels.
pub const WINDOW: usize = 112;
/// The processor's normalisation (OpenAI CLIP's).
pub const MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
pub const STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];
/// Width of one head: every released Qwen2.5-VL vision tower has 80 (1280 / 16).
pub const HEAD_DIM: i64 = 80;

/// The weight that marks the tower, relative to its prefix.
pub const MARKER: &str = "blocks.0.attn.qkv.weight";

#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub hidden: i64,
    pub heads: i64,
    pub depth: usize,
    pub intermediate: i64,
    /// The language model's width, which merged tokens have.
    pub out_hidden: i64,
    /// Blocks that attend over the whole image (the others within windows).
    pub full_attention: Vec<usize>,
    pub rope_theta: f32,
}

impl VisionConfig {
    /// Read the dimensions off the weights under `prefix` (`visual.`); every eighth block
    /// attends fully (7, 15, 23, 31 in the 32-block towers).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        let [hidden, ..] = w.get(&at("blocks.0.norm1.weight"))?.ne();
        let depth = (0..).take_while(|i| w.contains(&at(&format!("blocks.{i}.attn.qkv.weight")))).count();
        let intermediate = w.get(&at("blocks.0.mlp.gate_proj.weight"))?.ne()[1];
        let out_hidden = w.get(&at("merger.mlp.2.weight"))?.ne()[1];
        if hidden % HEAD_DIM != 0 {
            return Err(ModelError::Config(format!("a vision tower {hidden} wide: not whole heads of {HEAD_DIM}")));
        }
        Ok(VisionConfig { hidden, heads: hidden / HEAD_DIM, depth, intermediate, out_hidden, full_attention: (0..depth).filter(|i| i % 8 == 7).collect(), rope_theta: 10_000.0 })
    }
}

/// An image prepared for the tower: patches [3·2·14·14] in the processor's order and the
/// grid of patches.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionInput {
    pub patches: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl VisionInput {
    /// An image (HWC, values 0..1, sides multiples of 28) normalised and cut as
    /// `Qwen2VLImageProcessor` does: per patch its features in (channel, frame, row,
    /// column) order, the two frames the same image.
    pub fn from_image(hwc: &[f32], width: usize, height: usize) -> Result<Self> {
        let side = PATCH * MERGE;
        if width == 0 || height == 0 || width % side != 0 || height % side != 0 || hwc.len() != width * height * 3 {
            return Err(ModelError::Input(format!("a {width}x{height} image of {} values: the vision tower reads RGB images whose sides are multiples of {side}", hwc.len())));
        }
        let (rows, cols) = (height / PATCH, width / PATCH);
        let mut patches = Vec::with_capacity(rows * cols * 3 * TEMPORAL_PATCH * PATCH * PATCH);
        for br in 0..rows / MERGE {
            for bc in 0..cols / MERGE {
                for (mr, mc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let (pr, pc) = (br * MERGE + mr, bc * MERGE + mc);
                    for c in 0..3 {
                        for _ in 0..TEMPORAL_PATCH {
                            for y in 0..PATCH {
                                for x in 0..PATCH {
                                    let v = hwc[((pr * PATCH + y) * width + pc * PATCH + x) * 3 + c];
                                    patches.push((v - MEAN[c]) / STD[c]);
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(VisionInput { patches, rows, cols })
    }

    /// Patches in the input.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The windows of a `rows` × `cols` patch grid: the merge blocks (indices in reading
/// order) window by window, and each window's block count — transformers'
/// `get_vision_window_index` (windows of 112 / 14 / 2 = 4 blocks a side, empty ones
/// dropped).
pub fn windows(rows: usize, cols: usize) -> (Vec<usize>, Vec<usize>) {
    let w = WINDOW / MERGE / PATCH;
    let (br, bc) = (rows / MERGE, cols / MERGE);
    let (mut order, mut sizes) = (Vec::new(), Vec::new());
    for wr in 0..br.div_ceil(w) {
        for wc in 0..bc.div_ceil(w) {
            let before = order.len();
            for r in wr * w..((wr + 1) * w).min(br) {
                for c in wc * w..((wc + 1) * w).min(bc) {
                    order.push(r * bc + c);
                }
            }
            sizes.push(order.len() - before);
        }
    }
    (order, sizes)
}

/// The rotary cos and sin tables, one row of `head_dim / 2` angles per patch in the
/// processor's order: row position × the first half of the frequencies, column
/// position × the second (transformers' axial vision rope).
fn rope_tables(rows: usize, cols: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let half = (HEAD_DIM / 2) as usize;
    let quarter = half / 2;
    let inv: Vec<f64> = (0..quarter).map(|i| 1.0 / (theta as f64).powf((2 * i) as f64 / half as f64)).collect();
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for br in 0..rows / MERGE {
        for bc in 0..cols / MERGE {
            for (mr, mc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let (r, c) = ((br * MERGE + mr) as f64, (bc * MERGE + mc) as f64);
                for (pos, f) in inv.iter().map(|f| (r, f)).chain(inv.iter().map(|f| (c, f))) {
                    let a = (pos * f) as f32;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
    }
    (cos, sin)
}

/// `rows` of [F, N] (contiguous [F, n] each) gathered in `order` of groups of `group`.
fn permute_groups(v: &[f32], width: usize, group: usize, order: &[usize]) -> Vec<f32> {
    let g = width * group;
    order.iter().flat_map(|&i| v[i * g..(i + 1) * g].iter().copied()).collect()
}

pub struct VisionTower<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: VisionConfig,
}

impl<'w> VisionTower<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: VisionConfig) -> Result<Self> {
        let c = &config;
        let at = |s: &str| format!("{prefix}{s}");
        let lin = |name: &str, i: i64, o: i64, bias: bool| -> Result<()> {
            w.expect(&at(&format!("{name}.weight")), &[i, o])?;
            if bias {
                w.expect(&at(&format!("{name}.bias")), &[o])?;
            }
            Ok(())
        };
        let patch = (3 * TEMPORAL_PATCH * PATCH * PATCH) as i64;
        if w.contains(&at("patch_embed.proj.0.weight")) {
            lin("patch_embed.proj.0", patch / 2, c.hidden, false)?;
            lin("patch_embed.proj.1", patch / 2, c.hidden, false)?;
        } else {
            lin("patch_embed.proj", patch, c.hidden, false)?;
        }
        if c.depth == 0 {
            return Err(ModelError::Config(format!("a vision tower without blocks: no `{}`", at(MARKER))));
        }
        for i in 0..c.depth {
            let p = format!("blocks.{i}");
            w.expect(&at(&format!("{p}.norm1.weight")), &[c.hidden])?;
            w.expect(&at(&format!("{p}.norm2.weight")), &[c.hidden])?;
            lin(&format!("{p}.attn.qkv"), c.hidden, 3 * c.hidden, true)?;
            lin(&format!("{p}.attn.proj"), c.hidden, c.hidden, true)?;
            lin(&format!("{p}.mlp.gate_proj"), c.hidden, c.intermediate, true)?;
            lin(&format!("{p}.mlp.up_proj"), c.hidden, c.intermediate, true)?;
            lin(&format!("{p}.mlp.down_proj"), c.intermediate, c.hidden, true)?;
        }
        let merged = c.hidden * (MERGE * MERGE) as i64;
        w.expect(&at("merger.ln_q.weight"), &[c.hidden])?;
        lin("merger.mlp.0", merged, merged, true)?;
        lin("merger.mlp.2", merged, c.out_hidden, true)?;
        Ok(VisionTower { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// Nodes one run of the tower needs in a graph of this many patches.
    pub fn graph_size(&self, input: &VisionInput) -> usize {
        let (_, sizes) = windows(input.rows, input.cols);
        self.config.depth * (64 + 16 * sizes.len()) + 1024
    }

    /// The merged tokens [out_hidden, N/4] of one image, in reading order of its merge
    /// blocks (what the language model reads in place of its image pads).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, input: &VisionInput) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let n = input.len();
        let feat = 3 * TEMPORAL_PATCH * PATCH * PATCH;
        if n == 0 || input.rows % MERGE != 0 || input.cols % MERGE != 0 || input.patches.len() != n * feat {
            return Err(ModelError::Input(format!("{} patch values for a {}x{} grid of {feat}-value patches (sides even)", input.patches.len(), input.rows, input.cols)));
        }
        let unit = MERGE * MERGE;
        let (order, sizes) = windows(input.rows, input.cols);
        let (cos, sin) = rope_tables(input.rows, input.cols, c.rope_theta);
        let half = (HEAD_DIM / 2) as usize;
        let x = run.input_f32(&[feat as i64, n as i64], permute_groups(&input.patches, feat, unit, &order))?;
        let cos = run.input_f32(&[half as i64, 1, n as i64], permute_groups(&cos, half, unit, &order))?;
        let sin = run.input_f32(&[half as i64, 1, n as i64], permute_groups(&sin, half, unit, &order))?;
        let mut x = if self.w.contains(&self.name("patch_embed.proj.0.weight")) {
            // One kernel per frame (llama.cpp's mmproj): each multiplies its frame's
            // (channel, row, column) values, cut out of the (channel, frame, …) patches.
            let area = PATCH * PATCH;
            let nb = x.nb();
            let frame = |f: usize| -> Result<Tensor<'a>> {
                let v = ctx.view(x, [area as i64, 3, n as i64, 1], [nb[0] * TEMPORAL_PATCH * area, nb[1], nb[1] * n], f * area * nb[0])?;
                Ok(ctx.reshape(ctx.cont(v)?, [(3 * area) as i64, n as i64, 1, 1])?)
            };
            let a = linear(ctx, self.w, &self.name("patch_embed.proj.0"), frame(0)?)?;
            ctx.add(a, linear(ctx, self.w, &self.name("patch_embed.proj.1"), frame(1)?)?)?
        } else {
            linear(ctx, self.w, &self.name("patch_embed.proj"), x)?
        }; // [D, N]
        let spans: Vec<(i64, i64)> = sizes
            .iter()
            .scan(0i64, |at, &s| {
                let span = (*at, (s * unit) as i64);
                *at += span.1;
                Some(span)
            })
            .collect();
        for i in 0..c.depth {
            let p = format!("blocks.{i}");
            let h = rms_norm(ctx, self.w, &self.name(&format!("{p}.norm1.weight")), x, 1e-6)?;
            let full = c.full_attention.contains(&i);
            let a = self.attention(ctx, &p, h, cos, sin, if full { &[] } else { &spans[..] })?;
            x = ctx.add(x, a)?;
            let h = rms_norm(ctx, self.w, &self.name(&format!("{p}.norm2.weight")), x, 1e-6)?;
            let g = ctx.silu(linear(ctx, self.w, &self.name(&format!("{p}.mlp.gate_proj")), h)?)?;
            let u = linear(ctx, self.w, &self.name(&format!("{p}.mlp.up_proj")), h)?;
            x = ctx.add(x, linear(ctx, self.w, &self.name(&format!("{p}.mlp.down_proj")), ctx.mul(g, u)?)?)?;
        }
        let h = rms_norm(ctx, self.w, &self.name("merger.ln_q.weight"), x, 1e-6)?;
        let h = ctx.reshape(h, [c.hidden * unit as i64, (n / unit) as i64, 1, 1])?;
        let h = ctx.gelu_erf(linear(ctx, self.w, &self.name("merger.mlp.0"), h)?)?;
        let merged = linear(ctx, self.w, &self.name("merger.mlp.2"), h)?; // [out, N/4], window order
        // Back to reading order: row k of the output is the merged token of block `order[k]`.
        let mut back = vec![0i32; order.len()];
        for (k, &b) in order.iter().enumerate() {
            back[b] = k as i32;
        }
        let idx = run.input_i32(&[back.len() as i64], back)?;
        Ok(ctx.get_rows(ctx.reshape(merged, [c.out_hidden, (n / unit) as i64, 1, 1])?, idx)?)
    }

    /// Self-attention of x [D, N] with the rotary tables, over the whole image or, given
    /// `spans` (start, length), within each span.
    fn attention<'a>(&'a self, ctx: &'a Context, p: &str, x: Tensor<'a>, cos: Tensor<'a>, sin: Tensor<'a>, spans: &[(i64, i64)]) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [d, n, _, _] = x.ne();
        let qkv = linear(ctx, self.w, &self.name(&format!("{p}.attn.qkv")), x)?;
        let part = |j: i64, rotate: bool| -> Result<Tensor<'a>> {
            let t = ctx.reshape(super::super::dit::features(ctx, qkv, j * d, d)?, [HEAD_DIM, c.heads, n, 1])?;
            let t = if rotate { rotate_half(ctx, t, cos, sin)? } else { t };
            Ok(ctx.reshape(t, [d, n, 1, 1])?)
        };
        let (q, k, v) = (part(0, true)?, part(1, true)?, part(2, false)?);
        let out = if spans.is_empty() {
            attention(ctx, q, k, v, c.heads, None)?
        } else {
            let mut out: Option<Tensor<'a>> = None;
            for &(s, len) in spans {
                let rows = |t: Tensor<'a>| super::super::dit::rows(ctx, t, s, len);
                let a = attention(ctx, rows(q)?, rows(k)?, rows(v)?, c.heads, None)?;
                out = Some(match out {
                    None => a,
                    Some(o) => ctx.concat(o, a, 1)?,
                });
            }
            out.expect("an image has at least one window")
        };
        linear(ctx, self.w, &self.name(&format!("{p}.attn.proj")), out)
    }
}

/// x [dh, H, N, 1] rotated as Hugging Face's `rotate_half`: pair (i, i + dh/2) turns by
/// angle i of the tables [dh/2, 1, N].
fn rotate_half<'a>(ctx: &'a Context, x: Tensor<'a>, cos: Tensor<'a>, sin: Tensor<'a>) -> Result<Tensor<'a>> {
    let [dh, h, n, _] = x.ne();
    let nb = x.nb();
    let half = |k: i64| -> Result<Tensor<'a>> { Ok(ctx.cont(ctx.view(x, [dh / 2, h, n, 1], [nb[1], nb[2], nb[3]], (k * dh / 2) as usize * nb[0])?)?) };
    let (a, b) = (half(0)?, half(1)?);
    let first = ctx.sub(ctx.mul(a, cos)?, ctx.mul(b, sin)?)?;
    let second = ctx.add(ctx.mul(b, cos)?, ctx.mul(a, sin)?)?;
    Ok(ctx.concat(first, second, 0)?)
}

/// The prefix under which tensors called `names` hold the vision tower (`visual.`,
/// `model.visual.`; an mmproj file's is shown as `visual.`).
pub fn find_prefix<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Option<String> {
    super::super::prefix_before(names.clone(), MARKER).filter(|p| p.ends_with("visual.")).or_else(|| is_mmproj(names).then(|| "visual.".to_string()))
}

/// llama.cpp's mmproj naming of a Qwen2.5-VL vision tower.
pub fn is_mmproj<'a>(mut names: impl Iterator<Item = &'a str>) -> bool {
    names.any(|n| n == "v.blk.0.attn_q.weight")
}

/// An mmproj tensor's Hugging Face name under `visual.` (q, k and v are stacked into
/// `qkv` by [`vision_layout`]; the two frame kernels keep their own names).
fn mmproj_name(name: &str) -> Option<String> {
    const TOP: [(&str, &str); 5] = [("v.patch_embd.weight", "patch_embed.proj.0.weight"), ("v.patch_embd.weight.1", "patch_embed.proj.1.weight"), ("v.post_ln.weight", "merger.ln_q.weight"), ("mm.0.", "merger.mlp.0."), ("mm.2.", "merger.mlp.2.")];
    const BLOCK: [(&str, &str); 7] = [("attn_out.", "attn.proj."), ("ln1.", "norm1."), ("ln2.", "norm2."), ("ffn_gate.", "mlp.gate_proj."), ("ffn_up.", "mlp.up_proj."), ("ffn_down.", "mlp.down_proj."), ("attn_qkv.", "attn.qkv.")];
    for (g, h) in TOP {
        if name == g || (g.ends_with('.') && name.starts_with(g)) {
            return Some(format!("visual.{h}{}", &name[g.len()..]));
        }
    }
    let (i, rest) = name.strip_prefix("v.blk.")?.split_once('.')?;
    let (g, h) = BLOCK.iter().find(|(g, _)| rest.starts_with(g))?;
    Some(format!("visual.blocks.{i}.{h}{}", &rest[g.len()..]))
}

/// `src`'s vision tower in Hugging Face's names with the 5-D patch kernel [hidden, 3, 2,
/// 14, 14] shown as the [hidden, 1176] matrix it multiplies patches by (an mmproj file:
/// q, k and v stacked into `qkv`, each frame's [hidden, 3, 14, 14] kernel as a [hidden,
/// 588] matrix); the rest of the file left out.
pub fn vision_layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    if is_mmproj(src.tensors().iter().map(|t| t.name.as_str())) {
        return mmproj_layout(src);
    }
    let prefix = find_prefix(src.tensors().iter().map(|t| t.name.as_str())).ok_or_else(|| ModelError::Config(format!("{}: no Qwen2.5-VL vision tower (`…visual.{MARKER}`, or an mmproj's `v.blk.0.attn_q.weight`)", src.path().display())))?;
    let renamed = crate::io::assembled::Assembled::renamed(src, |t: &TensorInfo| {
        if !t.name.starts_with(&prefix) {
            return None;
        }
        let mut info = t.clone();
        if let [o, c, f, kh, kw] = t.shape[..] {
            info.shape = vec![o, c * f * kh * kw];
        }
        Some(info)
    })
    .map_err(|name| ModelError::Config(format!("two tensors named `{name}`")))?;
    Ok(Box::new(renamed))
}

fn mmproj_layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    use crate::io::Rows;
    let shown = src.path().display().to_string();
    let mut plan = Vec::new();
    let mut kernels = Vec::new();
    for t in src.tensors() {
        if let Some(rest) = t.name.strip_prefix("v.blk.") {
            let (i, part) = rest.split_once('.').unwrap_or((rest, ""));
            if let Some(kind) = part.strip_prefix("attn_q.") {
                // q, k and v rows stacked: Hugging Face's fused `qkv`.
                let parts = ["attn_q", "attn_k", "attn_v"]
                    .iter()
                    .map(|p| {
                        let name = format!("v.blk.{i}.{p}.{kind}");
                        src.get(&name).map(Rows::all).ok_or_else(|| ModelError::Weight { name: name.clone(), detail: format!("{shown}: an mmproj block without its {p}") })
                    })
                    .collect::<Result<Vec<_>>>()?;
                plan.push((format!("visual.blocks.{i}.attn.qkv.{kind}"), parts));
                continue;
            }
            if part.starts_with("attn_k.") || part.starts_with("attn_v.") {
                continue;
            }
        }
        if let Some(name) = mmproj_name(&t.name) {
            if let [o, c, kh, kw] = t.shape[..] {
                kernels.push((name.clone(), vec![o, c * kh * kw]));
            }
            plan.push((name, vec![Rows::all(t)]));
        }
    }
    let mut out = crate::io::Assembled::new(src, plan).map_err(|detail| ModelError::Weight { name: shown.clone(), detail })?;
    for (name, shape) in kernels {
        out.reshape(&name, shape).map_err(|detail| ModelError::Weight { name: name.clone(), detail })?;
    }
    Ok(Box::new(out))
}
