//! Node records: Paddock's own (there is no Ironic behind us), keyed by UUID, found by MAC,
//! BMC address or name.

use paddock_dhcp::MacAddr;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
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
    #[serde(default)]
    pub bmc_address: Option<String>,
    /// Scheduling properties (`cpus`, `cpu_arch`, `memory_mb`, `local_gb`, `capabilities`),
    /// root device hints (`root_device`) and `inspection_scope`.
    #[serde(default)]
    pub properties: Map<String, Value>,
    #[serde(default)]
    pub extra: Map<String, Value>,
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

impl Node {
    pub fn new(uuid: Uuid, now: i64) -> Self {
        Node {
            uuid,
            name: None,
            macs: Vec::new(),
            pxe_mac: None,
            bmc_address: None,
            properties: Map::new(),
            extra: Map::new(),
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
}

/// Ironic's node names (`api_utils.is_valid_node_name`): a logical name (RFC 3986 unreserved
/// characters only) that does not look like a UUID, so `{node}` in a route stays unambiguous.
pub fn check_name(name: &str) -> Result<(), String> {
    paddock_image::check_logical_name(name).map_err(|e| format!("Invalid node name: {e}"))?;
    if uuid::Uuid::parse_str(name).is_ok() {
        return Err(format!(
            "Invalid node name {name:?}: a name must not look like a UUID"
        ));
    }
    Ok(())
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
