//! The bits of Python's semantics Inspector's rules depend on, over JSON values: `str()` and
//! `repr()`, the `int()`/`float()` coercion of `plugins/rules.py`'s `coerce`, comparisons
//! (`==`, `<`, … between ints, floats, bools, strings and lists, `TypeError` otherwise), and
//! `str.format(data=…)` with its format-spec mini-language.
//!
//! Inspector is a Python program: a rule compares `"4"` with `4` by calling `int("4")`, a
//! value `"{data[x]}"` becomes `str(data["x"])`, so `null` prints as `None` and a dict as
//! `{'a': 1}`. Every function here does what the Python expression would, or returns the
//! exception Python would raise ([`PyError`]); the rules engine turns those into clean errors.

use std::borrow::Cow;
use std::cmp::Ordering;

use paddock_inventory::lenient::{python_int_literal, python_underscores};
use serde_json::{Map, Value};

/// A Python exception: its class and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct PyError {
    pub kind: &'static str,
    pub message: String,
}

impl PyError {
    fn new(kind: &'static str, message: impl Into<String>) -> Self {
        PyError {
            kind,
            message: message.into(),
        }
    }
    pub fn type_error(message: impl Into<String>) -> Self {
        Self::new("TypeError", message)
    }
    pub fn value_error(message: impl Into<String>) -> Self {
        Self::new("ValueError", message)
    }
    pub fn index_error(message: impl Into<String>) -> Self {
        Self::new("IndexError", message)
    }
    /// `KeyError(key)`: its message is the key's `repr()`, as `str(KeyError('x'))` is `'x'`.
    pub fn key_error(key_repr: impl Into<String>) -> Self {
        Self::new("KeyError", key_repr)
    }
    pub fn attribute_error(message: impl Into<String>) -> Self {
        Self::new("AttributeError", message)
    }
}

type Result<T> = std::result::Result<T, PyError>;

/// The Python type a JSON value loads as (`json.loads`).
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python truthiness (`bool(v)`).
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `repr(float)`: the shortest string that reads back the same, in fixed notation for
/// exponents from -4 to 15 (with at least one decimal, `12.0`) and scientific otherwise
/// (`1e+16`, `1.5e-05`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form too: "-1.2345e3".
    let (sign, digits, exp) = shortest_digits(f);
    if (-4..16).contains(&exp) {
        let mut s = fixed_from_digits(&digits, exp);
        if !s.contains('.') {
            s.push_str(".0");
        }
        format!("{sign}{s}")
    } else {
        format!("{sign}{}", sci_from_digits(&digits, exp))
    }
}

/// The sign, significant digits and decimal exponent of `f`'s shortest representation.
fn shortest_digits(f: f64) -> (&'static str, String, i32) {
    split_exp(&format!("{f:e}"))
}

/// Splits Rust's `{:e}` output (`-1.25e-3`) into sign, digits (`125`) and exponent (`-3`).
fn split_exp(sci: &str) -> (&'static str, String, i32) {
    let (mant, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let sign = if mant.starts_with('-') { "-" } else { "" };
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    (sign, digits, exp.parse().unwrap_or(0))
}

/// `d1d2…dn × 10^(exp − n + 1)` in fixed notation, no trailing ".0" added.
fn fixed_from_digits(digits: &str, exp: i32) -> String {
    let n = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let point = exp.saturating_add(1);
    if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point >= n {
        format!("{digits}{}", "0".repeat(point.abs_diff(n) as usize))
    } else {
        let at = point.unsigned_abs() as usize;
        format!("{}.{}", &digits[..at], &digits[at..])
    }
}

/// `d1.d2…dn e±XX`, Python's scientific form.
fn sci_from_digits(digits: &str, exp: i32) -> String {
    let mant = if digits.len() > 1 {
        format!("{}.{}", &digits[..1], &digits[1..])
    } else {
        digits.to_string()
    };
    format!(
        "{mant}e{}{:02}",
        if exp < 0 { '-' } else { '+' },
        exp.unsigned_abs()
    )
}

fn printable(c: char) -> bool {
    !(c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

fn escape_char(out: &mut String, c: char) {
    let n = u32::from(c);
    if n < 0x100 {
        out.push_str(&format!("\\x{n:02x}"));
    } else if n < 0x10000 {
        out.push_str(&format!("\\u{n:04x}"));
    } else {
        out.push_str(&format!("\\U{n:08x}"));
    }
}

/// `repr(str)`: single quotes unless the text has one and no double quote.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if printable(c) => out.push(c),
            c => escape_char(&mut out, c),
        }
    }
    out.push(quote);
    out
}

/// `repr(v)`.
pub fn repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, v);
    out
}

fn write_repr(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => out.push_str(&str_repr(s)),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, x);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&str_repr(k));
                out.push_str(": ");
                write_repr(out, x);
            }
            out.push('}');
        }
    }
}

/// `str(v)`: the text itself for a string, `repr()` otherwise (`None`, `True`, `{'a': 1}`).
pub fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => repr(other),
    }
}

/// `ascii(v)`: `repr()` with every non-ASCII character escaped.
fn ascii(v: &Value) -> String {
    let mut out = String::new();
    for c in repr(v).chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            escape_char(&mut out, c);
        }
    }
    out
}

