//! Video out: ComfyUI's SaveAnimatedWEBP, and the files sd-cli writes for a video `-o`
//! (`.avi` Motion-JPEG by default, `.webp` animated, or numbered frames), over IMAGE
//! batches whose images are a video's frames (what VAEDecode makes of a video latent).
//! The encoders are in [`encode`].

pub mod encode;

use crate::image::{next_counter, output_target, write_numbered};
use crate::runtime::Runtime;
use crate::values::Image;
use encode::{animated_webp, mjpg_avi, vp8_webm, Rgb8Frames, WebpOptions};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry};
use serde_json::json;
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(SaveAnimatedWebp { rt: rt.clone() }));
    registry.register(Arc::new(SaveVideoSdCpp { rt: rt.clone() }));
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
