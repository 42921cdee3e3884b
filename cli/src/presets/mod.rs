//! The sd-cli presets: `sdflow img_gen` (alias `txt2img`), `upscale`, `adetailer` and
//! `vid_gen`, with sd-cli's flag names and defaults. Each builds a workflow with
//! `sdflow_workflows::presets` and runs it through `run::execute`, then moves the images
//! to where `-o` says, as sd-cli names them.
//!
//! The flags are in [`args`]; the files they name are staged for the graph by [`stage`].

mod args;
mod stage;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use sdflow_executor::Workflow;
use sdflow_workflows::presets::{self, AdetailerParams, ChromaParams, HiresParams, ImgGenParams, ModelInfo, Preset, SlgParams, TilingParams, UpscaleParams};

pub use args::{AdetailerArgs, CommonArgs, ImgGenArgs, UpscaleArgs, VidGenArgs};
use args::Refused;
use stage::{find_lora, shown_name, Names, Stage};

use crate::run;

/// The refusals and validity checks that need no files: done before anything is staged.
fn check_output(output: &str) -> anyhow::Result<()> {
    let ext = Path::new(output).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if ext.as_deref() != Some("png") {
        bail!("not supported yet: -o {output} (SaveImage writes PNG; give the output a .png name)");
    }
    Ok(())
}

/// What the command's model files hold, read once per command (every graph built from
/// its flags takes it).
struct Probe {
    /// The diffusion model file (`--diffusion-model`, else `-m`): the family's graph
    /// builder and what `-m` holds. Without a readable file, `--t5xxl` with `--clip_g`
    /// means SD3, with `--clip_l` FLUX, alone Chroma; the loaders report the file.
    info: ModelInfo,
    /// The tiny autoencoder entry for the model's latents (`taesd` when the file given as
    /// a path cannot be read).
    tae: &'static str,
    /// sd-cli zeroes the unconditional embeddings when the negative prompt is empty for an
    /// SDXL `-m` (given as a path), except EDM-v ones (CosXL).
    zero_empty_negative: bool,
    /// Each `-r` image's width and height ((0, 0) when it cannot be read: the loader
    /// reports it).
    ref_sizes: Vec<(i64, i64)>,
}

