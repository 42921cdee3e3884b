//! The KL autoencoder (`AutoencoderKL`) of Stable Diffusion 1.x/2.x/XL (4 latent channels)
//! and of FLUX and SD3 (16, no quant convolutions), in the LDM single-file key layout
//! (`encoder.down.N.block.M`, `decoder.up.N.block.M`, `mid.attn_1.{q,k,v,proj_out}`,
//! `quant_conv`, `post_quant_conv`); with its tiled runs and TAESD, the folder the image
//! families share.
//!
//! Images are [W, H, 3, N] in [-1, 1]; latents are [w, h, z, N], unscaled (the caller
//! applies the model family's scale factor).

pub mod taesd;
pub mod tiling;
pub mod wan;

use crate::models::nn::{attention_typed, conv2d, group_norm};
use self::tiling::{Direction, TiledError, VaeTiling};
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Backend, Circular, Context, GType, GgmlError, GraphAllocator, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub struct VaeConfig {
    /// Output channels of each resolution level, outermost first ([128, 256, 512, 512]).
    pub channels: Vec<i64>,
    pub num_res_blocks: usize,
    pub z_channels: i64,
    pub image_channels: i64,
    pub has_encoder: bool,
    pub has_quant_convs: bool,
}

const GROUPS: i32 = 32;
const EPS: f32 = 1e-6;

/// Conv weight `{name}.weight` is [k, k, in, out] in ggml order.
fn conv_dims(w: &Weights, name: &str) -> Result<(i64, i64)> {
    let ne = w.get(&format!("{name}.weight"))?.ne();
    Ok((ne[2], ne[3]))
}

impl VaeConfig {
    /// Read levels, widths and block counts off the decoder weights under `prefix`
    /// (e.g. `first_stage_model`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let p = |s: &str| format!("{prefix}.{s}");
        let levels = (0..).take_while(|i| w.contains(&p(&format!("decoder.up.{i}.block.0.conv1.weight")))).count();
        if levels == 0 {
            return Err(ModelError::Config(format!("no VAE decoder under `{prefix}`")));
        }
        let blocks = (0..).take_while(|j| w.contains(&p(&format!("decoder.up.0.block.{j}.conv1.weight")))).count();
        if blocks < 2 {
            return Err(ModelError::Config(format!("VAE decoder level 0 under `{prefix}` has {blocks} blocks")));
        }
        let channels = (0..levels)
            .map(|i| conv_dims(w, &p(&format!("decoder.up.{i}.block.0.conv1"))).map(|d| d.1))
            .collect::<Result<Vec<_>>>()?;
        let (z_channels, _) = conv_dims(w, &p("decoder.conv_in"))?;
        let (_, image_channels) = conv_dims(w, &p("decoder.conv_out"))?;
        Ok(VaeConfig {
            channels,
            num_res_blocks: blocks - 1,
            z_channels,
            image_channels,
            has_encoder: w.contains(&p("encoder.conv_in.weight")),
            has_quant_convs: w.contains(&p("post_quant_conv.weight")),
        })
    }

    /// Pixels per latent pixel along each axis.
    pub fn downscale(&self) -> i64 {
        1 << (self.channels.len() - 1)
    }
}

pub struct Vae<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: VaeConfig,
    /// Seamless tiling (sd-cli's `--circular*`): the axes on which [`Vae::run`] pads the
    /// convolutions circularly, or, in tiled runs whose tiles do not span the axis, lays
    /// the tiles around it ([`tiling::layout_wrapped`]), as sd.cpp's
    /// `configure_image_vae_axes` splits the two.
    pub circular: Circular,
}

