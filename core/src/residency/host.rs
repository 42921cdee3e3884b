//! [`HostWeights`]: the tensors under one key prefix, held in host memory.
//!
//! With mmap sources, tensors kept in their stored dtype stay borrowed from the mapping
//! (zero copy; the kernel may drop and re-read those pages) and are accounted as *mapped*
//! bytes. Converted tensors, decompressed zip entries and everything read without mmap are
//! *anonymous* bytes. Without mmap, a source whose every tensor is selected keeps its file
//! buffer and lends from it (no second copy); otherwise the selected tensors are copied out
//! and the buffer dropped, so a prefix selecting part of a checkpoint (the UNet of a
//! single-file model) does not keep the whole file in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{BoxError, Device, Footprint, Load, ResidencyError, ResidencyManager, Resident, WeightHandle, WeightKey};
use crate::io::{self, IoError, OpenOptions, TensorBytes, TensorInfo, TensorSource, TypeRules, WeightType};

/// Failures assembling host weights.
#[derive(Debug, thiserror::Error)]
pub enum HostWeightsError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("tensor '{tensor}' is in both {} and {}", first.display(), second.display())]
    Duplicate { tensor: String, first: PathBuf, second: PathBuf },
    #[error("no tensor named '{prefix}*' in {}", list_paths(sources))]
    Empty { prefix: String, sources: Vec<PathBuf> },
    #[error("no tensor '{prefix}{name}' in these weights")]
    NotFound { prefix: String, name: String },
    #[error("{}: tensor '{tensor}' was borrowed at load time but the source no longer lends its bytes", path.display())]
    NotBorrowed { path: PathBuf, tensor: String },
}

fn list_paths(p: &[PathBuf]) -> String {
    p.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

enum Storage {
    /// Borrowed from `sources[source]` (its mmap, or its in-memory file buffer); re-borrowed
    /// on access.
    Borrowed { source: usize },
    Owned(Vec<u8>),
}

struct Entry {
    /// Full name in the file, dtype after conversion.
    info: TensorInfo,
    storage: Storage,
}

/// One tensor of [`HostWeights`].
#[derive(Debug, Clone, Copy)]
pub struct HostTensor<'a> {
    /// The tensor as stored here: full file name, dtype after any conversion, PyTorch shape.
    pub info: &'a TensorInfo,
    /// Name relative to the weights' prefix (what model code looks up).
    pub name: &'a str,
    pub bytes: &'a [u8],
    /// True when `bytes` are borrowed from a file mapping (file-backed, reclaimable memory).
    pub mapped: bool,
}

/// The tensors of some source files under a key prefix, optionally converted to a dtype.
pub struct HostWeights {
    prefix: String,
    /// Sources still lending bytes; `None` where nothing borrows from one.
    sources: Vec<Option<Box<dyn TensorSource>>>,
    /// Whether the lending sources are memory-mapped.
    mapped: bool,
    /// In file order, sources in the order given.
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    footprint: Footprint,
}

impl std::fmt::Debug for HostWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWeights")
            .field("prefix", &self.prefix)
            .field("tensors", &self.entries.len())
            .field("footprint", &self.footprint)
            .finish()
    }
}

impl HostWeights {
    /// Reads every tensor whose name starts with `prefix` from `sources`, converting float
    /// tensors to `dtype` where sd.cpp's type rules would (biases, embeddings and
    /// non-float tensors keep their type).
    pub fn load(
        sources: &[PathBuf],
        prefix: &str,
        dtype: WeightType,
        options: &OpenOptions,
    ) -> Result<HostWeights, HostWeightsError> {
        let rules = TypeRules::new(dtype, "")?;
        let mut kept: Vec<Option<Box<dyn TensorSource>>> = Vec::with_capacity(sources.len());
        let mut entries = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut origin: Vec<usize> = Vec::new();
        let mut footprint = Footprint::default();
        for (si, path) in sources.iter().enumerate() {
            let src = io::open_with(path, options)?;
            let mut lends = false;
            let names: Vec<String> =
                src.tensors().iter().filter(|t| t.name.starts_with(prefix)).map(|t| t.name.clone()).collect();
            // A mapping costs nothing for unselected tensors; an in-memory buffer is worth
            // keeping only when all of it is used.
            let may_lend = options.mmap || names.len() == src.tensors().len();
            for full in names {
                let rel = full[prefix.len()..].to_string();
                if let Some(&prev) = by_name.get(&rel) {
                    return Err(HostWeightsError::Duplicate {
                        tensor: full,
                        first: sources[origin[prev]].clone(),
                        second: path.clone(),
                    });
                }
                let stored = src.get(&full).expect("name taken from the source's own list");
                let (dt, bytes) = io::read_as(src.as_ref(), &full, &rules)?;
                let info = TensorInfo::detached(full.clone(), dt, stored.shape.clone());
                let storage = match bytes {
                    TensorBytes::Borrowed(b) if may_lend => {
                        if options.mmap {
                            footprint.mapped += b.len() as u64;
                        } else {
                            footprint.anonymous += b.len() as u64;
                        }
                        lends = true;
                        Storage::Borrowed { source: si }
                    }
                    other => {
                        let v = other.into_owned();
                        footprint.anonymous += v.len() as u64;
                        Storage::Owned(v)
                    }
                };
                by_name.insert(rel, entries.len());
                origin.push(si);
                entries.push(Entry { info, storage });
            }
            kept.push(lends.then_some(src));
        }
        if entries.is_empty() {
            return Err(HostWeightsError::Empty { prefix: prefix.to_string(), sources: sources.to_vec() });
        }
        Ok(HostWeights { prefix: prefix.to_string(), sources: kept, mapped: options.mmap, entries, by_name, footprint })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a tensor (name relative to the prefix) is present.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Tensor names relative to the prefix, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(move |e| &e.info.name[self.prefix.len()..])
    }

