//! subd's RPC over HTTP (`POST /rpc/Subd.*`, JSON bodies, errors in the
//! `{"error": {"message"}}` envelope; Poll answers in subd's binary form,
//! [`paddock_subd_proto::poll_binary`]).
//!
//! One async HTTP/1.1 client keeps a connection per sub alive between calls (a sub is
//! polled every few seconds; a new TCP connection per poll cost more than the poll, and
//! left thousands of sockets in TIME_WAIT). The herd's slots bound how many calls run at
//! once; the connections live as long as their sub is called within [`IDLE_TIMEOUT`].
//!
//! Over TLS ([`HttpSubRpc::with_tls`]) the calls go to `https://ADDR/rpc/Subd.<Method>`:
//! the sub is verified against the CA under its address (an IP address SAN in its
//! certificate) and the dominator presents its own certificate, whose permitted methods
//! subd checks (`Subd.*`). Without it ([`HttpSubRpc::new`], for subs run `--insecure`) they
//! are plain `http://`. A client never mixes the two: an address naming the other scheme
//! is refused.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use paddock_image::{ObjectId, UpdateRequest};
use paddock_subd_proto::poll_binary::{self, POLL_MEDIA_TYPE};
use paddock_subd_proto::{
    CleanupReply, CleanupRequest, FetchReply, FetchRequest, PollRequest, PollResponse, UpdateReport,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::herd::{Polled, RpcError, SubRpc};

/// The header subd's client lock names its caller by.
const CLIENT_HEADER: &str = "x-paddock-client";
/// Largest answer read (a poll's tree is the largest; the minbase tree is under 1 MiB).
const MAX_ANSWER: usize = 1 << 30;
/// Answers larger than this are decoded on the blocking pool, not on the async threads.
const DECODE_INLINE: usize = 64 << 10;
/// Each connection's read buffer.
const READ_BUFFER: usize = 8 << 10;
/// A connection unused this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Clone)]
pub struct HttpSubRpc {
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// How this controller names itself to subd's client lock.
    client: HeaderValue,
    /// Over TLS (`https://`), else plain `http://`.
    tls: bool,
}

impl HttpSubRpc {
    /// Plain HTTP, for subs run `--insecure`. `timeout` bounds connecting; each call has
    /// its own bound ([`call_timeout`]).
    pub fn new(client: &str, timeout: Duration) -> Self {
        Self::build(client, timeout, None)
    }

    /// Over TLS with `tls`, the dominator's client configuration
    /// (`paddock_security::tls::client_config(ca, Some((cert, key)))`): each sub verified
    /// against the CA under its address (hyper-rustls takes the name from the URL's host,
    /// an IP address or a DNS name), the dominator's certificate presented. `timeout`
    /// bounds connecting; the call's own bound covers the handshake.
    pub fn with_tls(client: &str, timeout: Duration, tls: Arc<rustls::ClientConfig>) -> Self {
        Self::build(client, timeout, Some(tls))
    }

    fn build(client: &str, timeout: Duration, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        raise_open_file_limit();
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(timeout));
        tcp.set_nodelay(true);
        // The scheme is ours to check (Connector), not the TCP connector's.
        tcp.enforce_http(false);
        let with_tls = tls.is_some();
        // A plain client has no roots: it could not verify any sub, and `exchange` refuses
        // an https:// address before connecting anyway.
        let config = tls.map_or_else(no_roots, |t| (*t).clone());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            // One call at a time per sub (the herd's rule): one idle connection each.
            .pool_max_idle_per_host(1)
            // A fixed read buffer: hyper's adaptive one grows to 400 KiB reading a tree
            // and keeps that while the connection idles, for every sub.
            .http1_read_buf_exact_size(READ_BUFFER)
            .build(connector);
        HttpSubRpc {
            http,
            client: HeaderValue::from_str(client)
                .unwrap_or_else(|_| HeaderValue::from_static("paddock-dominator")),
            tls: with_tls,
        }
    }

    /// POSTs `body` as JSON; the answer's content type and bytes (200 only). With `gate`,
    /// an answer longer than [`DECODE_INLINE`] (or of unknown length) is read only once it
    /// has a slot of `gate`, which comes back with it.
    async fn exchange<B: Serialize>(
        &self,
        address: &str,
        method: &str,
        body: &B,
        accept: &'static str,
        gate: Option<&Arc<Semaphore>>,
    ) -> Result<Answer, RpcError> {
        let url = subd_url(address, method, self.tls);
        let fail = |what: String| RpcError(format!("Subd.{method} at {url}: {what}"));
        // A TLS dominator never downgrades to plain HTTP, and a plain one has no TLS.
        match (url.starts_with("https://"), self.tls) {
            (false, true) => {
                return Err(fail(
                    "plain http:// refused: this dominator calls subs over TLS".into(),
                ));
            }
            (true, false) => {
                return Err(fail("https:// needs the TLS client (with_tls)".into()));
            }
            _ => {}
        }
        let uri: Uri = url.parse().map_err(|e| fail(format!("a bad URL: {e}")))?;
        let json = serde_json::to_vec(body).map_err(|e| fail(e.to_string()))?;
        let req = Request::post(uri)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .header(CLIENT_HEADER, self.client.clone())
            .body(Full::new(Bytes::from(json)))
            .map_err(|e| fail(e.to_string()))?;
        // The call's time bound covers the exchange, not the wait for a tree slot (that
        // is the herd's own pace): the answer's head, then its body, each within it.
        let limit = call_timeout(method);
        let late = || fail(format!("no answer within {} s", limit.as_secs()));
        let resp = tokio::time::timeout(limit, self.http.request(req))
            .await
            .map_err(|_| late())?
            .map_err(|e| fail(chain(&e)))?;
        let status = resp.status().as_u16();
        let kind = resp.headers().get(CONTENT_TYPE).cloned();
        let large = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .is_none_or(|n| n > DECODE_INLINE);
        let slot = match gate {
            Some(g) if status == 200 && large => g.clone().acquire_owned().await.ok(),
            _ => None,
        };
        let bytes =
            tokio::time::timeout(limit, Limited::new(resp.into_body(), MAX_ANSWER).collect())
                .await
                .map_err(|_| late())?
                .map_err(|e| fail(format!("reading the answer: {}", chain(e.as_ref()))))?
                .to_bytes();
        if status != 200 {
            return Err(RpcError(format!(
                "Subd.{method}: {status}: {}",
                paddock_wire::error_message(&bytes)
            )));
        }
        Ok(Answer { kind, bytes, slot })
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        address: &str,
        method: &str,
        body: &B,
    ) -> Result<T, RpcError> {
        let answer = self
            .exchange(address, method, body, "application/json", None)
            .await?;
        serde_json::from_slice(&answer.bytes)
            .map_err(|e| RpcError(format!("Subd.{method}: a bad answer: {e}")))
    }
}

