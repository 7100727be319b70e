//! Kong's migrations of older declarative formats.

use serde_json::Value;

/// Kong's `route_path` migration for formats 1.1 and 2.1: a path that is not a plain path is a
/// regex and gets the `~` marker that 3.0 requires.
pub(super) fn migrate_route_paths(input: &Value) -> Value {
    fn is_plain(p: &str) -> bool {
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"./-_~%".contains(&b))
    }
    fn walk(v: &mut Value, in_route: bool) {
        if let Value::Object(m) = v {
            if in_route {
                if let Some(Value::Array(paths)) = m.get_mut("paths") {
                    for p in paths.iter_mut() {
                        if let Value::String(s) = p {
                            if !s.starts_with('~') && !is_plain(s) {
                                *s = format!("~{s}");
                            }
                        }
                    }
                }
            }
            for (k, child) in m.iter_mut() {
                if let Value::Array(items) = child {
                    for item in items.iter_mut() {
                        walk(item, k == "routes");
                    }
                }
            }
        }
    }
    let mut out = input.clone();
    if let Value::Object(m) = &mut out {
        for (k, child) in m.iter_mut() {
            if let Value::Array(items) = child {
                for item in items.iter_mut() {
                    walk(item, k == "routes");
                }
            }
        }
    }
    out
}
