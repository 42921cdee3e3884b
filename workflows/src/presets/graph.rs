//! The graph-building pieces every preset shares: a builder that numbers nodes (core
//! nodes first), the sampling pass, and the checks of flag values.

use std::collections::BTreeMap;

use sdflow_executor::{Header, InputValue, NodeSpec, Workflow};
use serde_json::json;

use super::{invalid, not_supported, workflow_sampler_name, workflow_scheduler_name, Preset, PresetError, TilingParams};

/// Where a link input comes from, by builder key.
#[derive(Clone)]
pub(super) struct Out(pub(super) String, pub(super) usize);

pub(super) fn link(o: &Out) -> InputValue {
    InputValue::link(o.0.clone(), o.1)
}

pub(super) struct Entry {
    pub(super) key: String,
    pub(super) core: bool,
    pub(super) origin: String,
    pub(super) spec: NodeSpec,
}

/// Builds a graph with symbolic keys, numbered at the end (core nodes first).
#[derive(Default)]
pub(super) struct Builder {
    pub(super) entries: Vec<Entry>,
    /// What the decoded result is laid over before it is saved (A1111's inpainting
    /// overlay), set by the input stage for the tail.
    pub(super) paste: Option<PasteBack>,
}

/// A1111's overlay of an inpainting run: the result shows through `mask` over
/// `destination` (the input as sampled, or the whole input with "only masked", where the
/// result is first scaled back to `region` and put there).
pub(super) struct PasteBack {
    pub(super) destination: Out,
    pub(super) mask: Out,
    pub(super) region: Option<[i64; 4]>,
}

impl Builder {
    pub(super) fn add(&mut self, key: &str, core: bool, origin: &str, spec: NodeSpec) -> String {
        let key = if self.entries.iter().any(|e| e.key == key) { format!("{key}#{}", self.entries.len()) } else { key.to_string() };
        self.entries.push(Entry { key: key.clone(), core, origin: origin.to_string(), spec });
        key
    }

    pub(super) fn core(&mut self, key: &str, origin: &str, spec: NodeSpec) -> String {
        self.add(key, true, origin, spec)
    }

    pub(super) fn extra(&mut self, key: &str, origin: &str, spec: NodeSpec) -> String {
        self.add(key, false, origin, spec)
    }

    pub(super) fn finish(self, title: String, description: String) -> Preset {
        let mut ids = BTreeMap::new();
        let order = self.entries.iter().filter(|e| e.core).chain(self.entries.iter().filter(|e| !e.core));
        for (i, e) in order.enumerate() {
            ids.insert(e.key.clone(), (i + 1).to_string());
        }
        let mut wf = Workflow { header: Some(Header { title: Some(title), description: Some(description), ..Header::default() }), nodes: BTreeMap::new() };
        let mut origins = BTreeMap::new();
        let mut save_nodes = Vec::new();
        for e in self.entries {
            let id = ids[&e.key].clone();
            let mut spec = e.spec;
            for v in spec.inputs.values_mut() {
                if let InputValue::Link { node, .. } = v {
                    if let Some(n) = ids.get(node.as_str()) {
                        *node = n.clone();
                    }
                }
            }
            if spec.class_type == "SaveImage" || spec.class_type == "SaveVideoSdCpp" {
                save_nodes.push(id.clone());
            }
            origins.insert(id.clone(), e.origin);
            wf.nodes.insert(id, spec);
        }
        save_nodes.sort_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX));
        Preset { workflow: wf, origins, save_nodes }
    }
}

pub(super) fn text_encode(text: &str, clip: &Out, title: &str) -> NodeSpec {
    let mut n = NodeSpec::new("CLIPTextEncode").with_const("text", json!(text)).with_input("clip", link(clip));
    n.title = Some(title.into());
    n
}

/// What every sampling pass of a preset shares: `-s`, `--cfg-scale`, the sampler and
/// scheduler (workflow names), `--rng` and `--eta`.
#[derive(Clone, Copy)]
pub(super) struct Sampling<'a> {
    pub(super) seed: i64,
    pub(super) cfg: f64,
    pub(super) sampler: &'a str,
    pub(super) scheduler: &'a str,
    pub(super) rng: Option<&'a str>,
    pub(super) eta: Option<f64>,
    /// A1111's seeds: the variation seed and its strength; every pass then samples
    /// through SamplerCustomAdvanced with a VariationNoise (a generator per image).
    pub(super) variation: Option<(i64, f64)>,
    /// A1111's `initial_noise_multiplier` (1: none), given to the VariationNoise of the
    /// passes that add noise ([`Sampling::variation`] is set whenever it is not 1).
    pub(super) noise_multiplier: f64,
}

