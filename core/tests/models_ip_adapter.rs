//! IP-Adapter (classic and Plus) against diffusers: the image projections
//! (`ImageProjection`, `IPAdapterPlusImageProjection`) and a UNet whose cross-attentions
//! carry `IPAdapterAttnProcessor2_0`s loaded from the h94 file layout
//! (fixtures from tests/fixtures/models/make_ip_adapter.py).

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::sd::ip_adapter::{cross_attention_blocks, ImageProj, IpAdapter, IpAdapterConfig};
use sdflow_core::models::sd::{BatchItem, IpPatch, IpSide, SdDenoiser};
use sdflow_core::models::conditioning::{Conditioning, Prediction};
use sdflow_core::models::sd::unet::{Heads, IpAttention, Unet, UnetConfig, UnetExtras};
use sdflow_core::models::Weights;
use sdflow_core::sampling::schedule::DiscreteSchedule;

const PREFIX: &str = "model.diffusion_model";

fn f32s(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn unet_config(w: &Weights) -> UnetConfig {
    let mut cfg = UnetConfig::infer(w, PREFIX).unwrap();
    cfg.heads = Heads::Count(4);
    cfg
}

/// The adapter's tokens for the fixture's embeddings, and its config.
fn project(w: &Weights, r: &serde_json::Value, backend: &Backend) -> (Vec<f32>, IpAdapterConfig) {
    let cfg = IpAdapterConfig::infer(w).unwrap();
    let adapter = IpAdapter::new(w, cfg.clone()).unwrap();
    let ctx = Context::new(4096, 4096).unwrap();
    let mut run = GraphRun::new(&ctx);
    let e = f32s(&r["embeds"]);
    let ne: Vec<i64> = if cfg.is_plus() { vec![cfg.embed_dim, 17, 2] } else { vec![cfg.embed_dim, 2] };
    let embeds = run.input_f32(&ne, e).unwrap();
    let out = adapter.project(&ctx, &mut run, embeds).unwrap();
    assert_eq!(out.ne(), [48, cfg.tokens, 2, 1]);
    (run.compute(backend, &[out], 4096).unwrap().remove(0), cfg)
}

fn check(kind: &str) {
    let all = reference("ip_adapter_ref.json");
    let r = &all["ip"];
    let backend = common::backend(2);
    let uw = det_weights(&all["unet_keys"], 0.14, &backend);
    let iw = det_weights(&r[kind]["keys"], 0.2, &backend);
    let (tokens, cfg) = project(&iw, &r[kind], &backend);
    let err = max_abs_err(&tokens, &f32s(&r[kind]["tokens"]));
    eprintln!("{kind}: projection max abs error {err}");
    assert!(err <= 1e-3, "{kind} projection: max abs error {err}");

    // The UNet with image attention, from our tokens.
    let ucfg = unet_config(&uw);
    let adapter = IpAdapter::new(&iw, cfg.clone()).unwrap();
    adapter.check_unet(&ucfg).unwrap();
    let unet = Unet::new(&uw, PREFIX, ucfg).unwrap();
    let ctx = Context::new(16384, 16384).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[12, 8, 4, 2], f32s(&r["x"])).unwrap();
    let t = run.input_f32(&[2], f32s(&r["t"])).unwrap();
    let c = run.input_f32(&[48, 7, 2], f32s(&r["text"])).unwrap();
    let tk = run.input_f32(&[48, cfg.tokens, 2], tokens.clone()).unwrap();
    let scale = r["scale"].as_f64().unwrap() as f32;
    let extras = UnetExtras { ip: vec![IpAttention { weights: &iw, tokens: tk, scale }], ..Default::default() };
    let out = unet.forward_with(&ctx, x, t, c, &extras).unwrap();
    let got = run.compute(&backend, &[out], 16384).unwrap().remove(0);
    let err = max_abs_err(&got, &f32s(&r[kind]["out"]));
    eprintln!("{kind}: UNet max abs error {err}");
    assert!(err <= 1e-3, "{kind} UNet: max abs error {err}");

    // Through the denoiser: item 0 is the conditional side (the image's tokens), item 1
    // the unconditional side (the zero embedding's), each with its own text.
    let per = (48 * cfg.tokens) as usize;
    let sigma = r["sigma"].as_f64().unwrap() as f32;
    let patch = |range: (f32, f32)| IpPatch { weights: &iw, cond: tokens[..per].to_vec(), uncond: tokens[per..].to_vec(), tokens: cfg.tokens, scale, sigmas: range };
    let mut den = SdDenoiser::new(Unet::new(&uw, PREFIX, unet_config(&uw)).unwrap(), DiscreteSchedule::sd(), Prediction::Epsilon).with_ip_adapters(vec![patch((f32::INFINITY, 0.0))]).unwrap();
    let text = f32s(&r["text"]);
    let (ca, cb) = (Conditioning::new(text[..7 * 48].to_vec(), 48, 7).unwrap(), Conditioning::new(text[7 * 48..].to_vec(), 48, 7).unwrap());
    let xs = f32s(&r["x"]);
    let x0 = &xs[..4 * 8 * 12];
    let items = [BatchItem { x: x0, cond: &ca, concat: None, ip: IpSide::Cond, control: &[] }, BatchItem { x: x0, cond: &cb, concat: None, ip: IpSide::Uncond, control: &[] }];
    let d = den.denoise_batch(&backend, [12, 8, 4, 1], sigma, &items).unwrap();
    let got: Vec<f32> = d.concat();
    let err = max_abs_err(&got, &f32s(&r[kind]["denoised"]));
    eprintln!("{kind}: denoiser max abs error {err}");
    assert!(err <= 1e-3, "{kind} denoiser (cond/uncond image tokens): max abs error {err}");

    // Outside its sigma range the adapter does nothing: the plain UNet's prediction.
    let mut off = SdDenoiser::new(Unet::new(&uw, PREFIX, unet_config(&uw)).unwrap(), DiscreteSchedule::sd(), Prediction::Epsilon).with_ip_adapters(vec![patch((2.0, 0.0))]).unwrap();
    let mut plain = SdDenoiser::new(Unet::new(&uw, PREFIX, unet_config(&uw)).unwrap(), DiscreteSchedule::sd(), Prediction::Epsilon);
    let a = off.denoise_batch(&backend, [12, 8, 4, 1], sigma, &items).unwrap();
    let b = plain.denoise_batch(&backend, [12, 8, 4, 1], sigma, &items).unwrap();
    assert_eq!(a, b);
    assert!(max_abs_err(&a.concat(), &got) > 1e-3, "the image attention changes the prediction");
}

