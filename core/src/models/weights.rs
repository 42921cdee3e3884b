//! A model's weights as ggml tensors in one backend buffer.
//!
//! Architectures never index a file directly: they receive a [`Weights`] and ask for
//! each tensor with the shape their config implies ([`Weights::expect`]). A file whose
//! tensors disagree with the architecture fails there, with the tensor's name, before
//! any graph is built — which is what makes the unchecked-by-ggml graph code safe.

use super::ModelError;
use crate::ggml::{Backend, Buffer, Context, GType, Tensor};
use std::collections::HashMap;
use std::ptr::NonNull;

/// One weight to create: its name, ggml type and dimensions in ggml order.
#[derive(Clone, Debug)]
pub struct WeightSpec {
    pub name: String,
    pub ty: GType,
    pub ne: Vec<i64>,
}

pub struct Weights {
    // Field order matters for drop: tensors point into `ctx`, data into `buffer`.
    map: HashMap<String, NonNull<ggml_sys::ggml_tensor>>,
    buffer: Option<Buffer>,
    ctx: Context,
    /// For an overlay ([`Weights::overlay`]): the weights it shares its other tensors
    /// with, pinned so they stay resident while the overlay is. Dropped last.
    base: Option<crate::residency::PinGuard<Weights>>,
}

// SAFETY: the tensor pointers refer to `ctx`, which moves with the struct, or (overlays) to
// the context of `base`, which the struct keeps alive; once loaded
// the weights are only read (graph building takes shared references).
unsafe impl Send for Weights {}
unsafe impl Sync for Weights {}

impl Weights {
    /// Create every tensor in `specs` on `backend` and fill it with the bytes `fill`
    /// returns (exactly the tensor's byte length, in its type).
    pub fn new<F>(backend: &Backend, specs: &[WeightSpec], mut fill: F) -> Result<Self, ModelError>
    where
        F: FnMut(&WeightSpec) -> Result<Vec<u8>, ModelError>,
    {
        let ctx = Context::new(specs.len().max(1), 1)?;
        let mut map = HashMap::with_capacity(specs.len());
        let mut order = Vec::with_capacity(specs.len());
        for s in specs {
            let t = ctx.new_tensor(s.ty, &s.ne).map_err(|e| ModelError::Weight { name: s.name.clone(), detail: e.to_string() })?;
            t.set_name(&s.name);
            if map.insert(s.name.clone(), NonNull::new(t.raw()).expect("ggml tensor")).is_some() {
                return Err(ModelError::Weight { name: s.name.clone(), detail: "listed twice".into() });
            }
            order.push(t.raw());
        }
        let buffer = if specs.is_empty() { None } else { Some(backend.alloc_tensors(&ctx, "model weights")?) };
        if let Some(b) = &buffer {
            b.mark_weights();
        }
        let w = Weights { map, buffer, ctx, base: None };
        for s in specs {
            let bytes = fill(s)?;
            let t = w.get(&s.name)?;
            t.set_bytes(&bytes).map_err(|e| ModelError::Weight { name: s.name.clone(), detail: e.to_string() })?;
        }
        Ok(w)
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Result<Tensor<'_>, ModelError> {
        let _ = &self.ctx;
        self.map
            .get(name)
            .map(|p| {
                // SAFETY: p points into self.ctx, which lives as long as &self.
                unsafe { Tensor::from_raw(*p) }
            })
            .ok_or_else(|| ModelError::MissingWeight(name.to_string()))
    }

    /// The tensor called `name`, which must have dimensions `ne` (ggml order; trailing
    /// 1s may be omitted).
    pub fn expect(&self, name: &str, ne: &[i64]) -> Result<Tensor<'_>, ModelError> {
        let t = self.get(name)?;
        let mut want = [1i64; 4];
        want[..ne.len()].copy_from_slice(ne);
        if t.ne() != want {
            return Err(ModelError::Shape { name: name.to_string(), expected: want.to_vec(), got: t.ne().to_vec() });
        }
        Ok(t)
    }

    /// `base` with the tensors in `replaced` (name, bytes in that tensor's type) swapped
    /// for new ones of the same type and shape; every other tensor is `base`'s own, shared.
    /// The overlay owns (and [`Weights::bytes`] counts) only the replaced tensors, and keeps
    /// `base` pinned while it lives: a LoRA-merged view of a checkpoint.
    pub fn overlay(backend: &Backend, base: crate::residency::PinGuard<Weights>, replaced: Vec<(String, Vec<u8>)>) -> Result<Self, ModelError> {
        let mut specs = Vec::with_capacity(replaced.len());
        for (name, _) in &replaced {
            let t = base.get(name)?;
            specs.push(WeightSpec { name: name.clone(), ty: t.dtype(), ne: t.ne().to_vec() });
        }
        let bytes: HashMap<&str, &Vec<u8>> = replaced.iter().map(|(n, b)| (n.as_str(), b)).collect();
        let mut own = Weights::new(backend, &specs, |s| Ok(bytes.get(s.name.as_str()).map(|b| b.to_vec()).unwrap_or_default()))?;
        for (name, p) in &base.map {
            own.map.entry(name.clone()).or_insert(*p);
        }
        own.base = Some(base);
        Ok(own)
    }

    /// Whether this is an overlay and `name` is one of its own (replaced) tensors.
    pub fn owns(&self, name: &str) -> bool {
        self.base.is_some() && self.get(name).is_ok_and(|t| !self.base.as_ref().is_some_and(|b| b.get(name).is_ok_and(|bt| bt.raw() == t.raw())))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|s| s.as_str())
    }

    /// Bytes of weight data held on the backend.
    pub fn bytes(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.size())
    }
}

impl crate::residency::Resident for Weights {
    fn footprint(&self) -> crate::residency::Footprint {
        // Copied into a ggml backend buffer: anonymous memory, freed on eviction.
        crate::residency::Footprint { anonymous: self.bytes() as u64, mapped: 0 }
    }
}
