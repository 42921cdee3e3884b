//! Decoder-only language models run as text encoders: Qwen3 (Z-Image, FLUX.2 klein),
//! Qwen2/Qwen2.5-VL's language model (Qwen-Image) and Mistral-Small-3.2's (FLUX.2 dev), in
//! the key layout of Hugging Face's `Qwen3Model` / `Qwen2Model` / `MistralModel` (what
//! ComfyUI's `qwen_3_4b.safetensors`, `qwen_2.5_vl_7b.safetensors` and
//! `mistral_3_small_flux2_*.safetensors` hold, under `model.` or bare). GGUF files in
//! llama.cpp's naming are shown in this layout by [`hf_layout`].
//!
//! Born as its own folder because several DiT families share these encoders and read
//! hidden states from inside them (sd.cpp's `out_layers`), not the final output a
//! language model exists for. The architectures differ only where the weights say so:
//! Qwen3 has RMS norms on q and k per head and no biases, Qwen2 has q/k/v biases, Mistral
//! has neither (and its own RoPE base and norm epsilon, [`LlmArch`]). On text,
//! Qwen2.5-VL's multimodal RoPE gives every axis the same position, which is plain RoPE.

pub mod prompt;
pub mod vision;

pub use prompt::{Family, LlmPrompt};

use super::nn::{linear, rms_norm};
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};

/// ggml's NEOX rotary layout: the two halves of a head rotate together (Hugging Face's
/// `rotate_half`), as Qwen's checkpoints expect.
const ROPE_NEOX: i32 = 2;

/// Which language model the weights are: what sets the RoPE base and the norm epsilon,
/// which the weights do not show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LlmArch {
    /// q/k RMS norms per head.
    Qwen3,
    /// q/k/v biases.
    Qwen2,
    /// Neither: Mistral-Small-3.2 (RoPE base 10⁹, ε 10⁻⁵).
    Mistral,
}

impl LlmArch {
    /// The architecture of the encoder under `prefix`, by which of its first layer's
    /// tensors exist (`has` answers for a full tensor name).
    pub fn detect(has: impl Fn(&str) -> bool, prefix: &str) -> Self {
        let n = Names { prefix: prefix.to_string() };
        if has(&format!("{}.weight", n.attn(0, "q_norm"))) {
            LlmArch::Qwen3
        } else if has(&format!("{}.bias", n.attn(0, "q_proj"))) {
            LlmArch::Qwen2
        } else {
            LlmArch::Mistral
        }
    }
}

/// The encoder's dimensions, read off the weights; `rope_theta` and `eps` are the
/// architecture's (every text encoder of it in use has these).
#[derive(Clone, Debug, PartialEq)]
pub struct LlmConfig {
    pub arch: LlmArch,
    pub hidden: i64,
    pub layers: usize,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub intermediate: i64,
    pub vocab: i64,
    pub rope_theta: f32,
    pub eps: f32,
    /// Qwen3's per-head RMS norms on q and k.
    pub qk_norm: bool,
}

/// The weight that marks such an encoder in Hugging Face names, relative to its prefix.
pub const MARKER: &str = "layers.0.self_attn.q_proj.weight";

/// The prefix under which tensors called `names` hold an LLM encoder (`model.`, ``,
/// `text_encoders.llm.model.`, ...): the part before [`MARKER`].
pub fn find_prefix<'a>(names: impl Iterator<Item = &'a str>) -> Option<String> {
    super::prefix_before(names, MARKER)
}

#[derive(Clone, Debug)]
struct Names {
    prefix: String,
}

impl Names {
    fn at(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }
    fn layer(&self, i: usize, part: &str) -> String {
        self.at(&format!("layers.{i}.{part}"))
    }
    fn attn(&self, i: usize, proj: &str) -> String {
        self.layer(i, &format!("self_attn.{proj}"))
    }
    fn mlp(&self, i: usize, proj: &str) -> String {
        self.layer(i, &format!("mlp.{proj}"))
    }
}

