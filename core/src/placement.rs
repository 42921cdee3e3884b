//! Where each part of a pipeline computes and where its weights are kept: sd.cpp's
//! `--backend`, `--params-backend`, `--offload-to-cpu`, the deprecated `--clip-on-cpu`,
//! `--vae-on-cpu`, `--control-net-cpu`, `--max-vram` and the kernel switches (`--fa`,
//! `--diffusion-fa`, `--diffusion-conv-direct`, `--vae-conv-direct`), resolved once
//! against the devices this build of ggml sees.
//!
//! Its own module because the decision is pure: flags and a device list in, one
//! [`ModulePlacement`] per [`Module`] out. The runtime (nodes) acts on it; tests feed it
//! made-up device lists.

use std::collections::BTreeMap;

use crate::ggml::{BackendKind, DeviceInfo, GraphOptions};

/// The parts of a pipeline that can be placed, with sd.cpp's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    Diffusion,
    TextEncoder,
    ClipVision,
    Vae,
    ControlNet,
    PhotoMaker,
    Upscaler,
    Detector,
}

impl Module {
    pub const ALL: [Module; 8] = [
        Module::Diffusion,
        Module::TextEncoder,
        Module::ClipVision,
        Module::Vae,
        Module::ControlNet,
        Module::PhotoMaker,
        Module::Upscaler,
        Module::Detector,
    ];

