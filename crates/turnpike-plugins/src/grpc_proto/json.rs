//! Messages to and from JSON as Kong's gRPC plugins write and read them: lua-protobuf's
//! `pb.decode`/`pb.encode` (Kong's defaults) with lua-cjson, which is not proto3's canonical
//! JSON mapping:
//! - fields by their `.proto` names (`boolean_test`, not `booleanTest`);
//! - a proto3 field without presence is written with its default (`false`, `0`, `""`), a
//!   repeated field as `[]` and a map as `{}` when empty; a field with presence (a message,
//!   proto2, `optional`, a oneof's) only when set;
//! - enums by name (an unknown number as the number), 64-bit integers as numbers, bytes as
//!   the string they are;
//! - `google.protobuf.Timestamp` as `YYYY-MM-DDTHH:MM:SS` (UTC, seconds; Kong's `date` hook),
//!   read from that form with or without a fraction and a zone;
//! - reading, an unknown key is ignored; `null`, a number for a string field or a string for
//!   a message is an error; a number may come as a numeric string (query arguments do).

use prost_reflect::{DynamicMessage, Kind, MapKey, MessageDescriptor, ReflectMessage, Value};
use serde_json::{Map, Number, Value as Json};

const TIMESTAMP: &str = "google.protobuf.Timestamp";

/// The JSON Kong writes for a message.
pub fn to_json(msg: &DynamicMessage) -> Json {
    let mut out = Map::new();
    for fd in msg.descriptor().fields() {
        let listed = fd.is_list() || fd.is_map();
        if !listed && fd.supports_presence() && !msg.has_field(&fd) {
            continue;
        }
        out.insert(
            fd.name().to_string(),
            value_json(&fd.kind(), &msg.get_field(&fd)),
        );
    }
    Json::Object(out)
}

fn value_json(kind: &Kind, v: &Value) -> Json {
    match v {
        Value::Bool(b) => Json::Bool(*b),
        Value::I32(n) => Json::from(*n),
        Value::I64(n) => Json::from(*n),
        Value::U32(n) => Json::from(*n),
        Value::U64(n) => Json::from(*n),
        Value::F32(f) => Number::from_f64(*f as f64).map_or(Json::Null, Json::Number),
        Value::F64(f) => Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(s.clone()),
        Value::Bytes(b) => Json::String(String::from_utf8_lossy(b).into_owned()),
        Value::EnumNumber(n) => match kind {
            Kind::Enum(e) => e
                .get_value(*n)
                .map_or(Json::from(*n), |v| Json::String(v.name().to_string())),
            _ => Json::from(*n),
        },
        Value::Message(m) if m.descriptor().full_name() == TIMESTAMP => {
            let secs = match m.get_field_by_name("seconds").as_deref() {
                Some(Value::I64(s)) => *s,
                _ => 0,
            };
            Json::String(iso8601(secs))
        }
        Value::Message(m) => to_json(m),
        Value::List(items) => Json::Array(items.iter().map(|i| value_json(kind, i)).collect()),
        Value::Map(entries) => {
            let value_kind = match kind {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                _ => kind.clone(),
            };
            let mut out = Map::new();
            for (k, v) in entries {
                let key = match k {
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(n) => n.to_string(),
                    MapKey::I64(n) => n.to_string(),
                    MapKey::U32(n) => n.to_string(),
                    MapKey::U64(n) => n.to_string(),
                    MapKey::String(s) => s.clone(),
                };
                out.insert(key, value_json(&value_kind, v));
            }
            Json::Object(out)
        }
    }
}

/// The message of type `desc` a JSON object describes (lua-protobuf's `pb.encode`); the error
/// says which field did not fit.
pub fn from_json(desc: &MessageDescriptor, v: &Json) -> Result<DynamicMessage, String> {
    match v {
        Json::Object(o) => message(desc, o),
        _ => Err(format!("{}: a table expected", desc.full_name())),
    }
}

