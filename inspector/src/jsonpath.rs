//! JSONPath as Inspector reads a rule's `field`: the grammar and the semantics of
//! `jsonpath_rw`, the Python library `ironic_inspector/rules.py` parses and evaluates fields
//! with.
//!
//! Grammar (`jsonpath_rw/parser.py`): fields (`a`, `'a b'`, `a,b`, `*`), `$` (root), `` `this` ``,
//! `` `parent` ``, `[n]`, `[*]`, `[start:end]`, `['key']`, `(…)`, and the binary operators
//! `..` (descendants), `.` (child), `|` (union), `&` (intersection), `where` — lowest to
//! highest precedence, all left-associative; a bracket after a path applies to all of it
//! (`a..b[0]` is `(a..b)[0]`). A path
//! that does not parse (`driver_info/ipmi_password`, `.memory_mb`, `a.0`) is refused at rule
//! creation with the library's message.
//!
//! Semantics (`jsonpath_rw/jsonpath.py`) that rules depend on:
//! - a field matches only in a dict: `[*].ip` over a dict of interfaces finds nothing,
//!   `*.ip` finds every interface's `ip`;
//! - `[*]` over a dict, a string or an int wraps it in a one-element list (so yields it);
//! - `[n]` yields nothing on an empty or false value, indexes lists and strings (negative
//!   indices count from the end);
//! - what Python would raise (`[0]` on a non-empty dict, `[*]` on `null`, `&`) is an error
//!   ([`PyError`]), which Paddock reports instead of answering 500 as Inspector does.

use std::borrow::Cow;
use std::rc::Rc;

use serde_json::Value;

use crate::py::{PyError, truthy, type_name};

/// A parsed JSONPath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Path {
    Root,
    This,
    Parent,
    /// Field names; `*` among them means every key.
    Fields(Vec<String>),
    Index(i64),
    Slice(Option<i64>, Option<i64>),
    Child(Box<Path>, Box<Path>),
    Descendants(Box<Path>, Box<Path>),
    Where(Box<Path>, Box<Path>),
    Union(Box<Path>, Box<Path>),
    Intersect(Box<Path>, Box<Path>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    DoubleDot,
    Number(i64),
    Id(String),
    Named(String),
    Where,
    Lit(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
    col: usize,
}

impl Token {
    /// `near token VALUE (TYPE)`, as jsonpath_rw's parse errors say it.
    fn describe(&self) -> JsonPathError {
        let (value, kind) = match &self.tok {
            Tok::DoubleDot => ("..".to_string(), "DOUBLEDOT".to_string()),
            Tok::Number(n) => (n.to_string(), "NUMBER".to_string()),
            Tok::Id(s) => (s.clone(), "ID".to_string()),
            Tok::Named(s) => (s.clone(), "NAMED_OPERATOR".to_string()),
            Tok::Where => ("where".to_string(), "WHERE".to_string()),
            Tok::Lit(c) => (c.to_string(), c.to_string()),
        };
        JsonPathError::Near {
            line: self.line,
            col: self.col,
            value,
            kind,
        }
    }
}

/// A JSONPath jsonpath_rw does not parse, with the library's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JsonPathError {
    #[error("Number {0} is too large")]
    NumberTooLarge(String),
    #[error("Unexpected EOF in string literal or identifier")]
    UnterminatedString,
    #[error("Error on line {line}, col {col}: Unexpected character: {character} ")]
    UnexpectedCharacter {
        line: usize,
        col: usize,
        character: char,
    },
    #[error("Parse error at {line}:{col} near token {value} ({kind})")]
    Near {
        line: usize,
        col: usize,
        value: String,
        kind: String,
    },
    #[error("Parse error at end of input")]
    EndOfInput,
    #[error("Unknown named operator `{op}` at {line}:{col}")]
    UnknownOperator { op: String, line: usize, col: usize },
}

fn is_id_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '@'
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '@' | '-')
}

