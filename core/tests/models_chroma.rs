//! Chroma against diffusers' `ChromaTransformer2DModel` on tiny random weights in Chroma's
//! BFL-style names (fixtures from tests/fixtures/models/make_chroma.py; the weights are
//! regenerated here): the approximator's input, the model without a text mask (ComfyUI's)
//! and with T5 padding masked out of the keys, and the denoiser it runs in.

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::chroma::{approximator_input, Chroma, ChromaConfig, ChromaInputs};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::dit::{image_ids, unpatchify};
use sdflow_core::models::flux::{FluxDenoiser, FluxItem};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.2;

fn fixture() -> serde_json::Value {
    reference("chroma_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn tiny() -> (Weights, ChromaConfig) {
    let r = fixture();
    let w = det_weights(&r["keys"], SCALE, &common::backend(2));
    let mut cfg = ChromaConfig::infer(&w, "").unwrap();
    cfg.axes = serde_json::from_value(r["axes"].clone()).unwrap();
    (w, cfg)
}

fn shape() -> [usize; 4] {
    serde_json::from_value(fixture()["latent_shape"].clone()).unwrap()
}

fn forward(text_keys: Option<i64>) -> Vec<f32> {
    let r = fixture();
    let (w, cfg) = tiny();
    let model = Chroma::new(&w, "", cfg).unwrap();
    let [b, c, h, wd] = shape();
    let ctx = Context::new(8192, 8192).unwrap();
    let mut g = GraphRun::new(&ctx);
    let l = (h / 2) * (wd / 2);
    let img = g.input_f32(&[(c * 4) as i64, l as i64, b as i64], floats(&r["packed"])).unwrap();
    let lt = r["txt_len"].as_u64().unwrap() as usize;
    let txt_vals = floats(&r["txt"]);
    let txt = g.input_f32(&[(txt_vals.len() / (b * lt)) as i64, lt as i64, b as i64], txt_vals).unwrap();
    let img_ids: Vec<Vec<f32>> = image_ids(h / 2, wd / 2, 0.0).into_iter().map(|a| a.to_vec()).collect();
    let txt_ids = vec![vec![0.0; 3]; lt];
    let sigma = r["sigma"].as_f64().unwrap() as f32;
    let out = model.forward(&ctx, &mut g, &ChromaInputs { img, img_ids: &img_ids, img_wrap: &[], txt, txt_ids: &txt_ids, sigma, guidance: 0.0, text_keys, skip: &Default::default() }).unwrap();
    g.compute(&common::backend(2), &[out], 8192).unwrap().remove(0)
}

#[test]
fn approximator_input_matches_diffusers() {
    let r = fixture();
    let (_, cfg) = tiny();
    assert_eq!(cfg.mod_slots(), r["slots"].as_u64().unwrap() as usize);
    let got = approximator_input(r["sigma"].as_f64().unwrap() as f32, 0.0, cfg.mod_slots());
    let err = max_abs_err(&got, &floats(&r["approx_input"]));
    assert!(err <= 1e-4, "max abs error {err}");
}

#[test]
fn chroma_matches_diffusers() {
    let (_, cfg) = tiny();
    assert_eq!((cfg.in_channels, cfg.out_channels, cfg.hidden, cfg.heads, cfg.depth, cfg.depth_single, cfg.approx_hidden, cfg.approx_layers), (16, 16, 32, 2, 2, 2, 48, 2));
    let err = max_abs_err(&forward(None), &floats(&fixture()["plain"]));
    assert!(err <= 1e-3, "max abs error {err}");
}

#[test]
fn masked_text_keys_match_diffusers_attention_mask() {
    let r = fixture();
    let valid = r["valid"].as_i64().unwrap();
    let err = max_abs_err(&forward(Some(valid)), &floats(&r["masked"]));
    assert!(err <= 1e-3, "max abs error {err}");
    // All keys kept is no mask.
    assert_eq!(forward(Some(r["txt_len"].as_i64().unwrap())), forward(None));
}

#[test]
fn the_denoiser_runs_chroma_with_comfyuis_guidance() {
    let r = fixture();
    let (w, cfg) = tiny();
    let backend = common::backend(2);
    let mut den = FluxDenoiser::chroma(Chroma::new(&w, "", cfg).unwrap());
    assert_eq!(den.in_channels(), 16);
    let [b, c, h, wd] = shape();
    let latent = unpatchify(&floats(&r["packed"]), [b, c, h, wd], 2).unwrap();
    let per = c * h * wd;
    let lt = r["txt_len"].as_i64().unwrap();
    let txt = floats(&r["txt"]);
    let mk = |k: usize, g: Option<f32>| {
        let n = txt.len() / b;
        let mut cond = Conditioning::new(txt[k * n..(k + 1) * n].to_vec(), 32, lt).unwrap();
        // A pooled vector (a CLIP-L beside the T5) is not Chroma's: ignored.
        cond.pooled = Some(vec![1.0; 768]);
        cond.guidance = g.map_or(sdflow_core::models::conditioning::Guidance::Default, sdflow_core::models::conditioning::Guidance::Scale);
        cond
    };
    let sigma = r["sigma"].as_f64().unwrap() as f32;
    let shape = [wd as i64, h as i64, c as i64, 1];
    let (a, bb) = (mk(0, None), mk(1, None));
    let items = [FluxItem { x: &latent[..per], cond: &a, concat: None }, FluxItem { x: &latent[per..], cond: &bb, concat: None }];
    let d = den.denoise_batch(&backend, shape, sigma, &items).unwrap();
    let v = floats(&r["plain"]);
    for (k, dk) in d.iter().enumerate() {
        let vk = unpatchify(&v[k * per..(k + 1) * per], [1, c, h, wd], 2).unwrap();
        let want: Vec<f32> = latent[k * per..(k + 1) * per].iter().zip(&vk).map(|(x, v)| x - sigma * v).collect();
        let err = max_abs_err(dk, &want);
        assert!(err <= 1e-3, "item {k}: max abs error {err}");
    }
    // No guidance is ComfyUI's 0; FluxGuidance's value reaches the approximator.
    let zero = den.denoise_batch(&backend, shape, sigma, &[FluxItem { x: &latent[..per], cond: &mk(0, Some(0.0)), concat: None }]).unwrap().remove(0);
    assert!(max_abs_err(&zero, &d[0]) < 1e-6);
    let other = den.denoise_batch(&backend, shape, sigma, &[FluxItem { x: &latent[..per], cond: &mk(0, Some(4.0)), concat: None }]).unwrap().remove(0);
    assert!(max_abs_err(&other, &d[0]) > 1e-4);
}

#[test]
fn bad_files_are_named() {
    let r = fixture();
    let backend = common::backend(2);
    let mut keys: serde_json::Map<String, serde_json::Value> = serde_json::from_value(r["keys"].clone()).unwrap();
    keys.remove("distilled_guidance_layer.norms.1.scale");
    keys.remove("distilled_guidance_layer.layers.1.in_layer.weight");
    keys.remove("distilled_guidance_layer.layers.1.in_layer.bias");
    keys.remove("distilled_guidance_layer.layers.1.out_layer.weight");
    keys.remove("distilled_guidance_layer.layers.1.out_layer.bias");
    let w = det_weights(&serde_json::Value::Object(keys.clone()), SCALE, &backend);
    let mut cfg = ChromaConfig::infer(&w, "").unwrap();
    assert_eq!(cfg.approx_layers, 1);
    cfg.axes = vec![4, 4, 8];
    assert!(Chroma::new(&w, "", cfg.clone()).is_ok());
    keys.remove("single_blocks.1.linear2.bias");
    let w = det_weights(&serde_json::Value::Object(keys), SCALE, &backend);
    let e = Chroma::new(&w, "", cfg).err().expect("missing");
    assert!(e.to_string().contains("single_blocks.1.linear2.bias"), "{e}");
    let e = ChromaConfig::infer(&w, "model.diffusion_model.").err().expect("prefix");
    assert!(e.to_string().contains("not a Chroma model"), "{e}");
}
