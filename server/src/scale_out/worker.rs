//! `sdflow worker`: takes prompts from the Redis lanes through the consumer group, runs
//! them with its own executor, cache and residency manager, and stores each result and
//! acknowledges it in one script, so a prompt is acknowledged only once its history entry
//! exists. While it runs a prompt it keeps the stream entry's idle time at zero; a worker
//! that dies stops doing so, and after `claim_timeout` another worker claims the entry
//! (XAUTOCLAIM) and runs it. The finishing script stores an entry only if none is stored
//! yet, so the history holds each prompt once.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use parking_lot::{Condvar, Mutex};
use redis::Value;
use sdflow_executor::{CancelToken, Executor, ExecutorConfig, Registry, Workflow};
use serde_json::{json, Value as Json};

use super::{entry_list, stream_entries, QueueError, Store, GROUP, PATIENCE_REQUEST, PATIENCE_RESULT};
use crate::queue::Spec;
use crate::state::{run_job, EventOut, Live};

/// Everything `sdflow worker` can be told.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub queue_url: String,
    /// The consumer name; `host-pid` when not given. Two live workers must not share one.
    pub name: Option<String>,
    /// Where output nodes write: the folder the front ends serve `/view` from (shared).
    pub output_dir: PathBuf,
    /// How long a prompt's stream entry may go untouched before another worker takes the
    /// worker that held it for dead and runs it again.
    pub claim_timeout: Duration,
    /// Where `/health` is served (port 0 picks one).
    pub health: SocketAddr,
    /// Put outputs in this S3-compatible store (`s3://bucket/prefix`) instead of leaving
    /// them in `output_dir`.
    pub output_store: Option<String>,
}

/// Stores the result and acknowledges, in one step: the entry goes into the history only
/// if none is there yet, the prompt leaves the queue, the stream entry is acknowledged and
/// deleted (and a client lane left empty removed), and the history is trimmed to
/// `config.max_history`.
const FINISH: &str = r#"
local stored = 0
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[5]), ARGV[1])
  stored = 1
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[8], ARGV[1])
redis.call('XACK', KEYS[7], 'workers', ARGV[3])
redis.call('XDEL', KEYS[7], ARGV[3])
-- A client lane left empty goes (a later prompt of that client makes it again).
if KEYS[7] ~= ARGV[5] and redis.call('XLEN', KEYS[7]) == 0 then
  redis.call('DEL', KEYS[7])
  redis.call('ZREM', KEYS[10], KEYS[7])
end
local max = tonumber(redis.call('HGET', KEYS[9], 'max_history') or ARGV[4])
local n = redis.call('ZCARD', KEYS[4])
if n > max then
  local old = redis.call('ZRANGE', KEYS[4], 0, n - max - 1)
  for _, o in ipairs(old) do redis.call('HDEL', KEYS[3], o) end
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, n - max - 1)
end
return stored
"#;

/// Marks a prompt as running here: `DONE` when its result is already stored (a worker
/// finished it and died before acknowledging), `GONE` when it was deleted while waiting.
const START: &str = r#"
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'DONE' end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 'GONE' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 'OK'
"#;

/// Gives a prompt back (this worker is stopping before it finished): appended again to
/// the front lane, the old entry acknowledged.
const HAND_BACK: &str = r#"
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('XACK', KEYS[4], 'workers', ARGV[2])
redis.call('XDEL', KEYS[4], ARGV[2])
local job = redis.call('HGET', KEYS[1], ARGV[1])
if not job then return 0 end
redis.pcall('XGROUP', 'CREATE', KEYS[5], 'workers', '0', 'MKSTREAM')
local e = redis.call('XADD', KEYS[5], '*', 'id', ARGV[1], 'job', job)
redis.call('HSET', KEYS[3], ARGV[1], e .. ' ' .. KEYS[5])
return 1
"#;

/// A stream entry this worker holds (delivered to it, claimed by it or handed to it).
struct Delivery {
    lane: String,
    entry: String,
    /// `None`: deleted from the stream while it was pending.
    fields: Option<HashMap<String, Vec<u8>>>,
    /// Came to this worker by a hand-off (it is not handed on again).
    handed: bool,
}

