//! Qwen-Image transformer against diffusers' `QwenImageTransformer2DModel` on tiny random
//! weights in the release's names (fixtures from tests/fixtures/models/make_qwen_image.py;
//! the weights are regenerated here), its centred rotary positions, and the denoiser's
//! velocity convention.

mod common;

use common::{det_weights, max_abs_err, reference};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::models::conditioning::{Conditioning, ReferenceLatent, ReferenceMethod};
use sdflow_core::models::dit::{patchify, unpatchify};
use sdflow_core::models::qwen_image::{position_ids, ImageGrid, QwenImage, QwenImageConfig, QwenImageDenoiser, QwenImageInputs, QwenImageItem};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.2;

fn fixture() -> serde_json::Value {
    reference("qwen_image_tiny_ref.json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn shape() -> [usize; 4] {
    serde_json::from_value(fixture()["latent_shape"].clone()).unwrap()
}

fn config(w: &Weights) -> QwenImageConfig {
    let mut cfg = QwenImageConfig::infer(w, "").unwrap();
    cfg.axes = serde_json::from_value(fixture()["axes"].clone()).unwrap();
    cfg
}

fn text() -> Conditioning {
    let r = fixture();
    let lt = r["txt_len"].as_u64().unwrap() as i64;
    let txt = floats(&r["txt"]);
    Conditioning::new(txt.clone(), txt.len() as i64 / lt, lt).unwrap()
}

#[test]
fn matches_diffusers() {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["keys"], SCALE, &backend);
    let cfg = config(&w);
    assert_eq!((cfg.latent_channels, cfg.hidden, cfg.heads, cfg.head_dim, cfg.context, cfg.layers), (16, 64, 2, 32, 24, 2));
    let [b, c, h, wd] = shape();
    let model = QwenImage::new(&w, "", cfg).unwrap();
    let ctx = Context::new(16384, 16384).unwrap();
    let mut g = GraphRun::new(&ctx);
    let grids = [ImageGrid { rows: h / 2, cols: wd / 2, frame: 0 }];
    let img = g.input_f32(&[(c * 4) as i64, (h / 2 * wd / 2) as i64, b as i64], patchify(&floats(&r["latent"]), [b, c, h, wd], 2).unwrap()).unwrap();
    let t = text();
    let txt = g.input_f32(&[t.dim, t.tokens, b as i64], t.data.repeat(b)).unwrap();
    let out = model.forward(&ctx, &mut g, &QwenImageInputs { img, grids: &grids, outputs: 1, txt, timesteps: &floats(&r["t"]), ref_timestep_zero: false, circular: Default::default() }).unwrap();
    let tokens = g.compute(&backend, &[out], 16384).unwrap().remove(0);
    let got = unpatchify(&tokens, [b, c, h, wd], 2).unwrap();
    let err = max_abs_err(&got, &floats(&r["out"]));
    assert!(err <= 1e-3, "max abs error {err}");
}

/// ComfyUI's and sd.cpp's positions: odd sides centred with the extra row below.
#[test]
fn positions_are_centred_and_text_follows_the_image() {
    let (img, txt) = position_ids(&[ImageGrid { rows: 3, cols: 4, frame: 0 }, ImageGrid { rows: 2, cols: 6, frame: 1 }], 2);
    assert_eq!(img.len(), 12 + 12);
    // Rows −1, 0, 1 (⌊3/2⌋ above the centre), columns −2 … 1.
    assert_eq!(img[0], vec![0.0, -1.0, -2.0]);
    assert_eq!(img[11], vec![0.0, 1.0, 1.0]);
    // The reference is frame 1.
    assert_eq!(img[12], vec![1.0, -1.0, -3.0]);
    // Past the image's half-extent (4 / 2 = 2), on every axis; references do not move it.
    assert_eq!(txt, vec![vec![2.0; 3], vec![3.0; 3]]);
}

