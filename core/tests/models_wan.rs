//! Wan video transformers against diffusers' `WanTransformer3DModel` on tiny random
//! weights in the Wan release's names (fixtures from tests/fixtures/models/make_wan.py; the
//! weights are regenerated here and written as files with the 5-D patch kernel): Wan 2.1
//! T2V (one video and a batch of two at different timesteps, and through the denoiser),
//! I2V with CLIP-vision tokens and the mask/image channels, Wan 2.2 TI2V's per-token
//! timesteps, VACE's control blocks, the same model read from diffusers' names, and four
//! sampling steps against diffusers' flow-matching Euler scheduler.

mod common;

use common::{det_values, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::io::TypeRules;
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::dit::{channel_major, frame_of, patchify, unpatchify_hwc};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::wan::{layout, Variant, Wan, WanConfig, WanDenoiser, WanInputs, WanItem};
use sdflow_core::models::Weights;
use std::collections::BTreeMap;

const SCALE: f64 = 0.25;

fn fixture() -> serde_json::Value {
    reference("wan_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn dims(v: &serde_json::Value) -> Vec<usize> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The case's weights written as a file (the release's names under `prefix`, or diffusers'
/// names when `diffusers`), opened through [`layout`] and loaded in f32.
fn weights(case: &str, prefix: &str, diffusers: bool, backend: &Backend) -> Weights {
    let r = fixture();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r[case]["keys"].clone()).unwrap();
    let to_diffusers: BTreeMap<String, String> = serde_json::from_value::<BTreeMap<String, String>>(r[case]["diffusers_names"].clone()).unwrap().into_iter().map(|(d, w)| (w, d)).collect();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .map(|(name, shape)| {
            let v = det_values(name, shape.iter().product(), SCALE);
            let stored = if diffusers { to_diffusers[name].clone() } else { name.clone() };
            (format!("{prefix}{stored}"), shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wan.safetensors");
    sdflow_core::io::safetensors::write(&path, data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let src = layout(sdflow_core::io::open(&path).unwrap()).unwrap();
    load_weights(backend, src.as_ref(), &[""], &TypeRules::none()).unwrap()
}

/// A case's text features as a conditioning.
fn text(c: &serde_json::Value) -> Conditioning {
    let cs = dims(&c["context_shape"]);
    Conditioning::new(floats(&c["context"]), cs[2] as i64, cs[1] as i64).unwrap()
}

fn config(w: &Weights, prefix: &str) -> WanConfig {
    let mut cfg = WanConfig::infer(w, prefix).unwrap();
    // The tiny heads are 24 wide; released models' are 128 (what `infer` assumes).
    cfg.heads = 2;
    cfg
}

/// Video tokens of a [B, C, T, H, W] latent, frame by frame: what the patch kernel reads.
fn tokens(latent: &[f32], [b, c, t, h, w]: [usize; 5]) -> Vec<f32> {
    let per = c * t * h * w;
    (0..b).flat_map(|i| (0..t).flat_map(move |f| patchify(&frame_of(&latent[i * per..(i + 1) * per], c, t, h * w, f), [1, c, h, w], 2).unwrap())).collect()
}

/// The model's output on a case's inputs, as a [B, C, T, H, W] latent.
fn run(case: &str, w: &Weights, prefix: &str) -> Vec<f32> {
    let r = fixture();
    let c = &r[case];
    let [b, ch, t, h, wd] = dims(&c["latent_shape"])[..] else { panic!() };
    let model = Wan::new(w, prefix, config(w, prefix)).unwrap();
    let out_ch = model.config.out_channels as usize;
    let backend = common::backend(2);
    let ctx = Context::new(16384, 16384).unwrap();
    let mut g = GraphRun::new(&ctx);
    let (rows, cols) = (h / 2, wd / 2);
    let x = g.input_f32(&[(ch * 4) as i64, (t * rows * cols) as i64, b as i64], tokens(&floats(&c["latent"]), [b, ch, t, h, wd])).unwrap();
    let cs = dims(&c["context_shape"]);
    let context = g.input_f32(&[cs[2] as i64, cs[1] as i64, b as i64], floats(&c["context"])).unwrap();
    let image = if c.get("image").is_some() {
        let is = dims(&c["image_shape"]);
        Some(g.input_f32(&[is[2] as i64, is[1] as i64, b as i64], floats(&c["image"])).unwrap())
    } else {
        None
    };
    let timesteps = floats(&c["timestep"]);
    let out = model.forward(&ctx, &mut g, &WanInputs { x, frames: t as i64, rows: rows as i64, cols: cols as i64, context, image, timesteps: &timesteps, vace: &[] }).unwrap();
    let v = g.compute(&backend, &[out], 16384).unwrap().remove(0);
    channel_major(&unpatchify_hwc(&v, [b * t, out_ch, h, wd], 2).unwrap(), out_ch, t, h * wd)
}

fn check(case: &str, got: &[f32]) {
    let err = max_abs_err(got, &floats(&fixture()[case]["out"]));
    assert!(err <= 1e-3, "{case}: max abs error {err}");
}

#[test]
fn t2v_matches_diffusers() {
    let backend = common::backend(2);
    let w = weights("t2v", "model.diffusion_model.", false, &backend);
    let cfg = config(&w, "model.diffusion_model.");
    assert_eq!((cfg.in_channels, cfg.out_channels, cfg.dim, cfg.ffn, cfg.layers, cfg.text_dim, cfg.freq_dim), (16, 16, 48, 64, 2, 32, 256));
    assert_eq!((cfg.variant(), cfg.axes()), (Variant::T2v, vec![8, 8, 8]));
    check("t2v", &run("t2v", &w, "model.diffusion_model."));
    // Two videos at their own timesteps in one graph.
    check("t2v_batch2", &run("t2v_batch2", &w, "model.diffusion_model."));
}

#[test]
fn reads_diffusers_names() {
    let backend = common::backend(2);
    let w = weights("t2v", "transformer.", true, &backend);
    check("t2v", &run("t2v", &w, ""));
}

#[test]
fn i2v_matches_diffusers() {
    let backend = common::backend(2);
    let w = weights("i2v", "", false, &backend);
    let cfg = config(&w, "");
    assert_eq!((cfg.in_channels, cfg.out_channels, cfg.image_dim, cfg.image_positions, cfg.variant()), (36, 16, Some(32), false, Variant::I2v));
    check("i2v", &run("i2v", &w, ""));
}

/// Wan 2.2 TI2V: a timestep per token (the given first frame's at 0).
#[test]
fn ti2v_takes_a_timestep_per_token() {
    let backend = common::backend(2);
    let w = weights("ti2v", "", false, &backend);
    assert_eq!(config(&w, "").in_channels, 48);
    check("ti2v", &run("ti2v", &w, ""));
    // Through the denoiser: each frame at its share of σ (the given first frame at 0, the
    // noise mask's mean), the velocity read back from the denoised latent.
    let r = fixture();
    let c = &r["ti2v"];
    let mut den = WanDenoiser::new(Wan::new(&w, "", config(&w, "")).unwrap());
    assert!(den.config().frame_timesteps());
    let [_, ch, t, h, wd] = dims(&c["latent_shape"])[..] else { panic!() };
    den.frames = t;
    den.frame_levels = Some(vec![0.0, 1.0, 1.0]);
    let x = floats(&c["latent"]);
    let cond = text(c);
    let sigma = 0.7;
    let shape = [wd as i64, h as i64, (ch * t) as i64, 1];
    let d = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }]).unwrap().remove(0);
    let v: Vec<f32> = x.iter().zip(&d).map(|(x, d)| (x - d) / sigma).collect();
    check("ti2v", &v);
    // Levels that do not cover every frame are refused by name.
    den.frame_levels = Some(vec![0.0, 1.0]);
    let e = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }]).unwrap_err().to_string();
    assert!(e.contains("frame noise levels"), "{e}");
}

