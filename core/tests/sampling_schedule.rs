//! Schedulers against ComfyUI / k-diffusion's Python functions (fixtures from
//! fixtures/sampling/gen_sampling_fixtures.py) and sd.cpp-only schedulers against sd.cpp's
//! formulas.

use std::path::PathBuf;

use sdflow_core::sampling::{
    apply_denoise, parse_sigmas, strength_sigmas, AysModel, DiscreteSchedule, SamplingError,
    ScheduleOpts, Scheduler,
};
use serde_json::Value;

fn fixture() -> Value {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sampling/schedules.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("schedules.json")).expect("json")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1e-3);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (all: {got:?} vs {want:?})"
        );
    }
}

#[test]
fn discrete_model_table_matches_comfyui() {
    let doc = fixture();
    let want = floats(&doc["model_sigmas"]);
    let model = DiscreteSchedule::sd();
    assert_eq!(model.len(), 1000);
    // alphas_cumprod in f64 then f32 sigma math, as torch does: equal to an ulp.
    assert_close(model.sigmas(), &want, 3e-7, "model sigmas");
    assert!((model.sigma_min() - 0.029167).abs() < 1e-5);
    assert!((model.sigma_max() - 14.614642).abs() < 1e-4);
}

/// ModelSamplingDiscrete(zsnr=True): the last sigma is ~4519 (pure noise), the first
/// unchanged. ComfyUI now computes the whole table in f64 from the betas; ours rescales
/// the f32 table of [`DiscreteSchedule::sd`] (which follows the f32 sigma math of the
/// ComfyUI it was checked against), so the low sigmas differ by that table's 1.3e-5.
#[test]
fn zero_terminal_snr_table_matches_comfyui() {
    let doc = fixture();
    let want = floats(&doc["zsnr_sigmas"]);
    let model = DiscreteSchedule::sd().zero_terminal_snr();
    assert_eq!(model.len(), 1000);
    assert_close(model.sigmas(), &want, 2e-5, "zsnr sigmas");
    assert!((model.sigma_max() - 4518.76).abs() < 0.05, "{}", model.sigma_max());
    assert_eq!(model.sigma_min(), DiscreteSchedule::sd().sigma_min());
}

#[test]
fn t_sigma_maps_match_k_diffusion() {
    let doc = fixture();
    let model = DiscreteSchedule::sd();
    let ts = floats(&doc["t_to_sigma"]["t"]);
    let want = floats(&doc["t_to_sigma"]["sigma"]);
    let got: Vec<f32> = ts.iter().map(|&t| model.t_to_sigma(t)).collect();
    assert_close(&got, &want, 2e-6, "t_to_sigma");
    let sig = floats(&doc["sigma_to_t"]["sigma"]);
    let want = floats(&doc["sigma_to_t"]["t"]);
    let got: Vec<f32> = sig.iter().map(|&s| model.sigma_to_t(s)).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 2e-3,
            "sigma_to_t[{i}] ({}): {g} vs {w}",
            sig[i]
        );
    }
    // Round trip inside the table.
    for t in [3.0f32, 17.25, 400.5, 998.0] {
        assert!(
            (model.sigma_to_t(model.t_to_sigma(t)) - t).abs() < 1e-2,
            "round trip {t}"
        );
    }
}

#[test]
fn schedulers_match_comfyui() {
    let doc = fixture();
    let model = DiscreteSchedule::sd();
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["scheduler"].as_str().unwrap();
        let steps = case["steps"].as_u64().unwrap() as usize;
        let want = floats(&case["sigmas"]);
        let (sched, opts) = match name.split_once(':') {
            Some((n, m)) => (
                n.parse::<Scheduler>().unwrap(),
                ScheduleOpts {
                    ays_model: m.parse::<AysModel>().unwrap(),
                    ..Default::default()
                },
            ),
            None => (name.parse::<Scheduler>().unwrap(), ScheduleOpts::default()),
        };
        let got = sched.sigmas(steps, &model, &opts).unwrap();
        // bong_tangent: sd.cpp computes in f32, the reference in f64.
        let rel = if sched == Scheduler::BongTangent {
            2e-5
        } else {
            4e-6
        };
        assert_close(&got, &want, rel, &format!("{name} steps={steps}"));
        assert_eq!(*got.last().unwrap(), 0.0);
        if !matches!(sched, Scheduler::Beta | Scheduler::DdimUniform) {
            assert_eq!(got.len(), steps + 1, "{name} {steps}");
        }
        checked += 1;
    }
    assert!(checked >= 90, "only {checked} cases");
}

