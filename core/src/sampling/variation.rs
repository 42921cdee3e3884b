//! A1111's variation seeds ("Variation seed" / "Variation strength"): an image's initial
//! noise is its seed's noise turned towards another seed's by spherical interpolation,
//! so small strengths give small variations of the same image.

/// A1111's `slerp(val, low, high)` (`modules/rng.py`) over one image's noise of shape
/// `[channels, height, width]` (row-major, torch's CHW): `val` 0 gives `low`, 1 gives
/// `high`.
///
/// As in A1111, the norms and angles are taken along the height axis (torch's `dim=1` of
/// a CHW tensor): every (channel, column) is interpolated on its own. When the mean
/// cosine of those angles is above 0.9995 A1111 falls back to `low * val + high * (1 -
/// val)` (the weights the other way round from the slerp's), and so does this.
/// Where A1111's arithmetic would give NaN (a cosine rounded past 1, a zero column, an
/// angle of 0) that column is interpolated linearly instead.
pub fn slerp(val: f32, low: &[f32], high: &[f32], channels: usize, height: usize, width: usize) -> Vec<f32> {
    let n = channels * height * width;
    assert!(low.len() == n && high.len() == n, "slerp: noise of {} and {} values is not {channels}x{height}x{width}", low.len(), high.len());
    let at = |c: usize, h: usize, w: usize| (c * height + h) * width + w;
    let norm = |x: &[f32], c: usize, w: usize| (0..height).map(|h| f64::from(x[at(c, h, w)]).powi(2)).sum::<f64>().sqrt() as f32;
    // The cosine of each (channel, column) pair, in f32 as torch computes it.
    let mut dots = Vec::with_capacity(channels * width);
    for c in 0..channels {
        for w in 0..width {
            let (nl, nh) = (norm(low, c, w), norm(high, c, w));
            let dot: f64 = (0..height).map(|h| f64::from(low[at(c, h, w)] / nl) * f64::from(high[at(c, h, w)] / nh)).sum();
            dots.push(dot as f32);
        }
    }
    let mean = dots.iter().map(|&d| f64::from(d)).sum::<f64>() / dots.len().max(1) as f64;
    if mean as f32 > 0.9995 {
        return low.iter().zip(high).map(|(&l, &h)| l * val + h * (1.0 - val)).collect();
    }
    let mut out = vec![0.0f32; n];
    for c in 0..channels {
        for w in 0..width {
            let dot = dots[c * width + w];
            let omega = dot.acos();
            let so = omega.sin();
            let (a, b) = if omega.is_finite() && so != 0.0 && so.is_finite() { (((1.0 - val) * omega).sin() / so, (val * omega).sin() / so) } else { (1.0 - val, val) };
            for h in 0..height {
                let i = at(c, h, w);
                out[i] = a * low[i] + b * high[i];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_the_two_noises() {
        let low: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let high: Vec<f32> = (0..24).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
        assert_eq!(slerp(0.0, &low, &high, 2, 3, 4), low);
        let one = slerp(1.0, &low, &high, 2, 3, 4);
        for (a, b) in one.iter().zip(&high) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
