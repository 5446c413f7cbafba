//! subd's RPC: one HTTP route per `Service.Method` under `/rpc/` (as the image server's), so
//! that certificates grant methods by glob (Dominator's model).
//!
//! [`serve`] runs over mutual TLS ([`paddock_security::tls::serve`]): the caller's
//! certificate must chain to the CA (else the handshake fails), and [`authorize`], one layer
//! in front of every route, maps `/rpc/Subd.<Method>` to the method `Subd.<Method>` and lets
//! the call through only if the certificate's permitted methods match it (a dominator's
//! `Subd.*`); a denied call is a 403 whose message names the method and the caller
//! (`access to method Subd.Update denied to "alice"`). `/healthz` is open to every verified
//! client. With `--insecure` (Dominator's insecure mode) it serves plain HTTP and every
//! method is open to anyone who reaches the port.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /rpc/Subd.Poll` | [`PollRequest`] (empty or `null` = defaults) | [`crate::service::PollResponse`]: status, and the tree and object cache when the generation differs from the caller's and it is not a short poll; JSON, or the binary answer ([`poll_binary`]) to a caller whose `Accept` names [`POLL_MEDIA_TYPE`] |
//! | `POST /rpc/Subd.Fetch` | [`FetchRequest`] | [`crate::service::FetchReply`] |
//! | `POST /rpc/Subd.Update` | [`paddock_image::UpdateRequest`] | [`crate::service::UpdateReport`] |
//! | `POST /rpc/Subd.Cleanup` | [`CleanupRequest`] | [`crate::service::CleanupReply`] |
//! | `POST /rpc/Subd.GetFiles` | `{"paths": [...]}` | each file as an 8-byte big-endian length then its bytes, in order; a path that is not a regular file fails the request before anything is sent |
//! | `GET`/`POST /rpc/Subd.GetConfiguration` | — | [`Configuration`] |
//! | `POST /rpc/Subd.SetConfiguration` | [`Configuration`] | the configuration now in force |
//! | `POST /rpc/Subd.BoostScanLimit` | — | lifts the scan limits until the next scan ends |
//! | `GET /healthz` | — | 200 once the first scan is done, else 503 |
//!
//! The caller's identity for the client lock is the `x-paddock-client` header, else its
//! certificate's user, else its IP address. Errors are `{"error": {"message"}}`: 400 for a
//! bad request, 403 for a method the certificate does not grant, 409 for the lock or another
//! Fetch/Update/Cleanup in progress, 503 before the first scan, 502 when the object server
//! failed.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::header::{CONNECTION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use paddock_image::UpdateRequest;
use paddock_security::tls::{self, Peer};
use paddock_wire::frames;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::service::{CleanupRequest, Configuration, FetchRequest, PollRequest, Subd, SubdError};

/// The header naming the caller for the client lock.
pub const CLIENT_HEADER: &str = "x-paddock-client";
/// Largest request body (an Update for a whole image).
pub const MAX_BODY: usize = 1 << 30;

pub use poll_binary::POLL_MEDIA_TYPE;

/// The caller's identity for the client lock (header, else certificate, else IP address).
pub struct Client(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        if let Some(v) = parts
            .headers
            .get(CLIENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.trim().is_empty())
        {
            return Ok(Client(v.trim().chars().take(200).collect()));
        }
        if let Some(id) = parts
            .extensions
            .get::<Peer>()
            .and_then(|p| p.identity.as_ref())
        {
            return Ok(Client(id.user.clone()));
        }
        Ok(Client(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip().to_string())
                .unwrap_or_else(|| "unknown".into()),
        ))
    }
}

/// The error answer (`{"error": {"message"}}` with a status), shared by every API.
use paddock_wire::ApiError;

