//! Boot assets over HTTP (`/boot/assets/…`: the discovery kernel and initrd, boot loaders):
//! opened beneath the assets directory in one step (the TFTP server's `openat2` root, so a
//! symlink leading out is refused by the kernel's own resolution), and served from memory
//! while unchanged, with single `Range` requests (iPXE and curl resume with them).
//!
//! This replaces tower-http's `ServeDir`, which read every request from disk in chunks on
//! tokio's blocking pool: with a rack fetching the same kernel at once (`bench/storm.sh`,
//! 1,000 machines) that cost one blocking read per chunk per machine. Files larger than the
//! cache takes are still streamed by `ServeDir`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use paddock_tftp::{FileCache, Root};
use tower::ServiceExt;
use tower_http::services::ServeDir;

/// Files up to 256 MiB are served from memory, 1 GiB in all.
const FILE_MAX: u64 = 256 << 20;
const TOTAL_MAX: usize = 1 << 30;

pub struct Assets {
    dir: PathBuf,
    root: Root,
    cache: Mutex<FileCache>,
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
    pub fn open(dir: &Path) -> anyhow::Result<Arc<Assets>> {
        let root = Root::open(dir)
            .map_err(|e| anyhow::anyhow!("http.assets_dir {}: {e}", dir.display()))?;
        Ok(Arc::new(Assets {
            dir: dir.to_path_buf(),
            root,
            cache: Mutex::new(FileCache::new(FILE_MAX, TOTAL_MAX)),
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
    respond(req.method(), req.headers(), bytes, &meta)
}

fn respond(
    method: &Method,
    headers: &HeaderMap,
    bytes: Bytes,
    meta: &std::fs::Metadata,
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
    (status, h, Body::from(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

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
