//! ControlNets: ControlNetLoader, ControlNetApplyAdvanced, ControlNetApply, and the
//! Canny edge preprocessor (sd.cpp's `--canny` algorithm).
//!
//! Applying a ControlNet only marks conditioning entries (ComfyUI's `control`); the
//! sampler runs the ControlNet next to the UNet each step the control is active
//! ([`crate::sampling`]).

use sdflow_core::placement::Module;
use crate::err;
use crate::image::scale_image;
use crate::image::resize::Method;
use crate::runtime::Runtime;
use crate::values::{CondEntry, CondList, Control, ControlNetRef, Image};
use sdflow_core::io;
use sdflow_core::models::sd::controlnet::{self as cn, ControlNet, ControlNetConfig};
use sdflow_core::models::sd::unet::UnetConfig;
use sdflow_core::models::Weights;
use sdflow_core::residency::{Device, PinGuard, WeightKey};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::PathBuf;
use std::sync::Arc;

/// Model folder kind, as ComfyUI's `models/controlnet`.
const KIND: &str = "controlnet";

/// The residency key prefix of ControlNets: their tensors are renamed, so the entry is
/// not the file's own tensors under any prefix.
const KEY: &str = "controlnet-loader:";

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(ControlNetLoader { rt: rt.clone() }));
    registry.register(Arc::new(ControlNetApplyAdvanced));
    registry.register(Arc::new(ControlNetApply));
    registry.register(Arc::new(Canny));
}

/// ComfyUI's "Load ControlNet Model": an SD1.x/2.x/SDXL ControlNet (lllyasviel's
/// `control_model.*` files, the same without the prefix, or diffusers `ControlNetModel`
/// files); the weights load on first use, shared through the residency manager and
/// apart from the checkpoint's, so changing the ControlNet never reloads the model.
struct ControlNetLoader {
    rt: Arc<Runtime>,
}

impl ControlNetLoader {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(KIND, inputs.string("control_net_name")?).map_err(NodeError::msg)
    }
}

impl Node for ControlNetLoader {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ControlNetLoader")
            .display_name("Load ControlNet Model")
            .category("loaders")
            .description("Loads a ControlNet (LDM control_model.* or diffusers names) from models/controlnet; weights load on first use.")
            .input(InputSpec::combo("control_net_name", self.rt.list_models(KIND)))
            .output("CONTROL_NET", IoType::CONTROL_NET)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        // Fail here, naming the file, when it is no ControlNet.
        let shown = path.display().to_string();
        let key = WeightKey::new([&path], KEY, self.rt.weight_type, Device::Cpu).map_err(err)?;
        let p = path.clone();
        let weights = crate::loaders::sized_weights(&self.rt, Module::ControlNet, key, vec![format!("{}.", cn::PREFIX)], move || Ok(cn::standalone_source(io::open(&p)?)?))
            .map_err(|e| NodeError::msg(format!("{shown}: {e}")))?;
        let name = inputs.string("control_net_name")?.to_string();
        Ok(Outputs::new(vec![Value::new(IoType::CONTROL_NET, ControlNetRef { weights, name })]))
    }
}

fn strength_input() -> InputSpec {
    InputSpec::float("strength", 1.0).float_range(0.0, 10.0).float_step(0.01)
}

fn hint_from(inputs: &Inputs) -> Result<Arc<Image>, NodeError> {
    let img = inputs.downcast_arc::<Image>("image")?;
    if img.n == 0 || img.width == 0 || img.height == 0 || img.data.len() != img.n * img.width * img.height * img.channels {
        return Err(NodeError::msg(format!("the control image of {}x{}x{}x{} holds {} values", img.n, img.height, img.width, img.channels, img.data.len())));
    }
    Ok(img)
}

/// ComfyUI's "Apply ControlNet": the ControlNet on both the positive and the negative
/// conditioning between `start_percent` and `end_percent` of sampling, stacked on any
/// ControlNet the entries already have (entries that shared one share the new one).
struct ControlNetApplyAdvanced;

