//! The server's recent log lines, for ComfyUI's frontend log panel (`/internal/logs`,
//! `/internal/logs/raw`, and `logs` messages on the WebSocket of subscribed clients).
//!
//! [`layer`] is a `tracing` layer the binary installs beside its console output; it keeps
//! the last [`KEEP`] lines in memory and hands each new one to the subscribers.

use std::collections::{HashSet, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;

/// Lines kept for a client that opens the panel later.
pub const KEEP: usize = 1000;

/// One line as ComfyUI's logger records it: `t` an ISO time, `m` the text with its
/// newline.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub t: String,
    pub m: String,
}

struct Logs {
    lines: VecDeque<Entry>,
    subscribers: HashSet<String>,
}

static LOGS: LazyLock<Mutex<Logs>> = LazyLock::new(|| Mutex::new(Logs { lines: VecDeque::new(), subscribers: HashSet::new() }));
static FEED: LazyLock<tokio::sync::broadcast::Sender<Entry>> = LazyLock::new(|| tokio::sync::broadcast::channel(256).0);

pub fn entries() -> Vec<Entry> {
    LOGS.lock().lines.iter().cloned().collect()
}

/// Turns `logs` messages on or off for one WebSocket client.
pub fn subscribe(client_id: &str, enabled: bool) {
    let mut logs = LOGS.lock();
    if enabled {
        logs.subscribers.insert(client_id.to_string());
    } else {
        logs.subscribers.remove(client_id);
    }
}

pub fn subscribers() -> Vec<String> {
    LOGS.lock().subscribers.iter().cloned().collect()
}

/// New lines as they are logged.
pub fn feed() -> tokio::sync::broadcast::Receiver<Entry> {
    FEED.subscribe()
}

fn record(m: String) {
    let entry = Entry { t: iso_now(), m };
    {
        let mut logs = LOGS.lock();
        if logs.lines.len() == KEEP {
            logs.lines.pop_front();
        }
        logs.lines.push_back(entry.clone());
    }
    // No receiver (no server running) is not an error.
    let _ = FEED.send(entry);
}

/// UTC, RFC 3339 with milliseconds: what the frontend's log panel prints before a line.
fn iso_now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

/// The layer that records every event at or above the subscriber's level.
pub struct Layer;

pub fn layer() -> Layer {
    Layer
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Layer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        let level = *event.metadata().level();
        let text = if level <= tracing::Level::WARN { format!("{level}: {}\n", m.0) } else { format!("{}\n", m.0) };
        record(text);
    }
}

/// Forwards new lines to subscribed WebSocket clients until the server stops (the
/// feed task ends with the runtime).
pub fn forward(state: Arc<crate::state::AppState>) {
    let mut rx = feed();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(entry) => {
                    let data = serde_json::json!({ "entries": [entry], "size": { "cols": 120, "rows": 40 } });
                    for client in subscribers() {
                        state.hub.send_json(Some(&client), "logs", data.clone());
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
}
