//! The Stable Diffusion 1.x/2.x UNet (`openaimodel.UNetModel`) in the LDM key layout
//! (`input_blocks.N.M`, `middle_block`, `output_blocks`, `time_embed`, `out`).
//!
//! The block structure is read off the weights rather than a config file: which input
//! blocks are res blocks, which carry a SpatialTransformer and how deep, where the
//! down- and upsamplers sit. That covers SD1.x, SD2.x, 9-channel inpainting and
//! 8-channel instruct-pix2pix UNets with one code path.

use crate::models::nn::{attention_typed, conv2d, geglu_ff, group_norm_over, layer_norm, linear, project};
use crate::models::{ModelError, Result, Weights};
use super::motion::{MotionConfig, MotionModules, Slot};
use crate::ggml::{Context, ScaleMode, Tensor};

/// Attention heads: SD1 fixes the count (8), SD2 fixes the width of a head (64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heads {
    Count(i64),
    Dim(i64),
}

impl Heads {
    fn for_width(self, c: i64) -> i64 {
        match self {
            Heads::Count(n) => n,
            Heads::Dim(d) => (c / d).max(1),
        }
    }
}

/// One block of the encoder or decoder path.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Index in `input_blocks` / `output_blocks`.
    pub index: usize,
    pub kind: BlockKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum BlockKind {
    /// A res block, optionally followed by a SpatialTransformer of `depth` layers and
    /// (decoder only) an upsampler.
    Res { cin: i64, cout: i64, transformer_depth: usize, upsample: bool },
    /// A stride-2 convolution (encoder only).
    Down { channels: i64 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct UnetConfig {
    pub in_channels: i64,
    pub out_channels: i64,
    pub model_channels: i64,
    pub time_embed_dim: i64,
    pub context_dim: i64,
    /// SD2 projects in and out of transformers with Linear layers, SD1 with 1×1 convs.
    pub linear_projection: bool,
    pub heads: Heads,
    pub input_blocks: Vec<Block>,
    pub middle_depth: usize,
    pub output_blocks: Vec<Block>,
    /// Width of the class/ADM vector `y` the UNet adds to its time embedding through
    /// `label_emb` (SDXL: pooled text + six size embeddings, 2816; the refiner 2560).
    pub adm_in_channels: Option<i64>,
}

/// What one UNet evaluation takes besides latent, timesteps and text context.
#[derive(Default)]
pub struct UnetExtras<'a> {
    /// The ADM vector `y` [adm_in_channels, N] (SDXL), required exactly when the UNet
    /// has `label_emb`.
    pub y: Option<Tensor<'a>>,
    /// IP-Adapters: image tokens every cross-attention also attends to.
    pub ip: Vec<IpAttention<'a>>,
    /// ControlNet residuals (the sum over stacked ControlNets), added as ldm's
    /// `apply_control` does.
    pub control: Option<ControlResiduals<'a>>,
    /// AnimateDiff: the batch is videos of `frames` frames that the motion modules run on.
    pub motion: Option<Motion<'a>>,
}

/// AnimateDiff's motion modules in one UNet evaluation.
#[derive(Clone, Copy)]
pub struct Motion<'a> {
    pub modules: &'a MotionModules<'a>,
    /// Frames per video: the batch holds a whole number of videos, frame after frame.
    pub frames: i64,
    /// Every GroupNorm of the UNet and the modules takes its statistics over all frames of
    /// a video, not per frame: how AnimateDiff v1's modules were trained (a 3-D UNet's
    /// norms over `b c f h w`), which AnimateDiff-Evolved reproduces for them.
    pub norm_across_frames: bool,
}

impl<'a> Motion<'a> {
    fn apply(motion: Option<&Self>, ctx: &'a Context, slot: Slot, x: Tensor<'a>) -> Result<Tensor<'a>> {
        match motion {
            Some(m) => m.modules.apply(ctx, slot, x, m.frames, m.norm_frames()),
            None => Ok(x),
        }
    }

    fn norm_frames(&self) -> Option<i64> {
        self.norm_across_frames.then_some(self.frames)
    }
}

/// What ControlNets add to a UNet: one tensor per skip connection (`input_blocks.0` to
/// the last input block, in order) and one for the middle block's output, each the shape
/// of what it is added to.
#[derive(Clone)]
pub struct ControlResiduals<'a> {
    pub skips: Vec<Tensor<'a>>,
    pub middle: Tensor<'a>,
}

