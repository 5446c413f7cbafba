//! What a template sees for one machine.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Value, json};

use crate::vars::VarSources;

/// A machine, as its files may use it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Machine {
    pub name: String,
    pub uuid: Option<String>,
    pub addresses: Vec<String>,
    /// Inventory facts (`cpu_arch`, `memory_mib` …).
    pub facts: BTreeMap<String, Value>,
    pub traits: BTreeSet<String>,
    /// Its MDB entry.
    pub mdb: Option<Value>,
}

/// One instance of a role, as its peers see it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Member {
    pub instance: String,
    pub host: Option<String>,
    /// The addresses of its host.
    pub addresses: Vec<String>,
    /// Its name in DNS, when the appliance serves the role's names.
    pub dns_name: Option<String>,
}

/// Everything files are made from.
#[derive(Clone, Debug, Default)]
pub struct Site {
    pub machines: BTreeMap<String, Machine>,
    /// `(role, instance, host)` of every live instance.
    pub instances: Vec<(String, String, Option<String>)>,
    /// `(role, instance)` → its DNS name.
    pub dns_names: BTreeMap<(String, String), String>,
    pub vars: VarSources,
    /// The roles the spec declares: each is in `peers`, with no members while it has no
    /// instance (a template may loop over a role that has none yet).
    pub roles: BTreeSet<String>,
}

impl Site {
    /// The role's members, by instance name.
    pub fn members(&self, role: &str) -> Vec<Member> {
        let mut out: Vec<Member> = self
            .instances
            .iter()
            .filter(|(r, _, _)| r == role)
            .map(|(r, i, h)| Member {
                instance: i.clone(),
                host: h.clone(),
                addresses: h
                    .as_ref()
                    .and_then(|h| self.machines.get(h))
                    .map(|m| m.addresses.clone())
                    .unwrap_or_default(),
                dns_name: self.dns_names.get(&(r.clone(), i.clone())).cloned(),
            })
            .collect();
        out.sort();
        out
    }

    /// The data of a file of `role` (none: the machine's own) on `host`:
    /// `{machine, role, roles, instances, peers: {role: [member]}, vars}`. `peers` holds
    /// every role's members, so a file may name the members of a role its host does not run.
    pub fn data(&self, host: &str, role: Option<&str>) -> Value {
        self.data_with(host, role, &self.peers())
    }

    /// Every role's members, by role (what [`Site::data`] calls `peers`): the same for
    /// every host, so made once per render of all of them.
    pub fn peers(&self) -> Value {
        let all_roles: BTreeSet<&str> = self
            .instances
            .iter()
            .map(|(r, _, _)| r.as_str())
            .chain(self.roles.iter().map(String::as_str))
            .collect();
        let peers: serde_json::Map<String, Value> = all_roles
            .into_iter()
            .map(|r| (r.to_string(), json!(self.members(r))))
            .collect();
        Value::Object(peers)
    }

    /// [`Site::data`] with `peers` made already.
    pub fn data_with(&self, host: &str, role: Option<&str>, peers: &Value) -> Value {
        let machine = self.machines.get(host).cloned().unwrap_or_else(|| Machine {
            name: host.to_string(),
            ..Machine::default()
        });
        let mine: Vec<Value> = self
            .instances
            .iter()
            .filter(|(_, _, h)| h.as_deref() == Some(host))
            .map(|(r, i, _)| json!({"role": r, "instance": i}))
            .collect();
        let roles: BTreeSet<&str> = self
            .instances
            .iter()
            .filter(|(_, _, h)| h.as_deref() == Some(host))
            .map(|(r, _, _)| r.as_str())
            .collect();
        json!({
            "machine": machine,
            "role": role,
            "roles": roles,
            "instances": mine,
            "peers": peers,
            "vars": self.vars.for_file(host, role),
        })
    }
}
