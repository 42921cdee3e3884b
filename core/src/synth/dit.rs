//! Random-weight models of the DiT families, in the files people download: the FLUX.1
//! transformer alone in BFL's names (`flux1-dev.safetensors`, city96's GGUF), the SD3 /
//! SD3.5 MMDiT in Stability's (`sd3.5_medium.safetensors`), the T5-XXL encoder alone in
//! Hugging Face's (`t5xxl_fp16.safetensors`), the 16-channel `ae`, and CLIP-L and
//! OpenCLIP-G alone (`clip_l.safetensors`, `clip_g.safetensors`), Z-Image's transformer
//! (`z_image_turbo_bf16.safetensors`) and its Qwen3 encoder (`qwen_3_4b.safetensors`), FLUX.2's
//! transformer (`flux-2-klein-4b.safetensors`) and 32-channel VAE (`flux2-vae.safetensors`),
//! Wan's video transformer (`wan2.1_t2v_1.3B_fp16.safetensors`), UMT5 and the Wan VAE.
//! Tiny configs for tests, full ones for benchmarks.

use serde::{Deserialize, Serialize};

use super::{clip_l, vae, Init, Specs, TensorSpec, TextConfig, VaeConfig};
use crate::models::llm::LlmArch;

/// A FLUX.1 transformer (`flux/model.py`'s `FluxParams`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FluxSynth {
    /// Token width: 16 latent channels × 2×2; Fill's 384 adds the masked image and the
    /// 64 mask channels.
    pub in_channels: usize,
    /// Output token width: 16 latent channels × 2×2.
    pub out_channels: usize,
    pub hidden: usize,
    pub heads: usize,
    pub depth: usize,
    pub depth_single: usize,
    /// T5's width.
    pub context: usize,
    /// CLIP-L's pooled width.
    pub vector: usize,
    pub mlp_ratio: usize,
    /// dev's `guidance_in`; schnell has none.
    pub guidance: bool,
    /// Chroma: the distilled-guidance approximator's (hidden width, layers) in place of the
    /// embedders and every modulation layer.
    #[serde(default)]
    pub approximator: Option<(usize, usize)>,
}

impl FluxSynth {
    /// FLUX.1 dev (schnell: `guidance` false).
    pub fn dev() -> Self {
        FluxSynth { in_channels: 64, out_channels: 64, hidden: 3072, heads: 24, depth: 19, depth_single: 38, context: 4096, vector: 768, mlp_ratio: 4, guidance: true, approximator: None }
    }

    /// One block of each kind at one 128-wide head (the width FLUX's fixed rotary axes
    /// 16/56/56 need), reading [`T5Synth::tiny`] tokens and the tiny CLIP's pooled vector.
    pub fn tiny(guidance: bool) -> Self {
        FluxSynth { hidden: 128, heads: 1, depth: 1, depth_single: 1, context: T5Synth::tiny().d_model, vector: super::SdConfig::tiny_sd1().text.hidden, guidance, ..Self::dev() }
    }

    /// FLUX.1 Fill dev at [`FluxSynth::tiny`]'s size.
    pub fn tiny_fill() -> Self {
        FluxSynth { in_channels: 384, ..Self::tiny(true) }
    }

    /// Chroma (unlocked v50 / HD): FLUX.1 schnell's blocks under a 5-layer approximator.
    pub fn chroma() -> Self {
        FluxSynth { guidance: false, approximator: Some((5120, 5)), ..Self::dev() }
    }

    /// Chroma at [`FluxSynth::tiny`]'s size, reading [`T5Synth::tiny`] tokens alone.
    pub fn tiny_chroma() -> Self {
        FluxSynth { approximator: Some((64, 2)), ..Self::tiny(false) }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, m) = (self.hidden, self.hidden * self.mlp_ratio);
        let dh = d / self.heads;
        let qk_norm = |s: &mut Specs, p: &str| {
            for n in ["query_norm", "key_norm"] {
                s.push(format!("{p}.{n}.scale"), vec![dh], Init::Normal { mean: 1.0, std: super::BIAS_STD });
            }
        };
        let modulated = self.approximator.is_none();
        s.linear("img_in", self.in_channels, d, true);
        s.linear("txt_in", self.context, d, true);
        if let Some((a, layers)) = self.approximator {
            let p = "distilled_guidance_layer";
            s.linear(&format!("{p}.in_proj"), 64, a, true);
            for i in 0..layers {
                s.linear(&format!("{p}.layers.{i}.in_layer"), a, a, true);
                s.linear(&format!("{p}.layers.{i}.out_layer"), a, a, true);
                s.push(format!("{p}.norms.{i}.scale"), vec![a], Init::Normal { mean: 1.0, std: super::BIAS_STD });
            }
            s.linear(&format!("{p}.out_proj"), a, d, true);
        } else {
            let mut embedders = vec![("time_in", 256), ("vector_in", self.vector)];
            if self.guidance {
                embedders.push(("guidance_in", 256));
            }
            for (name, n_in) in embedders {
                s.linear(&format!("{name}.in_layer"), n_in, d, true);
                s.linear(&format!("{name}.out_layer"), d, d, true);
            }
        }
        for i in 0..self.depth {
            for st in ["img", "txt"] {
                let p = format!("double_blocks.{i}.{st}");
                if modulated {
                    s.linear(&format!("{p}_mod.lin"), d, 6 * d, true);
                }
                s.linear(&format!("{p}_attn.qkv"), d, 3 * d, true);
                qk_norm(&mut s, &format!("{p}_attn.norm"));
                s.linear(&format!("{p}_attn.proj"), d, d, true);
                s.linear(&format!("{p}_mlp.0"), d, m, true);
                s.linear(&format!("{p}_mlp.2"), m, d, true);
            }
        }
        for i in 0..self.depth_single {
            let p = format!("single_blocks.{i}");
            s.linear(&format!("{p}.linear1"), d, 3 * d + m, true);
            s.linear(&format!("{p}.linear2"), d + m, d, true);
            qk_norm(&mut s, &format!("{p}.norm"));
            if modulated {
                s.linear(&format!("{p}.modulation.lin"), d, 3 * d, true);
            }
        }
        s.linear("final_layer.linear", d, self.out_channels, true);
        if modulated {
            s.linear("final_layer.adaLN_modulation.1", d, 2 * d, true);
        }
        s.0
    }
}

