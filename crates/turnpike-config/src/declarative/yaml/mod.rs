//! YAML text to a JSON value, one parser event at a time.
//!
//! `serde_yaml` first records every parser event of the whole document (about 27 bytes per
//! byte of YAML: a 50 MiB config held 1.3 GB of events) and only then builds the value. Here
//! each event from libyaml's parser (the same parser `serde_yaml` uses, so the same documents
//! are accepted: [`events`]) goes straight into the value being built; the only thing kept
//! beside the value is a copy of each anchored node, for its aliases.
//!
//! The value is the one `serde_yaml::from_str::<serde_json::Value>` gives, rule for rule (the
//! `declarative_yaml` fuzz target holds the two to the same result): YAML 1.2 core-schema
//! scalars (`null`/`~`/empty, `true`/`True`/`TRUE`, decimal/`0x`/`0o`/`0b` integers, floats with
//! `.inf`/`.nan`), keys taken as written, `!!bool`/`!!int`/`!!float`/`!!null` checked against
//! their tag, local tags (`!x`) refused, nesting deeper than 128 refused, one document only.
//! Two deliberate differences: alias expansion is limited by the events read so far rather than
//! by the whole document's, so a document that front-loads its aliases may be refused; and the
//! merge key `<<` is applied ([`merge_keys`]), as Kong's YAML reader (lyaml) applies it, where
//! `serde_yaml` reading into a JSON value keeps `<<` as a plain key.

mod events;

use events::{Event, Mark, Parser, Style};
use serde_json::{Map, Number, Value};
use std::collections::HashMap;

/// Collections nested deeper than this are refused (`serde_yaml`'s recursion limit).
const MAX_DEPTH: usize = 128;
/// Alias expansions allowed per parser event (`serde_yaml`'s repetition limit).
const ALIAS_EXPANSIONS_PER_EVENT: usize = 100;

const BOOL_TAG: &str = "tag:yaml.org,2002:bool";
const INT_TAG: &str = "tag:yaml.org,2002:int";
const FLOAT_TAG: &str = "tag:yaml.org,2002:float";
const NULL_TAG: &str = "tag:yaml.org,2002:null";

/// A node read: a collection's value, or a scalar's text with its value. A mapping key is its
/// scalar's text as written (tag and type ignored); a value is the resolved scalar, whose
/// error (a bad `!!int`, a local tag) counts only where it is used as a value.
enum Node<T> {
    Value(T),
    Scalar(String, Result<Value, String>),
}

impl<T: Tree> Node<T> {
    fn into_value(self) -> Result<T, String> {
        match self {
            Node::Value(v) => Ok(v),
            Node::Scalar(_, v) => v.map(T::scalar),
        }
    }
}

/// What the parser's events are built into: a JSON value ([`from_str`]), or JSON text
/// ([`to_json_text`]), which holds a big document in a tenth of the memory.
trait Tree: Sized {
    /// A sequence being read.
    type Seq: Default;
    fn scalar(v: Value) -> Self;
    fn push(seq: &mut Self::Seq, item: Self);
    fn seq(items: Self::Seq) -> Self;
    /// A mapping's entries in order; a repeated key keeps its first place and takes its last
    /// value.
    fn map(entries: Vec<(String, Self)>) -> Self;
    fn duplicate(&self) -> Self;
    /// Nesting depth of its collections.
    fn depth(&self) -> usize;
    fn is_seq(&self) -> bool;
    /// A mapping's entries (`None`: not a mapping), for a merge key (`<<`).
    fn into_entries(self) -> Option<Vec<(String, Self)>>;
    /// A sequence's items (`None`: not a sequence).
    fn into_items(self) -> Option<Vec<Self>>;
}

impl Tree for Value {
    type Seq = Vec<Value>;

    fn scalar(v: Value) -> Value {
        v
    }

    fn push(seq: &mut Vec<Value>, item: Value) {
        seq.push(item)
    }

    fn seq(mut items: Vec<Value>) -> Value {
        items.shrink_to_fit();
        Value::Array(items)
    }

