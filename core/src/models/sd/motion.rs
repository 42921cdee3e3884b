//! AnimateDiff's motion modules (Guo et al., 2023): temporal transformers that a frozen
//! SD1.5 UNet runs after each of its res/attention pairs, so that a batch of frames
//! attends along time and moves coherently.
//!
//! The modules live in their own file (`mm_sd_v15_v2.ckpt`, `v3_sd15_mm.ckpt`, …) in the
//! original names — `down_blocks.L.motion_modules.J.temporal_transformer.…`,
//! `up_blocks.…`, v2's `mid_block.motion_modules.0` — or diffusers' `MotionAdapter` names
//! (`…motion_modules.J.transformer_blocks.0.attn1…`); [`standalone_source`] shows both
//! under [`PREFIX`] in the original names.
//!
//! One module on x [W, H, C, k·F] (k batches of F frames, as a sampler batches the
//! sides of guidance): GroupNorm(32, eps 1e-6) per frame as the original code normalises
//! `(b f) c h w` (diffusers' port normalises over all frames instead), `proj_in`, one
//! block of two self-attentions along the F frames of every pixel — each on
//! LayerNorm(x) plus the sinusoidal table `pos_encoder.pe` — and a GEGLU feed-forward,
//! `proj_out`, and the input added back. Down-block modules follow each res/attention
//! pair (their output is the skip), up-block modules each pair before the upsampler,
//! v2's mid-block module sits between the middle block's attention and its second res
//! block.

use crate::io::{Assembled, Rows, TensorSource};
use crate::models::nn::{attention, geglu_ff, group_norm_over, layer_norm, linear};
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Context, Tensor};

/// Where [`standalone_source`] puts the modules.
pub const PREFIX: &str = "motion_module";

/// AnimateDiff's modules all have 8 heads.
const HEADS: i64 = 8;
const GROUPS: i32 = 32;

/// Where a module runs in the UNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// After the `j`-th res/attention pair of encoder level `level`.
    Down(usize, usize),
    /// Between the middle block's attention and its last res block.
    Mid,
    /// After the `j`-th res/attention pair of decoder level `level`, before its upsampler.
    Up(usize, usize),
}

impl Slot {
    pub(crate) fn name(self) -> String {
        match self {
            Slot::Down(l, j) => format!("{PREFIX}.down_blocks.{l}.motion_modules.{j}"),
            Slot::Mid => format!("{PREFIX}.mid_block.motion_modules.0"),
            Slot::Up(l, j) => format!("{PREFIX}.up_blocks.{l}.motion_modules.{j}"),
        }
    }
}

/// What a motion-module file holds, read off its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct MotionConfig {
    /// Every module, with its width.
    pub modules: Vec<(Slot, i64)>,
    /// Frames the positional table covers (24 for v1, 32 for v2 and v3): the most a
    /// module can take at once.
    pub max_frames: i64,
}

impl MotionConfig {
    /// The modules under [`PREFIX`] (names as [`standalone_source`] gives them).
    pub fn infer(w: &Weights) -> Result<Self> {
        let mut modules = Vec::new();
        for (side, up) in [("down_blocks", false), ("up_blocks", true)] {
            for l in 0.. {
                let count = (0..).take_while(|j| w.contains(&format!("{PREFIX}.{side}.{l}.motion_modules.{j}.temporal_transformer.proj_in.weight"))).count();
                if count == 0 {
                    break;
                }
                for j in 0..count {
                    let slot = if up { Slot::Up(l, j) } else { Slot::Down(l, j) };
                    modules.push((slot, width(w, slot)?));
                }
            }
        }
        if w.contains(&format!("{}.temporal_transformer.proj_in.weight", Slot::Mid.name())) {
            modules.push((Slot::Mid, width(w, Slot::Mid)?));
        }
        if modules.is_empty() {
            return Err(ModelError::Config(format!("no AnimateDiff motion modules (`{PREFIX}.down_blocks.0.motion_modules.0.*`)")));
        }
        let pe = format!("{}.temporal_transformer.transformer_blocks.0.attention_blocks.0.pos_encoder.pe", modules[0].0.name());
        let max_frames = w.get(&pe)?.ne()[1];
        Ok(MotionConfig { modules, max_frames })
    }

    /// The width of the module at `slot`, if the file has one there.
    pub fn at(&self, slot: Slot) -> Option<i64> {
        self.modules.iter().find(|(s, _)| *s == slot).map(|(_, c)| *c)
    }

