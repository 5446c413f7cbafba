//! Node records: Paddock's own (there is no Ironic behind us), keyed by UUID, found by MAC,
//! BMC address or name.

use std::collections::BTreeMap;

use paddock_inventory::MacAddr;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::state::State;

/// The current (or last) introspection of a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Introspection {
    pub state: State,
    /// Unix seconds.
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub error: Option<String>,
    #[serde(default = "yes")]
    pub manage_boot: bool,
    /// The image a rule's `set-image` action chose during this introspection: once it
    /// finishes, the appliance provisions the node with it (its provisioning record goes
    /// `unknown → birth`; `appliance/src/provisioning.rs`). Belongs to this introspection
    /// only: a new one starts without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_image: Option<String>,
}

fn yes() -> bool {
    true
}

impl Introspection {
    pub fn finished(&self) -> bool {
        self.finished_at.is_some()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub uuid: Uuid,
    #[serde(default)]
    pub name: Option<String>,
    /// Every NIC MAC of the node (Ironic's ports).
    #[serde(default)]
    pub macs: Vec<MacAddr>,
    /// The NIC it PXE-boots from.
    #[serde(default)]
    pub pxe_mac: Option<MacAddr>,
    /// What is known of each NIC's switch port, by MAC (as Ironic's ports have it): its
    /// `local_link_connection` (`switch_id`, `port_id`, `switch_info`), from LLDP.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, Port>,
    #[serde(default)]
    pub bmc_address: Option<String>,
    /// Scheduling properties (`cpus`, `cpu_arch`, `memory_mb`, `local_gb`, `capabilities`),
    /// root device hints (`root_device`) and `inspection_scope`.
    #[serde(default)]
    pub properties: Map<String, Value>,
    #[serde(default)]
    pub extra: Map<String, Value>,
    /// Ironic's `driver` (hardware type). Auto-enrolled nodes get `fake-hardware`, the
    /// default of Inspector's `[discovery] enroll_node_driver`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Ironic's `driver_info` but for the BMC settings, which are in `bmc`.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub driver_info: Map<String, Value>,
    /// The BMC settings of `driver_info` (`ipmi_*`, `redfish_*`, `drac_*`, `ilo_*` address,
    /// username, password), typed for power control.
    #[serde(default, skip_serializing_if = "Bmc::is_empty")]
    pub bmc: Bmc,
    /// Other Ironic node attributes an operator or a rule set ([`IRONIC_FIELDS`]:
    /// `resource_class`, `description`, `instance_info`, the `*_interface`s, …), kept as
    /// given so they read back.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub ironic: Map<String, Value>,
    #[serde(default)]
    pub traits: Vec<String>,
    /// Created by auto-enrolment rather than by an operator.
    #[serde(default)]
    pub auto_discovered: bool,
    #[serde(default)]
    pub introspection: Option<Introspection>,
    /// Unix seconds.
    #[serde(default)]
    pub created_at: i64,
}

/// One NIC's port, as Ironic's port object names what is known of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Port {
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub local_link_connection: Map<String, Value>,
}

impl Node {
    pub fn new(uuid: Uuid, now: i64) -> Self {
        Node {
            uuid,
            name: None,
            macs: Vec::new(),
            pxe_mac: None,
            ports: BTreeMap::new(),
            bmc_address: None,
            properties: Map::new(),
            extra: Map::new(),
            driver: None,
            driver_info: Map::new(),
            bmc: Bmc::default(),
            ironic: Map::new(),
            traits: Vec::new(),
            auto_discovered: false,
            introspection: None,
            created_at: now,
        }
    }

    pub fn state(&self) -> Option<State> {
        self.introspection.as_ref().map(|i| i.state)
    }

    /// Under introspection: boots the ramdisk, is looked up on `/v1/continue`.
    pub fn inspecting(&self) -> bool {
        self.state().is_some_and(State::is_active)
    }

