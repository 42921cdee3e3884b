//! Flow-model noise levels against ComfyUI's formulas (`time_snr_shift`, `flux_time_shift`,
//! the ModelSamplingFlux node's μ), evaluated independently here in f64.

use sdflow_core::sampling::flow::{flux_mu, linear_sigmas, FlowShift};
use sdflow_core::sampling::{Scheduler, ScheduleOpts};

#[test]
fn shifts_follow_comfyui() {
    // SD3's default shift 3: σ(0.5) = 1.5 / 2 = 0.75.
    assert!((FlowShift::Snr(3.0).sigma(0.5) - 0.75).abs() < 1e-7);
    assert_eq!(FlowShift::Snr(1.0).sigma(0.3), 0.3);
    // μ = ln 3 is the SNR shift 3.
    for t in [0.01f32, 0.2, 0.5, 0.9, 1.0] {
        let (a, b) = (FlowShift::Flux(3f64.ln()).sigma(t), FlowShift::Snr(3.0).sigma(t));
        assert!((a - b).abs() < 1e-6, "t {t}: {a} vs {b}");
    }
    // ComfyUI's ModelSamplingFlux at 1024² gives its default 1.15; at 256² the base.
    assert!((flux_mu(1024, 1024, 0.5, 1.15) - 1.15).abs() < 1e-12);
    assert!((flux_mu(256, 256, 0.5, 1.15) - 0.5).abs() < 1e-12);
    assert_eq!(FlowShift::Flux(1.15).percent_to_sigma(0.0), 1.0);
    assert_eq!(FlowShift::Flux(1.15).percent_to_sigma(1.0), 0.0);
    let p = FlowShift::Snr(3.0).percent_to_sigma(0.25);
    assert!((p - 3.0 * 0.75 / (1.0 + 2.0 * 0.75)).abs() < 1e-6);
}

#[test]
fn tables_and_the_simple_scheduler_match_comfyui() {
    let shift = FlowShift::Flux(1.15);
    let s = shift.schedule().unwrap();
    assert_eq!(s.len(), 10_000);
    let f = |t: f64| 1.15f64.exp() / (1.15f64.exp() + 1.0 / t - 1.0);
    assert!((s.sigma_max() as f64 - 1.0).abs() < 1e-7);
    assert!((s.sigma_min() as f64 - f(1e-4)).abs() < 1e-8);
    // ComfyUI's simple_scheduler: sigmas[-(1 + int(x · len/steps))] for x < steps, then 0.
    let got = Scheduler::Simple.sigmas(4, &s, &ScheduleOpts::default()).unwrap();
    let want: Vec<f64> = [0usize, 2500, 5000, 7500].iter().map(|&k| f((10_000 - k) as f64 / 10_000.0)).chain([0.0]).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
    let sd3 = FlowShift::Snr(3.0).schedule().unwrap();
    assert_eq!(sd3.len(), 1000);
    assert!((sd3.sigma_min() as f64 - 3.0 * 0.001 / (1.0 + 2.0 * 0.001)).abs() < 1e-8);
    assert!(FlowShift::Snr(0.0).schedule().is_err());
    assert!(FlowShift::Flux(f64::NAN).schedule().is_err());
}

#[test]
fn linear_sigmas_are_sd_cpp_and_diffusers_spacing() {
    let s = linear_sigmas(FlowShift::Snr(1.0), 4);
    assert_eq!(s, vec![1.0, 0.75, 0.5, 0.25, 0.0]);
}
