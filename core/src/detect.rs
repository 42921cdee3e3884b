//! Which model family a set of tensors is, from names and shapes alone.
//!
//! Follows sd.cpp's `get_sd_version` and ComfyUI's `model_detection.py`: the UNet's
//! cross-attention width (`attn2.to_k.weight`, 768 / 1024 / 2048 / 1280) and its `label_emb`
//! (ADM) input separate SD1, SD2, SDXL and the SDXL refiner; `joint_blocks` mean SD3 and
//! `double_blocks`/`single_blocks` mean FLUX. Both LDM single-file names
//! (`model.diffusion_model.*`, bare UNet files) and diffusers-folder names (`unet.*`,
//! `transformer.*`) are understood.
//!
//! v-prediction is not a property of the architecture (SD2 768-v and 512-base are identical),
//! so [`detect`] only reports what the keys say (a `v_pred` key, as ComfyUI and sd.cpp
//! honour). [`detect_source`] adds, in this order: safetensors metadata
//! (`modelspec.prediction_type`, kohya's `ss_v_parameterization`), explicit file-name markers
//! (`v-pred`, `vpred`, `768-v`, `512-base`), and for SD2 ComfyUI's weight statistic (the
//! standard deviation of `output_blocks.11.1.transformer_blocks.0.norm1.bias` is above 0.09
//! in v-models).

use std::fmt;

use crate::dtype;
use crate::io::{TensorInfo, TensorSource};

/// The scalars that mark an SDXL checkpoint as EDM v-prediction (CosXL, CosXL-Edit), as
/// ComfyUI reads them: (sigma_min, sigma_max).
pub const EDM_VPRED_KEYS: (&str, &str) = ("edm_vpred.sigma_min", "edm_vpred.sigma_max");

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelFamily {
    Sd1,
    Sd2 { v_pred: bool },
    Sdxl,
    SdxlRefiner,
    Sd3,
    Flux,
    /// FLUX's blocks under a distilled-guidance approximator (Chroma).
    Chroma,
    /// Z-Image Turbo/Base (S3-DiT, Qwen3-4B captions).
    ZImage,
    /// FLUX.2 (klein, dev): FLUX's blocks with shared modulations.
    Flux2,
    /// Qwen-Image and its Edit models (dual-stream MMDiT, Qwen2.5-VL text).
    QwenImage,
    /// Wan 2.1 / 2.2 video transformers (UMT5-XXL text).
    Wan,
    Unknown,
}

impl fmt::Display for ModelFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelFamily::Sd1 => "SD1.x",
            ModelFamily::Sd2 { v_pred: true } => "SD2.x (v-prediction)",
            ModelFamily::Sd2 { v_pred: false } => "SD2.x (eps)",
            ModelFamily::Sdxl => "SDXL",
            ModelFamily::SdxlRefiner => "SDXL refiner",
            ModelFamily::Sd3 => "SD3",
            ModelFamily::Flux => "FLUX",
            ModelFamily::Chroma => "Chroma",
            ModelFamily::ZImage => "Z-Image",
            ModelFamily::Flux2 => "FLUX.2",
            ModelFamily::QwenImage => "Qwen-Image",
            ModelFamily::Wan => "Wan",
            ModelFamily::Unknown => "unknown",
        })
    }
}

/// UNet input variants, from the first convolution's input channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    Standard,
    /// 9 channels: latent + mask + masked-image latent.
    Inpaint,
    /// 8 channels: latent + image latent (instruct-pix2pix).
    Pix2Pix,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prediction {
    Eps,
    V,
    /// Rectified flow (SD3, FLUX).
    Flow,
}

