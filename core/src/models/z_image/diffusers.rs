//! diffusers' `ZImageTransformer2DModel` names read as the single-file release's (see
//! [`crate::models::dit::diffusers`]; sd.cpp's `convert_diffusers_dit_to_original_lumina2`
//! maps the same): q, k and v fused into `attention.qkv`, the patch-size keyed
//! `all_x_embedder.2-1` / `all_final_layer.2-1` unkeyed, everything else named alike.

use crate::io::TensorSource;
use crate::models::dit::diffusers::{single_file_layout, Layout, Part};

use super::super::Result;

/// The weight that tells a file holds a diffusers-named Z-Image transformer.
pub const DIFFUSERS_MARKER: &str = "all_x_embedder.2-1.weight";

const TOP: &[Part] = &[
    Part::Rename("x_embedder", "all_x_embedder.2-1"),
    Part::Rename("final_layer.linear", "all_final_layer.2-1.linear"),
    Part::Rename("final_layer.adaLN_modulation.1", "all_final_layer.2-1.adaLN_modulation.1"),
    Part::Rename("t_embedder.mlp.0", "t_embedder.mlp.0"),
    Part::Rename("t_embedder.mlp.2", "t_embedder.mlp.2"),
    Part::Tensor("cap_embedder.0.weight", "cap_embedder.0.weight"),
    Part::Rename("cap_embedder.1", "cap_embedder.1"),
    Part::Tensor("x_pad_token", "x_pad_token"),
    Part::Tensor("cap_pad_token", "cap_pad_token"),
];

const BLOCK: &[Part] = &[
    Part::Fuse("attention.qkv", &["attention.to_q", "attention.to_k", "attention.to_v"]),
    Part::Rename("attention.out", "attention.to_out.0"),
    Part::Tensor("attention.q_norm.weight", "attention.norm_q.weight"),
    Part::Tensor("attention.k_norm.weight", "attention.norm_k.weight"),
    Part::Rename("feed_forward.w1", "feed_forward.w1"),
    Part::Rename("feed_forward.w2", "feed_forward.w2"),
    Part::Rename("feed_forward.w3", "feed_forward.w3"),
    Part::Tensor("attention_norm1.weight", "attention_norm1.weight"),
    Part::Tensor("attention_norm2.weight", "attention_norm2.weight"),
    Part::Tensor("ffn_norm1.weight", "ffn_norm1.weight"),
    Part::Tensor("ffn_norm2.weight", "ffn_norm2.weight"),
    Part::Rename("adaLN_modulation.0", "adaLN_modulation.0"),
];

pub const LAYOUT: Layout = Layout {
    family: "Z-Image",
    marker: DIFFUSERS_MARKER,
    top: TOP,
    blocks: &[("layers", "layers", BLOCK), ("noise_refiner", "noise_refiner", BLOCK), ("context_refiner", "context_refiner", BLOCK)],
};

/// `src` in the single-file names (no prefix) when it holds a diffusers-named Z-Image
/// transformer under some prefix; any other source as it is.
pub fn single_file(src: Box<dyn TensorSource>) -> Result<Box<dyn TensorSource>> {
    single_file_layout(src, &LAYOUT)
}
