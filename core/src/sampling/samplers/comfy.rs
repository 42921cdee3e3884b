//! ComfyUI's single- and two-stage samplers from `comfy/k_diffusion/sampling.py`, step for
//! step. Where ComfyUI branches on the model type (`model_sampling` being `CONST`), the flow
//! form is taken when [`Run::flow`] is set; the rest run the same maths for every model, as
//! in ComfyUI.

use super::{ancestral_step, axpy, offset_first_sigma, to_d, Res, Run};

/// ComfyUI's `sigma_to_half_log_snr`: `-ln sigma` (eps / v), `ln((1 - sigma) / sigma)` (flow).
pub(super) fn lambda_of<E>(run: &Run<E>, sigma: f32) -> f32 {
    if run.flow {
        ((1.0 - sigma) / sigma).ln()
    } else {
        -sigma.ln()
    }
}

/// ComfyUI's `half_log_snr_to_sigma`.
fn sigma_of<E>(run: &Run<E>, lambda: f32) -> f32 {
    if run.flow {
        1.0 / (1.0 + lambda.exp())
    } else {
        (-lambda).exp()
    }
}

/// The signal scale `sigma * exp(lambda)`: 1 for eps / v models, `1 - sigma` for flow.
pub(super) fn alpha_of<E>(run: &Run<E>, sigma: f32) -> f32 {
    if run.flow {
        1.0 - sigma
    } else {
        1.0
    }
}

/// `sigma_down` of ComfyUI's rectified-flow ancestral samplers (the `_RF` functions).
pub(super) fn flow_sigma_down(from: f32, to: f32, eta: f32) -> f32 {
    to * (1.0 + (to / from - 1.0) * eta)
}

/// `(sigma_down, renoise scale, rescale of x)` of the `_RF` samplers. The square root is
/// clamped at 0 where ComfyUI's would be of a rounding-negative number (eta > 1).
fn flow_ancestral(from: f32, to: f32, eta: f32) -> (f32, f32, f32) {
    let down = flow_sigma_down(from, to, eta);
    let (alpha_next, alpha_down) = (1.0 - to, 1.0 - down);
    let renoise = (to * to - down * down * alpha_next * alpha_next / (alpha_down * alpha_down))
        .max(0.0)
        .sqrt();
    (down, renoise, alpha_next / alpha_down)
}

/// torch's `lerp` (its two branches round differently).
fn lerp(a: f32, b: f32, w: f32) -> f32 {
    if w < 0.5 {
        a + w * (b - a)
    } else {
        b - (b - a) * (1.0 - w)
    }
}

fn lin2(a: f32, x: &[f32], b: f32, y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(&p, &q)| a * p + b * q).collect()
}

