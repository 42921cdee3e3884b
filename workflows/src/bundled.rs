//! The committed workflow files (`workflows/*.json`), built into the binary: the demo runs
//! one, and `sdflow serve` offers them to ComfyUI's frontend as its templates.

/// `(name, JSON text)` of every committed workflow, by file stem.
pub const BUNDLED: &[(&str, &str)] = &[
    ("adetailer", include_str!("../adetailer.json")),
    ("adetailer_txt2img", include_str!("../adetailer_txt2img.json")),
    ("animatediff", include_str!("../animatediff.json")),
    ("area_composition", include_str!("../area_composition.json")),
    ("chroma_txt2img", include_str!("../chroma_txt2img.json")),
    ("controlnet", include_str!("../controlnet.json")),
    ("flux2_dev", include_str!("../flux2_dev.json")),
    ("flux2_klein", include_str!("../flux2_klein.json")),
    ("flux2_klein_edit", include_str!("../flux2_klein_edit.json")),
    ("flux_dev_sd_cli", include_str!("../flux_dev_sd_cli.json")),
    ("flux_dev_txt2img", include_str!("../flux_dev_txt2img.json")),
    ("flux_fill_inpaint", include_str!("../flux_fill_inpaint.json")),
    ("flux_kontext_edit", include_str!("../flux_kontext_edit.json")),
    ("flux_lora", include_str!("../flux_lora.json")),
    ("flux_schnell", include_str!("../flux_schnell.json")),
    ("hires_fix", include_str!("../hires_fix.json")),
    ("hires_fix_model", include_str!("../hires_fix_model.json")),
    ("img2img", include_str!("../img2img.json")),
    ("inpaint", include_str!("../inpaint.json")),
    ("inpaint_partial", include_str!("../inpaint_partial.json")),
    ("instruct_pix2pix", include_str!("../instruct_pix2pix.json")),
    ("ip_adapter", include_str!("../ip_adapter.json")),
    ("lora", include_str!("../lora.json")),
    ("outpaint", include_str!("../outpaint.json")),
    ("photomaker", include_str!("../photomaker.json")),
    ("qwen_image", include_str!("../qwen_image.json")),
    ("qwen_image_edit", include_str!("../qwen_image_edit.json")),
    ("qwen_image_edit_2509", include_str!("../qwen_image_edit_2509.json")),
    ("qwen_image_layered", include_str!("../qwen_image_layered.json")),
    ("sd35_sd_cli", include_str!("../sd35_sd_cli.json")),
    ("sd35_txt2img", include_str!("../sd35_txt2img.json")),
    ("sdxl_txt2img", include_str!("../sdxl_txt2img.json")),
    ("txt2img", include_str!("../txt2img.json")),
    ("txt2img_tiled_vae", include_str!("../txt2img_tiled_vae.json")),
    ("upscale", include_str!("../upscale.json")),
    ("wan22_moe_t2v", include_str!("../wan22_moe_t2v.json")),
    ("wan22_ti2v", include_str!("../wan22_ti2v.json")),
    ("wan_flf2v", include_str!("../wan_flf2v.json")),
    ("wan_i2v", include_str!("../wan_i2v.json")),
    ("wan_t2v", include_str!("../wan_t2v.json")),
    ("wan_vace", include_str!("../wan_vace.json")),
    ("z_image_base", include_str!("../z_image_base.json")),
    ("z_image_turbo", include_str!("../z_image_turbo.json")),
];

/// The committed workflow of this file stem.
pub fn find(name: &str) -> Option<&'static str> {
    BUNDLED.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_workflow_file_is_bundled() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_string))
            .collect();
        on_disk.sort();
        let bundled: Vec<&str> = super::BUNDLED.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, bundled, "add new workflow files to BUNDLED");
    }
}