    fn map(entries: Vec<(String, Value)>) -> Value {
        let mut map = Map::with_capacity(entries.len());
        for (k, v) in entries {
            map.insert(k, v);
        }
        Value::Object(map)
    }

    fn duplicate(&self) -> Value {
        self.clone()
    }

    fn depth(&self) -> usize {
        depth(self)
    }

    fn is_seq(&self) -> bool {
        self.is_array()
    }

    fn into_entries(self) -> Option<Vec<(String, Value)>> {
        match self {
            Value::Object(map) => Some(map.into_iter().collect()),
            _ => None,
        }
    }

    fn into_items(self) -> Option<Vec<Value>> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// A node as its JSON text, with its collections' depth and kind.
struct Json {
    text: String,
    depth: usize,
    seq: bool,
}

/// A sequence's text so far (each item written as it is read, not kept), and its items'
/// deepest nesting.
#[derive(Default)]
struct JsonSeq {
    text: String,
    depth: usize,
}

impl Tree for Json {
    type Seq = JsonSeq;

    fn scalar(v: Value) -> Json {
        Json {
            text: v.to_string(),
            depth: 0,
            seq: false,
        }
    }

    fn push(seq: &mut JsonSeq, item: Json) {
        seq.text.push(if seq.text.is_empty() { '[' } else { ',' });
        seq.text.push_str(&item.text);
        seq.depth = seq.depth.max(item.depth);
    }

    fn seq(mut items: JsonSeq) -> Json {
        if items.text.is_empty() {
            items.text.push('[');
        }
        items.text.push(']');
        items.text.shrink_to_fit();
        Json {
            text: items.text,
            depth: items.depth + 1,
            seq: true,
        }
    }

    fn map(mut entries: Vec<(String, Json)>) -> Json {
        // Where each key is first seen, and which entry gives its value (the last).
        let mut place: HashMap<&str, usize> = HashMap::with_capacity(entries.len());
        let mut last = vec![usize::MAX; entries.len()];
        let mut order = Vec::with_capacity(entries.len());
        for (i, (k, _)) in entries.iter().enumerate() {
            match place.get(k.as_str()) {
                Some(&first) => last[first] = i,
                None => {
                    place.insert(k, i);
                    last[i] = i;
                    order.push(i);
                }
            }
        }
        drop(place);
        let keys: Vec<String> = order
            .iter()
            .map(|&first| Value::from(entries[first].0.as_str()).to_string())
            .collect();
        // Sized exactly, and each value freed once copied: the root of a 50 MiB config holds
        // one 50 MB list, and the map grown by doubling while holding it peaked at 107 MB.
        let size = 2 + order
            .iter()
            .zip(&keys)
            .map(|(&first, k)| k.len() + 2 + entries[last[first]].1.text.len())
            .sum::<usize>();
        let mut text = String::with_capacity(size);
        let mut depth = 0;
        text.push('{');
        for (n, (&first, key)) in order.iter().zip(&keys).enumerate() {
            if n > 0 {
                text.push(',');
            }
            let value = std::mem::take(&mut entries[last[first]].1.text);
            text.push_str(key);
            text.push(':');
            text.push_str(&value);
            depth = depth.max(entries[last[first]].1.depth);
        }
        text.push('}');
        Json {
            text,
            depth: depth + 1,
            seq: false,
        }
    }

    fn duplicate(&self) -> Json {
        Json {
            text: self.text.clone(),
            depth: self.depth,
            seq: self.seq,
        }
    }

    fn depth(&self) -> usize {
        self.depth
    }

    fn is_seq(&self) -> bool {
        self.seq
    }

    // A merge is rare and small (a shared block of settings): its text is read back.
    fn into_entries(self) -> Option<Vec<(String, Json)>> {
        if !self.text.starts_with('{') {
            return None;
        }
        let map: Map<String, Value> = serde_json::from_str(&self.text).ok()?;
        Some(map.into_iter().map(|(k, v)| (k, Json::of(v))).collect())
    }

