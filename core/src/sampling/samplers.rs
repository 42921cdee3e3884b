//! ComfyUI's and sd.cpp's samplers over a caller-supplied denoiser, in k-diffusion's
//! formulation (`x = x0 + sigma * eps`, or `(1 - sigma) x0 + sigma * eps` for flow models; the
//! denoiser returns its estimate of `x0`).
//!
//! References, per sampler:
//! - k-diffusion 0.1.1 `sampling.py`: euler, euler_a, heun, dpm2, dpm++2s_a, dpm++2m,
//!   dpm++2m_sde and k_lms (A1111's LMS, which keeps the multistep step to sigma 0);
//! - ComfyUI `comfy/k_diffusion/sampling.py`: lms, heunpp2, dpm_2_ancestral, dpm_fast,
//!   dpm_adaptive, dpmpp_2s_ancestral_cfg_pp, dpmpp_sde, dpmpp_2m_cfg_pp, dpmpp_2m_sde(_heun),
//!   dpmpp_3m_sde, ddpm, lcm, ipndm, ipndm_v, deis (with `deis.py`), res_multistep and its
//!   ancestral / CFG++ forms, gradient_estimation(_cfg_pp), er_sde, seeds_2, seeds_3,
//!   sa_solver(_pece) (with `sa_solver.py`), euler_cfg_pp, euler_a_cfg_pp, and the
//!   rectified-flow branches of euler_a, dpm_2_ancestral and dpm++2s_a; ComfyUI
//!   `comfy/extra_samplers/uni_pc.py`: uni_pc and uni_pc_bh2. The fixtures were made from
//!   ComfyUI a125cd84 (2025-10-12);
//! - sd.cpp `denoiser.hpp`: dpm++2mv2, ddim_trailing, tcd, res_2s, res_multistep's flow form
//!   at eta > 0 and er_sde's eta (ComfyUI's er_sde is eta 1). Where sd.cpp departs from
//!   k-diffusion (its dpm++2s_a evaluates the second stage at `sigma_next` instead of the
//!   midpoint), we follow k-diffusion.
//!
//! All per-step noise comes from one seeded generator, the one that drew the initial noise,
//! or from a [`BrownianTreeNoise`] seeded from it. ComfyUI's SDE samplers (dpmpp_sde,
//! dpmpp_2m_sde, dpmpp_2m_sde_heun, dpmpp_3m_sde) use the tree by default, as ComfyUI does;
//! its `_gpu` names are the same samplers (ComfyUI only moves the tree to the GPU).

use std::str::FromStr;

mod comfy;
mod multistep;

use super::brownian::BrownianTreeNoise;
use super::rng::Rng;
use super::schedule::{validate_sigmas, Scheduler};
use super::SamplingError;

/// What the denoiser returns for one call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Denoised {
    /// The guided estimate of the clean latent.
    pub denoised: Vec<f32>,
    /// The unconditional estimate, which the CFG++ samplers step along. Needed only by
    /// samplers whose [`Sampler::needs_uncond`] is true.
    pub uncond: Option<Vec<f32>>,
}

impl From<Vec<f32>> for Denoised {
    fn from(denoised: Vec<f32>) -> Self {
        Denoised {
            denoised,
            uncond: None,
        }
    }
}

/// Sampler options beyond the sigmas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOpts {
    /// Ancestral / SDE noise amount; `None` takes [`Sampler::default_eta`].
    pub eta: Option<f32>,
    /// Scale on every noise draw (k-diffusion's `s_noise`).
    pub s_noise: f32,
    /// Seed of the Brownian tree, when one is used; `None` draws it from the generator.
    /// (ComfyUI seeds its tree with the noise seed itself.)
    pub brownian_seed: Option<u64>,
    /// Draw per-step noise from a Brownian tree instead of the generator's stream, for any
    /// sampler (the default of the samplers whose [`Sampler::uses_brownian_tree`] is true).
    pub brownian: bool,
    /// Draw per-step noise from the generator's stream even for the samplers that default to
    /// a Brownian tree (ComfyUI's SDE samplers handed a plain `noise_sampler`). `brownian`
    /// wins when both are set.
    pub stream_noise: bool,
    /// Order of `lms`.
    pub lms_order: usize,
    /// `gamma` of `euler_ge` / `gradient_estimation(_cfg_pp)`.
    pub ge_gamma: f32,
    /// The denoiser is a rectified-flow model (SD3, Flux: `x = (1 - sigma) x0 + sigma noise`,
    /// sigmas in [0, 1]). Switches the samplers that ComfyUI or sd.cpp give a flow form
    /// (their half-log-SNR is `ln((1 - sigma) / sigma)` and their renoising keeps the
    /// `(1 - sigma)` scale) to it; the others run unchanged, as in ComfyUI.
    pub flow: bool,
    /// Flow only: where a first sigma of 1 (infinite log-SNR) is moved for the samplers that
    /// need a finite one, ComfyUI's `percent_to_sigma(1e-4)` for the model's shift; `None` is
    /// `1 - 1e-4` (shift 1, and sd.cpp's choice).
    pub flow_first_sigma: Option<f32>,
    /// SA-Solver's stochastic interval `(start, end)` in sigma (noise is added while
    /// `start >= sigma >= end`), ComfyUI's `percent_to_sigma(0.2)` and `(0.8)` for the model;
    /// `None` takes them from the SD discrete schedule, or from an unshifted flow model.
    pub sa_tau_interval: Option<(f32, f32)>,
}

impl Default for SampleOpts {
    fn default() -> Self {
        SampleOpts {
            eta: None,
            s_noise: 1.0,
            brownian_seed: None,
            brownian: false,
            stream_noise: false,
            lms_order: 4,
            ge_gamma: 2.0,
            flow: false,
            flow_first_sigma: None,
            sa_tau_interval: None,
        }
    }
}

/// One finished step, for progress reporting and previews.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// 1-based.
    pub step: usize,
    /// The steps of the run; for dpm_adaptive, whose count is not known in advance, the
    /// steps so far.
    pub total: usize,
    pub sigma: f32,
    pub x: &'a [f32],
    pub denoised: &'a [f32],
}

