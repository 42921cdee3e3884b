//! SD1.5 or SDXL at full size on the CPU: text encoding, one guided UNet step (cond
//! and uncond in one batch) and VAE decoding, at each size, on the cached random-weight
//! checkpoint. `bench/sd15.sh` runs this beside sd.cpp and diffusers and prints all three.
//!
//! Env: `SDFLOW_BENCH_MODEL` = sd15 | sdxl, `SDFLOW_BENCH_TYPE` = f32 | f16 | bf16 | stored
//! | auto (the weight type, as `sdflow --type` reads it; default auto, what `sdflow` picks
//! on this CPU: bf16 where the bf16 kernels run, else the file's f16),
//! `SDFLOW_BENCH_SIZES` = "256,512", `SDFLOW_BENCH_STEPS` = 4, `SDFLOW_BENCH_THREADS` =
//! all cores.
//!
//! Run: `cargo bench -p sdflow-core --bench sd15`

mod common;

use common::{env_or, checkpoint_of, peak_rss, rss, GIB};
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::io::{self, WeightType};
use sdflow_core::models::clip::{ClipLayout, ClipTextConfig, ClipTextModel};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::sd::{encode_prompt, encode_prompt_sdxl, SdDenoiser};
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::models::sd::unet::{Unet, UnetConfig};
use sdflow_core::models::vae::{Vae, VaeConfig};
use sdflow_core::sampling::schedule::{DiscreteSchedule, ScheduleOpts, Scheduler};
use sdflow_core::synth::SdConfig;
use sdflow_core::text::{tokenize_weighted, ChunkOptions, ClipTokenizer, PadToken};
use std::time::Instant;

fn main() {
    // What `sdflow` loads by default on this CPU unless the environment names a type.
    let wtype: WeightType = env_or("SDFLOW_BENCH_TYPE", "auto").parse().expect("SDFLOW_BENCH_TYPE");
    let sizes: Vec<i64> = env_or("SDFLOW_BENCH_SIZES", "256,512").split(',').map(|s| s.trim().parse().expect("size")).collect();
    let steps: usize = env_or("SDFLOW_BENCH_STEPS", "4").parse().expect("steps");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", &sdflow_core::ggml::default_threads().to_string()).parse().expect("threads");
    let xl = match env_or("SDFLOW_BENCH_MODEL", "sd15").as_str() {
        "sd15" => false,
        "sdxl" => true,
        other => panic!("SDFLOW_BENCH_MODEL {other}: sd15 or sdxl"),
    };
    let (name, path, latent_scale) = if xl { ("SDXL", checkpoint_of("sdxl", &SdConfig::sdxl()), 0.13025) } else { ("SD1.5", checkpoint_of("sd15", &SdConfig::sd15()), 0.18215) };
    let backend = Backend::cpu(threads).expect("CPU backend");

    let t = Instant::now();
    let src = io::open(&path).expect("open");
    let rules = io::TypeRules::new(wtype, "").expect("type rules");
    let unet_w = load_weights(&backend, src.as_ref(), &["model.diffusion_model."], &rules).expect("unet");
    let vae_w = load_weights(&backend, src.as_ref(), &["first_stage_model."], &rules).expect("vae");
    let clip_w = load_weights(&backend, src.as_ref(), &["cond_stage_model.", "conditioner."], &rules).expect("clip");
    let load_s = t.elapsed().as_secs_f64();
    // The weights are copied into backend buffers; the mapped file's pages would count
    // toward the resident set for as long as the map lives, as they would not in a run.
    drop(src);
    let clip_model = |prefix: &str, layout| ClipTextModel::new(&clip_w, prefix, ClipTextConfig::infer(&clip_w, prefix, layout).unwrap()).unwrap();
    let vae = Vae::new(&vae_w, "first_stage_model", VaeConfig::infer(&vae_w, "first_stage_model").unwrap()).unwrap();

    let t = Instant::now();
    let encode = |text: &str| {
        let tokens = |pad| tokenize_weighted(text, &ClipTokenizer::new(pad), None, &ChunkOptions::default()).unwrap();
        if xl {
            let l = clip_model("conditioner.embedders.0.transformer.text_model", ClipLayout::HuggingFace);
            let g = clip_model("conditioner.embedders.1.model", ClipLayout::OpenClip);
            encode_prompt_sdxl(&backend, (&l, &tokens(PadToken::EndOfText)), (&g, &tokens(PadToken::Zero)), 2).unwrap()
        } else {
            encode_prompt(&backend, &clip_model("cond_stage_model.transformer.text_model", ClipLayout::HuggingFace), &tokens(PadToken::EndOfText), 1).unwrap()
        }
    };
    let cond = encode("a photograph of an astronaut riding a horse, (highly detailed:1.2)");
    let uncond = encode("blurry, low quality");
    let text_s = t.elapsed().as_secs_f64() / 2.0;

    let weights = match wtype {
        WeightType::Stored => "as stored".to_string(),
        WeightType::All(t) | WeightType::Floats(t) => t.to_string(),
    };
    println!("sdflow {name}, weights {weights}, {threads} threads, load {load_s:.1} s, text encode {text_s:.2} s per prompt, resident after load {:.2} GiB", rss()[0] as f64 / GIB);
    println!("{:>6} {:>12} {:>14} {:>14}", "size", "s/step", "VAE decode s", "peak RSS GiB");
    for &size in &sizes {
        // One sampler's denoiser per size, dropped before the VAE decode, as a sampler node
        // does: its compute buffer is then not resident beside the VAE's.
        let unet = Unet::new(&unet_w, "model.diffusion_model", UnetConfig::infer(&unet_w, "model.diffusion_model").unwrap()).unwrap();
        let mut den = SdDenoiser::new(unet, DiscreteSchedule::sd(), Prediction::Epsilon);
        let l = size / 8;
        let shape = [l, l, 4, 1];
        let sigmas = Scheduler::Discrete.sigmas(steps, &DiscreteSchedule::sd(), &ScheduleOpts::default()).unwrap();
        let mut x: Vec<f32> = (0..(l * l * 4) as usize).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * sigmas[0]).collect();
        // The first step also sizes the compute buffer; time the steady state after it.
        let d = den.denoise(&backend, &x, shape, sigmas[0], &cond, Some(&uncond), 7.0).unwrap();
        x = d.denoised;
        let t = Instant::now();
        for &s in &sigmas[1..steps] {
            x = den.denoise(&backend, &x, shape, s, &cond, Some(&uncond), 7.0).unwrap().denoised;
        }
        let step_s = t.elapsed().as_secs_f64() / (steps - 1).max(1) as f64;
        drop(den);
        eprintln!("{size}²: peak RSS up to the end of sampling {:.2} GiB", peak_rss() as f64 / GIB);
        let t = Instant::now();
        let ctx = Context::new(8192, 8192).unwrap();
        let mut run = GraphRun::new(&ctx);
        let z = run.input_f32(&[l, l, 4, 1], x.iter().map(|v| v / latent_scale).collect()).unwrap();
        let img = vae.decode(&ctx, z).unwrap();
        let out = run.compute(&backend, &[img], 8192).unwrap();
        let vae_s = t.elapsed().as_secs_f64();
        assert!(out[0].iter().all(|v| v.is_finite()));
        println!("{:>6} {:>12.2} {:>14.2} {:>14.2}", format!("{size}²"), step_s, vae_s, peak_rss() as f64 / GIB);
    }
}
