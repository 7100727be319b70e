//! Kong Manager (Kong's admin web UI, a static app that talks to the Admin API), served as
//! Kong serves it: the build's files under `admin_gui_path`, `/kconfig.js` written the way
//! Kong writes it (`window.K_CONFIG`: where the Admin API is, the GUI's path, the version),
//! and `index.html` for the app's own paths. We do not ship Kong's files: `admin_gui_dir`
//! names a build of them.
//!
//! And CORS on the Admin API for Kong Manager loaded from another origin (see [`cors`]):
//! `admin_gui_url`'s origin with credentials, or (unset) this node's own Kong Manager with
//! credentials and `*` without them for any other page; preflight `OPTIONS` answered with 204.

use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use serde_json::json;

use crate::{message, Admin, Resp};

/// The preflight answer: the methods the Admin API takes, and the headers the page asked for.
pub(crate) fn preflight(admin: &Admin, origin: Option<&HeaderValue>, headers: &HeaderMap) -> Resp {
    let mut r = Response::new(crate::full(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, HEAD, PATCH, POST, PUT, DELETE"),
    );
    let asked = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or(HeaderValue::from_static("Content-Type"));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("3600"),
    );
    cors(admin, origin, &mut r);
    r
}

/// Adds the CORS headers to an Admin API answer.
///
/// With `admin_gui_url` set: its origin (the caller's when it is one of several), with
/// credentials, as Kong answers. Unset, Kong echoes any caller's `Origin` with
/// `Access-Control-Allow-Credentials: true`, so any web page an operator opens could drive the
/// Admin API with whatever credentials the browser holds for it (a reverse proxy's basic auth,
/// a cookie). Here only this node's own Kong Manager (an origin on an `admin_gui_listen`
/// port) is answered so; any other origin gets `*` without credentials: a browser then sends
/// nothing it holds for the Admin API. (Set `admin_gui_url` when Kong Manager is served from
/// elsewhere; see docs/admin-api-security.md.)
pub(crate) fn cors(admin: &Admin, origin: Option<&HeaderValue>, resp: &mut Resp) {
    let origin = origin.and_then(|o| o.to_str().ok());
    let allowed = &admin.conf.admin_gui_url;
    let h = resp.headers_mut();
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    let value = if allowed.is_empty() {
        match origin.filter(|o| own_gui(&admin.conf.admin_gui_listen, o)) {
            Some(o) => match HeaderValue::from_str(o) {
                Ok(v) => v,
                Err(_) => return,
            },
            None => {
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_ORIGIN,
                    HeaderValue::from_static("*"),
                );
                return;
            }
        }
    } else {
        // Several allowed origins: answer with the caller's when it is one of them.
        let pick = origin
            .and_then(|o| allowed.iter().find(|a| origin_of(a) == o))
            .unwrap_or(&allowed[0]);
        match HeaderValue::from_str(&origin_of(pick)) {
            Ok(v) => v,
            Err(_) => return,
        }
    };
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
}

/// Whether `origin` (`http://host:port`) is this node's Kong Manager: `http`, the port of an
/// `admin_gui_listen` address, and a host that address answers (any, for a wildcard address;
/// `localhost` for a loopback one).
fn own_gui(listen: &[turnpike_config::conf::ListenAddr], origin: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://") else {
        return false;
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        // No port: 80.
        return listen
            .iter()
            .any(|l| l.addr.port() == 80 && host_matches(l.addr.ip(), rest));
    };
    let Ok(port) = port.parse::<u16>() else {
        return false;
    };
    listen
        .iter()
        .any(|l| l.addr.port() == port && host_matches(l.addr.ip(), host))
}

fn host_matches(ip: std::net::IpAddr, host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if ip.is_unspecified() {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(h) => h == ip,
        Err(_) => ip.is_loopback() && host.eq_ignore_ascii_case("localhost"),
    }
}

/// `scheme://host[:port]` of a URL (what browsers send as `Origin`).
fn origin_of(url: &str) -> String {
    match url.find("://") {
        Some(i) => {
            let rest = &url[i + 3..];
            let end = rest.find('/').unwrap_or(rest.len());
            format!("{}{}", &url[..i + 3], &rest[..end])
        }
        None => url.to_string(),
    }
}