impl<'w> Vae<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: VaeConfig) -> Result<Self> {
        let vae = Vae { w, prefix: prefix.to_string(), config, circular: Circular::NONE };
        vae.validate()?;
        Ok(vae)
    }

    fn n(&self, s: &str) -> String {
        format!("{}.{s}", self.prefix)
    }

    fn expect_conv(&self, name: &str, k: i64, cin: i64, cout: i64) -> Result<()> {
        self.w.expect_conv(&self.n(name), k, cin, cout)
    }

    fn expect_norm(&self, name: &str, c: i64) -> Result<()> {
        if c % GROUPS as i64 != 0 {
            return Err(ModelError::Config(format!("{name}: {c} channels are not a multiple of {GROUPS} groups")));
        }
        self.w.expect(&self.n(&format!("{name}.weight")), &[c])?;
        self.w.expect(&self.n(&format!("{name}.bias")), &[c])?;
        Ok(())
    }

    fn expect_res(&self, name: &str, cin: i64, cout: i64) -> Result<()> {
        self.expect_norm(&format!("{name}.norm1"), cin)?;
        self.expect_conv(&format!("{name}.conv1"), 3, cin, cout)?;
        self.expect_norm(&format!("{name}.norm2"), cout)?;
        self.expect_conv(&format!("{name}.conv2"), 3, cout, cout)?;
        if cin != cout {
            self.expect_conv(&format!("{name}.nin_shortcut"), 1, cin, cout)?;
        }
        Ok(())
    }

    fn expect_mid(&self, side: &str, c: i64) -> Result<()> {
        self.expect_res(&format!("{side}.mid.block_1"), c, c)?;
        self.expect_norm(&format!("{side}.mid.attn_1.norm"), c)?;
        for p in ["q", "k", "v", "proj_out"] {
            self.expect_conv(&format!("{side}.mid.attn_1.{p}"), 1, c, c)?;
        }
        self.expect_res(&format!("{side}.mid.block_2"), c, c)
    }

    /// Every weight the config implies, with its shape.
    fn validate(&self) -> Result<()> {
        let c = &self.config;
        let Some(&top) = c.channels.last() else {
            return Err(ModelError::Config("a VAE needs at least one level".into()));
        };
        let (z, levels) = (c.z_channels, c.channels.len());
        if c.has_quant_convs {
            self.expect_conv("post_quant_conv", 1, z, z)?;
        }
        self.expect_conv("decoder.conv_in", 3, z, top)?;
        self.expect_mid("decoder", top)?;
        let mut cin = top;
        for i in (0..levels).rev() {
            for j in 0..=c.num_res_blocks {
                self.expect_res(&format!("decoder.up.{i}.block.{j}"), cin, c.channels[i])?;
                cin = c.channels[i];
            }
            if i != 0 {
                self.expect_conv(&format!("decoder.up.{i}.upsample.conv"), 3, cin, cin)?;
            }
        }
        self.expect_norm("decoder.norm_out", cin)?;
        self.expect_conv("decoder.conv_out", 3, cin, c.image_channels)?;
        if c.has_encoder {
            let mut cin = c.channels[0];
            self.expect_conv("encoder.conv_in", 3, c.image_channels, cin)?;
            for i in 0..levels {
                for j in 0..c.num_res_blocks {
                    self.expect_res(&format!("encoder.down.{i}.block.{j}"), cin, c.channels[i])?;
                    cin = c.channels[i];
                }
                if i + 1 != levels {
                    self.expect_conv(&format!("encoder.down.{i}.downsample.conv"), 3, cin, cin)?;
                }
            }
            self.expect_mid("encoder", cin)?;
            self.expect_norm("encoder.norm_out", cin)?;
            self.expect_conv("encoder.conv_out", 3, cin, 2 * z)?;
            if c.has_quant_convs {
                self.expect_conv("quant_conv", 1, 2 * z, 2 * z)?;
            }
        }
        Ok(())
    }

    fn conv<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, stride: i32, pad: i32) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        conv2d(ctx, self.w, &self.n(name), x, stride, pad)
    }

    fn norm<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        group_norm(ctx, self.w, &self.n(name), x, GROUPS, EPS)
    }

    fn res_block<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let h = ctx.silu(self.norm(ctx, &format!("{name}.norm1"), x)?)?;
        let h = self.conv(ctx, &format!("{name}.conv1"), h, 1, 1)?;
        let h = ctx.silu(self.norm(ctx, &format!("{name}.norm2"), h)?)?;
        let h = self.conv(ctx, &format!("{name}.conv2"), h, 1, 1)?;
        let skip = format!("{name}.nin_shortcut");
        let x = if self.w.contains(&self.n(&format!("{skip}.weight"))) { self.conv(ctx, &skip, x, 1, 0)? } else { x };
        Ok(ctx.add(x, h)?)
    }

    /// Single-head self-attention over all pixels.
    fn attn_block<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let [w, h, c, n] = x.ne();
        let hn = self.norm(ctx, &format!("{name}.norm"), x)?;
        // [W, H, C, N] → [C, W·H, N]: channels innermost, one token per pixel.
        let tokens = |t: Tensor<'a>| -> Result<Tensor<'a>> {
            let t = ctx.reshape(t, [w * h, c, n, 1])?;
            Ok(ctx.cont(ctx.permute(t, [1, 0, 2, 3])?)?)
        };
        let q = tokens(self.conv(ctx, &format!("{name}.q"), hn, 1, 0)?)?;
        let k = tokens(self.conv(ctx, &format!("{name}.k"), hn, 1, 0)?)?;
        let v = tokens(self.conv(ctx, &format!("{name}.v"), hn, 1, 0)?)?;
        let compute = self.w.get(&self.n(&format!("{name}.q.weight")))?.dtype();
        let a = attention_typed(ctx, q, k, v, 1, None, compute)?; // [C, W·H, N]
        let a = ctx.cont(ctx.permute(a, [1, 0, 2, 3])?)?;
        let a = ctx.reshape(a, [w, h, c, n])?;
        let a = self.conv(ctx, &format!("{name}.proj_out"), a, 1, 0)?;
        Ok(ctx.add(x, a)?)
    }

    fn mid<'a>(&'a self, ctx: &'a Context, side: &str, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let x = self.res_block(ctx, &format!("{side}.mid.block_1"), x)?;
        let x = self.attn_block(ctx, &format!("{side}.mid.attn_1"), x)?;
        self.res_block(ctx, &format!("{side}.mid.block_2"), x)
    }

    /// Latents [w, h, z, N] → images [w·f, h·f, 3, N].
    pub fn decode<'a>(&'a self, ctx: &'a Context, z: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        if z.ne()[2] != c.z_channels {
            return Err(ModelError::Input(format!("latent has {} channels, the VAE {}", z.ne()[2], c.z_channels)));
        }
        let mut x = if c.has_quant_convs { self.conv(ctx, "post_quant_conv", z, 1, 0)? } else { z };
        x = self.conv(ctx, "decoder.conv_in", x, 1, 1)?;
        x = self.mid(ctx, "decoder", x)?;
        for i in (0..c.channels.len()).rev() {
            for j in 0..=c.num_res_blocks {
                x = self.res_block(ctx, &format!("decoder.up.{i}.block.{j}"), x)?;
            }
            if i != 0 {
                x = ctx.upscale(x, 2)?;
                x = self.conv(ctx, &format!("decoder.up.{i}.upsample.conv"), x, 1, 1)?;
            }
        }
        x = ctx.silu(self.norm(ctx, "decoder.norm_out", x)?)?;
        self.conv(ctx, "decoder.conv_out", x, 1, 1)
    }

    /// Images [W, H, 3, N] → the latent distribution's moments [W/f, H/f, 2z, N]
    /// (mean first, then log-variance).
    pub fn encode_moments<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        if !c.has_encoder {
            return Err(ModelError::Config("this VAE has no encoder weights".into()));
        }
        let f = self.config.downscale();
        let [w, h, ch, _] = image.ne();
        if ch != c.image_channels || w % f != 0 || h % f != 0 {
            return Err(ModelError::Input(format!("image {w}x{h}x{ch}: needs {} channels and sides divisible by {f}", c.image_channels)));
        }
        let levels = c.channels.len();
        let mut x = self.conv(ctx, "encoder.conv_in", image, 1, 1)?;
        for i in 0..levels {
            for j in 0..c.num_res_blocks {
                x = self.res_block(ctx, &format!("encoder.down.{i}.block.{j}"), x)?;
            }
            if i + 1 != levels {
                // LDM pads right and bottom only, then convolves with stride 2 (wrapping
                // around on circular axes, as sd.cpp's DownSampleBlock does).
                x = ctx.pad_spatial(x, [(0, 1), (0, 1)])?;
                x = self.conv(ctx, &format!("encoder.down.{i}.downsample.conv"), x, 2, 0)?;
            }
        }
        x = self.mid(ctx, "encoder", x)?;
        x = ctx.silu(self.norm(ctx, "encoder.norm_out", x)?)?;
        x = self.conv(ctx, "encoder.conv_out", x, 1, 1)?;
        if c.has_quant_convs {
            x = self.conv(ctx, "quant_conv", x, 1, 0)?;
        }
        Ok(x)
    }

    /// The mean of the latent distribution (deterministic encoding).
    pub fn encode_mean<'a>(&'a self, ctx: &'a Context, image: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let m = self.encode_moments(ctx, image)?;
        let [w, h, _, n] = m.ne();
        let nb = m.nb();
        Ok(ctx.cont(ctx.view(m, [w, h, self.config.z_channels, n], [nb[1], nb[2], nb[3]], 0)?)?)
    }
}

