//! GELU's tanh form in one pass on the CPU, as a ggml custom op.
//!
//! ggml's own `gelu` looks x up in an f16 table (2.5e-3 off after a tiny T5's layers);
//! built from f32 ops ([`super::Context::gelu_tanh_exact`]) it is exact but nine passes over
//! the tensor, 11 % of a FLUX step on two cores. Here: `0.5·x·(1 + tanh u)` is `x·σ(2u)`,
//! computed as `x·e/(1 + e)` or `x/(1 + e)` with `e = exp(−2|u|)` from the vectorised exp
//! of the attention op, to a few ulp, with no cancellation for any sign of u.

use std::os::raw::{c_int, c_void};

use super::attention::exp_nonpositive;

/// PyTorch's `gelu(approximate="tanh")` of one value.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // √(2/π)
    let u = K * (x + 0.044_715 * x * x * x);
    // Past |u| = 9 f32's tanh is ±1 exactly: far negative x gives 0, as PyTorch's does.
    let e = if u.abs() > 9.0 { 0.0 } else { exp_nonpositive(-2.0 * u.abs()) };
    let num = if u >= 0.0 { 1.0 } else { e };
    x * num / (1.0 + e)
}

/// ggml custom-op body: `dst` = GELU(src[0]), both contiguous f32 of one shape; each thread
/// takes an equal share of the elements.
pub(crate) unsafe extern "C" fn compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, _userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::gelu_tanh_exact`, whose
    // source is a contiguous allocated f32 tensor of `dst`'s shape; `dst` is contiguous.
    unsafe {
        let d = &*dst;
        let src = &*d.src[0];
        let n = (d.ne[0] * d.ne[1] * d.ne[2] * d.ne[3]) as usize;
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let per = n.div_ceil(nth);
        let (from, to) = ((ith * per).min(n), ((ith + 1) * per).min(n));
        let x = std::slice::from_raw_parts((src.data as *const f32).add(from), to - from);
        let y = std::slice::from_raw_parts_mut((d.data as *mut f32).add(from), to - from);
        for (y, &x) in y.iter_mut().zip(x) {
            *y = gelu_tanh(x);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_formula_in_f64() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f64 * 1e-4;
            let want = 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            let got = super::gelu_tanh(x as f32) as f64;
            // Relative above 1, absolute below (where f32's tanh itself saturates at |u| ≈ 9).
            worst = worst.max((got - want).abs() / want.abs().max(1.0));
        }
        assert!(worst < 2e-6, "worst error {worst}");
        assert_eq!(super::gelu_tanh(0.0), 0.0);
        assert_eq!(super::gelu_tanh(-30.0), 0.0);
        assert_eq!(super::gelu_tanh(30.0), 30.0);
    }
}
