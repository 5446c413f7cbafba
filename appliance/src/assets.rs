//! Boot assets over HTTP (`/boot/assets/…`: the discovery kernel and initrd, boot loaders):
//! opened beneath the assets directory in one step (the TFTP server's `openat2` root, so a
//! symlink leading out is refused by the kernel's own resolution), and served from memory
//! while unchanged, with single `Range` requests (iPXE and curl resume with them).
//!
//! This replaces tower-http's `ServeDir`, which read every request from disk in chunks on
//! tokio's blocking pool: with a rack fetching the same kernel at once (`bench/storm.sh`,
//! 1,000 machines) that cost one blocking read per chunk per machine. Files larger than the
//! cache takes are still streamed by `ServeDir`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use paddock_tftp::{FileCache, Root};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore, oneshot};
use tower::ServiceExt;
use tower_http::services::ServeDir;

/// Files up to 256 MiB are served from memory, 1 GiB in all.
const FILE_MAX: u64 = 256 << 20;
const TOTAL_MAX: usize = 1 << 30;

pub struct Assets {
    dir: PathBuf,
    root: Root,
    cache: Mutex<FileCache>,
    lanes: Lanes,
}

/// What a `Range` header asks of a body of `len` bytes (RFC 9110 §14).
#[derive(Debug, PartialEq, Eq)]
pub enum Range {
    /// No range, or one this server ignores (several ranges, another unit): the whole body.
    Whole,
    /// Bytes `start..=end`.
    Part(u64, u64),
    /// A range that starts past the end: 416.
    Unsatisfiable,
}

/// Reads a `Range` header: `bytes=a-b`, `bytes=a-`, `bytes=-n`; a malformed header or a
/// list of ranges is ignored (the whole body is a valid answer to any range request).
pub fn range(h: Option<&str>, len: u64) -> Range {
    let Some(spec) = h.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Range::Whole;
    };
    if spec.contains(',') {
        return Range::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Range::Whole;
    };
    let num = |s: &str| s.trim().parse::<u64>().ok();
    match (a.trim().is_empty(), num(a), num(b)) {
        // bytes=-n: the last n bytes
        (true, _, Some(n)) if n > 0 => {
            if len == 0 {
                Range::Unsatisfiable
            } else {
                Range::Part(len.saturating_sub(n), len - 1)
            }
        }
        (false, Some(start), end) if b.trim().is_empty() || end.is_some() => {
            let end = end.unwrap_or(u64::MAX);
            if end < start {
                Range::Whole
            } else if start >= len {
                Range::Unsatisfiable
            } else {
                Range::Part(start, end.min(len - 1))
            }
        }
        _ => Range::Whole,
    }
}

impl Assets {
    /// Serves `dir`, large files `lanes` at a time (0: all at once).
    pub fn open(dir: &Path, lanes: usize) -> anyhow::Result<Arc<Assets>> {
        let root = Root::open(dir)
            .map_err(|e| anyhow::anyhow!("http.assets_dir {}: {e}", dir.display()))?;
        Ok(Arc::new(Assets {
            dir: dir.to_path_buf(),
            root,
            cache: Mutex::new(FileCache::new(FILE_MAX, TOTAL_MAX)),
            lanes: Lanes::new(lanes, LANE_HOLD),
        }))
    }

    /// Opens `name` beneath the directory (two quick system calls on cached metadata, so
    /// done on the request's own task: a storm of requests would otherwise fill the blocking
    /// pool with a thread each): the file and its metadata.
    fn open_file(&self, name: &str) -> Result<(std::fs::File, std::fs::Metadata), StatusCode> {
        let rel = paddock_tftp::clean_request(name).map_err(|_| StatusCode::NOT_FOUND)?;
        let Some(file) =
            paddock_tftp::resolve(std::slice::from_ref(&self.root), &rel).map_err(|e| match e {
                paddock_tftp::ResolveError::Refused(_) => StatusCode::NOT_FOUND,
                e => {
                    tracing::error!(file = name, error = %e, "http: cannot open an asset");
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            })?
        else {
            return Err(StatusCode::NOT_FOUND);
        };
        let meta = file
            .metadata()
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        Ok((file, meta))
    }

    /// The bytes of an open file from the cache; `Ok(None)` when the cache does not take a
    /// file that large. Reads (on a cache miss) the whole file: call off the async threads.
    fn bytes(
        &self,
        mut file: std::fs::File,
        meta: &std::fs::Metadata,
    ) -> Result<Option<Bytes>, StatusCode> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if !cache.takes(meta.len()) {
            return Ok(None);
        }
        let bytes = cache.bytes(&mut file, meta).map_err(|e| {
            tracing::error!(error = %e, "http: cannot read an asset");
            StatusCode::INTERNAL_SERVER_ERROR
        })?;
        Ok(Some(Bytes::from_owner(bytes)))
    }

