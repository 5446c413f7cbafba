//! Where this host keeps its state: SQLite under `data_dir` for a host alone (one writer,
//! held by a lock file), or an etcd cluster shared with its peers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use paddock_store::{SqliteStore, Store};

/// Several hosts on one etcd cluster (`None`: one host on the embedded store).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub etcd_endpoints: Vec<String>,
    /// `(ca, cert, key)` files for TLS to etcd.
    pub etcd_tls: Option<(PathBuf, PathBuf, PathBuf)>,
    pub host: String,
    pub lease_ttl: Duration,
}

/// The lock `paddock serve` holds on a single-host store for as long as it runs: the SQLite
/// store has one writer (its revisions are counted in that process), so other commands that
/// write (`paddock certs token` …) go through the running appliance's API instead. `None`:
/// another process holds it, or the store is a cluster's (no lock needed).
pub fn store_lock(
    data_dir: &Path,
    cluster: Option<&ClusterConfig>,
) -> anyhow::Result<Option<std::fs::File>> {
    if cluster.is_some() {
        return Ok(None);
    }
    crate::at_rest::private_dir(data_dir)?;
    let path = data_dir.join("store.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// The lock `paddock serve` must hold: an error when another process holds it.
pub fn hold_store_lock(
    data_dir: &Path,
    cluster: Option<&ClusterConfig>,
) -> anyhow::Result<Option<std::fs::File>> {
    match (store_lock(data_dir, cluster)?, cluster) {
        (None, None) => anyhow::bail!(
            "another process holds {}: one paddock serve per data_dir",
            data_dir.join("store.lock").display()
        ),
        (lock, _) => Ok(lock),
    }
}

/// The store the configuration names: SQLite under `data_dir`, or the etcd cluster.
pub async fn open_store(
    data_dir: &Path,
    cluster: Option<&ClusterConfig>,
) -> anyhow::Result<Arc<dyn Store>> {
    crate::at_rest::private_dir(data_dir)?;
    let store: Arc<dyn Store> = match cluster {
        None => {
            Arc::new(SqliteStore::open(data_dir.join("store.db")).context("opening the store")?)
        }
        Some(c) => {
            let tls = match &c.etcd_tls {
                Some((ca, cert, key)) => {
                    crate::at_rest::check_key(key)?;
                    let read = |p: &PathBuf| {
                        std::fs::read_to_string(p)
                            .with_context(|| format!("reading {}", p.display()))
                    };
                    Some(paddock_store::EtcdTls {
                        ca_pem: read(ca)?,
                        cert_pem: read(cert)?,
                        key_pem: read(key)?,
                    })
                }
                None => None,
            };
            Arc::new(
                paddock_store::EtcdStore::connect_with(
                    &c.etcd_endpoints,
                    Duration::from_secs(5),
                    tls.as_ref(),
                )
                .await
                .context("connecting to the etcd cluster")?,
            )
        }
    };
    // A store this command creates is of this release's schema from its first key.
    crate::schema::stamp_if_empty(store.as_ref()).await?;
    Ok(store)
}