impl Sampling<'_> {
    /// The SAMPLER node `--eta` needs (KSampler takes only a sampler's name).
    pub(super) fn select_node(&self, sampler: &str) -> Option<NodeSpec> {
        self.eta.map(|eta| NodeSpec::new("KSamplerSelectAdvanced").with_const("sampler_name", json!(sampler)).with_const("eta", json!(eta)).with_const("s_noise", json!(1.0)).with_const("noise", json!("sampler")))
    }

    /// The SAMPLER node of a SamplerCustom pass and the flag it stands for: with `--eta`
    /// its KSamplerSelectAdvanced, else KSamplerSelect.
    pub(super) fn sampler_node(&self, sampler: &str) -> (NodeSpec, &'static str) {
        match self.select_node(sampler) {
            Some(n) => (n, "--eta"),
            None => (NodeSpec::new("KSamplerSelect").with_const("sampler_name", json!(sampler)), "--sampling-method"),
        }
    }

    /// A VariationNoise of this pass's seed; `add` false for a pass that goes on from
    /// leftover noise.
    pub(super) fn variation_noise(&self, subseed: i64, strength: f64, add: bool) -> NodeSpec {
        let mut node = NodeSpec::new("VariationNoise").with_const("noise_seed", json!(self.seed)).with_const("variation_seed", json!(subseed)).with_const("variation_strength", json!(strength));
        if !add {
            node = node.with_const("add_noise", json!(false));
        } else if self.noise_multiplier != 1.0 {
            node = node.with_const("initial_noise_multiplier", json!(self.noise_multiplier));
        }
        self.with_rng(node)
    }

    /// `node` with `--rng`, left out unless asked for: the nodes' default is ComfyUI's
    /// CPU noise.
    pub(super) fn with_rng(&self, node: NodeSpec) -> NodeSpec {
        match self.rng {
            Some(r) => node.with_const("rng", json!(r)),
            None => node,
        }
    }
}

