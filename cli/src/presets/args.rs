//! The preset commands' flags, with sd-cli's names and defaults, and the sd-cli flags
//! sdflow refuses (taken by the parser, so they are named rather than unknown).

use std::path::PathBuf;

use anyhow::bail;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use sdflow_workflows::presets::{SD_SAMPLERS, SD_SCHEDULERS};

use crate::run;

/// sd-cli flags that map to nothing in sdflow yet: accepted by the parser (so they are not
/// "unknown"), refused when given.
const REFUSED: &[(&str, bool, &str)] = &[
    ("force-sdxl-vae-conv-scale", false, "sdflow's VAE convolutions run in f32 or bf16 with f32 sums, where the fp16 overflow this works around does not arise"),
    ("mmap", false, "model files are always memory-mapped when the format allows"),
    ("auto-fit", false, "placement from model sizes is not implemented; --backend, --params-backend and --max-vram place modules"),
    ("split-mode", true, "each module runs on one device; a module cannot be split across GPUs yet"),
    ("stream-layers", false, "segmented execution (streaming a model's blocks through the GPU) is not implemented"),
    ("eager-load", false, "weights load on first use, through the residency manager"),
    ("rpc-servers", true, "ggml's RPC backend is not built"),
    ("high-noise-img-cfg-scale", true, "the high-noise expert samples with --high-noise-cfg-scale alone (Wan's image to video takes no image CFG)"),
    ("high-noise-guidance", true, "Wan takes no distilled guidance"),
    ("high-noise-slg-scale", true, "skip-layer guidance runs on SD3, FLUX.1 and Chroma, not on Wan's experts"),
    ("high-noise-skip-layer-start", true, "skip-layer guidance runs on SD3, FLUX.1 and Chroma, not on Wan's experts"),
    ("high-noise-skip-layer-end", true, "skip-layer guidance runs on SD3, FLUX.1 and Chroma, not on Wan's experts"),
    ("high-noise-skip-layers", true, "skip-layer guidance runs on SD3, FLUX.1 and Chroma, not on Wan's experts"),
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
    pub(super) fn check(&self) -> anyhow::Result<()> {
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
    /// `vae/`, `loras/`, ... inside it; without `checkpoints/`, the files in it are the
    /// checkpoints).
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
    #[command(flatten)]
    pub placement: run::PlacementArgs,
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
    pub(super) fn preview_method(&self) -> sdflow_nodes::sampling::preview::PreviewMethod {
        use sdflow_nodes::sampling::preview::PreviewMethod;
        match self.preview.as_deref() {
            Some("proj") => PreviewMethod::Latent2Rgb,
            Some("tae") => PreviewMethod::Taesd,
            _ => PreviewMethod::None,
        }
    }

    pub(super) fn preview_file(&self) -> Option<run::PreviewFile> {
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
    pub(super) fn node_rng(&self) -> Option<String> {
        self.rng.as_deref().map(|r| if r == "cpu" { "cpu_portable" } else { r }.to_string())
    }

    pub(super) fn refusals(&self) -> anyhow::Result<()> {
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
    /// Enable circular padding on both axes for tileable output.
    #[arg(long)]
    pub circular: bool,
    /// Enable circular padding on x-axis (width) only.
    #[arg(long)]
    pub circularx: bool,
    /// Enable circular padding on y-axis (height) only.
    #[arg(long)]
    pub circulary: bool,
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
    /// Path to the LLM text encoder (Z-Image's Qwen3-4B, FLUX.2 klein's Qwen3, Qwen-Image's Qwen2.5-VL-7B); --qwen2vl is sd-cli's older name.
    #[arg(long = "llm", visible_alias = "qwen2vl", value_name = "string")]
    pub llm: Option<String>,
    /// Path to the LLM's vision tower (Qwen-Image-Edit's Qwen2.5-VL, as safetensors with
    /// `visual.*`) when the --llm file has none; --qwen2vl_vision is sd-cli's older name.
    #[arg(long = "llm_vision", visible_alias = "qwen2vl_vision", value_name = "string")]
    pub llm_vision: Option<String>,
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
    /// chroma_t5_mask_pad, qwen_image_zero_cond_t (Qwen-Image-Edit-2511's references at
    /// timestep 0).
    #[arg(long, value_name = "string")]
    pub model_args: Option<String>,
    /// Number of Qwen Image Layered layers; latent/output count is layers + 1.
    #[arg(long, value_name = "int", default_value_t = 3, allow_negative_numbers = true)]
    pub qwen_image_layers: i64,
    /// The video's last frame (vid_gen: Wan FLF2V, Wan 2.1/2.2 I2V).
    #[arg(long = "end-img", value_name = "string")]
    pub end_img: Option<String>,
    /// CLIP-vision ViT-H (clip_vision_h.safetensors): how a Wan 2.1 I2V / FLF2V model reads
    /// its images (vid_gen).
    #[arg(long = "clip_vision", value_name = "string")]
    pub clip_vision: Option<String>,
    /// An AnimateDiff motion module (mm_sd15_v3, mm_sd_v15_v2, …) for an SD1.x model
    /// (vid_gen): the --video-frames frames (at most 32) are sampled as one video.
    #[arg(long = "motion-module", value_name = "string")]
    pub motion_module: Option<String>,
    /// A folder of control frames (file-name order) for a Wan VACE model (vid_gen).
    #[arg(long = "control-video", value_name = "string")]
    pub control_video: Option<String>,
    /// Strength of the Wan VACE control.
    #[arg(long = "vace-strength", value_name = "float", default_value_t = 1.0, allow_negative_numbers = true)]
    pub vace_strength: f64,
    /// Video frames to generate (vid_gen; rounded down to 4·k + 1 as sd.cpp does).
    #[arg(long, value_name = "int", default_value_t = 1, allow_negative_numbers = true)]
    pub video_frames: i64,
    /// Frames per second of the written video (vid_gen).
    #[arg(long, value_name = "int", default_value_t = 16, allow_negative_numbers = true)]
    pub fps: i64,
    /// Wan2.2 MoE: the high-noise expert, which samples the first steps (vid_gen).
    #[arg(long, value_name = "string")]
    pub high_noise_diffusion_model: Option<String>,
    /// Steps of the high-noise expert, added to --steps (<= 0: the steps whose sigma is at
    /// least --moe-boundary).
    #[arg(long, value_name = "int", default_value_t = -1, allow_negative_numbers = true)]
    pub high_noise_steps: i64,
    /// CFG scale of the high-noise expert's steps.
    #[arg(long, value_name = "float", default_value_t = 7.0)]
    pub high_noise_cfg_scale: f64,
    /// Sampling method of the high-noise expert's steps (default: euler).
    #[arg(long, value_name = "string")]
    pub high_noise_sampling_method: Option<String>,
    /// Eta of the high-noise expert's sampler.
    #[arg(long, value_name = "float", allow_negative_numbers = true)]
    pub high_noise_eta: Option<f64>,
    /// The sigma below which the low-noise expert takes over (with --high-noise-steps <= 0).
    #[arg(long, value_name = "float", default_value_t = 0.875)]
    pub moe_boundary: f64,
    /// Reference image options, `key=value,...`: preset (flux_kontext, flux2, qwen,
    /// qwen_layered), ref_index_mode (fixed, increase, decrease), resize_before_vae, vae_input_max_pixels,
    /// pass_to_vlm, pass_to_dit, vlm_resize_mode (area, longest_side, none), vlm_min_size,
    /// vlm_max_size, vlm_size.
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

/// `sdflow vid_gen`: img_gen's flags (with `--video-frames` and `--fps`), for a video model.
#[derive(Args, Debug, Clone)]
pub struct VidGenArgs {
    #[command(flatten)]
    pub img: ImgGenArgs,
}
