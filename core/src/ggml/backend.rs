//! Backends (CPU, and GPUs when ggml was built with CUDA or Vulkan), buffers and the
//! graph allocator.
//!
//! GPU backends are found through ggml's device registry rather than backend-specific
//! init functions, so the same code serves CUDA and Vulkan builds: with the `cuda` or
//! `vulkan` feature, ggml registers those devices statically.

use super::{init, Context, GgmlError, Graph, Result};
use std::ffi::CStr;
use std::ptr::NonNull;

/// Which kind of device a backend computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Cpu,
    /// The n-th GPU device ggml knows about (CUDA or Vulkan, whichever was built).
    Gpu(usize),
}

/// A compute backend.
pub struct Backend {
    ptr: NonNull<ggml_sys::ggml_backend>,
    kind: BackendKind,
    name: String,
}

// SAFETY: ggml backends may be used from any thread, one at a time; Backend is not Sync,
// so `&mut`/ownership rules keep it to one thread at a time.
unsafe impl Send for Backend {}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated static or object-owned strings.
    unsafe { CStr::from_ptr(p).to_string_lossy().into_owned() }
}

impl Backend {
    /// The CPU backend with `threads` worker threads.
    pub fn cpu(threads: usize) -> Result<Self> {
        init();
        // SAFETY: plain constructor; null means failure.
        let ptr = NonNull::new(unsafe { ggml_sys::ggml_backend_cpu_init() })
            .ok_or_else(|| GgmlError::Backend("cannot initialise the CPU backend".into()))?;
        let b = Backend { ptr, kind: BackendKind::Cpu, name: "CPU".into() };
        b.set_threads(threads);
        Ok(b)
    }

    /// Names of the GPU devices this build of ggml can use (empty in a CPU-only build).
    pub fn gpu_devices() -> Vec<String> {
        init();
        gpu_devs().into_iter().map(|d| cstr(unsafe { ggml_sys::ggml_backend_dev_description(d) })).collect()
    }

    /// The `index`-th GPU device.
    pub fn gpu(index: usize) -> Result<Self> {
        init();
        let devs = gpu_devs();
        let dev = *devs.get(index).ok_or_else(|| {
            GgmlError::Backend(format!(
                "no GPU device {index}: this build has {} (build with --features cuda or vulkan)",
                devs.len()
            ))
        })?;
        // SAFETY: dev comes from ggml's registry.
        let ptr = NonNull::new(unsafe { ggml_sys::ggml_backend_dev_init(dev, std::ptr::null()) })
            .ok_or_else(|| GgmlError::Backend(format!("cannot initialise GPU device {index}")))?;
        let name = cstr(unsafe { ggml_sys::ggml_backend_name(ptr.as_ptr()) });
        // Graphs for this device must not hold the CPU-only product op.
        super::matmul::disable();
        Ok(Backend { ptr, kind: BackendKind::Gpu(index), name })
    }

    pub fn new(kind: BackendKind, threads: usize) -> Result<Self> {
        match kind {
            BackendKind::Cpu => Backend::cpu(threads),
            BackendKind::Gpu(i) => Backend::gpu(i),
        }
    }

    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn raw(&self) -> ggml_sys::ggml_backend_t {
        self.ptr.as_ptr()
    }

    /// Worker threads for CPU compute (ignored by GPU backends).
    pub fn set_threads(&self, threads: usize) {
        if self.kind == BackendKind::Cpu {
            // SAFETY: the backend is a CPU backend.
            unsafe { ggml_sys::ggml_backend_cpu_set_n_threads(self.raw(), threads.max(1) as i32) };
        }
    }

    /// Allocate one buffer holding every tensor of `ctx` (typically a model's weights).
    pub fn alloc_tensors(&self, ctx: &Context, what: &str) -> Result<Buffer> {
        // SAFETY: ctx is a valid no_alloc context; null means allocation failed (or the
        // context has no tensors).
        let p = unsafe { ggml_sys::ggml_backend_alloc_ctx_tensors(ctx.raw(), self.raw()) };
        let ptr = NonNull::new(p).ok_or_else(|| GgmlError::Alloc {
            what: what.to_string(),
            bytes: 0,
            backend: self.name.clone(),
        })?;
        Ok(Buffer { ptr })
    }

