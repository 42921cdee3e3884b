//! Validation before anything runs. Every problem is collected into one report shaped like
//! ComfyUI's `/prompt` error response, with ComfyUI's error type names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::node::{InputData, Inputs};
use crate::plan::{key_prefix, Plan, PlanLink, PlanNode};
use crate::registry::Registry;
use crate::schema::{InputKind, InputSpec, NodeSchema};
use crate::value::IoType;
use crate::workflow::{InputValue, Workflow};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The class is not in the registry.
    MissingNodeType,
    InvalidPrompt,
    PromptNoOutputs,
    PromptOutputsFailedValidation,
    RequiredInputMissing,
    /// A link that is malformed, points to a missing node or to a missing output.
    BadLinkedInput,
    ReturnTypeMismatch,
    /// A constant that cannot be read as the widget's type.
    InvalidInputType,
    ValueSmallerThanMin,
    ValueBiggerThanMax,
    ValueNotInList,
    DependencyCycle,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::MissingNodeType => "missing_node_type",
            ErrorKind::InvalidPrompt => "invalid_prompt",
            ErrorKind::PromptNoOutputs => "prompt_no_outputs",
            ErrorKind::PromptOutputsFailedValidation => "prompt_outputs_failed_validation",
            ErrorKind::RequiredInputMissing => "required_input_missing",
            ErrorKind::BadLinkedInput => "bad_linked_input",
            ErrorKind::ReturnTypeMismatch => "return_type_mismatch",
            ErrorKind::InvalidInputType => "invalid_input_type",
            ErrorKind::ValueSmallerThanMin => "value_smaller_than_min",
            ErrorKind::ValueBiggerThanMax => "value_bigger_than_max",
            ErrorKind::ValueNotInList => "value_not_in_list",
            ErrorKind::DependencyCycle => "dependency_cycle",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ValidationError {
    #[serde(rename = "type")]
    pub kind: ErrorKind,
    pub message: String,
    pub details: String,
    pub extra_info: Json,
}

impl ValidationError {
    fn new(
        kind: ErrorKind,
        message: impl Into<String>,
        details: impl Into<String>,
        extra: Json,
    ) -> Self {
        ValidationError {
            kind,
            message: message.into(),
            details: details.into(),
            extra_info: extra,
        }
    }

    /// The input this error is about, when it is about one.
    pub fn input_name(&self) -> Option<&str> {
        self.extra_info.get("input_name").and_then(Json::as_str)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeErrors {
    pub errors: Vec<ValidationError>,
    /// Output nodes that cannot run because of this node.
    pub dependent_outputs: Vec<String>,
    pub class_type: String,
}

/// Why a workflow cannot run: ComfyUI's `{"error": {...}, "node_errors": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, thiserror::Error)]
#[error("{}", self.summary())]
pub struct ValidationReport {
    pub error: ValidationError,
    pub node_errors: BTreeMap<String, NodeErrors>,
}

impl ValidationReport {
    pub fn to_json(&self) -> Json {
        serde_json::to_value(self).unwrap_or(Json::Null)
    }

    /// Every error as (node id, error), in node id order.
    pub fn errors(&self) -> impl Iterator<Item = (&str, &ValidationError)> {
        self.node_errors
            .iter()
            .flat_map(|(id, n)| n.errors.iter().map(move |e| (id.as_str(), e)))
    }

    pub fn has(&self, node: &str, kind: ErrorKind) -> bool {
        self.node_errors
            .get(node)
            .is_some_and(|n| n.errors.iter().any(|e| e.kind == kind))
    }

    fn summary(&self) -> String {
        let n = self.errors().count();
        if n == 0 {
            format!("{}: {}", self.error.kind.as_str(), self.error.message)
        } else {
            format!(
                "{}: {} ({n} error{} in {} node{})",
                self.error.kind.as_str(),
                self.error.message,
                if n == 1 { "" } else { "s" },
                self.node_errors.len(),
                if self.node_errors.len() == 1 { "" } else { "s" }
            )
        }
    }

    /// A readable multi-line listing, one line per error.
    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.summary());
        for (id, node) in &self.node_errors {
            for e in &node.errors {
                out.push_str(&format!(
                    "  node {id} ({}): [{}] {}",
                    node.class_type,
                    e.kind.as_str(),
                    e.message
                ));
                if !e.details.is_empty() {
                    out.push_str(&format!(": {}", e.details));
                }
                out.push('\n');
            }
        }
        out
    }
}

fn input_extra(input: &InputSpec, received: Option<&Json>) -> Json {
    let mut extra = json!({ "input_name": input.name, "input_config": input.object_info() });
    if let Some(v) = received {
        extra["received_value"] = v.clone();
    }
    extra
}

