//! The SD discrete (eps / v) model schedule and the sigma schedulers built on it.
//!
//! Every scheduler returns `steps + 1` sigmas ending in 0, except `beta`, which (like ComfyUI
//! and sd.cpp) drops repeated timesteps and so may return fewer, and ComfyUI's
//! `ddim_uniform`, whose integer stride can give one or two more. Float handling follows the
//! reference each scheduler comes from: ComfyUI / k-diffusion (torch float32 tensors with
//! f64 Python scalars) for the shared ones, sd.cpp for `smoothstep`, `lcm` and `bong_tangent`.

use std::str::FromStr;

use super::gits_table::GITS_1_20;
use super::SamplingError;

/// Training timesteps of the SD family.
pub const TIMESTEPS: usize = 1000;

/// Longest schedule we build: far beyond any real use, small enough to never exhaust memory.
pub const MAX_STEPS: usize = 10_000;

/// ComfyUI's `make_beta_schedule` kinds. ComfyUI's names differ from diffusers': its
/// `linear` is diffusers' `scaled_linear` (SD's), its `sqrt_linear` diffusers' `linear`
/// (what AnimateDiff trained with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BetaSchedule {
    Linear,
    SqrtLinear,
    Sqrt,
    Cosine,
    SquaredCosCapV2,
}

/// The discrete sigma table of an SD-style (CompVis) model and the `t <-> sigma` maps over it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscreteSchedule {
    sigmas: Vec<f32>,
    log_sigmas: Vec<f32>,
}

impl DiscreteSchedule {
    /// SD 1.x / 2.x / SDXL: `scaled_linear` betas from 0.00085 to 0.012 over 1000 steps.
    pub fn sd() -> Self {
        Self::scaled_linear(0.00085, 0.012, TIMESTEPS).expect("the SD constants are valid")
    }

    /// ComfyUI's `ModelSamplingDiscrete` for `linear` (= diffusers `scaled_linear`) betas:
    /// betas and their cumulative product in f64, then `alphas_cumprod` as f32 and the sigma
    /// math in f32, as torch does.
    pub fn scaled_linear(
        beta_start: f64,
        beta_end: f64,
        timesteps: usize,
    ) -> Result<Self, SamplingError> {
        Self::beta_schedule(BetaSchedule::Linear, beta_start, beta_end, timesteps)
    }

    /// ComfyUI's `ModelSamplingDiscrete` over `make_beta_schedule(kind, timesteps,
    /// beta_start, beta_end)`: the betas' cumulative product in f64 (f32 for
    /// `squaredcos_cap_v2`, whose betas torch keeps in f32), `alphas_cumprod` as f32.
    pub fn beta_schedule(kind: BetaSchedule, beta_start: f64, beta_end: f64, timesteps: usize) -> Result<Self, SamplingError> {
        if !(2..=100_000).contains(&timesteps) {
            return Err(SamplingError::InvalidOption {
                field: "timesteps",
                reason: format!("{timesteps} is outside 2..=100000"),
            });
        }
        if !(beta_start > 0.0 && beta_end > 0.0 && beta_start < 1.0 && beta_end < 1.0) {
            return Err(SamplingError::InvalidOption {
                field: "betas",
                reason: format!(
                    "beta_start {beta_start} and beta_end {beta_end} must lie in (0, 1)"
                ),
            });
        }
        let n = timesteps;
        let lin = |a: f64, b: f64, i: usize| torch_linspace_f64(a, b, n, i);
        let alphas_cumprod: Vec<f32> = match kind {
            BetaSchedule::SquaredCosCapV2 => {
                let bar = |t: f64| ((t + 0.008) / 1.008 * std::f64::consts::FRAC_PI_2).cos().powi(2);
                let mut cumprod = 1.0f32;
                (0..n)
                    .map(|i| {
                        let beta = (1.0 - bar((i + 1) as f64 / n as f64) / bar(i as f64 / n as f64)).min(0.999) as f32;
                        cumprod *= 1.0 - beta;
                        cumprod
                    })
                    .collect()
            }
            _ => {
                let cos_alpha = |i: usize| {
                    const S: f64 = 8e-3;
                    let t = i as f64 / n as f64 + S;
                    (t / (1.0 + S) * std::f64::consts::FRAC_PI_2).cos().powi(2)
                };
                let mut cumprod = 1.0f64;
                (0..n)
                    .map(|i| {
                        let beta = match kind {
                            BetaSchedule::Linear => lin(beta_start.sqrt(), beta_end.sqrt(), i).powi(2),
                            BetaSchedule::SqrtLinear => lin(beta_start, beta_end, i),
                            BetaSchedule::Sqrt => lin(beta_start, beta_end, i).sqrt(),
                            // alphas / alphas[0] cancels in the ratio.
                            BetaSchedule::Cosine => (1.0 - cos_alpha(i + 1) / cos_alpha(i)).clamp(0.0, 0.999),
                            BetaSchedule::SquaredCosCapV2 => unreachable!("handled above"),
                        };
                        cumprod *= 1.0 - beta;
                        cumprod as f32
                    })
                    .collect()
            }
        };
        Self::from_alphas_cumprod(&alphas_cumprod)
    }