    fn into_items(self) -> Option<Vec<Json>> {
        if !self.seq {
            return None;
        }
        let items: Vec<Value> = serde_json::from_str(&self.text).ok()?;
        Some(items.into_iter().map(Json::of).collect())
    }
}

impl Json {
    fn of(v: Value) -> Json {
        Json {
            depth: depth(&v),
            seq: v.is_array(),
            text: v.to_string(),
        }
    }
}

struct Open<T: Tree> {
    kind: OpenKind<T>,
    anchor: Option<Vec<u8>>,
    /// Alias expansions inside this node (an alias to it costs them again).
    expansions: usize,
}

/// A collection being read. Entries are gathered in a vector and the collection is made at its
/// end with the exact capacity: a config is mostly small maps and lists, and growing them by
/// doubling left a third of the parsed document's memory unused.
enum OpenKind<T: Tree> {
    Seq(T::Seq),
    /// The entries, and the key read whose value is awaited.
    Map(Vec<(String, T)>, Option<String>),
}

/// An anchored node, with what expanding it costs.
struct Anchored<T> {
    /// The node; `None` while it is still open (an alias to it is recursion).
    node: Option<Node<T>>,
    /// Nesting depth of its collections (an alias's expansion counts toward the limit).
    depth: usize,
    expansions: usize,
}

impl<T: Tree> Node<T> {
    fn duplicate(&self) -> Node<T> {
        match self {
            Node::Value(v) => Node::Value(v.duplicate()),
            Node::Scalar(t, v) => Node::Scalar(t.clone(), v.clone()),
        }
    }
}

fn at(mark: Mark) -> String {
    format!("at {mark}")
}

fn utf8(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|_| "invalid type: byte array, expected a string".into())
}

/// Parses one YAML document into a JSON value.
pub fn from_str(text: &str) -> Result<Value, String> {
    Ok(build::<Value>(text)?.unwrap_or(Value::Null))
}

/// Parses one YAML document into the JSON text of the value [`from_str`] gives, never holding
/// it as values: the collections read are kept as their text (100k routes: a 4 MB text, where
/// the value took some 60 MB). The text streams into a config
/// (`load_json_streaming`).
pub fn to_json_text(text: &str) -> Result<String, String> {
    Ok(build::<Json>(text)?.map_or_else(|| "null".into(), |j| j.text))
}

