//! ESRGAN-family image upscalers as ggml graphs: the RRDBNet of ESRGAN / Real-ESRGAN
//! (x4plus, x4plus-anime-6B, x2plus) and Real-ESRGAN's compact SRVGGNet (animevideov3,
//! general-x4v3), with tiled inference like sd.cpp's `--upscale-tile-size`.
//!
//! Weights use the basicsr names (`conv_first`, `body.N.rdb1.conv1`, `conv_body`,
//! `conv_up1`, `conv_up2`, `conv_hr`, `conv_last`; SRVGG: `body.N` convs and PReLUs). The
//! original ESRGAN names (`model.0`, `model.1.sub.N.RDB1.conv1.0`, `model.3`, ...) and
//! Real-ESRGAN's `params_ema.` / `params.` wrappers are renamed at load, as ComfyUI
//! (spandrel) and sd.cpp accept them. Everything else — block count, widths, scale — is
//! read off the weight shapes.
//!
//! Images are one at a time, [W, H, C, 1] in ggml order (planar RGB, 0..=1 as the networks
//! were trained); outputs are not clamped, callers clamp when turning them into pixels.

use super::nn::conv2d;
use super::{ModelError, Result, WeightSpec, Weights};
use crate::dtype::{self, DType};
use crate::ggml::{Backend, Context, GType, GraphAllocator, GraphRun, Tensor};
use crate::io::{TensorSource, TypeRules};
use std::collections::{BTreeMap, BTreeSet};

/// basicsr's `lrelu` slope in RRDBNet.
const LRELU_SLOPE: f32 = 0.2;
/// Residual scaling of the dense blocks (`x5 * 0.2 + x`, `out * 0.2 + x`).
const RESIDUAL_SCALE: f32 = 0.2;

/// RRDBNet: `num_blocks` RRDBs of three dense blocks each.
#[derive(Clone, Debug, PartialEq)]
pub struct RrdbConfig {
    pub in_channels: i64,
    pub out_channels: i64,
    pub num_feat: i64,
    pub num_grow: i64,
    pub num_blocks: usize,
    /// Nearest-×2 + conv stages (`conv_up1`, `conv_up2`, ...).
    pub num_upsample: u32,
    /// Real-ESRGAN's x2/x1 models pixel-unshuffle the input by this factor (1: none).
    pub unshuffle: i64,
}

/// SRVGGNetCompact with PReLU activations.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactConfig {
    pub in_channels: i64,
    pub out_channels: i64,
    pub num_feat: i64,
    /// Body convolutions between the first and the last.
    pub num_conv: usize,
    pub upscale: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Arch {
    Rrdb(RrdbConfig),
    Compact(CompactConfig),
}

impl Arch {
    /// Output pixels per input pixel along each axis.
    pub fn scale(&self) -> i64 {
        match self {
            Arch::Rrdb(c) => (1i64 << c.num_upsample) / c.unshuffle,
            Arch::Compact(c) => c.upscale,
        }
    }

    pub fn in_channels(&self) -> i64 {
        match self {
            Arch::Rrdb(c) => c.in_channels,
            Arch::Compact(c) => c.in_channels,
        }
    }

    pub fn out_channels(&self) -> i64 {
        match self {
            Arch::Rrdb(c) => c.out_channels,
            Arch::Compact(c) => c.out_channels,
        }
    }

    /// A short human name ("RRDBNet (23 blocks, 64 features) x4").
    pub fn describe(&self) -> String {
        match self {
            Arch::Rrdb(c) => format!("RRDBNet ({} blocks, {} features) x{}", c.num_blocks, c.num_feat, self.scale()),
            Arch::Compact(c) => format!("SRVGGNetCompact ({} convs, {} features) x{}", c.num_conv, c.num_feat, self.scale()),
        }
    }
}

