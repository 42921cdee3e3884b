//! The front end's side of the event bus: what workers publish, forwarded to this front
//! end's WebSocket clients.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value as Json;

use super::Frontend;
use crate::state::AppState;

/// Forwards what workers publish to this front end's WebSocket clients, keeps A1111's
/// progress, and wakes the requests waiting for a result; reconnects while Redis is away.
/// Runs until the front end closes.
pub fn listen(state: Arc<AppState>, frontend: Arc<Frontend>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("sdflow-redis-events".into()).spawn(move || {
        let keys = frontend.store.keys.clone();
        while !frontend.closed.load(Ordering::Relaxed) {
            let mut con = match frontend.store.dedicated() {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!("events: {e}; reconnecting");
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
            };
            let mut pubsub = con.as_pubsub();
            if pubsub.subscribe(&[keys.events(), keys.control()]).is_err() || pubsub.set_read_timeout(Some(Duration::from_millis(500))).is_err() {
                continue;
            }
            frontend.resolve_all();
            state.broadcast_status();
            while !frontend.closed.load(Ordering::Relaxed) {
                let msg = match pubsub.get_message() {
                    Ok(m) => m,
                    Err(e) if e.is_timeout() => continue,
                    Err(e) => {
                        tracing::warn!("events from {}: {e}; reconnecting", frontend.store.url());
                        break;
                    }
                };
                let Ok(doc) = serde_json::from_slice::<Json>(msg.get_payload_bytes()) else {
                    tracing::debug!("events: a message that is not JSON on {}", msg.get_channel_name());
                    continue;
                };
                if msg.get_channel_name() == keys.control() {
                    if let Some(id) = doc["finished"].as_str() {
                        frontend.resolve(id);
                        let mut live = state.live.lock();
                        if live.prompt_id.as_deref() == Some(id) {
                            *live = Default::default();
                        }
                    }
                    if doc.get("queue").is_some() || doc.get("finished").is_some() {
                        state.broadcast_status();
                    }
                    continue;
                }
                forward(&state, &doc);
            }
        }
    })
}

/// One event from a worker, to this front end's clients (and A1111's progress).
fn forward(state: &AppState, doc: &Json) {
    let target = doc["target"].as_str();
    let kind = doc["type"].as_str().unwrap_or("");
    if kind == "preview" {
        let Some(frame) = doc["frame"].as_str().and_then(|f| base64::engine::general_purpose::STANDARD.decode(f).ok()) else { return };
        if frame.len() < 8 {
            return;
        }
        let source = crate::ws::PreviewSource {
            prompt_id: doc["prompt_id"].as_str().unwrap_or("").to_string(),
            node: doc["node"].as_str().unwrap_or("").to_string(),
        };
        let png = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]) == 2;
        let image = sdflow_executor::PreviewImage {
            format: if png { sdflow_executor::PreviewFormat::Png } else { sdflow_executor::PreviewFormat::Jpeg },
            width: 0,
            height: 0,
            data: Arc::from(&frame[8..]),
        };
        state.live.lock().preview = Some(image);
        state.hub.send_encoded_preview(target, source, frame);
        return;
    }
    let data = doc["data"].clone();
    match kind {
        "execution_start" => {
            *state.live.lock() = crate::state::Live {
                prompt_id: data["prompt_id"].as_str().map(str::to_string),
                started: Some(Instant::now()),
                step: None,
                preview: None,
            };
        }
        "progress" => {
            if let (Some(v), Some(m)) = (data["value"].as_u64(), data["max"].as_u64()) {
                state.live.lock().step = Some((v, m));
            }
        }
        _ => {}
    }
    state.hub.send_json(target, kind, data);
}
