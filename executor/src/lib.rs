//! The node graph: the typed node API, workflow formats (ours, ComfyUI API, ComfyUI UI),
//! validation with ComfyUI-shaped error reports, and a caching scheduler.
//!
//! Models are opaque [`Value`]s here; this crate knows nothing of tensors or weights, so
//! it builds fast and tests without any model files (see the [`stub`] node pack).
//!
//! ```
//! use std::sync::Arc;
//! use sdflow_executor::{stub, CancelToken, Executor, ExecutorConfig, NullSink, Registry, RunOptions, Workflow};
//!
//! let mut registry = Registry::new();
//! stub::register(&mut registry);
//! let registry = Arc::new(registry);
//! let wf = Workflow::parse(
//!     r#"{"1": {"class_type": "StubConstant", "inputs": {"seed": 1, "size": 4}},
//!         "2": {"class_type": "StubOutput", "inputs": {"latent": ["1", 0], "label": "x"}}}"#,
//!     &registry,
//! )?;
//! let executor = Executor::new(registry, ExecutorConfig::default());
//! let report = executor.run(&wf, &NullSink, &CancelToken::new(), &RunOptions::default())?;
//! assert_eq!(report.executed.len(), 2);
//! // The second run finds everything in the cache.
//! let again = executor.run(&wf, &NullSink, &CancelToken::new(), &RunOptions::default())?;
//! assert!(again.executed.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

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