/// The document's root, `None` for an empty stream (null, as `serde_yaml` reads it).
fn build<T: Tree>(text: &str) -> Result<Option<T>, String> {
    let mut parser = Parser::new(text.as_bytes());

    let mut stack: Vec<Open<T>> = Vec::new();
    let mut anchors: HashMap<Vec<u8>, Anchored<T>> = HashMap::new();
    let mut root: Option<T> = None;
    let mut documents = 0usize;
    let mut events = 0usize;
    let mut expansions = 0usize;

    loop {
        let (event, mark) = parser.next()?;
        events += 1;
        let is_map = matches!(event, Event::MappingStart { .. });
        let (node, anchor, inner_expansions) = match event {
            Event::StreamStart | Event::DocumentEnd => continue,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(
                        "deserializing from YAML containing more than one document is not supported"
                            .into(),
                    );
                }
                continue;
            }
            Event::StreamEnd => break,
            Event::Alias(anchor) => {
                let Some(found) = anchors.get(&anchor) else {
                    return Err(format!("unknown anchor {}", at(mark)));
                };
                let Some(node) = &found.node else {
                    return Err(format!("recursion limit exceeded {}", at(mark)));
                };
                expansions += 1 + found.expansions;
                if expansions > events * ALIAS_EXPANSIONS_PER_EVENT {
                    return Err("repetition limit exceeded".into());
                }
                if stack.len() + found.depth > MAX_DEPTH {
                    return Err(format!("recursion limit exceeded {}", at(mark)));
                }
                (node.duplicate(), None, 1 + found.expansions)
            }
            Event::Scalar {
                anchor,
                tag,
                value,
                style,
            } => {
                let value = utf8(value).map_err(|e| format!("{e} {}", at(mark)))?;
                let resolved =
                    scalar(&value, tag.as_deref(), style).map_err(|e| format!("{e} {}", at(mark)));
                (Node::Scalar(value, resolved), anchor, 0)
            }
            Event::SequenceStart { anchor, tag } | Event::MappingStart { anchor, tag } => {
                if local_tag(tag.as_deref()) {
                    return Err(format!(
                        "invalid type: enum, expected any valid JSON value {}",
                        at(mark)
                    ));
                }
                if stack.len() >= MAX_DEPTH {
                    return Err(format!("recursion limit exceeded {}", at(mark)));
                }
                if let Some(name) = &anchor {
                    anchors.insert(
                        name.clone(),
                        Anchored {
                            node: None,
                            depth: 0,
                            expansions: 0,
                        },
                    );
                }
                stack.push(Open {
                    kind: if is_map {
                        OpenKind::Map(Vec::new(), None)
                    } else {
                        OpenKind::Seq(T::Seq::default())
                    },
                    anchor,
                    expansions: 0,
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let open = stack.pop().expect("libyaml balances collections");
                let value = match open.kind {
                    OpenKind::Seq(items) => T::seq(items),
                    OpenKind::Map(entries, _) => {
                        T::map(merge_keys(entries).map_err(|e| format!("{e} {}", at(mark)))?)
                    }
                };
                (Node::Value(value), open.anchor, open.expansions)
            }
        };

        if let Some(name) = anchor {
            let depth = match &node {
                Node::Value(v) => v.depth(),
                Node::Scalar(..) => 0,
            };
            anchors.insert(
                name,
                Anchored {
                    node: Some(node.duplicate()),
                    depth,
                    expansions: inner_expansions,
                },
            );
        }

        let Some(parent) = stack.last_mut() else {
            root = Some(node.into_value()?);
            continue;
        };
        parent.expansions += inner_expansions;
        match &mut parent.kind {
            OpenKind::Seq(items) => T::push(items, node.into_value()?),
            OpenKind::Map(map, key) => match key.take() {
                Some(k) => map.push((k, node.into_value()?)),
                None => match node {
                    Node::Scalar(text, _) => *key = Some(text),
                    Node::Value(v) => {
                        let found = if v.is_seq() { "sequence" } else { "map" };
                        return Err(format!(
                            "invalid type: {found}, expected a string key {}",
                            at(mark)
                        ));
                    }
                },
            },
        }
    }
    Ok(root)
}

/// A merge key's value that is not a mapping or a sequence of them.
const NOT_A_MAPPING: &str =
    "invalid '<<' merge event: a scalar, expected a mapping or a sequence of mappings";

/// The merge key (`<<`, YAML 1.1's merge type, which Kong's parser lyaml reads): its value,
/// a mapping or a sequence of mappings, gives the mapping the keys it does not set itself; of
/// several mappings in a sequence, the first that has a key gives it. The merged keys take the
/// `<<`'s place. Anything else as its value is refused, as lyaml refuses it.
fn merge_keys<T: Tree>(entries: Vec<(String, T)>) -> Result<Vec<(String, T)>, String> {
    if !entries.iter().any(|(k, _)| k == "<<") {
        return Ok(entries);
    }
    // The keys set so far: the mapping's own, then each merged one (the first source wins).
    let mut taken: std::collections::HashSet<String> = entries
        .iter()
        .filter(|(k, _)| k != "<<")
        .map(|(k, _)| k.clone())
        .collect();
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        if k != "<<" {
            out.push((k, v));
            continue;
        }
        let sources = if v.is_seq() {
            let items = v.into_items().unwrap_or_default();
            let mut maps = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let kind = if item.is_seq() { "sequence" } else { "scalar" };
                let element = || format!("invalid '<<' sequence element {}: a {kind}", i + 1);
                maps.push(item.into_entries().ok_or_else(element)?);
            }
            maps
        } else {
            vec![v.into_entries().ok_or(NOT_A_MAPPING)?]
        };
        for (mk, mv) in sources.into_iter().flatten() {
            if taken.insert(mk.clone()) {
                out.push((mk, mv));
            }
        }
    }
    Ok(out)
}

