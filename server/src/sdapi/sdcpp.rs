//! stable-diffusion.cpp's native async API, sd-server's `/sdcpp/v1/*`: capabilities,
//! `img_gen` and `vid_gen` jobs (answered at once with the job's id), their status and
//! results, and cancelling them.
//!
//! A job is a preset prompt on the server's queue (its id is the prompt's, so it shows in
//! `/queue`, `/history` and `/jobs` too). Its status comes from the queue while it waits
//! or runs, and from the record kept here once it has ended: the encoded images or video,
//! kept for ten minutes as sd-server keeps them (then `410 Gone`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json as Reply;
use serde_json::{json, Value as Json};

use super::sdcpp_jobs::{unix_now, End, Job, Kind, Output};
use super::sdcpp_params::{self as params, IMG_FORMATS, MAX_BATCH, MAX_SIDE, MIN_SIDE, SDCPP_FIELDS, VID_FORMATS};
use super::{queue_preset, run_end, saved_files, stem, AppStateRef, Queued, RunEnd};
use crate::comfy::list_models;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;

/// `GET /sdcpp/v1/capabilities`.
pub async fn capabilities(State(state): AppStateRef) -> Result<Reply<Json>, ApiError> {
    let (p, img, vid) = match params::model_params(&state, None) {
        Ok(found) => found,
        // No model at all: nothing to generate with, which the lists say.
        Err(_) => (state.config.sdapi_defaults.clone(), false, false),
    };
    let (folder, file) = match (&p.model, &p.diffusion_model) {
        (Some(m), _) => ("checkpoints", m.as_str()),
        (None, Some(d)) => ("diffusion_models", d.as_str()),
        _ => ("checkpoints", ""),
    };
    let path = if file.is_empty() { String::new() } else { state.runtime.resolve_model(folder, file).map(|p| p.display().to_string()).unwrap_or_default() };
    let name = file.rsplit('/').next().unwrap_or(file);
    let sample = json!({
        "scheduler": params::sd_scheduler_name(p.scheduler.as_deref()),
        "sample_method": params::sd_sampler_name(p.sampling_method.as_deref()),
        "sample_steps": p.steps,
        "eta": p.eta,
        "shifted_timestep": 0,
        "flow_shift": p.flow_shift,
        "guidance": {
            "txt_cfg": p.cfg_scale,
            "img_cfg": p.img_cfg_scale,
            "distilled_guidance": p.guidance,
            "slg": { "layers": p.slg.layers, "layer_start": p.slg.start, "layer_end": p.slg.end, "scale": p.slg.scale },
        },
    });
    let hires = json!({
        "enabled": p.hires.enabled,
        "upscaler": p.hires.upscaler,
        "scale": p.hires.scale,
        "target_width": p.hires.width,
        "target_height": p.hires.height,
        "steps": p.hires.steps,
        "denoising_strength": p.hires.denoising_strength,
        "custom_sigmas": p.hires.sigmas.clone().unwrap_or_default(),
        "upscale_tile_size": p.hires.upscale_tile_size,
    });
    let tiling = json!({
        "enabled": p.tiling.enabled,
        "temporal_tiling": false,
        "tile_size_x": p.tiling.tile_size.0,
        "tile_size_y": p.tiling.tile_size.1,
        "target_overlap": p.tiling.overlap,
        "rel_size_x": p.tiling.relative.map_or(0.0, |r| r.0),
        "rel_size_y": p.tiling.relative.map_or(0.0, |r| r.1),
        "extra_tiling_args": "",
    });
    let shared = json!({
        "prompt": p.prompt,
        "negative_prompt": p.negative_prompt,
        "clip_skip": p.clip_skip,
        "width": p.width,
        "height": p.height,
        "strength": p.strength,
        "seed": p.seed,
        "sample_params": sample,
        "vae_tiling_params": tiling,
        "cache_mode": "disabled",
        "cache_option": "",
        "scm_mask": "",
        "scm_policy_dynamic": true,
        "output_compression": 100,
    });
    let with = |extra: Json| {
        let mut d = shared.clone();
        for (k, v) in extra.as_object().into_iter().flatten() {
            d[k] = v.clone();
        }
        d
    };
    let mut defaults = serde_json::Map::new();
    let mut formats = serde_json::Map::new();
    let mut features = serde_json::Map::new();
    let mut modes = Vec::new();
    if img {
        modes.push("img_gen");
        defaults.insert("img_gen".into(), with(json!({
            "batch_count": p.batch_count,
            "qwen_image_layers": p.qwen_image_layers,
            "auto_resize_ref_image": p.auto_resize_ref_image,
            "increase_ref_index": p.increase_ref_index,
            "control_strength": p.control_strength,
            "ip_adapter_strength": 1.0,
            "hires": hires,
            "output_format": IMG_FORMATS[0],
        })));
        formats.insert("img_gen".into(), json!(IMG_FORMATS));
        features.insert("img_gen".into(), json!({
            "init_image": true,
            "mask_image": true,
            "control_image": p.control_net.is_some(),
            "ip_adapter_image": false,
            "ref_images": true,
            "lora": true,
            "vae_tiling": true,
            "hires": true,
            "cache": false,
            "cancel_queued": true,
            "cancel_generating": true,
        }));
    }
    if vid {
        modes.push("vid_gen");
        let video = p.video.clone().unwrap_or_default();
        defaults.insert("vid_gen".into(), with(json!({
            "video_frames": video.frames,
            "fps": video.fps,
            "moe_boundary": 0.875,
            "vace_strength": p.vace_strength,
            "high_noise_sample_params": { "sample_steps": -1 },
            "output_format": VID_FORMATS[0],
        })));
        formats.insert("vid_gen".into(), json!(VID_FORMATS));
        features.insert("vid_gen".into(), json!({
            "init_image": true,
            "end_image": true,
            "control_frames": true,
            "high_noise_sample_params": state.config.video_defaults.high_noise.is_some() && p.model_info.family == sdflow_workflows::presets::Family::Wan,
            "lora": true,
            "vae_tiling": true,
            "cache": false,
            "cancel_queued": true,
            "cancel_generating": true,
        }));
    }
    let current = modes.first().copied().unwrap_or("");
    let mut upscalers: Vec<Json> = ["None", "Lanczos", "Nearest", "Latent", "Latent (nearest)", "Latent (nearest-exact)", "Latent (antialiased)", "Latent (bicubic)", "Latent (bicubic antialiased)"].iter().map(|n| json!({ "name": n })).collect();
    upscalers.extend(list_models(&state, "upscale_models").iter().map(|m| json!({ "name": stem(m) })));
    Ok(Reply(json!({
        "model": { "name": name, "stem": stem(name), "path": path },
        "current_mode": current,
        "supported_modes": modes,
        "defaults": defaults.get(current).cloned().unwrap_or(json!({})),
        "output_formats": formats.get(current).cloned().unwrap_or(json!([])),
        "features": features.get(current).cloned().unwrap_or(json!({ "cancel_queued": true, "cancel_generating": true })),
        "defaults_by_mode": defaults,
        "output_formats_by_mode": formats,
        "features_by_mode": features,
        "samplers": params::sd_samplers(),
        "schedulers": params::sd_schedulers(),
        "loras": list_models(&state, "loras").iter().map(|m| json!({ "name": stem(m), "path": m })).collect::<Vec<_>>(),
        "upscalers": upscalers,
        "limits": {
            "min_width": MIN_SIDE,
            "max_width": MAX_SIDE,
            "min_height": MIN_SIDE,
            "max_height": MAX_SIDE,
            "max_batch_count": MAX_BATCH,
            "max_queue_size": state.queue.max(),
        },
    })))
}