    /// ComfyUI's `ModelSamplingContinuousEDM` table: 1000 sigmas spaced evenly in
    /// log-sigma from `sigma_min` to `sigma_max` (CosXL: 0.002 to 120), so the
    /// schedulers that walk the table walk log-sigma linearly.
    pub fn edm(sigma_min: f32, sigma_max: f32) -> Result<Self, SamplingError> {
        if !(sigma_min > 0.0 && sigma_max > sigma_min && sigma_max.is_finite()) {
            return Err(SamplingError::InvalidOption { field: "sigma range", reason: format!("sigma_min {sigma_min} and sigma_max {sigma_max} must satisfy 0 < min < max") });
        }
        let (lo, hi) = ((sigma_min as f64).ln(), (sigma_max as f64).ln());
        let log_sigmas: Vec<f32> = (0..TIMESTEPS).map(|i| torch_linspace_f64(lo, hi, TIMESTEPS, i) as f32).collect();
        let sigmas = log_sigmas.iter().map(|l| l.exp()).collect();
        Ok(DiscreteSchedule { sigmas, log_sigmas })
    }

    /// A table of increasing σ (a flow model's, [`super::flow::FlowShift::schedule`]).
    pub fn from_sigmas(sigmas: Vec<f32>) -> Result<Self, SamplingError> {
        if sigmas.len() < 2 || sigmas.iter().any(|s| !(s.is_finite() && *s > 0.0)) || sigmas.windows(2).any(|w| w[1] < w[0]) {
            return Err(SamplingError::InvalidOption { field: "sigmas", reason: format!("a table of {} sigmas must be positive, finite and increasing", sigmas.len()) });
        }
        let log_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        Ok(DiscreteSchedule { sigmas, log_sigmas })
    }

    /// ComfyUI's `rescale_zero_terminal_snr_sigmas` (Lin et al., "Common Diffusion Noise
    /// Schedules and Sample Steps Are Flawed"): √ᾱ shifted so the last timestep is pure
    /// noise (ᾱ pinned to 4.897e-8, σ ≈ 4519) and scaled so the first keeps its value.
    /// For models trained so: `ztsnr` checkpoints, ModelSamplingDiscrete's `zsnr`. In f64,
    /// as ComfyUI computes it.
    pub fn zero_terminal_snr(&self) -> Self {
        let sqrt_abar: Vec<f64> = self.sigmas.iter().map(|&s| (1.0 / (s as f64 * s as f64 + 1.0)).sqrt()).collect();
        let n = sqrt_abar.len();
        let (first, last) = (sqrt_abar[0], sqrt_abar[n - 1]);
        let scale = first / (first - last);
        let sigmas: Vec<f32> = sqrt_abar
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let shifted = (a - last) * scale;
                let abar = if i + 1 == n { 4.897_345_189_085_343_5e-8 } else { shifted * shifted };
                ((1.0 - abar) / abar).sqrt() as f32
            })
            .collect();
        let log_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        DiscreteSchedule { sigmas, log_sigmas }
    }

    /// From a model's own `alphas_cumprod` (as stored in some checkpoints).
    pub fn from_alphas_cumprod(alphas_cumprod: &[f32]) -> Result<Self, SamplingError> {
        if alphas_cumprod.len() < 2 {
            return Err(SamplingError::InvalidOption {
                field: "alphas_cumprod",
                reason: format!("needs at least 2 entries, got {}", alphas_cumprod.len()),
            });
        }
        let mut sigmas = Vec::with_capacity(alphas_cumprod.len());
        for (i, &a) in alphas_cumprod.iter().enumerate() {
            if !(a > 0.0 && a < 1.0) {
                return Err(SamplingError::InvalidOption {
                    field: "alphas_cumprod",
                    reason: format!("entry {i} is {a}, outside (0, 1)"),
                });
            }
            sigmas.push(((1.0 - a) / a).sqrt());
        }
        if sigmas.windows(2).any(|w| w[1] < w[0]) {
            return Err(SamplingError::InvalidOption {
                field: "alphas_cumprod",
                reason: "must decrease with the timestep".into(),
            });
        }
        let log_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        Ok(DiscreteSchedule { sigmas, log_sigmas })
    }

    pub fn len(&self) -> usize {
        self.sigmas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sigmas.is_empty()
    }

    /// The sigma of each training timestep, ascending.
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    pub fn sigma_min(&self) -> f32 {
        self.sigmas[0]
    }

    pub fn sigma_max(&self) -> f32 {
        self.sigmas[self.sigmas.len() - 1]
    }

    /// k-diffusion's `DiscreteSchedule.t_to_sigma`: log-sigma interpolation between the two
    /// neighbouring timesteps (`t` clamped into the table, as ComfyUI does).
    pub fn t_to_sigma(&self, t: f32) -> f32 {
        let t = t.clamp(0.0, (self.len() - 1) as f32);
        let low = t.floor() as usize;
        let high = t.ceil() as usize;
        let w = t - low as f32;
        ((1.0 - w) * self.log_sigmas[low] + w * self.log_sigmas[high]).exp()
    }

    /// k-diffusion's `DiscreteSchedule.sigma_to_t` (unquantized): the fractional timestep
    /// whose interpolated log-sigma is `log(sigma)`, clamped to the table.
    pub fn sigma_to_t(&self, sigma: f32) -> f32 {
        let log_sigma = sigma.ln();
        let n = self.len();
        let count = self
            .log_sigmas
            .iter()
            .filter(|&&ls| log_sigma - ls >= 0.0)
            .count();
        let low = count.saturating_sub(1).min(n - 2);
        let high = low + 1;
        let (lo, hi) = (self.log_sigmas[low], self.log_sigmas[high]);
        let w = ((lo - log_sigma) / (lo - hi)).clamp(0.0, 1.0);
        (1.0 - w) * low as f32 + w * high as f32
    }

    /// ComfyUI's `ModelSamplingDiscrete.timestep`: the nearest training timestep.
    pub fn nearest_timestep(&self, sigma: f32) -> usize {
        let log_sigma = sigma.ln();
        let mut best = 0;
        let mut best_d = f32::INFINITY;
        for (i, ls) in self.log_sigmas.iter().enumerate() {
            let d = (log_sigma - ls).abs();
            if d < best_d {
                best = i;
                best_d = d;
            }
        }
        best
    }
}

