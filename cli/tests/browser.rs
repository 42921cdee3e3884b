//! The web frontends end to end: starts `sdflow serve` on a free port and runs a
//! Playwright script (in Debian's chromium) against it — ui/web/tests/editor.mjs for the
//! embedded editor, ui/web/tests/comfy_frontend.mjs for ComfyUI's own frontend served by
//! `--front-end-root` (the unchanged `comfyui-frontend-package`, whose folder
//! SDFLOW_COMFY_FRONTEND names; .ci/run unpacks the pinned wheel there).
//!
//! Needs node, ui/web/node_modules (the ui crate's build installs it) and chromium
//! (`apt-get install chromium`; SDFLOW_CHROMIUM names another binary). Without them a test
//! prints a SKIP line, unless SDFLOW_BROWSER_TESTS=1 (as .ci/run sets), when it fails.

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

fn missing_tools(web: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    let chromium = std::env::var_os("SDFLOW_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    if !chromium.exists() {
        missing.push(format!(
            "chromium at {} (apt-get install chromium)",
            chromium.display()
        ));
    }
    if Command::new("node")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        missing.push("node on PATH".into());
    }
    if !web
        .join("node_modules/playwright-core/package.json")
        .exists()
    {
        missing.push(format!(
            "{} (npm ci there)",
            web.join("node_modules/playwright-core").display()
        ));
    }
    missing
}

/// Whether the browser test may run; prints the SKIP line (or fails, when SDFLOW_BROWSER_TESTS=1)
/// when something it needs is `missing`.
fn may_run(what: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let required = std::env::var("SDFLOW_BROWSER_TESTS").is_ok_and(|v| v == "1");
    assert!(!required, "SDFLOW_BROWSER_TESTS=1 but {what} cannot run; missing: {}", missing.join(", "));
    // Straight to stderr: the test harness captures eprintln! of passing tests.
    let _ = writeln!(std::io::stderr(), "\n*** SKIP {what}: missing {} (set SDFLOW_BROWSER_TESTS=1 to make this a failure) ***\n", missing.join(", "));
    false
}

/// A fresh folder for the server's models, input and output, with the tiny random-weight
/// SD1 checkpoint `tiny-sd1.safetensors` (the name workflows/comfyui/txt2img_subgraph.json
/// asks for).
fn server_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["models/checkpoints", "input", "output"] {
        std::fs::create_dir_all(dir.join(sub)).expect("creating the server's folders");
    }
    let tiny = sdflow_core::synth::SdConfig::tiny_sd1_f8();
    sdflow_core::synth::write_checkpoint(
        &dir.join("models/checkpoints/tiny-sd1.safetensors"),
        &tiny,
        sdflow_core::dtype::DType::F32,
        7,
        sdflow_core::synth::Format::Safetensors,
    )
    .expect("writing the tiny checkpoint");
    dir
}

/// Runs `node ui/web/tests/SCRIPT URL` and fails the test when it reports a failure.
fn run_script(web: &Path, script: &str, url: &str, server: Server, dir: &Path) {
    let status = Command::new("node")
        .arg(web.join("tests").join(script))
        .arg(url)
        .current_dir(web)
        .status()
        .unwrap_or_else(|e| panic!("running node ui/web/tests/{script}: {e}"));
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
    assert!(status.success(), "{script} against {url} failed ({status}); its report is above");
}

/// Starts the server on a port the OS picks and returns it with its URL.
fn start_server(dir: &Path, extra: &[&std::ffi::OsStr]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sdflow"))
        .args(["serve", "--port", "0", "--threads", "2"])
        .args(extra)
        .arg("--models-dir")
        .arg(dir.join("models"))
        .arg("--input-dir")
        .arg(dir.join("input"))
        .arg("--output-dir")
        .arg(dir.join("output"))
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
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("sdflow serve printed its address within 60 s");
    (server, format!("{url}/"))
}

#[test]
fn editor_builds_queues_and_shows_results() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/web");
    if !may_run("the browser test", &missing_tools(&web)) {
        return;
    }
    let dir = server_dir("browser");
    // Checkpoints to be listed and picked in place of a workflow's missing model; never
    // loaded. The real one sorts first, so it is the model the editor switches to.
    for name in ["tiny.safetensors", "tiny_b.safetensors"] {
        std::fs::write(dir.join("models/checkpoints").join(name), b"")
            .expect("writing a checkpoint placeholder");
    }
    let (server, url) = start_server(&dir, &[]);
    run_script(&web, "editor.mjs", &url, server, &dir);
}

/// The LLM-conditioned families' committed workflows (Z-Image, FLUX.2, Qwen-Image and its
/// Edit models), Wan's and AnimateDiff's videos open in the editor with their models and run, on tiny random-weight files.
#[test]
fn editor_runs_the_llm_family_workflows() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/web");
    if !may_run("the families' browser test", &missing_tools(&web)) {
        return;
    }
    let dir = server_dir("families");
    sdflow_tests::write_z_image_models(&dir);
    sdflow_tests::write_flux2_models(&dir);
    sdflow_tests::write_qwen_image_models(&dir);
    sdflow_tests::write_wan_models(&dir);
    // AnimateDiff's workflow names the tiny SD1 as model.safetensors.
    sdflow_tests::tiny_tree(&dir);
    sdflow_tests::write_animatediff_models(&dir);
    sdflow_tests::write_test_png(&dir.join("input/input.png"), 72, 56);
    let (server, url) = start_server(&dir, &[]);
    run_script(&web, "families.mjs", &url, server, &dir);
}

/// ComfyUI's own frontend against sdflow: boot, open a workflow, Run, the image, the jobs
/// panel, settings, no outside hosts.
#[test]
fn comfyuis_own_frontend_runs_against_sdflow() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/web");
    let frontend = std::env::var_os("SDFLOW_COMFY_FRONTEND").map(PathBuf::from);
    let mut missing = missing_tools(&web);
    match &frontend {
        Some(f) if f.join("static/index.html").is_file() => {}
        Some(f) => missing.push(format!("ComfyUI's frontend at {} (SDFLOW_COMFY_FRONTEND)", f.display())),
        None => missing.push("SDFLOW_COMFY_FRONTEND (the unpacked comfyui-frontend-package folder)".into()),
    }
    if !may_run("ComfyUI's frontend test", &missing) {
        return;
    }
    let frontend = frontend.expect("checked above");
    let dir = server_dir("comfy-frontend");
    let user = dir.join("user");
    let (server, url) = start_server(&dir, &["--front-end-root".as_ref(), frontend.as_os_str(), "--user-directory".as_ref(), user.as_os_str()]);
    run_script(&web, "comfy_frontend.mjs", &url, server, &dir);
}
