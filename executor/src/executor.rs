//! Running plans: cache lookup by content key, then dependency-ordered execution on a small
//! worker pool that keeps one compute node per device lane.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::Value as Json;

use crate::cache::{CacheStats, OutputCache};
use crate::events::{now_ms, Event, EventSink};
use crate::node::{CancelToken, ExecContext, InputData, Lane, NodeError, Outputs};
use crate::plan::{finish_key, CacheKey, Plan, PlanNode};
use crate::registry::Registry;
use crate::validate::{validate, ValidationReport};
use crate::value::Value;
use crate::workflow::Workflow;

#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// Bytes of node outputs kept between runs.
    pub cache_budget_bytes: usize,
    /// Bounds the entry count too, since model handles count ~0 bytes each.
    pub max_cache_entries: usize,
    /// Worker threads per run; 1 runs every node on the calling thread.
    pub workers: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            cache_budget_bytes: 2 << 30,
            max_cache_entries: 100_000,
            workers: std::thread::available_parallelism()
                .map(|n| n.get().min(4))
                .unwrap_or(2),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The id events carry (ComfyUI's `prompt_id`); a UUID v4 when not given.
    pub run_id: Option<String>,
    /// Where output nodes write files.
    pub output_dir: Option<PathBuf>,
    /// Text to embed in files output nodes write (PNG text chunks): ComfyUI's `prompt`
    /// and `workflow`, A1111's `parameters`, … — the host decides (ComfyUI's hidden
    /// PROMPT / EXTRA_PNGINFO inputs).
    pub metadata: Vec<(String, String)>,
    /// Per image of a batch, by batch position: entries that replace those of `metadata`
    /// with the same key in that image's file (A1111's `parameters`, whose seed differs
    /// from image to image). Images past its end get `metadata` as it is.
    pub image_metadata: Vec<Vec<(String, String)>>,
}

#[derive(Clone, Debug)]
pub struct NodeTiming {
    pub node: String,
    pub class_type: String,
    pub duration: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub run_id: String,
    /// Nodes that ran, in the order they finished.
    pub executed: Vec<NodeTiming>,
    /// Nodes of the plan that did not need to run because their outputs, or those of
    /// every node depending on them, came from the cache.
    pub cached: Vec<String>,
    /// UI outputs by node id, from this run and from the cache.
    pub ui_outputs: BTreeMap<String, Json>,
    /// Time spent deciding what to run (keys, cache lookups), before the first node.
    pub planning: Duration,
    pub total: Duration,
}

impl RunReport {
    pub fn executed_ids(&self) -> Vec<&str> {
        self.executed.iter().map(|t| t.node.as_str()).collect()
    }

    pub fn was_executed(&self, node: &str) -> bool {
        self.executed.iter().any(|t| t.node == node)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Invalid(Box<ValidationReport>),
    #[error("node {node_id} ({class_type}) failed: {error}")]
    NodeFailed {
        node_id: String,
        class_type: String,
        error: Box<NodeError>,
        report: Box<RunReport>,
    },
    #[error("run interrupted")]
    Interrupted {
        node_id: Option<String>,
        report: Box<RunReport>,
    },
}

/// Hands runs the executor one at a time, in arrival order.
#[derive(Default)]
struct RunQueue {
    state: Mutex<(u64, u64)>,
    turn: Condvar,
}

struct Turn<'a>(&'a RunQueue);

impl RunQueue {
    fn wait_turn(&self) -> Turn<'_> {
        let mut s = self.state.lock();
        let ticket = s.0;
        s.0 += 1;
        while s.1 != ticket {
            self.turn.wait(&mut s);
        }
        Turn(self)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.state.lock().1 += 1;
        self.0.turn.notify_all();
    }
}

/// Runs workflows against one registry, keeping outputs cached across runs.
pub struct Executor {
    registry: Arc<Registry>,
    cache: Mutex<OutputCache>,
    queue: RunQueue,
    config: ExecutorConfig,
}

