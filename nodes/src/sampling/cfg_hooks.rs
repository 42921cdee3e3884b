//! ComfyUI's guidance hooks on a MODEL and the nodes that set them: RescaleCFG
//! (`nodes_model_advanced.py`, a `sampler_cfg_function`), CFGNorm and CFGZeroStar
//! (`nodes_cfg.py`, post-CFG functions), LatentApplyOperationCFG (`nodes_latent.py`, a
//! pre-CFG function) with the LATENT_OPERATION nodes it takes (LatentOperationTonemapReinhard,
//! LatentOperationSharpen), and LatentApplyOperation, which applies one to a latent.
//!
//! The arithmetic follows ComfyUI's `sampling_function` / `cfg_function`: a skipped
//! unconditional pass (CFG 1) is a prediction of zeros there, and the hooks see it so.
//! Data are the sampler's: model-space latents, NCHW, `shape` = [W, H, C, N].

use crate::image::latent_ops::invalid;
use crate::image::postprocess::gaussian_kernel;
use crate::values::{CfgHooks, Latent, LatentOperation, ModelRef, PostCfg, PostCfgHook};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub const LATENT_OPERATION: IoType = IoType::from_static("LATENT_OPERATION");

pub fn register(registry: &mut Registry) {
    use HookNode::*;
    for n in [RescaleCfg, CfgNorm, CfgZeroStar, ApplyOperation, ApplyOperationCfg, TonemapReinhard, Sharpen] {
        registry.register(Arc::new(n));
    }
}

fn dims(shape: [i64; 4]) -> (usize, usize, usize) {
    let [w, h, c, n] = shape.map(|d| d as usize);
    (n, c, h * w)
}

/// Per sample and pixel, the norm over channels (`torch.linalg.vector_norm(t, dim=1)`).
fn channel_norms(v: &[f32], shape: [i64; 4]) -> Vec<f32> {
    let (n, c, hw) = dims(shape);
    (0..n * hw).map(|i| (0..c).map(|k| v[((i / hw) * c + k) * hw + i % hw].powi(2)).sum::<f32>().sqrt()).collect()
}

/// torch's `std(dim=(1, 2, 3))` per sample: unbiased, NaN for a single value.
fn sample_std(v: &[f32], n: usize) -> Vec<f32> {
    let per = v.len() / n;
    v.chunks(per)
        .map(|s| {
            let mean = s.iter().map(|&x| x as f64).sum::<f64>() / per as f64;
            ((s.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (per as f64 - 1.0)).sqrt()) as f32
        })
        .collect()
}

