//! ComfyUI's core utility nodes against ComfyUI's own code: the fixture
//! (`fixtures/core_nodes/core_nodes.json`, written by `fixtures/core_nodes/gen.py`) holds
//! the outputs of ComfyUI's node classes, loaded from its source and run on the same
//! inputs, and their `/object_info` entries built from ComfyUI's schema definitions.

use sdflow_core::models::conditioning::Prediction;
use sdflow_core::sampling::schedule::DiscreteSchedule;
use sdflow_executor::{CancelToken, Executor, ExecutorConfig, InputData, IoType, NodeError, NullSink, Outputs, RunOptions, Value, Workflow};
use sdflow_nodes::sampling::Sigmas;
use sdflow_nodes::values::{Image, Mask, ModelRef};
use serde_json::{json, Value as Json};
use std::sync::Arc;

mod common;
use common::{c, env, floats, image, mask, out};

common::fixture!("fixtures/core_nodes/core_nodes.json");

fn link(v: Value) -> InputData {
    InputData::Value(v)
}

fn image_value(img: Image) -> InputData {
    link(Value::new(IoType::IMAGE, img))
}

fn first<T: Clone + 'static>(o: &Outputs) -> T {
    out(o, 0)
}

fn invalid_input(r: Result<Outputs, NodeError>) -> (String, String) {
    match r {
        Err(NodeError::InvalidInput { input, message }) => (input, message),
        Err(e) => panic!("expected an invalid-input error, got {e}"),
        Ok(_) => panic!("expected an invalid-input error, got outputs"),
    }
}

/// Each node's `/object_info` entry against ComfyUI's (`common::assert_object_info_matches`).
#[test]
fn object_info_matches_comfyui_definitions() {
    let schemas = fixture()["schemas"].as_object().unwrap();
    assert!(schemas.len() >= 27);
    common::assert_object_info_matches(&env(1).registry, schemas);
}

/// ComfySwitchNode is newer than the ComfyUI sources the fixture reads; its definition in
/// comfy_extras/nodes_logic.py: `io.Boolean.Input("switch")`, then `on_false` and
/// `on_true` as optional, lazy MatchType inputs, one MatchType output named "output",
/// display name "Switch", category "logic".
#[test]
fn switch_schema_follows_comfyui() {
    let info = env(1).registry.schema("ComfySwitchNode").unwrap().object_info();
    assert_eq!(info["display_name"], "Switch");
    assert_eq!(info["category"], "logic");
    assert_eq!(info["input_order"], json!({"required": ["switch"], "optional": ["on_false", "on_true"]}));
    assert_eq!(info["input"]["required"]["switch"][0], "BOOLEAN");
    assert_eq!(info["input"]["optional"]["on_true"], json!(["*"]));
    assert_eq!((info["output"].clone(), info["output_name"].clone()), (json!(["*"]), json!(["output"])));
}