/// An answer's bytes, their content type, and the gate's slot if one was taken.
struct Answer {
    kind: Option<HeaderValue>,
    bytes: Bytes,
    slot: Option<OwnedSemaphorePermit>,
}

/// A poll's answer, binary or (from a subd that does not speak it) JSON.
fn decode_poll(kind: Option<&HeaderValue>, bytes: &[u8]) -> Result<PollResponse, RpcError> {
    let binary = kind
        .and_then(|k| k.to_str().ok())
        .and_then(|k| k.split(';').next())
        .is_some_and(|k| k.trim().eq_ignore_ascii_case(POLL_MEDIA_TYPE));
    if binary {
        poll_binary::decode(bytes).map_err(|e| RpcError(format!("Subd.Poll: {e}")))
    } else {
        let r: PollResponse = serde_json::from_slice(bytes)
            .map_err(|e| RpcError(format!("Subd.Poll: a bad answer: {e}")))?;
        if let Some(tree) = &r.file_system {
            poll_binary::check_paths(tree).map_err(|e| RpcError(format!("Subd.Poll: {e}")))?;
        }
        Ok(r)
    }
}

/// An error with its causes (hyper's own says only "client error (Connect)").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}

/// A connection per sub needs a descriptor per sub: the soft limit on open files is raised
/// to the hard one, as Go's runtime does for Dominator (the soft default of 1024 would
/// stop the herd at about a thousand subs). The appliance calls it at start for its
/// listeners too.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// How long one call may take in all: a poll answers at once (its tree is the largest
/// answer), a cleanup removes files, a fetch is throttled to a share of the sub's link and
/// an update waits for its triggers.
pub fn call_timeout(method: &str) -> Duration {
    match method {
        "Poll" => Duration::from_secs(60),
        "Cleanup" => Duration::from_secs(300),
        _ => Duration::from_secs(3600),
    }
}

