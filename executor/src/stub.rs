//! A small node pack for testing the executor without models: tiny deterministic
//! tensors, per-class execution counters, a slow node, a failing node, an output node.
//!
//! The counters live in a [`StubStats`] shared by the nodes of one registry, so tests
//! running in parallel each see only their own executions.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::json;

use crate::events::{PreviewFormat, PreviewImage};
use crate::node::{ExecContext, Inputs, Lane, Node, NodeError, Outputs};
use crate::registry::Registry;
use crate::schema::{InputSpec, NodeSchema};
use crate::value::{CacheSize, IoType, Value};

/// The lane of `StubSlowDevice`, standing in for an accelerator.
pub const STUB_DEVICE: &str = "stub0";
const CATEGORY: &str = "testing/stub";

/// A tiny tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct StubTensor(pub Vec<f32>);

impl CacheSize for StubTensor {
    fn cache_bytes(&self) -> usize {
        self.0.len() * std::mem::size_of::<f32>()
    }
}

/// Stands in for a model handle: owned elsewhere, so it counts nothing in the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct StubModel {
    pub name: String,
    pub bias: f32,
}

impl CacheSize for StubModel {
    fn cache_bytes(&self) -> usize {
        0
    }
}

/// Execution counters and concurrency probes shared by one registry's stub nodes.
#[derive(Default)]
pub struct StubStats {
    counts: Mutex<HashMap<String, u64>>,
    lanes: Mutex<HashMap<String, (usize, usize)>>,
    meeting: Mutex<(u64, usize)>,
    met: Condvar,
}

impl StubStats {
    /// How many times nodes of `class` have executed.
    pub fn count(&self, class: &str) -> u64 {
        self.counts.lock().get(class).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.counts.lock().values().sum()
    }

    pub fn reset(&self) {
        self.counts.lock().clear();
        self.lanes.lock().clear();
    }

    /// The most nodes of one lane that were ever executing at the same time.
    pub fn max_concurrency(&self, lane: &str) -> usize {
        self.lanes.lock().get(lane).map(|l| l.1).unwrap_or(0)
    }

    fn record(&self, class: &str) {
        *self.counts.lock().entry(class.to_string()).or_insert(0) += 1;
    }

    fn enter(&self, lane: &str) {
        let mut l = self.lanes.lock();
        let e = l.entry(lane.to_string()).or_insert((0, 0));
        e.0 += 1;
        e.1 = e.1.max(e.0);
    }

    fn leave(&self, lane: &str) {
        if let Some(e) = self.lanes.lock().get_mut(lane) {
            e.0 -= 1;
        }
    }

    /// Blocks until `parties` callers are waiting; false on timeout.
    fn rendezvous(&self, parties: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut m = self.meeting.lock();
        let generation = m.0;
        m.1 += 1;
        if m.1 >= parties {
            m.0 += 1;
            m.1 = 0;
            self.met.notify_all();
            return true;
        }
        while m.0 == generation {
            if self.met.wait_until(&mut m, deadline).timed_out() {
                if m.0 == generation {
                    m.1 -= 1;
                    return false;
                }
                break;
            }
        }
        true
    }
}

fn latent(v: Vec<f32>) -> Value {
    Value::new(IoType::LATENT, StubTensor(v))
}

fn tensor<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a [f32], NodeError> {
    inputs.downcast::<StubTensor>(name).map(|t| t.0.as_slice())
}

// splitmix64: deterministic across platforms, unlike the std hasher.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The values `StubConstant` produces, for tests that check results.
pub fn constant_values(seed: u64, size: usize) -> Vec<f32> {
    (0..size as u64)
        .map(|i| (splitmix64(seed.wrapping_add(i)) >> 40) as f32 / (1u64 << 24) as f32)
        .collect()
}

