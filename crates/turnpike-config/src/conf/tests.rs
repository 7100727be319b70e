use super::*;

fn load(text: &str, env: &[(&str, &str)]) -> Result<(Conf, Vec<String>), ConfError> {
    let dir = std::env::temp_dir().join(format!("tp-conf-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("turnpike.conf");
    std::fs::write(&f, text).unwrap();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let mut w = Vec::new();
    let c = Conf::load(Some(&f), &env, &mut w);
    // Every test run used to leave one folder per call behind.
    let _ = std::fs::remove_dir_all(&dir);
    Ok((c?, w))
}

#[test]
fn pg_keepalive_timeout_as_kong_reads_it() {
    let (c, _) = load("", &[]).unwrap();
    assert_eq!(c.pg.keepalive_timeout, Some(Duration::from_secs(60)));
    let (c, _) = load("pg_keepalive_timeout = 0\n", &[]).unwrap();
    assert_eq!(c.pg.keepalive_timeout, None);
    let (c, _) = load("pg_keepalive_timeout = 2500\n", &[]).unwrap();
    assert_eq!(c.pg.keepalive_timeout, Some(Duration::from_millis(2500)));
    assert!(load("pg_keepalive_timeout = soon\n", &[]).is_err());
}

#[test]
fn defaults_match_kong() {
    let (c, _) = load("", &[]).unwrap();
    assert_eq!(c.proxy_listen.len(), 2);
    assert_eq!(c.proxy_listen[0].addr.to_string(), "0.0.0.0:8000");
    assert!(!c.proxy_listen[0].ssl);
    assert!(c.proxy_listen[1].ssl && c.proxy_listen[1].http2);
    assert_eq!(c.admin_listen[0].addr.to_string(), "127.0.0.1:8001");
    assert_eq!(c.upstream_keepalive_pool_size, 512);
    assert_eq!(c.upstream_keepalive_max_requests, 10000);
    assert_eq!(c.upstream_keepalive_idle_timeout, Duration::from_secs(60));
    assert_eq!(c.keepalive_requests, 10000);
    assert_eq!(c.proxy_listen[0].backlog, 16384);
    assert!(c.headers.server && c.headers.via && c.headers.proxy_latency && c.headers.request_id);
    assert!(!c.headers.upstream_status);
    assert_eq!(c.max_header_size, 32 * 1024);
}

#[test]
fn file_then_env_precedence() {
    let (c, _) = load(
        "upstream_keepalive_pool_size = 10 # comment\nworker_processes = 3\n",
        &[
            ("KONG_UPSTREAM_KEEPALIVE_POOL_SIZE", "20"),
            ("TURNPIKE_NGINX_WORKER_PROCESSES", "2"),
        ],
    )
    .unwrap();
    assert_eq!(c.upstream_keepalive_pool_size, 20);
    assert_eq!(c.worker_processes, 2);
    assert_eq!(
        c.sources["nginx_worker_processes"],
        "env TURNPIKE_NGINX_WORKER_PROCESSES"
    );
}

#[test]
fn dns_properties_are_kongs() {
    let (c, w) = load("", &[]).unwrap();
    assert_eq!(c.dns, DnsConf::default());
    assert!(w.is_empty(), "{w:?}");
    let (c, _) = load(
        "dns_resolver = 127.0.0.1:5353, ::1, 10.0.0.2\ndns_order = srv,aaaa,a\ndns_valid_ttl = 5\ndns_stale_ttl = 0\n",
        &[],
    )
    .unwrap();
    assert_eq!(
        c.dns.resolver,
        vec![
            "127.0.0.1:5353".parse().unwrap(),
            "[::1]:53".parse().unwrap(),
            "10.0.0.2:53".parse().unwrap()
        ]
    );
    assert_eq!(
        c.dns.order,
        vec![DnsRecord::Srv, DnsRecord::Aaaa, DnsRecord::A]
    );
    assert_eq!(c.dns.valid_ttl, Some(Duration::from_secs(5)));
    assert_eq!(c.dns.stale_ttl, Duration::ZERO);
    for (bad, says) in [
        (
            "dns_resolver = dns.example.com",
            "dns_resolver: 'dns.example.com'",
        ),
        ("dns_order = LAST,MX", "dns_order: invalid entry 'MX'"),
        (
            "dns_order = LAST,CNAME",
            "dns_order: must name at least one",
        ),
        ("dns_stale_ttl = -1", "dns_stale_ttl: must be a number"),
        ("dns_no_sync = maybe", "dns_no_sync"),
    ] {
        let err = load(bad, &[]).unwrap_err().to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn unknown_property_is_an_error_and_kong_property_a_warning() {
    let err = load("no_such_thing = 1\n", &[]).unwrap_err();
    assert!(
        err.to_string().contains("unknown property 'no_such_thing'"),
        "{err}"
    );
    let (_, w) = load("lua_ssl_verify_depth = 2\n", &[]).unwrap();
    assert!(w[0].contains("lua_ssl_verify_depth"), "{w:?}");
    // Variables that are not properties (KONG_VERSION in images, a script's own
    // TURNPIKE_SETUP_BENCH) do not stop a node: one warning names them.
    let (_, w) = load(
        "",
        &[
            ("KONG_VERSION", "3.9"),
            ("TURNPIKE_SETUP_BENCH", "1"),
            ("TURNPIKE_BOGUS", "1"),
        ],
    )
    .unwrap();
    let about: Vec<&String> = w
        .iter()
        .filter(|m| m.contains("name no property"))
        .collect();
    assert_eq!(about.len(), 1, "{w:?}");
    for name in ["KONG_VERSION", "TURNPIKE_SETUP_BENCH", "TURNPIKE_BOGUS"] {
        assert!(about[0].contains(name), "{w:?}");
    }
    // A property's bad value given by a variable is still an error.
    assert!(load("", &[("TURNPIKE_DNS_STALE_TTL", "-1")]).is_err());
}

#[test]
fn invalid_values_are_errors() {
    for bad in [
        "upstream_keepalive_pool_size = -1",
        "proxy_listen = nowhere",
        "proxy_listen = 127.0.0.1:8000 sparkly",
        "proxy_listen = 127.0.0.1:8000 backlog=x",
        "headers = X-Nope",
        "database = mongodb",
        "log_level = chatty",
        "nginx_worker_processes = 0",
        "trusted_ips = 10.0.0.0/99",
        "ssl_cert = /a.pem",
        "nginx_http_keepalive_timeout = soon",
        "router_flavor = atc",
        "just a line",
    ] {
        assert!(load(bad, &[]).is_err(), "{bad} should be rejected");
    }
}

#[test]
fn listen_flags_and_headers() {
    let l = parse_listen(
        "proxy_listen",
        "127.0.0.1:0 ssl http2 reuseport backlog=99, [::1]:9000",
    )
    .unwrap();
    assert_eq!(l.len(), 2);
    assert!(l[0].ssl && l[0].http2 && l[0].reuseport && l[0].backlog == 99);
    assert!(l[1].addr.is_ipv6());
    assert!(!l[0].proxy_protocol);
    let pp = parse_listen("proxy_listen", "127.0.0.1:0 proxy_protocol deferred").unwrap();
    assert!(pp[0].proxy_protocol);
    assert!(parse_listen("x", "off").unwrap().is_empty());
    let h = parse_headers("off").unwrap();
    assert_eq!(h, HeaderSet::default());
    let h = parse_headers("via, X-Kong-Upstream-Status").unwrap();
    assert!(h.via && h.upstream_status && !h.server);
}

#[test]
fn durations_and_sizes() {
    assert_eq!(parse_duration("75"), Some(Duration::from_secs(75)));
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_size("8k"), Some(8192));
    assert_eq!(parse_size("1m"), Some(1 << 20));
    assert!(parse_size("lots").is_none());
}

#[test]
fn real_ip_header_proxy_protocol_needs_a_flagged_listener() {
    let e = load("real_ip_header = proxy_protocol\n", &[])
        .err()
        .unwrap();
    assert!(format!("{e:?}").contains("proxy_protocol"), "{e:?}");
    let (c, _) = load(
        "real_ip_header = proxy_protocol\nproxy_listen = 127.0.0.1:0 proxy_protocol\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.real_ip_header, "proxy_protocol");
    // Kong 3.x's name for it wins.
    let (c, _) = load(
        "nginx_proxy_real_ip_header = proxy_protocol\nproxy_listen = 127.0.0.1:0 proxy_protocol\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.real_ip_header, "proxy_protocol");
}

#[test]
fn plugin_servers_as_kongs_conf_loader_reads_them() {
    let (c, w) = load(
        "pluginserver_names = my-plugin, Other\n\
         pluginserver_my_plugin_start_cmd = /opt/my-plugin -p /tmp\n\
         pluginserver_my_plugin_query_cmd = /opt/my-plugin -dump\n\
         prefix = /tmp/tp-prefix\n",
        &[
            ("KONG_PLUGINSERVER_OTHER_QUERY_CMD", "/opt/other --dump"),
            ("TURNPIKE_PLUGINSERVER_OTHER_SOCKET", "/run/other.sock"),
        ],
    )
    .unwrap();
    assert_eq!(
        c.pluginservers,
        vec![
            PluginServerConf {
                name: "my-plugin".into(),
                socket: PathBuf::from("/tmp/tp-prefix/my-plugin.socket"),
                start_command: Some("/opt/my-plugin -p /tmp".into()),
                query_command: "/opt/my-plugin -dump".into(),
            },
            PluginServerConf {
                name: "other".into(),
                socket: PathBuf::from("/run/other.sock"),
                start_command: None,
                query_command: "/opt/other --dump".into(),
            },
        ]
    );
    // No start command: managed outside, with Kong's warning.
    assert!(w.iter().any(|w| w
        == "start_command undefined for pluginserver other; assuming external process management"));
    // No query command (and no binary in /usr/local/bin): Kong's error.
    let e = load("pluginserver_names = nowhere\n", &[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("query_command undefined for pluginserver nowhere"),
        "{e}"
    );
}

#[test]
fn a_control_plane_may_proxy_nothing_and_hybrid_properties_read_from_the_file() {
    let c = rcgen::generate_simple_self_signed(vec!["kong_clustering".into()]).unwrap();
    let dir = std::env::temp_dir().join(format!("tp-conf-cp-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("c.crt"), dir.join("c.key"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.key_pair.serialize_pem()).unwrap();
    let text = format!(
        "role = control_plane\nproxy_listen = off\ncluster_listen = 127.0.0.1:9005\ncluster_cert = {}\ncluster_cert_key = {}\n",
        cert.display(),
        key.display()
    );
    let (conf, _) = load(&text, &[]).unwrap();
    assert!(conf.proxy_listen.is_empty());
    assert_eq!(conf.cluster.role, Role::ControlPlane);
    assert_eq!(conf.cluster.listen[0].addr.port(), 9005);
    assert_eq!(conf.to_json()["role"], "control_plane");
    assert_eq!(conf.to_json()["cluster_cert_key"], "******");
    // Any other node must proxy something.
    assert!(load("proxy_listen = off\n", &[]).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
