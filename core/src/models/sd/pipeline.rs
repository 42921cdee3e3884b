//! A diffusers pipeline folder (`model_index.json`, `unet/`, `vae/`, `text_encoder/`, …)
//! shown as a single-file LDM checkpoint, so every loader and architecture reads one key
//! layout.
//!
//! [`crate::io::open`] gives the folder's tensors under their component's name
//! (`unet.conv_in.weight`); [`as_checkpoint`] renames the UNet to
//! `model.diffusion_model.*` and the VAE to `first_stage_model.*` in LDM names, as
//! diffusers' `convert_diffusers_to_original_stable_diffusion.py` does. The text encoders
//! keep their Hugging Face names under `text_encoder.` / `text_encoder_2.`: the CLIP
//! models read that layout as it is.

use std::collections::HashSet;
use std::path::Path;

use crate::models::conditioning::Prediction;
use crate::models::vae::VaeLayout;
use crate::models::{ModelError, Result};
use crate::io::{Assembled, Format, TensorSource};
use crate::lora::keys::diffusers_to_ldm_unet;

const UNET: &str = "unet.";
const VAE: &str = "vae.";

/// `src` in LDM names if it is a diffusers folder (see the module doc); any other source
/// as it is. Fails naming the tensor when a UNet or VAE tensor has no LDM name, so that a
/// folder of another architecture is not half loaded.
pub fn as_checkpoint(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    if src.format() != Format::Diffusers {
        return Ok(src);
    }
    let shown = src.path().display().to_string();
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    let unet: Vec<&str> = names.iter().filter_map(|n| n.strip_prefix(UNET)).collect();
    // Res blocks per down level: the highest resnet index of the first level, plus one.
    let nrb = unet.iter().filter_map(|n| n.strip_prefix("down_blocks.0.resnets.")?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |m| m + 1);
    let up_attn: HashSet<usize> = unet.iter().filter_map(|n| n.strip_prefix("up_blocks.")?.split_once(".attentions.")?.0.parse().ok()).collect();
    let vae_names: Vec<&str> = names.iter().copied().filter(|n| n.starts_with(VAE)).collect();
    let vae = if vae_names.is_empty() {
        None
    } else {
        match VaeLayout::detect(vae_names.iter().copied()) {
            Some(l @ VaeLayout::Diffusers { .. }) => Some(l),
            _ => return Err(ModelError::Config(format!("{shown}: vae/ holds no diffusers AutoencoderKL (no `decoder.up_blocks.*`)"))),
        }
    };
    // The LDM name of a UNet or VAE tensor and whether it is a linear weight LDM stores
    // as a 1×1 convolution; `Some(None)`: a name kept as it is (text encoders, components
    // not renamed); `None`: no LDM name.
    let rename = |name: &str| -> Option<Option<(String, bool)>> {
        if let Some(k) = name.strip_prefix(UNET) {
            let (module, param) = k.rsplit_once('.')?;
            let ldm = diffusers_to_ldm_unet(module, nrb, |l| up_attn.contains(&l))?;
            Some(Some((format!("model.diffusion_model.{ldm}.{param}"), false)))
        } else if name.starts_with(VAE) {
            let (ldm, linear) = vae.as_ref()?.ldm_name(name)?;
            Some(Some((format!("first_stage_model.{ldm}"), linear)))
        } else {
            Some(None)
        }
    };
    let mut unnamed = None;
    let renamed = Assembled::renamed(src, |t| {
        let mut info = t.clone();
        match rename(&t.name) {
            Some(Some((ldm, linear))) => {
                info.name = ldm;
                // diffusers' linear attention weights are LDM's 1×1 convolutions.
                if linear && info.shape.len() == 2 {
                    info.shape.extend([1, 1]);
                }
            }
            Some(None) => {}
            None => {
                unnamed.get_or_insert_with(|| t.name.clone());
            }
        }
        Some(info)
    })
    .map_err(|name| ModelError::Weight { name, detail: format!("{shown}: two tensors map to this name") })?;
    if let Some(name) = unnamed {
        return Err(ModelError::Weight { name, detail: format!("{shown}: no LDM name for this diffusers tensor (an unsupported UNet or VAE structure)") });
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
