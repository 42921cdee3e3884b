#![allow(dead_code)]

use std::sync::Arc;

use parking_lot::Mutex;
use sdflow_executor::stub::{self, StubStats};
use sdflow_executor::{
    CancelToken, Event, Executor, ExecutorConfig, NodeSpec, Registry, RunError, RunOptions,
    RunReport, Workflow,
};
use serde_json::json;

pub fn registry() -> (Arc<Registry>, Arc<StubStats>) {
    let mut r = Registry::new();
    let stats = stub::register(&mut r);
    (Arc::new(r), stats)
}

pub fn executor_with(workers: usize) -> (Executor, Arc<StubStats>) {
    let (r, stats) = registry();
    let config = ExecutorConfig {
        workers,
        ..ExecutorConfig::default()
    };
    (Executor::new(r, config), stats)
}

pub fn executor() -> (Executor, Arc<StubStats>) {
    executor_with(2)
}

pub fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Records every event of the runs it is given to.
#[derive(Default, Clone)]
pub struct Recorder(pub Arc<Mutex<Vec<Event>>>);

impl Recorder {
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().clone()
    }
    pub fn kinds(&self) -> Vec<&'static str> {
        self.0.lock().iter().map(Event::kind).collect()
    }
}

impl sdflow_executor::EventSink for Recorder {
    fn send(&self, event: Event) {
        self.0.lock().push(event);
    }
}

pub fn run(ex: &Executor, wf: &Workflow) -> Result<RunReport, RunError> {
    ex.run(
        wf,
        &sdflow_executor::NullSink,
        &CancelToken::new(),
        &RunOptions::default(),
    )
}

pub fn run_ok(ex: &Executor, wf: &Workflow) -> RunReport {
    match run(ex, wf) {
        Ok(r) => r,
        Err(RunError::Invalid(report)) => panic!("invalid workflow:\n{}", report.render()),
        Err(e) => panic!("run failed: {e}"),
    }
}

pub fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort();
    v
}

/// constant(1) -> scale(2) -> combo(3) -> output(4), plus constant(5) -> output(6).
pub fn chain() -> Workflow {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(3))
            .with_const("size", json!(4)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubScale")
            .with_link("latent", "1", 0)
            .with_const("factor", json!(2.0)),
    );
    wf.add(
        "3",
        NodeSpec::new("StubCombo")
            .with_link("latent", "2", 0)
            .with_const("op", json!("negate")),
    );
    wf.add(
        "4",
        NodeSpec::new("StubOutput")
            .with_link("latent", "3", 0)
            .with_const("label", json!("a")),
    );
    wf.add(
        "5",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(9))
            .with_const("size", json!(2)),
    );
    wf.add(
        "6",
        NodeSpec::new("StubOutput")
            .with_link("latent", "5", 0)
            .with_const("label", json!("b")),
    );
    wf
}

pub fn ui_sum(report: &RunReport, node: &str) -> f64 {
    report.ui_outputs[node]["stub_tensors"][0]["sum"]
        .as_f64()
        .expect("sum in ui output")
}
