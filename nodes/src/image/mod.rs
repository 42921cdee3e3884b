//! Image and latent nodes: loading, saving, VAE encode/decode, scaling here; latents
//! ([`latent`]), masks ([`mask`]), the resampling kernels ([`resize`]) and model upscalers
//! ([`upscale`]) and A1111's img2img preparation ([`a1111`]) beside them; latent arithmetic and batching ([`latent_ops`]); pixel filters,
//! blending and compositing ([`postprocess`]).

pub mod a1111;
pub mod latent;
pub mod latent_ops;
pub mod mask;
pub mod postprocess;
pub mod resize;
pub mod seamless;
pub mod transform;
pub mod upscale;

use sdflow_core::placement::Module;
use crate::runtime::Runtime;
use crate::image::resize::{center_crop, resize_plane, Method};
use crate::values::{Image, Latent, Mask, VaeKind, VaeRef};
use crate::err;
use sdflow_core::models::flux2::latent as flux2_latent;
use sdflow_core::models::vae::tiling::VaeTiling;
use sdflow_core::models::dit::{channel_major, frame_of};
use sdflow_core::models::vae::wan::{Frames, WanVae, WanVaeConfig};
use sdflow_core::models::vae::{Vae, VaeConfig, VaeGraph, VaeOp};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    for tiled in [false, true] {
        registry.register(Arc::new(VaeDecode { rt: rt.clone(), tiled }));
        registry.register(Arc::new(VaeEncode { rt: rt.clone(), tiled }));
    }
    registry.register(Arc::new(SaveImage { rt: rt.clone(), preview: false }));
    registry.register(Arc::new(SaveImage { rt: rt.clone(), preview: true }));
    registry.register(Arc::new(LoadImage { rt: rt.clone() }));
    registry.register(Arc::new(LoadImageMask { rt: rt.clone() }));
    registry.register(Arc::new(VaeEncodeForInpaint { rt: rt.clone() }));
    registry.register(Arc::new(ImageScale));
    registry.register(Arc::new(ImageCrop));
    registry.register(Arc::new(ImageInvert));
    registry.register(Arc::new(EmptyImage));
    seamless::register(registry, rt);
}

