//! Object detection for ADetailer: UltralyticsDetectorProvider (Impact Pack's loader name;
//! a YOLOv8 detector from models/ultralytics, Ultralytics `.pt` or sd.cpp's converted
//! safetensors) and BboxDetectorMasks, which detects in an image and turns the boxes into
//! masks with every mask option of sd.cpp's `--extra-ad-args` (confidence, nms,
//! max_detections, input_size, mask_k_largest, mask_min_ratio, mask_max_ratio,
//! dilate_erode, x_offset, y_offset, mask_mode / merge / invert, sort_by).
//!
//! The mask steps follow sd.cpp's detailer (`filter_and_sort_detections`, `bbox_mask`,
//! `offset_mask`, `morphology_mask`, merge and invert), in that order; `gaussian_blur` is
//! its composite feather.

use sdflow_core::placement::Module;
use crate::err;
use crate::runtime::Runtime;
use crate::values::{Image, Mask};
use sdflow_core::io;
use sdflow_core::models::yolo::{DetectParams, Detection, Yolo};
use sdflow_core::residency::{Device, WeightHandle, WeightKey};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Lane, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::path::PathBuf;
use std::sync::Arc;

/// Model folder kind, as Impact Pack's `models/ultralytics`.
const KIND: &str = "ultralytics";
/// Impact Pack's socket type for box detectors.
pub const BBOX_DETECTOR: IoType = IoType::from_static("BBOX_DETECTOR");

pub fn register(registry: &mut Registry, rt: &Arc<Runtime>) {
    registry.register(Arc::new(UltralyticsDetectorProvider { rt: rt.clone() }));
    registry.register(Arc::new(BboxDetectorMasks { rt: rt.clone() }));
}

/// BBOX_DETECTOR: a YOLOv8 detector as a residency handle.
#[derive(Clone, Debug)]
pub struct DetectorRef {
    pub weights: WeightHandle<Yolo>,
    pub name: String,
}
crate::handle_size!(DetectorRef);

/// How the masks of several detections are combined (sd.cpp's `mask_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskMode {
    /// One mask per detection.
    None,
    /// One mask, the union.
    Merge,
    /// One mask, everything but the union.
    MergeInvert,
}

impl MaskMode {
    pub const NAMES: [&'static str; 3] = ["none", "merge", "merge_invert"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => MaskMode::None,
            "merge" => MaskMode::Merge,
            "merge_invert" => MaskMode::MergeInvert,
            _ => return None,
        })
    }
}

/// Order in which masks are processed (sd.cpp's `sort_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    /// Detector order: by confidence.
    None,
    LeftToRight,
    CenterToEdge,
    /// Largest first.
    Area,
}

impl SortBy {
    pub const NAMES: [&'static str; 4] = ["none", "left_to_right", "center_to_edge", "area"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => SortBy::None,
            "left_to_right" => SortBy::LeftToRight,
            "center_to_edge" => SortBy::CenterToEdge,
            "area" => SortBy::Area,
            _ => return None,
        })
    }
}

/// The mask options; defaults are sd.cpp's.
#[derive(Clone, Debug, PartialEq)]
pub struct MaskOptions {
    /// Keep only the K largest boxes; 0 keeps all.
    pub k_largest: usize,
    /// Box area bounds relative to the image area.
    pub min_ratio: f32,
    pub max_ratio: f32,
    /// Positive dilates, negative erodes, by a square of that many pixels.
    pub dilate_erode: i32,
    /// Pixels; positive y moves the mask up.
    pub x_offset: i32,
    pub y_offset: i32,
    pub mode: MaskMode,
    pub sort_by: SortBy,
}

impl Default for MaskOptions {
    fn default() -> Self {
        MaskOptions { k_largest: 0, min_ratio: 0.0, max_ratio: 1.0, dilate_erode: 4, x_offset: 0, y_offset: 0, mode: MaskMode::None, sort_by: SortBy::None }
    }
}

