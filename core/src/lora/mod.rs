//! LoRA and LyCORIS patches, merged into a model's weights.
//!
//! A patch file (safetensors, pickle or GGUF) holds, per patched module, the factors of a
//! weight difference: LoRA `up`·`down` (kohya `lora_up`/`lora_down`, diffusers
//! `lora.up`/`lora.down`, PEFT `lora_B`/`lora_A`), optionally LoCon's Tucker `lora_mid`;
//! LoHa's Hadamard product of two low-rank products (`hada_*`); LoKr's Kronecker product
//! (`lokr_*`); or a full difference (`diff`, `diff_b` for the bias). `alpha` scales the
//! low-rank kinds by `alpha / rank`. The formulas are ComfyUI's (`comfy/weight_adapter`),
//! computed in f32 like it does: `w' = w + strength · scale · Δ`, then stored back in the
//! weight's own type.
//!
//! [`apply`] in [`ApplyMode::AtRuntime`] keeps LoRA and LoCon modules out of the weights:
//! their factors become low-rank branches that the layers add when a graph is built.
//!
//! [`merge`] returns an overlay [`Weights`]: it owns only the patched tensors and shares
//! every other one with the (pinned) base, so several strengths of one LoRA cost one copy
//! of the checkpoint plus the patched tensors each.
//!
//! Nothing here panics on a bad file: a module whose parts are missing or whose shapes do
//! not fit the weight it maps to is skipped with one warning line, and counted.

pub mod keys;
pub mod synth;

use std::collections::BTreeMap;
use std::path::Path;

use crate::dtype::{self, ConvertError, DType};
use crate::io::{IoError, TensorSource};
use crate::models::{AdapterSpec, Factor, ModelError, Weights};
use crate::residency::PinGuard;

pub use keys::{KeyMap, Target};

#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{path}: tensor `{name}`: {source}")]
    Convert {
        path: String,
        name: String,
        #[source]
        source: ConvertError,
    },
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("unknown LoRA apply mode `{0}` (auto, immediately or at_runtime)")]
    Mode(String),
}

