//! Scale-out mode end to end: `redis-server` (Debian's package; `.ci/run` installs it),
//! `sdflow serve --queue` front ends and `sdflow worker` processes on a tiny random-weight
//! SD1 checkpoint, driven over HTTP and the WebSocket like a client would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use serde_json::{json, Value as Json};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `redis-server` on a loopback port, in a folder of its own, append-only file on
/// (every write synced), stopped when dropped.
struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let dir = dir.join("redis");
        std::fs::create_dir_all(&dir).unwrap();
        Redis::start_on(&dir, free_port())
    }

    fn start_on(dir: &Path, port: u16) -> Redis {
        Redis::start_with(dir, port, &["--port", &port.to_string()])
    }

    fn start_with(dir: &Path, port: u16, listen: &[&str]) -> Redis {
        let child = Command::new("redis-server")
            .args(listen)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package; .ci/run installs it)");
        let redis = Redis { child, port, dir: dir.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while redis.cli(&["PING"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        let tls = self.dir.join("cert.pem");
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &self.port.to_string()]);
        if tls.exists() {
            cmd.args(["--tls", "--cacert"]).arg(&tls).args(["--user", "sdflow", "--pass", "s3cret", "--no-auth-warning"]);
        }
        let out = cmd.args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Killed without warning and started again on the same port and files.
    fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let again = Redis::start_on(&self.dir.clone(), self.port);
        let old = std::mem::replace(self, again);
        std::mem::forget(old);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An `sdflow` process (a front end or a worker), killed when dropped; its console lines
/// are collected on a thread.
struct Proc {
    child: Child,
    /// The front end's `host:port`, or the worker's health address.
    addr: String,
    console: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(dir: &Path, args: &[&str], ready: &str) -> Proc {
        Proc::spawn_env(dir, args, ready, &[])
    }

    fn spawn_env(dir: &Path, args: &[&str], ready: &str, env: &[(&str, String)]) -> Proc {
        let cert = dir.join("redis/cert.pem");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sdflow"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            // OpenSSL's default trust store, extended by the test's own CA.
            .envs(cert.exists().then(|| ("SSL_CERT_FILE", cert.clone())))
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let console = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let c = console.clone();
        std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).for_each(|l| c.lock().unwrap().push(l)));
        let line = BufReader::new(stdout).lines().map_while(Result::ok).find(|l| l.contains(ready));
        let Some(line) = line else {
            let _ = child.wait();
            panic!("sdflow {args:?} did not start: {}", console.lock().unwrap().join("\n"));
        };
        let addr = line.rsplit("http://").next().unwrap().trim().trim_end_matches("/health").trim_end_matches('/').to_string();
        Proc { child, addr, console }
    }

    fn front(dir: &Path, redis: &Redis, extra: &[&str]) -> Proc {
        let url = redis.url();
        let mut args = vec!["serve", "--port", "0", "--queue", &url, "--models-dir", "models", "--input-dir", "input", "--output-dir", "output"];
        args.extend_from_slice(extra);
        Proc::spawn(dir, &args, "sdflow serving on")
    }

    fn single(dir: &Path) -> Proc {
        Proc::spawn(dir, &["serve", "--port", "0", "--threads", "1", "--models-dir", "models", "--input-dir", "input", "--output-dir", "output"], "sdflow serving on")
    }

    fn worker(dir: &Path, redis: &Redis, name: &str, extra: &[&str]) -> Proc {
        let url = redis.url();
        let mut args = vec!["worker", "--queue", &url, "--name", name, "--threads", "1", "--models-dir", "models", "--input-dir", "input", "--output-dir", "output"];
        args.extend_from_slice(extra);
        Proc::spawn(dir, &args, "taking prompts")
    }

    fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }

    fn console(&self) -> String {
        self.console.lock().unwrap().join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request; the status and the body.
fn http(addr: &str, method: &str, path: &str, body: Option<&Json>) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let split = reply.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP reply");
    let head = String::from_utf8_lossy(&reply[..split]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut rest = reply[split + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        rest = dechunk(&rest);
    }
    (status, rest)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else { break };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
    out
}

fn get(addr: &str, path: &str) -> Json {
    let (status, body) = http(addr, "GET", path, None);
    assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

fn post(addr: &str, path: &str, body: &Json) -> (u16, Json) {
    let (status, body) = http(addr, "POST", path, Some(body));
    (status, serde_json::from_slice(&body).unwrap_or(Json::Null))
}

/// A scratch tree: `models/checkpoints/model.safetensors` (tiny SD1), `input/`, `output/`.
fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    for sub in ["input", "output"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    dir
}

/// txt2img on the tiny checkpoint, in ComfyUI's API format.
fn txt2img(seed: u64, steps: u32, size: u32) -> Json {
    json!({
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "model.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": format!("a photo {seed}"), "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 5.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0,
            "model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0]}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": format!("s{seed}")}},
    })
}