/// A LATENT_OPERATION on a latent batch, as ComfyUI's closures compute it.
pub fn apply_operation(op: &LatentOperation, latent: &[f32], shape: [i64; 4]) -> Result<Vec<f32>, String> {
    let (n, c, hw) = dims(shape);
    let (w, h) = (shape[0] as usize, shape[1] as usize);
    match *op {
        LatentOperation::TonemapReinhard { multiplier } => {
            let mag: Vec<f32> = channel_norms(latent, shape).iter().map(|m| m + 1e-10).collect();
            let std = sample_std(&mag, n);
            let mut out = vec![0f32; latent.len()];
            for s in 0..n {
                let m = &mag[s * hw..(s + 1) * hw];
                let mean = (m.iter().map(|&x| x as f64).sum::<f64>() / hw as f64) as f32;
                let top = (std[s] * 5.0 + mean) * multiplier;
                for (p, &mp) in m.iter().enumerate() {
                    let scaled = mp * (1.0 / top);
                    let new = scaled / (scaled + 1.0) * top;
                    for k in 0..c {
                        let i = (s * c + k) * hw + p;
                        out[i] = latent[i] / mp * new;
                    }
                }
            }
            Ok(out)
        }
        LatentOperation::Sharpen { radius, sigma, alpha } => {
            if radius >= h || radius >= w {
                return Err(format!("reflect padding by {radius} needs a latent larger than {radius} cells a side; this one is {w}x{h}"));
            }
            let lum: Vec<f32> = channel_norms(latent, shape).iter().map(|m| m + 1e-6).collect();
            let k = 2 * radius + 1;
            let scale = (alpha * -10.0) as f32;
            let mut kernel: Vec<f32> = gaussian_kernel(k, sigma).iter().map(|v| v * scale).collect();
            let total: f32 = kernel.iter().sum();
            kernel[radius * k + radius] = kernel[radius * k + radius] - total + 1.0;
            let reflect = |i: isize, len: usize| -> usize {
                let len = len as isize;
                (if i < 0 { -i } else if i >= len { 2 * (len - 1) - i } else { i }) as usize
            };
            let mut out = vec![0f32; latent.len()];
            for s in 0..n {
                for ch in 0..c {
                    let plane = (s * c + ch) * hw;
                    let normalized = |y: usize, x: usize| latent[plane + y * w + x] / lum[s * hw + y * w + x];
                    for y in 0..h {
                        for x in 0..w {
                            let mut acc = 0f32;
                            for i in 0..k {
                                let sy = reflect(y as isize + i as isize - radius as isize, h);
                                for j in 0..k {
                                    acc += kernel[i * k + j] * normalized(sy, reflect(x as isize + j as isize - radius as isize, w));
                                }
                            }
                            out[plane + y * w + x] = lum[s * hw + y * w + x] * acc;
                        }
                    }
                }
            }
            Ok(out)
        }
    }
}

/// The pre-CFG functions: each operation applied to `positive − negative`, the negative
/// added back (the negative is zeros when its pass was skipped).
pub fn pre_cfg(ops: &[LatentOperation], positive: &mut Vec<f32>, negative: &[f32], shape: [i64; 4]) -> Result<(), String> {
    for op in ops {
        let diff: Vec<f32> = positive.iter().zip(negative).map(|(p, n)| p - n).collect();
        *positive = apply_operation(op, &diff, shape)?.iter().zip(negative).map(|(d, n)| d + n).collect();
    }
    Ok(())
}

/// RescaleCFG's `sampler_cfg_function`, returned as ComfyUI's `cfg_result` (`x − fn(args)`):
/// CFG in v-prediction space, its per-sample standard deviation brought towards the
/// positive prediction's by `multiplier`.
pub fn rescale_cfg(multiplier: f32, cond_scale: f32, positive: &[f32], negative: &[f32], x: &[f32], sigma: f32, shape: [i64; 4]) -> Vec<f32> {
    let (n, _, _) = dims(shape);
    let s2 = sigma * sigma + 1.0;
    let root = s2.sqrt();
    // args["cond"] and args["uncond"] are x − prediction; v = (x/s2 − (x − arg))·√s2/σ.
    let v = |pred: &[f32]| -> Vec<f32> { x.iter().zip(pred).map(|(&xo, &p)| (xo / s2 - (xo - (xo - p))) * root / sigma).collect() };
    let (cond, uncond) = (v(positive), v(negative));
    let x_cfg: Vec<f32> = uncond.iter().zip(&cond).map(|(u, c)| u + cond_scale * (c - u)).collect();
    let (ro_pos, ro_cfg) = (sample_std(&cond, n), sample_std(&x_cfg, n));
    let per = x.len() / n;
    x.iter()
        .zip(&x_cfg)
        .enumerate()
        .map(|(i, (&xo, &xc))| {
            let s = i / per;
            let x_final = multiplier * (xc * (ro_pos[s] / ro_cfg[s])) + (1.0 - multiplier) * xc;
            let ret = xo - (xo / s2 - x_final * sigma / root);
            xo - ret
        })
        .collect()
}

