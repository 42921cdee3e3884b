//! What every handler shares, and the worker that runs queued prompts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use sdflow_executor::{Event, EventSink, Executor, RunError, RunOptions};
use serde_json::{json, Map, Value as Json};

use crate::error::ApiError;
use crate::history::History;
use crate::queue::{Job, JobQueue};
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
            max_queue: 1000,
            max_history: 10_000,
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            auth_token: None,
            max_body_bytes: 100 << 20,
            default_checkpoint: None,
            user_dir: base.join("user"),
            sdapi_defaults: Default::default(),
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
    pub queue: JobQueue,
    pub history: History,
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
    /// The resolved `--front-end-root` (the folder holding `index.html`).
    pub front_end_root: Option<Arc<PathBuf>>,
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
        self.hub.status(self.queue.remaining());
        Ok(())
    }
}

/// Forwards one prompt's events to its WebSocket client and keeps the ones ComfyUI's
/// history records under `status.messages`.
///
/// The events that end a run (`executing: null`, `execution_success`, `_error`,
/// `_interrupted`) are held back until the history entry is stored: clients fetch
/// `/history/{id}` as soon as they see them.
struct PromptSink<'a> {
    hub: &'a Hub,
    live: &'a Mutex<Live>,
    target: Option<&'a str>,
    messages: Mutex<Vec<Json>>,
    deferred: Mutex<Vec<(&'static str, Json)>>,
}

impl PromptSink<'_> {
    fn flush(&self) {
        for (kind, data) in self.deferred.lock().drain(..) {
            self.hub.send_json(self.target, kind, data);
        }
    }
}

impl EventSink for PromptSink<'_> {
    fn send(&self, event: Event) {
        if let Event::Preview { prompt_id, node, image } = event {
            self.live.lock().preview = Some(image.clone());
            self.hub.send_preview(self.target, crate::ws::PreviewSource { prompt_id, node }, image);
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
        );
        if last {
            self.deferred.lock().push((kind, data));
        } else {
            self.hub.send_json(self.target, kind, data);
        }
    }
}

/// The worker loop: one prompt at a time until the queue closes.
pub fn worker(state: Arc<AppState>) {
    while let Some((job, cancel)) = state.queue.take() {
        *state.live.lock() = Live { prompt_id: Some(job.prompt_id.clone()), started: Some(std::time::Instant::now()), step: None, preview: None };
        let sink = PromptSink {
            hub: &state.hub,
            live: &state.live,
            target: job.client_id.as_deref(),
            messages: Mutex::new(Vec::new()),
            deferred: Mutex::new(Vec::new()),
        };
        let options = RunOptions {
            run_id: Some(job.prompt_id.clone()),
            output_dir: Some(state.config.output_dir.clone()),
            metadata: job.metadata.clone(),
            image_metadata: job.image_metadata.clone(),
        };
        let started = std::time::Instant::now();
        let result = state.executor.run_plan(&job.plan, &sink, &cancel, &options);
        let secs = started.elapsed().as_secs_f64();
        // One line per prompt, as ComfyUI's console has it.
        match &result {
            Ok(_) => tracing::info!("prompt {} executed in {secs:.2} seconds", job.prompt_id),
            Err(RunError::NodeFailed { node_id, class_type, error, .. }) => {
                tracing::warn!("prompt {} failed after {secs:.2} seconds at node {node_id} ({class_type}): {error}", job.prompt_id)
            }
            Err(RunError::Interrupted { .. }) => tracing::info!("prompt {} interrupted after {secs:.2} seconds", job.prompt_id),
            Err(RunError::Invalid(_)) => tracing::warn!("prompt {} no longer validates", job.prompt_id),
        }
        let (outputs, ok) = match &result {
            Ok(report) => (report.ui_outputs.clone(), true),
            Err(RunError::NodeFailed { report, .. })
            | Err(RunError::Interrupted { report, .. }) => (report.ui_outputs.clone(), false),
            Err(RunError::Invalid(_)) => (Default::default(), false),
        };
        if let Err(RunError::Invalid(report)) = &result {
            // Validated when queued; a registry whose schemas changed since could still
            // reject it.
            sink.messages.lock().push(json!(["execution_error", {
                "prompt_id": job.prompt_id,
                "exception_type": "ValidationError",
                "exception_message": report.to_string(),
            }]));
        }
        if !ok {
            // ComfyUI ends every run with `executing: null`; the executor sends it only
            // after a success.
            sink.send(Event::Executing {
                prompt_id: job.prompt_id.clone(),
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
            "prompt": job.queue_item(),
            "outputs": outputs_json,
            "status": {
                "status_str": if ok { "success" } else { "error" },
                "completed": ok,
                "messages": std::mem::take(&mut *sink.messages.lock()),
            },
            "meta": meta,
        });
        if let Err(e) = state.history.insert(&job.prompt_id, entry.clone()) {
            tracing::error!("prompt {}: history not saved: {e}", job.prompt_id);
        }
        state.queue.finish();
        *state.live.lock() = Live::default();
        sink.flush();
        state.hub.status(state.queue.remaining());
        if let Some(done) = job.done {
            let _ = done.send(Arc::new(entry));
        }
    }
}
