//! TAESD against diffusers' `AutoencoderTiny` at its real size, in both key layouts
//! (fixtures from tests/fixtures/models/make_taesd.py), and TAEF2 with its pooled
//! GroupNorm blocks against torch (make_taef2.py).

mod common;

use common::{det_values, keys, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::vae::taesd::{Half, Taesd, TaesdConfig};
use sdflow_core::models::Weights;
use std::collections::BTreeMap;

const GRAPH: usize = 2048;

/// The fixture's tensors, each valued by its diffusers name and stored under `rename(name)`
/// (dropped where it returns `None`), loaded through the real safetensors loader.
fn weights(scale: f64, backend: &Backend, rename: impl Fn(&str) -> Option<String>) -> Weights {
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(keys("taesd_keys.json")).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .filter_map(|(name, shape)| {
            let v = det_values(name, shape.iter().product(), scale);
            rename(name).map(|n| (n, shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taesd.safetensors");
    sdflow_core::io::safetensors::write(&path, data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let src = sdflow_core::io::open(&path).unwrap();
    sdflow_core::models::load::load_weights(backend, src.as_ref(), &[""], &sdflow_core::io::TypeRules::none()).unwrap()
}

struct Fixture {
    r: serde_json::Value,
    scale: f64,
}

impl Fixture {
    fn new() -> Self {
        let r = reference("taesd_ref.json");
        let scale = r["scale"].as_f64().unwrap();
        Fixture { r, scale }
    }

    fn floats(&self, k: &str) -> Vec<f32> {
        serde_json::from_value(self.r[k].clone()).unwrap()
    }

    /// [W, H, C, N] of an NCHW shape entry.
    fn ne(&self, k: &str) -> [i64; 4] {
        let s: Vec<i64> = serde_json::from_value(self.r[k].clone()).unwrap();
        [s[3], s[2], s[1], s[0]]
    }
}

/// Run `model` (a `half`) on one input of dimensions `ne`: the output and its dimensions.
fn run_half(backend: &Backend, model: &Taesd<'_>, half: Half, ne: [i64; 4], input: Vec<f32>) -> (Vec<f32>, [i64; 4]) {
    let ctx = Context::new(GRAPH, GRAPH).unwrap();
    let mut run = GraphRun::new(&ctx);
    let x = run.input_f32(&ne, input).unwrap();
    let y = match half {
        Half::Decoder => model.decode(&ctx, x).unwrap(),
        Half::Encoder => model.encode(&ctx, x).unwrap(),
    };
    let shape = y.ne();
    (run.compute(backend, &[y], GRAPH).unwrap().remove(0), shape)
}

fn check_decoder(fx: &Fixture, backend: &Backend, dec: &Taesd<'_>) {
    let n = fx.ne("latent_shape");
    let latent = det_values("input.latent", n.iter().product::<i64>() as usize, 4.0);
    let (got, shape) = run_half(backend, dec, Half::Decoder, n, latent);
    assert_eq!(shape, fx.ne("image_shape"));
    // diffusers returns the [-1, 1] convention; ours is TAESD's [0, 1].
    let got: Vec<f32> = got.iter().map(|v| v * 2.0 - 1.0).collect();
    let err = max_abs_err(&got, &fx.floats("decoded"));
    assert!(err <= 1e-3, "decode: max abs error {err}");
}

#[test]
fn taesd_decode_and_encode_match_diffusers() {
    let backend = common::backend(2);
    let fx = Fixture::new();
    let w = weights(fx.scale, &backend, |n| Some(n.to_string()));
    let dec = Taesd::load(&w, "decoder.layers.", Half::Decoder).unwrap();
    assert_eq!((dec.config.latent_channels, dec.config.channels, dec.config.image_channels, dec.config.first_index), (4, 64, 3, 0));
    check_decoder(&fx, &backend, &dec);

    let enc = Taesd::load(&w, "encoder.layers.", Half::Encoder).unwrap();
    let n = fx.ne("image_shape");
    // diffusers' encoder maps its [-1, 1] input to [0, 1] first; ours takes [0, 1].
    let image: Vec<f32> = det_values("input.image", n.iter().product::<i64>() as usize, 1.0).iter().map(|v| (v + 1.0) / 2.0).collect();
    let (got, shape) = run_half(&backend, &enc, Half::Encoder, n, image);
    assert_eq!(shape, fx.ne("latent_shape"));
    let err = max_abs_err(&got, &fx.floats("encoded"));
    assert!(err <= 1e-3, "encode: max abs error {err}");
}

/// madebyollin's `taesd_decoder.safetensors`: bare keys, every decoder index one higher
/// (its `nn.Sequential` starts with the clamp).
#[test]
fn taesd_original_decoder_file_layout() {
    let backend = common::backend(2);
    let fx = Fixture::new();
    let w = weights(fx.scale, &backend, |n| {
        let rest = n.strip_prefix("decoder.layers.")?;
        let (i, tail) = rest.split_once('.').unwrap();
        Some(format!("{}.{tail}", i.parse::<usize>().unwrap() + 1))
    });
    let dec = Taesd::load(&w, "", Half::Decoder).unwrap();
    assert_eq!(dec.config.first_index, 1);
    check_decoder(&fx, &backend, &dec);
    // The same file holds no encoder.
    assert!(Taesd::load(&w, "", Half::Encoder).is_err());
}

#[test]
fn taesd_rejects_bad_weights_and_inputs() {
    let backend = common::backend(1);
    let fx = Fixture::new();
    let w = weights(fx.scale, &backend, |n| Some(n.to_string()));
    assert!(TaesdConfig::infer(&w, "nothing.", Half::Decoder).is_err());
    let dec = Taesd::load(&w, "decoder.layers.", Half::Decoder).unwrap();
    let enc = Taesd::load(&w, "encoder.layers.", Half::Encoder).unwrap();
    let ctx = Context::new(64, 64).unwrap();
    let mut run = GraphRun::new(&ctx);
    let odd = run.input_f32(&[12, 16, 3, 1], vec![0.0; 576]).unwrap();
    assert!(enc.encode(&ctx, odd).is_err(), "12 is not divisible by 8");
    assert!(dec.encode(&ctx, odd).is_err(), "a decoder does not encode");
    let z3 = run.input_f32(&[4, 4, 3, 1], vec![0.0; 48]).unwrap();
    assert!(dec.decode(&ctx, z3).is_err(), "3-channel latent");

    // A file with one block conv missing fails at construction, naming the tensor.
    let w = weights(fx.scale, &backend, |n| (n != "decoder.layers.8.conv.2.weight").then(|| n.to_string()));
    let e = Taesd::load(&w, "decoder.layers.", Half::Decoder).err().expect("missing weight");
    assert!(e.to_string().contains("decoder.layers.8.conv.2.weight"), "{e}");
    // A wrong width is a shape error.
    let mut cfg = TaesdConfig::infer(&w, "encoder.layers.", Half::Encoder).unwrap();
    cfg.channels = 32;
    let e = Taesd::new(&w, Half::Encoder, cfg).err().expect("wrong width");
    assert!(e.to_string().contains("encoder.layers."), "{e}");
}

/// TAEF2: 32 latent channels, pooled GroupNorm branches in the blocks nearest the latent.
#[test]
fn taef2_decode_and_encode_match_torch() {
    let r = reference("taef2_ref.json");
    let backend = common::backend(2);
    let scale = r["scale"].as_f64().unwrap();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["keys"].clone()).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .map(|(name, shape)| {
            let base = if name.ends_with("pool.1.weight") { 1.0 } else { 0.0 };
            let v: Vec<f32> = det_values(name, shape.iter().product(), scale).iter().map(|x| x + base).collect();
            (name.clone(), shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taef2.safetensors");
    sdflow_core::io::safetensors::write(&path, data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let src = sdflow_core::io::open(&path).unwrap();
    let w = sdflow_core::models::load::load_weights(&backend, src.as_ref(), &[""], &sdflow_core::io::TypeRules::none()).unwrap();
    let ne = |k: &str| -> [i64; 4] {
        let s: Vec<i64> = serde_json::from_value(r[k].clone()).unwrap();
        [s[3], s[2], s[1], s[0]]
    };
    let floats = |k: &str| -> Vec<f32> { serde_json::from_value(r[k].clone()).unwrap() };
    let dec = Taesd::load(&w, "decoder.layers.", Half::Decoder).unwrap();
    assert_eq!(dec.config.latent_channels, 32);
    let n = ne("latent_shape");
    let (got, shape) = run_half(&backend, &dec, Half::Decoder, n, det_values("input.latent", n.iter().product::<i64>() as usize, 4.0));
    assert_eq!(shape, ne("image_shape"));
    let err = max_abs_err(&got, &floats("decoded"));
    assert!(err <= 1e-3, "decode: max abs error {err}");
    let enc = Taesd::load(&w, "encoder.layers.", Half::Encoder).unwrap();
    let n = ne("image_shape");
    let image: Vec<f32> = det_values("input.image", n.iter().product::<i64>() as usize, 1.0).iter().map(|v| v * 0.5 + 0.5).collect();
    let (got, shape) = run_half(&backend, &enc, Half::Encoder, n, image);
    assert_eq!(shape, ne("latent_shape"));
    let err = max_abs_err(&got, &floats("encoded"));
    assert!(err <= 1e-3, "encode: max abs error {err}");
}
