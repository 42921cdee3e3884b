//! Every ggml op the model families use, checked against plain Rust reference code on the
//! CPU backend. Dimensions are ggml order: ne[0] is innermost.

mod common;

use common::vals;
use sdflow_core::dtype::DType;
use sdflow_core::ggml::{Backend, Context, GType, GraphAllocator, ScaleMode, Tensor};

enum Data {
    F32(Vec<f32>),
    F16(Vec<f32>),
    BF16(Vec<f32>),
    I32(Vec<i32>),
}


fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}

/// Build a graph from inputs, compute it on the CPU backend, return the output.
fn run<F>(inputs: Vec<(Vec<i64>, Data)>, build: F) -> (Vec<f32>, [i64; 4])
where
    F: for<'a> FnOnce(&'a Context, &[Tensor<'a>]) -> Tensor<'a>,
{
    let ctx = Context::new(256, 256).unwrap();
    let ts: Vec<Tensor> = inputs
        .iter()
        .map(|(ne, d)| {
            let ty = match d {
                Data::F32(_) => GType::F32,
                Data::F16(_) => GType::F16,
                Data::BF16(_) => GType::BF16,
                Data::I32(_) => GType::I32,
            };
            ctx.new_tensor(ty, ne).unwrap().set_input()
        })
        .collect();
    let out = build(&ctx, &ts);
    let out = if out.is_contiguous() { out } else { ctx.cont(out).unwrap() };
    let out = if out.dtype() == GType::F32 { out } else { panic!("test outputs are f32") };
    out.set_output();
    let mut g = ctx.graph(256).unwrap();
    g.build_forward(out).unwrap();
    let backend = Backend::cpu(2).unwrap();
    let mut alloc = GraphAllocator::new(&backend).unwrap();
    alloc.alloc(&g).unwrap();
    for (t, (_, d)) in ts.iter().zip(&inputs) {
        match d {
            Data::F32(v) => t.set_f32(v).unwrap(),
            Data::I32(v) => t.set_i32(v).unwrap(),
            Data::F16(v) => {
                let b: Vec<u8> = v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
                t.set_bytes(&b).unwrap()
            }
            Data::BF16(v) => {
                let b: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
                t.set_bytes(&b).unwrap()
            }
        }
    }
    backend.compute(&g).unwrap();
    (out.get_f32().unwrap(), out.ne())
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs();
        assert!(e.is_finite(), "{what}: non-finite at {i}: {g} vs {w}");
        worst = worst.max(e / (1.0 + w.abs()));
        assert!(e <= tol * (1.0 + w.abs()), "{what}: index {i}: got {g}, want {w} (tol {tol})");
    }
    assert!(worst <= tol, "{what}: worst error {worst}");
}

#[test]
fn mul_mat_f32_with_batch_broadcast() {
    let (k, m, n, ab, bb) = (37, 5, 7, 2, 6);
    let a = vals(k * m * ab, 1);
    let b = vals(k * n * bb, 2);
    let (got, ne) = run(
        vec![(vec![k as i64, m as i64, ab as i64], Data::F32(a.clone())), (vec![k as i64, n as i64, bb as i64], Data::F32(b.clone()))],
        |c, t| c.mul_mat(t[0], t[1]).unwrap(),
    );
    assert_eq!(ne, [m as i64, n as i64, bb as i64, 1]);
    let mut want = vec![0f32; m * n * bb];
    for z in 0..bb {
        let za = z / (bb / ab);
        for j in 0..n {
            for i in 0..m {
                let mut s = 0f64;
                for x in 0..k {
                    s += a[za * k * m + i * k + x] as f64 * b[z * k * n + j * k + x] as f64;
                }
                want[z * m * n + j * m + i] = s as f32;
            }
        }
    }
    assert_close(&got, &want, 1e-5, "mul_mat f32");
}

#[test]
fn mul_mat_f16_weights() {
    let (k, m, n) = (64, 9, 4);
    let a = f16_round(&vals(k * m, 3));
    let b = vals(k * n, 4);
    let (got, _) = run(
        vec![(vec![k as i64, m as i64], Data::F16(a.clone())), (vec![k as i64, n as i64], Data::F32(b.clone()))],
        |c, t| c.mul_mat(t[0], t[1]).unwrap(),
    );
    let mut want = vec![0f32; m * n];
    for j in 0..n {
        for i in 0..m {
            // ggml converts the f32 operand to f16 for an f16 weight.
            want[j * m + i] = (0..k).map(|x| a[i * k + x] * half::f16::from_f32(b[j * k + x]).to_f32()).sum();
        }
    }
    assert_close(&got, &want, 1e-3, "mul_mat f16");
}

#[test]
fn mul_mat_rejects_mismatched_shapes() {
    let ctx = Context::new(8, 8).unwrap();
    let a = ctx.new_tensor(GType::F32, &[4, 3]).unwrap();
    let b = ctx.new_tensor(GType::F32, &[5, 3]).unwrap();
    let e = ctx.mul_mat(a, b).err().expect("must fail");
    assert!(e.to_string().contains("mul_mat"), "{e}");
}

