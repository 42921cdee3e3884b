//! The Wan VAEs on images and videos: causal 3-D convolutions, channel RMS norms, a
//! single-head attention in the middle. Wan 2.1's (Qwen-Image's is one) compresses 8× in
//! space; Wan 2.2's (TI2V-5B: 48 latent channels) folds 2×2 patches into channels first and
//! adds each stage's input, rearranged, to its output (diffusers' `AvgDown3D` / `DupUp3D`),
//! 16× in space. Both compress 4× in time.
//!
//! Keys are the Wan release's (what ComfyUI and sd.cpp load: `encoder.conv1`,
//! `encoder.downsamples.N.residual.{0,2,3,6}`, `decoder.upsamples.N.resample.1`,
//! `encoder.middle.{0,1,2}`, `encoder.head.{0,2}`, `conv1` / `conv2` around the latent;
//! Wan 2.2's stages nest: `encoder.downsamples.I.downsamples.J`, `decoder.upsamples.I.upsamples.J`),
//! bare or under a prefix (`vae.`, `first_stage_model.`), or diffusers' (`AutoencoderKLWan`
//! / `AutoencoderKLQwenImage`: a pipeline folder's `vae/`), renamed by [`wan_names`].
//!
//! Kernels are held tap by tap ([`video_layout`]). On images (a video's first frame) a
//! causal convolution sees only its last temporal tap (the frames before are zero
//! padding) and the temporal down/upsampling convolutions do not run at all (the
//! reference skips them on the first frame), so the network runs as 2-D convolutions.
//! Videos run chunk by chunk as the reference runs them (the first frame alone, then one
//! latent frame or four video frames at a time), each causal layer continuing from the
//! last frames the chunk before left it: memory is one chunk's whatever the length.

use super::tiling::{layout, run_tiled, Direction, TileLayout, TiledError, VaeTiling};
use super::VaeOp;
use crate::ggml::{Backend, Circular, Context, GgmlError, GraphAllocator, GraphRun, Tensor};
use crate::io::{TensorInfo, TensorSource};
use crate::models::nn::{attention_typed, circular_padded};
use crate::models::{ModelError, Result, Weights};

const GIB: f64 = (1u64 << 30) as f64;

/// The weight that tells a file holds a Wan-2.1 VAE, relative to its prefix.
pub const MARKER: &str = "decoder.middle.0.residual.0.gamma";

/// The same in diffusers' names (`AutoencoderKLWan` / `AutoencoderKLQwenImage`, a
/// pipeline folder's `vae/`).
pub const DIFFUSERS_MARKER: &str = "decoder.mid_block.resnets.0.norm1.gamma";