    /// Whether the file has v2's mid-block module.
    pub fn has_mid(&self) -> bool {
        self.at(Slot::Mid).is_some()
    }

    /// AnimateDiff v1 (mm_sd_v14, mm_sd_v15): neither v2's mid-block module nor v3's
    /// 32-frame table — how AnimateDiff-Evolved tells them apart.
    pub fn is_v1(&self) -> bool {
        !self.has_mid() && self.max_frames != 32
    }

    /// Fails unless one video of `frames` frames fits the positional table (longer videos
    /// need AnimateDiff-Evolved's context windows, which sdflow does not have).
    pub fn check_frames(&self, frames: i64) -> Result<()> {
        if frames > self.max_frames {
            return Err(ModelError::Input(format!("a video of {frames} frames: the motion module takes at most {} at once (context windows are not implemented)", self.max_frames)));
        }
        Ok(())
    }
}

fn width(w: &Weights, slot: Slot) -> Result<i64> {
    Ok(w.get(&format!("{}.temporal_transformer.proj_in.weight", slot.name()))?.ne()[0])
}

/// The motion modules of one file.
pub struct MotionModules<'w> {
    w: &'w Weights,
    pub config: MotionConfig,
}

impl<'w> MotionModules<'w> {
    /// Checks every module's weights against its width.
    pub fn new(w: &'w Weights, config: MotionConfig) -> Result<Self> {
        for &(slot, c) in &config.modules {
            let n = slot.name() + ".temporal_transformer";
            if c % GROUPS as i64 != 0 || c % HEADS != 0 {
                return Err(ModelError::Config(format!("{n}: {c} channels do not split into {GROUPS} groups and {HEADS} heads")));
            }
            let lin = |name: String, cin: i64, cout: i64, bias: bool| -> Result<()> {
                w.expect(&format!("{name}.weight"), &[cin, cout])?;
                if bias {
                    w.expect(&format!("{name}.bias"), &[cout])?;
                }
                Ok(())
            };
            let norm = |name: String| -> Result<()> {
                w.expect(&format!("{name}.weight"), &[c])?;
                w.expect(&format!("{name}.bias"), &[c]).map(|_| ())
            };
            norm(format!("{n}.norm"))?;
            lin(format!("{n}.proj_in"), c, c, true)?;
            lin(format!("{n}.proj_out"), c, c, true)?;
            let b = format!("{n}.transformer_blocks.0");
            for a in 0..2 {
                let at = format!("{b}.attention_blocks.{a}");
                for p in ["to_q", "to_k", "to_v"] {
                    lin(format!("{at}.{p}"), c, c, false)?;
                }
                lin(format!("{at}.to_out.0"), c, c, true)?;
                w.expect(&format!("{at}.pos_encoder.pe"), &[c, config.max_frames, 1])?;
                norm(format!("{b}.norms.{a}"))?;
            }
            norm(format!("{b}.ff_norm"))?;
            let inner = w.get(&format!("{b}.ff.net.2.weight"))?.ne()[0];
            lin(format!("{b}.ff.net.0.proj"), c, 2 * inner, true)?;
            lin(format!("{b}.ff.net.2"), inner, c, true)?;
            if w.contains(&format!("{n}.transformer_blocks.1.norms.0.weight")) {
                return Err(ModelError::Config(format!("{n}: more than one transformer block per module (not an SD1.5 motion module)")));
            }
        }
        Ok(MotionModules { w, config })
    }

