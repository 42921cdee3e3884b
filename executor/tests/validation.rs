//! Every validation error, collected into one ComfyUI-shaped report.

mod common;

use common::*;
use sdflow_executor::{validate, ErrorKind, NodeSpec, RunError, Workflow, WorkflowError};
use serde_json::json;

fn errors_of(wf: &Workflow) -> sdflow_executor::ValidationReport {
    let (r, _) = registry();
    match validate(wf, &r) {
        Ok(_) => panic!("workflow should not validate"),
        Err(report) => *report,
    }
}

fn output_of(wf: &mut Workflow, id: &str, src: &str) {
    wf.add(
        id,
        NodeSpec::new("StubOutput")
            .with_link("latent", src, 0)
            .with_const("label", json!("o")),
    );
}

#[test]
fn valid_workflow_passes() {
    let (r, _) = registry();
    let plan = validate(&chain(), &r).unwrap();
    let order: Vec<&str> = plan.node_ids().collect();
    let pos = |id: &str| order.iter().position(|x| *x == id).unwrap();
    assert!(
        pos("1") < pos("2") && pos("2") < pos("3") && pos("3") < pos("4") && pos("5") < pos("6")
    );
}

#[test]
fn unknown_class() {
    let mut wf = chain();
    wf.add("9", NodeSpec::new("NoSuchNode"));
    let report = errors_of(&wf);
    assert!(report.has("9", ErrorKind::MissingNodeType));
    assert_eq!(report.error.kind, ErrorKind::MissingNodeType);
    assert_eq!(report.node_errors["9"].class_type, "NoSuchNode");
}

#[test]
fn missing_required_input() {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant").with_const("seed", json!(1)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubScale").with_const("factor", json!(1.0)),
    );
    output_of(&mut wf, "3", "2");
    wf.nodes.get_mut("2").unwrap().inputs.clear();
    let report = errors_of(&wf);
    let errs = &report.node_errors["2"].errors;
    let missing: Vec<&str> = errs
        .iter()
        .filter(|e| e.kind == ErrorKind::RequiredInputMissing)
        .filter_map(|e| e.input_name())
        .collect();
    assert_eq!(sorted(missing), vec!["factor", "latent"]);
    assert_eq!(report.error.kind, ErrorKind::PromptOutputsFailedValidation);
    assert_eq!(report.node_errors["2"].dependent_outputs, vec!["3"]);
    // Node 1 is not linked to any output, so it is not checked (as in ComfyUI).
    assert!(!report.node_errors.contains_key("1"));
}

#[test]
fn links_to_missing_node_and_output() {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(2)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubAdd")
            .with_link("a", "99", 0)
            .with_link("b", "1", 3),
    );
    output_of(&mut wf, "3", "2");
    let report = errors_of(&wf);
    let errs = &report.node_errors["2"].errors;
    assert_eq!(errs.len(), 2);
    assert!(errs.iter().all(|e| e.kind == ErrorKind::BadLinkedInput));
    assert!(errs.iter().any(|e| e.details.contains("'99'")));
    assert!(errs.iter().any(|e| e.details.contains("index 3")));
}

#[test]
fn malformed_link_and_constant_for_socket() {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(2)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubAdd")
            .with_const("a", json!(["1"]))
            .with_const("b", json!(5)),
    );
    output_of(&mut wf, "3", "2");
    let report = errors_of(&wf);
    let errs = &report.node_errors["2"].errors;
    assert_eq!(errs.len(), 2);
    assert!(errs.iter().all(|e| e.kind == ErrorKind::BadLinkedInput));
}

