//! Video out: ComfyUI's SaveAnimatedWEBP, CreateVideo and SaveVideo (a VIDEO of frames and
//! a frame rate, written as an MP4 of H.264), and the files sd-cli writes for a video `-o`
//! (`.avi` Motion-JPEG by default, `.webp` animated, `.webm` VP8, or numbered frames), over
//! IMAGE batches whose images are a video's frames (what VAEDecode makes of a video
//! latent). The encoders are in [`encode`].

pub mod animatediff;
pub mod decode;
pub mod encode;

use crate::image::{next_counter, output_target, write_numbered};
use crate::runtime::Runtime;
use crate::values::Image;
use encode::{animated_webp, av1_webm, h264_mp4, mjpg_avi, vp8_webm, vp9_webm, Rgb8Frames, WebpOptions};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry};
use serde_json::json;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(SaveAnimatedWebp { rt: rt.clone() }));
    registry.register(Arc::new(SaveVideoSdCpp { rt: rt.clone() }));
    registry.register(Arc::new(SaveWebm { rt: rt.clone() }));
    registry.register(Arc::new(CreateVideo));
    registry.register(Arc::new(LoadVideo { rt: rt.clone() }));
    registry.register(Arc::new(GetVideoComponents));
    registry.register(Arc::new(SaveVideo { rt: rt.clone() }));
    registry.register(Arc::new(animatediff::AnimateDiffLoaderGen1 { rt: rt.clone() }));
}

/// ComfyUI's "SaveWEBM": the batch as one WebM of VP9 or AV1 at a constant quality (`crf`).
struct SaveWebm {
    rt: Arc<Runtime>,
}

impl Node for SaveWebm {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SaveWEBM")
            .display_name("SaveWEBM")
            .category("image/video")
            .input(InputSpec::link("images", IoType::IMAGE))
            .input(InputSpec::string("filename_prefix", "ComfyUI"))
            .input(InputSpec::combo("codec", ["vp9", "av1"]).tooltip("vp9 (libvpx, 8-bit) or av1 (rav1e, 10-bit, as ComfyUI's SVT-AV1)."))
            .input(InputSpec::float("fps", 24.0).float_range(0.01, 1000.0).float_step(0.01))
            .input(InputSpec::float("crf", 32.0).float_range(0.0, 63.0).float_step(1.0).tooltip("Higher crf means lower quality with a smaller file size, lower crf means higher quality higher filesize."))
            .output_node()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("images")?;
        let encode = match inputs.string("codec")? {
            "vp9" => vp9_webm,
            "av1" => av1_webm,
            other => return Err(NodeError::msg(format!("SaveWEBM: codec `{other}` is not one of vp9, av1"))),
        };
        let (fps, crf) = (inputs.float("fps")?, inputs.float("crf")?);
        if !(0.0..=63.0).contains(&crf) {
            return Err(NodeError::msg(format!("SaveWEBM: crf {crf} is outside 0..=63")));
        }
        let rgb = rgb8(img)?;
        let bytes = encode(Rgb8Frames { data: &rgb, width: img.width, height: img.height }, fps, crf.round() as u32).map_err(|e| NodeError::msg(format!("SaveWEBM: {e}")))?;
        let (dir, sub, stem) = output_target(&self.rt, ctx, inputs.string("filename_prefix")?, false)?;
        let mut counter = next_counter(&dir, &stem);
        let name = write_numbered(&dir, &stem, &mut counter, "webm", &bytes)?;
        let mut ui = animated_ui(name, &sub, img.n);
        ui["animated"] = json!([true]);
        Ok(Outputs::none().with_ui(ui))
    }
}

/// ComfyUI's VIDEO: frames and the rate they play at (no sound: sdflow has no AUDIO).
pub const VIDEO: IoType = IoType::from_static("VIDEO");

#[derive(Clone, Debug)]
pub struct Video {
    pub frames: Arc<Image>,
    pub fps: f64,
}

impl sdflow_executor::CacheSize for Video {
    fn cache_bytes(&self) -> usize {
        self.frames.data.len() * 4
    }
}

/// ComfyUI's "CreateVideo": an IMAGE batch as the frames of a VIDEO at `fps`.
struct CreateVideo;

