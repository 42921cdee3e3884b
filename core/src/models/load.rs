//! Loading a model's weights from a [`TensorSource`] into ggml [`Weights`].
//!
//! Which type each tensor is stored as follows sd.cpp's rules ([`TypeRules`]: `--type`
//! and `--tensor-type-rules`, biases and embeddings left alone, rows that do not split
//! into quantization blocks kept). What ggml cannot compute with (f64, f8, integers)
//! becomes f32.

use super::{ModelError, Result, WeightSpec, Weights};
use crate::dtype::{self, DType};
use crate::ggml::{AllocTarget, GType};
use crate::io::{TensorInfo, TensorSource, TypeRules};

/// The type `info` is loaded as under `rules`.
pub fn load_type(info: &TensorInfo, rules: &TypeRules) -> DType {
    let t = rules.target(info);
    // ggml multiplies matrices in quantized types but multiplies and adds element-wise
    // only in float ones: a quantized vector (a norm's weight, whose 32 or 64 values fill
    // whole blocks; or one a converter quantized) computes as f32, as in sd.cpp, whose
    // norm layers are always f32.
    if t.is_quantized() && info.shape.len() < 2 {
        return DType::F32;
    }
    // Nor is a vector (a norm's weight, a bias under any name: OpenCLIP's `in_proj_bias`)
    // narrowed to another float type: sd.cpp's layers hold them in f32 whatever `--type`
    // says (and its rules see canonical names, where every bias ends in `.bias`); bf16 would
    // cost them precision and save nothing that matters. (`sdflow convert` writes what the
    // rules say, as sd.cpp's convert does.)
    if info.shape.len() < 2 && t.is_float() && t != DType::F32 && t != info.dtype {
        return if matches!(info.dtype, DType::F16 | DType::BF16) { info.dtype } else { DType::F32 };
    }
    if t.ggml_type().is_some() && (t == DType::F32 || t == DType::F16 || t == DType::BF16 || t.is_quantized()) {
        t
    } else {
        DType::F32
    }
}

/// The bytes [`load_weights`] would place for `src`'s tensors under `prefixes` (each in the
/// type `rules` give it, before the buffer's alignment padding): what the residency manager
/// checks against a device's budget before loading anything.
pub fn planned_bytes(src: &dyn TensorSource, prefixes: &[&str], rules: &TypeRules) -> u64 {
    src.tensors()
        .iter()
        .filter(|t| prefixes.iter().any(|p| t.name.starts_with(p)))
        .filter_map(|t| load_type(t, rules).byte_len(t.n_elements()))
        .map(|b| b as u64)
        .sum()
}

/// Every tensor of `src` whose name starts with one of `prefixes`, in `backend`'s memory
/// (a [`crate::ggml::Backend`] or a [`crate::ggml::BufferType`]).
pub fn load_weights(backend: &(impl AllocTarget + ?Sized), src: &dyn TensorSource, prefixes: &[&str], rules: &TypeRules) -> Result<Weights> {
    let wanted: Vec<_> = src.tensors().iter().filter(|t| prefixes.iter().any(|p| t.name.starts_with(p))).map(|t| (src, t, t.name.clone())).collect();
    if wanted.is_empty() {
        return Err(ModelError::Config(format!("{}: no tensors under {prefixes:?}", src.path().display())));
    }
    load_named(backend, wanted, rules)
}

/// Every tensor of several sources in one [`Weights`], each named `prefix` + its name in
/// its file: models split over files whose names collide (TAESD's encoder and decoder
/// files, combined as ComfyUI does under `taesd_encoder.` / `taesd_decoder.`).
pub fn load_weights_prefixed(backend: &(impl AllocTarget + ?Sized), parts: &[(&dyn TensorSource, &str)], rules: &TypeRules) -> Result<Weights> {
    let mut wanted = Vec::new();
    for &(src, prefix) in parts {
        if src.tensors().is_empty() {
            return Err(ModelError::Config(format!("{}: no tensors", src.path().display())));
        }
        wanted.extend(src.tensors().iter().map(|t| (src, t, format!("{prefix}{}", t.name))));
    }
    load_named(backend, wanted, rules)
}

