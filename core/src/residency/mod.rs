//! The residency manager: the one owner of model weights.
//!
//! A loader asks for weights by [`WeightKey`] (source files, key prefix, dtype, device) and
//! gets a [`WeightHandle`]. Identical keys share one entry and therefore one copy.
//!
//! Policy, in one place:
//!
//! - **Lazy.** [`ResidencyManager::get_or_load`] only registers the request and its loader;
//!   nothing is read until the first [`WeightHandle::pin`]. A pin of a resident entry is a
//!   *hit*; a pin that has to run the loader is a *load* (also after an eviction).
//! - **Pinned = in use.** A [`PinGuard`] keeps the payload resident; a running graph holds
//!   one for every weight it reads. Only entries with no pin guard can be evicted.
//! - **Budgets.** Each [`Device`] may have a byte budget ([`ResidencyManager::set_budget`]).
//!   Before a load (using the loader's size estimate, when it has one) and again after it
//!   (with the real size) the least-recently-used unpinned entries of that device are evicted
//!   until the new payload fits. If it still does not fit because everything left is pinned,
//!   the pin fails with [`ResidencyError::OverBudget`] — like sd.cpp, we fail rather than
//!   silently exceed a limit the user set; offloading is a caller's decision.
//!   Budgets count every byte a payload reports, file-backed (mmap) and anonymous alike:
//!   mmap pages are reclaimable by the kernel, but once touched they occupy RAM like any other.
//! - **Reference counting.** Entries count their handles (and pins). When the last handle of
//!   an entry goes away its payload stays cached — the next identical request revives it as
//!   a hit, which is what a re-run workflow wants — and is evicted in LRU order like any
//!   unpinned entry; an entry with no handle and no resident payload is forgotten.
//!   [`ResidencyManager::release_unreferenced`] drops the cached payloads nobody refers to.
//! - **Single flight.** Concurrent pins of the same non-resident entry run its loader once;
//!   the others wait for it and share the result (or its error).
//!
//! The manager is generic over what is resident (anything implementing [`Resident`]), so the
//! host-side [`HostWeights`] and, later, backend buffers on a GPU share the same bookkeeping.


mod host;

pub use host::{HostTensor, HostWeights, HostWeightsError, HostWeightsLoader};

use std::any::Any;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};

use crate::io::WeightType;

/// An error from a loader, kept as a trait object because loaders come from many layers.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Errors of the residency manager.
#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("weight source {path}: {source}")]
    Source {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("weight key {key}: at least one source file is required")]
    NoSources { key: String },
    #[error("loading {key} failed: {source}")]
    Load {
        key: String,
        #[source]
        source: Arc<dyn StdError + Send + Sync + 'static>,
    },
    #[error(
        "loading {key} needs {needed} bytes on {device}, but its budget is {budget} bytes and \
         {pinned} bytes there are pinned by running work (nothing left to evict)"
    )]
    OverBudget {
        key: String,
        device: Device,
        needed: u64,
        budget: u64,
        pinned: u64,
    },
    #[error("{key} is resident as {actual}, but was asked for as {requested}")]
    TypeMismatch {
        key: String,
        requested: &'static str,
        actual: &'static str,
    },
}

/// Where a payload lives. Budgets are per device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Host RAM.
    Cpu,
    /// A GPU of the built backend, by ordinal.
    Gpu(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(i) => write!(f, "gpu:{i}"),
        }
    }
}

impl From<crate::ggml::BackendKind> for Device {
    fn from(k: crate::ggml::BackendKind) -> Self {
        match k {
            crate::ggml::BackendKind::Cpu => Device::Cpu,
            crate::ggml::BackendKind::Gpu(i) => Device::Gpu(i as u32),
        }
    }
}

/// What makes two weight requests identical.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightKey {
    /// The files the weights come from, canonicalized so that two spellings of a path match.
    pub sources: Vec<PathBuf>,
    /// The tensor-name prefix selecting a sub-model (e.g. `model.diffusion_model.`); empty
    /// for the whole file.
    pub prefix: String,
    /// The type the weights are converted to at load.
    #[serde(with = "weight_type_name")]
    pub dtype: WeightType,
    pub device: Device,
}