/// One post-CFG function on `denoised` (the CFG result so far).
pub fn post_cfg(hook: PostCfg, denoised: Vec<f32>, positive: &[f32], negative: &[f32], cond_scale: f32, x: &[f32], shape: [i64; 4]) -> Vec<f32> {
    let (n, _, hw) = dims(shape);
    match hook {
        PostCfg::Norm { strength } => {
            let (cond_norm, pred_norm) = (channel_norms(positive, shape), channel_norms(&denoised, shape));
            let c = shape[2] as usize;
            denoised
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let p = (i / (c * hw)) * hw + i % hw;
                    let scale = (cond_norm[p] / (pred_norm[p] + 1e-8)).clamp(0.0, 1.0);
                    v * scale * strength
                })
                .collect()
        }
        PostCfg::ZeroStar => {
            let per = x.len() / n;
            let alpha: Vec<f32> = (0..n)
                .map(|s| {
                    let r = s * per..(s + 1) * per;
                    let (mut dot, mut sq) = (0f32, 0f32);
                    for i in r {
                        let (a, b) = (x[i] - positive[i], x[i] - negative[i]);
                        dot += a * b;
                        sq += b * b;
                    }
                    dot / (sq + 1e-8)
                })
                .collect();
            denoised.iter().enumerate().map(|(i, v)| v + negative[i] * (alpha[i / per] - 1.0) + cond_scale * negative[i] * (1.0 - alpha[i / per])).collect()
        }
    }
}

/// `sampling_function`'s guidance with these hooks, skip-layer guidance left out: the
/// whole of it for a model without SLG (and what the tests check against ComfyUI).
pub fn guide(hooks: &CfgHooks, cond_scale: f32, mut positive: Vec<f32>, negative: Option<Vec<f32>>, x: &[f32], sigma: f32, shape: [i64; 4]) -> Result<Vec<f32>, String> {
    let negative = negative.unwrap_or_else(|| vec![0.0; positive.len()]);
    pre_cfg(&hooks.pre, &mut positive, &negative, shape)?;
    let mut d = match hooks.rescale {
        Some(m) => rescale_cfg(m, cond_scale, &positive, &negative, x, sigma, shape),
        None => negative.iter().zip(&positive).map(|(u, c)| u + (c - u) * cond_scale).collect(),
    };
    for h in &hooks.post {
        d = post_cfg(h.kind, d, &positive, &negative, cond_scale, x, shape);
    }
    Ok(d)
}

#[derive(Clone, Copy, Debug)]
enum HookNode {
    RescaleCfg,
    CfgNorm,
    CfgZeroStar,
    ApplyOperation,
    ApplyOperationCfg,
    TonemapReinhard,
    Sharpen,
}

fn patched(model: ModelRef) -> Outputs {
    Outputs::new(vec![Value::new(IoType::MODEL, model)])
}

fn ranged(inputs: &Inputs, name: &str, lo: f64, hi: f64) -> Result<f64, NodeError> {
    let v = inputs.float(name)?;
    if !(lo..=hi).contains(&v) {
        return Err(invalid(name, format!("{v} is outside {lo}..={hi}")));
    }
    Ok(v)
}

