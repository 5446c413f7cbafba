//! The embedded backend: one SQLite file (WAL, `synchronous=FULL`), one writer thread that
//! group-commits, and a read connection for gets and ranges.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::{
    Compare, Event, EventKind, KeyValue, LeaseId, Op, Revision, Snapshot, Store, StoreError, Txn,
    TxnResponse, Watch,
};

/// Most requests folded into one SQLite transaction (one fsync).
const MAX_BATCH: usize = 4096;
/// History rows kept for watches that start in the past.
const HISTORY_KEEP: i64 = 200_000;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum WriteReq {
    Txn(Txn, Reply<TxnResponse>),
    LeaseGrant(Duration, Reply<LeaseId>),
    LeaseKeepAlive(LeaseId, Reply<()>),
    LeaseRevoke(LeaseId, Reply<()>),
    Expire(Reply<usize>),
}

/// The embedded SQLite store. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    writer: mpsc::UnboundedSender<WriteReq>,
    reader: Mutex<Connection>,
    events: broadcast::Sender<Arc<Vec<Event>>>,
}

/// How often the WAL is copied into the database (SQLite's own default, every 1,000 pages,
/// is about 4 MB of writes; a busy DHCP server writes that in well under a second).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    create_rev INTEGER NOT NULL,
    mod_rev INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_lease ON kv(lease) WHERE lease IS NOT NULL;
CREATE TABLE IF NOT EXISTS history (
    rev INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    key TEXT NOT NULL,
    kind INTEGER NOT NULL,
    value BLOB NOT NULL,
    create_rev INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease INTEGER,
    PRIMARY KEY (rev, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY,
    ttl_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO meta(name, value) SELECT 'revision', 0
    WHERE NOT EXISTS (SELECT 1 FROM meta WHERE name = 'revision');
INSERT INTO meta(name, value) SELECT 'compacted', 0
    WHERE NOT EXISTS (SELECT 1 FROM meta WHERE name = 'compacted');
";

/// The file's own layout: `PRAGMA user_version`. 0 is the layout before it was recorded;
/// 1 adds [`REFUSE_UNVERSIONED`]. A file of a later layout is refused with
/// [`StoreError::NewerFile`].
const FILE_VERSION: i64 = 1;

/// A binary from before the file's layout was recorded runs `INSERT OR IGNORE INTO meta` at
/// every open: this trigger turns that into a clear refusal instead of letting it serve a
/// store a newer release may have migrated. The current SCHEMA's inserts select no rows
/// once the meta rows exist, so the trigger never fires for it.
const REFUSE_UNVERSIONED: &str = "
CREATE TRIGGER IF NOT EXISTS refuse_unversioned_binaries BEFORE INSERT ON meta
BEGIN
    SELECT RAISE(ABORT, 'this Paddock store was opened by a newer paddock, which records store versions; run that release (or newer), or restore the backup it wrote before migrating');
END;
";

/// The store holds secrets (keys, token digests): the file is created readable by its owner
/// alone, and an existing one (and its WAL files, which SQLite creates with the database's
/// mode) is brought down to that.
fn owner_only(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let failed = |source: std::io::Error| StoreError::Open {
        path: path.display().to_string(),
        source: rusqlite::Error::ToSqlConversionFailure(Box::new(source)),
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(failed)?;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(failed)?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(())
}

fn open_conn(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source,
    })?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: the WAL is fsynced at every commit, so a committed write survives power loss.
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Each write request runs in a savepoint, whose journal of the pages it changed spills to
    // a temporary file past 64 KiB: a DHCP batch of hundreds of leases always did, and its
    // writes showed in every profile of the writer. In memory, DHCPv6's sustained rate went
    // from about 14,000 to 16,000 exchanges/s. The journal is emptied at each RELEASE, so it
    // holds at most the pages one request changes.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating if needed) the store file at `path` and starts its writer thread and
    /// lease sweeper.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        owner_only(path)?;
        let writer_conn = open_conn(path)?;
        let file_version: i64 = writer_conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if file_version > FILE_VERSION {
            return Err(StoreError::NewerFile {
                path: path.display().to_string(),
                found: file_version,
                known: FILE_VERSION,
            });
        }
        let existed: bool = writer_conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'kv')",
            [],
            |r| r.get(0),
        )?;
        writer_conn.execute_batch(SCHEMA)?;
        // A file no earlier release has seen is sealed at once. One an earlier release wrote
        // stays open to it until the caller has backed it up and migrated it (`seal_layout`):
        // a start that fails before then leaves the previous release able to run on it.
        if !existed {
            seal(&writer_conn)?;
        }
        // Checkpoints run on a thread of their own (below), not inside a commit: an automatic
        // one copies the WAL into the database and fsyncs it while every writer waits, which
        // held replies of the DHCP servers back by tens of milliseconds under load.
        writer_conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let checkpointer = open_conn(path)?;
        let reader = open_conn(path)?;
        let (events, _) = broadcast::channel(65_536);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut writer = Writer::new(writer_conn, events.clone())?;
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
            })?;
        let store = SqliteStore {
            inner: Arc::new(Inner {
                writer: tx,
                reader: Mutex::new(reader),
                events,
            }),
        };
        // Checkpoint the WAL every CHECKPOINT_EVERY for as long as the store is alive. PASSIVE
        // never waits for the writer or readers: it copies what it can, and the WAL starts
        // over once a checkpoint has taken all of it.
        let weak = Arc::downgrade(&store.inner);
        std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(CHECKPOINT_EVERY);
                    if weak.upgrade().is_none() {
                        return;
                    }
                    if let Err(e) =
                        checkpointer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::warn!(error = %e, "store: WAL checkpoint failed");
                    }
                }
            })
            .map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
            })?;
        // Sweep expired leases once a second for as long as the store is alive.
        let weak = Arc::downgrade(&store.inner);
        std::thread::Builder::new()
            .name("store-leases".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_millis(500));
                    let Some(inner) = weak.upgrade() else { return };
                    let (tx, _rx) = oneshot::channel();
                    if inner.writer.send(WriteReq::Expire(tx)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
            })?;
        Ok(store)
    }

    async fn request<T>(&self, make: impl FnOnce(Reply<T>) -> WriteReq) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .writer
            .send(make(tx))
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let conn = inner.reader.lock().unwrap_or_else(|p| p.into_inner());
            f(&conn)
        })
        .await
        .map_err(|_| StoreError::WriterGone)?
    }
}