impl WeightKey {
    /// A key over existing files; each path is canonicalized (so it must exist).
    pub fn new<P: AsRef<Path>>(
        sources: impl IntoIterator<Item = P>,
        prefix: impl Into<String>,
        dtype: impl Into<WeightType>,
        device: Device,
    ) -> Result<Self, ResidencyError> {
        let (prefix, dtype) = (prefix.into(), dtype.into());
        let sources = sources
            .into_iter()
            .map(|p| {
                let p = p.as_ref();
                std::fs::canonicalize(p).map_err(|source| ResidencyError::Source {
                    path: p.to_path_buf(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sources.is_empty() {
            return Err(ResidencyError::NoSources { key: prefix });
        }
        Ok(WeightKey { sources, prefix, dtype, device })
    }

    /// A short human name for stats and logs: the first file's stem plus the prefix.
    pub fn name(&self) -> String {
        let stem = self
            .sources
            .first()
            .and_then(|p| p.file_name())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let extra = if self.sources.len() > 1 {
            format!("+{}", self.sources.len() - 1)
        } else {
            String::new()
        };
        let prefix = self.prefix.trim_end_matches('.');
        if prefix.is_empty() {
            format!("{stem}{extra}")
        } else {
            format!("{stem}{extra}:{prefix}")
        }
    }
}

impl fmt::Display for WeightKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if self.dtype != WeightType::Stored {
            write!(f, " as {}", self.dtype)?;
        }
        write!(f, " on {}", self.device)
    }
}

/// Serializes a weight type as its `--type` spelling (`bf16`, `floats:bf16`), `null` when
/// weights keep their stored types.
mod weight_type_name {
    use super::WeightType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(w: &WeightType, s: S) -> Result<S::Ok, S::Error> {
        match w {
            WeightType::Stored => s.serialize_none(),
            w => s.serialize_some(&w.to_string()),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<WeightType, D::Error> {
        let name: Option<String> = Option::deserialize(d)?;
        name.map_or(Ok(WeightType::Stored), |n| n.parse().map_err(serde::de::Error::custom))
    }
}

/// How many bytes a payload occupies, split by kind of memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprint {
    /// Copied or converted memory (heap, device buffers): freed only by dropping the payload.
    pub anonymous: u64,
    /// Memory borrowed from a read-only file mapping: the kernel can drop and re-read it.
    pub mapped: u64,
}

impl Footprint {
    pub fn total(&self) -> u64 {
        self.anonymous + self.mapped
    }
}

impl std::ops::AddAssign for Footprint {
    fn add_assign(&mut self, o: Self) {
        self.anonymous += o.anonymous;
        self.mapped += o.mapped;
    }
}

impl std::ops::SubAssign for Footprint {
    fn sub_assign(&mut self, o: Self) {
        self.anonymous -= o.anonymous;
        self.mapped -= o.mapped;
    }
}

/// Something the manager can hold resident.
pub trait Resident: Send + Sync + 'static {
    /// The memory this payload holds; asked once, right after loading.
    fn footprint(&self) -> Footprint;
}

/// Produces a payload on the first pin and again after every eviction.
pub trait Load: Send + Sync + 'static {
    type Output: Resident;
    /// Bytes the payload will take, if known without loading (e.g. from file headers); lets
    /// the manager evict *before* the load instead of peaking above the budget.
    fn estimate(&self) -> Option<u64> {
        None
    }
    fn load(&self) -> Result<Self::Output, BoxError>;
}

impl<F, T, E> Load for F
where
    F: Fn() -> Result<T, E> + Send + Sync + 'static,
    T: Resident,
    E: Into<BoxError>,
{
    type Output = T;
    fn load(&self) -> Result<T, BoxError> {
        self().map_err(Into::into)
    }
}

type Payload = Arc<dyn Any + Send + Sync>;

/// The type-erased loader stored in an entry, so the entry can reload after eviction.
trait ErasedLoad: Send + Sync {
    fn estimate(&self) -> Option<u64>;
    fn load(&self) -> Result<(Payload, Footprint), BoxError>;
}

struct Erased<L>(L);

impl<L: Load> ErasedLoad for Erased<L> {
    fn estimate(&self) -> Option<u64> {
        self.0.estimate()
    }
    fn load(&self) -> Result<(Payload, Footprint), BoxError> {
        let out = self.0.load()?;
        let fp = out.footprint();
        Ok((Arc::new(out) as Payload, fp))
    }
}

enum Slot {
    Empty,
    /// A loader is running for this entry (single flight); `generation` tells waiters which
    /// attempt they waited for, so they can pick up its error.
    Loading { generation: u64 },
    Loaded { payload: Payload, footprint: Footprint },
}

struct Entry {
    key: WeightKey,
    type_name: &'static str,
    loader: Arc<dyn ErasedLoad>,
    slot: Slot,
    handles: usize,
    pins: usize,
    /// Dropped as soon as the last pin goes ([`ResidencyManager::get_or_load_transient`]).
    transient: bool,
    last_use: u64,
    generation: u64,
    last_error: Option<(u64, Arc<dyn StdError + Send + Sync>)>,
    hits: u64,
    loads: u64,
    evictions: u64,
    last_load_time: Option<Duration>,
}

impl Entry {
    fn footprint(&self) -> Footprint {
        match &self.slot {
            Slot::Loaded { footprint, .. } => *footprint,
            _ => Footprint::default(),
        }
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<u64, Entry>,
    by_key: HashMap<WeightKey, u64>,
    budgets: HashMap<Device, u64>,
    next_id: u64,
    clock: u64,
    requests: u64,
    hits: u64,
    loads: u64,
    evictions: u64,
    load_failures: u64,
    /// Payloads and entries let go of under the lock, dropped once it is released
    /// ([`Locked`]): dropping them may drop handles and pins of other entries (a LoRA
    /// overlay pins its base; its loader holds the base's handle), which lock again.
    dead: Vec<Box<dyn std::any::Any + Send>>,
}

/// The state's lock guard; on release, whatever the state let go of is dropped after the
/// lock is free.
struct Locked<'a>(Option<MutexGuard<'a, State>>);

impl<'a> Locked<'a> {
    /// The guard itself, for waiting on the condition variable.
    fn guard(&mut self) -> &mut MutexGuard<'a, State> {
        self.0.as_mut().expect("held until dropped")
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let dead = self.0.as_mut().map(|g| std::mem::take(&mut g.dead));
        self.0 = None;
        drop(dead);
    }
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn device_usage(&self, device: Device) -> (u64, u64) {
        let mut resident = 0;
        let mut pinned = 0;
        for e in self.entries.values().filter(|e| e.key.device == device) {
            let b = e.footprint().total();
            resident += b;
            if e.pins > 0 {
                pinned += b;
            }
        }
        (resident, pinned)
    }

    /// Evicts LRU unpinned entries of `device` until `incoming` more bytes fit its budget.
    /// Returns false when that is impossible.
    fn make_room(&mut self, device: Device, incoming: u64) -> bool {
        let Some(&budget) = self.budgets.get(&device) else {
            return true;
        };
        let (mut resident, _) = self.device_usage(device);
        if resident + incoming <= budget {
            return true;
        }
        let mut candidates: Vec<(u64, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.key.device == device && e.pins == 0 && matches!(e.slot, Slot::Loaded { .. })
            })
            .map(|(&id, e)| (e.last_use, id))
            .collect();
        candidates.sort_unstable();
        for (_, id) in candidates {
            if resident + incoming <= budget {
                break;
            }
            resident -= self.evict(id);
        }
        resident + incoming <= budget
    }