/// `host:port` or a URL → the URL of `Subd.<method>` (a bare `host:port` over `https`
/// when `tls`).
pub fn subd_url(address: &str, method: &str, tls: bool) -> String {
    paddock_wire::rpc_url(address, &format!("Subd.{method}"), tls)
}

/// The TLS settings of a plain client: ring, no roots, no certificate.
fn no_roots() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

impl HttpSubRpc {
    async fn poll_with(
        &self,
        address: &str,
        req: PollRequest,
        trees: Option<&Arc<Semaphore>>,
    ) -> Result<Polled, RpcError> {
        let Answer { kind, bytes, slot } = self
            .exchange(address, "Poll", &req, POLL_MEDIA_TYPE, trees)
            .await?;
        let answer = if bytes.len() <= DECODE_INLINE {
            decode_poll(kind.as_ref(), &bytes)?
        } else {
            tokio::task::spawn_blocking(move || decode_poll(kind.as_ref(), &bytes))
                .await
                .map_err(|e| RpcError(format!("Subd.Poll: decoding: {e}")))??
        };
        let tree_slot = match (&answer.file_system, slot, trees) {
            (None, _, _) => None,
            (Some(_), Some(slot), _) => Some(slot),
            // A small tree, read without a slot: it takes one now.
            (Some(_), None, Some(trees)) => trees.clone().acquire_owned().await.ok(),
            (Some(_), None, None) => None,
        };
        Ok(Polled { answer, tree_slot })
    }
}

#[async_trait]
impl SubRpc for HttpSubRpc {
    async fn poll(&self, address: &str, req: PollRequest) -> Result<PollResponse, RpcError> {
        Ok(self.poll_with(address, req, None).await?.answer)
    }

    async fn poll_gated(
        &self,
        address: &str,
        req: PollRequest,
        trees: &Arc<Semaphore>,
    ) -> Result<Polled, RpcError> {
        self.poll_with(address, req, Some(trees)).await
    }

    async fn fetch(&self, address: &str, req: FetchRequest) -> Result<FetchReply, RpcError> {
        self.call::<_, FetchReply>(address, "Fetch", &req).await
    }

    async fn update(&self, address: &str, req: UpdateRequest) -> Result<UpdateReport, RpcError> {
        self.call::<_, UpdateReport>(address, "Update", &req).await
    }

    async fn cleanup(&self, address: &str, objects: Vec<ObjectId>) -> Result<(), RpcError> {
        self.call::<_, CleanupReply>(address, "Cleanup", &CleanupRequest { objects })
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            subd_url("198.18.0.9:6969", "Poll", false),
            "http://198.18.0.9:6969/rpc/Subd.Poll"
        );
        assert_eq!(
            subd_url("198.18.0.9:6969", "Poll", true),
            "https://198.18.0.9:6969/rpc/Subd.Poll"
        );
        assert_eq!(
            subd_url("https://m1:6969/", "Update", false),
            "https://m1:6969/rpc/Subd.Update"
        );
    }

    #[test]
    fn a_poll_answer_is_read_by_its_content_type() {
        let status = PollResponse {
            generation: 3,
            scan_count: 4,
            ..PollResponse::default()
        };
        let binary = poll_binary::encode(&status, None).unwrap();
        let kind = HeaderValue::from_static(POLL_MEDIA_TYPE);
        assert_eq!(decode_poll(Some(&kind), &binary).unwrap(), status);
        let json = serde_json::to_vec(&status).unwrap();
        let kind = HeaderValue::from_static("application/json");
        assert_eq!(decode_poll(Some(&kind), &json).unwrap(), status);
        assert_eq!(decode_poll(None, &json).unwrap(), status);
        let e = decode_poll(Some(&HeaderValue::from_static(POLL_MEDIA_TYPE)), &json[..3]);
        assert!(e.unwrap_err().0.contains("bad binary Poll answer"));
    }
}