/// The denoiser feeds σ·1000 and reads the velocity: `denoised = x − σ·v`, with the
/// latent's frames inside its channels.
#[test]
fn denoiser_reads_velocity_at_sigma_times_1000() {
    let r = fixture();
    let c = &r["t2v"];
    let backend = common::backend(2);
    let w = weights("t2v", "", false, &backend);
    let mut den = WanDenoiser::new(Wan::new(&w, "", config(&w, "")).unwrap());
    let [_, ch, t, h, wd] = dims(&c["latent_shape"])[..] else { panic!() };
    den.frames = t;
    let x = floats(&c["latent"]);
    let cond = text(c);
    let sigma = floats(&c["timestep"])[0] / 1000.0;
    let shape = [wd as i64, h as i64, (ch * t) as i64, 1];
    let d = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }]).unwrap().remove(0);
    let v: Vec<f32> = x.iter().zip(&d).map(|(x, d)| (x - d) / sigma).collect();
    check("t2v", &v);
    // A latent whose channels are not the model's × its frames is refused by name.
    den.frames = t + 1;
    let e = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }]).unwrap_err().to_string();
    assert!(e.contains("frames") && e.contains("16 latent channels"), "{e}");
}

/// Bad inputs are refused with the reason: an I2V model without its image channels or
/// CLIP-vision features, a T2V model given them.
#[test]
fn refuses_missing_or_extra_image_inputs() {
    let r = fixture();
    let backend = common::backend(2);
    let w = weights("i2v", "", false, &backend);
    let mut den = WanDenoiser::new(Wan::new(&w, "", config(&w, "")).unwrap());
    den.frames = 3;
    let c = &r["t2v"];
    let x = floats(&c["latent"]);
    let cond = Conditioning::new(floats(&c["context"]), 32, 7).unwrap();
    let shape = [6, 4, 48, 1];
    let e = den.denoise_batch(&backend, shape, 0.5, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }]).unwrap_err().to_string();
    assert!(e.contains("36 input channels"), "{e}");
    let narrow = Conditioning::new(vec![0.0; 16 * 7], 16, 7).unwrap();
    let e = den.denoise_batch(&backend, shape, 0.5, &[WanItem { x: &x, cond: &narrow, concat: None, image: None, vace: &[] }]).unwrap_err().to_string();
    assert!(e.contains("UMT5"), "{e}");
    let concat = vec![0.0; 20 * 3 * 24];
    let e = den.denoise_batch(&backend, shape, 0.5, &[WanItem { x: &x, cond: &cond, concat: Some(&concat), image: None, vace: &[] }]).unwrap_err().to_string();
    assert!(e.contains("CLIP-vision"), "{e}");
    let t2v = weights("t2v", "", false, &backend);
    let mut den = WanDenoiser::new(Wan::new(&t2v, "", config(&t2v, "")).unwrap());
    den.frames = 3;
    let e = den.denoise_batch(&backend, shape, 0.5, &[WanItem { x: &x, cond: &cond, concat: Some(&concat), image: None, vace: &[] }]).unwrap_err().to_string();
    assert!(e.contains("text-to-video"), "{e}");
}

