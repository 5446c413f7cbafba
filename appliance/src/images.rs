//! The image server and MDB inside the appliance: the fan-out of node changes, and the
//! recorder that puts every machine that finished enrolment into the MDB.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_image::Machine;
use paddock_imageserver::mdb::{MdbService, MdbServiceError, Source};
use paddock_inspector::node::Node;
use paddock_inspector::service::{
    Changed, DATA, Inspector, InspectorError, NodeObserver, Reaction,
};
use paddock_inspector::state::State;
use paddock_inventory::IntrospectionData;

/// Several observers of node changes, told in order (the PXE filter first: it must be
/// current before the API call returns).
pub struct Observers(pub Vec<Arc<dyn NodeObserver>>);

impl NodeObserver for Observers {
    fn nodes_changed<'a>(&'a self, changed: Changed<'a>) -> Reaction<'a> {
        Box::pin(async move {
            for o in &self.0 {
                o.nodes_changed(changed).await;
            }
        })
    }
}

/// Why recording enrolled machines failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("reading node records: {}", .0.message)]
    Nodes(InspectorError),
    #[error("reading the processed data of node {node}: {source}")]
    Data {
        node: uuid::Uuid,
        source: paddock_store::StoreError,
    },
    #[error("recording node {node} in the MDB: {source}")]
    Mdb {
        node: uuid::Uuid,
        source: MdbServiceError,
    },
}

/// Records enrolled machines in the MDB: hostname = the node's name (or UUID), IpAddress =
/// the address its PXE NIC reported, tag `NodeUuid`. An MDB entry of that name that already
/// exists (from the file or the API) is left alone. Only the nodes a change names are read
/// (their record, and their processed data once they finished), so the cost of a change
/// does not grow with the fleet.
pub struct MdbRecorder {
    pub inspector: Arc<Inspector>,
    pub mdb: Arc<MdbService>,
    /// Where a reported address may be for the dominator to call it (the provisioning
    /// subnets): an address elsewhere is left out of the entry until an operator sets it.
    /// `None`: anywhere (insecure mode, where every agent is trusted).
    pub networks: Option<Vec<ipnet::Ipv4Net>>,
    recorded: Mutex<BTreeSet<uuid::Uuid>>,
    /// Nodes whose recording failed (a store or MDB error): tried again at every change, so a
    /// finished node, which rarely changes again, still reaches the MDB.
    failed: Mutex<BTreeSet<uuid::Uuid>>,
}

impl MdbRecorder {
    pub fn new(inspector: Arc<Inspector>, mdb: Arc<MdbService>) -> Arc<Self> {
        Self::within(inspector, mdb, None)
    }