/// Where the tensor names come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyLayout {
    /// Single-file LDM/SGM names (`model.diffusion_model.*`, `first_stage_model.*`, ...).
    Ldm,
    /// diffusers names (`unet.*`, `vae.*`, ... or a bare diffusers component file).
    Diffusers,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Components {
    pub unet: bool,
    /// A DiT (SD3 MMDiT or FLUX transformer) instead of a UNet.
    pub dit: bool,
    pub vae: bool,
    pub clip_l: bool,
    /// OpenCLIP ViT-H (SD2's text encoder).
    pub clip_h: bool,
    /// OpenCLIP ViT-bigG (SDXL, SD3).
    pub clip_g: bool,
    pub t5: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    pub family: ModelFamily,
    pub variant: Variant,
    pub layout: Option<KeyLayout>,
    /// Prefix of the diffusion model's tensors (e.g. `model.diffusion_model.`, `unet.`).
    pub diffusion_prefix: Option<String>,
    pub in_channels: Option<usize>,
    pub model_channels: Option<usize>,
    pub context_dim: Option<usize>,
    pub adm_in_channels: Option<usize>,
    pub prediction: Prediction,
    /// Why `prediction` is what it is.
    pub prediction_reason: String,
    /// The checkpoint carries a `ztsnr` key (zero terminal SNR schedule).
    pub zsnr: bool,
    /// FLUX: has `guidance_in` (dev-style distilled guidance) rather than schnell.
    pub flux_guidance: bool,
    /// FLUX/Chroma: the number of double-stream blocks (sd-cli numbers the single
    /// blocks after them in `--skip-layers`).
    pub double_blocks: Option<usize>,
    /// Qwen-Image-Layered (`addition_t_embedding`): it decomposes an image into layers.
    pub qwen_layered: bool,
    /// Wan 2.1 I2V / FLF2V (`img_emb`): the model reads CLIP-vision states of its images.
    pub wan_clip: bool,
    /// Wan 2.1 FLF2V (`img_emb.emb_pos`): those of a start and an end image.
    pub wan_flf: bool,
    /// Wan VACE (`vace_blocks`): the model reads a control video.
    pub wan_vace: bool,
    pub components: Components,
    /// A human-readable summary; for `Unknown`, what was (not) found.
    pub message: String,
}

fn find<'a>(tensors: &'a [TensorInfo], suffix: &str) -> Option<&'a TensorInfo> {
    tensors.iter().find(|t| t.name.ends_with(suffix))
}

fn prefix_of(t: &TensorInfo, suffix: &str) -> String {
    t.name[..t.name.len() - suffix.len()].to_string()
}

fn dim(t: Option<&TensorInfo>, i: usize) -> Option<usize> {
    t.and_then(|t| t.shape.get(i).copied())
}

fn components(tensors: &[TensorInfo]) -> Components {
    let mut c = Components::default();
    let any = |p: &str| tensors.iter().any(|t| t.name.contains(p));
    let starts = |p: &str| tensors.iter().any(|t| t.name.starts_with(p));
    c.vae = starts("first_stage_model.")
        || starts("vae.")
        || tensors
            .iter()
            .any(|t| t.name == "encoder.conv_in.weight" || t.name == "decoder.conv_in.weight");
    c.t5 = any("encoder.block.0.layer.0.SelfAttention") || starts("text_encoders.t5xxl.");
    c.clip_l = starts("cond_stage_model.transformer.text_model.")
        || starts("conditioner.embedders.0.transformer.text_model.")
        || starts("text_encoders.clip_l.");
    c.clip_h = starts("cond_stage_model.model.");
    c.clip_g = starts("conditioner.embedders.1.model.")
        || starts("conditioner.embedders.0.model.")
        || starts("text_encoders.clip_g.");
    // diffusers text encoders are CLIPTextModel(s): tell them apart by width.
    for comp in ["text_encoder.", "text_encoder_2.", "text_encoder_3."] {
        let emb = format!("{comp}text_model.embeddings.token_embedding.weight");
        if let Some(t) = tensors.iter().find(|t| t.name == emb) {
            match t.shape.get(1) {
                Some(768) => c.clip_l = true,
                Some(1024) => c.clip_h = true,
                Some(1280) => c.clip_g = true,
                _ => {}
            }
        }
    }
    c
}