struct Current {
    prompt_id: String,
    lane: String,
    entry: String,
    cancel: CancelToken,
}

pub struct Worker {
    store: Store,
    objects: Option<super::objects::ObjectStore>,
    name: String,
    executor: Executor,
    runtime: Arc<sdflow_nodes::Runtime>,
    config: WorkerConfig,
    current: Mutex<Option<Current>>,
    /// Stop taking prompts; finish the running one.
    draining: AtomicBool,
    /// Stop the running prompt too, and give it back to the queue.
    handing_back: AtomicBool,
    wake: (Mutex<bool>, Condvar),
    /// Look at this worker's pending entries (something was handed to it).
    check_own: AtomicBool,
    last_claim_scan: Mutex<Option<Instant>>,
    live: Mutex<Live>,
    completed: AtomicU64,
    failed: AtomicU64,
    started_ms: u64,
    health_url: Mutex<Option<String>>,
}

/// One pub/sub event as front ends read it.
fn event_message(target: Option<&str>, kind: &str, data: &Json) -> Vec<u8> {
    json!({ "target": target, "type": kind, "data": data }).to_string().into_bytes()
}

/// A preview as front ends read it: its node and ComfyUI's type-1 frame, base64.
fn preview_message(target: Option<&str>, source: &crate::ws::PreviewSource, frame: &[u8]) -> Vec<u8> {
    json!({
        "target": target,
        "type": "preview",
        "prompt_id": source.prompt_id,
        "node": source.node,
        "frame": base64::engine::general_purpose::STANDARD.encode(frame),
    })
    .to_string()
    .into_bytes()
}

/// A worker's events, published for the front ends.
struct Publisher<'a>(&'a Store);

impl EventOut for Publisher<'_> {
    fn json(&self, target: Option<&str>, kind: &str, data: Json) {
        self.0.publish(&self.0.keys.events(), &event_message(target, kind, &data));
    }

    fn preview(&self, target: Option<&str>, source: crate::ws::PreviewSource, image: sdflow_executor::PreviewImage) {
        match crate::ws::encode_preview(&image) {
            Ok(frame) => self.0.publish(&self.0.keys.events(), &preview_message(target, &source, &frame)),
            Err(e) => tracing::debug!("preview dropped: {e}"),
        }
    }
}

/// The model files a prompt names (file names of its loaders' inputs): what a worker
/// needs resident to start it without loading.
pub fn models_of(spec: &Spec) -> BTreeSet<String> {
    const EXT: [&str; 8] = [".safetensors", ".gguf", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".onnx"];
    let mut out = BTreeSet::new();
    let Some(nodes) = spec.prompt.as_object() else { return out };
    for node in nodes.values() {
        let Some(inputs) = node["inputs"].as_object() else { continue };
        for v in inputs.values() {
            if let Some(s) = v.as_str() {
                let lower = s.to_ascii_lowercase();
                if EXT.iter().any(|e| lower.ends_with(e)) {
                    out.insert(base_name(s));
                }
            }
        }
    }
    out
}

fn base_name(path: &str) -> String {
    path.rsplit(['/', '\\']).next().unwrap_or(path).to_string()
}