/// `sample_heunpp2` (Heun++ from sd-webui-samplers-scheduler): Heun with a third
/// evaluation two sigmas ahead, weighted by the sigmas over `sigmas[0]`.
/// Its loop opens as `heun`'s (samplers.rs) but its last step and its correction differ, so
/// it keeps its own.
pub(super) fn heunpp2<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    let s_end = s[s.len() - 1];
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        let dt = s[i + 1] - s[i];
        if s[i + 1] == s_end {
            axpy(&mut x, &d, dt);
        } else {
            let mut x2 = x.clone();
            axpy(&mut x2, &d, dt);
            let den2 = run.denoise(&x2, s[i + 1])?;
            let d2 = to_d(&x2, s[i + 1], &den2);
            let d_prime = if s[i + 2] == s_end {
                let w2 = s[i + 1] / (2.0 * s[0]);
                lin2(1.0 - w2, &d, w2, &d2)
            } else {
                let mut x3 = x2.clone();
                axpy(&mut x3, &d2, s[i + 2] - s[i + 1]);
                let den3 = run.denoise(&x3, s[i + 2])?;
                let d3 = to_d(&x3, s[i + 2], &den3);
                let w = 3.0 * s[0];
                let (w2, w3) = (s[i + 1] / w, s[i + 2] / w);
                let w1 = 1.0 - w2 - w3;
                (0..x.len())
                    .map(|j| w1 * d[j] + w2 * d2[j] + w3 * d3[j])
                    .collect()
            };
            axpy(&mut x, &d_prime, dt);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// `sample_dpm_2_ancestral` and, for flow models, `sample_dpm_2_ancestral_RF`. The noise is
/// drawn on every second-order step, as ComfyUI draws it (even when its scale is 0).
pub(super) fn dpm_2_ancestral<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    for i in 0..s.len() - 1 {
        let (from, to) = (s[i], s[i + 1]);
        let den = run.denoise(&x, from)?;
        let (down, up, rescale) = if run.flow {
            flow_ancestral(from, to, eta)
        } else {
            let (down, up) = ancestral_step(from, to, eta);
            (down, up, 1.0)
        };
        let d = to_d(&x, from, &den);
        if down == 0.0 {
            axpy(&mut x, &d, down - from);
        } else {
            let sigma_mid = lerp(from.ln(), down.ln(), 0.5).exp();
            let mut x2 = x.clone();
            axpy(&mut x2, &d, sigma_mid - from);
            let den2 = run.denoise(&x2, sigma_mid)?;
            let d2 = to_d(&x2, sigma_mid, &den2);
            axpy(&mut x, &d2, down - from);
            if run.flow {
                x.iter_mut().for_each(|v| *v *= rescale);
            }
            run.add_noise(&mut x, from, to, up);
        }
        run.done(from, &x, &den);
    }
    Ok(x)
}

/// `sample_dpmpp_2s_ancestral_RF`: DPM-Solver++(2S) in the flow's log-SNR, midpoint between
/// sigma and sigma_down (0.9999 when sigma is exactly 1, where log-SNR is infinite).
pub(super) fn dpmpp_2s_ancestral_rf<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    for i in 0..s.len() - 1 {
        let (from, to) = (s[i], s[i + 1]);
        let den = run.denoise(&x, from)?;
        let (down, renoise, rescale) = flow_ancestral(from, to, eta);
        if to == 0.0 {
            let d = to_d(&x, from, &den);
            axpy(&mut x, &d, down - from);
        } else {
            let sigma_s = if from == 1.0 {
                0.9999
            } else {
                let (t_i, t_down) = (lambda_of(run, from), lambda_of(run, down));
                sigma_of(run, t_i + 0.5 * (t_down - t_i))
            };
            let r = sigma_s / from;
            let u = lin2(r, &x, 1.0 - r, &den);
            let d_i = run.denoise(&u, sigma_s)?;
            let r = down / from;
            x = lin2(r, &x, 1.0 - r, &d_i);
        }
        if to > 0.0 && eta > 0.0 {
            x.iter_mut().for_each(|v| *v *= rescale);
            run.add_noise(&mut x, from, to, renoise);
        }
        run.done(from, &x, &den);
    }
    Ok(x)
}

/// `sample_dpmpp_2s_ancestral_cfg_pp`. Each stage renoises with the unconditional estimate of
/// the latest model call (ComfyUI's post-CFG hook overwrites it on the second call).
pub(super) fn dpmpp_2s_ancestral_cfg_pp<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    for i in 0..s.len() - 1 {
        let (from, to) = (s[i], s[i + 1]);
        let (den, unc) = run.denoise_pp(&x, from)?;
        let (down, up) = ancestral_step(from, to, eta);
        if down == 0.0 {
            let d = to_d(&x, from, &unc);
            x = lin2(1.0, &den, down, &d);
        } else {
            let (t, t_next) = (-from.ln(), -down.ln());
            let h = t_next - t;
            let sm = t + 0.5 * h;
            let ratio = (-sm).exp() / (-t).exp();
            let x2: Vec<f32> = (0..x.len())
                .map(|j| ratio * (x[j] + (den[j] - unc[j])) - (-h * 0.5).exp_m1() * den[j])
                .collect();
            let (den2, unc2) = run.denoise_pp(&x2, (-sm).exp())?;
            let ratio = (-t_next).exp() / (-t).exp();
            for j in 0..x.len() {
                x[j] = ratio * (x[j] + (den[j] - unc2[j])) - (-h).exp_m1() * den2[j];
            }
        }
        if to > 0.0 {
            run.add_noise(&mut x, from, to, up);
        }
        run.done(from, &x, &den);
    }
    Ok(x)
}

