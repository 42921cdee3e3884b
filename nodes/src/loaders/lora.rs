//! LoraLoader and LoraLoaderModelOnly: LoRA / LyCORIS files (`models/loras`) merged into
//! the weights of a MODEL and a CLIP.
//!
//! Nothing is merged when the node runs: the output's weights are a new residency entry
//! whose loader pins the input's weights and merges the LoRA into an overlay of them
//! (`sdflow_core::lora::merge`): the overlay owns only the patched tensors, the rest stay
//! the checkpoint's. The entry's key is the input's key plus the LoRA file and strength, so
//! a re-run with the same LoRAs is a residency hit, another strength merges again only the
//! tensors that LoRA touches, and the checkpoint itself is never reloaded for either. A
//! chain of LoraLoaders stacks overlays, each keyed by the chain so far.
//!
//! `apply_mode` is sd.cpp's `--lora-apply-mode`: `immediately` merges into the weights
//! (a quantized weight is dequantized, patched and quantized again), `at_runtime` keeps the
//! weights and adds LoRA / LoCon as low-rank branches when graphs are built, `auto` (the
//! default) picks `at_runtime` for quantized weights. The mode is part of the entry's key.

use crate::err;
use crate::runtime::Runtime;
use crate::values::{ClipRef, ModelRef};
use sdflow_core::io;
use sdflow_core::lora::{self, ApplyMode, LoraFile, Side};
use sdflow_core::models::Weights;
use sdflow_core::residency::{WeightHandle, WeightKey};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(LoraLoader { rt: rt.clone(), model_only: false }));
    registry.register(Arc::new(LoraLoader { rt: rt.clone(), model_only: true }));
}

/// `base` with the LoRA at `path` applied at `strength` in `mode` (for the modules of
/// `side`), as a residency handle; nothing is read until it is pinned.
pub fn lora_handle(rt: &Runtime, base: &WeightHandle<Weights>, path: &Path, strength: f32, side: Side, mode: ApplyMode) -> Result<WeightHandle<Weights>, NodeError> {
    lora_handle_with(rt, base, path, strength, side, mode, "lora", LoraFile::open)
}

/// [`lora_handle`] with the LoRA read from `path` by `read` (the LoRA part of a bundle);
/// `tag` keeps its residency key apart from a plain LoRA's.
#[allow(clippy::too_many_arguments)]
pub fn lora_handle_with(rt: &Runtime, base: &WeightHandle<Weights>, path: &Path, strength: f32, side: Side, mode: ApplyMode, tag: &str, read: fn(&Path) -> Result<LoraFile, lora::LoraError>) -> Result<WeightHandle<Weights>, NodeError> {
    let canonical = std::fs::canonicalize(path).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
    let bk = base.key();
    let mut sources = bk.sources.clone();
    sources.push(canonical.clone());
    // `{:?}` keeps every bit of the strength: 0.7 and 0.70000005 are different merges.
    // `auto` keys as itself: what it resolves to is known only once the base is loaded.
    let key = WeightKey { sources, prefix: format!("{}+{tag}:{}@{strength:?}", bk.prefix, mode.name()), dtype: bk.dtype, device: bk.device };
    let base = base.clone();
    rt.residency
        .get_or_load(key, move || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
            let pinned = base.pin()?;
            let file = read(&canonical)?;
            let (merged, report) = lora::apply(pinned, &file, side, strength, mode)?;
            // Not one module landing is a LoRA made for another model (family).
            if report.applied == 0 && !report.skipped.is_empty() {
                return Err(format!("{}: none of its {} modules for this side names a weight of this model (a LoRA for another model family?); first: {}", canonical.display(), report.skipped.len(), report.skipped[0]).into());
            }
            tracing::info!(lora = %canonical.display(), ?side, strength, mode = report.mode.name(), modules = report.applied, at_runtime = report.at_runtime, weights = report.patched_weights, skipped = report.skipped.len(), unknown_tensors = report.unknown.len(), "LoRA applied");
            Ok(merged)
        })
        .map_err(err)
}

/// ComfyUI's "Load LoRA" and "LoraLoaderModelOnly".
struct LoraLoader {
    rt: Arc<Runtime>,
    model_only: bool,
}

