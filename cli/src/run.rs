//! `sdflow run`: load a workflow file (ours, ComfyUI API or ComfyUI UI format), apply
//! `--set` overrides, validate, run, and report per-node times and cache hits.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use sdflow_core::io::WeightType;
use sdflow_executor::{
    CancelToken, Event, EventSink, Executor, ExecutorConfig, InputValue, Registry, RunError,
    RunOptions, RunReport, Workflow, WorkflowError,
};

#[derive(Args)]
pub struct RunArgs {
    /// Workflow file(s). Several run one after the other in one executor, so later ones
    /// reuse the cached outputs of nodes they share with earlier ones.
    #[arg(required = true, value_name = "WORKFLOW")]
    pub workflows: Vec<PathBuf>,
    /// Run each workflow this many times (the repeats show the cache at work).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeat: usize,
    /// Override one input: NODE.INPUT=VALUE. VALUE is read as JSON (`3`, `0.5`, `true`,
    /// `["4", 0]` for a link) and otherwise taken as a string. Repeatable.
    #[arg(long = "set", value_name = "NODE.INPUT=VALUE")]
    pub set: Vec<String>,
    /// Directory output nodes write their files to (created if missing).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Print every event as one JSON line on stdout (ComfyUI's WebSocket message shape).
    #[arg(long)]
    pub json_events: bool,
    /// Worker threads for independent light nodes.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Folder of model files in ComfyUI's folders (`checkpoints/`, `vae/`, `embeddings/`, ...
    /// inside it); without a `checkpoints/` folder, the files in it are the checkpoints.
    #[arg(long, value_name = "DIR", default_value = "models")]
    pub models_dir: PathBuf,
    /// Compute threads (sd-cli's -t); all cores by default.
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,
    /// Folder LoadImage reads its images from.
    #[arg(long, value_name = "DIR", default_value = "input")]
    pub input_dir: PathBuf,
    #[command(flatten)]
    pub weight_type: WeightTypeArg,
    #[command(flatten)]
    pub placement: PlacementArgs,
}

/// sd-cli's device placement flags (`sdflow run`, `serve` and the presets take them alike).
#[derive(Args, Clone, Debug, Default)]
pub struct PlacementArgs {
    /// Runtime backend per module, e.g. `cpu` or `clip=cpu,vae=cuda0,diffusion=vulkan0`
    /// (modules: diffusion, te, clip_vision, vae, controlnet, photomaker, upscaler,
    /// detector; devices as --list-devices names them). Default: the first GPU, else the CPU.
    #[arg(long, value_name = "SPEC")]
    pub backend: Option<String>,
    /// Where weights are kept between uses, e.g. `cpu`, `disk` or `diffusion=disk,clip=cpu`:
    /// kept off the computing device, they are copied there for each use and dropped after.
    #[arg(long, value_name = "SPEC")]
    pub params_backend: Option<String>,
    /// Keep the weights in RAM and copy them to VRAM when needed (`--params-backend cpu`).
    #[arg(long)]
    pub offload_to_cpu: bool,
    /// Deprecated; use --backend te=cpu.
    #[arg(long)]
    pub clip_on_cpu: bool,
    /// Deprecated; use --backend vae=cpu.
    #[arg(long)]
    pub vae_on_cpu: bool,
    /// Deprecated; use --backend controlnet=cpu.
    #[arg(long)]
    pub control_net_cpu: bool,
    /// Weight budget in GiB per GPU, e.g. `6` or `cuda0=6,vulkan0=4`; `0` for none; a
    /// negative value is the device's free memory less that much. Least recently used
    /// weights are dropped to stay within it.
    #[arg(long, value_name = "GIB", allow_hyphen_values = true)]
    pub max_vram: Option<String>,
    /// Use flash attention (ggml's fused kernel at every sequence length).
    #[arg(long)]
    pub fa: bool,
    /// Use flash attention in the diffusion model only.
    #[arg(long)]
    pub diffusion_fa: bool,
    /// Use ggml_conv_2d_direct in the diffusion model.
    #[arg(long)]
    pub diffusion_conv_direct: bool,
    /// Use ggml_conv_2d_direct in the VAE.
    #[arg(long)]
    pub vae_conv_direct: bool,
    /// List the devices ggml can use (`name<TAB>description` per line) and exit; the names
    /// are what --backend and --params-backend take.
    #[arg(long)]
    pub list_devices: bool,
}

