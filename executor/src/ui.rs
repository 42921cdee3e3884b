//! ComfyUI's UI (litegraph) workflow format, converted to and from the API format.
//!
//! The UI format stores widget values positionally (`widgets_values`), so reading it needs
//! each class's schema: values are matched to the schema's widget inputs in declaration
//! order. Quirks of the ComfyUI frontend handled here:
//! - an INT widget with `control_after_generate` (every seed) is followed in
//!   `widgets_values` by the control widget's value (`"randomize"`, `"fixed"`, ...);
//! - a COMBO with `image_upload` is followed by the upload button's value (`"image"`);
//! - a widget converted to an input keeps its slot in `widgets_values`;
//! - `Reroute` nodes are passed through, `PrimitiveNode`s are folded into the widget
//!   they feed, `Note`/`MarkdownNote` are dropped;
//! - muted nodes (`mode` 2) are dropped; bypassed ones (`mode` 4) connect each output to
//!   their input of the same type, as the frontend does when queueing.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value as Json};

use crate::registry::Registry;
use crate::schema::InputKind;
use crate::workflow::{Header, InputValue, NodeSpec, Workflow, WorkflowError, FORMAT_VERSION};

const MODE_NEVER: i64 = 2;
const MODE_BYPASS: i64 = 4;
const CONTROL_VALUES: [&str; 4] = ["fixed", "increment", "decrement", "randomize"];

struct UiInput {
    name: String,
    io_type: String,
    link: Option<i64>,
    widget: Option<String>,
}

struct UiNode {
    id: String,
    class: String,
    mode: i64,
    inputs: Vec<UiInput>,
    output_types: Vec<String>,
    widgets_values: Json,
    title: Option<String>,
}

struct UiLink {
    origin: String,
    origin_slot: usize,
}

enum Source {
    Link(String, usize),
    Const(Json),
}

fn err(path: impl Into<String>, message: impl Into<String>) -> WorkflowError {
    WorkflowError::Structure {
        path: path.into(),
        message: message.into(),
    }
}

