//! The MDB in the store: one key per machine (`mdb/<hostname>`), each remembering where it
//! came from: the operator's MDB file, the API, or the inspector (an enrolled machine).
//!
//! The file is Dominator's JSON. It is watched through its directory (inotify) and by
//! reading its identity (device, inode, size, mtime) now and then: writers replace it with
//! write-then-rename, so a new inode is a whole file. A file that does not parse (a writer
//! that edits in place, caught half-way) is reported and the previous MDB stays. Loading
//! replaces the machines that came from the file; machines added through the API or by the
//! inspector stay unless the file names them (the file wins).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_image::{Machine, Mdb};
use paddock_store::{Compare, Op, Store, Txn};
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

    /// Changes one machine in place with `change`, recorded as the API's: read and written
    /// in one compare-and-swap (tried again when another write came between), so that a
    /// field changed meanwhile (an operator's DisableUpdates) is not put back as it was.
    pub async fn update(&self, hostname: &str, change: impl Fn(&mut Machine)) -> Result<Machine> {
        loop {
            let Some(kv) = self.store.get(&key(hostname)).await? else {
                return Err(MdbServiceError::NotFound(hostname.into()));
            };
            let mut e: Entry = serde_json::from_slice(&kv.value)
                .map_err(|e| MdbServiceError::Record(kv.key.clone(), e.to_string()))?;
            change(&mut e.machine);
            Mdb::from_machines(vec![e.machine.clone()])?;
            e.source = Source::Api;
            let v = serde_json::to_vec(&e)
                .map_err(|err| MdbServiceError::Record(hostname.into(), err.to_string()))?;
            let swapped = self
                .store
                .txn(Txn {
                    compare: vec![Compare::ModRevision {
                        key: kv.key.clone(),
                        revision: kv.mod_revision,
                    }],
                    success: vec![Op::put(kv.key, v)],
                    failure: vec![],
                })
                .await?;
            if swapped.succeeded {
                return Ok(e.machine);
            }
        }
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

    /// Watches the file: loads it now, then again whenever it is replaced or changes. The
    /// kernel says when the file's directory changes (inotify), so a new MDB is acted on at
    /// once; the file's identity is also read every `period`, which catches what inotify
    /// cannot see (a network file system, a directory that was itself replaced).
    pub async fn watch(self: Arc<Self>, period: Duration, now_ms: impl Fn() -> i64) {
        let Some(path) = self.file.clone() else {
            return;
        };
        let mut changes = match DirChanges::new(&path) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "mdb: no inotify watch; reading the file every {period:?}");
                None
            }
        };
        let mut last: Option<Identity> = None;
        let mut tick = tokio::time::interval(period);
        loop {
            match &mut changes {
                Some(c) => tokio::select! {
                    _ = tick.tick() => {}
                    r = c.next() => if let Err(e) = r {
                        tracing::warn!(path = %path.display(), error = %e, "mdb: inotify failed; reading the file every {period:?}");
                        changes = None;
                    },
                },
                None => {
                    tick.tick().await;
                }
            }
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

/// Changes in the directory that holds a file: writers replace the file by renaming a new
/// one over it, so the directory, not the file's inode, is what stays to be watched. A
/// thread blocks on the inotify descriptor and passes each batch of events on; it ends at
/// the first batch after the receiver is gone.
struct DirChanges {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<()>>,
}

impl DirChanges {
    fn new(file: &Path) -> std::io::Result<Self> {
        use nix::sys::inotify::{AddWatchFlags as W, InitFlags, Inotify};
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(
            dir,
            W::IN_CLOSE_WRITE | W::IN_MOVED_TO | W::IN_CREATE | W::IN_DELETE | W::IN_ATTRIB,
        )?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        std::thread::Builder::new()
            .name("mdb-inotify".into())
            .spawn(move || {
                loop {
                    let read = inotify.read_events().map(drop).map_err(Into::into);
                    let failed = read.is_err();
                    // A batch already waiting says the same: the reader compares identities.
                    if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) =
                        tx.try_send(read)
                    {
                        return;
                    }
                    if failed {
                        return;
                    }
                }
            })?;
        Ok(DirChanges { rx })
    }

    /// Waits for the next batch of events; what they name does not matter (the caller
    /// compares the file's identity).
    async fn next(&mut self) -> std::io::Result<()> {
        self.rx
            .recv()
            .await
            .unwrap_or_else(|| Err(std::io::Error::other("the inotify reader ended")))
    }
}

type Identity = (u64, u64, u64, i64, i64);

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An update (a rollout's new RequiredImage) and an operator's write of another field at
    /// the same moment (their store calls interleave): both changes stand, every time.
    #[tokio::test]
    async fn an_update_keeps_what_was_written_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let mdb = MdbService::new(store, None);
        let machine = |disable_updates| Machine {
            hostname: "r1u1".into(),
            ip_address: "198.18.0.11".into(),
            required_image: "a".into(),
            disable_updates,
            ..Machine::default()
        };
        for round in 0..10 {
            mdb.set(machine(false), Source::File).await.unwrap();
            let image = format!("b{round}");
            let (updated, frozen) = tokio::join!(
                mdb.update("r1u1", |m| m.required_image = image.clone()),
                mdb.update("r1u1", |m| m.disable_updates = true),
            );
            updated.unwrap();
            frozen.unwrap();
            let e = &mdb.entries().await.unwrap()["r1u1"];
            assert_eq!(e.machine.required_image, image, "round {round}");
            assert!(e.machine.disable_updates, "round {round}");
            assert_eq!(e.source, Source::Api);
        }
        assert!(matches!(
            mdb.update("nobody", |_| {}).await,
            Err(MdbServiceError::NotFound(_))
        ));
    }

    /// With an hour between reads of its identity, only the directory watch can make the
    /// service load a replaced file within the test's wait.
    #[tokio::test]
    async fn a_replaced_file_is_loaded_without_waiting_for_the_period() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let file = dir.path().join("mdb.json");
        std::fs::write(&file, "[]\n").unwrap();
        let mdb = MdbService::new(store, Some(file.clone()));
        let watch = tokio::spawn(mdb.clone().watch(Duration::from_secs(3600), || 0));
        let loaded = |n: usize| {
            let mdb = mdb.clone();
            async move {
                for _ in 0..200 {
                    if mdb.status().last_load_ms.is_some()
                        && mdb.entries().await.unwrap().len() == n
                    {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                false
            }
        };
        assert!(loaded(0).await, "the first load");
        let next = dir.path().join("mdb.json.new");
        std::fs::write(
            &next,
            r#"[{"Hostname": "r1u1", "IpAddress": "198.18.0.11", "RequiredImage": "a"}]"#,
        )
        .unwrap();
        std::fs::rename(&next, &file).unwrap();
        assert!(loaded(1).await, "the replaced file: {:?}", mdb.status());
        // Written in place, too.
        std::fs::write(
            &file,
            r#"[{"Hostname": "r1u1", "IpAddress": "198.18.0.11", "RequiredImage": "a"},
                {"Hostname": "r1u2", "IpAddress": "198.18.0.12", "RequiredImage": "a"}]"#,
        )
        .unwrap();
        assert!(loaded(2).await, "the rewritten file: {:?}", mdb.status());
        watch.abort();
    }
}
