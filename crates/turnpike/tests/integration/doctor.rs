//! `turnpike doctor` on the real binary, on a machine made to lack something: a low open-file
//! limit (set with `prlimit`, as an operator's forgotten `ulimit -n` would leave it).

use std::process::Command;

#[test]
fn doctor_names_a_low_open_file_limit_and_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("prlimit")
        .args(["--nofile=1024:1024", crate::common::bin(), "doctor"])
        .env("TURNPIKE_PREFIX", dir.path())
        .env("TURNPIKE_NGINX_WORKER_PROCESSES", "2")
        .output()
        .expect("run prlimit (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("open files limit (RLIMIT_NOFILE): found soft 1024 / hard 1024, recommended at least 65536"),
        "{text}"
    );
    assert!(text.contains("fix: ulimit -n 65536"), "{text}");

    // A config that turns upstream keepalive off is named too (the limit cannot be raised
    // above the hard limit in every test environment, so only what is added is checked).
    let out = Command::new("prlimit")
        .args(["--nofile=1024:1024", crate::common::bin(), "doctor"])
        .env("TURNPIKE_PREFIX", dir.path())
        .env("TURNPIKE_UPSTREAM_KEEPALIVE_POOL_SIZE", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("upstream keepalive: found upstream_keepalive_pool_size = 0 (disabled)"),
        "{text}"
    );
    assert!(
        text.contains("fix: set upstream_keepalive_pool_size = 512"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1));
}
