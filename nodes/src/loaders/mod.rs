//! Loader nodes: model files become typed handles through the residency manager. One
//! folder, so every decision about file formats and key layouts sits together:
//! CheckpointLoaderSimple, UNETLoader, CLIPLoader, DualCLIPLoader, VAELoader here; LoRAs
//! in [`lora`]; the tiny autoencoders' files in [`taesd`].

pub mod lora;
pub mod taesd;

use crate::runtime::{Place, Runtime};
use crate::loaders::taesd::TaeKind;
use crate::values::{Circular, ClipEncoder, ClipRef, LatentFormat, LlmRef, ModelRef, T5Ref, VaeKind, VaeRef};
use crate::err;
use sdflow_core::detect::{self, KeyLayout, ModelFamily};
use sdflow_core::placement::Module;
use sdflow_core::io::{self, TypeRules, WeightType};
use sdflow_core::models::clip::ClipLayout;
use sdflow_core::models::load::{self, load_weights};
use sdflow_core::models::llm::{self, prompt::Family as LlmFamily};
use sdflow_core::models::vae::wan;
use sdflow_core::models::{flux, sd3, t5, z_image};
use sdflow_core::models::pipeline::{self, scheduler_settings, CLIP_G as CKPT_CLIP_G, CLIP_L as CKPT_CLIP_L, T5XXL as CKPT_T5};
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::models::vae::{standalone_source, STANDALONE_PREFIX};
use sdflow_core::models::Weights;
use sdflow_core::residency::{Device, WeightHandle, WeightKey};
use sdflow_core::sampling::flow::FlowShift;
use sdflow_core::sampling::schedule::DiscreteSchedule;
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(CheckpointLoaderSimple { rt: rt.clone() }));
    registry.register(Arc::new(UnetLoader { rt: rt.clone() }));
    registry.register(Arc::new(ClipLoader { rt: rt.clone(), dual: false }));
    registry.register(Arc::new(ClipLoader { rt: rt.clone(), dual: true }));
    registry.register(Arc::new(VaeLoader { rt: rt.clone() }));
}

/// Ask the residency manager for the tensors under `prefix` of `path`; nothing is read
/// until a consumer pins the handle.
pub fn weights_handle(rt: &Runtime, place: impl Into<Place>, path: &Path, prefix: &str) -> Result<WeightHandle<Weights>, NodeError> {
    weights_handle_in(rt, place.into(), path, prefix, rt.weight_type, None)
}

/// A source shown in another key layout before loading (diffusers' FLUX as BFL's).
type Layout = fn(Box<dyn io::TensorSource>) -> Result<Box<dyn io::TensorSource>, sdflow_core::models::ModelError>;

/// [`weights_handle`] loading as `wt` (not the run's `--type`), the file read through `layout` (its name is part of the
/// residency key: the same file in two layouts is two sets of weights).
fn weights_handle_in(rt: &Runtime, place: Place, path: &Path, prefix: &str, wt: WeightType, layout: Option<(&str, Layout)>) -> Result<WeightHandle<Weights>, NodeError> {
    let tag = layout.map_or_else(|| prefix.to_string(), |(name, _)| format!("{name}:{prefix}"));
    let key = WeightKey::new([path], &tag, wt, Device::Cpu).map_err(err)?;
    let (path, layout) = (path.to_path_buf(), layout.map(|l| l.1));
    // Through the layout, whose names the prefix is in.
    sized_weights(rt, place, key, vec![prefix.to_string()], move || {
        let src = pipeline::open(&path)?;
        Ok(match layout {
            Some(f) => f(src)?,
            None => src,
        })
    })
}

/// The tensors under `prefixes` of the source `open` gives, as `place`'s weights in the
/// key's type: sized now from the file's header, so a model its device's budget cannot
/// hold is refused before anything is allocated; read on the first pin.
pub(crate) fn sized_weights<O>(rt: &Runtime, place: impl Into<Place>, key: WeightKey, prefixes: Vec<String>, open: O) -> Result<WeightHandle<Weights>, NodeError>
where
    O: Fn() -> Result<Box<dyn io::TensorSource>, Box<dyn std::error::Error + Send + Sync>> + Send + Sync + 'static,
{
    let wt = key.dtype;
    let bytes = {
        let refs: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        load::planned_bytes(open().map_err(err)?.as_ref(), &refs, &TypeRules::new(wt, "").map_err(err)?)
    };
    rt.weights_sized(place, key, Some(bytes), move |memory| {
        let refs: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        Ok(load_weights(memory, open()?.as_ref(), &refs, &TypeRules::new(wt, "")?)?)
    })
}

/// The parts of an SD1.x/2.x/XL checkpoint: a single file, or a diffusers pipeline
/// folder seen through [`pipeline::open`].
struct SdParts {
    family: ModelFamily,
    prediction: Prediction,
    /// Each text encoder, in the order the family concatenates them.
    clips: Vec<ClipPart>,
    latent_scale: f32,
    schedule: DiscreteSchedule,
}

/// Where one text encoder sits in a checkpoint.
struct ClipPart {
    /// The prefix `ClipTextConfig` takes.
    prefix: String,
    layout: ClipLayout,
    /// The prefix of the tensors to load: a Hugging Face `CLIPTextModelWithProjection`
    /// keeps its projection beside `text_model`.
    load: String,
    /// See [`ClipEncoder::dropped_layers`].
    dropped_layers: usize,
}

/// A checkpoint file, or a pipeline folder in a checkpoint's names.
fn open_checkpoint(path: &Path) -> Result<Box<dyn io::TensorSource>, NodeError> {
    pipeline::open(path).map_err(err)
}

