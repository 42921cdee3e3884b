//! Execution and caching, after ComfyUI's `tests/execution` suite.

mod common;

use std::sync::Arc;

use common::*;
use sdflow_executor::stub::constant_values;
use sdflow_executor::{
    CancelToken, Event, EventSink, Executor, ExecutorConfig, InputValue, NodeSpec, RunError,
    RunOptions, Workflow,
};
use serde_json::json;

#[test]
fn results_are_correct() {
    let (ex, _) = executor();
    let report = run_ok(&ex, &chain());
    let expected: f64 = constant_values(3, 4)
        .iter()
        .map(|v| -(v * 2.0) as f64)
        .sum();
    assert!((ui_sum(&report, "4") - expected).abs() < 1e-5);
    let expected_b: f64 = constant_values(9, 2).iter().map(|&v| v as f64).sum();
    assert!((ui_sum(&report, "6") - expected_b).abs() < 1e-6);
    assert_eq!(
        sorted(report.executed_ids()),
        vec!["1", "2", "3", "4", "5", "6"]
    );
    assert!(report.cached.is_empty());
}

#[test]
fn full_cache_hit() {
    let (ex, stats) = executor();
    let first = run_ok(&ex, &chain());
    assert_eq!(stats.total(), 6);
    let second = run_ok(&ex, &chain());
    assert!(
        second.executed.is_empty(),
        "ran again: {:?}",
        second.executed_ids()
    );
    assert_eq!(
        sorted(second.cached.iter().map(String::as_str).collect()),
        vec!["1", "2", "3", "4", "5", "6"]
    );
    assert_eq!(stats.total(), 6);
    // UI outputs of cached output nodes are reported again, as ComfyUI does.
    assert_eq!(second.ui_outputs, first.ui_outputs);
}

#[test]
fn widget_change_reruns_only_that_node_and_descendants() {
    let (ex, stats) = executor();
    run_ok(&ex, &chain());
    let mut wf = chain();
    wf.set_input("2", "factor", InputValue::Const(json!(3.0)))
        .unwrap();
    let report = run_ok(&ex, &wf);
    assert_eq!(sorted(report.executed_ids()), vec!["2", "3", "4"]);
    assert_eq!(
        stats.count("StubConstant"),
        2,
        "constants must come from the cache"
    );
    let expected: f64 = constant_values(3, 4)
        .iter()
        .map(|v| -(v * 3.0) as f64)
        .sum();
    assert!((ui_sum(&report, "4") - expected).abs() < 1e-5);
    // Changing it back hits the cache of the first run.
    wf.set_input("2", "factor", InputValue::Const(json!(2)))
        .unwrap();
    assert!(
        run_ok(&ex, &wf).executed.is_empty(),
        "2 and 2.0 are the same FLOAT"
    );
}

#[test]
fn cache_keys_ignore_node_ids_and_share_across_workflows() {
    let (ex, stats) = executor();
    run_ok(&ex, &chain());
    // The same constant -> scale branch under different ids, feeding a new output.
    let mut other = Workflow::new();
    other.add(
        "a",
        NodeSpec::new("StubConstant")
            .with_const("size", json!(4))
            .with_const("seed", json!(3)),
    );
    other.add(
        "b",
        NodeSpec::new("StubScale")
            .with_link("latent", "a", 0)
            .with_const("factor", json!(2.0)),
    );
    other.add(
        "c",
        NodeSpec::new("StubCombo")
            .with_link("latent", "b", 0)
            .with_const("op", json!("square")),
    );
    other.add(
        "d",
        NodeSpec::new("StubOutput")
            .with_link("latent", "c", 0)
            .with_const("label", json!("other")),
    );
    let report = run_ok(&ex, &other);
    assert_eq!(sorted(report.executed_ids()), vec!["c", "d"]);
    assert_eq!(stats.count("StubScale"), 1);
    // And switching back still finds the first workflow's outputs.
    assert!(run_ok(&ex, &chain()).executed.is_empty());
}

#[test]
fn only_ancestors_of_outputs_run() {
    let (ex, stats) = executor();
    let mut wf = chain();
    wf.add(
        "dangling",
        NodeSpec::new("StubScale")
            .with_link("latent", "1", 0)
            .with_const("factor", json!(5.0)),
    );
    wf.add(
        "lonely",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(1)),
    );
    let report = run_ok(&ex, &wf);
    assert!(!report.was_executed("dangling") && !report.was_executed("lonely"));
    assert_eq!(stats.count("StubScale"), 1);
    assert_eq!(stats.count("StubConstant"), 2);
}

