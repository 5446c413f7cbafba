//! The MDB in the store: one key per machine (`mdb/<hostname>`), each remembering where it
//! came from: the operator's MDB file, the API, or the inspector (an enrolled machine).
//!
//! The file is Dominator's JSON. It is watched by polling its identity (device, inode, size,
//! mtime): writers replace it with write-then-rename, so a new inode is a whole file. A file
//! that does not parse (a writer that edits in place, caught half-way) is reported and the
//! previous MDB stays. Loading replaces the machines that came from the file; machines added
//! through the API or by the inspector stay unless the file names them (the file wins).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_image::{Machine, Mdb};
use paddock_store::{Op, Store, Txn};
use serde::{Deserialize, Serialize};

const PREFIX: &str = "mdb/";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    File,
    Api,
    Inspector,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub machine: Machine,
    pub source: Source,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct FileStatus {
    pub path: Option<String>,
    pub last_load_ms: Option<i64>,
    pub machines: usize,
    pub last_error: Option<String>,
}

pub struct MdbService {
    store: Arc<dyn Store>,
    file: Option<PathBuf>,
    status: Mutex<FileStatus>,
}

#[derive(Debug, thiserror::Error)]
pub enum MdbServiceError {
    #[error(transparent)]
    Mdb(#[from] paddock_image::image::MdbError),
    #[error("store: {0}")]
    Store(#[from] paddock_store::StoreError),
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    #[error("MDB record {0}: {1}")]
    Record(String, String),
    #[error("no machine {0:?} in the MDB")]
    NotFound(String),
}

type Result<T> = std::result::Result<T, MdbServiceError>;

fn key(hostname: &str) -> String {
    format!("{PREFIX}{hostname}")
}

impl MdbService {
    pub fn new(store: Arc<dyn Store>, file: Option<PathBuf>) -> Arc<Self> {
        let status = FileStatus {
            path: file.as_ref().map(|p| p.display().to_string()),
            ..FileStatus::default()
        };
        Arc::new(MdbService {
            store,
            file,
            status: Mutex::new(status),
        })
    }

    pub async fn entries(&self) -> Result<BTreeMap<String, Entry>> {
        let mut out = BTreeMap::new();
        for kv in self.store.range(PREFIX).await? {
            let e: Entry = serde_json::from_slice(&kv.value)
                .map_err(|e| MdbServiceError::Record(kv.key.clone(), e.to_string()))?;
            out.insert(e.machine.hostname.clone(), e);
        }
        Ok(out)
    }

    /// The MDB as Dominator's tools see it.
    pub async fn mdb(&self) -> Result<Mdb> {
        Ok(Mdb {
            machines: self
                .entries()
                .await?
                .into_iter()
                .map(|(h, e)| (h, e.machine))
                .collect(),
        })
    }

    /// Adds or replaces one machine.
    pub async fn set(&self, machine: Machine, source: Source) -> Result<()> {
        Mdb::from_machines(vec![machine.clone()])?;
        let v = serde_json::to_vec(&Entry {
            machine: machine.clone(),
            source,
        })
        .map_err(|e| MdbServiceError::Record(machine.hostname.clone(), e.to_string()))?;
        self.store.put(&key(&machine.hostname), v).await?;
        Ok(())
    }

    /// Adds a machine only if the MDB has none of that name (the inspector's enrolment).
    pub async fn add_if_absent(&self, machine: Machine, source: Source) -> Result<bool> {
        Mdb::from_machines(vec![machine.clone()])?;
        let v = serde_json::to_vec(&Entry {
            machine: machine.clone(),
            source,
        })
        .map_err(|e| MdbServiceError::Record(machine.hostname.clone(), e.to_string()))?;
        Ok(self.store.create(&key(&machine.hostname), v).await?)
    }

    pub async fn delete(&self, hostname: &str) -> Result<()> {
        if self.store.get(&key(hostname)).await?.is_none() {
            return Err(MdbServiceError::NotFound(hostname.into()));
        }
        self.store.delete(&key(hostname)).await?;
        Ok(())
    }

    /// Replaces the file's machines with this MDB, in one transaction.
    pub async fn load(&self, mdb: &Mdb) -> Result<()> {
        let current = self.entries().await?;
        let mut ops = Vec::new();
        for (h, e) in &current {
            if e.source == Source::File && !mdb.machines.contains_key(h) {
                ops.push(Op::delete(key(h)));
            }
        }
        for (h, m) in &mdb.machines {
            let entry = Entry {
                machine: m.clone(),
                source: Source::File,
            };
            if current.get(h) != Some(&entry) {
                let v = serde_json::to_vec(&entry)
                    .map_err(|e| MdbServiceError::Record(h.clone(), e.to_string()))?;
                ops.push(Op::put(key(h), v));
            }
        }
        if !ops.is_empty() {
            self.store
                .txn(Txn {
                    success: ops,
                    ..Txn::default()
                })
                .await?;
        }
        Ok(())
    }

    /// Reads and loads the file once.
    pub async fn load_file(&self, now_ms: i64) -> Result<usize> {
        let Some(path) = &self.file else {
            return Ok(0);
        };
        let res = async {
            let text = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| MdbServiceError::Read(path.display().to_string(), e))?;
            let mdb = Mdb::parse(&text)?;
            self.load(&mdb).await?;
            Ok::<_, MdbServiceError>(mdb.machines.len())
        }
        .await;
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        match &res {
            Ok(n) => {
                st.last_load_ms = Some(now_ms);
                st.machines = *n;
                st.last_error = None;
            }
            Err(e) => st.last_error = Some(e.to_string()),
        }
        res
    }

    pub fn status(&self) -> FileStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Watches the file: loads it now, then again whenever it is replaced or changes.
    pub async fn watch(self: Arc<Self>, period: Duration, now_ms: impl Fn() -> i64) {
        let Some(path) = self.file.clone() else {
            return;
        };
        let mut last: Option<Identity> = None;
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let id = identity(&path);
            if id != last {
                match self.load_file(now_ms()).await {
                    Ok(n) => {
                        tracing::info!(path = %path.display(), machines = n, "mdb: loaded");
                        last = id;
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "mdb: file not loaded; keeping the previous MDB");
                        // Retry while it stays unreadable; a replacement changes the identity.
                        last = id;
                    }
                }
            }
        }
    }
}

type Identity = (u64, u64, u64, i64, i64);

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}
