//! A thin safe layer over ggml.
//!
//! Model code describes computations as ggml graphs: it creates a metadata-only
//! [`Context`], declares input and weight tensors, chains ops into a [`Graph`], lets a
//! [`GraphAllocator`] place the intermediates in one backend buffer, and asks a
//! [`Backend`] to compute it. Weights live in [`Buffer`]s owned by the residency manager.
//!
//! ggml reports misuse (mismatched shapes, a full context) by aborting the process, so
//! every op here checks ggml's own preconditions first and returns a [`GgmlError`]
//! instead: a malformed model file must end in an error message, never in `abort()`.

pub mod bf16;
mod attention;
mod backend;
mod context;
mod gelu;
pub mod matmul;
mod options;
mod run;

pub use backend::{devices, AllocTarget, Backend, BackendKind, Buffer, BufferType, DeviceInfo, GraphAllocator};
pub use options::{scope, GraphOptions};
pub use context::{Circular, Context, Graph, ScaleMode, Tensor};
pub use run::GraphRun;

use std::sync::Once;

/// A ggml element type. A newtype over the raw enum so the safe API can name the common
/// ones as constants; conversions to and from [`crate::dtype::DType`] live in `dtype`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GType(pub ggml_sys::ggml_type);

impl GType {
    pub const F32: GType = GType(ggml_sys::GGML_TYPE_F32);
    pub const F16: GType = GType(ggml_sys::GGML_TYPE_F16);
    pub const BF16: GType = GType(ggml_sys::GGML_TYPE_BF16);
    pub const I32: GType = GType(ggml_sys::GGML_TYPE_I32);
    pub const Q8_0: GType = GType(ggml_sys::GGML_TYPE_Q8_0);
    pub const Q4_0: GType = GType(ggml_sys::GGML_TYPE_Q4_0);

    /// ggml's own name for the type ("f32", "q4_0", ...).
    pub fn name(self) -> &'static str {
        // SAFETY: ggml_type_name returns a static C string for every type value, and
        // "NONE" for out-of-range ones.
        unsafe {
            let p = ggml_sys::ggml_type_name(self.0);
            if p.is_null() {
                return "?";
            }
            std::ffi::CStr::from_ptr(p).to_str().unwrap_or("?")
        }
    }

    /// Elements per quantization block (1 for plain types).
    pub fn block_size(self) -> usize {
        // SAFETY: pure lookup in ggml's type traits table.
        unsafe { ggml_sys::ggml_blck_size(self.0) as usize }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        // SAFETY: pure lookup in ggml's type traits table.
        unsafe { ggml_sys::ggml_type_size(self.0) }
    }

    pub fn is_quantized(self) -> bool {
        // SAFETY: pure lookup in ggml's type traits table.
        unsafe { ggml_sys::ggml_is_quantized(self.0) }
    }
}

impl std::fmt::Debug for GType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgmlError {
    #[error("ggml context: {0}")]
    Context(String),
    #[error("shape error in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("cannot allocate {what} ({bytes} bytes) on {backend}")]
    Alloc { what: String, bytes: usize, backend: String },
    #[error("graph compute failed on {backend}: status {status}")]
    Compute { backend: String, status: i32 },
    #[error("backend: {0}")]
    Backend(String),
    #[error("tensor data: {0}")]
    Data(String),
}

pub type Result<T> = std::result::Result<T, GgmlError>;

/// ggml-cpu builds lookup tables (f16 conversion, gelu) on first use; calling its init
/// once up front keeps that off the hot path and makes it thread-safe.
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| unsafe { ggml_sys::ggml_cpu_init() });
}

/// Number of threads to use by default: every core the process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
