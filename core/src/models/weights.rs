//! A model's weights as ggml tensors in one backend buffer.
//!
//! Architectures never index a file directly: they receive a [`Weights`] and ask for
//! each tensor with the shape their config implies ([`Weights::expect`]). A file whose
//! tensors disagree with the architecture fails there, with the tensor's name, before
//! any graph is built — which is what makes the unchecked-by-ggml graph code safe.

use super::ModelError;
use crate::ggml::{AllocTarget, Buffer, BufferType, Context, GType, Tensor};
use std::collections::HashMap;
use std::ptr::NonNull;

/// One weight to create: its name, ggml type and dimensions in ggml order.
#[derive(Clone, Debug)]
pub struct WeightSpec {
    pub name: String,
    pub ty: GType,
    pub ne: Vec<i64>,
}

/// One factor of a runtime adapter: f32 values for a tensor of dimensions `ne` (ggml order).
#[derive(Clone, Debug)]
pub struct Factor {
    pub ne: Vec<i64>,
    pub data: Vec<f32>,
}

/// A low-rank branch to add to the product of the weight `target` when a graph is built
/// (LoRA applied at runtime): `scale · up(mid(down(x)))`, the factors laid out for how
/// the layer uses the weight — matrices [in, rank] / [rank, out] for a linear layer,
/// kernels [kw, kh, in, rank] (or 1×1 with a `mid` kernel, LoCon's Tucker form) /
/// [1, 1, rank, out] for a convolution.
#[derive(Clone, Debug)]
pub struct AdapterSpec {
    pub target: String,
    pub down: Factor,
    pub mid: Option<Factor>,
    pub up: Factor,
    pub scale: f32,
    /// `(first, count)` of the output rows (PyTorch dim 0) the branch adds to: one block
    /// of a fused q/k/v projection; `None`: all of them.
    pub rows: Option<(usize, usize)>,
}

/// A runtime adapter of a [`Weights`], its factors as graph-ready tensors.
#[derive(Clone, Copy)]
pub struct Adapter<'a> {
    pub down: Tensor<'a>,
    pub mid: Option<Tensor<'a>>,
    pub up: Tensor<'a>,
    pub scale: f32,
    pub rows: Option<(usize, usize)>,
}

#[derive(Clone, Copy)]
struct AdapterPtrs {
    down: NonNull<ggml_sys::ggml_tensor>,
    mid: Option<NonNull<ggml_sys::ggml_tensor>>,
    up: NonNull<ggml_sys::ggml_tensor>,
    scale: f32,
    rows: Option<(usize, usize)>,
}

pub struct Weights {
    // Field order matters for drop: tensors point into `ctx`, data into `buffer`.
    map: HashMap<String, NonNull<ggml_sys::ggml_tensor>>,
    /// Runtime adapters by target weight name: this overlay's own (in `ctx`) after the
    /// ones inherited from `base` (in its context, kept alive by the pin).
    adapters: HashMap<String, Vec<AdapterPtrs>>,
    buffer: Option<Buffer>,
    /// The memory the tensors were placed in (an overlay's own tensors go there too).
    home: BufferType,
    ctx: Context,
    /// Names of the empty tensors the file carries as flags (ComfyUI's
    /// `__index_timestep_zero__`, `scaled_fp8`): no weight, but they say how to run it.
    markers: std::collections::HashSet<String>,
    /// For an overlay ([`Weights::overlay`]): the weights it shares its other tensors
    /// with, pinned so they stay resident while the overlay is. Dropped last.
    base: Option<crate::residency::PinGuard<Weights>>,
}

// SAFETY: the tensor pointers (weights and adapter factors) refer to `ctx`, which moves
// with the struct, or (overlays) to the context of `base`, which the struct keeps alive; once loaded
// the weights are only read (graph building takes shared references).
unsafe impl Send for Weights {}
unsafe impl Sync for Weights {}

impl Weights {
    /// Create every tensor in `specs` in `target`'s memory (a backend's device, or a
    /// buffer type) and fill it with the bytes `fill` returns (exactly the tensor's byte
    /// length, in its type).
    pub fn new<F>(target: &(impl AllocTarget + ?Sized), specs: &[WeightSpec], mut fill: F) -> Result<Self, ModelError>
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
        let home = target.buffer_type();
        let buffer = if specs.is_empty() { None } else { Some(home.alloc_tensors(&ctx, "model weights")?) };
        if let Some(b) = &buffer {
            b.mark_weights();
        }
        let w = Weights { map, adapters: HashMap::new(), buffer, home, ctx, markers: Default::default(), base: None };
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