/// `torch.linspace(start, end, n)[i]` for float32 tensors: torch fills the first half from
/// `start` and the second half back from `end`.
pub(crate) fn torch_linspace_f32(start: f32, end: f32, n: usize, i: usize) -> f32 {
    if n == 1 {
        return start;
    }
    let step = (end - start) / (n - 1) as f32;
    if i < n / 2 {
        start + step * i as f32
    } else {
        end - step * (n - 1 - i) as f32
    }
}

fn torch_linspace_f64(start: f64, end: f64, n: usize, i: usize) -> f64 {
    if n == 1 {
        return start;
    }
    let step = (end - start) / (n - 1) as f64;
    if i < n / 2 {
        start + step * i as f64
    } else {
        end - step * (n - 1 - i) as f64
    }
}

/// `numpy.linspace(start, stop, n)[i]`.
fn np_linspace(start: f64, stop: f64, n: usize, i: usize) -> f64 {
    if n == 1 {
        return start;
    }
    if i == n - 1 {
        return stop;
    }
    let step = (stop - start) / (n - 1) as f64;
    start + i as f64 * step
}

/// `numpy.interp` over ascending `xs`.
fn np_interp(x: f64, xs: &[f64], ys: &[f64]) -> f64 {
    if x <= xs[0] {
        return ys[0];
    }
    let last = xs.len() - 1;
    if x >= xs[last] {
        return ys[last];
    }
    let j = xs.partition_point(|&v| v <= x) - 1;
    let slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]);
    slope * (x - xs[j]) + ys[j]
}

/// ComfyUI's `loglinear_interp` (AYS / GITS): stretch a decreasing sigma list to `n` values
/// by linear interpolation of log-sigma.
fn loglinear_interp(levels: &[f64], n: usize) -> Vec<f64> {
    let m = levels.len();
    let xs: Vec<f64> = (0..m).map(|i| np_linspace(0.0, 1.0, m, i)).collect();
    let ys: Vec<f64> = levels.iter().rev().map(|v| v.ln()).collect();
    let mut out: Vec<f64> = (0..n)
        .map(|i| np_interp(np_linspace(0.0, 1.0, n, i), &xs, &ys).exp())
        .collect();
    out.reverse();
    out
}

/// Which reference noise levels the Align-Your-Steps scheduler stretches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AysModel {
    #[default]
    Sd1,
    Sdxl,
    Svd,
}