impl From<SubdError> for ApiError {
    /// subd's errors as answers: this is the one place they get a status.
    fn from(e: SubdError) -> Self {
        let status = match e {
            SubdError::Locked(_) | SubdError::Busy(_) => 409,
            SubdError::NotReady => 503,
            SubdError::InvalidRequest(_) | SubdError::Configuration(_) | SubdError::Bad(_) => 400,
            SubdError::Fetch(_) | SubdError::Failed(_) => 502,
        };
        ApiError::new(status, e.to_string())
    }
}

type ApiResult = Result<Response, ApiError>;

fn parse<T: DeserializeOwned + Default>(body: &[u8], what: &str) -> Result<T, ApiError> {
    if body.trim_ascii().is_empty() || body.trim_ascii() == b"null" {
        return Ok(T::default());
    }
    parse_required(body, what)
}

fn parse_required<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

fn json_response(bytes: Vec<u8>) -> Response {
    ([("content-type", "application/json")], bytes).into_response()
}

/// Runs blocking work and serialises its answer off the async threads.
async fn blocking<T: serde::Serialize + Send + 'static>(
    f: impl FnOnce() -> Result<T, SubdError> + Send + 'static,
) -> ApiResult {
    let r = tokio::task::spawn_blocking(move || {
        f().map(|v| serde_json::to_vec(&v).map_err(|e| SubdError::Failed(e.to_string())))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request's task failed: {e}")))?;
    Ok(json_response(r??))
}

pub fn router(subd: Arc<Subd>) -> Router {
    Router::new()
        .route("/rpc/Subd.Poll", post(poll))
        .route("/rpc/Subd.Fetch", post(fetch))
        .route("/rpc/Subd.Update", post(update))
        .route("/rpc/Subd.Cleanup", post(cleanup))
        .route("/rpc/Subd.GetFiles", post(get_files))
        .route(
            "/rpc/Subd.GetConfiguration",
            get(get_configuration).post(get_configuration),
        )
        .route("/rpc/Subd.SetConfiguration", post(set_configuration))
        .route("/rpc/Subd.BoostScanLimit", post(boost))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(subd)
}

/// Serves the router on `listener` until the task is dropped: over TLS with every method
/// checked against the caller's certificate ([`authorize`]), or, without `config`
/// (`--insecure`), plain HTTP with every method open.
pub async fn serve(
    listener: tokio::net::TcpListener,
    subd: Arc<Subd>,
    config: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    let app = match config {
        Some(_) => router(subd).layer(middleware::from_fn(authorize)),
        None => router(subd),
    };
    tls::serve(listener, config, app, tls::Limits::default()).await
}

/// The method a request's path names: `/rpc/Subd.Update` → `Subd.Update`; other paths
/// (`/healthz`) name none.
pub fn method_of(path: &str) -> Option<&str> {
    path.strip_prefix("/rpc/")
}

/// Whether `peer` may call `method`; the refusal (403) names the method and the caller.
pub fn permit(peer: Option<&Peer>, method: &str) -> Result<(), ApiError> {
    let deny = |who: &str| {
        let named: String = method.chars().take(100).collect();
        ApiError::new(403, format!("access to method {named} denied to {who}"))
    };
    let Some(peer) = peer else {
        return Err(deny("an unknown caller"));
    };
    if let Some(e) = &peer.certificate_error {
        return Err(deny(&format!("a certificate that does not parse ({e})")));
    }
    match &peer.identity {
        Some(id) if id.may(method) => Ok(()),
        Some(id) => Err(deny(&format!("{:?}", id.user))),
        None => Err(deny("a caller without a certificate")),
    }
}

/// The layer in front of every route over TLS: a `/rpc/` call goes through only if the
/// caller's certificate grants its method; other paths (`/healthz`) are open to every
/// verified client. A denied call is answered before its body is read, and its connection
/// closed.
pub async fn authorize(req: Request, next: Next) -> Response {
    if let Some(method) = method_of(req.uri().path())
        && let Err(e) = permit(req.extensions().get::<Peer>(), method)
    {
        let who = req.extensions().get::<Peer>().map(|p| p.addr);
        tracing::warn!(peer = ?who, "{}", e.message);
        // The body is left unread, so the connection cannot carry another call: saying so
        // keeps the client from sending its next one on a connection being closed.
        let mut denied = e.into_response();
        denied
            .headers_mut()
            .insert(CONNECTION, axum::http::HeaderValue::from_static("close"));
        return denied;
    }
    next.run(req).await
}

async fn poll(
    State(s): State<Arc<Subd>>,
    Client(c): Client,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: PollRequest = parse(&body, "Subd.Poll")?;
    if !poll_binary::accepted(&headers) {
        return blocking(move || s.poll(&c, &req)).await;
    }
    let bytes = tokio::task::spawn_blocking(move || {
        let (status, scan) = s.poll_status(&c, &req)?;
        poll_binary::encode(&status, scan.as_deref().map(|s| (&s.fs, &s.objects)))
            .map_err(|e| SubdError::Failed(e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request's task failed: {e}")))??;
    Ok(([(CONTENT_TYPE, POLL_MEDIA_TYPE)], bytes).into_response())
}

async fn fetch(State(s): State<Arc<Subd>>, Client(c): Client, body: Bytes) -> ApiResult {
    let req: FetchRequest = parse_required(&body, "Subd.Fetch")?;
    blocking(move || s.fetch(&c, req)).await
}

async fn update(State(s): State<Arc<Subd>>, Client(c): Client, body: Bytes) -> ApiResult {
    let req: UpdateRequest = parse_required(&body, "Subd.Update")?;
    blocking(move || s.update(&c, req)).await
}

async fn cleanup(State(s): State<Arc<Subd>>, Client(c): Client, body: Bytes) -> ApiResult {
    let req: CleanupRequest = parse(&body, "Subd.Cleanup")?;
    blocking(move || s.cleanup(&c, &req)).await
}

async fn get_configuration(State(s): State<Arc<Subd>>) -> ApiResult {
    Ok(axum::Json(s.configuration()).into_response())
}

async fn set_configuration(State(s): State<Arc<Subd>>, body: Bytes) -> ApiResult {
    let c: Configuration = parse_required(&body, "Subd.SetConfiguration")?;
    Ok(axum::Json(s.set_configuration(c)?).into_response())
}

async fn boost(State(s): State<Arc<Subd>>) -> ApiResult {
    s.boost();
    Ok(axum::Json(json!({"boosted": true})).into_response())
}

async fn healthz(State(s): State<Arc<Subd>>) -> Response {
    if s.scanner().scan_count() > 0 {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no scan yet\n").into_response()
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct FilesRequest {
    paths: Vec<String>,
}

async fn get_files(State(s): State<Arc<Subd>>, body: Bytes) -> ApiResult {
    let req: FilesRequest = parse_required(&body, "Subd.GetFiles")?;
    let files = {
        let s = s.clone();
        tokio::task::spawn_blocking(move || s.files_for(&req.paths))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??
    };
    let body = frames::body(
        files,
        |(_, host): &(String, std::path::PathBuf)| std::fs::File::open(host),
        |(name, _): &(String, std::path::PathBuf)| name.clone(),
    );
    Response::builder()
        .header("content-type", "application/octet-stream")
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// The binary Poll answer, for controllers: the same answer as the JSON one, with the tree
/// and the object cache in a compact form (object ids as 64 raw bytes, numbers as varints),
/// about half the JSON's size and a tenth of its decoding time. `curl` and anything else
/// that does not ask for it get JSON.
///
/// The body is postcard 1 (its documented wire format: unsigned integers as LEB128
/// varints, signed ones zigzagged first, `Option` as a 0/1 byte before the value, a
/// sequence or byte string as its varint length before its elements), in this order:
///
/// ```text
/// status   bytes: the answer as JSON without file_system and object_cache
/// scan     Option<(tree, cache)>: present when file_system_follows
///   tree   seq<(u64 inode number, inode)> in increasing number order,
///          seq<(string path, u64 inode number)> in increasing path order
///   inode  enum: 0 directory(mode u32, uid u32, gid u32)
///                1 regular(mode, uid, gid, mtime sec i64, mtime nsec u32, size u64,
///                          Option<object id: bytes, 64 long>)
///                2 symlink(uid, gid, target string)
///                3 special(kind u8: 0 char, 1 block, 2 fifo, mode, uid, gid,
///                          mtime sec i64, mtime nsec u32, rdev u64)
///   cache  seq<object id> in increasing order
/// ```
///
/// The status stays JSON: it is small, and JSON's defaults keep old and new subds and
/// controllers compatible as fields come and go. The version is in the media type.
pub mod poll_binary {
    use std::borrow::Cow;
    use std::collections::{BTreeMap, BTreeSet};
    use std::fmt;

    use axum::http::HeaderMap;
    use axum::http::header::ACCEPT;
    use paddock_image::{FileSystem, Inode, Mtime, ObjectId, SpecialKind};
    use serde::ser::SerializeTuple;
    use serde::{Deserialize, Serialize, Serializer};

    use crate::service::PollResponse;

    /// The media type a controller names in `Accept` to get the binary answer, and the
    /// answer's `Content-Type`.
    pub const POLL_MEDIA_TYPE: &str = "application/vnd.paddock.poll.v1";

    /// Bytes that are not a binary Poll answer.
    #[derive(Debug, thiserror::Error, PartialEq, Eq)]
    #[error("a bad binary Poll answer: {0}")]
    pub struct BadAnswer(pub String);

    /// True when the request's `Accept` names [`POLL_MEDIA_TYPE`] (with a non-zero `q`).
    pub fn accepted(headers: &HeaderMap) -> bool {
        headers
            .get_all(ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|range| {
                let mut parts = range.split(';');
                let media = parts.next().unwrap_or("").trim();
                media.eq_ignore_ascii_case(POLL_MEDIA_TYPE)
                    && !parts.any(|p| {
                        p.trim()
                            .strip_prefix("q=")
                            .and_then(|q| q.trim().parse::<f32>().ok())
                            .is_some_and(|q| q <= 0.0)
                    })
            })
    }

    /// The whole answer: [`encode_status`] then [`encode_scan`]. `status`'s
    /// `file_system` and `object_cache` are not sent (the scan is).
    pub fn encode(
        status: &PollResponse,
        scan: Option<(&FileSystem, &BTreeSet<ObjectId>)>,
    ) -> Result<Vec<u8>, BadAnswer> {
        let mut out = encode_status(status)?;
        out.extend_from_slice(&encode_scan(scan)?);
        Ok(out)
    }

    /// The answer's first part: the status. (A simulator that sends one tree many times
    /// encodes [`encode_scan`] once and puts a fresh status before it.)
    pub fn encode_status(status: &PollResponse) -> Result<Vec<u8>, BadAnswer> {
        let json = if status.file_system.is_some() || status.object_cache.is_some() {
            let mut bare = status.clone();
            bare.file_system = None;
            bare.object_cache = None;
            serde_json::to_vec(&bare)
        } else {
            serde_json::to_vec(status)
        }
        .map_err(|e| BadAnswer(e.to_string()))?;
        postcard::to_allocvec(&Raw(&json)).map_err(|e| BadAnswer(e.to_string()))
    }

    /// The answer's second part: the tree and the object cache, if they follow.
    pub fn encode_scan(
        scan: Option<(&FileSystem, &BTreeSet<ObjectId>)>,
    ) -> Result<Vec<u8>, BadAnswer> {
        postcard::to_allocvec(&scan.map(|(fs, cache)| (TreeOut(fs), CacheOut(cache))))
            .map_err(|e| BadAnswer(e.to_string()))
    }

    /// Reads a binary answer; anything but exactly one well-formed answer is an error.
    pub fn decode(bytes: &[u8]) -> Result<PollResponse, BadAnswer> {
        let bad = |e: postcard::Error| BadAnswer(format!("{e} ({} bytes)", bytes.len()));
        let (answer, rest) = postcard::take_from_bytes::<AnswerIn<'_>>(bytes).map_err(bad)?;
        if !rest.is_empty() {
            return Err(BadAnswer(format!("{} bytes after the answer", rest.len())));
        }
        let mut r: PollResponse = serde_json::from_slice(answer.status)
            .map_err(|e| BadAnswer(format!("the status: {e}")))?;
        r.file_system = None;
        r.object_cache = None;
        if let Some((tree, cache)) = answer.scan {
            r.file_system = Some(tree.into_tree()?);
            let cache = cache
                .into_iter()
                .map(|i| i.id().map(|o| (o, ())))
                .collect::<Result<Vec<_>, _>>()?;
            r.object_cache = Some(increasing(cache, "object cache")?.into_keys().collect());
        }
        Ok(r)
    }

    /// A map from pairs that must come in strictly increasing key order (as encoded).
    fn increasing<K: Ord + fmt::Debug, V>(
        pairs: impl IntoIterator<Item = (K, V)>,
        what: &str,
    ) -> Result<BTreeMap<K, V>, BadAnswer> {
        let pairs: Vec<(K, V)> = pairs.into_iter().collect();
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 >= w[1].0) {
            return Err(BadAnswer(format!(
                "{what}: {:?} after {:?} (not in increasing order)",
                w[1].0, w[0].0
            )));
        }
        // Sorted input: the map is built in one pass.
        Ok(pairs.into_iter().collect())
    }

    /// Bytes written as a postcard byte string (length, then the bytes).
    struct Raw<'a>(&'a [u8]);

    impl Serialize for Raw<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    /// An object id as 64 raw bytes.
    #[derive(Clone, Copy)]
    struct Id(ObjectId);

    impl Serialize for Id {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0.0)
        }
    }

    /// An object id as read: bytes whose length is checked by [`IdIn::id`].
    #[derive(Deserialize)]
    #[serde(transparent)]
    struct IdIn<'a>(#[serde(borrow)] &'a [u8]);

    impl IdIn<'_> {
        fn id(self) -> Result<ObjectId, BadAnswer> {
            <[u8; 64]>::try_from(self.0)
                .map(ObjectId)
                .map_err(|_| BadAnswer(format!("an object id of {} bytes, not 64", self.0.len())))
        }
    }

    /// The answer as read: the status's JSON and the scan, borrowing from the body.
    #[derive(Deserialize)]
    struct AnswerIn<'a> {
        #[serde(borrow)]
        status: &'a [u8],
        #[serde(borrow)]
        scan: Option<(TreeIn<'a>, Vec<IdIn<'a>>)>,
    }

    /// An inode as it travels (its own enum, so the JSON form of [`Inode`] may change
    /// without changing this one); `O` is the object id as written or as read.
    #[derive(Serialize, Deserialize)]
    enum WireInode<'a, O> {
        Directory {
            mode: u32,
            uid: u32,
            gid: u32,
        },
        Regular {
            mode: u32,
            uid: u32,
            gid: u32,
            sec: i64,
            nsec: u32,
            size: u64,
            object: Option<O>,
        },
        Symlink {
            uid: u32,
            gid: u32,
            #[serde(borrow)]
            target: Cow<'a, str>,
        },
        Special {
            kind: u8,
            mode: u32,
            uid: u32,
            gid: u32,
            sec: i64,
            nsec: u32,
            rdev: u64,
        },
    }

    impl<'a> From<&'a Inode> for WireInode<'a, Id> {
        fn from(i: &'a Inode) -> Self {
            match *i {
                Inode::Directory { mode, uid, gid } => WireInode::Directory { mode, uid, gid },
                Inode::Regular {
                    mode,
                    uid,
                    gid,
                    mtime,
                    size,
                    object,
                } => WireInode::Regular {
                    mode,
                    uid,
                    gid,
                    sec: mtime.sec,
                    nsec: mtime.nsec,
                    size,
                    object: object.map(Id),
                },
                Inode::Symlink {
                    uid,
                    gid,
                    ref target,
                } => WireInode::Symlink {
                    uid,
                    gid,
                    target: Cow::Borrowed(target),
                },
                Inode::Special {
                    special,
                    mode,
                    uid,
                    gid,
                    mtime,
                    rdev,
                } => WireInode::Special {
                    kind: match special {
                        SpecialKind::Char => 0,
                        SpecialKind::Block => 1,
                        SpecialKind::Fifo => 2,
                    },
                    mode,
                    uid,
                    gid,
                    sec: mtime.sec,
                    nsec: mtime.nsec,
                    rdev,
                },
            }
        }
    }

    impl WireInode<'_, IdIn<'_>> {
        fn into_inode(self) -> Result<Inode, BadAnswer> {
            Ok(match self {
                WireInode::Directory { mode, uid, gid } => Inode::Directory { mode, uid, gid },
                WireInode::Regular {
                    mode,
                    uid,
                    gid,
                    sec,
                    nsec,
                    size,
                    object,
                } => Inode::Regular {
                    mode,
                    uid,
                    gid,
                    mtime: Mtime { sec, nsec },
                    size,
                    object: object.map(IdIn::id).transpose()?,
                },
                WireInode::Symlink { uid, gid, target } => Inode::Symlink {
                    uid,
                    gid,
                    target: target.into_owned(),
                },
                WireInode::Special {
                    kind,
                    mode,
                    uid,
                    gid,
                    sec,
                    nsec,
                    rdev,
                } => Inode::Special {
                    special: match kind {
                        0 => SpecialKind::Char,
                        1 => SpecialKind::Block,
                        2 => SpecialKind::Fifo,
                        k => return Err(BadAnswer(format!("special file kind {k}"))),
                    },
                    mode,
                    uid,
                    gid,
                    mtime: Mtime { sec, nsec },
                    rdev,
                },
            })
        }
    }

    /// A tree written from where it is (no copy).
    struct TreeOut<'a>(&'a FileSystem);

    impl Serialize for TreeOut<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut t = s.serialize_tuple(2)?;
            t.serialize_element(&InodesOut(&self.0.inodes))?;
            t.serialize_element(&self.0.paths)?;
            t.end()
        }
    }

    struct InodesOut<'a>(&'a BTreeMap<u64, Inode>);

    impl Serialize for InodesOut<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(|(n, i)| (n, WireInode::from(i))))
        }
    }

    struct CacheOut<'a>(&'a BTreeSet<ObjectId>);

    impl Serialize for CacheOut<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(|o| Id(*o)))
        }
    }

    #[derive(Deserialize)]
    struct TreeIn<'a> {
        #[serde(borrow)]
        inodes: Vec<(u64, WireInode<'a, IdIn<'a>>)>,
        #[serde(borrow)]
        paths: Vec<(&'a str, u64)>,
    }

    impl TreeIn<'_> {
        fn into_tree(self) -> Result<FileSystem, BadAnswer> {
            let mut inodes = Vec::with_capacity(self.inodes.len());
            for (n, i) in self.inodes {
                inodes.push((n, i.into_inode()?));
            }
            Ok(FileSystem {
                inodes: increasing(inodes, "inodes")?,
                paths: increasing(
                    self.paths.into_iter().map(|(p, n)| (p.to_string(), n)),
                    "paths",
                )?,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use axum::http::HeaderValue;
    use axum::http::header::ACCEPT;
    use paddock_image::{FileSystem, Inode, Mtime, ObjectId, SpecialKind};

    use super::poll_binary::{self, BadAnswer};
    use super::*;
    use crate::service::PollResponse;

    /// A tree with one of every kind of inode, a hard link and a file without content.
    fn tree() -> FileSystem {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        let mtime = Mtime {
            sec: -5,
            nsec: 999_999_999,
        };
        fs.insert(
            "/etc",
            Inode::Directory {
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        fs.insert(
            "/etc/motd",
            Inode::Regular {
                mode: 0o644,
                uid: 1000,
                gid: 100,
                mtime,
                size: 6,
                object: Some(ObjectId::of(b"hello\n")),
            },
        )
        .unwrap();
        fs.link("/etc/motd.link", "/etc/motd").unwrap();
        fs.insert(
            "/etc/empty",
            Inode::Regular {
                mode: 0o600,
                uid: 0,
                gid: 0,
                mtime,
                size: 0,
                object: None,
            },
        )
        .unwrap();
        fs.insert(
            "/etc/ß→link",
            Inode::Symlink {
                uid: 0,
                gid: 0,
                target: "motd".into(),
            },
        )
        .unwrap();
        for (p, special) in [
            ("/null", SpecialKind::Char),
            ("/sda", SpecialKind::Block),
            ("/fifo", SpecialKind::Fifo),
        ] {
            fs.insert(
                p,
                Inode::Special {
                    special,
                    mode: 0o666,
                    uid: 0,
                    gid: u32::MAX,
                    mtime,
                    rdev: u64::MAX,
                },
            )
            .unwrap();
        }
        fs
    }

    fn full_answer() -> PollResponse {
        PollResponse {
            generation: 7,
            scan_count: 9,
            start_time_ms: -1,
            free_space: Some(1 << 40),
            file_system_follows: true,
            last_fetch_error: Some("a reason".into()),
            file_system: Some(tree()),
            object_cache: Some(BTreeSet::from([ObjectId::of(b"a"), ObjectId::of(b"b")])),
            ..PollResponse::default()
        }
    }

    fn encode(r: &PollResponse) -> Vec<u8> {
        poll_binary::encode(r, r.file_system.as_ref().zip(r.object_cache.as_ref())).unwrap()
    }

    #[test]
    fn the_binary_answer_round_trips_and_is_smaller_than_json() {
        let full = full_answer();
        let bytes = encode(&full);
        assert_eq!(poll_binary::decode(&bytes).unwrap(), full);
        let json = serde_json::to_vec(&full).unwrap();
        assert!(
            bytes.len() < json.len(),
            "{} vs {}",
            bytes.len(),
            json.len()
        );
        // A status-only answer.
        let short = PollResponse {
            generation: 7,
            scan_count: 10,
            ..PollResponse::default()
        };
        assert_eq!(poll_binary::decode(&encode(&short)).unwrap(), short);
        // The two parts, encoded apart, make the same answer.
        let mut parts = poll_binary::encode_status(&full).unwrap();
        parts.extend(
            poll_binary::encode_scan(full.file_system.as_ref().zip(full.object_cache.as_ref()))
                .unwrap(),
        );
        assert_eq!(parts, bytes);
    }

    #[test]
    fn a_truncated_or_garbled_answer_is_an_error_not_a_panic() {
        let bytes = encode(&full_answer());
        for n in 0..bytes.len() {
            assert!(poll_binary::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(
            poll_binary::decode(&longer)
                .unwrap_err()
                .0
                .contains("after the answer")
        );
        // Every single byte changed: an error or another answer, never a panic.
        for i in 0..bytes.len() {
            for x in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] = x;
                let _ = poll_binary::decode(&b);
            }
        }
        // Lengths far beyond the body.
        assert!(poll_binary::decode(&[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(poll_binary::decode(&[0x80; 20]).is_err());
        assert!(poll_binary::decode(b"{\"generation\": 1}").is_err());
    }

    #[test]
    fn out_of_order_trees_and_bad_ids_are_refused() {
        // Paths in the wrong order (as a hand-made encoder might send them).
        let mut status = poll_binary::encode_status(&PollResponse::default()).unwrap();
        let scan = poll_binary::encode_scan(Some((&tree(), &BTreeSet::new()))).unwrap();
        let motd = scan.windows(9).position(|w| w == b"/etc/motd").unwrap();
        let mut swapped = scan.clone();
        // "/etc/motd" → "/etc/mott" sorts after "/etc/motd.link".
        swapped[motd + 8] = b't';
        status.extend(swapped);
        let e = poll_binary::decode(&status).unwrap_err();
        assert!(e.0.contains("not in increasing order"), "{e}");
        // An object id of 63 bytes.
        let mut b = poll_binary::encode_status(&PollResponse::default()).unwrap();
        b.extend([1, 0, 0, 1]); // a scan: no inodes, no paths, one cache entry …
        b.push(63);
        b.extend([0u8; 63]);
        assert!(matches!(poll_binary::decode(&b), Err(BadAnswer(m)) if m.contains("64")));
    }

    #[test]
    fn only_a_caller_that_names_the_media_type_gets_binary() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(ACCEPT, HeaderValue::from_str(v).unwrap());
            poll_binary::accepted(&h)
        };
        assert!(!poll_binary::accepted(&HeaderMap::new()), "curl: JSON");
        assert!(!with("*/*"));
        assert!(!with("application/json"));
        assert!(with(POLL_MEDIA_TYPE));
        assert!(with(&format!("application/json;q=0.5, {POLL_MEDIA_TYPE}")));
        assert!(with(&POLL_MEDIA_TYPE.to_uppercase()));
        assert!(!with(&format!("{POLL_MEDIA_TYPE}; q=0")));
    }

    #[test]
    fn a_method_goes_through_only_if_the_certificate_grants_it() {
        use paddock_security::{Identity, Permissions, Proof};

        use super::{Peer, method_of, permit};
        assert_eq!(method_of("/rpc/Subd.Update"), Some("Subd.Update"));
        assert_eq!(method_of("/healthz"), None);
        let peer = |methods: &[&str], error: Option<&str>| Peer {
            addr: "192.0.2.1:1".parse().unwrap(),
            tls: true,
            identity: Some(std::sync::Arc::new(Identity {
                user: "alice".into(),
                methods: Permissions::new(methods).unwrap(),
                groups: Vec::new(),
                proof: Proof::Certificate,
            })),
            certificate_error: error.map(String::from),
        };
        let denied = |p: Option<&Peer>, m: &str| permit(p, m).unwrap_err().message;
        let dominator = peer(&["Subd.*"], None);
        assert!(permit(Some(&dominator), "Subd.Update").is_ok());
        let watcher = peer(&["Subd.Poll"], None);
        assert!(permit(Some(&watcher), "Subd.Poll").is_ok());
        let e = permit(Some(&watcher), "Subd.Update").unwrap_err();
        assert_eq!(e.status, 403);
        assert_eq!(
            e.message,
            r#"access to method Subd.Update denied to "alice""#
        );
        // A prefix of a longer name is not the name.
        assert!(permit(Some(&watcher), "Subd.PollX").is_err());
        let broken = peer(&["Subd.*"], Some("bad extension"));
        assert!(denied(Some(&broken), "Subd.Poll").contains("does not parse (bad extension)"));
        let anonymous = Peer {
            identity: None,
            ..watcher.clone()
        };
        assert!(denied(Some(&anonymous), "Subd.Poll").ends_with("a caller without a certificate"));
        assert!(denied(None, "Subd.Poll").ends_with("an unknown caller"));
        // The message names at most 100 characters of a long name; the check sees all of it.
        let long = format!("Subd.{}", "x".repeat(300));
        assert!(denied(Some(&watcher), &long).len() < 150);
    }
}
