//! Shared by the benchmarks: the cached full-size random checkpoints and process memory.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Instant;

use sdflow_core::dtype::DType;
use sdflow_core::synth::{ensure_checkpoint, Format, SdConfig};

/// The full-size random-weight SD1.5 checkpoint (f16 safetensors), written once by
/// `sdflow_core::synth` and reused while its metadata matches.
pub fn checkpoint() -> PathBuf {
    checkpoint_of("sd15", &SdConfig::sd15())
}

/// The full-size random-weight checkpoint of `config`, cached as `<name>_f16.safetensors`.
pub fn checkpoint_of(name: &str, config: &SdConfig) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = home.join(".cache/sdflow/bench");
    let path = dir.join(format!("{name}_f16.safetensors"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let t = Instant::now();
    let wrote = ensure_checkpoint(&path, config, DType::F16, 0, Format::Safetensors)
        .unwrap_or_else(|e| panic!("writing the benchmark checkpoint: {e}"));
    if wrote {
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!("wrote {} ({:.2} GiB) in {:.1} s", path.display(), size as f64 / GIB, t.elapsed().as_secs_f64());
    }
    path
}

/// `specs` written once (seed 0, `config` as metadata) to `~/.cache/sdflow/bench/<file>`
/// in `dtype`: a GGUF for quantized types, safetensors otherwise.
pub fn cached_specs(file_stem: &str, specs: &[sdflow_core::synth::TensorSpec], config: &str, dtype: DType) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let (format, ext) = if dtype.is_quantized() { (Format::Gguf, "gguf") } else { (Format::Safetensors, "safetensors") };
    let path = home.join(".cache/sdflow/bench").join(format!("{file_stem}.{ext}"));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    if !path.exists() {
        let t = Instant::now();
        sdflow_core::synth::write_specs(&path, specs, config, dtype, 0, format).expect("writing the model");
        println!("wrote {} in {:.0} s", path.display(), t.elapsed().as_secs_f64());
    }
    path
}

/// An environment variable, or `default`.
/// The median of `reps` timings of `once` (seconds it reports) after one untimed warm-up.
pub fn median_after_warmup(reps: usize, mut once: impl FnMut() -> f64) -> f64 {
    once();
    let mut t: Vec<f64> = (0..reps.max(1)).map(|_| once()).collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

pub const GIB: f64 = (1u64 << 30) as f64;
pub const MIB: f64 = (1u64 << 20) as f64;

/// A `kB` field of `/proc/self/status`, in bytes (0 where there is none).
fn status_bytes(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `VmRSS`, `RssAnon`, `RssFile` of this process, in bytes.
pub fn rss() -> [u64; 3] {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    ["VmRSS:", "RssAnon:", "RssFile:"].map(|f| status_bytes(&status, f))
}

/// Peak resident set (`VmHWM`) of this process, in bytes.
pub fn peak_rss() -> u64 {
    status_bytes(&std::fs::read_to_string("/proc/self/status").unwrap_or_default(), "VmHWM:")
}

/// CPU seconds this process has used (all threads). With one compute thread this counts
/// the work itself even while other processes share the cores, where wall time does not.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
