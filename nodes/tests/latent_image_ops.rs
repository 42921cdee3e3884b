//! ComfyUI's latent and image nodes of the second batch against ComfyUI's own code: the
//! fixture (`fixtures/latent_image_ops/latent_image_ops.json`, written by its `gen.py`) holds
//! the outputs of ComfyUI's node classes, loaded from its sources and run on seeded tensors
//! (including the inputs on which ComfyUI fails, where ours must fail too), and their
//! `/object_info` entries.

use sdflow_executor::{InputData, IoType, NodeError, Outputs, Value};
use sdflow_nodes::values::{Image, Latent, Mask};
use serde_json::{json, Value as Json};

mod common;
use common::{env, image, latent, mask};

common::fixture!("fixtures/latent_image_ops/latent_image_ops.json");

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= tol, "{what}: worst difference {worst}");
}

/// Each node's `/object_info` entry against ComfyUI's.
#[test]
fn object_info_matches_comfyui_definitions() {
    let schemas = fixture()["schemas"].as_object().unwrap();
    assert_eq!(schemas.len(), 27);
    common::assert_object_info_matches(&env(1).registry, schemas);
}

/// Every case's outputs within 1e-5 of ComfyUI's (the latent's noise mask and batch indices
/// included), and an error wherever ComfyUI fails.
#[test]
fn nodes_match_comfyui() {
    let env = env(1);
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() > 250);
    let (mut errors, mut checked) = (0, 0);
    for case in cases {
        let node = case["node"].as_str().unwrap();
        let ins = &case["inputs"];
        let what = format!("{node} {ins}");
        let schema = env.registry.schema(node).unwrap();
        let mut inputs = Vec::new();
        for (k, v) in ins.as_object().unwrap() {
            let io = schema.find_input(k).unwrap_or_else(|| panic!("{what}: no input {k}")).kind.io_type();
            let name = v.as_str().unwrap_or_default();
            let data = match io.as_str() {
                "LATENT" => InputData::Value(Value::new(IoType::LATENT, latent(&f["latents"][name]))),
                "IMAGE" => InputData::Value(Value::new(IoType::IMAGE, image(&f["images"][name]))),
                "MASK" => InputData::Value(Value::new(IoType::MASK, mask(&f["masks"][name]))),
                _ => InputData::Const(v.clone()),
            };
            inputs.push((k.as_str(), data));
        }
        let got = env.run(node, inputs);
        if let Some(e) = case.get("error") {
            match got {
                Err(NodeError::InvalidInput { .. }) => errors += 1,
                other => panic!("{what}: ComfyUI fails ({e}); ours gave {:?}", other.map(|o| o.values.len())),
            }
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = case["out"].as_array().unwrap();
        assert_eq!(got.values.len(), want.len(), "{what}: outputs");
        for (i, (v, w)) in got.values.iter().zip(want).enumerate() {
            let what = format!("{what} output {i}");
            match v.io_type().as_str() {
                "LATENT" => {
                    let (g, w) = (v.downcast_ref::<Latent>().unwrap(), latent(w));
                    assert_eq!(g.shape, w.shape, "{what}: shape");
                    close(&g.samples, &w.samples, 1e-5, &what);
                    assert_eq!(g.batch_index, w.batch_index, "{what}: batch_index");
                    match (&g.noise_mask, &w.noise_mask) {
                        (None, None) => {}
                        (Some(a), Some(b)) => {
                            assert_eq!((a.n, a.height, a.width), (b.n, b.height, b.width), "{what}: noise mask size");
                            close(&a.data, &b.data, 1e-6, &format!("{what}: noise mask"));
                        }
                        (a, b) => panic!("{what}: noise mask {:?}, ComfyUI's {:?}", a.is_some(), b.is_some()),
                    }
                }
                "IMAGE" => {
                    let (g, w) = (v.downcast_ref::<Image>().unwrap(), image(w));
                    assert_eq!((g.n, g.height, g.width, g.channels), (w.n, w.height, w.width, w.channels), "{what}: shape");
                    close(&g.data, &w.data, 1e-5, &what);
                }
                "MASK" => {
                    let (g, w) = (v.downcast_ref::<Mask>().unwrap(), mask(w));
                    assert_eq!((g.n, g.height, g.width), (w.n, w.height, w.width), "{what}: shape");
                    close(&g.data, &w.data, 1e-5, &what);
                }
                t => panic!("{what}: output type {t}"),
            }
        }
        checked += 1;
    }
    assert!(errors >= 20 && checked > 220, "{errors} failing and {checked} passing cases");
}

