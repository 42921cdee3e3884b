//! More of ComfyUI's custom-sampling schedule and sigma nodes (`nodes_custom_sampler.py`):
//! PolyexponentialScheduler, LaplaceScheduler and VPScheduler (k-diffusion's schedules),
//! BetaSamplingScheduler, FlipSigmas, SplitSigmasDenoise, ExtendIntermediateSigmas,
//! SamplingPercentToSigma and AddNoise; FLUX.2's Flux2Scheduler (`nodes_flux.py`).
//!
//! Schedules are float32 tensors in ComfyUI, built from torch's float32 `linspace`; they
//! are computed here the same way, so a schedule fed to a sampler is the same list.

use crate::image::latent_ops::{invalid, py_slice};
use crate::runtime::Runtime;
use crate::sampling::{NoiseSource, Sigmas};
use crate::values::{Latent, ModelRef};
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::sampling::flow::FlowShift;
use sdflow_core::sampling::schedule::{ScheduleOpts, Scheduler};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    use SigmaNode::*;
    for n in [Polyexponential, Laplace, Vp, Beta, Flip, SplitDenoise, ExtendIntermediate, PercentToSigma] {
        registry.register(Arc::new(n));
    }
    registry.register(Arc::new(AddNoise { rt: rt.clone() }));
    registry.register(Arc::new(Flux2Scheduler));
}

/// FLUX.2's schedule: `steps` evenly spaced times from 1 to 0 (torch's float32 linspace),
/// shifted by the empirical μ of the image's 16×16-pixel tokens (ComfyUI's `get_schedule`).
pub fn flux2_sigmas(steps: usize, width: i64, height: i64) -> Vec<f32> {
    let seq = ((width * height) as f64 / 256.0).round();
    let shift = FlowShift::Flux(sdflow_core::sampling::flow::flux2_mu(seq, steps));
    linspace(1.0, 0.0, steps + 1).into_iter().map(|t| if t <= 0.0 { 0.0 } else { shift.sigma(t) }).collect()
}

/// ComfyUI's "Flux2Scheduler".
struct Flux2Scheduler;

impl Node for Flux2Scheduler {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("Flux2Scheduler")
            .display_name("Flux2Scheduler")
            .category(SCHEDULERS)
            .description("FLUX.2's schedule: steps from 1 to 0, shifted by its empirical mu for the image's token count and the step count.")
            .input(InputSpec::int("steps", 20).int_range(1, 4096))
            .input(InputSpec::int("width", 1024).int_range(1, 16384))
            .input(InputSpec::int("height", 1024).int_range(1, 16384))
            .output("SIGMAS", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (steps, w, h) = (inputs.int("steps")?, inputs.int("width")?, inputs.int("height")?);
        if !(1..=4096).contains(&steps) || !(1..=16384).contains(&w) || !(1..=16384).contains(&h) {
            return Err(NodeError::msg(format!("steps {steps} (1..=4096) or size {w}x{h} (1..=16384) out of range")));
        }
        Ok(Outputs::new(vec![Value::new(IoType::SIGMAS, Sigmas(flux2_sigmas(steps as usize, w, h)))]))
    }
}

const SCHEDULERS: &str = "sampling/custom_sampling/schedulers";
const SIGMAS: &str = "sampling/custom_sampling/sigmas";

/// torch's float32 `linspace(start, end, n)`: the first half counted up from the start,
/// the rest down from the end.
fn linspace(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    (0..n).map(|i| if i < n / 2 { start + step * i as f32 } else { end - step * (n - 1 - i) as f32 }).collect()
}

/// k-diffusion's `get_sigmas_polyexponential`: a polynomial in log σ, then 0.
pub fn polyexponential(n: usize, sigma_min: f64, sigma_max: f64, rho: f64) -> Vec<f32> {
    let (lmin, lmax) = (sigma_min.ln(), sigma_max.ln());
    let (span, lmin) = ((lmax - lmin) as f32, lmin as f32);
    let mut s: Vec<f32> = linspace(1.0, 0.0, n).iter().map(|r| (r.powf(rho as f32) * span + lmin).exp()).collect();
    s.push(0.0);
    s
}

