//! `sdflow demo`: the whole pipeline on a tiny random-weight SD1 checkpoint, with no
//! download — the README's first command.
//!
//! The checkpoint has the real SD1 architecture and key layout at toy widths, so every
//! node of the txt2img workflow (loader, CLIP, UNet sampling, VAE decode, PNG) runs for
//! real; with random weights the picture is noise.

use crate::run::{run_command, RunArgs};
use anyhow::Context;
use clap::Args;
use sdflow_core::dtype::DType;
use sdflow_core::synth::{ensure_checkpoint, Format, SdConfig};
use std::path::PathBuf;

const CHECKPOINT: &str = "demo-sd1-random.safetensors";

#[derive(Args)]
pub struct DemoArgs {
    /// Where the image goes.
    #[arg(long, value_name = "DIR", default_value = "sdflow-demo")]
    pub output_dir: PathBuf,
    /// The prompt (it steers nothing meaningful with random weights, but it is encoded).
    #[arg(short = 'p', long, default_value = "a lovely cat, (watercolor:1.2)")]
    pub prompt: String,
    /// Image side in pixels.
    #[arg(long, default_value_t = 256)]
    pub size: u32,
    #[arg(long, default_value_t = 20)]
    pub steps: u32,
    /// Compute threads; all cores by default.
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("sdflow/demo")
}

pub fn demo_command(args: DemoArgs) -> anyhow::Result<()> {
    if args.size < 64 || args.size > 2048 || args.size % 8 != 0 {
        anyhow::bail!("--size {} must be a multiple of 8 in 64..=2048", args.size);
    }
    let dir = cache_dir();
    let models = dir.join("models");
    let ckpts = models.join("checkpoints");
    std::fs::create_dir_all(&ckpts).with_context(|| format!("creating {}", ckpts.display()))?;
    let ckpt = ckpts.join(CHECKPOINT);
    // Rebuilt only when missing or made by another generator version or config.
    if ensure_checkpoint(&ckpt, &SdConfig::tiny_sd1_f8(), DType::F32, 42, Format::Safetensors).context("writing the demo checkpoint")? {
        eprintln!("built a tiny random-weight SD1 checkpoint at {}", ckpt.display());
    }
    let wf = dir.join("txt2img.json");
    // The committed txt2img workflow, built in so the demo runs from any directory.
    let txt2img = sdflow_workflows::bundled::find("txt2img").context("the txt2img workflow is not built in")?;
    std::fs::write(&wf, txt2img).with_context(|| format!("writing {}", wf.display()))?;
    let prompt = serde_json::to_string(&args.prompt)?;
    let set = vec![
        format!("1.ckpt_name={}", serde_json::to_string(CHECKPOINT)?),
        format!("2.text={prompt}"),
        format!("4.width={}", args.size),
        format!("4.height={}", args.size),
        format!("5.steps={}", args.steps),
        "7.filename_prefix=\"demo\"".to_string(),
    ];
    let before = std::time::SystemTime::now();
    run_command(RunArgs {
        workflows: vec![wf],
        repeat: 1,
        set,
        output_dir: Some(args.output_dir.clone()),
        json_events: false,
        workers: None,
        models_dir: models,
        threads: args.threads,
        input_dir: dir.join("input"),
        weight_type: Default::default(),
        placement: Default::default(),
    })?;
    let newest = std::fs::read_dir(&args.output_dir)?
        .flatten()
        .filter(|e| e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t >= before))
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .max();
    match newest {
        Some(p) => {
            let p = std::fs::canonicalize(&p).unwrap_or(p);
            println!("\nwrote {}", p.display());
            println!("(the weights are random, so the image is noise; run a real checkpoint with `sdflow run workflows/txt2img.json --models-dir DIR`)");
        }
        None => anyhow::bail!("the workflow ran but wrote no image into {}", args.output_dir.display()),
    }
    Ok(())
}