/// A residual block's part in the release's names (`residual.N`, `shortcut`).
fn residual(rest: &str) -> String {
    const PARTS: [(&str, &str); 5] = [("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."), ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut.")];
    PARTS.iter().find_map(|(from, to)| rest.strip_prefix(from).map(|r| format!("{to}{r}"))).unwrap_or_else(|| rest.to_string())
}

/// The Wan release's name of a VAE tensor in diffusers' names (relative to the VAE), the
/// inverse of diffusers' `convert_wan_vae_to_diffusers`; `None` for a name outside it.
pub fn wan_name(d: &str) -> Option<String> {
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

/// The Wan 2.2 release's name of a VAE tensor in diffusers' names (diffusers'
/// `convert_vae_22` inverted): a stage's residual blocks (`{down,up}_blocks.I.resnets.J`) and
/// its resampler (`downsampler` / `upsampler`, after the 2 or 3 blocks) nest under
/// `downsamples.I.downsamples.J` / `upsamples.I.upsamples.J`; the rest as Wan 2.1's.
pub fn wan22_name(d: &str) -> Option<String> {
    for (side, blocks, list, sampler, after) in [("encoder", "down_blocks", "downsamples", "downsampler.", 2), ("decoder", "up_blocks", "upsamples", "upsampler.", 3)] {
        let Some(rest) = d.strip_prefix(&format!("{side}.{blocks}.")) else { continue };
        let (i, rest) = rest.split_once('.')?;
        let i: usize = i.parse().ok()?;
        if let Some(r) = rest.strip_prefix(sampler) {
            return Some(format!("{side}.{list}.{i}.{list}.{after}.{r}"));
        }
        let (j, part) = rest.strip_prefix("resnets.")?.split_once('.')?;
        return Some(format!("{side}.{list}.{i}.{list}.{j}.{}", residual(part)));
    }
    wan_name(d)
}

/// `src` in the Wan release's names when it holds the VAE in diffusers' names (under any
/// prefix, which stays); any other source as it is.
pub fn wan_names(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let Some(prefix) = crate::models::prefix_before(src.tensors().iter().map(|t| t.name.as_str()), DIFFUSERS_MARKER) else { return Ok(src) };
    // Wan 2.2's stages hold their blocks and one resampler (`resnets.J`, `upsampler`), Wan
    // 2.1's up blocks a list of resamplers (`upsamplers.0`) and its down blocks none.
    let v22 = src.tensors().iter().any(|t| ["encoder.down_blocks.0.resnets.", "decoder.up_blocks.0.upsampler."].iter().any(|m| t.name.starts_with(&format!("{prefix}{m}"))));
    let renamed = crate::io::Assembled::renamed(src, |t| {
        let rest = t.name.strip_prefix(&prefix)?;
        let mut info = t.clone();
        info.name = format!("{prefix}{}", if v22 { wan22_name(rest)? } else { wan_name(rest)? });
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
    /// Wan 2.2: the lists are stages (`downsamples.I.downsamples.J`, each but the last
    /// ending with its resampler) and each encoder stage, and each decoder stage that
    /// resamples, adds its input rearranged to its output.
    pub residual_stages: bool,
    /// Pixels per side of the patches folded into channels before the encoder and out of
    /// them after the decoder (Wan 2.2: 2).
    pub patch: i64,
}

/// Wan 2.2's latent statistics per channel (ComfyUI's `latent_formats.Wan22`, diffusers'
/// `latents_mean` / `latents_std` of the TI2V-5B pipeline).
pub const WAN22_LATENTS_MEAN: [f32; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
];
pub const WAN22_LATENTS_STD: [f32; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];

/// A layer of the encoder or decoder: its name (relative to the VAE), kind and stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub layer: Layer,
    pub stage: usize,
}

impl WanVaeConfig {
    /// Read the layer lists off the weights under `prefix`.
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a Wan VAE: no `{}`", at(MARKER))));
        }
        let layer = |p: &str| {
            if w.contains(&format!("{prefix}{p}.residual.0.gamma")) {
                Some(Layer::Residual)
            } else if w.contains(&format!("{prefix}{p}.resample.1.weight")) {
                Some(Layer::Resample)
            } else {
                None
            }
        };
        let residual_stages = w.contains(&at("decoder.upsamples.0.upsamples.0.residual.0.gamma"));
        let list = |side: &str, kind: &str| -> Result<Vec<Layer>> {
            if !residual_stages {
                return Ok((0..).map_while(|i| layer(&format!("{side}.{kind}.{i}"))).collect());
            }
            let stages: Vec<Vec<Layer>> = (0..).map(|i| (0..).map_while(|j| layer(&format!("{side}.{kind}.{i}.{kind}.{j}"))).collect::<Vec<_>>()).take_while(|s| !s.is_empty()).collect();
            // Stages split where a resampler ends one, so each but the last must end so.
            for (i, st) in stages.iter().enumerate() {
                let resamplers = st.iter().filter(|l| **l == Layer::Resample).count();
                let last = i + 1 == stages.len();
                if resamplers > 1 || (resamplers == 1 && st.last() != Some(&Layer::Resample)) || (!last && resamplers == 0) {
                    return Err(ModelError::Config(format!("Wan 2.2 VAE stage `{prefix}{side}.{kind}.{i}`: {st:?}; a stage is residual blocks then one resampler (none in the last)")));
                }
            }
            Ok(stages.concat())
        };
        // Kernels are [O·I, taps, kh, kw] ([`video_layout`]); biases give O.
        let out = |name: &str| -> Result<i64> { Ok(w.get(&at(&format!("{name}.bias")))?.ne()[0]) };
        let z_channels = w.get(&at("decoder.conv1.weight"))?.ne()[3] / out("decoder.conv1")?.max(1);
        // Wan 2.2 works on 2×2 patches of the image, its channels folded in.
        let patch = if residual_stages { 2 } else { 1 };
        let image_channels = out("decoder.head.2")? / (patch * patch);
        let down = if w.contains(&at("encoder.conv1.weight")) { list("encoder", "downsamples")? } else { Vec::new() };
        Ok(WanVaeConfig { z_channels, image_channels, down, up: list("decoder", "upsamples")?, residual_stages, patch })
    }

    /// Pixels per latent pixel on each side.
    pub fn downscale(&self) -> i64 {
        self.patch << self.up.iter().filter(|l| **l == Layer::Resample).count()
    }

    /// The encoder's (`encoder`) or decoder's layers in the order they run, each with its
    /// name and stage (a stage ends with its resampler).
    pub fn layers(&self, encoder: bool) -> Vec<Named> {
        let (side, kind, list) = if encoder { ("encoder", "downsamples", &self.down) } else { ("decoder", "upsamples", &self.up) };
        let (mut stage, mut j) = (0, 0);
        list.iter()
            .enumerate()
            .map(|(n, &layer)| {
                let name = if self.residual_stages { format!("{side}.{kind}.{stage}.{kind}.{j}") } else { format!("{side}.{kind}.{n}") };
                let named = Named { name, layer, stage };
                j += 1;
                if layer == Layer::Resample {
                    (stage, j) = (stage + 1, 0);
                }
                named
            })
            .collect()
    }
}

pub struct WanVae<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: WanVaeConfig,
    /// Seamless tiling: convolutions pad circularly on these axes.
    pub circular: Circular,
}

/// A video's frames as values: [W, H, C, T] in ggml's order (frame after frame).
#[derive(Clone, Debug, PartialEq)]
pub struct Frames {
    pub data: Vec<f32>,
    pub ne: [i64; 4],
}

/// How a graph reads the frames of its input.
enum Mode<'a, 'r> {
    /// N independent images (each a video's first frame).
    Images,
    /// The next chunk of one video: every causal layer continues from what the frames
    /// before the chunk left it (its cache), and leaves the chunk's last frames for the next.
    Chunk(Stream<'a, 'r>),
}

/// The causal layers' caches while a chunk's graph is built: in the order the layers run,
/// what the previous chunk left (none before the first chunk), and what this one leaves.
struct Stream<'a, 'r> {
    run: &'r mut GraphRun<'a>,
    /// Taken as the layers read them.
    before: &'r mut [Frames],
    next: usize,
    after: Vec<Tensor<'a>>,
    /// Whether the chunk holds the video's first frame.
    first: bool,
}

impl<'a> Stream<'a, '_> {
    /// The frames the previous chunk left for the next causal layer ([W, H, C, k]; zeros
    /// before the first chunk, as the causal padding is).
    fn history(&mut self, ne: [i64; 4]) -> Result<Tensor<'a>> {
        let slot = self.next;
        self.next += 1;
        match self.before.get_mut(slot) {
            Some(f) if f.ne == ne => Ok(self.run.input_f32(&ne, std::mem::take(&mut f.data))?),
            Some(f) => Err(ModelError::Input(format!("a VAE cache of {:?} where the layer keeps {ne:?}", f.ne))),
            None => Ok(self.run.input_f32(&ne, vec![0.0; ne.iter().product::<i64>() as usize])?),
        }
    }

    fn keep(&mut self, t: Tensor<'a>) {
        self.after.push(t);
    }
}

/// A video's frame-major planes ([T][C][H][W]: planar maps of T·C channels, `[w, h, in
/// planes, out planes]`) through `run` tile by tile, blended as image tiles are; `progress`
/// hears each finished tile.
fn video_tiles(
    data: &[f32],
    [w, h, in_planes, out_planes]: [usize; 4],
    scale: usize,
    dir: Direction,
    tiles: &TileLayout,
    progress: &mut dyn FnMut(usize, usize),
    mut run: impl FnMut(Vec<f32>, usize, usize) -> Result<Vec<f32>>,
) -> Result<Vec<f32>> {
    let (count, mut done) = (tiles.tiles.len(), 0);
    run_tiled(data, w, h, in_planes, out_planes, scale, dir, tiles, |tile, tw, th| {
        let out = run(tile, tw, th)?;
        done += 1;
        progress(done, count);
        Ok(out)
    })
    .map_err(|e| match e {
        TiledError::Tile(e) => e,
        TiledError::Shape(s) => ModelError::Input(s),
    })
}