/// Area-ratio filter, then the K largest, then the order.
pub fn filter_and_sort(mut dets: Vec<Detection>, width: usize, height: usize, o: &MaskOptions) -> Vec<Detection> {
    let area = (width * height) as f32;
    dets.retain(|d| {
        let r = d.area() / area;
        r >= o.min_ratio && r <= o.max_ratio
    });
    if o.k_largest > 0 && dets.len() > o.k_largest {
        // Stable: equal areas keep the detector's order.
        dets.sort_by(|a, b| b.area().total_cmp(&a.area()));
        dets.truncate(o.k_largest);
    }
    let (cx, cy) = (width as f32 * 0.5, height as f32 * 0.5);
    let dist = |d: &Detection| {
        let (x, y) = ((d.x1 + d.x2) * 0.5 - cx, (d.y1 + d.y2) * 0.5 - cy);
        x * x + y * y
    };
    match o.sort_by {
        SortBy::None => {}
        SortBy::LeftToRight => dets.sort_by(|a, b| a.x1.total_cmp(&b.x1)),
        SortBy::CenterToEdge => dets.sort_by(|a, b| dist(a).total_cmp(&dist(b))),
        SortBy::Area => dets.sort_by(|a, b| b.area().total_cmp(&a.area())),
    }
    dets
}

/// The box as a 0/1 mask, outward to whole pixels.
pub fn bbox_mask(d: &Detection, width: usize, height: usize) -> Vec<f32> {
    let mut m = vec![0f32; width * height];
    let cl = |v: f32, n: usize| (v.max(0.0) as usize).min(n);
    let (x1, y1) = (cl(d.x1.floor(), width), cl(d.y1.floor(), height));
    let (x2, y2) = (cl(d.x2.ceil(), width), cl(d.y2.ceil(), height));
    for y in y1..y2 {
        m[y * width + x1..y * width + x2].fill(1.0);
    }
    m
}

/// Shift by (dx, dy) pixels, positive dy upward; what leaves the image is lost.
pub fn offset_mask(m: &[f32], width: usize, height: usize, dx: i32, dy: i32) -> Vec<f32> {
    let mut out = vec![0f32; m.len()];
    for y in 0..height as i64 {
        let ty = y - dy as i64;
        if ty < 0 || ty >= height as i64 {
            continue;
        }
        for x in 0..width as i64 {
            let tx = x + dx as i64;
            if tx >= 0 && tx < width as i64 {
                out[ty as usize * width + tx as usize] = m[y as usize * width + x as usize];
            }
        }
    }
    out
}

/// Max (amount > 0) or min (amount < 0) over a |amount|-pixel square window; outside the
/// image counts as 0.
pub fn morphology(m: &[f32], width: usize, height: usize, amount: i32) -> Vec<f32> {
    if amount == 0 {
        return m.to_vec();
    }
    let k = amount.unsigned_abs() as i64;
    let before = k / 2;
    let after = k - before - 1;
    let dilate = amount > 0;
    let at = |x: i64, y: i64| if x >= 0 && y >= 0 && x < width as i64 && y < height as i64 { m[y as usize * width + x as usize] } else { 0.0 };
    // Separable: a square window's max (min) is the max (min) of the row-wise ones.
    let mut rows = vec![0f32; m.len()];
    for y in 0..height as i64 {
        for x in 0..width as i64 {
            let vals = (-before..=after).map(|kx| at(x + kx, y));
            rows[y as usize * width + x as usize] = if dilate { vals.fold(0.0, f32::max) } else { vals.fold(1.0, f32::min) };
        }
    }
    let rat = |x: i64, y: i64| if y >= 0 && y < height as i64 { rows[y as usize * width + x as usize] } else { 0.0 };
    let mut out = vec![0f32; m.len()];
    for y in 0..height as i64 {
        for x in 0..width as i64 {
            let vals = (-before..=after).map(|ky| rat(x, y + ky));
            out[y as usize * width + x as usize] = if dilate { vals.fold(0.0, f32::max) } else { vals.fold(1.0, f32::min) };
        }
    }
    out
}

