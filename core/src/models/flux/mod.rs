//! FLUX.1 (dev, schnell, and their Fill / Kontext variants): the MMDiT of double-stream
//! blocks (image and text with their own weights, one joint attention) followed by
//! single-stream blocks over the joined sequence, in BFL's key layout (what ComfyUI and
//! sd.cpp load: `double_blocks.N.img_attn.qkv`, `single_blocks.N.linear1`, ...), bare or
//! under `model.diffusion_model.`.
//!
//! The model sees 2×2 patches of the 16-channel latent as 64-wide tokens
//! ([`crate::models::dit::patchify`]), timesteps as σ ∈ [0, 1] and guidance as the
//! distilled guidance scale; both are embedded at 1000× as BFL's `timestep_embedding` does.

pub(crate) mod blocks;
pub mod denoiser;
pub mod diffusers;

pub use denoiser::{fill_concat, reference_tokens, FluxDenoiser, FluxItem, DEFAULT_GUIDANCE, LATENT_SCALE, LATENT_SHIFT};

use super::dit::{self, mlp_embedder, rope};
use super::nn::{expect_linear, linear};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GType, GraphRun, Tensor};

/// The weight that tells a file holds a FLUX.1 transformer, relative to its prefix.
pub const MARKER: &str = "double_blocks.0.img_attn.qkv.weight";

#[derive(Clone, Debug, PartialEq)]
pub struct FluxConfig {
    /// Token width the model reads: 64 (16 channels × 2×2), 384 for Fill.
    pub in_channels: i64,
    pub out_channels: i64,
    pub hidden: i64,
    pub heads: i64,
    pub mlp_hidden: i64,
    /// Width of the text tokens (T5-XXL: 4096).
    pub context: i64,
    /// Width of the pooled text vector (CLIP-L: 768).
    pub vector: i64,
    pub depth: usize,
    pub depth_single: usize,
    /// dev: the distilled guidance scale is embedded; schnell has no `guidance_in`.
    pub guidance_embed: bool,
    /// Head-dimension sections of the rotary embedding per position axis (index, row,
    /// column); sums to the head width. Not stored in files: (16, 56, 56) for every
    /// released FLUX.1.
    pub axes: Vec<usize>,
    pub theta: f64,
}

/// The inputs of one evaluation.
pub struct FluxInputs<'a, 'b> {
    /// Image tokens [in_channels, L, B].
    pub img: Tensor<'a>,
    /// One position (index, row, column) per image token.
    pub img_ids: &'b [Vec<f32>],
    /// Seamless tiling: per image token, per position axis, the period its position
    /// wraps at (0: none), which rounds the rotary frequencies ([`rope::tables_wrapped`]);
    /// empty: no axis wraps.
    pub img_wrap: &'b [Vec<usize>],
    /// Text tokens [context, Lt, B].
    pub txt: Tensor<'a>,
    /// One position per text token (zeros for FLUX.1).
    pub txt_ids: &'b [Vec<f32>],
    /// σ per sequence.
    pub timesteps: &'b [f32],
    /// The guidance scale per sequence (dev only; `None` leaves the embedding out).
    pub guidance: Option<&'b [f32]>,
    /// The pooled text vector [vector, B].
    pub y: Tensor<'a>,
    /// Blocks left out (skip-layer guidance).
    pub skip: &'b dit::SkipLayers,
}

/// A FLUX.1 transformer over [`Weights`] whose shapes have been checked.
pub struct Flux<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: FluxConfig,
}

impl FluxConfig {
    /// Read the dimensions off the weights under `prefix` (`""` or `model.diffusion_model.`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a FLUX.1 transformer: no `{}`", at(MARKER))));
        }
        let d = blocks::block_dims(w, prefix)?;
        Ok(FluxConfig {
            in_channels: d.in_channels,
            out_channels: d.out_channels,
            hidden: d.hidden,
            heads: d.heads,
            mlp_hidden: d.mlp_hidden,
            context: d.context,
            vector: w.get(&at("vector_in.in_layer.weight"))?.ne()[0],
            depth: d.depth,
            depth_single: d.depth_single,
            guidance_embed: w.contains(&at("guidance_in.in_layer.weight")),
            axes: vec![16, 56, 56],
            theta: 10_000.0,
        })
    }

    pub fn head_dim(&self) -> i64 {
        self.hidden / self.heads
    }
}

