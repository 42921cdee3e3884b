//! Image, mask and VAE nodes end to end: the outpainting and tiled-VAE workflows, VAELoader
//! with standalone VAE files, the automatic fall-back to tiles, and the image/mask nodes
//! through the executor.

use sdflow_core::models::vae::tiling::VaeTiling;
use sdflow_executor::{CancelToken, InputValue, NullSink, RunOptions, Workflow};
use sdflow_tests::{read_png, TestEnv};
use std::collections::BTreeMap;

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

/// An API-format workflow from JSON.
fn api(env: &TestEnv, json: serde_json::Value) -> Workflow {
    Workflow::parse(&json.to_string(), env.exec.registry()).unwrap()
}

fn mean_diff(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x.abs_diff(*y) as f64).sum::<f64>() / a.len() as f64
}

/// Mean absolute difference of two RGB images over columns `x0..x1`.
fn region_diff(a: &[u8], b: &[u8], w: usize, x0: usize, x1: usize) -> f64 {
    let (mut sum, mut n) = (0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let col = (i / 3) % w;
        if (x0..x1).contains(&col) {
            sum += x.abs_diff(*y) as f64;
            n += 1;
        }
    }
    sum / n as f64
}

#[test]
fn outpaint_grows_the_canvas_and_paints_the_new_strip() {
    let env = TestEnv::new(|rt| rt);
    let mut wf = env.workflow("outpaint.json", 64, 3);
    wf.set_input("5", "right", c(serde_json::json!(24))).unwrap();
    wf.set_input("5", "feathering", c(serde_json::json!(8))).unwrap();
    let (w, h, painted) = env.run_saved(&wf, "9");
    assert_eq!((w, h), (72 + 24, 56), "the canvas grew by the right margin");
    // Another seed re-samples the masked strip; the latent of the picture away from the
    // mask (and its grown, feathered edge) is held, so only the decoder's global layers
    // (mid attention, group norms) carry the strip's change into it.
    let mut other = wf.clone();
    other.set_input("7", "seed", c(serde_json::json!(43))).unwrap();
    let (_, _, painted2) = env.run_saved(&other, "9");
    let strip = region_diff(&painted, &painted2, w as usize, 72, 96);
    let picture = region_diff(&painted, &painted2, w as usize, 0, 40);
    eprintln!("mean difference between seeds: new strip {strip:.2}, far picture {picture:.2}");
    assert!(strip > 5.0 * picture, "the strip was painted ({strip:.2}) and the picture kept ({picture:.2})");
    // Without the sampler, the strip is the grey the pad put there.
    let mut direct = wf.clone();
    direct.set_input("8", "samples", InputValue::link("6", 0)).unwrap();
    let (_, _, grey) = env.run_saved(&direct, "9");
    assert!(region_diff(&painted, &grey, w as usize, 72, 96) > strip / 4.0);
}

#[test]
fn tiled_vae_workflow_runs_and_agrees_with_vae_decode() {
    let env = TestEnv::new(|rt| rt);
    let wf = env.workflow("txt2img_tiled_vae.json", 128, 2);
    // One tile holds the whole 128² image: exactly VAEDecode's result.
    let mut one = wf.clone();
    one.set_input("6", "tile_size", c(serde_json::json!(128))).unwrap();
    let (w, h, tiled_one) = env.run_saved(&one, "7");
    assert_eq!((w, h), (128, 128));
    let mut plain = wf.clone();
    plain.nodes.insert("6".into(), sdflow_executor::NodeSpec::new("VAEDecode").with_input("samples", InputValue::link("5", 0)).with_input("vae", InputValue::link("1", 2)));
    let (_, _, whole) = env.run_saved(&plain, "7");
    assert_eq!(tiled_one, whole, "a single tile is the untiled decode");
    // 64-pixel tiles (8 latent) overlapping by 16: a different, nearby image.
    let mut small = wf.clone();
    small.set_input("6", "tile_size", c(serde_json::json!(64))).unwrap();
    small.set_input("6", "overlap", c(serde_json::json!(16))).unwrap();
    let (_, _, tiled) = env.run_saved(&small, "7");
    let d = mean_diff(&tiled, &whole);
    eprintln!("64-pixel tiles: mean difference {d:.2} of 255");
    assert!(tiled != whole && d < 40.0, "mean difference {d}");
}

