//! Wan 2.1 text to video end to end on tiny random-weight files (the transformer in the
//! release's names, UMT5 with its whole vocabulary, the Wan-2.1 VAE with its 5-D kernels):
//! the committed workflow to an animated WebP whose frames are read back, and bad inputs.

use sdflow_executor::{CancelToken, InputValue, NodeSpec, NullSink, RunOptions, Workflow};
use sdflow_tests::{with_input, write_wan_models, TestEnv};
use serde_json::json;
use webp_animation::Decoder;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_wan_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::Link { node: node.into(), output }
}

/// The frames of the animated WebP node `save` wrote: (width, height, RGBA frames, each
/// frame's timestamp in ms).
fn run_video(env: &TestEnv, wf: &Workflow, save: &str) -> (u32, u32, Vec<Vec<u8>>, Vec<i32>, serde_json::Value) {
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    let ui = report.ui_outputs[save].clone();
    let name = ui["images"][0]["filename"].as_str().unwrap();
    assert!(name.ends_with(".webp"), "{name}");
    let bytes = std::fs::read(env.out.join(name)).unwrap();
    let decoder = Decoder::new(&bytes).unwrap();
    let (w, h) = decoder.dimensions();
    let (mut frames, mut stamps) = (Vec::new(), Vec::new());
    for f in decoder.into_iter() {
        frames.push(f.data().to_vec());
        stamps.push(f.timestamp());
    }
    (w, h, frames, stamps, ui)
}

#[test]
fn the_workflow_makes_a_video_and_its_inputs_matter() {
    let env = env();
    let wf = env.workflow("wan_t2v.json", 32, 2);
    let (w, h, frames, stamps, ui) = run_video(&env, &wf, "10");
    // 5 frames (2 latent frames: the first alone, then 4) of 32², 16 fps.
    assert_eq!((w, h, frames.len()), (32, 32, 5));
    // Each frame shown int(1000 / 16) ms, as ComfyUI's PIL writes it (the decoder gives
    // each frame's end).
    assert_eq!(stamps, vec![62, 124, 186, 248, 310]);
    assert_eq!(ui["animated"], json!([true]));
    let spread = |f: &[u8]| f.iter().max().unwrap() - f.iter().min().unwrap();
    assert!(frames.iter().all(|f| spread(f) > 10), "frames are not flat");
    assert_ne!(frames[0], frames[4], "the video moves");
    let base = frames.clone();
    assert_eq!(run_video(&env, &wf, "10").2, base, "deterministic");
    for (node, input, v) in [("5", "text", json!("a (red:1.3) fox")), ("6", "text", json!("blurry")), ("4", "shift", json!(3.0)), ("8", "seed", json!(7)), ("8", "cfg", json!(1.0))] {
        assert_ne!(run_video(&env, &with_input(&wf, node, input, v.clone()), "10").2, base, "{node}.{input} = {v}");
    }
    // One frame: a video of one latent frame, still a WebP, not animated.
    let one = with_input(&wf, "7", "length", json!(1));
    let (_, _, frames, _, ui) = run_video(&env, &one, "10");
    assert_eq!(frames.len(), 1);
    assert!(ui.get("animated").is_none());
}

