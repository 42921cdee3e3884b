//! The typed values on links between these nodes.

use sdflow_core::detect::ModelFamily;
use sdflow_core::models::clip::ClipLayout;
use sdflow_core::models::conditioning::{Conditioning, Prediction};
use sdflow_core::models::Weights;
pub use sdflow_core::ggml::Circular;
use sdflow_core::residency::WeightHandle;
use sdflow_core::sampling::flow::FlowShift;
use sdflow_core::sampling::schedule::DiscreteSchedule;
use sdflow_executor::CacheSize;
use std::sync::Arc;

/// MODEL: the diffusion model of a checkpoint, as a residency handle.
#[derive(Clone, Debug)]
pub struct ModelRef {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    pub family: ModelFamily,
    pub prediction: Prediction,
    /// How the family's VAE latent maps into the space the model samples in.
    pub latent: LatentFormat,
    /// The model's noise levels: SD's discrete table, EDM's log-uniform range, or a flow
    /// model's σ(t) table.
    pub schedule: DiscreteSchedule,
    /// A flow model's shift (with [`Prediction::Flow`]): its σ(t) and percent→σ map.
    pub flow: Option<FlowShift>,
    /// IP-Adapters applied to the model (IPAdapterAdvanced), in the order applied.
    pub ip_adapters: Vec<Arc<IpAdapterPatch>>,
    /// AnimateDiff's motion modules (ADE_AnimateDiffLoaderGen1): the latent batch samples
    /// as the frames of one video.
    pub motion: Option<Arc<MotionModuleRef>>,
    /// Skip-layer guidance (SkipLayerGuidanceSD3) on an MMDiT.
    pub slg: Option<SkipLayerGuidance>,
    /// Differential Diffusion (ComfyUI's `denoise_mask_function`): how the inpainting
    /// noise mask is thresholded at each model call.
    pub differential_diffusion: Option<DifferentialDiffusion>,
    /// ComfyUI's sampler hooks on the model (RescaleCFG, CFGNorm, CFGZeroStar,
    /// LatentApplyOperationCFG): how the side predictions become one at each model call.
    pub cfg_hooks: CfgHooks,
    /// Seamless tiling (SeamlessTile, sd-cli's `--circular*`): the axes on which the
    /// UNet's (and its ControlNets') convolutions pad circularly, or FLUX's and Chroma's
    /// rotary positions wrap around.
    pub circular: Circular,
}

/// ComfyUI's `latent_format` scaling: the model sees `(latent − shift) · scale`, with one
/// scale and shift for every channel (SD's 0.18215; FLUX's 0.3611 and 0.1159) or one per
/// channel (Qwen-Image's and Wan's `latents_mean` / `1 / latents_std`). Latents are
/// [W, H, C, N] (ggml order), so element `i` of a latent with `plane = W·H` is in channel
/// `(i / plane) % C`.
#[derive(Clone, Debug, PartialEq)]
pub struct LatentFormat {
    scale: Vec<f32>,
    shift: Vec<f32>,
}

impl LatentFormat {
    pub fn uniform(scale: f32, shift: f32) -> Self {
        LatentFormat { scale: vec![scale], shift: vec![shift] }
    }

    /// Per-channel statistics: the model sees `(latent − mean) / std`.
    pub fn per_channel(mean: &[f32], std: &[f32]) -> Self {
        debug_assert_eq!(mean.len(), std.len());
        LatentFormat { scale: std.iter().map(|s| 1.0 / s).collect(), shift: mean.to_vec() }
    }

    /// Channels this format is made for (`None`: any).
    pub fn channels(&self) -> Option<usize> {
        (self.scale.len() > 1).then_some(self.scale.len())
    }

    fn at(&self, idx: usize, plane: usize) -> (f32, f32) {
        if self.scale.len() == 1 {
            return (self.scale[0], self.shift[0]);
        }
        let c = (idx / plane.max(1)) % self.scale.len();
        (self.scale[c], self.shift[c])
    }

    /// A latent (planes of `plane` values, channel after channel) in model space.
    pub fn to_model(&self, v: &[f32], plane: usize) -> Vec<f32> {
        v.iter().enumerate().map(|(i, &x)| {
            let (k, s) = self.at(i, plane);
            (x - s) * k
        }).collect()
    }