/// The pass's schedule when it is not `--steps` of `--scheduler`.
pub(super) enum CustomSigmas<'a> {
    /// `--sigmas` with `-i`: cut to the strength as sd-cli's img2img cuts its schedule.
    Strength(&'a [f32], f64),
    /// `--hires-sigmas`, or `--sigmas` without `-i`: the schedule as given.
    Whole(&'a [f32]),
}

/// One sampling pass: KSampler, or SamplerCustom when `--eta` or custom sigmas ask for
/// more than KSampler's inputs (its SAMPLER a KSamplerSelectAdvanced, its SIGMAS a
/// ManualSigmas), so that the plain graphs stay ComfyUI's KSampler graphs; with A1111's
/// seeds ([`Sampling::variation`]) SamplerCustomAdvanced with a VariationNoise.
#[allow(clippy::too_many_arguments)]
pub(super) fn sample_pass(b: &mut Builder, key: &str, origin: &str, s: &Sampling<'_>, model: &Out, steps: i64, sigmas: Option<CustomSigmas<'_>>, denoise: f64, pos: &Out, neg: &Out, latent: &Out) -> String {
    if s.eta.is_none() && sigmas.is_none() && s.variation.is_none() {
        let node = NodeSpec::new("KSampler")
            .with_input("model", link(model))
            .with_const("seed", json!(s.seed))
            .with_const("steps", json!(steps))
            .with_const("cfg", json!(s.cfg))
            .with_const("sampler_name", json!(s.sampler))
            .with_const("scheduler", json!(s.scheduler))
            .with_input("positive", link(pos))
            .with_input("negative", link(neg))
            .with_input("latent_image", link(latent))
            .with_const("denoise", json!(denoise));
        return b.core(key, origin, s.with_rng(node));
    }
    let (select, select_origin) = s.sampler_node(s.sampler);
    let select = b.extra(&format!("{key}_select"), select_origin, select);
    let schedule = schedule_node(b, key, origin, s, model, steps, sigmas, denoise);
    if let Some((subseed, strength)) = s.variation {
        let noise = b.extra(&format!("{key}_noise"), "-s", s.variation_noise(subseed, strength, true));
        let guider = b.extra(&format!("{key}_guider"), origin, cfg_guider(model, s.cfg, pos, neg));
        let node = NodeSpec::new("SamplerCustomAdvanced")
            .with_input("noise", InputValue::link(noise, 0))
            .with_input("guider", InputValue::link(guider, 0))
            .with_input("sampler", InputValue::link(select, 0))
            .with_input("sigmas", link(&schedule))
            .with_input("latent_image", link(latent));
        return b.core(key, origin, node);
    }
    let node = NodeSpec::new("SamplerCustom")
        .with_input("model", link(model))
        .with_const("add_noise", json!(true))
        .with_const("noise_seed", json!(s.seed))
        .with_const("cfg", json!(s.cfg))
        .with_input("positive", link(pos))
        .with_input("negative", link(neg))
        .with_input("sampler", InputValue::link(select, 0))
        .with_input("sigmas", link(&schedule))
        .with_input("latent_image", link(latent));
    b.core(key, origin, s.with_rng(node))
}

/// A1111's refiner over one pass: the model and prompts that take the pass over after
/// `switch_at` of its steps.
pub(super) struct Refine {
    pub(super) model: Out,
    pub(super) pos: Out,
    pub(super) neg: Out,
    pub(super) switch_at: f64,
    /// The checkpoint's name, for the graph's description.
    pub(super) model_name: String,
}

/// The step A1111 switches to the refiner at (by sampling steps): the first `k` of `steps`
/// whose fraction `k / steps` is not below `switch_at`.
pub(super) fn switch_step(steps: usize, switch_at: f64) -> usize {
    (0..=steps).find(|&k| k as f64 / steps.max(1) as f64 >= switch_at).unwrap_or(steps)
}

/// [`sample_pass`] with a refiner taking over after its switch step: KSamplerAdvanced for
/// the steps before it (returning its leftover noise) and KSamplerAdvanced for the rest on
/// the refiner (adding none), as ComfyUI splits a schedule; SplitSigmas between two
/// SamplerCustom (or, with A1111's seeds, SamplerCustomAdvanced) passes when the pass needs
/// those. A switch at the first step runs the refiner alone, one at the end the model
/// alone. Returns the last pass's node and whether the refiner sampled.
#[allow(clippy::too_many_arguments)]
pub(super) fn refined_pass(b: &mut Builder, key: &str, origin: &str, s: &Sampling<'_>, model: &Out, steps: i64, sigmas: Option<CustomSigmas<'_>>, denoise: f64, pos: &Out, neg: &Out, latent: &Out, r: &Refine) -> (String, bool) {
    let run = match &sigmas {
        None => steps as usize,
        Some(CustomSigmas::Whole(list)) => list.len().saturating_sub(1),
        Some(CustomSigmas::Strength(list, strength)) => list.len().saturating_sub(1) - strength_split(list.len(), *strength),
    };
    let k = switch_step(run, r.switch_at);
    if k >= run || denoise <= 0.0 {
        return (sample_pass(b, key, origin, s, model, steps, sigmas, denoise, pos, neg, latent), false);
    }
    if k == 0 {
        return (sample_pass(b, key, "--refiner", s, &r.model, steps, sigmas, denoise, &r.pos, &r.neg, latent), true);
    }
    if s.eta.is_none() && sigmas.is_none() && s.variation.is_none() {
        // KSampler's schedule at a denoise below 1 is the tail of one for steps / denoise
        // steps: the same steps, addressed by KSamplerAdvanced's start and end.
        let d = denoise as f32;
        let total = if d > 0.9999 { steps } else { (steps as f64 / d as f64) as i64 };
        let start = total - steps;
        let advanced = |m: &Out, p: &Out, n: &Out, from: &Out, add: &str, range: (i64, i64), leftover: &str| {
            let node = NodeSpec::new("KSamplerAdvanced")
                .with_input("model", link(m))
                .with_const("add_noise", json!(add))
                .with_const("noise_seed", json!(s.seed))
                .with_const("steps", json!(total))
                .with_const("cfg", json!(s.cfg))
                .with_const("sampler_name", json!(s.sampler))
                .with_const("scheduler", json!(s.scheduler))
                .with_input("positive", link(p))
                .with_input("negative", link(n))
                .with_input("latent_image", link(from))
                .with_const("start_at_step", json!(range.0))
                .with_const("end_at_step", json!(range.1))
                .with_const("return_with_leftover_noise", json!(leftover));
            s.with_rng(node)
        };
        let first = b.core(key, origin, advanced(model, pos, neg, latent, "enable", (start, start + k as i64), "enable"));
        return (b.extra(&format!("{key}_refiner"), "--refiner", advanced(&r.model, &r.pos, &r.neg, &Out(first, 0), "disable", (start + k as i64, 10000), "disable")), true);
    }
    let (select, select_origin) = s.sampler_node(s.sampler);
    let select = b.extra(&format!("{key}_select"), select_origin, select);
    let schedule = schedule_node(b, key, origin, s, model, steps, sigmas, denoise);
    let split = b.extra(&format!("{key}_switch"), "--refiner-switch-at", NodeSpec::new("SplitSigmas").with_input("sigmas", link(&schedule)).with_const("step", json!(k)));
    let (high, low) = (Out(split.clone(), 0), Out(split, 1));
    let pass = |b: &mut Builder, m: &Out, p: &Out, n: &Out, sig: &Out, from: &Out, add: bool, key: &str, core: bool, origin: &str| -> String {
        let node = match s.variation {
            Some((subseed, strength)) => {
                let noise = b.extra(&format!("{key}_noise"), "-s", s.variation_noise(subseed, strength, add));
                let guider = b.extra(&format!("{key}_guider"), origin, cfg_guider(m, s.cfg, p, n));
                NodeSpec::new("SamplerCustomAdvanced").with_input("noise", InputValue::link(noise, 0)).with_input("guider", InputValue::link(guider, 0))
            }
            None => s.with_rng(NodeSpec::new("SamplerCustom").with_input("model", link(m)).with_const("add_noise", json!(add)).with_const("noise_seed", json!(s.seed)).with_const("cfg", json!(s.cfg)).with_input("positive", link(p)).with_input("negative", link(n))),
        };
        let node = node.with_input("sampler", InputValue::link(select.clone(), 0)).with_input("sigmas", link(sig)).with_input("latent_image", link(from));
        if core {
            b.core(key, origin, node)
        } else {
            b.extra(key, origin, node)
        }
    };
    let first = pass(b, model, pos, neg, &high, latent, true, key, true, origin);
    (pass(b, &r.model, &r.pos, &r.neg, &low, &Out(first, 0), false, &format!("{key}_refiner"), false, "--refiner"), true)
}

/// The SIGMAS of a custom-sampling pass: BasicScheduler, or the given list (cut to the
/// strength for img2img).
#[allow(clippy::too_many_arguments)]
fn schedule_node(b: &mut Builder, key: &str, origin: &str, s: &Sampling<'_>, model: &Out, steps: i64, sigmas: Option<CustomSigmas<'_>>, denoise: f64) -> Out {
    match sigmas {
        None => Out(b.extra(&format!("{key}_sigmas"), "--scheduler", NodeSpec::new("BasicScheduler").with_input("model", link(model)).with_const("scheduler", json!(s.scheduler)).with_const("steps", json!(steps)).with_const("denoise", json!(denoise))), 0),
        Some(CustomSigmas::Whole(list)) => Out(b.extra(&format!("{key}_sigmas"), origin, manual_sigmas(list)), 0),
        Some(CustomSigmas::Strength(list, strength)) => {
            let manual = b.extra(&format!("{key}_sigmas"), origin, manual_sigmas(list));
            match strength_split(list.len(), strength) {
                0 => Out(manual, 0),
                step => Out(b.extra(&format!("{key}_split"), "--strength", NodeSpec::new("SplitSigmas").with_input("sigmas", InputValue::link(manual, 0)).with_const("step", json!(step))), 1),
            }
        }
    }
}

pub(super) fn cfg_guider(model: &Out, cfg: f64, pos: &Out, neg: &Out) -> NodeSpec {
    NodeSpec::new("CFGGuider").with_input("model", link(model)).with_input("positive", link(pos)).with_input("negative", link(neg)).with_const("cfg", json!(cfg))
}

pub(super) fn manual_sigmas(list: &[f32]) -> NodeSpec {
    let text: Vec<String> = list.iter().map(f32::to_string).collect();
    NodeSpec::new("ManualSigmas").with_const("sigmas", json!(text.join(", ")))
}

/// Where sd-cli's img2img starts in a custom schedule of `len` sigmas at `strength`: it
/// runs the last `t_enc = floor(steps * strength)` steps (at most `steps - 1`), from one
/// sigma earlier. SplitSigmas' `step`: its low half is what runs.
pub(super) fn strength_split(len: usize, strength: f64) -> usize {
    if strength >= 1.0 || len < 2 {
        return 0;
    }
    let steps = len - 1;
    let t_enc = ((steps as f32 * strength as f32) as usize).min(steps - 1);
    steps - t_enc - 1
}

pub(super) fn check_range(flag: &str, v: i64, lo: i64, hi: i64) -> Result<(), PresetError> {
    if v < lo || v > hi {
        return Err(invalid(flag, format!("{v} is outside {lo}..={hi}")));
    }
    Ok(())
}

/// sd-cli's tile options beyond ComfyUI's square `tile_size`, as the tiled nodes' optional
/// inputs; left out when not given, so the plain graphs stay ComfyUI's.
pub(super) fn sd_cli_tiles(mut node: NodeSpec, t: &TilingParams) -> NodeSpec {
    let (tx, ty) = t.tile_size;
    if tx != ty {
        node = node.with_const("tile_height", json!(ty * 8));
    }
    if let Some((rx, ry)) = t.relative {
        node = node.with_const("relative_tile_size", json!(format!("{rx}x{ry}")));
    }
    node
}

/// `--prediction`: what the model predicts, set over the loader's MODEL (ComfyUI's
/// model-sampling nodes; sd-cli's names).
pub(super) fn prediction_node(b: &mut Builder, model: &Out, prediction: Option<&str>) -> Result<Out, PresetError> {
    let Some(p) = prediction else { return Ok(model.clone()) };
    let node = match p {
        "eps" | "v" => NodeSpec::new("ModelSamplingDiscrete").with_input("model", link(model)).with_const("sampling", json!(if p == "eps" { "eps" } else { "v_prediction" })).with_const("zsnr", json!(false)),
        // sd.cpp's EDMVDenoiser range (CosXL's).
        "edm_v" => NodeSpec::new("ModelSamplingContinuousEDM").with_input("model", link(model)).with_const("sampling", json!("v_prediction")).with_const("sigma_max", json!(120.0)).with_const("sigma_min", json!(0.002)),
        "sd3_flow" | "flux_flow" | "flux2_flow" => return Err(not_supported(format!("--prediction {p}"), "flow-matching models (SD3, FLUX) are not implemented")),
        other => return Err(invalid("--prediction", format!("`{other}` is not one of eps, v, edm_v, sd3_flow, flux_flow, flux2_flow"))),
    };
    Ok(Out(b.extra("model_sampling", "--prediction", node), 0))
}

pub(super) fn check_eta(eta: Option<f64>) -> Result<(), PresetError> {
    match eta {
        Some(e) if !(e.is_finite() && (0.0..=100.0).contains(&e)) => Err(invalid("--eta", format!("{e} is outside 0..=100"))),
        _ => Ok(()),
    }
}

pub(super) fn check_sigmas(flag: &str, list: Option<&[f32]>) -> Result<(), PresetError> {
    let Some(list) = list else { return Ok(()) };
    if list.len() < 2 {
        return Err(invalid(flag, format!("needs at least 2 sigmas (a start and an end), got {}", list.len())));
    }
    if let Some(v) = list.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
        return Err(invalid(flag, format!("{v} is not a finite sigma >= 0")));
    }
    Ok(())
}

pub(super) fn check_unit(flag: &str, v: f64) -> Result<(), PresetError> {
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(flag, format!("{v} is outside 0..=1")));
    }
    Ok(())
}

pub(super) fn sampler_names(method: &Option<String>, scheduler: &Option<String>) -> (String, String) {
    let sampler = workflow_sampler_name(method.as_deref().unwrap_or("euler_a")).to_string();
    let scheduler = workflow_scheduler_name(scheduler.as_deref().unwrap_or("discrete")).to_string();
    (sampler, scheduler)
}
