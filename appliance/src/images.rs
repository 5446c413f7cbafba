//! The image server and MDB inside the appliance: the fan-out of node changes, and the
//! recorder that puts every machine that finished enrolment into the MDB.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use paddock_dominator::mdb::{MdbService, Source};
use paddock_image::Machine;
use paddock_inspector::service::{Inspector, NodeObserver};
use paddock_inspector::state::State;

type Fut<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// Several observers of node changes, told in order (the PXE filter first: it must be
/// current before the API call returns).
pub struct Observers(pub Vec<Arc<dyn NodeObserver>>);

impl NodeObserver for Observers {
    fn nodes_changed<'a>(&'a self, changed: &'a [uuid::Uuid]) -> Fut<'a> {
        Box::pin(async move {
            for o in &self.0 {
                o.nodes_changed(changed).await;
            }
        })
    }
}

/// Records enrolled machines in the MDB: hostname = the node's name (or UUID), IpAddress =
/// the address its PXE NIC reported, tag `NodeUuid`. An MDB entry of that name that already
/// exists (from the file or the API) is left alone.
pub struct MdbRecorder {
    pub inspector: Arc<Inspector>,
    pub mdb: Arc<MdbService>,
    recorded: Mutex<BTreeSet<uuid::Uuid>>,
}

impl MdbRecorder {
    pub fn new(inspector: Arc<Inspector>, mdb: Arc<MdbService>) -> Arc<Self> {
        Arc::new(MdbRecorder {
            inspector,
            mdb,
            recorded: Mutex::default(),
        })
    }

    async fn record_new(&self) -> anyhow::Result<()> {
        let nodes = self
            .inspector
            .list()
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        for n in nodes {
            if n.state() != Some(State::Finished)
                || self
                    .recorded
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&n.uuid)
            {
                continue;
            }
            let ip = self
                .inspector
                .data(&n.uuid.to_string(), true)
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|d| {
                    let pxe = n.pxe_mac.map(|m| m.to_string());
                    d["inventory"]["interfaces"]
                        .as_array()?
                        .iter()
                        .find(|i| {
                            pxe.as_deref().is_none_or(|p| {
                                i["mac_address"]
                                    .as_str()
                                    .is_some_and(|m| m.eq_ignore_ascii_case(p))
                            })
                        })
                        .and_then(|i| i["ipv4_address"].as_str().map(String::from))
                })
                .unwrap_or_default();
            let machine = Machine {
                hostname: n.label(),
                ip_address: ip,
                tags: [("NodeUuid".to_string(), n.uuid.to_string())].into(),
                ..Machine::default()
            };
            if self.mdb.add_if_absent(machine, Source::Inspector).await? {
                tracing::info!(node = %n.uuid, hostname = %n.label(), "mdb: enrolled machine recorded");
            }
            self.recorded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(n.uuid);
        }
        Ok(())
    }
}

impl NodeObserver for MdbRecorder {
    fn nodes_changed<'a>(&'a self, _changed: &'a [uuid::Uuid]) -> Fut<'a> {
        Box::pin(async move {
            if let Err(e) = self.record_new().await {
                tracing::error!(error = %e, "mdb: recording enrolled machines failed");
            }
        })
    }
}
