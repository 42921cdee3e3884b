//! `sdflow serve`: the HTTP/WebSocket server with ComfyUI's, A1111's and OpenAI's APIs
//! and the browser editor (see docs/server.md).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use sdflow_server::ServerConfig;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (sd-server's --listen-ip). Anything but loopback exposes the
    /// server to the network: use --auth-token then.
    #[arg(long, visible_alias = "listen-ip", default_value = "127.0.0.1", value_name = "ADDR")]
    pub listen: IpAddr,
    /// Port (sd-server's --listen-port; ComfyUI's default, not sd-server's 1234).
    #[arg(long, visible_alias = "listen-port", default_value_t = 8188)]
    pub port: u16,
    /// The checkpoint A1111 and OpenAI requests use when they name none (sd-server's
    /// -m): a name in MODELS/checkpoints, or a path to a file there.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// sd-server's standalone diffusion model, with its parts below: what A1111 and OpenAI
    /// requests that name no checkpoint (and no -m is given) run. Each is a name in its
    /// folder of --models-dir (`diffusion_models/`, `vae/`, `text_encoders/`), or a path to
    /// a file there.
    #[arg(long, value_name = "MODEL")]
    pub diffusion_model: Option<String>,
    #[arg(long, value_name = "MODEL")]
    pub vae: Option<String>,
    #[arg(long = "clip_l", value_name = "MODEL")]
    pub clip_l: Option<String>,
    #[arg(long = "clip_g", value_name = "MODEL")]
    pub clip_g: Option<String>,
    #[arg(long, value_name = "MODEL")]
    pub t5xxl: Option<String>,
    /// CLIP-vision ViT-H (`clip_vision/`): how Wan 2.1 I2V / FLF2V models read a video
    /// job's images.
    #[arg(long = "clip_vision", value_name = "MODEL")]
    pub clip_vision: Option<String>,
    /// Wan2.2 A14B's high-noise expert (`diffusion_models/`), which samples a video job's
    /// first steps (its `high_noise_sample_params`, `moe_boundary`).
    #[arg(long, value_name = "MODEL")]
    pub high_noise_diffusion_model: Option<String>,
    /// The AnimateDiff motion module (`animatediff_models/`) an SD1.x checkpoint animates
    /// video jobs with when they name none (default: the folder's first).
    #[arg(long = "motion-module", value_name = "MODEL")]
    pub motion_module: Option<String>,
    /// sd-server's generation defaults for A1111 and OpenAI requests (a request's own
    /// field wins): negative prompt, CFG scale, FLUX guidance, steps, sampler (sd.cpp's or
    /// ComfyUI's name), scheduler, size, CLIP skip.
    #[arg(short = 'n', long, value_name = "TEXT")]
    pub negative_prompt: Option<String>,
    #[arg(long, value_name = "float")]
    pub cfg_scale: Option<f64>,
    #[arg(long, value_name = "float")]
    pub guidance: Option<f64>,
    #[arg(long, value_name = "int")]
    pub steps: Option<i64>,
    #[arg(long, value_name = "NAME")]
    pub sampling_method: Option<String>,
    #[arg(long, value_name = "NAME")]
    pub scheduler: Option<String>,
    #[arg(short = 'W', long, value_name = "int")]
    pub width: Option<i64>,
    #[arg(short = 'H', long, value_name = "int")]
    pub height: Option<i64>,
    #[arg(long, value_name = "int", allow_negative_numbers = true)]
    pub clip_skip: Option<i64>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Folder of `type=temp` files (PreviewImage writes to OUTPUT/temp) [default: OUTPUT/temp].
    #[arg(long, value_name = "DIR")]
    pub temp_dir: Option<PathBuf>,
    /// Folder the history is kept in, one JSON file per prompt [default: OUTPUT/history].
    #[arg(long, value_name = "DIR")]
    pub history_dir: Option<PathBuf>,
    /// Scale-out: queue prompts in this Redis (`redis://[[user]:password@]host[:port][/db]`,
    /// `rediss://` for TLS) for `sdflow worker`s to run, and keep the history there; any
    /// number of front ends may share it. Without it prompts run in this process.
    #[arg(long, value_name = "URL")]
    pub queue: Option<String>,
    /// With --queue: serve outputs from the S3-compatible store the workers put them in
    /// (`s3://BUCKET[/PREFIX]`; see `sdflow worker --help`).
    #[arg(long, value_name = "URL", requires = "queue")]
    pub output_store: Option<String>,
    /// Most prompts waiting to run; more are refused with HTTP 429.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub max_queue: usize,
    /// Most finished prompts kept in the history (oldest dropped first).
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub max_history: usize,
    /// A browser origin (`https://host:port`, or `*`) allowed to call the API from its
    /// pages; CORS headers are sent to it. Repeatable.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    /// A host name clients reach the server by (a reverse proxy's, a LAN name), besides
    /// loopback names and the listen address; requests for other hosts get 403. Repeatable.
    /// On loopback other hosts are always refused (DNS rebinding); beyond it, only once
    /// this is given.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// Require `Authorization: Bearer TOKEN` (or `?token=TOKEN`) on every request.
    #[arg(long, value_name = "TOKEN")]
    pub auth_token: Option<String>,
    /// Folder of per-user data (ComfyUI frontend settings and saved workflows, under
    /// `default/`), as ComfyUI's --user-directory.
    #[arg(long = "user-directory", value_name = "DIR", default_value = "user")]
    pub user_directory: PathBuf,
    /// Serve this web frontend instead of the embedded editor: ComfyUI's own, as
    /// `pip install comfyui-frontend-package` installs it (the package folder, its
    /// `static/` folder, or the site-packages folder holding it), or `installed` to find
    /// that package through `python3`. ComfyUI's flag of the same name.
    #[arg(long = "front-end-root", value_name = "DIR")]
    pub front_end_root: Option<PathBuf>,
    /// Largest request body (uploads, prompts), in MiB.
    #[arg(long, default_value_t = 100, value_name = "MB")]
    pub max_body_mb: usize,
}