/// The basicsr name each stored tensor is loaded as, keyed by that basicsr name.
///
/// Real-ESRGAN checkpoints wrap the state dict in `params_ema` (preferred, as its
/// inference script does) or `params`; original ESRGAN checkpoints number the layers of
/// an `nn.Sequential`.
pub fn canonical_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<BTreeMap<String, String>> {
    let names: Vec<&str> = names.into_iter().collect();
    let wrapper = ["params_ema.", "params.", "module."].into_iter().find(|p| names.iter().any(|n| n.starts_with(p)));
    let stripped: Vec<(String, &str)> = names
        .iter()
        .filter_map(|&n| match wrapper {
            Some(p) => n.strip_prefix(p).map(|s| (s.to_string(), n)),
            None => Some((n.to_string(), n)),
        })
        .collect();
    let old = stripped.iter().any(|(s, _)| s.starts_with("model.0.") || s.starts_with("model.1.sub."));
    let mut out = BTreeMap::new();
    if !old {
        for (s, orig) in stripped {
            out.insert(s, orig.to_string());
        }
        return Ok(out);
    }
    // Old ESRGAN: model.0 conv_first, model.1.sub.{i} RRDBs then conv_body, and after the
    // upsampling stages (Upsample, conv, LeakyReLU each) conv_hr, LeakyReLU, conv_last.
    let bad = |n: &str, why: &str| ModelError::Weight { name: n.to_string(), detail: format!("unsupported ESRGAN layout: {why}") };
    let mut blocks = BTreeSet::new();
    let mut tail = BTreeSet::new();
    for (s, _) in &stripped {
        let parts: Vec<&str> = s.split('.').collect();
        if parts.len() >= 4 && parts[0] == "model" && parts[1] == "1" && parts[2] == "sub" {
            let i: usize = parts[3].parse().map_err(|_| bad(s, "non-numeric block index"))?;
            if parts.len() > 5 {
                blocks.insert(i);
            }
        } else if parts.len() == 3 && parts[0] == "model" {
            let i: usize = parts[1].parse().map_err(|_| bad(s, "non-numeric layer index"))?;
            if i >= 2 {
                tail.insert(i);
            }
        }
    }
    let nb = blocks.len();
    if blocks.iter().copied().ne(0..nb) {
        return Err(bad("model.1.sub", "RRDB indices are not 0..n"));
    }
    let tail: Vec<usize> = tail.into_iter().collect();
    if tail.len() < 2 {
        return Err(bad("model", "no conv_hr / conv_last layers"));
    }
    let ups = tail.len() - 2;
    let expected: Vec<usize> = (0..ups).map(|i| 3 + 3 * i).chain([2 + 3 * ups, 4 + 3 * ups]).collect();
    if tail != expected {
        return Err(bad("model", &format!("layer indices {tail:?}, expected {expected:?} for {ups} upsampling stages")));
    }
    let rename = |s: &str| -> Result<String> {
        let parts: Vec<&str> = s.split('.').collect();
        let leaf = *parts.last().unwrap_or(&"");
        match parts.as_slice() {
            ["model", "0", _] => Ok(format!("conv_first.{leaf}")),
            ["model", "1", "sub", i, _] if i.parse::<usize>().ok() == Some(nb) => Ok(format!("conv_body.{leaf}")),
            ["model", "1", "sub", i, rdb, conv, "0", _] if rdb.starts_with("RDB") => Ok(format!("body.{i}.{}.{conv}.{leaf}", rdb.to_ascii_lowercase())),
            ["model", i, _] => {
                let i: usize = i.parse().map_err(|_| bad(s, "non-numeric layer index"))?;
                let pos = tail.iter().position(|&t| t == i).ok_or_else(|| bad(s, "unexpected layer"))?;
                Ok(match pos {
                    p if p < ups => format!("conv_up{}.{leaf}", p + 1),
                    p if p == ups => format!("conv_hr.{leaf}"),
                    _ => format!("conv_last.{leaf}"),
                })
            }
            _ => Err(bad(s, "unexpected tensor")),
        }
    };
    for (s, orig) in stripped {
        let name = rename(&s)?;
        if out.insert(name.clone(), orig.to_string()).is_some() {
            return Err(bad(orig, &format!("two tensors map to `{name}`")));
        }
    }
    Ok(out)
}

/// RRDBNet's image channels and input unshuffle factor from `conv_first`'s input and
/// `conv_last`'s output channels: x2plus / x1 models feed pixel-unshuffled input, 4× or
/// 16× the image channels.
fn rrdb_unshuffle(cin: i64, cout: i64) -> (i64, i64) {
    match (cin, cout) {
        (c, o) if c == o => (c, 1),
        (c, o) if c == 4 * o => (o, 2),
        (c, o) if c == 16 * o => (o, 4),
        _ => (cin, 1),
    }
}