#[derive(Debug, thiserror::Error)]
pub enum SampleError<E> {
    #[error("denoiser failed at step {step} (sigma {sigma}): {error}")]
    Model { step: usize, sigma: f32, error: E },
    #[error("the denoiser returned {got} values at step {step} for a latent of {expected}")]
    DenoisedLength {
        step: usize,
        expected: usize,
        got: usize,
    },
    #[error("sampler {sampler} needs the unconditional prediction, but the denoiser returned none at step {step}")]
    MissingUncond { sampler: &'static str, step: usize },
    #[error(transparent)]
    Invalid(#[from] SamplingError),
}

/// A sampler, by sd.cpp name where sd.cpp has it, else by ComfyUI's (ComfyUI's and A1111's
/// names are accepted by [`FromStr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sampler {
    Euler,
    EulerA,
    Heun,
    Dpm2,
    Dpmpp2sA,
    Dpmpp2m,
    Dpmpp2mV2,
    Ipndm,
    IpndmV,
    Lcm,
    DdimTrailing,
    Tcd,
    ResMultistep,
    Res2s,
    ErSde,
    EulerCfgPp,
    EulerACfgPp,
    EulerGe,
    Dpmpp2mSde,
    Dpmpp2mSdeBt,
    Lms,
    /// k-diffusion 0.1.1's (and so A1111's) LMS: ComfyUI's `lms` returns the denoised
    /// estimate at a last sigma of 0, this one takes the multistep step there too.
    KLms,
    /// sd.cpp's iPNDM: its multistep step also for the last step to sigma 0 (ComfyUI's
    /// `ipndm` returns the denoised estimate there), so sd-cli's `ipndm` images match.
    IpndmSdcpp,
    /// sd.cpp's iPNDM-v, whose variable-step coefficients differ from ComfyUI's.
    IpndmVSdcpp,
    Heunpp2,
    Dpm2A,
    DpmFast,
    DpmAdaptive,
    Dpmpp2sACfgPp,
    DpmppSde,
    Dpmpp2mCfgPp,
    Dpmpp2mSdeHeun,
    Dpmpp3mSde,
    Ddpm,
    Deis,
    ResMultistepCfgPp,
    ResMultistepA,
    ResMultistepACfgPp,
    EulerGeCfgPp,
    Seeds2,
    Seeds3,
    SaSolver,
    SaSolverPece,
    UniPc,
    UniPcBh2,
}

impl Sampler {
    pub const ALL: [Sampler; 45] = [
        Sampler::Euler,
        Sampler::EulerA,
        Sampler::Heun,
        Sampler::Dpm2,
        Sampler::Dpmpp2sA,
        Sampler::Dpmpp2m,
        Sampler::Dpmpp2mV2,
        Sampler::Ipndm,
        Sampler::IpndmV,
        Sampler::Lcm,
        Sampler::DdimTrailing,
        Sampler::Tcd,
        Sampler::ResMultistep,
        Sampler::Res2s,
        Sampler::ErSde,
        Sampler::EulerCfgPp,
        Sampler::EulerACfgPp,
        Sampler::EulerGe,
        Sampler::Dpmpp2mSde,
        Sampler::Dpmpp2mSdeBt,
        Sampler::Lms,
        Sampler::KLms,
        Sampler::IpndmSdcpp,
        Sampler::IpndmVSdcpp,
        Sampler::Heunpp2,
        Sampler::Dpm2A,
        Sampler::DpmFast,
        Sampler::DpmAdaptive,
        Sampler::Dpmpp2sACfgPp,
        Sampler::DpmppSde,
        Sampler::Dpmpp2mCfgPp,
        Sampler::Dpmpp2mSdeHeun,
        Sampler::Dpmpp3mSde,
        Sampler::Ddpm,
        Sampler::Deis,
        Sampler::ResMultistepCfgPp,
        Sampler::ResMultistepA,
        Sampler::ResMultistepACfgPp,
        Sampler::EulerGeCfgPp,
        Sampler::Seeds2,
        Sampler::Seeds3,
        Sampler::SaSolver,
        Sampler::SaSolverPece,
        Sampler::UniPc,
        Sampler::UniPcBh2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Sampler::Euler => "euler",
            Sampler::EulerA => "euler_a",
            Sampler::Heun => "heun",
            Sampler::Dpm2 => "dpm2",
            Sampler::Dpmpp2sA => "dpm++2s_a",
            Sampler::Dpmpp2m => "dpm++2m",
            Sampler::Dpmpp2mV2 => "dpm++2mv2",
            Sampler::Ipndm => "ipndm",
            Sampler::IpndmV => "ipndm_v",
            Sampler::Lcm => "lcm",
            Sampler::DdimTrailing => "ddim_trailing",
            Sampler::Tcd => "tcd",
            Sampler::ResMultistep => "res_multistep",
            Sampler::Res2s => "res_2s",
            Sampler::ErSde => "er_sde",
            Sampler::EulerCfgPp => "euler_cfg_pp",
            Sampler::EulerACfgPp => "euler_a_cfg_pp",
            Sampler::EulerGe => "euler_ge",
            Sampler::Dpmpp2mSde => "dpm++2m_sde",
            Sampler::Dpmpp2mSdeBt => "dpm++2m_sde_bt",
            Sampler::Lms => "lms",
            Sampler::KLms => "k_lms",
            Sampler::IpndmSdcpp => "ipndm_sdcpp",
            Sampler::IpndmVSdcpp => "ipndm_v_sdcpp",
            Sampler::Heunpp2 => "heunpp2",
            Sampler::Dpm2A => "dpm_2_ancestral",
            Sampler::DpmFast => "dpm_fast",
            Sampler::DpmAdaptive => "dpm_adaptive",
            Sampler::Dpmpp2sACfgPp => "dpmpp_2s_ancestral_cfg_pp",
            Sampler::DpmppSde => "dpmpp_sde",
            Sampler::Dpmpp2mCfgPp => "dpmpp_2m_cfg_pp",
            Sampler::Dpmpp2mSdeHeun => "dpmpp_2m_sde_heun",
            Sampler::Dpmpp3mSde => "dpmpp_3m_sde",
            Sampler::Ddpm => "ddpm",
            Sampler::Deis => "deis",
            Sampler::ResMultistepCfgPp => "res_multistep_cfg_pp",
            Sampler::ResMultistepA => "res_multistep_ancestral",
            Sampler::ResMultistepACfgPp => "res_multistep_ancestral_cfg_pp",
            Sampler::EulerGeCfgPp => "gradient_estimation_cfg_pp",
            Sampler::Seeds2 => "seeds_2",
            Sampler::Seeds3 => "seeds_3",
            Sampler::SaSolver => "sa_solver",
            Sampler::SaSolverPece => "sa_solver_pece",
            Sampler::UniPc => "uni_pc",
            Sampler::UniPcBh2 => "uni_pc_bh2",
        }
    }

    /// The default `eta` (sd.cpp's where `--eta` unset resolves to it, ComfyUI's otherwise).
    /// For sa_solver it scales SA-Solver's `tau` inside its interval.
    pub fn default_eta(self) -> f32 {
        match self {
            Sampler::EulerA
            | Sampler::Dpmpp2sA
            | Sampler::ErSde
            | Sampler::EulerACfgPp
            | Sampler::Dpmpp2mSde
            | Sampler::Dpmpp2mSdeBt
            | Sampler::Dpm2A
            | Sampler::Dpmpp2sACfgPp
            | Sampler::DpmppSde
            | Sampler::Dpmpp2mSdeHeun
            | Sampler::Dpmpp3mSde
            | Sampler::ResMultistepA
            | Sampler::ResMultistepACfgPp
            | Sampler::Seeds2
            | Sampler::Seeds3
            | Sampler::SaSolver
            | Sampler::SaSolverPece => 1.0,
            _ => 0.0,
        }
    }

    /// sd.cpp's scheduler when none is given: LCM's grid for lcm and tcd, `simple` for
    /// ddim_trailing, `discrete` otherwise.
    pub fn default_scheduler(self) -> Scheduler {
        match self {
            Sampler::Lcm | Sampler::Tcd => Scheduler::Lcm,
            Sampler::DdimTrailing => Scheduler::Simple,
            _ => Scheduler::Discrete,
        }
    }

    /// Whether the denoiser must return [`Denoised::uncond`].
    pub fn needs_uncond(self) -> bool {
        matches!(
            self,
            Sampler::EulerCfgPp
                | Sampler::EulerACfgPp
                | Sampler::Dpmpp2sACfgPp
                | Sampler::Dpmpp2mCfgPp
                | Sampler::ResMultistepCfgPp
                | Sampler::ResMultistepACfgPp
                | Sampler::EulerGeCfgPp
        )
    }

    /// Whether the sampler draws its noise from a Brownian tree unless
    /// [`SampleOpts::stream_noise`] says otherwise (ComfyUI's SDE samplers, and sd.cpp's
    /// `dpm++2m_sde_bt`).
    pub fn uses_brownian_tree(self) -> bool {
        matches!(
            self,
            Sampler::Dpmpp2mSdeBt
                | Sampler::DpmppSde
                | Sampler::Dpmpp2mSdeHeun
                | Sampler::Dpmpp3mSde
        )
    }


    /// Denoiser calls `sample` will make over `sigmas` (for progress bars and budgets);
    /// `None` for dpm_adaptive, whose step count depends on the model's outputs.
    pub fn model_calls(self, sigmas: &[f32], opts: &SampleOpts) -> Option<usize> {
        if sigmas.len() < 2 {
            return Some(0);
        }
        let eta = opts.eta.unwrap_or_else(|| self.default_eta());
        let steps = sigmas.len() - 1;
        let last = sigmas[steps];
        let calls_at = |i: usize| -> usize {
            let next = sigmas[i + 1];
            match self {
                Sampler::Heun | Sampler::Dpm2 => 1 + usize::from(next != 0.0),
                Sampler::Dpmpp2sA if opts.flow => 1 + usize::from(next != 0.0),
                Sampler::Dpmpp2sA | Sampler::Dpmpp2sACfgPp => {
                    1 + usize::from(ancestral_step(sigmas[i], next, eta).0 != 0.0)
                }
                Sampler::Dpm2A => {
                    let down = if opts.flow {
                        comfy::flow_sigma_down(sigmas[i], next, eta)
                    } else {
                        ancestral_step(sigmas[i], next, eta).0
                    };
                    1 + usize::from(down != 0.0)
                }
                Sampler::Res2s => {
                    1 + usize::from(
                        sigmas[i] != 0.0 && ancestral_step(sigmas[i], next, eta).0 != 0.0,
                    )
                }
                Sampler::DpmppSde | Sampler::Seeds2 => 1 + usize::from(next != 0.0),
                Sampler::Seeds3 => 1 + 2 * usize::from(next != 0.0),
                Sampler::Heunpp2 => {
                    if next == last {
                        1
                    } else if sigmas[i + 2] == last {
                        2
                    } else {
                        3
                    }
                }
                Sampler::SaSolverPece => 1 + usize::from(i > 0),
                _ => 1,
            }
        };
        match self {
            Sampler::DpmAdaptive => None,
            // One call per function evaluation of the budget, which is the step count.
            Sampler::DpmFast | Sampler::UniPc | Sampler::UniPcBh2 => Some(steps),
            _ => Some((0..steps).map(calls_at).sum()),
        }
    }
}

