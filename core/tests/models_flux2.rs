//! FLUX.2 transformer against diffusers' `Flux2Transformer2DModel` on tiny random weights in
//! BFL's names (fixtures from tests/fixtures/models/make_flux2.py; the weights are
//! regenerated here): klein (no guidance embedding) and dev (guidance).

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::flux2::{Flux2, Flux2Config, Flux2Inputs};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.2;

fn fixture() -> serde_json::Value {
    reference("flux2_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn tiny(variant: &str) -> (Weights, Flux2Config) {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r[variant]["keys"], SCALE, &backend);
    let mut cfg = Flux2Config::infer(&w, "").unwrap();
    cfg.axes = serde_json::from_value(r["axes"].clone()).unwrap();
    (w, cfg)
}

fn run(w: &Weights, cfg: Flux2Config, guidance: bool) -> sdflow_core::models::Result<Vec<f32>> {
    let r = fixture();
    let [b, l, f]: [usize; 3] = serde_json::from_value(r["token_shape"].clone()).unwrap();
    let model = Flux2::new(w, "", cfg)?;
    let backend = common::backend(2);
    let ctx = Context::new(8192, 8192).unwrap();
    let mut g = GraphRun::new(&ctx);
    let img = g.input_f32(&[f as i64, l as i64, b as i64], floats(&r["tokens"]))?;
    let lt = r["txt_len"].as_u64().unwrap() as usize;
    let txt_vals = floats(&r["txt"]);
    let txt = g.input_f32(&[(txt_vals.len() / (b * lt)) as i64, lt as i64, b as i64], txt_vals)?;
    let ids = |k: &str| -> Vec<Vec<f32>> { serde_json::from_value(r[k].clone()).unwrap() };
    let (img_ids, txt_ids) = (ids("img_ids"), ids("txt_ids"));
    let timesteps = floats(&r["sigma"]);
    let gvals = floats(&r["guidance"]);
    let inputs = Flux2Inputs { img, img_ids: &img_ids, txt, txt_ids: &txt_ids, timesteps: &timesteps, guidance: guidance.then_some(gvals.as_slice()) };
    let out = model.forward(&ctx, &mut g, &inputs)?;
    assert_eq!(out.ne(), [f as i64, l as i64, b as i64, 1]);
    Ok(g.compute(&backend, &[out], 8192)?.remove(0))
}

#[test]
fn klein_matches_diffusers() {
    let (w, cfg) = tiny("klein");
    assert_eq!((cfg.in_channels, cfg.out_channels, cfg.hidden, cfg.heads, cfg.mlp_hidden, cfg.context, cfg.depth, cfg.depth_single), (16, 16, 32, 2, 96, 24, 1, 2));
    assert!(!cfg.guidance_embed);
    let got = run(&w, cfg.clone(), false).unwrap();
    let err = max_abs_err(&got, &floats(&fixture()["klein"]["out"]));
    assert!(err <= 1e-3, "klein: max abs error {err}");
    // klein ignores a guidance value, as sd.cpp does.
    assert_eq!(run(&w, cfg, true).unwrap(), got);
}

#[test]
fn dev_matches_diffusers() {
    let (w, cfg) = tiny("dev");
    assert!(cfg.guidance_embed);
    let err = max_abs_err(&run(&w, cfg, true).unwrap(), &floats(&fixture()["dev"]["out"]));
    assert!(err <= 1e-3, "dev: max abs error {err}");
}

#[test]
fn bad_configs_are_errors() {
    let (w, cfg) = tiny("klein");
    let mut axes = cfg.clone();
    axes.axes = vec![32, 32, 32, 32];
    let e = Flux2::new(&w, "", axes).err().expect("axes");
    assert!(e.to_string().contains("rotary axes"), "{e}");
    let mut wrong = cfg;
    wrong.mlp_hidden = 64;
    let e = Flux2::new(&w, "", wrong).err().expect("shape");
    assert!(e.to_string().contains("img_mlp.0.weight"), "{e}");
    let e = Flux2Config::infer(&w, "model.diffusion_model.").err().expect("prefix");
    assert!(e.to_string().contains("not a FLUX.2 transformer"), "{e}");
}

/// The denoiser makes the pipeline's positions and tokens from a [W, H, 128, N] latent:
/// `denoised = x − σ·v` with the fixture's velocity.
#[test]
fn denoiser_matches_the_pipeline_layout() {
    use sdflow_core::models::conditioning::Conditioning;
    use sdflow_core::models::dit::unpatchify;
    use sdflow_core::models::flux2::{position_ids, Flux2Denoiser, Flux2Item};
    let r = fixture();
    let [b, l, f]: [usize; 3] = serde_json::from_value(r["token_shape"].clone()).unwrap();
    let [h, w]: [usize; 2] = serde_json::from_value(r["latent_hw"].clone()).unwrap();
    let lt = r["txt_len"].as_u64().unwrap() as usize;
    let (img_ids, txt_ids) = position_ids(h, w, lt);
    assert_eq!(img_ids, serde_json::from_value::<Vec<Vec<f32>>>(r["img_ids"].clone()).unwrap());
    assert_eq!(txt_ids, serde_json::from_value::<Vec<Vec<f32>>>(r["txt_ids"].clone()).unwrap());
    let latent = unpatchify(&floats(&r["tokens"]), [b, f, h, w], 1).unwrap();
    let velocity = unpatchify(&floats(&r["klein"]["out"]), [b, f, h, w], 1).unwrap();
    let txt = floats(&r["txt"]);
    let (w8, cfg) = tiny("klein");
    let mut den = Flux2Denoiser::new(Flux2::new(&w8, "", cfg).unwrap());
    let backend = common::backend(2);
    let per = f * h * w;
    let sigma = floats(&r["sigma"]);
    assert_eq!(l, h * w);
    for k in 0..b {
        let cond = Conditioning::new(txt[k * lt * 24..(k + 1) * lt * 24].to_vec(), 24, lt as i64).unwrap();
        let x = &latent[k * per..(k + 1) * per];
        let got = den.denoise_batch(&backend, [w as i64, h as i64, f as i64, 1], sigma[k], &[Flux2Item { x, cond: &cond }]).unwrap().remove(0);
        let want: Vec<f32> = x.iter().zip(&velocity[k * per..(k + 1) * per]).map(|(x, v)| x - sigma[k] * v).collect();
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-3, "sample {k}: max abs error {err}");
    }
    let cond = Conditioning::new(vec![0.1; 3 * 16], 16, 3).unwrap();
    let x = vec![0.0; per];
    let e = den.denoise_batch(&backend, [w as i64, h as i64, f as i64, 1], 0.5, &[Flux2Item { x: &x, cond: &cond }]).err().expect("text width");
    assert!(e.to_string().contains("three LLM layers"), "{e}");
}