    /// The cached bytes of `file` without blocking: `None` unless already cached unchanged.
    fn hit(&self, meta: &std::fs::Metadata) -> Option<Bytes> {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(meta)
            .map(Bytes::from_owner)
    }
}

/// `GET|HEAD /boot/assets/{*name}`.
pub async fn serve(assets: Arc<Assets>, name: String, req: Request) -> Response {
    let (file, meta) = match assets.open_file(&name) {
        Ok(x) => x,
        Err(status) => return status.into_response(),
    };
    let found = match assets.hit(&meta) {
        Some(b) => Ok(Some(b)),
        None => {
            let a = assets.clone();
            let m = meta.clone();
            tokio::task::spawn_blocking(move || a.bytes(file, &m))
                .await
                .unwrap_or(Err(StatusCode::INTERNAL_SERVER_ERROR))
        }
    };
    let bytes = match found {
        Ok(Some(b)) => b,
        // Too large to keep in memory: streamed from disk.
        Ok(None) => {
            let mut req = req;
            *req.uri_mut() = match format!("/{name}").parse() {
                Ok(u) => u,
                Err(_) => return StatusCode::NOT_FOUND.into_response(),
            };
            return match ServeDir::new(&assets.dir)
                .with_buf_chunk_size(1 << 20)
                .oneshot(req)
                .await
            {
                Ok(r) => r.into_response(),
                Err(e) => match e {},
            };
        }
        Err(status) => return status.into_response(),
    };
    respond(req.method(), req.headers(), bytes, &meta, &assets.lanes)
}

fn respond(
    method: &Method,
    headers: &HeaderMap,
    bytes: Bytes,
    meta: &std::fs::Metadata,
    lanes: &Lanes,
) -> Response {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    let mut h = HeaderMap::new();
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(m) = meta.modified()
        && let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(m))
    {
        h.insert(header::LAST_MODIFIED, v);
    }
    let asked = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let (status, body) = match range(asked, len) {
        Range::Whole => (StatusCode::OK, bytes),
        Range::Part(start, end) => {
            let (Ok(s), Ok(e)) = (usize::try_from(start), usize::try_from(end)) else {
                return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            };
            if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")) {
                h.insert(header::CONTENT_RANGE, v);
            }
            (StatusCode::PARTIAL_CONTENT, bytes.slice(s..=e))
        }
        Range::Unsatisfiable => {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                h.insert(header::CONTENT_RANGE, v);
            }
            return (StatusCode::RANGE_NOT_SATISFIABLE, h).into_response();
        }
    };
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    if method == Method::HEAD {
        return (status, h).into_response();
    }
    (status, h, lanes.body(body)).into_response()
}

/// Bodies this large wait for a lane.
const LANE_MIN: usize = 1 << 20;
/// A laned body is handed to hyper this much at a time, so that it is polled (and keeps its
/// lane) until its last bytes are on their way.
const LANE_CHUNK: usize = 256 << 10;
/// The longest a body keeps its lane: a client slower than that (or stalled) goes on without
/// one, and the next in line starts.
const LANE_HOLD: Duration = Duration::from_secs(2);

/// Large bodies (a kernel, an initrd) sent a few at a time, in the order they were asked for.
///
/// A rack that powers on at once asks for the same kernel and initrd a thousand times: sent
/// all at once, each machine gets a thousandth of the link and every one finishes near the
/// end; sent a few at a time, machines finish one after another, the median machine boots in
/// about half the time, and the last no later (fewer flows contend for the link and the
/// CPU; `bench/storm.sh`). A lane is held at most [`LANE_HOLD`], so slow or stalled clients
/// degrade this into sending to all at once, never into a queue that waits on them.
pub struct Lanes {
    slots: Option<Arc<Semaphore>>,
    hold: Duration,
}

impl Lanes {
    /// `lanes` at once (0: no lanes, every body at once), each held at most `hold`.
    pub fn new(lanes: usize, hold: Duration) -> Lanes {
        Lanes {
            slots: (lanes > 0).then(|| Arc::new(Semaphore::new(lanes))),
            hold,
        }
    }

    /// The body for `bytes`: laned when large.
    pub fn body(&self, bytes: Bytes) -> Body {
        match &self.slots {
            Some(slots) if bytes.len() >= LANE_MIN => Body::new(Laned {
                rest: bytes,
                waiting: Some(Box::pin(slots.clone().acquire_owned())),
                done: None,
                hold: self.hold,
            }),
            _ => Body::from(bytes),
        }
    }
}

type Acquire =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send + Sync>>;

/// A body that sends nothing before it has a lane.
struct Laned {
    rest: Bytes,
    waiting: Option<Acquire>,
    /// Dropped with the body (sent, or the client gone): the lane is free again.
    done: Option<oneshot::Sender<()>>,
    hold: Duration,
}