fn message(desc: &MessageDescriptor, o: &Map<String, Json>) -> Result<DynamicMessage, String> {
    let mut m = DynamicMessage::new(desc.clone());
    for (k, v) in o {
        let Some(fd) = desc.get_field_by_name(k) else {
            continue;
        };
        let at = |e: String| format!("{}.{k}: {e}", desc.name());
        let value = if fd.is_map() {
            let Kind::Message(entry) = fd.kind() else {
                unreachable!("a map field's kind is its entry message")
            };
            let (kf, vf) = (entry.map_entry_key_field(), entry.map_entry_value_field());
            let entries = match v {
                Json::Object(o) => o,
                Json::Array(a) if a.is_empty() => &Map::new(),
                _ => return Err(at("a table expected".into())),
            };
            let mut map = std::collections::HashMap::new();
            for (key, val) in entries {
                let key = match scalar(&kf.kind(), &Json::String(key.clone())).map_err(at)? {
                    Value::Bool(b) => MapKey::Bool(b),
                    Value::I32(n) => MapKey::I32(n),
                    Value::I64(n) => MapKey::I64(n),
                    Value::U32(n) => MapKey::U32(n),
                    Value::U64(n) => MapKey::U64(n),
                    Value::String(s) => MapKey::String(s),
                    _ => return Err(at("not a map key".into())),
                };
                map.insert(key, scalar(&vf.kind(), val).map_err(at)?);
            }
            Value::Map(map)
        } else if fd.is_list() {
            // cjson reads `[]` and `{}` alike, as an empty table.
            let items: &[Json] = match v {
                Json::Array(a) => a,
                Json::Object(o) if o.is_empty() => &[],
                _ => return Err(at("a table expected".into())),
            };
            Value::List(
                items
                    .iter()
                    .map(|i| scalar(&fd.kind(), i))
                    .collect::<Result<_, _>>()
                    .map_err(at)?,
            )
        } else {
            scalar(&fd.kind(), v).map_err(at)?
        };
        m.set_field(&fd, value);
    }
    Ok(m)
}

fn scalar(kind: &Kind, v: &Json) -> Result<Value, String> {
    if v.is_null() {
        return Err("null".into());
    }
    let number = || -> Result<f64, String> {
        match v {
            Json::Number(n) => n.as_f64().ok_or_else(|| "a number expected".to_string()),
            Json::String(s) => s
                .trim()
                .parse::<f64>()
                .map_err(|_| format!("number expected, got string '{s}'")),
            _ => Err(format!("number expected, got {}", type_name(v))),
        }
    };
    let integer = |lo: f64, hi: f64| -> Result<i128, String> {
        let exact = match v {
            Json::Number(n) => n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)),
            Json::String(s) => s.trim().parse::<i128>().ok(),
            _ => None,
        };
        if let Some(i) = exact {
            return (i as f64 >= lo && i as f64 <= hi)
                .then_some(i)
                .ok_or_else(|| format!("integer out of range: {i}"));
        }
        let f = number()?;
        if f.fract() != 0.0 || f < lo || f > hi {
            return Err(format!("number has no integer representation: {f}"));
        }
        Ok(f as i128)
    };
    Ok(match kind {
        Kind::Bool => match v {
            Json::Bool(b) => Value::Bool(*b),
            // Lua's truth: any value but false (and nil) is true.
            _ => Value::Bool(true),
        },
        Kind::String => match v {
            Json::String(s) => Value::String(s.clone()),
            _ => return Err(format!("string expected, got {}", type_name(v))),
        },
        Kind::Bytes => match v {
            Json::String(s) => Value::Bytes(bytes::Bytes::from(s.clone().into_bytes())),
            _ => return Err(format!("string expected, got {}", type_name(v))),
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            Value::I32(integer(i32::MIN as f64, i32::MAX as f64)? as i32)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            Value::I64(integer(i64::MIN as f64, i64::MAX as f64)? as i64)
        }
        Kind::Uint32 | Kind::Fixed32 => Value::U32(integer(0.0, u32::MAX as f64)? as u32),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(integer(0.0, u64::MAX as f64)? as u64),
        Kind::Float => Value::F32(number()? as f32),
        Kind::Double => Value::F64(number()?),
        Kind::Enum(e) => match v {
            Json::String(s) => match e.get_value_by_name(s) {
                Some(ev) => Value::EnumNumber(ev.number()),
                None => Value::EnumNumber(
                    s.trim()
                        .parse()
                        .map_err(|_| format!("unknown enum value '{s}' of {}", e.full_name()))?,
                ),
            },
            _ => Value::EnumNumber(integer(i32::MIN as f64, i32::MAX as f64)? as i32),
        },
        Kind::Message(d) if d.full_name() == TIMESTAMP => match v {
            Json::String(s) => {
                let (seconds, nanos) =
                    parse_timestamp(s).ok_or_else(|| format!("expected time string, got '{s}'"))?;
                let mut m = DynamicMessage::new(d.clone());
                m.set_field_by_name("seconds", Value::I64(seconds));
                m.set_field_by_name("nanos", Value::I32(nanos));
                Value::Message(m)
            }
            _ => return Err(format!("expected time string, got {}", type_name(v))),
        },
        Kind::Message(d) => match v {
            Json::Object(o) => Value::Message(message(d, o)?),
            Json::Array(a) if a.is_empty() => Value::Message(DynamicMessage::new(d.clone())),
            _ => return Err(format!("table expected, got {}", type_name(v))),
        },
    })
}

fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "userdata",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) | Json::Object(_) => "table",
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC (LuaDate's `${iso}`).
pub fn iso8601(secs: i64) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // civil_from_days
    let z = days + 719468;
    let era = if z >= 0 { z } else { z - 146096 } / 146097;
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// An ISO 8601 date and time (`T` or a space between them; seconds, a fraction and a zone
/// optional; no zone is UTC) as seconds and nanoseconds since the epoch.
pub fn parse_timestamp(s: &str) -> Option<(i64, i32)> {
    let s = s.trim();
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') || !(1..=12).contains(&mo) {
        return None;
    }
    if !(1..=31).contains(&d) {
        return None;
    }
    let mut secs = days_from_civil(y, mo, d) * 86400;
    let mut i = 10;
    let mut nanos = 0i32;
    if matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        let (h, mi) = (num(11..13)?, num(14..16)?);
        if b.get(13) != Some(&b':') || h > 23 || mi > 59 {
            return None;
        }
        secs += h * 3600 + mi * 60;
        i = 16;
        if b.get(16) == Some(&b':') {
            let sec = num(17..19)?;
            if sec > 60 {
                return None;
            }
            secs += sec;
            i = 19;
            if matches!(b.get(19), Some(b'.' | b',')) {
                let start = 20;
                let mut end = start;
                while b.get(end).is_some_and(|c| c.is_ascii_digit()) {
                    end += 1;
                }
                let frac = s.get(start..end)?;
                if frac.is_empty() {
                    return None;
                }
                let digits: String = frac.chars().chain("000000000".chars()).take(9).collect();
                nanos = digits.parse().ok()?;
                i = end;
            }
        }
    }
    match s.get(i..)? {
        "" | "Z" | "z" => {}
        zone => {
            let sign = match zone.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let z = zone[1..].replace(':', "");
            if z.len() != 4 || !z.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let off = z[..2].parse::<i64>().ok()? * 3600 + z[2..].parse::<i64>().ok()? * 60;
            secs -= sign * off;
        }
    }
    Some((secs, nanos))
}

