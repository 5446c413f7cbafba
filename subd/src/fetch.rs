//! Fetch (Dominator's `sub/rpcd/fetch.go`): objects from an image server's
//! `ObjectServer.GetObjects` into the object cache, at a share of the link speed.
//!
//! The answer is each object as an 8-byte big-endian length then its bytes, in the order
//! asked. Each is written to `<object path>~`, its length and SHA-512 checked (Dominator
//! checks only the length; the hash is cheap next to the network and keeps a bad server from
//! poisoning the cache), then renamed into place. The objects are asked for in batches, on a
//! few connections at once (one per core), so decrypting and hashing use every core. Reading
//! is paced by one limiter shared by the connections ([`crate::ratelimit::Throttle`],
//! counting bytes): `max(configured, requested)` percent of the link speed, unlimited at
//! 100 % or when the speed is unknown.
//!
//! With TLS material ([`ObjectClient::new`]) an `https://` object server is verified against
//! the CA and subd authenticates with its own certificate (which must grant
//! `ObjectServer.GetObjects`); a bare `host:port` then means `https://`. Without it (subd's
//! `--insecure`) a bare `host:port` means plain `http://`.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use paddock_image::{ObjectHasher, ObjectId};
use paddock_wire::{error_message, frames};

use crate::ratelimit::{IoMeasure, Limits, Throttle, Usage};
use crate::vouch::{Key, Vouched};

/// Bytes per read from the network.
const CHUNK: usize = 256 << 10;

pub use paddock_subd_proto::FetchStats;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("object server {server}: {message}")]
    Server { server: String, message: String },
    #[error("object {object}: {message}")]
    Object { object: String, message: String },
    #[error("object cache: {0}")]
    Cache(io::Error),
}

/// The rate for a fetch: `max(configured, requested)` percent of the link; `None` (no limit)
/// at 100 % or more, or when the link speed is unknown.
pub fn fetch_rate(
    link_bytes_per_sec: Option<u64>,
    configured_percent: f64,
    requested_percent: f64,
) -> Option<f64> {
    let pct = configured_percent.max(requested_percent);
    let link = link_bytes_per_sec.filter(|b| *b > 0)?;
    Limits::io_percent(link, pct)
}

