//! ComfyUI's samplers that carry solver machinery of their own: DPM-Solver's fast and
//! adaptive drivers (`DPMSolver` in `comfy/k_diffusion/sampling.py`), DEIS
//! (`comfy/k_diffusion/deis.py`), SA-Solver (`comfy/k_diffusion/sa_solver.py`) and UniPC
//! (`comfy/extra_samplers/uni_pc.py`). Scalars are f32 where ComfyUI keeps them in float32
//! tensors and the sums that cancel badly in f32 mirror its order of operations; the small
//! linear solves run in f64.

use super::super::schedule::{torch_linspace_f32, DiscreteSchedule};
use super::super::SamplingError;
use super::comfy::{alpha_of, lambda_of};
use super::{ancestral_step, offset_first_sigma, Res, Run, SampleError};

/// Solves `a x = b` (row-major `n x n`) by Gaussian elimination with partial pivoting.
/// `None` when the system is singular.
fn solve(mut a: Vec<f64>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs()))?;
        if a[p * n + c] == 0.0 || !a[p * n + c].is_finite() {
            return None;
        }
        if p != c {
            for k in 0..n {
                a.swap(c * n + k, p * n + k);
            }
            b.swap(c, p);
        }
        for r in c + 1..n {
            let f = a[r * n + c] / a[c * n + c];
            for k in c..n {
                a[r * n + k] -= f * a[c * n + k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let mut v = b[r];
        for k in r + 1..n {
            v -= a[r * n + k] * x[k];
        }
        x[r] = v / a[r * n + r];
    }
    Some(x)
}

fn singular<E>(what: &str) -> SampleError<E> {
    SampleError::Invalid(SamplingError::InvalidSigmas(format!(
        "{what}: the sigmas give a singular system (repeated values?)"
    )))
}

/// The last non-zero sigma, where ComfyUI's DPM-Solver wrappers stop.
fn dpm_sigma_min<E>(s: &[f32]) -> Result<f32, SampleError<E>> {
    let last = s[s.len() - 1];
    let min = if last == 0.0 { s[s.len() - 2] } else { last };
    if min <= 0.0 {
        return Err(SampleError::Invalid(SamplingError::InvalidSigmas(
            "DPM-Solver needs a positive sigma before the final one".into(),
        )));
    }
    Ok(min)
}

/// k-diffusion's `DPMSolver` in `t = -ln sigma`, evaluating the noise prediction.
struct DpmSolver<'r, 'a, 'b, E> {
    run: &'r mut Run<'a, 'b, E>,
}

fn sigma_t(t: f32) -> f32 {
    (-t).exp()
}