    /// A model-space latent back in the VAE's space, first multiplied by `keep`.
    pub fn from_model(&self, v: &[f32], plane: usize, keep: f32) -> Vec<f32> {
        v.iter().enumerate().map(|(i, &x)| {
            let (k, s) = self.at(i, plane);
            x * keep / k + s
        }).collect()
    }

    /// One model-space value of element `idx` back in the VAE's space.
    pub fn value_from_model(&self, x: f32, idx: usize, plane: usize) -> f32 {
        let (k, s) = self.at(idx, plane);
        x / k + s
    }

    /// One VAE-space value of element `idx` in model space.
    pub fn value_to_model(&self, x: f32, idx: usize, plane: usize) -> f32 {
        let (k, s) = self.at(idx, plane);
        (x - s) * k
    }

    /// The multiplier alone (per channel where the format has channels).
    pub fn scale_at(&self, idx: usize, plane: usize) -> f32 {
        self.at(idx, plane).0
    }
}

/// The guidance hooks of ComfyUI's `model_options`, applied at every model call as its
/// `sampling_function` and `cfg_function` do: the pre-CFG functions on the side
/// predictions, then the CFG function in place of plain CFG, then the post-CFG functions
/// on the result, each list in the order the nodes were applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CfgHooks {
    /// `sampler_pre_cfg_function`s: LatentApplyOperationCFG's operations.
    pub pre: Vec<LatentOperation>,
    /// `sampler_cfg_function` (the last set wins): RescaleCFG's multiplier.
    pub rescale: Option<f32>,
    /// `sampler_post_cfg_function`s.
    pub post: Vec<PostCfgHook>,
}

impl CfgHooks {
    pub fn is_empty(&self) -> bool {
        self.pre.is_empty() && self.rescale.is_none() && self.post.is_empty()
    }
}

/// One post-CFG function and where it stands against skip-layer guidance (which sdflow
/// keeps in [`ModelRef::slg`], itself a post-CFG function in ComfyUI): `after_slg` when
/// the MODEL already had skip-layer guidance when this hook was added.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PostCfgHook {
    pub kind: PostCfg,
    pub after_slg: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PostCfg {
    /// CFGNorm: the result scaled per pixel so its channel norm stays within the positive
    /// prediction's, times `strength`.
    Norm { strength: f32 },
    /// CFGZeroStar: the unconditional prediction rescaled by its projection onto the
    /// conditional one (CFG-Zero*).
    ZeroStar,
}

/// LATENT_OPERATION: a function on a latent batch (ComfyUI's LatentOperation nodes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatentOperation {
    /// LatentOperationTonemapReinhard.
    TonemapReinhard { multiplier: f32 },
    /// LatentOperationSharpen.
    Sharpen { radius: usize, sigma: f64, alpha: f64 },
}

/// ComfyUI's DifferentialDiffusion patch: at each model call the noise mask becomes
/// `mask >= threshold`, the threshold falling from 1 at the schedule's first σ to 0 at its
/// last (or the model's σ_min), measured in the model's timesteps; with `strength` in
/// (0, 1) that binary mask is mixed with the mask itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DifferentialDiffusion {
    pub strength: f32,
}

/// Skip-layer guidance as ComfyUI's SkipLayerGuidanceDiT applies it after CFG: while σ is
/// within `percents`, the positive side runs again with the blocks `layers` left out, and
/// the result moves by `scale · (cond − cond_skipped)`, then, with `rescaling` r, is
/// scaled by `r · std(cond)/std(result) + 1 − r`.
#[derive(Clone, Debug, PartialEq)]
pub struct SkipLayerGuidance {
    pub layers: sdflow_core::models::dit::SkipLayers,
    pub scale: f32,
    pub rescaling: f32,
    /// ComfyUI's start_percent / end_percent: fractions of sampling, mapped through the
    /// model's own percent→σ when sampling starts, or read as sd.cpp reads them.
    pub percents: (f32, f32),
    pub window: SlgWindow,
}

/// How skip-layer guidance's start and end select the steps it runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlgWindow {
    /// ComfyUI: σ between the model's σ at start and at end.
    Sigmas,
    /// sd.cpp: the steps k (from 1) with `⌊start·(steps+1)⌋ < k < ⌊end·(steps+1)⌋`,
    /// whatever the schedule (sd-cli's --skip-layer-start/end).
    Steps,
}