fn failing() -> Workflow {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
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
        NodeSpec::new("StubFail")
            .with_link("latent", "2", 0)
            .with_const("fail", json!(true))
            .with_const("message", json!("boom")),
    );
    wf.add(
        "4",
        NodeSpec::new("StubOutput")
            .with_link("latent", "3", 0)
            .with_const("label", json!("x")),
    );
    wf
}

#[test]
fn error_then_recovery() {
    let (ex, stats) = executor();
    let rec = Recorder::default();
    let err = ex
        .run(
            &failing(),
            &rec,
            &CancelToken::new(),
            &RunOptions::default(),
        )
        .unwrap_err();
    match &err {
        RunError::NodeFailed {
            node_id,
            class_type,
            error,
            report,
        } => {
            assert_eq!(node_id, "3");
            assert_eq!(class_type, "StubFail");
            assert_eq!(error.to_string(), "boom");
            assert_eq!(sorted(report.executed_ids()), vec!["1", "2"]);
        }
        other => panic!("expected a node failure, got {other}"),
    }
    let events = rec.events();
    let last = events.last().unwrap();
    match last {
        Event::ExecutionError {
            node_id,
            node_type,
            exception_type,
            exception_message,
            executed,
            ..
        } => {
            assert_eq!((node_id.as_str(), node_type.as_str()), ("3", "StubFail"));
            assert_eq!(exception_type, "RuntimeError");
            assert_eq!(exception_message, "boom");
            assert_eq!(
                sorted(executed.iter().map(String::as_str).collect()),
                vec!["1", "2"]
            );
        }
        other => panic!("last event should be execution_error, got {other:?}"),
    }
    assert!(!rec.kinds().contains(&"execution_success"));
    assert_eq!(stats.count("StubOutput"), 0);

    // Rerunning the broken workflow fails again at the same node: nothing was cached for it.
    assert!(matches!(
        run(&ex, &failing()),
        Err(RunError::NodeFailed { .. })
    ));
    assert_eq!(stats.count("StubFail"), 2);

    let mut fixed = failing();
    fixed
        .set_input("3", "fail", InputValue::Const(json!(false)))
        .unwrap();
    let report = run_ok(&ex, &fixed);
    assert_eq!(
        sorted(report.executed_ids()),
        vec!["3", "4"],
        "1 and 2 succeeded before and are cached"
    );
    assert_eq!(stats.count("StubScale"), 1);
    let expected: f64 = constant_values(1, 4).iter().map(|v| (v * 2.0) as f64).sum();
    assert!((ui_sum(&report, "4") - expected).abs() < 1e-5);
}

fn slow_workflow(steps: i64) -> Workflow {
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(5))
            .with_const("size", json!(4)),
    );
    wf.add(
        "2",
        NodeSpec::new("StubSlow")
            .with_link("latent", "1", 0)
            .with_const("steps", json!(steps))
            .with_const("step_ms", json!(2)),
    );
    wf.add(
        "3",
        NodeSpec::new("StubOutput")
            .with_link("latent", "2", 0)
            .with_const("label", json!("slow")),
    );
    wf
}

/// Cancels its run at the first progress event, from inside the slow node.
struct CancelOnProgress {
    token: CancelToken,
    inner: Recorder,
}

impl EventSink for CancelOnProgress {
    fn send(&self, event: Event) {
        if matches!(event, Event::Progress { .. }) {
            self.token.cancel();
        }
        self.inner.send(event);
    }
}

