//! LoRA / LyCORIS merging against ComfyUI's formulas, computed in PyTorch by
//! fixtures/lora/make_lora.py: every format (kohya LoRA with alpha, LoCon with and without
//! Tucker mid, LoHa, LoKr, full diff/diff_b, diffusers/PEFT names, OpenCLIP's fused q/k/v),
//! in safetensors, pickle and GGUF files; broken files never panic. At runtime (LoRA and
//! LoCon as graph branches) every patched layer computes what it computes merged.

mod common;

use common::vals;
use std::path::{Path, PathBuf};

use sdflow_core::dtype::{self, DType};
use sdflow_core::ggml::{Context, GraphRun};
use sdflow_core::io::{self, gguf, TypeRules};
use sdflow_core::lora::{self, ApplyMode, LoraFile, Side};
use sdflow_core::models::load::load_weights;
use sdflow_core::models::{nn, WeightSpec, Weights};
use sdflow_core::residency::{Device, PinGuard, ResidencyManager, WeightKey};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora").join(name)
}

fn pinned_base(rm: &ResidencyManager, file: &str) -> PinGuard<Weights> {
    let path = fixture(file);
    let key = WeightKey::new([&path], "", None, Device::Cpu).unwrap();
    let h = rm
        .get_or_load(key, move || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
            let src = io::open(&path)?;
            Ok(load_weights(&common::backend(1), src.as_ref(), &[""], &TypeRules::new(None, "")?)?)
        })
        .unwrap();
    h.pin().unwrap()
}

fn values(w: &Weights, name: &str) -> (DType, Vec<f32>) {
    let t = w.get(name).unwrap();
    let ty = DType::from_ggml(t.dtype().0).unwrap();
    (ty, dtype::to_f32(ty, &t.get_bytes().unwrap(), t.n_elements() as usize).unwrap())
}

fn expected(file: &str) -> Vec<(String, DType, Vec<f32>)> {
    let src = io::open(&fixture(file)).unwrap();
    src.tensors()
        .iter()
        .map(|t| {
            let b = src.read(&t.name).unwrap();
            (t.name.clone(), t.dtype, dtype::to_f32(t.dtype, &b, t.n_elements()).unwrap())
        })
        .collect()
}

fn side_of(name: &str) -> Side {
    if name.starts_with("model.diffusion_model.") {
        Side::DiffusionModel
    } else {
        Side::TextEncoder
    }
}

/// Merges `lora_path` into the case's base on both sides and checks every expected weight
/// (f32 within 1e-5; f16 within one rounding step), and that every other weight is the
/// base's own tensor, shared.
fn check_case(case: &str, lora_path: &Path, base_file: &str, strength: f32) {
    let rm = ResidencyManager::new();
    let base = pinned_base(&rm, base_file);
    let file = LoraFile::open(lora_path).unwrap_or_else(|e| panic!("{case}: {e}"));
    let want = expected(&format!("{case}_expected.safetensors"));
    let mut touched = std::collections::BTreeSet::new();
    for side in [Side::DiffusionModel, Side::TextEncoder] {
        let (merged, report) = lora::merge(base.clone(), &file, side, strength).unwrap();
        assert!(report.skipped.is_empty(), "{case} {side:?}: {:?}", report.skipped);
        for (name, ty, exp) in want.iter().filter(|w| side_of(&w.0) == side) {
            let (got_ty, got) = values(&merged, name);
            assert_eq!(got_ty, *ty, "{case}: {name} keeps its type");
            let (_, orig) = values(&base, name);
            assert!(orig.iter().zip(&got).any(|(a, b)| a != b), "{case}: {name} was patched");
            let tol = |e: f32| if *ty == DType::F16 { 1e-3 * e.abs().max(1.0) } else { 1e-5 };
            let worst = got.iter().zip(exp).map(|(g, e)| ((g - e).abs() - tol(*e), (g - e).abs())).fold((f32::MIN, 0f32), |a, b| if b.0 > a.0 { b } else { a });
            assert!(worst.0 <= 0.0, "{case}: {name} differs by {} from ComfyUI's merge", worst.1);
            assert!(merged.owns(name), "{case}: the overlay owns {name}");
            touched.insert(name.clone());
        }
        for name in base.names() {
            if !want.iter().any(|w| w.0 == name && side_of(name) == side) {
                assert!(!merged.owns(name), "{case}: {name} is shared with the base, not copied");
            }
        }
        assert!(merged.bytes() < base.bytes(), "{case}: the overlay holds only patched tensors");
    }
    assert_eq!(touched.len(), want.len(), "{case}: every expected weight was checked");
}