/// The model a VAE handle holds, by its kind.
enum AnyVae<'w> {
    Kl(Vae<'w>),
    /// FLUX.2's 32-channel KL VAE, whose LATENT is the model's: 2×2 patches, normalised
    /// ([`sdflow_core::models::flux2::latent`]).
    Flux2(Vae<'w>),
    Taesd(crate::loaders::taesd::TaesdVae<'w>),
    Wan(WanVae<'w>),
}

impl AnyVae<'_> {
    fn downscale(&self) -> i64 {
        match self {
            AnyVae::Kl(m) => m.config.downscale(),
            AnyVae::Flux2(m) => 2 * m.config.downscale(),
            AnyVae::Taesd(m) => m.downscale(),
            AnyVae::Wan(m) => m.config.downscale(),
        }
    }

    /// Channels of the images it reads and writes (3; Qwen-Image-Layered's VAE: RGBA).
    fn image_channels(&self) -> usize {
        match self {
            AnyVae::Kl(m) | AnyVae::Flux2(m) => m.config.image_channels as usize,
            AnyVae::Taesd(_) => 3,
            AnyVae::Wan(m) => m.config.image_channels as usize,
        }
    }

    fn z_channels(&self) -> i64 {
        match self {
            AnyVae::Kl(m) => m.config.z_channels,
            AnyVae::Flux2(_) => flux2_latent::CHANNELS as i64,
            AnyVae::Taesd(m) => m.z_channels(),
            AnyVae::Wan(m) => m.config.z_channels,
        }
    }
}

fn with_vae<T>(rt: &Runtime, vae: &VaeRef, f: impl FnOnce(&AnyVae<'_>) -> Result<T, NodeError>) -> Result<T, NodeError> {
    let weights = rt.pin(Module::Vae, &vae.weights)?;
    match vae.kind {
        VaeKind::Kl => {
            let config = VaeConfig::infer(&weights, &vae.prefix).map_err(err)?;
            let flux2 = config.z_channels == flux2_latent::VAE_CHANNELS as i64;
            let mut model = Vae::new(&weights, &vae.prefix, config).map_err(err)?;
            model.circular = vae.circular;
            f(&if flux2 { AnyVae::Flux2(model) } else { AnyVae::Kl(model) })
        }
        VaeKind::Wan => {
            let config = WanVaeConfig::infer(&weights, &vae.prefix).map_err(err)?;
            let mut model = WanVae::new(&weights, &vae.prefix, config).map_err(err)?;
            model.circular = vae.circular;
            f(&AnyVae::Wan(model))
        }
        VaeKind::Taesd(kind) => {
            let mut model = crate::loaders::taesd::TaesdVae::new(&weights, kind)?;
            model.circular = vae.circular;
            f(&AnyVae::Taesd(model))
        }
    }
}

/// One sample through the VAE on the compute backend, whole or in tiles as `tiling` says
/// (TAESD, a few convolutions, always runs whole).
fn run_vae(rt: &Runtime, model: &AnyVae<'_>, op: VaeOp, input: &[f32], w: usize, h: usize, tiling: &VaeTiling) -> Result<Vec<f32>, NodeError> {
    match model {
        AnyVae::Kl(m) => run_kl(rt, m, op, input, w, h, tiling),
        AnyVae::Wan(m) => run_kl(rt, m, op, input, w, h, tiling),
        AnyVae::Taesd(m) => m.run(rt, op, input, w, h),
        // The KL VAE runs on its own 32-channel latent at twice the model latent's size.
        AnyVae::Flux2(m) => match op {
            VaeOp::Decode => run_kl(rt, m, op, &flux2_latent::from_model(input, h, w).map_err(err)?, 2 * w, 2 * h, tiling),
            VaeOp::EncodeMean => {
                let z = run_kl(rt, m, op, input, w, h, tiling)?;
                let f = 2 * m.config.downscale() as usize;
                flux2_latent::to_model(&z, h / f, w / f).map_err(err)
            }
        },
    }
}

/// A KL-style VAE (LDM's, Wan's) through the tiled runner.
fn run_kl(rt: &Runtime, model: &impl VaeGraph, op: VaeOp, input: &[f32], w: usize, h: usize, tiling: &VaeTiling) -> Result<Vec<f32>, NodeError> {
    let (out, info) = rt
        .with_backend(Module::Vae, |b| {
            let limited = VaeTiling { max_compute_bytes: tiling.max_compute_bytes.or_else(|| compute_limit(b)), ..tiling.clone() };
            sdflow_core::models::vae::run(model, b, op, input, w, h, &limited)
        })
        .map_err(err)?;
    if let (Some(reason), Some(tiles)) = (&info.fallback, &info.tiles) {
        eprintln!("VAE: {reason}; retried in {tiles}");
    }
    Ok(out)
}

/// Latents → images, one sample at a time to bound memory.
pub(crate) fn decode_latent(rt: &Runtime, ctx: &ExecContext<'_>, latent: &Latent, vae: &VaeRef, tiling: &VaeTiling) -> Result<Image, NodeError> {
    let [w, h, c, n] = latent.shape;
    let per = (w * h * c) as usize;
    if latent.frames > 1 {
        return with_vae(rt, vae, |model| match model {
            AnyVae::Wan(m) => decode_video(rt, ctx, latent, m, tiling),
            _ => Err(NodeError::msg(format!(
                "a latent of {} frames ({} channels each) decodes as a video with a Wan VAE; LatentCutToBatch (dim t) makes its frames a batch of images for this one",
                latent.frames,
                latent.channels()
            ))),
        });
    }
    with_vae(rt, vae, |model| {
        let f = model.downscale();
        let (iw, ih) = ((w * f) as usize, (h * f) as usize);
        let ic = model.image_channels();
        let mut data = Vec::with_capacity(n as usize * iw * ih * ic);
        for i in 0..n as usize {
            ctx.check_cancelled()?;
            let chw = run_vae(rt, model, VaeOp::Decode, &latent.samples[i * per..(i + 1) * per], w as usize, h as usize, tiling)?;
            // CHW in [-1, 1] → HWC in [0, 1].
            for y in 0..ih {
                for x in 0..iw {
                    for ch in 0..ic {
                        data.push(((chw[(ch * ih + y) * iw + x] + 1.0) * 0.5).clamp(0.0, 1.0));
                    }
                }
            }
            ctx.progress(i as u64 + 1, n as u64);
        }
        Ok(Image { data, n: n as usize, height: ih, width: iw, channels: ic })
    })
}

/// A video latent (frames inside its channels, ComfyUI's [B, C, T, H, W]) through the Wan
/// VAE one latent frame at a time: each sample's 4·(T − 1) + 1 frames, the samples' frames
/// one batch of images after another (ComfyUI's video decode); in spatial tiles when
/// `tiling` is on (VAEDecodeTiled, `--vae-tiling`), each tile a whole video, or when a
/// whole frame's decode would not fit the memory at hand.
fn decode_video(rt: &Runtime, ctx: &ExecContext<'_>, latent: &Latent, model: &WanVae<'_>, tiling: &VaeTiling) -> Result<Image, NodeError> {
    let [w, h, c, n] = latent.shape.map(|d| d as usize);
    let (t, z) = (latent.frames, latent.channels() as usize);
    let plane = w * h;
    let mut images = Image { data: Vec::new(), n: 0, height: 0, width: 0, channels: model.config.image_channels as usize };
    for i in 0..n {
        let sample = &latent.samples[i * c * plane..(i + 1) * c * plane];
        let data: Vec<f32> = (0..t).flat_map(|f| frame_of(sample, z, t, plane, f)).collect();
        let frames = Frames { data, ne: [w as i64, h as i64, z as i64, t as i64] };
        let out = rt
            .with_backend(Module::Vae, |b| {
                let mut progress = |k: usize, total: usize| ctx.progress((i * total + k) as u64, (n * total) as u64);
                if tiling.enabled {
                    return model.decode_video_tiled(b, &frames, tiling, &mut progress);
                }
                match tiling.max_compute_bytes.or_else(|| compute_limit(b)) {
                    Some(limit) => model.decode_video_within(b, &frames, limit, &mut progress).map(noted),
                    None => model.decode_video(b, &frames, &mut progress),
                }
            })
            .map_err(err)?;
        ctx.check_cancelled()?;
        let [iw, ih, ic, f] = out.ne.map(|d| d as usize);
        (images.width, images.height) = (iw, ih);
        images.n += f;
        // Per frame CHW in [-1, 1] → HWC in [0, 1].
        for fr in out.data.chunks_exact(ic * ih * iw) {
            for y in 0..ih {
                for x in 0..iw {
                    images.data.extend((0..ic).map(|ch| ((fr[(ch * ih + y) * iw + x] + 1.0) * 0.5).clamp(0.0, 1.0)));
                }
            }
        }
    }
    Ok(images)
}

/// The compute memory a VAE graph may take before the image or video goes in spatial
/// tiles: most of what the device has free (a video stream also keeps host copies of its
/// causal caches and the frames). On the CPU a larger buffer would be granted and the
/// process killed when it is touched, so the allocation failure the tiled retry waits
/// for never comes.
fn compute_limit(b: &sdflow_core::ggml::Backend) -> Option<usize> {
    b.free_memory().map(|f| (f as f64 * 0.6) as usize)
}

/// A video the Wan VAE ran within a limit, saying when it had to go in tiles.
fn noted((video, tiled): (Frames, Option<String>)) -> Frames {
    if let Some(how) = tiled {
        eprintln!("VAE: {how}");
    }
    video
}

/// The frames of `video` (an IMAGE batch, one video) encoded by a Wan VAE: the latent
/// distribution's mean as [C][T][H][W] planes and its latent frame count T (the first
/// frame alone, then 4 at a time; frames past the last whole group are dropped, as the
/// reference drops them).
pub(crate) fn encode_video(rt: &Runtime, ctx: &ExecContext<'_>, vae: &VaeRef, video: &Image) -> Result<(Vec<f32>, usize), NodeError> {
    with_vae(rt, vae, |model| {
        let AnyVae::Wan(m) = model else { return Err(NodeError::msg("encoding a video needs a Wan VAE (wan_2.1_vae.safetensors)")) };
        let (w, h, c) = (video.width, video.height, video.channels);
        if c < 3 || video.n == 0 {
            return Err(NodeError::msg(format!("{} frames of {c} channels: a video to encode needs RGB frames", video.n)));
        }
        // Per frame: HWC in [0, 1] → CHW in [-1, 1].
        let ic = m.config.image_channels as usize;
        let mut data = Vec::with_capacity(video.n * ic * w * h);
        for f in 0..video.n {
            for ch in 0..ic {
                data.extend((0..w * h).map(|p| if ch < c { video.data[(f * w * h + p) * c + ch] * 2.0 - 1.0 } else { 1.0 }));
            }
        }
        let frames = Frames { data, ne: [w as i64, h as i64, ic as i64, video.n as i64] };
        let out = rt
            .with_backend(Module::Vae, |b| {
                let mut progress = |k: usize, n: usize| ctx.progress(k as u64, n as u64);
                match compute_limit(b) {
                    Some(limit) => m.encode_video_within(b, &frames, limit, &mut progress).map(noted),
                    None => m.encode_video(b, &frames, &mut progress),
                }
            })
            .map_err(err)?;
        let [lw, lh, z, t] = out.ne.map(|d| d as usize);
        Ok((channel_major(&out.data, z, t, lw * lh), t))
    })
}

/// ComfyUI's "VAE Decode" (and, with `tiled`, "VAE Decode (Tiled)"). Untiled decodes
/// follow the runtime's tiling settings, including the retry in tiles when the whole
/// image does not fit.
struct VaeDecode {
    rt: Arc<Runtime>,
    tiled: bool,
}

/// ComfyUI's tile inputs (pixels) as sd.cpp's tiling: the latent tile is `tile_size/f`
/// (by `tile_height/f` when that is set: sd-cli's non-square `--vae-tile-size`), the
/// overlap fraction `overlap/tile_size`, with ComfyUI's cap of a quarter tile on a decode;
/// `relative_tile_size` is sd-cli's `--vae-relative-tile-size`.
fn node_tiling(inputs: &Inputs, f: usize, decode: bool) -> Result<VaeTiling, NodeError> {
    let px = |name: &str| usize::try_from(inputs.int(name)?).map_err(|_| NodeError::msg(format!("{name} must be >= 0")));
    let tile = px("tile_size")?;
    let height = if inputs.contains("tile_height") { px("tile_height")? } else { 0 };
    let height = if height == 0 { tile } else { height };
    let mut overlap = px("overlap")?;
    if decode && tile.min(height) < overlap * 4 {
        overlap = tile.min(height) / 4;
    }
    let rel_size = match inputs.contains("relative_tile_size").then(|| inputs.string("relative_tile_size")).transpose()? {
        Some(text) if !text.trim().is_empty() => VaeTiling::parse_rel_size(text).map_err(|e| NodeError::msg(format!("relative_tile_size: {e}")))?,
        _ => (0.0, 0.0),
    };
    let (lt, lh) = ((tile / f).max(1), (height / f).max(1));
    Ok(VaeTiling { enabled: true, tile_size: (lt, lh), rel_size, target_overlap: ((overlap / f) as f32 / lt as f32).min(0.5), ..VaeTiling::default() })
}

/// sd-cli's tile options beyond ComfyUI's square tile: optional, so ComfyUI's workflows
/// load unchanged.
fn sd_cli_tile_inputs(s: NodeSchema, step: i128) -> NodeSchema {
    s.input(InputSpec::int("tile_height", 0).int_range(0, 4096).int_step(step).optional().tooltip("Tile height in pixels when it differs from tile_size (sd-cli's --vae-tile-size WxH); 0: square tiles."))
        .input(InputSpec::string("relative_tile_size", "").optional().tooltip("sd-cli's --vae-relative-tile-size, [X]x[Y]: per axis a fraction of the latent side (<= 1) or a number of tiles (> 1); empty: tile_size decides."))
}

/// ComfyUI's video-only inputs of the tiled VAE nodes: accepted so its workflows load,
/// unused by image VAEs (as in ComfyUI).
fn temporal_inputs(s: NodeSchema) -> NodeSchema {
    s.input(InputSpec::int("temporal_size", 64).int_range(8, 4096).int_step(4).tooltip("Only used for video VAEs: frames to decode at a time."))
        .input(InputSpec::int("temporal_overlap", 8).int_range(4, 4096).int_step(4).tooltip("Only used for video VAEs: frames to overlap."))
}

/// The downscale factor of a VAE handle, without building the model twice.
fn vae_factor(rt: &Runtime, vae: &VaeRef) -> Result<usize, NodeError> {
    with_vae(rt, vae, |m| Ok(m.downscale() as usize))
}

impl Node for VaeDecode {
    fn schema(&self) -> NodeSchema {
        let s = if self.tiled { NodeSchema::new("VAEDecodeTiled").display_name("VAE Decode (Tiled)").category("_for_testing") } else { NodeSchema::new("VAEDecode").display_name("VAE Decode").category("latent") };
        let s = s.input(InputSpec::link("samples", IoType::LATENT)).input(InputSpec::link("vae", IoType::VAE));
        let s = if self.tiled {
            sd_cli_tile_inputs(
                temporal_inputs(
                    s.input(InputSpec::int("tile_size", 512).int_range(64, 4096).int_step(32).tooltip("Tile side in pixels."))
                        .input(InputSpec::int("overlap", 64).int_range(0, 4096).int_step(32).tooltip("Overlap between tiles in pixels.")),
                ),
                32,
            )
        } else {
            s
        };
        s.output("IMAGE", IoType::IMAGE)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let latent = inputs.downcast::<Latent>("samples")?;
        let vae = inputs.downcast::<VaeRef>("vae")?;
        let tiling = if self.tiled { node_tiling(inputs, vae_factor(&self.rt, vae)?, true)? } else { self.rt.vae_tiling.clone() };
        let image = decode_latent(&self.rt, ctx, latent, vae, &tiling)?;
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, image)]))
    }
}