/// One IP-Adapter on a MODEL: the adapter's weights (shared through the residency
/// manager) and the image tokens it feeds the cross-attentions.
#[derive(Debug)]
pub struct IpAdapterPatch {
    pub weights: WeightHandle<Weights>,
    /// Image tokens, `tokens` rows of the UNet's context width, for the positive side.
    pub cond: Vec<f32>,
    /// The same for the negative side (the unconditional image embedding's).
    pub uncond: Vec<f32>,
    pub tokens: i64,
    pub weight: f32,
    /// ComfyUI's start_at / end_at: fractions of the schedule where the adapter acts.
    pub start_at: f32,
    pub end_at: f32,
}

/// CLIP_VISION: a CLIP image tower, as a residency handle.
#[derive(Clone, Debug)]
pub struct ClipVisionRef {
    pub weights: WeightHandle<Weights>,
    pub name: String,
}

/// IPADAPTER: an IP-Adapter file's weights, as a residency handle.
#[derive(Clone, Debug)]
pub struct IpAdapterRef {
    pub weights: WeightHandle<Weights>,
    pub name: String,
}

/// CLIP_VISION_OUTPUT: per image, the projected class token (`image_embeds`) and the
/// hidden states before the last layer (`penultimate_hidden_states`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClipVisionOutput {
    /// [n][projection_dim].
    pub image_embeds: Vec<f32>,
    /// [n][tokens][hidden].
    pub penultimate: Vec<f32>,
    pub n: usize,
    pub projection_dim: usize,
    pub hidden: usize,
    pub tokens: usize,
}

impl CacheSize for ClipVisionOutput {
    fn cache_bytes(&self) -> usize {
        (self.image_embeds.len() + self.penultimate.len()) * 4
    }
}

/// CLIP: the text encoders of a model family (SD1/SD2: one; SDXL: CLIP-L then
/// OpenCLIP-G; FLUX: CLIP-L and T5-XXL), with the clip-skip set by CLIPSetLastLayer
/// (`None`: the family's default).
#[derive(Clone, Debug)]
pub struct ClipRef {
    pub encoders: Vec<ClipEncoder>,
    /// The T5 encoder of the DiT families.
    pub t5: Option<T5Ref>,
    /// The LLM encoder of the families that read one (Z-Image's Qwen3-4B).
    pub llm: Option<LlmRef>,
    pub family: ModelFamily,
    pub clip_skip: Option<u32>,
    /// SdCppConditioner: encode prompts as stable-diffusion.cpp does; `None`: ComfyUI's way.
    pub sdcpp: Option<SdCppText>,
    /// Where the encoders compute: the text encoder module's placement, or the CPU when the
    /// loader's `device` input says so.
    pub place: crate::runtime::Place,
}

/// sd.cpp's text conditioning for the DiT families (the sd-cli presets ask for it): T5 in
/// chunks encoded alone (FLUX 256 tokens, SD3 77 interleaved with CLIP's chunks, Chroma
/// 512), A1111 weights rescaled to each chunk's mean, and Chroma's masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdCppText {
    /// Chroma: the DiT attends to the prompt, `</s>` and `t5_mask_pad` pads only.
    pub chroma_dit_mask: bool,
    /// Chroma: T5 itself does not attend to the padding.
    pub chroma_t5_mask: bool,
    pub chroma_t5_mask_pad: usize,
}

/// An LLM encoder of a [`ClipRef`], in Hugging Face names under `prefix` (without the
/// `layers.`), and the family whose prompt template and hidden states it gives.
#[derive(Clone, Debug)]
pub struct LlmRef {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    pub family: sdflow_core::models::llm::prompt::Family,
    /// Qwen2.5-VL's vision tower from the same file (Qwen-Image-Edit's image prompts):
    /// its weights and prefix (`visual.`).
    pub vision: Option<(WeightHandle<Weights>, String)>,
}

