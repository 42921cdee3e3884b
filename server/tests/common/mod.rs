//! A server on a random loopback port over a temporary folder, with the executor's stub
//! node pack (and, on request, the real nodes).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sdflow_executor::stub::StubStats;
use sdflow_executor::Registry;
use sdflow_server::{RunningServer, ServerConfig};
use serde_json::{json, Value as Json};

pub struct TestServer {
    pub server: Option<RunningServer>,
    pub dir: PathBuf,
    pub base: String,
    pub stats: Arc<StubStats>,
    pub http: reqwest::Client,
    _tmp: Option<tempfile::TempDir>,
}

pub fn config(dir: &Path) -> ServerConfig {
    let mut c = ServerConfig::with_base(dir);
    c.port = 0;
    c
}

/// Starts a server over `dir` (created by the caller, so a restart can reuse it).
pub async fn start_in(
    dir: &Path,
    tweak: impl FnOnce(&mut ServerConfig),
    real_nodes: bool,
) -> TestServer {
    let mut cfg = config(dir);
    tweak(&mut cfg);
    let mut registry = Registry::new();
    let stats = sdflow_executor::stub::register(&mut registry);
    let runtime = Arc::new(
        sdflow_nodes::Runtime::new(&cfg.models_dir, &cfg.output_dir, 2, None)
            .unwrap()
            .with_input_dir(&cfg.input_dir),
    );
    if real_nodes {
        sdflow_nodes::register_all(&mut registry, runtime.clone());
    }
    let server = sdflow_server::start(cfg, Arc::new(registry), runtime)
        .await
        .unwrap();
    let base = format!("http://{}", server.addr());
    TestServer {
        server: Some(server),
        dir: dir.to_path_buf(),
        base,
        stats,
        http: reqwest::Client::new(),
        _tmp: None,
    }
}

pub async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = start_in(tmp.path(), tweak, false).await;
    s._tmp = Some(tmp);
    s
}

/// Sends `req`; the tests look at the response's status and headers themselves.
pub async fn send(req: reqwest::RequestBuilder) -> reqwest::Response {
    req.send().await.unwrap()
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn ws_url(&self, client_id: &str) -> String {
        format!(
            "{}/ws?clientId={client_id}",
            self.base.replacen("http://", "ws://", 1)
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Json) {
        let r = send(self.http.get(self.url(path))).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }

    pub async fn post(&self, path: &str, body: Json) -> (u16, Json) {
        let r = send(self.http.post(self.url(path)).json(&body)).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }

    /// Queues a 10-second prompt and waits until the worker runs it, so that what is
    /// queued next waits behind it; returns its id.
    pub async fn hold_worker(&self, label: &str) -> String {
        let (_, r) = self.post("/prompt", json!({"prompt": slow_prompt(1, 2000, 5, label)})).await;
        let id = r["prompt_id"].as_str().unwrap().to_string();
        for _ in 0..200 {
            if !self.get("/queue").await.1["queue_running"].as_array().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        id
    }

    /// Polls `/history/{id}` until the prompt is there.
    pub async fn wait_history(&self, id: &str) -> Json {
        for _ in 0..600 {
            let (s, h) = self.get(&format!("/history/{id}")).await;
            assert_eq!(s, 200);
            if let Some(e) = h.get(id) {
                return e.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("prompt {id} never reached the history");
    }

    pub async fn shutdown(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await.unwrap();
        }
    }
}

/// StubConstant → StubSlow (progress, a preview halfway) → StubOutput.
pub fn slow_prompt(seed: u64, steps: u64, step_ms: u64, label: &str) -> Json {
    json!({
        "1": {"class_type": "StubConstant", "inputs": {"seed": seed, "size": 4}},
        "2": {"class_type": "StubSlow", "inputs": {"latent": ["1", 0], "steps": steps, "step_ms": step_ms}},
        "3": {"class_type": "StubOutput", "inputs": {"latent": ["2", 0], "label": label}},
    })
}

/// StubConstant → StubOutput: quick.
pub fn quick_prompt(seed: u64, label: &str) -> Json {
    json!({
        "1": {"class_type": "StubConstant", "inputs": {"seed": seed, "size": 4}},
        "2": {"class_type": "StubOutput", "inputs": {"latent": ["1", 0], "label": label}},
    })
}
