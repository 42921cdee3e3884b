//! Bad input and the security model: malformed JSON, huge bodies, path traversal and
//! symlink escapes, foreign origins, tokens.

mod common;

use common::{quick_prompt, send, start};
use serde_json::{json, Value as Json};

fn png(w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgba);
        enc.set_depth(png::BitDepth::Eight);
        let px: Vec<u8> = (0..w * h)
            .flat_map(|i| [(i % 251) as u8, 40, 200, 255])
            .collect();
        enc.write_header().unwrap().write_image_data(&px).unwrap();
    }
    out
}

/// A PNG whose header claims `w`x`h`, with a token IDAT (a decompression bomb's shape: the
/// pixel data is never needed to refuse it).
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(w.to_be_bytes());
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, 6, 0, 0, 0]);
    out.extend(13u32.to_be_bytes());
    out.extend(&ihdr);
    out.extend(crc32(&ihdr).to_be_bytes());
    for (kind, data) in [
        (&b"IDAT"[..], &[0x78u8, 0x9c, 0x03, 0x00][..]),
        (&b"IEND"[..], &[][..]),
    ] {
        let mut chunk = kind.to_vec();
        chunk.extend_from_slice(data);
        out.extend((data.len() as u32).to_be_bytes());
        out.extend(&chunk);
        out.extend(crc32(&chunk).to_be_bytes());
    }
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

