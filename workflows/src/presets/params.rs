//! The typed parameters of sd-cli's modes, with sd-cli's defaults.

use std::collections::BTreeMap;
use std::path::Path;

/// `--hires*`: sd-webui's "Hires. fix", which sd.cpp's flags follow.
#[derive(Debug, Clone, PartialEq)]
pub struct HiresParams {
    /// `--hires`.
    pub enabled: bool,
    /// `--hires-upscaler`: `Latent`, `Latent (nearest)`, `Latent (nearest-exact)`,
    /// `Latent (antialiased)`, `Latent (bicubic)`, `Latent (bicubic antialiased)`,
    /// `Nearest`, `Lanczos`, or an upscale model's name.
    pub upscaler: String,
    /// `--hires-scale`.
    pub scale: f64,
    /// `--hires-width`, `--hires-height`: a target size instead of a scale (0: from the
    /// scale, or from the other side and the aspect ratio).
    pub width: i64,
    pub height: i64,
    /// `--hires-steps` (0: the base pass's steps).
    pub steps: i64,
    /// `--hires-denoising-strength`.
    pub denoising_strength: f64,
    /// `--hires-upscale-tile-size`, for a model upscaler (128).
    pub upscale_tile_size: i64,
    /// `--hires-sigmas`: the hires pass's whole schedule, as given (sd-cli does not cut it
    /// to the denoising strength; its first sigma is the noise added).
    pub sigmas: Option<Vec<f32>>,
}

impl Default for HiresParams {
    fn default() -> Self {
        HiresParams { enabled: false, upscaler: "Latent".into(), scale: 2.0, width: 0, height: 0, steps: 0, denoising_strength: 0.7, upscale_tile_size: 128, sigmas: None }
    }
}

/// A1111's img2img, as its `StableDiffusionProcessingImg2Img.init` prepares the input:
/// the image fitted to -W×-H by `resize_mode`; with `--mask` (which the caller gives
/// blurred, A1111's `mask_blur`, at the input's size) the masked content and the inpaint
/// area; the unmasked part of the input laid back over the result through the mask.
#[derive(Clone, Debug, PartialEq)]
pub struct A1111Img2Img {
    /// 0 just resize, 1 crop and resize, 2 resize and fill (A1111ResizeImage), 3 just
    /// resize the latent (LatentUpscale, bilinear; not with a mask).
    pub resize_mode: u8,
    /// With a mask: 0 fill (A1111MaskedFill), 1 original, 2 latent noise, 3 latent
    /// nothing (A1111InpaintLatent).
    pub masked_content: u8,
    /// Inpaint area "only masked": the region `[x, y, width, height]` of the input (A1111's
    /// crop region: the mask's box, padded, widened to -W:-H) that is cut out, inpainted at
    /// -W×-H and pasted back; the input keeps its size. `None`: the whole picture.
    pub region: Option<[i64; 4]>,
    /// A1111's `initial_noise_multiplier`: the initial noise scaled by it.
    pub noise_multiplier: f64,
}

impl Default for A1111Img2Img {
    fn default() -> Self {
        A1111Img2Img { resize_mode: 0, masked_content: 1, region: None, noise_multiplier: 1.0 }
    }
}

/// A1111's seeds (sd-server's `subseed`, `subseed_strength`; no sd-cli flag, errors name
/// them `--subseed` and `--subseed-strength`): every image of the batch is sampled from
/// its own seed through VariationNoise, `-s` + its position (A1111's seed progression),
/// or with a strength above 0 `-s` itself with its noise turned towards `subseed` + its
/// position.
#[derive(Debug, Clone, PartialEq)]
pub struct VariationParams {
    pub subseed: i64,
    pub strength: f64,
}

