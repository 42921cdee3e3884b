//! Tiled VAE decode/encode (sd.cpp's layout and blending), the fall-back to tiles when
//! the whole-image compute buffer is refused, and standalone VAE files in the LDM and
//! diffusers key layouts.

mod common;

use common::{det_values, det_weights, keys, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, GgmlError};
use sdflow_core::models::vae::tiling::VaeTiling;
use sdflow_core::models::vae::{standalone_source, Vae, VaeConfig, VaeLayout, VaeOp, STANDALONE_PREFIX};
use sdflow_core::models::{ModelError, Weights};
use std::collections::BTreeMap;

fn tiny(backend: &Backend) -> Weights {
    det_weights(&keys("vae_tiny_keys.json"), 0.14, backend)
}

fn vae(w: &Weights) -> Vae<'_> {
    Vae::new(w, "first_stage_model", VaeConfig::infer(w, "first_stage_model").unwrap()).unwrap()
}

/// A smooth latent with some texture, as sampled latents are.
fn latent(w: usize, h: usize) -> Vec<f32> {
    let noise = det_values("latent", w * h * 4, 0.3);
    (0..4 * h * w).map(|i| ((i % w) as f32 * 0.3 + (i / w % h) as f32 * 0.2 + (i / (w * h)) as f32).sin() + noise[i]).collect()
}

fn tiles(t: usize, overlap: f32) -> VaeTiling {
    VaeTiling { enabled: true, tile_size: (t, t), target_overlap: overlap, ..VaeTiling::default() }
}

#[test]
fn a_latent_within_one_tile_decodes_exactly_as_untiled() {
    let backend = common::backend(2);
    let w = tiny(&backend);
    let v = vae(&w);
    let z = latent(6, 8);
    let (whole, info) = v.run(&backend, VaeOp::Decode, &z, 6, 8, &VaeTiling::default()).unwrap();
    assert!(info.tiles.is_none());
    let (tiled, info) = v.run(&backend, VaeOp::Decode, &z, 6, 8, &tiles(32, 0.5)).unwrap();
    assert_eq!(info.tiles.as_ref().unwrap().tiles.len(), 1);
    assert_eq!(whole, tiled, "one tile is the whole image");
    // And the whole-image run is the diffusers reference (the graph is unchanged).
    let r = reference("vae_tiny_ref.json");
    let zr: Vec<f32> = serde_json::from_value(r["latent"].clone()).unwrap();
    let (dec, _) = v.run(&backend, VaeOp::Decode, &zr, 6, 8, &tiles(16, 0.5)).unwrap();
    let want: Vec<f32> = serde_json::from_value(r["decoded"].clone()).unwrap();
    assert!(max_abs_err(&dec, &want) <= 1e-3);
}

/// Mean |difference between horizontally adjacent pixels| from column `x` to `x + 1`
/// over `cols`, of a planar 3-channel image.
fn mean_step(img: &[f32], w: usize, h: usize, cols: &[usize]) -> f32 {
    let mut sum = 0f32;
    for c in 0..3 {
        for y in 0..h {
            for &x in cols {
                sum += (img[(c * h + y) * w + x + 1] - img[(c * h + y) * w + x]).abs();
            }
        }
    }
    sum / (3 * h * cols.len()) as f32
}

