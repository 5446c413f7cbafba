//! Introspection rules: Inspector's conditions/actions DSL.
//!
//! A rule is `{uuid?, description?, scope?, conditions: [...], actions: [≥1]}`. A condition is
//! `{op, field, multiple?: any|all|first, invert?: bool, value?}` with `op` one of
//! `eq ne lt gt le ge in-net matches contains is-empty`, and `field` a JSONPath over the
//! processed data (`data://`, the default) or the node (`node://`). Actions are `fail`,
//! `set-attribute`, `extend-attribute`, `set-capability`, `add-trait`, `remove-trait`; their
//! string values are formatted with `{data[inventory][bmc_address]}`-style references.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::node::Node;

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
    /// Unix seconds; rules apply in creation order.
    #[serde(default)]
    pub created_at: i64,
}

const OPS: &[&str] = &[
    "eq", "ne", "lt", "gt", "le", "ge", "in-net", "matches", "contains", "is-empty",
];
const ACTIONS: &[&str] = &[
    "fail",
    "set-attribute",
    "extend-attribute",
    "set-capability",
    "add-trait",
    "remove-trait",
];

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
    All,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Path {
    node: bool,
    steps: Vec<Step>,
}

fn parse_path(field: &str) -> Result<Path, String> {
    let (node, rest) = if let Some(r) = field.strip_prefix("node://") {
        (true, r)
    } else if let Some(r) = field.strip_prefix("data://") {
        (false, r)
    } else if field.contains("://") {
        return Err(format!(
            "Unsupported scheme in field {field:?}: use data:// or node://"
        ));
    } else {
        (false, field)
    };
    let rest = rest.strip_prefix('$').unwrap_or(rest);
    let mut steps = Vec::new();
    let mut chars = rest.chars().peekable();
    let bad = || format!("Unable to parse field JSON path {field:?}");
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                let mut key = String::new();
                while let Some(&c) = chars.peek() {
                    if c == '.' || c == '[' {
                        break;
                    }
                    key.push(c);
                    chars.next();
                }
                if key.is_empty() {
                    return Err(bad());
                }
                steps.push(if key == "*" {
                    Step::All
                } else {
                    Step::Key(key)
                });
            }
            '[' => {
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    inner.push(c);
                }
                let inner = inner.trim();
                steps.push(if inner == "*" {
                    Step::All
                } else if let Ok(i) = inner.parse() {
                    Step::Index(i)
                } else if let Some(k) = inner.strip_prefix('\'').and_then(|k| k.strip_suffix('\''))
                {
                    Step::Key(k.to_string())
                } else {
                    return Err(bad());
                });
            }
            c if steps.is_empty() && !c.is_whitespace() => {
                // A path without the leading "$." (Inspector adds it).
                let mut key = c.to_string();
                while let Some(&c) = chars.peek() {
                    if c == '.' || c == '[' {
                        break;
                    }
                    key.push(c);
                    chars.next();
                }
                steps.push(Step::Key(key));
            }
            _ => return Err(bad()),
        }
    }
    Ok(Path { node, steps })
}

