//! Loading a model's weights from a [`TensorSource`] into ggml [`Weights`].
//!
//! Types follow one rule set: vectors (norms, biases) become f32, because ggml's
//! broadcasting adds and muls want f32 operands and they are a rounding error of the
//! model's size; matrices keep their stored type when ggml can compute with it, or take
//! the requested `weight_type`; a quantized request falls back to f16 for tensors whose
//! rows do not split into quantization blocks (sd.cpp does the same).

use super::{ModelError, Result, WeightSpec, Weights};
use crate::dtype::{self, DType};
use crate::ggml::{Backend, GType};
use crate::io::TensorSource;

/// The ggml type a tensor of `stored` dtype and `shape` (PyTorch order) is loaded as.
pub fn load_type(stored: DType, shape: &[usize], weight_type: Option<DType>) -> DType {
    let row = shape.last().copied().unwrap_or(1);
    if shape.len() <= 1 {
        return DType::F32;
    }
    let computable = |t: DType| t.ggml_type().is_some() && (t.is_float() || t.is_quantized());
    let want = match weight_type {
        Some(t) if computable(t) => t,
        _ if computable(stored) => stored,
        _ => DType::F32,
    };
    if want.is_quantized() && row % want.block_size() != 0 {
        return DType::F16;
    }
    want
}

/// Every tensor of `src` whose name starts with one of `prefixes`, on `backend`.
pub fn load_weights(backend: &Backend, src: &dyn TensorSource, prefixes: &[&str], weight_type: Option<DType>) -> Result<Weights> {
    let wanted: Vec<_> = src.tensors().iter().filter(|t| prefixes.iter().any(|p| t.name.starts_with(p))).collect();
    if wanted.is_empty() {
        return Err(ModelError::Config(format!("{}: no tensors under {prefixes:?}", src.path().display())));
    }
    let mut specs = Vec::with_capacity(wanted.len());
    for t in &wanted {
        let mut ty = load_type(t.dtype, &t.shape, weight_type);
        // Embedding tables are gathered row by row and extended with textual-inversion
        // rows; they stay in a float type.
        if ty.is_quantized() && t.name.contains("embedding") {
            ty = DType::F16;
        }
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
