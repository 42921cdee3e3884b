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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
        let dev = gpu_dev(index)?;
        // SAFETY: dev comes from ggml's registry.
        let ptr = NonNull::new(unsafe { ggml_sys::ggml_backend_dev_init(dev, std::ptr::null()) })
            .ok_or_else(|| GgmlError::Backend(format!("cannot initialise GPU device {index}")))?;
        let name = cstr(unsafe { ggml_sys::ggml_backend_name(ptr.as_ptr()) });
        // Graphs built outside a scope that names their target no longer take the
        // CPU-only ops (see `options`).
        super::options::note_gpu_backend();
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
        self.buffer_type().alloc_tensors(ctx, what)
    }

    /// Bytes this backend can still allocate: the driver's free memory on a GPU; on the
    /// CPU the kernel's `MemAvailable` (ggml reports all RAM as free there, and Linux
    /// grants any allocation and kills the process when it is touched). `None` where
    /// neither is known.
    pub fn free_memory(&self) -> Option<u64> {
        match self.kind {
            BackendKind::Cpu => {
                let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
                let kib: u64 = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
                Some(kib * 1024)
            }
            BackendKind::Gpu(_) => {
                // SAFETY: the device of a live backend; the out-pointers are live locals.
                let dev = unsafe { ggml_sys::ggml_backend_get_device(self.raw()) };
                if dev.is_null() {
                    return None;
                }
                let (mut free, mut total) = (0usize, 0usize);
                unsafe { ggml_sys::ggml_backend_dev_memory(dev, &mut free, &mut total) };
                (total > 0).then_some(free as u64)
            }
        }
    }

    /// Where this backend's tensors live by default.
    pub fn buffer_type(&self) -> BufferType {
        // SAFETY: the default buffer type of a live backend: a static object of its device.
        let p = unsafe { ggml_sys::ggml_backend_get_default_buffer_type(self.raw()) };
        BufferType { ptr: NonNull::new(p).expect("every ggml backend has a default buffer type"), kind: self.kind }
    }

    /// Run a graph whose tensors are all allocated.
    pub fn compute(&self, graph: &Graph<'_>) -> Result<()> {
        if self.kind != BackendKind::Cpu {
            // A CPU custom op on a GPU backend makes ggml abort: refuse the graph instead,
            // naming the op, so a placement mistake is an error message.
            if let Some(op) = graph.custom_op() {
                return Err(GgmlError::Backend(format!(
                    "the graph holds the CPU-only op `{op}` and cannot run on {}: it was built outside a GPU graph scope",
                    self.name
                )));
            }
        }
        // SAFETY: the graph's tensors have been placed by a GraphAllocator or alloc_tensors.
        let status = unsafe { ggml_sys::ggml_backend_graph_compute(self.raw(), graph.raw()) };
        if status != ggml_sys::GGML_STATUS_SUCCESS {
            return Err(GgmlError::Compute { backend: self.name.clone(), status: status as i32 });
        }
        Ok(())
    }
}

fn gpu_dev(index: usize) -> Result<ggml_sys::ggml_backend_dev_t> {
    init();
    let devs = gpu_devs();
    devs.get(index).copied().ok_or_else(|| {
        GgmlError::Backend(format!("no GPU device {index}: this build has {} (build with --features cuda or vulkan)", devs.len()))
    })
}

/// One device ggml can compute on, as `--list-devices` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// ggml's device name (`CPU`, `CUDA0`, `Vulkan0`): what `--backend` takes.
    pub name: String,
    pub description: String,
    /// The backend that registered it (`CPU`, `CUDA`, `Vulkan`).
    pub registry: String,
    pub kind: BackendKind,
    /// Free and total memory in bytes, as the driver reports them (the CPU: system RAM).
    pub free: u64,
    pub total: u64,
}

