//! RNGs against references: torch's CPU `randn` (fixtures from real torch), A1111's Philox
//! port of torch CUDA `randn` plus the Random123 known-answer vectors, and libstdc++'s
//! `std_default` (fixture from g++). See fixtures/sampling/gen_sampling_fixtures.py.

use std::path::PathBuf;

use sdflow_core::sampling::rng::{philox4x32_10, CpuKernel};
use sdflow_core::sampling::{CpuRng, PhiloxRng, Rng, RngKind, StdDefaultRng};
use serde_json::Value;

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sampling")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn bits_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("bits array")
        .iter()
        .map(|b| b.as_u64().expect("u32") as u32)
        .collect()
}

fn to_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn check_cpu(section: &str, kernel: CpuKernel) {
    let doc: Value = serde_json::from_str(&fixture("rng_cpu.json")).unwrap();
    let doc = &doc[section];
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 21);
    for case in cases {
        let seed = case["seed"].as_u64().unwrap();
        let n = case["n"].as_u64().unwrap() as usize;
        let mut rng = CpuRng::with_kernel(seed, kernel);
        let got = to_bits(&rng.randn(n));
        assert_eq!(
            got,
            bits_of(&case["bits"]),
            "torch {section} randn({n}) for seed {seed}"
        );
    }
    let seq = &doc["sequence"];
    let mut rng = CpuRng::with_kernel(seq["seed"].as_u64().unwrap(), kernel);
    for (k, call) in seq["calls"].as_array().unwrap().iter().enumerate() {
        let n = call["n"].as_u64().unwrap() as usize;
        assert_eq!(
            to_bits(&rng.randn(n)),
            bits_of(&call["bits"]),
            "{section} call {k} (randn({n}))"
        );
    }
}

#[test]
fn cpu_rng_is_bit_exact_with_torch_portable_kernel() {
    check_cpu("default", CpuKernel::Portable);
}

#[test]
fn cpu_rng_is_bit_exact_with_torch_vectorized_kernel() {
    check_cpu("avx2", CpuKernel::Vectorized);
}

#[test]
fn cpu_rng_seeds_take_the_low_32_bits_like_torch() {
    let a = CpuRng::new(5).randn(40);
    let b = CpuRng::new((1u64 << 32) + 5).randn(40);
    assert_eq!(to_bits(&a), to_bits(&b));
    assert_ne!(to_bits(&a), to_bits(&CpuRng::new(6).randn(40)));
}

#[test]
fn philox_block_matches_random123_known_answers() {
    // Random123 kat_vectors, philox4x32 with 10 rounds.
    assert_eq!(
        philox4x32_10([0, 0, 0, 0], [0, 0]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([0xffffffff; 4], [0xffffffff, 0xffffffff]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

#[test]
fn philox_randn_matches_a1111_reference() {
    let doc: Value = serde_json::from_str(&fixture("rng_philox.json")).unwrap();
    for case in doc["cases"].as_array().unwrap() {
        let seed = case["seed"].as_u64().unwrap();
        let n = case["n"].as_u64().unwrap() as usize;
        // The raw counter words must agree exactly.
        let key = [seed as u32, (seed >> 32) as u32];
        for (i, w) in case["words01"].as_array().unwrap().iter().enumerate() {
            let g = philox4x32_10([0, 0, i as u32, 0], key);
            assert_eq!(
                [g[0] as u64, g[1] as u64],
                [w[0].as_u64().unwrap(), w[1].as_u64().unwrap()]
            );
        }
        let got = PhiloxRng::new(seed).randn(n);
        let want: Vec<f32> = bits_of(&case["bits"])
            .into_iter()
            .map(f32::from_bits)
            .collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // numpy's float32 log/sin may differ from libm by an ulp.
            assert!(
                (g - w).abs() <= 2e-6 * w.abs().max(1.0),
                "seed {seed} n {n} [{i}]: {g} vs {w}"
            );
        }
    }
    let seq = &doc["sequence"];
    let mut rng = PhiloxRng::new(seq["seed"].as_u64().unwrap());
    for call in seq["calls"].as_array().unwrap() {
        let n = call["n"].as_u64().unwrap() as usize;
        let got = rng.randn(n);
        let want: Vec<f32> = bits_of(&call["bits"])
            .into_iter()
            .map(f32::from_bits)
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 2e-6 * w.abs().max(1.0));
        }
    }
}

#[test]
fn std_default_matches_libstdcxx() {
    let text = fixture("rng_std_default.txt");
    let mut current: Option<(u64, StdDefaultRng)> = None;
    let mut lines = 0;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let seed: u64 = it.next().unwrap().parse().unwrap();
        let n: usize = it.next().unwrap().parse().unwrap();
        let want: Vec<u32> = it.map(|h| u32::from_str_radix(h, 16).unwrap()).collect();
        assert_eq!(want.len(), n);
        if current.as_ref().map(|c| c.0) != Some(seed) {
            current = Some((seed, StdDefaultRng::new(seed)));
        }
        let rng = &mut current.as_mut().unwrap().1;
        assert_eq!(
            to_bits(&rng.randn(n)),
            want,
            "std_default seed {seed} randn({n})"
        );
        lines += 1;
    }
    assert_eq!(lines, 30);
}

