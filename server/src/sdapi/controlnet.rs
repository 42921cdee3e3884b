//! A1111's ControlNet extension (sd-webui-controlnet) as its API clients use it: the
//! units of `alwayson_scripts.controlnet.args` become ControlNetLoader +
//! ControlNetApplyAdvanced nodes (through [`presets::ControlUnit`]), each control image
//! fitted to the generation size by the extension's resize modes; and its listing routes
//! (`/controlnet/version`, `model_list`, `module_list`).

use axum::Json as Reply;
use image::{DynamicImage, Rgb, RgbImage};
use sdflow_workflows::presets::ControlUnit;
use serde_json::{json, Map, Value as Json};

use super::fields::off;
use super::{decode_b64, stem, AppStateRef, TempInputs};
use crate::comfy::list_models;
use crate::error::ApiError;
use crate::files::check_image;
use crate::state::AppState;

/// The preprocessors sdflow runs: only `none` (the image is the control map as sent).
/// The extension's others (canny, depth, openpose, ...) are refused: sdflow's Canny node is
/// sd.cpp's algorithm (thresholds relative to the strongest edge), not the OpenCV Canny the
/// extension runs, so its edges would not be the extension's.
const MODULES: &[&str] = &["none"];

/// The extension's resize modes (`ResizeMode`): how the control image is fitted to the
/// generation size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Resize {
    /// "Just Resize": stretched to the size.
    Stretch,
    /// "Crop and Resize" (the extension's default): scaled to cover, centre cropped.
    Crop,
    /// "Resize and Fill": scaled to fit, the rest filled with the median border colour.
    Fill,
}

impl Resize {
    fn parse(v: &Json) -> Option<Resize> {
        match v {
            Json::Null => Some(Resize::Crop),
            // 3 is A1111's "Just Resize (latent upscale)", which the extension reads as 0.
            Json::Number(n) => match n.as_u64()? {
                0 | 3 => Some(Resize::Stretch),
                1 => Some(Resize::Crop),
                2 => Some(Resize::Fill),
                _ => None,
            },
            Json::String(s) => match s.as_str() {
                "Just Resize" => Some(Resize::Stretch),
                "Crop and Resize" | "Inner Fit (Scale to Fit)" | "Scale to Fit (Inner Fit)" => Some(Resize::Crop),
                "Resize and Fill" | "Outer Fit (Shrink to Fit)" | "Envelope (Outer Fit)" => Some(Resize::Fill),
                _ => None,
            },
            _ => None,
        }
    }
}

/// What the units are read against: the generation's size, the img2img input (the
/// extension's control image when a unit sends none) and whether a hires pass follows.
pub(super) struct UnitContext<'a> {
    pub(super) size: (u32, u32),
    pub(super) init_image: Option<&'a [u8]>,
    pub(super) hires: bool,
}

/// The enabled ControlNet units of `alwayson_scripts.controlnet` (`{"args": [unit, ...]}`),
/// their control images fitted and stored in the input folder; a 400 names the unit's
/// field it cannot honour.
pub(super) fn units(state: &AppState, script: &Json, cx: &UnitContext<'_>, temp: &mut TempInputs) -> Result<Vec<ControlUnit>, ApiError> {
    let args = match script {
        Json::Null => return Ok(Vec::new()),
        Json::Object(o) => match o.get("args") {
            None | Some(Json::Null) => return Ok(Vec::new()),
            Some(Json::Array(a)) => a,
            Some(other) => return Err(ApiError::bad(format!("`alwayson_scripts.controlnet.args`: {} is not a list of units", short(other)))),
        },
        other => return Err(ApiError::bad(format!("`alwayson_scripts.controlnet`: {} is not an object with `args`", short(other)))),
    };
    if let Some(extra) = script.as_object().and_then(|o| o.keys().find(|k| *k != "args")) {
        return Err(ApiError::bad(format!("`alwayson_scripts.controlnet.{extra}`: unknown field (the units go in `args`)")));
    }
    let models = list_models(state, "controlnet");
    let mut out = Vec::new();
    for (i, unit) in args.iter().enumerate() {
        let at = format!("alwayson_scripts.controlnet.args[{i}]");
        let Some(u) = unit.as_object() else {
            return Err(ApiError::bad(format!("`{at}`: {} is not a ControlNet unit (an object)", short(unit))));
        };
        if let Some(unit) = parse_unit(state, u, &at, &models, cx, temp)? {
            out.push(unit);
        }
    }
    Ok(out)
}

