//! CLIP text encoders: OpenAI CLIP ViT-L/14 (SD1.x), OpenCLIP ViT-H/14 (SD2.x) and
//! ViT-bigG/14 (SDXL), in either of the two key layouts checkpoints use:
//! Hugging Face `CLIPTextModel` names (`embeddings.token_embedding`, `encoder.layers.N.
//! self_attn.q_proj`, ...) or OpenCLIP names (`token_embedding`, `transformer.resblocks.N.
//! attn.in_proj_weight`, ...).

use super::nn::{attention, layer_norm, linear, project};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipLayout {
    HuggingFace,
    OpenClip,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// x·σ(1.702x): OpenAI's CLIP.
    QuickGelu,
    /// Exact (erf) GELU: OpenCLIP H and bigG.
    Gelu,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClipTextConfig {
    pub hidden: i64,
    pub layers: usize,
    pub heads: i64,
    pub intermediate: i64,
    pub vocab: i64,
    pub max_positions: i64,
    pub activation: Activation,
    pub eps: f32,
    pub layout: ClipLayout,
}

/// Weight names of one encoder in one layout.
struct Names {
    prefix: String,
    layout: ClipLayout,
}

impl Names {
    /// `s` under the prefix; a file of bare names (a standalone OpenCLIP text tower) has none.
    fn at(&self, s: &str) -> String {
        if self.prefix.is_empty() {
            s.to_string()
        } else {
            format!("{}.{s}", self.prefix)
        }
    }
    fn token_embedding(&self) -> String {
        match self.layout {
            ClipLayout::HuggingFace => self.at("embeddings.token_embedding.weight"),
            ClipLayout::OpenClip => self.at("token_embedding.weight"),
        }
    }
    fn position_embedding(&self) -> String {
        match self.layout {
            ClipLayout::HuggingFace => self.at("embeddings.position_embedding.weight"),
            ClipLayout::OpenClip => self.at("positional_embedding"),
        }
    }
    fn layer(&self, i: usize) -> String {
        match self.layout {
            ClipLayout::HuggingFace => self.at(&format!("encoder.layers.{i}")),
            ClipLayout::OpenClip => self.at(&format!("transformer.resblocks.{i}")),
        }
    }
    /// (ln1, ln2, out_proj, fc1, fc2) relative to a layer.
    fn parts(&self) -> [&'static str; 5] {
        match self.layout {
            ClipLayout::HuggingFace => ["layer_norm1", "layer_norm2", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"],
            ClipLayout::OpenClip => ["ln_1", "ln_2", "attn.out_proj", "mlp.c_fc", "mlp.c_proj"],
        }
    }
    fn final_norm(&self) -> String {
        match self.layout {
            ClipLayout::HuggingFace => self.at("final_layer_norm"),
            ClipLayout::OpenClip => self.at("ln_final"),
        }
    }
    /// The pooled output's projection: OpenCLIP keeps a bare matrix used as `x @ P`
    /// next to the transformer; Hugging Face's `CLIPTextModelWithProjection` a bias-free
    /// Linear beside `text_model` (`text_encoder_2/text_projection.weight`).
    fn projection(&self) -> String {
        match self.layout {
            ClipLayout::HuggingFace => {
                let root = self.prefix.strip_suffix("text_model").map_or(String::new(), |r| r.to_string());
                format!("{root}text_projection.weight")
            }
            ClipLayout::OpenClip => self.at("text_projection"),
        }
    }
}

/// How [`ClipTextModel::encode`] reads the encoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// 1 = the last layer's hidden states, 2 = the penultimate, ...
    pub clip_skip: usize,
    /// Pass the hidden states through the final layer norm: SD1 and SD2 do, SDXL's two
    /// encoders do not (ComfyUI's `layer_norm_hidden_state=False`).
    pub final_norm: bool,
    /// Also return the pooled output: the last layer, final-normed, at each sequence's
    /// given token position (its end token), projected (SDXL's OpenCLIP-G) if
    /// `project_pooled`, as it is otherwise (FLUX's CLIP-L, ComfyUI's
    /// `return_projected_pooled=False`).
    pub pooled_at: Option<Vec<usize>>,
    pub project_pooled: bool,
}

/// The outputs of [`ClipTextModel::encode`].
pub struct ClipOutputs<'a> {
    /// [hidden, T, B].
    pub hidden: Tensor<'a>,
    /// [projection, B].
    pub pooled: Option<Tensor<'a>>,
}

