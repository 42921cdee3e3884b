//! diffusers' `WanTransformer3DModel` names read as the Wan release's (see
//! [`crate::models::dit::diffusers`]; the inverse of diffusers' Wan single-file converter):
//! `condition_embedder.*` for the text, time and image embeddings, `attn1` / `attn2` for
//! the self- and cross-attention (`add_k_proj` / `add_v_proj` the image keys and values),
//! `norm2` for the cross-attention's norm, `scale_shift_table` for the modulations;
//! `WanVACETransformer3DModel`'s VACE blocks alike, with `proj_in` / `proj_out`.

use crate::io::TensorSource;
use crate::models::dit::diffusers::{single_file_layout, Layout, Part};

use super::super::Result;

/// The weight that tells a file holds a diffusers-named Wan transformer.
pub const DIFFUSERS_MARKER: &str = "condition_embedder.time_proj.weight";

const TOP: &[Part] = &[
    Part::Rename("patch_embedding", "patch_embedding"),
    Part::Rename("vace_patch_embedding", "vace_patch_embedding"),
    Part::Rename("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    Part::Rename("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    Part::Rename("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    Part::Rename("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    Part::Rename("time_projection.1", "condition_embedder.time_proj"),
    Part::Rename("head.head", "proj_out"),
    Part::Tensor("head.modulation", "scale_shift_table"),
    Part::Rename("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),
    Part::Rename("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
    Part::Rename("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"),
    Part::Rename("img_emb.proj.4", "condition_embedder.image_embedder.norm2"),
    Part::Tensor("img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"),
];

const BLOCK: &[Part] = &[
    Part::Rename("self_attn.q", "attn1.to_q"),
    Part::Rename("self_attn.k", "attn1.to_k"),
    Part::Rename("self_attn.v", "attn1.to_v"),
    Part::Rename("self_attn.o", "attn1.to_out.0"),
    Part::Tensor("self_attn.norm_q.weight", "attn1.norm_q.weight"),
    Part::Tensor("self_attn.norm_k.weight", "attn1.norm_k.weight"),
    Part::Rename("cross_attn.q", "attn2.to_q"),
    Part::Rename("cross_attn.k", "attn2.to_k"),
    Part::Rename("cross_attn.v", "attn2.to_v"),
    Part::Rename("cross_attn.o", "attn2.to_out.0"),
    Part::Tensor("cross_attn.norm_q.weight", "attn2.norm_q.weight"),
    Part::Tensor("cross_attn.norm_k.weight", "attn2.norm_k.weight"),
    Part::Rename("cross_attn.k_img", "attn2.add_k_proj"),
    Part::Rename("cross_attn.v_img", "attn2.add_v_proj"),
    Part::Tensor("cross_attn.norm_k_img.weight", "attn2.norm_added_k.weight"),
    Part::Rename("norm3", "norm2"),
    Part::Rename("ffn.0", "ffn.net.0.proj"),
    Part::Rename("ffn.2", "ffn.net.2"),
    Part::Tensor("modulation", "scale_shift_table"),
];

/// `WanVACETransformer3DModel`'s VACE blocks: a block's parts (above), then its projections
/// in (the first block's) and out.
const VACE_PROJ: &[Part] = &[Part::Rename("before_proj", "proj_in"), Part::Rename("after_proj", "proj_out")];

pub const LAYOUT: Layout = Layout { family: "Wan", marker: DIFFUSERS_MARKER, top: TOP, blocks: &[("blocks", "blocks", BLOCK), ("vace_blocks", "vace_blocks", BLOCK), ("vace_blocks", "vace_blocks", VACE_PROJ)] };

/// `src` in the release's names (no prefix) when it holds a diffusers-named Wan
/// transformer under some prefix; any other source as it is.
pub fn single_file(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    single_file_layout(src, &LAYOUT)
}