/// One ControlNet unit of A1111's ControlNet extension (sd-server's
/// `alwayson_scripts.controlnet.args[i]`; no sd-cli flag): a ControlNet of `controlnet/`
/// over both prompts with a control image already made at the generation size, applied
/// after `--control-net`'s. Errors name it by `origin`.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlUnit {
    pub model: String,
    /// An image in the input folder.
    pub image: String,
    pub strength: f64,
    /// The fraction of sampling it starts and ends at (ControlNetApplyAdvanced's
    /// `start_percent`, `end_percent`).
    pub start: f64,
    pub end: f64,
    pub origin: String,
}

/// A1111's refiner (sd-server's `refiner_checkpoint`, `refiner_switch_at`; no sd-cli
/// flag, errors name them `--refiner` and `--refiner-switch-at`): a second checkpoint
/// takes over the sampling after `switch_at` of its steps (KSamplerAdvanced's split: the
/// first part returns its leftover noise, the refiner goes on without adding noise), with
/// the prompts encoded by its own text encoder, the same LoRA tags and its VAE decoding.
/// With the hires fix it refines the hires pass (A1111's default, "second pass").
#[derive(Debug, Clone, PartialEq)]
pub struct RefinerParams {
    /// A checkpoint in `checkpoints/`.
    pub model: String,
    pub switch_at: f64,
}

/// `--vae-tiling` and its options.
#[derive(Debug, Clone, PartialEq)]
pub struct TilingParams {
    pub enabled: bool,
    /// `--vae-tile-size`, in latent pixels (sd.cpp's unit; default 32x32).
    pub tile_size: (i64, i64),
    /// `--vae-tile-overlap`, a fraction of the tile (default 0.5).
    pub overlap: f64,
    /// `--vae-relative-tile-size`: per axis a fraction of the latent side (<= 1) or a
    /// number of tiles (> 1); it overrides `tile_size` where given.
    pub relative: Option<(f64, f64)>,
}

impl Default for TilingParams {
    fn default() -> Self {
        TilingParams { enabled: false, tile_size: (32, 32), overlap: 0.5, relative: None }
    }
}

