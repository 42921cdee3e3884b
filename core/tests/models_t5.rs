//! T5 v1.1 and UMT5 encoders against transformers' `T5EncoderModel` / `UMT5EncoderModel`
//! on tiny random weights (fixtures from tests/fixtures/models/make_t5.py; the weights are
//! regenerated here), in Hugging Face names and in llama.cpp's GGUF names.

mod common;

use std::collections::BTreeMap;

use common::{det_values, det_weights, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::io::TypeRules;
use sdflow_core::models::load::load_weights;
use sdflow_core::models::t5::{self, relative_position_bucket, T5Config, T5Encoder};
use sdflow_core::models::Weights;

const SCALE: f64 = 0.3;

fn fixture() -> serde_json::Value {
    reference("t5_tiny_ref.json")
}

fn run(w: &Weights, prefix: &str, keep: Option<&[Vec<bool>]>) -> Vec<f32> {
    let r = fixture();
    let tokens: Vec<Vec<i32>> = serde_json::from_value(r["tokens"].clone()).unwrap();
    let cfg = T5Config::infer(w, prefix).unwrap();
    let model = T5Encoder::new(w, prefix, cfg).unwrap();
    let backend = common::backend(2);
    let ctx = Context::new(4096, 4096).unwrap();
    let mut graph = GraphRun::new(&ctx);
    let out = model.forward(&ctx, &mut graph, &tokens, keep).unwrap();
    assert_eq!(out.ne(), [48, 9, 2, 1]);
    graph.compute(&backend, &[out], 4096).unwrap().remove(0)
}

fn keep() -> Vec<Vec<bool>> {
    let k: Vec<Vec<u8>> = serde_json::from_value(fixture()["keep"].clone()).unwrap();
    k.into_iter().map(|s| s.into_iter().map(|b| b == 1).collect()).collect()
}

fn check(key: &str, bias_per_layer: bool) {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r[key]["keys"], SCALE, &backend);
    let cfg = T5Config::infer(&w, "").unwrap();
    assert_eq!((cfg.d_model, cfg.layers, cfg.heads, cfg.d_kv, cfg.d_ff, cfg.vocab, cfg.buckets), (48, 3, 5, 12, 80, 1000, 32));
    assert_eq!(cfg.bias_per_layer, bias_per_layer);
    for (mask, want) in [(None, "plain"), (Some(keep()), "masked")] {
        let got = run(&w, "", mask.as_deref());
        let want: Vec<f32> = serde_json::from_value(r[key][want].clone()).unwrap();
        let err = max_abs_err(&got, &want);
        assert!(err <= 1e-3, "{key} {}: max abs error {err}", if mask.is_some() { "masked" } else { "plain" });
    }
}

#[test]
fn t5_matches_transformers() {
    check("t5", false);
}

#[test]
fn umt5_matches_transformers() {
    check("umt5", true);
}

#[test]
fn position_buckets_match_transformers_at_every_distance() {
    let r = fixture();
    let from = r["buckets"]["from"].as_i64().unwrap();
    let want: Vec<i64> = serde_json::from_value(r["buckets"]["values"].clone()).unwrap();
    for (i, &b) in want.iter().enumerate() {
        let rel = from + i as i64;
        assert_eq!(relative_position_bucket(rel, 32, 128), b, "distance {rel}");
    }
}

