//! ComfyUI's subgraphs in the UI format, expanded as its frontend expands them when it
//! queues: inner nodes under `instance:inner` ids, links across the boundary, promoted
//! widget values, nesting, mute and bypass, and clear errors for broken files.

mod common;

use common::*;
use sdflow_executor::stub::constant_values;
use sdflow_executor::{InputValue, Workflow};
use serde_json::{json, Value as Json};

const SCALE: &str = "11111111-1111-4111-8111-111111111111";
const SQUARE: &str = "22222222-2222-4222-8222-222222222222";

/// Subgraph "Scale then square": latent × factor (a promoted widget input), then the
/// nested "Square" subgraph; a muted output inside.
fn scale_def() -> Json {
    json!({
        "id": SCALE, "version": 1, "name": "Scale then square",
        "inputNode": {"id": -10}, "outputNode": {"id": -20},
        "inputs": [
            {"id": "i0", "name": "latent", "type": "LATENT", "linkIds": [10]},
            {"id": "i1", "name": "factor", "type": "FLOAT", "linkIds": [11]}
        ],
        "outputs": [{"id": "o0", "name": "LATENT", "type": "LATENT", "linkIds": [13]}],
        "widgets": [],
        "nodes": [
            {"id": 1, "type": "StubScale", "mode": 0,
             "inputs": [{"name": "latent", "type": "LATENT", "link": 10},
                        {"name": "factor", "type": "FLOAT", "widget": {"name": "factor"}, "link": 11}],
             "outputs": [{"name": "LATENT", "type": "LATENT", "links": [12, 14]}],
             "widgets_values": [0.25]},
            {"id": 2, "type": SQUARE, "mode": 0,
             "inputs": [{"name": "latent", "type": "LATENT", "link": 12}],
             "outputs": [{"name": "LATENT", "type": "LATENT", "links": [13]}]},
            {"id": 3, "type": "StubOutput", "mode": 2,
             "inputs": [{"name": "latent", "type": "LATENT", "link": 14}], "widgets_values": ["muted"]},
            {"id": 4, "type": "MarkdownNote", "mode": 0, "widgets_values": ["notes inside"]}
        ],
        "links": [
            {"id": 10, "origin_id": -10, "origin_slot": 0, "target_id": 1, "target_slot": 0, "type": "LATENT"},
            {"id": 11, "origin_id": -10, "origin_slot": 1, "target_id": 1, "target_slot": 1, "type": "FLOAT"},
            {"id": 12, "origin_id": 1, "origin_slot": 0, "target_id": 2, "target_slot": 0, "type": "LATENT"},
            {"id": 13, "origin_id": 2, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "LATENT"},
            {"id": 14, "origin_id": 1, "origin_slot": 0, "target_id": 3, "target_slot": 0, "type": "LATENT"}
        ]
    })
}

/// Subgraph "Square": StubCombo(square), then a bypassed StubScale.
fn square_def() -> Json {
    json!({
        "id": SQUARE, "version": 1, "name": "Square",
        "inputs": [{"id": "j0", "name": "latent", "type": "LATENT", "linkIds": [20]}],
        "outputs": [{"id": "p0", "name": "LATENT", "type": "LATENT", "linkIds": [22, 23]}],
        "nodes": [
            {"id": 5, "type": "StubCombo", "mode": 0,
             "inputs": [{"name": "latent", "type": "LATENT", "link": 20}],
             "outputs": [{"name": "LATENT", "type": "LATENT", "links": [21]}],
             "widgets_values": ["square"]},
            {"id": 6, "type": "StubScale", "mode": 4,
             "inputs": [{"name": "latent", "type": "LATENT", "link": 21}],
             "outputs": [{"name": "LATENT", "type": "LATENT", "links": [22]}],
             "widgets_values": [100.0]}
        ],
        "links": [
            {"id": 20, "origin_id": -10, "origin_slot": 0, "target_id": 5, "target_slot": 0, "type": "LATENT"},
            {"id": 21, "origin_id": 5, "origin_slot": 0, "target_id": 6, "target_slot": 0, "type": "LATENT"},
            {"id": 22, "origin_id": 6, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "LATENT"},
            {"id": 23, "origin_id": 6, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "LATENT"}
        ]
    })
}

fn instance(id: i64, latent_link: Option<i64>, out_links: &[i64], widgets_values: Json, mode: i64) -> Json {
    json!({
        "id": id, "type": SCALE, "mode": mode,
        "inputs": [{"name": "latent", "type": "LATENT", "link": latent_link}],
        "outputs": [{"name": "LATENT", "type": "LATENT", "links": out_links}],
        "widgets_values": widgets_values
    })
}

