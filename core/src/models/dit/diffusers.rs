//! diffusers-named transformer files read in the single-file names the models use (BFL's
//! FLUX.1, Stability's SD3): each family gives a table of how its tensors map, and the
//! file is shown through [`crate::io::Assembled`] — renamed, split projections fused back
//! (q/k/v into `qkv`), and `AdaLayerNormContinuous`'s (scale, shift) halves put back in
//! the single files' (shift, scale) order. The tables are checked against diffusers' own
//! single-file converters (core/tests/fixtures/models/make_dit_diffusers_maps.py).

use crate::io::{Assembled, Rows, TensorInfo, TensorSource};

use super::super::{ModelError, Result};

/// How one single-file tensor (both `.weight` and `.bias` where the file has them) is
/// made from diffusers' tensors; names relative to the model or to block `{i}`.
#[derive(Clone, Copy, Debug)]
pub enum Part {
    /// The same tensors under another name.
    Rename(&'static str, &'static str),
    /// One tensor under another name, both full names (norm scales, position tables).
    Tensor(&'static str, &'static str),
    /// diffusers' parts stacked in order.
    Fuse(&'static str, &'static [&'static str]),
    /// A modulation: halves swapped when it has two chunks (rows = 2 × columns), as
    /// diffusers' `AdaLayerNormContinuous` orders (scale, shift); renamed otherwise.
    Modulation(&'static str, &'static str),
}

/// A family's map: model-level parts, then per block list (diffusers' block list name,
/// the single file's, the parts of one block).
pub struct Layout {
    pub family: &'static str,
    /// A diffusers tensor only this family's files hold (its prefix is the file's).
    pub marker: &'static str,
    pub top: &'static [Part],
    pub blocks: &'static [(&'static str, &'static str, &'static [Part])],
}

/// `src` in the single-file names (no prefix) when it holds `layout`'s diffusers names
/// under some prefix; any other source as it is.
pub fn single_file_layout(src: Box<dyn TensorSource>, layout: &Layout) -> Result<Box<dyn TensorSource>> {
    let Some(marker) = src.tensors().iter().find(|t| t.name.ends_with(layout.marker)) else { return Ok(src) };
    let prefix = marker.name[..marker.name.len() - layout.marker.len()].to_string();
    assemble(src, layout, &prefix, "", false)
}

/// `src`'s transformer under `from` (a pipeline folder's `transformer.`) in the single-file
/// names under `to` (`model.diffusion_model.`), every tensor outside `from` kept as it is.
pub fn pipeline_layout(src: Box<dyn TensorSource>, layout: &Layout, from: &str, to: &str) -> Result<Box<dyn TensorSource>> {
    assemble(src, layout, from, to, true)
}

fn assemble(src: Box<dyn TensorSource>, layout: &Layout, from: &str, to: &str, keep_rest: bool) -> Result<Box<dyn TensorSource>> {
    let shown = src.path().display().to_string();
    let mut plan = plan(src.tensors(), from, to, layout).map_err(|e| ModelError::Weight { name: e, detail: format!("{shown}: a diffusers {} transformer without this part", layout.family) })?;
    if keep_rest {
        plan.extend(src.tensors().iter().filter(|t| !t.name.starts_with(from)).map(|t| (t.name.clone(), vec![Rows::all(t)])));
    }
    let assembled = Assembled::new(src, plan).map_err(|e| ModelError::Weight { name: e, detail: format!("{shown}: its diffusers tensors do not fuse") })?;
    Ok(Box::new(assembled))
}

fn plan(tensors: &[TensorInfo], prefix: &str, to: &str, layout: &Layout) -> std::result::Result<Vec<(String, Vec<Rows>)>, String> {
    let find = |name: &str| tensors.iter().find(|t| t.name == format!("{prefix}{name}"));
    let mut plan = Vec::new();
    let mut add = |at: &str, from: &str, part: &Part| -> std::result::Result<(), String> {
        let suffixes: &[&str] = match part {
            Part::Tensor(..) => &[""],
            _ => &[".weight", ".bias"],
        };
        for suffix in suffixes {
            match part {
                Part::Rename(b, d) | Part::Tensor(b, d) => {
                    if let Some(t) = find(&format!("{from}{d}{suffix}")) {
                        plan.push((format!("{at}{b}{suffix}"), vec![Rows::all(t)]));
                    }
                }
                Part::Fuse(b, parts) => {
                    let found: Vec<Option<&TensorInfo>> = parts.iter().map(|p| find(&format!("{from}{p}{suffix}"))).collect();
                    if found.iter().all(Option::is_none) {
                        continue;
                    }
                    let rows = found.iter().zip(parts.iter()).map(|(t, p)| t.map(Rows::all).ok_or_else(|| format!("{prefix}{from}{p}{suffix}"))).collect::<std::result::Result<Vec<_>, _>>()?;
                    plan.push((format!("{at}{b}{suffix}"), rows));
                }
                Part::Modulation(b, d) => {
                    let Some(t) = find(&format!("{from}{d}{suffix}")) else { continue };
                    let weight = find(&format!("{from}{d}.weight")).map(|w| w.shape.clone()).unwrap_or_default();
                    let rows = t.shape.first().copied().unwrap_or(0);
                    let parts = if weight.len() == 2 && weight[0] == 2 * weight[1] {
                        let half = |first| Rows { source: t.name.clone(), first, rows: rows / 2 };
                        vec![half(rows / 2), half(0)]
                    } else {
                        vec![Rows::all(t)]
                    };
                    plan.push((format!("{at}{b}{suffix}"), parts));
                }
            }
        }
        Ok(())
    };
    for part in layout.top {
        add(to, "", part)?;
    }
    for (diff, single, parts) in layout.blocks {
        let n = (0..).take_while(|i| tensors.iter().any(|t| t.name.starts_with(&format!("{prefix}{diff}.{i}.")))).count();
        for i in 0..n {
            for part in *parts {
                add(&format!("{to}{single}.{i}."), &format!("{diff}.{i}."), part)?;
            }
        }
    }
    Ok(plan)
}
