// Drives sdflow serve with the npm ComfyUI client @saintno/comfyui-sdk, as an
// application would: connect, read the catalogue, upload, queue through CallWrapper with
// progress and previews over the WebSocket, read the history, see a failure reported.
// Usage: node client_test.mjs http://127.0.0.1:PORT — prints one JSON line, exits 0 on success.
import { ComfyApi, CallWrapper, PromptBuilder } from "@saintno/comfyui-sdk";

const host = process.argv[2];
const fail = (msg) => {
  console.error(`client test failed: ${msg}`);
  process.exit(1);
};
const timer = setTimeout(() => fail("timed out after 60 s"), 60000);

const api = new ComfyApi(host, "sdk-client");
await api.init(20, 250).waitForReady();

const stats = await api.getSystemStats();
if (!stats.devices || stats.devices.length === 0) fail(`system_stats without devices: ${JSON.stringify(stats)}`);
const defs = await api.getNodeDefs("StubSlow");
if (!defs || !defs.StubSlow || !defs.StubSlow.input.required.steps) fail(`object_info/StubSlow: ${JSON.stringify(defs)}`);

// A 1x1 PNG.
const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "base64");
const uploaded = await api.uploadImage(new Uint8Array(png), "sdk.png");
if (!uploaded || uploaded.info.filename !== "sdk.png") fail(`upload: ${JSON.stringify(uploaded)}`);

// The SDK listens for a prompt's events only after POST /prompt has answered; node 4 (a
// slow start) keeps the measured node 2 from starting before that.
const workflow = {
  "1": { class_type: "StubConstant", inputs: { seed: 0, size: 4 } },
  "4": { class_type: "StubSlow", inputs: { latent: ["1", 0], steps: 3, step_ms: 100 } },
  "2": { class_type: "StubSlow", inputs: { latent: ["4", 0], steps: 6, step_ms: 20 } },
  "3": { class_type: "StubOutput", inputs: { latent: ["2", 0], label: "sdk" } },
};
const builder = new PromptBuilder(workflow, ["seed"], ["out"])
  .setInputNode("seed", "1.inputs.seed")
  .setOutputNode("out", "3")
  .input("seed", 11);

const progress = [];
let previews = 0;
let promptId;
let started = false;
const result = await new CallWrapper(api, builder)
  .onPending((id) => (promptId = id))
  .onStart(() => (started = true))
  .onProgress((p) => progress.push([p.node, p.value, p.max]))
  .onPreview(() => previews++)
  .onFailed((e) => fail(`run failed: ${e} ${JSON.stringify(e.cause ?? {})}`))
  .run();
if (!result || !result.out) fail(`no output: ${JSON.stringify(result)}`);
const tensor = result.out.stub_tensors[0];
if (tensor.label !== "sdk" || tensor.len !== 4) fail(`output: ${JSON.stringify(result.out)}`);

// The SDK reports the outputs from `executed` events, which come before the run ends; the
// history has the prompt once it has finished.
let history;
for (let i = 0; i < 100 && !history?.status?.completed; i++) {
  history = await api.getHistory(promptId);
  if (!history?.status?.completed) await new Promise((r) => setTimeout(r, 50));
}
if (!history || !history.status.completed) fail(`history of ${promptId}: ${JSON.stringify(history)}`);

// A failing node comes back through onFailed with the node's error. The SDK listens for
// `execution_error` only after it has seen an `executing` event for the prompt and read the
// history once; events sent before POST /prompt answers are lost to it, and a prompt that is
// neither queued nor completed when it next looks "went missing". So a slow start (node 5,
// whose `executing` may come too early) and a slow node 2 (whose `executing` it sees, then
// has half a second to read the history) come before the failure.
const failing = new PromptBuilder(
  {
    "1": { class_type: "StubConstant", inputs: { seed: 1, size: 4 } },
    "5": { class_type: "StubSlow", inputs: { latent: ["1", 0], steps: 4, step_ms: 100 } },
    "2": { class_type: "StubSlow", inputs: { latent: ["5", 0], steps: 10, step_ms: 50 } },
    "3": { class_type: "StubFail", inputs: { latent: ["2", 0], fail: true, message: "sdk boom" } },
    "4": { class_type: "StubOutput", inputs: { latent: ["3", 0], label: "never" } },
  },
  [],
  ["out"]
).setOutputNode("out", "4");
let failure;
const failed = await new CallWrapper(api, failing).onFailed((e) => (failure = e)).run();
if (failed !== false || !failure || failure.cause?.exception_message !== "sdk boom")
  fail(`failure not reported: ${failed} ${failure} ${JSON.stringify(failure?.cause)}`);

// A prompt the server rejects never runs.
let rejected;
await new CallWrapper(api, new PromptBuilder({ "1": { class_type: "NoSuchNode", inputs: {} } }, [], []))
  .onFailed((e) => (rejected = e))
  .run();
if (!rejected) fail("an invalid prompt was not reported");

clearTimeout(timer);
console.log(JSON.stringify({ ok: true, promptId, started, progress, previews, sum: tensor.sum, failure: failure.cause.exception_message, rejected: rejected.name }));
api.destroy();
process.exit(0);