fn constant(id: i64, links: &[i64]) -> Json {
    json!({"id": id, "type": "StubConstant", "mode": 0,
           "outputs": [{"name": "LATENT", "type": "LATENT", "links": links}],
           "widgets_values": [42, "randomize", 4]})
}

fn output(id: i64, link: i64, label: &str) -> Json {
    json!({"id": id, "type": "StubOutput", "mode": 0,
           "inputs": [{"name": "latent", "type": "LATENT", "link": link}], "widgets_values": [label]})
}

/// Two instances of one subgraph: one with its own factor (0.5), one with the inner
/// widget's (0.25); definitions nested the old way for the inner one.
fn two_instances() -> Json {
    let mut outer = scale_def();
    outer["definitions"] = json!({"subgraphs": [square_def()]});
    json!({
        "version": 0.4,
        "nodes": [
            constant(1, &[1, 3]),
            instance(2, Some(1), &[2], json!([0.5]), 0),
            output(3, 2, "own"),
            instance(4, Some(3), &[4], json!([]), 0),
            output(5, 4, "inner"),
        ],
        "links": [[1, 1, 0, 2, 0, "LATENT"], [2, 2, 0, 3, 0, "LATENT"], [3, 1, 0, 4, 0, "LATENT"], [4, 4, 0, 5, 0, "LATENT"]],
        "definitions": {"subgraphs": [outer]},
        "extra": {}
    })
}

fn parse(doc: Json) -> Workflow {
    let (r, _) = registry();
    Workflow::from_json(doc, &r).unwrap()
}

fn expected_sum(factor: f32) -> f64 {
    constant_values(42, 4).iter().map(|v| f64::from((v * factor) * (v * factor))).sum()
}

#[test]
fn instances_expand_with_their_own_promoted_values() {
    let wf = parse(two_instances());
    let mut ids: Vec<&str> = wf.nodes.keys().map(String::as_str).collect();
    ids.sort();
    // Muted node, note, bypassed node and the instances themselves are not nodes.
    assert_eq!(ids, ["1", "2:1", "2:2:5", "3", "4:1", "4:2:5", "5"]);
    assert_eq!(wf.nodes["2:1"].inputs["latent"], InputValue::link("1", 0));
    assert_eq!(wf.nodes["2:1"].inputs["factor"], InputValue::Const(json!(0.5)));
    assert_eq!(wf.nodes["4:1"].inputs["factor"], InputValue::Const(json!(0.25)));
    assert_eq!(wf.nodes["2:2:5"].inputs["latent"], InputValue::link("2:1", 0));
    assert_eq!(wf.nodes["2:2:5"].inputs["op"], InputValue::Const(json!("square")));
    // Out of the nested subgraph through its bypassed scale.
    assert_eq!(wf.nodes["3"].inputs["latent"], InputValue::link("2:2:5", 0));
    assert_eq!(wf.nodes["5"].inputs["latent"], InputValue::link("4:2:5", 0));

    let (ex, _) = executor();
    let report = run_ok(&ex, &wf);
    assert!((ui_sum(&report, "3") - expected_sum(0.5)).abs() < 1e-3);
    assert!((ui_sum(&report, "5") - expected_sum(0.25)).abs() < 1e-3);
}

#[test]
fn an_outer_link_into_a_promoted_widget_wins_over_values() {
    let mut doc = two_instances();
    doc["nodes"].as_array_mut().unwrap().push(json!({"id": 7, "type": "PrimitiveNode", "mode": 0,
        "outputs": [{"name": "FLOAT", "type": "FLOAT", "links": [6]}], "widgets_values": [3.0, "fixed"]}));
    // Instance 2's factor comes from a primitive outside.
    doc["nodes"][1]["inputs"].as_array_mut().unwrap().push(json!({"name": "factor", "type": "FLOAT", "widget": {"name": "factor"}, "link": 6}));
    doc["links"].as_array_mut().unwrap().push(json!([6, 7, 0, 2, 1, "FLOAT"]));
    let wf = parse(doc);
    assert_eq!(wf.nodes["2:1"].inputs["factor"], InputValue::Const(json!(3.0)));
}

#[test]
fn proxy_widgets_set_values_by_entry() {
    let mut doc = two_instances();
    // Frontends 1.28-1.4x: entry i of proxyWidgets names the widget that value i is for.
    doc["nodes"][3]["properties"] = json!({"proxyWidgets": [["2", "$$canvas-image-preview"], ["1", "factor"]]});
    doc["nodes"][3]["widgets_values"] = json!([null, 0.75]);
    let wf = parse(doc);
    assert_eq!(wf.nodes["4:1"].inputs["factor"], InputValue::Const(json!(0.75)));
    // "-1" names the subgraph input itself.
    let mut doc = two_instances();
    doc["nodes"][3]["properties"] = json!({"proxyWidgets": [["-1", "factor"]]});
    doc["nodes"][3]["widgets_values"] = json!([1.5]);
    assert_eq!(parse(doc).nodes["4:1"].inputs["factor"], InputValue::Const(json!(1.5)));
}