/// An f32 tensor in PyTorch dimension order.
#[derive(Debug, Clone)]
pub struct Mat {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Mat {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn dim(&self, i: usize) -> usize {
        self.shape.get(i).copied().unwrap_or(1)
    }
    /// Rows = dim 0, columns = everything else (`flatten(start_dim=1)`).
    fn cols(&self) -> usize {
        self.numel() / self.dim(0).max(1)
    }
}

/// The parts of one patched module, by suffix (`lora_up.weight`, `hada_w1_a`, `alpha`, ...),
/// normalized to kohya's names.
#[derive(Debug, Default)]
struct Parts(BTreeMap<&'static str, Mat>);

/// Suffixes of patch tensors → the part they are (`None`: known but unsupported).
const SUFFIXES: &[(&str, Option<&str>)] = &[
    (".lora_up.weight", Some("up")),
    (".lora_down.weight", Some("down")),
    (".lora_mid.weight", Some("mid")),
    (".lora_B.weight", Some("up")),
    (".lora_A.weight", Some("down")),
    (".lora.up.weight", Some("up")),
    (".lora.down.weight", Some("down")),
    ("_lora.up.weight", Some("up")),
    ("_lora.down.weight", Some("down")),
    (".lora_linear_layer.up.weight", Some("up")),
    (".lora_linear_layer.down.weight", Some("down")),
    (".alpha", Some("alpha")),
    (".hada_w1_a", Some("hada_w1_a")),
    (".hada_w1_b", Some("hada_w1_b")),
    (".hada_w2_a", Some("hada_w2_a")),
    (".hada_w2_b", Some("hada_w2_b")),
    (".hada_t1", Some("hada_t1")),
    (".hada_t2", Some("hada_t2")),
    (".lokr_w1", Some("lokr_w1")),
    (".lokr_w1_a", Some("lokr_w1_a")),
    (".lokr_w1_b", Some("lokr_w1_b")),
    (".lokr_w2", Some("lokr_w2")),
    (".lokr_w2_a", Some("lokr_w2_a")),
    (".lokr_w2_b", Some("lokr_w2_b")),
    (".lokr_t2", Some("lokr_t2")),
    (".diff", Some("diff")),
    (".diff_b", Some("diff_b")),
    (".dora_scale", None),
    (".w_norm", None),
    (".b_norm", None),
    (".on_input", None),
    (".set_weight", None),
];

/// A parsed patch file: its modules by LoRA key.
#[derive(Debug)]
pub struct LoraFile {
    pub path: String,
    modules: BTreeMap<String, Parts>,
    /// Tensors whose names no known patch format uses.
    pub unknown: Vec<String>,
    /// Modules using parts we do not implement (DoRA's `dora_scale`, norm patches, ...).
    unsupported: BTreeMap<String, &'static str>,
}

impl LoraFile {
    /// Reads every tensor of `src` as f32 and groups them by module.
    pub fn read(src: &dyn TensorSource) -> Result<Self, LoraError> {
        Self::read_renamed(src, &|n| Some(n.to_string()))
    }

    /// [`LoraFile::read`] of the tensors `rename` keeps, under the names it gives: the
    /// LoRA part of a file that bundles one with other weights (PhotoMaker's
    /// `lora_weights.*`).
    pub fn read_renamed(src: &dyn TensorSource, rename: &dyn Fn(&str) -> Option<String>) -> Result<Self, LoraError> {
        let path = src.path().display().to_string();
        let mut modules: BTreeMap<String, Parts> = BTreeMap::new();
        let mut unknown = Vec::new();
        let mut unsupported = BTreeMap::new();
        let mut kept = 0;
        for info in src.tensors() {
            let Some(name) = rename(&info.name) else { continue };
            kept += 1;
            let Some((module, suffix, part)) = classify(&name) else {
                unknown.push(name);
                continue;
            };
            let module = module.to_string();
            let Some(part) = part else {
                unsupported.insert(module, suffix.trim_start_matches('.'));
                continue;
            };
            let bytes = src.read(&info.name)?;
            let n = info.n_elements();
            let data = dtype::to_f32(info.dtype, &bytes, n).map_err(|source| LoraError::Convert { path: path.clone(), name: info.name.clone(), source })?;
            modules.entry(module).or_default().0.insert(part, Mat { shape: info.shape.clone(), data });
        }
        if modules.is_empty() && unsupported.is_empty() {
            return Err(LoraError::File { path, msg: format!("no LoRA tensors (none of {kept} tensors has a LoRA/LyCORIS name)") });
        }
        Ok(LoraFile { path, modules, unknown, unsupported })
    }

    /// Checks from the names alone (no tensor data is read) that `src` is a patch file:
    /// a node can refuse a checkpoint picked by mistake before anything loads. Returns the
    /// number of patch tensors.
    pub fn check(src: &dyn TensorSource) -> Result<usize, LoraError> {
        let n = src.tensors().iter().filter(|t| classify(&t.name).is_some()).count();
        if n == 0 {
            return Err(LoraError::File { path: src.path().display().to_string(), msg: format!("no LoRA tensors (none of {} tensors has a LoRA/LyCORIS name)", src.tensors().len()) });
        }
        Ok(n)
    }

    /// Opens and reads the file at `path` (any format `io::open` reads).
    pub fn open(path: &Path) -> Result<Self, LoraError> {
        let src = crate::io::open(path)?;
        Self::read(src.as_ref())
    }

    /// Module names, as in the file.
    pub fn module_names(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(|s| s.as_str())
    }
}

/// `(module, suffix, part)` of a patch tensor's name. Longest suffix first: `.diff_b` must
/// not be read as `.diff` + `_b`, nor `.lora.up.weight` as `_lora.up.weight`.
fn classify(name: &str) -> Option<(&str, &'static str, Option<&'static str>)> {
    let &(suffix, part) = SUFFIXES.iter().filter(|(s, _)| name.ends_with(s) && name.len() > s.len()).max_by_key(|(s, _)| s.len())?;
    Some((&name[..name.len() - suffix.len()], suffix, part))
}

/// Which modules of a file belong to the text encoder (the rest to the diffusion model),
/// so each side reports only its own unmatched keys.
pub fn is_text_encoder_key(key: &str) -> bool {
    ["lora_te", "text_encoder", "te.", "te_", "te1.", "te2.", "text_encoders.", "cond_stage_model.", "conditioner.", "text_model."].iter().any(|p| key.starts_with(p))
}

/// Whether a text-encoder key names SDXL's second encoder (OpenCLIP-G).
fn is_second_encoder_key(key: &str) -> bool {
    ["lora_te2_", "text_encoder_2.", "te2.", "conditioner.embedders.1."].iter().any(|p| key.starts_with(p))
}

/// How a LoRA reaches the model: sd.cpp's `--lora-apply-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApplyMode {
    /// `at_runtime` when any weight is quantized, else `immediately` (sd.cpp's rule,
    /// asked per model here: the UNet and the text encoder each by their own weights).
    #[default]
    Auto,
    /// Merged into copies of the patched weights: nothing extra per step, but a quantized
    /// weight is dequantized, patched and quantized again, which blurs a small difference.
    Immediately,
    /// LoRA and LoCon as low-rank branches in the graph (`nn::project`, `nn::conv2d`): the
    /// weights stay the checkpoint's, at the price of two thin products per patched layer.
    /// LoHa, LoKr and full differences have no low-rank form and are still merged.
    AtRuntime,
}

impl ApplyMode {
    pub const NAMES: [&'static str; 3] = ["auto", "immediately", "at_runtime"];

    pub fn name(self) -> &'static str {
        match self {
            ApplyMode::Auto => "auto",
            ApplyMode::Immediately => "immediately",
            ApplyMode::AtRuntime => "at_runtime",
        }
    }

