//! `sdflow serve`: the HTTP/WebSocket server with ComfyUI's, A1111's and OpenAI's APIs
//! and the browser editor (see docs/server.md).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use sdflow_server::ServerConfig;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on. Anything but loopback exposes the server to the network:
    /// use --auth-token then.
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    pub listen: IpAddr,
    #[arg(long, default_value_t = 8188)]
    pub port: u16,
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
