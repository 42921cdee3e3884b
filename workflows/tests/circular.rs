//! sd-cli's `--circular`, `--circularx`, `--circulary` in the img_gen presets: SeamlessTile
//! on the diffusion model (after LoRAs and sampling overrides), MakeCircularVAE on the VAE
//! every encode and decode uses (and on `--taesd`), for the UNet and DiT builders alike.

use sdflow_executor::{InputValue, Workflow};
use sdflow_workflows::presets::{img_gen, Family, ImgGenParams, ModelInfo};
use serde_json::json;

fn nodes<'a>(wf: &'a Workflow, class: &str) -> Vec<(&'a String, &'a sdflow_executor::NodeSpec)> {
    wf.nodes.iter().filter(|(_, n)| n.class_type == class).collect()
}

fn link_of(n: &sdflow_executor::NodeSpec, input: &str) -> String {
    match &n.inputs[input] {
        InputValue::Link { node, .. } => node.clone(),
        other => panic!("{input} is {other:?}"),
    }
}

fn sd(circular: (bool, bool)) -> ImgGenParams {
    ImgGenParams { model: Some("m.safetensors".into()), prompt: "a cat <lora:ink:0.5>".into(), circular_x: circular.0, circular_y: circular.1, ..Default::default() }
}

#[test]
fn circular_flags_add_the_seamless_nodes() {
    let plain = img_gen(&sd((false, false))).unwrap();
    assert!(nodes(&plain.workflow, "SeamlessTile").is_empty() && nodes(&plain.workflow, "MakeCircularVAE").is_empty());

    for (axes, tiling, flag) in [((true, true), "enable", "--circular"), ((true, false), "x_only", "--circularx"), ((false, true), "y_only", "--circulary")] {
        let p = img_gen(&sd(axes)).unwrap();
        let wf = &p.workflow;
        let tile = nodes(wf, "SeamlessTile");
        let vae = nodes(wf, "MakeCircularVAE");
        assert_eq!((tile.len(), vae.len()), (1, 1), "{flag}");
        let (tile_id, tile) = tile[0];
        let (vae_id, vae) = vae[0];
        assert_eq!(tile.inputs["tiling"], InputValue::Const(json!(tiling)));
        assert_eq!(vae.inputs["tiling"], InputValue::Const(json!(tiling)));
        assert_eq!(p.origins[tile_id], flag);
        // After the LoRA; the sampler samples the tiled model, the decoder uses the circular VAE.
        assert_eq!(wf.nodes[&link_of(tile, "model")].class_type, "LoraLoader");
        assert_eq!(link_of(nodes(wf, "KSampler")[0].1, "model"), *tile_id);
        assert_eq!(link_of(nodes(wf, "VAEDecode")[0].1, "vae"), *vae_id);
        assert_eq!(wf.nodes[&link_of(vae, "vae")].class_type, "CheckpointLoaderSimple");
    }

    // img2img encodes with the circular VAE too; --taesd decodes with a circular TAESD.
    let p = img_gen(&ImgGenParams { init_img: Some("in.png".into()), taesd: Some("taesd".into()), ..sd((true, true)) }).unwrap();
    let wf = &p.workflow;
    let circ = nodes(wf, "MakeCircularVAE");
    assert_eq!(circ.len(), 2);
    let enc = link_of(nodes(wf, "VAEEncode")[0].1, "vae");
    let dec = link_of(nodes(wf, "VAEDecode")[0].1, "vae");
    assert!(enc != dec && [&enc, &dec].iter().all(|id| wf.nodes[*id].class_type == "MakeCircularVAE"));
    assert_eq!(wf.nodes[&link_of(&wf.nodes[&dec], "vae")].class_type, "VAELoader", "the TAESD loader");

    // --vae-tiling: the tiled nodes get the circular VAE (its tiles wrap around).
    let mut tiled = sd((true, true));
    tiled.tiling.enabled = true;
    let wf = img_gen(&tiled).unwrap().workflow;
    assert_eq!(wf.nodes[&link_of(nodes(&wf, "VAEDecodeTiled")[0].1, "vae")].class_type, "MakeCircularVAE");
}

#[test]
fn dit_presets_tile_too() {
    let p = ImgGenParams {
        diffusion_model: Some("flux1-dev.safetensors".into()),
        clip_l: Some("clip_l.safetensors".into()),
        t5xxl: Some("t5xxl_fp16.safetensors".into()),
        vae: Some("ae.safetensors".into()),
        prompt: "a cat".into(),
        model_info: ModelInfo { family: Family::Flux { fill: false, guidance: true }, double_blocks: Some(19), ..ModelInfo::default() },
        circular_x: true,
        ..Default::default()
    };
    let wf = img_gen(&p).unwrap().workflow;
    let (tile_id, tile) = nodes(&wf, "SeamlessTile")[0];
    assert_eq!(tile.inputs["tiling"], InputValue::Const(json!("x_only")));
    assert_eq!(wf.nodes[&link_of(tile, "model")].class_type, "ModelSamplingFlux");
    let users: Vec<&String> = wf.nodes.iter().filter(|(_, n)| n.inputs.values().any(|v| matches!(v, InputValue::Link { node, .. } if node == tile_id))).map(|(id, _)| id).collect();
    assert!(!users.is_empty());
    assert_eq!(wf.nodes[&link_of(nodes(&wf, "VAEDecode")[0].1, "vae")].class_type, "MakeCircularVAE");
}
