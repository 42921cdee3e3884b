//! Softmax attention on the CPU as a ggml custom op, built on the `gemm` crate's kernels.
//!
//! ggml's fused CPU attention (`flash_attn_ext`) wants f16 keys and values, so every
//! layer first converts them, and its tiles multiply with its own small kernels. Here
//! each thread takes blocks of query rows of one head: the block's scores against every
//! key come from one GEMM into a per-thread buffer (256 rows × 4,096 keys is 4 MiB, where
//! the unfused product would hold the whole 4,096² matrix per head), a softmax with a
//! vectorisable `exp` runs over them in place, and a second GEMM multiplies them by the
//! values straight into the output. Everything stays f32, so it is exact up to `exp`'s
//! rounding (a few ulp), and the heads are read through strides: no permute copies.

use std::os::raw::{c_int, c_void};

/// Query rows per block. Larger blocks pack each head's keys and values fewer times:
/// at SD1.5's 4,096 tokens (dh 40) 32, 64, 128 and 256 rows ran at 35, 36–38, 40 and 42
/// GFLOP per CPU-second (`cargo bench -p sdflow-core --bench gemm`, 1 thread), ggml's
/// fused attention at 22.
const BLOCK_ROWS: usize = 256;

/// `e^x` for x ≤ 0 to a few ulp, in a form the compiler vectorises: x = n·ln 2 + r
/// with |r| ≤ ln 2 / 2, e^r by its degree-6 Taylor polynomial, 2^n in the exponent bits.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Below this e^x is under f32's smallest normal; the result is flushed to 0.
    let x = x.max(-87.0);
    // Round to nearest through the 1.5·2^23 shift (exact for |t| < 2^22).
    let n = (x * LOG2E + 12_582_912.0) - 12_582_912.0;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    f32::from_bits(((n as i32 + 127) << 23) as u32) * p
}

/// In place: `row` ← e^(row − max row); returns the sum.
pub(crate) fn exp_row(row: &mut [f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    // Eight partial sums keep the reduction vectorised (and its rounding independent of
    // how the compiler would otherwise order one long sum).
    let mut acc = [0f32; 8];
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c.iter_mut()) {
            *v = exp_nonpositive(*v - max);
            *a += *v;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp_nonpositive(*v - max);
        sum += *v;
    }
    sum
}

/// What both attention ops (this one and `bf16::attention_compute`) read off their tensor:
/// q [dh, H, Tq, B], k and v [dh, H, Tk, B], and the scale in the userdata's low 32 bits.
pub(crate) struct Operands<'t> {
    pub q: &'t ggml_sys::ggml_tensor,
    pub k: &'t ggml_sys::ggml_tensor,
    pub v: &'t ggml_sys::ggml_tensor,
    pub scale: f32,
    pub dh: usize,
    pub heads: usize,
    pub tq: usize,
    pub batch: usize,
    pub tk: usize,
}

/// # Safety
/// `d` must be an attention op's tensor built by `Context::attention_cpu`.
pub(crate) unsafe fn operands(d: &ggml_sys::ggml_tensor, userdata: *mut c_void) -> Operands<'_> {
    // SAFETY: the op has its three sources, per the caller's contract.
    let (q, k, v) = unsafe { (&*d.src[0], &*d.src[1], &*d.src[2]) };
    let (dh, heads, tq, batch) = (q.ne[0] as usize, q.ne[1] as usize, q.ne[2] as usize, q.ne[3] as usize);
    Operands { q, k, v, scale: f32::from_bits(userdata as usize as u32), dh, heads, tq, batch, tk: k.ne[2] as usize }
}

thread_local! {
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The op: `dst` [dh, H, Tq, B] = softmax(scale · q kᵀ) v per head, from q [dh, H, Tq, B]
/// and k, v [dh, H, Tk, B] (f32, unit stride in ne[0], any other strides); the scale is
/// the userdata's low 32 bits as an f32.
pub(crate) unsafe extern "C" fn compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::attention`, whose three
    // sources are allocated f32 tensors of the shapes it checked; `dst` is contiguous.
    unsafe {
        let d = &*dst;
        let Operands { q, k, v, scale, dh, heads, tq, batch, tk } = operands(d, userdata);
        let blocks = tq.div_ceil(BLOCK_ROWS);
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let es = |t: &ggml_sys::ggml_tensor, i: usize| (t.nb[i] / 4) as isize;
        SCORES.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < BLOCK_ROWS * tk {
                s.resize(BLOCK_ROWS * tk, 0.0);
            }
            for task in (ith..heads * batch * blocks).step_by(nth) {
                let (hb, blk) = (task / blocks, task % blocks);
                let (h, b) = (hb % heads, hb / heads);
                let r0 = blk * BLOCK_ROWS;
                let rows = BLOCK_ROWS.min(tq - r0);
                let head = |t: &ggml_sys::ggml_tensor, row: usize| (t.data as *const u8).add(h * t.nb[1] + row * t.nb[2] + b * t.nb[3]) as *const f32;
                let scores = s.as_mut_ptr();
                // scores (rows × tk) = scale · q_block (rows × dh) · kᵀ (dh × tk)
                gemm::gemm(rows, tk, dh, scores, 1, tk as isize, false, head(q, r0), 1, es(q, 2), head(k, 0), es(k, 2), 1, 0.0f32, scale, false, false, false, gemm::Parallelism::None);
                let mut inv = [0f32; BLOCK_ROWS];
                for (r, iv) in inv.iter_mut().enumerate().take(rows) {
                    *iv = 1.0 / exp_row(&mut s[r * tk..(r + 1) * tk]);
                }
                let out = (d.data as *mut u8).add(h * d.nb[1] + r0 * d.nb[2] + b * d.nb[3]) as *mut f32;
                // out block (rows × dh) = probabilities (rows × tk) · v (tk × dh)
                gemm::gemm(rows, dh, tk, out, 1, es(d, 2), false, s.as_ptr(), 1, tk as isize, head(v, 0), 1, es(v, 2), 0.0f32, 1.0f32, false, false, false, gemm::Parallelism::None);
                for (r, iv) in inv.iter().enumerate().take(rows) {
                    let o = std::slice::from_raw_parts_mut(out.offset(r as isize * es(d, 2)), dh);
                    o.iter_mut().for_each(|x| *x *= iv);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::exp_nonpositive;

    #[test]
    fn exp_is_close_to_std() {
        let mut worst = 0f32;
        for i in 0..=200_000 {
            let x = -(i as f32) * 1e-3 * 0.5;
            let (got, want) = (exp_nonpositive(x), x.exp());
            if want > 1e-30 {
                worst = worst.max(((got - want) / want).abs());
            }
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert!(exp_nonpositive(-1e9) < 1e-37);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }
}
