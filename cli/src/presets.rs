//! The sd-cli presets: `sdflow img_gen` (alias `txt2img`), `upscale`, `adetailer` and
//! `vid_gen`, with sd-cli's flag names and defaults. Each builds a workflow with
//! `sdflow_workflows::presets` and runs it through `run::execute`, then moves the images
//! to where `-o` says, as sd-cli names them.
//!
//! sd-cli takes file paths (`-m path/to/model.safetensors`); the node graph takes names
//! inside a models folder. The two meet in a staging folder: every file a flag names is
//! linked into it under its kind (`checkpoints/`, `loras/`, ...) and the workflow uses
//! the link's name. A value that is not a path is looked up in `--models-dir` as
//! `sdflow run` would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use sdflow_executor::Workflow;
use sdflow_workflows::presets::{self, AdetailerParams, ChromaParams, Family, HiresParams, ImgGenParams, ModelInfo, Preset, SlgParams, TilingParams, UpscaleParams, SD_SAMPLERS, SD_SCHEDULERS};

use crate::run;


/// sd-cli flags that map to nothing in sdflow yet: accepted by the parser (so they are not
/// "unknown"), refused when given.
const REFUSED: &[(&str, bool, &str)] = &[
    ("clip_vision", true, "the models that take --clip_vision (Wan image-to-video, unCLIP) are not implemented; IP-Adapter's image encoder is a workflow node (CLIPVisionLoader)"),
    ("llm", true, "LLM text encoders (Qwen-Image, FLUX.2, Z-Image) are not implemented"),
    ("llm_vision", true, "LLM vision encoders are not implemented"),
    ("qwen2vl", true, "LLM text encoders (Qwen-Image) are not implemented"),
    ("qwen2vl_vision", true, "LLM vision encoders are not implemented"),
    ("high-noise-diffusion-model", true, "Wan2.2 MoE models are not implemented"),
    ("force-sdxl-vae-conv-scale", false, "sdflow's VAE convolutions run in f32 or bf16 with f32 sums, where the fp16 overflow this works around does not arise"),
    ("offload-to-cpu", false, "weights are placed by sdflow's residency manager; no per-flag placement yet"),
    ("mmap", false, "model files are always memory-mapped when the format allows"),
    ("control-net-cpu", false, "no per-model device placement yet"),
    ("clip-on-cpu", false, "no per-model device placement yet"),
    ("vae-on-cpu", false, "no per-model device placement yet"),
    ("max-vram", true, "no VRAM budget yet"),
    ("fa", false, "the attention kernel is not selectable yet"),
    ("diffusion-fa", false, "the attention kernel is not selectable yet"),
    ("diffusion-conv-direct", false, "the convolution kernel is not selectable yet"),
    ("vae-conv-direct", false, "the convolution kernel is not selectable yet"),
    ("circular", false, "circular padding is not implemented"),
    ("circularx", false, "circular padding is not implemented"),
    ("circulary", false, "circular padding is not implemented"),
    ("end-img", true, "video generation is not implemented"),
    ("control-video", true, "video generation is not implemented"),
    ("video-frames", true, "video generation is not implemented"),
    ("fps", true, "video generation is not implemented"),
    ("high-noise-steps", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-cfg-scale", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-img-cfg-scale", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-guidance", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-slg-scale", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-skip-layer-start", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-skip-layer-end", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-eta", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-sampling-method", true, "Wan2.2 MoE models are not implemented"),
    ("high-noise-skip-layers", true, "Wan2.2 MoE models are not implemented"),
    ("moe-boundary", true, "Wan2.2 MoE models are not implemented"),
    ("vace-strength", true, "Wan VACE is not implemented"),
    ("timestep-shift", true, "NitroFusion timestep shifting is not implemented"),
    ("cache-mode", true, "step caching (easycache, ucache, cache-dit) is not implemented"),
    ("cache-option", true, "step caching is not implemented"),
    ("cache-preset", true, "step caching is not implemented"),
    ("scm-mask", true, "step caching is not implemented"),
    ("scm-policy", true, "step caching is not implemented"),
    ("convert-name", false, "only `sdflow convert` converts, and it keeps tensor names"),
];

/// The refused flags a command line gave, in table order.
#[derive(Debug, Clone, Default)]
pub struct Refused {
    given: Vec<(String, &'static str)>,
}

impl Refused {
    fn check(&self) -> anyhow::Result<()> {
        if self.given.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = self.given.iter().map(|(f, r)| format!("not supported yet: {f} ({r})")).collect();
        bail!("{}", lines.join("\nerror: "))
    }
}

impl FromArgMatches for Refused {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut r = Refused::default();
        r.update_from_arg_matches(m)?;
        Ok(r)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for &(long, takes_value, reason) in REFUSED {
            if m.value_source(long) == Some(ValueSource::CommandLine) {
                let shown = if takes_value { format!("--{long} {}", m.get_one::<String>(long).map_or("", |s| s.as_str())) } else { format!("--{long}") };
                self.given.push((shown, reason));
            }
        }
        Ok(())
    }
}