/// sd-cli's `img_gen` mode: txt2img, img2img (`-i`), inpainting (`--mask`), hires fix,
/// LoRA tags, ControlNet, ESRGAN upscaling of the result. Defaults are sd-cli's.
#[derive(Debug, Clone, PartialEq)]
pub struct ImgGenParams {
    /// `-m`: a full checkpoint (UNet, text encoder, VAE).
    pub model: Option<String>,
    /// `--diffusion-model`: a standalone diffusion model.
    pub diffusion_model: Option<String>,
    /// `--clip_l`, `--clip_g`: standalone text encoders.
    pub clip_l: Option<String>,
    pub clip_g: Option<String>,
    /// `--vae`: a standalone VAE.
    pub vae: Option<String>,
    /// `--taesd`: the tiny autoencoder, decoding instead of the VAE.
    pub taesd: Option<String>,
    /// `--control-net`, `--control-image`, `--control-strength` (0.9).
    pub control_net: Option<String>,
    pub control_image: Option<String>,
    pub control_strength: f64,
    /// More ControlNets, each with its own image, strength and range (A1111's units).
    pub controls: Vec<ControlUnit>,
    /// `--canny`: edge-detect the control image first.
    pub canny: bool,
    /// `--photo-maker`, `--pm-id-images-dir` (a folder in the input folder),
    /// `--pm-id-embed-path` (PhotoMaker v2's face embeddings, a file in the input
    /// folder), `--pm-style-strength` (20).
    pub photo_maker: Option<String>,
    pub pm_id_images_dir: Option<String>,
    pub pm_id_embed_path: Option<String>,
    pub pm_style_strength: f64,
    /// `--upscale-model`, `--upscale-repeats` (1).
    pub upscale_model: Option<String>,
    pub upscale_repeats: i64,
    /// `--upscale-tile-size` (128).
    pub upscale_tile_size: i64,
    /// `--ad-model`: a detector whose finds are re-sampled (ADetailer: UltralyticsDetectorProvider, BboxDetectorMasks, DetailerForEachMask);
    /// `--extra-ad-args`: `input=value,...` overrides for the detailer node.
    pub ad_model: Option<String>,
    pub extra_ad_args: Option<String>,
    /// `--ad-prompt`, `--ad-negative-prompt`: the detail pass's prompts (empty: the main
    /// ones).
    pub ad_prompt: String,
    pub ad_negative_prompt: String,
    /// `-p`, `-n`. `<lora:name:weight>` tags in the prompt become LoraLoader nodes.
    pub prompt: String,
    pub negative_prompt: String,
    /// sd-cli zeroes an SDXL model's unconditional embeddings when `-n` is empty (not
    /// for EDM-v models): the caller, which can read the model file, says whether this
    /// model is one.
    pub zero_empty_negative: bool,
    /// LoRA file name per tag name; a tag without an entry loads `NAME.safetensors`.
    pub lora_files: BTreeMap<String, String>,
    /// `--lora-apply-mode`: every LoraLoader's `apply_mode`; `None` leaves the input out
    /// (the node's default, auto, as in sd-cli).
    pub lora_apply_mode: Option<String>,
    /// `--rng` (and `--sampler-rng`, which must agree: one generator draws the initial and
    /// every step's noise): the KSamplers' `rng`; `None` leaves the input out (ComfyUI's
    /// CPU noise).
    pub rng: Option<String>,
    pub width: i64,
    pub height: i64,
    /// Whether `-W`/`-H` were given: with `-i` they resize the input image.
    pub size_given: bool,
    pub steps: i64,
    pub cfg_scale: f64,
    /// `--sampling-method` (sd.cpp or ComfyUI name; `None`: euler_a, sd-cli's default for
    /// UNet models).
    pub sampling_method: Option<String>,
    /// `--scheduler` (`None`: discrete).
    pub scheduler: Option<String>,
    /// `--prediction` (eps, v, edm_v; `None`: what the checkpoint says).
    pub prediction: Option<String>,
    /// `--eta` (`None`: each sampler's own, as sd-cli without the flag).
    pub eta: Option<f64>,
    /// `--sigmas`: the base pass's schedule instead of `--steps` and `--scheduler`; with
    /// `-i` cut to `--strength` as sd-cli cuts it.
    pub sigmas: Option<Vec<f32>>,
    /// `-s`: a negative seed asks for a random one (see [`resolve_seed`]).
    pub seed: i64,
    /// `-b`: images per run.
    pub batch_count: i64,
    /// A1111's seeds ([`VariationParams`]); `None`: one noise stream for the whole batch
    /// (RandomNoise, the KSampler's seed), as sd-cli's graphs have it.
    pub variation: Option<VariationParams>,
    /// A1111's refiner ([`RefinerParams`]).
    pub refiner: Option<RefinerParams>,
    /// A1111's img2img preparation of `-i` and `--mask` (the A1111 API's resize mode,
    /// masked content and inpaint area, [`A1111Img2Img`]); `None`: sd-cli's.
    pub a1111: Option<A1111Img2Img>,
    /// `-i`, `--mask`, `--strength` (0.75).
    pub init_img: Option<String>,
    /// vid_gen: `--end-img` (a Wan video's last frame) and `--clip_vision` (the CLIP-vision
    /// ViT-H a Wan 2.1 I2V / FLF2V model reads its images through).
    pub end_img: Option<String>,
    pub clip_vision: Option<String>,
    /// vid_gen with a Wan VACE model: `--control-video` (a folder of frames in file-name
    /// order) and `--vace-strength` (1).
    pub control_video: Option<String>,
    pub vace_strength: f64,
    pub mask: Option<String>,
    pub strength: f64,
    /// `--clip-skip` (≤ 0: the model's default).
    pub clip_skip: i64,
    /// `--img-cfg-scale`: instruct-pix2pix with this image guidance (needs `-i`).
    pub img_cfg_scale: Option<f64>,
    pub hires: HiresParams,
    pub tiling: TilingParams,
    /// `--circularx` / `--circulary` (`--circular`: both; A1111's `tiling`): seamless
    /// tiling across the width / height. SeamlessTile on the diffusion model and
    /// MakeCircularVAE on the VAE (and `--taesd`), as sd.cpp makes the diffusion model, the
    /// ControlNet and the VAE circular.
    pub circular_x: bool,
    pub circular_y: bool,
    /// `-o` (`./output.png`); its file stem is the SaveImage prefix.
    pub output: String,
    /// What the model files hold, as the caller read them: it picks the family's builder.
    pub model_info: ModelInfo,
    /// `--t5xxl`: T5-XXL (FLUX, SD3, Chroma).
    pub t5xxl: Option<String>,
    /// `--llm` (`--qwen2vl`): the LLM text encoder (Z-Image's Qwen3-4B, FLUX.2 klein's Qwen3, Qwen-Image's Qwen2.5-VL-7B).
    pub llm: Option<String>,
    /// `--llm_vision` (`--qwen2vl_vision`): Qwen2.5-VL's vision tower when the --llm file
    /// has none (Qwen-Image-Edit's reference images).
    pub llm_vision: Option<String>,
    /// `--guidance` (3.5): FLUX's distilled guidance; models without a guidance input
    /// ignore it, as in sd-cli.
    pub guidance: f64,
    /// `--flow-shift`: the flow models' σ shift (SD3's default 3).
    pub flow_shift: Option<f64>,
    /// `--slg-scale`, `--skip-layers`, `--skip-layer-start`, `--skip-layer-end`.
    pub slg: SlgParams,
    /// `-r`: reference images (FLUX Kontext), `--increase-ref-index`,
    /// `--disable-auto-resize-ref-image` (false here).
    pub ref_images: Vec<String>,
    /// Each reference's width and height (the caller reads the files), for sd.cpp's resize.
    pub ref_sizes: Vec<(i64, i64)>,
    pub increase_ref_index: bool,
    pub auto_resize_ref_image: bool,
    /// The rest of `--ref-image-args`.
    pub ref_options: RefOptions,
    /// Chroma's masks: `--chroma-disable-dit-mask`, `--chroma-enable-t5-mask`,
    /// `--chroma-t5-mask-pad`.
    pub chroma: ChromaParams,
    /// `--model-args qwen_image_zero_cond_t`: Qwen-Image-Edit-2511's references modulated
    /// as at timestep 0 (files that carry `__index_timestep_zero__` need no flag).
    pub qwen_zero_cond_t: bool,
    /// `--qwen-image-layers` (3): Qwen-Image-Layered's layer count; it writes one image
    /// more (the composite first).
    pub qwen_image_layers: i64,
    /// sd-cli's vid_gen mode: `--video-frames` and `--fps` (`None`: img_gen).
    pub video: Option<VideoParams>,
}