/// The parts of the SD checkpoint at `path`, opened as `src` (detected as `det`).
fn sd_parts(path: &Path, src: &dyn io::TensorSource, det: detect::Detection) -> Result<SdParts, NodeError> {
    let folder = src.format() == io::Format::Diffusers;
    let shown = path.display();
    let latent_scale = match det.family {
        ModelFamily::Sd1 | ModelFamily::Sd2 { .. } => 0.18215,
        // sd_xl_base.yaml's scale_factor.
        ModelFamily::Sdxl => 0.13025,
        ModelFamily::Unknown => return Err(NodeError::msg(format!("{shown}: {}", det.message))),
        other => return Err(NodeError::msg(format!("{shown}: {other} checkpoints are not supported yet (SD1.x, SD2.x and SDXL are)"))),
    };
    if det.layout != Some(KeyLayout::Ldm) {
        return Err(NodeError::msg(format!("{shown}: only LDM-named single-file checkpoints and diffusers pipeline folders are supported, not a lone diffusers UNet")));
    }
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    let has = |p: &str| names.iter().any(|n| n.starts_with(p));
    if !has("first_stage_model.") {
        return Err(NodeError::msg(format!("{shown}: the checkpoint has no VAE (first_stage_model.*)")));
    }
    let part = |prefix: &str, layout: ClipLayout, load: &str| ClipPart { prefix: prefix.into(), layout, load: load.into(), dropped_layers: 0 };
    let ldm = |prefix: &str, layout: ClipLayout| part(prefix, layout, &format!("{prefix}."));
    let clips: Vec<ClipPart> = if folder {
        let encoders: &[&str] = if det.family == ModelFamily::Sdxl { &["text_encoder", "text_encoder_2"] } else { &["text_encoder"] };
        let mut clips = Vec::new();
        for e in encoders {
            if !has(&format!("{e}.text_model.")) {
                return Err(NodeError::msg(format!("{shown}: the pipeline has no Hugging Face CLIP text encoder in {e}/")));
            }
            clips.push(part(&format!("{e}.text_model"), ClipLayout::HuggingFace, &format!("{e}.")));
        }
        // diffusers' SD2 conversion keeps 23 of OpenCLIP-H's 24 layers, and its pipeline
        // reads the last one it kept: SD2's default (penultimate) layer.
        if matches!(det.family, ModelFamily::Sd2 { .. }) {
            clips[0].dropped_layers = 1;
        }
        clips
    } else if det.family == ModelFamily::Sdxl {
        let (l, g) = ("conditioner.embedders.0.transformer.text_model", "conditioner.embedders.1.model");
        for p in [l, g] {
            if !has(&format!("{p}.")) {
                return Err(NodeError::msg(format!("{shown}: the SDXL checkpoint has no text encoder under `{p}`")));
            }
        }
        vec![ldm(l, ClipLayout::HuggingFace), ldm(g, ClipLayout::OpenClip)]
    } else if has("cond_stage_model.transformer.text_model.") {
        vec![ldm("cond_stage_model.transformer.text_model", ClipLayout::HuggingFace)]
    } else if has("cond_stage_model.model.") {
        vec![ldm("cond_stage_model.model", ClipLayout::OpenClip)]
    } else {
        return Err(NodeError::msg(format!("{shown}: the checkpoint has no text encoder (cond_stage_model.*)")));
    };
    let mut prediction = match det.prediction {
        detect::Prediction::V => Prediction::V,
        detect::Prediction::Eps => Prediction::Epsilon,
        detect::Prediction::Flow => return Err(NodeError::msg(format!("{shown}: flow-matching models are not supported yet"))),
    };
    // A pipeline's scheduler states what its weights cannot show.
    let settings = if folder { scheduler_settings(path).map_err(err)? } else { Default::default() };
    if let Some(p) = settings.prediction {
        prediction = p;
    }
    // v-prediction checkpoints with a `ztsnr` key were trained to zero terminal SNR
    // (ComfyUI reads the pair so; the key alone on an eps model means nothing to it), as
    // were pipelines whose scheduler rescales its betas to zero SNR.
    let zero_snr = (det.zsnr && prediction == Prediction::V) || settings.zero_snr;
    let mut schedule = if zero_snr { DiscreteSchedule::sd().zero_terminal_snr() } else { DiscreteSchedule::sd() };
    // CosXL and CosXL-Edit mark EDM v-prediction with their sigma range, as ComfyUI reads it.
    let (min_key, max_key) = detect::EDM_VPRED_KEYS;
    if has(max_key) {
        let (lo, hi) = (scalar(src, min_key)?, scalar(src, max_key)?);
        schedule = DiscreteSchedule::edm(lo, hi).map_err(|e| NodeError::msg(format!("{shown}: edm_vpred: {e}")))?;
        prediction = Prediction::EdmV;
    }
    Ok(SdParts { family: det.family, prediction, clips, latent_scale, schedule })
}

/// The value of a one-element tensor.
fn scalar(src: &dyn io::TensorSource, name: &str) -> Result<f32, NodeError> {
    let at = |e: String| NodeError::msg(format!("{}: `{name}`: {e}", src.path().display()));
    let info = src.tensors().iter().find(|t| t.name == name).ok_or_else(|| at("missing".into()))?;
    if info.shape.iter().product::<usize>() != 1 {
        return Err(at(format!("shape {:?}, not one value", info.shape)));
    }
    let bytes = src.read(name).map_err(|e| at(e.to_string()))?;
    let v = sdflow_core::dtype::to_f32(info.dtype, &bytes, 1).map_err(|e| at(e.to_string()))?[0];
    if !v.is_finite() {
        return Err(at(format!("{v} is not a number")));
    }
    Ok(v)
}

/// ComfyUI's "Load Checkpoint".
struct CheckpointLoaderSimple {
    rt: Arc<Runtime>,
}

impl CheckpointLoaderSimple {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model("checkpoints", inputs.string("ckpt_name")?).map_err(NodeError::msg)
    }
}

impl Node for CheckpointLoaderSimple {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CheckpointLoaderSimple")
            .display_name("Load Checkpoint")
            .category("loaders")
            .description("Loads a diffusion model checkpoint (SD1.x, SD2.x, SDXL, all-in-one FLUX.1 and SD3/SD3.5); weights load on first use.")
            .input(InputSpec::combo("ckpt_name", self.rt.list_models("checkpoints")).tooltip("The checkpoint to load."))
            .output("MODEL", IoType::MODEL)
            .output("CLIP", IoType::CLIP)
            .output("VAE", IoType::VAE)
    }

    /// A changed file on disk must not be served from the cache.
    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        // Opened once: each family's reading below takes this view of the file or folder.
        let src = open_checkpoint(&path)?;
        let det = detect::detect_source(src.as_ref());
        if det.family == ModelFamily::Flux && det.layout == Some(KeyLayout::Ldm) {
            return flux_checkpoint(&self.rt, &path, src.as_ref(), &det);
        }
        if det.family == ModelFamily::Sd3 && det.layout == Some(KeyLayout::Ldm) {
            return sd3_checkpoint(&self.rt, &path, src.as_ref(), &det);
        }
        let parts = sd_parts(&path, src.as_ref(), det)?;
        let model = ModelRef {
            weights: weights_handle(&self.rt, Module::Diffusion, &path, "model.diffusion_model.")?,
            prefix: "model.diffusion_model".into(),
            family: parts.family,
            prediction: parts.prediction,
            latent: LatentFormat::uniform(parts.latent_scale, 0.0),
            schedule: parts.schedule,
            flow: None,
            ip_adapters: Vec::new(),
            motion: None,
            slg: None,
            differential_diffusion: None,
            cfg_hooks: Default::default(),
            circular: Circular::NONE,
        };
        let mut encoders = Vec::with_capacity(parts.clips.len());
        for c in parts.clips {
            encoders.push(ClipEncoder { weights: weights_handle(&self.rt, Module::TextEncoder, &path, &c.load)?, prefix: c.prefix, layout: c.layout, dropped_layers: c.dropped_layers });
        }
        let clip = ClipRef { encoders, t5: None, family: parts.family, llm: None, clip_skip: None, sdcpp: None, place: Module::TextEncoder.into() };
        let vae = VaeRef { weights: weights_handle(&self.rt, Module::Vae, &path, "first_stage_model.")?, prefix: "first_stage_model".into(), kind: VaeKind::Kl, circular: Circular::NONE };
        Ok(Outputs::new(vec![
            Value::new(IoType::MODEL, model),
            Value::new(IoType::CLIP, clip),
            Value::new(IoType::VAE, vae),
        ]))
    }
}