/// `denoised = x − σ·v` with the model reading σ, whatever the batch grouping.
#[test]
fn denoiser_takes_velocity() {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["keys"], SCALE, &backend);
    let [b, c, h, wd] = shape();
    let latent = floats(&r["latent"]);
    let want = floats(&r["out"]);
    let cond = text();
    let per = c * h * wd;
    let mut den = QwenImageDenoiser::new(QwenImage::new(&w, "", config(&w)).unwrap());
    let t = floats(&r["t"]);
    for k in 0..b {
        let x = &latent[k * per..(k + 1) * per];
        let got = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], t[k], &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
        let expect: Vec<f32> = x.iter().zip(&want[k * per..(k + 1) * per]).map(|(x, v)| x - t[k] * v).collect();
        let err = max_abs_err(&got, &expect);
        assert!(err <= 1e-3, "sample {k}: max abs error {err}");
    }
    // An odd-sized latent is padded to whole patches and cropped back.
    let odd: Vec<f32> = latent[..c * 5 * 9].to_vec();
    let d = den.denoise_batch(&backend, [9, 5, c as i64, 1], 0.5, &[QwenImageItem { x: &odd, cond: &cond }]).unwrap().remove(0);
    assert_eq!(d.len(), odd.len());
    assert!(d.iter().all(|v| v.is_finite()));
    // Seamless tiling wraps the image's positions: another result, still finite.
    let x = &latent[..per];
    let plain = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], 0.5, &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
    den.circular = sdflow_core::ggml::Circular::new(true, false);
    let wrapped = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], 0.5, &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
    assert!(wrapped.iter().all(|v| v.is_finite()));
    assert!(max_abs_err(&plain, &wrapped) > 1e-4);
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let backend = common::backend(2);
    let w = det_weights(&fixture()["keys"], SCALE, &backend);
    let cfg = config(&w);
    let mut axes = cfg.clone();
    axes.axes = vec![16, 56, 56];
    let e = QwenImage::new(&w, "", axes).err().expect("axes");
    assert!(e.to_string().contains("rotary axes"), "{e}");
    let mut wrong = cfg.clone();
    wrong.context = 32;
    let e = QwenImage::new(&w, "", wrong).err().expect("shape");
    assert!(e.to_string().contains("txt_norm.weight"), "{e}");
    let e = QwenImageConfig::infer(&w, "model.diffusion_model.").err().expect("prefix");
    assert!(e.to_string().contains("not a Qwen-Image transformer"), "{e}");
    let mut den = QwenImageDenoiser::new(QwenImage::new(&w, "", cfg).unwrap());
    let narrow = Conditioning::new(vec![0.5; 3 * 16], 16, 3).unwrap();
    let x = vec![0.0; 4 * 4 * 16];
    let e = den.denoise_batch(&backend, [4, 4, 16, 1], 0.5, &[QwenImageItem { x: &x, cond: &narrow }]).err().expect("text width");
    assert!(e.to_string().contains("text tokens 16 wide"), "{e}");
    let cond = text();
    let e = den.denoise_batch(&backend, [4, 4, 4, 1], 0.5, &[QwenImageItem { x: &x[..64], cond: &cond }]).err().expect("channels");
    assert!(e.to_string().contains("16 latent channels"), "{e}");
    // References of another VAE, or placed by offsets, are named.
    let mut bad = cond.clone();
    bad.references = vec![std::sync::Arc::new(ReferenceLatent { data: vec![0.0; 4 * 4], channels: 4, height: 2, width: 2 })];
    let e = den.denoise_batch(&backend, [4, 4, 16, 1], 0.5, &[QwenImageItem { x: &x, cond: &bad }]).err().expect("ref channels");
    assert!(e.to_string().contains("encode it with its VAE"), "{e}");
    let mut offset = cond.clone();
    offset.reference_method = Some(ReferenceMethod::Offset);
    offset.references = vec![std::sync::Arc::new(ReferenceLatent { data: vec![0.0; 16 * 4], channels: 16, height: 2, width: 2 })];
    let e = den.denoise_batch(&backend, [4, 4, 16, 1], 0.5, &[QwenImageItem { x: &x, cond: &offset }]).err().expect("method");
    assert!(e.to_string().contains("by index"), "{e}");
}

