//! Z-Image transformer against diffusers' `ZImageTransformer2DModel` on tiny random weights
//! in the single-file release's names (fixtures from tests/fixtures/models/make_z_image.py;
//! the weights are regenerated here), the same model read from diffusers' names, and the
//! denoiser's time and sign conventions.

mod common;

use common::{det_values, det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::conditioning::Conditioning;
use sdflow_core::models::dit::{patchify_hwc, unpatchify_hwc};
use sdflow_core::models::z_image::{ZImage, ZImageConfig, ZImageDenoiser, ZImageInputs, ZImageItem};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.2;

fn fixture() -> serde_json::Value {
    reference("z_image_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn shape() -> [usize; 4] {
    serde_json::from_value(fixture()["latent_shape"].clone()).unwrap()
}

fn config(w: &Weights) -> ZImageConfig {
    let mut cfg = ZImageConfig::infer(w, "").unwrap();
    cfg.axes = serde_json::from_value(fixture()["axes"].clone()).unwrap();
    cfg
}

/// The model's output on the fixture's inputs (as a [B, C, H, W] latent).
fn run(w: &Weights, cfg: ZImageConfig) -> sdflow_core::models::Result<Vec<f32>> {
    let r = fixture();
    let [b, c, h, wd] = shape();
    let model = ZImage::new(w, "", cfg)?;
    let backend = common::backend(2);
    let ctx = Context::new(16384, 16384).unwrap();
    let mut g = GraphRun::new(&ctx);
    let (rows, cols) = (h / 2, wd / 2);
    let img = g.input_f32(&[(c * 4) as i64, (rows * cols) as i64, b as i64], patchify_hwc(&floats(&r["latent"]), [b, c, h, wd], 2)?)?;
    let lc = r["cap_len"].as_u64().unwrap() as usize;
    let cap1 = floats(&r["cap"]);
    let width = cap1.len() / lc;
    let cap = g.input_f32(&[width as i64, lc as i64, b as i64], cap1.repeat(b))?;
    let timesteps: Vec<f32> = floats(&r["t"]).iter().map(|t| t * 1000.0).collect();
    let out = model.forward(&ctx, &mut g, &ZImageInputs { img, rows: rows as i64, cols: cols as i64, cap, timesteps: &timesteps, circular: Default::default() })?;
    assert_eq!(out.ne(), [(c * 4) as i64, (rows * cols) as i64, b as i64, 1]);
    let tokens = g.compute(&backend, &[out], 16384)?.remove(0);
    unpatchify_hwc(&tokens, [b, c, h, wd], 2)
}

#[test]
fn matches_diffusers() {
    let backend = common::backend(2);
    let w = det_weights(&fixture()["keys"], SCALE, &backend);
    let cfg = config(&w);
    assert_eq!((cfg.in_channels, cfg.out_channels, cfg.hidden, cfg.heads, cfg.head_dim, cfg.ffn_hidden), (16, 16, 64, 2, 32, 170));
    assert_eq!((cfg.layers, cfg.noise_refiners, cfg.context_refiners, cfg.caption, cfg.t_embed), (2, 2, 2, 32, 64));
    let err = max_abs_err(&run(&w, cfg).unwrap(), &floats(&fixture()["out"]));
    assert!(err <= 1e-3, "max abs error {err}");
}

#[test]
fn patches_are_row_column_channel() {
    let [b, c, h, w] = [1, 3, 4, 6];
    let latent: Vec<f32> = (0..b * c * h * w).map(|i| i as f32).collect();
    let tokens = patchify_hwc(&latent, [b, c, h, w], 2).unwrap();
    // The first token: its 2×2 patch's top-left pixel in every channel, then top-right, ...
    assert_eq!(&tokens[..6], &[0.0, 24.0, 48.0, 1.0, 25.0, 49.0]);
    assert_eq!(unpatchify_hwc(&tokens, [b, c, h, w], 2).unwrap(), latent);
    assert!(patchify_hwc(&latent, [b, c, h + 1, w], 2).is_err());
}

/// The denoiser feeds `1000·(1 − σ)` and takes the output as the negated velocity:
/// `denoised = x + σ·out`, whatever the batch grouping.
#[test]
fn denoiser_reverses_time_and_sign() {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["keys"], SCALE, &backend);
    let [b, c, h, wd] = shape();
    let latent = floats(&r["latent"]);
    let want = floats(&r["out"]);
    let lc = r["cap_len"].as_u64().unwrap() as i64;
    let cap = floats(&r["cap"]);
    let cond = Conditioning::new(cap.clone(), cap.len() as i64 / lc, lc).unwrap();
    let per = c * h * wd;
    let mut den = ZImageDenoiser::new(ZImage::new(&w, "", config(&w)).unwrap());
    // Sample k of the fixture ran at t_k; as a sampler's σ that is 1 − t_k. ggml's
    // latent shape is [W, H, C, N].
    let t = floats(&r["t"]);
    for k in 0..b {
        let sigma = 1.0 - t[k];
        let x = &latent[k * per..(k + 1) * per];
        let got = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], sigma, &[ZImageItem { x, cond: &cond }]).unwrap().remove(0);
        let expect: Vec<f32> = x.iter().zip(&want[k * per..(k + 1) * per]).map(|(x, o)| x + sigma * o).collect();
        let err = max_abs_err(&got, &expect);
        assert!(err <= 1e-3, "sample {k}: max abs error {err}");
    }
    // An odd-sized latent is padded to whole patches and cropped back.
    let odd: Vec<f32> = latent[..c * 5 * 9].to_vec();
    let d = den.denoise_batch(&backend, [9, 5, c as i64, 1], 0.5, &[ZImageItem { x: &odd, cond: &cond }]).unwrap().remove(0);
    assert_eq!(d.len(), odd.len());
    assert!(d.iter().all(|v| v.is_finite()));
}

