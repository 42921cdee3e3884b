//! The sdcpp API's job records (sd-server's async jobs): how each ended and when, kept
//! for ten minutes after, then answering 410, and how a job's files become its result.
//! Apart from the handlers so the server's state and the request parser use them without
//! depending on the handlers.

use std::collections::HashMap;

use base64::Engine;
use parking_lot::Mutex;
use serde_json::{json, Value as Json};

use super::B64;
use crate::error::ApiError;

/// How long a finished job's result is kept, and how long its id then answers 410.
pub(super) const TTL_SECS: i64 = 600;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Img,
    Vid,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Img => "img_gen",
            Kind::Vid => "vid_gen",
        }
    }
}

/// How a job ended.
pub(super) enum End {
    /// The `result` object.
    Completed(Json),
    Failed(String),
    Cancelled,
}

pub(super) struct Job {
    pub(super) kind: Kind,
    pub(super) created: i64,
    pub(super) started: Option<i64>,
    pub(super) completed: Option<i64>,
    pub(super) end: Option<End>,
}

/// The sdcpp API's jobs, by id.
#[derive(Default)]
pub struct SdcppJobs {
    pub(super) inner: Mutex<Inner>,
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) jobs: HashMap<String, Job>,
    /// Ids of jobs dropped after their time to live, until when they answer 410.
    expired: HashMap<String, i64>,
}

impl Inner {
    pub(super) fn purge(&mut self, now: i64) {
        self.expired.retain(|_, until| *until > now);
        let old: Vec<String> = self.jobs.iter().filter(|(_, j)| j.completed.is_some_and(|c| now - c >= TTL_SECS)).map(|(id, _)| id.clone()).collect();
        for id in old {
            self.jobs.remove(&id);
            self.expired.insert(id, now + TTL_SECS);
        }
    }

    pub(super) fn job(&mut self, id: &str, now: i64) -> Result<&mut Job, ApiError> {
        self.purge(now);
        if self.expired.contains_key(id) {
            return Err(ApiError::Gone(format!("job {id} expired")));
        }
        self.jobs.get_mut(id).ok_or_else(|| ApiError::NotFound(format!("no job {id}")))
    }
}

impl SdcppJobs {
    /// Records how job `id` ended (unless it already has: a cancel got there first).
    pub(super) fn finish(&self, id: &str, end: End, started: Option<i64>) {
        let mut inner = self.inner.lock();
        if let Some(job) = inner.jobs.get_mut(id) {
            if job.end.is_none() {
                job.end = Some(end);
                job.completed = Some(unix_now());
            }
            // The run's own start (its history's) over when a poll first saw it running.
            job.started = started.map(|s| s.max(job.created)).or(job.started);
        }
    }
}

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// What a job's files become in its `result`.
pub(crate) struct Output {
    pub kind: Kind,
    pub format: String,
    /// sd-server's `output_compression`: the JPEG / WebP / video quality, 0..=100.
    pub compression: i64,
    /// Keep the PNG's text chunks (the generation parameters).
    pub embed_metadata: bool,
    pub fps: i64,
}

impl Output {
    /// The `result` of the saved PNGs: each image in the output format, or the frames as
    /// one video container.
    pub(super) fn encode(&self, pngs: Vec<Vec<u8>>) -> Result<Json, String> {
        if pngs.is_empty() {
            return Err(format!("{} returned no results", if self.kind == Kind::Img { "generate_image" } else { "generate_video" }));
        }
        match self.kind {
            Kind::Img => {
                let mut images = Vec::new();
                for (i, png) in pngs.into_iter().enumerate() {
                    let bytes = self.image(png).map_err(|e| format!("encoding image {i}: {e}"))?;
                    images.push(json!({ "index": i, "b64_json": B64.encode(bytes) }));
                }
                Ok(json!({ "output_format": self.format, "images": images }))
            }
            Kind::Vid => {
                let count = pngs.len();
                let bytes = self.video(&pngs)?;
                let mime = match self.format.as_str() {
                    "webm" => "video/webm",
                    "webp" => "image/webp",
                    _ => "video/x-msvideo",
                };
                Ok(json!({ "output_format": self.format, "mime_type": mime, "fps": self.fps, "frame_count": count, "b64_json": B64.encode(bytes) }))
            }
        }
    }

    fn image(&self, png: Vec<u8>) -> Result<Vec<u8>, String> {
        if self.format == "png" && self.embed_metadata {
            return Ok(png);
        }
        let img = image::load_from_memory(&png).map_err(|e| e.to_string())?.to_rgb8();
        let mut out = Vec::new();
        let result = match self.format.as_str() {
            "jpeg" => image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, self.compression.clamp(1, 100) as u8).encode_image(&img),
            // The `image` crate's WebP encoder is lossless (so the quality has no say).
            "webp" => img.write_with_encoder(image::codecs::webp::WebPEncoder::new_lossless(&mut out)),
            _ => img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png),
        };
        result.map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// The frames as sd-server's container: Motion-JPEG AVI (quality at most 90, as
    /// sd-server's), animated WebP or WebM of VP8 keyframes at the request's quality.
    fn video(&self, pngs: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        use sdflow_nodes::video::encode::{animated_webp, mjpg_avi, vp8_webm, Rgb8Frames, WebpOptions};
        let mut rgb = Vec::new();
        let mut size = None;
        for (i, png) in pngs.iter().enumerate() {
            let frame = image::load_from_memory(png).map_err(|e| format!("frame {i}: {e}"))?.to_rgb8();
            if *size.get_or_insert(frame.dimensions()) != frame.dimensions() {
                return Err(format!("frame {i} is {:?}, the first {:?}", frame.dimensions(), size));
            }
            rgb.extend_from_slice(frame.as_raw());
        }
        let (width, height) = size.unwrap_or((0, 0));
        let frames = Rgb8Frames { data: &rgb, width: width as usize, height: height as usize };
        let (fps, quality) = (self.fps as f64, self.compression as f32);
        match self.format.as_str() {
            "webp" => animated_webp(frames, fps, WebpOptions { lossless: false, quality, method: 4 }),
            "webm" => vp8_webm(frames, fps, quality),
            _ => mjpg_avi(frames, fps, self.compression.clamp(1, 90) as u8),
        }
        .map_err(|e| format!("failed to encode generated video container: {e}"))
    }
}
