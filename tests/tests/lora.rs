//! LoRAs end to end: `workflows/lora.json` (sd-cli's `<lora:ink:0.8>` tag as a LoraLoader)
//! on a tiny SD1 checkpoint with a random kohya LoRA over all its UNet and text-encoder
//! layers. The LoRA changes the image, strength 0 is exactly no LoRA, other strengths
//! reuse the checkpoint already loaded, and broken files fail the run naming the file.
//! `apply_mode` at_runtime draws what immediately draws without copying the weights, and
//! auto picks it for quantized weights.

use std::sync::Mutex;
use sdflow_core::dtype::DType;
use sdflow_core::io;
use sdflow_core::lora::synth::write_random_lora;
use sdflow_core::residency::ResidencyManager;
use sdflow_core::synth::Format;
use sdflow_executor::{CancelToken, ErrorKind, InputValue, NodeSpec, NullSink, RunOptions, Workflow};
use sdflow_tests::{tiny_tree, TestEnv};
use serde_json::json;
use std::sync::Arc;

/// The test tree plus `models/loras/` with `ink.safetensors`, the same LoRA as
/// `ink.gguf`, and a `garbage.safetensors`; also returns the runtime's residency manager.
fn env(weight_type: Option<DType>) -> (TestEnv, ResidencyManager) {
    let dir = tempfile::tempdir().unwrap();
    tiny_tree(dir.path());
    let loras = dir.path().join("models/loras");
    std::fs::create_dir_all(&loras).unwrap();
    let ckpt = io::open(&dir.path().join("models/checkpoints/model.safetensors")).unwrap();
    let n = write_random_lora(ckpt.as_ref(), &loras.join("ink.safetensors"), 4, 0.3, 5, Format::Safetensors).unwrap();
    assert!(n > 40, "{n} modules");
    write_random_lora(ckpt.as_ref(), &loras.join("ink.gguf"), 4, 0.3, 5, Format::Gguf).unwrap();
    std::fs::write(loras.join("garbage.safetensors"), b"\x20\x00\x00\x00\x00\x00\x00\x00{\"not\": \"a tensor header\"").unwrap();
    let rm = Arc::new(Mutex::new(None));
    let keep = rm.clone();
    let env = TestEnv::with_dir(dir, move |mut rt| {
        rt.weight_type = weight_type.into();
        *keep.lock().unwrap() = Some(rt.residency.clone());
        rt
    });
    let rm = rm.lock().unwrap().take().unwrap();
    (env, rm)
}

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

fn lora_wf(env: &TestEnv) -> Workflow {
    env.workflow("lora.json", 64, 2)
}

/// `wf` with the LoraLoader bypassed: the plain txt2img graph.
fn without_lora(wf: &Workflow) -> Workflow {
    let mut wf = wf.clone();
    wf.set_input("2", "clip", InputValue::link("1", 1)).unwrap();
    wf.set_input("3", "clip", InputValue::link("1", 1)).unwrap();
    wf.set_input("5", "model", InputValue::link("1", 0)).unwrap();
    wf.nodes.remove("8");
    wf
}

fn strengths(wf: &Workflow, model: f64, clip: f64) -> Workflow {
    let mut wf = wf.clone();
    wf.set_input("8", "strength_model", c(json!(model))).unwrap();
    wf.set_input("8", "strength_clip", c(json!(clip))).unwrap();
    wf
}