impl Node for ControlNetApplyAdvanced {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ControlNetApplyAdvanced")
            .display_name("Apply ControlNet")
            .category("conditioning/controlnet")
            .input(InputSpec::link("positive", IoType::CONDITIONING))
            .input(InputSpec::link("negative", IoType::CONDITIONING))
            .input(InputSpec::link("control_net", IoType::CONTROL_NET))
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(strength_input())
            .input(InputSpec::float("start_percent", 0.0).float_range(0.0, 1.0).float_step(0.001))
            .input(InputSpec::float("end_percent", 1.0).float_range(0.0, 1.0).float_step(0.001))
            .input(InputSpec::link("vae", IoType::VAE).optional().tooltip("Only ControlNets working on latents (SD3, FLUX) use it; ignored for SD1.x/SDXL ControlNets."))
            .output("positive", IoType::CONDITIONING)
            .output("negative", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let positive = inputs.downcast::<CondList>("positive")?;
        let negative = inputs.downcast::<CondList>("negative")?;
        let strength = inputs.float("strength")? as f32;
        if strength == 0.0 {
            return Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, positive.clone()), Value::new(IoType::CONDITIONING, negative.clone())]));
        }
        let net = inputs.downcast::<ControlNetRef>("control_net")?.clone();
        let image = hint_from(inputs)?;
        let range = (inputs.float("start_percent")? as f32, inputs.float("end_percent")? as f32);
        // One new control per previous control, shared by every entry that had it.
        let mut made: Vec<(Option<Arc<Control>>, Arc<Control>)> = Vec::new();
        let mut apply = |list: &CondList| -> CondList {
            CondList(
                list.0
                    .iter()
                    .map(|e| {
                        let same = |p: &Option<Arc<Control>>| match (p, &e.control) {
                            (None, None) => true,
                            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                            _ => false,
                        };
                        let c = match made.iter().find(|(p, _)| same(p)) {
                            Some((_, c)) => c.clone(),
                            None => {
                                let c = Arc::new(Control { net: net.clone(), image: image.clone(), strength, range, previous: e.control.clone(), apply_to_uncond: false });
                                made.push((e.control.clone(), c.clone()));
                                c
                            }
                        };
                        CondEntry { control: Some(c), ..e.clone() }
                    })
                    .collect(),
            )
        };
        let (pos, neg) = (apply(positive), apply(negative));
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, pos), Value::new(IoType::CONDITIONING, neg)]))
    }
}

/// ComfyUI's "Apply ControlNet (OLD)": one conditioning, the whole schedule; the sampler
/// gives the control to the negative's entries too when they have none
/// (`control_apply_to_uncond`).
struct ControlNetApply;

impl Node for ControlNetApply {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("ControlNetApply")
            .display_name("Apply ControlNet (OLD)")
            .category("conditioning/controlnet")
            .input(InputSpec::link("conditioning", IoType::CONDITIONING))
            .input(InputSpec::link("control_net", IoType::CONTROL_NET))
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(strength_input())
            .output("CONDITIONING", IoType::CONDITIONING)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let cond = inputs.downcast::<CondList>("conditioning")?;
        let strength = inputs.float("strength")? as f32;
        if strength == 0.0 {
            return Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, cond.clone())]));
        }
        let net = inputs.downcast::<ControlNetRef>("control_net")?.clone();
        let image = hint_from(inputs)?;
        let out = cond
            .0
            .iter()
            .map(|e| {
                let c = Control { net: net.clone(), image: image.clone(), strength, range: (0.0, 1.0), previous: e.control.clone(), apply_to_uncond: true };
                CondEntry { control: Some(Arc::new(c)), ..e.clone() }
            })
            .collect();
        Ok(Outputs::new(vec![Value::new(IoType::CONDITIONING, CondList(out))]))
    }
}

/// The ControlNets of one sampling run, ready to evaluate: each control's weights
/// pinned, checked against the UNet, and its hints resized per region size.
pub(crate) struct Controls {
    /// Distinct controls (by identity), each with its pinned weights.
    controls: Vec<(Arc<Control>, PinGuard<Weights>)>,
}

impl Controls {
    /// Every control of `entries` and the ones stacked under them.
    pub(crate) fn collect<'a>(rt: &Runtime, entries: impl Iterator<Item = &'a Option<Arc<Control>>>) -> Result<Self, NodeError> {
        let mut controls: Vec<(Arc<Control>, PinGuard<Weights>)> = Vec::new();
        for top in entries.flatten() {
            for c in top.chain() {
                if !controls.iter().any(|(k, _)| Arc::ptr_eq(k, c)) {
                    let pin = rt.pin(Module::ControlNet, &c.net.weights).map_err(|e| NodeError::msg(format!("ControlNet `{}`: {e}", c.net.name)))?;
                    controls.push((c.clone(), pin));
                }
            }
        }
        Ok(Controls { controls })
    }

    /// The ControlNet of each control, in [`Controls::collect`]'s order, checked
    /// against the sampled `unet` (whose attention heads it shares: a ControlNet is a
    /// copy of its UNet's encoder).
    pub(crate) fn nets(&self, unet: &UnetConfig) -> Result<Vec<ControlNet<'_>>, NodeError> {
        self.controls
            .iter()
            .map(|(c, w)| {
                let named = |e: sdflow_core::models::ModelError| NodeError::msg(format!("ControlNet `{}`: {e}", c.net.name));
                let mut cfg = ControlNetConfig::infer(w, cn::PREFIX).map_err(named)?;
                cfg.unet.heads = unet.heads;
                let net = ControlNet::new(w, cn::PREFIX, cfg).map_err(named)?;
                net.check_fits(unet).map_err(named)?;
                Ok(net)
            })
            .collect()
    }

    /// The index of `c` in the order of [`Controls::nets`].
    pub(crate) fn index(&self, c: &Arc<Control>) -> usize {
        self.controls.iter().position(|(k, _)| Arc::ptr_eq(k, c)).expect("every control of the entries was collected")
    }
}

