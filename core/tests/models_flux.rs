//! FLUX.1 transformer against diffusers' `FluxTransformer2DModel` on tiny random weights in
//! BFL's single-file names (fixtures from tests/fixtures/models/make_flux.py; the weights are
//! regenerated here), and the 2×2 patch packing against `FluxPipeline`'s.

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::dit::{image_ids, patchify, unpatchify};
use sdflow_core::models::flux::{Flux, FluxConfig, FluxInputs};
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
    let model = Flux::new(w, "", config)?;
    let backend = common::backend(2);
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
    let inputs = FluxInputs { img, img_ids: &img_ids, img_wrap: &[], txt, txt_ids: &txt_ids, timesteps: &timesteps, guidance: guidance.then_some(gvals.as_slice()), y, skip: &Default::default() };
    let out = model.forward(&ctx, &mut g, &inputs)?;
    assert_eq!(out.ne(), [(c * 4) as i64, l as i64, b as i64, 1]);
    Ok(g.compute(&backend, &[out], 8192)?.remove(0))
}

fn tiny(variant: &str) -> (Weights, FluxConfig) {
    let r = fixture();
    let backend = common::backend(2);
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

#[test]
fn four_euler_steps_match_flux_pipeline() {
    use sdflow_core::models::flux::{FluxDenoiser, FluxItem};
    use sdflow_core::models::conditioning::Conditioning;
    use sdflow_core::sampling::flow::{flux_mu, linear_sigmas, FlowShift};
    use sdflow_core::sampling::{sample, CpuRng, Denoised, SampleOpts, Sampler};

    let r = fixture();
    let s = &r["sampling"];
    let [_, c, h, wd] = shape();
    // diffusers' calculate_shift on the packed sequence length is ComfyUI's ModelSamplingFlux
    // on the pixel size.
    let mu = flux_mu((wd * 8) as u32, (h * 8) as u32, 0.5, 1.15);
    assert!((mu - s["mu"].as_f64().unwrap()).abs() < 1e-12, "mu {mu}");
    let sigmas = linear_sigmas(FlowShift::Flux(mu), 4);
    assert!(max_abs_err(&sigmas, &floats(&s["sigmas"])) < 1e-6, "{sigmas:?}");

    let (w, cfg) = tiny("dev");
    let backend = common::backend(2);
    let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
    let lt = r["txt_len"].as_u64().unwrap() as i64;
    let txt = floats(&r["txt"]);
    let y = floats(&r["y"]);
    let mut cond = Conditioning::new(txt[..txt.len() / 2].to_vec(), 32, lt).unwrap();
    cond.pooled = Some(y[..y.len() / 2].to_vec());
    let latent_shape = [wd as i64, h as i64, c as i64, 1];
    let mut model = |x: &[f32], sigma: f32| -> Result<Denoised, sdflow_core::models::ModelError> {
        Ok(den.denoise_batch(&backend, latent_shape, sigma, &[FluxItem { x, cond: &cond, concat: None }])?.remove(0).into())
    };
    let noise = floats(&s["noise"]);
    let mut rng = CpuRng::new(0);
    let opts = SampleOpts { flow: true, ..SampleOpts::default() };
    let out = sample(Sampler::Euler, &mut model, noise, &sigmas, &mut rng, &opts, None).unwrap();
    let err = max_abs_err(&patchify(&out, [1, c, h, wd], 2).unwrap(), &floats(&s["final"]));
    assert!(err <= 1e-3, "4 steps: max abs error {err}");
}

#[test]
fn denoiser_batches_items_and_names_bad_inputs() {
    use sdflow_core::models::flux::{FluxDenoiser, FluxItem};
    use sdflow_core::models::conditioning::{Conditioning, Guidance};

    let (w, cfg) = tiny("dev");
    let backend = common::backend(2);
    let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
    let [_, c, h, wd] = shape();
    let x: Vec<f32> = (0..c * h * wd).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let shape = [wd as i64, h as i64, c as i64, 1];
    let mk = |tokens: i64, g: Option<f32>| {
        let mut k = Conditioning::new((0..tokens * 32).map(|i| ((i * 13 % 29) as f32) / 29.0 - 0.5).collect(), 32, tokens).unwrap();
        k.guidance = g.map_or(Guidance::Default, Guidance::Scale);
        k
    };
    let (a, b, long) = (mk(5, None), mk(5, Some(1.0)), mk(7, Some(3.5)));
    let alone: Vec<Vec<f32>> = [&a, &b, &long].iter().map(|k| den.denoise_batch(&backend, shape, 0.5, &[FluxItem { x: &x, cond: k, concat: None }]).unwrap().remove(0)).collect();
    let together = den.denoise_batch(&backend, shape, 0.5, &[FluxItem { x: &x, cond: &a, concat: None }, FluxItem { x: &x, cond: &long, concat: None }, FluxItem { x: &x, cond: &b, concat: None }]).unwrap();
    for (got, want) in together.iter().zip([&alone[0], &alone[2], &alone[1]]) {
        assert!(max_abs_err(got, want) < 1e-4);
    }
    // No guidance set is ComfyUI's 3.5; another value changes the prediction.
    let default = den.denoise_batch(&backend, shape, 0.5, &[FluxItem { x: &x, cond: &mk(5, Some(3.5)), concat: None }]).unwrap().remove(0);
    assert!(max_abs_err(&default, &alone[0]) < 1e-6);
    assert!(max_abs_err(&alone[0], &alone[1]) > 1e-3);

    let wide = Conditioning::new(vec![0.0; 64], 64, 1).unwrap();
    let e = den.denoise_batch(&backend, shape, 0.5, &[FluxItem { x: &x, cond: &wide, concat: None }]).err().expect("width");
    assert!(e.to_string().contains("T5-XXL"), "{e}");
    // An odd size is padded by wrapping around and cropped back, as ComfyUI's FLUX does.
    let (w1, h1) = (wd - 1, h - 1);
    let odd: Vec<f32> = (0..c * h1 * w1).map(|i| ((i * 53 % 97) as f32 / 48.0) - 1.0).collect();
    let got = den.denoise_batch(&backend, [w1 as i64, h1 as i64, c as i64, 1], 0.5, &[FluxItem { x: &odd, cond: &a, concat: None }]).unwrap().remove(0);
    let (padded, h2, w2) = sdflow_core::models::dit::pad_to_patches(&odd, [c, h1, w1], 2);
    let full = den.denoise_batch(&backend, [w2 as i64, h2 as i64, c as i64, 1], 0.5, &[FluxItem { x: &padded, cond: &a, concat: None }]).unwrap().remove(0);
    assert!(max_abs_err(&got, &sdflow_core::models::dit::crop(&full, [c, h2, w2], h1, w1)) < 1e-5);
    let e = den.denoise_batch(&backend, [wd as i64, h as i64, 16, 1], 0.5, &[FluxItem { x: &x, cond: &a, concat: None }]).err().expect("channels");
    assert!(e.to_string().contains("output features"), "{e}");
}

#[test]
fn kontext_references_match_comfyuis_layout_through_diffusers() {
    use sdflow_core::models::conditioning::{Conditioning, Guidance, ReferenceLatent};
    use sdflow_core::models::flux::{reference_tokens, FluxDenoiser, FluxItem};
    use std::sync::Arc;

    let r = fixture();
    let k = &r["kontext"];
    let [_, c, h, wd] = shape();
    let refs: Vec<Arc<ReferenceLatent>> = k["refs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(k["ref_shapes"].as_array().unwrap())
        .map(|(v, s)| {
            let s: Vec<usize> = serde_json::from_value(s.clone()).unwrap();
            Arc::new(ReferenceLatent { data: floats(v), channels: s[1], height: s[2], width: s[3] })
        })
        .collect();
    let ids: Vec<Vec<f32>> = serde_json::from_value(k["ids"].clone()).unwrap();
    assert_eq!(reference_tokens(&refs, Default::default(), (h / 2, wd / 2), 0).unwrap().1, ids, "ComfyUI's offset ids");
    // ComfyUI's other methods (comfy/ldm/flux/model.py): `index` numbers the references at
    // the origin; `uxo` puts each at index 0 past the image (4×6 patches here) and the
    // references before it, diagonally, its offsets in latent pixels halved rounding up.
    let grid = |index: f32, rows: usize, cols: usize, dr: usize, dc: usize| -> Vec<Vec<f32>> {
        (0..rows).flat_map(|y| (0..cols).map(move |x| vec![index, (y + dr) as f32, (x + dc) as f32])).collect()
    };
    use sdflow_core::models::conditioning::ReferenceMethod;
    let (r0, r1) = ((refs[0].height / 2, refs[0].width / 2), (refs[1].height / 2, refs[1].width / 2));
    let index = [grid(1.0, r0.0, r0.1, 0, 0), grid(2.0, r1.0, r1.1, 0, 0)].concat();
    assert_eq!(reference_tokens(&refs, ReferenceMethod::Index, (h / 2, wd / 2), 0).unwrap().1, index);
    let (ph, pw) = (h / 2, wd / 2);
    let uxo = [grid(0.0, r0.0, r0.1, ph, pw), grid(0.0, r1.0, r1.1, (ph * 2 + refs[0].height).div_ceil(2), (pw * 2 + refs[0].width).div_ceil(2))].concat();
    assert_eq!(reference_tokens(&refs, ReferenceMethod::Uxo, (h / 2, wd / 2), 0).unwrap().1, uxo);
    // sd.cpp's placement: ComfyUI's rule, the second reference's offset in latent pixels.
    let offset = reference_tokens(&refs, ReferenceMethod::Offset, (h / 2, wd / 2), 0).unwrap().1;
    let latent = reference_tokens(&refs, ReferenceMethod::OffsetLatent, (h / 2, wd / 2), 0).unwrap().1;
    let n0 = r0.0 * r0.1;
    assert_eq!(latent[..n0], offset[..n0], "the first reference sits at the origin either way");
    let (first, second) = (&offset[n0], &latent[n0]);
    assert_eq!(first[0], 1.0);
    assert_eq!((second[1] + second[2]) as usize, (refs[0].height * (first[1] > 0.0) as usize + refs[0].width * (first[2] > 0.0) as usize), "{first:?} {second:?}");

    let (w, cfg) = tiny("dev");
    let backend = common::backend(2);
    let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
    let lt = r["txt_len"].as_u64().unwrap() as i64;
    let (txt, y) = (floats(&r["txt"]), floats(&r["y"]));
    let mut cond = Conditioning::new(txt[..txt.len() / 2].to_vec(), 32, lt).unwrap();
    cond.pooled = Some(y[..y.len() / 2].to_vec());
    cond.guidance = Guidance::Scale(k["guidance"].as_f64().unwrap() as f32);
    cond.references = refs.clone();
    let x = floats(&r["latent"])[..c * h * wd].to_vec();
    let sigma = k["sigma"].as_f64().unwrap() as f32;
    let d = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], sigma, &[FluxItem { x: &x, cond: &cond, concat: None }]).unwrap().remove(0);
    let v: Vec<f32> = x.iter().zip(&d).map(|(x, d)| (x - d) / sigma).collect();
    let err = max_abs_err(&patchify(&v, [1, c, h, wd], 2).unwrap(), &floats(&k["velocity"]));
    assert!(err <= 1e-3, "Kontext: max abs error {err}");
    // Without the references the prediction differs; a reference of other channels is an error.
    cond.references.clear();
    let plain = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], sigma, &[FluxItem { x: &x, cond: &cond, concat: None }]).unwrap().remove(0);
    assert!(max_abs_err(&plain, &d) > 1e-3);
    cond.references = vec![Arc::new(ReferenceLatent { data: vec![0.0; 2 * 4 * 4], channels: 2, height: 4, width: 4 })];
    let e = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], sigma, &[FluxItem { x: &x, cond: &cond, concat: None }]).err().expect("channels");
    assert!(e.to_string().contains("reference latent"), "{e}");
}