/// What sd-cli's vid_gen mode adds to img_gen's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoParams {
    /// `--video-frames` (1): rounded down to 4·k + 1, as sd.cpp aligns it.
    pub frames: i64,
    /// `--fps` (16): the written video's frame rate.
    pub fps: i64,
    /// Wan2.2 MoE: `--high-noise-diffusion-model` and its sampling flags.
    pub high_noise: Option<HighNoiseParams>,
    /// `--motion-module`: AnimateDiff's motion modules on an SD1.x model, which then samples
    /// the frames as one batch.
    pub motion_module: Option<String>,
}

/// Wan2.2's high-noise expert: it samples the schedule's first steps, the model of
/// `--diffusion-model` the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct HighNoiseParams {
    pub model: String,
    /// `--high-noise-steps` (-1): steps added to `--steps`; <= 0: the steps whose sigma is
    /// at least `boundary`.
    pub steps: i64,
    pub cfg_scale: f64,
    pub sampling_method: Option<String>,
    pub eta: Option<f64>,
    /// `--moe-boundary` (0.875).
    pub boundary: f64,
}

/// sd.cpp caps AnimateDiff's frames at the 32 positions of the v2/v3 modules' tables.
pub const ANIMATEDIFF_MAX_FRAMES: i64 = 32;

impl Default for VideoParams {
    fn default() -> Self {
        VideoParams { frames: 1, fps: 16, high_noise: None, motion_module: None }
    }
}

