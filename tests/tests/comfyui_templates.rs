//! ComfyUI's own template workflows (tests/fixtures/comfyui, see SOURCES.md there), loaded
//! unchanged — subgraphs included — and run on tiny random-weight models saved under the
//! names the templates ask for.

use sdflow_executor::{InputValue, Workflow};
use sdflow_tests::{write_flux_models, TestEnv};
use serde_json::json;

fn flux_env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_flux_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::link(node, output)
}

fn konst(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

#[test]
fn a_subgraph_template_flattens_as_comfyuis_frontend_queues_it() {
    let env = flux_env();
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/flux_dev_full_text_to_image.json")).unwrap();
    let wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    let mut ids: Vec<&str> = wf.nodes.keys().map(String::as_str).collect();
    ids.sort();
    // The subgraph instance 194 holds every node but SaveImage; the note is not a node.
    assert_eq!(ids, ["194:45", "194:46", "194:47", "194:48", "194:49", "194:50", "194:51", "194:52", "9"]);
    let n = |id: &str| &wf.nodes[id];
    assert_eq!(n("9").inputs["images"], link("194:51", 0));
    assert_eq!(n("194:51").inputs["samples"], link("194:50", 0));
    assert_eq!(n("194:51").inputs["vae"], link("194:45", 0));
    assert_eq!(n("194:50").inputs["model"], link("194:46", 0));
    assert_eq!(n("194:50").inputs["positive"], link("194:49", 0));
    assert_eq!(n("194:50").inputs["negative"], link("194:52", 0));
    assert_eq!(n("194:50").inputs["latent_image"], link("194:48", 0));
    assert_eq!(n("194:52").inputs["conditioning"], link("194:49", 0));
    assert_eq!(n("194:49").inputs["clip"], link("194:47", 0));
    // Promoted widgets: the instance stores no values (proxyWidgets era), so the inner
    // nodes' own values are sent.
    assert_eq!(n("194:46").inputs["unet_name"], konst(json!("flux1-dev.safetensors")));
    assert_eq!(n("194:47").inputs["clip_name2"], konst(json!("t5xxl_fp16.safetensors")));
    assert_eq!(n("194:47").inputs["type"], konst(json!("flux")));
    assert_eq!(n("194:48").inputs["width"], konst(json!(1024)));
    assert_eq!(n("194:50").inputs["seed"], konst(json!(0)));
    assert_eq!(n("194:50").inputs["sampler_name"], konst(json!("euler")));
    assert_eq!(n("194:50").inputs["scheduler"], konst(json!("simple")));
    assert!(matches!(&n("194:49").inputs["text"], InputValue::Const(t) if t.as_str().unwrap().starts_with("A fairy tale scene")));
}

#[test]
fn flux_subgraph_templates_run_unchanged() {
    let env = flux_env();
    for name in ["flux_dev_full_text_to_image.json", "flux_dev_checkpoint_example.json"] {
        let wf = env.comfyui_template(name, 32, 2);
        let save = sdflow_tests::node_of(&wf, "SaveImage");
        let (w, h, px) = env.run_saved(&wf, &save);
        assert_eq!((w, h), (32, 32), "{name}");
        assert!(px.iter().max().unwrap() > px.iter().min().unwrap(), "{name}");
    }
    // The same graph from the two templates (they differ only in prompt and seed): with
    // those set alike, the same image.
    let a = env.comfyui_template("flux_dev_full_text_to_image.json", 32, 2);
    let mut b = env.comfyui_template("flux_dev_checkpoint_example.json", 32, 2);
    let (enc_a, enc_b) = (sdflow_tests::node_of(&a, "CLIPTextEncode"), sdflow_tests::node_of(&b, "CLIPTextEncode"));
    let (ks_a, ks_b) = (sdflow_tests::node_of(&a, "KSampler"), sdflow_tests::node_of(&b, "KSampler"));
    b.set_input(&enc_b, "text", a.nodes[&enc_a].inputs["text"].clone()).unwrap();
    b.set_input(&ks_b, "seed", a.nodes[&ks_a].inputs["seed"].clone()).unwrap();
    let save_a = sdflow_tests::node_of(&a, "SaveImage");
    let save_b = sdflow_tests::node_of(&b, "SaveImage");
    assert_eq!(env.run_saved(&a, &save_a).2, env.run_saved(&b, &save_b).2);
}

#[test]
fn the_sdxl_template_runs_unchanged() {
    use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    let ckpt = dir.path().join("models/checkpoints/sd_xl_base_1.0.safetensors");
    write_checkpoint(&ckpt, &SdConfig::tiny_sdxl(), sdflow_core::dtype::DType::F32, 11, Format::Safetensors).unwrap();
    let env = TestEnv::with_dir(dir, |rt| rt);
    let wf = env.comfyui_template("image_sdxl_simple.json", 64, 2);
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    let (w, h, px) = env.run_saved(&wf, &save);
    assert_eq!((w, h), (64, 64));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}

/// A workflow saved by ComfyUI's own frontend (workflows/comfyui: a subgraph whose
/// instance holds its own prompt, a PrimitiveInt feeding the seed from outside, notes)
/// runs; its conversion is checked with the templates' below.
#[test]
fn a_workflow_saved_by_comfyuis_frontend_runs() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::copy(ckpts.join("model.safetensors"), ckpts.join("tiny-sd1.safetensors")).unwrap();
    let env = TestEnv::with_dir(dir, |rt| rt);
    let text = std::fs::read_to_string(sdflow_tests::workflows_dir().join("comfyui/txt2img_subgraph.json")).unwrap();
    let wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    assert_eq!(wf.nodes["11:5"].inputs["seed"], link("8", 0));
    assert_eq!(wf.nodes["11:2"].inputs["text"], konst(json!("a watercolor fox in the snow")));
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    let (w, h, _) = env.run_saved(&sdflow_tests::shrink(wf, 64, 2, None), &save);
    assert_eq!((w, h), (64, 64));
}