impl PlacementArgs {
    pub fn spec(&self) -> sdflow_core::placement::PlacementSpec {
        sdflow_core::placement::PlacementSpec {
            backend: self.backend.clone(),
            params_backend: self.params_backend.clone(),
            offload_to_cpu: self.offload_to_cpu,
            clip_on_cpu: self.clip_on_cpu,
            vae_on_cpu: self.vae_on_cpu,
            control_net_cpu: self.control_net_cpu,
            max_vram: self.max_vram.clone(),
            flash_attn: self.fa,
            diffusion_flash_attn: self.diffusion_fa,
            diffusion_conv_direct: self.diffusion_conv_direct,
            vae_conv_direct: self.vae_conv_direct,
        }
    }

    /// The placement these flags ask for on this machine's devices.
    pub fn resolve(&self) -> anyhow::Result<sdflow_core::placement::Placement> {
        let devices = sdflow_core::ggml::devices();
        let p = sdflow_core::placement::Placement::resolve(&self.spec(), &devices)?;
        tracing::info!(placement = %p.describe(&devices), "modules placed");
        Ok(p)
    }

    /// With `--list-devices`: print the devices and say so (the caller exits).
    pub fn list_devices(&self) -> bool {
        if self.list_devices {
            print!("{}", device_list());
        }
        self.list_devices
    }
}

/// sd-cli's `--list-devices` output: `name<TAB>description` per device.
pub fn device_list() -> String {
    sdflow_core::ggml::devices().iter().map(|d| format!("{}\t{}\n", d.name, d.description)).collect()
}

/// `--type`: what model weights are converted to at load.
#[derive(Args, Clone, Debug, Default)]
pub struct WeightTypeArg {
    /// Weight type: `auto` (the default) converts float weights to bf16 where the CPU has
    /// AVX-512 BF16 or AMX, our fastest kernels there (quantized files keep their types),
    /// and keeps each file's types elsewhere; `stored` keeps them everywhere; a type name
    /// (f32, f16, bf16, q8_0, q4_0, q4_K, ...) converts every weight to it, as sd-cli's
    /// `--type` does.
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_weight_type)]
    pub wtype: Option<WeightType>,
}

impl WeightTypeArg {
    /// The type asked for, or this CPU's pick.
    pub fn resolve(&self) -> WeightType {
        self.wtype.unwrap_or_else(WeightType::for_cpu)
    }
}

fn parse_weight_type(s: &str) -> Result<WeightType, String> {
    s.parse().map_err(|e: sdflow_core::dtype::UnknownDType| format!("invalid weight type {s}: {e}; or auto, stored"))
}

/// The node types `sdflow run` and `sdflow serve` offer (every real node, plus the
/// executor's stub pack, handy for trying the engine without a model), with the runtime
/// their nodes share (the server reports its residency manager and lists its model
/// folders). Weights load as `weight_type`, modules compute where `placement` says.
pub fn registry(models_dir: &Path, output_dir: &Path, input_dir: &Path, threads: Option<usize>, weight_type: WeightType, placement: sdflow_core::placement::Placement) -> anyhow::Result<(Registry, Arc<sdflow_nodes::Runtime>)> {
    registry_with(models_dir, output_dir, input_dir, threads, weight_type, placement, |rt| rt)
}

