//! Where prompts wait and finished results are kept: in this process (the queue with its
//! one worker thread, the history folder) or, in scale-out mode, in Redis. A module of its
//! own so the handlers depend on one interface and neither backend depends on the other.

use std::sync::Arc;

use serde_json::{json, Value as Json};

use crate::error::ApiError;
use crate::history::{list_range, History};
use crate::queue::{Job, JobQueue};
use crate::scale_out::Frontend;

/// Where accepted prompts wait: this process's own queue (one worker thread here), or
/// Redis in scale-out mode (`--queue redis://`, workers elsewhere). Handlers talk to this
/// and do not care which.
pub enum Queue {
    Local(JobQueue),
    Redis(Arc<Frontend>),
}

impl Queue {
    pub fn max(&self) -> usize {
        match self {
            Queue::Local(q) => q.max(),
            Queue::Redis(r) => r.max_queue(),
        }
    }

    /// The number a prompt gets when the client gives none (negated for `front`).
    pub fn next_number(&self) -> Result<u64, ApiError> {
        match self {
            Queue::Local(q) => Ok(q.next_number()),
            Queue::Redis(r) => r.next_number(),
        }
    }

    pub fn push(&self, job: Job) -> Result<(), ApiError> {
        match self {
            Queue::Local(q) => q.push(job),
            Queue::Redis(r) => r.submit(job.spec, job.done),
        }
    }

    /// Prompts waiting or running (ComfyUI's `queue_remaining`).
    pub fn remaining(&self) -> Result<usize, ApiError> {
        match self {
            Queue::Local(q) => Ok(q.remaining()),
            Queue::Redis(r) => r.remaining(),
        }
    }

    /// `(running, pending)` as ComfyUI's `GET /queue` lists them, pending in run order.
    pub fn snapshot(&self) -> Result<(Vec<Json>, Vec<Json>), ApiError> {
        match self {
            Queue::Local(q) => Ok(q.snapshot()),
            Queue::Redis(r) => r.snapshot(),
        }
    }

    pub fn is_known(&self, prompt_id: &str) -> Result<bool, ApiError> {
        match self {
            Queue::Local(q) => Ok(q.is_known(prompt_id)),
            Queue::Redis(r) => r.is_known(prompt_id),
        }
    }

    /// Drops every pending prompt; returns how many.
    pub fn clear(&self) -> Result<usize, ApiError> {
        match self {
            Queue::Local(q) => Ok(q.clear()),
            Queue::Redis(r) => r.drop_pending(None),
        }
    }

    /// Drops the pending prompts with these ids; returns how many were found.
    pub fn delete(&self, ids: &[String]) -> Result<usize, ApiError> {
        match self {
            Queue::Local(q) => Ok(q.delete(ids)),
            Queue::Redis(r) => r.drop_pending(Some(ids)),
        }
    }

    /// Cancels the running prompt (in scale-out mode: every running one, on whichever
    /// worker runs it) — only `prompt_id` when one is given. Returns whether one was found.
    pub fn interrupt(&self, prompt_id: Option<&str>) -> Result<bool, ApiError> {
        match self {
            Queue::Local(q) => Ok(q.interrupt(prompt_id)),
            Queue::Redis(r) => r.interrupt(prompt_id),
        }
    }

    /// Stops taking prompts. The local queue also cancels its running prompt and drops
    /// pending ones; in scale-out mode the prompts belong to Redis and stay there.
    pub fn close(&self) {
        match self {
            Queue::Local(q) => q.close(),
            Queue::Redis(r) => r.close(),
        }
    }

    /// What `/system_stats` says of the queue.
    pub fn stats(&self) -> Result<Json, ApiError> {
        match self {
            Queue::Local(q) => {
                let (pending, running) = q.counts();
                Ok(json!({ "backend": "local", "pending": pending, "running": running, "max": q.max() }))
            }
            Queue::Redis(r) => r.stats(),
        }
    }
}

/// Where finished prompts are kept: this process's history folder, or Redis in scale-out
/// mode (where every front end reads what any worker stored).
pub enum HistoryStore {
    Local(History),
    Redis(Arc<Frontend>),
}

impl HistoryStore {
    pub fn get(&self, id: &str) -> Result<Option<Arc<Json>>, ApiError> {
        match self {
            HistoryStore::Local(h) => Ok(h.get(id)),
            HistoryStore::Redis(r) => r.history_get(id),
        }
    }

    /// Every entry, oldest first.
    pub fn all(&self) -> Result<Vec<(String, Arc<Json>)>, ApiError> {
        match self {
            HistoryStore::Local(h) => Ok(h.all()),
            HistoryStore::Redis(r) => r.history_all(),
        }
    }

    pub fn list(&self, max_items: Option<usize>, offset: usize) -> Result<Json, ApiError> {
        match self {
            HistoryStore::Local(h) => Ok(h.list(max_items, offset)),
            HistoryStore::Redis(r) => {
                let all = r.history_all()?;
                let (start, end) = list_range(all.len(), max_items, offset);
                Ok(Json::Object(all.into_iter().take(end).skip(start).map(|(id, e)| (id, (*e).clone())).collect()))
            }
        }
    }

    pub fn len(&self) -> Result<usize, ApiError> {
        match self {
            HistoryStore::Local(h) => Ok(h.len()),
            HistoryStore::Redis(r) => r.history_len(),
        }
    }

    pub fn delete(&self, id: &str) -> Result<(), ApiError> {
        match self {
            HistoryStore::Local(h) => Ok(h.delete(id)),
            HistoryStore::Redis(r) => r.history_delete(Some(id)),
        }
    }

    pub fn clear(&self) -> Result<(), ApiError> {
        match self {
            HistoryStore::Local(h) => Ok(h.clear()),
            HistoryStore::Redis(r) => r.history_delete(None),
        }
    }
}