impl AysModel {
    fn levels(self) -> &'static [f64; 11] {
        match self {
            AysModel::Sd1 => &[
                14.6146412293,
                6.4745760956,
                3.8636745985,
                2.6946151520,
                1.8841921177,
                1.3943805092,
                0.9642583904,
                0.6523686016,
                0.3977456272,
                0.1515232662,
                0.0291671582,
            ],
            AysModel::Sdxl => &[
                14.6146412293,
                6.3184485287,
                3.7681790315,
                2.1811480769,
                1.3405244945,
                0.8620721141,
                0.5550693289,
                0.3798540708,
                0.2332364134,
                0.1114188177,
                0.0291671582,
            ],
            AysModel::Svd => &[
                700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002,
            ],
        }
    }
}

impl FromStr for AysModel {
    type Err = SamplingError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sd1" | "sd15" | "sd1.5" | "sd2" => Ok(AysModel::Sd1),
            "sdxl" => Ok(AysModel::Sdxl),
            "svd" => Ok(AysModel::Svd),
            _ => Err(SamplingError::UnknownName {
                what: "ays model type",
                name: s.to_string(),
                valid: "SD1, SDXL, SVD".into(),
            }),
        }
    }
}

/// Knobs of the schedulers that have them; the defaults are sd.cpp's and ComfyUI's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScheduleOpts {
    /// Karras `rho`.
    pub rho: f32,
    /// Reference levels for `ays`.
    pub ays_model: AysModel,
    /// `alpha` and `beta` of the `beta` scheduler's Beta distribution.
    pub beta_alpha: f64,
    pub beta_beta: f64,
    /// `linear_quadratic`: the fraction of the noise the linear part removes
    /// (ComfyUI's `threshold_noise`).
    pub lq_threshold_noise: f64,
    /// `linear_quadratic`: steps in the linear part; `None` is half the steps (ComfyUI's
    /// `linear_steps`).
    pub lq_linear_steps: Option<usize>,
}

impl Default for ScheduleOpts {
    fn default() -> Self {
        ScheduleOpts {
            rho: 7.0,
            ays_model: AysModel::Sd1,
            beta_alpha: 0.6,
            beta_beta: 0.6,
            lq_threshold_noise: 0.025,
            lq_linear_steps: None,
        }
    }
}

/// A sigma scheduler, by sd.cpp name (ComfyUI names accepted by [`FromStr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheduler {
    /// Uniform in timestep from 999 to 0 (ComfyUI `normal`).
    Discrete,
    Karras,
    Exponential,
    /// Align Your Steps.
    Ays,
    /// GITS at coefficient 1.20.
    Gits,
    SgmUniform,
    Simple,
    Smoothstep,
    KlOptimal,
    Lcm,
    BongTangent,
    Beta,
    /// ComfyUI's `ddim_uniform`.
    DdimUniform,
    /// ComfyUI's `linear_quadratic` (Movie Gen's schedule): linear in the first steps, then
    /// quadratic, scaled to the model's sigma_max.
    LinearQuadratic,
}

impl Scheduler {
    pub const ALL: [Scheduler; 14] = [
        Scheduler::Discrete,
        Scheduler::Karras,
        Scheduler::Exponential,
        Scheduler::Ays,
        Scheduler::Gits,
        Scheduler::SgmUniform,
        Scheduler::Simple,
        Scheduler::Smoothstep,
        Scheduler::KlOptimal,
        Scheduler::Lcm,
        Scheduler::BongTangent,
        Scheduler::Beta,
        Scheduler::DdimUniform,
        Scheduler::LinearQuadratic,
    ];

