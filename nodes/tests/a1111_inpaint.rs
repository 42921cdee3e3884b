//! A1111's img2img preparation (resize modes, masked content "fill", the latent mask)
//! against PIL running A1111's formulas (fixture from tests/fixtures/make_a1111_inpaint.py).

use sdflow_nodes::image::a1111::{fill, latent_mask, resize_geometry, resize_image, ResizeMode};
use sdflow_nodes::values::{Image, Mask};

fn fixture() -> serde_json::Value {
    serde_json::from_str(include_str!("fixtures/a1111_inpaint.json")).unwrap()
}

/// An `[h][w][3]` array of bytes as an IMAGE.
fn image(v: &serde_json::Value) -> Image {
    let rows = v.as_array().unwrap();
    let (h, w) = (rows.len(), rows[0].as_array().unwrap().len());
    let data = rows.iter().flat_map(|r| r.as_array().unwrap().iter().flat_map(|p| p.as_array().unwrap().iter().map(|c| c.as_f64().unwrap() as f32 / 255.0))).collect();
    Image { data, n: 1, height: h, width: w, channels: 3 }
}

fn bytes(img: &Image) -> Vec<i32> {
    img.data.iter().map(|v| (v * 255.0).round() as i32).collect()
}

/// The largest difference in 8-bit steps, and how many values differ at all.
fn diff(got: &Image, want: &Image) -> (i32, usize) {
    assert_eq!((got.width, got.height, got.channels), (want.width, want.height, want.channels));
    let (g, w) = (bytes(got), bytes(want));
    (g.iter().zip(&w).map(|(a, b)| (a - b).abs()).max().unwrap(), g.iter().zip(&w).filter(|(a, b)| a != b).count())
}

#[test]
fn resize_modes_match_a1111() {
    let f = fixture();
    let src = image(&f["image"]);
    for case in f["resize"].as_array().unwrap() {
        let mode = [ResizeMode::Just, ResizeMode::CropAndResize, ResizeMode::ResizeAndFill][case["mode"].as_u64().unwrap() as usize];
        let (w, h) = (case["width"].as_u64().unwrap() as usize, case["height"].as_u64().unwrap() as usize);
        let got = resize_image(&src, mode, w, h).unwrap();
        let want = image(&case["image"]);
        // PIL's fixed-point coefficients against floats: within one 8-bit step.
        let (max, _) = diff(&got, &want);
        assert!(max <= 1, "{mode:?} to {w}x{h}: off by {max}");
    }
}

#[test]
fn resize_geometry_is_a1111s_integer_maths() {
    // 30x24 into 16x16: crop and resize covers (20x16 at -2), resize and fill fits
    // (16x12, bands of 2 above and below).
    assert_eq!(resize_geometry(ResizeMode::CropAndResize, 30, 24, 16, 16), (20, 16, -2, 0));
    assert_eq!(resize_geometry(ResizeMode::ResizeAndFill, 30, 24, 16, 16), (16, 12, 0, 2));
    assert_eq!(resize_geometry(ResizeMode::ResizeAndFill, 30, 24, 45, 20), (25, 20, 10, 0));
    assert_eq!(resize_geometry(ResizeMode::Just, 30, 24, 7, 9), (7, 9, -0, 0));
}

#[test]
fn fill_matches_a1111s_masking_fill() {
    let f = fixture();
    let src = image(&f["image"]);
    let rows = f["mask"].as_array().unwrap();
    let (h, w) = (rows.len(), rows[0].as_array().unwrap().len());
    let data = rows.iter().flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32 / 255.0)).collect();
    let mask = Mask { data, n: 1, height: h, width: w };
    let got = fill(&src, &mask).unwrap();
    let want = image(&f["fill"]);
    let (max, count) = diff(&got, &want);
    assert!(max <= 1 && count * 50 <= got.data.len(), "off by up to {max} in {count} values");
    // The masked block took colours from around it: it is not the original there.
    let at = |img: &Image, x: usize, y: usize| bytes(img)[(y * w + x) * 3..(y * w + x) * 3 + 3].to_vec();
    assert_ne!(at(&got, 15, 10), at(&src, 15, 10));
    assert_eq!(at(&got, 2, 2), at(&src, 2, 2), "unmasked pixels are kept");
}

#[test]
fn latent_mask_is_resized_and_rounded() {
    // An 8x8 mask with its left 5 columns set: at 2x2 the left column is 1, the right one
    // 0.25 → 0 after rounding... as PIL's bicubic gives it.
    let data = (0..64).map(|i| if i % 8 < 5 { 1.0 } else { 0.0 }).collect();
    let m = latent_mask(&Mask { data, n: 1, height: 8, width: 8 }, 2, 2);
    assert_eq!(m.data, vec![1.0, 0.0, 1.0, 0.0]);
    let half = latent_mask(&Mask { data: vec![0.5; 64], n: 1, height: 8, width: 8 }, 2, 2);
    // 0.5 is 128/255 after 8-bit rounding: rounded up, as A1111's np.around of 128/255.
    assert_eq!(half.data, vec![1.0; 4]);
}
