//! A1111's img2img options on a tiny random-weight SD1 checkpoint: the masked content
//! (`inpainting_fill`), the inpaint area "only masked" (`inpaint_full_res` with its
//! padding), the resize modes and the initial noise multiplier. The pixel maths (fill,
//! resize modes, crop region) are checked against A1111's formulas in the unit tests
//! (`sdflow-nodes`' a1111_inpaint, `sdapi::inpaint`); here, what each option does to a
//! run: which pixels it may change, the output's size, the graph it builds.

mod common;

use base64::Engine;
use common::{start_in, TestServer};
use sdflow_core::dtype::DType;
use sdflow_core::synth::{ensure_checkpoint, Format, SdConfig};
use serde_json::{json, Value as Json};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn server() -> (TestServer, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = tmp.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    ensure_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let s = start_in(tmp.path(), |_| {}, true).await;
    (s, tmp)
}

fn png(img: image::DynamicImage) -> String {
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    B64.encode(png)
}

/// A `w`×`h` picture with colour everywhere (gradients and stripes).
fn picture(w: u32, h: u32) -> String {
    png(image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, if (x / 6 + y / 6) % 2 == 0 { 200 } else { 40 }]))))
}

/// A `w`×`h` black mask with the white box `[x1, x2) × [y1, y2)`.
fn mask(w: u32, h: u32, (x1, y1, x2, y2): (u32, u32, u32, u32)) -> String {
    png(image::DynamicImage::ImageLuma8(image::GrayImage::from_fn(w, h, |x, y| image::Luma([if (x1..x2).contains(&x) && (y1..y2).contains(&y) { 255 } else { 0 }]))))
}

fn decode(b64: &str) -> image::RgbImage {
    image::load_from_memory(&B64.decode(b64).unwrap()).unwrap().to_rgb8()
}

/// Runs img2img on `init` with `extra` fields; the image and the reply's `info`.
async fn img2img(s: &TestServer, init: &str, extra: Json) -> (image::RgbImage, Json) {
    let mut body = json!({"prompt": "a cat", "init_images": [init], "steps": 3, "seed": 3, "cfg_scale": 5.0, "denoising_strength": 0.6, "sampler_name": "Euler"});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (code, r) = s.post("/sdapi/v1/img2img", body).await;
    assert_eq!(code, 200, "{r}");
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    (decode(r["images"][0].as_str().unwrap()), info)
}

/// The pixels of `a` and `b` that differ, inside and outside the box.
fn differing(a: &image::RgbImage, b: &image::RgbImage, (x1, y1, x2, y2): (u32, u32, u32, u32)) -> (usize, usize) {
    assert_eq!(a.dimensions(), b.dimensions());
    let (mut inside, mut outside) = (0, 0);
    for (x, y, p) in a.enumerate_pixels() {
        if p != b.get_pixel(x, y) {
            if (x1..x2).contains(&x) && (y1..y2).contains(&y) {
                inside += 1;
            } else {
                outside += 1;
            }
        }
    }
    (inside, outside)
}

