//! OpenAI's `/v1/images/*` as sd-server has it: generations, edits and the model list.

use axum::extract::State;
use axum::Json as Reply;
use base64::Engine;
use sdflow_workflows::presets;
use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::{base_params, generate, AppStateRef, MaskRule, TempInputs, B64};
use crate::comfy::list_models;
use crate::error::ApiError;
use crate::extract::{text_field, Form, JsonBody};

/// OpenAI's request fields for the same flags.
const OPENAI_FIELDS: &[(&str, &str)] = &[("-W", "size"), ("-H", "size"), ("-b", "n"), ("-s", "seed"), ("-p", "prompt"), ("-n", "negative_prompt"), ("-i", "image"), ("--mask", "mask"), ("-m", "model")];

/// OpenAI's `size`: `WxH`; `auto` or absent keeps the default.
fn parse_size(size: Option<&str>) -> Result<Option<(i64, i64)>, ApiError> {
    let Some(s) = size
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "auto")
    else {
        return Ok(None);
    };
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse::<i64>().ok()?, h.trim().parse::<i64>().ok()?)));
    match parsed {
        Some((w, h)) if w > 0 && h > 0 => Ok(Some((w, h))),
        _ => Err(ApiError::bad(format!("size `{s}` is not WIDTHxHEIGHT"))),
    }
}

fn openai_reply(images: &[Vec<u8>]) -> Reply<Json> {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Reply(json!({
        "created": created,
        "data": images.iter().map(|b| json!({ "b64_json": B64.encode(b) })).collect::<Vec<_>>(),
        "output_format": "png",
    }))
}

fn check_format(format: Option<&str>) -> Result<(), ApiError> {
    match format {
        None | Some("b64_json") => Ok(()),
        Some(other) => Err(ApiError::bad(format!(
            "response_format `{other}` is not supported; use b64_json"
        ))),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct OpenAiRequest {
    prompt: String,
    negative_prompt: String,
    n: Option<i64>,
    size: Option<String>,
    model: Option<String>,
    response_format: Option<String>,
    seed: Option<i64>,
}

pub async fn generations(
    State(state): AppStateRef,
    JsonBody(req): JsonBody<OpenAiRequest>,
) -> Result<Reply<Json>, ApiError> {
    if req.prompt.is_empty() {
        return Err(ApiError::bad("prompt required"));
    }
    check_format(req.response_format.as_deref())?;
    let mut p = base_params(&state, req.model.as_deref().filter(|m| *m != "sd-cpp-local"))?;
    p.prompt = req.prompt;
    if !req.negative_prompt.is_empty() {
        p.negative_prompt = req.negative_prompt;
    }
    p.seed = presets::resolve_seed(req.seed.unwrap_or(-1));
    p.batch_count = req.n.unwrap_or(1);
    p.output = "openai.png".into();
    if let Some((w, h)) = parse_size(req.size.as_deref())? {
        (p.width, p.height, p.size_given) = (w, h, true);
    }
    let images = generate(&state, &p, OPENAI_FIELDS).await?;
    Ok(openai_reply(&images))
}

pub async fn edits(State(state): AppStateRef, form: Form) -> Result<Reply<Json>, ApiError> {
    let parts = form.parts(state.config.max_body_bytes).await?;
    let prompt = text_field(&parts, "prompt")?.unwrap_or("").to_string();
    if prompt.is_empty() {
        return Err(ApiError::bad("prompt required"));
    }
    check_format(text_field(&parts, "response_format")?)?;
    let image = parts
        .iter()
        .find(|p| p.name == "image" || p.name == "image[]")
        .ok_or_else(|| ApiError::bad("at least one image (`image` or `image[]`) required"))?;
    let n = match text_field(&parts, "n")? {
        Some(v) => v
            .trim()
            .parse::<i64>()
            .map_err(|_| ApiError::bad(format!("n `{v}` is not a number")))?,
        None => 1,
    };
    let mut p = base_params(&state, text_field(&parts, "model")?.filter(|m| *m != "sd-cpp-local"))?;
    p.prompt = prompt;
    if let Some(neg) = text_field(&parts, "negative_prompt")?.filter(|n| !n.is_empty()) {
        p.negative_prompt = neg.to_string();
    }
    p.seed = presets::resolve_seed(-1);
    p.batch_count = n;
    p.output = "openai_edit.png".into();
    if let Some((w, h)) = parse_size(text_field(&parts, "size")?)? {
        (p.width, p.height, p.size_given) = (w, h, true);
    }
    let mut temp = TempInputs(Vec::new());
    p.init_img = Some(temp.add(&state, &image.bytes, "image", None)?);
    if let Some(mask) = parts.iter().find(|p| p.name == "mask") {
        p.mask = Some(temp.add(
            &state,
            &mask.bytes,
            "mask",
            Some(MaskRule::TransparentRepaints),
        )?);
    }
    let images = generate(&state, &p, OPENAI_FIELDS).await?;
    drop(temp);
    Ok(openai_reply(&images))
}

pub async fn models(State(state): AppStateRef) -> Reply<Json> {
    let data: Vec<Json> = list_models(&state, "checkpoints")
        .into_iter()
        .map(|m| json!({ "id": m, "object": "model", "created": 0, "owned_by": "local" }))
        .collect();
    Reply(json!({ "object": "list", "data": data }))
}