impl std::fmt::Display for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Sampler {
    type Err = SamplingError;

    /// Every [`Sampler::name`], plus ComfyUI's names (`euler_ancestral`, `dpmpp_2m`,
    /// `gradient_estimation`, the `_gpu` SDE variants, …) and A1111's `k_*`. ComfyUI's `ddim`
    /// is its Euler sampler, so it maps to `euler`; ComfyUI's `dpmpp_2m_sde` draws
    /// Brownian-tree noise, so it maps to `dpm++2m_sde_bt`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let found = match lower.as_str() {
            "euler" | "k_euler" | "ddim" => Sampler::Euler,
            "euler_a" | "euler_ancestral" | "k_euler_a" | "euler a" => Sampler::EulerA,
            "heun" | "k_heun" => Sampler::Heun,
            "dpm2" | "dpm_2" | "k_dpm_2" => Sampler::Dpm2,
            "dpm++2s_a" | "dpmpp_2s_ancestral" | "dpmpp_2s_a" | "k_dpmpp_2s_a" => Sampler::Dpmpp2sA,
            "dpm++2m" | "dpmpp_2m" | "k_dpmpp_2m" | "dpm++ 2m" => Sampler::Dpmpp2m,
            "dpm++2mv2" | "dpmpp_2m_v2" => Sampler::Dpmpp2mV2,
            "ipndm" => Sampler::Ipndm,
            "ipndm_v" => Sampler::IpndmV,
            "lcm" => Sampler::Lcm,
            "ddim_trailing" => Sampler::DdimTrailing,
            "tcd" => Sampler::Tcd,
            "res_multistep" => Sampler::ResMultistep,
            "res_2s" => Sampler::Res2s,
            "er_sde" => Sampler::ErSde,
            "euler_cfg_pp" => Sampler::EulerCfgPp,
            "euler_a_cfg_pp" | "euler_ancestral_cfg_pp" => Sampler::EulerACfgPp,
            "euler_ge" | "gradient_estimation" => Sampler::EulerGe,
            "dpm++2m_sde" => Sampler::Dpmpp2mSde,
            "dpm++2m_sde_bt" | "dpmpp_2m_sde" | "dpmpp_2m_sde_gpu" => Sampler::Dpmpp2mSdeBt,
            "lms" => Sampler::Lms,
            "k_lms" => Sampler::KLms,
            "ipndm_sdcpp" => Sampler::IpndmSdcpp,
            "ipndm_v_sdcpp" => Sampler::IpndmVSdcpp,
            "heunpp2" => Sampler::Heunpp2,
            "dpm_2_ancestral" | "k_dpm_2_a" => Sampler::Dpm2A,
            "dpm_fast" => Sampler::DpmFast,
            "dpm_adaptive" => Sampler::DpmAdaptive,
            "dpmpp_2s_ancestral_cfg_pp" => Sampler::Dpmpp2sACfgPp,
            "dpmpp_sde" | "dpmpp_sde_gpu" | "k_dpmpp_sde" => Sampler::DpmppSde,
            "dpmpp_2m_cfg_pp" => Sampler::Dpmpp2mCfgPp,
            "dpmpp_2m_sde_heun" | "dpmpp_2m_sde_heun_gpu" => Sampler::Dpmpp2mSdeHeun,
            "dpmpp_3m_sde" | "dpmpp_3m_sde_gpu" => Sampler::Dpmpp3mSde,
            "ddpm" => Sampler::Ddpm,
            "deis" => Sampler::Deis,
            "res_multistep_cfg_pp" => Sampler::ResMultistepCfgPp,
            "res_multistep_ancestral" => Sampler::ResMultistepA,
            "res_multistep_ancestral_cfg_pp" => Sampler::ResMultistepACfgPp,
            "gradient_estimation_cfg_pp" => Sampler::EulerGeCfgPp,
            "seeds_2" => Sampler::Seeds2,
            "seeds_3" => Sampler::Seeds3,
            "sa_solver" => Sampler::SaSolver,
            "sa_solver_pece" => Sampler::SaSolverPece,
            "uni_pc" => Sampler::UniPc,
            "uni_pc_bh2" => Sampler::UniPcBh2,
            _ => {
                return Err(SamplingError::UnknownName {
                    what: "sampler",
                    name: s.to_string(),
                    valid: Sampler::ALL
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

/// The denoiser callback: `(x, sigma) -> Denoised`.
pub type Model<'a, E> = dyn FnMut(&[f32], f32) -> Result<Denoised, E> + 'a;

enum Noise<'a> {
    Stream(&'a mut dyn Rng),
    Tree(BrownianTreeNoise),
    /// A tree per sample, for a generator per sample ([`Rng::brownian_seeds`]).
    Trees(Vec<BrownianTreeNoise>),
}

struct Run<'a, 'b, E> {
    sampler: Sampler,
    model: &'a mut Model<'b, E>,
    noise: Noise<'a>,
    progress: Option<&'a mut dyn FnMut(Progress<'_>)>,
    len: usize,
    total: usize,
    step: usize,
    s_noise: f32,
    flow: bool,
    /// Flow: where a first sigma of 1 goes for the samplers that need a finite log-SNR.
    flow_first: f32,
}

impl<E> Run<'_, '_, E> {
    fn call(&mut self, x: &[f32], sigma: f32) -> Result<Denoised, SampleError<E>> {
        let step = self.step + 1;
        let out =
            (self.model)(x, sigma).map_err(|error| SampleError::Model { step, sigma, error })?;
        if out.denoised.len() != self.len {
            return Err(SampleError::DenoisedLength {
                step,
                expected: self.len,
                got: out.denoised.len(),
            });
        }
        if let Some(u) = &out.uncond {
            if u.len() != self.len {
                return Err(SampleError::DenoisedLength {
                    step,
                    expected: self.len,
                    got: u.len(),
                });
            }
        }
        Ok(out)
    }

    fn denoise(&mut self, x: &[f32], sigma: f32) -> Result<Vec<f32>, SampleError<E>> {
        Ok(self.call(x, sigma)?.denoised)
    }

    /// Guided and unconditional estimates, for the CFG++ samplers.
    fn denoise_pp(
        &mut self,
        x: &[f32],
        sigma: f32,
    ) -> Result<(Vec<f32>, Vec<f32>), SampleError<E>> {
        let out = self.call(x, sigma)?;
        match out.uncond {
            Some(u) => Ok((out.denoised, u)),
            None => Err(SampleError::MissingUncond {
                sampler: self.sampler.name(),
                step: self.step + 1,
            }),
        }
    }

    fn noise(&mut self, sigma: f32, sigma_next: f32) -> Vec<f32> {
        let n = self.len;
        match &mut self.noise {
            Noise::Stream(rng) => rng.randn(n),
            Noise::Tree(tree) => tree.noise(sigma, sigma_next),
            Noise::Trees(trees) => trees.iter_mut().flat_map(|t| t.noise(sigma, sigma_next)).collect(),
        }
    }

    /// `x += noise(sigma, sigma_next) * scale * s_noise`.
    fn add_noise(&mut self, x: &mut [f32], sigma: f32, sigma_next: f32, scale: f32) {
        let z = self.noise(sigma, sigma_next);
        let k = self.s_noise * scale;
        for (xi, zi) in x.iter_mut().zip(z) {
            *xi += zi * k;
        }
    }

    fn done(&mut self, sigma: f32, x: &[f32], denoised: &[f32]) {
        self.step += 1;
        // dpm_adaptive learns its step count as it goes.
        self.total = self.total.max(self.step);
        if let Some(cb) = self.progress.as_mut() {
            cb(Progress {
                step: self.step,
                total: self.total,
                sigma,
                x,
                denoised,
            });
        }
    }
}

/// sd.cpp's `get_ancestral_step_flow`: `(sigma_down, sigma_up, alpha_scale)` for a
/// rectified-flow step, with eta clamped to 1 where the step stays well defined.
pub fn ancestral_step_flow(sigma_from: f32, sigma_to: f32, eta: f32) -> (f32, f32, f32) {
    if eta <= 0.0 || sigma_from <= 0.0 || sigma_to <= 0.0 {
        return (sigma_to, 0.0, 1.0);
    }
    let eta = eta.min(1.0);
    let ratio = sigma_to / sigma_from;
    let down = (sigma_to * (1.0 + (ratio - 1.0) * eta)).clamp(0.0, sigma_to);
    let denom = 1.0 - down;
    if denom <= 0.0 {
        return (sigma_to, 0.0, 1.0);
    }
    let alpha_scale = (1.0 - sigma_to) / denom;
    let term = ((down / sigma_to) * alpha_scale).clamp(-1.0, 1.0);
    let up = sigma_to * (1.0 - term * term).max(0.0).sqrt();
    (down, up, alpha_scale)
}

fn step_for(flow: bool, sigma_from: f32, sigma_to: f32, eta: f32) -> (f32, f32, f32) {
    if flow {
        ancestral_step_flow(sigma_from, sigma_to, eta)
    } else {
        let (down, up) = ancestral_step(sigma_from, sigma_to, eta);
        (down, up, 1.0)
    }
}

/// ComfyUI's `offset_first_sigma_for_snr` (and sd.cpp's): flow sigmas start just below 1,
/// where log-SNR is finite.
fn offset_first_sigma<E>(run: &Run<E>, sigmas: &[f32]) -> Vec<f32> {
    let mut s = sigmas.to_vec();
    if run.flow && s.len() > 1 && s[0] >= 1.0 {
        s[0] = run.flow_first;
    }
    s
}

/// Half log-SNR `lambda`: `-ln sigma` for eps models, `ln((1 - sigma) / sigma)` for flow.
fn half_log_snr(sigma: f32, flow: bool) -> f32 {
    if flow {
        let s = sigma.clamp(1e-6, 1.0 - 1e-6);
        ((1.0 - s) / s).ln()
    } else {
        -sigma.max(1e-20).ln()
    }
}

/// k-diffusion's `get_ancestral_step`, guarded as sd.cpp does against rounding below zero.
pub fn ancestral_step(sigma_from: f32, sigma_to: f32, eta: f32) -> (f32, f32) {
    if eta <= 0.0 {
        return (sigma_to, 0.0);
    }
    let (f2, t2) = (sigma_from * sigma_from, sigma_to * sigma_to);
    let mut up = 0.0f32;
    if f2 > 0.0 {
        up = sigma_to.min(eta * (t2 * (f2 - t2) / f2).max(0.0).sqrt());
    }
    let d2 = t2 - up * up;
    (if d2 > 0.0 { d2.sqrt() } else { 0.0 }, up)
}

fn to_d(x: &[f32], sigma: f32, denoised: &[f32]) -> Vec<f32> {
    x.iter()
        .zip(denoised)
        .map(|(&a, &b)| (a - b) / sigma)
        .collect()
}

fn axpy(x: &mut [f32], d: &[f32], dt: f32) {
    for (xi, &di) in x.iter_mut().zip(d) {
        *xi += di * dt;
    }
}

/// Run `sampler` from latent `x` (already noised to `sigmas[0]`) down the schedule.
///
/// `x` is in k-diffusion's space (`x0 + sigma * eps`, so txt2img starts from
/// `noise * sigmas[0]`); the model callback gets `(x, sigma)`, applies the model's own input
/// scaling (`c_in = 1 / sqrt(sigma^2 + 1)` for SD) and guidance, and returns the estimate of
/// `x0`. `sigmas` may be any finite, non-negative list (custom sigmas included); the usual
/// last value is 0.
///
/// `rng` supplies all per-step noise (and the Brownian-tree seed when one is needed). sd.cpp
/// continues the generator that drew the initial noise; current ComfyUI starts a fresh generator from the seed on the latent's
/// device (torch CUDA's Philox on a GPU, which [`super::PhiloxRng`] reproduces) and seeds
/// its Brownian tree with the seed itself ([`SampleOpts::brownian_seed`]). `progress` is
/// called after each step. An error from the denoiser stops sampling and is returned with
/// the step it happened at.
pub fn sample<'a, E>(
    sampler: Sampler,
    model: &'a mut Model<'_, E>,
    x: Vec<f32>,
    sigmas: &[f32],
    rng: &'a mut dyn Rng,
    opts: &SampleOpts,
    progress: Option<&'a mut dyn FnMut(Progress<'_>)>,
) -> Result<Vec<f32>, SampleError<E>> {
    if sigmas.is_empty() || sigmas.len() == 1 {
        // ComfyUI's denoise 0: nothing to do.
        return Ok(x);
    }
    validate_sigmas(sigmas)?;
    let eta = opts.eta.unwrap_or_else(|| sampler.default_eta());
    if !(eta.is_finite() && eta >= 0.0) {
        return Err(SamplingError::InvalidOption {
            field: "eta",
            reason: format!("{eta} must be finite and >= 0"),
        }
        .into());
    }
    if !(opts.s_noise.is_finite() && opts.s_noise >= 0.0) {
        return Err(SamplingError::InvalidOption {
            field: "s_noise",
            reason: format!("{} must be finite and >= 0", opts.s_noise),
        }
        .into());
    }
    if matches!(sampler, Sampler::Lms | Sampler::KLms) && !(1..=16).contains(&opts.lms_order) {
        return Err(SamplingError::InvalidOption {
            field: "lms_order",
            reason: format!("{} is outside 1..=16", opts.lms_order),
        }
        .into());
    }
    if matches!(sampler, Sampler::DpmFast | Sampler::DpmAdaptive) && sigmas[0] <= 0.0 {
        return Err(SamplingError::InvalidSigmas(format!(
            "{sampler} integrates from the first sigma, which must be positive (got {})",
            sigmas[0]
        ))
        .into());
    }
    if let Some(first) = opts.flow_first_sigma {
        if !(first > 0.0 && first < 1.0) {
            return Err(SamplingError::InvalidOption {
                field: "flow_first_sigma",
                reason: format!("{first} is outside (0, 1)"),
            }
            .into());
        }
    }
    if let Some((start, end)) = opts.sa_tau_interval {
        if !(start.is_finite() && end.is_finite()) {
            return Err(SamplingError::InvalidOption {
                field: "sa_tau_interval",
                reason: format!("({start}, {end}) must be finite"),
            }
            .into());
        }
    }
    if !opts.ge_gamma.is_finite() {
        return Err(SamplingError::InvalidOption {
            field: "ge_gamma",
            reason: "must be finite".into(),
        }
        .into());
    }
    if opts.flow {
        if matches!(sampler, Sampler::DdimTrailing | Sampler::Tcd) {
            return Err(SamplingError::InvalidOption {
                field: "flow",
                reason: format!("{sampler} is defined for the SD (eps / v) schedule only"),
            }
            .into());
        }
        if let Some((i, v)) = sigmas.iter().enumerate().find(|(_, v)| **v > 1.0) {
            return Err(SamplingError::InvalidSigmas(format!(
                "sigma {i} is {v}; flow sigmas must lie in [0, 1]"
            ))
            .into());
        }
    }
    let len = x.len();
    let noise = if opts.brownian || (sampler.uses_brownian_tree() && !opts.stream_noise) {
        match opts.brownian_seed {
            Some(seed) => Noise::Tree(BrownianTreeNoise::for_sigmas(len, sigmas, seed)),
            None => {
                let seeds = rng.brownian_seeds();
                match seeds[..] {
                    [seed] => Noise::Tree(BrownianTreeNoise::for_sigmas(len, sigmas, seed)),
                    _ if !seeds.is_empty() && len % seeds.len() == 0 => Noise::Trees(seeds.iter().map(|&s| BrownianTreeNoise::for_sigmas(len / seeds.len(), sigmas, s)).collect()),
                    _ => {
                        return Err(SamplingError::InvalidOption { field: "rng", reason: format!("{} Brownian trees do not split a latent of {len} values", seeds.len()) }.into());
                    }
                }
            }
        }
    } else {
        Noise::Stream(rng)
    };
    let mut run = Run {
        sampler,
        model,
        noise,
        progress,
        len,
        total: sigmas.len() - 1,
        step: 0,
        s_noise: opts.s_noise,
        flow: opts.flow,
        flow_first: opts.flow_first_sigma.unwrap_or(1.0 - 1e-4),
    };
    let s = sigmas;
    match sampler {
        Sampler::Euler => euler(&mut run, x, s),
        Sampler::EulerA => euler_ancestral(&mut run, x, s, eta),
        Sampler::Heun => heun(&mut run, x, s),
        Sampler::Dpm2 => dpm2(&mut run, x, s),
        Sampler::Dpmpp2sA if opts.flow => comfy::dpmpp_2s_ancestral_rf(&mut run, x, s, eta),
        Sampler::Dpmpp2sA => dpmpp_2s_ancestral(&mut run, x, s, eta),
        Sampler::Dpmpp2m => dpmpp_2m(&mut run, x, s, false),
        Sampler::Dpmpp2mV2 => dpmpp_2m(&mut run, x, s, true),
        Sampler::Ipndm => comfy::ipndm(&mut run, x, s, false),
        Sampler::IpndmV => comfy::ipndm(&mut run, x, s, true),
        Sampler::Lcm => lcm(&mut run, x, s),
        Sampler::DdimTrailing => ddim_trailing(&mut run, x, s, eta),
        Sampler::Tcd => tcd(&mut run, x, s, eta),
        Sampler::ResMultistep => res_multistep(&mut run, x, s, eta),
        Sampler::Res2s => res_2s(&mut run, x, s, eta),
        Sampler::ErSde => er_sde(&mut run, x, s, eta),
        Sampler::EulerCfgPp => euler_ancestral_cfg_pp(&mut run, x, s, 0.0),
        Sampler::EulerACfgPp => euler_ancestral_cfg_pp(&mut run, x, s, eta),
        Sampler::EulerGe => euler_ge(&mut run, x, s, opts.ge_gamma, false),
        Sampler::EulerGeCfgPp => euler_ge(&mut run, x, s, opts.ge_gamma, true),
        Sampler::Dpmpp2mSde | Sampler::Dpmpp2mSdeBt => dpmpp_2m_sde(&mut run, x, s, eta, false),
        Sampler::Dpmpp2mSdeHeun => dpmpp_2m_sde(&mut run, x, s, eta, true),
        Sampler::Lms => lms(&mut run, x, s, opts.lms_order, true),
        Sampler::KLms => lms(&mut run, x, s, opts.lms_order, false),
        Sampler::IpndmSdcpp => ipndm_sdcpp(&mut run, x, s, false),
        Sampler::IpndmVSdcpp => ipndm_sdcpp(&mut run, x, s, true),
        Sampler::Heunpp2 => comfy::heunpp2(&mut run, x, s),
        Sampler::Dpm2A => comfy::dpm_2_ancestral(&mut run, x, s, eta),
        Sampler::DpmFast => multistep::dpm_fast(&mut run, x, s, eta),
        Sampler::DpmAdaptive => multistep::dpm_adaptive(&mut run, x, s, eta),
        Sampler::Dpmpp2sACfgPp => comfy::dpmpp_2s_ancestral_cfg_pp(&mut run, x, s, eta),
        Sampler::DpmppSde => comfy::dpmpp_sde(&mut run, x, s, eta),
        Sampler::Dpmpp2mCfgPp => comfy::dpmpp_2m_cfg_pp(&mut run, x, s),
        Sampler::Dpmpp3mSde => comfy::dpmpp_3m_sde(&mut run, x, s, eta),
        Sampler::Ddpm => comfy::ddpm(&mut run, x, s),
        Sampler::Deis => multistep::deis(&mut run, x, s),
        Sampler::ResMultistepCfgPp => comfy::res_multistep(&mut run, x, s, 0.0, true),
        Sampler::ResMultistepA => comfy::res_multistep(&mut run, x, s, eta, false),
        Sampler::ResMultistepACfgPp => comfy::res_multistep(&mut run, x, s, eta, true),
        Sampler::Seeds2 => comfy::seeds_2(&mut run, x, s, eta),
        Sampler::Seeds3 => comfy::seeds_3(&mut run, x, s, eta),
        Sampler::SaSolver => multistep::sa_solver(&mut run, x, s, eta, opts.sa_tau_interval, false),
        Sampler::SaSolverPece => multistep::sa_solver(&mut run, x, s, eta, opts.sa_tau_interval, true),
        Sampler::UniPc => multistep::uni_pc(&mut run, x, s, false),
        Sampler::UniPcBh2 => multistep::uni_pc(&mut run, x, s, true),
    }
}

type Res<E> = Result<Vec<f32>, SampleError<E>>;

fn euler<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        axpy(&mut x, &d, s[i + 1] - s[i]);
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

fn euler_ancestral<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    if run.flow {
        return euler_ancestral_flow(run, x, s, eta);
    }
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let (down, up) = ancestral_step(s[i], s[i + 1], eta);
        let d = to_d(&x, s[i], &den);
        axpy(&mut x, &d, down - s[i]);
        if s[i + 1] > 0.0 {
            run.add_noise(&mut x, s[i], s[i + 1], up);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// sd.cpp's `sample_euler_flow`: step to `sigma_down` along the flow, rescale, add noise.
fn euler_ancestral_flow<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let (down, up, alpha_scale) = ancestral_step_flow(s[i], s[i + 1], eta);
        let ratio = down / s[i];
        for (xi, &di) in x.iter_mut().zip(&den) {
            *xi = ratio * *xi + (1.0 - ratio) * di;
        }
        if up > 0.0 {
            x.iter_mut().for_each(|v| *v *= alpha_scale);
            run.add_noise(&mut x, s[i], s[i + 1], up);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

fn heun<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        let dt = s[i + 1] - s[i];
        if s[i + 1] == 0.0 {
            axpy(&mut x, &d, dt);
        } else {
            let mut x2 = x.clone();
            axpy(&mut x2, &d, dt);
            let den2 = run.denoise(&x2, s[i + 1])?;
            let d2 = to_d(&x2, s[i + 1], &den2);
            let dp: Vec<f32> = d.iter().zip(&d2).map(|(a, b)| (a + b) / 2.0).collect();
            axpy(&mut x, &dp, dt);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

fn dpm2<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        if s[i + 1] == 0.0 {
            axpy(&mut x, &d, s[i + 1] - s[i]);
        } else {
            let (la, lb) = (s[i].ln(), s[i + 1].ln());
            let sigma_mid = (la + 0.5 * (lb - la)).exp();
            let mut x2 = x.clone();
            axpy(&mut x2, &d, sigma_mid - s[i]);
            let den2 = run.denoise(&x2, sigma_mid)?;
            let d2 = to_d(&x2, sigma_mid, &den2);
            axpy(&mut x, &d2, s[i + 1] - s[i]);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

fn t_fn(sigma: f32) -> f32 {
    -sigma.ln()
}

fn sigma_fn(t: f32) -> f32 {
    (-t).exp()
}

fn dpmpp_2s_ancestral<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let (down, up) = ancestral_step(s[i], s[i + 1], eta);
        if down == 0.0 {
            let d = to_d(&x, s[i], &den);
            axpy(&mut x, &d, down - s[i]);
        } else {
            let (t, t_next) = (t_fn(s[i]), t_fn(down));
            let h = t_next - t;
            let sm = t + 0.5 * h;
            let (a, b) = (sigma_fn(sm) / sigma_fn(t), (-h * 0.5).exp_m1());
            let x2: Vec<f32> = x
                .iter()
                .zip(&den)
                .map(|(&xi, &di)| a * xi - b * di)
                .collect();
            let den2 = run.denoise(&x2, sigma_fn(sm))?;
            let (a, b) = (sigma_fn(t_next) / sigma_fn(t), (-h).exp_m1());
            for (xi, &di) in x.iter_mut().zip(&den2) {
                *xi = a * *xi - b * di;
            }
        }
        if s[i + 1] > 0.0 {
            run.add_noise(&mut x, s[i], s[i + 1], up);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// DPM-Solver++(2M); `v2` is sd.cpp's variant that takes the step from the mean of the last
/// two log-sigma steps.
fn dpmpp_2m<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], v2: bool) -> Res<E> {
    let mut old: Option<Vec<f32>> = None;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let (t, t_next) = (t_fn(s[i]), t_fn(s[i + 1]));
        let h = t_next - t;
        let a = sigma_fn(t_next) / sigma_fn(t);
        match (&old, s[i + 1] == 0.0) {
            (Some(old_den), false) => {
                let h_last = t - t_fn(s[i - 1]);
                let (r, b) = if v2 {
                    let (lo, hi) = (h_last.min(h), h_last.max(h));
                    (hi / lo, (-(hi + lo) / 2.0).exp_m1())
                } else {
                    (h_last / h, (-h).exp_m1())
                };
                let (c1, c2) = (1.0 + 1.0 / (2.0 * r), 1.0 / (2.0 * r));
                for ((xi, &di), &oi) in x.iter_mut().zip(&den).zip(old_den) {
                    *xi = a * *xi - b * (c1 * di - c2 * oi);
                }
            }
            _ => {
                let b = (-h).exp_m1();
                for (xi, &di) in x.iter_mut().zip(&den) {
                    *xi = a * *xi - b * di;
                }
            }
        }
        run.done(s[i], &x, &den);
        old = Some(den);
    }
    Ok(x)
}

fn lcm<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        x.copy_from_slice(&den);
        if s[i + 1] > 0.0 {
            let z = run.noise(s[i], s[i + 1]);
            // The model's noise scaling: x0 + sigma n (eps), (1 - sigma) x0 + sigma n (flow).
            let keep = if run.flow { 1.0 - s[i + 1] } else { 1.0 };
            for (xi, zi) in x.iter_mut().zip(z) {
                *xi = keep * *xi + zi * s[i + 1];
            }
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// sd.cpp's own SD alphas_cumprod for ddim_trailing / tcd (double product of f32 betas).
fn sdcpp_alphas_cumprod() -> (Vec<f64>, Vec<f64>) {
    let (beta_start, beta_end) = (0.00085f32, 0.0120f32);
    let n = super::schedule::TIMESTEPS;
    let mut ac = vec![0f64; n];
    let mut sig = vec![0f64; n];
    for i in 0..n {
        let b =
            beta_start.sqrt() + (beta_end.sqrt() - beta_start.sqrt()) * (i as f32 / (n - 1) as f32);
        let prev = if i == 0 { 1.0 } else { ac[i - 1] };
        ac[i] = prev * (1.0f32 as f64 - (b as f64).powi(2));
        sig[i] = ((1.0 - ac[i]) / ac[i]).sqrt();
    }
    (ac, sig)
}

/// sd.cpp's DDIM with "trailing" timestep spacing. It works in the DDPM latent space and
/// takes its timesteps from the step count (the sigma values only give the count).
fn ddim_trailing<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let (ac, sig) = sdcpp_alphas_cumprod();
    let n = ac.len() as i64;
    let steps = (s.len() - 1) as i64;
    for i in 0..steps {
        let timestep =
            ((n as f32 - i as f32 * (n as f32 / steps as f32)).round() as i64 - 1).clamp(0, n - 1);
        let prev_timestep = timestep - n / steps;
        let sigma = sig[timestep as usize] as f32;
        let (den, eps) = ddpm_eps(run, &mut x, sigma, i == 0)?;
        let a_t = ac[timestep as usize] as f32;
        let a_prev = (if prev_timestep >= 0 {
            ac[prev_timestep as usize]
        } else {
            ac[0]
        }) as f32;
        let b_t = 1.0 - a_t;
        let c_in = (sigma * sigma + 1.0).sqrt();
        let b_prev = 1.0 - a_prev;
        let variance = (b_prev / b_t) * (1.0 - a_t / a_prev);
        let std_dev = eta * variance.sqrt();
        let dir = (1.0 - a_prev - std_dev * std_dev).sqrt();
        for j in 0..x.len() {
            let pred_x0 = ((x[j] / c_in) - b_t.sqrt() * eps[j]) * (1.0 / a_t.sqrt());
            x[j] = a_prev.sqrt() * pred_x0 + dir * eps[j];
        }
        if eta > 0.0 {
            let z = run.noise(s[i as usize], s[i as usize + 1]);
            for (xi, zi) in x.iter_mut().zip(z) {
                *xi += std_dev * zi;
            }
        }
        run.done(sigma, &x, &den);
    }
    Ok(x)
}

/// The prologue of sd.cpp's DDPM-parameterised samplers (ddim_trailing, tcd): move `x` from
/// k-diffusion's scale to the DDPM one (the first step starts from pure noise), denoise,
/// and return the denoised latent and the implied noise.
fn ddpm_eps<E>(run: &mut Run<'_, '_, E>, x: &mut [f32], sigma: f32, first: bool) -> Result<(Vec<f32>, Vec<f32>), SampleError<E>> {
    let scale = if first { (sigma * sigma + 1.0).sqrt() / sigma } else { (sigma * sigma + 1.0).sqrt() };
    x.iter_mut().for_each(|v| *v *= scale);
    let den = run.denoise(x, sigma)?;
    let eps = x.iter().zip(&den).map(|(&a, &b)| (a - b) * (1.0 / sigma)).collect();
    Ok((den, eps))
}

/// sd.cpp's TCD (trajectory consistency distillation) sampler; `eta` is its gamma.
fn tcd<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let (ac, sig) = sdcpp_alphas_cumprod();
    let n = ac.len() as i64;
    let original_steps = 50i64;
    let steps = (s.len() - 1) as i64;
    let ts = |k: i64| {
        n - 1
            - (n / original_steps)
                * (k as f32 * (original_steps as f32 / steps as f32)).floor() as i64
    };
    for i in 0..steps {
        let timestep = ts(i).clamp(0, n - 1);
        let prev_timestep = if i >= steps - 1 {
            0
        } else {
            ts(i + 1).clamp(0, n - 1)
        };
        let timestep_s = (((1.0 - eta) * prev_timestep as f32).floor() as i64).clamp(0, n - 1);
        let sigma = sig[timestep as usize] as f32;
        let (den, eps) = ddpm_eps(run, &mut x, sigma, i == 0)?;
        let a_t = ac[timestep as usize] as f32;
        let b_t = 1.0 - a_t;
        let a_prev = ac[prev_timestep as usize] as f32;
        let a_s = ac[timestep_s as usize] as f32;
        let b_s = 1.0 - a_s;
        let c_in = (sigma * sigma + 1.0).sqrt();
        for j in 0..x.len() {
            let pred_x0 = ((x[j] / c_in) - b_t.sqrt() * eps[j]) * (1.0 / a_t.sqrt());
            x[j] = a_s.sqrt() * pred_x0 + b_s.sqrt() * eps[j];
        }
        if eta > 0.0 && i != steps - 1 {
            let z = run.noise(s[i as usize], s[i as usize + 1]);
            let (k1, k2) = ((a_prev / a_s).sqrt(), (1.0 - a_prev / a_s).sqrt());
            for (xi, zi) in x.iter_mut().zip(z) {
                *xi = k1 * *xi + k2 * zi;
            }
        }
        run.done(sigma, &x, &den);
    }
    Ok(x)
}

fn phi1(t: f32) -> f32 {
    if t.abs() < 1e-6 {
        1.0 + t * 0.5 + t * t / 6.0
    } else {
        (t.exp() - 1.0) / t
    }
}

fn phi2(t: f32) -> f32 {
    if t.abs() < 1e-6 {
        0.5 + t / 6.0 + t * t / 24.0
    } else {
        (phi1(t) - 1.0) / t
    }
}

/// sd.cpp's RES multistep (second-order exponential multistep with ancestral noise).
fn res_multistep<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let mut old: Option<(Vec<f32>, f32)> = None;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let (from, to) = (s[i], s[i + 1]);
        let (down, up, alpha_scale) = step_for(run.flow, from, to, eta);
        match &old {
            Some((old_den, old_down)) if down != 0.0 => {
                let t = t_fn(from);
                let t_old = t_fn(*old_down);
                let t_next = t_fn(down);
                let t_prev = t_fn(s[i - 1]);
                let h = t_next - t;
                let c2 = (t_prev - t_old) / h;
                let (p1, p2) = (phi1(-h), phi2(-h));
                let mut b1 = p1 - p2 / c2;
                let mut b2 = p2 / c2;
                if !b1.is_finite() {
                    b1 = 0.0;
                }
                if !b2.is_finite() {
                    b2 = 0.0;
                }
                let a = sigma_fn(h);
                for ((xi, &di), &oi) in x.iter_mut().zip(&den).zip(old_den) {
                    *xi = a * *xi + h * (b1 * di + b2 * oi);
                }
            }
            _ => {
                let d = to_d(&x, from, &den);
                axpy(&mut x, &d, down - from);
            }
        }
        if to > 0.0 && up > 0.0 {
            if run.flow {
                x.iter_mut().for_each(|v| *v *= alpha_scale);
            }
            run.add_noise(&mut x, from, to, up);
        }
        run.done(from, &x, &den);
        old = Some((den, down));
    }
    Ok(x)
}

