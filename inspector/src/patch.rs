//! JSON patch on a node, with Ironic's semantics and messages: `PATCH /api/v1/nodes/{node}`
//! and the rules' `set-attribute`, `extend-attribute` and `set-capability` (Inspector sends
//! those to Ironic as node PATCHes, so they succeed and fail as a PATCH does).
//!
//! Followed: Ironic's `api/controllers/v1/node.py` (`patch`, `_validate_patch`,
//! `PATCH_ALLOWED_FIELDS`, `node_schema`), `api/controllers/v1/utils.py` (`apply_jsonpatch`,
//! `patch_validate_allowed_fields`), `common/args.py` (the `patch` schema), and
//! python-json-patch / python-json-pointer for what one operation does and says when it
//! cannot. A patch is all or nothing: the node changes only when every operation applied and
//! the result is a valid node.

use std::sync::LazyLock;

use paddock_inventory::MacAddr;
use serde_json::{Map, Value};

use crate::node::{Bmc, IRONIC_FIELDS, Kind, Node, Secrets, check_name};
use crate::py::{repr, str_repr};

/// A patch Ironic would refuse (400), with Ironic's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The request does not follow Ironic's patch schema.
    #[error("Schema error for patch: {0}")]
    Schema(String),
    /// One operation python-json-patch could not apply (`op` is its Python repr).
    #[error("Couldn't apply patch '{op}'. Reason: {reason}")]
    Operation { op: String, reason: OperationError },
    /// Any other refusal of Ironic's (attribute not patchable, bad value, name taken …).
    #[error("{0}")]
    Refused(String),
}

/// Why python-json-patch could not apply one operation (its messages, word for word).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OperationError {
    #[error("The operation does not contain a 'value' member")]
    NoValue,
    #[error("Location must start with /")]
    NotAbsolute,
    #[error("member '{part}' not found in {document}")]
    NoMember { part: String, document: String },
    #[error("index '{0}' is out of bounds")]
    OutOfBounds(String),
    #[error("'{0}' is not a valid sequence index")]
    NotAnIndex(String),
    #[error(
        "Document '{0}' does not support indexing, must be mapping/sequence or support __getitem__"
    )]
    NotIndexable(String),
    #[error("can't insert outside of list")]
    InsertOutside,
    #[error("can't replace a non-existent object '{0}'")]
    ReplaceMissing(String),
    #[error("'path' with '-' can't be applied to 'replace' operation")]
    ReplaceEnd,
    #[error("can't replace outside of list")]
    ReplaceOutside,
    #[error("can't remove a non-existent object '{0}'")]
    RemoveMissing(String),
    #[error("invalid array index '{0}'")]
    InvalidIndex(String),
    #[error("unable to fully resolve json pointer {path}, part {part}")]
    Unresolvable { path: String, part: String },
}

/// Node attributes of Paddock's own a patch may change.
const PADDOCK_FIELDS: &[&str] = &["bmc_address", "macs", "pxe_mac"];

/// Attributes Ironic lets a PATCH change that Paddock has nothing to keep them in.
const UNSTORABLE: &[(&str, &str)] = &[
    ("chassis_uuid", "Paddock has no chassis"),
    ("instance_uuid", "Paddock has no instances"),
    ("network_data", "Paddock keeps no network data for nodes"),
    ("parent_node", "Paddock has no parent nodes"),
];

/// Every attribute a patch may change, in the order the refusal lists them.
fn allowed() -> Vec<&'static str> {
    let mut all: Vec<&str> = ["driver", "driver_info", "extra", "name", "properties"]
        .into_iter()
        .chain(IRONIC_FIELDS.iter().map(|(f, _)| *f))
        .chain(PADDOCK_FIELDS.iter().copied())
        .collect();
    all.sort_unstable();
    all
}

/// How to apply a patch.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options<'a> {
    /// The node as the request named it, for messages.
    pub ident: &'a str,
    /// Ironic's `reset_interfaces`: with a new `driver`, forget the `*_interface`s.
    pub reset_interfaces: Option<bool>,
}

fn schema_error(message: String) -> PatchError {
    PatchError::Schema(message)
}

static PATH: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^(/[\w-]+)+$").expect("a valid pattern"));

