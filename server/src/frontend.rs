//! What ComfyUI's own web frontend asks of its server beyond the prompt API: the static
//! files of `--front-end-root`, and the small routes it reads at start-up (extensions,
//! translations, model folders, templates, global subgraphs, logs, folder paths).
//!
//! Its template browser (`/templates/index.json`, `/templates/{name}.json`) lists sdflow's
//! own committed workflows, in the UI format, with model names the models folder has.
//!
//! sdflow has no custom nodes, so the lists that custom nodes would fill (extensions,
//! their translations, workflow templates, global subgraph blueprints) are empty — which
//! is what ComfyUI answers without custom nodes too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json as Reply;
use serde_json::{json, Map, Value as Json};

use crate::comfy::MODEL_FOLDERS;
use crate::error::ApiError;
use crate::state::AppState;

type AppStateRef = State<Arc<AppState>>;

/// Keeps a served frontend from reaching any other host on its own (fonts, telemetry,
/// template or model downloads): everything it loads or connects to is this server.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; media-src 'self' data: blob:; worker-src 'self' blob:; connect-src 'self'; frame-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'";

/// The folder whose `index.html` a `--front-end-root` means: the folder itself, or the
/// `static/` folder of the installed `comfyui-frontend-package` when given the package's
/// folder or the site-packages folder holding it.
pub fn resolve_front_end_root(dir: &Path) -> Result<PathBuf, String> {
    let candidates = [
        dir.to_path_buf(),
        dir.join("static"),
        dir.join("comfyui_frontend_package").join("static"),
    ];
    for c in &candidates {
        if c.join("index.html").is_file() {
            return c.canonicalize().map_err(|e| format!("{}: {e}", c.display()));
        }
    }
    Err(format!(
        "{} holds no index.html (nor static/index.html, nor comfyui_frontend_package/static/index.html)",
        dir.display()
    ))
}

/// Files of the configured frontend; any other request is a JSON 404.
pub async fn serve_file(root: Arc<PathBuf>, method: Method, uri: Uri) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return ApiError::NotFound(format!("no endpoint {method} {}", uri.path())).into_response();
    }
    let rel = uri.path().trim_start_matches('/');
    let rel = if rel.is_empty() { "index.html" } else { rel };
    let not_found = || ApiError::NotFound(format!("no endpoint or file GET /{rel}")).into_response();
    // The package ships no links; a link that leads out of the folder is not served.
    let path = match crate::security::relative_path("path", &crate::security::percent_decode(rel)).and_then(|p| crate::security::confined(&root, &root.join(p))) {
        Ok(real) if real.is_file() => real,
        _ => return not_found(),
    };
    let bytes = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(_) => return not_found(),
    };
    let mut response = bytes.into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::files::mime_of(rel)));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    // Hashed asset names change with each release; the entry page must not be cached.
    let cache = if rel == "index.html" { "no-cache" } else { "public, max-age=3600" };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    response
}

/// `GET /extensions`: the JavaScript extensions to load (custom nodes' web folders).
pub async fn extensions() -> Reply<Json> {
    Reply(json!([]))
}

/// `GET /i18n`: custom nodes' translations.
pub async fn i18n() -> Reply<Json> {
    Reply(json!({}))
}

/// `GET /workflow_templates`: custom nodes' example workflows, by module.
pub async fn workflow_templates() -> Reply<Json> {
    Reply(json!({}))
}

/// `GET /global_subgraphs`: subgraph blueprints installed on the server.
pub async fn global_subgraphs() -> Reply<Json> {
    Reply(json!({}))
}

pub async fn global_subgraph(UrlPath(id): UrlPath<String>) -> ApiError {
    ApiError::NotFound(format!("no global subgraph {id}"))
}

/// Where a kind of model is read from: its folder under the models folder (whether it
/// exists yet or not, as ComfyUI lists its configured paths) and any other folder the
/// runtime reads it from.
fn folder_paths(state: &AppState, folder: &str) -> Vec<String> {
    let mut dirs = vec![state.config.models_dir.join(folder)];
    for d in state.runtime.kind_dirs(folder) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs.iter()
        .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone()).to_string_lossy().into_owned())
        .collect()
}

/// `GET /experiment/models`: each model folder with where it is read from.
pub async fn model_folders(State(state): AppStateRef) -> Reply<Json> {
    let out: Vec<Json> = MODEL_FOLDERS
        .iter()
        .map(|f| json!({ "name": f, "folders": folder_paths(&state, f) }))
        .collect();
    Reply(Json::Array(out))
}

/// `GET /experiment/models/{folder}`: its files, each with the index of the folder path
/// it was found in.
pub async fn models_in_folder(State(state): AppStateRef, UrlPath(folder): UrlPath<String>) -> Result<Reply<Json>, ApiError> {
    if !MODEL_FOLDERS.contains(&folder.as_str()) {
        return Err(ApiError::NotFound(format!("no model folder `{folder}`")));
    }
    let dirs: Vec<PathBuf> = folder_paths(&state, &folder).into_iter().map(PathBuf::from).collect();
    let out: Vec<Json> = state
        .runtime
        .list_models(&folder)
        .into_iter()
        .map(|name| {
            let index = dirs.iter().position(|d| d.join(&name).exists()).unwrap_or(0);
            json!({ "name": name, "pathIndex": index })
        })
        .collect();
    Ok(Reply(Json::Array(out)))
}

