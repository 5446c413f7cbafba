//! Shared helpers for subd's integration tests: trees on temporary roots, an object store
//! directory and an in-process object server, tree comparison, subd over HTTP.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use paddock_image::{FileSystem, Filter, Image, Inode, ObjectId, Triggers};
use paddock_subd::scan::{self, Scan, ScanOptions};
use paddock_subd::service::PollResponse;
use paddock_subd::{Subd, SubdConfig};
use serde_json::{Value, json};

pub const WAIT: Duration = Duration::from_secs(60);

/// Polls `f` until it holds (at most [`WAIT`]; `what` names it in the failure).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A temporary directory holding three empty ones: the sub's root, the image's tree
/// (`want`) and an object store.
pub fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let [root, want, store] = ["root", "want", "store"].map(|n| tmp.path().join(n));
    for p in [&root, &want, &store] {
        fs::create_dir(p).unwrap();
    }
    (tmp, root, want, store)
}

pub fn write(root: &Path, rel: &str, content: &[u8], mode: u32) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    let _ = fs::remove_file(&p);
    fs::write(&p, content).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

pub fn set_mtime(p: &Path, sec: u64) {
    fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_times(
            fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH + Duration::from_secs(sec)),
        )
        .unwrap();
}

/// Bytes that are not all alike.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A complete scan of `root` with no exclusions.
pub fn scan_tree(root: &Path) -> Scan {
    let f = Filter::empty();
    let mut o = ScanOptions::new(&f);
    o.threads = 2;
    let r = scan::scan(root, &o).unwrap();
    assert!(r.stats.complete, "{:?}", r.stats);
    assert!(
        r.stats.errors.is_empty() && r.stats.unstable.is_empty(),
        "{:?}",
        r.stats
    );
    r.scan
}

/// A full image (empty filter: nothing filtered, extras deleted) of the tree at `dir`.
pub fn image_of(name: &str, fs_: FileSystem, triggers: &str) -> Image {
    Image {
        triggers: Triggers::parse(triggers).unwrap(),
        ..Image::new(name, fs_, Some(Filter::empty()))
    }
}

/// Copies every object of the tree scanned at `src` into `store` (`xx/yy/<rest>`).
pub fn store_objects(src: &Path, fs_: &FileSystem, store: &Path) {
    let names = fs_.names();
    for (ino, inode) in &fs_.inodes {
        if let Some(o) = inode.object() {
            let dest = store.join(o.path());
            if dest.exists() {
                continue;
            }
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            let first = names[ino][0];
            fs::copy(src.join(&first[1..]), &dest).unwrap();
        }
    }
}

/// Puts objects from `store` into the root's cache (what a fetch does).
pub fn put_objects(store: &Path, root: &Path, ids: &BTreeSet<ObjectId>) {
    for id in ids {
        let dest = root.join(".subd/objects").join(id.path());
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(store.join(id.path()), dest).unwrap();
    }
}

/// A tree by path: each path's inode and the first name of its inode (the hard-link group),
/// independent of inode numbering.
pub fn canonical(fs_: &FileSystem) -> BTreeMap<String, (Inode, String)> {
    let names = fs_.names();
    fs_.paths
        .iter()
        .map(|(p, i)| (p.clone(), (fs_.inodes[i].clone(), names[i][0].to_string())))
        .collect()
}

