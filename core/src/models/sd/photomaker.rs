//! PhotoMaker (TencentARC) v1 and v2: the ID encoder that stacks the identity of a few
//! face photos into the prompt embedding of an SDXL model.
//!
//! A PhotoMaker file holds the ID encoder and a LoRA for the UNet, either as the official
//! `.bin`'s two dicts (`id_encoder.*`, `lora_weights.*`, read flat like any nested
//! pickle) or as sd.cpp's safetensors conversion (the encoder's names at the top level,
//! the LoRA under `unet.*`). The encoder is a CLIP ViT-L/14 vision tower
//! ([`crate::models::clip_vision`]) plus:
//! - v1 (`PhotoMakerIDEncoder`): `visual_projection` (→ CLIP-L's 768) and
//!   `visual_projection_2` (→ OpenCLIP-G's 1280) of the pooled class token, side by side:
//!   one 2048-wide ID embedding per image;
//! - v2 (`PhotoMakerIDEncoder_CLIPInsightfaceExtendtoken`, detected by
//!   `qformer_perceiver.*`): an InsightFace face embedding (512) per image through
//!   `token_proj` to two tokens, refined by a perceiver resampler over the vision tower's
//!   last hidden states: two ID embeddings per image.
//!
//! `fuse_module` then merges each ID embedding with the prompt embedding of one copy of
//! the class word ("man", "woman", …) that precedes the trigger word: the prompt carries
//! the class token once per ID embedding ([`expand_trigger`]), and those rows are
//! replaced by `LayerNorm(mlp2(mlp1([prompt; id]) + prompt))`.

use std::path::Path;

use crate::models::clip::Activation;
use crate::models::clip_vision::{ClipVisionConfig, ClipVisionModel};
use super::ip_adapter::{expect_perceiver_layers, norm, perceiver_layers};
use crate::models::nn::{layer_norm, linear, project};
use crate::models::conditioning::Conditioning;
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Backend, Context, GraphRun, Tensor};
use crate::text::{TokenizedPrompt, EOS_TOKEN};

const EPS: f32 = 1e-5;
/// The perceiver's heads are 128 wide in the released v2 model.
const HEAD_DIM: i64 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// v2's `qformer_perceiver`.
#[derive(Clone, Debug, PartialEq)]
pub struct QFormerConfig {
    /// Width of a face embedding (InsightFace's 512).
    pub id_dim: i64,
    /// `token_proj`'s hidden width (4 × `id_dim`).
    pub proj_hidden: i64,
    /// ID tokens per image (2).
    pub tokens: i64,
    /// Attention width of the resampler (`to_q`'s outputs).
    pub inner: i64,
    pub heads: i64,
    pub depth: usize,
    /// The feed-forward's hidden width.
    pub ff: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PhotoMakerConfig {
    /// `"id_encoder."` (the official file) or `""` (sd.cpp's conversion).
    pub prefix: String,
    pub vision: ClipVisionConfig,
    /// Width of `visual_projection_2`'s output.
    pub projection_2: i64,
    /// Width of the fused embeddings: the prompt's (SDXL's 2048).
    pub embed_dim: i64,
    /// v2's face-token path; `None` for v1.
    pub qformer: Option<QFormerConfig>,
}

impl PhotoMakerConfig {
    /// Read the structure off the weights.
    pub fn infer(w: &Weights) -> Result<Self> {
        let prefix = ["id_encoder.", ""].into_iter().find(|p| w.contains(&format!("{p}visual_projection_2.weight"))).ok_or_else(|| {
            ModelError::Config("not a PhotoMaker ID encoder: no `id_encoder.visual_projection_2.weight` (official file) or `visual_projection_2.weight` (sd.cpp's conversion)".into())
        })?;
        let n = |s: &str| format!("{prefix}{s}");
        let mut vision = ClipVisionConfig::infer(w, prefix)?;
        // PhotoMaker's tower is always OpenAI's ViT-L/14 (quick-GELU) whatever its width.
        vision.activation = Activation::QuickGelu;
        if vision.hidden % vision.heads != 0 {
            vision.heads = 1;
        }
        let projection_2 = w.get(&n("visual_projection_2.weight"))?.ne()[1];
        let embed_dim = w.get(&n("fuse_module.layer_norm.weight"))?.ne()[0];
        let qformer = if w.contains(&n("qformer_perceiver.token_norm.weight")) {
            let q = |s: &str| n(&format!("qformer_perceiver.{s}"));
            let p0 = w.get(&q("token_proj.0.weight"))?.ne();
            let p2 = w.get(&q("token_proj.2.weight"))?.ne();
            if embed_dim < 1 || p2[1] % embed_dim != 0 {
                return Err(ModelError::Weight { name: q("token_proj.2.weight"), detail: format!("{} outputs are not tokens of the fuse width {embed_dim}", p2[1]) });
            }
            let r = |s: &str| q(&format!("perceiver_resampler.{s}"));
            let depth = (0..).take_while(|i| w.contains(&r(&format!("layers.{i}.0.to_q.weight")))).count();
            if depth == 0 {
                return Err(ModelError::MissingWeight(r("layers.0.0.to_q.weight")));
            }
            let inner = w.get(&r("layers.0.0.to_q.weight"))?.ne()[1];
            let ff = w.get(&r("layers.0.1.1.weight"))?.ne()[1];
            // Toy models narrower than one real head attend with a single head.
            let heads = if inner % HEAD_DIM == 0 { inner / HEAD_DIM } else { 1 };
            Some(QFormerConfig { id_dim: p0[0], proj_hidden: p0[1], tokens: p2[1] / embed_dim, inner, heads, depth, ff })
        } else {
            None
        };
        Ok(PhotoMakerConfig { prefix: prefix.to_string(), vision, projection_2, embed_dim, qformer })
    }

