//! `sdflow worker`: runs prompts that `sdflow serve --queue redis://…` front ends accept
//! (docs/scale-out.md).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

#[derive(Args)]
pub struct WorkerArgs {
    /// The Redis the front ends queue prompts in: `redis://[[user]:password@]host[:port][/db]`,
    /// or `rediss://…` for TLS.
    #[arg(long, value_name = "URL")]
    pub queue: String,
    /// This worker's name in the consumer group [default: HOST-PID]. Two running workers
    /// must not share one.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Folders and compute options: the front ends' folders (models by the same names,
    /// input and output shared, or output in --output-store).
    #[command(flatten)]
    pub engine: crate::serve::EngineArgs,
    /// Put outputs in this S3-compatible object store (`s3://BUCKET[/PREFIX]`) rather than
    /// the output folder, for front ends that share no folder with this worker (they take
    /// the same flag). Credentials, region and endpoint from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ENDPOINT_URL.
    #[arg(long, value_name = "URL")]
    pub output_store: Option<String>,
    /// Seconds a prompt's worker may go silent before another worker takes it for dead
    /// and runs the prompt again.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub claim_timeout: f64,
    /// Address and port of this worker's `/health` (port 0 picks a free one; the address
    /// is printed at start).
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    pub health_listen: IpAddr,
    #[arg(long, default_value_t = 0)]
    pub health_port: u16,
}

pub fn worker_command(args: WorkerArgs) -> anyhow::Result<()> {
    if args.engine.placement.list_devices() {
        return Ok(());
    }
    anyhow::ensure!(args.claim_timeout.is_finite() && (1.0..=86_400.0).contains(&args.claim_timeout), "--claim-timeout {}: outside 1..=86400 seconds", args.claim_timeout);
    let (registry, runtime) = args.engine.registry()?;
    std::fs::create_dir_all(&args.engine.output_dir).map_err(|e| anyhow::anyhow!("creating the output folder {}: {e}", args.engine.output_dir.display()))?;
    let config = sdflow_server::scale_out::worker::WorkerConfig {
        queue_url: args.queue,
        name: args.name,
        output_dir: args.engine.output_dir,
        claim_timeout: Duration::from_secs_f64(args.claim_timeout),
        health: SocketAddr::new(args.health_listen, args.health_port),
        output_store: args.output_store,
    };
    sdflow_server::scale_out::worker::run(config, Arc::new(registry), runtime, |name, addr| {
        println!("sdflow worker {name} taking prompts; health on http://{addr}/health")
    })?;
    Ok(())
}