/// Detects the model family of `tensors` from names and shapes.
pub fn detect(tensors: &[TensorInfo]) -> Detection {
    let mut d = Detection {
        family: ModelFamily::Unknown,
        variant: Variant::Standard,
        layout: None,
        diffusion_prefix: None,
        in_channels: None,
        model_channels: None,
        context_dim: None,
        adm_in_channels: None,
        prediction: Prediction::Eps,
        prediction_reason: "default: no v-prediction marker".into(),
        zsnr: tensors.iter().any(|t| t.name == "ztsnr"),
        flux_guidance: false,
        double_blocks: None,
        qwen_layered: false,
        wan_clip: false,
        wan_flf: false,
        wan_vace: false,
        components: components(tensors),
        message: String::new(),
    };
    let v_key = tensors.iter().any(|t| t.name == "v_pred");
    if v_key {
        d.prediction = Prediction::V;
        d.prediction_reason = "the checkpoint has a v_pred key".into();
    }

    // Qwen-Image: image and text modulations per block; its release keeps diffusers'
    // names, so there is one layout.
    if let Some(t) = find(tensors, "transformer_blocks.0.img_mod.1.weight") {
        let p = prefix_of(t, "transformer_blocks.0.img_mod.1.weight");
        d.in_channels = dim(tensors.iter().find(|t| t.name == format!("{p}img_in.weight")), 1);
        d.double_blocks = Some(block_count(tensors, &format!("{p}transformer_blocks.")));
        d.qwen_layered = tensors.iter().any(|t| t.name == format!("{p}{}", crate::models::qwen_image::LAYERED_MARKER));
        return finish_dit(d, ModelFamily::QwenImage, p, KeyLayout::Ldm);
    }
    // FLUX.2: FLUX's blocks with the shared modulations (BFL's names only).
    if let Some(t) = find(tensors, "double_stream_modulation_img.lin.weight") {
        let p = prefix_of(t, "double_stream_modulation_img.lin.weight");
        d.in_channels = dim(tensors.iter().find(|t| t.name == format!("{p}img_in.weight")), 1);
        d.flux_guidance = tensors.iter().any(|t| t.name.starts_with(&format!("{p}guidance_in.")));
        d.double_blocks = Some(block_count(tensors, &format!("{p}double_blocks.")));
        return finish_dit(d, ModelFamily::Flux2, p, KeyLayout::Ldm);
    }
    // FLUX.2 in diffusers' names: single blocks with one fused input projection.
    if let Some(t) = find(tensors, crate::models::flux2::diffusers::DIFFUSERS_MARKER) {
        let p = prefix_of(t, crate::models::flux2::diffusers::DIFFUSERS_MARKER);
        d.in_channels = dim(tensors.iter().find(|t| t.name == format!("{p}x_embedder.weight")), 1);
        d.flux_guidance = tensors.iter().any(|t| t.name.starts_with(&format!("{p}time_guidance_embed.guidance_embedder.")));
        d.double_blocks = Some(block_count(tensors, &format!("{p}transformer_blocks.")));
        return finish_dit(d, ModelFamily::Flux2, p, KeyLayout::Diffusers);
    }
    // FLUX: LDM `double_blocks`/`single_blocks`, diffusers `single_transformer_blocks`.
    if let Some(t) = find(tensors, "double_blocks.0.img_attn.qkv.weight") {
        let p = prefix_of(t, "double_blocks.0.img_attn.qkv.weight");
        d.in_channels = dim(
            tensors
                .iter()
                .find(|t| t.name == format!("{p}img_in.weight")),
            1,
        );
        d.flux_guidance = tensors
            .iter()
            .any(|t| t.name.starts_with(&format!("{p}guidance_in.")));
        d.double_blocks = Some(block_count(tensors, &format!("{p}double_blocks.")));
        let chroma = tensors.iter().any(|t| t.name == format!("{p}distilled_guidance_layer.in_proj.weight"));
        return finish_dit(d, if chroma { ModelFamily::Chroma } else { ModelFamily::Flux }, p, KeyLayout::Ldm);
    }
    if let Some(t) = find(tensors, "single_transformer_blocks.0.attn.to_q.weight") {
        let p = prefix_of(t, "single_transformer_blocks.0.attn.to_q.weight");
        d.in_channels = dim(
            tensors
                .iter()
                .find(|t| t.name == format!("{p}x_embedder.weight")),
            1,
        );
        d.flux_guidance = tensors.iter().any(|t| {
            t.name
                .starts_with(&format!("{p}time_text_embed.guidance_embedder."))
        });
        d.double_blocks = Some(block_count(tensors, &format!("{p}transformer_blocks.")));
        return finish_dit(d, ModelFamily::Flux, p, KeyLayout::Diffusers);
    }
    // SD3: LDM `joint_blocks`, diffusers `transformer_blocks` + `pos_embed` without single blocks.
    if let Some(t) = find(tensors, "joint_blocks.0.x_block.attn.qkv.weight") {
        let p = prefix_of(t, "joint_blocks.0.x_block.attn.qkv.weight");
        d.in_channels = dim(
            tensors
                .iter()
                .find(|t| t.name == format!("{p}x_embedder.proj.weight")),
            1,
        );
        return finish_dit(d, ModelFamily::Sd3, p, KeyLayout::Ldm);
    }
    if let Some(t) = find(tensors, "transformer_blocks.0.attn.add_q_proj.weight") {
        let p = prefix_of(t, "transformer_blocks.0.attn.add_q_proj.weight");
        if tensors
            .iter()
            .any(|t| t.name == format!("{p}pos_embed.proj.weight"))
        {
            d.in_channels = dim(
                tensors
                    .iter()
                    .find(|t| t.name == format!("{p}pos_embed.proj.weight")),
                1,
            );
            return finish_dit(d, ModelFamily::Sd3, p, KeyLayout::Diffusers);
        }
    }

    // Wan: video blocks with q/k-normed cross-attention (the release's `cross_attn`,
    // diffusers' `attn2`) after a 3-D patch embedding.
    for (marker, layout) in [(crate::models::wan::MARKER, KeyLayout::Ldm), ("blocks.0.attn2.norm_q.weight", KeyLayout::Diffusers)] {
        if let Some(t) = find(tensors, marker) {
            let p = prefix_of(t, marker);
            if let Some(embed) = tensors.iter().find(|t| t.name == format!("{p}patch_embedding.weight")) {
                d.in_channels = dim(Some(embed), 1);
                d.double_blocks = Some(block_count(tensors, &format!("{p}blocks.")));
                // The release's `img_emb` (diffusers': `condition_embedder.image_embedder`).
                let has = |s: &str| tensors.iter().any(|t| t.name.starts_with(&format!("{p}{s}")));
                d.wan_clip = has("img_emb.") || has("condition_embedder.image_embedder.");
                d.wan_flf = has("img_emb.emb_pos") || has("condition_embedder.image_embedder.pos_embed");
                d.wan_vace = has("vace_blocks.");
                return finish_dit(d, ModelFamily::Wan, p, layout);
            }
        }
    }
    // Z-Image: `cap_embedder` beside `layers` with q/k norms; diffusers' names key the
    // patch embedder by patch size (`all_x_embedder.2-1`), the release's do not.
    if let Some(t) = find(tensors, "cap_embedder.0.weight") {
        let p = prefix_of(t, "cap_embedder.0.weight");
        let has = |n: &str| tensors.iter().find(|t| t.name == format!("{p}{n}"));
        for (embedder, norm, layout) in [("x_embedder.weight", "q_norm", KeyLayout::Ldm), ("all_x_embedder.2-1.weight", "norm_q", KeyLayout::Diffusers)] {
            if has(embedder).is_some() && has(&format!("layers.0.attention.{norm}.weight")).is_some() {
                d.in_channels = dim(has(embedder), 1);
                return finish_dit(d, ModelFamily::ZImage, p, layout);
            }
        }
    }

    // UNets.
    if tensors
        .iter()
        .any(|t| t.name.contains("time_mixer.mix_factor"))
    {
        d.message = "a video UNet (Stable Video Diffusion) is not supported".into();
        return d;
    }
    let (prefix, layout, conv_in) = if let Some(t) = find(tensors, "input_blocks.0.0.weight") {
        (prefix_of(t, "input_blocks.0.0.weight"), KeyLayout::Ldm, t)
    } else if let Some(t) = tensors
        .iter()
        .filter(|t| t.name.ends_with("conv_in.weight"))
        .find(|t| {
            let p = prefix_of(t, "conv_in.weight");
            tensors
                .iter()
                .any(|u| u.name == format!("{p}time_embedding.linear_1.weight"))
        })
    {
        (prefix_of(t, "conv_in.weight"), KeyLayout::Diffusers, t)
    } else {
        return unknown(d, tensors);
    };
    d.components.unet = true;
    d.layout = Some(layout);
    d.in_channels = conv_in.shape.get(1).copied();
    d.model_channels = conv_in.shape.first().copied();
    d.variant = match d.in_channels {
        Some(9) => Variant::Inpaint,
        Some(8) => Variant::Pix2Pix,
        _ => Variant::Standard,
    };
    d.context_dim = tensors
        .iter()
        .find(|t| t.name.starts_with(&prefix) && t.name.ends_with("attn2.to_k.weight"))
        .and_then(|t| t.shape.get(1).copied());
    let adm_key = match layout {
        KeyLayout::Ldm => format!("{prefix}label_emb.0.0.weight"),
        KeyLayout::Diffusers => format!("{prefix}add_embedding.linear_1.weight"),
    };
    d.adm_in_channels = dim(tensors.iter().find(|t| t.name == adm_key), 1);
    d.diffusion_prefix = Some(prefix.clone());

    let has = |p: &str| tensors.iter().any(|t| t.name.starts_with(p));
    d.family = match (d.context_dim, d.adm_in_channels) {
        (Some(768), None) => ModelFamily::Sd1,
        (Some(1024), None) => ModelFamily::Sd2 { v_pred: false },
        (Some(2048), Some(2816)) => ModelFamily::Sdxl,
        (Some(1280), Some(2560)) => ModelFamily::SdxlRefiner,
        // No cross-attention key found: fall back to sd.cpp's text-encoder markers.
        (None, _) if has("conditioner.embedders.1") => ModelFamily::Sdxl,
        (None, _) if has("conditioner.embedders.0.model") => ModelFamily::SdxlRefiner,
        (None, _) if has("cond_stage_model.model.") => ModelFamily::Sd2 { v_pred: false },
        (None, _) if has("cond_stage_model.transformer.") => ModelFamily::Sd1,
        // A non-standard width without ADM (reduced research and test models): the
        // text encoder the checkpoint ships with names the family.
        (Some(_), None) if has("cond_stage_model.model.") => ModelFamily::Sd2 { v_pred: false },
        (Some(_), None) if has("cond_stage_model.transformer.") => ModelFamily::Sd1,
        // A diffusers pipeline folder's text encoders have the same names in SD1 and SD2:
        // SD2's UNet projects into its transformers linearly, SD1's with 1×1 convolutions.
        (Some(_), None) if has("text_encoder.text_model.") => {
            let linear = tensors.iter().any(|t| t.name.starts_with(&prefix) && t.name.ends_with("proj_in.weight") && t.shape.len() == 2);
            if linear {
                ModelFamily::Sd2 { v_pred: false }
            } else {
                ModelFamily::Sd1
            }
        }
        (Some(_), Some(_)) if has("conditioner.embedders.1.") || has("text_encoder_2.") => ModelFamily::Sdxl,
        (Some(_), Some(_)) if has("conditioner.embedders.0.model.") => ModelFamily::SdxlRefiner,
        (ctx, adm) => {
            d.message = format!(
                "UNet with cross-attention width {ctx:?} and ADM input {adm:?} matches no known family \
                 (SD1: 768/none, SD2: 1024/none, SDXL: 2048/2816, SDXL refiner: 1280/2560)"
            );
            return d;
        }
    };
    if let ModelFamily::Sd2 { .. } = d.family {
        d.family = ModelFamily::Sd2 {
            v_pred: d.prediction == Prediction::V,
        };
        if !v_key {
            d.prediction_reason =
                "SD2 weights do not say eps or v; assuming eps (no v_pred key)".into();
        }
    }
    d.message = summary(&d);
    d
}

