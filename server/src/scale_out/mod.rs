//! Scale-out mode: many `sdflow worker`s behind one or more `sdflow serve --queue
//! redis://…` front ends, on Redis Streams with a consumer group (docs/scale-out.md).
//!
//! A module of its own because it replaces, behind the same handlers, three things the
//! single-machine server keeps in-process: the queue, the history and the event fan-out.
//! The front end ([`Frontend`]) validates a prompt as it always does and appends it to a
//! stream; workers ([`worker`]) take prompts through the consumer group, run them with
//! their own executor and residency manager, store the history entry and acknowledge in
//! one atomic script, and publish events that every front end forwards to its WebSocket
//! clients.
//!
//! Keys, under one prefix (`sdflow:`):
//! - `q:front` and `q:c:<client>` — streams ("lanes"), one per client for fairness and one
//!   for `front` prompts, each entry `id` + `job` (a [`Spec`] as JSON); group `workers`.
//! - `lanes` — sorted set of the client lanes, scored by when a worker last took from it.
//! - `jobs` — hash prompt id → job JSON of every prompt not finished (pending or running);
//!   `where` — prompt id → "entry-id lane"; `running` — prompt id → the worker running it.
//! - `history` — hash prompt id → entry; `history:order` — sorted set by `history:seq`.
//! - `workers` — hash worker name → what it advertises (device, resident models, state).
//! - `dead` — stream of messages no worker could read, with the reason.
//! - `number` — counter of ComfyUI's prompt numbers; `config` — `max_history`.
//! - channels `events` (run events, previews) and `control` (interrupt, wake, finished).

mod listen;
pub mod objects;
pub mod worker;

pub use listen::listen;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Connection, RedisError, RedisResult, Value};
use serde_json::{json, Value as Json};

use crate::error::ApiError;
use crate::queue::Spec;

/// The consumer group every worker reads the lanes through.
pub const GROUP: &str = "workers";

/// Redis 6.2 brought XAUTOCLAIM, which reclaiming a dead worker's prompt needs.
const MIN_VERSION: (u32, u32) = (6, 2);

/// A worker whose advertisement is older than this is taken for gone.
pub const WORKER_STALE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("--queue {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("the queue's Redis at {url} is unreachable: {source}")]
    Unreachable { url: String, source: RedisError },
    #[error("the queue's Redis at {url} is version {version}; scale-out needs Redis {}.{} or newer (XAUTOCLAIM)", MIN_VERSION.0, MIN_VERSION.1)]
    TooOld { url: String, version: String },
    #[error("Redis {what}: {source}")]
    Redis { what: String, source: RedisError },
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        ApiError::QueueUnavailable(e.to_string())
    }
}

/// The key names, under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }
    pub fn jobs(&self) -> String {
        self.key("jobs")
    }
    pub fn running(&self) -> String {
        self.key("running")
    }
    pub fn where_(&self) -> String {
        self.key("where")
    }
    pub fn lanes(&self) -> String {
        self.key("lanes")
    }
    pub fn front_lane(&self) -> String {
        self.key("q:front")
    }
    /// The lane of a client's prompts (one lane for prompts that name no client).
    pub fn lane(&self, client: Option<&str>) -> String {
        match client {
            Some(c) => self.key(&format!("q:c:{c}")),
            None => self.key("q:anon"),
        }
    }
    pub fn history(&self) -> String {
        self.key("history")
    }
    pub fn order(&self) -> String {
        self.key("history:order")
    }
    pub fn seq(&self) -> String {
        self.key("history:seq")
    }
    pub fn number(&self) -> String {
        self.key("number")
    }
    pub fn config(&self) -> String {
        self.key("config")
    }
    pub fn workers(&self) -> String {
        self.key("workers")
    }
    pub fn handoff(&self) -> String {
        self.key("handoff")
    }
    /// Output names claimed cluster-wide (`TYPE/SUBFOLDER/NAME` → prompt id), and the
    /// highest number claimed per series, for `--output-store`.
    pub fn files(&self) -> String {
        self.key("files")
    }
    pub fn file_series(&self) -> String {
        self.key("files:series")
    }
    pub fn dead(&self) -> String {
        self.key("dead")
    }
    pub fn events(&self) -> String {
        self.key("events")
    }
    pub fn control(&self) -> String {
        self.key("control")
    }
}

