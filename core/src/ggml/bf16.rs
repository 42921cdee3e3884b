//! bf16 products on the CPU's bf16 units, as ggml custom ops.
//!
//! Two engines compute the same 32×32 blocks (C += A × B, A rows of bf16, B in the
//! pair-interleaved "VNNI" layout: each u32 holds two consecutive k of one column):
//! - Intel AMX tiles (Xeon Sapphire Rapids and later): one core multiplies bf16 matrices
//!   into f32 at ~700 GFLOP/s (measured: a plain tile loop over 1024³), where its f32 FMA
//!   path tops out near 100. Written as inline assembly (Rust's AMX intrinsics are still
//!   unstable); tiles are configured per thread at the start of each op.
//! - AVX-512 BF16 registers (`vdpbf16ps`; AMD Zen 4 and later, Intel Cooper Lake and
//!   later): eight rows × 32 columns of sums in 16 registers, each A pair broadcast over
//!   two B registers. ggml's own bf16 products (llamafile's tinyBLAS) read unpacked
//!   operands and ran at ~100 GFLOP/s per Zen 4 core; see docs/performance.md for ours.
//!
//! ggml itself uses AMX only for its int8 quantized types. So on such CPUs, products whose
//! weights are bf16 run here: activations rounded to bf16, sums kept in f32 — the
//! precision ggml's own bf16 path has. f16 and f32 weights stay on the exact f32 kernels
//! of [`super::matmul`].
//!
//! Three shapes of work:
//! - [`linear_compute`]: `dst` [M, N] = W [K, M] × X [K, N] (X already bf16). A blocks are
//!   rows of X; each thread packs its band of W rows into the pair-interleaved layout (and
//!   expands quantized rows) once per op, a chunk that stays in L2 at a time.
//! - [`conv_compute`]: a stride-1 convolution as KW·KH accumulated products over shifted
//!   views of the padded input, like `matmul::conv_compute`, but with the input already
//!   pair-interleaved (a shift along the pixel axis stays a pointer offset) and the sums of
//!   all offsets kept in the accumulators.
//! - [`attention_compute`]: softmax attention per head and block of 32 queries, both
//!   products here, the softmax in f32 between them (probabilities rounded to bf16).
//!
//! `SDFLOW_AMX=0` leaves the tiles out (the AVX-512 engine still runs where the CPU has
//! it); `SDFLOW_BF16_KERNELS=0` turns both off (ggml's products, for comparisons).

use std::cell::RefCell;
use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;

/// Which engine computes the blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// AMX-BF16 tiles.
    Tiles,
    /// AVX-512 BF16 dot products in vector registers.
    Avx512,
}

/// The engine this process uses, if any.
pub fn engine() -> Option<Engine> {
    static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();
    *ENGINE.get_or_init(|| {
        let off = |var: &str| std::env::var(var).is_ok_and(|v| v == "0");
        if off("SDFLOW_BF16_KERNELS") {
            None
        } else if !off("SDFLOW_AMX") && detect() {
            Some(Engine::Tiles)
        } else if avx512_bf16() {
            Some(Engine::Avx512)
        } else {
            None
        }
    })
}

/// Whether bf16 products run here at all.
pub fn available() -> bool {
    engine().is_some()
}

/// Whether the CPU has AVX-512 BF16 (`vdpbf16ps`).
pub(crate) fn avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this process can run AMX-BF16 tile instructions: the CPU has them, and Linux
/// granted the process the tile state (it must be asked for, once per process).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    // SAFETY: CPUID leaf 7 exists on every x86-64 CPU that runs this build (it is built
    // for the host's AVX2 at least); the call has no side effects. (Safe to call in newer
    // Rust, unsafe in the workspace's minimum version.)
    #[allow(unused_unsafe)]
    let edx = unsafe { core::arch::x86_64::__cpuid_count(7, 0) }.edx;
    if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain syscall with integer arguments; failure leaves nothing changed.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// Whether a product of a `weight`-typed matrix with reduction length `k` by `n` columns
/// runs here. bf16 weights: choosing them (`--type bf16`) is choosing bf16 arithmetic,
/// which ggml's own bf16 products do too. Quantized weights (GGUF Q8_0, K-quants, …):
/// each thread expands its band to f32 and rounds it to bf16 while packing, which adds
/// at most 2⁻⁹ relative error to a weight already quantized to 8 bits or fewer, and the
/// activations keep 8 significant bits where ggml's own quantized products round them to
/// Q8 (8 bits per block of 32 with one scale). Measured on FLUX.1 blocks (docs/performance.md),
/// this runs Q8_0 near the bf16 speed instead of at the f32 kernels'. A product of fewer
/// than 32 columns (a modulation vector) would spend most of its block on zero rows, so
/// quantized ones stay where they were. f16 and f32 weights keep their exact f32 products.
pub(crate) fn takes(weight: ggml_sys::ggml_type, k: i64, n: i64) -> bool {
    if k % 32 != 0 || !available() {
        return false;
    }
    weight == ggml_sys::GGML_TYPE_BF16 || (n >= 32 && is_quantized(weight) && super::matmul::to_float(weight).is_some())
}