/// A Python number: `int` (as large as JSON gives, and more than `u64`) or `float`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            // Precision is lost beyond 2^53, as it would be in a mixed comparison anyway.
            #[allow(clippy::cast_precision_loss)]
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

fn json_num(v: &Value) -> Option<Num> {
    match v {
        Value::Bool(b) => Some(Num::Int(i128::from(*b))),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(Num::Int(i128::from(i)))
            } else if let Some(u) = n.as_u64() {
                Some(Num::Int(i128::from(u)))
            } else {
                n.as_f64().map(Num::Float)
            }
        }
        _ => None,
    }
}

/// Python's `float()` literal syntax (decimal, exponent, `inf`, `infinity`, `nan`).
fn parse_float_literal(s: &str) -> Option<f64> {
    let t = s.trim();
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return t.to_ascii_lowercase().parse().ok();
    }
    let ok_chars = body
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-' | '_'));
    if !ok_chars || (body.contains('_') && !python_underscores(body)) {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// `int(v)`.
pub fn int_of(v: &Value) -> Result<Num> {
    match v {
        Value::String(s) => python_int_literal(s).map(Num::Int).ok_or_else(|| {
            PyError::value_error(format!(
                "invalid literal for int() with base 10: {}",
                str_repr(s)
            ))
        }),
        Value::Bool(_) | Value::Number(_) => match json_num(v) {
            Some(Num::Float(f)) if f.is_nan() => {
                Err(PyError::value_error("cannot convert float NaN to integer"))
            }
            Some(Num::Float(f)) if f.is_infinite() => Err(PyError::new(
                "OverflowError",
                "cannot convert float infinity to integer",
            )),
            // Beyond i128 Python's int is exact; keeping the float compares the same.
            #[allow(clippy::cast_possible_truncation)]
            Some(Num::Float(f)) if f.abs() < 1.7e38 => Ok(Num::Int(f.trunc() as i128)),
            Some(Num::Float(f)) => Ok(Num::Float(f.trunc())),
            Some(n) => Ok(n),
            None => Err(PyError::type_error("int() argument is not a number")),
        },
        other => Err(PyError::type_error(format!(
            "int() argument must be a string, a bytes-like object or a real number, not '{}'",
            type_name(other)
        ))),
    }
}

/// `float(v)`.
pub fn float_of(v: &Value) -> Result<f64> {
    match v {
        Value::String(s) => parse_float_literal(s).ok_or_else(|| {
            PyError::value_error(format!(
                "could not convert string to float: {}",
                str_repr(s)
            ))
        }),
        Value::Bool(_) | Value::Number(_) => json_num(v)
            .map(Num::as_f64)
            .ok_or_else(|| PyError::type_error("float() argument is not a number")),
        other => Err(PyError::type_error(format!(
            "float() argument must be a string or a real number, not '{}'",
            type_name(other)
        ))),
    }
}

/// A comparison operator of the rules (`eq`, `ne`, `lt`, `gt`, `le`, `ge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

impl CmpOp {
    pub fn parse(op: &str) -> Option<Self> {
        Some(match op {
            "eq" => CmpOp::Eq,
            "ne" => CmpOp::Ne,
            "lt" => CmpOp::Lt,
            "gt" => CmpOp::Gt,
            "le" => CmpOp::Le,
            "ge" => CmpOp::Ge,
            _ => return None,
        })
    }
    fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Gt => ">",
            CmpOp::Le => "<=",
            CmpOp::Ge => ">=",
        }
    }
}

/// One side of a comparison: a number (with the Python type it came from), or anything else.
#[derive(Clone, Copy)]
enum Operand<'a> {
    Num(Num, &'static str),
    Other(&'a Value),
}

impl<'a> Operand<'a> {
    fn of(v: &'a Value) -> Self {
        match json_num(v) {
            Some(n) => Operand::Num(n, type_name(v)),
            None => Operand::Other(v),
        }
    }
    fn type_name(self) -> &'static str {
        match self {
            Operand::Num(_, t) => t,
            Operand::Other(v) => type_name(v),
        }
    }
}

fn num_cmp(a: Num, b: Num) -> Option<Ordering> {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
        _ => a.as_f64().partial_cmp(&b.as_f64()),
    }
}

fn py_eq(a: Operand, b: Operand) -> bool {
    match (a, b) {
        (Operand::Num(x, _), Operand::Num(y, _)) => num_cmp(x, y) == Some(Ordering::Equal),
        (Operand::Other(x), Operand::Other(y)) => match (x, y) {
            (Value::Null, Value::Null) => true,
            (Value::String(s), Value::String(t)) => s == t,
            (Value::Array(s), Value::Array(t)) => {
                s.len() == t.len()
                    && s.iter()
                        .zip(t)
                        .all(|(p, q)| py_eq(Operand::of(p), Operand::of(q)))
            }
            (Value::Object(s), Value::Object(t)) => {
                s.len() == t.len()
                    && s.iter().all(|(k, p)| {
                        t.get(k)
                            .is_some_and(|q| py_eq(Operand::of(p), Operand::of(q)))
                    })
            }
            _ => false,
        },
        _ => false,
    }
}