/// Ironic's `args.patch` schema: a list of `{op: add|replace|remove, path, value?}`.
fn check_shape(ops: &Value) -> Result<Vec<&Map<String, Value>>, PatchError> {
    let list = ops
        .as_array()
        .ok_or_else(|| schema_error(format!("{} is not of type 'array'", repr(ops))))?;
    let mut out = Vec::with_capacity(list.len());
    for op in list {
        let m = op
            .as_object()
            .ok_or_else(|| schema_error(format!("{} is not of type 'object'", repr(op))))?;
        if let Some(k) = m
            .keys()
            .find(|k| !matches!(k.as_str(), "op" | "path" | "value"))
        {
            return Err(schema_error(format!(
                "Additional properties are not allowed ({} was unexpected)",
                str_repr(k)
            )));
        }
        for required in ["op", "path"] {
            if !m.contains_key(required) {
                return Err(schema_error(format!(
                    "{} is a required property",
                    str_repr(required)
                )));
            }
        }
        if !matches!(m["op"].as_str(), Some("add" | "replace" | "remove")) {
            return Err(schema_error(format!(
                "{} is not one of ['add', 'replace', 'remove']",
                repr(&m["op"])
            )));
        }
        let path = m["path"]
            .as_str()
            .ok_or_else(|| schema_error(format!("{} is not of type 'string'", repr(&m["path"]))))?;
        if !PATH.is_match(path) {
            return Err(schema_error(format!(
                "{} does not match {}",
                str_repr(path),
                str_repr(PATH.as_str())
            )));
        }
        out.push(m);
    }
    Ok(out)
}

fn path_of(op: &Map<String, Value>) -> &str {
    op["path"].as_str().unwrap_or_default()
}

/// The first segment of a path: the node attribute it changes.
fn root_of(path: &str) -> &str {
    path.split('/').nth(1).unwrap_or_default()
}

/// The values the patch gives `path` (Ironic's `get_patch_values`).
fn values_for<'a>(ops: &[&'a Map<String, Value>], path: &str) -> Vec<&'a Value> {
    ops.iter()
        .filter(|o| path_of(o) == path && o["op"] != "remove")
        .filter_map(|o| o.get("value"))
        .collect()
}

/// Ironic's checks before the patch is applied (`_validate_patch`, the name check).
fn check_request(ops: &[&Map<String, Value>], opts: &Options) -> Result<(), PatchError> {
    let allowed = allowed();
    for op in ops {
        let root = root_of(path_of(op));
        if let Some((_, why)) = UNSTORABLE.iter().find(|(f, _)| *f == root) {
            return Err(PatchError::Refused(format!(
                "Cannot patch {}: {why}",
                path_of(op)
            )));
        }
        if !allowed.contains(&root) {
            return Err(PatchError::Refused(format!(
                "Cannot patch {}. Only the following can be updated: {}",
                path_of(op),
                allowed.join(", ")
            )));
        }
    }
    if opts.reset_interfaces == Some(true) && values_for(ops, "/driver").is_empty() {
        return Err(PatchError::Refused(
            "The reset_interfaces parameter can only be used when changing the node's driver."
                .into(),
        ));
    }
    if let Some(Value::String(d)) = values_for(ops, "/description").first()
        && d.chars().count() > 4096
    {
        return Err(PatchError::Refused(
            "Cannot update node with description exceeding 4096 characters".into(),
        ));
    }
    for name in values_for(ops, "/name") {
        if let Value::String(n) = name
            && check_name(n).is_err()
        {
            return Err(PatchError::Refused(format!(
                "Node {}: Cannot change name to invalid name '{n}'",
                opts.ident
            )));
        }
    }
    Ok(())
}

/// Python's class name in python-json-pointer's messages.
fn py_class(v: &Value) -> String {
    format!("<class '{}'>", crate::py::type_name(v))
}

/// python-json-pointer's `get_part` + `walk`: one step down.
fn walk<'v>(doc: &'v mut Value, part: &str) -> Result<&'v mut Value, OperationError> {
    let shown = repr(doc);
    match doc {
        Value::Object(m) => m.get_mut(part).ok_or_else(|| OperationError::NoMember {
            part: part.to_string(),
            document: shown,
        }),
        Value::Array(a) => {
            let i = seq_index(part)?;
            a.get_mut(i)
                .ok_or_else(|| OperationError::OutOfBounds(part.to_string()))
        }
        other => Err(not_indexable(other)),
    }
}

