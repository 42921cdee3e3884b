//! The CLIP ViT image tower (`CLIPVisionModelWithProjection`): OpenAI's ViT-L/14 and
//! OpenCLIP's ViT-H/14 and ViT-bigG/14, as IP-Adapter and unCLIP use them, in the Hugging
//! Face key layout that ComfyUI's `models/clip_vision` files and sd.cpp read
//! (`vision_model.embeddings.patch_embedding.weight`, `vision_model.encoder.layers.N.
//! self_attn.q_proj`, `vision_model.post_layernorm`, `visual_projection.weight`).
//!
//! The encoder layers are the text CLIP's ([`super::clip`]); what differs is the input
//! (patches of the image, a class token, learned positions, `pre_layrnorm`) and the
//! output (the class token through `post_layernorm` and the projection).

use super::clip::{expect_layer, Activation, ClipLayout, Layer};
use super::nn::{conv2d, layer_norm, project};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};

/// CLIP's image normalisation (OpenAI's mean and std, which OpenCLIP's H and bigG keep).
pub const MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
pub const STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

#[derive(Clone, Debug, PartialEq)]
pub struct ClipVisionConfig {
    pub hidden: i64,
    pub layers: usize,
    pub heads: i64,
    pub intermediate: i64,
    /// Side of a square patch, in pixels.
    pub patch: i64,
    /// Side of the square input image (224 for the models IP-Adapter uses).
    pub image_size: i64,
    /// Width of `image_embeds` (`visual_projection`'s output).
    pub projection_dim: i64,
    pub activation: Activation,
    pub eps: f32,
}

impl ClipVisionConfig {
    /// Read the dimensions off the weights under `prefix` (`""` for a ComfyUI
    /// clip_vision file). The head count is not in the weights: all three released towers
    /// have 16 heads (64, 80 and 104 wide); quick-GELU is OpenAI's ViT-L (1024 wide),
    /// exact GELU OpenCLIP's H and bigG, as the models' configs say.
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let n = |s: &str| format!("{prefix}{s}");
        if !w.contains(&n("vision_model.embeddings.patch_embedding.weight")) {
            let hint = if w.names().any(|k| k.starts_with(&n("visual.transformer."))) {
                " (OpenCLIP `visual.*` names; the Hugging Face layout is supported)"
            } else {
                ""
            };
            return Err(ModelError::Config(format!("no CLIP vision tower under `{prefix}`: `{}` is missing{hint}", n("vision_model.embeddings.patch_embedding.weight"))));
        }
        let patch = w.get(&n("vision_model.embeddings.patch_embedding.weight"))?.ne();
        let pos = w.get(&n("vision_model.embeddings.position_embedding.weight"))?.ne();
        let proj = w.get(&n("visual_projection.weight"))?.ne();
        let layer = |i: usize| n(&format!("vision_model.encoder.layers.{i}"));
        let layers = (0..).take_while(|&i| w.contains(&format!("{}.layer_norm1.weight", layer(i)))).count();
        if layers < 2 {
            return Err(ModelError::Config(format!("CLIP vision tower under `{prefix}` has {layers} encoder layers; the penultimate hidden states need at least 2")));
        }
        let fc1 = w.get(&format!("{}.mlp.fc1.weight", layer(0)))?.ne();
        let hidden = patch[3];
        let grid = ((pos[1] - 1) as f64).sqrt().round() as i64;
        if patch[0] != patch[1] || grid * grid != pos[1] - 1 {
            return Err(ModelError::Config(format!(
                "CLIP vision tower under `{prefix}`: a {}×{} patch and {} positions are not a square grid plus a class token",
                patch[0], patch[1], pos[1]
            )));
        }
        Ok(ClipVisionConfig {
            hidden,
            layers,
            heads: 16,
            intermediate: fc1[1],
            patch: patch[0],
            image_size: grid * patch[0],
            projection_dim: proj[1],
            activation: if hidden == 1024 { Activation::QuickGelu } else { Activation::Gelu },
            eps: 1e-5,
        })
    }

    /// Tokens per image: the patches and the class token.
    pub fn tokens(&self) -> i64 {
        (self.image_size / self.patch).pow(2) + 1
    }
}