/// RRDBNet's scale: ×2 per upsampling stage, less the input's unshuffle.
fn rrdb_scale(num_upsample: u32, unshuffle: i64) -> Result<i64> {
    if num_upsample > 4 || (1i64 << num_upsample) < unshuffle {
        return Err(ModelError::Config(format!("RRDBNet with {num_upsample} upsampling stages and a {unshuffle}× unshuffled input")));
    }
    Ok((1i64 << num_upsample) / unshuffle)
}

/// SRVGGNetCompact's body is conv, act, (conv, act) × num_conv, conv: the last conv is the
/// highest even index with a weight.
fn compact_last_conv(contains: impl Fn(&str) -> bool) -> Result<usize> {
    let mut last = 0;
    while contains(&format!("body.{}.weight", last + 2)) {
        last += 2;
    }
    if last < 2 {
        return Err(ModelError::Config("SRVGGNetCompact body has no final convolution (`body.2.weight`)".into()));
    }
    Ok(last)
}

/// The last conv emits out_channels·upscale² for the pixel shuffle, out_channels being the
/// input's channel count.
fn compact_upscale(cin: i64, cout_total: i64) -> Result<i64> {
    let sq = cout_total / cin.max(1);
    (1..=8).find(|u| u * u == sq && cin > 0 && cout_total % cin == 0).ok_or_else(|| {
        ModelError::Config(format!("SRVGGNetCompact last conv has {cout_total} outputs, not {cin}·r² for an upscale r"))
    })
}

/// The scale of the upscaler in `src`, from its tensor names and shapes alone: nothing is
/// read or loaded, so a model list can report it for every file cheaply. The full checks
/// are [`Upscaler::load`]'s.
pub fn scale_of(src: &dyn TensorSource) -> Result<i64> {
    let names = canonical_names(src.tensors().iter().map(|t| t.name.as_str()))?;
    // PyTorch order, [out, in, kh, kw].
    let channels = |name: &str| -> Result<(i64, i64)> {
        let key = format!("{name}.weight");
        let info = names.get(&key).and_then(|orig| src.get(orig)).ok_or_else(|| ModelError::MissingWeight(key.clone()))?;
        match info.shape.as_slice() {
            [o, i, _, _] => Ok((*i as i64, *o as i64)),
            other => Err(ModelError::Weight { name: key, detail: format!("not a conv kernel: {other:?}") }),
        }
    };
    if names.contains_key("conv_first.weight") {
        let (cin, _) = channels("conv_first")?;
        let (_, cout) = channels("conv_last")?;
        let num_upsample = (1..).take_while(|i| names.contains_key(&format!("conv_up{i}.weight"))).count() as u32;
        let (_, unshuffle) = rrdb_unshuffle(cin, cout);
        rrdb_scale(num_upsample, unshuffle)
    } else if names.contains_key("body.0.weight") {
        let (cin, _) = channels("body.0")?;
        let last = compact_last_conv(|n| names.contains_key(n))?;
        let (_, cout_total) = channels(&format!("body.{last}"))?;
        compact_upscale(cin, cout_total)
    } else {
        Err(ModelError::Config("not an ESRGAN upscaler: neither `conv_first.weight` (RRDBNet) nor `body.0.weight` (SRVGGNetCompact) is present".into()))
    }
}

/// An upscaler: its weights (under basicsr names) and the architecture they imply.
pub struct Upscaler {
    weights: Weights,
    pub arch: Arch,
}

impl super::Placeable for Upscaler {
    fn copy_to(&self, target: &crate::ggml::BufferType) -> Result<Self> {
        Ok(Upscaler { weights: self.weights.copy_to(target)?, arch: self.arch.clone() })
    }
}

impl crate::residency::Resident for Upscaler {
    fn footprint(&self) -> crate::residency::Footprint {
        self.weights.footprint()
    }
}