/// The fixture's weights written as a file under other names (`rename` maps each Hugging
/// Face name), opened through the loader.
fn write_renamed(key: &str, dir: &std::path::Path, file: &str, rename: impl Fn(&str) -> String) -> std::path::PathBuf {
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(fixture()[key]["keys"].clone()).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .map(|(n, s)| (rename(n), s.clone(), det_values(n, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let path = dir.join(file);
    let tensors = data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice()));
    if file.ends_with(".gguf") {
        sdflow_core::io::gguf::write(&path, &[], tensors).unwrap();
    } else {
        sdflow_core::io::safetensors::write(&path, tensors, &BTreeMap::new()).unwrap();
    }
    path
}

/// llama.cpp's names for a Hugging Face T5 encoder name.
fn llama_cpp_name(hf: &str) -> String {
    t5::gguf_name(hf).unwrap_or_else(|| panic!("{hf}"))
}

#[test]
fn gguf_names_are_llama_cpps() {
    // Spot checks from llama.cpp's tensor map (`LLM_ARCH_T5` encoder names).
    for (gguf, hf) in [
        ("token_embd.weight", "shared.weight"),
        ("enc.output_norm.weight", "encoder.final_layer_norm.weight"),
        ("enc.blk.0.attn_rel_b.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        ("enc.blk.3.ffn_gate.weight", "encoder.block.3.layer.1.DenseReluDense.wi_0.weight"),
        ("enc.blk.23.ffn_up.weight", "encoder.block.23.layer.1.DenseReluDense.wi_1.weight"),
        ("enc.blk.7.attn_o.weight", "encoder.block.7.layer.0.SelfAttention.o.weight"),
    ] {
        assert_eq!(t5::hf_name(gguf).as_deref(), Some(hf));
        assert_eq!(t5::gguf_name(hf).as_deref(), Some(gguf));
    }
    for decoder in ["dec.blk.0.attn_q.weight", "enc.blk.x.attn_q.weight", "enc.blk.0.attn_q.bias", "output.weight"] {
        assert_eq!(t5::hf_name(decoder), None, "{decoder}");
    }
}

#[test]
fn gguf_names_and_prefixed_files_load_the_same_encoder() {
    let backend = common::backend(2);
    let dir = tempfile::tempdir().unwrap();
    let want: Vec<f32> = serde_json::from_value(fixture()["umt5"]["plain"].clone()).unwrap();

    let gguf = write_renamed("umt5", dir.path(), "umt5.gguf", llama_cpp_name);
    let src = t5::hf_layout(sdflow_core::io::open(&gguf).unwrap()).unwrap();
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::none()).unwrap();
    let prefix = t5::find_prefix(w.names()).unwrap();
    assert_eq!(prefix, "");
    assert!(max_abs_err(&run(&w, &prefix, None), &want) <= 1e-3);

    // An all-in-one checkpoint keeps the encoder under a prefix, and some files hold only
    // the encoder's tied copy of the embedding.
    let p = "text_encoders.t5xxl.transformer.";
    let prefixed = write_renamed("umt5", dir.path(), "aio.safetensors", |n| {
        if n == "shared.weight" {
            format!("{p}encoder.embed_tokens.weight")
        } else {
            format!("{p}{n}")
        }
    });
    let src = t5::hf_layout(sdflow_core::io::open(&prefixed).unwrap()).unwrap();
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::none()).unwrap();
    let prefix = t5::find_prefix(w.names()).unwrap();
    assert_eq!(prefix, p);
    assert!(max_abs_err(&run(&w, &prefix, None), &want) <= 1e-3);
}

#[test]
fn bad_inputs_and_weights_are_errors() {
    let r = fixture();
    let backend = common::backend(1);
    let w = det_weights(&r["t5"]["keys"], SCALE, &backend);
    let cfg = T5Config::infer(&w, "").unwrap();
    let mut wrong = cfg.clone();
    wrong.d_ff = 96;
    let e = T5Encoder::new(&w, "", wrong).err().expect("shape mismatch");
    assert!(e.to_string().contains("DenseReluDense.wi_0.weight"), "{e}");
    let e = T5Config::infer(&w, "nope.").err().expect("no encoder");
    assert!(e.to_string().contains("no T5 encoder layers under `nope.`"), "{e}");
    let model = T5Encoder::new(&w, "", cfg).unwrap();
    let ctx = Context::new(4096, 4096).unwrap();
    let mut g = GraphRun::new(&ctx);
    assert!(model.forward(&ctx, &mut g, &[vec![1000]], None).is_err(), "id outside vocab");
    assert!(model.forward(&ctx, &mut g, &[vec![1, 2], vec![1]], None).is_err(), "ragged");
    assert!(model.forward(&ctx, &mut g, &[], None).is_err(), "empty");
    assert!(model.forward(&ctx, &mut g, &[vec![1, 2]], Some(&[vec![true]])).is_err(), "mask of another length");
}