/// sd.cpp's RES 2S (two-stage exponential integrator with ancestral noise).
fn res_2s<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let c2 = 0.5f32;
    for i in 0..s.len() - 1 {
        let (from, to) = (s[i], s[i + 1]);
        let den = run.denoise(&x, from)?;
        let (down, up, alpha_scale) = step_for(run.flow, from, to, eta);
        if down == 0.0 || from == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let t = t_fn(from);
            let h = t_fn(down) - t;
            let a21 = c2 * phi1(-h * c2);
            let b2 = phi2(-h) / c2;
            let b1 = phi1(-h) - b2;
            let sigma_c2 = (-(t + h * c2)).exp();
            let eps1: Vec<f32> = den.iter().zip(&x).map(|(&d, &x0)| d - x0).collect();
            let x2: Vec<f32> = x
                .iter()
                .zip(&eps1)
                .map(|(&x0, &e)| x0 + e * (h * a21))
                .collect();
            let den2 = run.denoise(&x2, sigma_c2)?;
            for ((xi, &e1), &d2) in x.iter_mut().zip(&eps1).zip(&den2) {
                let e2 = d2 - *xi;
                *xi += h * (b1 * e1 + b2 * e2);
            }
        }
        if to > 0.0 && up > 0.0 {
            if run.flow {
                x.iter_mut().for_each(|v| *v *= alpha_scale);
            }
            run.add_noise(&mut x, from, to, up);
        }
        run.done(from, &x, &den);
    }
    Ok(x)
}