/// Whether a stride-1 convolution with this kernel type and `c` input channels runs here
/// (bf16 kernels only: they are reordered as stored).
pub(crate) fn takes_conv(kernel: ggml_sys::ggml_type, c: i64) -> bool {
    kernel == ggml_sys::GGML_TYPE_BF16 && c % 32 == 0 && available()
}

fn is_quantized(ty: ggml_sys::ggml_type) -> bool {
    // SAFETY: ggml_get_type_traits returns a static table entry for every type.
    unsafe {
        let traits = ggml_sys::ggml_get_type_traits(ty);
        !traits.is_null() && (*traits).is_quantized
    }
}

/// Tile palette 1 with all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const FULL: TileConfig = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0], rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0] };

/// The 32×32 block product both engines compute: `zero`, then any number of `steps`
/// (sums carry across calls: a convolution's offsets add up), then `store`.
trait Block {
    /// Ready for this thread's blocks of one op.
    fn begin() -> Self;
    unsafe fn zero(&mut self);
    /// `ksteps` steps of C[32 × 32] += A[32 rows × 32] × B[16 pair rows × 32 columns]. A
    /// rows are `a_stride` bytes apart and advance 64 bytes a step; B pair rows are
    /// `b_stride` bytes apart and advance 16 pair rows a step.
    unsafe fn steps(&mut self, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, ksteps: usize);
    /// [`Block::steps`] where only the first `rows` rows of C are wanted: an engine may
    /// leave the others (A's rows there must still be readable). Apart from `steps`, whose
    /// fixed shape the compiler keeps tight (a row count in it cost the full blocks 15 %).
    unsafe fn steps_rows(&mut self, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, ksteps: usize, rows: usize) {
        let _ = rows;
        // SAFETY: forwarded.
        unsafe { self.steps(a, a_stride, b, b_stride, ksteps) }
    }
    /// `steps` for a full block, `steps_rows` for a partial one.
    #[inline(always)]
    unsafe fn steps_for(&mut self, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, ksteps: usize, rows: usize) {
        // SAFETY: forwarded.
        unsafe {
            if rows >= 32 {
                self.steps(a, a_stride, b, b_stride, ksteps)
            } else {
                self.steps_rows(a, a_stride, b, b_stride, ksteps, rows)
            }
        }
    }
    /// C row-major at `c`, rows `stride` bytes apart.
    unsafe fn store(&mut self, c: *mut u8, stride: usize);
}

/// Holds the configured tiles of this thread for the length of one op; the sums live in
/// tmm0..tmm3.
struct Tiles;