impl<E> DpmSolver<'_, '_, '_, E> {
    fn eps(&mut self, x: &[f32], t: f32) -> Result<Vec<f32>, SampleError<E>> {
        let sigma = sigma_t(t);
        let den = self.run.denoise(x, sigma)?;
        Ok(x.iter().zip(&den).map(|(&a, &b)| (a - b) / sigma).collect())
    }

    fn step_1(x: &[f32], t: f32, t_next: f32, eps: &[f32]) -> Vec<f32> {
        let k = sigma_t(t_next) * (t_next - t).exp_m1();
        x.iter().zip(eps).map(|(&a, &e)| a - k * e).collect()
    }

    /// The second-order step; `eps_r1` caches the evaluation at `t + r1 h`.
    fn step_2(&mut self, x: &[f32], t: f32, t_next: f32, r1: f32, eps: &[f32], eps_r1: &mut Option<Vec<f32>>) -> Result<Vec<f32>, SampleError<E>> {
        let h = t_next - t;
        if eps_r1.is_none() {
            let s1 = t + r1 * h;
            let k = sigma_t(s1) * (r1 * h).exp_m1();
            let u1: Vec<f32> = x.iter().zip(eps).map(|(&a, &e)| a - k * e).collect();
            *eps_r1 = Some(self.eps(&u1, s1)?);
        }
        let e1 = eps_r1.as_ref().expect("just filled");
        let a = sigma_t(t_next) * h.exp_m1();
        let b = sigma_t(t_next) / (2.0 * r1) * h.exp_m1();
        Ok((0..x.len()).map(|j| x[j] - a * eps[j] - b * (e1[j] - eps[j])).collect())
    }

    fn step_3(&mut self, x: &[f32], t: f32, t_next: f32, eps: &[f32], eps_r1: &mut Option<Vec<f32>>) -> Result<Vec<f32>, SampleError<E>> {
        let (r1, r2) = (1.0f32 / 3.0, 2.0f32 / 3.0);
        let h = t_next - t;
        let (s1, s2) = (t + r1 * h, t + r2 * h);
        if eps_r1.is_none() {
            let k = sigma_t(s1) * (r1 * h).exp_m1();
            let u1: Vec<f32> = x.iter().zip(eps).map(|(&a, &e)| a - k * e).collect();
            *eps_r1 = Some(self.eps(&u1, s1)?);
        }
        let e1 = eps_r1.as_ref().expect("just filled").clone();
        let a = sigma_t(s2) * (r2 * h).exp_m1();
        let b = sigma_t(s2) * (r2 / r1) * ((r2 * h).exp_m1() / (r2 * h) - 1.0);
        let u2: Vec<f32> = (0..x.len()).map(|j| x[j] - a * eps[j] - b * (e1[j] - eps[j])).collect();
        let e2 = self.eps(&u2, s2)?;
        let a = sigma_t(t_next) * h.exp_m1();
        let b = sigma_t(t_next) / r2 * (h.exp_m1() / h - 1.0);
        Ok((0..x.len()).map(|j| x[j] - a * eps[j] - b * (e2[j] - eps[j])).collect())
    }

    /// `(t_next', noise scale)` of an ancestral step to `t_next`, capped at `t_end`.
    fn ancestral(t: f32, t_next: f32, t_end: f32, eta: f32) -> (f32, f32) {
        if eta == 0.0 {
            return (t_next, 0.0);
        }
        let (sd, _) = ancestral_step(sigma_t(t), sigma_t(t_next), eta);
        let t_ = t_end.min(-sd.ln());
        let su = (sigma_t(t_next).powi(2) - sigma_t(t_).powi(2)).max(0.0).sqrt();
        (t_, su)
    }

    fn report(&mut self, t: f32, x: &[f32], eps: &[f32]) {
        let sigma = sigma_t(t);
        let den: Vec<f32> = x.iter().zip(eps).map(|(&a, &e)| a - sigma * e).collect();
        self.run.done(sigma, x, &den);
    }
}

/// ComfyUI's `dpm_fast`: DPM-Solver-Fast with as many model calls as steps, from the first
/// sigma to the last non-zero one (it returns the latent there, not denoised to 0).
pub(super) fn dpm_fast<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let sigma_min = dpm_sigma_min(s)?;
    let nfe = s.len() - 1;
    let (t_start, t_end) = (-s[0].ln(), -sigma_min.ln());
    let m = nfe / 3 + 1;
    let orders: Vec<usize> = match nfe % 3 {
        0 => std::iter::repeat_n(3, m - 2).chain([2, 1]).collect(),
        rest => std::iter::repeat_n(3, m - 1).chain([rest]).collect(),
    };
    run.total = orders.len();
    let mut dpm = DpmSolver { run };
    for (i, &order) in orders.iter().enumerate() {
        let t = torch_linspace_f32(t_start, t_end, m + 1, i);
        let t_next = torch_linspace_f32(t_start, t_end, m + 1, i + 1);
        let (t_next_, su) = DpmSolver::<E>::ancestral(t, t_next, t_end, eta);
        let eps = dpm.eps(&x, t)?;
        let mut eps_r1 = None;
        let x_new = match order {
            1 => DpmSolver::<E>::step_1(&x, t, t_next_, &eps),
            2 => dpm.step_2(&x, t, t_next_, 0.5, &eps, &mut eps_r1)?,
            _ => dpm.step_3(&x, t, t_next_, &eps, &mut eps_r1)?,
        };
        let x_old = std::mem::replace(&mut x, x_new);
        if su > 0.0 {
            dpm.run.add_noise(&mut x, sigma_t(t), sigma_t(t_next), su);
        }
        dpm.report(t, &x_old, &eps);
    }
    Ok(x)
}

