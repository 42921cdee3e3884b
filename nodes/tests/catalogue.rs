//! /object_info's coverage of ComfyUI's core nodes: every node class ComfyUI registers
//! itself (nodes.py, the comfy_extras and comfy_api_nodes files it loads; the list in
//! `fixtures/comfyui_catalogue/catalogue.json`, written by its `gen.py` from ComfyUI's
//! sources) is either registered by sdflow or listed below with the reason it is not.
//! A ComfyUI node in neither place fails the test, and so does a listed node that sdflow
//! registers, so the list stays the remaining differences, by name.

use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// ComfyUI core nodes sdflow does not register, grouped by why.
const NOT_REGISTERED: &[(&str, &[&str])] = &[
    (
        "paid API service nodes (comfy_api_nodes): each sends its inputs to a hosted partner service (OpenAI, BFL, Kling, Luma, Stability, ...) through Comfy.org's API with an account key; sdflow runs models locally and has no such client",
        &[
            "ByteDanceFirstLastFrameNode", "ByteDanceImageEditNode", "ByteDanceImageNode", "ByteDanceImageReferenceNode",
            "ByteDanceImageToVideoNode", "ByteDanceSeedreamNode", "ByteDanceTextToVideoNode", "FluxKontextMaxImageNode", "FluxKontextProImageNode",
            "FluxProCannyNode", "FluxProDepthNode", "FluxProExpandNode", "FluxProFillNode", "FluxProUltraImageNode", "GeminiImageNode",
            "GeminiInputFiles", "GeminiNode", "IdeogramV1", "IdeogramV2", "IdeogramV3", "KlingCameraControlI2VNode", "KlingCameraControlT2VNode",
            "KlingCameraControls", "KlingDualCharacterVideoEffectNode", "KlingImage2VideoNode", "KlingImageGenerationNode",
            "KlingLipSyncAudioToVideoNode", "KlingLipSyncTextToVideoNode", "KlingSingleImageVideoEffectNode", "KlingStartEndFrameNode",
            "KlingTextToVideoNode", "KlingVideoExtendNode", "KlingVirtualTryOnNode", "LumaConceptsNode", "LumaImageModifyNode", "LumaImageNode",
            "LumaImageToVideoNode", "LumaReferenceNode", "LumaVideoNode", "MinimaxHailuoVideoNode", "MinimaxImageToVideoNode",
            "MinimaxTextToVideoNode", "MoonvalleyImg2VideoNode", "MoonvalleyTxt2VideoNode", "MoonvalleyVideo2VideoNode", "OpenAIChatConfig",
            "OpenAIChatNode", "OpenAIDalle2", "OpenAIDalle3", "OpenAIGPTImage1", "OpenAIInputFiles", "OpenAIVideoSora2", "PikaImageToVideoNode2_2",
            "PikaScenesV2_2", "PikaStartEndFrameNode2_2", "PikaTextToVideoNode2_2", "Pikadditions", "Pikaffects", "Pikaswaps",
            "PixverseImageToVideoNode", "PixverseTemplateNode", "PixverseTextToVideoNode", "PixverseTransitionVideoNode", "RecraftColorRGB",
            "RecraftControls", "RecraftCreativeUpscaleNode", "RecraftCrispUpscaleNode", "RecraftImageInpaintingNode", "RecraftImageToImageNode",
            "RecraftRemoveBackgroundNode", "RecraftReplaceBackgroundNode", "RecraftStyleV3DigitalIllustration", "RecraftStyleV3InfiniteStyleLibrary",
            "RecraftStyleV3LogoRaster", "RecraftStyleV3RealisticImage", "RecraftTextToImageNode", "RecraftTextToVectorNode",
            "RecraftVectorizeImageNode", "Rodin3D_Detail", "Rodin3D_Gen2", "Rodin3D_Regular", "Rodin3D_Sketch", "Rodin3D_Smooth",
            "RunwayFirstLastFrameNode", "RunwayImageToVideoNodeGen3a", "RunwayImageToVideoNodeGen4", "RunwayTextToImageNode",
            "StabilityAudioInpaint", "StabilityAudioToAudio", "StabilityStableImageSD_3_5Node", "StabilityStableImageUltraNode",
            "StabilityTextToAudio", "StabilityUpscaleConservativeNode", "StabilityUpscaleCreativeNode", "StabilityUpscaleFastNode",
            "TripoConversionNode", "TripoImageToModelNode", "TripoMultiviewToModelNode", "TripoRefineNode", "TripoRetargetNode", "TripoRigNode",
            "TripoTextToModelNode", "TripoTextureNode", "Veo3VideoGenerationNode", "VeoVideoGenerationNode", "ViduImageToVideoNode",
            "ViduReferenceVideoNode", "ViduStartEndToVideoNode", "ViduTextToVideoNode", "WanImageToImageApi", "WanImageToVideoApi",
            "WanTextToImageApi", "WanTextToVideoApi",
        ],
    ),
    (
        "video model families sdflow has no model code for (LTX-Video, Hunyuan Video, Cosmos, Mochi, Stable Video Diffusion), Wan's Fun, camera, audio, animate and phantom variants (sdflow runs Wan T2V, I2V, FLF2V, VACE and TI2V) and the video-only helpers around them (temporal attention, context windows, per-frame areas)",
        &[
            "ConditioningSetAreaPercentageVideo", "ContextWindowsManual", "CosmosImageToVideoLatent", "CosmosPredict2ImageToVideoLatent",
            "EmptyCosmosLatentVideo", "EmptyLTXVLatentVideo", "EmptyMochiLatentVideo", "HunyuanImageToVideo",
            "ImageOnlyCheckpointLoader", "ImageOnlyCheckpointSave", "LTXVAddGuide", "LTXVConditioning", "LTXVCropGuides", "LTXVImgToVideo",
            "LTXVPreprocess", "LTXVScheduler", "ModelMergeCosmos14B", "ModelMergeCosmos7B", "ModelMergeCosmosPredict2_14B",
            "ModelMergeCosmosPredict2_2B", "ModelMergeLTXV", "ModelMergeMochiPreview", "ModelMergeWAN2_1", "ModelSamplingLTXV",
            "SVD_img2vid_Conditioning", "TextEncodeHunyuanVideo_ImageToVideo", "UNetTemporalAttentionMultiply",
            "VideoLinearCFGGuidance", "VideoTriangleCFGGuidance", "Wan22FunControlToVideo", "WanAnimateToVideo",
            "WanCameraEmbedding", "WanCameraImageToVideo", "WanFunControlToVideo", "WanFunInpaintToVideo",
            "WanHuMoImageToVideo", "WanPhantomSubjectToVideo", "WanSoundImageToVideo", "WanSoundImageToVideoExtend",
            "WanTrackToVideo",
        ],
    ),
    (
        "image model families and add-on models sdflow has no model code for: Stable Cascade, HiDream, Lumina 2, PixArt, HunyuanDiT / Hunyuan Image, Qwen-Image, Chroma Radiance, AuraFlow (merging), Lotus, Stable Zero123 / SV3D, unCLIP, GLIGEN, the SD x4 upscaler, style models (FLUX Redux), model patches (DiffSynth, USO)",
        &[
            "CLIPTextEncodeHiDream", "CLIPTextEncodeHunyuanDiT", "CLIPTextEncodeLumina2", "CLIPTextEncodePixArtAlpha", "ChromaRadianceOptions",
            "EmptyChromaRadianceLatentImage", "EmptyHunyuanImageLatent", "GLIGENLoader", "GLIGENTextBoxApply", "HunyuanRefinerLatent",
            "LotusConditioning", "ModelMergeAuraflow", "ModelMergeQwenImage", "ModelPatchLoader", "ModelSamplingStableCascade",
            "QuadrupleCLIPLoader", "QwenImageDiffsynthControlnet", "RenormCFG", "SD_4XUpscale_Conditioning", "SV3D_Conditioning",
            "StableCascade_EmptyLatentImage", "StableCascade_StageB_Conditioning", "StableCascade_StageC_VAEEncode",
            "StableCascade_SuperResolutionControlnet", "StableZero123_Conditioning", "StableZero123_Conditioning_Batched", "StyleModelApply",
            "StyleModelLoader", "USOStyleReference", "unCLIPCheckpointLoader",
            "unCLIPConditioning",
        ],
    ),
    (
        "ControlNet kinds sdflow's ControlNet code does not run: SD3 and FLUX (AliMama inpainting) ControlNets, Union ControlNet types, difference ControlNets, ControlNets with text conditioning of their own",
        &[
            "CLIPTextEncodeControlnet", "ControlNetApplySD3", "ControlNetInpaintingAliMamaApply", "DiffControlNetLoader", "SetUnionControlNetType",
        ],
    ),
    (
        "audio: sdflow has no AUDIO type, audio codecs or audio models (Stable Audio, ACE-Step, audio encoders)",
        &[
            "AudioAdjustVolume", "AudioConcat", "AudioEncoderEncode", "AudioEncoderLoader", "AudioMerge", "ConditioningStableAudio",
            "EmptyAceStepLatentAudio", "EmptyAudio", "EmptyLatentAudio", "LoadAudio", "PreviewAudio", "RecordAudio", "SaveAudio", "SaveAudioMP3",
            "SaveAudioOpus", "SplitAudioChannels", "TextEncodeAceStepAudio", "TrimAudioDuration", "VAEDecodeAudio", "VAEEncodeAudio",
        ],
    ),
    (
        "animated PNG: sdflow has no APNG writer (it writes animated WebP, WebM and MP4)",
        &[
            "SaveAnimatedPNG",
        ],
    ),
    (
        "3D: meshes, voxels and the 3D viewers' inputs (Hunyuan3D, Load3D/Preview3D); sdflow has no 3D types",
        &[
            "EmptyLatentHunyuan3Dv2", "Hunyuan3Dv2Conditioning", "Hunyuan3Dv2ConditioningMultiView", "Load3D", "Load3DAnimation", "Preview3D",
            "Preview3DAnimation", "SaveGLB", "VAEDecodeHunyuan3D", "VoxelToMesh", "VoxelToMeshBasic",
        ],
    ),
    (
        "training: ComfyUI's LoRA trainer and its dataset loaders; sdflow does inference only",
        &[
            "LoadImageSetFromFolderNode", "LoadImageTextSetFromFolderNode", "LoraModelLoader", "LossGraphNode", "SaveLoRANode", "TrainLoraNode",
        ],
    ),
    (
        "ComfyUI's hooks: keyframed LoRA and model patches attached to conditioning and switched per step; sdflow's conditioning carries no hooks",
        &[
            "CombineHooks2", "CombineHooks4", "CombineHooks8", "ConditioningSetDefaultCombine", "ConditioningSetProperties",
            "ConditioningSetPropertiesAndCombine", "ConditioningTimestepsRange", "CreateHookKeyframe", "CreateHookKeyframesFromFloats",
            "CreateHookKeyframesInterpolated", "CreateHookLora", "CreateHookLoraModelOnly", "CreateHookModelAsLora",
            "CreateHookModelAsLoraModelOnly", "PairConditioningCombine", "PairConditioningSetDefaultCombine", "PairConditioningSetProperties",
            "PairConditioningSetPropertiesAndCombine", "SetClipHooks", "SetHookKeyframes",
        ],
    ),
    (
        "PyTorch runtime settings with no counterpart in sdflow's ggml backend (torch.compile, a per-model torch compute dtype)",
        &[
            "ModelComputeDtype", "TorchCompileModel",
        ],
    ),
    (
        "need list inputs and outputs (INPUT_IS_LIST / OUTPUT_IS_LIST), which sdflow's executor does not map over",
        &[
            "RebatchImages", "RebatchLatents",
        ],
    ),
    (
        "take SVG, a type only the paid API nodes produce",
        &[
            "SaveSVGNode",
        ],
    ),
    (
        "model merging, LoRA extraction and model saving: not implemented; they need per-key arithmetic across two loaded models and a checkpoint writer, and sdflow applies LoRAs but merges nothing and saves no models",
        &[
            "CLIPMergeAdd", "CLIPMergeSimple", "CLIPMergeSubtract", "CLIPSave", "CheckpointSave", "LoraSave", "ModelMergeAdd", "ModelMergeBlocks",
            "ModelMergeFlux1", "ModelMergeSD1", "ModelMergeSD2", "ModelMergeSD35_Large", "ModelMergeSD3_2B", "ModelMergeSDXL", "ModelMergeSimple",
            "ModelMergeSubtract", "ModelSave", "VAESave",
        ],
    ),
    (
        "guidance and model-call wrappers (ComfyUI's sampler_cfg_function, pre- and post-CFG functions, calc_cond_batch functions, model output wrappers) beyond the ones sdflow has (RescaleCFG, CFGNorm, CFGZeroStar, LatentApplyOperationCFG, skip-layer guidance, Differential Diffusion): not implemented yet; PerpNegGuider is a guider of its own, Epsilon Scaling a model-output wrapper",
        &[
            "APG", "Epsilon Scaling", "FreSca", "Mahiro", "PerpNeg", "PerpNegGuider",
            "SkipLayerGuidanceDiTSimple", "TCFG",
        ],
    ),
    (
        "patches inside the denoiser's forward pass (attention scaling, FreeU, HyperTile, ToMe, Kohya deep shrink, self-attention and perturbed-attention guidance, hypernetworks, step caching): not implemented; each needs its own change inside sdflow's UNet or DiT graph",
        &[
            "CLIPAttentionMultiply", "EasyCache", "FreeU", "FreeU_V2", "HyperTile", "HypernetworkLoader", "LazyCache", "PatchModelAddDownscale",
            "PerturbedAttentionGuidance", "SelfAttentionGuidance", "TomePatchModel", "UNetCrossAttentionMultiply", "UNetSelfAttentionMultiply",
        ],
    ),
    (
        "sampler and scheduler option nodes not implemented yet: the samplers behind them are in sdflow (KSampler runs dpmpp_2m_sde, er_sde, sa_solver, ...), but these nodes' options (ER-SDE's solver type and stages, SA-Solver's orders and tau, DPM adaptive's tolerances, the noise device) are not all sampler options sdflow takes, and GITS coefficients other than 1.20, the optimal-steps tables and AYS's node form are not checked against ComfyUI; ModelSamplingContinuousV is a continuous-V model sampling (atan timesteps) sdflow's models do not have; SamplerLCMUpscale's upscaling between steps and SamplerEulerCFGpp's \"alternative\" form are not written",
        &[
            "AlignYourStepsScheduler", "GITSScheduler",
            "ModelSamplingContinuousV", "OptimalStepsScheduler", "SamplerDPMAdaptative",
            "SamplerDPMPP_2M_SDE", "SamplerDPMPP_3M_SDE", "SamplerDPMPP_SDE", "SamplerER_SDE", "SamplerEulerCFGpp", "SamplerLCMUpscale",
            "SamplerSASolver",
        ],
    ),
    (
        "image, latent and conditioning nodes not implemented yet: ImageQuantize needs PIL's median-cut palette and dithering reproduced, Morphology and the YUV nodes kornia's operators; CLIPTextEncodeSDXLRefiner is not written (sdflow's conditioning has the refiner's aesthetic score)",
        &[
            "CLIPTextEncodeSDXLRefiner", "ImageQuantize", "ImageRGBToYUV", "ImageYUVToRGB",
            "Morphology",
        ],
    ),
    (
        "loaders and savers not implemented yet: .latent files (SaveLatent, LoadLatent), images from the output folder, the webcam widget's LoadImage, the config-picking CheckpointLoader (deprecated), diffusers folders under models/diffusers",
        &[
            "CheckpointLoader", "DiffusersLoader", "LoadImageOutput", "LoadLatent", "SaveLatent", "WebcamCapture",
        ],
    ),
];