fn lex(s: &str) -> Result<Vec<Token>, JsonPathError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut newline_at) = (0usize, 1usize, 0usize);
    while i < chars.len() {
        let c = chars[i];
        let col = i - newline_at;
        let push = |out: &mut Vec<Token>, tok| out.push(Token { tok, line, col });
        match c {
            ' ' | '\t' => i += 1,
            '\n' => {
                line += 1;
                newline_at = i;
                i += 1;
            }
            c if is_id_start(c) => {
                let from = i;
                while i < chars.len() && is_id_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[from..i].iter().collect();
                push(
                    &mut out,
                    if word == "where" {
                        Tok::Where
                    } else {
                        Tok::Id(word)
                    },
                );
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let from = i;
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
                let text: String = chars[from..i].iter().collect();
                let n = text
                    .parse()
                    .map_err(|_| JsonPathError::NumberTooLarge(text))?;
                push(&mut out, Tok::Number(n));
            }
            '\'' | '"' | '`' => {
                let mut text = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => {
                            return Err(JsonPathError::UnterminatedString);
                        }
                        Some('\\') => match chars.get(i + 1) {
                            Some(e) if *e != '\n' => {
                                text.push(*e);
                                i += 2;
                            }
                            _ => {
                                return Err(JsonPathError::UnexpectedCharacter {
                                    line,
                                    col: i - newline_at,
                                    character: '\\',
                                });
                            }
                        },
                        Some(q) if *q == c => {
                            i += 1;
                            break;
                        }
                        Some(other) => {
                            text.push(*other);
                            i += 1;
                        }
                    }
                }
                // PLY places these tokens at their closing quote.
                let col = i - 1 - newline_at;
                out.push(Token {
                    line,
                    col,
                    tok: if c == '`' {
                        Tok::Named(text)
                    } else {
                        Tok::Id(text)
                    },
                });
            }
            '.' if chars.get(i + 1) == Some(&'.') => {
                push(&mut out, Tok::DoubleDot);
                i += 2;
            }
            '*' | '.' | '[' | ']' | '(' | ')' | '$' | ',' | ':' | '|' | '&' => {
                push(&mut out, Tok::Lit(c));
                i += 1;
            }
            other => {
                return Err(JsonPathError::UnexpectedCharacter {
                    line,
                    col,
                    character: other,
                });
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.at).map(|t| &t.tok)
    }

    fn error(&self) -> JsonPathError {
        match self.tokens.get(self.at) {
            Some(t) => t.describe(),
            None => JsonPathError::EndOfInput,
        }
    }

    fn expect(&mut self, c: char) -> Result<(), JsonPathError> {
        if self.peek() == Some(&Tok::Lit(c)) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn binary(tok: &Tok) -> Option<u8> {
        Some(match tok {
            Tok::DoubleDot => 1,
            Tok::Lit('.') => 2,
            Tok::Lit('|') => 3,
            Tok::Lit('&') => 4,
            Tok::Where => 5,
            _ => return None,
        })
    }

    fn path(&mut self, min: u8) -> Result<Path, JsonPathError> {
        let mut left = self.primary()?;
        while let Some(tok) = self.peek().cloned() {
            // PLY reduces before shifting a '[' (it has no precedence): a bracket applies to
            // the whole path to its left (`a..b[0]` is `(a..b)[0]`), outside parentheses.
            if tok == Tok::Lit('[') && min == 0 {
                self.at += 1;
                let inner = self.bracket()?;
                self.expect(']')?;
                left = Path::Child(Box::new(left), Box::new(inner));
                continue;
            }
            let Some(prec) = Self::binary(&tok).filter(|p| *p >= min) else {
                break;
            };
            self.at += 1;
            let right = Box::new(self.path(prec + 1)?);
            let left_box = Box::new(left);
            left = match prec {
                1 => Path::Descendants(left_box, right),
                2 => Path::Child(left_box, right),
                3 => Path::Union(left_box, right),
                4 => Path::Intersect(left_box, right),
                _ => Path::Where(left_box, right),
            };
        }
        Ok(left)
    }

    /// `ID (',' ID)*`, the first ID already seen.
    fn fields(&mut self, first: String) -> Result<Vec<String>, JsonPathError> {
        let mut names = vec![first];
        while self.peek() == Some(&Tok::Lit(',')) {
            self.at += 1;
            match self.peek().cloned() {
                Some(Tok::Id(name)) => {
                    self.at += 1;
                    names.push(name);
                }
                _ => return Err(self.error()),
            }
        }
        Ok(names)
    }

    fn primary(&mut self) -> Result<Path, JsonPathError> {
        let Some(tok) = self.peek().cloned() else {
            return Err(self.error());
        };
        let here = self.at;
        self.at += 1;
        match tok {
            Tok::Id(name) => Ok(Path::Fields(self.fields(name)?)),
            Tok::Lit('*') => Ok(Path::Fields(vec!["*".into()])),
            Tok::Lit('$') => Ok(Path::Root),
            Tok::Named(op) => match op.as_str() {
                "this" => Ok(Path::This),
                "parent" => Ok(Path::Parent),
                _ => {
                    let t = &self.tokens[here];
                    Err(JsonPathError::UnknownOperator {
                        op: op.clone(),
                        line: t.line,
                        col: t.col,
                    })
                }
            },
            Tok::Lit('[') => {
                let inner = self.bracket()?;
                self.expect(']')?;
                Ok(inner)
            }
            Tok::Lit('(') => {
                let inner = self.path(0)?;
                self.expect(')')?;
                Ok(inner)
            }
            _ => {
                self.at = here;
                Err(self.error())
            }
        }
    }

    /// What `[…]` holds: an index, a slice, `*`, or field names.
    fn bracket(&mut self) -> Result<Path, JsonPathError> {
        let tok = self.peek().cloned();
        let number = |p: &mut Self| match p.peek() {
            Some(Tok::Number(n)) => {
                let n = *n;
                p.at += 1;
                Some(n)
            }
            _ => None,
        };
        match tok {
            Some(Tok::Lit('*')) => {
                self.at += 1;
                Ok(Path::Slice(None, None))
            }
            Some(Tok::Id(name)) => {
                self.at += 1;
                Ok(Path::Fields(self.fields(name)?))
            }
            Some(Tok::Number(_) | Tok::Lit(':')) => {
                let start = number(self);
                if self.peek() == Some(&Tok::Lit(':')) {
                    self.at += 1;
                    let end = number(self);
                    Ok(Path::Slice(start, end))
                } else {
                    start.map(Path::Index).ok_or_else(|| self.error())
                }
            }
            _ => Err(self.error()),
        }
    }
}