#[test]
fn lossless_webp_keeps_the_decoded_frames() {
    let env = env();
    let mut wf = env.workflow("wan_t2v.json", 32, 1);
    wf = with_input(&wf, "10", "lossless", json!(true));
    // The decoded frames saved as PNGs beside the WebP: the WebP's frames are the same pixels.
    wf.nodes.insert("11".into(), NodeSpec::new("SaveImage").with_input("images", link("9", 0)).with_input("filename_prefix", InputValue::Const(json!("frames"))));
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(&wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    let pngs = report.ui_outputs["11"]["images"].as_array().unwrap().clone();
    assert_eq!(pngs.len(), 5);
    let webp = std::fs::read(env.out.join(report.ui_outputs["10"]["images"][0]["filename"].as_str().unwrap())).unwrap();
    let decoded: Vec<Vec<u8>> = Decoder::new(&webp).unwrap().into_iter().map(|f| f.data().to_vec()).collect();
    for (png, frame) in pngs.iter().zip(&decoded) {
        let (_, _, rgb) = sdflow_tests::read_png(&env.out.join(png["filename"].as_str().unwrap()));
        let rgba: Vec<u8> = rgb.chunks_exact(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect();
        assert_eq!(&rgba, frame);
    }
}

#[test]
fn bad_inputs_are_named() {
    let env = env();
    let wf = env.workflow("wan_t2v.json", 32, 1);
    // An SD latent (4 channels) for the Wan model.
    let mut sd = wf.clone();
    sd.nodes.insert("20".into(), NodeSpec::new("EmptyLatentImage").with_input("width", InputValue::Const(json!(32))).with_input("height", InputValue::Const(json!(32))).with_input("batch_size", InputValue::Const(json!(1))));
    sd.set_input("8", "latent_image", link("20", 0)).unwrap();
    sd.set_input("9", "vae", link("3", 0)).unwrap();
    // An all-zero latent grows to the model's channels, as ComfyUI's does: it samples.
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    env.exec.run(&sd, &NullSink, &CancelToken::new(), &opts).unwrap();
    // A video latent decoded with an SD VAE is refused by name.
    let mut kl = wf.clone();
    kl.nodes.insert("21".into(), NodeSpec::new("CheckpointLoaderSimple").with_input("ckpt_name", InputValue::Const(json!("model.safetensors"))));
    kl.set_input("9", "vae", link("21", 2)).unwrap();
    let e = env.run_err(&kl);
    assert!(e.contains("frames") && e.contains("Wan VAE"), "{e}");
}

/// Image to video: the start image through CLIP vision and the VAE (WanImageToVideo) into
/// a Wan I2V model's extra channels and image tokens; both matter, and a T2V model
/// ignores neither silently.
#[test]
fn image_to_video_reads_the_start_image() {
    let env = env();
    sdflow_tests::write_test_png(&env.dir.path().join("input/input.png"), 72, 56);
    let wf = env.workflow("wan_i2v.json", 32, 2);
    let (w, h, frames, _, ui) = run_video(&env, &wf, "13");
    assert_eq!((w, h, frames.len(), ui["animated"].clone()), (32, 32, 5, json!([true])));
    let base = frames;
    // Without CLIP vision, without the start image: other videos.
    let mut no_clip = wf.clone();
    no_clip.nodes.get_mut("9").unwrap().inputs.remove("clip_vision_output");
    let e = env.run_err(&no_clip);
    assert!(e.contains("CLIP-vision"), "an I2V model needs its image tokens: {e}");
    let mut no_image = wf.clone();
    no_image.nodes.get_mut("9").unwrap().inputs.remove("start_image");
    assert_ne!(run_video(&env, &no_image, "13").2, base, "the start image matters");
    for (node, input, v) in [("7", "text", json!("a red fox")), ("11", "seed", json!(3))] {
        assert_ne!(run_video(&env, &with_input(&wf, node, input, v.clone()), "13").2, base, "{node}.{input} = {v}");
    }
    // The start frames' latent is for the size it was made at.
    let mut sizes = wf.clone();
    sizes.nodes.insert("20".into(), NodeSpec::new("EmptyHunyuanLatentVideo").with_input("width", InputValue::Const(json!(48))).with_input("height", InputValue::Const(json!(32))).with_input("length", InputValue::Const(json!(5))).with_input("batch_size", InputValue::Const(json!(1))));
    sizes.set_input("11", "latent_image", link("20", 0)).unwrap();
    let e = env.run_err(&sizes);
    assert!(e.contains("start frames"), "{e}");
}

/// Wan 2.2's two experts: the high-noise model's steps hand a noisy latent to the
/// low-noise model; each expert's weights shape the video.
#[test]
fn two_experts_share_the_schedule() {
    let env = env();
    let wf = env.workflow("wan22_moe_t2v.json", 32, 4);
    let (_, _, frames, _, _) = run_video(&env, &wf, "13");
    assert_eq!(frames.len(), 5);
    let base = frames;
    // The shrunk workflow splits its 4 steps at 2: each expert runs.
    for (node, input, v) in [("1", "unet_name", json!("wan2.1_t2v_1.3B_fp16.safetensors")), ("2", "unet_name", json!("wan2.1_t2v_1.3B_fp16.safetensors"))] {
        assert_ne!(run_video(&env, &with_input(&wf, node, input, v.clone()), "13").2, base, "{node}.{input} = {v}");
    }
}

/// First and last frame: both images' CLIP-vision states (with the FLF2V model's learned
/// positions) and the video's two ends through the VAE; the end image matters.
#[test]
fn first_last_frame_reads_both_ends() {
    let env = env();
    sdflow_tests::write_test_png(&env.dir.path().join("input/input.png"), 72, 56);
    std::fs::write(env.dir.path().join("input/last.png"), std::fs::read(env.dir.path().join("input/input.png")).unwrap()).unwrap();
    let wf = env.workflow("wan_flf2v.json", 32, 2);
    let (w, h, frames, _, _) = run_video(&env, &wf, "15");
    assert_eq!((w, h, frames.len()), (32, 32, 5));
    // Another last frame (the first flipped), or none: other videos.
    let mut flipped = wf.clone();
    flipped.nodes.insert("20".into(), NodeSpec::new("ImageInvert").with_input("image", link("6", 0)));
    flipped.set_input("11", "end_image", link("20", 0)).unwrap();
    assert_ne!(run_video(&env, &flipped, "15").2, frames, "the end image matters");
    let mut start_only = wf.clone();
    start_only.nodes.get_mut("11").unwrap().inputs.remove("end_image");
    start_only.nodes.get_mut("11").unwrap().inputs.remove("clip_vision_end_image");
    assert_ne!(run_video(&env, &start_only, "15").2, frames);
}

/// Wan 2.2 TI2V 5B: the start image through the Wan 2.2 VAE into the first latent frame,
/// which sampling keeps as it is (the noise mask, the model reading it at level 0) while
/// the frames after it are sampled; without the image it is text to video.
#[test]
fn ti2v_keeps_the_start_frame_and_samples_the_rest() {
    let env = env();
    sdflow_tests::write_test_png(&env.dir.path().join("input/input.png"), 72, 56);
    let wf = env.workflow("wan22_ti2v.json", 32, 2);
    let (w, h, frames, stamps, ui) = run_video(&env, &wf, "11");
    assert_eq!((w, h, frames.len(), ui["animated"].clone()), (32, 32, 5, json!([true])));
    // 24 fps: int(1000 / 24) ms a frame.
    assert_eq!(stamps[0], 41);
    let given = env.run_latent(&wf, "7");
    // Euler's last step lands on the denoised latent, which the mask holds at the given frame.
    let sampled = env.run_latent(&with_input(&wf, "9", "sampler_name", json!("euler")), "9");
    // 48 channels × 2 latent frames at 1/16; the first frame given, the second to sample.
    assert_eq!((given.shape, given.frames), ([2, 2, 96, 1], 2));
    let mask = given.noise_mask.as_ref().expect("a noise mask");
    assert_eq!((mask.n, &mask.data[..]), (2, &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0][..]));
    let frame = |l: &sdflow_nodes::values::Latent, f: usize| sdflow_core::models::dit::frame_of(&l.samples, 48, 2, 4, f);
    let frame3 = |l: &sdflow_nodes::values::Latent, f: usize| sdflow_core::models::dit::frame_of(&l.samples, 48, 3, 4, f);
    let (g0, s0) = (frame(&given, 0), frame(&sampled, 0));
    let err = g0.iter().zip(&s0).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(err < 1e-4, "the start frame moved by {err}");
    // The frame after it starts at the VAE's mean latent and is sampled away from it.
    let mean = sdflow_core::models::vae::wan::WAN22_LATENTS_MEAN;
    assert!(frame(&given, 1).chunks(4).zip(mean).all(|(p, m)| p.iter().all(|v| *v == m)));
    assert!(frame(&sampled, 1).iter().zip(frame(&given, 1)).any(|(a, b)| (a - b).abs() > 1e-2));
    // The start image and the prompt shape the video; without the image it is T2V.
    let base = frames;
    let mut flipped = wf.clone();
    flipped.nodes.insert("20".into(), NodeSpec::new("ImageInvert").with_input("image", link("4", 0)));
    flipped.set_input("7", "start_image", link("20", 0)).unwrap();
    assert_ne!(run_video(&env, &flipped, "11").2, base, "the start image matters");
    assert_ne!(run_video(&env, &with_input(&wf, "5", "text", json!("a red fox")), "11").2, base, "the prompt matters");
    let mut t2v = wf.clone();
    t2v.nodes.get_mut("7").unwrap().inputs.remove("start_image");
    let empty = env.run_latent(&t2v, "7");
    assert!(empty.noise_mask.is_none() && empty.samples.iter().all(|v| *v == 0.0));
    assert_ne!(run_video(&env, &t2v, "11").2, base);
    // sdflow's end_image (sd-cli's --end-img): the last latent frame kept as well, encoded
    // alone as a first frame is.
    let mut ended = with_input(&wf, "7", "length", json!(9));
    ended.nodes.insert("21".into(), NodeSpec::new("ImageInvert").with_input("image", link("4", 0)));
    ended.set_input("7", "end_image", link("21", 0)).unwrap();
    let both = env.run_latent(&ended, "7");
    let mask = both.noise_mask.as_ref().expect("a noise mask");
    assert_eq!((both.frames, mask.n), (3, 3));
    assert_eq!(mask.data.chunks(4).map(|p| p[0]).collect::<Vec<_>>(), vec![0.0, 1.0, 0.0]);
    let (f0, f2) = (frame3(&both, 0), frame3(&both, 2));
    assert_ne!(f0, f2, "the end frame is its own image");
    let sampled = env.run_latent(&with_input(&ended, "9", "sampler_name", json!("euler")), "9");
    let err = frame3(&sampled, 2).iter().zip(&f2).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(err < 1e-4, "the end frame moved by {err}");
    // A Wan 2.1 VAE (16 channels) for the 48-channel latent, and sizes off the 16-pixel
    // blocks, are refused by name.
    let e = env.run_err(&with_input(&wf, "3", "vae_name", json!("wan_2.1_vae.safetensors")));
    assert!(e.contains("Wan 2.2 VAE"), "{e}");
    let e = env.run_err(&with_input(&wf, "7", "width", json!(40)));
    assert!(e.contains("multiples of 16"), "{e}");
}

/// Wan VACE: the control video's frames (an MP4 through LoadVideo) and the reference image
/// through the VAE into the
/// VACE blocks; the reference's extra latent frame is trimmed after sampling. The control,
/// its strength and the reference each matter; a VACE control for a plain T2V model is
/// refused by name.
#[test]
fn vace_follows_the_control_video() {
    let env = env();
    sdflow_tests::write_test_png(&env.dir.path().join("input/input.png"), 72, 56);
    let wf = env.workflow("wan_vace.json", 32, 2);
    let (w, h, frames, _, ui) = run_video(&env, &wf, "13");
    assert_eq!((w, h, frames.len(), ui["animated"].clone()), (32, 32, 5, json!([true])));
    // The control video comes from an MP4 (LoadVideo); a folder of frames
    // (LoadImagesFromDir, sd-cli's --control-video) serves as well.
    let mut folder = wf.clone();
    folder.nodes.insert("21".into(), NodeSpec::new("LoadImagesFromDir").with_input("directory", InputValue::Const(json!("control_video"))));
    folder.set_input("8", "control_video", link("21", 0)).unwrap();
    assert_eq!(run_video(&env, &folder, "13").2.len(), 5);
    // The sampled latent holds the reference frame first: 3 latent frames, 2 after trimming.
    assert_eq!(env.run_latent(&wf, "10").frames, 3);
    assert_eq!(env.run_latent(&wf, "11").frames, 2);
    let base = frames;
    let mut inverted = wf.clone();
    inverted.nodes.insert("20".into(), NodeSpec::new("ImageInvert").with_input("image", link("14", 0)));
    inverted.set_input("8", "control_video", link("20", 0)).unwrap();
    assert_ne!(run_video(&env, &inverted, "13").2, base, "the control video matters");
    assert_ne!(run_video(&env, &with_input(&wf, "8", "strength", json!(0.3)), "13").2, base, "the strength matters");
    let mut no_reference = wf.clone();
    no_reference.nodes.get_mut("8").unwrap().inputs.remove("reference_image");
    assert_eq!(env.run_latent(&no_reference, "10").frames, 2);
    assert_ne!(run_video(&env, &no_reference, "13").2, base, "the reference matters");
    // Without any control, a VACE model samples on ComfyUI's default (the zero latent).
    let mut plain = wf.clone();
    plain.set_input("10", "positive", link("6", 0)).unwrap();
    plain.set_input("10", "negative", link("7", 0)).unwrap();
    let (_, _, frames, _, _) = run_video(&env, &plain, "13");
    assert_eq!(frames.len(), 5);
    // WanVaceToVideo's control for a T2V model without VACE blocks is refused by name.
    let e = env.run_err(&with_input(&wf, "1", "unet_name", json!("wan2.1_t2v_1.3B_fp16.safetensors")));
    assert!(e.contains("VACE"), "{e}");
}

/// VAEDecodeTiled on a video latent: spatial tiles, each a whole video through the Wan VAE,
/// blended into frames of the untiled size that stay close to the untiled decode.
#[test]
fn tiled_decode_of_a_video() {
    let env = env();
    let wf = env.workflow("wan_t2v.json", 96, 1);
    let (_, _, whole, _, _) = run_video(&env, &wf, "10");
    let mut tiled = wf.clone();
    let node = NodeSpec::new("VAEDecodeTiled")
        .with_input("samples", link("8", 0))
        .with_input("vae", link("3", 0))
        .with_input("tile_size", InputValue::Const(json!(64)))
        .with_input("overlap", InputValue::Const(json!(32)))
        .with_input("temporal_size", InputValue::Const(json!(64)))
        .with_input("temporal_overlap", InputValue::Const(json!(8)));
    tiled.nodes.insert("9".into(), node);
    let (w, h, frames, _, _) = run_video(&env, &tiled, "10");
    assert_eq!((w, h, frames.len()), (96, 96, whole.len()));
    let diff = frames.iter().zip(&whole).map(|(a, b)| a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).sum::<f64>() / a.len() as f64).fold(0.0, f64::max);
    assert!(diff > 0.0 && diff < 12.0, "tiled frames differ from the whole decode by {diff} on average");
}

