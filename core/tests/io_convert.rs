//! Conversion and quantization: f32 → f16/bf16/q8_0/q4_0 (and every other quantizer ggml
//! has) and back within the expected error; load-time type rules as sd.cpp applies them.

use std::collections::BTreeMap;

use sdflow_core::dtype::{self, ConvertError, DType};
use sdflow_core::io::{self, read_as, safetensors, TypeRules};

fn signal(n: usize) -> Vec<f32> {
    // Deterministic, weight-like values: a mix of sines with a few outliers.
    (0..n)
        .map(|i| {
            let x = i as f32;
            0.05 * (x * 0.37).sin() + 0.02 * (x * 1.91).cos() + if i % 97 == 0 { 0.3 } else { 0.0 }
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Root-mean-square error relative to the signal's RMS.
fn rel_rmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn round_trip(dst: DType, shape: &[usize], v: &[f32]) -> Result<Vec<f32>, ConvertError> {
    let q = dtype::convert(DType::F32, &f32_bytes(v), shape, dst)?;
    assert_eq!(Some(q.len()), dst.byte_len(v.len()), "{dst} size");
    let back = dtype::convert(dst, &q, shape, DType::F32)?;
    Ok(back
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

#[test]
fn f32_to_common_types_and_back_within_expected_error() {
    let shape = [8, 256];
    let v = signal(8 * 256);
    // (type, max relative RMSE): f16 has 11 significant bits, bf16 8; q8_0 stores 8-bit
    // values per 32-block scale, q4_0 4-bit.
    for (d, bound) in [
        (DType::F16, 1e-3),
        (DType::BF16, 5e-3),
        (DType::Q8_0, 1e-2),
        (DType::Q4_0, 0.15),
    ] {
        let back = round_trip(d, &shape, &v).unwrap();
        let e = rel_rmse(&v, &back);
        assert!(e < bound, "{d}: relative RMSE {e}");
        // Not trivially exact either (except nothing): the lossy path really ran.
        assert!(e > 0.0, "{d}: lossless?");
    }
}

#[test]
fn every_ggml_quantizer_round_trips() {
    let shape = [4, 512];
    let v = signal(4 * 512);
    for d in DType::all().filter(|d| d.is_quantized()) {
        match round_trip(d, &shape, &v) {
            Ok(back) => {
                let e = rel_rmse(&v, &back);
                eprintln!("{d}: relative RMSE {e:.4}");
                // Ternary and 1-bit formats are very coarse; everything else is within 0.5.
                let bound = if matches!(
                    d,
                    DType::TQ1_0 | DType::TQ2_0 | DType::Q1_0 | DType::Q2_0 | DType::IQ1M
                ) {
                    1.5
                } else {
                    0.5
                };
                assert!(e < bound, "{d}: relative RMSE {e}");
            }
            Err(ConvertError::NeedsImatrix(x)) => assert_eq!(x, d),
            Err(ConvertError::Unsupported(x)) => {
                assert!(matches!(x, DType::Q8_1 | DType::Q8K), "{x}")
            }
            Err(e) => panic!("{d}: {e}"),
        }
    }
}

#[test]
fn float8_and_integer_conversions() {
    let v = [0.0f32, 1.0, -2.5, 448.0, 1e-3, -300.0];
    let back = round_trip(DType::F8E4M3, &[6], &v).unwrap();
    assert_eq!(&back[..4], &[0.0, 1.0, -2.5, 448.0]);
    assert!((back[5] + 288.0).abs() < 1e-3, "{back:?}"); // nearest e4m3 to -300
    let back = round_trip(DType::I8, &[6], &v).unwrap();
    assert_eq!(back, [0.0, 1.0, -3.0, 127.0, 0.0, -128.0]); // rounds, saturates
}

#[test]
fn conversion_errors() {
    let v = f32_bytes(&signal(66));
    let e = dtype::convert(DType::F32, &v, &[2, 33], DType::Q4_0).unwrap_err();
    assert_eq!(
        e,
        ConvertError::RowNotBlockMultiple {
            dtype: DType::Q4_0,
            row: 33,
            block: 32
        }
    );
    let e = dtype::convert(DType::F32, &v[..8], &[2, 33], DType::F16).unwrap_err();
    assert!(matches!(e, ConvertError::ByteLength { .. }), "{e}");
    let e = dtype::convert(DType::F32, &v, &[usize::MAX, 2], DType::F16).unwrap_err();
    assert!(
        matches!(e, ConvertError::ByteLength { expected: None, .. }),
        "{e}"
    );
}

#[test]
fn type_rules_parse_like_sd_cpp() {
    let r = TypeRules::parse("q8_0", r"^vae\.=f16, attn=q4_K ,norm=f32").unwrap();
    assert_eq!(r.requested("vae.decoder.attn.w", DType::F32), Some(DType::F16)); // first match wins
    assert_eq!(r.requested("unet.attn.to_q.weight", DType::F32), Some(DType::Q4K));
    assert_eq!(r.requested("unet.conv.weight", DType::F32), Some(DType::Q8_0));
    assert_eq!(TypeRules::parse("", "").unwrap().requested("x", DType::F32), None);
    for (t, rules) in [("q9", ""), ("", "nope"), ("", "a=q9_9"), ("", "(=f16")] {
        assert!(
            matches!(TypeRules::parse(t, rules), Err(io::IoError::Rules { .. })),
            "{t} {rules}"
        );
    }
}

#[test]
fn read_as_converts_what_sd_cpp_converts() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    let w = f32_bytes(&signal(4 * 64));
    let odd = f32_bytes(&signal(3 * 33));
    let b = f32_bytes(&signal(64));
    let big = f32_bytes(&signal(2 * 256));
    let ids: Vec<u8> = (0..8i64).flat_map(|x| x.to_le_bytes()).collect();
    let f16w: Vec<u8> = dtype::convert(DType::F32, &w, &[4, 64], DType::F16).unwrap();
    let tensors: Vec<(&str, DType, Vec<usize>, &[u8])> = vec![
        ("blocks.0.attn.weight", DType::F32, vec![4, 64], &w),
        ("blocks.0.attn.bias", DType::F32, vec![64], &b),
        ("blocks.0.odd.weight", DType::F32, vec![3, 33], &odd),
        ("token_embedding.weight", DType::F32, vec![4, 64], &w),
        ("position_ids", DType::I64, vec![8], &ids),
        ("vae.conv.weight", DType::F16, vec![4, 64], &f16w),
        ("img_in.weight", DType::F32, vec![4, 64], &w),
        ("blocks.1.big.weight", DType::F32, vec![2, 256], &big),
    ];
    safetensors::write(&p, tensors, &BTreeMap::new()).unwrap();
    let src = io::open(&p).unwrap();
    let rules = TypeRules::parse("q8_0", r"^vae\.=f32").unwrap();
    let got = |n: &str| read_as(&*src, n, &rules).unwrap();
    let (d, bytes) = got("blocks.0.attn.weight");
    assert_eq!(
        (d, bytes.len()),
        (DType::Q8_0, DType::Q8_0.byte_len(256).unwrap())
    );
    // Skipped like sd.cpp: biases, embeddings, rows not a block multiple, FLUX in/out layers;
    // integer tensors are never converted.
    for n in [
        "blocks.0.attn.bias",
        "token_embedding.weight",
        "blocks.0.odd.weight",
        "position_ids",
        "img_in.weight",
    ] {
        let (d, bytes) = got(n);
        assert_eq!(d, src.get(n).unwrap().dtype, "{n}");
        assert_eq!(&*bytes, &*src.read(n).unwrap(), "{n}");
    }
    let (d, bytes) = got("vae.conv.weight");
    assert_eq!(d, DType::F32);
    let v: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(rel_rmse(&signal(256), &v) < 1e-3);
    assert!(matches!(
        read_as(&*src, "nope", &rules),
        Err(io::IoError::NotFound { .. })
    ));
    // No rules: stored type, zero-copy.
    let (d, bytes) = read_as(&*src, "blocks.0.attn.weight", &TypeRules::none()).unwrap();
    assert!(d == DType::F32 && matches!(bytes, io::TensorBytes::Borrowed(_)));
    // An imatrix-only type is an error naming the file and tensor, not an abort.
    let r = TypeRules::parse("iq2_xxs", "").unwrap();
    let e = read_as(&*src, "blocks.1.big.weight", &r)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("m.safetensors")
            && e.contains("blocks.1.big.weight")
            && e.contains("importance"),
        "{e}"
    );
}

#[test]
fn weight_types_choose_which_tensors_convert() {
    use io::WeightType;
    use sdflow_core::models::load::load_type;
    let info = |dt: DType| io::TensorInfo::detached("blocks.0.attn.weight", dt, vec![4, 64]);
    let floats = TypeRules::new(WeightType::Floats(DType::BF16), "").unwrap();
    let all = TypeRules::new(WeightType::All(DType::BF16), "").unwrap();
    // The per-CPU pick converts float files and leaves quantized ones as they are.
    assert_eq!(floats.target(&info(DType::F16)), DType::BF16);
    assert_eq!(floats.target(&info(DType::F32)), DType::BF16);
    assert_eq!(floats.target(&info(DType::Q8_0)), DType::Q8_0);
    // sd-cli's --type converts both.
    assert_eq!(all.target(&info(DType::Q8_0)), DType::BF16);
    assert_eq!(TypeRules::new(WeightType::Stored, "").unwrap().target(&info(DType::F16)), DType::F16);
    // At load, vectors (norm weights, OpenCLIP's `in_proj_bias`) are widened but never
    // narrowed; the rules themselves (what `sdflow convert` writes) convert them.
    let vector = |dt: DType| io::TensorInfo::detached("cond_stage_model.model.transformer.resblocks.0.attn.in_proj_bias", dt, vec![96]);
    assert_eq!(floats.target(&vector(DType::F32)), DType::BF16);
    assert_eq!(load_type(&vector(DType::F32), &floats), DType::F32);
    assert_eq!(load_type(&vector(DType::F16), &all), DType::F16);
    assert_eq!(load_type(&vector(DType::F16), &TypeRules::new(Some(DType::F32), "").unwrap()), DType::F32);
    assert_eq!(load_type(&info(DType::F32), &floats), DType::BF16, "matrices are converted");
    // Explicit per-tensor rules still win over the float-only default.
    let ruled = TypeRules::new(WeightType::Floats(DType::BF16), "attn=f32").unwrap();
    assert_eq!(ruled.target(&info(DType::Q8_0)), DType::F32);
    // Spellings round-trip; `auto` is this CPU's pick; junk is an error naming it.
    for w in [WeightType::Stored, WeightType::All(DType::Q4_0), WeightType::Floats(DType::BF16)] {
        assert_eq!(w.to_string().parse::<WeightType>().unwrap(), w);
    }
    assert_eq!("auto".parse::<WeightType>().unwrap(), WeightType::for_cpu());
    assert_eq!("F16".parse::<WeightType>().unwrap(), WeightType::All(DType::F16));
    let e = "floats:q9".parse::<WeightType>().unwrap_err().to_string();
    assert!(e.contains("q9"), "{e}");
    assert_eq!(WeightType::from(None), WeightType::Stored);
    assert_eq!(WeightType::from(Some(DType::F16)), WeightType::All(DType::F16));
}

/// fp8 weights stay at about a byte: q8_0 under the stored and the CPU's float type
/// (ggml computes no fp8), an asked-for `--type` as asked; vectors and rows that do not
/// split into blocks widen as before. q8_0 holds the fp8 values to a 127th of each
/// 32-value block's largest.
#[test]
fn fp8_weights_load_as_q8_0() {
    use sdflow_core::ggml::Backend;
    use sdflow_core::io::WeightType;
    use sdflow_core::models::load::{load_type, load_weights};
    let v: Vec<f32> = (0..64 * 64).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * if i % 7 == 0 { 4.0 } else { 0.3 }).collect();
    let fp8 = dtype::from_f32(&v, 64, DType::F8E4M3).unwrap();
    let vec8 = dtype::from_f32(&v[..64], 64, DType::F8E4M3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fp8.safetensors");
    safetensors::write(&path, [("m.weight", DType::F8E4M3, vec![64, 64], &fp8[..]), ("n.weight", DType::F8E4M3, vec![64], &vec8[..])], &BTreeMap::new()).unwrap();
    let src = io::open(&path).unwrap();
    let (m, n) = (src.get("m.weight").unwrap().clone(), src.get("n.weight").unwrap().clone());
    for wt in [WeightType::Stored, WeightType::Floats(DType::BF16)] {
        let rules = TypeRules::new(wt, "").unwrap();
        assert_eq!((load_type(&m, &rules), load_type(&n, &rules)), (DType::Q8_0, DType::F32), "{wt}");
    }
    assert_eq!(load_type(&m, &TypeRules::new(WeightType::All(DType::F16), "").unwrap()), DType::F16);
    let backend = Backend::cpu(1).unwrap();
    let w = load_weights(&backend, src.as_ref(), &[""], &TypeRules::none()).unwrap();
    assert!(w.bytes() < 64 * 64 * 9 / 8 + 64 * 4 + 64, "about a byte per weight: {} bytes", w.bytes());
    let exact = dtype::to_f32(DType::F8E4M3, &fp8, v.len()).unwrap();
    let q8 = dtype::convert(DType::F8E4M3, &fp8, &[64, 64], DType::Q8_0).unwrap();
    let back = dtype::to_f32(DType::Q8_0, &q8, v.len()).unwrap();
    for (block, (a, b)) in exact.chunks(32).zip(back.chunks(32)).enumerate() {
        let max = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err <= max / 127.0 * 0.51 + 1e-6, "block {block}: error {err} for a largest value {max}");
    }
}
