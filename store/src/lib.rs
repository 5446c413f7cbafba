//! The `Store`: the one place Paddock keeps state that must survive a restart.
//!
//! It is a key/value store with revisions, prefix range, compare-and-swap transactions,
//! prefix watches and leases (keys bound to a lease vanish with it), modelled on etcd v3 so
//! that the etcd backend can follow without touching callers. The embedded backend
//! ([`SqliteStore`]) keeps everything in one SQLite file in WAL mode with `synchronous=FULL`:
//! a write returns only after it is on disk. Writes from all callers are group-committed by a
//! single writer thread, so many small durable writes (DHCP leases) share one fsync.

pub mod election;
mod etcd;
mod sqlite;

use std::time::Duration;

use async_trait::async_trait;
pub use etcd::{EtcdStore, EtcdTls};
pub use sqlite::{SqliteStore, read_snapshot};

/// A store revision: increases by one for every transaction that changed something.
pub type Revision = i64;
/// A lease handle: keys put with a lease are deleted when the lease expires or is revoked.
pub type LeaseId = i64;

/// One stored key with its value and revision bookkeeping (as etcd's `mvccpb.KeyValue`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision at which the key was created (last time it went from absent to present).
    pub create_revision: Revision,
    /// Revision of the last change to the key.
    pub mod_revision: Revision,
    /// Number of writes since the key was created (1 after creation).
    pub version: i64,
    pub lease: Option<LeaseId>,
}

impl KeyValue {
    /// What the key names below `prefix` (`prefix` + a node's UUID, say), parsed; `None` for a
    /// key outside `prefix` or one whose rest does not parse.
    pub fn name_under<T: std::str::FromStr>(&self, prefix: &str) -> Option<T> {
        self.key.strip_prefix(prefix)?.parse().ok()
    }
}

/// A condition a transaction checks before choosing its branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's `mod_revision` equals `revision`; `revision == 0` means "the key is absent".
    ModRevision { key: String, revision: Revision },
    /// The key exists and holds exactly `value`.
    Value { key: String, value: Vec<u8> },
}

/// A write inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
    },
    DeletePrefix {
        prefix: String,
    },
}

impl Op {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }
    /// A put whose key lives only as long as `lease`.
    pub fn put_leased(key: impl Into<String>, value: impl Into<Vec<u8>>, lease: LeaseId) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: Some(lease),
        }
    }
    pub fn delete(key: impl Into<String>) -> Self {
        Op::Delete { key: key.into() }
    }
}

/// If every comparison holds, the `success` ops are applied, otherwise the `failure` ops; all
/// at one new revision, atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnResponse {
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
}

/// Every key of the store as it stood at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: Revision,
    /// In key order.
    pub kvs: Vec<KeyValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A change seen by a watch. For a delete, `kv.value` is empty and `kv.mod_revision` is the
/// revision of the deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
}

/// A stream of events for one prefix, in revision order, with none missed: when the watcher
/// falls too far behind it receives [`StoreError::WatchLagged`] and must restart from the
/// revision it last saw.
pub struct Watch {
    rx: tokio::sync::mpsc::Receiver<Result<Event, StoreError>>,
}

impl Watch {
    pub(crate) fn from_receiver(
        rx: tokio::sync::mpsc::Receiver<Result<Event, StoreError>>,
    ) -> Self {
        Watch { rx }
    }

    /// The next event, or `None` when the store has shut down.
    pub async fn next(&mut self) -> Option<Result<Event, StoreError>> {
        self.rx.recv().await
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot open the store at {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    #[error("store write failed, nothing in the batch was written: {0}")]
    Write(String),
    #[error("the store's writer has stopped; restart the appliance")]
    WriterGone,
    #[error("lease {0} does not exist (it expired or was revoked)")]
    LeaseNotFound(LeaseId),
    #[error(
        "revision {requested} has been compacted (oldest kept: {oldest}); re-read the prefix and watch from the current revision"
    )]
    Compacted {
        requested: Revision,
        oldest: Revision,
    },
    #[error("watcher fell behind by {0} events; re-read the prefix and watch again")]
    WatchLagged(u64),
    #[error("etcd: {0}")]
    Etcd(String),
    #[error(
        "the store file {path} has layout version {found}, and this paddock knows up to {known}: it was written by a newer release; run that release, or restore a backup"
    )]
    NewerFile {
        path: String,
        found: i64,
        known: i64,
    },
    #[error("a lease of {0:?} is longer than the store can hold")]
    LeaseTooLong(std::time::Duration),
}

/// The state every Paddock process shares. See the crate documentation.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;
    /// Every key that starts with `prefix`, in key order.
    async fn range(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError>;
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError>;
    /// Events for keys under `prefix` with revision ≥ `from` (0: only future events).
    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError>;
    async fn revision(&self) -> Result<Revision, StoreError>;
    /// Every key at one revision, read atomically.
    async fn snapshot(&self) -> Result<Snapshot, StoreError>;
    /// Marks the store's file as one that only releases recording store versions may open;
    /// called once the store is at this release's schema (after a migration's backup). A
    /// store with no file of its own (etcd) has nothing to mark.
    async fn seal_layout(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError>;
    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<(), StoreError>;
    /// Revokes the lease and deletes every key bound to it.
    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError>;

    /// Unconditional put; returns the new revision.
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        Ok(self
            .txn(Txn {
                success: vec![Op::put(key, value)],
                ..Txn::default()
            })
            .await?
            .revision)
    }

    /// Unconditional delete; returns the new revision.
    async fn delete(&self, key: &str) -> Result<Revision, StoreError> {
        Ok(self
            .txn(Txn {
                success: vec![Op::delete(key)],
                ..Txn::default()
            })
            .await?
            .revision)
    }

    /// Puts `key` only if it does not exist yet; returns whether it did.
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<bool, StoreError> {
        Ok(self
            .txn(Txn {
                compare: vec![Compare::ModRevision {
                    key: key.to_string(),
                    revision: 0,
                }],
                success: vec![Op::put(key, value)],
                failure: vec![],
            })
            .await?
            .succeeded)
    }
}
