// Browser test: every committed workflow of the LLM-conditioned families (Z-Image, FLUX.2,
// Qwen-Image, its Edit and Layered models) and of video (Wan, AnimateDiff) opens in the editor through the file picker with the
// models it names (none swapped for another), and runs to its image. The workflows are
// shrunk to test sizes first (32² latents, 2 steps, reference images at 0.01 MP), as the
// Rust tests shrink them. Run by cli/tests/browser.rs, whose server holds the tiny
// random-weight files of sdflow_tests' write_*_models and input/input.png:
//   node ui/web/tests/families.mjs http://127.0.0.1:PORT/
import { readFile } from "node:fs/promises";
import assert from "node:assert/strict";
import { checks, launch, urlArgument } from "./harness.mjs";

const url = urlArgument("families.mjs");
const TIMEOUT = 120_000;
const WORKFLOWS = ["z_image_turbo", "z_image_base", "flux2_klein", "flux2_klein_edit", "flux2_dev", "qwen_image", "qwen_image_edit", "qwen_image_edit_2509", "qwen_image_layered", "wan_t2v", "wan_i2v", "wan_flf2v", "wan22_moe_t2v", "wan22_ti2v", "wan_vace", "animatediff"];
const MODEL_WIDGETS = ["unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "ckpt_name", "model_name", "lora_name", "image"];

const browser = await launch();
const consoleErrors = [];
const { check, finish } = checks();
const page = await (await browser.newContext({ viewport: { width: 1600, height: 900 } })).newPage();
page.setDefaultTimeout(TIMEOUT);
page.on("pageerror", (e) => consoleErrors.push(`page error: ${e.message}`));

/** The workflow at test sizes; only constant inputs change (links stay links). */
function shrink(wf) {
  for (const node of Object.values(wf.nodes)) {
    const i = node.inputs;
    const set = (k, v) => { if (typeof i[k] === "number") i[k] = v; };
    switch (node.class_type) {
      case "EmptyLatentImage": case "EmptySD3LatentImage": case "EmptyFlux2LatentImage":
        set("width", 32); set("height", 32); break;
      case "Flux2Scheduler":
        set("width", 32); set("height", 32); set("steps", 2); break;
      case "EmptyHunyuanLatentVideo": case "WanImageToVideo": case "WanFirstLastFrameToVideo": case "Wan22ImageToVideoLatent": case "WanVaceToVideo":
        set("width", 32); set("height", 32); set("length", 5); break;
      case "KSampler": case "BasicScheduler":
        set("steps", 2); break;
      case "ImageScaleToTotalPixels":
        set("megapixels", 0.01); break;
    }
  }
  return wf;
}

await check("the editor is up", async () => {
  await page.goto(url);
  await page.waitForSelector("body[data-ready=true]");
});

for (const name of WORKFLOWS) {
  await check(`${name}.json opens with its models and runs`, async () => {
    const wf = shrink(JSON.parse(await readFile(new URL(`../../../workflows/${name}.json`, import.meta.url), "utf8")));
    await page.setInputFiles("#file-load", { name: `${name}.json`, mimeType: "application/json", buffer: Buffer.from(JSON.stringify(wf)) });
    const count = Object.keys(wf.nodes).length;
    await page.waitForFunction((n) => window.sdflow.graph._nodes.length === n, count);
    const shown = await page.evaluate((names) => window.sdflow.graph._nodes.flatMap((n) => (n.widgets ?? []).filter((w) => names.includes(w.name)).map((w) => `${n.type}.${w.name}=${w.value}`)), MODEL_WIDGETS);
    for (const node of Object.values(wf.nodes)) {
      for (const k of MODEL_WIDGETS) {
        if (typeof node.inputs[k] === "string") assert.ok(shown.includes(`${node.class_type}.${k}=${node.inputs[k]}`), `${node.class_type}.${k} stays ${node.inputs[k]} (the editor shows ${shown.join(", ")})`);
      }
    }
    const before = await page.locator("#gallery figure").count();
    await page.click("#btn-queue");
    await page.waitForFunction((n) => document.querySelectorAll("#gallery figure").length > n || !document.getElementById("errors").hidden, before, { timeout: TIMEOUT });
    const errors = await page.locator("#errors").isHidden() ? "" : await page.locator("#errors").textContent();
    assert.equal(errors, "", `${name} ran without errors`);
    const img = page.locator("#gallery figure img").first();
    await img.evaluate((el) => el.complete || new Promise((ok, bad) => { el.onload = ok; el.onerror = () => bad(new Error(`${el.src} did not load`)); }));
    const size = await img.evaluate((el) => [el.naturalWidth, el.naturalHeight]);
    assert.ok(size[0] > 0 && size[1] > 0, `${name} gave an image (${size})`);
  });
}

await check("no page errors", async () => {
  assert.deepEqual(consoleErrors, []);
});

await finish(browser);
