//! Paddock's TFTP server: read requests with blksize, tsize, timeout and windowsize; names
//! resolved safely under the configured roots; generated files served from memory; writes
//! refused; concurrent transfers bounded.
//!
//! The protocol engine is ours ([`engine`]): it began on async-tftp, whose per-block cost
//! (a timer and a reactor round trip for every ACK) made lock-step transfers several times
//! slower than tftp-hpa. It then ran a blocking thread per transfer, which lost to tftp-hpa
//! and dnsmasq in a boot storm (1.6–2.4× slower with 500–1,000 clients on two cores); now
//! a few event loops ([`pool`], one per core) each drive many transfers, polling briefly
//! only when they have one or two, and small files are read once and served from memory.

pub mod engine;
pub mod pool;

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use engine::{
    ErrorCode, Limits, Request, Source, Transfer, error_packet, negotiate, parse_request,
    transfer_socket,
};
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, readlinkat};
use nix::sys::stat::Mode;

/// Why a requested name was refused before touching the file system.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("empty file name")]
    Empty,
    #[error("backslashes are not allowed in file names")]
    Backslash,
    #[error("'..' is not allowed in file names")]
    Parent,
    #[error("control characters are not allowed in file names")]
    Control,
    #[error("the file leads out of the TFTP root (symlink)")]
    Escapes,
}

/// Normalises a requested name into a relative path with no `.`, `..` or empty components.
pub fn clean_request(name: &str) -> Result<PathBuf, PathError> {
    if name.is_empty() {
        return Err(PathError::Empty);
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(PathError::Control);
    }
    if name.contains('\\') {
        return Err(PathError::Backslash);
    }
    // A leading `/` names the root, as tftpd-hpa's `--secure` and dnsmasq have it: GRUB
    // asks for `/grub/grub.cfg`. Nothing outside the roots is reachable either way.
    let mut out = PathBuf::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(PathError::Parent),
            p => out.push(p),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(PathError::Empty);
    }
    Ok(out)
}

/// Symbolic links followed while opening one name (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// How often an open is retried when the kernel reports that a rename raced with it (EAGAIN).
const MAX_RACE_RETRIES: usize = 64;

/// Why a TFTP root cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("TFTP root {}: {source}", path.display())]
    Unusable { path: PathBuf, source: io::Error },
    #[error(
        "TFTP root {}: this kernel has no openat2(2) (Linux 5.6 or later is needed); files are \
         only opened beneath their root with it, never by a racy check-then-open of a path",
        path.display()
    )]
    NoOpenat2 { path: PathBuf },
}

/// Why a file under the roots was not opened.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Refused(#[from] PathError),
    #[error(
        "openat2(2) is not available on this kernel (Linux 5.6 or later is needed); \
         files are not opened by a racy check-then-open of a path instead"
    )]
    NoOpenat2,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A TFTP root: a directory descriptor opened once, beneath which every file is opened in
/// one step (`openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`), so no symlink
/// swapped in between a check and an open can lead outside it.
#[derive(Debug)]
pub struct Root {
    /// The canonical path.
    path: PathBuf,
    /// The path as configured, when absolute: absolute symlinks may name the root either way.
    given: Option<PathBuf>,
    dir: OwnedFd,
}

fn resolve_beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// `openat2` beneath `dir`, retried while the kernel reports a concurrent rename (EAGAIN).
fn open_beneath(dir: &OwnedFd, path: &Path, flags: OFlag) -> Result<OwnedFd, Errno> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let how = OpenHow::new().flags(flags).resolve(resolve_beneath());
    let mut tries = 0;
    loop {
        match openat2(dir, path, how) {
            Err(Errno::EAGAIN) if tries < MAX_RACE_RETRIES => tries += 1,
            other => return other,
        }
    }
}

/// The parts of a relative path as names, `..` kept and `.` dropped.
fn parts(path: &Path) -> impl DoubleEndedIterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some(OsString::from("..")),
        Component::CurDir | Component::RootDir | Component::Prefix(_) => None,
    })
}

