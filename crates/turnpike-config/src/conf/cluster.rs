//! Hybrid mode's properties (Kong's `role`, `cluster_*` and `proxy_server`), read and
//! cross-checked as Kong's conf loader does (`kong/conf_loader/parse.lua`), with its messages.

use super::*;

/// Kong's `role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every node holds the database (or a declarative file) itself.
    Traditional,
    /// Holds the database and the Admin API; serves the config to data planes.
    ControlPlane,
    /// No database: its config comes from the control plane.
    DataPlane,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Traditional => "traditional",
            Role::ControlPlane => "control_plane",
            Role::DataPlane => "data_plane",
        }
    }
}

/// Kong's `cluster_mtls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterMtls {
    /// Both sides hold the same certificate: the control plane accepts a data plane whose
    /// certificate is its own (by SHA-256 digest); the data plane trusts that certificate.
    Shared,
    /// Certificates signed by `cluster_ca_cert`, verified as a chain.
    Pki,
}

/// The clustering properties of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConf {
    pub role: Role,
    /// `cluster_listen` (control plane).
    pub listen: Vec<ListenAddr>,
    /// `cluster_control_plane` (data plane): `host:port`.
    pub control_plane: String,
    /// `cluster_cert`, `cluster_cert_key` and `cluster_ca_cert` as PEM text (each given as a
    /// path, PEM, or base64-encoded PEM, as Kong takes them); empty on a traditional node.
    pub cert: String,
    pub cert_key: String,
    pub ca_cert: Option<String>,
    pub mtls: ClusterMtls,
    /// `cluster_server_name`: the name a data plane asks for (pki mode; shared mode always
    /// asks for `kong_clustering`).
    pub server_name: Option<String>,
    /// `cluster_max_payload`: the largest WebSocket message either side takes.
    pub max_payload: usize,
    /// `cluster_data_plane_purge_delay`: how long a data plane's record outlives its last ping.
    pub data_plane_purge_delay: Duration,
    /// `cluster_dp_labels`, in order.
    pub dp_labels: Vec<(String, String)>,
    /// `cluster_use_proxy`: the data plane reaches the control plane through `proxy_server`
    /// (an HTTP CONNECT proxy).
    pub use_proxy: bool,
    /// `proxy_server`.
    pub proxy_server: Option<String>,
}

/// The certificate value as PEM: a path to read, PEM as it is, or base64 of PEM (Kong's
/// `try_decode_base64`).
fn pem_value(value: &str) -> Result<String, String> {
    let path = std::path::Path::new(value);
    if !value.contains('\n') && path.is_file() {
        return std::fs::read_to_string(path).map_err(|e| format!("cannot read {value}: {e}"));
    }
    if value.contains("-----BEGIN") {
        return Ok(value.to_string());
    }
    use base64::Engine;
    let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    match base64::engine::general_purpose::STANDARD.decode(compact.as_bytes()) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(_) => Ok(value.to_string()),
    }
}

