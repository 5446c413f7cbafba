//! `paddock backup` and `paddock restore`: one tar file that holds what an appliance needs to
//! come back on another host.
//!
//! Layout of the file, in this order:
//! - `manifest.json`: [`Manifest`] (format, the release and store schema that wrote it, the
//!   store revision the snapshot stands at, counts);
//! - `store.jsonl`: every key of the store at that revision, one `{"key", "value"}` line each
//!   (values base64). The CA, nodes, leases, images' index, rules, the spec and tokens all live
//!   in the store. Keys bound to a store lease (leadership, census registrations) are left
//!   out: they belong to the processes that hold them;
//! - `certs/…`: this host's certificate directory (its key and certificate, operators'
//!   certificates `certs init` wrote);
//! - `objects/…`: the image server's objects, unless the backup only references them;
//! - `config.toml`: the configuration file, when one was given.
//!
//! The snapshot is one read transaction (SQLite's WAL, or one etcd range read), so a backup
//! taken while the appliance serves is consistent: every write acknowledged before it began is
//! in it, and no transaction is cut in half. Objects are immutable once linked into place, so
//! copying them beside a serving image server is safe. The file is written as `FILE.partial`,
//! fsynced and renamed: a backup is whole or absent.
//!
//! A restore checks the whole file first (manifest, schema, every line, every member a regular
//! file at a plain path) and changes nothing when any of it is wrong; it then writes into an
//! empty store only, never over an existing file. A failure after that (the disk, the store)
//! leaves a partial restore: remove the data directory (or empty the etcd cluster) and run it
//! again.

use std::io::{BufRead, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use base64::Engine;
use paddock_store::{KeyValue, Op, Snapshot, Store, Txn};
use serde::{Deserialize, Serialize};

use crate::schema::{self, Stamp};

/// The format this binary writes and reads.
pub const FORMAT: u32 = 1;
const MANIFEST: &str = "manifest.json";
const STORE: &str = "store.jsonl";
const CONFIG: &str = "config.toml";
const CERTS: &str = "certs";
const OBJECTS: &str = "objects";
/// Keys per restoring transaction (etcd's default limit is 128 operations).
const RESTORE_BATCH: usize = 100;
/// Bytes of keys and values per restoring transaction: etcd refuses requests over 1.5 MiB
/// by default.
const RESTORE_BATCH_BYTES: usize = 1024 * 1024;
/// A manifest is a few hundred bytes; anything near this is not one.
const MANIFEST_MAX: u64 = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The release that wrote it.
    pub paddock: String,
    /// The store's schema stamp (`None`: a store from before versions).
    pub schema: Option<Stamp>,
    pub revision: i64,
    pub keys: usize,
    pub created_unix_ms: i64,
    /// Whether the image objects are in the file (else they stay where `objects_dir` was).
    pub objects: bool,
    pub objects_dir: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct Line {
    key: String,
    value: String,
}

/// Where the store is read from.
pub enum StoreSource {
    /// A SQLite store file, read beside whoever serves it.
    Sqlite(PathBuf),
    /// An open store (etcd, or the serving process's own).
    Open(Arc<dyn Store>),
}

/// What goes into a backup.
pub struct Sources {
    pub store: StoreSource,
    pub certs_dir: Option<PathBuf>,
    pub objects_dir: Option<PathBuf>,
    /// Copy the objects (`false`: the manifest only names their directory).
    pub with_objects: bool,
    pub config_file: Option<PathBuf>,
}

/// What a backup wrote.
#[derive(Debug)]
pub struct Written {
    pub manifest: Manifest,
    pub files: usize,
    pub bytes: u64,
}

fn bar(len: u64, what: &'static str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("  {prefix:8} [{bar:30}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("# "));
    }
    bar.set_prefix(what);
    bar
}

/// Writes the backup of `src` to `dest` (see the module documentation).
pub async fn write(dest: &Path, src: Sources) -> anyhow::Result<Written> {
    let snap = match &src.store {
        StoreSource::Sqlite(path) => {
            let path = path.clone();
            tokio::task::spawn_blocking(move || paddock_store::read_snapshot(&path))
                .await
                .context("reading the store")??
        }
        StoreSource::Open(store) => store.snapshot().await?,
    };
    let dest = dest.to_path_buf();
    tokio::task::spawn_blocking(move || write_file(&dest, &snap, &src))
        .await
        .context("writing the backup")?
}

