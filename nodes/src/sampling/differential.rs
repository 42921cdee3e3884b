//! ComfyUI's DifferentialDiffusion (`comfy_extras/nodes_differential_diffusion.py`): a
//! MODEL patch under which a graded inpainting mask reveals its pixels gradually. At each
//! model call the noise mask becomes `mask >= threshold`, the threshold sliding from 1 at
//! the schedule's first σ to 0 at its end, so a pixel masked at 0.3 is held at the image
//! for the first 70% of the way (in the model's timesteps) and denoised after.

use crate::values::{DifferentialDiffusion, ModelRef};
use sdflow_core::detect::ModelFamily;
use sdflow_core::models::conditioning::Prediction;
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    registry.register(Arc::new(DifferentialDiffusionNode));
}

/// A model's timestep for σ, as its ComfyUI model sampling's `timestep` computes it: the
/// thresholds are fractions of the way in these units, not in σ.
#[derive(Clone, Debug)]
enum Timestep {
    /// ModelSamplingDiscrete (eps, v): the index of the nearest σ of the table, an integer.
    Nearest(sdflow_core::sampling::schedule::DiscreteSchedule),
    /// ModelSamplingContinuousEDM: `0.25·ln σ`.
    LogQuarter,
    /// Flow models: `σ·multiplier` (1000 for SD3's ModelSamplingDiscreteFlow, 1 for
    /// ModelSamplingFlux and AuraFlow's).
    Scaled(f32),
}

impl Timestep {
    fn of(&self, sigma: f32) -> f32 {
        match self {
            Timestep::Nearest(s) => s.nearest_timestep(sigma) as f32,
            Timestep::LogQuarter => 0.25 * sigma.ln(),
            Timestep::Scaled(k) => sigma * k,
        }
    }
}

/// The per-call threshold of one sampling run: the schedule's ends in timesteps.
#[derive(Clone, Debug)]
pub struct DifferentialThreshold {
    timestep: Timestep,
    ts_from: f32,
    ts_to: f32,
}

impl DifferentialThreshold {
    /// From the model and the σ list the sampler was given (ComfyUI's `step_sigmas`): from
    /// its first σ to its last, or the model's smallest σ when the list ends below it.
    pub fn new(model: &ModelRef, sigmas: &[f32]) -> Self {
        let timestep = if model.flow.is_some() {
            Timestep::Scaled(if model.family == ModelFamily::Sd3 { 1000.0 } else { 1.0 })
        } else if model.prediction == Prediction::EdmV {
            Timestep::LogQuarter
        } else {
            Timestep::Nearest(model.schedule.clone())
        };
        let sigma_from = sigmas.first().copied().unwrap_or(0.0);
        let last = sigmas.last().copied().unwrap_or(0.0);
        let sigma_to = if last > model.schedule.sigma_min() { last } else { model.schedule.sigma_min() };
        let (ts_from, ts_to) = (timestep.of(sigma_from), timestep.of(sigma_to));
        DifferentialThreshold { timestep, ts_from, ts_to }
    }

    /// The threshold at a model call at `sigma`: 1 at the first σ, 0 at the last. A schedule
    /// whose ends share one timestep gives NaN or ±∞ (ComfyUI's division by zero), and so an
    /// all-zero binary mask, as there.
    pub fn at(&self, sigma: f32) -> f32 {
        (self.timestep.of(sigma) - self.ts_to) / (self.ts_from - self.ts_to)
    }
}

impl DifferentialDiffusion {
    /// The mask at a call with this threshold. ComfyUI tests `strength and strength < 1`,
    /// so 0 (falsy) gives the binary mask just as 1 does.
    pub fn apply(&self, mask: &[f32], threshold: f32) -> Vec<f32> {
        let s = self.strength;
        let mixed = s != 0.0 && s < 1.0;
        mask.iter()
            .map(|&m| {
                let binary = if m >= threshold { 1.0 } else { 0.0 };
                if mixed {
                    s * binary + (1.0 - s) * m
                } else {
                    binary
                }
            })
            .collect()
    }
}

struct DifferentialDiffusionNode;

impl Node for DifferentialDiffusionNode {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("DifferentialDiffusion")
            .display_name("Differential Diffusion")
            .category("_for_testing")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::float("strength", 1.0).float_range(0.0, 1.0).float_step(0.01).optional())
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut model = inputs.downcast::<ModelRef>("model")?.clone();
        let strength = if inputs.contains("strength") { inputs.float("strength")? } else { 1.0 };
        if !(0.0..=1.0).contains(&strength) {
            return Err(NodeError::InvalidInput { input: "strength".into(), message: format!("{strength} is outside 0..=1") });
        }
        model.differential_diffusion = Some(DifferentialDiffusion { strength: strength as f32 });
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, model)]))
    }
}