/// [`registry`], with `configure` setting the runtime's other options (previews).
pub fn registry_with(models_dir: &Path, output_dir: &Path, input_dir: &Path, threads: Option<usize>, weight_type: WeightType, placement: sdflow_core::placement::Placement, configure: impl FnOnce(sdflow_nodes::Runtime) -> sdflow_nodes::Runtime) -> anyhow::Result<(Registry, Arc<sdflow_nodes::Runtime>)> {
    let mut registry = Registry::new();
    sdflow_executor::stub::register(&mut registry);
    let threads = threads.unwrap_or_else(sdflow_core::ggml::default_threads);
    let rt = sdflow_nodes::Runtime::new(models_dir, output_dir, threads, weight_type).context("starting the compute backend")?;
    let rt = rt.with_placement(placement).context("starting the devices the placement uses")?;
    let rt = Arc::new(configure(rt.with_input_dir(input_dir)));
    tracing::info!(%weight_type, "weights load as");
    sdflow_nodes::register_all(&mut registry, rt.clone());
    Ok((registry, rt))
}

pub fn run_command(args: RunArgs) -> anyhow::Result<()> {
    if args.placement.list_devices() {
        return Ok(());
    }
    let out_dir = args.output_dir.clone().unwrap_or_else(|| PathBuf::from("output"));
    let registry = Arc::new(registry(&args.models_dir, &out_dir, &args.input_dir, args.threads, args.weight_type.resolve(), args.placement.resolve()?)?.0);
    let mut workflows = Vec::with_capacity(args.workflows.len());
    for path in &args.workflows {
        let mut wf = load(path, &registry)?;
        for s in &args.set {
            apply_override(&mut wf, &registry, s).with_context(|| path.display().to_string())?;
        }
        workflows.push((path.display().to_string(), wf));
    }
    let session = Session { output_dir: args.output_dir.clone(), json_events: args.json_events, workers: args.workers, repeat: args.repeat, preview: None, models_dir: Some(args.models_dir.clone()) };
    execute(registry, &workflows, &session)?;
    Ok(())
}

/// How [`execute`] runs its workflows.
pub struct Session {
    /// Where output nodes write (created if missing); `None`: the runtime's default.
    pub output_dir: Option<PathBuf>,
    /// Events as JSON lines on stdout instead of progress bars.
    pub json_events: bool,
    pub workers: Option<usize>,
    /// Runs of each workflow.
    pub repeat: usize,
    /// Write sampler previews to a file (sd-cli's `--preview-path`).
    pub preview: Option<PreviewFile>,
    /// The `--models-dir` the workflows' model names are looked up in, for the hint after a
    /// name that is not there; `None` where sdflow chose the files itself (presets).
    pub models_dir: Option<PathBuf>,
}

/// sd-cli's `--preview-path` and `--preview-interval`: every `interval`-th preview of a
/// node overwrites `path` (PNG, or the JPEG as sent for a `.jpg` path).
#[derive(Clone, Debug)]
pub struct PreviewFile {
    pub path: PathBuf,
    pub interval: u32,
}

/// The format a preview file is written in, by its extension: PNG or JPEG, nothing else.
pub fn preview_format(path: &Path) -> Option<image::ImageFormat> {
    image::ImageFormat::from_path(path).ok().filter(|f| matches!(f, image::ImageFormat::Png | image::ImageFormat::Jpeg))
}