fn kept(snap: &Snapshot) -> impl Iterator<Item = &KeyValue> {
    snap.kvs.iter().filter(|kv| kv.lease.is_none())
}

fn write_file(dest: &Path, snap: &Snapshot, src: &Sources) -> anyhow::Result<Written> {
    let schema = snap
        .kvs
        .iter()
        .find(|kv| kv.key == schema::SCHEMA_KEY)
        .map(|kv| serde_json::from_slice::<Stamp>(&kv.value))
        .transpose()
        .context("the store's schema stamp is unreadable")?;
    let manifest = Manifest {
        format: FORMAT,
        paddock: env!("CARGO_PKG_VERSION").to_string(),
        schema,
        revision: snap.revision,
        keys: kept(snap).count(),
        created_unix_ms: paddock_clock::now().0,
        objects: src.with_objects && src.objects_dir.is_some(),
        objects_dir: src.objects_dir.clone(),
    };
    let mut partial = dest.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    // A leftover of a crashed backup is removed, and the new file created exclusively: never
    // through a link someone left in its place.
    match std::fs::remove_file(&partial) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", partial.display()));
        }
        _ => {}
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_private()
        .open(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.mode(tar::HeaderMode::Deterministic);
    let mut files = 0;
    let add = |tar: &mut tar::Builder<_>, name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(u64::try_from(bytes.len())?);
        h.set_mode(0o600);
        h.set_mtime(0);
        tar.append_data(&mut h, name, bytes)
            .with_context(|| format!("writing {name}"))
    };
    add(&mut tar, MANIFEST, &serde_json::to_vec_pretty(&manifest)?)?;
    let keys = bar(u64::try_from(manifest.keys)?, "store");
    let mut lines = Vec::new();
    for kv in kept(snap) {
        serde_json::to_writer(
            &mut lines,
            &Line {
                key: kv.key.clone(),
                value: base64::engine::general_purpose::STANDARD.encode(&kv.value),
            },
        )?;
        lines.push(b'\n');
        keys.inc(1);
    }
    keys.finish_and_clear();
    add(&mut tar, STORE, &lines)?;
    if let Some(dir) = &src.certs_dir
        && dir.is_dir()
    {
        files += append_tree(&mut tar, dir, CERTS, None)?;
    }
    if manifest.objects
        && let Some(dir) = &src.objects_dir
    {
        let objects = dir.join(OBJECTS);
        if objects.is_dir() {
            let count = walkdir_count(&objects);
            let b = bar(count, "objects");
            files += append_tree(&mut tar, &objects, OBJECTS, Some(&b))?;
            b.finish_and_clear();
        }
    }
    if let Some(config) = &src.config_file {
        let bytes =
            std::fs::read(config).with_context(|| format!("reading {}", config.display()))?;
        add(&mut tar, CONFIG, &bytes)?;
        files += 1;
    }
    let file = tar
        .into_inner()
        .context("finishing the archive")?
        .into_inner()
        .map_err(|e| e.into_error())
        .context("writing the archive")?;
    file.sync_all().context("syncing the backup")?;
    let bytes = file.metadata()?.len();
    drop(file);
    std::fs::rename(&partial, dest)
        .with_context(|| format!("renaming {} into place", partial.display()))?;
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent).and_then(|d| d.sync_all()).ok();
    }
    Ok(Written {
        manifest,
        files,
        bytes,
    })
}

trait PrivateMode {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateMode for std::fs::OpenOptions {
    /// A backup holds the CA's key: readable by its owner alone.
    fn mode_private(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

fn walkdir_count(dir: &Path) -> u64 {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// Appends the regular files below `dir` as `prefix/…`; a file that vanishes while the walk
/// runs (an expired image's object) is skipped. Returns how many were added.
fn append_tree<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &Path,
    prefix: &str,
    progress: Option<&indicatif::ProgressBar>,
) -> anyhow::Result<usize> {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)
            .with_context(|| format!("reading {}", d.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {}", d.display()))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(path);
                continue;
            }
            if !t.is_file() {
                continue;
            }
            let Ok(rel) = path.strip_prefix(dir) else {
                continue;
            };
            let name = Path::new(prefix).join(rel);
            let mut f = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            // The header says 0600 (these are keys and objects) and the size as opened; a file
            // that grows meanwhile is cut there rather than breaking the archive.
            let size = f.metadata()?.len();
            let mut h = tar::Header::new_gnu();
            h.set_size(size);
            h.set_mode(0o600);
            h.set_mtime(0);
            h.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut h, &name, (&mut f).take(size))
                .with_context(|| format!("adding {}", path.display()))?;
            n += 1;
            if let Some(b) = progress {
                b.inc(1);
            }
        }
    }
    Ok(n)
}