#[test]
fn tiled_decode_is_close_to_untiled_and_has_no_seams() {
    let backend = common::backend(2);
    let w = tiny(&backend);
    let v = vae(&w);
    let (lw, lh) = (48, 12);
    let (iw, ih) = (lw * 4, lh * 4);
    let z = latent(lw, lh);
    let (whole, _) = v.run(&backend, VaeOp::Decode, &z, lw, lh, &VaeTiling::default()).unwrap();
    let all: Vec<usize> = (0..iw - 1).collect();
    let mut results = Vec::new();
    for overlap in [0.0, 0.25, 0.5] {
        let (tiled, info) = v.run(&backend, VaeOp::Decode, &z, lw, lh, &tiles(16, overlap)).unwrap();
        let layout = info.tiles.unwrap();
        assert!(layout.tiles.len() >= 3, "{layout}");
        let mean_err = tiled.iter().zip(&whole).map(|(a, b)| (a - b).abs()).sum::<f32>() / whole.len() as f32;
        // Seams: the step into the first pixel of each tile, against the image's typical step.
        let borders: Vec<usize> = layout.tiles.iter().filter(|t| t.x > 0).map(|t| (t.x + t.skip_x) * 4 - 1).collect();
        let seam = mean_step(&tiled, iw, ih, &borders) / mean_step(&tiled, iw, ih, &all);
        eprintln!("overlap {overlap}: {layout}: mean abs error {mean_err}, max {}, seam ratio {seam}", max_abs_err(&tiled, &whole));
        results.push((layout.overlap_x, mean_err, seam));
    }
    let (hard, quarter, half) = (results[0], results[1], results[2]);
    assert_eq!(hard.0, 0, "48 = 3 tiles of 16 exactly: no overlap");
    // Random weights make GroupNorm and the mid attention see very different statistics
    // per tile, so the tiled image is not the whole one; overlap must still bring it closer.
    assert!(half.1 < quarter.1 && quarter.1 < hard.1, "mean errors {:?}", results);
    // Butted tiles show a step at every border; cross-faded ones do not.
    assert!(hard.2 > 1.5, "the hard-cut layout must show its seams (ratio {})", hard.2);
    assert!(half.2 < 1.2 && quarter.2 < 1.2, "seam ratios {:?}", results);
}

#[test]
fn tiled_encode_is_close_to_untiled() {
    let backend = common::backend(2);
    let w = tiny(&backend);
    let v = vae(&w);
    let (iw, ih) = (180, 40);
    let img: Vec<f32> = (0..3 * iw * ih).map(|i| ((i % iw) as f32 * 0.07 + (i / iw % ih) as f32 * 0.05 + (i / (iw * ih)) as f32).sin()).collect();
    let (whole, _) = v.run(&backend, VaeOp::EncodeMean, &img, iw, ih, &VaeTiling::default()).unwrap();
    assert_eq!(whole.len(), 4 * (iw / 4) * (ih / 4));
    let scale = whole.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut errs = Vec::new();
    for overlap in [0.0, 0.5] {
        let (tiled, info) = v.run(&backend, VaeOp::EncodeMean, &img, iw, ih, &tiles(12, overlap)).unwrap();
        let layout = info.tiles.unwrap();
        assert_eq!(layout.tile_w, 15, "sd.cpp widens encoder tiles by 1.30539");
        let mean = tiled.iter().zip(&whole).map(|(a, b)| (a - b).abs()).sum::<f32>() / whole.len() as f32;
        eprintln!("encode, overlap {overlap}: {layout}: mean abs error {mean}, max {} (latent max {scale})", max_abs_err(&tiled, &whole));
        errs.push(mean);
    }
    assert!(errs[1] < errs[0], "overlap brings the tiled encoding closer: {errs:?}");
    assert!(errs[1] <= 0.2 * scale, "mean error {errs:?}");
    // Odd sizes are an error, not a panic.
    assert!(v.run(&backend, VaeOp::EncodeMean, &img[..3 * 179 * 40], 179, 40, &tiles(8, 0.5)).is_err());
}

#[test]
fn a_refused_compute_buffer_falls_back_to_tiles() {
    let backend = common::backend(2);
    let w = tiny(&backend);
    let v = vae(&w);
    let z = latent(20, 12);
    let small = VaeTiling { max_compute_bytes: Some(64 << 10), tile_size: (8, 8), ..VaeTiling::default() };
    let (got, info) = v.run(&backend, VaeOp::Decode, &z, 20, 12, &small).unwrap();
    let reason = info.fallback.expect("the whole image was over the threshold");
    assert!(reason.contains("cannot allocate"), "{reason}");
    assert!(info.tiles.is_some());
    let (forced, _) = v.run(&backend, VaeOp::Decode, &z, 20, 12, &VaeTiling { enabled: true, ..small.clone() }).unwrap();
    assert_eq!(got, forced, "the retry is the tiled decode");
    // A threshold the image fits under changes nothing.
    let roomy = VaeTiling { max_compute_bytes: Some(1 << 34), ..small.clone() };
    let (whole, info) = v.run(&backend, VaeOp::Decode, &z, 20, 12, &roomy).unwrap();
    assert!(info.tiles.is_none() && info.fallback.is_none());
    assert_ne!(whole, got);
    // A real allocation failure (a buffer no machine has) is the same error variant, and
    // with the retry switched off it is reported, naming what could not be allocated.
    let z_big = vec![0f32; 4 * 4096 * 4096];
    let off = VaeTiling { retry_on_alloc_failure: false, ..VaeTiling::default() };
    match v.run(&backend, VaeOp::Decode, &z_big, 4096, 4096, &off) {
        Err(ModelError::Ggml(GgmlError::Alloc { what, .. })) => assert!(what.contains("graph"), "{what}"),
        other => panic!("expected an allocation failure, got {:?}", other.map(|(_, i)| i)),
    }
}