/// Qwen-Image-Edit: a reference latent (VAE space, normalised by the denoiser) after the
/// image's tokens as frame 1, as `QwenImageEditPipeline` lays it out; Edit-2511's
/// `zero_cond_t` (ComfyUI's `index_timestep_zero`) modulates it as at σ = 0.
#[test]
fn denoiser_reads_references_as_the_edit_pipelines_do() {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["keys"], SCALE, &backend);
    let [b, c, h, wd] = shape();
    let [rh, rw]: [usize; 2] = serde_json::from_value(r["ref_hw"].clone()).unwrap();
    let latent = floats(&r["latent"]);
    let reference = std::sync::Arc::new(ReferenceLatent { data: floats(&r["ref_vae"]), channels: c, height: rh, width: rw });
    let per = c * h * wd;
    let t = floats(&r["t"]);
    let mut den = QwenImageDenoiser::new(QwenImage::new(&w, "", config(&w)).unwrap());
    for (case, method) in [("edit", None), ("edit", Some(ReferenceMethod::Index)), ("edit_2511", Some(ReferenceMethod::IndexTimestepZero))] {
        let want = floats(&r[case]);
        let mut cond = text();
        cond.references = vec![reference.clone()];
        cond.reference_method = method;
        for k in 0..b {
            let x = &latent[k * per..(k + 1) * per];
            let got = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], t[k], &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
            let expect: Vec<f32> = x.iter().zip(&want[k * per..(k + 1) * per]).map(|(x, v)| x - t[k] * v).collect();
            let err = max_abs_err(&got, &expect);
            assert!(err <= 1e-3, "{case} {method:?} sample {k}: max abs error {err}");
        }
    }
    // The two cases differ: the references' timestep matters.
    assert!(max_abs_err(&floats(&r["edit"]), &floats(&r["edit_2511"])) > 1e-2);
}

