//! Model and plain image upscaling: UpscaleModelLoader, ImageUpscaleWithModel (ESRGAN /
//! Real-ESRGAN RRDBNet and SRVGGNetCompact, tiled like sd.cpp), ImageScaleBy.

use sdflow_core::placement::Module;
use crate::image::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE};
use crate::image::resize::{resize_plane, Method};
use crate::runtime::Runtime;
use crate::values::{Image, UpscaleModelRef};
use crate::err;
use sdflow_core::io::{self, TypeRules};
use sdflow_core::models::esrgan::{self, Tiling, Upscaler};
use sdflow_core::residency::{Device, WeightKey};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::PathBuf;
use std::sync::Arc;

/// Model folder kind, as ComfyUI's `models/upscale_models`.
const KIND: &str = "upscale_models";
/// sd.cpp's `--upscale-repeats` has no upper bound; each ×4 pass multiplies the pixels by
/// 16, so a handful already meets the image limit.
const MAX_REPEATS: i64 = 8;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(UpscaleModelLoader { rt: rt.clone() }));
    registry.register(Arc::new(ImageUpscaleWithModel { rt: rt.clone() }));
    registry.register(Arc::new(ImageScaleBy));
}

/// ComfyUI's "Load Upscale Model": .pth (through the safe unpickler), .safetensors or
/// .gguf; the weights load on first use.
struct UpscaleModelLoader {
    rt: Arc<Runtime>,
}

impl UpscaleModelLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(KIND, inputs.string("model_name")?).map_err(NodeError::msg)
    }
}

impl Node for UpscaleModelLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("UpscaleModelLoader")
            .display_name("Load Upscale Model")
            .category("loaders")
            .description("Loads an ESRGAN / Real-ESRGAN upscaler (RRDBNet or SRVGGNetCompact) from models/upscale_models.")
            .input(InputSpec::combo("model_name", self.rt.list_models(KIND)))
            .output("UPSCALE_MODEL", IoType::UPSCALE_MODEL)
    }

    /// A changed file on disk must not be served from the cache.
    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        // Fail here, with the file named, rather than at the first upscale: the file must
        // open and hold an upscaler's tensors.
        let src = io::open(&path).map_err(err)?;
        let names = esrgan::canonical_names(src.tensors().iter().map(|t| t.name.as_str())).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        if !names.contains_key("conv_first.weight") && !names.contains_key("body.0.weight") {
            return Err(NodeError::msg(format!("{}: not an ESRGAN / Real-ESRGAN upscaler (no conv_first or body.0 weights)", path.display())));
        }
        drop(src);
        let key = WeightKey::new([&path], "esrgan-upscaler", self.rt.weight_type, Device::Cpu).map_err(err)?;
        let (p, wt) = (path.clone(), self.rt.weight_type);
        let weights = self.rt.weights(Module::Upscaler, key, move |memory| {
            let src = io::open(&p)?;
            Ok(Upscaler::load(memory, src.as_ref(), &TypeRules::new(wt, "")?)?)
        })?;
        let name = inputs.string("model_name")?.to_string();
        Ok(Outputs::new(vec![Value::new(IoType::UPSCALE_MODEL, UpscaleModelRef { weights, name })]))
    }
}

/// ComfyUI's "Upscale Image (using Model)", tiled like sd.cpp (`tile_size` is
/// `--upscale-tile-size`, `repeats` is `--upscale-repeats`). Outputs are clamped to 0..1.
struct ImageUpscaleWithModel {
    rt: Arc<Runtime>,
}