/// Graph and tensor capacity of one VAE graph: a few hundred nodes, independent of the
/// image size.
pub const GRAPH_SIZE: usize = 8192;

/// What one VAE run computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaeOp {
    /// Latent [w, h, z] → image [w·f, h·f, 3] in [-1, 1].
    Decode,
    /// Image [W, H, 3] in [-1, 1] → the latent distribution's mean [W/f, H/f, z].
    EncodeMean,
}

/// How a [`Vae::run`] went: tiled or whole, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// `None` when the whole image went through one graph.
    pub tiles: Option<tiling::TileLayout>,
    /// The whole-image attempt that failed to allocate (or exceeded the threshold) first.
    pub fallback: Option<String>,
}

fn is_alloc_failure(e: &ModelError) -> bool {
    matches!(e, ModelError::Ggml(GgmlError::Alloc { .. }))
}

/// What the tiled runner needs of an image VAE: its graph for an op, its channel counts
/// and scale, and the axes it tiles seamlessly.
pub trait VaeGraph {
    /// One op's output on x ([W, H, C, N]).
    fn graph<'a>(&'a self, ctx: &'a Context, op: VaeOp, x: Tensor<'a>) -> Result<Tensor<'a>>;
    /// (image channels, latent channels).
    fn channels(&self) -> (i64, i64);
    /// Pixels per latent pixel on each side.
    fn downscale(&self) -> i64;
    fn circular(&self) -> Circular;
}

