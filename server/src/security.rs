//! The request guard (browser origin, bearer token, CORS) and path confinement for the
//! file endpoints.
//!
//! Threat model: the server listens on loopback by default, where any web page the user
//! visits could POST to it. Browsers send `Origin` on such cross-site requests, so a
//! request whose `Origin` names another host than the one it was sent to is refused
//! unless `--cors-origin` allows that origin. Beyond loopback, `--auth-token` requires a
//! bearer token on every request.
//!
//! DNS rebinding defeats the origin check: a page at `evil.example` whose name is then
//! re-pointed at 127.0.0.1 is same-origin with the server as far as the browser can tell,
//! but its requests carry `Host: evil.example`. So on loopback (or when `--allow-host`
//! names hosts) a request whose `Host` is not a loopback name, the listen address or an
//! allowed host is refused.

use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::{AppState, ServerConfig};

pub async fn guard(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    req.extensions_mut()
        .insert(crate::extract::BodyLimit(state.config.max_body_bytes));
    if let Some(host) = foreign_host(&req, &state.config) {
        tracing::warn!("refused a request for host {host}");
        return ApiError::Forbidden(format!(
            "requests for host `{host}` are not allowed (see --allow-host)"
        ))
        .into_response();
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut cors: Option<HeaderValue> = None;
    if let Some(origin) = &origin {
        if let Some(allowed) = allowed_origin(&state.config.cors_origins, origin) {
            cors = Some(allowed);
        } else if !same_host(origin, req.headers()) {
            let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("(none)");
            tracing::warn!("refused a request from origin {origin} to host {host}");
            return ApiError::Forbidden(format!(
                "requests from origin {origin} are not allowed (see --cors-origin)"
            ))
            .into_response();
        }
    }
    // Preflights carry no credentials; they only ask which headers are allowed.
    let mut response = if req.method() == Method::OPTIONS && cors.is_some() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        if let Some(token) = &state.config.auth_token {
            if !authorized(&req, token) {
                return with_cors(ApiError::Unauthorized.into_response(), cors);
            }
        }
        next.run(req).await
    };
    response = with_cors(response, cors);
    response
}

/// The request's host when the configuration does not serve it: `None` when it is
/// served, when nothing restricts hosts (listening beyond loopback with no
/// `--allow-host`), or when the request names no host (browsers always send one).
fn foreign_host(req: &Request, config: &ServerConfig) -> Option<String> {
    if !config.listen.is_loopback() && config.allowed_hosts.is_empty() {
        return None;
    }
    let host = match req.headers().get(header::HOST) {
        Some(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        // HTTP/2 carries the host in the request target instead.
        None => req.uri().authority()?.as_str().to_string(),
    };
    (!host_allowed(&host, config)).then_some(host)
}

/// Whether `host` (a `Host` header: `name[:port]`, `[v6][:port]`) names this server: a
/// loopback address, `localhost`, the listen address or one of `--allow-host`. The port
/// is not compared; a rebinding page reaches the server's own port anyway.
fn host_allowed(host: &str, config: &ServerConfig) -> bool {
    let lower = host.to_ascii_lowercase();
    let (name, _) = split_port(&lower);
    let name = name.trim_end_matches('.');
    if let Ok(ip) = name.parse::<IpAddr>() {
        if ip.is_loopback() || ip == config.listen {
            return true;
        }
    } else if name == "localhost" {
        return true;
    }
    config.allowed_hosts.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        let (allowed, _) = split_port(&a);
        allowed.trim_end_matches('.') == name
    })
}

fn with_cors(mut response: Response, cors: Option<HeaderValue>) -> Response {
    if let Some(origin) = cors {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, PUT, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Content-Type, Authorization"),
        );
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// The `Access-Control-Allow-Origin` value for `origin`, when the configuration allows it.
fn allowed_origin(allowed: &[String], origin: &str) -> Option<HeaderValue> {
    let origin = origin.trim_end_matches('/');
    allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
        .then(|| HeaderValue::from_str(origin).ok())
        .flatten()
}

/// Whether `origin` (`scheme://host[:port]`) names the host the request was sent to. As in
/// ComfyUI, a side without a port is compared by host name alone.
fn same_host(origin: &str, headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        // HTTP/1.1 requires Host; without one there is nothing to be confused about.
        return true;
    };
    let Some(authority) = origin.split_once("://").map(|(_, rest)| rest) else {
        // `Origin: null` (sandboxed frames, file://) is a foreign page.
        return false;
    };
    let authority = authority
        .split('/')
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    if authority == host {
        return true;
    }
    let (oh, op) = split_port(&authority);
    let (hh, hp) = split_port(&host);
    (op.is_none() || hp.is_none()) && oh == hh && !oh.is_empty()
}

fn split_port(authority: &str) -> (&str, Option<&str>) {
    // `[::1]:8188`: the port follows the bracket.
    if let Some(rest) = authority.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
        _ => (authority, None),
    }
}