fn submit(addr: &str, prompt: &Json, client: &str) -> String {
    let (status, reply) = post(addr, "/prompt", &json!({ "prompt": prompt, "client_id": client }));
    assert_eq!(status, 200, "{reply}");
    reply["prompt_id"].as_str().unwrap().to_string()
}

/// Waits for a prompt's history entry.
fn wait_done(addr: &str, id: &str, within: Duration) -> Json {
    let deadline = Instant::now() + within;
    loop {
        let h = get(addr, &format!("/history/{id}"));
        if let Some(e) = h.get(id) {
            return e.clone();
        }
        assert!(Instant::now() < deadline, "prompt {id} not finished within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pixels of the image a finished prompt saved.
fn pixels(dir: &Path, entry: &Json) -> Vec<u8> {
    let images = entry["outputs"]["7"]["images"].as_array().unwrap_or_else(|| panic!("no images in {entry}"));
    assert_eq!(images.len(), 1, "{entry}");
    let file = dir.join("output").join(images[0]["filename"].as_str().unwrap());
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&file).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    buf
}

fn workers(addr: &str) -> Vec<Json> {
    get(addr, "/system_stats")["sdflow"]["queue"]["workers"].as_array().cloned().unwrap_or_default()
}

/// Waits until `check` holds for the front end's worker list.
fn wait_workers(addr: &str, what: &str, check: impl Fn(&[Json]) -> bool) -> Vec<Json> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let w = workers(addr);
        if check(&w) {
            return w;
        }
        assert!(Instant::now() < deadline, "{what}: workers {w:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The acceptance run: two front ends and three workers; 200 prompts from 20 concurrent
/// clients (half on each front end) all complete, each once in the history, with the very
/// pixels the single-machine server makes of the same prompts; each client's WebSocket
/// sees its own prompts' events and no one else's, whichever worker runs them.
#[test]
fn three_workers_serve_200_prompts_from_20_clients_as_one_machine_would() {
    let dir = tree();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &[]);
    let front2 = Proc::front(dir.path(), &redis, &[]);
    let _workers: Vec<Proc> = (1..=3).map(|i| Proc::worker(dir.path(), &redis, &format!("w{i}"), &[])).collect();
    let addr = front.addr.clone();
    wait_workers(&addr, "three workers advertise", |w| w.len() == 3);

    let clients: Vec<_> = (0..20u64)
        .map(|c| {
            let addr = if c % 2 == 0 { addr.clone() } else { front2.addr.clone() };
            std::thread::spawn(move || {
                let client = format!("client{c}");
                let mut ws = WebSocket::connect(&addr, &client);
                let ids: Vec<(u64, String)> = (0..10u64).map(|i| { let seed = c * 10 + i; (seed, submit(&addr, &txt2img(seed, 2, 64), &client)) }).collect();
                // Every prompt of this client ends with `execution_success` on its socket.
                let mut succeeded = std::collections::HashSet::new();
                let mut progress = 0;
                let deadline = Instant::now() + Duration::from_secs(600);
                while succeeded.len() < ids.len() {
                    assert!(Instant::now() < deadline, "client {client}: {} of {} prompts succeeded", succeeded.len(), ids.len());
                    let Some(msg) = ws.next_text() else { continue };
                    progress += usize::from(msg["type"] == "progress");
                    if msg["type"] == "execution_success" {
                        let id = msg["data"]["prompt_id"].as_str().unwrap().to_string();
                        assert!(ids.iter().any(|(_, i)| *i == id), "client {client} got another client's prompt {id}");
                        succeeded.insert(id);
                    }
                }
                // Sampler progress and previews travel from the workers too.
                assert!(progress >= ids.len() && ws.previews > 0, "client {client}: {progress} progress messages, {} previews", ws.previews);
                ids
            })
        })
        .collect();
    let ids: Vec<(u64, String)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    assert_eq!(ids.len(), 200);

    let history = get(&addr, "/history");
    assert_eq!(history.as_object().unwrap().len(), 200, "each prompt once in the history");
    let mut images = std::collections::BTreeMap::new();
    for (seed, id) in &ids {
        let entry = &history[id];
        assert_eq!(entry["status"]["completed"], true, "{entry}");
        images.insert(*seed, pixels(dir.path(), entry));
    }
    let done: u64 = wait_workers(&addr, "counts", |w| w.iter().map(|w| w["completed"].as_u64().unwrap()).sum::<u64>() == 200)
        .iter()
        .map(|w| w["completed"].as_u64().unwrap())
        .inspect(|n| assert!(*n > 0, "a worker ran nothing"))
        .sum();
    assert_eq!(done, 200);
    let queue = get(&addr, "/queue");
    assert_eq!(queue["queue_running"].as_array().unwrap().len() + queue["queue_pending"].as_array().unwrap().len(), 0);

    assert_eq!(get(&front2.addr, "/history").as_object().unwrap().len(), 200, "both front ends read one history");

    // The same prompts on one machine, without Redis: the same pixels.
    drop(front);
    drop(front2);
    let single_dir = tree();
    let single = Proc::single(single_dir.path());
    let mut ids_single = Vec::new();
    for seed in 0..200u64 {
        ids_single.push((seed, submit(&single.addr, &txt2img(seed, 2, 64), "solo")));
    }
    for (seed, id) in ids_single {
        let entry = wait_done(&single.addr, &id, Duration::from_secs(300));
        assert!(pixels(single_dir.path(), &entry) == images[&seed], "seed {seed}: scale-out pixels differ from one machine's");
    }
}

/// A worker killed (SIGKILL) in the middle of a prompt: another worker claims the prompt
/// after the claim timeout and runs it; it is in the history once, successful.
#[test]
fn a_killed_workers_prompt_completes_on_another_worker_once() {
    let dir = tree();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &[]);
    let mut workers: Vec<Proc> = ["a", "b"].iter().map(|n| Proc::worker(dir.path(), &redis, n, &["--claim-timeout", "2"])).collect();
    wait_workers(&front.addr, "two workers", |w| w.len() == 2);
    let id = submit(&front.addr, &txt2img(5, 40, 128), "c");
    let runner = wait_workers(&front.addr, "the prompt starts", |w| w.iter().any(|w| w["prompt_id"] == id.as_str()));
    let runner = runner.iter().find(|w| w["prompt_id"] == id.as_str()).unwrap()["name"].as_str().unwrap().to_string();
    let victim = usize::from(runner == "b");
    workers[victim].child.kill().unwrap();
    workers[victim].child.wait().unwrap();
    let entry = wait_done(&front.addr, &id, Duration::from_secs(300));
    assert_eq!(entry["status"]["completed"], true, "{entry}");
    let survivor = &workers[1 - victim];
    assert!(survivor.console().contains("claimed entry"), "{}", survivor.console());
    assert_eq!(get(&front.addr, "/history").as_object().unwrap().len(), 1);
    assert_eq!(redis.cli(&["HLEN", "sdflow:jobs"]).trim(), "0");
}

/// Redis killed and restarted (append-only file on) while prompts run: every prompt
/// completes, nothing finished before the crash is lost, none is stored twice.
#[test]
fn redis_restarted_mid_run_loses_nothing_finished() {
    let dir = tree();
    let mut redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &[]);
    let _w = Proc::worker(dir.path(), &redis, "w", &[]);
    wait_workers(&front.addr, "a worker", |w| w.len() == 1);
    let ids: Vec<String> = (0..12).map(|s| submit(&front.addr, &txt2img(s, 4, 64), "c")).collect();
    wait_done(&front.addr, &ids[2], Duration::from_secs(300));
    let before: Vec<String> = get(&front.addr, "/history").as_object().unwrap().keys().cloned().collect();
    assert!(before.len() >= 3);
    redis.crash_and_restart();
    for id in &ids {
        let entry = wait_done(&front.addr, id, Duration::from_secs(300));
        assert_eq!(entry["status"]["completed"], true, "{entry}");
    }
    let after = get(&front.addr, "/history");
    assert_eq!(after.as_object().unwrap().len(), 12);
    for id in &before {
        assert!(after.get(id).is_some(), "{id} finished before the crash and was lost");
    }
}