/// The hint of `c` for a region of `w`×`h` pixels, as ComfyUI's `get_control`: the whole
/// image centre-cropped to the region's aspect and resized nearest-exact, in ggml order
/// [w, h, channels, images] with the ControlNet's `channels` first channels.
pub(crate) fn hint_for(c: &Control, w: usize, h: usize, channels: usize) -> Result<Vec<f32>, NodeError> {
    let img = &c.image;
    if img.channels < channels {
        return Err(NodeError::msg(format!("ControlNet `{}` takes {channels}-channel hints, the image has {}", c.net.name, img.channels)));
    }
    let s = scale_image(img, w, h, Method::NearestExact, true);
    let mut out = Vec::with_capacity(w * h * channels * img.n);
    for i in 0..img.n {
        for k in 0..channels {
            out.extend((0..w * h).map(|p| s.data[(i * w * h + p) * s.channels + k]));
        }
    }
    Ok(out)
}

/// Canny edges after sd.cpp's `preprocess_canny` (`preprocessing.hpp`), on a `w`×`h`
/// grey image: a 5×5 Gaussian (σ 1.4, scaled by 1/(2πσ²) and not renormalised),
/// Sobel gradients, magnitude over its maximum, non-maximum suppression, then
/// thresholds relative to the strongest edge (`high` of it; `low` of that) and one
/// raster pass of hysteresis. sd.cpp's quirks are kept so `--canny` gives its edges: the
/// direction test sends every angle up to 157.5° to the vertical neighbours (and above
/// that only the maximum survives), values under the low threshold stay as they are,
/// the outer three pixels are cleared, and hysteresis looks at six neighbours.
pub fn canny(gray: &[f32], w: usize, h: usize, high: f32, low: f32, weak: f32, strong: f32) -> Vec<f32> {
    let conv = |src: &[f32], k: &[f32], size: usize| -> Vec<f32> {
        let pad = (size / 2) as isize;
        let mut out = vec![0f32; w * h];
        for y in 0..h as isize {
            for x in 0..w as isize {
                let mut sum = 0f32;
                for ky in 0..size as isize {
                    let iy = y + ky - pad;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for kx in 0..size as isize {
                        let ix = x + kx - pad;
                        if ix < 0 || ix >= w as isize {
                            continue;
                        }
                        sum += src[(iy as usize) * w + ix as usize] * k[(ky as usize) * size + kx as usize];
                    }
                }
                out[(y as usize) * w + x as usize] = sum;
            }
        }
        out
    };
    let sigma = 1.4f32;
    let normal = 1.0 / (2.0 * std::f32::consts::PI * sigma * sigma);
    let gauss: Vec<f32> = (0..25)
        .map(|i| {
            let (gy, gx) = ((i / 5) as f32 - 2.0, (i % 5) as f32 - 2.0);
            (-(gx * gx + gy * gy) / (2.0 * sigma * sigma)).exp() * normal
        })
        .collect();
    let blurred = conv(gray, &gauss, 5);
    let ix = conv(&blurred, &[-1.0, 0.0, 1.0, -2.0, 0.0, 2.0, -1.0, 0.0, 1.0], 3);
    let iy = conv(&blurred, &[1.0, 2.0, 1.0, 0.0, 0.0, 0.0, -1.0, -2.0, -1.0], 3);
    let mut g: Vec<f32> = ix.iter().zip(&iy).map(|(a, b)| (a * a + b * b).sqrt()).collect();
    let max = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max != 0.0 && max.is_finite() {
        g.iter_mut().for_each(|v| *v /= max);
    }
    let mut img = vec![0f32; w * h];
    for y in 1..h.saturating_sub(1) {
        for x in 1..w.saturating_sub(1) {
            let i = y * w + x;
            let mut angle = iy[i].atan2(ix[i]).to_degrees();
            if angle < 0.0 {
                angle += 180.0;
            }
            let (q, r) = if angle <= 157.5 { (g[i + w], g[i - w]) } else { (1.0, 1.0) };
            img[i] = if g[i] >= q && g[i] >= r { g[i] } else { 0.0 };
        }
    }
    let max = img.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let ht = max * high;
    let lt = ht * low;
    for v in img.iter_mut() {
        if *v >= ht {
            *v = strong;
        } else if *v >= lt {
            *v = weak;
        }
    }
    for y in 0..h {
        for x in 0..w {
            if !(x >= 3 && x + 3 <= w && y >= 3 && y + 3 <= h) {
                img[y * w + x] = 0.0;
            }
        }
    }
    for y in 1..h.saturating_sub(1) {
        for x in 1..w.saturating_sub(1) {
            let i = y * w + x;
            if img[i] == weak {
                let linked = [img[i - w + 1], img[i + 1], img[i - w], img[i + w], img[i - w - 1], img[i - 1]].contains(&strong);
                img[i] = if linked { strong } else { 0.0 };
            }
        }
    }
    img
}

