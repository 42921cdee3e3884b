//! The `sdflow` binary as a user runs it: the sd-cli presets (printed workflows equal the
//! committed files for the same flags; a real run on a tiny random-weight model writes
//! where `-o` says), refusals, sd-cli-style errors, `metadata` and `convert`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sdflow_core::dtype::{self, DType};
use sdflow_core::io;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::Workflow;

fn sdflow(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sdflow")).args(args).current_dir(cwd).output().expect("running sdflow")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(args: &[&str], cwd: &Path) -> String {
    let out = sdflow(args, cwd);
    assert!(out.status.success(), "sdflow {args:?} failed:\n{}\n{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

fn fails(args: &[&str], cwd: &Path) -> (i32, String) {
    let out = sdflow(args, cwd);
    assert!(!out.status.success(), "sdflow {args:?} succeeded:\n{}", text(&out.stdout));
    (out.status.code().unwrap_or(-1), text(&out.stderr))
}

fn workflows_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../workflows")
}

/// The flags each committed workflow file is the preset of (also in docs/cli.md).
const FILES: &[(&str, &[&str])] = &[
    ("txt2img.json", &["img_gen", "-m", "model.safetensors", "-p", "a lovely cat, (watercolor:1.2)", "-n", "blurry, low quality", "-o", "txt2img.png"]),
    ("img2img.json", &["img_gen", "-m", "model.safetensors", "-p", "a lovely cat, oil painting", "-n", "blurry, low quality", "-i", "input.png", "-o", "img2img.png"]),
    ("inpaint.json", &["img_gen", "-m", "model.safetensors", "-p", "a red hat", "-n", "blurry, low quality", "-i", "input.png", "--mask", "mask.png", "--strength", "1.0", "--sampling-method", "euler", "-o", "inpaint.png"]),
    (
        "hires_fix.json",
        &["img_gen", "-m", "model.safetensors", "-p", "a lovely cat, (watercolor:1.2)", "-n", "blurry, low quality", "--hires", "--hires-upscaler", "Latent (bicubic)", "--hires-scale", "1.5", "--hires-denoising-strength", "0.5", "-o", "hires.png"],
    ),
    ("txt2img_tiled_vae.json", &["img_gen", "-m", "model.safetensors", "-p", "a lovely cat, (watercolor:1.2)", "-n", "blurry, low quality", "-W", "1024", "-H", "1024", "--vae-tiling", "--vae-tile-size", "64x64", "--vae-tile-overlap", "0.125", "-o", "txt2img_tiled_vae.png"]),
    ("instruct_pix2pix.json", &["img_gen", "-m", "model.safetensors", "-p", "turn it into a watercolor painting", "-i", "input.png", "--img-cfg-scale", "1.5", "--sampling-method", "euler", "-o", "pix2pix.png"]),
    ("upscale.json", &["upscale", "-i", "input.png", "--upscale-model", "RealESRGAN_x4plus.safetensors", "-o", "upscaled.png"]),
    ("inpaint_partial.json", &["img_gen", "-m", "model.safetensors", "-p", "a red hat", "-n", "blurry, low quality", "-i", "input.png", "--mask", "mask.png", "-o", "inpaint_partial.png"]),
    ("lora.json", &["img_gen", "-m", "model.safetensors", "-p", "<lora:ink:0.8>a lovely cat, (watercolor:1.2)", "-n", "blurry, low quality", "-o", "lora.png"]),
    ("adetailer.json", &["adetailer", "-m", "model.safetensors", "-i", "input.png", "--ad-model", "face_yolov8n.pt", "-p", "detailed portrait photo", "-n", "deformed face", "-o", "adetailer.png"]),
    (
        "hires_fix_model.json",
        &["img_gen", "-m", "model.safetensors", "-p", "a lovely cat, (watercolor:1.2)", "-n", "blurry, low quality", "--hires", "--hires-upscaler", "RealESRGAN_x4plus.safetensors", "--hires-denoising-strength", "0.5", "-o", "hires_model.png"],
    ),
    (
        "controlnet.json",
        &["img_gen", "-m", "model.safetensors", "-p", "a lovely cat, oil painting", "-n", "blurry, low quality", "--control-net", "control_v11p_sd15_canny.safetensors", "--control-image", "control.png", "--canny", "-o", "controlnet.png"],
    ),
    (
        "photomaker.json",
        &["img_gen", "-m", "sdxl.safetensors", "--photo-maker", "photomaker-v1.safetensors", "--pm-id-images-dir", "photomaker_id", "-p", "a photo of a man img, in a garden, soft light", "-n", "blurry, low quality", "-W", "1024", "-H", "1024", "--cfg-scale", "5", "-o", "photomaker.png"],
    ),
    ("adetailer_txt2img.json", &["img_gen", "-m", "model.safetensors", "-p", "portrait photo", "-n", "blurry, low quality", "--ad-model", "face_yolov8n.pt", "--ad-prompt", "[PROMPT], detailed face", "-o", "adetailer_txt2img.png"]),
    (
        "flux_dev_sd_cli.json",
        &["img_gen", "--diffusion-model", "flux1-dev.safetensors", "--clip_l", "clip_l.safetensors", "--t5xxl", "t5xxl_fp16.safetensors", "--vae", "ae.safetensors", "-p", "a lovely cat holding a sign that says 'sdflow'", "--cfg-scale", "1.0", "-W", "1024", "-H", "1024", "-o", "flux_dev_sd_cli.png"],
    ),
    (
        "sd35_sd_cli.json",
        &["img_gen", "-m", "sd3.5_medium.safetensors", "--clip_l", "clip_l.safetensors", "--clip_g", "clip_g.safetensors", "--t5xxl", "t5xxl_fp16.safetensors", "-p", "a lovely cat, (watercolor:1.2)", "-n", "blurry", "--cfg-scale", "4.5", "--slg-scale", "2.5", "-W", "1024", "-H", "1024", "-o", "sd35_sd_cli.png"],
    ),
];

/// Committed workflows no sd-cli command line describes (graph-only features).
const NOT_PRESETS: &[(&str, &str)] = &[
    ("area_composition.json", "sd-cli has no per-region prompts"),
    ("outpaint.json", "sd-cli outpaints only through a padded -i and --mask made by hand"),
    ("sdxl_txt2img.json", "sd-cli gives both SDXL encoders one prompt and the image size; CLIPTextEncodeSDXL's separate texts and sizes are ComfyUI's"),
    ("ip_adapter.json", "sd-cli has no IP-Adapter"),
    ("animatediff.json", "AnimateDiff-Evolved's graph (autoselect's linear-beta schedule, the domain adapter through LoraLoaderModelOnly, an animated WebP); `vid_gen -m … --motion-module …` builds sd-cli's (the checkpoint's own schedule, an AVI)"),
    // ComfyUI's graphs for the DiTs: its schedule (μ from the token count) and its text
    // conditioning (one T5 sequence, weights from the empty prompt). sd-cli's flags build
    // sd.cpp's instead (ManualSigmas of its schedule, SdCppConditioner).
    ("flux_dev_txt2img.json", "ComfyUI's FLUX graph; `img_gen --diffusion-model … --t5xxl …` builds sd-cli's"),
    ("flux_schnell.json", "ComfyUI's FLUX schnell graph; sd-cli's differs in schedule and conditioning"),
    ("flux_kontext_edit.json", "ComfyUI's FLUX Kontext graph (FluxKontextImageScale's resolutions); sd-cli's -r resizes by area"),
    ("flux_lora.json", "ComfyUI's FLUX graph with a LoRA; sd-cli's differs in schedule and conditioning"),
    ("flux_fill_inpaint.json", "ComfyUI's FLUX Fill graph; sd-cli's differs in schedule and conditioning"),
    ("chroma_txt2img.json", "ComfyUI's Chroma graph (no masks, beta schedule); sd-cli's masks the T5 padding"),
    ("sd35_txt2img.json", "ComfyUI's SD3.5 graph (one T5 sequence after CLIP's); sd-cli interleaves 77-token chunks"),
    ("flux2_klein.json", "ComfyUI's FLUX.2 klein graph (Flux2Scheduler's float32 linspace, CFGGuider); `img_gen --diffusion-model … --llm …` builds sd-cli's"),
    ("flux2_dev.json", "ComfyUI's FLUX.2 dev graph (Flux2Scheduler, FluxGuidance, BasicGuider); `img_gen --diffusion-model … --llm mistral…` builds sd-cli's (its flux2 schedule)"),
    ("flux2_klein_edit.json", "ComfyUI's FLUX.2 klein edit graph (ImageScaleToTotalPixels, the output at the input's size); `img_gen --diffusion-model … --llm … -r …` builds sd-cli's (nearest-neighbour resize, its flux2 schedule)"),
    ("z_image_turbo.json", "ComfyUI's Z-Image Turbo graph (res_multistep on the simple schedule); `img_gen --diffusion-model … --llm …` builds sd-cli's (euler, discrete)"),
    ("qwen_image.json", "ComfyUI's Qwen-Image graph (ModelSamplingAuraFlow 3.1, the simple schedule); `img_gen --diffusion-model … --llm …` builds sd-cli's (its discrete schedule)"),
    ("qwen_image_edit.json", "ComfyUI's Qwen-Image-Edit graph (TextEncodeQwenImageEdit: the image through Qwen2.5-VL's vision tower at a megapixel, ComfyUI's template); `img_gen … -r …` builds sd-cli's (SdCppTextEncodeQwenImageEdit: sd.cpp's Edit-Plus template and sizes)"),
    ("qwen_image_edit_2509.json", "ComfyUI's Qwen-Image-Edit-2509 graph (TextEncodeQwenImageEditPlus); `img_gen … -r …` builds sd-cli's (SdCppTextEncodeQwenImageEdit)"),
    ("qwen_image_layered.json", "ComfyUI's Qwen-Image-Layered graph (the image at 0.4 megapixels, the latent at its size); `img_gen --diffusion-model qwen_image_layered… -r …` builds sd-cli's (the -r image resized to the output, its discrete schedule)"),
    ("z_image_base.json", "ComfyUI's Z-Image graph (res_multistep on the simple schedule); sd-cli's runs euler on its discrete schedule"),
    ("wan_t2v.json", "ComfyUI's Wan 2.1 text-to-video graph (uni_pc on the simple schedule at shift 8, an animated WebP); `vid_gen --diffusion-model … --t5xxl … --video-frames …` builds sd-cli's (euler on its discrete schedule at shift 5, an AVI)"),
    ("wan22_moe_t2v.json", "ComfyUI's Wan 2.2 A14B graph (two KSamplerAdvanced halves of the simple schedule at shift 8); `vid_gen … --high-noise-diffusion-model …` builds sd-cli's (its discrete schedule split at --moe-boundary, each expert's own CFG)"),
    ("wan22_ti2v.json", "ComfyUI's Wan 2.2 TI2V 5B graph (Wan22ImageToVideoLatent's per-frame noise mask, uni_pc on the simple schedule at shift 8); `vid_gen … -i …` with the 5B model builds sd-cli's (its discrete schedule at shift 5, an AVI)"),
    ("wan_vace.json", "ComfyUI's Wan 2.1 VACE graph (LoadVideo's frames and a reference image into WanVaceToVideo, TrimVideoLatent, uni_pc at shift 8); `vid_gen … --control-video DIR -i …` builds sd-cli's (every mask cell 1, euler on its discrete schedule at shift 5)"),
    ("wan_flf2v.json", "ComfyUI's Wan 2.1 first-last-frame graph (WanFirstLastFrameToVideo, CLIP vision without cropping, uni_pc at shift 8); `vid_gen … -i … --end-img … --clip_vision …` builds sd-cli's (the CLIP images cut to their centre, euler on its discrete schedule at shift 5)"),
    ("wan_i2v.json", "ComfyUI's Wan 2.1 image-to-video graph (WanImageToVideo with CLIP vision ViT-H, uni_pc at shift 8); `vid_gen … -i … --clip_vision …` builds sd-cli's (WanFirstLastFrameToVideo, euler on its discrete schedule at shift 5)"),
];

#[test]
fn every_committed_workflow_is_a_preset() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for e in std::fs::read_dir(workflows_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) == Some("json") {
            seen.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    seen.sort();
    let mut listed: Vec<String> = FILES.iter().map(|f| f.0.to_string()).chain(NOT_PRESETS.iter().map(|f| f.0.to_string())).collect();
    listed.sort();
    assert_eq!(seen, listed, "every file in workflows/ has its flags in FILES (or a reason in NOT_PRESETS)");
    for (file, flags) in FILES {
        let committed = Workflow::parse_api(&std::fs::read_to_string(workflows_dir().join(file)).unwrap()).unwrap();
        let mut args = flags.to_vec();
        args.push("--print-workflow");
        let printed = Workflow::parse_api(&ok(&args, dir.path())).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(printed, committed, "{file}: sdflow {}", flags.join(" "));
        // --save-workflow writes the same document.
        let saved = dir.path().join("saved.json");
        let mut args = flags.to_vec();
        args.extend(["--print-workflow", "--save-workflow", saved.to_str().unwrap()]);
        ok(&args, dir.path());
        assert_eq!(Workflow::parse_api(&std::fs::read_to_string(&saved).unwrap()).unwrap(), committed, "{file} saved");
    }
}

/// sd-cli zeroes an SDXL model's unconditional embeddings when -n is empty, except for
/// EDM-v (CosXL) models; SD1 keeps the encoded empty prompt.
#[test]
fn an_empty_negative_prompt_is_zeroed_for_sdxl_as_sd_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    let xl = SdConfig::tiny_sdxl();
    write_checkpoint(&dir.path().join("xl.safetensors"), &xl, DType::F32, 1, Format::Safetensors).unwrap();
    write_checkpoint(&dir.path().join("cos.safetensors"), &SdConfig { edm_vpred: Some((0.002, 120.0)), ..xl }, DType::F32, 1, Format::Safetensors).unwrap();
    write_checkpoint(&dir.path().join("sd1.safetensors"), &SdConfig::tiny_sd1(), DType::F32, 1, Format::Safetensors).unwrap();
    let zeroed = |model: &str, neg: &str| ok(&["img_gen", "-m", model, "-p", "a cat", "-n", neg, "--print-workflow"], dir.path()).contains("ConditioningZeroOut");
    assert!(zeroed("xl.safetensors", ""));
    assert!(!zeroed("xl.safetensors", "blurry"));
    assert!(!zeroed("cos.safetensors", ""));
    assert!(!zeroed("sd1.safetensors", ""));
}

#[test]
fn sd_cli_spellings_of_the_mode() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["-m", "model.safetensors", "-p", "a cat", "--print-workflow"];
    let plain = ok(&[&["img_gen"], &base[..]].concat(), dir.path());
    assert_eq!(ok(&[&["txt2img"], &base[..]].concat(), dir.path()), plain);
    assert_eq!(ok(&[&["-M", "img_gen"], &base[..]].concat(), dir.path()), plain);
    // No mode at all: sd-cli's default, img_gen.
    assert_eq!(ok(&base, dir.path()), plain);
    // A path to the model prints as its file name.
    let with_path = ok(&["img_gen", "-m", "some/folder/model.safetensors", "-p", "a cat", "--print-workflow"], dir.path());
    assert_eq!(with_path, plain);
    // A negative seed is drawn once and written into the graph.
    let random = ok(&["img_gen", "-m", "m.safetensors", "-s", "-1", "--print-workflow"], dir.path());
    let wf = Workflow::parse_api(&random).unwrap();
    let seed = match &wf.nodes["5"].inputs["seed"] {
        sdflow_executor::InputValue::Const(v) => v.as_i64().unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(seed >= 0);
}