/// How many numbered blocks `{prefix}N.` the tensors hold (the highest index + 1).
fn block_count(tensors: &[TensorInfo], prefix: &str) -> usize {
    tensors
        .iter()
        .filter_map(|t| t.name.strip_prefix(prefix)?.split('.').next()?.parse::<usize>().ok())
        .max()
        .map_or(0, |m| m + 1)
}

fn finish_dit(
    mut d: Detection,
    family: ModelFamily,
    prefix: String,
    layout: KeyLayout,
) -> Detection {
    d.family = family;
    d.layout = Some(layout);
    d.diffusion_prefix = Some(prefix);
    d.components.dit = true;
    d.prediction = Prediction::Flow;
    d.prediction_reason = "rectified-flow architecture".into();
    d.message = summary(&d);
    d
}

fn unknown(mut d: Detection, tensors: &[TensorInfo]) -> Detection {
    let first: Vec<&str> = tensors.iter().take(8).map(|t| t.name.as_str()).collect();
    d.message = format!(
        "no UNet/DiT tensors recognised ({} tensors); first keys: {}",
        tensors.len(),
        if first.is_empty() {
            "(none)".to_string()
        } else {
            first.join(", ")
        }
    );
    d
}

fn summary(d: &Detection) -> String {
    let mut s = format!("{}", d.family);
    match d.variant {
        Variant::Inpaint => s.push_str(" inpainting"),
        Variant::Pix2Pix => s.push_str(" instruct-pix2pix"),
        Variant::Standard => {}
    }
    if let Some(c) = d.in_channels {
        s.push_str(&format!(", {c} input channels"));
    }
    let c = &d.components;
    let parts: Vec<&str> = [
        (c.unet, "unet"),
        (c.dit, "dit"),
        (c.vae, "vae"),
        (c.clip_l, "clip_l"),
        (c.clip_h, "clip_h"),
        (c.clip_g, "clip_g"),
        (c.t5, "t5"),
    ]
    .iter()
    .filter(|(b, _)| *b)
    .map(|(_, n)| *n)
    .collect();
    s.push_str(&format!("; components: {}", parts.join(", ")));
    s.push_str(&format!(
        "; prediction {:?} ({})",
        d.prediction, d.prediction_reason
    ));
    s
}

