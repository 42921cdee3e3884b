//! The generic residency manager: sharing, laziness, budgets, LRU eviction, pinning,
//! single-flight loading and exact stats.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use sdflow_core::dtype::DType;
use sdflow_core::io::WeightType;
use sdflow_core::residency::{
    Device, Footprint, Load, ResidencyError, ResidencyManager, Resident, WeightHandle, WeightKey,
};

/// A payload of a given size; `tag` tells copies apart.
#[derive(Debug)]
struct Blob {
    tag: &'static str,
    anonymous: u64,
    mapped: u64,
}

impl Resident for Blob {
    fn footprint(&self) -> Footprint {
        Footprint { anonymous: self.anonymous, mapped: self.mapped }
    }
}

/// Counts how often it ran, so tests can tell a load from a hit.
struct Counting {
    tag: &'static str,
    bytes: u64,
    mapped: u64,
    runs: Arc<AtomicUsize>,
    delay: Duration,
    estimate: bool,
    fail: bool,
}

impl Counting {
    fn new(tag: &'static str, bytes: u64) -> (Self, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let l = Counting {
            tag,
            bytes,
            mapped: 0,
            runs: runs.clone(),
            delay: Duration::ZERO,
            estimate: false,
            fail: false,
        };
        (l, runs)
    }
}

impl Load for Counting {
    type Output = Blob;
    fn estimate(&self) -> Option<u64> {
        self.estimate.then_some(self.bytes + self.mapped)
    }
    fn load(&self) -> Result<Blob, sdflow_core::residency::BoxError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        if self.fail {
            return Err(format!("{}: disk on fire", self.tag).into());
        }
        Ok(Blob { tag: self.tag, anonymous: self.bytes, mapped: self.mapped })
    }
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for n in ["a.safetensors", "b.safetensors"] {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        Files { dir }
    }

    fn key(&self, file: &str, prefix: &str) -> WeightKey {
        WeightKey::new([self.dir.path().join(file)], prefix, None, Device::Cpu).unwrap()
    }
}

fn request(m: &ResidencyManager, key: WeightKey, tag: &'static str, bytes: u64) -> (WeightHandle<Blob>, Arc<AtomicUsize>) {
    let (l, runs) = Counting::new(tag, bytes);
    (m.get_or_load(key, l).unwrap(), runs)
}

#[test]
fn identical_requests_share_one_copy() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (h1, runs1) = request(&m, f.key("a.safetensors", "model.diffusion_model."), "first", 100);
    // Another spelling of the same file canonicalizes to the same key.
    let other_spelling = f.dir.path().join("sub/../a.safetensors");
    std::fs::create_dir(f.dir.path().join("sub")).unwrap();
    let k2 = WeightKey::new([other_spelling], "model.diffusion_model.", None, Device::Cpu).unwrap();
    let (h2, runs2) = request(&m, k2, "second", 100);
    assert!(h1.same_entry(&h2));

    let g1 = h1.pin().unwrap();
    let g2 = h2.pin().unwrap();
    assert!(sdflow_core::residency::PinGuard::ptr_eq(&g1, &g2));
    assert_eq!(g2.tag, "first", "the first loader wins; the second is never run");
    assert_eq!(runs1.load(Ordering::SeqCst), 1);
    assert_eq!(runs2.load(Ordering::SeqCst), 0);

    let s = m.stats();
    assert_eq!((s.requests, s.loads, s.hits, s.evictions), (2, 1, 1, 0));
    assert_eq!(s.models.len(), 1);
    assert_eq!(s.models[0].handles, 2);
    assert_eq!(s.models[0].pins, 2);
    assert_eq!(s.device(Device::Cpu).unwrap().bytes, 100);
}

