//! T5's SentencePiece unigram tokenizer (T5-XXL: SD3, FLUX.1, Chroma; UMT5-XXL: Wan) and
//! the weighted, padded token sequences ComfyUI's T5 tokenizers produce.
//!
//! The vocabulary is T5 v1.1's 32,100 pieces as a Hugging Face `tokenizer.json` (the
//! precompiled NFKC character map, `▁` word prefixes, `</s>` = 1, `<pad>` = 0), shipped
//! gzip'd inside the binary (provenance in `vocab/SOURCES.md`) and run by the `tokenizers`
//! crate, the implementation behind transformers' `T5TokenizerFast`, which ComfyUI uses.

use std::sync::{Arc, OnceLock};

use super::prompt::parse_prompt_attention;
use super::TextError;

/// `</s>`: ends every sequence.
pub const T5_EOS: u32 = 1;
/// `<pad>`: fills a sequence after its `</s>`.
pub const T5_PAD: u32 = 0;

static VOCAB_GZ: &[u8] = include_bytes!("vocab/t5_tokenizer.json.gz");
/// UMT5's 256,300 pieces (Wan's text encoder): the same special ids, no NFKC table (runs of
/// spaces collapse, as sd.cpp's copy of the vocabulary says).
static UMT5_VOCAB_GZ: &[u8] = include_bytes!("vocab/umt5_tokenizer.json.gz");

/// The T5 v1.1 tokenizer; built once per process and shared, so `shared` is cheap.
#[derive(Clone)]
pub struct T5Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for T5Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("T5Tokenizer").finish_non_exhaustive()
    }
}

/// Token ids with one weight each (A1111's `(word:1.2)`), `</s>` and padding included.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightedTokens {
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

impl WeightedTokens {
    /// Whether any token has a weight other than 1 (ComfyUI then also encodes the empty
    /// prompt to interpolate from).
    pub fn has_weights(&self) -> bool {
        self.weights.iter().any(|&w| w != 1.0)
    }
}

impl T5Tokenizer {
    pub fn shared() -> Result<Self, TextError> {
        static CELL: OnceLock<Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();
        Ok(T5Tokenizer { inner: super::bundled_tokenizer(&CELL, VOCAB_GZ, "T5")? })
    }

    /// The UMT5 tokenizer (Wan), shared as [`T5Tokenizer::shared`].
    pub fn umt5() -> Result<Self, TextError> {
        static CELL: OnceLock<Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();
        Ok(T5Tokenizer { inner: super::bundled_tokenizer(&CELL, UMT5_VOCAB_GZ, "UMT5")? })
    }

    /// The ids of `text`, without `</s>`.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let enc = self.inner.encode(text, false).map_err(|e| TextError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The id of `piece`, if the vocabulary has it.
    pub fn id(&self, piece: &str) -> Option<u32> {
        self.inner.token_to_id(piece)
    }

    /// The pieces of `id`, for messages and tests.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// `prompt` as ComfyUI's T5 tokenizers lay it out: A1111 weights parsed, each piece's
    /// words (split at spaces, newlines counting as spaces) tokenized one by one with the
    /// piece's weight, then `</s>`, then `<pad>` up to `min_length` tokens. Nothing is
    /// cut: a longer prompt gives a longer sequence, as in ComfyUI.
    pub fn tokenize_weighted(&self, prompt: &str, min_length: usize) -> Result<WeightedTokens, TextError> {
        let mut ids = Vec::new();
        let mut weights = Vec::new();
        for piece in parse_prompt_attention(prompt) {
            // T5 has no chunk windows: a BREAK separates nothing (ComfyUI's parser, which
            // has no BREAK, reads only the text around it).
            if piece.is_break() {
                continue;
            }
            for word in piece.text.replace('\n', " ").split(' ').filter(|w| !w.is_empty()) {
                let t = self.tokenize(word)?;
                weights.extend(std::iter::repeat_n(piece.weight as f32, t.len()));
                ids.extend(t);
            }
        }
        ids.push(T5_EOS);
        weights.push(1.0);
        while ids.len() < min_length {
            ids.push(T5_PAD);
            weights.push(1.0);
        }
        Ok(WeightedTokens { ids, weights })
    }

    /// The empty prompt ComfyUI encodes beside a weighted one: `</s>` and padding, `len`
    /// tokens in all.
    pub fn empty(len: usize) -> Vec<u32> {
        let mut ids = vec![T5_PAD; len.max(1)];
        ids[0] = T5_EOS;
        ids
    }
}

/// ComfyUI's token weighting (`ClipTokenWeightEncoder.encode_token_weights`): each hidden
/// vector moves away from the empty prompt's vector at its position by its weight,
/// `z = (z − z_empty)·w + z_empty`. `hidden` and `empty` are [d, T] row-major by token.
pub fn apply_weights(hidden: &mut [f32], empty: &[f32], weights: &[f32], d: usize) {
    for (j, &w) in weights.iter().enumerate() {
        if w == 1.0 {
            continue;
        }
        let (z, e) = (&mut hidden[j * d..(j + 1) * d], &empty[j * d..(j + 1) * d]);
        for (z, &e) in z.iter_mut().zip(e) {
            *z = (*z - e) * w + e;
        }
    }
}
