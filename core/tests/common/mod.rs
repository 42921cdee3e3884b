//! Helpers shared by the model parity tests.
#![allow(dead_code)]

use sdflow_core::ggml::Backend;
use sdflow_core::models::Weights;

pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/models");

/// Every tensor of an f32 safetensors fixture as ggml weights, through the real loader.
pub fn load_f32(file: &str, backend: &Backend) -> Weights {
    let src = sdflow_core::io::open(std::path::Path::new(&format!("{DIR}/{file}"))).unwrap();
    sdflow_core::models::load::load_weights(backend, src.as_ref(), &[""], &sdflow_core::io::TypeRules::none()).unwrap()
}

pub fn reference(file: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/{file}")).unwrap()).unwrap()
}

pub fn max_abs_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}
