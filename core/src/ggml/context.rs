//! Contexts, tensors, ops and graphs.
//!
//! A [`Context`] is always metadata-only (`no_alloc`): tensor data lives in backend
//! buffers, so the same graph code runs on CPU, CUDA or Vulkan. Dimensions are in
//! ggml order (`ne[0]` is the innermost, contiguous one).

use super::{init, GType, GgmlError, Result};
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Owns a ggml context that holds tensor and graph metadata.
pub struct Context {
    ptr: NonNull<ggml_sys::ggml_context>,
    max_tensors: usize,
    /// The axes on which the model layers built here pad their convolutions circularly
    /// (see [`Context::set_circular`]).
    circular: std::cell::Cell<Circular>,
    /// The options in force where the context was made (see `super::options`).
    options: super::GraphOptions,
}

/// The spatial axes whose padding wraps around (seamless tiling: sd-cli's `--circular`,
/// `--circularx`, `--circulary`): `x` is the width (ggml's ne[0]), `y` the height (ne[1]).
/// A convolution padded circularly on an axis sees the opposite edge beyond each border,
/// as PyTorch's `padding_mode="circular"` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Circular {
    pub x: bool,
    pub y: bool,
}

impl Circular {
    pub const NONE: Circular = Circular { x: false, y: false };
    pub const BOTH: Circular = Circular { x: true, y: true };

    pub fn new(x: bool, y: bool) -> Self {
        Circular { x, y }
    }

    pub fn any(self) -> bool {
        self.x || self.y
    }
}

// SAFETY: a context is plain memory owned by this value; moving it to another thread is
// fine. It is not Sync: ggml's tensor creation mutates the context without locking.
unsafe impl Send for Context {}

impl Context {
    /// A metadata context with room for `max_tensors` tensors and one graph of
    /// `graph_size` nodes.
    pub fn new(max_tensors: usize, graph_size: usize) -> Result<Self> {
        init();
        // SAFETY: pure size computations.
        let mem = unsafe {
            ggml_sys::ggml_tensor_overhead()
                .checked_mul(max_tensors)
                .and_then(|t| t.checked_add(ggml_sys::ggml_graph_overhead_custom(graph_size, false)))
                .ok_or_else(|| GgmlError::Context(format!("{max_tensors} tensors overflow the context size")))?
        };
        let params = ggml_sys::ggml_init_params { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc: true };
        // SAFETY: ggml_init allocates its own pool; a null return means allocation failed.
        let ptr = unsafe { ggml_sys::ggml_init(params) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| GgmlError::Context(format!("cannot allocate a {mem}-byte context")))?;
        Ok(Context { ptr, max_tensors, circular: std::cell::Cell::new(Circular::NONE), options: super::options::current() })
    }

    /// How graphs of this context are built: the device they are for, the kernels chosen.
    pub fn options(&self) -> super::GraphOptions {
        self.options
    }

    /// Whether ops may be our CPU custom ops: the graph is not for a GPU, and they are on.
    fn cpu_ops(&self) -> bool {
        !self.options.gpu && super::matmul::enabled()
    }

    pub(crate) fn raw(&self) -> *mut ggml_sys::ggml_context {
        self.ptr.as_ptr()
    }

    /// The padding mode of the model layers built in this context from now on: the
    /// convolutions of [`crate::models::nn::conv2d`] (and the layers that pad their inputs
    /// themselves) wrap around on the axes `c` names instead of padding with zeros, as
    /// stable-diffusion.cpp's runner context carries `circular_x/y_enabled` to every
    /// `Conv2d` it builds. The raw ops ([`Context::conv_2d`], [`Context::pad`]) are not
    /// affected.
    pub fn set_circular(&self, c: Circular) {
        self.circular.set(c);
    }

    /// What [`Context::set_circular`] last set ([`Circular::NONE`] by default).
    pub fn circular(&self) -> Circular {
        self.circular.get()
    }

    /// ggml aborts when a context's pool is exhausted; checking the remaining room first
    /// turns that into an error. Views and ops create one tensor object each.
    fn room(&self, op: &'static str) -> Result<()> {
        // SAFETY: reading the context's bookkeeping.
        let (used, size) = unsafe { (ggml_sys::ggml_used_mem(self.raw()), ggml_sys::ggml_get_mem_size(self.raw())) };
        let need = unsafe { ggml_sys::ggml_tensor_overhead() };
        if used + need > size {
            return Err(GgmlError::Context(format!(
                "context full ({} tensors) while adding {op}",
                self.max_tensors
            )));
        }
        Ok(())
    }

    fn wrap(&self, op: &'static str, p: *mut ggml_sys::ggml_tensor) -> Result<Tensor<'_>> {
        NonNull::new(p)
            .map(|ptr| Tensor { ptr, _ctx: PhantomData })
            .ok_or_else(|| GgmlError::Context(format!("ggml returned no tensor for {op}")))
    }

    /// A new tensor with dimensions `ne` (ggml order, 1 to 4 entries).
    pub fn new_tensor(&self, ty: GType, ne: &[i64]) -> Result<Tensor<'_>> {
        self.room("new_tensor")?;
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&d| d <= 0) {
            return Err(shape("new_tensor", format!("bad dimensions {ne:?}")));
        }
        let mut total: i64 = 1;
        for &d in ne {
            total = total.checked_mul(d).ok_or_else(|| shape("new_tensor", format!("{ne:?} overflows")))?;
        }
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(shape(
                "new_tensor",
                format!("row length {} is not a multiple of the {ty:?} block size {}", ne[0], ty.block_size()),
            ));
        }
        // SAFETY: the context has room (checked) and the dimensions are valid.
        let p = unsafe { ggml_sys::ggml_new_tensor(self.raw(), ty.0, ne.len() as i32, ne.as_ptr()) };
        self.wrap("new_tensor", p)
    }

    /// A graph with room for `size` nodes.
    pub fn graph(&self, size: usize) -> Result<Graph<'_>> {
        // SAFETY: the graph lives in the context's pool, sized for it in `new`.
        let p = unsafe { ggml_sys::ggml_new_graph_custom(self.raw(), size, false) };
        NonNull::new(p)
            .map(|ptr| Graph { ptr, _ctx: PhantomData })
            .ok_or_else(|| GgmlError::Context("cannot create graph".into()))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: we own the context; tensors borrowing it cannot outlive `self`.
        unsafe { ggml_sys::ggml_free(self.raw()) }
    }
}

fn shape(op: &'static str, detail: String) -> GgmlError {
    GgmlError::Shape { op, detail }
}