#[test]
fn the_lora_changes_the_image_and_strength_zero_is_no_lora() {
    let (env, _) = env(None);
    let wf = lora_wf(&env);
    let (w, h, with) = env.run_saved(&wf, "7");
    assert_eq!((w, h), (64, 64));
    let (_, _, plain) = env.run_saved(&without_lora(&wf), "7");
    assert_ne!(with, plain, "the LoRA changes the image");
    assert_eq!(env.run_saved(&strengths(&wf, 0.0, 0.0), "7").2, plain, "strength 0 is exactly no LoRA");
    // Each half on its own changes the image too: both the UNet and CLIP were patched.
    let unet_only = env.run_saved(&strengths(&wf, 0.8, 0.0), "7").2;
    let clip_only = env.run_saved(&strengths(&wf, 0.0, 0.8), "7").2;
    assert_ne!(unet_only, plain);
    assert_ne!(clip_only, plain);
    assert_ne!(unet_only, with);

    // LoraLoaderModelOnly is LoraLoader with strength_clip 0.
    let mut mo = without_lora(&wf);
    mo.nodes.insert("9".into(), NodeSpec::new("LoraLoaderModelOnly").with_input("model", InputValue::link("1", 0)).with_input("lora_name", c(json!("ink.safetensors"))).with_input("strength_model", c(json!(0.8))));
    mo.set_input("5", "model", InputValue::link("9", 0)).unwrap();
    assert_eq!(env.run_saved(&mo, "7").2, unet_only);

    // The same LoRA in a GGUF file gives the same image.
    let mut gguf = wf.clone();
    gguf.set_input("8", "lora_name", c(json!("ink.gguf"))).unwrap();
    assert_eq!(env.run_saved(&gguf, "7").2, with, "GGUF LoRA = safetensors LoRA");
}

#[test]
fn another_strength_reuses_the_loaded_checkpoint() {
    let (env, rm) = env(None);
    let wf = lora_wf(&env);
    let first = env.run_saved(&wf, "7").2;
    let half = env.run_saved(&strengths(&wf, 0.5, 0.5), "7").2;
    assert_ne!(first, half, "the strength matters");
    assert_eq!(env.run_saved(&wf, "7").2, first, "back to 0.8: the same image");

    let stats = rm.stats();
    let (base, merged): (Vec<_>, Vec<_>) = stats.models.iter().partition(|m| !m.key.prefix.contains("+lora"));
    for m in &base {
        assert_eq!(m.loads, 1, "{} loaded once for every strength: {m:?}", m.name);
    }
    let unet = base.iter().find(|m| m.key.prefix == "model.diffusion_model.").unwrap();
    eprintln!("checkpoint UNet: {} bytes, loaded in {:.1} ms", unet.bytes, unet.last_load_ms.unwrap_or(0.0));
    // One merged view per (side, strength): 0.8 and 0.5 for the UNet and for CLIP.
    assert_eq!(merged.len(), 4, "{merged:#?}");
    for m in &merged {
        assert_eq!(m.loads, 1, "{}: merged once: {m:?}", m.key.prefix);
        eprintln!("{}: {} bytes, merged in {:.1} ms", m.key.prefix, m.bytes, m.last_load_ms.unwrap_or(0.0));
        if m.key.prefix.starts_with("model.diffusion_model.") {
            assert!(m.bytes < unet.bytes, "the merged UNet holds only the patched tensors ({} of {} bytes)", m.bytes, unet.bytes);
        }
    }
    assert!(merged.iter().any(|m| m.key.prefix.ends_with("@0.8") && m.hits >= 1), "the third run found the 0.8 merge resident: {merged:#?}");
}

#[test]
fn quantized_weights_take_the_lora_too() {
    let (env, _) = env(Some(DType::Q8_0));
    let wf = lora_wf(&env);
    let with = env.run_saved(&wf, "7").2;
    assert_ne!(with, env.run_saved(&without_lora(&wf), "7").2);
}

fn mode(wf: &Workflow, mode: &str) -> Workflow {
    let mut wf = wf.clone();
    wf.set_input("8", "apply_mode", c(json!(mode))).unwrap();
    wf
}

/// The largest difference of two images of the same size, in 8-bit levels.
fn max_level_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0)
}

/// The resident LoRA entry of the UNet in `mode`, and the checkpoint's UNet.
fn unet_entries(rm: &ResidencyManager, mode: &str) -> (u64, u64) {
    let stats = rm.stats();
    let unet = stats.models.iter().find(|m| m.key.prefix == "model.diffusion_model.").unwrap();
    let lora = stats.models.iter().find(|m| m.key.prefix.starts_with(&format!("model.diffusion_model.+lora:{mode}@"))).unwrap_or_else(|| panic!("no {mode} entry in {:#?}", stats.models));
    (lora.bytes, unet.bytes)
}