fn cases() -> Vec<(String, String, f32)> {
    let idx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("cases.json")).unwrap()).unwrap();
    idx.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["base"].as_str().unwrap().to_string(), v["strength"].as_f64().unwrap() as f32))
        .collect()
}

#[test]
fn every_format_matches_comfyui() {
    let all = cases();
    assert_eq!(all.len(), 7);
    for (case, base, strength) in all {
        check_case(&case, &fixture(&format!("{case}.safetensors")), &base, strength);
    }
}

#[test]
fn pickle_and_gguf_files_merge_the_same() {
    check_case("kohya", &fixture("kohya.ckpt"), "base.safetensors", 0.8);
    // The same file as GGUF, the way `sd -M convert` stores a LoRA (f16 matrices).
    let dir = tempfile::tempdir().unwrap();
    let src = io::open(&fixture("kohya.safetensors")).unwrap();
    let mut data = Vec::new();
    for t in src.tensors() {
        let b = src.read(&t.name).unwrap().into_owned();
        let shape = if t.shape.is_empty() { vec![1] } else { t.shape.clone() };
        data.push((t.name.clone(), t.dtype, shape, b));
    }
    let path = dir.path().join("kohya.gguf");
    gguf::write(&path, &[], data.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice()))).unwrap();
    check_case("kohya", &path, "base.safetensors", 0.8);
}

#[test]
fn strength_scales_the_difference() {
    let rm = ResidencyManager::new();
    let base = pinned_base(&rm, "base.safetensors");
    let file = LoraFile::open(&fixture("loha.safetensors")).unwrap();
    let name = "model.diffusion_model.input_blocks.1.0.in_layers.2.weight";
    let (_, orig) = values(&base, name);
    let (zero, _) = lora::merge(base.clone(), &file, Side::DiffusionModel, 0.0).unwrap();
    assert_eq!(values(&zero, name).1, orig, "strength 0 leaves the weight as it was");
    let (one, _) = lora::merge(base.clone(), &file, Side::DiffusionModel, 1.0).unwrap();
    let (neg, _) = lora::merge(base.clone(), &file, Side::DiffusionModel, -2.0).unwrap();
    let (a, b) = (values(&one, name).1, values(&neg, name).1);
    for ((o, p), n) in orig.iter().zip(&a).zip(&b) {
        assert!(((n - o) + 2.0 * (p - o)).abs() < 1e-5, "Δ(-2) = -2·Δ(1)");
    }
}

#[test]
fn broken_modules_are_skipped_with_one_warning_each() {
    let rm = ResidencyManager::new();
    let base = pinned_base(&rm, "base.safetensors");
    let file = LoraFile::open(&fixture("malformed.safetensors")).unwrap();
    let (merged, report) = lora::merge(base.clone(), &file, Side::DiffusionModel, 1.0).unwrap();
    assert_eq!(report.applied, 1, "{report:?}");
    assert_eq!(report.skipped.len(), 6, "{:#?}", report.skipped);
    let has = |module: &str, why: &str| {
        assert!(report.skipped.iter().any(|s| s.starts_with(module) && s.contains(why)), "{module}: {why} in {:#?}", report.skipped);
    };
    has("lora_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q", "lacks `hada_w2_b`");
    has("lora_unet_input_blocks_1_1_proj_in", "values) but `model.diffusion_model.input_blocks.1.1.proj_in.weight` is [32, 32, 1, 1]");
    has("lora_unet_no_such_block", "no weight of this model");
    has("lora_unet_input_blocks_1_0_in_layers_2", "does not fit");
    has("lora_unet_time_embed_0", "`dora_scale` patches are not supported");
    has("lora_unet_output_blocks_1_1_conv", "larger than the weight");
    for (name, _, exp) in expected("malformed_expected.safetensors") {
        let got = values(&merged, &name).1;
        assert!(got.iter().zip(&exp).all(|(g, e)| (g - e).abs() <= 1e-5), "{name}: the good module is still merged");
    }
    // The text-encoder side sees none of these (they are all UNet modules).
    let (_, te) = lora::merge(base, &file, Side::TextEncoder, 1.0).unwrap();
    assert!(te.skipped.is_empty() && te.applied == 0, "{te:?}");
}

