//! ComfyUI's model-sampling overrides (its `nodes_model_advanced.py`): what a MODEL
//! predicts and over which noise levels, when the checkpoint does not say or says it
//! wrongly (sd-cli's `--prediction`). They change the MODEL's description only; the
//! weights stay the residency manager's entry.

use crate::values::ModelRef;
use sdflow_core::detect::ModelFamily;
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::sampling::flow::{flux_mu, FlowShift};
use sdflow_core::sampling::schedule::DiscreteSchedule;
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    registry.register(Arc::new(ModelSamplingDiscrete));
    registry.register(Arc::new(ModelSamplingContinuousEdm));
    registry.register(Arc::new(ModelSamplingFlux));
    registry.register(Arc::new(ModelSamplingShift { name: "ModelSamplingSD3", default: 3.0, thousand: true }));
    registry.register(Arc::new(ModelSamplingShift { name: "ModelSamplingAuraFlow", default: 1.73, thousand: false }));
}

const CATEGORY: &str = "advanced/model";

/// The MODEL with another prediction and schedule; a flow model keeps sampling as one.
fn with_sampling(model: &ModelRef, prediction: Prediction, schedule: DiscreteSchedule) -> Result<Outputs, NodeError> {
    if model.flow.is_some() {
        return Err(NodeError::msg(format!("this {} model samples as a rectified flow: its sampling is set by ModelSamplingFlux", model.family)));
    }
    let mut m = model.clone();
    m.prediction = prediction;
    m.schedule = schedule;
    if let ModelFamily::Sd2 { .. } = m.family {
        m.family = ModelFamily::Sd2 { v_pred: prediction == Prediction::V };
    }
    Ok(Outputs::new(vec![Value::new(IoType::MODEL, m)]))
}

/// The flow MODEL with another shift: its σ(t) table and percent→σ map.
fn with_flow(model: &ModelRef, shift: FlowShift) -> Result<Outputs, NodeError> {
    let mut m = model.clone();
    m.schedule = shift.schedule().map_err(crate::err)?;
    m.flow = Some(shift);
    Ok(Outputs::new(vec![Value::new(IoType::MODEL, m)]))
}

/// eps or v-prediction over SD's discrete schedule, optionally rescaled to zero terminal
/// SNR. ComfyUI's `lcm`, `x0` and `img_to_img` samplings are not offered.
struct ModelSamplingDiscrete;

impl Node for ModelSamplingDiscrete {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ModelSamplingDiscrete")
            .display_name("ModelSamplingDiscrete")
            .category(CATEGORY)
            .description("Sets what the model predicts (sd-cli's --prediction eps / v) over SD's 1000-step schedule; zsnr rescales that schedule to zero terminal SNR, for models trained so.")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::combo("sampling", ["eps", "v_prediction"]))
            .input(InputSpec::boolean("zsnr", false))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let prediction = match inputs.string("sampling")? {
            "eps" => Prediction::Epsilon,
            "v_prediction" => Prediction::V,
            other => return Err(NodeError::msg(format!("sampling `{other}` is not supported (eps, v_prediction)"))),
        };
        let schedule = if inputs.boolean("zsnr")? { DiscreteSchedule::sd().zero_terminal_snr() } else { DiscreteSchedule::sd() };
        with_sampling(model, prediction, schedule)
    }
}

/// EDM v-prediction over a continuous log-uniform sigma range (CosXL's; sd-cli's
/// `--prediction edm_v`). ComfyUI's other EDM samplings are not offered.
struct ModelSamplingContinuousEdm;

impl Node for ModelSamplingContinuousEdm {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ModelSamplingContinuousEDM")
            .display_name("ModelSamplingContinuousEDM")
            .category(CATEGORY)
            .description("EDM v-prediction between sigma_min and sigma_max (CosXL; sd-cli's --prediction edm_v).")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::combo("sampling", ["v_prediction"]))
            .input(InputSpec::float("sigma_max", 120.0).float_range(0.0, 1000.0).float_step(0.001))
            .input(InputSpec::float("sigma_min", 0.002).float_range(0.0, 1000.0).float_step(0.001))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        if inputs.string("sampling")? != "v_prediction" {
            return Err(NodeError::msg("only v_prediction is supported"));
        }
        let (hi, lo) = (inputs.float("sigma_max")? as f32, inputs.float("sigma_min")? as f32);
        let schedule = DiscreteSchedule::edm(lo, hi).map_err(crate::err)?;
        with_sampling(model, Prediction::EdmV, schedule)
    }
}

