//! diffusers pipeline folders as checkpoints: a folder converted from a single file by
//! diffusers' own converters ([`write_pipeline_folder`]) gives exactly the single file's
//! image.

use std::collections::BTreeMap;

use sdflow_core::dtype::DType;
use sdflow_core::io::{self, safetensors, WeightType};
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_tests::{with_input, write_pipeline_folder, TestEnv};

struct Case {
    name: &'static str,
    config: SdConfig,
    class: &'static str,
    workflow: &'static str,
}

fn env_with(case: &Case, predictions: &[&str]) -> TestEnv {
    env_typed(case, predictions, WeightType::Stored)
}

fn env_typed(case: &Case, predictions: &[&str], weights: WeightType) -> TestEnv {
    let env = TestEnv::new(|rt| rt);
    let ckpts = env.dir.path().join("models/checkpoints");
    let single = ckpts.join(format!("{}.safetensors", case.name));
    write_checkpoint(&single, &case.config, DType::F32, 21, Format::Safetensors).unwrap();
    for p in predictions {
        write_pipeline_folder(&single, &ckpts.join(format!("{}_{p}", case.name)), case.name, case.class, p);
    }
    // TestEnv lists the models folder when nodes register; a new one sees the files.
    TestEnv::with_dir(env.dir, |mut rt| {
        rt.weight_type = weights;
        rt
    })
}

fn image(env: &TestEnv, case: &Case, ckpt: &str) -> Vec<u8> {
    let wf = env.workflow(case.workflow, 64, 2);
    let loader = sdflow_tests::node_of(&wf, "CheckpointLoaderSimple");
    let save = sdflow_tests::node_of(&wf, "SaveImage");
    env.run_saved(&with_input(&wf, &loader, "ckpt_name", serde_json::json!(ckpt)), &save).2
}

fn cases() -> [Case; 3] {
    [
        Case { name: "sd1", config: SdConfig::tiny_sd1(), class: "StableDiffusionPipeline", workflow: "txt2img.json" },
        Case { name: "sd2", config: SdConfig::tiny_sd2(), class: "StableDiffusionPipeline", workflow: "txt2img.json" },
        Case { name: "sdxl", config: SdConfig::tiny_sdxl(), class: "StableDiffusionXLPipeline", workflow: "sdxl_txt2img.json" },
    ]
}

/// Not a test: writes the checkpoints make_pipeline_names.py converts, into the folder
/// `SDFLOW_PIPELINE_CKPTS` names.
#[test]
#[ignore]
fn write_checkpoints_for_make_pipeline_names() {
    let dir = std::path::PathBuf::from(std::env::var("SDFLOW_PIPELINE_CKPTS").expect("SDFLOW_PIPELINE_CKPTS"));
    std::fs::create_dir_all(&dir).unwrap();
    for c in cases() {
        write_checkpoint(&dir.join(format!("{}.safetensors", c.name)), &c.config, DType::F32, 21, Format::Safetensors).unwrap();
    }
}

/// The image of `case`'s single file, and its folder's with each scheduler `prediction`.
fn single_and_folders(case: &Case, predictions: &[&str]) -> (Vec<u8>, Vec<Vec<u8>>) {
    single_and_folders_as(case, predictions, WeightType::Stored)
}

fn single_and_folders_as(case: &Case, predictions: &[&str], weights: WeightType) -> (Vec<u8>, Vec<Vec<u8>>) {
    let env = env_typed(case, predictions, weights);
    let single = image(&env, case, &format!("{}.safetensors", case.name));
    (single, predictions.iter().map(|p| image(&env, case, &format!("{}_{p}", case.name))).collect())
}

#[test]
fn sd1_pipeline_folder_gives_the_single_file_image() {
    let [case, _, _] = cases();
    let (single, folders) = single_and_folders(&case, &["epsilon"]);
    assert_eq!(folders[0], single);
}

/// SD2's folder drops OpenCLIP's last layer (diffusers' conversion) and reads the last one
/// kept: the single file's default penultimate layer. Its scheduler config, not the
/// weights, says v-prediction.
#[test]
fn sd2_pipeline_folder_gives_the_single_file_image_and_reads_its_prediction() {
    let [_, case, _] = cases();
    let (single, folders) = single_and_folders(&case, &["epsilon", "v_prediction"]);
    assert_eq!(folders[0], single);
    assert_ne!(folders[1], single, "the scheduler config's v_prediction counts");
}

/// SDXL's second encoder is a Hugging Face `CLIPTextModelWithProjection` (its pooled
/// projection transposed from OpenCLIP's, q/k/v split), padded as OpenCLIP pads.
#[test]
fn sdxl_pipeline_folder_gives_the_single_file_image() {
    let [_, _, case] = cases();
    let (single, folders) = single_and_folders(&case, &["epsilon"]);
    assert_eq!(folders[0], single);
}