#[test]
fn comfyui_denoise_takes_the_tail_of_a_longer_schedule() {
    let doc = fixture();
    let model = DiscreteSchedule::sd();
    for case in doc["denoise"].as_array().unwrap() {
        let sched: Scheduler = case["scheduler"].as_str().unwrap().parse().unwrap();
        let steps = case["steps"].as_u64().unwrap() as usize;
        let denoise = case["denoise"].as_f64().unwrap() as f32;
        let got = apply_denoise(sched, steps, denoise, &model, &ScheduleOpts::default()).unwrap();
        assert_close(
            &got,
            &floats(&case["sigmas"]),
            4e-6,
            &format!("{sched} denoise {denoise}"),
        );
    }
    let full = apply_denoise(Scheduler::Karras, 9, 1.0, &model, &ScheduleOpts::default()).unwrap();
    assert_eq!(
        full,
        Scheduler::Karras
            .sigmas(9, &model, &ScheduleOpts::default())
            .unwrap()
    );
    assert!(
        apply_denoise(Scheduler::Karras, 9, 0.0, &model, &ScheduleOpts::default())
            .unwrap()
            .is_empty()
    );
    assert!(apply_denoise(
        Scheduler::Karras,
        9,
        f32::NAN,
        &model,
        &ScheduleOpts::default()
    )
    .is_err());
    assert!(apply_denoise(
        Scheduler::Karras,
        9000,
        0.001,
        &model,
        &ScheduleOpts::default()
    )
    .is_err());
}

#[test]
fn sdcpp_strength_keeps_t_enc_plus_two_sigmas() {
    let model = DiscreteSchedule::sd();
    let sigmas = Scheduler::Discrete
        .sigmas(20, &model, &ScheduleOpts::default())
        .unwrap();
    // t_enc = floor(20 * 0.75) = 15 -> start at index 20 - 15 - 1 = 4.
    assert_eq!(
        strength_sigmas(&sigmas, 0.75).unwrap(),
        sigmas[4..].to_vec()
    );
    // Strength 1 keeps all but the very first sigma (t_enc clamps to steps - 1).
    assert_eq!(strength_sigmas(&sigmas, 1.0).unwrap(), sigmas[0..].to_vec());
    assert_eq!(
        strength_sigmas(&sigmas, 0.0).unwrap(),
        sigmas[19..].to_vec()
    );
    assert!(strength_sigmas(&sigmas, 1.5).is_err());
    assert!(strength_sigmas(&[1.0], 0.5).is_err());
}

