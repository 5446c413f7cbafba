//! Leader election with fencing, on any [`Store`] (etcd's recipe, so it behaves the same on
//! the SQLite backend and on an etcd cluster).
//!
//! A candidate puts `elections/<name>/<lease>` bound to its lease; the candidate whose key
//! has the lowest create revision leads. The leader's key revision is its **fencing token**:
//! a write that needs leadership carries [`Leader::fence`] (a compare on that key's
//! revision), so a deposed leader's write fails even if it still believes it leads.
//!
//! Losing the lease must end leader work **before** another host can win. The pure
//! [`Tenure`] decides when: a lease granted or kept alive by a request sent at time `t` is
//! valid at the store until at least `t + ttl`; the leader stops at `t + ttl - margin`
//! unless a later keep-alive succeeded. Time is passed in, so this is table-tested.

use std::sync::Arc;
use std::time::Duration;

use crate::{Compare, EventKind, LeaseId, Op, Revision, Store, StoreError, Txn};

/// The leader's claim: its key and the key's create revision (the fencing token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    pub key: String,
    pub revision: Revision,
    pub lease: LeaseId,
}

impl Leader {
    /// The comparison that makes a transaction succeed only while this leader's key is the
    /// one it created (add it to every leader-only write).
    pub fn fence(&self) -> Compare {
        Compare::ModRevision {
            key: self.key.clone(),
            revision: self.revision,
        }
    }
}

pub struct Election {
    store: Arc<dyn Store>,
    prefix: String,
}

impl Election {
    pub fn new(store: Arc<dyn Store>, name: &str) -> Self {
        Election {
            store,
            prefix: format!("elections/{name}/"),
        }
    }

    /// The current leader's key and value (`None`: nobody campaigns).
    pub async fn leader(&self) -> Result<Option<(String, Vec<u8>, Revision)>, StoreError> {
        let mut kvs = self.store.range(&self.prefix).await?;
        kvs.sort_by_key(|kv| kv.create_revision);
        Ok(kvs
            .into_iter()
            .next()
            .map(|kv| (kv.key, kv.value, kv.create_revision)))
    }

    /// Campaigns with `lease` and waits until this candidate leads. `value` says who it is
    /// (the console shows it). Cancel by dropping the future; the key goes with the lease.
    pub async fn campaign(&self, lease: LeaseId, value: Vec<u8>) -> Result<Leader, StoreError> {
        let key = format!("{}{lease:016x}", self.prefix);
        let res = self
            .store
            .txn(Txn {
                compare: vec![Compare::ModRevision {
                    key: key.clone(),
                    revision: 0,
                }],
                success: vec![Op::put_leased(key.clone(), value, lease)],
                failure: vec![],
            })
            .await?;
        let _ = res;
        loop {
            let rev_now = self.store.revision().await?;
            let mut kvs = self.store.range(&self.prefix).await?;
            kvs.sort_by_key(|kv| kv.create_revision);
            let Some(mine) = kvs.iter().find(|kv| kv.key == key) else {
                return Err(StoreError::LeaseNotFound(lease));
            };
            if kvs.first().map(|kv| &kv.key) == Some(&key) {
                return Ok(Leader {
                    key,
                    revision: mine.mod_revision,
                    lease,
                });
            }
            // Wait for any candidate ahead of us to go, then look again.
            let ahead: Vec<String> = kvs
                .iter()
                .take_while(|kv| kv.key != key)
                .map(|kv| kv.key.clone())
                .collect();
            let mut w = self.store.watch(&self.prefix, rev_now + 1).await?;
            loop {
                match w.next().await {
                    Some(Ok(ev)) if ev.kind == EventKind::Delete && ahead.contains(&ev.kv.key) => {
                        break;
                    }
                    Some(Ok(ev)) if ev.kind == EventKind::Delete && ev.kv.key == key => {
                        return Err(StoreError::LeaseNotFound(lease));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e),
                    None => return Err(StoreError::WriterGone),
                }
            }
        }
    }

    /// Gives leadership up (deletes the key, if it is still this leader's).
    pub async fn resign(&self, leader: &Leader) -> Result<(), StoreError> {
        self.store
            .txn(Txn {
                compare: vec![leader.fence()],
                success: vec![Op::delete(&leader.key)],
                failure: vec![],
            })
            .await?;
        Ok(())
    }
}

/// When leader work must stop, from the times keep-alive requests were sent and answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenure {
    ttl_ms: u64,
    margin_ms: u64,
    /// Send time (ms, caller's monotonic clock) of the last request that renewed the lease.
    renewed_at_ms: u64,
}

impl Tenure {
    /// The lease was granted (or last renewed) by a request sent at `sent_at_ms`.
    pub fn new(ttl: Duration, margin: Duration, sent_at_ms: u64) -> Self {
        Tenure {
            ttl_ms: ttl.as_millis() as u64,
            margin_ms: margin.as_millis() as u64,
            renewed_at_ms: sent_at_ms,
        }
    }

    /// A keep-alive sent at `sent_at_ms` succeeded.
    pub fn renewed(&mut self, sent_at_ms: u64) {
        self.renewed_at_ms = self.renewed_at_ms.max(sent_at_ms);
    }

    /// The instant leader work must have stopped by: the earliest the store may expire the
    /// lease, less the margin.
    pub fn deadline_ms(&self) -> u64 {
        (self.renewed_at_ms + self.ttl_ms).saturating_sub(self.margin_ms)
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.deadline_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenure_ends_before_the_lease_can() {
        let ttl = Duration::from_secs(3);
        let margin = Duration::from_millis(500);
        // (event, time ms, expired at the time?)
        let mut t = Tenure::new(ttl, margin, 1_000);
        assert_eq!(t.deadline_ms(), 3_500);
        assert!(!t.expired(3_499));
        assert!(t.expired(3_500));
        // A renewal sent at 2,000 extends it; one that is answered late but was sent early
        // counts from its send time, never from its answer.
        t.renewed(2_000);
        assert_eq!(t.deadline_ms(), 4_500);
        // An older request answered after a newer one does not pull the deadline back.
        t.renewed(1_500);
        assert_eq!(t.deadline_ms(), 4_500);
        // With no renewal the leader stops 500 ms before the store could expire the lease.
        assert!(t.expired(4_500) && !t.expired(4_499));
    }
}