/// Loaded as bf16 (the default on CPUs with bf16 units) the folder still gives the single
/// file's image: the type rules see neither OpenCLIP's fused `in_proj_bias` (a vector, kept
/// f32 like Hugging Face's `q_proj.bias`) nor its transposed pooled projection (a bf16
/// product, like the Linear's) differently from their Hugging Face twins.
#[test]
fn openclip_and_hugging_face_encoders_agree_in_bf16() {
    let [_, sd2, sdxl] = cases();
    for case in [sd2, sdxl] {
        let (single, folders) = single_and_folders_as(&case, &["epsilon"], WeightType::Floats(DType::BF16));
        assert_eq!(folders[0], single, "{}", case.name);
    }
}

/// `rescale_betas_zero_snr` in the scheduler config: the zero-terminal-SNR schedule, the
/// one ModelSamplingDiscrete's zsnr gives.
#[test]
fn zero_snr_scheduler_config_rescales_the_schedule() {
    let [_, case, _] = cases();
    let env = env_with(&case, &["v_prediction"]);
    let wf = env.workflow(case.workflow, 64, 2);
    let (loader, sampler, save) = (sdflow_tests::node_of(&wf, "CheckpointLoaderSimple"), sdflow_tests::node_of(&wf, "KSampler"), sdflow_tests::node_of(&wf, "SaveImage"));
    let wf = with_input(&wf, &loader, "ckpt_name", serde_json::json!("sd2_v_prediction"));
    let plain = env.run_saved(&wf, &save).2;
    let mut by_node = wf.clone();
    let c = |v: serde_json::Value| sdflow_executor::InputValue::Const(v);
    by_node.nodes.insert(
        "30".into(),
        sdflow_executor::NodeSpec::new("ModelSamplingDiscrete").with_input("model", sdflow_executor::InputValue::link(loader.as_str(), 0)).with_input("sampling", c(serde_json::json!("v_prediction"))).with_input("zsnr", c(serde_json::json!(true))),
    );
    by_node.set_input(&sampler, "model", sdflow_executor::InputValue::link("30", 0)).unwrap();
    let zsnr = env.run_saved(&by_node, &save).2;
    assert_ne!(zsnr, plain);
    let config = env.dir.path().join("models/checkpoints/sd2_v_prediction/scheduler/scheduler_config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json["rescale_betas_zero_snr"] = serde_json::json!(true);
    std::fs::write(&config, json.to_string()).unwrap();
    assert_eq!(env.run_saved(&wf, &save).2, zsnr);
    json["rescale_betas_zero_snr"] = serde_json::json!("yes");
    std::fs::write(&config, json.to_string()).unwrap();
    let e = env.run_err(&wf);
    assert!(e.contains("rescale_betas_zero_snr"), "{e}");
}

#[test]
fn broken_pipeline_folders_are_named_errors() {
    let [case, _, _] = cases();
    let env = env_with(&case, &["epsilon"]);
    let dir = env.dir.path().join("models/checkpoints/sd1_epsilon");
    let wf = env.workflow(case.workflow, 64, 1);
    let loader = sdflow_tests::node_of(&wf, "CheckpointLoaderSimple");
    let run = || env.run_err(&with_input(&wf, &loader, "ckpt_name", serde_json::json!("sd1_epsilon")));

    std::fs::write(dir.join("scheduler/scheduler_config.json"), r#"{"prediction_type": "sample"}"#).unwrap();
    let e = run();
    assert!(e.contains("scheduler_config.json") && e.contains("sample"), "{e}");
    std::fs::write(dir.join("scheduler/scheduler_config.json"), "{not json").unwrap();
    let e = run();
    assert!(e.contains("scheduler_config.json") && e.contains("invalid JSON"), "{e}");
    std::fs::remove_dir_all(dir.join("scheduler")).unwrap();

    // A UNet tensor diffusers' layout has no place for.
    let unet = dir.join("unet/diffusion_pytorch_model.safetensors");
    let src = io::open(&unet).unwrap();
    let mut all: Vec<(String, Vec<usize>, Vec<u8>)> = src.tensors().iter().map(|t| (t.name.clone(), t.shape.clone(), src.read(&t.name).unwrap().to_vec())).collect();
    drop(src);
    all.push(("up_blocks.0.mystery.weight".into(), vec![1], vec![0; 4]));
    safetensors::write(&unet, all.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    let e = run();
    assert!(e.contains("unet.up_blocks.0.mystery.weight") && e.contains("sd1_epsilon"), "{e}");

    // No text encoder: at this reduced width nothing then tells SD1 from SD2.
    all.pop();
    safetensors::write(&unet, all.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    std::fs::remove_dir_all(dir.join("text_encoder")).unwrap();
    let e = run();
    assert!(e.contains("sd1_epsilon") && e.contains("matches no known family"), "{e}");
}
