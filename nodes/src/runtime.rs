//! What every node of one registry shares.

use parking_lot::Mutex;
use sdflow_core::ggml::{Backend, BackendKind, BufferType, DeviceInfo};
use sdflow_core::io::WeightType;
use sdflow_core::models::Placeable;
use sdflow_core::placement::{Module, ModulePlacement, Params, Placement};
use sdflow_core::residency::{PinGuard, ResidencyManager, WeightHandle, WeightKey};
use sdflow_executor::NodeError;
use std::path::{Path, PathBuf};

pub struct Runtime {
    /// The one owner of model weights.
    pub residency: ResidencyManager,
    /// Where model files are looked up (`checkpoints/` inside it, or the folder itself).
    pub models_dir: PathBuf,
    /// Where output nodes write when the executor gives no output directory.
    pub output_dir: PathBuf,
    /// Where LoadImage finds its files (ComfyUI's `input/`).
    pub input_dir: PathBuf,
    /// What weights are converted to at load (`--type`; the binaries default to
    /// [`WeightType::for_cpu`]).
    pub weight_type: WeightType,
    /// When VAEDecode/VAEEncode work in tiles (`--vae-tiling` and its options).
    pub vae_tiling: sdflow_core::models::vae::tiling::VaeTiling,
    /// The generator of sampling noise (`--rng`): ComfyUI's CPU noise by default.
    pub rng: sdflow_core::sampling::RngKind,
    /// How samplers preview their progress (`--preview-method`).
    pub preview: crate::sampling::preview::PreviewMethod,
    /// Preview the noisy latent (the sampler's state after each step) rather than the
    /// denoised estimate (sd-cli's `--preview-noisy`).
    pub preview_noisy: bool,
    /// Where each module computes and keeps its weights (`--backend` and friends).
    placement: Placement,
    /// The devices ggml saw when the placement was made, for names and status.
    devices: Vec<DeviceInfo>,
    /// One backend per device the placement uses, created up front and kept for the
    /// process's life (ggml's Vulkan device cannot be set up twice in one process). Each
    /// runs one graph at a time, as the executor's device lane guarantees anyway.
    backends: Vec<(BackendKind, Mutex<Backend>)>,
    threads: usize,
}

/// Whose placement a call follows: a module's, or a module's put on the CPU by the node
/// that loaded it (ComfyUI's CLIPLoader `device: cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    Module(Module),
    Cpu(Module),
}

impl From<Module> for Place {
    fn from(m: Module) -> Self {
        Place::Module(m)
    }
}

/// A loader with the size its payload will have.
struct SizedLoad<F> {
    bytes: Option<u64>,
    load: F,
}

impl<T: Placeable, F: Fn() -> Result<T, Box<dyn std::error::Error + Send + Sync>> + Send + Sync + 'static> sdflow_core::residency::Load for SizedLoad<F> {
    type Output = T;
    fn estimate(&self) -> Option<u64> {
        self.bytes
    }
    fn load(&self) -> Result<T, sdflow_core::residency::BoxError> {
        (self.load)()
    }
}

/// The executor lane name of the compute backend.
pub const DEVICE_LANE: &str = "cpu0";

/// The lane of every node that computes on the backend: one at a time.
pub fn device_lane() -> sdflow_executor::Lane {
    sdflow_executor::Lane::Device(DEVICE_LANE.into())
}

impl Runtime {
    pub fn new(models_dir: impl Into<PathBuf>, output_dir: impl Into<PathBuf>, threads: usize, weight_type: impl Into<WeightType>) -> Result<Self, sdflow_core::ggml::GgmlError> {
        Ok(Runtime {
            residency: ResidencyManager::new(),
            models_dir: models_dir.into(),
            output_dir: output_dir.into(),
            input_dir: PathBuf::from("input"),
            weight_type: weight_type.into(),
            vae_tiling: Default::default(),
            rng: sdflow_core::sampling::RngKind::Cpu,
            preview: crate::sampling::preview::PreviewMethod::default(),
            preview_noisy: false,
            placement: Placement::cpu(),
            devices: sdflow_core::ggml::devices(),
            backends: vec![(BackendKind::Cpu, Mutex::new(Backend::cpu(threads)?))],
            threads,
        })
    }

