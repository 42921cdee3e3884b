// Browser test of the editor against a running `sdflow serve`: builds a graph by clicking,
// queues it and waits for the image in the gallery; a missing input shows on its node;
// saved, JSON and PNG workflows load back. Run by cli/tests/browser.rs:
//   node ui/web/tests/editor.mjs http://127.0.0.1:PORT/
// Uses Debian's chromium (SDFLOW_CHROMIUM overrides the path); never downloads a browser.
import { chromium } from "playwright-core";
import { readFile } from "node:fs/promises";
import assert from "node:assert/strict";

const url = process.argv[2];
if (!url) {
  console.error("usage: node editor.mjs URL");
  process.exit(2);
}
const executablePath = process.env.SDFLOW_CHROMIUM || "/usr/bin/chromium";
const TIMEOUT = 60_000;

const browser = await chromium.launch({ executablePath, args: ["--headless", "--no-sandbox", "--disable-gpu"] });
let passed = 0;
let failed = 0;
const consoleErrors = [];

// Each check builds on the page the one before left, so the first failure ends the run.
async function check(name, body) {
  if (failed) {
    console.log(`not ok - ${name} # not run after the failure above`);
    return;
  }
  const started = Date.now();
  try {
    await body();
    passed++;
    console.log(`ok - ${name} (${Date.now() - started} ms)`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}\n${String(e.stack || e).replace(/^/gm, "    ")}`);
  }
}

const context = await browser.newContext({ viewport: { width: 1600, height: 900 }, acceptDownloads: true });
const page = await context.newPage();
page.setDefaultTimeout(TIMEOUT);
page.on("pageerror", (e) => consoleErrors.push(`page error: ${e.message}`));
page.on("console", (m) => m.type() === "error" && consoleErrors.push(`console: ${m.text()}`));

/** Page coordinates of a point given in graph coordinates. */
async function toPage(graphPoint) {
  return page.evaluate(([x, y]) => {
    const { canvas } = window.sdflow;
    const [cx, cy] = canvas.ds.convertOffsetToCanvas([x, y]);
    const r = canvas.canvas.getBoundingClientRect();
    return [r.left + cx, r.top + cy];
  }, graphPoint);
}

/** Adds a node through the side panel's search and click; returns its id. */
async function addByClicking(type) {
  await page.fill("#node-search", type);
  const before = await page.evaluate(() => window.sdflow.graph._nodes.map((n) => n.id));
  await page.click(`#node-list li.node-type[data-type="${type}"]`);
  const id = await page.evaluate((before) => window.sdflow.graph._nodes.map((n) => n.id).find((id) => !before.includes(id)), before);
  assert.ok(id !== undefined, `clicking ${type} in the node list added a node`);
  return id;
}

/** Drags from output `out` of node `from` to input `inp` of node `to` with the mouse. */
async function connectByDragging(from, out, to, inp) {
  const [a, b] = await page.evaluate(([from, out, to, inp]) => {
    const g = window.sdflow.graph;
    return [g.getNodeById(from).getOutputPos(out), g.getNodeById(to).getInputPos(inp)];
  }, [from, out, to, inp]);
  const [ax, ay] = await toPage(a);
  const [bx, by] = await toPage(b);
  await page.mouse.move(ax, ay);
  await page.mouse.down();
  await page.mouse.move((ax + bx) / 2, (ay + by) / 2, { steps: 5 });
  await page.mouse.move(bx, by, { steps: 5 });
  await page.mouse.up();
  const linked = await page.evaluate(([to, inp]) => window.sdflow.graph.getNodeById(to).inputs[inp].link != null, [to, inp]);
  assert.ok(linked, `dragging connected node ${from} output ${out} to node ${to} input ${inp}`);
}

/** Clicks the middle of a widget and types a value into litegraph's prompt dialog. */
async function setWidgetByTyping(nodeId, name, value) {
  const point = await page.evaluate(([id, name]) => {
    const node = window.sdflow.graph.getNodeById(id);
    const w = node.widgets.find((w) => w.name === name);
    return [node.pos[0] + node.size[0] / 2, node.pos[1] + w.y + 10];
  }, [nodeId, name]);
  const [x, y] = await toPage(point);
  await page.mouse.click(x, y);
  const input = page.locator(".graphdialog input, .graphdialog textarea").first();
  await input.fill(String(value));
  await input.press("Enter");
  return page.evaluate(([id, name]) => window.sdflow.graph.getNodeById(id).widgets.find((w) => w.name === name).value, [nodeId, name]);
}

async function galleryCount() {
  return page.locator("#gallery figure").count();
}

/** Waits for the gallery to grow past `count` and returns the newest image's size. */
async function newestImage(count) {
  await page.waitForFunction((n) => document.querySelectorAll("#gallery figure").length > n, count, { timeout: TIMEOUT });
  const img = page.locator("#gallery figure img").first();
  await img.evaluate((el) => el.complete || new Promise((ok, bad) => { el.onload = ok; el.onerror = () => bad(new Error(`${el.src} did not load`)); }));
  return img.evaluate((el) => ({ width: el.naturalWidth, height: el.naturalHeight, src: el.src }));
}

// Drops a file on the canvas and waits until the page has handled it (read, opened or
// refused): reading a File is asynchronous, and checking the graph at once raced.
async function dropFile(name, mime, bytes) {
  const before = await page.evaluate(() => window.sdflow.filesHandled);
  await page.evaluate(([name, mime, data]) => {
    const file = new File([new Uint8Array(data)], name, { type: mime });
    const dt = new DataTransfer();
    dt.items.add(file);
    document.getElementById("graph-canvas").dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
  }, [name, mime, [...bytes]]);
  await page.waitForFunction((n) => window.sdflow.filesHandled > n, before, { timeout: 10000 });
}

async function nodeTypes() {
  return page.evaluate(() => window.sdflow.graph._nodes.map((n) => n.type).sort());
}

let graphIds = null;

await check("the editor loads the node catalogue from /object_info", async () => {
  await page.goto(url);
  await page.waitForSelector("body[data-ready=true]");
  const types = await page.locator("#node-list li.node-type").evaluateAll((els) => els.map((e) => e.dataset.type));
  for (const t of ["SolidMask", "MaskToImage", "SaveImage", "KSampler"]) assert.ok(types.includes(t), `${t} is in the node list`);
  await page.fill("#node-search", "mask to");
  const found = await page.locator("#node-list li.node-type").evaluateAll((els) => els.map((e) => e.dataset.type));
  assert.ok(found.includes("MaskToImage") && !found.includes("KSampler"), `search narrows the list (got ${found.join(", ")})`);
  await page.waitForFunction(() => document.getElementById("status").textContent === "connected" || /queue/.test(document.getElementById("status").textContent));
});

await check("a graph built by clicking runs and its image reaches the gallery", async () => {
  const solid = await addByClicking("SolidMask");
  const toImage = await addByClicking("MaskToImage");
  const save = await addByClicking("SaveImage");
  graphIds = { solid, toImage, save };
  assert.equal(await setWidgetByTyping(solid, "width", 96), 96, "typing into the width widget set it");
  assert.equal(await setWidgetByTyping(solid, "height", 64), 64);
  assert.equal(await setWidgetByTyping(solid, "value", 0.25), 0.25);
  await connectByDragging(solid, 0, toImage, 0);
  await connectByDragging(toImage, 0, save, 0);
  const prompt = await page.evaluate(() => window.sdflow.graphToPrompt());
  assert.deepEqual(prompt[String(save)].inputs.images, [String(toImage), 0]);
  const before = await galleryCount();
  await page.click("#btn-queue");
  const img = await newestImage(before);
  assert.deepEqual([img.width, img.height], [96, 64], "the gallery shows the 96×64 image the graph makes");
  assert.match(img.src, /\/view\?filename=ComfyUI_/);
});

await check("progress and previews show live on the running node", async () => {
  const workflow = {
    "1": { class_type: "StubConstant", inputs: { seed: 7, size: 16 } },
    "2": { class_type: "StubSlow", inputs: { latent: ["1", 0], steps: 6, step_ms: 250 } },
    "3": { class_type: "StubOutput", inputs: { latent: ["2", 0], label: "slow" } },
  };
  const saved = await page.evaluate(() => window.sdflow.graph.serialize());
  await page.setInputFiles("#file-load", { name: "slow.json", mimeType: "application/json", buffer: Buffer.from(JSON.stringify(workflow)) });
  await page.waitForFunction(() => window.sdflow.graph._nodes.length === 3 && window.sdflow.graph._nodes.some((n) => n.type === "StubSlow"));
  await page.click("#btn-queue");
  const seen = await page.waitForFunction(() => {
    const p = window.sdflow.view.progress;
    return p && p.max === 6 && p.value >= 1 && window.sdflow.view.running === p.node && { node: p.node, text: document.getElementById("progress").textContent };
  });
  const { node, text } = await seen.jsonValue();
  assert.equal(node, "2", "the running node is StubSlow");
  assert.match(text, /\d\/6/, `the toolbar shows step n/N (${text})`);
  await page.waitForFunction(() => window.sdflow.graph.getNodeById(2).sdflowImage?.src.startsWith("blob:"));
  await page.waitForFunction(() => window.sdflow.view.running === null);
  // back to the graph built by clicking, for the checks that follow
  await dropFile("saved.json", "application/json", Buffer.from(JSON.stringify(saved)));
  assert.deepEqual(await nodeTypes(), ["MaskToImage", "SaveImage", "SolidMask"]);
});

await check("pan and zoom move the view", async () => {
  const before = await page.evaluate(() => [...window.sdflow.canvas.ds.offset, window.sdflow.canvas.ds.scale]);
  const box = await page.locator("#graph-canvas").boundingBox();
  await page.mouse.move(box.x + box.width - 40, box.y + box.height - 40);
  await page.mouse.wheel(0, -300);
  await page.waitForTimeout(100);
  const after = await page.evaluate(() => [...window.sdflow.canvas.ds.offset, window.sdflow.canvas.ds.scale]);
  assert.notDeepEqual(after, before, "the wheel changed the view");
  await page.evaluate(() => { window.sdflow.canvas.ds.reset(); window.sdflow.canvas.setDirty(true, true); });
});

await check("saving writes a ComfyUI workflow that opens again", async () => {
  const download = page.waitForEvent("download");
  await page.click("#btn-save");
  const path = await (await download).path();
  const saved = JSON.parse(await readFile(path, "utf8"));
  assert.ok(Array.isArray(saved.nodes) && Array.isArray(saved.links), "the saved file is ComfyUI's UI format");
  assert.equal(saved.nodes.length, 3);
  assert.equal(saved.links.length, 2);
  await page.click("#btn-clear");
  assert.deepEqual(await nodeTypes(), []);
  await dropFile("workflow.json", "application/json", Buffer.from(JSON.stringify(saved)));
  assert.deepEqual(await nodeTypes(), ["MaskToImage", "SaveImage", "SolidMask"]);
  const prompt = await page.evaluate(() => window.sdflow.graphToPrompt());
  const solid = Object.values(prompt).find((n) => n.class_type === "SolidMask");
  assert.deepEqual([solid.inputs.width, solid.inputs.height, solid.inputs.value], [96, 64, 0.25], "widget values came back");
});

await check("a missing input is shown on its node after a delete", async () => {
  const toImage = await page.evaluate(() => window.sdflow.graph._nodes.find((n) => n.type === "MaskToImage").id);
  const save = await page.evaluate(() => window.sdflow.graph._nodes.find((n) => n.type === "SaveImage").id);
  const title = await page.evaluate((id) => {
    const n = window.sdflow.graph.getNodeById(id);
    return [n.pos[0] + 30, n.pos[1] - 15];
  }, toImage);
  const [x, y] = await toPage(title);
  // Under load the canvas may take the click a frame late: wait for the selection (and then
  // for the removal) instead of reading the graph at once.
  await page.mouse.click(x, y);
  await page.waitForFunction((id) => !!window.sdflow.canvas.selected_nodes?.[id], toImage, { timeout: 5000 }).catch(() => {});
  await page.keyboard.press("Delete");
  await page.waitForFunction((id) => !window.sdflow.graph.getNodeById(id), toImage, { timeout: 5000 }).catch(() => {});
  assert.deepEqual(await nodeTypes(), ["SaveImage", "SolidMask"], "Delete removed the selected node");
  await page.click("#btn-queue");
  const item = page.locator(`#errors .error[data-node="${save}"]`);
  await item.waitFor();
  const text = await item.textContent();
  assert.match(text, /images/, `the error names the missing input (${text})`);
  const onNode = await page.evaluate((id) => window.sdflow.graph.getNodeById(id).sdflowErrors, save);
  assert.ok(onNode?.length && onNode.some((m) => /images/.test(m)), "the node carries the error it is drawn with");
});

await check("a workflow JSON file opens through the file picker and runs", async () => {
  const workflow = {
    format: "sdflow",
    format_version: 1,
    title: "browser test",
    nodes: {
      "1": { class_type: "SolidMask", inputs: { value: 1.0, width: 40, height: 24 } },
      "2": { class_type: "MaskToImage", inputs: { mask: ["1", 0] } },
      "3": { class_type: "SaveImage", inputs: { images: ["2", 0], filename_prefix: "browser" } },
    },
  };
  await page.setInputFiles("#file-load", { name: "test.json", mimeType: "application/json", buffer: Buffer.from(JSON.stringify(workflow)) });
  await page.waitForFunction(() => window.sdflow.graph._nodes.length === 3);
  assert.equal(await page.locator("#errors").isHidden(), true, "opening cleared the old errors");
  const before = await galleryCount();
  await page.click("#btn-queue");
  const img = await newestImage(before);
  assert.deepEqual([img.width, img.height], [40, 24]);
  assert.match(img.src, /filename=browser_/);
});

await check("a PNG with an embedded workflow opens when dropped", async () => {
  const src = await page.locator("#gallery figure img").first().getAttribute("src");
  const bytes = await page.evaluate(async (src) => [...new Uint8Array(await (await fetch(src)).arrayBuffer())], src);
  await page.click("#btn-clear");
  await dropFile("output.png", "image/png", Buffer.from(bytes));
  await page.waitForFunction(() => window.sdflow.graph._nodes.length === 3);
  const prompt = await page.evaluate(() => window.sdflow.graphToPrompt());
  const save = Object.values(prompt).find((n) => n.class_type === "SaveImage");
  assert.equal(save.inputs.filename_prefix, "browser", "the PNG's workflow is the one that made it");
});

await check("a file that is not a workflow gives a clear message", async () => {
  await dropFile("notes.json", "application/json", Buffer.from("{ not json"));
  const status = await page.locator("#status").textContent();
  assert.match(status, /notes\.json: not valid JSON/);
  assert.equal(await page.evaluate(() => window.sdflow.graph._nodes.length), 3, "the open graph is kept");
});

await check("the page logged no errors", async () => {
  const real = consoleErrors.filter((e) => !/status of 400/.test(e));
  assert.deepEqual(real, []);
});

await browser.close();
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
