//! What a run reports while it goes, named as ComfyUI's WebSocket messages are so the
//! server can forward them as they are (`{"type": ..., "data": ...}`).

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value as Json;

/// Pixel encoding of a preview image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PreviewFormat {
    Jpeg,
    Png,
    /// Raw 8-bit RGB, row-major; whoever displays it encodes it (sampler previews are
    /// produced as pixels, and encoding them on the compute thread would slow sampling).
    Rgb8,
}

/// A preview image sent while a node runs.
#[derive(Clone, Debug, Serialize)]
pub struct PreviewImage {
    pub format: PreviewFormat,
    pub width: u32,
    pub height: u32,
    #[serde(skip_serializing)]
    pub data: Arc<[u8]>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum Event {
    ExecutionStart {
        prompt_id: String,
        /// Milliseconds since the Unix epoch.
        timestamp: u64,
    },
    /// The nodes whose outputs came from the cache; they will not run.
    ExecutionCached {
        prompt_id: String,
        nodes: Vec<String>,
    },
    /// A node starts; `node: None` marks the end of the run, as ComfyUI sends it.
    Executing {
        prompt_id: String,
        node: Option<String>,
    },
    Progress {
        prompt_id: String,
        node: String,
        value: u64,
        max: u64,
    },
    /// Binary in ComfyUI's protocol; here the bytes are not serialized.
    Preview {
        prompt_id: String,
        node: String,
        image: PreviewImage,
    },
    /// A node finished (or came from the cache) with outputs for the user (saved images, text).
    Executed {
        prompt_id: String,
        node: String,
        output: Json,
    },
    ExecutionSuccess {
        prompt_id: String,
        timestamp: u64,
    },
    ExecutionError {
        prompt_id: String,
        node_id: String,
        node_type: String,
        exception_type: String,
        exception_message: String,
        /// Nodes that finished before the failure.
        executed: Vec<String>,
        timestamp: u64,
    },
    ExecutionInterrupted {
        prompt_id: String,
        node_id: Option<String>,
        node_type: Option<String>,
        executed: Vec<String>,
        timestamp: u64,
    },
}

impl Event {
    pub fn prompt_id(&self) -> &str {
        match self {
            Event::ExecutionStart { prompt_id, .. }
            | Event::ExecutionCached { prompt_id, .. }
            | Event::Executing { prompt_id, .. }
            | Event::Progress { prompt_id, .. }
            | Event::Preview { prompt_id, .. }
            | Event::Executed { prompt_id, .. }
            | Event::ExecutionSuccess { prompt_id, .. }
            | Event::ExecutionError { prompt_id, .. }
            | Event::ExecutionInterrupted { prompt_id, .. } => prompt_id,
        }
    }

    /// The ComfyUI message name (`execution_start`, `progress`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ExecutionStart { .. } => "execution_start",
            Event::ExecutionCached { .. } => "execution_cached",
            Event::Executing { .. } => "executing",
            Event::Progress { .. } => "progress",
            Event::Preview { .. } => "preview",
            Event::Executed { .. } => "executed",
            Event::ExecutionSuccess { .. } => "execution_success",
            Event::ExecutionError { .. } => "execution_error",
            Event::ExecutionInterrupted { .. } => "execution_interrupted",
        }
    }
}

/// Where a run delivers its events. Called from worker threads, so it must be `Sync`.
pub trait EventSink: Send + Sync {
    fn send(&self, event: Event);
}

impl<F: Fn(Event) + Send + Sync> EventSink for F {
    fn send(&self, event: Event) {
        self(event)
    }
}

impl EventSink for std::sync::mpsc::Sender<Event> {
    fn send(&self, event: Event) {
        // A receiver that went away only means nobody is listening any more.
        let _ = std::sync::mpsc::Sender::send(self, event);
    }
}

/// Drops every event.
pub struct NullSink;

impl EventSink for NullSink {
    fn send(&self, _event: Event) {}
}

/// Milliseconds since the Unix epoch: the events' timestamps, and hosts' own (a prompt's
/// arrival) in the same clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
