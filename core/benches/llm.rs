//! Qwen3-4B as a text encoder at full size on the CPU (Z-Image's and FLUX.2 klein 4B's):
//! seconds per prompt at the token counts those families encode (a short Z-Image prompt in
//! its template, ~32 tokens; FLUX.2 klein's 512-token padding), all 36 layers run, with
//! the weights in the types people download, and the process's peak RSS.
//! `bench/llm_transformers.py` times transformers' `Qwen3Model` the same way.
//!
//! Env: `SDFLOW_BENCH_TYPES` = "q8_0,bf16" (`q8_0`: a GGUF, computed quantized; `bf16`:
//! safetensors; Hugging Face names), `SDFLOW_BENCH_TOKENS` = "32,512",
//! `SDFLOW_BENCH_REPS` = 2, `SDFLOW_BENCH_THREADS` = all cores. The random-weight files
//! are written once under `~/.cache/sdflow/bench/` (8 GiB in bf16).
//!
//! Run: `cargo bench -p sdflow-core --bench llm`

mod common;

use common::{env_or, median_after_warmup, peak_rss, GIB};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::io::{self, WeightType};
use sdflow_core::models::llm::{self, LlmConfig, LlmEncoder};
use sdflow_core::models::load::load_weights;
use sdflow_core::synth::dit::LlmSynth;
use std::path::PathBuf;
use std::time::Instant;

/// The cached full-size Qwen3-4B in `dtype`.
fn model_file(dtype: DType) -> PathBuf {
    let synth = LlmSynth::qwen3_4b();
    common::cached_specs(&format!("llm/qwen3_4b_{}", dtype.to_string().to_lowercase()), &synth.tensors(), &serde_json::to_string(&synth).unwrap(), dtype)
}

fn main() {
    let types: Vec<String> = env_or("SDFLOW_BENCH_TYPES", "q8_0,bf16").split(',').map(|s| s.trim().to_string()).collect();
    let tokens: Vec<usize> = env_or("SDFLOW_BENCH_TOKENS", "32,512").split(',').map(|s| s.trim().parse().expect("SDFLOW_BENCH_TOKENS")).collect();
    let reps: usize = env_or("SDFLOW_BENCH_REPS", "2").parse().expect("reps");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", &sdflow_core::ggml::default_threads().to_string()).parse().expect("threads");
    let backend = Backend::cpu(threads).expect("CPU backend");
    println!("sdflow Qwen3-4B encoder (36 layers, final state), {threads} threads, s per prompt (median of {reps} after a warm-up)");
    println!("{:>8} {:>7} {:>8} {:>10}", "weights", "tokens", "s", "RSS GiB");
    for ty in &types {
        let dtype: DType = ty.parse().expect("SDFLOW_BENCH_TYPES");
        let file = model_file(dtype);
        let src = llm::hf_layout(io::open(&file).expect("open")).expect("layout");
        let w = load_weights(&backend, src.as_ref(), &["model."], &io::TypeRules::new(WeightType::Stored, "").unwrap()).expect("load");
        drop(src);
        let config = LlmConfig::infer(&w, "model.", None).unwrap();
        let enc = LlmEncoder::new(&w, "model.", config.clone()).unwrap();
        for &n in &tokens {
            let ids: Vec<i32> = (0..n).map(|i| (i * 7919 % 150_000) as i32).collect();
            let once = || {
                let size = 64 * config.layers + 256;
                let ctx = Context::new(size, size).unwrap();
                let mut run = GraphRun::new(&ctx);
                let out = enc.forward(&ctx, &mut run, &[ids.clone()], None, &[config.layers + 1]).unwrap();
                let s = Instant::now();
                run.compute(&backend, &[out], size).unwrap();
                s.elapsed().as_secs_f64()
            };
            let s = median_after_warmup(reps, once);
            println!("{:>8} {:>7} {:>8.2} {:>10.2}", ty, n, s, peak_rss() as f64 / GIB);
        }
    }
}
