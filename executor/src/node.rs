//! The node API: what a node type implements and what it gets while it runs.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value as Json;

use crate::events::{Event, EventSink, PreviewImage};
use crate::schema::NodeSchema;
use crate::value::Value;

/// Which resource a node's work occupies.
///
/// Light nodes (`Cpu`) run side by side on the worker pool; at most one node per `Device`
/// runs at a time, because compute on one accelerator is serial anyway and two graphs
/// competing for its memory would only thrash the residency manager.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    Cpu,
    Device(String),
}

/// Per-run cancellation: clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("interrupted")]
    Interrupted,
    #[error("input '{input}' is missing")]
    MissingInput { input: String },
    #[error("input '{input}': expected {expected}, got {found}")]
    InputType {
        input: String,
        expected: String,
        found: String,
    },
    #[error("input '{input}': {message}")]
    InvalidInput { input: String, message: String },
    #[error("{0}")]
    Message(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
    #[error("node panicked: {0}")]
    Panic(String),
}

impl NodeError {
    pub fn msg(message: impl Into<String>) -> Self {
        NodeError::Message(message.into())
    }

    pub fn other(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        NodeError::Other(Box::new(err))
    }

    /// The name reported as `exception_type` in `execution_error`.
    pub fn exception_type(&self) -> &'static str {
        match self {
            NodeError::Interrupted => "InterruptProcessingException",
            NodeError::MissingInput { .. }
            | NodeError::InputType { .. }
            | NodeError::InvalidInput { .. } => "ValueError",
            NodeError::Message(_) | NodeError::Other(_) => "RuntimeError",
            NodeError::Io(_) => "OSError",
            NodeError::Panic(_) => "Panic",
        }
    }
}

/// One input as the node receives it: a constant from the workflow (already checked and
/// normalized by validation) or the value of a link.
#[derive(Clone, Debug)]
pub enum InputData {
    Const(Json),
    Value(Value),
}

/// The inputs of one node execution, by name.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    // Few entries per node: a vector beats a map for lookup and for building.
    entries: Vec<(String, InputData)>,
}

impl Inputs {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, data: InputData) {
        let name = name.into();
        if let Some(slot) = self.entries.iter_mut().find(|(n, _)| *n == name) {
            slot.1 = data;
        } else {
            self.entries.push((name, data));
        }
    }

    pub fn get(&self, name: &str) -> Option<&InputData> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &InputData)> {
        self.entries.iter().map(|(n, d)| (n.as_str(), d))
    }

    fn require(&self, name: &str) -> Result<&InputData, NodeError> {
        self.get(name).ok_or_else(|| NodeError::MissingInput {
            input: name.to_string(),
        })
    }

    /// The linked value of a socket input.
    pub fn value(&self, name: &str) -> Result<&Value, NodeError> {
        match self.require(name)? {
            InputData::Value(v) => Ok(v),
            InputData::Const(c) => Err(type_error(name, "a linked value", &const_kind(c))),
        }
    }

    /// The payload of a socket input as its concrete type.
    pub fn downcast<T: std::any::Any>(&self, name: &str) -> Result<&T, NodeError> {
        let v = self.value(name)?;
        v.downcast_ref::<T>()
            .ok_or_else(|| type_error(name, std::any::type_name::<T>(), v.payload_type_name()))
    }

    /// Like [`Inputs::downcast`], sharing the payload instead of borrowing it.
    pub fn downcast_arc<T: std::any::Any + Send + Sync>(
        &self,
        name: &str,
    ) -> Result<Arc<T>, NodeError> {
        let v = self.value(name)?;
        v.downcast_arc::<T>()
            .ok_or_else(|| type_error(name, std::any::type_name::<T>(), v.payload_type_name()))
    }

    pub fn int(&self, name: &str) -> Result<i64, NodeError> {
        match self.require(name)? {
            InputData::Const(c) => c
                .as_i64()
                .ok_or_else(|| type_error(name, "an INT within i64", &const_kind(c))),
            InputData::Value(v) => downcast_copy::<i64>(name, v, "INT"),
        }
    }

    /// An INT read as unsigned, for seeds (ComfyUI allows up to 2^64-1).
    pub fn uint(&self, name: &str) -> Result<u64, NodeError> {
        match self.require(name)? {
            InputData::Const(c) => c
                .as_u64()
                .ok_or_else(|| type_error(name, "a non-negative INT", &const_kind(c))),
            InputData::Value(v) => {
                let i = downcast_copy::<i64>(name, v, "INT")?;
                u64::try_from(i).map_err(|_| type_error(name, "a non-negative INT", &i.to_string()))
            }
        }
    }

    pub fn float(&self, name: &str) -> Result<f64, NodeError> {
        match self.require(name)? {
            InputData::Const(c) => c
                .as_f64()
                .ok_or_else(|| type_error(name, "a FLOAT", &const_kind(c))),
            InputData::Value(v) => downcast_copy::<f64>(name, v, "FLOAT")
                .or_else(|_| downcast_copy::<i64>(name, v, "FLOAT").map(|i| i as f64)),
        }
    }

    pub fn boolean(&self, name: &str) -> Result<bool, NodeError> {
        match self.require(name)? {
            InputData::Const(c) => c
                .as_bool()
                .ok_or_else(|| type_error(name, "a BOOLEAN", &const_kind(c))),
            InputData::Value(v) => downcast_copy::<bool>(name, v, "BOOLEAN"),
        }
    }

    /// A STRING or COMBO input.
    pub fn string(&self, name: &str) -> Result<&str, NodeError> {
        match self.require(name)? {
            InputData::Const(c) => c
                .as_str()
                .ok_or_else(|| type_error(name, "a STRING", &const_kind(c))),
            InputData::Value(v) => v
                .downcast_ref::<String>()
                .map(String::as_str)
                .ok_or_else(|| type_error(name, "a STRING", v.io_type().as_str())),
        }
    }
}