#[test]
fn type_mismatch() {
    let mut wf = Workflow::new();
    wf.add(
        "m",
        NodeSpec::new("StubModelLoader").with_const("model_name", json!("tiny-a.safetensors")),
    );
    wf.add(
        "s",
        NodeSpec::new("StubScale")
            .with_link("latent", "m", 0)
            .with_const("factor", json!(1)),
    );
    output_of(&mut wf, "o", "s");
    let report = errors_of(&wf);
    let e = &report.node_errors["s"].errors[0];
    assert_eq!(e.kind, ErrorKind::ReturnTypeMismatch);
    assert_eq!(
        e.details,
        "latent, received_type(MODEL) mismatch input_type(LATENT)"
    );
    assert_eq!(e.extra_info["input_name"], "latent");
}

#[test]
fn values_out_of_range_and_wrong_type() {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(-1))
            .with_const("size", json!(1 << 21)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubScale")
            .with_link("latent", "1", 0)
            .with_const("factor", json!(100.5)),
    );
    wf.add(
        "3",
        NodeSpec::new("StubSlow")
            .with_link("latent", "2", 0)
            .with_const("steps", json!("many"))
            .with_const("step_ms", json!(1.5)),
    );
    wf.add(
        "4",
        NodeSpec::new("StubFail")
            .with_link("latent", "3", 0)
            .with_const("fail", json!(3))
            .with_const("message", json!({"a": 1})),
    );
    output_of(&mut wf, "5", "4");
    let report = errors_of(&wf);
    let kinds = |id: &str| -> Vec<(ErrorKind, String)> {
        report.node_errors[id]
            .errors
            .iter()
            .map(|e| (e.kind, e.input_name().unwrap().to_string()))
            .collect()
    };
    let mut k1 = kinds("1");
    k1.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        k1,
        vec![
            (ErrorKind::ValueSmallerThanMin, "seed".into()),
            (ErrorKind::ValueBiggerThanMax, "size".into())
        ]
    );
    assert_eq!(
        kinds("2"),
        vec![(ErrorKind::ValueBiggerThanMax, "factor".into())]
    );
    assert_eq!(
        report.node_errors["2"].errors[0].message,
        "Value 100.5 bigger than max of 100"
    );
    let mut k3 = kinds("3");
    k3.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        k3,
        vec![
            (ErrorKind::InvalidInputType, "step_ms".into()),
            (ErrorKind::InvalidInputType, "steps".into())
        ]
    );
    assert_eq!(kinds("4").len(), 2);
    // Every error of every node is in the one report.
    assert_eq!(report.errors().count(), 7);
}

#[test]
fn unknown_combo_option_has_no_fallback() {
    let mut wf = chain();
    wf.nodes.get_mut("3").unwrap().inputs.insert(
        "op".into(),
        sdflow_executor::InputValue::Const(json!("cube")),
    );
    let report = errors_of(&wf);
    let e = &report.node_errors["3"].errors[0];
    assert_eq!(e.kind, ErrorKind::ValueNotInList);
    assert_eq!(e.message, "Value not in list");
    assert_eq!(
        e.details,
        "op: 'cube' not in [\"identity\", \"negate\", \"square\", \"abs\"]"
    );
    assert_eq!(e.extra_info["received_value"], "cube");
}

#[test]
fn static_cycles() {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubAdd")
            .with_link("a", "2", 0)
            .with_link("b", "3", 0),
    );
    wf.add(
        "2",
        NodeSpec::new("StubScale")
            .with_link("latent", "1", 0)
            .with_const("factor", json!(1)),
    );
    wf.add(
        "3",
        NodeSpec::new("StubCombo")
            .with_link("latent", "3", 0)
            .with_const("op", json!("abs")),
    );
    output_of(&mut wf, "4", "1");
    let report = errors_of(&wf);
    for id in ["1", "2", "3"] {
        assert!(
            report.has(id, ErrorKind::DependencyCycle),
            "node {id} should be reported in a cycle"
        );
    }
    assert!(!report.node_errors.contains_key("4"));
    assert!(report.node_errors["1"].errors[0].details.contains("1, 2"));
}

#[test]
fn no_outputs() {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(2)),
    );
    let report = errors_of(&wf);
    assert_eq!(report.error.kind, ErrorKind::PromptNoOutputs);
    assert!(report.node_errors.is_empty());
}