impl Node for CreateVideo {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CreateVideo")
            .display_name("Create Video")
            .category("video")
            .description("Create a video from images.")
            .input(InputSpec::link("images", IoType::IMAGE).tooltip("The images to create a video from."))
            .input(InputSpec::float("fps", 30.0).float_range(1.0, 120.0).float_step(1.0))
            .input(InputSpec::int("bit_depth", 8).int_range(8, 10).int_step(2).optional().tooltip("8: what sdflow's H.264 writer encodes (10-bit is refused)."))
            .output("VIDEO", VIDEO)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let fps = inputs.float("fps")?;
        if !(fps.is_finite() && (1.0..=120.0).contains(&fps)) {
            return Err(NodeError::msg(format!("CreateVideo: fps {fps} is outside 1..=120")));
        }
        if inputs.contains("bit_depth") && inputs.int("bit_depth")? != 8 {
            return Err(NodeError::msg(format!("CreateVideo: bit_depth {} is not supported (8-bit H.264 is written)", inputs.int("bit_depth")?)));
        }
        let frames = Arc::new(inputs.downcast::<Image>("images")?.clone());
        if frames.n == 0 {
            return Err(NodeError::msg("CreateVideo: no frames"));
        }
        Ok(Outputs::new(vec![sdflow_executor::Value::new(VIDEO, Video { frames, fps })]))
    }
}

/// ComfyUI's AUDIO. sdflow makes no sound; a video's missing track is this, empty (where
/// ComfyUI gives `None`).
pub const AUDIO: IoType = IoType::from_static("AUDIO");

#[derive(Clone, Debug, Default)]
pub struct Audio {
    /// Samples, channel after channel.
    pub waveform: Vec<f32>,
    pub channels: usize,
    pub sample_rate: u32,
}

impl sdflow_executor::CacheSize for Audio {
    fn cache_bytes(&self) -> usize {
        self.waveform.len() * 4
    }
}

/// Video files of the input folder LoadVideo offers.
const VIDEO_EXTENSIONS: [&str; 3] = ["mp4", "webm", "mkv"];

/// ComfyUI's "LoadVideo": an MP4 (H.264) or WebM (VP8 / VP9) of the input folder as a VIDEO.
struct LoadVideo {
    rt: Arc<Runtime>,
}

