//! The DiTs end to end on the CPU: `sdflow img_gen` beside stable-diffusion.cpp's `sd-cli`,
//! the same flags on the same files — full-size random-weight models in the layouts people
//! download, written once under `~/.cache/sdflow/bench/dit/` by `sdflow_core::synth`:
//! - `SDFLOW_BENCH_MODEL=flux` (default): the FLUX.1-dev transformer as GGUF in each type
//!   asked, T5-XXL as a Q8_0 GGUF, ComfyUI's `clip_l.safetensors`, BFL's `ae.safetensors`;
//!   cfg 1 (guidance 3.5), one pass per step.
//! - `SDFLOW_BENCH_MODEL=sd35m`: SD3.5 medium (`f16` as safetensors, quantized types as
//!   GGUF) with CLIP-L, OpenCLIP-G (`clip_g.safetensors`), the same T5 and the 16-channel
//!   VAE; cfg 4.5, two passes per step. `bench/sd35_diffusers.py` (diffusers in bf16) runs
//!   after the two engines unless `SDFLOW_BENCH_ENGINES` leaves `diffusers` out.
//! - `SDFLOW_BENCH_MODEL=zimage`: Z-Image Turbo (6B; `bf16` as safetensors, quantized
//!   types as GGUF) with Qwen3-4B as a Q8_0 GGUF (`--llm`) and FLUX's VAE; cfg 1, one pass
//!   per step. diffusers cannot hold the 6B model in f32 on this machine:
//!   `bench/z_image_diffusers.py` times one of its blocks at the same token count in f32 and
//!   bf16 instead (a step is ~34 such blocks; printed beside the table, not in it).
//! - `SDFLOW_BENCH_MODEL=wan`: Wan 2.1 T2V 1.3B (`bf16` as safetensors, quantized types as
//!   GGUF with the patch kernel as sd.cpp's convert stores it) with UMT5-XXL as a Q8_0 GGUF
//!   and the Wan 2.1 VAE, `vid_gen` at 832×480 (`SDFLOW_BENCH_SIZE` takes WxH) and
//!   `SDFLOW_BENCH_FRAMES` = 9 frames; cfg 6, two passes per step. diffusers is measured
//!   block by block by `bench/wan.sh`. Then the VAE alone decodes `SDFLOW_BENCH_VAE_FRAMES`
//!   = "9,33" frames in sdflow and in diffusers (`bench/wan_vae_diffusers.py`, bf16), each
//!   its own process, for its time and peak RSS (`vae` in `SDFLOW_BENCH_ENGINES`).
//!
//! Each engine runs as its own process, one at a time, under `/usr/bin/time` for its peak
//! RSS, its files read into the page cache just before. Seconds per step leave out the first step (graph set-up, and sdflow's lazy loading):
//! sdflow's from the times its progress events arrive, sd.cpp's from the s/it its progress
//! bar shows for the last step. Text encode is sdflow's encoder nodes and sd.cpp's
//! `get_learned_condition`; VAE decode sdflow's VAEDecode node and sd.cpp's
//! `decode_first_stage`; "total" is the whole command, loading included.
//!
//! Env: `SDFLOW_BENCH_TYPES` (FLUX "q4_K,q8_0", SD3.5 "f16,q8_0"), `SDFLOW_BENCH_SIZE` = 512 (Wan 832x480),
//! `SDFLOW_BENCH_STEPS` = 3, `SDFLOW_BENCH_THREADS` = all cores, `SDCPP_CLI` = path of an
//! `sd-cli` binary (sd.cpp is left out without it; bench/README.md says how ours was built),
//! `SDCPP_ARGS` = extra sd-cli flags (e.g. `--diffusion-fa`), `SDFLOW_BENCH_ENGINES` =
//! "sdflow,sdcpp,diffusers" (Wan: and `vae`).
//!
//! It lives in the `sdflow` crate because it runs the `sdflow` binary as users do (Cargo
//! builds it for the bench: `CARGO_BIN_EXE_sdflow`).
//!
//! Run: `cargo bench -p sdflow --bench dit_sdcpp`

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use sdflow_core::dtype::DType;
use sdflow_core::synth::dit::{ae_config, ae_tensors, clip_g_tensors, clip_l_tensors, wan_vae_tensors, FluxSynth, LlmSynth, Sd3Synth, T5Synth, WanSynth, ZImageSynth};
use sdflow_core::synth::{write_specs, Format, SdConfig, TensorSpec};

