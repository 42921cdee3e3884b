//! The SAMPLER nodes with options (KSamplerSelectAdvanced: sd-cli's `--eta`, s_noise,
//! Brownian-tree noise; ComfyUI's SamplerEulerAncestral, SamplerLMS, ...) and ComfyUI's
//! ManualSigmas (sd-cli's `--sigmas`), run through SamplerCustom on the tiny SD1 model
//! against KSampler's images.

use sdflow_core::sampling::schedule::{DiscreteSchedule, ScheduleOpts, Scheduler};
use sdflow_executor::{InputValue, NodeSpec, Workflow};
use sdflow_tests::{with_input, TestEnv};
use serde_json::json;

fn c(v: serde_json::Value) -> InputValue {
    InputValue::Const(v)
}

/// txt2img at 64², 3 steps; node 5 is its KSampler, 7 its SaveImage.
fn base(env: &TestEnv) -> Workflow {
    env.workflow("txt2img.json", 64, 3)
}

/// `wf` with SamplerCustom in node 5's place (same model, prompts, latent, seed, cfg),
/// taking its SAMPLER from `sampler` and its SIGMAS from `sigmas` (default: the
/// KSampler's own scheduler and steps through BasicScheduler).
fn custom(wf: &Workflow, sampler: NodeSpec, sigmas: Option<NodeSpec>) -> Workflow {
    let mut wf = wf.clone();
    let ks = wf.nodes["5"].clone();
    let sigmas = sigmas.unwrap_or_else(|| {
        NodeSpec::new("BasicScheduler")
            .with_input("model", ks.inputs["model"].clone())
            .with_input("scheduler", ks.inputs["scheduler"].clone())
            .with_input("steps", ks.inputs["steps"].clone())
            .with_input("denoise", c(json!(1.0)))
    });
    wf.nodes.insert("20".into(), sampler);
    wf.nodes.insert("21".into(), sigmas);
    let node = NodeSpec::new("SamplerCustom")
        .with_input("model", ks.inputs["model"].clone())
        .with_input("add_noise", c(json!(true)))
        .with_input("noise_seed", ks.inputs["seed"].clone())
        .with_input("cfg", ks.inputs["cfg"].clone())
        .with_input("positive", ks.inputs["positive"].clone())
        .with_input("negative", ks.inputs["negative"].clone())
        .with_input("sampler", InputValue::link("20", 0))
        .with_input("sigmas", InputValue::link("21", 0))
        .with_input("latent_image", ks.inputs["latent_image"].clone());
    wf.nodes.insert("5".into(), node);
    wf
}

fn select(sampler: &str, eta: f64, s_noise: f64, noise: &str) -> NodeSpec {
    NodeSpec::new("KSamplerSelectAdvanced")
        .with_input("sampler_name", c(json!(sampler)))
        .with_input("eta", c(json!(eta)))
        .with_input("s_noise", c(json!(s_noise)))
        .with_input("noise", c(json!(noise)))
}

fn image(env: &TestEnv, wf: &Workflow) -> u64 {
    env.run_saved_hash(wf, "7")
}

/// KSampler with `sampler`.
fn ksampler(env: &TestEnv, wf: &Workflow, sampler: &str) -> u64 {
    image(env, &with_input(wf, "5", "sampler_name", json!(sampler)))
}

#[test]
fn eta_s_noise_and_noise_options_change_exactly_what_they_should() {
    let env = TestEnv::new(|rt| rt);
    let wf = base(&env);
    let euler_a = ksampler(&env, &wf, "euler_ancestral");
    // The defaults are KSampler's: sd.cpp's eta per sampler (1 for euler_a).
    assert_eq!(image(&env, &custom(&wf, select("euler_ancestral", -1.0, 1.0, "sampler"), None)), euler_a);
    assert_eq!(image(&env, &custom(&wf, select("euler_ancestral", 1.0, 1.0, "sampler"), None)), euler_a);
    let comfy = NodeSpec::new("SamplerEulerAncestral").with_input("eta", c(json!(1.0))).with_input("s_noise", c(json!(1.0)));
    assert_eq!(image(&env, &custom(&wf, comfy, None)), euler_a);
    // Ancestral steps without noise are Euler's steps.
    let no_eta = image(&env, &custom(&wf, select("euler_ancestral", 0.0, 1.0, "sampler"), None));
    assert_eq!(no_eta, ksampler(&env, &wf, "euler"));
    assert_ne!(no_eta, euler_a);
    // Less noise per step, or the noise from a Brownian tree: other images.
    let half = NodeSpec::new("SamplerEulerAncestral").with_input("eta", c(json!(1.0))).with_input("s_noise", c(json!(0.5)));
    assert_ne!(image(&env, &custom(&wf, half, None)), euler_a);
    assert_ne!(image(&env, &custom(&wf, select("euler_ancestral", -1.0, 1.0, "brownian_tree"), None)), euler_a);
    // dpm++2m_sde_bt is dpm++2m_sde with Brownian-tree noise.
    let bt = ksampler(&env, &wf, "dpm++2m_sde_bt");
    assert_eq!(image(&env, &custom(&wf, select("dpm++2m_sde", -1.0, 1.0, "brownian_tree"), None)), bt);
    assert_ne!(image(&env, &custom(&wf, select("dpm++2m_sde", -1.0, 1.0, "sampler"), None)), bt);
    // An eta on an ODE sampler that takes one (ddim_trailing: sd.cpp's default 0).
    let ddim = ksampler(&env, &wf, "ddim_trailing");
    assert_eq!(image(&env, &custom(&wf, select("ddim_trailing", 0.0, 1.0, "sampler"), None)), ddim);
    assert_ne!(image(&env, &custom(&wf, select("ddim_trailing", 0.7, 1.0, "sampler"), None)), ddim);
}

