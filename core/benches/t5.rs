//! T5-XXL v1.1's encoder at full size on the CPU: seconds per prompt at the token counts
//! the DiT families encode (77: SD3 as sd.cpp pads it; 256: FLUX schnell and ComfyUI's
//! FLUX; 512: FLUX dev in sd.cpp), with the weights in the types people download.
//! `bench/t5_transformers.py` times transformers' `T5EncoderModel` in bf16 the same way.
//!
//! Env: `SDFLOW_BENCH_TYPES` = "q8_0,bf16" (`q8_0`/`q4_K`: a GGUF, computed quantized;
//! `bf16`/`f16`: safetensors; both in Hugging Face
//! names), `SDFLOW_BENCH_TOKENS` = "77,256", `SDFLOW_BENCH_REPS` = 2,
//! `SDFLOW_BENCH_THREADS` = all cores. The random-weight files are written once under
//! `~/.cache/sdflow/bench/` (the Q8_0 one is shared with `dit_sdcpp`).
//!
//! Run: `cargo bench -p sdflow-core --bench t5`

mod common;

use common::{env_or, median_after_warmup, peak_rss, GIB};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::io::{self, WeightType};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::t5::{self, T5Config, T5Encoder};
use sdflow_core::synth::dit::T5Synth;
use std::path::PathBuf;
use std::time::Instant;

/// The cached full-size T5-XXL encoder in `dtype`.
fn model_file(dtype: DType) -> PathBuf {
    let synth = T5Synth::xxl();
    common::cached_specs(&format!("dit/t5xxl_{}", dtype.to_string().to_lowercase()), &synth.tensors(), &serde_json::to_string(&synth).unwrap(), dtype)
}

fn main() {
    let types: Vec<String> = env_or("SDFLOW_BENCH_TYPES", "q8_0,bf16").split(',').map(|s| s.trim().to_string()).collect();
    let tokens: Vec<usize> = env_or("SDFLOW_BENCH_TOKENS", "77,256").split(',').map(|s| s.trim().parse().expect("SDFLOW_BENCH_TOKENS")).collect();
    let reps: usize = env_or("SDFLOW_BENCH_REPS", "2").parse().expect("reps");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", &sdflow_core::ggml::default_threads().to_string()).parse().expect("threads");
    let backend = Backend::cpu(threads).expect("CPU backend");
    println!("sdflow T5-XXL encoder, {threads} threads, s per prompt (median of {reps} after a warm-up)");
    println!("{:>8} {:>7} {:>8} {:>10}", "weights", "tokens", "s", "RSS GiB");
    for ty in &types {
        let dtype: DType = ty.parse().expect("SDFLOW_BENCH_TYPES");
        let file = model_file(dtype);
        let src = t5::hf_layout(io::open(&file).expect("open")).expect("layout");
        let w = load_weights(&backend, src.as_ref(), &["encoder.", "shared."], &io::TypeRules::new(WeightType::Stored, "").unwrap()).expect("load");
        drop(src);
        let config = T5Config::infer(&w, "").unwrap();
        let enc = T5Encoder::new(&w, "", config.clone()).unwrap();
        for &n in &tokens {
            let ids: Vec<i32> = (0..n).map(|i| (i * 7919 % 32000) as i32 + 3).collect();
            let once = || {
                let size = 64 * config.layers + 256;
                let ctx = Context::new(size, size).unwrap();
                let mut run = GraphRun::new(&ctx);
                let out = enc.forward(&ctx, &mut run, &[ids.clone()], None).unwrap();
                let s = Instant::now();
                run.compute(&backend, &[out], size).unwrap();
                s.elapsed().as_secs_f64()
            };
            let s = median_after_warmup(reps, once);
            println!("{:>8} {:>7} {:>8.2} {:>10.2}", ty, n, s, peak_rss() as f64 / GIB);
        }
    }
}