/// The result of a chunked run under `limit` bytes (`whole`), or, where its compute buffer
/// did not fit, `tiled` with as few tiles of a `lw`×`lh` latent as fit, with what was
/// done (`verb`: decoded, encoded).
fn whole_or_tiles(whole: Result<Frames>, [lw, lh]: [usize; 2], limit: usize, verb: &str, tiled: impl FnOnce(&VaeTiling) -> Result<(Frames, TileLayout)>) -> Result<(Frames, Option<String>)> {
    match whole {
        Err(ModelError::Ggml(GgmlError::Alloc { bytes, .. })) if bytes > 0 => {
            let (out, tiles) = tiled(&VaeTiling::fitting(lw, lh, bytes, limit))?;
            Ok((out, Some(format!("whole frames need a {:.1} GiB compute buffer, over the {:.1} GiB at hand: {verb} in {tiles}", bytes as f64 / GIB, limit as f64 / GIB))))
        }
        other => other.map(|f| (f, None)),
    }
}

/// Splits `axis` (0: width, 1: height) of x [W, H, C, T] (contiguous) into `f` phases, the
/// phase outermost: [W/f, H, C·T·f] or [W, H/f, C·T·f].
fn split_axis<'a>(ctx: &'a Context, x: Tensor<'a>, axis: usize, f: i64) -> Result<Tensor<'a>> {
    let [w, h, c, t] = x.ne();
    let r = c * t;
    let y = if axis == 0 {
        ctx.cont(ctx.permute(ctx.reshape(x, [f, w / f, h, r])?, [3, 0, 1, 2])?)?
    } else {
        ctx.cont(ctx.permute(ctx.reshape(x, [w, f, h / f, r])?, [0, 3, 1, 2])?)?
    };
    let [a, b, r, f] = y.ne();
    Ok(ctx.reshape(y, [a, b, r * f, 1])?)
}

/// The inverse of [`split_axis`]: x [W, H, R·f] whose outermost `f` phases interleave back
/// into `axis`.
fn unsplit_axis<'a>(ctx: &'a Context, x: Tensor<'a>, axis: usize, f: i64) -> Result<Tensor<'a>> {
    let [w, h, c, t] = x.ne();
    let r = c * t / f;
    let v = ctx.reshape(x, [w, h, r, f])?;
    Ok(if axis == 0 {
        ctx.reshape(ctx.cont(ctx.permute(v, [1, 2, 3, 0])?)?, [f * w, h, r, 1])?
    } else {
        ctx.reshape(ctx.cont(ctx.permute(v, [0, 2, 3, 1])?)?, [w, f * h, r, 1])?
    })
}

/// Folds blocks of `ft` frames × `fs`×`fs` pixels of x [W, H, C, T] into channels:
/// [W/fs, H/fs, F·C, T/ft] with F = ft·fs², input channel c at c·F + it·fs² + s, where the
/// pixel phase s is ih·fs + iw (diffusers' `AvgDown3D`) or, `w_major`, iw·fs + ih (Wan
/// 2.2's patchify, `b c f (h q) (w r) -> b (c r q) f h w`).
fn fold<'a>(ctx: &'a Context, x: Tensor<'a>, ft: i64, fs: i64, w_major: bool) -> Result<Tensor<'a>> {
    let [w, h, c, t] = x.ne();
    if w % fs != 0 || h % fs != 0 || t % ft != 0 {
        return Err(ModelError::Input(format!("{w}x{h} pixels of {t} frames cannot fold into {fs}x{fs}x{ft} blocks")));
    }
    let mut y = ctx.cont(x)?;
    if fs > 1 {
        // The later split's phase ends outermost, the major one.
        let (first, second) = if w_major { (1, 0) } else { (0, 1) };
        y = split_axis(ctx, split_axis(ctx, y, first, fs)?, second, fs)?;
    }
    let (w2, h2, s, tp) = (w / fs, h / fs, fs * fs, t / ft);
    let a = w2 * h2;
    // [A, C, T, S] → [A, S, C, T]: the phases inside each channel.
    let y = ctx.cont(ctx.permute(ctx.reshape(y, [a, c, t, s])?, [0, 2, 3, 1])?)?;
    // [A·S, C, ft, T'] → [A·S, ft, C, T']: the frame phase above the pixel phase.
    let y = if ft > 1 { ctx.cont(ctx.permute(ctx.reshape(y, [a * s, c, ft, tp])?, [0, 2, 1, 3])?)? } else { y };
    Ok(ctx.reshape(y, [w2, h2, s * ft * c, tp])?)
}

/// The inverse of [`fold`]: x [W, H, F·C, T] → [W·fs, H·fs, C, T·ft].
fn unfold<'a>(ctx: &'a Context, x: Tensor<'a>, ft: i64, fs: i64, w_major: bool) -> Result<Tensor<'a>> {
    let [w2, h2, fc, tp] = x.ne();
    let (s, a) = (fs * fs, w2 * h2);
    if fc % (s * ft) != 0 {
        return Err(ModelError::Input(format!("{fc} channels do not unfold into {fs}x{fs}x{ft} blocks")));
    }
    let c = fc / (s * ft);
    let t = tp * ft;
    let y = ctx.cont(x)?;
    let y = if ft > 1 { ctx.cont(ctx.permute(ctx.reshape(y, [a * s, ft, c, tp])?, [0, 2, 1, 3])?)? } else { y };
    let mut y = ctx.cont(ctx.permute(ctx.reshape(y, [a, s, c, t])?, [0, 3, 1, 2])?)?;
    if fs > 1 {
        let (first, second) = if w_major { (1, 0) } else { (0, 1) };
        y = ctx.reshape(y, [w2, h2, c * t * s, 1])?;
        y = unsplit_axis(ctx, unsplit_axis(ctx, y, second, fs)?, first, fs)?;
    }
    Ok(ctx.reshape(y, [w2 * fs, h2 * fs, c, t])?)
}