fn holds(op: CmpOp, ord: Option<Ordering>) -> bool {
    match (op, ord) {
        (_, None) => op == CmpOp::Ne,
        (CmpOp::Eq, Some(o)) => o == Ordering::Equal,
        (CmpOp::Ne, Some(o)) => o != Ordering::Equal,
        (CmpOp::Lt, Some(o)) => o == Ordering::Less,
        (CmpOp::Gt, Some(o)) => o == Ordering::Greater,
        (CmpOp::Le, Some(o)) => o != Ordering::Greater,
        (CmpOp::Ge, Some(o)) => o != Ordering::Less,
    }
}

/// `a <op> b` as Python evaluates it.
fn py_compare(op: CmpOp, a: Operand, b: Operand) -> Result<bool> {
    match op {
        CmpOp::Eq => return Ok(py_eq(a, b)),
        CmpOp::Ne => return Ok(!py_eq(a, b)),
        _ => {}
    }
    match (a, b) {
        (Operand::Num(x, _), Operand::Num(y, _)) => Ok(holds(op, num_cmp(x, y))),
        (Operand::Other(Value::String(s)), Operand::Other(Value::String(t))) => {
            Ok(holds(op, Some(s.as_str().cmp(t.as_str()))))
        }
        (Operand::Other(Value::Array(s)), Operand::Other(Value::Array(t))) => {
            for (p, q) in s.iter().zip(t) {
                let (p, q) = (Operand::of(p), Operand::of(q));
                if !py_eq(p, q) {
                    return py_compare(op, p, q);
                }
            }
            Ok(holds(op, Some(s.len().cmp(&t.len()))))
        }
        _ => Err(PyError::type_error(format!(
            "'{}' not supported between instances of '{}' and '{}'",
            op.symbol(),
            a.type_name(),
            b.type_name()
        ))),
    }
}

/// Inspector's `SimpleCondition.check`: `op(coerce(field, value), value)`, where `coerce`
/// calls `float()` on the field when the rule's value is a float and `int()` when it is an
/// int (or a bool: Python's bools are ints), and leaves it alone otherwise.
pub fn compare(op: CmpOp, field: &Value, value: &Value) -> Result<bool> {
    let have = match value {
        Value::Number(n) if n.is_f64() => Operand::Num(Num::Float(float_of(field)?), "float"),
        Value::Number(_) | Value::Bool(_) => match int_of(field)? {
            n @ Num::Int(_) => Operand::Num(n, "int"),
            n @ Num::Float(_) => Operand::Num(n, "int"),
        },
        _ => Operand::Other(field),
    };
    py_compare(op, have, Operand::of(value))
}

// ---- str.format ----

/// `template.format(data=data)`.
pub fn format(template: &str, data: &Value) -> Result<String> {
    format_depth(template, data, 2)
}

fn format_depth(template: &str, data: &Value, depth: u8) -> Result<String> {
    if depth == 0 {
        return Err(PyError::value_error("Max string recursion exceeded"));
    }
    let chars: Vec<char> = template.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '}' {
            if chars.get(i + 1) == Some(&'}') {
                out.push('}');
                i += 2;
                continue;
            }
            return Err(PyError::value_error(
                "Single '}' encountered in format string",
            ));
        }
        if c != '{' {
            out.push(c);
            i += 1;
            continue;
        }
        if chars.get(i + 1) == Some(&'{') {
            out.push('{');
            i += 2;
            continue;
        }
        // A replacement field: up to the matching '}', skipping over nested braces and, in
        // the field name, over `[…]` (whose key may hold braces).
        let start = i + 1;
        let mut depth_braces = 1usize;
        let mut in_name = true;
        let mut j = start;
        while j < chars.len() {
            match chars[j] {
                '[' if in_name => {
                    while j < chars.len() && chars[j] != ']' {
                        j += 1;
                    }
                    if j == chars.len() {
                        break;
                    }
                }
                ':' | '!' if in_name => in_name = false,
                '{' => depth_braces += 1,
                '}' => {
                    depth_braces -= 1;
                    if depth_braces == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        if j >= chars.len() {
            return Err(PyError::value_error("expected '}' before end of string"));
        }
        let field: String = chars[start..j].iter().collect();
        out.push_str(&replacement(&field, data, depth)?);
        i = j + 1;
    }
    Ok(out)
}

/// One `{field_name!conversion:spec}`.
fn replacement(field: &str, data: &Value, depth: u8) -> Result<String> {
    let chars: Vec<char> = field.chars().collect();
    // The field name ends at '!' or ':' outside brackets.
    let mut k = 0;
    while k < chars.len() {
        match chars[k] {
            '[' => {
                while k < chars.len() && chars[k] != ']' {
                    k += 1;
                }
                if k < chars.len() {
                    k += 1;
                }
                continue;
            }
            '!' | ':' => break,
            _ => k += 1,
        }
    }
    let name: String = chars[..k].iter().collect();
    let mut conversion = None;
    let mut spec = String::new();
    if k < chars.len() && chars[k] == '!' {
        let conv = chars.get(k + 1).ok_or_else(|| {
            PyError::value_error("end of string while looking for conversion specifier")
        })?;
        conversion = Some(*conv);
        match chars.get(k + 2) {
            None => {}
            Some(':') => spec = chars[k + 3..].iter().collect(),
            Some(_) => {
                return Err(PyError::value_error(
                    "expected ':' after conversion specifier",
                ));
            }
        }
    } else if k < chars.len() {
        spec = chars[k + 1..].iter().collect();
    }
    let value = resolve(&name, data)?;
    let value = match conversion {
        None => value.into_owned(),
        Some('s') => Value::String(str_of(&value)),
        Some('r') => Value::String(repr(&value)),
        Some('a') => Value::String(ascii(&value)),
        Some(c) => {
            return Err(PyError::value_error(format!(
                "Unknown conversion specifier {c}"
            )));
        }
    };
    let spec = if spec.contains('{') {
        format_depth(&spec, data, depth - 1)?
    } else {
        spec
    };
    format_value(&value, &spec)
}

/// The value a field name (`data[inventory][bmc_address]`) names.
fn resolve<'a>(name: &str, data: &'a Value) -> Result<Cow<'a, Value>> {
    let first_end = name.find(['.', '[']).unwrap_or(name.len());
    let (arg, mut rest) = name.split_at(first_end);
    if arg.is_empty() || arg.bytes().all(|b| b.is_ascii_digit()) {
        let index = if arg.is_empty() { "0" } else { arg };
        return Err(PyError::index_error(format!(
            "Replacement index {index} out of range for positional args tuple"
        )));
    }
    if arg != "data" {
        return Err(PyError::key_error(str_repr(arg)));
    }
    let mut cur = Cow::Borrowed(data);
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let attr = &after[..end];
            if attr.is_empty() {
                return Err(PyError::value_error("Empty attribute in format string"));
            }
            // Python would look the attribute up; a JSON value has none worth printing.
            return Err(PyError::attribute_error(format!(
                "'{}' object has no attribute {}",
                type_name(&cur),
                str_repr(attr)
            )));
        }
        let after = rest.strip_prefix('[').unwrap_or(rest);
        let end = after
            .find(']')
            .ok_or_else(|| PyError::value_error("Missing ']' in format string"))?;
        let key = &after[..end];
        if key.is_empty() {
            return Err(PyError::value_error("Empty attribute in format string"));
        }
        rest = &after[end + 1..];
        if !(rest.is_empty() || rest.starts_with(['.', '['])) {
            return Err(PyError::value_error(
                "Only '.' or '[' may follow ']' in format field specifier",
            ));
        }
        cur = match cur {
            Cow::Borrowed(v) => getitem(v, key)?,
            Cow::Owned(v) => Cow::Owned(getitem(&v, key)?.into_owned()),
        };
    }
    Ok(cur)
}