/// A CLIP text encoder over [`Weights`] whose shapes have been checked.
pub struct ClipTextModel<'w> {
    w: &'w Weights,
    names: Names,
    pub config: ClipTextConfig,
}

impl ClipTextConfig {
    /// Read the dimensions off the weights under `prefix`. Head count and activation
    /// are not visible in the weights; they follow the released models (64-dim heads;
    /// quick-GELU only for OpenAI's 768-wide ViT-L) and can be overridden afterwards.
    pub fn infer(w: &Weights, prefix: &str, layout: ClipLayout) -> Result<Self> {
        let names = Names { prefix: prefix.to_string(), layout };
        let tok = w.get(&names.token_embedding())?.ne();
        let pos = w.get(&names.position_embedding())?.ne();
        let layers = (0..).take_while(|&i| w.contains(&format!("{}.{}.weight", names.layer(i), names.parts()[0]))).count();
        if layers == 0 {
            return Err(ModelError::Config(format!("no CLIP encoder layers under `{prefix}`")));
        }
        let fc1 = w.get(&format!("{}.{}.weight", names.layer(0), names.parts()[3]))?.ne();
        let hidden = tok[0];
        Ok(ClipTextConfig {
            hidden,
            layers,
            heads: (hidden / 64).max(1),
            intermediate: fc1[1],
            vocab: tok[1],
            max_positions: pos[1],
            activation: if hidden == 768 { Activation::QuickGelu } else { Activation::Gelu },
            eps: 1e-5,
            layout,
        })
    }
}

