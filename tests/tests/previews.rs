//! Sampling previews (the runtime's `--preview-method`) and the noise generator choice
//! (`--rng`), on txt2img with a tiny random-weight SD1 checkpoint.

use sdflow_core::dtype::DType;
use sdflow_core::sampling::RngKind;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{stub, CancelToken, Event, Executor, ExecutorConfig, InputValue, NullSink, PreviewFormat, Registry, RunOptions, Workflow};
use sdflow_nodes::sampling::preview::PreviewMethod;
use sdflow_nodes::Runtime;
use std::sync::Arc;

const STEPS: i64 = 3;

struct Env {
    dir: tempfile::TempDir,
    exec: Executor,
}

fn env(configure: impl FnOnce(Runtime) -> Runtime, taesd: bool) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    if taesd {
        let approx = dir.path().join("models/vae_approx");
        std::fs::create_dir_all(&approx).unwrap();
        sdflow_tests::write_taesd(&approx, false);
    }
    let rt = configure(Runtime::new(dir.path().join("models"), dir.path().join("output"), 2, None).unwrap());
    let mut reg = Registry::new();
    stub::register(&mut reg);
    sdflow_nodes::register_all(&mut reg, Arc::new(rt));
    Env { exec: Executor::new(Arc::new(reg), ExecutorConfig::default()), dir }
}

fn workflow(env: &Env, size: i64) -> Workflow {
    let text = std::fs::read_to_string(sdflow_tests::workflows_dir().join("txt2img.json")).unwrap();
    let mut wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    let c = |v: serde_json::Value| InputValue::Const(v);
    wf.set_input("4", "width", c(serde_json::json!(size))).unwrap();
    wf.set_input("4", "height", c(serde_json::json!(size))).unwrap();
    wf.set_input("5", "steps", c(serde_json::json!(STEPS))).unwrap();
    wf
}

/// The KSampler's previews of one run: each decoded, with its declared size.
fn previews(env: &Env, wf: &Workflow) -> Vec<(u32, u32, image::RgbImage)> {
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let out = env.dir.path().join("output");
    env.exec.run(wf, &tx, &CancelToken::new(), &RunOptions { output_dir: Some(out), ..Default::default() }).unwrap();
    drop(tx);
    rx.iter()
        .filter_map(|e| match e {
            Event::Preview { node, image, .. } => {
                assert_eq!(node, "5", "only the sampler previews");
                assert_eq!(image.format, PreviewFormat::Jpeg);
                let decoded = image::load_from_memory_with_format(&image.data, image::ImageFormat::Jpeg).expect("a decodable JPEG").to_rgb8();
                Some((image.width, image.height, decoded))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn latent2rgb_previews_one_per_step_at_latent_size() {
    let env = env(|rt| rt, false);
    let got = previews(&env, &workflow(&env, 64));
    assert_eq!(got.len(), STEPS as usize, "one preview per step");
    for (w, h, img) in &got {
        assert_eq!((*w, *h), (8, 8), "latent2rgb previews are latent-sized");
        assert_eq!(img.dimensions(), (8, 8));
    }
    // Later steps see a different estimate.
    assert_ne!(got[0].2, got[STEPS as usize - 1].2);
}

#[test]
fn taesd_previews_are_image_sized() {
    let env = env(|rt| rt.with_preview_method(PreviewMethod::Taesd), true);
    let got = previews(&env, &workflow(&env, 64));
    assert_eq!(got.len(), STEPS as usize);
    for (w, h, img) in &got {
        assert_eq!((*w, *h), (64, 64), "TAESD decodes to the image size");
        assert_eq!(img.dimensions(), (64, 64));
    }
    // The 512 px cap is checked on the encoder alone (preview.rs): a TAESD decode above
    // 512² per step is too slow for this suite on a CPU.
}

#[test]
fn taesd_previews_fall_back_to_latent2rgb_without_a_decoder() {
    let env = env(|rt| rt.with_preview_method(PreviewMethod::Taesd), false);
    let got = previews(&env, &workflow(&env, 64));
    assert_eq!(got.len(), STEPS as usize);
    assert!(got.iter().all(|(w, h, _)| (*w, *h) == (8, 8)));
}

#[test]
fn no_previews_when_off() {
    let env = env(|rt| rt.with_preview_method(PreviewMethod::None), true);
    assert!(previews(&env, &workflow(&env, 64)).is_empty());
}

/// The saved image of one txt2img run.
fn image_bytes(env: &Env, wf: &Workflow) -> Vec<u8> {
    let out = env.dir.path().join("output");
    let report = env.exec.run(wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(out.clone()), ..Default::default() }).unwrap();
    std::fs::read(out.join(report.ui_outputs["7"]["images"][0]["filename"].as_str().unwrap())).unwrap()
}

#[test]
fn the_runtime_rng_drives_sampling_noise() {
    let runs: Vec<Vec<u8>> = [RngKind::Cpu, RngKind::Cuda, RngKind::Cuda]
        .into_iter()
        .map(|k| {
            let env = env(|rt| rt.with_rng(k).with_preview_method(PreviewMethod::None), false);
            image_bytes(&env, &workflow(&env, 64))
        })
        .collect();
    assert_ne!(runs[0], runs[1], "cuda (Philox) noise differs from cpu noise");
    assert_eq!(runs[1], runs[2], "the same seed and generator give the same image");
}

/// VAELoader lists `taesd` when models/vae_approx has both halves, and VAEDecode /
/// VAEEncode run it in the KL VAE's place on SD1 latents.
#[test]
fn taesd_as_the_vae() {
    let env = env(|rt| rt.with_preview_method(PreviewMethod::None), true);
    let listed = env.exec.registry().schema("VAELoader").expect("VAELoader").object_info().to_string();
    assert!(listed.contains("\"taesd\""), "taesd offered: {listed}");

    let kl = image_bytes(&env, &workflow(&env, 64));
    let mut wf = workflow(&env, 64);
    let c = |v: serde_json::Value| InputValue::Const(v);
    wf.nodes.insert("20".into(), sdflow_executor::NodeSpec::new("VAELoader").with_input("vae_name", c(serde_json::json!("taesd"))));
    wf.set_input("6", "vae", InputValue::link("20", 0)).unwrap();
    // Decoded, encoded again and decoded again, all with TAESD.
    wf.nodes.insert("21".into(), sdflow_executor::NodeSpec::new("VAEEncode").with_input("pixels", InputValue::link("6", 0)).with_input("vae", InputValue::link("20", 0)));
    wf.nodes.insert("22".into(), sdflow_executor::NodeSpec::new("VAEDecode").with_input("samples", InputValue::link("21", 0)).with_input("vae", InputValue::link("20", 0)));
    wf.set_input("7", "images", InputValue::link("22", 0)).unwrap();
    let bytes = image_bytes(&env, &wf);
    let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (64, 64), "TAESD keeps the factor of 8 both ways");
    assert!(img.as_raw().iter().collect::<std::collections::HashSet<_>>().len() > 16, "not a flat image");
    assert_ne!(bytes, kl, "a different VAE gives a different image");

    // Without the files, `taesd` is not a choice and asking for it fails validation.
    let bare = env_without_taesd();
    let mut wf = workflow(&bare, 64);
    wf.nodes.insert("20".into(), sdflow_executor::NodeSpec::new("VAELoader").with_input("vae_name", c(serde_json::json!("taesd"))));
    wf.set_input("6", "vae", InputValue::link("20", 0)).unwrap();
    assert!(bare.exec.validate(&wf).is_err());
}

fn env_without_taesd() -> Env {
    env(|rt| rt.with_preview_method(PreviewMethod::None), false)
}