/// Marks the file as one only releases that record store versions open (see
/// [`REFUSE_UNVERSIONED`]).
fn seal(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(REFUSE_UNVERSIONED)?;
    conn.pragma_update(None, "user_version", FILE_VERSION)?;
    Ok(())
}

/// Every key and the revision they stand at, read in one transaction of `conn`.
fn snapshot_conn(conn: &mut Connection) -> Result<Snapshot, StoreError> {
    let tx = conn.transaction()?;
    let revision = tx.query_row("SELECT value FROM meta WHERE name='revision'", [], |r| {
        r.get(0)
    })?;
    let kvs = range_conn(&tx, "")?;
    tx.commit()?;
    Ok(Snapshot { revision, kvs })
}

/// A consistent snapshot of the store file at `path`, read by this process while another may
/// be serving it (SQLite's WAL gives the reader one committed state). The connection is
/// opened read-write, as WAL readers need the shared-memory index, but only reads; no writer
/// or sweeper starts: safe beside a running `paddock serve`.
pub fn read_snapshot(path: &Path) -> Result<Snapshot, StoreError> {
    let open_err = |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    };
    let mut conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_err)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    snapshot_conn(&mut conn)
}

fn row_to_kv(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: row.get(0)?,
        value: row.get(1)?,
        create_revision: row.get(2)?,
        mod_revision: row.get(3)?,
        version: row.get(4)?,
        lease: row.get(5)?,
    })
}

/// The upper bound of a prefix scan: the prefix with its last byte incremented.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