/// ComfyUI's "VAE Encode" (and, with `tiled`, "VAE Encode (Tiled)"): the latent
/// distribution's mean, images cropped to a multiple of the VAE's downscale factor as
/// ComfyUI does.
struct VaeEncode {
    rt: Arc<Runtime>,
    tiled: bool,
}

impl Node for VaeEncode {
    fn schema(&self) -> NodeSchema {
        let s = if self.tiled { NodeSchema::new("VAEEncodeTiled").display_name("VAE Encode (Tiled)").category("_for_testing") } else { NodeSchema::new("VAEEncode").display_name("VAE Encode").category("latent") };
        let s = s.input(InputSpec::link("pixels", IoType::IMAGE)).input(InputSpec::link("vae", IoType::VAE));
        let s = if self.tiled {
            sd_cli_tile_inputs(
                temporal_inputs(
                    s.input(InputSpec::int("tile_size", 512).int_range(64, 4096).int_step(64).tooltip("Tile side in pixels."))
                        .input(InputSpec::int("overlap", 64).int_range(0, 4096).int_step(32).tooltip("Overlap between tiles in pixels.")),
                ),
                64,
            )
        } else {
            s
        };
        s.output("LATENT", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("pixels")?;
        let vae = inputs.downcast::<VaeRef>("vae")?;
        let tiling = if self.tiled { node_tiling(inputs, vae_factor(&self.rt, vae)?, false)? } else { self.rt.vae_tiling.clone() };
        let latent = encode_image(&self.rt, ctx, vae, img, &tiling)?;
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// Encode `img` to latent means, cropped (centred) to a multiple of the VAE's factor.
/// An RGBA VAE reads RGB images as opaque (sd.cpp's `ensure_image_tensor_channels`), an
/// RGB one drops an image's alpha.
pub(crate) fn encode_image(rt: &Runtime, ctx: &ExecContext<'_>, vae: &VaeRef, img: &Image, tiling: &VaeTiling) -> Result<Latent, NodeError> {
    with_vae(rt, vae, |model| {
        let f = model.downscale() as usize;
        let (w, h) = (img.width / f * f, img.height / f * f);
        if w == 0 || h == 0 || img.channels < 3 {
            return Err(NodeError::msg(format!("a {}x{}x{} image is too small to encode", img.width, img.height, img.channels)));
        }
        let (x0, y0) = ((img.width - w) / 2, (img.height - h) / 2);
        let mut samples = Vec::new();
        let z = model.z_channels();
        let ic = model.image_channels();
        for i in 0..img.n {
            ctx.check_cancelled()?;
            let mut chw = vec![0f32; ic * w * h];
            for y in 0..h {
                for x in 0..w {
                    for ch in 0..ic {
                        let v = if ch < img.channels { img.data[((i * img.height + y + y0) * img.width + x + x0) * img.channels + ch] } else { 1.0 };
                        chw[(ch * h + y) * w + x] = v * 2.0 - 1.0;
                    }
                }
            }
            samples.extend(run_vae(rt, model, VaeOp::EncodeMean, &chw, w, h, tiling)?);
        }
        Ok(Latent::new(samples, [(w / f) as i64, (h / f) as i64, z, img.n as i64]))
    })
}

/// ComfyUI's "Save Image" (to the output folder) and "Preview Image" (to its `temp`
/// subfolder): 8-bit PNGs named `{prefix}_{counter:05}_.png`.
struct SaveImage {
    rt: Arc<Runtime>,
    preview: bool,
}

/// Next free `{prefix}_{NNNNN}_.png` counter in `dir`.
pub(crate) fn next_counter(dir: &Path, prefix: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 1 };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(prefix)?.strip_prefix('_')?;
            rest.split('_').next()?.parse::<u64>().ok()
        })
        .max()
        .map_or(1, |m| m + 1)
}

