//! The Wan-2.1 VAE (Qwen-Image's VAE is one) on single images: causal 3-D convolutions,
//! channel RMS norms, a single-head attention in the middle, 8× spatial compression.
//!
//! Keys are the Wan release's (what ComfyUI and sd.cpp load: `encoder.conv1`,
//! `encoder.downsamples.N.residual.{0,2,3,6}`, `decoder.upsamples.N.resample.1`,
//! `encoder.middle.{0,1,2}`, `encoder.head.{0,2}`, `conv1` / `conv2` around the latent),
//! bare or under a prefix (`vae.`, `first_stage_model.`), or diffusers' (`AutoencoderKLWan`
//! / `AutoencoderKLQwenImage`: a pipeline folder's `vae/`), renamed by [`wan_names`].
//!
//! One frame is all an image model needs, and on one frame a causal convolution sees
//! only its last temporal tap (the frames before are zero padding), the temporal
//! down/upsampling convolutions do not run at all (the reference skips them on the first
//! frame), so [`single_frame`] shows every 5-D kernel as its last 2-D tap and the
//! network runs as 2-D convolutions. Video (several frames and the per-chunk feature
//! cache) is for the video models to add.

use super::VaeOp;
use crate::ggml::{Circular, Context, Tensor};
use crate::io::{IoError, Location, TensorBytes, TensorInfo, TensorSource};
use crate::models::nn::{attention_typed, conv2d};
use crate::models::{ModelError, Result, Weights};
use std::collections::HashMap;
use std::path::Path;

/// The weight that tells a file holds a Wan-2.1 VAE, relative to its prefix.
pub const MARKER: &str = "decoder.middle.0.residual.0.gamma";

/// The same in diffusers' names (`AutoencoderKLWan` / `AutoencoderKLQwenImage`, a
/// pipeline folder's `vae/`).
pub const DIFFUSERS_MARKER: &str = "decoder.mid_block.resnets.0.norm1.gamma";

/// The Wan release's name of a VAE tensor in diffusers' names (relative to the VAE), the
/// inverse of diffusers' `convert_wan_vae_to_diffusers`; `None` for a name outside it.
pub fn wan_name(d: &str) -> Option<String> {
    // A residual block's parts.
    fn residual(rest: &str) -> String {
        const PARTS: [(&str, &str); 5] = [("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."), ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut.")];
        PARTS.iter().find_map(|(from, to)| rest.strip_prefix(from).map(|r| format!("{to}{r}"))).unwrap_or_else(|| rest.to_string())
    }
    let split = |s: &str| -> Option<(usize, String)> {
        let (i, rest) = s.split_once('.')?;
        Some((i.parse().ok()?, rest.to_string()))
    };
    for (from, to) in [("quant_conv.", "conv1."), ("post_quant_conv.", "conv2.")] {
        if let Some(r) = d.strip_prefix(from) {
            return Some(format!("{to}{r}"));
        }
    }
    let (side, rest) = d.split_once('.')?;
    if side != "encoder" && side != "decoder" {
        return None;
    }
    let named = |r: &str| format!("{side}.{r}");
    if let Some(r) = rest.strip_prefix("conv_in.") {
        return Some(named(&format!("conv1.{r}")));
    }
    if let Some(r) = rest.strip_prefix("norm_out.") {
        return Some(named(&format!("head.0.{r}")));
    }
    if let Some(r) = rest.strip_prefix("conv_out.") {
        return Some(named(&format!("head.2.{r}")));
    }
    if let Some(r) = rest.strip_prefix("mid_block.resnets.") {
        let (i, r) = split(r)?;
        return Some(named(&format!("middle.{}.{}", 2 * i, residual(&r))));
    }
    if let Some(r) = rest.strip_prefix("mid_block.attentions.0.") {
        return Some(named(&format!("middle.1.{r}")));
    }
    if let Some(r) = rest.strip_prefix("down_blocks.") {
        let (i, r) = split(r)?;
        return Some(named(&format!("downsamples.{i}.{}", residual(&r))));
    }
    // Each up block: three residual blocks, then its upsampler (the last has none).
    let (b, r) = split(rest.strip_prefix("up_blocks.")?)?;
    if let Some(r) = r.strip_prefix("resnets.") {
        let (k, r) = split(r)?;
        return Some(named(&format!("upsamples.{}.{}", 4 * b + k, residual(&r))));
    }
    let r = r.strip_prefix("upsamplers.0.")?;
    Some(named(&format!("upsamples.{}.{r}", 4 * b + 3)))
}

/// `src` in the Wan release's names when it holds the VAE in diffusers' names (under any
/// prefix, which stays); any other source as it is.
pub fn wan_names(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let Some(prefix) = crate::models::prefix_before(src.tensors().iter().map(|t| t.name.as_str()), DIFFUSERS_MARKER) else { return Ok(src) };
    let renamed = crate::io::Assembled::renamed(src, |t| {
        let rest = t.name.strip_prefix(&prefix)?;
        let mut info = t.clone();
        info.name = format!("{prefix}{}", wan_name(rest)?);
        Some(info)
    })
    .map_err(|name| ModelError::Config(format!("two diffusers tensors map to `{name}`")))?;
    Ok(Box::new(renamed))
}

/// The released VAE's latent statistics per channel (Wan 2.1's, which Qwen-Image reuses):
/// the diffusion models see `(latent − mean) / std` (diffusers' `latents_mean` /
/// `latents_std`, ComfyUI's `latent_formats.Wan21`).
pub const LATENTS_MEAN: [f32; 16] = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921];
pub const LATENTS_STD: [f32; 16] = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160];