fn short(v: &Json) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        format!("{}…", &s[..s.char_indices().take_while(|(i, _)| *i < 80).last().map_or(0, |(i, c)| i + c.len_utf8())])
    } else {
        s
    }
}

fn parse_unit(state: &AppState, u: &Map<String, Json>, at: &str, models: &[String], cx: &UnitContext<'_>, temp: &mut TempInputs) -> Result<Option<ControlUnit>, ApiError> {
    let bad = |field: &str, msg: String| ApiError::bad(format!("`{at}.{field}`: {msg}"));
    // A unit without `enabled` runs, as the extension's API reads one.
    match u.get("enabled") {
        None | Some(Json::Null) | Some(Json::Bool(true)) => {}
        Some(Json::Bool(false)) => return Ok(None),
        Some(v) => return Err(bad("enabled", format!("{} is not a boolean", short(v)))),
    }
    let number = |field: &str, default: f64, lo: f64, hi: f64| -> Result<f64, ApiError> {
        match u.get(field) {
            None | Some(Json::Null) => Ok(default),
            Some(v) => v.as_f64().filter(|x| (lo..=hi).contains(x)).ok_or_else(|| bad(field, format!("{} is not a number in {lo}..={hi}", short(v)))),
        }
    };
    for (key, v) in u {
        let ok = match key.as_str() {
            "enabled" | "module" | "model" | "weight" | "image" | "input_image" | "mask" | "mask_image" | "resize_mode" | "guidance_start" | "guidance_end" | "guidance" | "control_mode" | "hr_option" => true,
            // With the `none` module these only steer preprocessors, or are bookkeeping
            // that changes no image.
            "processor_res" | "threshold_a" | "threshold_b" | "pixel_perfect" | "low_vram" | "lowvram" | "save_detected_map" | "inpaint_crop_input_image" | "is_ui" | "input_mode" | "output_dir" | "pulid_mode" => true,
            // Features of the extension sdflow lacks: accepted only when off.
            "advanced_weighting" | "effective_region_mask" | "ipadapter_input" | "batch_images" | "loopback" | "guessmode" | "guess_mode" => {
                if !off(v) {
                    return Err(bad(key, format!("{} is not supported (sdflow's ControlNet units have no {key})", short(v))));
                }
                true
            }
            _ => false,
        };
        if !ok {
            return Err(bad(key, "unknown field".into()));
        }
    }
    let module = match u.get("module") {
        None | Some(Json::Null) => "none".to_string(),
        Some(Json::String(s)) => s.clone(),
        Some(v) => return Err(bad("module", format!("{} is not a preprocessor name", short(v)))),
    };
    if !MODULES.contains(&module.to_ascii_lowercase().as_str()) {
        return Err(bad("module", format!("`{module}` is not a preprocessor sdflow has (it has: {}); send the control map already made, with module `none`", MODULES.join(", "))));
    }
    let model = match u.get("model").and_then(Json::as_str).map(str::trim) {
        None | Some("" | "None" | "none") => return Err(bad("model", "a ControlNet model is required (see /controlnet/model_list)".into())),
        Some(m) => m,
    };
    let bare = model.split(" [").next().unwrap_or(model).trim();
    let model = models.iter().find(|m| *m == bare || stem(m) == bare).cloned().ok_or_else(|| {
        let have: Vec<&str> = models.iter().map(|m| stem(m)).collect();
        bad("model", format!("no ControlNet `{model}` in the controlnet folder (have: {})", if have.is_empty() { "none".to_string() } else { have.join(", ") }))
    })?;
    let weight = number("weight", 1.0, 0.0, 2.0)?;
    if u.contains_key("guidance") && u.contains_key("guidance_end") {
        return Err(bad("guidance", "give `guidance_end` only (`guidance` is its old name)".into()));
    }
    let start = number("guidance_start", 0.0, 0.0, 1.0)?;
    let end = if u.contains_key("guidance") { number("guidance", 1.0, 0.0, 1.0)? } else { number("guidance_end", 1.0, 0.0, 1.0)? };
    if start > end {
        return Err(bad("guidance_start", format!("{start} is after guidance_end {end}")));
    }
    match u.get("control_mode") {
        None | Some(Json::Null) => {}
        Some(v) if v.as_u64() == Some(0) || v.as_str() == Some("Balanced") => {}
        Some(v) if matches!(v.as_u64(), Some(1 | 2)) || matches!(v.as_str(), Some("My prompt is more important" | "ControlNet is more important")) => {
            return Err(bad("control_mode", format!("{} is not supported: only Balanced (0), the ControlNet on both prompts at its weight", short(v))));
        }
        Some(v) => return Err(bad("control_mode", format!("{} is not one of Balanced, My prompt is more important, ControlNet is more important (0, 1, 2)", short(v)))),
    }
    match u.get("hr_option") {
        None | Some(Json::Null) => {}
        Some(v) if v.as_str() == Some("Both") || v.as_u64() == Some(0) => {}
        Some(v) if matches!(v.as_str(), Some("Low res only" | "High res only")) || matches!(v.as_u64(), Some(1 | 2)) => {
            if cx.hires {
                return Err(bad("hr_option", format!("{} is not supported: the unit guides both passes of the hires fix (Both)", short(v))));
            }
        }
        Some(v) => return Err(bad("hr_option", format!("{} is not one of Both, Low res only, High res only", short(v)))),
    }
    let resize = match u.get("resize_mode") {
        None => Resize::Crop,
        Some(v) => Resize::parse(v).ok_or_else(|| bad("resize_mode", format!("{} is not one of Just Resize, Crop and Resize, Resize and Fill (0, 1, 2)", short(v))))?,
    };
    for key in ["mask", "mask_image"] {
        if u.get(key).is_some_and(|v| !off(v)) {
            return Err(bad(key, "masks are for the extension's inpaint and effective-region modes, which sdflow does not have".into()));
        }
    }
    if u.contains_key("image") && u.contains_key("input_image") {
        return Err(bad("input_image", "give `image` only (`input_image` is its old name)".into()));
    }
    let (image_key, image) = match (u.get("image"), u.get("input_image")) {
        (Some(v), _) => ("image", v),
        (None, Some(v)) => ("input_image", v),
        (None, None) => ("image", &Json::Null),
    };
    // The extension's image forms: a base64 string, {"image", "mask"} or [image, mask].
    let (b64, mask) = match image {
        Json::Null => (None, None),
        Json::String(s) => (Some(s.as_str()).filter(|s| !s.is_empty()), None),
        Json::Object(o) => (o.get("image").and_then(Json::as_str), o.get("mask")),
        Json::Array(a) if a.len() == 2 => (a[0].as_str(), a.get(1)),
        other => return Err(bad(image_key, format!("{} is not a base64 image", short(other)))),
    };
    if mask.is_some_and(|m| !off(m)) {
        return Err(bad(image_key, "masks are for the extension's inpaint and effective-region modes, which sdflow does not have".into()));
    }
    let what = format!("{at}.{image_key}");
    let bytes = match (b64, cx.init_image) {
        (Some(s), _) => decode_b64(s, &format!("`{what}`"))?,
        // img2img without a control image: the extension uses the input image.
        (None, Some(init)) => init.to_vec(),
        (None, None) => return Err(bad(image_key, "a control image is required (base64)".into())),
    };
    check_image(&bytes, &format!("`{what}`"))?;
    let img = image::load_from_memory(&bytes).map_err(|e| bad(image_key, e.to_string()))?;
    let hint = fit(&img, cx.size.0, cx.size.1, resize);
    let name = temp.store(state, &DynamicImage::ImageRgb8(hint), &what)?;
    Ok(Some(ControlUnit { model, image: name, strength: weight, start, end, origin: at.to_string() }))
}