#[test]
fn bad_flags_get_a_message_and_the_usage() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = fails(&["img_gen", "-m", "m.safetensors", "--no-such-flag"], dir.path());
    assert_eq!(code, 2);
    assert!(err.contains("unexpected argument '--no-such-flag'") && err.contains("Usage:"), "{err}");
    let (_, err) = fails(&["img_gen", "-m", "m.safetensors", "--steps", "many"], dir.path());
    assert!(err.contains("invalid value 'many' for '--steps <int>'") && err.contains("Usage:"), "{err}");
    let (_, err) = fails(&["img_gen", "-m", "m.safetensors", "--sampling-method", "euler_b"], dir.path());
    assert!(err.contains("euler_b") && err.contains("possible values"), "{err}");
    let (_, err) = fails(&["img_gen", "-m", "m.safetensors", "-W", "0", "--print-workflow"], dir.path());
    assert!(err.contains("invalid value '0' for '--width <int>'") && err.contains("Usage:"), "{err}");
    let (_, err) = fails(&["img_gen", "-p", "a cat", "--print-workflow"], dir.path());
    assert!(err.contains("-m/--model"), "{err}");
    let (_, err) = fails(&["img_gen", "-m", "m.safetensors", "--type", "q9_9", "--print-workflow"], dir.path());
    assert!(err.contains("invalid weight type q9_9") && err.contains("auto, stored"), "{err}");
    let (_, err) = fails(&["-M", "no_such_mode", "-m", "m.safetensors"], dir.path());
    assert!(err.contains("no_such_mode") && err.contains("Usage:"), "{err}");
}

#[test]
fn unsupported_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (args, expect) in [
        (&["img_gen", "-m", "m.safetensors", "--high-noise-diffusion-model", "w.safetensors"][..], "not supported yet: --high-noise-diffusion-model w.safetensors in the img_gen mode (Wan2.2's experts run in vid_gen"),
        (&["img_gen", "-m", "m.safetensors", "--mmap"][..], "not supported yet: --mmap ("),
        (&["img_gen", "-m", "m.safetensors", "--backend", "vae=cpu,diffusion=tpu0"][..], "--backend: no device `tpu0` in this build (devices: CPU"),
        (&["img_gen", "-m", "m.safetensors", "--backend", "refiner=cpu"][..], "--backend: unknown module `refiner`"),
        (&["img_gen", "-m", "m.safetensors", "--max-vram", "lots"][..], "--max-vram: `lots` is not a number of GiB"),
        (&["img_gen", "-m", "m.safetensors", "--rng", "cuda", "--sampler-rng", "cpu"][..], "not supported yet: --sampler-rng cpu with --rng cuda ("),
        (&["adetailer", "-m", "m.safetensors", "-i", "in.png", "--ad-model", "face.pt", "--sigmas", "14.6,7.8,0"][..], "not supported yet: --sigmas in the adetailer mode ("),
        (&["img_gen", "-m", "m.safetensors", "--tensor-type-rules", "vae=f16"][..], "not supported yet: --tensor-type-rules vae=f16"),
        (&["img_gen", "-m", "m.safetensors", "-o", "out.jpg"][..], "not supported yet: -o out.jpg (SaveImage writes PNG"),
        (&["img_gen", "-m", "m.safetensors", "--prediction", "flux2_flow"][..], "not supported yet: --prediction flux2_flow ("),
        (&["img_gen", "-m", "m.safetensors", "--preview", "vae"][..], "not supported yet: --preview vae"),
        (&["img_gen", "-m", "m.safetensors", "--preview", "tae"][..], "missing --taesd: --preview tae"),
        (&["img_gen", "-m", "m.safetensors", "--preview", "proj", "--preview-path", "p.gif"][..], "invalid value for --preview-path: p.gif"),
        (&["vid_gen", "-m", "m.safetensors", "--video-frames", "9"][..], "vid_gen with an SD model needs an AnimateDiff motion module"),
        (&["-M", "vid_gen", "-m", "m.safetensors"][..], "vid_gen with an SD model needs an AnimateDiff motion module"),
        (&["vid_gen", "-m", "m.safetensors", "--video-frames", "0"][..], "invalid value for --video-frames: 0"),
    ] {
        let (code, err) = fails(args, dir.path());
        assert_eq!(code, 1, "{args:?}");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

/// Flags whose nodes this build may lack are refused exactly when the node catalogue
/// lacks them (other parts of sdflow add nodes; the refusal follows the catalogue).
#[test]
fn flags_needing_absent_nodes_name_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let rt = sdflow_nodes::Runtime::new(dir.path(), dir.path(), 1, None).unwrap();
    let mut reg = sdflow_executor::Registry::new();
    sdflow_nodes::register_all(&mut reg, std::sync::Arc::new(rt));
    for (args, flag, class) in [
        (&["-p", "a cat <lora:ink:0.7>"][..], "<lora:ink:0.7>", "LoraLoader"),
        (&["--vae", "vae.safetensors"][..], "--vae", "VAELoader"),
        (&["--upscale-model", "esrgan.pth"][..], "--upscale-model", "UpscaleModelLoader"),
        (&["--control-net", "cn.safetensors", "--control-image", "c.png"][..], "--control-net", "ControlNetLoader"),
        (&["--vae-tiling"][..], "--vae-tiling", "VAEDecodeTiled"),
        (&["--ad-model", "face_yolov8n.pt"][..], "--ad-model", "DetailerForEachMask"),
        (&["-b", "2", "-i", "in.png"][..], "-b", "RepeatLatentBatch"),
        (&["--circular"][..], "--circular", "SeamlessTile"),
    ] {
        let mut full = vec!["img_gen", "-m", "m.safetensors"];
        full.extend(args);
        let refusal = format!("not supported yet: {flag} (needs node {class})");
        // Printing works either way and notes what this build cannot run.
        let mut print = full.clone();
        print.push("--print-workflow");
        let out = sdflow(&print, dir.path());
        assert!(out.status.success(), "{print:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains(&format!("\"{class}\"")), "{print:?} emits {class}");
        let out = sdflow(&full, dir.path());
        let err = text(&out.stderr);
        if reg.get(class).is_none() {
            assert!(!out.status.success() && err.contains(&refusal), "{full:?}: {err}");
            assert!(text(&sdflow(&print, dir.path()).stderr).contains(&refusal));
        } else {
            assert!(!err.contains(&refusal), "{class} exists now, yet {full:?} was refused: {err}");
        }
    }
}

fn write_png(path: &Path, w: u32, h: u32) {
    let mut enc = png::Encoder::new(std::io::BufWriter::new(std::fs::File::create(path).unwrap()), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let px: Vec<u8> = (0..h).flat_map(|y| (0..w).flat_map(move |x| [(x * 255 / w) as u8, (y * 255 / h) as u8, 128])).collect();
    enc.write_header().unwrap().write_image_data(&px).unwrap();
}

fn png_pixels(path: &Path) -> Vec<u8> {
    let mut r = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap())).read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    buf
}

fn png_size(path: &Path) -> (u32, u32) {
    let r = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap())).read_info().unwrap();
    (r.info().width, r.info().height)
}

/// A real run: sd-cli's flags with file paths, a batch named by `-o`'s pattern, the
/// images' metadata read back by `sdflow metadata`; then img2img and inpainting from
/// the result.
#[test]
fn img_gen_runs_on_a_tiny_model_and_writes_where_o_says() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("weights/tiny.safetensors");
    std::fs::create_dir_all(model.parent().unwrap()).unwrap();
    write_checkpoint(&model, &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    let m = model.to_str().unwrap();
    let out = ok(&["-m", m, "-p", "a lovely cat", "-n", "blurry", "-W", "64", "-H", "48", "--steps", "2", "-b", "2", "-s", "7", "-t", "2", "-o", "shots/cat_%02d.png"], dir.path());
    assert!(out.contains("save result image to 'shots/cat_00.png'"), "{out}");
    assert!(out.contains("KSampler"), "the run summary: {out}");
    let (a, b) = (dir.path().join("shots/cat_00.png"), dir.path().join("shots/cat_01.png"));
    assert_eq!(png_size(&a), (64, 48));
    assert_eq!(png_size(&b), (64, 48));
    assert!(!dir.path().join("shots/cat_02.png").exists());

    // What SaveImage embedded, read without loading anything.
    let json: serde_json::Value = serde_json::from_str(&ok(&["metadata", "shots/cat_00.png", "--metadata-format", "json"], dir.path())).unwrap();
    assert_eq!(json["format"], "png");
    assert_eq!((json["width"].as_u64(), json["height"].as_u64()), (Some(64), Some(48)));
    let entries = json["entries"].as_array().unwrap();
    let entry = |key: &str| entries.iter().find(|e| e["key"] == key).unwrap_or_else(|| panic!("no {key} in {entries:?}"));
    let params = entry("parameters")["text"].as_str().unwrap();
    assert!(params.starts_with("a lovely cat\nNegative prompt: blurry\n"), "{params}");
    assert!(params.contains("Steps: 2, Sampler: Euler a, Schedule type: normal, CFG scale: 7.0, Seed: 7, Size: 64x48, Model: tiny"), "{params}");
    assert_eq!(entry("prompt")["json"]["5"]["class_type"], "KSampler");
    assert!(entry("workflow")["json"]["nodes"].is_array());
    let text_form = ok(&["metadata", "-i", "shots/cat_01.png"], dir.path());
    assert!(text_form.contains("format: PNG, 64x48") && text_form.contains("[tEXt] parameters:\na lovely cat"), "{text_form}");
    let (_, err) = fails(&["metadata", "weights/tiny.safetensors"], dir.path());
    assert!(err.contains("not a PNG, JPEG or WebP file") && err.contains("weights/tiny.safetensors"), "{err}");
    // A missing file: its name and the OS error once each.
    let (_, err) = fails(&["metadata", "missing.png"], dir.path());
    assert_eq!((err.matches("missing.png").count(), err.matches("(os error 2)").count()), (1, 1), "{err}");

    // The image carries its graph: `sdflow run IMAGE` makes the same pictures again.
    ok(&["run", "shots/cat_00.png", "--models-dir", "weights", "--output-dir", "rerun", "-t", "2"], dir.path());
    let mut again: Vec<PathBuf> = std::fs::read_dir(dir.path().join("rerun")).unwrap().map(|e| e.unwrap().path()).collect();
    again.sort();
    assert_eq!(again.len(), 2, "{again:?}");
    assert_eq!(png_pixels(&again[0]), png_pixels(&a), "same graph, same seed, same image");
    assert_eq!(png_pixels(&again[1]), png_pixels(&b));
    assert_ne!(png_pixels(&a), png_pixels(&b), "the two images of a batch differ");

    // img2img from a file in another folder, resized by -W/-H; inpainting with a mask.
    write_png(&dir.path().join("mask.png"), 64, 48);
    ok(&["img_gen", "-m", m, "-p", "a cat", "-i", "shots/cat_00.png", "-W", "72", "-H", "56", "--steps", "2", "--strength", "0.5", "-t", "2"], dir.path());
    assert_eq!(png_size(&dir.path().join("output.png")), (72, 56), "sd-cli's default output, at the -W/-H size");
    ok(&["img_gen", "-m", m, "-p", "a hat", "-i", "shots/cat_01.png", "--mask", "mask.png", "--steps", "2", "-t", "2", "-o", "inpainted.png"], dir.path());
    assert_eq!(png_size(&dir.path().join("inpainted.png")), (64, 48));

    // A missing file is named.
    let (_, err) = fails(&["img_gen", "-m", "weights/none.safetensors", "-p", "x"], dir.path());
    assert!(err.contains("-m weights/none.safetensors: no such file"), "{err}");
    // A file that is no model, and a broken model: named as the user gave them, never by
    // the staging folder they were linked into.
    std::fs::write(dir.path().join("log.md"), "# notes").unwrap();
    let (_, err) = fails(&["img_gen", "-m", "log.md", "-p", "x"], dir.path());
    assert!(err.contains("-m log.md: not a model file") && err.contains(".safetensors"), "{err}");
    std::fs::write(dir.path().join("weights/broken.safetensors"), b"\x10\0\0\0\0\0\0\0{not json}").unwrap();
    let (_, err) = fails(&["img_gen", "-m", "weights/broken.safetensors", "-p", "x", "--steps", "1"], dir.path());
    let real = dir.path().join("weights/broken.safetensors").canonicalize().unwrap();
    assert!(err.contains(&real.display().to_string()) && !err.contains("sdflow-stage"), "{err}");
}