/// Gaussian blur with sigma = radius over a ±ceil(2.5·sigma) kernel, edges clamped
/// (sd.cpp's composite feather).
pub fn gaussian_blur(m: &[f32], width: usize, height: usize, radius: u32) -> Vec<f32> {
    if radius == 0 {
        return m.to_vec();
    }
    let sigma = radius as f32;
    let kr = ((2.5 * sigma).ceil() as i64).max(1);
    let mut kernel: Vec<f32> = (-kr..=kr).map(|i| (-((i * i) as f32) / (2.0 * sigma * sigma)).exp()).collect();
    let sum: f32 = kernel.iter().sum();
    kernel.iter_mut().for_each(|v| *v /= sum);
    let clamp = |v: i64, n: usize| v.clamp(0, n as i64 - 1) as usize;
    let mut horiz = vec![0f32; m.len()];
    for y in 0..height {
        for x in 0..width {
            horiz[y * width + x] = (-kr..=kr).map(|k| m[y * width + clamp(x as i64 + k, width)] * kernel[(k + kr) as usize]).sum();
        }
    }
    let mut out = vec![0f32; m.len()];
    for y in 0..height {
        for x in 0..width {
            out[y * width + x] = (-kr..=kr).map(|k| horiz[clamp(y as i64 + k, height) * width + x] * kernel[(k + kr) as usize]).sum::<f32>().clamp(0.0, 1.0);
        }
    }
    out
}

/// Masks for `dets` (already filtered and sorted): box, offset, dilate/erode, empty ones
/// dropped, then merged / inverted as `o.mode` says.
pub fn make_masks(dets: &[Detection], width: usize, height: usize, o: &MaskOptions) -> Vec<Vec<f32>> {
    let mut masks: Vec<Vec<f32>> = dets
        .iter()
        .map(|d| {
            let m = bbox_mask(d, width, height);
            let m = if o.x_offset != 0 || o.y_offset != 0 { offset_mask(&m, width, height, o.x_offset, o.y_offset) } else { m };
            morphology(&m, width, height, o.dilate_erode)
        })
        .filter(|m| m.iter().any(|&v| v != 0.0))
        .collect();
    if o.mode != MaskMode::None && !masks.is_empty() {
        let mut merged = vec![0f32; width * height];
        for m in &masks {
            merged.iter_mut().zip(m).for_each(|(a, &b)| *a = a.max(b));
        }
        if o.mode == MaskMode::MergeInvert {
            merged.iter_mut().for_each(|v| *v = 1.0 - *v);
        }
        masks = vec![merged];
    }
    masks
}

/// Impact Pack's "UltralyticsDetectorProvider": a YOLOv8 detector from models/ultralytics.
struct UltralyticsDetectorProvider {
    rt: Arc<Runtime>,
}

impl UltralyticsDetectorProvider {
    fn path(&self, inputs: &Inputs) -> Result<PathBuf, NodeError> {
        self.rt.resolve_model(KIND, inputs.string("model_name")?).map_err(NodeError::msg)
    }
}

impl Node for UltralyticsDetectorProvider {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("UltralyticsDetectorProvider")
            .display_name("UltralyticsDetectorProvider")
            .category("ImpactPack")
            .description("Loads a YOLOv8 detection model (an Ultralytics .pt, read without running its pickle, or sd.cpp's converted .safetensors) from models/ultralytics.")
            .input(InputSpec::combo("model_name", self.rt.list_models(KIND)))
            .output("BBOX_DETECTOR", BBOX_DETECTOR)
    }

    /// A changed file on disk must not be served from the cache.
    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        crate::loaders::file_fingerprint(&self.path(inputs)?)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let path = self.path(inputs)?;
        // The detector is small: loading it here names a bad file at its loader.
        let key = WeightKey::new([&path], "yolov8-detector", None, Device::Cpu).map_err(err)?;
        let p = path.clone();
        let weights = self.rt.weights(Module::Detector, key, move |memory| {
            let src = io::open(&p)?;
            Ok(Yolo::load(memory, src.as_ref()).map_err(|e| format!("{}: {e}", p.display()))?)
        })?;
        let name = inputs.string("model_name")?.to_string();
        Ok(Outputs::new(vec![Value::new(BBOX_DETECTOR, DetectorRef { weights, name })]))
    }
}