impl Root {
    /// Opens the directory `path` once and checks that the kernel can open beneath it.
    pub fn open(path: &Path) -> Result<Root, RootError> {
        let unusable = |source: io::Error| RootError::Unusable {
            path: path.to_path_buf(),
            source,
        };
        let canonical = std::fs::canonicalize(path).map_err(unusable)?;
        let dir = nix::fcntl::open(
            &canonical,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| unusable(e.into()))?;
        match open_beneath(&dir, Path::new("."), OFlag::O_PATH | OFlag::O_CLOEXEC) {
            Ok(_) => {}
            Err(Errno::ENOSYS) => {
                return Err(RootError::NoOpenat2 {
                    path: path.to_path_buf(),
                });
            }
            Err(e) => return Err(unusable(e.into())),
        }
        Ok(Root {
            given: (path.is_absolute() && path != canonical).then(|| path.to_path_buf()),
            path: canonical,
            dir,
        })
    }

    /// The canonical path of the root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the regular file `rel` beneath this root; `None` when there is none.
    fn open_file(&self, rel: &Path) -> Result<Option<File>, ResolveError> {
        let mut path = rel.to_path_buf();
        for _ in 0..=MAX_LINKS {
            let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
            match open_beneath(&self.dir, &path, flags) {
                Ok(fd) => {
                    let file = File::from(fd);
                    return Ok(file.metadata()?.is_file().then_some(file));
                }
                // ELOOP: a symlink loop, or a magic link (procfs), which is never followed.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
                Err(Errno::EXDEV) => match self.absolute_link_inside(&path) {
                    Some(inside) => path = inside,
                    None => return Err(PathError::Escapes.into()),
                },
                Err(Errno::ENOSYS) => return Err(ResolveError::NoOpenat2),
                Err(e) => return Err(ResolveError::Io(e.into())),
            }
        }
        Ok(None) // a loop of absolute links, as the kernel's ELOOP
    }

    /// `path` left the root while being opened beneath it (EXDEV). That is also what an
    /// absolute symlink does, even one naming a place inside the root (`RESOLVE_BENEATH`
    /// refuses every absolute link): finds the first absolute link met while resolving
    /// `path` and, if its target is inside the root, returns `path` rewritten to go there
    /// relative to the root. The caller opens the result beneath the root again, so what is
    /// read here only chooses a name; it never decides whether a file may be served.
    fn absolute_link_inside(&self, path: &Path) -> Option<PathBuf> {
        let mut todo: VecDeque<OsString> = parts(path).collect();
        let mut done = PathBuf::new();
        let mut links = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                done.push(part);
                continue;
            }
            let parent = open_beneath(
                &self.dir,
                &done,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            )
            .ok()?;
            match readlinkat(&parent, part.as_os_str()) {
                Err(Errno::EINVAL) => done.push(part), // not a symlink
                Err(_) => return None,
                Ok(target) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return None;
                    }
                    let target = PathBuf::from(target);
                    if target.is_absolute() {
                        let mut inside = self.strip_root(&target)?.to_path_buf();
                        inside.extend(todo);
                        return Some(inside);
                    }
                    for p in parts(&target).rev() {
                        todo.push_front(p);
                    }
                }
            }
        }
        None
    }

    /// `target` relative to the root, if it names a place inside it.
    fn strip_root<'a>(&self, target: &'a Path) -> Option<&'a Path> {
        target.strip_prefix(&self.path).ok().or_else(|| {
            self.given
                .as_ref()
                .and_then(|g| target.strip_prefix(g).ok())
        })
    }
}

/// Opens `rel` under the first root that has it as a regular file, beneath that root in one
/// step: a name that leads out of its root (a symlink, whenever it was put there) is refused.
pub fn resolve(roots: &[Root], rel: &Path) -> Result<Option<File>, ResolveError> {
    for root in roots {
        if let Some(file) = root.open_file(rel)? {
            return Ok(Some(file));
        }
    }
    Ok(None)
}

/// Files made for the client that asks, when it asks (a machine's boot configuration). A
/// name is the maker's when it answers `Some`. It runs on the thread that takes requests, so
/// it must answer in milliseconds.
pub trait Maker: Send + Sync {
    fn make(&self, client: SocketAddr, name: &str) -> Option<Vec<u8>>;
}

/// Files generated by the appliance (for example `autoexec.ipxe`), and its [`Maker`], served
/// before the roots.
#[derive(Clone, Default)]
pub struct MemFiles {
    files: Arc<RwLock<HashMap<String, Arc<[u8]>>>>,
    maker: Option<Arc<dyn Maker>>,
}

