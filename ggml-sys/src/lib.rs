//! Raw FFI bindings to ggml, the tensor library sdflow computes with.
//!
//! Why this crate exists: we want a *current* ggml (new ops, CUDA/Vulkan backends,
//! quantized types) without maintaining a C build of our own. `llama-cpp-sys-2` already
//! builds and links ggml with CMake (and turns on `GGML_NATIVE` when we compile with
//! `target-cpu=native`); this crate only runs bindgen over the ggml headers it installs
//! (`ggml.h`, `ggml-alloc.h`, `ggml-backend.h`, `ggml-cpu.h`, `gguf.h`), so exactly one
//! ggml ends up in every sdflow binary. Safe wrappers live in `sdflow-core`.

#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

// Linking: llama-cpp-sys-2 emits the link lines for ggml; referencing the crate keeps it
// in the dependency graph of every final binary.
extern crate llama_cpp_sys_2 as _;

include!(concat!(env!("OUT_DIR"), "/ggml_bindings.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_reports_type_sizes() {
        unsafe {
            assert_eq!(ggml_type_size(GGML_TYPE_F32), 4);
            assert_eq!(ggml_type_size(GGML_TYPE_F16), 2);
            assert_eq!(ggml_blck_size(GGML_TYPE_Q4_0), 32);
        }
    }
}
