//! Sampling nodes: KSampler here; the custom-sampling graph nodes ([`custom_sampling`]),
//! the model-sampling overrides ([`model_sampling`]), the guidance and batching every
//! sampler shares ([`guidance`]) and the step previews ([`preview`]); the MODEL patches the
//! sampler honours, ComfyUI's guidance hooks ([`cfg_hooks`]) and Differential Diffusion
//! ([`differential`]); more schedule and sigma nodes ([`sigmas`]).

pub mod cfg_hooks;
pub mod custom_sampling;
pub mod differential;
pub mod guidance;
pub mod model_sampling;
pub mod preview;
pub mod sigmas;
pub mod turbo;

use sdflow_core::placement::Module;
use crate::runtime::Runtime;
use guidance::Mix;
use differential::DifferentialThreshold;
use crate::values::{CondConcat, CondList, Latent, Mask, ModelRef};
use sdflow_core::detect::ModelFamily;
use crate::handle_size;
use crate::err;
use crate::conditioning::controlnet::{hint_for, Controls};
use crate::values::Control;
use sdflow_core::models::chroma::{Chroma, ChromaConfig};
use sdflow_core::models::flux::{fill_concat, Flux, FluxConfig, FluxDenoiser, FluxItem};
use sdflow_core::models::dit::SkipLayers;
use sdflow_core::models::sd3::{Sd3, Sd3Config, Sd3Denoiser, Sd3Item};
use sdflow_core::models::qwen_image::{QwenImage, QwenImageConfig, QwenImageDenoiser, QwenImageItem};
use sdflow_core::models::wan::{Wan, WanConfig, WanDenoiser, WanItem};
use sdflow_core::models::z_image::{ZImage, ZImageConfig, ZImageDenoiser, ZImageItem};
use sdflow_core::models::flux2::{Flux2, Flux2Config, Flux2Denoiser, Flux2Item};
use sdflow_core::models::sd::{BatchItem, ControlInput, IpPatch, IpSide, SdDenoiser};
use sdflow_core::models::conditioning::Conditioning;
use std::collections::hash_map::{Entry, HashMap};
use sdflow_core::models::sd::motion::{MotionConfig, MotionModules};
use sdflow_core::models::sd::unet::{Unet, UnetConfig};
use sdflow_core::sampling::rng::Rng;
use sdflow_core::sampling::{comfy_discards_penultimate_sigma, RngKind};
use sdflow_core::sampling::samplers::{sample, Progress, SampleError, SampleOpts, Sampler};
use sdflow_core::sampling::schedule::{ksampler_sigmas, ScheduleOpts, Scheduler};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::str::FromStr;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(KSampler { rt: rt.clone() }));
}

/// Sampler names offered in combos: ComfyUI's `SAMPLER_NAMES` in its order (so its
/// workflows validate and its menus read the same), then the names it lacks (sd.cpp's, and
/// A1111's `k_lms`). Every one parses with `Sampler::from_str`.
pub fn sampler_names() -> Vec<String> {
    let comfy = [
        "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2", "dpm_2", "dpm_2_ancestral", "lms", "dpm_fast",
        "dpm_adaptive", "dpmpp_2s_ancestral", "dpmpp_2s_ancestral_cfg_pp", "dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m", "dpmpp_2m_cfg_pp", "dpmpp_2m_sde",
        "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu", "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm", "ipndm_v", "deis",
        "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral", "res_multistep_ancestral_cfg_pp", "gradient_estimation",
        "gradient_estimation_cfg_pp", "er_sde", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece", "ddim", "uni_pc", "uni_pc_bh2",
    ];
    let mut out: Vec<String> = comfy.iter().map(|s| s.to_string()).collect();
    for s in Sampler::ALL {
        if !out.iter().any(|o| o == s.name()) {
            out.push(s.name().to_string());
        }
    }
    out
}

/// Scheduler names: ComfyUI's `SCHEDULER_NAMES` in its order, then sd.cpp's.
pub fn scheduler_names() -> Vec<String> {
    let mut out: Vec<String> = ["simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal", "linear_quadratic", "kl_optimal"].iter().map(|s| s.to_string()).collect();
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
    /// ComfyUI's DualCFGGuider: `positive` is its `cond1` and `cfg` its `cfg_conds`.
    pub dual: Option<DualCfg>,
}
handle_size!(Guider);

/// The middle conditioning of dual CFG (DualCFGGuider's `cond2`, sd.cpp's image
/// conditioning) and its scale against the negative (`cfg_cond2_negative`, sd.cpp's
/// `--img-cfg-scale`).
#[derive(Clone, Debug)]
pub struct DualCfg {
    pub middle: CondList,
    pub cfg_middle: f32,
    /// DualCFGGuider's "nested" style.
    pub nested: bool,
}

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

/// NOISE: the seed, whether initial noise is added (not for ComfyUI's DisableNoise or an
/// `add_noise` switched off — the seed still seeds the steps' noise, as in ComfyUI), and
/// the generator (sd.cpp's `--rng`); none: the runtime's, ComfyUI's CPU noise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseSource {
    pub seed: u64,
    pub add: bool,
    pub rng: Option<RngKind>,
    /// A1111's seeds (VariationNoise): a generator per sample instead of one for the
    /// batch; `None` is ComfyUI's one stream for the whole batch.
    pub per_sample: Option<Variation>,
    /// A1111's `initial_noise_multiplier`: the initial noise the sampler adds is scaled by
    /// it (not the steps' noise); 1 for every node but VariationNoise given one.
    pub scale: f32,
}

/// A1111's seeds over a batch: the sample at batch position `k` draws its initial and
/// steps' noise from the generator of `seed + k` (of `seed` itself when `strength` is not 0:
/// A1111 then keeps the seed and counts the variation seed up), and its initial noise is
/// turned towards `subseed + k`'s by `strength` ([`sdflow_core::sampling::variation::slerp`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Variation {
    pub subseed: u64,
    pub strength: f32,
}

impl Variation {
    /// The seed and variation seed of the sample at batch position `k` for noise `seed`.
    pub fn seeds(&self, seed: u64, k: usize) -> (u64, u64) {
        let main = if self.strength == 0.0 { seed.wrapping_add(k as u64) } else { seed };
        (main, self.subseed.wrapping_add(k as u64))
    }
}

impl NoiseSource {
    pub fn new(seed: u64, add: bool, rng: Option<RngKind>) -> Self {
        NoiseSource { seed, add, rng, per_sample: None, scale: 1.0 }
    }

