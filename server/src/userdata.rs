//! ComfyUI's per-user storage, which its frontend keeps its settings, saved workflows and
//! templates in: `/users`, `/settings`, `/userdata` (v1 and v2).
//!
//! One user, ComfyUI's `default`, under `<user dir>/default/` (ComfyUI without
//! `--multi-user`). Every path a request names is confined to that folder: no `..`, no
//! absolute paths, no way out through a symbolic link. Writes go through a temporary file
//! and a rename, and a settings file that no longer parses is kept aside, not overwritten.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json as Reply;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};

use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs};
use crate::history::write_atomic;
use crate::state::AppState;

type AppStateRef = State<Arc<AppState>>;

/// ComfyUI's single user.
pub const DEFAULT_USER: &str = "default";
const SETTINGS_FILE: &str = "comfy.settings.json";

impl AppState {
    /// The default user's folder (it may not exist yet).
    pub fn user_root(&self) -> PathBuf {
        self.dirs.user.join(DEFAULT_USER)
    }
}

/// `rel` (as the request spelt it, `/`-separated) under `root`, refused when it would leave
/// it. Symbolic links inside are followed only as far as they stay within `root`; the
/// path itself may not exist yet (a file about to be written).
pub fn confined(root: &Path, rel: &str) -> Result<PathBuf, ApiError> {
    if rel.is_empty() {
        return Err(ApiError::bad("empty user data path"));
    }
    let path = root.join(crate::security::relative_path("user data path", rel)?);
    // The deepest part that exists decides where a link would really lead; with no user
    // folder yet, nothing inside it exists either.
    let mut existing = path.as_path();
    while !existing.exists() && existing != root {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    if existing.exists() {
        let real_root = root.canonicalize().map_err(|e| ApiError::io("resolving the user folder", e))?;
        crate::security::confined(&real_root, existing)?;
    }
    Ok(path)
}

fn ensure_root(state: &AppState) -> Result<PathBuf, ApiError> {
    let root = state.user_root();
    std::fs::create_dir_all(&root).map_err(|e| ApiError::io("creating the user folder", e))?;
    Ok(root)
}

fn rel_slash(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn secs(t: std::io::Result<std::time::SystemTime>) -> Json {
    t.ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(Json::Null, |d| json!(d.as_secs_f64()))
}

/// ComfyUI's `FileInfo`: path relative to `base`, size, modified and created (seconds).
fn file_info(path: &Path, base: &Path) -> Result<Json, ApiError> {
    let meta = std::fs::metadata(path).map_err(|e| ApiError::io(format!("reading {}", rel_slash(path, base)), e))?;
    Ok(json!({
        "path": rel_slash(path, base),
        "size": meta.len(),
        "modified": secs(meta.modified()),
        "created": secs(meta.created().or_else(|_| meta.modified())),
    }))
}

/// `GET /users`: a single-user server whose settings live on the server.
pub async fn users(State(state): AppStateRef) -> Reply<Json> {
    Reply(json!({ "storage": "server", "migrated": state.user_root().exists() }))
}

pub async fn create_user() -> ApiError {
    ApiError::bad("sdflow serves a single user (ComfyUI's `default`); there are no user profiles to create")
}

fn read_settings(state: &AppState) -> Result<Map<String, Json>, ApiError> {
    let path = state.user_root().join(SETTINGS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => return Err(ApiError::io(format!("reading {}", path.display()), e)),
    };
    match serde_json::from_slice::<Json>(&bytes) {
        Ok(Json::Object(m)) => Ok(m),
        other => {
            // ComfyUI answers `{}` and later overwrites the file; keep what was there.
            let why = match other {
                Err(e) => e.to_string(),
                Ok(_) => "not a JSON object".into(),
            };
            let aside = path.with_extension(format!("json.unreadable-{}", uuid::Uuid::new_v4().simple()));
            std::fs::rename(&path, &aside).map_err(|e| ApiError::io(format!("moving aside {}", path.display()), e))?;
            tracing::warn!("{} could not be read ({why}); kept as {} and starting from default settings", path.display(), aside.display());
            Ok(Map::new())
        }
    }
}

fn write_settings(state: &AppState, settings: &Map<String, Json>) -> Result<(), ApiError> {
    let root = ensure_root(state)?;
    let bytes = serde_json::to_vec_pretty(settings).map_err(|e| ApiError::Internal(e.to_string()))?;
    write_atomic(&root.join(SETTINGS_FILE), &bytes)
}

pub async fn get_settings(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    let _guard = state.user_lock.lock();
    Ok(Reply(Json::Object(read_settings(&state)?)))
}

pub async fn get_setting(State(state): AppStateRef, UrlPath(id): UrlPath<String>) -> Result<Reply<Json>, ApiError> {
    let _guard = state.user_lock.lock();
    Ok(Reply(read_settings(&state)?.remove(&id).unwrap_or(Json::Null)))
}

/// `POST /settings`: merges the given object into the stored settings.
pub async fn post_settings(State(state): AppStateRef, JsonBody(new): JsonBody<Json>) -> Result<StatusCode, ApiError> {
    let Json::Object(new) = new else {
        return Err(ApiError::bad("settings must be a JSON object"));
    };
    let _guard = state.user_lock.lock();
    let mut settings = read_settings(&state)?;
    settings.extend(new);
    write_settings(&state, &settings)?;
    Ok(StatusCode::OK)
}

pub async fn post_setting(State(state): AppStateRef, UrlPath(id): UrlPath<String>, JsonBody(value): JsonBody<Json>) -> Result<StatusCode, ApiError> {
    let _guard = state.user_lock.lock();
    let mut settings = read_settings(&state)?;
    settings.insert(id, value);
    write_settings(&state, &settings)?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
pub struct ListQuery {
    dir: Option<String>,
    recurse: Option<String>,
    full_info: Option<String>,
    split: Option<String>,
}

fn flag(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Files under `dir`, recursing when asked, in name order.
fn walk(dir: &Path, recurse: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        // Links are followed only when they stay inside (checked by the caller's root).
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if meta.is_file() {
            out.push(path);
        } else if meta.is_dir() && recurse && !e.file_type().is_ok_and(|t| t.is_symlink()) {
            walk(&path, recurse, out)?;
        }
    }
    Ok(())
}

/// `GET /userdata?dir=workflows&recurse=true&full_info=true&split=false`.
pub async fn list(State(state): AppStateRef, QueryArgs(q): QueryArgs<ListQuery>) -> Result<Reply<Json>, ApiError> {
    let dir = q.dir.as_deref().filter(|d| !d.is_empty()).ok_or_else(|| ApiError::bad("`dir` is required"))?;
    let root = ensure_root(&state)?;
    let path = confined(&root, dir)?;
    if !path.is_dir() {
        return Err(ApiError::NotFound(format!("no user data folder {dir}")));
    }
    let mut files = Vec::new();
    walk(&path, flag(&q.recurse), &mut files).map_err(|e| ApiError::io(format!("listing user data folder {dir}"), e))?;
    let mut out = Vec::new();
    for f in files {
        out.push(if flag(&q.full_info) {
            file_info(&f, &path)?
        } else {
            let rel = rel_slash(&f, &path);
            if flag(&q.split) {
                let mut parts = vec![json!(rel)];
                parts.extend(rel.split('/').map(|p| json!(p)));
                Json::Array(parts)
            } else {
                json!(rel)
            }
        });
    }
    Ok(Reply(Json::Array(out)))
}

#[derive(Deserialize)]
pub struct ListV2Query {
    path: Option<String>,
}

/// `GET /v2/userdata?path=`: everything below a folder, folders first, then by name.
pub async fn list_v2(State(state): AppStateRef, QueryArgs(q): QueryArgs<ListV2Query>) -> Result<Reply<Json>, ApiError> {
    let root = state.user_root();
    let rel = q.path.unwrap_or_default();
    let target = if rel.is_empty() {
        if !root.exists() {
            return Ok(Reply(json!([])));
        }
        root.clone()
    } else {
        if !root.exists() {
            return Err(ApiError::NotFound(format!("no user data path {rel}")));
        }
        confined(&root, &rel)?
    };
    if !target.exists() {
        return Err(ApiError::NotFound(format!("no user data path {rel}")));
    }
    if !target.is_dir() {
        return Err(ApiError::bad(format!("user data path {rel} is not a folder")));
    }
    let mut out = Vec::new();
    let mut stack = vec![target];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| ApiError::io(format!("listing user data folder {rel}"), e))?;
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                out.push(json!({ "name": name, "path": rel_slash(&path, &root), "type": "directory" }));
                stack.push(path);
            } else if kind.is_file() {
                let meta = e.metadata().ok();
                let mut entry = json!({ "name": name, "path": rel_slash(&path, &root), "type": "file" });
                if let Some(m) = meta {
                    entry["size"] = json!(m.len());
                    entry["modified"] = secs(m.modified());
                }
                out.push(entry);
            }
        }
    }
    out.sort_by_key(|e| (e["type"] != "directory", e["name"].as_str().unwrap_or("").to_lowercase()));
    Ok(Reply(Json::Array(out)))
}

