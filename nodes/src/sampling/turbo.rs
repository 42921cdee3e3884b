//! ComfyUI's SDTurboScheduler and SetFirstSigma (`comfy_extras/nodes_custom_sampler.py`).

use crate::sampling::Sigmas;
use crate::values::ModelRef;
use sdflow_core::models::conditioning::Prediction;
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use serde_json::json;
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    registry.register(Arc::new(SdTurboScheduler));
    registry.register(Arc::new(SetFirstSigma));
}

/// The timesteps SD-Turbo was distilled on, from the noisiest: 999, 899, …, 99.
const TURBO_TIMESTEPS: [u32; 10] = [999, 899, 799, 699, 599, 499, 399, 299, 199, 99];

/// SDTurboScheduler's σs: `steps` of the turbo timesteps, starting `10 − ⌊10·denoise⌋`
/// in, through the model's σ(t) table, then 0. Only models with a discrete timestep
/// table (SD1.x/2.x/SDXL, the turbo models' families) have σ at these timesteps.
pub fn turbo_sigmas(model: &ModelRef, steps: usize, denoise: f64) -> Result<Vec<f32>, NodeError> {
    if !matches!(model.prediction, Prediction::Epsilon | Prediction::V) || model.schedule.is_empty() {
        return Err(NodeError::InvalidInput {
            input: "model".into(),
            message: format!("SDTurboScheduler needs a model with discrete timesteps (SD1.x, SD2.x, SDXL); this one is {:?} ({:?})", model.family, model.prediction),
        });
    }
    if !(0.0..=1.0).contains(&denoise) {
        return Err(NodeError::InvalidInput { input: "denoise".into(), message: format!("must be within 0..1, got {denoise}") });
    }
    // Python's `int(10 * denoise)`: truncation of the float product (10·0.7 is 7.000…1).
    let start = 10 - (10.0 * denoise).trunc() as usize;
    let mut sigmas: Vec<f32> = TURBO_TIMESTEPS.iter().skip(start).take(steps).map(|&t| model.schedule.t_to_sigma(t as f32)).collect();
    sigmas.push(0.0);
    Ok(sigmas)
}

struct SdTurboScheduler;

impl Node for SdTurboScheduler {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SDTurboScheduler")
            .category("sampling/custom_sampling/schedulers")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::int("steps", 1).int_range(1, 10))
            .input(InputSpec::float("denoise", 1.0).float_range(0.0, 1.0).float_step(0.01))
            .output("SIGMAS", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let steps = inputs.int("steps")?;
        let steps = usize::try_from(steps).map_err(|_| NodeError::InvalidInput { input: "steps".into(), message: format!("must be >= 0, got {steps}") })?;
        let sigmas = turbo_sigmas(model, steps, inputs.float("denoise")?)?;
        Ok(Outputs::new(vec![Value::new(IoType::SIGMAS, Sigmas(sigmas))]))
    }
}

/// SetFirstSigma: the schedule with its first σ replaced.
struct SetFirstSigma;

impl Node for SetFirstSigma {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SetFirstSigma")
            .category("sampling/custom_sampling/sigmas")
            .input(InputSpec::link("sigmas", IoType::SIGMAS))
            .input(InputSpec::float("sigma", 136.0).float_range(0.0, 20000.0).float_step(0.001).extra("round", json!(false)))
            .output("SIGMAS", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut sigmas = inputs.downcast::<Sigmas>("sigmas")?.0.clone();
        let sigma = inputs.float("sigma")?;
        let Some(first) = sigmas.first_mut() else {
            return Err(NodeError::InvalidInput { input: "sigmas".into(), message: "the schedule is empty: there is no first sigma to set".into() });
        };
        *first = sigma as f32;
        Ok(Outputs::new(vec![Value::new(IoType::SIGMAS, Sigmas(sigmas))]))
    }
}