/// The class types of the last prompt's graph.
async fn last_graph(s: &TestServer) -> Vec<String> {
    let h = s.get("/history").await.1;
    // The history lists prompts oldest first.
    let last = h.as_object().unwrap().values().next_back().unwrap().clone();
    last["prompt"][2].as_object().unwrap().values().map(|n| n["class_type"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_content_as_a1111() {
    let (mut s, _tmp) = server().await;
    let init = picture(64, 64);
    let original = decode(&init);
    let square = (24, 24, 40, 40);
    let m = mask(64, 64, square);
    // The whole picture, an unblurred mask: A1111 lays the input back over the result
    // wherever the mask is under one half, so only the square may change.
    let run = |fill: i64| {
        let (s, init, m) = (&s, &init, &m);
        async move { img2img(s, init, json!({"mask": m, "mask_blur": 0, "inpaint_full_res": false, "inpainting_fill": fill})).await }
    };
    let mut results = Vec::new();
    for fill in 0..4 {
        let (img, info) = run(fill).await;
        let (inside, outside) = differing(&img, &original, square);
        assert_eq!(outside, 0, "masked content {fill}: the unmasked part is the input's");
        assert!(inside > 200, "masked content {fill}: the square is repainted ({inside} pixels differ)");
        // A1111 names the masked content in the infotext unless it is the original.
        assert_eq!(info["extra_generation_params"]["Masked content"], [json!("fill"), Json::Null, json!("latent noise"), json!("latent nothing")][fill as usize], "{info}");
        let graph = last_graph(&s).await;
        assert_eq!(graph.iter().any(|c| c == "A1111MaskedFill"), fill == 0, "{graph:?}");
        assert!(graph.iter().any(|c| c == "A1111InpaintLatent") && graph.iter().any(|c| c == "ImageCompositeMasked"), "{graph:?}");
        assert_eq!(graph.iter().any(|c| c == "RandomNoise"), fill == 2, "latent noise draws the sampler's noise: {graph:?}");
        results.push(img);
    }
    // Each content starts the square from something else, so each repaints it otherwise.
    for a in 0..4 {
        for b in a + 1..4 {
            let (inside, outside) = differing(&results[a], &results[b], square);
            assert!(inside > 100 && outside == 0, "contents {a} and {b}: {inside} pixels differ in the square, {outside} outside");
        }
    }
    // A blurred mask (A1111's 4 by default) reaches past the square: the overlay fades.
    let (blurred, _) = img2img(&s, &init, json!({"mask": m, "inpaint_full_res": false, "inpainting_fill": 1})).await;
    assert!(differing(&blurred, &original, square).1 > 0, "the blur spreads the repaint");
    assert_eq!(differing(&blurred, &original, (14, 14, 50, 50)).1, 0, "but not past the blur's reach");
    // An inverted mask repaints the rest and keeps the square.
    let (inverted, info) = img2img(&s, &init, json!({"mask": m, "mask_blur": 0, "inpaint_full_res": false, "inpainting_fill": 1, "inpainting_mask_invert": 1})).await;
    let (inside, outside) = differing(&inverted, &original, square);
    assert!(inside == 0 && outside > 1000, "{inside} / {outside}");
    assert_eq!(info["extra_generation_params"]["Mask mode"], "Inpaint not masked");

    for (field, value) in [("inpainting_fill", json!(4)), ("inpainting_fill", json!("fill")), ("inpaint_full_res", json!("yes")), ("inpaint_full_res_padding", json!(-1)), ("mask_blur", json!(100)), ("mask_round", json!(false))] {
        let (code, r) = s.post("/sdapi/v1/img2img", json!({"prompt": "x", "init_images": [init], "mask": m, "steps": 1, field: value})).await;
        assert_eq!(code, 400, "{field}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{field}: {r}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_masked_inpaints_the_padded_region_and_pastes_it_back() {
    let (mut s, _tmp) = server().await;
    // A wide input, a small mask near its right: the region is the mask's box padded by 8
    // (52..78 × 12..38, already square as 64x64 wants), cut out, inpainted at 64x64 and
    // pasted back into the 96x64 input.
    let init = picture(96, 64);
    let original = decode(&init);
    let m = mask(96, 64, (60, 20, 70, 30));
    let region = (52, 12, 78, 38);
    let (img, info) = img2img(&s, &init, json!({"mask": m, "mask_blur": 0, "inpaint_full_res": true, "inpaint_full_res_padding": 8, "width": 64, "height": 64, "inpainting_fill": 1})).await;
    assert_eq!(img.dimensions(), (96, 64), "the input's size, as A1111 pastes the region back");
    let (inside, outside) = differing(&img, &original, region);
    assert_eq!(outside, 0, "outside the padded region every pixel is the input's");
    assert!(inside > 50, "the masked box is repainted ({inside})");
    assert_eq!(differing(&img, &original, (60, 20, 70, 30)).1, 0, "and with an unblurred mask, only the box");
    assert_eq!(info["extra_generation_params"]["Inpaint area"], "Only masked");
    assert_eq!(info["extra_generation_params"]["Masked area padding"], 8);
    let graph = last_graph(&s).await;
    for class in ["ImageCrop", "A1111ResizeImage", "CropMask", "ImageCompositeMasked"] {
        assert!(graph.iter().any(|c| c == class), "{class} in {graph:?}");
    }
    let h = s.get("/history").await.1.to_string();
    assert!(h.contains("\"x\":52") && h.contains("\"y\":12") && h.contains("\"width\":26"), "the crop region's numbers");

    // The client defaults (fill, only masked, padding 32, blur 4) and the API's (fill,
    // only masked, padding 0) run too; the whole picture gives another image.
    let (defaults, _) = img2img(&s, &init, json!({"mask": m, "width": 64, "height": 64})).await;
    let (explicit, _) = img2img(&s, &init, json!({"mask": m, "width": 64, "height": 64, "inpainting_fill": 0, "inpaint_full_res": true, "inpaint_full_res_padding": 0, "mask_blur": 4})).await;
    assert_eq!(defaults, explicit, "A1111's API defaults: fill, only masked, no padding");
    let (padded, _) = img2img(&s, &init, json!({"mask": m, "width": 64, "height": 64, "inpainting_fill": 0, "inpaint_full_res": 1, "inpaint_full_res_padding": 32})).await;
    assert_ne!(padded, defaults, "the padding changes the crop");
    // With the default blur the mask's box grows by the kernel's reach (10 pixels at 4):
    // beyond it, the input.
    assert_eq!(differing(&padded, &original, (60 - 42, 0, 96, 64)).1, 0);
    let (whole, _) = img2img(&s, &init, json!({"mask": m, "width": 64, "height": 64, "inpainting_fill": 0, "inpaint_full_res": false})).await;
    assert_eq!(whole.dimensions(), (64, 64), "the whole picture is resized to width x height");
    // A blank mask: A1111 runs plain img2img.
    let (blank, _) = img2img(&s, &init, json!({"mask": mask(96, 64, (0, 0, 0, 0)), "width": 64, "height": 64})).await;
    let (plain, _) = img2img(&s, &init, json!({"width": 64, "height": 64})).await;
    assert_eq!(blank, plain);
    // Only masked cuts the mask and the input at the same place: they must agree in size.
    let (code, r) = s.post("/sdapi/v1/img2img", json!({"prompt": "x", "init_images": [init], "mask": mask(64, 64, (1, 1, 9, 9)), "steps": 1})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("`mask`"), "{r}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_modes_and_noise_multiplier_as_a1111() {
    let (mut s, _tmp) = server().await;
    let init = picture(96, 64);
    let mut images = Vec::new();
    for mode in 0..4 {
        let (img, info) = img2img(&s, &init, json!({"width": 64, "height": 48, "resize_mode": mode})).await;
        assert_eq!(img.dimensions(), (64, 48), "resize mode {mode}: A1111's output is width x height");
        let graph = last_graph(&s).await;
        // Modes 0 to 2 fit the image (A1111ResizeImage), 3 the encoded latent.
        assert_eq!(graph.iter().any(|c| c == "A1111ResizeImage"), mode < 3, "{graph:?}");
        assert_eq!(graph.iter().any(|c| c == "LatentUpscale"), mode == 3, "{graph:?}");
        if mode > 0 {
            assert!(info["extra_generation_params"]["Resize mode"].is_string(), "{info}");
        }
        images.push(img);
    }
    for a in 0..4 {
        for b in a + 1..4 {
            assert_ne!(images[a], images[b], "resize modes {a} and {b} start from other pictures");
        }
    }
    let h = s.get("/history").await.1.to_string();
    for mode in ["just resize", "crop and resize", "resize and fill"] {
        assert!(h.contains(mode), "{mode}");
    }
    // Mode 3 with a mask over the whole picture fails in A1111: refused by name.
    let (code, r) = s.post("/sdapi/v1/img2img", json!({"prompt": "x", "init_images": [init], "mask": mask(96, 64, (1, 1, 9, 9)), "inpaint_full_res": false, "width": 64, "height": 48, "resize_mode": 3, "steps": 1})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("`resize_mode`"), "{r}");

    // The initial noise multiplier scales the initial noise: 1 is none, others change
    // the image; it goes through VariationNoise.
    let (one, _) = img2img(&s, &init, json!({"initial_noise_multiplier": 1.0})).await;
    let (none, _) = img2img(&s, &init, json!({})).await;
    assert_eq!(one, none);
    let (half, info) = img2img(&s, &init, json!({"initial_noise_multiplier": 0.5})).await;
    assert_ne!(half, none);
    assert_eq!(info["extra_generation_params"]["Noise multiplier"], 0.5);
    assert!(s.get("/history").await.1.to_string().contains("\"initial_noise_multiplier\":0.5"));
    let (zero, _) = img2img(&s, &init, json!({"initial_noise_multiplier": 0.0})).await;
    assert_ne!(zero, half);

    for (route, field, value) in [("img2img", "resize_mode", json!(4)), ("img2img", "initial_noise_multiplier", json!(-1)), ("txt2img", "resize_mode", json!(1)), ("txt2img", "initial_noise_multiplier", json!(0.5))] {
        let (code, r) = s.post(&format!("/sdapi/v1/{route}"), json!({"prompt": "x", "init_images": if route == "img2img" { json!([init]) } else { json!([]) }, "steps": 1, field: value})).await;
        assert_eq!(code, 400, "{route} {field}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{route} {field}: {r}");
    }
    s.shutdown().await;
}
