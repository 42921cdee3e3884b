//! A bounded loopback load test: 200 prompts from 20 concurrent clients, each with its own
//! WebSocket; nothing may be lost and every result must be retrievable from /history.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::start;
use futures_util::StreamExt;
use serde_json::{json, Value as Json};

const CLIENTS: usize = 20;
const PER_CLIENT: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_prompts_from_twenty_clients() {
    let mut s = start(|c| c.max_queue = CLIENTS * PER_CLIENT).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let http = s.http.clone();
        let url = s.url("/prompt");
        let ws_url = s.ws_url(&format!("load-{c}"));
        tasks.push(tokio::spawn(async move {
            let (mut ws, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
            let mut ids = Vec::new();
            for i in 0..PER_CLIENT {
                let seed = (c * PER_CLIENT + i) as u64;
                // Distinct seeds, so no prompt is answered from another's cache.
                let prompt = json!({
                    "1": {"class_type": "StubConstant", "inputs": {"seed": seed, "size": 16}},
                    "2": {"class_type": "StubScale", "inputs": {"latent": ["1", 0], "factor": 2.0}},
                    "3": {"class_type": "StubOutput", "inputs": {"latent": ["2", 0], "label": format!("load-{seed}")}},
                });
                let r = http.post(&url).json(&json!({"prompt": prompt, "client_id": format!("load-{c}")})).send().await.unwrap();
                assert_eq!(r.status(), 200);
                let j: Json = r.json().await.unwrap();
                ids.push((seed, j["prompt_id"].as_str().unwrap().to_string()));
            }
            // Every prompt of this client reports success on its own socket.
            let mut pending: HashSet<String> = ids.iter().map(|(_, id)| id.clone()).collect();
            while !pending.is_empty() {
                let msg = tokio::time::timeout(Duration::from_secs(60), ws.next()).await.expect("events keep coming").unwrap().unwrap();
                if let Ok(text) = msg.to_text() {
                    let m: Json = serde_json::from_str(text).unwrap();
                    if m["type"] == "execution_success" {
                        let id = m["data"]["prompt_id"].as_str().unwrap();
                        assert!(pending.remove(id) || !ids.iter().any(|(_, i)| i == id), "success twice for {id}");
                    }
                    if m["type"] != "status" {
                        assert!(ids.iter().any(|(_, i)| i == m["data"]["prompt_id"].as_str().unwrap()), "client {c} got another client's event {m}");
                    }
                }
            }
            ids
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    assert_eq!(all.len(), CLIENTS * PER_CLIENT);
    let unique: HashSet<&String> = all.iter().map(|(_, id)| id).collect();
    assert_eq!(unique.len(), all.len(), "prompt ids are unique");

    let (_, history) = s.get("/history").await;
    let history = history.as_object().unwrap();
    assert_eq!(history.len(), all.len());
    for (seed, id) in &all {
        let e = &history[id];
        assert_eq!(e["status"]["status_str"], "success", "{id}");
        let t = &e["outputs"]["3"]["stub_tensors"][0];
        assert_eq!(t["label"], format!("load-{seed}"));
        let expected: f64 = sdflow_executor::stub::constant_values(*seed, 16)
            .iter()
            .map(|v| f64::from(v * 2.0))
            .sum();
        assert!(
            (t["sum"].as_f64().unwrap() - expected).abs() < 1e-4,
            "{id}: {t}"
        );
        let (code, one) = s.get(&format!("/history/{id}")).await;
        assert_eq!(code, 200);
        assert_eq!(&one[id], e);
    }
    assert_eq!(s.get("/prompt").await.1["exec_info"]["queue_remaining"], 0);
    eprintln!(
        "load: {} prompts from {CLIENTS} clients in {:.2} s",
        all.len(),
        elapsed.as_secs_f64()
    );
    s.shutdown().await;
}