    /// An `nn.Conv2d` with bias at `{name}.weight` / `{name}.bias`: a `k`×`k` kernel from
    /// `cin` to `cout` channels.
    pub fn expect_conv(&self, name: &str, k: i64, cin: i64, cout: i64) -> Result<(), ModelError> {
        self.expect(&format!("{name}.weight"), &[k, k, cin, cout])?;
        self.expect(&format!("{name}.bias"), &[cout])?;
        Ok(())
    }

    /// `base` with the tensors in `replaced` (name, bytes in that tensor's type) swapped
    /// for new ones of the same type and shape; every other tensor is `base`'s own, shared.
    /// The overlay owns (and [`Weights::bytes`] counts) only the replaced tensors, and keeps
    /// `base` pinned while it lives: a LoRA-merged view of a checkpoint.
    pub fn overlay(base: crate::residency::PinGuard<Weights>, replaced: Vec<(String, Vec<u8>)>) -> Result<Self, ModelError> {
        Self::patched(base, replaced, Vec::new())
    }

    /// [`Weights::overlay`] that also carries runtime `adapters`: their factors live in the
    /// overlay's own buffer, the weights they target stay `base`'s, and `base`'s own
    /// adapters are kept (a chain of LoRAs at runtime adds every branch). The overlay's
    /// own tensors live where `base`'s do: one graph reads both.
    pub fn patched(base: crate::residency::PinGuard<Weights>, replaced: Vec<(String, Vec<u8>)>, adapters: Vec<AdapterSpec>) -> Result<Self, ModelError> {
        let mut specs = Vec::with_capacity(replaced.len() + 3 * adapters.len());
        for (name, _) in &replaced {
            let t = base.get(name)?;
            specs.push(WeightSpec { name: name.clone(), ty: t.dtype(), ne: t.ne().to_vec() });
        }
        let mut bytes: HashMap<String, Vec<u8>> = replaced.into_iter().collect();
        // Factors get names no weight has (`#` never occurs in checkpoint keys); they
        // leave the name map once created, so `names()` and `get` see only weights.
        let factor_name = |i: usize, part: &str| format!("#adapter{i}.{part}");
        for (i, a) in adapters.iter().enumerate() {
            base.get(&a.target)?;
            for (part, f) in [("down", Some(&a.down)), ("mid", a.mid.as_ref()), ("up", Some(&a.up))] {
                let Some(f) = f else { continue };
                let name = factor_name(i, part);
                if f.ne.iter().product::<i64>() != f.data.len() as i64 {
                    return Err(ModelError::Weight { name: format!("{} LoRA {part}", a.target), detail: format!("{:?} given {} values", f.ne, f.data.len()) });
                }
                bytes.insert(name.clone(), f.data.iter().flat_map(|x| x.to_le_bytes()).collect());
                specs.push(WeightSpec { name, ty: GType::F32, ne: f.ne.clone() });
            }
        }
        let mut own = Weights::new(&base.home, &specs, |s| Ok(bytes.remove(&s.name).unwrap_or_default()))?;
        own.adapters = base.adapters.clone();
        own.markers = base.markers.clone();
        for (i, a) in adapters.into_iter().enumerate() {
            let mut take = |part: &str| own.map.remove(&factor_name(i, part)).ok_or_else(|| ModelError::MissingWeight(factor_name(i, part)));
            let ptrs = AdapterPtrs { down: take("down")?, mid: if a.mid.is_some() { Some(take("mid")?) } else { None }, up: take("up")?, scale: a.scale, rows: a.rows };
            own.adapters.entry(a.target).or_default().push(ptrs);
        }
        for (name, p) in &base.map {
            own.map.entry(name.clone()).or_insert(*p);
        }
        own.base = Some(base);
        Ok(own)
    }