/// `sample_dpmpp_sde` (DPM-Solver++ SDE, r = 1/2) in half-log-SNR, so flow models take it too.
pub(super) fn dpmpp_sde<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let s = &offset_first_sigma(run, s)[..];
    let r = 0.5f32;
    let fac = 1.0 / (2.0 * r);
    let noisy = eta > 0.0 && run.s_noise > 0.0;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let (l_s, l_t) = (lambda_of(run, s[i]), lambda_of(run, s[i + 1]));
            let h = l_t - l_s;
            let l_s1 = l_s + r * h;
            let sigma_s1 = sigma_of(run, l_s1);
            let alpha_s = s[i] * l_s.exp();
            let alpha_s1 = sigma_s1 * l_s1.exp();
            let alpha_t = s[i + 1] * l_t.exp();

            let (sd, su) = ancestral_step((-l_s).exp(), (-l_s1).exp(), eta);
            let h_ = -sd.ln() - l_s;
            let mut x2 = lin2((alpha_s1 / alpha_s) * (-h_).exp(), &x, -alpha_s1 * (-h_).exp_m1(), &den);
            if noisy {
                run.add_noise(&mut x2, s[i], sigma_s1, alpha_s1 * su);
            }
            let den2 = run.denoise(&x2, sigma_s1)?;

            let (sd, su) = ancestral_step((-l_s).exp(), (-l_t).exp(), eta);
            let h_ = -sd.ln() - l_s;
            let den_d = lin2(1.0 - fac, &den, fac, &den2);
            x = lin2((alpha_t / alpha_s) * (-h_).exp(), &x, -alpha_t * (-h_).exp_m1(), &den_d);
            if noisy {
                run.add_noise(&mut x, s[i], s[i + 1], alpha_t * su);
            }
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// `sample_dpmpp_2m_cfg_pp`: DPM-Solver++(2M) whose state moves along the unconditional
/// estimate while the jump lands on the guided one.
pub(super) fn dpmpp_2m_cfg_pp<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    let mut old_unc: Option<Vec<f32>> = None;
    for i in 0..s.len() - 1 {
        let (den, unc) = run.denoise_pp(&x, s[i])?;
        let (t, t_next) = (-s[i].ln(), -s[i + 1].ln());
        let h = t_next - t;
        let e = (-h).exp();
        match (&old_unc, s[i + 1] == 0.0) {
            (Some(ou), false) => {
                let h_last = t + s[i - 1].ln();
                let r = h_last / h;
                let k = (-h).exp_m1() * (1.0 / (2.0 * r));
                for j in 0..x.len() {
                    let mix = -e * unc[j] - k * (den[j] - ou[j]);
                    x[j] = den[j] + mix + e * x[j];
                }
            }
            _ => {
                for j in 0..x.len() {
                    x[j] = den[j] + (-e * unc[j]) + e * x[j];
                }
            }
        }
        run.done(s[i], &x, &den);
        old_unc = Some(unc);
    }
    Ok(x)
}