    /// The initial noise of `latent` (zeros without `add`) and the generator the steps'
    /// noise comes from, with `default` as the generator kind when the source names none.
    /// ComfyUI's CPU noise (`cpu`) starts the steps from a fresh generator of the seed;
    /// sd.cpp's kinds go on from the initial noise's stream. With a generator per sample
    /// each sample gets what a batch of one with its own seed would.
    pub(crate) fn draw(&self, default: RngKind, latent: &Latent) -> Result<(Vec<f32>, Box<dyn Rng + Send>, bool), NodeError> {
        let kind = self.rng.unwrap_or(default);
        let comfy = kind == RngKind::Cpu;
        let len = latent.samples.len();
        let n = latent.shape[3].max(1) as usize;
        let Some(v) = self.per_sample else {
            let mut rng = kind.seeded(self.seed);
            let noise = match (self.add, &latent.batch_index) {
                (true, None) => rng.randn(len),
                (true, Some(inds)) => batch_noise(&mut rng, inds, n, len / n)?,
                (false, _) => vec![0.0; len],
            };
            if comfy {
                rng = kind.seeded(self.seed);
            }
            return Ok((noise, rng, comfy));
        };
        if !(v.strength.is_finite() && (0.0..=1.0).contains(&v.strength)) {
            return Err(NodeError::msg(format!("variation strength {} is outside 0..=1", v.strength)));
        }
        let positions: Vec<usize> = match &latent.batch_index {
            Some(inds) if inds.len() != n => return Err(NodeError::InvalidInput { input: "latent_image".into(), message: format!("the latent has {n} samples but {} batch indices", inds.len()) }),
            Some(inds) => inds.clone(),
            None => (0..n).collect(),
        };
        let per = len / n;
        let [w, h, c, _] = latent.shape;
        let mut noise = Vec::with_capacity(len);
        let mut gens = Vec::with_capacity(n);
        let mut seeds = Vec::with_capacity(n);
        for &k in &positions {
            let (seed, subseed) = v.seeds(self.seed, k);
            let mut g = kind.seeded(seed);
            if self.add {
                let own = g.randn(per);
                if v.strength == 0.0 {
                    noise.extend(own);
                } else {
                    let sub = kind.seeded(subseed).randn(per);
                    noise.extend(sdflow_core::sampling::variation::slerp(v.strength, &own, &sub, c as usize, h as usize, w as usize));
                }
            } else {
                noise.extend(std::iter::repeat_n(0.0, per));
            }
            if comfy {
                g = kind.seeded(seed);
            }
            gens.push(g);
            seeds.push(seed);
        }
        // ComfyUI seeds a Brownian tree with the noise seed itself: here each sample's.
        let rng = sdflow_core::sampling::PerSampleRng::new(gens, comfy.then_some(seeds));
        Ok((noise, Box::new(rng), comfy))
    }
}

/// The optional `rng` input of the nodes that draw noise: ComfyUI's workflows have none
/// and keep its CPU noise; sd.cpp's names choose another generator (`cuda` is sd-cli's
/// default: the Philox noise of torch on CUDA, bit for bit).
pub(crate) fn rng_input() -> InputSpec {
    InputSpec::combo("rng", RngKind::ALL.map(|k| k.name()))
        .combo_default(RngKind::Cpu.name())
        .optional()
        .tooltip("The noise generator (sd.cpp's --rng): cpu is torch's CPU randn (ComfyUI), cuda torch's CUDA Philox (sd-cli's default), std_default C++'s std::default_random_engine, cpu_portable torch's portable CPU kernel (sd-cli's cpu).")
}

/// The `rng` input's generator, if the node has one.
pub(crate) fn rng_from(inputs: &Inputs) -> Result<Option<RngKind>, NodeError> {
    if !inputs.contains("rng") {
        return Ok(None);
    }
    inputs.string("rng")?.parse().map(Some).map_err(err)
}
handle_size!(NoiseSource);

fn first_cond<'a>(c: &'a CondList, which: &str) -> Result<&'a Conditioning, NodeError> {
    c.0.first().map(|e| e.cond.as_ref()).ok_or_else(|| NodeError::msg(format!("{which} conditioning is empty")))
}

/// At most this many whole latents go through the UNet in one graph: a three-way
/// guidance step in one batch, and the memory of a batch bounded by it.
const BATCH_LATENTS: usize = 3;

/// ComfyUI's `blank_inpaint_image_like`: a black image's latent (model space), what
/// inpainting UNets see as the masked image when the latent has no noise mask.
const BLANK_INPAINT_LATENT: [f32; 4] = [0.8223, -0.6876, 0.6364, 0.1380];