fn er_sde_noise_scaler(v: f32) -> f32 {
    if v <= 0.0 {
        0.0
    } else {
        v * (v.powf(0.3).exp() + 10.0)
    }
}

/// sd.cpp's ER-SDE-Solver-3 (extended reverse-time SDE, up to third order). The noise is
/// scaled by `eta * s_noise`; sd.cpp's default eta of 1 gives its result, eta 0 the ODE.
fn er_sde<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    const POINTS: usize = 200;
    let s = &offset_first_sigma(run, s)[..];
    let lambdas: Vec<f32> = s
        .iter()
        .map(|&v| (-half_log_snr(v, run.flow)).exp())
        .collect();
    let mut old_den: Option<Vec<f32>> = None;
    let mut old_den_d: Option<Vec<f32>> = None;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let stage = (i + 1).min(3);
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let (ls, lt) = (lambdas[i], lambdas[i + 1]);
            let (alpha_s, alpha_t) = (s[i] / ls, s[i + 1] / lt);
            let r_alpha = alpha_t / alpha_s;
            let (scaled_s, scaled_t) = (er_sde_noise_scaler(ls), er_sde_noise_scaler(lt));
            let r = if scaled_s != 0.0 {
                scaled_t / scaled_s
            } else {
                0.0
            };
            for (xi, &di) in x.iter_mut().zip(&den) {
                *xi = (r_alpha * r) * *xi + (alpha_t * (1.0 - r)) * di;
            }
            if stage >= 2 {
                if let Some(od) = &old_den {
                    let dt = lt - ls;
                    let step = -dt / POINTS as f32;
                    let (mut sum_inv, mut sum_u) = (0.0f32, 0.0f32);
                    for p in 0..POINTS {
                        let pos = lt + p as f32 * step;
                        let sc = er_sde_noise_scaler(pos);
                        if sc != 0.0 {
                            sum_inv += 1.0 / sc;
                            sum_u += (pos - ls) / sc;
                        }
                    }
                    let s_int = sum_inv * step;
                    let inv = 1.0 / (ls - lambdas[i - 1]);
                    let den_d: Vec<f32> =
                        den.iter().zip(od).map(|(&a, &b)| (a - b) * inv).collect();
                    let k = alpha_t * (dt + s_int * scaled_t);
                    axpy(&mut x, &den_d, k);
                    if stage >= 3 {
                        if let Some(odd) = &old_den_d {
                            let denom = (ls - lambdas[i - 2]) * 0.5;
                            if denom != 0.0 {
                                let s_u = sum_u * step;
                                let k = alpha_t * (dt * dt * 0.5 + s_u * scaled_t);
                                let inv = 1.0 / denom;
                                for ((xi, &a), &b) in x.iter_mut().zip(&den_d).zip(odd) {
                                    *xi += (a - b) * inv * k;
                                }
                            }
                        }
                    }
                    old_den_d = Some(den_d);
                }
            }
            let amount = eta * run.s_noise;
            if amount > 0.0 {
                let variance = lt * lt - ls * ls * r * r;
                let scale = alpha_t * amount * variance.max(0.0).sqrt();
                if scale > 0.0 {
                    let z = run.noise(s[i], s[i + 1]);
                    for (xi, zi) in x.iter_mut().zip(z) {
                        *xi += zi * scale;
                    }
                }
            }
        }
        run.done(s[i], &x, &den);
        old_den = Some(den);
    }
    Ok(x)
}