const GIB: f64 = (1u64 << 30) as f64;
const PROMPT: &str = "a lovely cat holding a sign that says flux";

/// Which family runs.
#[derive(Clone, Copy, PartialEq)]
enum Model {
    Flux,
    Sd35Medium,
    ZImage,
    Wan,
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Model::Flux => "FLUX.1-dev",
            Model::Sd35Medium => "SD3.5 medium",
            Model::ZImage => "Z-Image Turbo",
            Model::Wan => "Wan 2.1 T2V 1.3B",
        }
    }

    fn cfg(self) -> &'static str {
        match self {
            Model::Flux => "1.0",
            Model::Sd35Medium => "4.5",
            Model::ZImage => "1.0",
            Model::Wan => "6.0",
        }
    }

    fn default_types(self) -> &'static str {
        match self {
            Model::Flux => "q4_K,q8_0",
            Model::Sd35Medium => "f16,q8_0",
            Model::ZImage => "bf16,q8_0",
            Model::Wan => "bf16,q8_0",
        }
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

/// Writes `path` unless it exists (the writer renames a finished file into place, so an
/// existing one is whole).
fn ensure(path: &Path, specs: &[TensorSpec], config: &str, dtype: DType, format: Format) {
    if path.exists() {
        return;
    }
    let t = Instant::now();
    let w = write_specs(path, specs, config, dtype, 0, format).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("wrote {} ({:.2} GiB) in {:.0} s", path.display(), w.bytes as f64 / GIB, t.elapsed().as_secs_f64());
}

struct Files {
    /// The text encoders and the flags that name them.
    encoders: Vec<(&'static str, PathBuf)>,
    vae: PathBuf,
}

fn shared_files(dir: &Path, model: Model) -> Files {
    let vae = dir.join("ae.safetensors");
    if model != Model::Wan {
        ensure(&vae, &ae_tensors(&ae_config()), "", DType::F16, Format::Safetensors);
    }
    if model == Model::ZImage {
        // The LLM bench's file when it is there (the same synth, the same bytes).
        let llm = dir.join("qwen3_4b_q8_0.gguf");
        let theirs = dir.join("../llm/qwen3_4b_q8_0.gguf");
        if !llm.exists() && theirs.exists() {
            let _ = std::fs::hard_link(&theirs, &llm);
        }
        let q = LlmSynth::qwen3_4b();
        ensure(&llm, &q.tensors(), &serde_json::to_string(&q).unwrap(), DType::Q8_0, Format::Gguf);
        return Files { encoders: vec![("--llm", llm)], vae };
    }
    if model == Model::Wan {
        let vae = dir.join("wan_2.1_vae.safetensors");
        ensure(&vae, &wan_vae_tensors(96, 16), "", DType::F16, Format::Safetensors);
        let umt5 = dir.join("umt5-xxl-encoder-q8_0.gguf");
        let u = T5Synth::umt5_xxl();
        ensure(&umt5, &u.tensors(), &serde_json::to_string(&u).unwrap(), DType::Q8_0, Format::Gguf);
        return Files { encoders: vec![("--t5xxl", umt5)], vae };
    }
    let t5 = dir.join("t5xxl_q8_0.gguf");
    let t5s = T5Synth::xxl();
    ensure(&t5, &t5s.tensors(), &serde_json::to_string(&t5s).unwrap(), DType::Q8_0, Format::Gguf);
    let clip_l = dir.join("clip_l.safetensors");
    ensure(&clip_l, &clip_l_tensors(&SdConfig::sd15().text), "", DType::F16, Format::Safetensors);
    let mut encoders = vec![("--t5xxl", t5), ("--clip_l", clip_l)];
    if model == Model::Sd35Medium {
        let path = dir.join("clip_g.safetensors");
        let text2 = SdConfig::sdxl().text2.expect("SDXL's OpenCLIP-G");
        ensure(&path, &clip_g_tensors(&text2), "", DType::F16, Format::Safetensors);
        encoders.push(("--clip_g", path));
    }
    Files { encoders, vae }
}

/// The diffusion model in `ty`: float types as safetensors, quantized ones as GGUF.
fn model_file(dir: &Path, model: Model, ty: &str) -> PathBuf {
    let dtype: DType = ty.parse().unwrap_or_else(|e| panic!("SDFLOW_BENCH_TYPES: {ty}: {e}"));
    let (format, ext) = if dtype.is_float() { (Format::Safetensors, "safetensors") } else { (Format::Gguf, "gguf") };
    let (stem, specs, config) = match model {
        Model::Flux => {
            let s = FluxSynth::dev();
            ("flux1-dev", s.tensors(), serde_json::to_string(&s).unwrap())
        }
        Model::Sd35Medium => {
            let s = Sd3Synth::sd35_medium();
            ("sd3.5_medium", s.tensors(), serde_json::to_string(&s).unwrap())
        }
        Model::ZImage => {
            let s = ZImageSynth::turbo();
            ("z_image_turbo", s.tensors(), serde_json::to_string(&s).unwrap())
        }
        Model::Wan => {
            let s = WanSynth::t2v_1_3b();
            ("wan2.1_t2v_1.3B", s.tensors(), serde_json::to_string(&s).unwrap())
        }
    };
    let path = dir.join(format!("{stem}-{ty}.{ext}"));
    ensure(&path, &specs, &config, dtype, format);
    path
}

/// One engine's numbers for one model file.
#[derive(Default)]
struct Row {
    step: Option<f64>,
    text: Option<f64>,
    vae: Option<f64>,
    total: f64,
    rss_gib: Option<f64>,
}

/// Runs `cmd` under `/usr/bin/time`, handing each stdout line with its arrival time to
/// `line`; returns the captured stderr, the wall time and the peak RSS. Panics when the
/// command fails.
fn timed(cmd: Command, line: impl FnMut(Instant, &str)) -> (String, f64, Option<f64>) {
    let program = cmd.get_program().to_owned();
    try_timed(cmd, line).unwrap_or_else(|(status, stderr, _)| {
        eprintln!("{stderr}");
        panic!("{program:?} failed: {status}")
    })
}

/// [`timed`], the failure returned: (status, stderr, peak RSS) — a peer that runs out of
/// memory is a result, not the end of the benchmark.
fn try_timed(cmd: Command, mut line: impl FnMut(Instant, &str)) -> Result<(String, f64, Option<f64>), (String, String, Option<f64>)> {
    let rss_file = tempfile::NamedTempFile::new().expect("temp file");
    let prog = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut wrapped = Command::new("/usr/bin/time");
    wrapped.arg("-f").arg("%M").arg("-o").arg(rss_file.path()).arg(prog).args(args);
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            wrapped.env(k, v);
        }
    }
    let t0 = Instant::now();
    let mut child = wrapped.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting /usr/bin/time");
    let mut err = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    for l in BufReader::new(child.stdout.take().unwrap()).lines() {
        let Ok(l) = l else { break };
        line(Instant::now(), &l);
    }
    let status = child.wait().expect("waiting");
    let total = t0.elapsed().as_secs_f64();
    let stderr = err_thread.join().unwrap_or_default();
    let rss = std::fs::read_to_string(rss_file.path()).ok().and_then(|s| s.lines().last()?.trim().parse::<f64>().ok()).map(|kib| kib * 1024.0 / GIB);
    if !status.success() {
        return Err((status.to_string(), stderr, rss));
    }
    Ok((stderr, total, rss))
}

