//! YOLOv8 object detection (the ADetailer detector) as a ggml graph.
//!
//! Two files load: an Ultralytics `.pt` checkpoint, whose pickled `DetectionModel` the safe
//! unpickler walks as a module tree (`model.model.0.conv.weight`, `model.model.0.bn.*`;
//! `ema.model.*` preferred in training checkpoints, as Ultralytics does),
//! with every BatchNorm folded into its convolution here; and sd.cpp's converted
//! safetensors (`scripts/convert_yolov8_to_safetensors.py`), which holds the same network
//! already fused (`model.0.conv.weight` f16 + `model.0.conv.bias` f32, no `.bn.`, no DFL
//! weight). Widths, bottleneck counts, classes and `reg_max` are read off the shapes; the
//! layer graph is YOLOv8's (`yolov8.yaml`, the same for n/s/m/l/x).
//!
//! Inference follows Ultralytics' predictor: a square letterbox (keep the aspect ratio,
//! bilinear resize, pad with gray 114 around the centre), the network, then the decode of
//! the Detect head (DFL expectation over `reg_max` bins, anchors at cell centres times the
//! strides 8/16/32), a confidence threshold on the best class's sigmoid, per-class (or
//! class-agnostic) greedy NMS in letterbox space, at most `max_detections`, and boxes
//! mapped back to the image and clipped.

use super::nn::conv2d;
use super::{ModelError, Result, WeightSpec, Weights};
use crate::dtype::{self, DType};
use crate::ggml::{Backend, Context, GType, GraphRun, Tensor};
use crate::io::TensorSource;
use std::collections::{BTreeMap, BTreeSet};

/// Ultralytics sets every BatchNorm2d's eps to 1e-3 (`initialize_weights`); the
/// checkpoints carry it as a module attribute, not a tensor.
pub const BN_EPS: f32 = 1e-3;
/// Output strides of the three Detect inputs (P3, P4, P5).
pub const STRIDES: [usize; 3] = [8, 16, 32];
/// The letterbox's pad value, Ultralytics' gray 114.
pub const PAD_VALUE: f32 = 114.0 / 255.0;
/// Index of the Detect layer in YOLOv8's layer list.
const DETECT: usize = 22;

/// C2f layers of `yolov8.yaml` and whether their bottlenecks add the shortcut (the
/// backbone's do, the neck's do not).
const C2F: [(usize, bool); 8] = [(2, true), (4, true), (6, true), (8, true), (12, false), (15, false), (18, false), (21, false)];

/// What the weights say about the network.
#[derive(Clone, Debug, PartialEq)]
pub struct YoloConfig {
    pub num_classes: usize,
    pub reg_max: usize,
    /// Bottlenecks in each C2f of [`C2F`], in that order.
    pub c2f_blocks: [usize; 8],
    /// Channels into the Detect head at P3, P4, P5.
    pub head_channels: [i64; 3],
    /// Class names when the file has them (sd.cpp's `yolov8.names` metadata).
    pub names: BTreeMap<usize, String>,
    /// Square input size the file was converted for (`yolov8.input_size`), if it says.
    pub input_size: Option<usize>,
}

/// One detection in image pixels.
#[derive(Clone, Debug, PartialEq)]
pub struct Detection {
    pub x1: f32,
    pub y1: f32,
    pub x2: f32,
    pub y2: f32,
    pub confidence: f32,
    pub class_id: usize,
}

impl Detection {
    pub fn area(&self) -> f32 {
        (self.x2 - self.x1).max(0.0) * (self.y2 - self.y1).max(0.0)
    }
}

/// Detection settings; the defaults are sd.cpp's `--extra-ad-args` ones.
#[derive(Clone, Debug, PartialEq)]
pub struct DetectParams {
    /// Square network input; a multiple of 32.
    pub input_size: usize,
    /// Minimum best-class score kept.
    pub confidence: f32,
    /// IoU above which a lower-scored box is suppressed.
    pub nms: f32,
    pub max_detections: usize,
    /// Suppress across classes (Ultralytics' `agnostic_nms`); sd.cpp suppresses per class.
    pub class_agnostic: bool,
}

