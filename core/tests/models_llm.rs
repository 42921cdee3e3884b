//! The LLM text encoders (Qwen3: Z-Image, FLUX.2 klein; Qwen2: Qwen-Image's language model
//! on text; Mistral: FLUX.2 dev) against transformers' `Qwen3Model` / `Qwen2Model` /
//! `MistralModel` on tiny random weights
//! (fixtures from tests/fixtures/models/make_llm.py; the weights are regenerated here):
//! hidden states after 1 and 2 layers and the final normed state, with and without
//! padding, in Hugging Face names under `model.` and in llama.cpp's GGUF names.

mod common;

use std::collections::BTreeMap;

use common::{det_values, det_weights, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::io::TypeRules;
use sdflow_core::models::llm::{self, LlmArch, LlmConfig, LlmEncoder};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::Weights;

const SCALE: f64 = 0.3;

fn fixture() -> serde_json::Value {
    reference("llm_tiny_ref.json")
}

fn config(w: &Weights, prefix: &str, key: &str) -> LlmConfig {
    LlmConfig::infer(w, prefix, (key != "qwen3").then_some(16)).unwrap()
}

fn run(w: &Weights, prefix: &str, key: &str, masked: bool, layers: &[usize]) -> Vec<f32> {
    let r = fixture();
    let tokens: Vec<Vec<i32>> = serde_json::from_value(r["tokens"].clone()).unwrap();
    let keep: Vec<Vec<bool>> = serde_json::from_value::<Vec<Vec<u8>>>(r["keep"].clone()).unwrap().into_iter().map(|s| s.into_iter().map(|b| b == 1).collect()).collect();
    let model = LlmEncoder::new(w, prefix, config(w, prefix, key)).unwrap();
    let backend = common::backend(2);
    let ctx = Context::new(4096, 4096).unwrap();
    let mut graph = GraphRun::new(&ctx);
    let out = model.forward(&ctx, &mut graph, &tokens, masked.then_some(&keep[..]), layers).unwrap();
    assert_eq!(out.ne(), [64 * layers.len() as i64, 9, 2, 1]);
    graph.compute(&backend, &[out], 4096).unwrap().remove(0)
}

fn check(key: &str) {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r[key]["keys"], SCALE, &backend);
    let prefix = llm::find_prefix(w.names()).unwrap();
    assert_eq!(prefix, "model.");
    let cfg = config(&w, &prefix, key);
    let want_cfg = if key == "qwen3" { (64, 3, 4, 2, 24, 96, 1000, true) } else { (64, 3, 4, 2, 16, 96, 1000, false) };
    assert_eq!((cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab, cfg.qk_norm), want_cfg);
    let arch = match key {
        "qwen3" => LlmArch::Qwen3,
        "qwen2" => LlmArch::Qwen2,
        _ => LlmArch::Mistral,
    };
    assert_eq!(cfg.arch, arch);
    for (masked, label) in [(false, "plain"), (true, "masked")] {
        for (layer, name) in [(1, "1"), (2, "2"), (4, "final")] {
            let got = run(&w, &prefix, key, masked, &[layer]);
            let want: Vec<f32> = serde_json::from_value(r[key][label][name].clone()).unwrap();
            let err = max_abs_err(&got, &want);
            assert!(err <= 1e-3, "{key} {label} hidden state {name}: max abs error {err}");
        }
    }
    // Several hidden states side by side along the features (FLUX.2's {9, 18, 27}).
    let both = run(&w, &prefix, key, false, &[2, 1]);
    let (two, one): (Vec<f32>, Vec<f32>) = (serde_json::from_value(r[key]["plain"]["2"].clone()).unwrap(), serde_json::from_value(r[key]["plain"]["1"].clone()).unwrap());
    let interleaved: Vec<f32> = two.chunks(64).zip(one.chunks(64)).flat_map(|(a, b)| a.iter().chain(b).copied()).collect();
    assert!(max_abs_err(&both, &interleaved) <= 1e-3);
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2");
}

#[test]
fn mistral_matches_transformers() {
    check("mistral");
}

#[test]
fn bad_requests_are_errors() {
    let r = fixture();
    let backend = common::backend(2);
    let w = det_weights(&r["qwen3"]["keys"], SCALE, &backend);
    let model = LlmEncoder::new(&w, "model.", LlmConfig::infer(&w, "model.", None).unwrap()).unwrap();
    let ctx = Context::new(4096, 4096).unwrap();
    let mut graph = GraphRun::new(&ctx);
    for (tokens, layers) in [(vec![vec![1, 2]], vec![0]), (vec![vec![1, 2]], vec![5]), (vec![vec![1000]], vec![1]), (vec![vec![1], vec![1, 2]], vec![1]), (vec![], vec![1])] {
        assert!(model.forward(&ctx, &mut graph, &tokens, None, &layers).is_err(), "{tokens:?} {layers:?}");
    }
    assert!(LlmConfig::infer(&w, "nothing.", None).is_err());
    let qwen2 = det_weights(&r["qwen2"]["keys"], SCALE, &backend);
    assert!(LlmConfig::infer(&qwen2, "model.", Some(7)).is_err());
    assert!(LlmConfig::infer(&qwen2, "model.", None).is_err(), "128-wide heads do not fit a 64-wide model");
}