#[test]
fn classic_ip_adapter_matches_diffusers() {
    check("classic");
}

#[test]
fn plus_ip_adapter_matches_diffusers() {
    check("plus");
}

#[test]
fn plus_is_detected_and_the_layout_read() {
    let all = reference("ip_adapter_ref.json");
    let backend = common::backend(1);
    let plus = IpAdapterConfig::infer(&det_weights(&all["ip"]["plus"]["keys"], 0.2, &backend)).unwrap();
    assert_eq!(plus.proj, ImageProj::Plus { dim: 128, inner: 128, heads: 2, depth: 4, ff: 512 });
    assert_eq!((plus.embed_dim, plus.cross_dim, plus.tokens), (64, 48, 6));
    let classic = IpAdapterConfig::infer(&det_weights(&all["ip"]["classic"]["keys"], 0.2, &backend)).unwrap();
    assert_eq!(classic.proj, ImageProj::Classic);
    assert!(!classic.is_plus());
    assert_eq!((classic.embed_dim, classic.cross_dim, classic.tokens), (48, 48, 4));
    // The odd indices, one per transformer block, down → up → middle, at each block's width.
    let uw = det_weights(&all["unet_keys"], 0.14, &backend);
    let blocks = cross_attention_blocks(&UnetConfig::infer(&uw, PREFIX).unwrap());
    assert_eq!(blocks.len(), 16);
    assert_eq!(blocks[0], ("input_blocks.1.1.transformer_blocks.0".to_string(), 32));
    assert_eq!(blocks[2], ("input_blocks.4.1.transformer_blocks.0".to_string(), 64));
    assert_eq!(blocks[3], ("input_blocks.4.1.transformer_blocks.1".to_string(), 64));
    assert_eq!(blocks[6], ("output_blocks.3.1.transformer_blocks.0".to_string(), 64));
    assert_eq!(blocks[15], ("middle_block.1.transformer_blocks.0".to_string(), 64));
    let layers: Vec<usize> = classic.layers.iter().map(|l| l.0).collect();
    assert_eq!(layers, (0..16).map(|k| 2 * k + 1).collect::<Vec<_>>());
}

