//! Introspection rules as posted to `/v1/rules`: validation, then applying a valid rule to
//! fixed data, with no panic (bad JSONPaths, regexes, formats give errors). The same input
//! as a node PATCH, a JSONPath and a format string: errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_inspector::node::Node;
use paddock_inspector::rules::{self, Rule};
use paddock_inspector::{jsonpath, patch, py};
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let sample = json!({"inventory": {"cpu": {"count": 2}, "interfaces": [{"mac_address": "52:54:00:00:00:01"}]}, "memory_mb": 512, "none": null});
    if let Ok(p) = jsonpath::parse(&text) {
        let _ = jsonpath::find(&p, &sample);
    }
    let _ = py::format(&text, &sample);
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let node = Node::new(uuid::Uuid::nil(), 0);
    let _ = patch::patch(
        &node,
        &v,
        &patch::Options {
            ident: "n",
            reset_interfaces: Some(true),
        },
    );
    if rules::validate(&v).is_err() {
        return;
    }
    let rule = Rule {
        uuid: uuid::Uuid::nil(),
        description: None,
        scope: v.get("scope").and_then(Value::as_str).map(String::from),
        conditions: v
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        actions: v["actions"].as_array().cloned().unwrap_or_default(),
        created_at: 0,
    };
    let _ = rules::apply(&[rule], &sample, &node);
});