/// `{name}.weight` [k, k, in, out] in ggml order → (k, in, out).
fn conv_shape(w: &Weights, name: &str) -> Result<(i64, i64, i64)> {
    let ne = w.get(&format!("{name}.weight"))?.ne();
    if ne[0] != ne[1] || ne[0] % 2 == 0 {
        return Err(ModelError::Weight { name: format!("{name}.weight"), detail: format!("not an odd square conv kernel: {ne:?}") });
    }
    Ok((ne[0], ne[2], ne[3]))
}

impl Upscaler {
    /// Load every tensor of `src` (any layout [`canonical_names`] knows) onto `backend`.
    pub fn load(backend: &(impl crate::ggml::AllocTarget + ?Sized), src: &dyn TensorSource, rules: &TypeRules) -> Result<Self> {
        let names = canonical_names(src.tensors().iter().map(|t| t.name.as_str()))?;
        let mut specs = Vec::with_capacity(names.len());
        for (name, orig) in &names {
            let info = src.get(orig).ok_or_else(|| ModelError::MissingWeight(orig.clone()))?;
            if info.shape.is_empty() || info.shape.len() > 4 {
                return Err(ModelError::Weight { name: orig.clone(), detail: format!("{} dimensions", info.shape.len()) });
            }
            let ty = super::load::load_type(info, rules);
            let g = ty.ggml_type().ok_or_else(|| ModelError::Weight { name: orig.clone(), detail: format!("{ty:?} has no ggml type") })?;
            specs.push(WeightSpec { name: name.clone(), ty: GType(g), ne: info.shape.iter().rev().map(|&d| d as i64).collect() });
        }
        let weights = Weights::new(backend, &specs, |spec| {
            let orig = &names[&spec.name];
            let info = src.get(orig).ok_or_else(|| ModelError::MissingWeight(orig.clone()))?;
            let bytes = src.read(orig).map_err(|e| ModelError::Weight { name: orig.clone(), detail: e.to_string() })?;
            let ty = DType::from_ggml(spec.ty.0).ok_or_else(|| ModelError::Weight { name: orig.clone(), detail: "unknown ggml type".into() })?;
            if ty == info.dtype {
                return Ok(bytes.into_owned());
            }
            dtype::convert(info.dtype, &bytes, &info.shape, ty).map_err(|e| ModelError::Weight { name: orig.clone(), detail: e.to_string() })
        })
        .map_err(|e| in_file(src, e))?;
        Self::new(weights).map_err(|e| in_file(src, e))
    }

    /// Infer the architecture of `weights` (basicsr names) and check every weight it needs.
    pub fn new(weights: Weights) -> Result<Self> {
        let arch = if weights.contains("conv_first.weight") {
            Arch::Rrdb(Self::infer_rrdb(&weights)?)
        } else if weights.contains("body.0.weight") {
            Arch::Compact(Self::infer_compact(&weights)?)
        } else {
            return Err(ModelError::Config(
                "not an ESRGAN upscaler: neither `conv_first.weight` (RRDBNet) nor `body.0.weight` (SRVGGNetCompact) is present".into(),
            ));
        };
        Ok(Upscaler { weights, arch })
    }

    fn infer_rrdb(w: &Weights) -> Result<RrdbConfig> {
        let (_, cin, nf) = conv_shape(w, "conv_first")?;
        let num_blocks = (0..).take_while(|i| w.contains(&format!("body.{i}.rdb1.conv1.weight"))).count();
        if num_blocks == 0 {
            return Err(ModelError::MissingWeight("body.0.rdb1.conv1.weight".into()));
        }
        let (_, _, gc) = conv_shape(w, "body.0.rdb1.conv1")?;
        let num_upsample = (1..).take_while(|i| w.contains(&format!("conv_up{i}.weight"))).count() as u32;
        let (_, _, cout) = conv_shape(w, "conv_last")?;
        let (in_channels, unshuffle) = rrdb_unshuffle(cin, cout);
        rrdb_scale(num_upsample, unshuffle)?;
        let c = RrdbConfig { in_channels, out_channels: cout, num_feat: nf, num_grow: gc, num_blocks, num_upsample, unshuffle };
        w.expect_conv("conv_first", 3, cin, nf)?;
        for b in 0..num_blocks {
            for r in 1..=3 {
                for k in 0..5i64 {
                    let out = if k == 4 { nf } else { gc };
                    w.expect_conv(&format!("body.{b}.rdb{r}.conv{}", k + 1), 3, nf + k * gc, out)?;
                }
            }
        }
        for name in ["conv_body", "conv_hr"].into_iter().map(String::from).chain((1..=num_upsample).map(|i| format!("conv_up{i}"))) {
            w.expect_conv(&name, 3, nf, nf)?;
        }
        w.expect_conv("conv_last", 3, nf, cout)?;
        Ok(c)
    }