/// An SD3 / SD3.5 MMDiT (`mmdit.py`'s `MMDiT`, Stability's names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sd3Synth {
    pub in_channels: usize,
    pub patch: usize,
    pub hidden: usize,
    pub heads: usize,
    pub depth: usize,
    /// The text tokens' width (T5-XXL's, which CLIP-L|G are padded to).
    pub context: usize,
    /// CLIP-L's pooled width plus OpenCLIP-G's projected one.
    pub pooled: usize,
    pub mlp_ratio: usize,
    /// Side of the stored position table, in patches.
    pub pos_embed_max: usize,
    /// SD3.5's RMS q/k norms.
    pub qk_norm: bool,
    /// MMDiT-X (SD3.5 medium): the blocks with a second image self-attention.
    pub self_attn_blocks: Vec<usize>,
}

impl Sd3Synth {
    /// SD3.5 medium: 24 MMDiT-X blocks (the first 13 with the second attention), 64 heads
    /// wide as every release.
    pub fn sd35_medium() -> Self {
        Sd3Synth { in_channels: 16, patch: 2, hidden: 1536, heads: 24, depth: 24, context: 4096, pooled: 2048, mlp_ratio: 4, pos_embed_max: 384, qk_norm: true, self_attn_blocks: (0..13).collect() }
    }

    /// SD3.5 medium's structure at two blocks of two 32-wide heads, reading
    /// [`T5Synth::tiny`] tokens and the tiny CLIP-L's and [`tiny_clip_g`]'s pooled vectors.
    pub fn tiny() -> Self {
        let l = super::SdConfig::tiny_sd1().text.hidden;
        Sd3Synth { hidden: 64, heads: 2, depth: 2, context: T5Synth::tiny().d_model, pooled: l + tiny_clip_g().projection_dim, pos_embed_max: 64, self_attn_blocks: vec![0], ..Self::sd35_medium() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, m, p) = (self.hidden, self.hidden * self.mlp_ratio, self.patch);
        let dh = d / self.heads;
        s.weight("x_embedder.proj.weight".into(), vec![d, self.in_channels, p, p]);
        s.bias("x_embedder.proj.bias".into(), d);
        s.push("pos_embed".into(), vec![1, self.pos_embed_max * self.pos_embed_max, d], Init::Normal { mean: 0.0, std: 0.5 });
        s.linear("context_embedder", self.context, d, true);
        for (name, n_in) in [("t_embedder", 256), ("y_embedder", self.pooled)] {
            s.linear(&format!("{name}.mlp.0"), n_in, d, true);
            s.linear(&format!("{name}.mlp.2"), d, d, true);
        }
        let attn = |s: &mut Specs, a: &str, proj: bool| {
            s.linear(&format!("{a}.qkv"), d, 3 * d, true);
            if proj {
                s.linear(&format!("{a}.proj"), d, d, true);
            }
            if self.qk_norm {
                for n in ["ln_q", "ln_k"] {
                    s.push(format!("{a}.{n}.weight"), vec![dh], Init::Normal { mean: 1.0, std: super::BIAS_STD });
                }
            }
        };
        for i in 0..self.depth {
            for st in ["x_block", "context_block"] {
                let b = format!("joint_blocks.{i}.{st}");
                let pre_only = st == "context_block" && i + 1 == self.depth;
                let x2 = st == "x_block" && self.self_attn_blocks.contains(&i);
                attn(&mut s, &format!("{b}.attn"), !pre_only);
                if x2 {
                    attn(&mut s, &format!("{b}.attn2"), true);
                }
                if !pre_only {
                    s.linear(&format!("{b}.mlp.fc1"), d, m, true);
                    s.linear(&format!("{b}.mlp.fc2"), m, d, true);
                }
                let chunks = if pre_only { 2 } else if x2 { 9 } else { 6 };
                s.linear(&format!("{b}.adaLN_modulation.1"), d, chunks * d, true);
            }
        }
        s.linear("final_layer.linear", d, p * p * self.in_channels, true);
        s.linear("final_layer.adaLN_modulation.1", d, 2 * d, true);
        s.0
    }
}

