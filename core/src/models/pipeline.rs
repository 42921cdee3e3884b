//! A diffusers pipeline folder (`model_index.json`, `unet/` or `transformer/`, `vae/`,
//! `text_encoder*/`, …) shown as the single-file checkpoint people would download for its
//! family, so every loader and architecture reads one key layout.
//!
//! [`crate::io::open`] gives the folder's tensors under their component's name
//! (`unet.conv_in.weight`); [`as_checkpoint`] renames them:
//! - SD1.x/2.x/XL: the UNet to `model.diffusion_model.*` and the VAE to
//!   `first_stage_model.*` in LDM names, as diffusers'
//!   `convert_diffusers_to_original_stable_diffusion.py` does; the text encoders keep their
//!   Hugging Face names under `text_encoder.` / `text_encoder_2.` (the CLIP models read that
//!   layout as it is).
//! - FLUX.1 and SD3/SD3.5: the transformer to BFL's / Stability's names under
//!   `model.diffusion_model.` (fused as [`crate::models::dit::diffusers`] does for lone
//!   files), the VAE as above, and the text encoders under the prefixes of ComfyUI's
//!   all-in-one checkpoints ([`CLIP_L`], [`CLIP_G`], [`T5XXL`]), whose loader then reads
//!   the folder like such a file.

use std::collections::HashSet;
use std::path::Path;

use crate::models::conditioning::Prediction;
use crate::models::vae::VaeLayout;
use crate::models::{flux, sd3, t5, ModelError, Result};
use crate::io::{Assembled, Format, TensorInfo, TensorSource};
use crate::lora::keys::diffusers_to_ldm_unet;

const UNET: &str = "unet.";
const TRANSFORMER: &str = "transformer.";
const VAE: &str = "vae.";

/// Where ComfyUI's all-in-one FLUX.1 and SD3 checkpoints keep their text encoders (Hugging
/// Face names below each).
pub const CLIP_L: &str = "text_encoders.clip_l.transformer.";
pub const CLIP_G: &str = "text_encoders.clip_g.transformer.";
pub const T5XXL: &str = "text_encoders.t5xxl.transformer.";

/// The model file or pipeline folder at `path` as a checkpoint: [`crate::io::open`] seen
/// through [`as_checkpoint`], how every reader of a checkpoint path opens it.
pub fn open(path: &Path) -> Result<Box<dyn TensorSource>> {
    as_checkpoint(crate::io::open(path)?)
}

/// `src` in a single file's names if it is a diffusers folder (see the module doc); any
/// other source as it is. Fails naming the tensor when a model or VAE tensor has no such
/// name, so that a folder of another architecture is not half loaded.
pub fn as_checkpoint(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    if src.format() != Format::Diffusers {
        return Ok(src);
    }
    if src.tensors().iter().any(|t| t.name.starts_with(TRANSFORMER)) {
        return dit_checkpoint(src);
    }
    let shown = src.path().display().to_string();
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    let unet: Vec<&str> = names.iter().filter_map(|n| n.strip_prefix(UNET)).collect();
    // Res blocks per down level: the highest resnet index of the first level, plus one.
    let nrb = unet.iter().filter_map(|n| n.strip_prefix("down_blocks.0.resnets.")?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |m| m + 1);
    let up_attn: HashSet<usize> = unet.iter().filter_map(|n| n.strip_prefix("up_blocks.")?.split_once(".attentions.")?.0.parse().ok()).collect();
    let vae = vae_layout(&names, &shown)?;
    rename(src, |info| {
        if let Some(k) = info.name.strip_prefix(UNET) {
            let (module, param) = k.rsplit_once('.')?;
            let ldm = diffusers_to_ldm_unet(module, nrb, |l| up_attn.contains(&l))?;
            info.name = format!("model.diffusion_model.{ldm}.{param}");
            Some(())
        } else {
            rename_vae(vae.as_ref(), info)
        }
    })
}

