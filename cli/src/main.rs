//! `sdflow`: run node-graph workflows of diffusion models from the command line.
//!
//! Each subcommand lives in its own module; this file only parses and dispatches, and is
//! the one place where errors become `anyhow` reports and exit codes.

use clap::{Parser, Subcommand};

mod convert;
mod demo;
mod metadata;
mod presets;
mod run;
mod serve;
mod worker;

#[derive(Parser)]
#[command(name = "sdflow", version, about = "A node-graph engine for diffusion models")]
struct Cli {
    /// Log level: error, warn, info, debug, trace.
    // Checked here: tracing would take any other word as a target name and log nothing.
    /// Default: warn, and `serve` and `worker` also log each prompt's arrival and outcome (info).
    #[arg(long, global = true, ignore_case = true, value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workflow file (sdflow, ComfyUI API or ComfyUI UI format).
    Run(run::RunArgs),
    /// Generate an image with a tiny random-weight SD1 checkpoint (no download needed).
    Demo(demo::DemoArgs),
    /// sd-cli's img_gen mode (the default): txt2img, img2img (-i), inpainting (--mask),
    /// hires fix, LoRA tags, with sd-cli's flags.
    #[command(name = "img_gen", visible_alias = "txt2img", alias = "img2img")]
    ImgGen(Box<presets::ImgGenArgs>),
    /// sd-cli's upscale mode: an image through an upscale model.
    Upscale(presets::UpscaleArgs),
    /// Re-sample what a detector (--ad-model) finds in an image.
    Adetailer(presets::AdetailerArgs),
    /// sd-cli's vid_gen mode: a Wan text-to-video model's frames as .avi, .webp or
    /// numbered images (-o).
    #[command(name = "vid_gen")]
    VidGen(presets::VidGenArgs),
    /// sd-cli's convert mode: write a model as GGUF or safetensors with --type and
    /// --tensor-type-rules.
    Convert(convert::ConvertArgs),
    /// Print the metadata of a PNG, JPEG or WebP (prompt, workflow, parameters).
    Metadata(metadata::MetadataArgs),
    /// Serve ComfyUI's, A1111's and OpenAI's HTTP APIs and the browser editor (docs/server.md).
    Serve(serve::ServeArgs),
    /// Run the prompts that `serve --queue redis://…` front ends accept: one of many
    /// workers behind one API (docs/scale-out.md).
    Worker(worker::WorkerArgs),
}

/// sd-cli's spellings of a mode: `sdflow -M convert ...` is `sdflow convert ...`, and a
/// command line that starts with a flag other than sdflow's own is `img_gen`, sd-cli's
/// default mode.
fn sd_cli_argv(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("").to_string();
    let own = ["-h", "--help", "-V", "--version", "--log-level"];
    if !first.starts_with('-') || own.contains(&first.as_str()) || first.starts_with("--log-level=") {
        return args;
    }
    let mode_at = args.iter().position(|a| a == "-M" || a == "--mode");
    let mode = match mode_at {
        Some(i) if i + 1 < args.len() => {
            let m = args.remove(i + 1);
            args.remove(i);
            m
        }
        _ => "img_gen".into(),
    };
    args.insert(1, mode);
    args
}

/// sd-cli prints its usage after a bad argument; clap does for some errors only. The
/// usage shown is the subcommand's.
fn usage_error(e: clap::Error, argv: &[std::ffi::OsString]) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
        e.exit();
    }
    let rendered = e.render().to_string();
    eprint!("{rendered}");
    if !rendered.contains("Usage:") {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.build();
        let name = argv.get(1).and_then(|a| a.to_str()).unwrap_or("");
        let usage = match cmd.find_subcommand_mut(name) {
            Some(sub) => sub.render_usage(),
            None => cmd.render_usage(),
        };
        eprintln!("\n{usage}");
    }
    std::process::exit(2)
}

fn main() -> std::process::ExitCode {
    let argv = sd_cli_argv(std::env::args_os().collect());
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => usage_error(e, &argv),
    };
    // sd-cli's -v and --color, for the commands that take them.
    let (verbose, color) = match &cli.command {
        Command::ImgGen(a) => (a.common.verbose, a.common.color),
        Command::Upscale(a) => (a.common.verbose, a.common.color),
        Command::Adetailer(a) => (a.common.verbose, a.common.color),
        Command::Convert(a) => (a.verbose, true),
        _ => (false, true),
    };
    // Rust ignores SIGPIPE, so `sdflow … --print-workflow | head` would panic in
    // println!; like other command-line tools, end quietly instead. The server keeps
    // ignoring it: a client closing its socket must not end the process.
    #[cfg(unix)]
    if !matches!(cli.command, Command::Serve(_) | Command::Worker(_)) {
        // SAFETY: restores the default disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let level = match (&cli.log_level, &cli.command) {
        _ if verbose => "debug".to_string(),
        (Some(l), _) => l.to_ascii_lowercase(),
        // An operator watches the server's console: ComfyUI prints "got prompt" and
        // "Prompt executed in …" there.
        (None, Command::Serve(_) | Command::Worker(_)) => "warn,sdflow_server=info".to_string(),
        (None, _) => "warn".to_string(),
    };
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let console = tracing_subscriber::fmt::layer().with_ansi(color).with_writer(std::io::stderr);
        // The server's log panel (ComfyUI frontend's) shows what the console shows.
        let panel = matches!(cli.command, Command::Serve(_)).then(sdflow_server::logs::layer);
        tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(level))
            .with(console)
            .with(panel)
            .init();
    }
    let result = match cli.command {
        Command::Run(args) => run::run_command(args),
        Command::Demo(args) => demo::demo_command(args),
        Command::ImgGen(args) => presets::img_gen_command(*args),
        Command::Upscale(args) => presets::upscale_command(args),
        Command::Adetailer(args) => presets::adetailer_command(args),
        Command::VidGen(args) => presets::vid_gen_command(args),
        Command::Convert(args) => convert::convert_command(args),
        Command::Metadata(args) => metadata::metadata_command(args),
        Command::Serve(args) => serve::serve_command(args),
        Command::Worker(args) => worker::worker_command(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