/// A tensor in a [`Context`]; a cheap copyable handle.
#[derive(Clone, Copy)]
pub struct Tensor<'c> {
    ptr: NonNull<ggml_sys::ggml_tensor>,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> Tensor<'c> {
    /// Re-wrap a tensor pointer whose context outlives `'c` (used by owners of weight
    /// contexts that hand out tensors borrowing themselves).
    ///
    /// # Safety
    /// `ptr` must point at a live tensor of a context that outlives `'c`.
    pub(crate) unsafe fn from_raw(ptr: NonNull<ggml_sys::ggml_tensor>) -> Tensor<'c> {
        Tensor { ptr, _ctx: PhantomData }
    }

    pub fn raw(self) -> *mut ggml_sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    fn t(&self) -> &ggml_sys::ggml_tensor {
        // SAFETY: the tensor lives as long as its context, which outlives 'c.
        unsafe { self.ptr.as_ref() }
    }

    /// Dimensions in ggml order.
    pub fn ne(self) -> [i64; 4] {
        self.t().ne
    }

    /// Strides in bytes, ggml order.
    pub fn nb(self) -> [usize; 4] {
        self.t().nb
    }

    pub fn dtype(self) -> GType {
        GType(self.t().type_)
    }

    pub fn n_elements(self) -> i64 {
        self.ne().iter().product()
    }

    pub fn n_bytes(self) -> usize {
        // SAFETY: reads metadata only.
        unsafe { ggml_sys::ggml_nbytes(self.raw()) }
    }

    pub fn is_contiguous(self) -> bool {
        // SAFETY: reads metadata only.
        unsafe { ggml_sys::ggml_is_contiguous(self.raw()) }
    }

    /// Names show up in ggml's debug output and let callers find tensors in a graph.
    pub fn set_name(self, name: &str) -> Self {
        let c = CString::new(name.replace('\0', "")).unwrap_or_default();
        // SAFETY: ggml copies the name into the tensor (truncating to its fixed size).
        unsafe { ggml_sys::ggml_set_name(self.raw(), c.as_ptr()) };
        self
    }

    /// Mark as a graph input so the allocator never reuses its memory before it is read.
    pub fn set_input(self) -> Self {
        // SAFETY: sets a flag.
        unsafe { ggml_sys::ggml_set_input(self.raw()) };
        self
    }

    /// Mark as a graph output so the allocator keeps it after the graph finishes.
    pub fn set_output(self) -> Self {
        // SAFETY: sets a flag.
        unsafe { ggml_sys::ggml_set_output(self.raw()) };
        self
    }

    pub fn has_data(self) -> bool {
        !self.t().buffer.is_null() && !self.t().data.is_null()
    }

    fn check_io(self, bytes: usize, what: &str) -> Result<()> {
        if !self.has_data() {
            return Err(GgmlError::Data(format!("{what}: tensor has no backend buffer yet")));
        }
        if bytes != self.n_bytes() {
            return Err(GgmlError::Data(format!("{what}: {bytes} bytes given, tensor holds {}", self.n_bytes())));
        }
        Ok(())
    }

    /// Upload raw bytes (exactly `n_bytes()` of them) into the tensor's backend buffer.
    pub fn set_bytes(self, data: &[u8]) -> Result<()> {
        self.check_io(data.len(), "set_bytes")?;
        // SAFETY: size checked against the tensor's byte length; the buffer is allocated.
        unsafe { ggml_sys::ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), 0, data.len()) };
        Ok(())
    }

    pub fn set_f32(self, data: &[f32]) -> Result<()> {
        if self.dtype() != GType::F32 {
            return Err(GgmlError::Data(format!("set_f32 on a {:?} tensor", self.dtype())));
        }
        // SAFETY: f32 slices are plain bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        self.set_bytes(bytes)
    }

    pub fn set_i32(self, data: &[i32]) -> Result<()> {
        if self.dtype() != GType::I32 {
            return Err(GgmlError::Data(format!("set_i32 on a {:?} tensor", self.dtype())));
        }
        // SAFETY: i32 slices are plain bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        self.set_bytes(bytes)
    }

    /// Download the tensor's bytes from its backend buffer.
    pub fn get_bytes(self) -> Result<Vec<u8>> {
        let n = self.n_bytes();
        self.check_io(n, "get_bytes")?;
        let mut out = vec![0u8; n];
        // SAFETY: `out` has exactly the tensor's byte length.
        unsafe { ggml_sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, n) };
        Ok(out)
    }

    /// Read a contiguous F32 tensor.
    pub fn get_f32(self) -> Result<Vec<f32>> {
        if self.dtype() != GType::F32 || !self.is_contiguous() {
            return Err(GgmlError::Data(format!("get_f32 needs a contiguous f32 tensor, got {:?}", self.dtype())));
        }
        let bytes = self.get_bytes()?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// How [`Context::interpolate`] resamples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleMode {
    Nearest,
    Bilinear,
    /// Bilinear with align_corners=true semantics.
    BilinearAlignCorners,
    Bicubic,
    /// Antialiased bilinear (a triangle filter wider than one pixel when downscaling).
    BilinearAntialias,
}

impl ScaleMode {
    fn raw(self) -> u32 {
        match self {
            ScaleMode::Nearest => ggml_sys::GGML_SCALE_MODE_NEAREST,
            ScaleMode::Bilinear => ggml_sys::GGML_SCALE_MODE_BILINEAR,
            ScaleMode::BilinearAlignCorners => ggml_sys::GGML_SCALE_MODE_BILINEAR | ggml_sys::GGML_SCALE_FLAG_ALIGN_CORNERS,
            ScaleMode::Bicubic => ggml_sys::GGML_SCALE_MODE_BICUBIC,
            ScaleMode::BilinearAntialias => ggml_sys::GGML_SCALE_MODE_BILINEAR | ggml_sys::GGML_SCALE_FLAG_ANTIALIAS,
        }
    }
}

fn can_repeat(small: [i64; 4], big: [i64; 4]) -> bool {
    (0..4).all(|i| small[i] > 0 && big[i] % small[i] == 0)
}

fn conv_out(input: i64, kernel: i64, stride: i32, pad: i32, dil: i32) -> i64 {
    (input + 2 * pad as i64 - dil as i64 * (kernel - 1) - 1) / stride.max(1) as i64 + 1
}

/// Ops. Each mirrors the ggml function of the same name and checks that function's
/// assertions first.
impl Context {
    fn op(&self, name: &'static str, f: impl FnOnce() -> *mut ggml_sys::ggml_tensor) -> Result<Tensor<'_>> {
        self.room(name)?;
        self.wrap(name, f())
    }

    /// `a` [K, M, ...] × `b` [K, N, ...] → [M, N, ...] (f32); `b`'s batch dims must be
    /// multiples of `a`'s (broadcast).
    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
        let (an, bn) = (a.ne(), b.ne());
        // SAFETY: reads metadata only.
        let transposed = unsafe { ggml_sys::ggml_is_transposed(a.raw()) };
        if an[0] != bn[0] || bn[2] % an[2] != 0 || bn[3] % an[3] != 0 || transposed {
            return Err(shape("mul_mat", format!("a {an:?} cannot multiply b {bn:?}")));
        }
        if an[0] * an[1] * bn[1] * bn[2] * bn[3] >= super::matmul::MIN_MACS {
            if let Some(t) = self.bf16_linear("mul_mat", a, b, [an[1], bn[1], bn[2], bn[3]], 0)? {
                return Ok(t);
            }
            if self.cpu_ops() && super::matmul::supports(a.raw(), b.raw()) {
                return self.matmul_op("mul_mat", a, b, [an[1], bn[1], bn[2], bn[3]], 0);
            }
        }
        // SAFETY: preconditions checked above.
        self.op("mul_mat", || unsafe { ggml_sys::ggml_mul_mat(self.raw(), a.raw(), b.raw()) })
    }

