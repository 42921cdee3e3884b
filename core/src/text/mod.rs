//! Text front end of the text encoders: tokenizers, A1111 prompt weighting,
//! textual-inversion embeddings, and the 77-token chunks a CLIP encoder consumes.
//!
//! - [`tokenizer`]: CLIP's byte-level BPE with CLIP's exact text clean-up.
//! - [`prompt`]: A1111's `parse_prompt_attention` and the chunking of a weighted
//!   prompt into `BOS + 75 + EOS` windows.
//! - [`t5`]: T5's SentencePiece unigram tokenizer and ComfyUI's weighted, padded T5
//!   sequences.
//! - [`llm`]: the byte-level BPE of the LLM text encoders (Qwen, Mistral's tekken) and
//!   sd.cpp's weighted, padded sequences of a templated prompt.
//! - [`embeddings`]: a directory of textual-inversion files, matched by file stem.
//! - [`ClipSkip`]: which hidden layer the encoder reads; only configuration here.

mod clean;
#[rustfmt::skip]
mod clean_tables;
pub mod embeddings;
pub mod llm;
pub mod prompt;
pub mod t5;
mod tekken;
pub mod tokenizer;

use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub use clean::{clip_clean, fix_text, html_unescape};
pub use embeddings::{
    load_embedding_file, Embedding, EmbeddingLibrary, EmbeddingVectors, EMBEDDING_EXTENSIONS,
};
pub use prompt::{
    parse_prompt_attention, tokenize_weighted, Chunk, ChunkOptions, EmbeddingSlot, PromptPiece,
    TokenizedPrompt, CHUNK_CONTENT, CHUNK_LEN, EMBEDDING_PLACEHOLDER,
};
pub use tokenizer::{ClipTokenizer, PadToken, BOS_TOKEN, EOS_TOKEN, VOCAB_SIZE};

/// How many final transformer layers of the CLIP text encoder to skip, A1111 style:
/// 1 reads the last layer's output (no skip), 2 the penultimate one, and so on.
///
/// SD1 was trained on the last layer, SD2 (OpenCLIP ViT-H) and SDXL on the
/// penultimate, so those are the defaults ([`ClipSkip::default_for`]); a user value
/// overrides them. The encoder applies it; tokenization does not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClipSkip(u32);

/// The model families whose text-encoder defaults differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TextFamily {
    Sd1,
    Sd2,
    Sdxl,
}

impl ClipSkip {
    /// `skip` must be at least 1 (A1111 and sd.cpp treat 0 and negatives as "use the
    /// family default"; [`ClipSkip::from_user`] does that).
    pub fn new(skip: u32) -> Result<Self, TextError> {
        if skip == 0 {
            return Err(TextError::InvalidClipSkip(0));
        }
        Ok(Self(skip))
    }

    /// sd.cpp's rule: a value <= 0 means the family default.
    pub fn from_user(value: i64, family: TextFamily) -> Result<Self, TextError> {
        if value <= 0 {
            return Ok(Self::default_for(family));
        }
        u32::try_from(value)
            .map(Self)
            .map_err(|_| TextError::InvalidClipSkip(value))
    }

    pub fn default_for(family: TextFamily) -> Self {
        match family {
            TextFamily::Sd1 => Self(1),
            TextFamily::Sd2 | TextFamily::Sdxl => Self(2),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// Index of the hidden state to read among `num_layers` layers (0-based), or
    /// `None` when the skip exceeds the depth.
    pub fn layer_index(self, num_layers: usize) -> Option<usize> {
        num_layers.checked_sub(self.0 as usize)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("token id {id} at position {position} is not in the CLIP vocabulary")]
    UnknownTokenId { id: u32, position: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("clip skip must be at least 1, got {0}")]
    InvalidClipSkip(i64),
    #[error("embeddings directory {path}: {source}")]
    EmbeddingDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The model-file reader failed; its error names the file and tensor.
    #[error("embedding file: {0}")]
    EmbeddingIo(#[from] crate::io::IoError),
    #[error("embedding file {path}: {reason}")]
    Embedding { path: PathBuf, reason: String },
    #[error("embedding '{name}' has {vectors} vectors, more than the {max} tokens a chunk holds")]
    EmbeddingTooLong {
        name: String,
        vectors: usize,
        max: usize,
    },
}

/// A Hugging Face `tokenizer.json` shipped gzip'd in the binary (`gz`), unpacked and built
/// once per process into `cell`; `what` names it in errors.
pub(crate) fn bundled_tokenizer(cell: &'static OnceLock<Result<Arc<tokenizers::Tokenizer>, String>>, gz: &[u8], what: &str) -> Result<Arc<tokenizers::Tokenizer>, TextError> {
    let t = cell.get_or_init(|| {
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(gz).read_to_end(&mut json).map_err(|e| format!("unpacking the {what} vocabulary: {e}"))?;
        tokenizers::Tokenizer::from_bytes(&json).map(Arc::new).map_err(|e| format!("reading the {what} vocabulary: {e}"))
    });
    t.clone().map_err(TextError::Tokenizer)
}
