//! Workflow formats (ours, ComfyUI API, ComfyUI UI) and the `/object_info` catalogue.

mod common;

use common::*;
use sdflow_executor::stub::constant_values;
use sdflow_executor::ui::workflow_to_ui;
use sdflow_executor::{Header, InputValue, NodeSpec, Workflow, WorkflowFormat};
use serde_json::json;

#[test]
fn our_format_round_trips() {
    let (r, _) = registry();
    let wf = Workflow::parse(&fixture("stub_workflow.json"), &r).unwrap();
    let header = wf.header.as_ref().unwrap();
    assert_eq!(header.format_version, 1);
    assert_eq!(header.title.as_deref(), Some("Stub pipeline"));
    assert_eq!(wf.nodes.len(), 9);
    assert_eq!(wf.nodes["1"].title.as_deref(), Some("Noise"));
    assert_eq!(wf.nodes["7"].inputs["b"], InputValue::link("6", 0));
    let text = wf.to_string_pretty();
    assert_eq!(
        WorkflowFormat::detect(&serde_json::from_str(&text).unwrap()),
        Some(WorkflowFormat::Sdflow)
    );
    assert_eq!(Workflow::parse(&text, &r).unwrap(), wf);
}

#[test]
fn api_format_round_trips_and_ignores_meta() {
    let text = fixture("comfy_default_api.json");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(WorkflowFormat::detect(&doc), Some(WorkflowFormat::Api));
    let wf = Workflow::parse_api(&text).unwrap();
    assert!(wf.header.is_none());
    // Writing it back gives the same document: links, constants and `_meta` titles.
    assert_eq!(wf.to_json(), doc);
    assert_eq!(
        wf.nodes["3"].inputs["seed"],
        InputValue::Const(json!(156680208700286u64))
    );
    // `_meta` never affects execution: equal but for titles gives the same cache keys.
    let (ex, _) = executor();
    let mut stub = chain();
    run_ok(&ex, &stub);
    for n in stub.nodes.values_mut() {
        n.title = Some("renamed".into());
    }
    assert!(run_ok(&ex, &stub).executed.is_empty());
}

#[test]
fn prompt_request_body_is_accepted() {
    let (r, _) = registry();
    let api: serde_json::Value = serde_json::from_str(&fixture("comfy_default_api.json")).unwrap();
    let body = json!({ "prompt": api, "client_id": "abc" });
    let wf = Workflow::from_json(body, &r).unwrap();
    assert_eq!(wf.nodes.len(), 7);
}

#[test]
fn numeric_link_ids_are_read() {
    let wf = Workflow::parse_api(
        r#"{"1": {"class_type": "A", "inputs": {"x": [2, 0], "y": [1, 2, 3], "z": "s"}}}"#,
    )
    .unwrap();
    assert_eq!(wf.nodes["1"].inputs["x"], InputValue::link("2", 0));
    assert_eq!(
        wf.nodes["1"].inputs["y"],
        InputValue::Const(json!([1, 2, 3]))
    );
}

fn expected_from_ui() -> Workflow {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(42))
            .with_const("size", json!(4)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubModelLoader").with_const("model_name", json!("tiny-a.safetensors")),
    );
    let mut apply = NodeSpec::new("StubApplyModel")
        .with_link("model", "2", 0)
        .with_link("latent", "1", 0);
    apply.title = Some("Apply the model".into());
    wf.add("3", apply);
    wf.add(
        "4",
        NodeSpec::new("StubScale")
            .with_link("latent", "3", 0)
            .with_const("factor", json!(0.25)),
    );
    wf.add(
        "5",
        NodeSpec::new("StubCombo")
            .with_link("latent", "4", 0)
            .with_const("op", json!("square")),
    );
    wf.add(
        "6",
        NodeSpec::new("StubOutput")
            .with_link("latent", "5", 0)
            .with_const("label", json!("result")),
    );
    wf
}

