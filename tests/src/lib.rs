//! sdflow-tests: end-to-end tests that run the committed workflow files on tiny
//! random-weight models with the real architectures (see `tests/`).
//!
//! This crate exists so the end-to-end suite can depend on every other crate without
//! any of them depending on each other for testing's sake.

use std::path::PathBuf;

/// The repository's `workflows/` folder.
pub fn workflows_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../workflows")
}

use sdflow_core::dtype::DType;
use sdflow_core::synth::{write_checkpoint, Format, SdConfig};
use sdflow_executor::{stub, CancelToken, Executor, ExecutorConfig, InputValue, NodeSpec, NullSink, Registry, RunOptions, Workflow};
use sdflow_nodes::Runtime;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// `models/checkpoints/model.safetensors` (tiny SD1 with a KL-f8 VAE, seed 7) and an
/// empty `input/` under `root`; returns the input folder.
pub fn tiny_tree(root: &Path) -> PathBuf {
    let ckpts = root.join("models/checkpoints");
    std::fs::create_dir_all(&ckpts).unwrap();
    write_checkpoint(&ckpts.join("model.safetensors"), &SdConfig::tiny_sd1_f8(), DType::F32, 7, Format::Safetensors).unwrap();
    let input = root.join("input");
    std::fs::create_dir_all(&input).unwrap();
    input
}

/// A scratch models/input/output tree with a tiny SD1 checkpoint (KL-f8 VAE) and an
/// executor over every node (and [`CaptureLatent`]), for end-to-end tests.
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub out: PathBuf,
    pub exec: Executor,
    latents: Arc<Mutex<Vec<sdflow_nodes::values::Latent>>>,
}

/// `TestCaptureLatent`: keeps the latents it is given, so tests can look at what sampling
/// returned.
pub struct CaptureLatent {
    pub seen: Arc<Mutex<Vec<sdflow_nodes::values::Latent>>>,
    runs: std::sync::atomic::AtomicU64,
}

impl CaptureLatent {
    pub fn new(seen: Arc<Mutex<Vec<sdflow_nodes::values::Latent>>>) -> Self {
        CaptureLatent { seen, runs: std::sync::atomic::AtomicU64::new(0) }
    }
}

impl sdflow_executor::Node for CaptureLatent {
    fn schema(&self) -> sdflow_executor::NodeSchema {
        sdflow_executor::NodeSchema::new("TestCaptureLatent").category("testing").input(sdflow_executor::InputSpec::link("samples", sdflow_executor::IoType::LATENT)).output_node()
    }

    // A new fingerprint every run: the capture must run even when its input is cached.
    fn fingerprint(&self, _inputs: &sdflow_executor::Inputs) -> Result<Option<Vec<u8>>, sdflow_executor::NodeError> {
        Ok(Some(self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_le_bytes().to_vec()))
    }

    fn execute(&self, _ctx: &mut sdflow_executor::ExecContext<'_>, inputs: &sdflow_executor::Inputs) -> Result<sdflow_executor::Outputs, sdflow_executor::NodeError> {
        self.seen.lock().unwrap().push(inputs.downcast::<sdflow_nodes::values::Latent>("samples")?.clone());
        Ok(sdflow_executor::Outputs::none())
    }
}

impl TestEnv {
    /// `models/checkpoints/model.safetensors` (tiny SD1, seed 7), `input/input.png` (a
    /// 72×56 gradient), `input/mask.png` (right half white); `runtime` may adjust the
    /// runtime before the nodes are registered.
    pub fn new(runtime: impl FnOnce(Runtime) -> Runtime) -> TestEnv {
        let dir = tempfile::tempdir().unwrap();
        let input = tiny_tree(dir.path());
        write_test_png(&input.join("input.png"), 72, 56);
        write_mask_png(&input.join("mask.png"), 72, 56, |x, _| x >= 36);
        TestEnv::with_dir(dir, runtime)
    }

    /// An executor over a prepared tree (`models/`, `input/`; `output/` is created).
    pub fn with_dir(dir: tempfile::TempDir, runtime: impl FnOnce(Runtime) -> Runtime) -> TestEnv {
        let out = dir.path().join("output");
        let rt = runtime(Runtime::new(dir.path().join("models"), &out, 2, None).unwrap().with_input_dir(dir.path().join("input")));
        let mut reg = Registry::new();
        stub::register(&mut reg);
        sdflow_nodes::register_all(&mut reg, Arc::new(rt));
        let latents = Arc::new(Mutex::new(Vec::new()));
        reg.register(Arc::new(CaptureLatent::new(latents.clone())));
        TestEnv { exec: Executor::new(Arc::new(reg), ExecutorConfig::default()), out, dir, latents }
    }

    /// Run `wf` and return the LATENT that output 0 of `node` gave.
    pub fn run_latent(&self, wf: &Workflow, node: &str) -> sdflow_nodes::values::Latent {
        let mut wf = wf.clone();
        wf.nodes.insert("capture".into(), NodeSpec::new("TestCaptureLatent").with_input("samples", InputValue::link(node, 0)));
        let opts = RunOptions { output_dir: Some(self.out.clone()), ..Default::default() };
        let before = self.latents.lock().unwrap().len();
        self.exec.run(&wf, &NullSink, &CancelToken::new(), &opts).unwrap();
        let seen = self.latents.lock().unwrap();
        assert_eq!(seen.len(), before + 1, "the capture ran");
        seen.last().unwrap().clone()
    }

    /// A committed workflow shrunk to test size: `size`² empty latents, `steps` steps,
    /// `input.png` for every LoadImage.
    pub fn workflow(&self, name: &str, size: i64, steps: i64) -> Workflow {
        let text = std::fs::read_to_string(workflows_dir().join(name)).unwrap();
        let wf = Workflow::parse(&text, self.exec.registry()).unwrap();
        assert!(wf.header.as_ref().and_then(|h| h.title.as_ref()).is_some(), "{name} has a title");
        shrink(wf, size, steps, Some("input.png"))
    }

    /// A ComfyUI template from tests/fixtures/comfyui (see SOURCES.md there), unchanged
    /// but for test sizes (`size`² latents, `steps` steps); it must validate as it is.
    pub fn comfyui_template(&self, name: &str, size: i64, steps: i64) -> Workflow {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/comfyui").join(name);
        let wf = Workflow::parse(&std::fs::read_to_string(path).unwrap(), self.exec.registry()).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Err(report) = self.exec.validate(&wf) {
            panic!("{name} does not validate: {}", serde_json::to_string_pretty(&report.to_json()).unwrap());
        }
        shrink(wf, size, steps, None)
    }