/// Run `choice` down `sigmas` from `latent` (noised with `noise`'s seed, if any, to the
/// first sigma), reporting progress to `ctx`: the shared body of every sampler node.
/// Returns the result and the last denoised estimate (SamplerCustom's second output).
pub fn sample_latent(rt: &Runtime, ctx: &ExecContext<'_>, guider: &Guider, choice: &SamplerChoice, sigmas: &[f32], noise: NoiseSource, latent: &Latent) -> Result<(Latent, Latent), NodeError> {
    let model = &guider.model;
    let weights = rt.pin(Module::Diffusion, &model.weights)?;
    let ip_weights = model.ip_adapters.iter().map(|p| rt.pin(Module::Diffusion, &p.weights)).collect::<Result<Vec<_>, _>>()?;
    let motion_weights = model.motion.as_ref().map(|m| rt.pin(Module::Diffusion, &m.weights)).transpose()?;
    let mut den = if model.family == ModelFamily::Flux {
        let config = FluxConfig::infer(&weights, &model.prefix).map_err(err)?;
        let mut den = FluxDenoiser::new(Flux::new(&weights, &model.prefix, config).map_err(err)?);
        den.circular = model.circular;
        Den::Flux(den)
    } else if model.family == ModelFamily::Chroma {
        let config = ChromaConfig::infer(&weights, &model.prefix).map_err(err)?;
        let mut den = FluxDenoiser::chroma(Chroma::new(&weights, &model.prefix, config).map_err(err)?);
        den.circular = model.circular;
        Den::Flux(den)
    } else if model.family == ModelFamily::Sd3 {
        // sd.cpp's MMDiT has no circular layer (its patch embedding pads nothing; it pads
        // odd sides with zeros where sdflow already wraps around, as ComfyUI): seamless
        // tiling reaches an SD3 image through its VAE only.
        let config = Sd3Config::infer(&weights, &model.prefix).map_err(err)?;
        Den::Sd3(Sd3Denoiser::new(Sd3::new(&weights, &model.prefix, config).map_err(err)?))
    } else if model.family == ModelFamily::Flux2 {
        let config = Flux2Config::infer(&weights, &model.prefix).map_err(err)?;
        Den::Flux2(Flux2Denoiser::new(Flux2::new(&weights, &model.prefix, config).map_err(err)?))
    } else if model.family == ModelFamily::ZImage {
        let config = ZImageConfig::infer(&weights, &model.prefix).map_err(err)?;
        let mut den = ZImageDenoiser::new(ZImage::new(&weights, &model.prefix, config).map_err(err)?);
        den.circular = model.circular;
        Den::ZImage(den)
    } else if model.family == ModelFamily::QwenImage {
        let config = QwenImageConfig::infer(&weights, &model.prefix).map_err(err)?;
        let mut den = QwenImageDenoiser::new(QwenImage::new(&weights, &model.prefix, config).map_err(err)?);
        den.circular = model.circular;
        den.frames = latent.frames.max(1);
        Den::QwenImage(den)
    } else if model.family == ModelFamily::Wan {
        let config = WanConfig::infer(&weights, &model.prefix).map_err(err)?;
        let mut den = WanDenoiser::new(Wan::new(&weights, &model.prefix, config).map_err(err)?);
        den.frames = latent.frames.max(1);
        Den::Wan(den)
    } else {
        let config = UnetConfig::infer(&weights, &model.prefix).map_err(err)?;
        let unet = Unet::new(&weights, &model.prefix, config).map_err(err)?;
        let mut den = SdDenoiser::new(unet, model.schedule.clone(), model.prediction);
        den.image_size = Some((latent.shape[0] * 8, latent.shape[1] * 8));
        den.circular = model.circular;
        if let (Some(m), Some(w)) = (&model.motion, &motion_weights) {
            let named = |e: sdflow_core::models::ModelError| NodeError::msg(format!("{}: {e}", m.name));
            let modules = MotionModules::new(w, MotionConfig::infer(w).map_err(named)?).map_err(named)?;
            // The batch is one video.
            modules.config.check_frames(latent.shape[3]).map_err(named)?;
            let across = m.norm_across_frames(&modules.config);
            den = den.with_motion(modules, across).map_err(named)?;
        }
        Den::Sd(den)
    };
    if model.motion.is_some() && !matches!(den, Den::Sd(_)) {
        return Err(NodeError::msg(format!("AnimateDiff motion modules animate SD1.x models; this model is {}", model.family)));
    }
    first_cond(&guider.positive, "positive")?;
    let mix = match &guider.dual {
        Some(d) => Mix::Dual { cfg: guider.cfg, cfg_middle: d.cfg_middle, nested: d.nested },
        None if guider.negative.is_some() => Mix::Cfg { cfg: guider.cfg },
        None => Mix::Positive,
    };
    // Passes whose weight vanishes are skipped (ComfyUI's cfg-1 optimisation).
    let (eval_middle, eval_negative) = mix.passes(choice.sampler.needs_uncond());
    if let Some(n) = &guider.negative {
        first_cond(n, "negative")?;
    }
    // ComfyUI's hooks see the CFG scale of the call; DualCFGGuider runs them inside each of
    // its two CFG steps, which this sampler does not reproduce.
    let hooks = &model.cfg_hooks;
    let cond_scale = match mix {
        Mix::Cfg { cfg } => cfg,
        Mix::Positive => 1.0,
        Mix::Dual { .. } if !hooks.is_empty() => return Err(NodeError::msg("RescaleCFG, CFGNorm, CFGZeroStar and LatentApplyOperationCFG are not supported with DualCFGGuider")),
        Mix::Dual { cfg, .. } => cfg,
    };
    if let Some(d) = &guider.dual {
        first_cond(&d.middle, "middle (cond2)")?;
    }
    let schedule = &model.schedule;
    // ComfyUI's percent_to_sigma: 0 is the start of sampling (all noise), 1 the end.
    let percent_to_sigma = |p: f32| -> f32 {
        if let Some(f) = model.flow {
            f.percent_to_sigma(p)
        } else if p <= 0.0 {
            f32::INFINITY
        } else if p >= 1.0 {
            0.0
        } else {
            schedule.t_to_sigma((1.0 - p) * (schedule.len() - 1) as f32)
        }
    };
    if !model.ip_adapters.is_empty() {
        let patches = (model.ip_adapters.iter().zip(&ip_weights))
            .map(|(p, w)| IpPatch { weights: w, cond: p.cond.clone(), uncond: p.uncond.clone(), tokens: p.tokens, scale: p.weight, sigmas: (percent_to_sigma(p.start_at), percent_to_sigma(p.end_at)) })
            .collect();
        den = match den {
            Den::Sd(d) => Den::Sd(d.with_ip_adapters(patches).map_err(err)?),
            Den::Flux(_) | Den::Sd3(_) | Den::ZImage(_) | Den::Flux2(_) | Den::QwenImage(_) | Den::Wan(_) => return Err(NodeError::msg(format!("IP-Adapters apply to SD UNets; this model is {}", model.family))),
        };
    }

    if latent.frames > 1 && !matches!(den, Den::QwenImage(_) | Den::Wan(_)) {
        return Err(NodeError::msg(format!("a latent of {} frames: of the models here only Wan and Qwen-Image-Layered sample frames; this model is {}", latent.frames, model.family)));
    }
    let [lw, lh, channels, ln] = latent.shape;
    if latent.frames == 0 || channels % latent.frames as i64 != 0 {
        return Err(NodeError::msg(format!("a latent of {channels} channels cannot hold {} frames", latent.frames)));
    }
    if latent.shape.iter().any(|&d| d < 1) || latent.samples.len() as i64 != lw * lh * channels * ln {
        return Err(NodeError::msg(format!("a latent of {} values is not {:?}", latent.samples.len(), latent.shape)));
    }
    // ComfyUI's empty latents: all zeros, left unshifted and grown to the model's channel
    // count (`fix_empty_latent_channels`), so EmptyLatentImage also serves FLUX.
    let empty = latent.samples.iter().all(|&v| v == 0.0);
    let want_channels = match &den {
        Den::Flux(d) => d.out_channels() / 4,
        Den::Sd3(d) => d.config().in_channels,
        Den::ZImage(d) => d.config().in_channels,
        Den::Flux2(d) => d.config().in_channels,
        Den::QwenImage(d) => d.config().latent_channels * d.frames as i64,
        Den::Wan(d) => d.config().out_channels * d.frames as i64,
        Den::Sd(_) => channels,
    };
    let grown;
    let latent = if empty && channels != want_channels {
        grown = Latent { samples: vec![0.0; (lw * lh * want_channels * ln) as usize], shape: [lw, lh, want_channels, ln], noise_mask: latent.noise_mask.clone(), batch_index: latent.batch_index.clone(), frames: latent.frames };
        &grown
    } else {
        latent
    };
    let shape = latent.shape;
    let plane = (lw * lh) as usize;
    // The latent format's per-channel statistics see a channel's frames as one plane.
    let format_plane = plane * latent.frames.max(1);
    let channels = shape[2] as usize;
    let seed = noise.seed;
    let per_sample = noise.per_sample.is_some();
    let noise_scale = noise.scale;
    // ComfyUI (torch's CPU generator, the `cpu` choice) draws each step's noise from a
    // generator of its own seeded with the seed, and seeds its Brownian tree with the seed;
    // sd.cpp's generators (the other choices) go on from the initial noise's stream.
    let (mut noise, mut rng, comfy) = noise.draw(rt.rng, latent)?;
    if noise_scale != 1.0 {
        noise.iter_mut().for_each(|v| *v *= noise_scale);
    }
    let sigma0 = sigmas.first().copied().unwrap_or(0.0);
    let scaled: Vec<f32> = if empty { latent.samples.clone() } else { model.latent.to_model(&latent.samples, format_plane) };
    // The latent noised to σ: x₀ + σ·ε, or for a flow model (1 − σ)·x₀ + σ·ε (ComfyUI's
    // CONST noise scaling).
    let flow = model.flow.is_some();
    let noised = |x0: f32, n: f32, sigma: f32| if flow { x0 * (1.0 - sigma) + n * sigma } else { x0 + n * sigma };
    let x: Vec<f32> = scaled.iter().zip(&noise).map(|(&l, &n)| noised(l, n, sigma0)).collect();
    // The noise mask at latent resolution, one plane per sample and frame: a video's mask
    // of one plane per frame and sample (Wan22ImageToVideoLatent's), or one per sample over
    // all its frames.
    let frames = latent.frames.max(1);
    let mask: Option<Vec<f32>> = latent.noise_mask.as_ref().map(|m| {
        let (lw, lh) = (lw as usize, lh as usize);
        if frames > 1 && m.n == frames * ln as usize {
            (0..m.n).flat_map(|i| m.resized(i, lw, lh)).collect()
        } else {
            (0..ln as usize).flat_map(|i| m.resized(i, lw, lh).repeat(frames)).collect()
        }
    });
    // Channel k of a sample holds frame k mod T (ComfyUI's [C, T] order).
    let mask_at = |mask: &[f32], idx: usize| {
        let (sample, k) = (idx / (plane * channels), (idx % (plane * channels)) / plane);
        mask[(sample * frames + k % frames) * plane + idx % plane]
    };
    // Wan 2.2 TI2V holds given frames at the clean latent, not noised to σ (ComfyUI's
    // `WAN22.scale_latent_inpaint`).
    let clean_inpaint = matches!(&den, Den::Wan(d) if d.config().frame_timesteps());
    let differential = model.differential_diffusion.map(|dd| (dd, DifferentialThreshold::new(model, sigmas)));

    // The extra input channels: inpainting UNets take a mask and the masked image's
    // latent (5), instruct-pix2pix UNets the source image's latent (4), FLUX Fill the masked
    // image's latent and the mask cut into 8×8 cells (channels + 64).
    let extra = match &den {
        Den::Sd(d) => d.unet().config.in_channels - shape[2],
        Den::Flux(d) => d.in_channels() / 4 - shape[2],
        Den::Sd3(_) | Den::ZImage(_) | Den::Flux2(_) | Den::QwenImage(_) | Den::Wan(_) => 0,
    };
    let fill = matches!(den, Den::Flux(_)) && extra > 0;
    if fill && extra != shape[2] + 64 {
        return Err(NodeError::msg(format!("this FLUX model reads {} channels; Fill models read the latent's {} twice and 64 mask channels", shape[2] + extra, shape[2])));
    }
    if !(extra == 0 || fill || (channels == 4 && (extra == 4 || extra == 5))) {
        return Err(NodeError::msg(format!(
            "this UNet takes {} input channels; only 4, 8 (instruct-pix2pix) and 9 (inpainting) are supported",
            shape[2] + extra
        )));
    }
    let per = plane * channels;
    let n = ln as usize;
    // Per sample: [mask plane,] then the image latent's channels; FLUX Fill's image then
    // mask cells.
    let build = |mask_plane: &dyn Fn(usize) -> Vec<f32>, image: &dyn Fn(usize) -> Vec<f32>| -> Result<Option<Arc<Vec<f32>>>, String> {
        if extra == 0 {
            return Ok(None);
        }
        let mut v = Vec::with_capacity(plane * extra as usize * n);
        for i in 0..n {
            if fill {
                v.extend(fill_concat(&image(i), channels, &mask_plane(i), lh as usize, lw as usize).map_err(|e| e.to_string())?);
                continue;
            }
            if extra == 5 {
                v.extend(mask_plane(i));
            }
            v.extend(image(i));
        }
        Ok(Some(Arc::new(v)))
    };
    // FLUX Fill reads masks at pixel resolution (ComfyUI upscales the latent-size noise
    // mask, bilinear).
    let (mw, mh) = if fill { (lw as usize * 8, lh as usize * 8) } else { (lw as usize, lh as usize) };
    let noise_mask_plane = |i: usize| match &mask {
        None => vec![1.0; mw * mh],
        Some(m) if fill => Mask { data: m[i * frames * plane..][..plane].to_vec(), n: 1, height: lh as usize, width: lw as usize }.resized(0, mw, mh),
        Some(m) => m[i * frames * plane..][..plane].to_vec(),
    };
    let process_in = |v: &[f32]| -> Vec<f32> { model.latent.to_model(v, format_plane) };
    let model_concat = build(&noise_mask_plane, &|i| match &mask {
        // ComfyUI's Fill without a masked image: zeros, taken into model space.
        _ if fill => process_in(&vec![0.0; per]),
        Some(_) => scaled[i * per..(i + 1) * per].to_vec(),
        None if extra == 5 => BLANK_INPAINT_LATENT.iter().flat_map(|&v| std::iter::repeat_n(v, plane)).collect(),
        None => vec![0.0; per],
    })
    .map_err(NodeError::msg)?;
    let empty_concat = build(&|_| vec![1.0; mw * mh], &|_| vec![0.0; per]).map_err(NodeError::msg)?;
    // A conditioning's image latent in model space, one per sample.
    let image_of = |img: &Latent| -> Result<Vec<Vec<f32>>, String> {
        let s = img.shape;
        if s[0] != lw || s[1] != lh || s[2] != channels as i64 || !(s[3] == 1 || s[3] == ln) || img.samples.len() as i64 != s.iter().product::<i64>() {
            return Err(format!("the conditioning's image latent is {s:?}; sampling a {shape:?} latent needs [{lw}, {lh}, {channels}, 1 or {ln}]"));
        }
        Ok((0..n).map(|i| process_in(&img.samples[if s[3] == 1 { 0 } else { i * per }..][..per])).collect())
    };
    let mut concat_of = |c: &CondConcat| -> Result<Option<Arc<Vec<f32>>>, String> {
        match c {
            CondConcat::Model => Ok(model_concat.clone()),
            CondConcat::Empty => Ok(empty_concat.clone()),
            CondConcat::Image(img) => {
                let images = image_of(img)?;
                build(&noise_mask_plane, &|i| images[i].clone())
            }
            // InpaintModelConditioning: its mask, bilinear to the size the model reads
            // (UNets see it rounded, as ComfyUI's `concat_cond`), and its masked image.
            CondConcat::Inpaint { image, mask } => {
                let m = |i: usize| {
                    let r = mask.resized(i, mw, mh);
                    if fill { r } else { r.into_iter().map(f32::round).collect() }
                };
                let images = image_of(image)?;
                build(&m, &|i| images[i].clone())
            }
        }
    };
    // ComfyUI's order of the conditioning dict: positive, middle, negative.
    let mut lists: Vec<&CondList> = vec![&guider.positive];
    let middle_at = guider.dual.as_ref().map(|d| {
        lists.push(&d.middle);
        lists.len() - 1
    });
    let negative_at = guider.negative.as_ref().map(|neg| {
        lists.push(neg);
        lists.len() - 1
    });
    let mut prepared = guidance::prepare(&lists, lw as usize, lh as usize, &mut concat_of).map_err(NodeError::msg)?;
    if let Some(i) = negative_at {
        let (pos, rest) = prepared.split_at_mut(1);
        guidance::apply_controls_to_uncond(&pos[0], &mut rest[i - 1]);
    }
    // The ControlNets of every entry, pinned and checked against the UNet once; their
    // hints are made per region size on first use (ComfyUI's `cond_hints`).
    let controls = Controls::collect(rt, prepared.iter().flatten().map(|p| &p.control))?;
    let nets = match &den {
        Den::Sd(d) => controls.nets(&d.unet().config)?,
        Den::Flux(_) | Den::Sd3(_) | Den::ZImage(_) | Den::Flux2(_) | Den::QwenImage(_) | Den::Wan(_) if prepared.iter().flatten().any(|p| p.control.is_some()) => return Err(NodeError::msg(format!("ControlNets apply to SD UNets; this model is {}", model.family))),
        Den::Flux(_) | Den::Sd3(_) | Den::ZImage(_) | Den::Flux2(_) | Den::QwenImage(_) | Den::Wan(_) => Vec::new(),
    };
    let mut hints: HashMap<(usize, i64, i64), Vec<f32>> = HashMap::new();
    let mut sides: Vec<Option<&[guidance::Prepared]>> = vec![None; prepared.len()];
    sides[0] = Some(&prepared[0]);
    if let (Some(i), true) = (middle_at, eval_middle) {
        sides[i] = Some(&prepared[i]);
    }
    if let (Some(i), true) = (negative_at, eval_negative) {
        sides[i] = Some(&prepared[i]);
    }
    let budget = BATCH_LATENTS * plane * n;
    // Skip-layer guidance's σ window, and whether the model call now leaves its layers out.
    let slg = model.slg.as_ref().map(|g| (g, (percent_to_sigma(g.percents.0), percent_to_sigma(g.percents.1))));
    let no_skip = SkipLayers::default();
    let slg_layers = model.slg.as_ref().map_or(&no_skip, |g| &g.layers);
    if slg.is_some() && matches!(den, Den::Sd(_) | Den::ZImage(_) | Den::Flux2(_) | Den::QwenImage(_) | Den::Wan(_)) {
        return Err(NodeError::msg(format!("skip-layer guidance runs on DiTs (SD3, FLUX, Chroma); this model is {}", model.family)));
    }
    let skipping = std::cell::Cell::new(false);

    let total = sigmas.len().saturating_sub(1) as u64;
    // The step being taken (0-based): the count of finished ones, for step ranges.
    let step = std::cell::Cell::new(0usize);
    let in_steps = |(a, b): (f32, f32)| {
        let at = |f: f32| if f >= 1.0 { usize::MAX } else { (f * total as f32) as usize };
        (at(a)..at(b)).contains(&step.get())
    };
    let mut denoiser = |x: &[f32], sigma: f32| -> Result<_, NodeError> {
        ctx.check_cancelled()?;
        // Differential Diffusion's mask for this call; the concat channels keep the plain
        // mask, as ComfyUI's inpainting models read it from the conditioning.
        let step_mask: Option<std::borrow::Cow<'_, [f32]>> = mask.as_deref().map(|m| match &differential {
            Some((dd, t)) => std::borrow::Cow::Owned(dd.apply(m, t.at(sigma))),
            None => std::borrow::Cow::Borrowed(m),
        });
        let mask = &step_mask;
        // ComfyUI's KSamplerX0Inpaint: outside the mask the latent is held at the input
        // image, noised to the current level, and the prediction there is the image itself.
        let blended: Option<Vec<f32>> = mask.as_ref().map(|m| {
            x.iter().enumerate().map(|(i, &v)| {
                let k = mask_at(m, i);
                v * k + if clean_inpaint { scaled[i] } else { noised(scaled[i], noise[i], sigma) } * (1.0 - k)
            }).collect()
        });
        let xin = blended.as_deref().unwrap_or(x);
        let active = |p: &guidance::Prepared| p.timestep_range.is_none_or(|(a, b)| sigma <= percent_to_sigma(a) && sigma >= percent_to_sigma(b)) && p.step_range.is_none_or(in_steps);
        if !prepared[0].iter().any(active) {
            return Err(NodeError::msg(format!("no positive conditioning applies at sigma {sigma} (check the timestep ranges)")));
        }
        let mut run_model = |items: &[guidance::ModelItem<'_>], s: [i64; 4]| -> Result<Vec<Vec<f32>>, NodeError> {
            // ComfyUI's get_control: a control outside its range passes on the ones under it.
            let active_controls = |it: &guidance::ModelItem<'_>| -> Vec<(usize, Arc<Control>)> {
                it.control.into_iter().flat_map(|c| c.chain()).filter(|c| sigma <= percent_to_sigma(c.range.0) && sigma >= percent_to_sigma(c.range.1)).map(|c| (controls.index(c), c.clone())).collect()
            };
            let active: Vec<Vec<(usize, Arc<Control>)>> = items.iter().map(active_controls).collect();
            for (k, c) in active.iter().flatten() {
                if let Entry::Vacant(slot) = hints.entry((*k, s[0], s[1])) {
                    let cfg = &nets[*k].config;
                    let sc = cfg.hint_scale();
                    slot.insert(hint_for(c, (s[0] * sc) as usize, (s[1] * sc) as usize, cfg.hint_channels as usize)?);
                }
            }
            let inputs: Vec<Vec<ControlInput<'_>>> = active
                .iter()
                .map(|list| list.iter().map(|(k, c)| ControlInput { net: &nets[*k], hint: &hints[&(*k, s[0], s[1])], images: c.image.n, strength: c.strength }).collect())
                .collect();
            match &mut den {
                Den::Sd(den) => {
                    let batch: Vec<BatchItem<'_>> = items.iter().zip(&inputs).map(|(it, control)| BatchItem { x: &it.x, cond: it.cond, concat: it.concat.as_deref(), ip: if Some(it.side) == negative_at { IpSide::Uncond } else { IpSide::Cond }, control }).collect();
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch)).map_err(err)
                }
                Den::Flux(den) => {
                    den.skip = if skipping.get() { slg_layers.clone() } else { SkipLayers::default() };
                    let batch: Vec<FluxItem<'_>> = items.iter().map(|it| FluxItem { x: &it.x, cond: it.cond, concat: it.concat.as_deref() }).collect();
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch)).map_err(err)
                }
                Den::Sd3(den) => {
                    let batch: Vec<Sd3Item<'_>> = items.iter().map(|it| Sd3Item { x: &it.x, cond: it.cond }).collect();
                    let skip = if skipping.get() { &slg_layers.double[..] } else { &[][..] };
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch, skip)).map_err(err)
                }
                Den::Flux2(den) => {
                    let batch: Vec<Flux2Item<'_>> = items.iter().map(|it| Flux2Item { x: &it.x, cond: it.cond }).collect();
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch)).map_err(err)
                }
                Den::ZImage(den) => {
                    let batch: Vec<ZImageItem<'_>> = items.iter().map(|it| ZImageItem { x: &it.x, cond: it.cond }).collect();
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch)).map_err(err)
                }
                Den::QwenImage(den) => {
                    let batch: Vec<QwenImageItem<'_>> = items.iter().map(|it| QwenImageItem { x: &it.x, cond: it.cond }).collect();
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch)).map_err(err)
                }
                Den::Wan(den) => {
                    // TI2V reads each frame's level: the mask's mean over the frame.
                    den.frame_levels = match mask.as_deref() {
                        Some(m) if den.config().frame_timesteps() => Some(m.chunks_exact(plane).map(|p| p.iter().sum::<f32>() / plane as f32).collect()),
                        _ => None,
                    };
                    let concats = items.iter().map(|it| wan_concat(den.config(), it.cond, s, den.frames, &model.latent)).collect::<Result<Vec<_>, _>>()?;
                    let controls = items.iter().map(|it| wan_vace(den.config(), it.cond, s, den.frames, &model.latent)).collect::<Result<Vec<_>, _>>()?;
                    let batch: Vec<WanItem<'_>> = items
                        .iter()
                        .zip(&concats)
                        .zip(&controls)
                        .map(|((it, c), v)| WanItem { x: &it.x, cond: it.cond, concat: c.as_deref(), image: it.cond.image_tokens.as_ref().map(|t| &t.data[..]), vace: v })
                        .collect();
                    rt.with_backend(Module::Diffusion, |b| den.denoise_batch(b, s, sigma, &batch)).map_err(err)
                }
            }
        };
        let calc_error = |e| match e {
            guidance::CalcError::Input(m) => NodeError::msg(m),
            guidance::CalcError::Model(e) => e,
        };
        let mut out = guidance::calc_cond_batch(&sides, xin, shape, extra as usize, &active, budget, &mut run_model).map_err(calc_error)?;
        let take = |out: &mut Vec<Option<Vec<f32>>>, i: Option<usize>| i.and_then(|i| out[i].take());
        let (mid, neg) = (take(&mut out, middle_at), take(&mut out, negative_at));
        let pos = out[0].take().expect("the positive side is always evaluated");
        // ComfyUI's pre-CFG hooks change the positive prediction before anything reads it;
        // to the hooks a skipped negative pass is a prediction of zeros, as in ComfyUI.
        let hook_sides: Option<(Vec<f32>, Vec<f32>)> = if hooks.is_empty() {
            None
        } else {
            let mut p = pos.clone();
            let n = neg.clone().unwrap_or_else(|| vec![0.0; p.len()]);
            cfg_hooks::pre_cfg(&hooks.pre, &mut p, &n, shape).map_err(NodeError::msg)?;
            Some((p, n))
        };
        let pos = match &hook_sides {
            Some((p, _)) => p.clone(),
            None => pos,
        };
        // Skip-layer guidance (ComfyUI's SkipLayerGuidanceDiT post-CFG step): the positive
        // side again without the layers, the result pushed away from it.
        let slg_pos = match slg {
            Some((g, (hi, lo))) if g.scale > 0.0 && slg_now(g, sigma, (hi, lo), step.get(), total) => Some((g.scale, g.rescaling, pos.clone())),
            _ => None,
        };
        let mut d = match (hooks.rescale, &hook_sides) {
            (Some(m), Some((p, n))) => sdflow_core::sampling::samplers::Denoised { denoised: cfg_hooks::rescale_cfg(m, cond_scale, p, n, xin, sigma, shape), uncond: neg },
            _ => mix.mix(pos, mid, neg),
        };
        // Post-CFG hooks in the order they were added, skip-layer guidance among them.
        let post = |d: &mut sdflow_core::sampling::samplers::Denoised, after_slg: bool| {
            if let Some((p, n)) = &hook_sides {
                for h in hooks.post.iter().filter(|h| h.after_slg == after_slg) {
                    d.denoised = cfg_hooks::post_cfg(h.kind, std::mem::take(&mut d.denoised), p, n, cond_scale, xin, shape);
                }
            }
        };
        post(&mut d, false);
        if let Some((scale, rescaling, cond)) = slg_pos {
            skipping.set(true);
            let only_positive: Vec<Option<&[guidance::Prepared]>> = sides.iter().enumerate().map(|(i, s)| if i == 0 { *s } else { None }).collect();
            let skipped = guidance::calc_cond_batch(&only_positive, xin, shape, extra as usize, &active, budget, &mut run_model);
            skipping.set(false);
            let skipped = skipped.map_err(calc_error)?.swap_remove(0).expect("the positive side is evaluated");
            for ((v, c), s) in d.denoised.iter_mut().zip(&cond).zip(&skipped) {
                *v += (c - s) * scale;
            }
            if rescaling != 0.0 {
                let factor = rescaling * std_dev(&cond) / std_dev(&d.denoised) + 1.0 - rescaling;
                d.denoised.iter_mut().for_each(|v| *v *= factor);
            }
        }
        post(&mut d, true);
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
        step.set(p.step);
        ctx.progress(p.step as u64, total);
        let shown = if rt.preview_noisy { p.x } else { p.denoised };
        // A latent of frames previews its first frame (Qwen-Image-Layered: the composite).
        let first;
        let (shown, shape) = if latent.frames > 1 {
            let [w, h, _, _] = shape;
            let c = latent.channels();
            first = sdflow_core::models::dit::frame_of(shown, c as usize, latent.frames, (w * h) as usize, 0);
            (&first[..], [w, h, c, 1])
        } else {
            (shown, shape)
        };
        if let Some(image) = crate::sampling::preview::preview(rt, model.family, shown, shape) {
            ctx.preview(image);
        }
    };
    let mut opts = SampleOpts { flow, ..choice.opts.clone() };
    if comfy {
        // A generator per sample seeds a tree per sample (its own seed, see
        // `NoiseSource::draw`) unless the sampler fixes one.
        if !per_sample {
            opts.brownian_seed = opts.brownian_seed.or(Some(seed));
        }
        // ComfyUI's samplers place a flow model's first sigma and SA-Solver's noise
        // interval by the model's own shift.
        if let Some(shift) = model.flow {
            opts.flow_first_sigma = opts.flow_first_sigma.or(Some(shift.percent_to_sigma(1e-4)));
            opts.sa_tau_interval = opts.sa_tau_interval.or(Some((shift.percent_to_sigma(0.2), shift.percent_to_sigma(0.8))));
        }
    }
    let out = sample(choice.sampler, &mut denoiser, x, sigmas, &mut rng, &opts, Some(&mut progress)).map_err(|e| match e {
        SampleError::Model { error, .. } => error,
        other => err(other),
    })?;
    // A flow model's result at a last σ above 0 (leftover noise) is rescaled by 1/(1 − σ), as
    // ComfyUI's CONST `inverse_noise_scaling` does.
    let last = sigmas.last().copied().unwrap_or(0.0);
    let keep = if flow && last > 0.0 && last < 1.0 { 1.0 / (1.0 - last) } else { 1.0 };
    let unscale = |v: &[f32], k: f32| -> Vec<f32> { model.latent.from_model(v, format_plane, k) };
    let denoised = unscale(last_denoised.as_deref().unwrap_or(&out), 1.0);
    let mk = |samples| Latent { samples, shape, noise_mask: latent.noise_mask.clone(), batch_index: latent.batch_index.clone(), frames: latent.frames };
    Ok((mk(unscale(&out, keep)), mk(denoised)))
}

