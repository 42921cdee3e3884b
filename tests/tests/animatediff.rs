//! AnimateDiff end to end on the tiny SD1 checkpoint with tiny motion modules in the
//! release layout (v3, v2 with its mid-block module, v1's 24-frame table) and the v3
//! domain adapter LoRA: the committed workflow to an animated WebP read back frame by
//! frame, what the modules, the schedule and the adapter change, and bad inputs.

use sdflow_executor::{CancelToken, InputValue, NullSink, RunOptions, Workflow};
use sdflow_tests::{with_input, write_animatediff_models, TestEnv};
use serde_json::json;
use webp_animation::Decoder;

fn env() -> TestEnv {
    let dir = tempfile::tempdir().unwrap();
    sdflow_tests::tiny_tree(dir.path());
    write_animatediff_models(dir.path());
    // Misfits: a file that is no motion module, modules made for a wider UNet.
    let mm = dir.path().join("models/animatediff_models");
    std::fs::copy(dir.path().join("models/loras/v3_sd15_adapter.safetensors"), mm.join("adapter.safetensors")).unwrap();
    let wide = sdflow_core::synth::UnetConfig { model_channels: 64, ..sdflow_core::synth::SdConfig::tiny_sd1_f8().unet };
    sdflow_core::synth::write_tensors(&mm.join("wide.safetensors"), &sdflow_core::synth::motion_module_tensors(&wide, false, 32), 5).unwrap();
    TestEnv::with_dir(dir, |rt| rt)
}

/// The RGBA frames of the animated WebP the workflow's SaveAnimatedWEBP (node 9) wrote.
fn frames(env: &TestEnv, wf: &Workflow) -> Vec<Vec<u8>> {
    let opts = RunOptions { output_dir: Some(env.out.clone()), ..Default::default() };
    let report = env.exec.run(wf, &NullSink, &CancelToken::new(), &opts).unwrap();
    let name = report.ui_outputs["9"]["images"][0]["filename"].as_str().unwrap().to_string();
    let bytes = std::fs::read(env.out.join(name)).unwrap();
    Decoder::new(&bytes).unwrap().into_iter().map(|f| f.data().to_vec()).collect()
}

fn frames_n(wf: &Workflow, n: i64) -> Workflow {
    with_input(wf, "6", "batch_size", json!(n))
}

#[test]
fn the_workflow_animates_and_the_motion_module_couples_the_frames() {
    let env = env();
    let wf = frames_n(&env.workflow("animatediff.json", 32, 2), 8);
    let base = frames(&env, &wf);
    assert_eq!(base.len(), 8);
    assert!(base.iter().all(|f| f.len() == 32 * 32 * 4));
    assert_ne!(base[0], base[7], "the video moves");
    assert_eq!(frames(&env, &wf), base, "deterministic");

    // Without the motion module each frame is its own image: its first frame does not
    // depend on how many come after it. With it, the frames attend to each other.
    let mut plain = wf.clone();
    plain.set_input("7", "model", InputValue::link("2", 0)).unwrap();
    let (p8, p4) = (frames(&env, &plain), frames(&env, &frames_n(&plain, 4)));
    assert_eq!(p8[0], p4[0], "plain SD: frame 0 stands alone");
    let a4 = frames(&env, &frames_n(&wf, 4));
    assert_ne!(a4[0], base[0], "AnimateDiff: frame 0 sees the other frames");
    assert_ne!(p8, base);

    // The schedule the module was trained on, the adapter LoRA, v2's mid-block module and
    // v1's table each change the video.
    for (node, input, v) in [("3", "beta_schedule", json!("use existing")), ("3", "beta_schedule", json!("avg(sqrt_linear,linear)")), ("2", "strength_model", json!(0.0)), ("3", "model_name", json!("mm_sd_v15_v2.safetensors")), ("3", "model_name", json!("mm_sd_v14.safetensors"))] {
        assert_ne!(frames(&env, &with_input(&wf, node, input, v.clone())), base, "{node}.{input} = {v}");
    }
    // v1 normalises over the frames (AnimateDiff-Evolved); per frame (sd.cpp) is another video.
    let v1 = with_input(&wf, "3", "model_name", json!("mm_sd_v14.safetensors"));
    assert_ne!(frames(&env, &v1), frames(&env, &with_input(&v1, "3", "v1_groupnorm", json!("per frame"))));
    // ... which v3 ignores.
    assert_eq!(frames(&env, &with_input(&wf, "3", "v1_groupnorm", json!("per frame"))), base);
    // One frame still goes through the modules, as AnimateDiff-Evolved runs it.
    let one = frames(&env, &frames_n(&wf, 1));
    assert_eq!(one.len(), 1);
    assert_ne!(one[0], frames(&env, &frames_n(&plain, 1))[0]);
}

#[test]
fn bad_animatediff_inputs_fail_naming_the_cause() {
    let env = env();
    let wf = env.workflow("animatediff.json", 32, 1);
    // More frames than the module's positional table.
    let e = env.run_err(&frames_n(&wf, 33));
    assert!(e.contains("mm_sd15_v3.safetensors") && e.contains("at most 32"), "{e}");
    let e = env.run_err(&with_input(&frames_n(&wf, 25), "3", "model_name", json!("mm_sd_v14.safetensors")));
    assert!(e.contains("at most 24"), "{e}");
    // A file that is no motion module, modules made for another UNet, and a schedule
    // AnimateDiff-Evolved has but sdflow not.
    let e = env.run_err(&with_input(&wf, "3", "model_name", json!("adapter.safetensors")));
    assert!(e.contains("adapter.safetensors") && e.contains("not an AnimateDiff motion module"), "{e}");
    let e = env.run_err(&with_input(&wf, "3", "model_name", json!("wide.safetensors")));
    assert!(e.contains("wide.safetensors") && e.contains("channels where the UNet has"), "{e}");
    let e = format!("{:?}", env.exec.validate(&with_input(&wf, "3", "beta_schedule", json!("lcm"))).map(|_| ()).unwrap_err().to_json());
    assert!(e.contains("beta_schedule") && e.contains("lcm"), "{e}");
}
