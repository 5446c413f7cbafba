//! The store's schema version and the migrations that bring an older store forward.
//!
//! The key [`SCHEMA_KEY`] records `{"version": V, "readable_from": R}`: the store's data is
//! laid out as release-schema V expects, and a binary that knows schema R or later can still
//! serve it. At start, [`bring_up_to_date`] compares that with [`CURRENT`]:
//! - an empty store is stamped with [`CURRENT`];
//! - an older one is backed up (the caller's `backup` writes the file), then each migration
//!   step runs as ONE transaction that also moves the stamp, guarded by a compare on the stamp's
//!   revision: on etcd, the first host to commit a step migrates, and every other host loses
//!   the compare, looks again and finds the store moved (or moves it on from there);
//! - a newer one is served when this binary's schema is at least its `readable_from` (the
//!   steps since were compatible: hosts of the previous release keep working in a mixed
//!   cluster until they are upgraded), and refused with a clear message otherwise.
//!
//! A step is compatible when a binary of the previous schema reads and writes the migrated
//! data correctly: adding keys or fields that older binaries ignore (serde's defaults) is;
//! renaming or reshaping a key older binaries read is not, and raises `readable_from`.
//! The SQLite file has its own layout version besides (the store crate's `user_version`),
//! which keeps binaries from before versions existed off a migrated file.

use paddock_store::{Compare, KeyValue, Op, Snapshot, Store, Txn};
use serde::{Deserialize, Serialize};

/// Where the stamp lives.
pub const SCHEMA_KEY: &str = "paddock/schema";

/// The schema this binary writes.
pub const CURRENT: u32 = 1;

/// What the stamp holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub version: u32,
    pub readable_from: u32,
}

/// One migration: from `to - 1` to `to`.
pub struct Step {
    pub to: u32,
    /// Whether binaries of schema `to - 1` keep working on the migrated store.
    pub compatible: bool,
    pub what: &'static str,
    /// The writes that migrate the store as the snapshot shows it (the stamp is added).
    pub plan: fn(&Snapshot) -> Vec<Op>,
}

/// Every migration, in order; `STEPS[i].to == i + 1`.
pub const STEPS: &[Step] = &[Step {
    to: 1,
    compatible: true,
    what: "record the store's schema version (stores from before versions are schema 0)",
    plan: |_| Vec::new(),
}];

/// What to do with a store whose stamp (if any) is `stored`.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing stored yet: stamp it [`CURRENT`].
    Stamp,
    UpToDate,
    /// Run `STEPS[from..]`, after a backup.
    Migrate {
        from: u32,
    },
    /// A newer store this binary can still serve.
    NewerCompatible {
        found: Stamp,
    },
    Refuse {
        found: Stamp,
    },
}

/// The decision for a store holding `stored` (its stamp) and `empty` (no key at all).
pub fn decide(stored: Option<Stamp>, empty: bool, current: u32) -> Decision {
    match stored {
        None if empty => Decision::Stamp,
        None => Decision::Migrate { from: 0 },
        Some(s) if s.version == current => Decision::UpToDate,
        Some(s) if s.version < current => Decision::Migrate { from: s.version },
        Some(s) if s.readable_from <= current => Decision::NewerCompatible { found: s },
        Some(s) => Decision::Refuse { found: s },
    }
}

/// The stamp after `steps` ran on a store stamped `from` (0: none).
pub fn stamp_after(from: Option<Stamp>, steps: &[Step]) -> Stamp {
    let mut s = from.unwrap_or(Stamp {
        version: 0,
        readable_from: 0,
    });
    for step in steps {
        s.version = step.to;
        if !step.compatible {
            s.readable_from = step.to;
        }
    }
    s
}

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the store is schema {} (readable from schema {}), written by a newer paddock; this one knows schema {known}: run that release or newer, or restore a backup taken before the upgrade",
        found.version, found.readable_from
    )]
    Newer { found: Stamp, known: u32 },
    #[error("the store's schema stamp {SCHEMA_KEY} is unreadable: {0}")]
    BadStamp(serde_json::Error),
    #[error(transparent)]
    Store(#[from] paddock_store::StoreError),
    #[error("writing the backup before migrating: {0:#}")]
    Backup(anyhow::Error),
    #[error("the store's schema stamp changed under this host {0} times in a row; start it again")]
    Contended(usize),
}

/// What [`bring_up_to_date`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Stamped,
    UpToDate,
    Migrated {
        from: u32,
        to: u32,
        backup: Option<std::path::PathBuf>,
    },
    /// Another host migrated while this one looked.
    MigratedElsewhere,
    NewerCompatible(Stamp),
}

fn stamp_of(kv: Option<&KeyValue>) -> Result<Option<Stamp>, SchemaError> {
    kv.map(|kv| serde_json::from_slice(&kv.value).map_err(SchemaError::BadStamp))
        .transpose()
}