/// ComfyUI's Euler ancestral CFG++: step from the guided estimate along the
/// *unconditional* noise direction, in the model's `alpha`-scaled space (`alpha = 1` for eps
/// models, `1 - sigma` for flow). eta 0 is `euler_cfg_pp`.
fn euler_ancestral_cfg_pp<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    for i in 0..s.len() - 1 {
        let (den, unc) = run.denoise_pp(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let (alpha_s, alpha_t) = (comfy::alpha_of(run, s[i]), comfy::alpha_of(run, s[i + 1]));
            let d: Vec<f32> = x
                .iter()
                .zip(&unc)
                .map(|(&xi, &u)| (xi - alpha_s * u) / s[i])
                .collect();
            let (from, to) = (s[i] / alpha_s, s[i + 1] / alpha_t);
            let (down, up) = if eta > 0.0 && !from.is_finite() {
                // A flow sigma of 1 has alpha 0: ComfyUI's step then computes sigma_up as
                // min(sigma_to, nan), which Python's min resolves to sigma_to (all noise).
                (0.0, to)
            } else {
                ancestral_step(from, to, eta)
            };
            let down = alpha_t * down;
            for ((xi, &di), &dd) in x.iter_mut().zip(&den).zip(&d) {
                *xi = alpha_t * di + down * dd;
            }
            if eta > 0.0 && run.s_noise > 0.0 {
                run.add_noise(&mut x, s[i], s[i + 1], alpha_t * up);
            }
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// ComfyUI's `gradient_estimation`: Euler plus `(gamma - 1) * (d - d_prev)`; with `cfg_pp`
/// the direction comes from the unconditional estimate and the step restarts from the
/// guided one.
fn euler_ge<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], gamma: f32, cfg_pp: bool) -> Res<E> {
    let mut old_d: Option<Vec<f32>> = None;
    for i in 0..s.len() - 1 {
        let (den, d) = if cfg_pp {
            let (den, unc) = run.denoise_pp(&x, s[i])?;
            let d = to_d(&x, s[i], &unc);
            (den, d)
        } else {
            let den = run.denoise(&x, s[i])?;
            let d = to_d(&x, s[i], &den);
            (den, d)
        };
        let dt = s[i + 1] - s[i];
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            if cfg_pp {
                for ((xi, &di), &dd) in x.iter_mut().zip(&den).zip(&d) {
                    *xi = di + dd * s[i + 1];
                }
            } else {
                axpy(&mut x, &d, dt);
            }
            if let Some(od) = &old_d {
                for ((xi, &a), &b) in x.iter_mut().zip(&d).zip(od) {
                    *xi += (gamma - 1.0) * (a - b) * dt;
                }
            }
        }
        run.done(s[i], &x, &den);
        old_d = Some(d);
    }
    Ok(x)
}

