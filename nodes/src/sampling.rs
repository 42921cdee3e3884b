//! Samplers.

use crate::runtime::Runtime;
use crate::values::{CondList, Latent, ModelRef};
use crate::handle_size;
use crate::err;
use sdflow_core::models::sd::{Conditioning, SdDenoiser};
use sdflow_core::models::unet::{Unet, UnetConfig};
use sdflow_core::sampling::rng::{CpuRng, Rng};
use sdflow_core::sampling::samplers::{sample, Denoised, Progress, SampleError, SampleOpts, Sampler};
use sdflow_core::sampling::schedule::{apply_denoise, DiscreteSchedule, ScheduleOpts, Scheduler};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::str::FromStr;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(KSampler { rt: rt.clone() }));
}

/// Sampler names offered in combos: ComfyUI's first (so its workflows validate), then
/// the sd.cpp names it lacks. Every one parses with `Sampler::from_str`.
pub fn sampler_names() -> Vec<String> {
    let comfy = [
        "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "dpm_2", "lms", "dpmpp_2s_ancestral", "dpmpp_2m",
        "dpmpp_2m_sde", "ddim", "lcm", "ipndm", "res_multistep", "er_sde", "gradient_estimation",
    ];
    let mut out: Vec<String> = comfy.iter().map(|s| s.to_string()).collect();
    for s in Sampler::ALL {
        if !out.iter().any(|o| o == s.name()) {
            out.push(s.name().to_string());
        }
    }
    out
}

/// Scheduler names: ComfyUI's, then sd.cpp's.
pub fn scheduler_names() -> Vec<String> {
    let mut out: Vec<String> = ["normal", "karras", "exponential", "sgm_uniform", "simple", "ddim_uniform", "beta", "kl_optimal"].iter().map(|s| s.to_string()).collect();
    for s in Scheduler::ALL {
        if !out.iter().any(|o| o == s.name()) {
            out.push(s.name().to_string());
        }
    }
    out.retain(|n| Scheduler::from_str(n).is_ok());
    out
}

/// Who guides the denoiser: a model with positive (and, for CFG, negative)
/// conditioning — ComfyUI's GUIDER.
#[derive(Clone, Debug)]
pub struct Guider {
    pub model: ModelRef,
    pub positive: CondList,
    pub negative: Option<CondList>,
    pub cfg: f32,
}
handle_size!(Guider);

/// SAMPLER: a sampling method with its options.
#[derive(Clone, Debug)]
pub struct SamplerChoice {
    pub sampler: Sampler,
    pub opts: SampleOpts,
}
handle_size!(SamplerChoice);

/// SIGMAS: a noise schedule, high to low.
#[derive(Clone, Debug, PartialEq)]
pub struct Sigmas(pub Vec<f32>);

impl sdflow_executor::CacheSize for Sigmas {
    fn cache_bytes(&self) -> usize {
        self.0.len() * 4
    }
}

/// NOISE: the seed of the initial noise, or none (ComfyUI's DisableNoise).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseSource(pub Option<u64>);
handle_size!(NoiseSource);

fn first_cond<'a>(c: &'a CondList, which: &str) -> Result<&'a Conditioning, NodeError> {
    c.0.first().map(|e| e.cond.as_ref()).ok_or_else(|| NodeError::msg(format!("{which} conditioning is empty")))
}

