//! SDXL's pieces against the PyTorch reference on tiny random weights (fixtures from
//! tests/fixtures/models/make_sdxl.py): the UNet with its ADM input (`label_emb`) and
//! the size embeddings sdflow computes itself, and OpenCLIP-G's unnormed penultimate
//! states and projected pooled output.

mod common;

use common::{det_weights, keys, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::clip::{ClipLayout, ClipTextConfig, ClipTextModel, EncodeOptions};
use sdflow_core::models::conditioning::{Conditioning, SizeCond};
use sdflow_core::models::sd::unet::{BlockKind, Heads, Unet, UnetConfig, UnetExtras};

const PREFIX: &str = "model.diffusion_model";

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn sdxl_unet_with_size_conditioning_matches_diffusers() {
    let backend = common::backend(2);
    let w = det_weights(&keys("unet_sdxl_tiny_keys.json"), 0.14, &backend);
    let mut cfg = UnetConfig::infer(&w, PREFIX).unwrap();
    assert_eq!(cfg.adm_in_channels, Some(32 + 6 * 256));
    assert_eq!((cfg.context_dim, cfg.middle_depth), (64, 2));
    assert!(cfg.linear_projection);
    // No attention on the first level, then depth 1, then depth 2.
    let depths: Vec<usize> = cfg.input_blocks.iter().filter_map(|b| match b.kind {
        BlockKind::Res { transformer_depth, .. } => Some(transformer_depth),
        _ => None,
    }).collect();
    assert_eq!(depths, [0, 0, 1, 1, 2, 2]);
    cfg.heads = Heads::Dim(16);
    let unet = Unet::new(&w, PREFIX, cfg).unwrap();
    let r = &reference("sdxl_tiny_ref.json")["unet"];
    let pooled = floats(&r["pooled"]);
    let ids: Vec<Vec<f64>> = serde_json::from_value(r["time_ids"].clone()).unwrap();
    let mut y = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let mut c = Conditioning::new(vec![0.0; 64], 64, 1).unwrap();
        c.pooled = Some(pooled[i * 32..(i + 1) * 32].to_vec());
        if i == 1 {
            c.size = SizeCond { width: Some(id[1]), height: Some(id[0]), crop_h: id[2], crop_w: id[3], target_height: Some(id[4]), target_width: Some(id[5]), aesthetic_score: None };
            y.extend(c.adm(32 + 6 * 256, 12345, 678).unwrap());
        } else {
            // Unset sizes are the image's: the latent is 12×8, so 96×64 pixels.
            assert_eq!((id[0], id[1]), (64.0, 96.0));
            y.extend(c.adm(32 + 6 * 256, 96, 64).unwrap());
        }
    }
    let ctx = Context::new(16384, 16384).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[12, 8, 4, 2], floats(&r["x"])).unwrap();
    let t = run.input_f32(&[2], floats(&r["t"])).unwrap();
    let c = run.input_f32(&[64, 7, 2], floats(&r["context"])).unwrap();
    let yt = run.input_f32(&[32 + 6 * 256, 2], y).unwrap();
    assert!(unet.forward(&ctx, x, t, c).is_err(), "an SDXL UNet without its ADM vector");
    let out = unet.forward_with(&ctx, x, t, c, &UnetExtras { y: Some(yt), ..Default::default() }).unwrap();
    let got = run.compute(&backend, &[out], 16384).unwrap().remove(0);
    let err = max_abs_err(&got, &floats(&r["out"]));
    assert!(err <= 1e-3, "SDXL UNet: max abs error {err}");
}

