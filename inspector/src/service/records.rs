//! Node records in the store: the record under `nodes/<uuid>`, its MAC, name and BMC
//! indexes, reads, creation, PATCH, and the compare-and-swap every change goes through.

use paddock_inventory::MacAddr;
use paddock_store::{Compare, KeyValue, Op, Revision, Txn};
use serde_json::Value;
use uuid::Uuid;

use super::timeline::{Subject, event_op, rand_seq};
use super::{ErrorKind, Inspector, InspectorError, Result, now_ms};
use crate::lookup::real_bmc;
use crate::node::Node;
use crate::patch;
use crate::processing::Conflict;

pub const NODES: &str = "nodes/";
pub const MACS: &str = "node-macs/";
pub const NAMES: &str = "node-names/";
pub const BMCS: &str = "node-bmc/";
/// Introspection data, `<uuid>/unprocessed` (as posted) and `<uuid>/processed`.
pub const DATA: &str = "introspection-data/";

/// A node with the revision its record had when read.
pub struct Versioned {
    pub node: Node,
    pub rev: Revision,
}

pub(super) fn parse_node(kv: &KeyValue) -> Result<Node> {
    serde_json::from_slice(&kv.value).map_err(|e| {
        InspectorError::of(
            ErrorKind::Store,
            format!("node record {} is unreadable: {e}", kv.key),
        )
    })
}

/// Builds the transaction that writes `node` (created when `rev` is 0, else only if it still
/// has revision `rev`) and keeps its MAC, name and BMC indexes in step with `old`.
pub(super) fn node_txn(node: &Node, old: Option<&Node>, rev: Revision) -> Txn {
    let mut txn = Txn::default();
    txn.compare.push(Compare::ModRevision {
        key: format!("{NODES}{}", node.uuid),
        revision: rev,
    });
    txn.success.push(Op::put(
        format!("{NODES}{}", node.uuid),
        serde_json::to_vec(node).unwrap_or_default(),
    ));
    let id = node.uuid.to_string().into_bytes();
    let old_macs: Vec<MacAddr> = old.map(|o| o.macs.clone()).unwrap_or_default();
    for mac in &node.macs {
        if !old_macs.contains(mac) {
            let key = format!("{MACS}{mac}");
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: 0,
            });
            txn.success.push(Op::put(key, id.clone()));
        }
    }
    for mac in &old_macs {
        if !node.macs.contains(mac) {
            txn.success.push(Op::delete(format!("{MACS}{mac}")));
        }
    }
    let mut index = |prefix: &str, new: Option<&str>, old: Option<&str>| {
        if new == old {
            return;
        }
        if let Some(o) = old {
            txn.success.push(Op::delete(format!("{prefix}{o}")));
        }
        if let Some(n) = new {
            let key = format!("{prefix}{n}");
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: 0,
            });
            txn.success.push(Op::put(key, id.clone()));
        }
    };
    index(
        NAMES,
        node.name.as_deref(),
        old.and_then(|o| o.name.as_deref()),
    );
    index(
        BMCS,
        real_bmc(node.bmc_address.as_deref()),
        old.and_then(|o| real_bmc(o.bmc_address.as_deref())),
    );
    txn
}

impl Inspector {
    pub(super) async fn by_index(&self, prefix: &str, key: &str) -> Result<Option<Versioned>> {
        match self.store.get(&format!("{prefix}{key}")).await? {
            Some(kv) => self.get(&String::from_utf8_lossy(&kv.value)).await,
            None => Ok(None),
        }
    }

    /// A node by UUID.
    pub async fn get(&self, uuid: &str) -> Result<Option<Versioned>> {
        match self.store.get(&format!("{NODES}{uuid}")).await? {
            Some(kv) => Ok(Some(Versioned {
                node: parse_node(&kv)?,
                rev: kv.mod_revision,
            })),
            None => Ok(None),
        }
    }

    /// A node by UUID or name.
    pub async fn find(&self, ident: &str) -> Result<Option<Versioned>> {
        if Uuid::parse_str(ident).is_ok()
            && let Some(v) = self.get(&ident.to_ascii_lowercase()).await?
        {
            return Ok(Some(v));
        }
        self.by_index(NAMES, ident).await
    }

    pub async fn by_mac(&self, mac: MacAddr) -> Result<Option<Versioned>> {
        self.by_index(MACS, &mac.to_string()).await
    }

    pub async fn list(&self) -> Result<Vec<Node>> {
        self.store
            .range(NODES)
            .await?
            .iter()
            .map(parse_node)
            .collect()
    }

    /// Creates a node; refuses it (a conflict) if a MAC, the name or the BMC address is
    /// already taken.
    pub async fn create(&self, node: &Node) -> Result<()> {
        if let Some(n) = &node.name
            && Uuid::parse_str(n).is_ok()
        {
            return Err(InspectorError::invalid("a node name cannot be a UUID"));
        }
        let mut txn = node_txn(node, None, 0);
        let at = now_ms();
        txn.success.push(event_op(
            Subject::Node(node.uuid),
            at,
            0,
            "created",
            "node created",
            false,
        ));
        if self.store.txn(txn).await?.succeeded {
            self.changed(&[node.uuid]).await;
            return Ok(());
        }
        for mac in &node.macs {
            if self.store.get(&format!("{MACS}{mac}")).await?.is_some() {
                return Err(InspectorError::conflict(format!(
                    "MAC {mac} already belongs to another node"
                )));
            }
        }
        if let Some(n) = &node.name
            && self.store.get(&format!("{NAMES}{n}")).await?.is_some()
        {
            return Err(InspectorError::conflict(format!(
                "a node named {n} already exists"
            )));
        }
        Err(InspectorError::conflict(
            "the node conflicts with an existing one (UUID or BMC address)",
        ))
    }

