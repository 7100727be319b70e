//! Kong Manager, Kong's admin web UI, built from `../shared/tools/kong-manager` (cached) and
//! served by Turnpike (`admin_gui_listen`, `admin_gui_dir`), driven in Debian's headless
//! Chromium by puppeteer-core (`kong-manager.mjs`): every list page loads without a failed
//! Admin API request, and a service, a route, a consumer with a key and a plugin are created
//! through its forms and then serve traffic.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

fn tools_cache() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(".cache/turnpike-tools")
}

fn kong_manager_build() -> PathBuf {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/kong-manager/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("run build.sh");
    assert!(
        out.status.success(),
        "building Kong Manager failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    )
}

/// puppeteer-core from the npm registry, into the tools cache (it drives the system Chromium;
/// no browser download).
fn puppeteer() -> PathBuf {
    let dir = tools_cache().join("puppeteer");
    let entry = dir.join("node_modules/puppeteer-core/lib/esm/puppeteer/puppeteer-core.js");
    if !entry.is_file() {
        let ok = Command::new("npm")
            .args(["i", "--silent", "puppeteer-core@23", "--prefix"])
            .arg(&dir)
            .status()
            .expect("run npm")
            .success();
        assert!(ok, "npm could not install puppeteer-core");
    }
    entry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kong_manager_pages_and_forms() {
    let build = kong_manager_build();
    let driver = puppeteer();
    let up = Upstream::start("kong-manager");
    let gui_port = free_port();
    let gw = Gateway::sqlite()
        .env(
            "TURNPIKE_ADMIN_GUI_LISTEN",
            &format!("127.0.0.1:{gui_port}"),
        )
        .env("TURNPIKE_ADMIN_GUI_DIR", build.to_str().unwrap())
        .start();
    let gui = format!("http://127.0.0.1:{gui_port}");
    // What Kong writes for Kong Manager, and the app's own paths answered by index.html.
    let kconfig = reqwest_get(&format!("{gui}/kconfig.js")).await;
    assert!(kconfig.starts_with("window.K_CONFIG = {"), "{kconfig}");
    assert!(
        kconfig.contains(&format!("\"ADMIN_API_PORT\":\"{}\"", gw.admin.port())),
        "{kconfig}"
    );
    let index = reqwest_get(&format!("{gui}/services/some-id")).await;
    assert!(index.contains("<div id=\"app\""), "{index}");

    let shots = std::env::var("KONG_MANAGER_SCREENSHOTS").unwrap_or_default();
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/kong-manager.mjs"))
        .env("PUPPETEER", &driver)
        .env("GUI_URL", &gui)
        .env("ADMIN_URL", format!("http://{}", gw.admin))
        .env("UPSTREAM_URL", up.url())
        .env("SCREENSHOTS", &shots)
        .output()
        .expect("run node");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    for (page, failed) in result["pages"].as_object().unwrap() {
        assert_eq!(failed, &serde_json::json!([]), "page {page}: {result}");
    }
    for (step, outcome) in result["steps"].as_object().unwrap() {
        assert_eq!(outcome, "ok", "form {step}: {result}");
    }
    assert_eq!(result["failures"], serde_json::json!([]), "{result}");
    // What the forms created serves traffic.
    let proxy = gw.proxy;
    until_status(proxy, "/km", 401).await;
    let r = call(proxy, "GET", "/km", &[("apikey", "km-secret")]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["headers"]["x-consumer-username"], "km-user");
}

async fn reqwest_get(url: &str) -> String {
    let out = Command::new("curl")
        .args(["-s", url])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
