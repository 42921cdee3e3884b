//! `nn::attention` switches to fused (flash) attention for long sequences; both paths
//! must agree with plain attention computed here.

use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::nn::{attention, FLASH_MIN_KEYS};

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Plain multi-head attention on [D, T] row-major data (one batch).
fn reference(q: &[f32], k: &[f32], v: &[f32], d: usize, tq: usize, tk: usize, heads: usize) -> Vec<f32> {
    let dh = d / heads;
    let mut out = vec![0f32; d * tq];
    for h in 0..heads {
        for i in 0..tq {
            let mut w: Vec<f64> = (0..tk)
                .map(|j| (0..dh).map(|x| (q[i * d + h * dh + x] * k[j * d + h * dh + x]) as f64).sum::<f64>() / (dh as f64).sqrt())
                .collect();
            let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = w.iter().map(|x| (x - m).exp()).sum();
            w.iter_mut().for_each(|x| *x = (*x - m).exp() / s);
            for x in 0..dh {
                out[i * d + h * dh + x] = (0..tk).map(|j| w[j] * v[j * d + h * dh + x] as f64).sum::<f64>() as f32;
            }
        }
    }
    out
}

fn check(tq: usize, tk: usize, tol: f32) {
    let (d, heads) = (32usize, 2usize);
    let q = vals(d * tq, 1);
    let k = vals(d * tk, 2);
    let v = vals(d * tk, 3);
    let backend = Backend::cpu(2).unwrap();
    let ctx = Context::new(256, 256).unwrap();
    let mut run = GraphRun::new(&ctx);
    let qt = run.input_f32(&[d as i64, tq as i64, 1], q.clone()).unwrap();
    let kt = run.input_f32(&[d as i64, tk as i64, 1], k.clone()).unwrap();
    let vt = run.input_f32(&[d as i64, tk as i64, 1], v.clone()).unwrap();
    let out = attention(&ctx, qt, kt, vt, heads as i64, None).unwrap();
    let got = run.compute(&backend, &[out], 256).unwrap().remove(0);
    let want = reference(&q, &k, &v, d, tq, tk, heads);
    let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(err <= tol, "{tq}x{tk}: max abs error {err}");
}

#[test]
fn plain_attention_is_exact() {
    check(37, FLASH_MIN_KEYS as usize - 1, 1e-5);
}

#[test]
fn fused_attention_matches_within_f16_rounding() {
    // Keys and values go through f16 on this path.
    check(37, FLASH_MIN_KEYS as usize + 3, 2e-3);
}