/// `GET /internal/folder_paths`: every folder kind and the paths it is read from.
pub async fn internal_folder_paths(State(state): AppStateRef) -> Reply<Json> {
    let mut out = Map::new();
    for f in MODEL_FOLDERS {
        out.insert(f.to_string(), json!(folder_paths(&state, f)));
    }
    out.insert("custom_nodes".into(), json!([]));
    Reply(Json::Object(out))
}

/// `GET /internal/files/{type}`: the files of input/output/temp, newest first.
pub async fn internal_files(State(state): AppStateRef, UrlPath(kind): UrlPath<String>) -> Result<Reply<Json>, ApiError> {
    let dir = state.dirs.by_type(&kind)?;
    let mut files: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(dir)
        .map_err(|e| ApiError::io(format!("listing the {kind} folder"), e))?
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((meta.modified().ok()?, e.file_name().to_string_lossy().into_owned()))
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(Reply(json!(files.into_iter().map(|f| f.1).collect::<Vec<_>>())))
}

/// `GET /internal/logs`: the server's recent log lines as one text.
pub async fn internal_logs() -> Reply<Json> {
    let text: String = crate::logs::entries().iter().map(|e| format!("{} - {}", e.t, e.m)).collect();
    Reply(json!(text))
}

/// `GET /internal/logs/raw`: the recent log lines, and the terminal size the frontend's
/// log panel should assume.
pub async fn internal_logs_raw() -> Reply<Json> {
    Reply(json!({ "entries": crate::logs::entries(), "size": { "cols": 120, "rows": 40 } }))
}

#[derive(serde::Deserialize)]
pub struct LogSubscription {
    #[serde(rename = "clientId")]
    client_id: String,
    enabled: bool,
}

/// `PATCH /internal/logs/subscribe {"clientId", "enabled"}`: `logs` messages on that
/// client's WebSocket from now on, or no more.
pub async fn internal_logs_subscribe(crate::extract::JsonBody(s): crate::extract::JsonBody<LogSubscription>) -> axum::http::StatusCode {
    crate::logs::subscribe(&s.client_id, s.enabled);
    axum::http::StatusCode::OK
}

/// `GET /templates/index.json`: sdflow's committed workflows as one template category,
/// in the shape of ComfyUI's `workflow_templates` package index.
pub async fn templates_index(State(state): AppStateRef) -> Reply<Json> {
    let registry = state.executor.registry();
    let parsed: Vec<(&str, String, String)> = sdflow_workflows::bundled::BUNDLED
        .iter()
        .filter_map(|(name, text)| {
            let header = sdflow_executor::Workflow::parse(text, registry).ok()?.header.unwrap_or_default();
            Some((*name, header.title.unwrap_or_else(|| name.to_string()), header.description.unwrap_or_default()))
        })
        .collect();
    let templates: Vec<Json> = parsed
        .iter()
        .map(|(name, title, description)| {
            // Presets share titles ("Hires fix" with and without a model); the browser
            // lists them side by side, so the file name tells them apart.
            let shared = parsed.iter().filter(|p| p.1 == *title).count() > 1;
            let title = if shared { format!("{title} ({name})") } else { title.clone() };
            json!({ "name": name, "title": title, "description": description, "mediaType": "image", "mediaSubtype": "webp" })
        })
        .collect();
    Reply(json!([{
        "moduleName": "default",
        "title": "sdflow",
        "category": "sdflow",
        "type": "image",
        "templates": templates,
    }]))
}

/// `GET /templates/{name}.json`: one committed workflow in the UI format. A model or
/// image it names that is not there is replaced by the first one that is, so the
/// template runs with what the user has (the frontend still lets them pick another).
pub async fn template(State(state): AppStateRef, UrlPath(file): UrlPath<String>) -> Result<Reply<Json>, ApiError> {
    let not_found = || ApiError::NotFound(format!("no template {file}"));
    let name = file.strip_suffix(".json").ok_or_else(not_found)?;
    let text = sdflow_workflows::bundled::find(name).ok_or_else(not_found)?;
    let state2 = state.clone();
    let text = text.to_string();
    // Combo lists read folders.
    let ui = tokio::task::spawn_blocking(move || -> Result<Json, ApiError> {
        let registry = state2.executor.registry();
        let mut wf = sdflow_executor::Workflow::parse(&text, registry).map_err(|e| ApiError::Internal(e.to_string()))?;
        fit_to_present_files(&mut wf, registry);
        sdflow_executor::ui::workflow_to_ui(&wf, registry).map_err(|e| ApiError::Internal(e.to_string()))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(Reply(ui))
}

/// Replaces each list choice that is not among the node's current choices (a model file
/// or input image that is not there) by the first choice there is.
pub fn fit_to_present_files(wf: &mut sdflow_executor::Workflow, registry: &sdflow_executor::Registry) {
    for spec in wf.nodes.values_mut() {
        let Some(schema) = registry.schema(&spec.class_type) else { continue };
        for input in &schema.inputs {
            let sdflow_executor::InputKind::Combo(combo) = &input.kind else { continue };
            let Some(sdflow_executor::InputValue::Const(Json::String(v))) = spec.inputs.get(&input.name) else { continue };
            if combo.options.iter().any(|o| o == v) {
                continue;
            }
            if let Some(first) = combo.options.first() {
                spec.inputs.insert(input.name.clone(), sdflow_executor::InputValue::Const(json!(first)));
            }
        }
    }
}
