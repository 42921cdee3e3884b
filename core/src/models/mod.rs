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
pub mod llm;
pub mod load;
pub mod nn;
pub mod pipeline;
pub mod sd;
pub mod sd3;
pub mod t5;
pub mod vae;
pub mod weights;
pub mod yolo;

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