/// Reference conv: kernel [KW,KH,Cin,Cout], input [W,H,Cin,N].
#[allow(clippy::too_many_arguments)]
fn conv_ref(k: &[f32], kn: [usize; 4], x: &[f32], xn: [usize; 4], s: usize, p: usize, d: usize) -> (Vec<f32>, [usize; 4]) {
    let ow = (xn[0] + 2 * p - d * (kn[0] - 1) - 1) / s + 1;
    let oh = (xn[1] + 2 * p - d * (kn[1] - 1) - 1) / s + 1;
    let mut out = vec![0f32; ow * oh * kn[3] * xn[3]];
    for b in 0..xn[3] {
        for oc in 0..kn[3] {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0f64;
                    for ic in 0..kn[2] {
                        for ky in 0..kn[1] {
                            for kx in 0..kn[0] {
                                let iy = (oy * s + ky * d) as isize - p as isize;
                                let ix = (ox * s + kx * d) as isize - p as isize;
                                if iy < 0 || ix < 0 || iy >= xn[1] as isize || ix >= xn[0] as isize {
                                    continue;
                                }
                                let kv = k[((oc * kn[2] + ic) * kn[1] + ky) * kn[0] + kx];
                                let xv = x[((b * xn[2] + ic) * xn[1] + iy as usize) * xn[0] + ix as usize];
                                acc += kv as f64 * xv as f64;
                            }
                        }
                    }
                    out[((b * kn[3] + oc) * oh + oy) * ow + ox] = acc as f32;
                }
            }
        }
    }
    (out, [ow, oh, kn[3], xn[3]])
}

#[test]
fn conv_2d_im2col_and_direct() {
    for &(s, p, d) in &[(1usize, 1usize, 1usize), (2, 1, 1), (1, 0, 2)] {
        let kn = [3usize, 3, 5, 4];
        let xn = [9usize, 7, 5, 2];
        let k = vals(kn.iter().product(), 10);
        let x = vals(xn.iter().product(), 11);
        let (want, wn) = conv_ref(&k, kn, &x, xn, s, p, d);
        let ne = |a: [usize; 4]| a.iter().map(|&v| v as i64).collect::<Vec<_>>();
        let (si, pi, di) = (s as i32, p as i32, d as i32);
        // im2col path with an f16 kernel (as checkpoints store it).
        let k16 = f16_round(&k);
        let x16 = f16_round(&x);
        let (want16, _) = conv_ref(&k16, kn, &x16, xn, s, p, d);
        let (got, gne) = run(vec![(ne(kn), Data::F16(k16.clone())), (ne(xn), Data::F32(x.clone()))], |c, t| {
            c.conv_2d(t[0], t[1], (si, si), (pi, pi), (di, di)).unwrap()
        });
        assert_eq!(gne, [wn[0] as i64, wn[1] as i64, wn[2] as i64, wn[3] as i64]);
        assert_close(&got, &want16, 2e-3, "conv_2d im2col f16");
        let (got, _) = run(vec![(ne(kn), Data::F32(k.clone())), (ne(xn), Data::F32(x.clone()))], |c, t| {
            c.conv_2d(t[0], t[1], (si, si), (pi, pi), (di, di)).unwrap()
        });
        assert_close(&got, &want, 1e-5, "conv_2d im2col f32");
        let (got, _) = run(vec![(ne(kn), Data::F32(k.clone())), (ne(xn), Data::F32(x.clone()))], |c, t| {
            c.conv_2d_direct(t[0], t[1], (si, si), (pi, pi), (di, di)).unwrap()
        });
        assert_close(&got, &want, 1e-4, "conv_2d direct");
    }
}

#[test]
fn conv_2d_rejects_channel_mismatch() {
    let ctx = Context::new(8, 8).unwrap();
    let k = ctx.new_tensor(GType::F32, &[3, 3, 4, 8]).unwrap();
    let x = ctx.new_tensor(GType::F32, &[16, 16, 3, 1]).unwrap();
    assert!(ctx.conv_2d(k, x, (1, 1), (1, 1), (1, 1)).is_err());
    assert!(ctx.conv_2d_direct(k, x, (1, 1), (1, 1), (1, 1)).is_err());
}

#[test]
fn group_norm_matches_reference() {
    let (w, h, c, n, g) = (5usize, 4usize, 8usize, 2usize, 4usize);
    let x = vals(w * h * c * n, 20);
    let (got, _) = run(vec![(vec![w as i64, h as i64, c as i64, n as i64], Data::F32(x.clone()))], |ctx, t| {
        ctx.group_norm(t[0], g as i32, 1e-6).unwrap()
    });
    let mut want = x.clone();
    let per = w * h * (c / g);
    for chunk in want.chunks_mut(per) {
        let mean = chunk.iter().map(|&v| v as f64).sum::<f64>() / per as f64;
        let var = chunk.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / per as f64;
        for v in chunk.iter_mut() {
            *v = ((*v as f64 - mean) / (var + 1e-6).sqrt()) as f32;
        }
    }
    assert_close(&got, &want, 1e-4, "group_norm");
}

#[test]
fn norm_and_rms_norm_over_rows() {
    let (d, r) = (33usize, 6usize);
    let x = vals(d * r, 21);
    let (got, _) = run(vec![(vec![d as i64, r as i64], Data::F32(x.clone()))], |c, t| c.norm(t[0], 1e-5).unwrap());
    let mut want = x.clone();
    for row in want.chunks_mut(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / d as f32;
        row.iter_mut().for_each(|v| *v = (*v - mean) / (var + 1e-5).sqrt());
    }
    assert_close(&got, &want, 1e-4, "norm");
    let (got, _) = run(vec![(vec![d as i64, r as i64], Data::F32(x.clone()))], |c, t| c.rms_norm(t[0], 1e-6).unwrap());
    let mut want = x;
    for row in want.chunks_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        row.iter_mut().for_each(|v| *v /= (ms + 1e-6).sqrt());
    }
    assert_close(&got, &want, 1e-4, "rms_norm");
}