/// ComfyUI's `dpm_adaptive` with its defaults: DPM-Solver-23 (order 3) with a PID step-size
/// controller (rtol 0.05, atol 0.0078, h_init 0.05, integral gain 1, accept safety 0.81),
/// from the first sigma to the last non-zero one.
pub(super) fn dpm_adaptive<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let sigma_min = dpm_sigma_min(s)?;
    let (t_start, t_end) = (-s[0].ln(), -sigma_min.ln());
    let (rtol, atol) = (0.05f32, 0.0078f32);
    let (pcoeff, icoeff, dcoeff, accept_safety, pid_eps) = (0.0f64, 1.0f64, 0.0f64, 0.81f64, 1e-8f64);
    let pid_order = if eta != 0.0 { 1.5 } else { 3.0 };
    let (b1, b2, b3) = ((pcoeff + icoeff + dcoeff) / pid_order, -(pcoeff + 2.0 * dcoeff) / pid_order, dcoeff / pid_order);
    let mut h = 0.05f64;
    let mut errs: Option<[f64; 3]> = None;
    let mut t_s = t_start;
    let mut x_prev = x.clone();
    let n = x.len();
    // A runaway controller (a model returning NaN) would otherwise never reach t_end.
    const MAX_ATTEMPTS: usize = 100_000;
    // Its step count is unknown until it ends: the total grows with the steps.
    run.total = 0;
    let mut dpm = DpmSolver { run };
    let mut attempts = 0;
    while t_s < t_end - 1e-5 {
        attempts += 1;
        if attempts > MAX_ATTEMPTS {
            return Err(SampleError::Invalid(SamplingError::InvalidSigmas(format!(
                "dpm_adaptive took {MAX_ATTEMPTS} steps without reaching sigma {sigma_min}"
            ))));
        }
        let t = t_end.min(t_s + h as f32);
        let (t_, su) = DpmSolver::<E>::ancestral(t_s, t, t_end, eta);
        let eps = dpm.eps(&x, t_s)?;
        let mut eps_r1 = None;
        let x_low = dpm.step_2(&x, t_s, t_, 1.0 / 3.0, &eps, &mut eps_r1)?;
        let x_high = dpm.step_3(&x, t_s, t_, &eps, &mut eps_r1)?;
        let mut sq = 0.0f32;
        for j in 0..n {
            let delta = atol.max(rtol * x_low[j].abs().max(x_prev[j].abs()));
            let e = (x_low[j] - x_high[j]) / delta;
            sq += e * e;
        }
        let error = sq.sqrt() / (n as f32).sqrt();
        let inv = 1.0 / (error as f64 + pid_eps);
        let e = errs.get_or_insert([inv; 3]);
        e[0] = inv;
        let factor = e[0].powf(b1) * e[1].powf(b2) * e[2].powf(b3);
        let factor = 1.0 + (factor - 1.0).atan();
        let accept = factor >= accept_safety;
        if accept {
            e[2] = e[1];
            e[1] = e[0];
        }
        h *= factor;
        let s_old = t_s;
        if accept {
            x_prev = x_low;
            x = x_high;
            if su > 0.0 {
                dpm.run.add_noise(&mut x, sigma_t(t_s), sigma_t(t), su);
            }
            t_s = t;
        }
        dpm.report(s_old, &x, &eps);
    }
    Ok(x)
}

/// `deis.get_deis_coeff_list` in its `tab` mode: per step, the integrals over the step (in
/// the VP time of an EDM range 0.002..80, 10 000-point Riemann sums) of the Lagrange basis
/// through the last `order` times, weighted by the exponential integrator's kernel.
fn deis_coeffs(sigmas: &[f32], max_order: usize) -> Vec<Vec<f32>> {
    const N: usize = 10_000;
    let (eps_s, smin, smax) = (1e-3f32, 0.002f32, 80.0f32);
    let ln_min = (smin * smin + 1.0).ln();
    let ln_max = (smax * smax + 1.0).ln();
    let beta_d = 2.0 * (ln_min / eps_s - ln_max) / (eps_s - 1.0);
    let beta_min = ln_max - 0.5 * beta_d;
    let (beta_0, beta_1) = (beta_min, beta_d + beta_min);
    let t_steps: Vec<f32> = sigmas
        .iter()
        .map(|&s| ((beta_min * beta_min + 2.0 * beta_d * (s * s + 1.0).ln()).sqrt() - beta_min) / beta_d)
        .collect();
    let mut out = Vec::with_capacity(sigmas.len() - 1);
    for i in 0..sigmas.len() - 1 {
        let order = (i + 1).min(max_order);
        // The last step to sigma 0 is an Euler step; its kernel is infinite at t = 0.
        if order == 1 || sigmas[i + 1] <= 0.0 {
            out.push(Vec::new());
            continue;
        }
        let (t_cur, t_next) = (t_steps[i], t_steps[i + 1]);
        let dtau = (t_next - t_cur) / N as f32;
        let prev: Vec<f32> = (0..order).map(|k| t_steps[i - k]).collect();
        let mut sums = vec![0.0f64; order];
        for k in 0..N {
            let tau = torch_linspace_f32(t_cur, t_next, N, k);
            let alpha = (-0.5 * tau * tau * (beta_1 - beta_0) - tau * beta_0).exp();
            let d_log_alpha = -(tau * (beta_1 - beta_0) + beta_0);
            let integrand = -0.5 * d_log_alpha / (alpha * (1.0 - alpha)).sqrt();
            for (j, sum) in sums.iter_mut().enumerate() {
                let mut poly = 1.0f32;
                for (m, &p) in prev.iter().enumerate() {
                    if m != j {
                        poly *= (tau - p) / (prev[j] - p);
                    }
                }
                *sum += (integrand * poly) as f64;
            }
        }
        out.push(sums.into_iter().map(|v| v as f32 * dtau).collect());
    }
    out
}