fn put_stamp(s: Stamp) -> Result<Op, SchemaError> {
    Ok(Op::put(
        SCHEMA_KEY,
        serde_json::to_vec(&s).map_err(SchemaError::BadStamp)?,
    ))
}

/// The stamp's compare: its revision as `snap` saw it (0: absent).
fn guard(snap: &Snapshot) -> Compare {
    Compare::ModRevision {
        key: SCHEMA_KEY.to_string(),
        revision: snap
            .kvs
            .iter()
            .find(|kv| kv.key == SCHEMA_KEY)
            .map_or(0, |kv| kv.mod_revision),
    }
}

/// How often a lost compare (another host moved the stamp) is followed by a fresh look.
const ATTEMPTS: usize = 5;

/// Stamps a store that holds nothing yet with [`CURRENT`], so that a store created by any
/// command (`certs init` writes the CA first) never reads as one from before versions.
pub async fn stamp_if_empty(store: &dyn Store) -> Result<(), SchemaError> {
    // Every open of a stamped store stops here, without reading the whole store.
    if store.get(SCHEMA_KEY).await?.is_some() {
        return Ok(());
    }
    let snap = store.snapshot().await?;
    if snap.kvs.iter().all(|kv| kv.lease.is_some()) {
        store
            .txn(Txn {
                compare: vec![guard(&snap)],
                success: vec![put_stamp(stamp_after(None, STEPS))?],
                failure: vec![],
            })
            .await?;
    }
    Ok(())
}