impl Worker {
    pub fn new(config: WorkerConfig, registry: Arc<Registry>, runtime: Arc<sdflow_nodes::Runtime>) -> Result<Arc<Worker>, QueueError> {
        let store = Store::open(&config.queue_url)?;
        let objects = match &config.output_store {
            Some(url) => Some(super::objects::ObjectStore::open(url).map_err(|e| QueueError::Url { url: url.clone(), reason: e.to_string() })?),
            None => None,
        };
        let name = config.name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "worker".into());
            format!("{host}-{}", std::process::id())
        });
        let front = store.keys.front_lane();
        store.with("creating the consumer group", PATIENCE_REQUEST, |c| {
            match redis::cmd("XGROUP").arg("CREATE").arg(&front).arg(GROUP).arg("0").arg("MKSTREAM").query::<()>(c) {
                Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
                other => other,
            }
        })?;
        Ok(Arc::new(Worker {
            store,
            objects,
            name,
            executor: Executor::new(registry, ExecutorConfig::default()),
            runtime,
            config,
            current: Mutex::new(None),
            draining: AtomicBool::new(false),
            handing_back: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
            check_own: AtomicBool::new(true),
            last_claim_scan: Mutex::new(None),
            live: Mutex::new(Live::default()),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            started_ms: sdflow_executor::events::now_ms(),
            health_url: Mutex::new(None),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn notify(&self) {
        *self.wake.0.lock() = true;
        self.wake.1.notify_all();
    }

    fn wait(&self, at_most: Duration) {
        let mut woken = self.wake.0.lock();
        if !*woken {
            self.wake.1.wait_for(&mut woken, at_most);
        }
        *woken = false;
    }

    /// First signal: finish the running prompt and stop. Second: stop it now and give it
    /// back to the queue.
    pub fn signal(&self) {
        if self.draining.swap(true, Ordering::SeqCst) {
            tracing::info!("stopping now: the running prompt goes back to the queue");
            self.handing_back.store(true, Ordering::SeqCst);
            if let Some(c) = &*self.current.lock() {
                c.cancel.cancel();
            }
        } else {
            tracing::info!("stopping after the running prompt (signal again to hand it back now)");
        }
        self.notify();
    }

    fn state_name(&self) -> &'static str {
        if self.draining.load(Ordering::Relaxed) {
            "draining"
        } else if self.current.lock().is_some() {
            "running"
        } else {
            "idle"
        }
    }

    /// The model files resident in this worker's residency manager.
    fn resident(&self) -> BTreeSet<String> {
        self.runtime
            .residency
            .stats()
            .models
            .iter()
            .filter(|m| m.resident)
            .flat_map(|m| m.key.sources.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())))
            .collect()
    }

    /// What this worker advertises: `/system_stats` lists it, and other workers read
    /// `state` and `resident` to hand prompts to the worker that has their models.
    pub fn advertisement(&self) -> Json {
        let stats = self.runtime.residency.stats();
        json!({
            "name": self.name,
            "pid": std::process::id(),
            "state": self.state_name(),
            "prompt_id": self.current.lock().as_ref().map(|c| c.prompt_id.clone()),
            "devices": self.runtime.devices().iter().map(|d| json!({ "name": d.name, "description": d.description, "free": d.free, "total": d.total })).collect::<Vec<_>>(),
            "resident": self.resident(),
            "resident_bytes": stats.devices.iter().map(|d| d.bytes).sum::<u64>(),
            "completed": self.completed.load(Ordering::Relaxed),
            "failed": self.failed.load(Ordering::Relaxed),
            "started_ms": self.started_ms,
            "seen_ms": sdflow_executor::events::now_ms(),
            "health": self.health_url.lock().clone(),
        })
    }

    /// Publish [`Worker::advertisement`] now.
    fn advertise(&self) {
        let ad = self.advertisement().to_string();
        let _ = self.store.with("advertising", Duration::ZERO, |c| redis::cmd("HSET").arg(self.store.keys.workers()).arg(&self.name).arg(&ad).query::<i64>(c));
    }

    /// Every second: advertise, and keep the running prompt's entry from looking
    /// abandoned (its idle time reset), so only a dead worker's prompt is claimed.
    fn keep_alive(self: Arc<Self>) {
        loop {
            let done = self.draining.load(Ordering::Relaxed) && self.current.lock().is_none();
            if done {
                return;
            }
            self.advertise();
            let running = self.current.lock().as_ref().map(|c| (c.lane.clone(), c.entry.clone()));
            if let Some((lane, entry)) = running {
                let _ = self.store.with("XCLAIM (keep-alive)", Duration::ZERO, |c| {
                    redis::cmd("XCLAIM").arg(&lane).arg(GROUP).arg(&self.name).arg(0).arg(&entry).arg("JUSTID").query::<Value>(c)
                });
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Interrupts, wake-ups and hand-offs from front ends and other workers.
    fn listen(self: Arc<Self>) {
        let control = self.store.keys.control();
        while !(self.draining.load(Ordering::Relaxed) && self.current.lock().is_none()) {
            let Ok(mut con) = self.store.dedicated() else {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            };
            let mut pubsub = con.as_pubsub();
            if pubsub.subscribe(&control).is_err() || pubsub.set_read_timeout(Some(Duration::from_millis(500))).is_err() {
                continue;
            }
            // Anything handed over while disconnected is found by looking.
            self.check_own.store(true, Ordering::Relaxed);
            self.notify();
            loop {
                if self.draining.load(Ordering::Relaxed) && self.current.lock().is_none() {
                    return;
                }
                let msg = match pubsub.get_message() {
                    Ok(m) => m,
                    Err(e) if e.is_timeout() => continue,
                    Err(_) => break,
                };
                let Ok(doc) = serde_json::from_slice::<Json>(msg.get_payload_bytes()) else { continue };
                if let Some(target) = doc.get("interrupt") {
                    if let Some(c) = &*self.current.lock() {
                        if target.is_null() || target.as_str() == Some(&c.prompt_id) {
                            tracing::info!("prompt {}: interrupted", c.prompt_id);
                            c.cancel.cancel();
                        }
                    }
                }
                if let Some(to) = doc.get("handoff") {
                    if to.as_str() == Some(&self.name) {
                        self.check_own.store(true, Ordering::Relaxed);
                        self.notify();
                    }
                }
                if doc.get("wake").is_some() {
                    self.notify();
                }
            }
        }
    }

    /// The lanes in the order they are served: `front` first, then the client lanes
    /// least recently served first.
    fn lanes(&self) -> Result<Vec<String>, QueueError> {
        let k = &self.store.keys;
        let mut lanes = vec![k.front_lane()];
        let clients: Vec<String> = self.store.with("ZRANGE lanes", PATIENCE_REQUEST, |c| redis::cmd("ZRANGE").arg(k.lanes()).arg(0).arg(-1).query(c))?;
        lanes.extend(clients);
        Ok(lanes)
    }

    fn read(&self, lane: &str, id: &str) -> Result<Option<Delivery>, QueueError> {
        let v: Value = self.store.with("XREADGROUP", PATIENCE_REQUEST, |c| {
            match redis::cmd("XREADGROUP").arg("GROUP").arg(GROUP).arg(&self.name).arg("COUNT").arg(1).arg("STREAMS").arg(lane).arg(id).query::<Value>(c) {
                // A lane whose key was removed by hand: nothing to read there.
                Err(e) if e.code() == Some("NOGROUP") => Ok(Value::Nil),
                other => other,
            }
        })?;
        Ok(stream_entries(&v).into_iter().next().map(|(lane, entry, fields)| Delivery { lane, entry, fields, handed: id == "0" }))
    }

    /// The next entry to work on: one already held (handed over, or left from a previous
    /// life under this name), one a dead worker held (looked for at most once a second,
    /// before new ones, so a backlog does not keep it waiting), or a new one (front lane
    /// first, then client lanes in turn).
    fn next(&self) -> Result<Option<Delivery>, QueueError> {
        let lanes = self.lanes()?;
        let claim_due = self.last_claim_scan.lock().is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if self.check_own.swap(false, Ordering::Relaxed) {
            for lane in &lanes {
                if let Some(d) = self.read(lane, "0")? {
                    // More may be waiting: look again next time.
                    self.check_own.store(true, Ordering::Relaxed);
                    return Ok(Some(d));
                }
            }
        }
        if claim_due {
            *self.last_claim_scan.lock() = Some(Instant::now());
            if let Some(d) = self.claim_abandoned(&lanes)? {
                return Ok(Some(d));
            }
        }
        for lane in &lanes {
            if let Some(d) = self.read(lane, ">")? {
                if *lane != self.store.keys.front_lane() {
                    let now = sdflow_executor::events::now_ms();
                    let _ = self.store.with("ZADD lanes", PATIENCE_REQUEST, |c| redis::cmd("ZADD").arg(self.store.keys.lanes()).arg("XX").arg(now).arg(lane).query::<i64>(c));
                }
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// An entry whose worker has not touched it for the claim timeout (it died).
    fn claim_abandoned(&self, lanes: &[String]) -> Result<Option<Delivery>, QueueError> {
        let idle_ms = self.config.claim_timeout.as_millis() as u64;
        for lane in lanes {
            let v: Value = self.store.with("XAUTOCLAIM", PATIENCE_REQUEST, |c| {
                match redis::cmd("XAUTOCLAIM").arg(lane).arg(GROUP).arg(&self.name).arg(idle_ms).arg("0-0").arg("COUNT").arg(1).query::<Value>(c) {
                    Err(e) if e.code() == Some("NOGROUP") => Ok(Value::Nil),
                    other => other,
                }
            })?;
            if let Value::Array(parts) = &v {
                if let Some((entry, fields)) = parts.get(1).map(entry_list).and_then(|l| l.into_iter().next()) {
                    tracing::info!("claimed entry {entry} of {lane}: its worker stopped answering");
                    return Ok(Some(Delivery { lane: lane.clone(), entry, fields, handed: true }));
                }
            }
        }
        Ok(None)
    }

    fn ack(&self, lane: &str, entry: &str) {
        let r = self.store.with("XACK", PATIENCE_RESULT, |c| redis::pipe().atomic().cmd("XACK").arg(lane).arg(GROUP).arg(entry).cmd("XDEL").arg(lane).arg(entry).query::<()>(c));
        if let Err(e) = r {
            tracing::error!("{e}");
        }
    }

    /// A message no worker can read goes to the dead-letter stream with the reason,
    /// instead of failing every worker that takes it.
    fn dead_letter(&self, d: &Delivery, reason: &str) {
        tracing::warn!("entry {} of {}: {reason}; moved to {}", d.entry, d.lane, self.store.keys.dead());
        let fields: serde_json::Map<String, Json> = d.fields.iter().flatten().map(|(k, v)| (k.clone(), json!(String::from_utf8_lossy(v)))).collect();
        let fields = Json::Object(fields).to_string();
        let k = &self.store.keys;
        let r = self.store.with("dead-lettering", PATIENCE_RESULT, |c| {
            redis::pipe()
                .atomic()
                .cmd("XADD").arg(k.dead()).arg("*").arg("lane").arg(&d.lane).arg("entry").arg(&d.entry).arg("reason").arg(reason).arg("worker").arg(&self.name).arg("fields").arg(&fields)
                .cmd("XACK").arg(&d.lane).arg(GROUP).arg(&d.entry)
                .cmd("XDEL").arg(&d.lane).arg(&d.entry)
                .query::<()>(c)
        });
        if let Err(e) = r {
            tracing::error!("{e}");
        }
    }

    /// Reads an entry's prompt: `Err` with the reason when it is not one sdflow wrote.
    fn parse(d: &Delivery) -> Result<Spec, String> {
        let fields = d.fields.as_ref().ok_or("deleted")?;
        let id = fields.get("id").ok_or("no `id` field")?;
        let id = std::str::from_utf8(id).map_err(|_| "`id` is not UTF-8")?;
        if !crate::history::valid_prompt_id(id) {
            return Err(format!("`id` {id:?} is not a prompt id"));
        }
        let job = fields.get("job").ok_or("no `job` field")?;
        let spec: Spec = serde_json::from_slice(job).map_err(|e| format!("`job` is not a prompt sdflow reads: {e}"))?;
        if spec.prompt_id != id {
            return Err(format!("`job` is prompt {}, the entry says {id}", spec.prompt_id));
        }
        Ok(spec)
    }

    /// Another worker, idle now, that holds every model the prompt needs while this one
    /// does not.
    fn better_worker(&self, spec: &Spec) -> Option<String> {
        let needed = models_of(spec);
        if needed.is_empty() || needed.is_subset(&self.resident()) {
            return None;
        }
        let workers = self.store.workers().ok()?;
        workers.iter().find_map(|w| {
            let name = w["name"].as_str()?;
            let has: BTreeSet<String> = w["resident"].as_array()?.iter().filter_map(|m| m.as_str().map(str::to_string)).collect();
            (name != self.name && w["state"] == "idle" && needed.is_subset(&has)).then(|| name.to_string())
        })
    }

    /// Gives the entry to `to` (it lands in that worker's pending list, which it reads
    /// when told). Once per prompt, so a prompt cannot bounce between workers.
    fn hand_off(&self, d: &Delivery, spec: &Spec, to: &str) -> bool {
        let k = &self.store.keys;
        let first: bool = match self.store.with("HSETNX handoff", PATIENCE_REQUEST, |c| redis::cmd("HSETNX").arg(k.handoff()).arg(&spec.prompt_id).arg(to).query(c)) {
            Ok(v) => v,
            Err(_) => return false,
        };
        if !first {
            return false;
        }
        let moved = self.store.with("XCLAIM (hand-off)", PATIENCE_REQUEST, |c| redis::cmd("XCLAIM").arg(&d.lane).arg(GROUP).arg(to).arg(0).arg(&d.entry).arg("JUSTID").query::<Value>(c));
        if moved.is_err() {
            return false;
        }
        tracing::info!("prompt {}: handed to {to}, which holds its models", spec.prompt_id);
        self.store.control(&json!({ "handoff": to }));
        true
    }

    fn handle(&self, d: Delivery) {
        if d.fields.is_none() {
            // Deleted from the queue after it was delivered.
            self.ack(&d.lane, &d.entry);
            return;
        }
        let spec = match Self::parse(&d) {
            Ok(s) => s,
            Err(reason) => return self.dead_letter(&d, &reason),
        };
        if !d.handed {
            if let Some(to) = self.better_worker(&spec) {
                if self.hand_off(&d, &spec, &to) {
                    return;
                }
            }
        }
        let k = &self.store.keys;
        let running = json!({ "worker": self.name, "started_ms": sdflow_executor::events::now_ms() }).to_string();
        let start = redis::Script::new(START);
        let status = self.store.with("starting a prompt", PATIENCE_RESULT, |c| start.key(k.jobs()).key(k.running()).key(k.history()).arg(&spec.prompt_id).arg(&running).invoke::<String>(c));
        match status.as_deref() {
            Ok("OK") => {}
            Ok(other) => {
                tracing::info!("prompt {}: {} ; acknowledged", spec.prompt_id, if other == "DONE" { "already finished" } else { "deleted while waiting" });
                self.ack(&d.lane, &d.entry);
                self.store.control(&json!({ "queue": true }));
                return;
            }
            Err(e) => {
                // Still pending here: run again when Redis answers.
                tracing::error!("{e}");
                self.check_own.store(true, Ordering::Relaxed);
                return;
            }
        }
        let cancel = CancelToken::new();
        *self.current.lock() = Some(Current { prompt_id: spec.prompt_id.clone(), lane: d.lane.clone(), entry: d.entry.clone(), cancel: cancel.clone() });
        if self.handing_back.load(Ordering::SeqCst) {
            cancel.cancel();
        }
        self.store.control(&json!({ "queue": true }));
        let plan = Workflow::from_json(spec.prompt.clone(), self.executor.registry())
            .map_err(|e| format!("prompt: {e}"))
            .and_then(|wf| self.executor.validate(&wf).map_err(|r| r.to_string()));
        let publisher = Publisher(&self.store);
        let mut ran = run_job(&self.executor, &publisher, &self.live, &spec, plan.as_ref().map_err(Clone::clone), &cancel, &self.config.output_dir, self.objects.is_some());
        *self.live.lock() = Live::default();
        if ran.interrupted && self.handing_back.load(Ordering::SeqCst) {
            let hand_back = redis::Script::new(HAND_BACK);
            let r = self.store.with("handing a prompt back", PATIENCE_RESULT, |c| {
                hand_back.key(k.jobs()).key(k.running()).key(k.where_()).key(&d.lane).key(k.front_lane()).arg(&spec.prompt_id).arg(&d.entry).invoke::<i64>(c)
            });
            match r {
                Ok(_) => tracing::info!("prompt {}: handed back to the queue", spec.prompt_id),
                Err(e) => tracing::error!("prompt {}: not handed back ({e}); another worker claims it after the timeout", spec.prompt_id),
            }
            *self.current.lock() = None;
            self.store.control(&json!({ "wake": null }));
            return;
        }
        if let Some(objects) = &self.objects {
            if let Err(e) = self.upload_outputs(objects, &spec, &mut ran) {
                // Not acknowledged: claimed and run again after the timeout.
                tracing::error!("prompt {}: outputs not stored: {e}", spec.prompt_id);
                *self.current.lock() = None;
                return;
            }
        }
        let entry = ran.entry.to_string();
        // Idle before the result is visible: a client that saw it finish and sends the next
        // prompt finds this worker free to take it (its models resident), not the state of
        // up to a second ago.
        *self.current.lock() = None;
        self.advertise();
        let finish = redis::Script::new(FINISH);
        let stored = self.store.with("storing a result", PATIENCE_RESULT, |c| {
            finish
                .key(k.jobs()).key(k.running()).key(k.history()).key(k.order()).key(k.seq()).key(k.where_()).key(&d.lane).key(k.handoff()).key(k.config()).key(k.lanes())
                .arg(&spec.prompt_id).arg(&entry).arg(&d.entry).arg(10_000).arg(k.front_lane())
                .invoke::<i64>(c)
        });
        match stored {
            Ok(1) => {}
            Ok(_) => tracing::warn!("prompt {}: another worker stored its result first; this run's is dropped", spec.prompt_id),
            Err(e) => {
                // Not acknowledged: the entry stays pending and is claimed and run again.
                tracing::error!("prompt {}: result not stored: {e}", spec.prompt_id);
                return;
            }
        }
        if ran.entry["status"]["completed"] == true {
            self.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        ran.flush(&publisher, spec.client_id.as_deref());
        self.store.control(&json!({ "finished": spec.prompt_id }));
    }

    /// Moves a finished prompt's output files into the object store under names claimed
    /// cluster-wide, and rewrites its history entry and held-back `executed` events to
    /// those names.
    fn upload_outputs(&self, objects: &super::objects::ObjectStore, spec: &Spec, ran: &mut crate::state::Ran) -> Result<(), String> {
        let k = &self.store.keys;
        let claim = redis::Script::new(super::objects::CLAIM);
        let mut renamed: HashMap<(String, String, String), String> = HashMap::new();
        let mut uploaded = Vec::new();
        let mut each_file = |item: &mut Json| -> Result<(), String> {
            let (Some(name), Some(kind)) = (item["filename"].as_str().map(str::to_string), item["type"].as_str().map(str::to_string)) else { return Ok(()) };
            if kind != "output" && kind != "temp" {
                return Ok(());
            }
            let sub = item["subfolder"].as_str().unwrap_or("").to_string();
            let base = if kind == "temp" { self.config.output_dir.join("temp") } else { self.config.output_dir.clone() };
            let local = base.join(&sub).join(&name);
            let bytes = std::fs::read(&local).map_err(|e| format!("{}: {e}", local.display()))?;
            let (stem, number, suffix) = match super::objects::numbered(&name) {
                Some((s, n, x)) => (s.to_string(), n.to_string(), x.to_string()),
                None => (String::new(), String::new(), String::new()),
            };
            let dir = format!("{kind}/{sub}");
            let final_name: String = self
                .store
                .with("claiming an output name", PATIENCE_RESULT, |c| {
                    claim.key(k.files()).key(k.file_series()).arg(&dir).arg(&stem).arg(&number).arg(&suffix).arg(&name).arg(&spec.prompt_id).invoke(c)
                })
                .map_err(|e| e.to_string())?;
            objects.put(&objects.key(&kind, &sub, &final_name), &bytes, crate::files::mime_of(&final_name)).map_err(|e| e.to_string())?;
            uploaded.push(local);
            item["filename"] = json!(final_name);
            renamed.insert((kind, sub, name), final_name);
            Ok(())
        };
        for ui in ran.entry["outputs"].as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
            for list in ui.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
                for item in list.as_array_mut().into_iter().flatten() {
                    each_file(item)?;
                }
            }
        }
        for (kind, data) in &mut ran.deferred {
            if *kind != "executed" {
                continue;
            }
            for list in data["output"].as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
                for item in list.as_array_mut().into_iter().flatten() {
                    let key = (item["type"].as_str().unwrap_or("").to_string(), item["subfolder"].as_str().unwrap_or("").to_string(), item["filename"].as_str().unwrap_or("").to_string());
                    if let Some(name) = renamed.get(&key) {
                        item["filename"] = json!(name);
                    }
                }
            }
        }
        for local in uploaded {
            let _ = std::fs::remove_file(local);
        }
        Ok(())
    }

    /// Takes and runs prompts until a signal drains it.
    fn work(self: &Arc<Self>) {
        while !self.draining.load(Ordering::SeqCst) {
            match self.next() {
                Ok(Some(d)) => self.handle(d),
                Ok(None) => self.wait(Duration::from_secs(1)),
                Err(e) => {
                    tracing::warn!("{e}");
                    self.wait(Duration::from_secs(1));
                }
            }
        }
    }

    /// Leaves the group: no longer advertised, and its consumer removed from each lane
    /// where it holds nothing (an entry it still holds is claimed by others later).
    fn leave(&self) {
        let k = &self.store.keys;
        let _ = self.store.with("HDEL workers", PATIENCE_REQUEST, |c| redis::cmd("HDEL").arg(k.workers()).arg(&self.name).query::<i64>(c));
        for lane in self.lanes().unwrap_or_default() {
            let held: Value = match self.store.with("XPENDING", PATIENCE_REQUEST, |c| redis::cmd("XPENDING").arg(&lane).arg(GROUP).arg("-").arg("+").arg(1).arg(&self.name).query(c)) {
                Ok(v) => v,
                Err(_) => continue,
            };
            if matches!(&held, Value::Array(a) if a.is_empty()) {
                let _ = self.store.with("XGROUP DELCONSUMER", PATIENCE_REQUEST, |c| redis::cmd("XGROUP").arg("DELCONSUMER").arg(&lane).arg(GROUP).arg(&self.name).query::<i64>(c));
            }
        }
    }
}

/// `/health`: 200 while the worker takes prompts and reaches Redis, 503 otherwise.
async fn health(axum::extract::State(worker): axum::extract::State<Arc<Worker>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let w = worker.clone();
    let redis_ok = tokio::task::spawn_blocking(move || w.store.with("PING", Duration::ZERO, |c| redis::cmd("PING").query::<String>(c)).is_ok()).await.unwrap_or(false);
    let mut doc = worker.advertisement();
    doc["redis"] = json!(redis_ok);
    doc["uptime_s"] = json!((sdflow_executor::events::now_ms().saturating_sub(worker.started_ms)) / 1000);
    let ok = redis_ok && !worker.draining.load(Ordering::Relaxed);
    let status = if ok { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(doc)).into_response()
}

/// Runs a worker until SIGINT/SIGTERM (twice to hand the running prompt back at once).
/// `on_ready` is told the worker's name and its health address.
pub fn run(config: WorkerConfig, registry: Arc<Registry>, runtime: Arc<sdflow_nodes::Runtime>, on_ready: impl FnOnce(&str, SocketAddr)) -> Result<(), crate::ApiError> {
    let worker = Worker::new(config, registry, runtime)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| crate::ApiError::io("starting the async runtime", e))?;
    let addr = worker.config.health;
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).map_err(|e| crate::ApiError::io(format!("listening on {addr} for /health"), e))?;
    let addr = listener.local_addr().map_err(|e| crate::ApiError::io("reading the bound address", e))?;
    *worker.health_url.lock() = Some(format!("http://{addr}/health"));
    let app = axum::Router::new().route("/health", axum::routing::get(health)).with_state(worker.clone());
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("/health: {e}");
        }
    });
    {
        let w = worker.clone();
        rt.spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                tracing::error!("cannot listen for signals");
                return;
            };
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                w.signal();
            }
        });
    }
    let spawn = |name: &str, f: fn(Arc<Worker>)| {
        let w = worker.clone();
        std::thread::Builder::new().name(name.into()).spawn(move || f(w)).map_err(|e| crate::ApiError::io(format!("starting {name}"), e))
    };
    let keeper = spawn("sdflow-keep-alive", Worker::keep_alive)?;
    let listener = spawn("sdflow-control", Worker::listen)?;
    on_ready(worker.name(), addr);
    let started = Instant::now();
    worker.work();
    let _ = keeper.join();
    let _ = listener.join();
    worker.leave();
    tracing::info!("worker {} stopped after {:.0} s", worker.name(), started.elapsed().as_secs_f64());
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
