//! Load benchmark: a full-size random-weight SD1.5 checkpoint (f16 safetensors, made once by
//! `sdflow_core::synth` and cached (checked by its metadata) at `$HOME/.cache/sdflow/bench/sd15_f16.safetensors`),
//! loaded through the residency manager into `HostWeights` with and without mmap.
//!
//! Each mode runs in a fresh child process so that its RSS numbers are its own. "cold" runs
//! first evict the file from the page cache (`posix_fadvise(DONTNEED)`), "warm" runs find it
//! cached. Full load = pinning the UNet, VAE and text-encoder entries and touching every byte
//! (a checksum), as a forward pass would. `read-whole` (warm) requests the whole file as one
//! entry instead of three, to show the cost of reading the file once per entry without mmap.
//!
//! Run: `cargo bench -p sdflow-core --bench load`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use sdflow_core::io::{self, OpenOptions};
use sdflow_core::residency::{Device, HostWeights, ResidencyManager};

mod common;

use common::{checkpoint, rss, GIB, MIB};

const PREFIXES: [&str; 3] = ["model.diffusion_model.", "first_stage_model.", "cond_stage_model."];
const MODE_ENV: &str = "SDFLOW_LOAD_BENCH_MODE";

fn drop_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // SAFETY: a plain syscall on a file descriptor we own; it only drops clean cached pages.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        eprintln!("posix_fadvise failed ({rc}); the cold run may be warm");
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    for w in &mut words {
        sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8-byte chunk")));
    }
    words.remainder().iter().fold(sum, |s, &b| s.wrapping_add(u64::from(b)))
}

/// One measurement, in the child process; prints one tab-separated result line.
fn child(path: &Path, mode: &str) {
    let (mmap, cold, whole) = match mode {
        "mmap-cold" => (true, true, false),
        "mmap-warm" => (true, false, false),
        "read-cold" => (false, true, false),
        "read-warm" => (false, false, false),
        "read-whole" => (false, false, true),
        other => panic!("unknown mode {other}"),
    };
    // Three entries (UNet, VAE, text encoder) as a pipeline requests them, or the whole file
    // as one entry: without mmap each entry reads its source file once.
    let prefixes: &[&str] = if whole { &[""] } else { &PREFIXES };
    if cold {
        drop_page_cache(path);
    }
    let before = rss();
    let opts = OpenOptions { mmap };

    // Opening alone: header parse (and, without mmap, reading the whole file).
    let t = Instant::now();
    let src = io::open_with(path, &opts).unwrap_or_else(|e| panic!("{e}"));
    let open_s = t.elapsed().as_secs_f64();
    let n_tensors = src.tensors().len();
    drop(src);
    if cold {
        drop_page_cache(path);
    }

    let manager = ResidencyManager::new();
    let t = Instant::now();
    let handles: Vec<_> = prefixes
        .iter()
        .map(|p| manager.request_host_weights(&[path], p, None, opts.clone()).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let guards: Vec<_> = handles.iter().map(|h| h.pin().unwrap_or_else(|e| panic!("{e}"))).collect();
    let pin_s = t.elapsed().as_secs_f64();
    let mut sum = 0u64;
    let mut touched = 0usize;
    for g in &guards {
        let g: &HostWeights = g;
        for t in g.iter() {
            let t = t.unwrap_or_else(|e| panic!("{e}"));
            sum = sum.wrapping_add(checksum(t.bytes));
            touched += t.bytes.len();
        }
    }
    let full_s = t.elapsed().as_secs_f64();
    let after = rss();
    let stats = manager.stats();
    let cpu = stats.device(Device::Cpu).expect("cpu entries");
    assert_eq!(cpu.bytes, touched as u64, "the manager accounts every touched byte");
    assert_eq!(guards.iter().map(|g| g.len()).sum::<usize>(), n_tensors, "the prefixes cover the file");
    println!(
        "RESULT\t{mode}\t{open_s}\t{pin_s}\t{full_s}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{sum:016x}",
        cpu.mapped_bytes, cpu.anonymous_bytes, before[0], before[1], before[2], after[0], after[1], after[2]
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter we do not use.
    let path = checkpoint();
    if let Ok(mode) = std::env::var(MODE_ENV) {
        child(&path, &mode);
        return;
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("checkpoint: {} ({:.2} GiB)", path.display(), size as f64 / GIB);
    println!(
        "{:<10} {:>8} {:>9} {:>10} {:>11} {:>11} {:>22} {:>22} {:>22}",
        "mode", "open s", "pin s", "full s", "mapped MiB", "anon MiB", "VmRSS MiB before>after",
        "RssAnon before>after", "RssFile before>after"
    );
    let exe = std::env::current_exe().expect("own executable path");
    let mut checksums = Vec::new();
    for mode in ["mmap-cold", "mmap-warm", "read-cold", "read-warm", "read-whole"] {
        let out = Command::new(&exe).env(MODE_ENV, mode).output().expect("spawning a measurement");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(line) = stdout.lines().find(|l| l.starts_with("RESULT\t")) else {
            eprintln!("{mode} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            std::process::exit(1);
        };
        let f: Vec<&str> = line.split('\t').collect();
        let num = |i: usize| f[i].parse::<f64>().expect("numeric field");
        let mib = |i: usize| num(i) / MIB;
        println!(
            "{:<10} {:>8.3} {:>9.3} {:>10.3} {:>11.1} {:>11.1} {:>22} {:>22} {:>22}",
            mode,
            num(2),
            num(3),
            num(4),
            mib(5),
            mib(6),
            format!("{:.0} > {:.0}", mib(7), mib(10)),
            format!("{:.0} > {:.0}", mib(8), mib(11)),
            format!("{:.0} > {:.0}", mib(9), mib(12)),
        );
        checksums.push(f[13].to_string());
    }
    checksums.dedup();
    assert_eq!(checksums.len(), 1, "every mode must read the same bytes");
    println!("checksum {} (identical in every mode)", checksums[0]);
}
