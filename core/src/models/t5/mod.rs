//! The T5 v1.1 encoder (T5-XXL: SD3, FLUX.1, Chroma) and UMT5's (Wan), the encoder half
//! only, in the key layout of Hugging Face's `T5EncoderModel` (what `t5xxl_fp16.safetensors`
//! and ComfyUI's single files hold, bare or under a prefix). GGUF files in llama.cpp's
//! naming are shown in this layout by [`hf_name`].
//!
//! Born as its own folder because the DiT families share it: FLUX, SD3 and Chroma read
//! T5-XXL, Wan reads UMT5-XXL, which differs only in carrying its relative-position bias
//! in every layer instead of the first.

mod attention;

pub use attention::relative_position_bucket;

use super::nn::rms_norm;
use super::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};

/// The encoder's dimensions; everything but the bucket parameters is read off the weights.
#[derive(Clone, Debug, PartialEq)]
pub struct T5Config {
    pub d_model: i64,
    pub layers: usize,
    pub heads: i64,
    /// Width of one head (64 for T5-XXL; `heads · d_kv` need not equal `d_model`).
    pub d_kv: i64,
    pub d_ff: i64,
    pub vocab: i64,
    pub buckets: i64,
    pub max_distance: i64,
    pub eps: f32,
    /// UMT5: each layer has its own relative-position bias; T5: layer 0's serves all.
    pub bias_per_layer: bool,
}

/// The weight names of one encoder in Hugging Face's layout under `prefix`.
#[derive(Clone, Debug)]
struct Names {
    prefix: String,
}

impl Names {
    fn at(&self, s: &str) -> String {
        format!("{}{s}", self.prefix)
    }
    fn layer(&self, i: usize) -> String {
        self.at(&format!("encoder.block.{i}.layer"))
    }
    fn attn(&self, i: usize, part: &str) -> String {
        format!("{}.0.SelfAttention.{part}.weight", self.layer(i))
    }
    fn bias(&self, i: usize) -> String {
        self.attn(i, "relative_attention_bias")
    }
    fn ff(&self, i: usize, part: &str) -> String {
        format!("{}.1.DenseReluDense.{part}.weight", self.layer(i))
    }
    fn norm(&self, i: usize, sub: usize) -> String {
        format!("{}.{sub}.layer_norm.weight", self.layer(i))
    }
    fn final_norm(&self) -> String {
        self.at("encoder.final_layer_norm.weight")
    }
    /// The token embedding: `shared.weight`, or the encoder's tied copy when a file
    /// keeps only that.
    fn embedding(&self, w: &Weights) -> String {
        let shared = self.at("shared.weight");
        if w.contains(&shared) {
            shared
        } else {
            self.at("encoder.embed_tokens.weight")
        }
    }
}

/// The weight that marks a T5 encoder in Hugging Face names, relative to its prefix.
pub const MARKER: &str = "encoder.block.0.layer.0.SelfAttention.q.weight";

/// The prefix under which tensors called `names` hold a T5 encoder (`""`,
/// `text_encoders.t5xxl.transformer.`, ...): the part before [`MARKER`].
pub fn find_prefix<'a>(names: impl Iterator<Item = &'a str>) -> Option<String> {
    super::prefix_before(names, MARKER)
}

/// Whether tensors called `names` hold a T5 encoder, in Hugging Face or llama.cpp names.
pub fn is_t5<'a>(mut names: impl Iterator<Item = &'a str>) -> bool {
    names.any(|n| n.ends_with(MARKER) || n == "enc.blk.0.attn_q.weight")
}

impl T5Config {
    /// Read the dimensions off the weights under `prefix`.
    pub fn infer(w: &Weights, prefix: &str) -> Result<Self> {
        let names = Names { prefix: prefix.to_string() };
        let layers = (0..).take_while(|&i| w.contains(&names.attn(i, "q"))).count();
        if layers == 0 {
            return Err(ModelError::Config(format!("no T5 encoder layers under `{prefix}` (`{}`)", names.attn(0, "q"))));
        }
        let emb = w.get(&names.embedding(w))?.ne();
        // Stored [buckets, heads]: ggml order [heads, buckets].
        let bias = w.get(&names.bias(0))?.ne();
        let q = w.get(&names.attn(0, "q"))?.ne();
        let wi = w.get(&names.ff(0, "wi_0")).map_err(|_| ModelError::Config(format!("`{}`: only the gated-GELU T5 (v1.1, T5-XXL, UMT5) is supported", names.ff(0, "wi_0"))))?.ne();
        let heads = bias[0];
        if heads < 1 || q[1] % heads != 0 {
            return Err(ModelError::Config(format!("{heads} heads (from `{}`) do not divide the attention width {}", names.bias(0), q[1])));
        }
        Ok(T5Config {
            d_model: emb[0],
            layers,
            heads,
            d_kv: q[1] / heads,
            d_ff: wi[1],
            vocab: emb[1],
            buckets: bias[1],
            max_distance: 128,
            eps: 1e-6,
            bias_per_layer: layers > 1 && w.contains(&names.bias(1)),
        })
    }
}

