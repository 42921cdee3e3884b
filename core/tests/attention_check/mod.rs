//! Attention through `nn::attention` against plain attention computed in f64, shared by
//! models_attention.rs (the CPU op) and models_attention_ggml.rs (ggml's kernels).

use sdflow_core::ggml::{Backend, Context, GraphRun};
use sdflow_core::models::nn::attention;

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

/// Attention of `batch` sequences of `tq` queries over `tk` keys, 2 heads of 16.
pub fn check(tq: usize, tk: usize, batch: usize, tol: f32) {
    let (d, heads) = (32usize, 2usize);
    let q = vals(d * tq * batch, 1);
    let k = vals(d * tk * batch, 2);
    let v = vals(d * tk * batch, 3);
    let backend = Backend::cpu(2).unwrap();
    let ctx = Context::new(256, 256).unwrap();
    let mut run = GraphRun::new(&ctx);
    let qt = run.input_f32(&[d as i64, tq as i64, batch as i64], q.clone()).unwrap();
    let kt = run.input_f32(&[d as i64, tk as i64, batch as i64], k.clone()).unwrap();
    let vt = run.input_f32(&[d as i64, tk as i64, batch as i64], v.clone()).unwrap();
    let out = attention(&ctx, qt, kt, vt, heads as i64, None).unwrap();
    let got = run.compute(&backend, &[out], 256).unwrap().remove(0);
    assert_eq!(got.len(), d * tq * batch);
    for n in 0..batch {
        let (qs, ks) = (d * tq, d * tk);
        let want = reference(&q[n * qs..][..qs], &k[n * ks..][..ks], &v[n * ks..][..ks], d, tq, tk, heads);
        let err = got[n * qs..][..qs].iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err <= tol, "{tq}x{tk}, batch item {n}: max abs error {err}");
    }
}