#[test]
fn fill_matches_flux_fill_pipeline() {
    use sdflow_core::models::conditioning::{Conditioning, Guidance};
    use sdflow_core::models::flux::{fill_concat, FluxDenoiser, FluxItem, LATENT_SCALE, LATENT_SHIFT};

    let r = reference("flux_fill_ref.json");
    let backend = common::backend(2);
    let w = det_weights(&r["keys"], SCALE, &backend);
    let mut cfg = FluxConfig::infer(&w, "").unwrap();
    cfg.axes = serde_json::from_value(fixture()["axes"].clone()).unwrap();
    let [_, c, h, wd]: [usize; 4] = serde_json::from_value(r["shape"].clone()).unwrap();
    assert_eq!((cfg.in_channels, cfg.out_channels), (((c + c + 64) * 4) as i64, (c * 4) as i64));
    let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
    let image: Vec<f32> = floats(&r["image"]).iter().map(|v| (v - LATENT_SHIFT) * LATENT_SCALE).collect();
    let concat = fill_concat(&image, c, &floats(&r["mask"]), h, wd).unwrap();
    let lt = r["txt_len"].as_u64().unwrap() as i64;
    let txt = floats(&r["txt"]);
    let mut cond = Conditioning::new(txt, (floats(&fixture()["txt"]).len() / (2 * 5)) as i64, lt).unwrap();
    cond.pooled = Some(floats(&r["y"]));
    cond.guidance = Guidance::Scale(r["guidance"].as_f64().unwrap() as f32);
    let x = floats(&r["latent"]);
    let sigma = r["sigma"].as_f64().unwrap() as f32;
    let shape = [wd as i64, h as i64, c as i64, 1];
    let d = den.denoise_batch(&backend, shape, sigma, &[FluxItem { x: &x, cond: &cond, concat: Some(&concat) }]).unwrap().remove(0);
    let want: Vec<f32> = x.iter().zip(floats(&r["velocity"])).map(|(x, v)| x - sigma * v).collect();
    let err = max_abs_err(&d, &want);
    assert!(err <= 1e-3, "max abs error {err}");
    // Without its extra channels a Fill model names what it lacks; a plain model refuses them.
    let e = den.denoise_batch(&backend, shape, sigma, &[FluxItem { x: &x, cond: &cond, concat: None }]).err().expect("no concat");
    assert!(e.to_string().contains("InpaintModelConditioning"), "{e}");
    assert!(fill_concat(&image, c, &floats(&r["mask"])[1..], h, wd).is_err());
}

