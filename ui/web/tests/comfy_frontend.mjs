// ComfyUI's own web frontend (comfyui-frontend-package, unchanged) against a running
// `sdflow serve --front-end-root`: it boots past its splash screen, opens a workflow from
// its template browser, queues it with its Run button, shows the image, lists the job in
// its queue panel, keeps a setting across a reload, and never reaches another host.
// Run by cli/tests/browser.rs:
//   node ui/web/tests/comfy_frontend.mjs http://127.0.0.1:PORT/
// Uses Debian's chromium (SDFLOW_CHROMIUM overrides the path); never downloads a browser.
import assert from "node:assert/strict";
import { checks, launch, urlArgument } from "./harness.mjs";

const url = urlArgument("comfy_frontend.mjs");
const origin = new URL(url).origin;
const TIMEOUT = 90_000;

const browser = await launch();
const outside = [];
const serverErrors = [];
// What the page showed, for whoever reads a failure.
const { check, finish } = checks(async () => {
  if (process.env.SDFLOW_SCREENSHOT) await page.screenshot({ path: process.env.SDFLOW_SCREENSHOT }).catch(() => {});
});

const context = await browser.newContext({ viewport: { width: 1600, height: 900 } });
const page = await context.newPage();
page.setDefaultTimeout(TIMEOUT);
// Every request the page makes: none may go to another host, and none of ours may fail
// with a server error.
page.on("request", (r) => {
  const u = r.url();
  if (!u.startsWith(origin) && !u.startsWith("data:") && !u.startsWith("blob:")) outside.push(r);
});
page.on("response", (r) => {
  if (r.status() >= 500) serverErrors.push(`${r.status()} ${r.request().method()} ${r.url()}`);
});

const api = (path) => page.evaluate(async (p) => (await fetch(p)).json(), path);

await check("boots past its splash screen into the graph editor", async () => {
  await page.goto(url);
  await page.waitForFunction(() => window.app && window.app.graph && document.querySelector("canvas"));
  const stats = await api("/api/system_stats");
  assert.match(stats.system.comfyui_version, /sdflow/);
});

await check("its template browser lists sdflow's workflows and opens one", async () => {
  // Whatever opened on start-up (the template browser for a new user, ComfyUI's default
  // graph otherwise), close it and open the browser from the sidebar.
  for (let i = 0; i < 3 && (await page.locator('[data-testid="dialog-overlay"]').count()); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(300);
  }
  await page.locator(".side-bar-button-label", { hasText: /Tem.?plates/ }).first().click();
  await page.getByPlaceholder("Search", { exact: false }).first().fill("txt2img");
  await page.getByText("Text to image (txt2img)", { exact: true }).first().click();
  await page.waitForFunction(() => window.app.graph._nodes.some((n) => n.type === "CheckpointLoaderSimple"));
  const loader = await page.evaluate(() => {
    const n = window.app.graph._nodes.find((n) => n.type === "CheckpointLoaderSimple");
    return n.widgets.find((w) => w.name === "ckpt_name").value;
  });
  // The template named a model this server does not have; it offers the one it has.
  assert.equal(loader, "tiny-sd1.safetensors");
  // Test sizes, set in the widgets as a user would.
  await page.evaluate(() => {
    const set = (type, name, value) => {
      const node = window.app.graph._nodes.find((n) => n.type === type);
      node.widgets.find((w) => w.name === name).value = value;
    };
    set("EmptyLatentImage", "width", 64);
    set("EmptyLatentImage", "height", 64);
    set("KSampler", "steps", 3);
  });
});

let jobId;
await check("Run queues it and the image comes back", async () => {
  await page.getByRole("button", { name: "Run", exact: true }).first().click();
  let job;
  for (let waited = 0; !job; waited += 500) {
    assert.ok(waited < TIMEOUT, "no finished job in time");
    await page.waitForTimeout(500);
    job = (await api("/api/jobs?status=completed,failed,cancelled")).jobs[0];
  }
  assert.equal(job.status, "completed", JSON.stringify(job));
  assert.equal(job.preview_output.mediaType, "images");
  jobId = job.id;
  // The frontend loads the image from /view, as it does from ComfyUI.
  await page.waitForResponse((r) => r.url().includes("/view?") && r.url().includes(encodeURIComponent(job.preview_output.filename)) && r.status() === 200);
});

await check("its jobs panel lists the finished job", async () => {
  const detail = await api(`/api/jobs/${jobId}`);
  assert.equal(detail.workflow.prompt[detail.preview_output.nodeId].class_type, "SaveImage");
  // The Assets panel lists finished jobs from /api/jobs with their images.
  await page.getByRole("button", { name: "Assets (a)" }).click();
  await page.locator(`img[src*="${encodeURIComponent(detail.preview_output.filename)}"]`).first().waitFor();
});

await check("settings persist on the server across a reload", async () => {
  await page.evaluate(() => window.app.extensionManager.setting.set("Comfy.LinkRenderMode", 1));
  await page.reload();
  await page.waitForFunction(() => window.app && window.app.graph);
  const value = await page.evaluate(() => window.app.extensionManager.setting.get("Comfy.LinkRenderMode"));
  assert.equal(value, 1);
  const stored = await api("/api/settings");
  assert.equal(stored["Comfy.LinkRenderMode"], 1);
});

await check("it never reached another host, and no request failed on the server", async () => {
  assert.deepEqual(serverErrors, []);
  // The page tries some (ComfyUI's release check): the server's Content-Security-Policy
  // stops each in the browser, before it leaves.
  const left = outside.filter((r) => !/BLOCKED|^csp$/i.test(r.failure()?.errorText ?? "")).map((r) => `${r.url()} (${r.failure()?.errorText ?? "not blocked"})`);
  assert.deepEqual(left, []);
});

await finish(browser);
