//! The PXE filter in the appliance: keeps the kernel's nftables sets in step with the node
//! records (after every change, before the API call returns, and on a reconcile period that
//! repairs drift), and gives the DHCP server the same decision by `chaddr`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use paddock_dhcp::{Admission, ClientPolicy, MacAddr};
use paddock_firewall::{Change, Filter, Nft, diff, render_changes, render_closed, render_full};
use paddock_inspector::service::{Inspector, NodeObserver, now_ms};
use serde_json::{Value, json};

#[derive(Debug, Default)]
struct Status {
    last_sync_ms: Option<i64>,
    last_error: Option<String>,
    syncs: u64,
    drift_repaired: u64,
}

pub struct PxeFilter {
    nft: Nft,
    iface: String,
    discovery: bool,
    pass: AtomicBool,
    inspector: Arc<Inspector>,
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
    ) -> anyhow::Result<Arc<Self>> {
        let closed = render_closed(&iface);
        let n = nft.clone();
        tokio::task::spawn_blocking(move || n.apply(&closed)).await??;
        let f = Arc::new(PxeFilter {
            nft,
            iface,
            discovery,
            pass: AtomicBool::new(true),
            inspector,
            applied: RwLock::new(Some(Filter::default())),
            status: Mutex::new(Status::default()),
            one_at_a_time: tokio::sync::Mutex::new(()),
        });
        f.reconcile().await?;
        Ok(f)
    }

    async fn desired(&self) -> anyhow::Result<Filter> {
        let nodes = self
            .inspector
            .list()
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let machines = nodes
            .iter()
            .flat_map(|n| n.macs.iter().map(move |m| (*m, n.inspecting())));
        Ok(Filter::from_machines(
            machines,
            self.discovery,
            self.pass.load(Ordering::SeqCst),
        ))
    }

    /// After a node change (event path, before the API call returns): the difference from
    /// what was last applied, sent as one netlink batch. No kernel read, no nft process. If
    /// it fails (someone removed the table), falls back to [`PxeFilter::reconcile`].
    pub async fn update(&self) -> anyhow::Result<()> {
        let _one = self.one_at_a_time.lock().await;
        let desired = self.desired().await?;
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
                self.record_success(false);
                *self.applied.write().unwrap_or_else(|p| p.into_inner()) = Some(desired);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "pxe filter: incremental update failed; reconciling");
                self.reconcile_locked(desired).await
            }
        }
    }

    /// Brings the kernel to the desired state from what the kernel actually holds, so a
    /// flushed set or a deleted table is repaired too (the periodic loop). On failure the
    /// pass rule is removed.
    pub async fn reconcile(&self) -> anyhow::Result<()> {
        let _one = self.one_at_a_time.lock().await;
        let desired = self.desired().await?;
        self.reconcile_locked(desired).await
    }

    fn record_success(&self, drift: bool) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if drift {
            st.drift_repaired += 1;
            tracing::warn!("pxe filter: the kernel's ruleset had drifted; repaired");
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
            .clone();
        let want = desired.clone();
        let res =
            tokio::task::spawn_blocking(move || -> Result<bool, paddock_firewall::NftError> {
                let current = nft.read()?;
                let drift = current.as_ref() != last.as_ref();
                match current {
                    None => nft.apply(&render_full(&iface, &want))?,
                    Some(cur) => {
                        let changes = diff(&cur, &want);
                        if !changes.is_empty() {
                            nft.apply_changes(&changes)?;
                        }
                    }
                }
                Ok(drift)
            })
            .await?;
        match res {
            Ok(drift) => {
                self.record_success(drift);
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
            "pass": applied.pass,
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
            .is_some_and(|f| f.admits(mac))
    }
}

impl NodeObserver for PxeFilter {
    fn nodes_changed(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(e) = self.update().await {
                tracing::error!(error = %e, "pxe filter: update after a node change failed");
            }
        })
    }
}

/// The DHCP admission: the configured deny list, then the PXE filter when it is on.
pub struct Admit {
    pub deny: std::collections::BTreeSet<MacAddr>,
    pub filter: Option<Arc<PxeFilter>>,
}

impl ClientPolicy for Admit {
    fn admit(&self, mac: MacAddr) -> Admission {
        let ok = !self.deny.contains(&mac) && self.filter.as_ref().is_none_or(|f| f.admits(mac));
        if ok {
            Admission::Serve
        } else {
            Admission::Ignore
        }
    }
}