/// `obj[key]` with the key as `str.format` passes it: an int when it is all digits.
fn getitem<'a>(obj: &'a Value, key: &str) -> Result<Cow<'a, Value>> {
    let digits = key.bytes().all(|b| b.is_ascii_digit());
    // An int key, however large: larger than any list here.
    let index = || key.parse::<usize>().unwrap_or(usize::MAX);
    match obj {
        Value::Object(m) if !digits => m
            .get(key)
            .map(Cow::Borrowed)
            .ok_or_else(|| PyError::key_error(str_repr(key))),
        // JSON keys are strings: an int never finds one.
        Value::Object(_) => Err(PyError::key_error(int_repr(key))),
        Value::Array(a) if digits => a
            .get(index())
            .map(Cow::Borrowed)
            .ok_or_else(|| PyError::index_error("list index out of range")),
        Value::Array(_) => Err(PyError::type_error(
            "list indices must be integers or slices, not str",
        )),
        Value::String(s) if digits => s
            .chars()
            .nth(index())
            .map(|c| Cow::Owned(Value::String(c.to_string())))
            .ok_or_else(|| PyError::index_error("string index out of range")),
        Value::String(_) => Err(PyError::type_error(
            "string indices must be integers, not 'str'",
        )),
        other => Err(PyError::type_error(format!(
            "'{}' object is not subscriptable",
            type_name(other)
        ))),
    }
}

/// `repr(int(digits))`: the digits without leading zeros.
fn int_repr(digits: &str) -> String {
    let t = digits.trim_start_matches('0');
    if t.is_empty() { "0".into() } else { t.into() }
}

/// A parsed format spec: `[[fill]align][sign][z][#][0][width][grouping][.precision][type]`.
#[derive(Clone, Debug, Default, PartialEq)]
struct Spec {
    fill: Option<char>,
    align: Option<char>,
    sign: Option<char>,
    no_neg_zero: bool,
    alternate: bool,
    width: usize,
    grouping: Option<char>,
    precision: Option<usize>,
    kind: Option<char>,
}