#[test]
fn different_prefix_dtype_or_device_are_different_entries() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let base = f.key("a.safetensors", "model.diffusion_model.");
    let keys = [
        base.clone(),
        WeightKey { prefix: "first_stage_model.".into(), ..base.clone() },
        WeightKey { dtype: Some(DType::F16).into(), ..base.clone() },
        // Float-only bf16 and every-tensor bf16 differ on quantized files.
        WeightKey { dtype: WeightType::Floats(DType::BF16), ..base.clone() },
        WeightKey { dtype: WeightType::All(DType::BF16), ..base.clone() },
        WeightKey { device: Device::Gpu(0), ..base.clone() },
        f.key("b.safetensors", "model.diffusion_model."),
    ];
    let handles: Vec<_> = keys.iter().map(|k| request(&m, k.clone(), "x", 10)).collect();
    for (i, (a, _)) in handles.iter().enumerate() {
        for (b, _) in &handles[i + 1..] {
            assert!(!a.same_entry(b));
        }
    }
    let guards: Vec<_> = handles.iter().map(|(h, _)| h.pin().unwrap()).collect();
    for (_, runs) in &handles {
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
    let s = m.stats();
    assert_eq!(s.loads, 7);
    assert_eq!(s.device(Device::Cpu).unwrap().bytes, 60);
    assert_eq!(s.device(Device::Gpu(0)).unwrap().bytes, 10);
    drop(guards);
}

#[test]
fn a_request_alone_loads_nothing() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (h, runs) = request(&m, f.key("a.safetensors", ""), "x", 100);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(!h.is_resident());
    let s = m.stats();
    assert_eq!((s.requests, s.loads, s.hits), (1, 0, 0));
    assert_eq!(s.models[0].bytes, 0);
    assert!(!s.models[0].resident);
    drop(h.pin().unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(h.is_resident(), "stays cached after the pin is released");
}

#[test]
fn budget_evicts_least_recently_used_unpinned() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(300));
    let (a, _) = request(&m, f.key("a.safetensors", "a."), "a", 100);
    let (b, _) = request(&m, f.key("a.safetensors", "b."), "b", 100);
    let (c, _) = request(&m, f.key("a.safetensors", "c."), "c", 100);
    let (d, _) = request(&m, f.key("a.safetensors", "d."), "d", 100);
    for h in [&a, &b, &c] {
        drop(h.pin().unwrap());
    }
    // Touch `a` so that `b` is now the least recently used.
    drop(a.pin().unwrap());
    drop(d.pin().unwrap());
    assert!(!b.is_resident());
    assert!(a.is_resident() && c.is_resident() && d.is_resident());
    let s = m.stats();
    assert_eq!(s.evictions, 1);
    assert_eq!(s.device(Device::Cpu).unwrap().bytes, 300);
    assert_eq!(s.model(b.key()).unwrap().evictions, 1);

    // Next in LRU order is `c`.
    drop(b.pin().unwrap());
    assert!(!c.is_resident());
    assert!(a.is_resident() && b.is_resident() && d.is_resident());
}

#[test]
fn pinned_weights_are_never_evicted_and_all_pinned_is_an_error() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(200));
    let (a, _) = request(&m, f.key("a.safetensors", "a."), "a", 100);
    let (b, _) = request(&m, f.key("a.safetensors", "b."), "b", 100);
    let (c, _) = request(&m, f.key("a.safetensors", "c."), "c", 100);
    let (d, d_runs) = request(&m, f.key("a.safetensors", "d."), "d", 100);
    let ga = a.pin().unwrap();
    drop(b.pin().unwrap());
    // `a` is older than `b` but pinned, so `b` goes.
    let gc = c.pin().unwrap();
    assert!(a.is_resident() && !b.is_resident() && c.is_resident());

    match d.pin() {
        Err(ResidencyError::OverBudget { needed, budget, pinned, device, .. }) => {
            assert_eq!((needed, budget, pinned, device), (100, 200, 200, Device::Cpu));
        }
        other => panic!("expected OverBudget, got {:?}", other.map(|g| g.tag)),
    }
    assert_eq!(d_runs.load(Ordering::SeqCst), 1, "no estimate: it loaded, then did not fit");
    assert!(!d.is_resident());
    let s = m.stats();
    assert_eq!(s.load_failures, 1);
    assert_eq!(s.device(Device::Cpu).unwrap().bytes, 200);
    assert_eq!(s.device(Device::Cpu).unwrap().pinned_bytes, 200);

    // Unpinning makes room again.
    drop(ga);
    let gd = d.pin().unwrap();
    assert!(!a.is_resident());
    drop((gc, gd));
}