/// Wan VACE: the control through its patch embedding and the VACE blocks after blocks 0
/// and 2 (the first adding the video's embedding), each hint added at the strength;
/// through the model and through the denoiser, in the release's and diffusers' names.
#[test]
fn vace_matches_diffusers() {
    use sdflow_core::models::wan::{VaceInput, VaceTokens};
    let r = fixture();
    let c = &r["vace"];
    let backend = common::backend(2);
    for diffusers in [false, true] {
        let w = weights("vace", "", diffusers, &backend);
        let cfg = config(&w, "");
        assert_eq!((cfg.layers, cfg.vace_layers, cfg.vace_in_channels), (4, 2, 96));
        assert_eq!((0..4).map(|i| cfg.vace_after(i)).collect::<Vec<_>>(), vec![Some(0), None, Some(1), None]);
        let [_, ch, t, h, wd] = dims(&c["latent_shape"])[..] else { panic!() };
        let strength = c["strength"].as_f64().unwrap() as f32;
        let model = Wan::new(&w, "", cfg.clone()).unwrap();
        let ctx = Context::new(16384, 16384).unwrap();
        let mut g = GraphRun::new(&ctx);
        let (rows, cols) = (h / 2, wd / 2);
        let x = g.input_f32(&[(ch * 4) as i64, (t * rows * cols) as i64, 1], tokens(&floats(&c["latent"]), [1, ch, t, h, wd])).unwrap();
        let control = g.input_f32(&[96 * 4, (t * rows * cols) as i64, 1], tokens(&floats(&c["control"]), [1, 96, t, h, wd])).unwrap();
        let cs = dims(&c["context_shape"]);
        let context = g.input_f32(&[cs[2] as i64, cs[1] as i64, 1], floats(&c["context"])).unwrap();
        let timesteps = floats(&c["timestep"]);
        let vace = [VaceTokens { tokens: control, strength: g.input_f32(&[1, 1, 1], vec![strength]).unwrap() }];
        let out = model.forward(&ctx, &mut g, &WanInputs { x, frames: t as i64, rows: rows as i64, cols: cols as i64, context, image: None, timesteps: &timesteps, vace: &vace }).unwrap();
        let v = g.compute(&backend, &[out], 16384).unwrap().remove(0);
        check("vace", &channel_major(&unpatchify_hwc(&v, [t, ch, h, wd], 2).unwrap(), ch, t, h * wd));

        // Through the denoiser, the control as a VaceInput.
        let mut den = WanDenoiser::new(Wan::new(&w, "", cfg).unwrap());
        den.frames = t;
        let cond = text(c);
        let x = floats(&c["latent"]);
        let controls = [VaceInput { data: floats(&c["control"]), strength }];
        let sigma = timesteps[0] / 1000.0;
        let shape = [wd as i64, h as i64, (ch * t) as i64, 1];
        let d = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &controls }]).unwrap().remove(0);
        let v: Vec<f32> = x.iter().zip(&d).map(|(x, d)| (x - d) / sigma).collect();
        check("vace", &v);
        // A VACE model without a control, and a control of the wrong size, are refused.
        let e = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &[] }]).unwrap_err().to_string();
        assert!(e.contains("VACE") && e.contains("none was given"), "{e}");
        let short = [VaceInput { data: vec![0.0; 10], strength }];
        let e = den.denoise_batch(&backend, shape, sigma, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &short }]).unwrap_err().to_string();
        assert!(e.contains("VACE control of 10 values"), "{e}");
    }
    // A control for a model without VACE blocks is refused by name.
    let t2v = weights("t2v", "", false, &backend);
    let mut den = WanDenoiser::new(Wan::new(&t2v, "", config(&t2v, "")).unwrap());
    den.frames = 3;
    let x = floats(&r["t2v"]["latent"]);
    let cond = Conditioning::new(floats(&r["t2v"]["context"]), 32, 7).unwrap();
    let controls = [VaceInput { data: vec![0.0; 0], strength: 1.0 }];
    let e = den.denoise_batch(&backend, [6, 4, 48, 1], 0.5, &[WanItem { x: &x, cond: &cond, concat: None, image: None, vace: &controls }]).unwrap_err().to_string();
    assert!(e.contains("VACE"), "{e}");
}

