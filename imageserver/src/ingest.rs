//! Tar ingest: a tarball (plain, gzip or zstd, detected by magic) streamed into a tree and
//! the object store. Nothing is unpacked: a member's path only ever becomes a key in the
//! tree, its bytes only ever an object named by their hash, so no archive can write outside
//! the object store.
//!
//! Refused, with the member's path in the error: absolute paths, `..`, NUL, non-UTF-8
//! names, hard links to paths not earlier in the archive, relative symlinks that climb
//! above the root, GNU sparse members, extension headers over 1 MiB (a "giant header" would
//! otherwise be read into memory), a PAX size that disagrees with the header, a path that
//! appears twice (other than a directory), truncated archives. Devices and fifos are kept as
//! metadata. `/.subd` and paths the image's filter matches are dropped.
//!
//! GNU long names (`L`, `K`) and PAX records (`x`: path, linkpath, size, uid, gid, mtime)
//! are handled here, on raw entries, so that their size is bounded before anything is read.

use std::io::{self, BufRead, BufReader, Read};

use paddock_image::tree::{self, TreeError, normalize};
use paddock_image::{FileSystem, Filter, Inode, Mtime, ObjectId, SpecialKind};
use serde::{Deserialize, Serialize};

use crate::objects::{ObjectError, ObjectStore};

/// Extension headers (long names, PAX records) larger than this are refused.
pub const MAX_EXTENSION: u64 = 1 << 20;
/// Members up to this size are hashed in memory; larger ones stream through a temporary file.
const IN_MEMORY: u64 = 64 << 20;
/// Bytes of members read but not yet hashed and stored, at most (one member larger than this
/// still goes alone): without it the reader, faster than the hashing, queued 64 members of
/// up to 64 MiB each (a small archive of zeros decompresses that fast), some 4 GiB.
const QUEUED_BYTES: u64 = 256 << 20;

/// The bytes queued for the workers, and a wait for room.
#[derive(Default)]
struct Queued {
    bytes: std::sync::Mutex<u64>,
    room: std::sync::Condvar,
    /// Takers waiting for room (for the tests to see a wait without a clock).
    waiting: std::sync::atomic::AtomicUsize,
}

/// Gives `.1` bytes back to the queue when dropped.
struct Giving<'a>(&'a Queued, u64);

impl Drop for Giving<'_> {
    fn drop(&mut self) {
        self.0.give(self.1);
    }
}

impl Queued {
    /// Waits until `n` more bytes fit under [`QUEUED_BYTES`] (or nothing is queued), then
    /// counts them.
    fn take(&self, n: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        while *b > 0 && b.saturating_add(n) > QUEUED_BYTES {
            self.waiting.fetch_add(1, SeqCst);
            b = self.room.wait(b).unwrap_or_else(|p| p.into_inner());
            self.waiting.fetch_sub(1, SeqCst);
        }
        *b += n;
    }