/// The fastest link among the interfaces that are up (not loopback), from
/// `<sys_class_net>/*/speed` (Mb/s) → bytes/s; `None` if none says.
pub fn link_speed(sys_class_net: &Path) -> Option<u64> {
    let mut best: Option<u64> = None;
    for e in fs::read_dir(sys_class_net).ok()?.flatten() {
        let dir = e.path();
        if e.file_name() == "lo" {
            continue;
        }
        let up = fs::read_to_string(dir.join("operstate")).is_ok_and(|s| s.trim() == "up");
        let speed = fs::read_to_string(dir.join("speed"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|s| *s > 0);
        if let (true, Some(mbit)) = (up, speed) {
            let b = mbit as u64 * 125_000;
            best = Some(best.map_or(b, |x| x.max(b)));
        }
    }
    best
}

/// `host:port` or a URL → the URL of `ObjectServer.GetObjects` (a bare `host:port` over
/// `https` when `tls`).
pub fn objects_url(server: &str, tls: bool) -> String {
    paddock_wire::rpc_url(server, "ObjectServer.GetObjects", tls)
}

/// How subd reaches object servers: an agent whose errors are answers, not transport
/// failures, that times out connecting but not reading (a throttled fetch of a large object
/// takes long); with `tls`, servers verified against the CA and subd's own certificate
/// presented ([`paddock_security::tls::ureq_tls`]).
pub struct ObjectClient {
    agent: ureq::Agent,
    tls: bool,
}

impl ObjectClient {
    pub fn new(tls: Option<ureq::tls::TlsConfig>) -> Self {
        let with_tls = tls.is_some();
        ObjectClient {
            agent: paddock_client::Builder::new()
                .tls(tls)
                .connect_timeout(Duration::from_secs(10))
                .agent(),
            tls: with_tls,
        }
    }

    /// The URL of `server`'s `ObjectServer.GetObjects`.
    pub fn url(&self, server: &str) -> String {
        objects_url(server, self.tls)
    }
}

/// Requests one fetch runs at once at most: each is its own connection, and on a machine
/// whose processor decrypts and hashes slower than the link delivers (a small CPU, an
/// emulated one) the streams share that work out over its cores.
const MAX_STREAMS: usize = 4;
/// Batches per stream: the objects are handed out in batches from one queue, so a stream
/// that drew large objects takes fewer batches and the streams end close together.
const BATCHES_PER_STREAM: usize = 4;

/// How many streams a fetch of `objects` runs on `cores`: one per core, at most
/// [`MAX_STREAMS`], and never more than there are objects.
pub fn stream_count(objects: usize, cores: usize) -> usize {
    cores.clamp(1, MAX_STREAMS).min(objects.max(1))
}

/// `objects` cut into consecutive batches for `streams` streams.
pub fn batches(objects: &[ObjectId], streams: usize) -> Vec<&[ObjectId]> {
    let per = objects
        .len()
        .div_ceil(streams.max(1) * BATCHES_PER_STREAM)
        .max(1);
    objects.chunks(per).collect()
}

/// Fetches `objects` from `server` into the cache directory `cache` (`xx/yy/<hash>`), on
/// several connections at once ([`stream_count`]) sharing one rate limit. `progress` is told
/// the bytes written so far; `vouched` is told each object verified ([`crate::vouch`]). The
/// first error ends the fetch (the other streams stop at their next object); objects already
/// renamed into place stay, as they are verified, and the failure says how many there were.
pub fn fetch(
    client: &ObjectClient,
    server: &str,
    objects: &[ObjectId],
    cache: &Path,
    rate: Option<f64>,
    progress: &AtomicU64,
    vouched: Option<&Vouched>,
) -> Result<FetchStats, FetchFailure> {
    let started = Instant::now();
    let mut stats = FetchStats {
        rate_limit: rate,
        ..FetchStats::default()
    };
    if objects.is_empty() {
        return Ok(stats);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let streams = stream_count(objects.len(), cores);
    let queue = batches(objects, streams);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let stream = Stream {
        client,
        server,
        url: client.url(server),
        cache,
        rate,
        throttle: Throttle::new(
            Limits {
                io_bytes_per_sec: rate,
                cpu_share: None,
            },
            IoMeasure::Bytes,
        ),
        progress,
        vouched,
        reserved: AtomicU64::new(0),
    };
    // Each stream: the objects and bytes it stored, and what stopped it early.
    let results: Vec<((u64, u64), Option<FetchError>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..streams)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = (0u64, 0u64);
                    let mut buf = vec![0u8; CHUNK];
                    while !failed.load(Ordering::Relaxed) {
                        let Some(batch) = queue.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        if let Err(e) = stream.batch(batch, &mut buf, &failed, &mut done) {
                            failed.store(true, Ordering::Relaxed);
                            return (done, Some(e));
                        }
                    }
                    (done, None)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    let e = FetchError::Cache(io::Error::other("a fetch stream panicked"));
                    ((0, 0), Some(e))
                })
            })
            .collect()
    });
    let mut error = None;
    for ((n, bytes), e) in results {
        stats.objects += n;
        stats.bytes += bytes;
        error = error.or(e);
    }
    // The cache is listed by name: an object renamed into place but not yet written back is,
    // after a power loss, an empty file under a good name, which the dominator would not
    // fetch again and an update would put in place. One syncfs makes the whole fetch
    // durable before it is reported, rather than an fsync for each object.
    if stats.objects > 0
        && let Err(e) = File::open(cache).and_then(|d| Ok(nix::unistd::syncfs(&d)?))
    {
        error = error.or(Some(FetchError::Cache(e)));
    }
    stats.seconds = started.elapsed().as_secs_f64();
    match error {
        None => Ok(stats),
        Some(error) => Err(FetchFailure { done: stats, error }),
    }
}

/// A fetch that stopped: why, and the objects it had stored by then (verified, kept).
#[derive(Debug)]
pub struct FetchFailure {
    pub done: FetchStats,
    pub error: FetchError,
}