/// Where standalone diffusion models live (ComfyUI's folder; sd-cli's --diffusion-model).
const DIFFUSION_MODELS: &str = "diffusion_models";

/// ComfyUI's "Load Diffusion Model": a diffusion model alone, without text encoders or
/// VAE — FLUX.1 dev and schnell (and their variants) in BFL's names, bare or under
/// `model.diffusion_model.`, as safetensors or GGUF.
struct UnetLoader {
    rt: Arc<Runtime>,
}

impl UnetLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(DIFFUSION_MODELS, inputs.string("unet_name")?).map_err(NodeError::msg)
    }
}

impl Node for UnetLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("UNETLoader")
            .display_name("Load Diffusion Model")
            .category("advanced/loaders")
            .description("Loads a diffusion model alone (FLUX.1 and Chroma in BFL/ComfyUI names, SD3/SD3.5 in Stability's, Z-Image and Wan in the releases', each also in diffusers' names; FLUX.2 in BFL's; Qwen-Image; safetensors or GGUF); weights load on first use.")
            .input(InputSpec::combo("unet_name", self.rt.list_models(DIFFUSION_MODELS)).tooltip("The model in models/diffusion_models."))
            .input(InputSpec::combo("weight_dtype", ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]).tooltip(
                "default: the run's --type. The fp8 choices keep one byte per weight: ggml has no fp8 arithmetic, so they load as q8_0, its 8-bit type.",
            ))
            .output("MODEL", IoType::MODEL)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        let wt = match inputs.string("weight_dtype")? {
            "default" => self.rt.weight_type,
            "fp8_e4m3fn" | "fp8_e4m3fn_fast" | "fp8_e5m2" => WeightType::All(sdflow_core::dtype::DType::Q8_0),
            other => return Err(NodeError::msg(format!("weight_dtype `{other}` is not one of default, fp8_e4m3fn, fp8_e4m3fn_fast, fp8_e5m2"))),
        };
        let src = io::open(&path).map_err(err)?;
        let det = detect::detect_source(src.as_ref());
        let shown = path.display();
        let mut layout: Option<(&str, Layout)> = None;
        let prefix = match (det.family, det.layout) {
            (ModelFamily::Flux | ModelFamily::Sd3 | ModelFamily::Chroma | ModelFamily::ZImage | ModelFamily::Flux2 | ModelFamily::QwenImage, Some(KeyLayout::Ldm)) => det.diffusion_prefix.clone().unwrap_or_default(),
            // diffusers' names, fused and renamed into the single files' on load (no
            // prefix then).
            (ModelFamily::Sd3, _) => {
                layout = Some(("stability", sd3::diffusers::stability_layout));
                String::new()
            }
            (ModelFamily::Flux, _) => {
                layout = Some(("bfl", flux::diffusers::bfl_layout));
                String::new()
            }
            (ModelFamily::ZImage, _) => {
                layout = Some(("z-image", z_image::diffusers::single_file));
                String::new()
            }
            (ModelFamily::Flux2, _) => {
                layout = Some(("bfl-flux2", sdflow_core::models::flux2::diffusers::bfl_layout));
                String::new()
            }
            // The release's names keep their prefix; diffusers' are renamed to them (no
            // prefix then). Either way the 5-D patch kernel is shown as a matrix.
            (ModelFamily::Wan, layout_of) => {
                layout = Some(("wan", sdflow_core::models::wan::layout));
                if layout_of == Some(KeyLayout::Ldm) { det.diffusion_prefix.clone().unwrap_or_default() } else { String::new() }
            }
            (ModelFamily::Unknown, _) => return Err(NodeError::msg(format!("{shown}: {}", det.message))),
            (other, _) => return Err(NodeError::msg(format!("{shown}: {other} diffusion models are not supported by this loader yet (FLUX.1, Chroma, SD3, Z-Image, FLUX.2, Qwen-Image and Wan are; SD checkpoints load with CheckpointLoaderSimple)"))),
        };
        let weights = weights_handle_in(&self.rt, Module::Diffusion.into(), &path, &prefix, wt, layout)?;
        let model = match det.family {
            ModelFamily::Sd3 => sd3_model(weights, prefix)?,
            ModelFamily::Chroma => chroma_model(weights, prefix)?,
            ModelFamily::ZImage => z_image_model(weights, prefix)?,
            ModelFamily::Flux2 => flux2_model(weights, prefix, det.flux_guidance)?,
            ModelFamily::QwenImage => qwen_image_model(weights, prefix)?,
            ModelFamily::Wan => wan_model(weights, prefix, det.in_channels)?,
            _ => flux_model(weights, prefix, det.flux_guidance)?,
        };
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, model)]))
    }
}

/// The MODEL of a FLUX.1 transformer under `prefix` of `weights`: dev (`guidance`: it
/// embeds its distilled guidance) samples with ComfyUI's ModelSamplingFlux (μ 1.15),
/// schnell as a plain unshifted flow (`model_base.ModelType.FLOW`).
fn flux_model(weights: WeightHandle<Weights>, prefix: String, guidance: bool) -> Result<ModelRef, NodeError> {
    let flow = if guidance { FlowShift::Flux(1.15) } else { FlowShift::Snr(1.0) };
    Ok(ModelRef {
        weights,
        prefix,
        family: ModelFamily::Flux,
        prediction: Prediction::Flow,
        latent: LatentFormat::uniform(flux::LATENT_SCALE, flux::LATENT_SHIFT),
        schedule: flow.schedule().map_err(err)?,
        flow: Some(flow),
        ip_adapters: Vec::new(),
        motion: None,
        slg: None,
        differential_diffusion: None,
        cfg_hooks: Default::default(),
        circular: Circular::NONE,
    })
}

/// The MODEL of a Chroma transformer: ComfyUI's default sampling for it is FLUX's
/// ModelSamplingFlux at μ 1.15 (its template sets ModelSamplingAuraFlow 1.0 instead).
fn chroma_model(weights: WeightHandle<Weights>, prefix: String) -> Result<ModelRef, NodeError> {
    let mut m = flux_model(weights, prefix, true)?;
    m.family = ModelFamily::Chroma;
    Ok(m)
}

/// Where ComfyUI's all-in-one FLUX.1 checkpoints keep the VAE (a FLUX pipeline folder
/// shows it as LDM's `first_stage_model.`).
const FLUX_VAE: &str = "vae.";