/// What one stage of the encoder or decoder list holds (`downsamples.N` / `upsamples.N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    Residual,
    /// Down (encoder) or up (decoder) by 2 in space.
    Resample,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WanVaeConfig {
    /// Latent channels (16).
    pub z_channels: i64,
    pub image_channels: i64,
    /// The encoder's `downsamples` list (empty: a decoder-only file).
    pub down: Vec<Layer>,
    /// The decoder's `upsamples` list.
    pub up: Vec<Layer>,
}

impl WanVaeConfig {
    /// Read the layer lists off the weights under `prefix`.
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a Wan VAE: no `{}`", at(MARKER))));
        }
        let list = |side: &str| -> Vec<Layer> {
            (0..)
                .map_while(|i| {
                    let p = format!("{prefix}{side}.{i}");
                    if w.contains(&format!("{p}.residual.0.gamma")) {
                        Some(Layer::Residual)
                    } else if w.contains(&format!("{p}.resample.1.weight")) {
                        Some(Layer::Resample)
                    } else {
                        None
                    }
                })
                .collect()
        };
        let z_channels = w.get(&at("decoder.conv1.weight"))?.ne()[2];
        let image_channels = w.get(&at("decoder.head.2.weight"))?.ne()[3];
        let down = if w.contains(&at("encoder.conv1.weight")) { list("encoder.downsamples") } else { Vec::new() };
        Ok(WanVaeConfig { z_channels, image_channels, down, up: list("decoder.upsamples") })
    }

    /// Pixels per latent pixel on each side.
    pub fn downscale(&self) -> i64 {
        1 << self.up.iter().filter(|l| **l == Layer::Resample).count()
    }
}

pub struct WanVae<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: WanVaeConfig,
    /// Seamless tiling: convolutions pad circularly on these axes.
    pub circular: Circular,
}