/// FLUX.1's resolution-dependent shift: μ from the image size, between `base_shift` at
/// 256² and `max_shift` at 1024² (ComfyUI's node; sd.cpp's `flux` scheduler does the same).
struct ModelSamplingFlux;

impl Node for ModelSamplingFlux {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ModelSamplingFlux")
            .display_name("ModelSamplingFlux")
            .category(CATEGORY)
            .description("Shifts a FLUX.1 model's noise levels by the image size: mu from base_shift at 256x256 to max_shift at 1024x1024.")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::float("max_shift", 1.15).float_range(0.0, 100.0).float_step(0.01))
            .input(InputSpec::float("base_shift", 0.5).float_range(0.0, 100.0).float_step(0.01))
            .input(InputSpec::int("width", 1024).int_range(16, 16384).int_step(8))
            .input(InputSpec::int("height", 1024).int_range(16, 16384).int_step(8))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        if !matches!(model.family, ModelFamily::Flux | ModelFamily::Chroma | ModelFamily::Flux2 | ModelFamily::QwenImage) {
            return Err(NodeError::msg(format!("ModelSamplingFlux needs a FLUX.1, Chroma, FLUX.2 or Qwen-Image model, not {}", model.family)));
        }
        let (max, base) = (inputs.float("max_shift")?, inputs.float("base_shift")?);
        let (w, h) = (inputs.int("width")?, inputs.int("height")?);
        if !(0.0..=100.0).contains(&max) || !(0.0..=100.0).contains(&base) || !(16..=16384).contains(&w) || !(16..=16384).contains(&h) {
            return Err(NodeError::msg(format!("max_shift {max}, base_shift {base} (0..=100) or size {w}x{h} (16..=16384) out of range")));
        }
        with_flow(model, FlowShift::Flux(flux_mu(w as u32, h as u32, base, max)))
    }
}

/// ComfyUI's ModelSamplingSD3 and ModelSamplingAuraFlow: a flow model over SD3's shifted
/// schedule, σ(t) = s·t / (1 + (s − 1)·t). They differ in what the model is told: 1000·σ
/// (SD3's MMDiT, Wan) or σ itself (AuraFlow's multiplier 1: FLUX, and what Chroma's, Z-Image's and
/// Qwen-Image's templates use). Here each model reads its own, so each node takes the models
/// that read what it tells, and names the other node for the rest.
struct ModelSamplingShift {
    name: &'static str,
    default: f64,
    /// The model is told 1000·σ (ModelSamplingSD3), else σ.
    thousand: bool,
}

impl Node for ModelSamplingShift {
    fn schema(&self) -> NodeSchema {
        let what = if self.thousand { "SD3 / SD3.5, Wan" } else { "FLUX" };
        NodeSchema::new(self.name)
            .display_name(self.name)
            .category(CATEGORY)
            .description(format!("Samples a flow model ({what}) over SD3's shifted schedule, sigma = s*t / (1 + (s - 1)*t) (sd-cli's --flow-shift)."))
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::float("shift", self.default).float_range(0.0, 100.0).float_step(0.01))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        if model.flow.is_none() {
            return Err(NodeError::msg(format!("{} needs a flow model; this {} model predicts {:?}", self.name, model.family, model.prediction)));
        }
        if matches!(model.family, ModelFamily::Sd3 | ModelFamily::Wan) != self.thousand {
            let other = if self.thousand { "ModelSamplingAuraFlow or ModelSamplingFlux" } else { "ModelSamplingSD3" };
            return Err(NodeError::msg(format!("{} tells the model {}; {} models read the other: use {other}", self.name, if self.thousand { "1000·σ" } else { "σ" }, model.family)));
        }
        let shift = inputs.float("shift")?;
        if !(shift > 0.0 && shift <= 100.0) {
            return Err(NodeError::msg(format!("shift {shift} is outside (0, 100]")));
        }
        with_flow(model, FlowShift::Snr(shift))
    }
}
