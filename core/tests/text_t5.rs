//! The T5 tokenizer against transformers' `T5TokenizerFast` on the shipped vocabulary
//! (fixture from tests/fixtures/text/gen_t5_fixtures.py), and ComfyUI's weighted layout.

use sdflow_core::text::t5::{apply_weights, T5Tokenizer, T5_EOS, T5_PAD};

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/text/t5_tokens.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn tokenizes_as_transformers_does() {
    let tok = T5Tokenizer::shared().unwrap();
    let f = fixture();
    for case in f["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(tok.tokenize(text).unwrap(), want, "{text:?}");
    }
    for (word, ids) in f["with_eos"].as_object().unwrap() {
        let want: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
        let mut got = tok.tokenize(word).unwrap();
        got.push(T5_EOS);
        assert_eq!(got, want, "{word:?}");
    }
    assert_eq!(tok.piece(T5_EOS).as_deref(), Some("</s>"));
    assert_eq!(tok.piece(T5_PAD).as_deref(), Some("<pad>"));
}

#[test]
fn weighted_prompts_are_laid_out_as_comfyui_does() {
    let tok = T5Tokenizer::shared().unwrap();
    let t = |s: &str| tok.tokenize(s).unwrap();
    let w = tok.tokenize_weighted("a (red cat:1.5) on\na [mat]", 16).unwrap();
    let mut ids = t("a");
    let mut weights = vec![1.0; ids.len()];
    for word in ["red", "cat"] {
        let x = t(word);
        weights.extend(vec![1.5f32; x.len()]);
        ids.extend(x);
    }
    for (word, weight) in [("on", 1.0), ("a", 1.0), ("mat", (1.0 / 1.1) as f32)] {
        let x = t(word);
        weights.extend(vec![weight; x.len()]);
        ids.extend(x);
    }
    ids.push(T5_EOS);
    weights.push(1.0);
    let n = ids.len();
    assert!(n < 16);
    ids.resize(16, T5_PAD);
    weights.resize(16, 1.0);
    assert_eq!(w.ids, ids);
    assert_eq!(w.weights.len(), 16);
    for (a, b) in w.weights.iter().zip(&weights) {
        assert!((a - b).abs() < 1e-6, "{:?} vs {weights:?}", w.weights);
    }
    assert!(w.has_weights());

    // Nothing is cut: a long prompt is longer than the minimum.
    let long = tok.tokenize_weighted(&"cat ".repeat(300), 256).unwrap();
    assert_eq!(long.ids.len(), 301);
    assert_eq!(*long.ids.last().unwrap(), T5_EOS);
    assert!(!long.has_weights());
    // The empty prompt is `</s>` and padding.
    assert_eq!(tok.tokenize_weighted("", 4).unwrap().ids, vec![T5_EOS, T5_PAD, T5_PAD, T5_PAD]);
    assert_eq!(T5Tokenizer::empty(3), vec![T5_EOS, T5_PAD, T5_PAD]);
}

#[test]
fn weights_interpolate_from_the_empty_prompt() {
    let mut z = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let empty = vec![0.5, 0.5, 1.0, 1.0, 2.0, 2.0];
    apply_weights(&mut z, &empty, &[1.0, 2.0, 0.5], 2);
    assert_eq!(z, vec![1.0, 2.0, 5.0, 7.0, 3.5, 4.0]);
}
