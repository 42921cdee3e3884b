//! FLUX.2 klein end to end on tiny random-weight files (the transformer in BFL's names,
//! Qwen3 in Hugging Face's, the 32-channel VAE): the committed workflow, its VAE round
//! trip, and bad combinations.

use sdflow_executor::{InputValue, NodeSpec};
use sdflow_tests::{with_input, write_flux2_models, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let input = sdflow_tests::tiny_tree(dir.path());
    sdflow_tests::write_test_png(&input.join("input.png"), 72, 56);
    write_flux2_models(dir.path());
    sdflow_tests::write_z_image_models(dir.path());
    TestEnv::with_dir(dir, |rt| rt)
}

fn link(node: &str, output: usize) -> InputValue {
    InputValue::Link { node: node.into(), output }
}

#[test]
fn the_klein_workflow_runs_and_its_inputs_matter() {
    let env = env();
    let wf = env.workflow("flux2_klein.json", 48, 2);
    let (w, h, px) = env.run_saved(&wf, "12");
    assert_eq!((w, h), (48, 48));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    let base = env.run_saved_hash(&wf, "12");
    assert_eq!(env.run_saved_hash(&wf, "12"), base, "deterministic");
    for (node, input, v) in [("4", "text", json!("a (red:1.3) fox")), ("9", "noise_seed", json!(7)), ("8", "steps", json!(3))] {
        assert_ne!(env.run_saved_hash(&with_input(&wf, node, input, v.clone()), "12"), base, "{node}.{input} = {v}");
    }
}

/// TAEF2 (VAELoader's `taef2`, FLUX.2's tiny autoencoder) decodes and encodes the model's
/// latent: 2×2 patches of its 32 channels, 16 pixels a latent pixel.
#[test]
fn taef2_stands_in_for_the_flux2_vae() {
    let env = env();
    let approx = env.dir.path().join("models/vae_approx");
    std::fs::create_dir_all(&approx).unwrap();
    sdflow_tests::write_tae(&approx, "taef2", 32, false);
    let wf = env.workflow("flux2_klein.json", 48, 2);
    let (w, h, px) = env.run_saved(&with_input(&wf, "3", "vae_name", json!("taef2")), "12");
    assert_eq!((w, h), (48, 48));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 0, "TAEF2 decoded something");
    assert_ne!(env.run_saved_hash(&with_input(&wf, "3", "vae_name", json!("taef2")), "12"), env.run_saved_hash(&wf, "12"), "TAEF2, not the VAE");
    // Encode: an image to the model's latent (VAEEncode with TAEF2 → 128 channels at 1/16).
    let mut enc = sdflow_executor::Workflow::default();
    enc.nodes.insert("1".into(), NodeSpec::new("LoadImage").with_input("image", InputValue::Const(json!("input.png"))));
    enc.nodes.insert("2".into(), NodeSpec::new("VAELoader").with_input("vae_name", InputValue::Const(json!("taef2"))));
    enc.nodes.insert("3".into(), NodeSpec::new("ImageScale").with_input("image", link("1", 0)).with_input("upscale_method", InputValue::Const(json!("nearest"))).with_input("width", InputValue::Const(json!(64))).with_input("height", InputValue::Const(json!(32))).with_input("crop", InputValue::Const(json!("disabled"))));
    enc.nodes.insert("4".into(), NodeSpec::new("VAEEncode").with_input("pixels", link("3", 0)).with_input("vae", link("2", 0)));
    enc.nodes.insert("5".into(), NodeSpec::new("VAEDecode").with_input("samples", link("4", 0)).with_input("vae", link("2", 0)));
    enc.nodes.insert("6".into(), NodeSpec::new("SaveImage").with_input("images", link("5", 0)).with_input("filename_prefix", InputValue::Const(json!("taef2"))));
    let (w, h, _) = env.run_saved(&enc, "6");
    assert_eq!((w, h), (64, 32));
}

