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
//!   their input of the same type, as the frontend does when queueing;
//! - subgraphs (`definitions.subgraphs`, nested or hoisted) are expanded as the frontend's
//!   `graphToPrompt` expands them: inner nodes become `instance:inner` (`a:b:c` when
//!   nested), a link from the input boundary (`-10`) takes the instance's input of the same
//!   name (the frontend drops unconnected ones from the instance, so slots are matched by
//!   name, never index) or, unconnected, the promoted widget's value (the instance's
//!   `widgets_values` in promoted-input order, then `proxyWidgets` entries, then the inner
//!   node's own), an instance output follows the first link into the output boundary
//!   (`-20`); an instance muted or bypassed at the top is not expanded, one nested inside a
//!   subgraph is (its consumers still see it muted or bypassed);
//! - legacy group nodes (`workflow>Name`, defined in `extra.groupNodes`) are unpacked as
//!   the frontend unpacks them on load ([`groups`]).
//!
//! `tests/fixtures/comfyui/*.api.json` hold what the frontend itself queues for the
//! templates there; `tests/tests/comfyui_templates.rs` holds this conversion to them.

mod groups;

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
    /// Not a node of its own in the prompt: a subgraph instance, or a stand-in for one
    /// side of a subgraph boundary (the frontend's virtual nodes are known by class).
    virtual_node: bool,
    /// Widget values a subgraph instance sets on this (inner) node by name, over its own.
    overrides: HashMap<String, Json>,
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

/// `where_` names the graph the node is in (the workflow, or a subgraph) for errors.
fn parse_node(v: &Json, index: usize, where_: &str) -> Result<UiNode, WorkflowError> {
    let path = format!("{where_}nodes[{index}]");
    let obj = v
        .as_object()
        .ok_or_else(|| err(&path, "expected an object"))?;
    let id = obj
        .get("id")
        .and_then(id_string)
        .ok_or_else(|| err(&path, "missing or invalid id"))?;
    let path = format!("{where_}node {id}");
    let class = obj
        .get("type")
        .and_then(Json::as_str)
        .ok_or_else(|| err(&path, "missing type"))?
        .to_string();
    let mode = obj.get("mode").and_then(Json::as_i64).unwrap_or(0);
    let mut inputs = Vec::new();
    if let Some(list) = obj.get("inputs").filter(|l| !l.is_null()) {
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
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(Json::Array(Vec::new())),
        title: obj.get("title").and_then(Json::as_str).map(str::to_string),
        virtual_node: false,
        overrides: HashMap::new(),
    })
}

/// One link: `(id, origin id, origin slot)`.
fn parse_link(v: &Json, index: usize, where_: &str) -> Result<(i64, String, usize), WorkflowError> {
    let path = format!("{where_}links[{index}]");
    // Version 0.4 stores links as arrays, version 1 (and every subgraph) as objects.
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
        (Some(id), Some(origin), Some(origin_slot)) => Ok((id, origin, origin_slot)),
        _ => Err(err(
            path,
            "link id, origin id or origin slot is missing or not an integer",
        )),
    }
}

/// The whole workflow with every subgraph instance expanded: inner nodes under ids
/// `instance:inner` (nested: `a:b:c`, as ComfyUI's frontend numbers them), links
/// renumbered, and the subgraph boundaries replaced by virtual stand-ins that the link
/// resolution looks through.
struct Graph {
    nodes: HashMap<String, UiNode>,
    links: HashMap<i64, UiLink>,
    order: Vec<String>,
    next_link: i64,
    groups: HashMap<String, Result<groups::GroupType, (String, String)>>,
}

/// What a node unpacked from a group has in place of its own JSON.
static NO_JSON: Json = Json::Null;

