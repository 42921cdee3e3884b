//! ComfyUI's `/api/jobs`: the queue and the history as one list of jobs, which ComfyUI's
//! own frontend reads for its queue and history panel (and cancels through).
//!
//! The job shapes follow ComfyUI's `comfy_execution/jobs.py`: a queued prompt is
//! `pending` or `in_progress` with no outputs; a finished one takes its status, times
//! and first previewable output from its history entry.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json as Reply;
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};

use crate::error::ApiError;
use crate::extract::{JsonBody, QueryArgs};
use crate::state::AppState;

type AppStateRef = State<Arc<AppState>>;

const PENDING: &str = "pending";
const IN_PROGRESS: &str = "in_progress";
const COMPLETED: &str = "completed";
const FAILED: &str = "failed";
const CANCELLED: &str = "cancelled";
const ALL: [&str; 5] = [PENDING, IN_PROGRESS, COMPLETED, FAILED, CANCELLED];

/// Output kinds the frontend can preview (ComfyUI's `PREVIEWABLE_MEDIA_TYPES`).
const PREVIEWABLE: [&str; 5] = ["images", "video", "audio", "3d", "text"];

/// `create_time` and the saved workflow's id, both kept in `extra_data`.
fn job_metadata(extra_data: &Json) -> (Option<Json>, Option<Json>) {
    let create_time = extra_data.get("create_time").cloned();
    let workflow_id = extra_data
        .get("extra_pnginfo")
        .and_then(|p| p.get("workflow"))
        .and_then(|w| w.get("id"))
        .cloned();
    (create_time, workflow_id)
}

/// Inserts the entries whose values are present, as ComfyUI's `prune_dict` drops `None`s.
fn pruned(entries: Vec<(&str, Option<Json>)>) -> Map<String, Json> {
    entries
        .into_iter()
        .filter_map(|(k, v)| v.filter(|v| !v.is_null()).map(|v| (k.to_string(), v)))
        .collect()
}

/// A queue item (`[number, prompt_id, prompt, extra_data, outputs]`) as a job.
fn queued_job(item: &Json, status: &str) -> Json {
    let (create_time, workflow_id) = job_metadata(&item[3]);
    Json::Object(pruned(vec![
        ("id", Some(item[1].clone())),
        ("status", Some(json!(status))),
        ("priority", Some(item[0].clone())),
        ("create_time", create_time),
        ("outputs_count", Some(json!(0))),
        ("previewable_outputs_count", Some(json!(0))),
        ("workflow_id", workflow_id),
    ]))
}

/// Files the frontend previews by name when their kind does not say so.
const THREE_D_EXTENSIONS: [&str; 5] = [".obj", ".fbx", ".gltf", ".glb", ".usdz"];
const TEXT_EXTENSIONS: [&str; 3] = [".txt", ".md", ".json"];

fn filename_ends(item: &Json, exts: &[&str]) -> bool {
    let name = item.get("filename").and_then(Json::as_str).unwrap_or("").to_lowercase();
    exts.iter().any(|e| name.ends_with(e))
}

fn is_previewable(media_type: &str, item: &Json) -> bool {
    if PREVIEWABLE.contains(&media_type) {
        return true;
    }
    let format = item.get("format").and_then(Json::as_str).unwrap_or("");
    format.starts_with("video/")
        || format.starts_with("audio/")
        || filename_ends(item, &THREE_D_EXTENSIONS)
        || filename_ends(item, &TEXT_EXTENSIONS)
}

/// Counts output items and picks the one the frontend shows for the job: saved
/// (`type: output`) visual media first, other visual media next, a text file last.
fn outputs_summary(outputs: &Json) -> (usize, usize, Option<Json>) {
    let (mut count, mut previewable) = (0, 0);
    let (mut saved, mut fallback, mut text_file) = (None, None, None);
    for (node_id, node_outputs) in outputs.as_object().into_iter().flatten() {
        for (media_type, items) in node_outputs.as_object().into_iter().flatten() {
            if media_type == "animated" {
                continue;
            }
            for item in items.as_array().into_iter().flatten() {
                if !item.is_object() {
                    continue;
                }
                count += 1;
                if !is_previewable(media_type, item) {
                    continue;
                }
                previewable += 1;
                let mut enriched = item.clone();
                enriched["nodeId"] = json!(node_id);
                if enriched.get("mediaType").is_none() {
                    enriched["mediaType"] = json!(media_type);
                }
                if media_type == "text" || filename_ends(item, &TEXT_EXTENSIONS) {
                    text_file.get_or_insert(enriched);
                } else if item.get("type").and_then(Json::as_str) == Some("output") {
                    saved.get_or_insert(enriched);
                } else {
                    fallback.get_or_insert(enriched);
                }
            }
        }
    }
    (count, previewable, saved.or(fallback).or(text_file))
}