impl MemFiles {
    pub fn with_maker(maker: Arc<dyn Maker>) -> Self {
        MemFiles {
            files: Arc::default(),
            maker: Some(maker),
        }
    }

    pub fn insert(&self, name: &str, bytes: impl Into<Arc<[u8]>>) {
        self.files
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), bytes.into());
    }

    fn get(&self, client: SocketAddr, name: &str) -> Option<Arc<[u8]>> {
        if let Some(made) = self.maker.as_ref().and_then(|m| m.make(client, name)) {
            return Some(made.into());
        }
        self.files
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }
}

/// Settings of one TFTP server.
#[derive(Clone, Debug)]
pub struct TftpConfig {
    pub roots: Vec<PathBuf>,
    pub max_transfers: usize,
    pub block_size_limit: Option<u16>,
    pub window_size_limit: Option<u16>,
    pub timeout: Duration,
}

/// Files up to this size are read once and served from memory while they are unchanged: a
/// rack booting at once asks for the same boot loader hundreds of times.
const CACHE_FILE_MAX: u64 = 4 << 20;
const CACHE_TOTAL_MAX: usize = 64 << 20;

/// A file's identity (device, inode) and what says it is unchanged (size, mtime and ctime
/// in ns).
type FileId = (u64, u64);
type Stamp = (u64, i128, i128);

/// Files read once and served from memory (TFTP's boot loaders, HTTP's kernels and
/// initrds), by identity. An entry is used only while the file opened for the request (opened
/// beneath its root, so never a file it may not serve) still has that size, mtime and ctime. When
/// the total would pass its bound, the cache starts again empty.
pub struct FileCache {
    files: HashMap<FileId, (Stamp, Arc<[u8]>)>,
    bytes: usize,
    file_max: u64,
    total_max: usize,
}

impl FileCache {
    /// Files of at most `file_max` bytes, `total_max` in all.
    pub fn new(file_max: u64, total_max: usize) -> Self {
        FileCache {
            files: HashMap::new(),
            bytes: 0,
            file_max,
            total_max,
        }
    }

    /// Whether a file of `len` bytes is one to cache.
    pub fn takes(&self, len: u64) -> bool {
        len <= self.file_max
    }

    /// The cached bytes of the file with metadata `meta`, if they are cached and it is
    /// unchanged; never reads.
    pub fn get(&self, meta: &std::fs::Metadata) -> Option<Arc<[u8]>> {
        use std::os::unix::fs::MetadataExt;
        match self.files.get(&(meta.dev(), meta.ino())) {
            Some((s, b)) if *s == stamp_of(meta) => Some(b.clone()),
            _ => None,
        }
    }

    /// The bytes of `file` (open, with metadata `meta`): from the cache, or read and cached.
    pub fn bytes(&mut self, file: &mut File, meta: &std::fs::Metadata) -> io::Result<Arc<[u8]>> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let key = (meta.dev(), meta.ino());
        let stamp = stamp_of(meta);
        if let Some((s, b)) = self.files.get(&key)
            && *s == stamp
        {
            return Ok(b.clone());
        }
        let mut v = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        // Never more than the size seen: a file growing under us is read again next time.
        file.take(meta.len()).read_to_end(&mut v)?;
        let b: Arc<[u8]> = v.into();
        // Kept only if the file did not change while it was read, and did not change in the
        // last second: a write within the file system's timestamp granularity could leave
        // the same stamp on other bytes (git's "racy" rule).
        let after = file.metadata()?;
        let settled = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|now| {
                i128::try_from(now.as_nanos()).unwrap_or(i128::MAX) - stamp.2 > 1_000_000_000
            })
            .unwrap_or(false);
        if stamp_of(&after) == stamp && settled && u64::try_from(b.len()).ok() == Some(stamp.0) {
            if self.bytes + b.len() > self.total_max {
                self.files.clear();
                self.bytes = 0;
            }
            self.bytes += b.len();
            if let Some((_, old)) = self.files.insert(key, (stamp, b.clone())) {
                self.bytes -= old.len();
            }
        }
        Ok(b)
    }
}

