// What the browser tests share: the URL argument, Debian's chromium (SDFLOW_CHROMIUM
// overrides the path; never a downloaded browser), and checks that run in order, each on the
// page the one before left, so the first failure ends the run.
import { chromium } from "playwright-core";

export function urlArgument(script) {
  const url = process.argv[2];
  if (!url) {
    console.error(`usage: node ${script} URL`);
    process.exit(2);
  }
  return url;
}

export function launch() {
  const executablePath = process.env.SDFLOW_CHROMIUM || "/usr/bin/chromium";
  return chromium.launch({ executablePath, args: ["--headless", "--no-sandbox", "--disable-gpu"] });
}

/** `check(name, body)` runs one check and reports it; `finish(browser)` prints the count and
 * exits with the outcome. `onFailure` (optional) runs after a failed check. */
export function checks(onFailure = async () => {}) {
  let passed = 0;
  let failed = 0;
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
      await onFailure();
    }
  }
  async function finish(browser) {
    await browser.close();
    console.log(`\n${passed} passed, ${failed} failed`);
    process.exit(failed ? 1 : 0);
  }
  return { check, finish };
}