/// Asserts two trees are the same (paths, inodes, hard-link groups), with the first
/// differences named.
pub fn assert_same_tree(got: &FileSystem, want: &FileSystem) {
    let (g, w) = (canonical(got), canonical(want));
    if g == w {
        return;
    }
    let mut diffs = Vec::new();
    for (p, v) in &w {
        match g.get(p) {
            None => diffs.push(format!("missing {p}: {v:?}")),
            Some(x) if x != v => diffs.push(format!("differs {p}: got {x:?} want {v:?}")),
            _ => {}
        }
    }
    for p in g.keys() {
        if !w.contains_key(p) {
            diffs.push(format!("extra {p}: {:?}", g[p]));
        }
    }
    panic!(
        "trees differ in {} paths:\n{}",
        diffs.len(),
        diffs
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Walks two directories (not following symlinks, skipping `/.subd` at the top) and
/// asserts they hold the same names, kinds, owners, modes, mtimes (not of directories or
/// symlinks), symlink targets, device numbers and bytes. Returns the paths compared.
pub fn assert_same_dirs(a: &Path, b: &Path) -> u64 {
    let mut n = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let list = |d: &Path| -> BTreeSet<std::ffi::OsString> {
            fs::read_dir(d.join(&rel))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| !(rel.as_os_str().is_empty() && n == ".subd"))
                .collect()
        };
        let (la, lb) = (list(a), list(b));
        assert_eq!(la, lb, "entries of /{}", rel.display());
        for name in la {
            let r = rel.join(&name);
            let (pa, pb) = (a.join(&r), b.join(&r));
            let (ma, mb) = (
                fs::symlink_metadata(&pa).unwrap(),
                fs::symlink_metadata(&pb).unwrap(),
            );
            let what = format!("/{}", r.display());
            assert_eq!(
                (ma.mode(), ma.uid(), ma.gid()),
                (mb.mode(), mb.uid(), mb.gid()),
                "{what}: mode/owner"
            );
            n += 1;
            let ft = ma.file_type();
            if ft.is_dir() {
                stack.push(r);
            } else if ft.is_symlink() {
                assert_eq!(
                    fs::read_link(&pa).unwrap(),
                    fs::read_link(&pb).unwrap(),
                    "{what}: target"
                );
            } else {
                assert_eq!(
                    (ma.mtime(), ma.mtime_nsec()),
                    (mb.mtime(), mb.mtime_nsec()),
                    "{what}: mtime"
                );
                if ft.is_block_device() || ft.is_char_device() {
                    assert_eq!(ma.rdev(), mb.rdev(), "{what}: rdev");
                } else if ft.is_file() {
                    assert_eq!(ma.len(), mb.len(), "{what}: size");
                    assert!(same_bytes(&pa, &pb), "{what}: bytes differ");
                }
            }
        }
    }
    n
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// Names ending in `~` under the cache, and scratch names in `.subd`.
pub fn leftovers(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(".subd")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if name.ends_with('~') || name.starts_with("tmp-") {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

// ---- an in-process object server ---------------------------------------------------------

/// Knobs for misbehaving.
#[derive(Default)]
pub struct ObjectServerControl {
    /// While set, every object after the first this server sends waits (a fetch asks on
    /// several connections at once: each answer may hold a single object).
    pub stall: AtomicBool,
    /// Objects begun, over every answer.
    pub sent: AtomicU64,
    /// Flip the first byte of every object sent.
    pub corrupt: AtomicBool,
    /// Requests answered.
    pub requests: AtomicU64,
    /// The users of the certificates requests came with (over TLS).
    pub callers: std::sync::Mutex<Vec<String>>,
}

#[derive(Clone)]
struct ObjState {
    dir: PathBuf,
    control: Arc<ObjectServerControl>,
}

async fn get_objects(
    State(s): State<ObjState>,
    peer: Option<axum::Extension<paddock_security::tls::Peer>>,
    body: Bytes,
) -> Response {
    s.control.requests.fetch_add(1, Ordering::Relaxed);
    if let Some(id) = peer.and_then(|p| p.0.identity) {
        s.control.callers.lock().unwrap().push(id.user.clone());
    }
    let req: Value = serde_json::from_slice(&body).unwrap();
    let ids: Vec<ObjectId> = serde_json::from_value(req["objects"].clone()).unwrap();
    for id in &ids {
        if !s.dir.join(id.path()).exists() {
            return paddock_wire::ApiError::not_found(format!("object {id} missing"))
                .into_response();
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || {
        for id in &ids {
            if s.control.sent.fetch_add(1, Ordering::SeqCst) >= 1 {
                while s.control.stall.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let mut bytes = fs::read(s.dir.join(id.path())).unwrap();
            if s.control.corrupt.load(Ordering::SeqCst) && !bytes.is_empty() {
                bytes[0] ^= 0xff;
            }
            let len = paddock_wire::frames::header(u64::try_from(bytes.len()).unwrap());
            if tx.blocking_send(Ok(Bytes::copy_from_slice(&len))).is_err() {
                return;
            }
            for chunk in bytes.chunks(64 << 10) {
                if tx.blocking_send(Ok(Bytes::copy_from_slice(chunk))).is_err() {
                    return;
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder().body(Body::from_stream(stream)).unwrap()
}

/// Serves `dir` (`xx/yy/<rest>`) as `ObjectServer.GetObjects` on the runtime; returns its
/// address.
pub fn object_server(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
) -> (String, Arc<ObjectServerControl>) {
    object_server_with(rt, dir, None)
}

/// [`object_server`], over TLS with `tls`: callers need a certificate from its CA that
/// grants `ObjectServer.GetObjects` (checked by subd's own layer, as the appliance does).
pub fn object_server_with(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (String, Arc<ObjectServerControl>) {
    let control = Arc::new(ObjectServerControl::default());
    let state = ObjState {
        dir: dir.to_path_buf(),
        control: control.clone(),
    };
    let app = axum::Router::new()
        .route(
            "/rpc/ObjectServer.GetObjects",
            axum::routing::post(get_objects),
        )
        .with_state(state);
    let app = match tls {
        Some(_) => app.layer(axum::middleware::from_fn(paddock_subd::rpc::authorize)),
        None => app,
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = paddock_security::tls::Limits::default();
    rt.spawn(paddock_security::tls::serve(listener, tls, app, limits));
    (addr.to_string(), control)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---- subd over HTTP -----------------------------------------------------------------------

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// The message of an error answer (`{"error": {"message"}}`), else empty.
pub fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Talks to a subd at `url` as `client`.
#[derive(Clone)]
pub struct Client {
    pub url: String,
    pub name: String,
    agent: ureq::Agent,
}

impl Client {
    pub fn new(url: &str, name: &str) -> Self {
        Self::with_agent(url, name, agent())
    }

    /// A client through `agent` (TLS settings of its own).
    pub fn with_agent(url: &str, name: &str, agent: ureq::Agent) -> Self {
        Client {
            url: url.into(),
            name: name.into(),
            agent,
        }
    }

    /// POSTs JSON to `/rpc/<method>`; returns the status and the JSON answer.
    pub fn call(&self, method: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .agent
            .post(format!("{}/rpc/{method}", self.url))
            .header("x-paddock-client", &self.name)
            .send_json(body)
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        let status = resp.status().as_u16();
        let v: Value = resp
            .into_body()
            .with_config()
            .limit(1 << 30)
            .read_json()
            .unwrap_or(Value::Null);
        (status, v)
    }

    pub fn ok(&self, method: &str, body: &Value) -> Value {
        let (s, v) = self.call(method, body);
        assert_eq!(s, 200, "{method}: {v}");
        v
    }

    pub fn poll(&self, have: u64) -> PollResponse {
        let v = self.ok("Subd.Poll", &json!({ "have_generation": have }));
        serde_json::from_value(v).unwrap()
    }

    /// Waits for a scan that starts after this call (what a controller does after an
    /// update) and returns the full answer.
    pub fn fresh_scan(&self) -> PollResponse {
        let n = self.poll(u64::MAX).scan_count;
        self.wait_scan(n)
    }

    /// Polls until a scan newer than `after` scans is in, returning the full answer.
    pub fn wait_scan(&self, after: u64) -> PollResponse {
        let mut p = None;
        wait_until(&format!("a scan after {after}"), || {
            let q = self.poll(0);
            let done = q.scan_count > after && q.file_system.is_some();
            p = Some(q);
            done
        });
        p.unwrap()
    }
}

/// A subd in this process, serving HTTP on 127.0.0.1.
pub struct TestSubd {
    pub rt: tokio::runtime::Runtime,
    pub subd: Arc<Subd>,
    pub url: String,
}

/// [`SubdConfig::for_tests`], with trigger commands cut short after 30 s.
pub fn test_config(root: &Path) -> SubdConfig {
    SubdConfig {
        command_timeout: Duration::from_secs(30),
        ..SubdConfig::for_tests(root)
    }
}

impl TestSubd {
    pub fn start(config: SubdConfig) -> Self {
        let rt = runtime();
        let subd = Subd::start(config).unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(paddock_subd::rpc::serve(listener, subd.clone(), None));
        TestSubd { rt, subd, url }
    }

    pub fn client(&self, name: &str) -> Client {
        Client::new(&self.url, name)
    }
}

/// A trigger command: a script that appends `SERVICE VERB <marker state>` to `log`, where
/// the marker state says whether `marker` exists when it runs; it fails for services
/// named `fail*`.
pub fn trigger_script(dir: &Path, log: &Path, marker: &Path) -> PathBuf {
    let p = dir.join("trigger.sh");
    fs::write(
        &p,
        format!(
            "#!/bin/sh\nif [ -e '{m}' ]; then s=new; else s=old; fi\necho \"$1 $2 $s\" >> '{l}'\n\
             case \"$1\" in fail*) exit 1;; esac\nexit 0\n",
            m = marker.display(),
            l = log.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// [`trigger_script`] as subd's trigger command.
pub fn trigger_command(dir: &Path, log: &Path, marker: &Path) -> Vec<String> {
    vec![trigger_script(dir, log, marker).display().to_string()]
}

pub fn read_lines(p: &Path) -> Vec<String> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

// ---- a scenario exercising every step of an update ---------------------------------------

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn w(root: &Path, rel: &str, content: &[u8], mode: u32, mtime: u64) {
    write(root, rel, content, mode);
    set_mtime(&root.join(rel), mtime);
}

fn fifo(root: &Path, rel: &str, mode: u32) {
    let p = root.join(rel);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

/// The sub before the update.
pub fn old_tree(root: &Path) {
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    w(root, "etc/motd", b"old motd\n", 0o644, 1000);
    w(root, "etc/keep", b"same\n", 0o644, 1000);
    w(root, "etc/mode-change", b"x\n", 0o644, 1000);
    w(root, "etc/mtime-only", b"m\n", 0o644, 1000);
    w(root, "etc/owned", b"o\n", 0o644, 1000);
    w(root, "usr/bin/tool", &pattern(300_000, 1), 0o755, 1000);
    fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool2")).unwrap();
    w(root, "opt/moved", b"moved content\n", 0o644, 1000);
    w(root, "opt/shared-src", b"shared\n", 0o644, 1000);
    w(root, "dir-to-file/a", b"a\n", 0o644, 1000);
    w(root, "dir-to-file/b/c", b"c\n", 0o644, 1000);
    w(root, "file-to-dir", b"f\n", 0o644, 1000);
    w(root, "was-file", b"w\n", 0o644, 1000);
    fs::create_dir_all(root.join("hl-over-dir/x")).unwrap();
    std::os::unix::fs::symlink("a", root.join("link")).unwrap();
    fifo(root, "fifo", 0o600);
    w(root, "gone/deep/er/file", b"g\n", 0o644, 1000);
    std::os::unix::fs::symlink("/nowhere", root.join("gone/dangling")).unwrap();
    w(root, "gone-file", b"gf\n", 0o644, 1000);
    w(root, "split1", b"S\n", 0o644, 1000);
    fs::hard_link(root.join("split1"), root.join("split2")).unwrap();
}

/// The image's tree.
pub fn new_tree(root: &Path) {
    fs::set_permissions(root, fs::Permissions::from_mode(0o711)).unwrap();
    w(root, "etc/motd", b"new motd\n", 0o644, 2000);
    w(root, "etc/keep", b"same\n", 0o644, 1000);
    w(root, "etc/mode-change", b"x\n", 0o600, 1000);
    w(root, "etc/mtime-only", b"m\n", 0o644, 2000);
    w(root, "etc/owned", b"o\n", 0o644, 1000);
    if is_root() {
        std::os::unix::fs::lchown(root.join("etc/owned"), Some(1234), Some(4321)).unwrap();
    }
    w(root, "etc/empty", b"", 0o640, 3000);
    w(root, "usr/bin/tool", &pattern(300_000, 2), 0o755, 2000);
    fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool2")).unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool3")).unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("hl-over-dir")).unwrap();
    w(root, "srv/moved-here", b"moved content\n", 0o644, 1000);
    w(root, "srv/copy", b"shared\n", 0o644, 1000);
    w(root, "opt/shared-src", b"shared\n", 0o644, 1000);
    for i in 1..=3 {
        w(
            root,
            &format!("srv/dup{i}"),
            b"dup content\n",
            0o644,
            1000 + i,
        );
    }
    w(root, "dir-to-file", b"now a file\n", 0o644, 1000);
    w(root, "file-to-dir/inner", b"inner\n", 0o644, 1000);
    std::os::unix::fs::symlink("/etc/motd", root.join("was-file")).unwrap();
    std::os::unix::fs::symlink("b", root.join("link")).unwrap();
    fifo(root, "fifo", 0o644);
    w(root, "split1", b"S\n", 0o644, 1000);
    w(root, "split2", b"T\n", 0o644, 1000);
    w(root, "newdir/sub/deep", b"deep\n", 0o600, 1000);
    fs::set_permissions(root.join("newdir/sub"), fs::Permissions::from_mode(0o750)).unwrap();
    w(root, "setuid", b"#!/bin/true\n", 0o4755, 1000);
    if is_root() {
        fs::create_dir(root.join("dev")).unwrap();
        nix::sys::stat::mknod(
            &root.join("dev/zero"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 5),
        )
        .unwrap();
        fs::set_permissions(root.join("dev/zero"), fs::Permissions::from_mode(0o666)).unwrap();
        set_mtime_nofollow(&root.join("dev/zero"), 1000);
    }
}

fn set_mtime_nofollow(p: &Path, sec: i64) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &TimeSpec::UTIME_OMIT,
        &TimeSpec::new(sec, 0),
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

/// Poll, plan, fetch the missing objects from `server`, plan again with them in the cache.
pub fn plan_with_fetch(c: &Client, image: &Image, server: &str) -> paddock_image::UpdateRequest {
    let p = c.fresh_scan();
    let (fs_, cache) = (p.file_system.unwrap(), p.object_cache.unwrap());
    let missing = paddock_image::plan::missing_objects(&fs_, &cache, image);
    c.ok(
        "Subd.Fetch",
        &json!({"server": server, "objects": missing, "speed_percent": 100}),
    );
    let p = c.poll(0);
    paddock_image::plan::plan(&p.file_system.unwrap(), &p.object_cache.unwrap(), image)
}

/// Spawns the `paddock-subd` of `cmd` (its standard output is taken) and waits for
/// `paddock-subd: listening on ADDR`; the child and ADDR.
pub fn spawn_listening(cmd: &mut std::process::Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("paddock-subd: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (child, addr)
}