/// A workflow with legacy group nodes (`workflow>Name`, `extra.groupNodes`), in the
/// format ComfyUI's frontend wrote before subgraphs: its groups unpack with the instance's
/// widget values (the reference from the current frontend is checked above) and it runs.
#[test]
fn a_workflow_with_legacy_group_nodes_runs() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::copy(ckpts.join("model.safetensors"), ckpts.join("tiny-sd1.safetensors")).unwrap();
    let env = TestEnv::with_dir(dir, |rt| rt);
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/group_nodes_txt2img.json")).unwrap();
    let wf = Workflow::parse(&text, env.exec.registry()).unwrap();
    // Group "Sample" is instance 11; its third inner node is the KSampler.
    assert_eq!(wf.nodes["11:2"].inputs["cfg"], konst(json!(7.5)));
    assert_eq!(wf.nodes["11:2"].inputs["positive"], link("10:2", 0));
    // "CLIPTextEncode 2 text": the third prompt of group "Prompts".
    assert_eq!(wf.nodes["10:3"].inputs["text"], konst(json!("blurry")));
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    let (w, h, px) = env.run_saved(&wf, &save);
    assert_eq!((w, h), (64, 48));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}

#[test]
fn broken_group_nodes_are_named_in_errors() {
    let env = flux_env();
    let r = env.exec.registry();
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui/group_nodes_txt2img.json")).unwrap();
    let base: serde_json::Value = serde_json::from_str(&text).unwrap();
    let fails = |doc: serde_json::Value| Workflow::from_json(doc, r).unwrap_err().to_string();

    // An inner node of a type this server lacks.
    let mut doc = base.clone();
    doc["extra"]["groupNodes"]["Sample"]["nodes"][1]["type"] = json!("NoSuchLatent");
    let e = fails(doc);
    assert!(e.contains("node 11") && e.contains("'Sample'") && e.contains("NoSuchLatent"), "{e}");

    // A group that holds an instance of itself.
    let mut doc = base.clone();
    doc["extra"]["groupNodes"]["Sample"]["nodes"][3]["type"] = json!("workflow>Sample");
    let e = fails(doc);
    assert!(e.contains("nested too deep"), "{e}");

    // A link inside to an input slot the node lacks.
    let mut doc = base.clone();
    doc["extra"]["groupNodes"]["Prompts"]["links"][2] = json!([0, 0, 2, 9, 10, "CONDITIONING"]);
    let e = fails(doc);
    assert!(e.contains("group node 'Prompts'") && e.contains("input slot 9"), "{e}");

    // A link inside naming a node the group does not have.
    let mut doc = base.clone();
    doc["extra"]["groupNodes"]["Prompts"]["links"][2] = json!([0, 0, 12, 0, 10, "CONDITIONING"]);
    let e = fails(doc);
    assert!(e.contains("'Prompts'") && e.contains("out of range"), "{e}");

    // Group data of the wrong shape.
    let mut doc = base;
    doc["extra"]["groupNodes"]["Prompts"] = json!(["not", "an", "object"]);
    let e = fails(doc);
    assert!(e.contains("'Prompts'") && e.contains("expected an object"), "{e}");
}