    /// Drops the manager's copy of an entry's payload; returns the bytes freed.
    fn evict(&mut self, id: u64) -> u64 {
        let Some(e) = self.entries.get_mut(&id) else {
            return 0;
        };
        if !matches!(e.slot, Slot::Loaded { .. }) {
            return 0;
        }
        let freed = e.footprint().total();
        let payload = std::mem::replace(&mut e.slot, Slot::Empty);
        e.evictions += 1;
        self.evictions += 1;
        tracing::debug!(key = %e.key, bytes = freed, "evicted");
        let forget = e.handles == 0;
        self.dead.push(Box::new(payload));
        if forget {
            self.forget(id);
        }
        freed
    }

    fn forget(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            self.by_key.remove(&e.key);
            self.dead.push(Box::new(e));
        }
    }
}

struct Shared {
    state: Mutex<State>,
    loaded: Condvar,
}

/// The weight owner. Cheap to clone; clones share the same state.
#[derive(Clone)]
pub struct ResidencyManager {
    shared: Arc<Shared>,
}

impl Default for ResidencyManager {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ResidencyManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResidencyManager").field("stats", &self.stats()).finish()
    }
}

impl ResidencyManager {
    fn lock(&self) -> Locked<'_> {
        Locked(Some(self.shared.state.lock()))
    }

    /// A manager with no budgets (every device unlimited).
    pub fn new() -> Self {
        ResidencyManager {
            shared: Arc::new(Shared { state: Mutex::new(State::default()), loaded: Condvar::new() }),
        }
    }

    /// Sets (or with `None` removes) the byte budget of a device, evicting LRU unpinned
    /// entries at once if the device is now over it. Returns whether the device fits; pinned
    /// entries are never evicted, so a lowered budget may stay exceeded until they are unpinned
    /// (the next load on that device then fails until room is made).
    pub fn set_budget(&self, device: Device, bytes: Option<u64>) -> bool {
        let mut st = self.lock();
        match bytes {
            Some(b) => {
                st.budgets.insert(device, b);
                st.make_room(device, 0)
            }
            None => {
                st.budgets.remove(&device);
                true
            }
        }
    }

    pub fn budget(&self, device: Device) -> Option<u64> {
        self.lock().budgets.get(&device).copied()
    }

    /// Registers a request for the weights under `key`, with the loader that produces them.
    ///
    /// Reads nothing: the loader first runs on the first [`WeightHandle::pin`]. If an entry
    /// for `key` exists already, the returned handle shares it and `loader` is dropped (the
    /// key says the two would load the same thing).
    pub fn get_or_load<L: Load>(
        &self,
        key: WeightKey,
        loader: L,
    ) -> Result<WeightHandle<L::Output>, ResidencyError> {
        self.register(key, loader, false)
    }

    /// [`ResidencyManager::get_or_load`] for a payload that is not cached: evicted as soon as
    /// nothing pins it (weights copied to a GPU for one use while they are kept in RAM,
    /// `--offload-to-cpu`; or read from disk for each use, `--params-backend disk`).
    pub fn get_or_load_transient<L: Load>(
        &self,
        key: WeightKey,
        loader: L,
    ) -> Result<WeightHandle<L::Output>, ResidencyError> {
        self.register(key, loader, true)
    }

    fn register<L: Load>(&self, key: WeightKey, loader: L, transient: bool) -> Result<WeightHandle<L::Output>, ResidencyError> {
        let type_name = std::any::type_name::<L::Output>();
        let mut st = self.lock();
        st.requests += 1;
        let id = if let Some(&id) = st.by_key.get(&key) {
            let e = st.entries.get_mut(&id).expect("by_key and entries agree");
            if e.type_name != type_name {
                return Err(ResidencyError::TypeMismatch {
                    key: key.to_string(),
                    requested: type_name,
                    actual: e.type_name,
                });
            }
            e.handles += 1;
            id
        } else {
            let id = st.next_id;
            st.next_id += 1;
            let last_use = st.tick();
            st.by_key.insert(key.clone(), id);
            st.entries.insert(
                id,
                Entry {
                    key: key.clone(),
                    type_name,
                    loader: Arc::new(Erased(loader)),
                    slot: Slot::Empty,
                    handles: 1,
                    pins: 0,
                    transient,
                    last_use,
                    generation: 0,
                    last_error: None,
                    hits: 0,
                    loads: 0,
                    evictions: 0,
                    last_load_time: None,
                },
            );
            id
        };
        drop(st);
        Ok(WeightHandle {
            manager: self.clone(),
            id,
            key: Arc::new(key),
            _payload: std::marker::PhantomData,
        })
    }

    /// Drops cached payloads that no handle refers to any more; returns the bytes freed.
    pub fn release_unreferenced(&self) -> u64 {
        let mut st = self.lock();
        let ids: Vec<u64> = st
            .entries
            .iter()
            .filter(|(_, e)| e.handles == 0 && e.pins == 0)
            .map(|(&id, _)| id)
            .collect();
        let mut freed = 0;
        for id in ids {
            freed += st.evict(id);
            st.forget(id);
        }
        freed
    }

    /// A snapshot of what is resident and how the cache has behaved.
    pub fn stats(&self) -> ResidencyStats {
        let st = self.lock();
        let mut models: Vec<ModelStats> = st
            .entries
            .values()
            .map(|e| {
                let fp = e.footprint();
                ModelStats {
                    name: e.key.name(),
                    key: e.key.clone(),
                    device: e.key.device,
                    resident: matches!(e.slot, Slot::Loaded { .. }),
                    bytes: fp.total(),
                    anonymous_bytes: fp.anonymous,
                    mapped_bytes: fp.mapped,
                    handles: e.handles,
                    pins: e.pins,
                    hits: e.hits,
                    loads: e.loads,
                    evictions: e.evictions,
                    last_load_ms: e.last_load_time.map(|d| d.as_secs_f64() * 1e3),
                }
            })
            .collect();
        models.sort_by(|a, b| (a.device, &a.name).cmp(&(b.device, &b.name)));
        let mut devices: Vec<Device> = st
            .entries
            .values()
            .map(|e| e.key.device)
            .chain(st.budgets.keys().copied())
            .collect();
        devices.sort_unstable();
        devices.dedup();
        let devices = devices
            .into_iter()
            .map(|device| {
                let mut d = DeviceStats {
                    device,
                    budget: st.budgets.get(&device).copied(),
                    ..DeviceStats::default()
                };
                for m in models.iter().filter(|m| m.device == device) {
                    d.bytes += m.bytes;
                    d.anonymous_bytes += m.anonymous_bytes;
                    d.mapped_bytes += m.mapped_bytes;
                    if m.pins > 0 {
                        d.pinned_bytes += m.bytes;
                    }
                }
                d
            })
            .collect();
        ResidencyStats {
            models,
            devices,
            requests: st.requests,
            hits: st.hits,
            loads: st.loads,
            evictions: st.evictions,
            load_failures: st.load_failures,
        }
    }

    fn pin(&self, id: u64, key: &WeightKey) -> Result<(Payload, Arc<PinToken>), ResidencyError> {
        let mut st = self.lock();
        // The waiters' loop: either the payload is there (hit), a load is running (wait for
        // it), or this caller becomes the one loader.
        let mut waited_for: Option<u64> = None;
        loop {
            let now = st.tick();
            let e = st.entries.get_mut(&id).expect("a live handle keeps its entry");
            let loading = match &e.slot {
                Slot::Loaded { payload, .. } => {
                    let payload = payload.clone();
                    e.pins += 1;
                    e.last_use = now;
                    e.hits += 1;
                    st.hits += 1;
                    return Ok((payload, self.token(id)));
                }
                Slot::Loading { generation } => Some(*generation),
                Slot::Empty => {
                    if let (Some(g), Some((eg, err))) = (waited_for, &e.last_error) {
                        if g == *eg {
                            return Err(ResidencyError::Load {
                                key: key.to_string(),
                                source: err.clone(),
                            });
                        }
                    }
                    None
                }
            };
            match loading {
                Some(g) => {
                    waited_for = Some(g);
                    self.shared.loaded.wait(st.guard());
                }
                None => break,
            }
        }
        // Become the loader.
        let e = st.entries.get_mut(&id).expect("a live handle keeps its entry");
        e.generation += 1;
        let generation = e.generation;
        e.slot = Slot::Loading { generation };
        let loader = e.loader.clone();
        let device = key.device;
        drop(st);

        // Both the estimate (which may read file headers) and the load run unlocked, so other
        // entries stay usable meanwhile; a panicking loader becomes an error instead of
        // leaving the entry `Loading` with its waiters blocked forever.
        let guarded = |f: &dyn Fn() -> Result<(Payload, Footprint), BoxError>| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(format!("loader panicked: {msg}").into())
            })
        };
        let estimate = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader.estimate())).ok().flatten();
        if let Some(estimate) = estimate {
            let mut st = self.lock();
            if !st.make_room(device, estimate) {
                let err = self.over_budget(&st, key, estimate);
                self.fail_load(&mut st, id, generation, &err);
                return Err(err);
            }
        }

        let started = Instant::now();
        let result = guarded(&|| loader.load());
        let took = started.elapsed();

        let mut st = self.lock();
        let (payload, footprint) = match result {
            Ok(x) => x,
            Err(source) => {
                let err = ResidencyError::Load { key: key.to_string(), source: Arc::from(source) };
                self.fail_load(&mut st, id, generation, &err);
                return Err(err);
            }
        };
        if !st.make_room(device, footprint.total()) {
            let err = self.over_budget(&st, key, footprint.total());
            self.fail_load(&mut st, id, generation, &err);
            return Err(err);
        }
        let now = st.tick();
        let e = st.entries.get_mut(&id).expect("a live handle keeps its entry");
        e.slot = Slot::Loaded { payload: payload.clone(), footprint };
        e.pins += 1;
        e.last_use = now;
        e.loads += 1;
        e.last_load_time = Some(took);
        st.loads += 1;
        tracing::debug!(key = %key, bytes = footprint.total(), ms = took.as_millis() as u64, "loaded");
        drop(st);
        self.shared.loaded.notify_all();
        Ok((payload, self.token(id)))
    }

    fn over_budget(&self, st: &State, key: &WeightKey, needed: u64) -> ResidencyError {
        let (_, pinned) = st.device_usage(key.device);
        ResidencyError::OverBudget {
            key: key.to_string(),
            device: key.device,
            needed,
            budget: st.budgets.get(&key.device).copied().unwrap_or(u64::MAX),
            pinned,
        }
    }

    fn fail_load(&self, st: &mut State, id: u64, generation: u64, err: &ResidencyError) {
        st.load_failures += 1;
        if let Some(e) = st.entries.get_mut(&id) {
            e.slot = Slot::Empty;
            let shared: Arc<dyn StdError + Send + Sync> = match err {
                ResidencyError::Load { source, .. } => source.clone(),
                other => Arc::new(SharedMessage(other.to_string())),
            };
            e.last_error = Some((generation, shared));
        }
        self.shared.loaded.notify_all();
    }

    fn token(&self, id: u64) -> Arc<PinToken> {
        Arc::new(PinToken { manager: self.clone(), id })
    }

    fn unpin(&self, id: u64) {
        let mut st = self.lock();
        let now = st.tick();
        if let Some(e) = st.entries.get_mut(&id) {
            e.pins -= 1;
            // Unpinning counts as a use: the weights were just read.
            e.last_use = now;
            if e.pins == 0 && e.transient {
                st.evict(id);
            }
        }
    }

    fn add_handle(&self, id: u64) {
        if let Some(e) = self.lock().entries.get_mut(&id) {
            e.handles += 1;
        }
    }

    fn drop_handle(&self, id: u64) {
        let mut st = self.lock();
        let Some(e) = st.entries.get_mut(&id) else { return };
        e.handles -= 1;
        if e.handles == 0 && e.pins == 0 && matches!(e.slot, Slot::Empty) {
            st.forget(id);
        }
    }
}