/// Kong's label rules (the Labels AIP): up to 10, keys and values of 1 to 63 characters
/// matching `[a-z0-9]([\w.:-]*[a-z0-9]|)` (any case), keys not starting with a reserved prefix.
fn labels(raw: &[String]) -> Result<Vec<(String, String)>, String> {
    const BASE: &str = "[a-z0-9]([\\w\\.:-]*[a-z0-9]|)$";
    if raw.len() > 10 {
        return Err("labels validation failed: count exceeded 10 max elements".into());
    }
    let base = regex::Regex::new(r"(?i)^[a-z0-9]([\w.:-]*[a-z0-9])?$").expect("label pattern");
    let entry = |s: &str, key: bool| -> Result<(), String> {
        if s.is_empty() || s.len() > 63 {
            return Err(format!("{s} must have between 1 and 63 characters"));
        }
        let lower = s.to_ascii_lowercase();
        let reserved = ["kong", "konnect", "insomnia", "mesh", "kic"]
            .iter()
            .any(|p| lower.starts_with(p));
        if !base.is_match(s) || (key && reserved) {
            let pattern = if key {
                format!("(?!kong)(?!konnect)(?!insomnia)(?!mesh)(?!kic){BASE}")
            } else {
                BASE.to_string()
            };
            return Err(format!("{s} is invalid. Must match pattern: {pattern}"));
        }
        Ok(())
    };
    let mut out = Vec::new();
    for kv in raw {
        let (k, v) = kv.split_once(':').unwrap_or(("", ""));
        entry(k, true).map_err(|e| format!("label key validation failed: {e}"))?;
        entry(v, false).map_err(|e| format!("label value validation failed: {e}"))?;
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Reads the clustering properties, with Kong's cross-checks against the role; every problem
/// is collected, as Kong lists them all.
pub(super) fn cluster_conf(
    get: &dyn Fn(&str) -> String,
    database: Database,
    proxy_listen: &[ListenAddr],
    admin_listen: &[ListenAddr],
) -> Result<ClusterConf, ConfError> {
    let role = match get("role").trim() {
        "traditional" => Role::Traditional,
        "control_plane" => Role::ControlPlane,
        "data_plane" => Role::DataPlane,
        other => {
            return Err(invalid(
                "role",
                format!("'{other}' must be one of: traditional, control_plane, data_plane"),
            ))
        }
    };
    let mtls = match get("cluster_mtls").trim() {
        "shared" => ClusterMtls::Shared,
        "pki" => ClusterMtls::Pki,
        other => {
            return Err(invalid(
                "cluster_mtls",
                format!("'{other}' must be one of: shared, pki"),
            ))
        }
    };
    let bool_prop = |name: &str| -> Result<bool, ConfError> {
        match get(name).trim() {
            "on" | "true" => Ok(true),
            "off" | "false" | "" => Ok(false),
            other => Err(invalid(name, format!("'{other}' must be 'on' or 'off'"))),
        }
    };
    let use_proxy = bool_prop("cluster_use_proxy")?;
    let number = |name: &str| -> Result<f64, ConfError> {
        get(name)
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite())
            .ok_or_else(|| invalid(name, "must be a number".into()))
    };
    let max_payload = number("cluster_max_payload")?;
    let purge_delay = number("cluster_data_plane_purge_delay")?;
    let listen = match get("cluster_listen").trim() {
        "off" | "" => Vec::new(),
        text => parse_listen("cluster_listen", text)?,
    };
    let raw_labels: Vec<String> = get("cluster_dp_labels")
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let opt = |name: &str| Some(get(name).trim().to_string()).filter(|s| !s.is_empty());
    let proxy_server = opt("proxy_server");
    let mut errors: Vec<String> = Vec::new();

    let (mut cert, mut cert_key, mut ca_cert) = (String::new(), String::new(), None);
    if role != Role::Traditional {
        match (opt("cluster_cert"), opt("cluster_cert_key")) {
            (Some(c), Some(k)) => {
                match pem_value(&c) {
                    Ok(pem) if crate::declarative::pem::certificates(&pem).is_ok() => cert = pem,
                    Ok(_) => {
                        errors.push(format!("cluster_cert: failed loading certificate from {c}"))
                    }
                    Err(e) => errors.push(format!("cluster_cert: {e}")),
                }
                match pem_value(&k) {
                    Ok(pem) if crate::declarative::pem::private_key(&pem).is_ok() => cert_key = pem,
                    Ok(_) => errors.push(format!("cluster_cert_key: failed loading key from {k}")),
                    Err(e) => errors.push(format!("cluster_cert_key: {e}")),
                }
            }
            _ => errors
                .push("cluster certificate and key must be provided to use Hybrid mode".into()),
        }
        if let Some(ca) = opt("cluster_ca_cert") {
            match pem_value(&ca) {
                Ok(pem) if crate::declarative::pem::certificates(&pem).is_ok() => {
                    ca_cert = Some(pem)
                }
                Ok(_) => errors.push(format!(
                    "cluster_ca_cert: failed loading certificate from {ca}"
                )),
                Err(e) => errors.push(format!("cluster_ca_cert: {e}")),
            }
        }
    }
    match role {
        Role::ControlPlane => {
            if admin_listen.is_empty() {
                errors.push("admin_listen must be specified when role = \"control_plane\"".into());
            }
            if mtls == ClusterMtls::Pki && opt("cluster_ca_cert").is_none() {
                errors.push("cluster_ca_cert must be specified when cluster_mtls = \"pki\"".into());
            }
            if listen.is_empty() {
                errors
                    .push("cluster_listen must be specified when role = \"control_plane\"".into());
            }
            if database == Database::Off {
                errors
                    .push("in-memory storage can not be used when role = \"control_plane\"".into());
            }
            if use_proxy {
                errors
                    .push("cluster_use_proxy can not be used when role = \"control_plane\"".into());
            }
            if !raw_labels.is_empty() {
                errors
                    .push("cluster_dp_labels can not be used when role = \"control_plane\"".into());
            }
        }
        Role::DataPlane => {
            if proxy_listen.is_empty() {
                errors.push("proxy_listen must be specified when role = \"data_plane\"".into());
            }
            if database != Database::Off {
                errors.push(
                    "only in-memory storage can be used when role = \"data_plane\"\nHint: set database = off in your kong.conf"
                        .into(),
                );
            }
            if use_proxy && proxy_server.is_none() {
                errors.push(
                    "cluster_use_proxy is turned on but no proxy_server is configured".into(),
                );
            }
        }
        Role::Traditional => {
            if !raw_labels.is_empty() {
                errors.push("cluster_dp_labels can only be used when role = \"data_plane\"".into());
            }
        }
    }
    let dp_labels = if role == Role::DataPlane {
        labels(&raw_labels).unwrap_or_else(|e| {
            errors.push(e);
            Vec::new()
        })
    } else {
        Vec::new()
    };
    if let Some(p) = &proxy_server {
        match p.split_once("://") {
            Some(("http" | "https", rest)) if !rest.trim_start_matches('/').is_empty() => {
                if rest.contains('?') || rest.contains('#') {
                    errors.push("fragments, query strings or parameters are meaningless in proxy configuration".into());
                }
            }
            Some(("http" | "https", _)) => errors.push("proxy_server missing host".into()),
            Some((scheme, _)) => errors.push(format!(
                "proxy_server only supports \"http\" and \"https\", got {scheme}"
            )),
            None => errors.push("proxy_server must be a URL (http://host:port)".into()),
        }
    }
    if purge_delay < 60.0 {
        errors.push("cluster_data_plane_purge_delay must be 60 or greater".into());
    }
    if max_payload < 4194304.0 {
        errors.push("cluster_max_payload must be 4194304 (4MB) or greater".into());
    }
    if !errors.is_empty() {
        return Err(ConfError::Invalid(errors.join("\n")));
    }
    Ok(ClusterConf {
        role,
        listen,
        control_plane: get("cluster_control_plane").trim().to_string(),
        cert,
        cert_key,
        ca_cert,
        mtls,
        server_name: opt("cluster_server_name"),
        max_payload: max_payload as usize,
        data_plane_purge_delay: Duration::from_secs_f64(purge_delay),
        dp_labels,
        use_proxy,
        proxy_server,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(props: &[(&str, &str)], database: Database) -> Result<ClusterConf, String> {
        let get = |name: &str| {
            props
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
                .or_else(|| {
                    file::DEFAULTS
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, v)| v.to_string())
                })
                .unwrap_or_default()
        };
        let proxy = parse_listen("proxy_listen", "127.0.0.1:8000").unwrap();
        let admin = parse_listen("admin_listen", "127.0.0.1:8001").unwrap();
        cluster_conf(&get, database, &proxy, &admin).map_err(|e| e.to_string())
    }

    fn pem_pair() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["kong_clustering".into()]).unwrap();
        (c.cert.pem(), c.key_pair.serialize_pem())
    }

    #[test]
    fn a_traditional_node_needs_nothing() {
        let c = read(&[], Database::Sqlite).unwrap();
        assert_eq!(c.role, Role::Traditional);
        assert_eq!(c.max_payload, 16777216);
        assert_eq!(c.data_plane_purge_delay, Duration::from_secs(1209600));
        assert_eq!(c.control_plane, "127.0.0.1:8005");
    }

    #[test]
    fn kongs_cross_checks_and_messages() {
        let e = read(&[("role", "control_plane")], Database::Off).unwrap_err();
        assert!(
            e.contains("cluster certificate and key must be provided to use Hybrid mode"),
            "{e}"
        );
        assert!(
            e.contains("in-memory storage can not be used when role = \"control_plane\""),
            "{e}"
        );
        let e = read(&[("role", "data_plane")], Database::Postgres).unwrap_err();
        assert!(e.contains("only in-memory storage can be used when role = \"data_plane\"\nHint: set database = off in your kong.conf"), "{e}");
        let e = read(&[("cluster_dp_labels", "a:b")], Database::Sqlite).unwrap_err();
        assert!(
            e.contains("cluster_dp_labels can only be used when role = \"data_plane\""),
            "{e}"
        );
        let e = read(&[("cluster_max_payload", "1000")], Database::Sqlite).unwrap_err();
        assert!(
            e.contains("cluster_max_payload must be 4194304 (4MB) or greater"),
            "{e}"
        );
        let e = read(
            &[("cluster_data_plane_purge_delay", "59")],
            Database::Sqlite,
        )
        .unwrap_err();
        assert!(
            e.contains("cluster_data_plane_purge_delay must be 60 or greater"),
            "{e}"
        );
        let e = read(&[("role", "edge")], Database::Sqlite).unwrap_err();
        assert!(e.contains("role"), "{e}");
        let (cert, key) = pem_pair();
        let e = read(
            &[
                ("role", "control_plane"),
                ("cluster_mtls", "pki"),
                ("cluster_cert", &cert),
                ("cluster_cert_key", &key),
            ],
            Database::Sqlite,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "cluster_ca_cert must be specified when cluster_mtls = \"pki\""
        );
        let e = read(
            &[
                ("role", "data_plane"),
                ("database", "off"),
                ("cluster_use_proxy", "on"),
                ("cluster_cert", &cert),
                ("cluster_cert_key", &key),
            ],
            Database::Off,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "cluster_use_proxy is turned on but no proxy_server is configured"
        );
        let e = read(
            &[
                ("role", "control_plane"),
                ("cluster_cert", "garbage"),
                ("cluster_cert_key", &key),
            ],
            Database::Sqlite,
        )
        .unwrap_err();
        assert_eq!(e, "cluster_cert: failed loading certificate from garbage");
    }

    #[test]
    fn certificates_as_a_path_pem_or_base64() {
        use base64::Engine;
        let (cert, key) = pem_pair();
        let dir = std::env::temp_dir().join(format!("tp-cluster-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.crt");
        std::fs::write(&path, &cert).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(key.as_bytes());
        let c = read(
            &[
                ("role", "data_plane"),
                ("cluster_cert", path.to_str().unwrap()),
                ("cluster_cert_key", &b64),
                ("cluster_dp_labels", "deployment:mycloud,region:us-east-1"),
            ],
            Database::Off,
        )
        .unwrap();
        assert_eq!(
            (c.cert.as_str(), c.cert_key.as_str()),
            (cert.as_str(), key.as_str())
        );
        assert_eq!(
            c.dp_labels,
            vec![
                ("deployment".into(), "mycloud".into()),
                ("region".into(), "us-east-1".into())
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn labels_follow_kongs_rules() {
        assert!(labels(&["a:b".into()]).is_ok());
        assert_eq!(
            labels(&["kong_x:b".into()]).unwrap_err(),
            "label key validation failed: kong_x is invalid. Must match pattern: (?!kong)(?!konnect)(?!insomnia)(?!mesh)(?!kic)[a-z0-9]([\\w\\.:-]*[a-z0-9]|)$"
        );
        assert_eq!(
            labels(&["a:".into()]).unwrap_err(),
            "label value validation failed:  must have between 1 and 63 characters"
        );
        let many: Vec<String> = (0..11).map(|i| format!("k{i}:v")).collect();
        assert_eq!(
            labels(&many).unwrap_err(),
            "labels validation failed: count exceeded 10 max elements"
        );
    }
}