impl<'w> ClipTextModel<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: ClipTextConfig) -> Result<Self> {
        let c = &config;
        if c.heads < 1 || c.hidden % c.heads != 0 {
            return Err(ModelError::Config(format!("{} heads do not divide width {}", c.heads, c.hidden)));
        }
        let names = Names { prefix: prefix.to_string(), layout: c.layout };
        let (d, f) = (c.hidden, c.intermediate);
        w.expect(&names.token_embedding(), &[d, c.vocab])?;
        w.expect(&names.position_embedding(), &[d, c.max_positions])?;
        for i in 0..c.layers {
            expect_layer(w, &names.layer(i), c.layout, d, f)?;
        }
        w.expect(&format!("{}.weight", names.final_norm()), &[d])?;
        w.expect(&format!("{}.bias", names.final_norm()), &[d])?;
        Ok(ClipTextModel { w, names, config })
    }

    /// Hidden states [hidden, T, B] for `tokens` (B sequences of equal length T ≤
    /// max_positions), taken after `layers - clip_skip + 1` layers and passed through the
    /// final layer norm, as SD conditioning uses them (clip_skip 1 = last layer).
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, tokens: &[Vec<i32>], clip_skip: usize) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        self.forward_with_extra(ctx, run, tokens, clip_skip, &[])
    }

    /// [`ClipTextModel::forward`] with extra token-embedding rows (textual inversion):
    /// `extra` holds whole rows of `hidden` values, addressed by ids `vocab..vocab+rows`.
    pub fn forward_with_extra<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, tokens: &[Vec<i32>], clip_skip: usize, extra: &[f32]) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let opts = EncodeOptions { clip_skip, final_norm: true, pooled_at: None, project_pooled: false };
        Ok(self.encode(ctx, run, tokens, &opts, extra)?.hidden)
    }

    /// Whether the weights hold the pooled output's projection.
    pub fn has_projection(&self) -> bool {
        self.w.contains(&self.names.projection())
    }

    /// Hidden states (and optionally the pooled output) for `tokens`, as `opts` asks;
    /// `extra` as in [`ClipTextModel::forward_with_extra`].
    pub fn encode<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, tokens: &[Vec<i32>], opts: &EncodeOptions, extra: &[f32]) -> Result<ClipOutputs<'a>>
    where
        'w: 'a,
    {
        let clip_skip = opts.clip_skip;
        let c = &self.config;
        let b = tokens.len();
        let t = tokens.first().map_or(0, |s| s.len());
        if b == 0 || t == 0 || t as i64 > c.max_positions || tokens.iter().any(|s| s.len() != t) {
            return Err(ModelError::Input(format!("{b} token sequences of length {t}; need equal lengths of 1..={}", c.max_positions)));
        }
        if extra.len() as i64 % c.hidden != 0 {
            return Err(ModelError::Input(format!("{} extra embedding values are not rows of {}", extra.len(), c.hidden)));
        }
        let extra_rows = extra.len() as i64 / c.hidden;
        if let Some(bad) = tokens.iter().flatten().find(|&&id| id < 0 || id as i64 >= c.vocab + extra_rows) {
            return Err(ModelError::Input(format!("token id {bad} outside the vocabulary of {} (+{extra_rows} embedding rows)", c.vocab)));
        }
        if clip_skip < 1 || clip_skip > c.layers {
            return Err(ModelError::Input(format!("clip_skip {clip_skip} with {} layers", c.layers)));
        }
        let (d, t, b) = (c.hidden, t as i64, b as i64);
        let ids = run.input_i32(&[t * b], tokens.iter().flatten().copied().collect())?;
        let mut table = self.w.get(&self.names.token_embedding())?;
        if extra_rows > 0 {
            // concat needs one type; the embedding rows are f32.
            table = ctx.cast(table, crate::ggml::GType::F32)?;
            let rows = run.input_f32(&[c.hidden, extra_rows], extra.to_vec())?;
            table = ctx.concat(table, rows, 1)?;
        }
        let mut x = ctx.get_rows(table, ids)?;
        x = ctx.reshape(x, [d, t, b, 1])?;
        let pos = self.w.get(&self.names.position_embedding())?;
        let pos = ctx.view(pos, [d, t, 1, 1], [pos.nb()[1], pos.nb()[2], pos.nb()[3]], 0)?;
        x = ctx.add(x, pos)?;

        let mut mask = vec![0f32; (t * t) as usize];
        for q in 0..t {
            for k in (q + 1)..t {
                mask[(q * t + k) as usize] = f32::NEG_INFINITY;
            }
        }
        let mask = run.input_f32(&[t, t], mask)?;

        if let Some(at) = &opts.pooled_at {
            if at.len() != tokens.len() || at.iter().any(|&p| p >= t as usize) {
                return Err(ModelError::Input(format!("pooled positions {at:?} for {b} sequences of {t} tokens")));
            }
        }
        let layer = Layer { layout: c.layout, heads: c.heads, activation: c.activation, eps: c.eps };
        let wanted = c.layers + 1 - clip_skip;
        let run_layers = if opts.pooled_at.is_some() { c.layers } else { wanted };
        let mut hidden = None;
        for i in 0..run_layers {
            x = layer.forward(ctx, self.w, &self.names.layer(i), x, Some(mask))?;
            if i + 1 == wanted {
                hidden = Some(x);
            }
        }
        let hidden = hidden.expect("the loop runs at least the wanted layers");
        let hidden = if opts.final_norm { layer_norm(ctx, self.w, &self.names.final_norm(), hidden, c.eps)? } else { hidden };
        let pooled = match &opts.pooled_at {
            None => None,
            Some(at) => {
                let last = layer_norm(ctx, self.w, &self.names.final_norm(), x, c.eps)?;
                let rows = ctx.reshape(ctx.cont(last)?, [d, t * b, 1, 1])?;
                let idx = run.input_i32(&[b], at.iter().enumerate().map(|(k, &p)| (k as i64 * t + p as i64) as i32).collect())?;
                let picked = ctx.get_rows(rows, idx)?; // [d, B]
                Some(if opts.project_pooled { self.project_pooled(ctx, picked)? } else { picked })
            }
        };
        Ok(ClipOutputs { hidden, pooled })
    }

    fn project_pooled<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let name = self.names.projection();
        let p = self.w.get(&name)?;
        let d = self.config.hidden;
        match self.config.layout {
            ClipLayout::HuggingFace => {
                if p.ne()[0] != d {
                    return Err(ModelError::Shape { name, expected: vec![d, p.ne()[1]], got: p.ne().to_vec() });
                }
                project(ctx, self.w, &name, x)
            }
            ClipLayout::OpenClip => {
                // Stored [width, embed] for `x @ P`: ggml wants the contracted axis first.
                if p.ne()[1] != d {
                    return Err(ModelError::Shape { name, expected: vec![p.ne()[0], d], got: p.ne().to_vec() });
                }
                // Transposed in its own type, so the product is the one a Hugging Face
                // layout's Linear runs (bf16 weights: the same bf16 product); quantized
                // blocks cannot be transposed and are expanded first.
                let p = if p.dtype().is_quantized() { ctx.cast(p, crate::ggml::GType::F32)? } else { p };
                let pt = ctx.cont(ctx.permute(p, [1, 0, 2, 3])?)?;
                Ok(ctx.mul_mat(pt, x)?)
            }
        }
    }
}