/// The message of a non-loader failure (e.g. over budget), repeated to single-flight waiters.
#[derive(Debug)]
struct SharedMessage(String);

impl fmt::Display for SharedMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for SharedMessage {}

/// A shared reference to one entry of the manager. Cheap to clone; holds no bytes itself.
pub struct WeightHandle<T> {
    manager: ResidencyManager,
    id: u64,
    key: Arc<WeightKey>,
    _payload: std::marker::PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for WeightHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightHandle").field("key", &*self.key).finish()
    }
}

impl<T> Clone for WeightHandle<T> {
    fn clone(&self) -> Self {
        self.manager.add_handle(self.id);
        WeightHandle {
            manager: self.manager.clone(),
            id: self.id,
            key: self.key.clone(),
            _payload: std::marker::PhantomData,
        }
    }
}

impl<T> Drop for WeightHandle<T> {
    fn drop(&mut self) {
        self.manager.drop_handle(self.id);
    }
}

impl<T: Resident> WeightHandle<T> {
    pub fn key(&self) -> &WeightKey {
        &self.key
    }

    /// Whether two handles refer to the same entry (and so the same copy).
    pub fn same_entry(&self, other: &WeightHandle<T>) -> bool {
        Arc::ptr_eq(&self.manager.shared, &other.manager.shared) && self.id == other.id
    }

