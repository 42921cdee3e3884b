//! FLUX.2 (klein 4B/9B, dev): FLUX.1's double- and single-stream blocks with one set of
//! modulations shared by all blocks of a kind (`double_stream_modulation_img/txt`,
//! `single_stream_modulation`), no biases, SwiGLU MLPs, and a four-axis rotary embedding
//! (time, row, column, text index) at θ 2000. BFL's key layout (what ComfyUI and sd.cpp
//! load), bare or under `model.diffusion_model.`.
//!
//! The model reads 128-wide tokens: the 32-channel VAE latent cut into 2×2 patches and
//! normalised per channel, one token per patch (the latent the sampler sees); text tokens
//! are an LLM's hidden states of three layers side by side (Qwen3's for klein, Mistral's
//! for dev). Timesteps are σ, embedded at 1000× as FLUX.1's.

pub mod denoiser;
pub mod diffusers;
pub mod latent;

pub use denoiser::{position_ids, Flux2Denoiser, Flux2Item};

use super::dit::{self, rope};
use super::flux::blocks::{self, expect_projection, Mlp, Style};
use super::nn::linear;
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GType, GraphRun, Tensor};

/// The weight that tells a file holds a FLUX.2 transformer, relative to its prefix
/// (sd.cpp's signature key).
pub const MARKER: &str = "double_stream_modulation_img.lin.weight";

#[derive(Clone, Debug, PartialEq)]
pub struct Flux2Config {
    /// Token width (128: the 32-channel latent's 2×2 patches).
    pub in_channels: i64,
    pub out_channels: i64,
    pub hidden: i64,
    pub heads: i64,
    /// The SwiGLU's hidden width (its first layer is twice this).
    pub mlp_hidden: i64,
    /// Width of the text tokens (three LLM layers: 7680 for Qwen3-4B).
    pub context: i64,
    pub depth: usize,
    pub depth_single: usize,
    /// dev embeds its distilled guidance; klein has no `guidance_in`.
    pub guidance_embed: bool,
    /// Head-dimension sections of the rotary embedding per position axis (time, row,
    /// column, text index); not stored in files: (32, 32, 32, 32) for the released models.
    pub axes: Vec<usize>,
    pub theta: f64,
}

/// The inputs of one evaluation.
pub struct Flux2Inputs<'a, 'b> {
    /// Image tokens [in_channels, L, B].
    pub img: Tensor<'a>,
    /// One position (time, row, column, index) per image token.
    pub img_ids: &'b [Vec<f32>],
    /// Text tokens [context, Lt, B].
    pub txt: Tensor<'a>,
    /// One position per text token.
    pub txt_ids: &'b [Vec<f32>],
    /// σ per sequence.
    pub timesteps: &'b [f32],
    /// The guidance scale per sequence (dev only; `None` leaves the embedding out).
    pub guidance: Option<&'b [f32]>,
}

/// A FLUX.2 transformer over [`Weights`] whose shapes have been checked.
pub struct Flux2<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: Flux2Config,
}

impl Flux2Config {
    /// Read the dimensions off the weights under `prefix` (`""` or `model.diffusion_model.`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a FLUX.2 transformer: no `{}`", at(MARKER))));
        }
        let d = blocks::block_dims(w, prefix)?;
        Ok(Flux2Config {
            in_channels: d.in_channels,
            out_channels: d.out_channels,
            hidden: d.hidden,
            heads: d.heads,
            // The first MLP layer holds the gate and the value.
            mlp_hidden: d.mlp_hidden / 2,
            context: d.context,
            depth: d.depth,
            depth_single: d.depth_single,
            guidance_embed: w.contains(&at("guidance_in.in_layer.weight")),
            axes: vec![32, 32, 32, 32],
            theta: 2000.0,
        })
    }

    pub fn head_dim(&self) -> i64 {
        self.hidden / self.heads
    }
}

impl<'w> Flux2<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: Flux2Config) -> Result<Self> {
        let c = &config;
        let dh = c.head_dim();
        rope::check_axes(&c.axes, dh)?;
        let lin = |name: &str, i: i64, o: i64| expect_projection(w, &format!("{prefix}{name}"), i, o, false);
        let d = c.hidden;
        lin("img_in", c.in_channels, d)?;
        lin("txt_in", c.context, d)?;
        let mut embedders = vec!["time_in"];
        if c.guidance_embed {
            embedders.push("guidance_in");
        }
        for name in embedders {
            lin(&format!("{name}.in_layer"), 256, d)?;
            lin(&format!("{name}.out_layer"), d, d)?;
        }
        lin("double_stream_modulation_img.lin", d, 6 * d)?;
        lin("double_stream_modulation_txt.lin", d, 6 * d)?;
        lin("single_stream_modulation.lin", d, 3 * d)?;
        blocks::expect_blocks(w, prefix, (d, c.mlp_hidden, dh), c.depth, c.depth_single, Style::FLUX2)?;
        lin("final_layer.linear", d, c.out_channels)?;
        lin("final_layer.adaLN_modulation.1", d, 2 * d)?;
        Ok(Flux2 { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The model's output tokens [out_channels, L, B] (the flow velocity).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: &Flux2Inputs<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [fin, l, b, _] = x.img.ne();
        let [ctx_w, lt, bt, _] = x.txt.ne();
        if fin != c.in_channels || ctx_w != c.context || bt != b {
            return Err(ModelError::Input(format!("image tokens {:?} and text {:?} for a FLUX.2 model of {} / {} features", x.img.ne(), x.txt.ne(), c.in_channels, c.context)));
        }
        blocks::check_ids(x.img_ids.len(), x.txt_ids.len(), x.timesteps.len(), (l, lt, b))?;
        let vec = ctx.silu(blocks::time_guidance(ctx, run, self.w, &self.prefix, x.timesteps, x.guidance, c.guidance_embed)?)?;
        let mods = |name: &str, n: usize| dit::chunks(ctx, linear(ctx, self.w, &self.name(name), vec)?, n);
        let (im, tm, sm) = (mods("double_stream_modulation_img.lin", 6)?, mods("double_stream_modulation_txt.lin", 6)?, mods("single_stream_modulation.lin", 3)?);

        let ids: Vec<Vec<f32>> = x.txt_ids.iter().chain(x.img_ids).cloned().collect();
        let (cos, sin) = rope::tables(run, &ids, &c.axes, c.theta, b as usize)?;
        let pe = blocks::Rope { cos, sin };
        let blk = blocks::Blocks { ctx, w: self.w, heads: c.heads, compute: self.compute_type(), text_keys: None, mlp: Mlp::SwiGlu };

        let mut img = linear(ctx, self.w, &self.name("img_in"), x.img)?;
        let mut txt = linear(ctx, self.w, &self.name("txt_in"), x.txt)?;
        for i in 0..c.depth {
            (img, txt) = blk.double(&self.name(&format!("double_blocks.{i}")), img, txt, &im, &tm, &pe)?;
        }
        let mut joint = ctx.concat(txt, img, 1)?;
        for i in 0..c.depth_single {
            joint = blk.single(&self.name(&format!("single_blocks.{i}")), joint, &sm, &pe)?;
        }
        blocks::last_layer(ctx, self.w, &self.prefix, dit::rows(ctx, joint, lt, l)?, vec)
    }

    /// The type the projections compute in: bf16 models may take the CPU's bf16 attention.
    fn compute_type(&self) -> GType {
        self.w.get(&self.name("double_blocks.0.img_attn.qkv.weight")).map_or(GType::F32, |t| t.dtype())
    }
}
