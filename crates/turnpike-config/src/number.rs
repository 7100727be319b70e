//! Numbers as Kong writes them. Kong's JSON encoder (lua-cjson, `encode_number_precision`
//! 14) prints a number with `%.14g`: an integral value without a fraction (`1`, not `1.0`),
//! anything else rounded to 14 significant digits. Clients in typed languages depend on it:
//! Kong's Go client decodes an upstream's `healthchecks.active.timeout` into an `int`, and
//! `1.0` fails the whole upstream ("cannot unmarshal number 1.0 into ... of type int").
//!
//! Two layers keep it so: a number field's value is stored as Kong would read it back
//! ([`value`], used by the schema validator and defaults), and every JSON the Admin API,
//! `/config` and the exports write goes through [`Formatter`] (or [`normalize`] before YAML),
//! so a float stored before this (or computed anywhere) still comes out as Kong writes it.

use serde::Serialize;
use serde_json::Value;
use std::io;

/// Integral values up to this magnitude are written as integers, exactly (2^53: every integer
/// up to it is an exact f64). Kong's `%.14g` switches to an exponent from 1e14 on; an integer
/// is friendlier to typed clients and means the same number.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// `f` as Kong writes it: `Ok(i)` when it is integral (after Kong's rounding to 14
/// significant digits), else `Err(g)`, the value rounded as `%.14g` rounds it.
pub fn kong(f: f64) -> Result<i64, f64> {
    if !f.is_finite() {
        return Err(f);
    }
    if f.fract() == 0.0 && f.abs() < EXACT {
        return Ok(f as i64);
    }
    // `%.14g`: 14 significant digits.
    let g = format!("{f:.13e}").parse::<f64>().unwrap_or(f);
    if g.fract() == 0.0 && g.abs() < EXACT {
        Ok(g as i64)
    } else {
        Err(g)
    }
}

/// A number as a JSON value, as Kong stores and returns it.
pub fn value(f: f64) -> Value {
    match kong(f) {
        Ok(i) => Value::from(i),
        Err(g) => Value::from(g),
    }
}

/// Rewrites every floating-point number inside `v` as Kong writes it (for output that does not
/// go through [`Formatter`], such as YAML).
pub fn normalize(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64() {
                *v = value(f);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        Value::Object(m) => m.values_mut().for_each(normalize),
        _ => {}
    }
}

/// serde_json's compact formatter with Kong's numbers.
#[derive(Clone, Copy, Default)]
pub struct Formatter;

impl serde_json::ser::Formatter for Formatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, f: f64) -> io::Result<()> {
        match kong(f) {
            Ok(i) => serde_json::ser::CompactFormatter.write_i64(w, i),
            Err(g) => serde_json::ser::CompactFormatter.write_f64(w, g),
        }
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, f: f32) -> io::Result<()> {
        self.write_f64(w, f as f64)
    }
}

/// Writes `v` as compact JSON with Kong's numbers.
pub fn to_writer<W: io::Write, T: ?Sized + Serialize>(w: W, v: &T) -> serde_json::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(w, Formatter);
    v.serialize(&mut ser)
}

/// `v` as compact JSON with Kong's numbers.
pub fn to_vec<T: ?Sized + Serialize>(v: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    to_writer(&mut out, v)?;
    Ok(out)
}

/// `v` as a JSON string with Kong's numbers.
pub fn to_string<T: ?Sized + Serialize>(v: &T) -> serde_json::Result<String> {
    // The serializer writes UTF-8 only.
    to_vec(v).map(|b| String::from_utf8(b).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integral_numbers_have_no_fraction_and_others_fourteen_digits() {
        let v = json!({"timeout": 1.0, "interval": 0.0, "neg": -5.0, "big": 1e15,
            "half": 0.5, "sum": 0.1 + 0.2, "almost": 0.999_999_999_999_999_9,
            "list": [2.0, 2.5], "int": 7, "inf_like": 1e300});
        let text = to_string(&v).unwrap();
        assert_eq!(
            text,
            r#"{"timeout":1,"interval":0,"neg":-5,"big":1000000000000000,"half":0.5,"sum":0.3,"almost":1,"list":[2,2.5],"int":7,"inf_like":1e+300}"#
        );
        let mut n = v.clone();
        normalize(&mut n);
        assert_eq!(serde_json::to_string(&n).unwrap(), text);
        assert!(value(3.0).is_i64());
        assert_eq!(value(0.01), json!(0.01));
        // Integers up to 2^53 stay exact (Kong's %.14g would round 16 digits).
        assert_eq!(
            value(4_503_599_627_370_497.0),
            json!(4_503_599_627_370_497_i64)
        );
    }
}