#[test]
fn unreadable_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all, just bytes").unwrap();
    let e = LoraFile::open(&garbage).unwrap_err().to_string();
    assert!(e.contains("garbage.safetensors"), "{e}");
    // A valid file with no LoRA tensors (e.g. a checkpoint picked by mistake).
    let e = LoraFile::open(&fixture("base.safetensors")).unwrap_err().to_string();
    assert!(e.contains("base.safetensors") && e.contains("no LoRA tensors"), "{e}");
    let e = LoraFile::open(&dir.path().join("missing.safetensors")).unwrap_err().to_string();
    assert!(e.contains("missing.safetensors"), "{e}");
}

/// Every module of a real diffusers UNet (2 res blocks per level, SD1's attention
/// pattern), named the kohya way and the PEFT way, maps to its LDM weight.
#[test]
fn diffusers_module_names_map_to_ldm_weights() {
    let names: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("unet_diffusers_names.json")).unwrap()).unwrap();
    let names = names.as_object().unwrap();
    let ldm: Vec<String> = names.values().map(|v| format!("{}.weight", v.as_str().unwrap())).collect();
    let km = lora::KeyMap::new(ldm.iter().map(|s| s.as_str()), |_| 0);
    assert!(names.len() > 200);
    for (diffusers, ldm) in names {
        let want = format!("{}.weight", ldm.as_str().unwrap());
        for key in [format!("lora_unet_{}", diffusers.replace('.', "_")), format!("unet.{diffusers}"), diffusers.clone()] {
            let got = km.get(&key).map(|t| t.weight.as_str());
            assert_eq!(got, Some(want.as_str()), "{key}");
        }
        // The LDM spelling of kohya's trainer.
        let k = format!("lora_unet_{}", ldm.as_str().unwrap().trim_start_matches("model.diffusion_model.").replace('.', "_"));
        assert_eq!(km.get(&k).map(|t| t.weight.as_str()), Some(want.as_str()), "{k}");
    }
}

/// Tensors no patch format names (training leftovers, typos) are skipped, each with its
/// own warning on the side its name points at, and counted in the merge's summary; the
/// rest of the file merges as without them.
#[test]
fn unrecognised_tensors_are_warned_about_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let src = io::open(&fixture("kohya.safetensors")).unwrap();
    let mut data: Vec<(String, DType, Vec<usize>, Vec<u8>)> = src.tensors().iter().map(|t| (t.name.clone(), t.dtype, t.shape.clone(), src.read(&t.name).unwrap().into_owned())).collect();
    let strays = ["lora_unet_input_blocks_1_1_proj_in.lora_upp.weight", "training_step", "lora_te_text_model_encoder_layers_0_mlp_fc1.scale"];
    for s in strays {
        data.push((s.to_string(), DType::F32, vec![2], [1f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    let path = dir.path().join("with_strays.safetensors");
    io::safetensors::write(&path, data.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.as_slice())), &Default::default()).unwrap();
    check_case("kohya", &path, "base.safetensors", 0.8);

    let file = LoraFile::open(&path).unwrap();
    let rm = ResidencyManager::new();
    let base = pinned_base(&rm, "base.safetensors");
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || Sink(sink.clone())).finish();
    let (unet, te) = tracing::subscriber::with_default(subscriber, || {
        let (_, unet) = lora::merge(base.clone(), &file, Side::DiffusionModel, 0.8).unwrap();
        let (_, te) = lora::merge(base.clone(), &file, Side::TextEncoder, 0.8).unwrap();
        (unet, te)
    });
    let mut unet_unknown = unet.unknown.clone();
    unet_unknown.sort();
    assert_eq!(unet_unknown, ["lora_unet_input_blocks_1_1_proj_in.lora_upp.weight", "training_step"]);
    assert_eq!(te.unknown, ["lora_te_text_model_encoder_layers_0_mlp_fc1.scale"]);
    let log = String::from_utf8(log.lock().unwrap().clone()).unwrap();
    for s in strays {
        assert_eq!(log.lines().filter(|l| l.contains(&format!("tensor `{s}` has no LoRA/LyCORIS name; skipped"))).count(), 1, "one warning for {s}:\n{log}");
    }
    assert!(log.contains("0 of ") && log.contains("modules skipped, and 2 tensors with unrecognised names"), "{log}");
    assert!(log.contains("modules skipped, and 1 tensors with unrecognised names"), "{log}");
}