/// The CPU, then every GPU in the order [`BackendKind::Gpu`] counts them.
pub fn devices() -> Vec<DeviceInfo> {
    init();
    let info = |d: ggml_sys::ggml_backend_dev_t, kind| {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: d comes from ggml's registry; the out-pointers are live locals.
        unsafe { ggml_sys::ggml_backend_dev_memory(d, &mut free, &mut total) };
        DeviceInfo {
            name: cstr(unsafe { ggml_sys::ggml_backend_dev_name(d) }),
            description: cstr(unsafe { ggml_sys::ggml_backend_dev_description(d) }),
            registry: cstr(unsafe { ggml_sys::ggml_backend_reg_name(ggml_sys::ggml_backend_dev_backend_reg(d)) }),
            kind,
            free: free as u64,
            total: total as u64,
        }
    };
    // SAFETY: lookup in ggml's static registry; the CPU device is always registered.
    let cpu = unsafe { ggml_sys::ggml_backend_dev_by_type(ggml_sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    let mut out = Vec::new();
    if !cpu.is_null() {
        out.push(info(cpu, BackendKind::Cpu));
    }
    out.extend(gpu_devs().into_iter().enumerate().map(|(i, d)| info(d, BackendKind::Gpu(i))));
    out
}

/// Where tensors are allocated: one device's memory. Unlike a [`Backend`] it holds no
/// compute state, so loaders on any thread can place weights on a device while another
/// thread computes there.
#[derive(Clone, Copy, Debug)]
pub struct BufferType {
    ptr: NonNull<ggml_sys::ggml_backend_buffer_type>,
    kind: BackendKind,
}

// SAFETY: buffer types are static objects of ggml's device registry; allocating from one
// is thread-safe in ggml.
unsafe impl Send for BufferType {}
unsafe impl Sync for BufferType {}

impl BufferType {
    /// Host memory.
    pub fn cpu() -> Self {
        init();
        // SAFETY: a static object.
        let p = unsafe { ggml_sys::ggml_backend_cpu_buffer_type() };
        BufferType { ptr: NonNull::new(p).expect("ggml has a CPU buffer type"), kind: BackendKind::Cpu }
    }

    /// The memory of the device `kind` names.
    pub fn of(kind: BackendKind) -> Result<Self> {
        match kind {
            BackendKind::Cpu => Ok(Self::cpu()),
            BackendKind::Gpu(i) => {
                let dev = gpu_dev(i)?;
                // SAFETY: dev comes from ggml's registry.
                let p = unsafe { ggml_sys::ggml_backend_dev_buffer_type(dev) };
                let ptr = NonNull::new(p).ok_or_else(|| GgmlError::Backend(format!("GPU device {i} has no buffer type")))?;
                Ok(BufferType { ptr, kind })
            }
        }
    }

    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    pub fn name(&self) -> String {
        // SAFETY: a static object's name.
        cstr(unsafe { ggml_sys::ggml_backend_buft_name(self.ptr.as_ptr()) })
    }

    /// One buffer holding every tensor of `ctx`. Fails (never aborts) when the device
    /// cannot provide it, naming `what`, the bytes asked for and the device.
    pub fn alloc_tensors(&self, ctx: &Context, what: &str) -> Result<Buffer> {
        // SAFETY: ctx is a valid no_alloc context; both calls only read its tensors'
        // metadata; null means the allocation failed (or the context has no tensors).
        let p = unsafe { ggml_sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.raw(), self.ptr.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(|| GgmlError::Alloc {
            what: what.to_string(),
            bytes: unsafe { ggml_sys::ggml_backend_alloc_ctx_tensors_from_buft_size(ctx.raw(), self.ptr.as_ptr()) },
            backend: self.name(),
        })?;
        Ok(Buffer { ptr })
    }
}

/// Anything tensors can be placed by: a backend (its device's memory) or a buffer type.
pub trait AllocTarget {
    fn buffer_type(&self) -> BufferType;
}

impl AllocTarget for Backend {
    fn buffer_type(&self) -> BufferType {
        Backend::buffer_type(self)
    }
}

impl AllocTarget for BufferType {
    fn buffer_type(&self) -> BufferType {
        *self
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
    /// A compute buffer larger than this fails as an allocation failure.
    limit: Option<usize>,
}

// SAFETY: owned allocator state; not shared.
unsafe impl Send for GraphAllocator {}

impl GraphAllocator {
    pub fn new(backend: &Backend) -> Result<Self> {
        // SAFETY: the default buffer type of a live backend.
        let p = unsafe { ggml_sys::ggml_gallocr_new(ggml_sys::ggml_backend_get_default_buffer_type(backend.raw())) };
        let ptr = NonNull::new(p).ok_or_else(|| GgmlError::Backend("cannot create a graph allocator".into()))?;
        Ok(GraphAllocator { ptr, backend_name: backend.name().to_string(), limit: None })
    }

    /// Compute buffers larger than `limit` bytes fail in [`GraphAllocator::alloc`] as an
    /// allocation failure, before anything is computed: what a backend that cannot provide
    /// the buffer reports, so callers that retry smaller (tiled VAEs) treat both alike.
    pub fn with_limit(mut self, limit: Option<usize>) -> Self {
        self.limit = limit;
        self
    }

    /// [`GraphAllocator::with_limit`] on a kept allocator.
    pub fn set_limit(&mut self, limit: Option<usize>) {
        self.limit = limit;
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
        match self.limit {
            Some(limit) if self.buffer_size() > limit => Err(GgmlError::Alloc { what: format!("compute buffer (over the {limit}-byte threshold)"), bytes: self.buffer_size(), backend: self.backend_name.clone() }),
            _ => Ok(()),
        }
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