/// ComfyUI's `deis` (zju-pi's DEIS, `tab` mode, third order): a multistep method over the
/// derivatives `d = (x - x0) / sigma` with DEIS's integrated coefficients.
pub(super) fn deis<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    const MAX_ORDER: usize = 3;
    let coeffs = deis_coeffs(s, MAX_ORDER);
    let mut buf: Vec<Vec<f32>> = Vec::new();
    for i in 0..s.len() - 1 {
        let (t_cur, t_next) = (s[i], s[i + 1]);
        let den = run.denoise(&x, t_cur)?;
        let d: Vec<f32> = x.iter().zip(&den).map(|(&a, &b)| (a - b) / t_cur).collect();
        let mut order = MAX_ORDER.min(i + 1);
        if t_next <= 0.0 {
            order = 1;
        }
        let n = buf.len();
        if order == 1 {
            for (xj, &dj) in x.iter_mut().zip(&d) {
                *xj += (t_next - t_cur) * dj;
            }
        } else {
            let c = &coeffs[i];
            for j in 0..x.len() {
                let mut v = x[j] + c[0] * d[j];
                for k in 1..order {
                    v += c[k] * buf[n - k][j];
                }
                x[j] = v;
            }
        }
        if buf.len() == MAX_ORDER - 1 {
            buf.remove(0);
        }
        buf.push(d);
        run.done(t_cur, &x, &den);
    }
    Ok(x)
}

/// `compute_exponential_coeffs`: `(1 + tau^2)` times the integrals of
/// `exp((1 + tau^2) x) x^p` over `[s, t]`, with `exp((1 + tau^2) t)` factored out.
fn sa_exponential_coeffs(s: f64, t: f64, order: usize, tau: f64) -> Vec<f64> {
    let tau_mul = 1.0 + tau * tau;
    let h = t - s;
    let terms: Vec<f64> = (0..order)
        .map(|p| t.powi(p as i32) - s.powi(p as i32) * (-tau_mul * h).exp())
        .collect();
    let ln_fact = |k: usize| (1..=k).map(|v| (v as f64).ln()).sum::<f64>();
    (0..order)
        .map(|i| {
            (0..=i)
                .map(|j| {
                    let depth = (i - j) as f64;
                    let mut log = ln_fact(i) - ln_fact(j);
                    if tau > 0.0 {
                        log -= depth * tau_mul.ln();
                    }
                    let sign = if (i - j) % 2 == 0 { 1.0 } else { -1.0 };
                    sign * log.exp() * terms[j]
                })
                .sum()
        })
        .collect()
}

/// `compute_stochastic_adams_b_coeffs` (its general branch): the Lagrange-basis weights of
/// the stored estimates at `lambdas`, scaled by `alpha_t`.
fn sa_b_coeffs(lambdas: &[f32], l_s: f32, l_t: f32, tau: f32, alpha_t: f32) -> Option<Vec<f32>> {
    let n = lambdas.len();
    let rhs = sa_exponential_coeffs(l_s as f64, l_t as f64, n, tau as f64);
    let mut a = vec![0.0f64; n * n];
    for (p, row) in a.chunks_mut(n).enumerate() {
        for (k, v) in row.iter_mut().enumerate() {
            *v = (lambdas[k] as f64).powi(p as i32);
        }
    }
    let c = solve(a, rhs)?;
    Some(c.into_iter().map(|v| (alpha_t as f64 * v) as f32).collect())
}