/// `POST /sdcpp/v1/img_gen`.
pub async fn img_gen(State(state): AppStateRef, JsonBody(body): JsonBody<Json>) -> Result<(StatusCode, Reply<Json>), ApiError> {
    submit(state, body, Kind::Img).await
}

/// `POST /sdcpp/v1/vid_gen`.
pub async fn vid_gen(State(state): AppStateRef, JsonBody(body): JsonBody<Json>) -> Result<(StatusCode, Reply<Json>), ApiError> {
    submit(state, body, Kind::Vid).await
}

/// Queues the request's preset as a job and answers `202` with its id.
async fn submit(state: Arc<AppState>, body: Json, kind: Kind) -> Result<(StatusCode, Reply<Json>), ApiError> {
    let req = params::request(&state, &body, kind)?;
    let id = format!("job_{}", uuid::Uuid::new_v4().simple());
    let created = unix_now();
    let queued = queue_preset(&state, &req.params, SDCPP_FIELDS, id.clone()).await?;
    {
        let mut inner = state.sdcpp_jobs.inner.lock();
        inner.purge(created);
        inner.jobs.insert(id.clone(), Job { kind, created, started: None, completed: None, end: None });
    }
    tokio::spawn(watch(state.clone(), id.clone(), queued, req.temp, req.output));
    let poll_url = format!("/sdcpp/v1/jobs/{id}");
    Ok((StatusCode::ACCEPTED, Reply(json!({ "id": id, "kind": kind.name(), "status": "queued", "created": created, "poll_url": poll_url }))))
}