fn authorized(req: &Request, token: &str) -> bool {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if bearer.is_some_and(|b| constant_time_eq(b.as_bytes(), token.as_bytes())) {
        return true;
    }
    // WebSockets and <img src> cannot set headers; they pass the token in the query.
    req.uri().query().is_some_and(|q| {
        q.split('&').any(|kv| {
            kv.strip_prefix("token=")
                .is_some_and(|v| constant_time_eq(percent_decode(v).as_bytes(), token.as_bytes()))
        })
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match bytes[i] {
            b'%' if i + 2 < bytes.len() => hex(bytes[i + 1])
                .zip(hex(bytes[i + 2]))
                .map(|(h, l)| h * 16 + l),
            _ => None,
        };
        match (decoded, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks that a client-given relative path (a subfolder, or a subfolder plus a file
/// name) stays inside its folder by its form: no `..`, no root, no drive prefix.
pub fn relative_path(what: &str, value: &str) -> Result<PathBuf, ApiError> {
    if value.contains('\0') || value.contains('\\') {
        return Err(ApiError::bad(format!(
            "{what} `{value}` has a forbidden character"
        )));
    }
    let path = Path::new(value);
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(ApiError::Forbidden(format!(
                    "{what} `{value}` must stay inside its folder"
                )))
            }
        }
    }
    Ok(out)
}

/// A plain file name: one component, not hidden.
pub fn file_name(value: &str) -> Result<&str, ApiError> {
    if value.is_empty()
        || value.contains(['/', '\\', '\0'])
        || value == "."
        || value == ".."
        || value.starts_with('.')
    {
        return Err(ApiError::bad(format!("`{value}` is not a plain file name")));
    }
    if value.len() > 255 {
        return Err(ApiError::bad("file name longer than 255 bytes"));
    }
    Ok(value)
}

/// `path` resolved through symlinks, required to lie inside `root` (already canonical).
pub fn confined(root: &Path, path: &Path) -> Result<PathBuf, ApiError> {
    let real = path.canonicalize().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ApiError::NotFound(format!("{} does not exist", shown(root, path)))
        } else {
            ApiError::io(shown(root, path), e)
        }
    })?;
    if !real.starts_with(root) {
        return Err(ApiError::Forbidden(format!(
            "{} leads outside its folder",
            shown(root, path)
        )));
    }
    Ok(real)
}

// Names relative to the served folder: error messages should not reveal server paths.
fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| {
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_matching() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8188"));
        assert!(same_host("http://127.0.0.1:8188", &h));
        assert!(!same_host("http://127.0.0.1:9999", &h));
        assert!(!same_host("https://evil.example", &h));
        assert!(!same_host("null", &h));
        h.insert(header::HOST, HeaderValue::from_static("localhost"));
        assert!(same_host("http://localhost:3000", &h));
        h.insert(header::HOST, HeaderValue::from_static("[::1]:8188"));
        assert!(same_host("http://[::1]:8188", &h));
        assert!(!same_host("http://[::2]:8188", &h));
        assert!(allowed_origin(&["http://a.test".into()], "http://a.test").is_some());
        assert!(allowed_origin(&["http://a.test".into()], "http://b.test").is_none());
    }

    #[test]
    fn host_matching() {
        let dir = std::path::Path::new("/nonexistent");
        let mut c = ServerConfig::with_base(dir);
        for ok in [
            "127.0.0.1:8188",
            "localhost:8188",
            "LOCALHOST.",
            "[::1]:8188",
            "127.0.0.2",
            "[::1]",
        ] {
            assert!(host_allowed(ok, &c), "{ok}");
        }
        for bad in [
            "evil.example:8188",
            "evil.example",
            "10.0.0.1:8188",
            "localhost.evil.example",
            "[::2]:8188",
            "",
        ] {
            assert!(!host_allowed(bad, &c), "{bad}");
        }
        c.allowed_hosts = vec!["SDFlow.lan:443".into()];
        assert!(host_allowed("sdflow.lan:8188", &c));
        c.listen = IpAddr::from([192, 168, 1, 5]);
        assert!(host_allowed("192.168.1.5:8188", &c));
        assert!(!host_allowed("evil.example", &c));
    }

    #[test]
    fn relative_paths() {
        assert!(relative_path("subfolder", "a/b").is_ok());
        assert!(relative_path("subfolder", "").is_ok());
        assert!(relative_path("subfolder", "../x").is_err());
        assert!(relative_path("subfolder", "a/../../x").is_err());
        assert!(relative_path("subfolder", "/etc").is_err());
        assert!(file_name("x.png").is_ok());
        assert!(file_name("../x.png").is_err());
        assert!(file_name(".hidden").is_err());
        assert_eq!(percent_decode("a%20b+c"), "a b c");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