impl<'w> WanVae<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: WanVaeConfig) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if config.up.is_empty() {
            return Err(ModelError::Config(format!("a Wan VAE without decoder stages: no `{}`", at("decoder.upsamples.0.residual.0.gamma"))));
        }
        for (side, list) in [("decoder.upsamples", &config.up), ("encoder.downsamples", &config.down)] {
            for (i, l) in list.iter().enumerate() {
                if *l == Layer::Residual {
                    for part in ["residual.2.weight", "residual.6.weight", "residual.3.gamma"] {
                        w.get(&at(&format!("{side}.{i}.{part}")))?;
                    }
                }
            }
        }
        let z = config.z_channels;
        w.expect(&at("conv2.weight"), &[1, 1, z, z])?;
        if !config.down.is_empty() {
            w.expect(&at("conv1.weight"), &[1, 1, 2 * z, 2 * z])?;
            if w.get(&at("encoder.head.2.weight"))?.ne()[3] != 2 * z {
                return Err(ModelError::Weight { name: at("encoder.head.2.weight"), detail: format!("{:?}: the encoder must give {} moments", w.get(&at("encoder.head.2.weight"))?.ne(), 2 * z) });
            }
        }
        Ok(WanVae { w, prefix: prefix.to_string(), config, circular: Circular::NONE })
    }

    fn n(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    fn conv<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        conv2d(ctx, self.w, &self.n(name), x, stride, pad)
    }

    /// `RMS_norm`: each pixel's channel vector scaled to unit length, times √C and `gamma`.
    fn norm<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let [w, h, c, n] = x.ne();
        let t = ctx.cont(ctx.permute(x, [1, 2, 0, 3])?)?; // [C, W, H, N]
        let t = ctx.rms_norm(t, 1e-12)?;
        let gamma = ctx.reshape(self.w.get(&self.n(&format!("{name}.gamma")))?, [c, 1, 1, 1])?;
        let t = ctx.mul(t, gamma)?;
        Ok(ctx.reshape(ctx.cont(ctx.permute(t, [2, 0, 1, 3])?)?, [w, h, c, n])?)
    }

    fn residual<'a>(&'a self, ctx: &'a Context, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let h = ctx.silu(self.norm(ctx, &format!("{p}.residual.0"), x)?)?;
        let h = self.conv(ctx, &format!("{p}.residual.2"), h, 1, 1)?;
        let h = ctx.silu(self.norm(ctx, &format!("{p}.residual.3"), h)?)?;
        let h = self.conv(ctx, &format!("{p}.residual.6"), h, 1, 1)?;
        let skip = format!("{p}.shortcut");
        let x = if self.w.contains(&self.n(&format!("{skip}.weight"))) { self.conv(ctx, &skip, x, 1, 0)? } else { x };
        Ok(ctx.add(x, h)?)
    }

    /// Single-head self-attention over all pixels.
    fn attention<'a>(&'a self, ctx: &'a Context, p: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let [w, h, c, n] = x.ne();
        let qkv = self.conv(ctx, &format!("{p}.to_qkv"), self.norm(ctx, &format!("{p}.norm"), x)?, 1, 0)?;
        // [W, H, 3C, N] → per part [C, W·H, N]: channels innermost, one token per pixel.
        let qkv = ctx.reshape(qkv, [w * h, 3 * c, n, 1])?;
        let part = |j: i64| -> Result<Tensor<'a>> {
            let nb = qkv.nb();
            let v = ctx.view(qkv, [w * h, c, n, 1], [nb[1], nb[2], nb[3]], (j * c) as usize * nb[1])?;
            Ok(ctx.cont(ctx.permute(v, [1, 0, 2, 3])?)?)
        };
        let compute = self.w.get(&self.n(&format!("{p}.to_qkv.weight")))?.dtype();
        let a = attention_typed(ctx, part(0)?, part(1)?, part(2)?, 1, None, compute)?; // [C, W·H, N]
        let a = ctx.reshape(ctx.cont(ctx.permute(a, [1, 0, 2, 3])?)?, [w, h, c, n])?;
        Ok(ctx.add(x, self.conv(ctx, &format!("{p}.proj"), a, 1, 0)?)?)
    }

    fn middle<'a>(&'a self, ctx: &'a Context, side: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let x = self.residual(ctx, &format!("{side}.middle.0"), x)?;
        let x = self.attention(ctx, &format!("{side}.middle.1"), x)?;
        self.residual(ctx, &format!("{side}.middle.2"), x)
    }

    fn head<'a>(&'a self, ctx: &'a Context, side: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let x = ctx.silu(self.norm(ctx, &format!("{side}.head.0"), x)?)?;
        self.conv(ctx, &format!("{side}.head.2"), x, 1, 1)
    }

    /// Latents [w, h, z, N] → images [w·8, h·8, 3, N] in [-1, 1].
    pub fn decode<'a>(&'a self, ctx: &'a Context, z: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        if z.ne()[2] != self.config.z_channels {
            return Err(ModelError::Input(format!("latent has {} channels, the Wan VAE {}", z.ne()[2], self.config.z_channels)));
        }
        let mut x = self.conv(ctx, "conv2", z, 1, 0)?;
        x = self.conv(ctx, "decoder.conv1", x, 1, 1)?;
        x = self.middle(ctx, "decoder", x)?;
        for (i, l) in self.config.up.iter().enumerate() {
            let p = format!("decoder.upsamples.{i}");
            x = match l {
                Layer::Residual => self.residual(ctx, &p, x)?,
                Layer::Resample => self.conv(ctx, &format!("{p}.resample.1"), ctx.upscale(x, 2)?, 1, 1)?,
            };
        }
        let x = self.head(ctx, "decoder", x)?;
        Ok(ctx.clamp(x, -1.0, 1.0)?)
    }

    /// Images [W, H, 3, N] in [-1, 1] → the latent distribution's mean [W/8, H/8, z, N].
    pub fn encode_mean<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        if c.down.is_empty() {
            return Err(ModelError::Config("this Wan VAE has no encoder weights".into()));
        }
        let f = c.downscale();
        let [w, h, ch, n] = image.ne();
        if ch != c.image_channels || w % f != 0 || h % f != 0 {
            return Err(ModelError::Input(format!("image {w}x{h}x{ch}: needs {} channels and sides divisible by {f}", c.image_channels)));
        }
        let mut x = self.conv(ctx, "encoder.conv1", image, 1, 1)?;
        for (i, l) in c.down.iter().enumerate() {
            let p = format!("encoder.downsamples.{i}");
            x = match l {
                Layer::Residual => self.residual(ctx, &p, x)?,
                // Zero padding right and bottom, then a stride-2 convolution.
                Layer::Resample => self.conv(ctx, &format!("{p}.resample.1"), ctx.pad_spatial(x, [(0, 1), (0, 1)])?, 2, 0)?,
            };
        }
        x = self.middle(ctx, "encoder", x)?;
        x = self.head(ctx, "encoder", x)?;
        let m = self.conv(ctx, "conv1", x, 1, 0)?;
        let [lw, lh, _, _] = m.ne();
        let nb = m.nb();
        Ok(ctx.cont(ctx.view(m, [lw, lh, c.z_channels, n], [nb[1], nb[2], nb[3]], 0)?)?)
    }
}

