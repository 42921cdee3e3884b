//! Synthetic checkpoints: the generated key layout equals tables taken from the reference
//! implementations (`fixtures/synth/gen_key_tables.py`), and written files read back with
//! the right names, shapes, dtypes and seeded values.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::SafeTensors;
use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, Heads, SdConfig, SdVersion, SynthError};

fn fixture(name: &str) -> BTreeMap<String, Vec<usize>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let (k, dims) = line.split_once(' ').unwrap_or_else(|| panic!("bad fixture line {line:?}"));
            let shape = dims
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.parse().unwrap_or_else(|_| panic!("bad dim in {line:?}")))
                .collect();
            (k.to_string(), shape)
        })
        .collect()
}

fn generated(cfg: &SdConfig) -> BTreeMap<String, Vec<usize>> {
    let specs = cfg.tensors().unwrap();
    let map: BTreeMap<_, _> = specs.iter().map(|s| (s.name.clone(), s.shape.clone())).collect();
    assert_eq!(map.len(), specs.len(), "duplicate tensor names");
    map
}

fn assert_same_layout(cfg: &SdConfig, table: &str) {
    let want = fixture(table);
    let got = generated(cfg);
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).take(10).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).take(10).collect();
    assert!(missing.is_empty() && extra.is_empty(), "{table}: missing {missing:?}, extra {extra:?}");
    for (k, shape) in &want {
        assert_eq!(&got[k], shape, "{table}: shape of {k}");
    }
}

#[test]
fn sd15_layout_matches_the_reference_table() {
    assert_same_layout(&SdConfig::sd15(), "sd15.txt");
    let elements: usize = SdConfig::sd15().tensors().unwrap().iter().map(|s| s.n_elements()).sum();
    assert_eq!(elements, 1_066_235_307);
}

#[test]
fn sd21_layout_matches_the_reference_table() {
    assert_same_layout(&SdConfig::sd21(), "sd21.txt");
}

#[test]
fn tiny_layouts_match_the_reference_tables() {
    assert_same_layout(&SdConfig::tiny_sd1(), "tiny_sd1.txt");
    assert_same_layout(&SdConfig::tiny_sd2(), "tiny_sd2.txt");
}

#[test]
fn inpaint_config_widens_only_the_input_conv() {
    let mut cfg = SdConfig::sd15();
    cfg.unet.in_channels = 9;
    let got = generated(&cfg);
    let base = generated(&SdConfig::sd15());
    assert_eq!(got["model.diffusion_model.input_blocks.0.0.weight"], vec![320, 9, 3, 3]);
    let differing: Vec<_> = got.iter().filter(|(k, v)| base.get(*k) != Some(v)).map(|(k, _)| k).collect();
    assert_eq!(differing, vec!["model.diffusion_model.input_blocks.0.0.weight"]);
}

#[test]
fn invalid_configs_are_rejected_with_the_reason() {
    let mut cfg = SdConfig::tiny_sd1();
    cfg.unet.model_channels = 40;
    let err = cfg.tensors().unwrap_err().to_string();
    assert!(err.contains("unet") && err.contains("32"), "{err}");

    let mut cfg = SdConfig::tiny_sd2();
    cfg.unet.heads = Heads::HeadDim(24);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("HeadDim(24)"), "{err}");

    let mut cfg = SdConfig::tiny_sd1();
    cfg.text.heads = 3;
    assert!(cfg.validate().unwrap_err().to_string().contains("text"));

    let mut cfg = SdConfig::tiny_sd1();
    cfg.vae.ch_mult.clear();
    assert!(cfg.validate().unwrap_err().to_string().contains("vae"));
}

fn decode(dtype: safetensors::Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        safetensors::Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        safetensors::Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        safetensors::Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => panic!("unexpected dtype {other:?}"),
    }
}

