//! The PyPI A1111 client `webuiapi` against our server (server/tests/a1111/client_test.py),
//! on a tiny random-weight SD1 checkpoint.
//!
//! Needs Python with `webuiapi` 0.9.17 importable (`pip install --target DIR webuiapi==0.9.17`,
//! DIR in `SDFLOW_A1111_CLIENT_PYTHONPATH`); `.ci/run` does that and sets
//! `SDFLOW_A1111_CLIENT_TESTS=1`, under which a missing setup is a failure. Elsewhere the
//! test prints a loud SKIP.

mod common;

use std::path::Path;
use std::time::Duration;

use sdflow_core::dtype::DType;
use sdflow_core::synth::{ensure_checkpoint, Format, SdConfig};
use serde_json::Value as Json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webuiapi_client_drives_the_a1111_routes() {
    let required = std::env::var_os("SDFLOW_A1111_CLIENT_TESTS").is_some();
    let pythonpath = std::env::var("SDFLOW_A1111_CLIENT_PYTHONPATH").unwrap_or_default();
    let importable = std::process::Command::new("python3").args(["-c", "import webuiapi"]).env("PYTHONPATH", &pythonpath).status().is_ok_and(|s| s.success());
    if !importable {
        assert!(!required, "SDFLOW_A1111_CLIENT_TESTS is set but python3 cannot import webuiapi from PYTHONPATH={pythonpath}");
        eprintln!("\n========== SKIP: a1111_client: python3 cannot import webuiapi (pip install --target DIR webuiapi==0.9.17; SDFLOW_A1111_CLIENT_PYTHONPATH=DIR) ==========\n");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = tmp.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    ensure_checkpoint(&ckpts.join("tiny.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let controlnets = tmp.path().join("models/controlnet");
    std::fs::create_dir_all(&controlnets).unwrap();
    sdflow_core::synth::write_controlnet(&controlnets.join("control_tiny.safetensors"), &SdConfig::tiny_sd1_f8().unet, 3, 11).unwrap();
    let mut s = common::start_in(tmp.path(), |_| {}, true).await;
    let addr = s.base.trim_start_matches("http://").trim_end_matches('/').to_string();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a1111/client_test.py");
    let out = tokio::time::timeout(Duration::from_secs(300), tokio::process::Command::new("python3").arg(&script).args([host, port]).env("PYTHONPATH", &pythonpath).output())
        .await
        .expect("the client finishes within 5 minutes")
        .expect("python3 runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "client failed:\n{stdout}\n{stderr}");
    let r: Json = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(r["models"], serde_json::json!(["tiny"]));
    assert_eq!(r["current_model"], "tiny");
    assert!(r["samplers"].as_array().unwrap().iter().any(|x| x == "euler_ancestral"), "{r}");
    // batch_size 2 × n_iter 2, seeds counting up as A1111's.
    assert_eq!(r["txt2img"]["images"], 4, "{r}");
    assert_eq!(r["txt2img"]["size"], serde_json::json!([64, 64]));
    assert_eq!(r["txt2img"]["seeds"], serde_json::json!([5, 6, 7, 8]));
    assert_eq!(r["hires"], serde_json::json!([64, 64]), "the hires fix doubles 32²");
    assert_eq!(r["img2img"], serde_json::json!([64, 64]));
    assert_eq!(r["inpaint"], serde_json::json!([64, 64]));
    // The client's own inpainting defaults (masked content "fill", area "only masked")
    // run as A1111 runs them: the region pasted back into the 64x64 input.
    assert_eq!(r["inpaint_defaults"], serde_json::json!([64, 64]), "{r}");
    assert!(r["png_info"].as_str().unwrap().contains("Steps: "), "{r}");
    assert_eq!(r["tiling"], serde_json::json!([64, 48]), "{r}");
    // The ControlNet extension as the client drives it.
    assert_eq!((r["controlnet_version"].clone(), r["controlnet_models"].clone(), r["controlnet_modules"].clone()), (serde_json::json!(2), serde_json::json!(["control_tiny"]), serde_json::json!(["none"])), "{r}");
    assert_eq!(r["controlnet"], serde_json::json!([64, 48]), "{r}");
    assert_eq!(r["progress"], 0.0);
    assert_eq!(r["clip_skip"], 2);
    assert!(r["latent_modes"].as_array().unwrap().iter().any(|m| m == "Latent (nearest-exact)"), "{r}");
    s.shutdown().await;
}