/// A front end restarted: the history and the waiting prompts are still there, and the
/// prompts run once a worker comes.
#[test]
fn a_restarted_front_end_finds_history_and_queue_intact() {
    let dir = tree();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &[]);
    let w = Proc::worker(dir.path(), &redis, "w", &[]);
    let first = submit(&front.addr, &txt2img(1, 2, 64), "c");
    wait_done(&front.addr, &first, Duration::from_secs(300));
    w.signal("-TERM");
    drop(w);
    let waiting: Vec<String> = (2..5).map(|s| submit(&front.addr, &txt2img(s, 2, 64), "c")).collect();
    drop(front);
    let front = Proc::front(dir.path(), &redis, &[]);
    assert!(get(&front.addr, &format!("/history/{first}")).get(&first).is_some());
    let queue = get(&front.addr, "/queue");
    let pending: Vec<&str> = queue["queue_pending"].as_array().unwrap().iter().map(|i| i[1].as_str().unwrap()).collect();
    assert_eq!(pending, waiting.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(get(&front.addr, "/prompt")["exec_info"]["queue_remaining"], 3);
    let _w = Proc::worker(dir.path(), &redis, "w2", &[]);
    for id in &waiting {
        wait_done(&front.addr, id, Duration::from_secs(300));
    }
}