    /// Place the modules as `placement` says: its devices' backends are started now (an
    /// error names the device that failed) and `--max-vram` budgets go to the residency
    /// manager.
    pub fn with_placement(mut self, placement: Placement) -> Result<Self, sdflow_core::ggml::GgmlError> {
        for kind in placement.devices() {
            if !self.backends.iter().any(|(k, _)| *k == kind) {
                self.backends.push((kind, Mutex::new(Backend::new(kind, self.threads)?)));
            }
        }
        for (&kind, &bytes) in placement.budgets() {
            self.residency.set_budget(kind.into(), Some(bytes));
        }
        self.placement = placement;
        Ok(self)
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The devices ggml reported at start.
    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    /// Where `module`'s graphs run and its weights are kept. A ControlNet runs inside the
    /// UNet's graph, so it computes where the diffusion model does; placed elsewhere, its
    /// weights are kept there and copied over for each use.
    pub fn place(&self, place: impl Into<Place>) -> ModulePlacement {
        let module = match place.into() {
            Place::Module(m) => m,
            Place::Cpu(m) => {
                let options = self.placement.module(m).options;
                return ModulePlacement { runtime: BackendKind::Cpu, params: Params::WithRuntime, options: sdflow_core::ggml::GraphOptions { gpu: false, ..options } };
            }
        };
        let own = self.placement.module(module);
        if module != Module::ControlNet {
            return own;
        }
        let host = self.placement.module(Module::Diffusion);
        let params = match own.params {
            Params::WithRuntime if own.runtime != host.runtime => Params::On(own.runtime),
            Params::On(d) if d == host.runtime => Params::WithRuntime,
            p => p,
        };
        ModulePlacement { runtime: host.runtime, params, options: host.options }
    }

    /// The memory `module`'s weights are loaded into: its params device, else its runtime
    /// device.
    fn home(&self, place: Place) -> BackendKind {
        let p = self.place(place);
        match p.params {
            Params::On(d) => d,
            Params::WithRuntime | Params::Disk => p.runtime,
        }
    }

    /// Register `module`'s weights under `key` (its device is set here), loaded by `load`
    /// into the memory the placement keeps them in. Nothing is read until a pin.
    pub fn weights<T, F>(&self, place: impl Into<Place>, key: WeightKey, load: F) -> Result<WeightHandle<T>, NodeError>
    where
        T: Placeable,
        F: Fn(&BufferType) -> Result<T, Box<dyn std::error::Error + Send + Sync>> + Send + Sync + 'static,
    {
        self.weights_sized(place, key, None, load)
    }

    /// [`Runtime::weights`] for weights of a known size (`bytes`, from the file's header): a
    /// load that cannot fit its device's budget is refused before anything is allocated.
    pub fn weights_sized<T, F>(&self, place: impl Into<Place>, mut key: WeightKey, bytes: Option<u64>, load: F) -> Result<WeightHandle<T>, NodeError>
    where
        T: Placeable,
        F: Fn(&BufferType) -> Result<T, Box<dyn std::error::Error + Send + Sync>> + Send + Sync + 'static,
    {
        let place = place.into();
        let home = self.home(place);
        key.device = home.into();
        let loader = SizedLoad { bytes, load: move || -> Result<T, Box<dyn std::error::Error + Send + Sync>> { load(&BufferType::of(home)?) } };
        match self.place(place).params {
            Params::Disk => self.residency.get_or_load_transient(key, loader),
            _ => self.residency.get_or_load(key, loader),
        }
        .map_err(crate::err)
    }

    /// `handle`'s weights on the device `module` computes on, held there until the guard
    /// is dropped: the weights themselves, or (kept on another device: offloading) a copy
    /// made for this use and dropped after it.
    pub fn pin<T: Placeable>(&self, place: impl Into<Place>, handle: &WeightHandle<T>) -> Result<PinGuard<T>, NodeError> {
        let runtime = self.place(place).runtime;
        if handle.key().device == runtime.into() {
            return handle.pin().map_err(crate::err);
        }
        let mut key = handle.key().clone();
        key.device = runtime.into();
        let home = handle.clone();
        let copy = self
            .residency
            .get_or_load_transient(key, move || -> Result<T, Box<dyn std::error::Error + Send + Sync>> { Ok(home.pin()?.copy_to(&BufferType::of(runtime)?)?) })
            .map_err(crate::err)?;
        copy.pin().map_err(crate::err)
    }

    /// Set the generator of sampling noise.
    pub fn with_rng(mut self, rng: sdflow_core::sampling::RngKind) -> Self {
        self.rng = rng;
        self
    }

    /// Set how samplers preview their progress.
    pub fn with_preview_method(mut self, preview: crate::sampling::preview::PreviewMethod) -> Self {
        self.preview = preview;
        self
    }

    /// Preview the noisy latents instead of the denoised estimates.
    pub fn with_preview_noisy(mut self, noisy: bool) -> Self {
        self.preview_noisy = noisy;
        self
    }

    /// Set when VAEDecode/VAEEncode work in tiles.
    pub fn with_vae_tiling(mut self, tiling: sdflow_core::models::vae::tiling::VaeTiling) -> Self {
        self.vae_tiling = tiling;
        self
    }

    /// Run `f` with exclusive use of the backend `module` computes on, graphs built for
    /// that device with the module's kernel choices.
    pub fn with_backend<T>(&self, place: impl Into<Place>, f: impl FnOnce(&Backend) -> T) -> T {
        let p = self.place(place);
        let (_, backend) = self.backends.iter().find(|(k, _)| *k == p.runtime).expect("with_placement starts a backend for every device the placement uses");
        let b = backend.lock();
        sdflow_core::ggml::scope(p.options, || f(&b))
    }

    /// Set the folder LoadImage reads from.
    pub fn with_input_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.input_dir = dir.into();
        self
    }