impl Args for Refused {
    fn augment_args(mut cmd: Command) -> Command {
        for &(long, takes_value, reason) in REFUSED {
            let a = Arg::new(long).long(long).help(format!("not supported yet: {reason}")).help_heading("Not supported yet (refused when given)");
            let a = if takes_value { a.action(ArgAction::Set).value_name("VALUE").allow_hyphen_values(true) } else { a.action(ArgAction::SetTrue) };
            cmd = cmd.arg(a);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// Flags every preset command takes.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Print the workflow JSON instead of running it.
    #[arg(long)]
    pub print_workflow: bool,
    /// Write the workflow JSON to FILE (and run it, unless --print-workflow).
    #[arg(long, value_name = "FILE")]
    pub save_workflow: Option<PathBuf>,
    /// Folder where model flags that are names, not paths, are looked up (`checkpoints/`,
    /// `vae/`, `loras/`, ... inside it, or the files themselves).
    #[arg(long, value_name = "DIR", default_value = "models")]
    pub models_dir: PathBuf,
    /// Number of threads to use during computation. If threads <= 0, then
    /// threads will be set to the number of CPU physical cores.
    #[arg(short = 't', long, value_name = "int", default_value_t = -1, allow_negative_numbers = true)]
    pub threads: i64,
    /// Print extra info (debug logging).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Colors the logging tags according to level.
    #[arg(long)]
    pub color: bool,
    #[command(flatten)]
    pub weight_type: run::WeightTypeArg,
    /// Print every event as one JSON line on stdout.
    #[arg(long)]
    pub json_events: bool,
    /// Preview method while sampling: `proj` (the latent→RGB projection), `tae` (the
    /// --taesd decoder) or `none`; `vae` (a full decode per step) is refused.
    #[arg(long, value_name = "METHOD", value_parser = ["none", "proj", "tae", "vae"])]
    pub preview: Option<String>,
    /// Path to write preview image to (PNG, or JPEG for a .jpg path).
    #[arg(long, value_name = "string", default_value = "./preview.png")]
    pub preview_path: PathBuf,
    /// Interval in denoising steps between consecutive updates of the image preview.
    #[arg(long, value_name = "int", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub preview_interval: u32,
    /// Preview the noisy latents of the sampler rather than its denoised estimates.
    #[arg(long)]
    pub preview_noisy: bool,
}

impl CommonArgs {
    /// The runtime's preview method for `--preview` (none unless asked: nothing shows the
    /// previews of a preset run but the preview file).
    fn preview_method(&self) -> sdflow_nodes::sampling::preview::PreviewMethod {
        use sdflow_nodes::sampling::preview::PreviewMethod;
        match self.preview.as_deref() {
            Some("proj") => PreviewMethod::Latent2Rgb,
            Some("tae") => PreviewMethod::Taesd,
            _ => PreviewMethod::None,
        }
    }

    fn preview_file(&self) -> Option<run::PreviewFile> {
        (self.preview_method() != sdflow_nodes::sampling::preview::PreviewMethod::None).then(|| run::PreviewFile { path: self.preview_path.clone(), interval: self.preview_interval })
    }
}

/// A sampler name: sd.cpp's (every sampler sdflow has) or ComfyUI's.
fn sampler_parser() -> clap::builder::PossibleValuesParser {
    let mut names: Vec<&'static str> = SD_SAMPLERS.to_vec();
    names.extend(sdflow_core::sampling::Sampler::ALL.iter().map(|s| s.name()).filter(|n| !SD_SAMPLERS.contains(n)));
    names.extend(["euler_ancestral", "dpm_2", "dpmpp_2s_ancestral", "dpmpp_2m", "ddim", "dpmpp_2m_sde", "euler_ancestral_cfg_pp", "gradient_estimation"]);
    clap::builder::PossibleValuesParser::new(names)
}

fn scheduler_parser() -> clap::builder::PossibleValuesParser {
    let mut names: Vec<&'static str> = SD_SCHEDULERS.to_vec();
    names.extend(["flux", "normal", "beta", "ddim_uniform"]);
    clap::builder::PossibleValuesParser::new(names)
}

fn parse_rel_tile_size(s: &str) -> Result<(f32, f32), String> {
    sdflow_core::models::vae::tiling::VaeTiling::parse_rel_size(s).map_err(|e| e.to_string())
}

fn parse_tile_size(s: &str) -> Result<(i64, i64), String> {
    let bad = || format!("`{s}` is not of the form [X]x[Y]");
    match s.split_once('x') {
        Some((x, y)) => Ok((x.trim().parse().map_err(|_| bad())?, y.trim().parse().map_err(|_| bad())?)),
        None => {
            let v: i64 = s.trim().parse().map_err(|_| bad())?;
            Ok((v, v))
        }
    }
}

/// A parsed `--sigmas` / `--hires-sigmas` list (a newtype: clap reads `Option<Vec<_>>`
/// as a repeated flag).
#[derive(Debug, Clone, PartialEq)]
pub struct SigmaList(pub Vec<f32>);

fn parse_sigma_list(s: &str) -> Result<SigmaList, String> {
    sdflow_core::sampling::parse_sigmas(s).map(SigmaList).map_err(|e| e.to_string())
}

/// Flags shared by `img_gen` and `adetailer`: the prompt and the sampler.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// The prompt to render.
    #[arg(short = 'p', long, value_name = "string", default_value = "", allow_hyphen_values = true)]
    pub prompt: String,
    /// The negative prompt.
    #[arg(short = 'n', long, value_name = "string", default_value = "", allow_hyphen_values = true)]
    pub negative_prompt: String,
    /// Number of sample steps.
    #[arg(long, value_name = "int", default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=10000))]
    pub steps: i64,
    /// Unconditional guidance scale.
    #[arg(long, value_name = "float", default_value_t = 7.0)]
    pub cfg_scale: f64,
    /// Sampling method (default: euler_a); sd.cpp's names or ComfyUI's.
    #[arg(long, value_name = "METHOD", value_parser = sampler_parser())]
    pub sampling_method: Option<String>,
    /// Denoiser sigma scheduler (default: discrete, ComfyUI's `normal`).
    #[arg(long, value_name = "SCHEDULER", value_parser = scheduler_parser())]
    pub scheduler: Option<String>,
    /// RNG seed.
    #[arg(short = 's', long, value_name = "int", default_value_t = 42, allow_negative_numbers = true)]
    pub seed: i64,
    /// RNG, as sd-cli's: `cuda` (torch's CUDA Philox), `cpu` (torch's CPU generator with
    /// its portable kernel), `std_default` (C++'s default engine); the noise is bit for
    /// bit sd-cli's. Without it the noise is ComfyUI's (torch's CPU generator as x86
    /// torch draws it).
    #[arg(long, value_name = "RNG", value_parser = ["std_default", "cuda", "cpu"])]
    pub rng: Option<String>,
    /// Sampler RNG: the same generator as --rng (one draws the initial and every step's
    /// noise); a different one is refused.
    #[arg(long, value_name = "RNG", value_parser = ["std_default", "cuda", "cpu"])]
    pub sampler_rng: Option<String>,
    /// Custom sigma values for the sampler, comma-separated (e.g. "14.61,7.8,3.5,0.0"):
    /// the schedule instead of --steps and --scheduler; with -i cut to --strength.
    #[arg(long, value_name = "SIGMAS", value_parser = parse_sigma_list, allow_hyphen_values = true)]
    pub sigmas: Option<SigmaList>,
    /// Prediction type override (default: what the checkpoint says): eps, v, edm_v;
    /// the flow types are refused.
    #[arg(long, value_name = "string", value_parser = ["eps", "v", "edm_v", "sd3_flow", "flux_flow", "flux2_flow"])]
    pub prediction: Option<String>,
    /// Eta of the ancestral/SDE samplers and of ddim_trailing, tcd, res_multistep,
    /// res_2s (default: each sampler's own, 1 for euler_a, dpm++2s_a, er_sde,
    /// euler_a_cfg_pp, 0 for the others).
    #[arg(long, value_name = "float", allow_negative_numbers = true)]
    pub eta: Option<f64>,
    /// Path to write result image to; printf-style %d patterns for image sequences
    /// (eg. output_%03d.png).
    #[arg(short = 'o', long, value_name = "string", default_value = "./output.png")]
    pub output: String,
    /// Starting index for the output image sequence (default 0 with %d in the output
    /// path, 1 otherwise).
    #[arg(long, value_name = "int", allow_negative_numbers = true)]
    pub output_begin_idx: Option<i64>,
}

impl SamplingArgs {
    /// The KSampler `rng` for `--rng`: sd-cli's `cpu` is torch's portable CPU kernel, which
    /// the node calls `cpu_portable` (its `cpu` is x86 torch's, as ComfyUI draws).
    fn node_rng(&self) -> Option<String> {
        self.rng.as_deref().map(|r| if r == "cpu" { "cpu_portable" } else { r }.to_string())
    }

