//! The PXE filter in the appliance: keeps the kernel's nftables sets in step with the node
//! records (after every change, before the API call returns, and on a reconcile period that
//! repairs drift) and the provisioning records (followed by a watch on `provisioning/`), and
//! gives the DHCP server the same decision by `chaddr`. A node may PXE-boot while it is under
//! introspection or its provisioning state serves a ramdisk mode (birth, rebirth, clean):
//! [`may_pxe_boot`], pure.
//!
//! A failed sync closes the filter ([`Health`]); a task retries with back-off (0.5 s, 1 s,
//! 2 s … up to [`RETRY_CAP`]) besides the periodic reconcile, and the first whole-table
//! reconcile that succeeds gives the right to serve back to a host that may still serve.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use paddock_birther::{Provisioning, Serve};
use paddock_dhcp::{Admission, ClientPolicy};
use paddock_firewall::{
    Change, Filter, Health, Nft, diff, leader_element, render_changes, render_closed,
};
use paddock_inspector::service::{Inspector, NodeObserver, Reaction};
use paddock_inventory::MacAddr;
use paddock_wire::unix_ms as now_ms;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The longest wait between attempts to reopen after an error: the longest reconcile period
/// the configuration allows (the periodic reconcile, at its own period, tries too).
pub const RETRY_CAP: Duration = Duration::from_secs(15);

#[derive(Debug, Default)]
struct Status {
    last_sync_ms: Option<i64>,
    last_error: Option<String>,
    syncs: u64,
    drift_repaired: u64,
}

/// What `GET /api/v1/firewall` answers while the filter is on (and what `/ui/firewall` and
/// `paddock firewall status` show).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterStatus {
    pub interface: String,
    /// `serving`, or why not, for people.
    pub state: String,
    pub closed_after_error: Option<ClosedAfterError>,
    /// Unknown MACs may boot the discovery ramdisk.
    pub discovery: bool,
    /// This host answers PXE now.
    pub pass: bool,
    pub pass_kind: String,
    pub allow: Vec<MacAddr>,
    pub deny: Vec<MacAddr>,
    /// Unix ms.
    pub last_sync_ms: Option<i64>,
    pub last_error: Option<String>,
    pub syncs: u64,
    pub drift_repaired: u64,
}

/// The filter is closed after an error: since when, how often it failed, the next attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedAfterError {
    pub error: String,
    pub since_ms: i64,
    pub attempts: u32,
    pub next_retry_ms: i64,
}

/// The whole answer of `GET /api/v1/firewall`: the status, or `{"enabled": false}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FirewallAnswer {
    On(Box<FilterStatus>),
    Off { enabled: bool },
}

/// Whether a node may PXE-boot now: under introspection (the discovery ramdisk), or its
/// provisioning record serves a ramdisk mode (birth, rebirth, clean: the ramdisk must boot to
/// run it). Any other known node (idle, provisioned, failed) is refused, as before
/// provisioning.
pub fn may_pxe_boot(inspecting: bool, provisioning: Option<&Serve>) -> bool {
    inspecting || provisioning.is_some_and(|s| s.ramdisk_mode().is_some())
}

/// What the filter knows of every node: its MACs and whether it is under introspection,
/// and what its provisioning record serves (only nodes that have one).
#[derive(Debug, Default)]
struct NodeIndex {
    nodes: std::collections::BTreeMap<uuid::Uuid, (Vec<MacAddr>, bool)>,
    provisioning: std::collections::BTreeMap<uuid::Uuid, Serve>,
}

impl NodeIndex {
    /// Every known MAC and whether it may PXE-boot.
    fn machines(&self) -> impl Iterator<Item = (MacAddr, bool)> + '_ {
        self.nodes.iter().flat_map(|(uuid, (macs, inspecting))| {
            let allowed = may_pxe_boot(*inspecting, self.provisioning.get(uuid));
            macs.iter().map(move |m| (*m, allowed))
        })
    }
}