    /// [`Context::mul_mat`] transposed: `a` [K, M, ...] × `b` [K, N, ...] → [N, M, ...].
    /// A convolution's product lands in [W·H, C_out, N] this way, with no permute copy
    /// (on the CPU; elsewhere it is the product followed by one).
    pub fn mul_mat_t<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
        let (an, bn) = (a.ne(), b.ne());
        if an[0] != bn[0] || bn[2] % an[2] != 0 || bn[3] % an[3] != 0 {
            return Err(shape("mul_mat_t", format!("a {an:?} cannot multiply b {bn:?}")));
        }
        if let Some(t) = self.bf16_linear("mul_mat_t", a, b, [bn[1], an[1], bn[2], bn[3]], super::matmul::TRANSPOSED)? {
            return Ok(t);
        }
        if self.cpu_ops() && super::matmul::supports(a.raw(), b.raw()) {
            return self.matmul_op("mul_mat_t", a, b, [bn[1], an[1], bn[2], bn[3]], super::matmul::TRANSPOSED);
        }
        self.cont(self.permute(self.mul_mat(a, b)?, [1, 0, 2, 3])?)
    }

    /// The product on the CPU's bf16 units ([`super::bf16`]) when it has them and the operands
    /// fit: a 2-D bf16 weight with contiguous rows and K a multiple of 32, f32 activations
    /// (rounded to bf16 first by one op over all threads). `None`: not taken.
    fn bf16_linear<'a>(&'a self, name: &'static str, a: Tensor<'a>, b: Tensor<'a>, ne: [i64; 4], flags: usize) -> Result<Option<Tensor<'a>>> {
        let an = a.ne();
        // SAFETY: reads metadata only.
        let rows_contiguous = unsafe { (*a.raw()).nb[0] } == a.dtype().type_size();
        if !self.cpu_ops() || an[2] * an[3] != 1 || !rows_contiguous || b.dtype() != GType::F32 || !super::bf16::takes(a.dtype().0, an[0], b.ne()[1]) {
            return Ok(None);
        }
        let b = if b.is_contiguous() { b } else { self.cont(b)? };
        // SAFETY: to_bf16 converts a contiguous f32 tensor into one of its shape; the
        // product's weight is 2-D with contiguous rows and K a multiple of 32, its
        // activations that contiguous bf16 copy.
        unsafe {
            let x = self.custom("to_bf16", GType::BF16, b.ne(), &[b], Some(super::bf16::to_bf16_compute), 0)?;
            self.custom(name, GType::F32, ne, &[a, x], Some(super::bf16::linear_compute), flags).map(Some)
        }
    }

    /// A ggml custom op over `args` computing `f` into a new [`ne`] tensor of type `ty`,
    /// split over all threads; `userdata` is a plain word (flags or packed sizes), never a
    /// pointer, so it outlives the graph trivially.
    ///
    /// # Safety
    /// `f` must read `args` and write the output only within the shapes the caller checked.
    unsafe fn custom<'a>(&'a self, name: &'static str, ty: GType, ne: [i64; 4], args: &[Tensor<'a>], f: ggml_sys::ggml_custom_op_t, userdata: usize) -> Result<Tensor<'a>> {
        let mut raw: Vec<*mut ggml_sys::ggml_tensor> = args.iter().map(|t| t.raw()).collect();
        // SAFETY: forwarded to the caller's contract.
        self.op(name, || unsafe {
            ggml_sys::ggml_custom_4d(self.raw(), ty.0, ne[0], ne[1], ne[2], ne[3], raw.as_mut_ptr(), raw.len() as i32, f, ggml_sys::GGML_N_TASKS_MAX, userdata as *mut std::os::raw::c_void)
        })
    }

    fn matmul_op<'a>(&'a self, name: &'static str, a: Tensor<'a>, b: Tensor<'a>, ne: [i64; 4], flags: usize) -> Result<Tensor<'a>> {
        // SAFETY: the operands' shapes were checked by the caller and `supports`.
        unsafe { self.custom(name, GType::F32, ne, &[a, b], Some(super::matmul::compute), flags) }
    }

    fn binary<'a>(
        &'a self,
        name: &'static str,
        a: Tensor<'a>,
        b: Tensor<'a>,
        f: unsafe extern "C" fn(*mut ggml_sys::ggml_context, *mut ggml_sys::ggml_tensor, *mut ggml_sys::ggml_tensor) -> *mut ggml_sys::ggml_tensor,
    ) -> Result<Tensor<'a>> {
        if !can_repeat(b.ne(), a.ne()) {
            return Err(shape(name, format!("b {:?} does not broadcast to a {:?}", b.ne(), a.ne())));
        }
        // ggml's CPU kernels abort on mixed operand types (e.g. f32 + bf16 at compute
        // time); a low-precision weight added to f32 activations is converted first.
        let b = if b.dtype() == a.dtype() {
            b
        } else if a.dtype() == GType::F32 && !b.dtype().is_quantized() {
            self.cast(b, GType::F32)?
        } else {
            return Err(shape(name, format!("cannot combine {:?} with {:?}", a.dtype(), b.dtype())));
        };
        // SAFETY: broadcast and type preconditions checked.
        self.op(name, || unsafe { f(self.raw(), a.raw(), b.raw()) })
    }

    /// a + b, with `b` broadcast over `a`.
    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
        self.binary("add", a, b, ggml_sys::ggml_add)
    }

    /// a - b, with `b` broadcast over `a`.
    pub fn sub<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
        self.binary("sub", a, b, ggml_sys::ggml_sub)
    }

    /// a * b elementwise, with `b` broadcast over `a`.
    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>> {
        self.binary("mul", a, b, ggml_sys::ggml_mul)
    }

    pub fn scale<'a>(&'a self, a: Tensor<'a>, s: f32) -> Result<Tensor<'a>> {
        // SAFETY: no preconditions.
        self.op("scale", || unsafe { ggml_sys::ggml_scale(self.raw(), a.raw(), s) })
    }

    /// 2-D convolution through im2col + mul_mat. `kernel` [KW, KH, Cin, Cout], `input`
    /// [W, H, Cin, N] → [OW, OH, Cout, N].
    ///
    /// Unlike `ggml_conv_2d` (f16 columns, kernel as the right operand), the columns are
    /// f32 and the kernel is mul_mat's left operand, so any weight type works (f32 for
    /// exact parity with PyTorch, bf16, f16 and the quantized types) with ggml's
    /// weight-times-activations kernels.
    pub fn conv_2d<'a>(&'a self, kernel: Tensor<'a>, input: Tensor<'a>, stride: (i32, i32), pad: (i32, i32), dilation: (i32, i32)) -> Result<Tensor<'a>> {
        self.check_conv("conv_2d", kernel, input, stride, pad, dilation)?;
        if !kernel.is_contiguous() {
            return Err(shape("conv_2d", "kernel must be contiguous".into()));
        }
        // sd-cli's conv-direct switches; ggml's direct kernels take f32 and f16 kernels.
        if self.options.conv_direct && matches!(kernel.dtype(), GType::F32 | GType::F16) && input.dtype() == GType::F32 {
            return self.conv_2d_direct(kernel, input, stride, pad, dilation);
        }
        if stride == (1, 1) && dilation == (1, 1) && input.dtype() == GType::F32 && self.cpu_ops() {
            let kn = kernel.ne();
            // Any C_out: a VAE's conv_out (128 → 3) through im2col instead would need a
            // 1.2 GB column buffer at 512², the largest allocation of the whole decode.
            if super::bf16::takes_conv(kernel.dtype().0, kn[2]) {
                return self.conv_2d_bf16(kernel, input, pad);
            }
            if super::matmul::supports(kernel.raw(), input.raw()) {
                return self.conv_2d_shifted(kernel, input, pad);
            }
        }
        // SAFETY: channel and output-size preconditions checked.
        let cols = self.op("conv_2d", || unsafe {
            ggml_sys::ggml_im2col(self.raw(), kernel.raw(), input.raw(), stride.0, stride.1, pad.0, pad.1, dilation.0, dilation.1, true, GType::F32.0)
        })?; // [K, OW, OH, N]
        let [k, ow, oh, n] = cols.ne();
        let kn = kernel.ne();
        let cols2 = self.reshape(cols, [k, ow * oh * n, 1, 1])?;
        let kernel2 = self.reshape(kernel, [kn[0] * kn[1] * kn[2], kn[3], 1, 1])?;
        if self.cpu_ops() && super::matmul::supports(kernel2.raw(), cols.raw()) {
            let cols3 = self.reshape(cols, [k, ow * oh, n, 1])?;
            let out = self.mul_mat_t(kernel2, cols3)?; // [OW·OH, Cout, N]
            return self.reshape(out, [ow, oh, kn[3], n]);
        }
        let out = self.mul_mat(kernel2, cols2)?; // [Cout, OW·OH·N]
        let out = self.reshape(out, [kn[3], ow, oh, n])?;
        self.cont(self.permute(out, [2, 0, 1, 3])?)
    }

    /// The CPU's stride-1 convolution: the kernel expanded to f32 and reordered to
    /// [C, C_out, KW, KH] by one ggml copy (all threads), the input padded once, then
    /// `matmul::conv_compute`.
    fn conv_2d_shifted<'a>(&'a self, kernel: Tensor<'a>, input: Tensor<'a>, pad: (i32, i32)) -> Result<Tensor<'a>> {
        let kn = kernel.ne();
        // One ggml copy both expands and reorders: the GEMM packs each offset's matrix per
        // column block, and packing from the stored layout (a stride of KW·KH floats) cost
        // 9 % of a step at 256² against this copy (4.39 vs 4.03 s/step, SD1.5 f32, 2 threads).
        let kernel = if kn[0] * kn[1] == 1 {
            self.reshape(self.cast(kernel, GType::F32)?, [kn[2], kn[3], 1, 1])?
        } else {
            let k = self.cast(self.permute(kernel, [2, 3, 0, 1])?, GType::F32)?;
            if k.is_contiguous() { k } else { self.cont(k)? }
        };
        let input = if input.is_contiguous() { input } else { self.cont(input)? };
        let x = if pad == (0, 0) { input } else { self.pad(input, [(pad.0, pad.0), (pad.1, pad.1), (0, 0), (0, 0)])? };
        let xn = x.ne();
        let (ow, oh) = (xn[0] - kn[0] + 1, xn[1] - kn[1] + 1);
        // SAFETY: shapes checked by check_conv; both sources are f32 and contiguous.
        unsafe { self.custom("conv_2d", GType::F32, [ow, oh, kn[3], xn[3]], &[kernel, x], Some(super::matmul::conv_compute), 0) }
    }

    /// The stride-1 convolution on the bf16 units: the bf16 kernel reordered to [C, C_out, KW,
    /// KH] (C_out padded to a multiple of 32 with zero rows), the input rounded to bf16,
    /// padded (with zero rows below, so whole 32-column blocks of shifted reads stay inside)
    /// and pair-interleaved, one op each, then `bf16::conv_compute`.
    fn conv_2d_bf16<'a>(&'a self, kernel: Tensor<'a>, input: Tensor<'a>, pad: (i32, i32)) -> Result<Tensor<'a>> {
        let kn = kernel.ne();
        let xn = input.ne();
        let (wp, hp) = (xn[0] + 2 * pad.0 as i64, xn[1] + 2 * pad.1 as i64);
        let extra = (31 + wp - 1) / wp;
        let input = if input.is_contiguous() { input } else { self.cont(input)? };
        let (ow, oh) = (wp - kn[0] + 1, hp - kn[1] + 1);
        let pads = pad.0 as usize | (pad.1 as usize) << 16 | (extra as usize) << 32;
        let taps = kn[0] as usize | (kn[1] as usize) << 16 | (wp as usize) << 32;
        // SAFETY: the kernel is contiguous bf16 (checked by conv_2d and bf16::takes), the
        // input contiguous f32, C a multiple of 32 (checked by the caller); each op
        // writes exactly the shape it is given here.
        unsafe {
            let k = self.custom("conv_2d", GType::BF16, [kn[2], (kn[3] + 31) / 32 * 32, kn[0], kn[1]], &[kernel], Some(super::bf16::reorder_kernel_compute), 0)?;
            let x = self.custom("conv_2d", GType::BF16, [2, wp * (hp + extra), xn[2] / 2, xn[3]], &[input], Some(super::bf16::pack_conv_input_compute), pads)?;
            self.custom("conv_2d", GType::F32, [ow, oh, kn[3], xn[3]], &[k, x], Some(super::bf16::conv_compute), taps)
        }
    }

    /// 2-D convolution computed directly, without the im2col buffer (less memory).
    pub fn conv_2d_direct<'a>(&'a self, kernel: Tensor<'a>, input: Tensor<'a>, stride: (i32, i32), pad: (i32, i32), dilation: (i32, i32)) -> Result<Tensor<'a>> {
        self.check_conv("conv_2d_direct", kernel, input, stride, pad, dilation)?;
        // SAFETY: channel and output-size preconditions checked.
        self.op("conv_2d_direct", || unsafe {
            ggml_sys::ggml_conv_2d_direct(self.raw(), kernel.raw(), input.raw(), stride.0, stride.1, pad.0, pad.1, dilation.0, dilation.1)
        })
    }

    fn check_conv(&self, op: &'static str, k: Tensor<'_>, x: Tensor<'_>, s: (i32, i32), p: (i32, i32), d: (i32, i32)) -> Result<()> {
        let (kn, xn) = (k.ne(), x.ne());
        if kn[2] != xn[2] {
            return Err(shape(op, format!("kernel {kn:?} expects {} input channels, input {xn:?} has {}", kn[2], xn[2])));
        }
        if s.0 < 1 || s.1 < 1 || d.0 < 1 || d.1 < 1 || p.0 < 0 || p.1 < 0 {
            return Err(shape(op, format!("bad stride {s:?} / padding {p:?} / dilation {d:?}")));
        }
        if conv_out(xn[0], kn[0], s.0, p.0, d.0) < 1 || conv_out(xn[1], kn[1], s.1, p.1, d.1) < 1 {
            return Err(shape(op, format!("kernel {kn:?} larger than padded input {xn:?}")));
        }
        Ok(())
    }

    /// Group norm over [W, H, C, N] with `groups` groups of channels (no affine part).
    pub fn group_norm<'a>(&'a self, a: Tensor<'a>, groups: i32, eps: f32) -> Result<Tensor<'a>> {
        if groups < 1 || a.ne()[2] % groups as i64 != 0 {
            return Err(shape("group_norm", format!("{} channels do not split into {groups} groups", a.ne()[2])));
        }
        // SAFETY: group count checked.
        self.op("group_norm", || unsafe { ggml_sys::ggml_group_norm(self.raw(), a.raw(), groups, eps) })
    }

    /// Layer norm over ne[0] (no affine part).
    pub fn norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
        // SAFETY: no preconditions.
        self.op("norm", || unsafe { ggml_sys::ggml_norm(self.raw(), a.raw(), eps) })
    }

    /// Every element limited to [min, max].
    pub fn clamp<'a>(&'a self, a: Tensor<'a>, min: f32, max: f32) -> Result<Tensor<'a>> {
        // SAFETY: no preconditions.
        self.op("clamp", || unsafe { ggml_sys::ggml_clamp(self.raw(), a.raw(), min, max) })
    }

    /// RMS norm over ne[0] (no affine part).
    pub fn rms_norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Result<Tensor<'a>> {
        // SAFETY: no preconditions.
        self.op("rms_norm", || unsafe { ggml_sys::ggml_rms_norm(self.raw(), a.raw(), eps) })
    }

    /// softmax(a * scale + mask) over ne[0]. `mask` (f32 or f16) is [ne0, >=ne1, ...] and
    /// broadcasts over a's batch dims.
    pub fn soft_max_ext<'a>(&'a self, a: Tensor<'a>, mask: Option<Tensor<'a>>, scale: f32) -> Result<Tensor<'a>> {
        if !a.is_contiguous() {
            return Err(shape("soft_max", "input must be contiguous".into()));
        }
        if let Some(m) = mask {
            let (an, mn) = (a.ne(), m.ne());
            let ok_type = m.dtype() == GType::F32 || m.dtype() == GType::F16;
            if !ok_type || !m.is_contiguous() || mn[0] != an[0] || mn[1] < an[1] || an[2] % mn[2] != 0 || an[3] % mn[3] != 0 {
                return Err(shape("soft_max", format!("mask {mn:?} ({:?}) does not fit input {an:?}", m.dtype())));
            }
        }
        let mp = mask.map_or(std::ptr::null_mut(), |m| m.raw());
        // SAFETY: preconditions checked.
        self.op("soft_max", || unsafe { ggml_sys::ggml_soft_max_ext(self.raw(), a.raw(), mp, scale, 0.0) })
    }

    /// Fused attention. `q` [D, Nq, H, B], `k` [D, Nkv, Hkv, B], `v` [Dv, Nkv, Hkv, B];
    /// returns [Dv, H, Nq, B] (note: heads and queries swap places). `mask` is f16
    /// [Nkv, Nq(padded), ...].
    pub fn flash_attn_ext<'a>(&'a self, q: Tensor<'a>, k: Tensor<'a>, v: Tensor<'a>, mask: Option<Tensor<'a>>, scale: f32) -> Result<Tensor<'a>> {
        let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
        let can_mm = kn[0] == qn[0] && qn[2] % kn[2] == 0 && qn[3] % kn[3] == 0;
        if !can_mm || qn[3] != kn[3] || qn[3] != vn[3] || vn[1] != kn[1] {
            return Err(shape("flash_attn_ext", format!("q {qn:?} k {kn:?} v {vn:?} do not match")));
        }
        if let Some(m) = mask {
            let mn = m.ne();
            if m.dtype() != GType::F16 || !m.is_contiguous() || mn[0] != kn[1] || mn[1] < qn[1] || qn[2] % mn[2] != 0 || qn[3] % mn[3] != 0 {
                return Err(shape("flash_attn_ext", format!("mask {mn:?} ({:?}) does not fit q {qn:?} k {kn:?}", m.dtype())));
            }
        }
        let mp = mask.map_or(std::ptr::null_mut(), |m| m.raw());
        // SAFETY: preconditions checked.
        let t = self.op("flash_attn_ext", || unsafe {
            ggml_sys::ggml_flash_attn_ext(self.raw(), q.raw(), k.raw(), v.raw(), mp, scale, 0.0, 0.0)
        })?;
        // f32 accumulation: the f16 default loses too much on long sequences.
        unsafe { ggml_sys::ggml_flash_attn_ext_set_prec(t.raw(), ggml_sys::GGML_PREC_F32) };
        Ok(t)
    }

    /// Unmasked softmax attention per head on the CPU (see `ggml::attention`): `q`
    /// [Dh, H, Nq, B], `k` and `v` [Dh, H, Nkv, B], f32 with unit stride in ne[0];
    /// returns [Dh, H, Nq, B]. `None` where this backend cannot run it (the custom ops are
    /// off): the caller uses [`Context::flash_attn_ext`] then.
    ///
    /// `bf16`: the model computes in bf16 (its weights are bf16), so where the CPU has
    /// bf16 units both products run on them ([`super::bf16`]), the softmax staying f32.
    pub fn attention_cpu<'a>(&'a self, q: Tensor<'a>, k: Tensor<'a>, v: Tensor<'a>, scale: f32, bf16: bool) -> Result<Option<Tensor<'a>>> {
        if !self.cpu_ops() {
            return Ok(None);
        }
        let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
        if qn[0] != kn[0] || kn != vn || qn[1] != kn[1] || qn[3] != kn[3] {
            return Err(shape("attention", format!("q {qn:?} k {kn:?} v {vn:?} do not match")));
        }
        // SAFETY: metadata reads of live tensors.
        let unit = |t: Tensor<'_>| t.dtype() == GType::F32 && unsafe { (*t.raw()).nb[0] } == 4;
        if !(unit(q) && unit(k) && unit(v)) {
            return Err(shape("attention", "q, k and v must be f32 with unit stride in ne[0]".to_string()));
        }
        let f = if bf16 && super::bf16::takes_attention(qn[0], kn[2]) { super::bf16::attention_compute } else { super::attention::compute };
        // SAFETY: shapes and types checked; the userdata carries the scale's bits.
        unsafe { self.custom("attention", GType::F32, qn, &[q, k, v], Some(f), scale.to_bits() as usize) }.map(Some)
    }

    fn unary<'a>(&'a self, name: &'static str, a: Tensor<'a>, f: unsafe extern "C" fn(*mut ggml_sys::ggml_context, *mut ggml_sys::ggml_tensor) -> *mut ggml_sys::ggml_tensor) -> Result<Tensor<'a>> {
        // SAFETY: reads metadata only.
        if !unsafe { ggml_sys::ggml_is_contiguous_rows(a.raw()) } {
            return Err(shape(name, "rows must be contiguous".into()));
        }
        // SAFETY: precondition checked.
        self.op(name, || unsafe { f(self.raw(), a.raw()) })
    }

    /// GELU, tanh approximation (as in CLIP's quick paths and ggml's default).
    pub fn gelu<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("gelu", a, ggml_sys::ggml_gelu)
    }

    /// GELU, tanh approximation, from f32 ops: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`,
    /// PyTorch's `gelu(approximate="tanh")` (T5's `gelu_new`, FLUX's MLPs) to f32 accuracy;
    /// [`Context::gelu`] looks x up in an f16 table on the CPU.
    /// On the CPU it is one fused pass (`ggml::gelu`) where the tensor is contiguous f32.
    pub fn gelu_tanh_exact<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        if self.cpu_ops() && a.dtype() == GType::F32 && a.is_contiguous() {
            // SAFETY: a contiguous f32 source of the output's shape, as the op reads it.
            return unsafe { self.custom("gelu_tanh", GType::F32, a.ne(), &[a], Some(super::gelu::compute), 0) };
        }
        let x3 = self.mul(self.mul(a, a)?, a)?;
        let inner = self.scale(self.add(a, self.scale(x3, 0.044715)?)?, (2.0 / std::f32::consts::PI).sqrt())?;
        let t = self.tanh(inner)?;
        // 0.5·x·(1 + t) = 0.5·x + 0.5·x·t
        let half = self.scale(a, 0.5)?;
        self.add(half, self.mul(half, t)?)
    }

    /// GELU with the exact erf form (torch's default `nn.GELU()`).
    pub fn gelu_erf<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("gelu_erf", a, ggml_sys::ggml_gelu_erf)
    }

    /// x * sigmoid(1.702 x), CLIP's "quick_gelu". ggml's CPU kernel reads an f16 table;
    /// [`Context::gelu_quick_exact`] computes it in f32.
    pub fn gelu_quick<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("gelu_quick", a, ggml_sys::ggml_gelu_quick)
    }

    /// x * sigmoid(1.702 x) from f32 ops, for reference-exact CLIP outputs.
    pub fn gelu_quick_exact<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        let s = self.unary("sigmoid", self.scale(a, 1.702)?, ggml_sys::ggml_sigmoid)?;
        self.mul(a, s)
    }

    pub fn sigmoid<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("sigmoid", a, ggml_sys::ggml_sigmoid)
    }

    pub fn silu<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("silu", a, ggml_sys::ggml_silu)
    }

    /// max(x, 0).
    pub fn relu<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("relu", a, ggml_sys::ggml_relu)
    }

    /// x for x > 0, `negative_slope`·x otherwise (`nn.LeakyReLU`).
    pub fn leaky_relu<'a>(&'a self, a: Tensor<'a>, negative_slope: f32) -> Result<Tensor<'a>> {
        // SAFETY: reads metadata only.
        if !unsafe { ggml_sys::ggml_is_contiguous_rows(a.raw()) } {
            return Err(shape("leaky_relu", "rows must be contiguous".into()));
        }
        // SAFETY: precondition checked; not in place, so `a` stays readable.
        self.op("leaky_relu", || unsafe { ggml_sys::ggml_leaky_relu(self.raw(), a.raw(), negative_slope, false) })
    }

    pub fn tanh<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        self.unary("tanh", a, ggml_sys::ggml_tanh)
    }

    /// Sinusoidal embeddings [dim, N] of the f32 timesteps `t` [N]: cos of the
    /// frequencies first, then sin (LDM's `timestep_embedding`).
    pub fn timestep_embedding<'a>(&'a self, t: Tensor<'a>, dim: i32, max_period: i32) -> Result<Tensor<'a>> {
        let n = t.ne();
        if t.dtype() != GType::F32 || n[1] != 1 || n[2] != 1 || n[3] != 1 || dim < 2 || dim % 2 != 0 {
            return Err(shape("timestep_embedding", format!("timesteps {n:?} ({:?}) to dim {dim}", t.dtype())));
        }
        // SAFETY: preconditions checked.
        self.op("timestep_embedding", || unsafe { ggml_sys::ggml_timestep_embedding(self.raw(), t.raw(), dim, max_period) })
    }

    /// Resample an f32 tensor to new dimensions.
    pub fn interpolate<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4], mode: ScaleMode) -> Result<Tensor<'a>> {
        if a.dtype() != GType::F32 || ne.iter().any(|&d| d < 1) {
            return Err(shape("interpolate", format!("{:?} tensor to {ne:?}", a.dtype())));
        }
        // SAFETY: preconditions checked; the mode value is one ggml defines.
        self.op("interpolate", || unsafe { ggml_sys::ggml_interpolate(self.raw(), a.raw(), ne[0], ne[1], ne[2], ne[3], mode.raw()) })
    }

    /// Nearest-neighbour upscale of ne[0] and ne[1] by an integer factor.
    pub fn upscale<'a>(&'a self, a: Tensor<'a>, factor: i32) -> Result<Tensor<'a>> {
        if factor < 1 {
            return Err(shape("upscale", format!("factor {factor}")));
        }
        let n = a.ne();
        self.interpolate(a, [n[0] * factor as i64, n[1] * factor as i64, n[2], n[3]], ScaleMode::Nearest)
    }

    /// `nn.MaxPool2d(k, stride, pad)` over ne[0] and ne[1] of an f32 tensor. ggml skips
    /// window positions outside the input, which is PyTorch's -inf padding.
    pub fn max_pool_2d<'a>(&'a self, a: Tensor<'a>, k: i32, stride: i32, pad: i32) -> Result<Tensor<'a>> {
        let n = a.ne();
        let (kk, pp) = (k as i64, pad as i64);
        if a.dtype() != GType::F32 || k < 1 || stride < 1 || pad < 0 || 2 * pad > k || n[0] + 2 * pp < kk || n[1] + 2 * pp < kk {
            return Err(shape("max_pool_2d", format!("{:?} {:?} tensor with kernel {k}, stride {stride}, padding {pad}", a.dtype(), n)));
        }
        // SAFETY: preconditions checked; the op value is one ggml defines.
        self.op("max_pool_2d", || unsafe {
            ggml_sys::ggml_pool_2d(self.raw(), a.raw(), ggml_sys::GGML_OP_POOL_MAX, k, k, stride, stride, pad as f32, pad as f32)
        })
    }

    /// Zero padding: `pads[i] = (before, after)` for dimension i.
    pub fn pad<'a>(&'a self, a: Tensor<'a>, pads: [(i32, i32); 4]) -> Result<Tensor<'a>> {
        if pads.iter().any(|&(l, r)| l < 0 || r < 0) {
            return Err(shape("pad", format!("negative padding {pads:?}")));
        }
        let p = pads;
        // SAFETY: non-negative paddings.
        self.op("pad", || unsafe {
            ggml_sys::ggml_pad_ext(self.raw(), a.raw(), p[0].0, p[0].1, p[1].0, p[1].1, p[2].0, p[2].1, p[3].0, p[3].1)
        })
    }

    /// Circular padding (ggml's `ggml_pad_ext_circular`, PyTorch's `F.pad(mode="circular")`):
    /// `pads[i] = (before, after)` for dimension i, each filled with the values from the
    /// opposite end of that dimension, as if the tensor were tiled. f32 only; each padding
    /// at most the dimension's size. A native op on the CPU, CUDA, Vulkan and Metal backends.
    pub fn pad_circular<'a>(&'a self, a: Tensor<'a>, pads: [(i32, i32); 4]) -> Result<Tensor<'a>> {
        let ne = a.ne();
        if pads.iter().zip(ne).any(|(&(l, r), n)| l < 0 || r < 0 || l as i64 > n || r as i64 > n) {
            return Err(shape("pad_circular", format!("padding {pads:?} of {ne:?}: each must be between 0 and its dimension")));
        }
        if a.dtype() != GType::F32 {
            return Err(shape("pad_circular", format!("{:?} input (f32 only)", a.dtype())));
        }
        let p = pads;
        // SAFETY: paddings checked (ggml wraps indices once, so none may exceed its side).
        self.op("pad_circular", || unsafe {
            ggml_sys::ggml_pad_ext_circular(self.raw(), a.raw(), p[0].0, p[0].1, p[1].0, p[1].1, p[2].0, p[2].1, p[3].0, p[3].1)
        })
    }

    /// Spatial padding of x [W, H, ...] by `pads` ((left, right), (top, bottom)) in the
    /// mode [`Context::circular`] says per axis: wrapping around on its circular axes, zeros
    /// on the others.
    pub fn pad_spatial<'a>(&'a self, x: Tensor<'a>, pads: [(i32, i32); 2]) -> Result<Tensor<'a>> {
        let c = self.circular();
        let (cx, cy) = (c.x && pads[0] != (0, 0), c.y && pads[1] != (0, 0));
        let mut x = x;
        if cx || cy {
            let keep = |on: bool, p: (i32, i32)| if on { p } else { (0, 0) };
            x = self.pad_circular(x, [keep(cx, pads[0]), keep(cy, pads[1]), (0, 0), (0, 0)])?;
        }
        let zero = |on: bool, p: (i32, i32)| if on { (0, 0) } else { p };
        let rest = [zero(cx, pads[0]), zero(cy, pads[1])];
        if rest != [(0, 0); 2] {
            x = self.pad(x, [rest[0], rest[1], (0, 0), (0, 0)])?;
        }
        Ok(x)
    }

    pub fn concat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, dim: usize) -> Result<Tensor<'a>> {
        let (an, bn) = (a.ne(), b.ne());
        if dim > 3 || a.dtype() != b.dtype() || (0..4).any(|d| d != dim && an[d] != bn[d]) {
            return Err(shape("concat", format!("{an:?} ({:?}) and {bn:?} ({:?}) along {dim}", a.dtype(), b.dtype())));
        }
        // SAFETY: preconditions checked.
        self.op("concat", || unsafe { ggml_sys::ggml_concat(self.raw(), a.raw(), b.raw(), dim as i32) })
    }

    /// `a` tiled to `ne`: each dimension a whole multiple of `a`'s (ggml's `repeat_4d`).
    pub fn repeat<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Result<Tensor<'a>> {
        let an = a.ne();
        if (0..4).any(|d| ne[d] < 1 || ne[d] % an[d] != 0) {
            return Err(shape("repeat", format!("{an:?} to {ne:?}")));
        }
        // SAFETY: every target dimension is a whole multiple of the source's.
        self.op("repeat", || unsafe { ggml_sys::ggml_repeat_4d(self.raw(), a.raw(), ne[0], ne[1], ne[2], ne[3]) })
    }

    /// Moves source dimension i to position `axes[i]` (ggml's convention).
    pub fn permute<'a>(&'a self, a: Tensor<'a>, axes: [usize; 4]) -> Result<Tensor<'a>> {
        let mut seen = [false; 4];
        for &x in &axes {
            if x > 3 || seen[x] {
                return Err(shape("permute", format!("axes {axes:?} are not a permutation")));
            }
            seen[x] = true;
        }
        // SAFETY: axes form a permutation.
        self.op("permute", || unsafe { ggml_sys::ggml_permute(self.raw(), a.raw(), axes[0] as i32, axes[1] as i32, axes[2] as i32, axes[3] as i32) })
    }

    /// Reshape a contiguous tensor to `ne` (ggml order).
    pub fn reshape<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Result<Tensor<'a>> {
        if !a.is_contiguous() || ne.iter().any(|&d| d < 1) || ne.iter().product::<i64>() != a.n_elements() {
            return Err(shape("reshape", format!("{:?} to {ne:?}", a.ne())));
        }
        // SAFETY: contiguous, same element count.
        self.op("reshape", || unsafe { ggml_sys::ggml_reshape_4d(self.raw(), a.raw(), ne[0], ne[1], ne[2], ne[3]) })
    }

    /// A strided view into `a`; `nb` are the strides of dims 1..3 in bytes and `offset`
    /// is in bytes. Every addressed byte must lie inside `a`.
    pub fn view<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4], nb: [usize; 3], offset: usize) -> Result<Tensor<'a>> {
        if ne.iter().any(|&d| d < 1) {
            return Err(shape("view", format!("dimensions {ne:?}")));
        }
        let row = (ne[0] as usize / a.dtype().block_size()) * a.dtype().type_size();
        let last = (ne[1] as usize - 1) * nb[0] + (ne[2] as usize - 1) * nb[1] + (ne[3] as usize - 1) * nb[2] + row;
        if offset.checked_add(last).is_none_or(|end| end > a.n_bytes()) {
            return Err(shape("view", format!("view {ne:?} at {offset} leaves the {}-byte tensor", a.n_bytes())));
        }
        // SAFETY: bounds checked.
        self.op("view", || unsafe { ggml_sys::ggml_view_4d(self.raw(), a.raw(), ne[0], ne[1], ne[2], ne[3], nb[0], nb[1], nb[2], offset) })
    }

    /// Convert to another element type (f32/f16/bf16 both ways, f32 to quantized).
    pub fn cast<'a>(&'a self, a: Tensor<'a>, ty: GType) -> Result<Tensor<'a>> {
        if a.dtype() == ty {
            return Ok(a);
        }
        if ty.is_quantized() && a.ne()[0] % ty.block_size() as i64 != 0 {
            return Err(shape("cast", format!("rows of {} do not split into {ty:?} blocks", a.ne()[0])));
        }
        // SAFETY: ggml checks the type pair at compute time only for unsupported
        // combinations of quantized sources, which callers do not pass.
        self.op("cast", || unsafe { ggml_sys::ggml_cast(self.raw(), a.raw(), ty.0) })
    }

    /// Make a (permuted or viewed) tensor contiguous.
    pub fn cont<'a>(&'a self, a: Tensor<'a>) -> Result<Tensor<'a>> {
        // SAFETY: no preconditions.
        self.op("cont", || unsafe { ggml_sys::ggml_cont(self.raw(), a.raw()) })
    }

    /// Gather rows of `a` [D, R, ...] by the i32 indices in `ids` [n, ...] → [D, n, ...].
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, ids: Tensor<'a>) -> Result<Tensor<'a>> {
        let (an, bn) = (a.ne(), ids.ne());
        if ids.dtype() != GType::I32 || an[2] != bn[1] || an[3] != bn[2] || bn[3] != 1 {
            return Err(shape("get_rows", format!("a {an:?} ids {bn:?} ({:?})", ids.dtype())));
        }
        // SAFETY: preconditions checked (index values are checked by ggml at compute time).
        self.op("get_rows", || unsafe { ggml_sys::ggml_get_rows(self.raw(), a.raw(), ids.raw()) })
    }

    /// Multi-axis rotary embedding (Qwen2-VL's M-RoPE, ggml's `rope_multi`): `pos` holds
    /// four positions per row of a (`[4·ne2]`: all first axes, then all second, ...), and
    /// frequency pair k turns by the position of the axis whose section holds k. The
    /// pairs are NEOX's (i, i + n_dims/2).
    pub fn rope_multi<'a>(&'a self, a: Tensor<'a>, pos: Tensor<'a>, n_dims: i32, sections: [i32; 4], freq_base: f32) -> Result<Tensor<'a>> {
        let pn = pos.ne();
        if pos.dtype() != GType::I32 || pn[0] != 4 * a.ne()[2] || pn[1] != 1 || pn[2] != 1 || pn[3] != 1 {
            return Err(shape("rope_multi", format!("a {:?} pos {pn:?}", a.ne())));
        }
        if n_dims < 2 || n_dims as i64 > a.ne()[0] || n_dims % 2 != 0 || sections.iter().any(|&s| s < 0) || sections.iter().sum::<i32>() * 2 != n_dims {
            return Err(shape("rope_multi", format!("n_dims {n_dims}, sections {sections:?} for rows of {}", a.ne()[0])));
        }
        let mut sections = sections;
        // SAFETY: preconditions checked; ggml copies the sections into the op's parameters.
        self.op("rope_multi", || unsafe {
            ggml_sys::ggml_rope_multi(self.raw(), a.raw(), pos.raw(), std::ptr::null_mut(), n_dims, sections.as_mut_ptr(), ggml_sys::GGML_ROPE_TYPE_MROPE as i32, 0, freq_base, 1.0, 0.0, 1.0, 0.0, 0.0)
        })
    }

    /// Rotary position embedding over the first `n_dims` of ne[0]; `pos` holds one i32
    /// position per ne[2] entry. `mode` 0 is the original interleaved layout, 2 (NEOX)
    /// rotates the two halves.
    pub fn rope<'a>(&'a self, a: Tensor<'a>, pos: Tensor<'a>, n_dims: i32, mode: i32, freq_base: f32) -> Result<Tensor<'a>> {
        let pn = pos.ne();
        if pos.dtype() != GType::I32 || pn[1] != 1 || pn[2] != 1 || pn[3] != 1 || pn[0] != a.ne()[2] || mode & 1 != 0 {
            return Err(shape("rope", format!("a {:?} pos {pn:?} mode {mode}", a.ne())));
        }
        if n_dims < 2 || n_dims as i64 > a.ne()[0] || n_dims % 2 != 0 {
            return Err(shape("rope", format!("n_dims {n_dims} for rows of {}", a.ne()[0])));
        }
        // SAFETY: preconditions checked.
        self.op("rope", || unsafe {
            ggml_sys::ggml_rope_ext(self.raw(), a.raw(), pos.raw(), std::ptr::null_mut(), n_dims, mode, 0, freq_base, 1.0, 0.0, 1.0, 0.0, 0.0)
        })
    }
}

