//! `HostWeights` through the residency manager, on synthetic checkpoints read by `crate::io`.

use std::path::{Path, PathBuf};

use half::f16;
use sdflow_core::dtype::DType;
use sdflow_core::io::{self, OpenOptions};
use sdflow_core::residency::{Device, HostWeightsError, ResidencyError, ResidencyManager};
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};

const UNET: &str = "model.diffusion_model.";
const VAE: &str = "first_stage_model.";

fn tiny(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let path = dir.join(name);
    write_checkpoint(&path, &SdConfig::tiny_sd1(), DType::F16, seed, Format::Safetensors).unwrap();
    path
}

fn unet_specs() -> Vec<sdflow_core::synth::TensorSpec> {
    SdConfig::tiny_sd1().tensors().unwrap().into_iter().filter(|s| s.name.starts_with(UNET)).collect()
}

#[test]
fn synthetic_checkpoints_open_with_the_io_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "t.safetensors", 3);
    let src = io::open(&path).unwrap();
    let specs = SdConfig::tiny_sd1().tensors().unwrap();
    assert_eq!(src.tensors().len(), specs.len());
    for s in &specs {
        let t = src.get(&s.name).unwrap_or_else(|| panic!("{} missing", s.name));
        assert_eq!((t.dtype, &t.shape), (DType::F16, &s.shape), "{}", s.name);
    }
    assert_eq!(src.metadata()["sdflow.synth.seed"], "3");
}

#[test]
fn mmap_weights_are_borrowed_and_counted_as_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "t.safetensors", 1);
    let m = ResidencyManager::new();
    let h = m.request_host_weights(&[&path], UNET, None, OpenOptions { mmap: true }).unwrap();
    assert!(!h.is_resident());
    let w = h.pin().unwrap();
    let specs = unet_specs();
    assert_eq!(w.len(), specs.len());
    let mut total = 0u64;
    for s in &specs {
        let rel = &s.name[UNET.len()..];
        let t = w.get(rel).unwrap();
        assert!(t.mapped, "{rel}");
        assert_eq!(t.name, rel);
        assert_eq!(t.info.name, s.name);
        assert_eq!(t.info.shape, s.shape);
        assert_eq!(t.bytes.len(), s.n_elements() * 2);
        let first = f16::from_le_bytes([t.bytes[0], t.bytes[1]]).to_f32();
        assert_eq!(first, f16::from_f32(s.values(1)[0]).to_f32(), "{rel}");
        total += t.bytes.len() as u64;
    }
    let st = m.stats();
    let model = st.model(h.key()).unwrap();
    assert_eq!((model.mapped_bytes, model.anonymous_bytes), (total, 0));
    assert_eq!(model.name, "t.safetensors:model.diffusion_model");
    assert_eq!(st.device(Device::Cpu).unwrap().mapped_bytes, total);
    assert!(matches!(w.get("no.such.weight"), Err(HostWeightsError::NotFound { .. })));
}

#[test]
fn without_mmap_weights_are_copies_and_match_the_mapped_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "t.safetensors", 1);
    let m = ResidencyManager::new();
    let mapped = m.request_host_weights(&[&path], VAE, None, OpenOptions { mmap: true }).unwrap();
    let other = tempfile::tempdir().unwrap();
    let copy = other.path().join("copy.safetensors");
    std::fs::copy(&path, &copy).unwrap();
    let read = m.request_host_weights(&[&copy], VAE, None, OpenOptions { mmap: false }).unwrap();
    let (a, b) = (mapped.pin().unwrap(), read.pin().unwrap());
    assert_eq!(a.len(), b.len());
    let mut total = 0;
    for (x, y) in a.iter().zip(b.iter()) {
        let (x, y) = (x.unwrap(), y.unwrap());
        assert!(x.mapped && !y.mapped);
        assert_eq!((x.name, x.bytes), (y.name, y.bytes));
        total += y.bytes.len() as u64;
    }
    let s = m.stats();
    let r = s.model(read.key()).unwrap();
    assert_eq!((r.anonymous_bytes, r.mapped_bytes), (total, 0));
    let d = s.device(Device::Cpu).unwrap();
    assert_eq!((d.anonymous_bytes, d.mapped_bytes), (total, total));

    // The whole file as one entry without mmap: every tensor, all anonymous memory.
    let whole = m.request_host_weights(&[&copy], "", None, OpenOptions { mmap: false }).unwrap();
    let w = whole.pin().unwrap();
    let specs = SdConfig::tiny_sd1().tensors().unwrap();
    assert_eq!(w.len(), specs.len());
    let bytes: u64 = specs.iter().map(|s| s.n_elements() as u64 * 2).sum();
    let e = m.stats().model(whole.key()).unwrap().clone();
    assert_eq!((e.anonymous_bytes, e.mapped_bytes), (bytes, 0));
    assert!(w.iter().all(|t| !t.unwrap().mapped));
    assert_eq!(w.get(&format!("{VAE}encoder.conv_in.weight")).unwrap().bytes, a.get("encoder.conv_in.weight").unwrap().bytes);
}