impl VideoParams {
    /// The frames sd.cpp makes of `--video-frames`: for Wan down to the nearest 4·k + 1,
    /// for AnimateDiff as given up to the motion modules' 32 (at least 1 either way).
    pub fn aligned_frames(&self) -> i64 {
        match self.motion_module {
            Some(_) => self.frames.clamp(1, ANIMATEDIFF_MAX_FRAMES),
            None => (self.frames.max(1) - 1) / 4 * 4 + 1,
        }
    }
}

/// The diffusion model's family and what `-m` holds besides it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelInfo {
    pub family: Family,
    /// `-m` holds text encoders (ComfyUI's all-in-one FLUX/SD3 files, every UNet checkpoint).
    pub has_text_encoders: bool,
    /// `-m` holds a VAE.
    pub has_vae: bool,
    /// FLUX/Chroma: the double-stream block count (sd-cli numbers the single blocks after
    /// them in --skip-layers).
    pub double_blocks: Option<usize>,
    /// FLUX.2: the model embeds a distilled guidance (dev; klein does not).
    pub flux2_guidance: bool,
    /// Qwen-Image-Layered: the model decomposes an image into `--qwen-image-layers` layers.
    pub qwen_layered: bool,
    /// Wan: the transformer's input channels (16 T2V, 36 I2V / FLF2V, 48 TI2V).
    pub wan_in_channels: Option<usize>,
    /// Wan 2.1 I2V / FLF2V: it reads the start (and FLF2V the end) image's CLIP-vision states.
    pub wan_clip: bool,
    pub wan_flf: bool,
    /// Wan VACE: it reads a control video (`--control-video`) and a reference (`-i`).
    pub wan_vace: bool,
}

impl ModelInfo {
    /// The family the text-encoder flags point at when the diffusion model cannot be read
    /// (T5 with CLIP-G: SD3; with CLIP-L: FLUX; alone: Chroma; an LLM without T5: Z-Image;
    /// none: a UNet model).
    pub fn guess_from_parts(clip_l: bool, clip_g: bool, t5xxl: bool, llm: bool) -> ModelInfo {
        let family = match (t5xxl, clip_l, clip_g) {
            (false, _, _) if llm => Family::ZImage,
            (false, _, _) => Family::Unet,
            (true, _, true) => Family::Sd3,
            (true, true, false) => Family::Flux { fill: false, guidance: true },
            (true, false, false) => Family::Chroma,
        };
        ModelInfo { family, has_text_encoders: true, has_vae: true, double_blocks: None, flux2_guidance: false, qwen_layered: false, wan_in_channels: None, wan_clip: false, wan_flf: false, wan_vace: false }
    }

    /// Reads the diffusion model's file (`diffusion_model`, else `model`) and what `model`
    /// holds besides; `None` when there is no readable file (the loaders then report it).
    pub fn detect(model: Option<&Path>, diffusion_model: Option<&Path>) -> Option<ModelInfo> {
        use sdflow_core::detect::{detect_source, Detection};
        let read = |path: &Path| -> Option<Detection> { Some(detect_source(sdflow_core::models::pipeline::open(path).ok()?.as_ref())) };
        let d = read(diffusion_model.or(model)?)?;
        let held = match (model, diffusion_model) {
            (None, _) => None,
            (Some(m), Some(_)) => Some(read(m)),
            (Some(_), None) => Some(Some(d.clone())),
        };
        ModelInfo::from_detections(&d, held.as_ref().map(Option::as_ref))
    }