fn not_indexable(v: &Value) -> OperationError {
    OperationError::NotIndexable(py_class(v))
}

/// A list index as JSON pointer allows it: `0` or no leading zero.
fn seq_index(part: &str) -> Result<usize, OperationError> {
    let ok = part == "0"
        || (!part.starts_with('0') && !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Err(OperationError::NotAnIndex(part.to_string()));
    }
    Ok(part.parse().unwrap_or(usize::MAX))
}

/// One operation (python-json-patch's `AddOperation`, `ReplaceOperation`,
/// `RemoveOperation`); the error is its reason.
fn apply_op(doc: &mut Value, op: &Map<String, Value>) -> Result<(), OperationError> {
    let kind = op["op"].as_str().unwrap_or_default();
    let path = path_of(op);
    let value = op.get("value");
    if kind != "remove" && value.is_none() {
        return Err(OperationError::NoValue);
    }
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let Some((last, parents)) = parts.split_last() else {
        return Err(OperationError::NotAbsolute);
    };
    let mut sub = doc;
    for p in parents {
        sub = walk(sub, p)?;
    }
    let value = value.cloned().unwrap_or(Value::Null);
    match (kind, sub) {
        ("add", Value::Object(m)) => {
            m.insert((*last).to_string(), value);
        }
        ("add", Value::Array(a)) => {
            if *last == "-" {
                a.push(value);
            } else {
                let i = seq_index(last)?;
                if i > a.len() {
                    return Err(OperationError::InsertOutside);
                }
                a.insert(i, value);
            }
        }
        ("replace", Value::Object(m)) => match m.get_mut(*last) {
            Some(slot) => *slot = value,
            None => return Err(OperationError::ReplaceMissing((*last).to_string())),
        },
        ("replace", Value::Array(a)) => {
            if *last == "-" {
                return Err(OperationError::ReplaceEnd);
            }
            let i = seq_index(last)?;
            match a.get_mut(i) {
                Some(slot) => *slot = value,
                None => return Err(OperationError::ReplaceOutside),
            }
        }
        ("remove", Value::Object(m)) => {
            if m.shift_remove(*last).is_none() {
                return Err(OperationError::RemoveMissing((*last).to_string()));
            }
        }
        ("remove", Value::Array(a)) => {
            if *last == "-" {
                return Err(OperationError::InvalidIndex((*last).to_string()));
            }
            let i = seq_index(last)?;
            if i >= a.len() {
                return Err(OperationError::RemoveMissing((*last).to_string()));
            }
            a.remove(i);
        }
        (_, Value::String(_)) if kind != "remove" => {
            return Err(OperationError::Unresolvable {
                path: path.to_string(),
                part: (*last).to_string(),
            });
        }
        (_, other) => return Err(not_indexable(other)),
    }
    Ok(())
}

/// Ironic's `bool_from_string(strict=True)` for the flag attributes.
fn flag(field: &str, v: &Value) -> Result<Value, PatchError> {
    match v {
        Value::Null | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "t" | "true" | "on" | "y" | "yes" => Ok(Value::Bool(true)),
            "0" | "f" | "false" | "off" | "n" | "no" => Ok(Value::Bool(false)),
            _ => Err(PatchError::Refused(format!(
                "Unrecognized value '{s}' for {field}, acceptable values are: '0', '1', 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'"
            ))),
        },
        other => Err(schema_error(format!(
            "{} is not of type 'string', 'boolean', 'null'",
            repr(other)
        ))),
    }
}

fn object_or_null(v: Option<&Value>) -> Result<Map<String, Value>, PatchError> {
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(schema_error(format!(
            "{} is not of type 'object', 'null'",
            repr(other)
        ))),
    }
}

fn text_or_null(v: Option<&Value>, max: usize) -> Result<Option<String>, PatchError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if max > 0 && s.chars().count() > max => {
            Err(schema_error(format!("{} is too long", str_repr(s))))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(schema_error(format!(
            "{} is not of type 'string', 'null'",
            repr(other)
        ))),
    }
}

fn mac(v: &Value, what: &str) -> Result<MacAddr, PatchError> {
    v.as_str()
        .and_then(paddock_inventory::normalise_mac)
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| PatchError::Refused(format!("Invalid MAC address {} in {what}", repr(v))))
}