    /// sd.cpp's name of the module.
    pub fn name(self) -> &'static str {
        match self {
            Module::Diffusion => "diffusion",
            Module::TextEncoder => "te",
            Module::ClipVision => "clip_vision",
            Module::Vae => "vae",
            Module::ControlNet => "controlnet",
            Module::PhotoMaker => "photomaker",
            Module::Upscaler => "upscaler",
            Module::Detector => "detector",
        }
    }

    /// A module by any name sd.cpp accepts for it (case, `-` and `_` ignored).
    pub fn parse(raw: &str) -> Option<Module> {
        let name: String = raw.trim().to_ascii_lowercase().chars().filter(|c| *c != '-' && *c != '_').collect();
        Some(match name.as_str() {
            "diffusion" | "model" | "unet" | "dit" => Module::Diffusion,
            "te" | "clip" | "text" | "textencoder" | "textencoders" | "conditioner" | "cond" | "llm" | "t5" | "t5xxl" => Module::TextEncoder,
            "clipvision" | "vision" => Module::ClipVision,
            "vae" | "firststage" | "autoencoder" | "tae" => Module::Vae,
            "controlnet" | "control" => Module::ControlNet,
            "photomaker" | "photomakerid" | "pmid" | "photo" => Module::PhotoMaker,
            "upscaler" | "esrgan" | "hires" => Module::Upscaler,
            "detector" | "adetailer" | "yolo" => Module::Detector,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("{flag}: `{part}` is not DEVICE or MODULE=DEVICE")]
    Syntax { flag: &'static str, part: String },
    #[error("{flag}: unknown module `{name}` (modules: diffusion, te, clip_vision, vae, controlnet, photomaker, upscaler, detector)")]
    UnknownModule { flag: &'static str, name: String },
    #[error("{flag}: no device `{name}` in this build (devices: {available}; see --list-devices)")]
    UnknownDevice { flag: &'static str, name: String, available: String },
    #[error("{flag}: `{value}` splits a module across devices (`&`); sdflow runs each module on one device, so name one")]
    Split { flag: &'static str, value: String },
    #[error("--max-vram: {0}")]
    MaxVram(String),
}

type Result<T> = std::result::Result<T, PlacementError>;

/// A `--backend` or `--params-backend` value as given: a default device name and
/// per-module ones. Later parts win, so shortcuts put in front are overridden by what
/// the user wrote (as sd.cpp prepends `te=cpu` for `--clip-on-cpu`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub default: Option<String>,
    pub modules: BTreeMap<Module, String>,
}

impl Assignment {
    /// Parse `cpu` or `clip=cpu,vae=cuda0,diffusion=vulkan0` (`all`, `default` and `*` set
    /// the default).
    pub fn parse(flag: &'static str, spec: &str) -> Result<Self> {
        let mut a = Assignment::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                a.default = Some(part.to_string());
                continue;
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || value.is_empty() {
                return Err(PlacementError::Syntax { flag, part: part.to_string() });
            }
            if matches!(key.to_ascii_lowercase().as_str(), "all" | "default" | "*") {
                a.default = Some(value.to_string());
                continue;
            }
            let module = Module::parse(key).ok_or_else(|| PlacementError::UnknownModule { flag, name: key.to_string() })?;
            a.modules.insert(module, value.to_string());
        }
        Ok(a)
    }

    /// The name given for `m`: its own, else the default.
    pub fn get(&self, m: Module) -> Option<&str> {
        self.modules.get(&m).or(self.default.as_ref()).map(String::as_str)
    }
}

/// Where a module's weights are kept between uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Params {
    /// On the device that computes with them (the default).
    WithRuntime,
    /// In another device's memory (host RAM with `--offload-to-cpu`), copied to the
    /// runtime device for each use and dropped from it afterwards.
    On(BackendKind),
    /// Nowhere: read from the model file for each use, dropped afterwards.
    Disk,
}

/// One module's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModulePlacement {
    /// The device its graphs run on.
    pub runtime: BackendKind,
    pub params: Params,
    /// How its graphs are built (`gpu` follows `runtime`).
    pub options: GraphOptions,
}

/// The placement flags as a user gives them (sd-cli's names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementSpec {
    /// `--backend`
    pub backend: Option<String>,
    /// `--params-backend`
    pub params_backend: Option<String>,
    /// `--offload-to-cpu`: every module's weights in RAM unless `--params-backend` says otherwise.
    pub offload_to_cpu: bool,
    /// `--clip-on-cpu`, `--vae-on-cpu`, `--control-net-cpu` (deprecated shortcuts).
    pub clip_on_cpu: bool,
    pub vae_on_cpu: bool,
    pub control_net_cpu: bool,
    /// `--max-vram`: GiB, one value or `DEVICE=GiB,...`.
    pub max_vram: Option<String>,
    /// `--fa`: fused attention in every module; `--diffusion-fa`: in the diffusion model.
    pub flash_attn: bool,
    pub diffusion_flash_attn: bool,
    /// `--diffusion-conv-direct`, `--vae-conv-direct`.
    pub diffusion_conv_direct: bool,
    pub vae_conv_direct: bool,
}

impl PlacementSpec {
    /// Whether any flag differs from the defaults.
    pub fn is_default(&self) -> bool {
        *self == PlacementSpec::default()
    }
}

/// Every module's place and each device's weight budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    modules: BTreeMap<Module, ModulePlacement>,
    budgets: BTreeMap<BackendKind, u64>,
}

impl Default for Placement {
    fn default() -> Self {
        Placement::cpu()
    }
}

const GIB: f64 = (1u64 << 30) as f64;

impl Placement {
    /// Everything on the CPU, weights with it, default kernels.
    pub fn cpu() -> Self {
        let here = ModulePlacement { runtime: BackendKind::Cpu, params: Params::WithRuntime, options: GraphOptions::default() };
        Placement { modules: Module::ALL.iter().map(|&m| (m, here)).collect(), budgets: BTreeMap::new() }
    }