    fn refusals(&self) -> anyhow::Result<()> {
        if let Some(s) = &self.sampler_rng {
            if self.rng.as_ref() != Some(s) {
                let rng = self.rng.as_deref().unwrap_or("the default");
                bail!("not supported yet: --sampler-rng {s} with --rng {rng} (one generator draws the initial and every step's noise; give both the same)");
            }
        }
        Ok(())
    }
}

/// `sdflow img_gen`: sd-cli's default mode.
#[derive(Args, Debug, Clone)]
pub struct ImgGenArgs {
    /// Path to full model.
    #[arg(short = 'm', long, value_name = "string")]
    pub model: Option<String>,
    /// Path to the standalone diffusion model.
    #[arg(long, value_name = "string")]
    pub diffusion_model: Option<String>,
    /// Path to the clip-l text encoder.
    #[arg(long = "clip_l", value_name = "string")]
    pub clip_l: Option<String>,
    /// Path to the clip-g text encoder.
    #[arg(long = "clip_g", value_name = "string")]
    pub clip_g: Option<String>,
    /// Path to standalone vae model.
    #[arg(long, value_name = "string")]
    pub vae: Option<String>,
    /// Path to taesd. Using Tiny AutoEncoder for fast decoding (low quality).
    #[arg(long, alias = "tae", value_name = "string")]
    pub taesd: Option<String>,
    /// Use --taesd only for the previews (--preview tae); the final image is decoded with
    /// the VAE.
    #[arg(long)]
    pub taesd_preview_only: bool,
    /// Path to control net model.
    #[arg(long, value_name = "string")]
    pub control_net: Option<String>,
    /// Path to control image, control net.
    #[arg(long, value_name = "string")]
    pub control_image: Option<String>,
    /// Strength to apply Control Net.
    #[arg(long, value_name = "float", default_value_t = 0.9)]
    pub control_strength: f64,
    /// Apply canny preprocessor (edge detection).
    #[arg(long)]
    pub canny: bool,
    /// Path to PhotoMaker model.
    #[arg(long = "photo-maker", value_name = "string")]
    pub photo_maker: Option<String>,
    /// Path to PhotoMaker input id images dir.
    #[arg(long = "pm-id-images-dir", value_name = "string")]
    pub pm_id_images_dir: Option<String>,
    /// Path to PhotoMaker v2 id embed.
    #[arg(long = "pm-id-embed-path", value_name = "string")]
    pub pm_id_embed_path: Option<String>,
    /// Strength for keeping PhotoMaker input identity.
    #[arg(long = "pm-style-strength", value_name = "float", default_value_t = 20.0)]
    pub pm_style_strength: f64,
    /// Path to esrgan model.
    #[arg(long, value_name = "string")]
    pub upscale_model: Option<String>,
    /// Run the ESRGAN upscaler this many times.
    #[arg(long, value_name = "int", default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=16))]
    pub upscale_repeats: i64,
    /// Tile size for ESRGAN upscaling.
    #[arg(long, value_name = "int", default_value_t = 128)]
    pub upscale_tile_size: i64,
    /// Image guidance scale for instruct-pix2pix models (with -i).
    #[arg(long, value_name = "float")]
    pub img_cfg_scale: Option<f64>,
    /// Embeddings directory.
    #[arg(long, value_name = "string")]
    pub embd_dir: Option<PathBuf>,
    /// Lora model directory (for `<lora:name:weight>` prompt tags).
    #[arg(long, value_name = "string", default_value = ".")]
    pub lora_model_dir: PathBuf,
    /// How LoRAs are applied: immediately (merged into the weights), at_runtime (low-rank
    /// branches in the graph, the weights untouched) or auto (at_runtime for quantized
    /// weights, else immediately).
    #[arg(long, value_name = "MODE", value_parser = ["auto", "immediately", "at_runtime"])]
    pub lora_apply_mode: Option<String>,
    /// Weight type per tensor pattern (refused here: only --type applies at load; see
    /// `sdflow convert`).
    #[arg(long, value_name = "string")]
    pub tensor_type_rules: Option<String>,
    /// Path to the init image (img2img).
    #[arg(short = 'i', long, value_name = "string")]
    pub init_img: Option<String>,
    /// Path to the mask image (inpainting).
    #[arg(long, value_name = "string")]
    pub mask: Option<String>,
    /// Image height, in pixel space (default: 512).
    #[arg(short = 'H', long, value_name = "int", value_parser = clap::value_parser!(i64).range(16..=16384))]
    pub height: Option<i64>,
    /// Image width, in pixel space (default: 512).
    #[arg(short = 'W', long, value_name = "int", value_parser = clap::value_parser!(i64).range(16..=16384))]
    pub width: Option<i64>,
    /// Batch count.
    #[arg(short = 'b', long, value_name = "int", default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=4096))]
    pub batch_count: i64,
    /// Strength for noising/unnoising (default: 0.75).
    #[arg(long, value_name = "float")]
    pub strength: Option<f64>,
    /// Ignore last layers of CLIP network; 1 ignores none, 2 ignores one layer; <= 0:
    /// the model's own.
    #[arg(long, value_name = "int", default_value_t = -1, allow_negative_numbers = true)]
    pub clip_skip: i64,
    /// Process vae in tiles to reduce memory usage.
    #[arg(long)]
    pub vae_tiling: bool,
    /// Tile size for vae tiling, format [X]x[Y].
    #[arg(long, value_name = "XxY", value_parser = parse_tile_size, default_value = "32x32")]
    pub vae_tile_size: (i64, i64),
    /// Tile overlap for vae tiling, in fraction of tile size.
    #[arg(long, value_name = "float", default_value_t = 0.5)]
    pub vae_tile_overlap: f64,
    /// Relative tile size for vae tiling, [X]x[Y]: per axis a fraction of the latent side
    /// (<= 1) or a number of tiles (> 1); overrides --vae-tile-size.
    #[arg(long, value_name = "[X]x[Y]", value_parser = parse_rel_tile_size)]
    pub vae_relative_tile_size: Option<(f32, f32)>,
    /// Enable the highres fix (a second pass at a larger size).
    #[arg(long)]
    pub hires: bool,
    /// Highres fix upscaler: Latent, Latent (bicubic), Latent (nearest-exact), Nearest,
    /// Lanczos, or a model name under --hires-upscalers-dir.
    #[arg(long, value_name = "string", default_value = "Latent")]
    pub hires_upscaler: String,
    /// Directory of upscale models for --hires-upscaler.
    #[arg(long, value_name = "string")]
    pub hires_upscalers_dir: Option<PathBuf>,
    /// Highres fix scale.
    #[arg(long, value_name = "float", default_value_t = 2.0)]
    pub hires_scale: f64,
    /// Highres fix target width.
    #[arg(long, value_name = "int", default_value_t = 0)]
    pub hires_width: i64,
    /// Highres fix target height.
    #[arg(long, value_name = "int", default_value_t = 0)]
    pub hires_height: i64,
    /// Highres fix steps.
    #[arg(long, value_name = "int", default_value_t = 0)]
    pub hires_steps: i64,
    /// Highres fix denoising strength.
    #[arg(long, value_name = "float", default_value_t = 0.7)]
    pub hires_denoising_strength: f64,
    /// Tile size for a model --hires-upscaler.
    #[arg(long, value_name = "int", default_value_t = 128)]
    pub hires_upscale_tile_size: i64,
    /// Custom sigma values for the highres pass, comma-separated: its whole schedule,
    /// not cut to --hires-denoising-strength (the first sigma is the noise added).
    #[arg(long, value_name = "SIGMAS", value_parser = parse_sigma_list, allow_hyphen_values = true)]
    pub hires_sigmas: Option<SigmaList>,
    /// Detector model for ADetailer (re-samples what it finds after generation).
    #[arg(long, value_name = "string")]
    pub ad_model: Option<String>,
    /// Extra detailer node inputs, `input=value,...`.
    #[arg(long, value_name = "string")]
    pub extra_ad_args: Option<String>,
    /// ADetailer prompt ([PROMPT] inserts the main prompt, [SEP] separates masks, [SKIP] skips one; empty: the main prompt).
    #[arg(long, value_name = "string", default_value = "")]
    pub ad_prompt: String,
    /// ADetailer negative prompt (empty: the main negative prompt).
    #[arg(long, value_name = "string", default_value = "")]
    pub ad_negative_prompt: String,
    /// Path to the t5xxl text encoder (FLUX, SD3, Chroma).
    #[arg(long = "t5xxl", value_name = "string")]
    pub t5xxl: Option<String>,
    /// Distilled guidance scale for models with guidance input (FLUX.1-dev).
    #[arg(long, value_name = "float", default_value_t = 3.5, allow_negative_numbers = true)]
    pub guidance: f64,
    /// Shift of the flow models' sigmas (SD3: default 3; FLUX takes its shift from the
    /// image size, as sd-cli).
    #[arg(long, value_name = "float", allow_negative_numbers = true)]
    pub flow_shift: Option<f64>,
    /// Skip layer guidance (SLG) scale, for DiT models (0 = disabled; 2.5 is good for
    /// SD3.5 medium).
    #[arg(long, value_name = "float", default_value_t = 0.0)]
    pub slg_scale: f64,
    /// Layers to skip for SLG steps (default: [7,8,9]).
    #[arg(long, value_name = "integer_list", default_value = "[7,8,9]")]
    pub skip_layers: String,
    /// SLG enabling point.
    #[arg(long, value_name = "float", default_value_t = 0.01)]
    pub skip_layer_start: f64,
    /// SLG disabling point.
    #[arg(long, value_name = "float", default_value_t = 0.2)]
    pub skip_layer_end: f64,
    /// Reference image for FLUX Kontext models (can be used multiple times).
    #[arg(short = 'r', long = "ref-image", value_name = "string")]
    pub ref_image: Vec<String>,
    /// Automatically increase the index of each reference image.
    #[arg(long)]
    pub increase_ref_index: bool,
    /// Disable the auto resize of reference images.
    #[arg(long)]
    pub disable_auto_resize_ref_image: bool,
    /// Model-specific options, `key=value,...`: chroma_use_dit_mask, chroma_use_t5_mask,
    /// chroma_t5_mask_pad.
    #[arg(long, value_name = "string")]
    pub model_args: Option<String>,
    /// Reference image options, `key=value,...`: ref_index_mode (fixed, increase),
    /// resize_before_vae.
    #[arg(long, value_name = "string")]
    pub ref_image_args: Option<String>,
    /// Disable the DiT mask for Chroma (sd-cli's older spelling of --model-args
    /// chroma_use_dit_mask=false).
    #[arg(long)]
    pub chroma_disable_dit_mask: bool,
    /// Enable the T5 mask for Chroma.
    #[arg(long)]
    pub chroma_enable_t5_mask: bool,
    /// T5 mask pad size of Chroma.
    #[arg(long, value_name = "int", default_value_t = 1, allow_negative_numbers = true)]
    pub chroma_t5_mask_pad: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub refused: Refused,
}

/// `sdflow upscale`: sd-cli's upscale mode.
#[derive(Args, Debug, Clone)]
pub struct UpscaleArgs {
    /// Path to the image to upscale.
    #[arg(short = 'i', long, value_name = "string")]
    pub init_img: String,
    /// Path to esrgan model.
    #[arg(long, value_name = "string")]
    pub upscale_model: String,
    /// Run the ESRGAN upscaler this many times.
    #[arg(long, value_name = "int", default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=16))]
    pub upscale_repeats: i64,
    /// Tile size for ESRGAN upscaling.
    #[arg(long, value_name = "int", default_value_t = 128)]
    pub upscale_tile_size: i64,
    /// Path to write result image to.
    #[arg(short = 'o', long, value_name = "string", default_value = "./output.png")]
    pub output: String,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub refused: Refused,
}

/// `sdflow adetailer`: re-sample what a detector finds in an existing image.
#[derive(Args, Debug, Clone)]
pub struct AdetailerArgs {
    /// Path to full model.
    #[arg(short = 'm', long, value_name = "string")]
    pub model: String,
    /// Path to the image to refine.
    #[arg(short = 'i', long, value_name = "string")]
    pub init_img: String,
    /// Detector model (e.g. face_yolov8n.pt).
    #[arg(long, value_name = "string")]
    pub ad_model: String,
    /// Extra detailer node inputs, `input=value,...`.
    #[arg(long, value_name = "string")]
    pub extra_ad_args: Option<String>,
    /// ADetailer prompt ([PROMPT] inserts the main prompt, [SEP] separates masks, [SKIP] skips one; empty: the main prompt).
    #[arg(long, value_name = "string", default_value = "")]
    pub ad_prompt: String,
    /// ADetailer negative prompt (empty: the main negative prompt).
    #[arg(long, value_name = "string", default_value = "")]
    pub ad_negative_prompt: String,
    /// Resize the input to this height first (the detail pass works at the image's size).
    #[arg(short = 'H', long, value_name = "int", value_parser = clap::value_parser!(i64).range(16..=16384))]
    pub height: Option<i64>,
    /// Resize the input to this width first.
    #[arg(short = 'W', long, value_name = "int", value_parser = clap::value_parser!(i64).range(16..=16384))]
    pub width: Option<i64>,
    /// Denoising strength of the re-sampled regions.
    #[arg(long, value_name = "float", default_value_t = 0.4)]
    pub strength: f64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub refused: Refused,
}

/// `sdflow vid_gen`: refused; the arguments are taken so the refusal comes first.
#[derive(Args, Debug, Clone)]
pub struct VidGenArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub rest: Vec<String>,
}

