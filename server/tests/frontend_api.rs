//! The routes ComfyUI's own frontend needs besides the prompt API: per-user settings and
//! files, the jobs list, start-up lists, logs, and `--front-end-root` static serving.

mod common;

use common::{quick_prompt, send, start, TestServer};
use serde_json::{json, Value as Json};

async fn post_raw(s: &TestServer, path: &str, body: &'static str) -> (u16, Json) {
    let r = send(s.http.post(s.url(path)).body(body)).await;
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Json::String(text)))
}

async fn status_of(req: reqwest::RequestBuilder) -> u16 {
    send(req).await.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_stored_per_user_and_merged() {
    let s = start(|_| {}).await;
    assert_eq!(s.get("/api/users").await, (200, json!({"storage": "server", "migrated": false})));
    assert_eq!(s.get("/api/settings").await, (200, json!({})));
    assert_eq!(s.get("/api/settings/Comfy.Locale").await, (200, Json::Null));

    assert_eq!(s.post("/api/settings/Comfy.Locale", json!("en")).await.0, 200);
    assert_eq!(s.post("/api/settings", json!({"Comfy.LinkRenderMode": 2, "Comfy.Locale": "fr"})).await.0, 200);
    assert_eq!(s.get("/api/settings").await.1, json!({"Comfy.LinkRenderMode": 2, "Comfy.Locale": "fr"}));
    assert_eq!(s.get("/api/settings/Comfy.LinkRenderMode").await.1, json!(2));
    assert_eq!(s.get("/api/users").await.1["migrated"], json!(true));
    let file = s.dir.join("user/default/comfy.settings.json");
    let on_disk: Json = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(on_disk["Comfy.Locale"], "fr");

    // Not an object, or not JSON: refused, nothing written.
    assert_eq!(s.post("/api/settings", json!([1, 2])).await.0, 400);
    assert_eq!(post_raw(&s, "/api/settings", "{oops").await.0, 400);
    assert_eq!(s.get("/api/settings").await.1["Comfy.Locale"], "fr");

    // A settings file that no longer parses is kept aside, not overwritten.
    std::fs::write(&file, b"{ half a file").unwrap();
    assert_eq!(s.get("/api/settings").await, (200, json!({})));
    let kept: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("unreadable"))
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(std::fs::read(kept[0].path()).unwrap(), b"{ half a file");
    assert_eq!(s.post("/api/settings/Comfy.Locale", json!("de")).await.0, 200);
    assert_eq!(s.get("/api/settings").await.1, json!({"Comfy.Locale": "de"}));

    // Single-user: no profiles to create.
    assert_eq!(s.post("/api/users", json!({"username": "bob"})).await.0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userdata_files_are_written_listed_moved_and_confined() {
    let s = start(|_| {}).await;
    // No folder yet: v1 says 404 (the frontend reads it as empty), v2 an empty list.
    assert_eq!(s.get("/api/userdata?dir=workflows").await.0, 404);
    assert_eq!(s.get("/api/v2/userdata").await, (200, json!([])));
    assert_eq!(s.get("/api/userdata").await.0, 400);

    let wf = r#"{"nodes": [], "links": []}"#;
    let r = send(s.http.post(s.url("/api/userdata/workflows%2Fa.json?overwrite=false&full_info=true")).body(wf)).await;
    assert_eq!(r.status(), 200);
    let info: Json = r.json().await.unwrap();
    assert_eq!(info["path"], "workflows/a.json");
    assert_eq!(info["size"], wf.len());
    assert!(info["modified"].as_f64().unwrap() > 1.0e9);
    // overwrite=false keeps what is there.
    let r = send(s.http.post(s.url("/api/userdata/workflows%2Fa.json?overwrite=false")).body("other")).await;
    assert_eq!(r.status(), 409);
    let r = send(s.http.get(s.url("/api/userdata/workflows%2Fa.json"))).await;
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.text().await.unwrap(), wf);
    // Default is overwrite; the plain answer is the path.
    let r = send(s.http.post(s.url("/api/userdata/workflows%2Fsub%2Fb.json")).body("{}")).await;
    assert_eq!(r.json::<Json>().await.unwrap(), json!("workflows/sub/b.json"));

    assert_eq!(s.get("/api/userdata?dir=workflows").await.1, json!(["a.json"]));
    assert_eq!(s.get("/api/userdata?dir=workflows&recurse=true").await.1, json!(["a.json", "sub/b.json"]));
    assert_eq!(
        s.get("/api/userdata?dir=workflows&recurse=true&split=true").await.1,
        json!([["a.json", "a.json"], ["sub/b.json", "sub", "b.json"]])
    );
    let v2 = s.get("/api/v2/userdata?path=workflows").await.1;
    let names: Vec<(&str, &str)> = v2.as_array().unwrap().iter().map(|e| (e["type"].as_str().unwrap(), e["path"].as_str().unwrap())).collect();
    assert_eq!(names, [("directory", "workflows/sub"), ("file", "workflows/a.json"), ("file", "workflows/sub/b.json")]);

    // Move: refused onto an existing file without overwrite, done otherwise.
    let r = send(s.http.post(s.url("/api/userdata/workflows%2Fa.json/move/workflows%2Fsub%2Fb.json?overwrite=false"))).await;
    assert_eq!(r.status(), 409);
    let r = send(s.http.post(s.url("/api/userdata/workflows%2Fa.json/move/workflows%2Frenamed.json?full_info=true"))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Json>().await.unwrap()["path"], "workflows/renamed.json");
    assert_eq!(s.get("/api/userdata?dir=workflows").await.1, json!(["renamed.json"]));
    assert_eq!(status_of(s.http.post(s.url("/api/userdata/workflows%2Fgone.json/move/workflows%2Fx.json"))).await, 404);

    assert_eq!(status_of(s.http.delete(s.url("/api/userdata/workflows%2Frenamed.json"))).await, 204);
    assert_eq!(status_of(s.http.delete(s.url("/api/userdata/workflows%2Frenamed.json"))).await, 404);
    assert_eq!(status_of(s.http.get(s.url("/api/userdata/workflows%2Frenamed.json"))).await, 404);

    // Nothing outside the user's folder, however spelt.
    std::fs::write(s.dir.join("secret.txt"), "secret").unwrap();
    for bad in ["..%2F..%2Fsecret.txt", "%2Fetc%2Fpasswd", "workflows%2F..%2F..%2F..%2Fsecret.txt"] {
        let status = status_of(s.http.get(s.url(&format!("/api/userdata/{bad}")))).await;
        assert!(status == 403 || status == 400, "{bad}: {status}");
        let status = status_of(s.http.post(s.url(&format!("/api/userdata/{bad}"))).body("x")).await;
        assert!(status == 403 || status == 400, "{bad}: {status}");
    }
    assert_eq!(std::fs::read_to_string(s.dir.join("secret.txt")).unwrap(), "secret");
    assert_eq!(s.get("/api/userdata?dir=..").await.0, 403);
    // A link inside that leads out is not followed.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&s.dir, s.dir.join("user/default/out")).unwrap();
        assert_eq!(status_of(s.http.get(s.url("/api/userdata/out%2Fsecret.txt"))).await, 403);
        assert_eq!(status_of(s.http.post(s.url("/api/userdata/out%2Fnew.txt")).body("x")).await, 403);
        assert!(!s.dir.join("new.txt").exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_list_the_queue_and_the_history_as_comfyui_does() {
    let s = start(|_| {}).await;
    let done = s.post("/prompt", json!({"prompt": quick_prompt(1, "first"), "extra_data": {"extra_pnginfo": {"workflow": {"id": "wf-1"}}}})).await.1;
    let done = done["prompt_id"].as_str().unwrap().to_string();
    s.wait_history(&done).await;
    let running = s.hold_worker("held").await;
    // create_time has millisecond resolution; equal times keep queue order.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let pending = s.post("/prompt", json!({"prompt": quick_prompt(2, "second")})).await.1["prompt_id"].as_str().unwrap().to_string();

    let (status, all) = s.get("/api/jobs").await;
    assert_eq!(status, 200);
    assert_eq!(all["pagination"], json!({"offset": 0, "limit": null, "total": 3, "has_more": false}));
    let jobs = all["jobs"].as_array().unwrap();
    // Newest first.
    let ids: Vec<&str> = jobs.iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [pending.as_str(), running.as_str(), done.as_str()]);
    let statuses: Vec<&str> = jobs.iter().map(|j| j["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["pending", "in_progress", "completed"]);
    let finished = &jobs[2];
    assert_eq!(finished["workflow_id"], "wf-1");
    // ComfyUI counts every item of every output list (the stub's tensor summary too).
    assert_eq!(finished["outputs_count"], 2);
    assert_eq!(finished["previewable_outputs_count"], 1);
    assert_eq!(finished["preview_output"]["filename"], "first.txt");
    assert_eq!(finished["preview_output"]["nodeId"], "2");
    assert!(finished["execution_end_time"].as_u64().unwrap() >= finished["execution_start_time"].as_u64().unwrap());
    assert!(finished["create_time"].as_u64().unwrap() <= finished["execution_start_time"].as_u64().unwrap());

    let queue = s.get("/api/jobs?status=in_progress,pending&limit=1").await.1;
    assert_eq!(queue["pagination"], json!({"offset": 0, "limit": 1, "total": 2, "has_more": true}));
    assert_eq!(s.get("/api/jobs?status=completed,failed,cancelled&sort_order=asc").await.1["jobs"][0]["id"], json!(done));
    assert_eq!(s.get("/api/jobs?workflow_id=wf-1").await.1["pagination"]["total"], 1);
    for bad in ["status=done", "sort_by=name", "sort_order=up", "limit=0", "limit=x", "offset=x"] {
        assert_eq!(s.get(&format!("/api/jobs?{bad}")).await.0, 400, "{bad}");
    }

    // The detail of a finished job carries its prompt and outputs.
    let detail = s.get(&format!("/api/jobs/{done}")).await.1;
    assert_eq!(detail["workflow"]["prompt"]["2"]["class_type"], "StubOutput");
    assert_eq!(detail["outputs"]["2"]["files"][0]["filename"], "first.txt");
    assert_eq!(detail["execution_status"]["status_str"], "success");
    assert_eq!(s.get("/api/jobs/no-such-job").await.0, 404);

    // Cancelling: the pending one leaves the queue, the running one is interrupted and
    // listed as cancelled, a finished one is left alone, an unknown one is a 404.
    assert_eq!(s.post(&format!("/api/jobs/{pending}/cancel"), json!(null)).await, (200, json!({"cancelled": true})));
    assert_eq!(s.post(&format!("/api/jobs/{done}/cancel"), json!(null)).await, (200, json!({"cancelled": false})));
    assert_eq!(s.post("/api/jobs/no-such-job/cancel", json!(null)).await.0, 404);
    assert_eq!(s.post("/api/jobs/cancel", json!({"job_ids": [running.clone(), "no-such-job"]})).await.0, 404);
    assert_eq!(s.get("/api/jobs?status=in_progress").await.1["pagination"]["total"], 1, "nothing done for a batch with an unknown id");
    assert_eq!(s.post("/api/jobs/cancel", json!({"job_ids": []})).await.0, 400);
    assert_eq!(s.post("/api/jobs/cancel", json!({"job_ids": [running.clone()]})).await, (200, json!({"cancelled": true})));
    s.wait_history(&running).await;
    let cancelled = s.get(&format!("/api/jobs/{running}")).await.1;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(s.get("/api/jobs?status=pending").await.1["pagination"]["total"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_lists_folder_paths_and_logs() {
    let s = start(|_| {}).await;
    std::fs::create_dir_all(s.dir.join("models/loras/style")).unwrap();
    std::fs::write(s.dir.join("models/loras/style/ink.safetensors"), b"x").unwrap();
    assert_eq!(s.get("/api/extensions").await, (200, json!([])));
    assert_eq!(s.get("/api/i18n").await, (200, json!({})));
    assert_eq!(s.get("/api/workflow_templates").await, (200, json!({})));
    assert_eq!(s.get("/api/global_subgraphs").await, (200, json!({})));
    assert_eq!(s.get("/api/global_subgraphs/abc").await.0, 404);
    let folders = s.get("/api/experiment/models").await.1;
    let loras = folders.as_array().unwrap().iter().find(|f| f["name"] == "loras").unwrap();
    assert!(loras["folders"][0].as_str().unwrap().ends_with("loras"));
    assert_eq!(s.get("/api/experiment/models/loras").await.1, json!([{"name": "style/ink.safetensors", "pathIndex": 0}]));
    assert_eq!(s.get("/api/experiment/models/nope").await.0, 404);
    let paths = s.get("/internal/folder_paths").await.1;
    assert!(paths["checkpoints"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().ends_with("checkpoints")), "{paths}");

    // Files of a served folder, newest first.
    std::fs::write(s.dir.join("input/old.png"), b"a").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(s.dir.join("input/new.png"), b"b").unwrap();
    assert_eq!(s.get("/internal/files/input").await.1, json!(["new.png", "old.png"]));
    assert_eq!(s.get("/internal/files/models").await.0, 400);

    // The log panel: lines logged while serving, and a subscription.
    tracing::subscriber::with_default(
        {
            use tracing_subscriber::layer::SubscriberExt;
            tracing_subscriber::registry().with(sdflow_server::logs::layer())
        },
        || tracing::warn!("a line for the log panel"),
    );
    let raw = s.get("/internal/logs/raw").await.1;
    assert!(raw["entries"].as_array().unwrap().iter().any(|e| e["m"].as_str().unwrap().contains("a line for the log panel")), "{raw}");
    assert!(raw["entries"][0]["t"].as_str().unwrap().contains('T'));
    assert!(s.get("/internal/logs").await.1.as_str().unwrap().contains("WARN: a line for the log panel"));
    let r = send(s.http.patch(s.url("/internal/logs/subscribe")).json(&json!({"clientId": "c1", "enabled": true}))).await;
    assert_eq!(r.status(), 200);
    assert!(sdflow_server::logs::subscribers().contains(&"c1".to_string()));
    let r = send(s.http.patch(s.url("/internal/logs/subscribe")).json(&json!({"clientId": "c1", "enabled": false}))).await;
    assert_eq!(r.status(), 200);
    assert!(!sdflow_server::logs::subscribers().contains(&"c1".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_end_root_is_served_with_a_same_origin_policy() {
    let fe = tempfile::tempdir().unwrap();
    let static_dir = fe.path().join("comfyui_frontend_package/static");
    std::fs::create_dir_all(static_dir.join("assets")).unwrap();
    std::fs::write(static_dir.join("index.html"), "<html>comfy</html>").unwrap();
    std::fs::write(static_dir.join("assets/app.js"), "console.log(1)").unwrap();
    std::fs::write(fe.path().join("outside.txt"), "no").unwrap();
    let root = fe.path().to_path_buf();
    let s = start(move |c| c.front_end_root = Some(root)).await;

    let r = send(s.http.get(s.url("/"))).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-security-policy"].to_str().unwrap().contains("connect-src 'self'"));
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "<html>comfy</html>");
    let r = send(s.http.get(s.url("/assets/app.js"))).await;
    assert_eq!(r.headers()["content-type"], "text/javascript; charset=utf-8");
    // The API still answers beside it; unknown paths are JSON 404s; nothing outside.
    assert_eq!(s.get("/api/extensions").await.0, 200);
    let (status, body) = s.get("/nope.js").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["type"], "not_found");
    for bad in ["/../outside.txt", "/%2e%2e/outside.txt", "/assets/..%2F..%2F..%2Foutside.txt"] {
        assert_eq!(s.get(bad).await.0, 404, "{bad}");
    }
    assert_eq!(status_of(s.http.post(s.url("/"))).await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_end_root_without_index_is_refused_at_start() {
    let fe = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = common::config(tmp.path());
    cfg.front_end_root = Some(fe.path().to_path_buf());
    let runtime = std::sync::Arc::new(sdflow_nodes::Runtime::new(&cfg.models_dir, &cfg.output_dir, 1, None).unwrap());
    let err = sdflow_server::start(cfg, std::sync::Arc::new(sdflow_executor::Registry::new()), runtime)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("holds no index.html"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_sdflows_workflows_with_the_models_present() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = tmp.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    std::fs::write(ckpts.join("mine.safetensors"), b"not read by the listing").unwrap();
    let s = common::start_in(tmp.path(), |_| {}, true).await;
    let index = s.get("/templates/index.json").await.1;
    let templates = index[0]["templates"].as_array().unwrap();
    assert_eq!(templates.len(), sdflow_workflows::bundled::BUNDLED.len());
    let titles: Vec<&str> = templates.iter().map(|t| t["title"].as_str().unwrap()).collect();
    // Shared titles are told apart by file name.
    assert!(titles.contains(&"Text to image (txt2img)") && titles.contains(&"Text to image (lora)"), "{titles:?}");
    let mut unique = titles.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), titles.len());

    let (status, ui) = s.get("/templates/txt2img.json").await;
    assert_eq!(status, 200);
    let loader = ui["nodes"].as_array().unwrap().iter().find(|n| n["type"] == "CheckpointLoaderSimple").unwrap();
    // The file names a checkpoint this server lacks; the template offers the one it has.
    assert_eq!(loader["widgets_values"], json!(["mine.safetensors"]));
    // It is the UI format, and reads back as the committed workflow but for that name.
    let back = sdflow_executor::Workflow::from_json(ui, s.server.as_ref().unwrap().state().executor.registry()).unwrap();
    let committed = sdflow_executor::Workflow::parse(sdflow_workflows::bundled::find("txt2img").unwrap(), s.server.as_ref().unwrap().state().executor.registry()).unwrap();
    assert_eq!(back.nodes.len(), committed.nodes.len());
    assert_eq!(s.get("/templates/nope.json").await.0, 404);
    assert_eq!(s.get("/templates/txt2img").await.0, 404);
}

/// A UI-format workflow posted to /prompt is kept as the API prompt ComfyUI's frontend
/// would have queued (what clients read in /history and /jobs), and the workflow itself
/// as the frontend's `extra_pnginfo.workflow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ui_workflow_is_kept_as_its_api_prompt() {
    let s = start(|_| {}).await;
    let ui = json!({
        "version": 0.4,
        "nodes": [
            {"id": 1, "type": "StubConstant", "mode": 0, "outputs": [{"name": "LATENT", "type": "LATENT", "links": [1]}], "widgets_values": [3, "fixed", 4]},
            {"id": 2, "type": "StubOutput", "mode": 0, "inputs": [{"name": "latent", "type": "LATENT", "link": 1}], "widgets_values": ["ui"]},
            {"id": 3, "type": "Note", "mode": 0, "widgets_values": ["not a node of the prompt"]}
        ],
        "links": [[1, 1, 0, 2, 0, "LATENT"]]
    });
    let (code, r) = s.post("/prompt", json!({"prompt": ui})).await;
    assert_eq!(code, 200, "{r}");
    let id = r["prompt_id"].as_str().unwrap().to_string();
    let entry = s.wait_history(&id).await;
    assert_eq!(entry["prompt"][2], json!({
        "1": {"class_type": "StubConstant", "inputs": {"seed": 3, "size": 4}},
        "2": {"class_type": "StubOutput", "inputs": {"latent": ["1", 0], "label": "ui"}}
    }));
    assert_eq!(entry["prompt"][3]["extra_pnginfo"]["workflow"], ui);
    let job = s.get(&format!("/api/jobs/{id}")).await.1;
    assert_eq!(job["workflow"]["prompt"]["2"]["inputs"]["label"], "ui");
}