/// Run `choice` down `sigmas` from `latent` (noised with `noise`'s seed, if any, to the
/// first sigma), reporting progress to `ctx`: the shared body of every sampler node.
/// Returns the result and the last denoised estimate (SamplerCustom's second output).
pub fn sample_latent(rt: &Runtime, ctx: &ExecContext<'_>, guider: &Guider, choice: &SamplerChoice, sigmas: &[f32], noise: NoiseSource, latent: &Latent) -> Result<(Latent, Latent), NodeError> {
    let model = &guider.model;
    let weights = model.weights.pin().map_err(err)?;
    let config = UnetConfig::infer(&weights, &model.prefix).map_err(err)?;
    let unet = Unet::new(&weights, &model.prefix, config).map_err(err)?;
    let mut den = SdDenoiser::new(unet, DiscreteSchedule::sd(), model.prediction);
    first_cond(&guider.positive, "positive")?;
    // cfg 1 makes the unconditional pass a no-op; skip it as ComfyUI does.
    let negative = match &guider.negative {
        Some(n) if guider.cfg != 1.0 || choice.sampler.needs_uncond() => {
            first_cond(n, "negative")?;
            Some(n)
        }
        _ => None,
    };
    let cfg = guider.cfg;
    let schedule = DiscreteSchedule::sd();
    // ComfyUI's percent_to_sigma: 0 is the start of sampling (all noise), 1 the end.
    let percent_to_sigma = |p: f32| -> f32 {
        if p <= 0.0 {
            f32::INFINITY
        } else if p >= 1.0 {
            0.0
        } else {
            schedule.t_to_sigma((1.0 - p) * (schedule.len() - 1) as f32)
        }
    };
    let active = |list: &'_ CondList, sigma: f32| -> Vec<Arc<Conditioning>> {
        list.0
            .iter()
            .filter(|e| e.timestep_range.is_none_or(|(a, b)| sigma <= percent_to_sigma(a) && sigma >= percent_to_sigma(b)))
            .map(|e| e.cond.clone())
            .collect()
    };

    let shape = latent.shape;
    let [lw, lh, _, ln] = shape;
    let plane = (lw * lh) as usize;
    // One generator for the initial noise and every step's, as sd.cpp does.
    let mut rng = CpuRng::new(noise.0.unwrap_or(0));
    let noise: Vec<f32> = match noise.0 {
        Some(_) => rng.randn(latent.samples.len()),
        None => vec![0.0; latent.samples.len()],
    };
    let sigma0 = sigmas.first().copied().unwrap_or(0.0);
    let scaled: Vec<f32> = latent.samples.iter().map(|l| l * model.latent_scale).collect();
    let x: Vec<f32> = scaled.iter().zip(&noise).map(|(l, n)| l + n * sigma0).collect();
    // The noise mask at latent resolution, one plane per sample.
    let mask: Option<Vec<f32>> = latent.noise_mask.as_ref().map(|m| (0..ln as usize).flat_map(|i| m.resized(i, lw as usize, lh as usize)).collect());
    let channels = (shape[2]) as usize;
    let mask_at = |mask: &[f32], idx: usize| mask[(idx / (plane * channels)) * plane + idx % plane];
    // Inpainting UNets take the mask and the masked image's latent as 5 extra channels.
    let extra = den.unet().config.in_channels - shape[2];
    let concat: Option<Vec<f32>> = match extra {
        0 => None,
        5 if shape[2] == 4 => Some(
            (0..ln as usize)
                .flat_map(|i| {
                    let m: Vec<f32> = mask.as_ref().map_or_else(|| vec![1.0; plane], |m| m[i * plane..(i + 1) * plane].to_vec());
                    let per = plane * channels;
                    m.into_iter().chain(scaled[i * per..(i + 1) * per].iter().copied()).collect::<Vec<f32>>()
                })
                .collect(),
        ),
        _ => return Err(NodeError::msg(format!("this UNet takes {} input channels; only 4 and 9 (inpainting) are supported yet", shape[2] + extra))),
    };
    let total = sigmas.len().saturating_sub(1) as u64;
    let mut denoiser = |x: &[f32], sigma: f32| -> Result<_, NodeError> {
        ctx.check_cancelled()?;
        // ComfyUI's KSamplerX0Inpaint: outside the mask the latent is held at the input
        // image, noised to the current level, and the prediction there is the image itself.
        let blended: Option<Vec<f32>> = mask.as_ref().map(|m| {
            x.iter().enumerate().map(|(i, &v)| {
                let k = mask_at(m, i);
                v * k + (scaled[i] + noise[i] * sigma) * (1.0 - k)
            }).collect()
        });
        let xin = blended.as_deref().unwrap_or(x);
        let concat = concat.as_deref().map(|c| (c, extra));
        let pos = active(&guider.positive, sigma);
        let neg = negative.map(|n| active(n, sigma)).unwrap_or_default();
        let mut d = match (pos.as_slice(), neg.as_slice()) {
            ([], _) => return Err(NodeError::msg(format!("no positive conditioning applies at sigma {sigma} (check the timestep ranges)"))),
            // One of each: cond and uncond in one batched graph.
            ([c], n) if n.len() <= 1 => rt.with_backend(|b| den.denoise_concat(b, xin, shape, sigma, c, n.first().map(|u| u.as_ref()), cfg, concat)).map_err(err)?,
            // Several entries (ConditioningCombine): each evaluated alone and averaged,
            // as ComfyUI does for entries without areas.
            (ps, ns) => {
                let mut mean = |list: &[Arc<Conditioning>]| -> Result<Option<Vec<f32>>, NodeError> {
                    let mut acc: Option<Vec<f32>> = None;
                    for c in list {
                        let d = rt.with_backend(|b| den.denoise_concat(b, xin, shape, sigma, c, None, 1.0, concat)).map_err(err)?.denoised;
                        match &mut acc {
                            None => acc = Some(d),
                            Some(a) => a.iter_mut().zip(&d).for_each(|(a, v)| *a += v),
                        }
                    }
                    let k = list.len().max(1) as f32;
                    Ok(acc.map(|a| a.into_iter().map(|v| v / k).collect()))
                };
                let c = mean(ps)?.unwrap_or_default();
                match mean(ns)? {
                    Some(u) => Denoised { denoised: u.iter().zip(&c).map(|(u, c)| u + cfg * (c - u)).collect(), uncond: Some(u) },
                    None => Denoised { denoised: c, uncond: None },
                }
            }
        };
        if let Some(m) = &mask {
            for (i, v) in d.denoised.iter_mut().enumerate() {
                let k = mask_at(m, i);
                *v = *v * k + scaled[i] * (1.0 - k);
            }
        }
        Ok(d)
    };
    let mut last_denoised: Option<Vec<f32>> = None;
    let mut progress = |p: Progress<'_>| {
        last_denoised = Some(p.denoised.to_vec());
        ctx.progress(p.step as u64, total);
    };
    let out = sample(choice.sampler, &mut denoiser, x, sigmas, &mut rng, &choice.opts, Some(&mut progress)).map_err(|e| match e {
        SampleError::Model { error, .. } => error,
        other => err(other),
    })?;
    let unscale = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| x / model.latent_scale).collect() };
    let denoised = last_denoised.as_deref().map_or_else(|| unscale(&out), unscale);
    let mk = |samples| Latent { samples, shape, noise_mask: latent.noise_mask.clone() };
    Ok((mk(unscale(&out)), mk(denoised)))
}