fn select<'a>(v: &'a Value, steps: &[Step], out: &mut Vec<&'a Value>) {
    let Some((first, rest)) = steps.split_first() else {
        out.push(v);
        return;
    };
    match (first, v) {
        (Step::Key(k), Value::Object(m)) => {
            if let Some(x) = m.get(k) {
                select(x, rest, out);
            }
        }
        (Step::Index(i), Value::Array(a)) => {
            if let Some(x) = a.get(*i) {
                select(x, rest, out);
            }
        }
        (Step::All, Value::Array(a)) => a.iter().for_each(|x| select(x, rest, out)),
        (Step::All, Value::Object(m)) => m.values().for_each(|x| select(x, rest, out)),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Compares `have` with `want`, coercing `have` to `want`'s type (as Inspector does).
fn compare(have: &Value, want: &Value) -> Option<std::cmp::Ordering> {
    match want {
        Value::Number(w) => {
            let h = match have {
                Value::Number(n) => n.as_f64()?,
                Value::String(s) => s.trim().parse().ok()?,
                Value::Bool(b) => f64::from(u8::from(*b)),
                _ => return None,
            };
            h.partial_cmp(&w.as_f64()?)
        }
        Value::String(w) => {
            let h = match have {
                Value::String(s) => s.clone(),
                Value::Null => return None,
                other => other.to_string(),
            };
            Some(h.as_str().cmp(w.as_str()))
        }
        Value::Bool(w) => {
            let h = match have {
                Value::Bool(b) => *b,
                Value::String(s) => {
                    matches!(s.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on")
                }
                Value::Number(n) => n.as_f64()? != 0.0,
                _ => return None,
            };
            Some(h.cmp(w))
        }
        other => (have == other).then_some(std::cmp::Ordering::Equal),
    }
}

/// Checks a rule's shape without applying it; the API refuses invalid rules with this text.
pub fn validate(rule: &Value) -> Result<(), String> {
    let obj = rule.as_object().ok_or("A rule must be a JSON object")?;
    if let Some(u) = obj.get("uuid").filter(|u| !u.is_null()) {
        u.as_str()
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| format!("Invalid UUID value {u}"))?;
    }
    if let Some(s) = obj.get("scope").filter(|s| !s.is_null()) {
        let s = s.as_str().ok_or("scope must be a string")?;
        if s.len() > 255 {
            return Err("scope is longer than 255 characters".into());
        }
    }
    let actions = obj
        .get("actions")
        .and_then(Value::as_array)
        .ok_or("Validation failed for actions: a non-empty list is required")?;
    if actions.is_empty() {
        return Err("Validation failed for actions: at least one action is required".into());
    }
    let conditions = match obj.get("conditions") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(c)) => c,
        Some(_) => return Err("Validation failed for conditions: must be a list".into()),
    };
    for c in conditions {
        let op = c
            .get("op")
            .and_then(Value::as_str)
            .ok_or("Validation failed for conditions: op is required")?;
        if !OPS.contains(&op) {
            return Err(format!("Unsupported condition type {op:?}"));
        }
        let field = c
            .get("field")
            .and_then(Value::as_str)
            .ok_or("Validation failed for conditions: field is required")?;
        parse_path(field)?;
        if let Some(m) = c.get("multiple")
            && !matches!(m.as_str(), Some("any" | "all" | "first"))
        {
            return Err(format!(
                "Validation failed for conditions: multiple must be any, all or first, got {m}"
            ));
        }
        if op != "is-empty" && c.get("value").is_none() {
            return Err(format!(
                "Validation failed for conditions: {op} requires a value"
            ));
        }
        if op == "in-net" {
            c["value"]
                .as_str()
                .and_then(|s| s.parse::<IpNet>().ok())
                .ok_or("in-net requires a CIDR value")?;
        }
        if op == "matches" || op == "contains" {
            let re = c["value"]
                .as_str()
                .ok_or("matches/contains require a string regex value")?;
            regex::Regex::new(re).map_err(|e| format!("Invalid regular expression {re:?}: {e}"))?;
        }
    }
    for a in actions {
        let action = a
            .get("action")
            .and_then(Value::as_str)
            .ok_or("Validation failed for actions: action is required")?;
        if !ACTIONS.contains(&action) {
            return Err(format!("Unsupported action type {action:?}"));
        }
        let need: &[&str] = match action {
            "fail" => &["message"],
            "set-attribute" | "extend-attribute" => &["path", "value"],
            "set-capability" => &["name"],
            _ => &["name"],
        };
        for k in need {
            if a.get(*k).is_none() {
                return Err(format!(
                    "Validation failed for actions: {action} requires {k}"
                ));
            }
        }
    }
    Ok(())
}

fn condition_holds(c: &Value, data: &Value, node: &Value) -> bool {
    let op = c["op"].as_str().unwrap_or_default();
    let Ok(path) = parse_path(c["field"].as_str().unwrap_or_default()) else {
        return false;
    };
    let mut found = Vec::new();
    select(if path.node { node } else { data }, &path.steps, &mut found);
    let want = c.get("value").unwrap_or(&Value::Null);
    let test = |have: &Value| -> bool {
        use std::cmp::Ordering::*;
        match op {
            "eq" => compare(have, want) == Some(Equal),
            "ne" => compare(have, want).is_some_and(|o| o != Equal),
            "lt" => compare(have, want) == Some(Less),
            "gt" => compare(have, want) == Some(Greater),
            "le" => matches!(compare(have, want), Some(Less | Equal)),
            "ge" => matches!(compare(have, want), Some(Greater | Equal)),
            "in-net" => {
                let net = want.as_str().and_then(|s| s.parse::<IpNet>().ok());
                let ip = have.as_str().and_then(|s| s.parse::<IpAddr>().ok());
                matches!((net, ip), (Some(n), Some(i)) if n.contains(&i))
            }
            "matches" | "contains" => {
                let Some(re) = want.as_str() else {
                    return false;
                };
                let re = if op == "matches" {
                    format!("^(?:{re})$")
                } else {
                    re.to_string()
                };
                let text = match have {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                regex::Regex::new(&re).is_ok_and(|r| r.is_match(&text))
            }
            "is-empty" => is_empty(have),
            _ => false,
        }
    };
    let result = if found.is_empty() {
        // A missing field makes the rule not apply, except for is-empty.
        op == "is-empty"
    } else {
        match c.get("multiple").and_then(Value::as_str).unwrap_or("any") {
            "all" => found.iter().all(|v| test(v)),
            "first" => test(found[0]),
            _ => found.iter().any(|v| test(v)),
        }
    };
    result != c.get("invert").and_then(Value::as_bool).unwrap_or(false)
}

/// Python-style `{data[a][b]}` / `{node[x]}` references in action values.
fn format_value(v: &Value, data: &Value, node: &Value) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => Value::String(format_str(s, data, node)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| format_value(x, data, node))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), format_value(x, data, node)?)))
                .collect::<Result<Map<_, _>, String>>()?,
        ),
        other => other.clone(),
    })
}

