//! Instruct-pix2pix on a tiny 8-channel checkpoint: `workflows/instruct_pix2pix.json`
//! runs, and sd.cpp's image CFG (DualCFGGuider) reduces to plain CFG exactly where
//! sd.cpp's formula does. Image CFG on a 9-channel inpainting checkpoint likewise.

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{CancelToken, InputValue, NodeSpec, NullSink, RunOptions, Workflow};
use sdflow_tests::{write_mask_png, write_test_png, TestEnv};
use serde_json::json;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_pix2pix(), DType::F32, 11, Format::Safetensors).unwrap();
    let mut inpaint = SdConfig::tiny_sd1_f8();
    inpaint.unet.in_channels = 9;
    write_checkpoint(&ckpts.join("inpaint.safetensors"), &inpaint, DType::F32, 8, Format::Safetensors).unwrap();
    // CosXL-Edit's structure: an 8-channel SDXL UNet with EDM v-prediction.
    let mut cosxl_edit = SdConfig { edm_vpred: Some((0.002, 120.0)), ..SdConfig::tiny_sdxl() };
    cosxl_edit.unet.in_channels = 8;
    write_checkpoint(&ckpts.join("cosxl_edit.safetensors"), &cosxl_edit, DType::F32, 12, Format::Safetensors).unwrap();
    let input = dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    write_test_png(&input.join("input.png"), 72, 56);
    write_mask_png(&input.join("other.png"), 72, 56, |x, y| (x / 9 + y / 7) % 2 == 0);
    write_mask_png(&input.join("mask.png"), 72, 56, |x, _| x >= 36);
    TestEnv::with_dir(dir, |rt| rt)
}

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

fn l(node: &str, out: usize) -> InputValue {
    InputValue::link(node, out)
}

/// The committed workflow at 3 steps.
fn pix2pix(env: &TestEnv) -> Workflow {
    let mut wf = env.workflow("instruct_pix2pix.json", 64, 3);
    wf.set_input("8", "steps", c(json!(3))).unwrap();
    wf
}

/// `wf` with a CFGGuider on `positive`/`negative` in place of the DualCFGGuider.
fn with_cfg_guider(wf: &Workflow, positive: InputValue, negative: InputValue) -> Workflow {
    let mut wf = wf.clone();
    let cfg = NodeSpec::new("CFGGuider").with_input("model", l("1", 0)).with_input("positive", positive).with_input("negative", negative).with_input("cfg", c(json!(7.0)));
    wf.nodes.insert("20".into(), cfg);
    wf.set_input("10", "guider", l("20", 0)).unwrap();
    wf
}

#[test]
fn instruct_pix2pix_runs_at_the_input_size() {
    let env = env();
    let (w, h, _) = env.run_saved(&pix2pix(&env), "12");
    assert_eq!((w, h), (72, 56));
}

#[test]
fn cosxl_edit_runs_the_pix2pix_workflow() {
    let env = env();
    let mut wf = pix2pix(&env);
    wf.set_input("1", "ckpt_name", c(json!("cosxl_edit.safetensors"))).unwrap();
    let (w, h, px) = env.run_saved(&wf, "12");
    assert_eq!((w, h), (72, 56));
    let mut other = wf.clone();
    other.set_input("8", "steps", c(json!(2))).unwrap();
    assert_ne!(env.run_saved(&other, "12").2, px, "steps change the edit");
}

#[test]
fn image_cfg_follows_sd_cpp() {
    let env = env();
    let wf = pix2pix(&env);
    let (_, _, base) = env.run_saved(&wf, "12");

    let mut stronger = wf.clone();
    stronger.set_input("6", "cfg_cond2_negative", c(json!(3.0))).unwrap();
    assert_ne!(env.run_saved(&stronger, "12").2, base, "img-cfg changes the result");

    // img-cfg = cfg: sd.cpp drops the image-only pass, leaving CFG between the prompt
    // with the image and the negative prompt without it.
    let mut equal = wf.clone();
    equal.set_input("6", "cfg_cond2_negative", c(json!(7.0))).unwrap();
    assert_eq!(env.run_saved(&equal, "12").2, env.run_saved(&with_cfg_guider(&wf, l("5", 0), l("3", 0)), "12").2, "img-cfg = cfg is plain CFG");

    // img-cfg = 1: the negative pass drops out, leaving CFG between the prompt and the
    // negative prompt, both with the image — ComfyUI's KSampler on these conditionings.
    let mut one = wf.clone();
    one.set_input("6", "cfg_cond2_negative", c(json!(1.0))).unwrap();
    assert_eq!(env.run_saved(&one, "12").2, env.run_saved(&with_cfg_guider(&wf, l("5", 0), l("5", 1)), "12").2, "img-cfg 1 is CFG with the image on both sides");

    // The source image is what the UNet's extra channels see.
    let mut other = wf.clone();
    other.set_input("4", "image", c(json!("other.png"))).unwrap();
    assert_ne!(env.run_saved(&other, "12").2, base, "the source image matters");
}

