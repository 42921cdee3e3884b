//! FLUX.1 (and Chroma, its blocks under an approximator's modulation) as a k-diffusion
//! denoiser over flow latents: `denoised = x − σ·v`, the latent packed into 2×2 patches
//! and every item's text and guidance batched into one graph.

use super::{Flux, FluxInputs};
use crate::models::chroma::{Chroma, ChromaInputs};
use crate::ggml::{Backend, Circular, Context, GraphAllocator, GraphRun};
use crate::models::dit::{crop, image_ids, in_groups, pad_to_patches, patchify, unpatchify, SkipLayers};
use crate::models::conditioning::{Conditioning, Guidance, LatentShape, ReferenceLatent, ReferenceMethod};
use crate::models::{ModelError, Result};

/// ComfyUI's guidance when no FluxGuidance set one (`model_base.Flux`), as sd-cli's
/// `--guidance` default.
pub const DEFAULT_GUIDANCE: f32 = 3.5;

/// One item of [`FluxDenoiser::denoise_batch`]: a latent (model space, [W, H, C, N]) and
/// the conditioning it is denoised under (T5 tokens, CLIP-L's pooled vector, guidance).
#[derive(Clone, Copy, Debug)]
pub struct FluxItem<'a> {
    pub x: &'a [f32],
    pub cond: &'a Conditioning,
    /// Extra input channels beside the latent ([W, H, C′, N], model space): FLUX Fill's
    /// masked image and mask ([`fill_concat`]).
    pub concat: Option<&'a [f32]>,
}

pub struct FluxDenoiser<'w> {
    model: Net<'w>,
    alloc: Option<GraphAllocator>,
    /// Blocks the calls leave out until changed (skip-layer guidance's extra pass).
    pub skip: SkipLayers,
    /// Seamless tiling (sd.cpp's `--circular*` on FLUX and Chroma): the image's (and each
    /// reference's) patch rows and columns wrap around in the rotary embedding on these
    /// axes. (The latent is already padded to whole patches by wrapping around, as
    /// ComfyUI and sd.cpp's circular mode do.)
    pub circular: Circular,
}

enum Net<'w> {
    Flux(Flux<'w>),
    Chroma(Chroma<'w>),
}

/// What the denoiser needs to know of either network.
struct Dims {
    name: &'static str,
    in_channels: i64,
    out_channels: i64,
    context: i64,
    /// The pooled vector's width (CLIP-L's); 0: the model reads none (Chroma).
    vector: i64,
    axes: usize,
    blocks: usize,
}

impl Net<'_> {
    fn dims(&self) -> Dims {
        match self {
            Net::Flux(m) => {
                let c = &m.config;
                Dims { name: "FLUX.1", in_channels: c.in_channels, out_channels: c.out_channels, context: c.context, vector: c.vector, axes: c.axes.len(), blocks: c.depth + c.depth_single }
            }
            Net::Chroma(m) => {
                let c = &m.config;
                Dims { name: "Chroma", in_channels: c.in_channels, out_channels: c.out_channels, context: c.context, vector: 0, axes: c.axes.len(), blocks: c.depth + c.depth_single + c.approx_layers }
            }
        }
    }
}

impl<'w> FluxDenoiser<'w> {
    pub fn new(model: Flux<'w>) -> Self {
        FluxDenoiser { model: Net::Flux(model), alloc: None, skip: SkipLayers::default(), circular: Circular::NONE }
    }

    pub fn chroma(model: Chroma<'w>) -> Self {
        FluxDenoiser { model: Net::Chroma(model), alloc: None, skip: SkipLayers::default(), circular: Circular::NONE }
    }

    /// The token width the model reads: latent channels (and Fill's extra ones) × 4.
    pub fn in_channels(&self) -> i64 {
        self.model.dims().in_channels
    }

    /// The token width it writes: latent channels × 4.
    pub fn out_channels(&self) -> i64 {
        self.model.dims().out_channels
    }

