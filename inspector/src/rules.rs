//! Introspection rules: Inspector's conditions/actions DSL, with Inspector's semantics.
//!
//! A rule is `{uuid?, description?, scope?, conditions: [...], actions: [≥1]}`. A condition is
//! `{op, field, multiple?: any|all|first, invert?: bool, value?}` with `op` one of
//! `eq lt gt le ge ne in-net matches contains is-empty`, and `field` a JSONPath
//! ([`crate::jsonpath`], jsonpath_rw's) over the processed data (`data://`, the default) or
//! the node as Ironic's API shows it (`node://`). Actions are `fail`, `set-attribute`,
//! `extend-attribute`, `set-capability`, `add-trait`, `remove-trait` (and Inspector's no-op
//! `example`); the `value` of the three attribute actions is formatted as Python's
//! `str.format(data=…)` would, through lists and dicts. Paddock adds `set-image`
//! (`{"action": "set-image", "image": NAME}`): the introspection records the image
//! ([`crate::node::Introspection::set_image`]) and, once it has finished, the appliance
//! provisions the node with it in the same boot (the inspector knows nothing of
//! provisioning; `appliance/src/provisioning.rs` reads the field).
//!
//! What this follows, from Inspector's sources:
//! - `rules.py` `create`/`_validate_conditions`/`_validate_actions` and `main.py`
//!   `api_rules`: what is refused at creation and with which message;
//! - `plugins/base.py` `WithValidation`: a parameter an operator or action does not take is
//!   refused, a required one must be given and not `null`;
//! - `rules.py` `check_conditions`: a field that finds nothing skips the rule (but for
//!   `is-empty`, which sees `None`); `invert` applies to each value, then `multiple` decides;
//! - `plugins/rules.py`: `coerce` (the field to the type of the rule's value), `matches`
//!   (`re.match` with `$` appended), `contains` (`re.search`), `in-net` (netaddr), the
//!   actions as node PATCHes ([`crate::patch`]), capabilities as `key:value,…` in order;
//! - `rules.py` `apply`: every rule's scope and conditions are checked before any action
//!   runs; actions then run rule by rule, and a failing one leaves the changes made before it
//!   (Ironic has them already), as does `fail`.
//!
//! Where Inspector would crash (500, "Unexpected exception … during processing"), processing
//! fails with the same text and Paddock answers 400.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::jsonpath;
use crate::node::{Node, Secrets, update_capabilities};
use crate::patch::{self, PatchError};
use crate::py::{self, CmpOp, PyError, repr, str_of, str_repr, truthy};

/// A rule as stored and returned by the API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub uuid: Uuid,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    pub conditions: Vec<Value>,
    pub actions: Vec<Value>,
    /// Unix seconds. Rules apply in creation order (the store's), which callers keep.
    #[serde(default)]
    pub created_at: i64,
}

/// Condition operators, in Inspector's `setup.cfg` order (its messages list them so).
const CONDITIONS: [&str; 10] = [
    "eq", "lt", "gt", "le", "ge", "ne", "in-net", "matches", "contains", "is-empty",
];
/// Actions, likewise (`example` is Inspector's logging no-op, installed by default).
const ACTIONS: [&str; 8] = [
    "example",
    "fail",
    "set-attribute",
    "set-capability",
    "extend-attribute",
    "add-trait",
    "remove-trait",
    // Paddock's own: provision the node with this image once the introspection finishes.
    "set-image",
];
/// Condition keys that are not the operator's parameters.
const RESERVED: [&str; 4] = ["op", "field", "multiple", "invert"];

fn list_repr(items: &[&str]) -> String {
    let shown: Vec<String> = items.iter().map(|i| str_repr(i)).collect();
    format!("[{}]", shown.join(", "))
}

/// A condition's or an action's parameters: its keys but `reserved` (`op`, `field`, … or
/// `action`).
fn params_of(item: &Value, reserved: &[&str]) -> Map<String, Value> {
    item.as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !reserved.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `WithValidation.validate`: required parameters given (and not `null`), no others.
fn check_params(
    params: &Map<String, Value>,
    required: &[&str],
    optional: &[&str],
) -> Result<(), InvalidParameters> {
    let passed: Vec<&str> = params
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, _)| k.as_str())
        .collect();
    let mut missing: Vec<&str> = required
        .iter()
        .filter(|r| !passed.contains(r))
        .copied()
        .collect();
    let mut unexpected: Vec<&str> = passed
        .iter()
        .filter(|p| !required.contains(p) && !optional.contains(p))
        .copied()
        .collect();
    missing.sort_unstable();
    unexpected.sort_unstable();
    if missing.is_empty() && unexpected.is_empty() {
        Ok(())
    } else {
        Err(InvalidParameters::Names {
            missing: missing.into_iter().map(String::from).collect(),
            unexpected: unexpected.into_iter().map(String::from).collect(),
        })
    }
}

/// Why a rule is refused at creation (`POST /v1/rules`, 400), in Inspector's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRule {
    #[error("A rule must be a JSON object")]
    NotObject,
    #[error("Invalid UUID value")]
    Uuid,
    #[error("Invalid scope: the scope must be a string")]
    ScopeNotString,
    #[error("Invalid scope: the length of the scope should be within 255 characters")]
    ScopeTooLong,
    #[error("Invalid description: the description must be a string")]
    Description,
    /// The JSON schema of `conditions` or `actions` (`part`) refuses it.
    #[error("Validation failed for {part}: {message}")]
    Schema { part: &'static str, message: String },
    #[error("Unsupported scheme for field: {0}, valid values are node:// or data://")]
    Scheme(String),
    #[error(transparent)]
    Field(#[from] jsonpath::FieldError),
    /// An operator's or action's (`kind`) own check of its parameters.
    #[error("Invalid parameters for {kind} {name}: {error}")]
    Parameters {
        kind: &'static str,
        name: String,
        error: InvalidParameters,
    },
}

/// Why an operator or an action refuses its parameters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidParameters {
    #[error("{}", names_message(missing, unexpected))]
    Names {
        missing: Vec<String>,
        unexpected: Vec<String>,
    },
    #[error("invalid value: invalid IPNetwork {0}")]
    Network(String),
    /// Not a string (its Python repr).
    #[error("invalid value: {0} is not a network (a string such as 192.0.2.0/24)")]
    NotNetwork(String),
    #[error("invalid regular expression: {0}")]
    Regex(RegexError),
    /// Not a string (its Python repr).
    #[error("invalid regular expression: {0} is not a string")]
    RegexNotString(String),
    /// `set-image`'s image is not a string, or not a valid image name.
    #[error("invalid image: {0}")]
    Image(String),
}

