//! The byte-level BPE tokenizers of the language-model text encoders — Qwen2/Qwen3's
//! (Z-Image, FLUX.2 klein, Qwen-Image) and Mistral's tekken (FLUX.2 dev, [`super::tekken`]) —
//! and the weighted, padded token sequences sd.cpp's LLM embedder builds from a templated
//! prompt.
//!
//! Qwen's vocabulary is Qwen's 151,643 byte-level BPE tokens plus its 26 added tokens
//! (`<|endoftext|>` = 151643, `<|im_start|>`, `<|im_end|>`, the vision tokens, `<think>`, …)
//! as a Hugging Face `tokenizer.json` (NFC normaliser, Qwen's split regex), shipped gzip'd
//! inside the binary (provenance in `vocab/SOURCES.md`) and run by the `tokenizers` crate,
//! the implementation behind transformers' `Qwen2TokenizerFast`. Added tokens written in
//! the text (the chat template's `<|im_start|>`) become their ids, as in the reference.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use super::prompt::parse_prompt_attention;
use super::TextError;

/// `<|endoftext|>`: what sd.cpp pads Qwen sequences with (on the right).
pub const QWEN_PAD: u32 = 151643;

static VOCAB_GZ: &[u8] = include_bytes!("vocab/qwen3_tokenizer.json.gz");

/// Mistral's `<s>` (prepended to every sequence) and `<pad>`.
pub const MISTRAL_BOS: u32 = 1;
pub const MISTRAL_PAD: u32 = 11;

static TEKKEN_GZ: &[u8] = include_bytes!("vocab/tekken_240911.json.gz");

/// An LLM's tokenizer with the ids sd.cpp adds around a sequence; each vocabulary is built
/// once per process and shared.
#[derive(Clone)]
pub struct LlmTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// What padding appends.
    pad: u32,
    /// Prepended to every sequence (Mistral's `<s>`; Qwen adds none).
    bos: Option<u32>,
}

impl std::fmt::Debug for LlmTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmTokenizer").field("pad", &self.pad).field("bos", &self.bos).finish_non_exhaustive()
    }
}

/// A language model's input: ids, one weight per id (A1111's `(word:1.2)` inside the
/// user's text, 1 elsewhere) and the attention mask (0 on padding).
#[derive(Clone, Debug, PartialEq)]
pub struct LlmTokens {
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
    pub mask: Vec<f32>,
}

impl LlmTokenizer {
    /// Qwen2/Qwen3 (and Qwen2.5-VL): no BOS, padding with `<|endoftext|>`.
    pub fn qwen() -> Result<Self, TextError> {
        static CELL: OnceLock<Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();
        Ok(LlmTokenizer { inner: super::bundled_tokenizer(&CELL, VOCAB_GZ, "Qwen")?, pad: QWEN_PAD, bos: None })
    }

    /// Mistral-Small-3.2's tekken vocabulary: `<s>` first, padding with `<pad>`.
    pub fn mistral() -> Result<Self, TextError> {
        static CELL: OnceLock<Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();
        let inner = CELL.get_or_init(|| super::tekken::from_gz(TEKKEN_GZ).map(Arc::new)).clone().map_err(TextError::Tokenizer)?;
        Ok(LlmTokenizer { inner, pad: MISTRAL_PAD, bos: Some(MISTRAL_BOS) })
    }