/// Replaces every group node of one graph by its inner nodes (groups inside groups too),
/// moving the links that touched it.
fn unpack_groups<'j>(
    nodes: Vec<(UiNode, &'j Json)>,
    raw_links: &mut Vec<(i64, String, usize)>,
    types: &HashMap<String, Result<groups::GroupType, (String, String)>>,
    where_: &str,
) -> Result<Vec<(UiNode, &'j Json)>, WorkflowError> {
    let is_group = |n: &UiNode| groups::group_name(&n.class).is_some();
    if !nodes.iter().any(|(n, _)| is_group(n)) {
        return Ok(nodes);
    }
    let mut next_link = raw_links
        .iter()
        .map(|l| l.0)
        .chain(nodes.iter().flat_map(|(n, _)| n.inputs.iter().filter_map(|i| i.link)))
        .max()
        .unwrap_or(0);
    let mut nodes = nodes;
    for _ in 0..MAX_SUBGRAPH_DEPTH {
        if !nodes.iter().any(|(n, _)| is_group(n)) {
            return Ok(nodes);
        }
        let mut out = Vec::new();
        for (node, json) in nodes {
            let Some(name) = groups::group_name(&node.class) else {
                out.push((node, json));
                continue;
            };
            let path = format!("{where_}node {}", node.id);
            let group = match types.get(name) {
                Some(Ok(g)) => g,
                Some(Err((p, m))) => return Err(err(format!("{path} ({p})"), m.clone())),
                None => return Err(err(&path, format!("'{}' is a group node, but extra.groupNodes does not define '{name}'", node.class))),
            };
            let unpacked = group.unpack(&node, where_, &mut next_link)?;
            raw_links.retain_mut(|(_, origin, slot)| {
                if *origin != node.id {
                    return true;
                }
                // An output the group does not show loses its links, as in the frontend.
                match unpacked.outputs.get(*slot) {
                    Some((inner, s)) => {
                        *origin = inner.clone();
                        *slot = *s;
                        true
                    }
                    None => false,
                }
            });
            raw_links.extend(unpacked.links);
            out.extend(unpacked.nodes.into_iter().map(|n| (n, &NO_JSON)));
        }
        nodes = out;
    }
    Err(err(format!("{where_}extra.groupNodes"), "group nodes are nested too deep (or contain themselves)"))
}

/// The frontend's ids of a subgraph's boundary nodes.
const SUBGRAPH_INPUT: &str = "-10";
/// Deep enough for any real workflow; stops runaway nesting.
const MAX_SUBGRAPH_DEPTH: usize = 32;

struct Definition<'a> {
    id: String,
    name: String,
    doc: &'a Map<String, Json>,
}

impl Definition<'_> {
    fn label(&self) -> String {
        format!("subgraph '{}' ({})", self.name, self.id)
    }

    fn slots(&self, side: &str) -> Vec<&Json> {
        self.doc
            .get(side)
            .and_then(Json::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    }
}

/// Every subgraph definition, wherever it is nested, by id.
fn collect_definitions<'a>(doc: &'a Json, out: &mut HashMap<String, Definition<'a>>) -> Result<(), WorkflowError> {
    let Some(list) = doc.get("definitions").and_then(|d| d.get("subgraphs")) else {
        return Ok(());
    };
    let list = list
        .as_array()
        .ok_or_else(|| err("definitions.subgraphs", "must be an array"))?;
    for (i, def) in list.iter().enumerate() {
        let obj = def
            .as_object()
            .ok_or_else(|| err(format!("definitions.subgraphs[{i}]"), "expected an object"))?;
        let id = obj
            .get("id")
            .and_then(Json::as_str)
            .ok_or_else(|| err(format!("definitions.subgraphs[{i}]"), "missing id"))?
            .to_string();
        let name = obj.get("name").and_then(Json::as_str).unwrap_or(&id).to_string();
        out.entry(id.clone()).or_insert(Definition { id, name, doc: obj });
        collect_definitions(def, out)?;
    }
    Ok(())
}

/// A virtual node standing for one value crossing a subgraph boundary.
fn stand_in(id: String, source: Option<Result<i64, Json>>) -> UiNode {
    let (class, mode, inputs, widgets_values) = match source {
        // Passes the link on, as a Reroute does.
        Some(Ok(link)) => (
            "Reroute",
            0,
            vec![UiInput { name: String::new(), io_type: "*".into(), link: Some(link), widget: None }],
            Json::Array(Vec::new()),
        ),
        // A value set on the instance, given as a PrimitiveNode gives its value.
        Some(Err(value)) => ("PrimitiveNode", 0, Vec::new(), Json::Array(vec![value])),
        // Nothing: consumers keep their own widget value, or go without the input.
        None => ("Reroute", MODE_NEVER, Vec::new(), Json::Array(Vec::new())),
    };
    UiNode {
        id,
        class: class.into(),
        mode,
        inputs,
        output_types: Vec::new(),
        widgets_values,
        title: None,
        virtual_node: true,
        overrides: HashMap::new(),
    }
}