/// A FLUX.1 or SD3 pipeline in the names of ComfyUI's all-in-one checkpoints.
fn dit_checkpoint(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let shown = src.path().display().to_string();
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    let holds = |marker: &str| names.iter().any(|n| n.strip_prefix(TRANSFORMER) == Some(marker));
    let layout = if holds(flux::diffusers::DIFFUSERS_MARKER) {
        &flux::diffusers::LAYOUT
    } else if holds(sd3::diffusers::DIFFUSERS_MARKER) {
        &sd3::diffusers::LAYOUT
    } else {
        return Err(ModelError::Config(format!("{shown}: transformer/ holds neither a FLUX.1 nor an SD3 transformer in diffusers' names")));
    };
    let vae = vae_layout(&names, &shown)?;
    // FLUX's second text encoder is T5-XXL; SD3's is OpenCLIP-G, its third T5-XXL.
    let second = if t5::is_t5(names.iter().filter_map(|n| n.strip_prefix("text_encoder_2."))) { T5XXL } else { CLIP_G };
    let renamed = rename(src, |info| {
        let prefixed = [("text_encoder.", CLIP_L), ("text_encoder_2.", second), ("text_encoder_3.", T5XXL)]
            .iter()
            .find_map(|(from, to)| Some(format!("{to}{}", info.name.strip_prefix(from)?)));
        match prefixed {
            Some(name) => {
                info.name = name;
                Some(())
            }
            None if info.name.starts_with(TRANSFORMER) => Some(()),
            None => rename_vae(vae.as_ref(), info),
        }
    })?;
    crate::models::dit::diffusers::pipeline_layout(renamed, layout, TRANSFORMER, "model.diffusion_model.")
}

/// The layout of the folder's `vae/`, `None` without one; an error when it is not a
/// diffusers AutoencoderKL.
fn vae_layout(names: &[&str], shown: &str) -> Result<Option<VaeLayout>> {
    let vae_names: Vec<&str> = names.iter().copied().filter(|n| n.starts_with(VAE)).collect();
    if vae_names.is_empty() {
        return Ok(None);
    }
    match VaeLayout::detect(vae_names.iter().copied()) {
        Some(l @ VaeLayout::Diffusers { .. }) => Ok(Some(l)),
        _ => Err(ModelError::Config(format!("{shown}: vae/ holds no diffusers AutoencoderKL (no `decoder.up_blocks.*`)"))),
    }
}

/// A `vae/` tensor renamed to `first_stage_model.*` in LDM names (diffusers' linear
/// attention weights become LDM's 1×1 convolutions); any other tensor kept as it is.
/// `None`: a VAE tensor without an LDM name.
fn rename_vae(vae: Option<&VaeLayout>, info: &mut TensorInfo) -> Option<()> {
    if !info.name.starts_with(VAE) {
        return Some(());
    }
    let (ldm, linear) = vae?.ldm_name(&info.name)?;
    info.name = format!("first_stage_model.{ldm}");
    if linear && info.shape.len() == 2 {
        info.shape.extend([1, 1]);
    }
    Some(())
}

/// `src` with each tensor renamed in place by `f`; fails naming the first tensor `f` has
/// no name for (`None`) or two tensors given one name.
fn rename(src: Box<dyn TensorSource>, mut f: impl FnMut(&mut TensorInfo) -> Option<()>) -> Result<Box<dyn TensorSource>> {
    let shown = src.path().display().to_string();
    let mut unnamed = None;
    let renamed = Assembled::renamed(src, |t| {
        let mut info = t.clone();
        if f(&mut info).is_none() {
            unnamed.get_or_insert_with(|| t.name.clone());
            return Some(t.clone());
        }
        Some(info)
    })
    .map_err(|name| ModelError::Weight { name, detail: format!("{shown}: two tensors map to this name") })?;
    if let Some(name) = unnamed {
        return Err(ModelError::Weight { name, detail: format!("{shown}: no single-file name for this diffusers tensor (an unsupported model or VAE structure)") });
    }
    Ok(Box::new(renamed))
}

/// What a pipeline folder's `scheduler/scheduler_config.json` says about the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerSettings {
    /// `prediction_type` (`epsilon`, `v_prediction`); `None` when not stated.
    pub prediction: Option<Prediction>,
    /// `rescale_betas_zero_snr`: the model was trained on the zero-terminal-SNR schedule.
    pub zero_snr: bool,
}

/// The folder's [`SchedulerSettings`]; the defaults when it has no scheduler config.
pub fn scheduler_settings(dir: &Path) -> Result<SchedulerSettings> {
    let path = dir.join("scheduler/scheduler_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(SchedulerSettings::default()) };
    let at = |msg: String| ModelError::Config(format!("{}: {msg}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| at(format!("invalid JSON: {e}")))?;
    let prediction = match json.get("prediction_type") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => match s.as_str() {
            "epsilon" => Some(Prediction::Epsilon),
            "v_prediction" => Some(Prediction::V),
            other => return Err(at(format!("prediction_type `{other}` is not supported (epsilon, v_prediction are)"))),
        },
        Some(other) => return Err(at(format!("prediction_type {other} is not a string"))),
    };
    let zero_snr = match json.get("rescale_betas_zero_snr") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => return Err(at(format!("rescale_betas_zero_snr {other} is not a boolean"))),
    };
    Ok(SchedulerSettings { prediction, zero_snr })
}