fn id_string(v: &Json) -> Option<String> {
    match v {
        Json::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        Json::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn parse_node(v: &Json, index: usize) -> Result<UiNode, WorkflowError> {
    let path = format!("nodes[{index}]");
    let obj = v
        .as_object()
        .ok_or_else(|| err(&path, "expected an object"))?;
    let id = obj
        .get("id")
        .and_then(id_string)
        .ok_or_else(|| err(&path, "missing or invalid id"))?;
    let path = format!("node {id}");
    let class = obj
        .get("type")
        .and_then(Json::as_str)
        .ok_or_else(|| err(&path, "missing type"))?
        .to_string();
    let mode = obj.get("mode").and_then(Json::as_i64).unwrap_or(0);
    let mut inputs = Vec::new();
    if let Some(list) = obj.get("inputs") {
        let list = list
            .as_array()
            .ok_or_else(|| err(&path, "inputs must be an array"))?;
        for (i, inp) in list.iter().enumerate() {
            let name = inp
                .get("name")
                .and_then(Json::as_str)
                .ok_or_else(|| err(format!("{path} inputs[{i}]"), "missing name"))?;
            inputs.push(UiInput {
                name: name.to_string(),
                io_type: inp
                    .get("type")
                    .and_then(Json::as_str)
                    .unwrap_or("*")
                    .to_string(),
                link: inp.get("link").and_then(Json::as_i64),
                widget: inp
                    .get("widget")
                    .and_then(|w| w.get("name"))
                    .and_then(Json::as_str)
                    .map(str::to_string),
            });
        }
    }
    let output_types = obj
        .get("outputs")
        .and_then(Json::as_array)
        .map(|outs| {
            outs.iter()
                .map(|o| {
                    o.get("type")
                        .and_then(Json::as_str)
                        .unwrap_or("*")
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(UiNode {
        id,
        class,
        mode,
        inputs,
        output_types,
        widgets_values: obj
            .get("widgets_values")
            .cloned()
            .unwrap_or(Json::Array(Vec::new())),
        title: obj.get("title").and_then(Json::as_str).map(str::to_string),
    })
}

fn parse_link(v: &Json, index: usize) -> Result<(i64, UiLink), WorkflowError> {
    let path = format!("links[{index}]");
    // Version 0.4 stores links as arrays, version 1 as objects.
    let (id, origin, slot) = match v {
        Json::Array(a) if a.len() >= 5 => {
            (a[0].as_i64(), a.get(1).and_then(id_string), a[2].as_u64())
        }
        Json::Object(o) => (
            o.get("id").and_then(Json::as_i64),
            o.get("origin_id").and_then(id_string),
            o.get("origin_slot").and_then(Json::as_u64),
        ),
        _ => {
            return Err(err(
                path,
                "expected [id, origin_id, origin_slot, target_id, target_slot, type]",
            ))
        }
    };
    match (id, origin, slot.and_then(|s| usize::try_from(s).ok())) {
        (Some(id), Some(origin), Some(origin_slot)) => Ok((
            id,
            UiLink {
                origin,
                origin_slot,
            },
        )),
        _ => Err(err(
            path,
            "link id, origin id or origin slot is missing or not an integer",
        )),
    }
}

struct Graph {
    nodes: HashMap<String, UiNode>,
    links: HashMap<i64, UiLink>,
}

impl Graph {
    /// Where a link's value really comes from, looking through virtual and bypassed nodes.
    fn resolve(&self, link: i64) -> Option<Source> {
        let mut link = link;
        // Bounded so a cycle of reroutes cannot loop forever.
        for _ in 0..=self.nodes.len() {
            let l = self.links.get(&link)?;
            let origin = self.nodes.get(&l.origin)?;
            if origin.mode == MODE_NEVER {
                return None;
            }
            match origin.class.as_str() {
                "Reroute" => link = origin.inputs.first()?.link?,
                "PrimitiveNode" => {
                    return match &origin.widgets_values {
                        Json::Array(a) => a.first().cloned().map(Source::Const),
                        _ => None,
                    }
                }
                _ if origin.mode == MODE_BYPASS => {
                    let want = origin.output_types.get(l.origin_slot).map(String::as_str);
                    let same_type =
                        |i: &UiInput| Some(i.io_type.as_str()) == want && i.link.is_some();
                    let pick = origin
                        .inputs
                        .get(l.origin_slot)
                        .filter(|i| same_type(i))
                        .or_else(|| origin.inputs.iter().find(|i| same_type(i)))?;
                    link = pick.link?;
                }
                _ => return Some(Source::Link(origin.id.clone(), l.origin_slot)),
            }
        }
        None
    }
}

fn is_virtual(class: &str) -> bool {
    matches!(class, "Reroute" | "PrimitiveNode" | "Note" | "MarkdownNote")
}

fn source_to_input(s: Source) -> InputValue {
    match s {
        Source::Link(node, output) => InputValue::Link { node, output },
        Source::Const(v) => InputValue::Const(v),
    }
}

/// Converts a UI-format document to a workflow. Nodes of unknown classes keep their links
/// but not their widget values (which cannot be named without a schema); validation then
/// reports the unknown class.
pub fn ui_to_workflow(doc: &Json, registry: &Registry) -> Result<Workflow, WorkflowError> {
    let nodes_json = doc
        .get("nodes")
        .and_then(Json::as_array)
        .ok_or_else(|| err("workflow", "nodes must be an array"))?;
    let links_json = doc
        .get("links")
        .and_then(Json::as_array)
        .ok_or_else(|| err("workflow", "links must be an array"))?;
    let mut graph = Graph {
        nodes: HashMap::new(),
        links: HashMap::new(),
    };
    let mut order = Vec::new();
    for (i, n) in nodes_json.iter().enumerate() {
        let node = parse_node(n, i)?;
        order.push(node.id.clone());
        if graph.nodes.insert(node.id.clone(), node).is_some() {
            return Err(err(format!("nodes[{i}]"), "duplicate node id"));
        }
    }
    for (i, l) in links_json.iter().enumerate() {
        // Deleted links are sometimes left as null.
        if l.is_null() {
            continue;
        }
        let (id, link) = parse_link(l, i)?;
        graph.links.insert(id, link);
    }

    let mut wf = Workflow::new();
    for id in order {
        let node = &graph.nodes[&id];
        if is_virtual(&node.class) || node.mode == MODE_NEVER || node.mode == MODE_BYPASS {
            continue;
        }
        let mut spec = NodeSpec::new(node.class.clone());
        spec.title = node.title.clone();
        let linked = |name: &str| -> Option<Option<Source>> {
            node.inputs
                .iter()
                .find(|i| i.name == name || i.widget.as_deref() == Some(name))
                .and_then(|i| i.link)
                .map(|l| graph.resolve(l))
        };
        match registry.schema(&node.class) {
            Some(schema) => {
                let mut cursor = 0usize;
                let values = &node.widgets_values;
                for input in &schema.inputs {
                    let mut widget_value = None;
                    if input.kind.is_widget() {
                        match values {
                            Json::Array(a) => {
                                widget_value = a.get(cursor).cloned();
                                cursor += 1;
                                if has_control_widget(input) && is_control(a.get(cursor)) {
                                    cursor += 1;
                                }
                                if input.extra.get("image_upload") == Some(&Json::Bool(true))
                                    && a.get(cursor).and_then(Json::as_str) == Some("image")
                                {
                                    cursor += 1;
                                }
                            }
                            Json::Object(m) => widget_value = m.get(&input.name).cloned(),
                            _ => {}
                        }
                    }
                    match linked(&input.name) {
                        Some(Some(source)) => {
                            spec.inputs
                                .insert(input.name.clone(), source_to_input(source));
                        }
                        // Linked to something muted: the input is absent, as in ComfyUI.
                        Some(None) => {}
                        None => {
                            if let Some(v) = widget_value {
                                spec.inputs.insert(input.name.clone(), InputValue::Const(v));
                            }
                        }
                    }
                }
            }
            None => {
                for input in &node.inputs {
                    if let Some(Some(source)) = input.link.map(|l| graph.resolve(l)) {
                        spec.inputs
                            .insert(input.name.clone(), source_to_input(source));
                    }
                }
            }
        }
        wf.nodes.insert(id, spec);
    }
    // Written by `workflow_to_ui`, so a round trip keeps our header.
    if let Some(h) = doc.get("extra").and_then(|e| e.get("sdflow")) {
        let text = |k: &str| h.get(k).and_then(Json::as_str).map(str::to_string);
        wf.header = Some(Header {
            format_version: h
                .get("format_version")
                .and_then(Json::as_u64)
                .unwrap_or(FORMAT_VERSION),
            title: text("title"),
            description: text("description"),
        });
    }
    Ok(wf)
}

fn has_control_widget(input: &crate::schema::InputSpec) -> bool {
    match &input.kind {
        InputKind::Int(w) => {
            w.control_after_generate || input.name == "seed" || input.name == "noise_seed"
        }
        _ => false,
    }
}

fn is_control(v: Option<&Json>) -> bool {
    v.and_then(Json::as_str)
        .is_some_and(|s| CONTROL_VALUES.contains(&s))
}

/// Lays a workflow out as a UI-format document the ComfyUI frontend can open.
///
/// Node ids that are integers are kept; others are renumbered. Nodes are placed in
/// columns by their depth in the graph.
pub fn workflow_to_ui(wf: &Workflow, registry: &Registry) -> Result<Json, WorkflowError> {
    let mut ids: BTreeMap<&str, i64> = BTreeMap::new();
    let mut next = wf
        .nodes
        .keys()
        .filter_map(|k| k.parse::<i64>().ok())
        .max()
        .unwrap_or(0)
        + 1;
    for id in wf.nodes.keys() {
        let n = match id.parse::<i64>() {
            Ok(n) if n > 0 => n,
            _ => {
                next += 1;
                next - 1
            }
        };
        ids.insert(id, n);
    }

    // Depth by longest path from a source, relaxed a bounded number of times so a
    // (invalid) cycle cannot hang the layout.
    let mut depth: HashMap<&str, usize> = wf.nodes.keys().map(|k| (k.as_str(), 0)).collect();
    for _ in 0..wf.nodes.len().min(64) {
        let mut changed = false;
        for (id, node) in &wf.nodes {
            for v in node.inputs.values() {
                if let InputValue::Link { node: src, .. } = v {
                    let d = depth.get(src.as_str()).copied().unwrap_or(0) + 1;
                    if depth[id.as_str()] < d {
                        depth.insert(id, d);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }

    let mut links = Vec::new();
    let mut out_links: HashMap<(&str, usize), Vec<i64>> = HashMap::new();
    let mut in_links: HashMap<(&str, &str), i64> = HashMap::new();
    for (id, node) in &wf.nodes {
        let schema = registry.schema(&node.class_type).ok_or_else(|| {
            err(
                format!("node '{id}'"),
                format!("unknown class_type '{}'", node.class_type),
            )
        })?;
        let mut slot = 0usize;
        for input in &schema.inputs {
            if let Some((name, InputValue::Link { node: src, output })) =
                node.inputs.get_key_value(&input.name)
            {
                let src_id = ids.get(src.as_str()).copied().ok_or_else(|| {
                    err(
                        format!("node '{id}' input '{}'", input.name),
                        format!("links to missing node '{src}'"),
                    )
                })?;
                let link_id = links.len() as i64 + 1;
                links.push(json!([
                    link_id,
                    src_id,
                    output,
                    ids[id.as_str()],
                    slot,
                    input.kind.io_type().as_str()
                ]));
                out_links
                    .entry((src.as_str(), *output))
                    .or_default()
                    .push(link_id);
                in_links.insert((id.as_str(), name.as_str()), link_id);
            }
            if !input.kind.is_widget()
                || node
                    .inputs
                    .get(&input.name)
                    .is_some_and(|v| matches!(v, InputValue::Link { .. }))
            {
                slot += 1;
            }
        }
    }

    let mut column_rows: HashMap<usize, usize> = HashMap::new();
    let mut nodes = Vec::new();
    let mut order: Vec<&String> = wf.nodes.keys().collect();
    order.sort_by_key(|k| (depth[k.as_str()], ids[k.as_str()]));
    for (index, id) in order.into_iter().enumerate() {
        let node = &wf.nodes[id];
        let schema = registry.schema(&node.class_type).ok_or_else(|| {
            err(
                format!("node '{id}'"),
                format!("unknown class_type '{}'", node.class_type),
            )
        })?;
        let mut inputs = Vec::new();
        let mut widgets_values = Vec::new();
        for input in &schema.inputs {
            let link = in_links.get(&(id.as_str(), input.name.as_str())).copied();
            let ty = input.kind.io_type();
            if input.kind.is_widget() {
                let value = match node.inputs.get(&input.name) {
                    Some(InputValue::Const(v)) => v.clone(),
                    _ => input.default_json().unwrap_or(Json::Null),
                };
                widgets_values.push(value);
                if has_control_widget(input) {
                    widgets_values.push(json!("fixed"));
                }
                if let Some(link) = link {
                    inputs.push(json!({"name": input.name, "type": ty.as_str(), "widget": {"name": input.name}, "link": link}));
                }
            } else {
                inputs.push(json!({"name": input.name, "type": ty.as_str(), "link": link}));
            }
        }
        let outputs: Vec<Json> = schema
            .outputs
            .iter()
            .enumerate()
            .map(|(i, o)| {
                json!({
                    "name": o.name,
                    "type": o.io_type.as_str(),
                    "links": out_links.get(&(id.as_str(), i)).cloned().unwrap_or_default(),
                    "slot_index": i,
                })
            })
            .collect();
        let col = depth[id.as_str()];
        let row = column_rows.entry(col).or_insert(0);
        let pos = json!([col as f64 * 360.0, *row as f64 * 260.0]);
        *row += 1;
        let mut n = Map::new();
        n.insert("id".into(), json!(ids[id.as_str()]));
        n.insert("type".into(), json!(node.class_type));
        n.insert("pos".into(), pos);
        n.insert("size".into(), json!([320, 220]));
        n.insert("flags".into(), json!({}));
        n.insert("order".into(), json!(index));
        n.insert("mode".into(), json!(0));
        n.insert("inputs".into(), json!(inputs));
        n.insert("outputs".into(), json!(outputs));
        n.insert(
            "properties".into(),
            json!({"Node name for S&R": node.class_type}),
        );
        n.insert("widgets_values".into(), json!(widgets_values));
        if let Some(t) = &node.title {
            n.insert("title".into(), json!(t));
        }
        nodes.push(Json::Object(n));
    }
    let mut extra = Map::new();
    if let Some(h) = &wf.header {
        extra.insert(
            "sdflow".into(),
            json!({"format_version": h.format_version, "title": h.title, "description": h.description}),
        );
    }
    Ok(json!({
        "last_node_id": ids.values().copied().max().unwrap_or(0),
        "last_link_id": links.len(),
        "nodes": nodes,
        "links": links,
        "groups": [],
        "config": {},
        "extra": extra,
        "version": 0.4,
    }))
}