/// Writes `tensors` (name, shape, values) as an f32 safetensors file.
fn write(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    // io::open takes a file whose first byte is 0x80 for a pickle, and a safetensors header
    // length can start with that byte: pad the header until it does not.
    for pad in 0..4 {
        let meta: BTreeMap<String, String> = (pad > 0).then(|| ("pad".to_string(), "x".repeat(pad))).into_iter().collect();
        sdflow_core::io::safetensors::write(path, tensors.iter().zip(&bytes).map(|((n, s, _), b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &meta).unwrap();
        if std::fs::read(path).unwrap()[0] != 0x80 {
            return;
        }
    }
    panic!("cannot write {} without a leading 0x80", path.display());
}

#[test]
fn standalone_vae_files_in_every_layout_decode_alike() {
    let backend = common::backend(2);
    let r = reference("vae_tiny_ref.json");
    let z: Vec<f32> = serde_json::from_value(r["latent"].clone()).unwrap();
    let want: Vec<f32> = serde_json::from_value(r["decoded"].clone()).unwrap();
    let ldm: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys("vae_tiny_keys.json")).unwrap();
    let diffusers: BTreeMap<String, (String, Vec<usize>)> = serde_json::from_value(keys("vae_tiny_diffusers_keys.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("prefixed", ldm.iter().map(|(n, s)| (n.clone(), s.clone(), det_values(n, s.iter().product(), 0.14))).collect::<Vec<_>>()),
        ("bare", ldm.iter().map(|(n, s)| (n.strip_prefix("first_stage_model.").unwrap().to_string(), s.clone(), det_values(n, s.iter().product(), 0.14))).collect()),
        // diffusers names and shapes (linear attention weights), values by LDM name.
        ("diffusers", diffusers.iter().map(|(n, (l, s))| (n.clone(), s.clone(), det_values(l, s.iter().product(), 0.14))).collect()),
        ("pipeline", diffusers.iter().map(|(n, (l, s))| (format!("vae.{n}"), s.clone(), det_values(l, s.iter().product(), 0.14))).collect()),
    ];
    for (what, tensors) in files {
        let path = dir.path().join(format!("{what}.safetensors"));
        write(&path, &tensors);
        let src = standalone_source(sdflow_core::io::open(&path).unwrap()).unwrap();
        assert_eq!(src.tensors().len(), ldm.len(), "{what}: every tensor mapped");
        let weights = sdflow_core::models::load::load_weights(&backend, src.as_ref(), &[STANDALONE_PREFIX], &sdflow_core::io::TypeRules::none()).unwrap();
        let v = Vae::new(&weights, STANDALONE_PREFIX, VaeConfig::infer(&weights, STANDALONE_PREFIX).unwrap()).unwrap();
        let (dec, _) = v.run(&backend, VaeOp::Decode, &z, 6, 8, &VaeTiling::default()).unwrap();
        let err = max_abs_err(&dec, &want);
        assert!(err <= 1e-3, "{what}: max abs error {err} against diffusers");
    }
    assert_eq!(VaeLayout::detect(["decoder.up_blocks.2.resnets.0.conv1.weight", "decoder.up_blocks.0.upsamplers.0.conv.weight"]), Some(VaeLayout::Diffusers { prefix: String::new(), levels: 3 }));
    // A file without a VAE decoder is a clear error.
    let path = dir.path().join("other.safetensors");
    write(&path, &[("model.diffusion_model.x".into(), vec![2], vec![0.0, 1.0])]);
    let e = standalone_source(sdflow_core::io::open(&path).unwrap()).err().expect("no VAE");
    assert!(e.to_string().contains("other.safetensors"), "{e}");
}
