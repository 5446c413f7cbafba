//! The PXE filter in the appliance: keeps the kernel's nftables sets in step with the node
//! records (after every change, before the API call returns, and on a reconcile period that
//! repairs drift), and gives the DHCP server the same decision by `chaddr`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use paddock_dhcp::{Admission, ClientPolicy, MacAddr};
use paddock_firewall::{Change, Filter, Nft, diff, render_changes, render_closed};
use paddock_inspector::service::{Inspector, NodeObserver, now_ms};
use serde_json::{Value, json};

#[derive(Debug, Default)]
struct Status {
    last_sync_ms: Option<i64>,
    last_error: Option<String>,
    syncs: u64,
    drift_repaired: u64,
}

/// Each node's MACs and whether it may PXE-boot now.
type NodeIndex = std::collections::BTreeMap<uuid::Uuid, (Vec<MacAddr>, bool)>;

pub struct PxeFilter {
    /// Several hosts: the right to serve is the timed element in the kernel's `leader` set,
    /// kept alive until the tenure deadline; the static pass rule is never used.
    timed: Option<Arc<crate::leader::TenureClock>>,
    leading: AtomicBool,
    nft: Nft,
    iface: String,
    discovery: bool,
    pass: AtomicBool,
    inspector: Arc<Inspector>,
    /// Every node's MACs and whether it may PXE-boot now, kept from the changes the
    /// inspector reports and rebuilt from the store by every reconcile.
    nodes: tokio::sync::Mutex<Option<NodeIndex>>,
    applied: RwLock<Option<Filter>>,
    status: Mutex<Status>,
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl PxeFilter {
    /// Creates the table closed (nothing passes), then syncs it with the node records.
    pub async fn start(
        nft: Nft,
        iface: String,
        discovery: bool,
        inspector: Arc<Inspector>,
        pass: bool,
        timed: Option<Arc<crate::leader::TenureClock>>,
    ) -> anyhow::Result<Arc<Self>> {
        let closed = render_closed(&iface);
        let n = nft.clone();
        tokio::task::spawn_blocking(move || n.apply(&closed)).await??;
        let f = Arc::new(PxeFilter {
            leading: AtomicBool::new(pass),
            pass: AtomicBool::new(pass && timed.is_none()),
            timed,
            nft,
            iface,
            discovery,
            inspector,
            nodes: tokio::sync::Mutex::new(None),
            applied: RwLock::new(Some(Filter::default())),
            status: Mutex::new(Status::default()),
            one_at_a_time: tokio::sync::Mutex::new(()),
        });
        // The store may be out of reach for a moment (an etcd cluster electing): the table
        // stays closed and the reconcile loop catches up.
        if let Err(e) = f.reconcile().await {
            tracing::warn!(error = %e, "pxe filter: first sync failed; the table stays closed until the next");
        }
        Ok(f)
    }

    /// The desired filter. With the UUIDs of the nodes that changed, only those are read
    /// (the event path); with none, every node is (reconcile, start, unknown changes).
    async fn desired(&self, changed: &[uuid::Uuid]) -> anyhow::Result<Filter> {
        let mut index = self.nodes.lock().await;
        match (&mut *index, changed) {
            (Some(idx), [_, ..]) => {
                for uuid in changed {
                    match self
                        .inspector
                        .get(&uuid.to_string())
                        .await
                        .map_err(|e| anyhow::anyhow!("{}", e.message))?
                    {
                        Some(v) => {
                            idx.insert(*uuid, (v.node.macs.clone(), v.node.inspecting()));
                        }
                        None => {
                            idx.remove(uuid);
                        }
                    }
                }
            }
            _ => {
                let nodes = self
                    .inspector
                    .list()
                    .await
                    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
                *index = Some(
                    nodes
                        .into_iter()
                        .map(|n| {
                            let inspecting = n.inspecting();
                            (n.uuid, (n.macs, inspecting))
                        })
                        .collect(),
                );
            }
        }
        let machines = index
            .iter()
            .flatten()
            .flat_map(|(_, (macs, wanted))| macs.iter().map(move |m| (*m, *wanted)));
        Ok(Filter::from_machines(
            machines,
            self.discovery,
            self.pass.load(Ordering::SeqCst),
        ))
    }

    /// After a node change (event path, before the API call returns): the difference from
    /// what was last applied, sent as one netlink batch. No kernel read, no nft process. If
    /// it fails (someone removed the table), falls back to [`PxeFilter::reconcile`].
    pub async fn update(&self, changed: &[uuid::Uuid]) -> anyhow::Result<()> {
        let _one = self.one_at_a_time.lock().await;
        let desired = self.desired(changed).await?;
        let last = self
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(last) = last else {
            return self.reconcile_locked(desired).await;
        };
        let changes = diff(&last, &desired);
        if changes.is_empty() {
            return Ok(());
        }
        let nft = self.nft.clone();
        match tokio::task::spawn_blocking(move || nft.apply_changes(&changes)).await? {
            Ok(()) => {
                self.record_success(None);
                *self.applied.write().unwrap_or_else(|p| p.into_inner()) = Some(desired);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "pxe filter: incremental update failed; reconciling");
                self.reconcile_locked(desired).await
            }
        }
    }