/// What changed since the filter last looked.
enum Changed<'a> {
    /// Not known: read everything.
    All,
    /// These nodes' records (read them).
    Nodes(&'a [uuid::Uuid]),
    /// These nodes' provisioning records, as the watch delivered them (`None`: deleted).
    Provisioning(&'a [(uuid::Uuid, Option<Serve>)]),
}

/// A provisioning record's key and value as the watch delivers them: the node, and what the
/// record serves (`None`: deleted or unreadable, so no ramdisk mode).
fn provisioning_change(key: &str, value: Option<&[u8]>) -> Option<(uuid::Uuid, Option<Serve>)> {
    let uuid = key
        .strip_prefix(crate::provisioning::PREFIX)?
        .parse()
        .ok()?;
    let serve = value.and_then(|v| match serde_json::from_slice::<Provisioning>(v) {
        Ok(p) => Some(p.serve()),
        Err(e) => {
            tracing::warn!(%key, error = %e, "pxe filter: unreadable provisioning record (no ramdisk mode)");
            None
        }
    });
    Some((uuid, serve))
}

pub struct PxeFilter {
    /// Several hosts: the right to serve is the timed element in the kernel's `leader` set,
    /// kept alive until the tenure deadline; the static pass rule is never used.
    timed: Option<Arc<crate::leader::TenureClock>>,
    /// Leadership says this host may serve PXE (one host: always).
    leading: AtomicBool,
    /// Closed for good ([`PxeFilter::close`], SIGTERM): nothing reopens it.
    stopped: AtomicBool,
    /// Serving, or closed after an error until a reconcile succeeds (the retry task
    /// watches it).
    health: watch::Sender<Health>,
    /// Held around deciding on and setting (or removing) the leader element: a refresh
    /// that decided before an error or a step-down lands before the removal, never after.
    element: tokio::sync::Mutex<()>,
    nft: Nft,
    iface: String,
    discovery: bool,
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
            stopped: AtomicBool::new(false),
            health: watch::Sender::new(Health::Serving),
            element: tokio::sync::Mutex::new(()),
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
        tokio::spawn(retry_while_closed(Arc::downgrade(&f), f.health.subscribe()));
        tokio::spawn(follow_provisioning(Arc::downgrade(&f)));
        // The store may be out of reach for a moment (an etcd cluster electing): the table
        // stays closed and the reconcile loop catches up.
        if let Err(e) = f.reconcile().await {
            tracing::warn!(error = %e, "pxe filter: first sync failed; the table stays closed until a sync succeeds");
        }
        Ok(f)
    }

    /// This host may serve PXE as far as leadership and shutdown go (errors aside).
    fn entitled(&self) -> bool {
        self.leading.load(Ordering::SeqCst) && !self.stopped.load(Ordering::SeqCst)
    }

    /// Whether a sync renders the static pass rule (one host): see
    /// [`Health::renders_pass`]; `whole_table` for a reconcile.
    fn wanted_pass(&self, whole_table: bool) -> bool {
        self.timed.is_none()
            && self
                .health
                .borrow()
                .renders_pass(self.entitled(), whole_table)
    }

    /// The desired filter. With the nodes that changed, only those are read (the event
    /// path; a provisioning change reads nothing, the watch brought it); with
    /// [`Changed::All`], every node and provisioning record is (reconcile, start, unknown
    /// changes). `whole_table`: for a reconcile (which may reopen after an error).
    async fn desired(&self, changed: Changed<'_>, whole_table: bool) -> anyhow::Result<Filter> {
        let mut index = self.nodes.lock().await;
        match (&mut *index, changed) {
            (Some(idx), Changed::Nodes(uuids)) if !uuids.is_empty() => {
                for uuid in uuids {
                    match self
                        .inspector
                        .get(&uuid.to_string())
                        .await
                        .map_err(|e| anyhow::anyhow!("{}", e.message))?
                    {
                        Some(v) => {
                            idx.nodes
                                .insert(*uuid, (v.node.macs.clone(), v.node.inspecting()));
                        }
                        None => {
                            idx.nodes.remove(uuid);
                        }
                    }
                }
            }
            (Some(idx), Changed::Provisioning(records)) => {
                for (uuid, serve) in records {
                    match serve {
                        Some(s) => {
                            idx.provisioning.insert(*uuid, s.clone());
                        }
                        None => {
                            idx.provisioning.remove(uuid);
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
                let records = self
                    .inspector
                    .store()
                    .range(crate::provisioning::PREFIX)
                    .await?;
                *index = Some(NodeIndex {
                    nodes: nodes
                        .into_iter()
                        .map(|n| {
                            let inspecting = n.inspecting();
                            (n.uuid, (n.macs, inspecting))
                        })
                        .collect(),
                    provisioning: records
                        .iter()
                        .filter_map(|kv| provisioning_change(&kv.key, Some(&kv.value)))
                        .filter_map(|(uuid, serve)| Some((uuid, serve?)))
                        .collect(),
                });
            }
        }
        Ok(Filter::from_machines(
            index.iter().flat_map(NodeIndex::machines),
            self.discovery,
            self.wanted_pass(whole_table),
        ))
    }

    /// After a node change (event path, before the API call returns): the difference from
    /// what was last applied, sent as one netlink batch. No kernel read, no nft process. If
    /// it fails (someone removed the table), falls back to [`PxeFilter::reconcile`].
    pub async fn update(&self, changed: &[uuid::Uuid]) -> anyhow::Result<()> {
        let changed = if changed.is_empty() {
            Changed::All
        } else {
            Changed::Nodes(changed)
        };
        self.update_with(changed).await
    }

    /// After provisioning records changed (the watch on `provisioning/`): as
    /// [`PxeFilter::update`], with what the records now serve.
    pub async fn provisioning_changed(
        &self,
        records: &[(uuid::Uuid, Option<Serve>)],
    ) -> anyhow::Result<()> {
        self.update_with(Changed::Provisioning(records)).await
    }

    async fn update_with(&self, changed: Changed<'_>) -> anyhow::Result<()> {
        let _one = self.one_at_a_time.lock().await;
        let mut desired = self.desired(changed, false).await?;
        let last = self
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(last) = last else {
            desired.pass = self.wanted_pass(true);
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
                desired.pass = self.wanted_pass(true);
                self.reconcile_locked(desired).await
            }
        }
    }

    /// Brings the kernel to the desired state from what the kernel actually holds (the
    /// periodic loop): the whole table is compared, so a flushed set, a deleted rule or
    /// chain, a changed set or a deleted table is repaired. If the table cannot be read or
    /// repaired, the pass rule is removed (fail closed) until a reconcile succeeds.
    pub async fn reconcile(&self) -> anyhow::Result<()> {
        let _one = self.one_at_a_time.lock().await;
        let desired = match self.desired(Changed::All, true).await {
            Ok(d) => d,
            Err(e) => {
                // Closed already: an attempt to reopen that failed (counted, so the
                // retries keep backing off). Serving: the table stays as last applied.
                if !self.health.borrow().is_serving() {
                    self.failed(&e.to_string());
                }
                return Err(e);
            }
        };
        self.reconcile_locked(desired).await
    }

    /// Records a failed sync; returns whether it closed the filter (logged here, once).
    fn failed(&self, error: &str) -> bool {
        let mut closed = false;
        self.health.send_modify(|h| {
            closed = h.failed(error, Instant::now(), now_ms());
        });
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error = Some(error.to_string());
        if closed {
            tracing::error!(%error, "pxe filter: closed after an error; retrying until a reconcile succeeds");
        } else {
            let attempts = self.health.borrow().closed().map_or(0, |c| c.attempts);
            tracing::debug!(%error, attempts, "pxe filter: still closed after an error");
        }
        closed
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
        // An incremental update does not end a closure after an error.
        if self.health.borrow().is_serving() {
            st.last_error = None;
        }
    }

    async fn reconcile_locked(&self, desired: Filter) -> anyhow::Result<()> {
        let nft = self.nft.clone();
        let iface = self.iface.clone();
        let last = self.applied();
        let want = desired.clone();
        let res =
            match tokio::task::spawn_blocking(move || nft.reconcile(&iface, &last, &want)).await {
                Ok(r) => r.map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::anyhow!("the reconcile task failed: {e}")),
            };
        match res {
            Ok(done) => {
                *self.applied.write().unwrap_or_else(|p| p.into_inner()) = Some(desired);
                let mut reopened = None;
                self.health.send_if_modified(|h| {
                    reopened = h.succeeded();
                    reopened.is_some()
                });
                self.record_success((!done.drift.is_empty()).then(|| done.drift.to_string()));
                if done.rebuilt || reopened.is_some() {
                    // The rebuilt table has an empty leader set, and after an error the
                    // element was removed: put it back now (if this host still leads on a
                    // live tenure) rather than at the next refresh.
                    self.refresh_leader_element().await;
                }
                if let Some(c) = reopened {
                    let serves = self.serves(&self.applied());
                    tracing::info!(
                        serves,
                        attempts = c.attempts,
                        closed_for_ms = now_ms() - c.since_ms,
                        "pxe filter: a reconcile succeeded after an error; {}",
                        if serves {
                            "serving PXE again"
                        } else {
                            "not serving (this host may not serve PXE)"
                        }
                    );
                }
                Ok(())
            }
            Err(e) => {
                let closed = self.failed(&e.to_string());
                // Retries only repeat the removal if the last one did not take.
                if closed || self.applied().pass {
                    self.close_now(closed).await;
                }
                Err(e)
            }
        }
    }

    /// Removes the right to serve from the kernel: the static pass rule, and with several
    /// hosts the leader element. The caller has already taken it away in memory (health,
    /// leadership or shutdown), so nothing puts it back meanwhile. `loud`: a failure to
    /// remove it is an error worth a log line (not when a retry repeats the removal).
    async fn close_now(&self, loud: bool) {
        if self.timed.is_some() {
            self.drop_leader_element().await;
        }
        let Err(error) = self.apply_pass(false).await else {
            return;
        };
        if loud {
            tracing::error!(%error, "pxe filter: cannot remove the pass rule");
        } else {
            tracing::debug!(%error, "pxe filter: still cannot remove the pass rule");
        }
    }

    /// Gives or takes the right to serve PXE (leadership). Taking it away removes the pass
    /// rule at once, whatever else is queued. Given while closed after an error, it takes
    /// effect with the next reconcile that succeeds.
    pub async fn set_pass(&self, pass: bool) {
        if pass && self.stopped.load(Ordering::SeqCst) {
            return;
        }
        self.leading.store(pass, Ordering::SeqCst);
        let closed = !self.health.borrow().is_serving();
        if self.timed.is_some() {
            if !pass {
                self.drop_leader_element().await;
                let _one = self.one_at_a_time.lock().await;
                self.drop_leader_element().await;
                tracing::info!("pxe filter: leader element removed (not the leader)");
            } else if closed {
                tracing::info!(
                    "pxe filter: this host leads; its leader element returns once a reconcile succeeds after the error"
                );
            } else {
                self.refresh_leader_element().await;
                tracing::info!("pxe filter: leader element in place (this host serves PXE)");
            }
            return;
        }
        if !pass {
            self.close_now(true).await;
            // A sync that was in flight may have computed its target with the pass rule;
            // once it is done, close again.
            let _one = self.one_at_a_time.lock().await;
            self.close_now(true).await;
            tracing::info!("pxe filter: pass rule removed (not the leader)");
            return;
        }
        let _one = self.one_at_a_time.lock().await;
        if !self.health.borrow().is_serving() {
            tracing::info!(
                "pxe filter: this host leads; its pass rule returns once a reconcile succeeds after the error"
            );
            return;
        }
        match self.apply_pass(true).await {
            Ok(()) => tracing::info!("pxe filter: pass rule in place (this host serves PXE)"),
            Err(error) => tracing::error!(%error, "pxe filter: cannot add the pass rule"),
        }
    }

    /// Adds or removes the pass rule in the kernel, and records it as applied.
    async fn apply_pass(&self, pass: bool) -> anyhow::Result<()> {
        let nft = self.nft.clone();
        let batch = render_changes(&[Change::Pass(pass)]);
        match tokio::task::spawn_blocking(move || nft.apply(&batch)).await {
            Ok(Ok(())) => {
                if let Some(f) = self
                    .applied
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                {
                    f.pass = pass;
                }
                Ok(())
            }
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(e.into()),
        }
    }

    async fn drop_leader_element(&self) {
        let _element = self.element.lock().await;
        self.set_leader_element(None).await;
    }

    /// Gives the kernel's leader element the rest of this host's tenure to live, if this
    /// host may hold it ([`leader_element`]: leading, a live tenure, not closed after an
    /// error).
    async fn refresh_leader_element(&self) {
        let Some(clock) = &self.timed else {
            return;
        };
        let _element = self.element.lock().await;
        let left = clock
            .deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        let timeout = leader_element(&self.health.borrow(), self.entitled(), left);
        if timeout.is_some() {
            self.set_leader_element(timeout).await;
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

    /// Fail closed for good: removes the pass rule (SIGTERM); nothing reopens it.
    pub async fn close(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.leading.store(false, Ordering::SeqCst);
        let _one = self.one_at_a_time.lock().await;
        self.close_now(true).await;
        tracing::info!("pxe filter: closed (pass rule removed)");
    }

    /// What was last applied (nothing yet: the closed table).
    fn applied(&self) -> Filter {
        self.applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    }

    pub fn status(&self) -> FilterStatus {
        let st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let applied = self.applied();
        let health = self.health.borrow().clone();
        let state = match health.closed() {
            Some(c) => format!(
                "closed after an error: {}, since {} UTC, retrying",
                c.error,
                paddock_inspector::node::iso(c.since_ms / 1000)
            ),
            None if self.stopped.load(Ordering::SeqCst) => "closed: shutting down".into(),
            None if !self.entitled() => "not serving: another host leads".into(),
            None => "serving".into(),
        };
        let closed_after_error = health.closed().map(|c| {
            let retry = health
                .next_retry(Instant::now(), RETRY_CAP)
                .unwrap_or_default();
            ClosedAfterError {
                error: c.error.clone(),
                since_ms: c.since_ms,
                attempts: c.attempts,
                next_retry_ms: now_ms()
                    .saturating_add(i64::try_from(retry.as_millis()).unwrap_or(i64::MAX)),
            }
        });
        FilterStatus {
            interface: self.iface.clone(),
            state,
            closed_after_error,
            discovery: applied.discovery,
            pass: self.serves(&applied),
            pass_kind: if self.timed.is_some() {
                "leader element (timed, several hosts)"
            } else {
                "static rule (one host)"
            }
            .into(),
            allow: applied.allow.iter().copied().collect(),
            deny: applied.deny.iter().copied().collect(),
            last_sync_ms: st.last_sync_ms,
            last_error: st.last_error.clone(),
            syncs: st.syncs,
            drift_repaired: st.drift_repaired,
        }
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
    /// the applied pass rule; never while closed after an error or for leadership or
    /// shutdown: a close that could not reach the kernel (nft failing) still closes the
    /// DHCP side.
    fn serves(&self, applied: &Filter) -> bool {
        let may = self.health.borrow().may_serve(self.entitled());
        may && (self.timed.is_some() || applied.pass)
    }
}

impl NodeObserver for PxeFilter {
    fn nodes_changed<'a>(
        &'a self,
        changed: paddock_inspector::service::Changed<'a>,
    ) -> Reaction<'a> {
        let changed = match changed {
            paddock_inspector::service::Changed::All => Changed::All,
            paddock_inspector::service::Changed::Nodes(n) => Changed::Nodes(n),
        };
        Box::pin(async move {
            if let Err(e) = self.update_with(changed).await {
                tracing::error!(error = %e, "pxe filter: update after a node change failed");
            }
        })
    }
}

/// While the filter is closed after an error, attempts to reopen it on the back-off
/// schedule ([`Health::next_retry`]); ends with the filter or its shutdown. Every outcome
/// lands in the health (a failure pushes the next attempt further out), and the
/// transitions are logged where they happen, not here.
async fn retry_while_closed(filter: Weak<PxeFilter>, mut health: watch::Receiver<Health>) {
    loop {
        let wait = health
            .borrow_and_update()
            .next_retry(Instant::now(), RETRY_CAP);
        let Some(wait) = wait else {
            if health.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = health.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        }
        let Some(f) = filter.upgrade() else {
            return;
        };
        if f.stopped.load(Ordering::SeqCst) {
            return;
        }
        let _ = f.reconcile().await;
    }
}

/// Keeps the filter in step with the provisioning records, whichever host changed them: a
/// watch on `provisioning/` (bursts folded into one update); after the watch starts (and
/// after it ends, as it does when it falls behind), one whole update catches what happened
/// before. Ends with the filter.
async fn follow_provisioning(filter: Weak<PxeFilter>) {
    loop {
        let Some(store) = filter.upgrade().map(|f| f.inspector.store().clone()) else {
            return;
        };
        let mut w = match store.watch(crate::provisioning::PREFIX, 0).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "pxe filter: cannot watch provisioning records; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        drop(store);
        match filter.upgrade() {
            Some(f) => {
                if let Err(e) = f.update(&[]).await {
                    tracing::warn!(error = %e, "pxe filter: update failed");
                }
            }
            None => return,
        }
        loop {
            let first = match w.next().await {
                Some(Ok(ev)) => ev,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pxe filter: provisioning watch ended; watching again");
                    break;
                }
                None => break,
            };
            // Fold a burst: whatever else is already queued.
            let mut events = vec![first];
            while let Ok(Some(Ok(ev))) =
                tokio::time::timeout(Duration::from_millis(5), w.next()).await
            {
                events.push(ev);
            }
            let records: Vec<_> = events
                .iter()
                .filter_map(|ev| {
                    let value = matches!(ev.kind, paddock_store::EventKind::Put)
                        .then_some(ev.kv.value.as_slice());
                    provisioning_change(&ev.kv.key, value)
                })
                .collect();
            let Some(f) = filter.upgrade() else {
                return;
            };
            if let Err(e) = f.provisioning_changed(&records).await {
                tracing::warn!(error = %e, "pxe filter: update after a provisioning change failed");
            }
        }
    }
}

impl Admit {
    fn leads(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.borrow().is_some())
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
    fn admit_unidentified(&self) -> Admission {
        if self.leads() {
            Admission::Serve
        } else {
            Admission::Ignore
        }
    }

    fn admit(&self, mac: MacAddr) -> Admission {
        let ok = self.leads()
            && !self.deny.contains(&mac)
            && self.filter.as_ref().is_none_or(|f| f.admits(mac));
        if ok {
            Admission::Serve
        } else {
            Admission::Ignore
        }
    }
}

#[derive(Clone, Debug)]
pub struct FirewallConfig {
    pub interface: String,
    pub discovery: bool,
    pub reconcile: Duration,
}

/// Starts the filter on `fw.interface` and the work that keeps it true: the pass rule
/// follows leadership, the leader's element follows its tenure, changes made through other
/// hosts arrive through the store, and a periodic reconcile repairs drift.
pub async fn start_filter(
    rt: &mut crate::runtime::Runtime,
    fw: &FirewallConfig,
    inspector: Arc<Inspector>,
    tenure: Option<Arc<crate::leader::TenureClock>>,
) -> anyhow::Result<Arc<PxeFilter>> {
    use anyhow::Context as _;
    let leader = rt.context().leader.clone();
    let clustered = tenure.is_some();
    // Read on its own line: a borrow in the call's arguments would hold the watch's read lock
    // across the await below, and the elector's first send would then wait on it while the
    // tasks it blocks are the ones that await needs.
    let leads = leader.borrow().is_some();
    let f = PxeFilter::start(
        Nft::local(),
        fw.interface.clone(),
        fw.discovery,
        inspector,
        leads,
        tenure,
    )
    .await
    .context("starting the PXE filter (nftables)")?;
    if clustered {
        let kf = f.clone();
        rt.spawn_future("pxe filter: leader element", async move {
            kf.keep_leader_element().await;
            Ok(())
        });
        let wf = f.clone();
        rt.spawn(
            "pxe filter: node watch",
            crate::runtime::Policy::Restart,
            move |ctx| {
                let wf = wf.clone();
                async move {
                    crate::runtime::until_cancelled(ctx.cancel, follow_nodes(ctx.store, wf)).await;
                    Ok(())
                }
            },
        );
    }
    let (lf, mut lrx) = (f.clone(), leader);
    rt.spawn_future("pxe filter: pass rule", async move {
        while lrx.changed().await.is_ok() {
            let leads = lrx.borrow_and_update().is_some();
            lf.set_pass(leads).await;
        }
        // One host: leadership never changes (the sender is gone).
        std::future::pending::<()>().await;
        Ok(())
    });
    let r = f.clone();
    rt.every("pxe filter: reconcile", fw.reconcile, move || {
        let r = r.clone();
        async move {
            if let Err(e) = r.reconcile().await {
                tracing::error!(error = %e, "pxe filter: reconcile failed");
            }
        }
    });
    tracing::info!(interface = %fw.interface, discovery = fw.discovery, "pxe filter: on");
    Ok(f)
}

/// Keeps this host's filter sets in step with node changes made through any host: every
/// change under `nodes/` triggers an update (bursts are folded into one).
async fn follow_nodes(store: Arc<dyn paddock_store::Store>, filter: Arc<PxeFilter>) {
    loop {
        let mut w = match store.watch("nodes/", 0).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "pxe filter: cannot watch nodes; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Changes that happened before the watch started are caught by this full update.
        if let Err(e) = filter.update(&[]).await {
            tracing::warn!(error = %e, "pxe filter: update failed");
        }
        loop {
            match w.next().await {
                Some(Ok(first)) => {
                    // Fold a burst: take whatever else is already queued; read only the
                    // nodes that changed.
                    let mut keys = vec![first.kv.key];
                    while let Ok(Some(Ok(ev))) =
                        tokio::time::timeout(Duration::from_millis(5), w.next()).await
                    {
                        keys.push(ev.kv.key);
                    }
                    let uuids: Vec<uuid::Uuid> = keys
                        .iter()
                        .filter_map(|k| k.strip_prefix("nodes/")?.parse().ok())
                        .collect();
                    if let Err(e) = filter.update(&uuids).await {
                        tracing::warn!(error = %e, "pxe filter: update failed");
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pxe filter: node watch ended; watching again");
                    break;
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_birther::{Operation, State, Step, state::Run};

    fn record(state: State) -> Provisioning {
        Provisioning {
            state,
            since_ms: 0,
            updated_ms: 0,
            started_ms: None,
        }
    }

    fn run(image: &str) -> Run {
        Run {
            image: image.into(),
            previous_image: None,
            last_step: None,
            synced: false,
        }
    }

    /// Who may PXE-boot: under introspection, or a ramdisk mode to run; nobody else.
    #[test]
    fn who_may_pxe_boot() {
        let states = [
            (None, false),
            (Some(State::Unknown), false),
            (Some(State::Birth(run("a"))), true),
            (Some(State::Rebirth(run("b"))), true),
            (Some(State::Clean { last_step: None }), true),
            (Some(State::Healthy { image: "a".into() }), false),
            (
                Some(State::Error {
                    operation: Operation::Birth,
                    step: Step::Partition,
                    message: "no disk".into(),
                    image: Some("a".into()),
                }),
                false,
            ),
        ];
        for (state, ramdisk) in states {
            let serve = state.map(|s| record(s).serve());
            assert_eq!(may_pxe_boot(false, serve.as_ref()), ramdisk, "{serve:?}");
            assert!(
                may_pxe_boot(true, serve.as_ref()),
                "introspection: {serve:?}"
            );
        }
    }

    #[test]
    fn the_index_admits_each_nodes_macs() {
        let mac = |s: &str| s.parse::<MacAddr>().unwrap();
        let u = uuid::Uuid::from_u128;
        let mut idx = NodeIndex::default();
        idx.nodes.insert(
            u(1),
            (
                vec![mac("52:54:00:00:00:01"), mac("52:54:00:00:00:02")],
                false,
            ),
        );
        idx.nodes
            .insert(u(2), (vec![mac("52:54:00:00:00:03")], true));
        idx.nodes
            .insert(u(3), (vec![mac("52:54:00:00:00:04")], false));
        // A record for a node that is gone admits nothing.
        idx.provisioning
            .insert(u(9), record(State::Birth(run("a"))).serve());
        let got: Vec<_> = idx.machines().map(|(m, a)| (m.to_string(), a)).collect();
        let want = |a: bool| {
            vec![
                ("52:54:00:00:00:01".to_string(), a),
                ("52:54:00:00:00:02".to_string(), a),
                ("52:54:00:00:00:03".to_string(), true),
                ("52:54:00:00:00:04".to_string(), false),
            ]
        };
        assert_eq!(got, want(false));
        idx.provisioning
            .insert(u(1), record(State::Birth(run("a"))).serve());
        let got: Vec<_> = idx.machines().map(|(m, a)| (m.to_string(), a)).collect();
        assert_eq!(got, want(true), "in birth: both MACs admitted");
        idx.provisioning
            .insert(u(1), record(State::Healthy { image: "a".into() }).serve());
        let got: Vec<_> = idx.machines().map(|(m, a)| (m.to_string(), a)).collect();
        assert_eq!(got, want(false), "healthy: refused again");
    }

    #[test]
    fn provisioning_changes_from_the_watch() {
        let u = uuid::Uuid::from_u128(7);
        let key = format!("provisioning/{u}");
        let birth = serde_json::to_vec(&record(State::Birth(run("a")))).unwrap();
        assert_eq!(
            provisioning_change(&key, Some(&birth)),
            Some((u, Some(Serve::BirthRamdisk { image: "a".into() })))
        );
        assert_eq!(provisioning_change(&key, None), Some((u, None)), "deleted");
        assert_eq!(
            provisioning_change(&key, Some(b"{not json")),
            Some((u, None)),
            "unreadable: no ramdisk mode"
        );
        assert_eq!(provisioning_change("provisioning/x", Some(&birth)), None);
        assert_eq!(
            provisioning_change(&format!("provisioning-rules/{u}"), None),
            None
        );
    }
}
