//! stable-diffusion.cpp side of `bench/sd15.sh`: txt2img on the same cached SD1.5 checkpoint
//! as `cargo bench -p sdflow-core --bench sd15`, through sd.cpp's C API (bundled by
//! `diffusion-rs-sys`), printing the same lines as the sdflow and diffusers benches.
//!
//! Usage: `sdcpp-bench [threads] [sizes=256,512] [steps=4] [checkpoint]`
//! (checkpoint default: `~/.cache/sdflow/bench/sd15_f16.safetensors`, written by the sdflow bench).
//! Env: `SDCPP_BENCH_TYPE` = f32 | f16 | … (sd.cpp's wtype; default: the file's own types),
//! `SDCPP_BENCH_FLASH_ATTN=1` (sd.cpp's `--diffusion-fa`, off by default as in its CLI),
//! `SDCPP_BENCH_VERBOSE=1` (forward sd.cpp's info log to stderr).
//!
//! One "step" is one euler step with cfg 7: sd.cpp runs the UNet for cond and for uncond
//! (two batch-1 evaluations, the work of sdflow's one batch-2 evaluation). The first step
//! also allocates the compute buffers and is dropped, as in the other two benches. sd.cpp
//! reads weights lazily, so a 64², 1-step generation first loads them; "load" is
//! `new_sd_ctx` plus the weight loading sd.cpp logs during that generation.

use diffusion_rs_sys as sd;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

const GIB: f64 = (1u64 << 30) as f64;

/// sd.cpp's log lines and progress reports: its callbacks are process-global, so is this.
struct Recorder {
    /// Seconds per sampling step, in order, for the current `generate_image` call.
    steps: Vec<(c_int, f32)>,
    /// Between sd.cpp's "sampling using" and "sampling completed" lines. Weight loading
    /// reports through the same callback, also during sampling (the UNet's weights load on
    /// its first use), with the tensor count as its total.
    sampling: bool,
    /// The sampling steps asked for: the total a sampling report carries.
    want_steps: c_int,
    /// Sum of `loading tensors completed, taking X s`: sd.cpp loads each model's weights on
    /// its first use inside `generate_image`, not in `new_sd_ctx`.
    load_s: f64,
    /// `get_learned_condition completed, taking X s` (both prompts, cond and uncond).
    text_s: Option<f64>,
    /// `latent 1 decoded, taking X s`.
    vae_s: Option<f64>,
    errors: Vec<String>,
}

static REC: Mutex<Recorder> =
    Mutex::new(Recorder { steps: Vec::new(), sampling: false, want_steps: 0, load_s: 0.0, text_s: None, vae_s: None, errors: Vec::new() });

fn verbose() -> bool {
    std::env::var_os("SDCPP_BENCH_VERBOSE").is_some_and(|v| v != "0")
}

/// The seconds in a line with "taking 1.23s" (possibly followed by more text).
fn taking_seconds(line: &str) -> Option<f64> {
    let rest = &line[line.find("taking ")? + "taking ".len()..];
    rest[..rest.find('s')?].parse().ok()
}

unsafe extern "C" fn on_log(level: sd::sd_log_level_t, text: *const c_char, _data: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: sd.cpp passes a NUL-terminated string that lives for the call.
    let line = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let line = line.trim_end();
    let mut rec = REC.lock().unwrap_or_else(|e| e.into_inner());
    if line.contains("sampling using") {
        rec.sampling = true;
    } else if line.contains("sampling completed") {
        rec.sampling = false;
    } else if line.contains("loading tensors completed") {
        rec.load_s += taking_seconds(line).unwrap_or(0.0);
    } else if line.contains("get_learned_condition completed") {
        rec.text_s = taking_seconds(line);
    } else if line.contains("latent 1 decoded") {
        rec.vae_s = taking_seconds(line);
    }
    match level {
        sd::sd_log_level_t::SD_LOG_ERROR => {
            eprintln!("sd.cpp: {line}");
            rec.errors.push(line.to_string());
        }
        sd::sd_log_level_t::SD_LOG_WARN => eprintln!("sd.cpp: {line}"),
        sd::sd_log_level_t::SD_LOG_INFO if verbose() => eprintln!("sd.cpp: {line}"),
        _ => {}
    }
}

unsafe extern "C" fn on_progress(step: c_int, steps: c_int, time: f32, _data: *mut c_void) {
    let mut rec = REC.lock().unwrap_or_else(|e| e.into_inner());
    // Step 0 only starts the clock.
    if rec.sampling && step > 0 && steps == rec.want_steps {
        rec.steps.push((step, time));
    }
}

