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

/// The binary Poll answer (the codec is [`paddock_subd_proto::poll_binary`], shared with the
/// controllers), and which callers ask for it.
pub mod poll_binary {
    use axum::http::HeaderMap;
    use axum::http::header::ACCEPT;
    pub use paddock_subd_proto::poll_binary::*;

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
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use axum::http::header::ACCEPT;

    use super::*;

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
