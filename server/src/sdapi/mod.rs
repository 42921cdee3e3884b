//! sd-server's endpoints: A1111's `/sdapi/v1/*`, OpenAI's `/v1/images/*` and sd-server's
//! native async `/sdcpp/v1/*`. Each request becomes a workflow through the CLI presets
//! ([`sdflow_workflows::presets`]) and runs on the same queue as ComfyUI prompts (so it
//! shows in `/queue` and `/history`); A1111 and OpenAI requests are answered once it has
//! run, with the images inline as base64 PNGs, sdcpp ones at once with a job to poll.

mod a1111;
mod controlnet;
mod fields;
mod inpaint;
mod openai;
mod sdcpp;
pub(crate) mod sdcpp_jobs;
mod sdcpp_params;

pub use a1111::{embeddings, get_options, img2img, interrupt, latent_upscale_modes, loras, png_info, post_options, progress, refresh, samplers, schedulers, scripts, sd_models, txt2img, upscalers};
pub use controlnet::{model_list as controlnet_model_list, module_list as controlnet_module_list, version as controlnet_version};
pub use openai::{edits, generations, models};
pub use sdcpp::{cancel as sdcpp_cancel, capabilities as sdcpp_capabilities, img_gen as sdcpp_img_gen, job as sdcpp_job, vid_gen as sdcpp_vid_gen};

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use base64::Engine;
use sdflow_workflows::presets::{self, ImgGenParams, PresetError};
use serde_json::json;

use crate::comfy::{enqueue_off_thread, list_models, Submission};
use crate::error::ApiError;
use crate::files::check_image;
use crate::state::AppState;

type AppStateRef = State<Arc<AppState>>;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The checkpoint a request names (by file name, by stem, or by A1111 title
/// `name [hash]`), or the first one there is.
fn pick_checkpoint(state: &AppState, wanted: Option<&str>) -> Result<String, ApiError> {
    let all = list_models(state, "checkpoints");
    // A request that names none takes the model `/sdapi/v1/options` chose.
    let chosen = state.sdapi_options.lock().checkpoint.clone();
    let Some(wanted) = wanted.map(str::trim).filter(|w| !w.is_empty()).or(chosen.as_deref()) else {
        return all.into_iter().next().ok_or_else(|| {
            ApiError::bad(format!(
                "no checkpoint in {}; put a model file there",
                state.config.models_dir.display()
            ))
        });
    };
    let bare = wanted.split(" [").next().unwrap_or(wanted);
    all.iter()
        .find(|m| *m == bare || stem(m) == bare)
        .cloned()
        .ok_or_else(|| {
            ApiError::bad(format!(
                "no checkpoint `{wanted}` (have: {})",
                all.join(", ")
            ))
        })
}

/// What a request starts from: the server's defaults (sd-server's command line) and the
/// model — the checkpoint the request names, else the one `/sdapi/v1/options` (or `-m`)
/// chose, else sd-server's `--diffusion-model` with its parts, else the first checkpoint.
/// A checkpoint replaces `--diffusion-model` and the parts that came with it; part flags
/// given with `-m` instead (`--vae` beside it, say) stay, as they would in sd-server.
pub(crate) fn base_params(state: &AppState, wanted: Option<&str>) -> Result<ImgGenParams, ApiError> {
    let mut p = state.config.sdapi_defaults.clone();
    let wanted = wanted.map(str::trim).filter(|w| !w.is_empty());
    let chosen = state.sdapi_options.lock().checkpoint.is_some();
    if let (None, false, Some(diffusion)) = (wanted, chosen, &p.diffusion_model) {
        let path = state.runtime.resolve_model("diffusion_models", diffusion).ok();
        p.model_info = presets::ModelInfo::detect(None, path.as_deref())
            .unwrap_or_else(|| presets::ModelInfo::guess_from_parts(p.clip_l.is_some(), p.clip_g.is_some(), p.t5xxl.is_some(), p.llm.is_some()));
        return Ok(p);
    }
    let model = pick_checkpoint(state, wanted)?;
    p.model_info = checkpoint_info(state, &model);
    p.model = Some(model);
    if p.diffusion_model.take().is_some() {
        (p.vae, p.clip_l, p.clip_g, p.t5xxl, p.llm) = (None, None, None, None, None);
    }
    Ok(p)
}

/// What a checkpoint holds, so the family's graph is built (FLUX's and SD3's all-in-one
/// files run as sd-cli runs them); an unreadable file is the loader's to report.
fn checkpoint_info(state: &AppState, model: &str) -> presets::ModelInfo {
    let path = state.runtime.resolve_model("checkpoints", model).ok();
    presets::ModelInfo::detect(path.as_deref(), None).unwrap_or_else(|| presets::ModelInfo { has_text_encoders: true, has_vae: true, ..Default::default() })
}

fn stem(name: &str) -> &str {
    let file = name.rsplit('/').next().unwrap_or(name);
    file.rsplit_once('.').map_or(file, |(s, _)| s)
}

/// Input images written for one request, removed when the request is answered.
struct TempInputs(Vec<PathBuf>);

impl Drop for TempInputs {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
        }
    }
}