fn parse_spec(spec: &str, type_of: &str) -> Result<Spec> {
    let c: Vec<char> = spec.chars().collect();
    let mut s = Spec::default();
    let mut i = 0;
    let is_align = |ch: char| matches!(ch, '<' | '>' | '=' | '^');
    if c.len() >= 2 && is_align(c[1]) {
        s.fill = Some(c[0]);
        s.align = Some(c[1]);
        i = 2;
    } else if !c.is_empty() && is_align(c[0]) {
        s.align = Some(c[0]);
        i = 1;
    }
    if let Some(&ch) = c.get(i)
        && matches!(ch, '+' | '-' | ' ')
    {
        s.sign = Some(ch);
        i += 1;
    }
    if c.get(i) == Some(&'z') {
        s.no_neg_zero = true;
        i += 1;
    }
    if c.get(i) == Some(&'#') {
        s.alternate = true;
        i += 1;
    }
    if c.get(i) == Some(&'0') {
        if s.fill.is_none() {
            s.fill = Some('0');
        }
        if s.align.is_none() {
            s.align = Some('=');
        }
        i += 1;
    }
    let digits = |i: &mut usize| {
        let from = *i;
        while c.get(*i).is_some_and(char::is_ascii_digit) {
            *i += 1;
        }
        let text: String = c[from..*i].iter().collect();
        (!text.is_empty()).then(|| text.parse::<usize>().unwrap_or(usize::MAX))
    };
    let too_big = || PyError::value_error("Too many decimal digits in format string");
    if let Some(w) = digits(&mut i) {
        s.width = w;
        if w > 1 << 16 {
            return Err(too_big());
        }
    }
    if let Some(&ch) = c.get(i)
        && matches!(ch, ',' | '_')
    {
        s.grouping = Some(ch);
        i += 1;
    }
    if c.get(i) == Some(&'.') {
        i += 1;
        let p = digits(&mut i)
            .ok_or_else(|| PyError::value_error("Format specifier missing precision"))?;
        if p > 1 << 16 {
            return Err(too_big());
        }
        s.precision = Some(p);
    }
    if i + 1 < c.len() {
        return Err(PyError::value_error(format!(
            "Invalid format specifier {} for object of type '{type_of}'",
            str_repr(spec)
        )));
    }
    s.kind = c.get(i).copied();
    Ok(s)
}

/// Pads `body` (with `prefix`, the sign and base prefix, before it) to the spec's width.
fn pad(prefix: &str, body: &str, s: &Spec, default_align: char) -> String {
    let len = prefix.chars().count() + body.chars().count();
    let fill = s.fill.unwrap_or(' ');
    let missing = s.width.saturating_sub(len);
    let run = |n: usize| fill.to_string().repeat(n);
    match s.align.unwrap_or(default_align) {
        '<' => format!("{prefix}{body}{}", run(missing)),
        '^' => format!(
            "{}{prefix}{body}{}",
            run(missing / 2),
            run(missing - missing / 2)
        ),
        '=' => format!("{prefix}{}{body}", run(missing)),
        _ => format!("{}{prefix}{body}", run(missing)),
    }
}

/// Inserts `sep` every `every` digits from the right of `digits`.
fn group(digits: &str, sep: Option<char>, every: usize) -> String {
    let Some(sep) = sep else {
        return digits.to_string();
    };
    let chars: Vec<char> = digits.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if i > 0 && (chars.len() - i).is_multiple_of(every) {
            out.push(sep);
        }
        out.push(*c);
    }
    out
}

fn sign_prefix(negative: bool, s: &Spec) -> &'static str {
    match (negative, s.sign) {
        (true, _) => "-",
        (false, Some('+')) => "+",
        (false, Some(' ')) => " ",
        _ => "",
    }
}

/// `format(value, spec)`.
fn format_value(v: &Value, spec: &str) -> Result<String> {
    if spec.is_empty() {
        return Ok(str_of(v));
    }
    match v {
        Value::String(text) => format_str(text, spec),
        Value::Bool(_) | Value::Number(_) => match json_num(v) {
            Some(Num::Int(i)) => format_int(i, spec),
            Some(Num::Float(f)) => format_float(f, &parse_spec(spec, "float")?),
            None => Ok(str_of(v)),
        },
        other => Err(PyError::type_error(format!(
            "unsupported format string passed to {}.__format__",
            type_name(other)
        ))),
    }
}

fn format_str(text: &str, spec: &str) -> Result<String> {
    let s = parse_spec(spec, "str")?;
    if let Some(k) = s.kind.filter(|k| *k != 's') {
        return Err(PyError::value_error(format!(
            "Unknown format code '{k}' for object of type 'str'"
        )));
    }
    if s.sign.is_some() {
        return Err(PyError::value_error(
            "Sign not allowed in string format specifier",
        ));
    }
    if s.alternate {
        return Err(PyError::value_error(
            "Alternate form (#) not allowed in string format specifier",
        ));
    }
    if s.align == Some('=') {
        return Err(PyError::value_error(
            "'=' alignment not allowed in string format specifier",
        ));
    }
    if let Some(g) = s.grouping {
        return Err(PyError::value_error(format!(
            "Cannot specify '{g}' with 's'."
        )));
    }
    let body: String = match s.precision {
        Some(p) => text.chars().take(p).collect(),
        None => text.to_string(),
    };
    Ok(pad("", &body, &s, '<'))
}

fn format_int(i: i128, spec: &str) -> Result<String> {
    let s = parse_spec(spec, "int")?;
    let kind = s.kind.unwrap_or('d');
    if matches!(kind, 'e' | 'E' | 'f' | 'F' | 'g' | 'G' | '%') {
        #[allow(clippy::cast_precision_loss)]
        return format_float(i as f64, &s);
    }
    if s.precision.is_some() {
        return Err(PyError::value_error(
            "Precision not allowed in integer format specifier",
        ));
    }
    let magnitude = i.unsigned_abs();
    let (base_prefix, digits, every) = match kind {
        'd' | 'n' => ("", magnitude.to_string(), 3),
        'b' => ("0b", format!("{magnitude:b}"), 4),
        'o' => ("0o", format!("{magnitude:o}"), 4),
        'x' => ("0x", format!("{magnitude:x}"), 4),
        'X' => ("0X", format!("{magnitude:X}"), 4),
        'c' => {
            let ch = u32::try_from(i)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| PyError::new("OverflowError", "%c arg not in range(0x110000)"))?;
            return Ok(pad("", &ch.to_string(), &s, '<'));
        }
        k => {
            return Err(PyError::value_error(format!(
                "Unknown format code '{k}' for object of type 'int'"
            )));
        }
    };
    if s.grouping == Some(',') && every == 4 {
        return Err(PyError::value_error(format!(
            "Cannot specify ',' with '{kind}'."
        )));
    }
    let prefix = format!(
        "{}{}",
        sign_prefix(i < 0, &s),
        if s.alternate { base_prefix } else { "" }
    );
    Ok(pad(&prefix, &group(&digits, s.grouping, every), &s, '>'))
}