    /// The mode used for `base`: `Auto` decided by its weight types.
    pub fn resolve(self, base: &Weights) -> ApplyMode {
        match self {
            ApplyMode::Auto if base.is_quantized() => ApplyMode::AtRuntime,
            ApplyMode::Auto => ApplyMode::Immediately,
            m => m,
        }
    }
}

impl std::str::FromStr for ApplyMode {
    type Err = LoraError;
    fn from_str(s: &str) -> Result<Self, LoraError> {
        match s {
            "auto" => Ok(ApplyMode::Auto),
            "immediately" => Ok(ApplyMode::Immediately),
            "at_runtime" => Ok(ApplyMode::AtRuntime),
            _ => Err(LoraError::Mode(s.to_string())),
        }
    }
}

/// What a merge did.
#[derive(Debug, Default, Clone)]
pub struct MergeReport {
    /// The mode applied (`Auto` resolved).
    pub mode: ApplyMode,
    /// Patches applied (a module's weight and its bias count apart).
    pub applied: usize,
    /// Of those, the ones added as runtime branches instead of merged.
    pub at_runtime: usize,
    /// One line per module that was skipped, with why.
    pub skipped: Vec<String>,
    /// Tensors of this side whose names no patch format uses, each skipped.
    pub unknown: Vec<String>,
    /// Weights the overlay owns.
    pub patched_weights: usize,
}

/// Which modules of the file a merge considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    DiffusionModel,
    /// The text encoder (SDXL: the first, CLIP-L).
    TextEncoder,
    /// SDXL's second text encoder (OpenCLIP-G): `lora_te2_` / `text_encoder_2.` keys.
    TextEncoder2,
}

impl Side {
    fn owns(self, key: &str) -> bool {
        match self {
            Side::DiffusionModel => !is_text_encoder_key(key),
            Side::TextEncoder => is_text_encoder_key(key) && !is_second_encoder_key(key),
            Side::TextEncoder2 => is_text_encoder_key(key) && is_second_encoder_key(key),
        }
    }
}

/// What applying a file to one model takes: whole-weight differences to merge (f32,
/// PyTorch order, whole weights, already × strength × scale) and runtime branches.
#[derive(Default)]
struct Plan {
    deltas: BTreeMap<String, Vec<f32>>,
    adapters: Vec<AdapterSpec>,
}

