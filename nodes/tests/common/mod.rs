//! What the tests that check nodes against ComfyUI's own definitions share: the fixture,
//! a registry of every node, running one node, the fixture's tensors as sdflow's values, a
//! MODEL that is never loaded, and the `/object_info` comparison.
#![allow(dead_code, unused_macros, unused_imports)]

use sdflow_core::detect::ModelFamily;
use sdflow_core::models::conditioning::Prediction;
use sdflow_core::models::Weights;
use sdflow_core::residency::{Device, WeightKey};
use sdflow_core::sampling::flow::FlowShift;
use sdflow_core::sampling::schedule::DiscreteSchedule;
use sdflow_executor::{CancelToken, ExecContext, InputData, Inputs, NodeError, NullSink, Outputs, Registry};
use sdflow_nodes::values::{Image, Latent, Mask, ModelRef};
use sdflow_nodes::Runtime;
use serde_json::{json, Map, Value as Json};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `fixture!("fixtures/x/x.json")` defines `fn fixture() -> &'static Json`, the file (a path
/// from the test's own folder) parsed once.
macro_rules! fixture {
    ($path:literal) => {
        fn fixture() -> &'static serde_json::Value {
            static F: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
            F.get_or_init(|| serde_json::from_str(include_str!($path)).unwrap())
        }
    };
}
pub(crate) use fixture;

/// Every node registered on a runtime whose models and outputs live in a temporary folder.
pub struct Env {
    pub registry: Registry,
    pub rt: Arc<Runtime>,
    pub dir: tempfile::TempDir,
}

pub fn env(threads: usize) -> Env {
    let dir = tempfile::tempdir().unwrap();
    // Inputs come from the scratch folder, never the working directory's `input/`.
    let rt = Arc::new(Runtime::new(dir.path(), dir.path().join("out"), threads, sdflow_core::io::WeightType::Stored).unwrap().with_input_dir(dir.path().join("input")));
    let mut registry = Registry::new();
    sdflow_nodes::register_all(&mut registry, rt.clone());
    Env { registry, rt, dir }
}

impl Env {
    /// Runs one node on its own, outside a workflow.
    pub fn run(&self, node: &str, inputs: Vec<(&str, InputData)>) -> Result<Outputs, NodeError> {
        let (sink, cancel, abort) = (NullSink, CancelToken::new(), AtomicBool::new(false));
        let mut ctx = ExecContext::detached("1", &sink, &cancel, &abort);
        let mut ins = Inputs::new();
        for (k, v) in inputs {
            ins.insert(k, v);
        }
        self.registry.get(node).unwrap_or_else(|| panic!("{node} is not registered")).execute(&mut ctx, &ins)
    }

    /// A MODEL whose weights are never loaded: a residency handle, enough for the nodes that
    /// read only its sampling and latent format.
    pub fn model(&self, family: ModelFamily, prediction: Prediction, schedule: DiscreteSchedule, flow: Option<FlowShift>, latent_scale: f32, latent_shift: f32) -> ModelRef {
        let file = self.dir.path().join("unused.safetensors");
        std::fs::write(&file, b"x").unwrap();
        let key = WeightKey::new([&file], "", sdflow_core::io::WeightType::Stored, Device::Cpu).unwrap();
        let weights = self.rt.residency.get_or_load(key, || -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> { Err("not loaded in this test".into()) }).unwrap();
        ModelRef { weights, prefix: String::new(), family, prediction, latent: sdflow_nodes::values::LatentFormat::uniform(latent_scale, latent_shift), schedule, flow, ip_adapters: Vec::new(), motion: None, slg: None, differential_diffusion: None, cfg_hooks: Default::default(), circular: Default::default() }
    }
}

pub fn c(v: Json) -> InputData {
    InputData::Const(v)
}