#[test]
fn a_payload_larger_than_the_budget_fails_before_loading_when_estimated() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(50));
    let (mut l, runs) = Counting::new("big", 100);
    l.estimate = true;
    let h = m.get_or_load(f.key("a.safetensors", ""), l).unwrap();
    let err = h.pin().err().expect("over budget");
    assert!(matches!(err, ResidencyError::OverBudget { needed: 100, budget: 50, .. }), "{err}");
    assert!(err.to_string().contains("a.safetensors"), "{err}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the estimate ruled it out before reading");
}

#[test]
fn estimate_evicts_before_the_load_runs() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(150));
    let (old, _) = request(&m, f.key("a.safetensors", "old."), "old", 100);
    drop(old.pin().unwrap());

    struct Checking {
        m: ResidencyManager,
        seen_bytes: Arc<AtomicUsize>,
    }
    impl Load for Checking {
        type Output = Blob;
        fn estimate(&self) -> Option<u64> {
            Some(100)
        }
        fn load(&self) -> Result<Blob, sdflow_core::residency::BoxError> {
            let b = self.m.stats().device(Device::Cpu).unwrap().bytes;
            self.seen_bytes.store(b as usize, Ordering::SeqCst);
            Ok(Blob { tag: "new", anonymous: 100, mapped: 0 })
        }
    }
    let seen = Arc::new(AtomicUsize::new(usize::MAX));
    let new = m
        .get_or_load(f.key("a.safetensors", "new."), Checking { m: m.clone(), seen_bytes: seen.clone() })
        .unwrap();
    drop(new.pin().unwrap());
    assert_eq!(seen.load(Ordering::SeqCst), 0, "old weights were gone before the new load started");
    assert!(!old.is_resident());
}

#[test]
fn evicted_weights_reload_on_next_pin() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(100));
    let (a, a_runs) = request(&m, f.key("a.safetensors", "a."), "a", 100);
    let (b, _) = request(&m, f.key("a.safetensors", "b."), "b", 100);
    drop(a.pin().unwrap());
    drop(b.pin().unwrap());
    assert!(!a.is_resident());
    let g = a.pin().unwrap();
    assert_eq!(g.tag, "a");
    assert_eq!(a_runs.load(Ordering::SeqCst), 2);
    let s = m.stats();
    let sa = s.model(a.key()).unwrap();
    assert_eq!((sa.loads, sa.evictions, sa.hits), (2, 1, 0));
    assert_eq!((s.loads, s.evictions, s.hits), (3, 2, 0));
}

#[test]
fn concurrent_pins_load_once() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (mut l, runs) = Counting::new("shared", 1000);
    l.delay = Duration::from_millis(100);
    let h = m.get_or_load(f.key("a.safetensors", ""), l).unwrap();
    let threads = 16;
    let barrier = Arc::new(Barrier::new(threads));
    let guards: Vec<_> = (0..threads)
        .map(|_| {
            let h = h.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                h.pin().unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for g in &guards[1..] {
        assert!(sdflow_core::residency::PinGuard::ptr_eq(&guards[0], g));
    }
    let s = m.stats();
    assert_eq!((s.loads, s.hits), (1, threads as u64 - 1));
    assert_eq!(s.models[0].pins, threads);
    assert_eq!(s.models[0].handles, 1, "the thread clones are gone");
}

#[test]
fn concurrent_requests_of_one_key_share_one_entry() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let key = f.key("a.safetensors", "");
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (m, key, runs, barrier) = (m.clone(), key.clone(), runs.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let l = Counting {
                    tag: "t",
                    bytes: 10,
                    mapped: 0,
                    runs,
                    delay: Duration::from_millis(20),
                    estimate: false,
                    fail: false,
                };
                let h = m.get_or_load(key, l).unwrap();
                let g = h.pin().unwrap();
                (h, g)
            })
        })
        .collect();
    let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(got.iter().all(|(h, _)| h.same_entry(&got[0].0)));
    assert_eq!(m.stats().models.len(), 1);
}