#[test]
fn a_gguf_in_llama_cpp_names_loads_the_same_encoder() {
    for key in ["qwen3", "qwen2"] {
        let backend = common::backend(2);
        let dir = tempfile::tempdir().unwrap();
        let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(fixture()[key]["keys"].clone()).unwrap();
        let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
            .iter()
            .map(|(n, s)| (llm::llama_cpp_name(n).unwrap(), s.clone(), det_values(n, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect()))
            .collect();
        // The language-model head, which an encoder never reads.
        data.push(("output.weight".into(), vec![1000, 64], vec![0; 1000 * 64 * 4]));
        let path = dir.path().join("llm.gguf");
        sdflow_core::io::gguf::write(&path, &[], data.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice()))).unwrap();
        let src = llm::hf_layout(sdflow_core::io::open(&path).unwrap()).unwrap();
        let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::none()).unwrap();
        let prefix = llm::find_prefix(w.names()).unwrap();
        assert_eq!(prefix, "");
        let want: Vec<f32> = serde_json::from_value(fixture()[key]["masked"]["final"].clone()).unwrap();
        assert!(max_abs_err(&run(&w, &prefix, key, true, &[4]), &want) <= 1e-3, "{key}");
    }
    assert_eq!(llm::hf_name("blk.12.attn_q.bias").as_deref(), Some("layers.12.self_attn.q_proj.bias"));
    assert_eq!(llm::hf_name("output.weight"), None);
    assert_eq!(llm::llama_cpp_name("model.layers.12.self_attn.q_proj.bias").as_deref(), Some("blk.12.attn_q.bias"));
    assert_eq!(llm::llama_cpp_name("lm_head.weight"), None);
    assert_eq!(llm::hf_name("blk.x.attn_q.weight"), None);
}

/// llama.cpp's converter interleaves a llama-architecture model's q and k rows per head
/// (`permute`); row i of the result, for heads of `d` rows.
fn llama_cpp_permuted(rows: &[f32], d: usize, width: usize) -> Vec<f32> {
    let n = rows.len() / width;
    let mut out = vec![0.0; rows.len()];
    for r in 0..n {
        let (h, rem) = (r / d, r % d);
        let dst = h * d + 2 * (rem % (d / 2)) + rem / (d / 2);
        out[dst * width..(dst + 1) * width].copy_from_slice(&rows[r * width..(r + 1) * width]);
    }
    out
}

/// Mistral-Small-3.2 as llama.cpp converts it (architecture `llama`: q and k rows
/// interleaved for ggml's plain RoPE), f32 and Q8_0: read back in Hugging Face's order, the
/// encoder gives transformers' states — and the Q8_0 file the same states as a Q8_0 file of
/// the rows in Hugging Face's order, so the reordering moves whole quantized rows intact.
#[test]
fn a_llama_architecture_gguf_has_its_q_and_k_rows_put_back() {
    use sdflow_core::dtype;
    use sdflow_core::io::gguf::Value;
    let r = fixture();
    let backend = common::backend(2);
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(r["mistral"]["keys"].clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, arch: &str, permute: bool, quant: bool| {
        let data: Vec<(String, DType, Vec<usize>, Vec<u8>)> = keys
            .iter()
            .map(|(n, s)| {
                let mut v = det_values(n, s.iter().product(), SCALE);
                let heads = if n.contains("q_proj") { 4 } else if n.contains("k_proj") { 2 } else { 0 };
                if permute && heads > 0 {
                    v = llama_cpp_permuted(&v, s[0] / heads, s[1]);
                }
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                if quant && s.len() == 2 && !n.contains("embed") {
                    (llm::llama_cpp_name(n).unwrap(), DType::Q8_0, s.clone(), dtype::convert(DType::F32, &bytes, s, DType::Q8_0).unwrap())
                } else {
                    (llm::llama_cpp_name(n).unwrap(), DType::F32, s.clone(), bytes)
                }
            })
            .collect();
        let kv = [
            ("general.architecture".to_string(), Value::String(arch.into())),
            (format!("{arch}.attention.head_count"), Value::U32(4)),
            (format!("{arch}.attention.head_count_kv"), Value::U32(2)),
        ];
        let path = dir.path().join(file);
        sdflow_core::io::gguf::write(&path, &kv, data.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))).unwrap();
        let src = llm::hf_layout(sdflow_core::io::open(&path).unwrap()).unwrap();
        let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::none()).unwrap();
        run(&w, "", "mistral", true, &[4])
    };
    let want: Vec<f32> = serde_json::from_value(r["mistral"]["masked"]["final"].clone()).unwrap();
    let f32_states = write("f32.gguf", "llama", true, false);
    assert!(max_abs_err(&f32_states, &want) <= 1e-3, "f32: {}", max_abs_err(&f32_states, &want));
    let q8 = write("q8.gguf", "llama", true, true);
    let q8_hf_order = write("q8-hf.gguf", "qwen3", false, true);
    assert!(max_abs_err(&q8, &q8_hf_order) <= 1e-5, "{}", max_abs_err(&q8, &q8_hf_order));
    // Q8_0 keeps 8 bits a weight: within a few percent of the states' range.
    let range = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = max_abs_err(&q8, &want);
    assert!(err <= 0.1 * range && err > 0.0, "Q8_0 against f32: {err} of {range}");
    // The rows left in llama.cpp's order (a file that does not say it is llama) differ.
    let unpermuted = write("wrong.gguf", "qwen3", true, false);
    assert!(max_abs_err(&unpermuted, &want) > 1e-2);
    // A llama file without its head counts cannot be reordered: an error naming the key.
    let path = dir.path().join("bare.gguf");
    sdflow_core::io::gguf::write(&path, &[("general.architecture".to_string(), Value::String("llama".into()))], [("blk.0.attn_q.weight", DType::F32, vec![4, 2], &[0u8; 32][..])]).unwrap();
    let e = llm::hf_layout(sdflow_core::io::open(&path).unwrap()).err().unwrap().to_string();
    assert!(e.contains("llama.attention.head_count"), "{e}");
}

