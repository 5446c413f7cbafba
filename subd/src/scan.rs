//! One scan of a root (Dominator's `lib/filesystem/scanner/walk.go`).
//!
//! The walk reads each directory through a descriptor opened with `O_NOFOLLOW`, names sorted,
//! and stats entries relative to it; it never crosses into another file system (`st_dev`
//! compare), skips `/.subd` at the top, every path the exclusion filter matches (with
//! everything below it) and sockets. Hard links (one `st_ino` seen again) become extra names
//! of one tree inode; a directory seen twice (a bind mount of the same file system) is
//! skipped. Then every regular file is read whole and SHA-512 hashed, on several threads when
//! unthrottled: there is no mtime shortcut, so corruption that keeps size and mtime is caught.
//! The one exception is a file subd itself hashed when it wrote it, untouched since (same
//! inode, size, mtime and ctime): the first scan after takes it at that hash
//! ([`crate::vouch`]).
//! A file whose size, mtime or ctime changes while it is read, or that was replaced since the
//! walk saw it, is left out of the tree (listed in [`ScanStats::unstable`]) and retried by the
//! next scan. Last, the object cache `.subd/objects/xx/yy/<hash>` is listed.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, PosixFadviseAdvice, posix_fadvise, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use paddock_image::{FileSystem, Filter, Inode, Mtime, ObjectHasher, ObjectId, SpecialKind};
use serde::{Deserialize, Serialize};

use crate::ratelimit::{ThreadMeter, Throttle, Usage};
use crate::vouch::{Key, Vouched};

/// subd's private directory at the top of the root (never scanned).
pub const SUBD_DIR: &str = ".subd";
/// The object cache, relative to the root.
pub const OBJECTS_DIR: &str = ".subd/objects";
pub use paddock_subd_proto::DEFAULT_EXCLUSIONS;
/// Bytes per `read` while hashing.
pub const READ_CHUNK: usize = 1 << 20;
/// Error messages kept per scan (the count is kept in full).
const MAX_ERRORS: usize = 100;

/// [`DEFAULT_EXCLUSIONS`] as a filter.
pub fn default_exclusions() -> Filter {
    Filter::from_lines(DEFAULT_EXCLUSIONS.iter().map(|s| s.to_string()))
        .expect("the default exclusions are valid regular expressions")
}

/// What one scan found: the tree and the object cache. Two scans are the same (no new
/// generation) when both are equal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    pub fs: FileSystem,
    pub objects: BTreeSet<ObjectId>,
}

/// How a scan went (not part of the comparison).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Regular files hashed.
    pub files: u64,
    /// Bytes hashed.
    pub bytes: u64,
    /// Regular files taken at the hash subd computed when it wrote them ([`Vouched`]).
    pub vouched: u64,
    /// Bytes read from the device by the scan's threads (`ru_inblock` × 512).
    pub media_bytes: u64,
    /// CPU time of the scan's threads.
    pub cpu: Duration,
    /// Time slept for the rate limits (summed over threads).
    pub slept: Duration,
    pub elapsed: Duration,
    /// False when the scan was stopped (pause, shutdown) or ran out of time: its result
    /// is partial and must not be published.
    pub complete: bool,
    /// Files that changed while they were hashed: left out of the tree, retried next scan.
    pub unstable: Vec<String>,
    /// Entries that could not be read (left out), the first [`MAX_ERRORS`] of them.
    pub errors: Vec<String>,
    pub error_count: u64,
}

impl ScanStats {
    fn error(&mut self, msg: String) {
        self.error_count += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(msg);
        }
    }
}

#[derive(Clone, Debug)]
pub struct ScanResult {
    pub scan: Scan,
    pub stats: ScanStats,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("scan root {path}: {source}")]
    Root { path: PathBuf, source: io::Error },
    #[error("scan root {0}: not a directory")]
    NotDir(PathBuf),
}