/// The extension's `HWC3`: RGB, an alpha channel blended over white.
fn rgb(img: &DynamicImage) -> RgbImage {
    if !img.color().has_alpha() {
        return img.to_rgb8();
    }
    let rgba = img.to_rgba8();
    RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let p = rgba.get_pixel(x, y).0;
        let a = f32::from(p[3]) / 255.0;
        Rgb([0, 1, 2].map(|c| (f32::from(p[c]) * a + 255.0 * (1.0 - a)).round().clamp(0.0, 255.0) as u8))
    })
}

/// The extension's `detectmap_proc` for a control map: fitted to `w`×`h` by `mode`, with
/// its `high_quality_resize` choice of filter (nearest for maps of a few colours, area when
/// shrinking, cubic when growing). Its extra treatment of one-pixel binary edge maps is not
/// reproduced.
pub(super) fn fit(img: &DynamicImage, w: u32, h: u32, mode: Resize) -> RgbImage {
    let x = rgb(img);
    let (ow, oh) = (f64::from(x.width()), f64::from(x.height()));
    let (k0, k1) = (f64::from(h) / oh, f64::from(w) / ow);
    let round = |v: f64| (v.round() as u32).max(1);
    match mode {
        Resize::Stretch => resize(&x, w, h),
        Resize::Crop => {
            let k = k0.max(k1);
            let y = resize(&x, round(ow * k), round(oh * k));
            let (px, py) = (y.width().saturating_sub(w) / 2, y.height().saturating_sub(h) / 2);
            RgbImage::from_fn(w, h, |i, j| *y.get_pixel((i + px).min(y.width() - 1), (j + py).min(y.height() - 1)))
        }
        Resize::Fill => {
            let k = k0.min(k1);
            let border = median_border(&x);
            let y = resize(&x, round(ow * k), round(oh * k));
            let (px, py) = (w.saturating_sub(y.width()) / 2, h.saturating_sub(y.height()) / 2);
            RgbImage::from_fn(w, h, |i, j| if i >= px && j >= py && i - px < y.width() && j - py < y.height() { *y.get_pixel(i - px, j - py) } else { border })
        }
    }
}