/// The plan for `lora` on the model whose weights are `base`. With `runtime`, every
/// plain LoRA / LoCon module that fits its weight becomes a branch; the rest are merged.
fn plan(base: &Weights, lora: &LoraFile, side: Side, strength: f32, runtime: bool, report: &mut MergeReport) -> Plan {
    let names: Vec<&str> = base.names().collect();
    let km = KeyMap::new(names.iter().copied(), |n| base.get(n).map(|t| t.ne()[ne_len(t.ne()) - 1] as usize).unwrap_or(0));
    let mut plan = Plan::default();
    let skip = |report: &mut MergeReport, msg: String| {
        tracing::warn!("LoRA {}: {msg}", lora.path);
        report.skipped.push(msg);
    };
    // A stray tensor is reported by the side its name points at, so a LoRA merged into
    // both the model and the text encoder names it once.
    for name in lora.unknown.iter().filter(|n| side.owns(n)) {
        tracing::warn!("LoRA {}: tensor `{name}` has no LoRA/LyCORIS name; skipped", lora.path);
        report.unknown.push(name.clone());
    }
    for (module, what) in &lora.unsupported {
        if side.owns(module) {
            skip(report, format!("{module}: `{what}` patches are not supported; skipped"));
        }
    }
    for (module, parts) in &lora.modules {
        if !side.owns(module) || lora.unsupported.contains_key(module) {
            continue;
        }
        let weight_target = km.get(module);
        // A bias difference patches the module's bias, which the key map (built from
        // `.weight` names) reaches through the weight.
        let mut todo: Vec<(Target, Result<Mat, String>)> = Vec::new();
        let main: Vec<&str> = parts.0.keys().copied().filter(|p| *p != "diff_b").collect();
        if !main.is_empty() {
            match weight_target {
                Some(t) => {
                    // A module with no runtime form falls through to the merge, which
                    // also words what is wrong with a broken one.
                    let branch = if runtime { base.get(&t.weight).ok().and_then(|w| low_rank(parts, t, w.ne(), strength).ok()) } else { None };
                    match branch {
                        Some(a) => {
                            plan.adapters.push(a);
                            report.applied += 1;
                            report.at_runtime += 1;
                        }
                        None => todo.push((t.clone(), base.get(&t.weight).map_err(|e| e.to_string()).and_then(|w| delta(parts, w.n_elements() as usize)))),
                    }
                }
                None => {
                    skip(report, format!("{module}: no weight of this model has that name; skipped"));
                    continue;
                }
            }
        }
        if let Some(db) = parts.0.get("diff_b") {
            let bias = weight_target.and_then(|t| t.weight.strip_suffix(".weight").map(|b| Target { weight: format!("{b}.bias"), rows: t.rows }));
            match bias {
                Some(t) if base.contains(&t.weight) => todo.push((t, Ok(db.clone()))),
                _ => skip(report, format!("{module}.diff_b: no bias of this model has that name; skipped")),
            }
        }
        for (target, d) in todo {
            let d = match d {
                Ok(d) => d,
                Err(e) => {
                    skip(report, format!("{module}: {e}; skipped"));
                    continue;
                }
            };
            let Ok(t) = base.get(&target.weight) else { continue };
            let ne = t.ne();
            let total: usize = ne.iter().map(|&x| x as usize).product();
            let rows_all = ne[ne_len(ne) - 1] as usize;
            let inner = total / rows_all.max(1);
            let (first, rows) = target.rows.unwrap_or((0, rows_all));
            if d.numel() != rows * inner {
                let shape: Vec<i64> = ne[..ne_len(ne)].iter().rev().copied().collect();
                skip(report, format!("{module}: the patch has {:?} ({} values) but `{}` is {shape:?}{}; skipped", d.shape, d.numel(), target.weight, target.rows.map_or(String::new(), |(a, n)| format!(" rows {a}..{}", a + n))));
                continue;
            }
            let acc = plan.deltas.entry(target.weight.clone()).or_insert_with(|| vec![0.0; total]);
            for (a, v) in acc[first * inner..(first + rows) * inner].iter_mut().zip(&d.data) {
                *a += strength * v;
            }
            report.applied += 1;
        }
    }
    plan
}