/// How to scan.
#[derive(Clone, Copy)]
pub struct ScanOptions<'a> {
    pub exclusions: &'a Filter,
    /// Hashing threads (at least 1).
    pub threads: usize,
    /// The rate limits to pace against; `None` runs flat out.
    pub throttle: Option<&'a Throttle>,
    /// Set to abandon the scan (the result is then incomplete).
    pub stop: Option<&'a AtomicBool>,
    /// Files subd vouches for, taken without reading them.
    pub vouched: Option<&'a Vouched>,
    /// Stop at this time (the result is then incomplete).
    pub deadline: Option<Instant>,
}

impl<'a> ScanOptions<'a> {
    pub fn new(exclusions: &'a Filter) -> Self {
        ScanOptions {
            exclusions,
            threads: 1,
            throttle: None,
            stop: None,
            vouched: None,
            deadline: None,
        }
    }

    fn halted(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::Relaxed))
            || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn throttled(&self) -> Option<&'a Throttle> {
        self.throttle.filter(|t| !t.is_unlimited())
    }
}

/// A regular file to hash.
struct Job {
    tree_ino: u64,
    path: PathBuf,
    tree_path: String,
    dev: u64,
    ino: u64,
}

enum Hashed {
    /// `vouched`: taken at the hash subd itself computed when it wrote the file
    /// ([`Vouched`]), not read.
    Done {
        object: ObjectId,
        st: FileStat,
        vouched: bool,
    },
    Unstable,
    Failed(String),
    NotReached,
}

#[derive(Default)]
struct WorkerTotals {
    files: u64,
    bytes: u64,
    vouched: u64,
    usage: Usage,
    slept: Duration,
}