impl VaeGraph for Vae<'_> {
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

impl Vae<'_> {
    /// [`run`] on this VAE.
    pub fn run(&self, backend: &Backend, op: VaeOp, input: &[f32], w: usize, h: usize, tiling: &VaeTiling) -> Result<(Vec<f32>, RunInfo)> {
        run(self, backend, op, input, w, h, tiling)
    }
}

/// One graph over one sample `input` (dimensions `ne` = [W, H, C, 1]) with a kept
/// allocator (whose limit, if any, turns a too large compute buffer into an allocation
/// failure before anything is computed).
fn run_graph(model: &(impl VaeGraph + ?Sized), backend: &Backend, alloc: &mut GraphAllocator, op: VaeOp, ne: [i64; 4], input: &[f32], circular: Circular) -> Result<Vec<f32>> {
    let ctx = Context::new(GRAPH_SIZE, GRAPH_SIZE)?;
    ctx.set_circular(circular);
    let x = ctx.new_tensor(GType::F32, &ne)?.set_input();
    let out = model.graph(&ctx, op, x)?;
    let out = if out.is_contiguous() { out } else { ctx.cont(out)? }.set_output();
    let mut graph = ctx.graph(GRAPH_SIZE)?;
    graph.build_forward(out)?;
    alloc.alloc(&graph)?;
    x.set_f32(input)?;
    backend.compute(&graph)?;
    Ok(out.get_f32()?)
}

/// Decode or encode one sample: `input` is planar [C][H][W] with sides `w`×`h`
/// (latent pixels for a decode, image pixels for an encode). Whole when `tiling`
/// allows and the compute buffer fits, in sd.cpp's tiles otherwise.
pub fn run(model: &(impl VaeGraph + ?Sized), backend: &Backend, op: VaeOp, input: &[f32], w: usize, h: usize, tiling: &VaeTiling) -> Result<(Vec<f32>, RunInfo)> {
    let (image_c, z_c) = model.channels();
    let (in_c, out_c) = match op {
        VaeOp::Decode => (z_c as usize, image_c as usize),
        VaeOp::EncodeMean => (image_c as usize, z_c as usize),
    };
    if input.len() != w * h * in_c {
        if op == VaeOp::Decode && w * h > 0 && input.len() % (w * h) == 0 {
            return Err(ModelError::Input(format!(
                "a latent of {} channels for a VAE of {in_c}: decode it with its model's VAE (SD1/SD2/SDXL: 4 channels; FLUX's ae, SD3's and Qwen-Image's: 16)",
                input.len() / (w * h)
            )));
        }
        if op == VaeOp::EncodeMean && w * h > 0 && input.len() % (w * h) == 0 {
            return Err(ModelError::Input(format!("an image of {} channels for a VAE that reads {in_c} channels (Qwen-Image-Layered's reads RGBA)", input.len() / (w * h))));
        }
        return Err(ModelError::Input(format!("{} values for a {w}x{h}x{in_c} input", input.len())));
    }
    let mut info = RunInfo { tiles: None, fallback: None };
    if !tiling.enabled {
        let mut alloc = GraphAllocator::new(backend)?.with_limit(tiling.max_compute_bytes);
        match run_graph(model, backend, &mut alloc, op, [w as i64, h as i64, in_c as i64, 1], input, model.circular()) {
            Err(e) if is_alloc_failure(&e) && (tiling.retry_on_alloc_failure || tiling.max_compute_bytes.is_some()) => info.fallback = Some(e.to_string()),
            other => return other.map(|v| (v, info)),
        }
    }
    let out = run_tiles(model, backend, op, input, [w, h, in_c, out_c], tiling, &mut info)?;
    Ok((out, info))
}

