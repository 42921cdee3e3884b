//! `POST /upload/image`, `POST /upload/mask` and `GET /view`, confined to the input,
//! output and temp folders.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json as Reply;
use axum::body::Bytes;
use serde::Deserialize;
use serde_json::{json, Value as Json};

use crate::error::ApiError;
use crate::extract::{text_field, Form, Part, QueryArgs};
use crate::history::write_atomic;
use crate::security::{confined, file_name, relative_path};
use crate::state::AppState;

/// Checks that `bytes` are an image of a format we read, within LoadImage's size limits;
/// returns its dimensions. Only the header is decoded.
pub fn check_image(bytes: &[u8], what: &str) -> Result<(u32, u32), ApiError> {
    let reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ApiError::bad(format!("{what}: {e}")))?;
    if reader.format().is_none() {
        return Err(ApiError::bad(format!(
            "{what} is not a PNG, JPEG or WebP image"
        )));
    }
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| ApiError::bad(format!("{what}: not a readable image: {e}")))?;
    let side = sdflow_nodes::image::MAX_IMAGE_SIDE;
    let pixels = sdflow_nodes::image::MAX_IMAGE_PIXELS;
    if w == 0 || h == 0 || w > side || h > side || u64::from(w) * u64::from(h) > pixels {
        return Err(ApiError::bad(format!(
            "{what} is {w}x{h}; images must be at most {side} pixels a side and {pixels} pixels in all"
        )));
    }
    Ok((w, h))
}

/// The folder `subfolder` names inside `root`, created if missing, checked (after
/// resolving symlinks) to still be inside `root`.
fn target_dir(root: &Path, subfolder: &str) -> Result<PathBuf, ApiError> {
    let rel = relative_path("subfolder", subfolder)?;
    let dir = root.join(&rel);
    // Walk down one level at a time so a symlink pointing outside is refused before
    // anything is created through it.
    let mut at = root.to_path_buf();
    for part in rel.components() {
        at.push(part);
        if !at.exists() {
            std::fs::create_dir(&at)
                .map_err(|e| ApiError::io(format!("creating {subfolder}"), e))?;
        }
        confined(root, &at)?;
    }
    confined(root, &dir)
}

struct Upload {
    /// The uploaded file's bytes (shared, not copied).
    image: Bytes,
    name: String,
    subfolder: String,
    kind: String,
    overwrite: bool,
}

fn parse_upload(parts: &[Part]) -> Result<Upload, ApiError> {
    let image = parts
        .iter()
        .find(|p| p.name == "image")
        .ok_or_else(|| ApiError::bad("the form has no `image` file"))?;
    let name = image
        .file_name
        .as_deref()
        .ok_or_else(|| ApiError::bad("the `image` part has no file name"))?;
    let name = file_name(name)?.to_string();
    let overwrite = matches!(text_field(parts, "overwrite")?, Some("true" | "1"));
    Ok(Upload {
        image: image.bytes.clone(),
        name,
        subfolder: text_field(parts, "subfolder")?.unwrap_or("").to_string(),
        kind: text_field(parts, "type")?
            .filter(|t| !t.is_empty())
            .unwrap_or("input")
            .to_string(),
        overwrite,
    })
}

/// Stores an upload as ComfyUI does: a taken name gets ` (1)`, ` (2)`, … unless the file
/// there has the same bytes (then it is reused) or `overwrite` is set.
fn store(state: &AppState, up: &Upload, bytes: &[u8]) -> Result<Json, ApiError> {
    let root = state.dirs.by_type(&up.kind)?;
    let dir = target_dir(root, &up.subfolder)?;
    let (stem, ext) = match up.name.rsplit_once('.') {
        Some((s, e)) => (s.to_string(), format!(".{e}")),
        None => (up.name.clone(), String::new()),
    };
    let mut name = up.name.clone();
    let mut i = 1;
    loop {
        let path = dir.join(&name);
        if up.overwrite || !path.exists() {
            break;
        }
        if std::fs::read(&path).is_ok_and(|old| old == bytes) {
            return Ok(json!({ "name": name, "subfolder": up.subfolder, "type": up.kind }));
        }
        name = format!("{stem} ({i}){ext}");
        i += 1;
        if i > 10_000 {
            return Err(ApiError::bad(format!(
                "too many files named like {}",
                up.name
            )));
        }
    }
    let path = dir.join(&name);
    // A symlink planted at the target would otherwise be written through.
    if path.is_symlink() {
        return Err(ApiError::Forbidden(format!("{name} is a symbolic link")));
    }
    write_atomic(&path, bytes)?;
    Ok(json!({ "name": name, "subfolder": up.subfolder, "type": up.kind }))
}

pub async fn upload_image(
    State(state): State<Arc<AppState>>,
    form: Form,
) -> Result<Reply<Json>, ApiError> {
    let parts = form.parts(state.config.max_body_bytes).await?;
    let up = parse_upload(&parts)?;
    // ComfyUI's frontend uploads LoadVideo's files here too; they are kept as they are
    // (LoadVideo decodes them, naming the file on failure).
    if !sdflow_nodes::video::decode::looks_like_video(&up.image, &up.name) {
        check_image(&up.image, &format!("upload {}", up.name))?;
    }
    let reply = tokio::task::spawn_blocking(move || store(&state, &up, &up.image))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(Reply(reply))
}