/// Write one image as PNG, atomically: a temporary file renamed into place.
pub fn write_png(path: &Path, img: &Image, index: usize, text: &[(String, String)]) -> Result<(), NodeError> {
    let io = |e: std::io::Error| NodeError::msg(format!("{}: {e}", path.display()));
    let tmp = encode_png_file(path, img, index, text)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

/// Write one image as `{stem}_{counter:05}_.png` in `dir` without ever replacing a file:
/// when the name is taken (another process saving into the same folder, as scale-out
/// workers sharing an output folder do) the counter moves on. Returns the name used.
pub fn write_png_numbered(dir: &Path, stem: &str, counter: &mut u64, img: &Image, index: usize, text: &[(String, String)]) -> Result<String, NodeError> {
    let first = dir.join(format!("{stem}_{:05}_.png", *counter));
    let tmp = encode_png_file(&first, img, index, text)?;
    place_numbered(dir, stem, counter, "png", tmp)
}

/// Write `bytes` as `{stem}_{counter:05}_.{ext}` in `dir` as [`write_png_numbered`] writes
/// images (synced, never replacing a file). Returns the name used.
pub fn write_numbered(dir: &Path, stem: &str, counter: &mut u64, ext: &str, bytes: &[u8]) -> Result<String, NodeError> {
    let tmp = temp_beside(&dir.join(format!("{stem}_{:05}_.{ext}", *counter)));
    let io = |e: std::io::Error| NodeError::msg(format!("{}: {e}", tmp.display()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })?;
    place_numbered(dir, stem, counter, ext, tmp)
}

/// A temporary name next to `path` that no other writer (thread or process) uses.
fn temp_beside(path: &Path) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
}

