//! Seeded normal generators that reproduce the noise other tools draw for the same seed.
//!
//! - [`CpuRng`]: torch's CPU generator (`torch.manual_seed(s); torch.randn(n)`), bit-exact
//!   with both of torch's float kernels for sizes >= 16 (see [`CpuKernel`]) and with its
//!   double-precision path below 16 elements.
//! - [`PhiloxRng`]: Philox4x32-10 with the counter/key layout torch's CUDA `randn` uses (as
//!   ported by A1111's `rng_philox.py` and sd.cpp's `rng_philox.hpp`): what sd.cpp calls `cuda`.
//! - [`StdDefaultRng`]: what sd.cpp's `std_default` gives when built with libstdc++:
//!   `std::default_random_engine` (minstd_rand0) and a fresh `std::normal_distribution<float>`
//!   per call (Marsaglia's polar method, the spare value dropped at the end of each call).

use std::str::FromStr;

use super::SamplingError;

/// A seeded source of standard-normal `f32` values.
///
/// Every call continues the same stream, so a sampler that draws per-step noise from the
/// generator that made the initial latent noise reproduces sd.cpp / ComfyUI bit for bit.
pub trait Rng {
    /// `n` standard-normal values, continuing the stream.
    fn randn(&mut self, n: usize) -> Vec<f32>;
    /// 64 random bits from the same stream, for seeding derived generators (Brownian trees).
    fn random_u64(&mut self) -> u64;
    /// The seeds of the Brownian trees a sampler draws its steps' noise from: one for the
    /// whole latent, or one per sample for a generator per sample ([`PerSampleRng`]).
    fn brownian_seeds(&mut self) -> Vec<u64> {
        vec![self.random_u64()]
    }
}

/// A boxed generator (what [`RngKind::seeded`] gives) is one too, so callers that pick the
/// kind at run time pass it where a generator is expected.
impl<R: Rng + ?Sized> Rng for Box<R> {
    fn randn(&mut self, n: usize) -> Vec<f32> {
        (**self).randn(n)
    }

    fn random_u64(&mut self) -> u64 {
        (**self).random_u64()
    }

    fn brownian_seeds(&mut self) -> Vec<u64> {
        (**self).brownian_seeds()
    }
}

/// A generator per sample of a batch, as A1111 draws a batch's noise (each image from its
/// own seed's generator): `randn(n)` takes `n / samples` values from each generator in
/// turn, so every sample's part of the batch is what its generator alone would give.
/// Samplers draw whole latents, so `n` is a multiple of the sample count.
pub struct PerSampleRng {
    gens: Vec<Box<dyn Rng + Send>>,
    /// The Brownian trees' seeds when the caller fixes them (ComfyUI seeds a tree with the
    /// noise seed itself); otherwise each generator draws its own.
    tree_seeds: Option<Vec<u64>>,
}

impl PerSampleRng {
    /// One generator per sample, in batch order; `tree_seeds`, when given, has one seed
    /// per generator.
    pub fn new(gens: Vec<Box<dyn Rng + Send>>, tree_seeds: Option<Vec<u64>>) -> Self {
        assert!(!gens.is_empty(), "a batch has at least one sample");
        assert!(tree_seeds.as_ref().is_none_or(|s| s.len() == gens.len()), "one tree seed per sample");
        PerSampleRng { gens, tree_seeds }
    }

    pub fn samples(&self) -> usize {
        self.gens.len()
    }
}

impl Rng for PerSampleRng {
    fn randn(&mut self, n: usize) -> Vec<f32> {
        let k = self.gens.len();
        // A length that does not split evenly (no sampler draws one) still gets n values:
        // the last generator's share is cut.
        let per = n.div_ceil(k);
        let mut out = Vec::with_capacity(per * k);
        for g in &mut self.gens {
            out.extend(g.randn(per));
        }
        out.truncate(n);
        out
    }

    /// The first generator's bits: a single derived generator for the whole batch.
    fn random_u64(&mut self) -> u64 {
        self.gens[0].random_u64()
    }

    fn brownian_seeds(&mut self) -> Vec<u64> {
        match &self.tree_seeds {
            Some(s) => s.clone(),
            None => self.gens.iter_mut().map(|g| g.random_u64()).collect(),
        }
    }
}