impl Node for LoadVideo {
    fn schema(&self) -> NodeSchema {
        let files: Vec<String> = std::fs::read_dir(&self.rt.input_dir)
            .map(|d| {
                let mut v: Vec<String> = d
                    .flatten()
                    .filter(|e| e.path().is_file() && e.path().extension().and_then(|x| x.to_str()).is_some_and(|x| VIDEO_EXTENSIONS.contains(&x.to_ascii_lowercase().as_str())))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default();
        NodeSchema::new("LoadVideo")
            .display_name("Load Video")
            .category("video")
            .input(InputSpec::combo("file", files).extra("video_upload", json!(true)))
            .output("VIDEO", VIDEO)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        self.rt.input_fingerprint(inputs.string("file")?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let name = inputs.string("file")?;
        let path = self.rt.resolve_input(name).map_err(NodeError::msg)?;
        let bytes = std::fs::read(&path).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        let d = decode::decode_video_file(&bytes).map_err(|e| NodeError::msg(format!("LoadVideo {name}: {e}")))?;
        let data = d.rgb.iter().map(|&v| v as f32 / 255.0).collect();
        let frames = Arc::new(Image { data, n: d.frames, height: d.height, width: d.width, channels: 3 });
        Ok(Outputs::new(vec![sdflow_executor::Value::new(VIDEO, Video { frames, fps: d.fps })]))
    }
}

/// ComfyUI's "GetVideoComponents": a VIDEO's frames, sound (none: an empty AUDIO), frame
/// rate and bit depth (8).
struct GetVideoComponents;

impl Node for GetVideoComponents {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("GetVideoComponents")
            .display_name("Get Video Components")
            .category("video")
            .description("Extracts all components from a video: frames, audio, framerate, and bit depth.")
            .input(InputSpec::link("video", VIDEO).tooltip("The video to extract components from."))
            .output("images", IoType::IMAGE)
            .output("audio", AUDIO)
            .output("fps", IoType::FLOAT)
            .output("bit_depth", IoType::INT)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let video = inputs.downcast::<Video>("video")?;
        Ok(Outputs::new(vec![
            sdflow_executor::Value::new(IoType::IMAGE, (*video.frames).clone()),
            sdflow_executor::Value::new(AUDIO, Audio::default()),
            sdflow_executor::Value::new(IoType::FLOAT, video.fps),
            sdflow_executor::Value::new(IoType::INT, 8i64),
        ]))
    }
}

/// ComfyUI's "SaveVideo": a VIDEO as `<prefix>_NNNNN_.mp4` (H.264, 4:2:0) in the output
/// folder, listed as an animation in the history.
struct SaveVideo {
    rt: Arc<Runtime>,
}

impl Node for SaveVideo {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SaveVideo")
            .display_name("Save Video")
            .category("video")
            .description("Saves the input images to your ComfyUI output directory.")
            .input(InputSpec::link("video", VIDEO).tooltip("The video to save."))
            .input(InputSpec::string("filename_prefix", "video/ComfyUI"))
            .input(InputSpec::combo("format", ["auto", "mp4"]).tooltip("The format to save the video as."))
            .input(InputSpec::combo("codec", ["auto", "h264"]).tooltip("The codec to use for the video."))
            .output_node()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let video = inputs.downcast::<Video>("video")?;
        for (input, allowed) in [("format", ["auto", "mp4"]), ("codec", ["auto", "h264"])] {
            let v = inputs.string(input)?;
            if !allowed.contains(&v) {
                return Err(NodeError::msg(format!("SaveVideo: {input} `{v}` is not one of {}", allowed.join(", "))));
            }
        }
        let img = &video.frames;
        let rgb = rgb8(img)?;
        let bytes = h264_mp4(Rgb8Frames { data: &rgb, width: img.width, height: img.height }, video.fps).map_err(NodeError::msg)?;
        let (dir, sub, stem) = output_target(&self.rt, ctx, inputs.string("filename_prefix")?, false)?;
        let mut counter = next_counter(&dir, &stem);
        let name = write_numbered(&dir, &stem, &mut counter, "mp4", &bytes)?;
        let mut ui = animated_ui(name, &sub, img.n);
        // ComfyUI's PreviewVideo lists every saved video as animated.
        ui["animated"] = json!([true]);
        Ok(Outputs::none().with_ui(ui))
    }
}

/// An IMAGE batch as 8-bit RGB frames (alpha dropped, grey repeated).
pub fn rgb8(img: &Image) -> Result<Vec<u8>, NodeError> {
    if img.n == 0 || img.width == 0 || img.height == 0 {
        return Err(NodeError::msg("no frames to write"));
    }
    let q = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round() as u8;
    Ok(match img.channels {
        1 => img.data.iter().flat_map(|&v| [q(v); 3]).collect(),
        c if c >= 3 => img.data.chunks_exact(c).flat_map(|p| [q(p[0]), q(p[1]), q(p[2])]).collect(),
        c => return Err(NodeError::msg(format!("cannot write {c}-channel frames"))),
    })
}

/// The ui entry of a written animation, as ComfyUI's history lists it (`animated` only
/// for more than one frame).
fn animated_ui(name: String, sub: &str, frames: usize) -> serde_json::Value {
    let mut ui = json!({"images": [{"filename": name, "subfolder": sub, "type": "output"}]});
    if frames > 1 {
        ui["animated"] = json!([true]);
    }
    ui
}

/// ComfyUI's "SaveAnimatedWEBP": the batch as one animated WebP in the output folder.
struct SaveAnimatedWebp {
    rt: Arc<Runtime>,
}

impl Node for SaveAnimatedWebp {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SaveAnimatedWEBP")
            .display_name("SaveAnimatedWEBP")
            .category("image/animation")
            .input(InputSpec::link("images", IoType::IMAGE))
            .input(InputSpec::string("filename_prefix", "ComfyUI"))
            .input(InputSpec::float("fps", 6.0).float_range(0.01, 1000.0).float_step(0.01))
            .input(InputSpec::boolean("lossless", true))
            .input(InputSpec::int("quality", 80).int_range(0, 100))
            .input(InputSpec::combo("method", ["default", "fastest", "slowest"]))
            .output_node()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("images")?;
        let method = match inputs.string("method")? {
            "default" => 4,
            "fastest" => 0,
            "slowest" => 6,
            other => return Err(NodeError::msg(format!("method `{other}` is not one of default, fastest, slowest"))),
        };
        let fps = inputs.float("fps")?;
        let quality = inputs.int("quality")?;
        if !(0..=100).contains(&quality) {
            return Err(NodeError::msg(format!("quality {quality} is outside 0..=100")));
        }
        let options = WebpOptions { lossless: inputs.boolean("lossless")?, quality: quality as f32, method };
        let rgb = rgb8(img)?;
        let bytes = animated_webp(Rgb8Frames { data: &rgb, width: img.width, height: img.height }, fps, options).map_err(NodeError::msg)?;
        let (dir, sub, stem) = output_target(&self.rt, ctx, inputs.string("filename_prefix")?, false)?;
        let mut counter = next_counter(&dir, &stem);
        let name = write_numbered(&dir, &stem, &mut counter, "webp", &bytes)?;
        Ok(Outputs::none().with_ui(animated_ui(name, &sub, img.n)))
    }
}

