//! Random LoRA files for a checkpoint, for end-to-end tests and demos: kohya LoRA
//! (`lora_up`/`lora_down`/`alpha`, LoCon for convolutions) over every UNet matrix and
//! convolution and every text-encoder layer matrix, named the way kohya's trainer names
//! them for an LDM checkpoint.

use std::collections::BTreeMap;
use std::path::Path;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::LoraError;
use crate::dtype::DType;
use crate::io::{gguf, safetensors, TensorSource};
use crate::synth::Format;

/// Writes a rank-`rank` LoRA for the weights of `ckpt` to `path`; the `up` factors are
/// drawn with standard deviation `std`, `down` with 1/√fan-in, alpha = rank (scale 1).
/// Returns the number of modules.
pub fn write_random_lora(ckpt: &dyn TensorSource, path: &Path, rank: usize, std: f32, seed: u64, format: Format) -> Result<usize, LoraError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut modules = 0;
    for t in ckpt.tensors() {
        let Some(base) = t.name.strip_suffix(".weight") else { continue };
        let key = if let Some(k) = base.strip_prefix("model.diffusion_model.") {
            format!("lora_unet_{}", k.replace('.', "_"))
        } else if let Some(i) = base.find("text_model.encoder.layers.") {
            // SDXL's first encoder is kohya's `te1`.
            let te = if base.starts_with("conditioner.embedders.0.") { "lora_te1_" } else { "lora_te_" };
            format!("{te}{}", base[i..].replace('.', "_"))
        } else if let Some(rest) = base.strip_prefix("conditioner.embedders.1.model.transformer.resblocks.") {
            // SDXL's OpenCLIP-G as trainers name it: `te2`, Hugging Face module paths.
            let Some((layer, module)) = rest.split_once('.') else { continue };
            let hf = match module {
                "attn.out_proj" => "self_attn_out_proj",
                "mlp.c_fc" => "mlp_fc1",
                "mlp.c_proj" => "mlp_fc2",
                _ => continue,
            };
            format!("lora_te2_text_model_encoder_layers_{layer}_{hf}")
        } else {
            continue;
        };
        if !(t.shape.len() == 2 || t.shape.len() == 4) || t.name.contains("norm") {
            continue;
        }
        let (o, i) = (t.shape[0], t.shape[1]);
        let r = rank.min(o).min(i).max(1);
        let tail: Vec<usize> = t.shape[2..].to_vec();
        let fan_in: usize = t.shape[1..].iter().product();
        let mut draw = |n: usize, s: f32| -> Vec<f32> {
            let d = Normal::new(0.0f32, s.max(1e-12)).unwrap_or_else(|_| Normal::new(0.0, 1.0).expect("unit normal"));
            (0..n).map(|_| d.sample(&mut rng)).collect()
        };
        let up_shape: Vec<usize> = if tail.is_empty() { vec![o, r] } else { vec![o, r, 1, 1] };
        let mut down_shape = vec![r, i];
        down_shape.extend(&tail);
        let up = draw(up_shape.iter().product(), std);
        let down = draw(down_shape.iter().product(), 1.0 / (fan_in as f32).sqrt());
        out.push((format!("{key}.lora_up.weight"), up_shape, up));
        out.push((format!("{key}.lora_down.weight"), down_shape, down));
        out.push((format!("{key}.alpha"), if format == Format::Gguf { vec![1] } else { vec![] }, vec![r as f32]));
        modules += 1;
    }
    let bytes: Vec<Vec<u8>> = out.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let tensors = out.iter().zip(&bytes).map(|((n, s, _), b)| (n.as_str(), DType::F32, s.clone(), b.as_slice()));
    match format {
        Format::Safetensors => safetensors::write(path, tensors, &BTreeMap::new())?,
        Format::Gguf => gguf::write(path, &[], tensors)?,
    }
    Ok(modules)
}
