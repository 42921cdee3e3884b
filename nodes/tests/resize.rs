//! Latent/image resampling against `torch.nn.functional.interpolate` (fixture from
//! tests/fixtures/make_resize.py).

use sdflow_nodes::image::resize::{center_crop, resize_plane, Method};

/// Every case of a fixture (`src`, `w`, `h`, `cases` of `mode`, `w`, `h`, `out`) within
/// 1e-5; `n` cases are expected.
fn check_fixture(text: &str, n: usize) {
    let r: serde_json::Value = serde_json::from_str(text).unwrap();
    let src: Vec<f32> = serde_json::from_value(r["src"].clone()).unwrap();
    let (w, h) = (r["w"].as_u64().unwrap() as usize, r["h"].as_u64().unwrap() as usize);
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(cases.len(), n);
    for c in cases {
        let mode = c["mode"].as_str().unwrap();
        let (ow, oh) = (c["w"].as_u64().unwrap() as usize, c["h"].as_u64().unwrap() as usize);
        let want: Vec<f32> = serde_json::from_value(c["out"].clone()).unwrap();
        let got = resize_plane(&src, w, h, ow, oh, Method::parse(mode).unwrap());
        assert_eq!(got.len(), want.len());
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-5, "{mode} {w}x{h} -> {ow}x{oh}: max error {err}");
    }
}

#[test]
fn resize_matches_torch_interpolate() {
    check_fixture(include_str!("fixtures/resize.json"), 12);
}

/// torch's `nearest` and antialiased modes and PIL's Lanczos (fixture from
/// tests/fixtures/make_resize_filters.py): shrinking and growing, by whole and odd
/// factors, so the widened windows and the renormalised borders are both covered.
#[test]
fn filter_methods_match_torch_and_pil() {
    check_fixture(include_str!("fixtures/resize_filters.json"), 20);
}

#[test]
fn method_lists_name_parseable_methods() {
    for name in Method::IMAGE_NAMES.iter().chain(&Method::LATENT_NAMES) {
        assert!(Method::parse(name).is_some(), "{name}");
    }
    assert!(Method::IMAGE_NAMES.contains(&"lanczos"), "ImageScale's lanczos, which the hires preset uses");
}

#[test]
fn center_crop_keeps_the_target_aspect() {
    assert_eq!(center_crop(100, 50, 10, 10), (25, 0, 50, 50));
    assert_eq!(center_crop(50, 100, 20, 10), (0, 37, 50, 25));
    assert_eq!(center_crop(64, 64, 8, 8), (0, 0, 64, 64));
    assert!(Method::parse("bislerp").is_none());
}