/// Detect in one image and make ADetailer's masks: MASK [N, H, W], one per kept
/// detection in processing order (one when merged; a single empty mask when nothing is
/// found), and their count.
struct BboxDetectorMasks {
    rt: Arc<Runtime>,
}

impl BboxDetectorMasks {
    fn params(inputs: &Inputs) -> Result<(DetectParams, MaskOptions), NodeError> {
        let d = DetectParams::default();
        let m = MaskOptions::default();
        let f = |n: &str, def: f64| -> Result<f64, NodeError> { if inputs.contains(n) { inputs.float(n) } else { Ok(def) } };
        let i = |n: &str, def: i64| -> Result<i64, NodeError> { if inputs.contains(n) { inputs.int(n) } else { Ok(def) } };
        let s = |n: &str, def: &'static str| -> Result<String, NodeError> { if inputs.contains(n) { Ok(inputs.string(n)?.to_string()) } else { Ok(def.to_string()) } };
        let count = |n: &str, v: i64, min: i64| -> Result<usize, NodeError> {
            if v < min {
                return Err(NodeError::msg(format!("{n} {v} must be at least {min}")));
            }
            Ok(v as usize)
        };
        let det = DetectParams {
            input_size: count("input_size", i("input_size", d.input_size as i64)?, 32)?,
            confidence: f("confidence", d.confidence as f64)? as f32,
            nms: f("nms", d.nms as f64)? as f32,
            max_detections: count("max_detections", i("max_detections", d.max_detections as i64)?, 1)?,
            class_agnostic: false,
        };
        det.validate().map_err(err)?;
        let mode_name = s("mask_mode", "none")?;
        let sort_name = s("sort_by", "none")?;
        let clamp_px = |n: &str, v: i64| -> Result<i32, NodeError> { i32::try_from(v).ok().filter(|v| v.unsigned_abs() <= 4096).ok_or_else(|| NodeError::msg(format!("{n} {v} is outside -4096..=4096"))) };
        let mask = MaskOptions {
            k_largest: count("mask_k_largest", i("mask_k_largest", 0)?, 0)?,
            min_ratio: f("mask_min_ratio", m.min_ratio as f64)? as f32,
            max_ratio: f("mask_max_ratio", m.max_ratio as f64)? as f32,
            dilate_erode: clamp_px("dilate_erode", i("dilate_erode", m.dilate_erode as i64)?)?,
            x_offset: clamp_px("x_offset", i("x_offset", 0)?)?,
            y_offset: clamp_px("y_offset", i("y_offset", 0)?)?,
            mode: MaskMode::parse(&mode_name).ok_or_else(|| NodeError::msg(format!("unknown mask_mode `{mode_name}` (one of {:?})", MaskMode::NAMES)))?,
            sort_by: SortBy::parse(&sort_name).ok_or_else(|| NodeError::msg(format!("unknown sort_by `{sort_name}` (one of {:?})", SortBy::NAMES)))?,
        };
        if !(0.0..=1.0).contains(&mask.min_ratio) || !(0.0..=1.0).contains(&mask.max_ratio) || mask.min_ratio > mask.max_ratio {
            return Err(NodeError::msg(format!("mask_min_ratio {} and mask_max_ratio {} must satisfy 0 <= min <= max <= 1", mask.min_ratio, mask.max_ratio)));
        }
        Ok((det, mask))
    }
}

