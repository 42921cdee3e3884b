//! Finished prompts, kept to a bound and persisted one JSON file per prompt, so a restart
//! loses no finished result.
//!
//! Each file holds `{"seq": N, "entry": {...}}`; `seq` restores the order on start. Files
//! are written to a temporary name and renamed, so a crash leaves either the old state or
//! the new one, never half a file.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Map, Value as Json};

use crate::error::ApiError;

pub struct History {
    dir: PathBuf,
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_seq: u64,
    order: VecDeque<String>,
    entries: HashMap<String, (u64, Arc<Json>)>,
}

/// Prompt ids become file names; only these characters keep that safe everywhere.
pub fn valid_prompt_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl History {
    /// Opens (creating it if needed) the history directory and loads what it holds. Files
    /// that cannot be read are reported and left alone rather than failing the start.
    pub fn open(dir: &Path, max: usize) -> Result<History, ApiError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ApiError::io(format!("creating {}", dir.display()), e))?;
        let mut found: Vec<(u64, String, Json)> = Vec::new();
        let entries = std::fs::read_dir(dir)
            .map_err(|e| ApiError::io(format!("reading {}", dir.display()), e))?;
        for e in entries.flatten() {
            let path = e.path();
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if !valid_prompt_id(id) {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Json>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(doc) => match (doc.get("seq").and_then(Json::as_u64), doc.get("entry")) {
                    (Some(seq), Some(entry)) => found.push((seq, id.to_string(), entry.clone())),
                    _ => tracing::warn!("{}: not a history file (no seq/entry)", path.display()),
                },
                Err(e) => tracing::warn!("{}: skipped: {e}", path.display()),
            }
        }
        found.sort_by_key(|f| f.0);
        let history = History {
            dir: dir.to_path_buf(),
            max: max.max(1),
            inner: Mutex::new(Inner::default()),
        };
        {
            let mut inner = history.inner.lock();
            for (seq, id, entry) in found {
                inner.next_seq = inner.next_seq.max(seq + 1);
                inner.order.push_back(id.clone());
                inner.entries.insert(id, (seq, Arc::new(entry)));
            }
        }
        history.trim();
        Ok(history)
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Records a finished prompt: on disk first, so what the API reports is persisted.
    pub fn insert(&self, id: &str, entry: Json) -> Result<(), ApiError> {
        let seq = {
            let mut inner = self.inner.lock();
            let s = inner.next_seq;
            inner.next_seq += 1;
            s
        };
        let doc = json!({ "seq": seq, "entry": entry });
        let bytes = serde_json::to_vec(&doc).map_err(|e| ApiError::Internal(e.to_string()))?;
        write_atomic(&self.path(id), &bytes)?;
        {
            let mut inner = self.inner.lock();
            if inner
                .entries
                .insert(id.to_string(), (seq, Arc::new(entry)))
                .is_some()
            {
                inner.order.retain(|o| o != id);
            }
            inner.order.push_back(id.to_string());
        }
        self.trim();
        Ok(())
    }

    fn trim(&self) {
        let mut removed = Vec::new();
        {
            let mut inner = self.inner.lock();
            while inner.order.len() > self.max {
                if let Some(old) = inner.order.pop_front() {
                    inner.entries.remove(&old);
                    removed.push(old);
                }
            }
        }
        for id in removed {
            self.remove_file(&id);
        }
    }

    fn remove_file(&self, id: &str) {
        let path = self.path(id);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing {}: {e}", path.display());
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Json>> {
        self.inner.lock().entries.get(id).map(|e| e.1.clone())
    }

    /// Every entry, oldest first, shared rather than copied (the jobs list reads them all).
    pub fn all(&self) -> Vec<(String, Arc<Json>)> {
        let inner = self.inner.lock();
        inner.order.iter().filter_map(|id| inner.entries.get(id).map(|(_, e)| (id.clone(), e.clone()))).collect()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// ComfyUI's `GET /history`: `{prompt_id: entry}`, oldest first; `max_items` keeps the
    /// newest ones, `offset` skips that many from the oldest end of what is kept.
    pub fn list(&self, max_items: Option<usize>, offset: usize) -> Json {
        let inner = self.inner.lock();
        let (start, end) = list_range(inner.order.len(), max_items, offset);
        let mut out = Map::new();
        for id in inner.order.iter().take(end).skip(start) {
            if let Some((_, e)) = inner.entries.get(id) {
                out.insert(id.clone(), (**e).clone());
            }
        }
        Json::Object(out)
    }

    pub fn delete(&self, id: &str) {
        let existed = {
            let mut inner = self.inner.lock();
            let existed = inner.entries.remove(id).is_some();
            if existed {
                inner.order.retain(|o| o != id);
            }
            existed
        };
        if existed {
            self.remove_file(id);
        }
    }

    pub fn clear(&self) {
        let ids: Vec<String> = {
            let mut inner = self.inner.lock();
            inner.entries.clear();
            inner.order.drain(..).collect()
        };
        for id in ids {
            self.remove_file(&id);
        }
    }
}

/// Which of `n` entries (oldest first) ComfyUI's `GET /history?max_items=&offset=` returns:
/// `max_items` keeps the newest ones, `offset` skips that many from the newest end.
pub fn list_range(n: usize, max_items: Option<usize>, offset: usize) -> (usize, usize) {
    let start = match max_items {
        Some(m) => n.saturating_sub(m + offset),
        None => offset.min(n),
    };
    let end = match max_items {
        Some(_) => n.saturating_sub(offset),
        None => n,
    };
    (start, end)
}

/// Writes `bytes` to `path` through a temporary file in the same directory, synced before
/// the rename, so readers see the old content or the new, never a partial file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ApiError> {
    use std::io::Write;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| ApiError::io(ctx("creating"), e))?;
        f.write_all(bytes)
            .map_err(|e| ApiError::io(ctx("writing"), e))?;
        f.sync_all().map_err(|e| ApiError::io(ctx("syncing"), e))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| ApiError::io(format!("renaming to {}", path.display()), e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