fn run_tiles(model: &(impl VaeGraph + ?Sized), backend: &Backend, op: VaeOp, input: &[f32], [w, h, in_c, out_c]: [usize; 4], tiling: &VaeTiling, info: &mut RunInfo) -> Result<Vec<f32>> {
    let f = model.downscale() as usize;
    let (dir, lw, lh, factor) = match op {
        VaeOp::Decode => (Direction::Upscale, w, h, 1.0),
        VaeOp::EncodeMean => {
            if w % f != 0 || h % f != 0 {
                return Err(ModelError::Input(format!("image {w}x{h}: sides must be divisible by {f}")));
            }
            (Direction::Downscale, w / f, h / f, 1.30539)
        }
    };
    let (tw, th, overlap) = tiling.tile_sizes(lw, lh, factor);
    // A circular axis that one tile spans pads its convolutions circularly; across
    // several tiles the tiles wrap around it instead (sd.cpp's configure_image_vae_axes).
    let c = model.circular();
    let (wrap_x, wrap_y) = (c.x && tw < lw, c.y && th < lh);
    let conv = Circular::new(c.x && !wrap_x, c.y && !wrap_y);
    let layout = tiling::layout_wrapped(lw, lh, tw, th, overlap, (wrap_x, wrap_y));
    // Every tile has the same size: one allocator (and compute buffer) serves them all.
    let mut alloc = GraphAllocator::new(backend)?;
    let out = tiling::run_tiled(input, w, h, in_c, out_c, f, dir, &layout, |tile, tw, th| run_graph(model, backend, &mut alloc, op, [tw as i64, th as i64, in_c as i64, 1], &tile, conv));
    info.tiles = Some(layout);
    out.map_err(|e| match e {
        TiledError::Tile(e) => e,
        TiledError::Shape(s) => ModelError::Input(s),
    })
}

/// How a standalone VAE file names its tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VaeLayout {
    /// LDM names (`decoder.up.N.block.M`) under `prefix` (`first_stage_model.` in a full
    /// checkpoint, empty in a VAE file).
    Ldm { prefix: String },
    /// diffusers `AutoencoderKL` names (`decoder.up_blocks.N.resnets.M`) under `prefix`
    /// (empty, or `vae.` in a pipeline folder), with `levels` decoder levels.
    Diffusers { prefix: String, levels: usize },
}

/// The prefix [`standalone_source`] puts every VAE tensor under.
pub const STANDALONE_PREFIX: &str = "first_stage_model";

impl VaeLayout {
    /// The layout of a file with tensors `names`, if it holds a KL VAE decoder.
    pub fn detect<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> Option<Self> {
        let has = |p: &str| names.clone().into_iter().any(|n| n.starts_with(p));
        for prefix in ["first_stage_model.", "", "vae."] {
            if has(&format!("{prefix}decoder.up.")) {
                return Some(VaeLayout::Ldm { prefix: prefix.into() });
            }
            let up = format!("{prefix}decoder.up_blocks.");
            if has(&up) {
                let levels = names.clone().into_iter().filter_map(|n| n.strip_prefix(&up)?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |m| m + 1);
                return Some(VaeLayout::Diffusers { prefix: prefix.into(), levels });
            }
        }
        None
    }