/// `--type`: by default (`auto`) float weights load as bf16 where the CPU runs our bf16
/// kernels and as stored elsewhere; quantized weights keep their type under the default,
/// while a type name converts every weight, as sd-cli's `--type` does.
#[test]
fn weight_type_defaults_to_the_cpus_pick() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("weights");
    std::fs::create_dir_all(&weights).unwrap();
    write_checkpoint(&weights.join("tiny.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    write_checkpoint(&weights.join("tiny_q8.gguf"), &SdConfig::tiny_sd1_f8(), DType::Q8_0, 11, Format::Gguf).unwrap();
    let image = |model: &str, ty: &[&str], out: &str| {
        let m = format!("weights/{model}");
        let mut args = vec!["-m", &m, "-p", "a lovely cat", "-W", "64", "-H", "64", "--steps", "2", "-s", "5", "--sampling-method", "euler", "-o", out];
        args.extend_from_slice(ty);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let auto = image("tiny.safetensors", &[], "auto.png");
    let stored = image("tiny.safetensors", &["--type", "stored"], "stored.png");
    let bf16 = image("tiny.safetensors", &["--type", "bf16"], "bf16.png");
    assert_eq!(image("tiny.safetensors", &["--type", "auto"], "auto2.png"), auto, "auto is the default");
    if sdflow_core::ggml::bf16::available() {
        assert_eq!(auto, bf16, "f32 weights run as bf16 on this CPU");
        assert_ne!(auto, stored);
    } else {
        assert_eq!(auto, stored, "no bf16 kernels here: weights as stored");
    }
    // A q8_0 file keeps f32 tensors where rows do not fill q8_0 blocks (3×3 kernels): the
    // default converts those and leaves the q8_0 ones, `--type bf16` converts both.
    let q8 = image("tiny_q8.gguf", &[], "q8_auto.png");
    let q8_stored = image("tiny_q8.gguf", &["--type", "stored"], "q8_stored.png");
    let q8_bf16 = image("tiny_q8.gguf", &["--type", "bf16"], "q8_bf16.png");
    assert_ne!(q8_bf16, q8_stored, "a type name converts quantized weights too");
    if sdflow_core::ggml::bf16::available() {
        assert_ne!(q8, q8_bf16, "the default never dequantizes");
        assert_ne!(q8, q8_stored);
    } else {
        assert_eq!(q8, q8_stored);
    }
    // `sdflow run` takes the flag too: the stored-type image's own graph, run as stored.
    ok(&["run", "stored.png", "--models-dir", "weights", "--output-dir", "rerun", "--type", "stored"], dir.path());
    assert_eq!(png_pixels(&only_png(&dir.path().join("rerun"))), stored);
}

/// `-m` naming a diffusers pipeline folder: linked as it is, loaded as the checkpoint it
/// was converted from.
#[test]
fn img_gen_takes_a_diffusers_pipeline_folder() {
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("tiny.safetensors");
    write_checkpoint(&single, &SdConfig::tiny_sd1(), DType::F32, 21, Format::Safetensors).unwrap();
    sdflow_tests::write_pipeline_folder(&single, &dir.path().join("tiny-diffusers"), "sd1", "StableDiffusionPipeline", "epsilon");
    let args = |m: &'static str, o: &'static str| ["-m", m, "-p", "a lovely cat", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "-t", "2", "-o", o];
    ok(&args("tiny.safetensors", "single.png"), dir.path());
    ok(&args("tiny-diffusers", "folder.png"), dir.path());
    assert_eq!(png_pixels(&dir.path().join("folder.png")), png_pixels(&dir.path().join("single.png")));
}

fn tensors_f32(path: &Path) -> Vec<(String, DType, Vec<usize>, Vec<f32>)> {
    let src = io::open(path).unwrap();
    src.tensors()
        .iter()
        .map(|t| {
            let bytes = src.read(&t.name).unwrap();
            (t.name.clone(), t.dtype, t.shape.clone(), dtype::to_f32(t.dtype, &bytes, t.n_elements()).unwrap())
        })
        .collect()
}

#[test]
fn convert_writes_gguf_and_safetensors_with_the_asked_types() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.safetensors");
    write_checkpoint(&src, &SdConfig::tiny_sd1(), DType::F32, 5, Format::Safetensors).unwrap();
    let original = tensors_f32(&src);

    ok(&["convert", "-m", "tiny.safetensors", "-o", "tiny-q8.gguf", "--type", "q8_0"], dir.path());
    let q8: std::collections::BTreeMap<String, (DType, Vec<usize>, Vec<f32>)> = tensors_f32(&dir.path().join("tiny-q8.gguf")).into_iter().map(|(n, t, s, v)| (n, (t, s, v))).collect();
    assert_eq!(q8.len(), original.len());
    let mut quantized = 0;
    for (name, _, shape, want) in &original {
        let (qtype, qshape, got) = &q8[name];
        assert_eq!(shape, qshape, "{name}");
        // sd.cpp's rule: biases, `.scale`s, embeddings and rows that are not whole 32-value
        // blocks keep their type; everything else becomes q8_0.
        let eligible = !name.ends_with(".bias") && !name.ends_with(".scale") && !name.contains("embedding") && shape.last().unwrap_or(&1) % 32 == 0;
        assert_eq!(*qtype, if eligible { DType::Q8_0 } else { DType::F32 }, "{name} {shape:?}");
        if *qtype == DType::Q8_0 {
            quantized += 1;
        }
        // Q8_0 stores each 32-value block as int8 times a scale of max|x|/127.
        let row = *shape.last().unwrap_or(&1);
        for (r, (w, g)) in want.chunks(row.max(1)).zip(got.chunks(row.max(1))).enumerate() {
            for (blk_w, blk_g) in w.chunks(32).zip(g.chunks(32)) {
                let amax = blk_w.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = blk_w.iter().zip(blk_g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                // Half a step, plus the f16 rounding of the block's scale.
                assert!(worst <= amax / 127.0 * 0.6 + 1e-6, "{name} row {r}: error {worst} for block max {amax} ({qtype:?})");
            }
        }
    }
    assert!(quantized > 10, "only {quantized} of {} tensors became q8_0", original.len());

    ok(&["-M", "convert", "-m", "tiny.safetensors", "-o", "tiny-f16.safetensors", "--type", "f32", "--tensor-type-rules", "first_stage_model\\.=f16"], dir.path());
    let f16: std::collections::BTreeMap<String, (DType, Vec<f32>)> = tensors_f32(&dir.path().join("tiny-f16.safetensors")).into_iter().map(|(n, t, _, v)| (n, (t, v))).collect();
    assert_eq!(f16.len(), original.len());
    for (name, _, _, want) in &original {
        let (t, got) = &f16[name];
        let expect = if name.starts_with("first_stage_model.") && !name.ends_with(".bias") { DType::F16 } else { DType::F32 };
        assert_eq!(*t, expect, "{name}");
        for (a, b) in want.iter().zip(got) {
            assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-7, "{name}: {a} became {b}");
        }
    }

    let (_, err) = fails(&["convert", "-m", "tiny.safetensors", "-o", "tiny.bin"], dir.path());
    assert!(err.contains("must end in .gguf or .safetensors"), "{err}");
    let (_, err) = fails(&["convert", "-m", "tiny.safetensors", "-o", "q.safetensors", "--type", "q8_0"], dir.path());
    assert!(err.contains("cannot be stored in safetensors"), "{err}");
    assert!(!dir.path().join("q.safetensors").exists() && !dir.path().join("q.safetensors.partial").exists(), "no half-written file");
    let (_, err) = fails(&["convert", "-m", "tiny.safetensors", "-o", "x.gguf", "--tensor-type-rules", "([=f16"], dir.path());
    assert!(err.contains("bad regex"), "{err}");
    let (_, err) = fails(&["convert", "-m", "missing.safetensors", "-o", "x.gguf"], dir.path());
    assert!(err.contains("missing.safetensors"), "{err}");
}

/// `sdflow upscale` and `img_gen --upscale-model` on the tiny ESRGAN fixture of the
/// upscaler's own tests (core/tests/fixtures/models/esrgan), and `--vae-tiling`.
#[test]
fn upscale_and_tiled_decoding_run() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/models/esrgan");
    let (model, input) = (fixtures.join("srvgg_x4_tiny.pth"), fixtures.join("input.png"));
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny.safetensors");
    write_checkpoint(&ckpt, &SdConfig::tiny_sd1_f8(), DType::F32, 3, Format::Safetensors).unwrap();
    let c = ckpt.to_str().unwrap();
    // Tiles of 8 latent pixels (64 image pixels) over a 128x64 image: several tiles.
    ok(&["-m", c, "-p", "a cat", "-W", "128", "-H", "64", "--steps", "1", "--vae-tiling", "--vae-tile-size", "8x8", "-t", "2", "-o", "tiled.png"], dir.path());
    assert_eq!(png_size(&dir.path().join("tiled.png")), (128, 64));
    // sd-cli's other tile shapes: non-square tiles, tiles relative to the latent.
    ok(&["-m", c, "-p", "a cat", "-W", "128", "-H", "64", "--steps", "1", "--vae-tiling", "--vae-tile-size", "16x8", "-t", "2", "-o", "tall.png"], dir.path());
    ok(&["-m", c, "-p", "a cat", "-W", "128", "-H", "64", "--steps", "1", "--vae-tiling", "--vae-relative-tile-size", "2x1", "-t", "2", "-o", "rel.png"], dir.path());
    let tiled = png_pixels(&dir.path().join("tiled.png"));
    assert!(png_pixels(&dir.path().join("tall.png")) != tiled && png_pixels(&dir.path().join("rel.png")) != tiled);
    let (_, err) = fails(&["-m", c, "--vae-relative-tile-size", "2x1"], dir.path());
    assert!(err.contains("missing --vae-tiling"), "{err}");
    let (code, err) = fails(&["-m", c, "--vae-tiling", "--vae-relative-tile-size", "2xwide"], dir.path());
    assert!(code == 2 && err.contains("--vae-relative-tile-size"), "{err}");
    if !model.is_file() || !input.is_file() {
        eprintln!("SKIP upscale part: {} is gone (the ESRGAN tests' fixture)", model.display());
        return;
    }
    let (w, h) = png_size(&input);
    ok(&["upscale", "-i", input.to_str().unwrap(), "--upscale-model", model.to_str().unwrap(), "--upscale-repeats", "2", "-o", "up.png"], dir.path());
    assert_eq!(png_size(&dir.path().join("up.png")), (w * 16, h * 16), "two ×4 passes");
    ok(&["-m", c, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "1", "--upscale-model", model.to_str().unwrap(), "-t", "2", "-o", "gen_up.png"], dir.path());
    assert_eq!(png_size(&dir.path().join("gen_up.png")), (256, 256));
}

/// sd-cli's `--circular`, `--circularx`, `--circulary` (seamless tiling): SeamlessTile and
/// MakeCircularVAE in the graph, no longer among the refused flags of `--help`, and runs on
/// the tiny checkpoint that differ from the plain image (txt2img, img2img, tiled VAE).
#[test]
fn circular_flags_make_tileable_images() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, tiling) in [(&["--circular"][..], "enable"), (&["--circularx"][..], "x_only"), (&["--circulary"][..], "y_only"), (&["--circularx", "--circulary"][..], "enable")] {
        let mut args = vec!["img_gen", "-m", "m.safetensors", "-p", "a cat", "--print-workflow"];
        args.extend(flags);
        let wf: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
        let nodes: Vec<&serde_json::Value> = wf["nodes"].as_object().unwrap().values().collect();
        for class in ["SeamlessTile", "MakeCircularVAE"] {
            let n = nodes.iter().find(|n| n["class_type"] == class).unwrap_or_else(|| panic!("{flags:?}: no {class}"));
            assert_eq!(n["inputs"]["tiling"], tiling, "{flags:?}");
        }
    }
    let help = ok(&["img_gen", "--help"], dir.path());
    assert!(help.contains("--circular") && !help.contains("circular padding is not implemented"), "{help}");

    let model = dir.path().join("tiny.safetensors");
    write_checkpoint(&model, &SdConfig::tiny_sd1_f8(), DType::F32, 5, Format::Safetensors).unwrap();
    let m = model.to_str().unwrap();
    write_png(&dir.path().join("in.png"), 64, 64);
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["-m", m, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "-t", "2", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let plain = run(&[], "plain.png");
    let both = run(&["--circular"], "both.png");
    let x_only = run(&["--circularx"], "x.png");
    assert!(both != plain && x_only != both && x_only != plain);
    assert_eq!(run(&["--circularx", "--circulary"], "xy.png"), both);
    // img2img encodes with the circular VAE.
    assert_ne!(run(&["--circular", "-i", "in.png", "--strength", "0.5"], "i2i.png"), run(&["-i", "in.png", "--strength", "0.5"], "i2i_plain.png"));
    // Tiles of 8 latent pixels over a 16×8 latent: they wrap around across the width, one
    // spans the height (its convolutions wrap).
    let tiled = |extra: &[&str], out: &str| {
        let mut args = vec!["-m", m, "-p", "a cat", "-W", "128", "-H", "64", "--steps", "1", "-s", "3", "-t", "2", "--vae-tiling", "--vae-tile-size", "8x8", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    assert_ne!(tiled(&["--circular"], "tiled.png"), tiled(&[], "tiled_plain.png"));
}

/// `<lora:NAME:W>` tags run: the LoRA from `--lora-model-dir` changes the image, and a
/// weight of 0 gives exactly the image without the tag.
#[test]
fn img_gen_applies_lora_tags() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.safetensors");
    write_checkpoint(&model, &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    let loras = dir.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    let src = io::open(&model).unwrap();
    sdflow_core::lora::synth::write_random_lora(src.as_ref(), &loras.join("ink.safetensors"), 4, 0.3, 5, Format::Safetensors).unwrap();
    let run = |prompt: &str, out: &str| {
        ok(&["-m", model.to_str().unwrap(), "--lora-model-dir", loras.to_str().unwrap(), "-p", prompt, "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "-o", out], dir.path());
        png_pixels(&dir.path().join(out))
    };
    let plain = run("a lovely cat", "plain.png");
    let ink = run("<lora:ink:0.8>a lovely cat", "ink.png");
    assert_ne!(ink, plain);
    assert_eq!(run("<lora:ink:0>a lovely cat", "zero.png"), plain);

    // --lora-apply-mode reaches the LoraLoader: at_runtime draws what the default (auto,
    // on these f32 weights: immediately) draws, to within rounding. `--type stored` keeps
    // them f32 on CPUs where the default would be bf16.
    let ink = {
        ok(&["-m", model.to_str().unwrap(), "--lora-model-dir", loras.to_str().unwrap(), "-p", "<lora:ink:0.8>a lovely cat", "--type", "stored", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "-o", "ink32.png"], dir.path());
        png_pixels(&dir.path().join("ink32.png"))
    };
    let wf = ok(&["-m", model.to_str().unwrap(), "--lora-model-dir", loras.to_str().unwrap(), "-p", "<lora:ink:0.8>a cat", "--lora-apply-mode", "at_runtime", "--print-workflow"], dir.path());
    let wf: serde_json::Value = serde_json::from_str(&wf).unwrap();
    assert_eq!(wf["nodes"]["8"]["inputs"]["apply_mode"], "at_runtime", "{wf}");
    ok(&["-m", model.to_str().unwrap(), "--lora-model-dir", loras.to_str().unwrap(), "-p", "<lora:ink:0.8>a lovely cat", "--lora-apply-mode", "at_runtime", "--type", "stored", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "-o", "rt.png"], dir.path());
    let rt = png_pixels(&dir.path().join("rt.png"));
    assert!(rt.iter().zip(&ink).all(|(a, b)| a.abs_diff(*b) <= 2), "at_runtime is within 2 levels of immediately");
    let (_, e) = fails(&["-m", model.to_str().unwrap(), "-p", "a cat", "--lora-apply-mode", "later", "--print-workflow"], dir.path());
    assert!(e.contains("later") && e.contains("at_runtime"), "{e}");
}

/// sd-cli's ControlNet flags run: `--control-net` and `--control-image` change the image,
/// `--canny` edge-detects the control image first, `--control-strength 0` is no
/// ControlNet, and a missing ControlNet file is named.
#[test]
fn img_gen_runs_a_controlnet() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.safetensors");
    let cfg = SdConfig::tiny_sd1_f8();
    write_checkpoint(&model, &cfg, DType::F32, 11, Format::Safetensors).unwrap();
    let cn = dir.path().join("control_canny.safetensors");
    sdflow_core::synth::write_controlnet(&cn, &cfg.unet, 3, 4).unwrap();
    write_png(&dir.path().join("edges.png"), 80, 64);
    let (m, c) = (model.to_str().unwrap(), cn.to_str().unwrap());
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["-m", m, "-p", "a lovely cat", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let plain = run(&[], "plain.png");
    let controlled = run(&["--control-net", c, "--control-image", "edges.png"], "cn.png");
    assert_ne!(controlled, plain);
    let canny = run(&["--control-net", c, "--control-image", "edges.png", "--canny"], "canny.png");
    assert!(canny != controlled && canny != plain, "--canny changes the hint");
    assert_eq!(run(&["--control-net", c, "--control-image", "edges.png", "--control-strength", "0"], "zero.png"), plain);
    let (_, e) = fails(&["-m", m, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "1", "--control-net", "missing_cn.safetensors", "--control-image", "edges.png", "-o", "x.png"], dir.path());
    assert!(e.contains("missing_cn.safetensors"), "{e}");
}

/// sd-cli's placement flags on a CPU-only build: every module lands on the CPU, weights
/// kept in RAM, read from disk per use, or under a budget give the very same image; the
/// kernel switches (flash attention, direct convolutions) the same image within rounding.
#[test]
fn placement_flags_run_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let listed = ok(&["img_gen", "--list-devices"], dir.path());
    assert!(listed.lines().next().is_some_and(|l| l.starts_with("CPU\t")), "{listed}");
    let model = dir.path().join("tiny.safetensors");
    let cfg = SdConfig::tiny_sd1_f8();
    write_checkpoint(&model, &cfg, DType::F32, 11, Format::Safetensors).unwrap();
    let cn = dir.path().join("control.safetensors");
    sdflow_core::synth::write_controlnet(&cn, &cfg.unet, 3, 4).unwrap();
    write_png(&dir.path().join("edges.png"), 64, 64);
    let (m, c) = (model.to_str().unwrap(), cn.to_str().unwrap());
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["-m", m, "-p", "a lovely cat", "-W", "64", "-H", "64", "--steps", "2", "-s", "3", "--type", "f32", "--control-net", c, "--control-image", "edges.png", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let plain = run(&[], "plain.png");
    let placed = run(&["--offload-to-cpu", "--clip-on-cpu", "--vae-on-cpu", "--control-net-cpu", "--backend", "cpu", "--max-vram", "4"], "placed.png");
    assert_eq!(placed, plain);
    assert_eq!(run(&["--params-backend", "disk,vae=cpu"], "disk.png"), plain);
    let kernels = run(&["--fa", "--diffusion-conv-direct", "--vae-conv-direct"], "kernels.png");
    let worst = kernels.iter().zip(&plain).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    assert!(worst <= 2, "direct convolutions and fused attention move a pixel by {worst}/255");
}

/// The sdflow-format file of `workflows/` as ComfyUI's API format: its `nodes` object
/// alone, `{id: {class_type, inputs}}`.
fn api_format(file: &str) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(workflows_dir().join(file)).unwrap()).unwrap();
    doc["nodes"].clone()
}

/// A temporary folder with a tiny random-weight SD1 checkpoint at `weights/tiny.safetensors`.
fn tiny_weights() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("weights")).unwrap();
    write_checkpoint(&dir.path().join("weights/tiny.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    dir
}

/// A1111's `parameters` text that SaveImage embedded in `png`.
fn parameters(png: &Path, cwd: &Path) -> String {
    let json: serde_json::Value = serde_json::from_str(&ok(&["metadata", png.to_str().unwrap(), "--metadata-format", "json"], cwd)).unwrap();
    let entries = json["entries"].as_array().unwrap();
    entries.iter().find(|e| e["key"] == "parameters").and_then(|e| e["text"].as_str()).unwrap_or_else(|| panic!("no parameters in {json}")).to_string()
}

/// The one PNG in `dir`.
fn only_png(dir: &Path) -> PathBuf {
    let pngs: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "png")).collect();
    assert_eq!(pngs.len(), 1, "{pngs:?}");
    pngs[0].clone()
}