#[test]
fn string_nodes_match_comfyui() {
    let env = env(1);
    let cases = fixture()["strings"].as_array().unwrap();
    assert!(cases.len() > 300);
    let mut errors = 0;
    for case in cases {
        let node = case["node"].as_str().unwrap();
        let inputs = case["inputs"].as_object().unwrap().iter().map(|(k, v)| (k.as_str(), c(v.clone()))).collect();
        let got = env.run(node, inputs);
        let what = format!("{node} {}", case["inputs"]);
        if case.get("error").is_some() {
            assert!(got.is_err(), "{what}: ComfyUI fails ({}), ours gave a result", case["error"]);
            errors += 1;
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = &case["out"];
        match want {
            Json::String(s) => assert_eq!(&first::<String>(&got), s, "{what}"),
            // RegexExtract's "First Group" of a group that took no part: Python's None.
            Json::Null => assert_eq!(first::<String>(&got), "", "{what}"),
            Json::Bool(b) => assert_eq!(first::<bool>(&got), *b, "{what}"),
            Json::Number(n) => assert_eq!(first::<i64>(&got), n.as_i64().unwrap(), "{what}"),
            other => panic!("{what}: unexpected {other}"),
        }
    }
    assert!(errors > 0, "the fixture's failing cases (All Groups over a group that took no part) are checked");
}

#[test]
fn primitives_pass_their_value_on() {
    let env = env(1);
    for case in fixture()["primitives"].as_array().unwrap() {
        let node = case["node"].as_str().unwrap();
        let out = env.run(node, vec![("value", c(case["value"].clone()))]).unwrap();
        let v = &out.values[0];
        let got = match v.io_type().as_str() {
            "STRING" => json!(first::<String>(&out)),
            "INT" => json!(first::<i64>(&out)),
            "FLOAT" => json!(first::<f64>(&out)),
            "BOOLEAN" => json!(first::<bool>(&out)),
            t => panic!("{node}: output type {t}"),
        };
        assert_eq!(got, case["out"], "{node}");
    }
    // A linked value (a widget turned into an input) passes on the same way.
    let out = env.run("PrimitiveInt", vec![("value", link(Value::int(-3)))]).unwrap();
    assert_eq!(first::<i64>(&out), -3);
}

#[test]
fn preview_any_writes_what_comfyui_writes() {
    let env = env(1);
    for case in fixture()["preview_any"].as_array().unwrap() {
        let v = &case["value"];
        let value = match v {
            Json::String(s) => Value::string(s.clone()),
            Json::Bool(b) => Value::boolean(*b),
            Json::Number(n) if n.is_i64() => Value::int(n.as_i64().unwrap()),
            Json::Number(n) => Value::float(n.as_f64().unwrap()),
            other => panic!("unexpected {other}"),
        };
        let out = env.run("PreviewAny", vec![("source", link(value))]).unwrap();
        assert_eq!(out.ui, Some(json!({"text": [case["text"].clone()]})), "{v}");
    }
    let img = Image { data: vec![0.0; 2 * 3 * 4 * 3], n: 2, height: 3, width: 4, channels: 3 };
    let out = env.run("PreviewAny", vec![("source", image_value(img))]).unwrap();
    assert_eq!(out.ui.unwrap()["text"][0], "IMAGE [2, 3, 4, 3]");
}

/// ImageStitch, ImageFromBatch, GetImageSize, ImageScaleToMaxDimension,
/// ImageScaleToTotalPixels, ResizeAndPadImage and JoinImageWithAlpha, all within 1e-5 —
/// Lanczos included, which ComfyUI runs through 8-bit PIL images (RGB, RGBA and LA).
#[test]
fn image_nodes_match_comfyui() {
    let env = env(1);
    let f = fixture();
    let cases = f["image_cases"].as_array().unwrap();
    assert!(cases.len() > 50);
    for case in cases {
        let node = case["node"].as_str().unwrap();
        let ins = &case["inputs"];
        let what = format!("{node} {ins}");
        let mut inputs = Vec::new();
        for (k, v) in ins.as_object().unwrap() {
            let data = match k.as_str() {
                "image" | "image1" | "image2" => image_value(image(&f["images"][v.as_str().unwrap()])),
                "alpha" => link(Value::new(IoType::MASK, mask(&f["masks"][v.as_str().unwrap()]))),
                _ => c(v.clone()),
            };
            inputs.push((k.as_str(), data));
        }
        let out = env.run(node, inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
        if node == "GetImageSize" {
            let got: Vec<i64> = out.values.iter().map(|v| *v.downcast_ref::<i64>().unwrap()).collect();
            assert_eq!(json!(got), case["out"], "{what}");
            continue;
        }
        let got = first::<Image>(&out);
        let want = image(&case["out"]);
        assert_eq!((got.n, got.height, got.width, got.channels), (want.n, want.height, want.width, want.channels), "{what}: shape");
        let worst = got.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-5, "{what}: worst difference {worst}");
    }
}

/// A MODEL for schedule nodes: a residency handle that is never loaded.
fn model(env: &common::Env, prediction: Prediction, schedule: DiscreteSchedule) -> ModelRef {
    env.model(sdflow_core::detect::ModelFamily::Sd1, prediction, schedule, None, 0.18215, 0.0)
}

#[test]
fn sd_turbo_scheduler_matches_comfyui() {
    let env = env(1);
    let plain = model(&env, Prediction::Epsilon, DiscreteSchedule::sd());
    let zsnr = model(&env, Prediction::V, DiscreteSchedule::sd().zero_terminal_snr());
    let cases = fixture()["turbo"].as_array().unwrap();
    assert_eq!(cases.len(), 56);
    for case in cases {
        let m = if case["zsnr"] == true { &zsnr } else { &plain };
        let out = env.run("SDTurboScheduler", vec![("model", link(Value::new(IoType::MODEL, m.clone()))), ("steps", c(case["steps"].clone())), ("denoise", c(case["denoise"].clone()))]).unwrap();
        let got = first::<Sigmas>(&out).0;
        let want = floats(&case["sigmas"]);
        assert_eq!(got.len(), want.len(), "{case}");
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{case}: {got:?}");
        }
    }
    let mut flow = plain.clone();
    flow.prediction = Prediction::Flow;
    let (input, message) = invalid_input(env.run("SDTurboScheduler", vec![("model", link(Value::new(IoType::MODEL, flow))), ("steps", c(json!(1))), ("denoise", c(json!(1.0)))]));
    assert_eq!(input, "model", "{message}");
}

