//! sdflow-nodes: the node types users put in workflows, grouped by kind.
//!
//! Nodes are thin: they parse their inputs, call into `sdflow-core` (models, sampling,
//! text) and wrap the results as typed values. Everything they share — the residency
//! manager, the compute backend, where models and outputs live — is in one [`Runtime`]
//! given at registration.
//!
//! - [`loaders`]: CheckpointLoaderSimple, UNETLoader, CLIPLoader, DualCLIPLoader, VAELoader
//! - [`loaders::lora`]: LoraLoader, LoraLoaderModelOnly
//! - [`conditioning`]: CLIPTextEncode, CLIPSetLastLayer, ConditioningCombine, ConditioningConcat,
//!   ConditioningAverage, ConditioningZeroOut, ConditioningSetTimestepRange
//! - [`image::latent`]: EmptyLatentImage, EmptySD3LatentImage, SetLatentNoiseMask, LatentUpscale, LatentUpscaleBy
//! - [`sampling`]: KSampler
//! - [`sampling::custom_sampling`]: KSamplerAdvanced, SamplerCustom(Advanced), KSamplerSelect,
//!   KSamplerSelectAdvanced, SamplerEulerAncestral(CFGPP), SamplerDPMPP_2S_Ancestral, SamplerLMS,
//!   BasicScheduler, KarrasScheduler, ExponentialScheduler, ManualSigmas, SplitSigmas, RandomNoise,
//!   DisableNoise, CFGGuider, BasicGuider
//! - [`sampling::model_sampling`]: ModelSamplingDiscrete, ModelSamplingContinuousEDM, ModelSamplingFlux,
//!   ModelSamplingSD3, ModelSamplingAuraFlow
//! - [`conditioning::flux`]: CLIPTextEncodeFlux, FluxGuidance, ReferenceLatent, FluxKontextImageScale,
//!   FluxKontextMultiReferenceLatentMethod
//! - [`conditioning::sd3`]: TripleCLIPLoader, CLIPTextEncodeSD3, SkipLayerGuidanceSD3, SkipLayerGuidanceDiT
//! - [`conditioning::chroma`]: T5TokenizerOptions (and Chroma's T5-only conditioning)
//! - [`conditioning::llm`]: the LLM text encoders' conditioning (Z-Image's Qwen3-4B, CLIPLoader type `lumina2`)
//! - [`image`]: LoadImage, LoadImageMask, ImageScale, VAEDecode, VAEEncode, VAEEncodeForInpaint,
//!   SaveImage, PreviewImage, VAEDecodeTiled, VAEEncodeTiled, ImageCrop, ImageInvert, EmptyImage
//! - [`image::mask`]: SolidMask, InvertMask, CropMask, MaskComposite, FeatherMask, GrowMask, ThresholdMask,
//!   ImageToMask, MaskToImage, ImageCompositeMasked, ImagePadForOutpaint
//! - [`image::upscale`]: UpscaleModelLoader, ImageUpscaleWithModel (ESRGAN / Real-ESRGAN), ImageScaleBy
//! - [`detailer::detect`]: UltralyticsDetectorProvider (YOLOv8), BboxDetectorMasks (ADetailer's masks)
//! - [`detailer`]: DetailerForEachMask (ADetailer's crop, inpaint and paste back per mask)
//! - [`conditioning::ip_adapter`]: CLIPVisionLoader, CLIPVisionEncode, IPAdapterModelLoader, IPAdapterAdvanced
//! - [`conditioning::pix2pix`]: InstructPixToPixConditioning, InpaintModelConditioning, DualCFGGuider,
//!   ConditioningClearImage
//! - [`conditioning::controlnet`]: ControlNetLoader, ControlNetApplyAdvanced, ControlNetApply, Canny
//! - [`image::transform`]: GetImageSize, ImageScaleToTotalPixels, ImageScaleToMaxDimension, ImageStitch,
//!   ImageFromBatch, ResizeAndPadImage, JoinImageWithAlpha, MaskPreview
//! - [`sampling::turbo`]: SDTurboScheduler, SetFirstSigma
//! - [`utils::primitive`]: PrimitiveInt, PrimitiveFloat, PrimitiveString, PrimitiveStringMultiline,
//!   PrimitiveBoolean
//! - [`utils::string`]: StringConcatenate, StringSubstring, StringLength, CaseConverter, StringTrim,
//!   StringReplace, StringContains, StringCompare, RegexMatch, RegexExtract, RegexReplace
//! - [`utils::logic`]: ComfySwitchNode, PreviewAny
//! - [`sampling::differential`]: DifferentialDiffusion
//! - [`sampling::cfg_hooks`]: RescaleCFG, CFGNorm, CFGZeroStar, LatentApplyOperation, LatentApplyOperationCFG,
//!   LatentOperationTonemapReinhard, LatentOperationSharpen
//! - [`sampling::sigmas`]: PolyexponentialScheduler, LaplaceScheduler, VPScheduler, BetaSamplingScheduler,
//!   FlipSigmas, SplitSigmasDenoise, ExtendIntermediateSigmas, SamplingPercentToSigma, AddNoise
//! - [`image::latent_ops`]: LatentAdd, LatentSubtract, LatentMultiply, LatentInterpolate, LatentConcat,
//!   LatentCut, LatentBatch, LatentBatchSeedBehavior, LatentFromBatch, RepeatLatentBatch, LatentComposite,
//!   LatentBlend, LatentFlip, LatentRotate, LatentCrop, LatentCompositeMasked
//! - [`image::seamless`]: SeamlessTile, MakeCircularVAE, CircularVAEDecode, OffsetImage (ComfyUI-seamless-tiling)
//! - [`image::postprocess`]: ImageBlend, ImageBlur, ImageSharpen, ImageBatch, RepeatImageBatch, ImageFlip,
//!   ImageRotate, ImageAddNoise, ImageColorToMask, PorterDuffImageComposite, SplitImageWithAlpha