/// k-diffusion's `get_sigmas_laplace` (Tiankai et al. 2024); no final 0, as there.
pub fn laplace(n: usize, sigma_min: f64, sigma_max: f64, mu: f64, beta: f64) -> Vec<f32> {
    let (mu, beta) = (mu as f32, beta as f32);
    linspace(0.0, 1.0, n)
        .iter()
        .map(|&x| {
            let d = 0.5 - x;
            let sign = if d > 0.0 {
                1.0
            } else if d < 0.0 {
                -1.0
            } else {
                0.0
            };
            let lmb = mu - beta * sign * (1.0 - 2.0 * d.abs() + 1e-5).ln();
            lmb.exp().max(sigma_min as f32).min(sigma_max as f32)
        })
        .collect()
}

/// k-diffusion's `get_sigmas_vp`: the continuous VP schedule, then 0.
pub fn vp(n: usize, beta_d: f64, beta_min: f64, eps_s: f64) -> Vec<f32> {
    let (bd, bm) = (beta_d as f32, beta_min as f32);
    let mut s: Vec<f32> = linspace(1.0, eps_s as f32, n).iter().map(|&t| (bd * (t * t) / 2.0 + bm * t).exp_m1().sqrt()).collect();
    s.push(0.0);
    s
}

/// ComfyUI's `percent_to_sigma` of the model's sampling, as its model-sampling classes
/// compute it: Python floats for the flows and EDM, a float32 interpolation in the σ table
/// for discrete models (at timestep `(1 − p)·999`).
pub fn percent_to_sigma(model: &ModelRef, percent: f64) -> f64 {
    let flow = model.flow;
    if percent <= 0.0 {
        return if flow.is_some() { 1.0 } else { 999_999_999.9 };
    }
    if percent >= 1.0 {
        return 0.0;
    }
    let t = 1.0 - percent;
    match flow {
        Some(FlowShift::Snr(1.0)) => t,
        Some(FlowShift::Snr(s)) => s * t / (1.0 + (s - 1.0) * t),
        Some(FlowShift::Flux(mu)) => mu.exp() / (mu.exp() + (1.0 / t - 1.0)),
        None if model.prediction == Prediction::EdmV => {
            let (lo, hi) = ((model.schedule.sigma_min() as f64).ln(), (model.schedule.sigma_max() as f64).ln());
            ((hi - lo) * t + lo).exp()
        }
        None => model.schedule.t_to_sigma((t * 999.0) as f32) as f64,
    }
}

#[derive(Clone, Copy, Debug)]
enum SigmaNode {
    Polyexponential,
    Laplace,
    Vp,
    Beta,
    Flip,
    SplitDenoise,
    ExtendIntermediate,
    PercentToSigma,
}

fn sigmas_out(s: Vec<f32>) -> Outputs {
    Outputs::new(vec![Value::new(IoType::SIGMAS, Sigmas(s))])
}

fn steps(inputs: &Inputs, name: &str, max: i64) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    if !(1..=max).contains(&v) {
        return Err(invalid(name, format!("{v} is outside 1..={max}")));
    }
    Ok(v as usize)
}

fn finite(inputs: &Inputs, name: &str) -> Result<f64, NodeError> {
    let v = inputs.float(name)?;
    if !v.is_finite() {
        return Err(invalid(name, format!("{v} is not a finite number")));
    }
    Ok(v)
}

/// A σ of a range whose logarithm is taken: Python's `math.log` fails at 0 and below.
fn positive(inputs: &Inputs, name: &str) -> Result<f64, NodeError> {
    let v = finite(inputs, name)?;
    if v <= 0.0 {
        return Err(invalid(name, format!("must be above 0 (its logarithm is taken), got {v}")));
    }
    Ok(v)
}