    /// A name for logs and the console.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.uuid.to_string())
    }

    /// The node as Ironic's API shows it (what `node://` conditions, `PATCH` and API answers
    /// see): Paddock's fields, `driver`, `driver_info` with the BMC settings in it (passwords
    /// as `******` when `secrets` is [`Secrets::Masked`], as Ironic shows them), and every
    /// attribute of [`IRONIC_FIELDS`] (`null` when unset).
    pub fn view(&self, secrets: Secrets) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        let Value::Object(m) = &mut v else {
            return v;
        };
        m.remove("bmc");
        m.remove("ironic");
        m.insert("driver".into(), json!(self.driver));
        let mut info = self.driver_info.clone();
        for (key, value) in self.bmc.fields() {
            info.insert(key, Value::String(value.to_string()));
        }
        if secrets == Secrets::Masked {
            for (key, value) in info.iter_mut() {
                if key.contains("password") && !value.is_null() {
                    *value = json!(MASK);
                }
            }
        }
        m.insert("driver_info".into(), Value::Object(info));
        for (field, _) in IRONIC_FIELDS {
            m.insert(
                (*field).into(),
                self.ironic.get(*field).cloned().unwrap_or(Value::Null),
            );
        }
        v
    }
}

/// How [`Node::view`] shows passwords.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secrets {
    /// As stored: for rules' `PATCH`es, which read and write the node.
    Plain,
    /// `******`, as Ironic's API shows them.
    Masked,
}

/// What Ironic shows instead of a password.
pub const MASK: &str = "******";

/// The JSON types Ironic's node schema allows an attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string or `null`, at most this many characters (0: no limit).
    Text(usize),
    /// A boolean, a string Ironic reads as one (`"true"`, `"off"`, …), or `null`.
    Flag,
    /// An object or `null`.
    Object,
}

/// The Ironic node attributes Paddock keeps as they are given (in `Node::ironic`), with the
/// types Ironic's node schema (`api/controllers/v1/node.py`, `node_schema`) allows them.
pub const IRONIC_FIELDS: &[(&str, Kind)] = &[
    ("automated_clean", Kind::Flag),
    ("bios_interface", Kind::Text(0)),
    ("boot_interface", Kind::Text(0)),
    ("conductor_group", Kind::Text(0)),
    ("console_interface", Kind::Text(0)),
    ("deploy_interface", Kind::Text(0)),
    ("description", Kind::Text(4096)),
    ("disable_power_off", Kind::Flag),
    ("firmware_interface", Kind::Text(0)),
    ("inspect_interface", Kind::Text(0)),
    ("instance_info", Kind::Object),
    ("instance_name", Kind::Text(255)),
    ("lessee", Kind::Text(0)),
    ("maintenance", Kind::Flag),
    ("management_interface", Kind::Text(0)),
    ("network_interface", Kind::Text(0)),
    ("owner", Kind::Text(0)),
    ("power_interface", Kind::Text(0)),
    ("protected", Kind::Flag),
    ("protected_reason", Kind::Text(0)),
    ("raid_interface", Kind::Text(0)),
    ("rescue_interface", Kind::Text(0)),
    ("resource_class", Kind::Text(80)),
    ("retired", Kind::Flag),
    ("retired_reason", Kind::Text(0)),
    ("shard", Kind::Text(0)),
    ("storage_interface", Kind::Text(0)),
    ("vendor_interface", Kind::Text(0)),
];

/// A BMC's address and credentials for one driver family.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BmcAccess {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl BmcAccess {
    pub fn is_empty(&self) -> bool {
        self.address.is_none() && self.username.is_none() && self.password.is_none()
    }

    fn slot(&mut self, what: &str) -> Option<&mut Option<String>> {
        match what {
            "address" => Some(&mut self.address),
            "username" => Some(&mut self.username),
            "password" => Some(&mut self.password),
            _ => None,
        }
    }
}

/// The BMC settings of a node, by the `driver_info` prefix Ironic's drivers read them from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bmc {
    #[serde(default, skip_serializing_if = "BmcAccess::is_empty")]
    pub ipmi: BmcAccess,
    #[serde(default, skip_serializing_if = "BmcAccess::is_empty")]
    pub redfish: BmcAccess,
    #[serde(default, skip_serializing_if = "BmcAccess::is_empty")]
    pub drac: BmcAccess,
    #[serde(default, skip_serializing_if = "BmcAccess::is_empty")]
    pub ilo: BmcAccess,
}