/// Wan 2.2's encoder shortcut (diffusers' `AvgDown3D`): x [W, H, C, T] with its blocks of
/// `ft` frames × `fs`² pixels folded into channels, then each run of consecutive channels
/// averaged to `out` channels. A video whose frame count is not a multiple of `ft` gets zero
/// frames in front (so its first frame averages with zeros); images are each a video's first frame.
fn avg_down<'a>(ctx: &'a Context, x: Tensor<'a>, ft: i64, fs: i64, out: i64, mode: &Mode<'a, '_>) -> Result<Tensor<'a>> {
    let [w, h, c, t] = x.ne();
    let x = match mode {
        Mode::Images if ft > 1 => ctx.reshape(ctx.pad(ctx.reshape(ctx.cont(x)?, [w * h * c, 1, t, 1])?, [(0, 0), (ft as i32 - 1, 0), (0, 0), (0, 0)])?, [w, h, c, t * ft])?,
        Mode::Chunk(_) if t % ft != 0 => ctx.pad(ctx.cont(x)?, [(0, 0), (0, 0), (0, 0), ((ft - t % ft) as i32, 0)])?,
        _ => x,
    };
    let y = fold(ctx, x, ft, fs, false)?;
    let [w2, h2, fc, tp] = y.ne();
    if out < 1 || fc % out != 0 {
        return Err(ModelError::Input(format!("a Wan 2.2 stage from {c} to {out} channels: {fc} folded channels do not average into {out}")));
    }
    let g = fc / out;
    let y = ctx.reshape(y, [w2 * h2, g, out, tp])?;
    let nb = y.nb();
    let mut sum = ctx.cont(ctx.view(y, [w2 * h2, 1, out, tp], [nb[1], nb[2], nb[3]], 0)?)?;
    for j in 1..g {
        sum = ctx.add(sum, ctx.cont(ctx.view(y, [w2 * h2, 1, out, tp], [nb[1], nb[2], nb[3]], j as usize * nb[1])?)?)?;
    }
    Ok(ctx.reshape(ctx.scale(sum, 1.0 / g as f32)?, [w2, h2, out, tp])?)
}

/// Wan 2.2's decoder shortcut (diffusers' `DupUp3D`): each channel of x [W, H, C, T]
/// repeated and unfolded into blocks of `ft` frames × `fs`² pixels of `out` channels. The
/// video's first frame keeps only the last of its `ft` frames (as the upsampling path does).
fn dup_up<'a>(ctx: &'a Context, x: Tensor<'a>, ft: i64, fs: i64, out: i64, mode: &Mode<'a, '_>) -> Result<Tensor<'a>> {
    let [w, h, c, t] = x.ne();
    let f = ft * fs * fs;
    if out < 1 || (out * f) % c != 0 {
        return Err(ModelError::Input(format!("a Wan 2.2 stage from {c} to {out} channels: {c} channels do not spread over {out}×{f}")));
    }
    let r = out * f / c;
    let v = ctx.repeat(ctx.reshape(ctx.cont(x)?, [w * h, 1, c, t])?, [w * h, r, c, t])?;
    let y = unfold(ctx, ctx.reshape(v, [w, h, out * f, t])?, ft, fs, false)?; // [W·fs, H·fs, out, T·ft]
    if ft == 1 {
        return Ok(y);
    }
    let [yw, yh, yc, yt] = y.ne();
    match mode {
        Mode::Images => {
            let v = ctx.reshape(y, [yw * yh * yc, ft, t, 1])?;
            let nb = v.nb();
            let last = ctx.view(v, [yw * yh * yc, 1, t, 1], [nb[1], nb[2], nb[3]], (ft - 1) as usize * nb[1])?;
            Ok(ctx.reshape(ctx.cont(last)?, [yw, yh, yc, t])?)
        }
        Mode::Chunk(s) if s.first => Ok(ctx.cont(frames(ctx, y, ft - 1, yt - (ft - 1))?)?),
        Mode::Chunk(_) => Ok(y),
    }
}

/// Frames `from..from + n` of x [W, H, C, T] (contiguous: frames are outermost).
fn frames<'a>(ctx: &'a Context, x: Tensor<'a>, from: i64, n: i64) -> Result<Tensor<'a>> {
    let [w, h, c, _] = x.ne();
    let nb = x.nb();
    Ok(ctx.view(x, [w, h, c, n], [nb[1], nb[2], nb[3]], from as usize * nb[3])?)
}

