//! Model detection from tensor names and shapes (LDM single-file and diffusers names), and
//! the prediction-type hints of `detect_source`.

use std::collections::BTreeMap;

use sdflow_core::detect::{detect, detect_source, KeyLayout, ModelFamily, Prediction, Variant};
use sdflow_core::dtype::DType;
use sdflow_core::io::{self, safetensors, TensorInfo};

fn t(name: &str, shape: &[usize]) -> TensorInfo {
    TensorInfo::detached(name, DType::F16, shape.to_vec())
}

const UNET: &str = "model.diffusion_model.";

fn sd1(in_ch: usize) -> Vec<TensorInfo> {
    vec![
        t(
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
            &[49408, 768],
        ),
        t("first_stage_model.encoder.conv_in.weight", &[128, 3, 3, 3]),
        t(
            &format!("{UNET}input_blocks.0.0.weight"),
            &[320, in_ch, 3, 3],
        ),
        t(
            &format!("{UNET}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"),
            &[320, 768],
        ),
        t(
            &format!("{UNET}output_blocks.11.1.transformer_blocks.0.norm1.bias"),
            &[320],
        ),
    ]
}

fn sd2() -> Vec<TensorInfo> {
    vec![
        t(
            "cond_stage_model.model.token_embedding.weight",
            &[49408, 1024],
        ),
        t(&format!("{UNET}input_blocks.0.0.weight"), &[320, 4, 3, 3]),
        t(
            &format!("{UNET}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"),
            &[320, 1024],
        ),
        t(
            &format!("{UNET}output_blocks.11.1.transformer_blocks.0.norm1.bias"),
            &[320],
        ),
    ]
}

fn sdxl(refiner: bool) -> Vec<TensorInfo> {
    let (mc, ctx, adm) = if refiner {
        (384, 1280, 2560)
    } else {
        (320, 2048, 2816)
    };
    let mut v = vec![
        t(&format!("{UNET}input_blocks.0.0.weight"), &[mc, 4, 3, 3]),
        t(
            &format!("{UNET}input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight"),
            &[mc * 2, ctx],
        ),
        t(&format!("{UNET}label_emb.0.0.weight"), &[mc * 4, adm]),
        t("first_stage_model.decoder.conv_in.weight", &[512, 4, 3, 3]),
    ];
    if refiner {
        v.push(t(
            "conditioner.embedders.0.model.token_embedding.weight",
            &[49408, 1280],
        ));
    } else {
        v.push(t(
            "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight",
            &[49408, 768],
        ));
        v.push(t(
            "conditioner.embedders.1.model.token_embedding.weight",
            &[49408, 1280],
        ));
    }
    v
}

#[test]
fn sd1_and_its_variants() {
    let d = detect(&sd1(4));
    assert_eq!(
        (d.family, d.variant, d.layout),
        (ModelFamily::Sd1, Variant::Standard, Some(KeyLayout::Ldm))
    );
    assert_eq!(
        (d.in_channels, d.model_channels, d.context_dim),
        (Some(4), Some(320), Some(768))
    );
    assert!(d.components.unet && d.components.vae && d.components.clip_l && !d.components.clip_g);
    assert_eq!(d.prediction, Prediction::Eps);
    assert_eq!(detect(&sd1(9)).variant, Variant::Inpaint);
    assert_eq!(detect(&sd1(8)).variant, Variant::Pix2Pix);
}

#[test]
fn sd2_eps_unless_told_otherwise() {
    let d = detect(&sd2());
    assert_eq!(d.family, ModelFamily::Sd2 { v_pred: false });
    assert!(d.components.clip_h);
    let mut v = sd2();
    v.push(t("v_pred", &[]));
    let d = detect(&v);
    assert_eq!(
        (d.family, d.prediction),
        (ModelFamily::Sd2 { v_pred: true }, Prediction::V)
    );
}

#[test]
fn sdxl_and_refiner() {
    let d = detect(&sdxl(false));
    assert_eq!(
        (d.family, d.adm_in_channels),
        (ModelFamily::Sdxl, Some(2816))
    );
    assert!(d.components.clip_l && d.components.clip_g && d.components.vae);
    let d = detect(&sdxl(true));
    assert_eq!(
        (d.family, d.model_channels),
        (ModelFamily::SdxlRefiner, Some(384))
    );
    // SDXL v-pred finetunes carry v_pred (and ztsnr) keys.
    let mut v = sdxl(false);
    v.push(t("v_pred", &[]));
    v.push(t("ztsnr", &[]));
    let d = detect(&v);
    assert_eq!(
        (d.family, d.prediction, d.zsnr),
        (ModelFamily::Sdxl, Prediction::V, true)
    );
}