fn render_value(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Converts a constant to the widget's type as ComfyUI does (numbers from numeric
/// strings, integral floats for INT), then checks limits and combo options.
pub(crate) fn normalize_widget(input: &InputSpec, v: &Json) -> Result<Json, Box<ValidationError>> {
    let name = &input.name;
    let bad_type = |ty: &str| {
        Box::new(ValidationError::new(
            ErrorKind::InvalidInputType,
            format!("Failed to convert an input value to a {ty} value"),
            format!("{name}, {}", render_value(v)),
            input_extra(input, Some(v)),
        ))
    };
    let too_small = |val: String, min: String| {
        Box::new(ValidationError::new(
            ErrorKind::ValueSmallerThanMin,
            format!("Value {val} smaller than min of {min}"),
            name.clone(),
            input_extra(input, Some(v)),
        ))
    };
    let too_big = |val: String, max: String| {
        Box::new(ValidationError::new(
            ErrorKind::ValueBiggerThanMax,
            format!("Value {val} bigger than max of {max}"),
            name.clone(),
            input_extra(input, Some(v)),
        ))
    };
    match &input.kind {
        InputKind::Link(_) => Ok(v.clone()),
        InputKind::Int(w) => {
            let parsed: Option<i128> = match v {
                Json::Number(n) => n
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_u64().map(i128::from))
                    .or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 1e38)
                            .map(|f| f as i128)
                    }),
                Json::String(s) => s.trim().parse::<i128>().ok(),
                _ => None,
            };
            let i = parsed.ok_or_else(|| bad_type("INT"))?;
            if i < w.min {
                return Err(too_small(i.to_string(), w.min.to_string()));
            }
            if i > w.max {
                return Err(too_big(i.to_string(), w.max.to_string()));
            }
            Ok(crate::schema::int_json(i))
        }
        InputKind::Float(w) => {
            let f = match v {
                Json::Number(n) => n.as_f64(),
                Json::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
                _ => None,
            }
            .ok_or_else(|| bad_type("FLOAT"))?;
            if f < w.min {
                return Err(too_small(f.to_string(), w.min.to_string()));
            }
            if f > w.max {
                return Err(too_big(f.to_string(), w.max.to_string()));
            }
            Ok(json!(f))
        }
        InputKind::String(_) => match v {
            Json::String(_) => Ok(v.clone()),
            Json::Number(n) => Ok(json!(n.to_string())),
            Json::Bool(b) => Ok(json!(b.to_string())),
            _ => Err(bad_type("STRING")),
        },
        InputKind::Boolean(_) => match v {
            Json::Bool(_) => Ok(v.clone()),
            Json::String(s) if s.eq_ignore_ascii_case("true") => Ok(json!(true)),
            Json::String(s) if s.eq_ignore_ascii_case("false") => Ok(json!(false)),
            _ => Err(bad_type("BOOLEAN")),
        },
        InputKind::Combo(w) => {
            let s = match v {
                Json::String(s) => Some(s.clone()),
                Json::Number(n) => Some(n.to_string()),
                _ => None,
            };
            match s {
                Some(s) if w.options.contains(&s) => Ok(json!(s)),
                _ => {
                    let shown: Vec<&str> = w.options.iter().take(20).map(String::as_str).collect();
                    let more = if w.options.len() > 20 {
                        format!(" (and {} more)", w.options.len() - 20)
                    } else {
                        String::new()
                    };
                    Err(Box::new(ValidationError::new(
                        ErrorKind::ValueNotInList,
                        "Value not in list",
                        format!("{name}: '{}' not in {shown:?}{more}", render_value(v)),
                        input_extra(input, Some(v)),
                    )))
                }
            }
        }
    }
}

/// Whether an output of type `received` may feed `input`.
fn link_type_ok(received: &IoType, input: &InputSpec) -> bool {
    match &input.kind {
        // A combo fed by a link receives the option string.
        InputKind::Combo(_) => {
            received.feeds(&IoType::COMBO)
                || received.feeds(&IoType::STRING)
                || received.as_str().starts_with('[')
        }
        kind => received.feeds(&kind.io_type()),
    }
}

struct Checked {
    schema: Arc<NodeSchema>,
    consts: Inputs,
    links: Vec<(String, String, usize)>,
}