/// Bad input: a message written into a lane by hand goes to the dead-letter stream with
/// the reason and the worker goes on; unreachable or wrong Redis URLs fail at start.
#[test]
fn malformed_messages_go_to_the_dead_letter_stream_and_bad_urls_fail_at_start() {
    let dir = tree();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &[]);
    let w = Proc::worker(dir.path(), &redis, "w", &[]);
    redis.cli(&["XADD", "sdflow:q:front", "*", "garbage", "1"]);
    redis.cli(&["XADD", "sdflow:q:front", "*", "id", "p1", "job", "{not json"]);
    let id = submit(&front.addr, &txt2img(3, 2, 64), "c");
    assert_eq!(wait_done(&front.addr, &id, Duration::from_secs(300))["status"]["completed"], true);
    let dead = redis.cli(&["XRANGE", "sdflow:dead", "-", "+"]);
    assert!(dead.contains("no `id` field") && dead.contains("`job` is not a prompt sdflow reads"), "{dead}");
    assert_eq!(get(&front.addr, "/system_stats")["sdflow"]["queue"]["dead_letters"], 2);
    assert!(w.console().contains("moved to sdflow:dead"), "{}", w.console());

    let port = free_port();
    for args in [
        vec!["serve".to_string(), "--port".into(), "0".into(), "--queue".into(), format!("redis://:hunter2@127.0.0.1:{port}")],
        vec!["worker".to_string(), "--queue".into(), format!("redis://127.0.0.1:{port}/0")],
        vec!["serve".to_string(), "--port".into(), "0".into(), "--queue".into(), "http://127.0.0.1:6379".into()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sdflow")).args(&args).current_dir(dir.path()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains("--queue") || err.contains("unreachable"), "{args:?}: {err}");
        assert!(!err.contains("hunter2") && !err.contains("panicked"), "{err}");
    }
}

