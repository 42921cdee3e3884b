//! Image prompts: CLIPVisionLoader, CLIPVisionEncode (ComfyUI's), IPAdapterModelLoader and
//! IPAdapterAdvanced (ComfyUI_IPAdapter_plus's names and inputs, so its API prompts run).
//!
//! IPAdapterAdvanced encodes the image once, projects it to image tokens and returns a
//! MODEL carrying them; the sampler gives the positive side those tokens and the negative
//! side the unconditional ones (ComfyUI_IPAdapter_plus: a zero `image_embeds` for the
//! classic adapters, a black image's hidden states for Plus, or `image_negative`'s).

use sdflow_core::placement::Module;
use crate::image::resize::{resize_plane, Method};
use crate::runtime::Runtime;
use crate::values::{ClipVisionOutput, ClipVisionRef, Image, IpAdapterPatch, IpAdapterRef, ModelRef};
use crate::err;
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::io::{self, TypeRules};
use sdflow_core::models::clip_vision::{ClipVisionConfig, ClipVisionModel, MEAN, STD};
use sdflow_core::models::sd::ip_adapter::{IpAdapter, IpAdapterConfig};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::sd::unet::UnetConfig;
use sdflow_core::models::Weights;
use sdflow_core::residency::{Device, WeightHandle, WeightKey};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const IPADAPTER: IoType = IoType::from_static("IPADAPTER");

/// Model folders, as ComfyUI's and ComfyUI_IPAdapter_plus's.
const CLIP_VISION_DIR: &str = "clip_vision";
const IPADAPTER_DIR: &str = "ipadapter";

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(ClipVisionLoader { rt: rt.clone() }));
    registry.register(Arc::new(ClipVisionEncode { rt: rt.clone() }));
    registry.register(Arc::new(IpAdapterModelLoader { rt: rt.clone() }));
    registry.register(Arc::new(IpAdapterAdvanced { rt: rt.clone() }));
}

/// ComfyUI's `clip_preprocess`: drop alpha; unless already `size`² resize (bicubic,
/// antialiased) the shorter side to `size` keeping the aspect (`crop`) or both sides to
/// `size`, and take the centred `size`² crop; quantise to 8 bits; normalise with CLIP's
/// mean and std. Returns [N, 3, size, size] (ggml's [size, size, 3, N]).
pub fn clip_preprocess(img: &Image, size: usize, crop: bool) -> Result<Vec<f32>, NodeError> {
    let (h, w) = (img.height, img.width);
    if img.n == 0 || h == 0 || w == 0 || img.channels < 3 || img.data.len() != img.n * h * w * img.channels {
        return Err(NodeError::msg(format!("an image of {}×{}×{}×{} with {} values cannot be encoded (it needs RGB)", img.n, h, w, img.channels, img.data.len())));
    }
    let (oh, ow) = if h == size && w == size {
        (h, w)
    } else if crop {
        let scale = size as f64 / h.min(w) as f64;
        ((scale * h as f64).round_ties_even() as usize, (scale * w as f64).round_ties_even() as usize)
    } else {
        (size, size)
    };
    if oh < size || ow < size {
        return Err(NodeError::msg(format!("a {w}×{h} image resized to {ow}×{oh} does not cover the {size}² crop")));
    }
    let (y0, x0) = ((oh - size) / 2, (ow - size) / 2);
    let mut out = Vec::with_capacity(img.n * 3 * size * size);
    for i in 0..img.n {
        for c in 0..3 {
            let plane: Vec<f32> = (0..h * w).map(|p| img.data[(i * h * w + p) * img.channels + c]).collect();
            let plane = if (oh, ow) == (h, w) { plane } else { resize_plane(&plane, w, h, ow, oh, Method::BicubicAntialiased) };
            for y in y0..y0 + size {
                out.extend(plane[y * ow + x0..y * ow + x0 + size].iter().map(|&v| ((v * 255.0).clamp(0.0, 255.0).round_ties_even() / 255.0 - MEAN[c]) / STD[c]));
            }
        }
    }
    Ok(out)
}

/// Encode preprocessed images ([N, 3, S, S]) with the vision tower.
fn encode(rt: &Runtime, cv: &ClipVisionRef, pixels: Vec<f32>, n: usize) -> Result<ClipVisionOutput, NodeError> {
    let weights = rt.pin(Module::ClipVision, &cv.weights)?;
    let model = vision_model(&weights, &cv.name)?;
    let c = &model.config;
    let s = c.image_size;
    const GRAPH: usize = 8192;
    // Built inside the scope, so the graph is made for the device it runs on.
    let mut r = rt.with_backend(Module::ClipVision, |b| -> Result<Vec<Vec<f32>>, NodeError> {
        let ctx = Context::new(GRAPH, GRAPH).map_err(err)?;
        let mut run = GraphRun::new(&ctx);
        let px = run.input_f32(&[s, s, 3, n as i64], pixels).map_err(err)?;
        let out = model.forward(&ctx, &mut run, px).map_err(err)?;
        run.compute(b, &[out.image_embeds, out.penultimate], GRAPH).map_err(err)
    })?;
    let penultimate = r.pop().expect("two outputs");
    let image_embeds = r.pop().expect("two outputs");
    Ok(ClipVisionOutput { image_embeds, penultimate, n, projection_dim: c.projection_dim as usize, hidden: c.hidden as usize, tokens: c.tokens() as usize })
}

