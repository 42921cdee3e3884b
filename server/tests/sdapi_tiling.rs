//! A1111's `tiling` (seamless tiling) on a tiny random-weight SD1 checkpoint: `true` builds
//! the graph of sd-cli's `--circular` (SeamlessTile, MakeCircularVAE) and changes the image,
//! in txt2img and img2img; `false` is the plain image; anything but a boolean is refused.

mod common;

use base64::Engine;
use common::start_in;
use sdflow_core::dtype::DType;
use sdflow_core::synth::{ensure_checkpoint, Format, SdConfig};
use serde_json::{json, Value as Json};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn pixels(b64: &Json) -> Vec<u8> {
    let bytes = B64.decode(b64.as_str().unwrap()).unwrap();
    image::load_from_memory(&bytes).unwrap().to_rgb8().into_raw()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a1111_tiling_makes_the_image_circular() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = tmp.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    ensure_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let mut s = start_in(tmp.path(), |_| {}, true).await;

    let gen = |route: &'static str, extra: Json| {
        let mut body = json!({"prompt": "a cat", "width": 64, "height": 64, "steps": 2, "cfg_scale": 5.0, "seed": 3, "sampler_name": "Euler"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let s = &s;
        async move {
            let (code, r) = s.post(route, body).await;
            assert_eq!(code, 200, "{route}: {r}");
            pixels(&r["images"][0])
        }
    };
    let plain = gen("/sdapi/v1/txt2img", json!({})).await;
    assert_eq!(gen("/sdapi/v1/txt2img", json!({"tiling": false})).await, plain);
    let tiled = gen("/sdapi/v1/txt2img", json!({"tiling": true})).await;
    assert_ne!(tiled, plain, "tiling changes the image");

    // img2img: the input encoded and the result decoded with the circular VAE.
    let mut png = Vec::new();
    image::RgbImage::from_fn(64, 64, |x, y| image::Rgb([(x * 4) as u8, (y * 4) as u8, 128])).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    let init = json!({"init_images": [B64.encode(&png)], "denoising_strength": 0.5});
    let mut tiled_init = init.clone();
    tiled_init["tiling"] = json!(true);
    assert_ne!(gen("/sdapi/v1/img2img", tiled_init).await, gen("/sdapi/v1/img2img", init).await);

    // Not a boolean: a 400 naming the field.
    let (code, r) = s.post("/sdapi/v1/txt2img", json!({"prompt": "a cat", "tiling": "yes"})).await;
    assert_eq!(code, 400, "{r}");
    assert!(r.to_string().contains("`tiling`"), "{r}");
    s.shutdown().await;
}