/// Reference latents (an edit) follow the image's tokens at times 10 and 20, as
/// `Flux2KleinPipeline` lays them out; the denoised image is the image's tokens alone.
#[test]
fn denoiser_reads_references_as_the_pipeline_does() {
    use sdflow_core::models::conditioning::{Conditioning, ReferenceLatent, ReferenceMethod};
    use sdflow_core::models::dit::unpatchify;
    use sdflow_core::models::flux2::denoiser::reference_ids;
    use sdflow_core::models::flux2::{Flux2Denoiser, Flux2Item};
    use std::sync::Arc;
    let r = fixture();
    let e = &r["klein_refs"];
    let [b, _, f]: [usize; 3] = serde_json::from_value(r["token_shape"].clone()).unwrap();
    let [h, w]: [usize; 2] = serde_json::from_value(r["latent_hw"].clone()).unwrap();
    let lt = r["txt_len"].as_u64().unwrap() as usize;
    let hw: Vec<[usize; 2]> = serde_json::from_value(e["ref_hw"].clone()).unwrap();
    let refs: Vec<Arc<ReferenceLatent>> = hw.iter().enumerate().map(|(i, &[rh, rw])| Arc::new(ReferenceLatent { data: floats(&e["refs"][i]), channels: f, height: rh, width: rw })).collect();
    assert_eq!(reference_ids(&refs), serde_json::from_value::<Vec<Vec<f32>>>(e["ref_ids"].clone()).unwrap());
    let latent = unpatchify(&floats(&r["tokens"]), [b, f, h, w], 1).unwrap();
    let velocity = unpatchify(&floats(&e["out"]), [b, f, h, w], 1).unwrap();
    let txt = floats(&r["txt"]);
    let (w8, cfg) = tiny("klein");
    let mut den = Flux2Denoiser::new(Flux2::new(&w8, "", cfg).unwrap());
    let backend = common::backend(2);
    let per = f * h * w;
    let sigma = floats(&r["sigma"]);
    let conds: Vec<Conditioning> = (0..b)
        .map(|k| {
            let mut c = Conditioning::new(txt[k * lt * 24..(k + 1) * lt * 24].to_vec(), 24, lt as i64).unwrap();
            c.references = refs.clone();
            c
        })
        .collect();
    for k in 0..b {
        let x = &latent[k * per..(k + 1) * per];
        let got = den.denoise_batch(&backend, [w as i64, h as i64, f as i64, 1], sigma[k], &[Flux2Item { x, cond: &conds[k] }]).unwrap().remove(0);
        let want: Vec<f32> = x.iter().zip(&velocity[k * per..(k + 1) * per]).map(|(x, v)| x - sigma[k] * v).collect();
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-3, "sample {k}: max abs error {err}");
    }
    // A reference of the wrong channel count, and a method FLUX.2 does not place by, are named.
    let mut bad = conds[0].clone();
    bad.references = vec![Arc::new(ReferenceLatent { data: vec![0.0; 8 * 4], channels: 8, height: 2, width: 2 })];
    let x = &latent[..per];
    let e = den.denoise_batch(&backend, [w as i64, h as i64, f as i64, 1], 0.5, &[Flux2Item { x, cond: &bad }]).err().expect("channels");
    assert!(e.to_string().contains("FLUX.2 VAE"), "{e}");
    let mut offset = conds[0].clone();
    offset.reference_method = Some(ReferenceMethod::Offset);
    let e = den.denoise_batch(&backend, [w as i64, h as i64, f as i64, 1], 0.5, &[Flux2Item { x, cond: &offset }]).err().expect("method");
    assert!(e.to_string().contains("by index"), "{e}");
}
