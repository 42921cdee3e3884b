//! FLUX.1 transformer against diffusers' `FluxTransformer2DModel` on tiny random weights in
//! BFL's single-file names (fixtures from tests/fixtures/models/make_flux.py; the weights are
//! regenerated here), and the 2×2 patch packing against `FluxPipeline`'s.

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::dit::{image_ids, patchify, unpatchify};
use sdflow_core::models::flux::{find_prefix, Flux, FluxConfig, FluxInputs};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.2;

fn fixture() -> serde_json::Value {
    reference("flux_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn shape() -> [usize; 4] {
    serde_json::from_value(fixture()["latent_shape"].clone()).unwrap()
}

/// The model's output on the fixture's inputs, packing the latent ourselves.
fn run(w: &Weights, config: FluxConfig, guidance: bool) -> sdflow_core::models::Result<Vec<f32>> {
    let r = fixture();
    let [b, c, h, wd] = shape();
    let model = Flux::new(w, &find_prefix(w).unwrap(), config)?;
    let backend = Backend::cpu(2).unwrap();
    let ctx = Context::new(8192, 8192).unwrap();
    let mut g = GraphRun::new(&ctx);
    let l = (h / 2) * (wd / 2);
    let img = g.input_f32(&[(c * 4) as i64, l as i64, b as i64], patchify(&floats(&r["latent"]), [b, c, h, wd], 2)?)?;
    let lt = r["txt_len"].as_u64().unwrap() as usize;
    let txt_vals = floats(&r["txt"]);
    let txt = g.input_f32(&[(txt_vals.len() / (b * lt)) as i64, lt as i64, b as i64], txt_vals)?;
    let y_vals = floats(&r["y"]);
    let y = g.input_f32(&[(y_vals.len() / b) as i64, b as i64], y_vals)?;
    let img_ids: Vec<Vec<f32>> = image_ids(h / 2, wd / 2, 0.0).into_iter().map(|a| a.to_vec()).collect();
    let txt_ids = vec![vec![0.0; 3]; lt];
    let timesteps = floats(&r["sigma"]);
    let gvals = floats(&r["guidance"]);
    let inputs = FluxInputs { img, img_ids: &img_ids, txt, txt_ids: &txt_ids, timesteps: &timesteps, guidance: guidance.then_some(gvals.as_slice()), y };
    let out = model.forward(&ctx, &mut g, &inputs)?;
    assert_eq!(out.ne(), [(c * 4) as i64, l as i64, b as i64, 1]);
    Ok(g.compute(&backend, &[out], 8192)?.remove(0))
}

fn tiny(variant: &str) -> (Weights, FluxConfig) {
    let r = fixture();
    let backend = Backend::cpu(2).unwrap();
    let w = det_weights(&r[variant]["keys"], SCALE, &backend);
    let mut cfg = FluxConfig::infer(&w, "").unwrap();
    cfg.axes = serde_json::from_value(r["axes"].clone()).unwrap();
    (w, cfg)
}

#[test]
fn packing_matches_flux_pipeline() {
    let r = fixture();
    let [b, c, h, w] = shape();
    let latent = floats(&r["latent"]);
    let packed = patchify(&latent, [b, c, h, w], 2).unwrap();
    assert_eq!(packed, floats(&r["packed"]));
    assert_eq!(unpatchify(&packed, [b, c, h, w], 2).unwrap(), latent);
    let ids: Vec<Vec<f32>> = serde_json::from_value(r["img_ids"].clone()).unwrap();
    assert_eq!(image_ids(h / 2, w / 2, 0.0).into_iter().map(|a| a.to_vec()).collect::<Vec<_>>(), ids);
    assert!(patchify(&latent, [b, c, h + 1, w], 2).is_err(), "odd size");
    assert!(patchify(&latent[1..], [b, c, h, w], 2).is_err(), "short");
}

#[test]
fn dev_matches_diffusers() {
    let (w, cfg) = tiny("dev");
    assert_eq!((cfg.in_channels, cfg.out_channels, cfg.hidden, cfg.heads, cfg.mlp_hidden, cfg.context, cfg.vector, cfg.depth, cfg.depth_single), (16, 16, 32, 2, 128, 32, 32, 2, 2));
    assert!(cfg.guidance_embed);
    let got = run(&w, cfg, true).unwrap();
    let err = max_abs_err(&got, &floats(&fixture()["dev"]["out"]));
    assert!(err <= 1e-3, "dev: max abs error {err}");
}

#[test]
fn schnell_matches_diffusers() {
    let (w, cfg) = tiny("schnell");
    assert!(!cfg.guidance_embed);
    let got = run(&w, cfg.clone(), false).unwrap();
    let err = max_abs_err(&got, &floats(&fixture()["schnell"]["out"]));
    assert!(err <= 1e-3, "schnell: max abs error {err}");
    // schnell ignores a guidance value, as sd.cpp and ComfyUI do.
    assert_eq!(run(&w, cfg, true).unwrap(), got);
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let (w, cfg) = tiny("dev");
    let e = run(&w, cfg.clone(), false).err().expect("dev without guidance");
    assert!(e.to_string().contains("embeds guidance"), "{e}");
    let mut axes = cfg.clone();
    axes.axes = vec![16, 56, 56];
    let e = Flux::new(&w, "", axes).err().expect("axes");
    assert!(e.to_string().contains("rotary axes"), "{e}");
    let mut wrong = cfg;
    wrong.mlp_hidden = 96;
    let e = Flux::new(&w, "", wrong).err().expect("shape");
    assert!(e.to_string().contains("img_mlp.0.weight"), "{e}");
    let (sw, _) = tiny("schnell");
    let e = FluxConfig::infer(&sw, "model.diffusion_model.").err().expect("prefix");
    assert!(e.to_string().contains("not a FLUX.1 transformer"), "{e}");
}