/// Parses a JSONPath as jsonpath_rw does; the error is the library's message.
pub fn parse(s: &str) -> Result<Path, JsonPathError> {
    let tokens = lex(s)?;
    let mut p = Parser { tokens, at: 0 };
    let path = p.path(0)?;
    if p.at < p.tokens.len() {
        return Err(p.error());
    }
    Ok(path)
}

/// A value found, with the datum it was found in (for `parent` and `$`).
struct Datum<'a> {
    value: Cow<'a, Value>,
    context: Option<Rc<Datum<'a>>>,
}

type D<'a> = Rc<Datum<'a>>;
type Found<'a> = Result<Vec<D<'a>>, PyError>;

/// The child of `parent` that `pick` selects, borrowed from the data where the parent is.
fn sub<'a>(parent: &D<'a>, pick: impl FnOnce(&Value) -> Option<&Value>) -> Option<D<'a>> {
    let value = match &parent.value {
        Cow::Borrowed(v) => Cow::Borrowed(pick(v)?),
        Cow::Owned(v) => Cow::Owned(pick(v)?.clone()),
    };
    Some(Rc::new(Datum {
        value,
        context: Some(parent.clone()),
    }))
}

/// Python's `len()` of a JSON value, or the `TypeError` it raises.
fn py_len(v: &Value) -> Result<usize, PyError> {
    match v {
        Value::String(s) => Ok(s.chars().count()),
        Value::Array(a) => Ok(a.len()),
        Value::Object(m) => Ok(m.len()),
        other => Err(PyError::type_error(format!(
            "object of type '{}' has no len()",
            type_name(other)
        ))),
    }
}

/// A Python index (negative from the end) into a sequence of `len`.
fn py_index(i: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let at = if i < 0 { len.checked_add(i)? } else { i };
    usize::try_from(at)
        .ok()
        .filter(|a| i64::try_from(*a).is_ok_and(|a| a < len))
}