/// Scans `root` (a directory; symlinks to one are followed for the root only).
pub fn scan(root: &Path, opts: &ScanOptions) -> Result<ScanResult, ScanError> {
    let started = Instant::now();
    let root_err = |source: io::Error| ScanError::Root {
        path: root.to_path_buf(),
        source,
    };
    let st = nix::sys::stat::stat(root).map_err(|e| root_err(e.into()))?;
    if kind(&st) != SFlag::S_IFDIR {
        return Err(ScanError::NotDir(root.to_path_buf()));
    }
    let mut stats = ScanStats::default();
    let mut walk_meter = ThreadMeter::start();
    let mut walk_usage = Usage::default();

    // Walk: the tree, with regular files not yet hashed.
    let mut fs = FileSystem::with_root(perm(&st), st.st_uid, st.st_gid);
    let mut links: HashMap<u64, String> = HashMap::new();
    let mut dirs_seen: HashSet<u64> = HashSet::from([st.st_ino]);
    let mut jobs: Vec<Job> = Vec::new();
    let mut queue: VecDeque<(PathBuf, String, u64)> = VecDeque::new();
    queue.push_back((root.to_path_buf(), "/".to_string(), st.st_ino));
    let dev = st.st_dev;
    let mut complete = true;
    while let Some((host, tree, ino)) = queue.pop_front() {
        if opts.halted() {
            complete = false;
            break;
        }
        let is_root = tree == "/";
        let flags = OFlag::O_RDONLY
            | OFlag::O_DIRECTORY
            | OFlag::O_CLOEXEC
            | if is_root {
                OFlag::empty()
            } else {
                OFlag::O_NOFOLLOW
            };
        let mut dir = match Dir::open(&host, flags, Mode::empty()) {
            Ok(d) => d,
            Err(e) if is_root => return Err(root_err(e.into())),
            Err(e) => {
                // Kept in the tree (its metadata is known), contents unknown.
                stats.error(format!("{tree}: {e}"));
                continue;
            }
        };
        match fstat(dir.as_fd()) {
            Ok(s) if s.st_dev == dev && s.st_ino == ino => {}
            _ => {
                // Replaced since its parent was read; the next scan sees the new one.
                stats.unstable.push(tree.clone());
                drop_dir(&mut fs, &tree);
                continue;
            }
        }
        let mut names: Vec<Vec<u8>> = Vec::new();
        for entry in dir.iter() {
            match entry {
                Ok(e) => {
                    let n = e.file_name().to_bytes();
                    if n != b"." && n != b".." {
                        names.push(n.to_vec());
                    }
                }
                Err(e) => {
                    stats.error(format!("{tree}: reading the directory: {e}"));
                    break;
                }
            }
        }
        names.sort_unstable();
        for raw in names {
            let Ok(name) = String::from_utf8(raw) else {
                stats.error(format!("{tree}: a name that is not UTF-8 (left out)"));
                continue;
            };
            if is_root && name == SUBD_DIR {
                continue;
            }
            let path = if is_root {
                format!("/{name}")
            } else {
                format!("{tree}/{name}")
            };
            if opts.exclusions.matches(&path) {
                continue;
            }
            // Longer than any path a poll answer may carry (the dominator refuses the whole
            // answer): left out and said, so that a deep directory someone made does not
            // take the machine out of management.
            if path.len() > paddock_subd_proto::poll_binary::MAX_PATH_BYTES {
                stats.error(format!(
                    "{}…: a path of {} bytes (left out)",
                    path.get(..64).unwrap_or(""),
                    path.len()
                ));
                continue;
            }
            let st = match fstatat(dir.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue, // removed since the directory was read
                Err(e) => {
                    stats.error(format!("{path}: {e}"));
                    continue;
                }
            };
            if st.st_dev != dev {
                continue; // a mount point: another file system
            }
            let k = kind(&st);
            if k == SFlag::S_IFSOCK {
                continue;
            }
            if k == SFlag::S_IFDIR {
                if !dirs_seen.insert(st.st_ino) {
                    stats.error(format!("{path}: a directory seen twice (left out)"));
                    continue;
                }
                let inode = Inode::Directory {
                    mode: perm(&st),
                    uid: st.st_uid,
                    gid: st.st_gid,
                };
                if let Err(e) = fs.insert(&path, inode) {
                    stats.error(format!("{path}: {e}"));
                    continue;
                }
                queue.push_back((host.join(&name), path, st.st_ino));
                continue;
            }
            if st.st_nlink > 1
                && let Some(first) = links.get(&st.st_ino)
            {
                if let Err(e) = fs.link(&path, first) {
                    stats.error(format!("{path}: {e}"));
                }
                continue;
            }
            let inode = match k {
                SFlag::S_IFREG => Inode::Regular {
                    mode: perm(&st),
                    uid: st.st_uid,
                    gid: st.st_gid,
                    mtime: mtime(&st),
                    size: size(&st),
                    object: None,
                },
                SFlag::S_IFLNK => match readlinkat(dir.as_fd(), name.as_str()) {
                    Ok(t) => match t.into_string() {
                        Ok(target) if !target.is_empty() => Inode::Symlink {
                            uid: st.st_uid,
                            gid: st.st_gid,
                            target,
                        },
                        _ => {
                            stats.error(format!("{path}: a symlink target that is not UTF-8"));
                            continue;
                        }
                    },
                    Err(Errno::ENOENT) => continue,
                    Err(e) => {
                        stats.error(format!("{path}: {e}"));
                        continue;
                    }
                },
                SFlag::S_IFCHR | SFlag::S_IFBLK | SFlag::S_IFIFO => Inode::Special {
                    special: match k {
                        SFlag::S_IFCHR => SpecialKind::Char,
                        SFlag::S_IFBLK => SpecialKind::Block,
                        _ => SpecialKind::Fifo,
                    },
                    mode: perm(&st),
                    uid: st.st_uid,
                    gid: st.st_gid,
                    mtime: mtime(&st),
                    rdev: st.st_rdev,
                },
                _ => {
                    stats.error(format!("{path}: unknown file type {:o}", st.st_mode));
                    continue;
                }
            };
            let tree_ino = match fs.insert(&path, inode) {
                Ok(i) => i,
                Err(e) => {
                    stats.error(format!("{path}: {e}"));
                    continue;
                }
            };
            if st.st_nlink > 1 {
                links.insert(st.st_ino, path.clone());
            }
            if k == SFlag::S_IFREG && st.st_size > 0 {
                jobs.push(Job {
                    tree_ino,
                    path: host.join(&name),
                    tree_path: path,
                    dev: st.st_dev,
                    ino: st.st_ino,
                });
            }
        }
        drop(dir);
        if let Some(t) = opts.throttled() {
            let u = walk_meter.take(0);
            walk_usage += u;
            stats.slept += t.pace(u, &|| opts.halted());
        }
    }

    // Hash (with one thread, on this thread: its usage is the worker's, not the walk's).
    walk_usage += walk_meter.take(0);
    let (outcomes, totals) = if complete {
        hash_all(&jobs, opts)
    } else {
        (Vec::new(), Vec::new())
    };
    walk_meter = ThreadMeter::start();
    for t in &totals {
        stats.files += t.files;
        stats.bytes += t.bytes;
        stats.vouched += t.vouched;
        stats.slept += t.slept;
        walk_usage += t.usage;
    }
    let mut dropped: HashSet<u64> = HashSet::new();
    for (job, outcome) in jobs.iter().zip(outcomes) {
        match outcome {
            Hashed::Done { object, st, .. } => {
                let size = size(&st);
                fs.inodes.insert(
                    job.tree_ino,
                    Inode::Regular {
                        mode: perm(&st),
                        uid: st.st_uid,
                        gid: st.st_gid,
                        mtime: mtime(&st),
                        size,
                        object: (size > 0).then_some(object),
                    },
                );
            }
            Hashed::Unstable => {
                stats.unstable.push(job.tree_path.clone());
                dropped.insert(job.tree_ino);
            }
            Hashed::Failed(msg) => {
                stats.error(format!("{}: {msg}", job.tree_path));
                dropped.insert(job.tree_ino);
            }
            Hashed::NotReached => {
                complete = false;
                dropped.insert(job.tree_ino);
            }
        }
    }
    if !dropped.is_empty() {
        fs.paths.retain(|_, i| !dropped.contains(i));
        fs.inodes.retain(|i, _| !dropped.contains(i));
    }

    // The object cache.
    let objects = if complete {
        list_object_cache(&root.join(OBJECTS_DIR)).unwrap_or_else(|e| {
            stats.error(format!("/{OBJECTS_DIR}: {e}"));
            BTreeSet::new()
        })
    } else {
        BTreeSet::new()
    };
    walk_usage += walk_meter.take(0);
    stats.media_bytes = walk_usage.blocks * crate::ratelimit::BLOCK_BYTES;
    stats.cpu = walk_usage.cpu;
    stats.complete = complete && !opts.halted();
    stats.elapsed = started.elapsed();
    Ok(ScanResult {
        scan: Scan { fs, objects },
        stats,
    })
}

