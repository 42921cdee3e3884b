//! ComfyUI's HTTP API: prompts, queue, history, interrupt, node catalogue, system stats,
//! model lists.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json as Reply;
use sdflow_executor::Workflow;
use serde::Deserialize;
use serde_json::{json, Value as Json};

use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs};
use crate::history::valid_prompt_id;
use crate::queue::{number_json, Job};
use crate::state::AppState;

type AppStateRef = State<Arc<AppState>>;

#[derive(Deserialize)]
pub struct PromptRequest {
    prompt: Option<Json>,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    extra_data: Option<Json>,
    #[serde(default)]
    front: Option<bool>,
    #[serde(default)]
    number: Option<f64>,
    /// Newer ComfyUI lets the client choose the id.
    #[serde(default)]
    prompt_id: Option<String>,
}

/// A prompt on its way to the queue.
pub struct Submission {
    /// As the client sent it, echoed by `/queue` and `/history`.
    pub prompt: Json,
    pub workflow: Workflow,
    pub client_id: Option<String>,
    pub extra_data: Json,
    pub number: f64,
    pub prompt_id: String,
    /// Told the history entry when the prompt is done.
    pub done: Option<tokio::sync::oneshot::Sender<Arc<Json>>>,
}

/// Validates a prompt and puts it on the queue; the same path for ComfyUI clients and for
/// the A1111/OpenAI endpoints (which pass `done` to wait for the result).
pub fn enqueue(state: &AppState, sub: Submission) -> Result<Json, ApiError> {
    let Submission {
        prompt,
        workflow,
        client_id,
        extra_data,
        number,
        prompt_id,
        done,
    } = sub;
    let plan = state
        .executor
        .validate(&workflow)
        .map_err(ApiError::Invalid)?;
    let outputs: Vec<String> = workflow
        .nodes
        .iter()
        .filter(|(_, n)| {
            state
                .executor
                .registry()
                .schema(&n.class_type)
                .is_some_and(|s| s.output_node)
        })
        .map(|(id, _)| id.clone())
        .collect();
    let (metadata, image_metadata) = comfy_metadata(&extra_data, &workflow, state);
    let mut extra_data = extra_data;
    // ComfyUI stamps each prompt on arrival; `/jobs` sorts and reports by it.
    if let Some(m) = extra_data.as_object_mut() {
        m.entry("create_time").or_insert_with(|| json!(sdflow_executor::events::now_ms()));
    }
    let job = Job {
        spec: crate::queue::Spec {
            prompt_id: prompt_id.clone(),
            number,
            prompt,
            extra_data,
            outputs,
            client_id,
            metadata,
            image_metadata,
        },
        plan,
        done,
    };
    state.submit(job)?;
    Ok(json!({ "prompt_id": prompt_id, "number": number_json(number), "node_errors": {} }))
}

/// [`enqueue`] on a blocking thread: validation asks node schemas for their combo lists,
/// which read folders (checkpoints, input images).
pub async fn enqueue_off_thread(state: Arc<AppState>, sub: Submission) -> Result<Json, ApiError> {
    tokio::task::spawn_blocking(move || enqueue(&state, sub))
        .await
        .map_err(|e| ApiError::Internal(format!("validation task failed: {e}")))?
}

/// The PNG text chunks of a prompt's images: our metadata helper's `prompt`, `workflow`
/// and `parameters`, with what the client sent in `extra_data.extra_pnginfo` (ComfyUI's
/// UI sends its own `workflow` there) taking precedence; and the chunks that differ per
/// image of a batch (A1111's `parameters` with each image's seed), less the keys the
/// client gave.
#[allow(clippy::type_complexity)]
fn comfy_metadata(
    extra_data: &Json,
    workflow: &Workflow,
    state: &AppState,
) -> (Vec<(String, String)>, Vec<Vec<(String, String)>>) {
    let mut meta = sdflow_workflows::metadata::png_metadata(workflow, state.executor.registry());
    let mut per_image = sdflow_workflows::metadata::per_image_metadata(workflow);
    if let Some(info) = extra_data.get("extra_pnginfo").and_then(Json::as_object) {
        for (k, v) in info {
            let text = match v {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            };
            meta.retain(|(mk, _)| mk != k);
            meta.push((k.clone(), text));
            for image in &mut per_image {
                image.retain(|(mk, _)| mk != k);
            }
        }
    }
    (meta, per_image)
}