/// The node a patched view describes: the patchable attributes read back from it, checked
/// as Ironic's node schema checks them; everything else as it was.
fn from_view(old: &Node, view: &Map<String, Value>) -> Result<Node, PatchError> {
    let mut node = old.clone();
    node.name = text_or_null(view.get("name"), 0)?;
    node.driver = match view.get("driver") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(other) => {
            return Err(schema_error(format!(
                "{} is not of type 'string'",
                repr(other)
            )));
        }
    };
    node.properties = object_or_null(view.get("properties"))?;
    node.extra = object_or_null(view.get("extra"))?;
    node.bmc = Bmc::default();
    node.driver_info = Map::new();
    for (key, value) in object_or_null(view.get("driver_info"))? {
        match node.bmc.slot(&key) {
            Some(slot) => {
                *slot = match value {
                    Value::Null => None,
                    Value::String(s) => Some(s),
                    other => {
                        return Err(PatchError::Refused(format!(
                            "driver_info/{key} must be a string, not {}: Paddock keeps BMC settings as text",
                            repr(&other)
                        )));
                    }
                }
            }
            None => {
                node.driver_info.insert(key, value);
            }
        }
    }
    node.ironic = Map::new();
    for (field, kind) in IRONIC_FIELDS {
        let v = view.get(*field);
        let kept = match kind {
            Kind::Text(max) => text_or_null(v, *max)?.map(Value::String),
            Kind::Flag => v
                .map(|v| flag(field, v))
                .transpose()?
                .filter(|v| !v.is_null()),
            Kind::Object => match v {
                None | Some(Value::Null) => None,
                Some(_) => Some(Value::Object(object_or_null(v)?)),
            },
        };
        if let Some(k) = kept {
            node.ironic.insert((*field).to_string(), k);
        }
    }
    let macs = match view.get("macs") {
        Some(Value::Array(list)) => list
            .iter()
            .map(|m| mac(m, "macs"))
            .collect::<Result<Vec<_>, _>>()?,
        None | Some(Value::Null) => Vec::new(),
        Some(other) => {
            return Err(schema_error(format!(
                "{} is not of type 'array'",
                repr(other)
            )));
        }
    };
    for (i, m) in macs.iter().enumerate() {
        if macs[..i].contains(m) {
            return Err(PatchError::Refused(format!(
                "MAC {m} is listed twice in macs"
            )));
        }
    }
    node.macs = macs;
    node.pxe_mac = match view.get("pxe_mac") {
        None | Some(Value::Null) => None,
        Some(v) => Some(mac(v, "pxe_mac")?),
    };
    node.bmc_address = text_or_null(view.get("bmc_address"), 0)?;
    Ok(node)
}

