//! AnimateDiff on SD1.5 as AnimateDiff-Evolved's Gen1 loader gives it: the motion modules
//! attached to the MODEL, whose latent batch then samples as the frames of one video, and
//! the noise schedule the modules were trained with.

use crate::err;
use crate::runtime::Runtime;
use crate::values::{ModelRef, MotionModuleRef, V1GroupNorm};
use sdflow_core::detect::ModelFamily;
use sdflow_core::io::{self, TypeRules};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::sd::motion::{standalone_source, MotionConfig, MotionModules};
use sdflow_core::models::sd::unet::UnetConfig;
use sdflow_core::placement::Module;
use sdflow_core::residency::{Device, WeightKey};
use sdflow_core::sampling::schedule::{BetaSchedule, DiscreteSchedule, TIMESTEPS};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Value};
use std::path::PathBuf;
use std::sync::Arc;

/// AnimateDiff-Evolved's folder of motion modules.
pub const MOTION_DIR: &str = "animatediff_models";

/// The `beta_schedule` choices implemented here, by AnimateDiff-Evolved's names (its
/// LCM and SDXL ones are not).
const BETA_SCHEDULES: [&str; 8] = ["autoselect", "use existing", "sqrt_linear (AnimateDiff)", "linear (HotshotXL/default)", "avg(sqrt_linear,linear)", "sqrt", "cosine", "squaredcos_cap_v2"];

/// sdflow's `v1_groupnorm` choices.
const V1_GROUPNORM: [&str; 2] = ["across frames", "per frame"];

/// The model's noise levels under AnimateDiff-Evolved's `beta_schedule` (ComfyUI's
/// `ModelSamplingDiscrete` over 0.00085…0.012); `None`: the model's own.
pub fn beta_schedule(name: &str) -> Result<Option<DiscreteSchedule>, NodeError> {
    let table = |kind| DiscreteSchedule::beta_schedule(kind, 0.00085, 0.012, TIMESTEPS).map_err(err);
    Ok(Some(match name {
        "use existing" => return Ok(None),
        // SD1.5 modules (v1, v2, v3) were trained on linear betas.
        "autoselect" | "sqrt_linear (AnimateDiff)" => table(BetaSchedule::SqrtLinear)?,
        "linear (HotshotXL/default)" => table(BetaSchedule::Linear)?,
        "avg(sqrt_linear,linear)" => {
            let (a, b) = (table(BetaSchedule::Linear)?, table(BetaSchedule::SqrtLinear)?);
            DiscreteSchedule::from_sigmas(a.sigmas().iter().zip(b.sigmas()).map(|(x, y)| (x + y) / 2.0).collect()).map_err(err)?
        }
        "sqrt" => table(BetaSchedule::Sqrt)?,
        "cosine" => table(BetaSchedule::Cosine)?,
        "squaredcos_cap_v2" => table(BetaSchedule::SquaredCosCapV2)?,
        other => return Err(NodeError::InvalidInput { input: "beta_schedule".into(), message: format!("`{other}` is not one of {}", BETA_SCHEDULES.join(", ")) }),
    }))
}

/// AnimateDiff-Evolved's "AnimateDiff Loader 🎭🅐🅓①".
pub(super) struct AnimateDiffLoaderGen1 {
    pub(super) rt: Arc<Runtime>,
}

impl AnimateDiffLoaderGen1 {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(MOTION_DIR, inputs.string("model_name")?).map_err(NodeError::msg)
    }
}

impl Node for AnimateDiffLoaderGen1 {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ADE_AnimateDiffLoaderGen1")
            .display_name("AnimateDiff Loader 🎭🅐🅓①")
            .category("Animate Diff 🎭🅐🅓/① Gen1 nodes ①")
            .description("Adds an AnimateDiff motion module (SD1.5: v1, v2, v3) to the model: the latent batch then samples as the frames of one video (at most as many as the module's positional table, 24 or 32).")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::combo("model_name", self.rt.list_models(MOTION_DIR)).tooltip("A motion module from models/animatediff_models (original or diffusers MotionAdapter names)."))
            .input(InputSpec::combo("beta_schedule", BETA_SCHEDULES).combo_default("autoselect").tooltip("The noise schedule to sample with: autoselect takes the one SD1.5 motion modules were trained on (linear betas, sqrt_linear); use existing keeps the checkpoint's."))
            .input(InputSpec::combo("v1_groupnorm", V1_GROUPNORM).combo_default(V1_GROUPNORM[0]).optional().tooltip("sdflow: where a v1 module's UNet takes its GroupNorm statistics — over the video's frames as v1 was trained and AnimateDiff-Evolved runs it, or per frame as sd.cpp does. v2 and v3 always normalise per frame."))
            .output("MODEL", IoType::MODEL)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let name = inputs.string("model_name")?.to_string();
        if model.family != ModelFamily::Sd1 {
            return Err(NodeError::msg(format!("{name}: AnimateDiff motion modules animate SD1.x models; this model is {}", model.family)));
        }
        let path = self.path(inputs)?;
        let key = WeightKey::new([&path], "animatediff:", self.rt.weight_type, Device::Cpu).map_err(err)?;
        let (file, wt) = (path.clone(), self.rt.weight_type);
        let weights = self.rt.weights(Module::Diffusion, key, move |memory| {
            let src = standalone_source(io::open(&file)?)?;
            Ok(load_weights(memory, src.as_ref(), &[""], &TypeRules::new(wt, "")?)?)
        })?;
        let named = |e: sdflow_core::models::ModelError| NodeError::msg(format!("{name}: {e}"));
        {
            let w = self.rt.pin(Module::Diffusion, &weights)?;
            let modules = MotionModules::new(&w, MotionConfig::infer(&w).map_err(named)?).map_err(named)?;
            let unet = model.weights.pin().map_err(err)?;
            UnetConfig::infer(&unet, &model.prefix).map_err(err)?.check_motion(&modules.config).map_err(named)?;
        }
        let mut out = model.clone();
        if let Some(s) = beta_schedule(inputs.string("beta_schedule")?)? {
            out.schedule = s;
        }
        let v1_groupnorm = match inputs.contains("v1_groupnorm").then(|| inputs.string("v1_groupnorm")).transpose()? {
            None => V1GroupNorm::AcrossFrames,
            Some(s) if s == V1_GROUPNORM[0] => V1GroupNorm::AcrossFrames,
            Some(s) if s == V1_GROUPNORM[1] => V1GroupNorm::PerFrame,
            Some(other) => return Err(NodeError::InvalidInput { input: "v1_groupnorm".into(), message: format!("`{other}` is not one of {}", V1_GROUPNORM.join(", ")) }),
        };
        out.motion = Some(Arc::new(MotionModuleRef { weights, name, v1_groupnorm }));
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, out)]))
    }
}