/// One IP-Adapter's image attention (diffusers' `IPAdapterAttnProcessor`): each
/// cross-attention adds `scale · attention(q, to_k_ip(tokens), to_v_ip(tokens))` to its
/// text attention, before the output projection.
pub struct IpAttention<'a> {
    /// The adapter's weights (`ip_adapter.N.to_k_ip` / `to_v_ip`), checked against this
    /// UNet with [`super::ip_adapter::IpAdapter::check_unet`].
    pub weights: &'a Weights,
    /// Image tokens per sample [width, tokens, N].
    pub tokens: Tensor<'a>,
    pub scale: f32,
}

/// The image attention of one cross-attention layer: the adapters and the layer's index N
/// in their `ip_adapter.N` weights.
#[derive(Clone, Copy)]
struct IpLayer<'e, 'a> {
    adapters: &'e [IpAttention<'a>],
    index: usize,
}

const GROUPS: i32 = 32;

impl UnetConfig {
    /// Read the structure off the weights under `prefix` (`model.diffusion_model`).
    /// Heads default to 8 for 1×1-conv projections (SD1) and 64-wide for Linear ones
    /// (SD2), as the released models use; override `heads` for other models.
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let mut cfg = Self::infer_encoder(w, prefix)?;
        let n = |s: String| format!("{prefix}.{s}");
        cfg.out_channels = w.get(&n("out.2.weight".into()))?.ne()[3];
        for i in 0.. {
            if !w.contains(&n(format!("output_blocks.{i}.0.in_layers.0.weight"))) {
                break;
            }
            let (cin, cout) = res_dims(w, &n(format!("output_blocks.{i}.0")))?;
            let transformer_depth = depth(w, &n(format!("output_blocks.{i}.1")));
            let up = if transformer_depth > 0 { 2 } else { 1 };
            let upsample = w.contains(&n(format!("output_blocks.{i}.{up}.conv.weight")));
            cfg.output_blocks.push(Block { index: i, kind: BlockKind::Res { cin, cout, transformer_depth, upsample } });
        }
        if cfg.output_blocks.len() != cfg.input_blocks.len() + 1 {
            return Err(ModelError::Config(format!(
                "UNet under `{prefix}`: {} input blocks and {} output blocks do not pair up",
                cfg.input_blocks.len() + 1,
                cfg.output_blocks.len()
            )));
        }
        if cfg.context_dim == 0 {
            let first = cfg.output_blocks.iter().find_map(|b| match b.kind {
                BlockKind::Res { transformer_depth, .. } if transformer_depth > 0 => Some(n(format!("output_blocks.{}.1", b.index))),
                _ => None,
            });
            if let Some(block) = first {
                (cfg.context_dim, cfg.linear_projection) = attention_style(w, &block)?;
                cfg.heads = default_heads(cfg.linear_projection);
            }
        }
        Ok(cfg)
    }

    /// The encoder half of [`UnetConfig::infer`] (time and label embeddings, input blocks,
    /// middle block), for models that have no decoder: ControlNets. `output_blocks` is
    /// empty and `out_channels` 0.
    pub fn infer_encoder(w: &Weights, prefix: &str) -> Result<Self> {
        let n = |s: String| format!("{prefix}.{s}");
        let conv_in = w.get(&n("input_blocks.0.0.weight".into()))?.ne();
        let (in_channels, model_channels) = (conv_in[2], conv_in[3]);
        let time_embed_dim = w.get(&n("time_embed.0.weight".into()))?.ne()[1];
        let depth = |block: String| depth(w, &n(block));
        let res_dims = |block: String| res_dims(w, &n(block));

        let mut input_blocks = Vec::new();
        for i in 1.. {
            if w.contains(&n(format!("input_blocks.{i}.0.op.weight"))) {
                let c = w.get(&n(format!("input_blocks.{i}.0.op.weight")))?.ne()[3];
                input_blocks.push(Block { index: i, kind: BlockKind::Down { channels: c } });
            } else if w.contains(&n(format!("input_blocks.{i}.0.in_layers.0.weight"))) {
                let (cin, cout) = res_dims(format!("input_blocks.{i}.0"))?;
                let transformer_depth = depth(format!("input_blocks.{i}.1"));
                input_blocks.push(Block { index: i, kind: BlockKind::Res { cin, cout, transformer_depth, upsample: false } });
            } else {
                break;
            }
        }
        if input_blocks.is_empty() {
            return Err(ModelError::Config(format!("UNet under `{prefix}`: no input blocks after input_blocks.0")));
        }
        let middle_depth = depth("middle_block.1".into());
        // Context width and projection style, from the first transformer there is.
        let first_attn = (middle_depth > 0).then(|| "middle_block.1".to_string()).or_else(|| {
            input_blocks.iter().find_map(|b| match b.kind {
                BlockKind::Res { transformer_depth, .. } if transformer_depth > 0 => Some(format!("input_blocks.{}.1", b.index)),
                _ => None,
            })
        });
        let (context_dim, linear_projection) = match first_attn {
            Some(block) => attention_style(w, &n(block))?,
            None => (0, false),
        };
        let adm_in_channels = match w.contains(&n("label_emb.0.0.weight".into())) {
            true => Some(w.get(&n("label_emb.0.0.weight".into()))?.ne()[0]),
            false => None,
        };
        Ok(UnetConfig {
            adm_in_channels,
            in_channels,
            out_channels: 0,
            model_channels,
            time_embed_dim,
            context_dim,
            linear_projection,
            heads: default_heads(linear_projection),
            input_blocks,
            middle_depth,
            output_blocks: Vec::new(),
        })
    }

    /// Channels of each skip connection, `input_blocks.0` first: what the decoder takes
    /// and what ControlNet residuals must match.
    pub fn skip_channels(&self) -> Vec<i64> {
        let mut out = vec![self.model_channels];
        for b in &self.input_blocks {
            out.push(match b.kind {
                BlockKind::Down { channels } => channels,
                BlockKind::Res { cout, .. } => cout,
            });
        }
        out
    }

    /// Fails, naming the place, unless every motion module of `m` fits this UNet: its
    /// levels, the pairs per level and their widths.
    pub fn check_motion(&self, m: &MotionConfig) -> Result<()> {
        let slots = self.motion_slots();
        for &(slot, c) in &m.modules {
            match slots.iter().find(|(s, _)| *s == slot) {
                Some(&(_, uc)) if uc == c => {}
                Some(&(_, uc)) => return Err(ModelError::Config(format!("motion module {}: {c} channels where the UNet has {uc} (a motion module for another base model?)", slot.name()))),
                None => return Err(ModelError::Config(format!("motion module {}: the UNet has no such block (a motion module for another base model?)", slot.name()))),
            }
        }
        if !slots.iter().all(|&(s, _)| s == Slot::Mid || m.at(s).is_some()) {
            return Err(ModelError::Config("the motion modules cover only part of the UNet's blocks (a motion module for another base model?)".into()));
        }
        Ok(())
    }

    /// Every place a motion module can sit, with the width there.
    fn motion_slots(&self) -> Vec<(Slot, i64)> {
        let mut out = Vec::new();
        let (mut level, mut j) = (0, 0);
        for b in &self.input_blocks {
            match b.kind {
                BlockKind::Down { .. } => (level, j) = (level + 1, 0),
                BlockKind::Res { cout, .. } => {
                    out.push((Slot::Down(level, j), cout));
                    j += 1;
                }
            }
        }
        if let Some(&(_, c)) = out.last() {
            out.push((Slot::Mid, c));
        }
        let (mut level, mut j) = (0, 0);
        for b in &self.output_blocks {
            if let BlockKind::Res { cout, upsample, .. } = b.kind {
                out.push((Slot::Up(level, j), cout));
                j += 1;
                if upsample {
                    (level, j) = (level + 1, 0);
                }
            }
        }
        out
    }
}