type FingerprintFn = fn(&Inputs) -> Result<Option<Vec<u8>>, NodeError>;
type ExecFn =
    dyn Fn(&StubStats, &mut ExecContext<'_>, &Inputs) -> Result<Outputs, NodeError> + Send + Sync;

/// One stub node type: a schema plus a function, counting every execution.
struct StubNode {
    schema: NodeSchema,
    lane: Lane,
    stats: Arc<StubStats>,
    run: Box<ExecFn>,
    fingerprint: Option<FingerprintFn>,
}

impl Node for StubNode {
    fn schema(&self) -> NodeSchema {
        self.schema.clone()
    }

    fn lane(&self) -> Lane {
        self.lane.clone()
    }

    fn fingerprint(&self, inputs: &Inputs) -> Result<Option<Vec<u8>>, NodeError> {
        match self.fingerprint {
            Some(f) => f(inputs),
            None => Ok(None),
        }
    }

    fn execute(&self, ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        self.stats.record(&self.schema.name);
        (self.run)(&self.stats, ctx, inputs)
    }
}

fn slow(
    stats: &StubStats,
    lane: &str,
    ctx: &mut ExecContext<'_>,
    inputs: &Inputs,
) -> Result<Outputs, NodeError> {
    let values = tensor(inputs, "latent")?.to_vec();
    let steps = inputs.int("steps")?.max(1) as u64;
    let step = Duration::from_millis(inputs.int("step_ms")?.max(0) as u64);
    stats.enter(lane);
    let result = (|| {
        for s in 0..steps {
            ctx.check_cancelled()?;
            std::thread::sleep(step);
            ctx.progress(s + 1, steps);
            if s + 1 == steps.div_ceil(2) {
                let px: Vec<u8> = values
                    .iter()
                    .take(4)
                    .flat_map(|v| {
                        let b = (v.clamp(0.0, 1.0) * 255.0) as u8;
                        [b, b, b]
                    })
                    .collect();
                let width = (px.len() / 3) as u32;
                ctx.preview(PreviewImage {
                    format: PreviewFormat::Rgb8,
                    width,
                    height: 1,
                    data: px.into(),
                });
            }
        }
        Ok(Outputs::new(vec![latent(
            values.iter().map(|v| v + 1.0).collect(),
        )]))
    })();
    stats.leave(lane);
    result
}

/// Registers the stub pack and returns its counters.
pub fn register(registry: &mut Registry) -> Arc<StubStats> {
    let stats = Arc::new(StubStats::default());
    let mut add = |schema: NodeSchema, lane: Lane, run: Box<ExecFn>| {
        registry.register(Arc::new(StubNode {
            schema: schema.category(CATEGORY),
            lane,
            stats: stats.clone(),
            run,
            fingerprint: None,
        }));
    };

    add(
        NodeSchema::new("StubConstant")
            .display_name("Stub Constant")
            .description("A tensor of `size` deterministic values in [0, 1) from `seed`.")
            .input(InputSpec::seed("seed"))
            .input(InputSpec::int("size", 4).int_range(1, 1 << 20))
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            let size =
                usize::try_from(inputs.int("size")?).map_err(|_| NodeError::InvalidInput {
                    input: "size".into(),
                    message: "must be positive".into(),
                })?;
            Ok(Outputs::new(vec![latent(constant_values(
                inputs.uint("seed")?,
                size,
            ))]))
        }),
    );
    add(
        NodeSchema::new("StubModelLoader")
            .display_name("Stub Model Loader")
            .input(InputSpec::combo(
                "model_name",
                ["tiny-a.safetensors", "tiny-b.safetensors"],
            ))
            .output("MODEL", IoType::MODEL),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            let name = inputs.string("model_name")?.to_string();
            let bias = if name.starts_with("tiny-a") {
                10.0
            } else {
                20.0
            };
            Ok(Outputs::new(vec![Value::new(
                IoType::MODEL,
                StubModel { name, bias },
            )]))
        }),
    );
    add(
        NodeSchema::new("StubApplyModel")
            .display_name("Stub Apply Model")
            .input(InputSpec::link("model", IoType::MODEL))
            .input(InputSpec::link("latent", IoType::LATENT))
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            let model = inputs.downcast::<StubModel>("model")?;
            let t = tensor(inputs, "latent")?;
            Ok(Outputs::new(vec![latent(
                t.iter().map(|v| v + model.bias).collect(),
            )]))
        }),
    );
    add(
        NodeSchema::new("StubAdd")
            .display_name("Stub Add")
            .input(InputSpec::link("a", IoType::LATENT))
            .input(InputSpec::link("b", IoType::LATENT))
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            let (a, b) = (tensor(inputs, "a")?, tensor(inputs, "b")?);
            if a.len() != b.len() {
                return Err(NodeError::InvalidInput {
                    input: "b".into(),
                    message: format!("has {} values, a has {}", b.len(), a.len()),
                });
            }
            Ok(Outputs::new(vec![latent(
                a.iter().zip(b).map(|(x, y)| x + y).collect(),
            )]))
        }),
    );
    add(
        NodeSchema::new("StubScale")
            .display_name("Stub Scale")
            .input(InputSpec::link("latent", IoType::LATENT))
            .input(
                InputSpec::float("factor", 1.0)
                    .float_range(-100.0, 100.0)
                    .float_step(0.01),
            )
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            let f = inputs.float("factor")? as f32;
            Ok(Outputs::new(vec![latent(
                tensor(inputs, "latent")?.iter().map(|v| v * f).collect(),
            )]))
        }),
    );
    add(
        NodeSchema::new("StubCombo")
            .display_name("Stub Combo")
            .input(InputSpec::link("latent", IoType::LATENT))
            .input(
                InputSpec::combo("op", ["identity", "negate", "square", "abs"])
                    .combo_default("identity"),
            )
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            let op: fn(f32) -> f32 = match inputs.string("op")? {
                "identity" => |v| v,
                "negate" => |v| -v,
                "square" => |v| v * v,
                "abs" => f32::abs,
                other => {
                    return Err(NodeError::InvalidInput {
                        input: "op".into(),
                        message: format!("unknown op '{other}'"),
                    })
                }
            };
            Ok(Outputs::new(vec![latent(
                tensor(inputs, "latent")?.iter().map(|&v| op(v)).collect(),
            )]))
        }),
    );
    for (name, lane) in [
        ("StubSlow", Lane::Cpu),
        ("StubSlowDevice", Lane::Device(STUB_DEVICE.into())),
    ] {
        let lane_name = match &lane {
            Lane::Cpu => "cpu".to_string(),
            Lane::Device(d) => d.clone(),
        };
        add(
            NodeSchema::new(name)
                .description("Adds 1 after `steps` sleeps of `step_ms`, reporting progress and checking cancellation.")
                .input(InputSpec::link("latent", IoType::LATENT))
                .input(InputSpec::int("steps", 10).int_range(1, 100_000))
                .input(InputSpec::int("step_ms", 10).int_range(0, 60_000))
                .output("LATENT", IoType::LATENT),
            lane,
            Box::new(move |stats, ctx, inputs| slow(stats, &lane_name, ctx, inputs)),
        );
    }
    add(
        NodeSchema::new("StubFail")
            .display_name("Stub Fail")
            .description(
                "Fails with `message` while `fail` is set; passes the latent through otherwise.",
            )
            .input(InputSpec::link("latent", IoType::LATENT))
            .input(InputSpec::boolean("fail", true))
            .input(InputSpec::string("message", "stub failure"))
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|_, _, inputs| {
            if inputs.boolean("fail")? {
                return Err(NodeError::msg(inputs.string("message")?.to_string()));
            }
            Ok(Outputs::new(vec![inputs.value("latent")?.clone()]))
        }),
    );
    add(
        NodeSchema::new("StubInt")
            .display_name("Stub Int")
            .input(InputSpec::int("value", 0))
            .output("INT", IoType::INT),
        Lane::Cpu,
        Box::new(|_, _, inputs| Ok(Outputs::new(vec![Value::int(inputs.int("value")?)]))),
    );
    add(
        NodeSchema::new("StubRendezvous")
            .description(
                "Waits until `parties` rendezvous nodes are running at once; fails after 10 s.",
            )
            .input(InputSpec::link("latent", IoType::LATENT))
            .input(InputSpec::int("parties", 2).int_range(1, 64))
            .output("LATENT", IoType::LATENT),
        Lane::Cpu,
        Box::new(|stats, _, inputs| {
            let parties = inputs.int("parties")? as usize;
            if !stats.rendezvous(parties, Duration::from_secs(10)) {
                return Err(NodeError::msg(format!(
                    "only some of {parties} parties arrived"
                )));
            }
            Ok(Outputs::new(vec![inputs.value("latent")?.clone()]))
        }),
    );
    add(
        NodeSchema::new("StubOutput")
            .display_name("Stub Output")
            .description("Reports its tensor as a UI output; writes it to the output directory when there is one.")
            .input(InputSpec::link("latent", IoType::LATENT))
            .input(InputSpec::string("label", "output"))
            .output_node(),
        Lane::Cpu,
        Box::new(|_, ctx, inputs| {
            let t = tensor(inputs, "latent")?;
            let label = inputs.string("label")?;
            let sum: f64 = t.iter().map(|&v| f64::from(v)).sum();
            let mut ui = json!({
                "stub_tensors": [{ "label": label, "len": t.len(), "sum": sum, "head": &t[..t.len().min(8)] }]
            });
            if let Some(dir) = ctx.output_dir() {
                if label.is_empty() || label.contains(['/', '\\']) || label.starts_with('.') {
                    return Err(NodeError::InvalidInput {
                        input: "label".into(),
                        message: format!("'{label}' is not a plain file name"),
                    });
                }
                let filename = format!("{label}.txt");
                let text: String = t.iter().map(|v| format!("{v}\n")).collect();
                std::fs::write(dir.join(&filename), text)?;
                ui["files"] = json!([{ "filename": filename, "subfolder": "", "type": "output" }]);
            }
            Ok(Outputs::none().with_ui(ui))
        }),
    );

    registry.register(Arc::new(StubNode {
        schema: NodeSchema::new("StubReadFile")
            .display_name("Stub Read File")
            .description(
                "The bytes of a file as values in [0, 1]; re-runs when the file content changes.",
            )
            .category(CATEGORY)
            .input(InputSpec::string("path", ""))
            .output("LATENT", IoType::LATENT),
        lane: Lane::Cpu,
        stats: stats.clone(),
        run: Box::new(|_, _, inputs| {
            let path = inputs.string("path")?;
            let bytes = std::fs::read(path).map_err(|e| NodeError::InvalidInput {
                input: "path".into(),
                message: format!("{path}: {e}"),
            })?;
            Ok(Outputs::new(vec![latent(
                bytes.iter().map(|&b| f32::from(b) / 255.0).collect(),
            )]))
        }),
        // Like IS_CHANGED of ComfyUI's LoadImage: the content, not the name, decides.
        fingerprint: Some(|inputs| {
            let path = inputs.string("path")?;
            let bytes = std::fs::read(path).map_err(|e| NodeError::InvalidInput {
                input: "path".into(),
                message: format!("{path}: {e}"),
            })?;
            Ok(Some(blake3::hash(&bytes).as_bytes().to_vec()))
        }),
    }));
    stats
}