/// Waits for job `id`'s prompt to end and records how: its files encoded as the request
/// asked, why it failed, or that it was cancelled (dropped from the queue or interrupted).
async fn watch(state: Arc<AppState>, id: String, queued: Queued, temp: super::TempInputs, output: Output) {
    let Queued { rx, save_nodes } = queued;
    let entry = rx.await;
    drop(temp);
    let (end, started) = match entry {
        Err(_) => (End::Cancelled, None),
        Ok(entry) => {
            let started = entry["status"]["messages"].as_array().into_iter().flatten().find(|m| m[0] == "execution_start").and_then(|m| m[1]["timestamp"].as_i64()).map(|ms| ms / 1000);
            let end = match run_end(&entry) {
                Ok(()) => match saved_files(&state, &entry, &save_nodes).await {
                    Ok(files) => match tokio::task::spawn_blocking(move || output.encode(files)).await {
                        Ok(Ok(result)) => End::Completed(result),
                        Ok(Err(e)) => End::Failed(e),
                        Err(e) => End::Failed(format!("encoding the result: {e}")),
                    },
                    Err(e) => End::Failed(format!("reading the outputs: {e}")),
                },
                Err(RunEnd::Interrupted | RunEnd::Removed) => End::Cancelled,
                Err(RunEnd::Failed(why)) => End::Failed(why),
            };
            (end, started)
        }
    };
    state.sdcpp_jobs.finish(&id, end, started);
}

/// The job as sd-server reports it, with sdflow's `progress` of a generating one (the
/// running sampler's step and steps).
fn job_json(state: &AppState, id: &str) -> Result<Json, ApiError> {
    let (_, pending) = state.queue.snapshot()?;
    let (live_id, live_started, live_step) = {
        let live = state.live.lock();
        (live.prompt_id.clone(), live.started, live.step)
    };
    let now = unix_now();
    let mut inner = state.sdcpp_jobs.inner.lock();
    let job = inner.job(id, now)?;
    let position = pending.iter().position(|item| item[1].as_str() == Some(id));
    let running_here = live_id.as_deref() == Some(id);
    let mut progress = Json::Null;
    let (status, result, error) = match (&job.end, position) {
        (Some(End::Completed(r)), _) => ("completed", r.clone(), Json::Null),
        (Some(End::Failed(m)), _) => ("failed", Json::Null, json!({ "code": "generation_failed", "message": m })),
        (Some(End::Cancelled), _) => ("cancelled", Json::Null, json!({ "code": "cancelled", "message": "job cancelled by client" })),
        (None, Some(_)) => ("queued", Json::Null, Json::Null),
        (None, None) => {
            if job.started.is_none() {
                let elapsed = live_started.filter(|_| running_here).map_or(0, |t| t.elapsed().as_secs() as i64);
                job.started = Some(now - elapsed);
            }
            if let (true, Some((step, steps))) = (running_here, live_step) {
                progress = json!({ "step": step, "steps": steps });
            }
            ("generating", Json::Null, Json::Null)
        }
    };
    Ok(json!({
        "id": id,
        "kind": job.kind.name(),
        "status": status,
        "created": job.created,
        "started": job.started,
        "completed": job.completed,
        "queue_position": if status == "queued" { position.map_or(0, |p| p + 1) } else { 0 },
        "result": result,
        "error": error,
        "progress": progress,
    }))
}

/// `GET /sdcpp/v1/jobs/{id}`.
pub async fn job(State(state): AppStateRef, Path(id): Path<String>) -> Result<Reply<Json>, ApiError> {
    job_json(&state, &id).map(Reply)
}

/// `POST /sdcpp/v1/jobs/{id}/cancel`: a queued job leaves the queue; a generating one is
/// interrupted (sd-server answers 409 there; sdflow stops it at its next step and answers
/// once it has stopped); a finished one is left as it is.
pub async fn cancel(State(state): AppStateRef, Path(id): Path<String>) -> Result<Reply<Json>, ApiError> {
    let ended = |state: &AppState| -> Result<bool, ApiError> { Ok(state.sdcpp_jobs.inner.lock().job(&id, unix_now())?.end.is_some()) };
    if ended(&state)? {
        return job_json(&state, &id).map(Reply);
    }
    if state.queue.delete(std::slice::from_ref(&id))? > 0 {
        state.sdcpp_jobs.finish(&id, End::Cancelled, None);
        state.broadcast_status();
        return job_json(&state, &id).map(Reply);
    }
    if state.queue.interrupt(Some(&id))? {
        state.broadcast_status();
        // The sampler stops at its next step; its run then ends as cancelled.
        for _ in 0..400 {
            if ended(&state)? {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        return job_json(&state, &id).map(Reply);
    }
    if ended(&state)? {
        return job_json(&state, &id).map(Reply);
    }
    Err(ApiError::Conflict(format!("job {id} has finished generating and its result is being encoded; it can no longer be cancelled")))
}
