//! Helpers shared by the model parity tests.
#![allow(dead_code)]

use sdflow_core::ggml::{Backend, GType};
use sdflow_core::models::{WeightSpec, Weights};

pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/models");

/// Every tensor of an f32 safetensors fixture as ggml weights.
pub fn load_f32(file: &str, backend: &Backend) -> Weights {
    let bytes = std::fs::read(format!("{DIR}/{file}")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let specs: Vec<WeightSpec> = st
        .tensors()
        .iter()
        .map(|(name, v)| WeightSpec { name: name.clone(), ty: GType::F32, ne: v.shape().iter().rev().map(|&d| d as i64).collect() })
        .collect();
    Weights::new(backend, &specs, |s| Ok(st.tensor(&s.name).unwrap().data().to_vec())).unwrap()
}

pub fn reference(file: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/{file}")).unwrap()).unwrap()
}

pub fn max_abs_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}