/// A written temporary file given the first free `{stem}_{counter:05}_.{ext}` in `dir`.
fn place_numbered(dir: &Path, stem: &str, counter: &mut u64, ext: &str, tmp: PathBuf) -> Result<String, NodeError> {
    let result = loop {
        let name = format!("{stem}_{:05}_.{ext}", *counter);
        let path = dir.join(&name);
        // A hard link fails if the name exists, which a rename would overwrite.
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => break Ok(name),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => *counter += 1,
            // Filesystems without hard links: the scan-then-rename of a single process.
            Err(_) if !path.exists() => break std::fs::rename(&tmp, &path).map(|_| name).map_err(|e| NodeError::msg(format!("{}: {e}", path.display()))),
            Err(_) => *counter += 1,
        }
    };
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Encodes one image of a batch as PNG into a temporary file next to `path` (a name of
/// its own, so concurrent writers never share one), synced; returns its path.
fn encode_png_file(path: &Path, img: &Image, index: usize, text: &[(String, String)]) -> Result<PathBuf, NodeError> {
    let io = |e: std::io::Error| NodeError::msg(format!("{}: {e}", path.display()));
    let per = img.height * img.width * img.channels;
    let bytes: Vec<u8> = img.data[index * per..(index + 1) * per].iter().map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8).collect();
    let color = match img.channels {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        4 => png::ColorType::Rgba,
        c => return Err(NodeError::msg(format!("cannot save a {c}-channel image as PNG"))),
    };
    let tmp = temp_beside(path);
    let written = (|| {
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut enc = png::Encoder::new(std::io::BufWriter::new(file), img.width as u32, img.height as u32);
        enc.set_color(color);
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in text {
            // tEXt where Latin-1 holds the text (what A1111 and ComfyUI read first), iTXt
            // (UTF-8) otherwise — PIL's choice too.
            let res = if v.chars().all(|c| (c as u32) < 256) { enc.add_text_chunk(k.to_string(), v.to_string()) } else { enc.add_itxt_chunk(k.to_string(), v.to_string()) };
            res.map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        }
        let mut w = enc.write_header().map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        w.write_image_data(&bytes).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        w.finish().map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)
    })();
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