/// What a process that runs prompts is told, `sdflow serve` and `sdflow worker` alike: its
/// folders (in scale-out mode the same names everywhere, input and output shared) and its
/// compute options.
#[derive(Args)]
pub struct EngineArgs {
    /// Folder of model files in ComfyUI's folders (`checkpoints/`, `loras/`, ... inside it;
    /// checkpoints may also lie in it directly).
    #[arg(long, value_name = "DIR", default_value = "models")]
    pub models_dir: PathBuf,
    /// Folder uploads go to and LoadImage reads from.
    #[arg(long, value_name = "DIR", default_value = "input")]
    pub input_dir: PathBuf,
    /// Folder output nodes write to, which `/view` serves.
    #[arg(long, value_name = "DIR", default_value = "output")]
    pub output_dir: PathBuf,
    /// Compute threads; all cores by default.
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub weight_type: crate::run::WeightTypeArg,
    #[command(flatten)]
    pub placement: crate::run::PlacementArgs,
}

impl EngineArgs {
    /// Every node over a runtime on these folders and devices.
    pub fn registry(&self) -> anyhow::Result<(sdflow_executor::Registry, Arc<sdflow_nodes::Runtime>)> {
        crate::run::registry(&self.models_dir, &self.output_dir, &self.input_dir, self.threads, self.weight_type.resolve(), self.placement.resolve()?)
    }
}

pub fn serve_command(args: ServeArgs) -> anyhow::Result<()> {
    if args.engine.placement.list_devices() {
        return Ok(());
    }
    let (registry, runtime) = args.engine.registry()?;
    let default_checkpoint = match &args.model {
        Some(m) => Some(model_name(&runtime, "checkpoints", "-m", m)?),
        None => None,
    };
    let sdapi_defaults = sdapi_defaults(&args, &runtime)?;
    let video_defaults = video_defaults(&args, &runtime)?;
    let config = ServerConfig {
        listen: args.listen,
        port: args.port,
        temp_dir: args
            .temp_dir
            .unwrap_or_else(|| args.engine.output_dir.join("temp")),
        history_dir: args
            .history_dir
            .unwrap_or_else(|| args.engine.output_dir.join("history")),
        models_dir: args.engine.models_dir,
        input_dir: args.engine.input_dir,
        output_dir: args.engine.output_dir,
        queue_url: args.queue,
        output_store: args.output_store,
        max_queue: args.max_queue,
        max_history: args.max_history,
        cors_origins: args.cors_origin,
        allowed_hosts: args.allow_host,
        auth_token: args.auth_token.filter(|t| !t.is_empty()),
        max_body_bytes: args.max_body_mb.saturating_mul(1 << 20),
        default_checkpoint,
        user_dir: args.user_directory,
        sdapi_defaults,
        video_defaults,
        front_end_root: match args.front_end_root {
            Some(p) if p.as_os_str() == "installed" => Some(installed_front_end()?),
            other => other,
        },
    };
    if !config.models_dir.is_dir() {
        // Every loader's list would be empty with no word why.
        eprintln!("warning: the models folder {} does not exist: no loader lists any model (give --models-dir)", config.models_dir.display());
    }
    if !config.listen.is_loopback() && config.auth_token.is_none() {
        eprintln!("warning: listening on {} without --auth-token: anyone who can reach it can run workflows and read outputs", config.listen);
    }
    sdflow_server::serve_until_ctrl_c(config, Arc::new(registry), runtime, |addr| {
        println!("sdflow serving on http://{addr}")
    })?;
    Ok(())
}