/// Number of meaningful ggml dimensions (at least 1).
fn ne_len(ne: [i64; 4]) -> usize {
    (1..=4).rev().find(|&i| ne[i - 1] != 1).unwrap_or(1)
}

/// A plain LoRA or LoCon module as a runtime branch for the weight of dimensions `ne`
/// (ggml order), its factors laid out as `nn::project` / `nn::conv2d` use them; or why it
/// has none. A weight whose outer two dimensions are 1 is a linear layer's, any other
/// a convolution kernel.
fn low_rank(parts: &Parts, target: &Target, ne: [i64; 4], strength: f32) -> Result<AdapterSpec, String> {
    let p = &parts.0;
    if p.keys().any(|k| k.starts_with("hada_") || k.starts_with("lokr_")) {
        return Err("not a LoRA".into());
    }
    let up = need(parts, "LoRA", "up")?;
    let down = need(parts, "LoRA", "down")?;
    let rank = down.dim(0);
    if rank == 0 {
        return Err("rank 0".into());
    }
    let scale = strength * scalar(parts, "alpha").map_or(1.0, |a| a / rank as f32);
    let conv = ne[2] != 1 || ne[3] != 1;
    let (kw, kh, inp, all_out) = if conv { (ne[0], ne[1], ne[2], ne[3]) } else { (1, 1, ne[0], ne[1]) };
    let out = target.rows.map_or(all_out, |(_, n)| n as i64);
    let factor = |m: &Mat, ne: Vec<i64>| -> Result<Factor, String> {
        if m.numel() as i64 != ne.iter().product::<i64>() {
            return Err(format!("{:?} does not fit {ne:?}", m.shape));
        }
        if m.data.iter().any(|x| !x.is_finite()) {
            return Err("NaN or infinite values".into());
        }
        Ok(Factor { ne, data: m.data.clone() })
    };
    let r = rank as i64;
    let (down, mid, r_out) = match p.get("mid") {
        None if conv => (factor(down, vec![kw, kh, inp, r])?, None, r),
        None => (factor(down, vec![inp, r])?, None, r),
        Some(m) if conv && m.shape.len() == 4 && m.shape[1] == rank && m.shape[2] as i64 == kh && m.shape[3] as i64 == kw => {
            let r2 = m.shape[0] as i64;
            (factor(down, vec![1, 1, inp, r])?, Some(factor(m, vec![kw, kh, r, r2])?), r2)
        }
        Some(m) => return Err(format!("Tucker core {:?} does not fit", m.shape)),
    };
    if up.dim(0) as i64 != out || up.cols() as i64 != r_out {
        return Err(format!("`up` {:?} is not [{out}, {r_out}]", up.shape));
    }
    let up = factor(up, if conv { vec![1, 1, r_out, out] } else { vec![r_out, out] })?;
    Ok(AdapterSpec { target: target.weight.clone(), down, mid, up, scale, rows: target.rows })
}

/// `base` with `lora` merged at `strength`: an overlay owning only the patched tensors.
pub fn merge(base: PinGuard<Weights>, lora: &LoraFile, side: Side, strength: f32) -> Result<(Weights, MergeReport), LoraError> {
    apply(base, lora, side, strength, ApplyMode::Immediately)
}