/// A T5 encoder over [`Weights`] whose shapes have been checked.
pub struct T5Encoder<'w> {
    w: &'w Weights,
    names: Names,
    pub config: T5Config,
}

impl<'w> T5Encoder<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, prefix: &str, config: T5Config) -> Result<Self> {
        let c = &config;
        if c.buckets < 2 || c.buckets % 2 != 0 || c.max_distance < 1 {
            return Err(ModelError::Config(format!("{} relative-position buckets, max distance {}", c.buckets, c.max_distance)));
        }
        let names = Names { prefix: prefix.to_string() };
        let (d, inner, f) = (c.d_model, c.heads * c.d_kv, c.d_ff);
        w.expect(&names.embedding(w), &[d, c.vocab])?;
        for i in 0..c.layers {
            for p in ["q", "k", "v"] {
                w.expect(&names.attn(i, p), &[d, inner])?;
            }
            w.expect(&names.attn(i, "o"), &[inner, d])?;
            if i == 0 || c.bias_per_layer {
                w.expect(&names.bias(i), &[c.heads, c.buckets])?;
            }
            w.expect(&names.ff(i, "wi_0"), &[d, f])?;
            w.expect(&names.ff(i, "wi_1"), &[d, f])?;
            w.expect(&names.ff(i, "wo"), &[f, d])?;
            w.expect(&names.norm(i, 0), &[d])?;
            w.expect(&names.norm(i, 1), &[d])?;
        }
        w.expect(&names.final_norm(), &[d])?;
        Ok(T5Encoder { w, names, config })
    }

    /// The last hidden states [d_model, T, B] (after the final norm) for `tokens`, B
    /// sequences of one length T. `keep`, if given, marks per sequence which tokens the
    /// others may attend to (Hugging Face's `attention_mask`: Chroma's T5 mask); without
    /// it every token, padding included, is attended to, as FLUX and SD3 run T5.
    pub fn forward<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, tokens: &[Vec<i32>], keep: Option<&[Vec<bool>]>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let (b, t) = super::check_token_batch(tokens, keep, c.vocab, "T5")?;
        let key_mask = match keep {
            None => None,
            Some(k) => {
                // Added to the scores of every query: [Tk, 1, 1, B]. Hugging Face adds
                // the type's lowest value; any value that makes exp() zero is the same.
                let v = k.iter().flatten().map(|&on| if on { 0.0 } else { f32::MIN }).collect();
                Some(run.input_f32(&[t as i64, 1, 1, b as i64], v)?)
            }
        };
        let (d, t, b) = (c.d_model, t as i64, b as i64);
        let ids = run.input_i32(&[t * b], tokens.iter().flatten().copied().collect())?;
        let mut x = ctx.reshape(ctx.get_rows(self.w.get(&self.names.embedding(self.w))?, ids)?, [d, t, b, 1])?;
        let buckets = attention::bucket_table(t, c.buckets, c.max_distance);
        let buckets = run.input_i32(&[t * t], buckets)?;
        let mut bias = None;
        for i in 0..c.layers {
            if i == 0 || c.bias_per_layer {
                bias = Some(attention::position_bias(ctx, self.w.get(&self.names.bias(i))?, buckets, t)?);
            }
            let bias = bias.expect("layer 0 sets the bias");
            let h = rms_norm(ctx, self.w, &self.names.norm(i, 0), x, c.eps)?;
            let a = attention::self_attention(ctx, self.w, &|p| self.names.attn(i, p), h, c.heads, bias, key_mask)?;
            x = ctx.add(x, a)?;
            let h = rms_norm(ctx, self.w, &self.names.norm(i, 1), x, c.eps)?;
            let gate = ctx.gelu_tanh_exact(super::nn::project(ctx, self.w, &self.names.ff(i, "wi_0"), h)?)?;
            let up = super::nn::project(ctx, self.w, &self.names.ff(i, "wi_1"), h)?;
            let h = super::nn::project(ctx, self.w, &self.names.ff(i, "wo"), ctx.mul(gate, up)?)?;
            x = ctx.add(x, h)?;
        }
        rms_norm(ctx, self.w, &self.names.final_norm(), x, c.eps)
    }
}