#[test]
fn rng_kind_names() {
    for k in RngKind::ALL {
        assert_eq!(k.name().parse::<RngKind>().unwrap(), k);
    }
    assert_eq!("CUDA".parse::<RngKind>().unwrap(), RngKind::Cuda);
    let err = "mersenne".parse::<RngKind>().unwrap_err().to_string();
    assert!(
        err.contains("mersenne") && err.contains("std_default"),
        "{err}"
    );
    // Boxed generators continue their stream like the concrete ones.
    let mut boxed = RngKind::Cpu.seeded(42);
    let mut plain = CpuRng::new(42);
    assert_eq!(to_bits(&boxed.randn(20)), to_bits(&plain.randn(20)));
    assert_eq!(to_bits(&boxed.randn(3)), to_bits(&plain.randn(3)));
}

#[test]
fn random_u64_does_not_disturb_philox_noise() {
    let mut a = PhiloxRng::new(9);
    let mut b = PhiloxRng::new(9);
    let _ = a.randn(8);
    let _ = b.randn(8);
    let s1 = a.random_u64();
    let s2 = a.random_u64();
    assert_ne!(s1, s2);
    // Drawing a seed consumes one offset, like one randn call, and never repeats a row.
    let _ = b.randn(1);
    assert_eq!(
        to_bits(&a.randn(8)),
        to_bits(&{
            let _ = b.randn(1);
            b.randn(8)
        })
    );
}

/// A1111's variation noise, slerp(strength, randn(seed), randn(subseed)) over a CHW image,
/// against values from its formula in torch (fixtures/sampling/gen_variation_fixture.py),
/// the near-equal noises' linear fallback included.
#[test]
fn variation_slerp_matches_a1111() {
    use sdflow_core::sampling::variation::slerp;
    let doc: Value = serde_json::from_str(&fixture("variation.json")).unwrap();
    let shape: Vec<usize> = doc["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let (c, h, w) = (shape[0], shape[1], shape[2]);
    let n = c * h * w;
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let seed = case["seed"].as_u64().unwrap();
        let strength = case["strength"].as_f64().unwrap() as f32;
        let low = CpuRng::new(seed).randn(n);
        let high: Vec<f32> = match case.get("subseed") {
            Some(sub) => CpuRng::new(sub.as_u64().unwrap()).randn(n),
            None => {
                let scale = case["near_scale"].as_f64().unwrap() as f32;
                let other = CpuRng::new(case["near_seed"].as_u64().unwrap()).randn(n);
                low.iter().zip(&other).map(|(l, o)| l + scale * o).collect()
            }
        };
        let got = slerp(strength, &low, &high, c, h, w);
        let want: Vec<f32> = case["out"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(got.len(), want.len());
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 2e-6, "seed {seed} strength {strength}: max difference {worst}");
    }
    // The strengths at the ends are the two noises.
    let (a, b) = (CpuRng::new(1).randn(n), CpuRng::new(2).randn(n));
    assert_eq!(slerp(0.0, &a, &b, c, h, w), a);
}

/// A generator per sample: a batch's noise is each sample's generator's own draw, and
/// the Brownian trees get a seed per sample.
#[test]
fn per_sample_rng_draws_each_sample_from_its_generator() {
    use sdflow_core::sampling::PerSampleRng;
    let mut batch = PerSampleRng::new(vec![RngKind::Cpu.seeded(3), RngKind::Cpu.seeded(8)], None);
    let both = batch.randn(64);
    assert_eq!(to_bits(&both[..32]), to_bits(&CpuRng::new(3).randn(32)));
    assert_eq!(to_bits(&both[32..]), to_bits(&CpuRng::new(8).randn(32)));
    let mut fixed = PerSampleRng::new(vec![RngKind::Cpu.seeded(3), RngKind::Cpu.seeded(8)], Some(vec![3, 8]));
    assert_eq!(fixed.brownian_seeds(), vec![3, 8]);
    let mut drawn = PerSampleRng::new(vec![RngKind::Cuda.seeded(3), RngKind::Cuda.seeded(8)], None);
    assert_eq!(drawn.brownian_seeds(), vec![PhiloxRng::new(3).random_u64(), PhiloxRng::new(8).random_u64()]);
    // Boxed, it still says one seed per sample.
    let mut boxed: Box<dyn Rng + Send> = Box::new(PerSampleRng::new(vec![RngKind::Cpu.seeded(1), RngKind::Cpu.seeded(2)], Some(vec![1, 2])));
    assert_eq!(boxed.brownian_seeds().len(), 2);
}