impl Node for HookNode {
    fn schema(&self) -> NodeSchema {
        let model = || InputSpec::link("model", IoType::MODEL);
        match self {
            HookNode::RescaleCfg => NodeSchema::new("RescaleCFG")
                .category("advanced/model")
                .input(model())
                .input(InputSpec::float("multiplier", 0.7).float_range(0.0, 1.0).float_step(0.01))
                .output("MODEL", IoType::MODEL),
            HookNode::CfgNorm => NodeSchema::new("CFGNorm")
                .category("advanced/guidance")
                .input(model())
                .input(InputSpec::float("strength", 1.0).float_range(0.0, 100.0).float_step(0.01))
                .output("patched_model", IoType::MODEL),
            HookNode::CfgZeroStar => NodeSchema::new("CFGZeroStar").category("advanced/guidance").input(model()).output("patched_model", IoType::MODEL),
            HookNode::ApplyOperation => NodeSchema::new("LatentApplyOperation")
                .category("latent/advanced/operations")
                .input(InputSpec::link("samples", IoType::LATENT))
                .input(InputSpec::link("operation", LATENT_OPERATION))
                .output("LATENT", IoType::LATENT),
            HookNode::ApplyOperationCfg => NodeSchema::new("LatentApplyOperationCFG")
                .category("latent/advanced/operations")
                .input(model())
                .input(InputSpec::link("operation", LATENT_OPERATION))
                .output("MODEL", IoType::MODEL),
            HookNode::TonemapReinhard => NodeSchema::new("LatentOperationTonemapReinhard")
                .category("latent/advanced/operations")
                .input(InputSpec::float("multiplier", 1.0).float_range(0.0, 100.0).float_step(0.01))
                .output("LATENT_OPERATION", LATENT_OPERATION),
            HookNode::Sharpen => NodeSchema::new("LatentOperationSharpen")
                .category("latent/advanced/operations")
                .input(InputSpec::int("sharpen_radius", 9).int_range(1, 31).int_step(1))
                .input(InputSpec::float("sigma", 1.0).float_range(0.1, 10.0).float_step(0.1))
                .input(InputSpec::float("alpha", 0.1).float_range(0.0, 5.0).float_step(0.01))
                .output("LATENT_OPERATION", LATENT_OPERATION),
        }
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let model = || inputs.downcast::<ModelRef>("model").cloned();
        let add_post = |kind: PostCfg| -> Result<Outputs, NodeError> {
            let mut m = model()?;
            let after_slg = m.slg.is_some();
            m.cfg_hooks.post.push(PostCfgHook { kind, after_slg });
            Ok(patched(m))
        };
        match self {
            HookNode::RescaleCfg => {
                let mut m = model()?;
                m.cfg_hooks.rescale = Some(ranged(inputs, "multiplier", 0.0, 1.0)? as f32);
                Ok(patched(m))
            }
            HookNode::CfgNorm => add_post(PostCfg::Norm { strength: ranged(inputs, "strength", 0.0, 100.0)? as f32 }),
            HookNode::CfgZeroStar => add_post(PostCfg::ZeroStar),
            HookNode::ApplyOperation => {
                let l = inputs.downcast::<Latent>("samples")?;
                let op = inputs.downcast::<LatentOperation>("operation")?;
                if l.shape.iter().any(|&d| d < 1) || l.samples.len() as i64 != l.shape.iter().product::<i64>() {
                    return Err(invalid("samples", format!("a latent of {} values is not {:?}", l.samples.len(), l.shape)));
                }
                let samples = apply_operation(op, &l.samples, l.shape).map_err(|m| invalid("operation", m))?;
                Ok(Outputs::new(vec![Value::new(IoType::LATENT, Latent { samples, ..l.clone() })]))
            }
            HookNode::ApplyOperationCfg => {
                let mut m = model()?;
                m.cfg_hooks.pre.push(*inputs.downcast::<LatentOperation>("operation")?);
                Ok(patched(m))
            }
            HookNode::TonemapReinhard => {
                let multiplier = ranged(inputs, "multiplier", 0.0, 100.0)? as f32;
                Ok(Outputs::new(vec![Value::new(LATENT_OPERATION, LatentOperation::TonemapReinhard { multiplier })]))
            }
            HookNode::Sharpen => {
                let radius = inputs.int("sharpen_radius")?;
                let radius = usize::try_from(radius).ok().filter(|r| (1..=31).contains(r)).ok_or_else(|| invalid("sharpen_radius", format!("{radius} is outside 1..=31")))?;
                let sigma = ranged(inputs, "sigma", 0.1, 10.0)?;
                let alpha = ranged(inputs, "alpha", 0.0, 5.0)?;
                Ok(Outputs::new(vec![Value::new(LATENT_OPERATION, LatentOperation::Sharpen { radius, sigma, alpha })]))
            }
        }
    }
}