/// Removes a directory the walk has not entered yet (so nothing is below it in the tree).
fn drop_dir(fs: &mut FileSystem, path: &str) {
    if let Some(ino) = fs.paths.remove(path) {
        fs.inodes.remove(&ino);
    }
}

fn hash_all(jobs: &[Job], opts: &ScanOptions) -> (Vec<Hashed>, Vec<WorkerTotals>) {
    let next = AtomicUsize::new(0);
    let threads = opts.threads.clamp(1, jobs.len().max(1));
    let mut per_thread: Vec<Vec<(usize, Hashed)>> = Vec::new();
    let mut totals = Vec::new();
    if threads == 1 {
        let (r, t) = worker(jobs, &next, opts);
        per_thread.push(r);
        totals.push(t);
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| s.spawn(|| worker(jobs, &next, opts)))
                .collect();
            for h in handles {
                // A panicking worker leaves its jobs "not reached": the scan is incomplete.
                if let Ok((r, t)) = h.join() {
                    per_thread.push(r);
                    totals.push(t);
                }
            }
        });
    }
    let mut out: Vec<Hashed> = (0..jobs.len()).map(|_| Hashed::NotReached).collect();
    for (i, h) in per_thread.into_iter().flatten() {
        out[i] = h;
    }
    (out, totals)
}