#[test]
fn set_first_sigma_matches_comfyui() {
    let env = env(1);
    for case in fixture()["set_first_sigma"].as_array().unwrap() {
        let sigmas = Sigmas(floats(&case["sigmas"]));
        let out = env.run("SetFirstSigma", vec![("sigmas", link(Value::new(IoType::SIGMAS, sigmas))), ("sigma", c(case["sigma"].clone()))]).unwrap();
        assert_eq!(first::<Sigmas>(&out).0, floats(&case["out"]));
    }
    let (input, _) = invalid_input(env.run("SetFirstSigma", vec![("sigmas", link(Value::new(IoType::SIGMAS, Sigmas(vec![])))), ("sigma", c(json!(1.0)))]));
    assert_eq!(input, "sigmas");
}

#[test]
fn mask_preview_writes_grey_pngs_to_temp() {
    let env = env(1);
    let m = Mask { data: vec![0.0, 0.25, 0.5, 1.0, 0.75, 0.1], n: 2, height: 1, width: 3 };
    let out = env.run("MaskPreview", vec![("mask", link(Value::new(IoType::MASK, m.clone())))]).unwrap();
    assert!(out.values.is_empty());
    let files = out.ui.unwrap()["images"].as_array().unwrap().clone();
    assert_eq!(files.len(), 2);
    for (i, f) in files.iter().enumerate() {
        assert_eq!((f["type"].as_str(), f["subfolder"].as_str()), (Some("temp"), Some("")));
        let path = env.dir.path().join("out/temp").join(f["filename"].as_str().unwrap());
        let png = image::open(&path).unwrap().to_rgb8();
        assert_eq!(png.dimensions(), (3, 1));
        for (x, p) in png.pixels().enumerate() {
            let v = (m.data[i * 3 + x] * 255.0).round() as u8;
            assert_eq!(p.0, [v, v, v], "{path:?} pixel {x}");
        }
    }
    // A second preview takes the next counters instead of overwriting the first.
    let again = env.run("MaskPreview", vec![("mask", link(Value::new(IoType::MASK, m)))]).unwrap();
    assert_ne!(again.ui.unwrap()["images"][0]["filename"], files[0]["filename"]);
}

/// Switch and Preview Any in a run: `*` sockets take and give any type, an unlinked
/// branch is simply absent, and the chosen value flows on with its own type.
#[test]
fn switch_and_preview_in_a_workflow() {
    let env = env(1);
    let registry = Arc::new(env.registry);
    let wf = |switch: bool, with_false: bool| {
        let mut w = json!({
            "1": {"class_type": "PrimitiveString", "inputs": {"value": "abc"}},
            "2": {"class_type": "StringConcatenate", "inputs": {"string_a": ["1", 0], "string_b": "def", "delimiter": "-"}},
            "3": {"class_type": "PrimitiveBoolean", "inputs": {"value": switch}},
            "4": {"class_type": "ComfySwitchNode", "inputs": {"switch": ["3", 0], "on_true": ["1", 0], "on_false": ["2", 0]}},
            "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
            "6": {"class_type": "StringLength", "inputs": {"string": ["4", 0]}},
            "7": {"class_type": "PreviewAny", "inputs": {"source": ["6", 0]}}
        });
        if !with_false {
            w["4"]["inputs"].as_object_mut().unwrap().remove("on_false");
        }
        Workflow::parse(&w.to_string(), &registry).unwrap()
    };
    let executor = Executor::new(registry.clone(), ExecutorConfig::default());
    let run = |w: &Workflow| executor.run(w, &NullSink, &CancelToken::new(), &RunOptions::default()).unwrap().ui_outputs;
    let ui = run(&wf(false, true));
    assert_eq!((ui["5"].clone(), ui["7"].clone()), (json!({"text": ["abc-def"]}), json!({"text": ["7"]})));
    let ui = run(&wf(true, true));
    assert_eq!((ui["5"].clone(), ui["7"].clone()), (json!({"text": ["abc"]}), json!({"text": ["3"]})));
    let ui = run(&wf(false, false));
    assert_eq!(ui["5"], json!({"text": ["abc"]}), "the only linked branch, whatever the switch");
}