#[test]
fn muted_and_bypassed_instances() {
    // Bypassed at the top: not expanded, its LATENT output passes its LATENT input on.
    let mut doc = two_instances();
    doc["nodes"][1]["mode"] = json!(4);
    let wf = parse(doc);
    assert!(!wf.nodes.keys().any(|k| k.starts_with("2:")));
    assert_eq!(wf.nodes["3"].inputs["latent"], InputValue::link("1", 0));

    // Muted at the top: its consumer goes without the input.
    let mut doc = two_instances();
    doc["nodes"][1]["mode"] = json!(2);
    let wf = parse(doc);
    assert!(!wf.nodes.keys().any(|k| k.starts_with("2:")));
    assert!(!wf.nodes["3"].inputs.contains_key("latent"));

    // Bypassed inside a subgraph: its inner nodes still run (the frontend expands nested
    // instances whatever their mode) but what comes out is what went in.
    let mut doc = two_instances();
    doc["definitions"]["subgraphs"][0]["nodes"][1]["mode"] = json!(4);
    let wf = parse(doc);
    assert!(wf.nodes.contains_key("2:2:5"));
    assert_eq!(wf.nodes["3"].inputs["latent"], InputValue::link("2:1", 0));
}

#[test]
fn an_unconnected_non_widget_input_leaves_the_inner_input_out() {
    let mut doc = two_instances();
    doc["nodes"][1]["inputs"][0]["link"] = Json::Null;
    let wf = parse(doc);
    assert!(!wf.nodes["2:1"].inputs.contains_key("latent"));
    let (ex, _) = executor();
    let report = ex.validate(&wf).unwrap_err();
    assert!(report.render().contains("2:1"), "{}", report.render());
}

#[test]
fn broken_subgraphs_are_named_in_errors() {
    let (r, _) = registry();
    // A subgraph that holds an instance of itself.
    let mut doc = two_instances();
    doc["definitions"]["subgraphs"][0]["definitions"]["subgraphs"][0]["nodes"][0]["type"] = json!(SCALE);
    let e = Workflow::from_json(doc, &r).unwrap_err().to_string();
    assert!(e.contains("contains itself") && e.contains("Scale then square"), "{e}");

    // A link from an input slot the subgraph does not have.
    let mut doc = two_instances();
    doc["definitions"]["subgraphs"][0]["links"][1]["origin_slot"] = json!(7);
    let e = Workflow::from_json(doc, &r).unwrap_err().to_string();
    assert!(e.contains("Scale then square") && e.contains("input slot 7"), "{e}");

    // A node inside without a type.
    let mut doc = two_instances();
    doc["definitions"]["subgraphs"][0]["nodes"][0].as_object_mut().unwrap().remove("type");
    let e = Workflow::from_json(doc, &r).unwrap_err().to_string();
    assert!(e.contains("Scale then square") && e.contains("node 1") && e.contains("missing type"), "{e}");

    // A wrong widget value inside: validation names the inner node by its full id.
    let mut doc = two_instances();
    doc["definitions"]["subgraphs"][0]["nodes"][0]["widgets_values"] = json!(["much"]);
    let wf = Workflow::from_json(doc, &r).unwrap();
    let (ex, _) = executor();
    let report = ex.validate(&wf).unwrap_err();
    assert!(report.render().contains("4:1"), "{}", report.render());

    // A legacy group node whose group the file does not define.
    let mut doc = two_instances();
    doc["nodes"][4]["type"] = json!("workflow>My group");
    let e = Workflow::from_json(doc, &r).unwrap_err().to_string();
    assert!(e.contains("node 5") && e.contains("does not define 'My group'"), "{e}");

    // Definitions of the wrong shape.
    let mut doc = two_instances();
    doc["definitions"] = json!({"subgraphs": {"not": "a list"}});
    assert!(Workflow::from_json(doc, &r).is_err());
}

#[test]
fn list_values_sent_wrapped_are_unwrapped() {
    let wf = Workflow::parse_api(r#"{"1": {"class_type": "A", "inputs": {"x": {"__value__": [1, 0]}}}}"#).unwrap();
    assert_eq!(wf.nodes["1"].inputs["x"], InputValue::Const(json!([1, 0])));
}