    /// A recorder that takes reported addresses only inside `networks`.
    pub fn within(
        inspector: Arc<Inspector>,
        mdb: Arc<MdbService>,
        networks: Option<Vec<ipnet::Ipv4Net>>,
    ) -> Arc<Self> {
        Arc::new(MdbRecorder {
            inspector,
            mdb,
            networks,
            recorded: Mutex::default(),
            failed: Mutex::default(),
        })
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, BTreeSet<uuid::Uuid>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, BTreeSet<uuid::Uuid>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the finished nodes among `changed` (every node for [`Changed::All`]), and
    /// those an earlier attempt failed on.
    async fn record(&self, changed: Changed<'_>) -> Result<(), RecordError> {
        let nodes = if let Changed::Nodes(changed) = changed {
            let retry: Vec<uuid::Uuid> = self.failed().iter().copied().collect();
            let mut nodes = Vec::with_capacity(changed.len() + retry.len());
            let wanted: BTreeSet<uuid::Uuid> = changed.iter().chain(&retry).copied().collect();
            for uuid in &wanted {
                if self.recorded().contains(uuid) {
                    continue;
                }
                if let Some(v) = self
                    .inspector
                    .get(&uuid.to_string())
                    .await
                    .map_err(RecordError::Nodes)?
                {
                    nodes.push(v.node);
                }
            }
            nodes
        } else {
            self.inspector.list().await.map_err(RecordError::Nodes)?
        };
        let mut first_error = None;
        for node in nodes {
            if node.state() == Some(State::Finished) && !self.recorded().contains(&node.uuid) {
                // One node's failure neither stops the others nor is forgotten.
                match self.record_one(&node).await {
                    Ok(()) => {
                        self.failed().remove(&node.uuid);
                    }
                    Err(e) => {
                        self.failed().insert(node.uuid);
                        first_error.get_or_insert(e);
                    }
                }
            } else {
                self.failed().remove(&node.uuid);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn record_one(&self, node: &Node) -> Result<(), RecordError> {
        let processed = self
            .inspector
            .store()
            .get(&format!("{DATA}{}/processed", node.uuid))
            .await
            .map_err(|source| RecordError::Data {
                node: node.uuid,
                source,
            })?
            .and_then(|kv| serde_json::from_slice::<IntrospectionData>(&kv.value).ok());
        let mut machine = enrolled_machine(node, processed.as_ref());
        if let (Some(nets), Ok(ip)) = (
            &self.networks,
            machine.ip_address.parse::<std::net::Ipv4Addr>(),
        ) && !nets.iter().any(|n| n.contains(&ip))
        {
            tracing::warn!(node = %node.uuid, %ip, "mdb: the reported address is outside the provisioning subnets: left out");
            machine.ip_address.clear();
        }
        let added = self
            .mdb
            .add_if_absent(machine, Source::Inspector)
            .await
            .map_err(|source| RecordError::Mdb {
                node: node.uuid,
                source,
            })?;
        if added {
            tracing::info!(node = %node.uuid, hostname = %node.label(), "mdb: enrolled machine recorded");
        }
        self.recorded().insert(node.uuid);
        Ok(())
    }
}

/// The MDB entry of an enrolled node: its label, the IPv4 address its PXE NIC (or, without
/// one, its first NIC with an address) reported in the processed data, tag `NodeUuid`.
fn enrolled_machine(node: &Node, processed: Option<&IntrospectionData>) -> Machine {
    let pxe = node.pxe_mac.map(|m| m.to_string());
    let ip = processed
        .and_then(|d| d.inventory.as_ref())
        .and_then(|inv| {
            inv.interfaces.iter().find(|i| {
                pxe.as_deref().is_none_or(|p| {
                    i.mac_address
                        .as_deref()
                        .is_some_and(|m| m.eq_ignore_ascii_case(p))
                })
            })
        })
        .and_then(|i| i.ipv4_address.as_deref())
        // The agent's text is untrusted: the dominator will connect to this address.
        .and_then(|a| a.parse::<std::net::Ipv4Addr>().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    Machine {
        hostname: node.label(),
        ip_address: ip,
        tags: [("NodeUuid".to_string(), node.uuid.to_string())].into(),
        ..Machine::default()
    }
}

impl NodeObserver for MdbRecorder {
    fn nodes_changed<'a>(&'a self, changed: Changed<'a>) -> Reaction<'a> {
        Box::pin(async move {
            if let Err(e) = self.record(changed).await {
                tracing::error!(error = %e, "mdb: recording enrolled machines failed");
            }
        })
    }
}

#[derive(Clone, Debug)]
pub struct ImagesConfig {
    pub dir: PathBuf,
    pub mdb_file: Option<PathBuf>,
    pub mdb_poll: Duration,
    pub record_enrolled: bool,
    pub expire_check: Duration,
}

/// The image server's own work: the MDB file followed, expired images removed (leader
/// only), and with several hosts every image's objects fetched from the others, so that any
/// leader's image server serves every image.
pub fn start(
    rt: &mut crate::runtime::Runtime,
    cfg: &ImagesConfig,
    images: &Arc<paddock_imageserver::images::ImageServer>,
    mdb: &Arc<MdbService>,
    peers: Replication,
) {
    if cfg.mdb_file.is_some() {
        let (m, period) = (mdb.clone(), cfg.mdb_poll);
        rt.spawn_future("mdb: file", async move {
            m.watch(period, paddock_wire::unix_ms).await;
            Ok(())
        });
    }
    let im = images.clone();
    rt.every_while_leading("images: expiry", cfg.expire_check, move |_| {
        let im = im.clone();
        async move {
            if let Err(e) = im.expire(paddock_wire::unix_ms()).await {
                tracing::error!(error = %e, "images: expiry check failed");
            }
        }
    });
    if !peers.urls.is_empty() {
        let r = paddock_imageserver::replicate::Replicator::with_tls(
            images.clone(),
            peers.urls,
            peers.tls,
        );
        let store = rt.context().store.clone();
        rt.spawn_future("images: replication", async move {
            r.run(store).await;
            Ok(())
        });
    }
}

/// The other hosts to fetch images from, and the TLS to reach them with.
pub struct Replication {
    pub urls: Vec<String>,
    pub tls: Option<ureq::tls::TlsConfig>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_mdb_entry_takes_the_pxe_nic_address() {
        let uuid = uuid::Uuid::from_u128(7);
        let data = json!({"inventory": {"interfaces": [
            {"mac_address": "52:54:00:00:00:01", "ipv4_address": "198.18.0.11"},
            {"mac_address": "52:54:00:00:00:02", "ipv4_address": "198.18.0.12"},
        ]}});
        let mut named = Node::new(uuid, 0);
        named.name = Some("r1u7".into());
        named.pxe_mac = Some("52:54:00:00:00:02".parse().unwrap());
        let unnamed = Node::new(uuid, 0);
        let forged = json!({"inventory": {"interfaces": [
            {"mac_address": "52:54:00:00:00:02", "ipv4_address": "198.18.0.12:22; rm -rf /"},
        ]}});
        let cases: [(&Node, Option<&serde_json::Value>, &str, &str); 5] = [
            (&named, Some(&data), "r1u7", "198.18.0.12"),
            // What the agent sent is not an IPv4 address: none is recorded.
            (&named, Some(&forged), "r1u7", ""),
            // No PXE NIC known: the first interface.
            (
                &unnamed,
                Some(&data),
                "00000000-0000-0000-0000-000000000007",
                "198.18.0.11",
            ),
            // No processed data, or none for the PXE NIC: no address.
            (&named, None, "r1u7", ""),
            (&named, Some(&json!({"inventory": {}})), "r1u7", ""),
        ];
        for (node, data, hostname, ip) in cases {
            let data: Option<IntrospectionData> =
                data.map(|d| serde_json::from_value(d.clone()).unwrap());
            let m = enrolled_machine(node, data.as_ref());
            assert_eq!((m.hostname.as_str(), m.ip_address.as_str()), (hostname, ip));
            assert_eq!(m.tags["NodeUuid"], uuid.to_string());
        }
    }
}