/// A T5 v1.1 encoder (`T5EncoderModel`), relative-position bias in layer 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct T5Synth {
    pub d_model: usize,
    pub d_kv: usize,
    pub heads: usize,
    pub d_ff: usize,
    pub layers: usize,
    pub vocab: usize,
    /// UMT5: every layer has its own relative-position bias (T5: layer 0's serves all).
    #[serde(default)]
    pub per_layer_bias: bool,
}

impl T5Synth {
    /// T5-XXL v1.1's encoder.
    pub fn xxl() -> Self {
        T5Synth { d_model: 4096, d_kv: 64, heads: 64, d_ff: 10240, layers: 24, vocab: 32128, per_layer_bias: false }
    }

    /// UMT5-XXL's encoder (Wan's text encoder, `umt5_xxl_fp16.safetensors`).
    pub fn umt5_xxl() -> Self {
        T5Synth { vocab: 256384, per_layer_bias: true, ..Self::xxl() }
    }

    /// Two layers 32 wide with UMT5's whole vocabulary (the tokenizer's ids).
    pub fn tiny_umt5() -> Self {
        T5Synth { d_model: 32, d_kv: 8, heads: 4, d_ff: 32, layers: 2, ..Self::umt5_xxl() }
    }

    /// Two layers at width 128 (wide enough for SD3's tiny CLIP-L and OpenCLIP-G side by
    /// side), with T5's whole vocabulary (the tokenizer's ids).
    pub fn tiny() -> Self {
        T5Synth { d_model: 128, d_kv: 16, heads: 4, d_ff: 128, layers: 2, ..Self::xxl() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, inner) = (self.d_model, self.heads * self.d_kv);
        s.push("shared.weight".into(), vec![self.vocab, d], Init::Normal { mean: 0.0, std: 1.0 });
        let rms = |s: &mut Specs, name: String| s.push(name, vec![d], Init::Normal { mean: 1.0, std: super::BIAS_STD });
        for i in 0..self.layers {
            let a = format!("encoder.block.{i}.layer.0");
            for n in ["q", "k", "v"] {
                s.linear(&format!("{a}.SelfAttention.{n}"), d, inner, false);
            }
            s.linear(&format!("{a}.SelfAttention.o"), inner, d, false);
            if i == 0 || self.per_layer_bias {
                s.push(format!("{a}.SelfAttention.relative_attention_bias.weight"), vec![32, self.heads], Init::Normal { mean: 0.0, std: 0.1 });
            }
            rms(&mut s, format!("{a}.layer_norm.weight"));
            let f = format!("encoder.block.{i}.layer.1");
            s.linear(&format!("{f}.DenseReluDense.wi_0"), d, self.d_ff, false);
            s.linear(&format!("{f}.DenseReluDense.wi_1"), d, self.d_ff, false);
            s.linear(&format!("{f}.DenseReluDense.wo"), self.d_ff, d, false);
            rms(&mut s, format!("{f}.layer_norm.weight"));
        }
        rms(&mut s, "encoder.final_layer_norm.weight".into());
        s.0
    }
}

/// FLUX's (and SD3's) 16-channel autoencoder as BFL's `ae.safetensors` holds it: the KL
/// autoencoder without quant convolutions, bare names.
pub fn ae_tensors(v: &VaeConfig) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    vae(&mut s, "", v);
    s.0.retain(|t| !t.name.starts_with("quant_conv.") && !t.name.starts_with("post_quant_conv."));
    s.0
}

/// FLUX's `ae` at full size.
pub fn ae_config() -> VaeConfig {
    VaeConfig { z_channels: 16, embed_dim: 16, ..VaeConfig::kl_f8() }
}

/// The tiny VAE's width with FLUX's 8× downsampling (4 levels) and 16 latent channels.
pub fn tiny_ae_config() -> VaeConfig {
    VaeConfig { z_channels: 16, embed_dim: 16, ch_mult: vec![1, 1, 2, 2], ..VaeConfig::tiny() }
}

/// CLIP-L alone in Hugging Face's names (`text_model.*`), as ComfyUI's `clip_l.safetensors`.
pub fn clip_l_tensors(t: &TextConfig) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    clip_l(&mut s, "text_model.", t);
    s.0
}

/// OpenCLIP-G alone in Hugging Face's names (`text_model.*` and the `text_projection`
/// beside it), as ComfyUI's `clip_g.safetensors`.
pub fn clip_g_tensors(t: &TextConfig) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    clip_l(&mut s, "text_model.", t);
    s.linear("text_projection", t.hidden, t.projection_dim, false);
    s.0
}

/// The tiny OpenCLIP-G: SDXL's tiny second encoder.
pub fn tiny_clip_g() -> TextConfig {
    super::SdConfig::tiny_sdxl().text2.expect("SDXL has a second encoder")
}

/// A Z-Image transformer (Tongyi-MAI's S3-DiT) in the single-file release's names
/// (`z_image_turbo_bf16.safetensors`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZImageSynth {
    pub in_channels: usize,
    pub hidden: usize,
    pub heads: usize,
    pub ffn: usize,
    pub layers: usize,
    pub refiners: usize,
    /// The caption width (the LLM's hidden size).
    pub caption: usize,
    /// The timestep MLP's hidden width (1024 in the release).
    pub t_mid: usize,
}

impl ZImageSynth {
    /// Z-Image Turbo / Base (6B).
    pub fn turbo() -> Self {
        ZImageSynth { in_channels: 16, hidden: 3840, heads: 30, ffn: 10240, layers: 30, refiners: 2, caption: 2560, t_mid: 1024 }
    }