/// Which generator a seed goes through, by sd.cpp's `--rng` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RngKind {
    /// torch CPU (`mt19937`) with the kernel x86 torch runs (see [`CpuKernel`]).
    Cpu,
    /// torch CPU with its portable kernel: exactly what sd.cpp's `cpu` draws.
    CpuPortable,
    /// torch CUDA (Philox4x32-10), sd.cpp `cuda` (its default).
    Cuda,
    /// libstdc++ `std::default_random_engine`, sd.cpp `std_default`.
    StdDefault,
}

impl RngKind {
    pub const ALL: [RngKind; 4] = [
        RngKind::Cpu,
        RngKind::CpuPortable,
        RngKind::Cuda,
        RngKind::StdDefault,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RngKind::Cpu => "cpu",
            RngKind::CpuPortable => "cpu_portable",
            RngKind::Cuda => "cuda",
            RngKind::StdDefault => "std_default",
        }
    }

    /// A fresh generator of this kind.
    pub fn seeded(self, seed: u64) -> Box<dyn Rng + Send> {
        match self {
            RngKind::Cpu => Box::new(CpuRng::new(seed)),
            RngKind::CpuPortable => Box::new(CpuRng::sdcpp(seed)),
            RngKind::Cuda => Box::new(PhiloxRng::new(seed)),
            RngKind::StdDefault => Box::new(StdDefaultRng::new(seed)),
        }
    }
}

impl std::fmt::Display for RngKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RngKind {
    type Err = SamplingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "cpu" => Ok(RngKind::Cpu),
            "cpu_portable" | "sdcpp_cpu" => Ok(RngKind::CpuPortable),
            // ComfyUI calls the same choice "gpu" (its noise device option).
            "cuda" | "gpu" | "philox" => Ok(RngKind::Cuda),
            "std_default" | "std" => Ok(RngKind::StdDefault),
            _ => Err(SamplingError::UnknownName {
                what: "rng",
                name: s.to_string(),
                valid: RngKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// torch CPU: mt19937 + torch's normal kernels

const MT_N: usize = 624;
const MT_M: usize = 397;

/// Which of torch's CPU normal kernels (used for 16 or more values) to reproduce. They draw
/// the same uniforms and differ only in the float log / sin / cos, so results differ in the
/// last bits of about half the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CpuKernel {
    /// `normal_fill_AVX2` (cephes polynomials from `avx_mathfun.h`): what torch runs on every
    /// x86 machine with AVX2 or AVX-512, so what ComfyUI's CPU noise is on such machines.
    #[default]
    Vectorized,
    /// The portable `normal_fill` with libm's `logf` / `cosf` / `sinf`
    /// (`ATEN_CPU_CAPABILITY=default`, non-x86 torch). sd.cpp's `cpu` RNG reproduces this one.
    Portable,
}

/// torch's CPU generator (`at::CPUGeneratorImpl`), drawing the way `torch.randn` does.
#[derive(Clone)]
pub struct CpuRng {
    kernel: CpuKernel,
    state: Box<[u32; MT_N]>,
    left: usize,
    next: usize,
    /// torch keeps the second Box–Muller value of its double path in the generator, so it
    /// survives across calls (and is not touched by the >= 16 float path).
    next_double_normal: Option<f64>,
}

impl std::fmt::Debug for CpuRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuRng")
            .field("left", &self.left)
            .field("next", &self.next)
            .finish()
    }
}

impl CpuRng {
    /// `torch.manual_seed(seed)` with the kernel x86 torch uses; mt19937 takes the low 32 bits.
    pub fn new(seed: u64) -> Self {
        Self::with_kernel(seed, CpuKernel::default())
    }

    /// sd.cpp's `cpu` RNG: torch's portable kernel.
    pub fn sdcpp(seed: u64) -> Self {
        Self::with_kernel(seed, CpuKernel::Portable)
    }

    pub fn with_kernel(seed: u64, kernel: CpuKernel) -> Self {
        let mut state = Box::new([0u32; MT_N]);
        state[0] = (seed & 0xffff_ffff) as u32;
        for j in 1..MT_N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        CpuRng {
            kernel,
            state,
            left: 1,
            next: 0,
            next_double_normal: None,
        }
    }