    /// The sd.cpp name (ComfyUI's for `ddim_uniform` and `linear_quadratic`).
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Discrete => "discrete",
            Scheduler::Karras => "karras",
            Scheduler::Exponential => "exponential",
            Scheduler::Ays => "ays",
            Scheduler::Gits => "gits",
            Scheduler::SgmUniform => "sgm_uniform",
            Scheduler::Simple => "simple",
            Scheduler::Smoothstep => "smoothstep",
            Scheduler::KlOptimal => "kl_optimal",
            Scheduler::Lcm => "lcm",
            Scheduler::BongTangent => "bong_tangent",
            Scheduler::Beta => "beta",
            Scheduler::DdimUniform => "ddim_uniform",
            Scheduler::LinearQuadratic => "linear_quadratic",
        }
    }

    /// `steps + 1` sigmas ending in 0 (not always for `beta` and `ddim_uniform`, see the
    /// module docs).
    pub fn sigmas(
        self,
        steps: usize,
        model: &DiscreteSchedule,
        opts: &ScheduleOpts,
    ) -> Result<Vec<f32>, SamplingError> {
        if steps == 0 || steps > MAX_STEPS {
            return Err(SamplingError::InvalidOption {
                field: "steps",
                reason: format!("{steps} is outside 1..={MAX_STEPS}"),
            });
        }
        let n = steps;
        let t_max = (model.len() - 1) as f32;
        let (smin, smax) = (model.sigma_min(), model.sigma_max());
        let mut out: Vec<f32> = match self {
            Scheduler::Discrete => {
                // ComfyUI `normal_scheduler`: linspace(timestep(sigma_max), timestep(sigma_min)).
                let start = model.nearest_timestep(smax) as f32;
                let end = model.nearest_timestep(smin) as f32;
                (0..n)
                    .map(|i| model.t_to_sigma(torch_linspace_f32(start, end, n, i)))
                    .collect()
            }
            Scheduler::SgmUniform => {
                let start = model.nearest_timestep(smax) as f32;
                let end = model.nearest_timestep(smin) as f32;
                (0..n)
                    .map(|i| model.t_to_sigma(torch_linspace_f32(start, end, n + 1, i)))
                    .collect()
            }
            Scheduler::Karras => {
                if !(opts.rho > 0.0 && opts.rho.is_finite()) {
                    return Err(SamplingError::InvalidOption {
                        field: "rho",
                        reason: format!("{} must be a positive number", opts.rho),
                    });
                }
                karras_levels(n, smin, smax, opts.rho)
            }
            Scheduler::Exponential => exponential_levels(n, smin, smax),
            Scheduler::Ays => {
                let levels = opts.ays_model.levels();
                let v: Vec<f64> = if n + 1 != levels.len() {
                    loglinear_interp(levels, n + 1)
                } else {
                    levels.to_vec()
                };
                v[..n].iter().map(|&s| s as f32).collect()
            }
            Scheduler::Gits => {
                let v: Vec<f64> = if (2..=20).contains(&n) {
                    GITS_1_20[n - 2].to_vec()
                } else {
                    // ComfyUI stretches the longest row; for one step that gives [sigma_max, 0].
                    loglinear_interp(GITS_1_20[GITS_1_20.len() - 1], n + 1)
                };
                v[..n].iter().map(|&s| s as f32).collect()
            }
            Scheduler::Simple => {
                let len = model.len();
                let ss = len as f64 / n as f64;
                (0..n)
                    .map(|x| model.sigmas()[len - 1 - (x as f64 * ss) as usize])
                    .collect()
            }
            Scheduler::DdimUniform => return Ok(ddim_uniform(model, n)),
            Scheduler::LinearQuadratic => return linear_quadratic(n, smax, opts),
            Scheduler::Smoothstep => {
                if n == 1 {
                    vec![model.t_to_sigma(t_max)]
                } else {
                    (0..n)
                        .map(|i| {
                            let u = 1.0f32 - i as f32 / n as f32;
                            let s = u * u * (3.0 - 2.0 * u);
                            model.t_to_sigma((s * t_max).round())
                        })
                        .collect()
                }
            }
            Scheduler::KlOptimal => {
                if n == 1 {
                    vec![smax]
                } else {
                    let (amin, amax) = ((smin as f64).atan() as f32, (smax as f64).atan() as f32);
                    (0..n)
                        .map(|i| {
                            let t = i as f32 / (n - 1) as f32;
                            (t * amin + (1.0 - t) * amax).tan()
                        })
                        .collect()
                }
            }
            Scheduler::Lcm => {
                // sd.cpp: the 50-step LCM training grid, so the timesteps match LCM models.
                let original_steps = 50usize;
                let k = model.len() / original_steps;
                (0..n)
                    .map(|i| {
                        let index = i * original_steps / n;
                        let t = (original_steps - index) * k - 1;
                        model.t_to_sigma(t as f32)
                    })
                    .collect()
            }
            Scheduler::BongTangent => bong_tangent(n, smin, smax),
            Scheduler::Beta => {
                if !(opts.beta_alpha > 0.0 && opts.beta_beta > 0.0) {
                    return Err(SamplingError::InvalidOption {
                        field: "beta alpha/beta",
                        reason: format!(
                            "{} and {} must be positive",
                            opts.beta_alpha, opts.beta_beta
                        ),
                    });
                }
                let total = (model.len() - 1) as f64;
                let mut v = Vec::with_capacity(n);
                let mut last: Option<usize> = None;
                for i in 0..n {
                    let p = 1.0 - np_linspace(0.0, 1.0, n + 1, i);
                    let t =
                        (beta_ppf(p, opts.beta_alpha, opts.beta_beta) * total).round_ties_even();
                    let t = t.clamp(0.0, total) as usize;
                    if last != Some(t) {
                        v.push(model.sigmas()[t]);
                    }
                    last = Some(t);
                }
                v
            }
        };
        out.push(0.0);
        Ok(out)
    }
}