/// `sdflow run` on the committed txt2img workflow, shrunk and pointed at a tiny model by
/// `--set`: what `--set` says is what runs (the sampler's seed and steps, the latent's
/// size), so another seed gives another image.
#[test]
fn run_set_overrides_change_the_run() {
    let dir = tiny_weights();
    let wf = workflows_dir().join("txt2img.json");
    let run = |seed: u32, out: &str| {
        let seed = format!("5.seed={seed}");
        let stdout = ok(
            &["run", wf.to_str().unwrap(), "--models-dir", "weights", "--set", "1.ckpt_name=tiny.safetensors", "--set", "4.width=64", "--set", "4.height=48", "--set", "5.steps=2", "--set", &seed, "--output-dir", out, "-t", "2"],
            dir.path(),
        );
        assert!(stdout.contains("KSampler") && stdout.contains("ran"), "the run summary: {stdout}");
        only_png(&dir.path().join(out))
    };
    let a = run(123, "a");
    assert_eq!(png_size(&a), (64, 48));
    let params = parameters(&a, dir.path());
    assert!(params.contains("Steps: 2,") && params.contains("Seed: 123,") && params.contains("Size: 64x48"), "{params}");
    let b = run(124, "b");
    assert!(parameters(&b, dir.path()).contains("Seed: 124,"));
    assert_ne!(png_pixels(&a), png_pixels(&b), "another seed, another image");

    // A --set naming what is not there is refused before anything runs.
    let (code, err) = fails(&["run", wf.to_str().unwrap(), "--set", "99.seed=1"], dir.path());
    assert_eq!(code, 1);
    assert!(err.contains("no node '99'"), "{err}");
    let (_, err) = fails(&["run", wf.to_str().unwrap(), "--set", "5.sead=1"], dir.path());
    assert!(err.contains("node 5 (KSampler) has no input 'sead'"), "{err}");
}

/// A workflow with several mistakes is refused as a whole: exit code 1 and every error,
/// each naming its node and input, before anything runs.
#[test]
fn run_prints_the_whole_validation_report() {
    let dir = tiny_weights();
    let mut wf = api_format("txt2img.json");
    wf["1"]["inputs"]["ckpt_name"] = "missing.safetensors".into();
    wf["5"]["inputs"]["steps"] = "many".into();
    wf["5"]["inputs"]["sampler_name"] = "euler_b".into();
    wf["3"]["inputs"].as_object_mut().unwrap().remove("text");
    wf["7"]["inputs"]["images"] = serde_json::json!(["6", 3]);
    std::fs::write(dir.path().join("bad.json"), wf.to_string()).unwrap();
    let (code, err) = fails(&["run", "bad.json", "--models-dir", "weights", "--output-dir", "out"], dir.path());
    assert_eq!(code, 1, "{err}");
    let line = |node: &str, words: &[&str]| {
        assert!(
            err.lines().any(|l| l.contains(node) && words.iter().all(|w| l.contains(w))),
            "no line naming {node} and {words:?} in:\n{err}"
        );
    };
    line("node 1 (CheckpointLoaderSimple)", &["ckpt_name", "missing.safetensors"]);
    line("node 5 (KSampler)", &["steps", "many"]);
    line("node 5 (KSampler)", &["sampler_name", "euler_b"]);
    line("node 3 (CLIPTextEncode)", &["text", "missing"]);
    line("node 7 (SaveImage)", &["images"]);
    assert!(err.contains("bad.json") && err.contains("failed validation"), "{err}");
    assert!(!dir.path().join("out").exists() || std::fs::read_dir(dir.path().join("out")).unwrap().next().is_none(), "nothing ran");
}

/// A workflow naming a checkpoint that is not in --models-dir (the committed ones name
/// model.safetensors) is refused with the files that are there, at most 20 of them, and
/// where they are looked up.
#[test]
fn a_missing_model_is_refused_with_the_models_there() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("weights/checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    for name in ["b.safetensors", "a.safetensors"] {
        std::fs::write(checkpoints.join(name), b"").unwrap();
    }
    let wf = workflows_dir().join("txt2img.json");
    let (code, err) = fails(&["run", wf.to_str().unwrap(), "--models-dir", "weights"], dir.path());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(r#"ckpt_name: 'model.safetensors' not in ["a.safetensors", "b.safetensors"]"#), "{err}");
    assert!(err.contains("hint: model files are looked up in weights (--models-dir)") && err.contains("--set 1.ckpt_name=NAME"), "{err}");

    for i in 0..23 {
        std::fs::write(checkpoints.join(format!("m{i:02}.safetensors")), b"").unwrap();
    }
    let (_, err) = fails(&["run", wf.to_str().unwrap(), "--models-dir", "weights"], dir.path());
    let line = err.lines().find(|l| l.contains("ckpt_name")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("m17.safetensors\"]") && line.ends_with("(and 5 more)"), "20 of 25 names: {line}");
    assert!(!line.contains("m18.safetensors"), "{line}");
}

/// ComfyUI's API format (what its "Save (API)" writes) runs as it is.
#[test]
fn run_takes_comfyui_api_format() {
    let dir = tiny_weights();
    let mut wf = api_format("txt2img.json");
    wf["1"]["inputs"]["ckpt_name"] = "tiny.safetensors".into();
    wf["4"]["inputs"]["width"] = 56.into();
    wf["4"]["inputs"]["height"] = 40.into();
    wf["5"]["inputs"]["steps"] = 1.into();
    assert!(wf.get("format").is_none() && wf["5"]["class_type"] == "KSampler", "plain API format");
    std::fs::write(dir.path().join("api.json"), wf.to_string()).unwrap();
    ok(&["run", "api.json", "--models-dir", "weights", "--output-dir", "out", "-t", "2"], dir.path());
    assert_eq!(png_size(&only_png(&dir.path().join("out"))), (56, 40));
}

/// `sdflow demo`, the README's first command, with its cache in a temporary folder: it
/// builds the tiny checkpoint once, reports the image it wrote, and reuses the checkpoint
/// on the next run.
#[test]
fn demo_writes_an_image_and_reuses_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let demo = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sdflow")).arg("demo").args(args).args(["-t", "2"]).env("XDG_CACHE_HOME", &cache).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "sdflow demo {args:?}:\n{}\n{}", text(&out.stdout), text(&out.stderr));
        let stdout = text(&out.stdout);
        let wrote = stdout.lines().find_map(|l| l.strip_prefix("wrote ")).unwrap_or_else(|| panic!("no `wrote` line in {stdout}"));
        (PathBuf::from(wrote), text(&out.stderr))
    };
    let ckpt = cache.join("sdflow/demo/models/checkpoints/demo-sd1-random.safetensors");
    // The demo's own size (256), fewer steps than its 20 to keep the test quick.
    let (png, err) = demo(&["--steps", "2"]);
    assert!(err.contains("built a tiny random-weight SD1 checkpoint") && ckpt.is_file(), "{err}");
    assert!(png.starts_with(std::fs::canonicalize(dir.path()).unwrap().join("sdflow-demo")), "{}", png.display());
    assert_eq!(png_size(&png), (256, 256));
    let built = std::fs::metadata(&ckpt).unwrap().modified().unwrap();

    let (second, err) = demo(&["--steps", "1", "--size", "64", "--output-dir", "again"]);
    assert!(!err.contains("built a tiny"), "the checkpoint was rebuilt: {err}");
    assert_eq!(std::fs::metadata(&ckpt).unwrap().modified().unwrap(), built);
    assert!(second.starts_with(std::fs::canonicalize(dir.path()).unwrap().join("again")));
    assert_eq!(png_size(&second), (64, 64));
}

/// A log level sdflow does not know is a usage error, as in sd-cli, not a silent `warn`.
#[test]
fn bad_log_levels_get_a_message_and_the_usage() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = fails(&["--log-level", "verbose", "metadata", "x.png"], dir.path());
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'verbose' for '--log-level") && err.contains("possible values") && err.contains("Usage:"), "{err}");
    let (code, err) = fails(&["img_gen", "-m", "m.safetensors", "--log-level=loud", "--print-workflow"], dir.path());
    assert_eq!(code, 2);
    assert!(err.contains("'loud'") && err.contains("Usage:"), "{err}");
    // The known levels still pass, in any case.
    ok(&["--log-level", "DEBUG", "img_gen", "-m", "m.safetensors", "--print-workflow"], dir.path());
}

/// `--hires` with a model upscaler found by its stem under `--hires-upscalers-dir`, as
/// sd-cli looks it up, a GGUF file among the extensions.
#[test]
fn hires_model_upscaler_is_found_in_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.safetensors");
    write_checkpoint(&model, &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    let ups = dir.path().join("upscalers");
    std::fs::create_dir_all(&ups).unwrap();
    let arch = sdflow_core::models::esrgan::Arch::Rrdb(sdflow_core::models::esrgan::RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_grow: 4, num_blocks: 1, num_upsample: 2, unshuffle: 1 });
    let st = dir.path().join("up.safetensors");
    sdflow_core::models::esrgan::write_random(&st, &arch, 3).unwrap();
    let src = io::open(&st).unwrap();
    let data: Vec<(String, DType, Vec<usize>, Vec<u8>)> = src.tensors().iter().map(|t| (t.name.clone(), t.dtype, t.shape.clone(), src.read(&t.name).unwrap().into_owned())).collect();
    io::gguf::write(&ups.join("tiny_up.gguf"), &[], data.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))).unwrap();
    let m = model.to_str().unwrap();
    let args = ["-m", m, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "1", "--hires", "--hires-upscaler", "tiny_up", "--hires-upscalers-dir", "upscalers", "--hires-scale", "1.5", "-t", "2", "-o", "hires.png"];
    ok(&args, dir.path());
    assert_eq!(png_size(&dir.path().join("hires.png")), (96, 96));
    let mut missing = args.to_vec();
    missing[12] = "no_such_upscaler";
    let (_, err) = fails(&missing, dir.path());
    assert!(err.contains("--hires-upscaler no_such_upscaler: no such model in upscalers"), "{err}");
}

/// `--rng` names sd-cli's generators; the KSampler gets the node's name for each (sd-cli's
/// `cpu` is torch's portable kernel), and without the flag the input stays out.
#[test]
fn rng_flags_choose_the_samplers_generator() {
    let dir = tempfile::tempdir().unwrap();
    let rng_of = |extra: &[&str]| -> Option<String> {
        let mut args = vec!["img_gen", "-m", "m.safetensors", "--print-workflow"];
        args.extend_from_slice(extra);
        let wf: serde_json::Value = serde_json::from_str(&ok(&args, dir.path())).unwrap();
        let nodes = wf["nodes"].as_object().unwrap();
        let ks = nodes.values().find(|n| n["class_type"] == "KSampler").unwrap();
        ks["inputs"].get("rng").map(|v| v.as_str().unwrap().to_string())
    };
    assert_eq!(rng_of(&[]), None);
    assert_eq!(rng_of(&["--rng", "cuda"]).as_deref(), Some("cuda"));
    assert_eq!(rng_of(&["--rng", "cpu", "--sampler-rng", "cpu"]).as_deref(), Some("cpu_portable"));
    assert_eq!(rng_of(&["--rng", "std_default"]).as_deref(), Some("std_default"));
}