/// A JSON list of numbers.
pub fn floats(v: &Json) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// A fixture tensor's shape.
pub fn dims(v: &Json) -> Vec<usize> {
    v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

/// An IMAGE from a [N, H, W, C] tensor.
pub fn image(v: &Json) -> Image {
    let s = dims(v);
    Image { data: floats(&v["data"]), n: s[0], height: s[1], width: s[2], channels: s[3] }
}

/// A MASK from a [N, H, W] tensor or a noise mask's [N, 1, H, W].
pub fn mask(v: &Json) -> Mask {
    let s = dims(v);
    Mask { data: floats(&v["data"]), n: s[0], height: s[s.len() - 2], width: s[s.len() - 1] }
}

/// A LATENT from the fixture's `{"samples", "noise_mask"?, "batch_index"?}`, its [N, C, H, W]
/// samples as sdflow's [W, H, C, N].
pub fn latent(v: &Json) -> Latent {
    let s = dims(&v["samples"]);
    Latent {
        samples: floats(&v["samples"]["data"]),
        shape: [s[3] as i64, s[2] as i64, s[1] as i64, s[0] as i64],
        noise_mask: (!v["noise_mask"].is_null()).then(|| Arc::new(mask(&v["noise_mask"]))),
        batch_index: v["batch_index"].as_array().map(|b| b.iter().map(|x| x.as_u64().unwrap() as usize).collect()),
        frames: 1,
    }
}

/// The output `i` of a node's outputs.
pub fn out<T: Clone + 'static>(o: &Outputs, i: usize) -> T {
    o.values[i].downcast_ref::<T>().unwrap_or_else(|| panic!("output {i} is {}", o.values[i].payload_type_name())).clone()
}

/// Each node's `/object_info` entry against ComfyUI's (built by a fixture generator from
/// ComfyUI's schema code): name, display name, category, description, output node,
/// outputs and their names, inputs in order with their types, choices and every option
/// ComfyUI states. Ours may state more: sdflow's schema builder always writes an INT/FLOAT
/// widget's default, limits and step, and a STRING widget's default, where ComfyUI's V3
/// inputs may leave them to the frontend; ComfyUI's V3 combos are `["COMBO", {"options": [...]}]`, ours `[[...], {}]`.
pub fn assert_object_info_matches(registry: &sdflow_executor::Registry, schemas: &Map<String, Json>) {
    for (name, theirs) in schemas {
        let ours = registry.schema(name).unwrap_or_else(|| panic!("{name} is not registered")).object_info();
        for key in ["name", "display_name", "category", "description", "output_node", "output", "output_name", "input_order"] {
            assert_eq!(ours[key], theirs[key], "{name}: {key}");
        }
        for (group, inputs) in theirs["input"].as_object().unwrap() {
            for (input, entry) in inputs.as_object().unwrap() {
                let mine = &ours["input"][group][input];
                let empty = json!({});
                let (t_type, t_opts) = (&entry[0], entry.get(1).unwrap_or(&empty));
                let (m_type, m_opts) = (&mine[0], mine.get(1).unwrap_or(&empty));
                let what = format!("{name}.{input}");
                if t_type == "COMBO" {
                    assert_eq!(m_type, &t_opts["options"], "{what}: choices");
                } else {
                    assert_eq!(m_type, t_type, "{what}: type");
                }
                for (k, v) in t_opts.as_object().unwrap() {
                    if t_type == "COMBO" && (k == "options" || k == "multiselect") {
                        continue;
                    }
                    let m = &m_opts[k];
                    let same = match (v.as_f64(), m.as_f64()) {
                        (Some(a), Some(b)) => a == b,
                        _ => v == m,
                    };
                    assert!(same, "{what}: {k} is {m}, ComfyUI's {v}");
                }
                for k in m_opts.as_object().unwrap().keys() {
                    assert!(t_opts.get(k).is_some() || ["default", "min", "max", "step"].contains(&k.as_str()), "{what}: ComfyUI has no `{k}`");
                }
            }
        }
    }
}
