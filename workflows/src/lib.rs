//! sdflow-workflows: the sd-cli presets (`sdflow txt2img -m … -p …`) as a library that
//! builds workflow graphs from flags, shared by the CLI and the server. The committed
//! workflow files, one per supported mode, live beside this crate in `workflows/*.json`
//! and are run by `tests/tests/workflows.rs`.
//!
//! The presets come with the CLI issue; the workflow files are already used.
