//! A1111 features sdflow honours beyond the basics, on a tiny random-weight SD1
//! checkpoint: variation seeds and A1111's seed progression, the refiner, and the
//! ControlNet extension's `alwayson_scripts`.

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
    for (name, seed) in [("model.safetensors", 7), ("other.safetensors", 8)] {
        ensure_checkpoint(&ckpts.join(name), &SdConfig::tiny_sd1_f8(), DType::F32, seed, Format::Safetensors).unwrap();
    }
    // Tiny ControlNets for that UNet, as the ControlNet workflow tests make them.
    let controlnets = tmp.path().join("models/controlnet");
    std::fs::create_dir_all(&controlnets).unwrap();
    for (name, seed) in [("control_v11p_sd15_canny.safetensors", 11), ("control_v11f1p_sd15_depth.safetensors", 12)] {
        sdflow_core::synth::write_controlnet(&controlnets.join(name), &SdConfig::tiny_sd1_f8().unet, 3, seed).unwrap();
    }
    let s = start_in(tmp.path(), |_| {}, true).await;
    (s, tmp)
}

/// The RGB pixels of a base64 PNG.
fn pixels(b64: &Json) -> Vec<u8> {
    let bytes = B64.decode(b64.as_str().unwrap()).unwrap();
    image::load_from_memory(&bytes).unwrap().to_rgb8().into_raw()
}

async fn txt2img(s: &TestServer, body: Json) -> (Vec<Vec<u8>>, Json, Json) {
    let mut full = json!({"prompt": "a cat", "negative_prompt": "blurry", "width": 64, "height": 64, "steps": 3, "cfg_scale": 5.0});
    for (k, v) in body.as_object().unwrap() {
        full[k] = v.clone();
    }
    let (code, r) = s.post("/sdapi/v1/txt2img", full).await;
    assert_eq!(code, 200, "{r}");
    let images = r["images"].as_array().unwrap().iter().map(pixels).collect();
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    (images, info, r)
}

/// The largest difference of two images' channel values, and how many differ.
fn diff(a: &[u8], b: &[u8]) -> (u8, usize) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0, 0), |(m, n), (x, y)| (m.max(x.abs_diff(*y)), n + usize::from(x != y)))
}

