//! The CLIP byte-level BPE tokenizer, as OpenAI's `SimpleTokenizer` runs it.
//!
//! The merge table and the BPE itself come from `instant-clip-tokenizer`, which ships
//! OpenAI's `bpe_simple_vocab_16e6.txt`. What that crate leaves out is done here, in
//! CLIP's order: the clean-up of [`super::clean`] (ftfy, `html.unescape` twice,
//! whitespace collapsing, lower-casing), then CLIP's word-splitting regex. Each word is
//! handed to the crate on its own, so its own splitting (which knows `<start_of_text>`
//! markers OpenAI's regex does not) can never see text that spans words.

use std::sync::{Arc, OnceLock};

use instant_clip_tokenizer::{Token, Tokenizer};
use regex::Regex;

use super::clean::clip_clean;
use super::TextError;

/// `<|startoftext|>`.
pub const BOS_TOKEN: u32 = 49406;
/// `<|endoftext|>`.
pub const EOS_TOKEN: u32 = 49407;
/// Number of token ids CLIP's embedding table has.
pub const VOCAB_SIZE: u32 = 49408;

/// The byte-level BPE tokenizer of every CLIP text encoder Stable Diffusion uses
/// (OpenAI ViT-L/14 for SD1, OpenCLIP ViT-H/14 for SD2, both for SDXL).
///
/// The vocabulary is one for all of them; what differs is the padding token.
/// Building the merge table takes tens of milliseconds, so it is built once per
/// process and shared by every `ClipTokenizer`, making `new` cheap.
#[derive(Clone)]
pub struct ClipTokenizer {
    bpe: Arc<Tokenizer>,
    words: Arc<Regex>,
    pad: u32,
}

impl std::fmt::Debug for ClipTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipTokenizer")
            .field("pad", &self.pad)
            .finish_non_exhaustive()
    }
}

/// Which token fills a chunk after its end-of-text token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadToken {
    /// OpenAI CLIP (SD1, SDXL's first encoder) pads with `<|endoftext|>` (49407).
    EndOfText,
    /// OpenCLIP (SD2, SDXL's second encoder) pads with id 0 (`!`); sd.cpp and A1111
    /// both do this for SD2.
    Zero,
}

impl PadToken {
    pub fn id(self) -> u32 {
        match self {
            PadToken::EndOfText => EOS_TOKEN,
            PadToken::Zero => 0,
        }
    }
}

struct Shared {
    bpe: Arc<Tokenizer>,
    words: Arc<Regex>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        bpe: Arc::new(Tokenizer::new()),
        // OpenAI's pattern, compiled by Python's `regex` with IGNORECASE. The text is
        // lower-case already, but case folding still matters in two places: `s`
        // also matches `ſ` (so `'ſ` is a contraction), and a negated class excludes
        // every character whose fold is in it, so U+0345 (folds to ι, yet is not a
        // letter itself) matches no alternative and is dropped. Rust's `(?i)` would
        // put U+0345 into `\p{L}` instead, hence the spelled-out classes.
        words: Arc::new(
            Regex::new(
                r"<\|startoftext\|>|<\|endoftext\|>|'[sſ]|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}\x{345}]+",
            )
            .expect("valid regex"),
        ),
    })
}

/// Id of the single-byte, not-word-final token for `b`: CLIP's `bytes_to_unicode`
/// numbers the printable bytes `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ` first, in order, then
/// the rest.
fn byte_token(b: u8) -> u32 {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let rank = if printable(b) {
        (0..b).filter(|&x| printable(x)).count()
    } else {
        188 + (0..b).filter(|&x| !printable(x)).count()
    };
    rank as u32
}

impl Default for ClipTokenizer {
    fn default() -> Self {
        Self::new(PadToken::EndOfText)
    }
}

impl ClipTokenizer {
    pub fn new(pad: PadToken) -> Self {
        let s = shared();
        Self {
            bpe: Arc::clone(&s.bpe),
            words: Arc::clone(&s.words),
            pad: pad.id(),
        }
    }

    pub fn bos(&self) -> u32 {
        BOS_TOKEN
    }

    pub fn eos(&self) -> u32 {
        EOS_TOKEN
    }

    pub fn pad(&self) -> u32 {
        self.pad
    }

    /// Token ids of `text`, without BOS/EOS, exactly as CLIP's `SimpleTokenizer.encode`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let cleaned = clip_clean(text);
        let mut out = Vec::new();
        let mut piece: Vec<Token> = Vec::new();
        for word in self.words.find_iter(&cleaned) {
            match word.as_str() {
                "<|startoftext|>" => out.push(BOS_TOKEN),
                "<|endoftext|>" => out.push(EOS_TOKEN),
                // The one word CLIP's regex keeps whole that the crate's own splitting
                // would cut in two. No merge joins `'` to the bytes of `ſ`, so its BPE
                // is the apostrophe's byte token followed by `ſ` on its own.
                "'ſ" => {
                    out.push(byte_token(b'\''));
                    piece.clear();
                    self.bpe.encode("ſ", &mut piece);
                    out.extend(piece.iter().map(|t| u32::from(t.to_u16())));
                }
                w => {
                    piece.clear();
                    self.bpe.encode(w, &mut piece);
                    out.extend(piece.iter().map(|t| u32::from(t.to_u16())));
                }
            }
        }
        out
    }

    /// The text of `ids` (word ends become spaces, as in CLIP). Ids outside the
    /// vocabulary are an error rather than being skipped, so a placeholder that leaked
    /// into decoding is noticed.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        let mut tokens = Vec::with_capacity(ids.len());
        for (position, &id) in ids.iter().enumerate() {
            let token = u16::try_from(id)
                .ok()
                .and_then(|v| Token::from_u16(v, &self.bpe))
                .ok_or(TextError::UnknownTokenId { id, position })?;
            tokens.push(token);
        }
        Ok(self
            .bpe
            .decode(tokens)
            .replace("<start_of_text>", "<|startoftext|>")
            .replace("<end_of_text>", "<|endoftext|>"))
    }
}