fn default_heads(linear_projection: bool) -> Heads {
    if linear_projection {
        Heads::Dim(64)
    } else {
        Heads::Count(8)
    }
}

/// Transformer layers of the SpatialTransformer at `block` (full name).
fn depth(w: &Weights, block: &str) -> usize {
    (0..).take_while(|d| w.contains(&format!("{block}.transformer_blocks.{d}.norm1.weight"))).count()
}

/// (cin, cout) of the res block at `block` (full name).
fn res_dims(w: &Weights, block: &str) -> Result<(i64, i64)> {
    let cin = w.get(&format!("{block}.in_layers.0.weight"))?.ne()[0];
    let cout = w.get(&format!("{block}.in_layers.2.weight"))?.ne()[3];
    Ok((cin, cout))
}

/// Context width and whether projections are Linear, from the transformer at `block`.
fn attention_style(w: &Weights, block: &str) -> Result<(i64, bool)> {
    let k = w.get(&format!("{block}.transformer_blocks.0.attn2.to_k.weight"))?.ne();
    let p = w.get(&format!("{block}.proj_in.weight"))?.ne();
    Ok((k[0], p[2] == 1 && p[3] == 1))
}

pub struct Unet<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: UnetConfig,
}

impl<'w> Unet<'w> {
    pub fn new(w: &'w Weights, prefix: &str, config: UnetConfig) -> Result<Self> {
        let u = Unet { w, prefix: prefix.to_string(), config };
        u.validate_encoder()?;
        u.validate_decoder()?;
        Ok(u)
    }