/// The `driver_info` prefixes whose address, username and password are BMC settings.
pub const BMC_PREFIXES: [&str; 4] = ["ipmi", "redfish", "drac", "ilo"];

impl Bmc {
    pub fn is_empty(&self) -> bool {
        [&self.ipmi, &self.redfish, &self.drac, &self.ilo]
            .iter()
            .all(|a| a.is_empty())
    }

    fn access(&mut self, prefix: &str) -> Option<&mut BmcAccess> {
        match prefix {
            "ipmi" => Some(&mut self.ipmi),
            "redfish" => Some(&mut self.redfish),
            "drac" => Some(&mut self.drac),
            "ilo" => Some(&mut self.ilo),
            _ => None,
        }
    }

    /// The setting a `driver_info` key names (`ipmi_address`), if it is a BMC one.
    pub fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        let (prefix, what) = key.split_once('_')?;
        self.access(prefix)?.slot(what)
    }

    /// Every setting as its `driver_info` key and value.
    pub fn fields(&self) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        for (prefix, a) in
            BMC_PREFIXES
                .iter()
                .zip([&self.ipmi, &self.redfish, &self.drac, &self.ilo])
        {
            for (what, v) in [
                ("address", &a.address),
                ("username", &a.username),
                ("password", &a.password),
            ] {
                if let Some(v) = v {
                    out.push((format!("{prefix}_{what}"), v.as_str()));
                }
            }
        }
        out
    }
}

/// The `capabilities` property (`key:value,…`) with `updates` merged in as Inspector merges
/// them (`ir_utils.capabilities_to_dict`, `dict.update`, `dict_to_capabilities`): a key
/// keeps its place, a new one goes last, a `None` value drops it. A capabilities value
/// Inspector cannot split fails as it does there.
pub fn update_capabilities(
    current: Option<&Value>,
    updates: &[(String, Option<String>)],
) -> Result<String, crate::py::PyError> {
    use crate::py::{PyError, truthy, type_name};
    let mut caps: Vec<(String, Option<String>)> = Vec::new();
    let set = |caps: &mut Vec<(String, Option<String>)>, k: &str, v: Option<String>| match caps
        .iter_mut()
        .find(|(key, _)| key == k)
    {
        Some(slot) => slot.1 = v,
        None => caps.push((k.to_string(), v)),
    };
    match current {
        Some(c) if truthy(c) => {
            let text = c.as_str().ok_or_else(|| {
                PyError::attribute_error(format!(
                    "'{}' object has no attribute 'split'",
                    type_name(c)
                ))
            })?;
            for (i, item) in text.split(',').enumerate() {
                let (k, v) = item.split_once(':').ok_or_else(|| {
                    PyError::value_error(format!(
                        "dictionary update sequence element #{i} has length 1; 2 is required"
                    ))
                })?;
                set(&mut caps, k, Some(v.to_string()));
            }
        }
        _ => {}
    }
    for (k, v) in updates {
        set(&mut caps, k, v.clone());
    }
    let kept: Vec<String> = caps
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}:{v}")))
        .collect();
    Ok(kept.join(","))
}

/// Ironic's node names (`api_utils.is_valid_node_name`): a logical name (RFC 3986 unreserved
/// characters only) that does not look like a UUID, so `{node}` in a route stays unambiguous.
pub fn check_name(name: &str) -> Result<(), InvalidName> {
    paddock_image::check_logical_name(name).map_err(InvalidName::NotLogical)?;
    if uuid::Uuid::parse_str(name).is_ok() {
        return Err(InvalidName::LooksLikeUuid(name.to_string()));
    }
    Ok(())
}

/// A node name Ironic refuses.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    #[error("Invalid node name: {0}")]
    NotLogical(paddock_image::BadName),
    #[error("Invalid node name {0:?}: a name must not look like a UUID")]
    LooksLikeUuid(String),
}

/// Formats Unix seconds as Inspector does: naive ISO 8601 in UTC, `2017-08-16T12:22:01`.
pub fn iso(ts: i64) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp(ts)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_naive_iso() {
        assert_eq!(iso(1_502_886_121), "2017-08-16T12:22:01");
    }
}