impl Block for Tiles {
    fn begin() -> Tiles {
        // SAFETY: the engine is `Tiles` only where the CPU has them and the process was
        // granted their state; the config is a valid palette-1 layout.
        unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) &FULL as *const TileConfig, options(nostack, readonly)) };
        Tiles
    }

    #[inline(always)]
    unsafe fn zero(&mut self) {
        // SAFETY: tiles configured by `begin`.
        unsafe { std::arch::asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)) }
    }

    #[inline(always)]
    unsafe fn steps(&mut self, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, ksteps: usize) {
        if ksteps == 0 {
            return;
        }
        // SAFETY: the caller guarantees every addressed byte is readable; tiles configured.
        unsafe {
            std::arch::asm!(
                "2:",
                "tileloadd tmm4, [{a0} + {as}*1]",
                "tileloadd tmm5, [{a1} + {as}*1]",
                "tileloadd tmm6, [{b0} + {bs}*1]",
                "tileloadd tmm7, [{b1} + {bs}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, 64",
                "add {a1}, 64",
                "add {b0}, {bstep}",
                "add {b1}, {bstep}",
                "dec {k}",
                "jnz 2b",
                a0 = inout(reg) a => _,
                a1 = inout(reg) a.add(16 * a_stride) => _,
                b0 = inout(reg) b => _,
                b1 = inout(reg) b.add(64) => _,
                as = in(reg) a_stride,
                bs = in(reg) b_stride,
                bstep = in(reg) 16 * b_stride,
                k = inout(reg) ksteps => _,
                options(nostack, readonly),
            )
        }
    }

    #[inline(always)]
    unsafe fn store(&mut self, c: *mut u8, stride: usize) {
        // SAFETY: the caller guarantees 32 rows of 128 writable bytes at `c`.
        unsafe {
            std::arch::asm!(
                "tilestored [{c0} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c3} + {s}*1], tmm3",
                c0 = in(reg) c,
                c1 = in(reg) c.add(64),
                c2 = in(reg) c.add(16 * stride),
                c3 = in(reg) c.add(16 * stride + 64),
                s = in(reg) stride,
                options(nostack),
            )
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releases this thread's tile state, configured in `begin`.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The AVX-512 BF16 engine: the 32×32 sums in memory (one L1-resident block), loaded into
/// registers eight rows at a time for each `steps` call.
#[repr(C, align(64))]
struct Regs {
    acc: [f32; 32 * 32],
}

impl Block for Regs {
    fn begin() -> Regs {
        Regs { acc: [0.0; 32 * 32] }
    }

    unsafe fn zero(&mut self) {
        self.acc.fill(0.0);
    }

    #[inline(always)]
    unsafe fn steps(&mut self, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, ksteps: usize) {
        for g in 0..4 {
            // SAFETY: the engine is `Avx512` only where the CPU has AVX-512 BF16; the
            // caller guarantees the operands' bytes.
            unsafe { rows8(self.acc.as_mut_ptr().add(g * 8 * 32), a.add(g * 8 * a_stride), a_stride, b, b_stride, 16 * ksteps) }
        }
    }

    /// Eight rows at a time: a partial block (77 tokens: 32 + 32 + 13) computes 16 rows,
    /// not 32.
    unsafe fn steps_rows(&mut self, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, ksteps: usize, rows: usize) {
        for g in 0..rows.div_ceil(8).min(4) {
            // SAFETY: as in `steps`.
            unsafe { rows8(self.acc.as_mut_ptr().add(g * 8 * 32), a.add(g * 8 * a_stride), a_stride, b, b_stride, 16 * ksteps) }
        }
    }

    unsafe fn store(&mut self, c: *mut u8, stride: usize) {
        for r in 0..32 {
            // SAFETY: the caller guarantees 32 rows of 128 writable bytes at `c`.
            unsafe { std::ptr::copy_nonoverlapping(self.acc.as_ptr().add(r * 32), c.add(r * stride) as *mut f32, 32) }
        }
    }
}

/// Eight rows of sums: acc[8 × 32] += A[8 rows × 2·pairs] × B[pairs pair rows × 32].
/// Each A pair is broadcast and multiplied into both halves of the B row (16 columns per
/// register): 16 accumulators, two B registers, one broadcast.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows8(acc: *mut f32, a: *const u8, a_stride: usize, b: *const u8, b_stride: usize, pairs: usize) {
    use std::arch::x86_64::*;
    // SAFETY: `acc` holds 8 rows of 32 floats; A rows hold `pairs` u32 each and B rows 32.
    unsafe {
        let mut c = [_mm512_setzero_ps(); 16];
        for r in 0..8 {
            c[2 * r] = _mm512_loadu_ps(acc.add(r * 32));
            c[2 * r + 1] = _mm512_loadu_ps(acc.add(r * 32 + 16));
        }
        for p in 0..pairs {
            let row = b.add(p * b_stride);
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(row as *const _));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(row.add(64) as *const _));
            for r in 0..8 {
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32((a.add(r * a_stride + p * 4) as *const i32).read_unaligned()));
                c[2 * r] = _mm512_dpbf16_ps(c[2 * r], b0, x);
                c[2 * r + 1] = _mm512_dpbf16_ps(c[2 * r + 1], b1, x);
            }
        }
        for r in 0..8 {
            _mm512_storeu_ps(acc.add(r * 32), c[2 * r]);
            _mm512_storeu_ps(acc.add(r * 32 + 16), c[2 * r + 1]);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn rows8(_: *mut f32, _: *const u8, _: usize, _: *const u8, _: usize, _: usize) {
    unreachable!("the AVX-512 engine is never chosen off x86-64")
}

thread_local! {
    // Grown to the largest op and kept, so pages fault in once per thread.
    static LINEAR: RefCell<LinearScratch> = const { RefCell::new(LinearScratch { packed: Vec::new(), edge: Vec::new(), row: Vec::new() }) };
    static BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static ATTN: RefCell<AttnScratch> = const { RefCell::new(AttnScratch { head: None, keys: Vec::new(), values: Vec::new(), q: Vec::new(), scores: Vec::new(), probs: Vec::new(), out: Vec::new() }) };
}

/// One thread's product buffers: its band of packed weights, a zero-padded copy of a
/// partial last block of activation rows, and 16 pieces of quantized weight rows expanded
/// to f32.
struct LinearScratch {
    packed: Vec<u32>,
    edge: Vec<u16>,
    row: Vec<f32>,
}

/// One thread's attention buffers; `head` says whose keys and values are packed (reset at
/// the start of each op).
struct AttnScratch {
    head: Option<(usize, usize)>,
    keys: Vec<u32>,
    values: Vec<u32>,
    q: Vec<u16>,
    scores: Vec<f32>,
    probs: Vec<u16>,
    out: Vec<f32>,
}

/// Defines the ggml-callable op `$name` (with the given doc) running `$inner` on this
/// process's engine; the ops are built only where there is one.
macro_rules! engine_op {
    ($(#[$doc:meta])* $name:ident => $inner:ident) => {
        $(#[$doc])*
        pub(crate) unsafe extern "C" fn $name(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
            // SAFETY: forwarded as ggml called it.
            unsafe {
                match engine() {
                    Some(Engine::Tiles) => $inner::<Tiles>(dst, ith, nth, userdata),
                    _ => $inner::<Regs>(dst, ith, nth, userdata),
                }
            }
        }
    };
}

fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

engine_op!(
    /// `dst` [M, N, B2, B3] (or [N, M, ...] with `matmul::TRANSPOSED`) = src0 (bf16 or quantized weight [K, M])
    /// × src1 (bf16, contiguous [K, N, B2, B3]); each thread a band of M.
    linear_compute => linear
);

unsafe fn linear<K: Block>(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::mul_mat`: src0 a 2-D
    // weight with contiguous rows, K a multiple of 32, src1 a contiguous bf16 tensor.
    unsafe {
        let d = &*dst;
        let (w, x) = (&*d.src[0], &*d.src[1]);
        let transposed = userdata as usize & super::matmul::TRANSPOSED != 0;
        let (k, m) = (w.ne[0] as usize, w.ne[1] as usize);
        let batches = (x.ne[2] * x.ne[3]) as usize;
        // Batches stored back to back with their outputs likewise are one product.
        let merge = !transposed && d.nb[2] == d.nb[1] * d.ne[1] as usize && d.nb[3] == d.nb[2] * d.ne[2] as usize;
        let (n, batches) = if merge { (x.ne[1] as usize * batches, 1) } else { (x.ne[1] as usize, batches) };
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let band = m.div_ceil(nth).next_multiple_of(32);
        let (m0, m1) = ((ith * band).min(m), ((ith + 1) * band).min(m));
        if m0 >= m1 {
            return;
        }
        let mb = m1 - m0;
        let mp = mb.next_multiple_of(32);
        let pairs = k / 2;
        // Quantized weights are expanded while they are packed (bf16 ones are read as they
        // are); `takes` admits only types ggml can expand.
        let source = match w.type_ {
            ggml_sys::GGML_TYPE_BF16 => Source::Bf16,
            ggml_sys::GGML_TYPE_Q8_0 => Source::Q8_0,
            ty => match super::matmul::to_float(ty) {
                Some(f) => Source::Expand(f, ty),
                None => unreachable!("bf16::takes admitted a weight type ggml cannot expand"),
            },
        };
        let mut unit = K::begin();
        LINEAR.with(|sc| {
            BLOCK.with(|blk| {
                let mut sc = sc.borrow_mut();
                let LinearScratch { packed: p, edge: e, row: f } = &mut *sc;
                let mut blk = blk.borrow_mut();
                // Pack this band in blocks of 32 output columns, each block contiguous
                // (what one tile step reads is 128 consecutive bytes): pair row r of
                // block jb holds, for each column j, the bf16 pair (W[j][2r],
                // W[j][2r+1]) as one u32; padding columns are zero.
                let rows: Vec<*const u8> = (0..mb).map(|j| (w.data as *const u8).add((m0 + j) * w.nb[1])).collect();
                grow(e, 32 * k);
                grow(&mut blk, 32 * 32);
                let xrow = k * 2;
                // Column chunks packed just before use, so their packed weights stay in
                // L2 while every row block of X passes over them (packing the whole
                // band first wrote and re-read twice the weight's bytes through memory).
                let chunk = ((1 << 20) / (k * 2)).max(32).next_multiple_of(32).min(mp);
                grow(p, pairs * chunk);
                let mut c0 = 0;
                while c0 < mp {
                    let c1 = (c0 + chunk).min(mp);
                    pack(&rows[c0.min(mb)..c1.min(mb)], c1 - c0, k, source, f, &mut p[..pairs * (c1 - c0)]);
                    let packed = p.as_ptr() as *const u8;
                    for bi in 0..batches {
                        let (i2, i3) = (bi % x.ne[2] as usize, bi / x.ne[2] as usize);
                        let xb = (x.data as *const u8).add(i2 * x.nb[2] + i3 * x.nb[3]);
                        let db = (d.data as *mut u8).add(i2 * d.nb[2] + i3 * d.nb[3]);
                        let drow = d.nb[1];
                        let mut n0 = 0;
                        while n0 < n {
                            let rows = (n - n0).min(32);
                            // A partial last block reads from a zero-padded copy: past
                            // the last row of X lies memory that is not X's.
                            let a = if rows == 32 {
                                xb.add(n0 * xrow)
                            } else {
                                e[..32 * k].fill(0);
                                std::ptr::copy_nonoverlapping(xb.add(n0 * xrow), e.as_mut_ptr() as *mut u8, rows * xrow);
                                e.as_ptr() as *const u8
                            };
                            let mut j0 = c0;
                            while j0 < c1 {
                                unit.zero();
                                unit.steps_for(a, xrow, packed.add((j0 - c0) * pairs * 4), 128, k / 32, rows);
                                let cols = (mb - j0.min(mb)).min(32);
                                if !transposed && rows == 32 && cols == 32 {
                                    unit.store(db.add(n0 * drow + (m0 + j0) * 4), drow);
                                } else if cols > 0 {
                                    unit.store(blk.as_mut_ptr() as *mut u8, 128);
                                    for r in 0..rows {
                                        for cc in 0..cols {
                                            let v = blk[r * 32 + cc];
                                            let (nn, mm) = (n0 + r, m0 + j0 + cc);
                                            let at = if transposed { mm * drow + nn * 4 } else { nn * drow + mm * 4 };
                                            *(db.add(at) as *mut f32) = v;
                                        }
                                    }
                                }
                                j0 += 32;
                            }
                            n0 += 32;
                        }
                    }
                    c0 = c1;
                }
            })
        });
    }
}

/// Where [`pack`] reads weight rows from.
#[derive(Clone, Copy)]
enum Source {
    /// bf16 rows: already pairs.
    Bf16,
    /// Q8_0 rows (34-byte blocks: an f16 scale, 32 int8), expanded here.
    Q8_0,
    /// Rows of another type, expanded piece by piece with ggml's row converter.
    Expand(unsafe extern "C" fn(*const c_void, *mut f32, i64), ggml_sys::ggml_type),
}

/// Packs weight `rows` (each K long, of `source`'s type) into `packed` ([`linear`]'s
/// layout for `mp` ≥ rows.len() columns, the padding zero): 16 columns at a time, 16
/// pairs of each rounded to bf16 in registers, transposed, and stored as 16 contiguous
/// runs. `scratch` holds the f32 pieces of [`Source::Expand`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack(rows: &[*const u8], mp: usize, k: usize, source: Source, scratch: &mut Vec<f32>, packed: &mut [u32]) {
    use std::arch::x86_64::*;
    let pairs = k / 2;
    debug_assert!(mp % 32 == 0 && k % 32 == 0 && packed.len() >= pairs * mp && rows.len() <= mp);
    // Pieces of K expanded at once: whole blocks of every ggml type (K-quants: 256).
    let piece = if k % 256 == 0 { 256 } else { 32 };
    if let Source::Expand(..) = source {
        grow(scratch, 16 * piece);
    }
    // SAFETY: each row holds K elements of the source type; the stores stay inside
    // `packed` (checked above); `scratch` holds 16 pieces.
    unsafe {
        let zero = _mm512_setzero_si512();
        let out = packed.as_mut_ptr();
        for g in 0..mp / 16 {
            let j0 = g * 16;
            let base = out.add((j0 / 32) * pairs * 32 + j0 % 32);
            let live = rows.len().saturating_sub(j0).min(16);
            let mut c0 = 0;
            while c0 < k {
                if let Source::Expand(f, ty) = source {
                    let offset = ggml_sys::ggml_row_size(ty, c0 as i64);
                    for i in 0..live {
                        f(rows[j0 + i].add(offset) as *const c_void, scratch.as_mut_ptr().add(i * piece), piece as i64);
                    }
                }
                for e0 in (0..piece).step_by(32) {
                    let at = c0 + e0; // element; its pair is at / 2
                    let mut v = [zero; 16];
                    for (i, vi) in v.iter_mut().enumerate().take(live) {
                        *vi = match source {
                            Source::Bf16 => _mm512_loadu_si512(rows[j0 + i].add(at * 2) as *const _),
                            Source::Q8_0 => {
                                let block = rows[j0 + i].add(at / 32 * 34);
                                let d = _mm512_set1_ps(f16_to_f32((block as *const u16).read_unaligned()));
                                let q = _mm256_loadu_si256(block.add(2) as *const _);
                                let lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
                                let hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(q))), d);
                                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
                            }
                            Source::Expand(..) => {
                                let x = scratch.as_ptr().add(i * piece + e0);
                                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x.add(16)), _mm512_loadu_ps(x)))
                            }
                        };
                    }
                    transpose16(&mut v);
                    for (r, vr) in v.iter().enumerate() {
                        _mm512_storeu_si512(base.add((at / 2 + r) * 32) as *mut _, *vr);
                    }
                }
                c0 += piece;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack(_: &[*const u8], _: usize, _: usize, _: Source, _: &mut Vec<f32>, _: &mut [u32]) {
    unreachable!("the AVX-512 engine is never chosen off x86-64")
}

/// An IEEE half's value (ggml's Q8_0 scales).
fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// `v[i]` lane `j` ↔ `v[j]` lane `i`: a 16×16 transpose of 32-bit lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(v: &mut [std::arch::x86_64::__m512i; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for i in 0..4 {
        v[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for h in 0..2 {
        for i in 0..4 {
            t[8 * h + i] = _mm512_shuffle_i32x4::<0x88>(v[8 * h + i], v[8 * h + i + 4]);
            t[8 * h + i + 4] = _mm512_shuffle_i32x4::<0xdd>(v[8 * h + i], v[8 * h + i + 4]);
        }
    }
    for i in 0..8 {
        v[i] = _mm512_shuffle_i32x4::<0x88>(t[i], t[i + 8]);
        v[i + 8] = _mm512_shuffle_i32x4::<0xdd>(t[i], t[i + 8]);
    }
}

engine_op!(
    /// Stride-1 convolution. `dst` [OW, OH, C_out, N] = src0 (bf16 kernel [C, C_out', KW, KH],
    /// contiguous, C_out' ≥ C_out a multiple of 32) ⋆ src1 (bf16 padded input,
    /// pair-interleaved: [2, P, C/2, N] with P = Wp × Hp' pixels, Hp' ≥ Hp rows with zero rows
    /// below so that whole 32-column blocks stay inside). userdata: (KW, KH, Wp) packed as
    /// KW | KH << 16 | Wp << 32.
    conv_compute => conv
);

unsafe fn conv<K: Block>(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::conv_2d`, whose sources
    // are laid out as above with C a multiple of 32 and C_out padded to one.
    unsafe {
        let d = &*dst;
        let (kt, xt) = (&*d.src[0], &*d.src[1]);
        let u = userdata as usize;
        let (kw, kh, wp) = (u & 0xffff, (u >> 16) & 0xffff, u >> 32);
        // The kernel's C_out is padded to whole blocks (zero rows); `cout` is the real one.
        let (c, coutp, cout) = (kt.ne[0] as usize, kt.ne[1] as usize, d.ne[2] as usize);
        let plane = xt.ne[1] as usize; // P
        let (ow, oh, batches) = (d.ne[0] as usize, d.ne[1] as usize, d.ne[3] as usize);
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let wide = (oh - 1) * wp + ow;
        let blocks = wide.div_ceil(32);
        let share = blocks.div_ceil(nth);
        let (q0, q1) = ((ith * share).min(blocks), ((ith + 1) * share).min(blocks));
        if q0 >= q1 {
            return;
        }
        let mut unit = K::begin();
        BLOCK.with(|blk| {
            let mut blk = blk.borrow_mut();
            grow(&mut blk, 32 * 32);
            let kern = kt.data as *const u8;
            let arow = c * 2; // bytes between kernel rows (output channels)
            let brow = plane * 4; // bytes between pair rows of the input
            for b in 0..batches {
                let x = (xt.data as *const u8).add(b * xt.nb[3]);
                let out = (d.data as *mut u8).add(b * d.nb[3]) as *mut f32;
                for co0 in (0..coutp).step_by(32) {
                    for q in q0..q1 {
                        let j0 = q * 32;
                        unit.zero();
                        for dy in 0..kh {
                            for dx in 0..kw {
                                let a = kern.add(((dy * kw + dx) * coutp + co0) * arow);
                                let bptr = x.add((j0 + dy * wp + dx) * 4);
                                unit.steps(a, arow, bptr, brow, c / 32);
                            }
                        }
                        unit.store(blk.as_mut_ptr() as *mut u8, 128);
                        let end = (j0 + 32).min(wide);
                        for co in 0..32.min(cout - co0) {
                            super::matmul::keep_output_columns(blk.as_ptr().add(co * 32), j0, end, wp, ow, out.add((co0 + co) * ow * oh));
                        }
                    }
                }
            }
        });
    }
}

/// f32 → bf16, rounding to nearest even (NaN stays NaN).
#[inline(always)]
fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Whether the tile attention can take q [dh, H, Tq, B] with `tk` keys.
pub(crate) fn takes_attention(dh: i64, tk: i64) -> bool {
    dh <= 512 && tk <= 1 << 16 && available()
}

engine_op!(
    /// `dst` [dh, H, Tq, B] = softmax(scale · q kᵀ) v per head, from q [dh, H, Tq, B] and
    /// k, v [dh, H, Tk, B] (f32, unit stride in ne[0]); the scale is the userdata's low 32
    /// bits. Each thread takes blocks of 32 queries of one head; a head's keys and values
    /// are packed once per thread (Tk and dh padded with zeros to multiples of 32).
    attention_compute => attention
);

unsafe fn attention<K: Block>(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: ggml calls this with the tensor built by `Context::attention_cpu`, whose
    // sources are allocated f32 tensors of the shapes it checked; `dst` is contiguous.
    unsafe {
        let d = &*dst;
        let super::attention::Operands { q, k, v, scale, dh, heads, tq, batch, tk } = super::attention::operands(d, userdata);
        let (dp, kp) = (dh.next_multiple_of(32), tk.next_multiple_of(32));
        let blocks = tq.div_ceil(32);
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let tasks = heads * batch * blocks;
        // Contiguous task ranges: a thread meets each head once, so packs it once.
        let share = tasks.div_ceil(nth);
        let (t0, t1) = ((ith * share).min(tasks), ((ith + 1) * share).min(tasks));
        if t0 >= t1 {
            return;
        }
        let mut unit = K::begin();
        let row = |t: &ggml_sys::ggml_tensor, h: usize, i: usize, b: usize| (t.data as *const u8).add(h * t.nb[1] + i * t.nb[2] + b * t.nb[3]) as *const f32;
        ATTN.with(|sc| {
            let sc = &mut *sc.borrow_mut();
            sc.head = None;
            grow(&mut sc.keys, dp / 2 * kp);
            grow(&mut sc.values, kp / 2 * dp);
            grow(&mut sc.q, 32 * dp);
            grow(&mut sc.scores, 32 * kp);
            grow(&mut sc.probs, 32 * kp);
            grow(&mut sc.out, 32 * dp);
            for task in t0..t1 {
                let (hb, blk) = (task / blocks, task % blocks);
                let (h, b) = (hb % heads, hb / heads);
                if sc.head != Some((h, b)) {
                    // keys: pair row p, column j = (K[j][2p], K[j][2p+1]);
                    // values: pair row p, column c = (V[2p][c], V[2p+1][c]).
                    let at = |t: &ggml_sys::ggml_tensor, j: usize, i: usize| if j < tk && i < dh { *row(t, h, j, b).add(i) } else { 0.0 };
                    for p in 0..dp / 2 {
                        for j in 0..kp {
                            sc.keys[p * kp + j] = bf16(at(k, j, 2 * p)) as u32 | (bf16(at(k, j, 2 * p + 1)) as u32) << 16;
                        }
                    }
                    for p in 0..kp / 2 {
                        for c in 0..dp {
                            sc.values[p * dp + c] = bf16(at(v, 2 * p, c)) as u32 | (bf16(at(v, 2 * p + 1, c)) as u32) << 16;
                        }
                    }
                    sc.head = Some((h, b));
                }
                let r0 = blk * 32;
                let rows = 32.min(tq - r0);
                for r in 0..32 {
                    let dst_row = &mut sc.q[r * dp..(r + 1) * dp];
                    if r < rows {
                        ggml_sys::ggml_cpu_fp32_to_bf16(row(q, h, r0 + r, b), dst_row.as_mut_ptr() as *mut ggml_sys::ggml_bf16_t, dh as i64);
                        dst_row[dh..].fill(0);
                    } else {
                        dst_row.fill(0);
                    }
                }
                // scores (32 × Tk') = q block · kᵀ
                for j0 in (0..kp).step_by(32) {
                    unit.zero();
                    unit.steps_for(sc.q.as_ptr() as *const u8, dp * 2, (sc.keys.as_ptr() as *const u8).add(j0 * 4), kp * 4, dp / 32, rows);
                    unit.store((sc.scores.as_mut_ptr() as *mut u8).add(j0 * 4), kp * 4);
                }
                let mut inv = [0f32; 32];
                // The softmax in f32, vectorised (scale, max, exp and sum over the row as
                // in the f32 op), then the probabilities rounded to bf16 by whole rows.
                for r in 0..rows {
                    let s = &mut sc.scores[r * kp..r * kp + tk];
                    s.iter_mut().for_each(|x| *x *= scale);
                    inv[r] = 1.0 / super::attention::exp_row(s);
                    let p = &mut sc.probs[r * kp..(r + 1) * kp];
                    ggml_sys::ggml_cpu_fp32_to_bf16(s.as_ptr(), p.as_mut_ptr() as *mut ggml_sys::ggml_bf16_t, tk as i64);
                    p[tk..].fill(0);
                }
                for r in rows..32 {
                    sc.probs[r * kp..(r + 1) * kp].fill(0);
                }
                // out (32 × dh') = probabilities · v
                for c0 in (0..dp).step_by(32) {
                    unit.zero();
                    unit.steps_for(sc.probs.as_ptr() as *const u8, kp * 2, (sc.values.as_ptr() as *const u8).add(c0 * 4), dp * 4, kp / 32, rows);
                    unit.store((sc.out.as_mut_ptr() as *mut u8).add(c0 * 4), dp * 4);
                }
                for (r, iv) in inv.iter().enumerate().take(rows) {
                    let o = std::slice::from_raw_parts_mut((d.data as *mut u8).add(h * d.nb[1] + (r0 + r) * d.nb[2] + b * d.nb[3]) as *mut f32, dh);
                    for (x, &y) in o.iter_mut().zip(&sc.out[r * dp..r * dp + dh]) {
                        *x = y * iv;
                    }
                }
            }
        });
    }
}

/// Rows of f32 to bf16 (the activations of [`linear_compute`]): ggml's own copy converts
/// element by element, at ~2 ns each; this one converts whole rows with the CPU's bf16
/// conversion instructions. `dst` [K, N, B2, B3] bf16 from contiguous f32 `src`.
pub(crate) unsafe extern "C" fn to_bf16_compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, _userdata: *mut c_void) {
    // SAFETY: built by `Context::mul_mat` over a contiguous f32 tensor of dst's shape.
    unsafe {
        let d = &*dst;
        let s = &*d.src[0];
        let (k, rows) = (d.ne[0] as usize, (d.ne[1] * d.ne[2] * d.ne[3]) as usize);
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let share = rows.div_ceil(nth);
        let (r0, r1) = ((ith * share).min(rows), ((ith + 1) * share).min(rows));
        if r0 < r1 {
            let src = (s.data as *const f32).add(r0 * k);
            let out = (d.data as *mut ggml_sys::ggml_bf16_t).add(r0 * k);
            ggml_sys::ggml_cpu_fp32_to_bf16(src, out, ((r1 - r0) * k) as i64);
        }
    }
}

/// The input of [`conv_compute`]: f32 [W, H, C, N] (contiguous) → bf16 pairs of channel
/// planes, zero padded: `dst` [2, Wp·Hp', C/2, N] with Wp = W + 2·px and Hp' = H + 2·py +
/// extra. userdata: px | py << 16 | extra << 32. Threads take (pair, batch) planes.
pub(crate) unsafe extern "C" fn pack_conv_input_compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: built by `Context::conv_2d_bf16` with the shapes above.
    unsafe {
        let d = &*dst;
        let s = &*d.src[0];
        let u = userdata as usize;
        let (px, py, extra) = (u & 0xffff, (u >> 16) & 0xffff, u >> 32);
        let (w, h, c, n) = (s.ne[0] as usize, s.ne[1] as usize, s.ne[2] as usize, s.ne[3] as usize);
        let (wp, hp) = (w + 2 * px, h + 2 * py + extra);
        let planes = c / 2 * n;
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        let mut lo = vec![0u16; w];
        let mut hi = vec![0u16; w];
        for plane in (ith..planes).step_by(nth) {
            let (p, b) = (plane % (c / 2), plane / (c / 2));
            let out = (d.data as *mut u32).add(plane * wp * hp);
            let out = std::slice::from_raw_parts_mut(out, wp * hp);
            let src = |ch: usize, y: usize| (s.data as *const f32).add(((b * c + ch) * h + y) * w);
            for y in 0..hp {
                let row = &mut out[y * wp..(y + 1) * wp];
                if y < py || y >= py + h {
                    row.fill(0);
                    continue;
                }
                ggml_sys::ggml_cpu_fp32_to_bf16(src(2 * p, y - py), lo.as_mut_ptr() as *mut ggml_sys::ggml_bf16_t, w as i64);
                ggml_sys::ggml_cpu_fp32_to_bf16(src(2 * p + 1, y - py), hi.as_mut_ptr() as *mut ggml_sys::ggml_bf16_t, w as i64);
                row[..px].fill(0);
                row[px + w..].fill(0);
                for ((o, &a), &b) in row[px..px + w].iter_mut().zip(&lo).zip(&hi) {
                    *o = a as u32 | (b as u32) << 16;
                }
            }
        }
    }
}

/// The kernel of [`conv_compute`]: bf16 [KW, KH, C, C_out] → [C, C_out', KW, KH], so each
/// offset's C_out' × C matrix is contiguous; C_out' (`dst`'s) is C_out rounded up to whole
/// 32-row blocks, the extra rows zero. Threads take output channels.
pub(crate) unsafe extern "C" fn reorder_kernel_compute(dst: *mut ggml_sys::ggml_tensor, ith: c_int, nth: c_int, _userdata: *mut c_void) {
    // SAFETY: built by `Context::conv_2d_bf16` over a contiguous bf16 kernel.
    unsafe {
        let d = &*dst;
        let s = &*d.src[0];
        let (kw, kh, c, cout) = (s.ne[0] as usize, s.ne[1] as usize, s.ne[2] as usize, s.ne[3] as usize);
        let coutp = d.ne[1] as usize;
        let taps = kw * kh;
        let (ith, nth) = (ith as usize, nth.max(1) as usize);
        for co in (ith..coutp).step_by(nth) {
            for t in 0..taps {
                let out = std::slice::from_raw_parts_mut((d.data as *mut u16).add((t * coutp + co) * c), c);
                if co >= cout {
                    out.fill(0);
                    continue;
                }
                let src = std::slice::from_raw_parts((s.data as *const u16).add(co * c * taps), c * taps);
                for (ci, o) in out.iter_mut().enumerate() {
                    *o = src[ci * taps + t];
                }
            }
        }
    }
}