/// A computation graph; nodes are added by expanding from output tensors.
pub struct Graph<'c> {
    ptr: NonNull<ggml_sys::ggml_cgraph>,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> Graph<'c> {
    pub fn raw(&self) -> *mut ggml_sys::ggml_cgraph {
        self.ptr.as_ptr()
    }

    /// The name of the first custom (CPU-only) op in the graph, if any.
    pub(crate) fn custom_op(&self) -> Option<String> {
        (0..self.n_nodes()).find_map(|i| {
            // SAFETY: i < n_nodes; the node is a live tensor of the graph's context.
            let t = unsafe { &*ggml_sys::ggml_graph_node(self.raw(), i as i32) };
            matches!(t.op, ggml_sys::GGML_OP_CUSTOM | ggml_sys::GGML_OP_MAP_CUSTOM1 | ggml_sys::GGML_OP_MAP_CUSTOM2 | ggml_sys::GGML_OP_MAP_CUSTOM3).then(|| {
                // SAFETY: ggml tensor names are NUL-terminated arrays.
                unsafe { std::ffi::CStr::from_ptr(t.name.as_ptr()) }.to_string_lossy().into_owned()
            })
        })
    }

    /// Add `t` and everything it depends on.
    pub fn build_forward(&mut self, t: Tensor<'c>) -> Result<()> {
        // SAFETY: reads the graph's capacity.
        let (n, size) = unsafe { (ggml_sys::ggml_graph_n_nodes(self.raw()), ggml_sys::ggml_graph_size(self.raw())) };
        if n >= size {
            return Err(GgmlError::Context(format!("graph full ({size} nodes)")));
        }
        // ggml aborts if the expansion overflows; count what would be added first.
        let extra = count_new_nodes(t, size as usize);
        if n as usize + extra > size as usize {
            return Err(GgmlError::Context(format!("graph of {size} nodes too small for {} more", extra)));
        }
        // SAFETY: capacity checked.
        unsafe { ggml_sys::ggml_build_forward_expand(self.raw(), t.raw()) };
        Ok(())
    }

    pub fn n_nodes(&self) -> usize {
        // SAFETY: reads metadata.
        unsafe { ggml_sys::ggml_graph_n_nodes(self.raw()) as usize }
    }
}

/// An upper bound on the nodes `t` pulls into a graph (distinct tensors with an op),
/// stopping once it passes `limit`.
fn count_new_nodes(t: Tensor<'_>, limit: usize) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![t.raw()];
    while let Some(p) = stack.pop() {
        if p.is_null() || !seen.insert(p) || seen.len() > limit + 1 {
            continue;
        }
        // SAFETY: p points at a live tensor of the same context.
        let src = unsafe { (*p).src };
        stack.extend(src.iter().copied().filter(|s| !s.is_null()));
    }
    seen.len()
}