/// One worker, client A's ten prompts queued before client B's one and a `front` one:
/// lanes are taken in turn, so B does not wait behind all of A's, and `front` goes first.
/// A full queue answers 429; `/interrupt` reaches the worker running the prompt.
#[test]
fn clients_take_turns_front_goes_first_and_interrupt_reaches_the_worker() {
    let dir = tree();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &["--max-queue", "12"]);
    let a_ids: Vec<String> = (0..10).map(|s| submit(&front.addr, &txt2img(s, 2, 64), "A")).collect();
    let b_id = submit(&front.addr, &txt2img(100, 2, 64), "B");
    let (status, reply) = post(&front.addr, "/prompt", &json!({ "prompt": txt2img(200, 2, 64), "client_id": "C", "front": true }));
    assert_eq!(status, 200, "{reply}");
    let front_id = reply["prompt_id"].as_str().unwrap().to_string();
    let (status, reply) = post(&front.addr, "/prompt", &json!({ "prompt": txt2img(300, 2, 64), "client_id": "D" }));
    assert_eq!(status, 429, "{reply}");
    let _w = Proc::worker(dir.path(), &redis, "w", &[]);
    for id in a_ids.iter().chain([&b_id, &front_id]) {
        wait_done(&front.addr, id, Duration::from_secs(300));
    }
    // The history lists prompts in the order they finished.
    let order: Vec<String> = get(&front.addr, "/history").as_object().unwrap().keys().cloned().collect();
    let pos = |id: &str| order.iter().position(|o| o == id).unwrap();
    assert_eq!(pos(&front_id), 0, "{order:?}");
    assert!(pos(&b_id) <= 2, "B waited behind A: {order:?}");

    let slow = submit(&front.addr, &txt2img(7, 200, 128), "A");
    wait_workers(&front.addr, "the slow prompt starts", |w| w.iter().any(|w| w["prompt_id"] == slow.as_str()));
    let (status, _) = post(&front.addr, "/interrupt", &json!({ "prompt_id": slow }));
    assert_eq!(status, 200);
    let entry = wait_done(&front.addr, &slow, Duration::from_secs(120));
    assert_eq!(entry["status"]["status_str"], "error");
    assert!(entry["status"]["messages"].to_string().contains("execution_interrupted"), "{entry}");
}

/// SIGTERM: the worker finishes its prompt, then leaves (its health says so meanwhile).
/// A second signal hands the running prompt back to the queue, where another worker
/// takes it at once. A1111's synchronous txt2img works through the queue too.
#[test]
fn workers_shut_down_gracefully_and_hand_back_on_a_second_signal() {
    let dir = tree();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &["-m", "model.safetensors"]);
    let mut a = Proc::worker(dir.path(), &redis, "a", &[]);
    let health = get(&a.addr, "/health");
    assert_eq!(health["name"], "a");
    assert_eq!(health["redis"], true);

    let id = submit(&front.addr, &txt2img(9, 30, 128), "c");
    wait_workers(&front.addr, "a runs it", |w| w.iter().any(|w| w["prompt_id"] == id.as_str()));
    a.signal("-TERM");
    std::thread::sleep(Duration::from_millis(300));
    let (status, _) = http(&a.addr, "GET", "/health", None);
    assert_eq!(status, 503, "a draining worker is not healthy");
    assert!(a.child.wait().unwrap().success());
    assert_eq!(wait_done(&front.addr, &id, Duration::from_secs(60))["status"]["completed"], true);

    let mut b = Proc::worker(dir.path(), &redis, "b", &[]);
    let id = submit(&front.addr, &txt2img(10, 200, 128), "c");
    wait_workers(&front.addr, "b runs it", |w| w.iter().any(|w| w["prompt_id"] == id.as_str()));
    b.signal("-TERM");
    std::thread::sleep(Duration::from_millis(200));
    b.signal("-TERM");
    assert!(b.child.wait().unwrap().success());
    assert!(b.console().contains("handed back"), "{}", b.console());
    let _c = Proc::worker(dir.path(), &redis, "c", &[]);
    let entry = wait_done(&front.addr, &id, Duration::from_secs(300));
    assert_eq!(entry["status"]["completed"], true, "{entry}");

    let (status, reply) = post(&front.addr, "/sdapi/v1/txt2img", &json!({ "prompt": "a cat", "steps": 2, "width": 64, "height": 64, "seed": 4 }));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["images"].as_array().unwrap().len(), 1);
}