#[test]
fn bad_inputs_are_named_errors() {
    let env = env(1);
    let img = |n, h, w, ch| Image { data: vec![0.5; n * h * w * ch], n, height: h, width: w, channels: ch };
    let empty = img(0, 4, 4, 3);

    let (input, _) = invalid_input(env.run("ImageFromBatch", vec![("image", image_value(empty.clone())), ("batch_index", c(json!(0))), ("length", c(json!(1)))]));
    assert_eq!(input, "image");
    let (input, msg) = invalid_input(env.run("ImageScaleToTotalPixels", vec![("image", image_value(img(1, 1, 64, 3))), ("upscale_method", c(json!("bilinear"))), ("megapixels", c(json!(16.0)))]));
    assert_eq!(input, "megapixels", "{msg}");
    assert!(msg.contains("beyond the limits"), "{msg}");
    let (input, _) = invalid_input(env.run("ImageScaleToTotalPixels", vec![("image", image_value(img(1, 8, 8, 3))), ("upscale_method", c(json!("bislerp"))), ("megapixels", c(json!(1.0)))]));
    assert_eq!(input, "upscale_method");
    let (input, _) = invalid_input(env.run("ImageScaleToMaxDimension", vec![("image", image_value(img(1, 4, 8, 3))), ("upscale_method", c(json!("area"))), ("largest_size", c(json!(0)))]));
    assert_eq!(input, "largest_size");
    let (input, _) = invalid_input(env.run("ImageScaleToMaxDimension", vec![("image", image_value(img(1, 4, 8, 3))), ("upscale_method", c(json!("area"))), ("largest_size", c(json!(i64::MAX)))]));
    assert_eq!(input, "largest_size");
    let pad = |tw: i64| env.run("ResizeAndPadImage", vec![("image", image_value(img(1, 4, 8, 3))), ("target_width", c(json!(tw))), ("target_height", c(json!(8))), ("padding_color", c(json!("white"))), ("interpolation", c(json!("area")))]);
    assert!(invalid_input(pad(1 << 40)).1.contains("beyond the limits"));
    assert_eq!(invalid_input(pad(-1)).0, "target_width");
    let stitch = |dir: &str, spacing: i64| {
        env.run(
            "ImageStitch",
            vec![("image1", image_value(img(1, 4, 4, 3))), ("image2", image_value(img(2, 4, 4, 3))), ("direction", c(json!(dir))), ("match_image_size", c(json!(false))), ("spacing_width", c(json!(spacing))), ("spacing_color", c(json!("white")))],
        )
    };
    assert_eq!(first::<Image>(&stitch("right", 3).unwrap()).width, 12, "4 + 4 (spacing 3 made even) + 4");
    let (input, msg) = invalid_input(stitch("sideways", 0));
    assert_eq!(input, "direction");
    assert!(msg.contains("sideways"), "{msg}");
    let (input, msg) = invalid_input(stitch("right", 1 << 40));
    assert_eq!(input, "spacing_width");
    assert!(msg.contains("beyond the limits"), "{msg}");
    let from_batch = |length: i64| env.run("ImageFromBatch", vec![("image", image_value(img(3, 2, 2, 3))), ("batch_index", c(json!(7))), ("length", c(json!(length)))]);
    assert_eq!(first::<Image>(&from_batch(5).unwrap()).n, 1, "the index clamps to the last sample");
    assert_eq!(invalid_input(from_batch(0)).0, "length");
    let alpha = Mask { data: vec![], n: 0, height: 2, width: 2 };
    assert_eq!(invalid_input(env.run("JoinImageWithAlpha", vec![("image", image_value(img(1, 2, 2, 3))), ("alpha", link(Value::new(IoType::MASK, alpha)))])).0, "alpha");
    match env.run("GetImageSize", vec![("image", link(Value::int(3)))]) {
        Err(NodeError::InputType { input, .. }) => assert_eq!(input, "image"),
        other => panic!("a number into an IMAGE input: {other:?}"),
    }

    let regex = |node: &str, pattern: &str, string: &str| {
        let mut inputs = vec![("string", c(json!(string))), ("regex_pattern", c(json!(pattern))), ("case_insensitive", c(json!(false))), ("multiline", c(json!(false))), ("dotall", c(json!(false)))];
        match node {
            "RegexExtract" => inputs.extend([("mode", c(json!("First Match"))), ("group_index", c(json!(1)))]),
            "RegexReplace" => inputs.push(("replace", c(json!(r"\5")))),
            _ => {}
        }
        env.run(node, inputs)
    };
    for (pattern, says) in [("(", "parenthesis"), (r"\p{L}", "bad escape"), ("(?a)x", "not supported"), (r"\N{DIGIT ONE}", "not supported"), ("[a-", "unterminated")] {
        let (input, msg) = invalid_input(regex("RegexMatch", pattern, "abc"));
        assert_eq!(input, "regex_pattern", "{pattern}");
        assert!(msg.to_lowercase().contains(says), "{pattern}: {msg}");
    }
    assert_eq!(invalid_input(regex("RegexReplace", "(a)", "abc")).0, "replace", "a group the pattern lacks");
    // Catastrophic backtracking (Python would hang) stops at the engine's limit with an error.
    let (input, msg) = invalid_input(regex("RegexExtract", "(a+)+(?=c)", &format!("{}b", "a".repeat(40))));
    assert_eq!(input, "string", "{msg}");
    // `$` on long texts, with and without the final newline Python's `$` may stand before.
    for end in ["", "\n"] {
        let long = format!("{}tail  {end}", "word ".repeat(40_000));
        let mut inputs = vec![("string", c(json!(long))), ("regex_pattern", c(json!(r"\s+$"))), ("replace", c(json!("")))];
        inputs.extend([("case_insensitive", c(json!(false))), ("multiline", c(json!(false))), ("dotall", c(json!(false)))]);
        let out = env.run("RegexReplace", inputs).unwrap_or_else(|e| panic!("{e}"));
        assert!(first::<String>(&out).ends_with("word tail"));
    }
    let (input, _) = invalid_input(env.run("CaseConverter", vec![("string", c(json!("x"))), ("mode", c(json!("sPoNgEcAsE")))]));
    assert_eq!(input, "mode");
    match env.run("ComfySwitchNode", vec![("switch", c(json!(true)))]) {
        Err(NodeError::MissingInput { input }) => assert!(input.contains("on_true"), "{input}"),
        other => panic!("a switch with nothing linked: {other:?}"),
    }
}

/// ComfyUI's FLUX.1 Kontext template stitches its two images with ImageStitch: its UI
/// widget values map onto the inputs in ComfyUI's order.
#[test]
fn kontext_template_image_stitch_reads_its_widgets() {
    let env = env(1);
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/comfyui/flux_kontext_dev_basic.json")).unwrap();
    let wf = Workflow::parse(&text, &env.registry).unwrap();
    let stitch = wf.nodes.values().find(|n| n.class_type == "ImageStitch").expect("the template has an ImageStitch");
    let konst = |k: &str| match &stitch.inputs[k] {
        sdflow_executor::InputValue::Const(v) => v.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!([konst("direction"), konst("match_image_size"), konst("spacing_width"), konst("spacing_color")], [json!("right"), json!(true), json!(0), json!("white")]);
    assert!(matches!(stitch.inputs["image1"], sdflow_executor::InputValue::Link { .. }));
}