/// Checks a workflow against the registry and builds its plan.
pub fn validate(wf: &Workflow, registry: &Registry) -> Result<Plan, Box<ValidationReport>> {
    let mut errors: BTreeMap<String, Vec<ValidationError>> = BTreeMap::new();
    // One schema per class, not per node: schemas may be built dynamically.
    let mut schemas: HashMap<&str, Arc<NodeSchema>> = HashMap::new();
    let mut unknown_classes = BTreeSet::new();
    for (id, spec) in &wf.nodes {
        if schemas.contains_key(spec.class_type.as_str()) {
            continue;
        }
        match registry.schema(&spec.class_type) {
            Some(s) => {
                schemas.insert(&spec.class_type, Arc::new(s));
            }
            None => {
                unknown_classes.insert(spec.class_type.clone());
                errors.entry(id.clone()).or_default();
            }
        }
    }
    for (id, spec) in &wf.nodes {
        if !schemas.contains_key(spec.class_type.as_str()) {
            errors
                .entry(id.clone())
                .or_default()
                .push(ValidationError::new(
                    ErrorKind::MissingNodeType,
                    format!("Node type '{}' not found", spec.class_type),
                    "no registered node type has this class_type",
                    json!({ "node_id": id, "class_type": spec.class_type }),
                ));
        }
    }
    errors.retain(|_, v| !v.is_empty());

    let outputs: Vec<&str> = wf
        .nodes
        .iter()
        .filter(|(_, s)| {
            schemas
                .get(s.class_type.as_str())
                .is_some_and(|s| s.output_node)
        })
        .map(|(id, _)| id.as_str())
        .collect();
    if outputs.is_empty() && errors.is_empty() {
        return Err(Box::new(ValidationReport {
            error: ValidationError::new(
                ErrorKind::PromptNoOutputs,
                "Prompt has no outputs",
                "",
                json!({}),
            ),
            node_errors: BTreeMap::new(),
        }));
    }

    // Walk up from the outputs; only those ancestors are checked and run.
    let mut checked: BTreeMap<&str, Checked> = BTreeMap::new();
    let mut stack: Vec<&str> = outputs.clone();
    let mut seen: BTreeSet<&str> = outputs.iter().copied().collect();
    while let Some(id) = stack.pop() {
        let spec = &wf.nodes[id];
        let Some(schema) = schemas.get(spec.class_type.as_str()).cloned() else {
            continue;
        };
        let mut consts = Inputs::new();
        let mut links = Vec::new();
        let mut node_errs = Vec::new();
        for input in &schema.inputs {
            match spec.inputs.get(&input.name) {
                None => {
                    if !input.optional {
                        node_errs.push(ValidationError::new(
                            ErrorKind::RequiredInputMissing,
                            "Required input is missing",
                            input.name.clone(),
                            input_extra(input, None),
                        ));
                    }
                }
                Some(InputValue::Link { node: src, output }) => {
                    let mut extra = input_extra(input, None);
                    extra["linked_node"] = json!([src, output]);
                    let Some((src_id, src_spec)) = wf.nodes.get_key_value(src.as_str()) else {
                        node_errs.push(ValidationError::new(
                            ErrorKind::BadLinkedInput,
                            "Linked node does not exist",
                            format!(
                                "{}: links to node '{src}', which is not in the workflow",
                                input.name
                            ),
                            extra,
                        ));
                        continue;
                    };
                    if seen.insert(src_id.as_str()) {
                        stack.push(src_id.as_str());
                    }
                    // An unknown upstream class is reported on that node already.
                    let Some(src_schema) = schemas.get(src_spec.class_type.as_str()) else {
                        continue;
                    };
                    let Some(out) = src_schema.outputs.get(*output) else {
                        node_errs.push(ValidationError::new(
                            ErrorKind::BadLinkedInput,
                            "Linked output does not exist",
                            format!(
                                "{}: node '{src}' ({}) has {} output(s), link asks for index {output}",
                                input.name, src_spec.class_type, src_schema.outputs.len()
                            ),
                            extra,
                        ));
                        continue;
                    };
                    if !link_type_ok(&out.io_type, input) {
                        extra["received_type"] = json!(out.io_type.as_str());
                        node_errs.push(ValidationError::new(
                            ErrorKind::ReturnTypeMismatch,
                            "Return type mismatch between linked nodes",
                            format!(
                                "{}, received_type({}) mismatch input_type({})",
                                input.name,
                                out.io_type,
                                input.kind.io_type()
                            ),
                            extra,
                        ));
                        continue;
                    }
                    links.push((input.name.clone(), src_id.clone(), *output));
                }
                Some(InputValue::Const(v)) => {
                    if v.is_array() {
                        node_errs.push(ValidationError::new(
                            ErrorKind::BadLinkedInput,
                            "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                            input.name.clone(),
                            input_extra(input, Some(v)),
                        ));
                        continue;
                    }
                    if let InputKind::Link(t) = &input.kind {
                        node_errs.push(ValidationError::new(
                            ErrorKind::BadLinkedInput,
                            "Input needs a link, got a constant",
                            format!(
                                "{}: expects a link from a {t} output, got {}",
                                input.name,
                                render_value(v)
                            ),
                            input_extra(input, Some(v)),
                        ));
                        continue;
                    }
                    match normalize_widget(input, v) {
                        Ok(n) => consts.insert(input.name.clone(), InputData::Const(n)),
                        Err(e) => node_errs.push(*e),
                    }
                }
            }
        }
        if !node_errs.is_empty() {
            errors.entry(id.to_string()).or_default().extend(node_errs);
        }
        checked.insert(
            id,
            Checked {
                schema,
                consts,
                links,
            },
        );
    }

    // Cycles, over the links that passed the checks above.
    let mut graph: DiGraph<&str, ()> = DiGraph::with_capacity(checked.len(), checked.len() * 2);
    let mut index: HashMap<&str, NodeIndex> = HashMap::with_capacity(checked.len());
    for id in checked.keys() {
        index.insert(id, graph.add_node(id));
    }
    for (id, c) in &checked {
        for (_, src, _) in &c.links {
            if let Some(&from) = index.get(src.as_str()) {
                graph.add_edge(from, index[id], ());
            }
        }
    }
    let order = match petgraph::algo::toposort(&graph, None) {
        Ok(order) => order,
        Err(_) => {
            for scc in petgraph::algo::tarjan_scc(&graph) {
                let cyclic = scc.len() > 1 || graph.contains_edge(scc[0], scc[0]);
                if !cyclic {
                    continue;
                }
                let mut members: Vec<&str> = scc.iter().map(|&i| graph[i]).collect();
                members.sort();
                for m in &members {
                    errors
                        .entry(m.to_string())
                        .or_default()
                        .push(ValidationError::new(
                            ErrorKind::DependencyCycle,
                            "Dependency cycle detected",
                            format!(
                                "node {m} is part of a cycle through nodes {}",
                                members.join(", ")
                            ),
                            json!({ "cycle": members }),
                        ));
                }
            }
            Vec::new()
        }
    };

    if !errors.is_empty() {
        return Err(Box::new(report(wf, errors, &outputs, &unknown_classes)));
    }

    let mut position: HashMap<&str, usize> = HashMap::with_capacity(order.len());
    let mut nodes = Vec::with_capacity(order.len());
    for ix in order {
        let id = graph[ix];
        // `order` holds exactly the checked nodes.
        let Some(c) = checked.remove(id) else {
            continue;
        };
        let spec = &wf.nodes[id];
        let node = match registry.get(&spec.class_type) {
            Some(n) => n.clone(),
            None => continue,
        };
        let links = c
            .links
            .into_iter()
            .map(|(input, src, output)| PlanLink {
                input,
                from: position[src.as_str()],
                output,
            })
            .collect();
        position.insert(id, nodes.len());
        nodes.push(PlanNode {
            id: id.to_string(),
            class_type: spec.class_type.clone(),
            lane: node.lane(),
            node,
            key_prefix: key_prefix(&spec.class_type, &c.consts),
            consts: c.consts,
            links,
            output_types: c.schema.outputs.iter().map(|o| o.io_type.clone()).collect(),
            output_node: c.schema.output_node,
        });
    }
    Ok(Plan { nodes })
}

