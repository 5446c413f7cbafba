//! subd's RPC: one HTTP route per `Service.Method` under `/rpc/` (as the image server's), so
//! that certificates can later grant methods by glob. TLS and certificate permissions come
//! with the security work; until then the binary serves plain HTTP only when told
//! `--insecure`.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /rpc/Subd.Poll` | [`PollRequest`] (empty or `null` = defaults) | [`crate::service::PollResponse`]: status, and the tree and object cache when the generation differs from the caller's and it is not a short poll |
//! | `POST /rpc/Subd.Fetch` | [`FetchRequest`] | [`crate::service::FetchReply`] |
//! | `POST /rpc/Subd.Update` | [`paddock_image::UpdateRequest`] | [`crate::service::UpdateReport`] |
//! | `POST /rpc/Subd.Cleanup` | [`CleanupRequest`] | [`crate::service::CleanupReply`] |
//! | `POST /rpc/Subd.GetFiles` | `{"paths": [...]}` | each file as an 8-byte big-endian length then its bytes, in order; a path that is not a regular file fails the request before anything is sent |
//! | `GET`/`POST /rpc/Subd.GetConfiguration` | — | [`Configuration`] |
//! | `POST /rpc/Subd.SetConfiguration` | [`Configuration`] | the configuration now in force |
//! | `POST /rpc/Subd.BoostScanLimit` | — | lifts the scan limits until the next scan ends |
//! | `GET /healthz` | — | 200 once the first scan is done, else 503 |
//!
//! The caller's identity for the client lock is the `x-paddock-client` header, else its IP
//! address (certificates will name it). Errors are `{"error": {"message"}}`: 400 for a bad
//! request, 409 for the lock or another Fetch/Update/Cleanup in progress, 503 before the
//! first scan, 502 when the object server failed.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use paddock_image::UpdateRequest;
use paddock_wire::frames;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::service::{CleanupRequest, Configuration, FetchRequest, PollRequest, Subd, SubdError};

/// The header naming the caller for the client lock.
pub const CLIENT_HEADER: &str = "x-paddock-client";
/// Largest request body (an Update for a whole image).
pub const MAX_BODY: usize = 1 << 30;

/// The caller's identity (header, else IP address).
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

/// Serves the router on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, subd: Arc<Subd>) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(subd).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

async fn poll(State(s): State<Arc<Subd>>, Client(c): Client, body: Bytes) -> ApiResult {
    let req: PollRequest = parse(&body, "Subd.Poll")?;
    blocking(move || s.poll(&c, &req)).await
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