impl Node for BboxDetectorMasks {
    fn schema(&self) -> NodeSchema {
        let d = DetectParams::default();
        let m = MaskOptions::default();
        NodeSchema::new("BboxDetectorMasks")
            .display_name("BBOX Detector (masks)")
            .category("ImpactPack/Detector")
            .description("Detects objects in one image with a YOLOv8 detector and turns the boxes into ADetailer masks (sd.cpp's --extra-ad-args mask options).")
            .input(InputSpec::link("bbox_detector", BBOX_DETECTOR))
            .input(InputSpec::link("image", IoType::IMAGE))
            .input(InputSpec::float("confidence", d.confidence as f64).float_range(0.0, 1.0).float_step(0.01).optional().tooltip("Detection confidence threshold."))
            .input(InputSpec::float("nms", d.nms as f64).float_range(0.0, 1.0).float_step(0.01).optional().tooltip("NMS IoU threshold (per class)."))
            .input(InputSpec::int("max_detections", d.max_detections as i64).int_range(1, 10000).optional())
            .input(InputSpec::int("input_size", d.input_size as i64).int_range(32, 4096).int_step(32).optional().tooltip("Square detector input; a multiple of 32."))
            .input(InputSpec::int("mask_k_largest", 0).int_range(0, 10000).optional().tooltip("Keep only the largest K boxes; 0 keeps all."))
            .input(InputSpec::float("mask_min_ratio", m.min_ratio as f64).float_range(0.0, 1.0).float_step(0.001).optional().tooltip("Minimum box area relative to the image."))
            .input(InputSpec::float("mask_max_ratio", m.max_ratio as f64).float_range(0.0, 1.0).float_step(0.001).optional().tooltip("Maximum box area relative to the image."))
            .input(InputSpec::int("dilate_erode", m.dilate_erode as i64).int_range(-4096, 4096).optional().tooltip("Positive dilates, negative erodes (pixels)."))
            .input(InputSpec::int("x_offset", 0).int_range(-4096, 4096).optional())
            .input(InputSpec::int("y_offset", 0).int_range(-4096, 4096).optional().tooltip("Positive moves the mask up."))
            .input(InputSpec::combo("mask_mode", MaskMode::NAMES).optional())
            .input(InputSpec::combo("sort_by", SortBy::NAMES).optional())
            .output("MASK", IoType::MASK)
            .output("count", IoType::INT)
    }