impl Node for SaveImage {
    fn schema(&self) -> NodeSchema {
        let s = if self.preview {
            NodeSchema::new("PreviewImage").display_name("Preview Image")
        } else {
            NodeSchema::new("SaveImage").display_name("Save Image").input(InputSpec::string("filename_prefix", "ComfyUI"))
        };
        s.category("image").input(InputSpec::link("images", IoType::IMAGE)).output_node()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("images")?;
        let prefix = if self.preview { "ComfyUI_temp".to_string() } else { inputs.string("filename_prefix")?.to_string() };
        let (dir, sub, stem) = output_target(&self.rt, ctx, &prefix, self.preview)?;
        let mut counter = next_counter(&dir, &stem);
        let mut files = Vec::new();
        for i in 0..img.n {
            let mut text = ctx.metadata_for(i);
            text.push(("software".into(), "sdflow".into()));
            let name = write_png_numbered(&dir, &stem, &mut counter, img, i, &text)?;
            files.push(json!({"filename": name, "subfolder": sub, "type": if self.preview { "temp" } else { "output" }}));
            counter += 1;
        }
        std::io::stdout().flush().ok();
        Ok(Outputs::none().with_ui(json!({"images": files})))
    }
}

/// Where a save node with `prefix` writes: the folder (created), the subfolder the prefix
/// names ("portraits/cat" → "portraits") and the file stem; previews go to `temp/`.
pub(crate) fn output_target(rt: &Runtime, ctx: &ExecContext<'_>, prefix: &str, preview: bool) -> Result<(PathBuf, String, String), NodeError> {
    if prefix.is_empty() || prefix.contains("..") || Path::new(prefix).is_absolute() {
        return Err(NodeError::msg(format!("filename_prefix `{prefix}` must be a relative name")));
    }
    let base: PathBuf = ctx.output_dir().map_or_else(|| rt.output_dir.clone(), Path::to_path_buf);
    let dir = if preview { base.join("temp") } else { base };
    let (sub, stem) = match prefix.rsplit_once('/') {
        Some((s, p)) => (s.to_string(), p.to_string()),
        None => (String::new(), prefix.to_string()),
    };
    let dir = dir.join(&sub);
    std::fs::create_dir_all(&dir).map_err(|e| NodeError::msg(format!("{}: {e}", dir.display())))?;
    Ok((dir, sub, stem))
}

/// The largest image LoadImage decodes, per side and in total pixels; beyond that a
/// clear error beats exhausting memory.
pub const MAX_IMAGE_SIDE: u32 = 16384;
pub const MAX_IMAGE_PIXELS: u64 = 64 << 20;

/// Decode an image file into IMAGE (RGB, 0..1) and MASK (1 − alpha, as ComfyUI).
pub fn decode_image(path: &Path) -> Result<(Image, Vec<f32>), NodeError> {
    let shown = path.display();
    let mut reader = image::ImageReader::open(path).map_err(|e| NodeError::msg(format!("{shown}: {e}")))?.with_guessed_format().map_err(|e| NodeError::msg(format!("{shown}: {e}")))?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    limits.max_alloc = Some(MAX_IMAGE_PIXELS * 16);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| NodeError::msg(format!("{shown}: {e}")))?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    if (w as u64) * (h as u64) > MAX_IMAGE_PIXELS {
        return Err(NodeError::msg(format!("{shown}: {w}x{h} is larger than {MAX_IMAGE_PIXELS} pixels")));
    }
    let has_alpha = img.color().has_alpha();
    let rgba = img.to_rgba32f();
    let mut data = Vec::with_capacity(w * h * 3);
    let mut mask = Vec::with_capacity(w * h);
    for p in rgba.pixels() {
        data.extend_from_slice(&p.0[..3]);
        mask.push(if has_alpha { 1.0 - p.0[3] } else { 0.0 });
    }
    Ok((Image { data, n: 1, height: h, width: w, channels: 3 }, mask))
}

/// ComfyUI's "Load Image": a file from the input folder, with its alpha as a mask.
struct LoadImage {
    rt: Arc<Runtime>,
}

impl Node for LoadImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("LoadImage")
            .display_name("Load Image")
            .category("image")
            .input(InputSpec::combo("image", self.rt.list_inputs()).extra("image_upload", json!(true)))
            .output("IMAGE", IoType::IMAGE)
            .output("MASK", IoType::MASK)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        self.rt.input_fingerprint(inputs.string("image")?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.rt.resolve_input(inputs.string("image")?).map_err(NodeError::msg)?;
        let (img, mask) = decode_image(&path)?;
        let (h, w) = (img.height, img.width);
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, img), Value::new(IoType::MASK, crate::values::Mask { data: mask, n: 1, height: h, width: w })]))
    }
}

/// ComfyUI's "Load Image (as Mask)": one channel of an input image; alpha is inverted
/// (transparent = masked), as ComfyUI does.
struct LoadImageMask {
    rt: Arc<Runtime>,
}