/// What both engines are asked for: the same command line.
struct Job<'a> {
    model: Model,
    file: &'a Path,
    files: &'a Files,
    width: u32,
    height: u32,
    /// Video frames (Wan); images have none.
    frames: Option<u32>,
    steps: u32,
    threads: usize,
}

/// Reads every file of the job once, so each engine starts with them in the page cache
/// (as on a machine that ran them before) rather than the first paying for disk reads the
/// previous one evicted.
fn warm(j: &Job) {
    let f = j.files;
    let mut buf = vec![0u8; 8 << 20];
    for path in [j.file, &f.vae].into_iter().chain(f.encoders.iter().map(|(_, p)| p.as_path())) {
        let mut file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        while file.read(&mut buf).map_or(false, |n| n > 0) {}
    }
}

fn common_flags(cmd: &mut Command, j: &Job, out: &Path) {
    let f = j.files;
    cmd.arg("--diffusion-model").arg(j.file).arg("--vae").arg(&f.vae);
    for (flag, path) in &f.encoders {
        cmd.arg(flag).arg(path);
    }
    let (steps, threads) = (j.steps, j.threads);
    cmd.args(["-p", PROMPT, "--cfg-scale", j.model.cfg(), "-s", "42"]);
    cmd.args(["-W", &j.width.to_string(), "-H", &j.height.to_string(), "--steps", &steps.to_string(), "-t", &threads.to_string()]);
    if let Some(frames) = j.frames {
        cmd.args(["--video-frames", &frames.to_string(), "--sampling-method", "euler"]);
    }
    cmd.arg("-o").arg(out);
}