/// ComfyUI's `prepare_noise` with a latent's `batch_index`: one draw of `per` values for
/// every index from 0 to the largest, each sample taking its index's, so a sample keeps
/// its noise when taken out of (or repeated in) a batch.
pub(crate) fn batch_noise(rng: &mut dyn sdflow_core::sampling::rng::Rng, inds: &[usize], n: usize, per: usize) -> Result<Vec<f32>, NodeError> {
    if inds.len() != n {
        return Err(NodeError::InvalidInput { input: "latent_image".into(), message: format!("the latent has {n} samples but {} batch indices", inds.len()) });
    }
    // Every draw up to the largest index is made (the stream must advance past it), but
    // only the ones used are kept; past this many the draws alone would take minutes.
    const MAX_INDEX: usize = 1 << 16;
    let max = inds.iter().copied().max().unwrap_or(0);
    if max >= MAX_INDEX {
        return Err(NodeError::InvalidInput { input: "latent_image".into(), message: format!("batch index {max} is beyond {}", MAX_INDEX - 1) });
    }
    let mut drawn: HashMap<usize, Vec<f32>> = HashMap::new();
    for i in 0..=max {
        let v = rng.randn(per);
        if inds.contains(&i) {
            drawn.insert(i, v);
        }
    }
    Ok(inds.iter().flat_map(|i| drawn[i].iter().copied()).collect())
}