    fn infer_compact(w: &Weights) -> Result<CompactConfig> {
        let (_, cin, nf) = conv_shape(w, "body.0")?;
        let last = compact_last_conv(|n| w.contains(n))?;
        let (_, _, cout_total) = conv_shape(w, &format!("body.{last}"))?;
        let num_conv = last / 2 - 1;
        // The output has as many channels as the input in every released model.
        let out_channels = cin;
        let upscale = compact_upscale(cin, cout_total)?;
        for i in 0..=num_conv {
            let act = format!("body.{}.weight", 2 * i + 1);
            if !w.contains(&act) {
                return Err(ModelError::Config(format!(
                    "SRVGGNetCompact without PReLU weights (`{act}` is missing): only the PReLU variant is supported"
                )));
            }
            w.expect(&act, &[nf])?;
        }
        w.expect_conv("body.0", 3, cin, nf)?;
        for i in 1..=num_conv {
            w.expect_conv(&format!("body.{}", 2 * i), 3, nf, nf)?;
        }
        w.expect_conv(&format!("body.{last}"), 3, nf, cout_total)?;
        Ok(CompactConfig { in_channels: cin, out_channels, num_feat: nf, num_conv, upscale })
    }

    pub fn scale(&self) -> i64 {
        self.arch.scale()
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Nodes in one forward graph, with room to spare.
    pub fn graph_size(&self) -> usize {
        match &self.arch {
            Arch::Rrdb(c) => 512 + c.num_blocks * 3 * 80,
            Arch::Compact(c) => 256 + c.num_conv * 24,
        }
    }

    /// One image [W, H, in_channels, 1] → [W·s, H·s, out_channels, 1].
    pub fn forward<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let n = x.ne();
        if n[2] != self.arch.in_channels() || n[3] != 1 {
            return Err(ModelError::Input(format!("{}: input {n:?}, expected [W, H, {}, 1]", self.arch.describe(), self.arch.in_channels())));
        }
        match &self.arch {
            Arch::Rrdb(c) => self.forward_rrdb(ctx, c, x),
            Arch::Compact(c) => self.forward_compact(ctx, c, x),
        }
    }

