//! PhotoMaker for SDXL: PhotoMakerLoader and PhotoMakerEncode (ComfyUI's built-in nodes,
//! same names and inputs), with what sd.cpp's `--photo-maker` adds beyond them as
//! optional inputs and nodes: the trigger word, the style strength (the first part of
//! the steps sampled without the identity), v2's face ID embeddings file, the file's UNet
//! LoRA (PhotoMakerLoraLoader) and a folder of ID images (LoadImagesFromDir).
//!
//! PhotoMakerEncode follows sd.cpp, which uses every ID image (ComfyUI fuses only the
//! first): the class word before the trigger is repeated once per ID embedding (one per
//! image for v1, two for v2), those copies are fused with the ID embeddings and the
//! trigger is dropped. With a style strength s, the prompt without the trigger guides
//! the first `floor(s/100 · steps)` steps and the identity prompt the rest. A prompt
//! without the trigger word gets a warning and is encoded as it is: no identity.

use sdflow_core::placement::Module;
use crate::conditioning::encode_texts_with;
use crate::err;
use crate::image::decode_image;
use crate::conditioning::ip_adapter::clip_preprocess;
use crate::loaders::lora::lora_handle_with;
use crate::image::resize::{resize_plane, Method};
use crate::runtime::Runtime;
use crate::values::{ClipRef, CondEntry, CondList, Image, ModelRef};
use sdflow_core::io;
use sdflow_core::lora::{ApplyMode, LoraError, LoraFile, Side};
use sdflow_core::models::sd::photomaker::{expand_trigger, read_id_embeds, PhotoMaker, PhotoMakerConfig, TriggerError, Version};
use sdflow_core::models::Weights;
use sdflow_core::residency::WeightHandle;
use sdflow_core::text::{ClipTokenizer, PadToken};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const PHOTOMAKER: IoType = IoType::from_static("PHOTOMAKER");
const PHOTOMAKER_DIR: &str = "photomaker";
/// Image files LoadImagesFromDir reads; other files (face_detect.py's `id_embeds.bin`)
/// are left alone.
const IMAGE_EXTENSIONS: [&str; 6] = ["png", "jpg", "jpeg", "webp", "bmp", "gif"];

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(PhotoMakerLoader { rt: rt.clone() }));
    registry.register(Arc::new(PhotoMakerEncode { rt: rt.clone() }));
    registry.register(Arc::new(PhotoMakerLoraLoader { rt: rt.clone() }));
    registry.register(Arc::new(LoadImagesFromDir { rt: rt.clone() }));
}

/// PHOTOMAKER: the ID encoder's weights, as a residency handle, and the file (for its
/// LoRA).
#[derive(Clone, Debug)]
pub struct PhotoMakerRef {
    pub weights: WeightHandle<Weights>,
    pub path: PathBuf,
    pub name: String,
}
crate::handle_size!(PhotoMakerRef);

/// ComfyUI's "PhotoMakerLoader".
struct PhotoMakerLoader {
    rt: Arc<Runtime>,
}

impl PhotoMakerLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(PHOTOMAKER_DIR, inputs.string("photomaker_model_name")?).map_err(NodeError::msg)
    }
}

impl Node for PhotoMakerLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("PhotoMakerLoader")
            .display_name("PhotoMakerLoader")
            .category("_for_testing/photomaker")
            .description("Loads a PhotoMaker v1 or v2 file (the official .bin or sd.cpp's safetensors) from models/photomaker.")
            .input(InputSpec::combo("photomaker_model_name", self.rt.list_models(PHOTOMAKER_DIR)))
            .output("PHOTOMAKER", PHOTOMAKER)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        let src = io::open(&path).map_err(err)?;
        if !src.tensors().iter().any(|t| t.name.ends_with("visual_projection_2.weight")) {
            return Err(NodeError::msg(format!("{}: not a PhotoMaker file (no `id_encoder.visual_projection_2.weight` / `visual_projection_2.weight`)", path.display())));
        }
        drop(src);
        let weights = crate::conditioning::ip_adapter::handle(&self.rt, Module::PhotoMaker, &path, "photomaker:", &["id_encoder.", "vision_model.", "visual_projection", "fuse_module.", "qformer_perceiver."])?;
        // Structure errors (missing or misshapen tensors) name the file now, not at encoding.
        {
            let w = weights.pin().map_err(err)?;
            let cfg = PhotoMakerConfig::infer(&w).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
            PhotoMaker::new(&w, cfg).map_err(|e| NodeError::msg(format!("{}: {e}", path.display())))?;
        }
        let pm = PhotoMakerRef { weights, path, name: inputs.string("photomaker_model_name")?.to_string() };
        Ok(Outputs::new(vec![Value::new(PHOTOMAKER, pm)]))
    }
}