/// The nesting depth of collections in `value` (an alias's expansion counts toward the limit).
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A tag written as `!name` (or a bare `!`): `serde_yaml` reads it as an enum, which a JSON
/// value cannot hold.
fn local_tag(tag: Option<&[u8]>) -> bool {
    tag.is_some_and(|t| t.starts_with(b"!") && std::str::from_utf8(t).is_ok())
}

fn scalar(text: &str, tag: Option<&[u8]>, style: Style) -> Result<Value, String> {
    if local_tag(tag) {
        return Err("invalid type: enum, expected any valid JSON value".into());
    }
    match tag.map(|t| std::str::from_utf8(t).unwrap_or("")) {
        Some(BOOL_TAG) => parse_bool(text)
            .map(Value::Bool)
            .ok_or_else(|| format!("invalid value: string {text:?}, expected a boolean")),
        Some(INT_TAG) => match int(text) {
            Some(result) => result,
            None => Err(format!(
                "invalid value: string {text:?}, expected an integer"
            )),
        },
        Some(FLOAT_TAG) => parse_f64(text)
            .map(float)
            .ok_or_else(|| format!("invalid value: string {text:?}, expected a float")),
        Some(NULL_TAG) => parse_null(text)
            .then_some(Value::Null)
            .ok_or_else(|| format!("invalid value: string {text:?}, expected null")),
        Some(_) => Ok(Value::String(text.to_owned())),
        None if style == Style::Plain => untagged(text),
        None => Ok(Value::String(text.to_owned())),
    }
}

fn untagged(text: &str) -> Result<Value, String> {
    if text.is_empty() || parse_null(text) {
        return Ok(Value::Null);
    }
    if let Some(b) = parse_bool(text) {
        return Ok(Value::Bool(b));
    }
    if let Some(result) = int(text) {
        return result;
    }
    if !digits_but_not_number(text) {
        if let Some(f) = parse_f64(text) {
            return Ok(float(f));
        }
    }
    Ok(Value::String(text.to_owned()))
}

/// A non-finite float has no JSON form: null, as `serde_json` makes it.
fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// An integer, in `serde_yaml`'s order: u64, negative i64, then u128/i128 (out of a JSON
/// number's range: an error). `None`: not an integer.
fn int(text: &str) -> Option<Result<Value, String>> {
    if let Some(n) = parse_unsigned(text, u64::from_str_radix) {
        return Some(Ok(Value::Number(n.into())));
    }
    if let Some(n) = parse_negative(text, i64::from_str_radix) {
        return Some(Ok(Value::Number(n.into())));
    }
    if parse_unsigned(text, u128::from_str_radix).is_some()
        || parse_negative(text, i128::from_str_radix).is_some()
    {
        return Some(Err("number out of range".into()));
    }
    None
}

fn parse_null(text: &str) -> bool {
    matches!(text, "null" | "Null" | "NULL" | "~")
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

type Radix<T> = fn(&str, u32) -> Result<T, std::num::ParseIntError>;

fn unsigned_prefixed<T>(rest: &str, radix: u32, from: Radix<T>) -> Option<T> {
    if rest.starts_with(['+', '-']) {
        return None;
    }
    from(rest, radix).ok()
}

fn parse_unsigned<T>(text: &str, from: Radix<T>) -> Option<T> {
    let unpositive = text.strip_prefix('+').unwrap_or(text);
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(rest) = unpositive.strip_prefix(prefix) {
            if rest.starts_with(['+', '-']) {
                return None;
            }
            if let Some(n) = unsigned_prefixed(rest, radix, from) {
                return Some(n);
            }
        }
    }
    if unpositive.starts_with(['+', '-']) || digits_but_not_number(text) {
        return None;
    }
    from(unpositive, 10).ok()
}

