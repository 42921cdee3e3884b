//! Wan 2.1 T2V 1.3B at full width (1536, 12 heads of 128, FFN 8960, UMT5 4096) on the CPU,
//! measured block by block: one model file with two blocks, run at depths 1 and 2, so one
//! block and the rest (patch embedding, time and text embeddings, head) separate; a whole
//! step of the 30-block model is then `rest + 30·block` per pass (CFG runs two). Videos of
//! 480×832 (a 60×104 latent, 2×2 patches) at 9 and 33 frames (3 and 9 latent frames: 4,680
//! and 14,040 tokens), UMT5 at 512 tokens as Wan's pipelines pad it.
//! `bench/wan_diffusers.py` measures PyTorch the same way; `bench/wan.sh` runs both.
//!
//! Env: `SDFLOW_BENCH_TYPES` = "auto" (`auto`/`bf16`/`f32` load the bf16 file so;
//! quantized types are not offered: GGUF holds at most 4 dimensions and the release's
//! patch kernel has 5), `SDFLOW_BENCH_FRAMES` = "9,33",
//! `SDFLOW_BENCH_SIZE` = "832x480", `SDFLOW_BENCH_REPS` = 1, `SDFLOW_BENCH_THREADS` = all
//! cores.
//!
//! Run: `cargo bench -p sdflow-core --bench wan_blocks`

mod common;

use common::{env_or, peak_rss, GIB};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::Backend;
use sdflow_core::io::{self, WeightType};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::load::load_weights;
use sdflow_core::models::wan::{Wan, WanConfig, WanDenoiser, WanItem};
use sdflow_core::synth::dit::WanSynth;
use std::path::PathBuf;
use std::time::Instant;

/// The cached file of the 2-block model in `dtype` (safetensors).
fn model_file(dtype: DType) -> PathBuf {
    let synth = WanSynth { layers: 2, ..WanSynth::t2v_1_3b() };
    common::cached_specs(&format!("wan_1_3b_2blocks_{dtype}"), &synth.tensors(), &serde_json::to_string(&synth).unwrap(), dtype)
}

fn main() {
    let types: Vec<String> = env_or("SDFLOW_BENCH_TYPES", "auto").split(',').map(|s| s.trim().to_string()).collect();
    let frames: Vec<i64> = env_or("SDFLOW_BENCH_FRAMES", "9,33").split(',').map(|s| s.trim().parse().expect("frames")).collect();
    let size = env_or("SDFLOW_BENCH_SIZE", "832x480");
    let (width, height) = size.split_once('x').map(|(w, h)| (w.parse::<i64>().expect("width"), h.parse::<i64>().expect("height"))).expect("SDFLOW_BENCH_SIZE is WxH");
    let reps: usize = env_or("SDFLOW_BENCH_REPS", "1").parse().expect("reps");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", &sdflow_core::ggml::default_threads().to_string()).parse().expect("threads");
    let backend = Backend::cpu(threads).expect("CPU backend");
    println!("sdflow Wan 2.1 1.3B blocks at full width, {threads} threads, {width}x{height}, UMT5 512 tokens, s per pass (median of {reps})");
    println!("{:>8} {:>7} {:>7} {:>10} {:>10} {:>16} {:>10}", "weights", "frames", "tokens", "rest", "block", "pass (30 blocks)", "RSS GiB");
    for ty in &types {
        let (file, wtype): (PathBuf, WeightType) = (model_file(DType::BF16), ty.parse().expect("SDFLOW_BENCH_TYPES"));
        // The release's 5-D patch kernel shown as the 4-D one ggml convolves with.
        let src = sdflow_core::models::wan::layout(io::open(&file).expect("open")).expect("Wan layout");
        let w = load_weights(&backend, src.as_ref(), &[""], &io::TypeRules::new(wtype, "").unwrap()).expect("load");
        drop(src);
        let full = WanConfig::infer(&w, "").unwrap();
        let cond = Conditioning::new((0..512 * 4096).map(|i| ((i * 31 % 97) as f32) / 97.0 - 0.5).collect(), 4096, 512).unwrap();
        for &f in &frames {
            let t = (f - 1) / 4 + 1;
            let (lw, lh) = (width / 8, height / 8);
            let shape = [lw, lh, 16 * t, 1];
            let x: Vec<f32> = (0..(lw * lh * 16 * t) as usize).map(|i| (i * 7919 % 1000) as f32 / 500.0 - 1.0).collect();
            let time = |layers: usize| -> f64 {
                let cfg = WanConfig { layers, ..full.clone() };
                let mut den = WanDenoiser::new(Wan::new(&w, "", cfg).unwrap());
                den.frames = t as usize;
                let item = [WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }];
                den.denoise_batch(&backend, shape, 0.5, &item).unwrap();
                let mut ts: Vec<f64> = (0..reps)
                    .map(|_| {
                        let s = Instant::now();
                        den.denoise_batch(&backend, shape, 0.5, &item).unwrap();
                        s.elapsed().as_secs_f64()
                    })
                    .collect();
                ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
                ts[ts.len() / 2]
            };
            let (one, two) = (time(1), time(2));
            let block = two - one;
            let rest = one - block;
            let tokens = t * (lw / 2) * (lh / 2);
            println!("{:>8} {:>7} {:>7} {:>10.2} {:>10.2} {:>16.1} {:>10.2}", ty, f, tokens, rest, block, rest + 30.0 * block, peak_rss() as f64 / GIB);
        }
    }
}