/// A Redis server and a few open connections to it. Every command goes through
/// [`Store::with`], which reconnects and retries while Redis restarts, for as long as the
/// caller is willing to wait. (A pool of our own: a `Vec` under a lock is all the sync
/// client needs, and it keeps r2d2 and its threads out of the binary.)
pub struct Store {
    client: redis::Client,
    /// The URL without its password, for messages.
    url: String,
    pool: Mutex<Vec<Connection>>,
    pub keys: Keys,
}

/// How long a command waits for Redis to come back before giving up: a request's
/// handler briefly, a worker storing a finished result for minutes.
pub const PATIENCE_REQUEST: Duration = Duration::from_secs(3);
pub const PATIENCE_RESULT: Duration = Duration::from_secs(300);

fn retryable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry | redis::RetryMethod::RetryImmediately)
        // A restarted Redis answers LOADING while it reads its append-only file.
        || e.code() == Some("LOADING")
}

fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

impl Store {
    /// Parses the URL (`redis://[[user]:password@]host[:port][/db]`, `rediss://` for TLS),
    /// connects and checks the server's version, so a wrong URL fails at start with a
    /// clear message rather than at the first prompt.
    pub fn open(url: &str) -> Result<Store, QueueError> {
        let shown = redact(url);
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(QueueError::Url { url: shown, reason: "must start with redis:// or rediss:// (TLS)".into() });
        }
        let client = redis::Client::open(url).map_err(|e| QueueError::Url { url: shown.clone(), reason: e.to_string() })?;
        let store = Store { client, url: shown, pool: Mutex::new(Vec::new()), keys: Keys { prefix: "sdflow".into() } };
        let mut con = store.connect().map_err(|source| QueueError::Unreachable { url: store.url.clone(), source })?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).map_err(|source| QueueError::Unreachable { url: store.url.clone(), source })?;
        let version = info.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("").trim().to_string();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if (major, minor) < MIN_VERSION {
            return Err(QueueError::TooOld { url: store.url.clone(), version });
        }
        store.pool.lock().push(con);
        Ok(store)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn connect(&self) -> RedisResult<Connection> {
        let con = self.client.get_connection_with_timeout(Duration::from_secs(3))?;
        con.set_read_timeout(Some(Duration::from_secs(10)))?;
        con.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(con)
    }

    /// A connection of its own, for a subscriber (pub/sub holds its connection).
    pub fn dedicated(&self) -> RedisResult<Connection> {
        self.client.get_connection_with_timeout(Duration::from_secs(3))
    }

    /// Runs `f` on a pooled connection; while Redis is unreachable (down, restarting,
    /// loading its data), reconnects and runs it again until `patience` has passed.
    /// `f` may run more than once, so what it does must be safe to repeat (the scripts
    /// below are).
    pub fn with<T>(&self, what: &str, patience: Duration, mut f: impl FnMut(&mut Connection) -> RedisResult<T>) -> Result<T, QueueError> {
        let deadline = Instant::now() + patience;
        let mut pause = Duration::from_millis(50);
        loop {
            let pooled = self.pool.lock().pop();
            let attempt = match pooled {
                Some(c) => Ok(c),
                None => self.connect(),
            };
            let err = match attempt {
                Ok(mut con) => match f(&mut con) {
                    Ok(v) => {
                        let mut pool = self.pool.lock();
                        if pool.len() < 8 {
                            pool.push(con);
                        }
                        return Ok(v);
                    }
                    Err(e) => {
                        if !retryable(&e) {
                            // The connection is fine; the command was refused.
                            self.pool.lock().push(con);
                        }
                        e
                    }
                },
                Err(e) => e,
            };
            if !retryable(&err) || Instant::now() + pause > deadline {
                return Err(QueueError::Redis { what: format!("{what} (at {})", self.url), source: err });
            }
            tracing::debug!("Redis {what}: {err}; retrying");
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Publishes on a channel, once: events are worth no wait (the history keeps results).
    pub fn publish(&self, channel: &str, payload: &[u8]) {
        if let Err(e) = self.with("PUBLISH", Duration::ZERO, |c| redis::cmd("PUBLISH").arg(channel).arg(payload).query::<i64>(c)) {
            tracing::debug!("event not published: {e}");
        }
    }

    pub fn control(&self, message: &Json) {
        self.publish(&self.keys.control(), message.to_string().as_bytes());
    }

    /// The workers that advertised themselves recently; gone ones are removed.
    pub fn workers(&self) -> Result<Vec<Json>, QueueError> {
        let all: HashMap<String, String> = self.with("HGETALL workers", PATIENCE_REQUEST, |c| redis::cmd("HGETALL").arg(self.keys.workers()).query(c))?;
        let now = sdflow_executor::events::now_ms();
        let mut live = Vec::new();
        for (name, doc) in all {
            let parsed: Option<Json> = serde_json::from_str(&doc).ok();
            let fresh = parsed.as_ref().and_then(|d| d["seen_ms"].as_u64()).is_some_and(|seen| now.saturating_sub(seen) < WORKER_STALE.as_millis() as u64);
            match parsed {
                Some(d) if fresh => live.push(d),
                _ => {
                    let _ = self.with("HDEL workers", Duration::ZERO, |c| redis::cmd("HDEL").arg(self.keys.workers()).arg(&name).query::<i64>(c));
                }
            }
        }
        live.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(live)
    }
}

/// Appends a prompt to its lane, unless it is already there (a retry after a lost
/// reply: same JSON, `OK`) or its id is taken (`DUP`), or the queue is full (`FULL`).
const SUBMIT: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  if cur == ARGV[2] then return 'OK' end
  return 'DUP'
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'DUP' end
if redis.call('HLEN', KEYS[1]) - redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[3]) then return 'FULL' end
redis.pcall('XGROUP', 'CREATE', KEYS[6], 'workers', '0', 'MKSTREAM')
local e = redis.call('XADD', KEYS[6], '*', 'id', ARGV[1], 'job', ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], e .. ' ' .. KEYS[6])
if ARGV[4] == '0' then redis.call('ZADD', KEYS[5], 'NX', 0, KEYS[6]) end
return 'OK'
"#;

