//! `turnpike doctor`: what operators forget, checked against the machine and the
//! configuration. Each finding states the value found, the value recommended and the command
//! that fixes it (sysctl, ulimit, or the Kubernetes `securityContext.sysctls` form). The same
//! checks run at start and are logged as warnings.

use std::fmt;

use turnpike_config::Conf;
use turnpike_proxy::BUILD_PROFILE;

/// Client connections a worker is sized for (nginx's `worker_connections` in Kong's template).
pub const WORKER_CONNECTIONS: u64 = 16384;

#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub check: &'static str,
    pub found: String,
    pub recommended: String,
    pub fix: String,
    pub why: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: found {}, recommended {}. {}\n    fix: {}",
            self.check, self.found, self.recommended, self.why, self.fix
        )
    }
}

/// What the checks read from the machine (a struct so that tests can pass their own).
#[derive(Debug, Clone)]
pub struct Machine {
    /// The soft and hard open-file limits.
    pub nofile: (u64, u64),
    pub file_max: Option<u64>,
    pub somaxconn: Option<u64>,
    pub tcp_max_syn_backlog: Option<u64>,
    pub ip_local_port_range: Option<(u64, u64)>,
    pub cores: u64,
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Machine {
    pub fn inspect() -> Machine {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct we pass.
        let nofile = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            (lim.rlim_cur, lim.rlim_max)
        } else {
            (0, 0)
        };
        let ports = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| {
                let mut it = s.split_whitespace().filter_map(|x| x.parse::<u64>().ok());
                Some((it.next()?, it.next()?))
            });
        Machine {
            nofile,
            file_max: read_u64("/proc/sys/fs/file-max"),
            somaxconn: read_u64("/proc/sys/net/core/somaxconn"),
            tcp_max_syn_backlog: read_u64("/proc/sys/net/ipv4/tcp_max_syn_backlog"),
            ip_local_port_range: ports,
            cores: std::thread::available_parallelism()
                .map(|n| n.get() as u64)
                .unwrap_or(1),
        }
    }
}

fn sysctl_fix(name: &str, value: &str) -> String {
    format!(
        "sysctl -w {name}={value} (persist in /etc/sysctl.d/); Kubernetes: securityContext: {{sysctls: [{{name: {name}, value: \"{value}\"}}]}}"
    )
}