    /// One block of each kind at one 128-wide head (the width the fixed rotary axes
    /// 32/48/48 need), reading [`LlmSynth::tiny_qwen3`] states.
    pub fn tiny() -> Self {
        ZImageSynth { hidden: 128, heads: 1, ffn: 128 * 8 / 3, layers: 1, refiners: 1, caption: LlmSynth::tiny_qwen3().hidden, t_mid: 256, ..Self::turbo() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, dh, t) = (self.hidden, self.hidden / self.heads, self.hidden.min(256));
        let rms = |s: &mut Specs, name: String, n: usize| s.push(name, vec![n], Init::Normal { mean: 1.0, std: super::BIAS_STD });
        s.linear("x_embedder", 4 * self.in_channels, d, true);
        s.linear("t_embedder.mlp.0", 256, self.t_mid, true);
        s.linear("t_embedder.mlp.2", self.t_mid, t, true);
        rms(&mut s, "cap_embedder.0.weight".into(), self.caption);
        s.linear("cap_embedder.1", self.caption, d, true);
        for pad in ["x_pad_token", "cap_pad_token"] {
            s.push(pad.into(), vec![1, d], Init::Normal { mean: 0.0, std: 1.0 });
        }
        for (list, n, modulated) in [("noise_refiner", self.refiners, true), ("context_refiner", self.refiners, false), ("layers", self.layers, true)] {
            for i in 0..n {
                let p = format!("{list}.{i}");
                s.linear(&format!("{p}.attention.qkv"), d, 3 * d, false);
                s.linear(&format!("{p}.attention.out"), d, d, false);
                rms(&mut s, format!("{p}.attention.q_norm.weight"), dh);
                rms(&mut s, format!("{p}.attention.k_norm.weight"), dh);
                s.linear(&format!("{p}.feed_forward.w1"), d, self.ffn, false);
                s.linear(&format!("{p}.feed_forward.w2"), self.ffn, d, false);
                s.linear(&format!("{p}.feed_forward.w3"), d, self.ffn, false);
                for norm in ["attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"] {
                    rms(&mut s, format!("{p}.{norm}.weight"), d);
                }
                if modulated {
                    s.linear(&format!("{p}.adaLN_modulation.0"), t, 4 * d, true);
                }
            }
        }
        s.linear("final_layer.linear", d, 4 * self.in_channels, true);
        s.linear("final_layer.adaLN_modulation.1", t, d, true);
        s.0
    }
}

/// A FLUX.2 transformer in BFL's names (`flux-2-klein-4b.safetensors`): FLUX.1's blocks
/// without biases, SwiGLU MLPs and shared modulations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flux2Synth {
    /// Token width: the 32-channel latent's 2×2 patches.
    pub in_channels: usize,
    pub hidden: usize,
    pub heads: usize,
    pub depth: usize,
    pub depth_single: usize,
    /// Three LLM layers' width.
    pub context: usize,
    pub mlp_ratio: usize,
    /// dev's `guidance_in`; klein has none.
    pub guidance: bool,
}

impl Flux2Synth {
    /// FLUX.2 klein 4B.
    pub fn klein_4b() -> Self {
        Flux2Synth { in_channels: 128, hidden: 3072, heads: 24, depth: 5, depth_single: 20, context: 7680, mlp_ratio: 3, guidance: false }
    }

    /// One block of each kind at one 128-wide head (the width the fixed rotary axes
    /// 32/32/32/32 need), reading three layers of [`LlmSynth::tiny_qwen3_klein`].
    pub fn tiny_klein() -> Self {
        Flux2Synth { hidden: 128, heads: 1, depth: 1, depth_single: 1, context: 3 * LlmSynth::tiny_qwen3_klein().hidden, ..Self::klein_4b() }
    }

    /// FLUX.2 dev: 48 heads of 128, 8 double and 48 single blocks, guidance embedded,
    /// reading three of Mistral-Small-3.2's layers.
    pub fn dev() -> Self {
        Flux2Synth { in_channels: 128, hidden: 6144, heads: 48, depth: 8, depth_single: 48, context: 15360, mlp_ratio: 3, guidance: true }
    }