/// numpy's median of the first and last rows and columns, per channel, cast to u8.
fn median_border(x: &RgbImage) -> Rgb<u8> {
    let (w, h) = x.dimensions();
    let mut px: Vec<Rgb<u8>> = Vec::new();
    px.extend((0..w).map(|i| *x.get_pixel(i, 0)));
    px.extend((0..w).map(|i| *x.get_pixel(i, h - 1)));
    px.extend((0..h).map(|j| *x.get_pixel(0, j)));
    px.extend((0..h).map(|j| *x.get_pixel(w - 1, j)));
    Rgb([0, 1, 2].map(|c| {
        let mut v: Vec<u8> = px.iter().map(|p| p.0[c]).collect();
        v.sort_unstable();
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            ((f64::from(v[n / 2 - 1]) + f64::from(v[n / 2])) / 2.0) as u8
        }
    }))
}

/// `high_quality_resize`'s filter choice: nearest for 3 to 199 colours, area when the
/// image shrinks, cubic otherwise.
fn resize(x: &RgbImage, w: u32, h: u32) -> RgbImage {
    if x.dimensions() == (w, h) {
        return x.clone();
    }
    let mut colours = std::collections::HashSet::new();
    for p in x.pixels() {
        colours.insert(p.0);
        if colours.len() >= 200 {
            break;
        }
    }
    let few = (3..200).contains(&colours.len());
    let smaller = u64::from(w) * u64::from(h) < u64::from(x.width()) * u64::from(x.height());
    if few {
        image::imageops::resize(x, w, h, image::imageops::FilterType::Nearest)
    } else if smaller {
        area(x, w, h)
    } else {
        image::imageops::resize(x, w, h, image::imageops::FilterType::CatmullRom)
    }
}

/// Area resampling (OpenCV's INTER_AREA when shrinking): each output pixel the mean of the
/// input it covers, partly covered pixels weighted by their share.
fn area(x: &RgbImage, w: u32, h: u32) -> RgbImage {
    // Per output index, the input indices it covers and their weights.
    let weights = |from: u32, to: u32| -> Vec<Vec<(u32, f64)>> {
        let scale = f64::from(from) / f64::from(to);
        (0..to)
            .map(|o| {
                let (a, b) = (f64::from(o) * scale, (f64::from(o) + 1.0) * scale);
                let mut ws = Vec::new();
                let mut i = a.floor() as u32;
                while f64::from(i) < b && i < from {
                    let cover = (b.min(f64::from(i) + 1.0) - a.max(f64::from(i))) / scale;
                    if cover > 0.0 {
                        ws.push((i, cover));
                    }
                    i += 1;
                }
                ws
            })
            .collect()
    };
    let (wx, wy) = (weights(x.width(), w), weights(x.height(), h));
    // Rows first, then columns, in f64.
    let rows: Vec<Vec<[f64; 3]>> = (0..x.height())
        .map(|j| wx.iter().map(|ws| ws.iter().fold([0.0; 3], |acc, &(i, k)| {
            let p = x.get_pixel(i, j).0;
            [acc[0] + f64::from(p[0]) * k, acc[1] + f64::from(p[1]) * k, acc[2] + f64::from(p[2]) * k]
        })).collect())
        .collect();
    RgbImage::from_fn(w, h, |i, j| {
        let v = wy[j as usize].iter().fold([0.0; 3], |acc, &(r, k)| {
            let p = rows[r as usize][i as usize];
            [acc[0] + p[0] * k, acc[1] + p[1] * k, acc[2] + p[2] * k]
        });
        Rgb(v.map(|c| c.round().clamp(0.0, 255.0) as u8))
    })
}