    /// The module at `slot` on x [W, H, C, k·frames]; x as is where the file has no
    /// module there. `gn`: its GroupNorm over each video's frames together (v1 as
    /// AnimateDiff-Evolved runs it) instead of per frame.
    pub fn apply<'a>(&'a self, ctx: &'a Context, slot: Slot, x: Tensor<'a>, frames: i64, gn: Option<i64>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        if self.config.at(slot).is_none() {
            return Ok(x);
        }
        let (w, n) = (self.w, slot.name() + ".temporal_transformer");
        let [wd, ht, c, b] = x.ne();
        if frames < 1 || b % frames != 0 {
            return Err(ModelError::Input(format!("a batch of {b} latents is not a whole number of {frames}-frame videos")));
        }
        self.config.check_frames(frames)?;
        let videos = b / frames;
        let h = group_norm_over(ctx, w, &format!("{n}.norm"), x, GROUPS, 1e-6, gn)?;
        // [W·H, C, F, k] → [C, F, W·H, k]: each pixel's frames one sequence.
        let h = ctx.reshape(h, [wd * ht, c, frames, videos])?;
        let h = ctx.cont(ctx.permute(h, [2, 0, 1, 3])?)?;
        let h = ctx.reshape(h, [c, frames, wd * ht * videos, 1])?;
        let mut h = linear(ctx, w, &format!("{n}.proj_in"), h)?;
        let blk = format!("{n}.transformer_blocks.0");
        for a in 0..2 {
            let at = format!("{blk}.attention_blocks.{a}");
            let pe = w.get(&format!("{at}.pos_encoder.pe"))?;
            let nb = pe.nb();
            let pe = ctx.view(pe, [c, frames, 1, 1], [nb[1], nb[2], nb[3]], 0)?;
            let t = ctx.add(layer_norm(ctx, w, &format!("{blk}.norms.{a}"), h, 1e-5)?, pe)?;
            let q = linear(ctx, w, &format!("{at}.to_q"), t)?;
            let k = linear(ctx, w, &format!("{at}.to_k"), t)?;
            let v = linear(ctx, w, &format!("{at}.to_v"), t)?;
            let o = linear(ctx, w, &format!("{at}.to_out.0"), attention(ctx, q, k, v, HEADS, None)?)?;
            h = ctx.add(h, o)?;
        }
        let t = layer_norm(ctx, w, &format!("{blk}.ff_norm"), h, 1e-5)?;
        h = ctx.add(h, geglu_ff(ctx, w, &format!("{blk}.ff"), t)?)?;
        let h = linear(ctx, w, &format!("{n}.proj_out"), h)?;
        let h = ctx.reshape(h, [c, frames, wd * ht, videos])?;
        let h = ctx.cont(ctx.permute(h, [1, 2, 0, 3])?)?;
        let h = ctx.reshape(h, [wd, ht, c, b])?;
        Ok(ctx.add(x, h)?)
    }
}

/// A motion-module file as a source whose tensors sit under [`PREFIX`] in the original
/// names, whichever of the known layouts it has (original, optionally under
/// `motion_module.` or `model.diffusion_model.motion_module.`; diffusers' MotionAdapter).
pub fn standalone_source(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let shown = src.path().display().to_string();
    let marker = ".motion_modules.0.";
    let diffusers = src.tensors().iter().any(|t| t.name.contains(marker) && t.name.contains(".transformer_blocks.0.attn1."));
    if !src.tensors().iter().any(|t| t.name.contains(marker)) {
        return Err(ModelError::Config(format!("{shown}: not an AnimateDiff motion module (no `down_blocks.N.motion_modules.N.*` tensors)")));
    }
    let mut plan = Vec::new();
    for t in src.tensors() {
        let Some(at) = ["down_blocks.", "up_blocks.", "mid_block."].iter().filter_map(|p| t.name.find(p)).min() else { continue };
        let bare = &t.name[at..];
        if !bare.contains(".motion_modules.") {
            continue;
        }
        let rows = vec![Rows::all(t)];
        match (diffusers, bare.strip_suffix(".pos_embed.pe")) {
            // diffusers keeps one positional table per block; the original one per attention.
            (true, Some(block)) => {
                let block = original_name(&format!("{block}.x")).map(|n| n.trim_end_matches(".x").to_string());
                let Some(block) = block else { continue };
                for a in 0..2 {
                    plan.push((format!("{PREFIX}.{block}.attention_blocks.{a}.pos_encoder.pe"), rows.clone()));
                }
            }
            (true, None) => {
                if let Some(n) = original_name(bare) {
                    plan.push((format!("{PREFIX}.{n}"), rows));
                }
            }
            (false, _) => plan.push((format!("{PREFIX}.{bare}"), rows)),
        }
    }
    let renamed = Assembled::new(src, plan).map_err(|detail| ModelError::Config(format!("{shown}: {detail}")))?;
    Ok(Box::new(renamed))
}

/// diffusers' MotionAdapter name (from `down_blocks.`/`up_blocks.`/`mid_block.`) in the
/// original layout: the inverse of diffusers' `convert_motion_module`.
fn original_name(n: &str) -> Option<String> {
    let (head, rest) = n.split_once(".motion_modules.")?;
    let (j, rest) = rest.split_once('.')?;
    let rest = rest
        .replace("attn1.", "attention_blocks.0.")
        .replace("attn2.", "attention_blocks.1.")
        .replace("norm1.", "norms.0.")
        .replace("norm2.", "norms.1.")
        .replace("norm3.", "ff_norm.");
    Some(format!("{head}.motion_modules.{j}.temporal_transformer.{rest}"))
}