    /// The tensor `name` (relative to the prefix).
    pub fn get(&self, name: &str) -> Result<HostTensor<'_>, HostWeightsError> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| HostWeightsError::NotFound { prefix: self.prefix.clone(), name: name.to_string() })?;
        self.at(i)
    }

    /// Every tensor, in file order.
    pub fn iter(&self) -> impl Iterator<Item = Result<HostTensor<'_>, HostWeightsError>> {
        (0..self.entries.len()).map(move |i| self.at(i))
    }

    fn at(&self, i: usize) -> Result<HostTensor<'_>, HostWeightsError> {
        let e = &self.entries[i];
        let name = &e.info.name[self.prefix.len()..];
        match &e.storage {
            Storage::Owned(v) => Ok(HostTensor { info: &e.info, name, bytes: v, mapped: false }),
            Storage::Borrowed { source } => {
                let src = self.sources[*source].as_ref().expect("a lending source is kept");
                match src.read(&e.info.name)? {
                    TensorBytes::Borrowed(bytes) => {
                        Ok(HostTensor { info: &e.info, name, bytes, mapped: self.mapped })
                    }
                    TensorBytes::Owned(_) => Err(HostWeightsError::NotBorrowed {
                        path: src.path().to_path_buf(),
                        tensor: e.info.name.clone(),
                    }),
                }
            }
        }
    }
}

impl Resident for HostWeights {
    fn footprint(&self) -> Footprint {
        self.footprint
    }
}

/// Loads [`HostWeights`] for the residency manager.
#[derive(Debug, Clone)]
pub struct HostWeightsLoader {
    pub sources: Vec<PathBuf>,
    pub prefix: String,
    pub dtype: WeightType,
    pub options: OpenOptions,
}

impl Load for HostWeightsLoader {
    type Output = HostWeights;

    /// Sums the selected tensors' sizes from the file headers (opened mapped, so only the
    /// header pages are read), after the same dtype rules the load applies.
    fn estimate(&self) -> Option<u64> {
        let rules = TypeRules::new(self.dtype, "").ok()?;
        let mut total = 0u64;
        for path in &self.sources {
            let src = io::open_with(path, &OpenOptions { mmap: true }).ok()?;
            for t in src.tensors().iter().filter(|t| t.name.starts_with(&self.prefix)) {
                let target = rules.target(t);
                let len = if target == t.dtype { Some(t.byte_len()) } else { target.byte_len(t.n_elements()) };
                total += len? as u64;
            }
        }
        Some(total)
    }

    fn load(&self) -> Result<HostWeights, BoxError> {
        Ok(HostWeights::load(&self.sources, &self.prefix, self.dtype, &self.options)?)
    }
}

impl ResidencyManager {
    /// Requests the host weights of `sources` under `prefix` (see [`HostWeights::load`]).
    /// Lazy like every request: nothing is read until the first pin. `options` only matter
    /// for the request that creates the entry; later identical requests share it.
    pub fn request_host_weights(
        &self,
        sources: &[impl AsRef<Path>],
        prefix: &str,
        dtype: impl Into<WeightType>,
        options: OpenOptions,
    ) -> Result<WeightHandle<HostWeights>, ResidencyError> {
        let dtype = dtype.into();
        let key = WeightKey::new(sources.iter().map(|p| p.as_ref()), prefix, dtype, Device::Cpu)?;
        let loader = HostWeightsLoader { sources: key.sources.clone(), prefix: prefix.to_string(), dtype, options };
        self.get_or_load(key, loader)
    }
}
