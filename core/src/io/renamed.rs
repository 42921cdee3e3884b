//! Another source's tensors under other names: how checkpoints in one key layout are
//! shown to architectures that read another (diffusers names as LDM names).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::{Format, IoError, TensorBytes, TensorInfo, TensorSource};

/// The tensors of `inner` that a rename keeps, under their new names and shapes (a new
/// shape must hold the same elements: a linear weight shown as a 1×1 convolution).
pub struct Renamed {
    inner: Box<dyn TensorSource>,
    tensors: Vec<TensorInfo>,
    /// New name → (index in `tensors`, the inner source's name).
    index: HashMap<String, (usize, String)>,
}

impl Renamed {
    /// `rename` gives each tensor of `inner` its new description, or `None` to leave it
    /// out. Fails with the new name when two tensors would share it.
    pub fn new(inner: Box<dyn TensorSource>, mut rename: impl FnMut(&TensorInfo) -> Option<TensorInfo>) -> Result<Self, String> {
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        for t in inner.tensors() {
            let Some(info) = rename(t) else { continue };
            debug_assert_eq!(info.n_elements(), t.n_elements(), "a rename keeps the elements");
            if index.insert(info.name.clone(), (tensors.len(), t.name.clone())).is_some() {
                return Err(info.name);
            }
            tensors.push(info);
        }
        Ok(Renamed { inner, tensors, index })
    }
}

impl TensorSource for Renamed {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn format(&self) -> Format {
        self.inner.format()
    }
    fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|(i, _)| &self.tensors[*i])
    }
    fn read(&self, name: &str) -> Result<TensorBytes<'_>, IoError> {
        let (_, orig) = self.index.get(name).ok_or_else(|| IoError::NotFound { path: self.inner.path().to_path_buf(), tensor: name.to_string() })?;
        self.inner.read(orig)
    }
    fn release(&self, name: &str) {
        if let Some((_, orig)) = self.index.get(name) {
            self.inner.release(orig);
        }
    }
    fn metadata(&self) -> &BTreeMap<String, String> {
        self.inner.metadata()
    }
}