/// Qwen-Image-Layered: `addition_t_embedding` joins the timestep embedding, a latent of
/// three frames ([C][T][H][W] per sample, ComfyUI's layout) is denoised as frames 0..2
/// with the input image at frame −1 (the layered model's default placement), as
/// diffusers' `QwenEmbedLayer3DRope` lays them out.
#[test]
fn layered_denoises_frames_with_the_image_before_them() {
    let r = fixture();
    let backend = common::backend(2);
    let mut keys = r["keys"].as_object().unwrap().clone();
    keys.extend(r["layered_keys"].as_object().unwrap().clone());
    let w = det_weights(&serde_json::Value::Object(keys), SCALE, &backend);
    let cfg = config(&w);
    assert!(cfg.additional_t);
    let [b, c, h, wd] = shape();
    let frames = r["layered_frames"].as_u64().unwrap() as usize;
    let latent = floats(&r["layered_latent"]);
    let want = floats(&r["layered"]);
    let reference = std::sync::Arc::new(ReferenceLatent { data: floats(&r["layered_ref_vae"]), channels: c, height: h, width: wd });
    let t = floats(&r["t"]);
    let mut den = QwenImageDenoiser::new(QwenImage::new(&w, "", cfg.clone()).unwrap());
    den.frames = frames;
    let per = c * frames * h * wd;
    let shape = [wd as i64, h as i64, (c * frames) as i64, 1];
    for method in [None, Some(ReferenceMethod::NegativeIndex)] {
        let mut cond = text();
        cond.references = vec![reference.clone()];
        cond.reference_method = method;
        for k in 0..b {
            let x = &latent[k * per..(k + 1) * per];
            let got = den.denoise_batch(&backend, shape, t[k], &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
            let expect: Vec<f32> = x.iter().zip(&want[k * per..(k + 1) * per]).map(|(x, v)| x - t[k] * v).collect();
            let err = max_abs_err(&got, &expect);
            assert!(err <= 1e-3, "{method:?} sample {k}: max abs error {err}");
        }
    }
    // Placed after the frames instead (ComfyUI's `index`), the image changes the result.
    let mut cond = text();
    cond.references = vec![reference];
    cond.reference_method = Some(ReferenceMethod::Index);
    let x = &latent[..per];
    let got = den.denoise_batch(&backend, shape, t[0], &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
    let expect: Vec<f32> = x.iter().zip(&want[..per]).map(|(x, v)| x - t[0] * v).collect();
    assert!(max_abs_err(&got, &expect) > 1e-3);
    // A frame count the latent's channels do not hold, and frames on a plain model, are named.
    den.frames = 2;
    let e = den.denoise_batch(&backend, shape, 0.5, &[QwenImageItem { x, cond: &text() }]).err().expect("frames");
    assert!(e.to_string().contains("16 latent channels × 2 frames"), "{e}");
    let plain = det_weights(&r["keys"], SCALE, &backend);
    let mut den = QwenImageDenoiser::new(QwenImage::new(&plain, "", config(&plain)).unwrap());
    den.frames = frames;
    let e = den.denoise_batch(&backend, shape, 0.5, &[QwenImageItem { x, cond: &text() }]).err().expect("plain");
    assert!(e.to_string().contains("only Qwen-Image-Layered"), "{e}");
}

/// ComfyUI's Edit-2511 files carry an empty `__index_timestep_zero__` tensor: read from
/// the file, it makes `index_timestep_zero` the references' default (no method given).
#[test]
fn an_edit_2511_files_flag_sets_timestep_zero() {
    let r = fixture();
    let backend = common::backend(2);
    let keys: std::collections::BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = keys.iter().map(|(n, s)| (n.clone(), s.clone(), common::det_values(n, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    data.push(("__index_timestep_zero__".into(), vec![0], Vec::new()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen_image_edit_2511.safetensors");
    sdflow_core::io::safetensors::write(&path, data.iter().map(|(n, s, b)| (n.as_str(), sdflow_core::dtype::DType::F32, s.clone(), b.as_slice())), &Default::default()).unwrap();
    let src = sdflow_core::io::open(&path).unwrap();
    let w = sdflow_core::models::load::load_weights(&backend, src.as_ref(), &[""], &sdflow_core::io::TypeRules::none()).unwrap();
    let cfg = config(&w);
    assert!(cfg.zero_cond_t && !cfg.additional_t);
    assert!(!config(&det_weights(&r["keys"], SCALE, &backend)).zero_cond_t, "no flag, no default");
    let [_, c, h, wd] = shape();
    let [rh, rw]: [usize; 2] = serde_json::from_value(r["ref_hw"].clone()).unwrap();
    let mut cond = text();
    cond.references = vec![std::sync::Arc::new(ReferenceLatent { data: floats(&r["ref_vae"]), channels: c, height: rh, width: rw })];
    let mut den = QwenImageDenoiser::new(QwenImage::new(&w, "", cfg).unwrap());
    let per = c * h * wd;
    let x = &floats(&r["latent"])[..per];
    let t = floats(&r["t"])[0];
    let got = den.denoise_batch(&backend, [wd as i64, h as i64, c as i64, 1], t, &[QwenImageItem { x, cond: &cond }]).unwrap().remove(0);
    let expect: Vec<f32> = x.iter().zip(&floats(&r["edit_2511"])[..per]).map(|(x, v)| x - t * v).collect();
    let err = max_abs_err(&got, &expect);
    assert!(err <= 1e-3, "max abs error {err}");
}
