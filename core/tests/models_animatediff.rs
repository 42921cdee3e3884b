//! AnimateDiff's motion modules in the SD1 UNet against diffusers' `UNetMotionModel`
//! (with the original code's per-frame GroupNorm in the modules), on tiny random weights:
//! v3-style (down and up modules) and v2-style (plus the mid-block module), each file in
//! the original names and in diffusers' MotionAdapter names. Fixtures from
//! tests/fixtures/models/make_animatediff.py.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{det_values, det_weights, keys, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::sd::motion::{standalone_source, MotionConfig, MotionModules, Slot};
use sdflow_core::models::sd::unet::{Heads, Motion, Unet, UnetConfig, UnetExtras};
use sdflow_core::models::{load::load_weights, Weights};

const PREFIX: &str = "model.diffusion_model";

/// The diffusers MotionAdapter name of an original one (`None`: the second attention's
/// table, which diffusers shares with the first).
fn diffusers_name(n: &str) -> Option<String> {
    if n.contains("attention_blocks.1.pos_encoder.pe") {
        return None;
    }
    Some(
        n.replace(".temporal_transformer", "")
            .replace("attention_blocks.0.pos_encoder.pe", "pos_embed.pe")
            .replace("attention_blocks.0.", "attn1.")
            .replace("attention_blocks.1.", "attn2.")
            .replace("norms.0.", "norm1.")
            .replace("norms.1.", "norm2.")
            .replace("ff_norm.", "norm3."),
    )
}

