//! sdflow-core: everything below the node graph.
//!
//! - [`ggml`]: a thin safe layer over our `ggml-sys` binding (contexts, tensors, graphs,
//!   backends, buffers). Model code builds ggml graphs through it, never eager loops.
//! - [`dtype`]: the element types a model file can hold, and conversion between them.
//! - [`io`]: one tensor-source abstraction over safetensors, GGUF, PyTorch pickles and
//!   diffusers folders, with every sanity check sd.cpp's loader makes.
//! - [`models`]: model architectures as ggml graphs (CLIP text encoders, ...), loaded
//!   from [`io`] sources and validated against their configs before any graph is built.
//! - [`residency`]: the one owner of model weights (sharing, budgets, eviction, pinning).
//! - [`detect`]: which model family a set of tensors is, from names and shapes alone.
//! - [`sampling`]: noise schedules, samplers and the seeded RNGs they draw from.
//! - [`text`]: the CLIP tokenizer and A1111 prompt weighting.
//! - [`synth`]: random-weight checkpoints with real architectures and key layouts, for
//!   tests, benchmarks and `sdflow demo` (no machine here can download real weights).

pub mod detect;
pub mod dtype;
pub mod ggml;
pub mod io;
pub mod lora;
pub mod models;
pub mod placement;
pub mod residency;
pub mod sampling;
pub mod synth;
pub mod text;