fn range_inputs(s: NodeSchema) -> NodeSchema {
    s.input(InputSpec::int("steps", 20).int_range(1, 10000))
        .input(InputSpec::float("sigma_max", 14.614642).float_range(0.0, 5000.0).float_step(0.01).extra("round", false.into()))
        .input(InputSpec::float("sigma_min", 0.0291675).float_range(0.0, 5000.0).float_step(0.01).extra("round", false.into()))
}

impl Node for SigmaNode {
    fn schema(&self) -> NodeSchema {
        let unrounded = |name: &str, default: f64, lo: f64, hi: f64, step: f64| InputSpec::float(name, default).float_range(lo, hi).float_step(step).extra("round", false.into());
        let sigmas = || InputSpec::link("sigmas", IoType::SIGMAS);
        match self {
            SigmaNode::Polyexponential => range_inputs(NodeSchema::new("PolyexponentialScheduler").category(SCHEDULERS)).input(unrounded("rho", 1.0, 0.0, 100.0, 0.01)).output("SIGMAS", IoType::SIGMAS),
            SigmaNode::Laplace => range_inputs(NodeSchema::new("LaplaceScheduler").category(SCHEDULERS))
                .input(unrounded("mu", 0.0, -10.0, 10.0, 0.1))
                .input(unrounded("beta", 0.5, 0.0, 10.0, 0.1))
                .output("SIGMAS", IoType::SIGMAS),
            SigmaNode::Vp => NodeSchema::new("VPScheduler")
                .category(SCHEDULERS)
                .input(InputSpec::int("steps", 20).int_range(1, 10000))
                .input(unrounded("beta_d", 19.9, 0.0, 5000.0, 0.01))
                .input(unrounded("beta_min", 0.1, 0.0, 5000.0, 0.01))
                .input(unrounded("eps_s", 0.001, 0.0, 1.0, 0.0001))
                .output("SIGMAS", IoType::SIGMAS),
            SigmaNode::Beta => NodeSchema::new("BetaSamplingScheduler")
                .category(SCHEDULERS)
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::int("steps", 20).int_range(1, 10000))
                .input(unrounded("alpha", 0.6, 0.0, 50.0, 0.01))
                .input(unrounded("beta", 0.6, 0.0, 50.0, 0.01))
                .output("SIGMAS", IoType::SIGMAS),
            SigmaNode::Flip => NodeSchema::new("FlipSigmas").category(SIGMAS).input(sigmas()).output("SIGMAS", IoType::SIGMAS),
            SigmaNode::SplitDenoise => NodeSchema::new("SplitSigmasDenoise")
                .category(SIGMAS)
                .input(sigmas())
                .input(InputSpec::float("denoise", 1.0).float_range(0.0, 1.0).float_step(0.01))
                .output("high_sigmas", IoType::SIGMAS)
                .output("low_sigmas", IoType::SIGMAS),
            SigmaNode::ExtendIntermediate => NodeSchema::new("ExtendIntermediateSigmas")
                .category(SIGMAS)
                .input(sigmas())
                .input(InputSpec::int("steps", 2).int_range(1, 100))
                .input(unrounded("start_at_sigma", -1.0, -1.0, 20000.0, 0.01))
                .input(unrounded("end_at_sigma", 12.0, 0.0, 20000.0, 0.01))
                .input(InputSpec::combo("spacing", ["linear", "cosine", "sine"]))
                .output("SIGMAS", IoType::SIGMAS),
            SigmaNode::PercentToSigma => NodeSchema::new("SamplingPercentToSigma")
                .category(SIGMAS)
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::float("sampling_percent", 0.0).float_range(0.0, 1.0).float_step(0.0001))
                .input(InputSpec::boolean("return_actual_sigma", false).tooltip("Return the actual sigma value instead of the value used for interval checks.\nThis only affects results at 0.0 and 1.0."))
                .output("sigma_value", IoType::FLOAT),
        }
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        match self {
            SigmaNode::Polyexponential => {
                let n = steps(inputs, "steps", 10000)?;
                Ok(sigmas_out(polyexponential(n, positive(inputs, "sigma_min")?, positive(inputs, "sigma_max")?, finite(inputs, "rho")?)))
            }
            SigmaNode::Laplace => {
                let n = steps(inputs, "steps", 10000)?;
                let (lo, hi) = (finite(inputs, "sigma_min")?, finite(inputs, "sigma_max")?);
                Ok(sigmas_out(laplace(n, lo, hi, finite(inputs, "mu")?, finite(inputs, "beta")?)))
            }
            SigmaNode::Vp => {
                let n = steps(inputs, "steps", 10000)?;
                Ok(sigmas_out(vp(n, finite(inputs, "beta_d")?, finite(inputs, "beta_min")?, finite(inputs, "eps_s")?)))
            }
            SigmaNode::Beta => {
                let model = inputs.downcast::<ModelRef>("model")?;
                let n = steps(inputs, "steps", 10000)?;
                let (alpha, beta) = (finite(inputs, "alpha")?, finite(inputs, "beta")?);
                for (name, v) in [("alpha", alpha), ("beta", beta)] {
                    // scipy's Beta quantiles are NaN at 0, and ComfyUI then fails.
                    if v <= 0.0 {
                        return Err(invalid(name, format!("must be above 0, got {v}")));
                    }
                }
                let opts = ScheduleOpts { beta_alpha: alpha, beta_beta: beta, ..ScheduleOpts::default() };
                Ok(sigmas_out(Scheduler::Beta.sigmas(n, &model.schedule, &opts).map_err(|e| invalid("steps", e.to_string()))?))
            }
            SigmaNode::Flip => {
                let mut s = inputs.downcast::<Sigmas>("sigmas")?.0.clone();
                s.reverse();
                if s.first() == Some(&0.0) {
                    s[0] = 0.0001;
                }
                Ok(sigmas_out(s))
            }
            SigmaNode::SplitDenoise => {
                let s = &inputs.downcast::<Sigmas>("sigmas")?.0;
                let denoise = finite(inputs, "denoise")?;
                let steps = s.len().saturating_sub(1);
                // Python: round() half to even, then sigmas[:-total] and sigmas[-(total + 1):],
                // so a total of 0 leaves the high part empty.
                let total = (steps as f64 * denoise).round_ties_even() as i64;
                let len = s.len();
                let high = s[py_slice(len, 0, -total)].to_vec();
                let low = s[py_slice(len, -(total + 1), len as i64)].to_vec();
                Ok(Outputs::new(vec![Value::new(IoType::SIGMAS, Sigmas(high)), Value::new(IoType::SIGMAS, Sigmas(low))]))
            }
            SigmaNode::ExtendIntermediate => {
                let s = &inputs.downcast::<Sigmas>("sigmas")?.0;
                let n = steps(inputs, "steps", 100)?;
                let start = finite(inputs, "start_at_sigma")?;
                let start = if start < 0.0 { f32::INFINITY } else { start as f32 };
                let end = finite(inputs, "end_at_sigma")? as f32;
                let spacing = inputs.string("spacing")?;
                let x = linspace(0.0, 1.0, n + 1);
                let inner = &x[1..n.max(1)];
                let curve: Vec<f32> = match spacing {
                    "linear" => inner.to_vec(),
                    "cosine" => inner.iter().map(|v| (v * std::f32::consts::PI / 2.0).sin()).collect(),
                    "sine" => inner.iter().map(|v| 1.0 - (v * std::f32::consts::PI / 2.0).cos()).collect(),
                    other => return Err(invalid("spacing", format!("`{other}` is not one of linear, cosine, sine"))),
                };
                let mut out = Vec::with_capacity(s.len() * (n + 1));
                for w in s.windows(2) {
                    let (cur, next) = (w[0], w[1]);
                    out.push(cur);
                    if end <= cur && cur <= start {
                        out.extend(curve.iter().map(|c| c * (next - cur) + cur));
                    }
                }
                out.extend(s.last());
                Ok(sigmas_out(out))
            }
            SigmaNode::PercentToSigma => {
                let model = inputs.downcast::<ModelRef>("model")?;
                let p = finite(inputs, "sampling_percent")?;
                let mut sigma = percent_to_sigma(model, p);
                if inputs.boolean("return_actual_sigma")? {
                    if p == 0.0 {
                        sigma = model.schedule.sigma_max() as f64;
                    } else if p == 1.0 {
                        sigma = model.schedule.sigma_min() as f64;
                    }
                }
                Ok(Outputs::new(vec![Value::float(sigma)]))
            }
        }
    }
}