#[test]
fn cancellation_mid_run_then_clean_rerun() {
    let (ex, stats) = executor();
    let token = CancelToken::new();
    let sink = CancelOnProgress {
        token: token.clone(),
        inner: Recorder::default(),
    };
    let err = ex
        .run(&slow_workflow(200), &sink, &token, &RunOptions::default())
        .unwrap_err();
    match &err {
        RunError::Interrupted { node_id, report } => {
            assert_eq!(node_id.as_deref(), Some("2"));
            assert_eq!(report.executed_ids(), vec!["1"]);
        }
        other => panic!("expected interruption, got {other}"),
    }
    let progress = sink
        .inner
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Progress { .. }))
        .count();
    assert!(
        progress < 10,
        "the slow node must stop soon after cancellation, saw {progress} steps"
    );
    match sink.inner.events().last() {
        Some(Event::ExecutionInterrupted {
            node_id, node_type, ..
        }) => {
            assert_eq!(node_id.as_deref(), Some("2"));
            assert_eq!(node_type.as_deref(), Some("StubSlow"));
        }
        other => panic!("expected execution_interrupted last, got {other:?}"),
    }
    assert_eq!(stats.count("StubOutput"), 0);

    // A fresh token: the next run is unaffected and nothing partial was cached.
    let rec = Recorder::default();
    let report = ex
        .run(
            &slow_workflow(200),
            &rec,
            &CancelToken::new(),
            &RunOptions::default(),
        )
        .unwrap();
    assert_eq!(sorted(report.executed_ids()), vec!["2", "3"]);
    let progress = rec
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Progress { .. }))
        .count();
    assert_eq!(progress, 200);
    let expected: f64 = constant_values(5, 4).iter().map(|v| (v + 1.0) as f64).sum();
    assert!((ui_sum(&report, "3") - expected).abs() < 1e-5);
}

#[test]
fn cancelled_before_start_runs_nothing() {
    let (ex, stats) = executor();
    let token = CancelToken::new();
    token.cancel();
    let err = ex
        .run(
            &chain(),
            &sdflow_executor::NullSink,
            &token,
            &RunOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, RunError::Interrupted { .. }));
    assert_eq!(stats.total(), 0);
    assert_eq!(run_ok(&ex, &chain()).executed.len(), 6);
}

