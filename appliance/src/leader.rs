//! Leadership of the appliance: one host (the leader) holds the PXE pass rule, answers DHCP
//! and runs the singleton tasks. A host alone always leads ([`Leadership::Sole`]); among
//! several, the elector campaigns with a store lease and publishes
//! `Some(Leadership::Elected(_))` while this host leads, `None` otherwise.
//!
//! Stepping down never waits on the store: a checker compares the clock with the
//! [`Tenure`] deadline (last keep-alive *sent* + TTL − margin) every 50 ms and publishes
//! `None` the moment it passes, so a partitioned leader stops leader work before etcd can
//! expire its lease and elect another. Subscribers react to `None` by removing the pass
//! rule first (`PxeFilter::set_pass`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use paddock_store::election::{Election, Leader, Tenure};
use paddock_store::{Compare, Store, StoreError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Why this host may do leader work now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// The only host (embedded store): it always leads, and there is no one to fence off.
    Sole,
    /// Elected among several hosts: its leader-only writes carry the election's fence.
    Elected(Leader),
}

impl Leadership {
    /// The comparison a leader-only write carries (none for a host alone).
    pub fn fence(&self) -> Option<Compare> {
        match self {
            Leadership::Sole => None,
            Leadership::Elected(leader) => Some(leader.fence()),
        }
    }
}

/// This host's leadership: `Some` while it leads.
pub type LeaderRx = watch::Receiver<Option<Leadership>>;
pub type LeaderTx = watch::Sender<Option<Leadership>>;

/// Until when this host may act as leader: shared by the elector (which renews it) and the
/// PXE filter (which gives the kernel's `leader` element exactly that long to live).
#[derive(Debug)]
pub struct TenureClock {
    epoch: Instant,
    ttl: Duration,
    margin: Duration,
    renewed_ms: AtomicU64,
    leading: std::sync::atomic::AtomicBool,
}

impl TenureClock {
    pub fn new(ttl: Duration, margin: Duration) -> Arc<Self> {
        Arc::new(TenureClock {
            epoch: Instant::now(),
            ttl,
            margin,
            renewed_ms: AtomicU64::new(0),
            leading: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn tenure(&self) -> Tenure {
        let mut t = Tenure::new(self.ttl, self.margin, 0);
        t.renewed(self.renewed_ms.load(Ordering::SeqCst));
        t
    }

    /// While this host leads: the instant its leader work must have stopped by.
    pub fn deadline(&self) -> Option<Instant> {
        if !self.leading.load(Ordering::SeqCst) {
            return None;
        }
        let t = self.tenure();
        let d = self.epoch + Duration::from_millis(t.deadline_ms());
        (d > Instant::now()).then_some(d)
    }
}

/// A host that is always the leader (one host, embedded store).
pub fn always() -> (LeaderTx, LeaderRx) {
    watch::channel(Some(Leadership::Sole))
}

pub struct Elector {
    pub store: Arc<dyn Store>,
    pub host: String,
    pub clock: Arc<TenureClock>,
}

impl Elector {
    /// Runs until `stop` is cancelled (SIGTERM): then resigns, so that another host takes
    /// over at once rather than after the lease runs out.
    pub async fn run(self, tx: LeaderTx, stop: CancellationToken) {
        let election = Arc::new(Election::new(self.store.clone(), "pxe"));
        let clock = self.clock.clone();
        let ttl = clock.ttl;
        let now_ms = {
            let c = clock.clone();
            move || c.now_ms()
        };
        loop {
            if stop.is_cancelled() {
                return;
            }
            let sent = now_ms();
            let lease = match self.store.lease_grant(ttl).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "leader: cannot get a lease; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                        () = stop.cancelled() => return,
                    }
                }
            };
            clock.renewed_ms.store(sent, Ordering::SeqCst);
            let lost = Arc::new(tokio::sync::Notify::new());
            // Keep the lease alive (candidates too: their key goes with the lease). A
            // keep-alive is sent every period whether or not the last one was answered: one
            // that the store's client routed to a partitioned member hangs until its timeout,
            // and waiting on it would let the tenure run out although the rest of the
            // cluster is healthy. The tenure counts from the send time of any that succeed.
            let keeper = {
                let (store, lost, c) = (self.store.clone(), lost.clone(), clock.clone());
                let now_ms = now_ms.clone();
                let period = ttl / 4;
                tokio::spawn(async move {
                    // Dropping the set (when the keeper is aborted) aborts the requests.
                    let mut inflight = tokio::task::JoinSet::new();
                    loop {
                        tokio::time::sleep(period).await;
                        while inflight.try_join_next().is_some() {}
                        let sent = now_ms();
                        let (store, lost, c) = (store.clone(), lost.clone(), c.clone());
                        inflight.spawn(async move {
                            match tokio::time::timeout(ttl, store.lease_keep_alive(lease)).await {
                                Ok(Ok(())) => {
                                    c.renewed_ms.fetch_max(sent, Ordering::SeqCst);
                                }
                                Ok(Err(StoreError::LeaseNotFound(_))) => lost.notify_one(),
                                Ok(Err(e)) => {
                                    tracing::warn!(error = %e, "leader: keep-alive failed")
                                }
                                Err(_) => tracing::warn!("leader: keep-alive unanswered"),
                            }
                        });
                    }
                })
            };
            let tenure_over = |c: &TenureClock| c.tenure().expired(c.now_ms());
            let value = self.host.clone().into_bytes();
            let campaign = election.campaign(lease, value);
            tokio::pin!(campaign);
            let won = loop {
                tokio::select! {
                    r = &mut campaign => break r,
                    _ = lost.notified() => break Err(StoreError::LeaseNotFound(lease)),
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {
                        if tenure_over(&clock) {
                            break Err(StoreError::LeaseNotFound(lease));
                        }
                    }
                    () = stop.cancelled() => {
                        keeper.abort();
                        let _ = self.store.lease_revoke(lease).await;
                        return;
                    }
                }
            };
            match won {
                Ok(leader) => {
                    tracing::info!(host = %self.host, revision = leader.revision, "leader: this host leads");
                    clock.leading.store(true, Ordering::SeqCst);
                    tx.send_replace(Some(Leadership::Elected(leader.clone())));
                    let why = loop {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                                if tenure_over(&clock) {
                                    break "the lease could not be kept alive in time";
                                }
                            }
                            _ = lost.notified() => break "the lease is gone",
                            () = stop.cancelled() => {
                                clock.leading.store(false, Ordering::SeqCst);
                                tx.send_replace(None);
                                keeper.abort();
                                let _ = election.resign(&leader).await;
                                let _ = self.store.lease_revoke(lease).await;
                                tracing::info!("leader: resigned");
                                return;
                            }
                        }
                    };
                    // Step down first; tidy up after.
                    clock.leading.store(false, Ordering::SeqCst);
                    tx.send_replace(None);
                    tracing::warn!(host = %self.host, "leader: stepped down: {why}");
                }
                Err(e) => tracing::warn!(error = %e, "leader: campaign ended; starting again"),
            }
            keeper.abort();
            let store = self.store.clone();
            tokio::spawn(async move {
                let _ = store.lease_revoke(lease).await;
            });
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_elected_leader_fences_its_writes() {
        assert_eq!(Leadership::Sole.fence(), None);
        let leader = Leader {
            key: "election/pxe/1".into(),
            revision: 7,
            lease: 1,
        };
        assert_eq!(
            Leadership::Elected(leader.clone()).fence(),
            Some(leader.fence())
        );
        let (_tx, rx) = always();
        assert_eq!(*rx.borrow(), Some(Leadership::Sole));
    }
}