impl Node for LoadImageMask {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("LoadImageMask")
            .display_name("Load Image (as Mask)")
            .category("mask")
            .input(InputSpec::combo("image", self.rt.list_inputs()).extra("image_upload", json!(true)))
            .input(InputSpec::combo("channel", ["alpha", "red", "green", "blue"]))
            .output("MASK", IoType::MASK)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        self.rt.input_fingerprint(inputs.string("image")?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.rt.resolve_input(inputs.string("image")?).map_err(NodeError::msg)?;
        let (img, alpha_mask) = decode_image(&path)?;
        let data = match inputs.string("channel")? {
            "alpha" => alpha_mask,
            c => {
                let k = match c {
                    "red" => 0,
                    "green" => 1,
                    "blue" => 2,
                    other => return Err(NodeError::msg(format!("unknown channel `{other}`"))),
                };
                img.data.chunks(3).map(|p| p[k]).collect()
            }
        };
        Ok(Outputs::new(vec![Value::new(IoType::MASK, Mask { data, n: 1, height: img.height, width: img.width })]))
    }
}

/// ComfyUI's "VAE Encode (for Inpainting)": masked pixels are set to grey before
/// encoding, and the mask, grown by `grow_mask_by` pixels, becomes the noise mask.
struct VaeEncodeForInpaint {
    rt: Arc<Runtime>,
}

impl Node for VaeEncodeForInpaint {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("VAEEncodeForInpaint")
            .display_name("VAE Encode (for Inpainting)")
            .category("latent/inpaint")
            .input(InputSpec::link("pixels", IoType::IMAGE))
            .input(InputSpec::link("vae", IoType::VAE))
            .input(InputSpec::link("mask", IoType::MASK))
            .input(InputSpec::int("grow_mask_by", 6).int_range(0, 64))
            .output("LATENT", IoType::LATENT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("pixels")?;
        let vae = inputs.downcast::<VaeRef>("vae")?;
        let mask = inputs.downcast::<Mask>("mask")?;
        let grow = usize::try_from(inputs.int("grow_mask_by")?).map_err(|_| NodeError::msg("grow_mask_by must be >= 0"))?;
        if mask.data.is_empty() || img.channels < 3 {
            return Err(NodeError::msg("inpainting needs an RGB image and a non-empty mask"));
        }
        let (w, h) = (img.width, img.height);
        let mut grey = img.clone();
        let mut grown_all = Vec::with_capacity(img.n * w * h);
        for i in 0..img.n {
            let m = mask.resized(i, w, h);
            // Grow with a box filter as ComfyUI (sum over the window, clamped to 1).
            let grown = if grow == 0 {
                m.clone()
            } else {
                let r = grow / 2;
                let mut g = vec![0f32; w * h];
                for y in 0..h {
                    for x in 0..w {
                        let mut s = 0f32;
                        for yy in y.saturating_sub(r)..(y + grow - r).min(h) {
                            for xx in x.saturating_sub(r)..(x + grow - r).min(w) {
                                s += m[yy * w + xx];
                            }
                        }
                        g[y * w + x] = s.clamp(0.0, 1.0);
                    }
                }
                g
            };
            for p in 0..w * h {
                if m[p].round() >= 1.0 {
                    for c in 0..img.channels {
                        grey.data[(i * w * h + p) * img.channels + c] = 0.5;
                    }
                }
            }
            grown_all.extend(grown.into_iter().map(|v| v.round()));
        }
        let mut latent = encode_image(&self.rt, ctx, vae, &grey, &self.rt.vae_tiling)?;
        latent.noise_mask = Some(Arc::new(Mask { data: grown_all, n: img.n, height: h, width: w }));
        Ok(Outputs::new(vec![Value::new(IoType::LATENT, latent)]))
    }
}

/// ComfyUI's "Upscale Image": resample to `width`×`height` (0 keeps the aspect ratio
/// from the other side), optionally cropping to the target's aspect ratio first.
struct ImageScale;

impl Node for ImageScale {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ImageScale")
            .display_name("Upscale Image")
            .category("image/upscaling")
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::combo("upscale_method", Method::IMAGE_NAMES))
            .input(InputSpec::int("width", 512).int_range(0, MAX_IMAGE_SIDE as i128))
            .input(InputSpec::int("height", 512).int_range(0, MAX_IMAGE_SIDE as i128))
            .input(InputSpec::combo("crop", ["disabled", "center"]))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let method = Method::parse(inputs.string("upscale_method")?).ok_or_else(|| NodeError::msg("unknown upscale_method"))?;
        let (tw, th) = (inputs.int("width")?.max(0) as usize, inputs.int("height")?.max(0) as usize);
        let (w, h) = (img.width, img.height);
        let (ow, oh) = match (tw > 0, th > 0) {
            (false, false) => (w, h),
            (true, false) => (tw, ((h * tw) as f64 / w as f64).round().max(1.0) as usize),
            (false, true) => (((w * th) as f64 / h as f64).round().max(1.0) as usize, th),
            (true, true) => (tw, th),
        };
        if (ow as u64) * (oh as u64) > MAX_IMAGE_PIXELS || ow > MAX_IMAGE_SIDE as usize || oh > MAX_IMAGE_SIDE as usize {
            return Err(NodeError::msg(format!("{ow}x{oh} is larger than the image limit")));
        }
        let scaled = scale_image(img, ow, oh, method, inputs.string("crop")? == "center");
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, scaled)]))
    }
}