/// Where a restore puts things.
pub struct Targets {
    pub store: Arc<dyn Store>,
    pub certs_dir: PathBuf,
    pub objects_dir: PathBuf,
    /// Where the backed-up configuration goes; an existing file is kept and the backup's copy
    /// written beside it as `<file>.from-backup`, unless `replace_config`.
    pub config_file: Option<PathBuf>,
    /// The file at `config_file` is only a default nobody edited (the package's): replace it.
    pub replace_config: bool,
}

/// What a restore brought back.
#[derive(Debug)]
pub struct Restored {
    pub manifest: Manifest,
    pub keys: usize,
    pub certs: usize,
    pub objects: usize,
    pub config: Option<PathBuf>,
}

/// A tar member's path, if it is a plain relative one below `top` (`certs`, `objects`).
fn below(path: &Path, top: &str) -> Option<PathBuf> {
    let rest = path.strip_prefix(top).ok()?;
    let plain = rest.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && rest.components().next().is_some()).then(|| rest.to_path_buf())
}

fn parse_line(line: &[u8]) -> anyhow::Result<(String, Vec<u8>)> {
    let l: Line = serde_json::from_slice(line)?;
    let value = base64::engine::general_purpose::STANDARD.decode(l.value)?;
    Ok((l.key, value))
}

/// Reads the whole file once without writing anything: the manifest, the store's lines, the
/// members' paths. Errors name what is wrong.
fn check(file: &Path) -> anyhow::Result<Manifest> {
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(f));
    let mut manifest: Option<Manifest> = None;
    let mut lines = 0;
    for entry in archive.entries().context("not a tar archive")? {
        let mut entry = entry.context("a damaged archive member")?;
        let path = entry.path()?.into_owned();
        // A backup holds regular files only: a link, directory or device member would be
        // written as an empty file, or stop a restore half way.
        if !entry.header().entry_type().is_file() {
            bail!(
                "member {} of the backup is not a regular file",
                path.display()
            );
        }
        match path.to_str() {
            Some(MANIFEST) => {
                let mut bytes = Vec::new();
                (&mut entry).take(MANIFEST_MAX).read_to_end(&mut bytes)?;
                if u64::try_from(bytes.len())? == MANIFEST_MAX {
                    bail!("{MANIFEST} is larger than a manifest ({MANIFEST_MAX} bytes)");
                }
                let m: Manifest =
                    serde_json::from_slice(&bytes).context("manifest.json is not a manifest")?;
                if m.format != FORMAT {
                    bail!(
                        "backup format {} is not one this paddock reads ({FORMAT})",
                        m.format
                    );
                }
                if let Some(s) = m.schema
                    && s.readable_from > schema::CURRENT
                {
                    bail!(
                        "the backup's store is schema {} (readable from {}), newer than this paddock's {}: restore it with release {} or newer",
                        s.version,
                        s.readable_from,
                        schema::CURRENT,
                        m.paddock
                    );
                }
                manifest = Some(m);
            }
            _ if manifest.is_none() => bail!("{} does not begin with {MANIFEST}", file.display()),
            Some(STORE) => {
                for (i, line) in std::io::BufReader::new(&mut entry).split(b'\n').enumerate() {
                    parse_line(&line?)
                        .with_context(|| format!("{STORE} line {} is unreadable", i + 1))?;
                    lines += 1;
                }
            }
            Some(CONFIG) => {}
            _ if below(&path, CERTS).is_some() || below(&path, OBJECTS).is_some() => {}
            _ => bail!("unexpected member {} in the backup", path.display()),
        }
    }
    let m = manifest.with_context(|| format!("{} holds no {MANIFEST}", file.display()))?;
    if lines != m.keys {
        bail!(
            "the backup is cut short: {lines} of the {} keys its manifest counts",
            m.keys
        );
    }
    Ok(m)
}

/// The configuration is read by the service's own user, as Debian ships configuration files.
const CONFIG_MODE: u32 = 0o644;

/// Creates `path` (never over an existing file) readable by its owner alone: certificates'
/// keys and image objects.
fn write_private(path: &Path, bytes: &mut impl Read) -> anyhow::Result<()> {
    write_new(path, bytes, 0o600)
}

