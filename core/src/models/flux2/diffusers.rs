//! diffusers' `Flux2Transformer2DModel` names read as BFL's (see
//! [`crate::models::dit::diffusers`]; diffusers' `convert_flux2_transformer_checkpoint_to_diffusers`
//! maps the other way): q, k and v fused back into `qkv`, the shared modulations and the
//! MLPs renamed, the final modulation's (scale, shift) halves put back as (shift, scale).

use crate::io::TensorSource;
use crate::models::dit::diffusers::{single_file_layout, Layout, Part};

use super::super::Result;

/// The weight that tells a file holds a diffusers-named FLUX.2 transformer.
pub const DIFFUSERS_MARKER: &str = "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight";

const TOP: &[Part] = &[
    Part::Rename("img_in", "x_embedder"),
    Part::Rename("txt_in", "context_embedder"),
    Part::Rename("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"),
    Part::Rename("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"),
    Part::Rename("guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"),
    Part::Rename("guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"),
    Part::Rename("double_stream_modulation_img.lin", "double_stream_modulation_img.linear"),
    Part::Rename("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"),
    Part::Rename("single_stream_modulation.lin", "single_stream_modulation.linear"),
    Part::Rename("final_layer.linear", "proj_out"),
    Part::Modulation("final_layer.adaLN_modulation.1", "norm_out.linear"),
];

const DOUBLE: &[Part] = &[
    Part::Fuse("img_attn.qkv", &["attn.to_q", "attn.to_k", "attn.to_v"]),
    Part::Fuse("txt_attn.qkv", &["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
    Part::Tensor("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
    Part::Tensor("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
    Part::Tensor("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
    Part::Tensor("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
    Part::Rename("img_attn.proj", "attn.to_out.0"),
    Part::Rename("txt_attn.proj", "attn.to_add_out"),
    Part::Rename("img_mlp.0", "ff.linear_in"),
    Part::Rename("img_mlp.2", "ff.linear_out"),
    Part::Rename("txt_mlp.0", "ff_context.linear_in"),
    Part::Rename("txt_mlp.2", "ff_context.linear_out"),
];

const SINGLE: &[Part] = &[
    Part::Rename("linear1", "attn.to_qkv_mlp_proj"),
    Part::Rename("linear2", "attn.to_out"),
    Part::Tensor("norm.query_norm.scale", "attn.norm_q.weight"),
    Part::Tensor("norm.key_norm.scale", "attn.norm_k.weight"),
];

pub const LAYOUT: Layout = Layout {
    family: "FLUX.2",
    marker: DIFFUSERS_MARKER,
    top: TOP,
    blocks: &[("transformer_blocks", "double_blocks", DOUBLE), ("single_transformer_blocks", "single_blocks", SINGLE)],
};

/// `src` in BFL's names (no prefix) when it holds a diffusers-named FLUX.2 transformer
/// under some prefix; any other source as it is.
pub fn bfl_layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    single_file_layout(src, &LAYOUT)
}