/// The outputs of CheckpointLoaderSimple for an all-in-one FLUX.1 checkpoint (ComfyUI's
/// `flux1-dev-fp8.safetensors` layout): each part the file lacks is named with the node
/// that supplies it instead.
fn flux_checkpoint(rt: &Runtime, path: &Path, src: &dyn io::TensorSource, det: &detect::Detection) -> Result<Outputs, NodeError> {
    let names = || src.tensors().iter().map(|t| t.name.as_str());
    let has = |p: &str| names().any(|n| n.starts_with(p));
    let prefix = det.diffusion_prefix.clone().unwrap_or_default();
    let vae_prefix = if has(&format!("{LDM_VAE}decoder.")) { LDM_VAE } else { FLUX_VAE };
    let mut missing = Vec::new();
    if !has(&format!("{CKPT_CLIP_L}text_model.")) {
        missing.push(format!("CLIP-L (`{CKPT_CLIP_L}*`: load clip_l with DualCLIPLoader type flux, sd-cli's --clip_l)"));
    }
    if !t5::is_t5(names().filter(|n| n.starts_with(CKPT_T5))) {
        missing.push(format!("T5-XXL (`{CKPT_T5}*`: load t5xxl with DualCLIPLoader type flux, sd-cli's --t5xxl)"));
    }
    if !has(&format!("{vae_prefix}decoder.")) {
        missing.push(format!("the VAE (`{FLUX_VAE}*`: load ae with VAELoader, sd-cli's --vae)"));
    }
    if !missing.is_empty() {
        return Err(NodeError::msg(format!("{}: a FLUX.1 diffusion model without {}; load the model with UNETLoader (sd-cli's --diffusion-model) and the rest apart", path.display(), missing.join(", "))));
    }
    let model = flux_model(weights_handle(rt, Module::Diffusion, path, &prefix)?, prefix, det.flux_guidance)?;
    let clip_l = ClipEncoder { weights: weights_handle(rt, Module::TextEncoder, path, CKPT_CLIP_L)?, prefix: format!("{CKPT_CLIP_L}text_model"), layout: ClipLayout::HuggingFace, dropped_layers: 0 };
    let clip = ClipRef { encoders: vec![clip_l], t5: Some(t5_handle(rt, Module::TextEncoder, path)?), family: ModelFamily::Flux, llm: None, clip_skip: None, sdcpp: None, place: Module::TextEncoder.into() };
    let vae = VaeRef { weights: weights_handle(rt, Module::Vae, path, vae_prefix)?, prefix: vae_prefix.trim_end_matches('.').into(), kind: VaeKind::Kl, circular: Circular::NONE };
    Ok(Outputs::new(vec![Value::new(IoType::MODEL, model), Value::new(IoType::CLIP, clip), Value::new(IoType::VAE, vae)]))
}

/// The MODEL of an SD3 / SD3.5 MMDiT under `prefix` of `weights`: a flow over SD3's
/// schedule shifted by 3 (ComfyUI's `supported_models.SD3`, sd.cpp's default), the model
/// told 1000·σ.
fn sd3_model(weights: WeightHandle<Weights>, prefix: String) -> Result<ModelRef, NodeError> {
    let flow = FlowShift::Snr(3.0);
    Ok(ModelRef {
        weights,
        prefix,
        family: ModelFamily::Sd3,
        prediction: Prediction::Flow,
        latent: LatentFormat::uniform(sd3::LATENT_SCALE, sd3::LATENT_SHIFT),
        schedule: flow.schedule().map_err(err)?,
        flow: Some(flow),
        ip_adapters: Vec::new(),
        motion: None,
        slg: None,
        differential_diffusion: None,
        cfg_hooks: Default::default(),
        circular: Circular::NONE,
    })
}

/// The MODEL of a Z-Image transformer: a flow over SD3's schedule shifted by 3
/// (ComfyUI's `supported_models.ZImage`, its templates' ModelSamplingAuraFlow 3, sd.cpp's
/// default), in FLUX's VAE latent space.
fn z_image_model(weights: WeightHandle<Weights>, prefix: String) -> Result<ModelRef, NodeError> {
    let mut m = sd3_model(weights, prefix)?;
    m.family = ModelFamily::ZImage;
    m.latent = LatentFormat::uniform(flux::LATENT_SCALE, flux::LATENT_SHIFT);
    Ok(m)
}

/// The MODEL of a FLUX.2 transformer: its latent is the VAE nodes' already (patched and
/// normalised, so no scale here), sampled as sd.cpp's FLUX flow with its default shift
/// (μ 1.15 with a guidance embedding, else 1; the Flux2Scheduler node computes its own).
fn flux2_model(weights: WeightHandle<Weights>, prefix: String, guidance: bool) -> Result<ModelRef, NodeError> {
    let mut m = flux_model(weights, prefix, true)?;
    let flow = FlowShift::Flux(if guidance { 1.15 } else { 1.0 });
    m.family = ModelFamily::Flux2;
    m.latent = LatentFormat::uniform(1.0, 0.0);
    m.schedule = flow.schedule().map_err(err)?;
    m.flow = Some(flow);
    Ok(m)
}

/// The MODEL of a Qwen-Image transformer: ComfyUI's (`model_base.QwenImage` is a FLUX
/// model type, so ModelSamplingFlux at μ 1.15; its templates set ModelSamplingAuraFlow
/// 3.1), in the Wan-2.1 VAE's latent space (per-channel mean and std).
fn qwen_image_model(weights: WeightHandle<Weights>, prefix: String) -> Result<ModelRef, NodeError> {
    let mut m = flux_model(weights, prefix, true)?;
    m.family = ModelFamily::QwenImage;
    m.latent = LatentFormat::per_channel(&wan::LATENTS_MEAN, &wan::LATENTS_STD);
    Ok(m)
}

/// The MODEL of a Wan transformer: a flow over SD3's schedule shifted by ComfyUI's
/// default for Wan (`supported_models.WAN21_T2V`: 8), in its VAE's latent space: Wan
/// 2.1's, or for a model of 48 input channels (Wan 2.2 TI2V-5B) Wan 2.2's.
fn wan_model(weights: WeightHandle<Weights>, prefix: String, in_channels: Option<usize>) -> Result<ModelRef, NodeError> {
    let mut m = sd3_model(weights, prefix)?;
    let flow = FlowShift::Snr(WAN_SHIFT);
    m.family = ModelFamily::Wan;
    m.latent = if in_channels == Some(wan::WAN22_LATENTS_MEAN.len()) {
        LatentFormat::per_channel(&wan::WAN22_LATENTS_MEAN, &wan::WAN22_LATENTS_STD)
    } else {
        LatentFormat::per_channel(&wan::LATENTS_MEAN, &wan::LATENTS_STD)
    };
    m.schedule = flow.schedule().map_err(err)?;
    m.flow = Some(flow);
    Ok(m)
}

/// ComfyUI's sampling shift for Wan models.
const WAN_SHIFT: f64 = 8.0;

/// Where LDM-named checkpoints keep the VAE: SD3 / SD3.5 files, and every pipeline
/// folder seen through [`pipeline::open`].
const LDM_VAE: &str = "first_stage_model.";