    /// [`Flux2Synth::tiny_klein`] with dev's guidance embedding, reading
    /// [`LlmSynth::tiny_mistral`].
    pub fn tiny_dev() -> Self {
        Flux2Synth { guidance: true, context: 3 * LlmSynth::tiny_mistral().hidden, ..Self::tiny_klein() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, m) = (self.hidden, self.hidden * self.mlp_ratio);
        let dh = d / self.heads;
        let qk_norm = |s: &mut Specs, p: &str| {
            for n in ["query_norm", "key_norm"] {
                s.push(format!("{p}.{n}.scale"), vec![dh], Init::Normal { mean: 1.0, std: super::BIAS_STD });
            }
        };
        s.linear("img_in", self.in_channels, d, false);
        s.linear("txt_in", self.context, d, false);
        for name in ["time_in"].into_iter().chain(self.guidance.then_some("guidance_in")) {
            s.linear(&format!("{name}.in_layer"), 256, d, false);
            s.linear(&format!("{name}.out_layer"), d, d, false);
        }
        s.linear("double_stream_modulation_img.lin", d, 6 * d, false);
        s.linear("double_stream_modulation_txt.lin", d, 6 * d, false);
        s.linear("single_stream_modulation.lin", d, 3 * d, false);
        for i in 0..self.depth {
            for st in ["img", "txt"] {
                let p = format!("double_blocks.{i}.{st}");
                s.linear(&format!("{p}_attn.qkv"), d, 3 * d, false);
                qk_norm(&mut s, &format!("{p}_attn.norm"));
                s.linear(&format!("{p}_attn.proj"), d, d, false);
                s.linear(&format!("{p}_mlp.0"), d, 2 * m, false);
                s.linear(&format!("{p}_mlp.2"), m, d, false);
            }
        }
        for i in 0..self.depth_single {
            let p = format!("single_blocks.{i}");
            s.linear(&format!("{p}.linear1"), d, 3 * d + 2 * m, false);
            s.linear(&format!("{p}.linear2"), d + m, d, false);
            qk_norm(&mut s, &format!("{p}.norm"));
        }
        s.linear("final_layer.linear", d, self.in_channels, false);
        s.linear("final_layer.adaLN_modulation.1", d, 2 * d, false);
        s.0
    }
}

/// FLUX.2's 32-channel autoencoder as BFL's file holds it: the KL autoencoder with its
/// quant convolutions, bare names.
pub fn flux2_vae_tensors(v: &VaeConfig) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    vae(&mut s, "", v);
    s.0
}

/// FLUX.2's VAE at [`tiny_ae_config`]'s size.
pub fn tiny_flux2_vae_config() -> VaeConfig {
    VaeConfig { z_channels: 32, embed_dim: 32, ..tiny_ae_config() }
}

/// A Qwen-Image MMDiT in the release's names (`qwen_image_bf16.safetensors`, diffusers'
/// names throughout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QwenImageSynth {
    pub latent_channels: usize,
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    /// The text width (the LLM's hidden size).
    pub context: usize,
    /// Qwen-Image-Layered: `time_text_embed.addition_t_embedding` too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layered: bool,
}

impl QwenImageSynth {
    /// Qwen-Image (20B).
    pub fn full() -> Self {
        QwenImageSynth { latent_channels: 16, hidden: 3072, heads: 24, layers: 60, context: 3584, layered: false }
    }

    /// One block at one 128-wide head (the width the fixed rotary axes 16/56/56 need),
    /// reading [`LlmSynth::tiny_qwen25_vl`] states.
    pub fn tiny() -> Self {
        QwenImageSynth { hidden: 128, heads: 1, layers: 1, context: LlmSynth::tiny_qwen25_vl().hidden, ..Self::full() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, dh, tok) = (self.hidden, self.hidden / self.heads, 4 * self.latent_channels);
        let rms = |s: &mut Specs, name: String, n: usize| s.push(name, vec![n], Init::Normal { mean: 1.0, std: super::BIAS_STD });
        s.linear("img_in", tok, d, true);
        rms(&mut s, "txt_norm.weight".into(), self.context);
        s.linear("txt_in", self.context, d, true);
        s.linear("time_text_embed.timestep_embedder.linear_1", 256, d, true);
        s.linear("time_text_embed.timestep_embedder.linear_2", d, d, true);
        if self.layered {
            s.weight("time_text_embed.addition_t_embedding.weight".into(), vec![2, d]);
        }
        for i in 0..self.layers {
            let p = format!("transformer_blocks.{i}");
            for st in ["img", "txt"] {
                s.linear(&format!("{p}.{st}_mod.1"), d, 6 * d, true);
                s.linear(&format!("{p}.{st}_mlp.net.0.proj"), d, 4 * d, true);
                s.linear(&format!("{p}.{st}_mlp.net.2"), 4 * d, d, true);
            }
            for proj in ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"] {
                s.linear(&format!("{p}.attn.{proj}"), d, d, true);
            }
            for norm in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
                rms(&mut s, format!("{p}.attn.{norm}.weight"), dh);
            }
        }
        s.linear("norm_out.linear", d, 2 * d, true);
        s.linear("proj_out", d, tok, true);
        s.0
    }
}

/// A Wan video transformer in the release's names (`wan2.1_t2v_1.3B_fp16.safetensors`;
/// with `image_dim`, Wan2.1 I2V's image embedding and image keys and values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WanSynth {
    /// Input channels: the latent's 16 (I2V: + 4 mask + 16 image latent channels).
    pub in_channels: usize,
    pub out_channels: usize,
    pub dim: usize,
    pub ffn: usize,
    pub layers: usize,
    /// UMT5's width.
    pub text_dim: usize,
    /// CLIP-vision token width (I2V).
    pub image_dim: Option<usize>,
    /// FLF2V: learned positions of the start and end images' tokens (0: none).
    #[serde(default)]
    pub image_positions: usize,
    /// VACE: its blocks (0: none), reading a 96-channel control.
    #[serde(default)]
    pub vace_layers: usize,
}

impl WanSynth {
    /// Wan2.1 T2V 1.3B.
    pub fn t2v_1_3b() -> Self {
        WanSynth { in_channels: 16, out_channels: 16, dim: 1536, ffn: 8960, layers: 30, text_dim: 4096, image_dim: None, image_positions: 0, vace_layers: 0 }
    }