fn format_float(f: f64, s: &Spec) -> Result<String> {
    let kind = s.kind;
    if let Some(k) = kind.filter(|k| !matches!(k, 'e' | 'E' | 'f' | 'F' | 'g' | 'G' | '%' | 'n')) {
        return Err(PyError::value_error(format!(
            "Unknown format code '{k}' for object of type 'float'"
        )));
    }
    let mut value = if kind == Some('%') { f * 100.0 } else { f };
    if s.no_neg_zero && value == 0.0 {
        value = 0.0;
    }
    let negative = value.is_sign_negative() && !value.is_nan();
    let a = value.abs();
    let upper = matches!(kind, Some('E' | 'F' | 'G'));
    let mut body = if !a.is_finite() {
        if a.is_nan() { "nan" } else { "inf" }.to_string()
    } else {
        match kind {
            Some('f' | 'F' | '%') => format!("{a:.*}", s.precision.unwrap_or(6)),
            Some('e' | 'E') => {
                let (_, digits, exp) = split_exp(&format!("{a:.*e}", s.precision.unwrap_or(6)));
                let mut m = sci_from_digits(&digits, exp);
                if s.alternate && !m.contains('.') {
                    m = m.replacen('e', ".e", 1);
                }
                m
            }
            Some('g' | 'G' | 'n') => general(a, s.precision.unwrap_or(6), s.alternate, false),
            _ => match s.precision {
                // No type: repr(), or 'g'-like with a ".0" kept in fixed notation.
                None => float_repr(a),
                Some(p) => general(a, p, s.alternate, true),
            },
        }
    };
    if upper {
        body = body.to_uppercase();
    }
    if kind == Some('%') {
        body.push('%');
    }
    // Group the integer part only.
    let (int_part, rest) = match body.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => body.split_at(at),
        None => (body.as_str(), ""),
    };
    let grouped = format!("{}{rest}", group(int_part, s.grouping, 3));
    Ok(pad(sign_prefix(negative, s), &grouped, s, '>'))
}

/// The `g` presentation of a non-negative finite `a` with `p` significant digits;
/// `repr_like` is the no-type form (switches to scientific one digit earlier, keeps ".0").
fn general(a: f64, p: usize, alternate: bool, repr_like: bool) -> String {
    let p = p.max(1);
    let (_, digits, exp) = split_exp(&format!("{a:.*e}", p - 1));
    let limit = i32::try_from(p).unwrap_or(i32::MAX) - i32::from(repr_like);
    let mut out = if a == 0.0 || (-4..limit).contains(&exp) {
        let exp = if a == 0.0 { 0 } else { exp };
        let decimals = usize::try_from(i32::try_from(p).unwrap_or(i32::MAX) - 1 - exp).unwrap_or(0);
        format!("{a:.decimals$}")
    } else {
        sci_from_digits(&digits, exp)
    };
    if !alternate {
        let (mant, e) = match out.find('e') {
            Some(at) => (out[..at].to_string(), out[at..].to_string()),
            None => (out.clone(), String::new()),
        };
        let mant = if mant.contains('.') {
            mant.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            mant
        };
        out = format!("{mant}{e}");
    }
    if repr_like && !out.contains(['.', 'e', 'n', 'i']) {
        out.push_str(".0");
    }
    out
}

/// Formats every string of a rule's value, recursively through lists and dicts (keys too),
/// as Inspector's `_format_value` does; other values are kept as they are.
pub fn format_deep(v: &Value, data: &Value) -> Result<Value> {
    Ok(match v {
        Value::String(s) => Value::String(format(s, data)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| format_deep(x, data))
                .collect::<Result<_>>()?,
        ),
        Value::Object(o) => {
            let mut m = Map::new();
            for (k, x) in o {
                m.insert(format(k, data)?, format_deep(x, data)?);
            }
            Value::Object(m)
        }
        other => other.clone(),
    })
}