async fn upload(
    s: &common::TestServer,
    bytes: Vec<u8>,
    name: &str,
    fields: &[(&str, &str)],
) -> (u16, Json) {
    let mut form = reqwest::multipart::Form::new().part(
        "image",
        reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()),
    );
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    let r = send(s.http.post(s.url("/upload/image")).multipart(form)).await;
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Json::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_and_huge_bodies() {
    let mut s = start(|c| c.max_body_bytes = 64 << 10).await;
    // A server that answers 413 before reading the body closes the connection; a pooled
    // client would then send the next request down the closed one.
    s.http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for body in ["{not json", "", "[1,2", "\"prompt\""] {
        let r = send(s.http.post(s.url("/prompt")).body(body)).await;
        assert_eq!(r.status(), 400, "body {body:?}");
        let j: Json = r.json().await.unwrap();
        assert_eq!(j["error"]["type"], "bad_request", "{j}");
    }
    let r = send(s.http.post(s.url("/prompt")).body("{\n  \"prompt\": {\"1\": }\n}")).await;
    let j: Json = r.json().await.unwrap();
    assert!(
        j["error"]["message"].as_str().unwrap().contains("line 2"),
        "{j}"
    );
    // Wrong types inside a well-formed body.
    for (path, body) in [
        ("/prompt", json!({"prompt": {"1": {"class_type": 5}}})),
        ("/prompt", json!({"prompt": quick_prompt(1, "x"), "number": "soon"})),
        ("/queue", json!({"delete": "all"})),
    ] {
        assert_eq!(s.post(path, body.clone()).await.0, 400, "{path} {body}");
    }

    let huge = format!(
        "{{\"prompt\": {{}}, \"pad\": \"{}\"}}",
        "x".repeat(200 << 10)
    );
    let r = send(s.http.post(s.url("/prompt")).body(huge)).await;
    assert_eq!(r.status(), 413);
    let j: Json = r.json().await.unwrap();
    assert_eq!(j["error"]["type"], "payload_too_large");
    let (code, j) = upload(&s, vec![0u8; 300 << 10], "big.png", &[]).await;
    assert_eq!(code, 413, "{j}");
    // The server is still fine afterwards.
    assert_eq!(
        s.post("/prompt", json!({"prompt": quick_prompt(1, "ok")}))
            .await
            .0,
        200
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_and_view_stay_in_their_folders() {
    let mut s = start(|_| {}).await;
    let outside = s.dir.join("secret.txt");
    std::fs::write(&outside, b"secret").unwrap();

    let (code, r) = upload(&s, png(8, 6), "cat.png", &[]).await;
    assert_eq!(
        (code, r.clone()),
        (
            200,
            json!({"name": "cat.png", "subfolder": "", "type": "input"})
        )
    );
    assert!(s.dir.join("input/cat.png").is_file());
    // The same bytes again reuse the name; other bytes get " (1)".
    assert_eq!(
        upload(&s, png(8, 6), "cat.png", &[]).await.1["name"],
        "cat.png"
    );
    assert_eq!(
        upload(&s, png(9, 6), "cat.png", &[]).await.1["name"],
        "cat (1).png"
    );
    assert_eq!(
        upload(&s, png(10, 6), "cat.png", &[("overwrite", "true")])
            .await
            .1["name"],
        "cat.png"
    );
    let (code, r) = upload(
        &s,
        png(4, 4),
        "dog.png",
        &[("subfolder", "pets/dogs"), ("type", "temp")],
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert!(s.dir.join("output/temp/pets/dogs/dog.png").is_file());

    // View what was uploaded.
    let r = send(s.http.get(s.url("/view?filename=dog.png&subfolder=pets/dogs&type=temp"))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert_eq!(r.bytes().await.unwrap().to_vec(), png(4, 4));

    // Traversal by name, by subfolder, absolute paths, unknown types.
    for q in [
        "filename=../secret.txt&type=output",
        "filename=..%2Fsecret.txt&type=output",
        "filename=secret.txt&subfolder=..&type=output",
        "filename=secret.txt&subfolder=../..&type=input",
        "filename=secret.txt&subfolder=%2Fetc&type=input",
        "filename=%2Fetc%2Fpasswd",
        "filename=passwd&subfolder=%2Fetc",
        "filename=secret.txt&type=root",
    ] {
        let r = send(s.http.get(s.url(&format!("/view?{q}")))).await;
        let code = r.status().as_u16();
        assert!(code == 400 || code == 403, "/view?{q} gave {code}");
        assert_ne!(r.text().await.unwrap(), "secret");
    }
    assert_eq!(
        s.http
            .get(s.url("/view?filename=nothing.png"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        s.http.get(s.url("/view")).send().await.unwrap().status(),
        400
    );

    // A symlink inside the folder that points outside it.
    std::os::unix::fs::symlink(&outside, s.dir.join("input/link.txt")).unwrap();
    std::os::unix::fs::symlink(s.dir.as_path(), s.dir.join("input/escape")).unwrap();
    for q in [
        "filename=link.txt&type=input",
        "filename=secret.txt&subfolder=escape&type=input",
    ] {
        let r = send(s.http.get(s.url(&format!("/view?{q}")))).await;
        assert_eq!(r.status(), 403, "/view?{q}");
    }

    // Uploads: traversal in the subfolder or the name, through a symlinked folder.
    for (name, fields) in [
        ("x.png", vec![("subfolder", "../escaped")]),
        ("x.png", vec![("subfolder", "/tmp")]),
        ("../x.png", vec![]),
        ("x.png", vec![("subfolder", "escape")]),
        ("x.png", vec![("type", "models")]),
    ] {
        let (code, r) = upload(&s, png(2, 2), name, &fields).await;
        assert!(
            code == 400 || code == 403,
            "{name} {fields:?} gave {code} {r}"
        );
    }
    assert!(!s.dir.join("escaped").exists());
    assert!(!s.dir.join("x.png").exists());

    // Not an image; an image too large to decode.
    let (code, r) = upload(&s, b"#!/bin/sh\necho hi\n".to_vec(), "evil.png", &[]).await;
    assert_eq!(code, 400, "{r}");
    // A video (LoadVideo's) is taken by its signature; a script named .mp4 is not.
    let (code, r) = upload(&s, b"\0\0\0\x18ftypisom\0\0\x02\0isomiso2".to_vec(), "clip.mp4", &[]).await;
    assert_eq!((code, r["name"].as_str()), (200, Some("clip.mp4")), "{r}");
    let (code, r) = upload(&s, b"#!/bin/sh\necho hi\n".to_vec(), "evil.mp4", &[]).await;
    assert_eq!(code, 400, "{r}");
    let (code, r) = upload(&s, png_header_only(20000, 20000), "huge.png", &[]).await;
    assert_eq!(code, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("20000x20000"),
        "{r}"
    );
    let form = reqwest::multipart::Form::new().text("overwrite", "true");
    let r = send(s.http.post(s.url("/upload/image")).multipart(form)).await;
    assert_eq!(r.status(), 400);
    let r = send(s.http.post(s.url("/upload/image")).body("plain")).await;
    assert_eq!(r.status(), 400);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mask_upload_puts_the_mask_alpha_on_the_original() {
    let mut s = start(|_| {}).await;
    assert_eq!(upload(&s, png(8, 6), "orig.png", &[]).await.0, 200);
    let mut mask = image::RgbaImage::new(8, 6);
    for (x, _, p) in mask.enumerate_pixels_mut() {
        p.0 = [0, 0, 0, if x < 4 { 0 } else { 255 }];
    }
    let mut bytes = Vec::new();
    image::DynamicImage::ImageRgba8(mask)
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .unwrap();
    let form = reqwest::multipart::Form::new()
        .part(
            "image",
            reqwest::multipart::Part::bytes(bytes.clone()).file_name("clipspace-mask.png"),
        )
        .text(
            "original_ref",
            json!({"filename": "orig.png", "type": "input", "subfolder": ""}).to_string(),
        );
    let r = send(s.http.post(s.url("/upload/mask")).multipart(form)).await;
    assert_eq!(r.status(), 200);
    let j: Json = r.json().await.unwrap();
    let out = image::open(s.dir.join("input").join(j["name"].as_str().unwrap()))
        .unwrap()
        .to_rgba8();
    let orig = image::load_from_memory(&png(8, 6)).unwrap().to_rgba8();
    assert_eq!(
        out.get_pixel(1, 1).0,
        [orig.get_pixel(1, 1).0[0], 40, 200, 0]
    );
    assert_eq!(out.get_pixel(6, 1).0[3], 255);
    // original_ref may not leave its folder either.
    let form = reqwest::multipart::Form::new()
        .part(
            "image",
            reqwest::multipart::Part::bytes(bytes).file_name("m.png"),
        )
        .text(
            "original_ref",
            json!({"filename": "orig.png", "type": "input", "subfolder": "../.."}).to_string(),
        );
    let r = send(s.http.post(s.url("/upload/mask")).multipart(form)).await;
    assert_eq!(r.status(), 403);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_origins_are_refused_unless_allowed() {
    let mut s = start(|c| c.cors_origins = vec!["http://editor.test:3000".into()]).await;
    let host = s.base.trim_start_matches("http://").to_string();
    let from = |origin: &str| send(s.http.post(s.url("/prompt")).header("Origin", origin).json(&json!({"prompt": quick_prompt(1, "o")})));
    let r = from("https://evil.example").await;
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    assert_eq!(from("http://127.0.0.1:1").await.status(), 403);
    assert_eq!(from("null").await.status(), 403);
    // The server's own pages may call it.
    assert_eq!(from(&format!("http://{host}")).await.status(), 200);
    // An allowed origin gets through, with CORS headers, and its preflight is answered.
    let r = from("http://editor.test:3000").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://editor.test:3000"
    );
    let r = send(s.http.request(reqwest::Method::OPTIONS, s.url("/prompt")).header("Origin", "http://editor.test:3000").header("Access-Control-Request-Method", "POST")).await;
    assert_eq!(r.status(), 204);
    assert!(r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("Authorization"));
    // No Origin at all (curl, scripts) is fine.
    assert_eq!(s.get("/queue").await.0, 200);
    // A WebSocket from a foreign page is refused too.
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        s.ws_url("w"),
    )
    .unwrap();
    req.headers_mut()
        .insert("Origin", "https://evil.example".parse().unwrap());
    assert!(tokio_tungstenite::connect_async(req).await.is_err());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_required_when_set() {
    let mut s = start(|c| c.auth_token = Some("s3cret token".into())).await;
    let r = send(s.http.get(s.url("/queue"))).await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = send(s.http.get(s.url("/queue")).bearer_auth("wrong")).await;
    assert_eq!(r.status(), 401);
    let r = send(s.http.post(s.url("/prompt")).json(&json!({"prompt": quick_prompt(1, "t")}))).await;
    assert_eq!(r.status(), 401);
    let r = send(s.http.get(s.url("/view?filename=x.png"))).await;
    assert_eq!(r.status(), 401);
    let r = send(s.http.get(s.url("/queue")).bearer_auth("s3cret token")).await;
    assert_eq!(r.status(), 200);
    let r = send(s.http.get(s.url("/queue?token=s3cret%20token"))).await;
    assert_eq!(r.status(), 200);
    assert!(tokio_tungstenite::connect_async(s.ws_url("t"))
        .await
        .is_err());
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("{}&token=s3cret+token", s.ws_url("t")))
            .await
            .unwrap();
    use futures_util::StreamExt;
    let first = ws.next().await.unwrap().unwrap();
    assert!(first.to_text().unwrap().contains("\"status\""));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_the_editor_page() {
    let mut s = start(|_| {}).await;
    let r = s.http.post(s.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = s.http.get(s.url("/no/such/asset.js")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // The editor's page is whatever the ui crate embeds.
    let r = s.http.get(s.url("/")).send().await.unwrap();
    match sdflow_ui::asset("") {
        Some(a) => {
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["content-type"], a.mime);
            assert_eq!(r.bytes().await.unwrap().to_vec(), a.bytes.to_vec());
        }
        None => assert_eq!(r.status(), 404),
    }
    s.shutdown().await;
}

/// DNS rebinding: a page whose name now points at 127.0.0.1 is same-origin as far as the
/// browser knows, so only its `Host` gives it away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hosts_are_refused_on_loopback() {
    let mut s = start(|c| c.allowed_hosts = vec!["sdflow.lan".into()]).await;
    let port = s.server.as_ref().unwrap().addr().port();
    let with_host = |host: String| {
        let host_origin = format!("http://{host}");
        send(
            s.http
                .post(s.url("/prompt"))
                .header("Host", host)
                .header("Origin", host_origin)
                .json(&json!({"prompt": quick_prompt(1, "h")})),
        )
    };
    for foreign in [format!("evil.example:{port}"), "evil.example".into(), format!("10.1.2.3:{port}")] {
        let r = with_host(foreign.clone()).await;
        assert_eq!(r.status(), 403, "{foreign}");
        let j: Json = r.json().await.unwrap();
        assert!(j["error"]["message"].as_str().unwrap().contains(&foreign), "{j}");
    }
    for local in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}"), format!("sdflow.lan:{port}")] {
        assert_eq!(with_host(local.clone()).await.status(), 200, "{local}");
    }
    // GETs and the WebSocket handshake are guarded the same way.
    let r = send(s.http.get(s.url("/queue")).header("Host", "evil.example")).await;
    assert_eq!(r.status(), 403);
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        s.ws_url("h"),
    )
    .unwrap();
    req.headers_mut()
        .insert("Host", format!("evil.example:{port}").parse().unwrap());
    assert!(tokio_tungstenite::connect_async(req).await.is_err());
    s.shutdown().await;
}

/// A1111's mask is held to the same size limits as every other image, from its header,
/// before anything decodes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a1111_masks_are_size_checked_before_decoding() {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut s = start(|c| {
        std::fs::create_dir_all(c.models_dir.join("checkpoints")).unwrap();
        std::fs::write(c.models_dir.join("checkpoints/m.safetensors"), b"").unwrap();
    })
    .await;
    let body = json!({
        "prompt": "a cat",
        "init_images": [b64(&png(8, 6))],
        "mask": format!("data:image/png;base64,{}", b64(&png_header_only(20000, 20000))),
    });
    let (code, r) = s.post("/sdapi/v1/img2img", body).await;
    assert_eq!(code, 400, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("mask is 20000x20000"), "{r}");
    s.shutdown().await;
}

/// `/sdapi/v1/upscalers` reports each model's scale as its weights imply it, and no scale
/// for a file whose header says nothing of one; detectors have their model folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upscalers_report_their_scale() {
    use sdflow_core::models::esrgan::{write_random, Arch, CompactConfig, RrdbConfig};
    let mut s = start(|c| {
        let dir = c.models_dir.join("upscale_models");
        std::fs::create_dir_all(&dir).unwrap();
        // x2plus's shape: two ×2 stages over a 2× pixel-unshuffled input.
        let x2 = RrdbConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_grow: 4, num_blocks: 1, num_upsample: 2, unshuffle: 2 };
        write_random(&dir.join("x2.safetensors"), &Arch::Rrdb(x2), 1).unwrap();
        let x3 = CompactConfig { in_channels: 3, out_channels: 3, num_feat: 8, num_conv: 1, upscale: 3 };
        write_random(&dir.join("x3.safetensors"), &Arch::Compact(x3), 2).unwrap();
        std::fs::write(dir.join("broken.pth"), b"not a model").unwrap();
        std::fs::create_dir_all(c.models_dir.join("ultralytics")).unwrap();
        std::fs::write(c.models_dir.join("ultralytics/face_yolov8n.pt"), b"").unwrap();
    })
    .await;
    let (code, list) = s.get("/sdapi/v1/upscalers").await;
    assert_eq!(code, 200);
    let entry = |name: &str| list.as_array().unwrap().iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no {name} in {list}")).clone();
    assert_eq!(entry("x2")["scale"], 2, "{list}");
    assert_eq!(entry("x3")["scale"], 3, "{list}");
    assert_eq!(entry("x3")["model_path"], "x3.safetensors");
    assert!(entry("broken").get("scale").is_none(), "{list}");
    assert!(s.get("/models").await.1.as_array().unwrap().contains(&json!("ultralytics")));
    assert_eq!(s.get("/models/ultralytics").await.1, json!(["face_yolov8n.pt"]));
    s.shutdown().await;
}