impl<'w> WanVae<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: WanVaeConfig) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if config.up.is_empty() {
            return Err(ModelError::Config(format!("a Wan VAE without decoder stages: no `{}`", at("decoder.upsamples.0.residual.0.gamma"))));
        }
        let vae = WanVae { w, prefix: prefix.to_string(), config, circular: Circular::NONE };
        for encoder in [false, true] {
            for l in vae.config.layers(encoder).iter().filter(|l| l.layer == Layer::Residual) {
                for part in ["residual.2", "residual.6"] {
                    vae.kernel_shape(&format!("{}.{part}", l.name))?;
                }
                w.get(&at(&format!("{}.residual.3.gamma", l.name)))?;
            }
        }
        let z = vae.config.z_channels;
        if vae.kernel_shape("conv2")? != (1, 1, 1, z, z) {
            return Err(ModelError::Weight { name: at("conv2.weight"), detail: format!("{:?}: a 1×1×1 convolution over {z} latent channels expected", vae.kernel_shape("conv2")?) });
        }
        if !vae.config.down.is_empty() {
            if vae.kernel_shape("conv1")? != (1, 1, 1, 2 * z, 2 * z) {
                return Err(ModelError::Weight { name: at("conv1.weight"), detail: format!("{:?}: a 1×1×1 convolution over {} moments expected", vae.kernel_shape("conv1")?, 2 * z) });
            }
            if vae.kernel_shape("encoder.head.2")?.4 != 2 * z {
                return Err(ModelError::Weight { name: at("encoder.head.2.weight"), detail: format!("the encoder must give {} moments", 2 * z) });
            }
        }
        Ok(vae)
    }

    fn n(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// Whether the resampler `layer` also resamples in time (`upsample3d` / `downsample3d`).
    fn has_time_conv(&self, layer: &str) -> bool {
        self.w.contains(&self.n(&format!("{layer}.time_conv.weight")))
    }

    /// A convolution's (temporal taps, kernel height, width, in, out channels): its kernel
    /// is held as [O·I, taps, kh, kw] (see [`video_layout`]), its bias says O.
    fn kernel_shape(&self, name: &str) -> Result<(i64, i64, i64, i64, i64)> {
        let [kw, kh, taps, oi] = self.w.get(&self.n(&format!("{name}.weight")))?.ne();
        let o = self.w.get(&self.n(&format!("{name}.bias")))?.ne()[0];
        if o < 1 || oi % o != 0 {
            return Err(ModelError::Weight { name: self.n(&format!("{name}.weight")), detail: format!("{oi} kernel planes for {o} output channels") });
        }
        Ok((taps, kh, kw, oi / o, o))
    }

    /// Temporal tap `k` of a convolution as a 2-D kernel [kw, kh, I, O].
    fn tap<'a>(&'a self, ctx: &'a Context, name: &str, k: i64) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let (taps, kh, kw, i, o) = self.kernel_shape(name)?;
        let weight = self.w.get(&self.n(&format!("{name}.weight")))?;
        if taps == 1 {
            return Ok(ctx.reshape(weight, [kw, kh, i, o])?);
        }
        let nb = weight.nb();
        Ok(ctx.cont(ctx.view(weight, [kw, kh, i, o], [nb[1], nb[3], nb[3] * i as usize], k as usize * nb[2])?)?)
    }

    fn bias<'a>(&'a self, ctx: &'a Context, name: &str, y: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let b = self.w.get(&self.n(&format!("{name}.bias")))?;
        Ok(ctx.add(y, ctx.reshape(b, [1, 1, b.ne()[0], 1])?)?)
    }

    /// A 2-D convolution with tap `k` of `name`'s kernel, no bias.
    fn conv_tap<'a>(&'a self, ctx: &'a Context, name: &str, k: i64, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let (x, pad) = circular_padded(ctx, x, pad)?;
        Ok(ctx.conv_2d(self.tap(ctx, name, k)?, x, (stride, stride), pad, (1, 1))?)
    }

    /// A spatial convolution frame by frame (a 2-D kernel, or a 1×1×1 one).
    fn conv<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let y = self.conv_tap(ctx, name, 0, x, stride, pad)?;
        self.bias(ctx, name, y)
    }

    /// A causal 3-D convolution (`CausalConv3d`: zero frames before the first, none
    /// after): on images its last tap, on a chunk every tap over the frames the previous
    /// chunk left and the chunk's own.
    fn causal<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let (taps, kh, ..) = self.kernel_shape(name)?;
        let pad = (kh / 2) as i32;
        let s = match mode {
            Mode::Chunk(s) if taps > 1 => s,
            _ => return self.bias(ctx, name, self.conv_tap(ctx, name, taps - 1, x, 1, pad)?),
        };
        let [w, h, c, t] = x.ne();
        let xp = ctx.concat(s.history([w, h, c, taps - 1])?, x, 3)?;
        s.keep(ctx.cont(frames(ctx, xp, t, taps - 1)?)?);
        let mut y: Option<Tensor<'a>> = None;
        for k in 0..taps {
            let part = self.conv_tap(ctx, name, k, ctx.cont(frames(ctx, xp, k, t)?)?, 1, pad)?;
            y = Some(match y {
                Some(y) => ctx.add(y, part)?,
                None => part,
            });
        }
        self.bias(ctx, name, y.expect("a kernel has taps"))
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

    fn residual<'a>(&'a self, ctx: &'a Context, p: &str, x: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let h = ctx.silu(self.norm(ctx, &format!("{p}.residual.0"), x)?)?;
        let h = self.causal(ctx, &format!("{p}.residual.2"), h, mode)?;
        let h = ctx.silu(self.norm(ctx, &format!("{p}.residual.3"), h)?)?;
        let h = self.causal(ctx, &format!("{p}.residual.6"), h, mode)?;
        let skip = format!("{p}.shortcut");
        let x = if self.w.contains(&self.n(&format!("{skip}.weight"))) { self.conv(ctx, &skip, x, 1, 0)? } else { x };
        Ok(ctx.add(x, h)?)
    }

    /// Single-head self-attention over each frame's pixels.
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

    fn middle<'a>(&'a self, ctx: &'a Context, side: &str, x: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let x = self.residual(ctx, &format!("{side}.middle.0"), x, mode)?;
        let x = self.attention(ctx, &format!("{side}.middle.1"), x)?;
        self.residual(ctx, &format!("{side}.middle.2"), x, mode)
    }

    fn head<'a>(&'a self, ctx: &'a Context, side: &str, x: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let x = ctx.silu(self.norm(ctx, &format!("{side}.head.0"), x)?)?;
        self.causal(ctx, &format!("{side}.head.2"), x, mode)
    }

    /// The decoder's temporal upsampling (`upsample3d`'s `time_conv`, before its spatial
    /// step): every frame after the video's first becomes two (the causal convolution's
    /// two channel halves, earlier first); the first frame passes alone and is never
    /// another frame's context. Images pass unchanged.
    fn time_up<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let first = match mode {
            Mode::Images => return Ok(x),
            Mode::Chunk(s) => s.first,
        };
        let [w, h, c, t] = x.ne();
        // The slot is used whatever the chunk holds, so chunks number their caches alike.
        let rest = if first { t - 1 } else { t };
        if rest == 0 {
            if let Mode::Chunk(s) = mode {
                let hist = s.history([w, h, c, 2])?;
                s.keep(hist);
            }
            return Ok(x);
        }
        let y = self.causal(ctx, name, frames(ctx, x, t - rest, rest)?, mode)?; // [W, H, 2C, rest]
        let y = ctx.reshape(ctx.cont(y)?, [w, h, c, 2 * rest])?;
        Ok(if first { ctx.concat(ctx.cont(frames(ctx, x, 0, 1)?)?, y, 3)? } else { y })
    }

    /// The encoder's temporal downsampling (`downsample3d`'s `time_conv`, after its spatial
    /// step): the video's first frame passes; then frames 1–2, 3–4, … become one each, a
    /// stride-2 convolution over them and the frame before (no padding).
    fn time_down<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let s = match mode {
            Mode::Images => return Ok(x),
            Mode::Chunk(s) => s,
        };
        let [w, h, c, t] = x.ne();
        // The frame before the chunk (the video's first frame is its own following frames'
        // context: it is in the chunk).
        let input = if s.first { x } else { ctx.concat(s.history([w, h, c, 1])?, x, 3)? };
        if s.first {
            s.next += 1;
        }
        let n = input.ne()[3];
        s.keep(ctx.cont(frames(ctx, input, n - 1, 1)?)?);
        let outs = (n - 1) / 2;
        let mut y: Option<Tensor<'a>> = None;
        if outs > 0 {
            let nb = input.nb();
            for k in 0..3 {
                let v = ctx.cont(ctx.view(input, [w, h, c, outs], [nb[1], nb[2], 2 * nb[3]], k as usize * nb[3])?)?;
                let part = self.conv_tap(ctx, name, k, v, 1, 0)?;
                y = Some(match y {
                    Some(y) => ctx.add(y, part)?,
                    None => part,
                });
            }
        }
        let y = y.map(|y| self.bias(ctx, name, y)).transpose()?;
        Ok(match (s.first, y) {
            (true, Some(y)) => ctx.concat(ctx.cont(frames(ctx, x, 0, 1)?)?, y, 3)?,
            (true, None) => ctx.cont(frames(ctx, x, 0, 1)?)?,
            (false, Some(y)) => y,
            (false, None) => return Err(ModelError::Input(format!("a VAE encoder chunk of {t} frames: chunks after the first hold whole pairs"))),
        })
    }

    fn decoder<'a>(&'a self, ctx: &'a Context, z: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        if z.ne()[2] != self.config.z_channels {
            return Err(ModelError::Input(format!("latent has {} channels, the Wan VAE {}", z.ne()[2], self.config.z_channels)));
        }
        let mut x = self.conv(ctx, "conv2", z, 1, 0)?;
        x = self.causal(ctx, "decoder.conv1", x, mode)?;
        x = self.middle(ctx, "decoder", x, mode)?;
        let layers = self.config.layers(false);
        for stage in layers.chunk_by(|a, b| a.stage == b.stage) {
            let input = x;
            for l in stage {
                let p = &l.name;
                x = match l.layer {
                    Layer::Residual => self.residual(ctx, p, x, mode)?,
                    Layer::Resample => {
                        if self.has_time_conv(p) {
                            x = self.time_up(ctx, &format!("{p}.time_conv"), x, mode)?;
                        }
                        self.conv(ctx, &format!("{p}.resample.1"), ctx.upscale(x, 2)?, 1, 1)?
                    }
                };
            }
            // Wan 2.2: a resampling stage's input, its channels spread over the new frames
            // and pixels (`DupUp3D`), added to its output.
            if let (true, Some(last)) = (self.config.residual_stages, stage.last().filter(|l| l.layer == Layer::Resample)) {
                let ft = if self.has_time_conv(&last.name) { 2 } else { 1 };
                x = ctx.add(x, dup_up(ctx, input, ft, 2, x.ne()[2], mode)?)?;
            }
        }
        let x = self.head(ctx, "decoder", x, mode)?;
        let x = if self.config.patch > 1 { unfold(ctx, x, 1, self.config.patch, true)? } else { x };
        Ok(ctx.clamp(x, -1.0, 1.0)?)
    }

    fn encoder<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>, mode: &mut Mode<'a, '_>) -> Result<Tensor<'a>>
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
        let image = if c.patch > 1 { fold(ctx, image, 1, c.patch, true)? } else { image };
        let mut x = self.causal(ctx, "encoder.conv1", image, mode)?;
        let layers = c.layers(true);
        for stage in layers.chunk_by(|a, b| a.stage == b.stage) {
            let input = x;
            for l in stage {
                let p = &l.name;
                x = match l.layer {
                    Layer::Residual => self.residual(ctx, p, x, mode)?,
                    // Zero padding right and bottom, then a stride-2 convolution.
                    Layer::Resample => {
                        let y = self.conv(ctx, &format!("{p}.resample.1"), ctx.pad_spatial(x, [(0, 1), (0, 1)])?, 2, 0)?;
                        if self.has_time_conv(p) {
                            self.time_down(ctx, &format!("{p}.time_conv"), y, mode)?
                        } else {
                            y
                        }
                    }
                };
            }
            // Wan 2.2: every stage's input, its frames and pixels folded into channels and
            // averaged down to the stage's width (`AvgDown3D`), added to its output.
            if c.residual_stages {
                let resample = stage.last().filter(|l| l.layer == Layer::Resample);
                let ft = if resample.is_some_and(|l| self.has_time_conv(&l.name)) { 2 } else { 1 };
                let fs = if resample.is_some() { 2 } else { 1 };
                x = ctx.add(x, avg_down(ctx, input, ft, fs, x.ne()[2], mode)?)?;
            }
        }
        x = self.middle(ctx, "encoder", x, mode)?;
        x = self.head(ctx, "encoder", x, mode)?;
        let m = self.conv(ctx, "conv1", x, 1, 0)?;
        let [lw, lh, _, t] = m.ne();
        let nb = m.nb();
        let _ = n;
        Ok(ctx.cont(ctx.view(m, [lw, lh, c.z_channels, t], [nb[1], nb[2], nb[3]], 0)?)?)
    }

    /// Latents [w, h, z, N] → images [w·8, h·8, 3, N] in [-1, 1], each a video's first frame.
    pub fn decode<'a>(&'a self, ctx: &'a Context, z: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        self.decoder(ctx, z, &mut Mode::Images)
    }

    /// Images [W, H, 3, N] in [-1, 1] → the latent distribution's mean [W/8, H/8, z, N].
    pub fn encode_mean<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        self.encoder(ctx, image, &mut Mode::Images)
    }

    /// A video latent [w, h, z, T] (T ≥ 1 latent frames) decoded into its 4·(T − 1) + 1
    /// frames [w·8, h·8, 3, ·] in [-1, 1], one latent frame per graph (as the reference
    /// decodes), so memory stays that of one chunk whatever the length; `progress` hears
    /// each finished latent frame.
    pub fn decode_video(&self, backend: &Backend, latent: &Frames, progress: &mut dyn FnMut(usize, usize)) -> Result<Frames> {
        self.decode_chunks(backend, latent, None, progress)
    }

    fn decode_chunks(&self, backend: &Backend, latent: &Frames, limit: Option<usize>, progress: &mut dyn FnMut(usize, usize)) -> Result<Frames> {
        let [w, h, z, t] = latent.ne;
        if z != self.config.z_channels || t < 1 || w < 1 || h < 1 || latent.data.len() as i64 != w * h * z * t {
            return Err(ModelError::Input(format!("a video latent of {} values as {:?} for a Wan VAE of {} channels", latent.data.len(), latent.ne, self.config.z_channels)));
        }
        let plane = (w * h * z) as usize;
        let chunks: Vec<(usize, usize)> = (0..t as usize).map(|i| (i, 1)).collect();
        self.stream(backend, &chunks, |i, _| Frames { data: latent.data[i * plane..(i + 1) * plane].to_vec(), ne: [w, h, z, 1] }, true, limit, progress)
    }

    /// [`WanVae::decode_video`] within `limit` bytes of compute memory: whole when a
    /// chunk's graph (its activations and the causal caches it carries, which grow with the
    /// frame's area: ~25 GB at 832×480 in f32) fits, else in as few spatial tiles as fit,
    /// a quarter of a tile overlapping its neighbour — the tiled decode ComfyUI falls back
    /// to when a whole one runs out of memory. Returns the tiles used, if any.
    pub fn decode_video_within(&self, backend: &Backend, latent: &Frames, limit: usize, progress: &mut dyn FnMut(usize, usize)) -> Result<(Frames, Option<String>)> {
        let whole = self.decode_chunks(backend, latent, Some(limit), progress);
        whole_or_tiles(whole, [latent.ne[0] as usize, latent.ne[1] as usize], limit, "decoded", |tiling| self.decode_tiles(backend, latent, tiling, progress))
    }

    /// [`WanVae::decode_video`] in spatial tiles laid out and blended as image tiles are
    /// (`tiling`'s size and overlap, smootherstep ramps): each tile is a whole video through
    /// the decoder with its own causal caches, so memory is one tile's latent frame however
    /// large the video. One tile is the untiled decode; `progress` hears each finished tile.
    pub fn decode_video_tiled(&self, backend: &Backend, latent: &Frames, tiling: &VaeTiling, progress: &mut dyn FnMut(usize, usize)) -> Result<Frames> {
        Ok(self.decode_tiles(backend, latent, tiling, progress)?.0)
    }

    /// [`WanVae::decode_video_tiled`] and the tiles it used.
    fn decode_tiles(&self, backend: &Backend, latent: &Frames, tiling: &VaeTiling, progress: &mut dyn FnMut(usize, usize)) -> Result<(Frames, TileLayout)> {
        let [w, h, z, t] = latent.ne;
        if z != self.config.z_channels || t < 1 || w < 1 || h < 1 || latent.data.len() as i64 != w * h * z * t {
            return Err(ModelError::Input(format!("a video latent of {} values as {:?} for a Wan VAE of {} channels", latent.data.len(), latent.ne, self.config.z_channels)));
        }
        let (lw, lh) = (w as usize, h as usize);
        let (tw, th, overlap) = tiling.tile_sizes(lw, lh, 1.0);
        let tiles = layout(lw, lh, tw, th, overlap);
        if tiles.tiles.len() <= 1 {
            return Ok((self.decode_video(backend, latent, progress)?, tiles));
        }
        // Frames double at each temporal upsampling after the first.
        let doublings = self.config.layers(false).iter().filter(|l| l.layer == Layer::Resample && self.has_time_conv(&l.name)).count();
        let frames = ((t as usize - 1) << doublings) + 1;
        let ic = self.config.image_channels as usize;
        let out = video_tiles(&latent.data, [lw, lh, (z * t) as usize, ic * frames], self.config.downscale() as usize, Direction::Upscale, &tiles, progress, |tile, tw, th| {
            Ok(self.decode_video(backend, &Frames { data: tile, ne: [tw as i64, th as i64, z, t] }, &mut |_, _| {})?.data)
        })?;
        let f = self.config.downscale();
        Ok((Frames { data: out, ne: [w * f, h * f, ic as i64, frames as i64] }, tiles))
    }

    /// Video frames [W, H, 3, F] in [-1, 1] (F = 4·k + 1; frames past the last whole group
    /// of 4 are dropped, as the reference drops them) encoded into the latent
    /// distribution's mean [W/8, H/8, z, k + 1]: the first frame alone, then 4 at a time.
    pub fn encode_video(&self, backend: &Backend, video: &Frames, progress: &mut dyn FnMut(usize, usize)) -> Result<Frames> {
        self.encode_chunks(backend, video, None, progress)
    }

    /// [`WanVae::encode_video`] within `limit` bytes of compute memory, whole or in as few
    /// spatial tiles as fit, as [`WanVae::decode_video_within`] decodes.
    pub fn encode_video_within(&self, backend: &Backend, video: &Frames, limit: usize, progress: &mut dyn FnMut(usize, usize)) -> Result<(Frames, Option<String>)> {
        let whole = self.encode_chunks(backend, video, Some(limit), progress);
        let f = self.config.downscale() as usize;
        whole_or_tiles(whole, [video.ne[0] as usize / f, video.ne[1] as usize / f], limit, "encoded", |tiling| self.encode_video_tiled(backend, video, tiling, progress))
    }

    /// [`WanVae::encode_video`] in spatial tiles (laid out on the latent side, blended as
    /// image tiles are), each tile a whole video through the encoder with its own caches.
    pub fn encode_video_tiled(&self, backend: &Backend, video: &Frames, tiling: &VaeTiling, progress: &mut dyn FnMut(usize, usize)) -> Result<(Frames, TileLayout)> {
        let [w, h, c, f] = video.ne;
        let down = self.config.downscale();
        if c != self.config.image_channels || f < 1 || w % down != 0 || h % down != 0 || video.data.len() as i64 != w * h * c * f {
            return Err(ModelError::Input(format!("a video of {} values as {:?} for a Wan VAE reading {} channels, sides divisible by {down}", video.data.len(), video.ne, self.config.image_channels)));
        }
        let (lw, lh) = ((w / down) as usize, (h / down) as usize);
        let (tw, th, overlap) = tiling.tile_sizes(lw, lh, 1.0);
        let tiles = layout(lw, lh, tw, th, overlap);
        // The frames the encoder reads (the rest of a last group of 4 is dropped).
        let f = 1 + (f - 1) / 4 * 4;
        let video = Frames { data: video.data[..(w * h * c * f) as usize].to_vec(), ne: [w, h, c, f] };
        let (t, z) = ((f - 1) / 4 + 1, self.config.z_channels);
        let out = video_tiles(&video.data, [w as usize, h as usize, (c * f) as usize, (z * t) as usize], down as usize, Direction::Downscale, &tiles, progress, |tile, tw, th| {
            Ok(self.encode_video(backend, &Frames { data: tile, ne: [tw as i64, th as i64, c, f] }, &mut |_, _| {})?.data)
        })?;
        Ok((Frames { data: out, ne: [lw as i64, lh as i64, z, t] }, tiles))
    }

    fn encode_chunks(&self, backend: &Backend, video: &Frames, limit: Option<usize>, progress: &mut dyn FnMut(usize, usize)) -> Result<Frames> {
        let [w, h, c, f] = video.ne;
        if c != self.config.image_channels || f < 1 || video.data.len() as i64 != w * h * c * f {
            return Err(ModelError::Input(format!("a video of {} values as {:?} for a Wan VAE reading {} channels", video.data.len(), video.ne, self.config.image_channels)));
        }
        let plane = (w * h * c) as usize;
        let groups = (f as usize - 1) / 4;
        let chunks: Vec<(usize, usize)> = std::iter::once((0, 1)).chain((0..groups).map(|g| (1 + 4 * g, 4))).collect();
        self.stream(backend, &chunks, |from, n| Frames { data: video.data[from * plane..(from + n) * plane].to_vec(), ne: [w, h, c, n as i64] }, false, limit, progress)
    }

    /// Runs the decoder (`decode`) or the encoder over `chunks` (first frame, count) of
    /// one video, each chunk one graph fed the caches the previous one left; a compute
    /// buffer over `limit` fails as an allocation failure before that chunk computes.
    #[allow(clippy::too_many_arguments)]
    fn stream(&self, backend: &Backend, chunks: &[(usize, usize)], input: impl Fn(usize, usize) -> Frames, decode: bool, limit: Option<usize>, progress: &mut dyn FnMut(usize, usize)) -> Result<Frames> {
        let mut caches: Vec<Frames> = Vec::new();
        let mut out: Vec<f32> = Vec::new();
        let mut out_ne = [0i64; 4];
        let mut alloc = GraphAllocator::new(backend)?;
        let graph_size = 8192;
        for (k, &(from, n)) in chunks.iter().enumerate() {
            let x = input(from, n);
            let ctx = Context::new(graph_size * 4, graph_size)?;
            ctx.set_circular(self.circular);
            let mut run = GraphRun::new(&ctx);
            let xt = run.input_f32(&x.ne, x.data)?;
            let (y, after) = {
                let mut mode = Mode::Chunk(Stream { run: &mut run, before: &mut caches, next: 0, after: Vec::new(), first: k == 0 });
                let y = if decode { self.decoder(&ctx, xt, &mut mode)? } else { self.encoder(&ctx, xt, &mut mode)? };
                let Mode::Chunk(s) = mode else { unreachable!("a chunk stays a chunk") };
                (y, s.after)
            };
            let mut wanted = vec![y];
            wanted.extend(&after);
            // Besides the compute buffer, the caches are held on the host while the chunk
            // computes (the ones read in, then the ones read out): the limit leaves them room.
            let host = 2 * after.iter().map(|t| t.n_bytes()).sum::<usize>();
            alloc.set_limit(limit.map(|l| l.saturating_sub(host)));
            let mut values = run.compute_with(backend, &mut alloc, &wanted, graph_size).map_err(|e| match e {
                GgmlError::Alloc { what, bytes, backend } if bytes > 0 => GgmlError::Alloc { what, bytes: bytes + host, backend },
                e => e,
            })?;
            let ys = values.remove(0);
            caches = after.iter().zip(values).map(|(t, data)| Frames { data, ne: t.ne() }).collect();
            let [yw, yh, yc, yt] = y.ne();
            if k > 0 && [yw, yh, yc] != out_ne[..3] {
                return Err(ModelError::Input(format!("VAE chunks of different sizes: {:?} after {out_ne:?}", y.ne())));
            }
            out_ne = [yw, yh, yc, out_ne[3] + yt];
            out.extend(ys);
            progress(k + 1, chunks.len());
        }
        Ok(Frames { data: out, ne: out_ne })
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

/// `src` (the release's names, or diffusers' shown in them by [`wan_names`]) with every
/// convolution kernel held as [O·I, taps, kh, kw]: a 3-D kernel [O, I, T, kh, kw] merged on
/// its first two axes, a 2-D one [O, I, kh, kw] given one temporal tap, so each temporal
/// tap is a strided view of one tensor (ggml's tensors have four axes). Block-quantized
/// 3-D kernels cannot be viewed tap by tap and are refused by name.
pub fn video_layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let src = wan_names(src)?;
    if let Some(t) = src.tensors().iter().find(|t| t.shape.len() == 5 && t.dtype.is_quantized()) {
        return Err(ModelError::Weight { name: t.name.clone(), detail: format!("a {:?} 3-D convolution kernel: only unquantized Wan VAE kernels are read", t.dtype) });
    }
    let renamed = crate::io::Assembled::renamed(src, |t: &TensorInfo| {
        let mut info = t.clone();
        if t.name.ends_with(".weight") {
            match t.shape[..] {
                [o, i, taps, kh, kw] => info.shape = vec![o * i, taps, kh, kw],
                [o, i, kh, kw] => info.shape = vec![o * i, 1, kh, kw],
                _ => {}
            }
        }
        Some(info)
    })
    .map_err(|name| ModelError::Config(format!("two tensors named `{name}`")))?;
    Ok(Box::new(renamed))
}
