//! Matrix products on the CPU through the `gemm` crate, as a ggml custom op.
//!
//! ggml's CPU products (llamafile's tinyBLAS) multiply straight from the operands without
//! packing them into cache-sized panels; on an AVX2 CPU without AVX-512 (measured here on
//! a Zen 3 core: `cargo bench -p sdflow-core --bench gemm`) that ran at 13–17 GFLOP per
//! CPU-second in f32, f16 and bf16, while the packed kernels of `gemm` ran the same
//! products at 55–66 — 4× faster, and most of a diffusion step is these products. So on
//! the CPU, [`Context::mul_mat`](super::Context::mul_mat) becomes this op: weights of any
//! ggml type are expanded to f32 a few rows at a time (each thread its own rows, into a
//! reused scratch buffer), activations stay f32, and the product is exact f32 GEMM. The
//! op can also write its output transposed, which lets convolutions land in [W, H, C, N]
//! without a permute copy.
//!
//! GPU backends have no custom ops, so graphs built for a GPU never take it (see
//! `super::options`); `SDFLOW_GGML_MATMUL=1` (or [`disable`]) turns it off everywhere, for
//! comparisons.

use std::cell::RefCell;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU8, Ordering};

const UNSET: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNSET);

/// Whether graphs built from now on use this op for CPU products.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = std::env::var("SDFLOW_GGML_MATMUL").map_or(true, |v| v.is_empty() || v == "0");
            // Another thread may have disabled it meanwhile; never turn that back on.
            let _ = STATE.compare_exchange(UNSET, if on { ON } else { OFF }, Ordering::Relaxed, Ordering::Relaxed);
            STATE.load(Ordering::Relaxed) == ON
        }
    }
}

/// Use ggml's own products from now on, in every graph.
pub fn disable() {
    STATE.store(OFF, Ordering::Relaxed);
}

/// Below this many multiply-adds the packing costs more than it saves.
pub(crate) const MIN_MACS: i64 = 1 << 18;

/// Whether the op can take `a` × `b`: `b` f32 with contiguous rows, `a` with contiguous
/// rows of a type ggml can expand to f32.
pub(crate) fn supports(a: *const ggml_sys::ggml_tensor, b: *const ggml_sys::ggml_tensor) -> bool {
    // SAFETY: both point to live tensors of the caller's context; metadata reads only.
    unsafe {
        let (a, b) = (&*a, &*b);
        if b.type_ != ggml_sys::GGML_TYPE_F32 || b.nb[0] != 4 {
            return false;
        }
        // On CPUs with AVX-512 BF16, bf16 products run on `super::bf16`'s kernels; the
        // few they do not take (K not a multiple of 32) stay on ggml's bf16 dot products,
        // which beat expanding to f32 for ours there (~200 vs ~100 GFLOP/s on 2 Zen 4 cores).
        if a.type_ == ggml_sys::GGML_TYPE_BF16 && super::bf16::avx512_bf16() {
            return false;
        }
        let row_contiguous = a.nb[0] == ggml_sys::ggml_type_size(a.type_) && ggml_sys::ggml_blck_size(a.type_) as i64 <= a.ne[0];
        row_contiguous && (a.type_ == ggml_sys::GGML_TYPE_F32 || to_float(a.type_).is_some())
    }
}

unsafe extern "C" fn f16_rows(x: *const c_void, y: *mut f32, n: i64) {
    // SAFETY: forwarded; the caller passes n f16 values and room for n floats.
    unsafe { ggml_sys::ggml_cpu_fp16_to_fp32(x as *const ggml_sys::ggml_fp16_t, y, n) }
}

unsafe extern "C" fn bf16_rows(x: *const c_void, y: *mut f32, n: i64) {
    // SAFETY: as f16_rows.
    unsafe { ggml_sys::ggml_cpu_bf16_to_fp32(x as *const ggml_sys::ggml_bf16_t, y, n) }
}

pub(crate) fn to_float(ty: ggml_sys::ggml_type) -> Option<unsafe extern "C" fn(*const c_void, *mut f32, i64)> {
    // ggml-base's row converters for f16 and bf16 are scalar loops; ggml-cpu's use the
    // CPU's conversion instructions (F16C, AVX-512 BF16).
    match ty {
        ggml_sys::GGML_TYPE_F16 => return Some(f16_rows),
        ggml_sys::GGML_TYPE_BF16 => return Some(bf16_rows),
        _ => {}
    }
    // SAFETY: ggml_get_type_traits returns a static table entry for every type.
    unsafe {
        let traits = ggml_sys::ggml_get_type_traits(ty);
        if traits.is_null() {
            return None;
        }
        (*traits).to_float
    }
}

