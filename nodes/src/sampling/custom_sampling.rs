//! ComfyUI's custom-sampling nodes: samplers, schedules, noise and guiders as separate
//! values (SAMPLER, SIGMAS, NOISE, GUIDER), and KSamplerAdvanced.

use crate::err;
use crate::runtime::Runtime;
use crate::sampling::{guider_from, rng_from, rng_input, sample_latent, sampler_from, sampler_names, scheduler_names, steps_from, Guider, NoiseSource, SamplerChoice, Sigmas, Variation};
use crate::values::{CondList, Latent, ModelRef};
use sdflow_core::sampling::samplers::{SampleOpts, Sampler};
use sdflow_core::sampling::schedule::{apply_denoise, exponential_sigmas, karras_sigmas, parse_sigmas, ScheduleOpts, Scheduler};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::str::FromStr;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(KSamplerSelect));
    for kind in OptionsSampler::ALL {
        registry.register(Arc::new(kind));
    }
    registry.register(Arc::new(ManualSigmas));
    registry.register(Arc::new(BasicScheduler));
    registry.register(Arc::new(RangeScheduler { karras: true }));
    registry.register(Arc::new(RangeScheduler { karras: false }));
    registry.register(Arc::new(SplitSigmas));
    registry.register(Arc::new(RandomNoise));
    registry.register(Arc::new(DisableNoise));
    registry.register(Arc::new(VariationNoise));
    registry.register(Arc::new(CfgGuider { basic: false }));
    registry.register(Arc::new(CfgGuider { basic: true }));
    registry.register(Arc::new(SamplerCustom { rt: rt.clone(), advanced: false }));
    registry.register(Arc::new(SamplerCustom { rt: rt.clone(), advanced: true }));
    registry.register(Arc::new(KSamplerAdvanced { rt: rt.clone() }));
}

const CATEGORY: &str = "sampling/custom_sampling";

fn one(ty: IoType, v: impl sdflow_executor::CacheSize) -> Outputs {
    Outputs::new(vec![Value::new(ty, v)])
}

struct KSamplerSelect;

impl Node for KSamplerSelect {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("KSamplerSelect").display_name("KSamplerSelect").category(format!("{CATEGORY}/samplers")).input(InputSpec::combo("sampler_name", sampler_names())).output("SAMPLER", IoType::SAMPLER)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let sampler = Sampler::from_str(inputs.string("sampler_name")?).map_err(err)?;
        Ok(one(IoType::SAMPLER, SamplerChoice { sampler, opts: SampleOpts::default() }))
    }
}

/// The SAMPLER nodes that set a sampler's options: ComfyUI's per-sampler nodes
/// (SamplerEulerAncestral, ...) and KSamplerSelectAdvanced, which takes any sampler with
/// sd.cpp's `--eta` and a noise choice (ComfyUI has no node for ddim/tcd/res eta).
#[derive(Clone, Copy)]
enum OptionsSampler {
    EulerAncestral,
    EulerAncestralCfgPp,
    Dpmpp2sAncestral,
    Lms,
    Select,
}

impl OptionsSampler {
    const ALL: [OptionsSampler; 5] = [OptionsSampler::EulerAncestral, OptionsSampler::EulerAncestralCfgPp, OptionsSampler::Dpmpp2sAncestral, OptionsSampler::Lms, OptionsSampler::Select];

    /// Node id, display name and the fixed sampler (none: chosen by `sampler_name`).
    fn describe(self) -> (&'static str, &'static str, Option<Sampler>) {
        match self {
            OptionsSampler::EulerAncestral => ("SamplerEulerAncestral", "SamplerEulerAncestral", Some(Sampler::EulerA)),
            OptionsSampler::EulerAncestralCfgPp => ("SamplerEulerAncestralCFGPP", "SamplerEulerAncestralCFG++", Some(Sampler::EulerACfgPp)),
            OptionsSampler::Dpmpp2sAncestral => ("SamplerDPMPP_2S_Ancestral", "SamplerDPMPP_2S_Ancestral", Some(Sampler::Dpmpp2sA)),
            OptionsSampler::Lms => ("SamplerLMS", "SamplerLMS", Some(Sampler::Lms)),
            OptionsSampler::Select => ("KSamplerSelectAdvanced", "KSamplerSelect (Advanced)", None),
        }
    }
}