/// Runs every check; an empty list means nothing needs attention.
pub fn check(conf: &Conf, m: &Machine) -> Vec<Finding> {
    let mut out = Vec::new();
    let workers = conf.worker_processes as u64;

    // Each proxied request holds a client and an upstream socket.
    let want_nofile = (workers * WORKER_CONNECTIONS * 2).max(65536);
    if m.nofile.0 < want_nofile {
        out.push(Finding {
            check: "open files limit (RLIMIT_NOFILE)",
            found: format!("soft {} / hard {}", m.nofile.0, m.nofile.1),
            recommended: format!(
                "at least {want_nofile} ({workers} workers x {WORKER_CONNECTIONS} connections x 2 sockets)"
            ),
            fix: format!(
                "ulimit -n {want_nofile} before starting, or LimitNOFILE={want_nofile} in the systemd unit; Docker: --ulimit nofile={want_nofile}:{want_nofile}"
            ),
            why: "Past it, accept() and connect() fail with EMFILE and clients see resets.".into(),
        });
    }
    if let Some(max) = m.file_max {
        if max < want_nofile {
            out.push(Finding {
                check: "fs.file-max",
                found: max.to_string(),
                recommended: format!("at least {want_nofile}"),
                fix: sysctl_fix("fs.file-max", &want_nofile.to_string()),
                why:
                    "The whole system's open-file ceiling is below what the gateway alone may need."
                        .into(),
            });
        }
    }

    let backlog = conf
        .proxy_listen
        .iter()
        .map(|l| l.backlog as u64)
        .max()
        .unwrap_or(0);
    for (name, value) in [
        ("net.core.somaxconn", m.somaxconn),
        ("net.ipv4.tcp_max_syn_backlog", m.tcp_max_syn_backlog),
    ] {
        if let Some(v) = value {
            if v < backlog {
                out.push(Finding {
                    check: name,
                    found: v.to_string(),
                    recommended: format!("at least {backlog} (the proxy_listen backlog)"),
                    fix: sysctl_fix(name, &backlog.to_string()),
                    why: "The kernel caps the listen queue: bursts of new connections are dropped or delayed by SYN retries (1 s, 3 s).".into(),
                });
            }
        }
    }

    if let Some((lo, hi)) = m.ip_local_port_range {
        let range = hi.saturating_sub(lo) + 1;
        // Every pooled or in-flight upstream connection holds a local port per upstream
        // address; half the range is kept for churn (TIME_WAIT).
        let need = workers * conf.upstream_keepalive_pool_size as u64 * 2;
        if range < need.max(28232) {
            out.push(Finding {
                check: "net.ipv4.ip_local_port_range",
                found: format!("{lo} {hi} ({range} ports)"),
                recommended: format!(
                    "at least {} ports, e.g. 1024 65535",
                    need.max(28232)
                ),
                fix: sysctl_fix("net.ipv4.ip_local_port_range", "1024 65535"),
                why: "Upstream connections to one address share this range; when it runs out, connect() fails with EADDRNOTAVAIL.".into(),
            });
        }
    }

    if workers > m.cores {
        out.push(Finding {
            check: "worker processes",
            found: format!("{workers} workers on {} cores", m.cores),
            recommended: format!("{} (one per core: nginx_worker_processes = auto)", m.cores),
            fix: "set nginx_worker_processes = auto".into(),
            why: "More workers than cores only adds context switches.".into(),
        });
    } else if workers < m.cores {
        out.push(Finding {
            check: "worker processes",
            found: format!("{workers} workers on {} cores", m.cores),
            recommended: format!(
                "{} (one per core) unless cores are kept for other work",
                m.cores
            ),
            fix: "set nginx_worker_processes = auto".into(),
            why: "Cores without a worker serve no traffic.".into(),
        });
    }

    if conf.upstream_keepalive_pool_size == 0 {
        out.push(Finding {
            check: "upstream keepalive",
            found: "upstream_keepalive_pool_size = 0 (disabled)".into(),
            recommended: "512".into(),
            fix: "set upstream_keepalive_pool_size = 512".into(),
            why: "Every request opens and closes an upstream connection: a gateway measured at 94k requests/s fell to 6k this way.".into(),
        });
    } else if conf.upstream_keepalive_pool_size < 16 {
        out.push(Finding {
            check: "upstream keepalive",
            found: format!(
                "upstream_keepalive_pool_size = {}",
                conf.upstream_keepalive_pool_size
            ),
            recommended: "512".into(),
            fix: "set upstream_keepalive_pool_size = 512".into(),
            why: "A tiny pool closes connections that concurrent requests need again.".into(),
        });
    }
    if conf.upstream_keepalive_max_requests > 0 && conf.upstream_keepalive_max_requests < 100 {
        out.push(Finding {
            check: "upstream keepalive",
            found: format!(
                "upstream_keepalive_max_requests = {}",
                conf.upstream_keepalive_max_requests
            ),
            recommended: "10000".into(),
            fix: "set upstream_keepalive_max_requests = 10000".into(),
            why: "Connections are closed after very few requests.".into(),
        });
    }
    if conf.keepalive_requests > 0 && conf.keepalive_requests < 100 {
        out.push(Finding {
            check: "client keepalive",
            found: format!(
                "nginx_http_keepalive_requests = {}",
                conf.keepalive_requests
            ),
            recommended: "10000".into(),
            fix: "set nginx_http_keepalive_requests = 10000".into(),
            why: "Clients must reconnect (and redo TLS) after very few requests.".into(),
        });
    }
    if conf.keepalive_timeout.is_zero() {
        out.push(Finding {
            check: "client keepalive",
            found: "nginx_http_keepalive_timeout = 0 (disabled)".into(),
            recommended: "60s".into(),
            fix: "set nginx_http_keepalive_timeout = 60s".into(),
            why: "Every client request pays a new connection.".into(),
        });
    }
    if let Some(log) = &conf.proxy_access_log {
        out.push(Finding {
            check: "access log",
            found: format!("proxy_access_log = {log}"),
            recommended: "off, or a log shipped by a plugin (http-log, file-log)".into(),
            fix: "set proxy_access_log = off".into(),
            why: "Writing a line per request costs throughput on the request path.".into(),
        });
    }
    if BUILD_PROFILE == "debug" {
        out.push(Finding {
            check: "build profile",
            found: "debug".into(),
            recommended: "release".into(),
            fix: "cargo build --release (scripts/setup.sh does)".into(),
            why: "A debug build is many times slower.".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> Conf {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.conf");
        std::fs::write(&path, text).unwrap();
        Conf::load(Some(&path), &[], &mut Vec::new()).unwrap()
    }

    fn good_machine(cores: u64) -> Machine {
        Machine {
            nofile: (1 << 20, 1 << 20),
            file_max: Some(1 << 30),
            somaxconn: Some(65535),
            tcp_max_syn_backlog: Some(65535),
            ip_local_port_range: Some((1024, 65535)),
            cores,
        }
    }

    #[test]
    fn a_tuned_machine_and_config_leave_only_the_build() {
        let c = conf("nginx_worker_processes = 2\n");
        let f = check(&c, &good_machine(2));
        let names: Vec<_> = f.iter().map(|f| f.check).collect();
        if BUILD_PROFILE == "debug" {
            assert_eq!(names, vec!["build profile"]);
        } else {
            assert!(names.is_empty(), "{names:?}");
        }
    }

    #[test]
    fn each_forgotten_setting_is_named_with_its_fix() {
        let c = conf(
            "nginx_worker_processes = 4\nupstream_keepalive_pool_size = 0\nnginx_http_keepalive_requests = 10\nproxy_access_log = /tmp/access.log\n",
        );
        let m = Machine {
            nofile: (1024, 4096),
            file_max: Some(10000),
            somaxconn: Some(128),
            tcp_max_syn_backlog: Some(256),
            ip_local_port_range: Some((32768, 32768 + 999)),
            cores: 2,
        };
        let f = check(&c, &m);
        let find = |name: &str| {
            f.iter()
                .find(|x| x.check == name)
                .unwrap_or_else(|| panic!("no {name} in {f:#?}"))
        };
        let nofile = find("open files limit (RLIMIT_NOFILE)");
        assert_eq!(nofile.found, "soft 1024 / hard 4096");
        assert!(nofile.fix.contains("ulimit -n 131072"), "{}", nofile.fix);
        assert!(find("fs.file-max")
            .fix
            .contains("sysctl -w fs.file-max=131072"));
        let s = find("net.core.somaxconn");
        assert_eq!(s.found, "128");
        assert!(s.fix.contains("sysctl -w net.core.somaxconn=16384"));
        assert!(s.fix.contains("securityContext"));
        assert!(find("net.ipv4.tcp_max_syn_backlog")
            .recommended
            .contains("16384"));
        assert!(find("net.ipv4.ip_local_port_range")
            .found
            .contains("1000 ports"));
        assert!(find("worker processes")
            .found
            .contains("4 workers on 2 cores"));
        assert!(find("upstream keepalive").found.contains("disabled"));
        assert!(find("client keepalive").found.contains("= 10"));
        assert!(find("access log").found.contains("/tmp/access.log"));
    }
}
