//! `/ws?clientId=`: ComfyUI's WebSocket. Text frames are `{"type", "data"}` messages;
//! previews are binary frames `[u32 BE event type = 1][u32 BE format: 1 JPEG, 2 PNG][bytes]`,
//! or, for a client that announced `supports_preview_metadata` in a `feature_flags` message
//! (ComfyUI's frontend sends one first), `[u32 BE 4][u32 BE length][JSON metadata naming the
//! node][bytes]`.
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
/// ComfyUI's binary event type of a preview image preceded by JSON naming its node.
pub const PREVIEW_IMAGE_WITH_METADATA: u32 = 4;
const JPEG: u32 = 1;
const PNG: u32 = 2;

pub enum Payload {
    Text(String),
    /// One preview in both framings; each connection sends the one its client reads.
    Preview { legacy: Vec<u8>, with_metadata: Vec<u8> },
}

/// Which prompt and node a preview comes from. Previews are encoded off the compute
/// thread and can reach the client after `executing` has named the next node, so the
/// client cannot tell their node from the order of messages.
#[derive(Clone, Debug)]
pub struct PreviewSource {
    pub prompt_id: String,
    pub node: String,
}

pub struct Frame {
    /// The client id it is for; every client when `None`.
    pub target: Option<String>,
    pub payload: Payload,
}

/// Fans messages out to the connected WebSocket clients.
pub struct Hub {
    frames: broadcast::Sender<Arc<Frame>>,
    previews: mpsc::UnboundedSender<(Option<String>, PreviewSource, PreviewImage)>,
}

impl Hub {
    /// Needs a Tokio runtime: previews are encoded on a task of their own, off the
    /// compute threads that produce them.
    pub fn start() -> Hub {
        // Deep enough for a burst of progress messages; a client that falls further behind
        // misses some (it is told by `Lagged`, and the history keeps the results).
        let (frames, _) = broadcast::channel(4096);
        let (previews, mut rx) =
            mpsc::unbounded_channel::<(Option<String>, PreviewSource, PreviewImage)>();
        let out = frames.clone();
        tokio::spawn(async move {
            while let Some((target, source, image)) = rx.recv().await {
                let encoded = tokio::task::spawn_blocking(move || {
                    let legacy = encode_preview(&image)?;
                    let with_metadata = preview_with_metadata(&legacy, &source);
                    Ok::<_, String>(Payload::Preview { legacy, with_metadata })
                })
                .await;
                match encoded {
                    Ok(Ok(payload)) => {
                        let _ = out.send(Arc::new(Frame { target, payload }));
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

    pub fn send_preview(&self, target: Option<&str>, source: PreviewSource, image: PreviewImage) {
        let _ = self.previews.send((target.map(str::to_string), source, image));
    }

    /// A preview another process encoded (a scale-out worker's type-1 frame).
    pub fn send_encoded_preview(&self, target: Option<&str>, source: PreviewSource, legacy: Vec<u8>) {
        let with_metadata = preview_with_metadata(&legacy, &source);
        let _ = self.frames.send(Arc::new(Frame {
            target: target.map(str::to_string),
            payload: Payload::Preview { legacy, with_metadata },
        }));
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

/// The type-4 frame of an encoded type-1 frame: ComfyUI's metadata (the node ids as its
/// frontend reads them, and the image's MIME type, which replaces the format word).
/// sdflow runs no node expansion, so the display and real node are the node itself.
pub fn preview_with_metadata(legacy: &[u8], source: &PreviewSource) -> Vec<u8> {
    let format = u32::from_be_bytes(legacy[4..8].try_into().expect("a preview frame has 8 header bytes"));
    let mime = if format == PNG { "image/png" } else { "image/jpeg" };
    let metadata = json!({
        "node_id": source.node,
        "display_node_id": source.node,
        "parent_node_id": null,
        "real_node_id": source.node,
        "prompt_id": source.prompt_id,
        "image_type": mime,
    })
    .to_string();
    let image = &legacy[8..];
    let mut out = Vec::with_capacity(8 + metadata.len() + image.len());
    out.extend_from_slice(&PREVIEW_IMAGE_WITH_METADATA.to_be_bytes());
    out.extend_from_slice(&(metadata.len() as u32).to_be_bytes());
    out.extend_from_slice(metadata.as_bytes());
    out.extend_from_slice(image);
    out
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
    // Until the client says otherwise it gets ComfyUI's original preview frames.
    let mut preview_metadata = false;
    let hello =
        json!({ "type": "status", "data": status_data(state.queue.remaining().unwrap_or(0), Some(&sid)) });
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
                        Payload::Preview { with_metadata, .. } if preview_metadata => {
                            Message::Binary(with_metadata.clone().into())
                        }
                        Payload::Preview { legacy, .. } => Message::Binary(legacy.clone().into()),
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
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                // ComfyUI's frontend announces what it reads and is told what the server
                // offers in return; nothing else a client sends is acted on.
                Some(Ok(Message::Text(text))) => {
                    if let Some(flags) = client_feature_flags(&text) {
                        preview_metadata = flags.get("supports_preview_metadata").and_then(Json::as_bool) == Some(true);
                        let reply = json!({ "type": "feature_flags", "data": server_features() });
                        if tx.send(Message::Text(reply.to_string().into())).await.is_err() {
                            break;
                        }
                    }
                }
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The `data` of a `{"type": "feature_flags", "data": {...}}` message.
fn client_feature_flags(text: &str) -> Option<Json> {
    let mut message: Json = serde_json::from_str(text).ok()?;
    if message.get("type")?.as_str()? != "feature_flags" {
        return None;
    }
    let data = message.get_mut("data").map(Json::take).unwrap_or(Json::Null);
    data.is_object().then_some(data)
}

/// What the server offers, as `/features` and the WebSocket's `feature_flags` reply say
/// (here, beside the protocol it describes).
pub fn server_features() -> Json {
    json!({ "supports_preview_metadata": true, "max_upload_size": null })
}