impl PreviewFile {
    fn write(&self, image: &sdflow_executor::PreviewImage) -> anyhow::Result<()> {
        use sdflow_executor::PreviewFormat;
        let jpeg_path = preview_format(&self.path).context("previews are written as .png or .jpg")? == image::ImageFormat::Jpeg;
        let bytes: Vec<u8> = match image.format {
            PreviewFormat::Jpeg if jpeg_path => image.data.to_vec(),
            PreviewFormat::Png if !jpeg_path => image.data.to_vec(),
            _ => {
                let img = match image.format {
                    PreviewFormat::Rgb8 => image::RgbImage::from_raw(image.width, image.height, image.data.to_vec()).map(image::DynamicImage::ImageRgb8).context("a preview with the wrong pixel count")?,
                    _ => image::load_from_memory(&image.data).context("decoding a preview")?,
                };
                let mut out = std::io::Cursor::new(Vec::new());
                img.write_to(&mut out, if jpeg_path { image::ImageFormat::Jpeg } else { image::ImageFormat::Png })?;
                out.into_inner()
            }
        };
        // Written beside and renamed, so a viewer never reads half a file.
        let tmp = self.path.with_extension("part");
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Passes every event on, and writes the sampler previews to the preview file.
struct PreviewWriter<'a> {
    inner: &'a dyn EventSink,
    file: PreviewFile,
    seen: Mutex<HashMap<String, u32>>,
    warned: std::sync::atomic::AtomicBool,
}

impl EventSink for PreviewWriter<'_> {
    fn send(&self, event: Event) {
        if let Event::Preview { node, image, .. } = &event {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let n = seen.entry(node.clone()).or_insert(0);
            *n += 1;
            if n.is_multiple_of(self.file.interval.max(1)) {
                if let Err(e) = self.file.write(image) {
                    // A preview is not worth failing a generation for; say it once.
                    if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::warn!("preview not written: {e:#}");
                    }
                }
            }
        }
        self.inner.send(event);
    }
}

/// Validates every workflow (all before any runs, each failure with its full report),
/// then runs them in one executor with progress bars and a per-node summary, Ctrl-C
/// cancelling. Returns the report of each run, in order. `sdflow run` and the sd-cli
/// presets both run through here.
pub fn execute(registry: Arc<Registry>, workflows: &[(String, Workflow)], session: &Session) -> anyhow::Result<Vec<RunReport>> {
    if let Some(dir) = &session.output_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating output directory {}", dir.display()))?;
    }
    let mut config = ExecutorConfig::default();
    if let Some(w) = session.workers {
        config.workers = w.max(1);
    }
    let executor = Executor::new(registry, config);
    // Everything is validated before anything runs.
    let mut plans = Vec::with_capacity(workflows.len());
    let mut invalid = false;
    for (label, wf) in workflows {
        match executor.validate(wf) {
            Ok(plan) => plans.push(plan),
            Err(report) => {
                if session.json_events {
                    println!("{}", report.to_json());
                }
                eprint!("{label}: {}", report.render());
                if let Some(hint) = session.models_dir.as_deref().and_then(|dir| missing_model_hint(&report, dir)) {
                    eprintln!("{hint}");
                }
                invalid = true;
            }
        }
    }
    if invalid {
        bail!("the workflow failed validation");
    }

    // Ctrl-C cancels the run in progress (each run has its own token) and stops.
    let current = Arc::new(Mutex::new(CancelToken::new()));
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (current, stopping) = (current.clone(), stopping.clone());
        ctrlc::set_handler(move || {
            stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            current.lock().unwrap_or_else(|e| e.into_inner()).cancel();
        })
        .context("installing the Ctrl-C handler")?;
    }
    let mut reports = Vec::new();
    for _ in 0..session.repeat.max(1) {
        for ((label, wf), plan) in workflows.iter().zip(&plans) {
            let options = RunOptions {
                run_id: None,
                output_dir: session.output_dir.clone(),
                metadata: sdflow_workflows::metadata::png_metadata(wf, executor.registry()),
                image_metadata: sdflow_workflows::metadata::per_image_metadata(wf),
            };
            if workflows.len() > 1 || session.repeat > 1 {
                let line = format!("== {label}");
                if session.json_events {
                    eprintln!("{line}")
                } else {
                    println!("{line}")
                }
            }
            let cancel = CancelToken::new();
            *current.lock().unwrap_or_else(|e| e.into_inner()) = cancel.clone();
            // Checked after the swap, so a Ctrl-C just before it is not lost.
            if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                bail!("interrupted");
            }
            reports.push(run_one(&executor, wf, plan, &options, &cancel, session)?);
        }
    }
    Ok(reports)
}

/// File name endings of model weights (a list choice with one is a file in a model folder).
const MODEL_EXTENSIONS: [&str; 7] = [".safetensors", ".ckpt", ".gguf", ".pt", ".pth", ".bin", ".sft"];

