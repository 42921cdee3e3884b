//! A1111's `/sdapi/v1/progress` while a prompt runs: the live step, the estimate, the
//! latest preview, and nothing once it is interrupted.

mod common;

use base64::Engine;
use common::start;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reports_the_running_prompt_live() {
    let s = start(|_| {}).await;
    let (_, idle) = s.get("/sdapi/v1/progress").await;
    assert_eq!((idle["progress"].as_f64(), idle["state"]["job_count"].as_u64()), (Some(0.0), Some(0)));
    // 2000 steps of 5 ms, a preview halfway.
    let id = s.hold_worker("live").await;
    let mut seen = None;
    for _ in 0..400 {
        let (_, p) = s.get("/sdapi/v1/progress").await;
        if p["state"]["sampling_step"].as_u64().unwrap_or(0) > 1000 && !p["current_image"].is_null() {
            seen = Some(p);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let p = seen.expect("the running prompt's progress past its halfway preview");
    assert_eq!(p["state"]["job"], json!(id));
    assert_eq!(p["state"]["job_count"], 1);
    assert_eq!(p["state"]["sampling_steps"], 2000);
    let fraction = p["progress"].as_f64().unwrap();
    assert!(fraction > 0.5 && fraction < 1.0, "{fraction}");
    assert!(p["eta_relative"].as_f64().unwrap() > 0.0);
    let image = base64::engine::general_purpose::STANDARD.decode(p["current_image"].as_str().unwrap()).unwrap();
    assert!(image.starts_with(&[0xff, 0xd8]) || image.starts_with(b"\x89PNG"), "an encoded image");

    assert_eq!(s.post("/sdapi/v1/interrupt", json!({})).await.0, 200);
    let entry = s.wait_history(&id).await;
    assert_eq!(entry["status"]["status_str"], "error");
    let (_, after) = s.get("/sdapi/v1/progress").await;
    assert_eq!((after["progress"].as_f64(), after["state"]["job"].as_str(), after["current_image"].is_null()), (Some(0.0), Some(""), true));
}