impl LlmConfig {
    /// Read the dimensions off the weights under `prefix`. `head_dim` gives the head
    /// width where the weights do not show it (a Qwen2 whose heads are not 128 wide).
    pub fn infer(w: &Weights, prefix: &str, head_dim: Option<i64>) -> Result<Self> {
        let n = Names { prefix: prefix.to_string() };
        let layers = (0..).take_while(|&i| w.contains(&format!("{}.weight", n.attn(i, "q_proj")))).count();
        if layers == 0 {
            return Err(ModelError::Config(format!("no LLM layers under `{prefix}` (`{}.weight`)", n.attn(0, "q_proj"))));
        }
        let emb = w.get(&n.at("embed_tokens.weight"))?.ne();
        let q = w.get(&format!("{}.weight", n.attn(0, "q_proj")))?.ne();
        let k = w.get(&format!("{}.weight", n.attn(0, "k_proj")))?.ne();
        let gate = w.get(&format!("{}.weight", n.mlp(0, "gate_proj")))?.ne();
        let qk_norm = w.contains(&format!("{}.weight", n.attn(0, "q_norm")));
        let arch = LlmArch::detect(|name| w.contains(name), prefix);
        // The head width: Qwen3 stores it in its q/k norms (it need not be hidden/heads).
        // Qwen2's and Mistral's weights do not show it; it is 128 in every such model used
        // as a text encoder (Qwen2.5-VL-7B: 28 heads of 128; Mistral-Small-3.2: 32 of 128
        // in a 5120-wide model).
        let head_dim = match (qk_norm, head_dim) {
            (true, _) => w.get(&format!("{}.weight", n.attn(0, "q_norm")))?.ne()[0],
            (false, Some(h)) => h,
            (false, None) => 128,
        };
        if head_dim < 2 || q[1] % head_dim != 0 || k[1] % head_dim != 0 || (q[1] / head_dim) % (k[1] / head_dim) != 0 {
            return Err(ModelError::Config(format!("heads of {head_dim} do not divide the q width {} and k width {} into groups", q[1], k[1])));
        }
        let (rope_theta, eps) = match arch {
            LlmArch::Mistral => (1e9, 1e-5),
            LlmArch::Qwen3 | LlmArch::Qwen2 => (1e6, 1e-6),
        };
        Ok(LlmConfig {
            arch,
            hidden: emb[0],
            layers,
            heads: q[1] / head_dim,
            kv_heads: k[1] / head_dim,
            head_dim,
            intermediate: gate[1],
            vocab: emb[1],
            rope_theta,
            eps,
            qk_norm,
        })
    }
}

/// An image inside a prompt ([`LlmEncoder::forward_with_images`]): its merged vision
/// tokens [hidden, rows·cols] in reading order, from token `at` on.
#[derive(Clone, Copy)]
pub struct ImageSpan<'a> {
    pub at: usize,
    pub tokens: Tensor<'a>,
    pub rows: usize,
    pub cols: usize,
}

/// Rotary positions: one per token, or Qwen2.5-VL's four per token ([`Context::rope_multi`])
/// with the frequency sections of its axes.
#[derive(Clone, Copy)]
enum Positions<'a> {
    Plain(Tensor<'a>),
    Multi(Tensor<'a>, [i32; 4]),
}

/// An LLM text encoder over [`Weights`] whose shapes have been checked.
pub struct LlmEncoder<'w> {
    w: &'w Weights,
    names: Names,
    pub config: LlmConfig,
}