/// ComfyUI's "PhotoMakerEncode", with sd.cpp's trigger word, style strength and v2 face
/// embeddings as optional inputs.
struct PhotoMakerEncode {
    rt: Arc<Runtime>,
}

impl Node for PhotoMakerEncode {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("PhotoMakerEncode")
            .display_name("PhotoMakerEncode")
            .category("_for_testing/photomaker")
            .description("Encodes an SDXL prompt whose class word (\"man\", \"woman\") is followed by the trigger word, stacking the identity of the ID images into that word.")
            .input(InputSpec::link("photomaker", PHOTOMAKER))
            .input(InputSpec::link("image", IoType::IMAGE).tooltip("The ID images (all of them are used)."))
            .input(InputSpec::link("clip", IoType::CLIP))
            .input(InputSpec::string("text", "photograph of photomaker").multiline())
            .input(InputSpec::string("trigger_word", "photomaker").optional().tooltip("The word after the class word that marks the identity; ComfyUI's is photomaker, sd.cpp's and PhotoMaker's own img."))
            .input(InputSpec::float("style_strength", 0.0).float_range(0.0, 100.0).float_step(1.0).optional().tooltip("sd.cpp's --pm-style-strength: the percentage of the steps sampled with the prompt without the identity first (0: the identity from the start, as ComfyUI)."))
            .input(InputSpec::string("id_embeds", "").optional().tooltip("PhotoMaker v2: the face ID embeddings file in the input folder (sd.cpp's face_detect.py id_embeds.bin), one per ID image."))
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        match inputs.contains("id_embeds").then(|| inputs.string("id_embeds")).transpose()? {
            Some(name) if !name.is_empty() => self.rt.input_fingerprint(name),
            _ => Ok(None),
        }
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let pm_ref = inputs.downcast::<PhotoMakerRef>("photomaker")?;
        let img = inputs.downcast::<Image>("image")?;
        let clip = inputs.downcast::<ClipRef>("clip")?;
        let text = inputs.string("text")?;
        let opt_str = |name: &str, default: &'static str| -> Result<String, NodeError> { Ok(if inputs.contains(name) { inputs.string(name)?.to_string() } else { default.to_string() }) };
        let trigger_word = opt_str("trigger_word", "photomaker")?;
        let style = if inputs.contains("style_strength") { inputs.float("style_strength")? } else { 0.0 };
        if !(0.0..=100.0).contains(&style) {
            return Err(NodeError::msg(format!("style_strength {style} is outside 0..=100")));
        }
        if clip.encoders.len() != 2 {
            return Err(NodeError::msg(format!("PhotoMaker works with SDXL's two text encoders; this CLIP ({}) has {}", clip.family, clip.encoders.len())));
        }
        let trigger = match ClipTokenizer::new(PadToken::EndOfText).encode(&trigger_word).as_slice() {
            [t] => *t,
            other => return Err(NodeError::msg(format!("the trigger word `{trigger_word}` is {} CLIP tokens; it must be one", other.len()))),
        };
        let w = self.rt.pin(Module::PhotoMaker, &pm_ref.weights)?;
        let cfg = PhotoMakerConfig::infer(&w).map_err(|e| NodeError::msg(format!("{}: {e}", pm_ref.name)))?;
        let pm = PhotoMaker::new(&w, cfg).map_err(|e| NodeError::msg(format!("{}: {e}", pm_ref.name)))?;
        let n = img.n;
        let repeat = n * pm.config.tokens_per_image();