#[test]
fn diffusers_names_load_as_single_file() {
    use sdflow_core::dtype::DType;
    use sdflow_core::io::TypeRules;
    use sdflow_core::models::load::load_weights;
    use sdflow_core::models::z_image::diffusers::single_file;
    use std::collections::BTreeMap;
    let r = fixture();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("z_image_turbo-diffusers.safetensors");
    let values = |name: &str| det_values(name, keys[name].iter().product(), SCALE);
    let tensors = common::write_diffusers_file(&path, "z_image_diffusers_map.json", "", &keys, &values);
    let src = single_file(sdflow_core::io::open(&path).unwrap()).unwrap();
    let names: std::collections::BTreeSet<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, keys.keys().map(String::as_str).collect(), "every single-file tensor, nothing else");
    let backend = common::backend(2);
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::F32), "").unwrap()).unwrap();
    let err = max_abs_err(&run(&w, config(&w)).unwrap(), &floats(&r["out"]));
    assert!(err <= 1e-3, "max abs error {err}");
    // A file missing one part of a fused projection is named.
    let short = dir.path().join("short.safetensors");
    let gone = "layers.1.attention.to_v.weight";
    sdflow_core::io::safetensors::write(&short, tensors.iter().filter(|t| t.0 != gone).map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let e = single_file(sdflow_core::io::open(&short).unwrap()).err().expect("a missing part");
    assert!(e.to_string().contains(gone), "{e}");
}

/// A Q8_0 file quantizes every matrix, the learned pad tokens included (sd.cpp's and
/// city96's converters do): the model runs on it and stays near the f32 result.
#[test]
fn runs_on_quantized_weights() {
    use sdflow_core::dtype::DType;
    use sdflow_core::io::TypeRules;
    use std::collections::BTreeMap;
    let r = fixture();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = keys.iter().map(|(n, s)| (n.clone(), s.clone(), det_values(n, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("z_image.safetensors");
    sdflow_core::io::safetensors::write(&path, data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let backend = common::backend(2);
    let src = sdflow_core::io::open(&path).unwrap();
    let load = |rules: &str| sdflow_core::models::load::load_weights(&backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::Q8_0), rules).unwrap()).unwrap();
    let w = load("");
    assert_eq!(Some(w.get("x_pad_token").unwrap().dtype().0), DType::Q8_0.ggml_type(), "the pad token is quantized");
    let q = run(&w, config(&w)).unwrap();
    // Within Q8_0's error of the f32 model (outputs reach ±7.5 here) ...
    let err = max_abs_err(&q, &floats(&r["out"]));
    assert!(err <= 0.5, "max abs error {err} against f32");
    // ... and the pad tokens read as the same rows as when they stay f32 (within their own
    // Q8_0 rounding, which the CPU's quantized kernels carry differently: 0.02–0.08 here;
    // reading a pad token's blocks as raw values is off by whole units).
    let wf = load("pad_token=f32");
    let err = max_abs_err(&q, &run(&wf, config(&wf)).unwrap());
    assert!(err <= 0.25, "max abs error {err} against f32 pad tokens");
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let backend = common::backend(2);
    let w = det_weights(&fixture()["keys"], SCALE, &backend);
    let cfg = config(&w);
    let mut axes = cfg.clone();
    axes.axes = vec![32, 48, 48];
    let e = ZImage::new(&w, "", axes).err().expect("axes");
    assert!(e.to_string().contains("rotary axes"), "{e}");
    let mut wrong = cfg.clone();
    wrong.ffn_hidden = 64;
    let e = ZImage::new(&w, "", wrong).err().expect("shape");
    assert!(e.to_string().contains("feed_forward.w1.weight"), "{e}");
    let e = ZImageConfig::infer(&w, "model.diffusion_model.").err().expect("prefix");
    assert!(e.to_string().contains("not a Z-Image transformer"), "{e}");
    let mut den = ZImageDenoiser::new(ZImage::new(&w, "", cfg).unwrap());
    let narrow = Conditioning::new(vec![0.5; 3 * 16], 16, 3).unwrap();
    let x = vec![0.0; 16 * 4 * 4];
    let e = den.denoise_batch(&backend, [4, 4, 16, 1], 0.5, &[ZImageItem { x: &x, cond: &narrow }]).err().expect("caption width");
    assert!(e.to_string().contains("caption tokens 16 wide"), "{e}");
    let cond = Conditioning::new(vec![0.5; 3 * 32], 32, 3).unwrap();
    let e = den.denoise_batch(&backend, [4, 4, 4, 1], 0.5, &[ZImageItem { x: &x[..64], cond: &cond }]).err().expect("channels");
    assert!(e.to_string().contains("16 latent channels"), "{e}");
}