/// ComfyUI's `sa_solver` (SA-Solver, NeurIPS 2023): a stochastic Adams predictor (order 3)
/// and corrector (order 4) in half-log-SNR, noise `tau = eta` inside `tau_interval`
/// (ComfyUI's 20%..80% of the schedule by default); `pece` re-evaluates the corrected state.
pub(super) fn sa_solver<E>(run: &mut Run<E>, x: Vec<f32>, s: &[f32], eta: f32, tau_interval: Option<(f32, f32)>, pece: bool) -> Res<E> {
    const PREDICTOR_ORDER: usize = 3;
    const CORRECTOR_ORDER: usize = 4;
    let s = &offset_first_sigma(run, s)[..];
    let lambdas: Vec<f32> = s.iter().map(|&v| lambda_of(run, v)).collect();
    let (start, end) = tau_interval.unwrap_or_else(|| {
        // percent_to_sigma(0.2) and (0.8): the model's schedule at 80% and 20% of its length.
        if run.flow {
            (0.8, 0.2)
        } else {
            let table = DiscreteSchedule::sd();
            let at = |p: f64| table.t_to_sigma(((1.0 - p) * 999.0) as f32);
            (at(0.2), at(0.8))
        }
    });
    let tau_of = |sigma: f32| if eta > 0.0 && start >= sigma && sigma >= end { eta } else { 0.0 };
    let max_order = PREDICTOR_ORDER.max(CORRECTOR_ORDER);
    let steps = s.len() - 1;
    let lower_order_to_end = s[steps] == 0.0;
    let mut x_cur = x.clone();
    let mut x_pred = x;
    let (mut h, mut tau_t) = (0.0f32, 0.0f32);
    let mut noise: Option<Vec<f32>> = None;
    let mut preds: Vec<Vec<f32>> = Vec::new();
    for i in 0..steps {
        let mut den = run.denoise(&x_pred, s[i])?;
        preds.push(den.clone());
        if preds.len() > max_order {
            preds.remove(0);
        }
        let mut p_order = PREDICTOR_ORDER.min(preds.len());
        let mut c_order = if i == 0 || (s[i + 1] == 0.0 && !pece) { 0 } else { CORRECTOR_ORDER.min(preds.len()) };
        if lower_order_to_end {
            p_order = p_order.min(steps - 1 - i);
            c_order = c_order.min(steps - i);
        }
        if c_order == 0 {
            x_cur.clone_from(&x_pred);
        } else {
            let b = sa_b_coeffs(&lambdas[i + 1 - c_order..=i], lambdas[i - 1], lambdas[i], tau_t, alpha_of(run, s[i]))
                .ok_or_else(|| singular("sa_solver"))?;
            let k = s[i] / s[i - 1] * (-(tau_t * tau_t) * h).exp();
            let np = preds.len();
            for j in 0..x_cur.len() {
                let mut v = k * x_cur[j];
                for (q, bq) in b.iter().enumerate() {
                    v += bq * preds[np - c_order + q][j];
                }
                x_cur[j] = v;
            }
            if tau_t > 0.0 && run.s_noise > 0.0 {
                if let Some(z) = &noise {
                    for (xj, zj) in x_cur.iter_mut().zip(z) {
                        *xj += zj;
                    }
                }
            }
            if pece {
                den = run.denoise(&x_cur, s[i])?;
                *preds.last_mut().expect("just pushed") = den.clone();
            }
        }
        if s[i + 1] == 0.0 {
            x_cur.clone_from(&den);
        } else {
            tau_t = tau_of(s[i + 1]);
            let b = sa_b_coeffs(&lambdas[i + 1 - p_order..=i], lambdas[i], lambdas[i + 1], tau_t, alpha_of(run, s[i + 1]))
                .ok_or_else(|| singular("sa_solver"))?;
            h = lambdas[i + 1] - lambdas[i];
            let k = s[i + 1] / s[i] * (-(tau_t * tau_t) * h).exp();
            let np = preds.len();
            x_pred = (0..x_cur.len())
                .map(|j| {
                    let mut v = k * x_cur[j];
                    for (q, bq) in b.iter().enumerate() {
                        v += bq * preds[np - p_order + q][j];
                    }
                    v
                })
                .collect();
            if tau_t > 0.0 && run.s_noise > 0.0 {
                let scale = s[i + 1] * (-(-2.0 * tau_t * tau_t * h).exp_m1()).sqrt() * run.s_noise;
                let z: Vec<f32> = run.noise(s[i], s[i + 1]).into_iter().map(|v| v * scale).collect();
                for (xj, zj) in x_pred.iter_mut().zip(&z) {
                    *xj += zj;
                }
                noise = Some(z);
            }
        }
        run.done(s[i], &x_cur, &den);
    }
    Ok(x_cur)
}