struct Job {
    index: usize,
    inputs: crate::node::Inputs,
}

struct Done {
    index: usize,
    result: Result<Outputs, NodeError>,
    duration: Duration,
}

struct RunShared<'a> {
    plan: &'a Plan,
    run_id: &'a str,
    sink: &'a dyn EventSink,
    cancel: &'a CancelToken,
    abort: &'a AtomicBool,
    output_dir: Option<&'a std::path::Path>,
    metadata: &'a [(String, String)],
    image_metadata: &'a [Vec<(String, String)>],
}

impl RunShared<'_> {
    fn execute(&self, job: Job) -> Done {
        let pn = &self.plan.nodes[job.index];
        self.sink.send(Event::Executing {
            prompt_id: self.run_id.to_string(),
            node: Some(pn.id.clone()),
        });
        let mut ctx = ExecContext {
            run_id: self.run_id,
            node_id: &pn.id,
            sink: self.sink,
            cancel: self.cancel,
            abort: self.abort,
            output_dir: self.output_dir,
            metadata: self.metadata,
            image_metadata: self.image_metadata,
        };
        let start = Instant::now();
        let result = match catch_unwind(AssertUnwindSafe(|| pn.node.execute(&mut ctx, &job.inputs)))
        {
            Ok(r) => r.and_then(|out| check_outputs(pn, out)),
            Err(panic) => Err(NodeError::Panic(panic_message(panic))),
        };
        Done {
            index: job.index,
            result,
            duration: start.elapsed(),
        }
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

// A node returning the wrong outputs is a bug in the node; catching it here keeps the
// error at that node instead of a confusing one downstream.
fn check_outputs(pn: &PlanNode, out: Outputs) -> Result<Outputs, NodeError> {
    if out.values.len() != pn.output_types.len() {
        return Err(NodeError::msg(format!(
            "{} returned {} output(s) but declares {}",
            pn.class_type,
            out.values.len(),
            pn.output_types.len()
        )));
    }
    for (i, (v, t)) in out.values.iter().zip(&pn.output_types).enumerate() {
        if !v.io_type().feeds(t) {
            return Err(NodeError::msg(format!(
                "{} output {i} is {} but declares {t}",
                pn.class_type,
                v.io_type()
            )));
        }
    }
    Ok(out)
}

/// Worker threads of one run.
struct ThreadPool {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Done>,
}

impl ThreadPool {
    fn submit(&mut self, job: Job) {
        if let Some(tx) = &self.jobs {
            // Workers live until `jobs` is dropped, so sending cannot fail here.
            let _ = tx.send(job);
        }
    }
}

enum Stop {
    Failed { index: usize, error: NodeError },
    Interrupted { index: Option<usize> },
}

impl Executor {
    pub fn new(registry: Arc<Registry>, config: ExecutorConfig) -> Self {
        let cache = OutputCache::new(config.cache_budget_bytes, config.max_cache_entries);
        Executor {
            registry,
            cache: Mutex::new(cache),
            queue: RunQueue::default(),
            config,
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.lock().stats()
    }

    pub fn clear_cache(&self) {
        self.cache.lock().clear();
    }

    pub fn validate(&self, wf: &Workflow) -> Result<Plan, Box<ValidationReport>> {
        validate(wf, &self.registry)
    }

    /// Validates and runs a workflow. Runs from several threads are served one at a time,
    /// in the order they arrive.
    pub fn run(
        &self,
        wf: &Workflow,
        sink: &dyn EventSink,
        cancel: &CancelToken,
        options: &RunOptions,
    ) -> Result<RunReport, RunError> {
        let plan = self.validate(wf).map_err(RunError::Invalid)?;
        self.run_plan(&plan, sink, cancel, options)
    }

    pub fn run_plan(
        &self,
        plan: &Plan,
        sink: &dyn EventSink,
        cancel: &CancelToken,
        options: &RunOptions,
    ) -> Result<RunReport, RunError> {
        let _turn = self.queue.wait_turn();
        let start = Instant::now();
        let run_id = options
            .run_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut report = RunReport {
            run_id: run_id.clone(),
            ..RunReport::default()
        };
        sink.send(Event::ExecutionStart {
            prompt_id: run_id.clone(),
            timestamp: now_ms(),
        });
        let n = plan.nodes.len();

        let mut keys: Vec<CacheKey> = Vec::with_capacity(n);
        let mut links = Vec::new();
        for (i, pn) in plan.nodes.iter().enumerate() {
            let fp = match catch_unwind(AssertUnwindSafe(|| pn.node.fingerprint(&pn.consts))) {
                Ok(Ok(fp)) => fp,
                Ok(Err(error)) => return Err(self.fail(plan, i, error, report, sink, start)),
                Err(p) => {
                    return Err(self.fail(
                        plan,
                        i,
                        NodeError::Panic(panic_message(p)),
                        report,
                        sink,
                        start,
                    ))
                }
            };
            links.clear();
            links.extend(
                pn.links
                    .iter()
                    .map(|l| (l.input.as_str(), keys[l.from], l.output)),
            );
            keys.push(finish_key(&pn.key_prefix, &links, fp.as_deref()));
        }

        // Walk from the outputs back: a cache hit stops the walk, a miss must run and
        // needs its producers. Consumers come after producers, so one reverse pass does.
        let mut needed: Vec<bool> = plan.nodes.iter().map(|p| p.output_node).collect();
        let mut available: Vec<Option<Arc<[Value]>>> = vec![None; n];
        let mut run_it = vec![false; n];
        {
            let mut cache = self.cache.lock();
            for i in (0..n).rev() {
                if !needed[i] {
                    continue;
                }
                match cache.get(&keys[i]) {
                    Some(hit) => {
                        available[i] = Some(hit.values);
                        if let Some(ui) = hit.ui {
                            report.ui_outputs.insert(plan.nodes[i].id.clone(), ui);
                        }
                    }
                    None => {
                        run_it[i] = true;
                        for l in &plan.nodes[i].links {
                            needed[l.from] = true;
                        }
                    }
                }
            }
        }
        report.cached = (0..n)
            .filter(|&i| !run_it[i])
            .map(|i| plan.nodes[i].id.clone())
            .collect();
        sink.send(Event::ExecutionCached {
            prompt_id: run_id.clone(),
            nodes: report.cached.clone(),
        });
        for (node, ui) in &report.ui_outputs {
            sink.send(Event::Executed {
                prompt_id: run_id.clone(),
                node: node.clone(),
                output: ui.clone(),
            });
        }

        // Dependency counts and consumer lists over the nodes that run.
        let mut waiting = vec![0usize; n];
        let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut uses = vec![0usize; n];
        let mut ready = VecDeque::new();
        let mut to_run = 0usize;
        for i in 0..n {
            if !run_it[i] {
                continue;
            }
            to_run += 1;
            for l in &plan.nodes[i].links {
                uses[l.from] += 1;
                if run_it[l.from] {
                    waiting[i] += 1;
                    consumers[l.from].push(i);
                }
            }
            if waiting[i] == 0 {
                ready.push_back(i);
            }
        }
        report.planning = start.elapsed();

        let abort = AtomicBool::new(false);
        let shared = RunShared {
            plan,
            run_id: &run_id,
            sink,
            cancel,
            abort: &abort,
            output_dir: options.output_dir.as_deref(),
            metadata: &options.metadata,
            image_metadata: &options.image_metadata,
        };
        let mut state = Coordinator {
            exec: self,
            shared: &shared,
            keys: &keys,
            available,
            waiting,
            consumers,
            uses,
            ready,
            busy_devices: HashSet::new(),
            running: 0,
            local_done: VecDeque::new(),
            stop: None,
            report: &mut report,
        };
        let workers = self.config.workers.max(1).min(to_run);
        if workers <= 1 {
            state.drive(None, 1);
        } else {
            std::thread::scope(|s| {
                let (job_tx, job_rx) = mpsc::channel::<Job>();
                let (done_tx, done_rx) = mpsc::channel::<Done>();
                let job_rx = Arc::new(std::sync::Mutex::new(job_rx));
                for _ in 0..workers {
                    let job_rx = job_rx.clone();
                    let done_tx = done_tx.clone();
                    let shared = &shared;
                    s.spawn(move || loop {
                        // The lock is held only to take one job off the queue.
                        let job = match job_rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => break,
                        };
                        let Ok(job) = job else { break };
                        if done_tx.send(shared.execute(job)).is_err() {
                            break;
                        }
                    });
                }
                drop(done_tx);
                let mut pool = ThreadPool {
                    jobs: Some(job_tx),
                    done: done_rx,
                };
                state.drive(Some(&mut pool), workers);
                pool.jobs = None;
            });
        }
        let stop = state.stop.take();
        drop(state);
        report.total = start.elapsed();
        match stop {
            None => {
                sink.send(Event::Executing {
                    prompt_id: run_id.clone(),
                    node: None,
                });
                sink.send(Event::ExecutionSuccess {
                    prompt_id: run_id,
                    timestamp: now_ms(),
                });
                Ok(report)
            }
            Some(Stop::Failed { index, error }) => {
                Err(self.fail(plan, index, error, report, sink, start))
            }
            Some(Stop::Interrupted { index }) => {
                let pn = index.map(|i| &plan.nodes[i]);
                sink.send(Event::ExecutionInterrupted {
                    prompt_id: run_id,
                    node_id: pn.map(|p| p.id.clone()),
                    node_type: pn.map(|p| p.class_type.clone()),
                    executed: report.executed.iter().map(|t| t.node.clone()).collect(),
                    timestamp: now_ms(),
                });
                Err(RunError::Interrupted {
                    node_id: pn.map(|p| p.id.clone()),
                    report: Box::new(report),
                })
            }
        }
    }

    fn fail(
        &self,
        plan: &Plan,
        index: usize,
        error: NodeError,
        mut report: RunReport,
        sink: &dyn EventSink,
        start: Instant,
    ) -> RunError {
        let pn = &plan.nodes[index];
        report.total = start.elapsed();
        sink.send(Event::ExecutionError {
            prompt_id: report.run_id.clone(),
            node_id: pn.id.clone(),
            node_type: pn.class_type.clone(),
            exception_type: error.exception_type().to_string(),
            exception_message: error.to_string(),
            executed: report.executed.iter().map(|t| t.node.clone()).collect(),
            timestamp: now_ms(),
        });
        RunError::NodeFailed {
            node_id: pn.id.clone(),
            class_type: pn.class_type.clone(),
            error: Box::new(error),
            report: Box::new(report),
        }
    }
}

struct Coordinator<'a, 'b> {
    exec: &'a Executor,
    shared: &'a RunShared<'b>,
    keys: &'a [CacheKey],
    available: Vec<Option<Arc<[Value]>>>,
    waiting: Vec<usize>,
    consumers: Vec<Vec<usize>>,
    // Links still to be read from each node's outputs; at zero the run lets go of them.
    uses: Vec<usize>,
    ready: VecDeque<usize>,
    busy_devices: HashSet<String>,
    running: usize,
    // Results of nodes the coordinator ran itself.
    local_done: VecDeque<Done>,
    stop: Option<Stop>,
    report: &'a mut RunReport,
}

impl Coordinator<'_, '_> {
    fn drive(&mut self, mut pool: Option<&mut ThreadPool>, workers: usize) {
        loop {
            if self.stop.is_none() && self.shared.cancel.is_cancelled() {
                self.stop = Some(Stop::Interrupted {
                    index: self.ready.front().copied(),
                });
            }
            if self.stop.is_none() {
                self.dispatch(pool.as_deref_mut(), workers);
            }
            if self.running == 0 {
                break;
            }
            let done = match self.local_done.pop_front() {
                Some(d) => d,
                None => match pool.as_deref_mut().map(|p| p.done.recv()) {
                    Some(Ok(d)) => d,
                    // Only possible if every worker died, which `execute` prevents.
                    _ => break,
                },
            };
            self.running -= 1;
            self.finish(done);
        }
    }

    fn dispatchable(&self, index: usize) -> bool {
        match &self.shared.plan.nodes[index].lane {
            Lane::Cpu => true,
            Lane::Device(d) => !self.busy_devices.contains(d),
        }
    }

    fn dispatch(&mut self, mut pool: Option<&mut ThreadPool>, workers: usize) {
        let mut i = 0;
        while i < self.ready.len() && self.running < workers {
            let index = self.ready[i];
            if !self.dispatchable(index) {
                i += 1;
                continue;
            }
            let pn = &self.shared.plan.nodes[index];
            if let Lane::Device(d) = &pn.lane {
                self.busy_devices.insert(d.clone());
            }
            self.ready.remove(i);
            let mut inputs = pn.consts.clone();
            for l in &pn.links {
                // Producers finish (or come from the cache) before consumers are ready.
                if let Some(v) = self.available[l.from]
                    .as_ref()
                    .and_then(|o| o.get(l.output))
                {
                    inputs.insert(l.input.clone(), InputData::Value(v.clone()));
                }
                self.uses[l.from] -= 1;
                if self.uses[l.from] == 0 {
                    self.available[l.from] = None;
                }
            }
            let job = Job { index, inputs };
            // With nothing else to run alongside, handing the node to a worker would only
            // add two thread wake-ups; chains of light nodes run here instead.
            let alone = self.running == 0 && !self.ready.iter().any(|&r| self.dispatchable(r));
            self.running += 1;
            match pool.as_deref_mut() {
                Some(p) if !alone => p.submit(job),
                _ => {
                    let done = self.shared.execute(job);
                    self.local_done.push_back(done);
                    // Let `drive` record the result before anything else is started.
                    break;
                }
            }
        }
    }

    fn finish(&mut self, done: Done) {
        let pn = &self.shared.plan.nodes[done.index];
        if let Lane::Device(d) = &pn.lane {
            self.busy_devices.remove(d);
        }
        match done.result {
            Ok(out) => {
                let values: Arc<[Value]> = out.values.into();
                self.exec.cache.lock().insert(
                    self.keys[done.index],
                    values.clone(),
                    out.ui.clone(),
                );
                if let Some(ui) = out.ui {
                    self.shared.sink.send(Event::Executed {
                        prompt_id: self.shared.run_id.to_string(),
                        node: pn.id.clone(),
                        output: ui.clone(),
                    });
                    self.report.ui_outputs.insert(pn.id.clone(), ui);
                }
                self.report.executed.push(crate::executor::NodeTiming {
                    node: pn.id.clone(),
                    class_type: pn.class_type.clone(),
                    duration: done.duration,
                });
                if self.uses[done.index] > 0 {
                    self.available[done.index] = Some(values);
                }
                for &c in &self.consumers[done.index] {
                    self.waiting[c] -= 1;
                    if self.waiting[c] == 0 {
                        self.ready.push_back(c);
                    }
                }
            }
            Err(NodeError::Interrupted) => {
                if self.stop.is_none() {
                    self.stop = Some(Stop::Interrupted {
                        index: Some(done.index),
                    });
                }
            }
            Err(error) => {
                // The first failure is the one reported; later ones are usually knock-on
                // interruptions from the abort below.
                if !matches!(self.stop, Some(Stop::Failed { .. })) {
                    self.stop = Some(Stop::Failed {
                        index: done.index,
                        error,
                    });
                }
                self.shared.abort.store(true, Ordering::Release);
            }
        }
    }
}