/// llama.cpp's GGUF names of a T5 encoder's per-layer tensors (what city96's T5 GGUF files and
/// llama.cpp's converter write) beside the Hugging Face names under `encoder.block.N.layer.`.
const GGUF_LAYER_NAMES: [(&str, &str); 10] = [
    ("attn_q", "0.SelfAttention.q"),
    ("attn_k", "0.SelfAttention.k"),
    ("attn_v", "0.SelfAttention.v"),
    ("attn_o", "0.SelfAttention.o"),
    ("attn_rel_b", "0.SelfAttention.relative_attention_bias"),
    ("attn_norm", "0.layer_norm"),
    ("ffn_gate", "1.DenseReluDense.wi_0"),
    ("ffn_up", "1.DenseReluDense.wi_1"),
    ("ffn_down", "1.DenseReluDense.wo"),
    ("ffn_norm", "1.layer_norm"),
];

/// The same for the tensors outside the layers.
const GGUF_NAMES: [(&str, &str); 2] = [("token_embd.weight", "shared.weight"), ("enc.output_norm.weight", "encoder.final_layer_norm.weight")];

/// The Hugging Face name of a T5 encoder tensor in llama.cpp's GGUF naming (`token_embd`,
/// `enc.blk.N.attn_q`, ...), or `None` for a name outside it (decoder tensors, which an
/// encoder never reads).
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((_, hf)) = GGUF_NAMES.iter().find(|(g, _)| *g == gguf) {
        return Some(hf.to_string());
    }
    let (i, part) = gguf.strip_prefix("enc.blk.")?.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (_, hf) = GGUF_LAYER_NAMES.iter().find(|(g, _)| part.strip_suffix(".weight") == Some(*g))?;
    Some(format!("encoder.block.{i}.layer.{hf}.weight"))
}

/// The inverse of [`hf_name`]: llama.cpp's name of a Hugging Face T5 encoder tensor.
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((g, _)) = GGUF_NAMES.iter().find(|(_, h)| *h == hf) {
        return Some(g.to_string());
    }
    let (i, part) = hf.strip_prefix("encoder.block.")?.split_once(".layer.")?;
    let i: usize = i.parse().ok()?;
    let (g, _) = GGUF_LAYER_NAMES.iter().find(|(_, h)| part.strip_suffix(".weight") == Some(*h))?;
    Some(format!("enc.blk.{i}.{g}.weight"))
}

/// `src` in Hugging Face's layout: a GGUF file in llama.cpp's naming renamed by
/// [`hf_name`] (decoder tensors left out), any other source as it is.
pub fn hf_layout(src: Box<dyn crate::io::TensorSource>) -> Result<Box<dyn crate::io::TensorSource>> {
    super::load::gguf_renamed(src, "enc.blk.", hf_name)
}