/// ComfyUI's "Canny" with sd.cpp's algorithm ([`canny`]): `high_threshold` is a fraction
/// of the strongest edge, `low_threshold` a fraction of the high one (sd-cli's `--canny`
/// uses 0.08 and 0.08). The edges come out as a grey RGB image in 8-bit steps, as
/// sd.cpp writes them back into its image.
struct Canny;

impl Node for Canny {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("Canny")
            .display_name("Canny")
            .category("image/preprocessors")
            .description("Canny edges for a canny ControlNet, with sd.cpp's preprocessing (--canny): thresholds relative to the strongest edge.")
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::float("low_threshold", 0.4).float_range(0.01, 0.99).float_step(0.01).tooltip("Weak edges: this fraction of the high threshold."))
            .input(InputSpec::float("high_threshold", 0.8).float_range(0.01, 0.99).float_step(0.01).tooltip("Strong edges: this fraction of the strongest edge."))
            .output("IMAGE", IoType::IMAGE)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let img = hint_from(inputs)?;
        let (low, high) = (inputs.float("low_threshold")? as f32, inputs.float("high_threshold")? as f32);
        let (w, h, c) = (img.width, img.height, img.channels);
        let mut data = Vec::with_capacity(img.n * w * h * 3);
        for i in 0..img.n {
            let px = &img.data[i * w * h * c..(i + 1) * w * h * c];
            let gray: Vec<f32> = px.chunks(c).map(|p| if c >= 3 { 0.2989 * p[0] + 0.5870 * p[1] + 0.1140 * p[2] } else { p[0] }).collect();
            for v in canny(&gray, w, h, high, low, 0.8, 1.0) {
                let q = (v.clamp(0.0, 1.0) * 255.0 + 0.5).floor() / 255.0;
                data.extend([q, q, q]);
            }
        }
        Ok(Outputs::new(vec![Value::new(IoType::IMAGE, Image { data, n: img.n, height: h, width: w, channels: 3 })]))
    }
}

#[cfg(test)]
mod tests {
    use super::canny;

    #[test]
    fn canny_finds_a_horizontal_edge_and_keeps_the_border_clear() {
        // A bright lower part: the gradient is vertical, the edge a horizontal line
        // (the zero padding makes edges at the image's sides too: not looked at).
        let (w, h) = (24, 30);
        let gray: Vec<f32> = (0..w * h).map(|i| if i / w >= 10 { 1.0 } else { 0.0 }).collect();
        let e = canny(&gray, w, h, 0.08, 0.08, 0.8, 1.0);
        for y in 0..h {
            for x in 0..w {
                if x < 3 || x + 3 > w || y < 3 || y + 3 > h {
                    assert_eq!(e[y * w + x], 0.0, "border ({x}, {y})");
                }
            }
        }
        for x in 6..w - 6 {
            let col: Vec<f32> = (3..22).map(|y| e[y * w + x]).collect();
            // Rows 9 and 10 straddle the step (which survives suppression is rounding).
            assert!(col[6] == 1.0 || col[7] == 1.0, "column {x} crosses the edge: {col:?}");
            assert!(col.iter().enumerate().all(|(k, &v)| k == 6 || k == 7 || v < 0.08), "column {x} away from the edge: {col:?}");
        }
    }
}
