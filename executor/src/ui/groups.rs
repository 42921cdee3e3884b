//! Legacy group nodes (`workflow>Name` nodes defined in `extra.groupNodes`), unpacked as
//! ComfyUI's frontend unpacks them when it loads such a file (its `groupNode.ts`:
//! `GroupNodeConfig` builds the group's node definition, `convertToNodes` puts the inner
//! nodes back with the instance's widget values and links).
//!
//! The group's definition is derived from its inner nodes' schemas, in their order: every
//! widget an inner node has, unless an internal link feeds it, becomes one of the group's
//! widgets; every input socket that nothing inside feeds becomes one of its inputs (widgets
//! the old frontend showed as inputs after all others); every output that nothing inside
//! consumes (or that the file marks external) becomes one of its outputs. Names that
//! repeat get the frontend's suffixes (`"CLIPTextEncode text"`, `"CLIPTextEncode 2 text"`),
//! and instance widget values are matched back to inner widgets by those names, as the
//! frontend does. Inner nodes get ids `group:index`.

use std::collections::HashMap;

use serde_json::{Map, Value as Json};

use super::{err, parse_node, skip_companions, UiInput, UiNode};
use crate::registry::Registry;
use crate::schema::{InputKind, InputSpec};
use crate::workflow::WorkflowError;

/// The frontend's separator between `workflow` and the group's name (older files: `/`).
pub(super) fn group_name(class: &str) -> Option<&str> {
    class.strip_prefix("workflow>").or_else(|| class.strip_prefix("workflow/"))
}

/// One widget of the group node, in the order its `widgets_values` holds them.
struct OuterWidget {
    name: String,
    /// A fixed/increment/... control widget follows it.
    control: bool,
    /// An upload button (value `"image"`) follows it.
    upload: bool,
}

/// A group type, mapped as `GroupNodeConfig` maps it.
pub(super) struct GroupType {
    name: String,
    nodes: Vec<Json>,
    /// Internal links: (source index, source slot, target index, target slot).
    links: Vec<(usize, usize, usize, usize)>,
    widgets: Vec<OuterWidget>,
    /// Per inner node: (its widget name, the group widget's name), in definition order.
    widget_map: Vec<Vec<(String, String)>>,
    /// Group input slot → (inner node index, inner input name).
    inputs: Vec<(usize, String)>,
    /// Group output slot → (inner node index, inner output slot).
    outputs: Vec<(usize, usize)>,
}

enum Def {
    Schema(Vec<InputSpec>, usize),
    /// A PrimitiveNode's one `value`: a widget when its type is one.
    Primitive(Option<&'static str>),
    /// A Reroute's one input and output.
    Reroute,
}

fn widget_type(t: &str) -> Option<&'static str> {
    ["INT", "FLOAT", "STRING", "BOOLEAN"].into_iter().find(|w| *w == t)
}

struct Builder<'a, 'r> {
    data: &'a Map<String, Json>,
    nodes: &'a [Json],
    registry: &'r Registry,
    links_from: HashMap<usize, HashMap<usize, Vec<(usize, usize, usize, usize, Option<String>)>>>,
    links_to: HashMap<usize, HashMap<usize, (usize, usize, usize, usize)>>,
    external: HashMap<usize, Vec<usize>>,
    seen: HashMap<String, i64>,
    /// The group definition's entries in order: (name, widget?).
    entries: Vec<(String, Option<OuterWidget>)>,
    widget_map: Vec<Vec<(String, String)>>,
    input_map: Vec<(usize, String)>,
    outputs: Vec<(usize, usize)>,
}