/// Size, mtime and ctime (ns): ctime cannot be set from user space, so a file rewritten with
/// its old size and mtime restored still shows as changed.
fn stamp_of(meta: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (
        meta.len(),
        ns(meta.mtime(), meta.mtime_nsec()),
        ns(meta.ctime(), meta.ctime_nsec()),
    )
}

/// Resolves and opens files for read requests, and counts transfers.
pub struct BootHandler {
    roots: Vec<Root>,
    mem: MemFiles,
    cache: Mutex<FileCache>,
    active: Mutex<HashSet<SocketAddr>>,
    limit: usize,
}

impl BootHandler {
    pub fn new(config: &TftpConfig, mem: MemFiles) -> Result<Self, RootError> {
        let roots = config
            .roots
            .iter()
            .map(|r| Root::open(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BootHandler {
            roots,
            mem,
            cache: Mutex::new(FileCache::new(CACHE_FILE_MAX, CACHE_TOTAL_MAX)),
            active: Mutex::new(HashSet::new()),
            limit: config.max_transfers.max(1),
        })
    }

    /// Opens `name`: generated files first, then the roots. The error is what the client is told.
    pub fn open(&self, client: &SocketAddr, name: &str) -> Result<Source, Refusal> {
        let refuse = |e: PathError| {
            tracing::warn!(%client, file = name, reason = %e, "tftp: refused");
            Refusal::access(e)
        };
        let rel = clean_request(name).map_err(refuse)?;
        let key = rel.to_string_lossy();
        if let Some(bytes) = self.mem.get(*client, &key) {
            let len = u64::try_from(bytes.len()).ok();
            return Ok(Source {
                reader: Box::new(io::Cursor::new(bytes)),
                size: len,
            });
        }
        let file = resolve(&self.roots, &rel)
            .map_err(|e| match e {
                ResolveError::Refused(e) => refuse(e),
                e => {
                    tracing::error!(%client, file = name, error = %e, "tftp: cannot open");
                    Refusal::access(e)
                }
            })?
            .ok_or_else(|| Refusal {
                code: ErrorCode::FileNotFound,
                message: "File not found".to_string(),
            })?;
        let mut file = file;
        let meta = file.metadata().map_err(|e| {
            tracing::error!(%client, file = name, error = %e, "tftp: cannot stat");
            Refusal::access(e)
        })?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.takes(meta.len()) {
            let bytes = cache.bytes(&mut file, &meta).map_err(|e| {
                tracing::error!(%client, file = name, error = %e, "tftp: cannot read");
                Refusal::access(e)
            })?;
            let len = u64::try_from(bytes.len()).ok();
            return Ok(Source {
                reader: Box::new(io::Cursor::new(bytes)),
                size: len,
            });
        }
        Ok(Source {
            reader: Box::new(io::BufReader::with_capacity(64 * 1024, file)),
            size: Some(meta.len()),
        })
    }

    /// The client's transfer ended (or never started): it may ask again.
    fn release(&self, peer: &SocketAddr) {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(peer);
    }
}

/// Why a file is not served: the error packet's code and text, as the client is told.
#[derive(Debug, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    fn access(why: impl std::fmt::Display) -> Self {
        Refusal {
            code: ErrorCode::AccessViolation,
            message: why.to_string(),
        }
    }
}

/// Why a TFTP server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("cannot start TFTP on {listen}: {source}")]
    Bind {
        listen: SocketAddr,
        source: io::Error,
    },
    #[error("cannot start the TFTP thread for {listen}: {source}")]
    Thread {
        listen: SocketAddr,
        source: io::Error,
    },
}

/// Starts a TFTP server on `listen`: a thread that takes requests on the well-known port,
/// and transfer loops ([`pool`], one per core) that run every transfer on a socket of its
/// own. Returns once the roots are open and the socket is bound, so those errors are reported.
pub fn spawn(listen: SocketAddr, config: TftpConfig, mem: MemFiles) -> Result<(), StartError> {
    let handler = Arc::new(BootHandler::new(&config, mem)?);
    let socket = UdpSocket::bind(listen).map_err(|source| StartError::Bind { listen, source })?;
    // A rack powering on sends its read requests within a millisecond: the default receive
    // buffer (about 200 small datagrams) would drop most of them, and each dropped client
    // waits seconds before it asks again.
    enlarge_receive_buffer(&socket, 8 << 20);
    let limits = Limits {
        max_block_size: config.block_size_limit.unwrap_or(65464),
        max_window_size: config.window_size_limit.unwrap_or(64),
        default_timeout: config.timeout,
    };
    // A transfer holds one socket (and, for files too large to cache, one file).
    raise_file_limit(2 * config.max_transfers + 256);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = pool::Pool::start(threads, &format!("tftp-{listen}"))
        .map_err(|source| StartError::Thread { listen, source })?;
    std::thread::Builder::new()
        .name(format!("tftp-{listen}"))
        .spawn(move || serve(socket, listen, handler, limits, pool))
        .map_err(|source| StartError::Thread { listen, source })?;
    Ok(())
}

