//! Noise schedules, samplers and the seeded RNGs they draw from.
//!
//! Everything here is plain Rust over `&[f32]` latents: the element-wise sampler math is cheap
//! next to the denoiser call, which the caller supplies as a callback (and runs on ggml).
//!
//! - [`rng`]: `cpu` (torch CPU, both of its kernels), `cuda` (Philox, torch CUDA),
//!   `std_default` (libstdc++), all bit-exact with their references.
//! - [`schedule`]: the SD discrete model schedule and every sd.cpp / ComfyUI scheduler.
//! - [`samplers`]: ComfyUI's full sampler list and sd.cpp's samplers, generic over the
//!   denoiser, for SD-style (eps / v) and rectified-flow models.
//! - [`flow`]: the σ(t) of rectified-flow models under each family's shift.
//! - [`brownian`]: a seeded Brownian-tree noise source for the SDE samplers.
//! - [`variation`]: A1111's variation seeds (the slerp of two seeds' noise).

pub mod brownian;
pub mod flow;
mod gits_table;
pub mod rng;
pub mod samplers;
pub mod schedule;
pub mod variation;

pub use brownian::BrownianTreeNoise;
pub use rng::{CpuKernel, CpuRng, PerSampleRng, PhiloxRng, Rng, RngKind, StdDefaultRng};
pub use samplers::{
    ancestral_step, ancestral_step_flow, comfy_discards_penultimate_sigma, sample, Denoised, Model, Progress, SampleError,
    SampleOpts, Sampler,
};
pub use schedule::{
    apply_denoise, ksampler_sigmas, parse_sigmas, strength_sigmas, validate_sigmas, AysModel, DiscreteSchedule,
    ScheduleOpts, Scheduler,
};

/// Errors from parsing names and building schedules.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("unknown {what} name {name:?}; valid names: {valid}")]
    UnknownName {
        what: &'static str,
        name: String,
        valid: String,
    },
    #[error("invalid sigmas: {0}")]
    InvalidSigmas(String),
    #[error("invalid {field}: {reason}")]
    InvalidOption { field: &'static str, reason: String },
}