/// A `tracing` writer into a shared buffer.
struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The layer that uses weight `name` (`nn::conv2d` for a kernel, stride `stride` and
/// "same" padding; `nn::project` for a matrix) on a fixed input.
fn layer(w: &Weights, name: &str, stride: i32) -> Vec<f32> {
    let ne = w.get(name).unwrap().ne();
    let ctx = Context::new(64, 64).unwrap();
    let mut run = GraphRun::new(&ctx);
    let y = if ne[2] != 1 || ne[3] != 1 {
        let x = run.input_f32(&[7, 6, ne[2], 2], vals((7 * 6 * 2 * ne[2]) as usize, 3)).unwrap();
        nn::conv2d(&ctx, w, name.strip_suffix(".weight").unwrap(), x, stride, (ne[0] / 2) as i32).unwrap()
    } else {
        let x = run.input_f32(&[ne[0], 5, 2], vals((ne[0] * 10) as usize, 4)).unwrap();
        nn::project(&ctx, w, name, x).unwrap()
    };
    run.compute(&common::backend(1), &[y], 64).unwrap().remove(0)
}

/// Largest |a - b| relative to the largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn at_runtime_gives_the_layers_of_the_merge() {
    for (case, base_file, strength) in cases() {
        let rm = ResidencyManager::new();
        let base = pinned_base(&rm, &base_file);
        let file = LoraFile::open(&fixture(&format!("{case}.safetensors"))).unwrap();
        let want = expected(&format!("{case}_expected.safetensors"));
        for side in [Side::DiffusionModel, Side::TextEncoder] {
            let (merged, _) = lora::merge(base.clone(), &file, side, strength).unwrap();
            let (runtime, report) = lora::apply(base.clone(), &file, side, strength, ApplyMode::AtRuntime).unwrap();
            assert_eq!(report.mode, ApplyMode::AtRuntime);
            assert!(report.skipped.is_empty(), "{case} {side:?}: {:?}", report.skipped);
            for (name, ty, _) in want.iter().filter(|w| side_of(&w.0) == side && !w.0.ends_with(".bias")) {
                let low_rank = !["loha", "lokr", "diff"].contains(&case.as_str());
                // LoRA and LoCon stay out of the weights; the others have no branch form.
                assert_eq!(runtime.owns(name), !low_rank, "{case}: {name}");
                assert_eq!(runtime.adapters(name).is_empty(), !low_rank, "{case}: {name}");
                // f16 weights: the merge rounds the patched weight to f16, the branch does not.
                let tol = if *ty == DType::F16 { 2e-3 } else { 2e-5 };
                for stride in [1, 2] {
                    let d = rel_diff(&layer(&runtime, name, stride), &layer(&merged, name, stride));
                    assert!(d <= tol, "{case}: {name} (stride {stride}): the runtime branch is off the merge by {d}");
                    if ne_is_matrix(&base, name) {
                        break;
                    }
                }
            }
            if matches!(case.as_str(), "kohya" | "peft" | "openclip") && report.applied > 0 {
                assert_eq!(report.at_runtime, report.applied, "{case} {side:?}: every module is a branch");
                assert_eq!(report.patched_weights, 0, "{case} {side:?}: no weight copied");
                assert!(runtime.bytes() < merged.bytes(), "{case} {side:?}: factors ({}) < merged weights ({})", runtime.bytes(), merged.bytes());
            }
        }
    }
}

fn ne_is_matrix(w: &Weights, name: &str) -> bool {
    let ne = w.get(name).unwrap().ne();
    ne[2] == 1 && ne[3] == 1
}