impl Node for ImageUpscaleWithModel {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ImageUpscaleWithModel")
            .display_name("Upscale Image (using Model)")
            .category("image/upscaling")
            .input(InputSpec::link("upscale_model", IoType::UPSCALE_MODEL))
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(
                InputSpec::int("tile_size", Tiling::default().tile as i64)
                    .int_range(8, MAX_IMAGE_SIDE as i128)
                    .optional()
                    .tooltip("Tile side in input pixels (sd.cpp's --upscale-tile-size); tiles overlap by a quarter."),
            )
            .input(
                InputSpec::int("repeats", 1)
                    .int_range(1, MAX_REPEATS as i128)
                    .optional()
                    .tooltip("How many times to run the upscaler (sd.cpp's --upscale-repeats)."),
            )
            .output("IMAGE", IoType::IMAGE)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<UpscaleModelRef>("upscale_model")?;
        let img = inputs.downcast::<Image>("image")?;
        let tile = if inputs.contains("tile_size") { inputs.int("tile_size")? } else { Tiling::default().tile as i64 };
        let repeats = if inputs.contains("repeats") { inputs.int("repeats")? } else { 1 };
        if !(8..=MAX_IMAGE_SIDE as i64).contains(&tile) {
            return Err(NodeError::msg(format!("tile_size {tile} is outside 8..={MAX_IMAGE_SIDE}")));
        }
        if !(1..=MAX_REPEATS).contains(&repeats) {
            return Err(NodeError::msg(format!("repeats {repeats} is outside 1..={MAX_REPEATS}")));
        }
        let tiling = Tiling { tile: tile as usize };
        let up = self.rt.pin(Module::Upscaler, &model.weights)?;
        let (cin, cout, s) = (up.arch.in_channels() as usize, up.arch.out_channels() as usize, up.scale() as usize);
        if img.channels != cin {
            return Err(NodeError::msg(format!("{} takes {cin}-channel images, this one has {}", model.name, img.channels)));
        }
        // Every pass must fit the image limit: check the final size before computing.
        let (mut fw, mut fh) = (img.width as u64, img.height as u64);
        for _ in 0..repeats {
            fw *= s as u64;
            fh *= s as u64;
            if fw * fh > MAX_IMAGE_PIXELS || fw > MAX_IMAGE_SIDE as u64 || fh > MAX_IMAGE_SIDE as u64 {
                return Err(NodeError::msg(format!(
                    "upscaling {}x{} by {s} {repeats} time(s) exceeds the image limit ({MAX_IMAGE_SIDE} per side, {MAX_IMAGE_PIXELS} pixels)",
                    img.width, img.height
                )));
            }
        }
        if cout != cin && repeats > 1 {
            return Err(NodeError::msg(format!("{} maps {cin} to {cout} channels and cannot be repeated", model.name)));
        }
        let mut data = Vec::with_capacity(img.n * fw as usize * fh as usize * cout);
        let steps = (img.n as u64) * repeats as u64;
        let mut step = 0u64;
        for i in 0..img.n {
            let (mut w, mut h) = (img.width, img.height);
            let per = w * h * cin;
            let hwc = &img.data[i * per..(i + 1) * per];
            let mut chw = vec![0f32; per];
            for (p, px) in hwc.chunks_exact(cin).enumerate() {
                for c in 0..cin {
                    chw[c * w * h + p] = px[c];
                }
            }
            for _ in 0..repeats {
                let (out, ow, oh) = self
                    .rt
                    .with_backend(Module::Upscaler, |b| esrgan::upscale_planar::<TileError>(&up, b, &chw, w, h, tiling, |_, _| ctx.check_cancelled().map_err(TileError::Node)))
                    .map_err(|e| match e {
                        TileError::Model(e) => NodeError::msg(format!("{}: {e}", model.name)),
                        TileError::Node(e) => e,
                    })?;
                // Between passes too, values stay in the image range as in sd.cpp.
                chw = out.into_iter().map(|v| v.clamp(0.0, 1.0)).collect();
                (w, h) = (ow, oh);
                step += 1;
                ctx.progress(step, steps);
            }
            for p in 0..w * h {
                for c in 0..cout {
                    data.push(chw[c * w * h + p]);
                }
            }
        }
        let out = Image { data, n: img.n, height: fh as usize, width: fw as usize, channels: cout };
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, out)]))
    }
}

/// The tiler's error: the model's, or the node's own (cancellation) from the progress hook.
enum TileError {
    Model(sdflow_core::models::ModelError),
    Node(NodeError),
}

impl From<sdflow_core::models::ModelError> for TileError {
    fn from(e: sdflow_core::models::ModelError) -> Self {
        TileError::Model(e)
    }
}

/// ComfyUI's "Upscale Image By": resample by a factor (sizes rounded as ComfyUI does).
struct ImageScaleBy;

impl Node for ImageScaleBy {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ImageScaleBy")
            .display_name("Upscale Image By")
            .category("image/upscaling")
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::combo("upscale_method", Method::IMAGE_NAMES))
            .input(InputSpec::float("scale_by", 1.0).float_range(0.01, 8.0).float_step(0.01))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let name = inputs.string("upscale_method")?;
        let method = Method::parse(name).ok_or_else(|| NodeError::msg(format!("unknown upscale_method `{name}` (one of {:?})", Method::IMAGE_NAMES)))?;
        let by = inputs.float("scale_by")?;
        if !(by.is_finite() && by > 0.0) {
            return Err(NodeError::msg(format!("scale_by {by} must be a positive number")));
        }
        let ow = ((img.width as f64 * by).round() as usize).max(1);
        let oh = ((img.height as f64 * by).round() as usize).max(1);
        if (ow as u64) * (oh as u64) > MAX_IMAGE_PIXELS || ow > MAX_IMAGE_SIDE as usize || oh > MAX_IMAGE_SIDE as usize {
            return Err(NodeError::msg(format!("{ow}x{oh} is larger than the image limit")));
        }
        let (w, h, c) = (img.width, img.height, img.channels);
        let mut data = vec![0f32; img.n * ow * oh * c];
        for i in 0..img.n {
            for k in 0..c {
                let plane: Vec<f32> = (0..w * h).map(|p| img.data[(i * w * h + p) * c + k]).collect();
                for (p, v) in resize_plane(&plane, w, h, ow, oh, method).into_iter().enumerate() {
                    data[(i * ow * oh + p) * c + k] = v;
                }
            }
        }
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, Image { data, n: img.n, height: oh, width: ow, channels: c })]))
    }
}
