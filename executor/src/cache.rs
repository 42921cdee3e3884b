//! The output cache: node outputs by content key, least recently used first out, within
//! a byte budget. It lives on the [`crate::Executor`], so it spans runs and workflows.

use std::sync::Arc;

use lru::LruCache;
use serde_json::Value as Json;

use crate::plan::CacheKey;
use crate::value::Value;

#[derive(Clone, Debug)]
pub(crate) struct CachedOutputs {
    pub values: Arc<[Value]>,
    pub ui: Option<Json>,
    pub bytes: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub entries: usize,
    pub bytes: usize,
    pub budget_bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

pub(crate) struct OutputCache {
    // Entries that count bytes, evicted to stay within the byte budget.
    sized: LruCache<CacheKey, CachedOutputs>,
    // Zero-byte entries (model handles, outputs of output nodes): evicting them frees no
    // budget, so only the entry limit pushes them out.
    handles: LruCache<CacheKey, CachedOutputs>,
    bytes: usize,
    budget_bytes: usize,
    max_entries: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl OutputCache {
    pub fn new(budget_bytes: usize, max_entries: usize) -> Self {
        OutputCache {
            sized: LruCache::unbounded(),
            handles: LruCache::unbounded(),
            bytes: 0,
            budget_bytes,
            max_entries,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    pub fn get(&mut self, key: &CacheKey) -> Option<CachedOutputs> {
        let hit = match self.sized.get(key) {
            Some(e) => Some(e),
            None => self.handles.get(key),
        };
        match hit {
            Some(e) => {
                self.hits += 1;
                Some(e.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Stores a node's outputs, evicting the least recently used entries to stay within
    /// budget. An entry larger than the whole budget is not stored at all.
    pub fn insert(&mut self, key: CacheKey, values: Arc<[Value]>, ui: Option<Json>) {
        let bytes: usize = values.iter().map(Value::cache_bytes).sum();
        if bytes > self.budget_bytes || self.max_entries == 0 {
            return;
        }
        // Equal keys mean equal outputs, so a present entry only needs refreshing.
        if self.sized.get(&key).is_some() || self.handles.get(&key).is_some() {
            return;
        }
        let entry = CachedOutputs { values, ui, bytes };
        if bytes == 0 {
            self.handles.put(key, entry);
        } else {
            self.sized.put(key, entry);
            self.bytes += bytes;
        }
        while self.bytes > self.budget_bytes
            || self.sized.len() + self.handles.len() > self.max_entries
        {
            let evicted = if self.bytes > self.budget_bytes || self.handles.is_empty() {
                self.sized.pop_lru()
            } else {
                self.handles.pop_lru()
            };
            match evicted {
                Some((_, e)) => {
                    self.bytes -= e.bytes;
                    self.evictions += 1;
                }
                None => break,
            }
        }
    }

    pub fn clear(&mut self) {
        self.sized.clear();
        self.handles.clear();
        self.bytes = 0;
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.sized.len() + self.handles.len(),
            bytes: self.bytes,
            budget_bytes: self.budget_bytes,
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
        }
    }
}
