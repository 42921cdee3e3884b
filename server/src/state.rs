//! What every handler shares, and the worker that runs queued prompts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use sdflow_executor::{CancelToken, Event, EventSink, Executor, Plan, RunError, RunOptions};
use serde_json::{json, Map, Value as Json};

use crate::error::ApiError;
use crate::history::History;
use crate::queue::{Job, JobQueue, Spec};
use crate::store::{HistoryStore, Queue};
use crate::ws::Hub;

/// Everything `sdflow serve` can be told.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: IpAddr,
    /// 0 picks a free port (tests).
    pub port: u16,
    pub models_dir: PathBuf,
    pub input_dir: PathBuf,
    pub output_dir: PathBuf,
    /// Where `type=temp` files live (PreviewImage writes to `<output>/temp`).
    pub temp_dir: PathBuf,
    pub history_dir: PathBuf,
    /// Scale-out mode: prompts go to this Redis (`redis://` or `rediss://` URL) for
    /// `sdflow worker`s to run, and the history lives there; `None` runs them here.
    pub queue_url: Option<String>,
    /// Scale-out: outputs are in this S3-compatible store (`s3://bucket/prefix`), where
    /// the workers put them, rather than in `output_dir`.
    pub output_store: Option<String>,
    pub max_queue: usize,
    pub max_history: usize,
    /// Browser origins allowed besides the server's own (`*` for any); CORS headers are
    /// sent to these.
    pub cors_origins: Vec<String>,
    /// Host names (`Host` header values, port ignored) served besides loopback names and
    /// the listen address. On loopback other hosts are always refused (DNS rebinding);
    /// beyond loopback they are refused only when this is non-empty.
    pub allowed_hosts: Vec<String>,
    /// When set, every request needs `Authorization: Bearer TOKEN` (or `?token=TOKEN`).
    pub auth_token: Option<String>,
    pub max_body_bytes: usize,
    /// The checkpoint (a name in `checkpoints/`) A1111 and OpenAI requests use when they
    /// name none: sd-server's `-m`.
    pub default_checkpoint: Option<String>,
    /// Per-user storage (settings, saved workflows) of ComfyUI's frontend:
    /// `<user_dir>/default/`.
    pub user_dir: PathBuf,
    /// What A1111 and OpenAI requests start from: sd-server's command line (its model
    /// files as names in their folders, and its generation defaults); a request's own
    /// fields win.
    pub sdapi_defaults: sdflow_workflows::presets::ImgGenParams,
    /// What sd-server's video jobs start from: its `--high-noise-diffusion-model` (Wan2.2's
    /// expert, with sd-cli's defaults for its steps and CFG) and sdflow's `--motion-module`
    /// (the AnimateDiff module an SD checkpoint animates with).
    pub video_defaults: sdflow_workflows::presets::VideoParams,
    /// A web frontend served instead of the embedded editor: ComfyUI's own
    /// (`comfyui-frontend-package`'s static folder), as ComfyUI's `--front-end-root`.
    pub front_end_root: Option<PathBuf>,
}

impl ServerConfig {
    /// Defaults under one base folder: `models/`, `input/`, `output/`, `output/temp`,
    /// `output/history`.
    pub fn with_base(base: &Path) -> Self {
        let output = base.join("output");
        ServerConfig {
            listen: IpAddr::from([127, 0, 0, 1]),
            port: 8188,
            models_dir: base.join("models"),
            input_dir: base.join("input"),
            temp_dir: output.join("temp"),
            history_dir: output.join("history"),
            output_dir: output,
            queue_url: None,
            output_store: None,
            max_queue: 1000,
            max_history: 10_000,
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            auth_token: None,
            max_body_bytes: 100 << 20,
            default_checkpoint: None,
            user_dir: base.join("user"),
            sdapi_defaults: Default::default(),
            video_defaults: Default::default(),
            front_end_root: None,
        }
    }
}

/// The folders files are served from and uploaded to, canonical so confinement checks
/// compare real paths.
pub struct Dirs {
    pub input: PathBuf,
    pub output: PathBuf,
    pub temp: PathBuf,
    /// Not created until something is stored (ComfyUI's `migrated` tells whether it is).
    pub user: PathBuf,
}

impl Dirs {
    pub fn by_type(&self, kind: &str) -> Result<&Path, ApiError> {
        match kind {
            "input" => Ok(&self.input),
            "output" => Ok(&self.output),
            "temp" => Ok(&self.temp),
            other => Err(ApiError::bad(format!(
                "type `{other}` is not one of input, output, temp"
            ))),
        }
    }
}