    /// Run `wf` and read back the first image output node `save_node` wrote.
    pub fn run_saved(&self, wf: &Workflow, save_node: &str) -> (u32, u32, Vec<u8>) {
        let opts = RunOptions { output_dir: Some(self.out.clone()), ..Default::default() };
        let report = self.exec.run(wf, &NullSink, &CancelToken::new(), &opts).unwrap();
        read_png(&self.out.join(report.ui_outputs[save_node]["images"][0]["filename"].as_str().unwrap()))
    }

    /// [`TestEnv::run_saved`]'s pixels, hashed: a failed comparison prints two numbers,
    /// not two images.
    pub fn run_saved_hash(&self, wf: &Workflow, save_node: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.run_saved(wf, save_node).2.hash(&mut h);
        h.finish()
    }

    /// Run `wf`, which must fail, and return the error's text.
    pub fn run_err(&self, wf: &Workflow) -> String {
        let opts = RunOptions { output_dir: Some(self.out.clone()), ..Default::default() };
        self.exec.run(wf, &NullSink, &CancelToken::new(), &opts).expect_err("the run fails").to_string()
    }
}

/// `wf` with `size`² empty latents, `steps` sampling steps (KSamplerAdvanced's split
/// kept in proportion) and, when given, `image` for every LoadImage.
pub fn shrink(mut wf: Workflow, size: i64, steps: i64, image: Option<&str>) -> Workflow {
    for (id, node) in wf.nodes.clone() {
        let set = |wf: &mut Workflow, input: &str, v: serde_json::Value| wf.set_input(&id, input, InputValue::Const(v)).unwrap();
        let int = |input: &str| match node.inputs.get(input) {
            Some(InputValue::Const(v)) => v.as_i64(),
            _ => None,
        };
        match node.class_type.as_str() {
            "EmptyLatentImage" | "EmptySD3LatentImage" | "EmptyFlux2LatentImage" | "Flux2Scheduler" => {
                set(&mut wf, "width", serde_json::json!(size));
                set(&mut wf, "height", serde_json::json!(size));
                if node.class_type == "Flux2Scheduler" {
                    set(&mut wf, "steps", serde_json::json!(steps));
                }
            }
            // Videos: `size`² frames, 5 of them (2 latent frames).
            "EmptyHunyuanLatentVideo" | "WanImageToVideo" | "WanFirstLastFrameToVideo" | "Wan22ImageToVideoLatent" | "WanVaceToVideo" => {
                set(&mut wf, "width", serde_json::json!(size));
                set(&mut wf, "height", serde_json::json!(size));
                set(&mut wf, "length", serde_json::json!(5));
            }
            "KSampler" => set(&mut wf, "steps", serde_json::json!(steps)),
            "KSamplerAdvanced" => {
                let total = int("steps").unwrap_or(steps).max(1);
                let scale = |v: i64| if v >= total { 10_000 } else { v * steps / total };
                set(&mut wf, "steps", serde_json::json!(steps));
                if let Some(v) = int("start_at_step") {
                    set(&mut wf, "start_at_step", serde_json::json!(scale(v)));
                }
                if let Some(v) = int("end_at_step") {
                    set(&mut wf, "end_at_step", serde_json::json!(scale(v)));
                }
            }
            "LoadImage" => {
                if let Some(image) = image {
                    set(&mut wf, "image", serde_json::json!(image));
                }
            }
            _ => {}
        }
    }
    wf
}

/// `wf` with one widget input of `node` set to `v`.
pub fn with_input(wf: &Workflow, node: &str, input: &str, v: serde_json::Value) -> Workflow {
    let mut wf = wf.clone();
    wf.set_input(node, input, sdflow_executor::InputValue::Const(v)).unwrap();
    wf
}

/// A ControlNetApplyAdvanced over the whole schedule: the conditionings `positive` and
/// `negative`, the ControlNet of node `control_net`, the hint image of node `image`.
pub fn controlnet_apply(positive: InputValue, negative: InputValue, control_net: &str, image: &str, strength: f64) -> NodeSpec {
    NodeSpec::new("ControlNetApplyAdvanced")
        .with_input("positive", positive)
        .with_input("negative", negative)
        .with_input("control_net", InputValue::link(control_net, 0))
        .with_input("image", InputValue::link(image, 0))
        .with_input("strength", InputValue::Const(serde_json::json!(strength)))
        .with_input("start_percent", InputValue::Const(serde_json::json!(0.0)))
        .with_input("end_percent", InputValue::Const(serde_json::json!(1.0)))
}

/// A colour gradient, so encoders see structure.
pub fn write_test_png(path: &Path, w: u32, h: u32) {
    let mut enc = png::Encoder::new(std::io::BufWriter::new(std::fs::File::create(path).unwrap()), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let px: Vec<u8> = (0..h).flat_map(|y| (0..w).flat_map(move |x| [(x * 255 / w) as u8, (y * 255 / h) as u8, 128])).collect();
    enc.write_header().unwrap().write_image_data(&px).unwrap();
}

/// A mask image: white (255 in every channel) where `masked(x, y)`.
pub fn write_mask_png(path: &Path, w: u32, h: u32, masked: impl Fn(u32, u32) -> bool) {
    let mut enc = png::Encoder::new(std::io::BufWriter::new(std::fs::File::create(path).unwrap()), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let masked = &masked;
    let px: Vec<u8> = (0..h).flat_map(|y| (0..w).flat_map(move |x| [if masked(x, y) { 255u8 } else { 0 }; 3])).collect();
    enc.write_header().unwrap().write_image_data(&px).unwrap();
}

/// Width, height and 8-bit samples of a PNG.
pub fn read_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Mean and worst absolute difference of two images' samples, in 0..=255 steps.
pub fn pixel_difference(a: &[u8], b: &[u8]) -> (f64, u8) {
    assert_eq!(a.len(), b.len(), "images of different sizes");
    let worst = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0);
    let mean = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y) as f64).sum::<f64>() / a.len().max(1) as f64;
    (mean, worst)
}

/// The id of the one node of `class` in `wf` (committed presets number their nodes by
/// build order, which tests should not depend on).
pub fn node_of(wf: &Workflow, class: &str) -> String {
    let ids: Vec<&String> = wf.nodes.iter().filter(|(_, n)| n.class_type == class).map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 1, "one {class} in the workflow");
    ids[0].clone()
}