impl Default for DetectParams {
    fn default() -> Self {
        DetectParams { input_size: 640, confidence: 0.3, nms: 0.45, max_detections: 100, class_agnostic: false }
    }
}

impl DetectParams {
    pub fn validate(&self) -> Result<()> {
        if self.input_size < 32 || self.input_size % 32 != 0 {
            return Err(ModelError::Input(format!("YOLOv8 input_size {} is not a positive multiple of 32", self.input_size)));
        }
        if !(0.0..=1.0).contains(&self.confidence) || !(0.0..=1.0).contains(&self.nms) {
            return Err(ModelError::Input(format!("confidence {} and nms {} must lie in 0..=1", self.confidence, self.nms)));
        }
        Ok(())
    }
}

/// A letterboxed network input: planar RGB [3, size, size] and how it maps to the image.
#[derive(Clone, Debug)]
pub struct Letterbox {
    pub data: Vec<f32>,
    pub size: usize,
    pub scale: f32,
    pub pad_x: usize,
    pub pad_y: usize,
}

/// Ultralytics' `LetterBox(auto=False)` on an interleaved RGB image (`hwc`, H×W×3 floats
/// in 0..1): scale by min(size/w, size/h), resize bilinearly (OpenCV's INTER_LINEAR:
/// half-pixel centres, edges clamped), centre on gray.
pub fn letterbox(hwc: &[f32], width: usize, height: usize, size: usize) -> Result<Letterbox> {
    if width == 0 || height == 0 || hwc.len() != width * height * 3 {
        return Err(ModelError::Input(format!("a {width}x{height} RGB image with {} values", hwc.len())));
    }
    let scale = (size as f32 / width as f32).min(size as f32 / height as f32);
    let rw = ((width as f32 * scale).round() as usize).clamp(1, size);
    let rh = ((height as f32 * scale).round() as usize).clamp(1, size);
    // Ultralytics: left = round(dw - 0.1) with dw = (size - rw) / 2, i.e. the floor.
    let (pad_x, pad_y) = ((size - rw) / 2, (size - rh) / 2);
    let mut data = vec![PAD_VALUE; 3 * size * size];
    // The resize scale per axis is the exact ratio of the sizes, as cv2.resize uses.
    let (sx, sy) = (width as f32 / rw as f32, height as f32 / rh as f32);
    let taps = |o: usize, s: f32, n: usize| -> (usize, usize, f32) {
        let f = ((o as f32 + 0.5) * s - 0.5).max(0.0);
        let i0 = (f.floor() as usize).min(n - 1);
        let i1 = (i0 + 1).min(n - 1);
        (i0, i1, f - i0 as f32)
    };
    for y in 0..rh {
        let (y0, y1, wy) = taps(y, sy, height);
        for x in 0..rw {
            let (x0, x1, wx) = taps(x, sx, width);
            for c in 0..3 {
                let p = |xx: usize, yy: usize| hwc[(yy * width + xx) * 3 + c];
                let top = p(x0, y0) * (1.0 - wx) + p(x1, y0) * wx;
                let bot = p(x0, y1) * (1.0 - wx) + p(x1, y1) * wx;
                data[(c * size + y + pad_y) * size + x + pad_x] = top * (1.0 - wy) + bot * wy;
            }
        }
    }
    Ok(Letterbox { data, size, scale, pad_x, pad_y })
}

/// A loaded detector.
pub struct Yolo {
    weights: Weights,
    pub config: YoloConfig,
}

impl super::Placeable for Yolo {
    fn copy_to(&self, target: &crate::ggml::BufferType) -> Result<Self> {
        Ok(Yolo { weights: self.weights.copy_to(target)?, config: self.config.clone() })
    }
}