#[test]
fn adapters_that_do_not_fit_are_errors() {
    let all = reference("ip_adapter_ref.json");
    let backend = common::backend(1);
    let iw = det_weights(&all["ip"]["classic"]["keys"], 0.2, &backend);
    let adapter = IpAdapter::new(&iw, IpAdapterConfig::infer(&iw).unwrap()).unwrap();
    let uw = det_weights(&all["unet_keys"], 0.14, &backend);
    let mut ucfg = unet_config(&uw);
    ucfg.context_dim = 64;
    let e = adapter.check_unet(&ucfg).expect_err("cross width");
    assert!(e.to_string().contains("48 wide") && e.to_string().contains("takes 64"), "{e}");
    // Another UNet structure (the SD1 fixture: one transformer layer per block, 11 blocks).
    let other = det_weights(&common::keys("unet_sd1_tiny_keys.json"), 0.14, &backend);
    let e = adapter.check_unet(&UnetConfig::infer(&other, PREFIX).unwrap()).expect_err("layer count");
    assert!(e.to_string().contains("16 cross-attention layers and this UNet 11"), "{e}");
    // CLIP vision output of the wrong width (a Plus input for a classic adapter).
    let ctx = Context::new(256, 256).unwrap();
    let mut run = GraphRun::new(&ctx);
    let wrong = run.input_f32(&[64, 17, 1], vec![0.0; 64 * 17]).unwrap();
    let e = adapter.project(&ctx, &mut run, wrong).err().expect("embedding width");
    assert!(e.to_string().contains("48-wide image embeddings"), "{e}");
    // Malformed files: no attention weights, a wrong shape, no projection.
    let mut keys = all["ip"]["classic"]["keys"].as_object().unwrap().clone();
    keys.insert("ip_adapter.3.to_v_ip.weight".into(), serde_json::json!([32, 40]));
    let bad = det_weights(&serde_json::Value::Object(keys.clone()), 0.2, &backend);
    let e = IpAdapter::new(&bad, IpAdapterConfig::infer(&bad).unwrap()).err().expect("shape");
    assert!(e.to_string().contains("ip_adapter.3.to_v_ip.weight"), "{e}");
    keys.retain(|k, _| !k.starts_with("ip_adapter."));
    let e = IpAdapterConfig::infer(&det_weights(&serde_json::Value::Object(keys), 0.2, &backend)).expect_err("no layers");
    assert!(e.to_string().contains("not an IP-Adapter"), "{e}");
    let mut keys = all["ip"]["classic"]["keys"].as_object().unwrap().clone();
    keys.retain(|k, _| !k.starts_with("image_proj."));
    let e = IpAdapterConfig::infer(&det_weights(&serde_json::Value::Object(keys), 0.2, &backend)).expect_err("no projection");
    assert!(e.to_string().contains("image projection"), "{e}");
}
