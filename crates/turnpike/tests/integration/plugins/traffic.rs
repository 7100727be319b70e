//! redirect and bot-detection on the real binary, as Kong documents them: Kong's status,
//! headers and bodies; declarative and Admin API configs, bad ones refused in Kong's shape.

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_and_bot_detection() {
    let up = Upstream::start("traffic");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: moved
    paths: [/moved]
    plugins:
    - name: redirect
      config: {{location: "https://new.example.com/docs?lang=en"}}
  - name: keep
    paths: [/keep]
    plugins:
    - name: redirect
      config: {{location: "https://new.example.com/ignored", status_code: 308, incoming_path: keep}}
  - name: merge
    paths: [/merge]
    plugins:
    - name: redirect
      config: {{location: "https://new.example.com/base?b=loc", keep_incoming_path: false, incoming_path: merge}}
  - name: bots
    paths: [/bots]
    plugins:
    - name: bot-detection
      config: {{allow: ["^MyCrawler/"], deny: ["(?i)evil"]}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;

    let r = call(p, "GET", "/moved/x?y=1", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("location"),
        Some("https://new.example.com/docs?lang=en")
    );
    assert_eq!(&r.body[..], b"redirecting");
    let r = call(p, "POST", "/keep/a/b?c=d", &[]).await;
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://new.example.com/keep/a/b?c=d")
    );
    let r = call(p, "GET", "/merge/x?a=req&b=req", &[]).await;
    assert_eq!(
        r.header("location"),
        Some("https://new.example.com/base/merge/x?a=req&b=loc"),
        "the location's arguments win"
    );

    for (agent, status) in [
        ("Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0", 200),
        ("curl/8.5.0", 200),
        ("Googlebot/2.1 (+http://www.google.com/bot.html)", 403),
        ("Python-urllib/3.11", 403),
        ("MyCrawler/1.0 bot", 200),
        ("Mozilla/5.0 EVIL scanner", 403),
    ] {
        let r = call(p, "GET", "/bots", &[("user-agent", agent)]).await;
        assert_eq!(r.status, status, "{agent}");
        if status == 403 {
            assert_eq!(r.json(), json!({"message": "Forbidden"}));
        }
    }
    let r = call_raw(
        p,
        "GET",
        "/bots",
        &[("user-agent", b"a"), ("user-agent", b"b")],
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"message": "Only one User-Agent header allowed"})
        )
    );
}

#[tokio::test]
async fn bad_configs_are_refused() {
    let gw = Gateway::sqlite().start();
    for (body, field) in [
        (json!({"name": "redirect", "config": {}}), "location"),
        (
            json!({"name": "redirect", "config": {"location": "https://x", "status_code": 99}}),
            "status_code",
        ),
        (
            json!({"name": "redirect", "config": {"location": "https://x", "incoming_path": "drop"}}),
            "incoming_path",
        ),
        (
            json!({"name": "bot-detection", "config": {"deny": ["("]}}),
            "deny",
        ),
    ] {
        let r = gw.admin("POST", "/plugins", Some(body.clone())).await;
        assert_eq!(r.status, 400, "{body}: {:?}", r.json());
        assert!(
            !r.json()["fields"]["config"][field].is_null(),
            "{body}: {:?}",
            r.json()
        );
    }
    // Kong 2's names are read as Kong 3's.
    let r = gw
        .admin(
            "POST",
            "/plugins",
            Some(json!({"name": "bot-detection", "config": {"whitelist": ["ok"], "blacklist": ["bad"]}})),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(r.json()["config"]["allow"], json!(["ok"]));
    assert_eq!(r.json()["config"]["deny"], json!(["bad"]));
}