impl<'a, 'r> Builder<'a, 'r> {
    fn node_type(&self, i: usize) -> &'a str {
        self.nodes[i].get("type").and_then(Json::as_str).unwrap_or("")
    }

    fn title(&self, i: usize) -> Option<&'a str> {
        self.nodes[i].get("title").and_then(Json::as_str)
    }

    fn node_inputs(&self, i: usize) -> &'a [Json] {
        self.nodes[i].get("inputs").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[])
    }

    fn custom(&self, i: usize, side: &str, key: &str) -> Option<&'a Json> {
        self.data.get("config")?.get(i.to_string())?.get(side)?.get(key)
    }

    fn def(&self, i: usize) -> Option<Def> {
        let ty = self.node_type(i);
        if let Some(schema) = self.registry.schema(ty) {
            let mut inputs: Vec<InputSpec> = schema.inputs.iter().filter(|s| !s.optional).cloned().collect();
            inputs.extend(schema.inputs.iter().filter(|s| s.optional).cloned());
            return Some(Def::Schema(inputs, schema.outputs.len()));
        }
        match ty {
            // Skipped unless something inside takes its value.
            "PrimitiveNode" => {
                let first = self.links_from.get(&i)?.get(&0)?.first()?;
                Some(Def::Primitive(first.4.as_deref().and_then(widget_type)))
            }
            "Reroute" => {
                let used_inside = self.links_to.contains_key(&i) && self.links_from.contains_key(&i);
                let external = self.external.get(&i).is_some_and(|s| s.contains(&0));
                (!used_inside || external).then_some(Def::Reroute)
            }
            _ => None,
        }
    }

    /// `getInputConfig`'s naming: a label or configured name, made unique by the node's
    /// title (or type) and then a counter.
    fn input_name(&mut self, i: usize, input: &str) -> String {
        let label = self
            .custom(i, "input", input)
            .and_then(|c| c.get("name"))
            .and_then(Json::as_str)
            .or_else(|| {
                self.node_inputs(i)
                    .iter()
                    .find(|x| x.get("name").and_then(Json::as_str) == Some(input))
                    .and_then(|x| x.get("label"))
                    .and_then(Json::as_str)
            });
        let mut name = label.unwrap_or(input).to_string();
        let mut key = name.clone();
        let titled_primitive = self.node_type(i) == "PrimitiveNode" && self.title(i).is_some_and(|t| !t.is_empty());
        if titled_primitive || self.seen.contains_key(&name) {
            let prefix = format!("{} ", self.title(i).unwrap_or(self.node_type(i)));
            name = format!("{prefix}{input}");
            key = name.clone();
            if let Some(n) = self.seen.get(&name) {
                name = format!("{prefix}{n} {input}");
            }
        }
        let n = self.seen.get(&key).copied().unwrap_or(1) + 1;
        self.seen.insert(key, n);
        name
    }

    fn hidden(&self, i: usize, input: &str) -> bool {
        self.custom(i, "input", input).and_then(|c| c.get("visible")) == Some(&Json::Bool(false))
    }

    fn slot_index(&self, i: usize, input: &str) -> Option<usize> {
        self.node_inputs(i).iter().position(|x| x.get("name").and_then(Json::as_str) == Some(input))
    }

    fn linked_inside(&self, i: usize, slot: usize) -> bool {
        self.links_to.get(&i).is_some_and(|m| m.contains_key(&slot))
    }

    fn widget_entry(&mut self, i: usize, input: &str, control: bool, upload: bool) {
        let name = self.input_name(i, input);
        self.widget_map[i].push((input.to_string(), name.clone()));
        self.entries.push((name.clone(), Some(OuterWidget { name, control, upload })));
    }

    /// `processNodeInputs`: widgets now, unlinked sockets now, widgets the file shows
    /// as inputs later (returned, with their slot index).
    fn inputs(&mut self, i: usize, def: &Def) -> Vec<(usize, String, bool, bool)> {
        let mut converted = Vec::new();
        let mut slots: Vec<String> = Vec::new();
        match def {
            Def::Schema(inputs, _) => {
                for spec in inputs {
                    let force = spec.extra.get("forceInput") == Some(&Json::Bool(true));
                    if !spec.kind.is_widget() || force {
                        slots.push(spec.name.clone());
                        continue;
                    }
                    let control = matches!(&spec.kind, InputKind::Int(w) if w.control_after_generate)
                        || spec.name == "seed"
                        || spec.name == "noise_seed";
                    let upload = spec.extra.get("image_upload") == Some(&Json::Bool(true));
                    let as_input = self.node_inputs(i).iter().position(|x| {
                        x.get("name").and_then(Json::as_str) == Some(&spec.name)
                            && x.get("widget").and_then(|w| w.get("name")).and_then(Json::as_str) == Some(&spec.name)
                    });
                    match as_input {
                        Some(slot) => converted.push((slot, spec.name.clone(), control, upload)),
                        None => self.widget_entry(i, &spec.name, control, upload),
                    }
                }
            }
            Def::Primitive(Some(_)) => self.widget_entry(i, "value", true, false),
            Def::Primitive(None) => slots.push("value".into()),
            Def::Reroute => slots.push(String::new()),
        }
        for (k, input) in slots.iter().enumerate() {
            let slot = self.slot_index(i, input).unwrap_or(k);
            if self.linked_inside(i, slot) {
                continue;
            }
            // Named for the counters' sake even when hidden, as the frontend does.
            self.input_name(i, input);
            if self.hidden(i, input) {
                continue;
            }
            self.entries.push((input.clone(), None));
            self.input_map.push((i, input.clone()));
        }
        converted.sort_by_key(|c| c.0);
        converted
    }

    /// `processConvertedWidgets`: a widget the file shows as an input, unless fed inside.
    fn converted(&mut self, i: usize, list: Vec<(usize, String, bool, bool)>) {
        for (slot, input, control, upload) in list {
            if self.linked_inside(i, slot) {
                continue;
            }
            self.widget_entry(i, &input, control, upload);
            self.input_map.push((i, input));
        }
    }

    fn outputs(&mut self, i: usize, count: usize) {
        for o in 0..count {
            let inside = self.links_from.get(&i).is_some_and(|m| m.contains_key(&o));
            let external = self.external.get(&i).is_some_and(|s| s.contains(&o));
            let visible = self
                .custom(i, "output", &o.to_string())
                .and_then(|c| c.get("visible"))
                .and_then(Json::as_bool)
                .unwrap_or(!inside || external);
            if visible {
                self.outputs.push((i, o));
            }
        }
    }
}