    fn conv<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        conv2d(ctx, &self.weights, name, x, 1, 1)
    }

    fn conv_lrelu<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        Ok(ctx.leaky_relu(self.conv(ctx, name, x)?, LRELU_SLOPE)?)
    }

    fn forward_rrdb<'a>(&'a self, ctx: &'a Context, c: &RrdbConfig, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let n = x.ne();
        if n[0] % c.unshuffle != 0 || n[1] % c.unshuffle != 0 {
            return Err(ModelError::Input(format!("{}: {}x{} is not divisible by {}", self.arch.describe(), n[0], n[1], c.unshuffle)));
        }
        let x = if c.unshuffle > 1 { pixel_unshuffle(ctx, x, c.unshuffle)? } else { x };
        let feat = self.conv(ctx, "conv_first", x)?;
        let mut body = feat;
        for b in 0..c.num_blocks {
            let mut out = body;
            for r in 1..=3 {
                out = self.dense_block(ctx, &format!("body.{b}.rdb{r}"), out)?;
            }
            body = ctx.add(ctx.scale(out, RESIDUAL_SCALE)?, body)?;
        }
        let mut feat = ctx.add(feat, self.conv(ctx, "conv_body", body)?)?;
        for i in 1..=c.num_upsample {
            feat = self.conv_lrelu(ctx, &format!("conv_up{i}"), ctx.upscale(feat, 2)?)?;
        }
        self.conv(ctx, "conv_last", self.conv_lrelu(ctx, "conv_hr", feat)?)
    }

    fn dense_block<'a>(&'a self, ctx: &'a Context, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let mut cat = x;
        for k in 1..=4 {
            let xk = self.conv_lrelu(ctx, &format!("{p}.conv{k}"), cat)?;
            cat = ctx.concat(cat, xk, 2)?;
        }
        let x5 = self.conv(ctx, &format!("{p}.conv5"), cat)?;
        Ok(ctx.add(ctx.scale(x5, RESIDUAL_SCALE)?, x)?)
    }

    fn prelu<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let a = self.weights.get(&format!("{name}.weight"))?;
        let a = ctx.reshape(a, [1, 1, a.ne()[0], 1])?;
        let pos = ctx.relu(x)?;
        // x - relu(x) is min(x, 0) exactly, so both branches stay exact in f32.
        let neg = ctx.sub(x, pos)?;
        Ok(ctx.add(pos, ctx.mul(neg, a)?)?)
    }

    fn forward_compact<'a>(&'a self, ctx: &'a Context, c: &CompactConfig, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let mut h = self.prelu(ctx, "body.1", self.conv(ctx, "body.0", x)?)?;
        for i in 1..=c.num_conv {
            h = self.prelu(ctx, &format!("body.{}", 2 * i + 1), self.conv(ctx, &format!("body.{}", 2 * i), h)?)?;
        }
        let h = self.conv(ctx, &format!("body.{}", 2 * c.num_conv + 2), h)?;
        let h = pixel_shuffle(ctx, h, c.upscale)?;
        Ok(ctx.add(h, ctx.upscale(x, c.upscale as i32)?)?)
    }
}

fn in_file(src: &dyn TensorSource, e: ModelError) -> ModelError {
    match e {
        ModelError::Config(m) => ModelError::Config(format!("{}: {m}", src.path().display())),
        other => other,
    }
}

/// `F.pixel_shuffle(x, r)` on one image: [W, H, C·r², 1] → [W·r, H·r, C, 1], with
/// output (h·r + i, w·r + j) of channel c taken from input channel c·r² + i·r + j.
pub fn pixel_shuffle<'a>(ctx: &'a Context, x: Tensor<'a>, r: i64) -> Result<Tensor<'a>> {
    let [w, h, cr, n] = x.ne();
    if n != 1 || r < 1 || cr % (r * r) != 0 {
        return Err(ModelError::Input(format!("pixel_shuffle by {r} of {:?}", x.ne())));
    }
    let c = cr / (r * r);
    let x = if x.is_contiguous() { x } else { ctx.cont(x)? };
    // Width first: j is the innermost channel factor and becomes the innermost width one.
    let t = ctx.reshape(x, [w, h, r, r * c])?;
    let t = ctx.cont(ctx.permute(t, [1, 2, 0, 3])?)?; // [r_j, W, H, r_i·C]
    let t = ctx.reshape(t, [r * w, h, r, c])?;
    let t = ctx.cont(ctx.permute(t, [0, 2, 1, 3])?)?; // [W·r, r_i, H, C]
    Ok(ctx.reshape(t, [r * w, r * h, c, 1])?)
}

/// `F.pixel_unshuffle(x, r)`, the inverse of [`pixel_shuffle`].
pub fn pixel_unshuffle<'a>(ctx: &'a Context, x: Tensor<'a>, r: i64) -> Result<Tensor<'a>> {
    let [wr, hr, c, n] = x.ne();
    if n != 1 || r < 1 || wr % r != 0 || hr % r != 0 {
        return Err(ModelError::Input(format!("pixel_unshuffle by {r} of {:?}", x.ne())));
    }
    let (w, h) = (wr / r, hr / r);
    let x = if x.is_contiguous() { x } else { ctx.cont(x)? };
    let t = ctx.reshape(x, [wr, r, h, c])?; // H·r split as (i inner, h outer)
    let t = ctx.cont(ctx.permute(t, [0, 2, 1, 3])?)?; // [W·r, H, r_i, C]
    let t = ctx.reshape(t, [r, w, h, r * c])?;
    let t = ctx.cont(ctx.permute(t, [2, 0, 1, 3])?)?; // [W, H, r_j, r_i·C]
    Ok(ctx.reshape(t, [w, h, r * r * c, 1])?)
}