    /// `n` bytes were hashed and stored (or dropped).
    fn give(&self, n: u64) {
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        *b = b.saturating_sub(n);
        self.room.notify_all();
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestStats {
    /// Tar members read (including filtered ones).
    pub members: u64,
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub specials: u64,
    pub hardlinks: u64,
    pub filtered: u64,
    /// Bytes of regular-file content (each member that carries data).
    pub bytes: u64,
    /// Distinct objects the image refers to.
    pub objects: u64,
    /// Objects this ingest stored for the first time, and their bytes.
    pub new_objects: u64,
    pub new_bytes: u64,
    /// Bytes not stored because an identical object was already there.
    pub dedup_bytes: u64,
    /// Bytes of the (possibly compressed) input consumed so far.
    pub input_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("reading the archive: {0}")]
    Io(#[from] io::Error),
    #[error("tar member {index} ({path}): {why}")]
    Member {
        index: u64,
        path: String,
        why: String,
    },
    #[error(transparent)]
    Object(#[from] ObjectError),
}

/// Counts bytes consumed from the input (for progress).
struct Counting<R> {
    inner: R,
    n: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n
            .fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(k)
    }
}

/// Reads the archive into a tree, storing every regular file's content once.
pub fn ingest(
    input: impl Read,
    store: &ObjectStore,
    filter: Option<&Filter>,
    progress: &mut dyn FnMut(&IngestStats),
) -> Result<(FileSystem, IngestStats), IngestError> {
    let consumed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut buffered = BufReader::with_capacity(
        1 << 20,
        Counting {
            inner: input,
            n: consumed.clone(),
        },
    );
    let head = buffered.fill_buf()?;
    let decoded: Box<dyn Read + '_> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(buffered))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(buffered)?)
    } else {
        Box::new(buffered)
    };
    let (job_tx, job_rx) = std::sync::mpsc::sync_channel::<Job>(64);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Done>();
    let job_rx = std::sync::Mutex::new(job_rx);
    let queued = Queued::default();
    let mut ing = Ingest {
        fs: FileSystem::with_root(0o755, 0, 0),
        stats: IngestStats::default(),
        seen: std::collections::BTreeSet::new(),
        store,
        filter,
        jobs: Some(job_tx),
        queued: &queued,
    };
    let res = std::thread::scope(|sc| {
        for _ in 0..2 {
            let (job_rx, done_tx, queued) = (&job_rx, done_tx.clone(), &queued);
            sc.spawn(move || worker(store, job_rx, done_tx, queued));
        }
        drop(done_tx);
        let res = read_members(decoded, &mut ing, &consumed, progress);
        ing.jobs = None; // the workers finish what is queued, then stop
        res
    });
    let mut first_error = res.err();
    for d in done_rx {
        match d {
            Ok((ino, id, new, size)) => {
                if let Some(Inode::Regular { object, .. }) = ing.fs.inodes.get_mut(&ino) {
                    *object = Some(id);
                }
                if new {
                    ing.stats.new_objects += 1;
                    ing.stats.new_bytes += size;
                } else {
                    ing.stats.dedup_bytes += size;
                }
            }
            Err(e) => {
                if first_error.is_none() {
                    first_error = Some(IngestError::Object(e));
                }
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    ing.fs.validate().map_err(|e| IngestError::Member {
        index: ing.stats.members,
        path: String::new(),
        why: format!("the tree is inconsistent: {e}"),
    })?;
    ing.stats.objects = ing.fs.objects().len() as u64;
    ing.stats.input_bytes = consumed.load(std::sync::atomic::Ordering::Relaxed);
    progress(&ing.stats);
    Ok((ing.fs, ing.stats))
}

fn read_members(
    decoded: Box<dyn Read + '_>,
    ing: &mut Ingest,
    consumed: &std::sync::atomic::AtomicU64,
    progress: &mut dyn FnMut(&IngestStats),
) -> Result<(), IngestError> {
    let mut archive = tar::Archive::new(decoded);
    let mut pending = Extensions::default();
    let mut index = 0u64;
    let mut saw_member = false;
    // Raw entries: long names and PAX records come to us, bounded, instead of being read
    // whole by the tar crate.
    for entry in archive.entries()?.raw(true) {
        let mut entry = entry.map_err(|e| IngestError::Member {
            index,
            path: pending.path_hint(),
            why: format!("unreadable header or data: {e}"),
        })?;
        let kind = entry.header().entry_type();
        let size = entry.header().entry_size().unwrap_or(u64::MAX);
        let at = index + 1;
        let member = move |why: String, path: &str| IngestError::Member {
            index: at,
            path: path.to_string(),
            why,
        };
        if kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions()
        {
            if size > MAX_EXTENSION {
                return Err(member(
                    format!("extension header of {size} bytes (at most {MAX_EXTENSION})"),
                    "(extension header)",
                ));
            }
            let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            entry
                .read_to_end(&mut data)
                .map_err(|e| member(format!("truncated extension header: {e}"), "?"))?;
            if kind.is_gnu_longname() {
                pending.path = Some(trim_nul(data));
            } else if kind.is_gnu_longlink() {
                pending.link = Some(trim_nul(data));
            } else if kind.is_pax_local_extensions() {
                pending
                    .pax(&data)
                    .map_err(|why| member(why.to_string(), "(PAX header)"))?;
            }
            continue;
        }
        index = at;
        saw_member = true;
        let ext = std::mem::take(&mut pending);
        let path_bytes = ext
            .path
            .clone()
            .unwrap_or_else(|| entry.path_bytes().into_owned());
        let shown = String::from_utf8_lossy(&path_bytes).into_owned();
        let path = String::from_utf8(path_bytes)
            .map_err(|_| member("the name is not UTF-8".into(), &shown))?;
        if let Some(pax_size) = ext.size
            && pax_size != size
        {
            return Err(member(
                format!("PAX size {pax_size} disagrees with the header's {size}"),
                &path,
            ));
        }
        let link = match ext.link.clone() {
            Some(l) => Some(l),
            None => entry.link_name_bytes().map(|c| c.into_owned()),
        };
        let link = link
            .map(|l| {
                String::from_utf8(l).map_err(|_| member("link target is not UTF-8".into(), &path))
            })
            .transpose()?;
        let h = entry.header().clone();
        let uid = ext
            .uid
            .or_else(|| h.uid().ok())
            .ok_or_else(|| member("bad uid".into(), &path))?;
        let gid = ext
            .gid
            .or_else(|| h.gid().ok())
            .ok_or_else(|| member("bad gid".into(), &path))?;
        let (uid, gid) = (
            u32::try_from(uid).map_err(|_| member(format!("uid {uid} too large"), &path))?,
            u32::try_from(gid).map_err(|_| member(format!("gid {gid} too large"), &path))?,
        );
        let mode = h
            .mode()
            .map_err(|e| member(format!("bad mode: {e}"), &path))?
            & 0o7777;
        let mtime = match ext.mtime {
            Some(m) => m,
            None => Mtime {
                // GNU tar writes a time before 1970 in base-256 as two's complement, which
                // the header reads back as the same 64 bits unsigned: reinterpreting them
                // gives that time, and every other value is a time after 1970.
                sec: h
                    .mtime()
                    .map_err(|e| member(format!("bad mtime: {e}"), &path))?
                    .cast_signed(),
                nsec: 0,
            },
        };
        let meta = Meta {
            uid,
            gid,
            mode,
            mtime,
        };
        ing.member(&mut entry, kind, size, &path, link.as_deref(), meta, &h)
            .map_err(|e| match e {
                MemberError::Why(why) => member(why, &path),
                MemberError::Tree(t) => member(t.to_string(), &path),
                MemberError::Object(o) => IngestError::Object(o),
                MemberError::Io(e) => member(format!("truncated or unreadable data: {e}"), &path),
            })?;
        ing.stats.members = index;
        ing.stats.input_bytes = consumed.load(std::sync::atomic::Ordering::Relaxed);
        if index.is_multiple_of(256) {
            progress(&ing.stats);
        }
    }
    if pending.path.is_some() || pending.link.is_some() || pending.any_pax {
        return Err(IngestError::Member {
            index,
            path: pending.path_hint(),
            why: "the archive ends after an extension header, before its member".into(),
        });
    }
    if !saw_member {
        return Err(IngestError::Member {
            index: 0,
            path: String::new(),
            why: "the archive has no members (empty, or not a tar archive)".into(),
        });
    }
    Ok(())
}

#[derive(Default)]
struct Extensions {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<Mtime>,
    any_pax: bool,
}

impl Extensions {
    fn path_hint(&self) -> String {
        self.path
            .as_ref()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default()
    }

    /// PAX records: `"<len> <key>=<value>\n"`.
    fn pax(&mut self, mut data: &[u8]) -> Result<(), PaxError> {
        self.any_pax = true;
        while !data.is_empty() {
            let sp = data
                .iter()
                .position(|b| *b == b' ')
                .ok_or(PaxError::NoLength)?;
            let len: usize = std::str::from_utf8(&data[..sp])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(PaxError::BadLength)?;
            if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
                return Err(PaxError::LengthMismatch);
            }
            let rec = &data[sp + 1..len - 1];
            let eq = rec
                .iter()
                .position(|b| *b == b'=')
                .ok_or(PaxError::NoEquals)?;
            let (key, value) = (&rec[..eq], &rec[eq + 1..]);
            let num = || -> Result<u64, PaxError> {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| PaxError::NotANumber(String::from_utf8_lossy(key).into_owned()))
            };
            match key {
                b"path" => self.path = Some(value.to_vec()),
                b"linkpath" => self.link = Some(value.to_vec()),
                b"size" => self.size = Some(num()?),
                b"uid" => self.uid = Some(num()?),
                b"gid" => self.gid = Some(num()?),
                b"mtime" => self.mtime = Some(pax_mtime(value)?),
                _ => {} // atime, ctime, uname, gname, xattrs: not part of an image
            }
            data = &data[len..];
        }
        Ok(())
    }
}

/// A PAX `mtime`: seconds, optionally a fraction (nanoseconds at most).
fn pax_mtime(value: &[u8]) -> Result<Mtime, PaxError> {
    let s = std::str::from_utf8(value).map_err(|_| PaxError::MtimeNotText)?;
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().map_err(|_| PaxError::MtimeNotANumber)?;
    let digits: String = frac.chars().take(9).collect();
    let nsec = if digits.is_empty() {
        0
    } else {
        format!("{digits:0<9}")
            .parse()
            .map_err(|_| PaxError::MtimeNotANumber)?
    };
    Ok(Mtime { sec, nsec })
}

/// Why a PAX extension header is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum PaxError {
    #[error("PAX record without a length")]
    NoLength,
    #[error("PAX record with a bad length")]
    BadLength,
    #[error("PAX record length does not match its text")]
    LengthMismatch,
    #[error("PAX record without `=`")]
    NoEquals,
    #[error("PAX {0} is not a number")]
    NotANumber(String),
    #[error("PAX mtime is not text")]
    MtimeNotText,
    #[error("PAX mtime is not a number")]
    MtimeNotANumber,
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

#[derive(Clone, Copy)]
struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: Mtime,
}

enum MemberError {
    Why(String),
    Tree(TreeError),
    Object(ObjectError),
    Io(io::Error),
}

impl From<TreeError> for MemberError {
    fn from(e: TreeError) -> Self {
        MemberError::Tree(e)
    }
}

struct Ingest<'s> {
    fs: FileSystem,
    stats: IngestStats,
    seen: std::collections::BTreeSet<ObjectId>,
    store: &'s ObjectStore,
    filter: Option<&'s Filter>,
    /// Regular files' bytes go to the hashing workers; their ids are filled in at the end.
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    /// What the workers have yet to hash, bounded.
    queued: &'s Queued,
}