#[test]
fn a_failed_load_reaches_every_waiter_and_is_retried_later() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (mut l, runs) = Counting::new("broken", 10);
    l.fail = true;
    l.delay = Duration::from_millis(100);
    let h = m.get_or_load(f.key("a.safetensors", ""), l).unwrap();
    let barrier = Arc::new(Barrier::new(4));
    let errs: Vec<String> = (0..4)
        .map(|_| {
            let (h, barrier) = (h.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                h.pin().err().map(|e| e.to_string())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap().expect("every pin fails"))
        .collect();
    for e in &errs {
        assert!(e.contains("disk on fire") && e.contains("a.safetensors"), "{e}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "waiters share the one failed attempt");
    assert!(h.pin().is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a later pin retries");
    assert_eq!(m.stats().load_failures, 2);
    assert_eq!(m.stats().loads, 0);
}

#[test]
fn lowering_the_budget_evicts_at_once() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (a, _) = request(&m, f.key("a.safetensors", "a."), "a", 100);
    let (b, _) = request(&m, f.key("a.safetensors", "b."), "b", 100);
    let (c, _) = request(&m, f.key("a.safetensors", "c."), "c", 100);
    drop(a.pin().unwrap());
    let gb = b.pin().unwrap();
    drop(c.pin().unwrap());
    assert!(m.set_budget(Device::Cpu, Some(150)));
    // `a` (oldest) and `c` go; `b` is pinned.
    assert!(!a.is_resident() && b.is_resident() && !c.is_resident());
    assert!(!m.set_budget(Device::Cpu, Some(50)), "pinned b cannot be evicted");
    assert!(b.is_resident());
    drop(gb);
    assert_eq!(m.stats().evictions, 2);
    assert_eq!(m.budget(Device::Cpu), Some(50));
}

#[test]
fn dropped_handles_keep_a_cache_until_released() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let key = f.key("a.safetensors", "");
    let (h, runs) = request(&m, key.clone(), "a", 100);
    drop(h.pin().unwrap());
    drop(h);
    let s = m.stats();
    assert_eq!(s.models.len(), 1);
    assert_eq!(s.models[0].handles, 0);
    assert!(s.models[0].resident);

    // A later identical request revives the cached copy: a hit, not a load.
    let (h, runs2) = request(&m, key.clone(), "a", 100);
    drop(h.pin().unwrap());
    assert_eq!((runs.load(Ordering::SeqCst), runs2.load(Ordering::SeqCst)), (1, 0));
    assert_eq!(m.stats().hits, 1);
    drop(h);

    assert_eq!(m.release_unreferenced(), 100);
    assert!(m.stats().models.is_empty());

    // An entry never pinned is forgotten as soon as its last handle goes.
    let (h, _) = request(&m, f.key("b.safetensors", ""), "b", 100);
    drop(h);
    assert!(m.stats().models.is_empty());
}

#[test]
fn a_guard_outliving_its_handle_keeps_the_weights() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(100));
    let (a, _) = request(&m, f.key("a.safetensors", "a."), "a", 100);
    let ga = a.pin().unwrap();
    drop(a);
    let (b, _) = request(&m, f.key("a.safetensors", "b."), "b", 100);
    assert!(b.pin().is_err(), "a is still pinned by its guard");
    assert_eq!(ga.tag, "a");
    drop(ga);
    drop(b.pin().unwrap());
    // `a` was unreferenced, so its eviction forgot it entirely.
    assert_eq!(m.stats().models.len(), 1);
}

#[test]
fn stats_split_mapped_and_anonymous_bytes_and_serialize() {
    let f = Files::new();
    let m = ResidencyManager::new();
    m.set_budget(Device::Cpu, Some(10_000));
    let (mut l, _) = Counting::new("mixed", 300);
    l.mapped = 700;
    let h = m.get_or_load(f.key("a.safetensors", "model.diffusion_model."), l).unwrap();
    let (other, _) = request(&m, f.key("b.safetensors", ""), "b", 50);
    let g = h.pin().unwrap();
    drop(other.pin().unwrap());
    let s = m.stats();
    let d = s.device(Device::Cpu).unwrap();
    assert_eq!((d.bytes, d.anonymous_bytes, d.mapped_bytes, d.pinned_bytes), (1050, 350, 700, 1000));
    assert_eq!(d.budget, Some(10_000));
    let mh = s.model(h.key()).unwrap();
    assert_eq!(mh.name, "a.safetensors:model.diffusion_model");
    assert_eq!((mh.bytes, mh.anonymous_bytes, mh.mapped_bytes, mh.pins, mh.loads), (1000, 300, 700, 1, 1));
    assert!(mh.last_load_ms.is_some());
    let json = serde_json::to_string(&s).unwrap();
    let back: sdflow_core::residency::ResidencyStats = serde_json::from_str(&json).unwrap();
    // Load times are floats (not bit-exact through JSON); everything else must round-trip.
    assert_eq!(back.devices, s.devices);
    assert_eq!((back.requests, back.hits, back.loads), (s.requests, s.hits, s.loads));
    assert_eq!(back.model(h.key()).unwrap().key, *h.key());
    assert!(json.contains("\"device\":\"cpu\""), "{json}");
    drop(g);
}