/// DPM-Solver++(2M) SDE, k-diffusion's for eps models; `heun` is ComfyUI's
/// `dpmpp_2m_sde_heun` (the Heun-type correction instead of the midpoint one).
fn dpmpp_2m_sde<E>(run: &mut Run<E>, x: Vec<f32>, s: &[f32], eta: f32, heun: bool) -> Res<E> {
    if run.flow {
        return dpmpp_2m_sde_flow(run, x, s, eta, heun);
    }
    let mut x = x;
    let mut old: Option<Vec<f32>> = None;
    let mut h_last: Option<f32> = None;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let (t, tn) = (-s[i].ln(), -s[i + 1].ln());
            let h = tn - t;
            let eta_h = eta * h;
            let a = s[i + 1] / s[i] * (-eta_h).exp();
            let b = -(-h - eta_h).exp_m1();
            for (xi, &di) in x.iter_mut().zip(&den) {
                *xi = a * *xi + b * di;
            }
            if let (Some(od), Some(hl)) = (&old, h_last) {
                let r = hl / h;
                let k = if heun {
                    (b / (-h - eta_h) + 1.0) * (1.0 / r)
                } else {
                    0.5 * b * (1.0 / r)
                };
                for ((xi, &di), &oi) in x.iter_mut().zip(&den).zip(od) {
                    *xi += k * (di - oi);
                }
            }
            if eta > 0.0 {
                let scale = s[i + 1] * (-(-2.0 * eta_h).exp_m1()).sqrt();
                run.add_noise(&mut x, s[i], s[i + 1], scale);
            }
            h_last = Some(h);
        }
        run.done(s[i], &x, &den);
        old = Some(den);
    }
    Ok(x)
}