/// `eta` and `s_noise` widgets with ComfyUI's ranges (CFG++ keeps eta in 0..=1).
fn eta_inputs(s: NodeSchema, eta_max: f64, s_noise_max: f64) -> NodeSchema {
    s.input(InputSpec::float("eta", 1.0).float_range(0.0, eta_max).float_step(0.01)).input(InputSpec::float("s_noise", 1.0).float_range(0.0, s_noise_max).float_step(0.01))
}

impl Node for OptionsSampler {
    fn schema(&self) -> NodeSchema {
        let (id, display, _) = self.describe();
        let s = NodeSchema::new(id).display_name(display).category(format!("{CATEGORY}/samplers"));
        let s = match self {
            OptionsSampler::EulerAncestral | OptionsSampler::Dpmpp2sAncestral => eta_inputs(s, 100.0, 100.0),
            OptionsSampler::EulerAncestralCfgPp => eta_inputs(s, 1.0, 10.0),
            OptionsSampler::Lms => s.input(InputSpec::int("order", 4).int_range(1, 16).tooltip("How many past derivatives each step combines (ComfyUI allows up to 100; sdflow's coefficients are exact up to 16).")),
            OptionsSampler::Select => s
                .description("Any sampler with sd.cpp's options: --eta, the noise scale and Brownian-tree noise.")
                .input(InputSpec::combo("sampler_name", sampler_names()))
                .input(InputSpec::float("eta", -1.0).float_range(-1.0, 100.0).float_step(0.01).tooltip("sd-cli's --eta: the noise of ancestral and SDE steps (euler_a, dpm++2s_a, er_sde, euler_a_cfg_pp, dpm++2m_sde) and the eta of ddim_trailing, tcd, res_multistep and res_2s. Negative: the sampler's own default, as sd-cli without --eta (1 for the ancestral and SDE samplers, 0 for the others)."))
                .input(InputSpec::float("s_noise", 1.0).float_range(0.0, 100.0).float_step(0.01).tooltip("Scale of every noise draw (k-diffusion's s_noise)."))
                .input(InputSpec::combo("noise", ["sampler", "brownian_tree"]).tooltip("Where per-step noise comes from: the sampler's own (the seeded generator's stream; a Brownian tree for dpm++2m_sde_bt), or a Brownian tree seeded from the generator, which keeps the noise consistent across step counts.")),
        };
        s.output("SAMPLER", IoType::SAMPLER)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (_, _, fixed) = self.describe();
        let sampler = match fixed {
            Some(s) => s,
            None => Sampler::from_str(inputs.string("sampler_name")?).map_err(err)?,
        };
        let mut opts = SampleOpts::default();
        match self {
            OptionsSampler::Lms => opts.lms_order = usize::try_from(inputs.int("order")?).map_err(|_| NodeError::msg("order must be positive"))?,
            OptionsSampler::Select => {
                let eta = inputs.float("eta")?;
                opts.eta = (eta >= 0.0).then_some(eta as f32);
                opts.s_noise = inputs.float("s_noise")? as f32;
                opts.brownian = inputs.string("noise")? == "brownian_tree";
            }
            _ => {
                opts.eta = Some(inputs.float("eta")? as f32);
                opts.s_noise = inputs.float("s_noise")? as f32;
            }
        }
        Ok(one(IoType::SAMPLER, SamplerChoice { sampler, opts }))
    }
}

/// ComfyUI's ManualSigmas: a schedule typed as a list of numbers (sd-cli's `--sigmas`).
struct ManualSigmas;

impl Node for ManualSigmas {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ManualSigmas")
            .display_name("ManualSigmas")
            .category(format!("{CATEGORY}/sigmas"))
            .input(InputSpec::string("sigmas", "1, 0.5").tooltip("Sigmas from high to low, separated by commas or spaces (sd-cli's --sigmas). End with 0 to finish denoised; SD1.x/2.x/XL schedules start near 14.6."))
            .output("SIGMAS", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let sigmas = parse_sigmas(inputs.string("sigmas")?).map_err(err)?;
        Ok(one(IoType::SIGMAS, Sigmas(sigmas)))
    }
}

/// The model's own schedule (`normal`, `karras`, … over its sigma range), with denoise.
struct BasicScheduler;

