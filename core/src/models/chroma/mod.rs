//! Chroma: FLUX.1 schnell's double- and single-stream blocks without their modulation
//! layers, modulated instead by a "distilled guidance" approximator — an MLP that maps (σ,
//! guidance 0, block slot) to every block's shift/scale/gate vectors — reading T5-XXL alone,
//! whose padding past the prompt (and one pad token) is masked out of the attention. BFL's
//! key layout (`distilled_guidance_layer.*`, `double_blocks.N.img_attn.qkv`, ...), bare or
//! under `model.diffusion_model.`; denoised through [`crate::models::flux::FluxDenoiser`].

use super::dit::{self, rope};
use super::flux::blocks::{block_dims, count, Blocks, Rope};
use super::nn::{expect_linear, linear};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GType, GraphRun, Tensor};

/// The weight that tells a FLUX-style file holds Chroma, relative to its prefix.
pub const MARKER: &str = "distilled_guidance_layer.in_proj.weight";

#[derive(Clone, Debug, PartialEq)]
pub struct ChromaConfig {
    pub in_channels: i64,
    pub out_channels: i64,
    pub hidden: i64,
    pub heads: i64,
    pub mlp_hidden: i64,
    pub context: i64,
    pub depth: usize,
    pub depth_single: usize,
    /// The approximator's input width (64: three sinusoids of 16, 16 and 32), hidden width
    /// and residual layers.
    pub approx_in: i64,
    pub approx_hidden: i64,
    pub approx_layers: usize,
    /// Head sections of the rotary embedding per position axis (FLUX's 16, 56, 56).
    pub axes: Vec<usize>,
    pub theta: f64,
}

impl ChromaConfig {
    /// Read the dimensions off the weights under `prefix`.
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!("not a Chroma model: no `{}`", at(MARKER))));
        }
        let d = block_dims(w, prefix)?;
        let approx = w.get(&at(MARKER))?.ne();
        Ok(ChromaConfig {
            in_channels: d.in_channels,
            out_channels: d.out_channels,
            hidden: d.hidden,
            heads: d.heads,
            mlp_hidden: d.mlp_hidden,
            context: d.context,
            depth: d.depth,
            depth_single: d.depth_single,
            approx_in: approx[0],
            approx_hidden: approx[1],
            approx_layers: count(w, prefix, "distilled_guidance_layer.layers", "in_layer.weight"),
            axes: vec![16, 56, 56],
            theta: 10_000.0,
        })
    }

    pub fn head_dim(&self) -> i64 {
        self.hidden / self.heads
    }

    /// Modulation vectors the approximator makes: 3 per single block, 6 per stream of each
    /// double block, 2 for the final layer.
    pub fn mod_slots(&self) -> usize {
        3 * self.depth_single + 12 * self.depth + 2
    }
}

/// The inputs of one evaluation.
pub struct ChromaInputs<'a, 'b> {
    /// Image tokens [in_channels, L, B].
    pub img: Tensor<'a>,
    pub img_ids: &'b [Vec<f32>],
    /// Seamless tiling: per image token, per position axis, the period its position
    /// wraps at (0: none), which rounds the rotary frequencies ([`rope::tables_wrapped`]);
    /// empty: no axis wraps.
    pub img_wrap: &'b [Vec<usize>],
    /// T5 tokens [context, Lt, B].
    pub txt: Tensor<'a>,
    pub txt_ids: &'b [Vec<f32>],
    /// σ and the guidance value (ComfyUI's Chroma: 0 unless FluxGuidance sets one), one
    /// for all sequences: the approximator's input is built from them.
    pub sigma: f32,
    pub guidance: f32,
    /// Text tokens the attention keeps as keys (the rest is masked padding); `None`: all.
    pub text_keys: Option<i64>,
    /// Blocks left out (skip-layer guidance).
    pub skip: &'b dit::SkipLayers,
}

pub struct Chroma<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: ChromaConfig,
}

