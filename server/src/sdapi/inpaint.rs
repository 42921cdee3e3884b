//! A1111's inpainting mask as its `StableDiffusionProcessingImg2Img.init` makes it, before
//! the graph takes over: the mask made binary (`create_binary_mask`: an alpha channel
//! when the image has one that is not opaque, else its luma), inverted on request,
//! blurred by OpenCV's Gaussian (`mask_blur_x`, `mask_blur_y`); and for inpaint area "only
//! masked" the crop region (`masking.get_crop_region_v2` with the padding, widened to the
//! output's aspect by `masking.expand_crop_region`), which the graph cuts out and pastes
//! back (ImageCrop, A1111ResizeImage, ImageCompositeMasked).

use image::{DynamicImage, GrayImage, Luma};

/// A1111's `create_binary_mask` (with `mask_round`): an RGBA image whose alpha is not all
/// opaque gives its alpha, thresholded above 128; any other its luma (PIL's `L`). White
/// (or opaque) repaints; `invert` swaps.
pub(super) fn binary_mask(img: &DynamicImage, invert: bool) -> GrayImage {
    let rgba = img.to_rgba8();
    let alpha = img.color().has_alpha() && rgba.pixels().any(|p| p.0[3] != 255);
    GrayImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let p = rgba.get_pixel(x, y).0;
        let v = if alpha {
            if p[3] > 128 { 255 } else { 0 }
        } else {
            // PIL's ITU-R 601-2 luma in its fixed point.
            ((u32::from(p[0]) * 19595 + u32::from(p[1]) * 38470 + u32::from(p[2]) * 7471 + 0x8000) >> 16) as u8
        };
        Luma([if invert { 255 - v } else { v }])
    })
}

/// OpenCV's Gaussian kernel of `sigma` over `2·⌊2.5·sigma + 0.5⌋ + 1` taps, as A1111
/// sizes it.
fn kernel(sigma: f64) -> Vec<f64> {
    let r = (2.5 * sigma + 0.5) as i64;
    let k: Vec<f64> = (-r..=r).map(|i| (-(i * i) as f64 / (2.0 * sigma * sigma)).exp()).collect();
    let sum: f64 = k.iter().sum();
    k.into_iter().map(|v| v / sum).collect()
}

/// OpenCV's reflect-101 border: `-1` reads 1, `n` reads `n − 2`.
fn reflect101(i: i64, n: i64) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n - 1);
    let m = i.rem_euclid(period);
    (if m < n { m } else { period - m }) as usize
}

/// A1111's mask blur: `cv2.GaussianBlur` along the rows with `sigma_x`, then along the
/// columns with `sigma_y` (0: none), reflect-101 borders, rounded to 8 bits after each.
pub(super) fn blur(mask: &GrayImage, sigma_x: f64, sigma_y: f64) -> GrayImage {
    let (w, h) = (mask.width() as i64, mask.height() as i64);
    let mut v: Vec<u8> = mask.as_raw().clone();
    for (sigma, horizontal) in [(sigma_x, true), (sigma_y, false)] {
        if sigma <= 0.0 {
            continue;
        }
        let k = kernel(sigma);
        let r = (k.len() / 2) as i64;
        let mut out = vec![0u8; v.len()];
        for y in 0..h {
            for x in 0..w {
                let s: f64 = k
                    .iter()
                    .enumerate()
                    .map(|(j, kv)| {
                        let d = j as i64 - r;
                        let (xx, yy) = if horizontal { (reflect101(x + d, w), y as usize) } else { (x as usize, reflect101(y + d, h)) };
                        kv * f64::from(v[yy * w as usize + xx])
                    })
                    .sum();
                out[(y * w + x) as usize] = s.round().clamp(0.0, 255.0) as u8;
            }
        }
        v = out;
    }
    GrayImage::from_raw(w as u32, h as u32, v).expect("same size")
}

/// A1111's `masking.get_crop_region_v2`: the box `(x1, y1, x2, y2)` of the mask's
/// non-zero pixels grown by `pad` on every side within the mask; `None` for a blank mask.
pub(super) fn crop_region(mask: &GrayImage, pad: i64) -> Option<(i64, i64, i64, i64)> {
    let (w, h) = (i64::from(mask.width()), i64::from(mask.height()));
    let (mut x1, mut y1, mut x2, mut y2) = (w, h, 0, 0);
    for (x, y, p) in mask.enumerate_pixels() {
        if p.0[0] != 0 {
            let (x, y) = (i64::from(x), i64::from(y));
            (x1, y1, x2, y2) = (x1.min(x), y1.min(y), x2.max(x + 1), y2.max(y + 1));
        }
    }
    (x2 > x1).then(|| ((x1 - pad).max(0), (y1 - pad).max(0), (x2 + pad).min(w), (y2 + pad).min(h)))
}