impl Node for BasicScheduler {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("BasicScheduler")
            .display_name("BasicScheduler")
            .category(format!("{CATEGORY}/schedulers"))
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::combo("scheduler", scheduler_names()))
            .input(InputSpec::int("steps", 20).int_range(1, 10000))
            .input(InputSpec::float("denoise", 1.0).float_range(0.0, 1.0).float_step(0.01))
            .output("SIGMAS", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let scheduler = Scheduler::from_str(inputs.string("scheduler")?).map_err(err)?;
        let sigmas = apply_denoise(scheduler, steps_from(inputs)?, inputs.float("denoise")? as f32, &model.schedule, &ScheduleOpts::default()).map_err(err)?;
        Ok(one(IoType::SIGMAS, Sigmas(sigmas)))
    }
}

/// KarrasScheduler and ExponentialScheduler: a schedule over an explicit sigma range.
struct RangeScheduler {
    karras: bool,
}

impl Node for RangeScheduler {
    fn schema(&self) -> NodeSchema {
        let name = if self.karras { "KarrasScheduler" } else { "ExponentialScheduler" };
        let s = NodeSchema::new(name)
            .display_name(name)
            .category(format!("{CATEGORY}/schedulers"))
            .input(InputSpec::int("steps", 20).int_range(1, 10000))
            .input(InputSpec::float("sigma_max", 14.614642).float_range(0.0, 5000.0).float_step(0.01))
            .input(InputSpec::float("sigma_min", 0.0291675).float_range(0.0, 5000.0).float_step(0.01));
        let s = if self.karras { s.input(InputSpec::float("rho", 7.0).float_range(0.0, 100.0).float_step(0.01)) } else { s };
        s.output("SIGMAS", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (steps, smax, smin) = (steps_from(inputs)?, inputs.float("sigma_max")? as f32, inputs.float("sigma_min")? as f32);
        let sigmas = if self.karras { karras_sigmas(steps, smin, smax, inputs.float("rho")? as f32) } else { exponential_sigmas(steps, smin, smax) };
        Ok(one(IoType::SIGMAS, Sigmas(sigmas.map_err(err)?)))
    }
}

/// Splits a schedule at `step`: the first output runs to it, the second from it.
struct SplitSigmas;

impl Node for SplitSigmas {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SplitSigmas")
            .display_name("SplitSigmas")
            .category(format!("{CATEGORY}/sigmas"))
            .input(InputSpec::link("sigmas", IoType::SIGMAS))
            .input(InputSpec::int("step", 0).int_range(0, 10000))
            .output("high_sigmas", IoType::SIGMAS)
            .output("low_sigmas", IoType::SIGMAS)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let sigmas = &inputs.downcast::<Sigmas>("sigmas")?.0;
        let step = usize::try_from(inputs.int("step")?).map_err(|_| NodeError::msg("step must be >= 0"))?;
        // Python slicing: sigmas[:step + 1] and sigmas[step:], clamped.
        let at = step.min(sigmas.len());
        let high = sigmas[..(step + 1).min(sigmas.len())].to_vec();
        let low = sigmas[at..].to_vec();
        Ok(Outputs::new(vec![Value::new(IoType::SIGMAS, Sigmas(high)), Value::new(IoType::SIGMAS, Sigmas(low))]))
    }
}

struct RandomNoise;

impl Node for RandomNoise {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("RandomNoise").display_name("RandomNoise").category(format!("{CATEGORY}/noise")).input(InputSpec::seed("noise_seed").control_after_generate()).input(rng_input()).output("NOISE", IoType::NOISE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        Ok(one(IoType::NOISE, NoiseSource::new(inputs.uint("noise_seed")?, true, rng_from(inputs)?)))
    }
}

struct DisableNoise;

impl Node for DisableNoise {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("DisableNoise").display_name("DisableNoise").category(format!("{CATEGORY}/noise")).output("NOISE", IoType::NOISE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, _inputs: &Inputs) -> Result<Outputs, NodeError> {
        Ok(one(IoType::NOISE, NoiseSource::new(0, false, None)))
    }
}

/// A1111's seeds as NOISE: every image of the batch draws from a generator of its own, the
/// image at batch position k from `noise_seed + k`'s (initial and steps' noise, as A1111's
/// batches and its `n_iter` count seeds up), and with a variation strength its initial noise
/// is A1111's slerp towards `variation_seed + k`'s noise (the seed then stays `noise_seed`
/// for every image, as A1111 keeps it). ComfyUI has no such node: its RandomNoise draws a
/// batch as one stream.
struct VariationNoise;