pub async fn get_file(State(state): AppStateRef, UrlPath(file): UrlPath<String>) -> Result<Response, ApiError> {
    let root = state.user_root();
    let path = confined(&root, &file)?;
    if !path.is_file() {
        return Err(ApiError::NotFound(format!("no user data file {file}")));
    }
    let bytes = std::fs::read(&path).map_err(|e| ApiError::io(format!("reading user data file {file}"), e))?;
    let mut response = bytes.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::files::mime_of(&file)));
    Ok(response)
}

#[derive(Deserialize)]
pub struct WriteQuery {
    overwrite: Option<String>,
    full_info: Option<String>,
}

impl WriteQuery {
    /// ComfyUI overwrites unless told `overwrite=false`.
    fn overwrite(&self) -> bool {
        self.overwrite.as_deref() != Some("false")
    }
}

fn written(path: &Path, root: &Path, full_info: bool) -> Result<Reply<Json>, ApiError> {
    Ok(Reply(if full_info { file_info(path, root)? } else { json!(rel_slash(path, root)) }))
}

/// `POST /userdata/{file}?overwrite=&full_info=`: the body is the file.
pub async fn post_file(State(state): AppStateRef, UrlPath(file): UrlPath<String>, QueryArgs(q): QueryArgs<WriteQuery>, body: Bytes) -> Result<Reply<Json>, ApiError> {
    let root = ensure_root(&state)?;
    let path = confined(&root, &file)?;
    let _guard = state.user_lock.lock();
    if path.is_dir() {
        return Err(ApiError::bad(format!("user data path {file} is a folder")));
    }
    if !q.overwrite() && path.exists() {
        return Err(ApiError::Conflict(format!("user data file {file} already exists")));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| ApiError::io(format!("creating the folder of {file}"), e))?;
    }
    write_atomic(&path, &body)?;
    written(&path, &root, flag(&q.full_info))
}