/// Model and image files linked into one folder the runtime reads, so paths work where
/// the graph takes names.
struct Stage {
    dir: tempfile::TempDir,
    models_dir: PathBuf,
    /// (kind, staged name) -> the real file, to spot two different files of one name.
    linked: BTreeMap<(String, String), PathBuf>,
}

impl Stage {
    fn new(models_dir: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("sdflow-stage-").tempdir().context("creating a staging folder")?;
        std::fs::create_dir_all(dir.path().join("input"))?;
        Ok(Stage { dir, models_dir: models_dir.to_path_buf(), linked: BTreeMap::new() })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn input_dir(&self) -> PathBuf {
        self.dir.path().join("input")
    }

    /// Links `real` into `kind/` and returns its name there.
    fn link(&mut self, kind: &str, real: &Path) -> anyhow::Result<String> {
        self.link_named(kind, real, None)
    }

    /// Links `real` into `kind/` as `name` (default: its own file name), or as
    /// `2_name`, ... when another file already has that name.
    fn link_named(&mut self, kind: &str, real: &Path, name: Option<String>) -> anyhow::Result<String> {
        let real = real.canonicalize().with_context(|| format!("{}", real.display()))?;
        let base = name.unwrap_or_else(|| real.file_name().map_or_else(|| "file".to_string(), |n| n.to_string_lossy().into_owned()));
        let mut name = base.clone();
        let mut i = 1;
        while let Some(existing) = self.linked.get(&(kind.to_string(), name.clone())) {
            if *existing == real {
                return Ok(name);
            }
            i += 1;
            name = format!("{i}_{base}");
        }
        let dir = self.dir.path().join(kind);
        std::fs::create_dir_all(&dir)?;
        link_file(&real, &dir.join(&name)).with_context(|| format!("linking {} into the staging folder", real.display()))?;
        self.linked.insert((kind.to_string(), name.clone()), real);
        Ok(name)
    }

    /// The staged name of the model file a flag names: a path, or a name in
    /// `--models-dir` (under `kind/` or at the top).
    fn model(&mut self, kind: &str, flag: &str, value: &str) -> anyhow::Result<String> {
        let candidates = [PathBuf::from(value), self.models_dir.join(kind).join(value), self.models_dir.join(value)];
        match candidates.iter().find(|p| p.exists()) {
            Some(p) => self.link(kind, &p.clone()),
            None => bail!("{flag} {value}: no such file (nor in {})", self.models_dir.join(kind).display()),
        }
    }

    /// `--taesd FILE`: linked as `vae_approx/NAME.EXT`, where VAELoader's entry `name`
    /// (`taesd`, `taesdxl`, `taesd3`, `taef1`: the model's family's) finds it.
    fn taesd(&mut self, value: &str, name: &str) -> anyhow::Result<String> {
        let p = PathBuf::from(value);
        let real = if p.is_file() { p } else { self.models_dir.join("vae_approx").join(value) };
        if !real.is_file() {
            bail!("--taesd {value}: no such file (nor in {})", self.models_dir.join("vae_approx").display());
        }
        let ext = real.extension().and_then(|e| e.to_str()).unwrap_or("safetensors").to_string();
        self.link_named("vae_approx", &real, Some(format!("{name}.{ext}")))?;
        Ok(name.into())
    }

    fn image(&mut self, flag: &str, value: &str) -> anyhow::Result<String> {
        let p = PathBuf::from(value);
        if !p.is_file() {
            bail!("{flag} {value}: no such file");
        }
        self.link("input", &p)
    }

    /// A LoRA tag's file in `dir`: `NAME` with one of sd.cpp's extensions.
    fn lora(&mut self, dir: &Path, name: &str) -> anyhow::Result<String> {
        match find_lora(dir, name) {
            Some(p) => self.link("loras", &p),
            None => bail!("<lora:{name}:...>: no {name}.safetensors/.ckpt/.pt/.gguf in --lora-model-dir {}", dir.display()),
        }
    }

    fn embeddings(&mut self, dir: &Path) -> anyhow::Result<()> {
        if !dir.is_dir() {
            bail!("--embd-dir {}: not a directory", dir.display());
        }
        link_file(&dir.canonicalize()?, &self.dir.path().join("embeddings")).context("linking the embeddings folder")
    }
}

fn find_lora(dir: &Path, name: &str) -> Option<PathBuf> {
    ["", ".safetensors", ".ckpt", ".pt", ".gguf", ".bin"].iter().map(|ext| dir.join(format!("{name}{ext}"))).find(|p| p.is_file())
}

#[cfg(unix)]
fn link_file(real: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(real, at)
}

#[cfg(not(unix))]
fn link_file(real: &Path, at: &Path) -> std::io::Result<()> {
    if real.is_dir() {
        return Err(std::io::Error::other("linking folders needs a Unix system"));
    }
    std::fs::hard_link(real, at).or_else(|_| std::fs::copy(real, at).map(|_| ()))
}

/// The name a flag's value has in a printed workflow: a path's file name, else the value.
fn shown_name(value: &str) -> String {
    Path::new(value).file_name().map_or_else(|| value.to_string(), |n| n.to_string_lossy().into_owned())
}

/// How a command resolves the files its flags name.
enum Names<'a> {
    /// For printing: file names only, nothing checked.
    Shown,
    Staged(&'a mut Stage),
}

impl Names<'_> {
    fn model(&mut self, kind: &str, flag: &str, v: &Option<String>) -> anyhow::Result<Option<String>> {
        match (self, v) {
            (_, None) => Ok(None),
            (Names::Shown, Some(v)) => Ok(Some(shown_name(v))),
            (Names::Staged(s), Some(v)) => s.model(kind, flag, v).map(Some),
        }
    }