    fn twist(u: u32, v: u32) -> u32 {
        let mixed = (u & 0x8000_0000) | (v & 0x7fff_ffff);
        (mixed >> 1) ^ if v & 1 != 0 { 0x9908_b0df } else { 0 }
    }

    fn next_state(&mut self) {
        let s = &mut self.state;
        self.left = MT_N;
        self.next = 0;
        for j in 0..MT_N - MT_M {
            s[j] = s[j + MT_M] ^ Self::twist(s[j], s[j + 1]);
        }
        for j in MT_N - MT_M..MT_N - 1 {
            s[j] = s[j + MT_M - MT_N] ^ Self::twist(s[j], s[j + 1]);
        }
        s[MT_N - 1] = s[MT_M - 1] ^ Self::twist(s[MT_N - 1], s[0]);
    }

    /// One raw mt19937 output.
    pub fn next_u32(&mut self) -> u32 {
        self.left -= 1;
        if self.left == 0 {
            self.next_state();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    fn next_u64_torch(&mut self) -> u64 {
        let hi = self.next_u32() as u64;
        let lo = self.next_u32() as u64;
        (hi << 32) | lo
    }

    /// `at::uniform_real_distribution<float>(0, 1)`: 24 random bits.
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() & ((1 << 24) - 1)) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// `at::uniform_real_distribution<double>(0, 1)`: 53 random bits.
    fn uniform_f64(&mut self) -> f64 {
        (self.next_u64_torch() & ((1u64 << 53) - 1)) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `at::normal_distribution<double>` (torch's path for fewer than 16 elements).
    fn normal_f64(&mut self) -> f64 {
        if let Some(v) = self.next_double_normal.take() {
            return v;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u1;
        self.next_double_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// torch's `normal_fill_16`: eight Box–Muller pairs over uniforms laid out as
    /// `[u1 x 8 | u2 x 8]`.
    fn normal_fill_16(data: &mut [f32]) {
        for j in 0..8 {
            let u1 = 1.0f32 - data[j];
            let u2 = data[j + 8];
            let radius = (-2.0f32 * u1.ln()).sqrt();
            // torch multiplies by `c10::pi<double>`, so theta is rounded from a double.
            let theta = (2.0f32 as f64 * std::f64::consts::PI * u2 as f64) as f32;
            data[j] = radius * theta.cos();
            data[j + 8] = radius * theta.sin();
        }
    }

    /// torch's `normal_fill_16_AVX2`, lane by lane.
    fn normal_fill_16_vectorized(data: &mut [f32]) {
        let two_pi = (2.0 * std::f64::consts::PI) as f32;
        for j in 0..8 {
            let u1 = 1.0f32 - data[j];
            let u2 = data[j + 8];
            let radius = (-2.0f32 * cephes_logf(u1)).sqrt();
            let (sin, cos) = cephes_sincosf(two_pi * u2);
            data[j] = radius * cos;
            data[j + 8] = radius * sin;
        }
    }

    fn fill_16(&self, data: &mut [f32]) {
        match self.kernel {
            CpuKernel::Portable => Self::normal_fill_16(data),
            CpuKernel::Vectorized => Self::normal_fill_16_vectorized(data),
        }
    }
}

/// `log256_ps` from `avx_mathfun.h` (Pommier's cephes-based logf), one lane. Inputs here
/// lie in (0, 1].
///
/// torch's wheels are built with FMA contraction, so the multiply-adds below are fused
/// where GCC fuses them; which ones was settled against 160k values of real torch output
/// (the choices that are not forced by the data follow the same contract-everything rule).
// The literals are avx_mathfun's, digit for digit, so they round exactly as C rounds them.
#[allow(clippy::excessive_precision)]
fn cephes_logf(x: f32) -> f32 {
    // C converts these double literals to float, so do we (decimal -> f64 -> f32).
    const P: [f64; 9] = [
        7.0376836292E-2,
        -1.1514610310E-1,
        1.1676998740E-1,
        -1.2420140846E-1,
        1.4249322787E-1,
        -1.6668057665E-1,
        2.0000714765E-1,
        -2.4999993993E-1,
        3.3333331174E-1,
    ];
    let invalid = x <= 0.0;
    let x = x.max(f32::from_bits(0x0080_0000));
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 0x7f) as f32 + 1.0;
    let mut m = f32::from_bits((bits & !0x7f80_0000) | 0.5f32.to_bits());
    let small = m < std::f64::consts::FRAC_1_SQRT_2 as f32;
    let tmp = if small { m } else { 0.0 };
    m -= 1.0;
    if small {
        e -= 1.0;
    }
    m += tmp;
    let z = m * m;
    let mut y = P[0] as f32;
    for &p in &P[1..] {
        y = y.mul_add(m, p as f32);
    }
    y = (y * m).mul_add(z, e * (-2.12194440e-4f64 as f32));
    y = (-z).mul_add(0.5, y);
    let r = e.mul_add(0.693359375f64 as f32, m + y);
    if invalid {
        f32::NAN
    } else {
        r
    }
}

/// `sincos256_ps` from `avx_mathfun.h` (cephes sinf/cosf with octant reduction), one lane.
#[allow(clippy::excessive_precision)]
fn cephes_sincosf(x: f32) -> (f32, f32) {
    let sign_sin = x.to_bits() & 0x8000_0000;
    let mut x = x.abs();
    let mut j = (x * (1.27323954473516f64 as f32)) as i32;
    j = (j + 1) & !1;
    let y = j as f32;
    let swap_sin = ((j & 4) as u32) << 29;
    let poly = (j & 2) == 0;
    x = y.mul_add(-0.78515625f64 as f32, x);
    x = y.mul_add(-2.4187564849853515625e-4f64 as f32, x);
    x = y.mul_add(-3.77489497744594108e-8f64 as f32, x);
    let sign_cos = ((!(j - 2) & 4) as u32) << 29;
    let sign_sin = sign_sin ^ swap_sin;
    let z = x * x;
    let mut c = 2.443315711809948E-005f64 as f32;
    c = c.mul_add(z, -1.388731625493765E-003f64 as f32);
    c = c.mul_add(z, 4.166664568298827E-002f64 as f32);
    c = (c * z).mul_add(z, -(z * 0.5));
    c += 1.0;
    let mut s = -1.9515295891E-4f64 as f32;
    s = s.mul_add(z, 8.3321608736E-3f64 as f32);
    s = s.mul_add(z, -1.6666654611E-1f64 as f32);
    s = (s * z).mul_add(x, x);
    let (sv, cv) = if poly { (s, c) } else { (c, s) };
    (
        f32::from_bits(sv.to_bits() ^ sign_sin),
        f32::from_bits(cv.to_bits() ^ sign_cos),
    )
}

impl Rng for CpuRng {
    fn randn(&mut self, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        if n >= 16 {
            for v in out.iter_mut() {
                *v = self.uniform_f32();
            }
            let mut i = 0;
            while i + 16 <= n {
                self.fill_16(&mut out[i..i + 16]);
                i += 16;
            }
            if !n.is_multiple_of(16) {
                // torch redraws the last 16 values (overlapping the previous block).
                let tail = &mut out[n - 16..];
                for v in tail.iter_mut() {
                    *v = self.uniform_f32();
                }
                self.fill_16(tail);
            }
        } else {
            for v in out.iter_mut() {
                *v = self.normal_f64() as f32;
            }
        }
        out
    }

    fn random_u64(&mut self) -> u64 {
        self.next_u64_torch()
    }
}

// ---------------------------------------------------------------------------------------------
// torch CUDA: Philox4x32-10

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// The Philox4x32 block function with 10 rounds (Salmon et al., Random123).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = c[0] as u64 * PHILOX_M0 as u64;
        let p1 = c[2] as u64 * PHILOX_M1 as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// torch CUDA's `randn` as reproduced on the CPU: element `i` of call number `offset` is
/// Box–Muller over the first two words of `philox(counter = [offset, 0, i, 0], key = seed)`.
#[derive(Debug, Clone)]
pub struct PhiloxRng {
    seed: u64,
    offset: u32,
}

impl PhiloxRng {
    pub fn new(seed: u64) -> Self {
        PhiloxRng { seed, offset: 0 }
    }

    fn key(&self) -> [u32; 2] {
        [self.seed as u32, (self.seed >> 32) as u32]
    }

    pub(crate) fn box_muller(x: u32, y: u32) -> f32 {
        const TWO_POW32_INV: f32 = 2.328_306_4e-10;
        // The product is taken in f32 as A1111 and sd.cpp do.
        let two_pow32_inv_2pi: f32 = TWO_POW32_INV * 6.283_185_5;
        let u = x as f32 * TWO_POW32_INV + TWO_POW32_INV / 2.0;
        let v = y as f32 * two_pow32_inv_2pi + two_pow32_inv_2pi / 2.0;
        let s = (-2.0f32 * u.ln()).sqrt();
        s * v.sin()
    }
}

impl Rng for PhiloxRng {
    fn randn(&mut self, n: usize) -> Vec<f32> {
        let key = self.key();
        let offset = self.offset;
        self.offset = self.offset.wrapping_add(1);
        (0..n)
            .map(|i| {
                let g = philox4x32_10([offset, 0, i as u32, 0], key);
                Self::box_muller(g[0], g[1])
            })
            .collect()
    }

    fn random_u64(&mut self) -> u64 {
        // A counter row no randn call uses (word 3 set), so seeding never shifts the noise.
        let g = philox4x32_10([self.offset, 0, 0, 1], self.key());
        self.offset = self.offset.wrapping_add(1);
        ((g[0] as u64) << 32) | g[1] as u64
    }
}

// ---------------------------------------------------------------------------------------------
// libstdc++ std::default_random_engine + std::normal_distribution<float>

const MINSTD_M: u64 = 2_147_483_647;

/// sd.cpp's `std_default` RNG as libstdc++ builds it.
#[derive(Debug, Clone)]
pub struct StdDefaultRng {
    state: u64,
}

impl StdDefaultRng {
    /// `generator.seed((unsigned int)seed)`: minstd_rand0 keeps `seed mod (2^31 - 1)`,
    /// with 0 replaced by 1.
    pub fn new(seed: u64) -> Self {
        let s = (seed as u32) as u64 % MINSTD_M;
        StdDefaultRng {
            state: if s == 0 { 1 } else { s },
        }
    }

    fn next_raw(&mut self) -> u32 {
        self.state = self.state * 16807 % MINSTD_M;
        self.state as u32
    }

    /// `std::generate_canonical<float, 24>`: one draw (range 2^31 - 2 covers 24 bits), and
    /// libstdc++ clamps a result that rounds up to 1.
    fn canonical_f32(&mut self) -> f32 {
        let sum = (self.next_raw() - 1) as f32;
        // `tmp *= r` in float: 2147483646 rounds to 2^31.
        let r = 2_147_483_646f32;
        let v = sum / r;
        if v >= 1.0 {
            // nextafter(1.0f, 0.0f)
            f32::from_bits(0x3f7f_ffff)
        } else {
            v
        }
    }
}

impl Rng for StdDefaultRng {
    fn randn(&mut self, n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n);
        // sd.cpp builds a new distribution per call, so a spare value never crosses calls.
        let mut saved: Option<f32> = None;
        while out.len() < n {
            if let Some(v) = saved.take() {
                out.push(v);
                continue;
            }
            let (x, y, r2) = loop {
                // `result_type(2.0) * u - 1.0` subtracts in double, then stores as float.
                let x = ((2.0f32 * self.canonical_f32()) as f64 - 1.0) as f32;
                let y = ((2.0f32 * self.canonical_f32()) as f64 - 1.0) as f32;
                let r2 = x * x + y * y;
                if r2 <= 1.0 && r2 != 0.0 {
                    break (x, y, r2);
                }
            };
            let mult = (-2.0f32 * r2.ln() / r2).sqrt();
            saved = Some(x * mult);
            out.push(y * mult);
        }
        out
    }

    fn random_u64(&mut self) -> u64 {
        let a = self.next_raw() as u64;
        let b = self.next_raw() as u64;
        let c = self.next_raw() as u64;
        (a << 33) ^ (b << 2) ^ c
    }
}