/// A history entry as a job; `full` adds the outputs, the status and the prompt itself.
fn finished_job(prompt_id: &str, entry: &Json, full: bool) -> Json {
    let item = &entry["prompt"];
    let (create_time, workflow_id) = job_metadata(&item[3]);
    let status_info = &entry["status"];
    let (mut start, mut end, mut error, mut interrupted) = (None, None, None, false);
    for message in status_info["messages"].as_array().into_iter().flatten() {
        let (Some(name), Some(data)) = (message[0].as_str(), message.get(1)) else {
            continue;
        };
        match name {
            "execution_start" => start = data.get("timestamp").cloned(),
            "execution_success" | "execution_error" | "execution_interrupted" => {
                end = data.get("timestamp").cloned();
                match name {
                    "execution_error" => error = Some(data.clone()),
                    "execution_interrupted" => interrupted = true,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let status = match status_info["status_str"].as_str() {
        Some("error") if interrupted => CANCELLED,
        Some("error") => FAILED,
        _ => COMPLETED,
    };
    let (count, previewable, preview) = outputs_summary(&entry["outputs"]);
    let mut job = pruned(vec![
        ("id", Some(json!(prompt_id))),
        ("status", Some(json!(status))),
        ("priority", Some(item[0].clone())),
        ("create_time", create_time),
        ("execution_start_time", start),
        ("execution_end_time", end),
        ("execution_error", error),
        ("outputs_count", Some(json!(count))),
        ("previewable_outputs_count", Some(json!(previewable))),
        ("preview_output", preview),
        ("workflow_id", workflow_id),
    ]);
    if full {
        job.insert("outputs".into(), entry["outputs"].clone());
        job.insert("execution_status".into(), status_info.clone());
        job.insert(
            "workflow".into(),
            json!({ "prompt": item[2], "extra_data": item[3] }),
        );
    }
    Json::Object(job)
}

#[derive(Deserialize)]
pub struct JobsQuery {
    status: Option<String>,
    workflow_id: Option<String>,
    sort_by: Option<String>,
    sort_order: Option<String>,
    limit: Option<String>,
    offset: Option<String>,
}

/// `GET /jobs?status=a,b&workflow_id=&sort_by=created_at|execution_duration&sort_order=&limit=&offset=`.
pub async fn list(State(state): AppStateRef, QueryArgs(q): QueryArgs<JobsQuery>) -> Result<Reply<Json>, ApiError> {
    let statuses: Vec<String> = match &q.status {
        Some(s) => s.split(',').map(|s| s.trim().to_lowercase()).filter(|s| !s.is_empty()).collect(),
        None => ALL.iter().map(|s| s.to_string()).collect(),
    };
    let invalid: Vec<&str> = statuses.iter().map(String::as_str).filter(|s| !ALL.contains(s)).collect();
    if !invalid.is_empty() {
        return Err(ApiError::bad(format!("invalid status value(s): {}; valid values: {}", invalid.join(", "), ALL.join(", "))));
    }
    let wants = |s: &str| statuses.iter().any(|w| w == s);
    let sort_by = q.sort_by.as_deref().unwrap_or("created_at").to_lowercase();
    if sort_by != "created_at" && sort_by != "execution_duration" {
        return Err(ApiError::bad("sort_by must be 'created_at' or 'execution_duration'"));
    }
    let descending = match q.sort_order.as_deref().unwrap_or("desc").to_lowercase().as_str() {
        "desc" => true,
        "asc" => false,
        _ => return Err(ApiError::bad("sort_order must be 'asc' or 'desc'")),
    };
    let limit = match &q.limit {
        None => None,
        Some(l) => match l.parse::<i64>() {
            Ok(n) if n > 0 => Some(n as usize),
            Ok(_) => return Err(ApiError::bad("limit must be a positive integer")),
            Err(_) => return Err(ApiError::bad("limit must be an integer")),
        },
    };
    let offset = match &q.offset {
        None => 0,
        Some(o) => o.parse::<i64>().map_err(|_| ApiError::bad("offset must be an integer"))?.max(0) as usize,
    };

    let (running, pending) = state.queue.snapshot()?;
    let mut jobs = Vec::new();
    if wants(IN_PROGRESS) {
        jobs.extend(running.iter().map(|i| queued_job(i, IN_PROGRESS)));
    }
    if wants(PENDING) {
        jobs.extend(pending.iter().map(|i| queued_job(i, PENDING)));
    }
    if wants(COMPLETED) || wants(FAILED) || wants(CANCELLED) {
        for (id, entry) in state.history.all()? {
            let job = finished_job(&id, &entry, false);
            if job["status"].as_str().is_some_and(wants) {
                jobs.push(job);
            }
        }
    }
    if let Some(w) = &q.workflow_id {
        jobs.retain(|j| j["workflow_id"].as_str() == Some(w));
    }
    let key = |j: &Json| -> f64 {
        let num = |k: &str| j.get(k).and_then(Json::as_f64).unwrap_or(0.0);
        if sort_by == "execution_duration" {
            let (s, e) = (num("execution_start_time"), num("execution_end_time"));
            if s != 0.0 && e != 0.0 {
                e - s
            } else {
                0.0
            }
        } else {
            num("create_time")
        }
    };
    // Stable, as Python's sort: equal keys keep queue-then-history order.
    jobs.sort_by(|a, b| {
        let o = key(a).total_cmp(&key(b));
        if descending {
            o.reverse()
        } else {
            o
        }
    });
    let total = jobs.len();
    let page: Vec<Json> = jobs.into_iter().skip(offset).take(limit.unwrap_or(usize::MAX)).collect();
    let has_more = offset + page.len() < total;
    Ok(Reply(json!({
        "jobs": page,
        "pagination": { "offset": offset, "limit": limit, "total": total, "has_more": has_more },
    })))
}

/// The job with every detail: for a finished one its outputs and the prompt it ran.
fn find(state: &AppState, id: &str) -> Result<Option<Json>, ApiError> {
    if let Some(entry) = state.history.get(id)? {
        return Ok(Some(finished_job(id, &entry, true)));
    }
    let (running, pending) = state.queue.snapshot()?;
    Ok(running
        .iter()
        .find(|i| i[1].as_str() == Some(id))
        .map(|i| queued_job(i, IN_PROGRESS))
        .or_else(|| pending.iter().find(|i| i[1].as_str() == Some(id)).map(|i| queued_job(i, PENDING))))
}

pub async fn get_one(State(state): AppStateRef, Path(id): Path<String>) -> Result<Reply<Json>, ApiError> {
    find(&state, &id)?.map(Reply).ok_or_else(|| ApiError::NotFound(format!("no job {id}")))
}

/// Cancels one job whatever its state: a pending one leaves the queue, the running one is
/// interrupted, a finished one is left as it is. Returns whether something was cancelled.
fn cancel(state: &AppState, id: &str) -> Result<bool, ApiError> {
    if state.queue.delete(&[id.to_string()])? > 0 {
        return Ok(true);
    }
    // Not pending (any more): running, finished, or unknown.
    if state.queue.interrupt(Some(id))? {
        return Ok(true);
    }
    if state.history.get(id)?.is_some() {
        return Ok(false);
    }
    Err(ApiError::NotFound(format!("no job {id}")))
}

pub async fn cancel_one(State(state): AppStateRef, Path(id): Path<String>) -> Result<Reply<Json>, ApiError> {
    let cancelled = cancel(&state, &id)?;
    if cancelled {
        state.broadcast_status();
    }
    Ok(Reply(json!({ "cancelled": cancelled })))
}

#[derive(Deserialize)]
pub struct CancelMany {
    job_ids: Vec<String>,
}

/// `POST /jobs/cancel {"job_ids": [...]}`: all known or nothing done.
pub async fn cancel_many(State(state): AppStateRef, JsonBody(body): JsonBody<CancelMany>) -> Result<Reply<Json>, ApiError> {
    if body.job_ids.is_empty() || body.job_ids.len() > 100 {
        return Err(ApiError::bad("job_ids must hold 1 to 100 ids"));
    }
    let mut unknown: Vec<&str> = Vec::new();
    for id in &body.job_ids {
        if !state.queue.is_known(id)? && state.history.get(id)?.is_none() {
            unknown.push(id);
        }
    }
    if !unknown.is_empty() {
        return Err(ApiError::NotFound(format!("no jobs {}", unknown.join(", "))));
    }
    let mut cancelled = false;
    for id in &body.job_ids {
        // A job may finish between the check and here; that is not an error.
        cancelled |= cancel(&state, id).unwrap_or(false);
    }
    if cancelled {
        state.broadcast_status();
    }
    Ok(Reply(json!({ "cancelled": cancelled })))
}
