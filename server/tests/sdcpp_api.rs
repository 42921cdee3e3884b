//! sd-server's native async API (`/sdcpp/v1/*`) on tiny random-weight models: what
//! capabilities lists, img_gen and vid_gen jobs (AnimateDiff on an SD1 checkpoint, Wan)
//! polled to completion, cancelling queued and generating jobs, and bad requests
//! answered with a 4xx naming the field.

mod common;

use std::time::Duration;

use base64::Engine;
use common::{start_in, TestServer};
use serde_json::{json, Value as Json};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A server over the tiny SD1 checkpoint and the AnimateDiff motion modules.
async fn sd1_server() -> (TestServer, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(tmp.path());
    sdflow_tests::write_animatediff_models(tmp.path());
    let s = start_in(tmp.path(), |_| {}, true).await;
    (s, tmp)
}

/// Polls a job until it has ended; panics after a minute.
async fn wait_job(s: &TestServer, id: &str) -> Json {
    for _ in 0..1200 {
        let (code, job) = s.get(&format!("/sdcpp/v1/jobs/{id}")).await;
        assert_eq!(code, 200, "{job}");
        if ["completed", "failed", "cancelled"].contains(&job["status"].as_str().unwrap()) {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} did not end");
}

/// Submits a job and checks the 202 answer; returns its id.
async fn submit(s: &TestServer, mode: &str, body: Json) -> String {
    let (code, r) = s.post(&format!("/sdcpp/v1/{mode}"), body).await;
    assert_eq!(code, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!((r["kind"].as_str(), r["status"].as_str()), (Some(mode), Some("queued")), "{r}");
    assert!(r["created"].as_i64().unwrap() > 0, "{r}");
    assert_eq!(r["poll_url"].as_str().unwrap(), format!("/sdcpp/v1/jobs/{id}"));
    id
}

fn decode(b64: &Json) -> Vec<u8> {
    B64.decode(b64.as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_list_what_the_server_offers() {
    let (mut s, _tmp) = sd1_server().await;
    let (code, c) = s.get("/sdcpp/v1/capabilities").await;
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["model"]["name"], "model.safetensors", "{c}");
    assert_eq!(c["model"]["stem"], "model");
    assert!(c["model"]["path"].as_str().unwrap().ends_with("model.safetensors"));
    // An SD1 checkpoint makes images, and videos through the motion modules.
    assert_eq!(c["supported_modes"], json!(["img_gen", "vid_gen"]));
    assert_eq!(c["current_mode"], "img_gen");
    assert_eq!(c["defaults"], c["defaults_by_mode"]["img_gen"]);
    assert_eq!(c["output_formats"], json!(["png", "jpeg", "webp"]));
    assert_eq!(c["output_formats_by_mode"]["vid_gen"], json!(["webm", "webp", "avi"]));
    assert_eq!(c["features"], c["features_by_mode"]["img_gen"]);
    assert_eq!(c["features_by_mode"]["vid_gen"]["cancel_generating"], true);
    let d = &c["defaults_by_mode"]["img_gen"];
    for key in ["prompt", "negative_prompt", "clip_skip", "width", "height", "strength", "seed", "batch_count", "hires", "vae_tiling_params", "cache_mode", "output_format", "output_compression"] {
        assert!(d.get(key).is_some(), "defaults lack {key}: {d}");
    }
    assert_eq!((d["width"].as_i64(), d["sample_params"]["sample_steps"].as_i64(), d["output_format"].as_str()), (Some(512), Some(20), Some("png")));
    assert_eq!(c["defaults_by_mode"]["vid_gen"]["output_format"], "webm");
    let names = |key: &str| c[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>();
    for sampler in ["euler", "euler_a", "dpm++2m"] {
        assert!(names("samplers").iter().any(|n| n == sampler), "{sampler} in {}", c["samplers"]);
    }
    for scheduler in ["discrete", "normal", "karras"] {
        assert!(names("schedulers").iter().any(|n| n == scheduler), "{scheduler} in {}", c["schedulers"]);
    }
    assert!(c["loras"].as_array().unwrap().contains(&json!({"name": "v3_sd15_adapter", "path": "v3_sd15_adapter.safetensors"})), "{}", c["loras"]);
    assert!(c["upscalers"].as_array().unwrap().contains(&json!({"name": "Latent (bicubic)"})));
    assert_eq!(c["limits"]["max_batch_count"], 8);
    assert_eq!(c["limits"]["max_queue_size"], 1000);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn img_gen_jobs_complete_with_images_of_the_requested_size() {
    let (mut s, _tmp) = sd1_server().await;
    let id = submit(&s, "img_gen", json!({"prompt": "a red apple", "width": 64, "height": 48, "seed": 3, "sample_params": {"sample_steps": 2, "sample_method": "euler", "scheduler": "discrete"}})).await;
    let job = wait_job(&s, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!((job["id"].as_str(), job["kind"].as_str(), job["error"].clone()), (Some(id.as_str()), Some("img_gen"), Json::Null));
    let (created, started, completed) = (job["created"].as_i64().unwrap(), job["started"].as_i64().unwrap(), job["completed"].as_i64().unwrap());
    assert!(created <= started && started <= completed, "{job}");
    assert_eq!(job["queue_position"], 0);
    assert_eq!(job["result"]["output_format"], "png");
    let images = job["result"]["images"].as_array().unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["index"], 0);
    let png = decode(&images[0]["b64_json"]);
    assert!(png.starts_with(b"\x89PNG"));
    let img = image::load_from_memory(&png).unwrap();
    assert_eq!((img.width(), img.height()), (64, 48));
    // The job is the queue's prompt: it is in the history under its id.
    assert_eq!(s.get(&format!("/history/{id}")).await.1[&id]["status"]["status_str"], "success");

    // A batch as JPEGs, the LoRA from the `lora` list.
    let id = submit(&s, "img_gen", json!({"prompt": "a red apple", "width": 32, "height": 32, "batch_count": 2, "output_format": "jpeg", "output_compression": 80, "sample_params": {"sample_steps": 1}, "lora": [{"path": "v3_sd15_adapter.safetensors", "multiplier": 0.5}]})).await;
    let job = wait_job(&s, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(job["result"]["output_format"], "jpeg");
    let images = job["result"]["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    for (i, item) in images.iter().enumerate() {
        assert_eq!(item["index"], i);
        let jpeg = decode(&item["b64_json"]);
        assert!(jpeg.starts_with(&[0xFF, 0xD8]));
        assert_eq!(image::load_from_memory(&jpeg).unwrap().width(), 32);
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vid_gen_animates_an_sd1_checkpoint_with_a_motion_module() {
    let (mut s, _tmp) = sd1_server().await;
    let id = submit(&s, "vid_gen", json!({"prompt": "a red apple", "width": 32, "height": 32, "video_frames": 4, "fps": 8, "seed": 5, "sample_params": {"sample_steps": 1}})).await;
    let job = wait_job(&s, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    let r = &job["result"];
    assert_eq!((r["output_format"].as_str(), r["mime_type"].as_str(), r["fps"].as_i64(), r["frame_count"].as_i64()), (Some("webm"), Some("video/webm"), Some(8), Some(4)), "{r}");
    let video = sdflow_nodes::video::decode::decode_video_file(&decode(&r["b64_json"])).unwrap();
    assert_eq!((video.frames, video.width, video.height), (4, 32, 32));
    s.shutdown().await;
}

/// A server on the tiny Wan files (`sdflow_tests::write_wan_models`) whose requests run
/// `model` with UMT5 and the Wan 2.1 VAE, and `high_noise` as its high-noise expert.
async fn wan_server(root: &std::path::Path, model: &str, high_noise: Option<sdflow_workflows::presets::HighNoiseParams>) -> TestServer {
    sdflow_tests::write_wan_models(root);
    start_in(
        root,
        |c| {
            let d = &mut c.sdapi_defaults;
            d.diffusion_model = Some(model.into());
            d.t5xxl = Some("umt5_xxl_fp8_e4m3fn_scaled.safetensors".into());
            d.vae = Some("wan_2.1_vae.safetensors".into());
            c.video_defaults.high_noise = high_noise;
        },
        true,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vid_gen_runs_wan_and_its_frames_are_4k_plus_1() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = wan_server(tmp.path(), "wan2.1_t2v_1.3B_fp16.safetensors", None).await;
    let (_, c) = s.get("/sdcpp/v1/capabilities").await;
    assert_eq!((c["supported_modes"].clone(), c["current_mode"].as_str()), (json!(["vid_gen"]), Some("vid_gen")), "{c}");
    assert_eq!(c["model"]["name"], "wan2.1_t2v_1.3B_fp16.safetensors");
    assert_eq!(c["defaults"], c["defaults_by_mode"]["vid_gen"]);
    // As sd-server: a video model makes no images.
    let (code, e) = s.post("/sdcpp/v1/img_gen", json!({"prompt": "a fox"})).await;
    assert_eq!(code, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("does not support img_gen"), "{e}");

    let id = submit(&s, "vid_gen", json!({"prompt": "a fox in snow", "width": 32, "height": 32, "video_frames": 6, "fps": 16, "output_format": "avi", "sample_params": {"sample_steps": 2, "guidance": {"txt_cfg": 5.0}}, "high_noise_sample_params": {"sample_steps": -1}})).await;
    let job = wait_job(&s, &id).await;
    assert_eq!(job["status"], "completed", "{job}");
    let r = &job["result"];
    // 6 frames round down to 5 (4·1 + 1).
    assert_eq!((r["output_format"].as_str(), r["mime_type"].as_str(), r["fps"].as_i64(), r["frame_count"].as_i64()), (Some("avi"), Some("video/x-msvideo"), Some(16), Some(5)), "{r}");
    let avi = decode(&r["b64_json"]);
    assert!(avi.starts_with(b"RIFF") && &avi[8..12] == b"AVI ");
    // One JPEG frame per `00dc` chunk (the index names them too, without the JPEGs).
    assert_eq!(avi.windows(10).filter(|w| &w[..4] == b"00dc" && w[8..] == [0xFF, 0xD8]).count(), 5);
    s.shutdown().await;
}

/// sd-server with `--high-noise-diffusion-model`: a Wan2.2 A14B video job samples its first
/// steps with the high-noise expert at `high_noise_sample_params`, the rest with the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vid_gen_runs_wan22_experts_with_the_servers_high_noise_model() {
    let tmp = tempfile::tempdir().unwrap();
    let high = sdflow_workflows::presets::HighNoiseParams {
        model: "wan2.2_t2v_high_noise_14B_fp16.safetensors".into(),
        steps: -1,
        cfg_scale: 7.0,
        sampling_method: None,
        eta: None,
        boundary: 0.875,
    };
    let mut s = wan_server(tmp.path(), "wan2.2_t2v_low_noise_14B_fp16.safetensors", Some(high)).await;
    let (_, c) = s.get("/sdcpp/v1/capabilities").await;
    assert_eq!(c["features_by_mode"]["vid_gen"]["high_noise_sample_params"], true, "{c}");
    let body = |high: Json| json!({"prompt": "a fox in snow", "width": 32, "height": 32, "video_frames": 5, "output_format": "avi", "sample_params": {"sample_steps": 2, "guidance": {"txt_cfg": 5.0}}, "high_noise_sample_params": high, "moe_boundary": 0.9});
    let mut videos = Vec::new();
    for high in [json!({"sample_steps": 1, "guidance": {"txt_cfg": 3.5}}), json!({"sample_steps": 1, "guidance": {"txt_cfg": 1.0}})] {
        let id = submit(&s, "vid_gen", body(high)).await;
        let job = wait_job(&s, &id).await;
        assert_eq!(job["status"], "completed", "{job}");
        assert_eq!(job["result"]["frame_count"].as_i64(), Some(5));
        videos.push(decode(&job["result"]["b64_json"]));
    }
    assert_ne!(videos[0], videos[1], "the high-noise pass's CFG matters");
    let (code, e) = s.post("/sdcpp/v1/vid_gen", body(json!({"sample_steps": "one"}))).await;
    assert_eq!(code, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("high_noise_sample_params.sample_steps"), "{e}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_and_generating_jobs_are_cancelled() {
    let (mut s, _tmp) = sd1_server().await;
    // A long prompt holds the worker, so the job waits behind it.
    let hold = s.hold_worker("hold").await;
    let id = submit(&s, "img_gen", json!({"prompt": "a red apple", "width": 32, "height": 32, "sample_params": {"sample_steps": 1}})).await;
    let (code, job) = s.get(&format!("/sdcpp/v1/jobs/{id}")).await;
    assert_eq!(code, 200);
    assert_eq!((job["status"].as_str(), job["queue_position"].as_i64(), job["started"].clone(), job["result"].clone()), (Some("queued"), Some(1), Json::Null, Json::Null), "{job}");
    let (code, job) = s.post(&format!("/sdcpp/v1/jobs/{id}/cancel"), json!({})).await;
    assert_eq!(code, 200, "{job}");
    assert_eq!(job["status"], "cancelled", "{job}");
    assert_eq!(job["error"], json!({"code": "cancelled", "message": "job cancelled by client"}));
    assert_eq!((job["started"].clone(), job["queue_position"].as_i64()), (Json::Null, Some(0)));
    assert!(job["completed"].as_i64().is_some());
    // It left the queue; asking again changes nothing.
    assert!(s.get("/queue").await.1["queue_pending"].as_array().unwrap().is_empty());
    let (code, again) = s.post(&format!("/sdcpp/v1/jobs/{id}/cancel"), json!({})).await;
    assert_eq!((code, again["status"].as_str()), (200, Some("cancelled")));
    assert_eq!(s.get(&format!("/sdcpp/v1/jobs/{id}")).await.1["status"], "cancelled");
    s.post("/interrupt", json!({"prompt_id": hold})).await;

    // A generating job stops at its next step.
    let id = submit(&s, "img_gen", json!({"prompt": "a red apple", "width": 64, "height": 64, "sample_params": {"sample_steps": 10000}})).await;
    let mut generating = Json::Null;
    for _ in 0..600 {
        let (_, job) = s.get(&format!("/sdcpp/v1/jobs/{id}")).await;
        if job["status"] == "generating" && job["progress"]["step"].as_u64().is_some_and(|n| n > 0) {
            generating = job;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(generating["progress"]["steps"], 10000, "{generating}");
    assert!(generating["started"].as_i64().is_some(), "{generating}");
    let (code, job) = s.post(&format!("/sdcpp/v1/jobs/{id}/cancel"), json!({})).await;
    assert_eq!((code, job["status"].as_str()), (200, Some("cancelled")), "{job}");
    assert!(job["started"].as_i64().is_some() && job["result"].is_null(), "{job}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_field() {
    let (mut s, _tmp) = sd1_server().await;
    let message = |e: &Json| e["error"]["message"].as_str().unwrap_or_default().to_string();
    for (body, field) in [
        (json!({"width": "big"}), "`width`"),
        (json!({"width": 100000}), "`width`"),
        (json!({"height": 8}), "`height`"),
        (json!({"batch_count": 50}), "`batch_count`"),
        (json!({"seed": 1.5}), "`seed`"),
        (json!({"sample_params": {"sample_steps": "x"}}), "`sample_params.sample_steps`"),
        (json!({"sample_params": {"sample_steps": 0}}), "`sample_params.sample_steps`"),
        (json!({"sample_params": {"sample_method": "bogus"}}), "`sample_params.sample_method`"),
        (json!({"sample_params": {"guidance": {"txt_cfg": "high"}}}), "`sample_params.guidance.txt_cfg`"),
        (json!({"sample_params": []}), "`sample_params`"),
        (json!({"wings": 2}), "`wings`"),
        (json!({"sample_params": {"steps": 3}}), "`sample_params.steps`"),
        (json!({"model": "nope.safetensors"}), "`model`"),
        (json!({"lora": [{"path": "nope.safetensors"}]}), "`lora[0].path`"),
        (json!({"lora": [{"multiplier": 1.0}]}), "`lora[0].path`"),
        (json!({"output_format": "gif"}), "`output_format`"),
        (json!({"init_image": "!!not base64!!"}), "`init_image`"),
        (json!({"init_image": B64.encode(b"not an image")}), "`init_image`"),
        (json!({"cache_mode": "easycache"}), "`cache_mode`"),
        (json!({"prompt": "a cat <lora:v3_sd15_adapter:1>"}), "`prompt`"),
        (json!({"video_frames": 5}), "`video_frames`"),
    ] {
        let (code, e) = s.post("/sdcpp/v1/img_gen", body.clone()).await;
        assert_eq!(code, 400, "{body}: {e}");
        assert!(message(&e).contains(field), "{body}: {field} in {e}");
    }
    for (body, field) in [(json!({"video_frames": -1}), "`video_frames`"), (json!({"fps": 0}), "`fps`"), (json!({"output_format": "png"}), "`output_format`"), (json!({"batch_count": 2}), "`batch_count`"), (json!({"motion_module": "nope"}), "`motion_module`")] {
        let (code, e) = s.post("/sdcpp/v1/vid_gen", body.clone()).await;
        assert_eq!(code, 400, "{body}: {e}");
        assert!(message(&e).contains(field), "{body}: {field} in {e}");
    }
    // Bodies that are not JSON objects.
    for (body, says) in [("", "empty"), ("{\"prompt\": ", "malformed JSON"), ("[1, 2]", "not a JSON object")] {
        let r = s.http.post(s.url("/sdcpp/v1/img_gen")).header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let e: Json = r.json().await.unwrap();
        assert!(message(&e).contains(says), "{body}: {e}");
    }
    // Unknown jobs.
    let (code, e) = s.get("/sdcpp/v1/jobs/job_nope").await;
    assert_eq!(code, 404, "{e}");
    assert!(message(&e).contains("job_nope"), "{e}");
    let (code, _) = s.post("/sdcpp/v1/jobs/job_nope/cancel", json!({})).await;
    assert_eq!(code, 404);
    // Nothing was queued by any of these.
    assert!(s.get("/history").await.1.as_object().unwrap().is_empty());
    s.shutdown().await;
}
