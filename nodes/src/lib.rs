//! sdflow-nodes: the node types users put in workflows, grouped by kind.
//!
//! Nodes are thin: they parse their inputs, call into `sdflow-core` (models, sampling,
//! text) and wrap the results as typed values. Everything they share — the residency
//! manager, the compute backend, where models and outputs live — is in one [`Runtime`]
//! given at registration.
//!
//! - [`loaders`]: CheckpointLoaderSimple, UNETLoader, CLIPLoader, DualCLIPLoader, VAELoader
//! - [`lora`]: LoraLoader, LoraLoaderModelOnly
//! - [`conditioning`]: CLIPTextEncode, CLIPSetLastLayer, ConditioningCombine, ConditioningConcat,
//!   ConditioningAverage, ConditioningZeroOut, ConditioningSetTimestepRange
//! - [`latent`]: EmptyLatentImage, EmptySD3LatentImage, SetLatentNoiseMask, LatentUpscale, LatentUpscaleBy
//! - [`sampling`]: KSampler
//! - [`custom_sampling`]: KSamplerAdvanced, SamplerCustom(Advanced), KSamplerSelect,
//!   KSamplerSelectAdvanced, SamplerEulerAncestral(CFGPP), SamplerDPMPP_2S_Ancestral, SamplerLMS,
//!   BasicScheduler, KarrasScheduler, ExponentialScheduler, ManualSigmas, SplitSigmas, RandomNoise,
//!   DisableNoise, CFGGuider, BasicGuider
//! - [`model_sampling`]: ModelSamplingDiscrete, ModelSamplingContinuousEDM, ModelSamplingFlux,
//!   ModelSamplingSD3, ModelSamplingAuraFlow
//! - [`flux`]: CLIPTextEncodeFlux, FluxGuidance, ReferenceLatent, FluxKontextImageScale,
//!   FluxKontextMultiReferenceLatentMethod
//! - [`sd3`]: TripleCLIPLoader, CLIPTextEncodeSD3, SkipLayerGuidanceSD3, SkipLayerGuidanceDiT
//! - [`chroma`]: T5TokenizerOptions (and Chroma's T5-only conditioning)
//! - [`image`]: LoadImage, LoadImageMask, ImageScale, VAEDecode, VAEEncode, VAEEncodeForInpaint,
//!   SaveImage, PreviewImage, VAEDecodeTiled, VAEEncodeTiled, ImageCrop, ImageInvert, EmptyImage
//! - [`mask`]: SolidMask, InvertMask, CropMask, MaskComposite, FeatherMask, GrowMask, ThresholdMask,
//!   ImageToMask, MaskToImage, ImageCompositeMasked, ImagePadForOutpaint
//! - [`upscale`]: UpscaleModelLoader, ImageUpscaleWithModel (ESRGAN / Real-ESRGAN), ImageScaleBy
//! - [`detect`]: UltralyticsDetectorProvider (YOLOv8), BboxDetectorMasks (ADetailer's masks)
//! - [`detailer`]: DetailerForEachMask (ADetailer's crop, inpaint and paste back per mask)
//! - [`ip_adapter`]: CLIPVisionLoader, CLIPVisionEncode, IPAdapterModelLoader, IPAdapterAdvanced
//! - [`pix2pix`]: InstructPixToPixConditioning, InpaintModelConditioning, DualCFGGuider,
//!   ConditioningClearImage
//! - [`controlnet`]: ControlNetLoader, ControlNetApplyAdvanced, ControlNetApply, Canny

pub mod chroma;
pub mod conditioning;
pub mod controlnet;
pub mod custom_sampling;
pub mod detect;
pub mod detailer;
pub mod flux;
pub mod guidance;
pub mod image;
pub mod ip_adapter;
pub mod latent;
pub mod loaders;
pub mod lora;
pub mod mask;
pub mod model_sampling;
pub mod photomaker;
pub mod pix2pix;
pub mod preview;
pub mod resize;
pub mod runtime;
pub mod sampling;
pub mod sd3;
pub mod sdcpp;
pub mod taesd;
pub mod upscale;
pub mod values;

pub use runtime::Runtime;

use sdflow_executor::Registry;
use std::sync::Arc;

/// Register every node type this crate defines.
pub fn register_all(registry: &mut Registry, rt: Arc<Runtime>) {
    loaders::register(registry, &rt);
    lora::register(registry, &rt);
    conditioning::register(registry, &rt);
    flux::register(registry, &rt);
    sd3::register(registry, &rt);
    chroma::register(registry);
    sdcpp::register(registry);
    latent::register(registry, &rt);
    sampling::register(registry, &rt);
    custom_sampling::register(registry, &rt);
    image::register(registry, &rt);
    mask::register(registry);
    model_sampling::register(registry);
    pix2pix::register(registry, &rt);
    controlnet::register(registry, &rt);
    upscale::register(registry, &rt);
    detect::register(registry, &rt);
    detailer::register(registry, &rt);
    ip_adapter::register(registry, &rt);
    photomaker::register(registry, &rt);
}

/// Turns any displayable error into the executor's node error.
pub(crate) fn err(e: impl std::fmt::Display) -> sdflow_executor::NodeError {
    sdflow_executor::NodeError::msg(e.to_string())
}