#[test]
fn report_json_shape_matches_comfyui() {
    let mut wf = chain();
    wf.nodes.get_mut("2").unwrap().inputs.remove("factor");
    let report = errors_of(&wf).to_json();
    assert_eq!(report["error"]["type"], "prompt_outputs_failed_validation");
    assert_eq!(
        report["error"]["message"],
        "Prompt outputs failed validation"
    );
    let node = &report["node_errors"]["2"];
    assert_eq!(node["class_type"], "StubScale");
    assert_eq!(node["dependent_outputs"], json!(["4"]));
    let e = &node["errors"][0];
    assert_eq!(e["type"], "required_input_missing");
    assert_eq!(e["message"], "Required input is missing");
    assert_eq!(e["details"], "factor");
    assert_eq!(e["extra_info"]["input_name"], "factor");
    assert!(e["extra_info"]["input_config"].is_array());
}

#[test]
fn invalid_workflow_is_rejected_before_anything_runs() {
    let (ex, stats) = executor();
    let mut wf = chain();
    wf.nodes.get_mut("6").unwrap().inputs.remove("label");
    match run(&ex, &wf) {
        Err(RunError::Invalid(report)) => assert!(report.has("6", ErrorKind::RequiredInputMissing)),
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert_eq!(
        stats.total(),
        0,
        "no node may run when any output is invalid"
    );
}

#[test]
fn malformed_json_reports_line_and_column() {
    let text = "{\n  \"1\": {\"class_type\": \"StubConstant\",\n    \"inputs\": {\"seed\": 1,, \"size\": 2}}\n}";
    match Workflow::parse_api(text) {
        Err(WorkflowError::Json {
            line,
            column,
            message,
        }) => {
            assert_eq!((line, column), (3, 26), "the second comma");
            assert_eq!(message, "key must be a string");
        }
        other => panic!("expected a JSON error, got {other:?}"),
    }
    let (r, _) = registry();
    let err = Workflow::parse("[1, 2", &r).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("malformed JSON at line 1, column 5"),
        "{err}"
    );
}

#[test]
fn structural_errors_name_the_node() {
    let (r, _) = registry();
    let err = Workflow::parse(r#"{"7": {"inputs": {}}}"#, &r).unwrap_err();
    assert_eq!(err.to_string(), "node '7': missing class_type");
    let err = Workflow::parse(r#"{"7": {"class_type": "StubInt", "inputs": 3}}"#, &r).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("node '7': inputs must be an object"),
        "{err}"
    );
    let err = Workflow::parse(
        r#"{"format": "sdflow", "format_version": 99, "nodes": {}}"#,
        &r,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        WorkflowError::UnsupportedVersion { found: 99 }
    ));
    let err = Workflow::parse(r#"{"nodes": [{"id": 1}], "links": []}"#, &r).unwrap_err();
    assert_eq!(err.to_string(), "node 1: missing type");
}

#[test]
fn real_comfyui_workflows_give_unknown_class_errors() {
    let (r, _) = registry();
    for name in ["comfy_default_api.json", "comfy_default_ui.json"] {
        let wf = Workflow::parse(&fixture(name), &r).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(wf.nodes.len(), 7, "{name}");
        assert_eq!(
            wf.nodes["3"].inputs["model"],
            sdflow_executor::InputValue::link("4", 0)
        );
        let report = validate(&wf, &r).unwrap_err();
        assert_eq!(report.error.kind, ErrorKind::MissingNodeType);
        assert_eq!(report.node_errors.len(), 7, "{name}");
        assert!(report
            .errors()
            .all(|(_, e)| e.kind == ErrorKind::MissingNodeType));
        assert!(report.error.message.contains("CheckpointLoaderSimple"));
        assert!(report
            .render()
            .contains("node 9 (SaveImage): [missing_node_type]"));
    }
}