#[derive(Deserialize)]
struct OriginalRef {
    filename: String,
    #[serde(default)]
    subfolder: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

/// ComfyUI's mask editor upload: the alpha channel of the uploaded image becomes the
/// alpha of the original (`original_ref`), saved as a new PNG.
pub async fn upload_mask(
    State(state): State<Arc<AppState>>,
    form: Form,
) -> Result<Reply<Json>, ApiError> {
    let parts = form.parts(state.config.max_body_bytes).await?;
    let up = parse_upload(&parts)?;
    check_image(&up.image, &format!("mask {}", up.name))?;
    let original: OriginalRef = serde_json::from_str(
        text_field(&parts, "original_ref")?
            .ok_or_else(|| ApiError::bad("the form has no `original_ref`"))?,
    )
    .map_err(|e| ApiError::bad(format!("original_ref: {e}")))?;
    let kind = original.kind.clone().unwrap_or_else(|| "output".into());
    let root = state.dirs.by_type(&kind)?.to_path_buf();
    let src = root
        .join(relative_path(
            "original_ref.subfolder",
            &original.subfolder,
        )?)
        .join(file_name(&original.filename)?);
    let src = confined(&root, &src)?;
    let mask_bytes = up.image.clone();
    let reply = tokio::task::spawn_blocking(move || {
        let original_bytes =
            std::fs::read(&src).map_err(|e| ApiError::io(original.filename.clone(), e))?;
        check_image(&original_bytes, &format!("original {}", original.filename))?;
        let mut img = image::load_from_memory(&original_bytes)
            .map_err(|e| ApiError::bad(format!("original {}: {e}", original.filename)))?
            .to_rgba8();
        let mask = image::load_from_memory(&mask_bytes)
            .map_err(|e| ApiError::bad(format!("mask: {e}")))?
            .to_rgba8();
        if mask.dimensions() != img.dimensions() {
            return Err(ApiError::bad(format!(
                "mask is {}x{} but the original is {}x{}",
                mask.width(),
                mask.height(),
                img.width(),
                img.height()
            )));
        }
        for (p, m) in img.pixels_mut().zip(mask.pixels()) {
            p.0[3] = m.0[3];
        }
        let mut png = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|e| ApiError::Internal(format!("encoding the masked image: {e}")))?;
        store(&state, &up, &png)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(Reply(reply))
}

#[derive(Deserialize)]
pub struct ViewQuery {
    filename: String,
    #[serde(default)]
    subfolder: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

/// The content type of a file by its extension (the served outputs, the user's files, a
/// `--front-end-root`'s assets).
pub fn mime_of(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "json" | "map" => "application/json",
        "txt" | "md" | "csv" => "text/plain; charset=utf-8",
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "wasm" => "application/wasm",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "avi" => "video/x-msvideo",
        _ => "application/octet-stream",
    }
}

/// The file a `{filename, subfolder, type}` reference names, confined to its folder.
pub fn resolve(
    state: &AppState,
    filename: &str,
    subfolder: &str,
    kind: &str,
) -> Result<PathBuf, ApiError> {
    let root = state.dirs.by_type(kind)?;
    let path = root
        .join(relative_path("subfolder", subfolder)?)
        .join(file_name(filename)?);
    let real = confined(root, &path)?;
    if !real.is_file() {
        return Err(ApiError::NotFound(format!("{filename} is not a file")));
    }
    Ok(real)
}

/// An output, temp or input file's bytes: from the folder, or (scale-out with
/// `--output-store`) from the object store the workers put outputs in.
pub async fn read_file(state: &Arc<AppState>, filename: &str, subfolder: &str, kind: &str) -> Result<Vec<u8>, ApiError> {
    if let (Some(objects), "output" | "temp") = (&state.objects, kind) {
        let sub = relative_path("subfolder", subfolder)?.to_string_lossy().replace('\\', "/");
        let key = objects.key(kind, &sub, file_name(filename)?);
        let objects = objects.clone();
        let got = tokio::task::spawn_blocking(move || objects.get(&key))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::QueueUnavailable(e.to_string()))?;
        return got.ok_or_else(|| ApiError::NotFound(format!("{filename} is not a file")));
    }
    let path = resolve(state, filename, subfolder, kind)?;
    tokio::fs::read(&path).await.map_err(|e| ApiError::io(filename.to_string(), e))
}

pub async fn view(
    State(state): State<Arc<AppState>>,
    QueryArgs(q): QueryArgs<ViewQuery>,
) -> Result<Response, ApiError> {
    let kind = q
        .kind
        .as_deref()
        .filter(|k| !k.is_empty())
        .unwrap_or("output");
    let bytes = read_file(&state, &q.filename, &q.subfolder, kind).await?;
    let mut response = bytes.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(mime_of(&q.filename)),
    );
    // The name went through `file_name`, but quotes would still break the header.
    let safe: String = q
        .filename
        .chars()
        .filter(|c| *c != '"' && !c.is_control())
        .collect();
    if let Ok(v) = HeaderValue::from_str(&format!("filename=\"{safe}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(response)
}