/// Inputs ComfyUI would fail on, or that would allocate without bound, are errors that
/// name the input.
#[test]
fn bad_inputs_are_named() {
    let env = env(1);
    let l = |n: usize, c: usize, h: usize, w: usize| InputData::Value(Value::new(IoType::LATENT, Latent::new(vec![0.5; n * c * h * w], [w as i64, h as i64, c as i64, n as i64])));
    let img = |n: usize, h: usize, w: usize, c: usize| InputData::Value(Value::new(IoType::IMAGE, Image { data: vec![0.5; n * h * w * c], n, height: h, width: w, channels: c }));
    let c = |v: Json| InputData::Const(v);
    let named = |r: Result<Outputs, NodeError>| match r {
        Err(NodeError::InvalidInput { input, .. }) => input,
        Err(e) => panic!("expected an invalid-input error, got {e}"),
        Ok(_) => panic!("expected an invalid-input error, got outputs"),
    };
    assert_eq!(named(env.run("LatentAdd", vec![("samples1", l(1, 4, 8, 8)), ("samples2", l(1, 16, 8, 8))])), "samples2");
    assert_eq!(named(env.run("LatentInterpolate", vec![("samples1", l(2, 4, 8, 8)), ("samples2", l(2, 4, 8, 8)), ("ratio", c(json!(0.5)))])), "samples1");
    assert_eq!(named(env.run("LatentConcat", vec![("samples1", l(1, 4, 8, 8)), ("samples2", l(1, 4, 6, 8)), ("dim", c(json!("x")))])), "samples2");
    assert_eq!(named(env.run("LatentConcat", vec![("samples1", l(1, 4, 8, 8)), ("samples2", l(1, 4, 8, 8)), ("dim", c(json!("z")))])), "dim");
    assert_eq!(named(env.run("LatentCut", vec![("samples", l(1, 4, 8, 8)), ("dim", c(json!("x"))), ("index", c(json!(0))), ("amount", c(json!(0)))])), "amount");
    assert_eq!(named(env.run("LatentFromBatch", vec![("samples", l(2, 4, 8, 8)), ("batch_index", c(json!(-1))), ("length", c(json!(1)))])), "batch_index");
    assert_eq!(named(env.run("RepeatLatentBatch", vec![("samples", l(1, 4, 8, 8)), ("amount", c(json!(i64::MAX)))])), "amount");
    assert_eq!(named(env.run("LatentComposite", vec![("samples_to", l(1, 4, 8, 8)), ("samples_from", l(1, 4, 8, 8)), ("x", c(json!(64))), ("y", c(json!(0))), ("feather", c(json!(0)))])), "x");
    assert_eq!(named(env.run("LatentCrop", vec![("samples", l(1, 4, 8, 8)), ("width", c(json!(0))), ("height", c(json!(64))), ("x", c(json!(0))), ("y", c(json!(0)))])), "width");
    let malformed = InputData::Value(Value::new(IoType::LATENT, Latent::new(vec![0.0; 3], [2, 2, 1, 1])));
    assert_eq!(named(env.run("LatentMultiply", vec![("samples", malformed), ("multiplier", c(json!(2.0)))])), "samples");
    assert_eq!(named(env.run("ImageBlur", vec![("image", img(1, 3, 8, 3)), ("blur_radius", c(json!(3))), ("sigma", c(json!(1.0)))])), "blur_radius");
    assert_eq!(named(env.run("ImageBlur", vec![("image", img(1, 8, 8, 3)), ("blur_radius", c(json!(1))), ("sigma", c(json!(0.0)))])), "sigma");
    assert_eq!(named(env.run("ImageSharpen", vec![("image", img(1, 8, 8, 3)), ("sharpen_radius", c(json!(-1))), ("sigma", c(json!(1.0))), ("alpha", c(json!(1.0)))])), "sharpen_radius");
    assert_eq!(named(env.run("ImageBatch", vec![("image1", img(1, 8, 8, 3)), ("image2", img(1, 8, 8, 4))])), "image2");
    assert_eq!(named(env.run("RepeatImageBatch", vec![("image", img(1, 1024, 1024, 3)), ("amount", c(json!(4096)))])), "amount");
    assert_eq!(named(env.run("ImageColorToMask", vec![("image", img(1, 8, 8, 1)), ("color", c(json!(0)))])), "image");
    assert_eq!(named(env.run("ImageBlend", vec![("image1", img(1, 8, 8, 3)), ("image2", img(1, 8, 8, 3)), ("blend_factor", c(json!(0.5))), ("blend_mode", c(json!("hue")))])), "blend_mode");
    let m = |n: usize| InputData::Value(Value::new(IoType::MASK, Mask { data: vec![0.0; n * 64], n, height: 8, width: 8 }));
    let pd = env.run("PorterDuffImageComposite", vec![("source", img(1, 8, 8, 4)), ("source_alpha", m(1)), ("destination", img(1, 8, 8, 3)), ("destination_alpha", m(1)), ("mode", c(json!("SRC_OVER")))]);
    assert_eq!(named(pd), "source");
    // A blur radius of 0 gives the image back as it is, as ComfyUI does.
    let out = env.run("ImageBlur", vec![("image", img(1, 4, 4, 3)), ("blur_radius", c(json!(0))), ("sigma", c(json!(1.0)))]).unwrap();
    assert_eq!(out.values[0].downcast_ref::<Image>().unwrap().data, vec![0.5; 48]);
}

