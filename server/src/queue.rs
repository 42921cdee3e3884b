//! The bounded prompt queue and its one worker thread.
//!
//! The executor runs synchronously, so the worker is a plain thread that blocks on the
//! queue; handlers only push, inspect and cancel. Pending prompts are taken in ComfyUI's
//! order: lowest `number` first (`front` prompts have negative numbers), then arrival.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use sdflow_executor::{CancelToken, Plan};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};
use tokio::sync::oneshot;

use crate::error::ApiError;

/// What a prompt is, apart from its compiled plan: what `/queue` and `/history` echo and
/// what the worker needs to run it. Serializable, because in scale-out mode it travels
/// through Redis to a worker that compiles the plan again with its own registry.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub prompt_id: String,
    pub number: f64,
    /// The prompt in ComfyUI's API format (a UI workflow is converted on arrival), echoed
    /// by `/queue` and `/history`.
    pub prompt: Json,
    pub extra_data: Json,
    /// Output nodes the plan runs (ComfyUI's `outputs_to_execute`).
    pub outputs: Vec<String>,
    /// The WebSocket client that gets this prompt's events; everyone when `None`.
    pub client_id: Option<String>,
    /// Text chunks for the PNGs output nodes write, and those that differ per image of
    /// a batch (`RunOptions::image_metadata`).
    pub metadata: Vec<(String, String)>,
    pub image_metadata: Vec<Vec<(String, String)>>,
}

impl Spec {
    /// ComfyUI's queue item: `[number, prompt_id, prompt, extra_data, outputs_to_execute]`.
    pub fn queue_item(&self) -> Json {
        json!([
            number_json(self.number),
            self.prompt_id,
            self.prompt,
            self.extra_data,
            self.outputs
        ])
    }
}

/// One accepted prompt, compiled.
pub struct Job {
    pub spec: Spec,
    pub plan: Plan,
    /// Told the history entry once the prompt is done (the synchronous A1111/OpenAI
    /// endpoints wait on it).
    pub done: Option<oneshot::Sender<Arc<Json>>>,
}

/// ComfyUI numbers are integers unless a client sent a fractional one.
pub fn number_json(n: f64) -> Json {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        json!(n as i64)
    } else {
        json!(n)
    }
}

struct Running {
    prompt_id: String,
    item: Json,
    cancel: CancelToken,
}

#[derive(Default)]
struct State {
    pending: Vec<(u64, Job)>,
    running: Option<Running>,
    closed: bool,
    arrivals: u64,
    /// ComfyUI's `self.number`: the next number handed to a prompt without one.
    counter: u64,
}

pub struct JobQueue {
    max: usize,
    state: Mutex<State>,
    wake: Condvar,
}

impl JobQueue {
    pub fn new(max: usize) -> Self {
        JobQueue {
            max: max.max(1),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The number a prompt gets when the client gives none (negated for `front`).
    pub fn next_number(&self) -> u64 {
        let mut s = self.state.lock();
        let n = s.counter;
        s.counter += 1;
        n
    }

    pub fn push(&self, job: Job) -> Result<(), ApiError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(ApiError::ShuttingDown);
        }
        if s.pending.len() >= self.max {
            return Err(ApiError::QueueFull { max: self.max });
        }
        if s.pending.iter().any(|(_, j)| j.spec.prompt_id == job.spec.prompt_id)
            || s.running
                .as_ref()
                .is_some_and(|r| r.prompt_id == job.spec.prompt_id)
        {
            return Err(ApiError::bad(format!(
                "prompt_id {} is already queued",
                job.spec.prompt_id
            )));
        }
        let arrival = s.arrivals;
        s.arrivals += 1;
        // ComfyUI's console line for each accepted prompt.
        tracing::info!("got prompt {}", job.spec.prompt_id);
        s.pending.push((arrival, job));
        drop(s);
        self.wake.notify_one();
        Ok(())
    }

    /// Blocks until there is a prompt to run, marks it running and hands it out with its
    /// cancel token; `None` once the queue is closed.
    pub fn take(&self) -> Option<(Job, CancelToken)> {
        let mut s = self.state.lock();
        loop {
            if s.closed {
                return None;
            }
            let best = s
                .pending
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| a.1.spec.number.total_cmp(&b.1.spec.number).then(a.0.cmp(&b.0)))
                .map(|(i, _)| i);
            if let Some(i) = best {
                let (_, job) = s.pending.remove(i);
                let cancel = CancelToken::new();
                s.running = Some(Running {
                    prompt_id: job.spec.prompt_id.clone(),
                    item: job.spec.queue_item(),
                    cancel: cancel.clone(),
                });
                return Some((job, cancel));
            }
            self.wake.wait(&mut s);
        }
    }

    /// The running prompt is done (its history entry is already stored).
    pub fn finish(&self) {
        self.state.lock().running = None;
    }

    /// `(pending, running)`.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.pending.len(), usize::from(s.running.is_some()))
    }

    /// Prompts waiting or running (ComfyUI's `queue_remaining`).
    pub fn remaining(&self) -> usize {
        let s = self.state.lock();
        s.pending.len() + usize::from(s.running.is_some())
    }

    /// `(running, pending)` as ComfyUI's `GET /queue` lists them, pending in run order.
    pub fn snapshot(&self) -> (Vec<Json>, Vec<Json>) {
        let s = self.state.lock();
        let running = s.running.iter().map(|r| r.item.clone()).collect();
        let mut pending: Vec<&(u64, Job)> = s.pending.iter().collect();
        pending.sort_by(|a, b| a.1.spec.number.total_cmp(&b.1.spec.number).then(a.0.cmp(&b.0)));
        (
            running,
            pending.iter().map(|(_, j)| j.spec.queue_item()).collect(),
        )
    }

    pub fn is_known(&self, prompt_id: &str) -> bool {
        let s = self.state.lock();
        s.running.as_ref().is_some_and(|r| r.prompt_id == prompt_id)
            || s.pending.iter().any(|(_, j)| j.spec.prompt_id == prompt_id)
    }

    /// Drops every pending prompt; returns how many.
    pub fn clear(&self) -> usize {
        let mut s = self.state.lock();
        let n = s.pending.len();
        s.pending.clear();
        n
    }

    /// Drops the pending prompts with these ids; returns how many were found.
    pub fn delete(&self, ids: &[String]) -> usize {
        let mut s = self.state.lock();
        let before = s.pending.len();
        s.pending.retain(|(_, j)| !ids.contains(&j.spec.prompt_id));
        before - s.pending.len()
    }

    /// Cancels the running prompt — only if it is `prompt_id` when one is given. Returns
    /// whether something was cancelled.
    pub fn interrupt(&self, prompt_id: Option<&str>) -> bool {
        let s = self.state.lock();
        match &s.running {
            Some(r) if prompt_id.is_none_or(|p| p == r.prompt_id) => {
                r.cancel.cancel();
                true
            }
            _ => false,
        }
    }

    /// Stops handing out work and cancels the running prompt; pending ones are dropped.
    pub fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        s.pending.clear();
        if let Some(r) = &s.running {
            r.cancel.cancel();
        }
        drop(s);
        self.wake.notify_all();
    }
}