    /// The LDM name (without any prefix) of tensor `name`, and whether it is a linear
    /// weight LDM stores as a 1×1 convolution; `None` for tensors outside the VAE.
    pub fn ldm_name(&self, name: &str) -> Option<(String, bool)> {
        match self {
            VaeLayout::Ldm { prefix } => {
                let n = name.strip_prefix(prefix.as_str())?;
                ["encoder.", "decoder.", "quant_conv.", "post_quant_conv."].iter().any(|p| n.starts_with(p)).then(|| (n.to_string(), false))
            }
            VaeLayout::Diffusers { prefix, levels } => diffusers_to_ldm(name.strip_prefix(prefix.as_str())?, *levels),
        }
    }
}

/// diffusers `AutoencoderKL` name → LDM name (both without prefix).
fn diffusers_to_ldm(name: &str, levels: usize) -> Option<(String, bool)> {
    if name.starts_with("quant_conv.") || name.starts_with("post_quant_conv.") {
        return Some((name.to_string(), false));
    }
    let (side, rest) = name.split_once('.')?;
    if side != "encoder" && side != "decoder" {
        return None;
    }
    let resnet = |r: &str| r.replacen("conv_shortcut.", "nin_shortcut.", 1);
    let idx = |s: &str| s.parse::<usize>().ok();
    let parts: Vec<&str> = rest.splitn(5, '.').collect();
    let mapped = match parts.as_slice() {
        ["conv_in", wb] | ["conv_out", wb] => format!("{side}.{}.{wb}", parts[0]),
        ["conv_norm_out", wb] => format!("{side}.norm_out.{wb}"),
        ["mid_block", "resnets", k, r @ ..] => format!("{side}.mid.block_{}.{}", idx(k)? + 1, resnet(&r.join("."))),
        ["mid_block", "attentions", "0", proj, tail @ ..] => {
            let tail = tail.join(".");
            let (ldm, wb) = match (*proj, tail.as_str()) {
                ("group_norm", wb) => ("norm", wb.to_string()),
                ("to_q" | "query", wb) => ("q", wb.to_string()),
                ("to_k" | "key", wb) => ("k", wb.to_string()),
                ("to_v" | "value", wb) => ("v", wb.to_string()),
                ("proj_attn", wb) => ("proj_out", wb.to_string()),
                ("to_out", t) => ("proj_out", t.strip_prefix("0.")?.to_string()),
                _ => return None,
            };
            let linear = ldm != "norm" && wb == "weight";
            return Some((format!("{side}.mid.attn_1.{ldm}.{wb}"), linear));
        }
        ["down_blocks", i, "resnets", j, r] if side == "encoder" => format!("encoder.down.{}.block.{}.{}", idx(i)?, idx(j)?, resnet(r)),
        ["down_blocks", i, "downsamplers", "0", r] if side == "encoder" => format!("encoder.down.{}.downsample.{r}", idx(i)?),
        ["up_blocks", i, "resnets", j, r] if side == "decoder" => format!("decoder.up.{}.block.{}.{}", levels.checked_sub(idx(i)? + 1)?, idx(j)?, resnet(r)),
        ["up_blocks", i, "upsamplers", "0", r] if side == "decoder" => format!("decoder.up.{}.upsample.{r}", levels.checked_sub(idx(i)? + 1)?),
        _ => return None,
    };
    Some((mapped, false))
}

/// A standalone VAE file (LDM names with or without `first_stage_model.`, or diffusers
/// names) as a source whose KL VAE tensors all sit under [`STANDALONE_PREFIX`] in LDM
/// names, ready for [`VaeConfig::infer`].
pub fn standalone_source(src: Box<dyn crate::io::TensorSource>) -> Result<Box<dyn crate::io::TensorSource>> {
    let shown = src.path().display().to_string();
    let layout = VaeLayout::detect(src.tensors().iter().map(|t| t.name.as_str()))
        .ok_or_else(|| ModelError::Config(format!("{shown}: no KL VAE decoder (neither `decoder.up.*` nor diffusers `decoder.up_blocks.*` tensors)")))?;
    // diffusers' linear attention weights become LDM's 1×1 convolutions (same bytes,
    // two more dimensions).
    let renamed = crate::io::Assembled::renamed(src, |t| {
        let (ldm, linear) = layout.ldm_name(&t.name)?;
        let mut info = t.clone();
        info.name = format!("{STANDALONE_PREFIX}.{ldm}");
        if linear && info.shape.len() == 2 {
            info.shape.extend([1, 1]);
        }
        Some(info)
    })
    .map_err(|name| ModelError::Weight { name, detail: format!("{shown}: two tensors map to this name") })?;
    Ok(Box::new(renamed))
}
