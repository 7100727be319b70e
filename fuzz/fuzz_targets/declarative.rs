#![no_main]
//! The declarative loader (YAML or JSON text -> validated config, as `POST /config` and
//! `declarative_config` read it): any text gives a config or Kong's error, never a panic or a
//! hang; a config it accepts loads again from its own export, to the same entities.

use std::sync::OnceLock;

use turnpike_config::declarative;

fn plugins() -> &'static turnpike_plugins::Registry {
    static P: OnceLock<turnpike_plugins::Registry> = OnceLock::new();
    P.get_or_init(turnpike_plugins::bundled)
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(value) = declarative::parse_text(text) else {
        return;
    };
    let Ok(cfg) = declarative::load(&value, plugins()) else {
        return;
    };
    let again = declarative::load(&cfg.to_json(), plugins()).expect("an export loads");
    assert_eq!(cfg.services.len(), again.services.len());
    assert_eq!(cfg.routes.len(), again.routes.len());
    assert_eq!(cfg.consumers.len(), again.consumers.len());
    assert_eq!(cfg.plugins.len(), again.plugins.len());
});