#[test]
fn sdcpp_only_schedulers_follow_sdcpp() {
    let model = DiscreteSchedule::sd();
    let o = ScheduleOpts::default();
    // lcm: the 50-step training grid, timesteps 999, 759, 499, 259 for 4 steps.
    let lcm = Scheduler::Lcm.sigmas(4, &model, &o).unwrap();
    let want: Vec<f32> = [999.0, 759.0, 499.0, 259.0]
        .iter()
        .map(|&t| model.t_to_sigma(t))
        .chain([0.0])
        .collect();
    assert_eq!(lcm, want);
    // smoothstep: t = round(smoothstep(1 - i/n) * 999).
    let sm = Scheduler::Smoothstep.sigmas(4, &model, &o).unwrap();
    let ts = [
        999.0,
        (0.84375f32 * 999.0).round(),
        (0.5f32 * 999.0).round(),
        (0.15625f32 * 999.0).round(),
    ];
    let want: Vec<f32> = ts
        .iter()
        .map(|&t| model.t_to_sigma(t))
        .chain([0.0])
        .collect();
    assert_eq!(sm, want);
    // gits at 1.20 for 10 steps is the tabulated row.
    let g = Scheduler::Gits.sigmas(10, &model, &o).unwrap();
    assert_eq!(g.len(), 11);
    assert!((g[0] - 14.614641).abs() < 1e-5 && (g[5] - 0.748_070_5).abs() < 1e-6 && g[10] == 0.0);
    // gits beyond the table stretches the 20-step row log-linearly and stays decreasing.
    let g = Scheduler::Gits.sigmas(40, &model, &o).unwrap();
    assert_eq!(g.len(), 41);
    assert!(g.windows(2).all(|w| w[0] > w[1]), "{g:?}");
    assert!(
        (g[0] - 14.614641).abs() < 1e-5 && g[39] > 0.0291 && g[39] < 0.0983,
        "{g:?}"
    );
}

#[test]
fn every_scheduler_is_decreasing_and_ends_in_zero() {
    let model = DiscreteSchedule::sd();
    for sched in Scheduler::ALL {
        for steps in [1usize, 2, 4, 9, 25, 60] {
            let s = sched
                .sigmas(steps, &model, &ScheduleOpts::default())
                .unwrap();
            assert_eq!(*s.last().unwrap(), 0.0, "{sched} {steps}");
            assert!(s.len() >= 2, "{sched} {steps}");
            assert!(s.windows(2).all(|w| w[0] >= w[1]), "{sched} {steps}: {s:?}");
            assert!(s.iter().all(|v| v.is_finite()), "{sched} {steps}: {s:?}");
        }
    }
}