    /// The encoder half alone (a config from [`UnetConfig::infer_encoder`]), which is what
    /// a ControlNet runs: [`Unet::embed`] and [`Unet::encode`], no [`Unet::forward`].
    pub(crate) fn new_encoder(w: &'w Weights, prefix: &str, config: UnetConfig) -> Result<Self> {
        let u = Unet { w, prefix: prefix.to_string(), config };
        u.validate_encoder()?;
        Ok(u)
    }

    fn n(&self, s: &str) -> String {
        format!("{}.{s}", self.prefix)
    }

    fn expect(&self, name: &str, ne: &[i64]) -> Result<()> {
        self.w.expect(&self.n(name), ne).map(|_| ())
    }

    fn expect_norm(&self, name: &str, c: i64, groups: bool) -> Result<()> {
        if groups && c % GROUPS as i64 != 0 {
            return Err(ModelError::Config(format!("{}: {c} channels are not a multiple of {GROUPS} groups", self.n(name))));
        }
        self.expect(&format!("{name}.weight"), &[c])?;
        self.expect(&format!("{name}.bias"), &[c])
    }

    fn expect_conv(&self, name: &str, k: i64, cin: i64, cout: i64) -> Result<()> {
        self.w.expect_conv(&self.n(name), k, cin, cout)
    }

    fn expect_linear(&self, name: &str, cin: i64, cout: i64, bias: bool) -> Result<()> {
        self.expect(&format!("{name}.weight"), &[cin, cout])?;
        if bias {
            self.expect(&format!("{name}.bias"), &[cout])?;
        }
        Ok(())
    }

    fn expect_res(&self, name: &str, cin: i64, cout: i64) -> Result<()> {
        self.expect_norm(&format!("{name}.in_layers.0"), cin, true)?;
        self.expect_conv(&format!("{name}.in_layers.2"), 3, cin, cout)?;
        self.expect_linear(&format!("{name}.emb_layers.1"), self.config.time_embed_dim, cout, true)?;
        self.expect_norm(&format!("{name}.out_layers.0"), cout, true)?;
        self.expect_conv(&format!("{name}.out_layers.3"), 3, cout, cout)?;
        if cin != cout {
            self.expect_conv(&format!("{name}.skip_connection"), 1, cin, cout)?;
        }
        Ok(())
    }

    fn expect_transformer(&self, name: &str, c: i64, depth: usize) -> Result<()> {
        let cfg = &self.config;
        let heads = cfg.heads.for_width(c);
        if heads < 1 || c % heads != 0 {
            return Err(ModelError::Config(format!("{}: {heads} heads do not divide {c} channels", self.n(name))));
        }
        self.expect_norm(&format!("{name}.norm"), c, true)?;
        for p in ["proj_in", "proj_out"] {
            if cfg.linear_projection {
                self.expect_linear(&format!("{name}.{p}"), c, c, true)?;
            } else {
                self.expect_conv(&format!("{name}.{p}"), 1, c, c)?;
            }
        }
        for d in 0..depth {
            let b = format!("{name}.transformer_blocks.{d}");
            for (attn, kv) in [("attn1", c), ("attn2", cfg.context_dim)] {
                self.expect_linear(&format!("{b}.{attn}.to_q"), c, c, false)?;
                self.expect_linear(&format!("{b}.{attn}.to_k"), kv, c, false)?;
                self.expect_linear(&format!("{b}.{attn}.to_v"), kv, c, false)?;
                self.expect_linear(&format!("{b}.{attn}.to_out.0"), c, c, true)?;
            }
            for nn in ["norm1", "norm2", "norm3"] {
                self.expect_norm(&format!("{b}.{nn}"), c, false)?;
            }
            let inner = self.w.get(&self.n(&format!("{b}.ff.net.2.weight")))?.ne()[0];
            self.expect_linear(&format!("{b}.ff.net.0.proj"), c, 2 * inner, true)?;
            self.expect_linear(&format!("{b}.ff.net.2"), inner, c, true)?;
        }
        Ok(())
    }