/// A prompt whose models another idle worker holds goes to that worker.
#[test]
fn a_prompt_goes_to_the_worker_that_holds_its_models() {
    let dir = tree();
    std::fs::copy(dir.path().join("models/checkpoints/model.safetensors"), dir.path().join("models/checkpoints/other.safetensors")).unwrap();
    let redis = Redis::start(dir.path());
    let front = Proc::front(dir.path(), &redis, &[]);
    let _a = Proc::worker(dir.path(), &redis, "a", &[]);
    let warm = submit(&front.addr, &txt2img(1, 2, 64), "c");
    wait_done(&front.addr, &warm, Duration::from_secs(300));
    let _b = Proc::worker(dir.path(), &redis, "b", &[]);
    wait_workers(&front.addr, "a holds the model, b is idle", |w| w.len() == 2 && w.iter().any(|w| w["name"] == "a" && w["resident"].to_string().contains("model.safetensors")));
    for seed in 2..8 {
        let id = submit(&front.addr, &txt2img(seed, 2, 64), "c");
        wait_done(&front.addr, &id, Duration::from_secs(300));
    }
    let w = wait_workers(&front.addr, "counts", |w| w.iter().map(|w| w["completed"].as_u64().unwrap()).sum::<u64>() == 7);
    let count = |n: &str| w.iter().find(|w| w["name"] == n).unwrap()["completed"].as_u64().unwrap();
    assert_eq!((count("a"), count("b")), (7, 0), "{w:?}");
    // A prompt naming a model nobody holds runs wherever it is taken.
    let mut other = txt2img(20, 2, 64);
    other["1"]["inputs"]["ckpt_name"] = json!("other.safetensors");
    let id = submit(&front.addr, &other, "c");
    assert_eq!(wait_done(&front.addr, &id, Duration::from_secs(300))["status"]["completed"], true);
}

/// `rediss://` with an ACL user and password: a TLS Redis whose certificate the system
/// trusts (here through OpenSSL's `SSL_CERT_FILE`) serves front end and worker; a wrong
/// password fails at start without showing the password.
#[test]
fn tls_and_acl_authentication() {
    let dir = tree();
    let rdir = dir.path().join("redis");
    std::fs::create_dir_all(&rdir).unwrap();
    let ok = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-keyout"])
        .arg(rdir.join("key.pem"))
        .arg("-out")
        .arg(rdir.join("cert.pem"))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let port = free_port();
    let (cert, key) = (rdir.join("cert.pem"), rdir.join("key.pem"));
    let redis = Redis::start_with(&rdir, port, &[
        "--port", "0", "--tls-port", &port.to_string(), "--tls-cert-file", cert.to_str().unwrap(), "--tls-key-file", key.to_str().unwrap(),
        "--tls-ca-cert-file", cert.to_str().unwrap(), "--tls-auth-clients", "no",
        "--user", "default", "off", "--user", "sdflow", "on", ">s3cret", "~sdflow:*", "&*", "+@all",
    ]);
    let url = format!("rediss://sdflow:s3cret@localhost:{port}");
    let front = Proc::spawn(dir.path(), &["serve", "--port", "0", "--queue", &url, "--models-dir", "models", "--input-dir", "input", "--output-dir", "output"], "sdflow serving on");
    let _w = Proc::spawn(dir.path(), &["worker", "--queue", &url, "--threads", "1", "--models-dir", "models", "--input-dir", "input", "--output-dir", "output"], "taking prompts");
    let id = submit(&front.addr, &txt2img(1, 2, 64), "c");
    assert_eq!(wait_done(&front.addr, &id, Duration::from_secs(300))["status"]["completed"], true);
    assert_eq!(redis.cli(&["HLEN", "sdflow:history"]).trim(), "1");

    let wrong = format!("rediss://sdflow:hunter2@localhost:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_sdflow")).args(["serve", "--port", "0", "--queue", &wrong]).env("SSL_CERT_FILE", &cert).current_dir(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("unreachable") && !err.contains("hunter2"), "{err}");
}