    /// Wan 2.2 TI2V 5B: the Wan 2.2 VAE's 48 channels in and out.
    pub fn ti2v_5b() -> Self {
        WanSynth { in_channels: 48, out_channels: 48, dim: 3072, ffn: 14336, ..Self::t2v_1_3b() }
    }

    /// Two blocks of one 128-wide head (the head width every Wan model has), reading
    /// [`T5Synth::tiny_umt5`] states.
    pub fn tiny() -> Self {
        WanSynth { dim: 128, ffn: 128, layers: 2, text_dim: T5Synth::tiny_umt5().d_model, ..Self::t2v_1_3b() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let d = self.dim;
        let rms = |s: &mut Specs, name: String| s.push(name, vec![d], Init::Normal { mean: 1.0, std: super::BIAS_STD });
        s.weight("patch_embedding.weight".into(), vec![d, self.in_channels, 1, 2, 2]);
        s.bias("patch_embedding.bias".into(), d);
        s.linear("text_embedding.0", self.text_dim, d, true);
        s.linear("text_embedding.2", d, d, true);
        s.linear("time_embedding.0", 256, d, true);
        s.linear("time_embedding.2", d, d, true);
        s.linear("time_projection.1", d, 6 * d, true);
        if self.vace_layers > 0 {
            s.weight("vace_patch_embedding.weight".into(), vec![d, 96, 1, 2, 2]);
            s.bias("vace_patch_embedding.bias".into(), d);
        }
        let blocks = (0..self.layers).map(|i| format!("blocks.{i}")).chain((0..self.vace_layers).map(|n| format!("vace_blocks.{n}")));
        for p in blocks {
            if p == "vace_blocks.0" {
                s.linear(&format!("{p}.before_proj"), d, d, true);
            }
            if p.starts_with("vace_") {
                s.linear(&format!("{p}.after_proj"), d, d, true);
            }
            for attn in ["self_attn", "cross_attn"] {
                for l in ["q", "k", "v", "o"] {
                    s.linear(&format!("{p}.{attn}.{l}"), d, d, true);
                }
                rms(&mut s, format!("{p}.{attn}.norm_q.weight"));
                rms(&mut s, format!("{p}.{attn}.norm_k.weight"));
            }
            if self.image_dim.is_some() {
                s.linear(&format!("{p}.cross_attn.k_img"), d, d, true);
                s.linear(&format!("{p}.cross_attn.v_img"), d, d, true);
                rms(&mut s, format!("{p}.cross_attn.norm_k_img.weight"));
            }
            rms(&mut s, format!("{p}.norm3.weight"));
            s.bias(format!("{p}.norm3.bias"), d);
            s.linear(&format!("{p}.ffn.0"), d, self.ffn, true);
            s.linear(&format!("{p}.ffn.2"), self.ffn, d, true);
            s.push(format!("{p}.modulation"), vec![1, 6, d], Init::Normal { mean: 0.0, std: 0.1 });
        }
        s.linear("head.head", d, 4 * self.out_channels, true);
        s.push("head.modulation".into(), vec![1, 2, d], Init::Normal { mean: 0.0, std: 0.1 });
        if let Some(id) = self.image_dim {
            for (norm, n) in [("img_emb.proj.0", id), ("img_emb.proj.4", d)] {
                s.push(format!("{norm}.weight"), vec![n], Init::Normal { mean: 1.0, std: super::BIAS_STD });
                s.bias(format!("{norm}.bias"), n);
            }
            s.linear("img_emb.proj.1", id, id, true);
            if self.image_positions > 0 {
                s.push("img_emb.emb_pos".into(), vec![1, self.image_positions, id], Init::Normal { mean: 0.0, std: 0.1 });
            }
            s.linear("img_emb.proj.3", id, d, true);
        }
        s.0
    }
}

/// The Wan-2.1 VAE (Qwen-Image's `qwen_image_vae.safetensors`) in Wan's names with its
/// 5-D causal kernels: channel multipliers 1, 2, 4, 4 over `base`, two residual blocks
/// per encoder stage and three per decoder stage, `z` latent channels.
pub fn wan_vae_tensors(base: usize, z: usize) -> Vec<TensorSpec> {
    wan_vae_tensors_for(base, z, 3)
}

/// [`wan_vae_tensors`] over images of `image_channels` (Qwen-Image-Layered's: 4, RGBA).
pub fn wan_vae_tensors_for(base: usize, z: usize, image_channels: usize) -> Vec<TensorSpec> {
    wan_vae_specs(base, base, z, image_channels, false)
}

/// The Wan 2.2 VAE (TI2V-5B's `wan2.2_vae.safetensors`; full size: base 160, decoder base
/// 256, z 48) in the release's names: its stages nested (`encoder.downsamples.I.downsamples.J`,
/// `decoder.upsamples.I.upsamples.J`), RGB 2×2 patches in and out (12 channels), the
/// decoder's resamplers keeping their width.
pub fn wan22_vae_tensors(base: usize, decoder_base: usize, z: usize) -> Vec<TensorSpec> {
    wan_vae_specs(base, decoder_base, z, 3, true)
}

fn wan_vae_specs(base: usize, decoder_base: usize, z: usize, image_channels: usize, v22: bool) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    // Wan 2.2 folds 2×2 patches into channels; its stages nest their layers.
    let pixels = if v22 { 4 * image_channels } else { image_channels };
    let layer = |side: &str, kind: &str, stage: usize, j: usize, n: usize| if v22 { format!("{side}.{kind}.{stage}.{kind}.{j}") } else { format!("{side}.{kind}.{n}") };
    let gamma = |s: &mut Specs, name: String, c: usize, dims: usize| s.push(name, [vec![c], vec![1; dims]].concat(), Init::Normal { mean: 1.0, std: super::BIAS_STD });
    let conv3 = |s: &mut Specs, p: String, i: usize, o: usize, k: usize| {
        s.weight(format!("{p}.weight"), vec![o, i, k, k, k]);
        s.bias(format!("{p}.bias"), o);
    };
    let res = |s: &mut Specs, p: &str, i: usize, o: usize| {
        gamma(s, format!("{p}.residual.0.gamma"), i, 3);
        conv3(s, format!("{p}.residual.2"), i, o, 3);
        gamma(s, format!("{p}.residual.3.gamma"), o, 3);
        conv3(s, format!("{p}.residual.6"), o, o, 3);
        if i != o {
            conv3(s, format!("{p}.shortcut"), i, o, 1);
        }
    };
    let middle = |s: &mut Specs, side: &str, c: usize| {
        res(s, &format!("{side}.middle.0"), c, c);
        gamma(s, format!("{side}.middle.1.norm.gamma"), c, 2);
        s.weight(format!("{side}.middle.1.to_qkv.weight"), vec![3 * c, c, 1, 1]);
        s.bias(format!("{side}.middle.1.to_qkv.bias"), 3 * c);
        s.weight(format!("{side}.middle.1.proj.weight"), vec![c, c, 1, 1]);
        s.bias(format!("{side}.middle.1.proj.bias"), c);
        res(s, &format!("{side}.middle.2"), c, c);
    };
    let time_conv = |s: &mut Specs, p: String, i: usize, o: usize| {
        s.weight(format!("{p}.weight"), vec![o, i, 3, 1, 1]);
        s.bias(format!("{p}.bias"), o);
    };
    conv3(&mut s, "encoder.conv1".into(), pixels, base, 3);
    let dims: Vec<usize> = [1, 1, 2, 4, 4].iter().map(|u| u * base).collect();
    let mut n = 0;
    for i in 0..4 {
        let (mut cin, cout) = (dims[i], dims[i + 1]);
        for j in 0..2 {
            res(&mut s, &layer("encoder", "downsamples", i, j, n), cin, cout);
            (cin, n) = (cout, n + 1);
        }
        if i != 3 {
            let p = layer("encoder", "downsamples", i, 2, n);
            s.weight(format!("{p}.resample.1.weight"), vec![cout, cout, 3, 3]);
            s.bias(format!("{p}.resample.1.bias"), cout);
            if i > 0 {
                time_conv(&mut s, format!("{p}.time_conv"), cout, cout);
            }
            n += 1;
        }
    }
    middle(&mut s, "encoder", 4 * base);
    gamma(&mut s, "encoder.head.0.gamma".into(), 4 * base, 3);
    conv3(&mut s, "encoder.head.2".into(), 4 * base, 2 * z, 3);
    conv3(&mut s, "conv1".into(), 2 * z, 2 * z, 1);
    conv3(&mut s, "conv2".into(), z, z, 1);
    let db = decoder_base;
    conv3(&mut s, "decoder.conv1".into(), z, 4 * db, 3);
    middle(&mut s, "decoder", 4 * db);
    let dims: Vec<usize> = [4, 4, 4, 2, 1].iter().map(|u| u * db).collect();
    // Wan 2.1's upsampling convolutions halve the width, Wan 2.2's keep it.
    let halve = if v22 { 1 } else { 2 };
    let mut n = 0;
    for i in 0..4 {
        let (mut cin, cout) = (if i > 0 { dims[i] / halve } else { dims[i] }, dims[i + 1]);
        for j in 0..3 {
            res(&mut s, &layer("decoder", "upsamples", i, j, n), cin, cout);
            (cin, n) = (cout, n + 1);
        }
        if i != 3 {
            let p = layer("decoder", "upsamples", i, 3, n);
            s.weight(format!("{p}.resample.1.weight"), vec![cout / halve, cout, 3, 3]);
            s.bias(format!("{p}.resample.1.bias"), cout / halve);
            if i < 2 {
                time_conv(&mut s, format!("{p}.time_conv"), cout, 2 * cout);
            }
            n += 1;
        }
    }
    gamma(&mut s, "decoder.head.0.gamma".into(), db, 3);
    conv3(&mut s, "decoder.head.2".into(), db, pixels, 3);
    s.0
}