impl T5Encoder<'_> {
    /// A weighted prompt's hidden states [T × d_model], row-major by token, as ComfyUI
    /// encodes T5 prompts: no attention mask, and where some weight is not 1 the empty
    /// prompt of the same length encoded beside it (one batch) and each token moved away
    /// from it by its weight ([`crate::text::t5::apply_weights`]).
    pub fn encode_weighted(&self, backend: &crate::ggml::Backend, tokens: &crate::text::t5::WeightedTokens) -> Result<Vec<f32>> {
        self.encode_weighted_from(backend, tokens, &crate::text::t5::T5Tokenizer::empty(tokens.ids.len()))
    }

    /// sd.cpp's T5 conditioning: `tokens` (the prompt's, without `</s>`) cut into chunks
    /// of `chunk − 1`, each closed by `</s>` and padded to `chunk`, every chunk encoded
    /// alone (`mask`: its padding hidden from T5's attention, Chroma's T5 mask), weighted
    /// by [`crate::models::conditioning::emphasize`] chunk by chunk. Returns the hidden
    /// states [T × d_model] and how many leading tokens are the prompt and `</s>`s (the
    /// last chunk's padding follows them).
    pub fn encode_chunked(&self, backend: &crate::ggml::Backend, tokens: &crate::text::t5::WeightedTokens, chunk: usize, mask: bool) -> Result<(Vec<f32>, usize)> {
        use crate::text::t5::{T5_EOS, T5_PAD};
        if chunk < 2 {
            return Err(ModelError::Input(format!("T5 chunks of {chunk} tokens")));
        }
        let d = self.config.d_model as usize;
        let pieces: Vec<(&[u32], &[f32])> = if tokens.ids.is_empty() { vec![(&[][..], &[][..])] } else { tokens.ids.chunks(chunk - 1).zip(tokens.weights.chunks(chunk - 1)).collect() };
        let mut hidden = Vec::with_capacity(pieces.len() * chunk * d);
        let mut content = 0;
        for (ids, weights) in pieces {
            let mut seq: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
            seq.push(T5_EOS as i32);
            content = hidden.len() / d + seq.len();
            let keep: Vec<bool> = (0..chunk).map(|i| i < seq.len()).collect();
            seq.resize(chunk, T5_PAD as i32);
            let mut w = weights.to_vec();
            w.resize(chunk, 1.0);
            let size = 64 * self.config.layers + 256;
            let ctx = Context::new(size, size)?;
            let mut run = GraphRun::new(&ctx);
            let keep = [keep];
            let out = self.forward(&ctx, &mut run, &[seq], mask.then_some(&keep[..]))?;
            let mut h = run.compute(backend, &[out], size)?.remove(0);
            crate::models::conditioning::emphasize(&mut h, &w, d);
            hidden.extend(h);
        }
        Ok((hidden, content))
    }

    /// ComfyUI's masked T5 encoding (Wan's UMT5: `enable_attention_masks`,
    /// `zero_out_masked`): each sequence attends only to its tokens up to and including
    /// the first `</s>`, and the hidden states after it are zeros; where some weight is not
    /// 1 the empty prompt (`</s>` and padding, masked alike) is encoded beside it and each
    /// token moved away from it by its weight. Returns [T × d_model].
    pub fn encode_zero_masked(&self, backend: &crate::ggml::Backend, tokens: &crate::text::t5::WeightedTokens) -> Result<Vec<f32>> {
        use crate::text::t5::{T5Tokenizer, T5_EOS};
        let t = tokens.ids.len();
        let mut batch = vec![tokens.ids.clone()];
        if tokens.has_weights() {
            batch.push(T5Tokenizer::empty(t));
        }
        let keep: Vec<Vec<bool>> = batch
            .iter()
            .map(|ids| {
                let end = ids.iter().position(|&i| i == T5_EOS).map_or(ids.len(), |p| p + 1);
                (0..ids.len()).map(|i| i < end).collect()
            })
            .collect();
        let seqs: Vec<Vec<i32>> = batch.iter().map(|ids| ids.iter().map(|&i| i as i32).collect()).collect();
        let size = 64 * self.config.layers + 256;
        let ctx = Context::new(size, size)?;
        let mut run = GraphRun::new(&ctx);
        let out = self.forward(&ctx, &mut run, &seqs, Some(&keep))?;
        let mut all = run.compute(backend, &[out], size)?.remove(0);
        let d = self.config.d_model as usize;
        for (row, kept) in all.chunks_exact_mut(d).zip(keep.iter().flatten()) {
            if !kept {
                row.fill(0.0);
            }
        }
        let mut hidden: Vec<f32> = all.drain(..t * d).collect();
        if tokens.has_weights() {
            crate::text::t5::apply_weights(&mut hidden, &all, &tokens.weights, d);
        }
        Ok(hidden)
    }

    /// [`Self::encode_weighted`] moving weighted tokens away from `empty` (as many ids as
    /// the prompt's): ComfyUI's PixArt/Chroma T5 takes all padding for its empty prompt.
    pub fn encode_weighted_from(&self, backend: &crate::ggml::Backend, tokens: &crate::text::t5::WeightedTokens, empty: &[u32]) -> Result<Vec<f32>> {
        let ids: Vec<i32> = tokens.ids.iter().map(|&t| t as i32).collect();
        let t = ids.len();
        if empty.len() != t {
            return Err(ModelError::Input(format!("an empty prompt of {} tokens beside a prompt of {t}", empty.len())));
        }
        let mut batch = vec![ids];
        if tokens.has_weights() {
            batch.push(empty.iter().map(|&i| i as i32).collect());
        }
        let size = 64 * self.config.layers + 256;
        let ctx = Context::new(size, size)?;
        let mut run = GraphRun::new(&ctx);
        let out = self.forward(&ctx, &mut run, &batch, None)?;
        let mut all = run.compute(backend, &[out], size)?.remove(0);
        let d = self.config.d_model as usize;
        let mut hidden: Vec<f32> = all.drain(..t * d).collect();
        if tokens.has_weights() {
            crate::text::t5::apply_weights(&mut hidden, &all, &tokens.weights, d);
        }
        Ok(hidden)
    }
}