/// `--eta`, `--sigmas` and `--hires-sigmas` run: `--eta` at the sampler's own default
/// (1 for euler_a) is the plain image, another eta another image; custom sigmas sample
/// txt2img, img2img (cut to --strength) and the hires pass.
#[test]
fn eta_and_custom_sigmas_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.safetensors");
    write_checkpoint(&model, &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    let m = model.to_str().unwrap();
    let run = |extra: &[&str], out: &str| -> Vec<u8> {
        let mut args = vec!["-m", m, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "3", "-s", "5", "-t", "2", "-o", out];
        args.extend_from_slice(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let plain = run(&[], "plain.png");
    assert!(plain == run(&["--eta", "1"], "eta1.png"), "--eta 1 is euler_a's own eta");
    assert!(plain != run(&["--eta", "0"], "eta0.png"), "--eta 0 takes the noise out");
    assert!(plain != run(&["--sigmas", "14.6, 3.0, 0.5, 0"], "sigmas.png"));
    run(&["-i", "plain.png", "--strength", "0.5", "--sigmas", "[14.6 7 3.0 0.5 0]"], "img2img.png");
    run(&["--hires", "--hires-scale", "1.5", "--hires-sigmas", "2,0.5,0", "--eta", "0.5"], "hires.png");
    assert_eq!(png_size(&dir.path().join("hires.png")), (96, 96));
    let (code, err) = fails(&["-m", m, "--sigmas", "14,x,0"], dir.path());
    assert_eq!(code, 2, "a clap error: {err}");
    assert!(err.contains("--sigmas") && err.contains("(\"x\") is not a number"), "{err}");
    let (_, err) = fails(&["-m", m, "--eta", "-2"], dir.path());
    assert!(err.contains("--eta"), "{err}");
    let (_, err) = fails(&["-m", m, "--hires-sigmas", "2,0"], dir.path());
    assert!(err.contains("--hires"), "{err}");
}

/// `--prediction v` on an eps checkpoint gives the image of the same weights marked
/// `v_pred`; the flow types are refused.
#[test]
fn prediction_overrides_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (eps, v) = (dir.path().join("eps.safetensors"), dir.path().join("v.safetensors"));
    write_checkpoint(&eps, &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    let marked = SdConfig { markers: sdflow_core::synth::PredictionMarkers { v_pred: true, ztsnr: false }, ..SdConfig::tiny_sd1_f8() };
    write_checkpoint(&v, &marked, DType::F32, 11, Format::Safetensors).unwrap();
    let run = |m: &Path, extra: &[&str], out: &str| -> Vec<u8> {
        let mut args = vec!["-m", m.to_str().unwrap(), "-p", "a cat", "-W", "64", "-H", "64", "--steps", "2", "-t", "2", "-o", out];
        args.extend_from_slice(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let marked_v = run(&v, &[], "a.png");
    assert!(run(&eps, &["--prediction", "v"], "b.png") == marked_v);
    assert!(run(&eps, &[], "c.png") != marked_v);
    assert!(run(&v, &["--prediction", "eps"], "d.png") == run(&eps, &[], "e.png"));
    let (code, err) = fails(&["-m", "x.safetensors", "--prediction", "sd3_flow"], dir.path());
    assert_eq!(code, 1);
    assert!(err.contains("not supported yet: --prediction sd3_flow"), "{err}");
}

/// sd-cli's previews: `--preview proj` writes the latent projection (latent-sized),
/// `--preview tae` the TAESD decoding (image-sized) to `--preview-path`; with
/// `--taesd-preview-only` the image itself is the VAE's, as without `--taesd`.
#[test]
fn previews_are_written_to_the_preview_path() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.safetensors");
    write_checkpoint(&model, &SdConfig::tiny_sd1_f8(), DType::F32, 11, Format::Safetensors).unwrap();
    let taesd = sdflow_tests::write_taesd(dir.path(), true).remove(0);
    let (m, t) = (model.to_str().unwrap(), taesd.to_str().unwrap());
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["-m", m, "-p", "a cat", "-W", "64", "-H", "64", "--steps", "3", "-s", "5", "-t", "2", "-o", out];
        args.extend_from_slice(extra);
        ok(&args, dir.path());
    };
    run(&[], "plain.png");
    assert!(!dir.path().join("preview.png").exists(), "no previews unless asked");
    // Step 2 of 3 (at the last step the state is the estimate).
    run(&["--preview", "proj", "--preview-path", "proj.png", "--preview-interval", "2"], "a.png");
    assert_eq!(png_size(&dir.path().join("proj.png")), (8, 8), "the projection is latent-sized");
    run(&["--preview", "proj", "--preview-path", "noisy.png", "--preview-noisy", "--preview-interval", "2"], "b.png");
    assert!(png_pixels(&dir.path().join("noisy.png")) != png_pixels(&dir.path().join("proj.png")), "the noisy latent, not the estimate");
    run(&["--preview", "proj", "--preview-path", "last.png"], "e.png");
    assert!(png_pixels(&dir.path().join("last.png")) != png_pixels(&dir.path().join("proj.png")), "every step overwrites the preview");
    run(&["--preview", "tae", "--taesd", t, "--taesd-preview-only", "--preview-path", "tae.jpg", "--preview-interval", "2"], "c.png");
    let jpeg = image::open(dir.path().join("tae.jpg")).unwrap();
    assert_eq!((jpeg.width(), jpeg.height()), (64, 64), "TAESD previews are image-sized");
    assert!(png_pixels(&dir.path().join("c.png")) == png_pixels(&dir.path().join("plain.png")), "--taesd-preview-only decodes with the VAE");
    run(&["--taesd", t], "d.png");
    assert!(png_pixels(&dir.path().join("d.png")) != png_pixels(&dir.path().join("plain.png")), "--taesd alone decodes with TAESD");
    for bad in [&["--preview-interval", "0"][..], &["--taesd-preview-only"][..]] {
        let mut args = vec!["-m", m];
        args.extend_from_slice(bad);
        fails(&args, dir.path());
    }
}

/// sd-cli's PhotoMaker flags run: a folder of ID images, the model's LoRA, the trigger
/// word `img`; a prompt without the trigger runs plain, with a warning.
#[test]
fn photo_maker_flags_run_on_a_tiny_sdxl() {
    use sdflow_core::synth::{photomaker_tensors, write_tensors, ClipVisionSynth};
    let dir = tempfile::tempdir().unwrap();
    let xl = SdConfig::tiny_sdxl();
    write_checkpoint(&dir.path().join("xl.safetensors"), &xl, DType::F32, 3, Format::Safetensors).unwrap();
    write_tensors(&dir.path().join("pm.safetensors"), &photomaker_tensors(&ClipVisionSynth::tiny(), 64, None, &xl).unwrap(), 4).unwrap();
    std::fs::create_dir_all(dir.path().join("ids")).unwrap();
    write_png(&dir.path().join("ids/a.png"), 40, 48);
    write_png(&dir.path().join("ids/b.png"), 56, 32);
    let run = |prompt: &str, out: &str| {
        let args = ["img_gen", "-m", "xl.safetensors", "--photo-maker", "pm.safetensors", "--pm-id-images-dir", "ids", "-p", prompt, "-W", "64", "-H", "64", "--steps", "2", "-s", "5", "-o", out];
        let o = sdflow(&args, dir.path());
        assert!(o.status.success(), "{}", text(&o.stderr));
        (png_pixels(&dir.path().join(out)), text(&o.stderr))
    };
    let (with_id, _) = run("a photo of a man img", "pm.png");
    assert_eq!(png_size(&dir.path().join("pm.png")), (64, 64));
    let (plain, log) = run("a photo of a man", "plain.png");
    assert!(log.contains("without the identity"), "a missing trigger word is warned about: {log}");
    assert_ne!(with_id, plain, "the ID images change the image");
    let (_, err) = fails(&["img_gen", "-m", "xl.safetensors", "--photo-maker", "pm.safetensors", "-p", "a man img"], dir.path());
    assert!(err.contains("--pm-id-images-dir"), "{err}");
}

/// sd-cli's Z-Image command line (`--diffusion-model`, `--llm`, `--vae`) on tiny files in
/// the layouts people download: the graph is sd.cpp's (no SdCppConditioner for the LLM,
/// euler over its discrete schedule at shift 3), it runs, and its flags matter.
#[test]
fn qwen_image_preset_runs_on_tiny_models() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_qwen_image_models(dir.path());
    let m = |p: &str| format!("models/{p}");
    let (q, llm, vae) = (m("diffusion_models/qwen_image_bf16.safetensors"), m("text_encoders/qwen_2.5_vl_7b.safetensors"), m("vae/qwen_image_vae.safetensors"));
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["img_gen", "--diffusion-model", &q, "--llm", &llm, "--vae", &vae, "-p", "a (red:1.2) fox", "--steps", "2", "-W", "48", "-H", "32", "-t", "2", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let printed = ok(&["img_gen", "--diffusion-model", &q, "--llm", &llm, "--vae", &vae, "-p", "a fox", "--print-workflow"], dir.path());
    assert!(printed.contains("\"qwen_image\"") && printed.contains("ManualSigmas") && printed.contains("ModelSamplingAuraFlow") && !printed.contains("SdCppConditioner"), "{printed}");
    let plain = run(&["--cfg-scale", "2.5"], "q.png");
    assert_eq!(png_size(&dir.path().join("q.png")), (48, 32));
    assert_ne!(plain, run(&["--cfg-scale", "2.5", "--flow-shift", "6"], "q_shift.png"), "--flow-shift changes the schedule");
    assert_ne!(plain, run(&["--cfg-scale", "2.5", "-n", "blurry"], "q_neg.png"), "real CFG reads the negative prompt");
    // Seamless tiling reaches the transformer's rotary embedding and the Wan VAE.
    assert_ne!(plain, run(&["--cfg-scale", "2.5", "--circular"], "q_circular.png"));
    let (_, err) = fails(&["img_gen", "--diffusion-model", &q, "--vae", &vae, "-p", "x"], dir.path());
    assert!(err.contains("--llm"), "{err}");
    // Qwen-Image-Edit through -r: the reference to Qwen2.5-VL's vision tower beside the
    // prompt (sd.cpp's `qwen` preset) and, resized to sides of 32, to the model.
    sdflow_tests::write_test_png(&dir.path().join("ref.png"), 72, 56);
    let edit_model = m("diffusion_models/qwen_image_edit_2509_bf16.safetensors");
    let edit = |extra: &[&str], out: &str| {
        let mut args = vec!["img_gen", "--diffusion-model", &edit_model, "--llm", &llm, "--vae", &vae, "-p", "make it (snow:1.2)", "--steps", "2", "-W", "48", "-H", "32", "-t", "2", "--cfg-scale", "2.5", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let printed = ok(&["img_gen", "--diffusion-model", &edit_model, "--llm", &llm, "--vae", &vae, "-p", "x", "-r", "ref.png", "-W", "512", "-H", "512", "--cfg-scale", "2.5", "--print-workflow"], dir.path());
    assert!(printed.contains("SdCppTextEncodeQwenImageEdit") && printed.contains("ReferenceLatent") && !printed.contains("CLIPTextEncode\"") && !printed.contains("FluxKontextMultiReferenceLatentMethod"), "{printed}");
    // 72x56 at the output's 512² area: 581x451, sides rounded to 32.
    assert!(printed.contains("\"width\": 576") && printed.contains("\"height\": 448"), "{printed}");
    let no_ref = edit(&[], "e0.png");
    let with_ref = edit(&["-r", "ref.png"], "e1.png");
    assert_ne!(no_ref, with_ref, "the reference changes the image");
    let dit_only = edit(&["-r", "ref.png", "--ref-image-args", "pass_to_vlm=false"], "e2.png");
    assert_ne!(with_ref, dit_only, "the vision tower reads the reference");
    assert_ne!(with_ref, edit(&["-r", "ref.png", "--ref-image-args", "vlm_size=200704"], "e3.png"), "vlm_size resizes what the tower reads");
    // --llm_vision: the tower from its own file (DualCLIPLoader type qwen_image).
    let vision = m("text_encoders/qwen_2.5_vl_7b_vision.safetensors");
    let printed = ok(&["img_gen", "--diffusion-model", &edit_model, "--llm", &llm, "--llm_vision", &vision, "--vae", &vae, "-p", "x", "-r", "ref.png", "--print-workflow"], dir.path());
    assert!(printed.contains("DualCLIPLoader"), "{printed}");
    assert_ne!(dit_only, edit(&["-r", "ref.png", "--qwen2vl_vision", &vision], "e4.png"));
    // An unknown key is a warning, as in sd-cli; a fixed index and five images for the
    // tower are named errors.
    assert_eq!(dit_only, edit(&["-r", "ref.png", "--ref-image-args", "pass_to_vlm=false,colour=blue"], "e5.png"));
    let base_edit = ["img_gen", "--diffusion-model", edit_model.as_str(), "--llm", llm.as_str(), "--vae", vae.as_str(), "-p", "x", "-r", "ref.png"];
    let (_, err) = fails(&[&base_edit[..], &["--ref-image-args", "ref_index_mode=fixed"]].concat(), dir.path());
    assert!(err.contains("ref_index_mode=fixed"), "{err}");
    let (_, err) = fails(&[&base_edit[..], &["-r", "ref.png", "-r", "ref.png", "-r", "ref.png", "-r", "ref.png"]].concat(), dir.path());
    assert!(err.contains("at most 4"), "{err}");
    // sd.cpp's qwen_layered preset on an Edit model counts the references down (ComfyUI's
    // negative_index); `decrease` elsewhere is named.
    let printed = ok(&[&base_edit[..], &["--ref-image-args", "preset=qwen_layered", "--print-workflow"]].concat(), dir.path());
    assert!(printed.contains("\"negative_index\"") && printed.contains("SdCppTextEncodeQwenImageEdit"), "{printed}");
    assert_ne!(dit_only, edit(&["-r", "ref.png", "--ref-image-args", "pass_to_vlm=false,ref_index_mode=decrease"], "e6.png"), "the references' index matters");
    // --model-args qwen_image_zero_cond_t (Edit-2511): the references at timestep 0.
    let printed = ok(&[&base_edit[..], &["--model-args", "qwen_image_zero_cond_t=true", "--print-workflow"]].concat(), dir.path());
    assert!(printed.contains("\"index_timestep_zero\""), "{printed}");
    assert_ne!(dit_only, edit(&["-r", "ref.png", "--ref-image-args", "pass_to_vlm=false", "--model-args", "qwen_image_zero_cond_t=true"], "e7.png"));
}

/// Qwen-Image-Layered through sd-cli's flags: the -r image through the RGBA VAE before
/// the frames, `--qwen-image-layers` + 1 RGBA images written as sd-cli numbers them.
#[test]
fn qwen_image_layered_preset_runs_on_tiny_models() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_qwen_image_models(dir.path());
    sdflow_tests::write_test_png(&dir.path().join("ref.png"), 72, 56);
    let m = |p: &str| format!("models/{p}");
    let (q, llm, vae) = (m("diffusion_models/qwen_image_layered_bf16.safetensors"), m("text_encoders/qwen_2.5_vl_7b.safetensors"), m("vae/qwen_image_layered_vae.safetensors"));
    let base = ["img_gen", "--diffusion-model", q.as_str(), "--llm", llm.as_str(), "--vae", vae.as_str(), "-p", "a fox", "-r", "ref.png", "--steps", "2", "-W", "48", "-H", "32", "--cfg-scale", "2.5", "-t", "2"];
    let printed = ok(&[&base[..], &["--print-workflow"]].concat(), dir.path());
    assert!(
        printed.contains("EmptyQwenImageLayeredLatentImage") && printed.contains("LatentCutToBatch") && printed.contains("ReferenceLatent") && !printed.contains("SdCppTextEncodeQwenImageEdit") && printed.contains("\"layers\": 3"),
        "{printed}"
    );
    ok(&[&base[..], &["--qwen-image-layers", "2", "-o", "l.png"]].concat(), dir.path());
    let names = ["l.png", "l_2.png", "l_3.png"];
    let pixels: Vec<Vec<u8>> = names.iter().map(|n| png_pixels(&dir.path().join(n))).collect();
    assert!(!dir.path().join("l_4.png").exists(), "layers + 1 images");
    for (n, px) in names.iter().zip(&pixels) {
        assert_eq!(png_size(&dir.path().join(n)), (48, 32), "{n}");
        assert_eq!(px.len(), 48 * 32 * 4, "{n} is RGBA");
    }
    assert_ne!(pixels[0], pixels[1]);
    // Without the reference the layers differ.
    let no_ref: Vec<&str> = base.iter().copied().filter(|a| *a != "-r" && *a != "ref.png").collect();
    ok(&[&no_ref[..], &["--qwen-image-layers", "2", "-o", "n.png"]].concat(), dir.path());
    assert_ne!(png_pixels(&dir.path().join("n.png")), pixels[0]);
    let (_, err) = fails(&[&base[..], &["--qwen-image-layers", "-1"]].concat(), dir.path());
    assert!(err.contains("--qwen-image-layers"), "{err}");
    let (_, err) = fails(&[&base[..], &["-i", "ref.png"]].concat(), dir.path());
    assert!(err.contains("Qwen-Image-Layered"), "{err}");
}

#[test]
fn z_image_preset_runs_on_tiny_models() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_z_image_models(dir.path());
    let m = |p: &str| format!("models/{p}");
    let (z, llm, ae, t5) = (m("diffusion_models/z_image_turbo_bf16.safetensors"), m("text_encoders/qwen_3_4b.safetensors"), m("vae/ae.safetensors"), m("text_encoders/t5xxl_fp16.safetensors"));
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["img_gen", "--diffusion-model", &z, "--llm", &llm, "--vae", &ae, "-p", "a (red:1.2) fox", "--steps", "2", "-W", "48", "-H", "32", "-t", "2", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let printed = ok(&["img_gen", "--diffusion-model", &z, "--llm", &llm, "--vae", &ae, "-p", "a fox", "--print-workflow"], dir.path());
    assert!(printed.contains("\"lumina2\"") && printed.contains("ManualSigmas") && !printed.contains("SdCppConditioner"), "{printed}");
    let plain = run(&["--cfg-scale", "1"], "z.png");
    assert_eq!(png_size(&dir.path().join("z.png")), (48, 32));
    assert_ne!(plain, run(&["--cfg-scale", "1", "--flow-shift", "6"], "z_shift.png"), "--flow-shift changes the schedule");
    assert_ne!(plain, run(&["--cfg-scale", "3", "-n", "blurry"], "z_cfg.png"), "real CFG reads the negative prompt");
    // sd-cli's older name of --llm.
    let alias = ["img_gen", "--diffusion-model", &z, "--qwen2vl", &llm, "--vae", &ae, "-p", "a (red:1.2) fox", "--cfg-scale", "1", "--steps", "2", "-W", "48", "-H", "32", "-t", "2", "-o", "z_alias.png"];
    ok(&alias, dir.path());
    assert_eq!(png_pixels(&dir.path().join("z_alias.png")), plain);
    // The diffusers-named transformer gives the same image.
    let args = ["img_gen", "--diffusion-model", "models/diffusion_models/z_image_turbo_diffusers.safetensors", "--llm", &llm, "--vae", &ae, "-p", "a (red:1.2) fox", "--cfg-scale", "1", "--steps", "2", "-W", "48", "-H", "32", "-t", "2", "-o", "z_diffusers.png"];
    ok(&args, dir.path());
    assert_eq!(png_pixels(&dir.path().join("z_diffusers.png")), plain);
    // Seamless tiling reaches the transformer's rotary embedding.
    assert_ne!(plain, run(&["--cfg-scale", "1", "--circular"], "z_circular.png"));
    // Bad combinations are named.
    let (_, err) = fails(&["img_gen", "--diffusion-model", &z, "--vae", &ae, "-p", "x"], dir.path());
    assert!(err.contains("--llm"), "{err}");
    let (_, err) = fails(&["img_gen", "--diffusion-model", &z, "--llm", &llm, "--t5xxl", &t5, "--vae", &ae, "-p", "x"], dir.path());
    assert!(err.contains("not supported yet: --t5xxl (with a Z-Image model"), "{err}");
    let (_, err) = fails(&["img_gen", "--diffusion-model", &z, "--llm", &llm, "--vae", &ae, "-p", "x", "--slg-scale", "2"], dir.path());
    assert!(err.contains("--slg-scale"), "{err}");
    let (_, err) = fails(&["img_gen", "--diffusion-model", &z, "--llm", &llm, "--vae", &ae, "--llm_vision", "v.safetensors", "-p", "x"], dir.path());
    assert!(err.contains("not supported yet: --llm_vision"), "{err}");
    let (_, err) = fails(&["img_gen", "-m", "models/checkpoints/model.safetensors", "--llm", &llm, "-p", "x"], dir.path());
    assert!(err.contains("--llm"), "{err}");
}

/// sd-cli's FLUX.2 klein command line on tiny files: sd.cpp's graph (the LLM's three
/// layers through CLIPLoader type flux2, EmptyFlux2LatentImage, its flux2 schedule as
/// ManualSigmas), which runs, with `-r` edits.
#[test]
fn flux2_preset_runs_on_tiny_models() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_flux2_models(dir.path());
    sdflow_tests::write_test_png(&dir.path().join("ref.png"), 64, 48);
    let m = |p: &str| format!("models/{p}");
    let (f, llm, vae) = (m("diffusion_models/flux-2-klein-4b.safetensors"), m("text_encoders/qwen_3_4b_klein.safetensors"), m("vae/flux2-vae.safetensors"));
    let base = ["img_gen", "--diffusion-model", &f, "--llm", &llm, "--vae", &vae, "-p", "a fox", "--cfg-scale", "1"];
    let printed = ok(&[&base[..], &["--print-workflow"]].concat(), dir.path());
    assert!(printed.contains("EmptyFlux2LatentImage") && printed.contains("\"flux2\"") && printed.contains("ManualSigmas") && !printed.contains("SdCppConditioner"), "{printed}");
    ok(&[&base[..], &["--steps", "2", "-W", "64", "-H", "48", "-t", "2", "-o", "klein.png"]].concat(), dir.path());
    assert_eq!(png_size(&dir.path().join("klein.png")), (64, 48));
    // -r: the reference encoded and appended (ReferenceLatent, no index method: FLUX.2
    // numbers its references); it changes the image.
    let printed = ok(&[&base[..], &["-r", "ref.png", "--print-workflow"]].concat(), dir.path());
    assert!(printed.contains("ReferenceLatent") && !printed.contains("FluxKontextMultiReferenceLatentMethod"), "{printed}");
    ok(&[&base[..], &["-r", "ref.png", "--steps", "2", "-W", "64", "-H", "48", "-t", "2", "-o", "klein_edit.png"]].concat(), dir.path());
    assert_ne!(png_pixels(&dir.path().join("klein_edit.png")), png_pixels(&dir.path().join("klein.png")));
    let (_, err) = fails(&["img_gen", "--diffusion-model", &f, "--vae", &vae, "-p", "x"], dir.path());
    assert!(err.contains("--llm"), "{err}");
    // FLUX.2 dev with its Mistral encoder: the distilled --guidance reaches the model.
    let (dev, mistral) = (m("diffusion_models/flux2_dev_fp8mixed.safetensors"), m("text_encoders/mistral_3_small_flux2_bf16.safetensors"));
    let dev_base = ["img_gen", "--diffusion-model", &dev, "--llm", &mistral, "--vae", &vae, "-p", "a fox", "--cfg-scale", "1", "--steps", "2", "-W", "32", "-H", "32", "-t", "2"];
    let printed = ok(&[&dev_base[..], &["--print-workflow"]].concat(), dir.path());
    assert!(printed.contains("FluxGuidance") && printed.contains("FLUX.2 dev"), "{printed}");
    ok(&[&dev_base[..], &["-o", "dev.png"]].concat(), dir.path());
    ok(&[&dev_base[..], &["--guidance", "6", "-o", "dev_g6.png"]].concat(), dir.path());
    assert_eq!(png_size(&dir.path().join("dev.png")), (32, 32));
    assert_ne!(png_pixels(&dir.path().join("dev.png")), png_pixels(&dir.path().join("dev_g6.png")), "--guidance reaches FLUX.2 dev");
    // sd-cli's --taesd with FLUX.2: TAEF2 decodes (and previews) the model's latent.
    let taef2 = sdflow_tests::write_tae(dir.path(), "taef2", 32, true).remove(0);
    ok(&[&base[..], &["--steps", "2", "-W", "64", "-H", "48", "-t", "2", "--taesd", taef2.to_str().unwrap(), "--preview", "tae", "--preview-path", "taef2_preview.png", "-o", "klein_taef2.png"]].concat(), dir.path());
    assert_eq!(png_size(&dir.path().join("klein_taef2.png")), (64, 48));
    assert_eq!(png_size(&dir.path().join("taef2_preview.png")), (64, 48), "TAEF2 previews are image-sized");
    assert_ne!(png_pixels(&dir.path().join("klein_taef2.png")), png_pixels(&dir.path().join("klein.png")), "TAEF2 decoded, not the VAE");
    // --preview proj: sd.cpp's projection of the 32 unpatched channels, twice the latent's size.
    ok(&[&base[..], &["--steps", "2", "-W", "64", "-H", "48", "-t", "2", "--preview", "proj", "--preview-path", "proj_preview.png", "-o", "klein_proj.png"]].concat(), dir.path());
    assert_eq!(png_size(&dir.path().join("proj_preview.png")), (8, 6));
    // klein has no guidance embedding: no FluxGuidance in its graph.
    let printed = ok(&[&base[..], &["--print-workflow"]].concat(), dir.path());
    assert!(!printed.contains("FluxGuidance"), "{printed}");
}

/// sd-cli's DiT command lines on tiny FLUX.1, Kontext, Fill, Chroma and SD3.5 files in
/// the layouts people download: each runs and writes its image at the asked size (a
/// Kontext run without -W/-H takes the reference's size, as sd-cli); the flags that
/// change the image do.
#[test]
fn dit_presets_run_on_tiny_models() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_sd3_models(dir.path());
    sdflow_tests::write_test_png(&dir.path().join("ref.png"), 72, 56);
    sdflow_tests::write_mask_png(&dir.path().join("mask.png"), 72, 56, |x, y| (20..52).contains(&x) && (16..40).contains(&y));
    let m = |p: &str| format!("models/{p}");
    let (clip_l, clip_g, t5, ae) = (m("text_encoders/clip_l.safetensors"), m("text_encoders/clip_g.safetensors"), m("text_encoders/t5xxl_fp16.safetensors"), m("vae/ae.safetensors"));
    let flux = |model: &str, extra: &[&str], out: &str| {
        let mut args = vec!["img_gen", "--diffusion-model", model, "--clip_l", &clip_l, "--t5xxl", &t5, "--vae", &ae, "--steps", "2", "-t", "2", "-o", out];
        args.extend(extra);
        ok(&args, dir.path())
    };
    let dev = m("diffusion_models/flux1-dev.safetensors");
    flux(&dev, &["-p", "a cat", "--cfg-scale", "1", "-W", "64", "-H", "48"], "dev.png");
    assert_eq!(png_size(&dir.path().join("dev.png")), (64, 48));
    flux(&dev, &["-p", "a cat", "--cfg-scale", "1", "-W", "64", "-H", "48", "--guidance", "6"], "dev_g6.png");
    assert_ne!(png_pixels(&dir.path().join("dev.png")), png_pixels(&dir.path().join("dev_g6.png")), "--guidance reaches the model");
    flux(&dev, &["-p", "a (cat:1.4), long prompt BREAK more", "-n", "blurry", "--cfg-scale", "2", "-W", "48", "-H", "48", "--slg-scale", "2", "--skip-layers", "[0,1]", "--sampling-method", "euler_a"], "dev_slg.png");
    assert_eq!(png_size(&dir.path().join("dev_slg.png")), (48, 48));
    // Kontext: the reference's size when -W/-H are not given.
    flux(&m("diffusion_models/flux1-kontext-dev.safetensors"), &["-p", "make it blue", "--cfg-scale", "1", "-r", "ref.png", "--increase-ref-index"], "kontext.png");
    assert_eq!(png_size(&dir.path().join("kontext.png")), (72, 56));
    flux(&m("diffusion_models/flux1-fill-dev.safetensors"), &["-p", "a hat", "--cfg-scale", "1", "-i", "ref.png", "--mask", "mask.png", "--strength", "1"], "fill.png");
    assert_eq!(png_size(&dir.path().join("fill.png")), (72, 56));
    // TAEF1 (sd-cli's single --taesd file) decodes and previews a FLUX latent.
    let taef1 = sdflow_tests::write_tae(dir.path(), "taef1", 16, true).remove(0);
    flux(&dev, &["-p", "a cat", "--cfg-scale", "1", "-W", "64", "-H", "48", "--taesd", taef1.to_str().unwrap(), "--preview", "tae", "--preview-path", "tae_preview.png"], "dev_tae.png");
    assert_eq!(png_size(&dir.path().join("dev_tae.png")), (64, 48));
    assert_eq!(png_size(&dir.path().join("tae_preview.png")), (64, 48), "TAEF1 previews are image-sized");
    assert_ne!(png_pixels(&dir.path().join("dev_tae.png")), png_pixels(&dir.path().join("dev.png")), "TAEF1 decoded, not the VAE");
    // ComfyUI's all-in-one schnell file through -m alone.
    ok(&["img_gen", "-m", &m("checkpoints/flux1-schnell-fp8.safetensors"), "-p", "a cat", "--cfg-scale", "1", "--steps", "2", "-W", "32", "-H", "32", "-t", "2", "-o", "schnell.png"], dir.path());
    assert_eq!(png_size(&dir.path().join("schnell.png")), (32, 32));
    // The same file as a diffusers pipeline folder.
    let all_in_one = dir.path().join("models/checkpoints/flux1-schnell-fp8.safetensors");
    let hidden = sdflow_core::io::open(&all_in_one).unwrap().get("model.diffusion_model.img_in.weight").unwrap().shape[0];
    sdflow_tests::write_dit_pipeline_folder(&all_in_one, &dir.path().join("FLUX.1-schnell"), &sdflow_core::models::flux::diffusers::LAYOUT, hidden, "FluxPipeline");
    ok(&["img_gen", "-m", "FLUX.1-schnell", "-p", "a cat", "--cfg-scale", "1", "--steps", "2", "-W", "32", "-H", "32", "-t", "2", "-o", "schnell_folder.png"], dir.path());
    assert_eq!(png_pixels(&dir.path().join("schnell_folder.png")), png_pixels(&dir.path().join("schnell.png")));
    // Chroma with sd-cli's older mask flags and its --model-args spelling.
    let chroma = m("diffusion_models/Chroma1-HD-fp8mixed.safetensors");
    let run_chroma = |extra: &[&str], out: &str| {
        let mut args = vec!["img_gen", "--diffusion-model", &chroma, "--t5xxl", &t5, "--vae", &ae, "-p", "a cat", "--cfg-scale", "3", "--steps", "2", "-W", "32", "-H", "32", "-t", "2", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let masked = run_chroma(&[], "chroma.png");
    assert_ne!(masked, run_chroma(&["--chroma-disable-dit-mask"], "chroma_nomask.png"), "the DiT mask changes the image");
    assert_eq!(run_chroma(&["--model-args", "chroma_use_dit_mask=off"], "chroma_nomask2.png"), png_pixels(&dir.path().join("chroma_nomask.png")), "the two spellings agree");
    run_chroma(&["--model-args", "chroma_use_t5_mask=true,chroma_t5_mask_pad=3"], "chroma_t5mask.png");
    // SD3.5: the MMDiT and VAE in -m, the three encoders beside it.
    let sd3 = |extra: &[&str], out: &str| {
        let mut args = vec!["img_gen", "-m", "models/checkpoints/sd3.5_medium.safetensors", "--clip_l", &clip_l, "--clip_g", &clip_g, "--t5xxl", &t5, "-p", "a cat", "--cfg-scale", "4", "--steps", "2", "-W", "32", "-H", "32", "-t", "2", "-o", out];
        args.extend(extra);
        ok(&args, dir.path());
        png_pixels(&dir.path().join(out))
    };
    let plain = sd3(&[], "sd3.png");
    assert_ne!(plain, sd3(&["--flow-shift", "6"], "sd3_shift.png"), "--flow-shift changes the schedule");
    assert_ne!(plain, sd3(&["--slg-scale", "3", "--skip-layer-start", "0", "--skip-layer-end", "1", "--skip-layers", "[0]"], "sd3_slg.png"), "SLG changes the image");

    // Bad combinations are named.
    let (_, err) = fails(&["img_gen", "--diffusion-model", &dev, "--clip_l", &clip_l, "--vae", &ae, "-p", "x"], dir.path());
    assert!(err.contains("missing --t5xxl"), "{err}");
    let (_, err) = fails(&["img_gen", "--diffusion-model", &dev, "--clip_l", &clip_l, "--t5xxl", &t5, "-p", "x"], dir.path());
    assert!(err.contains("missing --vae"), "{err}");
    let (_, err) = fails(&["img_gen", "--diffusion-model", &chroma, "--t5xxl", &t5, "--vae", &ae, "--model-args", "chroma_use_dit_mask=maybe"], dir.path());
    assert!(err.contains("chroma_use_dit_mask=maybe is not a boolean"), "{err}");
    let (_, err) = fails(&["img_gen", "-m", "models/checkpoints/model.safetensors", "--t5xxl", &t5, "-p", "x"], dir.path());
    assert!(err.contains("not supported yet: --t5xxl (with a UNet model"), "{err}");
}

/// A running `sdflow serve` in `dir` (killed when dropped), its address, and its console
/// (stderr) line by line: read on a thread, since the server does not exit.
struct Served {
    child: std::process::Child,
    host: String,
    console: std::sync::mpsc::Receiver<String>,
}

impl Served {
    fn start(dir: &Path, models_dir: &str, extra: &[&str]) -> Served {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(env!("CARGO_BIN_EXE_sdflow"))
            .args(["serve", "--port", "0", "--threads", "1", "--models-dir", models_dir, "--input-dir", "input", "--output-dir", "output"])
            .args(extra)
            .current_dir(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let (tx, console) = std::sync::mpsc::channel();
        std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).for_each(|l| drop(tx.send(l))));
        let mut served = Served { child, host: String::new(), console };
        let url = BufReader::new(stdout).lines().map_while(Result::ok).find_map(|l| l.strip_prefix("sdflow serving on ").map(|u| u.trim().to_string())).expect("the address");
        served.host = url.trim_start_matches("http://").trim_end_matches('/').to_string();
        served
    }

    /// The next console line containing `what`, waiting at most a minute for each line.
    fn wait_for(&self, what: &str) -> String {
        loop {
            match self.console.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok(l) if l.contains(what) => break l,
                Ok(_) => {}
                Err(e) => panic!("no `{what}` line on the server's console: {e}"),
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sdflow serve`'s console says when a prompt arrives and how it ended, in one line each,
/// as ComfyUI's does (`got prompt`, `Prompt executed in …`), without `--log-level`.
#[test]
fn serve_logs_each_prompt() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    for sub in ["models", "input", "output"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let served = Served::start(dir.path(), "models", &[]);
    let host = &served.host;
    let body = r#"{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}, "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}}"#;
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(s, "POST /prompt HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let got = served.wait_for("got prompt");
    let done = served.wait_for("executed in");
    assert!(done.contains(" seconds") && !got.contains("Some("), "{got}\n{done}");
}

/// A `--models-dir` that does not exist is said at start-up, not discovered as empty lists.
#[test]
fn serve_says_when_the_models_folder_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(dir.path(), "no-such-models", &[]);
    let line = served.wait_for("models folder");
    assert!(line.contains("models folder no-such-models does not exist"), "{line}");
}

/// sd-server's command line: `-m` is the model of requests that name none, and
/// `--listen-ip` / `--listen-port` are sd-server's names for `--listen` / `--port`.
#[test]
fn serve_takes_sd_servers_flags() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    for f in ["a.safetensors", "b.safetensors"] {
        std::fs::write(ckpts.join(f), b"x").unwrap();
    }
    let served = Served::start(dir.path(), "models", &["-m", "models/checkpoints/b.safetensors", "--listen-ip", "127.0.0.1"]);
    let host = &served.host;
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(s, "GET /sdapi/v1/options HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains(r#""sd_model_checkpoint":"b""#), "{reply}");
    drop(served);
    std::fs::write(dir.path().join("elsewhere.safetensors"), b"x").unwrap();
    let (_, err) = fails(&["serve", "--listen-port", "0", "--models-dir", "models", "-m", "elsewhere.safetensors"], dir.path());
    assert!(err.contains("-m elsewhere.safetensors: not in the checkpoints folder"), "{err}");
    // Its model and generation flags are checked at start-up, by name.
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--listen-port", "0", "--models-dir", "models"];
        args.extend_from_slice(extra);
        fails(&args, dir.path()).1
    };
    let err = serve(&["--diffusion-model", "nope.safetensors"]);
    assert!(err.contains("--diffusion-model nope.safetensors") && err.contains("diffusion_models"), "{err}");
    let err = serve(&["--t5xxl", "elsewhere.safetensors"]);
    assert!(err.contains("--t5xxl elsewhere.safetensors: not in the text_encoders folder"), "{err}");
    let err = serve(&["--sampling-method", "warp"]);
    assert!(err.contains("--sampling-method") && err.contains("warp"), "{err}");
    let err = serve(&["--scheduler", "sometimes"]);
    assert!(err.contains("--scheduler") && err.contains("sometimes"), "{err}");
    let err = serve(&["-W", "100"]);
    assert!(err.contains("-W 100"), "{err}");
    let err = serve(&["--steps", "0"]);
    assert!(err.contains("--steps 0"), "{err}");
    // sd-server's video flags too.
    for flag in ["--clip_vision", "--high-noise-diffusion-model", "--motion-module"] {
        let err = serve(&[flag, "nope.safetensors"]);
        assert!(err.contains(&format!("{flag} nope.safetensors")), "{err}");
    }
}

/// The frames of a Motion-JPEG AVI: (µs per frame, width, height, frame count in the
/// header) and each `00dc` chunk decoded as a JPEG. The RIFF chunks are walked here; the
/// JPEGs are decoded by the `image` crate.
/// The frames of a WebM of VP8 keyframes as sd-cli writes it (its blocks read by
/// sdflow's WebM reader), each decoded by the `image` crate's WebP decoder (a VP8 frame is
/// a lossy WebP's `VP8 ` chunk); with each frame's time (ms) and the document type.
fn read_vp8_webm(path: &Path) -> (String, Vec<(i64, image::RgbImage)>) {
    let webm = sdflow_nodes::video::encode::webm_frames(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(webm.codec, "V_VP8");
    let frames = webm
        .blocks
        .iter()
        .map(|(t, key, vp8)| {
            assert!(key, "every frame a keyframe");
            let mut riff = b"RIFF".to_vec();
            riff.extend_from_slice(&((12 + vp8.len() + vp8.len() % 2) as u32).to_le_bytes());
            riff.extend_from_slice(b"WEBPVP8 ");
            riff.extend_from_slice(&(vp8.len() as u32).to_le_bytes());
            riff.extend_from_slice(vp8);
            if vp8.len() % 2 == 1 {
                riff.push(0);
            }
            (*t, image::load_from_memory_with_format(&riff, image::ImageFormat::WebP).expect("a VP8 frame").to_rgb8())
        })
        .collect();
    (webm.doc_type, frames)
}

fn read_mjpg_avi(path: &Path) -> ((u32, u32, u32, u32), Vec<image::RgbImage>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!((&b[0..4], &b[8..12]), (&b"RIFF"[..], &b"AVI "[..]));
    assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize, b.len() - 8, "RIFF size");
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let avih = b.windows(4).position(|w| w == b"avih").unwrap() + 8;
    let header = (u32_at(avih), u32_at(avih + 32), u32_at(avih + 36), u32_at(avih + 16));
    let mut frames = Vec::new();
    let movi = b.windows(4).position(|w| w == b"movi").unwrap() + 4;
    let mut i = movi;
    while &b[i..i + 4] == b"00dc" {
        let len = u32_at(i + 4) as usize;
        frames.push(image::load_from_memory_with_format(&b[i + 8..i + 8 + len], image::ImageFormat::Jpeg).unwrap().to_rgb8());
        i += 8 + len + len % 2;
    }
    assert_eq!(&b[i..i + 4], b"idx1", "the index follows the frames");
    assert_eq!(u32_at(i + 4) as usize, 16 * frames.len());
    (header, frames)
}

#[test]
fn vid_gen_image_to_video_as_sd_cli_does() {
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_wan_models(dir.path());
    sdflow_tests::write_test_png(&dir.path().join("in.png"), 40, 48);
    sdflow_tests::write_test_png(&dir.path().join("end.png"), 56, 40);
    let m = |p: &str| format!("models/{p}");
    let (umt5, vae, cv) = (m("text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"), m("vae/wan_2.1_vae.safetensors"), m("clip_vision/clip_vision_h.safetensors"));
    let run = |model: &str, vae: &str, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["vid_gen", "--diffusion-model", &m(&format!("diffusion_models/{model}")), "--t5xxl", &umt5, "--vae", vae, "-p", "a fox turns", "--steps", "2", "-W", "32", "-H", "32", "--video-frames", "5"].iter().map(|s| s.to_string()).collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Wan 2.1 I2V: the start image through CLIP vision (cut to its centre, as sd.cpp's
    // clip_preprocess) and the VAE beside the latent.
    let i2v = run("wan2.1_i2v_480p_14B_fp16.safetensors", &vae, &["-i", "in.png", "--clip_vision", &cv]);
    let printed = ok(&args(&[&i2v[..], &["--print-workflow".to_string()]].concat()), dir.path());
    for part in ["\"WanFirstLastFrameToVideo\"", "\"CLIPVisionEncode\"", "\"crop\": \"center\"", "\"clip_vision_start_image\"", "\"length\": 5"] {
        assert!(printed.contains(part), "{part} in {printed}");
    }
    assert!(!printed.contains("clip_vision_end_image") && !printed.contains("EmptyHunyuanLatentVideo"), "{printed}");
    ok(&args(&[&i2v[..], &["-o".to_string(), "i2v.avi".to_string()]].concat()), dir.path());
    let (_, frames) = read_mjpg_avi(&dir.path().join("i2v.avi"));
    assert_eq!((frames.len(), frames[0].dimensions()), (5, (32, 32)));
    // The end image changes the video (the I2V model's last frame, not its CLIP states).
    ok(&args(&[&i2v[..], &["--end-img".to_string(), "end.png".to_string(), "-o".to_string(), "i2v_end.avi".to_string()]].concat()), dir.path());
    let (_, ended) = read_mjpg_avi(&dir.path().join("i2v_end.avi"));
    assert_ne!(ended[4].as_raw(), frames[4].as_raw());
    let (_, err) = fails(&args(&run("wan2.1_i2v_480p_14B_fp16.safetensors", &vae, &["-i", "in.png"])), dir.path());
    assert!(err.contains("--clip_vision"), "{err}");
    let (_, err) = fails(&args(&run("wan2.1_i2v_480p_14B_fp16.safetensors", &vae, &["--clip_vision", &cv])), dir.path());
    assert!(err.contains("-i"), "{err}");
    // FLF2V: both images' CLIP states; the end image is required.
    let flf = run("wan2.1_flf2v_720p_14B_fp16.safetensors", &vae, &["-i", "in.png", "--end-img", "end.png", "--clip_vision", &cv]);
    let printed = ok(&args(&[&flf[..], &["--print-workflow".to_string()]].concat()), dir.path());
    assert!(printed.contains("\"clip_vision_end_image\"") && printed.contains("\"end_image\""), "{printed}");
    ok(&args(&[&flf[..], &["-o".to_string(), "flf.avi".to_string()]].concat()), dir.path());
    assert_eq!(read_mjpg_avi(&dir.path().join("flf.avi")).1.len(), 5);
    let (_, err) = fails(&args(&run("wan2.1_flf2v_720p_14B_fp16.safetensors", &vae, &["-i", "in.png", "--clip_vision", &cv])), dir.path());
    assert!(err.contains("--end-img"), "{err}");
    // Wan 2.2 TI2V 5B: the start image as the kept first latent frame of the Wan 2.2 VAE's
    // latent; without -i, text to video on the same latent.
    let vae22 = m("vae/wan2.2_vae.safetensors");
    let ti2v = run("wan2.2_ti2v_5B_fp16.safetensors", &vae22, &["-i", "in.png"]);
    let printed = ok(&args(&[&ti2v[..], &["--print-workflow".to_string()]].concat()), dir.path());
    assert!(printed.contains("\"Wan22ImageToVideoLatent\"") && printed.contains("\"start_image\""), "{printed}");
    ok(&args(&[&ti2v[..], &["-o".to_string(), "ti2v.avi".to_string()]].concat()), dir.path());
    let (_, ti) = read_mjpg_avi(&dir.path().join("ti2v.avi"));
    assert_eq!((ti.len(), ti[0].dimensions()), (5, (32, 32)));
    ok(&args(&run("wan2.2_ti2v_5B_fp16.safetensors", &vae22, &["-o", "t2v5b.avi"])), dir.path());
    assert_ne!(read_mjpg_avi(&dir.path().join("t2v5b.avi")).1[0].as_raw(), ti[0].as_raw());
    // sd.cpp's TI2V end frame: kept as the last latent frame too.
    let ended = run("wan2.2_ti2v_5B_fp16.safetensors", &vae22, &["-i", "in.png", "--end-img", "end.png"]);
    let printed = ok(&args(&[&ended[..], &["--print-workflow".to_string()]].concat()), dir.path());
    assert!(printed.contains("\"end_image\""), "{printed}");
    ok(&args(&[&ended[..], &["-o".to_string(), "ti2v_end.avi".to_string()]].concat()), dir.path());
    assert_ne!(read_mjpg_avi(&dir.path().join("ti2v_end.avi")).1[4].as_raw(), ti[4].as_raw());
    // img_gen takes neither flag.
    let (_, err) = fails(&["img_gen", "-m", "models/checkpoints/model.safetensors", "-p", "x", "--end-img", "end.png"], dir.path());
    assert!(err.contains("--end-img"), "{err}");
    // Wan VACE: the control frames (a folder, file-name order) and -i as the reference
    // image, whose extra latent frame is trimmed before decoding.
    let vace = run("wan2.1_vace_1.3B_fp16.safetensors", &vae, &["--control-video", "input/control_video", "-i", "in.png", "--vace-strength", "0.8"]);
    let printed = ok(&args(&[&vace[..], &["--print-workflow".to_string()]].concat()), dir.path());
    for part in ["\"WanVaceToVideo\"", "\"LoadImagesFromDir\"", "\"reference_image\"", "\"TrimVideoLatent\"", "\"strength\": 0.8"] {
        assert!(printed.contains(part), "{part} in {printed}");
    }
    ok(&args(&[&vace[..], &["-o".to_string(), "vace.avi".to_string()]].concat()), dir.path());
    let (_, vf) = read_mjpg_avi(&dir.path().join("vace.avi"));
    assert_eq!((vf.len(), vf[0].dimensions()), (5, (32, 32)));
    ok(&args(&run("wan2.1_vace_1.3B_fp16.safetensors", &vae, &["--control-video", "input/control_video", "-o", "vace_noref.avi"])), dir.path());
    assert_ne!(read_mjpg_avi(&dir.path().join("vace_noref.avi")).1[0].as_raw(), vf[0].as_raw());
    let (_, err) = fails(&args(&run("wan2.1_t2v_1.3B_fp16.safetensors", &vae, &["--control-video", "input/control_video"])), dir.path());
    assert!(err.contains("--control-video") && err.contains("VACE"), "{err}");
    let (_, err) = fails(&args(&run("wan2.1_vace_1.3B_fp16.safetensors", &vae, &["--control-video", "no_such_dir"])), dir.path());
    assert!(err.contains("no such folder"), "{err}");
}

#[test]
fn vid_gen_writes_wan_videos_as_sd_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_wan_models(dir.path());
    let m = |p: &str| format!("models/{p}");
    let (wan, umt5, vae) = (m("diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors"), m("text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"), m("vae/wan_2.1_vae.safetensors"));
    let base = ["vid_gen", "--diffusion-model", &wan, "--t5xxl", &umt5, "--vae", &vae, "-p", "a fox in snow", "--steps", "2", "-W", "32", "-H", "32", "-t", "2", "--cfg-scale", "5"];
    let printed = ok(&[&base[..], &["--video-frames", "6", "--print-workflow"]].concat(), dir.path());
    for part in ["\"EmptyHunyuanLatentVideo\"", "\"length\": 5", "\"SaveVideoSdCpp\"", "\"SdCppConditioner\"", "\"type\": \"wan\"", "\"ModelSamplingSD3\"", "\"shift\": 5.0", "\"ManualSigmas\"", "\"format\": \"avi\""] {
        assert!(printed.contains(part), "{part} in {printed}");
    }
    // 6 frames round down to 5 (4·1 + 1); the default container is a Motion-JPEG AVI.
    ok(&[&base[..], &["--video-frames", "6", "-o", "v.avi"]].concat(), dir.path());
    let ((us, w, h, n), avi) = read_mjpg_avi(&dir.path().join("v.avi"));
    assert_eq!((us, w, h, n, avi.len()), (62_500, 32, 32, 5, 5));
    assert!(avi.iter().all(|f| f.dimensions() == (32, 32)));
    // The same video as numbered PNGs (a %d pattern) is the AVI's frames before JPEG.
    ok(&[&base[..], &["--video-frames", "5", "-o", "f_%02d.png"]].concat(), dir.path());
    for (i, jpeg) in avi.iter().enumerate() {
        let png = image::open(dir.path().join(format!("f_{i:02}.png"))).unwrap().to_rgb8();
        let diff: f64 = png.as_raw().iter().zip(jpeg.as_raw()).map(|(a, b)| (*a as f64 - *b as f64).abs()).sum::<f64>() / png.as_raw().len() as f64;
        assert!(diff < 12.0, "frame {i}: JPEG differs from the PNG by {diff} on average");
    }
    assert!(!dir.path().join("f_05.png").exists());
    // An animated WebP at --fps 8: 125 ms per frame.
    ok(&[&base[..], &["--video-frames", "5", "--fps", "8", "-o", "v.webp"]].concat(), dir.path());
    let webp = std::fs::read(dir.path().join("v.webp")).unwrap();
    let decoder = webp_animation::Decoder::new(&webp).unwrap();
    assert_eq!(decoder.dimensions(), (32, 32));
    let stamps: Vec<i32> = decoder.into_iter().map(|f| f.timestamp()).collect();
    assert_eq!(stamps, vec![125, 250, 375, 500, 625]);
    // A WebM of VP8 keyframes at 62.5 ms a frame, each frame the PNG's within lossy coding.
    ok(&[&base[..], &["--video-frames", "5", "-o", "v.webm"]].concat(), dir.path());
    let (doc, webm) = read_vp8_webm(&dir.path().join("v.webm"));
    assert_eq!((doc.as_str(), webm.len()), ("webm", 5));
    for (i, (t, frame)) in webm.iter().enumerate() {
        assert!((*t - (i as i64 * 625 + 5) / 10).abs() <= 1, "frame {i} at {t} ms");
        let png = image::open(dir.path().join(format!("f_{i:02}.png"))).unwrap().to_rgb8();
        assert_eq!(frame.dimensions(), png.dimensions());
        let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).map(|(a, b)| (*a as f64 - *b as f64).abs()).sum::<f64>() / a.len() as f64;
        // VP8 halves the chroma of these noisy 32² frames: close, and far closer than grey.
        let (own, grey) = (diff(png.as_raw(), frame.as_raw()), diff(png.as_raw(), &vec![128; png.as_raw().len()]));
        assert!(own < grey / 2.0, "frame {i}: VP8 differs from the PNG by {own} on average (grey: {grey})");
    }
    // Another extension becomes .avi; one frame is a PNG, as sd-cli saves them.
    ok(&[&base[..], &["--video-frames", "5", "-o", "clip.mp4"]].concat(), dir.path());
    assert!(dir.path().join("clip.avi").exists() && !dir.path().join("clip.mp4").exists());
    ok(&[&base[..], &["-o", "one.avi"]].concat(), dir.path());
    assert_eq!(png_size(&dir.path().join("one.png")), (32, 32));
    let (_, err) = fails(&[&base[..], &["-i", "in.png", "--video-frames", "5"]].concat(), dir.path());
    assert!(err.contains("not supported yet: -i") && err.contains("Wan"), "{err}");
    // Wan2.2's two experts: 1 high-noise step added to the 2, its own CFG scale; the
    // low-noise expert goes on from its latent without adding noise.
    let high = m("diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors");
    let moe = [&base[..], &["--video-frames", "5", "--high-noise-diffusion-model", &high, "--high-noise-steps", "1", "--high-noise-cfg-scale", "3.5"]].concat();
    let printed = ok(&[&moe[..], &["--print-workflow"]].concat(), dir.path());
    let wf: serde_json::Value = serde_json::from_str(&printed).unwrap();
    let customs: Vec<&serde_json::Value> = wf["nodes"].as_object().unwrap().values().filter(|n| n["class_type"] == "SamplerCustom").collect();
    assert_eq!(customs.len(), 2, "{printed}");
    let by_noise = |add: bool| customs.iter().find(|n| n["inputs"]["add_noise"] == add).unwrap_or_else(|| panic!("a pass with add_noise {add}: {printed}"));
    assert_eq!((by_noise(true)["inputs"]["cfg"].as_f64(), by_noise(false)["inputs"]["cfg"].as_f64()), (Some(3.5), Some(5.0)));
    assert!(printed.contains("wan2.2_t2v_high_noise_14B_fp16.safetensors"), "{printed}");
    ok(&[&moe[..], &["-o", "moe.avi"]].concat(), dir.path());
    let (_, moe_frames) = read_mjpg_avi(&dir.path().join("moe.avi"));
    assert_eq!(moe_frames.len(), 5);
    assert_ne!(moe_frames[0].as_raw(), avi[0].as_raw(), "the experts' video is another");
    // The split from --moe-boundary when --high-noise-steps is not given.
    ok(&[&base[..], &["--video-frames", "5", "--high-noise-diffusion-model", &high, "--moe-boundary", "0.9", "-o", "moe_b.avi"]].concat(), dir.path());
    let (_, err) = fails(&[&moe[..], &["--moe-boundary", "2"]].concat(), dir.path());
    assert!(err.contains("--moe-boundary"), "{err}");
    // `<lora:|high_noise|name:w>` goes to the high-noise expert alone, and needs one.
    let tagged: Vec<&str> = vec!["vid_gen", "--diffusion-model", &wan, "--t5xxl", &umt5, "--vae", &vae, "-p", "a fox <lora:|high_noise|motion:0.5>", "--video-frames", "5"];
    let printed = ok(&[&tagged[..], &["--high-noise-diffusion-model", &high, "--print-workflow"]].concat(), dir.path());
    let wf: serde_json::Value = serde_json::from_str(&printed).unwrap();
    let nodes = wf["nodes"].as_object().unwrap();
    let lora: Vec<(&String, &serde_json::Value)> = nodes.iter().filter(|(_, n)| n["class_type"] == "LoraLoaderModelOnly").collect();
    assert_eq!(lora.len(), 1, "{printed}");
    assert_eq!((lora[0].1["inputs"]["lora_name"].as_str(), lora[0].1["inputs"]["strength_model"].as_f64()), (Some("motion.safetensors"), Some(0.5)));
    let below = &nodes[lora[0].1["inputs"]["model"][0].as_str().unwrap()];
    assert_eq!(below["class_type"], "ModelSamplingSD3");
    assert_eq!(nodes[below["inputs"]["model"][0].as_str().unwrap()]["inputs"]["unet_name"], "wan2.2_t2v_high_noise_14B_fp16.safetensors");
    assert!(!printed.contains("\"LoraLoader\""), "no LoRA on the low-noise expert: {printed}");
    let (_, err) = fails(&[&tagged[..], &["--print-workflow"]].concat(), dir.path());
    assert!(err.contains("<lora:|high_noise|motion>") && err.contains("--high-noise-diffusion-model"), "{err}");
}

/// sd-cli's vid_gen with an SD1 checkpoint and `--motion-module` (AnimateDiff): the
/// frames as one latent batch through ADE_AnimateDiffLoaderGen1 on the checkpoint's own
/// schedule, no 4·k + 1 rounding, at most 32 frames; one frame is img_gen's image;
/// `-i --strength` starts every frame from the image; the domain adapter is a LoRA tag.
#[test]
fn vid_gen_animates_sd1_with_a_motion_module_as_sd_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_animatediff_models(dir.path());
    sdflow_tests::write_test_png(&dir.path().join("in.png"), 40, 40);
    let common = ["-m", "models/checkpoints/model.safetensors", "-p", "a red apple on a wooden table", "--steps", "2", "-W", "32", "-H", "32", "-t", "2", "--cfg-scale", "8", "-s", "42"];
    let base = [&["vid_gen", "--motion-module", "models/animatediff_models/mm_sd15_v3.safetensors"][..], &common[..]].concat();
    let printed = ok(&[&base[..], &["--video-frames", "6", "--print-workflow"]].concat(), dir.path());
    for part in ["\"ADE_AnimateDiffLoaderGen1\"", "\"beta_schedule\": \"use existing\"", "\"v1_groupnorm\": \"per frame\"", "\"model_name\": \"mm_sd15_v3.safetensors\"", "\"batch_size\": 6", "\"SaveVideoSdCpp\"", "\"format\": \"avi\"", "AnimateDiff, text to video (6 frames)"] {
        assert!(printed.contains(part), "{part} in {printed}");
    }
    let capped = ok(&[&base[..], &["--video-frames", "40", "--print-workflow"]].concat(), dir.path());
    assert!(capped.contains("\"batch_size\": 32"), "{capped}");

    ok(&[&base[..], &["--video-frames", "6", "-o", "v.avi"]].concat(), dir.path());
    let ((_, w, h, n), frames) = read_mjpg_avi(&dir.path().join("v.avi"));
    assert_eq!((w, h, n, frames.len()), (32, 32, 6, 6));
    assert_ne!(frames[0].as_raw(), frames[5].as_raw());
    // One frame leaves the modules out: img_gen's image, pixel for pixel.
    ok(&[&base[..], &["-o", "one.avi"]].concat(), dir.path());
    ok(&[&["img_gen"][..], &common[..], &["-o", "img.png"]].concat(), dir.path());
    let (one, img) = (image::open(dir.path().join("one.png")).unwrap().to_rgb8(), image::open(dir.path().join("img.png")).unwrap().to_rgb8());
    assert_eq!(one.as_raw(), img.as_raw());
    // img2video: the image encoded and repeated for every frame, noised to --strength.
    let i2v = [&base[..], &["--video-frames", "4", "-i", "in.png", "--strength", "0.75"]].concat();
    let printed = ok(&[&i2v[..], &["--print-workflow"]].concat(), dir.path());
    for part in ["\"VAEEncode\"", "\"RepeatLatentBatch\"", "\"amount\": 4", "\"denoise\": 0.75", "AnimateDiff, image to video"] {
        assert!(printed.contains(part), "{part} in {printed}");
    }
    ok(&[&i2v[..], &["-o", "i2v.avi"]].concat(), dir.path());
    assert_eq!(read_mjpg_avi(&dir.path().join("i2v.avi")).1.len(), 4);
    // The v3 domain adapter as a prompt LoRA.
    let mut tagged = base.clone();
    let at = tagged.iter().position(|a| *a == "a red apple on a wooden table").unwrap();
    tagged[at] = "a red apple on a wooden table<lora:v3_sd15_adapter:1.0>";
    ok(&[&tagged[..], &["--lora-model-dir", "models/loras", "--video-frames", "6", "-o", "lora.avi"]].concat(), dir.path());
    assert_ne!(read_mjpg_avi(&dir.path().join("lora.avi")).1[0].as_raw(), frames[0].as_raw());

    // What sd-cli would not do, or sdflow refuses with a reason.
    let (_, err) = fails(&[&["vid_gen"][..], &common[..], &["--video-frames", "6"]].concat(), dir.path());
    assert!(err.contains("--motion-module"), "{err}");
    let (_, err) = fails(&[&base[..], &["--video-frames", "6", "-b", "2"]].concat(), dir.path());
    assert!(err.contains("-b 2 with --motion-module"), "{err}");
    let (_, err) = fails(&[&["img_gen", "--motion-module", "models/animatediff_models/mm_sd15_v3.safetensors"][..], &common[..]].concat(), dir.path());
    assert!(err.contains("vid_gen mode"), "{err}");
}
