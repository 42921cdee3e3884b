//! The `sdflow` binary built with `--features vulkan`, run as a user runs it with modules
//! split between the CPU and the Vulkan device: the text encoder on the CPU, the UNet,
//! ControlNet and VAE on Vulkan (sd-cli's `--clip-on-cpu`), weights kept in RAM and copied
//! over per use (`--offload-to-cpu`), a LoRA applied at runtime. Each image must match the
//! all-CPU run of the same flags within rounding.
//!
//! Opt-in like `core/tests/vulkan_parity.rs`: with `SDFLOW_VULKAN_TESTS=1` and
//! `SDFLOW_VULKAN_INCLUDE` (the headers tools/vulkan-deps.sh prints), on Mesa's software
//! device (lavapipe) where no GPU is present. The Vulkan build shares that test's target
//! directory.

use std::process::Command;

use sdflow_core::dtype::DType;
use sdflow_core::io;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};

/// Build the Vulkan `sdflow` binary; its path.
fn vulkan_binary() -> String {
    let headers = std::env::var("SDFLOW_VULKAN_INCLUDE").expect("SDFLOW_VULKAN_INCLUDE: the Vulkan headers tools/vulkan-deps.sh prints");
    let cache = std::env::var("HOME").map(|h| format!("{h}/.cache")).unwrap();
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "-p", "sdflow", "--bin", "sdflow", "--features", "vulkan", "--message-format=json"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("CARGO_TARGET_DIR", format!("{cache}/sdflow-target-vulkan"))
        .env("CMAKE_INCLUDE_PATH", headers)
        .output()
        .expect("running cargo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the Vulkan build failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "sdflow")
        .find_map(|m| m["executable"].as_str().map(String::from))
        .expect("cargo named the sdflow binary")
}

#[test]
fn a_preset_split_between_the_cpu_and_vulkan_matches_the_cpu() {
    if std::env::var("SDFLOW_VULKAN_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: SDFLOW_VULKAN_TESTS=1 not set");
        return;
    }
    let exe = vulkan_binary();
    let dir = tempfile::tempdir().unwrap();
    let sdflow = |args: &[&str]| {
        let out = Command::new(&exe)
            .args(args)
            .current_dir(dir.path())
            // ggml lists CPU-type Vulkan devices (lavapipe) only when told to; f32 keeps
            // the comparison about placement, not f16 rounding.
            .env("GGML_VK_VISIBLE_DEVICES", "0")
            .env("GGML_VK_DISABLE_F16", "1")
            .output()
            .expect("running sdflow");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "sdflow {args:?} failed:\n{text}");
        text
    };
    let listed = sdflow(&["img_gen", "--list-devices"]);
    assert!(listed.contains("CPU\t") && listed.contains("Vulkan0\t"), "{listed}");

    let model = dir.path().join("tiny.safetensors");
    let cfg = SdConfig::tiny_sd1_f8();
    write_checkpoint(&model, &cfg, DType::F32, 11, Format::Safetensors).unwrap();
    let cn = dir.path().join("control.safetensors");
    sdflow_core::synth::write_controlnet(&cn, &cfg.unet, 3, 4).unwrap();
    let loras = dir.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    sdflow_core::lora::synth::write_random_lora(io::open(&model).unwrap().as_ref(), &loras.join("ink.safetensors"), 4, 0.3, 5, Format::Safetensors).unwrap();
    image::RgbImage::from_fn(64, 64, |x, y| image::Rgb([(x * 4) as u8, (y * 4) as u8, ((x + y) * 2) as u8])).save(dir.path().join("edges.png")).unwrap();
    let (m, c, l) = (model.to_str().unwrap(), cn.to_str().unwrap(), loras.to_str().unwrap());
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["-m", m, "-p", "<lora:ink:0.8>a lovely cat", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "--type", "f32", "--lora-model-dir", l, "--lora-apply-mode", "at_runtime", "--control-net", c, "--control-image", "edges.png", "-o", out];
        args.extend(extra);
        let log = sdflow(&args);
        (sdflow_tests::read_png(&dir.path().join(out)).2, log)
    };
    let (cpu, _) = run(&["--backend", "cpu"], "cpu.png");
    let (split, log) = run(&["--clip-on-cpu", "-v"], "split.png");
    assert!(log.contains("te: CPU") && log.contains("diffusion: Vulkan0") && log.contains("vae: Vulkan0"), "the placement in the log:\n{log}");
    let (mean, worst) = sdflow_tests::pixel_difference(&cpu, &split);
    assert!(worst <= 3 && mean < 0.5, "text encoder on the CPU, the rest on Vulkan: off the CPU's image by up to {worst}/255 (mean {mean:.3})");
    // Weights kept in RAM, copied to the device for each use: the same numbers.
    let (offloaded, _) = run(&["--clip-on-cpu", "--offload-to-cpu"], "offloaded.png");
    assert_eq!(offloaded, split, "offloading moves weights, not results");
    let (from_disk, _) = run(&["--backend", "te=cpu,diffusion=vulkan0,vae=vulkan0", "--params-backend", "disk", "--max-vram", "1"], "disk.png");
    assert_eq!(from_disk, split);
    // A budget the UNet does not fit: refused from the file's header, before anything is
    // allocated on the device, naming the model, its size and the budget.
    let out = Command::new(&exe)
        .args(["-m", m, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "1", "--type", "f32", "--max-vram", "0.0001", "-o", "none.png"])
        .current_dir(dir.path())
        .env("GGML_VK_VISIBLE_DEVICES", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("tiny.safetensors") && err.contains("bytes on gpu:0, but its budget is 107374 bytes"), "{err}");
    assert!(!dir.path().join("none.png").exists());
}