    /// [`ModelInfo::detect`] from detections already made: `diffusion`, the diffusion
    /// model file's; `model`, for an `-m` file, its own (`Some(None)` when it cannot be
    /// read). `None` for an unrecognised diffusion model.
    pub fn from_detections(diffusion: &sdflow_core::detect::Detection, model: Option<Option<&sdflow_core::detect::Detection>>) -> Option<ModelInfo> {
        use sdflow_core::detect::ModelFamily;
        let d = diffusion;
        let family = match d.family {
            ModelFamily::Flux => Family::Flux { fill: d.in_channels == Some(384), guidance: d.flux_guidance },
            ModelFamily::Chroma => Family::Chroma,
            ModelFamily::Sd3 => Family::Sd3,
            ModelFamily::ZImage => Family::ZImage,
            ModelFamily::Flux2 => Family::Flux2,
            ModelFamily::QwenImage => Family::QwenImage,
            ModelFamily::Wan => Family::Wan,
            ModelFamily::Unknown => return None,
            _ => Family::Unet,
        };
        let wan = family == Family::Wan;
        let mut info = ModelInfo {
            family,
            double_blocks: d.double_blocks,
            flux2_guidance: family == Family::Flux2 && d.flux_guidance,
            qwen_layered: family == Family::QwenImage && d.qwen_layered,
            wan_in_channels: d.in_channels.filter(|_| wan),
            wan_clip: wan && d.wan_clip,
            wan_flf: wan && d.wan_flf,
            wan_vace: wan && d.wan_vace,
            ..ModelInfo::default()
        };
        // What -m holds beside the diffusion model (all of it for a UNet checkpoint; an
        // unreadable -m is left to CheckpointLoaderSimple to report).
        match model {
            Some(Some(m)) => {
                let c = &m.components;
                info.has_text_encoders = c.clip_l || c.clip_g || c.clip_h || c.t5 || (c.unet && !c.dit);
                info.has_vae = c.vae || (c.unet && !c.dit);
            }
            Some(None) => (info.has_text_encoders, info.has_vae) = (true, true),
            None => {}
        }
        Some(info)
    }
}

/// Which builder makes the img_gen graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    /// SD1.x, SD2.x, SDXL (and anything not recognised: the UNet builder's loaders
    /// report what they cannot load).
    #[default]
    Unet,
    /// FLUX.1; `fill`: the 384-channel inpainting model; `guidance`: dev's guidance
    /// embedding (schnell has none).
    Flux { fill: bool, guidance: bool },
    Chroma,
    Sd3,
    ZImage,
    Flux2,
    QwenImage,
    /// Wan 2.1 / 2.2 video transformers (sd-cli's vid_gen).
    Wan,
}

/// sd-cli's `--ref-image-args` keys beside `ref_index_mode` and `resize_before_vae`
/// (sd.cpp's `RefImageParams`; unset: the family's preset).
#[derive(Debug, Clone, PartialEq)]
pub struct RefOptions {
    /// The images also go to the text encoder's vision tower (Qwen-Image's preset: yes).
    pub pass_to_vlm: Option<bool>,
    /// Their latents go to the model (every preset: yes).
    pub pass_to_dit: bool,
    /// The VAE input's pixel bound (-1: a megapixel).
    pub vae_input_max_pixels: i64,
    /// `ref_index_mode` as given (`fixed`, `increase`); it also sets `increase_ref_index`.
    pub ref_index_mode: Option<String>,
    /// `area`, `longest_side` or `none`.
    pub vlm_resize_mode: Option<String>,
    /// The vision tower's bounds (-1: the family's).
    pub vlm_min_size: i64,
    pub vlm_max_size: i64,
}

impl Default for RefOptions {
    fn default() -> Self {
        RefOptions { pass_to_vlm: None, pass_to_dit: true, ref_index_mode: None, vae_input_max_pixels: -1, vlm_resize_mode: None, vlm_min_size: -1, vlm_max_size: -1 }
    }
}

/// sd-cli's skip-layer guidance flags, with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SlgParams {
    /// `--slg-scale` (0: off).
    pub scale: f64,
    /// `--skip-layers` (`[7,8,9]`).
    pub layers: Vec<i64>,
    /// `--skip-layer-start` (0.01), `--skip-layer-end` (0.2).
    pub start: f64,
    pub end: f64,
}

impl Default for SlgParams {
    fn default() -> Self {
        SlgParams { scale: 0.0, layers: vec![7, 8, 9], start: 0.01, end: 0.2 }
    }
}