    /// Makes the weights resident (loading them if needed) and keeps them so until the guard
    /// is dropped.
    pub fn pin(&self) -> Result<PinGuard<T>, ResidencyError> {
        let (payload, token) = self.manager.pin(self.id, &self.key)?;
        let payload = payload.downcast::<T>().map_err(|_| ResidencyError::TypeMismatch {
            key: self.key.to_string(),
            requested: std::any::type_name::<T>(),
            actual: "another type",
        })?;
        Ok(PinGuard { payload, _token: token })
    }

    /// Whether the payload is resident right now (without loading or touching LRU order).
    pub fn is_resident(&self) -> bool {
        let st = self.manager.lock();
        st.entries.get(&self.id).is_some_and(|e| matches!(e.slot, Slot::Loaded { .. }))
    }
}

struct PinToken {
    manager: ResidencyManager,
    id: u64,
}

impl Drop for PinToken {
    fn drop(&mut self) {
        self.manager.unpin(self.id);
    }
}

/// Keeps one entry resident while it lives. Clones share the same pin.
pub struct PinGuard<T> {
    payload: Arc<T>,
    _token: Arc<PinToken>,
}

impl<T> Clone for PinGuard<T> {
    fn clone(&self) -> Self {
        PinGuard { payload: self.payload.clone(), _token: self._token.clone() }
    }
}