/// What to do about list values naming model files that are not there: the report says
/// what the folder holds, not where that folder is or how to pick another file.
fn missing_model_hint(report: &sdflow_executor::ValidationReport, models_dir: &Path) -> Option<String> {
    let missing: Vec<(&str, &str, &str)> = report
        .errors()
        .filter(|(_, e)| e.kind == sdflow_executor::ErrorKind::ValueNotInList)
        .filter_map(|(node, e)| {
            let value = e.extra_info.get("received_value")?.as_str()?;
            let lower = value.to_lowercase();
            MODEL_EXTENSIONS.iter().any(|x| lower.ends_with(x)).then_some((node, e.input_name()?, value))
        })
        .collect();
    let (node, input, value) = *missing.first()?;
    Some(format!(
        "hint: model files are looked up in {} (--models-dir); put {value} there, or run with one listed above, e.g. --set {node}.{input}=NAME",
        models_dir.display()
    ))
}

fn run_one(
    executor: &Executor,
    wf: &Workflow,
    plan: &sdflow_executor::Plan,
    options: &RunOptions,
    cancel: &CancelToken,
    session: &Session,
) -> anyhow::Result<RunReport> {
    let json_events = session.json_events;
    let run = |sink: &dyn EventSink| match &session.preview {
        Some(file) => executor.run_plan(plan, &PreviewWriter { inner: sink, file: file.clone(), seen: Mutex::default(), warned: Default::default() }, cancel, options),
        None => executor.run_plan(plan, sink, cancel, options),
    };
    let result = if json_events {
        run(&JsonLines)
    } else {
        let sink = ProgressSink::default();
        let r = run(&sink);
        sink.clear();
        r
    };
    let titles: HashMap<&str, &str> = wf
        .nodes
        .iter()
        .filter_map(|(id, n)| n.title.as_deref().map(|t| (id.as_str(), t)))
        .collect();
    let order: Vec<&str> = plan.node_ids().collect();
    let print_table = |report: &RunReport, stopped: Option<(&str, &str)>| {
        let text = table(report, &order, wf, &titles, stopped);
        // Events already went to stdout as JSON; keep it machine-readable.
        if json_events {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    };
    match result {
        Ok(report) => {
            print_table(&report, None);
            Ok(report)
        }
        Err(RunError::NodeFailed {
            node_id,
            class_type,
            error,
            report,
        }) => {
            print_table(&report, Some((&node_id, "failed")));
            bail!("node {node_id} ({class_type}) failed: {error}")
        }
        Err(RunError::Interrupted { report, node_id }) => {
            print_table(&report, node_id.as_deref().map(|n| (n, "interrupted")));
            bail!("the run was interrupted")
        }
        Err(RunError::Invalid(report)) => bail!("{}", report.render()),
    }
}

fn duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

fn load(path: &Path, registry: &Registry) -> anyhow::Result<Workflow> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    // An image saved by sdflow or ComfyUI carries its graph: the API-format `prompt`
    // (every input's value) is preferred over the UI-format `workflow`.
    let text = match sdflow_workflows::metadata::parse_metadata(&bytes) {
        Ok(meta) => {
            let entry = |key: &str| meta.entries.iter().find(|e| e.key == key).map(|e| e.text.clone());
            entry("prompt").or_else(|| entry("workflow")).with_context(|| format!("{}: the image carries no workflow (no `prompt` or `workflow` text)", path.display()))?
        }
        Err(sdflow_workflows::metadata::MetadataError::Unrecognized) => String::from_utf8(bytes).with_context(|| format!("{}: neither a workflow (UTF-8 JSON) nor an image", path.display()))?,
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
    };
    Workflow::parse(&text, registry).map_err(|e| match e {
        WorkflowError::Json {
            line,
            column,
            message,
        } => {
            anyhow::anyhow!(
                "{}:{line}:{column}: malformed JSON: {message}",
                path.display()
            )
        }
        other => anyhow::anyhow!("{}: {other}", path.display()),
    })
}