/// The channels a Wan I2V model reads after the latent's `shape` of `frames` frames
/// (ComfyUI's `WAN21.concat_cond`): the known-frames mask (4 per frame) and the start
/// frames' latent in model space, for every sample; zeros without a WanImageToVideo;
/// `None` for a model that reads none.
fn wan_concat(c: &WanConfig, cond: &sdflow_core::models::conditioning::Conditioning, shape: [i64; 4], frames: usize, format: &crate::values::LatentFormat) -> Result<Option<Vec<f32>>, NodeError> {
    let extra = (c.in_channels - c.out_channels) as usize;
    if extra == 0 {
        return Ok(None);
    }
    let [w, h, _, n] = shape.map(|d| d as usize);
    let plane = w * h;
    let per = match &cond.video_image {
        None => vec![0.0; extra * frames * plane],
        Some(v) => {
            if (v.width, v.height, v.frames) != (w, h, frames) {
                return Err(NodeError::msg(format!("WanImageToVideo's start frames are {}x{} latent pixels × {} frames; the latent sampled is {w}x{h} × {frames}", v.width, v.height, v.frames)));
            }
            if extra != 4 + v.channels {
                return Err(NodeError::msg(format!("this Wan model reads {extra} image channels; WanImageToVideo gives 4 mask and {} latent channels", v.channels)));
            }
            let mut per = v.known.clone();
            per.extend(format.to_model(&v.latent, plane * frames));
            per
        }
    };
    Ok(Some(per.repeat(n)))
}