#[test]
fn weighted_prompts_interpolate_from_the_empty_prompt() {
    use sdflow_core::text::t5::{apply_weights, T5Tokenizer, WeightedTokens};
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["t5"]["keys"], SCALE, &backend);
    let model = T5Encoder::new(&w, "", T5Config::infer(&w, "").unwrap()).unwrap();
    let encode = |ids: Vec<u32>| {
        let weights = vec![1.0; ids.len()];
        model.encode_weighted(&backend, &WeightedTokens { ids, weights }).unwrap()
    };
    let ids = vec![37, 5, 17, 1, 0, 0];
    let plain = encode(ids.clone());
    let empty = encode(T5Tokenizer::empty(6));
    let weights = vec![1.0, 1.5, 0.5, 1.0, 1.0, 1.0];
    let got = model.encode_weighted(&backend, &WeightedTokens { ids, weights: weights.clone() }).unwrap();
    let mut want = plain.clone();
    apply_weights(&mut want, &empty, &weights, 48);
    assert!(max_abs_err(&got, &want) < 1e-5);
    assert!(max_abs_err(&got, &plain) > 1e-3, "the weights change the result");
    if backend.kind() == sdflow_core::ggml::BackendKind::Cpu {
        assert_eq!(got[..48], plain[..48], "weight 1 leaves a token alone");
    } else {
        // A GPU's kernels are not batch-invariant: the weighted prompt is encoded beside
        // the empty one, so its unweighted token is equal only to rounding.
        assert!(max_abs_err(&got[..48], &plain[..48]) < 1e-5, "weight 1 leaves a token alone");
    }
}

#[test]
fn scaled_fp8_files_are_dequantized_by_their_scales() {
    // ComfyUI's `t5xxl_fp8_e4m3fn_scaled` layout: each matrix as fp8 of `w / s` beside
    // `{layer}.scale_weight` = s, and an empty `scaled_fp8` marker.
    let r = fixture();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["t5"]["keys"].clone()).unwrap();
    let mut data: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut unscaled: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut deq: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    for (n, shape) in &keys {
        let v = det_values(n, shape.iter().product(), SCALE);
        if shape.len() == 2 && !n.contains("relative_attention_bias") {
            let s = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 448.0 * 4.0;
            let q: Vec<f32> = v.iter().map(|x| x / s).collect();
            let fp8 = sdflow_core::dtype::from_f32(&q, shape[1], DType::F8E4M3).unwrap();
            data.push((n.clone(), DType::F8E4M3, shape.clone(), fp8.clone()));
            let back = sdflow_core::dtype::to_f32(DType::F8E4M3, &fp8, q.len()).unwrap();
            deq.push((n.clone(), DType::F32, shape.clone(), back.iter().flat_map(|x| (x * s).to_le_bytes()).collect()));
            unscaled.push((n.clone(), DType::F8E4M3, shape.clone(), fp8));
            data.push((format!("{}.scale_weight", n.strip_suffix(".weight").unwrap()), DType::F32, vec![], s.to_le_bytes().to_vec()));
        } else {
            let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            data.push((n.clone(), DType::F32, shape.clone(), b.clone()));
            unscaled.push((n.clone(), DType::F32, shape.clone(), b.clone()));
            deq.push((n.clone(), DType::F32, shape.clone(), b));
        }
    }
    data.push(("scaled_fp8".into(), DType::F8E4M3, vec![0], vec![]));
    let dir = tempfile::tempdir().unwrap();
    let backend = common::backend(2);
    // fp8's three mantissa bits move a tiny random model far from its f32 output, so the
    // reference is the same fp8 values dequantized by hand and stored as f32.
    let mut outs = Vec::new();
    for (file, tensors) in [("scaled.safetensors", &data), ("unscaled.safetensors", &unscaled), ("dequantized.safetensors", &deq)] {
        let path = dir.path().join(file);
        sdflow_core::io::safetensors::write(&path, tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
        let src = sdflow_core::io::open(&path).unwrap();
        let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::none()).unwrap();
        outs.push(run(&w, "", None));
    }
    let (scaled, unscaled) = (max_abs_err(&outs[0], &outs[2]), max_abs_err(&outs[1], &outs[2]));
    assert!(scaled <= 1e-5 && unscaled > 1.0, "scaled fp8 off by {scaled}, without the scales by {unscaled}");
}

