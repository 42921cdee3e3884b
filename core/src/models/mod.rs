//! Model architectures as ggml graphs.
//!
//! Each architecture has a config struct (inferred from the weights where the file
//! allows it), validates every weight's shape against it when constructed, and then
//! builds graphs on a caller's [`crate::ggml::Context`] — so a graph is only ever built
//! from tensors known to fit together.

pub mod clip;
pub mod chroma;
pub mod clip_vision;
pub mod conditioning;
pub mod dit;
pub mod esrgan;
pub mod flux;
pub mod flux2;
pub mod llm;
pub mod load;
pub mod nn;
pub mod pipeline;
pub mod qwen_image;
pub mod sd;
pub mod sd3;
pub mod t5;
pub mod vae;
pub mod wan;
pub mod weights;
pub mod yolo;
pub mod z_image;

pub use weights::{Adapter, AdapterSpec, Factor, Placeable, WeightSpec, Weights};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Ggml(#[from] crate::ggml::GgmlError),
    /// A model file that cannot be read ([`pipeline::open`]).
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error("missing weight `{0}`")]
    MissingWeight(String),
    #[error("weight `{name}` has shape {got:?} (ggml order), the architecture needs {expected:?}")]
    Shape { name: String, expected: Vec<i64>, got: Vec<i64> },
    #[error("weight `{name}`: {detail}")]
    Weight { name: String, detail: String },
    #[error("{0}")]
    Config(String),
    #[error("input: {0}")]
    Input(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// The prefix under which a model whose `marker` tensor (relative to its prefix) is among
/// `names` lies: the shortest-sorting part before the marker (`""`, `model.`,
/// `text_encoders.t5xxl.transformer.`, ...).
pub fn prefix_before<'a>(names: impl Iterator<Item = &'a str>, marker: &str) -> Option<String> {
    let mut found: Vec<&str> = names.filter_map(|n| n.strip_suffix(marker)).collect();
    found.sort();
    found.first().map(|p| p.to_string())
}

/// Checks a text encoder's input: B token sequences of one non-zero length T, every id
/// inside `model`'s vocabulary of `vocab`, and a padding mask (if any) of the same shape.
/// Returns (B, T).
pub fn check_token_batch(tokens: &[Vec<i32>], keep: Option<&[Vec<bool>]>, vocab: i64, model: &str) -> Result<(usize, usize)> {
    let b = tokens.len();
    let t = tokens.first().map_or(0, Vec::len);
    if b == 0 || t == 0 || tokens.iter().any(|s| s.len() != t) {
        return Err(ModelError::Input(format!("{b} token sequences of length {t}; need one or more of one non-zero length")));
    }
    if let Some(bad) = tokens.iter().flatten().find(|&&id| id < 0 || id as i64 >= vocab) {
        return Err(ModelError::Input(format!("token id {bad} outside {model}'s vocabulary of {vocab}")));
    }
    if let Some(k) = keep {
        if k.len() != b || k.iter().any(|s| s.len() != t) {
            return Err(ModelError::Input(format!("an attention mask for {} sequences does not fit {b} of {t} tokens", k.len())));
        }
    }
    Ok((b, t))
}