/// `range(len)[start:end]`.
fn py_slice(start: Option<i64>, end: Option<i64>, len: usize) -> std::ops::Range<usize> {
    let n = i64::try_from(len).unwrap_or(i64::MAX);
    let clamp = |x: i64| -> usize {
        let x = if x < 0 {
            x.saturating_add(n).max(0)
        } else {
            x.min(n)
        };
        usize::try_from(x).unwrap_or(0)
    };
    let from = start.map_or(0, clamp);
    let to = end.map_or(len, clamp);
    from..to.max(from)
}

fn eval<'a>(p: &Path, d: &D<'a>) -> Found<'a> {
    match p {
        Path::Root => {
            let mut top = d.clone();
            while let Some(up) = top.context.clone() {
                top = up;
            }
            Ok(vec![top])
        }
        Path::This => Ok(vec![d.clone()]),
        Path::Parent => match &d.context {
            Some(up) => Ok(vec![up.clone()]),
            None => Err(PyError::attribute_error(
                "'NoneType' object has no attribute 'value'",
            )),
        },
        Path::Fields(names) => {
            let Value::Object(m) = d.value.as_ref() else {
                return Ok(Vec::new());
            };
            let keys: Vec<&String> = if names.iter().any(|n| n == "*") {
                m.keys().collect()
            } else {
                names.iter().collect()
            };
            Ok(keys
                .into_iter()
                .filter_map(|k| sub(d, |v| v.get(k.as_str())))
                .collect())
        }
        Path::Index(i) => {
            let v = d.value.as_ref();
            if !truthy(v) {
                return Ok(Vec::new());
            }
            let len = py_len(v)?;
            if i64::try_from(len).is_ok_and(|l| l <= *i) {
                return Ok(Vec::new());
            }
            match v {
                Value::Array(_) => {
                    let at = py_index(*i, len)
                        .ok_or_else(|| PyError::index_error("list index out of range"))?;
                    Ok(sub(d, |v| v.get(at)).into_iter().collect())
                }
                Value::String(s) => {
                    let at = py_index(*i, len)
                        .ok_or_else(|| PyError::index_error("string index out of range"))?;
                    let c = s.chars().nth(at).map(String::from).unwrap_or_default();
                    Ok(vec![Rc::new(Datum {
                        value: Cow::Owned(Value::String(c)),
                        context: Some(d.clone()),
                    })])
                }
                _ => Err(PyError::key_error(i.to_string())),
            }
        }
        Path::Slice(start, end) => {
            let v = d.value.as_ref();
            let wrap = match v {
                Value::Object(_) | Value::String(_) | Value::Bool(_) => true,
                Value::Number(n) => !n.is_f64(),
                _ => false,
            };
            if wrap {
                // jsonpath_rw's "hack": a dict, string or int is a one-element list.
                let list = Rc::new(Datum {
                    value: Cow::Owned(Value::Array(vec![v.clone()])),
                    context: d.context.clone(),
                });
                return eval(p, &list);
            }
            let Value::Array(a) = v else {
                return Err(py_len(v).err().unwrap_or_else(|| {
                    PyError::type_error(format!("'{}' cannot be sliced", type_name(v)))
                }));
            };
            Ok(py_slice(*start, *end, a.len())
                .filter_map(|i| sub(d, |v| v.get(i)))
                .collect())
        }
        Path::Child(l, r) => {
            let mut out = Vec::new();
            for x in eval(l, d)? {
                out.extend(eval(r, &x)?);
            }
            Ok(out)
        }
        Path::Descendants(l, r) => {
            fn walk<'a>(r: &Path, d: &D<'a>, out: &mut Vec<D<'a>>) -> Result<(), PyError> {
                out.extend(eval(r, d)?);
                let children: Vec<D<'a>> = match d.value.as_ref() {
                    Value::Array(a) => (0..a.len()).filter_map(|i| sub(d, |v| v.get(i))).collect(),
                    Value::Object(m) => m
                        .keys()
                        .filter_map(|k| sub(d, |v| v.get(k.as_str())))
                        .collect(),
                    _ => Vec::new(),
                };
                for c in &children {
                    walk(r, c, out)?;
                }
                Ok(())
            }
            let mut out = Vec::new();
            for m in eval(l, d)? {
                walk(r, &m, &mut out)?;
            }
            Ok(out)
        }
        Path::Where(l, r) => {
            let mut out = Vec::new();
            for x in eval(l, d)? {
                if !eval(r, &x)?.is_empty() {
                    out.push(x);
                }
            }
            Ok(out)
        }
        Path::Union(l, r) => {
            let mut out = eval(l, d)?;
            out.extend(eval(r, d)?);
            Ok(out)
        }
        Path::Intersect(..) => Err(PyError {
            kind: "NotImplementedError",
            message: "the & (intersection) operator of jsonpath_rw is not implemented".into(),
        }),
    }
}