/// sd-cli's Chroma flags, with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ChromaParams {
    pub dit_mask: bool,
    pub t5_mask: bool,
    pub t5_mask_pad: i64,
}

impl Default for ChromaParams {
    fn default() -> Self {
        ChromaParams { dit_mask: true, t5_mask: false, t5_mask_pad: 1 }
    }
}

impl Default for ImgGenParams {
    fn default() -> Self {
        ImgGenParams {
            model: None,
            diffusion_model: None,
            clip_l: None,
            clip_g: None,
            vae: None,
            taesd: None,
            photo_maker: None,
            pm_id_images_dir: None,
            pm_id_embed_path: None,
            pm_style_strength: 20.0,
            control_net: None,
            control_image: None,
            control_strength: 0.9,
            controls: Vec::new(),
            canny: false,
            upscale_model: None,
            upscale_repeats: 1,
            upscale_tile_size: 128,
            ad_model: None,
            extra_ad_args: None,
            ad_prompt: String::new(),
            ad_negative_prompt: String::new(),
            prompt: String::new(),
            negative_prompt: String::new(),
            zero_empty_negative: false,
            lora_files: BTreeMap::new(),
            lora_apply_mode: None,
            rng: None,
            width: 512,
            height: 512,
            size_given: false,
            steps: 20,
            cfg_scale: 7.0,
            sampling_method: None,
            scheduler: None,
            prediction: None,
            eta: None,
            sigmas: None,
            seed: 42,
            batch_count: 1,
            variation: None,
            refiner: None,
            a1111: None,
            init_img: None,
            end_img: None,
            clip_vision: None,
            control_video: None,
            vace_strength: 1.0,
            mask: None,
            strength: 0.75,
            clip_skip: -1,
            img_cfg_scale: None,
            hires: HiresParams::default(),
            tiling: TilingParams::default(),
            circular_x: false,
            circular_y: false,
            output: "./output.png".into(),
            model_info: ModelInfo::default(),
            t5xxl: None,
            llm: None,
            llm_vision: None,
            guidance: 3.5,
            flow_shift: None,
            slg: SlgParams::default(),
            ref_images: Vec::new(),
            ref_sizes: Vec::new(),
            increase_ref_index: false,
            auto_resize_ref_image: true,
            ref_options: RefOptions::default(),
            chroma: ChromaParams::default(),
            qwen_zero_cond_t: false,
            qwen_image_layers: 3,
            video: None,
        }
    }
}

/// sd-cli's `upscale` mode: an image through an ESRGAN-style model, `repeats` times.
#[derive(Debug, Clone, PartialEq)]
pub struct UpscaleParams {
    pub init_img: String,
    pub upscale_model: String,
    pub upscale_repeats: i64,
    /// `--upscale-tile-size` (128).
    pub tile_size: i64,
    pub output: String,
}

/// `sdflow adetailer`: re-sample what a detector finds in an existing image.
#[derive(Debug, Clone, PartialEq)]
pub struct AdetailerParams {
    pub model: String,
    pub init_img: String,
    pub ad_model: String,
    pub extra_ad_args: Option<String>,
    /// `--ad-prompt`, `--ad-negative-prompt` (empty: `-p`, `-n`).
    pub ad_prompt: String,
    pub ad_negative_prompt: String,
    pub prompt: String,
    pub negative_prompt: String,
    /// `-W`, `-H`: resize the input first; the detail pass works at the (resized)
    /// image's size either way, as sd-cli's adetailer mode.
    pub width: Option<i64>,
    pub height: Option<i64>,
    pub steps: i64,
    pub cfg_scale: f64,
    pub sampling_method: Option<String>,
    pub scheduler: Option<String>,
    /// `--prediction`, `--eta`, `--rng`: as [`ImgGenParams`]'.
    pub prediction: Option<String>,
    pub eta: Option<f64>,
    pub rng: Option<String>,
    pub seed: i64,
    pub strength: f64,
    pub output: String,
}