/// FLUX.2 dev: Mistral's three layers as the text, the distilled guidance read.
#[test]
fn the_dev_workflow_runs_and_its_guidance_matters() {
    let env = env();
    let wf = env.workflow("flux2_dev.json", 32, 2);
    let (w, h, px) = env.run_saved(&wf, "13");
    assert_eq!((w, h), (32, 32));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
    let base = env.run_saved_hash(&wf, "13");
    for (node, input, v) in [("4", "text", json!("a (red:1.3) fox")), ("6", "guidance", json!(1.5))] {
        assert_ne!(env.run_saved_hash(&with_input(&wf, node, input, v.clone()), "13"), base, "{node}.{input} = {v}");
    }
    // klein's Qwen3 on dev gives states of the wrong width: named, not a crash.
    let e = env.run_err(&with_input(&wf, "2", "clip_name", json!("qwen_3_4b_klein.safetensors")));
    assert!(e.contains("192") || e.contains("wide"), "{e}");
    // Mistral for Z-Image (type lumina2): the wrong language model, named with the file.
    let e = env.run_err(&with_input(&wf, "2", "type", json!("lumina2")));
    assert!(e.contains("mistral_3_small_flux2_bf16.safetensors") && e.contains("Qwen3-4B"), "{e}");
}

/// The klein transformer saved in diffusers' names (`Flux2Transformer2DModel`) loads as
/// BFL's file does and makes the same image.
#[test]
fn a_diffusers_named_transformer_is_the_same_model() {
    let env = env();
    let wf = env.workflow("flux2_klein.json", 32, 2);
    let twin = with_input(&wf, "1", "unet_name", json!("flux2_klein_diffusers.safetensors"));
    assert_eq!(env.run_saved_hash(&twin, "12"), env.run_saved_hash(&wf, "12"));
}

/// FLUX.2 dev's Mistral as llama.cpp writes it (GGUF, architecture `llama`, q and k rows
/// interleaved per head): in bf16 the same image as the safetensors file (the rows are put
/// back exactly); in Q8_0 it runs too.
#[test]
fn a_llama_cpp_mistral_gguf_conditions_dev() {
    use sdflow_core::dtype::{self, DType};
    use sdflow_core::io::gguf::Value;
    let env = env();
    let enc = env.dir.path().join("models/text_encoders");
    let src = sdflow_core::io::open(&enc.join("mistral_3_small_flux2_bf16.safetensors")).unwrap();
    let llama = |hf: &str| sdflow_core::models::llm::llama_cpp_name(hf).unwrap();
    // One 128-wide head each for q and k: llama.cpp's row order is (pair, half).
    let interleave = |bytes: &[u8], rows: usize| -> Vec<u8> {
        let row = bytes.len() / rows;
        let mut out = vec![0u8; bytes.len()];
        for r in 0..rows {
            let dst = 2 * (r % (rows / 2)) + r / (rows / 2);
            out[dst * row..(dst + 1) * row].copy_from_slice(&bytes[r * row..(r + 1) * row]);
        }
        out
    };
    for (file, quant) in [("mistral_bf16.gguf", false), ("mistral_q8_0.gguf", true)] {
        let tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)> = src
            .tensors()
            .iter()
            .map(|t| {
                let mut b = src.read(&t.name).unwrap().to_vec();
                if t.name.contains("q_proj") || t.name.contains("k_proj") {
                    b = interleave(&b, t.shape[0]);
                }
                if quant && t.shape.len() == 2 && !t.name.contains("embed") {
                    let f = dtype::convert(t.dtype, &b, &t.shape, DType::F32).unwrap();
                    (llama(&t.name), DType::Q8_0, t.shape.clone(), dtype::convert(DType::F32, &f, &t.shape, DType::Q8_0).unwrap())
                } else {
                    (llama(&t.name), t.dtype, t.shape.clone(), b)
                }
            })
            .collect();
        let kv = [("general.architecture".to_string(), Value::String("llama".into())), ("llama.attention.head_count".to_string(), Value::U32(1)), ("llama.attention.head_count_kv".to_string(), Value::U32(1))];
        sdflow_core::io::gguf::write(&enc.join(file), &kv, tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))).unwrap();
    }
    let wf = env.workflow("flux2_dev.json", 32, 2);
    let base = env.run_saved_hash(&wf, "13");
    assert_eq!(env.run_saved_hash(&with_input(&wf, "2", "clip_name", json!("mistral_bf16.gguf")), "13"), base, "the GGUF's rows put back exactly");
    let (w, h, px) = env.run_saved(&with_input(&wf, "2", "clip_name", json!("mistral_q8_0.gguf")), "13");
    assert_eq!((w, h), (32, 32));
    assert!(px.iter().max().unwrap() - px.iter().min().unwrap() > 10, "the image is not flat");
}

