//! `nn::attention` through ggml's own kernels, as GPU backends run it: the plain product
//! for short key runs, fused (flash) attention from `FLASH_MIN_KEYS` on.

mod attention_check;

use sdflow_core::models::nn::FLASH_MIN_KEYS;

#[test]
fn ggml_paths_match_plain_attention() {
    // Process-wide and one-way: this test binary never uses the CPU op.
    sdflow_core::ggml::matmul::disable();
    attention_check::check(37, FLASH_MIN_KEYS as usize - 1, 2, 1e-5);
    // Keys and values go through f16 on the fused path.
    attention_check::check(37, FLASH_MIN_KEYS as usize + 3, 1, 2e-3);
}