fn vision_model<'w>(weights: &'w Weights, name: &str) -> Result<ClipVisionModel<'w>, NodeError> {
    let cfg = ClipVisionConfig::infer(weights, "").map_err(|e| NodeError::msg(format!("{name}: {e}")))?;
    ClipVisionModel::new(weights, "", cfg).map_err(|e| NodeError::msg(format!("{name}: {e}")))
}

/// The vision tower's input side, read off its weights.
fn image_size(cv: &ClipVisionRef) -> Result<usize, NodeError> {
    let weights = cv.weights.pin().map_err(err)?;
    Ok(vision_model(&weights, &cv.name)?.config.image_size as usize)
}

/// A residency handle on the tensors of `path` under `prefixes`.
pub(crate) fn handle(rt: &Runtime, module: Module, path: &Path, key: &str, prefixes: &'static [&'static str]) -> Result<WeightHandle<Weights>, NodeError> {
    let key = WeightKey::new([path], key, rt.weight_type, Device::Cpu).map_err(err)?;
    let (path, wt) = (path.to_path_buf(), rt.weight_type);
    rt.weights(module, key, move |memory| {
        let src = io::open(&path)?;
        Ok(load_weights(memory, src.as_ref(), prefixes, &TypeRules::new(wt, "")?)?)
    })
}

/// Fail in the loader, naming the file, when it lacks `required` (or has none of the
/// tensor names `any_of` starts).
fn check_file(path: &Path, what: &str, required: &str, any_of: &str) -> Result<(), NodeError> {
    let src = io::open(path).map_err(err)?;
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    if !names.contains(&required) || !names.iter().any(|n| n.starts_with(any_of)) {
        let hint = if names.iter().any(|n| n.starts_with("visual.transformer.")) { " (OpenCLIP `visual.*` names are not supported; use the Hugging Face layout)" } else { "" };
        return Err(NodeError::msg(format!("{}: not {what} (no `{required}` / `{any_of}*` tensors){hint}", path.display())));
    }
    Ok(())
}

/// ComfyUI's "Load CLIP Vision".
struct ClipVisionLoader {
    rt: Arc<Runtime>,
}

impl ClipVisionLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(CLIP_VISION_DIR, inputs.string("clip_name")?).map_err(NodeError::msg)
    }
}

impl Node for ClipVisionLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CLIPVisionLoader")
            .display_name("Load CLIP Vision")
            .category("loaders")
            .description("Loads a CLIP image encoder (ViT-L/14, ViT-H/14, ViT-bigG/14 in Hugging Face key names) from models/clip_vision; weights load on first use.")
            .input(InputSpec::combo("clip_name", self.rt.list_models(CLIP_VISION_DIR)))
            .output("CLIP_VISION", IoType::CLIP_VISION)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        check_file(&path, "a CLIP vision model", "visual_projection.weight", "vision_model.encoder.layers.")?;
        let weights = handle(&self.rt, Module::ClipVision, &path, "clip-vision:", &["vision_model.", "visual_projection."])?;
        let cv = ClipVisionRef { weights, name: inputs.string("clip_name")?.to_string() };
        Ok(Outputs::new(vec![Value::new(IoType::CLIP_VISION, cv)]))
    }
}

/// ComfyUI's "CLIP Vision Encode".
struct ClipVisionEncode {
    rt: Arc<Runtime>,
}

impl Node for ClipVisionEncode {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("CLIPVisionEncode")
            .display_name("CLIP Vision Encode")
            .category("conditioning")
            .description("Encodes images with a CLIP vision model: the projected image embedding and the penultimate hidden states.")
            .input(InputSpec::link("clip_vision", IoType::CLIP_VISION))
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::combo("crop", ["center", "none"]).tooltip("center: resize the shorter side and crop the middle; none: squash the whole image to the encoder's size."))
            .output("CLIP_VISION_OUTPUT", IoType::CLIP_VISION_OUTPUT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let cv = inputs.downcast::<ClipVisionRef>("clip_vision")?;
        let img = inputs.downcast::<Image>("image")?;
        let crop = inputs.string("crop")? == "center";
        let pixels = clip_preprocess(img, image_size(cv)?, crop)?;
        let out = encode(&self.rt, cv, pixels, img.n)?;
        Ok(Outputs::new(vec![Value::new(IoType::CLIP_VISION_OUTPUT, out)]))
    }
}