/// Prediction-type hint from checkpoint metadata, if it states one.
fn metadata_hint(src: &dyn TensorSource) -> Option<(Prediction, String)> {
    let m = src.metadata();
    if let Some(v) = m.get("modelspec.prediction_type") {
        let v = v.to_ascii_lowercase();
        if v == "v" || v == "v_prediction" {
            return Some((
                Prediction::V,
                format!("metadata modelspec.prediction_type = {v}"),
            ));
        }
        if v == "epsilon" || v == "eps" {
            return Some((
                Prediction::Eps,
                format!("metadata modelspec.prediction_type = {v}"),
            ));
        }
    }
    if let Some(v) = m.get("ss_v_parameterization") {
        let v_pred = v.eq_ignore_ascii_case("true");
        let p = if v_pred {
            Prediction::V
        } else {
            Prediction::Eps
        };
        return Some((p, format!("metadata ss_v_parameterization = {v}")));
    }
    None
}

/// Prediction-type hint from explicit markers in the file or folder name.
pub fn filename_hint(name: &str) -> Option<Prediction> {
    let n = name.to_ascii_lowercase();
    if [
        "v-pred",
        "vpred",
        "v_pred",
        "768-v",
        "-v-ema",
        "v-prediction",
    ]
    .iter()
    .any(|m| n.contains(m))
    {
        Some(Prediction::V)
    } else if ["512-base", "eps-pred", "epsilon"]
        .iter()
        .any(|m| n.contains(m))
    {
        Some(Prediction::Eps)
    } else {
        None
    }
}