/// What the instance node says about a subgraph's inputs: for each input slot, the value
/// that crosses into the subgraph (a link of the parent scope, a promoted widget value set
/// on the instance, or nothing), and per inner node the widget values the instance's
/// `proxyWidgets` set directly.
type Boundary = (Vec<Option<Result<i64, Json>>>, HashMap<String, HashMap<String, Json>>);

fn boundary_inputs(
    instance: &UiNode,
    instance_json: &Json,
    def: &Definition,
    inner_nodes: &[UiNode],
    inner_targets: &HashMap<i64, (String, Option<String>)>,
    parent_links: &HashMap<i64, i64>,
) -> Boundary {
    let slots = def.slots("inputs");
    let host: Vec<Json> = instance.widgets_values.as_array().cloned().unwrap_or_default();
    let host_value = |i: usize| host.get(i).filter(|v| !v.is_null()).cloned();
    // The inner widget behind each input: the first of its links that ends on a widget.
    let promoted: Vec<Option<(String, String)>> = slots
        .iter()
        .map(|slot| {
            slot.get("linkIds")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .filter_map(Json::as_i64)
                .find_map(|l| match inner_targets.get(&l) {
                    Some((node, Some(widget))) => Some((node.clone(), widget.clone())),
                    _ => None,
                })
        })
        .collect();
    let mut values: Vec<Option<Json>> = vec![None; slots.len()];
    // Instance values belong to the promoted inputs, in input order.
    for (n, k) in (0..slots.len()).filter(|&k| promoted[k].is_some()).enumerate() {
        values[k] = host_value(n);
    }
    // `proxyWidgets` (frontends 1.28-1.4x) index the same values by entry; they win.
    let mut overrides: HashMap<String, HashMap<String, Json>> = HashMap::new();
    let proxies = instance_json
        .get("properties")
        .and_then(|p| p.get("proxyWidgets"))
        .and_then(Json::as_array);
    for (i, entry) in proxies.into_iter().flatten().enumerate() {
        let (Some(node), Some(widget)) = (entry.get(0).and_then(id_string), entry.get(1).and_then(Json::as_str)) else {
            continue;
        };
        if widget.starts_with("$$") || widget == "control_after_generate" {
            continue;
        }
        let Some(v) = host_value(i) else { continue };
        let slot_of = |k: usize| {
            let named = slots[k].get("name").and_then(Json::as_str) == Some(widget);
            (node == "-1" && named) || promoted[k].as_ref().is_some_and(|(n, w)| *n == node && w == widget)
        };
        match (0..slots.len()).find(|&k| slot_of(k)) {
            Some(k) => values[k] = Some(v),
            None if inner_nodes.iter().any(|n| n.id == node) => {
                overrides.entry(node).or_default().insert(widget.to_string(), v);
            }
            None => {}
        }
    }
    let sources = slots
        .iter()
        .enumerate()
        .map(|(k, slot)| {
            let name = slot.get("name").and_then(Json::as_str).unwrap_or("");
            // Instance inputs are matched by name: the frontend drops unconnected ones.
            let outer = instance
                .inputs
                .iter()
                .find(|i| i.name == name)
                .and_then(|i| i.link)
                .and_then(|l| parent_links.get(&l).copied());
            match outer {
                Some(link) => Some(Ok(link)),
                None => values[k].take().map(Err),
            }
        })
        .collect();
    (sources, overrides)
}