#[cfg(test)]
// 3.14 is Inspector's own test value (test_rules.py), not an approximation of π.
#[allow(clippy::approx_constant)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn str_and_repr_are_pythons() {
        // Each right-hand side is what CPython 3 prints for the left-hand value.
        let cases = [
            (json!(null), "None"),
            (json!(true), "True"),
            (json!(false), "False"),
            (json!(42), "42"),
            (json!(-7), "-7"),
            (json!(18446744073709551615u64), "18446744073709551615"),
            (json!(4.0), "4.0"),
            (json!(2100.084), "2100.084"),
            (json!(1e16), "1e+16"),
            (json!(1e15), "1000000000000000.0"),
            (json!(0.0001), "0.0001"),
            (json!(0.00001), "1e-05"),
            (json!(1.5e-7), "1.5e-07"),
            (json!(-0.0), "-0.0"),
            (json!(123456789.125), "123456789.125"),
            (json!("plain"), "plain"),
            (json!([1, "a", null, true]), "[1, 'a', None, True]"),
            (json!({"a": 1, "b": [2.5]}), "{'a': 1, 'b': [2.5]}"),
            (json!(["it's"]), "[\"it's\"]"),
            (json!(["a\"b'c"]), "['a\"b\\'c']"),
            (json!(["tab\there\n"]), "['tab\\there\\n']"),
            (json!(["\u{7f}\u{a0}é€"]), "['\\x7f\\xa0é€']"),
            (json!({}), "{}"),
            (json!([]), "[]"),
        ];
        for (v, want) in cases {
            assert_eq!(str_of(&v), want, "{v}");
        }
        assert_eq!(repr(&json!("x")), "'x'");
    }

    #[test]
    fn int_and_float_coerce_as_python_does() {
        let int = |v: Value| int_of(&v).map_err(|e| e.kind);
        assert_eq!(int(json!("4")), Ok(Num::Int(4)));
        assert_eq!(int(json!(" -4 ")), Ok(Num::Int(-4)));
        assert_eq!(int(json!("+1_000")), Ok(Num::Int(1000)));
        assert_eq!(int(json!(4.7)), Ok(Num::Int(4)));
        assert_eq!(int(json!(-4.7)), Ok(Num::Int(-4)));
        assert_eq!(int(json!(true)), Ok(Num::Int(1)));
        assert_eq!(int(json!("4.0")), Err("ValueError"));
        assert_eq!(int(json!("1__0")), Err("ValueError"));
        assert_eq!(int(json!("_1")), Err("ValueError"));
        assert_eq!(int(json!("")), Err("ValueError"));
        assert_eq!(int(json!(null)), Err("TypeError"));
        assert_eq!(int(json!([1])), Err("TypeError"));
        assert_eq!(
            int_of(&json!("four")).unwrap_err().to_string(),
            "ValueError: invalid literal for int() with base 10: 'four'"
        );
        let float = |v: Value| float_of(&v).map_err(|e| e.kind);
        assert_eq!(float(json!("4.2")), Ok(4.2));
        assert_eq!(float(json!(" 1e3 ")), Ok(1000.0));
        assert_eq!(float(json!("1_0.5")), Ok(10.5));
        assert_eq!(float(json!(".5")), Ok(0.5));
        assert_eq!(float(json!("-Infinity")), Ok(f64::NEG_INFINITY));
        assert_eq!(float(json!(3)), Ok(3.0));
        assert_eq!(float(json!("0x10")), Err("ValueError"));
        assert_eq!(float(json!(null)), Err("TypeError"));
    }

    #[test]
    fn comparisons_coerce_the_field_to_the_rules_type() {
        use CmpOp::*;
        // Inspector's own table (test_plugins_rules.py TEST_SET): field, rule value.
        let set = [
            (json!(42), json!(42)),
            (json!("42"), json!(42)),
            (json!("4.2"), json!(4.2)),
            (json!(42), json!(41)),
            (json!("42"), json!(41)),
            (json!("4.2"), json!(4.0)),
            (json!(41), json!(42)),
            (json!("41"), json!(42)),
            (json!("4.0"), json!(4.2)),
        ];
        let expect = |op: CmpOp, want: [bool; 9]| {
            for ((field, value), w) in set.iter().zip(want) {
                assert_eq!(compare(op, field, value), Ok(w), "{field} {op:?} {value}");
            }
        };
        let (t, f) = (true, false);
        expect(Eq, [t, t, t, f, f, f, f, f, f]);
        expect(Ne, [f, f, f, t, t, t, t, t, t]);
        expect(Gt, [f, f, f, t, t, t, f, f, f]);
        expect(Ge, [t, t, t, t, t, t, f, f, f]);
        expect(Le, [t, t, t, f, f, f, t, t, t]);
        expect(Lt, [f, f, f, f, f, f, t, t, t]);
        // A string rule value coerces nothing: 4 == "4" is False, "4" == 4 is True.
        assert_eq!(compare(Eq, &json!(4), &json!("4")), Ok(false));
        assert_eq!(compare(Ne, &json!(4), &json!("4")), Ok(true));
        assert_eq!(compare(Eq, &json!("4"), &json!(4)), Ok(true));
        // bool is an int: int(True) == True; int("true") raises.
        assert_eq!(compare(Eq, &json!(true), &json!(true)), Ok(true));
        assert_eq!(compare(Eq, &json!(1), &json!(true)), Ok(true));
        assert_eq!(
            compare(Eq, &json!("true"), &json!(true)).unwrap_err().kind,
            "ValueError"
        );
        // Ordering across types is a TypeError, lists compare element by element.
        assert_eq!(
            compare(Lt, &json!(4), &json!("5")).unwrap_err().to_string(),
            "TypeError: '<' not supported between instances of 'int' and 'str'"
        );
        assert_eq!(compare(Lt, &json!("abc"), &json!("abd")), Ok(true));
        assert_eq!(compare(Lt, &json!([1, 2]), &json!([1, 3])), Ok(true));
        assert_eq!(compare(Le, &json!([1, 2]), &json!([1, 2, 0])), Ok(true));
        assert_eq!(
            compare(Eq, &json!({"a": [1]}), &json!({"a": [1.0]})),
            Ok(true)
        );
        assert_eq!(compare(Eq, &json!(null), &json!("x")), Ok(false));
        assert_eq!(
            compare(Lt, &json!(null), &json!("x")).unwrap_err().kind,
            "TypeError"
        );
        assert_eq!(
            compare(Gt, &json!({}), &json!({})).unwrap_err().kind,
            "TypeError"
        );
        assert_eq!(
            compare(Eq, &json!(null), &json!(1)).unwrap_err().kind,
            "TypeError"
        );
        assert_eq!(compare(Lt, &json!("nan"), &json!(1.0)), Ok(false));
    }

    #[test]
    fn str_format_as_python() {
        let data = json!({
            "inventory": {"bmc_address": "192.0.2.1", "cpu": {"count": 4}},
            "none": null, "flag": false, "pi": 3.14159, "n": 1234567, "neg": -42,
            "list": ["a", {"b": null}], "name": "node", "m": {"k": 1}, "a}b": 1, "a:b": 2
        });
        let cases = [
            ("ipmi://{data[inventory][bmc_address]}", "ipmi://192.0.2.1"),
            ("{data[inventory][cpu][count]}cpu", "4cpu"),
            ("{data[none]}", "None"),
            ("{data[flag]}", "False"),
            ("{data[list]}", "['a', {'b': None}]"),
            ("{data[m]}", "{'k': 1}"),
            ("{data[list][0]}", "a"),
            ("{data[name][1]}", "o"),
            ("{{literal}} {data[name]!r}", "{literal} 'node'"),
            (
                "{data[name]:>8}|{data[name]:*^8}|{data[name]:.2}",
                "    node|**node**|no",
            ),
            (
                "{data[n]:,}|{data[n]:_x}|{data[neg]:+06}|{data[n]:#x}",
                "1,234,567|12_d687|-00042|0x12d687",
            ),
            (
                "{data[pi]:.2f}|{data[pi]:e}|{data[pi]:g}|{data[pi]:.3}",
                "3.14|3.141590e+00|3.14159|3.14",
            ),
            (
                "{data[n]:.2e}|{data[pi]:%}|{data[pi]:10.1f}",
                "1.23e+06|314.159000%|       3.1",
            ),
            ("{data[flag]:d}|{data[flag]:>6}", "0|     0"),
            ("{data[name]:{data[inventory][cpu][count]}}", "node"),
            ("{data[pi]!s:>6.4}", "  3.14"),
            ("{data[a}b]}", "1"),
            ("{data[a:b]}", "2"),
        ];
        for (t, want) in cases {
            assert_eq!(format(t, &data).as_deref(), Ok(want), "{t}");
        }
        let errors = [
            ("{data[nope]}", "KeyError: 'nope'"),
            ("{node[x]}", "KeyError: 'node'"),
            ("{data[m][0]}", "KeyError: 0"),
            (
                "{}",
                "IndexError: Replacement index 0 out of range for positional args tuple",
            ),
            (
                "{0}",
                "IndexError: Replacement index 0 out of range for positional args tuple",
            ),
            ("{data[list][5]}", "IndexError: list index out of range"),
            (
                "{data[list][x]}",
                "TypeError: list indices must be integers or slices, not str",
            ),
            (
                "{data[none][x]}",
                "TypeError: 'NoneType' object is not subscriptable",
            ),
            (
                "{data.keys}",
                "AttributeError: 'dict' object has no attribute 'keys'",
            ),
            ("x}", "ValueError: Single '}' encountered in format string"),
            ("{data", "ValueError: expected '}' before end of string"),
            ("{data[x}", "ValueError: expected '}' before end of string"),
            (
                "{data[name]!z}",
                "ValueError: Unknown conversion specifier z",
            ),
            (
                "{data[name]:+}",
                "ValueError: Sign not allowed in string format specifier",
            ),
            (
                "{data[m]:>5}",
                "TypeError: unsupported format string passed to dict.__format__",
            ),
            (
                "{data[n]:.2}",
                "ValueError: Precision not allowed in integer format specifier",
            ),
            (
                "{data[name]:abc}",
                "ValueError: Invalid format specifier 'abc' for object of type 'str'",
            ),
        ];
        for (t, want) in errors {
            assert_eq!(format(t, &data).unwrap_err().to_string(), want, "{t}");
        }
    }

    #[test]
    fn deep_formatting_covers_keys_and_nested_values() {
        // Inspector's test_apply_data_format_value_dict/list/primitives.
        let data = json!({"val_outer": {"val_inner": 17}, "key_outer": {"key_inner": "baz"},
                          "outer": {"inner": false}});
        assert_eq!(
            format_deep(
                &json!({"{data[key_outer][key_inner]}": "{data[val_outer][val_inner]}"}),
                &data
            ),
            Ok(json!({"baz": "17"}))
        );
        assert_eq!(
            format_deep(&json!(["basic", ["{data[key_outer][key_inner]}"]]), &data),
            Ok(json!(["basic", ["baz"]]))
        );
        assert_eq!(
            format_deep(
                &json!({"42": {"true": [3.14, "foo", "{data[outer][inner]}"]}}),
                &data
            ),
            Ok(json!({"42": {"true": [3.14, "foo", "False"]}}))
        );
        assert_eq!(format_deep(&json!(1), &data), Ok(json!(1)));
    }
}