impl TempInputs {
    /// Decodes an uploaded image (checked against the size limits) and stores it as a PNG
    /// in the input folder, for LoadImage; returns the name to give LoadImage.
    fn add(
        &mut self,
        state: &AppState,
        bytes: &[u8],
        what: &str,
        to_mask: Option<MaskRule>,
    ) -> Result<String, ApiError> {
        check_image(bytes, what)?;
        let img =
            image::load_from_memory(bytes).map_err(|e| ApiError::bad(format!("{what}: {e}")))?;
        let img = match to_mask {
            None => img,
            Some(rule) => image::DynamicImage::ImageRgb8(mask_image(&img, rule)),
        };
        self.store(state, &img, what)
    }

    /// Stores images (each checked as [`TempInputs::add`] does) as numbered PNGs in a new
    /// folder of the input folder, in order; returns the folder's name (for a control
    /// video's frames).
    fn add_folder(&mut self, state: &AppState, images: &[Vec<u8>], what: &str) -> Result<String, ApiError> {
        let name = format!("sdapi-{}", uuid::Uuid::new_v4().simple());
        let dir = state.dirs.input.join(&name);
        std::fs::create_dir_all(&dir).map_err(|e| ApiError::io(format!("creating {}", dir.display()), e))?;
        self.0.push(dir.clone());
        for (i, bytes) in images.iter().enumerate() {
            let what = format!("{what}[{i}]");
            check_image(bytes, &what)?;
            let img = image::load_from_memory(bytes).map_err(|e| ApiError::bad(format!("{what}: {e}")))?;
            let mut png = Vec::new();
            img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .map_err(|e| ApiError::Internal(format!("encoding {what}: {e}")))?;
            crate::history::write_atomic(&dir.join(format!("frame_{i:05}.png")), &png)?;
        }
        Ok(name)
    }

    /// Stores an image as a PNG in the input folder; returns the name to give LoadImage.
    fn store(&mut self, state: &AppState, img: &image::DynamicImage, what: &str) -> Result<String, ApiError> {
        let mut png = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|e| ApiError::Internal(format!("encoding {what}: {e}")))?;
        let name = format!("sdapi-{}.png", uuid::Uuid::new_v4().simple());
        let path = state.dirs.input.join(&name);
        crate::history::write_atomic(&path, &png)?;
        self.0.push(path);
        Ok(name)
    }
}

#[derive(Clone, Copy)]
enum MaskRule {
    /// OpenAI: transparent pixels repaint; an opaque mask falls back to white-repaints.
    /// (A1111's masks are made by [`inpaint`].)
    TransparentRepaints,
    /// sd-server's one-channel masks: the grey level, white repaints.
    Luma,
}

fn gray(p: [u8; 4]) -> u8 {
    ((u16::from(p[0]) + u16::from(p[1]) + u16::from(p[2])) / 3) as u8
}

/// The mask as LoadImageMask's `red` channel reads it: 255 where to repaint.
fn mask_image(img: &image::DynamicImage, rule: MaskRule) -> image::RgbImage {
    let rgba = img.to_rgba8();
    let has_alpha = img.color().has_alpha() && rgba.pixels().any(|p| p.0[3] < 255);
    image::RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let p = rgba.get_pixel(x, y).0;
        let v = match rule {
            MaskRule::TransparentRepaints if has_alpha => 255 - p[3],
            MaskRule::TransparentRepaints | MaskRule::Luma => gray(p),
        };
        image::Rgb([v, v, v])
    })
}

/// Strips a `data:image/...;base64,` prefix and decodes.
fn decode_b64(s: &str, what: &str) -> Result<Vec<u8>, ApiError> {
    let data = match s.split_once(";base64,") {
        Some((prefix, rest)) if prefix.starts_with("data:") => rest,
        _ => s,
    };
    let cleaned: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    B64.decode(cleaned.as_bytes())
        .map_err(|e| ApiError::bad(format!("{what} is not valid base64: {e}")))
}

/// A preset's error in the request's terms: the field a flag came from, not the flag.
fn in_request_terms(e: PresetError, fields: &[(&str, &str)]) -> ApiError {
    let field = |flag: &str| fields.iter().find(|(f, _)| *f == flag).map_or_else(|| flag.to_string(), |(_, name)| format!("`{name}`"));
    ApiError::bad(match e {
        PresetError::NotSupported { flag, reason } => format!("not supported yet: {} ({reason})", field(&flag)),
        PresetError::Invalid { flag, msg } => format!("invalid value for {}: {msg}", field(&flag)),
        PresetError::Missing { flag, msg } => format!("missing {}: {msg}", field(&flag)),
    })
}