#[test]
fn dtype_conversion_follows_the_type_rules_and_is_anonymous() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "t.safetensors", 1);
    let m = ResidencyManager::new();
    let h = m.request_host_weights(&[&path], UNET, Some(DType::F32), OpenOptions::default()).unwrap();
    let plain = m.request_host_weights(&[&path], UNET, None, OpenOptions::default()).unwrap();
    assert!(!h.same_entry(&plain), "another dtype is another entry");
    let w = h.pin().unwrap();
    let conv = w.get("input_blocks.0.0.weight").unwrap();
    assert_eq!(conv.info.dtype, DType::F32);
    assert!(!conv.mapped);
    let spec = unet_specs().into_iter().find(|s| s.name.ends_with("input_blocks.0.0.weight")).unwrap();
    let got: Vec<f32> = conv.bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let want: Vec<f32> = spec.values(1).iter().map(|v| f16::from_f32(*v).to_f32()).collect();
    assert_eq!(got, want, "f16 -> f32 is exact");
    // sd.cpp's rules keep biases in their stored type, so they stay borrowed.
    let bias = w.get("input_blocks.0.0.bias").unwrap();
    assert_eq!(bias.info.dtype, DType::F16);
    assert!(bias.mapped);
    let s = m.stats();
    let e = s.model(h.key()).unwrap();
    assert!(e.anonymous_bytes > 0 && e.mapped_bytes > 0);
}

#[test]
fn identical_host_requests_share_and_budgets_use_the_header_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "t.safetensors", 1);
    let m = ResidencyManager::new();
    let a = m.request_host_weights(&[&path], VAE, None, OpenOptions::default()).unwrap();
    let b = m.request_host_weights(&[dir.path().join("./t.safetensors")], VAE, None, OpenOptions::default()).unwrap();
    assert!(a.same_entry(&b));
    let (ga, gb) = (a.pin().unwrap(), b.pin().unwrap());
    assert!(sdflow_core::residency::PinGuard::ptr_eq(&ga, &gb));
    let vae_bytes = m.stats().model(a.key()).unwrap().bytes;
    assert_eq!((m.stats().loads, m.stats().hits), (1, 1));

    // The UNet is bigger than what is left: refused from the header sizes, before reading.
    m.set_budget(Device::Cpu, Some(vae_bytes + 1000));
    let unet = m.request_host_weights(&[&path], UNET, None, OpenOptions::default()).unwrap();
    match unet.pin() {
        Err(ResidencyError::OverBudget { needed, pinned, .. }) => {
            let want: usize = unet_specs().iter().map(|s| s.n_elements() * 2).sum();
            assert_eq!(needed, want as u64);
            assert_eq!(pinned, vae_bytes);
        }
        other => panic!("expected OverBudget, got {:?}", other.map(|w| w.len())),
    }
    assert_eq!(m.stats().loads, 1);
    drop((ga, gb));
    m.set_budget(Device::Cpu, None);
    assert_eq!(unet.pin().unwrap().len(), unet_specs().len());
}

#[test]
fn bad_sources_and_prefixes_fail_with_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path(), "t.safetensors", 1);
    let m = ResidencyManager::new();

    let h = m.request_host_weights(&[&path], "no_such_model.", None, OpenOptions::default()).unwrap();
    let err = h.pin().err().unwrap().to_string();
    assert!(err.contains("no_such_model.") && err.contains("t.safetensors"), "{err}");

    let other = tiny(dir.path(), "u.safetensors", 2);
    let h = m.request_host_weights(&[&path, &other], VAE, None, OpenOptions::default()).unwrap();
    let err = h.pin().err().unwrap().to_string();
    assert!(err.contains("t.safetensors") && err.contains("u.safetensors") && err.contains(VAE), "{err}");

    let broken = dir.path().join("broken.safetensors");
    std::fs::write(&broken, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all").unwrap();
    let h = m.request_host_weights(&[&broken], "", None, OpenOptions::default()).unwrap();
    let err = h.pin().err().unwrap().to_string();
    assert!(err.contains("broken.safetensors"), "{err}");
    assert_eq!(m.stats().loads, 0);
}