    /// The runtime adapters on the weight called `name`, in the order they were added.
    pub fn adapters(&self, name: &str) -> Vec<Adapter<'_>> {
        // SAFETY (all three): the pointers refer to `self.ctx` or to the pinned base's
        // context, both alive as long as &self.
        let t = |p: NonNull<ggml_sys::ggml_tensor>| unsafe { Tensor::from_raw(p) };
        self.adapters.get(name).map_or_else(Vec::new, |v| v.iter().map(|a| Adapter { down: t(a.down), mid: a.mid.map(t), up: t(a.up), scale: a.scale, rows: a.rows }).collect())
    }

    /// How many runtime adapters these weights carry, over all targets.
    pub fn adapter_count(&self) -> usize {
        self.adapters.values().map(Vec::len).sum()
    }

    /// Whether any weight is stored in a quantized type (what sd.cpp's `auto` LoRA mode asks).
    pub fn is_quantized(&self) -> bool {
        self.map.values().any(|p| {
            // SAFETY: as in `get`.
            unsafe { Tensor::from_raw(*p) }.dtype().is_quantized()
        })
    }

    /// Whether this is an overlay and `name` is one of its own (replaced) tensors.
    pub fn owns(&self, name: &str) -> bool {
        self.base.is_some() && self.get(name).is_ok_and(|t| !self.base.as_ref().is_some_and(|b| b.get(name).is_ok_and(|bt| bt.raw() == t.raw())))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Whether the file carried the empty flag tensor `name` (see `markers`).
    pub fn has_marker(&self, name: &str) -> bool {
        self.markers.contains(name)
    }

    /// Record the file's empty flag tensors (the loader's).
    pub(crate) fn set_markers(&mut self, markers: std::collections::HashSet<String>) {
        self.markers = markers;
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|s| s.as_str())
    }

    /// Bytes of weight data held on the backend.
    pub fn bytes(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.size())
    }

    /// The memory the weights live in.
    pub fn home(&self) -> BufferType {
        self.home
    }

    /// Every tensor (an overlay's shared ones included) and runtime adapter copied into
    /// `target`'s memory: the weights a graph on another device reads (offloading).
    pub fn copy_to(&self, target: &(impl AllocTarget + ?Sized)) -> Result<Weights, ModelError> {
        let mut specs: Vec<WeightSpec> = Vec::with_capacity(self.map.len());
        let mut sources: HashMap<String, NonNull<ggml_sys::ggml_tensor>> = HashMap::with_capacity(self.map.len());
        for (name, &p) in &self.map {
            // SAFETY: as in `get`.
            let t = unsafe { Tensor::from_raw(p) };
            specs.push(WeightSpec { name: name.clone(), ty: t.dtype(), ne: t.ne().to_vec() });
            sources.insert(name.clone(), p);
        }
        let mut factors = Vec::new();
        for (target_name, list) in &self.adapters {
            for (j, a) in list.iter().enumerate() {
                for (part, p) in [("down", Some(a.down)), ("mid", a.mid), ("up", Some(a.up))] {
                    let Some(p) = p else { continue };
                    let name = format!("#copy{}.{j}.{part}#{target_name}", factors.len());
                    // SAFETY: as in `adapters`.
                    let t = unsafe { Tensor::from_raw(p) };
                    specs.push(WeightSpec { name: name.clone(), ty: t.dtype(), ne: t.ne().to_vec() });
                    sources.insert(name.clone(), p);
                    factors.push((target_name.clone(), j, part, name));
                }
            }
        }
        // Sorted: the same weights give the same buffer layout on every copy.
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = Weights::new(target, &specs, |s| {
            // SAFETY: the source tensors live in self (or its pinned base) for this call.
            let t = unsafe { Tensor::from_raw(sources[&s.name]) };
            t.get_bytes().map_err(|e| ModelError::Weight { name: s.name.clone(), detail: e.to_string() })
        })?;
        for (target_name, list) in &self.adapters {
            let mut copied = Vec::with_capacity(list.len());
            for (j, a) in list.iter().enumerate() {
                let mut take = |part: &str| {
                    let name = &factors.iter().find(|f| &f.0 == target_name && f.1 == j && f.2 == part).expect("every factor was listed").3;
                    out.map.remove(name).ok_or_else(|| ModelError::MissingWeight(name.clone()))
                };
                let down = take("down")?;
                let mid = if a.mid.is_some() { Some(take("mid")?) } else { None };
                copied.push(AdapterPtrs { down, mid, up: take("up")?, scale: a.scale, rows: a.rows });
            }
            out.adapters.insert(target_name.clone(), copied);
        }
        out.markers = self.markers.clone();
        Ok(out)
    }
}

/// A resident model that can be copied into another device's memory: what the runtime
/// copies to the computing device for each use when the weights are kept elsewhere.
pub trait Placeable: crate::residency::Resident + Sized {
    fn copy_to(&self, target: &BufferType) -> Result<Self, ModelError>;
}

impl Placeable for Weights {
    fn copy_to(&self, target: &BufferType) -> Result<Self, ModelError> {
        Weights::copy_to(self, target)
    }
}

impl crate::residency::Resident for Weights {
    fn footprint(&self) -> crate::residency::Footprint {
        // Copied into a ggml backend buffer: anonymous memory, freed on eviction.
        crate::residency::Footprint { anonymous: self.bytes() as u64, mapped: 0 }
    }
}