pub struct AppState {
    pub config: ServerConfig,
    pub executor: Arc<Executor>,
    pub runtime: Arc<sdflow_nodes::Runtime>,
    pub queue: Queue,
    pub history: HistoryStore,
    pub hub: Hub,
    pub dirs: Dirs,
    pub started: std::time::Instant,
    /// The prompt running now, as A1111's `/sdapi/v1/progress` reports it.
    pub live: Mutex<Live>,
    /// A1111's `/sdapi/v1/options` that sdflow keeps: the model its requests use when
    /// they name none, and its CLIP skip.
    pub sdapi_options: Mutex<SdapiOptions>,
    /// Serialises read-modify-write of the user's settings and files.
    pub user_lock: Mutex<()>,
    /// Scale-out's `--output-store`: where `/view` reads outputs from.
    pub objects: Option<Arc<crate::scale_out::objects::ObjectStore>>,
    /// The resolved `--front-end-root` (the folder holding `index.html`).
    pub front_end_root: Option<Arc<PathBuf>>,
    /// The jobs of sd-server's native async API (`/sdcpp/v1/*`).
    pub sdcpp_jobs: crate::sdapi::sdcpp_jobs::SdcppJobs,
}

/// The running prompt's progress: its latest sampler step and preview.
#[derive(Default)]
pub struct Live {
    pub prompt_id: Option<String>,
    pub started: Option<std::time::Instant>,
    /// The last `Progress` event: (step, steps).
    pub step: Option<(u64, u64)>,
    pub preview: Option<sdflow_executor::PreviewImage>,
}

#[derive(Default, Clone)]
pub struct SdapiOptions {
    pub checkpoint: Option<String>,
    pub clip_skip: Option<i64>,
}

impl AppState {
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.queue.push(job)?;
        self.broadcast_status();
        Ok(())
    }

    /// Tells every WebSocket client how many prompts remain (after the queue changed).
    pub fn broadcast_status(&self) {
        match self.queue.remaining() {
            Ok(n) => self.hub.status(n),
            Err(e) => tracing::warn!("queue status not sent: {e}"),
        }
    }
}

/// Where a running prompt's events go: this process's WebSocket [`Hub`], or Redis in
/// scale-out mode (every front end forwards them to its clients).
pub trait EventOut: Sync {
    /// A ComfyUI message `{"type": kind, "data": data}` for `target` (everyone when `None`).
    fn json(&self, target: Option<&str>, kind: &str, data: Json);
    fn preview(&self, target: Option<&str>, source: crate::ws::PreviewSource, image: sdflow_executor::PreviewImage);
}

impl EventOut for Hub {
    fn json(&self, target: Option<&str>, kind: &str, data: Json) {
        self.send_json(target, kind, data);
    }

    fn preview(&self, target: Option<&str>, source: crate::ws::PreviewSource, image: sdflow_executor::PreviewImage) {
        self.send_preview(target, source, image);
    }
}

/// Forwards one prompt's events to its WebSocket client and keeps the ones ComfyUI's
/// history records under `status.messages`.
///
/// The events that end a run (`executing: null`, `execution_success`, `_error`,
/// `_interrupted`) are held back until the history entry is stored: clients fetch
/// `/history/{id}` as soon as they see them.
struct PromptSink<'a> {
    out: &'a dyn EventOut,
    /// Hold `executed` back too (its file names change when outputs move to an object
    /// store).
    defer_executed: bool,
    live: &'a Mutex<Live>,
    target: Option<&'a str>,
    messages: Mutex<Vec<Json>>,
    deferred: Mutex<Vec<(&'static str, Json)>>,
}

impl EventSink for PromptSink<'_> {
    fn send(&self, event: Event) {
        if let Event::Preview { prompt_id, node, image } = event {
            self.live.lock().preview = Some(image.clone());
            self.out.preview(self.target, crate::ws::PreviewSource { prompt_id, node }, image);
            return;
        }
        if let Event::Progress { value, max, .. } = &event {
            self.live.lock().step = Some((*value, *max));
        }
        let kind = event.kind();
        let data = match serde_json::to_value(&event) {
            Ok(mut v) => v.get_mut("data").map(Json::take).unwrap_or(Json::Null),
            Err(e) => {
                tracing::warn!("event {kind} not serializable: {e}");
                return;
            }
        };
        let data = match &event {
            // ComfyUI names the node twice; clients read either.
            Event::Executing { node, .. } => {
                let mut d = data;
                d["display_node"] = json!(node);
                d
            }
            _ => data,
        };
        if matches!(
            event,
            Event::ExecutionStart { .. }
                | Event::ExecutionCached { .. }
                | Event::ExecutionSuccess { .. }
                | Event::ExecutionError { .. }
                | Event::ExecutionInterrupted { .. }
        ) {
            self.messages.lock().push(json!([kind, data.clone()]));
        }
        let last = matches!(
            event,
            Event::Executing { node: None, .. }
                | Event::ExecutionSuccess { .. }
                | Event::ExecutionError { .. }
                | Event::ExecutionInterrupted { .. }
        ) || (self.defer_executed && matches!(event, Event::Executed { .. }));
        if last {
            self.deferred.lock().push((kind, data));
        } else {
            self.out.json(self.target, kind, data);
        }
    }
}