/// `sample_dpmpp_3m_sde`: DPM-Solver++(3M) SDE in half-log-SNR (second order on its second
/// step, first on its first).
pub(super) fn dpmpp_3m_sde<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let s = &offset_first_sigma(run, s)[..];
    let (mut den_1, mut den_2): (Option<Vec<f32>>, Option<Vec<f32>>) = (None, None);
    let (mut h, mut h_1, mut h_2): (Option<f32>, Option<f32>, Option<f32>) = (None, None, None);
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
        } else {
            let (l_s, l_t) = (lambda_of(run, s[i]), lambda_of(run, s[i + 1]));
            let hh = l_t - l_s;
            h = Some(hh);
            let h_eta = hh * (eta + 1.0);
            let alpha_t = s[i + 1] * l_t.exp();
            x = lin2(s[i + 1] / s[i] * (-hh * eta).exp(), &x, alpha_t * -(-h_eta).exp_m1(), &den);
            let phi_2 = (-h_eta).exp_m1() / h_eta + 1.0;
            match (&den_1, &den_2, h_1, h_2) {
                (Some(d1), Some(d2), Some(h1), Some(h2)) => {
                    let (r0, r1) = (h1 / hh, h2 / hh);
                    let phi_3 = phi_2 / h_eta - 0.5;
                    for j in 0..x.len() {
                        let d1_0 = (den[j] - d1[j]) / r0;
                        let d1_1 = (d1[j] - d2[j]) / r1;
                        let dd1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1);
                        let dd2 = (d1_0 - d1_1) / (r0 + r1);
                        x[j] += (alpha_t * phi_2) * dd1 - (alpha_t * phi_3) * dd2;
                    }
                }
                (Some(d1), _, Some(h1), _) => {
                    let r = h1 / hh;
                    for j in 0..x.len() {
                        x[j] += (alpha_t * phi_2) * ((den[j] - d1[j]) / r);
                    }
                }
                _ => {}
            }
            if eta > 0.0 && run.s_noise > 0.0 {
                let scale = s[i + 1] * (-(-2.0 * hh * eta).exp_m1()).sqrt();
                run.add_noise(&mut x, s[i], s[i + 1], scale);
            }
        }
        run.done(s[i], &x, &den);
        den_2 = den_1.take();
        den_1 = Some(den);
        h_2 = h_1;
        h_1 = h;
    }
    Ok(x)
}

/// `sample_ddpm`: the DDPM ancestral step in the variance-preserving space of the eps
/// parameterisation (`alphas_cumprod = 1 / (sigma^2 + 1)`).
pub(super) fn ddpm<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32]) -> Res<E> {
    for i in 0..s.len() - 1 {
        let (sigma, sigma_prev) = (s[i], s[i + 1]);
        let den = run.denoise(&x, sigma)?;
        let ac = 1.0 / (sigma * sigma + 1.0);
        let ac_prev = 1.0 / (sigma_prev * sigma_prev + 1.0);
        let alpha = ac / ac_prev;
        let (k_mu, k_eps) = ((1.0 / alpha).sqrt(), (1.0 - alpha) / (1.0 - ac).sqrt());
        let to_vp = 1.0 / (1.0 + sigma * sigma).sqrt();
        for j in 0..x.len() {
            let eps = (x[j] - den[j]) / sigma;
            x[j] = k_mu * (x[j] * to_vp - k_eps * eps);
        }
        if sigma_prev > 0.0 {
            let scale = ((1.0 - alpha) * (1.0 - ac_prev) / (1.0 - ac)).sqrt();
            let z = run.noise(sigma, sigma_prev);
            for (xi, zi) in x.iter_mut().zip(z) {
                *xi += scale * zi;
            }
        }
        if sigma_prev != 0.0 {
            let from_vp = (1.0 + sigma_prev * sigma_prev).sqrt();
            x.iter_mut().for_each(|v| *v *= from_vp);
        }
        run.done(sigma, &x, &den);
    }
    Ok(x)
}