/// The outputs of CheckpointLoaderSimple for an SD3 / SD3.5 checkpoint: the text encoders
/// it holds (any of CLIP-L, OpenCLIP-G, T5-XXL, or none; ComfyUI's SD3 CLIP gives zeros
/// for those missing) and its VAE.
fn sd3_checkpoint(rt: &Runtime, path: &Path, src: &dyn io::TensorSource, det: &detect::Detection) -> Result<Outputs, NodeError> {
    let names = || src.tensors().iter().map(|t| t.name.as_str());
    let has = |p: &str| names().any(|n| n.starts_with(p));
    if !has(&format!("{LDM_VAE}decoder.")) {
        return Err(NodeError::msg(format!("{}: an SD3 checkpoint without its VAE (`{LDM_VAE}*`); load the model with UNETLoader (sd-cli's --diffusion-model) and the VAE with VAELoader (--vae)", path.display())));
    }
    let prefix = det.diffusion_prefix.clone().unwrap_or_default();
    let model = sd3_model(weights_handle(rt, Module::Diffusion, path, &prefix)?, prefix)?;
    let mut encoders = Vec::new();
    for p in [CKPT_CLIP_L, CKPT_CLIP_G] {
        if has(&format!("{p}text_model.")) {
            encoders.push(ClipEncoder { weights: weights_handle(rt, Module::TextEncoder, path, p)?, prefix: format!("{p}text_model"), layout: ClipLayout::HuggingFace, dropped_layers: 0 });
        }
    }
    // Stability's own files hold the MMDiT and VAE only: their CLIP is empty (ComfyUI's
    // None), and encoding with it names TripleCLIPLoader.
    let t5 = if t5::is_t5(names().filter(|n| n.starts_with(CKPT_T5))) { Some(t5_handle(rt, Module::TextEncoder, path)?) } else { None };
    let clip = ClipRef { encoders, t5, family: ModelFamily::Sd3, llm: None, clip_skip: None, sdcpp: None, place: Module::TextEncoder.into() };
    let vae = VaeRef { weights: weights_handle(rt, Module::Vae, path, LDM_VAE)?, prefix: LDM_VAE.trim_end_matches('.').into(), kind: VaeKind::Kl, circular: Circular::NONE };
    Ok(Outputs::new(vec![Value::new(IoType::MODEL, model), Value::new(IoType::CLIP, clip), Value::new(IoType::VAE, vae)]))
}

/// Where standalone text encoders live (ComfyUI's folder; sd-cli's --clip_l/--clip_g).
pub(crate) const TEXT_ENCODERS: &str = "text_encoders";

/// ComfyUI's "Load CLIP" (`CLIPLoader`, type `stable_diffusion`: SD1's CLIP-L or SD2's
/// OpenCLIP-H) and "DualCLIPLoader" (type `sdxl`: CLIP-L and OpenCLIP-G, in either
/// order). Files in Hugging Face names (`text_model.*`, ComfyUI's clip_l/clip_g files)
/// or OpenCLIP names, with or without a checkpoint's prefix.
struct ClipLoader {
    rt: Arc<Runtime>,
    dual: bool,
}

impl ClipLoader {
    fn names(&self) -> &'static [&'static str] {
        if self.dual {
            &["clip_name1", "clip_name2"]
        } else {
            &["clip_name"]
        }
    }

    fn paths(&self, inputs: &Inputs) -> Result<Vec<PathBuf>, NodeError> {
        self.names().iter().map(|n| self.rt.resolve_model(TEXT_ENCODERS, inputs.string(n)?).map_err(NodeError::msg)).collect()
    }
}

/// The text encoder of a standalone file: the prefix `ClipTextConfig` takes, its
/// layout, the prefix of the tensors to load (the projection sits beside a Hugging Face
/// `text_model`), and its width.
fn text_encoder_in(path: &Path) -> Result<(String, ClipLayout, String, usize), NodeError> {
    let src = io::open(path).map_err(err)?;
    let found = src.tensors().iter().find_map(|t| {
        if let Some(p) = t.name.strip_suffix("embeddings.token_embedding.weight") {
            let prefix = p.trim_end_matches('.').to_string();
            let root = prefix.strip_suffix("text_model").unwrap_or(&prefix).to_string();
            Some((prefix.clone(), ClipLayout::HuggingFace, root, t.shape.get(1).copied().unwrap_or(0)))
        } else {
            let p = t.name.strip_suffix("token_embedding.weight")?;
            let open_clip = src.tensors().iter().any(|u| u.name.starts_with(&format!("{p}transformer.resblocks.")));
            open_clip.then(|| (p.trim_end_matches('.').to_string(), ClipLayout::OpenClip, p.to_string(), t.shape.get(1).copied().unwrap_or(0)))
        }
    });
    found.ok_or_else(|| NodeError::msg(format!("{}: no CLIP text encoder (no `…embeddings.token_embedding.weight` or OpenCLIP `token_embedding.weight` with `transformer.resblocks`)", path.display())))
}