fn probe(a: &ImgGenArgs) -> Probe {
    use sdflow_core::detect::{detect_source, ModelFamily, EDM_VPRED_KEYS};
    use sdflow_nodes::loaders::taesd::TaeKind;

    // A path, else a name in --models-dir; whether it was the path as given.
    let found = |v: &Option<String>, kind: &str| v.as_ref().map(|v| [PathBuf::from(v), a.common.models_dir.join(kind).join(v), a.common.models_dir.join(v)].into_iter().enumerate().find(|(_, p)| p.exists()).map_or((PathBuf::from(v), false), |(i, p)| (p, i == 0)));
    let open = |f: &Option<(PathBuf, bool)>| f.as_ref().and_then(|(p, as_given)| Some((sdflow_core::models::pipeline::open(p).ok()?, *as_given)));
    let (model, diffusion) = (open(&found(&a.model, "checkpoints")), open(&found(&a.diffusion_model, "diffusion_models")));
    let detect = |s: &Option<(Box<dyn sdflow_core::io::TensorSource>, bool)>| s.as_ref().map(|(src, as_given)| (detect_source(src.as_ref()), *as_given));
    let (det_m, det_d) = (detect(&model), detect(&diffusion));
    let main = if a.diffusion_model.is_some() { &det_d } else { &det_m };
    let held = a.model.as_ref().map(|_| det_m.as_ref().map(|d| &d.0));
    let info = main.as_ref().and_then(|(d, _)| ModelInfo::from_detections(d, held)).unwrap_or_else(|| ModelInfo::guess_from_parts(a.clip_l.is_some(), a.clip_g.is_some(), a.t5xxl.is_some(), a.llm.is_some()));
    let tae = main.as_ref().filter(|(_, as_given)| *as_given).and_then(|(d, _)| TaeKind::for_family(d.family)).unwrap_or(TaeKind::Sd).name();
    let zero_empty_negative = match (&model, &det_m) {
        (Some((src, true)), Some((d, _))) => d.family == ModelFamily::Sdxl && !src.tensors().iter().any(|t| t.name == EDM_VPRED_KEYS.1),
        _ => false,
    };
    let ref_sizes = a.ref_image.iter().map(|r| image::image_dimensions(r).map_or((0, 0), |(w, h)| (w as i64, h as i64))).collect();
    Probe { info, tae, zero_empty_negative, ref_sizes }
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

/// `--model-args`: Chroma's mask options over sd-cli's older `--chroma-*` flags, and
/// Qwen-Image's `qwen_image_zero_cond_t` (sd.cpp warns on a value it cannot read and
/// goes on; so does this).
fn model_args(a: &ImgGenArgs) -> anyhow::Result<(ChromaParams, bool)> {
    let mut c = ChromaParams { dit_mask: !a.chroma_disable_dit_mask, t5_mask: a.chroma_enable_t5_mask, t5_mask_pad: a.chroma_t5_mask_pad };
    let mut zero_cond_t = false;
    for (k, v) in key_values("--model-args", a.model_args.as_deref().unwrap_or(""))? {
        match k {
            "chroma_use_dit_mask" => c.dit_mask = parse_bool("--model-args", k, v)?,
            "chroma_use_t5_mask" => c.t5_mask = parse_bool("--model-args", k, v)?,
            "chroma_t5_mask_pad" => c.t5_mask_pad = v.parse().with_context(|| format!("invalid value for --model-args: chroma_t5_mask_pad={v} is not an integer"))?,
            "qwen_image_zero_cond_t" => match parse_bool("--model-args", k, v) {
                Ok(b) => zero_cond_t |= b,
                Err(_) => tracing::warn!("ignoring invalid Qwen Image model arg '{k}={v}'"),
            },
            _ => bail!("invalid value for --model-args: unknown key `{k}` (chroma_use_dit_mask, chroma_use_t5_mask, chroma_t5_mask_pad, qwen_image_zero_cond_t)"),
        }
    }
    Ok((c, zero_cond_t))
}

struct RefArgs {
    increase: bool,
    resize: bool,
    options: sdflow_workflows::presets::RefOptions,
}

/// `--ref-image-args` over sd-cli's older `--increase-ref-index` and
/// `--disable-auto-resize-ref-image`: sd.cpp's presets by name, then its keys. As in
/// sd-cli, an unknown key or a value it cannot read is a warning and left out; a preset
/// of a family sdflow does not run is an error naming it.
fn ref_image_args(a: &ImgGenArgs) -> anyhow::Result<RefArgs> {
    use sdflow_workflows::presets::RefOptions;
    let mut r = RefArgs { increase: a.increase_ref_index, resize: !a.disable_auto_resize_ref_image, options: RefOptions::default() };
    let pairs = key_values("--ref-image-args", a.ref_image_args.as_deref().unwrap_or(""))?;
    let set_index = |r: &mut RefArgs, mode: &str| {
        r.increase = mode == "increase";
        r.options.ref_index_mode = Some(mode.to_string());
    };
    if let Some((_, name)) = pairs.iter().find(|(k, _)| *k == "preset") {
        // sd.cpp's REF_IMAGE_PRESETS: where the images go and how they are numbered.
        let (vlm, index) = match *name {
            "default" | "flux_kontext" => (false, "fixed"),
            "flux2" => (false, "increase"),
            "qwen" => (true, "increase"),
            "qwen_layered" => (true, "decrease"),
            "z_image_omni" | "longcat" | "mage_flow" | "krea2_edit" | "krea2_ostris_edit" | "cosmos_reference" => {
                bail!("not supported yet: --ref-image-args preset={name} (its model family does not run in sdflow yet)")
            }
            other => bail!("invalid value for --ref-image-args: preset={other} (sd.cpp's presets: default, flux_kontext, flux2, qwen, qwen_layered, z_image_omni, longcat, mage_flow, krea2_edit, krea2_ostris_edit, cosmos_reference)"),
        };
        r.options.pass_to_vlm = Some(vlm);
        set_index(&mut r, index);
    }
    let warn = |k: &str, v: &str| tracing::warn!("ignoring invalid reference image arg '{k}={v}'");
    let boolean = |k: &str, v: &str| parse_bool("--ref-image-args", k, v).map_err(|_| warn(k, v)).ok();
    let int = |k: &str, v: &str| v.parse::<i64>().map_err(|_| warn(k, v)).ok();
    for &(k, v) in &pairs {
        match k {
            "preset" => {}
            "ref_index_mode" => match v {
                "fixed" | "increase" | "decrease" => set_index(&mut r, v),
                _ => warn(k, v),
            },
            "resize_before_vae" => r.resize = boolean(k, v).unwrap_or(r.resize),
            "pass_to_vlm" => r.options.pass_to_vlm = boolean(k, v).or(r.options.pass_to_vlm),
            "pass_to_dit" => r.options.pass_to_dit = boolean(k, v).unwrap_or(r.options.pass_to_dit),
            "vae_input_max_pixels" => r.options.vae_input_max_pixels = int(k, v).unwrap_or(r.options.vae_input_max_pixels),
            "vlm_resize_mode" => match v {
                "area" | "longest_side" | "none" => r.options.vlm_resize_mode = Some(v.to_string()),
                _ => warn(k, v),
            },
            "vlm_min_size" => r.options.vlm_min_size = int(k, v).unwrap_or(r.options.vlm_min_size),
            "vlm_max_size" => r.options.vlm_max_size = int(k, v).unwrap_or(r.options.vlm_max_size),
            "vlm_size" => {}
            "force_ref_timestep_zero" => bail!("not supported yet: --ref-image-args force_ref_timestep_zero (Krea2's)"),
            _ => tracing::warn!("ignoring unknown reference image arg '{k}'"),
        }
    }
    // vlm_size sets both bounds, after everything else (sd.cpp's second pass).
    if let Some(&(k, v)) = pairs.iter().find(|(k, _)| *k == "vlm_size") {
        if let Some(n) = int(k, v) {
            (r.options.vlm_min_size, r.options.vlm_max_size) = (n, n);
        }
    }
    Ok(r)
}

/// `--skip-layers`: sd-cli's `[7,8,9]` list (brackets and spaces optional).
fn parse_skip_layers(s: &str) -> anyhow::Result<Vec<i64>> {
    let inner = s.trim().trim_start_matches('[').trim_end_matches(']');
    inner.split(',').map(str::trim).filter(|t| !t.is_empty()).map(|t| t.parse::<i64>().with_context(|| format!("invalid value for --skip-layers: `{t}` in {s} is not an integer"))).collect()
}

fn img_gen_params(a: &ImgGenArgs, probe: &Probe, seed: i64, names: &mut Names<'_>) -> anyhow::Result<ImgGenParams> {
    let (_, tags) = presets::extract_loras(&a.sampling.prompt)?;
    let (chroma, qwen_zero_cond_t) = model_args(a)?;
    if a.qwen_image_layers < 0 {
        bail!("invalid value for --qwen-image-layers: {} (it must be non-negative)", a.qwen_image_layers);
    }
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
    let ref_sizes = probe.ref_sizes.clone();
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
            (Some(_), Names::Shown) => (!a.taesd_preview_only).then(|| probe.tae.to_string()),
            (Some(v), Names::Staged(s)) => Some(s.taesd(v, probe.tae)?).filter(|_| !a.taesd_preview_only),
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
        zero_empty_negative: probe.zero_empty_negative,
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
        end_img: names.image("--end-img", &a.end_img)?,
        clip_vision: names.model("clip_vision", "--clip_vision", &a.clip_vision)?,
        control_video: names.folder("--control-video", &a.control_video)?,
        vace_strength: a.vace_strength,
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
        circular_x: a.circular || a.circularx,
        circular_y: a.circular || a.circulary,
        // A1111's units, seeds and refiner come only through the server's sdapi.
        controls: Vec::new(),
        variation: None,
        refiner: None,
        a1111: None,
        tiling: TilingParams { enabled: a.vae_tiling, tile_size: a.vae_tile_size, overlap: a.vae_tile_overlap, relative: a.vae_relative_tile_size.map(|(x, y)| (x as f64, y as f64)) },
        output: a.sampling.output.clone(),
        model_info: probe.info.clone(),
        t5xxl: names.model("text_encoders", "--t5xxl", &a.t5xxl)?,
        llm: names.model("text_encoders", "--llm", &a.llm)?,
        llm_vision: names.model("text_encoders", "--llm_vision", &a.llm_vision)?,
        guidance: a.guidance,
        flow_shift: a.flow_shift,
        slg: SlgParams { scale: a.slg_scale, layers: parse_skip_layers(&a.skip_layers)?, start: a.skip_layer_start, end: a.skip_layer_end },
        ref_images: a.ref_image.iter().map(|r| names.image("-r", &Some(r.clone())).map(Option::unwrap_or_default)).collect::<anyhow::Result<_>>()?,
        ref_sizes,
        increase_ref_index: refs.increase,
        auto_resize_ref_image: refs.resize,
        ref_options: refs.options,
        chroma,
        qwen_zero_cond_t,
        qwen_image_layers: a.qwen_image_layers,
        video: None,
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
    // A placement this machine cannot honour fails before anything is staged.
    sdflow_core::placement::Placement::resolve(&c.placement.spec(), &sdflow_core::ggml::devices())?;
    Ok(())
}

pub fn img_gen_command(a: ImgGenArgs) -> anyhow::Result<()> {
    if a.common.placement.list_devices() {
        return Ok(());
    }
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
    if let Some(h) = &a.high_noise_diffusion_model {
        bail!("not supported yet: --high-noise-diffusion-model {h} in the img_gen mode (Wan2.2's experts run in vid_gen)");
    }
    if let Some(m) = &a.motion_module {
        bail!("--motion-module {m} animates in the vid_gen mode (sd-cli's img_gen samples each image alone, where the motion module does nothing)");
    }
    if let (Some(_), Some(st)) = (a.img_cfg_scale, a.strength) {
        bail!("not supported yet: --strength {st} with --img-cfg-scale (instruct-pix2pix samples from noise, strength 1)");
    }
    let seed = presets::resolve_seed(a.sampling.seed);
    let probe = probe(&a);
    let shown = presets::img_gen(&img_gen_params(&a, &probe, seed, &mut Names::Shown)?)?;
    finish(shown, &a.common, &a.sampling.output, a.sampling.output_begin_idx, |stage| {
        if let Some(d) = &a.embd_dir {
            stage.embeddings(d)?;
        } else if a.common.models_dir.join("embeddings").is_dir() {
            stage.embeddings(&a.common.models_dir.join("embeddings"))?;
        }
        Ok(presets::img_gen(&img_gen_params(&a, &probe, seed, &mut Names::Staged(stage))?)?)
    })
}

pub fn upscale_command(a: UpscaleArgs) -> anyhow::Result<()> {
    if a.common.placement.list_devices() {
        return Ok(());
    }
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
    if a.common.placement.list_devices() {
        return Ok(());
    }
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

/// sd-cli's vid_gen: img_gen's graph for a Wan model, its frames written where `-o` says
/// as sd-cli writes them (one frame: a PNG; a `%d` pattern: numbered PNGs; else an `.avi`
/// or `.webp` video, other extensions becoming `.avi`).
pub fn vid_gen_command(v: VidGenArgs) -> anyhow::Result<()> {
    let mut a = v.img;
    if a.common.placement.list_devices() {
        return Ok(());
    }
    common_refusals(&a.common, &a.refused)?;
    a.sampling.refusals()?;
    if a.video_frames < 1 {
        bail!("invalid value for --video-frames: {} (it must be at least 1)", a.video_frames);
    }
    if !(1..=1000).contains(&a.fps) {
        bail!("invalid value for --fps: {} (it must be in 1..=1000)", a.fps);
    }
    let high_noise = |names: &mut Names<'_>| -> anyhow::Result<Option<presets::HighNoiseParams>> {
        let Some(model) = names.model("diffusion_models", "--high-noise-diffusion-model", &a.high_noise_diffusion_model)? else { return Ok(None) };
        Ok(Some(presets::HighNoiseParams { model, steps: a.high_noise_steps, cfg_scale: a.high_noise_cfg_scale, sampling_method: a.high_noise_sampling_method.clone(), eta: a.high_noise_eta, boundary: a.moe_boundary }))
    };
    let video = presets::VideoParams { frames: a.video_frames, fps: a.fps, high_noise: None, motion_module: a.motion_module.clone() };
    let output = &a.sampling.output;
    a.sampling.output = if presets::is_frame_pattern(output) {
        check_output(output)?;
        output.clone()
    } else if video.aligned_frames() == 1 {
        Path::new(output).with_extension("png").to_string_lossy().into_owned()
    } else {
        presets::video_output(output)?.to_string_lossy().into_owned()
    };
    let seed = presets::resolve_seed(a.sampling.seed);
    let probe = probe(&a);
    let animatediff = a.motion_module.is_some();
    match (probe.info.family, animatediff) {
        (presets::Family::Wan, false) | (presets::Family::Unet, true) => {}
        (presets::Family::Wan, true) => bail!("--motion-module animates SD1.x models; this is a Wan model, which makes videos itself"),
        (presets::Family::Unet, false) => bail!("vid_gen with an SD model needs an AnimateDiff motion module (--motion-module mm_sd15_v3.safetensors)"),
        _ => bail!("not supported yet: vid_gen with this model (Wan models are, and SD1.x models with --motion-module; give one with --diffusion-model or -m)"),
    }
    if animatediff && a.batch_count > 1 {
        bail!("-b {} with --motion-module: an AnimateDiff video is one batch of its frames", a.batch_count);
    }
    if a.video_frames > presets::ANIMATEDIFF_MAX_FRAMES && animatediff {
        eprintln!("warning: AnimateDiff motion modules take at most {} frames; making {}", presets::ANIMATEDIFF_MAX_FRAMES, presets::ANIMATEDIFF_MAX_FRAMES);
    }
    let params = |names: &mut Names<'_>| -> anyhow::Result<ImgGenParams> {
        let motion_module = names.model("animatediff_models", "--motion-module", &a.motion_module)?;
        let video = presets::VideoParams { high_noise: high_noise(names)?, motion_module, ..video.clone() };
        let mut p = img_gen_params(&a, &probe, seed, names)?;
        if animatediff {
            // sd.cpp samples the frames as one latent batch.
            p.batch_count = video.aligned_frames();
        }
        Ok(ImgGenParams { video: Some(video), ..p })
    };
    let shown = presets::img_gen(&params(&mut Names::Shown)?)?;
    finish(shown, &a.common, &a.sampling.output, a.sampling.output_begin_idx, |stage| Ok(presets::img_gen(&params(&mut Names::Staged(stage))?)?))
}