impl super::VaeGraph for WanVae<'_> {
    fn graph<'a>(&'a self, ctx: &'a Context, op: VaeOp, x: Tensor<'a>) -> Result<Tensor<'a>> {
        match op {
            VaeOp::Decode => self.decode(ctx, x),
            VaeOp::EncodeMean => self.encode_mean(ctx, x),
        }
    }
    fn channels(&self) -> (i64, i64) {
        (self.config.image_channels, self.config.z_channels)
    }
    fn downscale(&self) -> i64 {
        self.config.downscale()
    }
    fn circular(&self) -> Circular {
        self.circular
    }
}

/// `src` with every 5-D causal-convolution kernel [O, I, T, kh, kw] shown as its last
/// temporal tap [O, I, kh, kw]: what the kernel does to the first frame of a video (an
/// image). Other tensors pass unchanged. Block-quantized 5-D kernels cannot be sliced
/// element-wise and are refused by name.
pub fn single_frame(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let src = wan_names(src)?;
    let mut tensors = Vec::with_capacity(src.tensors().len());
    let mut index = HashMap::new();
    for t in src.tensors() {
        let mut info = t.clone();
        if let [o, i, taps, kh, kw] = t.shape[..] {
            if t.dtype.is_quantized() {
                return Err(ModelError::Weight { name: t.name.clone(), detail: format!("a {:?} 3-D convolution kernel: only unquantized Wan VAE kernels are read", t.dtype) });
            }
            info.shape = vec![o, i, kh, kw];
            info.loc = Location::Range { blob: usize::MAX, start: 0, len: t.byte_len() / taps.max(1) };
        }
        index.insert(t.name.clone(), tensors.len());
        tensors.push(info);
    }
    Ok(Box::new(SingleFrame { inner: src, tensors, index }))
}

struct SingleFrame {
    inner: Box<dyn TensorSource>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl TensorSource for SingleFrame {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn format(&self) -> crate::io::Format {
        self.inner.format()
    }
    fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
    fn read(&self, name: &str) -> std::result::Result<TensorBytes<'_>, IoError> {
        let src = self.inner.get(name).ok_or_else(|| IoError::NotFound { path: self.inner.path().to_path_buf(), tensor: name.to_string() })?;
        let bytes = self.inner.read(name)?;
        let [o, i, taps, _, _] = src.shape[..] else { return Ok(bytes) };
        // One tap's bytes, from the stored size: every 5-D kernel here is unquantized.
        let plane = bytes.len() / (o * i * taps).max(1);
        let mut out = Vec::with_capacity(o * i * plane);
        for k in 0..o * i {
            let at = (k * taps + taps - 1) * plane;
            out.extend_from_slice(&bytes[at..at + plane]);
        }
        Ok(TensorBytes::Owned(out))
    }
    fn release(&self, name: &str) {
        self.inner.release(name)
    }
    fn metadata(&self) -> &std::collections::BTreeMap<String, String> {
        self.inner.metadata()
    }
}