impl<'w> LlmEncoder<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: LlmConfig) -> Result<Self> {
        let c = &config;
        let names = Names { prefix: prefix.to_string() };
        let (d, q, kv, f) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim, c.intermediate);
        w.expect(&names.at("embed_tokens.weight"), &[d, c.vocab])?;
        for i in 0..c.layers {
            for (p, o) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                w.expect(&format!("{}.weight", names.attn(i, p)), &[d, o])?;
                let bias = format!("{}.bias", names.attn(i, p));
                if w.contains(&bias) {
                    w.expect(&bias, &[o])?;
                }
            }
            w.expect(&format!("{}.weight", names.attn(i, "o_proj")), &[q, d])?;
            if c.qk_norm {
                w.expect(&format!("{}.weight", names.attn(i, "q_norm")), &[c.head_dim])?;
                w.expect(&format!("{}.weight", names.attn(i, "k_norm")), &[c.head_dim])?;
            }
            w.expect(&format!("{}.weight", names.mlp(i, "gate_proj")), &[d, f])?;
            w.expect(&format!("{}.weight", names.mlp(i, "up_proj")), &[d, f])?;
            w.expect(&format!("{}.weight", names.mlp(i, "down_proj")), &[f, d])?;
            w.expect(&names.layer(i, "input_layernorm.weight"), &[d])?;
            w.expect(&names.layer(i, "post_attention_layernorm.weight"), &[d])?;
        }
        w.expect(&names.at("norm.weight"), &[d])?;
        Ok(LlmEncoder { w, names, config })
    }

    /// Hidden states for `tokens` (B sequences of one length T), causal attention, with
    /// `keep` (if given) hiding the keys it marks false (padding); each of `out_layers` is a
    /// hidden state as sd.cpp numbers them (Hugging Face's `hidden_states[k]`: the output
    /// of the first k layers; `layers + 1` is the final normed output), concatenated along
    /// the features in the order given: [hidden·len(out_layers), T, B].
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, tokens: &[Vec<i32>], keep: Option<&[Vec<bool>]>, out_layers: &[usize]) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let (b, t) = super::check_token_batch(tokens, keep, c.vocab, "the LLM")?;
        self.check_out_layers(out_layers)?;
        // Causal, and padding hidden where `keep` says: [Tk, Tq, 1, B], added to scores.
        let mut mask = Vec::with_capacity(t * t * b);
        for s in 0..b {
            for q in 0..t {
                for k in 0..t {
                    let hidden = k > q || keep.is_some_and(|m| !m[s][k]);
                    // sd.cpp's value: exp() makes it 0, and a row with every key hidden
                    // stays finite.
                    mask.push(if hidden { -f32::MAX / 4.0 } else { 0.0 });
                }
            }
        }
        let (d, tl, bl) = (c.hidden, t as i64, b as i64);
        let mask = run.input_f32(&[tl, tl, 1, bl], mask)?;
        let pos = run.input_i32(&[tl], (0..t as i32).collect())?;
        let ids = run.input_i32(&[tl * bl], tokens.iter().flatten().copied().collect())?;
        let x = ctx.reshape(ctx.get_rows(self.w.get(&self.names.at("embed_tokens.weight"))?, ids)?, [d, tl, bl, 1])?;
        self.layers(ctx, x, Positions::Plain(pos), mask, out_layers)
    }

    /// [`LlmEncoder::forward`] of one sequence some of whose tokens are images' (each
    /// [`ImageSpan`] a grid of merged vision tokens in reading order, in place of the
    /// template's image pads). With `sections`, Qwen2.5-VL's multimodal rotary positions in
    /// those sections of the head's frequency pairs (`get_rope_index`: text at one position
    /// per token on every axis; an image at the next position plus (0, row, column); the
    /// text after it from one past the image's largest); without, every token at its index
    /// (sd.cpp gives Qwen2.5-VL's image tokens no 2-D positions).
    pub fn forward_with_images<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, tokens: &[i32], images: &[ImageSpan<'a>], sections: Option<[i32; 3]>, out_layers: &[usize]) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let (_, t) = super::check_token_batch(&[tokens.to_vec()], None, c.vocab, "the LLM")?;
        self.check_out_layers(out_layers)?;
        let mut end = 0;
        for im in images {
            let n = im.rows * im.cols;
            if im.tokens.ne() != [c.hidden, n as i64, 1, 1] || im.at < end || im.at + n > t {
                return Err(ModelError::Input(format!("image tokens {:?} ({}×{}) at {} of {t} tokens for an LLM {} wide", im.tokens.ne(), im.rows, im.cols, im.at, c.hidden)));
            }
            end = im.at + n;
        }
        let mut axes = [Vec::with_capacity(t), Vec::with_capacity(t), Vec::with_capacity(t)];
        let (mut i, mut next) = (0usize, 0i32);
        for im in images.iter().map(Some).chain([None]) {
            let upto = im.map_or(t, |im| im.at);
            while i < upto {
                axes.iter_mut().for_each(|a| a.push(next));
                (i, next) = (i + 1, next + 1);
            }
            if let Some(im) = im {
                for r in 0..im.rows {
                    for col in 0..im.cols {
                        axes[0].push(next);
                        axes[1].push(next + r as i32);
                        axes[2].push(next + col as i32);
                    }
                }
                i += im.rows * im.cols;
                next += im.rows.max(im.cols) as i32;
            }
        }
        let tl = t as i64;
        let pos = match sections {
            Some(s) => Positions::Multi(run.input_i32(&[4 * tl], axes.concat().into_iter().chain(std::iter::repeat_n(0, t)).collect())?, [s[0], s[1], s[2], 0]),
            None => Positions::Plain(run.input_i32(&[tl], (0..t as i32).collect())?),
        };
        let mask: Vec<f32> = (0..t).flat_map(|q| (0..t).map(move |k| if k > q { -f32::MAX / 4.0 } else { 0.0 })).collect();
        let mask = run.input_f32(&[tl, tl, 1, 1], mask)?;
        let ids = run.input_i32(&[tl], tokens.to_vec())?;
        let emb = ctx.reshape(ctx.get_rows(self.w.get(&self.names.at("embed_tokens.weight"))?, ids)?, [c.hidden, tl, 1, 1])?;
        // The pads' embeddings replaced by the images' tokens.
        let mut parts = Vec::new();
        let mut at = 0;
        for im in images {
            if im.at > at {
                parts.push(super::dit::rows(ctx, emb, at as i64, (im.at - at) as i64)?);
            }
            parts.push(im.tokens);
            at = im.at + im.rows * im.cols;
        }
        if at < t {
            parts.push(if at == 0 { emb } else { super::dit::rows(ctx, emb, at as i64, (t - at) as i64)? });
        }
        let mut x = parts[0];
        for p in &parts[1..] {
            x = ctx.concat(x, *p, 1)?;
        }
        self.layers(ctx, x, pos, mask, out_layers)
    }

    /// `out_layers` names hidden states this encoder has (1 ..= layers + 1), at least one.
    fn check_out_layers(&self, out_layers: &[usize]) -> Result<()> {
        let c = &self.config;
        if out_layers.is_empty() || out_layers.iter().any(|&l| l == 0 || l > c.layers + 1) {
            return Err(ModelError::Input(format!("hidden states {out_layers:?} of an encoder with {} layers (1..={})", c.layers, c.layers + 1)));
        }
        Ok(())
    }

    /// The decoder layers over embeddings x [D, T, B], the hidden states `out_layers`.
    fn layers<'a>(&'a self, ctx: &'a Context, mut x: Tensor<'a>, pos: Positions<'a>, mask: Tensor<'a>, out_layers: &[usize]) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let last = *out_layers.iter().max().expect("checked non-empty");
        let mut taken: Vec<(usize, Tensor<'a>)> = Vec::new();
        for i in 0..c.layers.min(last) {
            let h = rms_norm(ctx, self.w, &self.names.layer(i, "input_layernorm.weight"), x, c.eps)?;
            x = ctx.add(x, self.attention(ctx, i, h, pos, mask)?)?;
            let h = rms_norm(ctx, self.w, &self.names.layer(i, "post_attention_layernorm.weight"), x, c.eps)?;
            let gate = ctx.silu(linear(ctx, self.w, &self.names.mlp(i, "gate_proj"), h)?)?;
            let up = linear(ctx, self.w, &self.names.mlp(i, "up_proj"), h)?;
            x = ctx.add(x, linear(ctx, self.w, &self.names.mlp(i, "down_proj"), ctx.mul(gate, up)?)?)?;
            if out_layers.contains(&(i + 1)) {
                taken.push((i + 1, x));
            }
        }
        if last == c.layers + 1 {
            taken.push((last, rms_norm(ctx, self.w, &self.names.at("norm.weight"), x, c.eps)?));
        }
        let mut out: Option<Tensor<'a>> = None;
        for l in out_layers {
            let (_, h) = *taken.iter().find(|(n, _)| n == l).expect("every requested layer was computed");
            out = Some(match out {
                None => h,
                Some(o) => ctx.concat(o, h, 0)?,
            });
        }
        Ok(out.expect("at least one layer"))
    }

    /// Grouped-query self-attention of x [D, T, B]: q/k (RMS-normed per head for Qwen3)
    /// rotated by position, each group of q heads reading one k/v head (ggml's product
    /// broadcasts the k/v heads over their group, as `repeat_kv` does).
    fn attention<'a>(&'a self, ctx: &'a Context, i: usize, x: Tensor<'a>, pos: Positions<'a>, mask: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let [_, t, b, _] = x.ne();
        let dh = c.head_dim;
        let q = ctx.reshape(linear(ctx, self.w, &self.names.attn(i, "q_proj"), x)?, [dh, c.heads, t, b])?;
        let k = ctx.reshape(linear(ctx, self.w, &self.names.attn(i, "k_proj"), x)?, [dh, c.kv_heads, t, b])?;
        let v = ctx.reshape(linear(ctx, self.w, &self.names.attn(i, "v_proj"), x)?, [dh, c.kv_heads, t, b])?;
        let (q, k) = if c.qk_norm {
            (
                rms_norm(ctx, self.w, &format!("{}.weight", self.names.attn(i, "q_norm")), q, c.eps)?,
                rms_norm(ctx, self.w, &format!("{}.weight", self.names.attn(i, "k_norm")), k, c.eps)?,
            )
        } else {
            (q, k)
        };
        let rope = |t: Tensor<'a>| -> Result<Tensor<'a>> {
            Ok(match pos {
                Positions::Plain(p) => ctx.rope(t, p, dh as i32, ROPE_NEOX, c.rope_theta)?,
                Positions::Multi(p, sections) => ctx.rope_multi(t, p, dh as i32, sections, c.rope_theta)?,
            })
        };
        let (q, k) = (rope(q)?, rope(k)?);
        let qh = ctx.cont(ctx.permute(q, [0, 2, 1, 3])?)?; // [dh, T, H, B]
        let kh = ctx.cont(ctx.permute(k, [0, 2, 1, 3])?)?; // [dh, T, Hkv, B]
        let vt = ctx.cont(ctx.permute(v, [1, 2, 0, 3])?)?; // [T, dh, Hkv, B]
        let scores = ctx.mul_mat(kh, qh)?; // [Tk, Tq, H, B]
        let probs = ctx.soft_max_ext(scores, Some(mask), 1.0 / (dh as f32).sqrt())?;
        let out = ctx.mul_mat(vt, probs)?; // [dh, Tq, H, B]
        let out = ctx.cont(ctx.permute(out, [0, 2, 1, 3])?)?; // [dh, H, Tq, B]
        let out = ctx.reshape(out, [dh * c.heads, t, b, 1])?;
        linear(ctx, self.w, &self.names.attn(i, "o_proj"), out)
    }
}