/// A T5 encoder of a [`ClipRef`], in Hugging Face names under `prefix`.
#[derive(Clone, Debug)]
pub struct T5Ref {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    /// ComfyUI's T5TokenizerOptions: `<pad>` tokens after `</s>` and the least length,
    /// in place of the family's own padding.
    pub options: Option<T5Options>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct T5Options {
    pub min_padding: usize,
    pub min_length: usize,
}

/// One text encoder of a [`ClipRef`].
#[derive(Clone, Debug)]
pub struct ClipEncoder {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    pub layout: ClipLayout,
    /// Final layers the file left out of the original encoder (diffusers' SD2 text
    /// encoder has 23 of OpenCLIP-H's 24): clip skip counts from the original's top.
    pub dropped_layers: usize,
}

/// VAE.
#[derive(Clone, Debug)]
pub struct VaeRef {
    pub weights: WeightHandle<Weights>,
    pub prefix: String,
    pub kind: VaeKind,
    /// Seamless tiling (MakeCircularVAE, CircularVAEDecode, sd-cli's `--circular*`): the
    /// axes on which its convolutions pad circularly, encoding and decoding.
    pub circular: Circular,
}

/// Which autoencoder architecture a [`VaeRef`] holds; VAE nodes dispatch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaeKind {
    /// The KL autoencoder (`AutoencoderKL`) in LDM key names under the handle's prefix.
    Kl,
    /// The Wan-2.1 VAE (Qwen-Image's) in the Wan release's names under the handle's prefix,
    /// its causal 3-D kernels read for single images.
    Wan,
    /// A tiny autoencoder (VAELoader's `taesd`, `taesdxl`, `taesd3`, `taef1`), wherever
    /// `crate::loaders::taesd` finds its halves in the handle's weights.
    Taesd(crate::loaders::taesd::TaeKind),
}

// Handles are owned by the residency manager (and small settings cost next to nothing):
// they count nothing against the output cache.
#[macro_export]
#[doc(hidden)]
macro_rules! handle_size {
    ($($t:ty),*) => {$(
        impl sdflow_executor::CacheSize for $t {
            fn cache_bytes(&self) -> usize {
                0
            }
        }
    )*};
}
handle_size!(ClipRef, VaeRef, ClipVisionRef, IpAdapterRef, LatentOperation);

impl CacheSize for ModelRef {
    /// The weights are the residency manager's; IP-Adapter image tokens are the model's own.
    fn cache_bytes(&self) -> usize {
        self.ip_adapters.iter().map(|p| (p.cond.len() + p.uncond.len()) * 4).sum()
    }
}

/// An AnimateDiff motion-module file on a MODEL, as a residency handle (tensors under
/// `motion_module.` in the original names).
#[derive(Clone, Debug)]
pub struct MotionModuleRef {
    pub weights: WeightHandle<Weights>,
    pub name: String,
    /// Where the UNet's GroupNorms take their statistics for a v1 module.
    pub v1_groupnorm: V1GroupNorm,
}

/// How a v1 motion module's UNet normalises (v2 and v3 always per frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V1GroupNorm {
    /// Over each video's frames together, as v1 was trained (AnimateDiff-Evolved).
    AcrossFrames,
    /// Per frame, as sd.cpp runs every version.
    PerFrame,
}

impl MotionModuleRef {
    /// Whether the GroupNorms span the frames for modules of `config`.
    pub fn norm_across_frames(&self, config: &sdflow_core::models::sd::motion::MotionConfig) -> bool {
        config.is_v1() && self.v1_groupnorm == V1GroupNorm::AcrossFrames
    }
}

/// UPSCALE_MODEL: an ESRGAN-family upscaler (RRDBNet or SRVGGNetCompact), as a residency
/// handle.
#[derive(Clone, Debug)]
pub struct UpscaleModelRef {
    pub weights: WeightHandle<sdflow_core::models::esrgan::Upscaler>,
    pub name: String,
}
handle_size!(UpscaleModelRef);

/// CONTROL_NET: a ControlNet file's weights (renamed to `control_model.*` LDM names) as a
/// residency handle.
#[derive(Clone, Debug)]
pub struct ControlNetRef {
    pub weights: WeightHandle<Weights>,
    pub name: String,
}
handle_size!(ControlNetRef);

/// ComfyUI's `control` of a conditioning entry: a ControlNet with its hint image,
/// strength and schedule range, stacked on the control the entry had before.
#[derive(Clone, Debug)]
pub struct Control {
    pub net: ControlNetRef,
    /// The hint (IMAGE, 0..1), resized to each evaluated region when sampling.
    pub image: Arc<Image>,
    pub strength: f32,
    /// `start_percent`, `end_percent`.
    pub range: (f32, f32),
    /// The entry's control before this one was applied: its residuals add to these.
    pub previous: Option<Arc<Control>>,
    /// ComfyUI's `control_apply_to_uncond` (the old ControlNetApply): the negative's
    /// entries without a control of their own get this one too.
    pub apply_to_uncond: bool,
}

