//! Ironic's root device hints over an inventory's disks: which disk a node's
//! `properties.root_device` chooses, and the default when it has none. Shared by the
//! inspector's `root_disk_selection` hook and the birther, so inspection and installation
//! can never choose different disks.

use serde_json::{Map, Value, json};

use crate::Disk;

const GIB: u64 = 1 << 30;

/// Without hints: the smallest disk of at least 4 GiB (ties by name), as Ironic.
pub fn default_root_disk(disks: &[Disk]) -> Option<&Disk> {
    disks
        .iter()
        .filter(|d| d.size >= 4 * GIB)
        .min_by_key(|d| (d.size, d.name.clone()))
}

/// The first disk every hint matches (`size` in GiB; an unknown hint matches nothing).
pub fn disk_matching<'a>(disks: &'a [Disk], hints: &Map<String, Value>) -> Option<&'a Disk> {
    disks.iter().find(|d| {
        hints.iter().all(|(k, want)| {
            let have = match k.as_str() {
                "size" => json!(d.size / GIB),
                "name" => json!(d.name),
                "model" => json!(d.model),
                "vendor" => json!(d.vendor),
                "serial" => json!(d.serial),
                "wwn" => json!(d.wwn),
                "rotational" => json!(d.rotational),
                "by_path" => json!(d.by_path),
                "hctl" => json!(d.hctl),
                _ => return false,
            };
            hint_matches(want, &have)
        })
    })
}

/// A root device hint value: exact, or with an operator (`">= 100"`, `"s== abc"`).
pub fn hint_matches(hint: &Value, actual: &Value) -> bool {
    match hint {
        Value::String(s) => {
            let s = s.trim();
            for op in ["s==", "s!=", ">=", "<=", "==", "!=", ">", "<"] {
                if let Some(rest) = s.strip_prefix(op) {
                    let rest = rest.trim();
                    if let (Ok(want), Some(have)) = (rest.parse::<f64>(), actual.as_f64()) {
                        return match op {
                            ">=" => have >= want,
                            "<=" => have <= want,
                            ">" => have > want,
                            "<" => have < want,
                            "!=" => have != want,
                            _ => have == want,
                        };
                    }
                    let have = actual.as_str().unwrap_or_default();
                    return if op.contains('!') {
                        have != rest
                    } else {
                        have == rest
                    };
                }
            }
            match actual {
                Value::String(a) => a == s,
                Value::Number(n) => s.parse::<f64>().ok() == n.as_f64(),
                Value::Bool(b) => s.parse::<bool>().ok() == Some(*b),
                _ => false,
            }
        }
        other => other == actual,
    }
}
