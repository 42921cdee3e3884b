//! The LLM text encoders (Qwen3: Z-Image, FLUX.2 klein; Qwen2: Qwen-Image's language model
//! on text) against transformers' `Qwen3Model` / `Qwen2Model` on tiny random weights
//! (fixtures from tests/fixtures/models/make_llm.py; the weights are regenerated here):
//! hidden states after 1 and 2 layers and the final normed state, with and without
//! padding, in Hugging Face names under `model.` and in llama.cpp's GGUF names.

mod common;

use std::collections::BTreeMap;

use common::{det_values, det_weights, max_abs_err, reference};
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::io::TypeRules;
use sdflow_core::models::llm::{self, LlmConfig, LlmEncoder};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::Weights;

const SCALE: f64 = 0.3;

fn fixture() -> serde_json::Value {
    reference("llm_tiny_ref.json")
}

fn config(w: &Weights, prefix: &str, key: &str) -> LlmConfig {
    LlmConfig::infer(w, prefix, (key == "qwen2").then_some(16)).unwrap()
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

/// llama.cpp's name of a Hugging Face name under `model.` (the inverse of `llm::hf_name`
/// for the names these encoders have), written out from llama.cpp's tensor map.
fn llama_cpp_name(hf: &str) -> String {
    let hf = hf.strip_prefix("model.").unwrap();
    let (stem, kind) = hf.rsplit_once('.').unwrap();
    if stem == "embed_tokens" {
        return format!("token_embd.{kind}");
    }
    if stem == "norm" {
        return format!("output_norm.{kind}");
    }
    let rest = stem.strip_prefix("layers.").unwrap();
    let (i, part) = rest.split_once('.').unwrap();
    let g = match part {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("{other}"),
    };
    format!("blk.{i}.{g}.{kind}")
}

#[test]
fn a_gguf_in_llama_cpp_names_loads_the_same_encoder() {
    for key in ["qwen3", "qwen2"] {
        let backend = common::backend(2);
        let dir = tempfile::tempdir().unwrap();
        let keys: BTreeMap<String, Vec<usize>> = serde_json::from_value(fixture()[key]["keys"].clone()).unwrap();
        let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = keys
            .iter()
            .map(|(n, s)| (llama_cpp_name(n), s.clone(), det_values(n, s.iter().product(), SCALE).iter().flat_map(|x| x.to_le_bytes()).collect()))
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
    assert_eq!(llm::hf_name("blk.x.attn_q.weight"), None);
}

/// Whole prompts as sd.cpp conditions Z-Image (Qwen3, `hidden_states[-2]`) and Qwen-Image
/// (Qwen2, the final state, 34 template tokens dropped) on them: the template, the real
/// Qwen vocabulary, A1111 weights inside the user's text only, emphasis with the mean
/// kept — against transformers on the same tokens (fixture from make_llm.py).
#[test]
fn prompts_encode_as_sd_cpp_does() {
    use sdflow_core::models::llm::Family;
    use sdflow_core::text::qwen::QwenTokenizer;
    let r = reference("llm_prompt_ref.json");
    let user = r["user"].as_str().unwrap();
    let backend = common::backend(2);
    let tokenizer = QwenTokenizer::shared().unwrap();
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
    // FLUX.2 klein pads to 512 tokens (masked) and reads three hidden states.
    let klein = Family::Flux2Klein.layout(user, 36);
    assert_eq!((klein.min_length, klein.out_layers.clone(), klein.drop), (512, vec![9, 18, 27], 0));
    assert!(klein.text.ends_with("<think>\n\n</think>\n\n") && &klein.text[klein.attn.clone()] == user);
}