/// ComfyUI's (and sd.cpp's) DPM-Solver++(2M) SDE in half-log-SNR form, for flow models.
fn dpmpp_2m_sde_flow<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32, heun: bool) -> Res<E> {
    let s = &offset_first_sigma(run, s)[..];
    let mut old: Option<Vec<f32>> = None;
    let mut h_last = 0.0f32;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let (ls, lt) = (half_log_snr(s[i], true), half_log_snr(s[i + 1], true));
            let h = lt - ls;
            let h_eta = h * (eta + 1.0);
            let alpha_t = s[i + 1] * lt.exp();
            let a = (s[i + 1] / s[i]) * (-h * eta).exp();
            let phi = -(-h_eta).exp_m1();
            let b = alpha_t * phi;
            for (xi, &di) in x.iter_mut().zip(&den) {
                *xi = a * *xi + b * di;
            }
            if let Some(od) = &old {
                if h != 0.0 && h_last != 0.0 {
                    let k = if heun {
                        alpha_t * (phi / (-h_eta) + 1.0) * (h / h_last)
                    } else {
                        0.5 * b * (h / h_last)
                    };
                    for ((xi, &di), &oi) in x.iter_mut().zip(&den).zip(od) {
                        *xi += k * (di - oi);
                    }
                }
            }
            if eta > 0.0 {
                let scale = s[i + 1] * (-(-2.0 * h * eta).exp_m1()).max(0.0).sqrt();
                run.add_noise(&mut x, s[i], s[i + 1], scale);
            }
            h_last = h;
        }
        run.done(s[i], &x, &den);
        old = Some(den);
    }
    Ok(x)
}

/// k-diffusion's `linear_multistep_coeff`: the integral over `[t[i], t[i+1]]` of the
/// Lagrange basis polynomial for node `t[i-j]` over nodes `t[i-order+1..=i]`. The
/// polynomial has degree < 16, so 10-point Gauss–Legendre integrates it exactly.
#[allow(clippy::excessive_precision)]
fn lms_coeff(order: usize, t: &[f32], i: usize, j: usize) -> f64 {
    const X: [f64; 5] = [
        0.148_874_338_981_631_2,
        0.433_395_394_129_247_2,
        0.679_409_568_299_024_4,
        0.865_063_366_688_984_5,
        0.973_906_528_517_171_7,
    ];
    const W: [f64; 5] = [
        0.295_524_224_714_752_9,
        0.269_266_719_309_996_4,
        0.219_086_362_515_982_0,
        0.149_451_349_150_580_6,
        0.066_671_344_308_688_1,
    ];
    let node = |k: usize| t[i - k] as f64;
    let basis = |tau: f64| {
        let mut prod = 1.0;
        for k in 0..order {
            if k != j {
                prod *= (tau - node(k)) / (node(j) - node(k));
            }
        }
        prod
    };
    let (a, b) = (t[i] as f64, t[i + 1] as f64);
    let (mid, half) = ((a + b) / 2.0, (b - a) / 2.0);
    let mut sum = 0.0;
    for (x, w) in X.iter().zip(W) {
        sum += w * (basis(mid + half * x) + basis(mid - half * x));
    }
    sum * half
}

/// sd.cpp's `sample_ipndm` / `sample_ipndm_v` (denoiser.hpp).
fn ipndm_sdcpp<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], variable: bool) -> Res<E> {
    let mut hist: Vec<Vec<f32>> = Vec::new();
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        let dt = s[i + 1] - s[i];
        let order = (i + 1).min(4);
        let n = hist.len();
        let step: Vec<f32> = match order {
            1 => d.clone(),
            2 if variable => {
                let h_prev = s[i] - s[i - 1];
                let q = dt / h_prev;
                d.iter()
                    .zip(&hist[n - 1])
                    .map(|(&c, &p)| ((2.0 + q) * c - q * p) / 2.0)
                    .collect()
            }
            2 => d
                .iter()
                .zip(&hist[n - 1])
                .map(|(&c, &p)| (3.0 * c - p) / 2.0)
                .collect(),
            3 => (0..x.len())
                .map(|j| (23.0 * d[j] - 16.0 * hist[n - 1][j] + 5.0 * hist[n - 2][j]) / 12.0)
                .collect(),
            _ => (0..x.len())
                .map(|j| {
                    (55.0 * d[j] - 59.0 * hist[n - 1][j] + 37.0 * hist[n - 2][j]
                        - 9.0 * hist[n - 3][j])
                        / 24.0
                })
                .collect(),
        };
        axpy(&mut x, &step, dt);
        if hist.len() == 3 {
            hist.remove(0);
        }
        hist.push(d);
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// Linear multistep over the last `order` derivatives. `denoise_last`: ComfyUI's `lms`,
/// which returns the denoised estimate when the last sigma is 0 (k-diffusion 0.1.1 takes the
/// multistep step there too).
fn lms<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], order: usize, denoise_last: bool) -> Res<E> {
    let mut ds: Vec<Vec<f32>> = Vec::new();
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        ds.push(to_d(&x, s[i], &den));
        if ds.len() > order {
            ds.remove(0);
        }
        if denoise_last && s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
            run.done(s[i], &x, &den);
            continue;
        }
        let cur = (i + 1).min(order);
        let coeffs: Vec<f32> = (0..cur).map(|j| lms_coeff(cur, s, i, j) as f32).collect();
        let mut acc = vec![0f32; x.len()];
        for (c, d) in coeffs.iter().zip(ds.iter().rev()) {
            for (a, &v) in acc.iter_mut().zip(d) {
                *a += c * v;
            }
        }
        for (xi, a) in x.iter_mut().zip(acc) {
            *xi += a;
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// ComfyUI's KSampler builds the schedule for one more step and drops its next-to-last
/// sigma for the samplers of these names (`DISCARD_PENULTIMATE_SIGMA_SAMPLERS`); sd.cpp
/// does not, so its spelling of the same sampler (`dpm2`) keeps every sigma.
pub fn comfy_discards_penultimate_sigma(name: &str) -> bool {
    matches!(name, "dpm_2" | "dpm_2_ancestral" | "uni_pc" | "uni_pc_bh2")
}