/// A Wan VACE model's controls for `shape` ([W, H, C·T, N]) in model space: the
/// conditioning's (WanVaceToVideo), or without one ComfyUI's default (the VAE's zero
/// latent, every mask cell 1, strength 1); none for other Wan models, which refuse one.
fn wan_vace(c: &WanConfig, cond: &sdflow_core::models::conditioning::Conditioning, shape: [i64; 4], frames: usize, format: &crate::values::LatentFormat) -> Result<Vec<sdflow_core::models::wan::VaceInput>, NodeError> {
    use sdflow_core::models::conditioning::VaceControl;
    if c.vace_layers == 0 {
        if !cond.vace.is_empty() {
            return Err(NodeError::msg("WanVaceToVideo's control for a Wan model without VACE blocks: load a Wan VACE model (wan2.1_vace_*)"));
        }
        return Ok(Vec::new());
    }
    let [w, h, _, n] = shape.map(|d| d as usize);
    let plane = w * h;
    let half = c.vace_in_channels as usize - 64;
    let default = [std::sync::Arc::new(VaceControl { frames: vec![0.0; half * frames * plane], mask: vec![1.0; 64 * frames * plane], length: frames, height: h, width: w, strength: 1.0 })];
    let list = if cond.vace.is_empty() { &default[..] } else { &cond.vace[..] };
    list.iter()
        .map(|v| {
            if (v.width, v.height, v.length) != (w, h, frames) || v.frames.len() != half * frames * plane || v.mask.len() != 64 * frames * plane {
                return Err(NodeError::msg(format!("WanVaceToVideo's control is {}x{} latent pixels × {} frames; the latent sampled is {w}x{h} × {frames} (use the node's latent, and TrimVideoLatent after sampling)", v.width, v.height, v.length)));
            }
            // Both latents' channels normalised as the model's are (the format's statistics
            // repeat every 16 channels).
            let mut data = format.to_model(&v.frames, frames * plane);
            data.extend_from_slice(&v.mask);
            Ok(sdflow_core::models::wan::VaceInput { data: data.repeat(n), strength: v.strength })
        })
        .collect()
}