impl Node for ClipLoader {
    fn schema(&self) -> NodeSchema {
        let files = self.rt.list_models(TEXT_ENCODERS);
        let s = if self.dual {
            NodeSchema::new("DualCLIPLoader")
                .display_name("DualCLIPLoader")
                .description("Loads two standalone text encoders, in either order: SDXL's CLIP-L and OpenCLIP-G (type sdxl), two of SD3's three (type sd3), FLUX's CLIP-L and T5-XXL (type flux); T5 as safetensors or GGUF.")
                .input(InputSpec::combo("clip_name1", files.clone()))
                .input(InputSpec::combo("clip_name2", files))
                .input(InputSpec::combo("type", ["sdxl", "sd3", "flux", "qwen_image"]))
        } else {
            NodeSchema::new("CLIPLoader")
                .display_name("Load CLIP")
                .description("Loads a standalone text encoder: SD1's CLIP-L or SD2's OpenCLIP-H (type stable_diffusion), one of SD3's (type sd3), Chroma's T5-XXL (type chroma), Z-Image's Qwen3-4B (type lumina2), FLUX.2 klein's Qwen3 (type flux2); T5 and the LLMs as safetensors or GGUF.")
                .input(InputSpec::combo("clip_name", files))
                .input(InputSpec::combo("type", ["stable_diffusion", "sd3", "chroma", "lumina2", "flux2", "qwen_image", "wan"]))
        };
        s.input(InputSpec::combo("device", ["default", "cpu"]).optional().tooltip("Where the text encoders load and run: `default` follows the text encoder placement (--backend te=...), `cpu` keeps them on the CPU."))
            .category("advanced/loaders")
            .output("CLIP", IoType::CLIP)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        let mut all = Vec::new();
        for p in self.paths(inputs)? {
            all.extend(file_fingerprint(&p)?.unwrap_or_default());
        }
        Ok(Some(all))
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let ty = inputs.string("type")?;
        // ComfyUI's `device: cpu`: load and run on the CPU whatever the placement says.
        let place = match inputs.contains("device").then(|| inputs.string("device")).transpose()? {
            None | Some("default") => Place::from(Module::TextEncoder),
            Some("cpu") => Place::Cpu(Module::TextEncoder),
            Some(other) => return Err(NodeError::msg(format!("device `{other}`: `default` or `cpu`"))),
        };
        if self.dual && ty == "flux" {
            return self.flux(inputs, place);
        }
        if ty == "chroma" && !self.dual {
            let path = self.paths(inputs)?.remove(0);
            let src = io::open(&path).map_err(err)?;
            if !t5::is_t5(src.tensors().iter().map(|t| t.name.as_str())) {
                return Err(NodeError::msg(format!("{}: no T5 encoder (`{}`); Chroma reads T5-XXL alone", path.display(), t5::MARKER)));
            }
            let clip = ClipRef { encoders: Vec::new(), t5: Some(t5_handle(&self.rt, place, &path)?), family: ModelFamily::Chroma, llm: None, clip_skip: None, sdcpp: None, place };
            return Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]));
        }
        // Wan reads UMT5-XXL alone.
        if ty == "wan" && !self.dual {
            let path = self.paths(inputs)?.remove(0);
            let src = t5::hf_layout(io::open(&path).map_err(err)?).map_err(err)?;
            if !t5::is_t5(src.tensors().iter().map(|t| t.name.as_str())) {
                return Err(NodeError::msg(format!("{}: no UMT5 encoder (`{}`); Wan reads UMT5-XXL", path.display(), t5::MARKER)));
            }
            let clip = ClipRef { encoders: Vec::new(), t5: Some(t5_handle(&self.rt, place, &path)?), family: ModelFamily::Wan, llm: None, clip_skip: None, sdcpp: None, place };
            return Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]));
        }
        let llm_family = match ty {
            "lumina2" => Some((LlmFamily::ZImage, ModelFamily::ZImage)),
            "flux2" => Some((LlmFamily::Flux2Klein, ModelFamily::Flux2)),
            "qwen_image" => Some((LlmFamily::QwenImage, ModelFamily::QwenImage)),
            _ => None,
        };
        // DualCLIPLoader's `qwen_image` (sdflow's, for sd-cli's --llm_vision): Qwen2.5-VL's
        // language model from one file and its vision tower from the other.
        if let (Some((LlmFamily::QwenImage, family)), true) = (llm_family, self.dual) {
            let paths = self.paths(inputs)?;
            let holds_llm = |p: &Path| -> Result<bool, NodeError> {
                let src = llm::hf_layout(io::open(p).map_err(err)?).map_err(err)?;
                Ok(llm::find_prefix(src.tensors().iter().map(|t| t.name.as_str())).is_some())
            };
            let (lm, tower) = match (holds_llm(&paths[0])?, holds_llm(&paths[1])?) {
                (true, false) => (&paths[0], &paths[1]),
                (false, true) => (&paths[1], &paths[0]),
                (a, _) => {
                    let what = if a { "both hold a language model" } else { "neither holds a language model" };
                    return Err(NodeError::msg(format!("{} and {}: {what}; qwen_image takes Qwen2.5-VL's language model and its vision tower", paths[0].display(), paths[1].display())));
                }
            };
            let mut llm = llm_handle(&self.rt, place, lm, LlmFamily::QwenImage)?;
            llm.vision = Some(vision_handle(&self.rt, place, tower)?.ok_or_else(|| NodeError::msg(format!("{}: no Qwen2.5-VL vision tower (`visual.…`, or a llama.cpp mmproj's `v.blk.…`)", tower.display())))?);
            let clip = ClipRef { encoders: Vec::new(), t5: None, llm: Some(llm), family, clip_skip: None, sdcpp: None, place };
            return Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]));
        }
        if let (Some((llm_family, family)), false) = (llm_family, self.dual) {
            let path = self.paths(inputs)?.remove(0);
            let mut llm = llm_handle(&self.rt, place, &path, llm_family)?;
            if llm_family == LlmFamily::QwenImage {
                llm.vision = vision_handle(&self.rt, place, &path)?;
            }
            let clip = ClipRef { encoders: Vec::new(), t5: None, llm: Some(llm), family, clip_skip: None, sdcpp: None, place };
            return Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]));
        }
        if ty == "sd3" {
            let clip = sd3_clip(&self.rt, place, &self.paths(inputs)?)?;
            return Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]));
        }
        if ty != if self.dual { "sdxl" } else { "stable_diffusion" } {
            let wanted = if self.dual { "`sdxl`, `sd3`, `flux` and `qwen_image` (Qwen2.5-VL and its vision tower)" } else { "`stable_diffusion`, `sd3`, `chroma`, `lumina2` (Z-Image's Qwen3-4B), `flux2` (FLUX.2's Qwen3 or Mistral), `qwen_image` (Qwen2.5-VL-7B) and `wan` (UMT5-XXL)" };
            return Err(NodeError::msg(format!("type `{ty}`: only {wanted} text encoders are supported yet")));
        }
        let mut found = Vec::new();
        for path in self.paths(inputs)? {
            let (prefix, layout, root, width) = text_encoder_in(&path)?;
            found.push((width, ClipEncoder { weights: weights_handle(&self.rt, place, &path, &root)?, prefix, layout, dropped_layers: 0 }, path));
        }
        // SDXL concatenates CLIP-L (768) before OpenCLIP-G (1280), whichever file came first.
        found.sort_by_key(|f| f.0);
        let widths: Vec<usize> = found.iter().map(|f| f.0).collect();
        let family = match widths.as_slice() {
            [768] => ModelFamily::Sd1,
            [1024] => ModelFamily::Sd2 { v_pred: false },
            [_, _] => ModelFamily::Sdxl,
            // Reduced (test and research) encoders: the layout names the family.
            [_] if found[0].1.layout == ClipLayout::OpenClip => ModelFamily::Sd2 { v_pred: false },
            _ => ModelFamily::Sd1,
        };
        if self.dual && widths[0] == widths[1] {
            return Err(NodeError::msg(format!(
                "{} and {} are both {}-wide text encoders; SDXL needs CLIP-L and OpenCLIP-G",
                found[0].2.display(),
                found[1].2.display(),
                widths[0]
            )));
        }
        let clip = ClipRef { encoders: found.into_iter().map(|f| f.1).collect(), t5: None, family, llm: None, clip_skip: None, sdcpp: None, place };
        Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]))
    }
}

impl ClipLoader {
    /// DualCLIPLoader's `flux`: CLIP-L (for its pooled vector) and T5-XXL, either order.
    fn flux(&self, inputs: &Inputs, place: Place) -> Result<Outputs, NodeError> {
        let mut clip = None;
        let mut t5 = None;
        for path in self.paths(inputs)? {
            let src = io::open(&path).map_err(err)?;
            let names = || src.tensors().iter().map(|t| t.name.as_str());
            let slot = if t5::is_t5(names()) { &mut t5 } else { &mut clip };
            if let Some(other) = slot.replace(path.clone()) {
                let what = if t5::is_t5(names()) { "T5 encoders" } else { "CLIP text encoders" };
                return Err(NodeError::msg(format!("{} and {} are both {what}; FLUX needs CLIP-L and T5-XXL", other.display(), path.display())));
            }
        }
        let (clip_path, t5_path) = (clip.expect("two files, neither twice"), t5.expect("two files, neither twice"));
        let (prefix, layout, root, _) = text_encoder_in(&clip_path)?;
        let encoder = ClipEncoder { weights: weights_handle(&self.rt, place, &clip_path, &root)?, prefix, layout, dropped_layers: 0 };
        let clip = ClipRef { encoders: vec![encoder], t5: Some(t5_handle(&self.rt, place, &t5_path)?), family: ModelFamily::Flux, llm: None, clip_skip: None, sdcpp: None, place };
        Ok(Outputs::new(vec![Value::new(IoType::CLIP, clip)]))
    }
}

