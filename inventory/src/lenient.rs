//! Reading scalar fields the way Inspector's hooks do: IPA-shaped bodies from other agents (or
//! older IPAs) send numbers as strings (`"count": "4"`), and Inspector's hooks call `int()` /
//! `str()` on them, or skip a value they cannot read with a warning. So a scalar of another
//! type is coerced as Python would and one that cannot be read is absent — never a reason to
//! refuse the whole body. Structure (the inventory, its lists of interfaces and disks) stays
//! checked.

use serde::{Deserialize, Deserializer, de::DeserializeOwned};
use serde_json::Value;

/// Python's `int()` of a string: optional sign, decimal digits with single underscores
/// between them, surrounding whitespace allowed. `None` where Python raises `ValueError`.
pub fn python_int_literal(s: &str) -> Option<i128> {
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if !python_underscores(body) || !body.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return None;
    }
    let n: i128 = body.replace('_', "").parse().ok()?;
    Some(if neg { -n } else { n })
}

/// Underscores only between two digits (Python's numeric literals), and a non-empty text.
pub fn python_underscores(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter().enumerate().all(|(i, c)| {
            *c != b'_'
                || (i > 0
                    && b[i - 1].is_ascii_digit()
                    && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        })
}

/// Python's `int(v)` for a JSON value: ints, bools, floats (truncated) and numeric strings.
pub fn python_int(v: &Value) -> Option<i128> {
    match v {
        Value::Bool(b) => Some(i128::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Some(i128::from(u))
            } else {
                // Truncation toward zero is what int() does; out of range is unreadable.
                #[allow(clippy::cast_possible_truncation)]
                n.as_f64()
                    .filter(|f| f.is_finite() && f.abs() < 1.7e38)
                    .map(|f| f.trunc() as i128)
            }
        }
        Value::String(s) => python_int_literal(s),
        _ => None,
    }
}

fn value<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Value::deserialize(d)
}

/// A non-negative integer, or absent.
pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(python_int(&value(d)?).and_then(|i| u64::try_from(i).ok()))
}

/// A non-negative integer that fits 32 bits, or absent.
pub fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(python_int(&value(d)?).and_then(|i| u32::try_from(i).ok()))
}

/// A non-negative integer, 0 when unreadable.
pub fn u64_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(opt_u64(d)?.unwrap_or(0))
}

/// Python's `str()` of a scalar (`True`, `4`); `None` for `null`, lists and objects.
fn scalar_text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        Value::Bool(true) => Some("True".into()),
        Value::Bool(false) => Some("False".into()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A string (a number or a bool as Python's `str()` writes it), or absent.
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(scalar_text(value(d)?))
}

/// A string, empty when absent or unreadable.
pub fn string_or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(opt_string(d)?.unwrap_or_default())
}

/// A ramdisk's `error`: any value Python finds true is an error, shown as text.
pub fn error_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = value(d)?;
    Ok(match v {
        Value::Null | Value::Bool(false) => None,
        Value::String(s) => Some(s),
        Value::Array(ref a) if a.is_empty() => None,
        Value::Object(ref o) if o.is_empty() => None,
        Value::Number(ref n) if n.as_f64() == Some(0.0) => None,
        other => Some(other.to_string()),
    })
}

/// A boolean; `"true"`, `"yes"`, `"1"`, non-zero numbers are true, anything else false.
pub fn boolish<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match value(d)? {
        Value::Bool(b) => b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "1" | "t" | "true" | "on" | "y" | "yes"
        ),
        _ => false,
    })
}

/// A list of strings (other scalars as text); not a list: empty.
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match value(d)? {
        Value::Array(a) => a.into_iter().filter_map(scalar_text).collect(),
        _ => Vec::new(),
    })
}

/// Any structure that does not read as `T` is absent.
pub fn or_none<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<T>, D::Error> {
    Ok(serde_json::from_value(value(d)?).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn int_as_python_reads_it() {
        let cases = [
            (json!(4), Some(4)),
            (json!("4"), Some(4)),
            (json!(" -4 "), Some(-4)),
            (json!("1_000"), Some(1000)),
            (json!(4.7), Some(4)),
            (json!(true), Some(1)),
            (json!("4.0"), None),
            (json!("four"), None),
            (json!("1__0"), None),
            (json!(null), None),
            (json!([4]), None),
        ];
        for (v, want) in cases {
            assert_eq!(python_int(&v), want, "{v}");
        }
    }
}