/// How an image is cut into tiles: square tiles of `tile` input pixels (smaller where the
/// image is), overlapping by `tile / 4` like sd.cpp's 0.25 overlap factor, blended with
/// smootherstep ramps across each overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    pub tile: usize,
}

impl Default for Tiling {
    /// sd.cpp's `--upscale-tile-size` default.
    fn default() -> Self {
        Tiling { tile: 128 }
    }
}

/// Tile starts along an axis of `len` pixels: the first at 0, the last flush with the
/// end, spread evenly so that neighbours overlap by at least `overlap`.
fn tile_starts(len: usize, tile: usize, overlap: usize) -> Vec<usize> {
    if tile >= len {
        return vec![0];
    }
    let stride = tile - overlap; // overlap < tile by construction
    let n = (len - overlap).div_ceil(stride).max(2);
    (0..n).map(|i| ((i * (len - tile)) as f64 / (n - 1) as f64).round() as usize).collect()
}

fn smootherstep(x: f32) -> f32 {
    let x = x.clamp(0.0, 1.0);
    x * x * x * (x * (6.0 * x - 15.0) + 10.0)
}

/// Blend weight of position `p` in a tile of `len` that starts at `start` in an axis of
/// `total`: ramps up across the overlap at an inner leading edge and down at an inner
/// trailing edge. Never 0, so every pixel has some weight.
fn edge_weight(p: usize, len: usize, start: usize, total: usize, overlap: usize) -> f32 {
    if overlap == 0 {
        return 1.0;
    }
    let mut w = 1.0f32;
    if start > 0 {
        w = w.min(smootherstep((p as f32 + 0.5) / overlap as f32));
    }
    if start + len < total {
        w = w.min(smootherstep((len as f32 - p as f32 - 0.5) / overlap as f32));
    }
    w
}

/// Upscale one planar image (`chw`, C×H×W, C = the model's input channels) tile by tile.
/// `on_tile(done, total)` reports progress and may abort by returning an error. Returns
/// the planar output and its width and height.
pub fn upscale_planar<E: From<ModelError>>(
    model: &Upscaler,
    backend: &Backend,
    chw: &[f32],
    width: usize,
    height: usize,
    tiling: Tiling,
    mut on_tile: impl FnMut(usize, usize) -> std::result::Result<(), E>,
) -> std::result::Result<(Vec<f32>, usize, usize), E> {
    let cin = model.arch.in_channels() as usize;
    let cout = model.arch.out_channels() as usize;
    let s = model.scale() as usize;
    if width == 0 || height == 0 || chw.len() != cin * width * height {
        return Err(ModelError::Input(format!("a {width}x{height} image with {} values for {cin} channels", chw.len())).into());
    }
    if tiling.tile == 0 {
        return Err(ModelError::Input("tile size 0".into()).into());
    }
    let (ow, oh) = (width.checked_mul(s), height.checked_mul(s));
    let (ow, oh) = match (ow, oh) {
        (Some(ow), Some(oh)) if ow.checked_mul(oh).and_then(|p| p.checked_mul(cout)).is_some() => (ow, oh),
        _ => return Err(ModelError::Input(format!("{width}x{height} times {s} overflows")).into()),
    };
    let (tw, th) = (tiling.tile.min(width), tiling.tile.min(height));
    let overlap = tiling.tile / 4;
    let xs = tile_starts(width, tw, overlap.min(tw.saturating_sub(1)));
    let ys = tile_starts(height, th, overlap.min(th.saturating_sub(1)));
    let total = xs.len() * ys.len();
    let mut acc = vec![0f32; cout * ow * oh];
    let mut wsum = vec![0f32; ow * oh];
    let (tow, toh) = (tw * s, th * s);
    let mut alloc = GraphAllocator::new(backend).map_err(ModelError::from)?;
    let mut done = 0;
    for &y0 in &ys {
        for &x0 in &xs {
            let mut tile = Vec::with_capacity(cin * tw * th);
            for c in 0..cin {
                for y in y0..y0 + th {
                    let row = (c * height + y) * width;
                    tile.extend_from_slice(&chw[row + x0..row + x0 + tw]);
                }
            }
            let out = run_tile(model, backend, &mut alloc, tile, tw, th)?;
            let wx: Vec<f32> = (0..tow).map(|p| edge_weight(p, tow, x0 * s, ow, overlap * s)).collect();
            let wy: Vec<f32> = (0..toh).map(|p| edge_weight(p, toh, y0 * s, oh, overlap * s)).collect();
            for (ty, &wyv) in wy.iter().enumerate() {
                let oy = y0 * s + ty;
                for (tx, &wxv) in wx.iter().enumerate() {
                    let wgt = wyv * wxv;
                    let o = oy * ow + x0 * s + tx;
                    wsum[o] += wgt;
                    for c in 0..cout {
                        acc[c * ow * oh + o] += wgt * out[(c * toh + ty) * tow + tx];
                    }
                }
            }
            done += 1;
            on_tile(done, total)?;
        }
    }
    for c in 0..cout {
        for (a, &w) in acc[c * ow * oh..(c + 1) * ow * oh].iter_mut().zip(&wsum) {
            *a /= w;
        }
    }
    Ok((acc, ow, oh))
}