    /// Resolve `spec` against `devices` (the CPU first, then the GPUs, as
    /// [`crate::ggml::devices`] lists them). Unassigned modules go to the default device:
    /// the first GPU, else the CPU, as sd.cpp picks it.
    pub fn resolve(spec: &PlacementSpec, devices: &[DeviceInfo]) -> Result<Self> {
        let mut runtime_spec = String::new();
        for (on, shortcut) in [(spec.clip_on_cpu, "te=cpu"), (spec.vae_on_cpu, "vae=cpu"), (spec.control_net_cpu, "controlnet=cpu")] {
            if on {
                runtime_spec.push_str(shortcut);
                runtime_spec.push(',');
            }
        }
        runtime_spec.push_str(spec.backend.as_deref().unwrap_or(""));
        let mut params_spec = String::from(if spec.offload_to_cpu { "*=cpu," } else { "" });
        params_spec.push_str(spec.params_backend.as_deref().unwrap_or(""));
        let runtime = Assignment::parse("--backend", &runtime_spec)?;
        let params = Assignment::parse("--params-backend", &params_spec)?;
        let mut modules = BTreeMap::new();
        for m in Module::ALL {
            let rt = resolve_device("--backend", runtime.get(m).unwrap_or("default"), devices)?;
            let params = match params.get(m) {
                None => Params::WithRuntime,
                Some(p) if p.trim().eq_ignore_ascii_case("disk") => Params::Disk,
                Some(p) => match resolve_device("--params-backend", p, devices)? {
                    d if d == rt => Params::WithRuntime,
                    d => Params::On(d),
                },
            };
            let flash_attn = spec.flash_attn || (m == Module::Diffusion && spec.diffusion_flash_attn);
            let conv_direct = (m == Module::Diffusion && spec.diffusion_conv_direct) || (m == Module::Vae && spec.vae_conv_direct);
            let options = GraphOptions { gpu: rt != BackendKind::Cpu, flash_attn, conv_direct };
            modules.insert(m, ModulePlacement { runtime: rt, params, options });
        }
        let budgets = match &spec.max_vram {
            Some(v) => max_vram(v, devices)?,
            None => BTreeMap::new(),
        };
        Ok(Placement { modules, budgets })
    }

    pub fn module(&self, m: Module) -> ModulePlacement {
        self.modules[&m]
    }

    /// The weight budget of each device `--max-vram` limits, in bytes.
    pub fn budgets(&self) -> &BTreeMap<BackendKind, u64> {
        &self.budgets
    }

