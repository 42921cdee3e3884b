//! SD3 / SD3.5 (medium, large, large turbo): the MMDiT of joint blocks, each with its own
//! weights for the text (`context_block`) and image (`x_block`) streams and one attention
//! over both, in Stability's key layout (what ComfyUI and sd.cpp load:
//! `joint_blocks.N.x_block.attn.qkv`, `x_embedder.proj`, `pos_embed`, ...), bare or under
//! `model.diffusion_model.`.
//!
//! SD3.5 adds RMS q/k norms (`attn.ln_q`, `attn.ln_k`); SD3.5 medium is MMDiT-X, whose first
//! image blocks carry a second, image-only self-attention (`x_block.attn2`). Positions are a
//! fixed 2-D sin-cos table stored in the file and cropped around its centre to the latent.

mod blocks;
pub mod denoiser;
pub mod diffusers;

pub use denoiser::{Sd3Denoiser, Sd3Item, LATENT_SCALE, LATENT_SHIFT};

use super::nn::{expect_linear, linear};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GType, GraphRun, Tensor};

/// The weight that tells a file holds an MMDiT, relative to its prefix.
pub const MARKER: &str = "joint_blocks.0.x_block.attn.qkv.weight";

#[derive(Clone, Debug, PartialEq)]
pub struct Sd3Config {
    /// Latent channels in and out (16).
    pub in_channels: i64,
    pub out_channels: i64,
    /// Side of the square patches (2).
    pub patch: i64,
    pub hidden: i64,
    pub heads: i64,
    pub mlp_hidden: i64,
    /// Width of the text tokens (4096: CLIP-L|G zero-padded, T5-XXL).
    pub context: i64,
    /// Width of the pooled vector (2048: CLIP-L and CLIP-G's).
    pub pooled: i64,
    pub depth: usize,
    /// Side of the stored position table, in patches.
    pub pos_embed_max: i64,
    /// SD3.5: RMS norms on q and k.
    pub qk_norm: bool,
    /// MMDiT-X: the blocks whose image stream has the second self-attention.
    pub self_attn_blocks: Vec<usize>,
}

/// The inputs of one evaluation.
pub struct Sd3Inputs<'a, 'b> {
    /// Image patches [C·p·p, L, B] (see [`crate::models::dit::patchify`]) of a latent
    /// `rows` × `cols` patches large.
    pub img: Tensor<'a>,
    pub rows: i64,
    pub cols: i64,
    /// Text tokens [context, Lt, B].
    pub txt: Tensor<'a>,
    /// σ per sequence (the model is told 1000·σ).
    pub timesteps: &'b [f32],
    /// The pooled vector [pooled, B].
    pub y: Tensor<'a>,
    /// Joint blocks left out (skip-layer guidance): both streams pass them unchanged.
    /// Indices past the last block leave nothing out, as in ComfyUI and sd.cpp (SD3.5's
    /// advised 7, 8, 9 name blocks every release has).
    pub skip: &'b [usize],
}

/// An MMDiT over [`Weights`] whose shapes have been checked.
pub struct Sd3<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: Sd3Config,
}

impl Sd3Config {
    /// Read the dimensions off the weights under `prefix` (`""` or `model.diffusion_model.`).
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let at = |s: &str| format!("{prefix}{s}");
        if !w.contains(&at(MARKER)) {
            return Err(ModelError::Config(format!(
                "not an SD3 MMDiT: no `{}`",
                at(MARKER)
            )));
        }
        let proj = w.get(&at("x_embedder.proj.weight"))?.ne();
        let (patch, in_channels, hidden) = (proj[0], proj[2], proj[3]);
        let depth = (0..)
            .take_while(|i| w.contains(&at(&format!("joint_blocks.{i}.x_block.attn.qkv.weight"))))
            .count();
        let qk_norm = w.contains(&at("joint_blocks.0.x_block.attn.ln_q.weight"));
        // ComfyUI and sd.cpp: as many heads as blocks (64 wide in every release); the q/k
        // norms, where present, say the head width outright.
        let heads = if qk_norm {
            hidden / w.get(&at("joint_blocks.0.x_block.attn.ln_q.weight"))?.ne()[0].max(1)
        } else {
            depth as i64
        };
        if heads < 1 || hidden % heads != 0 {
            return Err(ModelError::Config(format!(
                "{heads} heads do not divide the width {hidden}"
            )));
        }
        let positions = w.get(&at("pos_embed"))?.ne()[1];
        let pos_embed_max = (positions as f64).sqrt().round() as i64;
        if pos_embed_max * pos_embed_max != positions {
            return Err(ModelError::Weight {
                name: at("pos_embed"),
                detail: format!("{positions} positions is not a square grid"),
            });
        }
        let out = w.get(&at("final_layer.linear.weight"))?.ne()[1];
        if patch < 1 || out % (patch * patch) != 0 {
            return Err(ModelError::Config(format!(
                "final layer of {out} features for {patch}×{patch} patches"
            )));
        }
        Ok(Sd3Config {
            in_channels,
            out_channels: out / (patch * patch),
            patch,
            hidden,
            heads,
            mlp_hidden: w.get(&at("joint_blocks.0.x_block.mlp.fc1.weight"))?.ne()[1],
            context: w.get(&at("context_embedder.weight"))?.ne()[0],
            pooled: w.get(&at("y_embedder.mlp.0.weight"))?.ne()[0],
            depth,
            pos_embed_max,
            qk_norm,
            self_attn_blocks: (0..depth)
                .filter(|i| w.contains(&at(&format!("joint_blocks.{i}.x_block.attn2.qkv.weight"))))
                .collect(),
        })
    }

    pub fn head_dim(&self) -> i64 {
        self.hidden / self.heads
    }
}