#[test]
fn lms_order_is_an_option() {
    let env = TestEnv::new(|rt| rt);
    let wf = base(&env);
    let lms = ksampler(&env, &wf, "lms");
    let order = |o: i64| image(&env, &custom(&wf, NodeSpec::new("SamplerLMS").with_input("order", c(json!(o))), None));
    assert_eq!(order(4), lms);
    assert_ne!(order(1), lms);
    let err = env.run_err(&custom(&wf, NodeSpec::new("SamplerLMS").with_input("order", c(json!(40))), None));
    assert!(err.contains("failed validation"), "order 40 is above the widget's range: {err}");
}

#[test]
fn manual_sigmas_are_the_schedule_as_typed() {
    let env = TestEnv::new(|rt| rt);
    let wf = base(&env);
    let euler_a = ksampler(&env, &wf, "euler_ancestral");
    // KSampler's `normal` schedule for 3 steps, typed out.
    let sigmas = Scheduler::Discrete.sigmas(3, &DiscreteSchedule::sd(), &ScheduleOpts::default()).unwrap();
    let typed: Vec<String> = sigmas.iter().map(f32::to_string).collect();
    let manual = |text: &str| NodeSpec::new("ManualSigmas").with_input("sigmas", c(json!(text)));
    let kselect = NodeSpec::new("KSamplerSelect").with_input("sampler_name", c(json!("euler_ancestral")));
    assert_eq!(image(&env, &custom(&wf, kselect.clone(), Some(manual(&typed.join(", "))))), euler_a);
    assert_eq!(image(&env, &custom(&wf, kselect.clone(), Some(manual(&format!("[{}]", typed.join(" ")))))), euler_a, "spaces and brackets");
    // Another schedule, another image.
    assert_ne!(image(&env, &custom(&wf, kselect.clone(), Some(manual("14.6, 5.0, 1.0, 0.0")))), euler_a);
    for (text, expect) in [("14.6, seven, 0", "(\"seven\") is not a number"), ("3.0", "at least 2"), ("3.0, -1.0", "-1"), ("", "at least 2")] {
        let err = env.run_err(&custom(&wf, kselect.clone(), Some(manual(text))));
        assert!(err.contains("ManualSigmas") && err.contains(expect), "{text:?}: {err}");
    }
}

/// ComfyUI's noise (the `cpu` generator): every step's noise comes from a generator of
/// its own seeded with the seed, so sampling an already-noised latent without adding
/// noise (same seed) continues exactly as sampling with the noise added. sd.cpp's
/// generators (`cuda` here) continue the initial noise's stream instead, so there the two
/// differ.
#[test]
fn comfyuis_step_noise_restarts_from_the_seed() {
    let env = TestEnv::new(|rt| rt);
    let wf = base(&env);
    let sampler = |name: &str| NodeSpec::new("KSamplerSelect").with_input("sampler_name", c(json!(name)));
    let manual = |text: &str| NodeSpec::new("ManualSigmas").with_input("sigmas", c(json!(text)));
    let run = |rng: &str| {
        let with_rng = |mut n: NodeSpec, add: bool| {
            n.inputs.insert("rng".into(), c(json!(rng)));
            n.inputs.insert("add_noise".into(), c(json!(add)));
            n
        };
        // Noise and euler_ancestral down 8 → 2 → 0 in one go.
        let mut one = custom(&wf, sampler("euler_ancestral"), Some(manual("8.0, 2.0, 0.0")));
        one.nodes.insert("5".into(), with_rng(one.nodes["5"].clone(), true));
        let a = env.run_latent(&one, "5");
        // The same from a latent noised to 8 first (an euler step of length 0), the
        // sampler adding no noise of its own.
        let mut two = custom(&wf, sampler("euler"), Some(manual("8.0, 8.0")));
        two.nodes.insert("5".into(), with_rng(two.nodes["5"].clone(), true));
        let second = with_rng(one.nodes["5"].clone(), false).with_input("latent_image", InputValue::link("5", 0)).with_input("sampler", InputValue::link("22", 0)).with_input("sigmas", InputValue::link("23", 0));
        two.nodes.insert("22".into(), sampler("euler_ancestral"));
        two.nodes.insert("23".into(), manual("8.0, 2.0, 0.0"));
        two.nodes.insert("24".into(), second);
        let save = two.nodes["6"].clone().with_input("samples", InputValue::link("24", 0));
        two.nodes.insert("6".into(), save);
        let b = env.run_latent(&two, "24");
        a.samples.iter().zip(&b.samples).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max)
    };
    // Equal but for the rounding of the latent's trip out of and back into model space.
    let comfy = run("cpu");
    let sdcpp = run("cuda");
    assert!(comfy < 5e-3, "ComfyUI's noise: {comfy}");
    assert!(sdcpp > 100.0 * comfy.max(1e-4), "sd.cpp's stream: {sdcpp} against {comfy}");
}