fn names_message(missing: &[String], unexpected: &[String]) -> String {
    let mut msg = Vec::new();
    if !missing.is_empty() {
        msg.push(format!(
            "missing required parameter(s): {}",
            missing.join(", ")
        ));
    }
    if !unexpected.is_empty() {
        msg.push(format!(
            "unexpected parameter(s): {}",
            unexpected.join(", ")
        ));
    }
    msg.join("; ")
}

/// `value` missing (or null).
fn missing_value() -> InvalidParameters {
    InvalidParameters::Names {
        missing: vec!["value".into()],
        unexpected: Vec::new(),
    }
}

/// A regular expression Rust's engine does not compile (the engine's message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RegexError(String);

/// Why applying rules fails the processing, as Inspector records it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleFailure {
    /// A `fail` action's message.
    #[error("{0}")]
    Fail(String),
    /// A Python exception escaping a condition or an action.
    #[error("Unexpected exception {} during processing: {}", .0.kind, .0.message)]
    Unexpected(PyError),
    /// Ironic refusing the node PATCH an action makes.
    #[error("Unexpected exception BadRequestException during processing: {0}")]
    Refused(PatchError),
    /// A trait name Ironic refuses (its Python repr).
    #[error(
        "Unexpected exception BadRequestException during processing: Invalid trait {0}: a trait is upper case letters, digits and '_' (CUSTOM_… or a standard trait), at most 255 characters"
    )]
    InvalidTrait(String),
    /// A value formatting variable the data does not have (`_format_value`).
    #[error("Invalid formatting variable key provided in value {value}: {key}")]
    FormatKey { value: String, key: String },
}

/// A regular expression as Python's `re` reads it, for Rust's engine: `$` outside a class
/// also matches before a final newline, `\Z` is the very end, `[` in a class is literal.
/// Rust's engine has no look-around or back-references: such patterns do not compile.
fn py_regex(pattern: &str, anchored: bool) -> Result<regex::Regex, RegexError> {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('Z') if !in_class => out.push_str(r"\z"),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            },
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str(r"\]");
                    chars.next();
                }
            }
            '[' => out.push_str(r"\["),
            '&' | '~' if in_class && chars.peek() == Some(&c) => {
                out.push('\\');
                out.push(c);
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            '$' if !in_class => out.push_str(r"(?:\n?\z)"),
            c => out.push(c),
        }
    }
    let full = if anchored {
        format!(r"\A(?:{out})")
    } else {
        out
    };
    regex::Regex::new(&full).map_err(|e| {
        let text = e.to_string();
        let last = text.lines().last().unwrap_or_default().trim().to_string();
        RegexError(last.strip_prefix("error: ").unwrap_or(&last).to_string())
    })
}

/// netaddr's `IPNetwork(value)`: `addr/prefix`, `addr/netmask`, `addr/hostmask`, or an
/// address alone (a /32 or /128).
fn parse_network(s: &str) -> Option<IpNet> {
    let (addr, mask) = match s.split_once('/') {
        Some((a, m)) => (a, Some(m)),
        None => (s, None),
    };
    let ip: IpAddr = addr.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match mask {
        None => max,
        Some(m) if !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()) => m.parse().ok()?,
        Some(m) => {
            let bits = u32::from(m.parse::<Ipv4Addr>().ok().filter(|_| ip.is_ipv4())?);
            if bits.leading_ones() + bits.trailing_zeros() == 32 {
                u8::try_from(bits.leading_ones()).ok()?
            } else if bits.leading_zeros() + bits.trailing_ones() == 32 {
                u8::try_from(bits.leading_zeros()).ok()?
            } else {
                return None;
            }
        }
    };
    IpNet::new(ip, prefix).ok()
}