impl LlmEncoder<'_> {
    /// A laid-out prompt's conditioning, as sd.cpp computes it: the templated text
    /// tokenized with A1111 weights inside the user's part and padded (padding masked),
    /// the hidden states `prompt.out_layers` taken, each token scaled by its weight with
    /// the mean kept ([`crate::models::conditioning::emphasize`]), the first
    /// `prompt.drop` tokens dropped, zero rows appended up to `prompt.pad_states`. Returns
    /// the rows [T × width] and the width.
    pub fn encode_prompt(&self, backend: &crate::ggml::Backend, tokenizer: &crate::text::llm::LlmTokenizer, prompt: &LlmPrompt) -> Result<(Vec<f32>, usize)> {
        let tokens = tokenizer.tokenize_weighted(&prompt.text, prompt.attn.clone(), prompt.min_length, None).map_err(|e| ModelError::Input(e.to_string()))?;
        if tokens.ids.len() <= prompt.drop {
            return Err(ModelError::Input(format!("the templated prompt has {} tokens, not more than the {} the template drops", tokens.ids.len(), prompt.drop)));
        }
        let ids: Vec<i32> = tokens.ids.iter().map(|&i| i as i32).collect();
        let padded = tokens.mask.iter().any(|&m| m == 0.0);
        let keep = [tokens.mask.iter().map(|&m| m != 0.0).collect::<Vec<bool>>()];
        let size = 64 * self.config.layers + 256;
        let ctx = Context::new(size, size)?;
        let mut run = GraphRun::new(&ctx);
        let out = self.forward(&ctx, &mut run, &[ids], padded.then_some(&keep[..]), &prompt.out_layers)?;
        let width = out.ne()[0] as usize;
        let mut hidden = run.compute(backend, &[out], size)?.remove(0);
        crate::models::conditioning::emphasize(&mut hidden, &tokens.weights, width);
        let mut rows = hidden.split_off(prompt.drop * width);
        if rows.len() < prompt.pad_states * width {
            rows.resize(prompt.pad_states * width, 0.0);
        }
        Ok((rows, width))
    }
}

