//! The real nodes on a tiny random-weight SD1 checkpoint: a ComfyUI prompt through
//! /prompt and /view, and sd-server's A1111 and OpenAI endpoints.

mod common;

use base64::Engine;
use common::{send, start_in, TestServer};
use sdflow_core::dtype::DType;
use sdflow_core::synth::{ensure_checkpoint, Format, SdConfig};
use serde_json::{json, Value as Json};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn server() -> (TestServer, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = tmp.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    ensure_checkpoint(
        &ckpts.join("model.safetensors"),
        &SdConfig::tiny_sd1_f8(),
        DType::F32,
        7,
        Format::Safetensors,
    )
    .unwrap();
    let s = start_in(tmp.path(), |_| {}, true).await;
    (s, tmp)
}

fn decode_png(b64: &str) -> image::DynamicImage {
    let bytes = B64.decode(b64).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    image::load_from_memory(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comfyui_prompt_on_real_nodes_through_prompt_and_view() {
    let (mut s, _tmp) = server().await;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../workflows/txt2img.json"
    ))
    .unwrap();
    let mut prompt: Json = serde_json::from_str::<Json>(&text).unwrap()["nodes"].clone();
    prompt["4"]["inputs"]["width"] = json!(64);
    prompt["4"]["inputs"]["height"] = json!(64);
    prompt["5"]["inputs"]["steps"] = json!(2);
    let (code, r) = s
        .post("/prompt", json!({"prompt": prompt, "client_id": "real"}))
        .await;
    assert_eq!(code, 200, "{r}");
    let id = r["prompt_id"].as_str().unwrap().to_string();
    let entry = s.wait_history(&id).await;
    assert_eq!(entry["status"]["status_str"], "success", "{entry}");
    let img = &entry["outputs"]["7"]["images"][0];
    assert_eq!(img["type"], "output");
    let url = format!(
        "/view?filename={}&subfolder={}&type=output",
        img["filename"].as_str().unwrap(),
        img["subfolder"].as_str().unwrap()
    );
    let r = s.http.get(s.url(&url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    let bytes = r.bytes().await.unwrap().to_vec();
    let png = image::load_from_memory(&bytes).unwrap();
    assert_eq!((png.width(), png.height()), (64, 64));
    // ComfyUI's metadata: the prompt, so the image reopens as its workflow.
    let meta = sdflow_workflows::metadata::parse_metadata(&bytes).unwrap();
    let prompt_text = meta
        .entries
        .iter()
        .find(|e| e.key == "prompt")
        .expect("a prompt chunk");
    let saved: Json = serde_json::from_str(&prompt_text.text).unwrap();
    assert_eq!(saved["5"]["inputs"]["steps"], 2);
    // No temporary files were left next to the output.
    let leftovers: Vec<_> = std::fs::read_dir(s.dir.join("output"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_server_endpoints_generate_on_the_tiny_model() {
    let (mut s, _tmp) = server().await;
    let (code, r) = s
        .post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "negative_prompt": "blurry", "width": 64, "height": 64, "steps": 2, "cfg_scale": 5.0, "sampler_name": "Euler a", "scheduler": "Karras", "seed": 5, "batch_size": 2}))
        .await;
    assert_eq!(code, 200, "{r}");
    let images = r["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    let first = decode_png(images[0].as_str().unwrap());
    assert_eq!((first.width(), first.height()), (64, 64));
    assert_ne!(
        first.to_rgb8().into_raw(),
        decode_png(images[1].as_str().unwrap()).to_rgb8().into_raw(),
        "batch images differ"
    );
    assert_eq!(r["parameters"]["prompt"], "a cat");
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    assert_eq!(info["seed"], 5);
    assert_eq!(info["sampler_name"], "euler_ancestral");
    assert_eq!(info["scheduler"], "karras");
    // The request went through the queue like any prompt; a batch samples each image
    // from its own seed (A1111's), through VariationNoise.
    let h = s.get("/history").await.1;
    let entry = h.as_object().unwrap().values().next().unwrap();
    let nodes = entry["prompt"][2].as_object().unwrap();
    let class = |c: &str| nodes.values().find(|n| n["class_type"] == c).unwrap_or_else(|| panic!("no {c}"));
    assert_eq!(class("KSamplerSelect")["inputs"]["sampler_name"], "euler_ancestral");
    assert_eq!(class("VariationNoise")["inputs"]["noise_seed"], 5);
    assert_eq!(info["all_seeds"], json!([5, 6]));
    // The seed is honoured: another seed, another image.
    let (_, other) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "negative_prompt": "blurry", "width": 64, "height": 64, "steps": 2, "cfg_scale": 5.0, "sampler_name": "Euler a", "scheduler": "Karras", "seed": 6, "batch_size": 1})).await;
    assert_eq!(
        serde_json::from_str::<Json>(other["info"].as_str().unwrap()).unwrap()["seed"],
        6
    );
    assert_ne!(
        decode_png(other["images"][0].as_str().unwrap())
            .to_rgb8()
            .into_raw(),
        first.to_rgb8().into_raw()
    );

    // A1111's eta: Euler a without noise is Euler.
    let no_eta = |sampler: &str, eta: Option<f64>| {
        let mut body = json!({"prompt": "a cat", "width": 64, "height": 64, "steps": 2, "sampler_name": sampler, "seed": 9});
        if let Some(e) = eta {
            body["eta"] = json!(e);
        }
        body
    };
    let (code, a) = s.post("/sdapi/v1/txt2img", no_eta("Euler a", Some(0.0))).await;
    assert_eq!(code, 200, "{a}");
    let (_, e) = s.post("/sdapi/v1/txt2img", no_eta("Euler", None)).await;
    let (_, ancestral) = s.post("/sdapi/v1/txt2img", no_eta("Euler a", None)).await;
    let pixels = |r: &Json| decode_png(r["images"][0].as_str().unwrap()).to_rgb8().into_raw();
    assert!(pixels(&a) == pixels(&e), "eta 0 takes the noise out of Euler a");
    assert!(pixels(&a) != pixels(&ancestral));

    // img2img from the first image, with and without a mask (as a data URL, as A1111's UI sends).
    let init = images[0].as_str().unwrap();
    let (code, r) = s.post("/sdapi/v1/img2img", json!({"prompt": "a dog", "init_images": [init], "denoising_strength": 0.5, "steps": 2, "seed": 3})).await;
    assert_eq!(code, 200, "{r}");
    let out = decode_png(r["images"][0].as_str().unwrap());
    assert_eq!((out.width(), out.height()), (64, 64));
    let mut mask = image::GrayImage::new(64, 64);
    for (x, _, p) in mask.enumerate_pixels_mut() {
        p.0 = [if x >= 32 { 255 } else { 0 }];
    }
    let mut mask_png = Vec::new();
    image::DynamicImage::ImageLuma8(mask)
        .write_to(
            &mut std::io::Cursor::new(&mut mask_png),
            image::ImageFormat::Png,
        )
        .unwrap();
    let mask_b64 = format!("data:image/png;base64,{}", B64.encode(&mask_png));
    let masked = |seed: i64| {
        let body = json!({"prompt": "a dog", "init_images": [init], "mask": mask_b64, "denoising_strength": 0.6, "steps": 2, "seed": seed});
        let s = &s;
        async move {
            let (code, r) = s.post("/sdapi/v1/img2img", body).await;
            assert_eq!(code, 200, "{r}");
            decode_png(r["images"][0].as_str().unwrap()).to_rgb8()
        }
    };
    let (a, b) = (masked(3).await, masked(4).await);
    // Outside the mask the latent is held at the image whatever the seed; inside it is
    // sampled from the seed's noise.
    let diff = |x0: u32, x1: u32| -> f64 {
        let mut d = 0.0;
        for y in 0..64 {
            for x in x0..x1 {
                for c in 0..3 {
                    d += (f64::from(a.get_pixel(x, y).0[c]) - f64::from(b.get_pixel(x, y).0[c]))
                        .abs();
                }
            }
        }
        d
    };
    assert!(
        diff(40, 64) > 2.0 * diff(0, 24),
        "the masked half depends on the seed more: {} vs {}",
        diff(40, 64),
        diff(0, 24)
    );
    // Inputs written for the request are gone afterwards.
    let left: Vec<_> = std::fs::read_dir(s.dir.join("input"))
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // OpenAI.
    let (code, r) = s
        .post(
            "/v1/images/generations",
            json!({"prompt": "a cat", "n": 1, "size": "64x64", "response_format": "b64_json"}),
        )
        .await;
    assert_eq!(code, 200, "{r}");
    assert!(r["created"].as_u64().unwrap() > 0);
    let g = decode_png(r["data"][0]["b64_json"].as_str().unwrap());
    assert_eq!((g.width(), g.height()), (64, 64));
    let form = reqwest::multipart::Form::new()
        .part(
            "image",
            reqwest::multipart::Part::bytes(B64.decode(init).unwrap()).file_name("in.png"),
        )
        .part(
            "mask",
            reqwest::multipart::Part::bytes(mask_png).file_name("mask.png"),
        )
        .text("prompt", "a dog")
        .text("size", "64x64");
    let r = send(s.http.post(s.url("/v1/images/edits")).multipart(form)).await;
    assert_eq!(r.status(), 200);
    let j: Json = r.json().await.unwrap();
    let e = decode_png(j["data"][0]["b64_json"].as_str().unwrap());
    assert_eq!((e.width(), e.height()), (64, 64));

    // A1111's n_iter × batch_size images with counting seeds, the hires fix at twice the
    // size, and send_images.
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "width": 64, "height": 64, "steps": 1, "seed": 20, "batch_size": 1, "n_iter": 3})).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["images"].as_array().unwrap().len(), 3);
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    assert_eq!(info["all_seeds"], json!([20, 21, 22]));
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "width": 32, "height": 48, "steps": 1, "seed": 1, "enable_hr": true, "hr_scale": 2, "hr_upscaler": "Latent (nearest-exact)", "hr_second_pass_steps": 1, "denoising_strength": 0.5})).await;
    assert_eq!(code, 200, "{r}");
    let hires = decode_png(r["images"][0].as_str().unwrap());
    assert_eq!((hires.width(), hires.height()), (64, 96));
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "width": 32, "height": 32, "steps": 1, "enable_hr": true, "hr_resize_x": 48, "hr_resize_y": 40, "hr_upscaler": "None", "send_images": false})).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["images"], json!([]));
    let h = s.get("/history").await.1;
    assert!(h.to_string().contains("\"lanczos\""), "A1111's None upscaler resizes with Lanczos");

    // A1111's other routes: options (the default model and CLIP skip), progress, PNG info.
    let (code, o) = s.get("/sdapi/v1/options").await;
    assert_eq!((code, o["sd_model_checkpoint"].clone(), o["samples_format"].clone()), (200, json!("model"), json!("png")), "{o}");
    assert_eq!(s.post("/sdapi/v1/options", json!({"sd_model_checkpoint": "model", "CLIP_stop_at_last_layers": 2})).await.0, 200);
    assert_eq!(s.get("/sdapi/v1/options").await.1["CLIP_stop_at_last_layers"], 2);
    let (code, r) = s.post("/sdapi/v1/options", json!({"sd_model_checkpoint": "nope"})).await;
    assert_eq!(code, 400, "{r}");
    let (code, r) = s.post("/sdapi/v1/options", json!({"show_progressbar": true})).await;
    assert!(code == 400 && r.to_string().contains("show_progressbar"), "{r}");
    let (code, p) = s.get("/sdapi/v1/progress").await;
    assert_eq!((code, p["progress"].clone(), p["state"]["job_count"].clone(), p["current_image"].clone()), (200, json!(0.0), json!(0), Json::Null), "{p}");
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a red fox", "negative_prompt": "blurry", "width": 64, "height": 64, "steps": 1, "seed": 77})).await;
    assert_eq!(code, 200, "{r}");
    let (code, info) = s.post("/sdapi/v1/png-info", json!({"image": r["images"][0]})).await;
    assert_eq!(code, 200, "{info}");
    assert_eq!(info["parameters"]["Prompt"], "a red fox");
    assert_eq!(info["parameters"]["Negative prompt"], "blurry");
    assert_eq!(info["parameters"]["Seed"], "77");
    assert!(info["items"]["prompt"].as_str().is_some_and(|t| t.contains("KSampler")), "ComfyUI's prompt rides along: {info}");
    assert_eq!(s.post("/sdapi/v1/interrupt", json!({})).await.0, 200);
    assert_eq!(s.post("/sdapi/v1/refresh-checkpoints", json!({})).await.0, 200);
    assert_eq!(s.get("/sdapi/v1/latent-upscale-modes").await.1[0]["name"], "Latent");
    assert_eq!(s.get("/sdapi/v1/embeddings").await.1["loaded"], json!({}));
    assert_eq!(s.post("/sdapi/v1/options", json!({"CLIP_stop_at_last_layers": 1})).await.0, 200);

    // What sdflow cannot do is refused by field, as are fields it does not know; A1111's
    // defaults for those features pass.
    for (field, value) in [("tiling", json!("yes")), ("restore_faces", json!(true)), ("seed_resize_from_w", json!(64)), ("styles", json!(["x"])), ("alwayson_scripts", json!({"ADetailer": {"args": []}})), ("wings", json!(1))] {
        let mut body = json!({"prompt": "x", "steps": 1, "width": 64, "height": 64});
        body[field] = value;
        let (code, r) = s.post("/sdapi/v1/txt2img", body).await;
        assert_eq!(code, 400, "{field}: {r}");
        // (A script is named by its own key: `alwayson_scripts.ADetailer`.)
        assert!(r["error"]["message"].as_str().unwrap().contains(&format!("`{field}")), "{r}");
    }
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "steps": 1, "width": 64, "height": 64, "tiling": false, "restore_faces": false, "subseed": -1, "subseed_strength": 0, "styles": [], "alwayson_scripts": {}, "script_args": [], "s_noise": 1.0, "do_not_save_grid": true})).await;
    assert_eq!(code, 200, "{r}");
    // Errors name the request's fields, not sd-cli's flags.
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "width": -64, "height": 64})).await;
    assert_eq!(code, 400, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("`width`") && !msg.contains("-W"), "{msg}");
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "lora": [{"path": "ink", "multiplier": 0.5}]})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("`lora`"), "{r}");
    let (code, r) = s.post("/v1/images/generations", json!({"prompt": "x", "n": 0})).await;
    assert_eq!(code, 400, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("`n`") && !msg.contains("-b"), "{msg}");

    // Bad requests name the problem.
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": ""})).await;
    assert_eq!(code, 400, "{r}");
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "sampler_name": "warp drive", "steps": 1, "width": 64, "height": 64})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r.to_string().contains("warp drive"), "{r}");
    let (code, r) = s
        .post(
            "/sdapi/v1/txt2img",
            json!({"prompt": "x", "override_settings": {"sd_model_checkpoint": "nope"}}),
        )
        .await;
    assert_eq!(code, 400);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("model.safetensors"),
        "{r}"
    );
    assert_eq!(
        s.post("/sdapi/v1/img2img", json!({"prompt": "x"})).await.0,
        400
    );
    assert_eq!(
        s.post(
            "/sdapi/v1/img2img",
            json!({"prompt": "x", "init_images": ["!!notbase64"]})
        )
        .await
        .0,
        400
    );
    assert_eq!(
        s.post(
            "/v1/images/generations",
            json!({"prompt": "x", "size": "big"})
        )
        .await
        .0,
        400
    );
    assert_eq!(
        s.post("/sdapi/v1/txt2img", json!({"prompt": "x", "steps": "many"}))
            .await
            .0,
        400
    );
    s.shutdown().await;
}