#[test]
fn adm_vector_needs_a_pooled_embedding_of_the_right_width() {
    let mut c = Conditioning::new(vec![0.0; 4], 4, 1).unwrap();
    let e = c.adm(32 + 6 * 256, 64, 64).unwrap_err().to_string();
    assert!(e.contains("pooled"), "{e}");
    c.pooled = Some(vec![0.0; 30]);
    let e = c.adm(32 + 6 * 256, 64, 64).unwrap_err().to_string();
    assert!(e.contains("1568"), "{e}");
    // The refiner's layout: five scalars, the last the aesthetic score.
    c.pooled = Some(vec![0.0; 32]);
    assert_eq!(c.adm(32 + 5 * 256, 64, 64).unwrap().len(), 32 + 5 * 256);
}

#[test]
fn open_clip_g_penultimate_and_pooled_match_transformers() {
    let backend = common::backend(2);
    let r = reference("sdxl_tiny_ref.json");
    let w = det_weights(&r["clip_g_keys"], 0.35, &backend);
    let prefix = "conditioner.embedders.1.model";
    let mut cfg = ClipTextConfig::infer(&w, prefix, ClipLayout::OpenClip).unwrap();
    cfg.heads = 2;
    let model = ClipTextModel::new(&w, prefix, cfg).unwrap();
    assert!(model.has_projection());
    let g = &r["clip_g"];
    let tokens: Vec<Vec<i32>> = serde_json::from_value(g["tokens"].clone()).unwrap();
    let eos: Vec<usize> = serde_json::from_value(g["eos"].clone()).unwrap();
    let ctx = Context::new(4096, 4096).unwrap();
    let mut run = GraphRun::new(&ctx);
    let opts = EncodeOptions { clip_skip: 2, final_norm: false, pooled_at: Some(eos), project_pooled: true };
    let out = model.encode(&ctx, &mut run, &tokens, &opts, &[]).unwrap();
    let pooled = out.pooled.unwrap();
    assert_eq!(pooled.ne(), [48, 2, 1, 1]);
    let got = run.compute(&backend, &[out.hidden, pooled], 4096).unwrap();
    let err = max_abs_err(&got[0], &floats(&g["penultimate"]));
    assert!(err <= 1e-3, "penultimate: max abs error {err}");
    let err = max_abs_err(&got[1], &floats(&g["pooled"]));
    assert!(err <= 1e-3, "pooled: max abs error {err}");
    let ctx = Context::new(4096, 4096).unwrap();
    let mut run = GraphRun::new(&ctx);
    let bad = EncodeOptions { clip_skip: 2, final_norm: false, pooled_at: Some(vec![8, 0]), project_pooled: true };
    assert!(model.encode(&ctx, &mut run, &tokens, &bad, &[]).is_err(), "pooled position past the sequence");
}