    /// A folder the graph reads from the input folder (PhotoMaker's ID images).
    fn folder(&mut self, flag: &str, v: &Option<String>) -> anyhow::Result<Option<String>> {
        match (self, v) {
            (_, None) => Ok(None),
            (Names::Shown, Some(v)) => Ok(Some(shown_name(v.trim_end_matches('/')))),
            (Names::Staged(s), Some(v)) => {
                let p = PathBuf::from(v);
                if !p.is_dir() {
                    bail!("{flag} {v}: no such folder");
                }
                s.link("input", &p).map(Some)
            }
        }
    }

    fn image(&mut self, flag: &str, v: &Option<String>) -> anyhow::Result<Option<String>> {
        match (self, v) {
            (_, None) => Ok(None),
            (Names::Shown, Some(v)) => Ok(Some(shown_name(v))),
            (Names::Staged(s), Some(v)) => s.image(flag, v).map(Some),
        }
    }
}

/// The refusals and validity checks that need no files: done before anything is staged.
fn check_output(output: &str) -> anyhow::Result<()> {
    let ext = Path::new(output).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if ext.as_deref() != Some("png") {
        bail!("not supported yet: -o {output} (SaveImage writes PNG; give the output a .png name)");
    }
    Ok(())
}

/// Whether sd-cli zeroes the unconditional embeddings of the model at `path` when the
/// negative prompt is empty: SDXL models, except EDM-v ones (CosXL). A file that cannot
/// be read is left to the loader to report.
fn zeroes_empty_negative(path: &str) -> bool {
    let Ok(src) = sdflow_core::io::open(Path::new(path)) else { return false };
    let det = sdflow_core::detect::detect_source(src.as_ref());
    det.family == sdflow_core::detect::ModelFamily::Sdxl && !src.tensors().iter().any(|t| t.name == sdflow_core::detect::EDM_VPRED_KEYS.1)
}