fn softmax_rows(x: &mut [f32], d: usize) {
    for row in x.chunks_mut(d) {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
        row.iter_mut().for_each(|v| *v = (*v - m).exp() / s);
    }
}

#[test]
fn soft_max_with_scale_and_mask() {
    let (d, r, b) = (10usize, 4usize, 3usize);
    let x = vals(d * r * b, 30);
    let mut mask = vec![0f32; d * r];
    for i in 0..r {
        for j in (i + 3)..d {
            mask[i * d + j] = f32::NEG_INFINITY;
        }
    }
    let (got, _) = run(
        vec![(vec![d as i64, r as i64, b as i64], Data::F32(x.clone())), (vec![d as i64, r as i64], Data::F32(mask.clone()))],
        |c, t| c.soft_max_ext(t[0], Some(t[1]), 0.5).unwrap(),
    );
    let mut want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * 0.5 + mask[i % (d * r)]).collect();
    softmax_rows(&mut want, d);
    assert_close(&got, &want, 1e-5, "soft_max_ext");
}

/// Naive attention. q [D,Nq,H], k [D,Nkv,H], v [Dv,Nkv,H] → [Dv,H,Nq] like flash_attn_ext.
fn attention_ref(q: &[f32], k: &[f32], v: &[f32], d: usize, dv: usize, nq: usize, nkv: usize, h: usize, scale: f32) -> Vec<f32> {
    let mut out = vec![0f32; dv * h * nq];
    for hh in 0..h {
        for i in 0..nq {
            let mut w: Vec<f32> = (0..nkv)
                .map(|j| (0..d).map(|x| q[(hh * nq + i) * d + x] * k[(hh * nkv + j) * d + x]).sum::<f32>() * scale)
                .collect();
            softmax_rows(&mut w, nkv);
            for x in 0..dv {
                out[(i * h + hh) * dv + x] = (0..nkv).map(|j| w[j] * v[(hh * nkv + j) * dv + x]).sum();
            }
        }
    }
    out
}

#[test]
fn flash_attn_ext_matches_naive_attention() {
    let (d, nq, nkv, h) = (16usize, 7usize, 11usize, 3usize);
    let q = vals(d * nq * h, 40);
    let k = f16_round(&vals(d * nkv * h, 41));
    let v = f16_round(&vals(d * nkv * h, 42));
    let scale = 1.0 / (d as f32).sqrt();
    let (got, ne) = run(
        vec![
            (vec![d as i64, nq as i64, h as i64], Data::F32(q.clone())),
            (vec![d as i64, nkv as i64, h as i64], Data::F16(k.clone())),
            (vec![d as i64, nkv as i64, h as i64], Data::F16(v.clone())),
        ],
        |c, t| c.flash_attn_ext(t[0], t[1], t[2], None, scale).unwrap(),
    );
    assert_eq!(ne, [d as i64, h as i64, nq as i64, 1]);
    let want = attention_ref(&q, &k, &v, d, d, nq, nkv, h, scale);
    // ggml converts q to f16 for f16 k/v.
    assert_close(&got, &want, 3e-3, "flash_attn_ext");
}

#[test]
fn activations() {
    let x: Vec<f32> = vals(257, 50).iter().map(|v| v * 6.0).collect();
    let erf = |v: f64| libm_erf(v);
    let cases: Vec<(&str, Box<dyn Fn(f32) -> f32>)> = vec![
        ("gelu", Box::new(|v: f32| 0.5 * v * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh()))),
        ("gelu_erf", Box::new(move |v: f32| (0.5 * v as f64 * (1.0 + erf(v as f64 / std::f64::consts::SQRT_2))) as f32)),
        ("gelu_quick", Box::new(|v: f32| v / (1.0 + (-1.702 * v).exp()))),
        ("silu", Box::new(|v: f32| v / (1.0 + (-v).exp()))),
    ];
    for (name, f) in cases {
        let (got, _) = run(vec![(vec![257], Data::F32(x.clone()))], |c, t| match name {
            "gelu" => c.gelu(t[0]).unwrap(),
            "gelu_erf" => c.gelu_erf(t[0]).unwrap(),
            "gelu_quick" => c.gelu_quick(t[0]).unwrap(),
            _ => c.silu(t[0]).unwrap(),
        });
        let want: Vec<f32> = x.iter().map(|&v| f(v)).collect();
        // ggml's gelu uses an f16 lookup table on CPU.
        assert_close(&got, &want, 2e-3, name);
    }
}