    pub fn version(&self) -> Version {
        if self.qformer.is_some() {
            Version::V2
        } else {
            Version::V1
        }
    }

    /// ID embeddings per image (1 for v1, 2 for v2): how many copies of the class token
    /// each image takes in the prompt.
    pub fn tokens_per_image(&self) -> usize {
        self.qformer.as_ref().map_or(1, |q| q.tokens as usize)
    }
}

pub struct PhotoMaker<'w> {
    w: &'w Weights,
    vision: ClipVisionModel<'w>,
    pub config: PhotoMakerConfig,
}

impl<'w> PhotoMaker<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, config: PhotoMakerConfig) -> Result<Self> {
        let vision = ClipVisionModel::new(w, &config.prefix, config.vision.clone())?;
        let c = &config;
        let n = |s: &str| format!("{}{s}", c.prefix);
        let (d, h) = (c.embed_dim, c.vision.hidden);
        w.expect(&n("visual_projection_2.weight"), &[h, c.projection_2])?;
        let mlp = |name: &str, cin: i64| -> Result<()> {
            norm(w, &n(&format!("fuse_module.{name}.layernorm")), cin)?;
            w.expect(&n(&format!("fuse_module.{name}.fc1.weight")), &[cin, d])?;
            w.expect(&n(&format!("fuse_module.{name}.fc1.bias")), &[d])?;
            w.expect(&n(&format!("fuse_module.{name}.fc2.weight")), &[d, d])?;
            w.expect(&n(&format!("fuse_module.{name}.fc2.bias")), &[d])?;
            Ok(())
        };
        mlp("mlp1", 2 * d)?;
        mlp("mlp2", d)?;
        norm(w, &n("fuse_module.layer_norm"), d)?;
        match &c.qformer {
            None => {
                if c.vision.projection_dim + c.projection_2 != d {
                    return Err(ModelError::Config(format!(
                        "PhotoMaker: the two projections ({} + {}) do not make the fuse width {d}",
                        c.vision.projection_dim, c.projection_2
                    )));
                }
            }
            Some(q) => {
                let p = |s: &str| n(&format!("qformer_perceiver.{s}"));
                w.expect(&p("token_proj.0.weight"), &[q.id_dim, q.proj_hidden])?;
                w.expect(&p("token_proj.0.bias"), &[q.proj_hidden])?;
                w.expect(&p("token_proj.2.weight"), &[q.proj_hidden, q.tokens * d])?;
                w.expect(&p("token_proj.2.bias"), &[q.tokens * d])?;
                norm(w, &p("token_norm"), d)?;
                w.expect(&p("perceiver_resampler.proj_in.weight"), &[h, d])?;
                w.expect(&p("perceiver_resampler.proj_in.bias"), &[d])?;
                expect_perceiver_layers(w, &p("perceiver_resampler"), d, q.inner, q.ff, q.depth)?;
                w.expect(&p("perceiver_resampler.proj_out.weight"), &[d, d])?;
                w.expect(&p("perceiver_resampler.proj_out.bias"), &[d])?;
                norm(w, &p("perceiver_resampler.norm_out"), d)?;
            }
        }
        Ok(PhotoMaker { w, vision, config })
    }

    fn n(&self, s: &str) -> String {
        format!("{}{s}", self.config.prefix)
    }

    /// The ID embeddings [embed_dim, tokens_per_image · N] of preprocessed images `pixels`
    /// [S, S, 3, N] (v2 also takes their face embeddings `faces` [id_dim, N]), image-major.
    pub fn id_embeds<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, pixels: Tensor<'a>, faces: Option<Tensor<'a>>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let b = pixels.ne()[3];
        let out = self.vision.forward(ctx, run, pixels)?;
        let Some(q) = &c.qformer else {
            let id2 = project(ctx, self.w, &self.n("visual_projection_2.weight"), out.pooled)?;
            return Ok(ctx.concat(out.image_embeds, id2, 0)?);
        };
        let faces = faces.ok_or_else(|| ModelError::Input("PhotoMaker v2 needs the face ID embeddings (InsightFace) of the ID images".into()))?;
        let fne = faces.ne();
        if fne[0] != q.id_dim || fne[1] != b {
            return Err(ModelError::Input(format!("face ID embeddings {fne:?}: PhotoMaker v2 takes one {}-wide embedding per ID image ({b})", q.id_dim)));
        }
        let d = c.embed_dim;
        let p = |s: &str| self.n(&format!("qformer_perceiver.{s}"));
        let x = ctx.gelu_erf(linear(ctx, self.w, &p("token_proj.0"), faces)?)?;
        let x = linear(ctx, self.w, &p("token_proj.2"), x)?;
        let x = layer_norm(ctx, self.w, &p("token_norm"), ctx.reshape(x, [d, q.tokens, b, 1])?, EPS)?;
        let r = p("perceiver_resampler");
        let h = linear(ctx, self.w, &format!("{r}.proj_in"), out.last_hidden)?;
        let lat = perceiver_layers(ctx, self.w, &r, h, x, q.depth, q.inner, q.heads)?;
        let lat = linear(ctx, self.w, &format!("{r}.proj_out"), lat)?;
        let lat = layer_norm(ctx, self.w, &format!("{r}.norm_out"), lat, EPS)?;
        let out = ctx.add(x, lat)?;
        Ok(ctx.reshape(out, [d, q.tokens * b, 1, 1])?)
    }

    /// `fuse_module.fuse_fn`: the class-token rows of the prompt `prompt` [D, M] merged
    /// with the ID embeddings `id` [D, M].
    pub fn fuse<'a>(&'a self, ctx: &'a Context, prompt: Tensor<'a>, id: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let mlp = |name: &str, x: Tensor<'a>, residual: bool| -> Result<Tensor<'a>> {
            let m = self.n(&format!("fuse_module.{name}"));
            let h = layer_norm(ctx, self.w, &format!("{m}.layernorm"), x, EPS)?;
            let h = ctx.gelu_erf(linear(ctx, self.w, &format!("{m}.fc1"), h)?)?;
            let h = linear(ctx, self.w, &format!("{m}.fc2"), h)?;
            Ok(if residual { ctx.add(h, x)? } else { h })
        };
        let x = mlp("mlp1", ctx.concat(prompt, id, 0)?, false)?;
        let x = mlp("mlp2", ctx.add(x, prompt)?, true)?;
        layer_norm(ctx, self.w, &self.n("fuse_module.layer_norm"), x, EPS)
    }

    /// `cond` with the rows at `positions` (the class token's copies, in order) replaced
    /// by their fusion with the ID embeddings of `n` preprocessed images `pixels`
    /// ([N, 3, S, S]) and, for v2, their face embeddings `faces` ([N, id_dim]).
    pub fn stack(&self, backend: &Backend, cond: &Conditioning, positions: &[usize], pixels: Vec<f32>, n: usize, faces: Option<Vec<f32>>) -> Result<Conditioning> {
        let c = &self.config;
        let d = c.embed_dim;
        if cond.dim != d {
            return Err(ModelError::Input(format!(
                "the prompt embedding is {} wide and PhotoMaker fuses {d}-wide ones (SDXL's CLIP-L + OpenCLIP-G): use an SDXL model's CLIP",
                cond.dim
            )));
        }
        let m = n * c.tokens_per_image();
        if positions.len() != m {
            return Err(ModelError::Input(format!("{} class-token positions for {m} ID embeddings", positions.len())));
        }
        if let Some(&p) = positions.iter().find(|&&p| p as i64 >= cond.tokens) {
            return Err(ModelError::Input(format!("class-token position {p} is past the prompt's {} tokens", cond.tokens)));
        }
        let du = d as usize;
        let rows: Vec<f32> = positions.iter().flat_map(|&p| cond.data[p * du..(p + 1) * du].iter().copied()).collect();
        const GRAPH: usize = 8192;
        let ctx = Context::new(GRAPH, GRAPH)?;
        let mut run = GraphRun::new(&ctx);
        let s = c.vision.image_size;
        let px = run.input_f32(&[s, s, 3, n as i64], pixels)?;
        let faces = match (faces, &c.qformer) {
            (Some(f), Some(q)) => Some(run.input_f32(&[q.id_dim, n as i64], f)?),
            _ => None,
        };
        let id = self.id_embeds(&ctx, &mut run, px, faces)?;
        let prompt = run.input_f32(&[d, m as i64], rows)?;
        let fused = self.fuse(&ctx, prompt, id)?;
        let fused = run.compute(backend, &[fused], GRAPH)?.remove(0);
        let mut out = cond.clone();
        for (i, &p) in positions.iter().enumerate() {
            out.data[p * du..(p + 1) * du].copy_from_slice(&fused[i * du..(i + 1) * du]);
        }
        Ok(out)
    }
}

