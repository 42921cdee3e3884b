//! `sdflow`: run node-graph workflows of diffusion models from the command line.
//!
//! Each subcommand lives in its own module; this file only parses and dispatches, and is
//! the one place where errors become `anyhow` reports and exit codes.

use clap::{Parser, Subcommand};

mod demo;
mod run;

#[derive(Parser)]
#[command(name = "sdflow", version, about = "A node-graph engine for diffusion models")]
struct Cli {
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, global = true, default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workflow file (sdflow, ComfyUI API or ComfyUI UI format).
    Run(run::RunArgs),
    /// Generate an image with a tiny random-weight SD1 checkpoint (no download needed).
    Demo(demo::DemoArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log_level)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run(args) => run::run_command(args),
        Command::Demo(args) => demo::demo_command(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