/// The extension's API version (2, its current).
pub async fn version() -> Reply<Json> {
    Reply(json!({ "version": 2 }))
}

/// The ControlNets of `controlnet/`, by the names units take (the extension adds a
/// ` [hash]`, which sdflow reads past).
pub async fn model_list(axum::extract::State(state): AppStateRef) -> Reply<Json> {
    let list: Vec<String> = list_models(&state, "controlnet").iter().map(|m| stem(m).to_string()).collect();
    Reply(json!({ "model_list": list }))
}

/// The preprocessors sdflow runs ([`MODULES`]).
pub async fn module_list() -> Reply<Json> {
    let detail: Map<String, Json> = MODULES.iter().map(|m| (m.to_string(), json!({ "model_free": false, "sliders": [] }))).collect();
    Reply(json!({ "module_list": MODULES, "module_detail": detail }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(w: u32, h: u32, f: impl Fn(u32, u32) -> [u8; 3]) -> DynamicImage {
        DynamicImage::ImageRgb8(RgbImage::from_fn(w, h, |x, y| Rgb(f(x, y))))
    }

    #[test]
    fn control_maps_are_fitted_as_the_extension_fits_them() {
        // A 4×2 map, left half black, right half white, onto 2×2.
        let halves = image(4, 2, |x, _| if x < 2 { [0; 3] } else { [255; 3] });
        // Crop and Resize scales to cover (height 2 → factor 1) and keeps the middle.
        let crop = fit(&halves, 2, 2, Resize::Crop);
        assert_eq!(crop.pixels().map(|p| p.0[0]).collect::<Vec<_>>(), [0, 255, 0, 255]);
        // Just Resize squeezes the halves side by side.
        let stretch = fit(&halves, 2, 2, Resize::Stretch);
        assert_eq!(stretch.pixels().map(|p| p.0[0]).collect::<Vec<_>>(), [0, 255, 0, 255]);
        // Resize and Fill fits (factor 0.5: 2×1) and fills with the border median.
        let red_frame = image(4, 4, |x, y| if x == 0 || y == 0 || x == 3 || y == 3 { [200, 0, 0] } else { [0, 0, 255] });
        let filled = fit(&red_frame, 8, 4, Resize::Fill);
        assert_eq!(filled.dimensions(), (8, 4));
        assert_eq!(filled.get_pixel(0, 0).0, [200, 0, 0], "the fill is the border's median");
        assert_eq!(filled.get_pixel(7, 3).0, [200, 0, 0]);
        // Area shrinking averages what each pixel covers.
        let stripes = image(4, 1, |x, _| if x % 2 == 0 { [0; 3] } else { [200; 3] });
        assert_eq!(area(&stripes.to_rgb8(), 2, 1).pixels().map(|p| p.0[0]).collect::<Vec<_>>(), [100, 100]);
        assert_eq!(area(&stripes.to_rgb8(), 3, 1).pixels().map(|p| p.0[0]).collect::<Vec<_>>(), [50, 100, 150]);
        // Transparent pixels are white, as the extension's HWC3 blends them.
        let clear = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(1, 1, image::Rgba([0, 0, 0, 0])));
        assert_eq!(rgb(&clear).get_pixel(0, 0).0, [255; 3]);
    }

    #[test]
    fn resize_modes_by_name_and_number() {
        assert_eq!(Resize::parse(&json!(0)), Some(Resize::Stretch));
        assert_eq!(Resize::parse(&json!("Crop and Resize")), Some(Resize::Crop));
        assert_eq!(Resize::parse(&json!("Envelope (Outer Fit)")), Some(Resize::Fill));
        assert_eq!(Resize::parse(&json!(3)), Some(Resize::Stretch));
        assert_eq!(Resize::parse(&json!(7)), None);
        assert_eq!(Resize::parse(&json!("Squash")), None);
    }
}