fn sdflow(j: &Job, out: &Path) -> Row {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sdflow"));
    cmd.arg(if j.frames.is_some() { "vid_gen" } else { "img_gen" });
    common_flags(&mut cmd, j, out);
    cmd.arg("--json-events");
    // The sampler's progress events, stamped as they arrive.
    let mut stamps: Vec<Instant> = Vec::new();
    let (stderr, total, rss) = timed(cmd, |at, l| {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else { return };
        if v.get("type").and_then(|t| t.as_str()) == Some("progress") {
            stamps.push(at);
        }
    });
    let nodes = node_times(&stderr);
    let step = (stamps.len() >= 2).then(|| (stamps[stamps.len() - 1] - stamps[0]).as_secs_f64() / (stamps.len() - 1) as f64);
    print!("{}", stderr.lines().filter(|l| l.contains(" ran ")).map(|l| format!("  {l}\n")).collect::<String>());
    let encoders: Vec<f64> = ["SdCppConditioner", "CLIPTextEncodeFlux", "CLIPTextEncode"].iter().filter_map(|c| nodes.get(*c).copied()).collect();
    let text = (!encoders.is_empty()).then(|| encoders.iter().sum());
    Row { step, text, vae: nodes.get("VAEDecode").copied(), total, rss_gib: rss }
}

fn sdcpp(bin: &str, j: &Job, out: &Path) -> Row {
    let mut cmd = Command::new(bin);
    if j.frames.is_some() {
        cmd.args(["-M", "vid_gen"]);
    }
    common_flags(&mut cmd, j, out);
    cmd.arg("-v");
    cmd.args(env_or("SDCPP_ARGS", "").split_whitespace());
    let mut log = String::new();
    let (stderr, total, rss) = match try_timed(cmd, |_, l| {
        log.push_str(l);
        log.push('\n');
    }) {
        Ok(r) => r,
        Err((status, stderr, rss)) => {
            let tail: Vec<&str> = log.lines().chain(stderr.lines()).rev().take(5).collect();
            println!("  sd-cli failed ({status}, peak RSS {} GiB); its last lines:", cell(rss));
            tail.iter().rev().for_each(|l| println!("    {l}"));
            return Row { rss_gib: rss, ..Row::default() };
        }
    };
    log.push_str(&stderr);
    let taking = |what: &str| -> Option<f64> {
        let l = log.lines().rev().find(|l| l.contains(what))?;
        l.split("taking ").nth(1)?.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok()
    };
    // The progress bar redraws with '\r'; its last "N/N - X s/it" is the last step's time.
    let step = log
        .split(['\r', '\n'])
        .filter_map(|seg| seg.split(" - ").nth(1)?.split("s/it").next()?.trim().parse::<f64>().ok())
        .last();
    Row { step, text: taking("get_learned_condition completed"), vae: taking("decode_first_stage completed"), total, rss_gib: rss }
}

