//! Loading a model's weights from a [`TensorSource`] into ggml [`Weights`].
//!
//! Which type each tensor is stored as follows sd.cpp's rules ([`TypeRules`]: `--type`
//! and `--tensor-type-rules`, biases and embeddings left alone, rows that do not split
//! into quantization blocks kept). What ggml cannot compute with (f64, f8, integers)
//! becomes f32.

use super::{ModelError, Result, WeightSpec, Weights};
use crate::dtype::{self, DType};
use crate::ggml::{Backend, GType};
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

/// Every tensor of `src` whose name starts with one of `prefixes`, on `backend`.
pub fn load_weights(backend: &Backend, src: &dyn TensorSource, prefixes: &[&str], rules: &TypeRules) -> Result<Weights> {
    let wanted: Vec<_> = src.tensors().iter().filter(|t| prefixes.iter().any(|p| t.name.starts_with(p))).map(|t| (src, t, t.name.clone())).collect();
    if wanted.is_empty() {
        return Err(ModelError::Config(format!("{}: no tensors under {prefixes:?}", src.path().display())));
    }
    load_named(backend, wanted, rules)
}

/// Every tensor of several sources in one [`Weights`], each named `prefix` + its name in
/// its file: models split over files whose names collide (TAESD's encoder and decoder
/// files, combined as ComfyUI does under `taesd_encoder.` / `taesd_decoder.`).
pub fn load_weights_prefixed(backend: &Backend, parts: &[(&dyn TensorSource, &str)], rules: &TypeRules) -> Result<Weights> {
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
fn load_named(backend: &Backend, wanted: Vec<(&dyn TensorSource, &TensorInfo, String)>, rules: &TypeRules) -> Result<Weights> {
    let mut specs = Vec::with_capacity(wanted.len());
    let mut origin = std::collections::HashMap::with_capacity(wanted.len());
    for (src, t, name) in &wanted {
        let ty = load_type(t, rules);
        let g = ty.ggml_type().ok_or_else(|| ModelError::Weight { name: t.name.clone(), detail: format!("{ty:?} has no ggml type") })?;
        if t.shape.len() > 4 {
            return Err(ModelError::Weight { name: t.name.clone(), detail: format!("{} dimensions", t.shape.len()) });
        }
        let ne: Vec<i64> = if t.shape.is_empty() { vec![1] } else { t.shape.iter().rev().map(|&d| d as i64).collect() };
        specs.push(WeightSpec { name: name.clone(), ty: GType(g), ne });
        origin.insert(name.as_str(), (*src, *t));
    }
    Weights::new(backend, &specs, |spec| {
        let &(src, info) = origin.get(spec.name.as_str()).ok_or_else(|| ModelError::MissingWeight(spec.name.clone()))?;
        let bytes = src.read(&info.name).map_err(|e| ModelError::Weight { name: spec.name.clone(), detail: e.to_string() })?;
        let ty = DType::from_ggml(spec.ty.0).ok_or_else(|| ModelError::Weight { name: spec.name.clone(), detail: "unknown ggml type".into() })?;
        let out = if ty == info.dtype { Ok(bytes.into_owned()) } else { dtype::convert(info.dtype, &bytes, &info.shape, ty).map_err(|e| ModelError::Weight { name: spec.name.clone(), detail: e.to_string() }) };
        src.release(&info.name);
        out
    })
}