/// ComfyUI's "KSampler".
struct KSampler {
    rt: Arc<Runtime>,
}

impl Node for KSampler {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("KSampler")
            .display_name("KSampler")
            .category("sampling")
            .description("Denoises a latent with a model, guided by positive and negative conditioning.")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::seed("seed").control_after_generate())
            .input(InputSpec::int("steps", 20).int_range(1, 10000))
            .input(InputSpec::float("cfg", 8.0).float_range(0.0, 100.0).float_step(0.1))
            .input(InputSpec::combo("sampler_name", sampler_names()))
            .input(InputSpec::combo("scheduler", scheduler_names()))
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("latent_image", IoType::LATENT))
            .input(InputSpec::float("denoise", 1.0).float_range(0.0, 1.0).float_step(0.01))
            .output("LATENT", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let guider = guider_from(inputs)?;
        let choice = sampler_from(inputs)?;
        let scheduler = Scheduler::from_str(inputs.string("scheduler")?).map_err(err)?;
        let steps = steps_from(inputs)?;
        let denoise = inputs.float("denoise")? as f32;
        let sigmas = apply_denoise(scheduler, steps, denoise, &DiscreteSchedule::sd(), &ScheduleOpts::default()).map_err(err)?;
        let latent = inputs.downcast::<Latent>("latent_image")?;
        let (out, _) = sample_latent(&self.rt, ctx, &guider, &choice, &sigmas, NoiseSource(Some(inputs.uint("seed")?)), latent)?;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, out)]))
    }
}

pub(crate) fn steps_from(inputs: &Inputs) -> Result<usize, NodeError> {
    usize::try_from(inputs.int("steps")?).map_err(|_| NodeError::msg("steps must be positive"))
}

pub(crate) fn sampler_from(inputs: &Inputs) -> Result<SamplerChoice, NodeError> {
    Ok(SamplerChoice { sampler: Sampler::from_str(inputs.string("sampler_name")?).map_err(err)?, opts: SampleOpts::default() })
}

/// model, positive, negative and cfg of the KSampler-style nodes.
pub(crate) fn guider_from(inputs: &Inputs) -> Result<Guider, NodeError> {
    Ok(Guider {
        model: inputs.downcast::<ModelRef>("model")?.clone(),
        positive: inputs.downcast::<CondList>("positive")?.clone(),
        negative: Some(inputs.downcast::<CondList>("negative")?.clone()),
        cfg: inputs.float("cfg")? as f32,
    })
}