    /// The denoised estimate of each item at noise level `sigma`; items whose text has
    /// the same token count share one graph.
    pub fn denoise_batch(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[FluxItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = self.model.dims();
        let [w, h, ch, n] = shape;
        let per = (w * h * ch) as usize;
        if shape.iter().any(|&d| d < 1) || ch * 4 != c.out_channels {
            return Err(ModelError::Input(format!("a {shape:?} latent for a {} model of {} output features (latent channels × 4)", c.name, c.out_channels)));
        }
        let extra = c.in_channels / 4 - ch;
        for (k, it) in items.iter().enumerate() {
            let given = it.concat.map_or(0, |v| v.len());
            if given != (extra * w * h * n) as usize {
                let what = if extra > 0 { format!("this FLUX.1 model (Fill) reads {extra} channels beside the latent (the masked image and mask: InpaintModelConditioning)") } else { "this FLUX.1 model reads the latent alone".to_string() };
                return Err(ModelError::Input(format!("item {k}: {} extra input values; {what}", given)));
            }
        }
        for (k, it) in items.iter().enumerate() {
            if it.x.len() != per * n as usize {
                return Err(ModelError::Input(format!("item {k}: latent of {} values for shape {shape:?}", it.x.len())));
            }
            if it.cond.dim != c.context {
                return Err(ModelError::Input(format!("item {k}: text tokens {} wide; this {} model reads {} (T5-XXL)", it.cond.dim, c.name, c.context)));
            }
            if let Some(p) = it.cond.pooled.as_ref().filter(|_| c.vector > 0) {
                if p.len() as i64 != c.vector {
                    return Err(ModelError::Input(format!("item {k}: a pooled vector of {}; this FLUX.1 model reads {} (CLIP-L)", p.len(), c.vector)));
                }
            }
        }
        for (k, it) in items.iter().enumerate() {
            if let Some(r) = it.cond.references.iter().find(|r| r.channels != ch as usize || r.data.len() != r.channels * r.height * r.width || r.height == 0 || r.width == 0) {
                return Err(ModelError::Input(format!("item {k}: a reference latent of {} values as {}x{}x{}; this model's latents have {ch} channels", r.data.len(), r.channels, r.height, r.width)));
            }
        }
        // Items share a graph when their texts and reference latents have the same lengths.
        // Chroma's guidance feeds the modulation of the whole graph: one value per graph.
        let chroma = matches!(self.model, Net::Chroma(_));
        // So does its text mask.
        let key = |it: &FluxItem<'_>| (it.cond.tokens, it.cond.references.iter().map(|r| (r.height, r.width)).collect::<Vec<_>>(), it.cond.reference_method, if chroma { (it.cond.guidance.scale_or(0.0).map(f32::to_bits), it.cond.text_keys) } else { (Some(u32::from(it.cond.guidance == Guidance::Off)), None) });
        if extra > 0 && items.iter().any(|it| !it.cond.references.is_empty()) {
            return Err(ModelError::Input("reference latents (Kontext) on a FLUX.1 Fill model".into()));
        }
        in_groups(items, key, |members| self.run(backend, shape, sigma, members))
    }

    fn run(&mut self, backend: &Backend, shape: LatentShape, sigma: f32, items: &[FluxItem<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = self.model.dims();
        let [w0, h0, ch, n] = shape.map(|d| d as usize);
        // ComfyUI's FLUX pads a latent (and its extra channels) to whole patches by wrapping
        // around and crops the output back.
        let (h, w) = (h0.div_ceil(2) * 2, w0.div_ceil(2) * 2);
        let b = items.len() * n;
        let lt = items[0].cond.tokens as usize;
        let l = (h / 2) * (w / 2);
        // ComfyUI's Kontext: each reference latent (in model space, padded to even sizes)
        // appended to the image's tokens, with its own positions; the output keeps the image's.
        let (grid, method) = ((h / 2, w / 2), items[0].cond.reference_method.unwrap_or_default());
        let (_, ref_ids) = reference_tokens(&items[0].cond.references, method, grid, 0)?;
        let item_refs: Vec<Vec<f32>> = items.iter().map(|it| reference_tokens(&it.cond.references, method, grid, ch).map(|r| r.0)).collect::<Result<_>>()?;
        let lr = ref_ids.len();
        let cin = c.in_channels as usize / 4;
        let mut img = Vec::with_capacity(b * cin * 4 * (l + lr));
        let mut txt = Vec::with_capacity(b * lt * c.context as usize);
        let mut y = Vec::with_capacity(b * c.vector as usize);
        let mut guidance = Vec::with_capacity(b);
        for (it, r) in items.iter().zip(&item_refs) {
            for j in 0..n {
                let per = ch * h0 * w0;
                let sample = &it.x[j * per..(j + 1) * per];
                // The extra channels follow the latent's, as ComfyUI concatenates before
                // cutting patches.
                let joined: Vec<f32> = match it.concat {
                    Some(extra) => {
                        let e = extra.len() / n;
                        sample.iter().chain(&extra[j * e..(j + 1) * e]).copied().collect()
                    }
                    None => sample.to_vec(),
                };
                let planes = joined.len() / (h0 * w0);
                let (padded, _, _) = pad_to_patches(&joined, [planes, h0, w0], 2);
                img.extend(patchify(&padded, [1, planes, h, w], 2)?);
                img.extend_from_slice(r);
                txt.extend_from_slice(&it.cond.data);
                match &it.cond.pooled {
                    _ if c.vector == 0 => {}
                    Some(p) => y.extend_from_slice(p),
                    // ComfyUI's FLUX without a pooled vector (a T5-only encoder): zeros.
                    None => y.extend(std::iter::repeat_n(0.0, c.vector as usize)),
                }
                guidance.push(it.cond.guidance.scale_or(DEFAULT_GUIDANCE).unwrap_or(0.0));
            }
        }
        let img_ids: Vec<Vec<f32>> = image_ids(h / 2, w / 2, 0.0).into_iter().map(|a| a.to_vec()).chain(ref_ids).collect();
        let txt_ids = vec![vec![0.0; c.axes]; lt];
        let img_wrap = wrap_periods(self.circular, c.axes, (h / 2, w / 2), &items[0].cond.references);
        let timesteps = vec![sigma; b];
        let graph_size = 512 * c.blocks + 1024;
        let ctx = Context::new(graph_size * 4, graph_size)?;
        let mut run = GraphRun::new(&ctx);
        let (bi, li) = (b as i64, (l + lr) as i64);
        let img_t = run.input_f32(&[c.in_channels, li, bi], img)?;
        let txt_t = run.input_f32(&[c.context, lt as i64, bi], txt)?;
        let v = match &self.model {
            Net::Flux(m) => {
                let y_t = run.input_f32(&[c.vector, bi], y)?;
                // Off for the whole group (a grouping key): no guidance embedding.
                let guidance = (items[0].cond.guidance != Guidance::Off).then_some(&guidance[..]);
                let inputs = FluxInputs { img: img_t, img_ids: &img_ids, img_wrap: &img_wrap, txt: txt_t, txt_ids: &txt_ids, timesteps: &timesteps, guidance, y: y_t, skip: &self.skip };
                m.forward(&ctx, &mut run, &inputs)?
            }
            // Chroma: guidance 0 unless set; a text mask where the prompt carries one
            // (sd.cpp's), none in ComfyUI's.
            Net::Chroma(m) => {
                let guidance = items[0].cond.guidance.scale_or(0.0).unwrap_or(0.0);
                m.forward(&ctx, &mut run, &ChromaInputs { img: img_t, img_ids: &img_ids, img_wrap: &img_wrap, txt: txt_t, txt_ids: &txt_ids, sigma, guidance, text_keys: items[0].cond.text_keys, skip: &self.skip })?
            }
        };
        let alloc = match &mut self.alloc {
            Some(a) => a,
            None => self.alloc.insert(GraphAllocator::new(backend)?),
        };
        let v = run.compute_with(backend, alloc, &[v], graph_size)?.remove(0);
        // The image's tokens of each sequence, without the references'.
        let f = ch * 4;
        let v: Vec<f32> = v.chunks_exact(f * (l + lr)).flat_map(|s| s[..f * l].iter().copied()).collect();
        let v = unpatchify(&v, [b, ch, h, w], 2)?;
        let v: Vec<f32> = if (h, w) == (h0, w0) { v } else { v.chunks_exact(ch * h * w).flat_map(|s| crop(s, [ch, h, w], h0, w0)).collect() };
        let per = n * ch * h0 * w0;
        Ok(items
            .iter()
            .enumerate()
            .map(|(k, it)| it.x.iter().zip(&v[k * per..(k + 1) * per]).map(|(x, v)| x - sigma * v).collect())
            .collect())
    }
}

/// The rotary wrap periods of the image's tokens (a `grid` of patch rows × columns) and
/// then of each reference's, as sd.cpp's `gen_flux_pe` sets them for circular axes: each
/// image's own rows on the row axis (1) and columns on the column axis (2), nothing on the
/// index axis; empty when no axis is circular (or the model has fewer than 3 axes).
pub fn wrap_periods(circular: Circular, axes: usize, grid: (usize, usize), refs: &[std::sync::Arc<ReferenceLatent>]) -> Vec<Vec<usize>> {
    if !circular.any() || axes < 3 {
        return Vec::new();
    }
    let grids = std::iter::once(grid).chain(refs.iter().map(|r| (r.height.div_ceil(2), r.width.div_ceil(2))));
    let mut out = Vec::new();
    for (rows, cols) in grids {
        let mut period = vec![0; axes];
        period[1] = if circular.y { rows } else { 0 };
        period[2] = if circular.x { cols } else { 0 };
        out.extend(std::iter::repeat_n(period, rows * cols));
    }
    out
}

/// FLUX Fill's extra input channels for one sample (ComfyUI's `Flux.concat_cond`,
/// diffusers' `FluxFillPipeline.prepare_mask_latents`): the masked image's latent in model
/// space (`image`, [C, H, W]), then the mask at pixel resolution (`mask`, [8H, 8W]) cut
/// into 8×8 cells, one plane per position in the cell (row-major): [C + 64, H, W].
pub fn fill_concat(image: &[f32], channels: usize, mask: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
    if image.len() != channels * h * w || mask.len() != 64 * h * w {
        return Err(ModelError::Input(format!("a masked image of {} values and a mask of {} for a {channels}×{h}×{w} latent (the mask at 8× its size)", image.len(), mask.len())));
    }
    let mut out = Vec::with_capacity((channels + 64) * h * w);
    out.extend_from_slice(image);
    for dy in 0..8 {
        for dx in 0..8 {
            out.extend((0..h).flat_map(|y| (0..w).map(move |x| (y, x))).map(|(y, x)| mask[(y * 8 + dy) * w * 8 + x * 8 + dx]));
        }
    }
    Ok(out)
}

/// FLUX's VAE latent format (ComfyUI's `latent_formats.Flux`): the model sees
/// `(latent − LATENT_SHIFT) · LATENT_SCALE`.
pub const LATENT_SCALE: f32 = 0.3611;
pub const LATENT_SHIFT: f32 = 0.1159;

/// The tokens of `refs` (model space, 2×2 patches, one reference after another) and their
/// position ids as ComfyUI places them by `method` beside an image of `grid` (rows,
/// columns) patches: `Offset` (the default) gives index 1 and puts each reference below or
/// right of those before it, whichever keeps the covered area squarer; `Index` numbers
/// them 1, 2, … at the origin (`NegativeIndex` −1, −2, …); `Uxo` gives index 0 and moves each past the image and the
/// references before it, diagonally; `OffsetLatent` is `Offset` without the offsets'
/// conversion to patches (sd.cpp's). With `channels` 0 only the ids are made.
pub fn reference_tokens(refs: &[std::sync::Arc<ReferenceLatent>], method: ReferenceMethod, grid: (usize, usize), channels: usize) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
    let (mut tokens, mut ids) = (Vec::new(), Vec::new());
    let (mut h, mut w) = (0usize, 0usize);
    let mut index = 0.0f32;
    for r in refs {
        // Offsets in latent pixels, then in patches as ComfyUI's `process_img` rounds them.
        let (h_off, w_off) = match method {
            // FLUX.1 has no per-token timestep: the placement is index's.
            ReferenceMethod::Index | ReferenceMethod::IndexTimestepZero => {
                index += 1.0;
                (0, 0)
            }
            ReferenceMethod::NegativeIndex => {
                index -= 1.0;
                (0, 0)
            }
            ReferenceMethod::Uxo => {
                index = 0.0;
                let o = (grid.0 * 2 + h, grid.1 * 2 + w);
                h += r.height;
                w += r.width;
                o
            }
            ReferenceMethod::Offset | ReferenceMethod::OffsetLatent => {
                index = 1.0;
                let o = if r.height + h > r.width + w { (0, w) } else { (h, 0) };
                h = h.max(r.height + o.0);
                w = w.max(r.width + o.1);
                o
            }
        };
        let (rows, cols) = (r.height.div_ceil(2), r.width.div_ceil(2));
        let (dr, dc) = if method == ReferenceMethod::OffsetLatent { (h_off, w_off) } else { (h_off.div_ceil(2), w_off.div_ceil(2)) };
        ids.extend(image_ids(rows, cols, index).into_iter().map(|[i, y, x]| vec![i, y + dr as f32, x + dc as f32]));
        if channels > 0 {
            let (padded, _, _) = pad_to_patches(&r.data, [r.channels, r.height, r.width], 2);
            let scaled: Vec<f32> = padded.iter().map(|v| (v - LATENT_SHIFT) * LATENT_SCALE).collect();
            tokens.extend(patchify(&scaled, [1, r.channels, rows * 2, cols * 2], 2)?);
        }
    }
    Ok((tokens, ids))
}
