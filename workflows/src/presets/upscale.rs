//! sd-cli's `upscale` mode and the `--upscale-model` step after img_gen.

use sdflow_executor::{InputValue, NodeSpec};
use serde_json::json;

use super::graph::*;
use super::{save_prefix, Preset, PresetError, UpscaleParams};

pub(super) fn upscale_chain(b: &mut Builder, image: &Out, model_name: &str, repeats: i64, tile_size: i64) -> Out {
    let loader = b.extra("upscale_model", "--upscale-model", NodeSpec::new("UpscaleModelLoader").with_const("model_name", json!(model_name)));
    let key = b.extra("upscale", "--upscale-model", upscale_node(&loader, image, repeats, tile_size));
    Out(key, 0)
}

/// ImageUpscaleWithModel with sd-cli's tiling and repeat count as inputs.
pub(super) fn upscale_node(loader: &str, image: &Out, repeats: i64, tile_size: i64) -> NodeSpec {
    NodeSpec::new("ImageUpscaleWithModel").with_input("upscale_model", InputValue::link(loader, 0)).with_input("image", link(image)).with_const("tile_size", json!(tile_size)).with_const("repeats", json!(repeats))
}

/// Builds sd-cli's `upscale` graph.
pub fn upscale(p: &UpscaleParams) -> Result<Preset, PresetError> {
    check_range("--upscale-repeats", p.upscale_repeats, 1, 16)?;
    check_range("--upscale-tile-size", p.tile_size, 16, 4096)?;
    let mut b = Builder::default();
    let img = b.core("image", "-i", NodeSpec::new("LoadImage").with_const("image", json!(p.init_img)));
    let loader = b.core("upscale_model", "--upscale-model", NodeSpec::new("UpscaleModelLoader").with_const("model_name", json!(p.upscale_model)));
    let up = b.core("upscale", "--upscale-model", upscale_node(&loader, &Out(img, 0), p.upscale_repeats, p.tile_size));
    b.core("save", "-o", NodeSpec::new("SaveImage").with_input("images", InputValue::link(up, 0)).with_const("filename_prefix", json!(save_prefix(&p.output))));
    Ok(b.finish("Upscale with a model".into(), "sd-cli's --upscale-model: an ESRGAN / Real-ESRGAN upscaler (RRDBNet x4plus, x4plus-anime-6B, or the compact animevideov3) from models/upscale_models enlarges an image tile by tile (--upscale-tile-size, --upscale-repeats).".into()))
}