fn range_conn(conn: &Connection, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
    const COLS: &str = "SELECT key, value, create_rev, mod_rev, version, lease FROM kv";
    let rows = match prefix_end(prefix) {
        Some(end) if !prefix.is_empty() => {
            let mut st =
                conn.prepare_cached(&format!("{COLS} WHERE key >= ?1 AND key < ?2 ORDER BY key"))?;
            st.query_map(params![prefix, end], row_to_kv)?
                .collect::<Result<Vec<_>, _>>()?
        }
        _ => {
            let mut st = conn.prepare_cached(&format!("{COLS} WHERE key >= ?1 ORDER BY key"))?;
            st.query_map(params![prefix], row_to_kv)?
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    Ok(rows
        .into_iter()
        .filter(|kv| kv.key.starts_with(prefix))
        .collect())
}

#[async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let key = key.to_string();
        self.read(move |conn| {
            let mut st = conn.prepare_cached(
                "SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE key = ?1",
            )?;
            Ok(st.query_row(params![key], row_to_kv).optional()?)
        })
        .await
    }

    async fn range(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        let prefix = prefix.to_string();
        self.read(move |conn| range_conn(conn, &prefix)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        self.request(|tx| WriteReq::Txn(txn, tx)).await
    }

    async fn seal_layout(&self) -> Result<(), StoreError> {
        self.read(seal).await
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.reader.lock().unwrap_or_else(|p| p.into_inner());
            snapshot_conn(&mut conn)
        })
        .await
        .map_err(|_| StoreError::WriterGone)?
    }

    async fn revision(&self) -> Result<Revision, StoreError> {
        self.read(|conn| {
            Ok(
                conn.query_row("SELECT value FROM meta WHERE name='revision'", [], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        // Subscribe before reading history so nothing falls between the two.
        let mut live = self.inner.events.subscribe();
        let prefix = prefix.to_string();
        let p = prefix.clone();
        let past = if from > 0 {
            self.read(move |conn| {
                let compacted: i64 =
                    conn.query_row("SELECT value FROM meta WHERE name='compacted'", [], |r| {
                        r.get(0)
                    })?;
                if from <= compacted {
                    return Err(StoreError::Compacted {
                        requested: from,
                        oldest: compacted + 1,
                    });
                }
                let mut st = conn.prepare_cached(
                    "SELECT key, value, create_rev, rev, version, lease, kind FROM history
                     WHERE rev >= ?1 ORDER BY rev, seq",
                )?;
                let rows = st
                    .query_map(params![from], |row| {
                        let kind: i64 = row.get(6)?;
                        Ok(Event {
                            kind: if kind == 0 {
                                EventKind::Put
                            } else {
                                EventKind::Delete
                            },
                            kv: row_to_kv(row)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows
                    .into_iter()
                    .filter(|e| e.kv.key.starts_with(&p))
                    .collect::<Vec<_>>())
            })
            .await?
        } else {
            Vec::new()
        };
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut last = from - 1;
            for ev in past {
                last = ev.kv.mod_revision;
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            loop {
                // A watch nobody reads any more ends now, not at its prefix's next change.
                let next = tokio::select! {
                    () = tx.closed() => return,
                    next = live.recv() => next,
                };
                match next {
                    Ok(batch) => {
                        for ev in batch.iter() {
                            if ev.kv.mod_revision > last
                                && ev.kv.key.starts_with(&prefix)
                                && tx.send(Ok(ev.clone())).await.is_err()
                            {
                                return;
                            }
                        }
                        if let Some(ev) = batch.last() {
                            last = last.max(ev.kv.mod_revision);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        let _ = tx.send(Err(StoreError::WatchLagged(n))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Watch { rx })
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.request(|tx| WriteReq::LeaseGrant(ttl, tx)).await
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.request(|tx| WriteReq::LeaseKeepAlive(lease, tx)).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.request(|tx| WriteReq::LeaseRevoke(lease, tx)).await
    }
}

/// The single writer: owns the write connection and the current revision.
struct Writer {
    conn: Connection,
    revision: Revision,
    events: broadcast::Sender<Arc<Vec<Event>>>,
    /// The revision being written and the `seq` of its next history row. Counted rather than
    /// found from the batch's events: one revision can change thousands of keys (a DHCP
    /// batch), and a search per row made such a batch quadratic.
    next_seq: Option<(Revision, i64)>,
}

/// What one request produced inside a batch, delivered only after the batch commits.
enum Done {
    Txn(Reply<TxnResponse>, Result<TxnResponse, StoreError>),
    Lease(Reply<LeaseId>, Result<LeaseId, StoreError>),
    Unit(Reply<()>, Result<(), StoreError>),
    Count(Reply<usize>, Result<usize, StoreError>),
}

impl Writer {
    fn new(
        conn: Connection,
        events: broadcast::Sender<Arc<Vec<Event>>>,
    ) -> Result<Self, StoreError> {
        let revision = conn.query_row("SELECT value FROM meta WHERE name='revision'", [], |r| {
            r.get(0)
        })?;
        Ok(Writer {
            conn,
            revision,
            events,
            next_seq: None,
        })
    }

    fn run(&mut self, mut rx: mpsc::UnboundedReceiver<WriteReq>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            self.commit_batch(&mut batch);
        }
    }

    fn commit_batch(&mut self, batch: &mut Vec<WriteReq>) {
        let start_rev = self.revision;
        self.next_seq = None;
        let mut events = Vec::new();
        let mut done = Vec::with_capacity(batch.len());
        let began = self.conn.execute_batch("BEGIN IMMEDIATE");
        if let Err(e) = began {
            tracing::error!(error = %e, "store: cannot begin a write transaction");
            for req in batch.drain(..) {
                fail(req, || StoreError::Write(e.to_string()));
            }
            return;
        }
        let now = paddock_wire::unix_ms();
        for req in batch.drain(..) {
            // Prepared once: a savepoint per request is cheap, parsing it each time is not.
            let sp = self.exec_cached("SAVEPOINT req");
            let rev_before = self.revision;
            let events_before = events.len();
            let result = sp.map_err(StoreError::from).and_then(|_| match &req {
                WriteReq::Txn(txn, _) => self.apply_txn(txn, &mut events).map(Value::Txn),
                WriteReq::LeaseGrant(ttl, _) => self.lease_grant(*ttl, now).map(Value::Number),
                WriteReq::LeaseKeepAlive(id, _) => {
                    self.lease_keep_alive(*id, now).map(|_| Value::Unit)
                }
                WriteReq::LeaseRevoke(id, _) => {
                    self.lease_revoke(*id, &mut events).map(|_| Value::Unit)
                }
                WriteReq::Expire(_) => self
                    .expire(now, &mut events)
                    .map(|n| Value::Number(n as i64)),
            });
            let result = match result {
                Ok(v) => self
                    .conn
                    .prepare_cached("RELEASE req")
                    .and_then(|mut st| st.execute([]))
                    .map(|_| v)
                    .map_err(StoreError::from),
                Err(e) => {
                    let _ = self.conn.execute_batch("ROLLBACK TO req; RELEASE req");
                    self.revision = rev_before;
                    // The next request takes the revision again, from seq 0.
                    self.next_seq = None;
                    events.truncate(events_before);
                    Err(e)
                }
            };
            done.push(match req {
                WriteReq::Txn(_, tx) => Done::Txn(tx, result.map(Value::txn)),
                WriteReq::LeaseGrant(_, tx) => Done::Lease(tx, result.map(Value::number)),
                WriteReq::LeaseKeepAlive(_, tx) | WriteReq::LeaseRevoke(_, tx) => {
                    Done::Unit(tx, result.map(|_| ()))
                }
                WriteReq::Expire(tx) => Done::Count(tx, result.map(|v| v.number() as usize)),
            });
        }
        let commit = (|| -> Result<(), rusqlite::Error> {
            if self.revision != start_rev {
                self.conn.execute(
                    "UPDATE meta SET value = ?1 WHERE name = 'revision'",
                    params![self.revision],
                )?;
                if self.revision % 1024 < start_rev % 1024 || self.revision - start_rev >= 1024 {
                    self.compact()?;
                }
            }
            self.conn.execute_batch("COMMIT")
        })();
        match commit {
            Ok(()) => {
                if !events.is_empty() {
                    let _ = self.events.send(Arc::new(events));
                }
                for d in done {
                    match d {
                        Done::Txn(tx, r) => drop(tx.send(r)),
                        Done::Lease(tx, r) => drop(tx.send(r)),
                        Done::Unit(tx, r) => drop(tx.send(r)),
                        Done::Count(tx, r) => drop(tx.send(r)),
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store: commit failed; nothing in this batch was written");
                let _ = self.conn.execute_batch("ROLLBACK");
                self.revision = start_rev;
                for d in done {
                    let err = || StoreError::Write(e.to_string());
                    match d {
                        Done::Txn(tx, _) => drop(tx.send(Err(err()))),
                        Done::Lease(tx, _) => drop(tx.send(Err(err()))),
                        Done::Unit(tx, _) => drop(tx.send(Err(err()))),
                        Done::Count(tx, _) => drop(tx.send(Err(err()))),
                    }
                }
            }
        }
    }

    fn exec_cached(&self, sql: &str) -> Result<usize, rusqlite::Error> {
        self.conn.prepare_cached(sql)?.execute([])
    }

    fn compact(&mut self) -> Result<(), rusqlite::Error> {
        let floor = self.revision - HISTORY_KEEP;
        if floor > 0 {
            self.conn
                .execute("DELETE FROM history WHERE rev <= ?1", params![floor])?;
            self.conn.execute(
                "UPDATE meta SET value = ?1 WHERE name = 'compacted' AND value < ?1",
                params![floor],
            )?;
        }
        Ok(())
    }

    fn current(&self, key: &str) -> Result<Option<KeyValue>, rusqlite::Error> {
        let mut st = self.conn.prepare_cached(
            "SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE key = ?1",
        )?;
        st.query_row(params![key], row_to_kv).optional()
    }

    fn apply_txn(&mut self, txn: &Txn, events: &mut Vec<Event>) -> Result<TxnResponse, StoreError> {
        let mut ok = true;
        for c in &txn.compare {
            let holds = match c {
                Compare::ModRevision { key, revision } => {
                    self.current(key)?.map_or(0, |kv| kv.mod_revision) == *revision
                }
                Compare::Value { key, value } => {
                    self.current(key)?.is_some_and(|kv| &kv.value == value)
                }
            };
            if !holds {
                ok = false;
                break;
            }
        }
        let ops = if ok { &txn.success } else { &txn.failure };
        if !ops.is_empty() {
            let rev = self.revision + 1;
            let mut changed = false;
            for op in ops {
                changed |= self.apply_op(op, rev, events)?;
            }
            if changed {
                self.revision = rev;
            }
        }
        Ok(TxnResponse {
            succeeded: ok,
            revision: self.revision,
        })
    }

    fn record(
        &mut self,
        rev: Revision,
        ev: Event,
        events: &mut Vec<Event>,
    ) -> rusqlite::Result<()> {
        let seq = match self.next_seq {
            Some((r, seq)) if r == rev => seq,
            _ => 0,
        };
        self.next_seq = Some((rev, seq + 1));
        self.conn
            .prepare_cached(
                "INSERT INTO history(rev, seq, key, kind, value, create_rev, version, lease)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                rev,
                seq,
                ev.kv.key,
                if ev.kind == EventKind::Put { 0 } else { 1 },
                ev.kv.value,
                ev.kv.create_revision,
                ev.kv.version,
                ev.kv.lease
            ])?;
        events.push(ev);
        Ok(())
    }

    fn delete_key(
        &mut self,
        old: KeyValue,
        rev: Revision,
        events: &mut Vec<Event>,
    ) -> rusqlite::Result<()> {
        self.conn
            .prepare_cached("DELETE FROM kv WHERE key = ?1")?
            .execute(params![old.key])?;
        self.record(
            rev,
            Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    value: Vec::new(),
                    mod_revision: rev,
                    ..old
                },
            },
            events,
        )
    }

    fn apply_op(
        &mut self,
        op: &Op,
        rev: Revision,
        events: &mut Vec<Event>,
    ) -> Result<bool, StoreError> {
        match op {
            Op::Put { key, value, lease } => {
                if let Some(id) = lease {
                    self.lease_exists(*id)?;
                }
                let old = self.current(key)?;
                let (create_rev, version) = match &old {
                    Some(kv) => (kv.create_revision, kv.version + 1),
                    None => (rev, 1),
                };
                self.conn
                    .prepare_cached(
                        "INSERT INTO kv(key, value, create_rev, mod_rev, version, lease)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                         ON CONFLICT(key) DO UPDATE SET value = excluded.value,
                           mod_rev = excluded.mod_rev, version = excluded.version,
                           lease = excluded.lease",
                    )?
                    .execute(params![key, value, create_rev, rev, version, lease])?;
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: create_rev,
                    mod_revision: rev,
                    version,
                    lease: *lease,
                };
                self.record(
                    rev,
                    Event {
                        kind: EventKind::Put,
                        kv,
                    },
                    events,
                )?;
                Ok(true)
            }
            Op::Delete { key } => match self.current(key)? {
                Some(old) => {
                    self.delete_key(old, rev, events)?;
                    Ok(true)
                }
                None => Ok(false),
            },
            Op::DeletePrefix { prefix } => {
                let olds = range_conn(&self.conn, prefix)?;
                let any = !olds.is_empty();
                for old in olds {
                    self.delete_key(old, rev, events)?;
                }
                Ok(any)
            }
        }
    }

    fn lease_grant(&mut self, ttl: Duration, now: i64) -> Result<LeaseId, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).map_err(|_| StoreError::LeaseTooLong(ttl))?;
        let expires_ms = now
            .checked_add(ttl_ms)
            .ok_or(StoreError::LeaseTooLong(ttl))?;
        self.conn.execute(
            "INSERT INTO leases(ttl_ms, expires_ms) VALUES (?1, ?2)",
            params![ttl_ms, expires_ms],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    fn lease_keep_alive(&mut self, id: LeaseId, now: i64) -> Result<(), StoreError> {
        let n = self.conn.execute(
            "UPDATE leases SET expires_ms = ?2 + ttl_ms WHERE id = ?1",
            params![id, now],
        )?;
        if n == 0 {
            return Err(StoreError::LeaseNotFound(id));
        }
        Ok(())
    }

    fn drop_lease(&mut self, id: LeaseId, events: &mut Vec<Event>) -> Result<(), StoreError> {
        let keys: Vec<KeyValue> = {
            let mut st = self.conn.prepare_cached(
                "SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE lease = ?1",
            )?;
            st.query_map(params![id], row_to_kv)?
                .collect::<Result<Vec<_>, _>>()?
        };
        if !keys.is_empty() {
            let rev = self.revision + 1;
            for kv in keys {
                self.delete_key(kv, rev, events)?;
            }
            self.revision = rev;
        }
        self.conn
            .execute("DELETE FROM leases WHERE id = ?1", params![id])?;
        Ok(())
    }

    fn lease_revoke(&mut self, id: LeaseId, events: &mut Vec<Event>) -> Result<(), StoreError> {
        self.lease_exists(id)?;
        self.drop_lease(id, events)
    }

    /// `LeaseNotFound` unless the lease `id` is granted (and not yet expired or revoked).
    fn lease_exists(&self, id: LeaseId) -> Result<(), StoreError> {
        let exists: Option<i64> = self
            .conn
            .query_row("SELECT id FROM leases WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()?;
        match exists {
            Some(_) => Ok(()),
            None => Err(StoreError::LeaseNotFound(id)),
        }
    }

    fn expire(&mut self, now: i64, events: &mut Vec<Event>) -> Result<usize, StoreError> {
        let ids: Vec<i64> = {
            let mut st = self
                .conn
                .prepare_cached("SELECT id FROM leases WHERE expires_ms <= ?1")?;
            st.query_map(params![now], |r| r.get(0))?
                .collect::<Result<Vec<_>, _>>()?
        };
        for id in &ids {
            self.drop_lease(*id, events)?;
        }
        Ok(ids.len())
    }
}

/// What a request produced inside a batch, before it is handed to its caller.
enum Value {
    Txn(TxnResponse),
    Number(i64),
    Unit,
}

impl Value {
    fn txn(self) -> TxnResponse {
        match self {
            Value::Txn(t) => t,
            _ => TxnResponse {
                succeeded: false,
                revision: 0,
            },
        }
    }
    fn number(self) -> i64 {
        match self {
            Value::Number(n) => n,
            _ => 0,
        }
    }
}

fn fail(req: WriteReq, err: impl Fn() -> StoreError) {
    match req {
        WriteReq::Txn(_, tx) => drop(tx.send(Err(err()))),
        WriteReq::LeaseGrant(_, tx) => drop(tx.send(Err(err()))),
        WriteReq::LeaseKeepAlive(_, tx) | WriteReq::LeaseRevoke(_, tx) => drop(tx.send(Err(err()))),
        WriteReq::Expire(tx) => drop(tx.send(Err(err()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path().join("store.db")).unwrap();
        (dir, s)
    }

    #[tokio::test]
    async fn the_store_files_are_readable_by_their_owner_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        {
            let s = SqliteStore::open(&path).unwrap();
            s.put("k", b"v".to_vec()).await.unwrap();
            assert_eq!(mode("store.db"), 0o600);
            assert_eq!(
                mode("store.db-wal"),
                0o600,
                "SQLite copies the database's mode"
            );
        }
        // A store left world-readable by an older version is brought down to 0600.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(mode("store.db"), 0o600);
        assert_eq!(s.get("k").await.unwrap().unwrap().value, b"v");
    }

    #[tokio::test]
    async fn put_get_range_and_revisions() {
        let (_d, s) = store();
        assert_eq!(s.revision().await.unwrap(), 0);
        let r1 = s.put("nodes/a", b"1".to_vec()).await.unwrap();
        let r2 = s.put("nodes/b", b"2".to_vec()).await.unwrap();
        s.put("other/c", b"3".to_vec()).await.unwrap();
        assert_eq!((r1, r2), (1, 2));
        let a = s.get("nodes/a").await.unwrap().unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (1, 1, 1));
        s.put("nodes/a", b"1b".to_vec()).await.unwrap();
        let a = s.get("nodes/a").await.unwrap().unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (1, 4, 2));
        let keys: Vec<_> = s
            .range("nodes/")
            .await
            .unwrap()
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["nodes/a", "nodes/b"]);
        // Deleting an absent key changes nothing, not even the revision.
        assert_eq!(s.delete("nodes/zzz").await.unwrap(), 4);
        assert_eq!(s.delete("nodes/a").await.unwrap(), 5);
        assert!(s.get("nodes/a").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn compare_and_swap() {
        let (_d, s) = store();
        assert!(s.create("k", b"v1".to_vec()).await.unwrap());
        assert!(!s.create("k", b"v2".to_vec()).await.unwrap());
        let kv = s.get("k").await.unwrap().unwrap();
        let swap = |rev| Txn {
            compare: vec![Compare::ModRevision {
                key: "k".into(),
                revision: rev,
            }],
            success: vec![Op::put("k", b"v3".to_vec())],
            failure: vec![Op::put("lost", b"1".to_vec())],
        };
        assert!(s.txn(swap(kv.mod_revision)).await.unwrap().succeeded);
        assert!(!s.txn(swap(kv.mod_revision)).await.unwrap().succeeded);
        assert_eq!(s.get("k").await.unwrap().unwrap().value, b"v3");
        assert!(s.get("lost").await.unwrap().is_some());
        let by_value = Txn {
            compare: vec![Compare::Value {
                key: "k".into(),
                value: b"v3".to_vec(),
            }],
            success: vec![Op::DeletePrefix { prefix: "".into() }],
            failure: vec![],
        };
        assert!(s.txn(by_value).await.unwrap().succeeded);
        assert!(s.range("").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_failing_txn_changes_nothing() {
        let (_d, s) = store();
        s.put("a", b"1".to_vec()).await.unwrap();
        let bad = Txn {
            success: vec![
                Op::put("b", b"2".to_vec()),
                Op::Put {
                    key: "c".into(),
                    value: b"3".to_vec(),
                    lease: Some(999),
                },
            ],
            ..Txn::default()
        };
        assert!(matches!(
            s.txn(bad).await,
            Err(StoreError::LeaseNotFound(999))
        ));
        assert!(s.get("b").await.unwrap().is_none());
        assert_eq!(s.revision().await.unwrap(), 1);
        assert_eq!(s.put("d", b"4".to_vec()).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn watch_from_a_revision_misses_nothing() {
        let (_d, s) = store();
        s.put("n/a", b"1".to_vec()).await.unwrap();
        s.put("x/ignored", b"1".to_vec()).await.unwrap();
        s.put("n/b", b"2".to_vec()).await.unwrap();
        let mut w = s.watch("n/", 1).await.unwrap();
        s.delete("n/a").await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let ev = w.next().await.unwrap().unwrap();
            seen.push((ev.kind, ev.kv.key, ev.kv.mod_revision));
        }
        assert_eq!(
            seen,
            [
                (EventKind::Put, "n/a".to_string(), 1),
                (EventKind::Put, "n/b".to_string(), 3),
                (EventKind::Delete, "n/a".to_string(), 4)
            ]
        );
    }

    /// A dropped watch lets go of the live events at once (a reader that gave up, such as a
    /// held request that timed out, leaves nothing behind until its prefix changes).
    #[tokio::test]
    async fn a_dropped_watch_ends_its_task() {
        let (_d, s) = store();
        let before = s.inner.events.receiver_count();
        let w = s.watch("n/", 0).await.unwrap();
        assert_eq!(s.inner.events.receiver_count(), before + 1);
        drop(w);
        for _ in 0..100 {
            if s.inner.events.receiver_count() == before {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the watch's task still listens");
    }

    /// A revision that changes many keys (a DHCP batch) replays them from history in the
    /// order its ops gave, also when a failed request in the same batch took that revision
    /// first and gave it back.
    #[tokio::test]
    async fn a_lease_longer_than_the_store_holds_is_refused() {
        let (_d, s) = store();
        let err = s.lease_grant(Duration::MAX).await.unwrap_err();
        assert!(matches!(err, StoreError::LeaseTooLong(_)), "{err}");
        let id = s.lease_grant(Duration::from_secs(60)).await.unwrap();
        s.lease_keep_alive(id).await.unwrap();
    }

    #[tokio::test]
    async fn a_revision_of_many_keys_replays_in_order() {
        let (_d, s) = store();
        let many = |tag: &str| Txn {
            success: (0..300)
                .rev()
                .map(|i| Op::put(format!("m/{tag}{i:03}"), vec![1]))
                .collect(),
            ..Txn::default()
        };
        // 300 rows written, then a put under a lease that does not exist: all rolled back.
        let mut failing = many("x");
        failing
            .success
            .push(Op::put_leased("m/x-last", vec![1], 999));
        let (failed, first, second) =
            tokio::join!(s.txn(failing), s.txn(many("a")), s.txn(many("b")));
        assert!(matches!(failed, Err(StoreError::LeaseNotFound(999))));
        let (first, second) = (first.unwrap().revision, second.unwrap().revision);
        assert_eq!((first.min(second), first.max(second)), (1, 2));
        let mut w = s.watch("m/", 1).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..600 {
            let ev = w.next().await.unwrap().unwrap();
            seen.push((ev.kv.mod_revision, ev.kv.key));
        }
        let want =
            |tag: &'static str, rev| (0..300).rev().map(move |i| (rev, format!("m/{tag}{i:03}")));
        let mut expected: Vec<_> = want("a", first).chain(want("b", second)).collect();
        expected.sort_by_key(|(rev, _)| *rev);
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn concurrent_writes_are_all_durable_and_ordered() {
        let (d, s) = store();
        let mut tasks = Vec::new();
        for i in 0..500 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.put(&format!("k/{i:04}"), vec![1]).await.unwrap()
            }));
        }
        let mut revs = Vec::new();
        for t in tasks {
            revs.push(t.await.unwrap());
        }
        revs.sort();
        assert_eq!(revs, (1..=500).collect::<Vec<_>>());
        drop(s);
        let s = SqliteStore::open(d.path().join("store.db")).unwrap();
        assert_eq!(s.range("k/").await.unwrap().len(), 500);
        assert_eq!(s.revision().await.unwrap(), 500);
    }

    /// Puts `key` bound to `lease`.
    async fn put_leased(s: &SqliteStore, key: &str, lease: LeaseId) {
        s.txn(Txn {
            success: vec![Op::put_leased(key, b"x".to_vec(), lease)],
            ..Txn::default()
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn leases_delete_their_keys() {
        let (_d, s) = store();
        let lease = s.lease_grant(Duration::from_millis(300)).await.unwrap();
        put_leased(&s, "eph", lease).await;
        s.lease_keep_alive(lease).await.unwrap();
        assert!(s.get("eph").await.unwrap().is_some());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while s.get("eph").await.unwrap().is_some() {
            assert!(std::time::Instant::now() < deadline, "lease never expired");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(matches!(
            s.lease_keep_alive(lease).await,
            Err(StoreError::LeaseNotFound(_))
        ));
        let l2 = s.lease_grant(Duration::from_secs(60)).await.unwrap();
        put_leased(&s, "eph2", l2).await;
        s.lease_revoke(l2).await.unwrap();
        assert!(s.get("eph2").await.unwrap().is_none());
    }

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_end("a\x7f").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
    }

    /// The statements the store ran at every open before it recorded its file layout.
    const UNVERSIONED_OPEN: &str =
        "INSERT OR IGNORE INTO meta(name, value) VALUES ('revision', 0), ('compacted', 0);";

    #[tokio::test]
    async fn a_binary_from_before_versions_is_refused_with_a_reason() {
        let (dir, s) = store();
        s.put("nodes/a", b"1".to_vec()).await.unwrap();
        drop(s);
        let conn = Connection::open(dir.path().join("store.db")).unwrap();
        let err = conn
            .execute_batch(UNVERSIONED_OPEN)
            .unwrap_err()
            .to_string();
        assert!(err.contains("opened by a newer paddock"), "{err}");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, FILE_VERSION);
        drop(conn);
        // The current binary opens it again, with nothing lost.
        let s = SqliteStore::open(dir.path().join("store.db")).unwrap();
        assert_eq!(s.get("nodes/a").await.unwrap().unwrap().value, b"1");
    }

    #[tokio::test]
    async fn an_earlier_release_s_file_is_sealed_only_when_asked() {
        let (dir, s) = store();
        s.put("nodes/a", b"1".to_vec()).await.unwrap();
        drop(s);
        let path = dir.path().join("store.db");
        // What an earlier release left: no trigger, layout version 0.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("DROP TRIGGER refuse_unversioned_binaries; PRAGMA user_version = 0;")
            .unwrap();
        drop(conn);
        let s = SqliteStore::open(&path).unwrap();
        let earlier = Connection::open(&path).unwrap();
        earlier.execute_batch(UNVERSIONED_OPEN).unwrap();
        s.seal_layout().await.unwrap();
        let err = earlier
            .execute_batch(UNVERSIONED_OPEN)
            .unwrap_err()
            .to_string();
        assert!(err.contains("opened by a newer paddock"), "{err}");
        assert_eq!(s.get("nodes/a").await.unwrap().unwrap().value, b"1");
    }

    #[tokio::test]
    async fn a_file_of_a_later_layout_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        SqliteStore::open(&path)
            .unwrap()
            .put("k", b"v".to_vec())
            .await
            .unwrap();
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", FILE_VERSION + 1)
            .unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();
        let err = SqliteStore::open(&path).err().unwrap();
        assert!(
            matches!(err, StoreError::NewerFile { found, .. } if found == FILE_VERSION + 1),
            "{err}"
        );
        assert!(err.to_string().contains("written by a newer release"));
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[tokio::test]
    async fn a_snapshot_is_one_revision_even_beside_the_serving_process() {
        let (dir, s) = store();
        for i in 0..50 {
            s.put(&format!("k/{i:03}"), vec![i]).await.unwrap();
        }
        let leased = s.lease_grant(Duration::from_secs(60)).await.unwrap();
        s.txn(Txn {
            success: vec![Op::put_leased("leader", b"me".to_vec(), leased)],
            ..Txn::default()
        })
        .await
        .unwrap();
        let own = s.snapshot().await.unwrap();
        let other = read_snapshot(&dir.path().join("store.db")).unwrap();
        assert_eq!(own, other);
        assert_eq!(own.revision, s.revision().await.unwrap());
        assert_eq!(own.kvs.len(), 51);
        assert!(own.kvs.windows(2).all(|w| w[0].key < w[1].key));
        // Writes go on while snapshots are read: each one is a whole revision.
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..200u32 {
                    s.txn(Txn {
                        success: vec![
                            Op::put(format!("pair/{i}/a"), i.to_be_bytes().to_vec()),
                            Op::put(format!("pair/{i}/b"), i.to_be_bytes().to_vec()),
                        ],
                        ..Txn::default()
                    })
                    .await
                    .unwrap();
                }
            })
        };
        let path = dir.path().join("store.db");
        while !writer.is_finished() {
            let snap = tokio::task::spawn_blocking({
                let path = path.clone();
                move || read_snapshot(&path).unwrap()
            })
            .await
            .unwrap();
            let pairs = snap
                .kvs
                .iter()
                .filter(|kv| kv.key.starts_with("pair/"))
                .count();
            assert_eq!(pairs % 2, 0, "a transaction's writes are seen whole");
            assert!(snap.kvs.iter().all(|kv| kv.mod_revision <= snap.revision));
        }
    }
}
