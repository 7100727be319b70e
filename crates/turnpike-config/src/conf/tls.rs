//! The proxy's TLS properties, as Kong reads them (`ssl_cipher_suite`, `ssl_protocols`,
//! `ssl_ciphers`, `ssl_prefer_server_ciphers`, `ssl_session_tickets`,
//! `ssl_session_cache_size`; kong.conf.default). Suites are named as IANA names them, which the
//! TLS library maps to its own; TLS 1.3's suites are always on (nginx's `ssl_ciphers` does not
//! touch them either).

use super::*;

/// What the proxy's TLS listeners serve.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConf {
    pub tls12: bool,
    pub tls13: bool,
    /// TLS 1.2 suites in preference order (IANA names); `None`: the library's default set
    /// (Kong's `intermediate`, less the DHE suites nobody here supports).
    pub tls12_suites: Option<Vec<&'static str>>,
    /// The server's suite order wins over the client's.
    pub prefer_server_ciphers: bool,
    /// TLS session tickets (stateless resumption); off: resumption by the session cache only.
    pub session_tickets: bool,
    /// Sessions the shared cache holds (`ssl_session_cache_size`, about 4,000 per megabyte
    /// as nginx counts).
    pub session_cache_entries: usize,
}

impl Default for TlsConf {
    fn default() -> Self {
        TlsConf {
            tls12: true,
            tls13: true,
            tls12_suites: None,
            prefer_server_ciphers: false,
            session_tickets: true,
            session_cache_entries: 40_960,
        }
    }
}

/// OpenSSL's names of the TLS 1.2 suites the proxy can serve, with their IANA names.
const TLS12_SUITES: &[(&str, &str)] = &[
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

pub(super) fn tls_conf(
    get: &dyn Fn(&str) -> String,
    warnings: &mut Vec<String>,
) -> Result<TlsConf, ConfError> {
    let mut t = TlsConf::default();
    let suite = get("ssl_cipher_suite");
    match suite.trim() {
        "intermediate" => {}
        "modern" => t.tls12 = false,
        "fips" => {
            t.tls12_suites = Some(
                TLS12_SUITES
                    .iter()
                    .filter(|(o, _)| !o.contains("CHACHA20"))
                    .map(|(_, i)| *i)
                    .collect(),
            );
        }
        "old" => {
            t.prefer_server_ciphers = true;
            warnings.push(
                "ssl_cipher_suite = old: TLSv1 and TLSv1.1 cannot be served; TLS 1.2 and 1.3 are"
                    .into(),
            );
        }
        "custom" => {
            t.tls12 = false;
            t.tls13 = false;
            for p in get("ssl_protocols").split_whitespace() {
                match p {
                    "TLSv1.2" => t.tls12 = true,
                    "TLSv1.3" => t.tls13 = true,
                    "TLSv1" | "TLSv1.1" | "SSLv2" | "SSLv3" => warnings.push(format!(
                        "ssl_protocols: {p} cannot be served and is left out"
                    )),
                    other => {
                        return Err(invalid(
                            "ssl_protocols",
                            format!("unknown protocol '{other}' (use TLSv1.2 and/or TLSv1.3)"),
                        ))
                    }
                }
            }
            if !t.tls12 && !t.tls13 {
                return Err(invalid(
                    "ssl_protocols",
                    "must name TLSv1.2 or TLSv1.3 (the protocols that can be served)".into(),
                ));
            }
            let ciphers = get("ssl_ciphers");
            if !ciphers.trim().is_empty() {
                let mut known = Vec::new();
                let mut unknown = Vec::new();
                for c in ciphers.split(':').map(str::trim).filter(|c| !c.is_empty()) {
                    match TLS12_SUITES.iter().find(|(o, i)| *o == c || *i == c) {
                        Some((_, iana)) if !known.contains(iana) => known.push(*iana),
                        Some(_) => {}
                        None => unknown.push(c),
                    }
                }
                if !unknown.is_empty() {
                    warnings.push(format!(
                        "ssl_ciphers: {} cannot be served and are left out",
                        unknown.join(", ")
                    ));
                }
                if t.tls12 && known.is_empty() {
                    return Err(invalid(
                        "ssl_ciphers",
                        format!(
                            "names no TLS 1.2 suite that can be served (these can: {})",
                            TLS12_SUITES
                                .iter()
                                .map(|(o, _)| *o)
                                .collect::<Vec<_>>()
                                .join(":")
                        ),
                    ));
                }
                t.tls12_suites = Some(known);
            }
            t.prefer_server_ciphers = on_off(&get("ssl_prefer_server_ciphers"))
                .ok_or_else(|| invalid("ssl_prefer_server_ciphers", "must be on or off".into()))?;
        }
        other => {
            return Err(invalid(
                "ssl_cipher_suite",
                format!("'{other}' must be one of modern, intermediate, old, fips, custom"),
            ))
        }
    }
    t.session_tickets = on_off(&get("ssl_session_tickets"))
        .ok_or_else(|| invalid("ssl_session_tickets", "must be on or off".into()))?;
    let size = parse_size(&get("ssl_session_cache_size"))
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            invalid(
                "ssl_session_cache_size",
                "must be a positive size such as 10m".into(),
            )
        })?;
    t.session_cache_entries = (size / 256).max(1);
    Ok(t)
}