#[test]
fn a_chain_at_runtime_adds_every_branch() {
    let rm = ResidencyManager::new();
    let base = pinned_base(&rm, "base.safetensors");
    let file = LoraFile::open(&fixture("kohya.safetensors")).unwrap();
    let name = "model.diffusion_model.output_blocks.1.1.conv.weight";
    // Twice at 0.4 at runtime = once at 0.8 merged.
    let (merged, _) = lora::merge(base.clone(), &file, Side::DiffusionModel, 0.8).unwrap();
    let key = WeightKey::new([fixture("kohya.safetensors")], "once", None, Device::Cpu).unwrap();
    let b = base.clone();
    let once = rm
        .get_or_load(key, move || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
            let file = LoraFile::open(&fixture("kohya.safetensors"))?;
            Ok(lora::apply(b.clone(), &file, Side::DiffusionModel, 0.4, ApplyMode::AtRuntime)?.0)
        })
        .unwrap()
        .pin()
        .unwrap();
    let (twice, _) = lora::apply(once, &file, Side::DiffusionModel, 0.4, ApplyMode::AtRuntime).unwrap();
    assert_eq!(twice.adapters(name).len(), 2);
    let d = rel_diff(&layer(&twice, name, 1), &layer(&merged, name, 1));
    assert!(d <= 2e-5, "off by {d}");
}

#[test]
fn auto_keeps_quantized_weights_and_branches_beside_them() {
    let rm = ResidencyManager::new();
    let path = fixture("base.safetensors");
    let load = |ty: Option<DType>, prefix: &str| {
        let path = path.clone();
        let key = WeightKey::new([&path], prefix, ty, Device::Cpu).unwrap();
        rm.get_or_load(key, move || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
            let src = io::open(&path)?;
            Ok(load_weights(&common::backend(1), src.as_ref(), &[""], &TypeRules::new(ty, "")?)?)
        })
        .unwrap()
        .pin()
        .unwrap()
    };
    let q8 = load(Some(DType::Q8_0), "");
    let f32_base = load(None, "");
    assert_eq!(ApplyMode::Auto.resolve(&q8), ApplyMode::AtRuntime);
    assert_eq!(ApplyMode::Auto.resolve(&f32_base), ApplyMode::Immediately);
    let name = "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight";
    assert_eq!(q8.get(name).unwrap().dtype(), sdflow_core::ggml::GType::Q8_0, "the fixture's matrix is quantized");

    // The q8_0 weights, dequantized: what an exact merge would start from.
    let key = WeightKey::new([&path], "dequantized", None, Device::Cpu).unwrap();
    let q = q8.clone();
    let deq = rm
        .get_or_load(key, move || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
            let specs: Vec<WeightSpec> = q.names().map(|n| WeightSpec { name: n.to_string(), ty: sdflow_core::ggml::GType::F32, ne: q.get(n).unwrap().ne().to_vec() }).collect();
            Ok(Weights::new(&common::backend(1), &specs, |s| Ok(values(&q, &s.name).1.iter().flat_map(|x| x.to_le_bytes()).collect()))?)
        })
        .unwrap()
        .pin()
        .unwrap();

    let file = LoraFile::open(&fixture("kohya.safetensors")).unwrap();
    let (auto, report) = lora::apply(q8.clone(), &file, Side::DiffusionModel, 0.8, ApplyMode::Auto).unwrap();
    assert_eq!(report.mode, ApplyMode::AtRuntime);
    assert!(report.at_runtime > 0 && report.patched_weights == 0, "{report:?}");
    assert!(!auto.owns(name) && auto.adapters(name).len() == 1);
    assert!(auto.bytes() * 4 < q8.bytes(), "the branches ({} bytes) are a fraction of the weights ({})", auto.bytes(), q8.bytes());
    let (exact, _) = lora::merge(deq, &file, Side::DiffusionModel, 0.8).unwrap();
    let (plain, _) = lora::merge(q8.clone(), &file, Side::DiffusionModel, 0.0).unwrap();
    let (got, want, without) = (layer(&auto, name, 1), layer(&exact, name, 1), layer(&plain, name, 1));
    // ggml quantizes the activations for a q8_0 product: about 1 % off, far less than
    // what the LoRA changes.
    let d = rel_diff(&got, &want);
    assert!(d < 0.02, "q8_0 + branch is off the exact merge by {d}");
    assert!(rel_diff(&without, &want) > 5.0 * d, "the LoRA's effect ({}) stands out of the error ({d})", rel_diff(&without, &want));
}

#[test]
fn apply_modes_parse_by_sd_cpp_names() {
    for n in ApplyMode::NAMES {
        assert_eq!(n.parse::<ApplyMode>().unwrap().name(), n);
    }
    let e = "runtime".parse::<ApplyMode>().unwrap_err().to_string();
    assert!(e.contains("runtime") && e.contains("at_runtime"), "{e}");
}

