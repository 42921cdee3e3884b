//! `nn::attention` on the CPU runs our blocked attention op (`ggml::attention`); with
//! the custom ops off (GPU backends, `SDFLOW_GGML_MATMUL=1`) it switches from the plain
//! product to ggml's fused attention for long sequences. Every path must agree with
//! plain attention in f64 (attention_check); models_attention_ggml.rs runs ggml's paths.

mod attention_check;

use attention_check::check;
use sdflow_core::models::nn::FLASH_MIN_KEYS;

#[test]
fn blocked_attention_is_exact() {
    // Short and long key runs, query counts that leave partial blocks, several batches.
    for (tq, tk, batch) in [(37, 77, 1), (200, 13, 2), (37, FLASH_MIN_KEYS as usize + 3, 1), (129, 300, 3)] {
        check(tq, tk, batch, 1e-5);
    }
}