/// Four steps of sampling against the reference pipeline's: diffusers'
/// FlowMatchEulerDiscreteScheduler (shift 5) driving the tiny T2V model from a fixed latent,
/// and sdflow's euler sampler over the same sigmas through the WanDenoiser (σ·1000 in,
/// velocity out): the same latent after every step's rounding (≤ 1e-3).
#[test]
fn four_steps_match_the_reference_scheduler() {
    use sdflow_core::sampling::rng::CpuRng;
    use sdflow_core::sampling::samplers::{sample, Denoised, SampleOpts, Sampler};
    let r = fixture();
    let c = &r["sample4"];
    let backend = common::backend(2);
    let w = weights("t2v", "", false, &backend);
    let mut den = WanDenoiser::new(Wan::new(&w, "", config(&w, "")).unwrap());
    let [_, ch, t, h, wd] = dims(&c["latent_shape"])[..] else { panic!() };
    den.frames = t;
    let cond = text(c);
    let sigmas = floats(&c["sigmas"]);
    assert_eq!(sigmas.len(), 5);
    let shape = [wd as i64, h as i64, (ch * t) as i64, 1];
    let mut calls = 0;
    let mut model = |x: &[f32], sigma: f32| -> Result<Denoised, sdflow_core::models::ModelError> {
        calls += 1;
        Ok(den.denoise_batch(&backend, shape, sigma, &[WanItem { x, cond: &cond, concat: None, image: None, vace: &[] }])?.remove(0).into())
    };
    let opts = SampleOpts { flow: true, ..SampleOpts::default() };
    let out = sample(Sampler::Euler, &mut model, floats(&c["latent"]), &sigmas, &mut CpuRng::new(0), &opts, None).unwrap();
    assert_eq!(calls, 4);
    check("sample4", &out);
}