/// Qwen2.5-VL's multimodal rotary sections of the 64 frequency pairs of its 128-wide
/// heads (time, rows, columns).
pub const QWEN25_VL_MROPE: [i32; 3] = [16, 24, 24];

impl LlmEncoder<'_> {
    /// A Qwen-Image prompt with images, as ComfyUI's encoder computes it: `text` (the
    /// template applied) tokenized without weights, each `<|image_pad|>` widened to its
    /// image's merged vision tokens, the final normed hidden state of every token, cut
    /// where ComfyUI cuts the template ([`prompt::comfy_template_end`]). Returns the rows
    /// [T × width] and the width.
    pub fn encode_with_images(&self, backend: &crate::ggml::Backend, tokenizer: &crate::text::llm::LlmTokenizer, text: &str, tower: Option<&vision::VisionTower<'_>>, images: &[vision::VisionInput]) -> Result<(Vec<f32>, usize)> {
        let ids = tokenizer.encode(text).map_err(|e| ModelError::Input(e.to_string()))?;
        let pads = ids.iter().filter(|&&t| t == prompt::IMAGE_PAD).count();
        if pads != images.len() {
            return Err(ModelError::Input(format!("the prompt holds {pads} image pads for {} images", images.len())));
        }
        let tower = match (tower, images.is_empty()) {
            (Some(t), _) => Some(t),
            (None, true) => None,
            (None, false) => return Err(ModelError::Config("images in the prompt, but the text encoder has no vision tower (`visual.*`)".into())),
        };
        // The pads widened, and where each image's tokens start.
        let mut tokens = Vec::with_capacity(ids.len());
        let mut starts = Vec::new();
        let mut k = 0;
        for &t in &ids {
            if t == prompt::IMAGE_PAD {
                starts.push(tokens.len());
                tokens.extend(std::iter::repeat_n(t as i32, images[k].len() / 4));
                k += 1;
            } else {
                tokens.push(t as i32);
            }
        }
        let end = prompt::comfy_template_end(&tokens.iter().map(|&t| t as u32).collect::<Vec<_>>());
        let size = self.graph_size(tower, images);
        let ctx = Context::new(size, size)?;
        let mut run = GraphRun::new(&ctx);
        let spans = image_spans(&ctx, &mut run, tower, images, &starts)?;
        let out = self.forward_with_images(&ctx, &mut run, &tokens, &spans, Some(QWEN25_VL_MROPE), &[self.config.layers + 1])?;
        let width = out.ne()[0] as usize;
        let mut hidden = run.compute(backend, &[out], size)?.remove(0);
        Ok((hidden.split_off(end.min(tokens.len().saturating_sub(1)) * width), width))
    }
}

