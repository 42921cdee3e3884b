//! What the graphs built on a thread are for: the device they will run on, and the kernels
//! the user chose (sd-cli's `--fa`, `--diffusion-conv-direct`, `--vae-conv-direct`).
//!
//! A scope rather than a parameter: ops are chosen while model code builds a graph, many
//! calls below the node that knows where the model is placed. A CPU graph wants our custom
//! ops; a GPU graph must not hold one. The node runs the model inside [`scope`], and every
//! [`Context`](super::Context) created there records the options it was made under.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// How a graph is built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GraphOptions {
    /// The graph runs on a GPU backend: ggml's kernels only, no CPU custom op.
    pub gpu: bool,
    /// Fused attention (`ggml_flash_attn_ext`) at every sequence length where our CPU
    /// attention does not run, not only past the length where it saves memory.
    pub flash_attn: bool,
    /// Convolutions as `ggml_conv_2d_direct` instead of im2col and a product.
    pub conv_direct: bool,
}

thread_local! {
    static CURRENT: Cell<Option<GraphOptions>> = const { Cell::new(None) };
}

/// Set once any GPU backend exists: graphs built outside a [`scope`] then avoid the CPU
/// custom ops, since nothing says which backend will run them.
static GPU_BACKEND: AtomicBool = AtomicBool::new(false);

pub(crate) fn note_gpu_backend() {
    GPU_BACKEND.store(true, Ordering::Relaxed);
}

/// Run `f` with graphs built on this thread under `options`.
pub fn scope<T>(options: GraphOptions, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<GraphOptions>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.set(self.0);
        }
    }
    let _restore = Restore(CURRENT.replace(Some(options)));
    f()
}

/// The options a graph built now on this thread gets.
pub fn current() -> GraphOptions {
    CURRENT.get().unwrap_or(GraphOptions { gpu: GPU_BACKEND.load(Ordering::Relaxed), ..GraphOptions::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_sets_the_options_and_restores_the_outer_ones() {
        let outer = current();
        let gpu = GraphOptions { gpu: true, flash_attn: true, conv_direct: false };
        let cpu = GraphOptions::default();
        scope(gpu, || {
            assert_eq!(current(), gpu);
            scope(cpu, || assert_eq!(current(), cpu));
            assert_eq!(current(), gpu);
        });
        assert_eq!(current(), outer);
        let r = std::panic::catch_unwind(|| scope(gpu, || panic!("inside")));
        assert!(r.is_err());
        assert_eq!(current(), outer, "a panic inside a scope restores the outer options");
    }
}