/// One regular file's bytes, for the inode `ino` of the tree being built.
struct Job {
    ino: u64,
    buf: Vec<u8>,
}

/// What a worker did with a job: `(ino, object, created, size)`.
type Done = Result<(u64, ObjectId, bool, u64), ObjectError>;

/// Hashes and stores jobs until the channel closes (two of these run while the archive is
/// read: SHA-512 is the bulk of the work, and a machine has more than one core).
fn worker(
    store: &ObjectStore,
    jobs: &std::sync::Mutex<std::sync::mpsc::Receiver<Job>>,
    done: std::sync::mpsc::Sender<Done>,
    queued: &Queued,
) {
    loop {
        let job = match jobs.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        let len = job.buf.len() as u64;
        // Given back however the job ends, a panic included: the reader may be waiting.
        let room = Giving(queued, len);
        let id = ObjectId::of(&job.buf);
        let res = store.put(id, &job.buf).map(|new| (job.ino, id, new, len));
        drop(job);
        drop(room);
        if done.send(res).is_err() {
            return;
        }
    }
}

impl Ingest<'_> {
    #[allow(clippy::too_many_arguments)]
    fn member(
        &mut self,
        entry: &mut impl Read,
        kind: tar::EntryType,
        size: u64,
        raw_path: &str,
        link: Option<&str>,
        m: Meta,
        h: &tar::Header,
    ) -> Result<(), MemberError> {
        if raw_path.starts_with('/') {
            return Err(MemberError::Why("absolute path".into()));
        }
        let path = normalize(raw_path)?;
        let filtered = path == "/.subd"
            || path.starts_with("/.subd/")
            || self.filter.is_some_and(|f| path != "/" && f.matches(&path));
        if filtered {
            self.stats.filtered += 1;
            // Still consume the data so the stream stays in step (the tar crate skips it).
            return Ok(());
        }
        if path != "/" {
            self.parents(&path)?;
        }
        use tar::EntryType as T;
        match kind {
            T::Directory => {
                if path != "/"
                    && self.fs.paths.contains_key(&path)
                    && !self.fs.get(&path).is_some_and(Inode::is_dir)
                {
                    return Err(MemberError::Why("named twice".into()));
                }
                self.fs.insert(
                    &path,
                    Inode::Directory {
                        mode: m.mode,
                        uid: m.uid,
                        gid: m.gid,
                    },
                )?;
                self.stats.directories += 1;
            }
            T::Regular | T::Continuous => {
                let (object, pending) = if size == 0 {
                    (None, None)
                } else if size <= IN_MEMORY && self.jobs.is_some() {
                    // Room is made before the bytes are read, so that at most QUEUED_BYTES
                    // wait in memory for the workers.
                    self.queued.take(size);
                    match read_member(entry, size) {
                        Ok(buf) => (None, Some(buf)),
                        Err(e) => {
                            self.queued.give(size);
                            return Err(e);
                        }
                    }
                } else {
                    (Some(self.store_content(entry, size)?), None)
                };
                let ino = self.fs.insert(
                    &path,
                    Inode::Regular {
                        mode: m.mode,
                        uid: m.uid,
                        gid: m.gid,
                        mtime: m.mtime,
                        size,
                        object,
                    },
                )?;
                if let (Some(buf), Some(jobs)) = (pending, &self.jobs) {
                    jobs.send(Job { ino, buf })
                        .map_err(|_| MemberError::Why("the hashing workers stopped".into()))?;
                }
                self.stats.files += 1;
                self.stats.bytes += size;
            }
            T::Link => {
                let target =
                    link.ok_or_else(|| MemberError::Why("hard link without a target".into()))?;
                if target.starts_with('/') {
                    return Err(MemberError::Why(format!(
                        "hard link to an absolute path {target:?}"
                    )));
                }
                let target = normalize(target).map_err(|_| {
                    MemberError::Why(format!("hard link target {target:?} escapes the archive"))
                })?;
                if !self.fs.paths.contains_key(&target) {
                    return Err(MemberError::Why(format!(
                        "hard link to {target:?}, which is not earlier in the archive (or was filtered out)"
                    )));
                }
                self.fs.link(&path, &target)?;
                self.stats.hardlinks += 1;
            }
            T::Symlink => {
                let target = link
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| MemberError::Why("symlink without a target".into()))?;
                if !target.starts_with('/') && climbs_above_root(&path, target) {
                    return Err(MemberError::Why(format!(
                        "symlink target {target:?} climbs above the image's root"
                    )));
                }
                if target.contains('\0') {
                    return Err(MemberError::Why("symlink target has a NUL byte".into()));
                }
                self.fs.insert(
                    &path,
                    Inode::Symlink {
                        uid: m.uid,
                        gid: m.gid,
                        target: target.to_string(),
                    },
                )?;
                self.stats.symlinks += 1;
            }
            T::Char | T::Block | T::Fifo => {
                let special = match kind {
                    T::Char => SpecialKind::Char,
                    T::Block => SpecialKind::Block,
                    _ => SpecialKind::Fifo,
                };
                let rdev = if special == SpecialKind::Fifo {
                    0
                } else {
                    let number = |n: std::io::Result<Option<u32>>, what: &str| match n {
                        Ok(Some(n)) => Ok(u64::from(n)),
                        Ok(None) => Err(MemberError::Why(format!("no device {what} number"))),
                        Err(e) => Err(MemberError::Why(format!("bad device {what} number: {e}"))),
                    };
                    nix::sys::stat::makedev(
                        number(h.device_major(), "major")?,
                        number(h.device_minor(), "minor")?,
                    )
                };
                self.fs.insert(
                    &path,
                    Inode::Special {
                        special,
                        mode: m.mode,
                        uid: m.uid,
                        gid: m.gid,
                        mtime: m.mtime,
                        rdev,
                    },
                )?;
                self.stats.specials += 1;
            }
            T::GNUSparse => {
                return Err(MemberError::Why(
                    "GNU sparse member: create the tarball without --sparse".into(),
                ));
            }
            other => {
                return Err(MemberError::Why(format!(
                    "unsupported member type {:?}",
                    other.as_byte() as char
                )));
            }
        }
        Ok(())
    }

    /// Creates missing parent directories (as `tar -x` would), 0755 root-owned.
    fn parents(&mut self, path: &str) -> Result<(), MemberError> {
        let mut missing = Vec::new();
        let mut p = tree::parent(path);
        while let Some(d) = p {
            match self.fs.get(d) {
                Some(i) if i.is_dir() => break,
                Some(_) => {
                    return Err(MemberError::Why(format!("{d:?} is not a directory")));
                }
                None => missing.push(d.to_string()),
            }
            p = tree::parent(d);
        }
        for d in missing.into_iter().rev() {
            self.fs.insert(
                &d,
                Inode::Directory {
                    mode: 0o755,
                    uid: 0,
                    gid: 0,
                },
            )?;
        }
        Ok(())
    }

    fn store_content(&mut self, entry: &mut impl Read, size: u64) -> Result<ObjectId, MemberError> {
        let (id, new) = if size <= IN_MEMORY {
            let buf = read_member(entry, size)?;
            let id = ObjectId::of(&buf);
            // An object this ingest already stored is not compared again.
            let new = if self.seen.contains(&id) {
                false
            } else {
                self.store.put(id, &buf).map_err(MemberError::Object)?
            };
            (id, new)
        } else {
            let (id, n, new) = self
                .store
                .put_reader(entry.take(size), None)
                .map_err(MemberError::Object)?;
            if n != size {
                return Err(MemberError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            (id, new)
        };
        if new {
            self.stats.new_objects += 1;
            self.stats.new_bytes += size;
        } else {
            self.stats.dedup_bytes += size;
        }
        self.seen.insert(id);
        Ok(id)
    }
}

/// A member's `size` bytes (at most [`IN_MEMORY`]), all of them: fewer is a truncated
/// archive.
fn read_member(entry: &mut impl Read, size: u64) -> Result<Vec<u8>, MemberError> {
    let capacity =
        usize::try_from(size).map_err(|_| MemberError::Why(format!("a member of {size} bytes")))?;
    let mut buf = Vec::with_capacity(capacity);
    entry
        .take(size)
        .read_to_end(&mut buf)
        .map_err(MemberError::Io)?;
    if buf.len() != capacity {
        return Err(MemberError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(buf)
}

/// Whether a relative symlink at `path` pointing to `target` leaves the root when resolved
/// lexically from the link's directory.
fn climbs_above_root(path: &str, target: &str) -> bool {
    let mut depth = path.matches('/').count() as i64 - 1; // components of the parent
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member that would take the queue past its budget waits until the workers have
    /// taken enough out; one larger than the budget still goes when nothing else is queued.
    #[test]
    fn the_queue_for_the_workers_is_bounded_in_bytes() {
        use std::sync::atomic::Ordering::SeqCst;
        let q = Queued::default();
        q.take(200 << 20);
        std::thread::scope(|sc| {
            let waiter = sc.spawn(|| q.take(100 << 20));
            while q.waiting.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            assert_eq!(*q.bytes.lock().unwrap(), 200 << 20, "the second waits");
            q.give(200 << 20);
            waiter.join().unwrap();
        });
        assert_eq!(*q.bytes.lock().unwrap(), 100 << 20);
        q.give(100 << 20);
        q.take(QUEUED_BYTES + 1);
        assert_eq!(*q.bytes.lock().unwrap(), QUEUED_BYTES + 1, "alone, it goes");
    }

    #[test]
    fn symlink_escape() {
        assert!(!climbs_above_root("/lib", "usr/lib"));
        assert!(!climbs_above_root("/usr/bin/x", "../lib/y"));
        assert!(!climbs_above_root("/usr/bin/x", "../../etc"));
        assert!(climbs_above_root("/usr/bin/x", "../../../etc"));
        assert!(climbs_above_root("/x", "../etc"));
        assert!(!climbs_above_root("/a/b", "c/../../d"));
        assert!(climbs_above_root("/a/b", "../../d"));
    }

    #[test]
    fn pax_records() {
        let mut e = Extensions::default();
        e.pax(b"19 path=/a/long/nm\n11 size=42\n28 mtime=1700000000.5000000\n")
            .unwrap();
        assert_eq!(e.path.as_deref(), Some(&b"/a/long/nm"[..]));
        assert_eq!(e.size, Some(42));
        assert_eq!(
            e.mtime,
            Some(Mtime {
                sec: 1_700_000_000,
                nsec: 500_000_000
            })
        );
        let refused = |data: &[u8]| Extensions::default().pax(data).unwrap_err().to_string();
        assert_eq!(
            refused(b"99 path=x\n"),
            "PAX record length does not match its text"
        );
        assert_eq!(refused(b"x path=x\n"), "PAX record with a bad length");
        assert_eq!(
            refused(b"9 pathx\n"),
            "PAX record length does not match its text"
        );
        assert_eq!(refused(b"8 pathx\n"), "PAX record without `=`");
        assert_eq!(refused(b"10 uid=ab\n"), "PAX uid is not a number");
        assert_eq!(refused(b"13 mtime=1.x\n"), "PAX mtime is not a number");
    }
}