fn worker(
    jobs: &[Job],
    next: &AtomicUsize,
    opts: &ScanOptions,
) -> (Vec<(usize, Hashed)>, WorkerTotals) {
    let mut meter = ThreadMeter::start();
    let mut totals = WorkerTotals::default();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut out = Vec::new();
    let throttle = opts.throttled();
    let halted = || opts.halted();
    loop {
        if opts.halted() {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(job) = jobs.get(i) else { break };
        let mut on_chunk = |n: usize| {
            if let Some(t) = throttle {
                let u = meter.take(n as u64);
                totals.usage += u;
                totals.slept += t.pace(u, &halted);
            }
            !opts.halted()
        };
        let h = hash_job(job, &mut buf, &mut on_chunk, opts.vouched);
        match &h {
            Hashed::Done { vouched: true, .. } => totals.vouched += 1,
            Hashed::Done { st, .. } => {
                totals.files += 1;
                totals.bytes += size(st);
            }
            _ => {}
        }
        if matches!(h, Hashed::NotReached) {
            break;
        }
        out.push((i, h));
    }
    totals.usage += meter.take(0);
    (out, totals)
}

/// Opens a file for reading without following a final symlink, blocking on a fifo or
/// touching its atime (where allowed).
pub(crate) fn open_for_hashing(path: &Path) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    match nix::fcntl::open(path, flags | OFlag::O_NOATIME, Mode::empty()) {
        Err(Errno::EPERM) => nix::fcntl::open(path, flags, Mode::empty()),
        r => r,
    }
}

fn hash_job(
    job: &Job,
    buf: &mut [u8],
    on_chunk: &mut dyn FnMut(usize) -> bool,
    vouched: Option<&Vouched>,
) -> Hashed {
    let fd = match open_for_hashing(&job.path) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO) => return Hashed::Unstable,
        Err(e) => return Hashed::Failed(e.to_string()),
    };
    let pre = match fstat(fd.as_fd()) {
        Ok(s) => s,
        Err(e) => return Hashed::Failed(e.to_string()),
    };
    if kind(&pre) != SFlag::S_IFREG || pre.st_dev != job.dev || pre.st_ino != job.ino {
        return Hashed::Unstable; // replaced since the walk
    }
    if let Some(object) = vouched.and_then(|v| v.take(Key::of_stat(&pre), Instant::now())) {
        return Hashed::Done {
            object,
            st: pre,
            vouched: true,
        };
    }
    let _ = posix_fadvise(fd.as_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    let mut file = File::from(fd);
    let expected = size(&pre);
    let (object, read) = match hash_reader(&mut file, buf, expected, on_chunk) {
        Ok(Some(r)) => r,
        Ok(None) => return Hashed::NotReached,
        Err(e) => return Hashed::Failed(e.to_string()),
    };
    let post = match fstat(file.as_fd()) {
        Ok(s) => s,
        Err(e) => return Hashed::Failed(e.to_string()),
    };
    let same = |a: &FileStat, b: &FileStat| {
        (
            a.st_size,
            a.st_mtime,
            a.st_mtime_nsec,
            a.st_ctime,
            a.st_ctime_nsec,
        ) == (
            b.st_size,
            b.st_mtime,
            b.st_mtime_nsec,
            b.st_ctime,
            b.st_ctime_nsec,
        )
    };
    if read != expected || !same(&pre, &post) {
        return Hashed::Unstable;
    }
    Hashed::Done {
        object,
        st: pre,
        vouched: false,
    }
}