/// Prints or saves `shown` (the workflow with file names as given), refuses it if this
/// build lacks a node it needs, else stages the files, builds the runnable workflow with
/// `build`, runs it and moves the images to `-o`.
fn finish(shown: Preset, c: &CommonArgs, output: &str, begin: Option<i64>, build: impl FnOnce(&mut Stage) -> anyhow::Result<Preset>) -> anyhow::Result<()> {
    let threads = (c.threads > 0).then_some(c.threads as usize);
    let stage_probe = Stage::new(&c.models_dir)?;
    // The probe only lists node types: on the CPU, so no GPU device is set up twice.
    let (probe, _) = run::registry(stage_probe.path(), stage_probe.path(), &stage_probe.input_dir(), threads, c.weight_type.resolve(), sdflow_core::placement::Placement::cpu())?;
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
    let placement = c.placement.resolve()?;
    let registry = Arc::new(run::registry_with(stage.path(), &out_dir, &stage.input_dir(), threads, c.weight_type.resolve(), placement, |rt| rt.with_preview_method(method).with_preview_noisy(noisy))?.0);
    let workflows: Vec<(String, Workflow)> = vec![(preset.workflow.header.as_ref().and_then(|h| h.title.clone()).unwrap_or_default(), preset.workflow.clone())];
    let session = run::Session { output_dir: Some(out_dir.clone()), json_events: c.json_events, workers: None, repeat: 1, preview: c.preview_file(), models_dir: None };
    let reports = run::execute(registry, &workflows, &session).map_err(|e| anyhow::anyhow!("{}", stage.unstage(&format!("{e:#}"))))?;
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