/// ComfyUI's `common_upscale` of an IMAGE to `ow`×`oh`, first cropped to the target's
/// aspect ratio around the centre when `center`.
pub(crate) fn scale_image(img: &Image, ow: usize, oh: usize, method: Method, center: bool) -> Image {
    let (w, h) = (img.width, img.height);
    let (x0, y0, cw, ch) = if center { center_crop(w, h, ow, oh) } else { (0, 0, w, h) };
    let c = img.channels;
    let mut data = vec![0f32; img.n * ow * oh * c];
    for i in 0..img.n {
        for k in 0..c {
            let plane: Vec<f32> = (y0..y0 + ch).flat_map(|y| (x0..x0 + cw).map(move |x| (y, x))).map(|(y, x)| img.data[((i * h + y) * w + x) * c + k]).collect();
            for (p, v) in resize_plane(&plane, cw, ch, ow, oh, method).into_iter().enumerate() {
                data[(i * ow * oh + p) * c + k] = v;
            }
        }
    }
    Image { data, n: img.n, height: oh, width: ow, channels: c }
}

/// ComfyUI's "Image Crop": `width`×`height` from (`x`, `y`), the corner clamped inside
/// the image and the size clipped at its border.
struct ImageCrop;

impl Node for ImageCrop {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ImageCrop")
            .display_name("Image Crop")
            .category("image/transform")
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::int("width", 512).int_range(1, MAX_IMAGE_SIDE as i128).int_step(8))
            .input(InputSpec::int("height", 512).int_range(1, MAX_IMAGE_SIDE as i128).int_step(8))
            .input(InputSpec::int("x", 0).int_range(0, MAX_IMAGE_SIDE as i128).int_step(8))
            .input(InputSpec::int("y", 0).int_range(0, MAX_IMAGE_SIDE as i128).int_step(8))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let get = |n: &str| -> Result<usize, NodeError> { usize::try_from(inputs.int(n)?).map_err(|_| NodeError::msg(format!("{n} must be >= 0"))) };
        let out = crop_image(img, get("x")?, get("y")?, get("width")?, get("height")?)?;
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, out)]))
    }
}

/// `image[:, y:y+height, x:x+width]` with `x`, `y` first clamped to the last column/row.
pub fn crop_image(img: &Image, x: usize, y: usize, width: usize, height: usize) -> Result<Image, NodeError> {
    if img.width == 0 || img.height == 0 || width == 0 || height == 0 {
        return Err(NodeError::msg("cannot crop an empty image or to an empty size"));
    }
    let (x, y) = (x.min(img.width - 1), y.min(img.height - 1));
    let (x1, y1) = (x.saturating_add(width).min(img.width), y.saturating_add(height).min(img.height));
    let c = img.channels;
    let mut data = Vec::with_capacity(img.n * (x1 - x) * (y1 - y) * c);
    for i in 0..img.n {
        for row in y..y1 {
            let base = (i * img.height + row) * img.width;
            data.extend_from_slice(&img.data[(base + x) * c..(base + x1) * c]);
        }
    }
    Ok(Image { data, n: img.n, height: y1 - y, width: x1 - x, channels: c })
}

/// ComfyUI's "Invert Image": `1 - image`.
struct ImageInvert;

impl Node for ImageInvert {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ImageInvert").display_name("Invert Image").category("image").input(InputSpec::link("image", IoType::IMAGE)).output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = inputs.downcast::<Image>("image")?;
        let out = Image { data: img.data.iter().map(|v| 1.0 - v).collect(), ..img.clone() };
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, out)]))
    }
}

/// ComfyUI's "EmptyImage": a batch filled with one `0xRRGGBB` colour.
struct EmptyImage;

impl Node for EmptyImage {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("EmptyImage")
            .category("image")
            .input(InputSpec::int("width", 512).int_range(1, MAX_IMAGE_SIDE as i128))
            .input(InputSpec::int("height", 512).int_range(1, MAX_IMAGE_SIDE as i128))
            .input(InputSpec::int("batch_size", 1).int_range(1, 4096))
            .input(InputSpec::int("color", 0).int_range(0, 0xFF_FFFF).extra("display", json!("color")))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let get = |n: &str| -> Result<usize, NodeError> { usize::try_from(inputs.int(n)?).map_err(|_| NodeError::msg(format!("{n} must be >= 0"))) };
        let (w, h, n) = (get("width")?, get("height")?, get("batch_size")?);
        if w == 0 || h == 0 || n == 0 || (w as u64) * (h as u64) > MAX_IMAGE_PIXELS || (w as u64) * (h as u64) * (n as u64) > MAX_IMAGE_PIXELS * 16 {
            return Err(NodeError::msg(format!("{w}x{h} (batch {n}) is outside the image limit")));
        }
        let color = inputs.int("color")?;
        let rgb = [(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF].map(|v| v as f32 / 255.0);
        let data = (0..n * w * h).flat_map(|_| rgb).collect();
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, Image { data, n, height: h, width: w, channels: 3 })]))
    }
}