/// ComfyUI's FluxDisableGuidance: with the guidance off a dev model skips its guidance
/// embedder, so it computes what the same weights without `guidance_in` (schnell's keys,
/// the generator's values by name) compute; a scale still changes the result.
#[test]
fn disabled_guidance_leaves_the_embedder_out() {
    use sdflow_core::models::conditioning::{Conditioning, Guidance};
    use sdflow_core::models::flux::{FluxDenoiser, FluxItem};
    let backend = common::backend(2);
    let [_, c, h, wd] = shape();
    let x: Vec<f32> = (0..c * h * wd).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let shape = [wd as i64, h as i64, c as i64, 1];
    let mut cond = Conditioning::new((0..5 * 32).map(|i| ((i * 13 % 29) as f32) / 29.0 - 0.5).collect(), 32, 5).unwrap();
    cond.pooled = Some(vec![0.25; 32]);
    let run = |variant: &str, g: Guidance| {
        let (w, cfg) = tiny(variant);
        let mut den = FluxDenoiser::new(Flux::new(&w, "", cfg).unwrap());
        let k = Conditioning { guidance: g, ..cond.clone() };
        den.denoise_batch(&backend, shape, 0.5, &[FluxItem { x: &x, cond: &k, concat: None }]).unwrap().remove(0)
    };
    let off = run("dev", Guidance::Off);
    assert!(max_abs_err(&off, &run("schnell", Guidance::Default)) < 1e-6);
    assert!(max_abs_err(&off, &run("dev", Guidance::Scale(3.5))) > 1e-4);
}