/// The error lua-cjson reports for text that is not JSON (`Expected value but found invalid
/// token at character 1`), as Kong's grpc-gateway passes it on; `None` when cjson would
/// read it.
pub fn cjson_error(text: &[u8]) -> Option<String> {
    let mut p = Parser { b: text, i: 0 };
    let result = (|| {
        let t = p.token();
        p.value(t, 0)?;
        let end = p.token();
        if end.kind != Tok::End {
            return Err(end.expected("the end"));
        }
        Ok(())
    })();
    result.err()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Tok {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    String,
    Number,
    Boolean,
    Null,
    Colon,
    Comma,
    End,
    Error(&'static str),
}

struct Token {
    kind: Tok,
    index: usize,
}

impl Token {
    fn expected(&self, what: &str) -> String {
        let found = match self.kind {
            Tok::ObjBegin => "T_OBJ_BEGIN",
            Tok::ObjEnd => "T_OBJ_END",
            Tok::ArrBegin => "T_ARR_BEGIN",
            Tok::ArrEnd => "T_ARR_END",
            Tok::String => "T_STRING",
            Tok::Number => "T_NUMBER",
            Tok::Boolean => "T_BOOLEAN",
            Tok::Null => "T_NULL",
            Tok::Colon => "T_COLON",
            Tok::Comma => "T_COMMA",
            Tok::End => "T_END",
            Tok::Error(e) => e,
        };
        format!(
            "Expected {what} but found {found} at character {}",
            self.index + 1
        )
    }
}

/// lua-cjson's tokenizer and parser, for their error messages only.
struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn token(&mut self) -> Token {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
        let index = self.i;
        let tok = |kind, len: usize, p: &mut Self| {
            p.i += len;
            Token { kind, index }
        };
        let rest = &self.b[self.i..];
        match rest.first() {
            None => Token {
                kind: Tok::End,
                index,
            },
            Some(b'{') => tok(Tok::ObjBegin, 1, self),
            Some(b'}') => tok(Tok::ObjEnd, 1, self),
            Some(b'[') => tok(Tok::ArrBegin, 1, self),
            Some(b']') => tok(Tok::ArrEnd, 1, self),
            Some(b':') => tok(Tok::Colon, 1, self),
            Some(b',') => tok(Tok::Comma, 1, self),
            Some(b'"') => {
                self.i += 1;
                loop {
                    match self.b.get(self.i) {
                        None => {
                            return Token {
                                kind: Tok::Error("unexpected end of string"),
                                index: self.i,
                            }
                        }
                        Some(b'"') => {
                            self.i += 1;
                            return Token {
                                kind: Tok::String,
                                index,
                            };
                        }
                        Some(b'\\') => {
                            let ok = match self.b.get(self.i + 1) {
                                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => 2,
                                Some(b'u') => {
                                    let hex = self.b.get(self.i + 2..self.i + 6);
                                    if hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                        6
                                    } else {
                                        return Token {
                                            kind: Tok::Error("invalid unicode escape code"),
                                            index: self.i,
                                        };
                                    }
                                }
                                _ => {
                                    return Token {
                                        kind: Tok::Error("invalid escape code"),
                                        index: self.i,
                                    }
                                }
                            };
                            self.i += ok;
                        }
                        Some(_) => self.i += 1,
                    }
                }
            }
            Some(c) if *c == b'-' || c.is_ascii_digit() => match number_len(rest) {
                Some(n) => tok(Tok::Number, n, self),
                None => Token {
                    kind: Tok::Error("invalid number"),
                    index,
                },
            },
            _ if rest.starts_with(b"true") => tok(Tok::Boolean, 4, self),
            _ if rest.starts_with(b"false") => tok(Tok::Boolean, 5, self),
            _ if rest.starts_with(b"null") => tok(Tok::Null, 4, self),
            _ => Token {
                kind: Tok::Error("invalid token"),
                index,
            },
        }
    }

    fn value(&mut self, t: Token, depth: usize) -> Result<(), String> {
        if depth > 1000 {
            return Err(format!(
                "Found too many nested data structures ({}) at character {}",
                depth,
                t.index + 1
            ));
        }
        match t.kind {
            Tok::String | Tok::Number | Tok::Boolean | Tok::Null => Ok(()),
            Tok::ObjBegin => {
                let mut t = self.token();
                if t.kind == Tok::ObjEnd {
                    return Ok(());
                }
                loop {
                    if t.kind != Tok::String {
                        return Err(t.expected("object key string"));
                    }
                    let colon = self.token();
                    if colon.kind != Tok::Colon {
                        return Err(colon.expected("colon"));
                    }
                    let v = self.token();
                    self.value(v, depth + 1)?;
                    let next = self.token();
                    match next.kind {
                        Tok::ObjEnd => return Ok(()),
                        Tok::Comma => t = self.token(),
                        _ => return Err(next.expected("comma or object end")),
                    }
                }
            }
            Tok::ArrBegin => {
                let mut t = self.token();
                if t.kind == Tok::ArrEnd {
                    return Ok(());
                }
                loop {
                    self.value(t, depth + 1)?;
                    let next = self.token();
                    match next.kind {
                        Tok::ArrEnd => return Ok(()),
                        Tok::Comma => t = self.token(),
                        _ => return Err(next.expected("comma or array end")),
                    }
                }
            }
            _ => Err(t.expected("value")),
        }
    }
}