#[test]
fn tiny_checkpoints_write_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    for (cfg, dtype, st) in [
        (SdConfig::tiny_sd1(), DType::F32, safetensors::Dtype::F32),
        (SdConfig::tiny_sd2(), DType::F16, safetensors::Dtype::F16),
        (SdConfig::tiny_sd1(), DType::BF16, safetensors::Dtype::BF16),
    ] {
        let path = dir.path().join(format!("{:?}-{dtype}.safetensors", cfg.version));
        let w = write_checkpoint(&path, &cfg, dtype, 7, Format::Safetensors).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(w.bytes, bytes.len() as u64);
        assert!(!dir.path().join(format!("{:?}-{dtype}.safetensors.partial", cfg.version)).exists());
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let m = meta.metadata().as_ref().unwrap();
        assert_eq!(m["sdflow.synth.seed"], "7");
        let stored: SdConfig = serde_json::from_str(&m["sdflow.synth.config"]).unwrap();
        assert_eq!(stored, cfg);

        let st_file = SafeTensors::deserialize(&bytes).unwrap();
        let specs = cfg.tensors().unwrap();
        assert_eq!(st_file.len(), specs.len());
        assert_eq!(w.tensors, specs.len());
        for spec in &specs {
            let t = st_file.tensor(&spec.name).unwrap();
            assert_eq!(t.shape(), spec.shape.as_slice(), "{}", spec.name);
            assert_eq!(t.dtype(), st, "{}", spec.name);
            let vals = decode(t.dtype(), t.data());
            assert!(vals.iter().all(|v| v.is_finite()), "{}", spec.name);
            let want = spec.values(7);
            for (a, b) in vals.iter().zip(&want) {
                let tol = if dtype == DType::F32 { 0.0 } else { 1e-2 * b.abs().max(1e-3) };
                assert!((a - b).abs() <= tol, "{}: {a} vs {b}", spec.name);
            }
        }
        if cfg.version == SdVersion::Sd2 {
            let t = st_file.tensor("cond_stage_model.model.logit_scale").unwrap();
            assert!(t.shape().is_empty());
            assert!((decode(t.dtype(), t.data())[0] - 2.6593).abs() < 1e-2);
        }
    }
}

#[test]
fn values_are_deterministic_per_seed_and_scaled() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SdConfig::tiny_sd1();
    let a = dir.path().join("a.safetensors");
    let b = dir.path().join("b.safetensors");
    let c = dir.path().join("c.safetensors");
    write_checkpoint(&a, &cfg, DType::F16, 1, Format::Safetensors).unwrap();
    write_checkpoint(&b, &cfg, DType::F16, 1, Format::Safetensors).unwrap();
    write_checkpoint(&c, &cfg, DType::F16, 2, Format::Safetensors).unwrap();
    let (a, b, c) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
    assert_eq!(a, b, "same seed, same bytes");
    assert_eq!(a.len(), c.len());
    assert_ne!(a, c, "another seed, other values");

    // A tensor's values do not depend on which other tensors the checkpoint holds.
    let specs = cfg.tensors().unwrap();
    let mut bigger = cfg.clone();
    bigger.text.layers = 3;
    let other = bigger.tensors().unwrap();
    let name = "model.diffusion_model.input_blocks.1.0.in_layers.2.weight";
    let s1 = specs.iter().find(|s| s.name == name).unwrap();
    let s2 = other.iter().find(|s| s.name == name).unwrap();
    assert_eq!(s1.values(5), s2.values(5));

    // LeCun-scaled: a 3x3 conv from 32 channels has std ~ 1/sqrt(288).
    let v = s1.values(5);
    let mean = v.iter().sum::<f32>() / v.len() as f32;
    let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / v.len() as f32).sqrt();
    let want = 1.0 / (288f32).sqrt();
    assert!((std - want).abs() < 0.1 * want, "std {std} vs {want}");
    let norm = specs.iter().find(|s| s.name == "model.diffusion_model.out.0.weight").unwrap().values(5);
    assert!(norm.iter().all(|x| (x - 1.0).abs() < 0.2), "norm weights stay near 1");
}

#[test]
fn unsupported_dtypes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.safetensors");
    let err = write_checkpoint(&path, &SdConfig::tiny_sd1(), DType::Q4_0, 0, Format::Safetensors).unwrap_err();
    assert!(matches!(err, SynthError::UnsupportedDType(DType::Q4_0)), "{err}");
    assert!(!path.exists());
}

