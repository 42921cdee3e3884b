//! Which files each loader offers: a kind's own folders (and ComfyUI's older names for
//! them), never another kind's; checkpoints alone fall back to a flat models folder.

use sdflow_nodes::Runtime;

fn runtime(models: &std::path::Path) -> Runtime {
    Runtime::new(models, models.join("out"), 1, sdflow_core::io::WeightType::Stored).unwrap()
}

fn touch(path: std::path::PathBuf) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, b"x").unwrap();
}

#[test]
fn a_flat_folder_lists_checkpoints_only() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path();
    touch(models.join("model.safetensors"));
    touch(models.join("notes.md"));
    let rt = runtime(models);
    assert_eq!(rt.list_models("checkpoints"), ["model.safetensors"]);
    for kind in ["loras", "vae", "upscale_models", "controlnet", "text_encoders", "clip_vision", "diffusion_models"] {
        assert!(rt.list_models(kind).is_empty(), "{kind} offers the checkpoint");
    }
    assert!(rt.resolve_model("checkpoints", "model.safetensors").is_ok());
    let e = rt.resolve_model("loras", "model.safetensors").unwrap_err();
    assert!(e.contains("has no `loras/`"), "{e}");
}

#[test]
fn each_kind_reads_its_folders_and_comfyuis_older_names() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path();
    touch(models.join("checkpoints/sd15.safetensors"));
    touch(models.join("stray.safetensors"));
    touch(models.join("unet/flux1-dev-Q4_K.gguf"));
    touch(models.join("diffusion_models/sd3.5_medium.safetensors"));
    touch(models.join("clip/t5xxl_q8_0.gguf"));
    touch(models.join("text_encoders/clip_l.safetensors"));
    touch(models.join("t2i_adapter/sketch.pth"));
    touch(models.join("loras/style/ink.safetensors"));
    std::fs::create_dir_all(models.join("checkpoints/FLUX.1-schnell/transformer")).unwrap();
    let rt = runtime(models);
    // A diffusers folder is one entry; the top-level file is not a checkpoint once
    // checkpoints/ exists.
    assert_eq!(rt.list_models("checkpoints"), ["FLUX.1-schnell", "sd15.safetensors"]);
    assert_eq!(rt.list_models("diffusion_models"), ["flux1-dev-Q4_K.gguf", "sd3.5_medium.safetensors"]);
    assert_eq!(rt.list_models("text_encoders"), ["clip_l.safetensors", "t5xxl_q8_0.gguf"]);
    assert_eq!(rt.list_models("controlnet"), ["sketch.pth"]);
    assert_eq!(rt.list_models("loras"), ["style/ink.safetensors"]);
    assert_eq!(rt.resolve_model("diffusion_models", "flux1-dev-Q4_K.gguf").unwrap(), models.join("unet/flux1-dev-Q4_K.gguf"));
    let e = rt.resolve_model("checkpoints", "stray.safetensors").unwrap_err();
    assert!(e.contains("not found in") && e.contains("checkpoints"), "{e}");
}

#[test]
fn a_missing_models_folder_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&dir.path().join("nowhere"));
    assert!(rt.list_models("checkpoints").is_empty());
    let e = rt.resolve_model("checkpoints", "a.safetensors").unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
}
