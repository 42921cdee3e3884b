//! diffusers' `SD3Transformer2DModel` names read as Stability's (see
//! [`crate::models::dit::diffusers`]): SD3, SD3.5 large/medium (q/k norms, MMDiT-X's
//! second attention), the last block's pre-only context modulation in (shift, scale).

use crate::io::TensorSource;
use crate::models::dit::diffusers::{single_file_layout, Layout, Part};

use super::super::Result;

/// The weight that tells a file holds a diffusers-named SD3 MMDiT.
pub const DIFFUSERS_MARKER: &str = "pos_embed.proj.weight";

const TOP: &[Part] = &[
    Part::Rename("x_embedder.proj", "pos_embed.proj"),
    Part::Tensor("pos_embed", "pos_embed.pos_embed"),
    Part::Rename("context_embedder", "context_embedder"),
    Part::Rename("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1"),
    Part::Rename("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2"),
    Part::Rename("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1"),
    Part::Rename("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2"),
    Part::Rename("final_layer.linear", "proj_out"),
    Part::Modulation("final_layer.adaLN_modulation.1", "norm_out.linear"),
];

const JOINT: &[Part] = &[
    Part::Fuse("x_block.attn.qkv", &["attn.to_q", "attn.to_k", "attn.to_v"]),
    Part::Fuse("context_block.attn.qkv", &["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
    Part::Tensor("x_block.attn.ln_q.weight", "attn.norm_q.weight"),
    Part::Tensor("x_block.attn.ln_k.weight", "attn.norm_k.weight"),
    Part::Tensor("context_block.attn.ln_q.weight", "attn.norm_added_q.weight"),
    Part::Tensor("context_block.attn.ln_k.weight", "attn.norm_added_k.weight"),
    Part::Rename("x_block.attn.proj", "attn.to_out.0"),
    Part::Rename("context_block.attn.proj", "attn.to_add_out"),
    Part::Fuse("x_block.attn2.qkv", &["attn2.to_q", "attn2.to_k", "attn2.to_v"]),
    Part::Tensor("x_block.attn2.ln_q.weight", "attn2.norm_q.weight"),
    Part::Tensor("x_block.attn2.ln_k.weight", "attn2.norm_k.weight"),
    Part::Rename("x_block.attn2.proj", "attn2.to_out.0"),
    Part::Rename("x_block.mlp.fc1", "ff.net.0.proj"),
    Part::Rename("x_block.mlp.fc2", "ff.net.2"),
    Part::Rename("context_block.mlp.fc1", "ff_context.net.0.proj"),
    Part::Rename("context_block.mlp.fc2", "ff_context.net.2"),
    Part::Rename("x_block.adaLN_modulation.1", "norm1.linear"),
    Part::Modulation("context_block.adaLN_modulation.1", "norm1_context.linear"),
];

pub const LAYOUT: Layout = Layout { family: "SD3", marker: DIFFUSERS_MARKER, top: TOP, blocks: &[("transformer_blocks", "joint_blocks", JOINT)] };

/// `src` in Stability's names (no prefix) when it holds a diffusers-named SD3 MMDiT under
/// some prefix; any other source as it is.
pub fn stability_layout(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    single_file_layout(src, &LAYOUT)
}