impl Node for VariationNoise {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("VariationNoise")
            .display_name("Variation Noise (A1111 seeds)")
            .category(format!("{CATEGORY}/noise"))
            .description("A1111's seeds: each image of a batch has its own seed (noise_seed + its position, as A1111 counts them), and a variation seed (variation_seed + its position) whose noise its own is turned towards by variation_strength (A1111's slerp). Strength 0 is each image's own seed's noise; 1 is the variation seed's.")
            .input(InputSpec::seed("noise_seed"))
            .input(InputSpec::seed("variation_seed"))
            .input(InputSpec::float("variation_strength", 0.0).float_range(0.0, 1.0).float_step(0.01))
            .input(InputSpec::boolean("add_noise", true).optional().tooltip("Off: no initial noise (a pass that goes on from leftover noise, as KSamplerAdvanced's add_noise disable); the steps' noise still comes from each image's seed."))
            .input(rng_input())
            .input(InputSpec::float("initial_noise_multiplier", 1.0).float_range(0.0, 100.0).float_step(0.01).optional().tooltip("A1111's noise multiplier for img2img: the initial noise is scaled by it (the steps' noise is not)."))
            .output("NOISE", IoType::NOISE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let strength = inputs.float("variation_strength")?;
        if !(0.0..=1.0).contains(&strength) {
            return Err(NodeError::InvalidInput { input: "variation_strength".into(), message: format!("{strength} is outside 0..=1") });
        }
        let add = !inputs.contains("add_noise") || inputs.boolean("add_noise")?;
        let mut noise = NoiseSource::new(inputs.uint("noise_seed")?, add, rng_from(inputs)?);
        noise.per_sample = Some(Variation { subseed: inputs.uint("variation_seed")?, strength: strength as f32 });
        if inputs.contains("initial_noise_multiplier") {
            let m = inputs.float("initial_noise_multiplier")?;
            if !(m.is_finite() && m >= 0.0) {
                return Err(NodeError::InvalidInput { input: "initial_noise_multiplier".into(), message: format!("{m} must be a non-negative number") });
            }
            noise.scale = m as f32;
        }
        Ok(one(IoType::NOISE, noise))
    }
}

/// CFGGuider (positive, negative, cfg) and BasicGuider (one conditioning, no CFG).
struct CfgGuider {
    basic: bool,
}

impl Node for CfgGuider {
    fn schema(&self) -> NodeSchema {
        if self.basic {
            NodeSchema::new("BasicGuider")
                .display_name("BasicGuider")
                .category(format!("{CATEGORY}/guiders"))
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::link("conditioning", IoType::CONDITIONING))
                .output("GUIDER", IoType::GUIDER)
        } else {
            NodeSchema::new("CFGGuider")
                .display_name("CFGGuider")
                .category(format!("{CATEGORY}/guiders"))
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::link("positive", IoType::CONDITIONING))
                .input(InputSpec::link("negative", IoType::CONDITIONING))
                .input(InputSpec::float("cfg", 8.0).float_range(0.0, 100.0).float_step(0.1))
                .output("GUIDER", IoType::GUIDER)
        }
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?.clone();
        let g = if self.basic {
            Guider { model, positive: inputs.downcast::<CondList>("conditioning")?.clone(), negative: None, cfg: 1.0, dual: None }
        } else {
            Guider {
                model,
                positive: inputs.downcast::<CondList>("positive")?.clone(),
                negative: Some(inputs.downcast::<CondList>("negative")?.clone()),
                cfg: inputs.float("cfg")? as f32,
                dual: None,
            }
        };
        Ok(one(IoType::GUIDER, g))
    }
}

/// SamplerCustom (model, add_noise, seed, cfg, conditioning) and SamplerCustomAdvanced
/// (noise and guider as values). Outputs the result and the last denoised estimate.
struct SamplerCustom {
    rt: Arc<Runtime>,
    advanced: bool,
}

