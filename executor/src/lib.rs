//! The node graph: the typed node API, workflow formats (ours, ComfyUI API, ComfyUI UI),
//! validation with ComfyUI-shaped error reports, and a caching scheduler.
//!
//! Models are opaque [`Value`]s here; this crate knows nothing of tensors or weights, so
//! it builds fast and tests without any model files (see the [`stub`] node pack).

pub mod cache;
pub mod events;
pub mod executor;
pub mod node;
mod plan;
pub mod registry;
pub mod schema;
pub mod stub;
pub mod ui;
pub mod validate;
pub mod value;
pub mod workflow;

pub use cache::CacheStats;
pub use events::{Event, EventSink, NullSink, PreviewFormat, PreviewImage};
pub use executor::{Executor, ExecutorConfig, NodeTiming, RunError, RunOptions, RunReport};
pub use node::{CancelToken, ExecContext, InputData, Inputs, Lane, Node, NodeError, Outputs};
pub use plan::{CacheKey, Plan};
pub use registry::Registry;
pub use schema::{InputKind, InputSpec, NodeSchema, OutputSpec};
pub use validate::{validate, ErrorKind, NodeErrors, ValidationError, ValidationReport};
pub use value::{CacheSize, IoType, Value};
pub use workflow::{Header, InputValue, NodeSpec, Workflow, WorkflowError, WorkflowFormat};
