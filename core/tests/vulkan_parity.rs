//! The model parity tests again, computed on a Vulkan device: with `SDFLOW_VULKAN_TESTS=1`
//! (set by .ci/run, which installs Mesa's software Vulkan device and the headers through
//! tools/vulkan-deps.sh) this builds sdflow-core with `--features vulkan` in a target
//! directory of its own and runs the listed test files with `SDFLOW_TEST_BACKEND=gpu`, so
//! their graphs run on ggml's Vulkan backend against the same PyTorch references and
//! tolerances. Without the variable it does nothing (a machine without the packages).
//!
//! ggml's Vulkan backend computes in f16 where the device allows; `GGML_VK_DISABLE_F16`
//! keeps it in f32 so the 1e-3 tolerances of the references hold (what is checked is that
//! each graph is right on a non-CPU backend, not f16 rounding).

use std::process::Command;

/// The parity tests that run on Vulkan. Not yet: lora, models_controlnet, models_esrgan,
/// models_flux, models_sampling, models_t5, models_vae (they crash on the Vulkan backend:
/// weights loaded on the CPU inside the library meet a GPU graph).
const ON_VULKAN: &[&str] = &[
    "models_unet",
    "models_sdxl",
    "models_sd3",
    "models_chroma",
    "models_circular",
    "models_clip",
    "models_clip_vision",
    "models_taesd",
    "models_vae_tiling",
];

#[test]
fn parity_tests_pass_on_vulkan() {
    if std::env::var("SDFLOW_VULKAN_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: SDFLOW_VULKAN_TESTS=1 not set");
        return;
    }
    let headers = std::env::var("SDFLOW_VULKAN_INCLUDE").expect("SDFLOW_VULKAN_INCLUDE: the Vulkan headers tools/vulkan-deps.sh prints");
    let cache = std::env::var("HOME").map(|h| format!("{h}/.cache")).unwrap();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["test", "-p", "sdflow-core", "--features", "vulkan", "--no-fail-fast"]);
    for t in ON_VULKAN {
        cmd.args(["--test", t]);
    }
    // One device, one test at a time: lavapipe is a CPU device already using every core.
    cmd.args(["--", "--test-threads=1"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("CARGO_TARGET_DIR", format!("{cache}/sdflow-target-vulkan"))
        .env("CMAKE_INCLUDE_PATH", headers)
        // ggml lists CPU-type Vulkan devices (lavapipe) only when told to.
        .env("GGML_VK_VISIBLE_DEVICES", "0")
        .env("GGML_VK_DISABLE_F16", "1")
        .env("SDFLOW_TEST_BACKEND", "gpu");
    let out = cmd.output().expect("running cargo");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let runs = text.lines().filter(|l| l.starts_with("test result: ok.")).count();
    assert!(out.status.success() && runs == ON_VULKAN.len(), "{runs} of {} test files passed on Vulkan:\n{text}", ON_VULKAN.len());
    assert!(text.contains("ggml_vulkan: 0 = "), "no Vulkan device was used:\n{text}");
}