#[test]
fn ui_format_converts_through_the_catalogue() {
    let (r, _) = registry();
    let text = fixture("stub_ui_workflow.json");
    assert_eq!(
        WorkflowFormat::detect(&serde_json::from_str(&text).unwrap()),
        Some(WorkflowFormat::Ui)
    );
    // Seed control value skipped, reroute passed through, primitive folded in, bypassed
    // node bridged, muted node and note dropped.
    let wf = Workflow::parse(&text, &r).unwrap();
    assert_eq!(wf, expected_from_ui());

    let (ex, _) = executor();
    let report = run_ok(&ex, &wf);
    let expected: f64 = constant_values(42, 4)
        .iter()
        .map(|v| (((v + 10.0) * 0.25).powi(2)) as f64)
        .sum();
    assert!((ui_sum(&report, "6") - expected).abs() < 1e-3);
}

#[test]
fn ui_format_round_trips() {
    let (r, _) = registry();
    let mut wf = expected_from_ui();
    wf.header = Some(Header {
        title: Some("t".into()),
        ..Header::default()
    });
    // A widget fed by a link must keep its widgets_values slot.
    wf.add("7", NodeSpec::new("StubInt").with_const("value", json!(5)));
    wf.nodes
        .get_mut("1")
        .unwrap()
        .inputs
        .insert("seed".into(), InputValue::link("7", 0));
    let ui = workflow_to_ui(&wf, &r).unwrap();
    assert_eq!(WorkflowFormat::detect(&ui), Some(WorkflowFormat::Ui));
    let node1 = ui["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == 1)
        .unwrap();
    assert_eq!(node1["widgets_values"], json!([0, "fixed", 4]));
    assert_eq!(node1["inputs"][0]["widget"]["name"], "seed");
    let back = Workflow::from_json(ui, &r).unwrap();
    assert_eq!(back, wf);
}

#[test]
fn ui_links_as_objects_and_widgets_as_map() {
    let (r, _) = registry();
    let doc = json!({
        "nodes": [
            {"id": 1, "type": "StubConstant", "mode": 0, "widgets_values": {"seed": 8, "size": 2},
             "outputs": [{"name": "LATENT", "type": "LATENT", "links": [1]}]},
            {"id": 2, "type": "StubOutput", "mode": 0, "widgets_values": ["x"],
             "inputs": [{"name": "latent", "type": "LATENT", "link": 1}]}
        ],
        "links": [{"id": 1, "origin_id": 1, "origin_slot": 0, "target_id": 2, "target_slot": 0, "type": "LATENT"}],
        "version": 1
    });
    let wf = Workflow::from_json(doc, &r).unwrap();
    assert_eq!(wf.nodes["1"].inputs["seed"], InputValue::Const(json!(8)));
    assert_eq!(wf.nodes["2"].inputs["latent"], InputValue::link("1", 0));
}

#[test]
fn object_info_shape() {
    let (r, _) = registry();
    let info = r.object_info();
    let c = &info["StubConstant"];
    assert_eq!(c["name"], "StubConstant");
    assert_eq!(c["display_name"], "Stub Constant");
    assert_eq!(c["category"], "testing/stub");
    assert_eq!(c["output_node"], false);
    assert_eq!(c["output"], json!(["LATENT"]));
    assert_eq!(c["output_name"], json!(["LATENT"]));
    assert_eq!(c["output_is_list"], json!([false]));
    assert_eq!(c["input_order"]["required"], json!(["seed", "size"]));
    assert_eq!(
        c["input"]["required"]["seed"],
        json!(["INT", {"default": 0, "min": 0, "max": 18446744073709551615u64, "step": 1, "control_after_generate": true}])
    );
    let s = &info["StubScale"]["input"]["required"];
    assert_eq!(s["latent"], json!(["LATENT"]));
    assert_eq!(
        s["factor"],
        json!(["FLOAT", {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01}])
    );
    assert_eq!(
        info["StubCombo"]["input"]["required"]["op"],
        json!([["identity", "negate", "square", "abs"], {"default": "identity"}])
    );
    assert_eq!(
        info["StubFail"]["input"]["required"]["message"],
        json!(["STRING", {"default": "stub failure", "multiline": false}])
    );
    assert_eq!(
        info["StubFail"]["input"]["required"]["fail"],
        json!(["BOOLEAN", {"default": true}])
    );
    let out = &info["StubOutput"];
    assert_eq!(out["output_node"], true);
    assert_eq!(out["output"], json!([]));
    assert!(out["input"].get("optional").is_none());
    assert_eq!(info.as_object().unwrap().len(), r.len());
}

/// ComfyUI's own schemas for the default graph's classes (from its `nodes.py`), so the UI
/// conversion can be checked against the API export ComfyUI itself makes of that graph.
fn comfy_default_schemas() -> sdflow_executor::Registry {
    use sdflow_executor::{
        ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs,
    };
    struct SchemaOnly(NodeSchema);
    impl Node for SchemaOnly {
        fn schema(&self) -> NodeSchema {
            self.0.clone()
        }
        fn execute(&self, _: &mut ExecContext<'_>, _: &Inputs) -> Result<Outputs, NodeError> {
            Err(NodeError::msg("only the schema is declared in this test"))
        }
    }
    let schemas = [
        NodeSchema::new("KSampler")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::seed("seed"))
            .input(InputSpec::int("steps", 20).int_range(1, 10000))
            .input(
                InputSpec::float("cfg", 8.0)
                    .float_range(0.0, 100.0)
                    .float_step(0.1),
            )
            .input(InputSpec::combo(
                "sampler_name",
                ["euler", "euler_ancestral", "dpmpp_2m"],
            ))
            .input(InputSpec::combo(
                "scheduler",
                ["simple", "normal", "karras"],
            ))
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("latent_image", IoType::LATENT))
            .input(
                InputSpec::float("denoise", 1.0)
                    .float_range(0.0, 1.0)
                    .float_step(0.01),
            )
            .output("LATENT", IoType::LATENT),
        NodeSchema::new("CheckpointLoaderSimple")
            .input(InputSpec::combo(
                "ckpt_name",
                ["v1-5-pruned-emaonly.safetensors"],
            ))
            .output("MODEL", IoType::MODEL)
            .output("CLIP", IoType::CLIP)
            .output("VAE", IoType::VAE),
        NodeSchema::new("EmptyLatentImage")
            .input(
                InputSpec::int("width", 512)
                    .int_range(16, 16384)
                    .int_step(8),
            )
            .input(
                InputSpec::int("height", 512)
                    .int_range(16, 16384)
                    .int_step(8),
            )
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .output("LATENT", IoType::LATENT),
        NodeSchema::new("CLIPTextEncode")
            .input(InputSpec::string("text", "").multiline())
            .input(InputSpec::link("clip", IoType::CLIP))
            .output("CONDITIONING", IoType::CONDITIONING),
        NodeSchema::new("VAEDecode")
            .input(InputSpec::link("samples", IoType::LATENT))
            .input(InputSpec::link("vae", IoType::VAE))
            .output("IMAGE", IoType::IMAGE),
        NodeSchema::new("SaveImage")
            .input(InputSpec::link("images", IoType::IMAGE))
            .input(InputSpec::string("filename_prefix", "ComfyUI"))
            .output_node(),
    ];
    let mut r = sdflow_executor::Registry::new();
    for s in schemas {
        r.register(std::sync::Arc::new(SchemaOnly(s)));
    }
    r
}

#[test]
fn comfy_default_ui_converts_to_comfys_own_api_export() {
    let r = comfy_default_schemas();
    let from_ui = Workflow::parse(&fixture("comfy_default_ui.json"), &r).unwrap();
    let mut api = Workflow::parse(&fixture("comfy_default_api.json"), &r).unwrap();
    // The UI file carries no titles; everything else must match exactly.
    for n in api.nodes.values_mut() {
        n.title = None;
    }
    assert_eq!(from_ui, api);
    let plan = sdflow_executor::validate(&from_ui, &r).unwrap();
    assert_eq!(plan.len(), 7);
    // And back to the UI format: same graph, same widget values.
    let ui = workflow_to_ui(&from_ui, &r).unwrap();
    let ks = ui["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == 3)
        .unwrap();
    assert_eq!(
        ks["widgets_values"],
        json!([156680208700286u64, "fixed", 20, 8, "euler", "normal", 1])
    );
    assert_eq!(Workflow::from_json(ui, &r).unwrap(), from_ui);
}