/// Qwen2.5-VL's vision tower under `visual.` (beside the language model in ComfyUI's
/// `qwen_2.5_vl_7b.safetensors`): the 5-D patch kernel, `depth` blocks `hidden` wide (80
/// per head), the merger to `out` (the language model's width).
pub fn qwen25_vl_vision_tensors(hidden: usize, depth: usize, intermediate: usize, out: usize) -> Vec<TensorSpec> {
    let mut s = Specs(Vec::new());
    let rms = |s: &mut Specs, name: String, n: usize| s.push(name, vec![n], Init::Normal { mean: 1.0, std: super::BIAS_STD });
    s.weight("visual.patch_embed.proj.weight".into(), vec![hidden, 3, 2, 14, 14]);
    for i in 0..depth {
        let p = format!("visual.blocks.{i}");
        rms(&mut s, format!("{p}.norm1.weight"), hidden);
        rms(&mut s, format!("{p}.norm2.weight"), hidden);
        s.linear(&format!("{p}.attn.qkv"), hidden, 3 * hidden, true);
        s.linear(&format!("{p}.attn.proj"), hidden, hidden, true);
        s.linear(&format!("{p}.mlp.gate_proj"), hidden, intermediate, true);
        s.linear(&format!("{p}.mlp.up_proj"), hidden, intermediate, true);
        s.linear(&format!("{p}.mlp.down_proj"), intermediate, hidden, true);
    }
    rms(&mut s, "visual.merger.ln_q.weight".into(), hidden);
    s.linear("visual.merger.mlp.0", 4 * hidden, 4 * hidden, true);
    s.linear("visual.merger.mlp.2", 4 * hidden, out, true);
    s.0
}

