//! Scheduling overhead on a 1,000-node stub graph: validation, a cold run (time not spent
//! inside nodes), and a fully cached re-run. Prints medians; `cargo bench -p sdflow-executor`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sdflow_executor::{
    stub, CancelToken, Executor, ExecutorConfig, NodeSpec, NullSink, Registry, RunOptions, Workflow,
};
use serde_json::json;

const NODES: usize = 1000;
const OUTPUTS: usize = 10;
const REPEATS: usize = 51;

/// A DAG: one constant, then scale/add/combo nodes each reading one or two earlier nodes,
/// with output nodes hanging off the last few.
fn graph() -> Workflow {
    let mut wf = Workflow::new();
    wf.add(
        "0",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(16)),
    );
    let compute = NODES - OUTPUTS;
    for i in 1..compute {
        let prev = (i - 1).to_string();
        let far = (i / 2).to_string();
        let spec = match i % 3 {
            0 => NodeSpec::new("StubAdd")
                .with_link("a", prev, 0)
                .with_link("b", far, 0),
            1 => NodeSpec::new("StubScale")
                .with_link("latent", prev, 0)
                .with_const("factor", json!(0.5 + (i % 7) as f64)),
            _ => NodeSpec::new("StubCombo")
                .with_link("latent", prev, 0)
                .with_const("op", json!("abs")),
        };
        wf.add(i.to_string(), spec);
    }
    for o in 0..OUTPUTS {
        let src = (compute - 1 - o * 3).to_string();
        wf.add(
            format!("out{o}"),
            NodeSpec::new("StubOutput")
                .with_link("latent", src, 0)
                .with_const("label", json!(format!("o{o}"))),
        );
    }
    wf
}

/// Median and minimum: on a shared machine the minimum shows the cost without preemption.
fn median(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0])
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let mut registry = Registry::new();
    stub::register(&mut registry);
    let registry = Arc::new(registry);
    let wf = graph();
    let text = wf.to_string_pretty();
    let cancel = CancelToken::new();
    let opts = RunOptions::default();

    let mut rows: Vec<(String, (Duration, Duration))> = Vec::new();
    let parse = (0..REPEATS)
        .map(|_| {
            let t = Instant::now();
            let _ = Workflow::parse(&text, &registry).expect("parses");
            t.elapsed()
        })
        .collect();
    rows.push(("parse (JSON -> workflow)".into(), median(parse)));

    for workers in [1usize, 4] {
        let ex = Executor::new(
            registry.clone(),
            ExecutorConfig {
                workers,
                ..ExecutorConfig::default()
            },
        );
        let validate = (0..REPEATS)
            .map(|_| {
                let t = Instant::now();
                let _ = ex.validate(&wf).expect("valid");
                t.elapsed()
            })
            .collect();
        if workers == 1 {
            rows.push(("validate".into(), median(validate)));
        }
        let plan = ex.validate(&wf).expect("valid");
        let (mut cold_total, mut cold_overhead, mut cold_planning) =
            (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..REPEATS {
            ex.clear_cache();
            let report = ex.run_plan(&plan, &NullSink, &cancel, &opts).expect("runs");
            assert_eq!(report.executed.len(), NODES);
            let in_nodes: Duration = report.executed.iter().map(|t| t.duration).sum();
            cold_total.push(report.total);
            cold_planning.push(report.planning);
            if workers == 1 {
                cold_overhead.push(report.total.saturating_sub(in_nodes));
            }
        }
        rows.push((
            format!("cold run, {workers} worker(s), total"),
            median(cold_total),
        ));
        rows.push((
            format!("cold run, {workers} worker(s), planning (keys + lookups)"),
            median(cold_planning),
        ));
        if workers == 1 {
            rows.push((
                "cold run, 1 worker, overhead outside nodes".into(),
                median(cold_overhead),
            ));
        }
        let cached_plan = (0..REPEATS)
            .map(|_| {
                let report = ex.run_plan(&plan, &NullSink, &cancel, &opts).expect("runs");
                assert!(report.executed.is_empty());
                report.total
            })
            .collect();
        let cached_full = (0..REPEATS)
            .map(|_| {
                let t = Instant::now();
                let report = ex.run(&wf, &NullSink, &cancel, &opts).expect("runs");
                assert!(report.executed.is_empty());
                t.elapsed()
            })
            .collect();
        rows.push((
            format!("cached re-run, {workers} worker(s), plan given"),
            median(cached_plan),
        ));
        rows.push((
            format!("cached re-run, {workers} worker(s), with validation"),
            median(cached_full),
        ));
    }

    println!(
        "scheduler benchmark: {NODES}-node stub graph ({OUTPUTS} outputs), {REPEATS} runs each"
    );
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    println!("  {:<width$}  {:>12}  {:>12}", "", "median", "min");
    for (name, (med, min)) in rows {
        println!("  {name:<width$}  {:>12}  {:>12}", ms(med), ms(min));
    }
}