/// ComfyUI's AddNoise: the latent noised to the schedule's span (|first − last| σ, or the
/// one σ) as the model's sampling noises latents, with the NOISE input's noise.
struct AddNoise {
    rt: Arc<Runtime>,
}

impl Node for AddNoise {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("AddNoise")
            .category("_for_testing/custom_sampling/noise")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::link("noise", IoType::NOISE))
            .input(InputSpec::link("sigmas", IoType::SIGMAS))
            .input(InputSpec::link("latent_image", IoType::LATENT))
            .output("LATENT", IoType::LATENT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let noise = *inputs.downcast::<NoiseSource>("noise")?;
        let sigmas = &inputs.downcast::<Sigmas>("sigmas")?.0;
        let latent = inputs.downcast::<Latent>("latent_image")?;
        if sigmas.is_empty() {
            return Ok(Outputs::new(vec![inputs.value("latent_image")?.clone()]));
        }
        let [w, h, c, n] = latent.shape;
        if latent.shape.iter().any(|&d| d < 1) || latent.samples.len() as i64 != w * h * c * n {
            return Err(invalid("latent_image", format!("a latent of {} values is not {:?}", latent.samples.len(), latent.shape)));
        }
        let (eps, _, _) = noise.draw(self.rt.rng, latent)?;
        let scale = if sigmas.len() > 1 { (sigmas[0] - sigmas[sigmas.len() - 1]).abs() } else { sigmas[0] };
        // An empty (all-zero) latent is not shifted into model space, as in ComfyUI.
        let empty = latent.samples.iter().all(|&v| v == 0.0);
        let plane = (w * h) as usize;
        let flow = model.flow.is_some();
        let samples = latent
            .samples
            .iter()
            .zip(&eps)
            .enumerate()
            .map(|(i, (&l, &e))| {
                let x0 = if empty { l } else { model.latent.value_to_model(l, i, plane) };
                let noisy = if flow { scale * e + (1.0 - scale) * x0 } else { e * scale + x0 };
                let v = model.latent.value_from_model(noisy, i, plane);
                if v.is_finite() {
                    v
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, Latent { samples, ..latent.clone() })]))
    }
}

#[cfg(test)]
mod tests {
    /// diffusers' `Flux2KleinPipeline` schedule (FlowMatchEulerDiscreteScheduler with the
    /// empirical μ) at three sizes: below and above the 4300-token knee.
    #[test]
    fn flux2_schedule_matches_diffusers() {
        let cases: [(usize, i64, i64, &[f32]); 3] = [
            (4, 1024, 1024, &[1.0, 0.967384, 0.908144, 0.7672, 0.0]),
            (
                20,
                512,
                768,
                &[1.0, 0.992665, 0.98464, 0.975823, 0.966091, 0.955294, 0.943245, 0.929716, 0.914414, 0.896966, 0.876889, 0.853538, 0.826042, 0.793189, 0.753245, 0.703638, 0.640377, 0.556925, 0.441782, 0.272665, 0.0],
            ),
            (4, 2048, 2048, &[1.0, 0.986986, 0.961947, 0.893915, 0.0]),
        ];
        for (steps, w, h, want) in cases {
            let got = super::flux2_sigmas(steps, w, h);
            assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(want) {
                assert!((g - e).abs() < 2e-5, "{steps} steps at {w}x{h}: {got:?}");
            }
        }
    }
}