/// [`detect`], plus prediction hints from metadata, the file name and (for SD2) weight values.
pub fn detect_source(src: &dyn TensorSource) -> Detection {
    let mut d = detect(src.tensors());
    if src.get("v_pred").is_some()
        || d.prediction == Prediction::Flow
        || d.family == ModelFamily::Unknown
    {
        return d;
    }
    let file = src
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    let hint = metadata_hint(src)
        .or_else(|| filename_hint(&file).map(|p| (p, format!("file name '{file}'"))))
        .or_else(|| {
            matches!(d.family, ModelFamily::Sd2 { .. })
                .then(|| sd2_weight_hint(src, &d))
                .flatten()
        });
    if let Some((p, reason)) = hint {
        d.prediction = p;
        d.prediction_reason = reason;
        if let ModelFamily::Sd2 { .. } = d.family {
            d.family = ModelFamily::Sd2 {
                v_pred: p == Prediction::V,
            };
        }
        d.message = summary(&d);
    }
    d
}

/// ComfyUI's SD2 test: v-models have a wider spread in the last attention block's first norm.
/// Inpainting models (9 channels) are always eps.
fn sd2_weight_hint(src: &dyn TensorSource, d: &Detection) -> Option<(Prediction, String)> {
    if d.in_channels != Some(4) {
        return Some((Prediction::Eps, "SD2 inpainting models are eps".into()));
    }
    let prefix = d.diffusion_prefix.as_deref()?;
    let key = match d.layout? {
        KeyLayout::Ldm => format!("{prefix}output_blocks.11.1.transformer_blocks.0.norm1.bias"),
        KeyLayout::Diffusers => {
            format!("{prefix}up_blocks.3.attentions.2.transformer_blocks.0.norm1.bias")
        }
    };
    let info = src.get(&key)?;
    let bytes = src.read(&key).ok()?;
    let v = dtype::to_f32(info.dtype, &bytes, info.n_elements()).ok()?;
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let std = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    let p = if std > 0.09 {
        Prediction::V
    } else {
        Prediction::Eps
    };
    Some((
        p,
        format!("std of {key} is {std:.3} (ComfyUI: > 0.09 means v)"),
    ))
}