impl LoraLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model("loras", inputs.string("lora_name")?).map_err(NodeError::msg)
    }
}

fn strength_input(name: &str, tip: &str) -> InputSpec {
    InputSpec::float(name, 1.0).float_range(-100.0, 100.0).float_step(0.01).tooltip(tip)
}

/// The optional `apply_mode`: a workflow written for ComfyUI has none and gets `auto`.
fn apply_mode(inputs: &Inputs) -> Result<ApplyMode, NodeError> {
    if !inputs.contains("apply_mode") {
        return Ok(ApplyMode::Auto);
    }
    inputs.string("apply_mode")?.parse().map_err(err)
}

fn strength(inputs: &Inputs, name: &str) -> Result<f32, NodeError> {
    let s = inputs.float(name)?;
    if !s.is_finite() {
        return Err(NodeError::msg(format!("{name} must be a finite number, got {s}")));
    }
    Ok(s as f32)
}

impl Node for LoraLoader {
    fn schema(&self) -> NodeSchema {
        let model_tip = "How strongly to modify the diffusion model. This value can be negative.";
        let s = if self.model_only {
            NodeSchema::new("LoraLoaderModelOnly").display_name("LoraLoaderModelOnly")
        } else {
            NodeSchema::new("LoraLoader").display_name("Load LoRA")
        };
        let s = s
            .category("loaders")
            .description("Applies a LoRA / LyCORIS file (kohya, diffusers/PEFT, LoCon, LoHa, LoKr, full diff) to the weights, merged or as runtime branches; the checkpoint stays shared and loaded once.")
            .input(InputSpec::link("model", IoType::MODEL).tooltip("The diffusion model the LoRA will be applied to."));
        let s = if self.model_only { s } else { s.input(InputSpec::link("clip", IoType::CLIP).tooltip("The CLIP model the LoRA will be applied to.")) };
        let s = s.input(InputSpec::combo("lora_name", self.rt.list_models("loras")).tooltip("The name of the LoRA."));
        let s = s.input(strength_input("strength_model", model_tip));
        let s = if self.model_only { s } else { s.input(strength_input("strength_clip", "How strongly to modify the CLIP model. This value can be negative.")) };
        let s = s.input(
            InputSpec::combo("apply_mode", ApplyMode::NAMES)
                .combo_default(ApplyMode::Auto.name())
                .optional()
                .tooltip("sd.cpp's --lora-apply-mode: immediately merges into the weights, at_runtime adds LoRA/LoCon as low-rank branches and leaves the weights untouched, auto picks at_runtime for quantized weights."),
        );
        if self.model_only {
            s.output("MODEL", IoType::MODEL)
        } else {
            s.output("MODEL", IoType::MODEL).output("CLIP", IoType::CLIP)
        }
    }

    /// A changed file on disk must not be served from the cache.
    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        // The header only: a garbage file or a checkpoint picked by mistake fails here,
        // naming the file, instead of at the first sampling step.
        let src = io::open(&path).map_err(err)?;
        LoraFile::check(src.as_ref()).map_err(err)?;
        drop(src);
        let mode = apply_mode(inputs)?;
        let mut model = inputs.downcast::<ModelRef>("model")?.clone();
        let sm = strength(inputs, "strength_model")?;
        // Strength 0 is the input itself (as in ComfyUI): no entry, no merge.
        if sm != 0.0 {
            model.weights = lora_handle(&self.rt, &model.weights, &path, sm, Side::DiffusionModel, mode)?;
        }
        let mut out = vec![Value::new(IoType::MODEL, model)];
        if !self.model_only {
            let mut clip = inputs.downcast::<ClipRef>("clip")?.clone();
            let sc = strength(inputs, "strength_clip")?;
            if sc != 0.0 {
                for (i, enc) in clip.encoders.iter_mut().enumerate() {
                    let side = if i == 1 { Side::TextEncoder2 } else { Side::TextEncoder };
                    enc.weights = lora_handle(&self.rt, &enc.weights, &path, sc, side, mode)?;
                }
            }
            out.push(Value::new(IoType::CLIP, clip));
        }
        Ok(Outputs::new(out))
    }
}
