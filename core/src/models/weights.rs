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
}

// SAFETY: the tensor pointers refer to `ctx`, which moves with the struct; once loaded
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
        let w = Weights { map, buffer, ctx };
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