pub async fn post_prompt(
    State(state): AppStateRef,
    JsonBody(req): JsonBody<PromptRequest>,
) -> Result<Reply<Json>, ApiError> {
    let Some(prompt) = req.prompt else {
        return Err(ApiError::bad("no prompt: the body needs a `prompt` object"));
    };
    if !prompt.is_object() {
        return Err(ApiError::bad("`prompt` must be an object of nodes by id"));
    }
    let workflow = Workflow::from_json(prompt.clone(), state.executor.registry())
        .map_err(|e| ApiError::bad(format!("prompt: {e}")))?;
    let number = match req.number {
        Some(n) if n.is_finite() => n,
        Some(_) => return Err(ApiError::bad("`number` must be a finite number")),
        None => {
            let n = state.queue.next_number()? as f64;
            if req.front == Some(true) {
                -n
            } else {
                n
            }
        }
    };
    let prompt_id = match req.prompt_id {
        Some(id) if valid_prompt_id(&id) => {
            if state.history.get(&id)?.is_some() || state.queue.is_known(&id)? {
                return Err(ApiError::bad(format!("prompt_id {id} is already in use")));
            }
            id
        }
        Some(id) => {
            return Err(ApiError::bad(format!(
                "prompt_id `{id}` must be 1-128 letters, digits, '-' or '_'"
            )))
        }
        None => uuid::Uuid::new_v4().to_string(),
    };
    let mut extra_data = match req.extra_data {
        Some(Json::Object(m)) => Json::Object(m),
        Some(Json::Null) | None => json!({}),
        Some(_) => return Err(ApiError::bad("`extra_data` must be an object")),
    };
    if let Some(c) = &req.client_id {
        extra_data["client_id"] = json!(c);
    }
    // A UI-format workflow runs as the prompt ComfyUI's frontend would have sent for it:
    // `/queue`, `/history` and `/jobs` show that API prompt (what ComfyUI clients read), and
    // the workflow itself goes where the frontend puts it, into the PNGs' `workflow`.
    let prompt = if sdflow_executor::WorkflowFormat::detect(&prompt) == Some(sdflow_executor::WorkflowFormat::Ui) {
        let info = &mut extra_data["extra_pnginfo"];
        if !info.is_object() {
            *info = json!({});
        }
        info.as_object_mut().map(|m| m.entry("workflow").or_insert(prompt));
        workflow.to_api_json()
    } else {
        prompt
    };
    // Validated here rather than on a blocking thread: clients such as the ComfyUI SDK
    // subscribe to the prompt's events only once this reply arrives, so it must not lag
    // behind the worker starting the prompt.
    let reply = enqueue(
        &state,
        Submission {
            prompt,
            workflow,
            client_id: req.client_id,
            extra_data,
            number,
            prompt_id,
            done: None,
        },
    )?;
    Ok(Reply(reply))
}

pub async fn get_prompt(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    Ok(Reply(json!({ "exec_info": { "queue_remaining": state.queue.remaining()? } })))
}

pub async fn get_queue(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    let (running, pending) = state.queue.snapshot()?;
    Ok(Reply(json!({ "queue_running": running, "queue_pending": pending })))
}

#[derive(Deserialize)]
pub struct ClearOrDelete {
    #[serde(default)]
    clear: bool,
    #[serde(default)]
    delete: Vec<String>,
}

pub async fn post_queue(
    State(state): AppStateRef,
    JsonBody(req): JsonBody<ClearOrDelete>,
) -> Result<Response, ApiError> {
    if req.clear {
        state.queue.clear()?;
    }
    if !req.delete.is_empty() {
        state.queue.delete(&req.delete)?;
    }
    state.broadcast_status();
    Ok(axum::http::StatusCode::OK.into_response())
}

#[derive(Deserialize)]
pub struct HistoryQuery {
    max_items: Option<usize>,
    #[serde(default)]
    offset: Option<usize>,
}

pub async fn get_history(
    State(state): AppStateRef,
    QueryArgs(q): QueryArgs<HistoryQuery>,
) -> Result<Reply<Json>, ApiError> {
    Ok(Reply(state.history.list(q.max_items, q.offset.unwrap_or(0))?))
}

pub async fn get_history_one(State(state): AppStateRef, Path(id): Path<String>) -> Result<Reply<Json>, ApiError> {
    // ComfyUI answers an unknown id with an empty object, and clients poll on that.
    let mut out = serde_json::Map::new();
    if let Some(e) = state.history.get(&id)? {
        out.insert(id, (*e).clone());
    }
    Ok(Reply(Json::Object(out)))
}

pub async fn post_history(
    State(state): AppStateRef,
    JsonBody(req): JsonBody<ClearOrDelete>,
) -> Result<Response, ApiError> {
    if req.clear {
        state.history.clear()?;
    }
    for id in &req.delete {
        state.history.delete(id)?;
    }
    Ok(axum::http::StatusCode::OK.into_response())
}

#[derive(Deserialize, Default)]
pub struct InterruptRequest {
    #[serde(default)]
    prompt_id: Option<String>,
}

pub async fn post_interrupt(
    State(state): AppStateRef,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    // ComfyUI's frontend posts no body here; a body, when there is one, must be JSON.
    let req: InterruptRequest = if body.iter().all(u8::is_ascii_whitespace) {
        InterruptRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad(format!("malformed JSON body: {e}")))?
    };
    state.queue.interrupt(req.prompt_id.as_deref())?;
    Ok(axum::http::StatusCode::OK.into_response())
}

pub async fn object_info(State(state): AppStateRef) -> Reply<Json> {
    Reply(state.executor.registry().object_info())
}

