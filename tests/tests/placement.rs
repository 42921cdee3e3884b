//! Memory honesty on a budget: a model its device's budget cannot hold is refused before
//! anything is read or allocated, by an error naming the model, its size and the budget,
//! and the next run (with room) works.

use sdflow_core::residency::{Device, ResidencyManager};
use sdflow_tests::TestEnv;

#[test]
fn a_model_over_its_devices_budget_is_refused_before_loading() {
    let mut residency: Option<ResidencyManager> = None;
    let env = TestEnv::new(|rt| {
        rt.residency.set_budget(Device::Cpu, Some(4096));
        residency = Some(rt.residency.clone());
        rt
    });
    let residency = residency.unwrap();
    let wf = env.workflow("txt2img.json", 64, 1);
    let e = env.run_err(&wf);
    assert!(e.contains("model.safetensors") && e.contains("bytes on cpu, but its budget is 4096 bytes"), "{e}");
    let stats = residency.stats();
    assert_eq!(stats.loads, 0, "refused from the file's header, nothing loaded: {stats:?}");
    assert!(stats.load_failures > 0);
    // With room, the same workflow runs.
    residency.set_budget(Device::Cpu, None);
    let (w, h, _) = env.run_saved(&wf, "7");
    assert_eq!((w, h), (64, 64));
}