/// Load `(source, tensor, name to give it)` triples, converting as `rules` say.
fn load_named(backend: &(impl AllocTarget + ?Sized), wanted: Vec<(&dyn TensorSource, &TensorInfo, String)>, rules: &TypeRules) -> Result<Weights> {
    let mut specs = Vec::with_capacity(wanted.len());
    let mut origin = std::collections::HashMap::with_capacity(wanted.len());
    // Empty marker tensors (ComfyUI's `scaled_fp8`) hold no weight.
    for (src, t, name) in wanted.iter().filter(|(_, t, _)| t.n_elements() > 0 || t.shape.is_empty()) {
        let ty = load_type(t, rules);
        let g = ty.ggml_type().ok_or_else(|| ModelError::Weight { name: t.name.clone(), detail: format!("{ty:?} has no ggml type") })?;
        if t.shape.len() > 4 {
            return Err(ModelError::Weight { name: t.name.clone(), detail: format!("{} dimensions", t.shape.len()) });
        }
        let ne: Vec<i64> = if t.shape.is_empty() { vec![1] } else { t.shape.iter().rev().map(|&d| d as i64).collect() };
        specs.push(WeightSpec { name: name.clone(), ty: GType(g), ne });
        origin.insert(name.as_str(), (*src, *t));
    }
    let markers = wanted.iter().filter(|(_, t, _)| t.n_elements() == 0 && !t.shape.is_empty()).map(|(_, _, name)| name.clone()).collect();
    let mut w = Weights::new(backend, &specs, |spec| {
        let &(src, info) = origin.get(spec.name.as_str()).ok_or_else(|| ModelError::MissingWeight(spec.name.clone()))?;
        let bad = |e: &dyn std::fmt::Display| ModelError::Weight { name: spec.name.clone(), detail: e.to_string() };
        let bytes = src.read(&info.name).map_err(|e| bad(&e))?;
        let ty = DType::from_ggml(spec.ty.0).ok_or_else(|| bad(&"unknown ggml type"))?;
        let out = match fp8_scale(src, info)? {
            Some(scale) => {
                let n = info.n_elements();
                let mut v = dtype::to_f32(info.dtype, &bytes, n).map_err(|e| bad(&e))?;
                let rows = info.shape.first().copied().unwrap_or(1).max(1);
                for (i, x) in v.iter_mut().enumerate() {
                    *x *= if scale.len() == 1 { scale[0] } else { scale[i / (n / rows)] };
                }
                let f32_bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                if ty == DType::F32 { Ok(f32_bytes) } else { dtype::convert(DType::F32, &f32_bytes, &info.shape, ty).map_err(|e| bad(&e)) }
            }
            None if ty == info.dtype => Ok(bytes.into_owned()),
            None => dtype::convert(info.dtype, &bytes, &info.shape, ty).map_err(|e| bad(&e)),
        };
        src.release(&info.name);
        out
    })?;
    w.set_markers(markers);
    Ok(w)
}

/// The scale of an fp8 weight in ComfyUI's "scaled fp8" files (`t5xxl_fp8_e4m3fn_scaled`,
/// `flux1-dev-fp8-scaled`): `{layer}.scale_weight` (newer files: `{layer}.weight_scale`) beside
/// `{layer}.weight`, one value or one per output row; the weight is `fp8 · scale`. `None` for
/// every other tensor.
fn fp8_scale(src: &dyn TensorSource, info: &TensorInfo) -> Result<Option<Vec<f32>>> {
    if !matches!(info.dtype, DType::F8E4M3 | DType::F8E5M2) {
        return Ok(None);
    }
    let Some(stem) = info.name.strip_suffix(".weight") else { return Ok(None) };
    let Some(scale) = [format!("{stem}.scale_weight"), format!("{stem}.weight_scale")].into_iter().find_map(|n| src.tensors().iter().find(|t| t.name == n).cloned()) else {
        return Ok(None);
    };
    let bad = |detail: String| ModelError::Weight { name: scale.name.clone(), detail };
    let n = scale.n_elements();
    let rows = info.shape.first().copied().unwrap_or(1);
    if n != 1 && n != rows {
        return Err(bad(format!("{n} scales for a weight of {rows} rows")));
    }
    let bytes = src.read(&scale.name).map_err(|e| bad(e.to_string()))?;
    let v = dtype::to_f32(scale.dtype, &bytes, n).map_err(|e| bad(e.to_string()))?;
    src.release(&scale.name);
    if v.iter().any(|x| !x.is_finite()) {
        return Err(bad(format!("scales {v:?} are not all finite")));
    }
    Ok(Some(v))
}

/// `src` renamed by `rename` (tensors it maps to `None` left out) when it is a GGUF file in
/// llama.cpp's naming (a tensor name starts with `marker`, e.g. `blk.`), any other source
/// as it is: how the encoders read llama.cpp's files in Hugging Face's layout.
pub fn gguf_renamed(src: Box<dyn crate::io::TensorSource>, marker: &str, rename: fn(&str) -> Option<String>) -> Result<Box<dyn crate::io::TensorSource>> {
    if !src.tensors().iter().any(|t| t.name.starts_with(marker)) {
        return Ok(src);
    }
    let shown = src.path().display().to_string();
    let renamed = crate::io::Assembled::renamed(src, |t| {
        let mut info = t.clone();
        info.name = rename(&t.name)?;
        Some(info)
    })
    .map_err(|name| super::ModelError::Weight { name, detail: format!("{shown}: two tensors map to this name") })?;
    Ok(Box::new(renamed))
}