/// Writes the modules of `case` to `path`: original names under `prefix`, or diffusers'
/// names; `drop` leaves out the tensors whose names contain it.
fn write(case: &serde_json::Value, path: &Path, prefix: &str, diffusers: bool, drop: Option<&str>) {
    let table: BTreeMap<String, Vec<usize>> = serde_json::from_value(case["keys"].clone()).unwrap();
    let mut tensors = Vec::new();
    for (name, shape) in &table {
        if drop.is_some_and(|d| name.contains(d)) {
            continue;
        }
        let n: usize = shape.iter().product();
        let v = if name.ends_with(".pe") { sdflow_core::synth::sinusoids(shape[1], shape[2]) } else { det_values(name, n, 0.14) };
        let out = if diffusers { diffusers_name(name) } else { Some(format!("{prefix}{name}")) };
        if let Some(out) = out {
            tensors.push((out, shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()));
        }
    }
    sdflow_core::io::safetensors::write(path, tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
}

fn load(path: &Path, backend: &Backend) -> Result<Weights, String> {
    let src = standalone_source(sdflow_core::io::open(path).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    load_weights(backend, src.as_ref(), &[""], &sdflow_core::io::TypeRules::none()).map_err(|e| e.to_string())
}

fn unet_weights(backend: &Backend) -> (Weights, UnetConfig) {
    let w = det_weights(&keys("unet_sd1_tiny_keys.json"), 0.14, backend);
    let mut cfg = UnetConfig::infer(&w, PREFIX).unwrap();
    cfg.heads = Heads::Count(4);
    (w, cfg)
}

/// The UNet on the case's two videos, with the motion modules of `mm` (none: `None`),
/// taking `frames` frames per video.
fn run(case: &serde_json::Value, unet: &Unet<'_>, mm: Option<&MotionModules<'_>>, frames: i64, backend: &Backend) -> Result<Vec<f32>, String> {
    run_with(case, unet, mm, frames, false, backend)
}

/// [`run`] with every GroupNorm over each video's frames (`across`: AnimateDiff v1).
fn run_with(case: &serde_json::Value, unet: &Unet<'_>, mm: Option<&MotionModules<'_>>, frames: i64, across: bool, backend: &Backend) -> Result<Vec<f32>, String> {
    let f = |k: &str| -> Vec<f32> { serde_json::from_value(case[k].clone()).unwrap() };
    let per_video = case["frames"].as_i64().unwrap();
    let b = 2 * per_video;
    let t: Vec<f32> = f("t").iter().flat_map(|&t| std::iter::repeat_n(t, per_video as usize)).collect();
    let context: Vec<f32> = f("context").chunks(7 * 48).flat_map(|c| std::iter::repeat_n(c, per_video as usize).flatten().copied()).collect();
    let ctx = Context::new(32768, 32768).unwrap();
    let mut g = GraphRun::new(&ctx);
    let x = g.input_f32(&[12, 8, 4, b], f("x")).unwrap();
    let tt = g.input_f32(&[b], t).unwrap();
    let c = g.input_f32(&[48, 7, b], context).unwrap();
    let extras = UnetExtras { motion: mm.map(|modules| Motion { modules, frames, norm_across_frames: across }), ..Default::default() };
    let out = unet.forward_with(&ctx, x, tt, c, &extras).map_err(|e| e.to_string())?;
    Ok(g.compute(backend, &[out], 32768).unwrap().remove(0))
}

fn check(name: &str, mid: bool) {
    check_version(name, mid, false);
}

/// `v1`: a 24-frame table and every GroupNorm over the frames (AnimateDiff-Evolved's v1).
fn check_version(name: &str, mid: bool, v1: bool) {
    let backend = common::backend(2);
    let r = &reference("animatediff_tiny_ref.json")[name];
    let (uw, cfg) = unet_weights(&backend);
    let unet = Unet::new(&uw, PREFIX, cfg).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let want: Vec<f32> = serde_json::from_value(r["out"].clone()).unwrap();
    // As released (optionally under sd.cpp's prefix), and as diffusers saves it.
    for (file, prefix, diffusers) in [("original.safetensors", "", false), ("prefixed.safetensors", "model.diffusion_model.motion_module.", false), ("diffusers.safetensors", "", true)] {
        let path = dir.path().join(file);
        write(r, &path, prefix, diffusers, None);
        let w = load(&path, &backend).unwrap();
        let config = MotionConfig::infer(&w).unwrap();
        assert_eq!((config.has_mid(), config.max_frames, config.modules.len()), (mid, if v1 { 24 } else { 32 }, if mid { 16 } else { 15 }), "{file}");
        assert_eq!((config.at(Slot::Up(2, 2)), config.is_v1()), (Some(32), v1));
        let mm = MotionModules::new(&w, config).unwrap();
        let got = run_with(r, &unet, Some(&mm), 3, v1, &backend).unwrap();
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-3, "{name} ({file}): max abs error {err}");
    }
    // Without the modules the frames come out otherwise: the modules are what is checked.
    let plain = run(r, &unet, None, 3, &backend).unwrap();
    assert!(max_abs_err(&plain, &want) > 1e-2, "{name}: the motion modules change nothing");
}

#[test]
fn v3_motion_modules_match_diffusers() {
    check("v3", false);
}

#[test]
fn v2_motion_modules_with_mid_block_match_diffusers() {
    check("v2", true);
}

#[test]
fn v1_motion_modules_with_groupnorms_over_the_frames_match_the_reference() {
    check_version("v1", false, true);
}

#[test]
fn bad_motion_module_files_and_batches_are_refused_by_name() {
    let backend = common::backend(2);
    let r = &reference("animatediff_tiny_ref.json")["v3"];
    let (uw, cfg) = unet_weights(&backend);
    let unet = Unet::new(&uw, PREFIX, cfg.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mm.safetensors");
    write(r, &path, "", false, None);
    let w = load(&path, &backend).unwrap();
    let mm = MotionModules::new(&w, MotionConfig::infer(&w).unwrap()).unwrap();
    // Six latents are not videos of four frames.
    let e = run(r, &unet, Some(&mm), 4, &backend).unwrap_err();
    assert!(e.contains("not a whole number of 4-frame videos"), "{e}");
    assert!(cfg.check_motion(&mm.config).is_ok());

    // A file that misses the last decoder level's modules fits no UNet.
    let part = dir.path().join("part.safetensors");
    write(r, &part, "", false, Some("up_blocks.2."));
    let w = load(&part, &backend).unwrap();
    let mm = MotionModules::new(&w, MotionConfig::infer(&w).unwrap()).unwrap();
    let e = cfg.check_motion(&mm.config).unwrap_err().to_string();
    assert!(e.contains("only part of the UNet"), "{e}");

    // A file with no positional table, and one that is no motion module at all.
    let nope = dir.path().join("nope.safetensors");
    write(r, &nope, "", false, Some("pos_encoder"));
    let w = load(&nope, &backend).unwrap();
    let e = MotionConfig::infer(&w).unwrap_err().to_string();
    assert!(e.contains("pos_encoder.pe"), "{e}");
    let e = load(&dir.path().join("missing.safetensors"), &backend).err().unwrap();
    assert!(e.contains("missing.safetensors"), "{e}");
    let other = dir.path().join("other.safetensors");
    sdflow_core::io::safetensors::write(&other, [("conv_in.weight", DType::F32, vec![2], &[0u8; 8][..])], &BTreeMap::new()).unwrap();
    let e = load(&other, &backend).err().unwrap();
    assert!(e.contains("not an AnimateDiff motion module"), "{e}");
}