/// A prompt that ran: its history entry, and the events that end it, to be sent once the
/// entry is stored.
pub struct Ran {
    pub entry: Json,
    pub deferred: Vec<(&'static str, Json)>,
    /// Stopped by its cancel token before it finished.
    pub interrupted: bool,
}

impl Ran {
    /// Sends the held-back events that end the run (after its history entry is stored).
    pub fn flush(&mut self, out: &dyn EventOut, target: Option<&str>) {
        for (kind, data) in self.deferred.drain(..) {
            out.json(target, kind, data);
        }
    }
}

/// Runs one prompt and builds its history entry, as ComfyUI records it; the same for the
/// local worker thread and for scale-out workers. `plan` is `Err` with the reason when the
/// prompt no longer validates (a scale-out worker compiles it again with its own models).
pub fn run_job(
    executor: &Executor,
    out: &dyn EventOut,
    live: &Mutex<Live>,
    spec: &Spec,
    plan: Result<&Plan, String>,
    cancel: &CancelToken,
    output_dir: &Path,
    defer_executed: bool,
) -> Ran {
    *live.lock() = Live { prompt_id: Some(spec.prompt_id.clone()), started: Some(std::time::Instant::now()), step: None, preview: None };
    let sink = PromptSink {
        out,
        defer_executed,
        live,
        target: spec.client_id.as_deref(),
        messages: Mutex::new(Vec::new()),
        deferred: Mutex::new(Vec::new()),
    };
    let options = RunOptions {
        run_id: Some(spec.prompt_id.clone()),
        output_dir: Some(output_dir.to_path_buf()),
        metadata: spec.metadata.clone(),
        image_metadata: spec.image_metadata.clone(),
    };
    let started = std::time::Instant::now();
    let result = plan.map(|plan| executor.run_plan(plan, &sink, cancel, &options));
    let secs = started.elapsed().as_secs_f64();
    // One line per prompt, as ComfyUI's console has it.
    let invalid = match &result {
        Ok(Ok(_)) => {
            tracing::info!("prompt {} executed in {secs:.2} seconds", spec.prompt_id);
            None
        }
        Ok(Err(RunError::NodeFailed { node_id, class_type, error, .. })) => {
            tracing::warn!("prompt {} failed after {secs:.2} seconds at node {node_id} ({class_type}): {error}", spec.prompt_id);
            None
        }
        Ok(Err(RunError::Interrupted { .. })) => {
            tracing::info!("prompt {} interrupted after {secs:.2} seconds", spec.prompt_id);
            None
        }
        Ok(Err(RunError::Invalid(report))) => Some(report.to_string()),
        Err(reason) => Some(reason.clone()),
    };
    let (outputs, ok) = match &result {
        Ok(Ok(report)) => (report.ui_outputs.clone(), true),
        Ok(Err(RunError::NodeFailed { report, .. })) | Ok(Err(RunError::Interrupted { report, .. })) => (report.ui_outputs.clone(), false),
        _ => (Default::default(), false),
    };
    if let Some(reason) = invalid {
        // Validated when queued; a registry whose schemas changed since (or a scale-out
        // worker without the prompt's models) can still reject it.
        tracing::warn!("prompt {} no longer validates: {reason}", spec.prompt_id);
        sink.messages.lock().push(json!(["execution_error", {
            "prompt_id": spec.prompt_id,
            "exception_type": "ValidationError",
            "exception_message": reason,
        }]));
    }
    if !ok {
        // ComfyUI ends every run with `executing: null`; the executor sends it only
        // after a success.
        sink.send(Event::Executing {
            prompt_id: spec.prompt_id.clone(),
            node: None,
        });
    }
    let mut outputs_json = Map::new();
    let mut meta = Map::new();
    for (node, ui) in outputs {
        meta.insert(
            node.clone(),
            json!({ "node_id": node, "display_node": node, "parent_node": null, "real_node_id": node }),
        );
        outputs_json.insert(node, ui);
    }
    let entry = json!({
        "prompt": spec.queue_item(),
        "outputs": outputs_json,
        "status": {
            "status_str": if ok { "success" } else { "error" },
            "completed": ok,
            "messages": std::mem::take(&mut *sink.messages.lock()),
        },
        "meta": meta,
    });
    let deferred = std::mem::take(&mut *sink.deferred.lock());
    Ran { entry, deferred, interrupted: matches!(result, Ok(Err(RunError::Interrupted { .. }))) }
}

/// The worker loop of the single-machine mode: one prompt at a time until the queue closes.
pub fn worker(state: Arc<AppState>, queue: &JobQueue, history: &History) {
    while let Some((job, cancel)) = queue.take() {
        let mut ran = run_job(&state.executor, &state.hub, &state.live, &job.spec, Ok(&job.plan), &cancel, &state.config.output_dir, false);
        if let Err(e) = history.insert(&job.spec.prompt_id, ran.entry.clone()) {
            tracing::error!("prompt {}: history not saved: {e}", job.spec.prompt_id);
        }
        queue.finish();
        *state.live.lock() = Live::default();
        ran.flush(&state.hub, job.spec.client_id.as_deref());
        state.hub.status(queue.remaining());
        if let Some(done) = job.done {
            let _ = done.send(Arc::new(ran.entry));
        }
    }
}