impl http_body::Body for Laned {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(waiting) = &mut self.waiting {
            let lane = ready!(waiting.as_mut().poll(cx));
            self.waiting = None;
            // The semaphore is never closed; were it, the body would go on without a lane.
            if let Ok(lane) = lane {
                let (done, finished) = oneshot::channel::<()>();
                let hold = self.hold;
                tokio::spawn(async move {
                    let _lane = lane;
                    let _ = tokio::time::timeout(hold, finished).await;
                });
                self.done = Some(done);
            }
        }
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(LANE_CHUNK);
        let chunk = self.rest.split_to(n);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(u64::try_from(self.rest.len()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::BodyExt;

    /// The first frame of `body`, if it comes within a minute (of the paused clock).
    async fn first_frame(body: &mut Body) -> Option<Bytes> {
        tokio::time::timeout(Duration::from_secs(60), body.frame())
            .await
            .ok()
            .flatten()
            .and_then(|f| f.ok())
            .and_then(|f| f.into_data().ok())
    }

    #[tokio::test(start_paused = true)]
    async fn large_bodies_wait_for_a_lane_in_order_small_ones_never() {
        let lanes = Lanes::new(1, Duration::from_secs(2));
        let big = Bytes::from(vec![7u8; LANE_MIN + 1]);
        let mut a = lanes.body(big.clone());
        let mut b = lanes.body(big.clone());
        let mut c = lanes.body(big.clone());
        assert_eq!(first_frame(&mut a).await.map(|f| f.len()), Some(LANE_CHUNK));
        // A small body is sent at once, lane or none.
        let mut small = lanes.body(Bytes::from_static(b"#!ipxe\n"));
        assert_eq!(
            first_frame(&mut small).await.as_deref(),
            Some(&b"#!ipxe\n"[..])
        );
        // B waits while A sends, then goes as soon as A is done, before C.
        let mut waiting = Box::pin(first_frame(&mut b));
        tokio::time::timeout(Duration::from_secs(1), &mut waiting)
            .await
            .expect_err("b must wait for a's lane");
        drop(a);
        assert!(waiting.await.is_some());
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), first_frame(&mut c))
                .await
                .ok(),
            None,
            "c waits for b"
        );
        // The whole body comes, in chunks.
        let mut got = LANE_CHUNK;
        while let Some(f) = b.frame().await {
            got += f.unwrap().into_data().unwrap().len();
        }
        assert_eq!(got, big.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_is_held_no_longer_than_its_hold() {
        let lanes = Lanes::new(1, Duration::from_secs(2));
        let big = Bytes::from(vec![7u8; LANE_MIN]);
        let mut stalled = lanes.body(big.clone());
        let mut next = lanes.body(big);
        assert!(first_frame(&mut stalled).await.is_some());
        // The stalled client keeps its body (never read on), yet the next goes after 2 s.
        let t0 = tokio::time::Instant::now();
        assert!(first_frame(&mut next).await.is_some());
        assert_eq!(t0.elapsed().as_secs(), 2);
        drop(stalled);
    }

    #[tokio::test(start_paused = true)]
    async fn without_lanes_every_body_goes_at_once() {
        let lanes = Lanes::new(0, Duration::from_secs(2));
        let big = Bytes::from(vec![7u8; LANE_MIN * 2]);
        let mut a = lanes.body(big.clone());
        let mut b = lanes.body(big.clone());
        assert_eq!(first_frame(&mut a).await.map(|f| f.len()), Some(big.len()));
        assert_eq!(first_frame(&mut b).await.map(|f| f.len()), Some(big.len()));
    }

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        let cases: &[(Option<&str>, u64, Range)] = &[
            (None, 100, Range::Whole),
            (Some("bytes=0-9"), 100, Range::Part(0, 9)),
            (Some("bytes=90-"), 100, Range::Part(90, 99)),
            (Some("bytes=90-500"), 100, Range::Part(90, 99)),
            (Some("bytes=-10"), 100, Range::Part(90, 99)),
            (Some("bytes=-500"), 100, Range::Part(0, 99)),
            (Some("bytes=100-"), 100, Range::Unsatisfiable),
            (Some("bytes=0-"), 0, Range::Unsatisfiable),
            (Some("bytes=-0"), 100, Range::Whole),
            (Some("bytes=9-0"), 100, Range::Whole),
            (Some("bytes=0-1,5-6"), 100, Range::Whole),
            (Some("items=0-1"), 100, Range::Whole),
            (Some("bytes=x-1"), 100, Range::Whole),
            (Some("bytes=1-x"), 100, Range::Whole),
        ];
        for (h, len, want) in cases {
            assert_eq!(&range(*h, *len), want, "{h:?} of {len}");
        }
    }
}