/// sd-cli's tile options on VAEDecodeTiled: a tile height of its own (`--vae-tile-size
/// WxH`) and relative tile sizes (`--vae-relative-tile-size`).
#[test]
fn tiled_decode_takes_sd_cli_tile_shapes() {
    let env = TestEnv::new(|rt| rt);
    let wf = env.workflow("txt2img_tiled_vae.json", 128, 2);
    let run = |sets: &[(&str, serde_json::Value)]| {
        let mut w = wf.clone();
        for (k, v) in sets {
            w.set_input("6", k, c(v.clone())).unwrap();
        }
        env.run_saved(&w, "7").2
    };
    let whole = run(&[("tile_size", serde_json::json!(128))]);
    let square = run(&[("tile_size", serde_json::json!(64)), ("overlap", serde_json::json!(16))]);
    let tall = run(&[("tile_size", serde_json::json!(64)), ("overlap", serde_json::json!(16)), ("tile_height", serde_json::json!(128))]);
    assert!(tall != square && tall != whole, "64x128 tiles split the image only across");
    assert!(run(&[("tile_size", serde_json::json!(128)), ("tile_height", serde_json::json!(128))]) == whole);
    // Relative sizes override tile_size: the whole latent side is one tile; 2 is two tiles.
    assert!(run(&[("tile_size", serde_json::json!(64)), ("relative_tile_size", serde_json::json!("1"))]) == whole);
    let halves = run(&[("tile_size", serde_json::json!(512)), ("overlap", serde_json::json!(16)), ("relative_tile_size", serde_json::json!("2x1"))]);
    assert!(halves != whole && halves != tall);
    let mut bad = wf.clone();
    bad.set_input("6", "relative_tile_size", c(serde_json::json!("wide"))).unwrap();
    let err = env.run_err(&bad);
    assert!(err.contains("relative_tile_size"), "{err}");
}

#[test]
fn vae_encode_tiled_with_one_tile_equals_vae_encode() {
    let env = TestEnv::new(|rt| rt);
    // 72x56 scaled to 160x128: a 20x16 latent, several 64-pixel tiles.
    let graph = |encode: serde_json::Value| {
        api(&env, serde_json::json!({
            "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "model.safetensors"}},
            "0": {"class_type": "LoadImage", "inputs": {"image": "input.png"}},
            "2": {"class_type": "ImageScale", "inputs": {"image": ["0", 0], "upscale_method": "bilinear", "width": 160, "height": 128, "crop": "disabled"}},
            "3": encode,
            "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 2]}},
            "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "enc"}}
        }))
    };
    let (_, _, plain) = env.run_saved(&graph(serde_json::json!({"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 2]}})), "5");
    let tiled = |tile: i64| {
        graph(serde_json::json!({"class_type": "VAEEncodeTiled", "inputs": {"pixels": ["2", 0], "vae": ["1", 2], "tile_size": tile, "overlap": 32, "temporal_size": 64, "temporal_overlap": 8}}))
    };
    let (w, h, one) = env.run_saved(&tiled(512), "5");
    assert_eq!((w, h), (160, 128));
    assert_eq!(one, plain);
    let (_, _, several) = env.run_saved(&tiled(64), "5");
    let d = mean_diff(&several, &plain);
    eprintln!("64-pixel encoder tiles: mean difference {d:.2} of 255");
    // How close tiles come to the whole image is checked in core (models_vae_tiling); on
    // random weights the per-tile group norms move the latent far.
    assert_ne!(several, plain, "the tiled encoding is a different latent");
}

/// The checkpoint's VAE tensors written as a standalone file, names mapped by `rename`.
fn write_vae(env: &TestEnv, file: &str, rename: impl Fn(&str) -> String) {
    let src = sdflow_core::io::open(&env.dir.path().join("models/checkpoints/model.safetensors")).unwrap();
    let tensors: Vec<(String, sdflow_core::dtype::DType, Vec<usize>, Vec<u8>)> = src
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("first_stage_model."))
        .map(|t| (rename(&t.name), t.dtype, t.shape.clone(), src.read(&t.name).unwrap().into_owned()))
        .collect();
    let dir = env.dir.path().join("models/vae");
    std::fs::create_dir_all(&dir).unwrap();
    // io::open reads a leading 0x80 as a pickle; a safetensors header length may start
    // with it, so pad the header until it does not.
    for pad in 0..4 {
        let meta: BTreeMap<String, String> = (pad > 0).then(|| ("pad".to_string(), "x".repeat(pad))).into_iter().collect();
        sdflow_core::io::safetensors::write(&dir.join(file), tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())), &meta).unwrap();
        if std::fs::read(dir.join(file)).unwrap()[0] != 0x80 {
            return;
        }
    }
    panic!("cannot write {file}");
}

#[test]
fn vae_loader_reads_standalone_files_like_the_checkpoint_vae() {
    let env = TestEnv::new(|rt| rt);
    write_vae(&env, "bare.safetensors", |n| n.strip_prefix("first_stage_model.").unwrap().to_string());
    write_vae(&env, "prefixed.safetensors", |n| n.to_string());
    write_vae(&env, "broken.safetensors", |n| n.replace("decoder.up", "decoder.nope"));
    // The node catalogue lists the files (registered after they exist).
    let env = TestEnv::with_dir(env.dir, |rt| rt);
    let mut wf = env.workflow("txt2img.json", 64, 2);
    let (_, _, reference) = env.run_saved(&wf, "7");
    for name in ["bare.safetensors", "prefixed.safetensors"] {
        wf.nodes.insert("10".into(), sdflow_executor::NodeSpec::new("VAELoader").with_input("vae_name", c(serde_json::json!(name))));
        wf.set_input("6", "vae", InputValue::link("10", 0)).unwrap();
        let (_, _, got) = env.run_saved(&wf, "7");
        assert_eq!(got, reference, "{name}");
    }
    wf.set_input("10", "vae_name", c(serde_json::json!("broken.safetensors"))).unwrap();
    let e = env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).err().expect("no decoder");
    assert!(format!("{e} {e:?}").contains("broken.safetensors"), "{e}");
    wf.set_input("10", "vae_name", c(serde_json::json!("missing.safetensors"))).unwrap();
    assert!(env.exec.validate(&wf).is_err());
}