/// What the diffusion model file holds (`--diffusion-model`, else `-m`), for the family's
/// graph builder. A file that cannot be read is left to the loaders to report; without
/// one, `--t5xxl` with `--clip_g` means SD3, with `--clip_l` FLUX, alone Chroma.
fn model_info(a: &ImgGenArgs) -> ModelInfo {
    let guess = || match (&a.t5xxl, &a.clip_l, &a.clip_g) {
        (None, _, _) => Family::Unet,
        (Some(_), _, Some(_)) => Family::Sd3,
        (Some(_), Some(_), None) => Family::Flux { fill: false, guidance: true },
        (Some(_), None, None) => Family::Chroma,
    };
    let found = |v: &Option<String>, kind: &str| v.as_ref().map(|v| [PathBuf::from(v), a.common.models_dir.join(kind).join(v), a.common.models_dir.join(v)].into_iter().find(|p| p.exists()).unwrap_or_else(|| PathBuf::from(v)));
    let (model, diffusion) = (found(&a.model, "checkpoints"), found(&a.diffusion_model, "diffusion_models"));
    ModelInfo::detect(model.as_deref(), diffusion.as_deref()).unwrap_or(ModelInfo { family: guess(), has_text_encoders: true, has_vae: true, double_blocks: None })
}

/// The tiny autoencoder entry for the model's latents (`taesd` when the file cannot be read).
fn tae_name(a: &ImgGenArgs) -> &'static str {
    use sdflow_nodes::loaders::taesd::TaeKind;
    let file = a.diffusion_model.as_deref().or(a.model.as_deref());
    let family = file.and_then(|f| sdflow_core::io::open(Path::new(f)).ok()).map(|src| sdflow_core::detect::detect_source(src.as_ref()).family);
    family.and_then(TaeKind::for_family).unwrap_or(TaeKind::Sd).name()
}

/// An image file's width and height ((0, 0) when it cannot be read: the loader reports it).
fn image_size(path: &str) -> (i64, i64) {
    image::image_dimensions(path).map_or((0, 0), |(w, h)| (w as i64, h as i64))
}

/// sd-cli's `key=value` lists (`,` or `;` between pairs).
fn key_values<'a>(flag: &str, s: &'a str) -> anyhow::Result<Vec<(&'a str, &'a str)>> {
    s.split([',', ';'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').map(|(k, v)| (k.trim(), v.trim())).with_context(|| format!("invalid value for {flag}: `{p}` is not key=value")))
        .collect()
}

/// sd-cli's boolean spellings.
fn parse_bool(flag: &str, key: &str, v: &str) -> anyhow::Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("invalid value for {flag}: {key}={v} is not a boolean (1/0, true/false, yes/no, on/off)"),
    }
}

/// Chroma's mask options: `--model-args` over sd-cli's older `--chroma-*` flags.
fn chroma_params(a: &ImgGenArgs) -> anyhow::Result<ChromaParams> {
    let mut c = ChromaParams { dit_mask: !a.chroma_disable_dit_mask, t5_mask: a.chroma_enable_t5_mask, t5_mask_pad: a.chroma_t5_mask_pad };
    for (k, v) in key_values("--model-args", a.model_args.as_deref().unwrap_or(""))? {
        match k {
            "chroma_use_dit_mask" => c.dit_mask = parse_bool("--model-args", k, v)?,
            "chroma_use_t5_mask" => c.t5_mask = parse_bool("--model-args", k, v)?,
            "chroma_t5_mask_pad" => c.t5_mask_pad = v.parse().with_context(|| format!("invalid value for --model-args: chroma_t5_mask_pad={v} is not an integer"))?,
            "qwen_image_zero_cond_t" => bail!("not supported yet: --model-args {k} (Qwen-Image is not implemented)"),
            _ => bail!("invalid value for --model-args: unknown key `{k}` (chroma_use_dit_mask, chroma_use_t5_mask, chroma_t5_mask_pad)"),
        }
    }
    Ok(c)
}

struct RefArgs {
    increase: bool,
    resize: bool,
}

/// `--ref-image-args` over sd-cli's older `--increase-ref-index` and
/// `--disable-auto-resize-ref-image`.
fn ref_image_args(a: &ImgGenArgs) -> anyhow::Result<RefArgs> {
    let mut r = RefArgs { increase: a.increase_ref_index, resize: !a.disable_auto_resize_ref_image };
    for (k, v) in key_values("--ref-image-args", a.ref_image_args.as_deref().unwrap_or(""))? {
        match (k, v) {
            ("ref_index_mode", "fixed") => r.increase = false,
            ("ref_index_mode", "increase") => r.increase = true,
            ("ref_index_mode", _) => bail!("not supported yet: --ref-image-args ref_index_mode={v} (fixed and increase are FLUX Kontext's)"),
            ("resize_before_vae", _) => r.resize = parse_bool("--ref-image-args", k, v)?,
            ("preset", "flux_kontext") | ("pass_to_dit", "1" | "true" | "on" | "yes") | ("pass_to_vlm", "0" | "false" | "off" | "no") => {}
            _ => bail!("not supported yet: --ref-image-args {k}={v} (sdflow takes ref_index_mode and resize_before_vae, FLUX Kontext's)"),
        }
    }
    Ok(r)
}

/// `--skip-layers`: sd-cli's `[7,8,9]` list (brackets and spaces optional).
fn parse_skip_layers(s: &str) -> anyhow::Result<Vec<i64>> {
    let inner = s.trim().trim_start_matches('[').trim_end_matches(']');
    inner.split(',').map(str::trim).filter(|t| !t.is_empty()).map(|t| t.parse::<i64>().with_context(|| format!("invalid value for --skip-layers: `{t}` in {s} is not an integer"))).collect()
}