/// What `workflows/ip_adapter.json` names, written for the tiny checkpoint of `root`'s
/// tree ([`tiny_tree`]): `models/clip_vision/CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors`
/// (a tiny ViT at the real 224-pixel input), `models/ipadapter/ip-adapter_sd15.safetensors`
/// (classic, 4 tokens) and `ip-adapter-plus_sd15.safetensors` (Plus, 16 tokens, 4 layers).
pub fn write_ip_adapter_models(root: &Path) {
    use sdflow_core::synth::{ip_adapter_tensors, write_tensors, ClipVisionSynth, IpAdapterSynth};
    let models = root.join("models");
    let vision = ClipVisionSynth::tiny();
    std::fs::create_dir_all(models.join("clip_vision")).unwrap();
    write_tensors(&models.join("clip_vision/CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors"), &vision.tensors().unwrap(), 11).unwrap();
    let (layers, cross) = unet_cross_attention(&models.join("checkpoints/model.safetensors"));
    std::fs::create_dir_all(models.join("ipadapter")).unwrap();
    let classic = IpAdapterSynth::Classic { embed_dim: vision.projection_dim, tokens: 4 };
    write_tensors(&models.join("ipadapter/ip-adapter_sd15.safetensors"), &ip_adapter_tensors(classic, &layers, cross), 12).unwrap();
    let plus = IpAdapterSynth::Plus { embed_dim: vision.hidden, dim: 64, depth: 4, tokens: 16 };
    write_tensors(&models.join("ipadapter/ip-adapter-plus_sd15.safetensors"), &ip_adapter_tensors(plus, &layers, cross), 13).unwrap();
}

/// What `workflows/animatediff.json` names, for the tiny SD1 checkpoint of `root`'s tree
/// ([`tiny_tree`]): `models/animatediff_models/mm_sd15_v3.safetensors` (down and up
/// modules, a 32-frame table), `mm_sd_v15_v2.safetensors` (with the mid-block module),
/// `mm_sd_v14.safetensors` (a 24-frame table) and `models/loras/v3_sd15_adapter.safetensors`
/// (the domain adapter's LoRA in the old diffusers attention-processor names).
pub fn write_animatediff_models(root: &Path) {
    use sdflow_core::synth::{motion_module_tensors, processor_lora_tensors, write_tensors};
    let models = root.join("models");
    let cfg = SdConfig::tiny_sd1_f8();
    std::fs::create_dir_all(models.join("animatediff_models")).unwrap();
    for (name, mid, frames, seed) in [("mm_sd15_v3", false, 32, 21), ("mm_sd_v15_v2", true, 32, 22), ("mm_sd_v14", false, 24, 23)] {
        write_tensors(&models.join(format!("animatediff_models/{name}.safetensors")), &motion_module_tensors(&cfg.unet, mid, frames), seed).unwrap();
    }
    std::fs::create_dir_all(models.join("loras")).unwrap();
    write_tensors(&models.join("loras/v3_sd15_adapter.safetensors"), &processor_lora_tensors(&cfg, "").unwrap(), 24).unwrap();
}

/// The widths of a checkpoint's UNet cross-attentions in IP-Adapter order, and its
/// context width.
pub fn unet_cross_attention(ckpt: &Path) -> (Vec<usize>, usize) {
    use sdflow_core::models::{load::load_weights, sd::ip_adapter::cross_attention_blocks, sd::unet::UnetConfig};
    let src = sdflow_core::io::open(ckpt).unwrap();
    let backend = sdflow_core::ggml::Backend::cpu(1).unwrap();
    let w = load_weights(&backend, src.as_ref(), &["model.diffusion_model."], &sdflow_core::io::TypeRules::none()).unwrap();
    let cfg = UnetConfig::infer(&w, "model.diffusion_model").unwrap();
    (cross_attention_blocks(&cfg).iter().map(|b| b.1 as usize).collect(), cfg.context_dim as usize)
}

/// PhotoMaker files for the tiny SDXL checkpoint (`models/photomaker/photomaker-v1.safetensors`
/// and `photomaker-v2.safetensors`, official key layout, 16-wide face embeddings for v2) and
/// `input/photomaker_id/`: two ID images and face_detect.py's `id_embeds.bin` for them.
pub fn write_photomaker_models(root: &Path) {
    use sdflow_core::synth::{photomaker_tensors, write_tensors, ClipVisionSynth};
    let dir = root.join("models/photomaker");
    std::fs::create_dir_all(&dir).unwrap();
    let (vision, sdxl) = (ClipVisionSynth::tiny(), SdConfig::tiny_sdxl());
    write_tensors(&dir.join("photomaker-v1.safetensors"), &photomaker_tensors(&vision, 64, None, &sdxl).unwrap(), 21).unwrap();
    write_tensors(&dir.join("photomaker-v2.safetensors"), &photomaker_tensors(&vision, 64, Some(16), &sdxl).unwrap(), 22).unwrap();
    let ids = root.join("input/photomaker_id");
    std::fs::create_dir_all(&ids).unwrap();
    write_test_png(&ids.join("a.png"), 72, 56);
    write_mask_png(&ids.join("b.png"), 72, 56, |x, y| (x + y) % 7 < 3);
    // sd.cpp's dump: n_dims, name length, type (f32), sizes [16, 2, 1, 1], name, data.
    let mut dump = Vec::new();
    for v in [4i32, 9, 0, 16, 2, 1, 1] {
        dump.extend(v.to_le_bytes());
    }
    dump.extend(b"id_embeds");
    dump.extend((0..32).flat_map(|i| ((i as f32 * 0.37).sin()).to_le_bytes()));
    std::fs::write(ids.join("id_embeds.bin"), dump).unwrap();
}