#[test]
fn vae_decode_retries_in_tiles_when_the_buffer_is_refused() {
    let tiles = VaeTiling { tile_size: (4, 4), ..VaeTiling::default() };
    let run = |tiling: VaeTiling| {
        let env = TestEnv::new(move |rt| rt.with_vae_tiling(tiling));
        let wf = env.workflow("txt2img.json", 64, 2);
        env.run_saved(&wf, "7").2
    };
    let whole = run(VaeTiling::default());
    let forced = run(VaeTiling { enabled: true, ..tiles.clone() });
    let retried = run(VaeTiling { max_compute_bytes: Some(256 << 10), ..tiles.clone() });
    assert_eq!(retried, forced, "over the threshold, VAEDecode decodes in the configured tiles");
    assert_ne!(whole, forced);
    assert_eq!(run(VaeTiling { max_compute_bytes: Some(1 << 36), ..tiles }), whole, "under it, whole");
}

#[test]
fn image_and_mask_nodes_through_the_executor() {
    let env = TestEnv::new(|rt| rt);
    let wf = api(&env, serde_json::json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "input.png"}},
        "2": {"class_type": "ImageCrop", "inputs": {"image": ["1", 0], "width": 40, "height": 40, "x": 64, "y": 8}},
        "3": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "crop"}},
        "5": {"class_type": "EmptyImage", "inputs": {"width": 6, "height": 4, "batch_size": 2, "color": 0xFF8000}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "empty"}},
        "7": {"class_type": "ImageToMask", "inputs": {"image": ["1", 0], "channel": "red"}},
        "8": {"class_type": "ThresholdMask", "inputs": {"mask": ["7", 0], "value": 0.5}},
        "9": {"class_type": "GrowMask", "inputs": {"mask": ["8", 0], "expand": 3, "tapered_corners": true}},
        "10": {"class_type": "FeatherMask", "inputs": {"mask": ["9", 0], "left": 4, "top": 0, "right": 0, "bottom": 0}},
        "11": {"class_type": "MaskComposite", "inputs": {"destination": ["10", 0], "source": ["12", 0], "x": 0, "y": 0, "operation": "multiply"}},
        "12": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 72, "height": 56}},
        "13": {"class_type": "InvertMask", "inputs": {"mask": ["11", 0]}},
        "14": {"class_type": "CropMask", "inputs": {"mask": ["13", 0], "x": 0, "y": 0, "width": 72, "height": 56}},
        "15": {"class_type": "MaskToImage", "inputs": {"mask": ["14", 0]}},
        "16": {"class_type": "ImageCompositeMasked", "inputs": {"destination": ["1", 0], "source": ["5", 0], "x": 70, "y": 54, "resize_source": false}},
        "17": {"class_type": "SaveImage", "inputs": {"images": ["15", 0], "filename_prefix": "mask"}},
        "18": {"class_type": "SaveImage", "inputs": {"images": ["16", 0], "filename_prefix": "composite"}}
    }));
    let report = env.exec.run(&wf, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).unwrap();
    let png = |node: &str, i: usize| read_png(&env.out.join(report.ui_outputs[node]["images"][i]["filename"].as_str().unwrap()));
    // x clamps to the last column; the crop is clipped at the border: 8 wide, 40 high.
    let (w, h, px) = png("4", 0);
    assert_eq!((w, h), (8, 40));
    let (_, _, src) = read_png(&env.dir.path().join("input/input.png"));
    assert_eq!(px[0], 255 - src[(8 * 72 + 64) * 3], "inverted crop of the input at (64, 8)");
    let (w, h, px) = png("6", 1);
    assert_eq!((w, h, &px[..3]), (6, 4, &[255u8, 128, 0][..]), "second image of the batch, colour 0xFF8000");
    // The red channel rises left to right: thresholded at 0.5, grown by 3, inverted.
    let (w, _, px) = png("17", 0);
    let row: Vec<u8> = (0..w as usize).map(|x| px[x * 3]).collect();
    let first_masked = row.iter().position(|v| *v < 128).unwrap();
    assert!((32..=36).contains(&first_masked), "mask starts at column {first_masked}: {row:?}");
    // The 6x4 source pasted at (70, 54) covers only the 2x2 corner that fits.
    let (_, _, px) = png("18", 0);
    assert_eq!(&px[(55 * 72 + 71) * 3..][..3], &[255, 128, 0]);
    assert_eq!(&px[(53 * 72 + 71) * 3..][..3], &src[(53 * 72 + 71) * 3..][..3]);
}
