#![no_main]
//! The streaming YAML reader (`declarative::yaml`, what `POST /config` and
//! `declarative_config` parse YAML with) against `serde_yaml`, which it replaced: for any text
//! both give the same value, or both refuse it. The differences allowed are the documented
//! ones: an alias expansion limit counted on the events read so far may refuse earlier, and
//! the merge key `<<`, which the reader applies as Kong's lyaml does and `serde_yaml` keeps as a
//! plain key (texts with `<<` are left to the unit tests, which hold the merge to a reference).

use turnpike_config::declarative::yaml;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.contains("<<") {
        return;
    }
    let ours = yaml::from_str(text);
    let theirs = serde_yaml::from_str::<serde_json::Value>(text);
    match (&ours, &theirs) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "values differ for {text:?}"),
        (Err(_), Err(_)) => {}
        (Err(e), Ok(_)) if e.starts_with("repetition limit") => {}
        _ => panic!("{text:?}: ours {ours:?}, serde_yaml {theirs:?}"),
    }
});