    /// Run a graph whose tensors are all allocated.
    pub fn compute(&self, graph: &Graph<'_>) -> Result<()> {
        // SAFETY: the graph's tensors have been placed by a GraphAllocator or alloc_tensors.
        let status = unsafe { ggml_sys::ggml_backend_graph_compute(self.raw(), graph.raw()) };
        if status != ggml_sys::GGML_STATUS_SUCCESS {
            return Err(GgmlError::Compute { backend: self.name.clone(), status: status as i32 });
        }
        Ok(())
    }
}

fn gpu_devs() -> Vec<ggml_sys::ggml_backend_dev_t> {
    // SAFETY: enumerating ggml's static device registry.
    unsafe {
        (0..ggml_sys::ggml_backend_dev_count())
            .map(|i| ggml_sys::ggml_backend_dev_get(i))
            .filter(|&d| {
                let t = ggml_sys::ggml_backend_dev_type(d);
                t == ggml_sys::GGML_BACKEND_DEVICE_TYPE_GPU || t == ggml_sys::GGML_BACKEND_DEVICE_TYPE_IGPU
            })
            .collect()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: we own the backend.
        unsafe { ggml_sys::ggml_backend_free(self.raw()) }
    }
}

/// A backend buffer holding tensor data.
pub struct Buffer {
    ptr: NonNull<ggml_sys::ggml_backend_buffer>,
}

// SAFETY: a buffer is memory owned by this value; access goes through ggml's
// tensor_set/get, which callers serialise.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn size(&self) -> usize {
        // SAFETY: reads metadata.
        unsafe { ggml_sys::ggml_backend_buffer_get_size(self.ptr.as_ptr()) }
    }

    /// Tell the scheduler these are weights (kept on their device, not overwritten).
    pub fn mark_weights(&self) {
        // SAFETY: sets a flag.
        unsafe { ggml_sys::ggml_backend_buffer_set_usage(self.ptr.as_ptr(), ggml_sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: we own the buffer.
        unsafe { ggml_sys::ggml_backend_buffer_free(self.ptr.as_ptr()) }
    }
}

/// Places a graph's intermediate tensors in one reusable backend buffer, reusing memory
/// of tensors that are no longer needed.
pub struct GraphAllocator {
    ptr: NonNull<ggml_sys::ggml_gallocr>,
    backend_name: String,
}

// SAFETY: owned allocator state; not shared.
unsafe impl Send for GraphAllocator {}

impl GraphAllocator {
    pub fn new(backend: &Backend) -> Result<Self> {
        // SAFETY: the default buffer type of a live backend.
        let p = unsafe { ggml_sys::ggml_gallocr_new(ggml_sys::ggml_backend_get_default_buffer_type(backend.raw())) };
        let ptr = NonNull::new(p).ok_or_else(|| GgmlError::Backend("cannot create a graph allocator".into()))?;
        Ok(GraphAllocator { ptr, backend_name: backend.name().to_string() })
    }

    /// Allocate every not-yet-allocated tensor of `graph`. Fails (without aborting) when
    /// the backend cannot provide the compute buffer, so callers can retry smaller
    /// (e.g. tiled VAE decoding).
    pub fn alloc(&mut self, graph: &Graph<'_>) -> Result<()> {
        // SAFETY: graph is a valid graph whose leaves are allocated or inputs.
        let ok = unsafe { ggml_sys::ggml_gallocr_alloc_graph(self.ptr.as_ptr(), graph.raw()) };
        if !ok {
            return Err(GgmlError::Alloc { what: "compute graph".into(), bytes: 0, backend: self.backend_name.clone() });
        }
        Ok(())
    }

    /// Bytes of the compute buffer after the last allocation.
    pub fn buffer_size(&self) -> usize {
        // SAFETY: reads metadata of buffer 0 (single-buffer allocator).
        unsafe { ggml_sys::ggml_gallocr_get_buffer_size(self.ptr.as_ptr(), 0) }
    }
}

impl Drop for GraphAllocator {
    fn drop(&mut self) {
        // SAFETY: we own the allocator.
        unsafe { ggml_sys::ggml_gallocr_free(self.ptr.as_ptr()) }
    }
}
