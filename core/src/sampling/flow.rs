//! The noise levels of rectified-flow models (SD3, FLUX, and the DiT families after them):
//! how σ follows the timestep under each family's shift, as ComfyUI's
//! `ModelSamplingDiscreteFlow` (SD3's `time_snr_shift`) and `ModelSamplingFlux`
//! (`flux_time_shift`) compute them, and the resolution-dependent μ of FLUX.
//!
//! A flow model's latent at σ is `(1 − σ)·x₀ + σ·ε` and its output the velocity `ε − x₀`,
//! so the denoised estimate is `x − σ·v` and σ runs from 1 (noise) to 0.

use super::schedule::DiscreteSchedule;
use super::SamplingError;

/// The shift of a flow model's σ(t), t ∈ (0, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FlowShift {
    /// SD3 and most later DiTs: `σ = s·t / (1 + (s − 1)·t)` (ComfyUI's `time_snr_shift`,
    /// sd.cpp's `DiscreteFlowDenoiser`). `s` = 1 is no shift (FLUX schnell).
    Snr(f64),
    /// FLUX dev: `σ = e^μ / (e^μ + 1/t − 1)` (ComfyUI's `flux_time_shift`, sd.cpp's
    /// `FluxFlowDenoiser`): an SNR shift by e^μ.
    Flux(f64),
}

/// ComfyUI's table length for each kind (`ModelSamplingDiscreteFlow`: 1000 timesteps,
/// `ModelSamplingFlux`: 10000).
fn table_len(shift: FlowShift) -> usize {
    match shift {
        FlowShift::Snr(_) => 1000,
        FlowShift::Flux(_) => 10_000,
    }
}

/// FLUX.2's empirical shift μ for `seq` image tokens and `steps` steps (BFL's
/// `compute_empirical_mu`, diffusers' and sd.cpp's `flux2` scheduler, ComfyUI's
/// Flux2Scheduler): linear in the token count past 4300 tokens, below it interpolated
/// between its 10- and 200-step fits.
pub fn flux2_mu(seq: f64, steps: usize) -> f64 {
    let (a1, b1) = (8.73809524e-05, 1.89833333);
    let (a2, b2) = (0.00016927, 0.45666666);
    if seq > 4300.0 {
        return a2 * seq + b2;
    }
    let (m200, m10) = (a2 * seq + b2, a1 * seq + b1);
    let a = (m200 - m10) / 190.0;
    a * steps as f64 + (m200 - 200.0 * a)
}

impl FlowShift {
    /// σ at t, in f32 as ComfyUI computes it on its float32 timestep tensor (the shift a
    /// Python float rounded into the product).
    pub fn sigma(self, t: f32) -> f32 {
        match self {
            FlowShift::Snr(s) if s == 1.0 => t,
            FlowShift::Snr(s) => {
                let s = s as f32;
                s * t / (1.0 + (s - 1.0) * t)
            }
            FlowShift::Flux(mu) => {
                let e = mu.exp() as f32;
                e / (e + (1.0 / t - 1.0))
            }
        }
    }

    /// ComfyUI's `percent_to_sigma`: 0 is the start of sampling (σ = 1), 1 the end.
    pub fn percent_to_sigma(self, percent: f32) -> f32 {
        if percent <= 0.0 {
            1.0
        } else if percent >= 1.0 {
            0.0
        } else {
            self.sigma(1.0 - percent)
        }
    }

    /// The model's σ table as ComfyUI builds it: σ(i/T) for i = 1..=T.
    pub fn schedule(self) -> Result<DiscreteSchedule, SamplingError> {
        if !self.is_valid() {
            return Err(SamplingError::InvalidOption { field: "shift", reason: format!("{self:?}: an SNR shift must be positive and finite, μ finite") });
        }
        let n = table_len(self);
        let sigmas: Vec<f32> = (1..=n).map(|i| self.sigma(i as f32 / n as f32)).collect();
        DiscreteSchedule::from_sigmas(sigmas)
    }

    fn is_valid(self) -> bool {
        match self {
            FlowShift::Snr(s) => s.is_finite() && s > 0.0,
            FlowShift::Flux(mu) => mu.is_finite(),
        }
    }
}

/// ComfyUI's `ModelSamplingFlux` node and diffusers' `calculate_shift`: μ grows linearly in
/// the number of 2×2 latent patches, from `base_shift` at 256 to `max_shift` at 4096
/// (1024² pixels).
pub fn flux_mu(width: u32, height: u32, base_shift: f64, max_shift: f64) -> f64 {
    let m = (max_shift - base_shift) / (4096.0 - 256.0);
    let b = base_shift - m * 256.0;
    (width as f64 * height as f64 / (8.0 * 8.0 * 2.0 * 2.0)) * m + b
}

/// sd.cpp's and diffusers' flow sigmas for `steps` steps: `steps` evenly spaced timesteps
/// from 1 down to 1/steps, each shifted, then 0.
pub fn linear_sigmas(shift: FlowShift, steps: usize) -> Vec<f32> {
    let mut out: Vec<f32> = (0..steps).map(|i| shift.sigma(1.0 - i as f32 / steps as f32)).collect();
    out.push(0.0);
    out
}