    /// The devices some module computes on or keeps weights on.
    pub fn devices(&self) -> Vec<BackendKind> {
        let mut v: Vec<BackendKind> = self
            .modules
            .values()
            .flat_map(|p| [Some(p.runtime), if let Params::On(d) = p.params { Some(d) } else { None }])
            .flatten()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// One line per module, for logs and `--verbose`.
    pub fn describe(&self, devices: &[DeviceInfo]) -> String {
        let name = |k: BackendKind| devices.iter().find(|d| d.kind == k).map_or_else(|| format!("{k:?}"), |d| d.name.clone());
        self.modules
            .iter()
            .map(|(m, p)| {
                let params = match p.params {
                    Params::WithRuntime => String::new(),
                    Params::On(d) => format!(", weights in {}", name(d)),
                    Params::Disk => ", weights read from disk per use".into(),
                };
                format!("{m}: {}{params}", name(p.runtime))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The device `name` means: `default`/`auto` (first GPU, else the CPU), `gpu` (first
/// GPU), a backend's name (`cpu`, `cuda`, `vulkan`: its first device), a device's name
/// (`CUDA0`, `Vulkan1`), or the start of one; case does not matter.
pub fn resolve_device(flag: &'static str, name: &str, devices: &[DeviceInfo]) -> Result<BackendKind> {
    let want = name.trim().to_ascii_lowercase();
    if want.contains('&') {
        return Err(PlacementError::Split { flag, value: name.to_string() });
    }
    let first_gpu = || devices.iter().find(|d| d.kind != BackendKind::Cpu).map(|d| d.kind);
    let found = match want.as_str() {
        "" | "default" | "auto" => Some(first_gpu().unwrap_or(BackendKind::Cpu)),
        "gpu" => first_gpu(),
        _ => {
            let want = if want == "metal" { "mtl".to_string() } else { want.clone() };
            devices
                .iter()
                .find(|d| d.registry.to_ascii_lowercase() == want)
                .or_else(|| devices.iter().find(|d| d.name.to_ascii_lowercase() == want))
                .or_else(|| devices.iter().find(|d| d.name.to_ascii_lowercase().starts_with(&want)))
                .map(|d| d.kind)
        }
    };
    found.ok_or_else(|| PlacementError::UnknownDevice {
        flag,
        name: name.trim().to_string(),
        available: devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "),
    })
}

/// `--max-vram`: GiB for every GPU (`6`), or per device (`cuda0=6,vulkan0=4`); `0` sets
/// no limit; a negative value is the device's free memory less that much.
fn max_vram(spec: &str, devices: &[DeviceInfo]) -> Result<BTreeMap<BackendKind, u64>> {
    let mut out = BTreeMap::new();
    let mut set = |kind: BackendKind, raw: &str| -> Result<()> {
        let gib: f64 = raw.trim().parse().ok().filter(|g: &f64| g.is_finite()).ok_or_else(|| PlacementError::MaxVram(format!("`{raw}` is not a number of GiB")))?;
        let Some(dev) = devices.iter().find(|d| d.kind == kind) else { return Ok(()) };
        let bytes = if gib < 0.0 { (dev.free as f64 + gib * GIB).max(0.0) } else { gib * GIB };
        if gib == 0.0 {
            out.remove(&kind);
        } else {
            out.insert(kind, bytes as u64);
        }
        Ok(())
    };
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            None => {
                for d in devices.iter().filter(|d| d.kind != BackendKind::Cpu) {
                    set(d.kind, part)?;
                }
                // A value with no GPU to apply to is still checked.
                if !devices.iter().any(|d| d.kind != BackendKind::Cpu) {
                    set(BackendKind::Gpu(usize::MAX), part)?;
                }
            }
            Some((dev, gib)) => {
                let kind = resolve_device("--max-vram", dev, devices)?;
                set(kind, gib)?;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, registry: &str, kind: BackendKind, free_gib: u64) -> DeviceInfo {
        DeviceInfo { name: name.into(), description: format!("{name} device"), registry: registry.into(), kind, free: free_gib << 30, total: (free_gib + 1) << 30 }
    }

    fn cpu_only() -> Vec<DeviceInfo> {
        vec![dev("CPU", "CPU", BackendKind::Cpu, 20)]
    }

    fn two_gpus() -> Vec<DeviceInfo> {
        vec![dev("CPU", "CPU", BackendKind::Cpu, 20), dev("CUDA0", "CUDA", BackendKind::Gpu(0), 10), dev("CUDA1", "CUDA", BackendKind::Gpu(1), 22)]
    }

    fn spec(f: impl FnOnce(&mut PlacementSpec)) -> PlacementSpec {
        let mut s = PlacementSpec::default();
        f(&mut s);
        s
    }

    #[test]
    fn modules_parse_by_every_sdcpp_alias() {
        for (alias, m) in [("unet", Module::Diffusion), ("DiT", Module::Diffusion), ("clip", Module::TextEncoder), ("t5xxl", Module::TextEncoder), ("text_encoder", Module::TextEncoder), ("clip-vision", Module::ClipVision), ("first_stage", Module::Vae), ("tae", Module::Vae), ("control", Module::ControlNet), ("pmid", Module::PhotoMaker), ("esrgan", Module::Upscaler), ("hires", Module::Upscaler), ("yolo", Module::Detector), ("adetailer", Module::Detector)] {
            assert_eq!(Module::parse(alias), Some(m), "{alias}");
        }
        assert_eq!(Module::parse("refiner"), None);
        for m in Module::ALL {
            assert_eq!(Module::parse(m.name()), Some(m));
        }
    }

    #[test]
    fn unassigned_modules_go_to_the_first_gpu_else_the_cpu() {
        let p = Placement::resolve(&PlacementSpec::default(), &two_gpus()).unwrap();
        for m in Module::ALL {
            assert_eq!(p.module(m).runtime, BackendKind::Gpu(0));
            assert!(p.module(m).options.gpu);
            assert_eq!(p.module(m).params, Params::WithRuntime);
        }
        let p = Placement::resolve(&PlacementSpec::default(), &cpu_only()).unwrap();
        assert_eq!(p, Placement::cpu());
        assert_eq!(p.devices(), vec![BackendKind::Cpu]);
    }

    #[test]
    fn backend_assignments_name_devices_by_backend_device_or_prefix() {
        let s = spec(|s| s.backend = Some("clip=cpu, vae=cuda1,diffusion=CUDA".into()));
        let p = Placement::resolve(&s, &two_gpus()).unwrap();
        assert_eq!(p.module(Module::TextEncoder).runtime, BackendKind::Cpu);
        assert!(!p.module(Module::TextEncoder).options.gpu);
        assert_eq!(p.module(Module::Vae).runtime, BackendKind::Gpu(1));
        assert_eq!(p.module(Module::Diffusion).runtime, BackendKind::Gpu(0));
        assert_eq!(p.module(Module::Upscaler).runtime, BackendKind::Gpu(0), "unassigned: the default device");
        assert_eq!(p.devices(), vec![BackendKind::Cpu, BackendKind::Gpu(0), BackendKind::Gpu(1)]);
        // A bare name is the default; `all=` too; later parts win.
        let p = Placement::resolve(&spec(|s| s.backend = Some("cuda1,te=gpu".into())), &two_gpus()).unwrap();
        assert_eq!(p.module(Module::Diffusion).runtime, BackendKind::Gpu(1));
        assert_eq!(p.module(Module::TextEncoder).runtime, BackendKind::Gpu(0));
        let p = Placement::resolve(&spec(|s| s.backend = Some("all=cpu,*=cuda1,vae=cpu".into())), &two_gpus()).unwrap();
        assert_eq!(p.module(Module::Detector).runtime, BackendKind::Gpu(1));
        assert_eq!(p.module(Module::Vae).runtime, BackendKind::Cpu);
        // Prefix: `cu` is CUDA0, the first device whose name starts with it.
        assert_eq!(resolve_device("--backend", "cu", &two_gpus()).unwrap(), BackendKind::Gpu(0));
    }

    #[test]
    fn deprecated_shortcuts_place_their_module_on_the_cpu_unless_backend_says_otherwise() {
        let s = spec(|s| {
            s.clip_on_cpu = true;
            s.vae_on_cpu = true;
            s.control_net_cpu = true;
        });
        let p = Placement::resolve(&s, &two_gpus()).unwrap();
        for m in [Module::TextEncoder, Module::Vae, Module::ControlNet] {
            assert_eq!(p.module(m).runtime, BackendKind::Cpu, "{m}");
        }
        assert_eq!(p.module(Module::Diffusion).runtime, BackendKind::Gpu(0));
        let s = spec(|s| {
            s.vae_on_cpu = true;
            s.backend = Some("vae=cuda1".into());
        });
        assert_eq!(Placement::resolve(&s, &two_gpus()).unwrap().module(Module::Vae).runtime, BackendKind::Gpu(1));
    }

    #[test]
    fn params_follow_offload_and_params_backend() {
        let p = Placement::resolve(&spec(|s| s.offload_to_cpu = true), &two_gpus()).unwrap();
        assert_eq!(p.module(Module::Diffusion).params, Params::On(BackendKind::Cpu));
        let s = spec(|s| {
            s.offload_to_cpu = true;
            s.params_backend = Some("diffusion=disk,vae=cuda0".into());
            s.backend = Some("te=cpu".into());
        });
        let p = Placement::resolve(&s, &two_gpus()).unwrap();
        assert_eq!(p.module(Module::Diffusion).params, Params::Disk);
        assert_eq!(p.module(Module::Vae).params, Params::WithRuntime, "params on the runtime device are simply there");
        assert_eq!(p.module(Module::TextEncoder).params, Params::WithRuntime, "a CPU module's weights in RAM are its own");
        assert_eq!(p.module(Module::Upscaler).params, Params::On(BackendKind::Cpu));
        // On a CPU-only build offloading changes nothing.
        assert_eq!(Placement::resolve(&spec(|s| s.offload_to_cpu = true), &cpu_only()).unwrap(), Placement::cpu());
    }

    #[test]
    fn kernel_switches_reach_their_modules() {
        let s = spec(|s| {
            s.diffusion_flash_attn = true;
            s.vae_conv_direct = true;
        });
        let p = Placement::resolve(&s, &cpu_only()).unwrap();
        assert!(p.module(Module::Diffusion).options.flash_attn && !p.module(Module::TextEncoder).options.flash_attn);
        assert!(p.module(Module::Vae).options.conv_direct && !p.module(Module::Diffusion).options.conv_direct);
        let p = Placement::resolve(&spec(|s| s.flash_attn = true), &cpu_only()).unwrap();
        assert!(Module::ALL.iter().all(|&m| p.module(m).options.flash_attn));
    }

    #[test]
    fn max_vram_sets_budgets_per_gpu() {
        let p = Placement::resolve(&spec(|s| s.max_vram = Some("6".into())), &two_gpus()).unwrap();
        assert_eq!(p.budgets().get(&BackendKind::Gpu(0)), Some(&(6 << 30)));
        assert_eq!(p.budgets().get(&BackendKind::Gpu(1)), Some(&(6 << 30)));
        assert_eq!(p.budgets().get(&BackendKind::Cpu), None);
        let p = Placement::resolve(&spec(|s| s.max_vram = Some("cuda1=2.5, cuda0=-1".into())), &two_gpus()).unwrap();
        assert_eq!(p.budgets().get(&BackendKind::Gpu(1)), Some(&((5u64 << 30) / 2)));
        assert_eq!(p.budgets().get(&BackendKind::Gpu(0)), Some(&(9 << 30)), "free 10 GiB less 1");
        let p = Placement::resolve(&spec(|s| s.max_vram = Some("4,cuda1=0".into())), &two_gpus()).unwrap();
        assert_eq!(p.budgets().keys().copied().collect::<Vec<_>>(), vec![BackendKind::Gpu(0)]);
    }

    #[test]
    fn bad_flags_name_the_flag_and_what_is_wrong() {
        let err = |s: PlacementSpec, d: &[DeviceInfo]| Placement::resolve(&s, d).unwrap_err().to_string();
        let e = err(spec(|s| s.backend = Some("diffusion=cuda0".into())), &cpu_only());
        assert!(e.contains("--backend") && e.contains("cuda0") && e.contains("CPU"), "{e}");
        let e = err(spec(|s| s.backend = Some("refiner=cpu".into())), &two_gpus());
        assert!(e.contains("unknown module `refiner`"), "{e}");
        let e = err(spec(|s| s.backend = Some("vae=".into())), &two_gpus());
        assert!(e.contains("`vae=`"), "{e}");
        let e = err(spec(|s| s.backend = Some("diffusion=cuda0&cuda1".into())), &two_gpus());
        assert!(e.contains("splits"), "{e}");
        let e = err(spec(|s| s.params_backend = Some("te=tpu".into())), &two_gpus());
        assert!(e.contains("--params-backend") && e.contains("tpu"), "{e}");
        let e = err(spec(|s| s.max_vram = Some("lots".into())), &two_gpus());
        assert!(e.contains("--max-vram") && e.contains("lots"), "{e}");
        let e = err(spec(|s| s.max_vram = Some("nan".into())), &cpu_only());
        assert!(e.contains("nan"), "{e}");
        let e = err(spec(|s| s.backend = Some("gpu".into())), &cpu_only());
        assert!(e.contains("no device `gpu`"), "{e}");
    }
}