#[test]
fn sd3_and_flux() {
    let sd3 = vec![
        t(
            "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight",
            &[4608, 1536],
        ),
        t(
            "model.diffusion_model.x_embedder.proj.weight",
            &[1536, 16, 2, 2],
        ),
        t(
            "text_encoders.clip_l.transformer.text_model.embeddings.token_embedding.weight",
            &[49408, 768],
        ),
        t(
            "text_encoders.clip_g.transformer.text_model.embeddings.token_embedding.weight",
            &[49408, 1280],
        ),
        t(
            "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight",
            &[4096, 4096],
        ),
    ];
    let d = detect(&sd3);
    assert_eq!(
        (d.family, d.in_channels, d.prediction),
        (ModelFamily::Sd3, Some(16), Prediction::Flow)
    );
    assert!(d.components.dit && d.components.clip_l && d.components.clip_g && d.components.t5);

    let flux = vec![
        t(
            "model.diffusion_model.double_blocks.0.img_attn.qkv.weight",
            &[9216, 3072],
        ),
        t(
            "model.diffusion_model.single_blocks.0.linear1.weight",
            &[21504, 3072],
        ),
        t("model.diffusion_model.img_in.weight", &[3072, 64]),
        t(
            "model.diffusion_model.guidance_in.in_layer.weight",
            &[3072, 256],
        ),
    ];
    let d = detect(&flux);
    assert_eq!(
        (d.family, d.in_channels, d.flux_guidance),
        (ModelFamily::Flux, Some(64), true)
    );
    // A bare FLUX transformer file without the LDM prefix, schnell (no guidance_in).
    let bare: Vec<TensorInfo> = flux[..3]
        .iter()
        .map(|x| {
            t(
                x.name.trim_start_matches("model.diffusion_model."),
                &x.shape,
            )
        })
        .collect();
    let d = detect(&bare);
    assert_eq!(
        (d.family, d.flux_guidance, d.diffusion_prefix.as_deref()),
        (ModelFamily::Flux, false, Some(""))
    );
}

#[test]
fn diffusers_names() {
    let sdxl = vec![
        t("unet.conv_in.weight", &[320, 4, 3, 3]),
        t("unet.time_embedding.linear_1.weight", &[1280, 320]),
        t(
            "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight",
            &[640, 2048],
        ),
        t("unet.add_embedding.linear_1.weight", &[1280, 2816]),
        t("vae.encoder.conv_in.weight", &[128, 3, 3, 3]),
        t(
            "text_encoder.text_model.embeddings.token_embedding.weight",
            &[49408, 768],
        ),
        t(
            "text_encoder_2.text_model.embeddings.token_embedding.weight",
            &[49408, 1280],
        ),
    ];
    let d = detect(&sdxl);
    assert_eq!(
        (d.family, d.layout, d.diffusion_prefix.as_deref()),
        (ModelFamily::Sdxl, Some(KeyLayout::Diffusers), Some("unet."))
    );
    assert!(d.components.vae && d.components.clip_l && d.components.clip_g);
    let sd1 = vec![
        t("unet.conv_in.weight", &[320, 9, 3, 3]),
        t("unet.time_embedding.linear_1.weight", &[1280, 320]),
        t(
            "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight",
            &[320, 768],
        ),
    ];
    let d = detect(&sd1);
    assert_eq!((d.family, d.variant), (ModelFamily::Sd1, Variant::Inpaint));
    let flux = vec![
        t(
            "transformer.single_transformer_blocks.0.attn.to_q.weight",
            &[3072, 3072],
        ),
        t("transformer.x_embedder.weight", &[3072, 64]),
        t(
            "transformer.time_text_embed.guidance_embedder.linear_1.weight",
            &[3072, 256],
        ),
        t(
            "text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.weight",
            &[4096, 4096],
        ),
    ];
    let d = detect(&flux);
    assert_eq!(
        (d.family, d.in_channels, d.flux_guidance, d.components.t5),
        (ModelFamily::Flux, Some(64), true, true)
    );
    let sd3 = vec![
        t(
            "transformer.transformer_blocks.0.attn.add_q_proj.weight",
            &[1536, 1536],
        ),
        t("transformer.pos_embed.proj.weight", &[1536, 16, 2, 2]),
    ];
    assert_eq!(detect(&sd3).family, ModelFamily::Sd3);
}

