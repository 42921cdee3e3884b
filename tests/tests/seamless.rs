//! Seamless tiling end to end on the tiny SD1 checkpoint: the ComfyUI-seamless-tiling
//! pack's nodes (SeamlessTile, CircularVAEDecode, MakeCircularVAE, OffsetImage) in the
//! txt2img workflow, as its users wire them.

use sdflow_executor::{InputValue, NodeSpec, Workflow};
use sdflow_tests::TestEnv;
use serde_json::json;

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

/// txt2img.json at 64² in 2 steps, its model through SeamlessTile (`tiling`) when given.
fn txt2img(env: &TestEnv, tiling: Option<&str>) -> Workflow {
    let mut wf = env.workflow("txt2img.json", 64, 2);
    if let Some(t) = tiling {
        wf.nodes.insert("20".into(), NodeSpec::new("SeamlessTile").with_input("model", InputValue::link("1", 0)).with_const("tiling", json!(t)).with_const("copy_model", json!("Make a copy")));
        wf.set_input("5", "model", InputValue::link("20", 0)).unwrap();
    }
    wf
}

/// `wf` decoding with CircularVAEDecode (`tiling`) instead of VAEDecode.
fn circular_decode(wf: &Workflow, tiling: &str) -> Workflow {
    let mut wf = wf.clone();
    let spec = NodeSpec::new("CircularVAEDecode").with_input("samples", InputValue::link("5", 0)).with_input("vae", InputValue::link("1", 2)).with_const("tiling", json!(tiling));
    wf.nodes.insert("6".into(), spec);
    wf
}

#[test]
fn seamless_nodes_change_the_image_as_asked() {
    let env = TestEnv::new(|rt| rt);
    let plain = env.run_saved(&txt2img(&env, None), "7");
    assert_eq!((plain.0, plain.1), (64, 64));

    // SeamlessTile with "disable" and CircularVAEDecode with "disable" change nothing.
    assert_eq!(env.run_saved(&circular_decode(&txt2img(&env, Some("disable")), "disable"), "7"), plain);

    // The circular model samples another latent; the circular VAE decodes it differently.
    let tiled_model = txt2img(&env, Some("enable"));
    let model_only = env.run_saved(&tiled_model, "7");
    assert_ne!(model_only.2, plain.2, "the circular UNet changes the image");
    let both = env.run_saved(&circular_decode(&tiled_model, "enable"), "7");
    assert_ne!(both.2, model_only.2, "the circular VAE changes the decode");
    let x_only = env.run_saved(&circular_decode(&txt2img(&env, Some("x_only")), "x_only"), "7");
    assert_ne!(x_only.2, both.2);

    // MakeCircularVAE + VAEDecode is CircularVAEDecode.
    let mut made = tiled_model.clone();
    made.nodes.insert("21".into(), NodeSpec::new("MakeCircularVAE").with_input("vae", InputValue::link("1", 2)).with_const("tiling", json!("enable")).with_const("copy_vae", json!("Modify in place")));
    made.set_input("6", "vae", InputValue::link("21", 0)).unwrap();
    assert_eq!(env.run_saved(&made, "7"), both);

    // OffsetImage rolls the picture by half its size: the seams move to the middle.
    let mut offset = circular_decode(&tiled_model, "enable");
    offset.nodes.insert("22".into(), NodeSpec::new("OffsetImage").with_input("pixels", InputValue::link("6", 0)).with_const("x_percent", json!(50.0)).with_const("y_percent", json!(25.0)));
    offset.set_input("7", "images", InputValue::link("22", 0)).unwrap();
    let rolled = env.run_saved(&offset, "7");
    let (w, h) = (64usize, 64usize);
    for y in 0..h {
        for x in 0..w {
            let (src, dst) = ((y * w + x) * 3, (((y + 16) % h) * w + (x + 32) % w) * 3);
            assert_eq!(rolled.2[dst..dst + 3], both.2[src..src + 3], "pixel {x},{y}");
        }
    }

    // A choice the pack does not have is refused, by name.
    let mut bad = tiled_model.clone();
    bad.set_input("20", "tiling", c(json!("both"))).unwrap();
    let report = env.exec.validate(&bad).expect_err("not a tiling choice").to_json().to_string();
    assert!(report.contains("tiling"), "{report}");
}