fn img_gen_params(a: &ImgGenArgs, seed: i64, names: &mut Names<'_>) -> anyhow::Result<ImgGenParams> {
    let (_, tags) = presets::extract_loras(&a.sampling.prompt)?;
    let mut lora_files = BTreeMap::new();
    for t in &tags {
        let file = match names {
            Names::Shown => find_lora(&a.lora_model_dir, &t.name).map_or_else(|| format!("{}.safetensors", t.name), |p| shown_name(&p.to_string_lossy())),
            Names::Staged(s) => s.lora(&a.lora_model_dir, &t.name)?,
        };
        lora_files.insert(t.name.clone(), file);
    }
    let hires_upscaler = if a.hires && !a.hires_upscaler.starts_with("Latent") && !["Nearest", "Lanczos"].contains(&a.hires_upscaler.as_str()) {
        // A model name under --hires-upscalers-dir, as sd-cli looks it up.
        match (&mut *names, &a.hires_upscalers_dir) {
            (Names::Staged(s), Some(dir)) => {
                let found = ["", ".pth", ".safetensors", ".pt", ".bin", ".gguf"].iter().map(|e| dir.join(format!("{}{e}", a.hires_upscaler))).find(|p| p.is_file());
                match found {
                    Some(p) => s.link("upscale_models", &p)?,
                    None => bail!("--hires-upscaler {}: no such model in {}", a.hires_upscaler, dir.display()),
                }
            }
            (Names::Staged(s), None) => s.model("upscale_models", "--hires-upscaler", &a.hires_upscaler)?,
            (Names::Shown, _) => a.hires_upscaler.clone(),
        }
    } else {
        a.hires_upscaler.clone()
    };
    let refs = ref_image_args(a)?;
    let ref_sizes = a.ref_image.iter().map(|r| image_size(r)).collect::<Vec<_>>();
    // sd-cli: without -W/-H the output takes the first reference's size (an init image's
    // first), rounded up to a multiple of 8.
    let (mut width, mut height) = (a.width.unwrap_or(512), a.height.unwrap_or(512));
    if a.width.is_none() && a.height.is_none() && a.init_img.is_none() {
        if let Some(&(w, h)) = ref_sizes.first().filter(|s| s.0 > 0) {
            (width, height) = ((w + 7) / 8 * 8, (h + 7) / 8 * 8);
        }
    }
    Ok(ImgGenParams {
        model: names.model("checkpoints", "-m", &a.model)?,
        diffusion_model: names.model("diffusion_models", "--diffusion-model", &a.diffusion_model)?,
        clip_l: names.model("text_encoders", "--clip_l", &a.clip_l)?,
        clip_g: names.model("text_encoders", "--clip_g", &a.clip_g)?,
        vae: names.model("vae", "--vae", &a.vae)?,
        // Staged either way: previews find it in vae_approx/.
        taesd: match (&a.taesd, &mut *names) {
            (None, _) => None,
            (Some(_), Names::Shown) => (!a.taesd_preview_only).then(|| tae_name(a).to_string()),
            (Some(v), Names::Staged(s)) => Some(s.taesd(v, tae_name(a))?).filter(|_| !a.taesd_preview_only),
        },
        control_net: names.model("controlnet", "--control-net", &a.control_net)?,
        control_image: names.image("--control-image", &a.control_image)?,
        control_strength: a.control_strength,
        canny: a.canny,
        photo_maker: names.model("photomaker", "--photo-maker", &a.photo_maker)?,
        pm_id_images_dir: names.folder("--pm-id-images-dir", &a.pm_id_images_dir)?,
        pm_id_embed_path: names.image("--pm-id-embed-path", &a.pm_id_embed_path)?,
        pm_style_strength: a.pm_style_strength,
        upscale_model: names.model("upscale_models", "--upscale-model", &a.upscale_model)?,
        upscale_repeats: a.upscale_repeats,
        upscale_tile_size: a.upscale_tile_size,
        ad_model: names.model("ultralytics", "--ad-model", &a.ad_model)?,
        extra_ad_args: a.extra_ad_args.clone(),
        ad_prompt: a.ad_prompt.clone(),
        ad_negative_prompt: a.ad_negative_prompt.clone(),
        prompt: a.sampling.prompt.clone(),
        negative_prompt: a.sampling.negative_prompt.clone(),
        zero_empty_negative: a.model.as_deref().is_some_and(zeroes_empty_negative),
        lora_files,
        lora_apply_mode: a.lora_apply_mode.clone(),
        rng: a.sampling.node_rng(),
        width,
        height,
        size_given: a.width.is_some() || a.height.is_some(),
        steps: a.sampling.steps,
        cfg_scale: a.sampling.cfg_scale,
        sampling_method: a.sampling.sampling_method.clone(),
        scheduler: a.sampling.scheduler.clone(),
        prediction: a.sampling.prediction.clone(),
        eta: a.sampling.eta,
        sigmas: a.sampling.sigmas.clone().map(|l| l.0),
        seed,
        batch_count: a.batch_count,
        init_img: names.image("-i", &a.init_img)?,
        mask: names.image("--mask", &a.mask)?,
        strength: a.strength.unwrap_or(0.75),
        clip_skip: a.clip_skip,
        img_cfg_scale: a.img_cfg_scale,
        hires: HiresParams {
            enabled: a.hires,
            upscaler: hires_upscaler,
            scale: a.hires_scale,
            width: a.hires_width,
            height: a.hires_height,
            steps: a.hires_steps,
            denoising_strength: a.hires_denoising_strength,
            upscale_tile_size: a.hires_upscale_tile_size,
            sigmas: a.hires_sigmas.clone().map(|l| l.0),
        },
        tiling: TilingParams { enabled: a.vae_tiling, tile_size: a.vae_tile_size, overlap: a.vae_tile_overlap, relative: a.vae_relative_tile_size.map(|(x, y)| (x as f64, y as f64)) },
        output: a.sampling.output.clone(),
        model_info: model_info(a),
        t5xxl: names.model("text_encoders", "--t5xxl", &a.t5xxl)?,
        guidance: a.guidance,
        flow_shift: a.flow_shift,
        slg: SlgParams { scale: a.slg_scale, layers: parse_skip_layers(&a.skip_layers)?, start: a.skip_layer_start, end: a.skip_layer_end },
        ref_images: a.ref_image.iter().map(|r| names.image("-r", &Some(r.clone())).map(Option::unwrap_or_default)).collect::<anyhow::Result<_>>()?,
        ref_sizes,
        increase_ref_index: refs.increase,
        auto_resize_ref_image: refs.resize,
        chroma: chroma_params(a)?,
    })
}

fn common_refusals(c: &CommonArgs, refused: &Refused) -> anyhow::Result<()> {
    refused.check()?;
    if c.preview.as_deref() == Some("vae") {
        bail!("not supported yet: --preview vae (a full VAE decode per step; --preview tae or proj draw the previews)");
    }
    if c.preview_method() != sdflow_nodes::sampling::preview::PreviewMethod::None && run::preview_format(&c.preview_path).is_none() {
        bail!("invalid value for --preview-path: {} (previews are written as .png or .jpg)", c.preview_path.display());
    }
    Ok(())
}

pub fn img_gen_command(a: ImgGenArgs) -> anyhow::Result<()> {
    common_refusals(&a.common, &a.refused)?;
    a.sampling.refusals()?;
    if a.taesd.is_none() {
        if a.taesd_preview_only {
            bail!("missing --taesd: --taesd-preview-only previews with the --taesd decoder");
        }
        if a.common.preview.as_deref() == Some("tae") {
            bail!("missing --taesd: --preview tae draws the previews with the --taesd decoder");
        }
    }
    if let Some(r) = &a.tensor_type_rules {
        bail!("not supported yet: --tensor-type-rules {r} (loading applies --type only; `sdflow convert` takes rules)");
    }
    check_output(&a.sampling.output)?;
    if let (Some(_), Some(st)) = (a.img_cfg_scale, a.strength) {
        bail!("not supported yet: --strength {st} with --img-cfg-scale (instruct-pix2pix samples from noise, strength 1)");
    }
    let seed = presets::resolve_seed(a.sampling.seed);
    let shown = presets::img_gen(&img_gen_params(&a, seed, &mut Names::Shown)?)?;
    finish(shown, &a.common, &a.sampling.output, a.sampling.output_begin_idx, |stage| {
        if let Some(d) = &a.embd_dir {
            stage.embeddings(d)?;
        } else if a.common.models_dir.join("embeddings").is_dir() {
            stage.embeddings(&a.common.models_dir.join("embeddings"))?;
        }
        Ok(presets::img_gen(&img_gen_params(&a, seed, &mut Names::Staged(stage))?)?)
    })
}

