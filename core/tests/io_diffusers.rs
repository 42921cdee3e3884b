//! diffusers folders: one source over all component folders, names prefixed by component,
//! reading safetensors, sharded indexes and `.bin` pickles.

use std::collections::BTreeMap;
use std::path::Path;

use sdflow_core::detect::{detect, ModelFamily};
use sdflow_core::dtype::DType;
use sdflow_core::io::{self, safetensors, Format};

fn write(p: &Path, ts: &[(&str, Vec<usize>)]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = ts
        .iter()
        .map(|(n, s)| {
            (
                n.to_string(),
                s.clone(),
                vec![(n.len() % 251) as u8; s.iter().product::<usize>() * 2],
            )
        })
        .collect();
    safetensors::write(
        p,
        data.iter()
            .map(|(n, s, b)| (n.as_str(), DType::F16, s.clone(), b.as_slice())),
        &BTreeMap::new(),
    )
    .unwrap();
}

#[test]
fn sdxl_pipeline_folder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("model_index.json"),
        r#"{"_class_name": "StableDiffusionXLPipeline"}"#,
    )
    .unwrap();
    write(
        &d.join("unet/diffusion_pytorch_model.safetensors"),
        &[
            ("conv_in.weight", vec![320, 4, 3, 3]),
            ("time_embedding.linear_1.weight", vec![1280, 320]),
            (
                "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                vec![640, 2048],
            ),
            ("add_embedding.linear_1.weight", vec![1280, 2816]),
        ],
    );
    write(
        &d.join("vae/diffusion_pytorch_model.safetensors"),
        &[("encoder.conv_in.weight", vec![128, 3, 3, 3])],
    );
    write(
        &d.join("text_encoder/model.safetensors"),
        &[(
            "text_model.embeddings.token_embedding.weight",
            vec![49408, 768],
        )],
    );
    // text_encoder_2 sharded.
    write(
        &d.join("text_encoder_2/model-00001-of-00002.safetensors"),
        &[(
            "text_model.embeddings.token_embedding.weight",
            vec![49408, 1280],
        )],
    );
    write(
        &d.join("text_encoder_2/model-00002-of-00002.safetensors"),
        &[("text_projection.weight", vec![1280, 1280])],
    );
    std::fs::write(
        d.join("text_encoder_2/model.safetensors.index.json"),
        r#"{"weight_map": {"text_model.embeddings.token_embedding.weight": "model-00001-of-00002.safetensors",
                           "text_projection.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    // A component stored as a torch pickle.
    std::fs::create_dir_all(d.join("text_encoder_3")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/io/nested.pt"),
        d.join("text_encoder_3/pytorch_model.bin"),
    )
    .unwrap();

    let src = io::open(d).unwrap();
    assert_eq!(src.format(), Format::Diffusers);
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    for n in [
        "unet.conv_in.weight",
        "vae.encoder.conv_in.weight",
        "text_encoder.text_model.embeddings.token_embedding.weight",
        "text_encoder_2.text_projection.weight",
        "text_encoder_3.model.a",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert_eq!(
        src.read("vae.encoder.conv_in.weight").unwrap().len(),
        128 * 27 * 2
    );
    assert_eq!(src.read("text_encoder_3.model.a").unwrap().len(), 8);
    let det = detect(src.tensors());
    assert_eq!(det.family, ModelFamily::Sdxl, "{}", det.message);
    assert!(det.components.vae && det.components.clip_l && det.components.clip_g);
}

#[test]
fn folder_without_weights_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("unet")).unwrap();
    let e = io::open(dir.path()).err().unwrap().to_string();
    assert!(
        e.contains(dir.path().to_str().unwrap()) && e.contains("no weights"),
        "{e}"
    );
}

#[test]
fn broken_component_names_its_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("vae")).unwrap();
    std::fs::write(
        dir.path().join("vae/diffusion_pytorch_model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{",
    )
    .unwrap();
    let e = io::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("vae/diffusion_pytorch_model.safetensors"), "{e}");
}