fn parse_negative<T>(text: &str, from: Radix<T>) -> Option<T> {
    for (prefix, radix) in [("-0x", 16), ("-0o", 8), ("-0b", 2)] {
        if let Some(rest) = text.strip_prefix(prefix) {
            if let Ok(n) = from(&format!("-{rest}"), radix) {
                return Some(n);
            }
        }
    }
    if digits_but_not_number(text) {
        return None;
    }
    from(text, 10).ok()
}

fn parse_f64(text: &str) -> Option<f64> {
    let unpositive = match text.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => text,
    };
    if matches!(unpositive, ".inf" | ".Inf" | ".INF") {
        return Some(f64::INFINITY);
    }
    if matches!(text, "-.inf" | "-.Inf" | "-.INF") {
        return Some(f64::NEG_INFINITY);
    }
    if matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Some(f64::NAN);
    }
    unpositive.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Leading zeros followed by digits: a string in YAML 1.2.
fn digits_but_not_number(text: &str) -> bool {
    let t = text.strip_prefix(['-', '+']).unwrap_or(text);
    t.len() > 1 && t.starts_with('0') && t[1..].bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::{from_str, to_json_text};
    use serde_json::{json, Value};

    fn same(text: &str) {
        let ours = from_str(text);
        // The JSON text reads back as the value, and fails where it fails.
        match (&ours, to_json_text(text)) {
            (Ok(v), Ok(t)) => {
                assert_eq!(&serde_json::from_str::<Value>(&t).unwrap(), v, "{text:?}")
            }
            (Err(a), Err(b)) => assert_eq!(a, &b, "{text:?}"),
            (a, b) => panic!("{text:?}: value {a:?}, text {b:?}"),
        }
        let theirs: Result<Value, String> = serde_yaml::from_str(text)
            .map_err(|e| e.to_string())
            .and_then(|mut v| merged(&mut v).map(|()| v));
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{text:?}"),
            (Err(_), Err(_)) => {}
            _ => panic!("{text:?}: ours {ours:?}, serde_yaml {theirs:?}"),
        }
    }

    /// YAML's merge key applied to `serde_yaml`'s reading, innermost mappings first (as a
    /// mapping's merge is applied when it is read): the reference for [`merge_keys`].
    fn merged(v: &mut Value) -> Result<(), String> {
        match v {
            Value::Array(items) => items.iter_mut().try_for_each(merged),
            Value::Object(map) => {
                map.values_mut().try_for_each(merged)?;
                let Some(m) = map.shift_remove("<<") else {
                    return Ok(());
                };
                let sources = match m {
                    Value::Object(o) => vec![o],
                    Value::Array(items) => items
                        .into_iter()
                        .map(|i| match i {
                            Value::Object(o) => Ok(o),
                            _ => Err("element".to_string()),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err("scalar".into()),
                };
                for (k, v) in sources.into_iter().flatten() {
                    map.entry(k).or_insert(v);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    #[test]
    fn merge_keys_are_applied_as_kong_applies_them() {
        let v = from_str(
            "base: &b {connect_timeout: 1000, retries: 2, tags: [x]}\n\
             other: &o {retries: 9, read_timeout: 5}\n\
             s1:\n  <<: *b\n  name: one\n  retries: 5\n\
             s2:\n  <<: [*b, *o]\n  name: two\n\
             s3:\n  name: three\n  <<: {name: ignored, port: 80}\n",
        )
        .unwrap();
        assert_eq!(
            v["s1"],
            serde_json::json!({"connect_timeout": 1000, "retries": 5, "tags": ["x"], "name": "one"})
        );
        // Of several mappings the first that has a key gives it.
        assert_eq!(
            v["s2"],
            serde_json::json!({"connect_timeout": 1000, "retries": 2, "tags": ["x"], "read_timeout": 5, "name": "two"})
        );
        // The mapping's own keys win wherever the merge is written.
        assert_eq!(v["s3"], serde_json::json!({"name": "three", "port": 80}));
        // The same through the JSON text.
        let t: Value =
            serde_json::from_str(&to_json_text("a: &a {k: 1}\nb: {<<: *a, j: 2}\n").unwrap())
                .unwrap();
        assert_eq!(t["b"], serde_json::json!({"k": 1, "j": 2}));
        for bad in [
            "a: {<<: 1}\n",
            "a: {<<: [{k: 1}, 2]}\n",
            "a: {<<: [[{k: 1}]]}\n",
            "a: {<<: ~}\n",
        ] {
            let e = from_str(bad).unwrap_err();
            assert!(e.starts_with("invalid '<<'"), "{bad:?}: {e}");
            assert_eq!(to_json_text(bad).unwrap_err(), e);
        }
    }

    #[test]
    fn reads_what_serde_yaml_reads() {
        for text in [
            "",
            "# only a comment\n",
            "a: 1\nb: [x, 'y', \"z\"]\nc: {d: ~, e: null, f: }\n",
            "_format_version: \"3.0\"\nservices:\n- name: s\n  url: http://u\n  routes:\n  - paths: [/a]\n",
            "n: [0, -1, +2, 0x1F, 0o17, 0b101, -0x10, 007, -007, 1.5, .inf, -.inf, .nan, 1e3, 99999999999999999999, 999999999999999999999999999999999999999999]\n",
            "b: [true, True, TRUE, yes, no, on, off, false]\n",
            "t: [!!str 123, !!int '12', !!float 1, !!bool true, !!null null, !!binary abc]\n",
            "bad: !!int x\n",
            "bad: !!null ''\n",
            "local: !foo bar\n",
            "local: !foo {a: 1}\n",
            "keys: {1: a, true: b, ~: c, 'x y': d}\n",
            "dup: 1\ndup: 2\nother: 3\n",
            "a: &x {k: v}\nb: *x\nc: [*x, *x]\n",
            "a: &k name\n*k : value\n",
            "a: *missing\n",
            "a: &r [*r]\n",
            "? [a, b]\n: c\n",
            "--- a\n--- b\n",
            "---\nx: 1\n...\n",
            "s: |\n  multi\n  line\nf: >\n  folded\n  text\n",
            "x: [unterminated\n",
            "  - a\n - b\n",
            "<<: {a: 1}\nb: 2\n",
            "<<: [{a: 1}, {a: 2, c: 3}]\na: 0\n",
            "x: &x {p: 1, <<: {q: 2}}\ny: {<<: *x, p: 3}\n",
            "<<: 5\n",
            "\"quoted key\": 1\n",
            "e: ''\n",
            "tab:\t1\n",
            "!foo key: v\n!!int k2: w\n",
            "[!!str, a]\n",
            "{!!str : a, !x , b}\n",
            "a: &b !!int x\nc: [*b]\n",
            "a: &b !!int x\n*b : c\n",
            "s:\n- {k: 1, j: [a, {x: 1, x: 2}], k: 3}\n- &n {a: [\"q\\\"uote\", \"\\u00e9\"]}\n- *n\n",
        ] {
            same(text);
        }
    }

    #[test]
    fn nesting_and_aliases_are_bounded() {
        same(&("a: ".to_string() + &"[".repeat(128) + &"]".repeat(128)));
        same(&("a: ".to_string() + &"[".repeat(129) + &"]".repeat(129)));
        // Billion laughs: refused, as serde_yaml refuses it, before it is built.
        let mut doc = "a: &a [x, x, x, x, x, x, x, x, x, x]\n".to_string();
        for (i, name) in "bcdefghij".chars().enumerate() {
            let prev = (b'a' + i as u8) as char;
            doc += &format!("{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n");
        }
        assert!(from_str(&doc).is_err());
        assert!(to_json_text(&doc).is_err());
        assert!(serde_yaml::from_str::<Value>(&doc).is_err());
        assert_eq!(
            from_str("a: &x 1\nb: *x\n").unwrap(),
            json!({"a": 1, "b": 1})
        );
    }
}
