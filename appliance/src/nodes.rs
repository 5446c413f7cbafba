//! Node records as the boot path needs them. The inspector (introspection, enrolment) grows
//! this model; for now a node is a set of MACs with a state that decides what it boots.

use std::sync::Arc;

use paddock_dhcp::MacAddr;
use paddock_store::{Compare, Op, Store, StoreError, Txn};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `nodes/<uuid>` → JSON [`Node`].
pub const NODE_PREFIX: &str = "nodes/";
/// `node-macs/<mac>` → the node's UUID: the lookup index for boot and DHCP.
pub const MAC_PREFIX: &str = "node-macs/";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Known, to be inspected: boots the discovery ramdisk.
    Inspecting,
    /// Known and idle: boots from its local disk.
    Idle,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub uuid: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub macs: Vec<MacAddr>,
    pub state: NodeState,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("MAC {0} already belongs to another node")]
    MacTaken(MacAddr),
    #[error("a node needs at least one MAC address")]
    NoMac,
    #[error("node record {key} is unreadable: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Clone)]
pub struct Nodes {
    store: Arc<dyn Store>,
}

impl Nodes {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Nodes { store }
    }

    /// Adds a node; fails, changing nothing, if any of its MACs is already taken.
    pub async fn create(&self, node: &Node) -> Result<(), NodeError> {
        if node.macs.is_empty() {
            return Err(NodeError::NoMac);
        }
        let value = serde_json::to_vec(node).map_err(|source| NodeError::Corrupt {
            key: node.uuid.to_string(),
            source,
        })?;
        let mut txn = Txn {
            success: vec![Op::put(format!("{NODE_PREFIX}{}", node.uuid), value)],
            ..Txn::default()
        };
        for mac in &node.macs {
            let key = format!("{MAC_PREFIX}{mac}");
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: 0,
            });
            txn.success
                .push(Op::put(key, node.uuid.to_string().into_bytes()));
        }
        if self.store.txn(txn).await?.succeeded {
            return Ok(());
        }
        for mac in &node.macs {
            if self
                .store
                .get(&format!("{MAC_PREFIX}{mac}"))
                .await?
                .is_some()
            {
                return Err(NodeError::MacTaken(*mac));
            }
        }
        Err(NodeError::MacTaken(node.macs[0]))
    }

    pub async fn by_mac(&self, mac: MacAddr) -> Result<Option<Node>, NodeError> {
        let Some(idx) = self.store.get(&format!("{MAC_PREFIX}{mac}")).await? else {
            return Ok(None);
        };
        let key = format!("{NODE_PREFIX}{}", String::from_utf8_lossy(&idx.value));
        let Some(kv) = self.store.get(&key).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&kv.value)
            .map(Some)
            .map_err(|source| NodeError::Corrupt { key, source })
    }

    pub async fn list(&self) -> Result<Vec<Node>, NodeError> {
        self.store
            .range(NODE_PREFIX)
            .await?
            .into_iter()
            .map(|kv| {
                serde_json::from_slice(&kv.value).map_err(|source| NodeError::Corrupt {
                    key: kv.key,
                    source,
                })
            })
            .collect()
    }
}