/// Peak resident set (`VmHWM`) of this process, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `SDFLOW_BENCH_MODEL` (sd15 or sdxl), as the sdflow bench reads it: (file stem, name).
fn model() -> Result<(&'static str, &'static str), String> {
    match std::env::var("SDFLOW_BENCH_MODEL").as_deref() {
        Err(_) | Ok("sd15") => Ok(("sd15", "SD1.5")),
        Ok("sdxl") => Ok(("sdxl", "SDXL")),
        Ok(other) => Err(format!("SDFLOW_BENCH_MODEL {other}: sd15 or sdxl")),
    }
}

fn default_checkpoint() -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    Ok(home.join(format!(".cache/sdflow/bench/{}_f16.safetensors", model()?.0)))
}

struct Args {
    threads: i32,
    sizes: Vec<i32>,
    steps: i32,
    checkpoint: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| argv.get(i).map(String::as_str);
    // SAFETY: no arguments, returns a count.
    let cores = unsafe { sd::sd_get_num_physical_cores() };
    let threads = match arg(0) {
        Some(t) => t.parse().map_err(|e| format!("threads {t:?}: {e}"))?,
        None => cores,
    };
    let sizes = arg(1)
        .unwrap_or("256,512")
        .split(',')
        .map(|s| s.trim().parse::<i32>().map_err(|e| format!("size {s:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(bad) = sizes.iter().find(|s| **s <= 0 || **s % 64 != 0) {
        return Err(format!("size {bad}: sd.cpp needs a positive multiple of 64"));
    }
    let steps: i32 = match arg(2) {
        Some(s) => s.parse().map_err(|e| format!("steps {s:?}: {e}"))?,
        None => 4,
    };
    if steps < 1 {
        return Err(format!("steps {steps}: at least 1"));
    }
    let checkpoint = match arg(3) {
        Some(p) => PathBuf::from(p),
        None => default_checkpoint()?,
    };
    if !checkpoint.is_file() {
        return Err(format!(
            "checkpoint {}: not found (the sdflow bench writes it: cargo bench -p sdflow-core --bench sd15)",
            checkpoint.display()
        ));
    }
    Ok(Args { threads, sizes, steps, checkpoint })
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let path = CString::new(args.checkpoint.to_string_lossy().as_bytes()).map_err(|e| format!("checkpoint path: {e}"))?;
    let wtype_env = std::env::var("SDCPP_BENCH_TYPE").ok();
    let flash = std::env::var_os("SDCPP_BENCH_FLASH_ATTN").is_some_and(|v| v != "0");

    // SAFETY: plain setters of process-global callbacks; the functions live forever.
    unsafe {
        sd::sd_set_log_callback(Some(on_log), std::ptr::null_mut());
        sd::sd_set_progress_callback(Some(on_progress), std::ptr::null_mut());
    }

    // SAFETY: a zeroed struct that sd_ctx_params_init fills with sd.cpp's defaults.
    let mut cp: sd::sd_ctx_params_t = unsafe { std::mem::zeroed() };
    unsafe { sd::sd_ctx_params_init(&mut cp) };
    cp.model_path = path.as_ptr();
    cp.n_threads = args.threads;
    cp.sampler_rng_type = sd::rng_type_t::CPU_RNG;
    cp.rng_type = sd::rng_type_t::CPU_RNG;
    cp.diffusion_flash_attn = flash;
    let type_name = match &wtype_env {
        Some(name) => {
            let c = CString::new(name.as_str()).map_err(|e| format!("SDCPP_BENCH_TYPE: {e}"))?;
            // SAFETY: a NUL-terminated string; returns SD_TYPE_COUNT when unknown.
            let t = unsafe { sd::str_to_sd_type(c.as_ptr()) };
            if t == sd::sd_type_t::SD_TYPE_COUNT {
                return Err(format!("SDCPP_BENCH_TYPE {name:?}: not a type sd.cpp knows"));
            }
            cp.wtype = t;
            name.clone()
        }
        None => "f16 as stored".to_string(),
    };

    let t = Instant::now();
    // SAFETY: cp's strings (path) outlive the call; sd.cpp copies what it keeps.
    let ctx = unsafe { sd::new_sd_ctx(&cp) };
    let ctx_s = t.elapsed().as_secs_f64();
    if ctx.is_null() {
        let errors = REC.lock().unwrap_or_else(|e| e.into_inner()).errors.join("; ");
        return Err(format!("new_sd_ctx({}) failed: {errors}", args.checkpoint.display()));
    }
    let result = bench(ctx, &args, ctx_s, &type_name, flash);
    // SAFETY: ctx came from new_sd_ctx and is not used after this.
    unsafe { sd::free_sd_ctx(ctx) };
    result
}

/// What one `generate_image` call measured.
struct Measured {
    step_s: f64,
    text_s: Option<f64>,
    vae_s: f64,
}

fn generate(ctx: *mut sd::sd_ctx_t, size: i32, steps: i32) -> Result<Measured, String> {
    // The sdflow bench's prompts.
    let prompt = CString::new("a photograph of an astronaut riding a horse, (highly detailed:1.2)").unwrap();
    let negative = CString::new("blurry, low quality").unwrap();
    {
        let mut rec = REC.lock().unwrap_or_else(|e| e.into_inner());
        rec.steps.clear();
        rec.sampling = false;
        rec.want_steps = steps;
        rec.text_s = None;
        rec.vae_s = None;
    }
    // SAFETY: a zeroed struct that sd_img_gen_params_init fills with sd.cpp's defaults.
    let mut gp: sd::sd_img_gen_params_t = unsafe { std::mem::zeroed() };
    unsafe { sd::sd_img_gen_params_init(&mut gp) };
    gp.prompt = prompt.as_ptr();
    gp.negative_prompt = negative.as_ptr();
    gp.width = size;
    gp.height = size;
    gp.seed = 42;
    gp.batch_count = 1;
    gp.sample_params.sample_method = sd::sample_method_t::EULER_SAMPLE_METHOD;
    gp.sample_params.scheduler = sd::scheduler_t::DISCRETE_SCHEDULER;
    gp.sample_params.sample_steps = steps;
    gp.sample_params.guidance.txt_cfg = 7.0;
    // SAFETY: ctx is live; gp's strings outlive the call.
    let images = unsafe { sd::generate_image(ctx, &gp) };
    if images.is_null() {
        let errors = REC.lock().unwrap_or_else(|e| e.into_inner()).errors.join("; ");
        return Err(format!("generate_image at {size}² failed: {errors}"));
    }
    // SAFETY: generate_image returns batch_count (1) malloc'd images with malloc'd data.
    let (w, h, has_data) = unsafe { ((*images).width, (*images).height, !(*images).data.is_null()) };
    unsafe {
        libc_free((*images).data as *mut c_void);
        libc_free(images as *mut c_void);
    }
    if w != size as u32 || h != size as u32 || !has_data {
        return Err(format!("generate_image at {size}²: got a {w}x{h} image"));
    }
    let rec = REC.lock().unwrap_or_else(|e| e.into_inner());
    // A loading report that happened to have the same total would break this order.
    if !rec.steps.iter().map(|(s, _)| *s).eq(1..=steps) {
        let got: Vec<c_int> = rec.steps.iter().map(|(s, _)| *s).collect();
        return Err(format!("sd.cpp's progress at {size}² reported steps {got:?}, expected 1..={steps}"));
    }
    let timed: Vec<f64> = rec.steps.iter().filter(|(step, _)| *step > 1).map(|(_, t)| *t as f64).collect();
    let step_s = if timed.is_empty() {
        // One step only: nothing after the warm-up, report it rather than nothing.
        rec.steps[0].1 as f64
    } else {
        timed.iter().sum::<f64>() / timed.len() as f64
    };
    Ok(Measured { step_s, text_s: rec.text_s, vae_s: rec.vae_s.unwrap_or(f64::NAN) })
}

fn bench(ctx: *mut sd::sd_ctx_t, args: &Args, ctx_s: f64, type_name: &str, flash: bool) -> Result<(), String> {
    // sd.cpp reads each model's weights on its first use inside generate_image. One small
    // generation first loads them all, so "load" is the load, as in sdflow's bench, and the
    // first measured size's text encode and VAE decode do not include reading weights.
    generate(ctx, 64, 1)?;
    let load_s = ctx_s + REC.lock().unwrap_or_else(|e| e.into_inner()).load_s;
    for (i, &size) in args.sizes.iter().enumerate() {
        let m = generate(ctx, size, args.steps)?;
        if i == 0 {
            // The header carries one text encode, as sdflow's does; print it after the first
            // size so the rows stream as they finish.
            let text = m.text_s.map_or("?".to_string(), |t| format!("{:.2}", t / 2.0));
            // No comma: bench/sd15.sh takes the weights field up to the next one.
            let fa = if flash { " +flash-attn" } else { "" };
            println!("sd.cpp {}, weights {type_name}{fa}, {} threads, load {load_s:.1} s, text encode {text} s per prompt", model()?.1, args.threads);
            println!("{:>6} {:>12} {:>14} {:>14}", "size", "s/step", "VAE decode s", "peak RSS GiB");
        }
        println!("{:>6} {:>12.2} {:>14.2} {:>14.2}", format!("{size}²"), m.step_s, m.vae_s, peak_rss() as f64 / GIB);
    }
    Ok(())
}

extern "C" {
    #[link_name = "free"]
    fn libc_free(p: *mut c_void);
}

fn main() {
    if std::env::args().any(|a| a == "--system-info") {
        // SAFETY: returns a static NUL-terminated string.
        let info = unsafe { CStr::from_ptr(sd::sd_get_system_info()) };
        println!("{}", info.to_string_lossy().trim_end());
        return;
    }
    if let Err(e) = run() {
        eprintln!("sdcpp-bench: {e}");
        std::process::exit(1);
    }
}
