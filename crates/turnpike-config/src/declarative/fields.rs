//! Reads one entity's JSON object field by field, applying Kong's types, defaults and messages,
//! and collecting every violation instead of stopping at the first.

use serde_json::{Map, Value};

pub const REQUIRED: &str = "required field missing";

pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    known: Vec<&'static str>,
    pub errors: Vec<(String, String)>,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Self {
        // Kong allows these on every entity of a declarative file.
        Fields {
            map,
            known: vec!["_comment", "_ignore"],
            errors: Vec::new(),
        }
    }

    pub fn err(&mut self, field: impl Into<String>, msg: impl Into<String>) {
        self.errors.push((field.into(), msg.into()));
    }

    /// The raw value, `None` when absent or null. Marks the field as known.
    pub fn raw(&mut self, name: &'static str) -> Option<&'a Value> {
        self.known.push(name);
        match self.map.get(name) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn is_set(&self, name: &str) -> bool {
        !matches!(self.map.get(name), None | Some(Value::Null))
    }

    pub fn known(&mut self, names: &[&'static str]) {
        self.known.extend_from_slice(names);
    }

    pub fn str(&mut self, name: &'static str) -> Option<String> {
        match self.raw(name)? {
            Value::String(s) if s.is_empty() => {
                self.err(name, "length must be at least 1");
                None
            }
            Value::String(s) => Some(s.clone()),
            _ => {
                self.err(name, "expected a string");
                None
            }
        }
    }

    pub fn req_str(&mut self, name: &'static str) -> Option<String> {
        if !self.is_set(name) {
            self.known.push(name);
            self.err(name, REQUIRED);
            return None;
        }
        self.str(name)
    }

    pub fn int(
        &mut self,
        name: &'static str,
        min: i64,
        max: i64,
        default: Option<i64>,
    ) -> Option<i64> {
        let Some(v) = self.raw(name) else {
            return default;
        };
        let n = match v {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
            _ => None,
        };
        match n {
            None => {
                self.err(name, "expected an integer");
                default
            }
            Some(n) if n < min || n > max => {
                self.err(name, format!("value should be between {min} and {max}"));
                default
            }
            Some(n) => Some(n),
        }
    }

    pub fn bool(&mut self, name: &'static str, default: bool) -> bool {
        self.opt_bool(name).unwrap_or(default)
    }

    pub fn opt_bool(&mut self, name: &'static str) -> Option<bool> {
        match self.raw(name)? {
            Value::Bool(b) => Some(*b),
            _ => {
                self.err(name, "expected a boolean");
                None
            }
        }
    }

    pub fn one_of(
        &mut self,
        name: &'static str,
        options: &[&str],
        default: Option<&str>,
    ) -> Option<String> {
        let Some(s) = self.str(name) else {
            return default.map(String::from);
        };
        if options.contains(&s.as_str()) {
            Some(s)
        } else {
            self.err(name, format!("expected one of: {}", options.join(", ")));
            default.map(String::from)
        }
    }

    /// An array of strings; element errors are reported as `name.<1-based index>` as Kong does.
    pub fn str_array(&mut self, name: &'static str) -> Option<Vec<String>> {
        let v = self.raw(name)?;
        let Value::Array(items) = v else {
            self.err(name, "expected an array");
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                _ => self.err(format!("{name}.{}", i + 1), "expected a string"),
            }
        }
        Some(out)
    }

    /// A set of strings (duplicates are an error, as in Kong's `set` type).
    pub fn str_set(&mut self, name: &'static str) -> Option<Vec<String>> {
        let v = self.str_array(name)?;
        let mut seen = std::collections::HashSet::new();
        for (i, s) in v.iter().enumerate() {
            if !seen.insert(s) {
                self.err(format!("{name}.{}", i + 1), format!("duplicate value: {s}"));
            }
        }
        Some(v)
    }

    pub fn tags(&mut self) -> Option<Vec<String>> {
        let tags = self.str_set("tags")?;
        for (i, t) in tags.iter().enumerate() {
            if t.is_empty()
                || t.contains(',')
                || t.contains('/')
                || t.chars().any(|c| c.is_control())
            {
                self.err(
                    format!("tags.{}", i + 1),
                    format!("invalid tag '{t}': expected printable ascii (except `,` and `/`) or valid utf-8 sequences"),
                );
            }
        }
        Some(tags)
    }

    pub fn uuid(&mut self, name: &'static str) -> Option<String> {
        let s = self.str(name)?;
        if uuid::Uuid::parse_str(&s).is_ok() {
            Some(s.to_ascii_lowercase())
        } else {
            self.err(name, "expected a valid UUID");
            None
        }
    }

    /// Kong's `utf8_name`: letters, digits and `.-_~`.
    pub fn name(&mut self, name: &'static str) -> Option<String> {
        let s = self.str(name)?;
        if s.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | '~'))
        {
            Some(s)
        } else {
            self.err(
                name,
                format!("invalid value '{s}': the only accepted ascii characters are alphanumerics or ., -, _, and ~"),
            );
            None
        }
    }

    /// Every key not read by this reader is an "unknown field".
    pub fn finish(mut self) -> Vec<(String, String)> {
        for k in self.map.keys() {
            if !self.known.contains(&k.as_str()) {
                self.errors.push((k.clone(), "unknown field".into()));
            }
        }
        self.errors
    }
}

/// Validates a host name or IP (Kong's `typedefs.host`), optionally with wildcards and port.
pub fn check_host(h: &str, allow_wildcard: bool, allow_port: bool) -> Result<(), String> {
    let (host, port) = split_host_port(h);
    if let Some(p) = port {
        if !allow_port {
            return Err(format!("invalid value: {h}"));
        }
        if p.parse::<u16>().is_err() {
            return Err(format!("invalid port number: {p}"));
        }
    }
    if host.is_empty() {
        return Err(format!("invalid hostname: {h}"));
    }
    let stars = host.matches('*').count();
    if stars > 0 {
        if !allow_wildcard {
            return Err(format!("invalid hostname: {h}"));
        }
        if stars > 1 {
            return Err("invalid wildcard: must have at most one wildcard".into());
        }
        if !(host.starts_with("*.") || host.ends_with(".*")) {
            return Err("invalid wildcard: must be placed at leftmost or rightmost label".into());
        }
    }
    let bare = host.trim_start_matches("*.").trim_end_matches(".*");
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if host.starts_with('[')
        && host.ends_with(']')
        && host[1..host.len() - 1]
            .parse::<std::net::Ipv6Addr>()
            .is_ok()
    {
        return Ok(());
    }
    let valid = bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if valid {
        Ok(())
    } else {
        Err(format!("invalid hostname: {h}"))
    }
}

/// Splits `host:port` (and `[v6]:port`); a bare IPv6 address has no port.
pub fn split_host_port(h: &str) -> (&str, Option<&str>) {
    if let Some(rest) = h.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            let after = &rest[end + 1..];
            return (&h[..end + 2], after.strip_prefix(':'));
        }
        return (h, None);
    }
    match h.rfind(':') {
        Some(i) if h[..i].find(':').is_none() => (&h[..i], Some(&h[i + 1..])),
        _ => (h, None),
    }
}