impl<'w> Sd3<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: Sd3Config) -> Result<Self> {
        let c = &config;
        let (d, m, dh, p) = (c.hidden, c.mlp_hidden, c.head_dim(), c.patch);
        if c.depth == 0 {
            return Err(ModelError::Config("an MMDiT without joint blocks".into()));
        }
        let at = |s: String| format!("{prefix}{s}");
        let lin = |name: String, i: i64, o: i64| expect_linear(w, &at(name), i, o);
        w.expect(
            &at("x_embedder.proj.weight".into()),
            &[p, p, c.in_channels, d],
        )?;
        w.expect(&at("x_embedder.proj.bias".into()), &[d])?;
        w.expect(
            &at("pos_embed".into()),
            &[d, c.pos_embed_max * c.pos_embed_max, 1],
        )?;
        lin("context_embedder".into(), c.context, d)?;
        lin("t_embedder.mlp.0".into(), 256, d)?;
        lin("t_embedder.mlp.2".into(), d, d)?;
        lin("y_embedder.mlp.0".into(), c.pooled, d)?;
        lin("y_embedder.mlp.2".into(), d, d)?;
        let attn = |name: String, proj: bool| -> Result<()> {
            lin(format!("{name}.qkv"), d, 3 * d)?;
            if proj {
                lin(format!("{name}.proj"), d, d)?;
            }
            if c.qk_norm {
                w.expect(&at(format!("{name}.ln_q.weight")), &[dh])?;
                w.expect(&at(format!("{name}.ln_k.weight")), &[dh])?;
            }
            Ok(())
        };
        for i in 0..c.depth {
            for s in ["x_block", "context_block"] {
                let b = format!("joint_blocks.{i}.{s}");
                // The last text block only feeds the last attention (`pre_only`).
                let pre_only = s == "context_block" && i + 1 == c.depth;
                let x2 = s == "x_block" && c.self_attn_blocks.contains(&i);
                attn(format!("{b}.attn"), !pre_only)?;
                if x2 {
                    attn(format!("{b}.attn2"), true)?;
                }
                if !pre_only {
                    lin(format!("{b}.mlp.fc1"), d, m)?;
                    lin(format!("{b}.mlp.fc2"), m, d)?;
                }
                let chunks = if pre_only {
                    2
                } else if x2 {
                    9
                } else {
                    6
                };
                lin(format!("{b}.adaLN_modulation.1"), d, chunks * d)?;
            }
        }
        lin("final_layer.linear".into(), d, p * p * c.out_channels)?;
        lin("final_layer.adaLN_modulation.1".into(), d, 2 * d)?;
        Ok(Sd3 {
            w,
            prefix: prefix.to_string(),
            config,
        })
    }

    fn name(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    /// The model's output [p·p·C, L, B]: the flow velocity per patch, each patch's
    /// features in (row, column, channel) order (see [`crate::models::dit::unpatchify_hwc`]).
    pub fn forward<'a>(
        &'a self,
        ctx: &'a Context,
        run: &mut GraphRun<'a>,
        x: &Sd3Inputs<'a, '_>,
    ) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let (p, d) = (c.patch, c.hidden);
        let [fin, l, b, _] = x.img.ne();
        let [ctx_w, _, bt, _] = x.txt.ne();
        if fin != c.in_channels * p * p
            || ctx_w != c.context
            || bt != b
            || x.y.ne() != [c.pooled, b, 1, 1]
            || l != x.rows * x.cols
        {
            return Err(ModelError::Input(format!(
                "image patches {:?} ({}×{}), text {:?} and pooled {:?} for an MMDiT of {} / {} / {} features",
                x.img.ne(),
                x.rows,
                x.cols,
                x.txt.ne(),
                x.y.ne(),
                c.in_channels * p * p,
                c.context,
                c.pooled
            )));
        }
        if x.rows > c.pos_embed_max || x.cols > c.pos_embed_max {
            return Err(ModelError::Input(format!(
                "a latent of {}×{} patches; this model's positions reach {} (at most {} pixels a side)",
                x.rows,
                x.cols,
                c.pos_embed_max,
                c.pos_embed_max * p * 8
            )));
        }
        if x.timesteps.len() as i64 != b {
            return Err(ModelError::Input(format!(
                "{} timesteps for {b} sequences",
                x.timesteps.len()
            )));
        }
        let w = self.w;
        // The patch convolution as one product: its kernel [p, p, C, D] read as [C·p·p, D]
        // is the patches' feature order.
        let kernel = w.get(&self.name("x_embedder.proj.weight"))?;
        let kernel = ctx.reshape(
            if kernel.is_contiguous() {
                kernel
            } else {
                ctx.cont(kernel)?
            },
            [c.in_channels * p * p, d, 1, 1],
        )?;
        let img = ctx.add(
            ctx.mul_mat(kernel, x.img)?,
            w.get(&self.name("x_embedder.proj.bias"))?,
        )?;
        let img = ctx.add(img, self.positions(ctx, x.rows, x.cols)?)?;
        let txt = linear(ctx, w, &self.name("context_embedder"), x.txt)?;

        let t = run.input_f32(&[b], x.timesteps.iter().map(|s| s * 1000.0).collect())?;
        let mlp = |name: &str, v: Tensor<'a>| -> Result<Tensor<'a>> {
            let h = ctx.silu(linear(ctx, w, &self.name(&format!("{name}.mlp.0")), v)?)?;
            linear(ctx, w, &self.name(&format!("{name}.mlp.2")), h)
        };
        let vec = ctx.add(
            mlp("t_embedder", ctx.timestep_embedding(t, 256, 10_000)?)?,
            mlp("y_embedder", x.y)?,
        )?;
        let vec = ctx.silu(vec)?;

        let blk = blocks::Blocks {
            ctx,
            w,
            heads: c.heads,
            qk_norm: c.qk_norm,
            compute: self.compute_type(),
        };
        let (mut img, mut txt) = (img, txt);
        for i in 0..c.depth {
            if x.skip.contains(&i) {
                continue;
            }
            let name = self.name(&format!("joint_blocks.{i}"));
            let last = i + 1 == c.depth;
            let (ni, nt) =
                blk.joint(&name, img, txt, vec, c.self_attn_blocks.contains(&i), last)?;
            img = ni;
            if let Some(nt) = nt {
                txt = nt;
            }
        }
        let m = super::dit::chunks(
            ctx,
            linear(ctx, w, &self.name("final_layer.adaLN_modulation.1"), vec)?,
            2,
        )?;
        let img = super::dit::modulate(ctx, ctx.norm(img, 1e-6)?, m[0], m[1])?;
        linear(ctx, w, &self.name("final_layer.linear"), img)
    }

    /// The stored position table cropped around its centre to `rows` × `cols` patches
    /// (ComfyUI's `cropped_pos_embed`), as [D, rows·cols].
    fn positions<'a>(&'a self, ctx: &'a Context, rows: i64, cols: i64) -> Result<Tensor<'a>> {
        let c = &self.config;
        let mut table = self.w.get(&self.name("pos_embed"))?;
        if table.dtype() != GType::F32 {
            table = ctx.cast(table, GType::F32)?;
        }
        let max = c.pos_embed_max;
        let (top, left) = ((max - rows) / 2, (max - cols) / 2);
        let es = table.nb()[0];
        let row = es * c.hidden as usize;
        let crop = ctx.view(
            table,
            [c.hidden, cols, rows, 1],
            [row, row * max as usize, row * (max * max) as usize],
            (top * max + left) as usize * row,
        )?;
        Ok(ctx.reshape(ctx.cont(crop)?, [c.hidden, rows * cols, 1, 1])?)
    }

    /// The type the projections compute in: bf16 models may take the CPU's bf16 attention.
    fn compute_type(&self) -> GType {
        self.w
            .get(&self.name(MARKER))
            .map_or(GType::F32, |t| t.dtype())
    }
}
