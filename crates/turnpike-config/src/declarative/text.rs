//! Declarative config text (JSON or YAML) to a JSON value, refusing what is too deep.

use serde_json::Value;

use super::*;

/// Parses declarative config text: JSON when it starts with `{`, YAML otherwise.
/// The deepest flow nesting (`[`/`{`) a YAML text may have. Kong's entities nest a few levels;
/// the YAML parser's time grows with the square of the depth (200 KB of `[` took 16 s), so
/// deeper text is refused before it is parsed.
pub const MAX_FLOW_DEPTH: usize = 512;

/// The deepest `[`/`{` nesting of `text`, outside quoted strings and comments; stops counting
/// once past `limit`.
fn flow_depth(text: &str, limit: usize) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut quote: Option<u8> = None;
    let mut prev = b'\n';
    let mut comment = false;
    for &b in text.as_bytes() {
        if comment {
            comment = b != b'\n';
        } else if let Some(q) = quote {
            // '' inside a single-quoted scalar reads as an end and a start: same result.
            if b == q && !(q == b'"' && prev == b'\\') {
                quote = None;
            }
        } else {
            match b {
                b'#' if prev.is_ascii_whitespace() => comment = true,
                b'"' | b'\''
                    if matches!(prev, b' ' | b'\t' | b'\n' | b'[' | b'{' | b',' | b':') =>
                {
                    quote = Some(b)
                }
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                    if max > limit {
                        return max;
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        prev = if prev == b'\\' && b == b'\\' { b' ' } else { b };
    }
    max
}

/// YAML text as the JSON text of the value [`parse_text`] makes of it, for the streaming
/// reader; `None` where `parse_text` refuses the text (it then says why).
pub(super) fn yaml_as_json(text: &str) -> Option<String> {
    if flow_depth(text, MAX_FLOW_DEPTH) > MAX_FLOW_DEPTH {
        return None;
    }
    yaml::to_json_text(text).ok()
}

pub fn parse_text(text: &str) -> Result<Value, DeclarativeError> {
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') && flow_depth(text, MAX_FLOW_DEPTH) > MAX_FLOW_DEPTH {
        return Err(DeclarativeError::message(format!(
            "failed parsing declarative configuration: nested deeper than {MAX_FLOW_DEPTH} levels"
        )));
    }
    let v: Result<Value, String> = if trimmed.starts_with('{') {
        serde_json::from_str(text)
            .map_err(|e| format!("failed parsing declarative configuration: {e}"))
    } else {
        yaml::from_str(text).map_err(|e| format!("failed parsing declarative configuration: {e}"))
    };
    v.map_err(DeclarativeError::message)
}