fn downcast_copy<T: Copy + 'static>(name: &str, v: &Value, expected: &str) -> Result<T, NodeError> {
    v.downcast_ref::<T>()
        .copied()
        .ok_or_else(|| type_error(name, expected, v.io_type().as_str()))
}

fn type_error(input: &str, expected: &str, found: &str) -> NodeError {
    NodeError::InputType {
        input: input.to_string(),
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

fn const_kind(c: &Json) -> String {
    match c {
        Json::Null => "null".into(),
        Json::Bool(b) => format!("the boolean {b}"),
        Json::Number(n) => format!("the number {n}"),
        Json::String(s) => format!("the string {s:?}"),
        Json::Array(_) => "an array".into(),
        Json::Object(_) => "an object".into(),
    }
}

/// What a node returns: one value per declared output, plus outputs for the user.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub values: Vec<Value>,
    /// Shown to the user (ComfyUI's `{"ui": {...}}`, e.g. `{"images": [...]}`); sent in
    /// the `executed` event and kept with the cached outputs.
    pub ui: Option<Json>,
}

impl Outputs {
    pub fn new(values: Vec<Value>) -> Self {
        Outputs { values, ui: None }
    }

    pub fn none() -> Self {
        Self::default()
    }

    pub fn with_ui(mut self, ui: Json) -> Self {
        self.ui = Some(ui);
        self
    }
}

/// What a running node can do besides computing: report progress, send previews,
/// notice cancellation.
pub struct ExecContext<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) node_id: &'a str,
    pub(crate) sink: &'a dyn EventSink,
    pub(crate) cancel: &'a CancelToken,
    // Set by the executor when another node of the same run failed.
    pub(crate) abort: &'a AtomicBool,
    pub(crate) output_dir: Option<&'a Path>,
    pub(crate) metadata: &'a [(String, String)],
    pub(crate) image_metadata: &'a [Vec<(String, String)>],
}

impl<'a> ExecContext<'a> {
    /// A context outside any executor run, for calling a node directly (tests, tools).
    pub fn detached(
        node_id: &'a str,
        sink: &'a dyn EventSink,
        cancel: &'a CancelToken,
        abort: &'a AtomicBool,
    ) -> Self {
        ExecContext {
            run_id: "",
            node_id,
            sink,
            cancel,
            abort,
            output_dir: None,
            metadata: &[],
            image_metadata: &[],
        }
    }

    pub fn run_id(&self) -> &str {
        self.run_id
    }

    pub fn node_id(&self) -> &str {
        self.node_id
    }

    /// Text the host wants embedded in output files (see `RunOptions::metadata`).
    pub fn metadata(&self) -> &[(String, String)] {
        self.metadata
    }

    /// The text for the file of the image at batch position `index`: `metadata()` with
    /// that image's own entries in place of the shared ones (see
    /// `RunOptions::image_metadata`).
    pub fn metadata_for(&self, index: usize) -> Vec<(String, String)> {
        let mut out = self.metadata.to_vec();
        for (key, text) in self.image_metadata.get(index).into_iter().flatten() {
            match out.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1 = text.clone(),
                None => out.push((key.clone(), text.clone())),
            }
        }
        out
    }

    /// Where output nodes write files, when the host configured a place.
    pub fn output_dir(&self) -> Option<&Path> {
        self.output_dir
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled() || self.abort.load(Ordering::Acquire)
    }

    /// Long nodes call this between steps and return its error.
    pub fn check_cancelled(&self) -> Result<(), NodeError> {
        if self.is_cancelled() {
            Err(NodeError::Interrupted)
        } else {
            Ok(())
        }
    }

    pub fn progress(&self, value: u64, max: u64) {
        self.sink.send(Event::Progress {
            prompt_id: self.run_id.to_string(),
            node: self.node_id.to_string(),
            value,
            max,
        });
    }

    pub fn preview(&self, image: PreviewImage) {
        self.sink.send(Event::Preview {
            prompt_id: self.run_id.to_string(),
            node: self.node_id.to_string(),
            image,
        });
    }
}

/// A node type. Execution is stateless: the same inputs give the same outputs, which is
/// what lets the executor cache by content.
pub trait Node: Send + Sync + 'static {
    fn schema(&self) -> NodeSchema;

    fn lane(&self) -> Lane {
        Lane::Cpu
    }

    /// Extra state the output depends on beyond the inputs (ComfyUI's `IS_CHANGED`), e.g.
    /// a file's content hash for a loader. Called before every run with the node's
    /// constant inputs only (links are not resolved yet); mixed into the cache key.
    fn fingerprint(&self, _inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        Ok(None)
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError>;
}