impl LlmEncoder<'_> {
    /// A laid-out prompt with images as sd.cpp encodes it (Qwen-Image-Edit,
    /// `QwenImageEditPlusPipeline`): `prompt.text` holds one `<|image_pad|>` per image,
    /// widened to that image's merged vision tokens; A1111 weights inside the user's text;
    /// every token at its index (no 2-D image positions); each token's state scaled by its
    /// weight with the mean kept; `prompt.drop` leading tokens dropped. Returns the rows
    /// [T × width] and the width.
    pub fn encode_prompt_with_images(&self, backend: &crate::ggml::Backend, tokenizer: &crate::text::llm::LlmTokenizer, prompt: &LlmPrompt, tower: Option<&vision::VisionTower<'_>>, images: &[vision::VisionInput]) -> Result<(Vec<f32>, usize)> {
        let t = tokenizer.tokenize_weighted(&prompt.text, prompt.attn.clone(), prompt.min_length, None).map_err(|e| ModelError::Input(e.to_string()))?;
        let pads = t.ids.iter().filter(|&&i| i == prompt::IMAGE_PAD).count();
        if pads != images.len() {
            return Err(ModelError::Input(format!("the prompt holds {pads} image pads for {} images", images.len())));
        }
        if t.mask.iter().any(|&m| m == 0.0) {
            return Err(ModelError::Input("a prompt with images is not padded".into()));
        }
        let tower = match (tower, images.is_empty()) {
            (Some(tw), _) => Some(tw),
            (None, true) => None,
            (None, false) => return Err(ModelError::Config("images in the prompt, but the text encoder has no vision tower (`visual.*`)".into())),
        };
        let (mut tokens, mut weights, mut starts) = (Vec::new(), Vec::new(), Vec::new());
        let mut k = 0;
        for (&id, &w) in t.ids.iter().zip(&t.weights) {
            let n = if id == prompt::IMAGE_PAD {
                starts.push(tokens.len());
                k += 1;
                images[k - 1].len() / 4
            } else {
                1
            };
            tokens.extend(std::iter::repeat_n(id as i32, n));
            weights.extend(std::iter::repeat_n(w, n));
        }
        if tokens.len() <= prompt.drop {
            return Err(ModelError::Input(format!("the templated prompt has {} tokens, not more than the {} the template drops", tokens.len(), prompt.drop)));
        }
        let size = self.graph_size(tower, images);
        let ctx = Context::new(size, size)?;
        let mut run = GraphRun::new(&ctx);
        let spans = image_spans(&ctx, &mut run, tower, images, &starts)?;
        let out = self.forward_with_images(&ctx, &mut run, &tokens, &spans, None, &prompt.out_layers)?;
        let width = out.ne()[0] as usize;
        let mut hidden = run.compute(backend, &[out], size)?.remove(0);
        crate::models::conditioning::emphasize(&mut hidden, &weights, width);
        let mut rows = hidden.split_off(prompt.drop * width);
        if rows.len() < prompt.pad_states * width {
            rows.resize(prompt.pad_states * width, 0.0);
        }
        Ok((rows, width))
    }
}