    fn validate_encoder(&self) -> Result<()> {
        let c = &self.config;
        self.expect_conv("input_blocks.0.0", 3, c.in_channels, c.model_channels)?;
        self.expect_linear("time_embed.0", c.model_channels, c.time_embed_dim, true)?;
        self.expect_linear("time_embed.2", c.time_embed_dim, c.time_embed_dim, true)?;
        if let Some(adm) = c.adm_in_channels {
            self.expect_linear("label_emb.0.0", adm, c.time_embed_dim, true)?;
            self.expect_linear("label_emb.0.2", c.time_embed_dim, c.time_embed_dim, true)?;
        }
        self.validate_blocks("input_blocks", &c.input_blocks)?;
        let mid = self.w.get(&self.n("middle_block.0.in_layers.0.weight"))?.ne()[0];
        self.expect_res("middle_block.0", mid, mid)?;
        if c.middle_depth > 0 {
            self.expect_transformer("middle_block.1", mid, c.middle_depth)?;
        }
        self.expect_res(if c.middle_depth > 0 { "middle_block.2" } else { "middle_block.1" }, mid, mid)
    }

    fn validate_decoder(&self) -> Result<()> {
        let c = &self.config;
        self.validate_blocks("output_blocks", &c.output_blocks)?;
        let last = match c.output_blocks.last().map(|b| &b.kind) {
            Some(BlockKind::Res { cout, .. }) => *cout,
            _ => c.model_channels,
        };
        self.expect_norm("out.0", last, true)?;
        self.expect_conv("out.2", 3, last, c.out_channels)
    }