/// ComfyUI_IPAdapter_plus's "IPAdapter Model Loader".
struct IpAdapterModelLoader {
    rt: Arc<Runtime>,
}

impl IpAdapterModelLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(IPADAPTER_DIR, inputs.string("ipadapter_file")?).map_err(NodeError::msg)
    }
}

impl Node for IpAdapterModelLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("IPAdapterModelLoader")
            .display_name("IPAdapter Model Loader")
            .category("ipadapter/loaders")
            .description("Loads an IP-Adapter (classic or Plus, .safetensors or .bin) from models/ipadapter; weights load on first use.")
            .input(InputSpec::combo("ipadapter_file", self.rt.list_models(IPADAPTER_DIR)))
            .output("IPADAPTER", IPADAPTER)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        check_file(&path, "an IP-Adapter", "ip_adapter.1.to_k_ip.weight", "image_proj.")?;
        let weights = handle(&self.rt, Module::Diffusion, &path, "ipadapter:", &["image_proj.", "ip_adapter."])?;
        let ipa = IpAdapterRef { weights, name: inputs.string("ipadapter_file")?.to_string() };
        Ok(Outputs::new(vec![Value::new(IPADAPTER, ipa)]))
    }
}

/// ComfyUI_IPAdapter_plus's "IPAdapter Advanced" (weight type `linear`, embeds scaling
/// `V only`: the image attention scaled by `weight`, as the original IP-Adapter).
struct IpAdapterAdvanced {
    rt: Arc<Runtime>,
}

const COMBINE: [&str; 5] = ["concat", "add", "subtract", "average", "norm average"];