/// erf by Abramowitz–Stegun 7.1.26 refined with a series; accurate to ~1e-9 here.
fn libm_erf(x: f64) -> f64 {
    // Taylor series converges fast for |x| < 3; beyond that erf is 1 to f32 precision.
    if x.abs() > 4.0 {
        return x.signum();
    }
    let mut sum = 0f64;
    let mut term = x;
    let mut n = 0;
    while n < 200 {
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
        n += 1;
        term *= -x * x / n as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn upscale_nearest_and_bilinear() {
    let (w, h, c) = (4usize, 3usize, 2usize);
    let x = vals(w * h * c, 60);
    let (got, ne) = run(vec![(vec![w as i64, h as i64, c as i64], Data::F32(x.clone()))], |ctx, t| ctx.upscale(t[0], 2).unwrap());
    assert_eq!(ne, [8, 6, 2, 1]);
    let mut want = vec![0f32; w * h * c * 4];
    for ch in 0..c {
        for y in 0..h * 2 {
            for xx in 0..w * 2 {
                want[(ch * h * 2 + y) * w * 2 + xx] = x[(ch * h + y / 2) * w + xx / 2];
            }
        }
    }
    assert_close(&got, &want, 0.0, "upscale nearest");

    // Bilinear, half-pixel centres (torch align_corners=False).
    let (ow, oh) = (7usize, 5usize);
    let (got, _) = run(vec![(vec![w as i64, h as i64, c as i64], Data::F32(x.clone()))], |ctx, t| {
        ctx.interpolate(t[0], [ow as i64, oh as i64, c as i64, 1], ScaleMode::Bilinear).unwrap()
    });
    let sample = |ch: usize, fy: f32, fx: f32| {
        let fy = fy.clamp(0.0, (h - 1) as f32);
        let fx = fx.clamp(0.0, (w - 1) as f32);
        let (y0, x0) = (fy.floor() as usize, fx.floor() as usize);
        let (y1, x1) = ((y0 + 1).min(h - 1), (x0 + 1).min(w - 1));
        let (dy, dx) = (fy - y0 as f32, fx - x0 as f32);
        let p = |y: usize, xx: usize| x[(ch * h + y) * w + xx];
        p(y0, x0) * (1.0 - dy) * (1.0 - dx) + p(y0, x1) * (1.0 - dy) * dx + p(y1, x0) * dy * (1.0 - dx) + p(y1, x1) * dy * dx
    };
    let mut want = vec![0f32; ow * oh * c];
    for ch in 0..c {
        for y in 0..oh {
            for xx in 0..ow {
                let fy = (y as f32 + 0.5) * h as f32 / oh as f32 - 0.5;
                let fx = (xx as f32 + 0.5) * w as f32 / ow as f32 - 0.5;
                want[(ch * oh + y) * ow + xx] = sample(ch, fy, fx);
            }
        }
    }
    assert_close(&got, &want, 1e-5, "interpolate bilinear");
}

#[test]
fn pad_concat_permute_reshape_view() {
    let (a0, a1, a2) = (3usize, 4usize, 2usize);
    let x = vals(a0 * a1 * a2, 70);
    let idx = |i0: usize, i1: usize, i2: usize| (i2 * a1 + i1) * a0 + i0;

    let (got, ne) = run(vec![(vec![3, 4, 2], Data::F32(x.clone()))], |c, t| c.pad(t[0], [(1, 2), (0, 1), (0, 0), (0, 0)]).unwrap());
    assert_eq!(ne, [6, 5, 2, 1]);
    let mut want = vec![0f32; 6 * 5 * 2];
    for i2 in 0..a2 {
        for i1 in 0..a1 {
            for i0 in 0..a0 {
                want[(i2 * 5 + i1) * 6 + i0 + 1] = x[idx(i0, i1, i2)];
            }
        }
    }
    assert_close(&got, &want, 0.0, "pad");

    let y = vals(a0 * 2 * a2, 71);
    let (got, ne) = run(vec![(vec![3, 4, 2], Data::F32(x.clone())), (vec![3, 2, 2], Data::F32(y.clone()))], |c, t| c.concat(t[0], t[1], 1).unwrap());
    assert_eq!(ne, [3, 6, 2, 1]);
    let mut want = Vec::new();
    for i2 in 0..a2 {
        want.extend_from_slice(&x[i2 * a0 * a1..(i2 + 1) * a0 * a1]);
        want.extend_from_slice(&y[i2 * a0 * 2..(i2 + 1) * a0 * 2]);
    }
    assert_close(&got, &want, 0.0, "concat");

    // permute(1,2,0,3): source dim 0 → 1, 1 → 2, 2 → 0; new ne = [a2, a0, a1].
    let (got, ne) = run(vec![(vec![3, 4, 2], Data::F32(x.clone()))], |c, t| c.permute(t[0], [1, 2, 0, 3]).unwrap());
    assert_eq!(ne, [2, 3, 4, 1]);
    let mut want = vec![0f32; x.len()];
    for i2 in 0..a2 {
        for i1 in 0..a1 {
            for i0 in 0..a0 {
                want[(i1 * a0 + i0) * a2 + i2] = x[idx(i0, i1, i2)];
            }
        }
    }
    assert_close(&got, &want, 0.0, "permute+cont");

    let (got, ne) = run(vec![(vec![3, 4, 2], Data::F32(x.clone()))], |c, t| c.reshape(t[0], [6, 2, 2, 1]).unwrap());
    assert_eq!(ne, [6, 2, 2, 1]);
    assert_close(&got, &x, 0.0, "reshape");

    // View of rows 1..3 of each plane.
    let (got, ne) = run(vec![(vec![3, 4, 2], Data::F32(x.clone()))], |c, t| {
        let nb = t[0].nb();
        c.view(t[0], [3, 2, 2, 1], [nb[1], nb[2], nb[3]], nb[1]).unwrap()
    });
    assert_eq!(ne, [3, 2, 2, 1]);
    let mut want = Vec::new();
    for i2 in 0..a2 {
        for i1 in 1..3 {
            for i0 in 0..a0 {
                want.push(x[idx(i0, i1, i2)]);
            }
        }
    }
    assert_close(&got, &want, 0.0, "view");
}

#[test]
fn view_out_of_bounds_is_an_error() {
    let ctx = Context::new(8, 8).unwrap();
    let a = ctx.new_tensor(GType::F32, &[4, 4]).unwrap();
    assert!(ctx.view(a, [4, 4, 1, 1], [16, 64, 64], 4).is_err());
    assert!(ctx.reshape(a, [5, 3, 1, 1]).is_err());
    assert!(ctx.permute(a, [0, 0, 1, 2]).is_err());
}

#[test]
fn get_rows_gathers() {
    let (d, r) = (5usize, 6usize);
    let table = vals(d * r, 80);
    let ids = vec![4, 0, 0, 5, 2];
    let (got, ne) = run(vec![(vec![d as i64, r as i64], Data::F32(table.clone())), (vec![ids.len() as i64], Data::I32(ids.clone()))], |c, t| {
        c.get_rows(t[0], t[1]).unwrap()
    });
    assert_eq!(ne, [d as i64, ids.len() as i64, 1, 1]);
    let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec()).collect();
    assert_close(&got, &want, 0.0, "get_rows");
}

#[test]
fn rope_normal_and_neox() {
    let (d, h, n) = (8usize, 2usize, 5usize);
    let x = vals(d * h * n, 90);
    let pos: Vec<i32> = (0..n as i32).map(|p| p * 3 + 1).collect();
    for &mode in &[0i32, 2] {
        let (got, _) = run(vec![(vec![d as i64, h as i64, n as i64], Data::F32(x.clone())), (vec![n as i64], Data::I32(pos.clone()))], |c, t| {
            c.rope(t[0], t[1], d as i32, mode, 10000.0).unwrap()
        });
        let mut want = x.clone();
        for t in 0..n {
            for hh in 0..h {
                let base = (t * h + hh) * d;
                for i in 0..d / 2 {
                    let theta = pos[t] as f32 * 10000f32.powf(-2.0 * i as f32 / d as f32);
                    let (i0, i1) = if mode == 0 { (2 * i, 2 * i + 1) } else { (i, i + d / 2) };
                    let (a, b) = (x[base + i0], x[base + i1]);
                    want[base + i0] = a * theta.cos() - b * theta.sin();
                    want[base + i1] = a * theta.sin() + b * theta.cos();
                }
            }
        }
        assert_close(&got, &want, 1e-4, &format!("rope mode {mode}"));
    }
}

#[test]
fn context_capacity_is_an_error_not_an_abort() {
    // The pool also holds room for the graph, so count how many tensors fit: ggml would
    // abort on the next one, we must return an error instead.
    let ctx = Context::new(2, 8).unwrap();
    let a = ctx.new_tensor(GType::F32, &[4]).unwrap();
    let mut made = 1;
    while ctx.new_tensor(GType::F32, &[4]).is_ok() {
        made += 1;
        assert!(made < 1000, "context never filled up");
    }
    assert!(made >= 2);
    assert!(ctx.silu(a).is_err());
    assert!(ctx.add(a, a).is_err());
}

#[test]
fn data_size_mismatch_is_an_error() {
    let ctx = Context::new(4, 8).unwrap();
    let a = ctx.new_tensor(GType::F32, &[4]).unwrap();
    // No buffer yet.
    assert!(a.set_f32(&[1.0; 4]).is_err());
    let backend = Backend::cpu(1).unwrap();
    let _buf = backend.alloc_tensors(&ctx, "test").unwrap();
    assert!(a.set_f32(&[1.0; 3]).is_err());
    a.set_f32(&[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(a.get_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

/// Plain product of `a` [k, m, a2] and `b` [k, n, b2] (a broadcast over b's batches).
fn matmul_ref(a: &[f32], b: &[f32], k: usize, m: usize, n: usize, a2: usize, b2: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n * b2];
    for z in 0..b2 {
        let az = z / (b2 / a2);
        for j in 0..n {
            for i in 0..m {
                out[(z * n + j) * m + i] = (0..k).map(|x| a[(az * m + i) * k + x] * b[(z * n + j) * k + x]).sum();
            }
        }
    }
    out
}

// Large enough for the CPU product op (core::ggml::matmul), with two threads: weight
// bands per thread, whole matrices per thread, broadcast, f16 and quantized weights.
#[test]
fn cpu_product_op_matches_plain_products() {
    let (k, m, n) = (96, 40, 80);
    let a = vals(k * m * 2, 11);
    let b = vals(k * n * 4, 12);
    let (got, ne) = run(vec![(vec![k as i64, m as i64, 2], Data::F32(a.clone())), (vec![k as i64, n as i64, 4], Data::F32(b.clone()))], |c, t| c.mul_mat(t[0], t[1]).unwrap());
    assert_eq!(ne, [m as i64, n as i64, 4, 1]);
    assert_close(&got, &matmul_ref(&a, &b, k, m, n, 2, 4), 1e-5, "f32 broadcast");

    // One weight matrix times a batch: the batch becomes extra columns.
    let a1 = f16_round(&vals(k * m, 13));
    let (got, _) = run(vec![(vec![k as i64, m as i64], Data::F16(a1.clone())), (vec![k as i64, n as i64, 4], Data::F32(b.clone()))], |c, t| c.mul_mat(t[0], t[1]).unwrap());
    // f16 weights are expanded to f32; the activations stay f32.
    assert_close(&got, &matmul_ref(&a1, &b, k, m, n, 1, 4), 1e-5, "f16 weights");

    let a1 = vals(k * m, 14);
    quantized_products(&a1, &b, k, m, n, GType::Q8_0);

    // Transposed output, and a non-contiguous batch layout of b (a permuted view).
    let (got, ne) = run(vec![(vec![k as i64, m as i64], Data::F32(a1.clone())), (vec![k as i64, 4, n as i64], Data::F32(b.clone()))], |c, t| {
        let bp = c.permute(t[1], [0, 2, 1, 3]).unwrap(); // [k, n, 4] view
        c.mul_mat_t(t[0], bp).unwrap()
    });
    assert_eq!(ne, [n as i64, m as i64, 4, 1]);
    // b's memory is [k, 4, n]: element (x, z, j) at (j*4 + z)*k + x.
    let bz: Vec<f32> = (0..4).flat_map(|z| (0..n).flat_map(move |j| (0..k).map(move |x| (j, z, x)))).map(|(j, z, x)| b[(j * 4 + z) * k + x]).collect();
    let want = matmul_ref(&a1, &bz, k, m, n, 1, 4);
    let want_t: Vec<f32> = (0..4).flat_map(|z| (0..m).flat_map(move |i| (0..n).map(move |j| (z, i, j)))).map(|(z, i, j)| want[(z * n + j) * m + i]).collect();
    assert_close(&got, &want_t, 1e-5, "transposed output");
}

/// `tol` for sums of `k` terms: f32 sums of thousands of terms in another order than the
/// reference's differ by ~1e-5 of 1 + |sum|; a packing slip would be of the order of the
/// values.
fn long_sums(k: usize, tol: f32) -> f32 {
    if k > 1024 {
        tol.max(1e-4)
    } else {
        tol
    }
}

/// Quantized weights multiply as their dequantized values: on the CPU's bf16 units where it
/// has them (both operands rounded to bf16, as bf16 weights are), unless the product has
/// fewer than 32 columns; exactly in f32 elsewhere.
fn quantized_products(a: &[f32], b: &[f32], k: usize, m: usize, n: usize, ty: GType) {
    let (deq, _) = run(vec![(vec![k as i64, m as i64], Data::F32(a.to_vec()))], |c, t| c.cast(c.cast(t[0], ty).unwrap(), GType::F32).unwrap());
    // Below 2¹⁸ multiply-adds ggml's own products run (activations rounded to 8 bits):
    // the narrow case only where it stays above that.
    for cols in [n, 16].into_iter().filter(|&c| c == n || k * m * c >= 1 << 18) {
        let b = &b[..k * cols];
        let (got, ne) = run(vec![(vec![k as i64, m as i64], Data::F32(a.to_vec())), (vec![k as i64, cols as i64], Data::F32(b.to_vec()))], |c, t| c.mul_mat(c.cast(t[0], ty).unwrap(), t[1]).unwrap());
        assert_eq!(ne, [m as i64, cols as i64, 1, 1]);
        let bf16 = sdflow_core::ggml::bf16::available() && cols >= 32;
        let (want, tol) = if bf16 { (matmul_ref(&bf16_round(&deq), &bf16_round(b), k, m, cols, 1, 1), 2e-5) } else { (matmul_ref(&deq, b, k, m, cols, 1, 1), 1e-5) };
        let tol = long_sums(k, tol);
        assert_close(&got, &want, tol, &format!("{} weights, {cols} columns", ty.name()));
    }
}

/// Wide enough that each thread packs its band in several column chunks (of 256 at this K).
#[test]
fn wide_quantized_products_match_their_dequantized_weights() {
    let (k, m, n) = (2048, 600, 40);
    for (i, dtype) in [DType::Q8_0, DType::Q4K].into_iter().enumerate() {
        let ty = GType(dtype.ggml_type().unwrap());
        quantized_products(&vals(k * m, 35 + i as u64), &vals(k * n, 45 + i as u64), k, m, n, ty);
    }
}

#[test]
fn k_quant_products_match_their_dequantized_weights() {
    let (k, m, n) = (512, 48, 70);
    for (i, dtype) in [DType::Q4K, DType::Q6K].into_iter().enumerate() {
        let ty = GType(dtype.ggml_type().unwrap());
        quantized_products(&vals(k * m, 15 + i as u64), &vals(k * n, 25 + i as u64), k, m, n, ty);
    }
}

// Large enough that each thread of the CPU convolution works through several column
// blocks, whose edges fall inside output rows; with 1×1, 3×3 and 5×5 kernels, padded and
// not, f32 and f16 kernels.
#[test]
fn cpu_convolution_over_several_blocks() {
    for &(kw, p) in &[(1usize, 0usize), (3, 1), (3, 0), (5, 2)] {
        let kn = [kw, kw, 6, 600];
        let xn = [40usize, 30, 6, 2];
        let k = f16_round(&vals(kn.iter().product(), 20));
        let x = vals(xn.iter().product(), 21);
        let (want, wn) = conv_ref(&k, kn, &x, xn, 1, p, 1);
        let ne = |a: [usize; 4]| a.iter().map(|&v| v as i64).collect::<Vec<_>>();
        for data in [Data::F32(k.clone()), Data::F16(k.clone())] {
            let (got, gne) = run(vec![(ne(kn), data), (ne(xn), Data::F32(x.clone()))], |c, t| c.conv_2d(t[0], t[1], (1, 1), (p as i32, p as i32), (1, 1)).unwrap());
            assert_eq!(gne, [wn[0] as i64, wn[1] as i64, wn[2] as i64, wn[3] as i64]);
            assert_close(&got, &want, 1e-4, &format!("conv {kw}×{kw} pad {p}"));
        }
    }
}

#[test]
fn max_pool_2d_pads_with_minus_infinity() {
    // SPPF's pool: 5×5, stride 1, padding 2, on values that are all negative so a zero
    // padding would show.
    let (w, h, c) = (7usize, 6usize, 2usize);
    let x: Vec<f32> = vals(w * h * c, 31).iter().map(|v| v - 2.0).collect();
    let (got, ne) = run(vec![(vec![w as i64, h as i64, c as i64, 1], Data::F32(x.clone()))], |ctx, t| ctx.max_pool_2d(t[0], 5, 1, 2).unwrap());
    assert_eq!(ne, [w as i64, h as i64, c as i64, 1]);
    let mut want = Vec::new();
    for ch in 0..c {
        for y in 0..h as i64 {
            for xx in 0..w as i64 {
                let mut m = f32::NEG_INFINITY;
                for ky in (y - 2).max(0)..(y + 3).min(h as i64) {
                    for kx in (xx - 2).max(0)..(xx + 3).min(w as i64) {
                        m = m.max(x[(ch * h + ky as usize) * w + kx as usize]);
                    }
                }
                want.push(m);
            }
        }
    }
    assert_close(&got, &want, 0.0, "max_pool_2d");
    let ctx = Context::new(8, 8).unwrap();
    let t = ctx.new_tensor(GType::F32, &[4, 4, 1, 1]).unwrap();
    assert!(ctx.max_pool_2d(t, 5, 1, 0).is_err(), "a window larger than the input");
    assert!(ctx.max_pool_2d(t, 3, 1, 2).is_err(), "padding over half the window");
}

/// bf16 weights multiply on the CPU's bf16 units where it has them (`ggml::bf16`: AMX
/// tiles or AVX-512 BF16), with the activations rounded to bf16; elsewhere on ggml's or our
/// f32 kernels. Either way the result is the product of the bf16 weights, to bf16 rounding
/// of the activations: the tolerance is tight where our kernels ran (both operands rounded
/// in the reference) and bf16's where they did not.
fn bf16_tolerance() -> f32 {
    if sdflow_core::ggml::bf16::available() {
        2e-5
    } else {
        2e-2
    }
}

// Row blocks of 32 and a partial one, output columns beyond the bands' multiples of 32,
// batches merged into one product, transposed output, and too-small products.
/// Without bf16 units ggml's own bf16 products run, and ggml decides how it rounds the
/// activations (this build keeps them closer than bf16 on AVX2-only CPUs): each result is
/// then within bf16's rounding bound of the exact product, 2⁻⁸·Σ|aᵢbᵢ| (round-to-nearest
/// is 2⁻⁹; twice that allows truncation), taken from the same product of absolute values.
fn assert_within_bf16_rounding(got: &[f32], exact: &[f32], magnitude: &[f32], what: &str) {
    assert_eq!(got.len(), exact.len(), "{what}: length");
    for (i, ((g, e), m)) in got.iter().zip(exact).zip(magnitude).enumerate() {
        let bound = m / 256.0 + 1e-5 * (1.0 + e.abs());
        assert!((g - e).abs() <= bound, "{what}: index {i}: got {g}, exact {e}, bound {bound}");
    }
}

fn abs(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| x.abs()).collect()
}

#[test]
fn bf16_products_match_plain_products() {
    let tol = bf16_tolerance();
    let units = sdflow_core::ggml::bf16::available();
    // (4096, 300, …): each thread's band spans two of the column chunks it packs at a time.
    for &(k, m, n, batch) in &[(96usize, 40usize, 80usize, 4usize), (64, 70, 33, 1), (32, 32, 32, 1), (160, 96, 7, 3), (48, 24, 50, 1), (4096, 300, 40, 2)] {
        let a = bf16_round(&vals(k * m, 31));
        let b = vals(k * n * batch, 32);
        let (got, ne) = run(vec![(vec![k as i64, m as i64], Data::BF16(a.clone())), (vec![k as i64, n as i64, batch as i64], Data::F32(b.clone()))], |c, t| c.mul_mat(t[0], t[1]).unwrap());
        assert_eq!(ne, [m as i64, n as i64, batch as i64, 1]);
        let tol = long_sums(k, tol);
        let transpose = |v: &[f32]| -> Vec<f32> { (0..batch).flat_map(|z| (0..m).flat_map(move |i| (0..n).map(move |j| (z, i, j)))).map(|(z, i, j)| v[(z * n + j) * m + i]).collect() };
        let (got_t, ne) = run(vec![(vec![k as i64, m as i64], Data::BF16(a.clone())), (vec![k as i64, n as i64, batch as i64], Data::F32(b.clone()))], |c, t| c.mul_mat_t(t[0], t[1]).unwrap());
        assert_eq!(ne, [n as i64, m as i64, batch as i64, 1]);
        if !units {
            let (exact, magnitude) = (matmul_ref(&a, &b, k, m, n, 1, batch), matmul_ref(&abs(&a), &abs(&b), k, m, n, 1, batch));
            assert_within_bf16_rounding(&got, &exact, &magnitude, &format!("bf16 product k{k} m{m} n{n} x{batch}"));
            assert_within_bf16_rounding(&got_t, &transpose(&exact), &transpose(&magnitude), &format!("bf16 transposed k{k} m{m} n{n} x{batch}"));
            continue;
        }
        let want = matmul_ref(&a, &bf16_round(&b), k, m, n, 1, batch);
        assert_close(&got, &want, tol, &format!("bf16 product k{k} m{m} n{n} x{batch}"));
        assert_close(&got_t, &transpose(&want), tol, &format!("bf16 transposed k{k} m{m} n{n} x{batch}"));
    }
}

// Stride-1 convolutions with bf16 kernels: several 32-column blocks per thread, rows
// narrower than a block (the zero rows below the input), 1×1 to 5×5 kernels, output
// channels that leave a partial block (a VAE's conv_out: 3).
#[test]
fn bf16_convolutions_match_plain_convolutions() {
    let tol = bf16_tolerance();
    let units = sdflow_core::ggml::bf16::available();
    for &(kw, p, xn, cout) in &[(3usize, 1usize, [40usize, 30, 64, 2], 64usize), (3, 1, [5, 4, 32, 1], 32), (1, 0, [17, 9, 32, 2], 96), (5, 2, [12, 11, 32, 1], 32), (3, 0, [9, 8, 64, 1], 32), (3, 1, [20, 14, 64, 2], 3), (1, 0, [9, 7, 32, 1], 40)] {
        let kn = [kw, kw, xn[2], cout];
        let k = bf16_round(&vals(kn.iter().product(), 40));
        let x = vals(xn.iter().product(), 41);
        let (want, wn) = conv_ref(&k, kn, &bf16_round(&x), xn, 1, p, 1);
        let ne = |a: [usize; 4]| a.iter().map(|&v| v as i64).collect::<Vec<_>>();
        let pi = p as i32;
        let (got, gne) = run(vec![(ne(kn), Data::BF16(k.clone())), (ne(xn), Data::F32(x.clone()))], |c, t| c.conv_2d(t[0], t[1], (1, 1), (pi, pi), (1, 1)).unwrap());
        assert_eq!(gne, [wn[0] as i64, wn[1] as i64, wn[2] as i64, wn[3] as i64]);
        if !units {
            let (exact, _) = conv_ref(&k, kn, &x, xn, 1, p, 1);
            let (magnitude, _) = conv_ref(&abs(&k), kn, &abs(&x), xn, 1, p, 1);
            assert_within_bf16_rounding(&got, &exact, &magnitude, &format!("bf16 conv {kw}x{kw} pad {p} input {xn:?} to {cout}"));
            continue;
        }
        assert_close(&got, &want, tol, &format!("bf16 conv {kw}x{kw} pad {p} input {xn:?} to {cout}"));
    }
}

// Attention of a bf16 model: where the CPU has bf16 units both products run on them with q, k,
// v and the probabilities rounded to bf16. Head widths and key counts that are not
// multiples of 32 (zero padding), partial query blocks, several heads and batches.
#[test]
fn bf16_attention_matches_plain_attention() {
    for &(dh, heads, tq, tk, b) in &[(40usize, 2usize, 70usize, 77usize, 2usize), (64, 1, 33, 300, 1), (8, 3, 5, 9, 1)] {
        let d = dh * heads;
        let (q, k, v) = (vals(d * tq * b, 50), vals(d * tk * b, 51), vals(d * tk * b, 52));
        let (got, ne) = run(
            vec![(vec![d as i64, tq as i64, b as i64], Data::F32(q.clone())), (vec![d as i64, tk as i64, b as i64], Data::F32(k.clone())), (vec![d as i64, tk as i64, b as i64], Data::F32(v.clone()))],
            |c, t| sdflow_core::models::nn::attention_typed(c, t[0], t[1], t[2], heads as i64, None, GType::BF16).unwrap(),
        );
        assert_eq!(ne, [d as i64, tq as i64, b as i64, 1]);
        let scale = 1.0 / (dh as f64).sqrt();
        let mut want = vec![0f32; d * tq * b];
        for z in 0..b {
            for h in 0..heads {
                for i in 0..tq {
                    let qi = &q[(z * tq + i) * d + h * dh..][..dh];
                    let s: Vec<f64> = (0..tk).map(|j| qi.iter().zip(&k[(z * tk + j) * d + h * dh..][..dh]).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale).collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for c in 0..dh {
                        want[(z * tq + i) * d + h * dh + c] = (0..tk).map(|j| e[j] * v[(z * tk + j) * d + h * dh + c] as f64).sum::<f64>() as f32 / sum as f32;
                    }
                }
            }
        }
        // bf16 operands: about 2^-8 of the values' size.
        assert_close(&got, &want, 1e-2, &format!("bf16 attention dh {dh} heads {heads} tq {tq} tk {tk} batch {b}"));
    }
}