/// Why a prompt gets no PhotoMaker identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TriggerError {
    #[error("the trigger word is not in the prompt")]
    NotFound,
    #[error("the trigger word does not follow a class word (\"man img\", \"woman img\")")]
    NoClassWord,
}

/// `prompt` (laid into chunks) with its first `trigger` token removed and the token
/// before it (the class word) repeated `repeat` times, as sd.cpp's
/// `tokenize_photomaker_trigger` does; with the flat positions (chunk · chunk length +
/// index) of the class token's copies in the prompt's conditioning. `repeat` 1 gives the
/// prompt without the trigger. Copies that overflow their chunk's 75 tokens push the rest
/// of it into a new chunk. `pad` is the tokenizer's padding token.
pub fn expand_trigger(prompt: &TokenizedPrompt, trigger: u32, repeat: usize, pad: u32) -> std::result::Result<(TokenizedPrompt, Vec<usize>), TriggerError> {
    for (ci, chunk) in prompt.chunks.iter().enumerate() {
        let len = chunk.tokens.len();
        let end = chunk.tokens.iter().skip(1).position(|&t| t == EOS_TOKEN).map_or(len.saturating_sub(1), |p| p + 1);
        let Some(t) = chunk.tokens[1..end].iter().position(|&x| x == trigger).map(|p| p + 1) else { continue };
        let in_embedding = |pos: usize| chunk.embeddings.iter().any(|s| (s.position..s.position + s.embedding.num_vectors()).contains(&pos));
        if t < 2 || in_embedding(t - 1) {
            return Err(TriggerError::NoClassWord);
        }
        // Content without BOS, EOS and padding; the class word sits at content index t − 2.
        let mut content: Vec<(u32, f32)> = (1..end).filter(|&i| i != t).map(|i| (chunk.tokens[i], chunk.weights[i])).collect();
        let class = t - 2;
        let copies = repeat.max(1) - 1;
        for _ in 0..copies {
            content.insert(class + 1, content[class]);
        }
        let shift = |pos: usize| if pos > t { pos + copies - 1 } else { pos };
        let mut slots: Vec<_> = chunk.embeddings.iter().cloned().map(|mut s| {
            s.position = shift(s.position);
            s
        }).collect();
        let cap = len - 2;
        let mut split = content.len().min(cap);
        if let Some(s) = slots.iter().find(|s| s.position - 1 < split && s.position - 1 + s.embedding.num_vectors() > split) {
            split = s.position - 1;
        }
        let make = |part: &[(u32, f32)], embeddings| {
            let mut tokens = Vec::with_capacity(len);
            tokens.push(chunk.tokens[0]);
            tokens.extend(part.iter().map(|p| p.0));
            tokens.push(EOS_TOKEN);
            tokens.resize(len, pad);
            let mut weights = Vec::with_capacity(len);
            weights.push(1.0);
            weights.extend(part.iter().map(|p| p.1));
            weights.resize(len, 1.0);
            crate::text::Chunk { tokens, weights, embeddings }
        };
        let rest_slots: Vec<_> = slots.iter().filter(|s| s.position > split).cloned().map(|mut s| {
            s.position -= split;
            s
        }).collect();
        slots.retain(|s| s.position - 1 < split);
        let mut chunks: Vec<_> = prompt.chunks[..ci].to_vec();
        chunks.push(make(&content[..split], slots));
        if split < content.len() {
            chunks.push(make(&content[split..], rest_slots));
        }
        chunks.extend(prompt.chunks[ci + 1..].iter().cloned());
        let positions = (class..class + copies + 1).map(|i| if i < split { ci * len + 1 + i } else { (ci + 1) * len + 1 + i - split }).collect();
        let out = TokenizedPrompt { chunks, token_count: (prompt.token_count + copies).saturating_sub(1), empty: false, missing_embeddings: prompt.missing_embeddings.clone() };
        return Ok((out, positions));
    }
    Err(TriggerError::NotFound)
}

