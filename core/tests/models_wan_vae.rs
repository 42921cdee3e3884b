//! The Wan-2.1 VAE (Qwen-Image's) on single images against diffusers'
//! `AutoencoderKLQwenImage`, on videos against `AutoencoderKLWan`, and the Wan 2.2 VAE
//! (48 channels, 2×2 patches, residual stages) against `AutoencoderKLWan(is_residual=True)`,
//! on tiny random weights in the Wan release's names, read from a safetensors file with its
//! 5-D causal kernels (fixtures from tests/fixtures/models/make_wan_vae.py and
//! make_wan22_vae.py; the weights are regenerated here).

mod common;

use common::{det_values, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::io::TypeRules;
use sdflow_core::models::load::load_weights;
use sdflow_core::models::vae::tiling::VaeTiling;
use sdflow_core::models::vae::wan::{video_layout, Frames, Layer, WanVae, WanVaeConfig};
use sdflow_core::models::vae::{run, VaeOp};
use sdflow_core::models::Weights;
use std::collections::BTreeMap;
use std::path::Path;

const SCALE: f64 = 0.3;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The fixture's weights written as a Wan release file (bf16 when asked: what ComfyUI's
/// file holds) under `prefix`.
fn write(path: &Path, prefix: &str, dtype: DType, skip: &[&str]) {
    write_keys(path, "keys", prefix, dtype, skip)
}

/// `write` with the key table of the fixture's entry `table`.
fn write_keys(path: &Path, table: &str, prefix: &str, dtype: DType, skip: &[&str]) {
    write_from("wan_vae_tiny_ref.json", path, table, prefix, dtype, skip)
}

/// `write_keys` from the fixture `fixture`.
fn write_from(fixture: &str, path: &Path, table: &str, prefix: &str, dtype: DType, skip: &[&str]) {
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(reference(fixture)[table].clone()).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .filter(|(k, _)| !skip.iter().any(|s| k.starts_with(s)))
        .map(|(k, s)| {
            let v = det_values(k, s.iter().product(), SCALE);
            let f32_bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            let bytes = if dtype == DType::F32 { f32_bytes } else { sdflow_core::dtype::convert(DType::F32, &f32_bytes, s, dtype).unwrap() };
            (format!("{prefix}{k}"), s.clone(), bytes)
        })
        .collect();
    sdflow_core::io::safetensors::write(path, tensors.iter().map(|(n, s, b)| (n.as_str(), dtype, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
}

/// The fixture `r`'s weights under diffusers' names (under `prefix`), after checking that
/// `to_wan` names each as the release does.
fn write_diffusers(r: &serde_json::Value, path: &Path, prefix: &str, to_wan: fn(&str) -> Option<String>) {
    let names: BTreeMap<String, String> = serde_json::from_value(r["diffusers_names"].clone()).unwrap();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    assert_eq!(names.len(), keys.len());
    for (d, w) in &names {
        assert_eq!(to_wan(d).as_deref(), Some(w.as_str()), "{d}");
    }
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = names
        .iter()
        .map(|(d, w)| {
            let s = &keys[w];
            (format!("{prefix}{d}"), s.clone(), det_values(w, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    sdflow_core::io::safetensors::write(path, tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
}

/// The fixture's one-frame cases through the image path (untiled): the encoded mean and the
/// decoded image against diffusers' (≤ 1e-3); returns the decoded image.
fn image_path_matches(vae: &WanVae<'_>, backend: &sdflow_core::ggml::Backend, r: &serde_json::Value) -> Vec<f32> {
    let [h, wd]: [usize; 2] = serde_json::from_value(r["image_hw"].clone()).unwrap();
    let f = vae.config.downscale() as usize;
    let off = VaeTiling { enabled: false, ..VaeTiling::default() };
    let (mean, _) = run(vae, backend, VaeOp::EncodeMean, &floats(&r["image"]), wd, h, &off).unwrap();
    let err = max_abs_err(&mean, &floats(&r["mean"]));
    assert!(err <= 1e-3, "encode: max abs error {err}");
    let (image, _) = run(vae, backend, VaeOp::Decode, &floats(&r["latent"]), wd / f, h / f, &off).unwrap();
    let err = max_abs_err(&image, &floats(&r["decoded"]));
    assert!(err <= 1e-3, "decode: max abs error {err}");
    image
}

fn load(path: &Path, backend: &sdflow_core::ggml::Backend) -> Weights {
    let src = video_layout(sdflow_core::io::open(path).unwrap()).unwrap();
    load_weights(backend, src.as_ref(), &[""], &TypeRules::new(Some(DType::F32), "").unwrap()).unwrap()
}

#[test]
fn matches_diffusers_on_one_frame() {
    let r = reference("wan_vae_tiny_ref.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen_image_vae.safetensors");
    write(&path, "vae.", DType::F32, &[]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let cfg = WanVaeConfig::infer(&w, "vae.").unwrap();
    assert_eq!((cfg.z_channels, cfg.image_channels, cfg.downscale()), (16, 3, 8));
    use Layer::{Resample as S, Residual as R};
    assert_eq!(cfg.down, vec![R, R, S, R, R, S, R, R, S, R, R]);
    assert_eq!(cfg.up, vec![R, R, R, S, R, R, R, S, R, R, R, S, R, R, R]);
    let vae = WanVae::new(&w, "vae.", cfg).unwrap();
    let [h, wd]: [usize; 2] = serde_json::from_value(r["image_hw"].clone()).unwrap();
    let image = image_path_matches(&vae, &backend, &r);
    // Tiles cover the image: a tiled decode has the whole one's size and stays close.
    let tiled = VaeTiling { enabled: true, tile_size: (4, 4), target_overlap: 0.5, ..VaeTiling::default() };
    let (t, info) = run(&vae, &backend, VaeOp::Decode, &floats(&r["latent"]), wd / 8, h / 8, &tiled).unwrap();
    assert!(info.tiles.is_some());
    assert_eq!(t.len(), image.len());
    assert!(t.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
}

/// A diffusers pipeline's `vae/` (`AutoencoderKLQwenImage` names, as diffusers' own
/// converter names the Wan tensors): read back in Wan's names, the same VAE.
#[test]
fn diffusers_names_are_the_same_vae() {
    use sdflow_core::models::vae::wan::wan_name;
    let r = reference("wan_vae_tiny_ref.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("diffusion_pytorch_model.safetensors");
    write_diffusers(&r, &path, "vae.", wan_name);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let vae = WanVae::new(&w, "vae.", WanVaeConfig::infer(&w, "vae.").unwrap()).unwrap();
    let [h, wd]: [usize; 2] = serde_json::from_value(r["image_hw"].clone()).unwrap();
    let off = VaeTiling { enabled: false, ..VaeTiling::default() };
    let (image, _) = run(&vae, &backend, VaeOp::Decode, &floats(&r["latent"]), wd / 8, h / 8, &off).unwrap();
    let err = max_abs_err(&image, &floats(&r["decoded"]));
    assert!(err <= 1e-3, "decode: max abs error {err}");
    assert_eq!(wan_name("unet.conv_in.weight"), None);
}

#[test]
fn bf16_kernels_slice_like_f32() {
    let r = reference("wan_vae_tiny_ref.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vae.safetensors");
    write(&path, "", DType::BF16, &[]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let vae = WanVae::new(&w, "", WanVaeConfig::infer(&w, "").unwrap()).unwrap();
    let [h, wd]: [usize; 2] = serde_json::from_value(r["image_hw"].clone()).unwrap();
    let off = VaeTiling { enabled: false, ..VaeTiling::default() };
    let (image, _) = run(&vae, &backend, VaeOp::Decode, &floats(&r["latent"]), wd / 8, h / 8, &off).unwrap();
    // bf16 weights: the same network within bf16's rounding.
    let err = max_abs_err(&image, &floats(&r["decoded"]));
    assert!(err <= 0.05, "decode from bf16: max abs error {err}");
}

#[test]
fn decoder_only_files_and_bad_inputs_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decoder.safetensors");
    write(&path, "", DType::F32, &["encoder.", "conv1."]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let cfg = WanVaeConfig::infer(&w, "").unwrap();
    assert!(cfg.down.is_empty());
    let vae = WanVae::new(&w, "", cfg).unwrap();
    let off = VaeTiling { enabled: false, ..VaeTiling::default() };
    let e = run(&vae, &backend, VaeOp::EncodeMean, &vec![0.0; 3 * 16 * 16], 16, 16, &off).err().expect("no encoder");
    assert!(e.to_string().contains("no encoder"), "{e}");
    let e = run(&vae, &backend, VaeOp::Decode, &vec![0.0; 4 * 2 * 2], 2, 2, &off).err().expect("channels");
    assert!(e.to_string().contains("4 channels"), "{e}");
    let e = WanVaeConfig::infer(&w, "first_stage_model.").err().expect("prefix");
    assert!(e.to_string().contains("not a Wan VAE"), "{e}");
}

/// Qwen-Image-Layered's VAE: RGBA in and out (4 image channels, read off the weights);
/// an RGB image is refused by name.
#[test]
fn rgba_matches_diffusers() {
    let r = reference("wan_vae_tiny_ref.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen_image_layered_vae.safetensors");
    write_keys(&path, "rgba_keys", "", DType::F32, &[]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let cfg = WanVaeConfig::infer(&w, "").unwrap();
    assert_eq!((cfg.z_channels, cfg.image_channels), (16, 4));
    let vae = WanVae::new(&w, "", cfg).unwrap();
    let [h, wd]: [usize; 2] = serde_json::from_value(r["image_hw"].clone()).unwrap();
    let off = VaeTiling { enabled: false, ..VaeTiling::default() };
    let (mean, _) = run(&vae, &backend, VaeOp::EncodeMean, &floats(&r["rgba_image"]), wd, h, &off).unwrap();
    let err = max_abs_err(&mean, &floats(&r["rgba_mean"]));
    assert!(err <= 1e-3, "encode: max abs error {err}");
    let (image, _) = run(&vae, &backend, VaeOp::Decode, &floats(&r["latent"]), wd / 8, h / 8, &off).unwrap();
    let err = max_abs_err(&image, &floats(&r["rgba_decoded"]));
    assert!(err <= 1e-3, "decode: max abs error {err}");
    let e = run(&vae, &backend, VaeOp::EncodeMean, &floats(&r["image"]), wd, h, &off).err().expect("rgb");
    assert!(e.to_string().contains("4 channels"), "{e}");
}

/// [C, T, plane] (torch's video layout) as [T, C, plane] (frame after frame), or back.
fn swap_ct(v: &[f32], a: usize, b: usize, plane: usize) -> Vec<f32> {
    (0..b).flat_map(|j| (0..a).flat_map(move |i| &v[(i * b + j) * plane..(i * b + j + 1) * plane])).copied().collect()
}

fn shape5(r: &serde_json::Value, key: &str) -> [usize; 5] {
    serde_json::from_value(r[format!("{key}_shape")].clone()).unwrap()
}

/// Videos: a 3-frame and a 5-frame latent decoded chunk by chunk (one latent frame per
/// graph, the causal caches carried between them) into 9 and 17 frames, and 9 frames
/// encoded (the first alone, then 4 at a time), against diffusers' `AutoencoderKLWan`.
#[test]
fn videos_match_diffusers_across_chunks() {
    let r = reference("wan_vae_tiny_ref.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wan_2.1_vae.safetensors");
    write(&path, "", DType::F32, &[]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let vae = WanVae::new(&w, "", WanVaeConfig::infer(&w, "").unwrap()).unwrap();
    for (latent, decoded) in [("video_latent", "video_decoded"), ("video_latent5", "video_decoded5")] {
        let [_, c, t, h, wd] = shape5(&r, latent);
        let frames = Frames { data: swap_ct(&floats(&r[latent]), c, t, h * wd), ne: [wd as i64, h as i64, c as i64, t as i64] };
        let mut seen = Vec::new();
        let out = vae.decode_video(&backend, &frames, &mut |k, n| seen.push((k, n))).unwrap();
        let [_, oc, ot, oh, ow] = shape5(&r, decoded);
        assert_eq!(out.ne, [ow as i64, oh as i64, oc as i64, ot as i64]);
        assert_eq!(seen.last(), Some(&(t, t)));
        let err = max_abs_err(&swap_ct(&out.data, ot, oc, oh * ow), &floats(&r[decoded]));
        assert!(err <= 1e-3, "{latent}: decode max abs error {err}");
    }
    let [_, c, t, h, wd] = shape5(&r, "video_frames");
    let video = Frames { data: swap_ct(&floats(&r["video_frames"]), c, t, h * wd), ne: [wd as i64, h as i64, c as i64, t as i64] };
    let mean = vae.encode_video(&backend, &video, &mut |_, _| {}).unwrap();
    let [_, mc, mt, mh, mw] = shape5(&r, "video_mean");
    assert_eq!(mean.ne, [mw as i64, mh as i64, mc as i64, mt as i64]);
    let err = max_abs_err(&swap_ct(&mean.data, mt, mc, mh * mw), &floats(&r["video_mean"]));
    assert!(err <= 1e-3, "encode max abs error {err}");
    // A video's first frame alone is the image the image path decodes.
    let first = Frames { data: floats(&r["latent"]), ne: [6, 4, 16, 1] };
    let one = vae.decode_video(&backend, &first, &mut |_, _| {}).unwrap();
    assert!(max_abs_err(&one.data, &floats(&r["decoded"])) <= 1e-3);
    // Bad shapes are refused by name.
    let e = vae.decode_video(&backend, &Frames { data: vec![0.0; 10], ne: [2, 2, 16, 1] }, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("video latent"), "{e}");
}

/// Wan 2.2's VAE (TI2V-5B): one frame through the image path, then 3 latent frames decoded
/// to 9 and 9 frames encoded chunk by chunk (where the stage shortcuts' first-frame rules
/// and the causal caches meet), against diffusers; then the same file in diffusers' names.
#[test]
fn wan22_matches_diffusers() {
    use sdflow_core::models::vae::wan::wan22_name;
    let r = reference("wan22_vae_tiny_ref.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wan2.2_vae.safetensors");
    write_from("wan22_vae_tiny_ref.json", &path, "keys", "", DType::F32, &[]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let cfg = WanVaeConfig::infer(&w, "").unwrap();
    assert_eq!((cfg.z_channels, cfg.image_channels, cfg.downscale(), cfg.patch, cfg.residual_stages), (48, 3, 16, 2, true));
    use Layer::{Resample as S, Residual as R};
    assert_eq!(cfg.down, vec![R, R, S, R, R, S, R, R, S, R, R]);
    assert_eq!(cfg.up, vec![R, R, R, S, R, R, R, S, R, R, R, S, R, R, R]);
    assert_eq!(cfg.layers(false)[4].name, "decoder.upsamples.1.upsamples.0");
    let vae = WanVae::new(&w, "", cfg).unwrap();
    let [h, wd]: [usize; 2] = serde_json::from_value(r["image_hw"].clone()).unwrap();
    let off = VaeTiling { enabled: false, ..VaeTiling::default() };
    image_path_matches(&vae, &backend, &r);

    let [_, c, t, lh, lw] = shape5(&r, "video_latent");
    let latent = Frames { data: swap_ct(&floats(&r["video_latent"]), c, t, lh * lw), ne: [lw as i64, lh as i64, c as i64, t as i64] };
    let out = vae.decode_video(&backend, &latent, &mut |_, _| {}).unwrap();
    let [_, oc, ot, oh, ow] = shape5(&r, "video_decoded");
    assert_eq!(out.ne, [ow as i64, oh as i64, oc as i64, ot as i64]);
    let err = max_abs_err(&swap_ct(&out.data, ot, oc, oh * ow), &floats(&r["video_decoded"]));
    assert!(err <= 1e-3, "video decode: max abs error {err}");
    let [_, c, t, vh, vw] = shape5(&r, "video_frames");
    let video = Frames { data: swap_ct(&floats(&r["video_frames"]), c, t, vh * vw), ne: [vw as i64, vh as i64, c as i64, t as i64] };
    let mean = vae.encode_video(&backend, &video, &mut |_, _| {}).unwrap();
    let [_, mc, mt, mh, mw] = shape5(&r, "video_mean");
    assert_eq!(mean.ne, [mw as i64, mh as i64, mc as i64, mt as i64]);
    let err = max_abs_err(&swap_ct(&mean.data, mt, mc, mh * mw), &floats(&r["video_mean"]));
    assert!(err <= 1e-3, "video encode: max abs error {err}");
    // Sides that are not whole 16-pixel blocks are refused by name.
    let e = run(&vae, &backend, VaeOp::EncodeMean, &vec![0.0; 3 * 24 * 24], 24, 24, &off).err().expect("size");
    assert!(e.to_string().contains("divisible by 16"), "{e}");

    // A diffusers folder's vae/ (`down_blocks.I.resnets.J`, `upsampler`): the same VAE.
    let path = dir.path().join("diffusion_pytorch_model.safetensors");
    write_diffusers(&r, &path, "", wan22_name);
    let w = load(&path, &backend);
    let vae = WanVae::new(&w, "", WanVaeConfig::infer(&w, "").unwrap()).unwrap();
    let (image, _) = run(&vae, &backend, VaeOp::Decode, &floats(&r["latent"]), wd / 16, h / 16, &off).unwrap();
    let err = max_abs_err(&image, &floats(&r["decoded"]));
    assert!(err <= 1e-3, "diffusers names: decode max abs error {err}");
}

/// A video decoded in spatial tiles: each tile a whole video through the decoder, blended
/// as image tiles are. The frames have the untiled decode's size and stay close to it (the
/// convolutions see less context at the seams), one tile is the untiled decode exactly, and
/// the progress hears every tile.
#[test]
fn video_decodes_in_spatial_tiles() {
    use sdflow_core::models::vae::tiling::VaeTiling;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wan_2.1_vae.safetensors");
    write(&path, "", DType::F32, &[]);
    let backend = common::backend(2);
    let w = load(&path, &backend);
    let vae = WanVae::new(&w, "", WanVaeConfig::infer(&w, "").unwrap()).unwrap();
    // A smooth latent (tiles of noise would disagree at every seam) of 3 frames at 8×6.
    let (lw, lh, z, t) = (8usize, 6usize, 16usize, 3usize);
    let data: Vec<f32> = (0..t * z * lh * lw).map(|i| {
        let (x, y, c, f) = (i % lw, (i / lw) % lh, (i / (lw * lh)) % z, i / (lw * lh * z));
        ((x as f32 * 0.3 + y as f32 * 0.2 + c as f32 * 0.7 + f as f32).sin()) * 0.8
    }).collect();
    let latent = Frames { data, ne: [lw as i64, lh as i64, z as i64, t as i64] };
    let whole = vae.decode_video(&backend, &latent, &mut |_, _| {}).unwrap();
    let tiling = VaeTiling { enabled: true, tile_size: (4, 4), target_overlap: 0.5, ..VaeTiling::default() };
    let mut heard = Vec::new();
    let tiled = vae.decode_video_tiled(&backend, &latent, &tiling, &mut |k, n| heard.push((k, n))).unwrap();
    assert_eq!(tiled.ne, whole.ne);
    assert_eq!(tiled.ne, [64, 48, 3, 9]);
    let n = heard.last().unwrap().1;
    assert!(n > 1 && heard.len() == n, "{heard:?}");
    let mean = tiled.data.iter().zip(&whole.data).map(|(a, b)| (a - b).abs()).sum::<f32>() / whole.data.len() as f32;
    assert!(mean < 0.05, "tiled frames differ from the whole decode by {mean} on average");
    assert!(tiled.data.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
    // One tile covering the latent: the untiled decode itself.
    let one = VaeTiling { enabled: true, tile_size: (8, 8), ..VaeTiling::default() };
    assert_eq!(vae.decode_video_tiled(&backend, &latent, &one, &mut |_, _| {}).unwrap(), whole);

    // Within a memory limit: whole when a chunk's compute buffer fits, ...
    let (fits, note) = vae.decode_video_within(&backend, &latent, 1 << 34, &mut |_, _| {}).unwrap();
    assert_eq!((fits, note), (whole.clone(), None));
    // ... else in spatial tiles (here the smallest: no tile fits 1 KiB).
    let (tiled, note) = vae.decode_video_within(&backend, &latent, 1 << 10, &mut |_, _| {}).unwrap();
    let note = note.expect("over the limit: tiled");
    assert!(note.contains("tiles") && note.contains("GiB"), "{note}");
    let mean = tiled.data.iter().zip(&whole.data).map(|(a, b)| (a - b).abs()).sum::<f32>() / whole.data.len() as f32;
    assert!(mean < 0.05, "{note}: {mean} from the whole decode on average");
    // As few tiles as the need over the limit asks, split along the longer side first.
    let few = VaeTiling::fitting(104, 60, 20 << 30, 9 << 30);
    assert_eq!(few.rel_size, (3.0, 2.0));
    assert_eq!(VaeTiling::fitting(104, 60, 10 << 30, 9 << 30).rel_size, (2.0, 1.0));

    // The encoder the same way: whole when it fits, tiles (close to it) when not.
    let video = Frames { data: tiled.data.clone(), ne: tiled.ne };
    let encoded = vae.encode_video(&backend, &video, &mut |_, _| {}).unwrap();
    let (fits, note) = vae.encode_video_within(&backend, &video, 1 << 34, &mut |_, _| {}).unwrap();
    assert_eq!((&fits, note), (&encoded, None));
    let (parts, note) = vae.encode_video_within(&backend, &video, 1 << 10, &mut |_, _| {}).unwrap();
    assert!(note.expect("over the limit: tiled").contains("encoded in"));
    assert_eq!(parts.ne, encoded.ne);
    // The smallest tiles (4×4 latent pixels: any need over 1 KiB asks for the most), the
    // tiled encoder's own result; one tile is the whole encode.
    let smallest = VaeTiling::fitting(8, 6, 1 << 40, 1 << 10);
    assert_eq!(smallest.rel_size, (8.0, 6.0));
    assert_eq!(parts, vae.encode_video_tiled(&backend, &video, &smallest, &mut |_, _| {}).unwrap().0);
    assert_eq!(vae.encode_video_tiled(&backend, &video, &one, &mut |_, _| {}).unwrap().0, encoded);
    // 32-pixel tiles see little of the encoder's reach: near the whole encode, not at it.
    let mean = parts.data.iter().zip(&encoded.data).map(|(a, b)| (a - b).abs()).sum::<f32>() / encoded.data.len() as f32;
    let scale = encoded.data.iter().map(|v| v.abs()).sum::<f32>() / encoded.data.len() as f32;
    assert!(mean < 0.4 * scale, "tiled encode {mean} from the whole one (values ~{scale})");
    assert_eq!(tiled.ne, whole.ne);
}