/// Hashes a reader to its end, in `buf`-sized reads. Stops reading once more than `limit`
/// bytes came (a growing file: the count returned is then over the limit). `on_chunk` is
/// told each read's size and returns false to abandon (→ `Ok(None)`).
pub fn hash_reader(
    r: &mut impl Read,
    buf: &mut [u8],
    limit: u64,
    on_chunk: &mut dyn FnMut(usize) -> bool,
) -> io::Result<Option<(ObjectId, u64)>> {
    let mut h = ObjectHasher::new();
    let mut total = 0u64;
    loop {
        let n = match r.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        total += n as u64;
        if !on_chunk(n) {
            return Ok(None);
        }
        if total > limit {
            break;
        }
    }
    Ok(Some((h.finish(), total)))
}

/// The objects in a cache directory (`xx/yy/<124 hex>`; other names, including the
/// temporary `…~`, are ignored). A missing directory is an empty cache.
pub fn list_object_cache(dir: &Path) -> io::Result<BTreeSet<ObjectId>> {
    let mut out = BTreeSet::new();
    let top = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for a in top {
        let a = a?;
        if a.file_name().len() != 2 || !a.file_type()?.is_dir() {
            continue;
        }
        for b in std::fs::read_dir(a.path())? {
            let b = b?;
            if b.file_name().len() != 2 || !b.file_type()?.is_dir() {
                continue;
            }
            for c in std::fs::read_dir(b.path())? {
                let c = c?;
                if !c.file_type()?.is_file() {
                    continue;
                }
                let rel = format!(
                    "{}/{}/{}",
                    a.file_name().to_string_lossy(),
                    b.file_name().to_string_lossy(),
                    c.file_name().to_string_lossy()
                );
                if let Some(id) = ObjectId::from_path(&rel) {
                    out.insert(id);
                }
            }
        }
    }
    Ok(out)
}

pub(crate) fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

fn perm(st: &FileStat) -> u32 {
    st.st_mode & 0o7777
}

pub(crate) fn size(st: &FileStat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

fn mtime(st: &FileStat) -> Mtime {
    Mtime {
        sec: st.st_mtime,
        nsec: u32::try_from(st.st_mtime_nsec).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn job_for(path: &Path) -> Job {
        let m = std::fs::symlink_metadata(path).unwrap();
        Job {
            tree_ino: 2,
            path: path.to_path_buf(),
            tree_path: "/f".into(),
            dev: m.dev(),
            ino: m.ino(),
        }
    }

    #[test]
    fn a_file_growing_while_hashed_is_unstable() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, vec![7u8; 3 * READ_CHUNK]).unwrap();
        let job = job_for(&p);
        let mut buf = vec![0u8; READ_CHUNK];
        assert!(matches!(
            hash_job(&job, &mut buf, &mut |_| true, None),
            Hashed::Done { object, .. } if object == ObjectId::of(&vec![7u8; 3 * READ_CHUNK])
        ));
        let mut appended = false;
        let mut grow = |_| {
            if !appended {
                let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
                f.write_all(b"more").unwrap();
                appended = true;
            }
            true
        };
        assert!(matches!(
            hash_job(&job, &mut buf, &mut grow, None),
            Hashed::Unstable
        ));
        // Abandoned mid-file: not reached (the scan is incomplete).
        assert!(matches!(
            hash_job(&job, &mut buf, &mut |_| false, None),
            Hashed::NotReached
        ));
    }

    #[test]
    fn a_file_replaced_since_the_walk_is_unstable() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, b"old").unwrap();
        let job = job_for(&p);
        std::fs::write(t.path().join("g"), b"new").unwrap();
        std::fs::rename(t.path().join("g"), &p).unwrap();
        let mut buf = vec![0u8; 16];
        assert!(matches!(
            hash_job(&job, &mut buf, &mut |_| true, None),
            Hashed::Unstable
        ));
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(
            hash_job(&job, &mut buf, &mut |_| true, None),
            Hashed::Unstable
        ));
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        assert!(matches!(
            hash_job(&job, &mut buf, &mut |_| true, None),
            Hashed::Unstable
        ));
    }
}
