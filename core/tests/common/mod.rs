//! Helpers shared by the model parity tests.
#![allow(dead_code)]

use sdflow_core::dtype::DType;
use sdflow_core::ggml::Backend;
use sdflow_core::models::Weights;
use std::collections::BTreeMap;

pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/models");

fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3))
}

fn splitmix64(x: u64) -> u64 {
    let x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn is_norm_weight(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    let module = if parts.len() > 1 { parts[parts.len() - 2] } else { "" };
    if name.ends_with(".scale") {
        // RMS norms that call their weight `scale` (FLUX's q/k norms).
        return module.contains("norm");
    }
    if !name.ends_with(".weight") {
        return false;
    }
    if module.starts_with("ln_") || module.contains("norm") {
        return true;
    }
    // Python slices parts[-3:-1], which is shorter for two-part names.
    let pair = parts[parts.len().saturating_sub(3)..parts.len() - 1].join(".");
    matches!(pair.as_str(), "in_layers.0" | "out_layers.0" | "out.0")
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The backend a parity test computes on: the CPU with `threads` threads, or with
/// `SDFLOW_TEST_BACKEND=gpu` the first GPU device of a `cuda` or `vulkan` build (CI runs
/// the parity tests on Mesa's software Vulkan device this way), so every model graph is
/// shown to run on a non-CPU ggml backend with the same tolerances.
pub fn backend(threads: usize) -> Backend {
    match std::env::var("SDFLOW_TEST_BACKEND").as_deref() {
        Ok("gpu") => Backend::gpu(0).unwrap_or_else(|e| panic!("SDFLOW_TEST_BACKEND=gpu: {e}")),
        Ok("cpu") | Err(_) => Backend::cpu(threads).unwrap(),
        Ok(other) => panic!("SDFLOW_TEST_BACKEND={other}: expected cpu or gpu"),
    }
}

/// The deterministic weights of tests/fixtures/models/detweights.py, bit for bit.
pub fn det_values(name: &str, n: usize, scale: f64) -> Vec<f32> {
    let h = fnv1a64(name);
    let norm = is_norm_weight(name);
    (0..n as u64)
        .map(|i| {
            let u = (splitmix64(h ^ i) >> 11) as f64 * 2f64.powi(-53) * 2.0 - 1.0;
            (if norm { 1.0 + 0.1 * u } else { scale * u }) as f32
        })
        .collect()
}

/// A fixture model: every tensor of `keys` (name → PyTorch shape) with its deterministic
/// values, written as an f32 safetensors file and loaded through the real loader.
pub fn det_weights(keys: &serde_json::Value, scale: f64, backend: &Backend) -> Weights {
    det_weights_with(keys, scale, backend, &[])
}

/// [`det_weights`] with some tensors given outright (a fixed table the file stores).
pub fn det_weights_with(keys: &serde_json::Value, scale: f64, backend: &Backend, given: &[(&str, Vec<f32>)]) -> Weights {
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys.clone()).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .map(|(name, shape)| {
            let v = match given.iter().find(|(n, _)| n == name) {
                Some((_, v)) => v.clone(),
                None => det_values(name, shape.iter().product(), scale),
            };
            assert_eq!(v.len(), shape.iter().product::<usize>(), "{name}");
            (name.clone(), shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    sdflow_core::io::safetensors::write(&path, data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let src = sdflow_core::io::open(&path).unwrap();
    sdflow_core::models::load::load_weights(backend, src.as_ref(), &[""], &sdflow_core::io::TypeRules::none()).unwrap()
}

pub fn reference(file: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/{file}")).unwrap()).unwrap()
}

pub fn keys(file: &str) -> serde_json::Value {
    reference(file)
}

pub fn max_abs_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// A diffusers-named file at `path` made from single-file tensors as diffusers' converter
/// places them (`map_file`: {diffusers name: [[single-file name, first row, rows], ...]},
/// from make_dit_diffusers_maps.py), under `prefix`: each tensor's values from `values`
/// by single-file name, `keys` giving the shapes. Returns the (name, shape, f32 bytes)
/// written.
#[allow(dead_code)]
pub fn write_diffusers_file(path: &std::path::Path, map_file: &str, prefix: &str, keys: &BTreeMap<String, Vec<usize>>, values: &dyn Fn(&str) -> Vec<f32>) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let map: BTreeMap<String, Vec<(String, usize, usize)>> = serde_json::from_value(reference(map_file)).unwrap();
    let mut tensors = Vec::new();
    for (name, parts) in &map {
        let (mut data, mut rows, mut rest) = (Vec::<f32>::new(), 0, Vec::new());
        for (src, first, n) in parts {
            let shape = &keys[src];
            let per: usize = shape[1..].iter().product();
            data.extend_from_slice(&values(src)[first * per..(first + n) * per]);
            rows += n;
            rest = shape[1..].to_vec();
        }
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((format!("{prefix}{name}"), [vec![rows], rest].concat(), bytes));
    }
    sdflow_core::io::safetensors::write(path, tensors.iter().map(|(n, s, b)| (n.as_str(), sdflow_core::dtype::DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    tensors
}
