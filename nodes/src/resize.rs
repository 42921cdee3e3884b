//! Resampling of latents and images with PyTorch's `interpolate` semantics
//! (`align_corners=False`), so ComfyUI workflows give the same sizes and values.

/// A resampling method, by ComfyUI's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    NearestExact,
    Bilinear,
    Bicubic,
    /// Box averaging over the covered source pixels (`adaptive_avg_pool2d`).
    Area,
}

impl Method {
    pub const NAMES: [&'static str; 4] = ["nearest-exact", "bilinear", "area", "bicubic"];

    pub fn parse(name: &str) -> Option<Method> {
        Some(match name {
            "nearest-exact" => Method::NearestExact,
            "bilinear" => Method::Bilinear,
            "bicubic" => Method::Bicubic,
            "area" => Method::Area,
            _ => return None,
        })
    }
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
                // Keys' cubic convolution with A = -0.75, as torch.
                let a = -0.75f32;
                let f = (o as f32 + 0.5) * scale - 0.5;
                let i = f.floor() as isize;
                let t = f - i as f32;
                let w = |x: f32| {
                    let x = x.abs();
                    if x <= 1.0 {
                        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                    } else if x < 2.0 {
                        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                (-1..=2).map(|k| (clamp(i + k), w(t - k as f32))).collect()
            }
            Method::Area => {
                let start = (o * n_in) / n_out;
                let end = ((o + 1) * n_in).div_ceil(n_out);
                let k = (end - start) as f32;
                (start..end).map(|i| (i, 1.0 / k)).collect()
            }
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