impl Graph {
    /// Adds one graph (the workflow, or a subgraph under `prefix`) and everything nested in
    /// it. `inputs` are what crosses in through the subgraph's input slots; the returned map
    /// takes this graph's link ids to the flattened ones.
    #[allow(clippy::too_many_arguments)]
    fn add_scope(
        &mut self,
        nodes_json: &[Json],
        links_json: &[Json],
        prefix: &str,
        scope: Option<&Definition>,
        defs: &HashMap<String, Definition>,
        stack: &mut Vec<String>,
        inputs: &[Option<Result<i64, Json>>],
        overrides: HashMap<String, HashMap<String, Json>>,
    ) -> Result<HashMap<i64, i64>, WorkflowError> {
        let where_ = match scope {
            Some(d) => format!("{} ", d.label()),
            None => String::new(),
        };
        let mut nodes = Vec::new();
        for (i, n) in nodes_json.iter().enumerate() {
            nodes.push((parse_node(n, i, &where_)?, n));
        }
        let mut raw_links = Vec::new();
        for (i, l) in links_json.iter().enumerate() {
            // Deleted links are sometimes left as null.
            if !l.is_null() {
                raw_links.push(parse_link(l, i, &where_)?);
            }
        }
        let nodes = unpack_groups(nodes, &mut raw_links, &self.groups, &where_)?;
        let mut map = HashMap::new();
        for (id, _, _) in &raw_links {
            self.next_link += 1;
            map.insert(*id, self.next_link);
        }
        // Which input (and widget) each link of this graph ends on.
        let mut targets: HashMap<i64, (String, Option<String>)> = HashMap::new();
        for (node, _) in &nodes {
            for input in &node.inputs {
                if let Some(l) = input.link {
                    targets.insert(l, (node.id.clone(), input.widget.clone()));
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (node, _) in &nodes {
            if !seen.insert(node.id.clone()) {
                return Err(err(format!("{where_}node {}", node.id), "duplicate node id"));
            }
        }

        // Instances first: their insides are needed to wire what comes out of them.
        let mut outputs_of: HashMap<String, (bool, Vec<Option<i64>>)> = HashMap::new();
        for (node, node_json) in &nodes {
            let Some(def) = defs.get(&node.class) else { continue };
            let passes = node.mode == MODE_NEVER || node.mode == MODE_BYPASS;
            // ComfyUI's frontend expands a muted or bypassed instance only when it is nested.
            if passes && scope.is_none() {
                continue;
            }
            let label = format!("{where_}node {} ({})", node.id, def.label());
            if stack.contains(&def.id) || stack.len() >= MAX_SUBGRAPH_DEPTH {
                return Err(err(label, "the subgraph contains itself"));
            }
            let inner_nodes_json = def.doc.get("nodes").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[]);
            let inner_links_json = def.doc.get("links").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[]);
            let mut inner_parsed = Vec::new();
            for (i, n) in inner_nodes_json.iter().enumerate() {
                inner_parsed.push(parse_node(n, i, &format!("{} ", def.label()))?);
            }
            let mut inner_targets = HashMap::new();
            for n in &inner_parsed {
                for input in &n.inputs {
                    if let Some(l) = input.link {
                        inner_targets.insert(l, (n.id.clone(), input.widget.clone()));
                    }
                }
            }
            let (sources, inner_overrides) = boundary_inputs(node, node_json, def, &inner_parsed, &inner_targets, &map);
            // An inner link from an input slot the subgraph does not have is refused.
            for (i, l) in inner_links_json.iter().enumerate() {
                if l.is_null() {
                    continue;
                }
                let (id, origin, slot) = parse_link(l, i, &format!("{} ", def.label()))?;
                if origin == SUBGRAPH_INPUT && slot >= sources.len() {
                    return Err(err(
                        format!("{} links[{i}]", def.label()),
                        format!("link {id} comes from input slot {slot}, but the subgraph has {} inputs", sources.len()),
                    ));
                }
            }
            let inner_prefix = format!("{prefix}{}:", node.id);
            stack.push(def.id.clone());
            let inner_map = self.add_scope(inner_nodes_json, inner_links_json, &inner_prefix, Some(def), defs, stack, &sources, inner_overrides)?;
            stack.pop();
            let outs = def
                .slots("outputs")
                .iter()
                .map(|slot| {
                    // Files carry stale duplicates; the frontend follows the first link.
                    slot.get("linkIds")
                        .and_then(Json::as_array)
                        .and_then(|ids| ids.first())
                        .and_then(Json::as_i64)
                        .and_then(|l| inner_map.get(&l).copied())
                })
                .collect();
            outputs_of.insert(node.id.clone(), (passes, outs));
        }

        // The input side of this subgraph's boundary.
        for (k, source) in inputs.iter().enumerate() {
            let id = format!("{prefix}#in{k}");
            self.nodes.insert(id.clone(), stand_in(id, source.clone()));
        }
        for (id, origin, slot) in raw_links {
            let (origin, origin_slot) = if scope.is_some() && origin == SUBGRAPH_INPUT {
                (format!("{prefix}#in{slot}"), 0)
            } else {
                match outputs_of.get(&origin) {
                    // Out of an expanded instance: from whatever feeds that output inside.
                    Some((false, outs)) => {
                        let stand = format!("{prefix}{origin}#out{slot}");
                        if !self.nodes.contains_key(&stand) {
                            let link = outs.get(slot).copied().flatten();
                            self.nodes.insert(stand.clone(), stand_in(stand.clone(), link.map(Ok)));
                        }
                        (stand, 0)
                    }
                    _ => (format!("{prefix}{origin}"), slot),
                }
            };
            self.links.insert(map[&id], UiLink { origin, origin_slot });
        }
        let mut overrides = overrides;
        for (mut node, _) in nodes {
            // Over any a group node's instance set (a subgraph's proxies are the outer ones).
            node.overrides.extend(overrides.remove(&node.id).unwrap_or_default());
            if defs.contains_key(&node.class) {
                node.virtual_node = true;
            }
            node.id = format!("{prefix}{}", node.id);
            for input in &mut node.inputs {
                // A link the graph does not list is treated as no link, as the frontend does.
                input.link = input.link.and_then(|l| map.get(&l).copied());
            }
            self.order.push(node.id.clone());
            self.nodes.insert(node.id.clone(), node);
        }
        Ok(map)
    }

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

/// Converts a UI-format document to a workflow, subgraphs expanded as ComfyUI's frontend
/// expands them when it queues. Nodes of unknown classes keep their links but not their
/// widget values (which cannot be named without a schema); validation then reports the
/// unknown class.
pub fn ui_to_workflow(doc: &Json, registry: &Registry) -> Result<Workflow, WorkflowError> {
    let nodes_json = doc
        .get("nodes")
        .and_then(Json::as_array)
        .ok_or_else(|| err("workflow", "nodes must be an array"))?;
    let links_json = doc
        .get("links")
        .and_then(Json::as_array)
        .ok_or_else(|| err("workflow", "links must be an array"))?;
    let mut defs = HashMap::new();
    collect_definitions(doc, &mut defs)?;
    let mut graph = Graph {
        nodes: HashMap::new(),
        links: HashMap::new(),
        order: Vec::new(),
        next_link: 0,
        groups: groups::group_types(doc, registry)?,
    };
    graph.add_scope(nodes_json, links_json, "", None, &defs, &mut Vec::new(), &[], HashMap::new())?;

    let mut wf = Workflow::new();
    for id in &graph.order {
        let node = &graph.nodes[id];
        if node.virtual_node || is_virtual(&node.class) || node.mode == MODE_NEVER || node.mode == MODE_BYPASS {
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
                                // A file from a catalogue without this widget: the frontend
                                // gives the widget its default.
                                widget_value = a.get(cursor).cloned().or_else(|| input.default_json());
                                cursor += 1;
                                let upload = input.extra.get("image_upload") == Some(&Json::Bool(true));
                                skip_companions(a, &mut cursor, has_control_widget(input), upload);
                            }
                            Json::Object(m) => widget_value = m.get(&input.name).cloned(),
                            _ => {}
                        }
                        if let Some(v) = node.overrides.get(&input.name) {
                            widget_value = Some(v.clone());
                        }
                    }
                    match linked(&input.name) {
                        Some(Some(source)) => {
                            spec.inputs
                                .insert(input.name.clone(), source_to_input(source));
                        }
                        // Not linked, or linked to something muted or to nothing: the
                        // widget's own value stays (a link input goes without), as the
                        // frontend writes widgets before links.
                        _ => {
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
        wf.nodes.insert(id.clone(), spec);
    }
    // Links to nodes that are not in the prompt (muted inside a subgraph, say) are
    // dropped, as the frontend drops them.
    let present: std::collections::HashSet<String> = wf.nodes.keys().cloned().collect();
    for spec in wf.nodes.values_mut() {
        spec.inputs.retain(|_, v| match v {
            InputValue::Link { node, .. } => present.contains(node),
            InputValue::Const(_) => true,
        });
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

/// Steps `cursor` past the values the frontend stores after a widget's own in
/// `widgets_values`: a seed's control value, an upload button's `"image"`.
fn skip_companions(values: &[Json], cursor: &mut usize, control: bool, upload: bool) {
    if control && is_control(values.get(*cursor)) {
        *cursor += 1;
    }
    if upload && values.get(*cursor).and_then(Json::as_str) == Some("image") {
        *cursor += 1;
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