    /// Brings the kernel to the desired state from what the kernel actually holds (the
    /// periodic loop): the whole table is compared, so a flushed set, a deleted rule or
    /// chain, a changed set or a deleted table is repaired. If the table cannot be read or
    /// repaired, the pass rule is removed (fail closed).
    pub async fn reconcile(&self) -> anyhow::Result<()> {
        let _one = self.one_at_a_time.lock().await;
        let desired = self.desired(&[]).await?;
        self.reconcile_locked(desired).await
    }

    /// `drift`: how the kernel's table had moved away from what was applied.
    fn record_success(&self, drift: Option<String>) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(drift) = drift {
            st.drift_repaired += 1;
            tracing::warn!(%drift, "pxe filter: the kernel's ruleset had drifted; repaired");
        }
        st.syncs += 1;
        st.last_sync_ms = Some(now_ms());
        st.last_error = None;
    }

    async fn reconcile_locked(&self, desired: Filter) -> anyhow::Result<()> {
        let nft = self.nft.clone();
        let iface = self.iface.clone();
        let last = self
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        let want = desired.clone();
        let res = tokio::task::spawn_blocking(move || nft.reconcile(&iface, &last, &want)).await?;
        match res {
            Ok(done) => {
                if done.rebuilt {
                    // The rebuilt table has an empty leader set: put this host's element
                    // back now rather than at the next refresh.
                    self.refresh_leader_element().await;
                }
                self.record_success((!done.drift.is_empty()).then(|| done.drift.to_string()));
                *self.applied.write().unwrap_or_else(|p| p.into_inner()) = Some(desired);
                Ok(())
            }
            Err(e) => {
                self.status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .last_error = Some(e.to_string());
                tracing::error!(error = %e, "pxe filter: sync failed; closing");
                self.close_now().await;
                Err(e.into())
            }
        }
    }

    async fn close_now(&self) {
        self.pass.store(false, Ordering::SeqCst);
        if self.timed.is_some() {
            self.leading.store(false, Ordering::SeqCst);
            self.drop_leader_element().await;
        }
        let nft = self.nft.clone();
        let batch = render_changes(&[Change::Pass(false)]);
        match tokio::task::spawn_blocking(move || nft.apply(&batch)).await {
            Ok(Ok(())) => {
                if let Some(f) = self
                    .applied
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                {
                    f.pass = false;
                }
            }
            Ok(Err(e)) => tracing::error!(error = %e, "pxe filter: cannot remove the pass rule"),
            Err(e) => tracing::error!(error = %e, "pxe filter: cannot remove the pass rule"),
        }
    }

    /// Gives or takes the right to serve PXE (leadership). Taking it away removes the pass
    /// rule at once, whatever else is queued.
    pub async fn set_pass(&self, pass: bool) {
        self.leading.store(pass, Ordering::SeqCst);
        if self.timed.is_some() {
            if !pass {
                self.drop_leader_element().await;
                let _one = self.one_at_a_time.lock().await;
                self.drop_leader_element().await;
                tracing::info!("pxe filter: leader element removed (not the leader)");
            } else {
                self.refresh_leader_element().await;
                tracing::info!("pxe filter: leader element in place (this host serves PXE)");
            }
            return;
        }
        if !pass {
            self.pass.store(false, Ordering::SeqCst);
            self.close_now().await;
            // A sync that was in flight may have computed its target with the pass rule;
            // once it is done, close again.
            let _one = self.one_at_a_time.lock().await;
            self.close_now().await;
            tracing::info!("pxe filter: pass rule removed (not the leader)");
            return;
        }
        let _one = self.one_at_a_time.lock().await;
        self.pass.store(true, Ordering::SeqCst);
        let nft = self.nft.clone();
        let batch = render_changes(&[Change::Pass(true)]);
        match tokio::task::spawn_blocking(move || nft.apply(&batch)).await {
            Ok(Ok(())) => {
                if let Some(f) = self
                    .applied
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                {
                    f.pass = true;
                }
                tracing::info!("pxe filter: pass rule in place (this host serves PXE)");
            }
            Ok(Err(e)) => tracing::error!(error = %e, "pxe filter: cannot add the pass rule"),
            Err(e) => tracing::error!(error = %e, "pxe filter: cannot add the pass rule"),
        }
    }

    async fn drop_leader_element(&self) {
        self.set_leader_element(None).await;
    }

    /// Gives the kernel's leader element the rest of this host's tenure to live.
    async fn refresh_leader_element(&self) {
        let Some(deadline) = self.timed.as_ref().and_then(|c| c.deadline()) else {
            return;
        };
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if self.leading.load(Ordering::SeqCst) && !left.is_zero() {
            self.set_leader_element(Some(left)).await;
        }
    }

    async fn set_leader_element(&self, timeout: Option<std::time::Duration>) {
        let (nft, iface) = (self.nft.clone(), self.iface.clone());
        let res = tokio::task::spawn_blocking(move || nft.refresh_leader(&iface, timeout)).await;
        let err = match res {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::error!(error = %err, removing = timeout.is_none(), "pxe filter: cannot set the leader element");
    }

    /// Several hosts: refreshes the leader element every 200 ms while this host leads. If
    /// this process dies, the element expires by itself at the tenure deadline.
    pub async fn keep_leader_element(self: Arc<Self>) {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
        loop {
            tick.tick().await;
            if self.leading.load(Ordering::SeqCst) {
                self.refresh_leader_element().await;
            }
        }
    }

    /// Fail closed: removes the pass rule (SIGTERM, losing the right to serve PXE).
    pub async fn close(&self) {
        let _one = self.one_at_a_time.lock().await;
        self.close_now().await;
        tracing::info!("pxe filter: closed (pass rule removed)");
    }

    pub fn status(&self) -> Value {
        let st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let applied = self
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        json!({
            "interface": self.iface,
            "discovery": applied.discovery,
            "pass": self.serves(&applied),
            "pass_kind": if self.timed.is_some() { "leader element (timed, several hosts)" } else { "static rule (one host)" },
            "allow": applied.allow.iter().map(MacAddr::to_string).collect::<Vec<_>>(),
            "deny": applied.deny.iter().map(MacAddr::to_string).collect::<Vec<_>>(),
            "last_sync_ms": st.last_sync_ms,
            "last_error": st.last_error,
            "syncs": st.syncs,
            "drift_repaired": st.drift_repaired,
        })
    }

    /// The DHCP-level decision by `chaddr` (relayed requests arrive from the relay's MAC).
    pub fn admits(&self, mac: MacAddr) -> bool {
        self.applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|f| f.admits_if(mac, self.serves(f)))
    }

    /// Whether this host serves PXE now: the leader element's holder (several hosts), else
    /// the applied pass rule, unless closing has taken it away: a close that could not
    /// reach the kernel (nft failing) still closes the DHCP side.
    fn serves(&self, applied: &Filter) -> bool {
        if self.timed.is_some() {
            self.leading.load(Ordering::SeqCst)
        } else {
            applied.pass && self.pass.load(Ordering::SeqCst)
        }
    }
}

impl NodeObserver for PxeFilter {
    fn nodes_changed<'a>(
        &'a self,
        changed: &'a [uuid::Uuid],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            if let Err(e) = self.update(changed).await {
                tracing::error!(error = %e, "pxe filter: update after a node change failed");
            }
        })
    }
}

/// The DHCP admission: the configured deny list, then the PXE filter when it is on.
pub struct Admit {
    pub deny: std::collections::BTreeSet<MacAddr>,
    pub filter: Option<Arc<PxeFilter>>,
    /// Several hosts: only the leader answers.
    pub leader: Option<crate::leader::LeaderRx>,
}

impl ClientPolicy for Admit {
    fn admit(&self, mac: MacAddr) -> Admission {
        let leads = self.leader.as_ref().is_none_or(|l| l.borrow().is_some());
        let ok = leads
            && !self.deny.contains(&mac)
            && self.filter.as_ref().is_none_or(|f| f.admits(mac));
        if ok {
            Admission::Serve
        } else {
            Admission::Ignore
        }
    }
}