fn run_tile(model: &Upscaler, backend: &Backend, alloc: &mut GraphAllocator, tile: Vec<f32>, w: usize, h: usize) -> Result<Vec<f32>> {
    let size = model.graph_size();
    let ctx = Context::new(size, size)?;
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[w as i64, h as i64, model.arch.in_channels(), 1], tile)?;
    let y = model.forward(&ctx, x)?;
    Ok(run.compute_with(backend, alloc, &[y], size)?.remove(0))
}

impl Arch {
    /// Every tensor of this architecture under its basicsr name, with its PyTorch shape.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        let mut conv = |name: String, cin: i64, cout: i64| {
            out.push((format!("{name}.weight"), vec![cout as usize, cin as usize, 3, 3]));
            out.push((format!("{name}.bias"), vec![cout as usize]));
        };
        match self {
            Arch::Rrdb(c) => {
                let (nf, gc) = (c.num_feat, c.num_grow);
                conv("conv_first".into(), c.in_channels * c.unshuffle * c.unshuffle, nf);
                for b in 0..c.num_blocks {
                    for r in 1..=3 {
                        for k in 0..5i64 {
                            conv(format!("body.{b}.rdb{r}.conv{}", k + 1), nf + k * gc, if k == 4 { nf } else { gc });
                        }
                    }
                }
                conv("conv_body".into(), nf, nf);
                for i in 1..=c.num_upsample {
                    conv(format!("conv_up{i}"), nf, nf);
                }
                conv("conv_hr".into(), nf, nf);
                conv("conv_last".into(), nf, c.out_channels);
            }
            Arch::Compact(c) => {
                let nf = c.num_feat;
                conv("body.0".into(), c.in_channels, nf);
                for i in 1..=c.num_conv {
                    conv(format!("body.{}", 2 * i), nf, nf);
                }
                conv(format!("body.{}", 2 * c.num_conv + 2), nf, c.out_channels * c.upscale * c.upscale);
                for i in 0..=c.num_conv {
                    out.push((format!("body.{}.weight", 2 * i + 1), vec![nf as usize]));
                }
            }
        }
        out
    }
}

/// Write a random-weight upscaler of architecture `arch` as an f32 safetensors file
/// (tests and benchmarks): PyTorch's default initialisation ranges (uniform ±1/√fan_in,
/// PReLU slopes 0.25), seeded by `seed`.
pub fn write_random(path: &std::path::Path, arch: &Arch, seed: u64) -> std::result::Result<(), crate::io::IoError> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = arch
        .tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let prelu = shape.len() == 1 && matches!(arch, Arch::Compact(_)) && name.ends_with(".weight");
            let fan_in = if shape.len() == 4 { shape[1] * 9 } else { 9 * shape[0] };
            let bound = 1.0 / (fan_in as f32).sqrt();
            let v: Vec<f32> = (0..n).map(|_| if prelu { 0.25 } else { rng.random_range(-bound..bound) }).collect();
            (name, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    crate::io::safetensors::write(path, tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new())
}