/// The transformer as ComfyUI-GGUF writes it (city96's Wan GGUFs): the 5-D patch kernel,
/// which GGUF cannot hold, flattened into rows of 256 with its shape under
/// `comfy.gguf.orig_shape.*`; the rest as stored (`f32`), or in Q8_0 wherever sd.cpp's
/// convert quantizes (modulation tables included, which ComfyUI-GGUF keeps in f32).
fn write_comfy_gguf(src: &std::path::Path, out: &std::path::Path, q8: bool) {
    write_gguf(src, out, q8, false)
}

/// The transformer as sd.cpp's convert writes it: the 5-D patch kernel as the 4-D
/// [D·C, 1, 2, 2] its Conv3d holds, no ComfyUI-GGUF key.
fn write_sdcpp_gguf(src: &std::path::Path, out: &std::path::Path, q8: bool) {
    write_gguf(src, out, q8, true)
}

fn write_gguf(src: &std::path::Path, out: &std::path::Path, q8: bool, sdcpp: bool) {
    use sdflow_core::dtype::{self, DType};
    use sdflow_core::io::gguf::{self, Value};
    let file = sdflow_core::io::open(src).unwrap();
    let (mut kv, mut tensors) = (vec![("general.architecture".to_string(), Value::String("wan".into()))], Vec::new());
    for t in file.tensors() {
        let n: usize = t.shape.iter().product();
        let values = dtype::to_f32(t.dtype, &file.read(&t.name).unwrap(), n).unwrap();
        let (shape, ty) = if t.shape.len() > 4 && sdcpp {
            (std::iter::once(t.shape[0] * t.shape[1]).chain(t.shape[2..].iter().copied()).collect(), DType::F32)
        } else if t.shape.len() > 4 {
            kv.push((format!("comfy.gguf.orig_shape.{}", t.name), Value::Array(t.shape.iter().map(|&d| Value::I32(d as i32)).collect())));
            (vec![n / 256, 256], DType::F32)
        } else if q8 && t.shape.len() >= 2 && t.shape.last().unwrap() % 32 == 0 && !t.name.ends_with(".bias") && !t.name.contains("embedding") {
            // What sd.cpp's convert quantizes: the modulation tables too.
            (t.shape.clone(), DType::Q8_0)
        } else {
            (t.shape.clone(), DType::F32)
        };
        let bytes = dtype::from_f32(&values, *shape.last().unwrap(), ty).unwrap();
        tensors.push((t.name.clone(), ty, shape, bytes));
    }
    gguf::write(out, &kv, tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))).unwrap();
}

