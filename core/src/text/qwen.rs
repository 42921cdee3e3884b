//! Qwen2/Qwen3's byte-level BPE tokenizer — the language-model text encoders of Z-Image,
//! FLUX.2 klein (Qwen3) and Qwen-Image (Qwen2.5-VL, the same vocabulary) — and the weighted,
//! padded token sequences sd.cpp's LLM embedder builds from a templated prompt.
//!
//! The vocabulary is Qwen's 151,643 byte-level BPE tokens plus its 26 added tokens
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

/// The Qwen2/Qwen3 tokenizer; built once per process and shared.
#[derive(Clone)]
pub struct QwenTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for QwenTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QwenTokenizer").finish_non_exhaustive()
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

impl QwenTokenizer {
    pub fn shared() -> Result<Self, TextError> {
        static CELL: OnceLock<Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();
        Ok(QwenTokenizer { inner: super::bundled_tokenizer(&CELL, VOCAB_GZ, "Qwen")? })
    }

    /// The ids of `text` (no BOS or EOS: Qwen's tokenizer adds none).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let enc = self.inner.encode(text, false).map_err(|e| TextError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The token of `id`, for messages and tests.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// sd.cpp's LLM tokenization of a templated prompt: the bytes of `prompt` before
    /// `attn` and after it are tokenized as they are (weight 1); the user's text inside
    /// `attn` goes through A1111's attention parser and each piece is tokenized on its own
    /// with its weight (`BREAK` separates nothing here and is dropped, as ComfyUI's parser
    /// does). Then padding with `<|endoftext|>` on the right up to `min_length` (weight 1,
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
        let (mut ids, mut weights) = (Vec::new(), Vec::new());
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
            ids.push(QWEN_PAD);
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
        let t = QwenTokenizer::shared().unwrap();
        for (text, ids) in REFERENCE {
            assert_eq!(t.encode(text).unwrap(), *ids, "{text:?}");
        }
        assert_eq!(t.piece(QWEN_PAD).as_deref(), Some("<|endoftext|>"));
    }

    #[test]
    fn templated_prompts_weight_only_the_users_text_and_pad_on_the_right() {
        let t = QwenTokenizer::shared().unwrap();
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