/// Drops pending prompts (all of them when no ids are given); running ones stay.
const DROP: &str = r#"
local ids = ARGV
if #ids == 0 then ids = redis.call('HKEYS', KEYS[1]) end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('HEXISTS', KEYS[2], id) == 0 and redis.call('HEXISTS', KEYS[1], id) == 1 then
    local w = redis.call('HGET', KEYS[3], id)
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    if w then
      local sp = string.find(w, ' ', 1, true)
      redis.call('XDEL', string.sub(w, sp + 1), string.sub(w, 1, sp - 1))
    end
    n = n + 1
  end
end
return n
"#;

/// The front end's side: submitting, listing, deleting and interrupting prompts, and
/// reading the history, all in Redis.
pub struct Frontend {
    pub store: Store,
    max_queue: usize,
    /// Synchronous A1111/OpenAI requests waiting for their prompt's history entry.
    waiters: Mutex<HashMap<String, tokio::sync::oneshot::Sender<Arc<Json>>>>,
    closed: AtomicBool,
}

impl Frontend {
    pub fn open(url: &str, max_queue: usize, max_history: usize) -> Result<Frontend, QueueError> {
        let store = Store::open(url)?;
        store.with("HSET config", PATIENCE_REQUEST, |c| redis::cmd("HSET").arg(store.keys.config()).arg("max_history").arg(max_history.max(1)).query::<i64>(c))?;
        Ok(Frontend { store, max_queue: max_queue.max(1), waiters: Mutex::new(HashMap::new()), closed: AtomicBool::new(false) })
    }