/// Brings `store` to [`CURRENT`] (see the module documentation). `backup` is called once,
/// before the first migration step, and returns where it wrote the store's copy. When a
/// compare is lost (another host moved the stamp), the store is looked at again.
pub async fn bring_up_to_date(
    store: &dyn Store,
    backup: impl AsyncFnOnce() -> anyhow::Result<Option<std::path::PathBuf>>,
) -> Result<Outcome, SchemaError> {
    // The usual start: already at this schema, known from the stamp alone.
    if let Some(Stamp {
        version: CURRENT, ..
    }) = stamp_of(store.get(SCHEMA_KEY).await?.as_ref())?
    {
        return Ok(Outcome::UpToDate);
    }
    let mut backup = Some(backup);
    let mut written: Option<Option<std::path::PathBuf>> = None;
    let mut first_from = None;
    let mut elsewhere = false;
    // Each round moves one step or loses one compare.
    for _ in 0..STEPS.len() + ATTEMPTS {
        let snap = store.snapshot().await?;
        let stored = stamp_of(snap.kvs.iter().find(|kv| kv.key == SCHEMA_KEY))?;
        let empty = snap.kvs.iter().all(|kv| kv.lease.is_some());
        let from = match decide(stored, empty, CURRENT) {
            Decision::UpToDate if elsewhere => return Ok(Outcome::MigratedElsewhere),
            Decision::UpToDate => {
                return Ok(match (first_from, written) {
                    (Some(from), Some(backup)) => Outcome::Migrated {
                        from,
                        to: CURRENT,
                        backup,
                    },
                    _ => Outcome::UpToDate,
                });
            }
            Decision::NewerCompatible { found } => return Ok(Outcome::NewerCompatible(found)),
            Decision::Refuse { found } => {
                return Err(SchemaError::Newer {
                    found,
                    known: CURRENT,
                });
            }
            Decision::Stamp => {
                let r = store
                    .txn(Txn {
                        compare: vec![guard(&snap)],
                        success: vec![put_stamp(stamp_after(None, STEPS))?],
                        failure: vec![],
                    })
                    .await?;
                if r.succeeded {
                    return Ok(Outcome::Stamped);
                }
                elsewhere = true;
                continue;
            }
            Decision::Migrate { from } => from,
        };
        if written.is_none()
            && let Some(b) = backup.take()
        {
            written = Some(b().await.map_err(SchemaError::Backup)?);
        }
        first_from.get_or_insert(from);
        // One step at a time, each from a fresh look at the store.
        let Some(step) = usize::try_from(from).ok().and_then(|i| STEPS.get(i)) else {
            // `decide` migrates only from below CURRENT, which STEPS covers (a test checks).
            return Err(SchemaError::Contended(0));
        };
        let mut ops = (step.plan)(&snap);
        ops.push(put_stamp(stamp_after(stored, std::slice::from_ref(step)))?);
        let r = store
            .txn(Txn {
                compare: vec![guard(&snap)],
                success: ops,
                failure: vec![],
            })
            .await?;
        if r.succeeded {
            tracing::info!(to = step.to, what = step.what, "store: migrated");
        } else {
            elsewhere = true;
        }
    }
    Err(SchemaError::Contended(ATTEMPTS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(version: u32, readable_from: u32) -> Option<Stamp> {
        Some(Stamp {
            version,
            readable_from,
        })
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, true, 3), Decision::Stamp);
        assert_eq!(decide(None, false, 3), Decision::Migrate { from: 0 });
        assert_eq!(decide(s(1, 0), false, 3), Decision::Migrate { from: 1 });
        assert_eq!(decide(s(3, 2), false, 3), Decision::UpToDate);
        assert_eq!(
            decide(s(4, 3), false, 3),
            Decision::NewerCompatible {
                found: s(4, 3).unwrap()
            }
        );
        assert_eq!(
            decide(s(5, 4), false, 3),
            Decision::Refuse {
                found: s(5, 4).unwrap()
            }
        );
    }

    #[test]
    fn an_incompatible_step_raises_readable_from() {
        let steps = [
            Step {
                to: 1,
                compatible: true,
                what: "",
                plan: |_| Vec::new(),
            },
            Step {
                to: 2,
                compatible: false,
                what: "",
                plan: |_| Vec::new(),
            },
            Step {
                to: 3,
                compatible: true,
                what: "",
                plan: |_| Vec::new(),
            },
        ];
        assert_eq!(stamp_after(None, &steps[..1]), s(1, 0).unwrap());
        assert_eq!(stamp_after(None, &steps), s(3, 2).unwrap());
        assert_eq!(stamp_after(s(2, 2), &steps[2..]), s(3, 2).unwrap());
    }

    #[test]
    fn the_steps_are_numbered_in_order_up_to_current() {
        for (i, step) in STEPS.iter().enumerate() {
            assert_eq!(step.to as usize, i + 1, "{}", step.what);
        }
        assert_eq!(STEPS.len() as u32, CURRENT);
    }

    fn open() -> (tempfile::TempDir, paddock_store::SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = paddock_store::SqliteStore::open(dir.path().join("store.db")).unwrap();
        (dir, s)
    }

    async fn stamp(store: &dyn Store) -> Option<Stamp> {
        stamp_of(store.get(SCHEMA_KEY).await.unwrap().as_ref()).unwrap()
    }

    #[tokio::test]
    async fn an_empty_store_is_stamped_without_a_backup() {
        let (_d, store) = open();
        let out = bring_up_to_date(&store, async || panic!("no backup for an empty store"))
            .await
            .unwrap();
        assert_eq!(out, Outcome::Stamped);
        assert_eq!(stamp(&store).await, stamp_after(None, STEPS).into());
        let again = bring_up_to_date(&store, async || panic!("nothing to migrate"))
            .await
            .unwrap();
        assert_eq!(again, Outcome::UpToDate);
    }

    #[tokio::test]
    async fn an_unversioned_store_is_backed_up_then_migrated_with_its_data() {
        let (_d, store) = open();
        store.put("nodes/a", b"{}".to_vec()).await.unwrap();
        let mut backed_up = false;
        let out = bring_up_to_date(&store, async || {
            backed_up = true;
            Ok(Some("b.tar".into()))
        })
        .await
        .unwrap();
        assert!(backed_up);
        assert_eq!(
            out,
            Outcome::Migrated {
                from: 0,
                to: CURRENT,
                backup: Some("b.tar".into())
            }
        );
        assert_eq!(store.get("nodes/a").await.unwrap().unwrap().value, b"{}");
        assert_eq!(stamp(&store).await.unwrap().version, CURRENT);
    }

    #[tokio::test]
    async fn a_failed_backup_migrates_nothing() {
        let (_d, store) = open();
        store.put("nodes/a", b"{}".to_vec()).await.unwrap();
        let err = bring_up_to_date(&store, async || anyhow::bail!("disk full"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(stamp(&store).await, None);
    }

    #[tokio::test]
    async fn a_newer_store_is_refused_unless_it_is_readable() {
        let (_d, store) = open();
        let put = |s: Stamp| Op::put(SCHEMA_KEY, serde_json::to_vec(&s).unwrap());
        let newer = Stamp {
            version: CURRENT + 2,
            readable_from: CURRENT + 1,
        };
        store
            .txn(Txn {
                success: vec![put(newer)],
                ..Txn::default()
            })
            .await
            .unwrap();
        let err = bring_up_to_date(&store, async || panic!("never migrates down"))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("written by a newer paddock"),
            "{err}"
        );
        let readable = Stamp {
            version: CURRENT + 1,
            readable_from: CURRENT,
        };
        store
            .txn(Txn {
                success: vec![put(readable)],
                ..Txn::default()
            })
            .await
            .unwrap();
        let out = bring_up_to_date(&store, async || panic!("never migrates down"))
            .await
            .unwrap();
        assert_eq!(out, Outcome::NewerCompatible(readable));
        assert_eq!(stamp(&store).await, Some(readable), "left as it was");
    }
}