    fn validate_blocks(&self, side: &str, blocks: &[Block]) -> Result<()> {
        for Block { index, kind } in blocks {
            match *kind {
                BlockKind::Down { channels } => self.expect_conv(&format!("{side}.{index}.0.op"), 3, channels, channels)?,
                BlockKind::Res { cin, cout, transformer_depth, upsample } => {
                    self.expect_res(&format!("{side}.{index}.0"), cin, cout)?;
                    if transformer_depth > 0 {
                        self.expect_transformer(&format!("{side}.{index}.1"), cout, transformer_depth)?;
                    }
                    if upsample {
                        let at = if transformer_depth > 0 { 2 } else { 1 };
                        self.expect_conv(&format!("{side}.{index}.{at}.conv"), 3, cout, cout)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `gn`: frames per video when the GroupNorms take their statistics over a whole
    /// video ([`Motion::norm_across_frames`]); `None`: per image.
    fn res_block<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, emb: Tensor<'a>, gn: Option<i64>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let (w, n) = (self.w, |s: &str| self.n(&format!("{name}.{s}")));
        let h = ctx.silu(group_norm_over(ctx, w, &n("in_layers.0"), x, GROUPS, 1e-5, gn)?)?;
        let h = conv2d(ctx, w, &n("in_layers.2"), h, 1, 1)?;
        let e = linear(ctx, w, &n("emb_layers.1"), ctx.silu(emb)?)?; // [cout, N]
        let e = ctx.reshape(e, [1, 1, e.ne()[0], e.ne()[1]])?;
        let h = ctx.add(h, e)?;
        let h = ctx.silu(group_norm_over(ctx, w, &n("out_layers.0"), h, GROUPS, 1e-5, gn)?)?;
        let h = conv2d(ctx, w, &n("out_layers.3"), h, 1, 1)?;
        let skip = n("skip_connection");
        let x = if w.contains(&format!("{skip}.weight")) { conv2d(ctx, w, &skip, x, 1, 0)? } else { x };
        Ok(ctx.add(x, h)?)
    }

    fn cross_attention<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, context: Tensor<'a>, heads: i64, ip: Option<IpLayer<'_, 'a>>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let w = self.w;
        let q = linear(ctx, w, &format!("{name}.to_q"), x)?;
        let k = linear(ctx, w, &format!("{name}.to_k"), context)?;
        let v = linear(ctx, w, &format!("{name}.to_v"), context)?;
        let compute = w.get(&format!("{name}.to_q.weight"))?.dtype();
        let mut a = attention_typed(ctx, q, k, v, heads, None, compute)?;
        for (adapter, n) in ip.iter().flat_map(|l| l.adapters.iter().map(move |a| (a, l.index))) {
            let k = project(ctx, adapter.weights, &format!("ip_adapter.{n}.to_k_ip.weight"), adapter.tokens)?;
            let v = project(ctx, adapter.weights, &format!("ip_adapter.{n}.to_v_ip.weight"), adapter.tokens)?;
            let image = attention_typed(ctx, q, k, v, heads, None, compute)?;
            a = ctx.add(a, ctx.scale(image, adapter.scale)?)?;
        }
        linear(ctx, w, &format!("{name}.to_out.0"), a)
    }

    /// SpatialTransformer on x [W, H, C, N] with `context` [Dc, Tc, N].
    #[allow(clippy::too_many_arguments)]
    fn transformer<'a>(&'a self, ctx: &'a Context, name: &str, x: Tensor<'a>, context: Tensor<'a>, depth: usize, ip: &IpLayers<'_, 'a>, gn: Option<i64>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let w = self.w;
        let n = |s: &str| self.n(&format!("{name}.{s}"));
        let [wd, ht, c, b] = x.ne();
        let heads = self.config.heads.for_width(c);
        let to_tokens = |t: Tensor<'a>| -> Result<Tensor<'a>> {
            let t = ctx.reshape(t, [wd * ht, c, b, 1])?;
            Ok(ctx.cont(ctx.permute(t, [1, 0, 2, 3])?)?) // [C, W·H, N]
        };
        let from_tokens = |t: Tensor<'a>| -> Result<Tensor<'a>> {
            let t = ctx.cont(ctx.permute(t, [1, 0, 2, 3])?)?;
            Ok(ctx.reshape(t, [wd, ht, c, b])?)
        };
        let h = group_norm_over(ctx, w, &n("norm"), x, GROUPS, 1e-6, gn)?;
        let mut h = if self.config.linear_projection {
            linear(ctx, w, &n("proj_in"), to_tokens(h)?)?
        } else {
            to_tokens(conv2d(ctx, w, &n("proj_in"), h, 1, 0)?)?
        };
        for d in 0..depth {
            let blk = n(&format!("transformer_blocks.{d}"));
            let t = layer_norm(ctx, w, &format!("{blk}.norm1"), h, 1e-5)?;
            h = ctx.add(h, self.cross_attention(ctx, &format!("{blk}.attn1"), t, t, heads, None)?)?;
            let t = layer_norm(ctx, w, &format!("{blk}.norm2"), h, 1e-5)?;
            let image = ip.layer(&format!("{name}.transformer_blocks.{d}"));
            h = ctx.add(h, self.cross_attention(ctx, &format!("{blk}.attn2"), t, context, heads, image)?)?;
            let t = layer_norm(ctx, w, &format!("{blk}.norm3"), h, 1e-5)?;
            h = ctx.add(h, geglu_ff(ctx, w, &format!("{blk}.ff"), t)?)?;
        }
        let h = if self.config.linear_projection {
            from_tokens(linear(ctx, w, &n("proj_out"), h)?)?
        } else {
            conv2d(ctx, w, &n("proj_out"), from_tokens(h)?, 1, 0)?
        };
        Ok(ctx.add(x, h)?)
    }

    pub(crate) fn check_inputs(&self, x: Tensor<'_>, t: Tensor<'_>, context: Tensor<'_>) -> Result<()> {
        let c = &self.config;
        let [_, _, cin, b] = x.ne();
        if cin != c.in_channels {
            return Err(ModelError::Input(format!("latent {:?}: the model takes {} channels", x.ne(), c.in_channels)));
        }
        if t.ne()[0] != b || context.ne()[2] != b || (c.context_dim > 0 && context.ne()[0] != c.context_dim) {
            return Err(ModelError::Input(format!("batch {b}: timesteps {:?}, context {:?} (context width {})", t.ne(), context.ne(), c.context_dim)));
        }
        Ok(())
    }

    /// The time embedding of timesteps `t` [N], plus the label embedding of the ADM
    /// vector `y` [adm_in_channels, N] where the model has one: [time_embed_dim, N].
    pub(crate) fn embed<'a>(&'a self, ctx: &'a Context, t: Tensor<'a>, y: Option<Tensor<'a>>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let (c, w, b) = (&self.config, self.w, t.ne()[0]);
        let emb = ctx.timestep_embedding(t, c.model_channels as i32, 10000)?;
        let emb = linear(ctx, w, &self.n("time_embed.0"), emb)?;
        let emb = linear(ctx, w, &self.n("time_embed.2"), ctx.silu(emb)?)?;
        match (c.adm_in_channels, y) {
            (None, None) => Ok(emb),
            (Some(adm), Some(y)) if y.ne()[0] == adm && y.ne()[1] == b => {
                let e = linear(ctx, w, &self.n("label_emb.0.0"), y)?;
                let e = linear(ctx, w, &self.n("label_emb.0.2"), ctx.silu(e)?)?;
                Ok(ctx.add(emb, e)?)
            }
            (adm, y) => Err(ModelError::Input(format!(
                "the {} takes {} ADM vector; got {}",
                if self.config.output_blocks.is_empty() { "ControlNet" } else { "UNet" },
                adm.map_or("no".to_string(), |a| format!("a {a}-wide")),
                y.map_or("none".to_string(), |y| format!("{:?}", y.ne()))
            ))),
        }
    }

    /// The encoder: input blocks and middle block on `x` with embedding `emb`. Returns
    /// every input block's output (the skips) and the middle block's. `after_first` is
    /// added to `input_blocks.0`'s output before anything uses it (a ControlNet's hint).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>, emb: Tensor<'a>, context: Tensor<'a>, after_first: Option<Tensor<'a>>, ip: &IpLayers<'_, 'a>, motion: Option<&Motion<'a>>) -> Result<(Vec<Tensor<'a>>, Tensor<'a>)>
    where
        'w: 'a,
    {
        let (c, w) = (&self.config, self.w);
        let mut h = conv2d(ctx, w, &self.n("input_blocks.0.0"), x, 1, 1)?;
        if let Some(a) = after_first {
            if a.ne() != h.ne() {
                return Err(ModelError::Input(format!("a hint of {:?} for input_blocks.0's output of {:?}", a.ne(), h.ne())));
            }
            h = ctx.add(h, a)?;
        }
        let gn = motion.and_then(Motion::norm_frames);
        let mut skips = vec![h];
        // The motion module slot of each res/attention pair: (level, pair within it).
        let (mut level, mut pair) = (0, 0);
        for blk in &c.input_blocks {
            let i = blk.index;
            h = match blk.kind {
                BlockKind::Down { .. } => {
                    (level, pair) = (level + 1, 0);
                    conv2d(ctx, w, &self.n(&format!("input_blocks.{i}.0.op")), h, 2, 1)?
                }
                BlockKind::Res { transformer_depth, .. } => {
                    let mut h = self.res_block(ctx, &format!("input_blocks.{i}.0"), h, emb, gn)?;
                    if transformer_depth > 0 {
                        h = self.transformer(ctx, &format!("input_blocks.{i}.1"), h, context, transformer_depth, ip, gn)?;
                    }
                    pair += 1;
                    Motion::apply(motion, ctx, Slot::Down(level, pair - 1), h)?
                }
            };
            skips.push(h);
        }
        h = self.res_block(ctx, "middle_block.0", h, emb, gn)?;
        if c.middle_depth > 0 {
            h = self.transformer(ctx, "middle_block.1", h, context, c.middle_depth, ip, gn)?;
            h = Motion::apply(motion, ctx, Slot::Mid, h)?;
            h = self.res_block(ctx, "middle_block.2", h, emb, gn)?;
        } else {
            h = Motion::apply(motion, ctx, Slot::Mid, h)?;
            h = self.res_block(ctx, "middle_block.1", h, emb, gn)?;
        }
        Ok((skips, h))
    }

    /// The model output (ε or v, as trained) for latents `x` [W, H, Cin, N] at
    /// timesteps `t` [N] (f32) with text conditioning `context` [Dc, Tc, N].
    pub fn forward<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>, t: Tensor<'a>, context: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        self.forward_with(ctx, x, t, context, &UnetExtras::default())
    }