#[test]
fn two_runs_queued_back_to_back() {
    let (ex, _) = executor();
    let ex = Arc::new(ex);
    let mut other = slow_workflow(30);
    other
        .set_input("1", "seed", InputValue::Const(json!(77)))
        .unwrap();
    let workflows = [slow_workflow(30), other];
    let recorders: Vec<Recorder> = (0..2).map(|_| Recorder::default()).collect();
    let shared = Recorder::default();
    struct Both(Recorder, Recorder);
    impl EventSink for Both {
        fn send(&self, e: Event) {
            self.0.send(e.clone());
            self.1.send(e);
        }
    }
    let reports: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = workflows
            .iter()
            .zip(&recorders)
            .map(|(wf, rec)| {
                let ex = ex.clone();
                let sink = Both(rec.clone(), shared.clone());
                s.spawn(move || ex.run(wf, &sink, &CancelToken::new(), &RunOptions::default()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    assert_ne!(reports[0].run_id, reports[1].run_id);
    for (i, rec) in recorders.iter().enumerate() {
        let kinds = rec.kinds();
        assert_eq!(kinds.first(), Some(&"execution_start"));
        assert_eq!(kinds.last(), Some(&"execution_success"));
        assert!(rec
            .events()
            .iter()
            .all(|e| e.prompt_id() == reports[i].run_id));
    }
    for (i, seed) in [5u64, 77].into_iter().enumerate() {
        let expected: f64 = constant_values(seed, 4)
            .iter()
            .map(|v| (v + 1.0) as f64)
            .sum();
        assert!((ui_sum(&reports[i], "3") - expected).abs() < 1e-5);
    }
    // Runs are served one at a time: one run's events all come before the other's.
    let ids: Vec<String> = shared
        .events()
        .iter()
        .map(|e| e.prompt_id().to_string())
        .collect();
    let switches = ids.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(switches, 1, "events of the two runs interleaved");
}

#[test]
fn event_sequence_follows_comfyui() {
    let (ex, _) = executor_with(1);
    let rec = Recorder::default();
    let opts = RunOptions {
        run_id: Some("run-1".into()),
        ..RunOptions::default()
    };
    ex.run(&slow_workflow(4), &rec, &CancelToken::new(), &opts)
        .unwrap();
    let kinds = rec.kinds();
    assert_eq!(
        kinds,
        vec![
            "execution_start",
            "execution_cached",
            "executing",
            "executing",
            "progress",
            "progress",
            "preview",
            "progress",
            "progress",
            "executing",
            "executed",
            "executing",
            "execution_success"
        ]
    );
    let events = rec.events();
    assert!(events.iter().all(|e| e.prompt_id() == "run-1"));
    let Event::Executing { node: None, .. } = &events[11] else {
        panic!("run end is executing(null)")
    };
    let json = serde_json::to_value(&events[4]).unwrap();
    assert_eq!(
        json,
        json!({"type": "progress", "data": {"prompt_id": "run-1", "node": "2", "value": 1, "max": 4}})
    );
    let Event::Preview { image, .. } = &events[6] else {
        panic!()
    };
    assert_eq!(image.data.len(), 12);

    // Second run: everything is reported cached, the output's UI output is re-sent.
    let rec = Recorder::default();
    ex.run(&slow_workflow(4), &rec, &CancelToken::new(), &opts)
        .unwrap();
    assert_eq!(
        rec.kinds(),
        vec![
            "execution_start",
            "execution_cached",
            "executed",
            "executing",
            "execution_success"
        ]
    );
    let Event::ExecutionCached { nodes, .. } = &rec.events()[1] else {
        panic!()
    };
    assert_eq!(
        sorted(nodes.iter().map(String::as_str).collect()),
        vec!["1", "2", "3"]
    );
}

#[test]
fn independent_cpu_nodes_run_concurrently() {
    // Each rendezvous node waits until the other is running too; run one after the
    // other, the first would time out and fail.
    let (ex, _) = executor_with(2);
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(2)),
    );
    for (r, o) in [("r1", "o1"), ("r2", "o2")] {
        wf.add(
            r,
            NodeSpec::new("StubRendezvous")
                .with_link("latent", "1", 0)
                .with_const("parties", json!(2)),
        );
        wf.add(
            o,
            NodeSpec::new("StubOutput")
                .with_link("latent", r, 0)
                .with_const("label", json!(o)),
        );
    }
    let report = run_ok(&ex, &wf);
    assert_eq!(report.executed.len(), 5);
}

#[test]
fn one_compute_node_per_device() {
    let (ex, stats) = executor_with(4);
    let mut wf = Workflow::new();
    wf.add(
        "c",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(2)),
    );
    for i in 0..4 {
        let s = format!("s{i}");
        wf.add(
            s.clone(),
            NodeSpec::new("StubSlowDevice")
                .with_link("latent", "c", 0)
                .with_const("steps", json!(3 + i))
                .with_const("step_ms", json!(5)),
        );
        wf.add(
            format!("o{i}"),
            NodeSpec::new("StubOutput")
                .with_link("latent", s, 0)
                .with_const("label", json!("o")),
        );
    }
    run_ok(&ex, &wf);
    assert_eq!(stats.count("StubSlowDevice"), 4);
    assert_eq!(stats.max_concurrency(sdflow_executor::stub::STUB_DEVICE), 1);
}

#[test]
fn fingerprint_reruns_when_file_content_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    std::fs::write(&path, [0u8, 255, 51]).unwrap();
    let (ex, stats) = executor();
    let mut wf = Workflow::new();
    wf.add(
        "1",
        NodeSpec::new("StubReadFile").with_const("path", json!(path.to_str().unwrap())),
    );
    wf.add(
        "2",
        NodeSpec::new("StubOutput")
            .with_link("latent", "1", 0)
            .with_const("label", json!("f")),
    );
    let r = run_ok(&ex, &wf);
    assert!((ui_sum(&r, "2") - 1.2).abs() < 1e-6);
    assert!(run_ok(&ex, &wf).executed.is_empty());
    std::fs::write(&path, [255u8, 255, 255, 255]).unwrap();
    let r = run_ok(&ex, &wf);
    assert_eq!(sorted(r.executed_ids()), vec!["1", "2"]);
    assert!((ui_sum(&r, "2") - 4.0).abs() < 1e-6);
    assert_eq!(stats.count("StubReadFile"), 2);
    // A missing file fails at that node before anything runs.
    std::fs::remove_file(&path).unwrap();
    match run(&ex, &wf) {
        Err(RunError::NodeFailed { node_id, error, .. }) => {
            assert_eq!(node_id, "1");
            assert!(error.to_string().contains("data.bin"), "{error}");
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn model_handles_cost_no_cache_bytes_and_budget_evicts() {
    let (r, stats) = registry();
    let ex = Executor::new(
        r,
        ExecutorConfig {
            cache_budget_bytes: 64,
            workers: 1,
            ..ExecutorConfig::default()
        },
    );
    let mut wf = Workflow::new();
    wf.add(
        "m",
        NodeSpec::new("StubModelLoader").with_const("model_name", json!("tiny-b.safetensors")),
    );
    wf.add(
        "c",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(1))
            .with_const("size", json!(8)),
    );
    wf.add(
        "a",
        NodeSpec::new("StubApplyModel")
            .with_link("model", "m", 0)
            .with_link("latent", "c", 0),
    );
    wf.add(
        "o",
        NodeSpec::new("StubOutput")
            .with_link("latent", "a", 0)
            .with_const("label", json!("m")),
    );
    let r = run_ok(&ex, &wf);
    let expected: f64 = constant_values(1, 8)
        .iter()
        .map(|v| (v + 20.0) as f64)
        .sum();
    assert!((ui_sum(&r, "o") - expected).abs() < 1e-4);
    let s = ex.cache_stats();
    // Two 8-float tensors (32 bytes each), the model handle and the output node's empty outputs.
    assert_eq!(s.bytes, 64);
    assert_eq!(s.entries, 4);

    // A 16-float tensor (64 bytes) pushes older tensors out; the handle stays.
    let mut big = Workflow::new();
    big.add(
        "c",
        NodeSpec::new("StubConstant")
            .with_const("seed", json!(2))
            .with_const("size", json!(16)),
    );
    big.add(
        "o",
        NodeSpec::new("StubOutput")
            .with_link("latent", "c", 0)
            .with_const("label", json!("big")),
    );
    run_ok(&ex, &big);
    assert!(ex.cache_stats().bytes <= 64);
    assert!(ex.cache_stats().evictions >= 2);
    // The output node's (empty) outputs are cached too; a new label makes it run again.
    wf.set_input("o", "label", InputValue::Const(json!("m2")))
        .unwrap();
    let r = run_ok(&ex, &wf);
    assert!(
        !r.was_executed("m"),
        "the model handle must survive byte-budget eviction"
    );
    assert!(r.was_executed("c") && r.was_executed("a"));
    assert_eq!(stats.count("StubModelLoader"), 1);
}

#[test]
fn linked_widget_input() {
    let (ex, _) = executor();
    let mut wf = Workflow::new();
    wf.add("i", NodeSpec::new("StubInt").with_const("value", json!(11)));
    wf.add(
        "c",
        NodeSpec::new("StubConstant")
            .with_link("seed", "i", 0)
            .with_const("size", json!(3)),
    );
    wf.add(
        "o",
        NodeSpec::new("StubOutput")
            .with_link("latent", "c", 0)
            .with_const("label", json!("l")),
    );
    let r = run_ok(&ex, &wf);
    let expected: f64 = constant_values(11, 3).iter().map(|&v| v as f64).sum();
    assert!((ui_sum(&r, "o") - expected).abs() < 1e-6);
}

#[test]
fn output_dir_receives_files() {
    let dir = tempfile::tempdir().unwrap();
    let (ex, _) = executor();
    let opts = RunOptions {
        output_dir: Some(dir.path().to_path_buf()),
        ..RunOptions::default()
    };
    let r = ex
        .run(
            &chain(),
            &sdflow_executor::NullSink,
            &CancelToken::new(),
            &opts,
        )
        .unwrap();
    assert_eq!(r.ui_outputs["4"]["files"][0]["filename"], "a.txt");
    let text = std::fs::read_to_string(dir.path().join("a.txt")).unwrap();
    assert_eq!(text.lines().count(), 4);
}

#[test]
fn panicking_node_is_reported_not_propagated() {
    use sdflow_executor::{ExecContext, Inputs, Node, NodeError, NodeSchema, Outputs, Registry};
    struct Panics;
    impl Node for Panics {
        fn schema(&self) -> NodeSchema {
            NodeSchema::new("Panics").output_node()
        }
        fn execute(&self, _: &mut ExecContext<'_>, _: &Inputs) -> Result<Outputs, NodeError> {
            panic!("node bug")
        }
    }
    let mut r = Registry::new();
    r.register(Arc::new(Panics));
    let ex = Executor::new(Arc::new(r), ExecutorConfig::default());
    let mut wf = Workflow::new();
    wf.add("1", NodeSpec::new("Panics"));
    match run(&ex, &wf) {
        Err(RunError::NodeFailed { error, .. }) => {
            assert_eq!(error.to_string(), "node panicked: node bug")
        }
        other => panic!("expected failure, got {other:?}"),
    }
}