/// netaddr's `IPAddress(field)`: an address string, or an int (IPv4 below 2^32).
fn py_ip(field: &Value) -> Result<IpAddr, PyError> {
    let bad = || PyError {
        kind: "AddrFormatError",
        message: format!("failed to detect a valid IP address from {}", repr(field)),
    };
    match field {
        Value::String(s) => s.parse().map_err(|_| bad()),
        Value::Bool(_) | Value::Number(_) if !field.is_f64() => match py::int_of(field)? {
            py::Num::Int(i) if (0..1 << 32).contains(&i) => u32::try_from(i)
                .map(|v| IpAddr::V4(Ipv4Addr::from(v)))
                .map_err(|_| bad()),
            py::Num::Int(i) if i >= 0 => u128::try_from(i)
                .map(|v| IpAddr::V6(Ipv6Addr::from(v)))
                .map_err(|_| bad()),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The operator's own validation (`validate` of each plugin in `plugins/rules.py`).
fn check_condition_params(op: &str, params: &Map<String, Value>) -> Result<(), InvalidParameters> {
    match op {
        "is-empty" => check_params(params, &[], &[]),
        "in-net" => {
            check_params(params, &["value"], &[])?;
            match &params["value"] {
                Value::String(s) if parse_network(s).is_some() => Ok(()),
                Value::String(s) => Err(InvalidParameters::Network(s.clone())),
                // Inspector answers 500 (netaddr's TypeError).
                other => Err(InvalidParameters::NotNetwork(repr(other))),
            }
        }
        // ReCondition.validate only compiles the value (other parameters pass); a missing
        // or non-string value makes Inspector answer 500.
        "matches" | "contains" => match params.get("value") {
            None | Some(Value::Null) => Err(missing_value()),
            Some(Value::String(re)) => py_regex(re, false)
                .map(|_| ())
                .map_err(InvalidParameters::Regex),
            Some(other) => Err(InvalidParameters::RegexNotString(repr(other))),
        },
        _ => check_params(params, &["value"], &[]),
    }
}

fn check_action_params(action: &str, params: &Map<String, Value>) -> Result<(), InvalidParameters> {
    match action {
        "fail" => check_params(params, &["message"], &[]),
        // `value` must be there, null or not.
        "set-attribute" if !params.contains_key("value") => Err(missing_value()),
        "set-attribute" => check_params(params, &["path"], &["value", "reset_interfaces"]),
        "set-capability" => check_params(params, &["name"], &["value"]),
        "extend-attribute" => check_params(params, &["path", "value"], &["unique"]),
        "add-trait" | "remove-trait" => check_params(params, &["name"], &[]),
        "set-image" => {
            check_params(params, &["image"], &[])?;
            match &params["image"] {
                Value::String(name) => paddock_image::image::check_name(name)
                    .map_err(|e| InvalidParameters::Image(e.to_string())),
                other => Err(InvalidParameters::Image(format!(
                    "{} is not an image name (a string such as debian/bookworm.1)",
                    repr(other)
                ))),
            }
        }
        _ => check_params(params, &[], &[]),
    }
}

/// A schema error in `part` of a rule (`conditions` or `actions`), as Inspector words it.
fn schema_error(part: &'static str) -> impl Fn(String) -> InvalidRule {
    move |message| InvalidRule::Schema { part, message }
}

/// `value` as the list `part` of a rule must be.
fn schema_list<'a>(part: &'static str, value: &'a Value) -> Result<&'a Vec<Value>, InvalidRule> {
    value
        .as_array()
        .ok_or_else(|| schema_error(part)(format!("{} is not of type 'array'", repr(value))))
}

fn conditions_schema(conditions: &Value) -> Result<&Vec<Value>, InvalidRule> {
    let fail = schema_error("conditions");
    let list = schema_list("conditions", conditions)?;
    for c in list {
        let m = c
            .as_object()
            .ok_or_else(|| fail(format!("{} is not of type 'object'", repr(c))))?;
        for required in ["op", "field"] {
            if !m.contains_key(required) {
                return Err(fail(format!(
                    "{} is a required property",
                    str_repr(required)
                )));
            }
        }
        if !m["op"].as_str().is_some_and(|op| CONDITIONS.contains(&op)) {
            return Err(fail(format!(
                "{} is not one of {}",
                repr(&m["op"]),
                list_repr(&CONDITIONS)
            )));
        }
        if !m["field"].is_string() {
            return Err(fail(format!(
                "{} is not of type 'string'",
                repr(&m["field"])
            )));
        }
        if let Some(x) = m.get("multiple")
            && !matches!(x.as_str(), Some("all" | "any" | "first"))
        {
            return Err(fail(format!(
                "{} is not one of ['all', 'any', 'first']",
                repr(x)
            )));
        }
        if let Some(x) = m.get("invert")
            && !x.is_boolean()
        {
            return Err(fail(format!("{} is not of type 'boolean'", repr(x))));
        }
    }
    Ok(list)
}

fn validate_conditions(conditions: &Value) -> Result<(), InvalidRule> {
    for c in conditions_schema(conditions)? {
        let field = c["field"].as_str().unwrap_or_default();
        let (scheme, path) = jsonpath::split_scheme(field);
        if scheme != "node" && scheme != "data" {
            return Err(InvalidRule::Scheme(scheme.to_string()));
        }
        jsonpath::parse(path).map_err(|e| jsonpath::parse_error(field, e))?;
        let op = c["op"].as_str().unwrap_or_default();
        let params = params_of(c, &RESERVED);
        check_condition_params(op, &params).map_err(|error| InvalidRule::Parameters {
            kind: "operator",
            name: op.to_string(),
            error,
        })?;
    }
    Ok(())
}

fn validate_actions(actions: &Value) -> Result<(), InvalidRule> {
    let fail = schema_error("actions");
    let list = schema_list("actions", actions)?;
    if list.is_empty() {
        return Err(fail("[] is too short".into()));
    }
    for a in list {
        let m = a
            .as_object()
            .ok_or_else(|| fail(format!("{} is not of type 'object'", repr(a))))?;
        let action = m
            .get("action")
            .ok_or_else(|| fail("'action' is a required property".into()))?;
        if !action.as_str().is_some_and(|x| ACTIONS.contains(&x)) {
            return Err(fail(format!(
                "{} is not one of {}",
                repr(action),
                list_repr(&ACTIONS)
            )));
        }
    }
    for a in list {
        let action = a["action"].as_str().unwrap_or_default();
        let params = params_of(a, &["action"]);
        check_action_params(action, &params).map_err(|error| InvalidRule::Parameters {
            kind: "action",
            name: action.to_string(),
            error,
        })?;
    }
    Ok(())
}

/// Checks a rule as `POST /v1/rules` does (Inspector's `main.py` `api_rules`, then
/// `rules.create`); the API refuses an invalid rule with this text (400).
pub fn validate(rule: &Value) -> Result<(), InvalidRule> {
    let obj = rule.as_object().ok_or(InvalidRule::NotObject)?;
    if let Some(u) = obj.get("uuid").filter(|u| truthy(u))
        && u.as_str().is_none_or(|s| Uuid::parse_str(s).is_err())
    {
        return Err(InvalidRule::Uuid);
    }
    if let Some(s) = obj.get("scope").filter(|s| truthy(s)) {
        let s = s.as_str().ok_or(InvalidRule::ScopeNotString)?;
        if s.chars().count() > 255 {
            return Err(InvalidRule::ScopeTooLong);
        }
    }
    if obj
        .get("description")
        .is_some_and(|d| !d.is_null() && !d.is_string())
    {
        return Err(InvalidRule::Description);
    }
    let empty = json!([]);
    validate_conditions(obj.get("conditions").unwrap_or(&empty))?;
    validate_actions(obj.get("actions").unwrap_or(&empty))
}

/// What Inspector records when a Python exception escapes processing.
pub fn unexpected(e: &PyError) -> RuleFailure {
    RuleFailure::Unexpected(e.clone())
}

/// One condition's check of one value (the plugins' `check`).
fn check(op: &str, field: &Value, c: &Value) -> Result<bool, PyError> {
    let value = c.get("value").unwrap_or(&Value::Null);
    if let Some(cmp) = CmpOp::parse(op) {
        return py::compare(cmp, field, value);
    }
    match op {
        "is-empty" => Ok(match field {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        }),
        "in-net" => {
            let net = value.as_str().and_then(parse_network).ok_or_else(|| {
                PyError::value_error(format!("invalid IPNetwork {}", str_of(value)))
            })?;
            Ok(net.contains(&py_ip(field)?))
        }
        "matches" | "contains" => {
            let re = value.as_str().unwrap_or_default();
            let pattern = if op == "matches" {
                match re.chars().last() {
                    None => return Err(PyError::index_error("string index out of range")),
                    Some('$') => Cow::Borrowed(re),
                    Some(_) => Cow::Owned(format!("{re}$")),
                }
            } else {
                Cow::Borrowed(re)
            };
            let compiled = py_regex(&pattern, op == "matches").map_err(|e| PyError {
                kind: "error",
                message: e.to_string(),
            })?;
            Ok(compiled.is_match(&str_of(field)))
        }
        other => Err(PyError::value_error(format!("unknown operator {other}"))),
    }
}

/// `IntrospectionRule.check_conditions`.
fn conditions_hold(rule: &Rule, data: &Value, node: &Value) -> Result<bool, PyError> {
    for c in &rule.conditions {
        let field = c["field"].as_str().unwrap_or_default();
        let (scheme, path) = jsonpath::split_scheme(field);
        let source = if scheme == "node" { node } else { data };
        let parsed = jsonpath::parse(path).map_err(|e| PyError {
            kind: "JsonPathParserError",
            message: e.to_string(),
        })?;
        let op = c["op"].as_str().unwrap_or_default();
        let mut values = jsonpath::find(&parsed, source)?;
        if values.is_empty() {
            // A missing field: only is-empty looks at it (as None); the rule is skipped.
            if op != "is-empty" {
                return Ok(false);
            }
            values.push(Cow::Owned(Value::Null));
        }
        let invert = c.get("invert").and_then(Value::as_bool).unwrap_or(false);
        let multiple = c.get("multiple").and_then(Value::as_str).unwrap_or("any");
        let mut result = false;
        for v in &values {
            result = check(op, v, c)? != invert;
            if multiple == "first"
                || (multiple == "all" && !result)
                || (multiple == "any" && result)
            {
                break;
            }
        }
        if !result {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A node PATCH refused by Ironic, as Inspector records it.
fn refused(e: PatchError) -> RuleFailure {
    RuleFailure::Refused(e)
}

/// `node_info.patch`: a path without its leading slash gets one.
fn add_op(path: &str, value: Value) -> Value {
    let path = if path.is_empty() || path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    json!([{"op": "add", "path": path, "value": value}])
}

fn run_patch(node: &mut Node, ops: &Value, reset: bool) -> Result<(), RuleFailure> {
    let ident = node.uuid.to_string();
    let opts = patch::Options {
        ident: &ident,
        reset_interfaces: reset.then_some(true),
    };
    *node = patch::patch(node, ops, &opts).map_err(refused)?;
    Ok(())
}

fn path_param(params: &Map<String, Value>) -> Result<&str, RuleFailure> {
    match params.get("path") {
        Some(Value::String(p)) => Ok(p),
        other => Err(unexpected(&PyError::attribute_error(format!(
            "'{}' object has no attribute 'strip'",
            py::type_name(other.unwrap_or(&Value::Null))
        )))),
    }
}

/// `ExtendAttributeAction` through `NodeInfo.replace_field`: the list at `path` (one level
/// below an attribute at most, as `get_by_path` reads it) with `value` appended.
fn extend(node: &mut Node, params: &Map<String, Value>) -> Result<(), RuleFailure> {
    let path = path_param(params)?;
    let value = params.get("value").cloned().unwrap_or(Value::Null);
    let unique = params.get("unique").is_some_and(truthy);
    let view = node.view(Secrets::Masked);
    let stripped = path.trim_matches('/');
    let found: Option<Value> = match stripped.split_once('/') {
        Some((attr, key)) => match view.get(attr) {
            None => None,
            Some(Value::Object(m)) => m.get(key).cloned(),
            Some(other) => {
                let e = match other {
                    Value::Array(_) => {
                        PyError::type_error("list indices must be integers or slices, not str")
                    }
                    Value::String(_) => {
                        PyError::type_error("string indices must be integers, not 'str'")
                    }
                    _ => PyError::type_error(format!(
                        "'{}' object is not subscriptable",
                        py::type_name(other)
                    )),
                };
                return Err(unexpected(&e));
            }
        },
        None => view.get(stripped).cloned(),
    };
    let (op, mut list) = match found {
        None => ("add", Vec::new()),
        Some(Value::Array(a)) => ("replace", a),
        Some(other) => {
            return Err(unexpected(&PyError::attribute_error(format!(
                "'{}' object has no attribute 'append'",
                py::type_name(&other)
            ))));
        }
    };
    let before = list.clone();
    let present = list
        .iter()
        .any(|x| py::compare(CmpOp::Eq, x, &value).unwrap_or(false));
    if !unique || !present {
        list.push(value);
    }
    if list == before {
        return Ok(());
    }
    let mut ops = add_op(path, Value::Array(list));
    ops[0]["op"] = json!(op);
    run_patch(node, &ops, false)
}

/// `SetCapabilityAction` through `NodeInfo.update_capabilities`: the capability replaced
/// where it is (or added last); a `null` value removes it.
fn set_capability(node: &mut Node, params: &Map<String, Value>) -> Result<(), RuleFailure> {
    let name = str_of(params.get("name").unwrap_or(&Value::Null));
    let value = params.get("value").filter(|v| !v.is_null()).map(str_of);
    let caps = update_capabilities(node.properties.get("capabilities"), &[(name, value)])
        .map_err(|e| unexpected(&e))?;
    run_patch(
        node,
        &add_op("/properties/capabilities", json!(caps)),
        false,
    )
}

/// Ironic's trait names: upper case letters, digits and `_`, at most 255 characters
/// (`CUSTOM_…` or one of os-traits' standard names).
fn valid_trait(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Runs one action (its plugin's `apply`, after formatting its `value`).
fn run_action(a: &Value, data: &Value, node: &mut Node) -> Result<(), RuleFailure> {
    let action = a["action"].as_str().unwrap_or_default();
    let mut params = params_of(a, &["action"]);
    if matches!(
        action,
        "set-attribute" | "set-capability" | "extend-attribute"
    ) && let Some(v) = params.get("value")
    {
        let formatted = py::format_deep(v, data).map_err(|e| match e.kind {
            // The one error Inspector reports itself (`_format_value`).
            "KeyError" => RuleFailure::FormatKey {
                value: failing_string(v, data),
                key: e.message,
            },
            _ => unexpected(&e),
        })?;
        params.insert("value".into(), formatted);
    }
    match action {
        "fail" => Err(RuleFailure::Fail(str_of(
            params.get("message").unwrap_or(&Value::Null),
        ))),
        "set-attribute" => {
            let path = path_param(&params)?;
            // `reset_interfaces` is implied for /driver unless the rule says false.
            let reset = path.trim_matches('/') == "driver"
                && params.get("reset_interfaces").is_none_or(truthy);
            let value = params.get("value").cloned().unwrap_or(Value::Null);
            run_patch(node, &add_op(path, value), reset)
        }
        "extend-attribute" => extend(node, &params),
        "set-capability" => set_capability(node, &params),
        "add-trait" | "remove-trait" => {
            let name = match params.get("name") {
                Some(Value::String(n)) => n.clone(),
                other => str_of(other.unwrap_or(&Value::Null)),
            };
            if action == "remove-trait" {
                node.traits.retain(|t| *t != name);
                return Ok(());
            }
            if !valid_trait(&name) {
                return Err(RuleFailure::InvalidTrait(str_repr(&name)));
            }
            if !node.traits.contains(&name) {
                node.traits.push(name);
            }
            Ok(())
        }
        "set-image" => {
            // Checked at creation (a string and a valid image name); rules run only on a
            // node under introspection, which has its record.
            if let (Some(Value::String(image)), Some(intro)) =
                (params.get("image"), node.introspection.as_mut())
            {
                intro.set_image = Some(image.clone());
            }
            Ok(())
        }
        _ => Ok(()), // example: Inspector only logs it
    }
}

/// The string of a rule's value whose formatting fails (what Inspector's message quotes).
fn failing_string(v: &Value, data: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .find(|x| py::format_deep(x, data).is_err())
            .map(|x| failing_string(x, data))
            .unwrap_or_default(),
        Value::Object(m) => m
            .iter()
            .find_map(|(k, x)| {
                if py::format(k, data).is_err() {
                    Some(k.clone())
                } else if py::format_deep(x, data).is_err() {
                    Some(failing_string(x, data))
                } else {
                    None
                }
            })
            .unwrap_or_default(),
        other => str_of(other),
    }
}

/// What applying the rules did to a node.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The node after every action that ran: all of the matching rules' unless one failed,
    /// and then those before it (Inspector keeps them: Ironic has them already).
    pub node: Node,
    /// The rules whose scope and conditions held (descriptions, or UUIDs).
    pub matched: Vec<String>,
    /// Why processing fails: a `fail` action's message, or what Inspector would report for
    /// an action or a condition it could not carry out.
    pub failure: Option<RuleFailure>,
}

impl Applied {
    /// The failure as Inspector records it.
    pub fn failure_message(&self) -> Option<String> {
        self.failure.as_ref().map(RuleFailure::to_string)
    }
}

/// `rules.apply`: checks every rule's scope and conditions against the node as it is, then
/// runs the actions of every matching rule, rule by rule, in the order given (creation
/// order).
pub fn apply(rules: &[Rule], data: &Value, node: &Node) -> Applied {
    let view = node.view(Secrets::Masked);
    let scope = node.properties.get("inspection_scope");
    let mut matching = Vec::new();
    let mut failure = None;
    for r in rules {
        let in_scope = match r.scope.as_deref() {
            None | Some("") => true,
            Some(s) => scope == Some(&Value::String(s.to_string())),
        };
        if !in_scope {
            continue;
        }
        match conditions_hold(r, data, &view) {
            Ok(true) => matching.push(r),
            Ok(false) => {}
            Err(e) => {
                failure = Some(unexpected(&e));
                break;
            }
        }
    }
    let matched = matching
        .iter()
        .map(|r| {
            r.description
                .clone()
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| r.uuid.to_string())
        })
        .collect();
    let mut node = node.clone();
    if failure.is_none() {
        'rules: for r in matching {
            for a in &r.actions {
                if let Err(e) = run_action(a, data, &mut node) {
                    failure = Some(e);
                    break 'rules;
                }
            }
        }
    }
    Applied {
        node,
        matched,
        failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Value {
        json!({
            "inventory": {
                "cpu": {"count": 4, "architecture": "x86_64"},
                "memory": {"physical_mb": 2048},
                "bmc_address": "198.18.9.7",
                "interfaces": [
                    {"name": "eth0", "mac_address": "52:54:00:00:00:01", "ipv4_address": "198.18.0.100"},
                    {"name": "eth1", "mac_address": "52:54:00:00:00:02"},
                    {"name": "lo", "ipv4_address": "127.0.0.1"}
                ],
                "system_vendor": {"manufacturer": "QEMU"}
            },
            "interfaces": {"eth0": {"ip": "198.18.0.100", "mac": "52:54:00:00:00:01", "pxe": true}},
            "memory_mb": 2048,
            "cpus": "4",
            "bmc": null,
            "extra": []
        })
    }

    /// Why applying `rule` alone to `node` failed, if it did.
    fn failure_of(rule: Rule, node: &Node) -> Option<String> {
        apply(&[rule], &data(), node).failure_message()
    }

    fn rule(conditions: Value, actions: Value) -> Rule {
        Rule {
            uuid: Uuid::from_u128(1),
            description: Some("r".into()),
            scope: None,
            conditions: conditions.as_array().unwrap().clone(),
            actions: actions.as_array().unwrap().clone(),
            created_at: 0,
        }
    }

    /// Whether one condition holds, or the processing error it causes.
    fn holds(c: Value) -> Result<bool, String> {
        validate(
            &json!({"conditions": [c.clone()], "actions": [{"action": "fail", "message": "x"}]}),
        )
        .unwrap();
        let node = Node::new(Uuid::nil(), 0);
        let a = apply(
            &[rule(
                json!([c]),
                json!([{"action": "fail", "message": "m"}]),
            )],
            &data(),
            &node,
        );
        match a.failure_message().as_deref() {
            Some("m") => Ok(true),
            None => Ok(false),
            Some(other) => Err(other.to_string()),
        }
    }

    #[test]
    fn conditions_follow_inspector() {
        let cases = [
            (json!({"op": "eq", "field": "memory_mb", "value": 2048}), Ok(true)),
            (json!({"op": "eq", "field": "$.memory_mb", "value": "2048"}), Ok(false)),
            (json!({"op": "eq", "field": "cpus", "value": 4}), Ok(true)),
            (json!({"op": "ge", "field": "data://inventory.cpu.count", "value": 4}), Ok(true)),
            (json!({"op": "gt", "field": "inventory.cpu.count", "value": 4}), Ok(false)),
            (json!({"op": "ne", "field": "inventory.cpu.architecture", "value": "aarch64"}), Ok(true)),
            (json!({"op": "in-net", "field": "inventory.bmc_address", "value": "198.18.9.0/24"}), Ok(true)),
            (json!({"op": "in-net", "field": "inventory.bmc_address", "value": "198.18.9.0/255.255.255.0"}), Ok(true)),
            (json!({"op": "in-net", "field": "inventory.bmc_address", "value": "10.0.0.0/8"}), Ok(false)),
            (json!({"op": "matches", "field": "inventory.system_vendor.manufacturer", "value": "QEM"}), Ok(false)),
            (json!({"op": "matches", "field": "inventory.system_vendor.manufacturer", "value": "QEM."}), Ok(true)),
            (json!({"op": "matches", "field": "inventory.system_vendor.manufacturer", "value": "Q|x"}), Ok(true)),
            (json!({"op": "contains", "field": "inventory.system_vendor.manufacturer", "value": "EM"}), Ok(true)),
            (json!({"op": "is-empty", "field": "extra"}), Ok(true)),
            (json!({"op": "is-empty", "field": "no.such.field"}), Ok(true)),
            // A missing field skips the rule, invert or not.
            (json!({"op": "eq", "field": "no.such.field", "value": 1}), Ok(false)),
            (json!({"op": "eq", "field": "no.such.field", "value": 1, "invert": true}), Ok(false)),
            // invert applies to each value, then multiple decides.
            (json!({"op": "contains", "field": "inventory.interfaces[*].ipv4_address", "value": "127\\.0\\.0\\.1", "invert": true, "multiple": "all"}), Ok(false)),
            (json!({"op": "contains", "field": "inventory.interfaces[*].ipv4_address", "value": "127\\.0\\.0\\.1", "invert": true, "multiple": "any"}), Ok(true)),
            (json!({"op": "eq", "field": "inventory.interfaces[*].ipv4_address", "value": "198.18.0.100", "multiple": "all"}), Ok(false)),
            // first: the first interface that has the key.
            (json!({"op": "eq", "field": "inventory.interfaces[*].ipv4_address", "value": "198.18.0.100", "multiple": "first"}), Ok(true)),
            (json!({"op": "eq", "field": "inventory.interfaces[*].name", "value": "lo", "multiple": "first"}), Ok(false)),
            // interfaces is a dict keyed by name.
            (json!({"op": "eq", "field": "interfaces.eth0.ip", "value": "198.18.0.100"}), Ok(true)),
            (json!({"op": "eq", "field": "interfaces[*].ip", "value": "198.18.0.100"}), Ok(false)),
            (json!({"op": "is-empty", "field": "node://properties.cpus"}), Ok(true)),
            // What Inspector crashes on fails processing with its text.
            (json!({"op": "in-net", "field": "bmc", "value": "10.0.0.0/8"}), Err("Unexpected exception AddrFormatError during processing: failed to detect a valid IP address from None".to_string())),
            (json!({"op": "lt", "field": "inventory.cpu.architecture", "value": 4}), Err("Unexpected exception ValueError during processing: invalid literal for int() with base 10: 'x86_64'".to_string())),
            (json!({"op": "matches", "field": "memory_mb", "value": ""}), Err("Unexpected exception IndexError during processing: string index out of range".to_string())),
        ];
        for (c, want) in cases {
            assert_eq!(holds(c.clone()), want, "{c}");
        }
    }

    #[test]
    fn actions_format_only_values_and_keep_going_in_order() {
        let mut node = Node::new(Uuid::nil(), 0);
        node.properties
            .insert("capabilities".into(), json!("boot_mode:bios,cpu_vt:true"));
        let r = rule(
            json!([{"op": "ge", "field": "memory_mb", "value": 1024}]),
            json!([
                {"action": "set-attribute", "path": "/extra/bmc", "value": "ipmi://{data[inventory][bmc_address]}"},
                {"action": "set-attribute", "path": "name", "value": "node-{data[inventory][cpu][count]}cpu"},
                {"action": "set-attribute", "path": "/extra/none", "value": "{data[bmc]}"},
                {"action": "set-attribute", "path": "/extra/keys", "value": {"{data[cpus]}": ["{data[bmc]}"]}},
                {"action": "extend-attribute", "path": "/extra/tags", "value": "big", "unique": true},
                {"action": "extend-attribute", "path": "/extra/tags", "value": "big", "unique": true},
                {"action": "set-capability", "name": "cpu_vt", "value": "false"},
                {"action": "set-capability", "name": "profile", "value": "compute"},
                {"action": "set-capability", "name": "boot_mode"},
                {"action": "add-trait", "name": "CUSTOM_BIG"},
                {"action": "add-trait", "name": "CUSTOM_BIG"},
                {"action": "fail", "message": "stop {data[memory_mb]}"},
                {"action": "add-trait", "name": "CUSTOM_NEVER"},
            ]),
        );
        let a = apply(&[r], &data(), &node);
        assert_eq!(a.matched, ["r"]);
        // `fail`'s message is not formatted (FailAction has no FORMATTED_PARAMS).
        assert_eq!(
            a.failure_message().as_deref(),
            Some("stop {data[memory_mb]}")
        );
        let n = a.node;
        assert_eq!(n.extra["bmc"], "ipmi://198.18.9.7");
        assert_eq!(n.name.as_deref(), Some("node-4cpu"));
        assert_eq!(n.extra["none"], "None");
        // Keys are formatted too.
        assert_eq!(n.extra["keys"], json!({"4": ["None"]}));
        assert_eq!(n.extra["tags"], json!(["big"]));
        assert_eq!(n.properties["capabilities"], "cpu_vt:false,profile:compute");
        assert_eq!(n.traits, ["CUSTOM_BIG"]);
    }

    #[test]
    fn scope_and_failures() {
        let mut node = Node::new(Uuid::nil(), 0);
        let fail = rule(json!([]), json!([{"action": "fail", "message": "no"}]));
        let mut scoped = fail.clone();
        scoped.scope = Some("gpu".into());
        assert_eq!(
            apply(std::slice::from_ref(&scoped), &data(), &node).failure,
            None
        );
        node.properties
            .insert("inspection_scope".into(), json!("gpu"));
        assert_eq!(failure_of(scoped, &node).as_deref(), Some("no"));
        let mut global = fail.clone();
        global.scope = Some(String::new());
        assert_eq!(failure_of(global, &node).as_deref(), Some("no"));
        let bad_ref = rule(
            json!([]),
            json!([{"action": "set-attribute", "path": "/extra/x", "value": ["ok", "{data[nope]}"]}]),
        );
        assert_eq!(
            failure_of(bad_ref, &node).as_deref(),
            Some("Invalid formatting variable key provided in value {data[nope]}: 'nope'")
        );
        let bad_path = rule(
            json!([]),
            json!([{"action": "set-attribute", "path": "/extra/a/b", "value": 1}]),
        );
        assert_eq!(
            failure_of(bad_path, &node).as_deref(),
            Some(
                "Unexpected exception BadRequestException during processing: Couldn't apply patch '{'op': 'add', 'path': '/extra/a/b', 'value': 1}'. Reason: member 'a' not found in {}"
            )
        );
        let bad_name = rule(
            json!([]),
            json!([{"action": "set-attribute", "path": "/name", "value": "not a name"}]),
        );
        assert!(
            failure_of(bad_name, &node)
                .unwrap()
                .contains("Cannot change name to invalid name 'not a name'")
        );
    }

    #[test]
    fn invalid_rules_are_refused_with_inspectors_messages() {
        let ok = json!([{"action": "fail", "message": "m"}]);
        let cases = [
            (
                json!({"conditions": [], "actions": []}),
                "Validation failed for actions: [] is too short",
            ),
            (
                json!({"conditions": []}),
                "Validation failed for actions: [] is too short",
            ),
            (
                json!({"conditions": null, "actions": ok}),
                "Validation failed for conditions: None is not of type 'array'",
            ),
            (
                json!({"actions": [{"action": "explode"}]}),
                "Validation failed for actions: 'explode' is not one of ['example', 'fail'",
            ),
            (
                json!({"actions": [{"message": "m"}]}),
                "Validation failed for actions: 'action' is a required property",
            ),
            (
                json!({"conditions": [{"field": "a", "value": 1}], "actions": ok}),
                "Validation failed for conditions: 'op' is a required property",
            ),
            (
                json!({"conditions": [{"op": "approx", "field": "a", "value": 1}], "actions": ok}),
                "Validation failed for conditions: 'approx' is not one of ['eq', 'lt'",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "a", "value": 1, "multiple": "some"}], "actions": ok}),
                "Validation failed for conditions: 'some' is not one of ['all', 'any', 'first']",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "a", "value": 1, "invert": "yes"}], "actions": ok}),
                "Validation failed for conditions: 'yes' is not of type 'boolean'",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "!*!", "value": 1}], "actions": ok}),
                "Unable to parse field JSON path !*!: Error on line 1, col 0: Unexpected character: !",
            ),
            (
                json!({"conditions": [{"op": "is-empty", "field": "node://driver_info/ipmi_password"}], "actions": ok}),
                "Unable to parse field JSON path node://driver_info/ipmi_password: Error on line 1, col 11: Unexpected character: /",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "ftp://a", "value": 1}], "actions": ok}),
                "Unsupported scheme for field: ftp, valid values are node:// or data://",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "a", "value": 1, "foo": 2}], "actions": ok}),
                "Invalid parameters for operator eq: unexpected parameter(s): foo",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "a"}], "actions": ok}),
                "Invalid parameters for operator eq: missing required parameter(s): value",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "a", "value": null, "x": 1}], "actions": ok}),
                "Invalid parameters for operator eq: missing required parameter(s): value; unexpected parameter(s): x",
            ),
            (
                json!({"conditions": [{"op": "is-empty", "field": "a", "value": ""}], "actions": ok}),
                "Invalid parameters for operator is-empty: unexpected parameter(s): value",
            ),
            (
                json!({"conditions": [{"op": "in-net", "field": "a", "value": "x"}], "actions": ok}),
                "Invalid parameters for operator in-net: invalid value: invalid IPNetwork x",
            ),
            (
                json!({"conditions": [{"op": "matches", "field": "a", "value": "**"}], "actions": ok}),
                "Invalid parameters for operator matches: invalid regular expression",
            ),
            (
                json!({"conditions": [{"op": "matches", "field": "a", "value": "(?=x)"}], "actions": ok}),
                "Invalid parameters for operator matches: invalid regular expression",
            ),
            (json!({"uuid": "nope", "actions": ok}), "Invalid UUID value"),
            (
                json!({"scope": "x".repeat(256), "actions": ok}),
                "Invalid scope: the length of the scope should be within 255 characters",
            ),
            (
                json!({"actions": [{"action": "set-attribute", "path": "/a"}]}),
                "Invalid parameters for action set-attribute: missing required parameter(s): value",
            ),
            (
                json!({"actions": [{"action": "fail", "message": "m", "foo": "bar"}]}),
                "Invalid parameters for action fail: unexpected parameter(s): foo",
            ),
            (
                json!({"actions": [{"action": "fail"}]}),
                "Invalid parameters for action fail: missing required parameter(s): message",
            ),
            (
                json!({"actions": [{"action": "add-trait", "name": "CUSTOM_X", "value": 42}]}),
                "Invalid parameters for action add-trait: unexpected parameter(s): value",
            ),
        ];
        for (r, want) in cases {
            let e = validate(&r).unwrap_err().to_string();
            assert!(e.starts_with(want), "{r}: {e}");
        }
        // What Inspector accepts.
        for r in [
            json!({"actions": [{"action": "set-attribute", "path": "/properties/cpus", "value": null}]}),
            json!({"conditions": [{"op": "matches", "field": "a", "value": "x", "extra": 1}], "actions": ok}),
            json!({"conditions": [{"op": "eq", "field": "a", "value": 1, "foo": null}], "actions": ok}),
            json!({"uuid": "", "scope": "", "actions": [{"action": "example"}]}),
            json!({"actions": [{"action": "set-capability", "name": "profile"}]}),
        ] {
            assert_eq!(validate(&r), Ok(()), "{r}");
        }
    }

    /// `set-image` (Paddock's): validated at creation, recorded on the introspection.
    #[test]
    fn set_image_records_the_wish_on_the_introspection() {
        let r = |image: Value| json!({"conditions": [], "actions": [{"action": "set-image", "image": image}]});
        assert!(validate(&r(json!("debian/bookworm.1"))).is_ok());
        for (bad, why) in [
            (json!(42), "invalid image: 42 is not an image name"),
            (json!("../etc"), "invalid image: "),
            (Value::Null, "missing required parameter(s): image"),
        ] {
            let e = validate(&r(bad.clone())).unwrap_err().to_string();
            assert!(
                e.contains("action set-image") && e.contains(why),
                "{bad}: {e}"
            );
        }
        let extra =
            json!({"conditions": [], "actions": [{"action": "set-image", "image": "a", "x": 1}]});
        assert!(validate(&extra).is_err());
        let mut node = Node::new(Uuid::nil(), 0);
        node.introspection = Some(crate::node::Introspection {
            state: crate::state::State::Waiting,
            started_at: Some(1),
            finished_at: None,
            error: None,
            manage_boot: true,
            set_image: None,
        });
        let set = rule(
            json!([]),
            json!([{"action": "set-image", "image": "debian/a"}]),
        );
        let applied = apply(&[set], &data(), &node);
        assert_eq!(applied.failure, None);
        let intro = applied.node.introspection.unwrap();
        assert_eq!(intro.set_image.as_deref(), Some("debian/a"));
        // Nothing else of the node changes.
        node.introspection = Some(intro);
        assert_eq!(applied.node.properties, node.properties);
    }

    #[test]
    fn python_regex_dollar() {
        let re = py_regex("ab$", true).unwrap();
        assert!(re.is_match("ab") && re.is_match("ab\n") && !re.is_match("ab\nx"));
        let re = py_regex(r"[]$]x\Z", false).unwrap();
        assert!(re.is_match("$x") && re.is_match("]x") && !re.is_match("$x\n"));
        assert!(py_regex(r"(a)\1", false).is_err(), "no back-references");
    }
}