/// Whole prompts as sd.cpp conditions Z-Image (Qwen3, `hidden_states[-2]`) and Qwen-Image
/// (Qwen2, the final state, 34 template tokens dropped) on them: the template, the real
/// Qwen vocabulary, A1111 weights inside the user's text only, emphasis with the mean
/// kept — against transformers on the same tokens (fixture from make_llm.py).
#[test]
fn prompts_encode_as_sd_cpp_does() {
    use sdflow_core::models::llm::Family;
    use sdflow_core::text::llm::LlmTokenizer;
    let r = reference("llm_prompt_ref.json");
    let user = r["user"].as_str().unwrap();
    let backend = common::backend(2);
    let tokenizer = LlmTokenizer::qwen().unwrap();
    for (key, family, head_dim) in [("z_image", Family::ZImage, None), ("qwen_image", Family::QwenImage, Some(16))] {
        let w = det_weights(&r[key]["keys"], SCALE, &backend);
        let model = LlmEncoder::new(&w, "model.", LlmConfig::infer(&w, "model.", head_dim).unwrap()).unwrap();
        let prompt = family.layout(user, model.config.layers);
        let ids: Vec<u32> = serde_json::from_value(r[key]["ids"].clone()).unwrap();
        assert_eq!(tokenizer.tokenize_weighted(&prompt.text, prompt.attn.clone(), 0, None).unwrap().ids, ids, "{key}");
        let (hidden, width) = model.encode_prompt(&backend, &tokenizer, &prompt).unwrap();
        assert_eq!(width, 64);
        let want: Vec<f32> = serde_json::from_value(r[key]["hidden"].clone()).unwrap();
        assert_eq!(hidden.len(), want.len(), "{key}: {} tokens after the drop", want.len() / 64);
        let err = max_abs_err(&hidden, &want);
        assert!(err <= 1e-3, "{key}: max abs error {err}");
    }
    // FLUX.2 dev: `<s>` and Mistral's template through the tekken vocabulary, hidden
    // states 10, 20 and 30, the states zero-padded to 512 rows.
    let tokenizer = Family::Flux2Dev.tokenizer().unwrap();
    let w = det_weights(&r["flux2_dev"]["keys"], SCALE, &backend);
    let model = LlmEncoder::new(&w, "model.", LlmConfig::infer(&w, "model.", Some(16)).unwrap()).unwrap();
    assert_eq!(model.config.arch, LlmArch::Mistral);
    let prompt = Family::Flux2Dev.layout(user, model.config.layers);
    let ids: Vec<u32> = serde_json::from_value(r["flux2_dev"]["ids"].clone()).unwrap();
    assert_eq!(tokenizer.tokenize_weighted(&prompt.text, prompt.attn.clone(), 0, None).unwrap().ids, ids);
    let (hidden, width) = model.encode_prompt(&backend, &tokenizer, &prompt).unwrap();
    assert_eq!((width, hidden.len()), (192, 512 * 192));
    let want: Vec<f32> = serde_json::from_value(r["flux2_dev"]["hidden"].clone()).unwrap();
    let err = max_abs_err(&hidden[..want.len()], &want);
    assert!(err <= 1e-3, "flux2 dev: max abs error {err}");
    assert!(hidden[want.len()..].iter().all(|&x| x == 0.0));
    // FLUX.2 klein pads to 512 tokens (masked) and reads three hidden states.
    let klein = Family::Flux2Klein.layout(user, 36);
    assert_eq!((klein.min_length, klein.out_layers.clone(), klein.drop), (512, vec![9, 18, 27], 0));
    assert!(klein.text.ends_with("<think>\n\n</think>\n\n") && &klein.text[klein.attn.clone()] == user);
}