/// What one encoding gives, per image of the batch.
pub struct VisionOutput<'a> {
    /// The projected class token [projection_dim, B] (IP-Adapter's input).
    pub image_embeds: Tensor<'a>,
    /// The hidden states after all but the last layer [hidden, tokens, B], no final norm:
    /// Hugging Face's `hidden_states[-2]`, ComfyUI's `penultimate_hidden_states`
    /// (IP-Adapter Plus's input).
    pub penultimate: Tensor<'a>,
    /// The last layer's hidden states [hidden, tokens, B].
    pub last_hidden: Tensor<'a>,
    /// The class token through `post_layernorm` [hidden, B], before the projection
    /// (Hugging Face's `pooler_output`; PhotoMaker projects it twice).
    pub pooled: Tensor<'a>,
}

pub struct ClipVisionModel<'w> {
    w: &'w Weights,
    prefix: String,
    pub config: ClipVisionConfig,
}

impl<'w> ClipVisionModel<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: ClipVisionConfig) -> Result<Self> {
        let c = &config;
        if c.heads < 1 || c.hidden % c.heads != 0 {
            return Err(ModelError::Config(format!("{} heads do not divide the vision width {}", c.heads, c.hidden)));
        }
        if c.patch < 1 || c.image_size % c.patch != 0 {
            return Err(ModelError::Config(format!("{}-pixel patches do not tile a {}-pixel image", c.patch, c.image_size)));
        }
        let m = ClipVisionModel { w, prefix: prefix.to_string(), config };
        let c = &m.config;
        let d = c.hidden;
        w.expect(&m.n("vision_model.embeddings.patch_embedding.weight"), &[c.patch, c.patch, 3, d])?;
        w.expect(&m.n("vision_model.embeddings.class_embedding"), &[d])?;
        w.expect(&m.n("vision_model.embeddings.position_embedding.weight"), &[d, c.tokens()])?;
        for norm in ["vision_model.pre_layrnorm", "vision_model.post_layernorm"] {
            w.expect(&m.n(&format!("{norm}.weight")), &[d])?;
            w.expect(&m.n(&format!("{norm}.bias")), &[d])?;
        }
        for i in 0..c.layers {
            expect_layer(w, &m.layer(i), ClipLayout::HuggingFace, d, c.intermediate)?;
        }
        w.expect(&m.n("visual_projection.weight"), &[d, c.projection_dim])?;
        Ok(m)
    }

    fn n(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }

    fn layer(&self, i: usize) -> String {
        self.n(&format!("vision_model.encoder.layers.{i}"))
    }

    /// Encode preprocessed images `pixels` [S, S, 3, B] (normalised with [`MEAN`] and
    /// [`STD`], S the config's image size).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, pixels: Tensor<'a>) -> Result<VisionOutput<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [sw, sh, ch, b] = pixels.ne();
        if sw != c.image_size || sh != c.image_size || ch != 3 {
            return Err(ModelError::Input(format!("images {:?}: the vision tower takes {s}×{s} RGB", pixels.ne(), s = c.image_size)));
        }
        let (d, t) = (c.hidden, c.tokens());
        let w = self.w;
        let x = conv2d(ctx, w, &self.n("vision_model.embeddings.patch_embedding"), pixels, c.patch as i32, 0)?; // [g, g, D, B]
        let x = ctx.reshape(x, [t - 1, d, b, 1])?;
        let patches = ctx.cont(ctx.permute(x, [1, 0, 2, 3])?)?; // [D, g·g, B]
        // The class token leads every sequence: broadcast onto a zero row per image.
        let zeros = run.input_f32(&[d, 1, b], vec![0.0; (d * b) as usize])?;
        let class = ctx.add(zeros, w.get(&self.n("vision_model.embeddings.class_embedding"))?)?;
        let x = ctx.concat(class, patches, 1)?;
        let x = ctx.add(x, w.get(&self.n("vision_model.embeddings.position_embedding.weight"))?)?;
        let mut x = layer_norm(ctx, w, &self.n("vision_model.pre_layrnorm"), x, c.eps)?;
        let layer = Layer { layout: ClipLayout::HuggingFace, heads: c.heads, activation: c.activation, eps: c.eps };
        let mut penultimate = x;
        for i in 0..c.layers {
            if i + 1 == c.layers {
                penultimate = x;
            }
            x = layer.forward(ctx, w, &self.layer(i), x, None)?;
        }
        let nb = x.nb();
        let cls = ctx.cont(ctx.view(x, [d, 1, b, 1], [nb[1], nb[2], nb[3]], 0)?)?;
        let pooled = layer_norm(ctx, w, &self.n("vision_model.post_layernorm"), ctx.reshape(cls, [d, b, 1, 1])?, c.eps)?;
        let image_embeds = project(ctx, w, &self.n("visual_projection.weight"), pooled)?;
        Ok(VisionOutput { image_embeds, penultimate, last_hidden: x, pooled })
    }
}