pub fn upscale_command(a: UpscaleArgs) -> anyhow::Result<()> {
    common_refusals(&a.common, &a.refused)?;
    check_output(&a.output)?;
    let params = |names: &mut Names<'_>| -> anyhow::Result<UpscaleParams> {
        Ok(UpscaleParams {
            init_img: names.image("-i", &Some(a.init_img.clone()))?.unwrap_or_default(),
            upscale_model: names.model("upscale_models", "--upscale-model", &Some(a.upscale_model.clone()))?.unwrap_or_default(),
            upscale_repeats: a.upscale_repeats,
            tile_size: a.upscale_tile_size,
            output: a.output.clone(),
        })
    };
    let shown = presets::upscale(&params(&mut Names::Shown)?)?;
    finish(shown, &a.common, &a.output, None, |stage| Ok(presets::upscale(&params(&mut Names::Staged(stage))?)?))
}

pub fn adetailer_command(a: AdetailerArgs) -> anyhow::Result<()> {
    common_refusals(&a.common, &a.refused)?;
    a.sampling.refusals()?;
    if a.common.preview.as_deref() == Some("tae") {
        bail!("not supported yet: --preview tae in the adetailer mode (it takes no --taesd; --preview proj works)");
    }
    if a.sampling.sigmas.is_some() {
        bail!("not supported yet: --sigmas in the adetailer mode (the detail pass's schedule is --steps of --scheduler cut to --strength)");
    }
    check_output(&a.sampling.output)?;
    let seed = presets::resolve_seed(a.sampling.seed);
    let params = |names: &mut Names<'_>| -> anyhow::Result<AdetailerParams> {
        Ok(AdetailerParams {
            model: names.model("checkpoints", "-m", &Some(a.model.clone()))?.unwrap_or_default(),
            init_img: names.image("-i", &Some(a.init_img.clone()))?.unwrap_or_default(),
            ad_model: names.model("ultralytics", "--ad-model", &Some(a.ad_model.clone()))?.unwrap_or_default(),
            extra_ad_args: a.extra_ad_args.clone(),
            ad_prompt: a.ad_prompt.clone(),
            ad_negative_prompt: a.ad_negative_prompt.clone(),
            prompt: a.sampling.prompt.clone(),
            negative_prompt: a.sampling.negative_prompt.clone(),
            width: a.width,
            height: a.height,
            steps: a.sampling.steps,
            cfg_scale: a.sampling.cfg_scale,
            sampling_method: a.sampling.sampling_method.clone(),
            scheduler: a.sampling.scheduler.clone(),
            prediction: a.sampling.prediction.clone(),
            eta: a.sampling.eta,
            rng: a.sampling.node_rng(),
            seed,
            strength: a.strength,
            output: a.sampling.output.clone(),
        })
    };
    let shown = presets::adetailer(&params(&mut Names::Shown)?)?;
    finish(shown, &a.common, &a.sampling.output, a.sampling.output_begin_idx, |stage| Ok(presets::adetailer(&params(&mut Names::Staged(stage))?)?))
}

pub fn vid_gen_command(_a: VidGenArgs) -> anyhow::Result<()> {
    bail!("not supported yet: vid_gen (no video model family — Wan, SVD, LTX — is implemented)")
}

/// Prints or saves `shown` (the workflow with file names as given), refuses it if this
/// build lacks a node it needs, else stages the files, builds the runnable workflow with
/// `build`, runs it and moves the images to `-o`.
fn finish(shown: Preset, c: &CommonArgs, output: &str, begin: Option<i64>, build: impl FnOnce(&mut Stage) -> anyhow::Result<Preset>) -> anyhow::Result<()> {
    let threads = (c.threads > 0).then_some(c.threads as usize);
    let stage_probe = Stage::new(&c.models_dir)?;
    let (probe, _) = run::registry(stage_probe.path(), stage_probe.path(), &stage_probe.input_dir(), threads, c.weight_type.resolve())?;
    let missing = presets::unsupported_nodes(&shown, &probe);
    drop(probe);
    drop(stage_probe);
    if let Some(path) = &c.save_workflow {
        std::fs::write(path, shown.workflow.to_string_pretty() + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if c.print_workflow {
        println!("{}", shown.workflow.to_string_pretty());
        for m in &missing {
            eprintln!("note: this build cannot run it yet: {m}");
        }
        return Ok(());
    }
    if !missing.is_empty() {
        let lines: Vec<String> = missing.iter().map(ToString::to_string).collect();
        bail!("{}", lines.join("\nerror: "));
    }
    let mut stage = Stage::new(&c.models_dir)?;
    let preset = build(&mut stage)?;
    let out_dir = stage.path().join("output");
    let (method, noisy) = (c.preview_method(), c.preview_noisy);
    let registry = Arc::new(run::registry_with(stage.path(), &out_dir, &stage.input_dir(), threads, c.weight_type.resolve(), |rt| rt.with_preview_method(method).with_preview_noisy(noisy))?.0);
    let workflows: Vec<(String, Workflow)> = vec![(preset.workflow.header.as_ref().and_then(|h| h.title.clone()).unwrap_or_default(), preset.workflow.clone())];
    let session = run::Session { output_dir: Some(out_dir.clone()), json_events: c.json_events, workers: None, repeat: 1, preview: c.preview_file() };
    let reports = run::execute(registry, &workflows, &session)?;
    let mut files = Vec::new();
    for report in &reports {
        for id in &preset.save_nodes {
            let Some(images) = report.ui_outputs.get(id).and_then(|u| u.get("images")).and_then(|i| i.as_array()) else { continue };
            for img in images {
                let name = img.get("filename").and_then(|f| f.as_str()).unwrap_or_default();
                let sub = img.get("subfolder").and_then(|f| f.as_str()).unwrap_or_default();
                files.push(out_dir.join(sub).join(name));
            }
        }
    }
    let targets = presets::output_paths(output, files.len(), begin)?;
    for (from, to) in files.iter().zip(&targets) {
        if let Some(parent) = to.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        if std::fs::rename(from, to).is_err() {
            // Across file systems a rename fails; copy instead.
            std::fs::copy(from, to).with_context(|| format!("writing {}", to.display()))?;
        }
        let line = format!("save result image to '{}'", to.display());
        if c.json_events {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    Ok(())
}