/// uni_pc.py's `SigmaConvert`: the eps model's VP quantities at `t = sigma`, in f32 as
/// ComfyUI evaluates them (near sigma 0 its `1 - exp(2 m)` cancels, and the result is what
/// the last step uses).
struct Vp {
    alpha: f32,
    std: f32,
    lambda: f32,
}

fn vp(sigma: f32) -> Vp {
    let m = 0.5f32 * (1.0 / (sigma * sigma + 1.0)).ln();
    let one_minus = 1.0 - (2.0 * m).exp();
    Vp {
        alpha: m.exp(),
        std: one_minus.sqrt(),
        lambda: m - 0.5 * one_minus.ln(),
    }
}

/// ComfyUI's `uni_pc` / `uni_pc_bh2`: UniPC multistep (order up to 3, lower at the end) with
/// B(h) = h (bh1) or e^h - 1 (bh2), data prediction, in the VP space of the eps
/// parameterisation. As in ComfyUI, a final sigma of 0 becomes 0.001 and the result is the
/// latent there.
pub(super) fn uni_pc<E>(run: &mut Run<E>, x: Vec<f32>, s: &[f32], bh2: bool) -> Res<E> {
    let mut ts = s.to_vec();
    let steps = ts.len() - 1;
    if ts[steps] == 0.0 {
        ts[steps] = 0.001;
    }
    let scale0 = (1.0 + ts[0] * ts[0]).sqrt();
    let mut x: Vec<f32> = x.into_iter().map(|v| v / scale0).collect();
    let order = 3usize.min(ts.len().saturating_sub(2));

    let mut models: Vec<Vec<f32>> = vec![uni_pc_model(run, &x, ts[0])?];
    let mut t_prev: Vec<f32> = vec![ts[0]];
    run.done(s[0], &x.iter().map(|&v| v * scale0).collect::<Vec<_>>(), &models[0]);
    for step_index in 1..steps {
        let targets: Vec<usize> = if step_index < order {
            vec![step_index]
        } else if step_index == steps - 1 {
            vec![step_index, step_index + 1]
        } else {
            vec![step_index]
        };
        for step in targets {
            let t = ts[step];
            let (step_order, use_corrector) = if step_index < order {
                (step_index, true)
            } else {
                (order.min(steps + 1 - step), step != steps)
            };
            let (x_new, model_x) = uni_pc_bh_update(run, &x, &models, &t_prev, t, step_order, use_corrector, bh2)?;
            x = x_new;
            if step_index < order {
                let m = match model_x {
                    Some(m) => m,
                    None => uni_pc_model(run, &x, t)?,
                };
                models.push(m);
                t_prev.push(t);
            } else {
                // ComfyUI shifts the history and skips the model at the final time, leaving
                // the previous last estimate in the newest slot.
                let m = match model_x {
                    Some(m) => m,
                    None if step < steps => uni_pc_model(run, &x, t)?,
                    None => models[models.len() - 1].clone(),
                };
                models.remove(0);
                t_prev.remove(0);
                t_prev.push(t);
                models.push(m);
            }
        }
        let sigma = ts[step_index.min(steps)];
        let k = (sigma * sigma + 1.0).sqrt();
        let report: Vec<f32> = x.iter().map(|&v| v * k).collect();
        run.done(s[step_index], &report, models.last().expect("non-empty"));
    }
    let alpha_end = vp(ts[steps]).alpha;
    Ok(x.into_iter().map(|v| v / alpha_end).collect())
}