impl crate::residency::Resident for Yolo {
    fn footprint(&self) -> crate::residency::Footprint {
        self.weights.footprint()
    }
}

/// How one weight of the fused network is made from the file.
enum Plan {
    /// Stored as is (converted file, or the head's plain convolutions).
    Copy(String),
    /// `conv.weight` scaled per output channel by gamma / sqrt(var + eps).
    FusedWeight { conv: String, bn: String },
    /// beta - mean·gamma / sqrt(var + eps) (plus the conv's own bias, if it has one).
    FusedBias { conv_bias: Option<String>, bn: String },
}

/// Fused weight name → PyTorch shape.
type Shapes = BTreeMap<String, Vec<usize>>;

fn read_f32(src: &dyn TensorSource, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let werr = |d: String| ModelError::Weight { name: name.to_string(), detail: d };
    let info = src.get(name).ok_or_else(|| ModelError::MissingWeight(name.to_string()))?;
    let bytes = src.read(name).map_err(|e| werr(e.to_string()))?;
    let f = if info.dtype == DType::F32 { bytes.into_owned() } else { dtype::convert(info.dtype, &bytes, &info.shape, DType::F32).map_err(|e| werr(e.to_string()))? };
    Ok((info.shape.clone(), f.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
}

impl Yolo {
    /// Load an Ultralytics `.pt` or an sd.cpp-converted safetensors detector onto `backend`.
    pub fn load(backend: &(impl crate::ggml::AllocTarget + ?Sized), src: &dyn TensorSource) -> Result<Self> {
        let in_file = |e: ModelError| match e {
            ModelError::Config(m) => ModelError::Config(format!("{}: {m}", src.path().display())),
            other => other,
        };
        let (plans, shapes) = Self::plan(src).map_err(in_file)?;
        let specs: Vec<WeightSpec> = shapes.iter().map(|(name, shape)| WeightSpec { name: name.clone(), ty: GType::F32, ne: shape.iter().rev().map(|&d| d as i64).collect() }).collect();
        let weights = Weights::new(backend, &specs, |spec| {
            let values = match &plans[&spec.name] {
                Plan::Copy(orig) => read_f32(src, orig)?.1,
                Plan::FusedWeight { conv, bn } => {
                    let (shape, mut w) = read_f32(src, conv)?;
                    let k = bn_scale(src, bn, shape[0])?;
                    let per = w.len() / shape[0];
                    for (o, chunk) in w.chunks_mut(per).enumerate() {
                        chunk.iter_mut().for_each(|v| *v *= k[o]);
                    }
                    w
                }
                Plan::FusedBias { conv_bias, bn } => {
                    let (_, mean) = read_f32(src, &format!("{bn}.running_mean"))?;
                    let (_, beta) = read_f32(src, &format!("{bn}.bias"))?;
                    let k = bn_scale(src, bn, mean.len())?;
                    let b0 = match conv_bias {
                        Some(n) => read_f32(src, n)?.1,
                        None => vec![0.0; mean.len()],
                    };
                    if beta.len() != mean.len() || b0.len() != mean.len() {
                        return Err(ModelError::Weight { name: bn.clone(), detail: "BatchNorm vectors differ in length".into() });
                    }
                    (0..mean.len()).map(|o| beta[o] + (b0[o] - mean[o]) * k[o]).collect()
                }
            };
            Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })?;
        let mut config = Self::infer(&weights).map_err(in_file)?;
        let meta = src.metadata();
        if let Some(names) = meta.get("yolov8.names") {
            let parsed: BTreeMap<String, String> = serde_json::from_str(names).map_err(|e| in_file(ModelError::Config(format!("metadata yolov8.names is not a JSON object of names: {e}"))))?;
            for (k, v) in parsed {
                let id = k.parse().map_err(|_| in_file(ModelError::Config(format!("metadata yolov8.names has a non-numeric class id `{k}`"))))?;
                config.names.insert(id, v);
            }
        }
        if let Some(s) = meta.get("yolov8.input_size") {
            config.input_size = Some(s.parse().map_err(|_| in_file(ModelError::Config(format!("metadata yolov8.input_size `{s}` is not a number"))))?);
        }
        Ok(Yolo { weights, config })
    }

    /// The fused weight names (`model.N...`), their PyTorch shapes and where each comes from.
    fn plan(src: &dyn TensorSource) -> Result<(BTreeMap<String, Plan>, Shapes)> {
        let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
        // An Ultralytics checkpoint nests the network as `model` (a DetectionModel whose
        // layers are its `model` ModuleList), and a training one also as `ema`, which
        // Ultralytics prefers when present; sd.cpp's file has the ModuleList's names.
        let strip = if names.iter().any(|n| n.starts_with("ema.model.")) {
            "ema."
        } else if names.iter().any(|n| n.starts_with("model.model.")) {
            "model."
        } else {
            ""
        };
        let local: BTreeMap<String, &str> = names.iter().filter_map(|&n| n.strip_prefix(strip).filter(|s| s.starts_with("model.")).map(|s| (s.to_string(), n))).collect();
        if local.is_empty() {
            return Err(ModelError::Config("not a YOLOv8 detector: no `model.*` tensors".into()));
        }
        let shape = |n: &str| src.get(local[n]).map(|t| t.shape.clone()).unwrap_or_default();
        let mut plans = BTreeMap::new();
        let mut shapes = BTreeMap::new();
        let mut used = BTreeSet::new();
        for (name, &orig) in &local {
            // Ultralytics' Conv: `<p>.conv` (no bias) + `<p>.bn`, or fused `<p>.conv` + bias.
            let Some(p) = name.strip_suffix(".conv.weight") else { continue };
            if name.ends_with(".dfl.conv.weight") {
                continue;
            }
            let bn = format!("{p}.bn");
            let wname = format!("{p}.conv.weight");
            let bname = format!("{p}.conv.bias");
            let cout = shape(name).first().copied().unwrap_or(0);
            used.insert(name.clone());
            if local.contains_key(&format!("{bn}.weight")) {
                for leaf in ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"] {
                    used.insert(format!("{bn}.{leaf}"));
                }
                let conv_bias = local.get(&bname).map(|s| s.to_string());
                used.insert(bname.clone());
                plans.insert(wname.clone(), Plan::FusedWeight { conv: orig.to_string(), bn: format!("{strip}{bn}") });
                plans.insert(bname.clone(), Plan::FusedBias { conv_bias, bn: format!("{strip}{bn}") });
            } else {
                let b = local.get(&bname).ok_or_else(|| ModelError::MissingWeight(format!("{strip}{bname} (or {strip}{bn}.*)")))?;
                used.insert(bname.clone());
                plans.insert(wname.clone(), Plan::Copy(orig.to_string()));
                plans.insert(bname.clone(), Plan::Copy(b.to_string()));
            }
            shapes.insert(wname, shape(name));
            shapes.insert(bname, vec![cout]);
        }
        // The head's last convolutions are plain nn.Conv2d with a bias.
        for i in 0..3 {
            for branch in ["cv2", "cv3"] {
                for leaf in ["weight", "bias"] {
                    let n = format!("model.{DETECT}.{branch}.{i}.2.{leaf}");
                    let orig = local.get(&n).ok_or_else(|| ModelError::MissingWeight(format!("{strip}{n}")))?;
                    used.insert(n.clone());
                    plans.insert(n.clone(), Plan::Copy(orig.to_string()));
                    shapes.insert(n.clone(), shape(&n));
                }
            }
        }
        used.insert(format!("model.{DETECT}.dfl.conv.weight"));
        if let Some(extra) = local.keys().find(|n| !used.contains(*n)) {
            let what = if extra.starts_with(&format!("model.{DETECT}.cv4")) || extra.starts_with(&format!("model.{DETECT}.proto")) {
                "segmentation and pose heads are not supported, only YOLOv8 detection"
            } else {
                "not part of a YOLOv8 detector"
            };
            return Err(ModelError::Config(format!("tensor `{strip}{extra}`: {what}")));
        }
        Ok((plans, shapes))
    }

    /// Check every weight against YOLOv8's layer graph and read the widths off it.
    fn infer(w: &Weights) -> Result<YoloConfig> {
        let mut seen = BTreeSet::new();
        // A Conv at `p` from `cin` channels with a k×k kernel; returns its output channels.
        let conv = |p: &str, cin: i64, k: i64, seen: &mut BTreeSet<String>| -> Result<i64> {
            let name = format!("{p}.weight");
            let cout = w.get(&name)?.ne()[3];
            w.expect(&name, &[k, k, cin, cout])?;
            w.expect(&format!("{p}.bias"), &[cout])?;
            seen.insert(name);
            seen.insert(format!("{p}.bias"));
            Ok(cout)
        };
        let mut c = [0i64; DETECT];
        let mut blocks = [0usize; 8];
        let c2f = |i: usize, cin: i64, blocks: &mut [usize; 8], seen: &mut BTreeSet<String>| -> Result<i64> {
            let hidden2 = conv(&format!("model.{i}.cv1.conv"), cin, 1, seen)?;
            if hidden2 % 2 != 0 {
                return Err(ModelError::Config(format!("C2f model.{i}: cv1 has an odd {hidden2} outputs")));
            }
            let h = hidden2 / 2;
            let n = (0..).take_while(|j| w.contains(&format!("model.{i}.m.{j}.cv1.conv.weight"))).count();
            for j in 0..n {
                conv(&format!("model.{i}.m.{j}.cv1.conv"), h, 3, seen)?;
                let o = conv(&format!("model.{i}.m.{j}.cv2.conv"), h, 3, seen)?;
                if o != h {
                    return Err(ModelError::Config(format!("C2f model.{i}.m.{j}: bottleneck outputs {o}, not {h}")));
                }
            }
            let slot = C2F.iter().position(|&(l, _)| l == i).expect("a C2f layer");
            blocks[slot] = n;
            conv(&format!("model.{i}.cv2.conv"), (2 + n as i64) * h, 1, seen)
        };
        c[0] = conv("model.0.conv", 3, 3, &mut seen)?;
        c[1] = conv("model.1.conv", c[0], 3, &mut seen)?;
        c[2] = c2f(2, c[1], &mut blocks, &mut seen)?;
        c[3] = conv("model.3.conv", c[2], 3, &mut seen)?;
        c[4] = c2f(4, c[3], &mut blocks, &mut seen)?;
        c[5] = conv("model.5.conv", c[4], 3, &mut seen)?;
        c[6] = c2f(6, c[5], &mut blocks, &mut seen)?;
        c[7] = conv("model.7.conv", c[6], 3, &mut seen)?;
        c[8] = c2f(8, c[7], &mut blocks, &mut seen)?;
        let s = conv("model.9.cv1.conv", c[8], 1, &mut seen)?;
        c[9] = conv("model.9.cv2.conv", 4 * s, 1, &mut seen)?;
        c[12] = c2f(12, c[9] + c[6], &mut blocks, &mut seen)?;
        c[15] = c2f(15, c[12] + c[4], &mut blocks, &mut seen)?;
        c[16] = conv("model.16.conv", c[15], 3, &mut seen)?;
        c[18] = c2f(18, c[16] + c[12], &mut blocks, &mut seen)?;
        c[19] = conv("model.19.conv", c[18], 3, &mut seen)?;
        c[21] = c2f(21, c[19] + c[9], &mut blocks, &mut seen)?;
        let head = [c[15], c[18], c[21]];
        let (mut box_out, mut cls_out) = (None, None);
        for (i, &ch) in head.iter().enumerate() {
            for (branch, out) in [("cv2", &mut box_out), ("cv3", &mut cls_out)] {
                let p = format!("model.{DETECT}.{branch}.{i}");
                let a = conv(&format!("{p}.0.conv"), ch, 3, &mut seen)?;
                let b = conv(&format!("{p}.1.conv"), a, 3, &mut seen)?;
                let o = conv(&format!("{p}.2"), b, 1, &mut seen)?;
                if *out.get_or_insert(o) != o {
                    return Err(ModelError::Config(format!("Detect {p}: {o} outputs, the other levels have {}", out.unwrap_or(0))));
                }
            }
        }
        let (box_out, nc) = (box_out.unwrap_or(0), cls_out.unwrap_or(0));
        if box_out % 4 != 0 || box_out == 0 || nc == 0 {
            return Err(ModelError::Config(format!("Detect head with {box_out} box and {nc} class outputs")));
        }
        if let Some(extra) = w.names().find(|n| !seen.contains(*n)) {
            return Err(ModelError::Config(format!("tensor `{extra}` is not part of YOLOv8's layer graph")));
        }
        Ok(YoloConfig { num_classes: nc as usize, reg_max: box_out as usize / 4, c2f_blocks: blocks, head_channels: head, names: BTreeMap::new(), input_size: None })
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Output channels per anchor: 4·reg_max box logits then the class logits.
    pub fn channels(&self) -> usize {
        4 * self.config.reg_max + self.config.num_classes
    }

    /// Nodes in one forward graph, with room to spare.
    pub fn graph_size(&self) -> usize {
        1024 + self.config.c2f_blocks.iter().sum::<usize>() * 16
    }

    /// Conv + SiLU at `p` (`p.conv.weight`), padding k/2.
    fn conv<'a>(&'a self, ctx: &'a Context, p: &str, x: Tensor<'a>, stride: i32) -> Result<Tensor<'a>> {
        let k = self.weights.get(&format!("{p}.conv.weight"))?.ne()[0] as i32;
        Ok(ctx.silu(conv2d(ctx, &self.weights, &format!("{p}.conv"), x, stride, k / 2)?)?)
    }

    fn c2f<'a>(&'a self, ctx: &'a Context, i: usize, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let slot = C2F.iter().position(|&(l, _)| l == i).expect("a C2f layer");
        let (n, shortcut) = (self.config.c2f_blocks[slot], C2F[slot].1);
        let y = self.conv(ctx, &format!("model.{i}.cv1"), x, 1)?;
        let [w, h, c2, b] = y.ne();
        let c = c2 / 2;
        let nb = y.nb();
        // chunk(2, dim=1): the second half as a view; the first is kept whole in `cat`.
        let mut last = ctx.view(y, [w, h, c, b], [nb[1], nb[2], nb[3]], c as usize * nb[2])?;
        let mut cat = y;
        for j in 0..n {
            let m = self.conv(ctx, &format!("model.{i}.m.{j}.cv1"), last, 1)?;
            let m = self.conv(ctx, &format!("model.{i}.m.{j}.cv2"), m, 1)?;
            last = if shortcut { ctx.add(m, last)? } else { m };
            cat = ctx.concat(cat, last, 2)?;
        }
        self.conv(ctx, &format!("model.{i}.cv2"), cat, 1)
    }

    /// The network on one letterboxed image x [S, S, 3, 1] → raw head outputs
    /// [anchors, 4·reg_max + classes] (anchor fastest; P3's cells row by row, then P4, P5).
    pub fn forward<'a>(&'a self, ctx: &'a Context, x: Tensor<'a>) -> Result<Tensor<'a>> {
        let n = x.ne();
        if n[2] != 3 || n[3] != 1 || n[0] % 32 != 0 || n[1] % 32 != 0 || n[0] < 32 || n[1] < 32 {
            return Err(ModelError::Input(format!("YOLOv8 input {n:?}, expected [W, H, 3, 1] with W and H multiples of 32")));
        }
        let x0 = self.conv(ctx, "model.0", x, 2)?;
        let x1 = self.conv(ctx, "model.1", x0, 2)?;
        let x2 = self.c2f(ctx, 2, x1)?;
        let x3 = self.conv(ctx, "model.3", x2, 2)?;
        let p3 = self.c2f(ctx, 4, x3)?;
        let x5 = self.conv(ctx, "model.5", p3, 2)?;
        let p4 = self.c2f(ctx, 6, x5)?;
        let x7 = self.conv(ctx, "model.7", p4, 2)?;
        let x8 = self.c2f(ctx, 8, x7)?;
        // SPPF: three chained 5×5 max pools, concatenated with their input.
        let s = self.conv(ctx, "model.9.cv1", x8, 1)?;
        let y1 = ctx.max_pool_2d(s, 5, 1, 2)?;
        let y2 = ctx.max_pool_2d(y1, 5, 1, 2)?;
        let y3 = ctx.max_pool_2d(y2, 5, 1, 2)?;
        let p5 = self.conv(ctx, "model.9.cv2", ctx.concat(ctx.concat(ctx.concat(s, y1, 2)?, y2, 2)?, y3, 2)?, 1)?;
        let x12 = self.c2f(ctx, 12, ctx.concat(ctx.upscale(p5, 2)?, p4, 2)?)?;
        let x15 = self.c2f(ctx, 15, ctx.concat(ctx.upscale(x12, 2)?, p3, 2)?)?;
        let x18 = self.c2f(ctx, 18, ctx.concat(self.conv(ctx, "model.16", x15, 2)?, x12, 2)?)?;
        let x21 = self.c2f(ctx, 21, ctx.concat(self.conv(ctx, "model.19", x18, 2)?, p5, 2)?)?;
        let mut out: Option<Tensor<'a>> = None;
        for (i, feat) in [x15, x18, x21].into_iter().enumerate() {
            let branch = |name: &str| -> Result<Tensor<'a>> {
                let p = format!("model.{DETECT}.{name}.{i}");
                let h = self.conv(ctx, &format!("{p}.0"), feat, 1)?;
                let h = self.conv(ctx, &format!("{p}.1"), h, 1)?;
                conv2d(ctx, &self.weights, &format!("{p}.2"), h, 1, 0)
            };
            let level = ctx.concat(branch("cv2")?, branch("cv3")?, 2)?;
            let [w, h, ch, _] = level.ne();
            let level = ctx.reshape(level, [w * h, ch, 1, 1])?;
            out = Some(match out {
                None => level,
                Some(o) => ctx.concat(o, level, 0)?,
            });
        }
        Ok(out.expect("three levels"))
    }

    /// Raw head outputs for one planar [3, size, size] input (see [`Yolo::forward`]).
    pub fn raw_outputs(&self, backend: &Backend, planar: Vec<f32>, size: usize) -> Result<Vec<f32>> {
        let g = self.graph_size();
        let ctx = Context::new(g, g)?;
        let mut run = GraphRun::new(&ctx);
        let x = run.input_f32(&[size as i64, size as i64, 3, 1], planar)?;
        let y = self.forward(&ctx, x)?;
        Ok(run.compute(backend, &[y], g)?.remove(0))
    }

    /// Detect in one interleaved RGB image (H×W×3 floats in 0..1).
    pub fn detect(&self, backend: &Backend, hwc: &[f32], width: usize, height: usize, params: &DetectParams) -> Result<Vec<Detection>> {
        params.validate()?;
        let lb = letterbox(hwc, width, height, params.input_size)?;
        let raw = self.raw_outputs(backend, lb.data.clone(), lb.size)?;
        Ok(decode(&raw, &self.config, &lb, width, height, params))
    }
}