    /// The ids of `text`, special tokens written in it included, without the BOS.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let enc = self.inner.encode(text, false).map_err(|e| TextError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The token of `id`, for messages and tests.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// sd.cpp's LLM tokenization of a templated prompt: the BOS if the vocabulary has one,
    /// then the bytes of `prompt` before
    /// `attn` and after it are tokenized as they are (weight 1); the user's text inside
    /// `attn` goes through A1111's attention parser and each piece is tokenized on its own
    /// with its weight (`BREAK` separates nothing here and is dropped, as ComfyUI's parser
    /// does). Then padding (Qwen's `<|endoftext|>`, Mistral's `<pad>`) on the right up to `min_length` (weight 1,
    /// mask 0), and a sequence longer than `max_length` is cut there.
    pub fn tokenize_weighted(&self, prompt: &str, attn: Range<usize>, min_length: usize, max_length: Option<usize>) -> Result<LlmTokens, TextError> {
        if attn.start > attn.end || attn.end > prompt.len() || !prompt.is_char_boundary(attn.start) || !prompt.is_char_boundary(attn.end) {
            return Err(TextError::Tokenizer(format!("the weighted range {attn:?} is not inside the {}-byte prompt", prompt.len())));
        }
        let mut parts: Vec<(String, f32)> = Vec::new();
        if attn.start > 0 {
            parts.push((prompt[..attn.start].to_string(), 1.0));
        }
        for piece in parse_prompt_attention(&prompt[attn.clone()]) {
            if !piece.is_break() {
                parts.push((piece.text, piece.weight as f32));
            }
        }
        if attn.end < prompt.len() {
            parts.push((prompt[attn.end..].to_string(), 1.0));
        }
        let (mut ids, mut weights): (Vec<u32>, Vec<f32>) = (self.bos.into_iter().collect(), self.bos.map(|_| 1.0).into_iter().collect());
        for (text, weight) in parts {
            let t = self.encode(&text)?;
            weights.extend(std::iter::repeat_n(weight, t.len()));
            ids.extend(t);
        }
        let mut mask = vec![1.0; ids.len()];
        if let Some(max) = max_length.filter(|&m| ids.len() > m) {
            ids.truncate(max);
            weights.truncate(max);
            mask.truncate(max);
        }
        while ids.len() < min_length {
            ids.push(self.pad);
            weights.push(1.0);
            mask.push(0.0);
        }
        Ok(LlmTokens { ids, weights, mask })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids from Hugging Face `tokenizers` (the implementation behind transformers'
    /// `Qwen2TokenizerFast`) on the same `tokenizer.json`.
    const REFERENCE: &[(&str, &[u32])] = &[
        ("a lovely cat", &[64, 16690, 8251]),
        (
            "<|im_start|>user\nA red fox, (masterpiece:1.2)  at dawn!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            &[151644, 872, 198, 32, 2518, 38835, 11, 320, 13629, 22362, 25, 16, 13, 17, 8, 220, 518, 38393, 0, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271],
        ),
        ("一只可爱的猫在屋顶上 🐱 — café naïve", &[102292, 108541, 100472, 18493, 110615, 17447, 11162, 238, 109, 1959, 51950, 94880, 586]),
        ("  leading spaces and\ttabs\n\nnew lines   ", &[220, 6388, 12621, 323, 3244, 3435, 271, 931, 5128, 262]),
        ("1234567 numbers 3.14159 and CamelCaseWords'll don't", &[16, 17, 18, 19, 20, 21, 22, 5109, 220, 18, 13, 16, 19, 16, 20, 24, 323, 68154, 4207, 23489, 3278, 1513, 944]),
        ("<|vision_start|><|image_pad|><|vision_end|>Picture 1", &[151652, 151655, 151653, 24669, 220, 16]),
    ];

    #[test]
    fn ids_match_the_reference_tokenizer() {
        let t = LlmTokenizer::qwen().unwrap();
        for (text, ids) in REFERENCE {
            assert_eq!(t.encode(text).unwrap(), *ids, "{text:?}");
        }
        assert_eq!(t.piece(QWEN_PAD).as_deref(), Some("<|endoftext|>"));
    }

    /// Ids from mistral_common 1.13.1's `Tekkenizer` (tiktoken over the same file),
    /// `encode(text, bos=False, eos=False)`.
    const MISTRAL_REFERENCE: &[(&str, &[u32])] = &[
        ("a lovely cat", &[1097, 45988, 7990]),
        ("一只可爱的猫在屋顶上 🐱 — café naïve", &[3087, 16981, 6283, 36292, 49200, 1171, 2998, 42190, 5277, 1182, 4445, 119685, 1144, 1177, 2251, 35858, 98355]),
        ("  leading spaces and\ttabs\n\nnew lines   ", &[1032, 8924, 18971, 1321, 14133, 8217, 1267, 3080, 6896, 1293]),
        ("1234567 numbers 3.14159 and CamelCaseWords'll don't", &[1049, 1050, 1051, 1052, 1053, 1054, 1055, 8091, 1032, 1051, 1046, 1049, 1052, 1049, 1053, 1057, 1321, 108915, 11139, 47832, 7534, 2607, 2405]),
        ("He said \"change 'flux.cpp' to 'flux2-dev.cpp'\" — 「引用」", &[3452, 2639, 1429, 6484, 1576, 2444, 2428, 16473, 1039, 1317, 1576, 2444, 2428, 1050, 46535, 16473, 38416, 2251, 6382, 42607, 12600, 1548]),
        (
            "You are an AI that reasons about image descriptions. You give structured responses focusing on object relationships, object\nattribution and actions without speculation.",
            &[4568, 1584, 1420, 26554, 1455, 12738, 2314, 3937, 38340, 1046, 3213, 5628, 37253, 11688, 30557, 1408, 3481, 14608, 1044, 3481, 1010, 2452, 5604, 1321, 10636, 3816, 67813, 1046],
        ),
    ];

    #[test]
    fn mistral_ids_match_tiktoken_and_special_tokens_are_read() {
        let t = LlmTokenizer::mistral().unwrap();
        for (text, ids) in MISTRAL_REFERENCE {
            assert_eq!(t.encode(text).unwrap(), *ids, "{text:?}");
        }
        assert_eq!(t.encode("[SYSTEM_PROMPT]x[/SYSTEM_PROMPT][INST]y[/INST]").unwrap(), [17, 1120, 18, 3, 1121, 4]);
        assert_eq!(t.piece(MISTRAL_PAD).as_deref(), Some("<pad>"));
        assert_eq!(t.piece(999).as_deref(), Some("<SPECIAL_999>"));
        // The BOS leads; weights and padding as for Qwen.
        let got = t.tokenize_weighted("[INST](cat:1.5)[/INST]", 6..15, 6, None).unwrap();
        assert_eq!(got.ids, [MISTRAL_BOS, 3, 12338, 4, MISTRAL_PAD, MISTRAL_PAD]);
        assert_eq!(got.weights, [1.0, 1.0, 1.5, 1.0, 1.0, 1.0]);
        assert_eq!(got.mask, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn a_bad_tekken_file_is_an_error() {
        assert!(crate::text::tekken::from_json(b"{}").is_err());
        let short = br#"{"config": {"pattern": ".", "default_vocab_size": 1003, "default_num_special_tokens": 1000}, "vocab": [{"rank": 0, "token_bytes": "YQ=="}]}"#;
        let e = crate::text::tekken::from_json(short).unwrap_err();
        assert!(e.contains("rank 1"), "{e}");
        let bad = br#"{"config": {"pattern": ".", "default_vocab_size": 1001, "default_num_special_tokens": 1000}, "vocab": [{"rank": 0, "token_bytes": "!!"}]}"#;
        assert!(crate::text::tekken::from_json(bad).unwrap_err().contains("rank 0"));
    }

    #[test]
    fn templated_prompts_weight_only_the_users_text_and_pad_on_the_right() {
        let t = LlmTokenizer::qwen().unwrap();
        let (head, user, tail) = ("<|im_start|>user\n", "a (red:1.5) fox", "<|im_end|>\n<|im_start|>assistant\n");
        let prompt = format!("{head}{user}{tail}");
        let attn = head.len()..head.len() + user.len();
        let got = t.tokenize_weighted(&prompt, attn.clone(), 20, None).unwrap();
        let head_ids = t.encode(head).unwrap();
        let tail_ids = t.encode(tail).unwrap();
        let (a, red, fox) = (t.encode("a ").unwrap(), t.encode("red").unwrap(), t.encode(" fox").unwrap());
        let want: Vec<u32> = [&head_ids[..], &a, &red, &fox, &tail_ids].concat();
        assert_eq!(&got.ids[..want.len()], &want[..]);
        assert!(got.ids[want.len()..].iter().all(|&i| i == QWEN_PAD) && got.ids.len() == 20);
        let red_at = head_ids.len() + a.len();
        for (i, w) in got.weights.iter().enumerate() {
            let expect = if (red_at..red_at + red.len()).contains(&i) { 1.5 } else { 1.0 };
            assert_eq!(*w, expect, "token {i}");
        }
        assert_eq!(got.mask.iter().filter(|&&m| m == 1.0).count(), want.len());
        // Weights written outside the user's text are text, not weights.
        let outside = t.tokenize_weighted("(x:2) y", 5..7, 0, None).unwrap();
        assert!(outside.weights.iter().all(|&w| w == 1.0));
        assert_eq!(outside.ids, t.encode("(x:2) y").unwrap());
        // Cut at max_length; a range outside the prompt is an error, not a panic.
        assert_eq!(t.tokenize_weighted(&prompt, attn, 0, Some(4)).unwrap().ids.len(), 4);
        assert!(t.tokenize_weighted("abc", 2..9, 0, None).is_err());
        assert!(t.tokenize_weighted("猫", 1..3, 0, None).is_err());
    }
}
