//! diffusers' `FluxTransformer2DModel` names read as BFL's: every tensor renamed, the
//! split projections fused back (`to_q`/`to_k`/`to_v` into `qkv`, and with `proj_mlp`
//! into a single block's `linear1`), and `norm_out`'s (scale, shift) halves put in BFL's
//! (shift, scale) order — the inverse of diffusers' single-file converter, checked
//! against it (core/tests/fixtures/models/make_flux_diffusers_map.py).

use crate::io::{Assembled, Rows, TensorInfo, TensorSource};

use super::super::{ModelError, Result};

/// The weight that tells a file holds a diffusers-named FLUX.1 transformer.
pub const DIFFUSERS_MARKER: &str = "single_transformer_blocks.0.attn.to_q.weight";

/// One-to-one names: (BFL, diffusers), relative to a block or the model.
const TOP: [(&str, &str); 9] = [
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    ("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"),
    ("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"),
    ("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"),
    ("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"),
    ("vector_in.in_layer", "time_text_embed.text_embedder.linear_1"),
    ("vector_in.out_layer", "time_text_embed.text_embedder.linear_2"),
    ("final_layer.linear", "proj_out"),
];
const DOUBLE: [(&str, &str); 12] = [
    ("img_mod.lin", "norm1.linear"),
    ("txt_mod.lin", "norm1_context.linear"),
    ("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
    ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
    ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
    ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
    ("img_attn.proj", "attn.to_out.0"),
    ("txt_attn.proj", "attn.to_add_out"),
    ("img_mlp.0", "ff.net.0.proj"),
    ("img_mlp.2", "ff.net.2"),
    ("txt_mlp.0", "ff_context.net.0.proj"),
    ("txt_mlp.2", "ff_context.net.2"),
];
const SINGLE: [(&str, &str); 4] = [
    ("linear2", "proj_out"),
    ("norm.query_norm.scale", "attn.norm_q.weight"),
    ("norm.key_norm.scale", "attn.norm_k.weight"),
    ("modulation.lin", "norm.linear"),
];
/// Fused tensors: (BFL, the diffusers parts in order).
const DOUBLE_FUSED: [(&str, &[&str]); 2] = [("img_attn.qkv", &["attn.to_q", "attn.to_k", "attn.to_v"]), ("txt_attn.qkv", &["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"])];
const SINGLE_FUSED: [(&str, &[&str]); 1] = [("linear1", &["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"])];

/// `src` in BFL's names (no prefix) when it holds a diffusers-named FLUX.1 transformer
/// under some prefix; any other source as it is.
pub fn bfl_layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    let Some(marker) = src.tensors().iter().find(|t| t.name.ends_with(DIFFUSERS_MARKER)) else { return Ok(src) };
    let prefix = marker.name[..marker.name.len() - DIFFUSERS_MARKER.len()].to_string();
    let shown = src.path().display().to_string();
    let plan = plan(src.tensors(), &prefix).map_err(|e| ModelError::Weight { name: e, detail: format!("{shown}: not a diffusers FLUX.1 transformer") })?;
    let assembled = Assembled::new(src, plan).map_err(|e| ModelError::Weight { name: e, detail: format!("{shown}: its diffusers tensors do not fuse") })?;
    Ok(Box::new(assembled))
}

/// Each BFL tensor's parts among `tensors` (diffusers names under `prefix`).
fn plan(tensors: &[TensorInfo], prefix: &str) -> std::result::Result<Vec<(String, Vec<Rows>)>, String> {
    let find = |name: &str| tensors.iter().find(|t| t.name == format!("{prefix}{name}"));
    let mut plan = Vec::new();
    let mut renames = |bfl: String, diff: String| {
        for suffix in [".weight", ".bias"] {
            // Norm scales carry their suffix in the table.
            let (b, d) = if diff.ends_with(".weight") { (bfl.clone(), diff.clone()) } else { (format!("{bfl}{suffix}"), format!("{diff}{suffix}")) };
            if let Some(t) = find(&d) {
                plan.push((b, vec![Rows::all(t)]));
            }
            if diff.ends_with(".weight") {
                break;
            }
        }
    };
    for (bfl, diff) in TOP {
        renames(bfl.to_string(), diff.to_string());
    }
    let count = |head: &str| (0..).take_while(|i| tensors.iter().any(|t| t.name.starts_with(&format!("{prefix}{head}.{i}.")))).count();
    for i in 0..count("transformer_blocks") {
        for (bfl, diff) in DOUBLE {
            renames(format!("double_blocks.{i}.{bfl}"), format!("transformer_blocks.{i}.{diff}"));
        }
    }
    for i in 0..count("single_transformer_blocks") {
        for (bfl, diff) in SINGLE {
            renames(format!("single_blocks.{i}.{bfl}"), format!("single_transformer_blocks.{i}.{diff}"));
        }
    }
    let mut fuse = |bfl: String, parts: Vec<String>| -> std::result::Result<(), String> {
        for suffix in [".weight", ".bias"] {
            let found: Vec<Option<&TensorInfo>> = parts.iter().map(|p| find(&format!("{p}{suffix}"))).collect();
            if found.iter().all(Option::is_none) {
                continue;
            }
            let rows = found.iter().zip(&parts).map(|(t, p)| t.map(Rows::all).ok_or_else(|| format!("{prefix}{p}{suffix}"))).collect::<std::result::Result<Vec<_>, _>>()?;
            plan.push((format!("{bfl}{suffix}"), rows));
        }
        Ok(())
    };
    for i in 0..count("transformer_blocks") {
        for (bfl, parts) in DOUBLE_FUSED {
            fuse(format!("double_blocks.{i}.{bfl}"), parts.iter().map(|p| format!("transformer_blocks.{i}.{p}")).collect())?;
        }
    }
    for i in 0..count("single_transformer_blocks") {
        for (bfl, parts) in SINGLE_FUSED {
            fuse(format!("single_blocks.{i}.{bfl}"), parts.iter().map(|p| format!("single_transformer_blocks.{i}.{p}")).collect())?;
        }
    }
    // AdaLayerNormContinuous keeps (scale, shift); BFL's final layer (shift, scale).
    for suffix in [".weight", ".bias"] {
        if let Some(t) = find(&format!("norm_out.linear{suffix}")) {
            let half = t.shape.first().copied().unwrap_or(0) / 2;
            let part = |first| Rows { source: t.name.clone(), first, rows: half };
            plan.push((format!("final_layer.adaLN_modulation.1{suffix}"), vec![part(half), part(0)]));
        }
    }
    Ok(plan)
}
