//! Matrix products at the UNet's shapes, per weight type: which type the CPU multiplies
//! fastest decides the default compute type (f32, f16 or bf16 weights; activations are
//! f32 and are converted by ggml to the weight's dot type).
//!
//! Env: `SDFLOW_BENCH_THREADS` (all cores by default), `SDFLOW_BENCH_REPS` (4),
//! `SDFLOW_BENCH_FILTER` (run only the cases whose name contains it). CPU time is
//! printed beside wall time: with one thread it stays meaningful on a busy machine.
//! bf16 weights run on AMX tiles where the CPU has them (`SDFLOW_AMX=0`: not).
//! Run: `cargo bench -p sdflow-core --bench gemm`

mod common;

use common::cpu_seconds;
use sdflow_core::ggml::{Backend, Context, GType, GraphRun};
use std::time::Instant;

fn main() {
    let threads: usize = std::env::var("SDFLOW_BENCH_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or_else(sdflow_core::ggml::default_threads);
    let reps: usize = std::env::var("SDFLOW_BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let filter = std::env::var("SDFLOW_BENCH_FILTER").unwrap_or_default();
    let wanted = |name: &str| name.contains(filter.as_str());
    let backend = Backend::cpu(threads).expect("CPU backend");
    // (K, M, N): a 3×3 conv at 64² latents with CFG (K = 9·320), a 1×1 projection, the
    // attention feed-forward at 32² latents.
    let shapes: [(i64, i64, i64, &str); 4] = [(2048, 2048, 2048, "square 2048"), (2880, 320, 8192, "conv3x3 320ch 64²×2"), (320, 320, 8192, "proj 320 64²×2"), (640, 5120, 2048, "ff 640→5120 32²×2")];
    println!("{threads} threads, {reps} products per graph");
    println!("{:<22} {:>6} {:>10} {:>10} {:>14}", "shape", "type", "ms", "GFLOP/s", "GFLOP/cpu-s");
    for &(k, m, n, name) in shapes.iter().filter(|s| wanted(s.3)) {
        for (ty, tname) in [(GType::F32, "f32"), (GType::F16, "f16"), (GType::BF16, "bf16"), (GType::Q8_0, "q8_0")] {
            let ctx = Context::new(64, 256).unwrap();
            let mut run = GraphRun::new(&ctx);
            let w = run.input_f32(&[k, m], (0..k * m).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.05).collect()).unwrap();
            let x = run.input_f32(&[k, n], (0..k * n).map(|i| (i * 104729 % 1000) as f32 / 500.0 - 1.0).collect()).unwrap();
            let wt = if ty == GType::F32 { w } else { ctx.cast(w, ty).unwrap() };
            let outs: Vec<_> = (0..reps).map(|r| {
                // Distinct inputs per product so nothing is shared between them.
                let xr = ctx.scale(x, 1.0 + r as f32 * 1e-3).unwrap();
                ctx.mul_mat(wt, xr).unwrap()
            }).collect();
            let sum = outs.iter().skip(1).fold(outs[0], |a, &b| ctx.add(a, b).unwrap());
            let (t, c) = (Instant::now(), cpu_seconds());
            let out = run.compute(&backend, &[sum], 256).unwrap();
            let (s, cs) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
            assert!(out[0].iter().all(|v| v.is_finite()));
            let flop = 2.0 * (k * m * n) as f64 * reps as f64;
            println!("{:<22} {:>6} {:>10.1} {:>10.1} {:>14.1}", name, tname, s * 1e3, flop / s / 1e9, flop / cs / 1e9);
        }
    }
    // Whole 3×3 convolutions (padding 1), as the UNet and VAE run them.
    let convs: [(i64, i64, i64, i64, &str); 3] = [(64, 320, 320, 2, "conv 320→320 64²×2"), (32, 1280, 1280, 2, "conv 1280 32²×2"), (256, 128, 128, 1, "conv 128 256² (VAE)")];
    for &(side, cin, cout, n, name) in convs.iter().filter(|c| wanted(c.4)) {
        for (ty, tname) in [(GType::F32, "f32"), (GType::F16, "f16"), (GType::BF16, "bf16")] {
            let ctx = Context::new(64, 256).unwrap();
            let mut run = GraphRun::new(&ctx);
            let w = run.input_f32(&[3, 3, cin, cout], (0..9 * cin * cout).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.05).collect()).unwrap();
            let x = run.input_f32(&[side, side, cin, n], (0..side * side * cin * n).map(|i| (i * 104729 % 1000) as f32 / 500.0 - 1.0).collect()).unwrap();
            let wt = if ty == GType::F32 { w } else { ctx.cast(w, ty).unwrap() };
            let outs: Vec<_> = (0..reps).map(|r| ctx.conv_2d(wt, ctx.scale(x, 1.0 + r as f32 * 1e-3).unwrap(), (1, 1), (1, 1), (1, 1)).unwrap()).collect();
            let sum = outs.iter().skip(1).fold(outs[0], |a, &b| ctx.add(a, b).unwrap());
            let (t, c) = (Instant::now(), cpu_seconds());
            let out = run.compute(&backend, &[sum], 256).unwrap();
            let (s, cs) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
            assert!(out[0].iter().all(|v| v.is_finite()));
            let flop = 2.0 * (9 * cin * cout * side * side * n) as f64 * reps as f64;
            println!("{:<22} {:>6} {:>10.1} {:>10.1} {:>14.1}", name, tname, s * 1e3, flop / s / 1e9, flop / cs / 1e9);
        }
    }
    // Self-attention as the UNet runs it: q, k, v [320, T, 2] with 8 heads (SD1.5's first
    // level at 512² and 256² latents); 4·B·H·T²·dh FLOP for the two products.
    let attn: [(i64, i64, &str); 2] = [(4096, 320, "attention 4096 tokens dh 40"), (1024, 640, "attention 1024 tokens dh 80")];
    for &(t, d, name) in attn.iter().filter(|a| wanted(a.2)) {
        let ctx = Context::new(64, 256).unwrap();
        let mut run = GraphRun::new(&ctx);
        let mk = |seed: i64| (0..d * t * 2).map(|i| ((i + seed) * 7919 % 1000) as f32 / 500.0 - 1.0).collect::<Vec<f32>>();
        let (q, k, v) = (run.input_f32(&[d, t, 2], mk(1)).unwrap(), run.input_f32(&[d, t, 2], mk(2)).unwrap(), run.input_f32(&[d, t, 2], mk(3)).unwrap());
        let outs: Vec<_> = (0..reps).map(|r| sdflow_core::models::nn::attention(&ctx, ctx.scale(q, 1.0 + r as f32 * 1e-3).unwrap(), k, v, 8, None).unwrap()).collect();
        let sum = outs.iter().skip(1).fold(outs[0], |a, &b| ctx.add(a, b).unwrap());
        let (ts, c) = (Instant::now(), cpu_seconds());
        let out = run.compute(&backend, &[sum], 256).unwrap();
        let (s, cs) = (ts.elapsed().as_secs_f64(), cpu_seconds() - c);
        assert!(out[0].iter().all(|v| v.is_finite()));
        let flop = 4.0 * 2.0 * (t * t * d) as f64 * reps as f64;
        println!("{:<22} {:>6} {:>10.1} {:>10.1} {:>14.1}", name, "f32", s * 1e3, flop / s / 1e9, flop / cs / 1e9);
    }
}