#[test]
fn unwritable_paths_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/x.safetensors");
    let err = write_checkpoint(&path, &SdConfig::tiny_sd1(), DType::F16, 0, Format::Safetensors).unwrap_err();
    assert!(err.to_string().contains("no/such/dir"), "{err}");
}

#[test]
fn gguf_checkpoints_follow_the_type_rules_and_read_back() {
    use sdflow_core::io;
    let dir = tempfile::tempdir().unwrap();
    let cfg = SdConfig::tiny_sd2();
    let specs = cfg.tensors().unwrap();
    for dtype in [DType::F16, DType::Q8_0] {
        let path = dir.path().join(format!("tiny-{dtype}.gguf"));
        let w = write_checkpoint(&path, &cfg, dtype, 11, Format::Gguf).unwrap();
        assert_eq!(w.tensors, specs.len());
        let src = io::open(&path).unwrap();
        assert_eq!(src.tensors().len(), specs.len());
        assert_eq!(src.metadata()["sdflow.synth.seed"], "11");
        let mut converted = 0;
        for s in &specs {
            let t = src.get(&s.name).unwrap_or_else(|| panic!("{} missing", s.name));
            assert_eq!(t.shape, s.shape, "{}", s.name);
            let keeps_f32 = s.name.ends_with(".bias") || s.name.contains("embedding");
            if keeps_f32 {
                assert_eq!(t.dtype, DType::F32, "{}", s.name);
            }
            if t.dtype == dtype {
                converted += 1;
            }
            let bytes = src.read(&s.name).unwrap();
            let got = sdflow_core::dtype::to_f32(t.dtype, &bytes, s.n_elements()).unwrap();
            let want = s.values(11);
            let tol = match t.dtype {
                DType::F32 => 0.0,
                DType::F16 => 2e-3,
                _ => 0.05,
            };
            let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= tol * max.max(1.0), "{}: {a} vs {b}", s.name);
            }
        }
        assert!(converted > specs.len() / 4, "{dtype}: only {converted} tensors converted");
        if dtype == DType::Q8_0 {
            // Linear layers with 32-wide rows quantize; 3x3 convs (rows of 3) cannot.
            let q = src.get("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight").unwrap();
            assert_eq!(q.dtype, DType::Q8_0);
            let conv = src.get("model.diffusion_model.input_blocks.0.0.weight").unwrap();
            assert_eq!(conv.dtype, DType::F32);
        }
    }
}

#[test]
fn ensure_checkpoint_reuses_only_a_matching_file() {
    use sdflow_core::synth::ensure_checkpoint;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.safetensors");
    let cfg = SdConfig::tiny_sd1();
    assert!(ensure_checkpoint(&path, &cfg, DType::F16, 1, Format::Safetensors).unwrap());
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert!(!ensure_checkpoint(&path, &cfg, DType::F16, 1, Format::Safetensors).unwrap());
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), modified);
    // Another seed, dtype or config, or a damaged file, is rewritten.
    assert!(ensure_checkpoint(&path, &cfg, DType::F16, 2, Format::Safetensors).unwrap());
    assert!(ensure_checkpoint(&path, &cfg, DType::F32, 2, Format::Safetensors).unwrap());
    assert!(ensure_checkpoint(&path, &SdConfig::tiny_sd2(), DType::F32, 2, Format::Safetensors).unwrap());
    std::fs::write(&path, b"garbage").unwrap();
    assert!(ensure_checkpoint(&path, &SdConfig::tiny_sd2(), DType::F32, 2, Format::Safetensors).unwrap());
    assert!(!ensure_checkpoint(&path, &SdConfig::tiny_sd2(), DType::F32, 2, Format::Safetensors).unwrap());
    let gguf = dir.path().join("cache.gguf");
    assert!(ensure_checkpoint(&gguf, &cfg, DType::Q8_0, 1, Format::Gguf).unwrap());
    assert!(!ensure_checkpoint(&gguf, &cfg, DType::Q8_0, 1, Format::Gguf).unwrap());
}