    pub fn max_queue(&self) -> usize {
        self.max_queue
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    pub fn next_number(&self) -> Result<u64, ApiError> {
        let n: u64 = self.store.with("INCR number", PATIENCE_REQUEST, |c| redis::cmd("INCR").arg(self.store.keys.number()).query(c))?;
        Ok(n - 1)
    }

    pub fn submit(&self, spec: Spec, done: Option<tokio::sync::oneshot::Sender<Arc<Json>>>) -> Result<(), ApiError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(ApiError::ShuttingDown);
        }
        let k = &self.store.keys;
        let front = spec.number < 0.0;
        let lane = if front { k.front_lane() } else { k.lane(spec.client_id.as_deref()) };
        let job = serde_json::to_string(&spec).map_err(|e| ApiError::Internal(e.to_string()))?;
        // Registered first: a fast worker can finish before the script's reply arrives.
        if let Some(done) = done {
            self.waiters.lock().insert(spec.prompt_id.clone(), done);
        }
        let script = redis::Script::new(SUBMIT);
        let result = self.store.with("submitting a prompt", PATIENCE_REQUEST, |c| {
            script
                .key(k.jobs())
                .key(k.running())
                .key(k.history())
                .key(k.where_())
                .key(k.lanes())
                .key(&lane)
                .arg(&spec.prompt_id)
                .arg(&job)
                .arg(self.max_queue)
                .arg(if front { "1" } else { "0" })
                .invoke::<String>(c)
        });
        let refused = match result.as_deref() {
            Ok("OK") => None,
            Ok("FULL") => Some(ApiError::QueueFull { max: self.max_queue }),
            Ok(_) => Some(ApiError::bad(format!("prompt_id {} is already in use", spec.prompt_id))),
            Err(_) => None,
        };
        if let Some(e) = refused {
            self.waiters.lock().remove(&spec.prompt_id);
            return Err(e);
        }
        if let Err(e) = result {
            self.waiters.lock().remove(&spec.prompt_id);
            return Err(e.into());
        }
        tracing::info!("got prompt {}", spec.prompt_id);
        // One message: workers wake on `wake`, front ends re-send the queue size on `queue`.
        self.store.control(&json!({ "wake": null, "queue": true }));
        Ok(())
    }

    fn jobs(&self) -> Result<(HashMap<String, String>, HashMap<String, String>), ApiError> {
        let k = &self.store.keys;
        Ok(self.store.with("reading the queue", PATIENCE_REQUEST, |c| {
            redis::pipe().cmd("HGETALL").arg(k.jobs()).cmd("HGETALL").arg(k.running()).query::<(HashMap<String, String>, HashMap<String, String>)>(c)
        })?)
    }

    pub fn remaining(&self) -> Result<usize, ApiError> {
        Ok(self.store.with("HLEN jobs", PATIENCE_REQUEST, |c| redis::cmd("HLEN").arg(self.store.keys.jobs()).query::<usize>(c))?)
    }

    /// `(running, pending)`: pending by number (`front` ones are negative), then by when
    /// they arrived. Workers take client lanes in turn, so the order they run in can
    /// interleave clients where this list does not.
    pub fn snapshot(&self) -> Result<(Vec<Json>, Vec<Json>), ApiError> {
        let (jobs, running) = self.jobs()?;
        let mut run = Vec::new();
        let mut pending = Vec::new();
        for (id, job) in &jobs {
            let Ok(spec) = serde_json::from_str::<Spec>(job) else {
                tracing::warn!("queue: prompt {id} is not a job sdflow reads; skipped");
                continue;
            };
            if running.contains_key(id) {
                run.push(spec);
            } else {
                pending.push(spec);
            }
        }
        let created = |s: &Spec| s.extra_data["create_time"].as_u64().unwrap_or(0);
        pending.sort_by(|a, b| a.number.total_cmp(&b.number).then(created(a).cmp(&created(b))));
        run.sort_by_key(created);
        Ok((run.iter().map(Spec::queue_item).collect(), pending.iter().map(Spec::queue_item).collect()))
    }

    pub fn is_known(&self, prompt_id: &str) -> Result<bool, ApiError> {
        Ok(self.store.with("HEXISTS jobs", PATIENCE_REQUEST, |c| redis::cmd("HEXISTS").arg(self.store.keys.jobs()).arg(prompt_id).query::<bool>(c))?)
    }

    pub fn drop_pending(&self, ids: Option<&[String]>) -> Result<usize, ApiError> {
        // The script reads no ids as "every pending prompt": an empty list deletes nothing.
        if ids.is_some_and(|i| i.is_empty()) {
            return Ok(0);
        }
        let k = &self.store.keys;
        let script = redis::Script::new(DROP);
        let n = self.store.with("dropping prompts", PATIENCE_REQUEST, |c| {
            let mut inv = script.key(k.jobs());
            inv.key(k.running()).key(k.where_());
            for id in ids.unwrap_or(&[]) {
                inv.arg(id);
            }
            inv.invoke::<usize>(c)
        })?;
        if n > 0 {
            self.store.control(&json!({ "queue": true }));
        }
        Ok(n)
    }

    /// Tells the worker running `prompt_id` (every worker's running prompt when `None`)
    /// to stop it.
    pub fn interrupt(&self, prompt_id: Option<&str>) -> Result<bool, ApiError> {
        let running: Vec<String> = self.store.with("HKEYS running", PATIENCE_REQUEST, |c| redis::cmd("HKEYS").arg(self.store.keys.running()).query(c))?;
        let found = match prompt_id {
            Some(id) => running.iter().any(|r| r == id),
            None => !running.is_empty(),
        };
        if found {
            self.store.control(&json!({ "interrupt": prompt_id }));
        }
        Ok(found)
    }

    pub fn history_get(&self, id: &str) -> Result<Option<Arc<Json>>, ApiError> {
        let doc: Option<String> = self.store.with("HGET history", PATIENCE_REQUEST, |c| redis::cmd("HGET").arg(self.store.keys.history()).arg(id).query(c))?;
        Ok(doc.and_then(|d| serde_json::from_str(&d).ok()).map(Arc::new))
    }

    pub fn history_all(&self) -> Result<Vec<(String, Arc<Json>)>, ApiError> {
        let k = &self.store.keys;
        let ids: Vec<String> = self.store.with("ZRANGE history", PATIENCE_REQUEST, |c| redis::cmd("ZRANGE").arg(k.order()).arg(0).arg(-1).query(c))?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let docs: Vec<Option<String>> = self.store.with("HMGET history", PATIENCE_REQUEST, |c| redis::cmd("HMGET").arg(k.history()).arg(&ids).query(c))?;
        Ok(ids.into_iter().zip(docs).filter_map(|(id, d)| Some((id, Arc::new(serde_json::from_str(&d?).ok()?)))).collect())
    }

    pub fn history_len(&self) -> Result<usize, ApiError> {
        Ok(self.store.with("ZCARD history", PATIENCE_REQUEST, |c| redis::cmd("ZCARD").arg(self.store.keys.order()).query::<usize>(c))?)
    }

    pub fn history_delete(&self, id: Option<&str>) -> Result<(), ApiError> {
        let k = &self.store.keys;
        self.store.with("deleting history", PATIENCE_REQUEST, |c| match id {
            Some(id) => redis::pipe().atomic().cmd("HDEL").arg(k.history()).arg(id).cmd("ZREM").arg(k.order()).arg(id).query::<()>(c),
            None => redis::pipe().atomic().cmd("DEL").arg(k.history()).cmd("DEL").arg(k.order()).query::<()>(c),
        })?;
        Ok(())
    }

    /// What `/system_stats` says: the queue's depth, the workers and the dead letters.
    pub fn stats(&self) -> Result<Json, ApiError> {
        let k = &self.store.keys;
        let (jobs, running, dead): (usize, usize, usize) = self.store.with("queue stats", PATIENCE_REQUEST, |c| {
            redis::pipe().cmd("HLEN").arg(k.jobs()).cmd("HLEN").arg(k.running()).cmd("XLEN").arg(k.dead()).query(c)
        })?;
        Ok(json!({
            "backend": "redis",
            "url": self.store.url(),
            "pending": jobs.saturating_sub(running),
            "running": running,
            "max": self.max_queue,
            "dead_letters": dead,
            "workers": self.store.workers()?,
        }))
    }

    /// Hands a finished prompt's entry to the request waiting for it, if any.
    fn resolve(&self, prompt_id: &str) {
        let Some(tx) = self.waiters.lock().remove(prompt_id) else { return };
        match self.history_get(prompt_id) {
            Ok(Some(entry)) => {
                let _ = tx.send(entry);
            }
            // Not stored yet (or unreadable now): keep waiting.
            _ => {
                self.waiters.lock().insert(prompt_id.to_string(), tx);
            }
        }
    }

    /// After a reconnect: messages may have been missed, so look for every waiting
    /// prompt in the history.
    fn resolve_all(&self) {
        let ids: Vec<String> = self.waiters.lock().keys().cloned().collect();
        for id in ids {
            self.resolve(&id);
        }
    }
}