#[test]
fn pix2pix_conditionings_drive_a_ksampler_and_plain_latents_still_sample() {
    let env = env();
    let mut wf = pix2pix(&env);
    let ks = NodeSpec::new("KSampler")
        .with_input("model", l("1", 0))
        .with_input("seed", c(json!(42)))
        .with_input("steps", c(json!(2)))
        .with_input("cfg", c(json!(7.0)))
        .with_input("sampler_name", c(json!("euler")))
        .with_input("scheduler", c(json!("normal")))
        .with_input("positive", l("5", 0))
        .with_input("negative", l("5", 1))
        .with_input("latent_image", l("5", 2))
        .with_input("denoise", c(json!(1.0)));
    wf.nodes.insert("21".into(), ks);
    wf.set_input("11", "samples", l("21", 0)).unwrap();
    let (w, h, with_image) = env.run_saved(&wf, "12");
    assert_eq!((w, h), (72, 56));
    // Without InstructPixToPixConditioning the image channels are zeros (ComfyUI's).
    wf.set_input("21", "positive", l("2", 0)).unwrap();
    wf.set_input("21", "negative", l("3", 0)).unwrap();
    assert_ne!(env.run_saved(&wf, "12").2, with_image);
}

#[test]
fn image_cfg_on_an_inpainting_unet() {
    let env = env();
    let mut wf = env.workflow("inpaint.json", 64, 3);
    wf.set_input("1", "ckpt_name", c(json!("inpaint.safetensors"))).unwrap();
    // sd.cpp: the uncond sees no image (ConditioningClearImage), the middle pass the
    // negative prompt with it.
    wf.nodes.insert("20".into(), NodeSpec::new("ConditioningClearImage").with_input("conditioning", l("3", 0)));
    let dual = NodeSpec::new("DualCFGGuider")
        .with_input("model", l("1", 0))
        .with_input("cond1", l("2", 0))
        .with_input("cond2", l("3", 0))
        .with_input("negative", l("20", 0))
        .with_input("cfg_conds", c(json!(7.0)))
        .with_input("cfg_cond2_negative", c(json!(2.0)))
        .with_input("style", c(json!("regular")));
    wf.nodes.insert("21".into(), dual);
    wf.nodes.insert("22".into(), NodeSpec::new("KSamplerSelect").with_input("sampler_name", c(json!("euler"))));
    wf.nodes.insert("23".into(), NodeSpec::new("BasicScheduler").with_input("model", l("1", 0)).with_input("scheduler", c(json!("normal"))).with_input("steps", c(json!(3))).with_input("denoise", c(json!(1.0))));
    wf.nodes.insert("24".into(), NodeSpec::new("RandomNoise").with_input("noise_seed", c(json!(42))));
    let sca = NodeSpec::new("SamplerCustomAdvanced")
        .with_input("noise", l("24", 0))
        .with_input("guider", l("21", 0))
        .with_input("sampler", l("22", 0))
        .with_input("sigmas", l("23", 0))
        .with_input("latent_image", l("6", 0));
    wf.nodes.insert("25".into(), sca);
    wf.set_input("8", "samples", l("25", 0)).unwrap();
    let (w, h, dual) = env.run_saved(&wf, "9");
    assert_eq!((w, h), (72, 56));

    // img-cfg = cfg: CFG against the image-less negative, which differs from ComfyUI's
    // CFG (whose negative sees the image).
    let mut equal = wf.clone();
    equal.set_input("21", "cfg_cond2_negative", c(json!(7.0))).unwrap();
    let equal = env.run_saved(&equal, "9").2;
    assert_ne!(equal, dual, "img-cfg changes the result");
    let mut cfg = wf.clone();
    cfg.nodes.insert("26".into(), NodeSpec::new("CFGGuider").with_input("model", l("1", 0)).with_input("positive", l("2", 0)).with_input("negative", l("20", 0)).with_input("cfg", c(json!(7.0))));
    cfg.set_input("25", "guider", l("26", 0)).unwrap();
    assert_eq!(env.run_saved(&cfg, "9").2, equal);
    cfg.set_input("26", "negative", l("3", 0)).unwrap();
    assert_ne!(env.run_saved(&cfg, "9").2, equal, "a cleared image is not the image");

    // Bad scales are errors, not panics.
    let mut bad = wf.clone();
    bad.set_input("21", "style", c(json!("sideways"))).unwrap();
    assert!(env.exec.run(&bad, &NullSink, &CancelToken::new(), &RunOptions { output_dir: Some(env.out.clone()), ..Default::default() }).is_err());
}