#[test]
fn asking_for_a_key_as_another_type_is_an_error() {
    #[derive(Debug)]
    struct Other;
    impl Resident for Other {
        fn footprint(&self) -> Footprint {
            Footprint::default()
        }
    }
    let f = Files::new();
    let m = ResidencyManager::new();
    let key = f.key("a.safetensors", "");
    let (_h, _) = request(&m, key.clone(), "a", 1);
    let err = m.get_or_load(key, || Ok::<_, std::io::Error>(Other)).unwrap_err();
    assert!(matches!(err, ResidencyError::TypeMismatch { .. }), "{err}");
}

#[test]
fn a_missing_source_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let err = WeightKey::new([&missing], "", None, Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("nope.safetensors"), "{err}");
    let none: [&std::path::Path; 0] = [];
    assert!(matches!(WeightKey::new(none, "x.", None, Device::Cpu), Err(ResidencyError::NoSources { .. })));
}

#[test]
fn a_panicking_loader_is_an_error_not_a_hang() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let h: WeightHandle<Blob> = m
        .get_or_load(f.key("a.safetensors", ""), || -> Result<Blob, std::io::Error> { panic!("bug in loader") })
        .unwrap();
    let err = h.pin().err().unwrap().to_string();
    assert!(err.contains("loader panicked: bug in loader"), "{err}");
    // The entry is usable again (and fails the same way) rather than stuck loading.
    assert!(h.pin().is_err());
    assert_eq!(m.stats().load_failures, 2);
}

/// An entry derived from another (a LoRA overlay): its loader holds the base's handle and its
/// payload the base's pin. Letting the derived entry go (its last handle dropped, or
/// evicted) drops those, which re-enter the manager; that must not deadlock.
#[test]
fn dropping_a_derived_entry_releases_its_base() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (base, _) = request(&m, f.key("a.safetensors", ""), "base", 100);
    struct Derived {
        base: WeightHandle<Blob>,
    }
    struct Overlay {
        _pin: sdflow_core::residency::PinGuard<Blob>,
    }
    impl Resident for Overlay {
        fn footprint(&self) -> Footprint {
            Footprint { anonymous: 10, mapped: 0 }
        }
    }
    impl Load for Derived {
        type Output = Overlay;
        fn estimate(&self) -> Option<u64> {
            None
        }
        fn load(&self) -> Result<Overlay, sdflow_core::residency::BoxError> {
            Ok(Overlay { _pin: self.base.pin()? })
        }
    }
    let derived = m.get_or_load(f.key("b.safetensors", ""), Derived { base: base.clone() }).unwrap();
    drop(derived.pin().unwrap());
    // Evicting the overlay drops its pin of the base, under the manager's watch.
    assert!(m.release_unreferenced() == 0, "both are still referenced");
    drop(derived);
    m.release_unreferenced();
    // The base is still usable, and goes too once its handle does.
    drop(base.pin().unwrap());
    drop(base);
    m.release_unreferenced();
    assert_eq!(m.stats().models.len(), 0);
}

#[test]
fn a_transient_entry_is_dropped_when_its_last_pin_goes() {
    let f = Files::new();
    let m = ResidencyManager::new();
    let (l, runs) = Counting::new("copy", 100);
    let h = m.get_or_load_transient(f.key("a.safetensors", "gpu-copy."), l).unwrap();
    let g1 = h.pin().unwrap();
    let g2 = h.pin().unwrap();
    drop(g1);
    assert!(h.is_resident(), "still pinned once");
    drop(g2);
    assert!(!h.is_resident(), "no pin left: gone, not cached");
    assert_eq!(m.stats().device(Device::Cpu).map_or(0, |d| d.bytes), 0);
    drop(h.pin().unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each use loads again");
    // A cached entry beside it keeps its payload.
    let (c, _) = request(&m, f.key("a.safetensors", "cached."), "cached", 10);
    drop(c.pin().unwrap());
    assert!(c.is_resident());
}