pub async fn delete_file(State(state): AppStateRef, UrlPath(file): UrlPath<String>) -> Result<StatusCode, ApiError> {
    let root = state.user_root();
    let path = confined(&root, &file)?;
    let _guard = state.user_lock.lock();
    if !path.is_file() {
        return Err(ApiError::NotFound(format!("no user data file {file}")));
    }
    std::fs::remove_file(&path).map_err(|e| ApiError::io(format!("deleting user data file {file}"), e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /userdata/{file}/move/{dest}?overwrite=&full_info=`.
pub async fn move_file(State(state): AppStateRef, UrlPath((file, dest)): UrlPath<(String, String)>, QueryArgs(q): QueryArgs<WriteQuery>) -> Result<Reply<Json>, ApiError> {
    let root = state.user_root();
    let from = confined(&root, &file)?;
    let to = confined(&root, &dest)?;
    let _guard = state.user_lock.lock();
    if !from.is_file() {
        return Err(ApiError::NotFound(format!("no user data file {file}")));
    }
    if to.is_dir() {
        return Err(ApiError::bad(format!("user data path {dest} is a folder")));
    }
    if !q.overwrite() && to.exists() {
        return Err(ApiError::Conflict(format!("user data file {dest} already exists")));
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| ApiError::io(format!("creating the folder of {dest}"), e))?;
    }
    std::fs::rename(&from, &to).map_err(|e| ApiError::io(format!("moving user data file {file} to {dest}"), e))?;
    written(&to, &root, flag(&q.full_info))
}