fn format_str(s: &str, data: &Value, node: &Value) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('{') {
            out.push('{');
            rest = stripped;
            continue;
        }
        let end = after
            .find('}')
            .ok_or_else(|| format!("Unbalanced braces in {s:?}"))?;
        let expr = &after[..end];
        let (root, keys) = match expr.split_once('[') {
            Some((r, k)) => (r, format!("[{k}")),
            None => (expr, String::new()),
        };
        let mut cur = match root {
            "data" => data,
            "node" => node,
            other => {
                return Err(format!(
                    "Unknown name {other:?} in {s:?}: use data[...] or node[...]"
                ));
            }
        };
        for key in keys.split('[').filter(|k| !k.is_empty()) {
            let key = key
                .strip_suffix(']')
                .ok_or_else(|| format!("Bad reference {expr:?}"))?;
            cur = match cur {
                Value::Object(m) => m.get(key),
                Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(|| format!("Invalid formatting variable {key:?} in {s:?}"))?;
        }
        match cur {
            Value::String(x) => out.push_str(x),
            other => out.push_str(&other.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest.replace("}}", "}").as_str());
    Ok(out)
}

/// JSON-patch `add` on the node's JSON form at a `/a/b` path.
fn patch_add(
    node: &mut Value,
    path: &str,
    value: Value,
    extend: Option<bool>,
) -> Result<(), String> {
    let parts: Vec<&str> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let (last, parents) = parts
        .split_last()
        .ok_or_else(|| format!("Invalid attribute path {path:?}"))?;
    let mut cur = node;
    for p in parents {
        let obj = cur
            .as_object_mut()
            .ok_or_else(|| format!("{path:?} goes through a non-object"))?;
        cur = obj.entry(p.to_string()).or_insert_with(|| json!({}));
    }
    let obj = cur
        .as_object_mut()
        .ok_or_else(|| format!("{path:?} goes through a non-object"))?;
    match extend {
        None => {
            obj.insert(last.to_string(), value);
        }
        Some(unique) => {
            let list = obj.entry(last.to_string()).or_insert_with(|| json!([]));
            let arr = list
                .as_array_mut()
                .ok_or_else(|| format!("{path:?} is not a list"))?;
            if !(unique && arr.contains(&value)) {
                arr.push(value);
            }
        }
    }
    Ok(())
}

/// The outcome of applying every matching rule to a node.
#[derive(Debug, PartialEq)]
pub enum Applied {
    /// The node after the actions ran, and the descriptions of the rules that matched.
    Node(Box<Node>, Vec<String>),
    /// A `fail` action ran.
    Failed(String),
}

/// Checks every rule (in scope) first, then runs the actions of every matching rule, in
/// creation order.
pub fn apply(rules: &[Rule], data: &Value, node: &Node) -> Result<Applied, String> {
    let scope = node
        .properties
        .get("inspection_scope")
        .and_then(Value::as_str);
    let mut node_json = serde_json::to_value(node).map_err(|e| e.to_string())?;
    let mut sorted: Vec<&Rule> = rules.iter().collect();
    sorted.sort_by_key(|r| (r.created_at, r.uuid));
    let matching: Vec<&Rule> = sorted
        .into_iter()
        .filter(|r| r.scope.is_none() || r.scope.as_deref() == scope)
        .filter(|r| {
            r.conditions
                .iter()
                .all(|c| condition_holds(c, data, &node_json))
        })
        .collect();
    let mut names = Vec::new();
    for r in &matching {
        names.push(r.description.clone().unwrap_or_else(|| r.uuid.to_string()));
        for a in &r.actions {
            let a = format_value(a, data, &node_json)?;
            match a["action"].as_str().unwrap_or_default() {
                "fail" => {
                    return Ok(Applied::Failed(
                        a["message"]
                            .as_str()
                            .unwrap_or("failed by rule")
                            .to_string(),
                    ));
                }
                "set-attribute" => patch_add(
                    &mut node_json,
                    a["path"].as_str().unwrap_or_default(),
                    a["value"].clone(),
                    None,
                )?,
                "extend-attribute" => {
                    let unique = a.get("unique").and_then(Value::as_bool).unwrap_or(false);
                    patch_add(
                        &mut node_json,
                        a["path"].as_str().unwrap_or_default(),
                        a["value"].clone(),
                        Some(unique),
                    )?
                }
                "set-capability" => {
                    let name = a["name"].as_str().unwrap_or_default();
                    let value = match &a["value"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    let props = node_json["properties"]
                        .as_object_mut()
                        .ok_or("node has no properties")?;
                    let caps = props
                        .get("capabilities")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let mut list: Vec<String> = caps
                        .split(',')
                        .filter(|c| !c.is_empty() && c.split(':').next() != Some(name))
                        .map(String::from)
                        .collect();
                    list.push(format!("{name}:{value}"));
                    props.insert("capabilities".into(), json!(list.join(",")));
                }
                "add-trait" | "remove-trait" => {
                    let name = a["name"].as_str().unwrap_or_default().to_string();
                    let traits = node_json["traits"]
                        .as_array_mut()
                        .ok_or("node has no traits list")?;
                    traits.retain(|t| t.as_str() != Some(&name));
                    if a["action"] == "add-trait" {
                        traits.push(json!(name));
                    }
                }
                other => return Err(format!("Unsupported action type {other:?}")),
            }
        }
    }
    let changed: Node = serde_json::from_value(node_json)
        .map_err(|e| format!("Rule actions produced an invalid node: {e}"))?;
    if changed.name != node.name
        && let Some(name) = &changed.name
    {
        // Ironic refuses the PATCH, so the rule's action fails.
        crate::node::check_name(name).map_err(|e| format!("Rule set-attribute /name: {e}"))?;
    }
    Ok(Applied::Node(Box::new(changed), names))
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
                    {"name": "eth1", "mac_address": "52:54:00:00:00:02", "ipv4_address": null}
                ],
                "system_vendor": {"manufacturer": "QEMU"}
            },
            "memory_mb": 2048,
            "extra": []
        })
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

    fn holds(c: Value) -> bool {
        let node = serde_json::to_value(Node::new(Uuid::nil(), 0)).unwrap();
        validate(
            &json!({"conditions": [c.clone()], "actions": [{"action": "fail", "message": "x"}]}),
        )
        .unwrap();
        condition_holds(&c, &data(), &node)
    }

    #[test]
    fn conditions() {
        let cases = [
            (
                json!({"op": "eq", "field": "memory_mb", "value": 2048}),
                true,
            ),
            (
                json!({"op": "eq", "field": "$.memory_mb", "value": "2048"}),
                true,
            ),
            (
                json!({"op": "ge", "field": "data://inventory.cpu.count", "value": 4}),
                true,
            ),
            (
                json!({"op": "gt", "field": "inventory.cpu.count", "value": 4}),
                false,
            ),
            (
                json!({"op": "lt", "field": "inventory.cpu.count", "value": 8}),
                true,
            ),
            (
                json!({"op": "le", "field": "inventory.cpu.count", "value": 3}),
                false,
            ),
            (
                json!({"op": "ne", "field": "inventory.cpu.architecture", "value": "aarch64"}),
                true,
            ),
            (
                json!({"op": "in-net", "field": "inventory.bmc_address", "value": "198.18.9.0/24"}),
                true,
            ),
            (
                json!({"op": "in-net", "field": "inventory.bmc_address", "value": "10.0.0.0/8"}),
                false,
            ),
            (
                json!({"op": "matches", "field": "inventory.system_vendor.manufacturer", "value": "QEM"}),
                false,
            ),
            (
                json!({"op": "matches", "field": "inventory.system_vendor.manufacturer", "value": "QEM."}),
                true,
            ),
            (
                json!({"op": "contains", "field": "inventory.system_vendor.manufacturer", "value": "EM"}),
                true,
            ),
            (json!({"op": "is-empty", "field": "extra"}), true),
            (json!({"op": "is-empty", "field": "no.such.field"}), true),
            (
                json!({"op": "eq", "field": "no.such.field", "value": 1}),
                false,
            ),
            (
                json!({"op": "eq", "field": "inventory.interfaces[*].ipv4_address", "value": "198.18.0.100"}),
                true,
            ),
            (
                json!({"op": "eq", "field": "inventory.interfaces[*].ipv4_address", "value": "198.18.0.100", "multiple": "all"}),
                false,
            ),
            (
                json!({"op": "is-empty", "field": "inventory.interfaces[1].ipv4_address", "multiple": "first"}),
                true,
            ),
            (
                json!({"op": "eq", "field": "inventory.cpu.count", "value": 4, "invert": true}),
                false,
            ),
            (
                json!({"op": "eq", "field": "node://properties.cpus", "value": 4}),
                false,
            ),
        ];
        for (c, want) in cases {
            assert_eq!(holds(c.clone()), want, "{c}");
        }
    }

    #[test]
    fn actions_run_in_order_with_formatting() {
        let mut node = Node::new(Uuid::nil(), 0);
        node.properties
            .insert("capabilities".into(), json!("boot_mode:bios,cpu_vt:true"));
        let r = rule(
            json!([{"op": "ge", "field": "memory_mb", "value": 1024}]),
            json!([
                {"action": "set-attribute", "path": "/extra/bmc", "value": "ipmi://{data[inventory][bmc_address]}"},
                {"action": "set-attribute", "path": "/name", "value": "node-{data[inventory][cpu][count]}cpu"},
                {"action": "extend-attribute", "path": "/extra/tags", "value": "big", "unique": true},
                {"action": "extend-attribute", "path": "/extra/tags", "value": "big", "unique": true},
                {"action": "set-capability", "name": "cpu_vt", "value": "false"},
                {"action": "add-trait", "name": "CUSTOM_BIG"},
            ]),
        );
        let Applied::Node(n, names) = apply(&[r], &data(), &node).unwrap() else {
            panic!()
        };
        assert_eq!(names, ["r"]);
        assert_eq!(n.extra["bmc"], "ipmi://198.18.9.7");
        assert_eq!(n.name.as_deref(), Some("node-4cpu"));
        assert_eq!(n.extra["tags"], json!(["big"]));
        assert_eq!(n.properties["capabilities"], "boot_mode:bios,cpu_vt:false");
        assert_eq!(n.traits, ["CUSTOM_BIG"]);
    }

    #[test]
    fn fail_scope_and_non_matching() {
        let node = Node::new(Uuid::nil(), 0);
        let fail = rule(
            json!([]),
            json!([{"action": "fail", "message": "too small: {data[memory_mb]}"}]),
        );
        assert_eq!(
            apply(std::slice::from_ref(&fail), &data(), &node).unwrap(),
            Applied::Failed("too small: 2048".into())
        );
        let mut scoped = fail.clone();
        scoped.scope = Some("gpu".into());
        assert!(
            matches!(apply(&[scoped], &data(), &node).unwrap(), Applied::Node(_, names) if names.is_empty())
        );
        let miss = rule(
            json!([{"op": "eq", "field": "memory_mb", "value": 1}]),
            json!([{"action": "fail", "message": "x"}]),
        );
        assert!(matches!(
            apply(&[miss], &data(), &node).unwrap(),
            Applied::Node(..)
        ));
        let bad_ref = rule(
            json!([]),
            json!([{"action": "set-attribute", "path": "/extra/x", "value": "{data[nope]}"}]),
        );
        assert!(
            apply(&[bad_ref], &data(), &node)
                .unwrap_err()
                .contains("Invalid formatting variable")
        );
    }

    #[test]
    fn invalid_rules_are_explained() {
        let cases = [
            (
                json!({"conditions": [], "actions": []}),
                "at least one action",
            ),
            (
                json!({"actions": [{"action": "explode"}]}),
                "Unsupported action type",
            ),
            (
                json!({"conditions": [{"op": "approx", "field": "a", "value": 1}], "actions": [{"action": "fail", "message": "m"}]}),
                "Unsupported condition type",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "a[", "value": 1}], "actions": [{"action": "fail", "message": "m"}]}),
                "Unable to parse field",
            ),
            (
                json!({"conditions": [{"op": "in-net", "field": "a", "value": "x"}], "actions": [{"action": "fail", "message": "m"}]}),
                "CIDR",
            ),
            (
                json!({"uuid": "nope", "actions": [{"action": "fail", "message": "m"}]}),
                "Invalid UUID",
            ),
            (
                json!({"actions": [{"action": "set-attribute", "path": "/a"}]}),
                "requires value",
            ),
            (
                json!({"conditions": [{"op": "eq", "field": "ftp://a", "value": 1}], "actions": [{"action": "fail", "message": "m"}]}),
                "Unsupported scheme",
            ),
        ];
        for (r, want) in cases {
            let e = validate(&r).unwrap_err();
            assert!(e.contains(want), "{r}: {e}");
        }
    }
}