/// Parses a stream reply (`XREADGROUP`'s `[[key, [[id, fields|nil], …]], …]`) into
/// `(key, id, fields)`; `fields` is `None` for an entry deleted while it was pending.
pub(crate) fn stream_entries(v: &Value) -> Vec<(String, String, Option<HashMap<String, Vec<u8>>>)> {
    let mut out = Vec::new();
    let streams: Vec<(&Value, &Value)> = match v {
        Value::Array(items) => items.iter().filter_map(|s| match s {
            Value::Array(kv) if kv.len() == 2 => Some((&kv[0], &kv[1])),
            _ => None,
        }).collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
        _ => Vec::new(),
    };
    for (key, entries) in streams {
        let key = bytes_of(key).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
        out.extend(entry_list(entries).into_iter().map(|(id, f)| (key.clone(), id, f)));
    }
    out
}

/// `[[id, [field, value, …] | nil], …]`.
pub(crate) fn entry_list(v: &Value) -> Vec<(String, Option<HashMap<String, Vec<u8>>>)> {
    let Value::Array(entries) = v else { return Vec::new() };
    entries
        .iter()
        .filter_map(|e| {
            let Value::Array(pair) = e else { return None };
            let id = String::from_utf8_lossy(bytes_of(pair.first()?)?).into_owned();
            let fields = match pair.get(1) {
                Some(Value::Array(f)) => Some(
                    f.chunks(2)
                        .filter_map(|kv| Some((String::from_utf8_lossy(bytes_of(&kv[0])?).into_owned(), bytes_of(kv.get(1)?)?.to_vec())))
                        .collect(),
                ),
                Some(Value::Map(f)) => Some(f.iter().filter_map(|(k, v)| Some((String::from_utf8_lossy(bytes_of(k)?).into_owned(), bytes_of(v)?.to_vec()))).collect()),
                _ => None,
            };
            Some((id, fields))
        })
        .collect()
}

fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_kept_out_of_messages() {
        assert!(matches!(Store::open("http://localhost:6379"), Err(QueueError::Url { .. })));
        assert_eq!(redact("redis://:secret@10.0.0.1:6379/2"), "redis://***@10.0.0.1:6379/2");
        assert_eq!(redact("rediss://user:pw@h"), "rediss://***@h");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        // Nothing listens on port 1: the error says where it tried, without the password.
        let err = Store::open("redis://:hunter2@127.0.0.1:1").err().unwrap().to_string();
        assert!(err.contains("127.0.0.1:1") && err.contains("unreachable") && !err.contains("hunter2"), "{err}");
    }

    #[test]
    fn stream_replies_parse_including_deleted_entries() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            b("sdflow:q:front"),
            Value::Array(vec![
                Value::Array(vec![b("1-0"), Value::Array(vec![b("id"), b("p1"), b("job"), b("{}")])]),
                Value::Array(vec![b("2-0"), Value::Nil]),
            ]),
        ])]);
        let got = stream_entries(&reply);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "sdflow:q:front");
        assert_eq!(got[0].2.as_ref().unwrap()["id"], b"p1");
        assert!(got[1].2.is_none());
    }
}