/// gamma / sqrt(running_var + eps) for the BatchNorm at `bn`, `n` channels.
fn bn_scale(src: &dyn TensorSource, bn: &str, n: usize) -> Result<Vec<f32>> {
    let (_, gamma) = read_f32(src, &format!("{bn}.weight"))?;
    let (_, var) = read_f32(src, &format!("{bn}.running_var"))?;
    if gamma.len() != n || var.len() != n {
        return Err(ModelError::Weight { name: bn.to_string(), detail: format!("BatchNorm of {} / {} channels for a conv of {n}", gamma.len(), var.len()) });
    }
    Ok(gamma.iter().zip(&var).map(|(g, v)| g / (v + BN_EPS).sqrt()).collect())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Softmax expectation over `reg_max` bins of channels `c0..c0+reg_max` at `anchor`.
fn dfl(raw: &[f32], anchors: usize, c0: usize, reg_max: usize, anchor: usize) -> f32 {
    let v = |i: usize| raw[anchor + anchors * (c0 + i)];
    let m = (0..reg_max).map(v).fold(f32::NEG_INFINITY, f32::max);
    let (mut num, mut den) = (0.0f32, 0.0f32);
    for i in 0..reg_max {
        let e = (v(i) - m).exp();
        den += e;
        num += e * i as f32;
    }
    num / den
}

fn iou(a: &Detection, b: &Detection) -> f32 {
    let iw = (a.x2.min(b.x2) - a.x1.max(b.x1)).max(0.0);
    let ih = (a.y2.min(b.y2) - a.y1.max(b.y1)).max(0.0);
    let inter = iw * ih;
    let union = a.area() + b.area() - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// Boxes from raw head outputs of a `lb.size` square input for a `width`×`height` image.
pub fn decode(raw: &[f32], config: &YoloConfig, lb: &Letterbox, width: usize, height: usize, params: &DetectParams) -> Vec<Detection> {
    let reg = config.reg_max;
    let grids: Vec<(usize, usize)> = STRIDES.iter().map(|&s| (s, lb.size / s)).collect();
    let anchors: usize = grids.iter().map(|&(_, g)| g * g).sum();
    if raw.len() != anchors * (4 * reg + config.num_classes) {
        return Vec::new();
    }
    let mut cands = Vec::new();
    let mut base = 0;
    for &(stride, g) in &grids {
        for local in 0..g * g {
            let a = base + local;
            let (mut best, mut class_id) = (f32::NEG_INFINITY, 0);
            for c in 0..config.num_classes {
                let v = raw[a + anchors * (4 * reg + c)];
                if v > best {
                    best = v;
                    class_id = c;
                }
            }
            let confidence = sigmoid(best);
            if confidence <= params.confidence {
                continue;
            }
            let (cx, cy) = ((local % g) as f32 + 0.5, (local / g) as f32 + 0.5);
            let s = stride as f32;
            let d: Vec<f32> = (0..4).map(|k| dfl(raw, anchors, k * reg, reg, a)).collect();
            cands.push(Detection { x1: (cx - d[0]) * s, y1: (cy - d[1]) * s, x2: (cx + d[2]) * s, y2: (cy + d[3]) * s, confidence, class_id });
        }
        base += g * g;
    }
    // Stable, so equal scores keep anchor order.
    cands.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    let mut kept: Vec<Detection> = Vec::new();
    for c in cands {
        if kept.len() >= params.max_detections {
            break;
        }
        if kept.iter().any(|k| (params.class_agnostic || k.class_id == c.class_id) && iou(k, &c) > params.nms) {
            continue;
        }
        kept.push(c);
    }
    let (px, py) = (lb.pad_x as f32, lb.pad_y as f32);
    kept.into_iter()
        .map(|d| Detection {
            x1: ((d.x1 - px) / lb.scale).clamp(0.0, width as f32),
            y1: ((d.y1 - py) / lb.scale).clamp(0.0, height as f32),
            x2: ((d.x2 - px) / lb.scale).clamp(0.0, width as f32),
            y2: ((d.y2 - py) / lb.scale).clamp(0.0, height as f32),
            ..d
        })
        .collect()
}