/// The face ID embeddings file of sd.cpp's `--pm-id-embed-path` ([id_dim, N] values,
/// image-major), as its `face_detect.py` writes it: a ggml tensor dump (`n_dims`, name
/// length, type (0 f32, 1 f16), `n_dims` sizes, the name, the data; all little-endian
/// i32), or a safetensors file with an `id_embeds` tensor [N, id_dim]. Returns the values,
/// `id_dim` and N.
pub fn read_id_embeds(path: &Path) -> Result<IdEmbeds> {
    let shown = path.display();
    let bytes = std::fs::read(path).map_err(|e| ModelError::Input(format!("{shown}: {e}")))?;
    if let Some(r) = parse_ggml_dump(&bytes) {
        return r.map_err(|e| ModelError::Input(format!("{shown}: {e}")));
    }
    let src = crate::io::open(path).map_err(|e| ModelError::Input(format!("{shown}: neither sd.cpp's id_embeds dump nor a tensor file: {e}")))?;
    let info = src.tensors().iter().find(|t| t.name == "id_embeds" || t.name == "pmid.id_embeds").cloned().ok_or_else(|| ModelError::Input(format!("{shown}: no `id_embeds` tensor")))?;
    if info.shape.len() != 2 {
        return Err(ModelError::Input(format!("{shown}: `id_embeds` has shape {:?}; face embeddings are [images, width]", info.shape)));
    }
    let raw = src.read(&info.name).map_err(|e| ModelError::Input(format!("{shown}: {e}")))?;
    let data = crate::dtype::to_f32(info.dtype, &raw, info.n_elements()).map_err(|e| ModelError::Input(format!("{shown}: `id_embeds`: {e}")))?;
    Ok((data, info.shape[1], info.shape[0]))
}