    /// `PATCH /api/v1/nodes/{node}`: a JSON patch with Ironic's semantics ([`patch::patch`])
    /// applied in one compare-and-swap on the node's record and its MAC, name and BMC
    /// indexes; a lost race is retried from a fresh read, a MAC or name another node has is
    /// refused (a conflict).
    pub async fn patch_node(
        &self,
        ident: &str,
        ops: &Value,
        reset_interfaces: Option<bool>,
    ) -> Result<Node> {
        let paths: Vec<&str> = ops
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("path").and_then(Value::as_str))
            .collect();
        let message = format!("node updated: {}", paths.join(", "));
        let opts = patch::Options {
            ident,
            reset_interfaces,
        };
        let res = self
            .update(ident, |node, extra| {
                *node = patch::patch(node, ops, &opts)
                    .map_err(|e| InspectorError::invalid(e.to_string()))?;
                let seq = rand_seq() % 10_000;
                extra.push(event_op(
                    Subject::Node(node.uuid),
                    now_ms(),
                    seq,
                    "updated",
                    &message,
                    false,
                ));
                Ok(())
            })
            .await;
        let node = match res {
            Ok((node, ())) => node,
            Err(e) if e.kind == ErrorKind::Conflict => {
                return Err(self.taken(ident, ops, &opts).await?.unwrap_or(e));
            }
            Err(e) => return Err(e),
        };
        self.changed(&[node.uuid]).await;
        Ok(node)
    }

    /// Which MAC or name a refused patch wanted that another node has (Ironic's 409s).
    async fn taken(
        &self,
        ident: &str,
        ops: &Value,
        opts: &patch::Options<'_>,
    ) -> Result<Option<InspectorError>> {
        let Some(v) = self.find(ident).await? else {
            return Ok(None);
        };
        let Ok(new) = patch::patch(&v.node, ops, opts) else {
            return Ok(None);
        };
        Ok(self
            .conflict(&v.node, &new)
            .await?
            .map(|c| InspectorError::conflict(c.message())))
    }

    /// The first MAC, name or BMC address `new` has and `old` had not that another node
    /// holds (its index names another UUID).
    pub(super) async fn conflict(&self, old: &Node, new: &Node) -> Result<Option<Conflict>> {
        let held = |prefix: &str, key: String| {
            let store = self.store.clone();
            let key = format!("{prefix}{key}");
            let me = new.uuid.to_string();
            async move {
                Ok::<_, InspectorError>(
                    store
                        .get(&key)
                        .await?
                        .is_some_and(|kv| kv.value != me.as_bytes()),
                )
            }
        };
        for mac in new.macs.iter().filter(|m| !old.macs.contains(m)) {
            if held(MACS, mac.to_string()).await? {
                return Ok(Some(Conflict::Mac(*mac)));
            }
        }
        if let Some(name) = new.name.as_ref().filter(|n| old.name.as_ref() != Some(*n))
            && held(NAMES, name.clone()).await?
        {
            return Ok(Some(Conflict::Name(name.clone())));
        }
        if let Some(bmc) = real_bmc(new.bmc_address.as_deref())
            .filter(|b| real_bmc(old.bmc_address.as_deref()) != Some(*b))
            && held(BMCS, bmc.to_string()).await?
        {
            return Ok(Some(Conflict::Bmc(bmc.to_string())));
        }
        Ok(None)
    }

    /// Applies `change` to the node's current record in one CAS transaction, retrying on
    /// conflicting writes; `change` may add ops (data, events) to the same transaction.
    pub(super) async fn update<T>(
        &self,
        ident: &str,
        change: impl FnMut(&mut Node, &mut Vec<Op>) -> Result<T>,
    ) -> Result<(Node, T)> {
        self.update_fenced(ident, None, change).await
    }

    /// [`Inspector::update`] guarded by a leader's fence: the write happens only while the
    /// fence (a compare on the leader key's revision) holds.
    pub(super) async fn update_fenced<T>(
        &self,
        ident: &str,
        fence: Option<&Compare>,
        mut change: impl FnMut(&mut Node, &mut Vec<Op>) -> Result<T>,
    ) -> Result<(Node, T)> {
        for _ in 0..16 {
            let v = self
                .find(ident)
                .await?
                .ok_or_else(|| InspectorError::node_not_found(ident))?;
            let old = v.node.clone();
            let mut node = v.node;
            let mut extra = Vec::new();
            let out = change(&mut node, &mut extra)?;
            let mut txn = node_txn(&node, Some(&old), v.rev);
            txn.success.extend(extra);
            txn.compare.extend(fence.cloned());
            if self.store.txn(txn).await?.succeeded {
                return Ok((node, out));
            }
            if let Some(Compare::ModRevision { key, revision }) = fence {
                let now = self.store.get(key).await?.map_or(0, |kv| kv.mod_revision);
                if now != *revision {
                    return Err(InspectorError::of(
                        ErrorKind::NotLeader,
                        "this host is no longer the leader; the new leader does this work",
                    ));
                }
            }
            if self
                .get(&node.uuid.to_string())
                .await?
                .is_some_and(|cur| cur.rev == v.rev)
            {
                return Err(InspectorError::conflict(
                    "the change conflicts with another node's MAC, name or BMC address",
                ));
            }
        }
        Err(InspectorError::busy())
    }
}