/// Runs one preset and returns the PNG bytes of its saved images; errors name `fields`.
async fn generate(state: &Arc<AppState>, params: &ImgGenParams, fields: &[(&str, &str)]) -> Result<Vec<Vec<u8>>, ApiError> {
    let queued = queue_preset(state, params, fields, uuid::Uuid::new_v4().to_string()).await?;
    let entry = queued.rx.await.map_err(|_| RunEnd::Removed.into_error())?;
    run_end(&entry).map_err(RunEnd::into_error)?;
    saved_files(state, &entry, &queued.save_nodes).await
}

/// A preset's workflow on the queue: its history entry comes through `rx` once it has
/// run (the sender is dropped when it leaves the queue unrun).
pub(crate) struct Queued {
    pub rx: tokio::sync::oneshot::Receiver<Arc<serde_json::Value>>,
    pub save_nodes: Vec<String>,
}

/// Builds the preset of `params` (its errors naming `fields`), validates it and queues it
/// as prompt `prompt_id`.
async fn queue_preset(state: &Arc<AppState>, params: &ImgGenParams, fields: &[(&str, &str)], prompt_id: String) -> Result<Queued, ApiError> {
    let preset = presets::img_gen(params).map_err(|e| in_request_terms(e, fields))?;
    let missing = presets::unsupported_nodes(&preset, state.executor.registry());
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(ToString::to_string).collect();
        return Err(ApiError::bad(list.join("; ")));
    }
    let prompt = preset.workflow.to_api_json();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let number = state.queue.next_number()? as f64;
    enqueue_off_thread(
        state.clone(),
        Submission {
            prompt,
            workflow: preset.workflow,
            client_id: None,
            extra_data: json!({}),
            number,
            prompt_id,
            done: Some(tx),
        },
    )
    .await?;
    Ok(Queued { rx, save_nodes: preset.save_nodes })
}

/// Why a queued preset gave no images.
pub(crate) enum RunEnd {
    /// It left the queue before it ran.
    Removed,
    Interrupted,
    Failed(String),
}

impl RunEnd {
    fn into_error(self) -> ApiError {
        ApiError::RunFailed(match self {
            RunEnd::Removed => "the prompt was removed from the queue before it ran".into(),
            RunEnd::Interrupted => "the run was interrupted".into(),
            RunEnd::Failed(why) => why,
        })
    }
}

/// Whether the run of a history entry succeeded, and if not why.
pub(crate) fn run_end(entry: &serde_json::Value) -> Result<(), RunEnd> {
    if entry["status"]["status_str"] == "success" {
        return Ok(());
    }
    let messages = entry["status"]["messages"].as_array().cloned().unwrap_or_default();
    let end = messages.iter().find_map(|m| match m[0].as_str() {
        Some("execution_error") => Some(RunEnd::Failed(format!(
            "node {} ({}) failed: {}",
            m[1]["node_id"].as_str().unwrap_or("?"),
            m[1]["node_type"].as_str().unwrap_or("?"),
            m[1]["exception_message"].as_str().unwrap_or("")
        ))),
        Some("execution_interrupted") => Some(RunEnd::Interrupted),
        _ => None,
    });
    Err(end.unwrap_or_else(|| RunEnd::Failed("the run failed".into())))
}

/// The bytes of the files the save nodes of a finished run wrote, in order.
pub(crate) async fn saved_files(state: &Arc<AppState>, entry: &serde_json::Value, save_nodes: &[String]) -> Result<Vec<Vec<u8>>, ApiError> {
    let mut files = Vec::new();
    for node in save_nodes {
        for img in entry["outputs"][node]["images"].as_array().into_iter().flatten() {
            files.push(
                crate::files::read_file(
                    state,
                    img["filename"].as_str().unwrap_or(""),
                    img["subfolder"].as_str().unwrap_or(""),
                    img["type"].as_str().unwrap_or("output"),
                )
                .await?,
            );
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_white_where_to_repaint() {
        // An opaque white pixel and a transparent black one.
        let img = image::DynamicImage::ImageRgba8(image::RgbaImage::from_fn(2, 1, |x, _| {
            image::Rgba(if x == 0 {
                [255, 255, 255, 255]
            } else {
                [0, 0, 0, 0]
            })
        }));
        let red = |rule| -> Vec<u8> { mask_image(&img, rule).pixels().map(|p| p.0[0]).collect() };
        assert_eq!(red(MaskRule::TransparentRepaints), [0, 255]);
        let opaque = image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(2, 1, |x, _| image::Rgb(if x == 0 { [255; 3] } else { [0; 3] })));
        assert_eq!(mask_image(&opaque, MaskRule::TransparentRepaints).pixels().map(|p| p.0[0]).collect::<Vec<_>>(), [255, 0]);
    }
}