/// The batch indices these nodes keep decide each sample's noise, as in ComfyUI's
/// `prepare_noise`: a sample taken from a batch with LatentFromBatch is sampled as it was
/// in the batch, and LatentBatchSeedBehavior "fixed" gives every sample the first one's
/// noise. On a tiny SD1 model, through KSampler.
#[test]
fn batch_indices_keep_each_samples_noise() {
    use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
    let env = env(1);
    let ckpts = env.dir.path().join("checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), sdflow_core::dtype::DType::F32, 7, Format::Safetensors).unwrap();
    let loaded = env.run("CheckpointLoaderSimple", vec![("ckpt_name", InputData::Const(json!("model.safetensors")))]).unwrap();
    let text = |t: &str| env.run("CLIPTextEncode", vec![("clip", InputData::Value(loaded.values[1].clone())), ("text", InputData::Const(json!(t)))]).unwrap().values[0].clone();
    let (positive, negative) = (text("a lighthouse"), text("fog"));
    let sample = |latent: Value| -> Latent {
        let inputs = vec![
            ("model", InputData::Value(loaded.values[0].clone())),
            ("seed", InputData::Const(json!(9))),
            ("steps", InputData::Const(json!(2))),
            ("cfg", InputData::Const(json!(2.0))),
            ("sampler_name", InputData::Const(json!("euler"))),
            ("scheduler", InputData::Const(json!("karras"))),
            ("positive", InputData::Value(positive.clone())),
            ("negative", InputData::Value(negative.clone())),
            ("latent_image", InputData::Value(latent)),
            ("denoise", InputData::Const(json!(0.8))),
        ];
        env.run("KSampler", inputs).unwrap().values[0].downcast_ref::<Latent>().unwrap().clone()
    };
    let per = 4 * 8 * 8;
    let batch = Latent::new((0..3 * per).map(|i| ((i * 29 % 97) as f32 / 48.0 - 1.0) * 2.0).collect(), [8, 8, 4, 3]);
    let all = sample(Value::new(IoType::LATENT, batch.clone()));
    let picked = env.run("LatentFromBatch", vec![("samples", InputData::Value(Value::new(IoType::LATENT, batch.clone()))), ("batch_index", InputData::Const(json!(2))), ("length", InputData::Const(json!(1)))]).unwrap();
    assert_eq!(picked.values[0].downcast_ref::<Latent>().unwrap().batch_index, Some(vec![2]));
    let alone = sample(picked.values[0].clone());
    // Batched and single model runs differ in summation order only.
    let spread = all.samples.iter().fold(1f32, |m, v| m.max(v.abs()));
    close(&alone.samples, &all.samples[2 * per..], 1e-4 * spread, "sample 2 taken from the batch");
    // The same values without the index get the seed's first noise, and come out otherwise.
    let plain = sample(Value::new(IoType::LATENT, Latent::new(batch.samples[2 * per..].to_vec(), [8, 8, 4, 1])));
    assert!(plain.samples.iter().zip(&alone.samples).any(|(a, b)| (a - b).abs() > 1e-2));

    let one = Value::new(IoType::LATENT, Latent::new(batch.samples[..per].to_vec(), [8, 8, 4, 1]));
    let three = env.run("RepeatLatentBatch", vec![("samples", InputData::Value(one)), ("amount", InputData::Const(json!(3)))]).unwrap().values[0].clone();
    for (behavior, same) in [("fixed", true), ("random", false)] {
        let l = env.run("LatentBatchSeedBehavior", vec![("samples", InputData::Value(three.clone())), ("seed_behavior", InputData::Const(json!(behavior)))]).unwrap().values[0].clone();
        let out = sample(l);
        let apart = out.samples[..per].iter().zip(&out.samples[2 * per..]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert_eq!(apart <= 1e-4 * spread, same, "{behavior}: the first and last samples are {apart} apart");
    }
}