/// A1111's txt2img and OpenAI's generations on ComfyUI's all-in-one FLUX.1 schnell file:
/// the family's graph is built from what the checkpoint holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_server_endpoints_run_an_all_in_one_flux_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    sdflow_tests::write_flux_models(tmp.path());
    let mut s = start_in(tmp.path(), |_| {}, true).await;
    let (code, r) = s
        .post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "width": 32, "height": 48, "steps": 2, "cfg_scale": 1.0, "seed": 3, "override_settings": {"sd_model_checkpoint": "flux1-schnell-fp8"}}))
        .await;
    assert_eq!(code, 200, "{r}");
    let img = decode_png(r["images"][0].as_str().unwrap());
    assert_eq!((img.width(), img.height()), (32, 48));
    let (code, r) = s
        .post("/v1/images/generations", json!({"prompt": "a cat", "size": "32x32", "model": "flux1-schnell-fp8.safetensors"}))
        .await;
    assert_eq!(code, 200, "{r}");
    let img = decode_png(r["data"][0]["b64_json"].as_str().unwrap());
    assert_eq!((img.width(), img.height()), (32, 32));
    s.shutdown().await;
}

/// sd-server's command line: `--diffusion-model` with its parts is what requests that name
/// no checkpoint run, and its generation flags are their defaults (a request's own fields
/// win); a named checkpoint replaces the diffusion model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_servers_model_and_generation_flags_are_the_requests_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    sdflow_tests::write_flux_models(tmp.path());
    let ckpts = tmp.path().join("models/checkpoints");
    ensure_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let s = start_in(
        tmp.path(),
        |c| {
            let d = &mut c.sdapi_defaults;
            d.diffusion_model = Some("flux1-schnell.safetensors".into());
            d.clip_l = Some("clip_l.safetensors".into());
            d.t5xxl = Some("t5xxl_fp16.safetensors".into());
            d.vae = Some("ae.safetensors".into());
            (d.width, d.height, d.steps, d.cfg_scale) = (32, 48, 2, 1.0);
            d.sampling_method = Some("euler".into());
        },
        true,
    )
    .await;
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "seed": 3})).await;
    assert_eq!(code, 200, "{r}");
    let image = decode_png(r["images"][0].as_str().unwrap());
    assert_eq!((image.width(), image.height()), (32, 48));
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    assert_eq!((info["steps"].as_i64(), info["sampler_name"].as_str(), info["sd_model_name"].as_str()), (Some(2), Some("euler"), Some("flux1-schnell")));
    let prompt = |r: &Json| -> Json {
        let h = r.as_object().unwrap().values().last().unwrap()["prompt"][2].clone();
        h
    };
    let h = s.get("/history").await.1;
    let graph = prompt(&h);
    assert!(graph.as_object().unwrap().values().any(|n| n["class_type"] == "UNETLoader" && n["inputs"]["unet_name"] == "flux1-schnell.safetensors"), "{graph}");
    // The request's own fields win.
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "seed": 3, "steps": 1, "width": 64, "height": 32})).await;
    assert_eq!(code, 200, "{r}");
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    assert_eq!((info["steps"].as_i64(), info["width"].as_i64()), (Some(1), Some(64)));
    // A named checkpoint replaces the diffusion model.
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "steps": 1, "override_settings": {"sd_model_checkpoint": "model.safetensors"}})).await;
    assert_eq!(code, 200, "{r}");
    let info: Json = serde_json::from_str(r["info"].as_str().unwrap()).unwrap();
    assert_eq!(info["sd_model_name"], "model");
    // OpenAI too.
    let (code, r) = s.post("/v1/images/generations", json!({"prompt": "a cat"})).await;
    assert_eq!(code, 200, "{r}");
    let image = decode_png(r["data"][0]["b64_json"].as_str().unwrap());
    assert_eq!((image.width(), image.height()), (32, 48));
}