fn ddim_uniform(model: &DiscreteSchedule, steps: usize) -> Vec<f32> {
    let s = model.sigmas();
    let mut steps = steps;
    let mut x = 1usize;
    let mut sigs: Vec<f32> = Vec::new();
    if (s[x] as f64).abs() <= 0.00001 {
        steps += 1;
    } else {
        sigs.push(0.0);
    }
    let ss = (s.len() / steps).max(1);
    while x < s.len() {
        sigs.push(s[x]);
        x += ss;
    }
    sigs.reverse();
    sigs
}

/// ComfyUI's `linear_quadratic_schedule`: noise fractions built in f64 (Python floats), then
/// a float32 tensor times the model's sigma_max. Already ends in 0.
fn linear_quadratic(steps: usize, sigma_max: f32, opts: &ScheduleOpts) -> Result<Vec<f32>, SamplingError> {
    if steps == 1 {
        // ComfyUI returns [1, 0] here without its `1 - x` flip, so one step is sigma_max, 0.
        return Ok(vec![sigma_max, 0.0]);
    }
    let threshold = opts.lq_threshold_noise;
    if !(threshold > 0.0 && threshold < 1.0) {
        return Err(SamplingError::InvalidOption { field: "lq_threshold_noise", reason: format!("{threshold} is outside (0, 1)") });
    }
    let linear_steps = opts.lq_linear_steps.unwrap_or(steps / 2);
    if !(1..steps).contains(&linear_steps) {
        return Err(SamplingError::InvalidOption { field: "lq_linear_steps", reason: format!("{linear_steps} is outside 1..{steps}") });
    }
    let (ls, n) = (linear_steps as f64, steps as f64);
    let step_diff = ls - threshold * n;
    let quadratic_steps = n - ls;
    let quadratic_coef = step_diff / (ls * quadratic_steps * quadratic_steps);
    let linear_coef = threshold / ls - 2.0 * step_diff / (quadratic_steps * quadratic_steps);
    let constant = quadratic_coef * ls * ls;
    let fractions = (0..linear_steps)
        .map(|i| i as f64 * threshold / ls)
        .chain((linear_steps..steps).map(|i| {
            let i = i as f64;
            quadratic_coef * (i * i) + linear_coef * i + constant
        }))
        .chain(std::iter::once(1.0));
    Ok(fractions.map(|x| (1.0 - x) as f32 * sigma_max).collect())
}

/// sd.cpp's `bong_tangent` (two arctan ramps meeting at the middle sigma).
fn bong_tangent(n: usize, sigma_min: f32, sigma_max: f32) -> Vec<f32> {
    use std::f32::consts::PI;
    fn ramp(steps: i64, slope: f32, pivot: f32, start: f32, end: f32) -> Vec<f32> {
        if steps <= 0 {
            return Vec::new();
        }
        let f = |x: f32| ((2.0 / PI) * (-slope * (x - pivot)).atan() + 1.0) * 0.5;
        let smax = f(0.0);
        let smin = f((steps - 1) as f32);
        let srange = smax - smin;
        let sscale = start - end;
        if srange.abs() < 1e-8 {
            if steps == 1 {
                return vec![start];
            }
            return (0..steps)
                .map(|i| start + (end - start) * (i as f32 / (steps - 1) as f32))
                .collect();
        }
        let inv = 1.0 / srange;
        (0..steps)
            .map(|x| ((f(x as f32) - smin) * inv) * sscale + end)
            .collect()
    }
    let (start, end) = (sigma_max, sigma_min);
    let middle = sigma_min + (sigma_max - sigma_min) * 0.5;
    let (pivot_1, pivot_2, slope_1, slope_2) = (0.6f32, 0.6f32, 0.2f32, 0.2f32);
    let steps = n as i64 + 2;
    let midpoint = ((steps as f32 * pivot_1 + steps as f32 * pivot_2) * 0.5) as i64;
    let pivot_1_i = (steps as f32 * pivot_1) as i64;
    let pivot_2_i = (steps as f32 * pivot_2) as i64;
    let slope_scale = steps as f32 / 40.0;
    let stage_2_len = steps - midpoint;
    let stage_1_len = steps - stage_2_len;
    let mut s1 = ramp(
        stage_1_len,
        slope_1 / slope_scale,
        pivot_1_i as f32,
        start,
        middle,
    );
    let s2 = ramp(
        stage_2_len,
        slope_2 / slope_scale,
        (pivot_2_i - stage_1_len) as f32,
        middle,
        end,
    );
    s1.pop();
    s1.extend(s2);
    s1.resize(n + 1, end);
    // The caller appends the final 0 in place of the last ramp value.
    s1.truncate(n);
    s1
}