/// A Qwen2/Qwen3/Mistral language model as a text encoder, in Hugging Face's names under
/// `model.` (ComfyUI's `qwen_3_4b.safetensors`): Qwen3 has q/k RMS norms, Qwen2 q/k/v
/// biases, Mistral neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmSynth {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub vocab: usize,
    pub arch: LlmArch,
}

impl LlmSynth {
    /// Qwen3-4B (Z-Image, FLUX.2 klein 4B).
    pub fn qwen3_4b() -> Self {
        LlmSynth { hidden: 2560, heads: 32, kv_heads: 8, head_dim: 128, intermediate: 9728, layers: 36, vocab: 151936, arch: LlmArch::Qwen3 }
    }

    /// Two layers 32 wide with grouped key/value heads, and the whole vocabulary (the
    /// tokenizer's ids).
    pub fn tiny_qwen3() -> Self {
        LlmSynth { hidden: 32, heads: 2, kv_heads: 1, head_dim: 16, intermediate: 64, layers: 2, ..Self::qwen3_4b() }
    }

    /// Qwen2.5-VL-7B's language model (Qwen-Image's text encoder).
    pub fn qwen25_vl_7b() -> Self {
        LlmSynth { hidden: 3584, heads: 28, kv_heads: 4, head_dim: 128, intermediate: 18944, layers: 28, vocab: 152064, arch: LlmArch::Qwen2 }
    }

    /// Two layers of one 128-wide head (Qwen2's weights do not show the head width; every
    /// released Qwen2.5 has 128) and the whole vocabulary.
    pub fn tiny_qwen25_vl() -> Self {
        LlmSynth { hidden: 128, heads: 1, kv_heads: 1, head_dim: 128, intermediate: 64, layers: 2, ..Self::qwen25_vl_7b() }
    }

    /// [`LlmSynth::tiny_qwen3`] with the 28 layers FLUX.2 klein reads states from (sd.cpp's
    /// layers 9, 18 and 27).
    pub fn tiny_qwen3_klein() -> Self {
        LlmSynth { layers: 28, ..Self::tiny_qwen3() }
    }

    /// Mistral-Small-3.2-24B's language model (FLUX.2 dev's text encoder).
    pub fn mistral_small_3_2() -> Self {
        LlmSynth { hidden: 5120, heads: 32, kv_heads: 8, head_dim: 128, intermediate: 32768, layers: 40, vocab: 131072, arch: LlmArch::Mistral }
    }

    /// The 30 layers FLUX.2 dev reads states from (10, 20, 30) at one 128-wide head (the
    /// weights do not show the head width), 64 wide, and the whole vocabulary.
    pub fn tiny_mistral() -> Self {
        LlmSynth { hidden: 64, heads: 1, kv_heads: 1, intermediate: 64, layers: 30, ..Self::mistral_small_3_2() }
    }

    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut s = Specs(Vec::new());
        let (d, q, kv) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let qk_norm = self.arch == LlmArch::Qwen3;
        let rms = |s: &mut Specs, name: String, n: usize| s.push(name, vec![n], Init::Normal { mean: 1.0, std: super::BIAS_STD });
        s.push("model.embed_tokens.weight".into(), vec![self.vocab, d], Init::Normal { mean: 0.0, std: 1.0 });
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let bias = self.arch == LlmArch::Qwen2;
            s.linear(&format!("{p}.self_attn.q_proj"), d, q, bias);
            s.linear(&format!("{p}.self_attn.k_proj"), d, kv, bias);
            s.linear(&format!("{p}.self_attn.v_proj"), d, kv, bias);
            s.linear(&format!("{p}.self_attn.o_proj"), q, d, false);
            if qk_norm {
                rms(&mut s, format!("{p}.self_attn.q_norm.weight"), self.head_dim);
                rms(&mut s, format!("{p}.self_attn.k_norm.weight"), self.head_dim);
            }
            rms(&mut s, format!("{p}.input_layernorm.weight"), d);
            rms(&mut s, format!("{p}.post_attention_layernorm.weight"), d);
            s.linear(&format!("{p}.mlp.gate_proj"), d, self.intermediate, false);
            s.linear(&format!("{p}.mlp.up_proj"), d, self.intermediate, false);
            s.linear(&format!("{p}.mlp.down_proj"), self.intermediate, d, false);
        }
        rms(&mut s, "model.norm.weight".into(), d);
        s.0
    }
}
