//! Another source's tensors shown in another key layout: renamed (diffusers names as LDM
//! names, [`Assembled::renamed`]), or assembled from row ranges of its tensors — how a
//! layout that splits a matrix (diffusers' q, k, v) is shown to an architecture that reads
//! it fused (BFL's `qkv`), and halves are swapped (diffusers' `norm_out` scale/shift).
//! Rows are whole (a quantized row is whole blocks), so any stored type concatenates as
//! bytes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::{Format, IoError, Location, TensorBytes, TensorInfo, TensorSource};

/// One part of an assembled tensor: `rows` rows of `source` from `first`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rows {
    pub source: String,
    pub first: usize,
    pub rows: usize,
}

impl Rows {
    /// All of `source`'s rows (its first dimension).
    pub fn all(source: &TensorInfo) -> Self {
        Rows { source: source.name.clone(), first: 0, rows: source.shape.first().copied().unwrap_or(1) }
    }
}

pub struct Assembled {
    inner: Box<dyn TensorSource>,
    tensors: Vec<TensorInfo>,
    /// New name → (index in `tensors`, its parts).
    index: HashMap<String, (usize, Vec<Rows>)>,
}

impl Assembled {
    /// `plan` names each new tensor and its parts, in order; they must share a type and
    /// every dimension past the first. Fails with a description of the first bad entry.
    pub fn new(inner: Box<dyn TensorSource>, plan: Vec<(String, Vec<Rows>)>) -> Result<Self, String> {
        let mut tensors = Vec::with_capacity(plan.len());
        let mut index = HashMap::with_capacity(plan.len());
        for (name, parts) in plan {
            let mut info: Option<TensorInfo> = None;
            let mut bytes = 0;
            for p in &parts {
                let src = inner.get(&p.source).ok_or_else(|| format!("{name}: no tensor `{}`", p.source))?;
                let rows = src.shape.first().copied().unwrap_or(1);
                if p.rows == 0 || p.first + p.rows > rows {
                    return Err(format!("{name}: rows {}..{} of `{}`, which has {rows}", p.first, p.first + p.rows, p.source));
                }
                bytes += src.byte_len() / rows.max(1) * p.rows;
                match &mut info {
                    None => {
                        let mut shape = src.shape.clone();
                        if shape.is_empty() {
                            shape.push(1);
                        }
                        shape[0] = p.rows;
                        info = Some(TensorInfo { name: name.clone(), dtype: src.dtype, shape, loc: Location::Range { blob: usize::MAX, start: 0, len: 0 } });
                    }
                    Some(i) => {
                        if i.dtype != src.dtype || i.shape[1..] != src.shape[1.min(src.shape.len())..] {
                            return Err(format!("{name}: `{}` ({:?} {:?}) does not stack under {:?} {:?}", p.source, src.dtype, src.shape, i.dtype, i.shape));
                        }
                        i.shape[0] += p.rows;
                    }
                }
            }
            let mut info = info.ok_or_else(|| format!("{name}: no parts"))?;
            info.loc = Location::Range { blob: usize::MAX, start: 0, len: bytes };
            if index.insert(name.clone(), (tensors.len(), parts)).is_some() {
                return Err(format!("{name}: planned twice"));
            }
            tensors.push(info);
        }
        Ok(Assembled { inner, tensors, index })
    }

    /// The tensors of `inner` that `rename` keeps, under their new names and shapes (a new
    /// shape must hold the same elements: a linear weight shown as a 1×1 convolution).
    /// Fails with the new name when two tensors would share it.
    pub fn renamed(inner: Box<dyn TensorSource>, mut rename: impl FnMut(&TensorInfo) -> Option<TensorInfo>) -> Result<Self, String> {
        let mut plan = Vec::new();
        let mut shapes = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for t in inner.tensors() {
            let Some(info) = rename(t) else { continue };
            debug_assert_eq!(info.n_elements(), t.n_elements(), "a rename keeps the elements");
            if !seen.insert(info.name.clone()) {
                return Err(info.name);
            }
            plan.push((info.name, vec![Rows::all(t)]));
            shapes.push(info.shape);
        }
        let mut out = Assembled::new(inner, plan)?;
        for (t, shape) in out.tensors.iter_mut().zip(shapes) {
            t.shape = shape;
        }
        Ok(out)
    }
}

impl Assembled {
    /// Show tensor `name` in `shape` (the same elements, e.g. a 4-D kernel as the matrix
    /// it multiplies by).
    pub fn reshape(&mut self, name: &str, shape: Vec<usize>) -> Result<(), String> {
        let &(i, _) = self.index.get(name).ok_or_else(|| format!("no tensor `{name}`"))?;
        let t = &mut self.tensors[i];
        if shape.iter().product::<usize>() != t.n_elements() {
            return Err(format!("{name}: {:?} does not hold the elements of {:?}", shape, t.shape));
        }
        t.shape = shape;
        Ok(())
    }
}

impl TensorSource for Assembled {
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
        let (_, parts) = self.index.get(name).ok_or_else(|| IoError::NotFound { path: self.inner.path().to_path_buf(), tensor: name.to_string() })?;
        if let [p] = parts.as_slice() {
            let src = self.inner.get(&p.source).expect("checked when planned");
            if p.first == 0 && p.rows == src.shape.first().copied().unwrap_or(1) {
                return self.inner.read(&p.source);
            }
        }
        let mut out = Vec::with_capacity(self.tensors[self.index[name].0].byte_len());
        for p in parts {
            let bytes = self.inner.read(&p.source)?;
            let rows = self.inner.get(&p.source).and_then(|s| s.shape.first().copied()).unwrap_or(1).max(1);
            let row = bytes.len() / rows;
            out.extend_from_slice(&bytes[p.first * row..(p.first + p.rows) * row]);
        }
        Ok(TensorBytes::Owned(out))
    }
    fn release(&self, name: &str) {
        if let Some((_, parts)) = self.index.get(name) {
            for p in parts {
                self.inner.release(&p.source);
            }
        }
    }
    fn metadata(&self) -> &BTreeMap<String, String> {
        self.inner.metadata()
    }
}
