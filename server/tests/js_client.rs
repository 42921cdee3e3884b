//! The npm ComfyUI client `@saintno/comfyui-sdk` against our server (server/tests/js).
//!
//! Needs Node.js and `npm ci` in server/tests/js; `.ci/run` does that and sets
//! SDFLOW_JS_CLIENT_TESTS=1, under which a missing setup is a failure. Elsewhere the test
//! prints a loud SKIP when node_modules is missing.

mod common;

use std::path::Path;
use std::time::Duration;

use serde_json::Value as Json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_comfyui_sdk_runs_prompts_against_our_server() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
    let required = std::env::var_os("SDFLOW_JS_CLIENT_TESTS").is_some();
    if !dir.join("node_modules/@saintno/comfyui-sdk").is_dir() {
        assert!(
            !required,
            "SDFLOW_JS_CLIENT_TESTS is set but {}/node_modules is missing: run `npm ci` there",
            dir.display()
        );
        eprintln!("\n========== SKIP: js_client: no node_modules in {} (run `npm ci` there, or .ci/run) ==========\n", dir.display());
        return;
    }
    let mut s = common::start(|_| {}).await;
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("node")
            .arg("client_test.mjs")
            .arg(&s.base)
            .current_dir(&dir)
            .output(),
    )
    .await
    .expect("the client finishes within 90 s")
    .expect("node runs (is Node.js installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client failed:\nstdout: {stdout}\nstderr: {stderr}"
    );
    let line = stdout.lines().last().unwrap_or("");
    let report: Json = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["ok"], true);
    assert_eq!(report["started"], true);
    // Node 2's steps, all seen, in order (node 4's first steps may pass before the SDK
    // listens).
    let steps: Vec<u64> = report["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p[0] == "2")
        .map(|p| p[1].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "{report}");
    assert!(report["previews"].as_u64().unwrap() >= 1, "{report}");
    // Each StubSlow adds 1.
    let expected: f64 = sdflow_executor::stub::constant_values(11, 4)
        .iter()
        .map(|v| f64::from(v + 2.0))
        .sum();
    assert!(
        (report["sum"].as_f64().unwrap() - expected).abs() < 1e-4,
        "{report}"
    );
    assert_eq!(report["failure"], "sdk boom");
    // What the client did is in our history: its prompt ran to completion.
    let id = report["promptId"].as_str().unwrap();
    assert_eq!(s.wait_history(id).await["status"]["status_str"], "success");
    s.shutdown().await;
}