/// The SD3 CLIP of standalone files, in any order: CLIP-L and OpenCLIP-G (Hugging Face or
/// OpenCLIP names; the narrower is CLIP-L) and T5-XXL (safetensors or GGUF), any of them
/// left out — what CLIPLoader, DualCLIPLoader (type sd3) and TripleCLIPLoader load.
pub(crate) fn sd3_clip(rt: &Runtime, place: Place, paths: &[PathBuf]) -> Result<ClipRef, NodeError> {
    let mut clips = Vec::new();
    let mut t5 = None;
    for path in paths {
        let src = sdflow_core::io::open(path).map_err(err)?;
        if t5::is_t5(src.tensors().iter().map(|t| t.name.as_str())) {
            if let Some((other, _)) = t5.replace((path.clone(), t5_handle(rt, place, path)?)) {
                return Err(NodeError::msg(format!("{} and {} are both T5 encoders; SD3 takes one T5-XXL beside CLIP-L and OpenCLIP-G", other.display(), path.display())));
            }
            continue;
        }
        let (prefix, layout, root, width) = text_encoder_in(path)?;
        clips.push((width, path.clone(), ClipEncoder { weights: weights_handle(rt, place, path, &root)?, prefix, layout, dropped_layers: 0 }));
    }
    clips.sort_by_key(|c| c.0);
    match clips.as_slice() {
        [a, b] if a.0 == b.0 => return Err(NodeError::msg(format!("{} and {} are both {}-wide text encoders; SD3 takes CLIP-L and OpenCLIP-G", a.1.display(), b.1.display(), a.0))),
        [_, _, c, ..] => return Err(NodeError::msg(format!("{}: a third CLIP text encoder; SD3 takes CLIP-L, OpenCLIP-G and T5-XXL", c.1.display()))),
        _ => {}
    }
    Ok(ClipRef { encoders: clips.into_iter().map(|c| c.2).collect(), t5: t5.map(|t| t.1), family: ModelFamily::Sd3, llm: None, clip_skip: None, sdcpp: None, place })
}

/// The residency key prefix of T5 encoders: their GGUF tensors are renamed on load.
const T5_KEY: &str = "t5:";

/// The T5 encoder of a standalone file (Hugging Face names under any prefix, or llama.cpp's
/// GGUF names) as a handle; nothing is read until it is pinned.
fn t5_handle(rt: &Runtime, place: impl Into<Place>, path: &Path) -> Result<T5Ref, NodeError> {
    let src = t5::hf_layout(io::open(path).map_err(err)?).map_err(err)?;
    let prefix = t5::find_prefix(src.tensors().iter().map(|t| t.name.as_str()))
        .ok_or_else(|| NodeError::msg(format!("{}: no T5 encoder (`{}`)", path.display(), t5::MARKER)))?;
    let key = WeightKey::new([path], &format!("{T5_KEY}{prefix}"), rt.weight_type, Device::Cpu).map_err(err)?;
    drop(src);
    // The encoder only: full T5 files carry a decoder no text encoder reads.
    let parts = vec![format!("{prefix}encoder."), format!("{prefix}shared.")];
    let p = path.to_path_buf();
    let weights = sized_weights(rt, place, key, parts, move || Ok(t5::hf_layout(io::open(&p)?)?))?;
    Ok(T5Ref { weights, prefix, options: None })
}

/// An LLM text encoder of a standalone file for `family`: Hugging Face names (ComfyUI's
/// `qwen_3_4b.safetensors`: `model.layers.N.*`, with or without a prefix) or llama.cpp's
/// GGUF names, the transformer layers, embedding and final norm only (a language-model
/// head or a vision tower beside them is never read). A language model other than the
/// family's is an error naming the file; FLUX.2's is klein's Qwen3 or dev's Mistral,
/// whichever the file holds.
pub(crate) fn llm_handle(rt: &Runtime, place: impl Into<Place>, path: &Path, family: LlmFamily) -> Result<LlmRef, NodeError> {
    let src = llm::hf_layout(io::open(path).map_err(err)?).map_err(err)?;
    let prefix = llm::find_prefix(src.tensors().iter().map(|t| t.name.as_str()))
        .ok_or_else(|| NodeError::msg(format!("{}: no LLM text encoder (`…{}`, or GGUF `blk.0.attn_q.weight`)", path.display(), llm::MARKER)))?;
    // FLUX.2 reads Qwen3 (klein) or Mistral (dev): the file says which.
    let arch = llm::LlmArch::detect(|n| src.get(n).is_some(), &prefix);
    let family = match (family, arch) {
        (LlmFamily::Flux2Klein | LlmFamily::Flux2Dev, llm::LlmArch::Mistral) => LlmFamily::Flux2Dev,
        (LlmFamily::Flux2Klein | LlmFamily::Flux2Dev, llm::LlmArch::Qwen3) => LlmFamily::Flux2Klein,
        (f, a) if a == family_arch(f) => f,
        (f, a) => {
            let wanted = match f {
                LlmFamily::ZImage => "Z-Image reads Qwen3-4B (CLIPLoader type lumina2)",
                LlmFamily::QwenImage => "Qwen-Image reads Qwen2.5-VL-7B (CLIPLoader type qwen_image)",
                LlmFamily::Flux2Klein | LlmFamily::Flux2Dev => "FLUX.2 reads Qwen3 (klein) or Mistral-Small-3.2 (dev)",
            };
            return Err(NodeError::msg(format!("{}: a {a:?} language model; {wanted}", path.display())));
        }
    };
    drop(src);
    let key = WeightKey::new([path], &format!("{LLM_KEY}{prefix}"), rt.weight_type, Device::Cpu).map_err(err)?;
    let parts = ["layers.", "embed_tokens.", "norm."].iter().map(|p| format!("{prefix}{p}")).collect();
    let p = path.to_path_buf();
    let weights = sized_weights(rt, place, key, parts, move || Ok(llm::hf_layout(io::open(&p)?)?))?;
    Ok(LlmRef { weights, prefix, family, vision: None })
}

/// The language model each LLM family reads.
fn family_arch(f: LlmFamily) -> llm::LlmArch {
    match f {
        LlmFamily::ZImage | LlmFamily::Flux2Klein => llm::LlmArch::Qwen3,
        LlmFamily::QwenImage => llm::LlmArch::Qwen2,
        LlmFamily::Flux2Dev => llm::LlmArch::Mistral,
    }
}