#[test]
fn the_kontext_subgraph_template_runs_unchanged() {
    let env = flux_env();
    let models = env.dir.path().join("models");
    std::fs::copy(models.join("diffusion_models/flux1-kontext-dev.safetensors"), models.join("diffusion_models/flux1-dev-kontext_fp8_scaled.safetensors")).unwrap();
    std::fs::copy(models.join("text_encoders/t5xxl_fp16.safetensors"), models.join("text_encoders/t5xxl_fp8_e4m3fn_scaled.safetensors")).unwrap();
    sdflow_tests::write_test_png(&env.dir.path().join("input/flux_kontext_dev_basic_input_image.jpg"), 72, 56);
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let wf = env.comfyui_template("flux_kontext_dev_basic.json", 32, 1);
    // The second LoadImage is bypassed, so ImageStitch gets only the first image.
    let stitch = sdflow_tests::node_of(&wf, "ImageStitch");
    assert!(!wf.nodes[&stitch].inputs.contains_key("image2"));
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    let (w, h, px) = env.run_saved(&wf, &save);
    // FluxKontextImageScale takes 72×56 to Kontext's nearest resolution.
    assert_eq!((w, h), (1184, 880));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}

/// Every template with a reference from ComfyUI's frontend (`NAME.api.json`, written by
/// tests/fixtures/comfyui/flatten_with_frontend.mjs) converts to exactly that prompt:
/// the same node ids (subgraph nodes as `instance:inner`), links and widget values.
#[test]
fn templates_convert_as_comfyuis_frontend_queues_them() {
    let env = flux_env();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".api.json") else { continue };
        let ui = dir.join(format!("{stem}.json"));
        let ui = if ui.exists() { ui } else { sdflow_tests::workflows_dir().join(format!("comfyui/{stem}.json")) };
        let text = std::fs::read_to_string(&ui).unwrap();
        let wf = Workflow::parse(&text, env.exec.registry()).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let mut queued: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(entry.path()).unwrap()).unwrap();
        let mut ours = wf.to_api_json();
        for doc in [&mut queued, &mut ours] {
            for node in doc.as_object_mut().unwrap().values_mut() {
                node.as_object_mut().unwrap().remove("_meta");
            }
        }
        // The frontend turns legacy group nodes into subgraphs with fresh node ids; the
        // prompts must be the same graph.
        let has_groups = serde_json::from_str::<serde_json::Value>(&text).unwrap()["extra"]["groupNodes"].as_object().is_some_and(|g| !g.is_empty());
        if has_groups {
            // The frontend's subgraph also promotes LoadImage's upload button, whose value
            // ("image") it then sends; the node has no such input.
            for node in queued.as_object_mut().unwrap().values_mut() {
                if node["class_type"] == "LoadImage" {
                    node["inputs"].as_object_mut().unwrap().remove("upload");
                }
            }
            assert_eq!(canonical(&ours), canonical(&queued), "{stem}");
        } else {
            assert_eq!(ours, queued, "{stem}");
        }
        checked += 1;
    }
    assert!(checked >= 7, "{checked} references");
}

/// An API prompt without its node ids: each node described by its class and inputs, a
/// link by the description of the node it comes from and the output slot, sorted.
fn canonical(prompt: &serde_json::Value) -> Vec<String> {
    fn describe(prompt: &serde_json::Value, id: &str, depth: usize) -> String {
        assert!(depth < 64, "a cycle through {id}");
        let node = &prompt[id];
        let mut inputs: Vec<String> = node["inputs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| match v.as_array() {
                Some(l) if l.len() == 2 && l[0].is_string() && l[1].is_u64() => {
                    format!("{k}=<{}>.{}", describe(prompt, l[0].as_str().unwrap(), depth + 1), l[1])
                }
                // JavaScript writes 3.0 as 3.
                _ => match v.as_f64() {
                    Some(x) if x.fract() == 0.0 => format!("{k}={}", x as i64),
                    _ => format!("{k}={v}"),
                },
            })
            .collect();
        inputs.sort();
        format!("{}({})", node["class_type"].as_str().unwrap(), inputs.join(", "))
    }
    let mut all: Vec<String> = prompt.as_object().unwrap().keys().map(|id| describe(prompt, id, 0)).collect();
    all.sort();
    all
}

/// FLUX.1 Fill inpainting from ComfyUI's template: DifferentialDiffusion,
/// InpaintModelConditioning and the mask from the image's alpha, all inside a subgraph.
#[test]
fn the_flux_fill_subgraph_template_runs_unchanged() {
    let env = flux_env();
    // A 64×48 picture whose middle is transparent: LoadImage's MASK is 1 − alpha.
    let rgba = image::RgbaImage::from_fn(64, 48, |x, y| {
        let hole = (16..48).contains(&x) && (12..36).contains(&y);
        image::Rgba([(x * 4) as u8, (y * 5) as u8, 128, if hole { 0 } else { 255 }])
    });
    rgba.save(env.dir.path().join("input/flux_fill_inpaint_example_input_image.png")).unwrap();
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let wf = env.comfyui_template("flux_fill_inpaint_example.json", 32, 2);
    assert!(wf.nodes.values().any(|n| n.class_type == "DifferentialDiffusion"));
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    let (w, h, px) = env.run_saved(&wf, &save);
    assert_eq!((w, h), (64, 48));
    assert!(px.iter().max().unwrap() > px.iter().min().unwrap());
}