/// `sample_ipndm` (fixed Adams–Bashforth coefficients) and `sample_ipndm_v` (coefficients
/// for the actual step sizes), from zju-pi's diff-sampler, up to fourth order. A last sigma
/// of 0 returns the denoised estimate.
pub(super) fn ipndm<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], variable: bool) -> Res<E> {
    const MAX_ORDER: usize = 4;
    let mut buf: Vec<Vec<f32>> = Vec::new();
    for i in 0..s.len() - 1 {
        let (t_cur, t_next) = (s[i], s[i + 1]);
        let den = run.denoise(&x, t_cur)?;
        let d = to_d(&x, t_cur, &den);
        let order = MAX_ORDER.min(i + 1);
        let n = buf.len();
        let dt = t_next - t_cur;
        // Coefficients of d, buf[n-1], buf[n-2], buf[n-3].
        let c: [f32; 4] = if !variable {
            match order {
                1 => [1.0, 0.0, 0.0, 0.0],
                2 => [1.5, -0.5, 0.0, 0.0],
                3 => [23.0 / 12.0, -16.0 / 12.0, 5.0 / 12.0, 0.0],
                _ => [55.0 / 24.0, -59.0 / 24.0, 37.0 / 24.0, -9.0 / 24.0],
            }
        } else {
            let h_n = dt;
            let h_n_1 = if i >= 1 { t_cur - s[i - 1] } else { 0.0 };
            let h_n_2 = if i >= 2 { s[i - 1] - s[i - 2] } else { 0.0 };
            let h_n_3 = if i >= 3 { s[i - 2] - s[i - 3] } else { 0.0 };
            let temp1 = || (1.0 - h_n / (3.0 * (h_n + h_n_1)) * (h_n * (h_n + h_n_1)) / (h_n_1 * (h_n_1 + h_n_2))) / 2.0;
            match order {
                1 => [1.0, 0.0, 0.0, 0.0],
                2 => [(2.0 + h_n / h_n_1) / 2.0, -(h_n / h_n_1) / 2.0, 0.0, 0.0],
                3 => {
                    let temp = temp1();
                    [
                        (2.0 + h_n / h_n_1) / 2.0 + temp,
                        -(h_n / h_n_1) / 2.0 - (1.0 + h_n_1 / h_n_2) * temp,
                        temp * h_n_1 / h_n_2,
                        0.0,
                    ]
                }
                _ => {
                    let temp1 = temp1();
                    let temp2 = ((1.0 - h_n / (3.0 * (h_n + h_n_1))) / 2.0
                        + (1.0 - h_n / (2.0 * (h_n + h_n_1))) * h_n / (6.0 * (h_n + h_n_1 + h_n_2)))
                        * (h_n * (h_n + h_n_1) * (h_n + h_n_1 + h_n_2))
                        / (h_n_1 * (h_n_1 + h_n_2) * (h_n_1 + h_n_2 + h_n_3));
                    let q = h_n_1 * (h_n_1 + h_n_2) / (h_n_2 * (h_n_2 + h_n_3));
                    [
                        (2.0 + h_n / h_n_1) / 2.0 + temp1 + temp2,
                        -(h_n / h_n_1) / 2.0 - (1.0 + h_n_1 / h_n_2) * temp1 - (1.0 + h_n_1 / h_n_2 + q) * temp2,
                        temp1 * h_n_1 / h_n_2 + (h_n_1 / h_n_2 + q * (1.0 + h_n_2 / h_n_3)) * temp2,
                        -temp2 * q * h_n_1 / h_n_2,
                    ]
                }
            }
        };
        if t_next == 0.0 {
            x.copy_from_slice(&den);
        } else {
            for j in 0..x.len() {
                let mut acc = c[0] * d[j];
                for (k, &ck) in c.iter().enumerate().skip(1).take(order - 1) {
                    acc += ck * buf[n - k][j];
                }
                x[j] += dt * acc;
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

/// `res_multistep` (the second-order RES multistep of arXiv 2308.02157) with ancestral noise
/// (`eta`) and the CFG++ form; ComfyUI gives it no flow branch, so neither do we.
pub(super) fn res_multistep<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32, cfg_pp: bool) -> Res<E> {
    fn phi1(t: f32) -> f32 {
        t.exp_m1() / t
    }
    fn phi2(t: f32) -> f32 {
        (phi1(t) - 1.0) / t
    }
    // torch.nan_to_num(v, nan=0.0): infinities become the largest finite values.
    fn nan_to_num(v: f32) -> f32 {
        if v.is_nan() {
            0.0
        } else {
            v.clamp(f32::MIN, f32::MAX)
        }
    }
    let mut old: Option<(Vec<f32>, f32)> = None;
    for i in 0..s.len() - 1 {
        let (from, to) = (s[i], s[i + 1]);
        let (den, unc) = if cfg_pp {
            let (d, u) = run.denoise_pp(&x, from)?;
            (d, Some(u))
        } else {
            (run.denoise(&x, from)?, None)
        };
        let (down, up) = ancestral_step(from, to, eta);
        match &old {
            Some((old_den, old_down)) if down != 0.0 => {
                let (t, t_old, t_next, t_prev) = (-from.ln(), -old_down.ln(), -down.ln(), -s[i - 1].ln());
                let h = t_next - t;
                let c2 = (t_prev - t_old) / h;
                let (p1, p2) = (phi1(-h), phi2(-h));
                let b1 = nan_to_num(p1 - p2 / c2);
                let b2 = nan_to_num(p2 / c2);
                let a = (-h).exp();
                match &unc {
                    Some(u) => {
                        for j in 0..x.len() {
                            let xj = x[j] + (den[j] - u[j]);
                            x[j] = a * xj + h * (b1 * u[j] + b2 * old_den[j]);
                        }
                    }
                    None => {
                        for j in 0..x.len() {
                            x[j] = a * x[j] + h * (b1 * den[j] + b2 * old_den[j]);
                        }
                    }
                }
            }
            _ => match &unc {
                Some(u) => {
                    let d = to_d(&x, from, u);
                    x = lin2(1.0, &den, down, &d);
                }
                None => {
                    let d = to_d(&x, from, &den);
                    axpy(&mut x, &d, down - from);
                }
            },
        }
        if to > 0.0 {
            run.add_noise(&mut x, from, to, up);
        }
        run.done(from, &x, &den);
        old = Some((unc.unwrap_or(den), down));
    }
    Ok(x)
}

/// `sample_seeds_2` (SEEDS-2, arXiv 2305.14267): two stages in half-log-SNR with noise
/// injected per segment so both stages see one consistent Brownian increment.
pub(super) fn seeds_2<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let s = &offset_first_sigma(run, s)[..];
    let r = 0.5f32;
    let fac = 1.0 / (2.0 * r);
    let inject = eta > 0.0 && run.s_noise > 0.0;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
            run.done(s[i], &x, &den);
            continue;
        }
        let (l_s, l_t) = (lambda_of(run, s[i]), lambda_of(run, s[i + 1]));
        let h = l_t - l_s;
        let h_eta = h * (eta + 1.0);
        let l_s1 = lerp(l_s, l_t, r);
        let sigma_s1 = sigma_of(run, l_s1);
        let alpha_s1 = sigma_s1 * l_s1.exp();
        let alpha_t = s[i + 1] * l_t.exp();

        let mut x2 = lin2(sigma_s1 / s[i] * (-r * h * eta).exp(), &x, -alpha_s1 * (-r * h_eta).exp_m1(), &den);
        let mut sde_noise = Vec::new();
        if inject {
            let k = (-(-2.0 * r * h * eta).exp_m1()).sqrt();
            sde_noise = run.noise(s[i], sigma_s1).into_iter().map(|z| k * z).collect();
            axpy(&mut x2, &sde_noise, sigma_s1 * run.s_noise);
        }
        let den2 = run.denoise(&x2, sigma_s1)?;

        let den_d: Vec<f32> = den.iter().zip(&den2).map(|(&a, &b)| lerp(a, b, fac)).collect();
        x = lin2(s[i + 1] / s[i] * (-h * eta).exp(), &x, -alpha_t * (-h_eta).exp_m1(), &den_d);
        if inject {
            let segment = (r - 1.0) * h * eta;
            continue_noise(run, &mut sde_noise, segment, sigma_s1, s[i + 1]);
            axpy(&mut x, &sde_noise, s[i + 1] * run.s_noise);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}

/// SEEDS' noise carried into the next segment: decayed by `exp(segment)` plus fresh noise
/// for the rest of the variance.
fn continue_noise<E>(run: &mut Run<E>, noise: &mut [f32], segment: f32, from: f32, to: f32) {
    let (decay, fresh) = (segment.exp(), (-(2.0 * segment).exp_m1()).sqrt());
    let z = run.noise(from, to);
    for (n, zi) in noise.iter_mut().zip(z) {
        *n = *n * decay + fresh * zi;
    }
}

/// `sample_seeds_3` (SEEDS-3): three stages at r1 = 1/3, r2 = 2/3.
pub(super) fn seeds_3<E>(run: &mut Run<E>, mut x: Vec<f32>, s: &[f32], eta: f32) -> Res<E> {
    let s = &offset_first_sigma(run, s)[..];
    let (r_1, r_2) = (1.0f32 / 3.0, 2.0f32 / 3.0);
    let inject = eta > 0.0 && run.s_noise > 0.0;
    let ei_h_phi_1 = |h: f32| h.exp_m1();
    let ei_h_phi_2 = |h: f32| (h.exp_m1() - h) / h;
    for i in 0..s.len() - 1 {
        let den = run.denoise(&x, s[i])?;
        if s[i + 1] == 0.0 {
            x.copy_from_slice(&den);
            run.done(s[i], &x, &den);
            continue;
        }
        let (l_s, l_t) = (lambda_of(run, s[i]), lambda_of(run, s[i + 1]));
        let h = l_t - l_s;
        let h_eta = h * (eta + 1.0);
        let (l_s1, l_s2) = (lerp(l_s, l_t, r_1), lerp(l_s, l_t, r_2));
        let (sigma_s1, sigma_s2) = (sigma_of(run, l_s1), sigma_of(run, l_s2));
        let alpha_s1 = sigma_s1 * l_s1.exp();
        let alpha_s2 = sigma_s2 * l_s2.exp();
        let alpha_t = s[i + 1] * l_t.exp();

        let mut x2 = lin2(sigma_s1 / s[i] * (-r_1 * h * eta).exp(), &x, -alpha_s1 * ei_h_phi_1(-r_1 * h_eta), &den);
        let mut sde_noise = Vec::new();
        if inject {
            let k = (-(-2.0 * r_1 * h * eta).exp_m1()).sqrt();
            sde_noise = run.noise(s[i], sigma_s1).into_iter().map(|z| k * z).collect();
            axpy(&mut x2, &sde_noise, sigma_s1 * run.s_noise);
        }
        let den2 = run.denoise(&x2, sigma_s1)?;

        let a3_2 = r_2 / r_1 * ei_h_phi_2(-r_2 * h_eta);
        let a3_1 = ei_h_phi_1(-r_2 * h_eta) - a3_2;
        let k_x = sigma_s2 / s[i] * (-r_2 * h * eta).exp();
        let mut x3: Vec<f32> = (0..x.len())
            .map(|j| k_x * x[j] - alpha_s2 * (a3_1 * den[j] + a3_2 * den2[j]))
            .collect();
        if inject {
            continue_noise(run, &mut sde_noise, (r_1 - r_2) * h * eta, sigma_s1, sigma_s2);
            axpy(&mut x3, &sde_noise, sigma_s2 * run.s_noise);
        }
        let den3 = run.denoise(&x3, sigma_s2)?;

        let b3 = ei_h_phi_2(-h_eta) / r_2;
        let b1 = ei_h_phi_1(-h_eta) - b3;
        let k_x = s[i + 1] / s[i] * (-h * eta).exp();
        for j in 0..x.len() {
            x[j] = k_x * x[j] - alpha_t * (b1 * den[j] + b3 * den3[j]);
        }
        if inject {
            continue_noise(run, &mut sde_noise, (r_2 - 1.0) * h * eta, sigma_s2, s[i + 1]);
            axpy(&mut x, &sde_noise, s[i + 1] * run.s_noise);
        }
        run.done(s[i], &x, &den);
    }
    Ok(x)
}