impl Control {
    /// This control and the ones stacked under it, newest first.
    pub fn chain(self: &Arc<Self>) -> impl Iterator<Item = &Arc<Control>> {
        std::iter::successors(Some(self), |c| c.previous.as_ref())
    }
}

/// CONDITIONING: ComfyUI's list of (embedding, options) entries.
#[derive(Clone, Debug)]
pub struct CondList(pub Vec<CondEntry>);

#[derive(Clone, Debug)]
pub struct CondEntry {
    pub cond: Arc<Conditioning>,
    /// ComfyUI's `start_percent`/`end_percent` (ConditioningSetTimestepRange): the entry
    /// guides only while sampling is between these fractions of the schedule.
    pub timestep_range: Option<(f32, f32)>,
    /// sd.cpp's PhotoMaker switch, by sampling step: with `(a, b)` the entry guides the
    /// steps `i` (0-based, of `n`) with `floor(a·n) <= i < floor(b·n)` (`b` = 1: to the end).
    pub step_range: Option<(f32, f32)>,
    /// ComfyUI's `area` (ConditioningSetArea / …Percentage): the model runs on this part
    /// of the latent only, and its prediction is blended in with feathered edges.
    pub area: Option<CondArea>,
    /// ComfyUI's `strength`: the weight of this entry's prediction where it applies.
    pub strength: f32,
    /// ComfyUI's `mask` (ConditioningSetMask): per-pixel weights of the prediction.
    pub mask: Option<CondMask>,
    /// What the extra input channels of inpainting / instruct-pix2pix UNets get.
    pub concat: CondConcat,
    /// ComfyUI's `control`: the ControlNet(s) this entry's model evaluations run with.
    pub control: Option<Arc<Control>>,
}

/// An area in latent cells (ComfyUI stores pixel areas divided by 8) or as fractions of
/// the latent, resolved when sampling starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CondArea {
    Cells { height: i64, width: i64, y: i64, x: i64 },
    Fraction { height: f64, width: f64, y: f64, x: f64 },
}

#[derive(Clone, Debug)]
pub struct CondMask {
    pub mask: Arc<Mask>,
    /// ComfyUI's `mask_strength`.
    pub strength: f32,
    /// ComfyUI's `set_area_to_bounds` ("mask bounds"): run the model only on the
    /// bounding box of the mask.
    pub area_to_bounds: bool,
}

/// The extra UNet input channels an entry brings.
#[derive(Clone, Debug, Default)]
pub enum CondConcat {
    /// The model's own: for inpainting UNets the noise mask and the latent being
    /// sampled, for instruct-pix2pix zeros (ComfyUI's behaviour without
    /// `concat_latent_image`).
    #[default]
    Model,
    /// ComfyUI's `concat_latent_image` (InstructPixToPixConditioning): a VAE latent
    /// (not yet scaled) of the source image.
    Image(Arc<Latent>),
    /// sd.cpp's unconditional extra channels: zeros, and a mask of ones for
    /// inpainting UNets. The negative of sd.cpp's image-CFG three-way guidance.
    Empty,
    /// ComfyUI's `concat_latent_image` and `concat_mask` (InpaintModelConditioning): the
    /// masked image's VAE latent (not yet scaled) and the mask at pixel resolution, for
    /// inpainting UNets and FLUX Fill.
    Inpaint { image: Arc<Latent>, mask: Arc<Mask> },
}

impl CondEntry {
    pub fn new(cond: Conditioning) -> Self {
        CondEntry { cond: Arc::new(cond), timestep_range: None, step_range: None, area: None, strength: 1.0, mask: None, concat: CondConcat::Model, control: None }
    }

    /// This entry's options with another embedding (what ComfyUI's list operations
    /// keep when they change `cond`).
    pub fn with_cond(&self, cond: Conditioning) -> Self {
        CondEntry { cond: Arc::new(cond), ..self.clone() }
    }
}