        // The identity prompt: the class word once per ID embedding, no trigger.
        let mut found: Option<Result<Vec<usize>, TriggerError>> = None;
        let id_cond = encode_texts_with(&self.rt, clip, text, text, &mut |p, pad| match expand_trigger(&p, trigger, repeat, pad) {
            Ok((p, pos)) => {
                if let Some(Ok(first)) = &found {
                    if *first != pos {
                        return Err(NodeError::msg("the two text encoders laid the prompt out differently"));
                    }
                }
                found = Some(Ok(pos));
                Ok(p)
            }
            Err(e) => {
                found = Some(Err(e));
                Ok(p)
            }
        })?;
        let positions = match found {
            Some(Ok(pos)) => pos,
            Some(Err(e)) => {
                tracing::warn!(trigger = %trigger_word, "PhotoMaker: {e}; this prompt is encoded without the identity");
                return Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(vec![CondEntry::new(id_cond)]))]));
            }
            None => return Err(NodeError::msg("the prompt was not tokenized")),
        };
        let faces = match pm.config.version() {
            Version::V1 => None,
            Version::V2 => {
                let name = opt_str("id_embeds", "")?;
                if name.is_empty() {
                    return Err(NodeError::msg(format!("{} is PhotoMaker v2: it needs the ID images' face embeddings (the id_embeds input, sd.cpp's --pm-id-embed-path)", pm_ref.name)));
                }
                let path = self.rt.resolve_input(&name).map_err(NodeError::msg)?;
                let (data, dim, count) = read_id_embeds(&path).map_err(err)?;
                if count != n {
                    return Err(NodeError::msg(format!("{}: {count} face embeddings for {n} ID images (run face_detect.py on the same images)", path.display())));
                }
                if dim as i64 != pm.config.qformer.as_ref().map_or(0, |q| q.id_dim) {
                    return Err(NodeError::msg(format!("{}: {dim}-wide face embeddings; {} takes {}", path.display(), pm_ref.name, pm.config.qformer.as_ref().map_or(0, |q| q.id_dim))));
                }
                Some(data)
            }
        };
        let pixels = clip_preprocess(img, pm.config.vision.image_size as usize, true)?;
        let id_cond = self.rt.with_backend(Module::PhotoMaker, |b| pm.stack(b, &id_cond, &positions, pixels, n, faces)).map_err(err)?;
        let entries = if style > 0.0 {
            let plain = encode_texts_with(&self.rt, clip, text, text, &mut |p, pad| expand_trigger(&p, trigger, 1, pad).map(|(p, _)| p).map_err(err))?;
            // sd.cpp's start_merge_step = int(style_strength / 100.f * steps).
            let at = style as f32 / 100.0;
            vec![CondEntry { step_range: Some((0.0, at)), ..CondEntry::new(plain) }, CondEntry { step_range: Some((at, 1.0)), ..CondEntry::new(id_cond) }]
        } else {
            vec![CondEntry::new(id_cond)]
        };
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(entries))]))
    }
}

/// The LoRA a PhotoMaker file carries for the UNet (sd.cpp applies it with the file).
struct PhotoMakerLoraLoader {
    rt: Arc<Runtime>,
}

/// The `lora_weights.*` part of an official file, or the `unet.*` LoRA of sd.cpp's
/// conversion.
fn read_photomaker_lora(path: &Path) -> Result<LoraFile, LoraError> {
    let src = io::open(path)?;
    let official = src.tensors().iter().any(|t| t.name.starts_with("lora_weights."));
    LoraFile::read_renamed(src.as_ref(), &|n| if official { n.strip_prefix("lora_weights.").map(str::to_string) } else { n.starts_with("unet.").then(|| n.to_string()) })
}

impl Node for PhotoMakerLoraLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("PhotoMakerLoraLoader")
            .display_name("PhotoMaker LoRA")
            .category("_for_testing/photomaker")
            .description("Applies the UNet LoRA of a PhotoMaker file to the model, as sd.cpp does with --photo-maker.")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::link("photomaker", PHOTOMAKER))
            .input(InputSpec::float("strength", 1.0).float_range(-100.0, 100.0).float_step(0.01))
            .output("MODEL", IoType::MODEL)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let pm = inputs.downcast::<PhotoMakerRef>("photomaker")?;
        let mut model = inputs.downcast::<ModelRef>("model")?.clone();
        let strength = inputs.float("strength")? as f32;
        if !strength.is_finite() {
            return Err(NodeError::msg(format!("strength must be a finite number, got {strength}")));
        }
        if strength != 0.0 {
            model.weights = lora_handle_with(&self.rt, &model.weights, &pm.path, strength, Side::DiffusionModel, ApplyMode::Auto, "photomaker-lora", read_photomaker_lora)?;
        }
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, model)]))
    }
}

