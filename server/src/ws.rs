//! `/ws?clientId=`: ComfyUI's WebSocket. Text frames are `{"type", "data"}` messages;
//! previews are binary frames `[u32 BE event type = 1][u32 BE format: 1 JPEG, 2 PNG][bytes]`.
//!
//! Runs publish into the [`Hub`]; each connection takes what is addressed to its client id
//! (or to everyone).

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use sdflow_executor::{PreviewFormat, PreviewImage};
use serde::Deserialize;
use serde_json::{json, Value as Json};
use tokio::sync::{broadcast, mpsc};

use crate::state::AppState;

/// ComfyUI's binary event type of an encoded preview image.
pub const PREVIEW_IMAGE: u32 = 1;
const JPEG: u32 = 1;
const PNG: u32 = 2;

pub enum Payload {
    Text(String),
    Binary(Vec<u8>),
}

pub struct Frame {
    /// The client id it is for; every client when `None`.
    pub target: Option<String>,
    pub payload: Payload,
}

/// Fans messages out to the connected WebSocket clients.
pub struct Hub {
    frames: broadcast::Sender<Arc<Frame>>,
    previews: mpsc::UnboundedSender<(Option<String>, PreviewImage)>,
}

impl Hub {
    /// Needs a Tokio runtime: previews are encoded on a task of their own, off the
    /// compute threads that produce them.
    pub fn start() -> Hub {
        // Deep enough for a burst of progress messages; a client that falls further behind
        // misses some (it is told by `Lagged`, and the history keeps the results).
        let (frames, _) = broadcast::channel(4096);
        let (previews, mut rx) = mpsc::unbounded_channel::<(Option<String>, PreviewImage)>();
        let out = frames.clone();
        tokio::spawn(async move {
            while let Some((target, image)) = rx.recv().await {
                let encoded = tokio::task::spawn_blocking(move || encode_preview(&image)).await;
                match encoded {
                    Ok(Ok(bytes)) => {
                        let _ = out.send(Arc::new(Frame {
                            target,
                            payload: Payload::Binary(bytes),
                        }));
                    }
                    Ok(Err(e)) => tracing::debug!("preview dropped: {e}"),
                    Err(e) => tracing::debug!("preview encoder failed: {e}"),
                }
            }
        });
        Hub { frames, previews }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Frame>> {
        self.frames.subscribe()
    }

    /// A ComfyUI message `{"type": kind, "data": data}`.
    pub fn send_json(&self, target: Option<&str>, kind: &str, data: Json) {
        let text = json!({ "type": kind, "data": data }).to_string();
        // No receivers only means nobody is connected.
        let _ = self.frames.send(Arc::new(Frame {
            target: target.map(str::to_string),
            payload: Payload::Text(text),
        }));
    }

    pub fn send_preview(&self, target: Option<&str>, image: PreviewImage) {
        let _ = self.previews.send((target.map(str::to_string), image));
    }

    pub fn status(&self, queue_remaining: usize) {
        self.send_json(None, "status", status_data(queue_remaining, None));
    }
}

pub fn status_data(queue_remaining: usize, sid: Option<&str>) -> Json {
    let mut data = json!({ "status": { "exec_info": { "queue_remaining": queue_remaining } } });
    if let Some(sid) = sid {
        data["sid"] = json!(sid);
    }
    data
}

/// The binary frame of one preview: ComfyUI's event and format words, then the image.
pub fn encode_preview(image: &PreviewImage) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(image.data.len() / 4 + 8);
    out.extend_from_slice(&PREVIEW_IMAGE.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    let format = write_preview_image(image, &mut out)?;
    out[4..8].copy_from_slice(&format.to_be_bytes());
    Ok(out)
}

/// Appends the preview as an image file (raw pixels encoded as JPEG, as ComfyUI's
/// previews are); returns its format word.
pub fn write_preview_image(image: &PreviewImage, out: &mut Vec<u8>) -> Result<u32, String> {
    match image.format {
        PreviewFormat::Jpeg => {
            out.extend_from_slice(&image.data);
            Ok(JPEG)
        }
        PreviewFormat::Png => {
            out.extend_from_slice(&image.data);
            Ok(PNG)
        }
        PreviewFormat::Rgb8 => {
            let expected = image.width as usize * image.height as usize * 3;
            if image.data.len() != expected || expected == 0 {
                return Err(format!(
                    "{}x{} RGB preview has {} bytes, expected {expected}",
                    image.width,
                    image.height,
                    image.data.len()
                ));
            }
            let mut enc = image::codecs::jpeg::JpegEncoder::new_with_quality(out, 95);
            enc.encode(
                &image.data,
                image.width,
                image.height,
                image::ExtendedColorType::Rgb8,
            )
            .map_err(|e| e.to_string())?;
            Ok(JPEG)
        }
    }
}

#[derive(Deserialize)]
pub struct WsQuery {
    #[serde(rename = "clientId", default)]
    client_id: Option<String>,
}

pub async fn handler(
    State(state): State<Arc<AppState>>,
    Query(q): Query<WsQuery>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let sid = q
        .client_id
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    // Subscribed before the handshake completes: a client that queues a prompt as soon as
    // it is connected must not miss that prompt's first events.
    let frames = state.hub.subscribe();
    upgrade
        .max_message_size(1 << 20)
        .on_upgrade(move |socket| connection(state, sid, frames, socket))
}

async fn connection(
    state: Arc<AppState>,
    sid: String,
    mut frames: broadcast::Receiver<Arc<Frame>>,
    socket: WebSocket,
) {
    let (mut tx, mut rx) = socket.split();
    let hello =
        json!({ "type": "status", "data": status_data(state.queue.remaining(), Some(&sid)) });
    if tx
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            frame = frames.recv() => match frame {
                Ok(frame) => {
                    if frame.target.as_deref().is_some_and(|t| t != sid) {
                        continue;
                    }
                    let msg = match &frame.payload {
                        Payload::Text(t) => Message::Text(t.clone().into()),
                        Payload::Binary(b) => Message::Binary(b.clone().into()),
                    };
                    if tx.send(msg).await.is_err() {
                        break;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!("websocket client {sid} fell behind; {n} messages skipped");
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            incoming = rx.next() => match incoming {
                // Clients send nothing ComfyUI acts on; only a close matters.
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
}