fn index(v: Option<&Json>) -> Option<usize> {
    v.and_then(Json::as_u64).and_then(|n| usize::try_from(n).ok())
}

impl GroupType {
    /// Maps `extra.groupNodes[name]` against the schemas of its inner nodes.
    pub(super) fn new(name: &str, data: &Json, registry: &Registry) -> Result<GroupType, WorkflowError> {
        let path = format!("extra.groupNodes['{name}']");
        let data = data.as_object().ok_or_else(|| err(&path, "expected an object"))?;
        let nodes = data
            .get("nodes")
            .and_then(Json::as_array)
            .ok_or_else(|| err(&path, "nodes must be an array"))?;
        let mut missing: Vec<&str> = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let ty = n
                .get("type")
                .and_then(Json::as_str)
                .ok_or_else(|| err(format!("{path} nodes[{i}]"), "missing type"))?;
            let known = registry.schema(ty).is_some()
                || matches!(ty, "PrimitiveNode" | "Reroute" | "Note" | "MarkdownNote")
                || group_name(ty).is_some();
            if !known && !missing.contains(&ty) {
                missing.push(ty);
            }
        }
        if !missing.is_empty() {
            return Err(err(path, format!("the group holds node types this server does not have: {}", missing.join(", "))));
        }
        let mut b = Builder {
            data,
            nodes,
            registry,
            links_from: HashMap::new(),
            links_to: HashMap::new(),
            external: HashMap::new(),
            seen: HashMap::new(),
            entries: Vec::new(),
            widget_map: vec![Vec::new(); nodes.len()],
            input_map: Vec::new(),
            outputs: Vec::new(),
        };
        let mut links = Vec::new();
        for (k, l) in data.get("links").and_then(Json::as_array).into_iter().flatten().enumerate() {
            let a = l.as_array().ok_or_else(|| err(format!("{path} links[{k}]"), "expected an array"))?;
            // A link from outside the group when it was made has no source index.
            let Some(src) = index(a.first()) else { continue };
            let (Some(src_slot), Some(dst), Some(dst_slot)) = (index(a.get(1)), index(a.get(2)), index(a.get(3))) else {
                return Err(err(format!("{path} links[{k}]"), "expected [source index, source slot, target index, target slot, ...]"));
            };
            if src >= nodes.len() || dst >= nodes.len() {
                return Err(err(format!("{path} links[{k}]"), format!("node index out of range (the group has {} nodes)", nodes.len())));
            }
            let ty = a.get(5).and_then(Json::as_str).map(str::to_string);
            let link = (src, src_slot, dst, dst_slot);
            b.links_from.entry(src).or_default().entry(src_slot).or_default().push((src, src_slot, dst, dst_slot, ty));
            b.links_to.entry(dst).or_default().insert(dst_slot, link);
            links.push(link);
        }
        for e in data.get("external").and_then(Json::as_array).into_iter().flatten() {
            if let (Some(n), Some(s), Some(t)) = (index(e.get(0)), index(e.get(1)), e.get(2)) {
                if !t.is_null() {
                    b.external.entry(n).or_default().push(s);
                }
            }
        }
        let mut deferred = Vec::new();
        for i in 0..nodes.len() {
            let Some(def) = b.def(i) else { continue };
            let converted = b.inputs(i, &def);
            deferred.push((i, converted));
            b.outputs(i, if let Def::Schema(_, n) = def { n } else { 1 });
        }
        for (i, converted) in deferred {
            b.converted(i, converted);
        }
        Ok(GroupType {
            name: name.to_string(),
            nodes: nodes.clone(),
            links,
            widgets: b.entries.into_iter().filter_map(|(_, w)| w).collect(),
            widget_map: b.widget_map,
            inputs: b.input_map,
            outputs: b.outputs,
        })
    }

    /// The instance's widget values by group widget position.
    fn outer_values(&self, instance: &UiNode) -> Vec<(String, Json)> {
        let values = instance.widgets_values.as_array().cloned().unwrap_or_default();
        let mut out = Vec::new();
        let mut cursor = 0;
        for w in &self.widgets {
            let Some(v) = values.get(cursor) else { break };
            out.push((w.name.clone(), v.clone()));
            cursor += 1;
            skip_companions(&values, &mut cursor, w.control, w.upload);
        }
        out
    }

    /// `convertToNodes`: the inner nodes (ids `instance:index`, links renumbered from
    /// `next_link`), and how the instance's own links move: input link ids to the inner
    /// input that takes each, output slot to (inner node id, slot).
    pub(super) fn unpack(&self, instance: &UiNode, where_: &str, next_link: &mut i64) -> Result<Unpacked, WorkflowError> {
        let label = format!("group node '{}'", self.name);
        let mut inner = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let mut n = n.clone();
            if let Some(o) = n.as_object_mut() {
                o.insert("id".into(), Json::String(format!("{}:{i}", instance.id)));
            }
            let mut node = parse_node(&n, i, &format!("{where_}{label} "))?;
            // Link ids inside a group's data are stale copies from where it was made.
            for input in &mut node.inputs {
                input.link = None;
            }
            inner.push(node);
        }
        let outer = self.outer_values(instance);
        let mut consumed = vec![false; outer.len()];
        for (i, map) in self.widget_map.iter().enumerate() {
            for (old, new) in map {
                let Some(k) = (0..outer.len()).find(|&k| !consumed[k] && outer[k].0 == *new) else { continue };
                consumed[k] = true;
                // A Primitive's value is taken over by its target on reconnection (below).
                if inner[i].class != "PrimitiveNode" {
                    inner[i].overrides.insert(old.clone(), outer[k].1.clone());
                }
            }
        }
        let mut links = Vec::new();
        for &(src, src_slot, dst, dst_slot) in &self.links {
            // A PrimitiveNode unpacked from a group takes the value of the widget it feeds
            // when the frontend reconnects it, so that widget keeps its own value.
            if inner[src].class == "PrimitiveNode" {
                continue;
            }
            *next_link += 1;
            links.push((*next_link, inner[src].id.clone(), src_slot));
            let target = &mut inner[dst];
            match target.inputs.get_mut(dst_slot) {
                Some(input) => input.link = Some(*next_link),
                None => {
                    return Err(err(
                        format!("{where_}{label} node {dst}"),
                        format!("a link inside the group ends on input slot {dst_slot}, which the node does not have"),
                    ))
                }
            }
        }
        for (k, input) in instance.inputs.iter().enumerate() {
            let Some(link) = input.link else { continue };
            let Some((i, name)) = self.inputs.get(k) else { continue };
            let node = &mut inner[*i];
            match node.inputs.iter_mut().find(|x| x.name == *name) {
                Some(x) => x.link = Some(link),
                None => node.inputs.push(UiInput { name: name.clone(), io_type: input.io_type.clone(), link: Some(link), widget: None }),
            }
        }
        let outputs = self.outputs.iter().map(|&(i, slot)| (inner[i].id.clone(), slot)).collect();
        Ok(Unpacked { nodes: inner, links, outputs })
    }
}

pub(super) struct Unpacked {
    pub nodes: Vec<UiNode>,
    /// New internal links: (id, origin id, origin slot).
    pub links: Vec<(i64, String, usize)>,
    pub outputs: Vec<(String, usize)>,
}

/// Every group type the document defines, mapped; one that cannot be mapped is an error
/// only where a node uses it, as in the frontend.
pub(super) fn group_types(doc: &Json, registry: &Registry) -> Result<HashMap<String, Result<GroupType, (String, String)>>, WorkflowError> {
    let mut out = HashMap::new();
    let Some(groups) = doc.get("extra").and_then(|e| e.get("groupNodes")).filter(|g| !g.is_null()) else {
        return Ok(out);
    };
    let groups = groups.as_object().ok_or_else(|| err("extra.groupNodes", "must be an object"))?;
    for (name, data) in groups {
        let mapped = GroupType::new(name, data, registry).map_err(|e| match e {
            WorkflowError::Structure { path, message } => (path, message),
            other => (format!("extra.groupNodes['{name}']"), other.to_string()),
        });
        out.insert(name.clone(), mapped);
    }
    Ok(out)
}
