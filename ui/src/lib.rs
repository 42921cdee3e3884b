//! sdflow-ui: the browser graph editor, built from npm packages at build time and embedded
//! into the binary, so `sdflow serve` needs no Node.js at run time.

use std::borrow::Cow;

/// One embedded file of the editor.
#[derive(Debug, Clone)]
pub struct Asset {
    pub bytes: Cow<'static, [u8]>,
    pub mime: &'static str,
}

// (path, bytes, mime) for every file of the built editor, written by build.rs.
include!(concat!(env!("OUT_DIR"), "/assets.rs"));

/// The embedded file at `path` (no leading slash; "" means "index.html").
pub fn asset(path: &str) -> Option<Asset> {
    let path = if path.is_empty() { "index.html" } else { path };
    ASSETS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, bytes, mime)| Asset {
            bytes: Cow::Borrowed(bytes),
            mime,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_built_editor() {
        let index = asset("").expect("index.html is embedded");
        assert_eq!(index.mime, "text/html; charset=utf-8");
        let html = std::str::from_utf8(&index.bytes).expect("index.html is UTF-8");
        assert!(
            html.contains("app.js") && html.contains("graph-canvas"),
            "index.html is the editor's page"
        );
        let app = asset("app.js").expect("app.js is embedded");
        assert!(app.mime.starts_with("text/javascript"));
        assert!(app.bytes.len() > 10_000, "app.js holds the bundled editor");
        assert!(asset("app.css").is_some());
        assert!(asset("missing.js").is_none());
        assert!(asset("../Cargo.toml").is_none());
    }
}