/// Sets the socket's receive buffer to `bytes`, beyond `net.core.rmem_max` when we may
/// (SO_RCVBUFFORCE needs CAP_NET_ADMIN), else as far as the system allows.
fn enlarge_receive_buffer(socket: &UdpSocket, bytes: usize) {
    use nix::sys::socket::{setsockopt, sockopt};
    if setsockopt(socket, sockopt::RcvBufForce, &bytes).is_err()
        && let Err(e) = setsockopt(socket, sockopt::RcvBuf, &bytes)
    {
        tracing::warn!(error = %e, "tftp: cannot enlarge the receive buffer");
    }
}

/// Raises the soft limit on open files towards `want` (within the hard limit), so that the
/// configured number of transfers can run; says so when it cannot.
fn raise_file_limit(want: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let want = u64::try_from(want).unwrap_or(u64::MAX);
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < want => {
            let new = want.min(hard);
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, new, hard) {
                tracing::warn!(error = %e, soft, want, "tftp: cannot raise the open-file limit");
            } else if new < want {
                tracing::warn!(
                    limit = new,
                    want,
                    "tftp: the open-file limit caps concurrent transfers"
                );
            }
        }
        _ => {}
    }
}

fn serve(
    socket: UdpSocket,
    listen: SocketAddr,
    handler: Arc<BootHandler>,
    limits: Limits,
    pool: pool::Pool,
) {
    let mut buf = [0u8; 2048];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(%listen, error = %e, "tftp: receive failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let req = match parse_request(&buf[..n]) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "tftp: ignored packet");
                continue;
            }
        };
        if req.write {
            tracing::warn!(%peer, file = %req.filename, "tftp: write refused");
            let _ = socket.send_to(
                &error_packet(ErrorCode::AccessViolation, "this server is read-only"),
                peer,
            );
            continue;
        }
        {
            let mut active = handler.active.lock().unwrap_or_else(|p| p.into_inner());
            if active.contains(&peer) {
                continue; // a retransmitted request for a transfer in progress
            }
            if active.len() >= handler.limit {
                tracing::warn!(%peer, "tftp: too many transfers, refusing");
                let _ = socket.send_to(
                    &error_packet(
                        ErrorCode::NotDefined,
                        "server busy: too many transfers, try again",
                    ),
                    peer,
                );
                continue;
            }
            active.insert(peer);
        }
        if let Some(job) = transfer(&handler, listen, peer, &req, limits) {
            if let Err(e) = pool.submit(job) {
                tracing::error!(%peer, error = %e, "tftp: cannot start a transfer");
                handler.release(&peer);
            }
        } else {
            handler.release(&peer);
        }
    }
}

