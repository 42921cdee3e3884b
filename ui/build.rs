//! Builds the browser editor (ui/web) with npm and esbuild into OUT_DIR and writes the
//! table of embedded files that src/lib.rs includes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let web = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("web");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for source in [
        "src",
        "index.html",
        "build.mjs",
        "package.json",
        "package-lock.json",
    ] {
        println!("cargo:rerun-if-changed={}", web.join(source).display());
    }
    // A deleted node_modules must bring the npm install back.
    println!(
        "cargo:rerun-if-changed={}",
        web.join("node_modules/.package-lock.json").display()
    );

    if let Err(message) = build_web(&web, &out.join("web")) {
        eprintln!("\nerror: sdflow-ui: {message}\n");
        panic!("sdflow-ui: {message}");
    }
    let table = asset_table(&out.join("web"))
        .unwrap_or_else(|e| panic!("sdflow-ui: reading the built editor: {e}"));
    std::fs::write(out.join("assets.rs"), table)
        .unwrap_or_else(|e| panic!("sdflow-ui: writing assets.rs: {e}"));
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| {
        format!("{what}: could not start `{}` ({e}). Building the browser editor needs Node.js (18 or newer) and npm on PATH, e.g. `apt-get install nodejs npm`.", cmd.get_program().to_string_lossy())
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status}); its output is above"))
    }
}

fn build_web(web: &Path, dest: &Path) -> Result<(), String> {
    if !web.join("node_modules/.package-lock.json").exists() {
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(web),
            "`npm ci` in ui/web",
        )?;
    }
    if dest.exists() {
        std::fs::remove_dir_all(dest).map_err(|e| format!("clearing {}: {e}", dest.display()))?;
    }
    run(
        Command::new("node")
            .arg("build.mjs")
            .arg("--outdir")
            .arg(dest)
            .current_dir(web),
        "bundling ui/web (node build.mjs)",
    )
}

fn mime(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json") | Some("map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

fn asset_table(root: &Path) -> std::io::Result<String> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path)
            } else {
                files.push(path)
            }
        }
    }
    files.sort();
    let mut table = String::from("static ASSETS: &[(&str, &[u8], &str)] = &[\n");
    for path in files {
        let name = path
            .strip_prefix(root)
            .expect("walked from root")
            .to_string_lossy()
            .replace('\\', "/");
        writeln!(
            table,
            "    ({name:?}, include_bytes!({:?}), {:?}),",
            path.display().to_string(),
            mime(&path)
        )
        .expect("writing to a String");
    }
    table.push_str("];\n");
    Ok(table)
}
