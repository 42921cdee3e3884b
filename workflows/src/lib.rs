//! sdflow-workflows: what sits between users and the node graph — the PNG metadata of
//! saved images ([`metadata`]) and, with the CLI issue, the sd-cli presets that build
//! workflow graphs from flags (shared by the CLI and the server). The committed workflow
//! files, one per supported mode, live beside this crate in `workflows/*.json` and are run
//! by `tests/tests/workflows.rs`.

pub mod bundled;
pub mod metadata;
pub mod presets;