/// The weight names of one encoder layer's parts in `layout`: (ln1, ln2, out_proj, fc1, fc2).
fn layer_parts(layout: ClipLayout) -> [&'static str; 5] {
    Names { prefix: String::new(), layout }.parts()
}

/// Check the weights of the encoder layer at `l` (width `d`, MLP width `f`).
pub(crate) fn expect_layer(w: &Weights, l: &str, layout: ClipLayout, d: i64, f: i64) -> Result<()> {
    let [ln1, ln2, out, fc1, fc2] = layer_parts(layout);
    for n in [ln1, ln2] {
        w.expect(&format!("{l}.{n}.weight"), &[d])?;
        w.expect(&format!("{l}.{n}.bias"), &[d])?;
    }
    match layout {
        ClipLayout::HuggingFace => {
            for p in ["q_proj", "k_proj", "v_proj"] {
                w.expect(&format!("{l}.self_attn.{p}.weight"), &[d, d])?;
                w.expect(&format!("{l}.self_attn.{p}.bias"), &[d])?;
            }
        }
        ClipLayout::OpenClip => {
            w.expect(&format!("{l}.attn.in_proj_weight"), &[d, 3 * d])?;
            w.expect(&format!("{l}.attn.in_proj_bias"), &[3 * d])?;
        }
    }
    for (n, i_, o) in [(out, d, d), (fc1, d, f), (fc2, f, d)] {
        w.expect(&format!("{l}.{n}.weight"), &[i_, o])?;
        w.expect(&format!("{l}.{n}.bias"), &[o])?;
    }
    Ok(())
}

/// One pre-norm transformer layer of a CLIP encoder (text or vision tower).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layer {
    pub layout: ClipLayout,
    pub heads: i64,
    pub activation: Activation,
    pub eps: f32,
}

impl Layer {
    /// The layer at `l` on x [D, T, B]; `mask` [T, T] is added to the attention scores.
    pub(crate) fn forward<'a>(&self, ctx: &'a Context, w: &'a Weights, l: &str, x: Tensor<'a>, mask: Option<Tensor<'a>>) -> Result<Tensor<'a>> {
        let [ln1, ln2, out, fc1, fc2] = layer_parts(self.layout);
        let [d, t, b, _] = x.ne();
        let h = layer_norm(ctx, w, &format!("{l}.{ln1}"), x, self.eps)?;
        let (q, k, v) = match self.layout {
            ClipLayout::HuggingFace => (
                linear(ctx, w, &format!("{l}.self_attn.q_proj"), h)?,
                linear(ctx, w, &format!("{l}.self_attn.k_proj"), h)?,
                linear(ctx, w, &format!("{l}.self_attn.v_proj"), h)?,
            ),
            ClipLayout::OpenClip => {
                let qkv = project(ctx, w, &format!("{l}.attn.in_proj_weight"), h)?;
                let qkv = ctx.add(qkv, w.get(&format!("{l}.attn.in_proj_bias"))?)?;
                let nb = qkv.nb();
                let part = |j: usize| ctx.view(qkv, [d, t, b, 1], [nb[1], nb[2], nb[3]], j * d as usize * 4);
                (part(0)?, part(1)?, part(2)?)
            }
        };
        let a = attention(ctx, q, k, v, self.heads, mask)?;
        let a = linear(ctx, w, &format!("{l}.{out}"), a)?;
        let x = ctx.add(x, a)?;
        let h = layer_norm(ctx, w, &format!("{l}.{ln2}"), x, self.eps)?;
        let h = linear(ctx, w, &format!("{l}.{fc1}"), h)?;
        let h = match self.activation {
            Activation::QuickGelu => ctx.gelu_quick_exact(h)?,
            Activation::Gelu => ctx.gelu_erf(h)?,
        };
        let h = linear(ctx, w, &format!("{l}.{fc2}"), h)?;
        Ok(ctx.add(x, h)?)
    }
}
