//! IP-Adapter (h94/IP-Adapter): image prompts through decoupled cross-attention.
//!
//! A file holds two parts, flat (`.safetensors`) or as two nested dicts (`.bin`), which
//! read the same here: `image_proj.*`, which turns a CLIP vision encoding into a few
//! context tokens, and `ip_adapter.N.to_k_ip` / `to_v_ip`, the extra key and value
//! projections of the UNet's attention layers. `N` counts diffusers' attention processors
//! in `attn_processors` order — attn1 and attn2 of every transformer block, down blocks,
//! then up blocks, then the middle block — so the odd `N` are the cross-attentions, the
//! only ones with weights ([`cross_attention_blocks`] lists them for our UNet).
//!
//! Two projections exist. The classic one (`ip-adapter_sd15`, `ip-adapter_sdxl`) maps
//! the projected class token `image_embeds` through one linear layer to `tokens` tokens
//! and a layer norm. Plus (`ip-adapter-plus_*`, detected by `image_proj.latents`) is a
//! perceiver resampler over the penultimate hidden states: learned latent queries attend
//! to the image tokens and themselves, then a feed-forward, `depth` times.

use crate::models::nn::{attention, layer_norm, linear};
use super::unet::{BlockKind, UnetConfig};
use crate::models::{ModelError, Result, Weights};
use crate::ggml::{Context, GraphRun, Tensor};

/// Which image projection the adapter has.
#[derive(Clone, Debug, PartialEq)]
pub enum ImageProj {
    /// `image_proj.proj` (Linear to tokens × cross width) and `image_proj.norm`.
    Classic,
    /// The Resampler: `latents` [1, tokens, dim], `proj_in`, `depth` layers of
    /// (PerceiverAttention, FeedForward), `proj_out`, `norm_out`.
    Plus { dim: i64, inner: i64, heads: i64, depth: usize, ff: i64 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct IpAdapterConfig {
    pub proj: ImageProj,
    /// Width of the CLIP input: `image_embeds` (classic) or the vision tower's hidden
    /// states (Plus).
    pub embed_dim: i64,
    /// Width of the image tokens, which the UNet's `to_k_ip` / `to_v_ip` take.
    pub cross_dim: i64,
    /// Image tokens per image.
    pub tokens: i64,
    /// `(N, channels)` of every `ip_adapter.N` pair, by N.
    pub layers: Vec<(usize, i64)>,
}

const EPS: f32 = 1e-5;

impl IpAdapterConfig {
    /// Read the structure off the weights. Plus's heads are 64 wide, as in every
    /// released Plus model (12 for SD1.5's 768-wide resampler, 20 for SDXL's 1280).
    pub fn infer(w: &Weights) -> Result<Self> {
        let mut layers = Vec::new();
        for name in w.names() {
            let Some(rest) = name.strip_prefix("ip_adapter.") else { continue };
            if let Some(n) = rest.strip_suffix(".to_k_ip.weight") {
                let n: usize = n.parse().map_err(|_| ModelError::Weight { name: name.to_string(), detail: "not an `ip_adapter.N` index".into() })?;
                layers.push((n, w.get(name)?.ne()[1]));
            }
        }
        layers.sort();
        let Some(&(first, _)) = layers.first() else {
            return Err(ModelError::Config("not an IP-Adapter: no `ip_adapter.N.to_k_ip.weight` weights".into()));
        };
        let cross_dim = w.get(&format!("ip_adapter.{first}.to_k_ip.weight"))?.ne()[0];
        if w.contains("image_proj.latents") {
            let latents = w.get("image_proj.latents")?.ne(); // [dim, tokens, 1]
            let (dim, tokens) = (latents[0], latents[1]);
            let depth = (0..).take_while(|i| w.contains(&format!("image_proj.layers.{i}.0.to_q.weight"))).count();
            if depth == 0 {
                return Err(ModelError::Config("IP-Adapter Plus resampler without layers (`image_proj.layers.0.0.to_q.weight` is missing)".into()));
            }
            let inner = w.get("image_proj.layers.0.0.to_q.weight")?.ne()[1];
            if inner % 64 != 0 {
                return Err(ModelError::Weight { name: "image_proj.layers.0.0.to_q.weight".into(), detail: format!("{inner} attention channels are not 64-wide heads") });
            }
            let ff = w.get("image_proj.layers.0.1.1.weight")?.ne()[1];
            let embed_dim = w.get("image_proj.proj_in.weight")?.ne()[0];
            Ok(IpAdapterConfig { proj: ImageProj::Plus { dim, inner, heads: inner / 64, depth, ff }, embed_dim, cross_dim, tokens, layers })
        } else if w.contains("image_proj.proj.weight") && w.contains("image_proj.norm.weight") {
            let proj = w.get("image_proj.proj.weight")?.ne();
            let width = w.get("image_proj.norm.weight")?.ne()[0];
            if width < 1 || proj[1] % width != 0 {
                return Err(ModelError::Weight { name: "image_proj.proj.weight".into(), detail: format!("{} outputs are not tokens of the norm's width {width}", proj[1]) });
            }
            Ok(IpAdapterConfig { proj: ImageProj::Classic, embed_dim: proj[0], cross_dim, tokens: proj[1] / width, layers })
        } else if w.contains("image_proj.proj.0.weight") {
            Err(ModelError::Config("this IP-Adapter's image projection is an MLP (full-face or FaceID models); only the classic and Plus projections are supported".into()))
        } else {
            Err(ModelError::Config("IP-Adapter without a recognised image projection (`image_proj.proj` + `image_proj.norm`, or the Plus resampler's `image_proj.latents`)".into()))
        }
    }

    pub fn is_plus(&self) -> bool {
        matches!(self.proj, ImageProj::Plus { .. })
    }
}

/// The attention blocks of `unet` in diffusers' `attn_processors` order (down, up, middle),
/// each as its `transformer_blocks.D` name and width. Block k's attn1 is `ip_adapter.2k`, its
/// attn2 (the cross-attention) `ip_adapter.2k+1`.
pub fn cross_attention_blocks(unet: &UnetConfig) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let mut push = |side: &str, blocks: &[super::unet::Block]| {
        for b in blocks {
            if let BlockKind::Res { cout, transformer_depth, .. } = b.kind {
                for d in 0..transformer_depth {
                    out.push((format!("{side}.{}.1.transformer_blocks.{d}", b.index), cout));
                }
            }
        }
    };
    push("input_blocks", &unet.input_blocks);
    push("output_blocks", &unet.output_blocks);
    let mid = unet.input_blocks.last().map_or(unet.model_channels, |b| match b.kind {
        BlockKind::Res { cout, .. } => cout,
        BlockKind::Down { channels } => channels,
    });
    for d in 0..unet.middle_depth {
        out.push((format!("middle_block.1.transformer_blocks.{d}"), mid));
    }
    out
}

pub struct IpAdapter<'w> {
    w: &'w Weights,
    pub config: IpAdapterConfig,
}

