//! Large YAML configs parsed entity by entity. serde_yaml reads a whole document into a list
//! of parser events before building any value: about 27 bytes of events per byte of YAML (a
//! 50 MiB config peaked near 2 GB). A Kong config is a few top-level keys, most of its bytes in
//! block sequences of entities; each top-level entry and each item of those sequences is
//! parsed on its own here, so the event list only ever holds one entity.
//!
//! Only plain block layouts are split. Anything else (anchors and aliases, which may cross
//! entities; tags; directives or several documents; flow collections or odd indentation at
//! the top level) answers `None`, and the caller parses the whole text as before: same value,
//! same error messages. The `declarative` fuzz target holds the two ways to the same value.

use serde_json::{Map, Value};

/// Below this size the whole text is parsed at once: splitting would gain nothing.
pub const MIN_SPLIT: usize = 256 * 1024;

/// The value of `text` parsed piece by piece, or `None` when its layout is not one this
/// splits (or a piece does not parse: the whole text then gives the error, with its line).
pub fn parse(text: &str) -> Option<Value> {
    if !splittable(text) {
        return None;
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut top = Map::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if is_blank_or_comment(line) {
            i += 1;
            continue;
        }
        // A top-level key at column 0: `name:` then its value, inline or on indented lines.
        if line.starts_with([' ', '\t', '-', '[', '{', '"', '\'']) {
            return None;
        }
        let colon = line.find(": ").or_else(|| {
            let t = line.trim_end();
            t.ends_with(':').then(|| t.len() - 1)
        })?;
        let key = &line[..colon];
        if key.is_empty() || key.contains(['#', '"', '\'', '{', '[', '&', '*', '!', '?']) {
            return None;
        }
        let rest = line[colon + 1..].trim();
        // The entry's lines: up to the next line at column 0 that is not blank or a comment.
        let mut end = i + 1;
        // (A block sequence may sit at its key's own indentation: `- ` at column 0 goes on.)
        while end < lines.len()
            && (is_blank_or_comment(lines[end])
                || lines[end].starts_with(' ')
                || lines[end].starts_with("- ")
                || lines[end].trim_end() == "-")
        {
            end += 1;
        }
        let body = &lines[i + 1..end];
        let value = if !(rest.is_empty() || rest.starts_with('#')) {
            // Inline value (a scalar or a flow collection that may go on below): as a whole.
            let piece: String = lines[i..end].concat();
            let mut m: Map<String, Value> = serde_yaml::from_str(&piece).ok()?;
            m.remove(key)?
        } else {
            sequence_items(body).or_else(|| {
                let piece: String = lines[i..end].concat();
                serde_yaml::from_str::<Map<String, Value>>(&piece)
                    .ok()
                    .and_then(|mut m| m.remove(key))
            })?
        };
        if top.insert(key.to_string(), value).is_some() {
            return None;
        }
        i = end;
    }
    Some(Value::Object(top))
}

/// A block sequence's items parsed one at a time: `body` is the lines under a key; `None` when
/// they are not a block sequence (or an item does not parse alone).
fn sequence_items(body: &[&str]) -> Option<Value> {
    let first = body.iter().find(|l| !is_blank_or_comment(l))?;
    let indent = first.len() - first.trim_start_matches(' ').len();
    let dash = &first[indent..];
    if !(dash.starts_with("- ") || dash.trim_end() == "-") {
        return None;
    }
    let mut items = Vec::new();
    let mut start: Option<usize> = None;
    let parse_item = |lines: &[&str]| -> Option<Value> {
        // The item, moved to column 0: a one-element sequence document.
        let mut piece = String::new();
        for l in lines {
            if l.len() > indent && l.as_bytes()[..indent].iter().all(|b| *b == b' ') {
                piece.push_str(&l[indent..]);
            } else if is_blank_or_comment(l) {
                piece.push('\n');
            } else {
                return None;
            }
        }
        let mut v: Vec<Value> = serde_yaml::from_str(&piece).ok()?;
        (v.len() == 1).then(|| v.pop()).flatten()
    };
    for (n, l) in body.iter().enumerate() {
        if is_blank_or_comment(l) {
            continue;
        }
        let ind = l.len() - l.trim_start_matches(' ').len();
        if ind < indent {
            return None;
        }
        if ind == indent {
            let rest = &l[ind..];
            if !(rest.starts_with("- ") || rest.trim_end() == "-") {
                return None;
            }
            if let Some(s) = start {
                items.push(parse_item(&body[s..n])?);
            }
            start = Some(n);
        }
    }
    if let Some(s) = start {
        items.push(parse_item(&body[s..])?);
    }
    Some(Value::Array(items))
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#')
}

/// Whether the text has none of what may tie entities together or change how a document
/// reads (anchors, aliases, tags, directives, document markers, tabs).
fn splittable(text: &str) -> bool {
    if text.contains('\t')
        || text.contains("\n---")
        || text.starts_with("---")
        || text.starts_with('%')
    {
        return false;
    }
    let b = text.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if matches!(c, b'&' | b'*' | b'!')
            && (i == 0 || matches!(b[i - 1], b' ' | b'\n' | b'[' | b'{' | b',' | b'-' | b':'))
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(text: &str) {
        let whole: Value = serde_yaml::from_str(text).unwrap();
        assert_eq!(parse(text), Some(whole), "{text}");
    }

    #[test]
    fn pieces_give_the_whole_value() {
        same("_format_version: \"3.0\"\nservices:\n- name: a\n  url: http://h\n  routes:\n  - paths: [/a]\n    hosts:\n    - \"*.example.com\"\n\n# a comment\n- name: b\n  host: h\n  tags: [x, y]\nconsumers:\n  - username: u\n    keyauth_credentials:\n      - key: k\n  - username: v\n_comment: |\n  text\n  more\n");
        same("_format_version: '3.0'\n_transform: false\nservices: []\nroutes: [{name: r, paths: [/x]}]\n");
        same("services:\n-\n  name: a\n  host: h\n- name: b\n  host: h\n");
    }

    /// The examples and a generated config of many entities, with comments and block scalars
    /// between them.
    #[test]
    fn examples_and_generated_configs() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yml" || x == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap();
                let whole: Value = serde_yaml::from_str(&text).unwrap();
                if let Some(v) = parse(&text) {
                    assert_eq!(v, whole, "{p:?}");
                }
            }
        }
        let mut text = String::from("_format_version: \"3.0\"\nservices:\n");
        for i in 0..2000 {
            text.push_str(&format!(
                "- name: s{i}\n  url: http://h{i}:80\n  # note {i}\n  routes:\n  - paths: [/p{i}, \"~/r{i}/(?<id>\\\\d+)\"]\n    methods:\n    - GET\n  plugins:\n  - name: pre-function\n    config:\n      access:\n      - |\n        -- Lua {i}\n        local x = {i}\n\n        return x\n\n"
            ));
        }
        text.push_str("consumers:\n- username: u\n");
        same(&text);
    }

    #[test]
    fn other_layouts_are_left_to_the_whole_parse() {
        for text in [
            "services:\n- &a {name: a, host: h}\n- *a\n",
            "--- \nservices: []\n",
            "services: !!seq []\n",
            "  services: []\n",
            "{services: []}\n",
            "a: 1\na: 2\n",
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }
}