/// sd.cpp's T5 conditioning: chunks of `chunk − 1` tokens closed by `</s>` and padded,
/// each encoded alone (the same rows as that sequence encoded by itself), weights scaling
/// tokens and restoring each chunk's mean; the T5 mask hides the padding.
#[test]
fn sd_cpp_chunks_are_encoded_alone_with_mean_restoring_weights() {
    use sdflow_core::text::t5::WeightedTokens;
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["t5"]["keys"], SCALE, &backend);
    let model = T5Encoder::new(&w, "", T5Config::infer(&w, "").unwrap()).unwrap();
    let alone = |ids: Vec<i32>, keep: Option<Vec<bool>>| {
        let ctx = Context::new(4096, 4096).unwrap();
        let mut g = GraphRun::new(&ctx);
        let keep = keep.map(|k| vec![k]);
        let out = model.forward(&ctx, &mut g, &[ids], keep.as_deref()).unwrap();
        g.compute(&backend, &[out], 4096).unwrap().remove(0)
    };
    // 7 tokens in chunks of 4: [a b c </s>] [d e f </s>] [g </s> pad pad].
    let ids: Vec<u32> = vec![37, 5, 17, 9, 88, 120, 64];
    let plain = WeightedTokens { ids: ids.clone(), weights: vec![1.0; 7] };
    let (got, content) = model.encode_chunked(&backend, &plain, 4, false).unwrap();
    assert_eq!((got.len(), content), (12 * 48, 10));
    let want: Vec<f32> = [alone(vec![37, 5, 17, 1], None), alone(vec![9, 88, 120, 1], None), alone(vec![64, 1, 0, 0], None)].concat();
    assert!(max_abs_err(&got, &want) < 1e-5);
    let (masked, _) = model.encode_chunked(&backend, &plain, 4, true).unwrap();
    let last = alone(vec![64, 1, 0, 0], Some(vec![true, true, false, false]));
    assert!(max_abs_err(&masked[8 * 48..], &last) < 1e-5);
    assert!(max_abs_err(&masked[8 * 48..], &want[8 * 48..]) > 1e-4, "the mask changes the last chunk");
    // Weights: each token scaled, then the chunk rescaled to its old mean.
    let weighted = WeightedTokens { ids, weights: vec![1.0, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0] };
    let (got, _) = model.encode_chunked(&backend, &weighted, 4, false).unwrap();
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let chunk0 = &want[..4 * 48];
    let mut scaled = chunk0.to_vec();
    scaled[48..96].iter_mut().for_each(|x| *x *= 1.5);
    let k = (mean(chunk0) / mean(&scaled)) as f32;
    scaled.iter_mut().for_each(|x| *x *= k);
    assert!(max_abs_err(&got[..4 * 48], &scaled) < 1e-5);
    assert!((mean(&got[..4 * 48]) - mean(chunk0)).abs() < 1e-5, "the chunk keeps its mean");
    assert_eq!(got[4 * 48..], want[4 * 48..], "an unweighted chunk is untouched");
    assert!(model.encode_chunked(&backend, &weighted, 1, false).is_err());
}