/// A1111's `masking.expand_crop_region`: the region grown on its short side (half each
/// way, Python's integer maths) to the aspect of `pw`×`ph`, shifted back inside the image
/// and cut at its border.
pub(super) fn expand_crop_region((mut x1, mut y1, mut x2, mut y2): (i64, i64, i64, i64), pw: i64, ph: i64, iw: i64, ih: i64) -> (i64, i64, i64, i64) {
    let ratio_crop = (x2 - x1) as f64 / (y2 - y1) as f64;
    let ratio_processing = pw as f64 / ph as f64;
    if ratio_crop > ratio_processing {
        (y1, y2) = grow_axis(y1, y2, (x2 - x1) as f64 / ratio_processing, ih);
    } else {
        (x1, x2) = grow_axis(x1, x2, (y2 - y1) as f64 * ratio_processing, iw);
    }
    (x1, y1, x2, y2)
}

/// One axis of [`expand_crop_region`]: `[lo, hi)` grown to `desired` (truncated, as A1111's
/// `int()`), half on each side, then moved back inside `[0, limit)` and cut there.
fn grow_axis(lo: i64, hi: i64, desired: f64, limit: i64) -> (i64, i64) {
    let diff = (desired - (hi - lo) as f64) as i64;
    let (mut lo, mut hi) = (lo - diff.div_euclid(2), hi + diff - diff.div_euclid(2));
    if hi >= limit {
        let d = hi - limit;
        hi -= d;
        lo -= d;
    }
    if lo < 0 {
        hi -= lo;
        lo = 0;
    }
    (lo, hi.min(limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w`×`h` mask with the box `[x1, x2) × [y1, y2)` set.
    fn boxed(w: u32, h: u32, (x1, y1, x2, y2): (u32, u32, u32, u32)) -> GrayImage {
        GrayImage::from_fn(w, h, |x, y| Luma([if (x1..x2).contains(&x) && (y1..y2).contains(&y) { 255 } else { 0 }]))
    }

    /// Regions from A1111's `get_crop_region_v2` and `expand_crop_region` (numbers from
    /// server/tests/a1111/crop_region.py): image size, mask box, padding, processing size,
    /// the padded box, the expanded region.
    #[test]
    fn crop_regions_are_a1111s() {
        #[allow(clippy::type_complexity)]
        let cases: &[((u32, u32), (u32, u32, u32, u32), i64, (i64, i64), (i64, i64, i64, i64), (i64, i64, i64, i64))] = &[
            ((512, 512), (200, 220, 300, 260), 32, (512, 512), (168, 188, 332, 292), (168, 158, 332, 322)),
            ((512, 512), (10, 10, 40, 30), 0, (512, 512), (10, 10, 40, 30), (10, 5, 40, 35)),
            ((640, 480), (600, 0, 640, 400), 16, (512, 512), (584, 0, 640, 416), (224, 0, 640, 416)),
            ((640, 480), (0, 470, 600, 480), 8, (768, 512), (0, 462, 608, 480), (0, 75, 608, 480)),
            ((300, 200), (100, 50, 101, 51), 0, (64, 96), (100, 50, 101, 51), (100, 50, 101, 51)),
            ((300, 200), (0, 0, 300, 200), 32, (512, 256), (0, 0, 300, 200), (0, 0, 300, 200)),
            ((256, 256), (250, 250, 256, 256), 4, (512, 384), (246, 246, 256, 256), (243, 246, 256, 256)),
        ];
        for &((w, h), b, pad, (pw, ph), want_pad, want) in cases {
            let m = boxed(w, h, b);
            let r = crop_region(&m, pad).unwrap();
            assert_eq!(r, want_pad, "box {b:?} pad {pad}");
            assert_eq!(expand_crop_region(r, pw, ph, i64::from(w), i64::from(h)), want, "box {b:?} pad {pad} to {pw}x{ph}");
        }
        assert_eq!(crop_region(&GrayImage::new(8, 8), 4), None, "a blank mask has no region");
    }

    #[test]
    fn masks_are_made_as_a1111_makes_them() {
        // Luma of an opaque RGB mask; an alpha mask's alpha above 128.
        let rgb = DynamicImage::ImageRgb8(image::RgbImage::from_fn(3, 1, |x, _| image::Rgb([[255, 255, 255], [255, 0, 0], [0, 0, 0]][x as usize])));
        assert_eq!(binary_mask(&rgb, false).as_raw(), &vec![255, 76, 0]);
        assert_eq!(binary_mask(&rgb, true).as_raw(), &vec![0, 179, 255]);
        let rgba = DynamicImage::ImageRgba8(image::RgbaImage::from_fn(3, 1, |x, _| image::Rgba([0, 0, 0, [0, 129, 255][x as usize]])));
        assert_eq!(binary_mask(&rgba, false).as_raw(), &vec![0, 255, 255]);
        // OpenCV's kernel for sigma 4 has 21 taps; a blur spreads a dot over them, the
        // row pass first, and keeps a solid mask solid.
        assert_eq!(kernel(4.0).len(), 21);
        let mut dot = GrayImage::new(31, 31);
        dot.put_pixel(15, 15, Luma([255]));
        let b = blur(&dot, 1.0, 0.0);
        assert_eq!((b.get_pixel(15, 15).0[0], b.get_pixel(16, 15).0[0], b.get_pixel(15, 16).0[0]), (102, 62, 0));
        assert!(blur(&boxed(9, 9, (0, 0, 9, 9)), 4.0, 4.0).pixels().all(|p| p.0[0] == 255));
        assert_eq!((reflect101(-1, 5), reflect101(5, 5), reflect101(-6, 5)), (1, 3, 2));
    }
}