/// What every stream of one fetch shares.
struct Stream<'a> {
    client: &'a ObjectClient,
    server: &'a str,
    url: String,
    cache: &'a Path,
    rate: Option<f64>,
    throttle: Throttle,
    progress: &'a AtomicU64,
    vouched: Option<&'a Vouched>,
    /// The lengths of the objects being written now, by all the streams.
    reserved: AtomicU64,
}

impl Stream<'_> {
    fn server_err(&self, message: String) -> FetchError {
        FetchError::Server {
            server: self.server.to_string(),
            message,
        }
    }

    /// One request for `objects`, each written, verified and renamed into place, counted in
    /// `done` (objects, bytes). Stops before the next object once `stop` is set.
    fn batch(
        &self,
        objects: &[ObjectId],
        buf: &mut [u8],
        stop: &AtomicBool,
        done: &mut (u64, u64),
    ) -> Result<(), FetchError> {
        let body = serde_json::json!({ "objects": objects });
        let resp = self
            .client
            .agent
            .post(&self.url)
            .send_json(&body)
            .map_err(|e| self.server_err(e.to_string()))?;
        let status = resp.status().as_u16();
        let mut reader = resp.into_body().into_reader();
        if status != 200 {
            let mut text = Vec::new();
            let _ = (&mut reader).take(64 << 10).read_to_end(&mut text);
            return Err(self.server_err(format!("{status}: {}", error_message(&text).trim())));
        }
        for id in objects {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let len = frames::read_header(&mut reader).map_err(|e| {
                self.server_err(format!("reading the length of {}: {e}", id.short()))
            })?;
            self.object(&mut reader, id, len, buf)?;
            done.0 += 1;
            done.1 += len;
        }
        Ok(())
    }

    /// One object of `len` bytes from `reader` into the cache: written to `<path>~`, its
    /// SHA-512 checked, renamed into place; the partial file removed on any error.
    fn object(
        &self,
        reader: &mut impl Read,
        id: &ObjectId,
        len: u64,
        buf: &mut [u8],
    ) -> Result<(), FetchError> {
        // The length is the server's word: more than the cache's file system holds would
        // fill the machine's disk before the hash could say the bytes are wrong. The objects
        // the other streams are writing count too, until each is done.
        let free = nix::sys::statvfs::statvfs(self.cache)
            .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
            .map_err(|e| FetchError::Cache(e.into()))?;
        let writing = Reserved::take(&self.reserved, len);
        if writing.total > free {
            return Err(self.server_err(format!(
                "object {} would be {len} bytes, more than the {free} free for the cache \
                 (with the {} the other streams are writing)",
                id.short(),
                writing.total - len
            )));
        }
        let dest = self.cache.join(id.path());
        let tmp = tilde(&dest);
        if let Some(p) = dest.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(p)
                .map_err(FetchError::Cache)?;
        }
        let mut out = File::create(&tmp).map_err(FetchError::Cache)?;
        let res: Result<(), FetchError> = (|| {
            let mut h = ObjectHasher::new();
            let mut left = len;
            while left > 0 {
                let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
                let n = match reader.read(&mut buf[..want]) {
                    Ok(0) => {
                        return Err(self.server_err(format!(
                            "the stream ended {left} bytes into object {}",
                            id.short()
                        )));
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(self.server_err(format!("reading {}: {e}", id.short())));
                    }
                };
                h.update(&buf[..n]);
                out.write_all(&buf[..n]).map_err(FetchError::Cache)?;
                left -= n as u64;
                self.progress.fetch_add(n as u64, Ordering::Relaxed);
                if self.rate.is_some() {
                    self.throttle.pace(
                        Usage {
                            bytes: n as u64,
                            ..Usage::default()
                        },
                        &|| false,
                    );
                }
            }
            if h.finish() != *id {
                return Err(FetchError::Object {
                    object: id.to_string(),
                    message: "the server sent other bytes (SHA-512 differs)".into(),
                });
            }
            let hashed = Instant::now();
            drop(out);
            fs::rename(&tmp, &dest).map_err(FetchError::Cache)?;
            if let (Some(v), Ok(m)) = (self.vouched, fs::symlink_metadata(&dest)) {
                v.vouch(Key::of_metadata(&m), *id, hashed);
            }
            Ok(())
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        res
    }
}