impl<'w> IpAdapter<'w> {
    /// Check every weight the config implies, then wrap them.
    pub fn new(w: &'w Weights, config: IpAdapterConfig) -> Result<Self> {
        let c = &config;
        for &(n, ch) in &c.layers {
            w.expect(&format!("ip_adapter.{n}.to_k_ip.weight"), &[c.cross_dim, ch])?;
            w.expect(&format!("ip_adapter.{n}.to_v_ip.weight"), &[c.cross_dim, ch])?;
        }
        match c.proj {
            ImageProj::Classic => {
                w.expect("image_proj.proj.weight", &[c.embed_dim, c.tokens * c.cross_dim])?;
                w.expect("image_proj.proj.bias", &[c.tokens * c.cross_dim])?;
                norm(w, "image_proj.norm", c.cross_dim)?;
            }
            ImageProj::Plus { dim, inner, depth, ff, .. } => {
                w.expect("image_proj.latents", &[dim, c.tokens, 1])?;
                w.expect("image_proj.proj_in.weight", &[c.embed_dim, dim])?;
                w.expect("image_proj.proj_in.bias", &[dim])?;
                expect_perceiver_layers(w, "image_proj", dim, inner, ff, depth)?;
                w.expect("image_proj.proj_out.weight", &[dim, c.cross_dim])?;
                w.expect("image_proj.proj_out.bias", &[c.cross_dim])?;
                norm(w, "image_proj.norm_out", c.cross_dim)?;
            }
        }
        Ok(IpAdapter { w, config })
    }

    /// Whether the adapter's attention weights fit `unet`: one `to_k_ip`/`to_v_ip` pair per
    /// cross-attention at its width, and image tokens as wide as the UNet's text context.
    pub fn check_unet(&self, unet: &UnetConfig) -> Result<()> {
        let c = &self.config;
        let blocks = cross_attention_blocks(unet);
        let want: Vec<(usize, i64)> = blocks.iter().enumerate().map(|(k, (_, ch))| (2 * k + 1, *ch)).collect();
        if c.layers.len() != want.len() {
            return Err(ModelError::Config(format!(
                "the IP-Adapter has {} cross-attention layers and this UNet {}: it was made for another model family (SD1.5 adapters have 16, SDXL ones 70)",
                c.layers.len(),
                want.len()
            )));
        }
        if c.cross_dim != unet.context_dim {
            return Err(ModelError::Config(format!(
                "the IP-Adapter's image tokens are {} wide and this UNet's cross-attention takes {}: it was made for another model family",
                c.cross_dim, unet.context_dim
            )));
        }
        for ((n, ch), (wn, wch)) in c.layers.iter().zip(&want) {
            if n != wn || ch != wch {
                return Err(ModelError::Weight {
                    name: format!("ip_adapter.{n}.to_k_ip.weight"),
                    detail: format!("{ch} channels at index {n}; this UNet's cross-attention `ip_adapter.{wn}` has {wch}"),
                });
            }
        }
        Ok(())
    }