#[test]
fn unknown_says_why() {
    let llama = vec![
        t("model.layers.0.self_attn.q_proj.weight", &[4096, 4096]),
        t("lm_head.weight", &[32000, 4096]),
    ];
    let d = detect(&llama);
    assert_eq!(d.family, ModelFamily::Unknown);
    assert!(
        d.message.contains("no UNet/DiT tensors recognised")
            && d.message.contains("lm_head.weight"),
        "{}",
        d.message
    );
    assert!(detect(&[]).message.contains("(none)"));
    let odd = vec![
        t(
            "model.diffusion_model.input_blocks.0.0.weight",
            &[320, 4, 3, 3],
        ),
        t(
            "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
            &[320, 999],
        ),
    ];
    let d = detect(&odd);
    assert_eq!(d.family, ModelFamily::Unknown);
    assert!(d.message.contains("Some(999)"), "{}", d.message);
    let svd = vec![t(
        "model.diffusion_model.input_blocks.8.0.time_mixer.mix_factor",
        &[1],
    )];
    assert!(detect(&svd).message.contains("Stable Video Diffusion"));
}

/// An SD2 checkpoint on disk whose last attention norm has the given bias spread.
fn write_sd2(
    dir: &std::path::Path,
    file: &str,
    bias_std: f32,
    meta: &[(&str, &str)],
) -> std::path::PathBuf {
    let p = dir.join(file);
    let conv = vec![0u8; 320 * 4 * 9 * 2];
    let k = vec![0u8; 320 * 1024 * 2];
    // ±std alternating has exactly that standard deviation.
    let bias: Vec<u8> = (0..320)
        .flat_map(|i| (if i % 2 == 0 { bias_std } else { -bias_std }).to_le_bytes())
        .collect();
    let meta: BTreeMap<String, String> = meta
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    safetensors::write(
        &p,
        [
            (
                format!("{UNET}input_blocks.0.0.weight"),
                DType::F16,
                vec![320, 4, 3, 3],
                conv.as_slice(),
            ),
            (
                format!("{UNET}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"),
                DType::F16,
                vec![320, 1024],
                &k,
            ),
            (
                format!("{UNET}output_blocks.11.1.transformer_blocks.0.norm1.bias"),
                DType::F32,
                vec![320],
                &bias,
            ),
        ],
        &meta,
    )
    .unwrap();
    p
}

#[test]
fn sd2_prediction_hints_from_metadata_filename_and_weights() {
    let dir = tempfile::tempdir().unwrap();
    let fam = |p: &std::path::Path| {
        let src = io::open(p).unwrap();
        let d = detect_source(&*src);
        (d.family, d.prediction_reason)
    };
    let (f, why) = fam(&write_sd2(dir.path(), "a.safetensors", 0.2, &[]));
    assert_eq!(f, ModelFamily::Sd2 { v_pred: true }, "{why}");
    assert!(why.contains("std"), "{why}");
    let (f, _) = fam(&write_sd2(dir.path(), "b.safetensors", 0.01, &[]));
    assert_eq!(f, ModelFamily::Sd2 { v_pred: false });
    // Metadata beats weights, file names beat weights.
    let (f, why) = fam(&write_sd2(
        dir.path(),
        "c.safetensors",
        0.2,
        &[("modelspec.prediction_type", "epsilon")],
    ));
    assert_eq!(f, ModelFamily::Sd2 { v_pred: false }, "{why}");
    let (f, why) = fam(&write_sd2(
        dir.path(),
        "d.safetensors",
        0.01,
        &[("ss_v_parameterization", "True")],
    ));
    assert_eq!(f, ModelFamily::Sd2 { v_pred: true }, "{why}");
    let (f, why) = fam(&write_sd2(
        dir.path(),
        "sd21-768-v-ema.safetensors",
        0.01,
        &[],
    ));
    assert_eq!(f, ModelFamily::Sd2 { v_pred: true }, "{why}");
    assert!(why.contains("file name"));
}
