//! sdflow-tests: end-to-end tests that run the committed workflow files on tiny
//! random-weight models with the real architectures (see `tests/`).
//!
//! This crate exists so the end-to-end suite can depend on every other crate without
//! any of them depending on each other for testing's sake.

use std::path::PathBuf;

/// The repository's `workflows/` folder.
pub fn workflows_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../workflows")
}