impl<T> std::ops::Deref for PinGuard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.payload
    }
}

impl<T> PinGuard<T> {
    /// Whether two guards hold the very same payload (one copy shared).
    pub fn ptr_eq(a: &PinGuard<T>, b: &PinGuard<T>) -> bool {
        Arc::ptr_eq(&a.payload, &b.payload)
    }
}

/// A snapshot of the manager, for logs and the server's status endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResidencyStats {
    pub models: Vec<ModelStats>,
    pub devices: Vec<DeviceStats>,
    /// `get_or_load` calls.
    pub requests: u64,
    /// Pins served by an already-resident copy (including ones that waited for a concurrent load).
    pub hits: u64,
    /// Loader runs that succeeded.
    pub loads: u64,
    pub evictions: u64,
    /// Loads that failed (loader error or over budget).
    pub load_failures: u64,
}

impl ResidencyStats {
    pub fn device(&self, device: Device) -> Option<&DeviceStats> {
        self.devices.iter().find(|d| d.device == device)
    }

    pub fn model(&self, key: &WeightKey) -> Option<&ModelStats> {
        self.models.iter().find(|m| &m.key == key)
    }
}

/// One entry of the manager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelStats {
    pub name: String,
    pub key: WeightKey,
    pub device: Device,
    pub resident: bool,
    pub bytes: u64,
    pub anonymous_bytes: u64,
    pub mapped_bytes: u64,
    pub handles: usize,
    pub pins: usize,
    pub hits: u64,
    pub loads: u64,
    pub evictions: u64,
    pub last_load_ms: Option<f64>,
}

/// Totals of one device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device: Device,
    pub budget: Option<u64>,
    pub bytes: u64,
    pub anonymous_bytes: u64,
    pub mapped_bytes: u64,
    pub pinned_bytes: u64,
}

impl Default for DeviceStats {
    fn default() -> Self {
        DeviceStats {
            device: Device::Cpu,
            budget: None,
            bytes: 0,
            anonymous_bytes: 0,
            mapped_bytes: 0,
            pinned_bytes: 0,
        }
    }
}