#[test]
fn sdxl_loras_reach_the_unet_and_both_text_encoders() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("sdxl.safetensors");
    sdflow_core::synth::write_checkpoint(&ckpt, &sdflow_core::synth::SdConfig::tiny_sdxl(), DType::F32, 4, sdflow_core::synth::Format::Safetensors).unwrap();
    let lora_path = dir.path().join("xl_lora.safetensors");
    let src = io::open(&ckpt).unwrap();
    sdflow_core::lora::synth::write_random_lora(src.as_ref(), &lora_path, 2, 0.3, 7, sdflow_core::synth::Format::Safetensors).unwrap();
    let file = LoraFile::open(&lora_path).unwrap();
    let rm = ResidencyManager::new();
    for (prefix, side) in [
        ("model.diffusion_model.", Side::DiffusionModel),
        ("conditioner.embedders.0.", Side::TextEncoder),
        ("conditioner.embedders.1.", Side::TextEncoder2),
    ] {
        let key = WeightKey::new([&ckpt], prefix, None, Device::Cpu).unwrap();
        let (c, p) = (ckpt.clone(), prefix.to_string());
        let handle = rm
            .get_or_load(key, move || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
                let src = io::open(&c)?;
                Ok(load_weights(&common::backend(1), src.as_ref(), &[&p], &TypeRules::new(None, "")?)?)
            })
            .unwrap();
        let (merged, report) = lora::merge(handle.pin().unwrap(), &file, side, 1.0).unwrap();
        assert!(report.applied > 0, "{prefix}: {report:?}");
        assert!(report.skipped.is_empty() && report.unknown.is_empty(), "{prefix}: {report:#?}");
        // G's fc1 of layer 0 is patched under its OpenCLIP name.
        if side == Side::TextEncoder2 {
            let name = "conditioner.embedders.1.model.transformer.resblocks.0.mlp.c_fc.weight";
            let base = handle.pin().unwrap();
            assert_ne!(values(&merged, name).1, values(&base, name).1, "te2 patched G");
        }
    }
}

/// Every diffusers module of FLUX.1 and SD3.5 (MMDiT-X) — as diffusers' own single-file
/// converters place them, fused q/k/v split into thirds and FLUX's `linear1` into q, k, v
/// and the MLP — reaches the same checkpoint rows under the PEFT, SimpleTuner and bare
/// spellings, for bare files and under a checkpoint's `model.diffusion_model.`; kohya's
/// and ComfyUI's names reach whole weights.
#[test]
fn dit_module_names_map_to_checkpoint_rows() {
    let table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("dit_diffusers_names.json")).unwrap()).unwrap();
    for family in ["flux", "sd3"] {
        let t = &table[family];
        let keys: std::collections::BTreeMap<String, Vec<usize>> = serde_json::from_value(t["keys"].clone()).unwrap();
        let map = t["map"].as_object().unwrap();
        assert!(map.len() > 40, "{family}");
        for prefix in ["", "model.diffusion_model."] {
            let names: Vec<String> = keys.keys().map(|k| format!("{prefix}{k}")).collect();
            let km = lora::KeyMap::new(names.iter().map(|s| s.as_str()), |n| keys[n.strip_prefix(prefix).unwrap()][0]);
            for (module, target) in map {
                let want = lora::Target {
                    weight: format!("{prefix}{}", target[0].as_str().unwrap()),
                    rows: target[1].as_array().map(|r| (r[0].as_u64().unwrap() as usize, r[1].as_u64().unwrap() as usize)),
                };
                for key in [format!("transformer.{module}"), module.clone(), format!("lora_transformer_{}", module.replace('.', "_"))] {
                    assert_eq!(km.get(&key), Some(&want), "{family} {prefix}: {key}");
                }
            }
            for k in keys.keys().filter_map(|k| k.strip_suffix(".weight")) {
                let want = lora::Target { weight: format!("{prefix}{k}.weight"), rows: None };
                for key in [format!("lora_unet_{}", k.replace('.', "_")), format!("diffusion_model.{k}")] {
                    assert_eq!(km.get(&key), Some(&want), "{family} {prefix}: {key}");
                }
            }
        }
    }
}