impl LlmEncoder<'_> {
    /// Graph nodes for the tower over `images` and this encoder after it.
    fn graph_size(&self, tower: Option<&vision::VisionTower<'_>>, images: &[vision::VisionInput]) -> usize {
        tower.map_or(0, |tw| images.iter().map(|im| tw.graph_size(im)).sum::<usize>()) + 64 * self.config.layers + 1024
    }
}

/// Each image through the tower, its merged tokens placed at its start in the prompt.
fn image_spans<'a>(ctx: &'a Context, run: &mut GraphRun<'a>, tower: Option<&'a vision::VisionTower<'a>>, images: &[vision::VisionInput], starts: &[usize]) -> Result<Vec<ImageSpan<'a>>> {
    let mut spans = Vec::with_capacity(images.len());
    for (im, &at) in images.iter().zip(starts) {
        let t = tower.expect("checked: images need a tower").forward(ctx, run, im)?;
        spans.push(ImageSpan { at, tokens: t, rows: im.rows / vision::MERGE, cols: im.cols / vision::MERGE });
    }
    Ok(spans)
}

/// llama.cpp's GGUF names of an LLM's per-layer tensors beside the Hugging Face names
/// under `layers.N.`.
const GGUF_LAYER_NAMES: [(&str, &str); 11] = [
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The same for the tensors outside the layers.
const GGUF_NAMES: [(&str, &str); 2] = [("token_embd", "embed_tokens"), ("output_norm", "norm")];

/// The Hugging Face name (without `model.`) of an LLM tensor in llama.cpp's GGUF naming
/// (`token_embd.weight`, `blk.N.attn_q.bias`, ...), or `None` for a name outside it
/// (`output.weight`, the language-model head an encoder never reads).
pub fn hf_name(gguf: &str) -> Option<String> {
    let (stem, kind) = gguf.rsplit_once('.')?;
    if let Some((_, hf)) = GGUF_NAMES.iter().find(|(g, _)| *g == stem) {
        return Some(format!("{hf}.{kind}"));
    }
    let (i, part) = stem.strip_prefix("blk.")?.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (_, hf) = GGUF_LAYER_NAMES.iter().find(|(g, _)| *g == part)?;
    Some(format!("layers.{i}.{hf}.{kind}"))
}

/// The inverse of [`hf_name`]: llama.cpp's GGUF name of an LLM tensor in Hugging Face's
/// names (with or without `model.`), or `None` for a name outside the encoder.
pub fn llama_cpp_name(hf: &str) -> Option<String> {
    let hf = hf.strip_prefix("model.").unwrap_or(hf);
    let (stem, kind) = hf.rsplit_once('.')?;
    if let Some((g, _)) = GGUF_NAMES.iter().find(|(_, h)| *h == stem) {
        return Some(format!("{g}.{kind}"));
    }
    let (i, part) = stem.strip_prefix("layers.")?.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (g, _) = GGUF_LAYER_NAMES.iter().find(|(_, h)| *h == part)?;
    Some(format!("blk.{i}.{g}.{kind}"))
}

/// GGUF architectures whose q and k rows llama.cpp's converter interleaves (`permute`, so
/// that ggml's plain RoPE rotates adjacent pairs); it leaves Qwen's as they are.
const PERMUTED_ARCHS: [&str; 3] = ["llama", "mistral", "mistral3"];

/// `src` in Hugging Face's layout: a GGUF file in llama.cpp's naming renamed by
/// [`hf_name`] (tensors an encoder never reads left out) and, for a llama-architecture file
/// (Mistral's), its q and k rows put back in Hugging Face's order (each head's two RoPE
/// halves apart), so one rotary layout serves every file; any other source as it is.
pub fn hf_layout(src: Box<dyn crate::io::TensorSource>) -> Result<Box<dyn crate::io::TensorSource>> {
    let arch = src.metadata().get("general.architecture").cloned().unwrap_or_default();
    if !PERMUTED_ARCHS.contains(&arch.as_str()) || !src.tensors().iter().any(|t| t.name.starts_with("blk.")) {
        return super::load::gguf_renamed(src, "blk.", hf_name);
    }
    let shown = src.path().display().to_string();
    let count = |key: &str| -> Result<usize> {
        let k = format!("{arch}.attention.{key}");
        src.metadata().get(&k).and_then(|v| v.parse().ok()).filter(|&n: &usize| n > 0).ok_or_else(|| ModelError::Config(format!("{shown}: no `{k}` (a {arch} GGUF names its head counts)")))
    };
    let (heads, kv_heads) = (count("head_count")?, count("head_count_kv").or_else(|_| count("head_count"))?);
    let mut plan = Vec::new();
    for t in src.tensors() {
        let Some(name) = hf_name(&t.name) else { continue };
        let rows = t.shape.first().copied().unwrap_or(1);
        let n = match t.name.rsplit('.').nth(1) {
            Some("attn_q") => heads,
            Some("attn_k") => kv_heads,
            _ => 0,
        };
        if n == 0 {
            plan.push((name, vec![crate::io::Rows::all(t)]));
            continue;
        }
        let d = rows / n;
        if d % 2 != 0 || d * n != rows {
            return Err(ModelError::Weight { name: t.name.clone(), detail: format!("{shown}: {rows} rows are not {n} heads of an even width") });
        }
        // Hugging Face row (head h, half i, pair j) is llama.cpp's row h·d + 2j + i.
        let parts = (0..rows)
            .map(|r| {
                let (h, rem) = (r / d, r % d);
                crate::io::Rows { source: t.name.clone(), first: h * d + 2 * (rem % (d / 2)) + rem / (d / 2), rows: 1 }
            })
            .collect();
        plan.push((name, parts));
    }
    let assembled = crate::io::Assembled::new(src, plan).map_err(|detail| ModelError::Weight { name: shown, detail })?;
    Ok(Box::new(assembled))
}