    /// Image files in the input folder, by name relative to it.
    pub fn list_inputs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.input_dir) else { return Vec::new() };
        let mut out: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_file())
            .filter(|e| {
                e.path().extension().and_then(|x| x.to_str()).is_some_and(|x| ["png", "jpg", "jpeg", "webp"].contains(&x.to_ascii_lowercase().as_str()))
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }

    /// The content of input file `name`: the fingerprint of nodes that read it, so a
    /// re-uploaded identical picture keeps the cache and a changed one does not.
    pub fn input_fingerprint(&self, name: &str) -> Result<Option<Vec<u8>>, sdflow_executor::NodeError> {
        let path = self.resolve_input(name).map_err(sdflow_executor::NodeError::msg)?;
        std::fs::read(&path).map(Some).map_err(|e| sdflow_executor::NodeError::msg(format!("{}: {e}", path.display())))
    }

    /// The input file `name` refers to, confined to the input folder.
    pub fn resolve_input(&self, name: &str) -> Result<PathBuf, String> {
        let rel = Path::new(name);
        if rel.is_absolute() || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(format!("image name `{name}` must be a plain name inside the input folder"));
        }
        let path = self.input_dir.join(rel);
        if !path.is_file() {
            return Err(format!("image `{name}` not found in {}", self.input_dir.display()));
        }
        Ok(path)
    }

    /// The textual-inversion embeddings of `<models>/embeddings`, if the folder exists.
    pub(crate) fn embedding_library(&self) -> Result<Option<sdflow_core::text::EmbeddingLibrary>, sdflow_executor::NodeError> {
        let dir = self.models_dir.join("embeddings");
        if !dir.is_dir() {
            return Ok(None);
        }
        let tokenizer = sdflow_core::text::ClipTokenizer::new(sdflow_core::text::PadToken::EndOfText);
        sdflow_core::text::EmbeddingLibrary::scan(&dir, &tokenizer).map(Some).map_err(crate::err)
    }

    /// Model files of one kind (`checkpoints`), by name relative to their folder: the
    /// kind's folders only ([`Runtime::kind_dirs`]), never another kind's, so a loader
    /// never offers a file it cannot load.
    pub fn list_models(&self, kind: &str) -> Vec<String> {
        let mut out = Vec::new();
        for dir in self.kind_dirs(kind) {
            list_files(&dir, &dir, 0, &mut out);
        }
        out.sort();
        out.dedup();
        out
    }

    /// The folders of one kind that exist, in ComfyUI's order: `models/<kind>` and the
    /// older names ComfyUI still reads for it (`unet/` for diffusion models, `clip/` for
    /// text encoders, `t2i_adapter/` beside `controlnet/`). Checkpoints alone fall back
    /// to the models folder itself when it has no `checkpoints/` (a folder of checkpoint
    /// files: `--models-dir ~/Downloads`).
    pub fn kind_dirs(&self, kind: &str) -> Vec<PathBuf> {
        let one = [kind];
        let names: &[&str] = match kind {
            "diffusion_models" => &["diffusion_models", "unet"],
            "text_encoders" => &["text_encoders", "clip"],
            "controlnet" => &["controlnet", "t2i_adapter"],
            _ => &one,
        };
        let dirs: Vec<PathBuf> = names.iter().map(|n| self.models_dir.join(n)).filter(|d| d.is_dir()).collect();
        if dirs.is_empty() && kind == "checkpoints" && self.models_dir.is_dir() {
            return vec![self.models_dir.clone()];
        }
        dirs
    }

    /// The file a model name refers to; names never leave the models folder.
    pub fn resolve_model(&self, kind: &str, name: &str) -> Result<PathBuf, String> {
        let rel = Path::new(name);
        if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(format!("model name `{name}` must be relative to the models folder"));
        }
        let dirs = self.kind_dirs(kind);
        if let Some(path) = dirs.iter().map(|d| d.join(rel)).find(|p| p.exists()) {
            return Ok(path);
        }
        Err(match dirs.first() {
            Some(dir) => format!("model `{name}` not found in {}", dir.display()),
            None if self.models_dir.is_dir() => format!("model `{name}` not found: the models folder {} has no `{kind}/`", self.models_dir.display()),
            None => format!("model `{name}` not found: the models folder {} does not exist", self.models_dir.display()),
        })
    }
}

/// The model file extensions the loaders list (ComfyUI's `supported_pt_extensions` and
/// GGUF).
pub const MODEL_EXTENSIONS: [&str; 6] = ["safetensors", "gguf", "ckpt", "pt", "pth", "bin"];

/// Whether `path` is something a model loader reads: a file with a model extension, or a
/// diffusers pipeline folder.
pub fn is_model_path(path: &Path) -> bool {
    if path.is_dir() {
        return is_pipeline_dir(path);
    }
    path.extension().and_then(|x| x.to_str()).is_some_and(|x| MODEL_EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()))
}

/// A diffusers pipeline folder: listed as one model, not browsed.
fn is_pipeline_dir(dir: &Path) -> bool {
    dir.join("model_index.json").exists() || dir.join("unet").is_dir() || dir.join("transformer").is_dir()
}

fn list_files(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            // A diffusers folder is one model; other folders are browsed.
            if is_pipeline_dir(&p) {
                if let Ok(rel) = p.strip_prefix(root) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            } else if depth < 4 {
                list_files(root, &p, depth + 1, out);
            }
        } else if is_model_path(&p) {
            if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
}