/// Applies a JSON patch (`[{op, path, value?}]`) to `node` as Ironic applies one to a node:
/// the new node, or Ironic's refusal.
pub fn patch(node: &Node, ops: &Value, opts: &Options) -> Result<Node, PatchError> {
    let ops = check_shape(ops)?;
    check_request(&ops, opts)?;
    let mut doc = node.view(Secrets::Plain);
    // Ironic refuses to add an attribute a node does not have; every patchable one exists.
    for op in &ops {
        let path = path_of(op);
        if op["op"] == "add" && path.matches('/').count() == 1 && doc.get(&path[1..]).is_none() {
            return Err(PatchError::Refused(format!(
                "Adding a new attribute ({path}) to the root of the resource is not allowed"
            )));
        }
    }
    for op in &ops {
        apply_op(&mut doc, op).map_err(|reason| PatchError::Operation {
            op: repr(&Value::Object((*op).clone())),
            reason,
        })?;
    }
    let Value::Object(view) = doc else {
        return Err(PatchError::Refused(
            "the patched node is not an object".into(),
        ));
    };
    let mut new = from_view(node, &view)?;
    let reset = opts.reset_interfaces == Some(true) && new.driver != node.driver;
    if reset {
        new.ironic.retain(|k, _| !k.ends_with("_interface"));
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use uuid::Uuid;

    fn node() -> Node {
        let mut n = Node::new(Uuid::nil(), 0);
        n.name = Some("r1u1".into());
        n.macs = vec!["52:54:00:00:00:01".parse().unwrap()];
        n.properties.insert("cpus".into(), json!(4));
        n.bmc.ipmi.password = Some("secret".into());
        n
    }

    fn apply(ops: Value) -> Result<Node, String> {
        patch(
            &node(),
            &ops,
            &Options {
                ident: "r1u1",
                reset_interfaces: None,
            },
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn ironic_semantics() {
        let n = apply(json!([
            {"op": "add", "path": "/driver", "value": "ipmi"},
            {"op": "add", "path": "/driver_info/ipmi_address", "value": "192.0.2.9"},
            {"op": "add", "path": "/driver_info/ipmi_username", "value": "admin"},
            {"op": "add", "path": "/driver_info/redfish_address", "value": "https://192.0.2.9"},
            {"op": "add", "path": "/driver_info/deploy_kernel", "value": "http://x/k"},
            {"op": "add", "path": "/properties/inspection_scope", "value": "gpu"},
            {"op": "replace", "path": "/properties/cpus", "value": "8"},
            {"op": "add", "path": "/extra/tags", "value": ["a"]},
            {"op": "add", "path": "/extra/tags/-", "value": "b"},
            {"op": "add", "path": "/extra/tags/0", "value": "z"},
            {"op": "add", "path": "/resource_class", "value": "baremetal.gpu"},
            {"op": "add", "path": "/maintenance", "value": "true"},
            {"op": "add", "path": "/name", "value": "r1u2"},
            {"op": "add", "path": "/macs/-", "value": "52:54:00:00:00:02"},
        ]))
        .unwrap();
        assert_eq!(n.driver.as_deref(), Some("ipmi"));
        assert_eq!(n.bmc.ipmi.address.as_deref(), Some("192.0.2.9"));
        assert_eq!(n.bmc.ipmi.username.as_deref(), Some("admin"));
        assert_eq!(n.bmc.ipmi.password.as_deref(), Some("secret"), "kept");
        assert_eq!(n.bmc.redfish.address.as_deref(), Some("https://192.0.2.9"));
        assert_eq!(
            n.driver_info,
            *json!({"deploy_kernel": "http://x/k"}).as_object().unwrap()
        );
        assert_eq!(n.properties["inspection_scope"], "gpu");
        assert_eq!(n.properties["cpus"], "8");
        assert_eq!(n.extra["tags"], json!(["z", "a", "b"]));
        assert_eq!(n.ironic["resource_class"], "baremetal.gpu");
        assert_eq!(
            n.ironic["maintenance"], true,
            "Ironic reads flags as booleans"
        );
        assert_eq!(n.name.as_deref(), Some("r1u2"));
        assert_eq!(n.macs.len(), 2);
        let view = n.view(Secrets::Masked);
        assert_eq!(view["driver_info"]["ipmi_password"], "******");
        assert_eq!(view["driver_info"]["ipmi_address"], "192.0.2.9");
        assert_eq!(view["resource_class"], "baremetal.gpu");
        assert_eq!(view["description"], Value::Null);
        // Removing a BMC setting and an attribute.
        let n = apply(json!([
            {"op": "remove", "path": "/driver_info/ipmi_password"},
            {"op": "remove", "path": "/properties/cpus"},
            {"op": "remove", "path": "/name"},
        ]))
        .unwrap();
        assert!(n.bmc.is_empty());
        assert!(n.properties.is_empty());
        assert_eq!(n.name, None);
    }

    #[test]
    fn refusals_say_what_ironic_says() {
        let cases = [
            (
                json!({"op": "add"}),
                "Schema error for patch: {'op': 'add'} is not of type 'array'",
            ),
            (
                json!([{"op": "move", "path": "/extra/a"}]),
                "Schema error for patch: 'move' is not one of ['add', 'replace', 'remove']",
            ),
            (
                json!([{"path": "/extra/a"}]),
                "Schema error for patch: 'op' is a required property",
            ),
            (
                json!([{"op": "add", "path": "/extra/a", "value": 1, "from": "/x"}]),
                "Schema error for patch: Additional properties are not allowed ('from' was unexpected)",
            ),
            (
                json!([{"op": "add", "path": "extra/a", "value": 1}]),
                r"Schema error for patch: 'extra/a' does not match '^(/[\\w-]+)+$'",
            ),
            (
                json!([{"op": "add", "path": "/extra/a.b", "value": 1}]),
                "does not match",
            ),
            (
                json!([{"op": "replace", "path": "/uuid", "value": "x"}]),
                "Cannot patch /uuid. Only the following can be updated: automated_clean, bios_interface, bmc_address",
            ),
            (
                json!([{"op": "add", "path": "/traits", "value": ["CUSTOM_X"]}]),
                "Cannot patch /traits. Only the following",
            ),
            (
                json!([{"op": "add", "path": "/introspection", "value": {}}]),
                "Cannot patch /introspection.",
            ),
            (
                json!([{"op": "add", "path": "/chassis_uuid", "value": "x"}]),
                "Cannot patch /chassis_uuid: Paddock has no chassis",
            ),
            (
                json!([{"op": "add", "path": "/name", "value": "bad name"}]),
                "Node r1u1: Cannot change name to invalid name 'bad name'",
            ),
            (
                json!([{"op": "add", "path": "/name", "value": "7f3a8c52-1e2b-4c7d-9a6e-000000000001"}]),
                "Cannot change name to invalid name",
            ),
            (
                json!([{"op": "add", "path": "/extra/a/b", "value": 1}]),
                "Couldn't apply patch '{'op': 'add', 'path': '/extra/a/b', 'value': 1}'. Reason: member 'a' not found in {}",
            ),
            (
                json!([{"op": "replace", "path": "/extra/a", "value": 1}]),
                "Reason: can't replace a non-existent object 'a'",
            ),
            (
                json!([{"op": "remove", "path": "/extra/a"}]),
                "Reason: can't remove a non-existent object 'a'",
            ),
            (
                json!([{"op": "add", "path": "/extra/a"}]),
                "Reason: The operation does not contain a 'value' member",
            ),
            (
                json!([{"op": "add", "path": "/macs/5", "value": "52:54:00:00:00:09"}]),
                "Reason: can't insert outside of list",
            ),
            (
                json!([{"op": "add", "path": "/macs/01", "value": "52:54:00:00:00:09"}]),
                "Reason: '01' is not a valid sequence index",
            ),
            (
                json!([{"op": "add", "path": "/properties/cpus/x", "value": 1}]),
                "Reason: Document '<class 'int'>' does not support indexing",
            ),
            (
                json!([{"op": "add", "path": "/driver", "value": 5}]),
                "Schema error for patch: 5 is not of type 'string'",
            ),
            (
                json!([{"op": "add", "path": "/extra", "value": "x"}]),
                "Schema error for patch: 'x' is not of type 'object', 'null'",
            ),
            (
                json!([{"op": "add", "path": "/resource_class", "value": "x".repeat(81)}]),
                "is too long",
            ),
            (
                json!([{"op": "add", "path": "/maintenance", "value": "maybe"}]),
                "Unrecognized value 'maybe' for maintenance",
            ),
            (
                json!([{"op": "add", "path": "/description", "value": "x".repeat(4097)}]),
                "Cannot update node with description exceeding 4096 characters",
            ),
            (
                json!([{"op": "add", "path": "/driver_info/ipmi_address", "value": 5}]),
                "driver_info/ipmi_address must be a string, not 5",
            ),
            (
                json!([{"op": "add", "path": "/macs/-", "value": "nonsense"}]),
                "Invalid MAC address 'nonsense' in macs",
            ),
            (
                json!([{"op": "add", "path": "/macs/-", "value": "52:54:00:00:00:01"}]),
                "MAC 52:54:00:00:00:01 is listed twice",
            ),
        ];
        for (ops, want) in cases {
            let e = apply(ops.clone()).unwrap_err();
            assert!(e.contains(want), "{ops}: {e}");
        }
    }

    #[test]
    fn reset_interfaces_with_a_new_driver() {
        let mut n = node();
        n.ironic.insert("power_interface".into(), json!("ipmitool"));
        n.ironic.insert("resource_class".into(), json!("x"));
        let ops = json!([{"op": "add", "path": "/driver", "value": "redfish"}]);
        let reset = |r| {
            patch(
                &n,
                &ops,
                &Options {
                    ident: "n",
                    reset_interfaces: r,
                },
            )
            .unwrap()
            .ironic
        };
        assert_eq!(
            reset(Some(true)),
            *json!({"resource_class": "x"}).as_object().unwrap()
        );
        assert_eq!(reset(None)["power_interface"], "ipmitool");
        let e = patch(
            &n,
            &json!([{"op": "add", "path": "/extra/a", "value": 1}]),
            &Options {
                ident: "n",
                reset_interfaces: Some(true),
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "The reset_interfaces parameter can only be used when changing the node's driver."
        );
    }
}