/// The transformer from GGUF files as ComfyUI-GGUF, sd.cpp's convert and our
/// `gguf::write` store it: the same weights give the safetensors' video bit for bit, and
/// Q8_0 files (their modulation tables quantized too) run and stay close.
#[test]
fn gguf_files_of_the_transformer_run() {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_wan_models(dir.path());
    let models = dir.path().join("models/diffusion_models");
    let st = models.join("wan2.1_t2v_1.3B_fp16.safetensors");
    write_comfy_gguf(&st, &models.join("wan2.1-t2v-1.3b-F32.gguf"), false);
    write_comfy_gguf(&st, &models.join("wan2.1-t2v-1.3b-Q8_0.gguf"), true);
    write_sdcpp_gguf(&st, &models.join("wan2.1-t2v-1.3b-sdcpp-f32.gguf"), false);
    write_sdcpp_gguf(&st, &models.join("wan2.1-t2v-1.3b-sdcpp-q8_0.gguf"), true);
    // As `gguf::write` stores a 5-D tensor: sd.cpp's shape plus ComfyUI-GGUF's key.
    let file = sdflow_core::io::open(&st).unwrap();
    let data: Vec<_> = file.tensors().iter().map(|t| (t.name.clone(), t.dtype, t.shape.clone(), file.read(&t.name).unwrap().to_vec())).collect();
    sdflow_core::io::gguf::write(&models.join("wan2.1-t2v-1.3b-written.gguf"), &[], data.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))).unwrap();
    let env = TestEnv::with_dir(dir, |rt| rt);
    let wf = env.workflow("wan_t2v.json", 32, 2);
    let (_, _, base, _, _) = run_video(&env, &wf, "10");
    let frames_of = |name: &str| run_video(&env, &with_input(&wf, "1", "unet_name", json!(name)), "10").2;
    for name in ["wan2.1-t2v-1.3b-F32.gguf", "wan2.1-t2v-1.3b-sdcpp-f32.gguf", "wan2.1-t2v-1.3b-written.gguf"] {
        assert_eq!(frames_of(name), base, "{name}: the same weights from the GGUF give the same video");
    }
    let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).sum::<f64>() / a.len() as f64;
    for name in ["wan2.1-t2v-1.3b-Q8_0.gguf", "wan2.1-t2v-1.3b-sdcpp-q8_0.gguf"] {
        let q8 = frames_of(name);
        assert_eq!(q8.len(), 5);
        let d = diff(&q8[4], &base[4]);
        assert!(d < 8.0, "{name}: Q8_0 strays {d} per channel from the f32 video");
    }
}