/// Bytes announced by the objects being written now, across the streams: taken when an
/// object starts, given back when it is done (or refused).
struct Reserved<'a> {
    on: &'a AtomicU64,
    len: u64,
    /// What is announced with this object.
    total: u64,
}

impl<'a> Reserved<'a> {
    fn take(on: &'a AtomicU64, len: u64) -> Self {
        let total = on.fetch_add(len, Ordering::SeqCst).saturating_add(len);
        Reserved { on, len, total }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.on.fetch_sub(self.len, Ordering::SeqCst);
    }
}

fn tilde(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push("~");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that claims an object is 2^62 bytes long (and then streams zeros) is refused
    /// before a byte is written: the cache's file system has not that much room.
    #[test]
    fn an_object_longer_than_the_free_space_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut req = [0u8; 4096];
            let _ = c.read(&mut req);
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\nconnection: close\r\n\r\n",
            );
            let _ = c.write_all(&frames::header(1 << 62));
            let _ = c.write_all(&[0u8; 65536]);
        });
        let cache = tempfile::tempdir().unwrap();
        let id = ObjectId::of(b"x");
        let progress = AtomicU64::new(0);
        let r = fetch(
            &ObjectClient::new(None),
            &addr.to_string(),
            &[id],
            cache.path(),
            None,
            &progress,
            None,
        );
        let e = r.expect_err("refused").error.to_string();
        assert!(
            e.contains("more than the") && e.contains("free for the cache"),
            "{e}"
        );
        assert_eq!(progress.load(Ordering::Relaxed), 0, "nothing written");
        server.join().unwrap();
    }

    #[test]
    fn streams_and_batches() {
        assert_eq!(stream_count(0, 2), 1);
        assert_eq!(stream_count(1, 8), 1);
        assert_eq!(stream_count(100, 0), 1);
        assert_eq!(stream_count(100, 2), 2);
        assert_eq!(stream_count(100, 64), MAX_STREAMS);
        let ids: Vec<ObjectId> = (0..10u8).map(|i| ObjectId::of(&[i])).collect();
        let b = batches(&ids, 2);
        assert_eq!(b.len(), 5, "10 objects for 8 batches: batches of 2");
        assert_eq!(b.concat(), ids, "every object once, in order");
        assert_eq!(batches(&ids, 1).concat(), ids);
        assert_eq!(batches(&ids[..1], 4), vec![&ids[..1]]);
    }

    #[test]
    fn rates_and_urls() {
        assert_eq!(fetch_rate(Some(1_000_000), 10.0, 5.0), Some(100_000.0));
        assert_eq!(fetch_rate(Some(1_000_000), 10.0, 50.0), Some(500_000.0));
        assert_eq!(fetch_rate(Some(1_000_000), 10.0, 100.0), None);
        assert_eq!(fetch_rate(None, 10.0, 5.0), None);
        assert_eq!(fetch_rate(Some(0), 10.0, 5.0), None);
        assert_eq!(
            objects_url("img:6971", false),
            "http://img:6971/rpc/ObjectServer.GetObjects"
        );
        assert_eq!(
            objects_url("img:6971", true),
            "https://img:6971/rpc/ObjectServer.GetObjects"
        );
        assert_eq!(
            objects_url("http://img:6971/", true),
            "http://img:6971/rpc/ObjectServer.GetObjects"
        );
    }

    #[test]
    fn link_speed_from_sysfs() {
        let d = tempfile::tempdir().unwrap();
        let iface = |name: &str, state: &str, speed: &str| {
            let p = d.path().join(name);
            fs::create_dir(&p).unwrap();
            fs::write(p.join("operstate"), state).unwrap();
            fs::write(p.join("speed"), speed).unwrap();
        };
        assert_eq!(link_speed(d.path()), None);
        iface("lo", "unknown\n", "10000\n");
        iface("eth0", "up\n", "1000\n");
        iface("eth1", "down\n", "25000\n");
        iface("veth0", "up\n", "-1\n");
        assert_eq!(link_speed(d.path()), Some(125_000_000));
    }
}