    fn lane(&self) -> Lane {
        crate::runtime::device_lane()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let det = inputs.downcast::<DetectorRef>("bbox_detector")?;
        let img = inputs.downcast::<Image>("image")?;
        let (params, opts) = Self::params(inputs)?;
        if img.n != 1 || img.channels != 3 {
            return Err(NodeError::msg(format!("BboxDetectorMasks takes one RGB image, got {} of {} channels", img.n, img.channels)));
        }
        let (w, h) = (img.width, img.height);
        let model = self.rt.pin(Module::Detector, &det.weights)?;
        let found = self.rt.with_backend(Module::Detector, |b| model.detect(b, &img.data, w, h, &params)).map_err(|e| NodeError::msg(format!("{}: {e}", det.name)))?;
        let kept = filter_and_sort(found, w, h, &opts);
        let masks = make_masks(&kept, w, h, &opts);
        let count = masks.len();
        let data: Vec<f32> = if masks.is_empty() { vec![0.0; w * h] } else { masks.concat() };
        let mask = Mask { data, n: count.max(1), height: h, width: w };
        Ok(Outputs::new(vec![Value::new(IoType::MASK, mask), Value::int(count as i64)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(x1: f32, y1: f32, x2: f32, y2: f32, confidence: f32) -> Detection {
        Detection { x1, y1, x2, y2, confidence, class_id: 0 }
    }

    fn ones(m: &[f32], w: usize) -> Vec<(usize, usize)> {
        m.iter().enumerate().filter(|(_, &v)| v > 0.5).map(|(i, _)| (i % w, i / w)).collect()
    }

    #[test]
    fn boxes_become_whole_pixel_masks() {
        let m = bbox_mask(&det(1.5, 0.2, 3.1, 1.0, 0.9), 6, 4);
        // x 1..4, y 0..1: three pixels.
        assert_eq!(ones(&m, 6), [(1, 0), (2, 0), (3, 0)]);
        // Out-of-image parts are clipped.
        let m = bbox_mask(&det(-3.0, 2.5, 100.0, 9.0, 0.9), 6, 4);
        assert_eq!(ones(&m, 6).len(), 6 * 2);
    }

    #[test]
    fn offsets_move_right_and_up() {
        let m = bbox_mask(&det(1.0, 2.0, 2.0, 3.0, 0.9), 5, 5); // pixel (1, 2)
        assert_eq!(ones(&offset_mask(&m, 5, 5, 2, 1), 5), [(3, 1)]);
        assert_eq!(ones(&offset_mask(&m, 5, 5, -1, -2), 5), [(0, 4)]);
        assert!(ones(&offset_mask(&m, 5, 5, 9, 0), 5).is_empty());
    }

    #[test]
    fn dilate_and_erode_use_sdcpp_windows() {
        let m = bbox_mask(&det(3.0, 3.0, 4.0, 4.0, 0.9), 8, 8); // pixel (3, 3)
        // k = 4: window -2..=1, so a pixel spreads 1 left/up and 2 right/down.
        let d = morphology(&m, 8, 8, 4);
        let got = ones(&d, 8);
        assert_eq!(got.len(), 16);
        assert!(got.contains(&(2, 2)) && got.contains(&(5, 5)) && !got.contains(&(1, 1)) && !got.contains(&(6, 6)));
        // Eroding a 4×4 square by 3 (window -1..=1) leaves its 2×2 core.
        let sq = bbox_mask(&det(2.0, 2.0, 6.0, 6.0, 0.9), 8, 8);
        assert_eq!(ones(&morphology(&sq, 8, 8, -3), 8), [(3, 3), (4, 3), (3, 4), (4, 4)]);
        assert_eq!(morphology(&sq, 8, 8, 0), sq);
    }

    #[test]
    fn filters_sort_and_keep_the_largest() {
        let dets = vec![det(60.0, 0.0, 100.0, 40.0, 0.9), det(0.0, 0.0, 10.0, 10.0, 0.8), det(40.0, 40.0, 60.0, 60.0, 0.7)];
        let o = MaskOptions::default();
        let area = |d: &[Detection]| d.iter().map(|d| d.area() as u32).collect::<Vec<_>>();
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &o)), [1600, 100, 400]);
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &MaskOptions { min_ratio: 0.02, ..o.clone() })), [1600, 400]);
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &MaskOptions { max_ratio: 0.1, ..o.clone() })), [100, 400]);
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &MaskOptions { k_largest: 2, ..o.clone() })), [1600, 400]);
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &MaskOptions { sort_by: SortBy::LeftToRight, ..o.clone() })), [100, 400, 1600]);
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &MaskOptions { sort_by: SortBy::CenterToEdge, ..o.clone() })), [400, 1600, 100]);
        assert_eq!(area(&filter_and_sort(dets.clone(), 100, 100, &MaskOptions { sort_by: SortBy::Area, ..o.clone() })), [1600, 400, 100]);
    }

    #[test]
    fn masks_merge_and_invert() {
        let dets = vec![det(0.0, 0.0, 2.0, 2.0, 0.9), det(4.0, 4.0, 6.0, 6.0, 0.8), det(9.0, 9.0, 9.0, 9.0, 0.7)];
        let o = MaskOptions { dilate_erode: 0, ..MaskOptions::default() };
        // The zero-size box gives an empty mask, which is dropped.
        let each = make_masks(&dets, 8, 8, &o);
        assert_eq!(each.len(), 2);
        let merged = make_masks(&dets, 8, 8, &MaskOptions { mode: MaskMode::Merge, ..o.clone() });
        assert_eq!(merged.len(), 1);
        assert_eq!(ones(&merged[0], 8).len(), 8);
        let inv = make_masks(&dets, 8, 8, &MaskOptions { mode: MaskMode::MergeInvert, ..o.clone() });
        assert_eq!(ones(&inv[0], 8).len(), 64 - 8);
        assert!(make_masks(&[], 8, 8, &MaskOptions { mode: MaskMode::Merge, ..o }).is_empty());
    }

    #[test]
    fn blur_feathers_and_keeps_mass() {
        let m = bbox_mask(&det(8.0, 8.0, 16.0, 16.0, 0.9), 24, 24);
        let b = gaussian_blur(&m, 24, 24, 2);
        let (sum_m, sum_b): (f32, f32) = (m.iter().sum(), b.iter().sum());
        assert!((sum_m - sum_b).abs() < 1e-2, "{sum_m} vs {sum_b}");
        assert!(b[12 * 24 + 12] > 0.85 && b[8 * 24 + 12] > 0.3 && b[8 * 24 + 12] < 0.7 && b[2 * 24 + 2] < 1e-3);
        assert_eq!(gaussian_blur(&m, 24, 24, 0), m);
    }
}