#[test]
fn scheduler_names_and_bad_input() {
    for s in Scheduler::ALL {
        assert_eq!(s.name().parse::<Scheduler>().unwrap(), s);
    }
    assert_eq!("normal".parse::<Scheduler>().unwrap(), Scheduler::Discrete);
    assert_eq!("Karras".parse::<Scheduler>().unwrap(), Scheduler::Karras);
    let err = "cosine".parse::<Scheduler>().unwrap_err();
    assert!(matches!(err, SamplingError::UnknownName { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("cosine") && msg.contains("sgm_uniform") && msg.contains("kl_optimal"),
        "{msg}"
    );
    let model = DiscreteSchedule::sd();
    assert!(Scheduler::Karras
        .sigmas(0, &model, &ScheduleOpts::default())
        .is_err());
    assert!(Scheduler::Karras
        .sigmas(1 << 40, &model, &ScheduleOpts::default())
        .is_err());
    let bad_rho = ScheduleOpts {
        rho: -1.0,
        ..Default::default()
    };
    assert!(Scheduler::Karras.sigmas(10, &model, &bad_rho).is_err());
    // linear_quadratic: the linear part must leave room for the quadratic one.
    for (threshold, linear_steps) in [(0.0, None), (1.0, None), (0.025, Some(0)), (0.025, Some(10))] {
        let opts = ScheduleOpts { lq_threshold_noise: threshold, lq_linear_steps: linear_steps, ..Default::default() };
        assert!(Scheduler::LinearQuadratic.sigmas(10, &model, &opts).is_err(), "{threshold} {linear_steps:?}");
    }
    // Its knobs move the bend: more linear steps keep more noise for longer.
    let lq = |linear_steps| {
        let opts = ScheduleOpts { lq_linear_steps: Some(linear_steps), ..Default::default() };
        Scheduler::LinearQuadratic.sigmas(10, &model, &opts).unwrap()
    };
    assert_eq!(lq(5), Scheduler::LinearQuadratic.sigmas(10, &model, &ScheduleOpts::default()).unwrap());
    assert!(lq(8)[6] > lq(5)[6]);
    assert!(DiscreteSchedule::from_alphas_cumprod(&[0.9, 1.5]).is_err());
    assert!(DiscreteSchedule::from_alphas_cumprod(&[0.5]).is_err());
    assert!(DiscreteSchedule::scaled_linear(0.0, 0.012, 1000).is_err());
    assert!("sd3".parse::<AysModel>().is_err());
}

#[test]
fn custom_sigmas_parse_like_sdcpp() {
    assert_eq!(
        parse_sigmas("14.61, 7.0,3.5 1.0 0").unwrap(),
        vec![14.61, 7.0, 3.5, 1.0, 0.0]
    );
    assert_eq!(parse_sigmas("[1.5, 0.0]").unwrap(), vec![1.5, 0.0]);
    let err = parse_sigmas("14.6, seven, 0").unwrap_err().to_string();
    assert!(err.contains("entry 1") && err.contains("seven"), "{err}");
    assert!(parse_sigmas("3.0").is_err());
    assert!(parse_sigmas("3.0, -1.0").is_err());
    assert!(parse_sigmas("3.0, inf").is_err());
}

/// ComfyUI's KSampler.calculate_sigmas for DISCARD_PENULTIMATE_SIGMA_SAMPLERS: the
/// schedule of steps + 1, next-to-last dropped, then (denoise < 1) the tail of the
/// schedule of steps / denoise built the same way.
#[test]
fn ksampler_discards_the_penultimate_sigma_as_comfyui() {
    use sdflow_core::sampling::ksampler_sigmas;
    let model = DiscreteSchedule::sd();
    let opts = ScheduleOpts::default();
    for scheduler in [Scheduler::Karras, Scheduler::Discrete, Scheduler::Simple] {
        let full = scheduler.sigmas(11, &model, &opts).unwrap();
        let mut want = full[..full.len() - 2].to_vec();
        want.push(*full.last().unwrap());
        assert_eq!(ksampler_sigmas(scheduler, 10, 1.0, &model, &opts, true).unwrap(), want);
        assert_eq!(ksampler_sigmas(scheduler, 10, 1.0, &model, &opts, false).unwrap(), scheduler.sigmas(10, &model, &opts).unwrap());
        let longer = scheduler.sigmas(21, &model, &opts).unwrap();
        let mut cut = longer[..longer.len() - 2].to_vec();
        cut.push(*longer.last().unwrap());
        let tail = cut[cut.len() - 11..].to_vec();
        assert_eq!(ksampler_sigmas(scheduler, 10, 0.5, &model, &opts, true).unwrap(), tail);
    }
}

#[test]
fn comfyui_beta_schedules_give_torchs_tables() {
    use sdflow_core::sampling::schedule::BetaSchedule;
    // σ at timesteps 0, 499 and 999 of torch's make_beta_schedule (0.00085 to 0.012, 1000
    // steps) through ModelSamplingDiscrete.
    for (kind, want) in [
        (BetaSchedule::SqrtLinear, [0.029_167_535, 2.275_962_6, 25.146_114]),
        (BetaSchedule::Sqrt, [0.173_292_53, 3_696_868.3, 3.056_388_4e17]),
        (BetaSchedule::Cosine, [0.006_427_109, 1.012_389_5, 20_291.17]),
        (BetaSchedule::SquaredCosCapV2, [0.006_427_109, 1.012_389_8, 20_291.303]),
    ] {
        let s = DiscreteSchedule::beta_schedule(kind, 0.00085, 0.012, 1000).unwrap();
        let got = [s.sigmas()[0], s.sigmas()[499], s.sigmas()[999]];
        assert_close(&got, &want, 1e-4, &format!("{kind:?}"));
    }
    let sd = DiscreteSchedule::sd();
    let linear = DiscreteSchedule::beta_schedule(BetaSchedule::Linear, 0.00085, 0.012, 1000).unwrap();
    assert_eq!(sd, linear);
    assert!(DiscreteSchedule::beta_schedule(BetaSchedule::SqrtLinear, 0.0, 0.012, 1000).is_err());
}