fn pipeline_names() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/models/pipeline_names.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Writes the diffusers pipeline folder `dir` from the f32 checkpoint `ckpt`, one of the
/// tiny checkpoints `model` (`sd1`, `sd2`, `sdxl`: `SdConfig::tiny_sd1`, `tiny_sd2`,
/// `tiny_sdxl`) as diffusers' own single-file converters rename and cut its tensors (the
/// table `core/tests/fixtures/models/pipeline_names.json`, from make_pipeline_names.py),
/// with `class` in its model_index.json and `prediction` in its scheduler config.
pub fn write_pipeline_folder(ckpt: &Path, dir: &Path, model: &str, class: &str, prediction: &str) {
    let table = &pipeline_names()[model];
    let src = sdflow_core::io::open(ckpt).unwrap();
    for (component, tensors) in table.as_object().unwrap() {
        let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, how) in tensors.as_object().unwrap() {
            let [ldm, kind, start, rows] = how.as_array().unwrap().as_slice() else { panic!("{name}: {how}") };
            let info = src.get(ldm.as_str().unwrap()).unwrap().clone();
            assert_eq!(info.dtype, DType::F32);
            let bytes = src.read(&info.name).unwrap().to_vec();
            let (start, rows) = (start.as_u64().unwrap() as usize, rows.as_u64().unwrap() as usize);
            let row_bytes = bytes.len() / info.shape[0];
            let (shape, data) = match kind.as_str().unwrap() {
                // diffusers' VAE attention is linear where LDM's is a 1×1 convolution.
                "whole" if component == "vae" && info.shape.len() == 4 && name.contains("attentions") => (info.shape[..2].to_vec(), bytes),
                "whole" => (info.shape.clone(), bytes),
                "rows" => {
                    let mut shape = info.shape.clone();
                    shape[0] = rows;
                    (shape, bytes[start * row_bytes..(start + rows) * row_bytes].to_vec())
                }
                "transpose" => {
                    let (r, c) = (info.shape[0], info.shape[1]);
                    let v: Vec<f32> = bytes.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
                    let t: Vec<u8> = (0..c).flat_map(|j| (0..r).map(move |i| (i, j))).flat_map(|(i, j)| v[i * c + j].to_le_bytes()).collect();
                    (vec![c, r], t)
                }
                other => panic!("{name}: {other}"),
            };
            out.push((name.clone(), shape, data));
        }
        let file = if component.starts_with("text_encoder") { "model.safetensors" } else { "diffusion_pytorch_model.safetensors" };
        std::fs::create_dir_all(dir.join(component)).unwrap();
        sdflow_core::io::safetensors::write(&dir.join(component).join(file), out.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &std::collections::BTreeMap::new()).unwrap();
    }
    std::fs::create_dir_all(dir.join("scheduler")).unwrap();
    std::fs::write(dir.join("scheduler/scheduler_config.json"), format!(r#"{{"_class_name": "EulerDiscreteScheduler", "prediction_type": "{prediction}"}}"#)).unwrap();
    std::fs::write(dir.join("model_index.json"), format!(r#"{{"_class_name": "{class}"}}"#)).unwrap();
}

/// A TAESD with the real architecture's shapes (from core's fixture key table) and small
/// pseudo-random weights: `taesd.safetensors` in one file (`encoder.layers.*`,
/// `decoder.layers.*`, as sd.cpp's `--taesd` takes it) or madebyollin's two files
/// (`taesd_encoder.safetensors`, `taesd_decoder.safetensors`). Returns the file(s).
pub fn write_taesd(dir: &Path, single_file: bool) -> Vec<PathBuf> {
    write_tae(dir, "taesd", 4, single_file)
}

/// A tiny autoencoder like [`write_taesd`]'s for `latent_channels` latents (16: TAEF1,
/// TAESD3; 32: TAEF2, which `name` "taef2" gives its pooled GroupNorm blocks), as
/// `{name}_encoder` + `{name}_decoder` or one `{name}.safetensors`.
pub fn write_tae(dir: &Path, name: &str, latent_channels: usize, single_file: bool) -> Vec<PathBuf> {
    use std::collections::BTreeMap;
    let table = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/models/taesd_keys.json")).unwrap();
    let keys: BTreeMap<String, Vec<usize>> = serde_json::from_str(&table).unwrap();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * 0.08
    };
    type Tensors = Vec<(String, Vec<usize>, Vec<u8>)>;
    let mut files: Vec<(PathBuf, Tensors)> = Vec::new();
    // TAEF2's pooled GroupNorm branches: the blocks nearest the latent (diffusers indices).
    let mut keys = keys;
    if name == "taef2" {
        for block in ["encoder.layers.10", "encoder.layers.11", "encoder.layers.12", "decoder.layers.2", "decoder.layers.3", "decoder.layers.4"] {
            keys.insert(format!("{block}.pool.0.weight"), vec![256, 64, 1, 1]);
            keys.insert(format!("{block}.pool.1.weight"), vec![256]);
            keys.insert(format!("{block}.pool.1.bias"), vec![256]);
            keys.insert(format!("{block}.pool.3.weight"), vec![64, 256, 1, 1]);
        }
    }
    for (half, offset) in [("encoder", 0), ("decoder", 1)] {
        let tensors: Tensors = keys
            .iter()
            .filter_map(|(name, shape)| {
                let rest = name.strip_prefix(&format!("{half}.layers."))?;
                // The latent's side of the encoder's last and the decoder's first convolution.
                let mut shape = shape.clone();
                match name.as_str() {
                    "encoder.layers.14.weight" | "encoder.layers.14.bias" => shape[0] = latent_channels,
                    "decoder.layers.0.weight" => shape[1] = latent_channels,
                    _ => {}
                }
                let shape = &shape;
                let n: usize = shape.iter().product();
                let bytes: Vec<u8> = (0..n).flat_map(|_| next().to_le_bytes()).collect();
                if single_file {
                    return Some((name.clone(), shape.clone(), bytes));
                }
                let (i, tail) = rest.split_once('.').unwrap();
                Some((format!("{}.{tail}", i.parse::<usize>().unwrap() + offset), shape.clone(), bytes))
            })
            .collect();
        match files.last_mut() {
            Some((_, all)) if single_file => all.extend(tensors),
            _ => files.push((dir.join(if single_file { format!("{name}.safetensors") } else { format!("{name}_{half}.safetensors") }), tensors)),
        }
    }
    for (path, tensors) in &files {
        sdflow_core::io::safetensors::write(path, tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &BTreeMap::new()).unwrap();
    }
    files.into_iter().map(|(p, _)| p).collect()
}

/// FLUX.1's files as people download them, tiny, under `root/models`: the dev, schnell and
/// Kontext transformers alone in BFL's names (`diffusion_models/flux1-{dev,schnell,kontext-dev}.safetensors`),
/// T5-XXL's encoder (`text_encoders/t5xxl_fp16.safetensors`), CLIP-L
/// (`text_encoders/clip_l.safetensors`, unless one is there), the 16-channel `vae/ae.safetensors`,
/// and all of them in one file as ComfyUI packs them (`checkpoints/flux1-schnell-fp8.safetensors`).
/// `specs` as f32 safetensors at `dir/file` (seeded), unless the file is there already.
fn write_once(dir: &Path, file: &str, specs: &[sdflow_core::synth::TensorSpec], config: &str, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(file);
    if !path.exists() {
        sdflow_core::synth::write_specs(&path, specs, config, DType::F32, seed, Format::Safetensors).unwrap();
    }
}

/// Tiny random-weight SD3.5 medium files in the layouts people download, beside FLUX's
/// (whose CLIP-L, T5-XXL and 16-channel VAE they share): `clip_g.safetensors`, the MMDiT
/// alone (`diffusion_models/sd3.5_medium.safetensors`), Stability's checkpoint of MMDiT and
/// VAE (`checkpoints/sd3.5_medium.safetensors`), and ComfyUI's all-in-one with the text
/// encoders too, under the name its template asks for (`sd3.5_large_fp8_scaled.safetensors`).
pub fn write_sd3_models(root: &Path) {
    use sdflow_core::synth::dit::{ae_tensors, clip_g_tensors, clip_l_tensors, tiny_ae_config, tiny_clip_g, Sd3Synth, T5Synth};
    use sdflow_core::synth::TensorSpec;
    write_flux_models(root);
    let models = root.join("models");
    let write = |dir: &str, file: &str, specs: &[TensorSpec], config: String, seed: u64| write_once(&models.join(dir), file, specs, &config, seed);
    let g = tiny_clip_g();
    write("text_encoders", "clip_g.safetensors", &clip_g_tensors(&g), serde_json::to_string(&g).unwrap(), 31);
    let mmdit = Sd3Synth::tiny();
    write("diffusion_models", "sd3.5_medium.safetensors", &mmdit.tensors(), serde_json::to_string(&mmdit).unwrap(), 32);
    let prefixed = |p: &str, specs: Vec<TensorSpec>| -> Vec<TensorSpec> { specs.into_iter().map(|t| TensorSpec { name: format!("{p}{}", t.name), ..t }).collect() };
    let ae = tiny_ae_config();
    let stability = [prefixed("model.diffusion_model.", mmdit.tensors()), prefixed("first_stage_model.", ae_tensors(&ae))].concat();
    write("checkpoints", "sd3.5_medium.safetensors", &stability, "tiny SD3.5 medium, MMDiT and VAE".into(), 32);
    let all = [
        stability,
        prefixed("text_encoders.clip_l.transformer.", clip_l_tensors(&SdConfig::tiny_sd1().text)),
        prefixed("text_encoders.clip_g.transformer.", clip_g_tensors(&g)),
        prefixed("text_encoders.t5xxl.transformer.", T5Synth::tiny().tensors()),
    ]
    .concat();
    write("checkpoints", "sd3.5_large_fp8_scaled.safetensors", &all, "all-in-one tiny SD3.5".into(), 33);
}

pub fn write_flux_models(root: &Path) {
    use sdflow_core::synth::dit::{ae_tensors, clip_l_tensors, tiny_ae_config, FluxSynth, T5Synth};
    use sdflow_core::synth::TensorSpec;
    let models = root.join("models");
    let write = |dir: &str, file: &str, specs: &[TensorSpec], config: String, seed: u64| write_once(&models.join(dir), file, specs, &config, seed);
    // Kontext dev is FLUX.1 dev's architecture.
    for (file, guidance, seed) in [("flux1-dev.safetensors", true, 21), ("flux1-schnell.safetensors", false, 22), ("flux1-kontext-dev.safetensors", true, 27)] {
        let f = FluxSynth::tiny(guidance);
        write("diffusion_models", file, &f.tensors(), serde_json::to_string(&f).unwrap(), seed);
    }
    let chroma = FluxSynth::tiny_chroma();
    write("diffusion_models", "Chroma1-HD-fp8mixed.safetensors", &chroma.tensors(), serde_json::to_string(&chroma).unwrap(), 29);
    let loras = models.join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    if !loras.join("flux_kohya.safetensors").exists() {
        write_flux_lora(&loras.join("flux_kohya.safetensors"), "kohya");
    }
    let fill = FluxSynth::tiny_fill();
    write("diffusion_models", "flux1-fill-dev.safetensors", &fill.tensors(), serde_json::to_string(&fill).unwrap(), 28);
    let t5 = T5Synth::tiny();
    write("text_encoders", "t5xxl_fp16.safetensors", &t5.tensors(), serde_json::to_string(&t5).unwrap(), 23);
    let clip = SdConfig::tiny_sd1().text;
    write("text_encoders", "clip_l.safetensors", &clip_l_tensors(&clip), serde_json::to_string(&clip).unwrap(), 24);
    let ae = tiny_ae_config();
    write("vae", "ae.safetensors", &ae_tensors(&ae), serde_json::to_string(&ae).unwrap(), 25);
    // ComfyUI's all-in-one layout (`flux1-schnell-fp8.safetensors`): every part under its prefix.
    let prefixed = |p: &str, specs: Vec<TensorSpec>| -> Vec<TensorSpec> { specs.into_iter().map(|t| TensorSpec { name: format!("{p}{}", t.name), ..t }).collect() };
    let all = [
        prefixed("model.diffusion_model.", FluxSynth::tiny(false).tensors()),
        prefixed("text_encoders.clip_l.transformer.", clip_l_tensors(&clip)),
        prefixed("text_encoders.t5xxl.transformer.", t5.tensors()),
        prefixed("vae.", ae_tensors(&ae)),
    ]
    .concat();
    write("checkpoints", "flux1-schnell-fp8.safetensors", &all, "all-in-one tiny FLUX.1 schnell".into(), 26);
}

/// Tiny random-weight Z-Image files in the layouts people download, beside FLUX's (whose
/// 16-channel `ae` Z-Image decodes with): the transformer alone in the release's names
/// (`diffusion_models/z_image_turbo_bf16.safetensors`; the base model's
/// `z_image_bf16.safetensors` beside it), the Turbo file in diffusers' names
/// (`diffusion_models/z_image_turbo_diffusers.safetensors`), and Qwen3 in Hugging Face's
/// (`text_encoders/qwen_3_4b.safetensors`).
pub fn write_z_image_models(root: &Path) {
    use sdflow_core::synth::dit::{LlmSynth, ZImageSynth};
    write_flux_models(root);
    let models = root.join("models");
    let z = ZImageSynth::tiny();
    write_once(&models.join("diffusion_models"), "z_image_turbo_bf16.safetensors", &z.tensors(), &serde_json::to_string(&z).unwrap(), 41);
    // The base model: the same architecture, other weights.
    write_once(&models.join("diffusion_models"), "z_image_bf16.safetensors", &z.tensors(), &serde_json::to_string(&z).unwrap(), 43);
    let twin = models.join("diffusion_models/z_image_turbo_diffusers.safetensors");
    if !twin.exists() {
        write_diffusers_twin(&models.join("diffusion_models/z_image_turbo_bf16.safetensors"), &twin, &sdflow_core::models::z_image::diffusers::LAYOUT, z.hidden);
    }
    let q = LlmSynth::tiny_qwen3();
    write_once(&models.join("text_encoders"), "qwen_3_4b.safetensors", &q.tensors(), &serde_json::to_string(&q).unwrap(), 42);
}

/// Tiny random-weight FLUX.2 klein files in the layouts people download: the transformer
/// in BFL's names (`diffusion_models/flux-2-klein-4b.safetensors`), its 28-layer Qwen3
/// (`text_encoders/qwen_3_4b_klein.safetensors`) and the 32-channel VAE
/// (`vae/flux2-vae.safetensors`); FLUX.2 dev beside them (`flux2_dev_fp8mixed.safetensors`, guidance
/// embedded) with its 30-layer Mistral (`mistral_3_small_flux2_bf16.safetensors`); the klein
/// transformer again in diffusers' names (`flux2_klein_diffusers.safetensors`).
pub fn write_flux2_models(root: &Path) {
    use sdflow_core::synth::dit::{flux2_vae_tensors, tiny_flux2_vae_config, Flux2Synth, LlmSynth};
    let models = root.join("models");
    let f = Flux2Synth::tiny_klein();
    write_once(&models.join("diffusion_models"), "flux-2-klein-4b.safetensors", &f.tensors(), &serde_json::to_string(&f).unwrap(), 51);
    let q = LlmSynth::tiny_qwen3_klein();
    write_once(&models.join("text_encoders"), "qwen_3_4b_klein.safetensors", &q.tensors(), &serde_json::to_string(&q).unwrap(), 52);
    let v = tiny_flux2_vae_config();
    write_once(&models.join("vae"), "flux2-vae.safetensors", &flux2_vae_tensors(&v), &serde_json::to_string(&v).unwrap(), 53);
    // The klein transformer in diffusers' names, as `Flux2Transformer2DModel` saves it.
    let twin = models.join("diffusion_models/flux2_klein_diffusers.safetensors");
    if !twin.exists() {
        write_diffusers_twin(&models.join("diffusion_models/flux-2-klein-4b.safetensors"), &twin, &sdflow_core::models::flux2::diffusers::LAYOUT, f.hidden);
    }
    let dev = Flux2Synth::tiny_dev();
    write_once(&models.join("diffusion_models"), "flux2_dev_fp8mixed.safetensors", &dev.tensors(), &serde_json::to_string(&dev).unwrap(), 54);
    // Mistral carries the whole 131,072-token vocabulary: bf16, as ComfyUI ships it.
    let m = LlmSynth::tiny_mistral();
    let path = models.join("text_encoders/mistral_3_small_flux2_bf16.safetensors");
    if !path.exists() {
        sdflow_core::synth::write_specs(&path, &m.tensors(), &serde_json::to_string(&m).unwrap(), DType::BF16, 55, Format::Safetensors).unwrap();
    }
}

/// Tiny random-weight Qwen-Image files in the layouts people download: the MMDiT in the
/// release's names (`diffusion_models/qwen_image_bf16.safetensors`, and the same
/// architecture, other weights, as the Edit models' `qwen_image_edit_bf16.safetensors` and
/// `qwen_image_edit_2509_bf16.safetensors`; with `addition_t_embedding`, the Layered
/// model's `qwen_image_layered_bf16.safetensors` beside its RGBA VAE
/// `vae/qwen_image_layered_vae.safetensors`), Qwen2.5-VL in Hugging Face's names with its
/// vision tower (`text_encoders/qwen_2.5_vl_7b.safetensors`, bf16: it carries the whole
/// vocabulary at a 128-wide head) and the Wan-2.1 VAE in Wan's names with its 5-D kernels
/// (`vae/qwen_image_vae.safetensors`); the vision tower alone as sd-cli's `--llm_vision`
/// file (`text_encoders/qwen_2.5_vl_7b_vision.safetensors`).
pub fn write_qwen_image_models(root: &Path) {
    use sdflow_core::synth::dit::{qwen25_vl_vision_tensors, wan_vae_tensors, LlmSynth, QwenImageSynth};
    let models = root.join("models");
    let q = QwenImageSynth::tiny();
    let config = serde_json::to_string(&q).unwrap();
    write_once(&models.join("diffusion_models"), "qwen_image_bf16.safetensors", &q.tensors(), &config, 61);
    write_once(&models.join("diffusion_models"), "qwen_image_edit_bf16.safetensors", &q.tensors(), &config, 64);
    write_once(&models.join("diffusion_models"), "qwen_image_edit_2509_bf16.safetensors", &q.tensors(), &config, 65);
    let l = LlmSynth::tiny_qwen25_vl();
    let dir = models.join("text_encoders");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen_2.5_vl_7b.safetensors");
    if !path.exists() {
        let specs = [l.tensors(), qwen25_vl_vision_tensors(160, 2, 64, l.hidden)].concat();
        sdflow_core::synth::write_specs(&path, &specs, &serde_json::to_string(&l).unwrap(), DType::BF16, 62, Format::Safetensors).unwrap();
    }
    write_once(&models.join("vae"), "qwen_image_vae.safetensors", &wan_vae_tensors(8, 16), "tiny Wan-2.1 VAE, base 8, z 16", 63);
    // The vision tower alone (sd-cli's --llm_vision).
    write_once(&dir, "qwen_2.5_vl_7b_vision.safetensors", &qwen25_vl_vision_tensors(160, 2, 64, l.hidden), "tiny Qwen2.5-VL vision tower", 66);
    // Qwen-Image-Layered: the transformer with its extra timestep embedding, the RGBA VAE.
    let layered = QwenImageSynth { layered: true, ..q };
    write_once(&models.join("diffusion_models"), "qwen_image_layered_bf16.safetensors", &layered.tensors(), &serde_json::to_string(&layered).unwrap(), 67);
    write_once(&models.join("vae"), "qwen_image_layered_vae.safetensors", &sdflow_core::synth::dit::wan_vae_tensors_for(8, 16, 4), "tiny Qwen-Image-Layered VAE (RGBA), base 8, z 16", 68);
}

/// Tiny random-weight Wan 2.1 files under the names ComfyUI's templates use: the T2V
/// transformer in the release's names (`diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors`),
/// UMT5 with its whole vocabulary in bf16 (`text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors`)
/// and the Wan-2.1 VAE with its 5-D kernels (`vae/wan_2.1_vae.safetensors`); Wan 2.2
/// A14B's high- and low-noise experts (`wan2.2_t2v_{high,low}_noise_14B_fp16.safetensors`); the I2V
/// transformer (`wan2.1_i2v_480p_14B_fp16.safetensors`) with the tiny CLIP vision tower it
/// reads (`clip_vision/clip_vision_h.safetensors`).
pub fn write_wan_models(root: &Path) {
    use sdflow_core::synth::dit::{wan_vae_tensors, T5Synth, WanSynth};
    use sdflow_core::synth::ClipVisionSynth;
    let models = root.join("models");
    let w = WanSynth::tiny();
    write_once(&models.join("diffusion_models"), "wan2.1_t2v_1.3B_fp16.safetensors", &w.tensors(), &serde_json::to_string(&w).unwrap(), 71);
    // Wan 2.2 A14B's two experts: the T2V architecture, other weights each.
    write_once(&models.join("diffusion_models"), "wan2.2_t2v_high_noise_14B_fp16.safetensors", &w.tensors(), &serde_json::to_string(&w).unwrap(), 76);
    write_once(&models.join("diffusion_models"), "wan2.2_t2v_low_noise_14B_fp16.safetensors", &w.tensors(), &serde_json::to_string(&w).unwrap(), 77);
    let vision = ClipVisionSynth::tiny();
    let i2v = WanSynth { in_channels: 36, image_dim: Some(vision.hidden), ..w };
    write_once(&models.join("diffusion_models"), "wan2.1_i2v_480p_14B_fp16.safetensors", &i2v.tensors(), &serde_json::to_string(&i2v).unwrap(), 74);
    // FLF2V: positions for a start and an end image's tokens.
    let flf = WanSynth { image_positions: 2 * vision.tokens(), ..i2v.clone() };
    write_once(&models.join("diffusion_models"), "wan2.1_flf2v_720p_14B_fp16.safetensors", &flf.tensors(), &serde_json::to_string(&flf).unwrap(), 78);
    let cv = models.join("clip_vision/clip_vision_h.safetensors");
    if !cv.exists() {
        std::fs::create_dir_all(cv.parent().unwrap()).unwrap();
        sdflow_core::synth::write_tensors(&cv, &vision.tensors().unwrap(), 75).unwrap();
    }
    let t = T5Synth::tiny_umt5();
    let dir = models.join("text_encoders");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("umt5_xxl_fp8_e4m3fn_scaled.safetensors");
    if !path.exists() {
        sdflow_core::synth::write_specs(&path, &t.tensors(), &serde_json::to_string(&t).unwrap(), DType::BF16, 72, Format::Safetensors).unwrap();
    }
    write_once(&models.join("vae"), "wan_2.1_vae.safetensors", &wan_vae_tensors(8, 16), "tiny Wan-2.1 VAE, base 8, z 16", 73);
    // Wan 2.1 VACE: a VACE block after each block, and a control video's frames.
    let vace = WanSynth { vace_layers: 2, ..w.clone() };
    write_once(&models.join("diffusion_models"), "wan2.1_vace_1.3B_fp16.safetensors", &vace.tensors(), &serde_json::to_string(&vace).unwrap(), 81);
    let frames = root.join("input/control_video");
    if !frames.exists() {
        std::fs::create_dir_all(&frames).unwrap();
        for i in 0..5 {
            write_test_png(&frames.join(format!("frame_{i:03}.png")), 48 + 4 * i as u32, 40);
        }
    }
    // The same motion as a video file (LoadVideo's): a bar sweeping across 5 frames.
    let clip = root.join("input/control.mp4");
    if !clip.exists() {
        let (w, h) = (48usize, 40usize);
        let rgb: Vec<u8> = (0..5).flat_map(|f| (0..h * w).flat_map(move |p| if (p % w) / 8 == f { [230, 200, 40] } else { [30, 60, (p / w * 5) as u8] })).collect();
        let mp4 = sdflow_nodes::video::encode::h264_mp4(sdflow_nodes::video::encode::Rgb8Frames { data: &rgb, width: w, height: h }, 16.0).unwrap();
        std::fs::write(&clip, mp4).unwrap();
    }
    // Wan 2.2 TI2V 5B and its VAE (48 channels, 16x).
    let ti2v = WanSynth { in_channels: 48, out_channels: 48, ..w };
    write_once(&models.join("diffusion_models"), "wan2.2_ti2v_5B_fp16.safetensors", &ti2v.tensors(), &serde_json::to_string(&ti2v).unwrap(), 79);
    write_once(&models.join("vae"), "wan2.2_vae.safetensors", &sdflow_core::synth::dit::wan22_vae_tensors(8, 12, 48), "tiny Wan 2.2 VAE, base 8, decoder base 12, z 48", 80);
}

/// A rank-2 LoRA on the tiny FLUX dev's double block's image q/k/v and single block's
/// `linear1`, written in one of the namings trainers use: kohya (fused, `lora_unet_…`),
/// diffusers/PEFT (`transformer.…`, one module per q, k, v and the MLP part, as ai-toolkit
/// writes), or ComfyUI's (`diffusion_model.…`). Every naming carries the same products.
pub fn write_flux_lora(path: &std::path::Path, naming: &str) {
    use sdflow_core::synth::dit::FluxSynth;
    let f = FluxSynth::tiny(true);
    let (d, r) = (f.hidden, 2usize);
    let rows1 = 3 * d + f.hidden * f.mlp_ratio;
    let vals = |n: usize, seed: usize| -> Vec<f32> { (0..n).map(|i| (((i * 7919 + seed * 104729) % 1000) as f32 / 1000.0 - 0.5) * 0.2).collect() };
    let (down_qkv, up_qkv, down_1, up_1) = (vals(r * d, 1), vals(3 * d * r, 2), vals(r * d, 3), vals(rows1 * r, 4));
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut module = |name: String, down: &[f32], up: &[f32], out: usize, peft: bool| {
        let (dn, un) = if peft { ("lora_A.weight", "lora_B.weight") } else { ("lora_down.weight", "lora_up.weight") };
        tensors.push((format!("{name}.{dn}"), vec![r, d], down.to_vec()));
        tensors.push((format!("{name}.{un}"), vec![out, r], up.to_vec()));
        if !peft {
            tensors.push((format!("{name}.alpha"), vec![], vec![r as f32]));
        }
    };
    match naming {
        "kohya" => {
            module("lora_unet_double_blocks_0_img_attn_qkv".into(), &down_qkv, &up_qkv, 3 * d, false);
            module("lora_unet_single_blocks_0_linear1".into(), &down_1, &up_1, rows1, false);
        }
        "comfyui" => {
            module("diffusion_model.double_blocks.0.img_attn.qkv".into(), &down_qkv, &up_qkv, 3 * d, true);
            module("diffusion_model.single_blocks.0.linear1".into(), &down_1, &up_1, rows1, true);
        }
        _ => {
            for (i, n) in ["to_q", "to_k", "to_v"].iter().enumerate() {
                module(format!("transformer.transformer_blocks.0.attn.{n}"), &down_qkv, &up_qkv[i * d * r..(i + 1) * d * r], d, true);
                module(format!("transformer.single_transformer_blocks.0.attn.{n}"), &down_1, &up_1[i * d * r..(i + 1) * d * r], d, true);
            }
            module("transformer.single_transformer_blocks.0.proj_mlp".into(), &down_1, &up_1[3 * d * r..], rows1 - 3 * d, true);
        }
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    sdflow_core::io::safetensors::write(path, bytes.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &Default::default()).unwrap();
}

/// The diffusers-named twin of a single-file transformer at `single` (BFL's FLUX.1,
/// Stability's SD3), written to `out`: `layout`'s table run backwards (renamed, fused
/// tensors split — `hidden` rows for each part but the last, which takes the rest —, two-
/// chunk modulations' halves swapped). The forward direction is checked against diffusers'
/// converter in core's tests; this only feeds the loaders a diffusers-named file.
pub fn write_diffusers_twin(single: &Path, out: &Path, layout: &sdflow_core::models::dit::diffusers::Layout, hidden: usize) {
    let src = sdflow_core::io::open(single).unwrap();
    let tensors = diffusers_twin(src.as_ref(), "", layout, hidden);
    let dtype = src.tensors()[0].dtype;
    sdflow_core::io::safetensors::write(out, tensors.iter().map(|(n, s, b)| (n.as_str(), dtype, s.clone(), b.as_slice())), &std::collections::BTreeMap::new()).unwrap();
}

/// [`write_diffusers_twin`]'s tensors for the transformer under `prefix` of `src`.
fn diffusers_twin(src: &dyn sdflow_core::io::TensorSource, prefix: &str, layout: &sdflow_core::models::dit::diffusers::Layout, hidden: usize) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    use sdflow_core::models::dit::diffusers::Part;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let rows = |name: &str| {
        let t = src.get(name).unwrap();
        let bytes = src.read(name).unwrap().to_vec();
        let r = t.shape.first().copied().unwrap_or(1);
        (t.shape.clone(), bytes.len() / r, bytes)
    };
    let mut emit = |at: &str, from: &str, part: &Part| {
        let suffixes: &[&str] = if matches!(part, Part::Tensor(..)) { &[""] } else { &[".weight", ".bias"] };
        for suffix in suffixes {
            let (b, d) = match part {
                Part::Rename(b, d) | Part::Tensor(b, d) | Part::Modulation(b, d) => (*b, *d),
                Part::Fuse(b, _) => (*b, ""),
            };
            let name = format!("{prefix}{at}{b}{suffix}");
            if src.get(&name).is_none() {
                continue;
            }
            let (shape, row, bytes) = rows(&name);
            match part {
                Part::Rename(..) | Part::Tensor(..) => tensors.push((format!("{from}{d}{suffix}"), shape, bytes)),
                Part::Modulation(..) => {
                    let weight = src.get(&format!("{prefix}{at}{b}.weight")).unwrap().shape.clone();
                    let bytes = if weight.len() == 2 && weight[0] == 2 * weight[1] {
                        let half = bytes.len() / 2;
                        [&bytes[half..], &bytes[..half]].concat()
                    } else {
                        bytes
                    };
                    tensors.push((format!("{from}{d}{suffix}"), shape, bytes));
                }
                Part::Fuse(_, parts) => {
                    let mut first = 0;
                    for (k, p) in parts.iter().enumerate() {
                        let n = if k + 1 == parts.len() { shape[0] - first } else { hidden };
                        let mut s = shape.clone();
                        s[0] = n;
                        tensors.push((format!("{from}{p}{suffix}"), s, bytes[first * row..(first + n) * row].to_vec()));
                        first += n;
                    }
                }
            }
        }
    };
    for part in layout.top {
        emit("", "", part);
    }
    for (diff, single_name, parts) in layout.blocks {
        let n = (0..).take_while(|i| src.tensors().iter().any(|t| t.name.starts_with(&format!("{prefix}{single_name}.{i}.")))).count();
        for i in 0..n {
            for part in *parts {
                emit(&format!("{single_name}.{i}."), &format!("{diff}.{i}."), part);
            }
        }
    }
    tensors
}

/// A FLUX.1 or SD3 diffusers pipeline folder at `dir` (`transformer/`, `vae/`,
/// `text_encoder*/`, `model_index.json` naming `class`) made from ComfyUI's all-in-one
/// f32 checkpoint `ckpt`: the transformer as [`write_diffusers_twin`] writes it
/// (`hidden`: its width), the VAE as diffusers' converter cuts it
/// (core/tests/fixtures/models/ae_pipeline_names.json, from make_ae_pipeline_names.py),
/// the text encoders' Hugging Face names without the checkpoint's prefixes. FLUX's second
/// encoder is T5-XXL, SD3's OpenCLIP-G (its third T5-XXL).
pub fn write_dit_pipeline_folder(ckpt: &Path, dir: &Path, layout: &sdflow_core::models::dit::diffusers::Layout, hidden: usize, class: &str) {
    use sdflow_core::models::pipeline::{CLIP_G, CLIP_L, T5XXL};
    let src = sdflow_core::io::open(ckpt).unwrap();
    let write = |component: &str, tensors: &[(String, Vec<usize>, Vec<u8>)]| {
        std::fs::create_dir_all(dir.join(component)).unwrap();
        let file = if component.starts_with("text_encoder") { "model.safetensors" } else { "diffusion_pytorch_model.safetensors" };
        sdflow_core::io::safetensors::write(&dir.join(component).join(file), tensors.iter().map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.as_slice())), &std::collections::BTreeMap::new()).unwrap();
    };
    let under = |prefix: &str| -> Vec<(String, Vec<usize>, Vec<u8>)> {
        src.tensors().iter().filter_map(|t| Some((t.name.strip_prefix(prefix)?.to_string(), t.shape.clone(), src.read(&t.name).unwrap().to_vec()))).collect()
    };
    write("transformer", &diffusers_twin(src.as_ref(), "model.diffusion_model.", layout, hidden));
    let encoders: &[(&str, &str)] = if class == "FluxPipeline" { &[("text_encoder", CLIP_L), ("text_encoder_2", T5XXL)] } else { &[("text_encoder", CLIP_L), ("text_encoder_2", CLIP_G), ("text_encoder_3", T5XXL)] };
    for (component, prefix) in encoders {
        write(component, &under(prefix));
    }
    let vae_prefix = if src.get("vae.decoder.conv_in.weight").is_some() { "vae." } else { "first_stage_model." };
    let table: std::collections::BTreeMap<String, (String, String, usize, usize)> = serde_json::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/models/ae_pipeline_names.json")).unwrap()).unwrap();
    let ldm = under(vae_prefix);
    assert_eq!(table.len(), ldm.len(), "the table names every tensor of the tiny VAE");
    let vae: Vec<_> = table
        .iter()
        .map(|(name, (from, kind, _, _))| {
            let (_, shape, bytes) = ldm.iter().find(|t| &t.0 == from).unwrap_or_else(|| panic!("{from} not in the checkpoint"));
            assert_eq!(kind, "whole", "{name}");
            // diffusers' VAE attention is linear where LDM's is a 1×1 convolution.
            let shape = if shape.len() == 4 && name.contains("attentions") { shape[..2].to_vec() } else { shape.clone() };
            (name.clone(), shape, bytes.clone())
        })
        .collect();
    write("vae", &vae);
    std::fs::create_dir_all(dir.join("scheduler")).unwrap();
    std::fs::write(dir.join("scheduler/scheduler_config.json"), r#"{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0}"#).unwrap();
    std::fs::write(dir.join("model_index.json"), format!(r#"{{"_class_name": "{class}"}}"#)).unwrap();
}