/// The edit workflow: the input image's latent as a reference; the output takes the
/// scaled input's size, and the reference changes the image.
#[test]
fn the_klein_edit_workflow_reads_its_reference() {
    let env = env();
    // The 72×56 input scaled to 0.01 megapixels (113×88): the tiny run needs no megapixel.
    let wf = with_input(&env.workflow("flux2_klein_edit.json", 32, 2), "5", "megapixels", json!(0.01));
    // The latent and schedule sizes follow the scaled image (shrink set them; the links are ComfyUI's).
    let mut wf = wf;
    for (node, input, out) in [("10", "width", 0), ("10", "height", 1), ("13", "width", 0), ("13", "height", 1)] {
        wf.set_input(node, input, link("6", out)).unwrap();
    }
    // The latent of 113×88 pixels is 7×5 FLUX.2 tokens: 112×80 out.
    let (w, h, _) = env.run_saved(&wf, "17");
    assert_eq!((w, h), (112, 80));
    let base = env.run_saved_hash(&wf, "17");
    // Without the reference (the plain prompt on both sides) the image differs.
    let mut plain = wf.clone();
    plain.set_input("11", "positive", link("8", 0)).unwrap();
    plain.set_input("11", "negative", link("8", 0)).unwrap();
    assert_ne!(env.run_saved_hash(&plain, "17"), base);
    // Another input image, another edit.
    sdflow_tests::write_test_png(&env.dir.path().join("input/other.png"), 56, 72);
    assert_ne!(env.run_saved_hash(&with_input(&wf, "4", "image", json!("other.png")), "17"), base);
    // A reference from another family's VAE is named.
    let mut wrong = wf.clone();
    wrong.nodes.insert("30".into(), NodeSpec::new("VAELoader").with_input("vae_name", InputValue::Const(json!("ae.safetensors"))));
    wrong.set_input("7", "vae", link("30", 0)).unwrap();
    let e = env.run_err(&wrong);
    assert!(e.contains("FLUX.2 VAE"), "{e}");
}

/// VAEEncode gives the model's latent (128 channels at 1/16) and VAEDecode takes it back:
/// img2img through KSampler at denoise 0.5 runs on an encoded image.
#[test]
fn the_flux2_vae_works_in_the_models_latent_space() {
    let env = env();
    let mut wf = env.workflow("flux2_klein.json", 32, 2);
    wf.nodes.insert("20".into(), NodeSpec::new("LoadImage").with_input("image", InputValue::Const(json!("input.png"))));
    wf.nodes.insert("21".into(), NodeSpec::new("VAEEncode").with_input("pixels", link("20", 0)).with_input("vae", link("3", 0)));
    wf.nodes.insert(
        "22".into(),
        NodeSpec::new("KSampler")
            .with_input("model", link("1", 0))
            .with_input("seed", InputValue::Const(json!(1)))
            .with_input("steps", InputValue::Const(json!(2)))
            .with_input("cfg", InputValue::Const(json!(1.0)))
            .with_input("sampler_name", InputValue::Const(json!("euler")))
            .with_input("scheduler", InputValue::Const(json!("simple")))
            .with_input("positive", link("4", 0))
            .with_input("negative", link("4", 0))
            .with_input("latent_image", link("21", 0))
            .with_input("denoise", InputValue::Const(json!(0.5))),
    );
    wf.set_input("11", "samples", link("22", 0)).unwrap();
    // The 72×56 input cropped to whole 16-pixel latent pixels.
    let (w, h, _) = env.run_saved(&wf, "12");
    assert_eq!((w, h), (64, 48));
}

#[test]
fn bad_combinations_are_named_errors() {
    let env = env();
    let wf = env.workflow("flux2_klein.json", 32, 2);
    // Z-Image's text encoder type gives one layer's states, not three.
    let e = env.run_err(&with_input(&wf, "2", "type", json!("lumina2")));
    assert!(e.contains("three LLM layers"), "{e}");
    // FLUX.1's 16-channel ae cannot decode FLUX.2's latent.
    let e = env.run_err(&with_input(&wf, "3", "vae_name", json!("ae.safetensors")));
    assert!(e.contains("128 channels"), "{e}");
    // FLUX.2's text on Z-Image: three layers' states are not its one.
    let mut z = wf.clone();
    z.set_input("6", "model", link("30", 0)).unwrap();
    z.nodes.insert("30".into(), NodeSpec::new("UNETLoader").with_input("unet_name", InputValue::Const(json!("z_image_turbo_bf16.safetensors"))).with_input("weight_dtype", InputValue::Const(json!("default"))));
    let e = env.run_err(&z);
    assert!(e.contains("caption tokens 96 wide"), "{e}");
}