/// Flag bit in the op's userdata: write C transposed, [N, M, ...] instead of [M, N, ...].
pub(crate) const TRANSPOSED: usize = 1;

thread_local! {
    // Grows to the largest weight slice a thread expands and stays, so a graph's products
    // fault in their scratch pages once per thread, not once per product.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The op: `dst` = src0 [K, M, A2, A3] × src1 [K, N, B2, B3] (src1's batch dims multiples
/// of src0's), each thread one share of the work.
pub(crate) unsafe extern "C" fn compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::mul_mat`, whose sources
    // are the two operands, all allocated; the shapes were checked when it was built.
    unsafe {
        let d = &*dst;
        let (a, b) = (&*d.src[0], &*d.src[1]);
        let transposed = userdata as usize & TRANSPOSED != 0;
        let (k, m) = (a.ne[0] as usize, a.ne[1] as usize);
        let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
        // A weight matrix times a batch stored back to back is one product with the
        // batch as extra columns: one packing of the weights instead of one per batch.
        let merge = !transposed
            && a.ne[2] * a.ne[3] == 1
            && b.nb[2] == b.nb[1] * b.ne[1] as usize
            && b.nb[3] == b.nb[2] * b.ne[2] as usize
            && d.nb[2] == d.nb[1] * d.ne[1] as usize
            && d.nb[3] == d.nb[2] * d.ne[2] as usize;
        let (n, batches) = if merge { ((b.ne[1] * b.ne[2] * b.ne[3]) as usize, 1) } else { (b.ne[1] as usize, (b.ne[2] * b.ne[3]) as usize) };
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        // Whole matrices per thread when there are enough of them (attention heads), so
        // no operand is packed twice; otherwise each thread takes a band of M rows.
        let (batch_range, rows): (Vec<usize>, (usize, usize)) = if batches >= nth {
            ((ith..batches).step_by(nth).collect(), (0, m))
        } else {
            let band = m.div_ceil(nth).next_multiple_of(8).min(m);
            let r0 = (ith * band).min(m);
            ((0..batches).collect(), (r0, (r0 + band).min(m)))
        };
        let (r0, r1) = rows;
        if r0 >= r1 {
            return;
        }
        let convert = if a.type_ == ggml_sys::GGML_TYPE_F32 { None } else { to_float(a.type_) };
        for bi in batch_range {
            let (i2, i3) = ((bi as i64) % b.ne[2], (bi as i64) / b.ne[2]);
            let a_base = (a.data as *const u8).add((i2 / r2) as usize * a.nb[2] + (i3 / r3) as usize * a.nb[3]);
            let b_base = (b.data as *const u8).add(i2 as usize * b.nb[2] + i3 as usize * b.nb[3]) as *const f32;
            let d_base = (d.data as *mut u8).add(i2 as usize * d.nb[2] + i3 as usize * d.nb[3]) as *mut f32;
            let rows_n = r1 - r0;
            let run = |lhs: *const f32, lhs_rs: isize| {
                // C (m × n): element (row of a, row of b); dst offset per the layout.
                let (dst_rs, dst_cs) = if transposed { ((d.nb[1] / 4) as isize, 1) } else { (1, (d.nb[1] / 4) as isize) };
                gemm::gemm(
                    rows_n,
                    n,
                    k,
                    d_base.offset(r0 as isize * dst_rs),
                    dst_cs,
                    dst_rs,
                    false,
                    lhs,
                    1,
                    lhs_rs,
                    b_base,
                    (b.nb[1] / 4) as isize,
                    1,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            };
            match convert {
                None => run(a_base.add(r0 * a.nb[1]) as *const f32, (a.nb[1] / 4) as isize),
                Some(f) => SCRATCH.with(|s| {
                    let mut s = s.borrow_mut();
                    if s.len() < rows_n * k {
                        s.resize(rows_n * k, 0.0);
                    }
                    for r in 0..rows_n {
                        f(a_base.add((r0 + r) * a.nb[1]) as *const c_void, s.as_mut_ptr().add(r * k), k as i64);
                    }
                    run(s.as_ptr(), k as isize);
                }),
            }
        }
    }
}

/// Columns of the wide output a thread computes per block: the block's C_out × columns
/// accumulator stays within about 1 MiB (the L2 of the CPUs measured) where that leaves
/// the products at least 512 columns wide.
fn conv_block_cols(cout: usize) -> usize {
    (262_144 / cout.max(1)).max(512)
}

/// Stride-1, undilated convolution as KW·KH accumulated products over shifted views of
/// the padded input, with no im2col buffer (that buffer is KW·KH times the input: 1.2 GB
/// for one 128-channel 512² layer of the VAE).
///
/// `dst` [OW, OH, C_out, N] = src0 (f32 kernel, laid out [C, C_out, KW, KH] so that each
/// offset's matrix is contiguous) ⋆ src1 (f32 padded
/// input [OW+KW-1, OH+KH-1, C, N], contiguous). Output row `oy`, column `ox` is wide
/// column `oy·Wp + ox` of a product whose right operand for offset (dx, dy) is the input
/// read from `dy·Wp + dx` on: the columns with `ox ≥ OW` are computed and dropped.
pub(crate) unsafe extern "C" fn conv_compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, _userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::conv_2d`, whose sources
    // are an f32 contiguous kernel and an f32 contiguous padded input of matching shapes.
    unsafe {
        let d = &*dst;
        let (kt, xt) = (&*d.src[0], &*d.src[1]);
        let (c, cout, kw, kh) = (kt.ne[0] as usize, kt.ne[1] as usize, kt.ne[2] as usize, kt.ne[3] as usize);
        let (wp, hp) = (xt.ne[0] as usize, xt.ne[1] as usize);
        let (ow, oh, batches) = (d.ne[0] as usize, d.ne[1] as usize, d.ne[3] as usize);
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let wide = (oh - 1) * wp + ow;
        let share = wide.div_ceil(nth);
        let (j0, j1) = ((ith * share).min(wide), ((ith + 1) * share).min(wide));
        if j0 >= j1 {
            return;
        }
        let block = conv_block_cols(cout);
        let kern = kt.data as *const f32;
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < cout * block {
                s.resize(cout * block, 0.0);
            }
            for n in 0..batches {
                let x = (xt.data as *const u8).add(n * xt.nb[3]) as *const f32;
                let out = (d.data as *mut u8).add(n * d.nb[3]) as *mut f32;
                let mut b0 = j0;
                while b0 < j1 {
                    let cols = block.min(j1 - b0);
                    for dy in 0..kh {
                        for dx in 0..kw {
                            let first = dy == 0 && dx == 0;
                            gemm::gemm(
                                cout,
                                cols,
                                c,
                                s.as_mut_ptr(),
                                1,
                                cols as isize,
                                !first,
                                kern.add((dy * kw + dx) * c * cout),
                                1,
                                c as isize,
                                x.add(dy * wp + dx + b0),
                                1,
                                (wp * hp) as isize,
                                1.0f32,
                                1.0f32,
                                false,
                                false,
                                false,
                                gemm::Parallelism::None,
                            );
                        }
                    }
                    for co in 0..cout {
                        keep_output_columns(s.as_ptr().add(co * cols), b0, b0 + cols, wp, ow, out.add(co * ow * oh));
                    }
                    b0 += cols;
                }
            }
        });
    }
}

/// Copy wide columns `j0..j1` of one output channel (`src[0]` is column `j0`; column
/// `oy·wp + ox` is output position (ox, oy)) into its `ow`-wide output plane, dropping the
/// columns with `ox ≥ ow`: the shifted-view convolutions compute those and throw them away.
///
/// # Safety
/// `src` holds `j1 - j0` floats; `plane` has room for every kept position.
pub(crate) unsafe fn keep_output_columns(src: *const f32, j0: usize, j1: usize, wp: usize, ow: usize, plane: *mut f32) {
    let mut j = j0;
    while j < j1 {
        let (oy, ox) = (j / wp, j % wp);
        if ox < ow {
            let run = (ow - ox).min(j1 - j);
            // SAFETY: per the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src.add(j - j0), plane.add(oy * ow + ox), run) };
            j += run;
        } else {
            j += wp - ox;
        }
    }
}