/// Lanczos approximation (g = 7, n = 9) of ln Γ(x) for x > 0.
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Continued fraction of the incomplete beta function (modified Lentz).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const FPMIN: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < FPMIN {
        d = FPMIN;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < FPMIN {
            d = FPMIN;
        }
        c = 1.0 + aa / c;
        if c.abs() < FPMIN {
            c = FPMIN;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < FPMIN {
            d = FPMIN;
        }
        c = 1.0 + aa / c;
        if c.abs() < FPMIN {
            c = FPMIN;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() <= 1e-15 {
            break;
        }
    }
    h
}

/// The regularized incomplete beta function I_x(a, b).
fn beta_reg(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let bt = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (-x).ln_1p()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        bt * beta_cf(a, b, x) / a
    } else {
        1.0 - bt * beta_cf(b, a, 1.0 - x) / b
    }
}

/// Inverse CDF of Beta(a, b) (scipy's `beta.ppf`), by bisection to f64 resolution.
fn beta_ppf(p: f64, a: f64, b: f64) -> f64 {
    if p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if beta_reg(a, b, mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

impl std::fmt::Display for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheduler {
    type Err = SamplingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let found = match lower.as_str() {
            "discrete" | "normal" | "default" => Scheduler::Discrete,
            "karras" => Scheduler::Karras,
            "exponential" => Scheduler::Exponential,
            "ays" | "align_your_steps" => Scheduler::Ays,
            "gits" => Scheduler::Gits,
            "sgm_uniform" => Scheduler::SgmUniform,
            "simple" => Scheduler::Simple,
            "smoothstep" => Scheduler::Smoothstep,
            "kl_optimal" => Scheduler::KlOptimal,
            "lcm" => Scheduler::Lcm,
            "bong_tangent" => Scheduler::BongTangent,
            "beta" => Scheduler::Beta,
            "ddim_uniform" => Scheduler::DdimUniform,
            "linear_quadratic" => Scheduler::LinearQuadratic,
            _ => {
                return Err(SamplingError::UnknownName {
                    what: "scheduler",
                    name: s.to_string(),
                    valid: Scheduler::ALL
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        };
        Ok(found)
    }
}

/// ComfyUI's `denoise`: build the schedule for `floor(steps / denoise)` steps and keep its
/// last `steps + 1` sigmas. `denoise <= 0` gives no sigmas (nothing to sample); above 0.9999
/// it is the plain schedule.
/// The `n` Karras levels from `smax` down to `smin` (no trailing 0), k-diffusion's
/// `get_sigmas_karras` without the final zero; `rho` must be positive.
fn karras_levels(n: usize, smin: f32, smax: f32, rho: f32) -> Vec<f32> {
    let r = rho as f64;
    let min_inv_rho = (smin as f64).powf(1.0 / r) as f32;
    let max_inv_rho = (smax as f64).powf(1.0 / r) as f32;
    (0..n)
        .map(|i| {
            let ramp = torch_linspace_f32(0.0, 1.0, n, i);
            (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)).powf(rho)
        })
        .collect()
}

/// The `n` levels evenly spaced in log sigma from `smax` to `smin` (no trailing 0).
fn exponential_levels(n: usize, smin: f32, smax: f32) -> Vec<f32> {
    let (a, b) = ((smax as f64).ln() as f32, (smin as f64).ln() as f32);
    (0..n).map(|i| torch_linspace_f32(a, b, n, i).exp()).collect()
}

fn check_range(steps: usize, smin: f32, smax: f32) -> Result<(), SamplingError> {
    if steps == 0 || steps > MAX_STEPS {
        return Err(SamplingError::InvalidOption { field: "steps", reason: format!("{steps} is outside 1..={MAX_STEPS}") });
    }
    if !(smin > 0.0 && smin.is_finite() && smax.is_finite() && smax > smin) {
        return Err(SamplingError::InvalidOption { field: "sigma_min/sigma_max", reason: format!("need 0 < {smin} < {smax}") });
    }
    Ok(())
}

/// k-diffusion's `get_sigmas_karras` over an explicit range (ComfyUI's KarrasScheduler):
/// `steps` levels then 0.
pub fn karras_sigmas(steps: usize, sigma_min: f32, sigma_max: f32, rho: f32) -> Result<Vec<f32>, SamplingError> {
    check_range(steps, sigma_min, sigma_max)?;
    if !(rho > 0.0 && rho.is_finite()) {
        return Err(SamplingError::InvalidOption { field: "rho", reason: format!("{rho} must be a positive number") });
    }
    let mut v = karras_levels(steps, sigma_min, sigma_max, rho);
    v.push(0.0);
    Ok(v)
}

/// k-diffusion's `get_sigmas_exponential` over an explicit range (ComfyUI's
/// ExponentialScheduler): `steps` levels then 0.
pub fn exponential_sigmas(steps: usize, sigma_min: f32, sigma_max: f32) -> Result<Vec<f32>, SamplingError> {
    check_range(steps, sigma_min, sigma_max)?;
    let mut v = exponential_levels(steps, sigma_min, sigma_max);
    v.push(0.0);
    Ok(v)
}

pub fn apply_denoise(
    scheduler: Scheduler,
    steps: usize,
    denoise: f32,
    model: &DiscreteSchedule,
    opts: &ScheduleOpts,
) -> Result<Vec<f32>, SamplingError> {
    ksampler_sigmas(scheduler, steps, denoise, model, opts, false)
}

/// ComfyUI's KSampler schedule: [`apply_denoise`], built for one more step with the
/// next-to-last sigma dropped when `discard_penultimate` (see
/// [`super::comfy_discards_penultimate_sigma`]).
pub fn ksampler_sigmas(
    scheduler: Scheduler,
    steps: usize,
    denoise: f32,
    model: &DiscreteSchedule,
    opts: &ScheduleOpts,
    discard_penultimate: bool,
) -> Result<Vec<f32>, SamplingError> {
    let sigmas = |n: usize| -> Result<Vec<f32>, SamplingError> {
        if !discard_penultimate {
            return scheduler.sigmas(n, model, opts);
        }
        let mut s = scheduler.sigmas(n + 1, model, opts)?;
        if s.len() >= 2 {
            s.remove(s.len() - 2);
        }
        Ok(s)
    };
    if !denoise.is_finite() {
        return Err(SamplingError::InvalidOption {
            field: "denoise",
            reason: format!("{denoise} is not finite"),
        });
    }
    if denoise > 0.9999 {
        return sigmas(steps);
    }
    if denoise <= 0.0 {
        return Ok(Vec::new());
    }
    let total = (steps as f64 / denoise as f64) as usize;
    if total > MAX_STEPS {
        return Err(SamplingError::InvalidOption {
            field: "denoise",
            reason: format!(
                "{steps} steps at denoise {denoise} need {total} schedule steps (max {MAX_STEPS})"
            ),
        });
    }
    let all = sigmas(total)?;
    let keep = (steps + 1).min(all.len());
    Ok(all[all.len() - keep..].to_vec())
}

/// sd.cpp's img2img `strength`: of a `steps`-step schedule, run the last
/// `t_enc = floor(steps * strength)` steps (at most `steps - 1`), starting one sigma earlier
/// so the first step lands on the schedule. The result has `t_enc + 2` sigmas.
pub fn strength_sigmas(sigmas: &[f32], strength: f32) -> Result<Vec<f32>, SamplingError> {
    if sigmas.len() < 2 {
        return Err(SamplingError::InvalidSigmas(format!(
            "need at least 2 sigmas, got {}",
            sigmas.len()
        )));
    }
    if !(0.0..=1.0).contains(&strength) {
        return Err(SamplingError::InvalidOption {
            field: "strength",
            reason: format!("{strength} is outside 0..=1"),
        });
    }
    let steps = sigmas.len() - 1;
    let mut t_enc = (steps as f32 * strength) as usize;
    if t_enc == steps {
        t_enc -= 1;
    }
    Ok(sigmas[steps - t_enc - 1..].to_vec())
}

/// Checks a custom sigma list: at least two finite, non-negative values.
pub fn validate_sigmas(sigmas: &[f32]) -> Result<(), SamplingError> {
    if sigmas.len() < 2 {
        return Err(SamplingError::InvalidSigmas(format!(
            "need at least 2 sigmas, got {}",
            sigmas.len()
        )));
    }
    if let Some((i, s)) = sigmas
        .iter()
        .enumerate()
        .find(|(_, s)| !(s.is_finite() && **s >= 0.0))
    {
        return Err(SamplingError::InvalidSigmas(format!(
            "sigma {i} is {s}; sigmas must be finite and >= 0"
        )));
    }
    Ok(())
}

/// Parses a custom sigma list as sd.cpp's `--sigmas` takes it: numbers separated by commas
/// and/or whitespace, optionally in `[...]`. A trailing 0 is not added; the list is checked
/// with [`validate_sigmas`].
pub fn parse_sigmas(text: &str) -> Result<Vec<f32>, SamplingError> {
    let inner = text.trim().trim_start_matches('[').trim_end_matches(']');
    let mut out = Vec::new();
    for (i, tok) in inner
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .enumerate()
    {
        let v: f32 = tok.parse().map_err(|_| {
            SamplingError::InvalidSigmas(format!("entry {i} ({tok:?}) is not a number"))
        })?;
        out.push(v);
        if out.len() > MAX_STEPS + 1 {
            return Err(SamplingError::InvalidSigmas(format!(
                "more than {} sigmas",
                MAX_STEPS + 1
            )));
        }
    }
    validate_sigmas(&out)?;
    Ok(out)
}
