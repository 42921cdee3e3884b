//! ComfyUI's own web frontend end to end: `sdflow serve --front-end-root` with the
//! unchanged `comfyui-frontend-package` (SDFLOW_COMFY_FRONTEND names its folder; .ci/run
//! unpacks the pinned wheel there), driven by ui/web/tests/comfy_frontend.mjs in Debian's
//! chromium: boot, open a workflow, Run, the image, the jobs panel, settings, no outside
//! hosts.
//!
//! Without the frontend, node, playwright-core or chromium the test prints a SKIP line,
//! unless SDFLOW_BROWSER_TESTS=1 (as .ci/run sets), when it fails.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn missing_tools(web: &Path, frontend: Option<&Path>) -> Vec<String> {
    let mut missing = Vec::new();
    match frontend {
        Some(f) if f.join("static/index.html").is_file() => {}
        Some(f) => missing.push(format!("ComfyUI's frontend at {} (SDFLOW_COMFY_FRONTEND)", f.display())),
        None => missing.push("SDFLOW_COMFY_FRONTEND (the unpacked comfyui-frontend-package folder)".into()),
    }
    let chromium = std::env::var_os("SDFLOW_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    if !chromium.exists() {
        missing.push(format!("chromium at {}", chromium.display()));
    }
    if Command::new("node").arg("--version").output().map_or(true, |o| !o.status.success()) {
        missing.push("node on PATH".into());
    }
    if !web.join("node_modules/playwright-core/package.json").exists() {
        missing.push(format!("{} (npm ci there)", web.join("node_modules/playwright-core").display()));
    }
    missing
}

#[test]
fn comfyuis_own_frontend_runs_against_sdflow() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/web");
    let frontend = std::env::var_os("SDFLOW_COMFY_FRONTEND").map(PathBuf::from);
    let required = std::env::var("SDFLOW_BROWSER_TESTS").is_ok_and(|v| v == "1");
    let missing = missing_tools(&web, frontend.as_deref());
    if !missing.is_empty() {
        assert!(!required, "SDFLOW_BROWSER_TESTS=1 but ComfyUI's frontend test cannot run; missing: {}", missing.join(", "));
        let _ = writeln!(std::io::stderr(), "\n*** SKIP ComfyUI frontend test: missing {} ***\n", missing.join(", "));
        return;
    }
    let frontend = frontend.expect("checked above");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("comfy-frontend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ckpts = dir.join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).expect("creating the models folder");
    // The template the test opens names another checkpoint; the server offers this one.
    let tiny = sdflow_core::synth::SdConfig::tiny_sd1_f8();
    sdflow_core::synth::write_checkpoint(&ckpts.join("tiny-sd1.safetensors"), &tiny, sdflow_core::dtype::DType::F32, 7, sdflow_core::synth::Format::Safetensors).expect("writing the tiny checkpoint");

    let mut child = Command::new(env!("CARGO_BIN_EXE_sdflow"))
        .args(["serve", "--port", "0", "--threads", "2"])
        .arg("--front-end-root")
        .arg(&frontend)
        .arg("--models-dir")
        .arg(dir.join("models"))
        .arg("--input-dir")
        .arg(dir.join("input"))
        .arg("--output-dir")
        .arg(dir.join("output"))
        .arg("--user-directory")
        .arg(dir.join("user"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting sdflow serve");
    let stdout = child.stdout.take().expect("piped stdout");
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("sdflow serving on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = format!("{}/", rx.recv_timeout(Duration::from_secs(60)).expect("sdflow serve printed its address within 60 s"));
    let status = Command::new("node")
        .arg(web.join("tests/comfy_frontend.mjs"))
        .arg(&url)
        .current_dir(&web)
        .status()
        .expect("running node ui/web/tests/comfy_frontend.mjs");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "ComfyUI's frontend against {url} failed ({status}); its report is above");
}