/// uni_pc.py's data prediction at VP latent `x`: the eps model called on the
/// k-diffusion-space input (`predict_eps_sigma`), turned back into `x0`.
fn uni_pc_model<E>(run: &mut Run<E>, x: &[f32], t: f32) -> Result<Vec<f32>, SampleError<E>> {
    let k = (t * t + 1.0).sqrt();
    let input: Vec<f32> = x.iter().map(|&v| v * k).collect();
    let den = run.denoise(&input, t)?;
    let q = vp(t);
    Ok(input
        .iter()
        .zip(&den)
        .zip(x)
        .map(|((&a, &b), &xv)| {
            let eps = (a - b) / t;
            (xv - q.std * eps) / q.alpha
        })
        .collect())
}

/// The updated latent and, when the corrector ran, the model's estimate there.
type UniPcStep<E> = Result<(Vec<f32>, Option<Vec<f32>>), SampleError<E>>;

/// `multistep_uni_pc_bh_update` with `predict_x0`.
#[allow(clippy::too_many_arguments)]
fn uni_pc_bh_update<E>(run: &mut Run<E>, x: &[f32], models: &[Vec<f32>], t_prev: &[f32], t: f32, order: usize, use_corrector: bool, bh2: bool) -> UniPcStep<E> {
    let n = x.len();
    let (p0, pt) = (vp(t_prev[t_prev.len() - 1]), vp(t));
    let model_prev_0 = &models[models.len() - 1];
    let h = pt.lambda - p0.lambda;
    let mut rks: Vec<f32> = Vec::with_capacity(order);
    let mut d1s: Vec<Vec<f32>> = Vec::new();
    for i in 1..order {
        let lambda_i = vp(t_prev[t_prev.len() - 1 - i]).lambda;
        let rk = (lambda_i - p0.lambda) / h;
        rks.push(rk);
        let mi = &models[models.len() - 1 - i];
        d1s.push((0..n).map(|j| (mi[j] - model_prev_0[j]) / rk).collect());
    }
    rks.push(1.0);
    let hh = -h;
    let h_phi_1 = hh.exp_m1();
    let mut h_phi_k = h_phi_1 / hh - 1.0;
    let mut factorial = 1.0f32;
    let b_h = if bh2 { hh.exp_m1() } else { hh };
    let mut r = vec![0.0f64; order * order];
    let mut b = vec![0.0f64; order];
    for i in 1..=order {
        for (k, &rk) in rks.iter().enumerate() {
            r[(i - 1) * order + k] = rk.powi(i as i32 - 1) as f64;
        }
        b[i - 1] = (h_phi_k * factorial / b_h) as f64;
        factorial *= (i + 1) as f32;
        h_phi_k = h_phi_k / hh - 1.0 / factorial;
    }
    let sub = |m: usize| -> (Vec<f64>, Vec<f64>) {
        let mut a = Vec::with_capacity(m * m);
        for row in 0..m {
            a.extend_from_slice(&r[row * order..row * order + m]);
        }
        (a, b[..m].to_vec())
    };
    let rhos_p: Vec<f32> = if d1s.is_empty() {
        Vec::new()
    } else if order == 2 {
        vec![0.5]
    } else {
        let (a, bb) = sub(order - 1);
        solve(a, bb).ok_or_else(|| singular("uni_pc"))?.into_iter().map(|v| v as f32).collect()
    };
    let rhos_c: Vec<f32> = if !use_corrector {
        Vec::new()
    } else if order == 1 {
        vec![0.5]
    } else {
        let (a, bb) = sub(order);
        solve(a, bb).ok_or_else(|| singular("uni_pc"))?.into_iter().map(|v| v as f32).collect()
    };
    let (ka, kb) = (pt.std / p0.std, pt.alpha * h_phi_1);
    let x_t_: Vec<f32> = (0..n).map(|j| ka * x[j] - kb * model_prev_0[j]).collect();
    let kbh = pt.alpha * b_h;
    let mut x_t: Vec<f32> = (0..n)
        .map(|j| {
            let pred: f32 = d1s.iter().zip(&rhos_p).map(|(d, &rho)| d[j] * rho).sum();
            x_t_[j] - kbh * pred
        })
        .collect();
    let mut model_t = None;
    if use_corrector {
        let m = uni_pc_model(run, &x_t, t)?;
        let last = rhos_c[rhos_c.len() - 1];
        x_t = (0..n)
            .map(|j| {
                let corr: f32 = d1s.iter().zip(&rhos_c).map(|(d, &rho)| d[j] * rho).sum();
                x_t_[j] - kbh * (corr + last * (m[j] - model_prev_0[j]))
            })
            .collect();
        model_t = Some(m);
    }
    Ok((x_t, model_t))
}