/// Every value `path` finds in `data`, in jsonpath_rw's order.
pub fn find<'a>(path: &Path, data: &'a Value) -> Result<Vec<Cow<'a, Value>>, PyError> {
    let root = Rc::new(Datum {
        value: Cow::Borrowed(data),
        context: None,
    });
    let found = eval(path, &root)?;
    drop(root);
    Ok(found
        .into_iter()
        .map(|d| match Rc::try_unwrap(d) {
            Ok(datum) => datum.value,
            Err(shared) => Cow::Owned(shared.value.as_ref().clone()),
        })
        .collect())
}

/// A field's scheme and path (`_parse_path`): `node://…`, `data://…`, or data by default.
pub fn split_scheme(field: &str) -> (&str, &str) {
    match field.find("://") {
        Some(at) => (&field[..at], &field[at + 3..]),
        None => ("data", field),
    }
}

/// The message Inspector gives for a field that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Unable to parse field JSON path {field}: {error}")]
pub struct FieldError {
    pub field: String,
    pub error: JsonPathError,
}

pub fn parse_error(field: &str, error: JsonPathError) -> FieldError {
    FieldError {
        field: field.to_string(),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn values(path: &str, data: &Value) -> Result<Vec<Value>, String> {
        let p = parse(path).map_err(|e| e.to_string())?;
        find(&p, data)
            .map(|v| v.into_iter().map(Cow::into_owned).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_as_jsonpath_rw() {
        use Path::*;
        let f = |s: &str| Box::new(Fields(vec![s.to_string()]));
        let cases = [
            ("memory_mb", Fields(vec!["memory_mb".into()])),
            ("$.memory_mb", Child(Box::new(Root), f("memory_mb"))),
            (
                "inventory.interfaces[*].ipv4_address",
                Child(
                    Box::new(Child(
                        Box::new(Child(f("inventory"), f("interfaces"))),
                        Box::new(Slice(None, None)),
                    )),
                    f("ipv4_address"),
                ),
            ),
            (
                "a.b[0]",
                Child(Box::new(Child(f("a"), f("b"))), Box::new(Index(0))),
            ),
            (
                "a..b[0]",
                Child(Box::new(Descendants(f("a"), f("b"))), Box::new(Index(0))),
            ),
            (
                "a.(b[0])",
                Child(f("a"), Box::new(Child(f("b"), Box::new(Index(0))))),
            ),
            ("a[-1]", Child(f("a"), Box::new(Index(-1)))),
            ("a[1:]", Child(f("a"), Box::new(Slice(Some(1), None)))),
            ("a[:2]", Child(f("a"), Box::new(Slice(None, Some(2))))),
            ("a,b", Fields(vec!["a".into(), "b".into()])),
            ("'a.b'", Fields(vec!["a.b".into()])),
            ("a['b c']", Child(f("a"), f("b c"))),
            ("a..b", Descendants(f("a"), f("b"))),
            (
                "a.b..c",
                Descendants(Box::new(Child(f("a"), f("b"))), f("c")),
            ),
            (
                "a..b.c",
                Descendants(f("a"), Box::new(Child(f("b"), f("c")))),
            ),
            ("a|b.c", Child(Box::new(Union(f("a"), f("b"))), f("c"))),
            ("a where b", Where(f("a"), f("b"))),
            ("`this`.a", Child(Box::new(This), f("a"))),
            (
                "(a.b)[0]",
                Child(Box::new(Child(f("a"), f("b"))), Box::new(Index(0))),
            ),
            ("node-name", Fields(vec!["node-name".into()])),
            ("*", Fields(vec!["*".into()])),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
        let bad = [
            ("driver_info/ipmi_password", "Unexpected character: /"),
            ("!*!", "Unexpected character: !"),
            (".memory_mb", "near token . (.)"),
            ("a.0", "near token 0 (NUMBER)"),
            ("a.", "end of input"),
            ("a[", "end of input"),
            ("", "end of input"),
            ("a b", "near token b (ID)"),
            ("`self`", "Unknown named operator `self` at 1:5"),
            ("'open", "Unexpected EOF"),
            ("a,*", "near token * (*)"),
            ("ünïcode", "Unexpected character: ü"),
        ];
        for (s, want) in bad {
            let e = parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn finds_as_jsonpath_rw() {
        let data = json!({
            "memory_mb": 1024,
            "interfaces": {"eth0": {"ip": "192.0.2.1"}, "eth1": {"ip": null}},
            "inventory": {"interfaces": [
                {"name": "eth0", "ipv4_address": "192.0.2.1"},
                {"name": "eth1"},
                {"name": "lo", "ipv4_address": "127.0.0.1"}
            ]},
            "name": "abc", "zero": 0, "empty": [], "none": null, "flag": true, "f": 1.5,
            "nested": {"a": {"b": 1}, "c": [{"b": 2}]}
        });
        let cases: &[(&str, Value)] = &[
            ("memory_mb", json!([1024])),
            ("$.memory_mb", json!([1024])),
            ("no.such.field", json!([])),
            // A field only matches in a dict; [*] wraps a dict, so this finds nothing.
            ("interfaces[*].ip", json!([])),
            ("interfaces.*.ip", json!(["192.0.2.1", null])),
            ("interfaces.eth0.ip", json!(["192.0.2.1"])),
            // Elements without the key are skipped: `first` takes the first that has it.
            (
                "inventory.interfaces[*].ipv4_address",
                json!(["192.0.2.1", "127.0.0.1"]),
            ),
            ("inventory.interfaces[0].name", json!(["eth0"])),
            ("inventory.interfaces[-1].name", json!(["lo"])),
            ("inventory.interfaces[1:].name", json!(["eth1", "lo"])),
            ("inventory.interfaces[:-2].name", json!(["eth0"])),
            ("inventory.interfaces[7].name", json!([])),
            ("inventory.interfaces.*", json!([])),
            ("memory_mb[*]", json!([1024])),
            ("name[*]", json!(["abc"])),
            ("name[1]", json!(["b"])),
            ("zero[0]", json!([])),
            ("empty[0]", json!([])),
            ("none[0]", json!([])),
            ("nested..b", json!([1, 2])),
            ("nested.c[0].`parent`", json!([[{"b": 2}]])),
            (
                "inventory.interfaces[*] where ipv4_address",
                json!([
                    {"name": "eth0", "ipv4_address": "192.0.2.1"},
                    {"name": "lo", "ipv4_address": "127.0.0.1"}
                ]),
            ),
            ("memory_mb|name", json!([1024, "abc"])),
            ("memory_mb,name", json!([1024, "abc"])),
            ("inventory.interfaces[0].`this`.name", json!(["eth0"])),
            ("inventory.interfaces[0].$.memory_mb", json!([1024])),
        ];
        for (path, want) in cases {
            assert_eq!(
                values(path, &data),
                Ok(want.as_array().unwrap().clone()),
                "{path}"
            );
        }
        // What Python raises.
        let errors = [
            ("interfaces[0]", "KeyError: 0"),
            (
                "none[*]",
                "TypeError: object of type 'NoneType' has no len()",
            ),
            ("f[*]", "TypeError: object of type 'float' has no len()"),
            ("flag[0]", "TypeError: object of type 'bool' has no len()"),
            (
                "memory_mb[0]",
                "TypeError: object of type 'int' has no len()",
            ),
            ("a & b", "NotImplementedError"),
            ("`parent`", "AttributeError"),
        ];
        for (path, want) in errors {
            let e = values(path, &data).unwrap_err();
            assert!(e.starts_with(want), "{path}: {e}");
        }
    }

    #[test]
    fn schemes() {
        assert_eq!(
            split_scheme("node://driver_info.ipmi_address"),
            ("node", "driver_info.ipmi_address")
        );
        assert_eq!(split_scheme("data://memory_mb"), ("data", "memory_mb"));
        assert_eq!(split_scheme("memory_mb"), ("data", "memory_mb"));
        assert_eq!(split_scheme("ftp://x"), ("ftp", "x"));
    }
}
