//! workflows/upscale.json (LoadImage → UpscaleModelLoader → ImageUpscaleWithModel →
//! SaveImage) on a tiny random-weight RRDBNet, plus the upscale nodes' options and errors.

use sdflow_core::ggml::Backend;
use sdflow_core::io::TypeRules;
use sdflow_core::models::esrgan::{self, Arch, RrdbConfig, Tiling, Upscaler};
use sdflow_executor::{stub, CancelToken, Executor, ExecutorConfig, InputValue, NodeSpec, NullSink, Registry, RunOptions, Workflow};
use sdflow_nodes::Runtime;
use sdflow_tests::read_png;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const W: u32 = 24;
const H: u32 = 20;

struct Env {
    dir: tempfile::TempDir,
    out: PathBuf,
    exec: Executor,
}

fn tiny_rrdb() -> Arch {
    Arch::Rrdb(RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_grow: 4, num_blocks: 2, num_upsample: 2, unshuffle: 1 })
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models/upscale_models");
    std::fs::create_dir_all(&models).unwrap();
    esrgan::write_random(&models.join("RealESRGAN_x4plus.safetensors"), &tiny_rrdb(), 11).unwrap();
    // Not an upscaler: the loader must say so.
    std::fs::write(models.join("notes.safetensors"), b"not a model").unwrap();
    let other = Arch::Rrdb(RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_grow: 4, num_blocks: 1, num_upsample: 2, unshuffle: 1 });
    let mut t = other.tensor_shapes();
    t.retain(|(n, _)| n != "conv_hr.bias");
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = t.into_iter().map(|(n, s)| { let b = vec![0u8; s.iter().product::<usize>() * 4]; (n, s, b) }).collect();
    sdflow_core::io::safetensors::write(
        &models.join("broken.safetensors"),
        data.iter().map(|(n, s, b)| (n.as_str(), sdflow_core::dtype::DType::F32, s.clone(), b.as_slice())),
        &Default::default(),
    )
    .unwrap();
    let input = dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    let px: Vec<u8> = (0..H).flat_map(|y| (0..W).flat_map(move |x| [(x * 255 / W) as u8, (y * 255 / H) as u8, ((x * y) % 256) as u8])).collect();
    write_png(&input.join("input.png"), W, H, &px);
    let out = dir.path().join("output");
    let rt = Arc::new(Runtime::new(dir.path().join("models"), &out, 2, None).unwrap().with_input_dir(&input));
    let mut reg = Registry::new();
    stub::register(&mut reg);
    sdflow_nodes::register_all(&mut reg, rt);
    Env { exec: Executor::new(Arc::new(reg), ExecutorConfig::default()), out, dir }
}

fn write_png(path: &Path, w: u32, h: u32, px: &[u8]) {
    let mut enc = png::Encoder::new(std::io::BufWriter::new(std::fs::File::create(path).unwrap()), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(px).unwrap();
}


fn workflow(env: &Env) -> Workflow {
    let text = std::fs::read_to_string(sdflow_tests::workflows_dir().join("upscale.json")).unwrap();
    Workflow::parse(&text, env.exec.registry()).unwrap()
}

fn run_saved(env: &Env, wf: &Workflow) -> Result<(u32, u32, Vec<u8>), String> {
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(wf, &NullSink, &CancelToken::new(), &opts).map_err(|e| format!("{e:?}"))?;
    Ok(read_png(&env.out.join(report.ui_outputs["4"]["images"][0]["filename"].as_str().unwrap())))
}

/// The model applied directly through sdflow-core, as 8-bit RGB.
fn direct(env: &Env, px: &[u8], w: usize, h: usize, tile: usize) -> Vec<u8> {
    let backend = Backend::cpu(2).unwrap();
    let src = sdflow_core::io::open(&env.dir.path().join("models/upscale_models/RealESRGAN_x4plus.safetensors")).unwrap();
    let m = Upscaler::load(&backend, src.as_ref(), &TypeRules::none()).unwrap();
    let mut chw = vec![0f32; 3 * w * h];
    for (p, rgb) in px.chunks_exact(3).enumerate() {
        for c in 0..3 {
            chw[c * w * h + p] = rgb[c] as f32 / 255.0;
        }
    }
    let (out, ow, oh) = esrgan::upscale_planar::<sdflow_core::models::ModelError>(&m, &backend, &chw, w, h, Tiling { tile }, |_, _| Ok(())).unwrap();
    (0..ow * oh).flat_map(|p| (0..3).map(move |c| (p, c))).map(|(p, c)| (out[c * ow * oh + p].clamp(0.0, 1.0) * 255.0).round() as u8).collect()
}

fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap()
}

#[test]
fn upscale_workflow_runs_the_model() {
    let env = env();
    let wf = workflow(&env);
    env.exec.validate(&wf).unwrap();
    let (w, h, px) = run_saved(&env, &wf).unwrap();
    assert_eq!((w, h), (4 * W, 4 * H));
    let (_, _, input) = read_png(&env.dir.path().join("input/input.png"));
    assert!(max_diff(&px, &direct(&env, &input, W as usize, H as usize, 128)) <= 1, "the node differs from the model run directly");

    // Smaller tiles: several tiles, blended, close to the one-tile result.
    let mut tiled = wf.clone();
    tiled.set_input("3", "tile_size", InputValue::Const(json!(8))).unwrap();
    let (_, _, px8) = run_saved(&env, &tiled).unwrap();
    assert!(max_diff(&px8, &direct(&env, &input, W as usize, H as usize, 8)) <= 1);
    assert_ne!(px8, px, "tile size 8 splits the 24x20 image");

    // Two passes: ×16.
    let mut twice = wf.clone();
    twice.set_input("3", "repeats", InputValue::Const(json!(2))).unwrap();
    let (w2, h2, _) = run_saved(&env, &twice).unwrap();
    assert_eq!((w2, h2), (16 * W, 16 * H));
}

#[test]
fn image_scale_by_resizes() {
    let env = env();
    let mut wf = workflow(&env);
    wf.add("5", NodeSpec::new("ImageScaleBy").with_link("image", "1", 0).with_const("upscale_method", json!("bilinear")).with_const("scale_by", json!(1.5)));
    wf.set_input("4", "images", InputValue::link("5", 0)).unwrap();
    let (w, h, _) = run_saved(&env, &wf).unwrap();
    assert_eq!((w, h), (36, 30));
}

#[test]
fn bad_models_and_options_are_errors() {
    let env = env();
    for (name, expect) in [("notes.safetensors", "notes.safetensors"), ("broken.safetensors", "conv_hr.bias")] {
        let mut wf = workflow(&env);
        wf.set_input("2", "model_name", InputValue::Const(json!(name))).unwrap();
        let e = run_saved(&env, &wf).expect_err(name);
        assert!(e.contains(expect), "{name}: {e}");
    }
    let mut wf = workflow(&env);
    wf.set_input("2", "model_name", InputValue::Const(json!("missing.pth"))).unwrap();
    assert!(env.exec.validate(&wf).is_err(), "unknown model name");
    let mut wf = workflow(&env);
    wf.set_input("3", "tile_size", InputValue::Const(json!(2))).unwrap();
    assert!(env.exec.validate(&wf).is_err(), "tile_size below 8");
    let mut wf = workflow(&env);
    wf.set_input("3", "repeats", InputValue::Const(json!(8))).unwrap();
    let e = run_saved(&env, &wf).expect_err("4^8 times the pixels");
    assert!(e.contains("image limit"), "{e}");
}