fn catalogue() -> Json {
    serde_json::from_str(include_str!("fixtures/comfyui_catalogue/catalogue.json")).unwrap()
}

fn registered() -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(sdflow_nodes::Runtime::new(dir.path(), dir.path().join("out"), 1, sdflow_core::io::WeightType::Stored).unwrap());
    let mut registry = sdflow_executor::Registry::new();
    sdflow_nodes::register_all(&mut registry, rt);
    registry.class_names().map(str::to_string).collect()
}

#[test]
fn every_comfyui_core_node_is_registered_or_listed_with_a_reason() {
    let cat = catalogue();
    assert_eq!(cat["commit"].as_str().map(str::len), Some(40), "the fixture records the ComfyUI commit it was read from");
    let comfy: BTreeMap<String, String> = cat["nodes"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v["module"].as_str().unwrap().to_string())).collect();
    assert_eq!(cat["count"].as_u64(), Some(comfy.len() as u64));
    let ours = registered();

    let mut listed: BTreeMap<&str, &str> = BTreeMap::new();
    let mut problems = Vec::new();
    for (reason, names) in NOT_REGISTERED {
        for name in *names {
            if let Some(other) = listed.insert(name, reason) {
                problems.push(format!("{name} is listed twice (also under \"{other}\")"));
            }
            if !comfy.contains_key(*name) {
                problems.push(format!("{name} is listed but ComfyUI (at the fixture's commit) has no such node"));
            }
            if ours.contains(*name) {
                problems.push(format!("{name} is listed but sdflow registers it: remove it from the list"));
            }
        }
    }
    for (name, module) in &comfy {
        if !ours.contains(name) && !listed.contains_key(name.as_str()) {
            problems.push(format!("{name} ({module}) is neither registered nor listed with a reason"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let registered = comfy.keys().filter(|n| ours.contains(*n)).count();
    println!("ComfyUI core nodes at {}: {}; registered by sdflow: {registered}; not registered: {}", cat["commit"].as_str().unwrap(), comfy.len(), listed.len());
    for (reason, names) in NOT_REGISTERED {
        println!("\n{} — {reason}:\n  {}", names.len(), names.join(", "));
    }
    let extra: Vec<&String> = ours.iter().filter(|n| !comfy.contains_key(*n)).collect();
    println!("\nregistered by sdflow, not in ComfyUI's core at that commit (sdflow's own, or newer ComfyUI nodes): {}", extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "));
    assert_eq!(registered + listed.len(), comfy.len());
}

/// The reasons stay few and each holds nodes: the list is grouped, not one reason a node.
#[test]
fn the_list_is_grouped_by_reason() {
    assert!(NOT_REGISTERED.len() <= 20);
    for (reason, names) in NOT_REGISTERED {
        assert!(!names.is_empty(), "\"{reason}\" lists no node");
        assert!(reason.len() > 40, "\"{reason}\" says too little");
    }
}
