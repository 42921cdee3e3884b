//! Generates bindings for the ggml headers that llama-cpp-sys-2 installs.
//!
//! llama-cpp-sys-2 builds ggml with CMake and exports its install prefix as
//! `DEP_LLAMA_ROOT`; the headers there are exactly the ones of the library we link,
//! so the bindings can never drift from the compiled code.

use std::env;
use std::path::PathBuf;

const HEADERS: &[&str] = &["ggml.h", "ggml-alloc.h", "ggml-backend.h", "ggml-cpu.h", "gguf.h"];

fn main() {
    let root = env::var("DEP_LLAMA_ROOT").expect(
        "DEP_LLAMA_ROOT is not set: ggml-sys must be built as a dependent of llama-cpp-sys-2",
    );
    let include = PathBuf::from(&root).join("include");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    println!("cargo:include={}", include.display());

    let mut wrapper = String::new();
    for h in HEADERS {
        wrapper.push_str(&format!("#include \"{}\"\n", include.join(h).display()));
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        wrapper.push_str(&format!("#include \"{}\"\n", include.join("ggml-cuda.h").display()));
    }
    if env::var_os("CARGO_FEATURE_VULKAN").is_some() {
        wrapper.push_str(&format!("#include \"{}\"\n", include.join("ggml-vulkan.h").display()));
    }

    let bindings = bindgen::Builder::default()
        .header_contents("sdflow_ggml_wrapper.h", &wrapper)
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_item("ggml_.*")
        .allowlist_item("gguf_.*")
        .allowlist_item("GGML_.*")
        .allowlist_item("GGUF_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate()
        .expect("bindgen failed on the ggml headers");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("ggml_bindings.rs");
    bindings.write_to_file(&out).expect("cannot write ggml bindings");
}
