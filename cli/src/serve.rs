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
    /// Folder of model files in ComfyUI's folders (`checkpoints/`, `loras/`, ... inside it;
    /// checkpoints may also lie in it directly).
    #[arg(long, value_name = "DIR", default_value = "models")]
    pub models_dir: PathBuf,
    /// Folder uploads go to and LoadImage reads from.
    #[arg(long, value_name = "DIR", default_value = "input")]
    pub input_dir: PathBuf,
    /// Folder output nodes write to.
    #[arg(long, value_name = "DIR", default_value = "output")]
    pub output_dir: PathBuf,
    /// Folder of `type=temp` files (PreviewImage writes to OUTPUT/temp) [default: OUTPUT/temp].
    #[arg(long, value_name = "DIR")]
    pub temp_dir: Option<PathBuf>,
    /// Folder the history is kept in, one JSON file per prompt [default: OUTPUT/history].
    #[arg(long, value_name = "DIR")]
    pub history_dir: Option<PathBuf>,
    /// Compute threads; all cores by default.
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub weight_type: crate::run::WeightTypeArg,
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

pub fn serve_command(args: ServeArgs) -> anyhow::Result<()> {
    let (registry, runtime) = crate::run::registry(
        &args.models_dir,
        &args.output_dir,
        &args.input_dir,
        args.threads,
        args.weight_type.resolve(),
    )?;
    let default_checkpoint = match &args.model {
        Some(m) => Some(checkpoint_name(&runtime, m)?),
        None => None,
    };
    let config = ServerConfig {
        listen: args.listen,
        port: args.port,
        temp_dir: args
            .temp_dir
            .unwrap_or_else(|| args.output_dir.join("temp")),
        history_dir: args
            .history_dir
            .unwrap_or_else(|| args.output_dir.join("history")),
        models_dir: args.models_dir,
        input_dir: args.input_dir,
        output_dir: args.output_dir,
        max_queue: args.max_queue,
        max_history: args.max_history,
        cors_origins: args.cors_origin,
        allowed_hosts: args.allow_host,
        auth_token: args.auth_token.filter(|t| !t.is_empty()),
        max_body_bytes: args.max_body_mb.saturating_mul(1 << 20),
        default_checkpoint,
        user_dir: args.user_directory,
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

/// `-m`'s checkpoint as a name in the checkpoints folder: a name there, or a path to a
/// file in it. The server's requests name models inside its models folder only, so a
/// file elsewhere is refused with where to put it.
fn checkpoint_name(runtime: &sdflow_nodes::Runtime, model: &str) -> anyhow::Result<String> {
    if runtime.resolve_model("checkpoints", model).is_ok() {
        return Ok(model.to_string());
    }
    let path = std::path::Path::new(model);
    let real = path.canonicalize().map_err(|e| anyhow::anyhow!("-m {model}: {e}"))?;
    for dir in runtime.kind_dirs("checkpoints") {
        if let Ok(rel) = real.strip_prefix(dir.canonicalize().unwrap_or(dir.clone())) {
            return Ok(rel.to_string_lossy().into_owned());
        }
    }
    anyhow::bail!("-m {model}: not in the checkpoints folder of --models-dir {}; put it there or give --models-dir the folder it is in", runtime.models_dir.display())
}