/// `base` with `lora` applied at `strength` in `mode`: an overlay owning the merged
/// tensors and the runtime branches' factors, sharing every other tensor with `base`.
pub fn apply(base: PinGuard<Weights>, lora: &LoraFile, side: Side, strength: f32, mode: ApplyMode) -> Result<(Weights, MergeReport), LoraError> {
    let mode = mode.resolve(&base);
    let mut report = MergeReport { mode, ..Default::default() };
    let Plan { deltas, adapters } = plan(&base, lora, side, strength, mode == ApplyMode::AtRuntime, &mut report);
    let mut patched = Vec::with_capacity(deltas.len());
    for (name, d) in deltas {
        let t = base.get(&name)?;
        let ty = DType::from_ggml(t.dtype().0).ok_or_else(|| ModelError::Weight { name: name.clone(), detail: "unknown ggml type".into() })?;
        let n = t.n_elements() as usize;
        let bytes = t.get_bytes().map_err(ModelError::from)?;
        let conv = |e: ConvertError| LoraError::Convert { path: lora.path.clone(), name: name.clone(), source: e };
        let mut w = dtype::to_f32(ty, &bytes, n).map_err(conv)?;
        for (x, d) in w.iter_mut().zip(&d) {
            *x += d;
        }
        let out = dtype::from_f32(&w, t.ne()[0] as usize, ty).map_err(conv)?;
        patched.push((name, out));
    }
    report.patched_weights = patched.len();
    match (report.skipped.len(), report.unknown.len()) {
        (0, 0) => {}
        (s, 0) => tracing::warn!("LoRA {}: {s} of {} modules skipped", lora.path, report.applied + s),
        (s, u) => tracing::warn!("LoRA {}: {s} of {} modules skipped, and {u} tensors with unrecognised names", lora.path, report.applied + s),
    }
    if mode == ApplyMode::AtRuntime && report.applied > report.at_runtime {
        tracing::warn!(
            "LoRA {}: {} patches (LoHa, LoKr, full differences, biases, or factors that do not fit a branch) have no low-rank form and are merged into the weights, also at runtime",
            lora.path,
            report.applied - report.at_runtime
        );
    }
    Ok((Weights::patched(base, patched, adapters)?, report))
}

// ---- The formulas (ComfyUI's weight adapters). ----

/// Refuses a product bigger than the weight it is for before allocating it: such a patch
/// cannot fit anyway, and a hostile file could otherwise ask for terabytes.
fn fits(what: &str, shape: &[usize], limit: usize) -> Result<(), String> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match n {
        Some(n) if n <= limit => Ok(()),
        _ => Err(format!("{what}: the product would be {shape:?}, larger than the weight ({limit} values)")),
    }
}

/// `a @ b` with both flattened to 2-D (`flatten(start_dim=1)`).
fn mm(a: &Mat, b: &Mat, what: &str, limit: usize) -> Result<Mat, String> {
    let (m, k) = (a.dim(0), a.cols());
    let (k2, n) = (b.dim(0), b.cols());
    if k != k2 {
        return Err(format!("{what}: cannot multiply {:?} by {:?}", a.shape, b.shape));
    }
    fits(what, &[m, n], limit)?;
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a.data[i * k + p];
            if av == 0.0 {
                continue;
            }
            let row = &b.data[p * n..(p + 1) * n];
            for (o, bv) in out[i * n..(i + 1) * n].iter_mut().zip(row) {
                *o += av * bv;
            }
        }
    }
    Ok(Mat { shape: vec![m, n], data: out })
}

/// `einsum("i j k l, j r, i p -> p r k l", t, wb, wa)`: a Tucker core with its two factors.
fn tucker(t: &Mat, wb: &Mat, wa: &Mat, what: &str, limit: usize) -> Result<Mat, String> {
    if t.shape.len() != 4 || wb.shape.len() != 2 || wa.shape.len() != 2 || wb.shape[0] != t.shape[1] || wa.shape[0] != t.shape[0] {
        return Err(format!("{what}: Tucker core {:?} does not fit factors {:?} and {:?}", t.shape, wb.shape, wa.shape));
    }
    let (i_n, j_n, k_n, l_n) = (t.shape[0], t.shape[1], t.shape[2], t.shape[3]);
    let (r_n, p_n) = (wb.shape[1], wa.shape[1]);
    fits(what, &[p_n, r_n, k_n, l_n], limit)?;
    fits(what, &[i_n, r_n, k_n, l_n], limit)?;
    let kl = k_n * l_n;
    // First contract j: u[i, r, kl] = Σ_j t[i, j, kl] wb[j, r].
    let mut u = vec![0f32; i_n * r_n * kl];
    for i in 0..i_n {
        for j in 0..j_n {
            for r in 0..r_n {
                let w = wb.data[j * r_n + r];
                let src = &t.data[(i * j_n + j) * kl..(i * j_n + j + 1) * kl];
                let dst = &mut u[(i * r_n + r) * kl..(i * r_n + r + 1) * kl];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += w * s;
                }
            }
        }
    }
    let mut out = vec![0f32; p_n * r_n * kl];
    for p in 0..p_n {
        for i in 0..i_n {
            let w = wa.data[i * p_n + p];
            for (d, s) in out[p * r_n * kl..(p + 1) * r_n * kl].iter_mut().zip(&u[i * r_n * kl..(i + 1) * r_n * kl]) {
                *d += w * s;
            }
        }
    }
    Ok(Mat { shape: vec![p_n, r_n, k_n, l_n], data: out })
}