impl<'w> Chroma<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: ChromaConfig) -> Result<Self> {
        let c = &config;
        let dh = c.head_dim();
        rope::check_axes(&c.axes, dh)?;
        if c.approx_in != 64 {
            return Err(ModelError::Config(format!("an approximator reading {} values; Chroma's reads 64", c.approx_in)));
        }
        let lin = |name: &str, i: i64, o: i64| expect_linear(w, &format!("{prefix}{name}"), i, o);
        let (d, m, a) = (c.hidden, c.mlp_hidden, c.approx_hidden);
        lin("img_in", c.in_channels, d)?;
        lin("txt_in", c.context, d)?;
        lin("distilled_guidance_layer.in_proj", c.approx_in, a)?;
        for i in 0..c.approx_layers {
            lin(&format!("distilled_guidance_layer.layers.{i}.in_layer"), a, a)?;
            lin(&format!("distilled_guidance_layer.layers.{i}.out_layer"), a, a)?;
            w.expect(&format!("{prefix}distilled_guidance_layer.norms.{i}.scale"), &[a])?;
        }
        lin("distilled_guidance_layer.out_proj", a, d)?;
        super::flux::blocks::expect_blocks(w, prefix, (d, m, dh), c.depth, c.depth_single, super::flux::blocks::Style::CHROMA)?;
        lin("final_layer.linear", d, c.out_channels)?;
        Ok(Chroma { w, prefix: prefix.to_string(), config })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The approximator's output [D, slots, 1]: every block's modulation vectors at σ.
    fn modulations<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, sigma: f32, guidance: f32) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let slots = c.mod_slots();
        let x = run.input_f32(&[c.approx_in, slots as i64, 1], approximator_input(sigma, guidance, slots))?;
        let at = |s: &str| self.name(&format!("distilled_guidance_layer.{s}"));
        let mut x = linear(ctx, self.w, &at("in_proj"), x)?;
        for i in 0..c.approx_layers {
            let h = ctx.mul(ctx.rms_norm(x, 1e-6)?, self.w.get(&at(&format!("norms.{i}.scale")))?)?;
            let h = ctx.silu(linear(ctx, self.w, &at(&format!("layers.{i}.in_layer")), h)?)?;
            x = ctx.add(x, linear(ctx, self.w, &at(&format!("layers.{i}.out_layer")), h)?)?;
        }
        linear(ctx, self.w, &at("out_proj"), x)
    }

    /// The model's output tokens [out_channels, L, B].
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, x: &ChromaInputs<'a, '_>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [fin, l, b, _] = x.img.ne();
        let [ctx_w, lt, bt, _] = x.txt.ne();
        if fin != c.in_channels || ctx_w != c.context || bt != b {
            return Err(ModelError::Input(format!("image tokens {:?} and text {:?} for a Chroma model of {} / {} features", x.img.ne(), x.txt.ne(), c.in_channels, c.context)));
        }
        if x.img_ids.len() as i64 != l || x.txt_ids.len() as i64 != lt || x.text_keys.is_some_and(|k| k < 1 || k > lt) {
            return Err(ModelError::Input(format!("{} image ids, {} text ids and {:?} text keys for {l} image and {lt} text tokens", x.img_ids.len(), x.txt_ids.len(), x.text_keys)));
        }
        let mods = self.modulations(ctx, run, x.sigma, x.guidance)?;
        // Slot j as [D, 1, 1], broadcasting over the sequence and the batch.
        let slot = |j: usize| dit::rows(ctx, mods, j as i64, 1);
        let slots = |from: usize, n: usize| (from..from + n).map(slot).collect::<Result<Vec<_>>>();
        let ids: Vec<Vec<f32>> = x.txt_ids.iter().chain(x.img_ids).cloned().collect();
        // Text positions never wrap.
        let wraps: Vec<Vec<usize>> = if x.img_wrap.is_empty() { Vec::new() } else { std::iter::repeat_n(vec![0; c.axes.len()], x.txt_ids.len()).chain(x.img_wrap.iter().cloned()).collect() };
        let (cos, sin) = rope::tables_wrapped(run, &ids, &wraps, &c.axes, c.theta, b as usize)?;
        let pe = Rope { cos, sin };
        let compute = self.w.get(&self.name("img_in.weight")).map_or(GType::F32, |t| t.dtype());
        let blk = Blocks { ctx, w: self.w, heads: c.heads, compute, text_keys: x.text_keys.map(|k| (lt, k)), mlp: super::flux::blocks::Mlp::GeluTanh };

        let mut img = linear(ctx, self.w, &self.name("img_in"), x.img)?;
        let mut txt = linear(ctx, self.w, &self.name("txt_in"), x.txt)?;
        let (img_at, txt_at) = (3 * c.depth_single, 3 * c.depth_single + 6 * c.depth);
        for i in (0..c.depth).filter(|i| !x.skip.double.contains(i)) {
            let (im, tm) = (slots(img_at + 6 * i, 6)?, slots(txt_at + 6 * i, 6)?);
            (img, txt) = blk.double(&self.name(&format!("double_blocks.{i}")), img, txt, &im, &tm, &pe)?;
        }
        let mut joint = ctx.concat(txt, img, 1)?;
        for i in (0..c.depth_single).filter(|i| !x.skip.single.contains(i)) {
            joint = blk.single(&self.name(&format!("single_blocks.{i}")), joint, &slots(3 * i, 3)?, &pe)?;
        }
        let img = dit::rows(ctx, joint, lt, l)?;
        let last = c.mod_slots();
        let img = dit::modulate(ctx, ctx.norm(img, 1e-6)?, slot(last - 2)?, slot(last - 1)?)?;
        linear(ctx, self.w, &self.name("final_layer.linear"), img)
    }
}

/// The approximator's input for each of `slots` slots: the sinusoids (cos, then sin) of
/// 1000·σ (16 wide), of 1000·guidance (16) and of 1000·slot (32), in f32 as torch computes
/// them — the slots' phases are large, so the f32 rounding is the model's.
pub fn approximator_input(sigma: f32, guidance: f32, slots: usize) -> Vec<f32> {
    let t = sinusoid(sigma * 1000.0, 16);
    let g = sinusoid(guidance * 1000.0, 16);
    (0..slots).flat_map(|k| t.iter().chain(&g).copied().chain(sinusoid(k as f32 * 1000.0, 32)).collect::<Vec<_>>()).collect()
}

/// `dim` sinusoids of `t`: cos then sin of t·10000^(−i/(dim/2)), in f32.
fn sinusoid(t: f32, dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let ln = -(10_000f64.ln() as f32);
    let args: Vec<f32> = (0..half).map(|i| t * ((ln * i as f32) / half as f32).exp()).collect();
    args.iter().map(|a| a.cos()).chain(args.iter().map(|a| a.sin())).collect()
}