    /// [`Unet::forward`] with the inputs some UNets need or some features add.
    pub fn forward_with<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>, t: Tensor<'a>, context: Tensor<'a>, extras: &UnetExtras<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        self.check_inputs(x, t, context)?;
        let emb = self.embed(ctx, t, extras.y)?;
        let b = x.ne()[3];
        for (i, a) in extras.ip.iter().enumerate() {
            let [width, _, n, _] = a.tokens.ne();
            if width != c.context_dim || n != b {
                return Err(ModelError::Input(format!("IP-Adapter {i}: image tokens {:?} for a batch of {b} and {}-wide cross-attention", a.tokens.ne(), c.context_dim)));
            }
        }
        let ip = IpLayers::new(&extras.ip, c);
        if let Some(m) = &extras.motion {
            c.check_motion(&m.modules.config)?;
        }
        let (mut skips, mut h) = self.encode(ctx, x, emb, context, None, &ip, extras.motion.as_ref())?;
        if let Some(control) = &extras.control {
            // ldm's apply_control: the middle residual onto the middle block's output,
            // each skip residual onto its skip (taken when popped, the same thing).
            if control.skips.len() != skips.len() {
                return Err(ModelError::Input(format!("{} ControlNet residuals for {} skip connections", control.skips.len(), skips.len())));
            }
            for (s, r) in skips.iter_mut().chain(std::iter::once(&mut h)).zip(control.skips.iter().chain(std::iter::once(&control.middle))) {
                if s.ne() != r.ne() {
                    return Err(ModelError::Input(format!("a ControlNet residual of {:?} for a UNet activation of {:?}", r.ne(), s.ne())));
                }
                *s = ctx.add(*s, *r)?;
            }
        }
        let w = self.w;
        let gn = extras.motion.as_ref().and_then(Motion::norm_frames);
        let (mut level, mut pair) = (0, 0);
        for blk in &c.output_blocks {
            let i = blk.index;
            let BlockKind::Res { transformer_depth, upsample, .. } = blk.kind else { continue };
            let skip = skips.pop().ok_or_else(|| ModelError::Config("more output blocks than skips".into()))?;
            h = ctx.concat(h, skip, 2)?;
            h = self.res_block(ctx, &format!("output_blocks.{i}.0"), h, emb, gn)?;
            if transformer_depth > 0 {
                h = self.transformer(ctx, &format!("output_blocks.{i}.1"), h, context, transformer_depth, &ip, gn)?;
            }
            h = Motion::apply(extras.motion.as_ref(), ctx, Slot::Up(level, pair), h)?;
            pair += 1;
            if upsample {
                (level, pair) = (level + 1, 0);
                let at = if transformer_depth > 0 { 2 } else { 1 };
                // Up to the size of the skip the next block takes, as ComfyUI and diffusers
                // do: sides that were odd before a downsample come back exactly.
                let [tw, th, ..] = skips.last().map_or([h.ne()[0] * 2, h.ne()[1] * 2, 0, 0], |s| s.ne());
                let [_, _, hc, hb] = h.ne();
                h = ctx.interpolate(h, [tw, th, hc, hb], ScaleMode::Nearest)?;
                h = conv2d(ctx, w, &self.n(&format!("output_blocks.{i}.{at}.conv")), h, 1, 1)?;
            }
        }
        let h = ctx.silu(group_norm_over(ctx, w, &self.n("out.0"), h, GROUPS, 1e-5, gn)?)?;
        conv2d(ctx, w, &self.n("out.2"), h, 1, 1)
    }
}

/// Where each transformer block's cross-attention finds its IP-Adapter weights.
pub(crate) struct IpLayers<'e, 'a> {
    adapters: &'e [IpAttention<'a>],
    /// Block name (`input_blocks.1.1.transformer_blocks.0`, no prefix) → N of `ip_adapter.N`.
    index: std::collections::HashMap<String, usize>,
}

impl<'e, 'a> IpLayers<'e, 'a> {
    pub(crate) fn new(adapters: &'e [IpAttention<'a>], config: &UnetConfig) -> Self {
        let index = match adapters.is_empty() {
            true => Default::default(),
            false => super::ip_adapter::cross_attention_blocks(config).into_iter().enumerate().map(|(k, (name, _))| (name, 2 * k + 1)).collect(),
        };
        IpLayers { adapters, index }
    }

    fn layer(&self, block: &str) -> Option<IpLayer<'e, 'a>> {
        if self.adapters.is_empty() {
            return None;
        }
        self.index.get(block).map(|&index| IpLayer { adapters: self.adapters, index })
    }
}
