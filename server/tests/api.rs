//! ComfyUI's HTTP and WebSocket API over real loopback connections, on the stub nodes.

mod common;

use std::time::Duration;

use common::{quick_prompt, send, slow_prompt, start, start_in};
use futures_util::StreamExt;
use serde_json::{json, Value as Json};
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str) -> Ws {
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

enum Frame {
    Json(Json),
    Binary(Vec<u8>),
}

async fn next_frame(ws: &mut Ws) -> Frame {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a websocket message within 20 s")
            .expect("the socket stays open")
            .unwrap();
        match msg {
            Message::Text(t) => return Frame::Json(serde_json::from_str(&t).unwrap()),
            Message::Binary(b) => return Frame::Binary(b.to_vec()),
            _ => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_runs_with_comfyui_events_previews_history_and_view() {
    let mut s = start(|_| {}).await;
    let mut ws = connect(&s.ws_url("client-a")).await;
    // Another client must not see client-a's execution events.
    let mut other = connect(&s.ws_url("client-b")).await;
    let Frame::Json(hello) = next_frame(&mut ws).await else {
        panic!("status first")
    };
    assert_eq!(hello["type"], "status");
    assert_eq!(hello["data"]["sid"], "client-a");
    assert_eq!(hello["data"]["status"]["exec_info"]["queue_remaining"], 0);
    let Frame::Json(_) = next_frame(&mut other).await else {
        panic!()
    };

    let (code, reply) = s
        .post("/prompt", json!({"prompt": slow_prompt(7, 4, 5, "first"), "client_id": "client-a", "extra_data": {"extra_pnginfo": {"workflow": {"nodes": []}}}}))
        .await;
    assert_eq!(code, 200, "{reply}");
    let id = reply["prompt_id"].as_str().unwrap().to_string();
    assert_eq!(reply["number"], 0);
    assert_eq!(reply["node_errors"], json!({}));

    let mut kinds = Vec::new();
    let mut progress = Vec::new();
    let mut preview = None;
    let mut executed = None;
    loop {
        match next_frame(&mut ws).await {
            Frame::Binary(b) => preview = Some(b),
            Frame::Json(m) => {
                let kind = m["type"].as_str().unwrap().to_string();
                if kind != "status" {
                    assert_eq!(m["data"]["prompt_id"], id.as_str(), "{m}");
                }
                match kind.as_str() {
                    "progress" => progress.push((
                        m["data"]["value"].as_u64().unwrap(),
                        m["data"]["max"].as_u64().unwrap(),
                    )),
                    "executed" => executed = Some(m["data"].clone()),
                    _ => {}
                }
                let done = kind == "execution_success";
                kinds.push(kind);
                if done {
                    break;
                }
            }
        }
    }
    for k in [
        "execution_start",
        "execution_cached",
        "executing",
        "executed",
        "execution_success",
    ] {
        assert!(kinds.iter().any(|x| x == k), "no {k} in {kinds:?}");
    }
    let start_at = kinds.iter().position(|k| k == "execution_start").unwrap();
    let success_at = kinds.iter().position(|k| k == "execution_success").unwrap();
    assert!(start_at < success_at);
    assert_eq!(progress, vec![(1, 4), (2, 4), (3, 4), (4, 4)]);
    let executed = executed.unwrap();
    assert_eq!(executed["node"], "3");
    assert_eq!(executed["output"]["files"][0]["filename"], "first.txt");

    // Binary preview: [1 = preview image][1 = JPEG][JPEG bytes].
    let preview = preview.expect("a preview frame");
    assert_eq!(&preview[..4], &1u32.to_be_bytes());
    assert_eq!(&preview[4..8], &1u32.to_be_bytes());
    assert_eq!(&preview[8..10], &[0xff, 0xd8], "JPEG magic");
    let img = image::load_from_memory(&preview[8..]).unwrap();
    assert_eq!((img.width(), img.height()), (4, 1));

    // The other client got only broadcast status messages.
    while let Ok(Some(Ok(msg))) =
        tokio::time::timeout(Duration::from_millis(200), other.next()).await
    {
        if let Message::Text(t) = msg {
            let m: Json = serde_json::from_str(&t).unwrap();
            assert_eq!(m["type"], "status", "client-b got {m}");
        }
    }

    let entry = s.wait_history(&id).await;
    assert_eq!(entry["status"]["status_str"], "success");
    assert_eq!(entry["status"]["completed"], true);
    assert_eq!(entry["prompt"][1], id.as_str());
    assert_eq!(entry["prompt"][4], json!(["3"]));
    assert_eq!(entry["prompt"][3]["client_id"], "client-a");
    assert_eq!(entry["outputs"]["3"]["stub_tensors"][0]["label"], "first");
    let msgs: Vec<&str> = entry["status"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m[0].as_str().unwrap())
        .collect();
    assert_eq!(
        msgs,
        ["execution_start", "execution_cached", "execution_success"]
    );

    // The file the output node wrote, through /view: the stub adds 1 to each value.
    let r = send(s.http.get(s.url("/view?filename=first.txt&type=output"))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
    let text = r.text().await.unwrap();
    let values: Vec<f32> = text.lines().map(|l| l.parse().unwrap()).collect();
    let expected: Vec<f32> = sdflow_executor::stub::constant_values(7, 4)
        .iter()
        .map(|v| v + 1.0)
        .collect();
    assert_eq!(values, expected);

    // /api/ mirrors every route.
    let (code, h) = s.get(&format!("/api/history/{id}")).await;
    assert_eq!(code, 200);
    assert!(h.get(&id).is_some());
    let (code, h) = s.get("/history/no-such-prompt").await;
    assert_eq!((code, h), (200, json!({})));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_errors_come_back_in_comfyui_shape() {
    let mut s = start(|_| {}).await;
    let bad = json!({
        "1": {"class_type": "StubConstant", "inputs": {"seed": 1, "size": 0}},
        "2": {"class_type": "StubOutput", "inputs": {"latent": ["1", 0], "label": "x"}},
        "3": {"class_type": "NoSuchNode", "inputs": {}},
    });
    let (code, body) = s.post("/prompt", json!({"prompt": bad})).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["type"], "missing_node_type");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("NoSuchNode"));
    let errs = &body["node_errors"]["1"];
    assert_eq!(errs["class_type"], "StubConstant");
    assert_eq!(errs["errors"][0]["type"], "value_smaller_than_min");
    assert_eq!(errs["errors"][0]["extra_info"]["input_name"], "size");
    assert_eq!(errs["dependent_outputs"], json!(["2"]));

    let (code, body) = s.post("/prompt", json!({"client_id": "x"})).await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no prompt"),
        "{body}"
    );
    let (code, _) = s.post("/prompt", json!({"prompt": [1, 2]})).await;
    assert_eq!(code, 400);
    // Nothing invalid was queued.
    assert_eq!(s.get("/prompt").await.1["exec_info"]["queue_remaining"], 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_listing_delete_clear_front_and_interrupt_of_one_prompt() {
    let mut s = start(|_| {}).await;
    // A long prompt holds the worker while the others wait.
    let long = s.hold_worker("long").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let (code, r) = s
            .post(
                "/prompt",
                json!({"prompt": quick_prompt(10 + i, &format!("q{i}"))}),
            )
            .await;
        assert_eq!(code, 200);
        ids.push(r["prompt_id"].as_str().unwrap().to_string());
    }
    let (_, r) = s
        .post(
            "/prompt",
            json!({"prompt": quick_prompt(99, "front"), "front": true}),
        )
        .await;
    let front = r["prompt_id"].as_str().unwrap().to_string();
    assert!(r["number"].as_i64().unwrap() < 0);

    let (_, q) = s.get("/queue").await;
    assert_eq!(q["queue_running"][0][1], long.as_str());
    let pending: Vec<&str> = q["queue_pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i[1].as_str().unwrap())
        .collect();
    assert_eq!(
        pending,
        [front.as_str(), &ids[0], &ids[1], &ids[2]],
        "front first, then arrival order"
    );
    assert_eq!(s.get("/prompt").await.1["exec_info"]["queue_remaining"], 5);

    let (code, _) = s.post("/queue", json!({"delete": [ids[1]]})).await;
    assert_eq!(code, 200);
    let (_, q) = s.get("/queue").await;
    assert_eq!(q["queue_pending"].as_array().unwrap().len(), 3);

    // Interrupting a prompt that is not the running one leaves the running one alone.
    let (code, _) = s.post("/interrupt", json!({"prompt_id": ids[0]})).await;
    assert_eq!(code, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        s.get("/queue").await.1["queue_running"][0][1],
        long.as_str()
    );
    // Interrupting the running one by id stops it; the rest then run.
    s.post("/interrupt", json!({"prompt_id": long})).await;
    let e = s.wait_history(&long).await;
    assert_eq!(e["status"]["status_str"], "error");
    assert_eq!(e["status"]["completed"], false);
    let last = e["status"]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last[0], "execution_interrupted", "{last}");
    for id in [&front, &ids[0], &ids[2]] {
        assert_eq!(s.wait_history(id).await["status"]["status_str"], "success");
    }
    // The deleted prompt never ran.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.get(&format!("/history/{}", ids[1])).await.1, json!({}));
    // Front ran before the ones queued earlier.
    let h = s.get("/history").await.1;
    let order: Vec<&String> = h.as_object().unwrap().keys().collect();
    assert_eq!(order, [&long, &front, &ids[0], &ids[2]]);

    // clear empties the queue.
    let (_, r) = s
        .post(
            "/prompt",
            json!({"prompt": slow_prompt(2, 2000, 5, "long2")}),
        )
        .await;
    let long2 = r["prompt_id"].as_str().unwrap().to_string();
    for i in 0..3 {
        s.post("/prompt", json!({"prompt": quick_prompt(50 + i, "c")}))
            .await;
    }
    s.post("/queue", json!({"clear": true})).await;
    let (_, q) = s.get("/queue").await;
    assert!(q["queue_pending"].as_array().unwrap().is_empty());
    // A bare /interrupt (ComfyUI's frontend sends no body) stops whatever runs.
    let r = s.http.post(s.url("/interrupt")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        s.wait_history(&long2).await["status"]["status_str"],
        "error"
    );

    // History: max_items, delete, clear.
    let h = s.get("/history?max_items=2").await.1;
    let keys: Vec<&String> = h.as_object().unwrap().keys().collect();
    assert_eq!(keys, [&ids[2], &long2]);
    s.post("/history", json!({"delete": [long]})).await;
    assert_eq!(s.get(&format!("/history/{long}")).await.1, json!({}));
    s.post("/history", json!({"clear": true})).await;
    assert_eq!(s.get("/history").await.1, json!({}));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429() {
    let mut s = start(|c| c.max_queue = 2).await;
    // Wait until it runs, so exactly max_queue prompts can wait behind it.
    let hold = s.hold_worker("hold").await;
    assert_eq!(
        s.post("/prompt", json!({"prompt": quick_prompt(1, "a")}))
            .await
            .0,
        200
    );
    assert_eq!(
        s.post("/prompt", json!({"prompt": quick_prompt(2, "b")}))
            .await
            .0,
        200
    );
    let (code, body) = s
        .post("/prompt", json!({"prompt": quick_prompt(3, "c")}))
        .await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["error"]["type"], "queue_full");
    s.post("/interrupt", json!({"prompt_id": hold})).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalogue_stats_and_model_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(models.join("checkpoints/sub")).unwrap();
    std::fs::create_dir_all(models.join("embeddings")).unwrap();
    std::fs::write(models.join("checkpoints/a.safetensors"), b"x").unwrap();
    std::fs::write(models.join("checkpoints/sub/b.gguf"), b"x").unwrap();
    std::fs::write(models.join("checkpoints/readme.txt"), b"x").unwrap();
    std::fs::write(models.join("embeddings/neg.pt"), b"x").unwrap();
    let mut s = start_in(tmp.path(), |_| {}, false).await;

    let (code, info) = s.get("/object_info").await;
    assert_eq!(code, 200);
    assert_eq!(info["StubScale"]["input"]["required"]["factor"][0], "FLOAT");
    assert_eq!(info["StubOutput"]["output_node"], true);
    let (_, one) = s.get("/object_info/StubSlow").await;
    assert_eq!(
        one.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["StubSlow"]
    );
    assert_eq!(s.get("/object_info/Nope").await.1, json!({}));

    let (code, stats) = s.get("/system_stats").await;
    assert_eq!(code, 200);
    assert!(stats["system"]["ram_total"].as_u64().unwrap() > 0);
    assert_eq!(stats["devices"][0]["type"], "cpu");
    assert!(stats["sdflow"]["residency"]["models"].is_array(), "{stats}");
    assert!(
        stats["sdflow"]["output_cache"]["budget_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );

    let (_, folders) = s.get("/models").await;
    assert!(folders.as_array().unwrap().contains(&json!("checkpoints")));
    assert_eq!(
        s.get("/models/checkpoints").await.1,
        json!(["a.safetensors", "sub/b.gguf"])
    );
    assert_eq!(s.get("/models/loras").await.1, json!([]));
    assert_eq!(s.get("/models/nonsense").await.0, 404);
    // Unknown routes answer JSON errors, as every API error does.
    let (code, body) = s.get("/sdapi/v1/nonsense").await;
    assert_eq!(code, 404);
    assert!(body["error"]["message"].as_str().unwrap().contains("/sdapi/v1/nonsense"), "{body}");
    assert_eq!(s.get("/embeddings").await.1, json!(["neg"]));
    assert_eq!(s.get("/sdapi/v1/sd-models").await.1[0]["model_name"], "a");
    assert_eq!(s.get("/v1/models").await.1["data"][1]["id"], "sub/b.gguf");
    let samplers = s.get("/sdapi/v1/samplers").await.1;
    let euler_a = samplers
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "euler_ancestral")
        .unwrap();
    assert!(euler_a["aliases"]
        .as_array()
        .unwrap()
        .contains(&json!("euler a")));
    assert!(s
        .get("/sdapi/v1/schedulers")
        .await
        .1
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["name"] == "karras"));
    assert_eq!(s.get("/sdapi/v1/upscalers").await.1[0]["name"], "None");
    assert_eq!(s.get("/sdapi/v1/loras").await.1, json!([]));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_a_restart_and_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = start_in(tmp.path(), |c| c.max_history = 3, false).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let (_, r) = s
            .post(
                "/prompt",
                json!({"prompt": quick_prompt(i, &format!("h{i}"))}),
            )
            .await;
        ids.push(r["prompt_id"].as_str().unwrap().to_string());
    }
    s.wait_history(&ids[4]).await;
    let h = s.get("/history").await.1;
    assert_eq!(
        h.as_object().unwrap().keys().collect::<Vec<_>>(),
        [&ids[2], &ids[3], &ids[4]]
    );
    s.shutdown().await;
    let files = std::fs::read_dir(tmp.path().join("output/history"))
        .unwrap()
        .count();
    assert_eq!(
        files, 3,
        "dropped entries leave no files, no temp files remain"
    );

    // A corrupt file is skipped, not fatal.
    std::fs::write(tmp.path().join("output/history/garbage.json"), b"{not json").unwrap();
    let mut s = start_in(tmp.path(), |c| c.max_history = 3, false).await;
    let h = s.get("/history").await.1;
    assert_eq!(
        h.as_object().unwrap().keys().collect::<Vec<_>>(),
        [&ids[2], &ids[3], &ids[4]]
    );
    assert_eq!(h[&ids[4]]["outputs"]["2"]["stub_tensors"][0]["label"], "h4");
    // New prompts go after the restored ones, and a client-chosen id is honoured.
    let (code, r) = s
        .post(
            "/prompt",
            json!({"prompt": quick_prompt(9, "after"), "prompt_id": "my-id"}),
        )
        .await;
    assert_eq!((code, r["prompt_id"].clone()), (200, json!("my-id")));
    s.wait_history("my-id").await;
    let h = s.get("/history").await.1;
    assert_eq!(h.as_object().unwrap().keys().next_back().unwrap(), "my-id");
    // A taken id, and one that is no plain name.
    for id in ["my-id", "../x"] {
        assert_eq!(s.post("/prompt", json!({"prompt": quick_prompt(9, "again"), "prompt_id": id})).await.0, 400, "{id}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_node_reports_execution_error() {
    let mut s = start(|_| {}).await;
    let mut ws = connect(&s.ws_url("f")).await;
    let prompt = json!({
        "1": {"class_type": "StubConstant", "inputs": {"seed": 1, "size": 4}},
        "2": {"class_type": "StubFail", "inputs": {"latent": ["1", 0], "fail": true, "message": "boom"}},
        "3": {"class_type": "StubOutput", "inputs": {"latent": ["2", 0], "label": "never"}},
    });
    let (_, r) = s
        .post("/prompt", json!({"prompt": prompt, "client_id": "f"}))
        .await;
    let id = r["prompt_id"].as_str().unwrap().to_string();
    let mut saw_error = None;
    loop {
        if let Frame::Json(m) = next_frame(&mut ws).await {
            if m["type"] == "execution_error" {
                saw_error = Some(m["data"].clone());
            }
            if m["type"] == "executing" && m["data"]["node"].is_null() {
                break;
            }
        }
    }
    let e = saw_error.expect("execution_error before executing: null");
    assert_eq!(e["node_id"], "2");
    assert_eq!(e["node_type"], "StubFail");
    assert_eq!(e["exception_message"], "boom");
    let h = s.wait_history(&id).await;
    assert_eq!(h["status"]["status_str"], "error");
    s.shutdown().await;
}

/// Runs `prompt` for `client` and returns the binary frames it gets.
async fn previews_of_run(s: &common::TestServer, ws: &mut Ws, client: &str, prompt: Json) -> Vec<Vec<u8>> {
    let (code, reply) = s.post("/prompt", json!({"prompt": prompt, "client_id": client})).await;
    assert_eq!(code, 200, "{reply}");
    let mut frames = Vec::new();
    loop {
        match next_frame(ws).await {
            Frame::Binary(b) => frames.push(b),
            Frame::Json(m) if m["type"] == "execution_success" => break,
            Frame::Json(_) => {}
        }
    }
    // A preview encoded late may follow the end of the run.
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(Duration::from_millis(300), ws.next()).await {
        if let Message::Binary(b) = msg {
            frames.push(b.to_vec());
        }
    }
    frames
}

/// ComfyUI's PREVIEW_IMAGE_WITH_METADATA: a client that announces
/// `supports_preview_metadata` gets previews that name their node and prompt (a preview
/// can arrive after `executing` moved on), one that does not gets the original frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_name_their_node_for_clients_that_ask() {
    let mut s = start(|_| {}).await;
    let (code, features) = s.get("/features").await;
    assert_eq!(code, 200);
    assert_eq!(features["supports_preview_metadata"], true);

    let mut modern = connect(&s.ws_url("modern")).await;
    use futures_util::SinkExt;
    modern
        .send(Message::Text(json!({"type": "feature_flags", "data": {"supports_preview_metadata": true}}).to_string().into()))
        .await
        .unwrap();
    // The server answers the client's flags with its own, after the hello.
    let reply = loop {
        let Frame::Json(m) = next_frame(&mut modern).await else { panic!("no binary frame before any prompt") };
        if m["type"] == "feature_flags" {
            break m;
        }
        assert_eq!(m["type"], "status", "{m}");
    };
    assert_eq!(reply["data"]["supports_preview_metadata"], true, "{reply}");

    // Two slow nodes in a row: the first one's preview may land after the second started.
    let two_slow = |seed: u64| {
        let mut prompt = slow_prompt(seed, 4, 40, "meta");
        prompt["4"] = json!({"class_type": "StubSlow", "inputs": {"latent": ["2", 0], "steps": 2, "step_ms": 40}});
        prompt["3"]["inputs"]["latent"] = json!(["4", 0]);
        prompt
    };
    let frames = previews_of_run(&s, &mut modern, "modern", two_slow(5)).await;
    let mut nodes = Vec::new();
    for frame in &frames {
        assert_eq!(&frame[..4], &4u32.to_be_bytes(), "a PREVIEW_IMAGE_WITH_METADATA frame");
        let len = u32::from_be_bytes(frame[4..8].try_into().unwrap()) as usize;
        let meta: Json = serde_json::from_slice(&frame[8..8 + len]).unwrap();
        let node = meta["node_id"].as_str().unwrap().to_string();
        assert_eq!(meta["display_node_id"], node.as_str(), "{meta}");
        assert_eq!(meta["real_node_id"], node.as_str(), "{meta}");
        assert!(meta["parent_node_id"].is_null(), "{meta}");
        assert_eq!(meta["image_type"], "image/jpeg", "{meta}");
        assert!(meta["prompt_id"].as_str().is_some_and(|p| !p.is_empty()), "{meta}");
        let img = image::load_from_memory(&frame[8 + len..]).unwrap();
        assert_eq!((img.width(), img.height()), (4, 1));
        nodes.push(node);
    }
    nodes.sort();
    assert_eq!(nodes, ["2", "4"], "one preview from each slow node, each naming it");

    // A client that says nothing keeps ComfyUI's original frame.
    let mut plain = connect(&s.ws_url("plain")).await;
    // Another seed: the same prompt would come from the cache, with no previews.
    let frames = previews_of_run(&s, &mut plain, "plain", two_slow(6)).await;
    assert_eq!(frames.len(), 2, "one preview per slow node");
    for frame in &frames {
        assert_eq!(&frame[..8], &[0, 0, 0, 1, 0, 0, 0, 1], "PREVIEW_IMAGE, JPEG");
        assert_eq!(&frame[8..10], &[0xff, 0xd8], "JPEG magic");
    }
    s.shutdown().await;
}
