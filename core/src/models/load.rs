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
    if t.ggml_type().is_some() && (t == DType::F32 || t == DType::F16 || t == DType::BF16 || t.is_quantized()) {
        t
    } else {
        DType::F32
    }
}

/// Every tensor of `src` whose name starts with one of `prefixes`, on `backend`.
pub fn load_weights(backend: &Backend, src: &dyn TensorSource, prefixes: &[&str], rules: &TypeRules) -> Result<Weights> {
    let wanted: Vec<_> = src.tensors().iter().filter(|t| prefixes.iter().any(|p| t.name.starts_with(p))).collect();
    if wanted.is_empty() {
        return Err(ModelError::Config(format!("{}: no tensors under {prefixes:?}", src.path().display())));
    }
    let mut specs = Vec::with_capacity(wanted.len());
    for t in &wanted {
        let ty = load_type(t, rules);
        let g = ty.ggml_type().ok_or_else(|| ModelError::Weight { name: t.name.clone(), detail: format!("{ty:?} has no ggml type") })?;
        if t.shape.len() > 4 {
            return Err(ModelError::Weight { name: t.name.clone(), detail: format!("{} dimensions", t.shape.len()) });
        }
        let ne: Vec<i64> = if t.shape.is_empty() { vec![1] } else { t.shape.iter().rev().map(|&d| d as i64).collect() };
        specs.push(WeightSpec { name: t.name.clone(), ty: GType(g), ne });
    }
    Weights::new(backend, &specs, |spec| {
        let info = src.get(&spec.name).ok_or_else(|| ModelError::MissingWeight(spec.name.clone()))?;
        let bytes = src.read(&spec.name).map_err(|e| ModelError::Weight { name: spec.name.clone(), detail: e.to_string() })?;
        let ty = DType::from_ggml(spec.ty.0).ok_or_else(|| ModelError::Weight { name: spec.name.clone(), detail: "unknown ggml type".into() })?;
        if ty == info.dtype {
            return Ok(bytes.into_owned());
        }
        dtype::convert(info.dtype, &bytes, &info.shape, ty).map_err(|e| ModelError::Weight { name: spec.name.clone(), detail: e.to_string() })
    })
}