/// Qwen2.5-VL's vision tower in an LLM file (ComfyUI's `qwen_2.5_vl_7b.safetensors` holds
/// it under `visual.`), as a handle with its prefix; `None` for a file without one.
fn vision_handle(rt: &Runtime, place: Place, path: &Path) -> Result<Option<(WeightHandle<Weights>, String)>, NodeError> {
    if path.is_dir() {
        return Ok(None);
    }
    let src = io::open(path).map_err(err)?;
    let Some(prefix) = llm::vision::find_prefix(src.tensors().iter().map(|t| t.name.as_str())) else { return Ok(None) };
    drop(src);
    let weights = weights_handle_in(rt, place, path, &prefix, rt.weight_type, Some(("qwen-vision", llm::vision::vision_layout)))?;
    Ok(Some((weights, prefix)))
}

/// Tags an LLM's residency key, as [`T5_KEY`] does T5's: the file read through its
/// GGUF renaming.
const LLM_KEY: &str = "llm:";

/// ComfyUI's "Load VAE": a standalone VAE file from `models/vae` — LDM key names with or
/// without `first_stage_model.`, or diffusers `AutoencoderKL` names (also a diffusers
/// pipeline folder's `vae/`). The weights load on first use, through the residency manager.
struct VaeLoader {
    rt: Arc<Runtime>,
}

impl VaeLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model("vae", inputs.string("vae_name")?).map_err(NodeError::msg)
    }
}

/// The residency key prefix of VAEs loaded through [`standalone_source`]: distinct from a
/// checkpoint's own `first_stage_model.` entry, whose tensors are not renamed.
const STANDALONE_KEY: &str = "vae-loader:";

/// The KL VAE of a standalone file as a handle; nothing is read until it is pinned.
fn standalone_vae_handle(rt: &Runtime, path: &Path) -> Result<WeightHandle<Weights>, NodeError> {
    // Validate the layout now, so a wrong file fails in the loader naming the file.
    let key = WeightKey::new([path], STANDALONE_KEY, rt.weight_type, Device::Cpu).map_err(err)?;
    let path = path.to_path_buf();
    sized_weights(rt, Module::Vae, key, vec![format!("{STANDALONE_PREFIX}.")], move || Ok(standalone_source(io::open(&path)?)?))
}

impl Node for VaeLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("VAELoader")
            .display_name("Load VAE")
            .category("loaders")
            .description("Loads a standalone VAE (LDM or diffusers key names; the Wan-2.1 VAE Qwen-Image uses, in Wan's or diffusers' names, also a pipeline folder's vae/); weights load on first use.")
            .input(InputSpec::combo("vae_name", vae_names(&self.rt)).tooltip("The VAE file in models/vae, or `taesd` (from models/vae_approx)."))
            .output("VAE", IoType::VAE)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        if let Some((_, files)) = taesd_choice(&self.rt, inputs)? {
            let mut all = Vec::new();
            for (p, _) in &files.parts {
                all.extend(file_fingerprint(p)?.unwrap_or_default());
            }
            return Ok(Some(all));
        }
        file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        if let Some((kind, files)) = taesd_choice(&self.rt, inputs)? {
            let vae = VaeRef { weights: crate::loaders::taesd::weights_handle(&self.rt, &files)?, prefix: String::new(), kind: VaeKind::Taesd(kind), circular: Circular::NONE };
            return Ok(Outputs::new(vec![Value::new(IoType::VAE, vae)]));
        }
        let path = self.path(inputs)?;
        if let Some((file, prefix)) = wan_vae_prefix(&path)? {
            let weights = weights_handle_in(&self.rt, Module::Vae.into(), &file, &prefix, self.rt.weight_type, Some(("wan-video", wan::video_layout)))?;
            let vae = VaeRef { weights, prefix, kind: VaeKind::Wan, circular: Circular::NONE };
            return Ok(Outputs::new(vec![Value::new(IoType::VAE, vae)]));
        }
        // A pipeline folder holds its VAE in `vae/`; io::open reads the folder's components.
        let vae = VaeRef { weights: standalone_vae_handle(&self.rt, &path)?, prefix: STANDALONE_PREFIX.into(), kind: VaeKind::Kl, circular: Circular::NONE };
        Ok(Outputs::new(vec![Value::new(IoType::VAE, vae)]))
    }
}

/// Where a file (or a diffusers pipeline folder's `vae/` file) holds a Wan-2.1 VAE
/// (Qwen-Image's), in Wan's names or diffusers', if it does: the file and the prefix.
fn wan_vae_prefix(path: &Path) -> Result<Option<(PathBuf, String)>, NodeError> {
    let file = if path.is_dir() {
        match io::diffusers::files(path).into_iter().find(|f| f.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "vae")) {
            Some(f) => f,
            None => return Ok(None),
        }
    } else {
        path.to_path_buf()
    };
    let src = io::open(&file).map_err(|e| NodeError::msg(format!("{}: {e}", file.display())))?;
    let names = || src.tensors().iter().map(|t| t.name.as_str());
    let prefix = sdflow_core::models::prefix_before(names(), wan::MARKER).or_else(|| sdflow_core::models::prefix_before(names(), wan::DIFFUSERS_MARKER));
    Ok(prefix.map(|p| (file, p)))
}

/// VAELoader's choices: the files in `models/vae`, then `taesd`, `taesdxl`, `taesd3`,
/// `taef1` for each `models/vae_approx` has (ComfyUI lists one when both halves are
/// there; sd.cpp's single file counts too).
fn vae_names(rt: &Runtime) -> Vec<String> {
    let mut names = rt.list_models("vae");
    names.extend(TaeKind::ALL.into_iter().filter(|k| crate::loaders::taesd::find_full(rt, *k).is_some()).map(|k| k.name().to_string()));
    names
}

/// The tiny autoencoder's files when VAELoader's `vae_name` names one and no file in
/// `models/vae` has that name.
fn taesd_choice(rt: &Runtime, inputs: &Inputs) -> Result<Option<(TaeKind, crate::loaders::taesd::TaesdFiles)>, NodeError> {
    let name = inputs.string("vae_name")?;
    let Some(kind) = TaeKind::from_name(name).filter(|_| rt.resolve_model("vae", name).is_err()) else { return Ok(None) };
    let files = crate::loaders::taesd::find_full(rt, kind).ok_or_else(|| NodeError::msg(format!("`{name}` needs {name}_encoder.* and {name}_decoder.* (or one {name}.* file) in models/vae_approx")))?;
    Ok(Some((kind, files)))
}

/// A file's path, size and modification time: a changed file must not be served from
/// the cache.
pub(crate) fn file_fingerprint(path: &Path) -> Result<Option<Vec<u8>>, NodeError> {
    if path.is_dir() {
        let mut all = Vec::new();
        for f in io::diffusers::files(path) {
            all.extend(file_fingerprint(&f)?.unwrap_or_default());
            all.push(b'\n');
        }
        return Ok(Some(all));
    }
    let meta = std::fs::metadata(path).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    Ok(Some(format!("{}:{}:{mtime}", path.display(), meta.len()).into_bytes()))
}