/// A diffusers-named FLUX.1 dev (each tensor made from BFL's rows as diffusers' own
/// converter places them: make_dit_diffusers_maps.py) loads as BFL's names, fused and
/// reordered back, and computes what diffusers' `FluxTransformer2DModel` computes.
#[test]
fn diffusers_names_load_as_bfl() {
    use common::det_values;
    use sdflow_core::dtype::DType;
    use sdflow_core::io::TypeRules;
    use sdflow_core::models::flux::diffusers::bfl_layout;
    use sdflow_core::models::load::load_weights;
    use std::collections::BTreeMap;
    let r = fixture();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["dev"]["keys"].clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flux1-dev-diffusers.safetensors");
    let values = |name: &str| det_values(name, keys[name].iter().product(), SCALE);
    let tensors = common::write_diffusers_file(&path, "flux_diffusers_map.json", "transformer.", &keys, &values);

    let src = bfl_layout(sdflow_core::io::open(&path).unwrap()).unwrap();
    let names: std::collections::BTreeSet<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, keys.keys().map(String::as_str).collect(), "every BFL tensor, nothing else");
    for (name, shape) in &keys {
        let got = src.read(name).unwrap();
        let want: Vec<u8> = det_values(name, shape.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(&got[..], &want[..], "{name} is BFL's tensor bit for bit");
        assert_eq!(&src.get(name).unwrap().shape, shape);
    }
    let backend = common::backend(2);
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::F32), "").unwrap()).unwrap();
    let mut cfg = FluxConfig::infer(&w, "").unwrap();
    cfg.axes = serde_json::from_value(r["axes"].clone()).unwrap();
    let err = max_abs_err(&run(&w, cfg, true).unwrap(), &floats(&r["dev"]["out"]));
    assert!(err <= 1e-3, "max abs error {err}");
    // A file missing one of the parts of a fused tensor is named.
    let short = dir.path().join("short.safetensors");
    sdflow_core::io::safetensors::write(&short, tensors.iter().filter(|t| t.0 != "transformer.transformer_blocks.0.attn.to_k.weight").map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let e = bfl_layout(sdflow_core::io::open(&short).unwrap()).err().expect("a missing part");
    assert!(e.to_string().contains("transformer.transformer_blocks.0.attn.to_k.weight"), "{e}");
}