impl<'w> Flux<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: FluxConfig) -> Result<Self> {
        let c = &config;
        let dh = c.head_dim();
        rope::check_axes(&c.axes, dh)?;
        let lin = |name: &str, i: i64, o: i64| expect_linear(w, &format!("{prefix}{name}"), i, o);
        let (d, m) = (c.hidden, c.mlp_hidden);
        lin("img_in", c.in_channels, d)?;
        lin("txt_in", c.context, d)?;
        let mut embedders = vec![("time_in", 256), ("vector_in", c.vector)];
        if c.guidance_embed {
            embedders.push(("guidance_in", 256));
        }
        for (name, n_in) in embedders {
            lin(&format!("{name}.in_layer"), n_in, d)?;
            lin(&format!("{name}.out_layer"), d, d)?;
        }
        blocks::expect_blocks(w, prefix, (d, m, dh), c.depth, c.depth_single, blocks::Style::FLUX)?;
        lin("final_layer.linear", d, c.out_channels)?;
        lin("final_layer.adaLN_modulation.1", d, 2 * d)?;
        Ok(Flux { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The model's output tokens [out_channels, L, B] (the flow velocity, patchified).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: &FluxInputs<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [fin, l, b, _] = x.img.ne();
        let [ctx_w, lt, bt, _] = x.txt.ne();
        if fin != c.in_channels || ctx_w != c.context || bt != b || x.y.ne() != [c.vector, b, 1, 1] {
            return Err(ModelError::Input(format!(
                "image tokens {:?}, text {:?} and vector {:?} for a FLUX.1 model of {} / {} / {} features",
                x.img.ne(),
                x.txt.ne(),
                x.y.ne(),
                c.in_channels,
                c.context,
                c.vector
            )));
        }
        blocks::check_ids(x.img_ids.len(), x.txt_ids.len(), x.timesteps.len(), (l, lt, b))?;
        let vec = blocks::time_guidance(ctx, run, self.w, &self.prefix, x.timesteps, x.guidance, c.guidance_embed)?;
        let vec = ctx.add(vec, mlp_embedder(ctx, self.w, &self.name("vector_in"), x.y)?)?;
        let vec = ctx.silu(vec)?;

        let ids: Vec<Vec<f32>> = x.txt_ids.iter().chain(x.img_ids).cloned().collect();
        // Text positions never wrap.
        let wraps: Vec<Vec<usize>> = if x.img_wrap.is_empty() { Vec::new() } else { std::iter::repeat_n(vec![0; c.axes.len()], x.txt_ids.len()).chain(x.img_wrap.iter().cloned()).collect() };
        let (cos, sin) = rope::tables_wrapped(run, &ids, &wraps, &c.axes, c.theta, b as usize)?;
        let pe = blocks::Rope { cos, sin };
        let blk = blocks::Blocks { ctx, w: self.w, heads: c.heads, compute: self.compute_type(), text_keys: None, mlp: blocks::Mlp::GeluTanh };

        let mut img = linear(ctx, self.w, &self.name("img_in"), x.img)?;
        let mut txt = linear(ctx, self.w, &self.name("txt_in"), x.txt)?;
        for i in (0..c.depth).filter(|i| !x.skip.double.contains(i)) {
            let p = self.name(&format!("double_blocks.{i}"));
            let (im, tm) = blk.double_mods(&p, vec)?;
            (img, txt) = blk.double(&p, img, txt, &im, &tm, &pe)?;
        }
        let mut joint = ctx.concat(txt, img, 1)?;
        for i in (0..c.depth_single).filter(|i| !x.skip.single.contains(i)) {
            let p = self.name(&format!("single_blocks.{i}"));
            joint = blk.single(&p, joint, &blk.single_mods(&p, vec)?, &pe)?;
        }
        blocks::last_layer(ctx, self.w, &self.prefix, dit::rows(ctx, joint, lt, l)?, vec)
    }

    /// The type the projections compute in: bf16 models may take the CPU's bf16 attention.
    fn compute_type(&self) -> GType {
        self.w.get(&self.name(MARKER)).map_or(GType::F32, |t| t.dtype())
    }
}
