//! The sdcpp API's job records (sd-server's async jobs): how each ended and when, kept
//! for ten minutes after, then answering 410. Apart from the handlers so the server's
//! state holds it without depending on them.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde_json::Value as Json;

use crate::error::ApiError;

/// How long a finished job's result is kept, and how long its id then answers 410.
pub(super) const TTL_SECS: i64 = 600;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Img,
    Vid,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Img => "img_gen",
            Kind::Vid => "vid_gen",
        }
    }
}

/// How a job ended.
pub(super) enum End {
    /// The `result` object.
    Completed(Json),
    Failed(String),
    Cancelled,
}

pub(super) struct Job {
    pub(super) kind: Kind,
    pub(super) created: i64,
    pub(super) started: Option<i64>,
    pub(super) completed: Option<i64>,
    pub(super) end: Option<End>,
}

/// The sdcpp API's jobs, by id.
#[derive(Default)]
pub struct SdcppJobs {
    pub(super) inner: Mutex<Inner>,
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) jobs: HashMap<String, Job>,
    /// Ids of jobs dropped after their time to live, until when they answer 410.
    expired: HashMap<String, i64>,
}

impl Inner {
    pub(super) fn purge(&mut self, now: i64) {
        self.expired.retain(|_, until| *until > now);
        let old: Vec<String> = self.jobs.iter().filter(|(_, j)| j.completed.is_some_and(|c| now - c >= TTL_SECS)).map(|(id, _)| id.clone()).collect();
        for id in old {
            self.jobs.remove(&id);
            self.expired.insert(id, now + TTL_SECS);
        }
    }

    pub(super) fn job(&mut self, id: &str, now: i64) -> Result<&mut Job, ApiError> {
        self.purge(now);
        if self.expired.contains_key(id) {
            return Err(ApiError::Gone(format!("job {id} expired")));
        }
        self.jobs.get_mut(id).ok_or_else(|| ApiError::NotFound(format!("no job {id}")))
    }
}

impl SdcppJobs {
    /// Records how job `id` ended (unless it already has: a cancel got there first).
    pub(super) fn finish(&self, id: &str, end: End, started: Option<i64>) {
        let mut inner = self.inner.lock();
        if let Some(job) = inner.jobs.get_mut(id) {
            if job.end.is_none() {
                job.end = Some(end);
                job.completed = Some(unix_now());
            }
            // The run's own start (its history's) over when a poll first saw it running.
            job.started = started.map(|s| s.max(job.created)).or(job.started);
        }
    }
}

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