impl CacheSize for CondList {
    fn cache_bytes(&self) -> usize {
        self.0
            .iter()
            .map(|e| {
                let concat = match &e.concat {
                    CondConcat::Image(l) => l.samples.len(),
                    CondConcat::Inpaint { image, mask } => image.samples.len() + mask.data.len(),
                    _ => 0,
                };
                let hints: usize = e.control.iter().flat_map(|c| c.chain()).map(|c| c.image.data.len()).sum();
                (e.cond.data.len() + e.mask.as_ref().map_or(0, |m| m.mask.data.len()) + concat + hints) * 4
            })
            .sum()
    }
}

/// LATENT: VAE-space latents (not yet multiplied by the latent scale), dimensions
/// [W, H, C, N] in ggml order, i.e. NCHW in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Latent {
    pub samples: Vec<f32>,
    pub shape: [i64; 4],
    /// Where sampling may change the latent (1) and where it must keep it (0), at any
    /// resolution (resized to the latent when sampling), as ComfyUI's `noise_mask`.
    pub noise_mask: Option<Arc<Mask>>,
    /// ComfyUI's `batch_index`: for each sample, the place in a seed's sequence of
    /// per-sample noises it takes (LatentFromBatch, RepeatLatentBatch, LatentBatch set it),
    /// so a sample taken out of a batch is noised as it was in the batch. `None`: the
    /// whole batch's noise is drawn at once.
    pub batch_index: Option<Vec<usize>>,
    /// Frames per sample (1 for images): ComfyUI's [B, C, T, H, W] latents keep their
    /// frames inside the channels, `shape[2]` = C·T with each channel's T planes
    /// together, the same memory order. Qwen-Image-Layered's layers are frames.
    pub frames: usize,
}

impl Latent {
    /// A latent of single frames with no noise mask and no batch indices.
    pub fn new(samples: Vec<f32>, shape: [i64; 4]) -> Self {
        Latent { samples, shape, noise_mask: None, batch_index: None, frames: 1 }
    }

    /// The latent's channels per frame.
    pub fn channels(&self) -> i64 {
        self.shape[2] / self.frames.max(1) as i64
    }
}

impl CacheSize for Latent {
    fn cache_bytes(&self) -> usize {
        (self.samples.len() + self.noise_mask.as_ref().map_or(0, |m| m.data.len())) * 4
    }
}

/// IMAGE: ComfyUI's layout, [N, H, W, C] floats in 0..=1.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    pub data: Vec<f32>,
    pub n: usize,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

impl CacheSize for Image {
    fn cache_bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// MASK: [N, H, W] floats in 0..=1 (1 = masked).
#[derive(Clone, Debug, PartialEq)]
pub struct Mask {
    pub data: Vec<f32>,
    pub n: usize,
    pub height: usize,
    pub width: usize,
}

impl CacheSize for Mask {
    fn cache_bytes(&self) -> usize {
        self.data.len() * 4
    }
}

impl Mask {
    /// Bilinear resize of sample `i` (the last one when the mask has fewer samples) to
    /// `w`×`h`, with half-pixel centres like `torch.nn.functional.interpolate`.
    pub fn resized(&self, i: usize, w: usize, h: usize) -> Vec<f32> {
        let i = i.min(self.n.saturating_sub(1));
        let src = &self.data[i * self.height * self.width..(i + 1) * self.height * self.width];
        let (sw, sh) = (self.width as f32, self.height as f32);
        let mut out = Vec::with_capacity(w * h);
        for y in 0..h {
            let fy = ((y as f32 + 0.5) * sh / h as f32 - 0.5).clamp(0.0, sh - 1.0);
            let (y0, dy) = (fy.floor() as usize, fy - fy.floor());
            let y1 = (y0 + 1).min(self.height - 1);
            for x in 0..w {
                let fx = ((x as f32 + 0.5) * sw / w as f32 - 0.5).clamp(0.0, sw - 1.0);
                let (x0, dx) = (fx.floor() as usize, fx - fx.floor());
                let x1 = (x0 + 1).min(self.width - 1);
                let p = |yy: usize, xx: usize| src[yy * self.width + xx];
                out.push(p(y0, x0) * (1.0 - dy) * (1.0 - dx) + p(y0, x1) * (1.0 - dy) * dx + p(y1, x0) * dy * (1.0 - dx) + p(y1, x1) * dy * dx);
            }
        }
        out
    }
}