pub async fn object_info_one(State(state): AppStateRef, Path(class): Path<String>) -> Reply<Json> {
    let mut out = serde_json::Map::new();
    if let Some(schema) = state.executor.registry().schema(&class) {
        out.insert(class, schema.object_info());
    }
    Reply(Json::Object(out))
}

/// `(total, available)` bytes of RAM, from /proc/meminfo where there is one.
fn memory() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return (0, 0);
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// `/system_stats`' devices as ComfyUI reports its torch device (`cuda:0 NAME`, type,
/// index, memory): each GPU the placement computes on, with the driver's live free memory,
/// then the CPU. `torch_vram_*` (what torch holds) are the bytes of weights sdflow keeps
/// on the device and its budget's room left.
fn devices(runtime: &sdflow_nodes::Runtime, ram_total: u64, ram_free: u64) -> Json {
    use sdflow_core::ggml::BackendKind;
    let stats = runtime.residency.stats();
    let held = |k: BackendKind| stats.device(k.into()).map_or(0, |d| d.bytes);
    let budget_left = |k: BackendKind| runtime.residency.budget(k.into()).map(|b| b.saturating_sub(held(k)));
    let used = runtime.placement().devices();
    let mut out: Vec<Json> = sdflow_core::ggml::devices()
        .into_iter()
        .filter(|d| d.kind != BackendKind::Cpu && used.contains(&d.kind))
        .map(|d| {
            let index: u64 = d.name.trim_start_matches(|c: char| !c.is_ascii_digit()).parse().unwrap_or(0);
            let ty = d.registry.to_ascii_lowercase();
            json!({
                "name": format!("{ty}:{index} {}", d.description),
                "type": ty,
                "index": index,
                "vram_total": d.total,
                "vram_free": d.free,
                "torch_vram_total": held(d.kind),
                "torch_vram_free": budget_left(d.kind).unwrap_or(d.free),
            })
        })
        .collect();
    out.push(json!({
        "name": "cpu",
        "type": "cpu",
        "index": null,
        "vram_total": ram_total,
        "vram_free": ram_free,
        "torch_vram_total": held(BackendKind::Cpu),
        "torch_vram_free": budget_left(BackendKind::Cpu).unwrap_or(ram_free),
    }));
    Json::Array(out)
}

pub async fn system_stats(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    let (ram_total, ram_free) = memory();
    let cache = state.executor.cache_stats();
    let residency = serde_json::to_value(state.runtime.residency.stats()).unwrap_or(Json::Null);
    Ok(Reply(json!({
        "system": {
            // ComfyUI reports Python's os.name; clients use it to pick path separators.
            "os": if cfg!(windows) { "nt" } else { "posix" },
            "ram_total": ram_total,
            "ram_free": ram_free,
            "comfyui_version": concat!("sdflow ", env!("CARGO_PKG_VERSION")),
            "required_frontend_version": "",
            "python_version": "",
            "pytorch_version": "",
            "embedded_python": false,
            "argv": std::env::args().collect::<Vec<_>>(),
        },
        "devices": devices(&state.runtime, ram_total, ram_free),
        "sdflow": {
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": state.started.elapsed().as_secs(),
            "queue_remaining": state.queue.remaining()?,
            "history_entries": state.history.len()?,
            "queue": state.queue.stats()?,
            "residency": residency,
            "output_cache": {
                "entries": cache.entries,
                "bytes": cache.bytes,
                "budget_bytes": cache.budget_bytes,
                "hits": cache.hits,
                "misses": cache.misses,
                "evictions": cache.evictions,
            },
        },
    })))
}

/// ComfyUI's model folder names, and Impact Pack's `ultralytics` (the detectors
/// UltralyticsDetectorProvider reads).
pub const MODEL_FOLDERS: [&str; 15] = [
    "checkpoints",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "upscale_models",
    "hypernetworks",
    "photomaker",
    "style_models",
    "ultralytics",
];

/// Files of one model folder: what the loaders of that kind offer.
pub fn list_models(state: &AppState, folder: &str) -> Vec<String> {
    state.runtime.list_models(folder)
}

pub async fn models(State(_state): AppStateRef) -> Reply<Json> {
    Reply(json!(MODEL_FOLDERS))
}

pub async fn models_in(
    State(state): AppStateRef,
    Path(folder): Path<String>,
) -> Result<Reply<Json>, ApiError> {
    if !MODEL_FOLDERS.contains(&folder.as_str()) {
        return Err(ApiError::NotFound(format!("no model folder `{folder}`")));
    }
    Ok(Reply(json!(list_models(&state, &folder))))
}

pub async fn embeddings(State(state): AppStateRef) -> Reply<Json> {
    let names: Vec<String> = list_models(&state, "embeddings")
        .into_iter()
        .map(|n| match n.rsplit_once('.') {
            Some((stem, _)) => stem.to_string(),
            None => n,
        })
        .collect();
    Reply(json!(names))
}

pub async fn features() -> Reply<Json> {
    Reply(crate::ws::server_features())
}