    /// The image tokens [cross_dim, tokens, B] for CLIP vision outputs: `image_embeds`
    /// [embed_dim, B] (classic) or penultimate hidden states [embed_dim, T, B] (Plus).
    pub fn project<'a>(&'a self, ctx: &'a Context, run: &mut GraphRun<'a>, embeds: Tensor<'a>) -> Result<Tensor<'a>>
    where
        'w: 'a,
    {
        let c = &self.config;
        let w = self.w;
        let ne = embeds.ne();
        if ne[0] != c.embed_dim {
            return Err(ModelError::Input(format!(
                "CLIP vision output {ne:?}: the IP-Adapter takes {}-wide {}; use the CLIP vision model it was trained with",
                c.embed_dim,
                if c.is_plus() { "hidden states" } else { "image embeddings" }
            )));
        }
        match c.proj {
            ImageProj::Classic => {
                let b = ne[1] * ne[2] * ne[3];
                let x = linear(ctx, w, "image_proj.proj", ctx.reshape(embeds, [c.embed_dim, b, 1, 1])?)?;
                let x = ctx.reshape(x, [c.cross_dim, c.tokens, b, 1])?;
                layer_norm(ctx, w, "image_proj.norm", x, EPS)
            }
            ImageProj::Plus { dim, inner, heads, depth, .. } => {
                let b = ne[2] * ne[3];
                let x = linear(ctx, w, "image_proj.proj_in", ctx.reshape(embeds, [c.embed_dim, ne[1], b, 1])?)?;
                let zeros = run.input_f32(&[dim, c.tokens, b], vec![0.0; (dim * c.tokens * b) as usize])?;
                let latents = ctx.add(zeros, w.get("image_proj.latents")?)?;
                let latents = perceiver_layers(ctx, w, "image_proj", x, latents, depth, inner, heads)?;
                let out = linear(ctx, w, "image_proj.proj_out", latents)?;
                layer_norm(ctx, w, "image_proj.norm_out", out, EPS)
            }
        }
    }
}

/// The perceiver resampler's layers under `{prefix}.layers.N` (IP-Adapter Plus, and
/// PhotoMaker v2's FacePerceiverResampler): the latents [dim, Q, B] attend to the
/// projected image tokens `x` [dim, T, B] and themselves (PerceiverAttention), then a
/// feed-forward, `depth` times, each with a residual.
#[allow(clippy::too_many_arguments)]
pub(crate) fn perceiver_layers<'a>(ctx: &'a Context, w: &'a Weights, prefix: &str, x: Tensor<'a>, mut latents: Tensor<'a>, depth: usize, inner: i64, heads: i64) -> Result<Tensor<'a>> {
    let b = latents.ne()[2];
    for i in 0..depth {
        let l = format!("{prefix}.layers.{i}");
        let xn = layer_norm(ctx, w, &format!("{l}.0.norm1"), x, EPS)?;
        let ln = layer_norm(ctx, w, &format!("{l}.0.norm2"), latents, EPS)?;
        let q = linear(ctx, w, &format!("{l}.0.to_q"), ln)?;
        let kv = linear(ctx, w, &format!("{l}.0.to_kv"), ctx.concat(xn, ln, 1)?)?; // [2·inner, T+Q, B]
        let [_, tk, _, _] = kv.ne();
        let nb = kv.nb();
        let k = ctx.view(kv, [inner, tk, b, 1], [nb[1], nb[2], nb[3]], 0)?;
        let v = ctx.view(kv, [inner, tk, b, 1], [nb[1], nb[2], nb[3]], inner as usize * kv.dtype().type_size())?;
        let a = attention(ctx, q, k, v, heads, None)?;
        latents = ctx.add(latents, linear(ctx, w, &format!("{l}.0.to_out"), a)?)?;
        let h = layer_norm(ctx, w, &format!("{l}.1.0"), latents, EPS)?;
        let h = ctx.gelu_erf(linear(ctx, w, &format!("{l}.1.1"), h)?)?;
        latents = ctx.add(latents, linear(ctx, w, &format!("{l}.1.3"), h)?)?;
    }
    Ok(latents)
}

/// Check the weights [`perceiver_layers`] reads.
pub(crate) fn expect_perceiver_layers(w: &Weights, prefix: &str, dim: i64, inner: i64, ff: i64, depth: usize) -> Result<()> {
    for i in 0..depth {
        let l = format!("{prefix}.layers.{i}");
        norm(w, &format!("{l}.0.norm1"), dim)?;
        norm(w, &format!("{l}.0.norm2"), dim)?;
        w.expect(&format!("{l}.0.to_q.weight"), &[dim, inner])?;
        w.expect(&format!("{l}.0.to_kv.weight"), &[dim, 2 * inner])?;
        w.expect(&format!("{l}.0.to_out.weight"), &[inner, dim])?;
        norm(w, &format!("{l}.1.0"), dim)?;
        w.expect(&format!("{l}.1.1.weight"), &[dim, ff])?;
        w.expect(&format!("{l}.1.3.weight"), &[ff, dim])?;
    }
    Ok(())
}

pub(crate) fn norm(w: &Weights, name: &str, c: i64) -> Result<()> {
    w.expect(&format!("{name}.weight"), &[c])?;
    w.expect(&format!("{name}.bias"), &[c])?;
    Ok(())
}