pub mod conditioning;
pub mod detailer;
pub mod image;
pub mod loaders;
pub mod runtime;
pub mod sampling;
pub mod utils;
pub mod values;
pub mod video;

pub use runtime::{Place, Runtime};

use sdflow_executor::Registry;
use std::sync::Arc;

/// Register every node type this crate defines.
pub fn register_all(registry: &mut Registry, rt: Arc<Runtime>) {
    loaders::register(registry, &rt);
    loaders::lora::register(registry, &rt);
    conditioning::register(registry, &rt);
    conditioning::flux::register(registry, &rt);
    conditioning::sd3::register(registry, &rt);
    conditioning::chroma::register(registry);
    conditioning::qwen::register(registry, &rt);
    conditioning::sdcpp::register(registry);
    conditioning::wan::register(registry, &rt);
    image::latent::register(registry, &rt);
    sampling::register(registry, &rt);
    sampling::custom_sampling::register(registry, &rt);
    image::register(registry, &rt);
    image::mask::register(registry);
    image::a1111::register(registry, &rt);
    sampling::model_sampling::register(registry);
    conditioning::pix2pix::register(registry, &rt);
    conditioning::controlnet::register(registry, &rt);
    image::upscale::register(registry, &rt);
    detailer::detect::register(registry, &rt);
    detailer::register(registry, &rt);
    conditioning::ip_adapter::register(registry, &rt);
    conditioning::photomaker::register(registry, &rt);
    image::transform::register(registry, &rt);
    sampling::turbo::register(registry);
    sampling::differential::register(registry);
    sampling::cfg_hooks::register(registry);
    sampling::sigmas::register(registry, &rt);
    image::latent_ops::register(registry);
    image::postprocess::register(registry);
    utils::register(registry);
    video::register(registry, &rt);
}

/// Turns any displayable error into the executor's node error.
pub(crate) fn err(e: impl std::fmt::Display) -> sdflow_executor::NodeError {
    sdflow_executor::NodeError::msg(e.to_string())
}