/// `--output-store s3://…`: front end and workers share no folder; outputs go to an
/// S3-compatible store (moto's server here), under names claimed cluster-wide, so two
/// workers counting the same prefix from 1 never overwrite each other; `/view`, the
/// `executed` events and A1111's replies all reach the stored files, and workers keep
/// no local copies.
#[test]
fn outputs_in_an_s3_compatible_store() {
    let dir = tree();
    let s3_port = free_port();
    let mut moto = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &s3_port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server (pip install 'moto[server]'; .ci/run installs it)");
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _moto = Kill(&mut moto);
    let s3 = format!("127.0.0.1:{s3_port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(&s3).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = http(&s3, "PUT", "/outputs", None);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let env = [("AWS_ACCESS_KEY_ID", "test".to_string()), ("AWS_SECRET_ACCESS_KEY", "test".to_string()), ("AWS_ENDPOINT_URL", format!("http://{s3}"))];
    let redis = Redis::start(dir.path());
    let url = redis.url();
    let common = ["--queue", &url, "--output-store", "s3://outputs/run1", "--models-dir", "models", "--input-dir", "input"];
    let front = Proc::spawn_env(dir.path(), &[&["serve", "--port", "0", "-m", "model.safetensors", "--output-dir", "front-out"][..], &common].concat(), "sdflow serving on", &env);
    let workers: Vec<Proc> = ["w1", "w2"]
        .iter()
        .map(|w| Proc::spawn_env(dir.path(), &[&["worker", "--threads", "1", "--name", w, "--output-dir", &format!("{w}-out")][..], &common].concat(), "taking prompts", &env))
        .collect();
    wait_workers(&front.addr, "two workers", |w| w.len() == 2);
    let mut ws = WebSocket::connect(&front.addr, "c");
    let ids: Vec<String> = (0..6)
        .map(|seed| {
            let mut p = txt2img(seed, 2, 64);
            p["7"]["inputs"]["filename_prefix"] = json!("same");
            submit(&front.addr, &p, "c")
        })
        .collect();
    let mut executed = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while executed.len() < ids.len() {
        assert!(Instant::now() < deadline, "executed events: {executed:?}");
        if let Some(m) = ws.next_text() {
            if m["type"] == "executed" {
                executed.insert(m["data"]["output"]["images"][0]["filename"].as_str().unwrap().to_string());
            }
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for id in &ids {
        let entry = wait_done(&front.addr, id, Duration::from_secs(300));
        let img = &entry["outputs"]["7"]["images"][0];
        let name = img["filename"].as_str().unwrap().to_string();
        let (status, png) = http(&front.addr, "GET", &format!("/view?filename={name}&type=output"), None);
        assert_eq!(status, 200, "{name}");
        assert!(png.starts_with(b"\x89PNG"), "{name}");
        names.insert(name);
    }
    assert_eq!(names.len(), 6, "names collided: {names:?}");
    assert_eq!(names, executed, "the executed events name the stored files");
    assert!(names.iter().all(|n| n.starts_with("same_")), "{names:?}");
    for w in ["w1-out", "w2-out", "front-out"] {
        let left: Vec<_> = std::fs::read_dir(dir.path().join(w)).map(|d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "png")).collect()).unwrap_or_default();
        assert!(left.is_empty(), "{w} kept {left:?}");
    }
    let (status, _) = http(&front.addr, "GET", "/view?filename=same_99999_.png&type=output", None);
    assert_eq!(status, 404);
    let (status, reply) = post(&front.addr, "/sdapi/v1/txt2img", &json!({ "prompt": "a cat", "steps": 2, "width": 64, "height": 64, "seed": 4 }));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["images"].as_array().unwrap().len(), 1);
    drop(workers);
}

/// A minimal WebSocket client (RFC 6455): the handshake, then unmasked server frames.
struct WebSocket {
    s: TcpStream,
    /// Binary frames seen (previews).
    previews: usize,
}

impl WebSocket {
    fn connect(addr: &str, client: &str) -> WebSocket {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET /ws?clientId={client} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        WebSocket { s, previews: 0 }
    }

    /// The next text message as JSON; `None` for binary frames or a quiet spell.
    fn next_text(&mut self) -> Option<Json> {
        let mut h = [0u8; 2];
        if let Err(e) = self.s.read_exact(&mut h) {
            assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
            return None;
        }
        let mut len = (h[1] & 0x7f) as u64;
        if len == 126 {
            let mut b = [0u8; 2];
            self.s.read_exact(&mut b).unwrap();
            len = u16::from_be_bytes(b) as u64;
        } else if len == 127 {
            let mut b = [0u8; 8];
            self.s.read_exact(&mut b).unwrap();
            len = u64::from_be_bytes(b);
        }
        let mut payload = vec![0u8; len as usize];
        self.s.read_exact(&mut payload).unwrap();
        if h[0] & 0x0f == 2 {
            self.previews += 1;
        }
        (h[0] & 0x0f == 1).then(|| serde_json::from_slice(&payload).unwrap())
    }
}