/// Where pip put `comfyui-frontend-package`, asked of the system's `python3`.
fn installed_front_end() -> anyhow::Result<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import comfyui_frontend_package, os; print(os.path.dirname(comfyui_frontend_package.__file__))"])
        .output()
        .map_err(|e| anyhow::anyhow!("--front-end-root installed: running python3: {e}"))?;
    if !out.status.success() {
        anyhow::bail!("--front-end-root installed: python3 cannot import comfyui_frontend_package (pip install comfyui-frontend-package, or give its folder)");
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// What A1111 and OpenAI requests start from: sd-server's model and generation flags,
/// checked now so a mistake shows at start-up rather than at the first request.
fn sdapi_defaults(args: &ServeArgs, runtime: &sdflow_nodes::Runtime) -> anyhow::Result<sdflow_workflows::presets::ImgGenParams> {
    use sdflow_workflows::presets::{workflow_sampler_name, workflow_scheduler_name};
    let mut p = sdflow_workflows::presets::ImgGenParams::default();
    let name = |kind: &str, flag: &str, v: &Option<String>| v.as_ref().map(|v| model_name(runtime, kind, flag, v)).transpose();
    p.diffusion_model = name("diffusion_models", "--diffusion-model", &args.diffusion_model)?;
    p.vae = name("vae", "--vae", &args.vae)?;
    p.clip_l = name("text_encoders", "--clip_l", &args.clip_l)?;
    p.clip_g = name("text_encoders", "--clip_g", &args.clip_g)?;
    p.t5xxl = name("text_encoders", "--t5xxl", &args.t5xxl)?;
    p.clip_vision = name("clip_vision", "--clip_vision", &args.clip_vision)?;
    if p.diffusion_model.is_none() && (p.clip_l.is_some() || p.clip_g.is_some() || p.t5xxl.is_some()) && args.model.is_none() {
        anyhow::bail!("--clip_l, --clip_g and --t5xxl go with --diffusion-model (or -m)");
    }
    if let Some(n) = &args.negative_prompt {
        p.negative_prompt = n.clone();
    }
    if let Some(v) = args.cfg_scale {
        p.cfg_scale = v;
    }
    if let Some(v) = args.guidance {
        p.guidance = v;
    }
    if let Some(v) = args.steps {
        anyhow::ensure!((1..=10_000).contains(&v), "--steps {v}: outside 1..=10000");
        p.steps = v;
    }
    if let Some(m) = &args.sampling_method {
        let name = workflow_sampler_name(m).to_string();
        name.parse::<sdflow_core::sampling::Sampler>().map_err(|e| anyhow::anyhow!("--sampling-method: {e}"))?;
        p.sampling_method = Some(name);
    }
    if let Some(s) = &args.scheduler {
        let name = workflow_scheduler_name(s).to_string();
        name.parse::<sdflow_core::sampling::Scheduler>().map_err(|e| anyhow::anyhow!("--scheduler: {e}"))?;
        p.scheduler = Some(name);
    }
    for (flag, v) in [("-W", args.width), ("-H", args.height)] {
        if let Some(v) = v {
            anyhow::ensure!(v >= 64 && v % 8 == 0 && v <= 16_384, "{flag} {v}: a multiple of 8 in 64..=16384");
        }
    }
    if let (Some(w), Some(h)) = (args.width, args.height) {
        (p.width, p.height) = (w, h);
    } else if let Some(v) = args.width.or(args.height) {
        (p.width, p.height) = (v, v);
    }
    if let Some(v) = args.clip_skip {
        p.clip_skip = v;
    }
    Ok(p)
}

/// What sd-server's video jobs start from: the high-noise expert with sd-cli's defaults for
/// its pass (steps from the boundary, CFG 7, euler, boundary 0.875) and the motion module.
fn video_defaults(args: &ServeArgs, runtime: &sdflow_nodes::Runtime) -> anyhow::Result<sdflow_workflows::presets::VideoParams> {
    use sdflow_workflows::presets::{HighNoiseParams, VideoParams};
    let high_noise = match &args.high_noise_diffusion_model {
        Some(m) => Some(HighNoiseParams { model: model_name(runtime, "diffusion_models", "--high-noise-diffusion-model", m)?, steps: -1, cfg_scale: 7.0, sampling_method: None, eta: None, boundary: 0.875 }),
        None => None,
    };
    let motion_module = args.motion_module.as_ref().map(|m| model_name(runtime, "animatediff_models", "--motion-module", m)).transpose()?;
    Ok(VideoParams { high_noise, motion_module, ..VideoParams::default() })
}

/// A model flag's file as a name in its folder (`kind`): a name there, or a path to a
/// file in it. The server's requests name models inside its models folder only, so a
/// file elsewhere is refused with where to put it.
fn model_name(runtime: &sdflow_nodes::Runtime, kind: &str, flag: &str, model: &str) -> anyhow::Result<String> {
    if runtime.resolve_model(kind, model).is_ok() {
        return Ok(model.to_string());
    }
    let path = std::path::Path::new(model);
    let real = path.canonicalize().map_err(|e| anyhow::anyhow!("{flag} {model}: neither a file in the {kind} folder of --models-dir {} nor a path to one ({e})", runtime.models_dir.display()))?;
    for dir in runtime.kind_dirs(kind) {
        if let Ok(rel) = real.strip_prefix(dir.canonicalize().unwrap_or(dir.clone())) {
            return Ok(rel.to_string_lossy().into_owned());
        }
    }
    anyhow::bail!("{flag} {model}: not in the {kind} folder of --models-dir {}; put it there or give --models-dir the folder it is in", runtime.models_dir.display())
}