fn apply_override(wf: &mut Workflow, registry: &Registry, spec: &str) -> anyhow::Result<()> {
    let (target, value) = spec
        .split_once('=')
        .with_context(|| format!("--set {spec:?}: expected NODE.INPUT=VALUE"))?;
    let (node, input) = target
        .split_once('.')
        .with_context(|| format!("--set {spec:?}: expected NODE.INPUT before '='"))?;
    let Some(node_spec) = wf.nodes.get(node) else {
        let ids: Vec<&str> = wf.nodes.keys().map(String::as_str).collect();
        bail!(
            "--set {spec:?}: no node '{node}' in the workflow (nodes: {})",
            ids.join(", ")
        );
    };
    if let Some(schema) = registry.schema(&node_spec.class_type) {
        if schema.find_input(input).is_none() {
            let names: Vec<&str> = schema.inputs.iter().map(|i| i.name.as_str()).collect();
            bail!(
                "--set {spec:?}: node {node} ({}) has no input '{input}' (inputs: {})",
                node_spec.class_type,
                names.join(", ")
            );
        }
    }
    let json = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    wf.set_input(node, input, InputValue::from_json(json))?;
    Ok(())
}

fn table(
    report: &RunReport,
    order: &[&str],
    wf: &Workflow,
    titles: &HashMap<&str, &str>,
    stopped: Option<(&str, &str)>,
) -> String {
    let times: HashMap<&str, Duration> = report
        .executed
        .iter()
        .map(|t| (t.node.as_str(), t.duration))
        .collect();
    let cached: std::collections::HashSet<&str> =
        report.cached.iter().map(String::as_str).collect();
    let mut rows = vec![(
        "node".to_string(),
        "class".to_string(),
        "status".to_string(),
        "time".to_string(),
    )];
    for &id in order {
        let class = wf
            .nodes
            .get(id)
            .map(|n| n.class_type.as_str())
            .unwrap_or("?");
        let name = match titles.get(id) {
            Some(t) => format!("{id} \"{t}\""),
            None => id.to_string(),
        };
        let (status, time) = match times.get(id) {
            Some(d) => ("ran", duration(*d)),
            None if cached.contains(id) => ("cached", "-".to_string()),
            None if stopped.is_some_and(|s| s.0 == id) => {
                (stopped.map_or("", |s| s.1), "-".to_string())
            }
            None => ("not run", "-".to_string()),
        };
        rows.push((name, class.to_string(), status.to_string(), time));
    }
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    let w2 = rows.iter().map(|r| r.2.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (a, b, c, d) in &rows {
        out.push_str(&format!("{a:<w0$}  {b:<w1$}  {c:<w2$}  {d:>10}\n"));
    }
    out.push_str(&format!(
        "run {}: {} ran, {} cached, {} total ({} planning)\n",
        report.run_id,
        report.executed.len(),
        report.cached.len(),
        duration(report.total),
        duration(report.planning),
    ));
    for (node, ui) in &report.ui_outputs {
        out.push_str(&format!("output of node {node}: {ui}\n"));
    }
    out
}

struct JsonLines;

impl EventSink for JsonLines {
    fn send(&self, event: Event) {
        if let Ok(line) = serde_json::to_string(&event) {
            let mut out = std::io::stdout().lock();
            // A closed stdout (piped into `head`) must not abort the run.
            let _ = writeln!(out, "{line}");
        }
    }
}

/// Steps done, speed and time left, as sd-cli and tqdm show them: `s/it` once a step
/// takes more than a second (a UNet step on the CPU), `it/s` below. The speed and time
/// left are [`Bar::speed`]'s, in the message.
fn step_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn rate(per_sec: f64) -> String {
    if per_sec > 0.0 && per_sec < 1.0 {
        format!("{:.2}s/it", 1.0 / per_sec)
    } else {
        format!("{per_sec:.2}it/s")
    }
}

/// Progress bars for nodes that report progress, one per running node.
#[derive(Default)]
struct ProgressSink {
    multi: MultiProgress,
    bars: Mutex<HashMap<String, Bar>>,
}

/// One node's bar, and its first report: the bar is born at the first report, so it never
/// saw that step start — timed from its birth, that step would read as thousands of steps
/// per second. Speed and time left count from the first report on.
struct Bar {
    bar: ProgressBar,
    first: (u64, Instant),
}

impl Bar {
    /// The message after `value` of `max` steps: speed and time left, or `-` for both
    /// before a second report.
    fn speed(&self, value: u64, max: u64, now: Instant) -> String {
        let (v0, t0) = self.first;
        let secs = now.duration_since(t0).as_secs_f64();
        if value <= v0 || secs <= 0.0 {
            return "-s/it ETA -".to_string();
        }
        let per_step = secs / (value - v0) as f64;
        let left = (per_step * max.saturating_sub(value) as f64).round() as u64;
        let eta = if left < 120 { format!("{left}s") } else { format!("{}m", (left + 30) / 60) };
        format!("{} ETA {eta}", rate(1.0 / per_step))
    }
}

impl ProgressSink {
    fn clear(&self) {
        let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
        for (_, b) in bars.drain() {
            b.bar.finish_and_clear();
        }
    }
}

impl EventSink for ProgressSink {
    fn send(&self, event: Event) {
        let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
        if let Event::Progress {
            node, value, max, ..
        } = event
        {
            let now = Instant::now();
            let b = bars.entry(node.clone()).or_insert_with(|| {
                let bar = self.multi.add(ProgressBar::new(max));
                bar.set_style(step_style());
                bar.set_prefix(format!("node {node}"));
                Bar { bar, first: (value, now) }
            });
            b.bar.set_length(max);
            b.bar.set_message(b.speed(value, max, now));
            b.bar.set_position(value);
            if value >= max {
                if let Some(b) = bars.remove(&node) {
                    b.bar.finish_and_clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal that keeps what is drawn on it.
    #[derive(Debug, Default, Clone)]
    struct Screen(Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            let mut t = self.0.lock().unwrap();
            t.push_str(s);
            t.push('\n');
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_step_bar_shows_speed_and_time_left() {
        let screen = Screen::default();
        let sink = ProgressSink {
            multi: MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::term_like(Box::new(screen.clone()))),
            bars: Mutex::default(),
        };
        for value in 1..=4 {
            std::thread::sleep(Duration::from_millis(30));
            sink.send(Event::Progress { prompt_id: "p".into(), node: "5".into(), value, max: 20 });
            if value == 1 {
                // The first step's start was not seen: no rate yet (not 1 step in ~0 s).
                let drawn = screen.0.lock().unwrap().clone();
                let first = drawn.rsplit("node 5").find(|l| l.contains("1/20")).unwrap_or_else(|| panic!("no 1/20 step in {drawn:?}"));
                assert!(first.contains("-s/it ETA -"), "{first}");
            }
        }
        let drawn = screen.0.lock().unwrap().clone();
        // Each redraw starts with the bar's prefix; the last one shows step 4.
        let line = drawn.rsplit("node 5").find(|l| l.contains("4/20")).unwrap_or_else(|| panic!("no 4/20 step in {drawn:?}"));
        let speed: f64 = line.split_whitespace().find_map(|w| w.strip_suffix("it/s")).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no it/s in {line}"));
        assert!(speed > 0.0 && speed.is_finite(), "{line}");
        let eta = line.split_once("ETA ").map(|(_, rest)| rest.split_whitespace().next().unwrap_or("")).unwrap_or_else(|| panic!("no ETA in {line}"));
        assert!(eta.ends_with(['s', 'm']) && eta[..eta.len() - 1].parse::<u32>().is_ok(), "{line}");
    }

    #[test]
    fn slow_steps_read_as_seconds_per_step() {
        assert_eq!(rate(0.25), "4.00s/it");
        assert_eq!(rate(2.5), "2.50it/s");
        assert_eq!(rate(0.0), "0.00it/s");
    }
}