impl Node for SamplerCustom {
    fn schema(&self) -> NodeSchema {
        let s = if self.advanced {
            NodeSchema::new("SamplerCustomAdvanced").display_name("SamplerCustomAdvanced").input(InputSpec::link("noise", IoType::NOISE)).input(InputSpec::link("guider", IoType::GUIDER))
        } else {
            NodeSchema::new("SamplerCustom")
                .display_name("SamplerCustom")
                .input(InputSpec::link("model", IoType::MODEL))
                .input(InputSpec::boolean("add_noise", true))
                .input(InputSpec::seed("noise_seed").control_after_generate())
                .input(InputSpec::float("cfg", 8.0).float_range(0.0, 100.0).float_step(0.1))
                .input(InputSpec::link("positive", IoType::CONDITIONING))
                .input(InputSpec::link("negative", IoType::CONDITIONING))
                .input(rng_input())
        };
        s.category(CATEGORY)
            .input(InputSpec::link("sampler", IoType::SAMPLER))
            .input(InputSpec::link("sigmas", IoType::SIGMAS))
            .input(InputSpec::link("latent_image", IoType::LATENT))
            .output("output", IoType::LATENT)
            .output("denoised_output", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let (guider, noise) = if self.advanced {
            (inputs.downcast::<Guider>("guider")?.clone(), *inputs.downcast::<NoiseSource>("noise")?)
        } else {
            let seed = inputs.uint("noise_seed")?;
            (guider_from(inputs)?, NoiseSource::new(seed, inputs.boolean("add_noise")?, rng_from(inputs)?))
        };
        let choice = inputs.downcast::<SamplerChoice>("sampler")?;
        let sigmas = &inputs.downcast::<Sigmas>("sigmas")?.0;
        let latent = inputs.downcast::<Latent>("latent_image")?;
        let (out, denoised) = sample_latent(&self.rt, ctx, &guider, choice, sigmas, noise, latent)?;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, out), Value::new(IoType::LATENT, denoised)]))
    }
}

/// ComfyUI's "KSampler (Advanced)": steps `start_at_step..end_at_step` of a schedule,
/// optionally without adding noise and leaving the remaining noise in.
struct KSamplerAdvanced {
    rt: Arc<Runtime>,
}

impl Node for KSamplerAdvanced {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("KSamplerAdvanced")
            .display_name("KSampler (Advanced)")
            .category("sampling")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::combo("add_noise", ["enable", "disable"]))
            .input(InputSpec::seed("noise_seed").control_after_generate())
            .input(InputSpec::int("steps", 20).int_range(1, 10000))
            .input(InputSpec::float("cfg", 8.0).float_range(0.0, 100.0).float_step(0.1))
            .input(InputSpec::combo("sampler_name", sampler_names()))
            .input(InputSpec::combo("scheduler", scheduler_names()))
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("latent_image", IoType::LATENT))
            .input(InputSpec::int("start_at_step", 0).int_range(0, 10000))
            .input(InputSpec::int("end_at_step", 10000).int_range(0, 10000))
            .input(InputSpec::combo("return_with_leftover_noise", ["disable", "enable"]))
            .input(rng_input())
            .output("LATENT", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let guider = guider_from(inputs)?;
        let choice = sampler_from(inputs)?;
        let scheduler = Scheduler::from_str(inputs.string("scheduler")?).map_err(err)?;
        let discard = sdflow_core::sampling::comfy_discards_penultimate_sigma(inputs.string("sampler_name")?);
        let full = sdflow_core::sampling::ksampler_sigmas(scheduler, steps_from(inputs)?, 1.0, &guider.model.schedule, &ScheduleOpts::default(), discard).map_err(err)?;
        let start = usize::try_from(inputs.int("start_at_step")?).map_err(|_| NodeError::msg("start_at_step must be >= 0"))?;
        let end = usize::try_from(inputs.int("end_at_step")?).map_err(|_| NodeError::msg("end_at_step must be >= 0"))?;
        // ComfyUI: sigmas[start:], cut after `end`, and the last forced to 0 unless the
        // leftover noise is to be returned.
        let mut sigmas: Vec<f32> = full.get(start..).map_or_else(Vec::new, <[f32]>::to_vec);
        if end < full.len().saturating_sub(1) && end >= start {
            sigmas.truncate(end - start + 1);
        }
        if inputs.string("return_with_leftover_noise")? != "enable" {
            if let Some(last) = sigmas.last_mut() {
                *last = 0.0;
            }
        }
        let latent = inputs.downcast::<Latent>("latent_image")?;
        if sigmas.len() < 2 || start >= end {
            // Nothing to sample: ComfyUI hands the latent back unchanged.
            return Ok(one(IoType::LATENT, latent.clone()));
        }
        let noise = NoiseSource::new(inputs.uint("noise_seed")?, inputs.string("add_noise")? == "enable", rng_from(inputs)?);
        let (out, _) = sample_latent(&self.rt, ctx, &guider, &choice, &sigmas, noise, latent)?;
        Ok(one(IoType::LATENT, out))
    }
}