/// `torch.kron` of two tensors of the same rank (up to 4).
fn kron(a: &Mat, b: &Mat, limit: usize) -> Result<Mat, String> {
    if a.shape.len() != b.shape.len() || a.shape.is_empty() || a.shape.len() > 4 {
        return Err(format!("LoKr: cannot take the Kronecker product of {:?} and {:?}", a.shape, b.shape));
    }
    let n = a.shape.len();
    let pad = |s: &[usize]| {
        let mut v = vec![1usize; 4 - n];
        v.extend_from_slice(s);
        v
    };
    let (sa, sb) = (pad(&a.shape), pad(&b.shape));
    let so: Vec<usize> = (0..4).map(|i| sa[i].saturating_mul(sb[i])).collect();
    fits("LoKr", &so, limit)?;
    let mut out = vec![0f32; so.iter().product()];
    let idx = |s: &[usize], i: [usize; 4]| ((i[0] * s[1] + i[1]) * s[2] + i[2]) * s[3] + i[3];
    for a0 in 0..sa[0] {
        for a1 in 0..sa[1] {
            for a2 in 0..sa[2] {
                for a3 in 0..sa[3] {
                    let av = a.data[idx(&sa, [a0, a1, a2, a3])];
                    for b0 in 0..sb[0] {
                        for b1 in 0..sb[1] {
                            for b2 in 0..sb[2] {
                                for b3 in 0..sb[3] {
                                    let o = [a0 * sb[0] + b0, a1 * sb[1] + b1, a2 * sb[2] + b2, a3 * sb[3] + b3];
                                    out[idx(&so, o)] = av * b.data[idx(&sb, [b0, b1, b2, b3])];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(Mat { shape: so[4 - n..].to_vec(), data: out })
}

fn scalar(parts: &Parts, name: &str) -> Option<f32> {
    parts.0.get(name).and_then(|m| m.data.first().copied())
}

fn need<'a>(parts: &'a Parts, kind: &str, name: &str) -> Result<&'a Mat, String> {
    parts.0.get(name).ok_or_else(|| format!("{kind} patch lacks `{name}`"))
}

/// The scaled difference (`scale · Δ`, before strength) of one module.
fn delta(parts: &Parts, limit: usize) -> Result<Mat, String> {
    let p = &parts.0;
    let has = |prefix: &str| p.keys().any(|k| k.starts_with(prefix));
    let d = if has("hada_") {
        loha(parts, limit)?
    } else if has("lokr_") {
        lokr(parts, limit)?
    } else if p.contains_key("up") || p.contains_key("down") || p.contains_key("mid") {
        lora(parts, limit)?
    } else if let Some(diff) = p.get("diff") {
        diff.clone()
    } else {
        return Err(format!("only {:?}, no weight patch", p.keys().collect::<Vec<_>>()));
    };
    if d.data.iter().any(|x| !x.is_finite()) {
        return Err("the difference has NaN or infinite values".into());
    }
    Ok(d)
}

fn lora(parts: &Parts, limit: usize) -> Result<Mat, String> {
    let up = need(parts, "LoRA", "up")?;
    let mut down = need(parts, "LoRA", "down")?.clone();
    let rank = down.dim(0);
    let scale = scalar(parts, "alpha").map_or(1.0, |a| a / rank.max(1) as f32);
    if let Some(mid) = parts.0.get("mid") {
        // LoCon's Tucker form: fold the core into `down`, giving [rank, in, kh, kw].
        if mid.shape.len() != 4 || mid.shape[1] != rank {
            return Err(format!("LoCon `lora_mid` {:?} does not fit `lora_down` {:?}", mid.shape, down.shape));
        }
        let (r_out, kh, kw, inp) = (mid.shape[0], mid.shape[2], mid.shape[3], down.dim(1));
        if down.cols() != inp {
            return Err(format!("LoCon `lora_down` {:?} is not [rank, in, 1, 1]", down.shape));
        }
        let mut out = vec![0f32; r_out * inp * kh * kw];
        for j in 0..r_out {
            for i in 0..rank {
                for c in 0..inp {
                    let dv = down.data[i * inp + c];
                    for s in 0..kh * kw {
                        out[(j * inp + c) * kh * kw + s] += mid.data[(j * rank + i) * kh * kw + s] * dv;
                    }
                }
            }
        }
        down = Mat { shape: vec![r_out, inp, kh, kw], data: out };
    }
    if up.cols() != down.dim(0) {
        return Err(format!("LoRA `up` {:?} does not fit `down` {:?}", up.shape, down.shape));
    }
    let mut d = mm(up, &down, "LoRA", limit)?;
    d.data.iter_mut().for_each(|x| *x *= scale);
    Ok(d)
}

fn loha(parts: &Parts, limit: usize) -> Result<Mat, String> {
    let w1a = need(parts, "LoHa", "hada_w1_a")?;
    let w1b = need(parts, "LoHa", "hada_w1_b")?;
    let w2a = need(parts, "LoHa", "hada_w2_a")?;
    let w2b = need(parts, "LoHa", "hada_w2_b")?;
    let scale = scalar(parts, "alpha").map_or(1.0, |a| a / w1b.dim(0).max(1) as f32);
    let (m1, m2) = match (parts.0.get("hada_t1"), parts.0.get("hada_t2")) {
        (Some(t1), Some(t2)) => (tucker(t1, w1b, w1a, "LoHa t1", limit)?, tucker(t2, w2b, w2a, "LoHa t2", limit)?),
        (None, None) => (mm(w1a, w1b, "LoHa w1", limit)?, mm(w2a, w2b, "LoHa w2", limit)?),
        _ => return Err("LoHa patch has only one of `hada_t1`, `hada_t2`".into()),
    };
    if m1.numel() != m2.numel() {
        return Err(format!("LoHa halves differ in size ({:?} vs {:?})", m1.shape, m2.shape));
    }
    let data = m1.data.iter().zip(&m2.data).map(|(a, b)| a * b * scale).collect();
    Ok(Mat { shape: m1.shape, data })
}

fn lokr(parts: &Parts, limit: usize) -> Result<Mat, String> {
    let p = &parts.0;
    let mut dim = None;
    let w1 = match p.get("lokr_w1") {
        Some(w) => w.clone(),
        None => {
            let a = need(parts, "LoKr", "lokr_w1_a")?;
            let b = need(parts, "LoKr", "lokr_w1_b")?;
            dim = Some(b.dim(0));
            mm(a, b, "LoKr w1", limit)?
        }
    };
    let w2 = match p.get("lokr_w2") {
        Some(w) => w.clone(),
        None => {
            let a = need(parts, "LoKr", "lokr_w2_a")?;
            let b = need(parts, "LoKr", "lokr_w2_b")?;
            dim = Some(b.dim(0));
            match p.get("lokr_t2") {
                Some(t2) => tucker(t2, b, a, "LoKr t2", limit)?,
                None => mm(a, b, "LoKr w2", limit)?,
            }
        }
    };
    let w1 = if w2.shape.len() == 4 && w1.shape.len() == 2 { Mat { shape: vec![w1.shape[0], w1.shape[1], 1, 1], data: w1.data } } else { w1 };
    let scale = match (scalar(parts, "alpha"), dim) {
        (Some(a), Some(d)) => a / d.max(1) as f32,
        _ => 1.0,
    };
    let mut d = kron(&w1, &w2, limit)?;
    d.data.iter_mut().for_each(|x| *x *= scale);
    Ok(d)
}
