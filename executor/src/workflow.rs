//! Workflow files: the graph of node instances a user runs.
//!
//! Three formats are read:
//! - ComfyUI's API prompt format, `{id: {class_type, inputs, _meta}}`, with links as
//!   `[node_id, output_index]` (also wrapped as a `/prompt` body, `{"prompt": {...}}`);
//! - ComfyUI's UI (litegraph) format with `nodes` and `links` arrays, converted to the API
//!   format through the registry's schemas (see [`crate::ui`]);
//! - our own: the API format under `nodes`, with a header (format version, title,
//!   description).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value as Json};

use crate::registry::Registry;

/// The newest version of our format this build reads and writes.
pub const FORMAT_VERSION: u64 = 1;
/// The `format` field that marks our own files.
pub const FORMAT_NAME: &str = "sdflow";

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("malformed JSON at line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Structure { path: String, message: String },
    #[error("unsupported format_version {found} (this build reads up to {FORMAT_VERSION})")]
    UnsupportedVersion { found: u64 },
    #[error("no node with id '{0}' in the workflow")]
    NoSuchNode(String),
}

impl WorkflowError {
    fn structure(path: impl Into<String>, message: impl Into<String>) -> Self {
        WorkflowError::Structure {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl From<serde_json::Error> for WorkflowError {
    fn from(e: serde_json::Error) -> Self {
        // serde_json's Display appends " at line L column C"; keep the bare message.
        let full = e.to_string();
        let message = match full.rfind(" at line ") {
            Some(pos) => full[..pos].to_string(),
            None => full,
        };
        WorkflowError::Json {
            line: e.line(),
            column: e.column(),
            message,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkflowFormat {
    Sdflow,
    Api,
    Ui,
}

impl WorkflowFormat {
    pub fn detect(doc: &Json) -> Option<WorkflowFormat> {
        let obj = doc.as_object()?;
        match obj.get("nodes") {
            Some(Json::Array(_)) if obj.contains_key("links") => Some(WorkflowFormat::Ui),
            Some(Json::Object(_)) if !looks_like_api_node(obj.get("nodes")) => {
                Some(WorkflowFormat::Sdflow)
            }
            _ => Some(WorkflowFormat::Api),
        }
    }
}

// An API prompt could in principle have a node whose id is "nodes"; such a node is an
// object with `class_type`, a node map is not.
fn looks_like_api_node(v: Option<&Json>) -> bool {
    v.and_then(|v| v.get("class_type")).is_some()
}

#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub format_version: u64,
    pub title: Option<String>,
    pub description: Option<String>,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            format_version: FORMAT_VERSION,
            title: None,
            description: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum InputValue {
    /// Output `output` of node `node`.
    Link { node: String, output: usize },
    /// A widget value. Arrays that are not `[id, index]` stay here so validation can
    /// report them as bad links, as ComfyUI does.
    Const(Json),
}

impl InputValue {
    pub fn link(node: impl Into<String>, output: usize) -> Self {
        InputValue::Link {
            node: node.into(),
            output,
        }
    }

    /// Reads an input as workflow JSON spells it: `[id, index]` is a link, and
    /// `{"__value__": v}` is the value `v` (how ComfyUI's frontend sends a list widget's
    /// value so it cannot be taken for a link).
    pub fn from_json(v: Json) -> Self {
        let v = match v {
            Json::Object(mut m) if m.len() == 1 && m.contains_key("__value__") => m.remove("__value__").unwrap_or(Json::Null),
            v => return Self::from_json_plain(v),
        };
        InputValue::Const(v)
    }

    fn from_json_plain(v: Json) -> Self {
        if let Json::Array(items) = &v {
            if items.len() == 2 {
                let id = match &items[0] {
                    Json::String(s) => Some(s.clone()),
                    Json::Number(n) if n.is_u64() => Some(n.to_string()),
                    _ => None,
                };
                if let (Some(node), Some(output)) = (id, items[1].as_u64()) {
                    if let Ok(output) = usize::try_from(output) {
                        return InputValue::Link { node, output };
                    }
                }
            }
        }
        InputValue::Const(v)
    }

    fn to_json(&self) -> Json {
        match self {
            InputValue::Link { node, output } => json!([node, output]),
            InputValue::Const(v) => v.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    pub class_type: String,
    pub inputs: BTreeMap<String, InputValue>,
    /// `_meta.title`, kept for display only; it never affects execution or caching.
    pub title: Option<String>,
}

impl NodeSpec {
    pub fn new(class_type: impl Into<String>) -> Self {
        NodeSpec {
            class_type: class_type.into(),
            inputs: BTreeMap::new(),
            title: None,
        }
    }

    pub fn with_input(mut self, name: impl Into<String>, value: InputValue) -> Self {
        self.inputs.insert(name.into(), value);
        self
    }

    pub fn with_const(self, name: impl Into<String>, value: Json) -> Self {
        self.with_input(name, InputValue::Const(value))
    }

    pub fn with_link(
        self,
        name: impl Into<String>,
        node: impl Into<String>,
        output: usize,
    ) -> Self {
        self.with_input(name, InputValue::link(node, output))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workflow {
    pub header: Option<Header>,
    pub nodes: BTreeMap<String, NodeSpec>,
}

impl Workflow {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, id: impl Into<String>, node: NodeSpec) -> &mut Self {
        self.nodes.insert(id.into(), node);
        self
    }

    /// Reads any of the three formats; the registry maps UI `widgets_values` to inputs.
    pub fn parse(text: &str, registry: &Registry) -> Result<Workflow, WorkflowError> {
        let doc: Json = serde_json::from_str(text)?;
        Self::from_json(doc, registry)
    }

    pub fn from_json(doc: Json, registry: &Registry) -> Result<Workflow, WorkflowError> {
        match WorkflowFormat::detect(&doc) {
            Some(WorkflowFormat::Ui) => crate::ui::ui_to_workflow(&doc, registry),
            _ => Self::from_json_without_ui(doc),
        }
    }

    /// Reads our format or the API format (the UI format needs a registry).
    pub fn parse_api(text: &str) -> Result<Workflow, WorkflowError> {
        let doc: Json = serde_json::from_str(text)?;
        Self::from_json_without_ui(doc)
    }

    fn from_json_without_ui(doc: Json) -> Result<Workflow, WorkflowError> {
        let Json::Object(mut obj) = doc else {
            return Err(WorkflowError::structure(
                "workflow",
                "the top level must be a JSON object",
            ));
        };
        if let Some(Json::Array(_)) = obj.get("nodes") {
            return Err(WorkflowError::structure(
                "workflow",
                "looks like ComfyUI's UI format but has no `links` array",
            ));
        }
        if let Some(nodes) = take_node_map(&mut obj, "nodes") {
            let header = parse_header(&obj)?;
            return Ok(Workflow {
                header: Some(header),
                nodes: parse_api_nodes(nodes)?,
            });
        }
        // A `/prompt` request body.
        if let Some(prompt) = take_node_map(&mut obj, "prompt") {
            return Ok(Workflow {
                header: None,
                nodes: parse_api_nodes(prompt)?,
            });
        }
        Ok(Workflow {
            header: None,
            nodes: parse_api_nodes(obj)?,
        })
    }

    /// ComfyUI's API prompt format.
    pub fn to_api_json(&self) -> Json {
        let mut out = Map::new();
        for (id, node) in &self.nodes {
            let inputs: Map<String, Json> = node
                .inputs
                .iter()
                .map(|(k, v)| (k.clone(), v.to_json()))
                .collect();
            let mut n = Map::new();
            n.insert("inputs".into(), Json::Object(inputs));
            n.insert("class_type".into(), json!(node.class_type));
            if let Some(title) = &node.title {
                n.insert("_meta".into(), json!({ "title": title }));
            }
            out.insert(id.clone(), Json::Object(n));
        }
        Json::Object(out)
    }

    /// Our format when there is a header, the API format otherwise.
    pub fn to_json(&self) -> Json {
        let Some(h) = &self.header else {
            return self.to_api_json();
        };
        let mut out = Map::new();
        out.insert("format".into(), json!(FORMAT_NAME));
        out.insert("format_version".into(), json!(h.format_version));
        if let Some(t) = &h.title {
            out.insert("title".into(), json!(t));
        }
        if let Some(d) = &h.description {
            out.insert("description".into(), json!(d));
        }
        out.insert("nodes".into(), self.to_api_json());
        Json::Object(out)
    }

    pub fn to_string_pretty(&self) -> String {
        // Serializing a `serde_json::Value` cannot fail.
        serde_json::to_string_pretty(&self.to_json()).unwrap_or_default()
    }

    /// Overrides one input (the CLI's `--set NODE.INPUT=VALUE`).
    pub fn set_input(
        &mut self,
        node: &str,
        input: &str,
        value: InputValue,
    ) -> Result<(), WorkflowError> {
        let spec = self
            .nodes
            .get_mut(node)
            .ok_or_else(|| WorkflowError::NoSuchNode(node.to_string()))?;
        spec.inputs.insert(input.to_string(), value);
        Ok(())
    }
}

/// Removes `key` when it holds a map of nodes (and is not itself an API node that
/// happens to have that id).
fn take_node_map(obj: &mut Map<String, Json>, key: &str) -> Option<Map<String, Json>> {
    if !matches!(obj.get(key), Some(Json::Object(_))) || looks_like_api_node(obj.get(key)) {
        return None;
    }
    match obj.remove(key) {
        Some(Json::Object(m)) => Some(m),
        _ => None,
    }
}

fn parse_header(obj: &Map<String, Json>) -> Result<Header, WorkflowError> {
    if let Some(f) = obj.get("format") {
        if f.as_str() != Some(FORMAT_NAME) {
            return Err(WorkflowError::structure(
                "format",
                format!("expected \"{FORMAT_NAME}\", found {f}"),
            ));
        }
    }
    let format_version = match obj.get("format_version") {
        None => FORMAT_VERSION,
        Some(v) => v.as_u64().ok_or_else(|| {
            WorkflowError::structure("format_version", format!("expected an integer, found {v}"))
        })?,
    };
    if format_version > FORMAT_VERSION {
        return Err(WorkflowError::UnsupportedVersion {
            found: format_version,
        });
    }
    let text = |key: &str| -> Result<Option<String>, WorkflowError> {
        match obj.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(WorkflowError::structure(
                key,
                format!("expected a string, found {other}"),
            )),
        }
    };
    Ok(Header {
        format_version,
        title: text("title")?,
        description: text("description")?,
    })
}

fn parse_api_nodes(obj: Map<String, Json>) -> Result<BTreeMap<String, NodeSpec>, WorkflowError> {
    let mut nodes = BTreeMap::new();
    for (id, node) in obj {
        let path = format!("node '{id}'");
        let Json::Object(mut node) = node else {
            return Err(WorkflowError::structure(
                path,
                "expected an object with class_type and inputs",
            ));
        };
        let class_type = match node.remove("class_type") {
            Some(Json::String(s)) => s,
            Some(other) => {
                return Err(WorkflowError::structure(
                    path,
                    format!("class_type must be a string, found {other}"),
                ))
            }
            None => return Err(WorkflowError::structure(path, "missing class_type")),
        };
        let inputs = match node.remove("inputs") {
            None | Some(Json::Null) => BTreeMap::new(),
            Some(Json::Object(m)) => m
                .into_iter()
                .map(|(k, v)| (k, InputValue::from_json(v)))
                .collect(),
            Some(other) => {
                return Err(WorkflowError::structure(
                    path,
                    format!("inputs must be an object, found {other}"),
                ))
            }
        };
        let title = node
            .get("_meta")
            .and_then(|m| m.get("title"))
            .and_then(Json::as_str)
            .map(str::to_string);
        nodes.insert(
            id,
            NodeSpec {
                class_type,
                inputs,
                title,
            },
        );
    }
    Ok(nodes)
}