impl Node for IpAdapterAdvanced {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("IPAdapterAdvanced")
            .display_name("IPAdapter Advanced")
            .category("ipadapter")
            .description("Adds an image prompt to the model: the IP-Adapter's image tokens in every cross-attention, between start_at and end_at.")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::link("ipadapter", IPADAPTER))
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::float("weight", 1.0).float_range(-1.0, 5.0).float_step(0.05))
            .input(InputSpec::combo("weight_type", ["linear"]).tooltip("How the weight spreads over the layers; linear: the same everywhere."))
            .input(InputSpec::combo("combine_embeds", COMBINE).tooltip("Several images: concat gives each its tokens; the others merge the CLIP embeddings into one."))
            .input(InputSpec::float("start_at", 0.0).float_range(0.0, 1.0).float_step(0.001))
            .input(InputSpec::float("end_at", 1.0).float_range(0.0, 1.0).float_step(0.001))
            .input(InputSpec::combo("embeds_scaling", ["V only"]).tooltip("V only: the weight scales the image attention's output."))
            .input(InputSpec::link("image_negative", IoType::IMAGE).optional().tooltip("What the negative side sees instead of the unconditional embedding."))
            .input(InputSpec::link("clip_vision", IoType::CLIP_VISION).optional().tooltip("The CLIP vision model the adapter was trained with (ViT-H/14 for most)."))
            .output("MODEL", IoType::MODEL)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = inputs.downcast::<ModelRef>("model")?;
        let ipa = inputs.downcast::<IpAdapterRef>("ipadapter")?;
        let img = inputs.downcast::<Image>("image")?;
        if !inputs.contains("clip_vision") {
            return Err(NodeError::msg("IPAdapterAdvanced needs a clip_vision input (CLIPVisionLoader with the model the adapter was trained with)"));
        }
        let cv = inputs.downcast::<ClipVisionRef>("clip_vision")?;
        let combine = inputs.string("combine_embeds")?;
        let (start_at, end_at) = (inputs.float("start_at")? as f32, inputs.float("end_at")? as f32);
        let weight = inputs.float("weight")? as f32;

        let weights = self.rt.pin(Module::Diffusion, &ipa.weights)?;
        let named = |e: sdflow_core::models::ModelError| NodeError::msg(format!("{}: {e}", ipa.name));
        let adapter = IpAdapter::new(&weights, IpAdapterConfig::infer(&weights).map_err(named)?).map_err(named)?;
        {
            let unet = model.weights.pin().map_err(err)?;
            adapter.check_unet(&UnetConfig::infer(&unet, &model.prefix).map_err(err)?).map_err(named)?;
        }
        let plus = adapter.config.is_plus();
        let size = image_size(cv)?;
        let cond = encode(&self.rt, cv, clip_preprocess(img, size, true)?, img.n)?;
        let uncond = match inputs.contains("image_negative") {
            true => {
                let neg = inputs.downcast::<Image>("image_negative")?;
                Some(encode(&self.rt, cv, clip_preprocess(neg, size, true)?, neg.n)?)
            }
            // A black image (what Plus sees unconditionally); the classic adapters take zeros.
            false if plus => Some(encode(&self.rt, cv, clip_preprocess(&Image { data: vec![0.0; size * size * 3], n: 1, height: size, width: size, channels: 3 }, size, true)?, 1)?),
            false => None,
        };
        let (width, rows) = if plus { (cond.hidden, cond.tokens) } else { (cond.projection_dim, 1) };
        let per = width * rows;
        let pick = |o: &ClipVisionOutput| if plus { o.penultimate.clone() } else { o.image_embeds.clone() };
        let cond_embeds = pick(&cond);
        // The unconditional embedding, one per image as ComfyUI_IPAdapter_plus's tensor_to_size.
        let uncond_one = |i: usize| -> Vec<f32> {
            match &uncond {
                Some(u) => {
                    let all = pick(u);
                    let j = i.min(u.n - 1);
                    all[j * per..(j + 1) * per].to_vec()
                }
                None => vec![0.0; per],
            }
        };
        let (cond_embeds, uncond_embeds, images) = if combine == "concat" || img.n == 1 {
            (cond_embeds, (0..img.n).flat_map(uncond_one).collect::<Vec<f32>>(), img.n)
        } else {
            (combine_embeds(combine, &cond_embeds, img.n, per)?, uncond_one(0), 1)
        };
        let project = |embeds: Vec<f32>| -> Result<Vec<f32>, NodeError> {
            const GRAPH: usize = 4096;
            self.rt.with_backend(Module::Diffusion, |b| {
                let ctx = Context::new(GRAPH, GRAPH).map_err(err)?;
                let mut run = GraphRun::new(&ctx);
                let ne: Vec<i64> = if plus { vec![width as i64, rows as i64, images as i64] } else { vec![width as i64, images as i64] };
                let e = run.input_f32(&ne, embeds).map_err(err)?;
                let t = adapter.project(&ctx, &mut run, e).map_err(named)?;
                run.compute(b, &[t], GRAPH).map_err(err).map(|mut v| v.remove(0))
            })
        };
        // Several images (concat) give their tokens one after another.
        let (cond_tokens, uncond_tokens) = (project(cond_embeds)?, project(uncond_embeds)?);
        let patch = IpAdapterPatch {
            weights: ipa.weights.clone(),
            cond: cond_tokens,
            uncond: uncond_tokens,
            tokens: adapter.config.tokens * images as i64,
            weight,
            start_at,
            end_at,
        };
        let mut out = model.clone();
        out.ip_adapters.push(Arc::new(patch));
        Ok(Outputs::new(vec![Value::new(IoType::MODEL, out)]))
    }
}

/// ComfyUI_IPAdapter_plus's merging of several images' embeddings (`n` rows of `per`).
fn combine_embeds(mode: &str, e: &[f32], n: usize, per: usize) -> Result<Vec<f32>, NodeError> {
    if !COMBINE[1..].contains(&mode) {
        return Err(NodeError::msg(format!("combine_embeds `{mode}`: one of {COMBINE:?}")));
    }
    let col = |j: usize| (0..n).map(move |i| e[i * per + j]);
    Ok((0..per)
        .map(|j| match mode {
            "add" => col(j).sum(),
            "subtract" => e[j] - col(j).skip(1).sum::<f32>() / (n - 1) as f32,
            "average" => col(j).sum::<f32>() / n as f32,
            // "norm average": each feature over the images divided by its norm, averaged.
            _ => {
                let norm = col(j).map(|v| v * v).sum::<f32>().sqrt();
                col(j).map(|v| if norm > 0.0 { v / norm } else { 0.0 }).sum::<f32>() / n as f32
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combining_embeddings_follows_ipadapter_plus() {
        // Two images of three features.
        let e = [1.0, 2.0, 0.0, 3.0, -2.0, 4.0];
        assert_eq!(combine_embeds("add", &e, 2, 3).unwrap(), vec![4.0, 0.0, 4.0]);
        assert_eq!(combine_embeds("average", &e, 2, 3).unwrap(), vec![2.0, 0.0, 2.0]);
        assert_eq!(combine_embeds("subtract", &e, 2, 3).unwrap(), vec![-2.0, 4.0, -4.0]);
        let n = combine_embeds("norm average", &e, 2, 3).unwrap();
        let want = [(1.0 + 3.0) / 10f32.sqrt() / 2.0, 0.0, 0.5];
        assert!(n.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{n:?}");
        assert!(combine_embeds("median", &e, 2, 3).is_err());
    }
}