/// The model a sampler runs: an SD UNet, a FLUX.1/Chroma or FLUX.2 transformer, an SD3
/// or Qwen-Image MMDiT, a Z-Image S3-DiT, or a Wan video transformer.
enum Den<'w> {
    Sd(SdDenoiser<'w>),
    Flux(FluxDenoiser<'w>),
    Sd3(Sd3Denoiser<'w>),
    ZImage(ZImageDenoiser<'w>),
    Flux2(Flux2Denoiser<'w>),
    QwenImage(QwenImageDenoiser<'w>),
    Wan(WanDenoiser<'w>),
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
        let steps = steps_from(inputs)?;
        let denoise = inputs.float("denoise")? as f32;
        let discard = comfy_discards_penultimate_sigma(inputs.string("sampler_name")?);
        let sigmas = ksampler_sigmas(scheduler, steps, denoise, &guider.model.schedule, &ScheduleOpts::default(), discard).map_err(err)?;
        let latent = inputs.downcast::<Latent>("latent_image")?;
        let (out, _) = sample_latent(&self.rt, ctx, &guider, &choice, &sigmas, NoiseSource::new(inputs.uint("seed")?, true, rng_from(inputs)?), latent)?;
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
        dual: None,
    })
}

/// Whether skip-layer guidance runs at this model call: σ in `(hi, lo)` (ComfyUI), or
/// the 0-based `step` of `steps` inside sd.cpp's window (its 1-based `k` with
/// `⌊start·(steps+1)⌋ < k < ⌊end·(steps+1)⌋`, in sd.cpp's f32 arithmetic).
fn slg_now(g: &crate::values::SkipLayerGuidance, sigma: f32, (hi, lo): (f32, f32), step: usize, steps: u64) -> bool {
    match g.window {
        crate::values::SlgWindow::Sigmas => sigma <= hi && sigma >= lo,
        crate::values::SlgWindow::Steps => {
            let n = (steps + 1) as f32;
            let k = step as i64 + 1;
            k > (g.percents.0 * n) as i64 && k < (g.percents.1 * n) as i64
        }
    }
}

/// torch's `std()`: the unbiased standard deviation of all values, accumulated in f64.
fn std_dev(v: &[f32]) -> f32 {
    let n = v.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{SkipLayerGuidance, SlgWindow};

    /// VariationNoise's draw: each sample from its own seed's generator (seed + its batch
    /// position), slerped towards its variation seed's noise by the strength (the seed then
    /// fixed), and the steps' noise from fresh generators of the same seeds (ComfyUI's
    /// `cpu`) or going on from them (sd.cpp's kinds).
    #[test]
    fn variation_noise_draws_a1111s_seeds() {
        use sdflow_core::sampling::variation::slerp;
        let latent = |n: i64, inds: Option<Vec<usize>>| Latent { samples: vec![0.0; (4 * 3 * 2 * n) as usize], shape: [4, 3, 2, n], noise_mask: None, batch_index: inds, frames: 1 };
        let per = 4 * 3 * 2;
        let source = |strength: f32, kind: RngKind| NoiseSource { per_sample: Some(Variation { subseed: 50, strength }), ..NoiseSource::new(10, true, Some(kind)) };
        let randn = |kind: RngKind, seed: u64, n: usize| kind.seeded(seed).randn(n);

        let (noise, mut steps, comfy) = source(0.0, RngKind::Cpu).draw(RngKind::Cpu, &latent(3, None)).unwrap();
        assert!(comfy);
        for k in 0..3 {
            assert_eq!(noise[k * per..(k + 1) * per], randn(RngKind::Cpu, 10 + k as u64, per)[..], "sample {k}: seed 10 + {k}");
        }
        let drawn = steps.randn(3 * per);
        assert_eq!(drawn[per..2 * per], randn(RngKind::Cpu, 11, per)[..], "steps from a fresh generator of the sample's seed");
        assert_eq!(steps.brownian_seeds(), vec![10, 11, 12]);

        let (noise, _, _) = source(0.4, RngKind::Cpu).draw(RngKind::Cpu, &latent(2, None)).unwrap();
        for k in 0..2 {
            let want = slerp(0.4, &randn(RngKind::Cpu, 10, per), &randn(RngKind::Cpu, 50 + k as u64, per), 2, 3, 4);
            assert_eq!(noise[k * per..(k + 1) * per], want[..], "sample {k}: seed 10 towards 50 + {k}");
        }

        // Batch positions follow the latent's batch_index; sd.cpp's generators go on.
        let (noise, mut steps, comfy) = source(0.0, RngKind::Cuda).draw(RngKind::Cpu, &latent(2, Some(vec![4, 1]))).unwrap();
        assert!(!comfy);
        let mut g4 = RngKind::Cuda.seeded(14);
        assert_eq!(noise[..per], g4.randn(per)[..]);
        assert_eq!(noise[per..], randn(RngKind::Cuda, 11, per)[..]);
        assert_eq!(steps.randn(2 * per)[..per], g4.randn(per)[..]);

        // Without add_noise: no initial noise, the steps' noise still the seeds'.
        let quiet = NoiseSource { add: false, ..source(0.5, RngKind::Cpu) };
        let (noise, _, _) = quiet.draw(RngKind::Cpu, &latent(2, None)).unwrap();
        assert!(noise.iter().all(|&v| v == 0.0));
        assert!(source(1.5, RngKind::Cpu).draw(RngKind::Cpu, &latent(1, None)).is_err());
        // ComfyUI's RandomNoise is one stream over the batch.
        let (noise, _, _) = NoiseSource::new(10, true, None).draw(RngKind::Cpu, &latent(2, None)).unwrap();
        assert_eq!(noise, randn(RngKind::Cpu, 10, 2 * per));
    }

    /// sd-cli's defaults (0.01, 0.2) over 20 steps run SLG at k = 1, 2, 3 (from 1): steps
    /// 0..3; ComfyUI's window reads σ instead.
    #[test]
    fn slg_windows() {
        let g = |window| SkipLayerGuidance { layers: Default::default(), scale: 2.5, rescaling: 0.0, percents: (0.01, 0.2), window };
        let steps = g(SlgWindow::Steps);
        let on: Vec<usize> = (0..20).filter(|&s| slg_now(&steps, 0.5, (1.0, 0.0), s, 20)).collect();
        assert_eq!(on, vec![0, 1, 2]);
        let late = SkipLayerGuidance { percents: (0.5, 1.0), ..g(SlgWindow::Steps) };
        assert_eq!((0..10).filter(|&s| slg_now(&late, 0.5, (1.0, 0.0), s, 10)).collect::<Vec<_>>(), vec![5, 6, 7, 8, 9]);
        let sigmas = g(SlgWindow::Sigmas);
        assert!(slg_now(&sigmas, 0.8, (0.9, 0.7), 15, 20) && !slg_now(&sigmas, 0.95, (0.9, 0.7), 0, 20));
    }
}
