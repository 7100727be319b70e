//! Response compression, as Kong users turn it on with injected nginx directives
//! (`nginx_proxy_gzip = on`, `nginx_proxy_gzip_types`, `_min_length`, `_comp_level`, `_vary`,
//! `_proxied`, `_http_version`; the `nginx_http_gzip*` forms apply too, the proxy's winning),
//! with nginx's defaults and rules (ngx_http_gzip_module).

use super::*;

/// nginx's `gzip_proxied` conditions for requests that came through a proxy (`Via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxied {
    Expired,
    NoCache,
    NoStore,
    Private,
    NoLastModified,
    NoEtag,
    Auth,
    Any,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GzipConf {
    /// MIME types compressed (`text/html` always is, as in nginx); `*`: any.
    pub types: Vec<String>,
    pub any_type: bool,
    /// Responses whose Content-Length is below this are sent as they are.
    pub min_length: u64,
    pub level: u32,
    pub vary: bool,
    /// Empty: `off` (proxied requests get no compression).
    pub proxied: Vec<Proxied>,
    /// `gzip_http_version 1.0`: HTTP/1.0 requests are compressed too.
    pub http_1_0: bool,
}

/// The compression properties; `None` when gzip is off.
pub(super) fn gzip_conf(get: &dyn Fn(&str) -> String) -> Result<Option<GzipConf>, ConfError> {
    // The proxy server's directive, else the http block's.
    let prop = |name: &str| -> (String, String) {
        let proxy = format!("nginx_proxy_{name}");
        match get(&proxy) {
            v if !v.is_empty() => (proxy, v),
            _ => {
                let http = format!("nginx_http_{name}");
                let v = get(&http);
                (http, v)
            }
        }
    };
    let (name, on) = prop("gzip");
    match on.trim() {
        "" | "off" => return Ok(None),
        "on" => {}
        _ => return Err(invalid(&name, "must be on or off".into())),
    }
    let (_, types) = prop("gzip_types");
    let types: Vec<String> = types
        .split_whitespace()
        .map(|t| t.to_ascii_lowercase())
        .collect();
    let any_type = types.iter().any(|t| t == "*");
    let (name, min) = prop("gzip_min_length");
    let min_length = match min.trim() {
        "" => 20,
        v => parse_size(v).ok_or_else(|| invalid(&name, "must be a size".into()))? as u64,
    };
    let (name, level) = prop("gzip_comp_level");
    let level = match level.trim() {
        "" => 1,
        v => v
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=9).contains(l))
            .ok_or_else(|| invalid(&name, "must be 1..9".into()))?,
    };
    let (name, vary) = prop("gzip_vary");
    let vary = match vary.trim() {
        "" | "off" => false,
        "on" => true,
        _ => return Err(invalid(&name, "must be on or off".into())),
    };
    let (name, proxied) = prop("gzip_proxied");
    let mut conditions = Vec::new();
    for p in proxied.split_whitespace() {
        conditions.push(match p {
            "off" => continue,
            "expired" => Proxied::Expired,
            "no-cache" => Proxied::NoCache,
            "no-store" => Proxied::NoStore,
            "private" => Proxied::Private,
            "no_last_modified" => Proxied::NoLastModified,
            "no_etag" => Proxied::NoEtag,
            "auth" => Proxied::Auth,
            "any" => Proxied::Any,
            other => return Err(invalid(&name, format!("unknown value '{other}'"))),
        });
    }
    let (name, version) = prop("gzip_http_version");
    let http_1_0 = match version.trim() {
        "" | "1.1" => false,
        "1.0" => true,
        _ => return Err(invalid(&name, "must be 1.0 or 1.1".into())),
    };
    Ok(Some(GzipConf {
        types,
        any_type,
        min_length,
        level,
        vary,
        proxied: conditions,
        http_1_0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(props: &[(&str, &str)]) -> Result<Option<GzipConf>, ConfError> {
        let props: Vec<(String, String)> = props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        gzip_conf(&|n: &str| {
            props
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        })
    }

    #[test]
    fn nginx_defaults_and_the_proxy_block_first() {
        assert_eq!(conf(&[]).unwrap(), None);
        let g = conf(&[("nginx_proxy_gzip", "on")]).unwrap().unwrap();
        assert_eq!((g.min_length, g.level, g.vary), (20, 1, false));
        assert!(g.proxied.is_empty() && !g.any_type && !g.http_1_0);
        let g = conf(&[
            ("nginx_http_gzip", "on"),
            ("nginx_http_gzip_types", "text/plain application/json"),
            ("nginx_proxy_gzip_types", "*"),
            ("nginx_proxy_gzip_min_length", "1k"),
            ("nginx_proxy_gzip_proxied", "expired no-cache auth"),
        ])
        .unwrap()
        .unwrap();
        assert!(g.any_type);
        assert_eq!(g.min_length, 1024);
        assert_eq!(
            g.proxied,
            [Proxied::Expired, Proxied::NoCache, Proxied::Auth]
        );
        assert!(conf(&[("nginx_proxy_gzip", "yes")]).is_err());
        assert!(conf(&[
            ("nginx_proxy_gzip", "on"),
            ("nginx_proxy_gzip_comp_level", "10")
        ])
        .is_err());
    }
}