fn on_off(v: &str) -> Option<bool> {
    match v.trim() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(pairs: &[(&str, &str)]) -> (Result<TlsConf, ConfError>, Vec<String>) {
        let defaults = [
            ("ssl_cipher_suite", "intermediate"),
            ("ssl_protocols", "TLSv1.2 TLSv1.3"),
            ("ssl_ciphers", ""),
            ("ssl_prefer_server_ciphers", "on"),
            ("ssl_session_tickets", "on"),
            ("ssl_session_cache_size", "10m"),
        ];
        let get = |name: &str| {
            pairs
                .iter()
                .chain(defaults.iter())
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
                .unwrap_or_default()
        };
        let mut w = Vec::new();
        (tls_conf(&get, &mut w), w)
    }

    #[test]
    fn kong_defaults() {
        let (t, w) = conf(&[]);
        assert_eq!(t.unwrap(), TlsConf::default());
        assert!(w.is_empty());
    }

    #[test]
    fn suites_and_protocols() {
        let t = conf(&[("ssl_cipher_suite", "modern")]).0.unwrap();
        assert!(!t.tls12 && t.tls13);
        // ssl_protocols only counts with custom.
        let t = conf(&[("ssl_protocols", "TLSv1.3")]).0.unwrap();
        assert!(t.tls12);
        let (t, w) = conf(&[
            ("ssl_cipher_suite", "custom"),
            ("ssl_protocols", "TLSv1.1 TLSv1.2"),
            (
                "ssl_ciphers",
                "ECDHE-RSA-AES256-GCM-SHA384:AES128-SHA:ECDHE-RSA-AES128-GCM-SHA256",
            ),
        ]);
        let t = t.unwrap();
        assert!(t.tls12 && !t.tls13 && t.prefer_server_ciphers);
        assert_eq!(
            t.tls12_suites,
            Some(vec![
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
            ])
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            conf(&[("ssl_cipher_suite", "custom"), ("ssl_ciphers", "RC4-MD5")])
                .0
                .is_err()
        );
        assert!(
            conf(&[("ssl_cipher_suite", "custom"), ("ssl_protocols", "TLSv1")])
                .0
                .is_err()
        );
        assert!(conf(&[("ssl_cipher_suite", "strong")]).0.is_err());
        let (t, w) = conf(&[("ssl_cipher_suite", "old")]);
        assert!(t.unwrap().tls12 && w.len() == 1);
    }

    #[test]
    fn sessions() {
        let t = conf(&[
            ("ssl_session_tickets", "off"),
            ("ssl_session_cache_size", "1m"),
        ])
        .0
        .unwrap();
        assert!(!t.session_tickets);
        assert_eq!(t.session_cache_entries, 4096);
        assert!(conf(&[("ssl_session_cache_size", "0")]).0.is_err());
        assert!(conf(&[("ssl_session_tickets", "yes")]).0.is_err());
    }
}
