//! FLUX.1 at full width (3072, 24 heads of 128, MLP 12288, T5 4096 / CLIP 768) on the CPU,
//! measured block by block: one model file with two double and two single blocks, run at
//! depths (1, 1), (2, 1) and (2, 2), so one double block, one single block and the rest
//! (embeddings, final layer, packing) separate; a whole FLUX.1-dev step (19 + 38 blocks)
//! is then `rest + 19·double + 38·single`. The same weights are run in each type asked.
//! `bench/flux_diffusers.py` measures PyTorch the same way; `bench/flux.sh` runs both.
//!
//! Env: `SDFLOW_BENCH_TYPES` = "auto,q8_0" (weight types: `auto`/`bf16`/`f32` load the bf16
//! file so, `q8_0`/`q4_K` read a GGUF of that type), `SDFLOW_BENCH_SIZES` = "512",
//! `SDFLOW_BENCH_REPS` = 2, `SDFLOW_BENCH_THREADS` = all cores. T5 runs at 256 tokens
//! (ComfyUI's and sd.cpp's FLUX padding).
//!
//! Run: `cargo bench -p sdflow-core --bench flux_blocks`

mod common;

use common::{env_or, peak_rss, GIB};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::Backend;
use sdflow_core::io::{self, WeightType};
use sdflow_core::models::flux::{Flux, FluxConfig, FluxDenoiser, FluxItem};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::synth::dit::FluxSynth;
use std::path::PathBuf;
use std::time::Instant;

/// The cached file of the 2 + 2-block model in `dtype` (bf16 safetensors, or a GGUF).
fn model_file(dtype: DType) -> PathBuf {
    let synth = FluxSynth { depth: 2, depth_single: 2, ..FluxSynth::dev() };
    common::cached_specs(&format!("flux_2x2_{dtype}"), &synth.tensors(), &serde_json::to_string(&synth).unwrap(), dtype)
}

fn main() {
    let types: Vec<String> = env_or("SDFLOW_BENCH_TYPES", "auto,q8_0").split(',').map(|s| s.trim().to_string()).collect();
    let sizes: Vec<i64> = env_or("SDFLOW_BENCH_SIZES", "512").split(',').map(|s| s.trim().parse().expect("size")).collect();
    let reps: usize = env_or("SDFLOW_BENCH_REPS", "2").parse().expect("reps");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", &sdflow_core::ggml::default_threads().to_string()).parse().expect("threads");
    let backend = Backend::cpu(threads).expect("CPU backend");
    println!("sdflow FLUX.1 blocks at full width, {threads} threads, T5 256 tokens, s per forward (median of {reps})");
    println!("{:>8} {:>6} {:>10} {:>10} {:>10} {:>16} {:>10}", "weights", "size", "rest", "double", "single", "dev step (19+38)", "RSS GiB");
    for ty in &types {
        let (file, wtype): (PathBuf, WeightType) = match ty.as_str() {
            "q8_0" => (model_file(DType::Q8_0), WeightType::Stored),
            "q4_K" => (model_file(DType::Q4K), WeightType::Stored),
            other => (model_file(DType::BF16), other.parse().expect("SDFLOW_BENCH_TYPES")),
        };
        let src = io::open(&file).expect("open");
        let w = load_weights(&backend, src.as_ref(), &[""], &io::TypeRules::new(wtype, "").unwrap()).expect("load");
        drop(src);
        let full = FluxConfig::infer(&w, "").unwrap();
        for &size in &sizes {
            let l = size / 8;
            let shape = [l, l, 16, 1];
            let x: Vec<f32> = (0..(l * l * 16) as usize).map(|i| (i * 7919 % 1000) as f32 / 500.0 - 1.0).collect();
            let mut cond = Conditioning::new((0..256 * 4096).map(|i| ((i * 31 % 97) as f32) / 97.0 - 0.5).collect(), 4096, 256).unwrap();
            cond.pooled = Some(vec![0.1; 768]);
            let time = |depth: usize, single: usize| -> f64 {
                let cfg = FluxConfig { depth, depth_single: single, ..full.clone() };
                let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
                let item = [FluxItem { x: &x, cond: &cond, concat: None }];
                den.denoise_batch(&backend, shape, 0.5, &item).unwrap();
                let mut t: Vec<f64> = (0..reps)
                    .map(|_| {
                        let s = Instant::now();
                        den.denoise_batch(&backend, shape, 0.5, &item).unwrap();
                        s.elapsed().as_secs_f64()
                    })
                    .collect();
                t.sort_by(|a, b| a.partial_cmp(b).unwrap());
                t[t.len() / 2]
            };
            let (a, b, c) = (time(1, 1), time(2, 1), time(2, 2));
            let (double, single) = (b - a, c - b);
            let rest = a - double - single;
            println!(
                "{:>8} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>16.1} {:>10.2}",
                ty,
                format!("{size}²"),
                rest,
                double,
                single,
                rest + 19.0 * double + 38.0 * single,
                peak_rss() as f64 / GIB
            );
        }
    }
}