/// sdflow's Wan VAE alone: a `sdflow run` of VAELoader → EmptyHunyuanLatentVideo →
/// VAEDecode → SaveImage over `frames` frames, for the decode's time and the process's peak
/// RSS (the decoder holds one latent frame's activations and its causal caches, so the
/// peak should not grow with the frame count).
fn sdflow_vae(vae: &Path, width: u32, height: u32, frames: u32, threads: usize, out: &Path) -> Row {
    let name = vae.file_name().and_then(|n| n.to_str()).expect("VAE file name");
    let workflow = serde_json::json!({
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": name}},
        "2": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": width, "height": height, "length": frames, "batch_size": 1}},
        "3": {"class_type": "VAEDecode", "inputs": {"samples": ["2", 0], "vae": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": format!("vae{frames}")}},
    });
    let file = out.join(format!("vae{frames}.json"));
    std::fs::write(&file, workflow.to_string()).expect("writing the VAE workflow");
    // VAELoader looks in `vae/` under the models folder.
    let models = out.join("models");
    let link = models.join("vae").join(name);
    if !link.exists() {
        std::fs::create_dir_all(models.join("vae")).expect("models folder");
        std::os::unix::fs::symlink(vae, &link).expect("linking the VAE");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sdflow"));
    cmd.arg("run").arg(&file).arg("--models-dir").arg(&models).arg("--output-dir").arg(out).arg("-t").arg(threads.to_string());
    // With events on stdout the node table goes to stderr.
    cmd.arg("--json-events");
    let (stderr, total, rss) = timed(cmd, |_, _| {});
    let vae = node_times(&stderr).get("VAEDecode").copied();
    Row { vae, total, rss_gib: rss, ..Row::default() }
}

/// The per-node table sdflow prints on stderr (`<id>  <class>  ran  <time>`), summed by
/// class.
fn node_times(stderr: &str) -> HashMap<String, f64> {
    let mut nodes: HashMap<String, f64> = HashMap::new();
    for l in stderr.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if let Some(i) = w.iter().position(|x| *x == "ran") {
            let secs = match (w.get(i + 1).and_then(|v| v.parse::<f64>().ok()), w.get(i + 2)) {
                (Some(v), Some(&"s")) => v,
                (Some(v), Some(&"ms")) => v / 1e3,
                (Some(v), Some(&"µs")) => v / 1e6,
                _ => continue,
            };
            if i >= 1 {
                *nodes.entry(w[i - 1].to_string()).or_default() += secs;
            }
        }
    }
    nodes
}

/// `bench/sd35_diffusers.py`: its `RESULT` line, with the script's own wall time as total.
fn diffusers(size: u32, steps: u32, threads: usize) -> Option<Row> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/sd35_diffusers.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(threads.to_string()).arg(size.to_string()).arg(steps.to_string());
    let mut result = None;
    let (_, total, rss) = timed(cmd, |_, l| {
        println!("  {l}");
        if l.starts_with("RESULT ") {
            let kv: HashMap<&str, f64> = l.split_whitespace().filter_map(|w| w.split_once('=')).filter_map(|(k, v)| Some((k, v.parse().ok()?))).collect();
            result = Some(Row { step: kv.get("step").copied(), text: kv.get("text").copied(), vae: kv.get("vae").copied(), total: 0.0, rss_gib: kv.get("rss").copied() });
        }
    });
    result.map(|r| Row { total, rss_gib: rss.or(r.rss_gib), ..r })
}

/// One row as soon as it is measured (a later engine's failure keeps it on screen).
fn print_row(ty: &str, engine: &str, r: &Row) {
    println!("  -> {ty} {engine}: s/step {}, text {} s, VAE {} s, total {:.1} s, peak RSS {} GiB", cell(r.step), cell(r.text), cell(r.vae), r.total, cell(r.rss_gib));
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

fn main() {
    let model = match env_or("SDFLOW_BENCH_MODEL", "flux").as_str() {
        "flux" => Model::Flux,
        "sd35m" => Model::Sd35Medium,
        "zimage" => Model::ZImage,
        "wan" => Model::Wan,
        other => panic!("SDFLOW_BENCH_MODEL: {other} is not flux, sd35m, zimage or wan"),
    };
    let types: Vec<String> = env_or("SDFLOW_BENCH_TYPES", model.default_types()).split(',').map(|s| s.trim().to_string()).collect();
    let size = env_or("SDFLOW_BENCH_SIZE", if model == Model::Wan { "832x480" } else { "512" });
    let (width, height): (u32, u32) = match size.split_once('x') {
        Some((w, h)) => (w.parse().expect("SDFLOW_BENCH_SIZE width"), h.parse().expect("SDFLOW_BENCH_SIZE height")),
        None => (size.parse().expect("SDFLOW_BENCH_SIZE"), size.parse().expect("SDFLOW_BENCH_SIZE")),
    };
    let frames = (model == Model::Wan).then(|| env_or("SDFLOW_BENCH_FRAMES", "9").parse::<u32>().expect("SDFLOW_BENCH_FRAMES"));
    let steps: u32 = env_or("SDFLOW_BENCH_STEPS", "3").parse().expect("SDFLOW_BENCH_STEPS");
    let threads: usize = env_or("SDFLOW_BENCH_THREADS", &sdflow_core::ggml::default_threads().to_string()).parse().expect("SDFLOW_BENCH_THREADS");
    let engines = env_or("SDFLOW_BENCH_ENGINES", "sdflow,sdcpp,diffusers,vae");
    let sdcpp_bin = std::env::var("SDCPP_CLI").ok().filter(|s| !s.is_empty());
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = home.join(".cache/sdflow/bench/dit");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let files = shared_files(&dir, model);
    let out = tempfile::tempdir().expect("temp dir");
    let mut rows = Vec::new();
    let ext = if frames.is_some() { "avi" } else { "png" };
    for ty in &types {
        let file = model_file(&dir, model, ty);
        let job = Job { model, file: &file, files: &files, width, height, frames, steps, threads };
        if engines.contains("sdflow") {
            println!("sdflow {}, {ty} ...", if frames.is_some() { "vid_gen" } else { "img_gen" });
            warm(&job);
            let r = sdflow(&job, &out.path().join(format!("sdflow-{ty}.{ext}")));
            print_row(ty, "sdflow", &r);
            rows.push((ty.clone(), "sdflow", r));
        }
        match &sdcpp_bin {
            Some(bin) if engines.contains("sdcpp") => {
                println!("sd-cli, {ty} ...");
                warm(&job);
                let r = sdcpp(bin, &job, &out.path().join(format!("sdcpp-{ty}.{ext}")));
                print_row(ty, "sd.cpp", &r);
                rows.push((ty.clone(), "sd.cpp", r));
            }
            None if engines.contains("sdcpp") => println!("sd.cpp skipped: set SDCPP_CLI to an sd-cli binary"),
            _ => {}
        }
    }
    if model == Model::Sd35Medium && engines.contains("diffusers") {
        println!("diffusers (bf16) ...");
        match diffusers(width, steps, threads) {
            Some(r) => rows.push(("bf16".to_string(), "diffusers", r)),
            None => println!("diffusers gave no result (pip install torch diffusers transformers)"),
        }
    }
    // The Wan VAE alone over longer videos: its time and whether its memory stays bounded.
    let mut vae_rows = Vec::new();
    if model == Model::Wan && engines.contains("vae") {
        for f in env_or("SDFLOW_BENCH_VAE_FRAMES", "9,33").split(',').map(|f| f.trim().parse::<u32>().expect("SDFLOW_BENCH_VAE_FRAMES")) {
            println!("sdflow VAE decode, {f} frames ...");
            let r = sdflow_vae(&files.vae, width, height, f, threads, out.path());
            print_row("f16", "sdflow VAE", &r);
            vae_rows.push((f, "sdflow", r));
            if engines.contains("diffusers") {
                println!("diffusers VAE decode (bf16), {f} frames ...");
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/wan_vae_diffusers.py");
                let mut cmd = Command::new("python3");
                cmd.arg(script).arg(threads.to_string()).arg(f.to_string()).arg(format!("{width}x{height}"));
                let mut vae = None;
                let (_, total, rss) = timed(cmd, |_, l| {
                    println!("  {l}");
                    vae = l.strip_prefix("RESULT vae=").and_then(|v| v.trim().parse::<f64>().ok());
                });
                vae_rows.push((f, "diffusers", Row { vae, total, rss_gib: rss, ..Row::default() }));
            }
        }
    }
    println!();
    let passes = match model {
        Model::Flux => "T5-XXL Q8_0, cfg 1 (guidance 3.5), one pass per step",
        Model::Sd35Medium => "T5-XXL Q8_0, cfg 4.5, two passes per step",
        Model::ZImage => "Qwen3-4B Q8_0, cfg 1, one pass per step",
        Model::Wan => "UMT5-XXL Q8_0, cfg 6, two passes per step",
    };
    if model == Model::ZImage && engines.contains("diffusers") {
        println!("diffusers (one block, f32 and bf16) ...");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/z_image_diffusers.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).arg(threads.to_string()).arg(width.to_string());
        let _ = timed(cmd, |_, l| println!("  {l}"));
    }
    let video = frames.map_or(String::new(), |f| format!(", {f} frames"));
    println!("{} at {width}×{height}{video}, {steps} steps, {threads} threads, {passes}", model.name());
    println!("{:>8} {:>9} {:>10} {:>14} {:>14} {:>10} {:>14}", "weights", "engine", "s / step", "text encode s", "VAE decode s", "total s", "peak RSS GiB");
    for (ty, engine, r) in &rows {
        println!("{:>8} {:>9} {:>10} {:>14} {:>14} {:>10.1} {:>14}", ty, engine, cell(r.step), cell(r.text), cell(r.vae), r.total, cell(r.rss_gib));
    }
    if !vae_rows.is_empty() {
        println!("\nThe Wan 2.1 VAE alone at {width}×{height} (sdflow: the file's f16 weights as `auto` loads them; diffusers: bf16)");
        println!("{:>8} {:>10} {:>14} {:>10} {:>14}", "frames", "engine", "VAE decode s", "total s", "peak RSS GiB");
        for (f, engine, r) in &vae_rows {
            println!("{:>8} {:>10} {:>14} {:>10.1} {:>14}", f, engine, cell(r.vae), r.total, cell(r.rss_gib));
        }
    }
}