/// Opens the file and the transfer's socket and negotiates: the transfer, ready to run, or
/// `None` when the client was answered with an error.
fn transfer(
    handler: &Arc<BootHandler>,
    listen: SocketAddr,
    peer: SocketAddr,
    req: &Request,
    limits: Limits,
) -> Option<pool::Job> {
    let sock = match transfer_socket(listen, peer) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(%peer, error = %e, "tftp: cannot open a transfer socket");
            return None;
        }
    };
    let src = match handler.open(&peer, &req.filename) {
        Ok(s) => s,
        Err(refused) => {
            let _ = sock.send(&error_packet(refused.code, &refused.message));
            return None;
        }
    };
    let n = negotiate(req, src.size, limits);
    let started = std::time::Instant::now();
    tracing::info!(%peer, file = %req.filename, size = src.size, blksize = n.block_size, windowsize = n.window_size, "tftp: transfer");
    let file = req.filename.clone();
    let h = handler.clone();
    Some(pool::Job {
        sock,
        transfer: Transfer::new(src, n),
        done: Box::new(move |end| {
            h.release(&peer);
            match end {
                Ok(bytes) => {
                    tracing::debug!(%peer, %file, bytes, ms = started.elapsed().as_millis(), "tftp: transfer done")
                }
                Err(e) => tracing::warn!(%peer, %file, error = %e, "tftp: transfer failed"),
            }
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn cleans_names() {
        assert_eq!(
            clean_request("undionly.kpxe").unwrap(),
            PathBuf::from("undionly.kpxe")
        );
        assert_eq!(clean_request("a//b/./c").unwrap(), PathBuf::from("a/b/c"));
        assert_eq!(
            clean_request("/grub/grub.cfg").unwrap(),
            PathBuf::from("grub/grub.cfg")
        );
        assert_eq!(
            clean_request("/etc/passwd").unwrap(),
            PathBuf::from("etc/passwd")
        );
        let bad: &[(&str, PathError)] = &[
            ("", PathError::Empty),
            ("./", PathError::Empty),
            ("/", PathError::Empty),
            ("/../etc/passwd", PathError::Parent),
            ("../etc/passwd", PathError::Parent),
            ("a/../../b", PathError::Parent),
            ("..\\..\\boot.ini", PathError::Backslash),
            ("a\0b", PathError::Control),
            ("a\nb", PathError::Control),
        ];
        for (name, want) in bad {
            assert_eq!(&clean_request(name).unwrap_err(), want, "{name:?}");
        }
    }

    #[test]
    fn resolves_inside_roots_only() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("one"), b"1").unwrap();
        std::fs::write(b.path().join("two"), b"2").unwrap();
        std::fs::create_dir(a.path().join("dir")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), a.path().join("leak")).unwrap();
        std::os::unix::fs::symlink(a.path().join("one"), a.path().join("alias")).unwrap();
        let roots: Vec<Root> = [a.path(), b.path()]
            .iter()
            .map(|p| Root::open(p).unwrap())
            .collect();
        let r = |n: &str| opened(&roots, n);
        assert_eq!(r("one").unwrap(), Some(roots[0].path().join("one")));
        assert_eq!(r("two").unwrap(), Some(roots[1].path().join("two")));
        assert_eq!(r("alias").unwrap(), Some(roots[0].path().join("one")));
        assert_eq!(r("missing").unwrap(), None);
        assert_eq!(r("dir").unwrap(), None, "directories are not files");
        assert_eq!(r("leak").unwrap_err(), PathError::Escapes);
    }

    /// What `resolve` opened, as the real path of the descriptor; refusals as their reason.
    fn opened(roots: &[Root], name: &str) -> Result<Option<PathBuf>, PathError> {
        match resolve(roots, Path::new(name)) {
            Ok(file) => Ok(file
                .map(|f| std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap())),
            Err(ResolveError::Refused(e)) => Err(e),
            Err(e) => panic!("{name}: {e}"),
        }
    }

    /// Every way out of the root through a symlink is refused by the one open beneath the
    /// root; links that stay inside (relative, absolute, chained, through directories) work.
    #[test]
    fn symlinks_leading_out_are_refused_by_the_open_itself() {
        let outside = tempfile::tempdir().unwrap();
        let out = std::fs::canonicalize(outside.path()).unwrap();
        std::fs::write(out.join("secret"), b"s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let r = root.path().to_path_buf();
        let ln =
            |target: &Path, name: &str| std::os::unix::fs::symlink(target, r.join(name)).unwrap();
        std::fs::create_dir_all(r.join("sub/deep")).unwrap();
        std::fs::write(r.join("one"), b"1").unwrap();
        std::fs::write(r.join("sub/deep/two"), b"2").unwrap();
        let up = Path::new("..").join(out.file_name().unwrap());
        // Out of the root.
        ln(&out.join("secret"), "abs-out");
        ln(&up.join("secret"), "rel-out");
        ln(&out, "dir-out");
        ln(
            &r.join("../").join(out.file_name().unwrap()).join("secret"),
            "abs-in-then-up",
        );
        ln(Path::new("abs-out"), "chain-out");
        ln(&r.join("sub"), "abs-sub");
        ln(Path::new("/proc/self/root/etc/hostname"), "abs-proc");
        std::os::unix::fs::symlink("../../../x", r.join("sub/deep/up3")).unwrap();
        // Inside the root.
        ln(Path::new("sub/deep/../deep/two"), "rel-in");
        ln(&r.join("sub/deep"), "abs-dir-in");
        ln(Path::new("abs-dir-in"), "chain-in");
        ln(&r.join("chain-in/two"), "abs-chain-in");
        ln(Path::new("loop-b"), "loop-a");
        ln(Path::new("loop-a"), "loop-b");
        std::os::unix::fs::symlink("../../one", r.join("sub/deep/up2")).unwrap();
        let roots = [root];
        for name in [
            "abs-out",
            "rel-out",
            "dir-out/secret",
            "abs-in-then-up",
            "chain-out",
            "abs-sub/deep/up3",
            "sub/deep/up3",
            "abs-proc",
        ] {
            assert_eq!(opened(&roots, name), Err(PathError::Escapes), "{name}");
        }
        let two = Some(r.join("sub/deep/two"));
        for (name, want) in [
            ("rel-in", two.clone()),
            ("abs-dir-in/two", two.clone()),
            ("chain-in/two", two.clone()),
            ("abs-chain-in", two.clone()),
            ("abs-sub/deep/two", two.clone()),
            ("abs-sub/deep/up2", Some(r.join("one"))),
            ("sub/deep/up2", Some(r.join("one"))),
            ("abs-sub/nothing", None),
            ("loop-a", None),
        ] {
            assert_eq!(opened(&roots, name), Ok(want), "{name}");
        }
        // Magic links (procfs) are never followed, even where they are names beneath the
        // root: `exe` is the test binary itself, a regular file.
        let proc_self = [Root::open(Path::new("/proc/self")).unwrap()];
        assert_eq!(opened(&proc_self, "exe"), Ok(None));
        assert_eq!(opened(&proc_self, "cwd/Cargo.toml"), Ok(None));
        let status = opened(&proc_self, "status").unwrap();
        assert_eq!(status, Some(proc_self[0].path().join("status")));
    }

    /// A file is swapped for symlinks out of the root (absolute, relative, and a directory
    /// swapped for a link to an outside directory) as fast as a thread can rename, while
    /// requests for it are served: the swap lands between check and open of a
    /// check-then-open server; no request here may ever return the outside bytes.
    /// A maker answers for its names, with the asking client's address; other names go on
    /// to the generated files and the roots, with or without a leading `/`.
    #[test]
    fn made_files_come_first_for_their_client() {
        struct PerClient;
        impl Maker for PerClient {
            fn make(&self, client: SocketAddr, name: &str) -> Option<Vec<u8>> {
                name.starts_with("grub/paddock/")
                    .then(|| format!("{name} for {}", client.ip()).into_bytes())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("grub/paddock")).unwrap();
        std::fs::write(dir.path().join("grub/paddock/x.cfg"), b"on disk").unwrap();
        std::fs::write(dir.path().join("vmlinuz"), b"kernel").unwrap();
        let mem = MemFiles::with_maker(Arc::new(PerClient));
        mem.insert("grub/grub.cfg", &b"chain"[..]);
        let handler = BootHandler::new(
            &TftpConfig {
                roots: vec![dir.path().to_path_buf()],
                max_transfers: 1,
                block_size_limit: None,
                window_size_limit: None,
                timeout: Duration::from_secs(1),
            },
            mem,
        )
        .unwrap();
        let read = |client: &str, name: &str| {
            let client: SocketAddr = client.parse().unwrap();
            let mut src = handler.open(&client, name).map_err(|r| r.message)?;
            let mut out = String::new();
            src.reader.read_to_string(&mut out).unwrap();
            Ok::<_, String>(out)
        };
        assert_eq!(
            read("198.18.0.20:1234", "/grub/paddock/x.cfg").unwrap(),
            "grub/paddock/x.cfg for 198.18.0.20"
        );
        assert_eq!(
            read("198.18.0.21:1", "grub/paddock/x.cfg").unwrap(),
            "grub/paddock/x.cfg for 198.18.0.21"
        );
        assert_eq!(read("198.18.0.20:1", "/grub/grub.cfg").unwrap(), "chain");
        assert_eq!(read("198.18.0.20:1", "/vmlinuz").unwrap(), "kernel");
        assert_eq!(
            read("198.18.0.20:1", "/grub/x86_64-efi/command.lst").unwrap_err(),
            "File not found"
        );
    }

    #[test]
    fn a_file_swapped_for_an_escaping_symlink_is_never_served_from_outside() {
        use std::sync::atomic::{AtomicBool, Ordering};
        const INSIDE: &[u8] = b"inside the root";
        const SECRET: &[u8] = b"SECRET from outside the root";
        let outside = tempfile::tempdir().unwrap();
        let out = std::fs::canonicalize(outside.path()).unwrap();
        std::fs::create_dir(out.join("d")).unwrap();
        std::fs::write(out.join("boot.bin"), SECRET).unwrap();
        std::fs::write(out.join("d/boot.bin"), SECRET).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(r.join("boot.bin"), INSIDE).unwrap();
        std::fs::create_dir(r.join("d")).unwrap();
        std::fs::write(r.join("d/boot.bin"), INSIDE).unwrap();
        let handler = BootHandler::new(
            &TftpConfig {
                roots: vec![r.clone()],
                max_transfers: 1,
                block_size_limit: None,
                window_size_limit: None,
                timeout: Duration::from_secs(1),
            },
            MemFiles::default(),
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, r, out) = (stop.clone(), r.clone(), out.clone());
            std::thread::spawn(move || {
                let up = Path::new("..").join(out.file_name().unwrap());
                let links = [out.join("boot.bin"), up.join("boot.bin")];
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for link in &links {
                        std::os::unix::fs::symlink(link, r.join(".link")).unwrap();
                        std::fs::rename(r.join(".link"), r.join("boot.bin")).unwrap();
                        std::fs::write(r.join(".file"), INSIDE).unwrap();
                        std::fs::rename(r.join(".file"), r.join("boot.bin")).unwrap();
                    }
                    // The directory: swapped for a link to the outside one, and back.
                    std::os::unix::fs::symlink(out.join("d"), r.join(".dlink")).unwrap();
                    std::fs::rename(r.join("d"), r.join(".d")).unwrap();
                    std::fs::rename(r.join(".dlink"), r.join("d")).unwrap();
                    std::fs::remove_file(r.join(".d-old")).ok();
                    std::fs::rename(r.join("d"), r.join(".d-old")).unwrap();
                    std::fs::rename(r.join(".d"), r.join("d")).unwrap();
                    swaps += 1;
                }
                swaps
            })
        };
        let client: SocketAddr = "198.18.0.2:1069".parse().unwrap();
        let (mut served, mut refused, mut missing) = (0u64, 0u64, 0u64);
        let started = std::time::Instant::now();
        let mut i = 0u64;
        while i < 20_000 || refused < 100 || served < 100 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the swap never showed: served {served}, refused {refused}"
            );
            let name = if i.is_multiple_of(2) {
                "boot.bin"
            } else {
                "d/boot.bin"
            };
            i += 1;
            match handler.open(&client, name) {
                Ok(mut src) => {
                    let mut bytes = Vec::new();
                    std::io::Read::read_to_end(&mut src.reader, &mut bytes).unwrap();
                    assert_ne!(
                        bytes, SECRET,
                        "request {i} for {name} served the outside file"
                    );
                    assert_eq!(bytes, INSIDE, "request {i} for {name}");
                    served += 1;
                }
                Err(Refusal {
                    code: ErrorCode::AccessViolation,
                    message,
                }) => {
                    assert_eq!(
                        message,
                        PathError::Escapes.to_string(),
                        "request {i} for {name}"
                    );
                    refused += 1;
                }
                // The directory is briefly absent while it is swapped back.
                Err(Refusal {
                    code: ErrorCode::FileNotFound,
                    ..
                }) if name == "d/boot.bin" => missing += 1,
                Err(e) => panic!("request {i} for {name}: {e:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        eprintln!(
            "{i} requests, {swaps} swap cycles: {served} served, {refused} refused, {missing} missing"
        );
    }

    #[test]
    fn a_root_that_is_not_a_directory_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        for path in [file, dir.path().join("missing")] {
            let e = Root::open(&path).unwrap_err();
            assert!(matches!(e, RootError::Unusable { .. }), "{e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("TFTP root {}: ", path.display())),
                "{e}"
            );
        }
    }
}