/// `None` when `bytes` do not start like a ggml tensor dump.
/// Face embeddings: the values, their width and their count.
type IdEmbeds = (Vec<f32>, usize, usize);

fn parse_ggml_dump(bytes: &[u8]) -> Option<std::result::Result<IdEmbeds, String>> {
    let i32_at = |o: usize| bytes.get(o..o + 4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let (n_dims, name_len, ttype) = (i32_at(0)?, i32_at(4)?, i32_at(8)?);
    if !(1..=4).contains(&n_dims) || !(0..=256).contains(&name_len) || !(0..=1).contains(&ttype) {
        return None;
    }
    let mut ne = [1usize; 4];
    for (i, n) in ne.iter_mut().enumerate().take(n_dims as usize) {
        let v = i32_at(12 + 4 * i)?;
        if v < 1 {
            return None;
        }
        *n = v as usize;
    }
    let data_at = 12 + 4 * n_dims as usize + name_len as usize;
    let count: usize = ne.iter().product();
    let width = if ttype == 0 { 4 } else { 2 };
    if bytes.len() != data_at + count * width {
        return None;
    }
    if ne[2] * ne[3] != 1 {
        return Some(Err(format!("id_embeds of {ne:?}: face embeddings are [width, images]")));
    }
    let data = &bytes[data_at..];
    let values = if ttype == 0 {
        data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    } else {
        data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
    };
    Some(Ok((values, ne[0], ne[1])))
}
