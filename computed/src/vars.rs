//! Variables, merged in verwalter's order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A table of variables.
pub type Vars = serde_json::Map<String, Value>;

/// A host's own variables, and its variables for each of its roles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostVars {
    #[serde(default)]
    pub vars: Vars,
    #[serde(default)]
    pub roles: BTreeMap<String, Vars>,
}

/// Every source of variables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VarSources {
    /// The spec's `[vars]`.
    #[serde(default)]
    pub spec: Vars,
    /// Each role's `vars`.
    #[serde(default)]
    pub roles: BTreeMap<String, Vars>,
    /// Per host (the spec's `[hosts.<name>]`, the MDB's tags).
    #[serde(default)]
    pub hosts: BTreeMap<String, HostVars>,
}

impl VarSources {
    /// What a file of `role` (none: the machine's own) on `host` sees: `spec < role < host <
    /// host-role`.
    pub fn for_file(&self, host: &str, role: Option<&str>) -> Vars {
        let empty = Vars::new();
        let h = self.hosts.get(host);
        let role_vars = role.and_then(|r| self.roles.get(r)).unwrap_or(&empty);
        let host_vars = h.map_or(&empty, |h| &h.vars);
        let host_role = match (h, role) {
            (Some(h), Some(r)) => h.roles.get(r).unwrap_or(&empty),
            _ => &empty,
        };
        merge(&[&self.spec, role_vars, host_vars, host_role])
    }
}

/// `layers` merged, later winning, two levels deep: a key whose values are tables in both
/// merges their keys (one level); below that, and for any other value, the later one
/// replaces the earlier whole.
pub fn merge(layers: &[&Vars]) -> Vars {
    let mut out = Vars::new();
    for layer in layers {
        for (k, v) in layer.iter() {
            match (out.get_mut(k), v) {
                (Some(Value::Object(base)), Value::Object(top)) => {
                    for (k2, v2) in top {
                        base.insert(k2.clone(), v2.clone());
                    }
                }
                _ => {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
    }
    out
}