fn write_new(path: &Path, bytes: &mut impl Read, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    // Exactly `mode`, whatever the umask took away.
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    std::io::copy(bytes, &mut f).with_context(|| format!("writing {}", path.display()))?;
    f.sync_all()?;
    Ok(())
}

/// The configuration file a backup holds, if any (the file is checked whole first).
pub fn config_in(file: &Path) -> anyhow::Result<Option<String>> {
    check(file)?;
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(f));
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.path()?.to_str() == Some(CONFIG) {
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .context("the backup's configuration is not text")?;
            return Ok(Some(text));
        }
    }
    Ok(None)
}

/// Writes the backup's configuration to `dest`: over it when `replace` (through a file beside
/// it, renamed into place), else beside an existing one as `<dest>.from-backup`. Returns where.
fn restore_config(dest: &Path, replace: bool, bytes: &mut impl Read) -> anyhow::Result<PathBuf> {
    let beside = |suffix: &str| {
        let mut s = dest.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    if replace {
        let tmp = beside(".restoring");
        let _ = std::fs::remove_file(&tmp);
        write_new(&tmp, bytes, CONFIG_MODE)?;
        std::fs::rename(&tmp, dest).with_context(|| format!("replacing {}", dest.display()))?;
        return Ok(dest.to_path_buf());
    }
    let to = if dest.exists() {
        beside(".from-backup")
    } else {
        dest.to_path_buf()
    };
    write_new(&to, bytes, CONFIG_MODE)?;
    Ok(to)
}

/// Restores `file` into `to` (see the module documentation).
pub async fn restore(file: &Path, to: Targets) -> anyhow::Result<Restored> {
    let owned = file.to_path_buf();
    let manifest = tokio::task::spawn_blocking(move || check(&owned))
        .await
        .context("checking the backup")??;
    let present = to.store.snapshot().await?;
    // A new store carries only its schema stamp; the backup's own replaces it.
    if let Some(kv) = present
        .kvs
        .iter()
        .find(|kv| kv.lease.is_none() && kv.key != schema::SCHEMA_KEY)
    {
        bail!(
            "the store already holds data (key {}): restore goes onto a fresh data directory or an empty etcd cluster",
            kv.key
        );
    }
    let mut restored = Restored {
        manifest: manifest.clone(),
        keys: 0,
        certs: 0,
        objects: 0,
        config: None,
    };
    // The store's keys are written as the file is read, beside its files (each created new:
    // an existing one is an error, never overwritten). Everything was checked above, so what
    // can still fail here is the disk or the store itself.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<(String, Vec<u8>)>>(4);
    let owned = file.to_path_buf();
    let certs_dir = to.certs_dir.clone();
    let objects_dir = to.objects_dir.clone();
    let config_file = to.config_file.clone();
    let replace_config = to.replace_config;
    let keys = manifest.keys;
    let reader = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let f = std::fs::File::open(&owned)?;
        let mut archive = tar::Archive::new(std::io::BufReader::new(f));
        let (mut certs, mut objects, mut config) = (0, 0, None);
        let progress = bar(u64::try_from(keys)?, "store");
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.into_owned();
            if path.to_str() == Some(STORE) {
                let mut batch = Vec::with_capacity(RESTORE_BATCH);
                let mut bytes = 0;
                for line in std::io::BufReader::new(&mut entry).split(b'\n') {
                    let (key, value) = parse_line(&line?)?;
                    bytes += key.len() + value.len();
                    batch.push((key, value));
                    if batch.len() == RESTORE_BATCH || bytes >= RESTORE_BATCH_BYTES {
                        bytes = 0;
                        progress.inc(u64::try_from(batch.len())?);
                        if tx.blocking_send(std::mem::take(&mut batch)).is_err() {
                            bail!("the store stopped taking keys");
                        }
                    }
                }
                if !batch.is_empty() && tx.blocking_send(batch).is_err() {
                    bail!("the store stopped taking keys");
                }
            } else if path.to_str() == Some(CONFIG) {
                if let Some(dest) = &config_file {
                    config = Some(restore_config(dest, replace_config, &mut entry)?);
                }
            } else if let Some(rel) = below(&path, CERTS) {
                write_private(&certs_dir.join(rel), &mut entry)?;
                certs += 1;
            } else if let Some(rel) = below(&path, OBJECTS) {
                write_private(&objects_dir.join(OBJECTS).join(rel), &mut entry)?;
                objects += 1;
            }
        }
        progress.finish_and_clear();
        Ok((certs, objects, config))
    });
    while let Some(batch) = rx.recv().await {
        restored.keys += batch.len();
        let ops = batch.into_iter().map(|(k, v)| Op::put(k, v)).collect();
        let written = to
            .store
            .txn(Txn {
                success: ops,
                ..Txn::default()
            })
            .await;
        if let Err(e) = written {
            // The reader stops at its next batch; nothing is written after the error is told.
            drop(rx);
            let _ = reader.await;
            return Err(e).context("writing the store");
        }
    }
    let (certs, objects, config) = reader.await.context("reading the backup")??;
    if manifest.schema.is_none() {
        // A store from before versions: unstamped again, so that `serve` backs it up and
        // migrates it.
        to.store.delete(schema::SCHEMA_KEY).await?;
    }
    restored.certs = certs;
    restored.objects = objects;
    restored.config = config;
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_outside_their_directory_are_not_below_it() {
        assert_eq!(
            below(Path::new("certs/host.pem"), CERTS),
            Some(PathBuf::from("host.pem"))
        );
        assert_eq!(
            below(Path::new("objects/ab/cdef"), OBJECTS),
            Some(PathBuf::from("ab/cdef"))
        );
        assert_eq!(below(Path::new("certs/../etc/passwd"), CERTS), None);
        assert_eq!(below(Path::new("certs"), CERTS), None);
        assert_eq!(below(Path::new("/certs/x"), CERTS), None);
        assert_eq!(below(Path::new("objectsx/a"), OBJECTS), None);
    }

    #[test]
    fn the_configuration_replaces_only_a_default() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("paddock.toml");
        assert_eq!(restore_config(&f, false, &mut &b"new"[..]).unwrap(), f);
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        let beside = restore_config(&f, false, &mut &b"again"[..]).unwrap();
        assert_eq!(beside, d.path().join("paddock.toml.from-backup"));
        assert_eq!(
            std::fs::read(&f).unwrap(),
            b"new",
            "an operator's file is kept"
        );
        assert_eq!(restore_config(&f, true, &mut &b"over"[..]).unwrap(), f);
        assert_eq!(std::fs::read(&f).unwrap(), b"over");
        assert!(!d.path().join("paddock.toml.restoring").exists());
    }

    async fn store_with(keys: &[(&str, &[u8])]) -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let s = paddock_store::SqliteStore::open(dir.path().join("store.db")).unwrap();
        for (k, v) in keys {
            s.put(k, v.to_vec()).await.unwrap();
        }
        (dir, Arc::new(s))
    }

    /// A backup of `store` alone (no certificates, objects or configuration) into `file`.
    async fn write_store_only(file: &Path, store: Arc<dyn Store>) {
        let sources = Sources {
            store: StoreSource::Open(store),
            certs_dir: None,
            objects_dir: None,
            with_objects: false,
            config_file: None,
        };
        write(file, sources).await.unwrap();
    }

    fn targets(dir: &Path, store: Arc<dyn Store>) -> Targets {
        Targets {
            store,
            certs_dir: dir.join("certs"),
            objects_dir: dir.join("images"),
            config_file: Some(dir.join("paddock.toml")),
            replace_config: false,
        }
    }

    #[tokio::test]
    async fn a_backup_restores_keys_files_and_config_and_skips_leased_keys() {
        let (src, store) = store_with(&[("nodes/a", b"{\"x\":1}"), ("ca/key", &[0, 255, 7])]).await;
        let lease = store
            .lease_grant(std::time::Duration::from_secs(60))
            .await
            .unwrap();
        store
            .txn(Txn {
                success: vec![Op::put_leased("leader", b"me".to_vec(), lease)],
                ..Txn::default()
            })
            .await
            .unwrap();
        let certs = src.path().join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::write(certs.join("host.pem"), "cert").unwrap();
        let objects = src.path().join("images");
        std::fs::create_dir_all(objects.join("objects/ab")).unwrap();
        std::fs::write(objects.join("objects/ab/cdef"), "object").unwrap();
        std::fs::create_dir_all(objects.join("tmp")).unwrap();
        std::fs::write(objects.join("tmp/half"), "x").unwrap();
        std::fs::write(src.path().join("paddock.toml"), "data_dir = \"/x\"\n").unwrap();
        let file = src.path().join("b.tar");
        let w = write(
            &file,
            Sources {
                store: StoreSource::Sqlite(src.path().join("store.db")),
                certs_dir: Some(certs),
                objects_dir: Some(objects),
                with_objects: true,
                config_file: Some(src.path().join("paddock.toml")),
            },
        )
        .await
        .unwrap();
        assert_eq!(w.manifest.keys, 2);
        assert_eq!(w.files, 3);
        assert!(!src.path().join("b.tar.partial").exists());

        let (dst, fresh) = store_with(&[]).await;
        let r = restore(&file, targets(dst.path(), fresh.clone()))
            .await
            .unwrap();
        assert_eq!((r.keys, r.certs, r.objects), (2, 1, 1));
        assert_eq!(
            fresh.get("ca/key").await.unwrap().unwrap().value,
            vec![0, 255, 7]
        );
        assert!(fresh.get("leader").await.unwrap().is_none());
        let read = |p: &str| std::fs::read_to_string(dst.path().join(p)).unwrap();
        assert_eq!(read("certs/host.pem"), "cert");
        assert_eq!(read("images/objects/ab/cdef"), "object");
        assert_eq!(read("paddock.toml"), "data_dir = \"/x\"\n");
        assert!(!dst.path().join("images/tmp").exists());

        // Never onto a store that holds data.
        let err = restore(&file, targets(dst.path(), fresh))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("already holds data"), "{err}");
    }

    #[tokio::test]
    async fn a_damaged_or_foreign_file_changes_nothing() {
        let (src, store) = store_with(&[("nodes/a", b"1"), ("nodes/b", b"2")]).await;
        let file = src.path().join("b.tar");
        write_store_only(&file, store).await;
        let bytes = std::fs::read(&file).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("not a tar", b"hello".to_vec()),
            ("cut short", bytes[..bytes.len() / 2].to_vec()),
            ("empty", Vec::new()),
        ];
        for (what, bad) in cases {
            let f = src.path().join("bad.tar");
            std::fs::write(&f, bad).unwrap();
            let (dst, fresh) = store_with(&[]).await;
            let err = restore(&f, targets(dst.path(), fresh.clone())).await;
            assert!(err.is_err(), "{what} was restored");
            assert!(fresh.snapshot().await.unwrap().kvs.is_empty(), "{what}");
            assert!(!dst.path().join("certs").exists(), "{what}");
        }
        // A member that climbs out of its directory.
        let f = src.path().join("evil.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&f).unwrap());
        let m = serde_json::to_vec(&Manifest {
            format: FORMAT,
            paddock: "x".into(),
            schema: None,
            revision: 1,
            keys: 0,
            created_unix_ms: 0,
            objects: false,
            objects_dir: None,
        })
        .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(m.len() as u64);
        tar.append_data(&mut h, MANIFEST, &m[..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        // `append_data` refuses `..`; write the name into the header as an attacker would.
        h.as_gnu_mut().unwrap().name[..14].copy_from_slice(b"certs/../evil\0");
        h.set_cksum();
        tar.append(&h, &b"x"[..]).unwrap();
        tar.finish().unwrap();
        drop(tar);
        let (dst, fresh) = store_with(&[]).await;
        let err = restore(&f, targets(dst.path(), fresh)).await.unwrap_err();
        assert!(err.to_string().contains("unexpected member"), "{err}");
        assert!(!dst.path().join("evil").exists());
        // A link where a certificate should be.
        let f = src.path().join("link.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&f).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(m.len() as u64);
        tar.append_data(&mut h, MANIFEST, &m[..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        tar.append_link(&mut h, "certs/host.key", "/etc/shadow")
            .unwrap();
        tar.finish().unwrap();
        drop(tar);
        let (dst, fresh) = store_with(&[]).await;
        let err = restore(&f, targets(dst.path(), fresh)).await.unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(!dst.path().join("certs").exists());
    }

    #[tokio::test]
    async fn a_backup_of_a_newer_schema_is_refused() {
        let newer = Stamp {
            version: schema::CURRENT + 1,
            readable_from: schema::CURRENT + 1,
        };
        let (src, store) = store_with(&[]).await;
        store
            .put(schema::SCHEMA_KEY, serde_json::to_vec(&newer).unwrap())
            .await
            .unwrap();
        let file = src.path().join("b.tar");
        write_store_only(&file, store).await;
        let (dst, fresh) = store_with(&[]).await;
        let err = restore(&file, targets(dst.path(), fresh.clone()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("newer than this paddock"), "{err}");
        assert!(fresh.snapshot().await.unwrap().kvs.is_empty());
    }
}
