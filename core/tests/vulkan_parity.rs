//! The model parity tests again, computed on a Vulkan device: with `SDFLOW_VULKAN_TESTS=1`
//! (and Mesa's software Vulkan device and the headers from tools/vulkan-deps.sh) this builds sdflow-core with `--features vulkan` in a target
//! directory of its own and runs the listed test files with `SDFLOW_TEST_BACKEND=gpu`, so
//! their graphs run on ggml's Vulkan backend against the same PyTorch references and
//! tolerances. Without the variable it does nothing (a machine without the packages).
//! Debian 12's own lavapipe (Mesa 22.3) crashes at random inside its worker threads
//! (SIGSEGV in libvulkan_lvp.so, a third of the runs of ESRGAN's tests); the script installs
//! bookworm-backports' Mesa 25, where every listed test passes. .ci/run sets the variable.
//!
//! ggml's Vulkan backend computes in f16 where the device allows; `GGML_VK_DISABLE_F16`
//! keeps it in f32 so the 1e-3 tolerances of the references hold (what is checked is that
//! each graph is right on a non-CPU backend, not f16 rounding).

use std::process::Command;

/// The parity test files that run on Vulkan, every test of each.
const ON_VULKAN: &[&str] = &[
    "models_unet",
    "models_animatediff",
    "models_vae",
    "models_sdxl",
    "models_sd3",
    "models_flux",
    "models_flux2",
    "models_chroma",
    "models_circular",
    "models_clip",
    "models_clip_vision",
    "models_t5",
    "models_llm",
    "models_z_image",
    "models_qwen_image",
    "models_qwen_vision",
    "models_wan_vae",
    "models_controlnet",
    "models_taesd",
    "models_vae_tiling",
    "models_esrgan",
    // A two-step sampling run through the UNet.
    "models_sampling",
    "lora",
];



fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn parity_tests_pass_on_vulkan() {
    if std::env::var("SDFLOW_VULKAN_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: SDFLOW_VULKAN_TESTS=1 not set");
        return;
    }
    let headers = std::env::var("SDFLOW_VULKAN_INCLUDE").expect("SDFLOW_VULKAN_INCLUDE: the Vulkan headers tools/vulkan-deps.sh prints");
    let cache = std::env::var("HOME").map(|h| format!("{h}/.cache")).unwrap();
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.args(["test", "-p", "sdflow-core", "--features", "vulkan", "--no-run", "--message-format=json"]);
    for t in ON_VULKAN {
        build.args(["--test", t]);
    }
    build
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("CARGO_TARGET_DIR", format!("{cache}/sdflow-target-vulkan"))
        .env("CMAKE_INCLUDE_PATH", headers);
    let (ok, text) = run(&mut build);
    assert!(ok, "the Vulkan build failed:\n{text}");
    let binaries: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter_map(|m| Some((m["target"]["name"].as_str()?.to_string(), m["executable"].as_str()?.to_string())))
        .collect();
    assert_eq!(binaries.len(), ON_VULKAN.len(), "test binaries built: {binaries:?}");

    // Each test in a process of its own: ggml's Vulkan device is torn down with the last
    // backend, and set up again in the same process it crashes.
    let mut failed = Vec::new();
    let (mut passed, mut on_device) = (0, 0);
    for (name, exe) in &binaries {
        let (_, list) = run(Command::new(exe).arg("--list"));
        for test in list.lines().filter_map(|l| l.strip_suffix(": test")) {
            let (ok, out) = run(Command::new(exe)
                .args(["--exact", test, "--test-threads=1"])
                // ggml lists CPU-type Vulkan devices (lavapipe) only when told to.
                .env("GGML_VK_VISIBLE_DEVICES", "0")
                .env("GGML_VK_DISABLE_F16", "1")
                .env("SDFLOW_TEST_BACKEND", "gpu"));
            if ok && out.contains("1 passed") {
                passed += 1;
                // Tests of pure maths (tile weights, RoPE tables) make no backend.
                on_device += usize::from(out.contains("ggml_vulkan: 0 = "));
            } else {
                failed.push(format!("{name}::{test}\n{out}"));
            }
        }
    }
    assert!(failed.is_empty(), "{} tests failed on Vulkan ({passed} passed):\n{}", failed.len(), failed.join("\n"));
    assert!(on_device > 50, "only {on_device} of {passed} tests used the Vulkan device");
}
