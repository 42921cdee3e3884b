//! PhotoMaker end to end: `workflows/photomaker.json` on the tiny SDXL checkpoint with tiny
//! PhotoMaker v1/v2 files in the official layout and a folder of two ID images. A prompt
//! without the trigger word runs without the identity (the plain prompt's image), the
//! style strength decides which steps see the identity (100: none, so the prompt without
//! the trigger), v2 takes sd.cpp's id_embeds dump, and bad inputs fail naming the place.

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{InputValue, Workflow};
use sdflow_tests::{node_of, tiny_tree, write_photomaker_models, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_tree(dir.path());
    write_checkpoint(&dir.path().join("models/checkpoints/sdxl.safetensors"), &SdConfig::tiny_sdxl(), DType::F32, 10, Format::Safetensors).unwrap();
    write_photomaker_models(dir.path());
    std::fs::create_dir_all(input.join("empty_dir")).unwrap();
    std::fs::write(input.join("empty_dir/notes.txt"), b"no images here").unwrap();
    std::fs::create_dir_all(input.join("broken_dir")).unwrap();
    std::fs::write(input.join("broken_dir/face.png"), b"not a png").unwrap();
    std::fs::write(dir.path().join("models/photomaker/broken.safetensors"), b"garbage").unwrap();
    TestEnv::with_dir(dir, |rt| rt)
}

use sdflow_tests::with_input as set;

/// The workflow with the positive prompt from the negative's CLIPTextEncode, both set to
/// `text`: what the same sampler gives for a plain prompt.
fn plain(wf: &Workflow, text: &str) -> Workflow {
    let (neg, sampler) = (node_of(wf, "CLIPTextEncode"), node_of(wf, "KSampler"));
    let mut p = set(wf, &neg, "text", json!(text));
    p.set_input(&sampler, "positive", InputValue::link(neg, 0)).unwrap();
    p
}

#[test]
fn photomaker_workflow_runs_and_style_strength_decides_the_steps() {
    let env = env();
    let wf = env.workflow("photomaker.json", 64, 5);
    let (enc, save) = (node_of(&wf, "PhotoMakerEncode"), node_of(&wf, "SaveImage"));
    let (w, h, id20) = env.run_saved(&wf, &save);
    assert_eq!((w, h), (64, 64));
    let (_, _, id0) = env.run_saved(&set(&wf, &enc, "style_strength", json!(0.0)), &save);
    assert_ne!(id0, id20, "the first step without the identity changes the image");
    // Style strength 100: the identity never guides, so the image is the prompt's
    // without the trigger word (compared with both prompts the same, as `plain` needs).
    let both = "a photo of a man, in a garden, soft light";
    let (_, _, plain_img) = env.run_saved(&plain(&wf, both), &save);
    let (_, _, id100_same_neg) = env.run_saved(&set(&set(&wf, &node_of(&wf, "CLIPTextEncode"), "text", json!(both)), &enc, "style_strength", json!(100.0)), &save);
    assert_eq!(id100_same_neg, plain_img, "style strength 100 is the prompt without the trigger at every step");
}

#[test]
fn a_prompt_without_the_trigger_runs_without_photomaker() {
    let env = env();
    let wf = env.workflow("photomaker.json", 64, 3);
    let enc = node_of(&wf, "PhotoMakerEncode");
    let save = node_of(&wf, "SaveImage");
    let text = "a photo of a man in a garden";
    let no_trigger = set(&set(&wf, &enc, "text", json!(text)), &node_of(&wf, "CLIPTextEncode"), "text", json!(text));
    let (_, _, a) = env.run_saved(&no_trigger, &save);
    let (_, _, b) = env.run_saved(&plain(&wf, text), &save);
    assert_eq!(a, b, "without the trigger word the prompt is encoded as CLIPTextEncode does");
}

#[test]
fn photomaker_v2_takes_the_face_embeddings_file() {
    let env = env();
    let wf = env.workflow("photomaker.json", 64, 3);
    let (loader, enc, save) = (node_of(&wf, "PhotoMakerLoader"), node_of(&wf, "PhotoMakerEncode"), node_of(&wf, "SaveImage"));
    let v2 = set(&wf, &loader, "photomaker_model_name", json!("photomaker-v2.safetensors"));
    let e = env.run_err(&v2);
    assert!(e.contains("photomaker-v2.safetensors") && e.contains("id_embeds"), "{e}");
    let (_, _, a) = env.run_saved(&set(&v2, &enc, "id_embeds", json!("photomaker_id/id_embeds.bin")), &save);
    let (_, _, v1) = env.run_saved(&wf, &save);
    assert_ne!(a, v1);
}

#[test]
fn bad_inputs_fail_naming_the_place() {
    let env = env();
    let wf = env.workflow("photomaker.json", 64, 2);
    let (loader, dir) = (node_of(&wf, "PhotoMakerLoader"), node_of(&wf, "LoadImagesFromDir"));
    let e = env.run_err(&set(&wf, &dir, "directory", json!("empty_dir")));
    assert!(e.contains("empty_dir") && e.contains("no image files"), "{e}");
    let e = env.run_err(&set(&wf, &dir, "directory", json!("broken_dir")));
    assert!(e.contains("face.png"), "{e}");
    let e = env.run_err(&set(&wf, &loader, "photomaker_model_name", json!("broken.safetensors")));
    assert!(e.contains("broken.safetensors"), "{e}");
    let e = env.run_err(&set(&wf, &dir, "directory", json!("../outside")));
    assert!(e.contains("inside the input folder"), "{e}");
}