impl Admin {
    /// Kong Manager's listener.
    pub async fn handle_gui<B>(&self, req: Request<B>) -> Resp {
        let Some(dir) = self.conf.admin_gui_dir.clone() else {
            return message(StatusCode::NOT_FOUND, "Not found");
        };
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
        }
        let base = self.conf.admin_gui_path.as_str();
        let path = req.uri().path();
        let Some(rest) = path.strip_prefix(base) else {
            return message(StatusCode::NOT_FOUND, "Not found");
        };
        if !rest.is_empty() && !rest.starts_with('/') {
            return message(StatusCode::NOT_FOUND, "Not found");
        }
        let rest = rest.trim_start_matches('/');
        if rest == "kconfig.js" {
            return self.kconfig(&req);
        }
        let file = match safe_join(&dir, rest) {
            Some(f) if f.is_file() => f,
            // The app's own paths (`/services/...`) are routes of index.html.
            _ => dir.join("index.html"),
        };
        let Ok(body) = tokio::fs::read(&file).await else {
            return message(StatusCode::NOT_FOUND, "Not found");
        };
        let mut r = Response::new(crate::full(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(&file)),
        );
        let cache = if file.ends_with("index.html") {
            "no-store"
        } else {
            "public, max-age=3600"
        };
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
        r
    }

    /// `/kconfig.js`, as Kong writes it for Kong Manager.
    fn kconfig<B>(&self, req: &Request<B>) -> Resp {
        let port = |ssl: bool| {
            self.conf
                .admin_listen
                .iter()
                .find(|l| l.ssl == ssl)
                .map(|l| l.addr.port().to_string())
                .unwrap_or_default()
        };
        let _ = req;
        let config = json!({
            "ADMIN_GUI_AUTH": "",
            "ADMIN_GUI_URL": self.conf.admin_gui_url.first().cloned().unwrap_or_default(),
            "ADMIN_GUI_PATH": if self.conf.admin_gui_path.is_empty() { "/" } else { self.conf.admin_gui_path.as_str() },
            "ADMIN_API_URL": self.conf.admin_gui_api_url.clone().unwrap_or_default(),
            "ADMIN_API_PORT": port(false),
            "ADMIN_API_SSL_PORT": port(true),
            "KONG_VERSION": turnpike_plugins::KONG_VERSION,
            "KONG_EDITION": "community",
            "ANONYMOUS_REPORTS": "false",
        });
        let body = format!("window.K_CONFIG = {config};\n");
        let mut r = Response::new(crate::full(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/javascript"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    }
}

/// `dir/rest`, unless `rest` climbs out of `dir`.
fn safe_join(dir: &Path, rest: &str) -> Option<PathBuf> {
    let rest = crate::percent_decode_path(rest);
    let rel = Path::new(&rest);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(dir.join(rel))
}

fn content_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "application/javascript",
        "css" => "text/css",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_folder() {
        let d = Path::new("/srv/km");
        assert_eq!(safe_join(d, "assets/a.js"), Some(d.join("assets/a.js")));
        assert_eq!(safe_join(d, "../etc/passwd"), None);
        assert_eq!(safe_join(d, "a/%2e%2e/%2e%2e/x"), None);
        assert_eq!(safe_join(d, "/etc/passwd"), None);
        assert_eq!(
            origin_of("http://a.example:8002/manager"),
            "http://a.example:8002"
        );
    }

    use turnpike_config::conf::ListenAddr;

    fn listen(addr: &str) -> ListenAddr {
        ListenAddr {
            addr: addr.parse().unwrap(),
            ssl: false,
            http2: false,
            reuseport: false,
            backlog: 511,
            stream: false,
            udp: false,
            proxy_protocol: false,
        }
    }

    #[test]
    fn only_this_nodes_kong_manager_is_its_own() {
        let local = [listen("127.0.0.1:8002")];
        assert!(own_gui(&local, "http://127.0.0.1:8002"));
        assert!(own_gui(&local, "http://localhost:8002"));
        assert!(!own_gui(&local, "http://127.0.0.1:8003"));
        assert!(!own_gui(&local, "https://127.0.0.1:8002"));
        assert!(!own_gui(&local, "http://evil.example:8002"));
        assert!(!own_gui(&local, "http://10.0.0.1:8002"));
        let any = [listen("0.0.0.0:8002")];
        assert!(own_gui(&any, "http://gw.internal:8002"));
        assert!(!own_gui(&any, "http://gw.internal"));
        assert!(!own_gui(&[], "http://127.0.0.1:8002"));
    }
}