#[test]
fn edm_v_prediction_tells_the_unet_a_quarter_log_sigma() {
    use sdflow_core::models::sd::SdDenoiser;
use sdflow_core::models::conditioning::Prediction;
    use sdflow_core::sampling::schedule::DiscreteSchedule;
    let backend = common::backend(2);
    let w = det_weights(&keys("unet_sdxl_tiny_keys.json"), 0.14, &backend);
    let mut cfg = UnetConfig::infer(&w, PREFIX).unwrap();
    cfg.heads = Heads::Dim(16);
    let r = &reference("sdxl_tiny_ref.json")["unet"];
    let x: Vec<f32> = floats(&r["x"])[..12 * 8 * 4].to_vec();
    let ctx_data: Vec<f32> = floats(&r["context"])[..7 * 64].to_vec();
    let mut cond = Conditioning::new(ctx_data.clone(), 64, 7).unwrap();
    cond.pooled = Some(floats(&r["pooled"])[..32].to_vec());
    let y = cond.adm(32 + 6 * 256, 96, 64).unwrap();
    let sigma = 3.0f32;
    let schedule = DiscreteSchedule::edm(0.002, 120.0).unwrap();
    assert!((schedule.sigma_max() - 120.0).abs() < 1e-3 && (schedule.sigma_min() - 0.002).abs() < 1e-6);
    let mut den = SdDenoiser::new(Unet::new(&w, PREFIX, cfg.clone()).unwrap(), schedule, Prediction::EdmV);
    let got = den.denoise(&backend, &x, [12, 8, 4, 1], sigma, &cond, None, 1.0).unwrap().denoised;

    // EDM with σ_data = 1: c_in = 1/√(σ²+1), c_skip = 1/(σ²+1), c_out = −σ/√(σ²+1), c_noise = ¼·ln σ.
    let unet = Unet::new(&w, PREFIX, cfg).unwrap();
    let c_in = 1.0 / (sigma * sigma + 1.0).sqrt();
    let ctx = Context::new(16384, 16384).unwrap();
    let mut run = GraphRun::new(&ctx);
    let xt = run.input_f32(&[12, 8, 4, 1], x.iter().map(|v| v * c_in).collect()).unwrap();
    let t = run.input_f32(&[1], vec![0.25 * sigma.ln()]).unwrap();
    let c = run.input_f32(&[64, 7, 1], ctx_data).unwrap();
    let yt = run.input_f32(&[32 + 6 * 256, 1], y).unwrap();
    let out = unet.forward_with(&ctx, xt, t, c, &UnetExtras { y: Some(yt), ..Default::default() }).unwrap();
    let v = run.compute(&backend, &[out], 16384).unwrap().remove(0);
    let want: Vec<f32> = x.iter().zip(&v).map(|(x, v)| x / (sigma * sigma + 1.0) - v * sigma * c_in).collect();
    let err = max_abs_err(&got, &want);
    assert!(err <= 1e-4, "EDM-v denoiser: max abs error {err}");
}

/// SSD-1B and Vega are SDXL with transformer layers (and Vega's middle transformer)
/// pruned per block: the structure is read block by block, so they run as they are.
#[test]
fn pruned_sdxl_variants_are_read_block_by_block() {
    let backend = common::backend(2);
    let mut table: serde_json::Map<String, serde_json::Value> = serde_json::from_value(keys("unet_sdxl_tiny_keys.json")).unwrap();
    // One output block keeps one of its two layers; the middle loses its transformer,
    // and its second res block moves up to index 1, as in Vega.
    table.retain(|k, _| !k.contains("output_blocks.0.1.transformer_blocks.1.") && !k.contains("middle_block.1."));
    let renamed: Vec<(String, serde_json::Value)> = table.iter().filter(|(k, _)| k.contains("middle_block.2.")).map(|(k, v)| (k.replace("middle_block.2.", "middle_block.1."), v.clone())).collect();
    table.retain(|k, _| !k.contains("middle_block.2."));
    table.extend(renamed);
    let w = det_weights(&serde_json::Value::Object(table), 0.14, &backend);
    let mut cfg = UnetConfig::infer(&w, PREFIX).unwrap();
    assert_eq!(cfg.middle_depth, 0);
    let out_depths: Vec<usize> = cfg.output_blocks.iter().filter_map(|b| match b.kind {
        BlockKind::Res { transformer_depth, .. } => Some(transformer_depth),
        _ => None,
    }).collect();
    assert_eq!(&out_depths[..3], &[1, 2, 2]);
    cfg.heads = Heads::Dim(16);
    let unet = Unet::new(&w, PREFIX, cfg).unwrap();
    let ctx = Context::new(16384, 16384).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[8, 8, 4, 1], vec![0.1; 256]).unwrap();
    let t = run.input_f32(&[1], vec![500.0]).unwrap();
    let c = run.input_f32(&[64, 7, 1], vec![0.05; 448]).unwrap();
    let y = run.input_f32(&[32 + 6 * 256, 1], vec![0.01; 32 + 6 * 256]).unwrap();
    let out = unet.forward_with(&ctx, x, t, c, &UnetExtras { y: Some(y), ..Default::default() }).unwrap();
    let got = run.compute(&backend, &[out], 16384).unwrap().remove(0);
    assert!(got.len() == 256 && got.iter().all(|v| v.is_finite()));
}