/// The length of the JSON number at the start of `b`, if one is there.
fn number_len(b: &[u8]) -> Option<usize> {
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let s = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > s
    };
    if b.get(i) == Some(&b'0') {
        i += 1;
        if b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
    } else if !digits(&mut i) {
        return None;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return None;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return None;
        }
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool() -> prost_reflect::DescriptorPool {
        let dir = super::super::tests::tempdir();
        let p = dir.join("t.proto");
        std::fs::write(
            &p,
            r#"syntax = "proto3"; package t;
               import "google/protobuf/timestamp.proto";
               enum Color { RED = 0; GREEN = 1; }
               message Limb { int32 count = 1; string endings = 2; }
               message All {
                 string s = 1; bool b = 2; int64 big = 3; uint32 u = 4; double d = 5;
                 bytes raw = 6; Color color = 7; repeated string list = 8;
                 map<string, int32> counts = 9; Limb limb = 10;
                 google.protobuf.Timestamp at = 11; optional string maybe = 12;
                 oneof pick { string left = 13; int32 right = 14; }
               }
               service S { rpc M(All) returns (All); }"#,
        )
        .unwrap();
        let mut c = protox::Compiler::new([&dir]).unwrap();
        c.open_file("t.proto").unwrap();
        c.descriptor_pool()
    }

    #[test]
    fn writes_kongs_json_defaults_included_and_names_as_in_the_proto() {
        let all = pool().get_message_by_name("t.All").unwrap();
        let empty = DynamicMessage::new(all.clone());
        assert_eq!(
            serde_json::to_string(&to_json(&empty)).unwrap(),
            r#"{"s":"","b":false,"big":0,"u":0,"d":0.0,"raw":"","color":"RED","list":[],"counts":{}}"#
        );
        let m = from_json(
            &all,
            &json!({"s": "x", "b": true, "big": 9007199254740993i64, "color": "GREEN",
                    "list": ["a", "b"], "counts": {"k": 2}, "limb": {"count": "4"},
                    "at": "2026-12-03T10:20:30.5Z", "maybe": "", "right": 3, "unknown": 1}),
        )
        .unwrap();
        let back = to_json(&m);
        assert_eq!(back["big"], json!(9007199254740993i64));
        assert_eq!(back["color"], "GREEN");
        assert_eq!(back["limb"], json!({"count": 4, "endings": ""}));
        assert_eq!(back["at"], "2026-12-03T10:20:30");
        assert_eq!(back["maybe"], "");
        assert_eq!(back["right"], 3);
        assert!(back.get("left").is_none() && back.get("unknown").is_none());
        // Bytes go through as the string they are.
        let m = from_json(&all, &json!({"raw": "abc"})).unwrap();
        assert_eq!(to_json(&m)["raw"], "abc");
    }

    #[test]
    fn refuses_what_lua_protobuf_refuses() {
        let all = pool().get_message_by_name("t.All").unwrap();
        for bad in [
            json!({"s": null}),
            json!({"s": 1}),
            json!({"big": 1.5}),
            json!({"u": -1}),
            json!({"limb": "x"}),
            json!({"list": "x"}),
            json!({"at": 5}),
            json!({"at": "yesterday"}),
            json!({"color": "BLUE"}),
            json!([1]),
        ] {
            assert!(from_json(&all, &bad).is_err(), "{bad}");
        }
        // Lua's truth for a bool field, and `{}` read as an empty list (cjson's tables).
        let m = from_json(&all, &json!({"b": "false", "list": {}})).unwrap();
        assert_eq!(to_json(&m)["b"], true);
    }

    #[test]
    fn timestamps_as_kongs_date_hook_writes_and_reads_them() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00");
        assert_eq!(iso8601(1_796_294_430), "2026-12-03T10:40:30");
        assert_eq!(iso8601(-1), "1969-12-31T23:59:59");
        assert_eq!(
            parse_timestamp("2026-12-03T10:40:30"),
            Some((1_796_294_430, 0))
        );
        assert_eq!(
            parse_timestamp("2026-12-03T10:40:30.25Z"),
            Some((1_796_294_430, 250_000_000))
        );
        assert_eq!(
            parse_timestamp("2026-12-03T12:40:30+02:00"),
            Some((1_796_294_430, 0))
        );
        assert_eq!(parse_timestamp("2026-12-03"), Some((1_796_256_000, 0)));
        for bad in [
            "",
            "2026-13-01",
            "2026-12-03T25:00:00",
            "2026-12-03T10:40:30 UTC",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn json_errors_read_as_lua_cjsons() {
        assert_eq!(
            cjson_error(br#"{"message":"invalid}"#).unwrap(),
            "Expected value but found unexpected end of string at character 21"
        );
        assert_eq!(
            cjson_error(b"").unwrap(),
            "Expected value but found T_END at character 1"
        );
        assert_eq!(
            cjson_error(b"{\"a\":1} x").unwrap(),
            "Expected the end but found invalid token at character 9"
        );
        assert_eq!(
            cjson_error(b"{\"a\" 1}").unwrap(),
            "Expected colon but found T_NUMBER at character 6"
        );
        assert_eq!(
            cjson_error(b"[1 2]").unwrap(),
            "Expected comma or array end but found T_NUMBER at character 4"
        );
        assert_eq!(
            cjson_error(b"{1:2}").unwrap(),
            "Expected object key string but found T_NUMBER at character 2"
        );
        assert_eq!(cjson_error(br#"{"a":[1,{"b":null}],"c":"\u00e9"}"#), None);
    }
}
