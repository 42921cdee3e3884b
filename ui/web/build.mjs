// Bundles the editor into one folder of static files (index.html, app.js, app.css) that
// the `sdflow-ui` crate embeds. Run by ui/build.rs; `npm run build` writes to ./dist.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const flag = process.argv.indexOf("--outdir");
const outdir = flag >= 0 ? process.argv[flag + 1] : join(here, "dist");
if (!outdir) {
  console.error("build.mjs: --outdir needs a folder");
  process.exit(2);
}

mkdirSync(outdir, { recursive: true });
await build({
  entryPoints: { app: join(here, "src/main.js") },
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  legalComments: "eof",
  outdir,
  logLevel: "warning",
});
copyFileSync(join(here, "index.html"), join(outdir, "index.html"));
