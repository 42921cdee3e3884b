//! Running one graph end to end: declare inputs with their host data, build, allocate,
//! upload, compute, download the outputs.

use super::{Backend, Context, GType, GgmlError, GraphAllocator, Result, Tensor};

enum HostData {
    F32(Vec<f32>),
    I32(Vec<i32>),
    F16(Vec<u8>),
}

/// Collects a graph's inputs while model code builds it on `ctx`.
pub struct GraphRun<'a> {
    ctx: &'a Context,
    inputs: Vec<(Tensor<'a>, HostData)>,
}

impl<'a> GraphRun<'a> {
    pub fn new(ctx: &'a Context) -> Self {
        GraphRun { ctx, inputs: Vec::new() }
    }

    fn input(&mut self, ty: GType, ne: &[i64], len: usize, data: HostData) -> Result<Tensor<'a>> {
        let t = self.ctx.new_tensor(ty, ne)?.set_input();
        if t.n_elements() as usize != len {
            return Err(GgmlError::Data(format!("input {ne:?} given {len} values")));
        }
        self.inputs.push((t, data));
        Ok(t)
    }

    pub fn input_f32(&mut self, ne: &[i64], data: Vec<f32>) -> Result<Tensor<'a>> {
        let n = data.len();
        self.input(GType::F32, ne, n, HostData::F32(data))
    }

    pub fn input_i32(&mut self, ne: &[i64], data: Vec<i32>) -> Result<Tensor<'a>> {
        let n = data.len();
        self.input(GType::I32, ne, n, HostData::I32(data))
    }

    /// An f16 input given as f32 values (attention masks for flash attention).
    pub fn input_f16(&mut self, ne: &[i64], data: &[f32]) -> Result<Tensor<'a>> {
        let bytes = data.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
        self.input(GType::F16, ne, data.len(), HostData::F16(bytes))
    }

    /// Compute `outputs` (made contiguous f32 if needed) and return their values.
    pub fn compute(self, backend: &Backend, outputs: &[Tensor<'a>], graph_size: usize) -> Result<Vec<Vec<f32>>> {
        let mut alloc = GraphAllocator::new(backend)?;
        self.compute_with(backend, &mut alloc, outputs, graph_size)
    }

    /// [`GraphRun::compute`] with a caller-kept allocator: repeated graphs of the same
    /// shape (sampling steps) then reuse one compute buffer instead of allocating and
    /// faulting in a new one each time.
    pub fn compute_with(self, backend: &Backend, alloc: &mut GraphAllocator, outputs: &[Tensor<'a>], graph_size: usize) -> Result<Vec<Vec<f32>>> {
        let ctx = self.ctx;
        let mut outs = Vec::with_capacity(outputs.len());
        for &o in outputs {
            let o = if o.is_contiguous() { o } else { ctx.cont(o)? };
            if o.dtype() != GType::F32 {
                return Err(GgmlError::Data(format!("output of type {:?}; only f32 outputs are read back", o.dtype())));
            }
            outs.push(o.set_output());
        }
        let mut graph = ctx.graph(graph_size)?;
        for &o in &outs {
            graph.build_forward(o)?;
        }
        alloc.alloc(&graph)?;
        for (t, d) in &self.inputs {
            match d {
                HostData::F32(v) => t.set_f32(v)?,
                HostData::I32(v) => t.set_i32(v)?,
                HostData::F16(b) => t.set_bytes(b)?,
            }
        }
        backend.compute(&graph)?;
        // The allocator owns the outputs' memory: read them before it is reused.
        outs.iter().map(|o| o.get_f32()).collect()
    }
}