/// "SaveVideoSdCpp": the batch's frames as sd-cli writes a video: one `.avi`
/// (Motion-JPEG), `.webp` (animated, lossy) or `.webm` (VP8 keyframes) file at `fps`, all
/// at quality 90; a batch
/// of one frame is a PNG, as sd-cli saves a one-frame video.
struct SaveVideoSdCpp {
    rt: Arc<Runtime>,
}

/// sd-cli's fixed quality for video frames.
const SD_CLI_QUALITY: u8 = 90;

impl Node for SaveVideoSdCpp {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("SaveVideoSdCpp")
            .display_name("Save Video (sd-cli)")
            .category("image/animation")
            .description("Writes the frames as sd-cli writes a video: Motion-JPEG AVI, animated WebP or WebM of VP8 keyframes at quality 90; one frame is saved as a PNG.")
            .input(InputSpec::link("images", IoType::IMAGE))
            .input(InputSpec::string("filename_prefix", "output"))
            .input(InputSpec::combo("format", ["avi", "webp", "webm"]))
            .input(InputSpec::int("fps", 16).int_range(1, 1000).tooltip("Frames per second (sd-cli's --fps)."))
            .output_node()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("images")?;
        let (dir, sub, stem) = output_target(&self.rt, ctx, inputs.string("filename_prefix")?, false)?;
        let mut counter = next_counter(&dir, &stem);
        if img.n == 1 {
            let mut text = ctx.metadata_for(0);
            text.push(("software".into(), "sdflow".into()));
            let name = crate::image::write_png_numbered(&dir, &stem, &mut counter, img, 0, &text)?;
            return Ok(Outputs::none().with_ui(json!({"images": [{"filename": name, "subfolder": sub, "type": "output"}]})));
        }
        let fps = inputs.int("fps")?;
        if !(1..=1000).contains(&fps) {
            return Err(NodeError::msg(format!("fps {fps} is outside 1..=1000")));
        }
        let rgb = rgb8(img)?;
        let frames = Rgb8Frames { data: &rgb, width: img.width, height: img.height };
        let (ext, bytes) = match inputs.string("format")? {
            "avi" => ("avi", mjpg_avi(frames, fps as f64, SD_CLI_QUALITY)),
            "webp" => ("webp", animated_webp(frames, fps as f64, WebpOptions { lossless: false, quality: SD_CLI_QUALITY as f32, method: 4 })),
            "webm" => ("webm", vp8_webm(frames, fps as f64, SD_CLI_QUALITY as f32)),
            other => return Err(NodeError::msg(format!("format `{other}` is not one of avi, webp, webm"))),
        };
        let name = write_numbered(&dir, &stem, &mut counter, ext, &bytes.map_err(NodeError::msg)?)?;
        Ok(Outputs::none().with_ui(animated_ui(name, &sub, img.n)))
    }
}