/// A1111's `parameters` text of a returned image, as its fields.
async fn png_info(s: &TestServer, image: &Json) -> Json {
    let (code, info) = s.post("/sdapi/v1/png-info", json!({"image": image})).await;
    assert_eq!(code, 200, "{info}");
    info["parameters"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variation_seeds_and_seed_progression_as_a1111() {
    let (mut s, _tmp) = server().await;
    let plain = |seed: i64, sampler: &'static str| json!({"seed": seed, "sampler_name": sampler});

    // n_iter × batch_size images: image i is the image of seed + i alone (its own noise,
    // the ancestral steps' too), and its PNG says so.
    let (batch, info, r) = txt2img(&s, json!({"seed": 5, "subseed": 100, "subseed_strength": 0, "batch_size": 2, "n_iter": 2, "sampler_name": "Euler a"})).await;
    assert_eq!(batch.len(), 4);
    assert_eq!(info["all_seeds"], json!([5, 6, 7, 8]));
    assert_eq!(info["all_subseeds"], json!([100, 101, 102, 103]));
    assert_eq!(info["subseed_strength"], json!(0.0));
    let (seed5, _, _) = txt2img(&s, plain(5, "Euler a")).await;
    let (seed8, _, _) = txt2img(&s, plain(8, "Euler a")).await;
    // The same up to the float rounding of a batch of 4 against one of 1 in the UNet.
    for (i, alone) in [(0, &seed5[0]), (3, &seed8[0])] {
        assert!(diff(&batch[i], alone).0 <= 2, "image {i} is seed {}'s: {:?}", 5 + i, diff(&batch[i], alone));
    }
    assert!(diff(&batch[1], &batch[2]).0 > 8);
    let third = png_info(&s, &r["images"][2]).await;
    assert_eq!(third["Seed"], "7", "{third}");
    assert!(third.get("Variation seed").is_none(), "no variation at strength 0: {third}");

    // Strength 0 is the seed's image, 1 the variation seed's, 0.5 neither (a sampler
    // without step noise, so the initial noise alone makes the image).
    let (s0, _, _) = txt2img(&s, json!({"seed": 5, "subseed": 9, "subseed_strength": 0.0, "sampler_name": "Euler"})).await;
    let (s1, _, _) = txt2img(&s, json!({"seed": 5, "subseed": 9, "subseed_strength": 1.0, "sampler_name": "Euler"})).await;
    let (half, info, r) = txt2img(&s, json!({"seed": 5, "subseed": 9, "subseed_strength": 0.5, "sampler_name": "Euler"})).await;
    let (p5, _, _) = txt2img(&s, plain(5, "Euler")).await;
    let (p9, _, _) = txt2img(&s, plain(9, "Euler")).await;
    assert!(diff(&p5[0], &p9[0]).0 > 8);
    assert_eq!(diff(&s0[0], &p5[0]), (0, 0), "strength 0: seed 5's image");
    assert_eq!(diff(&s1[0], &p9[0]), (0, 0), "strength 1: the variation seed's image");
    assert!(diff(&half[0], &p5[0]).0 > 8 && diff(&half[0], &p9[0]).0 > 8, "strength 0.5 is neither");
    assert_eq!((info["all_seeds"].clone(), info["all_subseeds"].clone(), info["subseed_strength"].clone()), (json!([5]), json!([9]), json!(0.5)));
    let text = png_info(&s, &r["images"][0]).await;
    assert_eq!((text["Seed"].as_str(), text["Variation seed"].as_str(), text["Variation seed strength"].as_str()), (Some("5"), Some("9"), Some("0.5")), "{text}");

    // With a strength A1111 keeps the seed and counts the variation seed: a batch's first
    // image is the single request's (up to a batch's float rounding).
    let (two, info, r) = txt2img(&s, json!({"seed": 5, "subseed": 9, "subseed_strength": 0.5, "sampler_name": "Euler", "batch_size": 2})).await;
    assert_eq!((info["all_seeds"].clone(), info["all_subseeds"].clone()), (json!([5, 5]), json!([9, 10])));
    assert!(diff(&two[0], &half[0]).0 <= 2, "{:?}", diff(&two[0], &half[0]));
    assert!(diff(&two[1], &half[0]).0 > 8);
    let second = png_info(&s, &r["images"][1]).await;
    assert_eq!((second["Seed"].as_str(), second["Variation seed"].as_str()), (Some("5"), Some("10")), "{second}");

    // Bad values are refused by field; seed resizing stays refused.
    for (field, value) in [("subseed_strength", json!(1.5)), ("seed_resize_from_h", json!(64))] {
        let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "steps": 1, "width": 64, "height": 64, field: value})).await;
        assert_eq!(code, 400, "{field}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{r}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refiner_checkpoint_takes_over_at_its_switch() {
    let (mut s, _tmp) = server().await;
    let base = json!({"seed": 5, "sampler_name": "Euler", "steps": 4});
    let with = |refiner: &str, at: f64| {
        let mut b = base.clone();
        b["refiner_checkpoint"] = json!(refiner);
        b["refiner_switch_at"] = json!(at);
        b
    };
    let (plain, _, _) = txt2img(&s, base.clone()).await;
    // The same checkpoint as refiner: the same sampling split in two passes. Only the
    // latent's round trip between them (out of and back into the model's scale) can move
    // a value by a rounding step.
    let (same, _, _) = txt2img(&s, with("model", 0.5)).await;
    assert!(diff(&same[0], &plain[0]).0 <= 2, "{:?}", diff(&same[0], &plain[0]));
    // Another checkpoint refines differently, and more the earlier it takes over.
    let (late, _, _) = txt2img(&s, with("other.safetensors", 0.75)).await;
    let (early, info, _) = txt2img(&s, with("other [abc123]", 0.25)).await;
    assert!(diff(&late[0], &plain[0]).0 > 8, "{:?}", diff(&late[0], &plain[0]));
    assert!(diff(&early[0], &late[0]).0 > 8);
    assert_eq!(info["extra_generation_params"]["Refiner"], "other");
    assert_eq!(info["extra_generation_params"]["Refiner switch at"], 0.25);
    // No refiner by A1111's "None"; a switch at 1 never switches.
    assert_eq!(txt2img(&s, with("None", 0.5)).await.0[0], plain[0]);
    assert_eq!(txt2img(&s, with("other", 1.0)).await.0[0], plain[0]);
    // With A1111's seeds (a batch) the schedule is split between custom samplers.
    let mut batch = with("other", 0.5);
    batch["batch_size"] = json!(2);
    let (refined, _, _) = txt2img(&s, batch.clone()).await;
    batch["refiner_checkpoint"] = json!("model");
    let (unrefined, _, _) = txt2img(&s, batch).await;
    assert_eq!(refined.len(), 2);
    assert!(diff(&unrefined[0], &plain[0]).0 <= 2, "{:?}", diff(&unrefined[0], &plain[0]));
    assert!(diff(&refined[1], &unrefined[1]).0 > 8);

    for (field, value) in [("refiner_checkpoint", json!("nope")), ("refiner_switch_at", json!(1.5))] {
        let mut body = with("other", 0.5);
        body["prompt"] = json!("x");
        body[field] = value;
        let (code, r) = s.post("/sdapi/v1/txt2img", body).await;
        assert_eq!(code, 400, "{field}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{r}");
    }
    s.shutdown().await;
}

/// A base64 PNG of a `w`×`h` control map: bright bars on black.
fn control_png(w: u32, h: u32) -> String {
    let img = image::RgbImage::from_fn(w, h, |x, y| if (x / 8 + y / 12) % 2 == 0 { image::Rgb([250, 250, 250]) } else { image::Rgb([(x * 3) as u8, 10, (y * 2) as u8]) });
    let mut png = Vec::new();
    image::DynamicImage::ImageRgb8(img).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    B64.encode(png)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controlnet_units_of_the_a1111_extension() {
    let (mut s, _tmp) = server().await;
    // The extension's listing routes, and the script list that says it is there.
    assert_eq!(s.get("/controlnet/version").await.1["version"], 2);
    assert_eq!(s.get("/controlnet/model_list").await.1["model_list"], json!(["control_v11f1p_sd15_depth", "control_v11p_sd15_canny"]));
    assert_eq!(s.get("/controlnet/module_list").await.1["module_list"], json!(["none"]));
    assert!(s.get("/sdapi/v1/scripts").await.1["txt2img"].as_array().unwrap().contains(&json!("controlnet")));

    let image = control_png(96, 64);
    let unit = |extra: Json| {
        // What the PyPI client webuiapi sends for a unit, under its "ControlNet" key.
        let mut u = json!({"image": image, "mask": null, "module": "none", "model": "control_v11p_sd15_canny [d14c016b]", "weight": 1.0, "resize_mode": "Crop and Resize", "low_vram": false, "processor_res": 512, "threshold_a": 64, "threshold_b": 64, "guidance_start": 0.0, "guidance_end": 1.0, "control_mode": "Balanced", "pixel_perfect": false, "hr_option": "Both", "enabled": true});
        for (k, v) in extra.as_object().unwrap() {
            u[k] = v.clone();
        }
        u
    };
    let with = |units: Vec<Json>| json!({"seed": 3, "sampler_name": "Euler", "alwayson_scripts": {"ControlNet": {"args": units}}});
    let (plain, _, _) = txt2img(&s, json!({"seed": 3, "sampler_name": "Euler"})).await;
    let (guided, _, r) = txt2img(&s, with(vec![unit(json!({}))])).await;
    assert!(diff(&guided[0], &plain[0]).0 > 8, "the ControlNet guides: {:?}", diff(&guided[0], &plain[0]));
    let h = s.get("/history").await.1.to_string();
    assert!(h.contains("ControlNetApplyAdvanced") && h.contains("control_v11p_sd15_canny.safetensors"), "through ControlNetLoader + ControlNetApplyAdvanced");
    assert!(r["info"].as_str().is_some());
    // The old `input_image` name and the lower-case script key are the same unit.
    let mut old = unit(json!({}));
    let b64 = old.as_object_mut().unwrap().remove("image").unwrap();
    old["input_image"] = b64;
    let (same, _, _) = txt2img(&s, json!({"seed": 3, "sampler_name": "Euler", "alwayson_scripts": {"controlnet": {"args": [old]}}})).await;
    assert_eq!(same[0], guided[0]);
    // A disabled unit is no unit; weight 0 leaves the image as it was (up to rounding);
    // another ControlNet, a stacked second unit, a late range and another fit each
    // change it.
    assert_eq!(txt2img(&s, with(vec![unit(json!({"enabled": false}))])).await.0[0], plain[0]);
    let (zero, _, _) = txt2img(&s, with(vec![unit(json!({"weight": 0.0}))])).await;
    assert!(diff(&zero[0], &plain[0]).0 <= 2, "{:?}", diff(&zero[0], &plain[0]));
    // (The control map's fit moves this tiny random ControlNet's image only a little; the
    // fits themselves are checked in `sdapi::controlnet`'s unit tests.)
    for (what, units, least) in [
        ("another model", vec![unit(json!({"model": "control_v11f1p_sd15_depth"}))], 4),
        ("two units", vec![unit(json!({})), unit(json!({"model": "control_v11f1p_sd15_depth", "weight": 0.7}))], 4),
        ("guidance 0.5..1", vec![unit(json!({"guidance_start": 0.5}))], 4),
        ("Just Resize", vec![unit(json!({"resize_mode": 0}))], 0),
        ("Resize and Fill", vec![unit(json!({"resize_mode": "Resize and Fill"}))], 0),
    ] {
        let (other, _, _) = txt2img(&s, with(units)).await;
        assert!(diff(&other[0], &guided[0]).0 > least, "{what} changes the image: {:?}", diff(&other[0], &guided[0]));
    }
    // img2img: a unit without an image takes the input image, as the extension does.
    let (code, r) = s.post("/sdapi/v1/img2img", json!({"prompt": "a cat", "init_images": [control_png(64, 64)], "steps": 2, "seed": 3, "denoising_strength": 0.6, "alwayson_scripts": {"controlnet": {"args": [{"model": "control_v11p_sd15_canny", "module": "none"}]}}})).await;
    assert_eq!(code, 200, "{r}");

    // What sdflow cannot do is refused by the unit's field.
    for (field, extra) in [
        ("module", json!({"module": "canny"})),
        ("model", json!({"model": "control_sd15_openpose"})),
        ("model", json!({"model": "None"})),
        ("control_mode", json!({"control_mode": 2})),
        ("resize_mode", json!({"resize_mode": "Squash"})),
        ("weight", json!({"weight": 3.0})),
        ("guidance_start", json!({"guidance_start": 0.8, "guidance_end": 0.2})),
        ("image", json!({"image": {"image": image, "mask": image}})),
        ("image", json!({"image": ""})),
        ("wings", json!({"wings": 1})),
    ] {
        let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "steps": 1, "alwayson_scripts": {"controlnet": {"args": [{"enabled": false}, unit(extra.clone())]}}})).await;
        assert_eq!(code, 400, "{extra}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("`alwayson_scripts.controlnet.args[1].{field}`")), "{extra}: {msg}");
    }
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "steps": 1, "alwayson_scripts": {"ADetailer": {"args": [{"ad_model": "face_yolov8n.pt"}]}}})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("`alwayson_scripts.ADetailer`"), "{r}");
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "steps": 1, "refiner_checkpoint": "other", "refiner_switch_at": 0.5, "alwayson_scripts": {"controlnet": {"args": [unit(json!({}))]}}})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("`refiner_checkpoint`"), "{r}");
    s.shutdown().await;
}