#[test]
fn at_runtime_draws_what_immediately_draws_without_copying_weights() {
    let (env, rm) = env(None);
    let wf = lora_wf(&env);
    let merged = env.run_saved(&mode(&wf, "immediately"), "7").2;
    let runtime = env.run_saved(&mode(&wf, "at_runtime"), "7").2;
    let plain = env.run_saved(&without_lora(&wf), "7").2;
    let d = max_level_diff(&runtime, &merged);
    let effect = max_level_diff(&plain, &merged);
    eprintln!("at_runtime vs immediately: {d} levels; the LoRA itself: {effect} levels");
    assert!(d <= 2, "at_runtime is {d} levels off immediately");
    assert!(effect > 10 * d.max(1), "the LoRA's effect ({effect}) dwarfs the difference ({d})");
    // auto on f32 weights is immediately.
    assert_eq!(env.run_saved(&wf, "7").2, merged, "the workflow's default (auto) merges f32 weights");

    let (runtime_bytes, unet) = unet_entries(&rm, "at_runtime");
    let (merged_bytes, _) = unet_entries(&rm, "immediately");
    eprintln!("UNet {unet} bytes; at_runtime entry {runtime_bytes}; immediately entry {merged_bytes}");
    assert!(runtime_bytes * 3 < unet && runtime_bytes * 3 < merged_bytes, "the runtime entry holds only the rank-4 factors");
}

#[test]
fn auto_runs_a_lora_on_quantized_weights_at_runtime() {
    let (env, rm) = env(Some(DType::Q8_0));
    let wf = lora_wf(&env);
    let auto = env.run_saved(&wf, "7").2;
    assert_eq!(env.run_saved(&mode(&wf, "at_runtime"), "7").2, auto, "auto = at_runtime on q8_0 weights");
    let (auto_bytes, unet) = unet_entries(&rm, "auto");
    assert!(auto_bytes * 3 < unet, "auto copied no quantized weight ({auto_bytes} of {unet} bytes)");
    let merged = env.run_saved(&mode(&wf, "immediately"), "7").2;
    let (merged_bytes, _) = unet_entries(&rm, "immediately");
    assert!(merged_bytes > auto_bytes, "immediately re-quantized copies ({merged_bytes} bytes, auto {auto_bytes})");
    let plain = env.run_saved(&without_lora(&wf), "7").2;
    let d = max_level_diff(&auto, &merged);
    eprintln!("q8_0: auto vs immediately: {d} levels; the LoRA itself: {} levels", max_level_diff(&plain, &merged));
    assert!(max_level_diff(&plain, &merged) > 2 * d.max(1), "both apply the same LoRA");
}

#[test]
fn an_unknown_apply_mode_is_refused() {
    let (env, _) = env(None);
    let report = env.exec.validate(&mode(&lora_wf(&env), "later")).unwrap_err();
    assert!(report.has("8", ErrorKind::ValueNotInList), "{report:?}");
    // lora.json, like a ComfyUI workflow, has no apply_mode: optional, auto.
    env.exec.validate(&lora_wf(&env)).unwrap();
}

#[test]
fn lcm_sampling_runs_with_a_lora() {
    let (env, _) = env(None);
    let mut wf = lora_wf(&env);
    wf.set_input("5", "sampler_name", c(json!("lcm"))).unwrap();
    wf.set_input("5", "scheduler", c(json!("sgm_uniform"))).unwrap();
    wf.set_input("5", "cfg", c(json!(1.0))).unwrap();
    wf.set_input("5", "steps", c(json!(4))).unwrap();
    let with = env.run_saved(&wf, "7").2;
    assert_ne!(with, env.run_saved(&without_lora(&wf), "7").2);
}

#[test]
fn a_broken_lora_file_fails_the_run_naming_it() {
    let (env, _) = env(None);
    let mut wf = lora_wf(&env);
    wf.set_input("8", "lora_name", c(json!("garbage.safetensors"))).unwrap();
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let err = env.exec.run(&wf, &NullSink, &CancelToken::new(), &opts).unwrap_err().to_string();
    assert!(err.contains("LoraLoader") && err.contains("garbage.safetensors"), "{err}");
    // A checkpoint picked as a LoRA: readable, but no LoRA tensors.
    std::fs::copy(env.dir.path().join("models/checkpoints/model.safetensors"), env.dir.path().join("models/loras/ink.safetensors")).unwrap();
    let err = env.exec.run(&lora_wf(&env), &NullSink, &CancelToken::new(), &opts).unwrap_err().to_string();
    assert!(err.contains("no LoRA tensors"), "{err}");
}
