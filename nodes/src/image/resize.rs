//! Resampling of latents and images with PyTorch's `interpolate` semantics
//! (`align_corners=False`), so ComfyUI workflows give the same sizes and values;
//! Lanczos follows PIL, which ComfyUI's "lanczos" calls.

/// A resampling method, by ComfyUI's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    NearestExact,
    Bilinear,
    Bicubic,
    /// Box averaging over the covered source pixels (`adaptive_avg_pool2d`).
    Area,
    /// torch's legacy `nearest`: `floor(o·in/out)`, which drifts left of the centre
    /// (sd-webui's "Latent (nearest)").
    Nearest,
    /// `interpolate(antialias=True)`: the filter widens by the factor when shrinking,
    /// so every source pixel counts (sd-webui's "Latent (antialiased)").
    BilinearAntialiased,
    /// The same with Keys' cubic at A = -0.5 ("Latent (bicubic antialiased)").
    BicubicAntialiased,
    /// PIL's `LANCZOS`: a 3-lobe windowed sinc, widened when shrinking.
    Lanczos,
}

impl Method {
    /// ComfyUI's "Upscale Image" methods.
    /// ComfyUI's image methods, and torch's legacy `nearest` (the source pixel at
    /// ⌊dst·in/out⌋, as sd.cpp resizes reference images).
    pub const IMAGE_NAMES: [&'static str; 6] = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos", "nearest"];
    /// ComfyUI's "Upscale Latent" methods (bar bislerp) and the torch modes sd-webui's
    /// latent hires upscalers name.
    pub const LATENT_NAMES: [&'static str; 7] = ["nearest-exact", "bilinear", "area", "bicubic", "nearest", "bilinear-antialiased", "bicubic-antialiased"];

    pub fn parse(name: &str) -> Option<Method> {
        Some(match name {
            "nearest-exact" => Method::NearestExact,
            "bilinear" => Method::Bilinear,
            "bicubic" => Method::Bicubic,
            "area" => Method::Area,
            "nearest" => Method::Nearest,
            "bilinear-antialiased" => Method::BilinearAntialiased,
            "bicubic-antialiased" => Method::BicubicAntialiased,
            "lanczos" => Method::Lanczos,
            _ => return None,
        })
    }
}

/// Keys' cubic convolution kernel with parameter `a`.
fn cubic(x: f64, a: f64) -> f64 {
    let x = x.abs();
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        (x * std::f64::consts::PI).sin() / (x * std::f64::consts::PI)
    }
}

/// Taps of a filter of half-width `support` (in source pixels at scale 1), stretched
/// by the factor when shrinking so it low-passes. PIL's resample and torch's
/// antialiased interpolate share this scheme: the window is cut at the borders and
/// the weights renormalised.
fn filter_taps(n_in: usize, o: usize, scale: f64, support: f64, filter: impl Fn(f64) -> f64) -> Vec<(usize, f32)> {
    let stretch = scale.max(1.0);
    let support = support * stretch;
    let center = (o as f64 + 0.5) * scale;
    // Truncation toward zero, as the C casts both libraries use.
    let lo = ((center - support + 0.5) as i64).max(0) as usize;
    let hi = ((center + support + 0.5) as i64).clamp(0, n_in as i64) as usize;
    let w: Vec<f64> = (lo..hi).map(|i| filter((i as f64 - center + 0.5) / stretch)).collect();
    let total: f64 = w.iter().sum();
    let norm = if total != 0.0 { total } else { 1.0 };
    (lo..hi).zip(w).map(|(i, w)| (i, (w / norm) as f32)).collect()
}

/// Weights of source indices for each output index along one axis.
fn taps(n_in: usize, n_out: usize, method: Method) -> Vec<Vec<(usize, f32)>> {
    let scale = n_in as f32 / n_out as f32;
    let clamp = |i: isize| i.clamp(0, n_in as isize - 1) as usize;
    (0..n_out)
        .map(|o| match method {
            Method::NearestExact => vec![((((o as f32 + 0.5) * scale).floor() as usize).min(n_in - 1), 1.0)],
            Method::Bilinear => {
                let f = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
                let i0 = (f.floor() as usize).min(n_in - 1);
                let i1 = (i0 + 1).min(n_in - 1);
                let t = f - i0 as f32;
                vec![(i0, 1.0 - t), (i1, t)]
            }
            Method::Bicubic => {
                // A = -0.75, as torch's plain bicubic.
                let f = (o as f32 + 0.5) * scale - 0.5;
                let i = f.floor() as isize;
                let t = f - i as f32;
                (-1..=2).map(|k| (clamp(i + k), cubic((t - k as f32) as f64, -0.75) as f32)).collect()
            }
            Method::Area => {
                let start = (o * n_in) / n_out;
                let end = ((o + 1) * n_in).div_ceil(n_out);
                let k = (end - start) as f32;
                (start..end).map(|i| (i, 1.0 / k)).collect()
            }
            Method::Nearest => vec![(((o as f32 * scale).floor() as usize).min(n_in - 1), 1.0)],
            Method::BilinearAntialiased => filter_taps(n_in, o, n_in as f64 / n_out as f64, 1.0, |x| (1.0 - x.abs()).max(0.0)),
            Method::BicubicAntialiased => filter_taps(n_in, o, n_in as f64 / n_out as f64, 2.0, |x| cubic(x, -0.5)),
            Method::Lanczos => filter_taps(n_in, o, n_in as f64 / n_out as f64, 3.0, |x| if (-3.0..3.0).contains(&x) { sinc(x) * sinc(x / 3.0) } else { 0.0 }),
        })
        .collect()
}

/// Resample one `w`×`h` plane (row-major) to `ow`×`oh`.
pub fn resize_plane(src: &[f32], w: usize, h: usize, ow: usize, oh: usize, method: Method) -> Vec<f32> {
    let (tx, ty) = (taps(w, ow, method), taps(h, oh, method));
    // Separable: rows first, then columns.
    let mut rows = vec![0f32; h * ow];
    for y in 0..h {
        for (x, t) in tx.iter().enumerate() {
            rows[y * ow + x] = t.iter().map(|&(i, k)| src[y * w + i] * k).sum();
        }
    }
    let mut out = vec![0f32; oh * ow];
    for (y, t) in ty.iter().enumerate() {
        for x in 0..ow {
            out[y * ow + x] = t.iter().map(|&(i, k)| rows[i * ow + x] * k).sum();
        }
    }
    out
}

/// The centred crop of a `w`×`h` source to the aspect ratio of `ow`×`oh` (ComfyUI's
/// `crop="center"`): (x0, y0, cw, ch).
pub fn center_crop(w: usize, h: usize, ow: usize, oh: usize) -> (usize, usize, usize, usize) {
    let (src, dst) = (w as f64 / h as f64, ow as f64 / oh as f64);
    if src > dst {
        let cw = ((h as f64 * dst).round() as usize).clamp(1, w);
        ((w - cw) / 2, 0, cw, h)
    } else {
        let ch = ((w as f64 / dst).round() as usize).clamp(1, h);
        (0, (h - ch) / 2, w, ch)
    }
}