fn report(
    wf: &Workflow,
    errors: BTreeMap<String, Vec<ValidationError>>,
    outputs: &[&str],
    unknown_classes: &BTreeSet<String>,
) -> ValidationReport {
    // Which outputs each node feeds, walking up from every output.
    let mut dependents: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for &out in outputs {
        let mut stack = vec![out];
        let mut seen = BTreeSet::from([out]);
        while let Some(id) = stack.pop() {
            dependents.entry(id).or_default().insert(out);
            if let Some(spec) = wf.nodes.get(id) {
                for v in spec.inputs.values() {
                    if let InputValue::Link { node, .. } = v {
                        if let Some((k, _)) = wf.nodes.get_key_value(node.as_str()) {
                            if seen.insert(k.as_str()) {
                                stack.push(k.as_str());
                            }
                        }
                    }
                }
            }
        }
    }
    let node_errors = errors
        .into_iter()
        .map(|(id, errs)| {
            let class_type = wf
                .nodes
                .get(&id)
                .map(|s| s.class_type.clone())
                .unwrap_or_default();
            let dependent_outputs = dependents
                .get(id.as_str())
                .map(|s| s.iter().map(|s| s.to_string()).collect())
                .unwrap_or_default();
            (
                id,
                NodeErrors {
                    errors: errs,
                    dependent_outputs,
                    class_type,
                },
            )
        })
        .collect();
    let error = if !unknown_classes.is_empty() {
        let list: Vec<&str> = unknown_classes.iter().map(String::as_str).collect();
        ValidationError::new(
            ErrorKind::MissingNodeType,
            format!("Unknown node type(s): {}", list.join(", ")),
            "",
            json!({ "class_types": list }),
        )
    } else {
        ValidationError::new(
            ErrorKind::PromptOutputsFailedValidation,
            "Prompt outputs failed validation",
            "",
            json!({}),
        )
    };
    ValidationReport { error, node_errors }
}