/// Every image file of a folder inside the input folder, by file name, as one IMAGE
/// batch (sd.cpp's `--pm-id-images-dir`).
struct LoadImagesFromDir {
    rt: Arc<Runtime>,
}

impl LoadImagesFromDir {
    fn files(&self, inputs: &Inputs) -> Result<Vec<PathBuf>, NodeError> {
        let name = inputs.string("directory")?;
        let rel = Path::new(name);
        if rel.is_absolute() || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(NodeError::msg(format!("directory `{name}` must be a plain path inside the input folder")));
        }
        let dir = self.rt.input_dir.join(rel);
        let entries = std::fs::read_dir(&dir).map_err(|e| NodeError::msg(format!("{}: {e}", dir.display())))?;
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().and_then(|e| e.to_str()).is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())))
            .collect();
        if files.is_empty() {
            return Err(NodeError::msg(format!("{}: no image files ({})", dir.display(), IMAGE_EXTENSIONS.join(", "))));
        }
        files.sort();
        Ok(files)
    }
}

impl Node for LoadImagesFromDir {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("LoadImagesFromDir")
            .display_name("Load Images From Folder")
            .category("image")
            .description("Loads every image file of a folder in the input folder, in file-name order, as one batch.")
            .input(InputSpec::string("directory", "").tooltip("A folder inside the input folder."))
            .input(InputSpec::int("size", 224).int_range(1, 16384).optional().tooltip("Images of different sizes are each resized (shorter side, bicubic) and centre-cropped to this square, as CLIP vision preprocessing does; same-size images are kept as they are."))
            .output("IMAGE", IoType::IMAGE)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        let mut fp = Vec::new();
        for f in self.files(inputs)? {
            fp.extend(f.to_string_lossy().as_bytes());
            fp.extend(std::fs::read(&f).map_err(|e| NodeError::msg(format!("{}: {e}", f.display())))?);
        }
        Ok(Some(fp))
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let images = self.files(inputs)?.iter().map(|f| decode_image(f).map(|(i, _)| i)).collect::<Result<Vec<_>, _>>()?;
        let same = images.iter().all(|i| (i.width, i.height) == (images[0].width, images[0].height));
        let size = if inputs.contains("size") { inputs.int("size")? } else { 224 };
        if !(1..=16384).contains(&size) {
            return Err(NodeError::msg(format!("size {size} is outside 1..=16384")));
        }
        let images: Vec<Image> = if same { images } else { images.iter().map(|i| square(i, size as usize)).collect() };
        let (h, w) = (images[0].height, images[0].width);
        let data = images.iter().flat_map(|i| i.data.iter().copied()).collect();
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, Image { data, n: images.len(), height: h, width: w, channels: 3 })]))
    }
}

/// `img` with its shorter side resized to `size` and the centred `size`² crop taken.
fn square(img: &Image, size: usize) -> Image {
    let (h, w) = (img.height, img.width);
    let scale = size as f64 / h.min(w) as f64;
    let (oh, ow) = (((scale * h as f64).round() as usize).max(size), ((scale * w as f64).round() as usize).max(size));
    let (y0, x0) = ((oh - size) / 2, (ow - size) / 2);
    let planes: Vec<Vec<f32>> = (0..3).map(|c| resize_plane(&(0..h * w).map(|p| img.data[p * 3 + c]).collect::<Vec<_>>(), w, h, ow, oh, Method::BicubicAntialiased)).collect();
    let mut data = Vec::with_capacity(size * size * 3);
    for y in y0..y0 + size {
        for x in x0..x0 + size {
            data.extend(planes.iter().map(|p| p[y * ow + x]));
        }
    }
    Image { data, n: 1, height: size, width: size, channels: 3 }
}
