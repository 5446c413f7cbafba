//! The image server's HTTP routes, one per `Service.Method` under `/rpc/` (so that a
//! certificate can later grant methods by glob, as Dominator's do).
//!
//! `ImageServer.AddImage` takes a framed body: one line of JSON (`{"name", "filter",
//! "triggers", "expires_in_secs"}`, at most 1 MiB) then the tarball, streamed straight into
//! ingest. `ObjectServer.GetObjects` answers with each object as an 8-byte big-endian length
//! and its bytes, after checking that every one exists (a missing one fails the whole
//! request before anything is sent). Errors are `{"error": {"message"}}` with a status.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::TryStreamExt;
use paddock_image::{Filter, Machine, ObjectId, Triggers};
use paddock_wire::{frames, unix_ms};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use crate::images::{ImageError, ImageServer};
use crate::mdb::{MdbService, MdbServiceError, Source};

#[derive(Clone)]
pub struct ImageServerState {
    pub images: Arc<ImageServer>,
    pub mdb: Arc<MdbService>,
}

pub fn router(state: ImageServerState) -> Router {
    Router::new()
        .route("/rpc/ImageServer.AddImage", post(add_image))
        .route("/rpc/ImageServer.ListImages", get(list_images))
        .route("/rpc/ImageServer.GetImage", get(get_image))
        .route("/rpc/ImageServer.ShowImage", get(show_image))
        .route("/rpc/ImageServer.DeleteImage", post(delete_image))
        .route(
            "/rpc/ImageServer.ChangeImageExpiration",
            post(change_expiration),
        )
        .route("/rpc/ImageServer.CheckImage", post(check_image))
        .route(
            "/rpc/ImageServer.DeleteUnreferencedObjects",
            post(collect_garbage),
        )
        .route("/rpc/ObjectServer.CheckObjects", post(check_objects))
        .route("/rpc/ObjectServer.GetObjects", post(get_objects))
        .route("/rpc/Mdb.GetMdb", get(get_mdb))
        .route("/rpc/Mdb.ListMachines", get(list_machines))
        .route("/rpc/Mdb.SetMachine", post(set_machine))
        .route("/rpc/Mdb.DeleteMachine", post(delete_machine))
        .with_state(state)
}

/// The error answer (`{"error": {"message"}}` with a status), shared by every API.
use paddock_wire::ApiError;

impl From<ImageError> for ApiError {
    /// The image index's errors as answers: this is the one place they get a status.
    fn from(e: ImageError) -> Self {
        let status = match e {
            ImageError::Name(_) | ImageError::MissingRequired(..) | ImageError::Ingest(_) => 400,
            ImageError::Exists(_) | ImageError::NameRetired(_) => 409,
            ImageError::NotFound(_) => 404,
            _ => 500,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<MdbServiceError> for ApiError {
    fn from(e: MdbServiceError) -> Self {
        let status = match e {
            MdbServiceError::Mdb(_) => 400,
            MdbServiceError::NotFound(_) => 404,
            _ => 500,
        };
        ApiError::new(status, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

#[derive(Deserialize)]
struct AddHeader {
    name: String,
    #[serde(default)]
    filter: Option<String>,
    #[serde(default)]
    triggers: Option<String>,
    #[serde(default)]
    expires_in_secs: Option<i64>,
    #[serde(default)]
    created_by: Option<String>,
}

async fn add_image(State(s): State<ImageServerState>, body: Body) -> ApiResult<Json<Value>> {
    let stream = body
        .into_data_stream()
        .map_err(|e| std::io::Error::other(e.to_string()));
    let mut reader = tokio_util::io::StreamReader::new(stream);
    let mut line = Vec::new();
    (&mut reader)
        .take(1 << 20)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| bad(format!("reading the request header line: {e}")))?;
    if line.last() != Some(&b'\n') {
        return Err(bad(
            "the body must start with one line of JSON (name, filter, triggers) of at most 1 MiB, then the tarball",
        ));
    }
    let h: AddHeader = serde_json::from_slice(&line)
        .map_err(|e| bad(format!("the header line is not valid JSON: {e}")))?;
    let filter = h
        .filter
        .as_deref()
        .map(Filter::parse)
        .transpose()
        .map_err(|e| bad(e.to_string()))?;
    let triggers = match h.triggers.as_deref() {
        Some(t) => Triggers::parse(t).map_err(|e| bad(e.to_string()))?,
        None => Triggers::default(),
    };
    let now = unix_ms();
    let expires = expiry(now, h.expires_in_secs)?;
    let tar = tokio_util::io::SyncIoBridge::new(reader);
    let name = h.name.clone();
    let summary = s
        .images
        .add(
            h.name,
            Box::new(tar),
            filter,
            triggers,
            h.created_by.unwrap_or_default(),
            expires,
            Box::new(move |st| {
                tracing::debug!(image = %name, members = st.members, bytes = st.bytes, "adding image");
            }),
            now,
        )
        .await?;
    Ok(Json(serde_json::to_value(summary).unwrap_or_default()))
}

#[derive(Deserialize)]
struct NameQuery {
    name: String,
}

async fn list_images(State(s): State<ImageServerState>) -> ApiResult<Json<Value>> {
    let list = s.images.list().await?;
    Ok(Json(json!({ "images": list })))
}

async fn get_image(
    State(s): State<ImageServerState>,
    Query(q): Query<NameQuery>,
) -> ApiResult<Json<Value>> {
    let img = s.images.get(&q.name).await?;
    Ok(Json(serde_json::to_value(img).unwrap_or_default()))
}

async fn show_image(
    State(s): State<ImageServerState>,
    Query(q): Query<NameQuery>,
) -> ApiResult<Json<Value>> {
    let d = s.images.show(&q.name).await?;
    Ok(Json(serde_json::to_value(d).unwrap_or_default()))
}

async fn delete_image(
    State(s): State<ImageServerState>,
    Query(q): Query<NameQuery>,
) -> ApiResult<Json<Value>> {
    s.images.delete(&q.name, unix_ms()).await?;
    Ok(Json(json!({"deleted": q.name})))
}

#[derive(Deserialize)]
struct ExpiryQuery {
    name: String,
    /// Absent: never expires.
    expires_in_secs: Option<i64>,
}

/// When an image given `secs` from `now` to live expires (Unix ms); `None` for never. A time past what
/// the clock can count is refused, not wrapped into the past (which would expire it at once).
fn expiry(now: i64, secs: Option<i64>) -> Result<Option<i64>, ApiError> {
    let Some(secs) = secs else { return Ok(None) };
    secs.max(0)
        .checked_mul(1000)
        .and_then(|ms| now.checked_add(ms))
        .map(Some)
        .ok_or_else(|| {
            bad(format!(
                "expires_in_secs: {secs} is further away than the clock counts"
            ))
        })
}

async fn change_expiration(
    State(s): State<ImageServerState>,
    Query(q): Query<ExpiryQuery>,
) -> ApiResult<Json<Value>> {
    let at = expiry(unix_ms(), q.expires_in_secs)?;
    s.images.set_expiry(&q.name, at).await?;
    Ok(Json(json!({"name": q.name, "expires_at_ms": at})))
}

async fn check_image(
    State(s): State<ImageServerState>,
    Query(q): Query<NameQuery>,
) -> ApiResult<Json<Value>> {
    let bad = s.images.check(&q.name).await?;
    Ok(Json(json!({
        "name": q.name,
        "ok": bad.is_empty(),
        "bad": bad.iter().map(|(id, why)| json!({"object": id, "problem": why})).collect::<Vec<_>>(),
    })))
}

async fn collect_garbage(State(s): State<ImageServerState>) -> ApiResult<Json<Value>> {
    let r = s.images.collect_garbage().await?;
    Ok(Json(serde_json::to_value(r).unwrap_or_default()))
}

#[derive(Deserialize)]
struct ObjectList {
    objects: Vec<ObjectId>,
}

async fn check_objects(State(s): State<ImageServerState>, body: Bytes) -> ApiResult<Json<Value>> {
    let l: ObjectList = serde_json::from_slice(&body).map_err(|e| bad(format!("objects: {e}")))?;
    let sizes: Vec<u64> = l
        .objects
        .iter()
        .map(|id| s.images.objects().size(id).unwrap_or(0))
        .collect();
    Ok(Json(json!({ "sizes": sizes })))
}

async fn get_objects(State(s): State<ImageServerState>, body: Bytes) -> ApiResult<Response> {
    let l: ObjectList = serde_json::from_slice(&body).map_err(|e| bad(format!("objects: {e}")))?;
    let missing: Vec<String> = l
        .objects
        .iter()
        .filter(|id| !s.images.objects().contains(id))
        .map(|id| id.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(ApiError::not_found(format!(
            "{} object(s) missing, first {}",
            missing.len(),
            missing[0]
        )));
    }
    let objects = s.images.objects().clone();
    let body = frames::body(
        l.objects,
        move |id| {
            objects
                .open_object(id)
                .map_err(|e| std::io::Error::other(e.to_string()))
        },
        |id| format!("object {id}"),
    );
    Response::builder()
        .header("content-type", "application/octet-stream")
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))
}

async fn get_mdb(State(s): State<ImageServerState>) -> ApiResult<Response> {
    let mdb = s.mdb.mdb().await?;
    Ok(([("content-type", "application/json")], mdb.to_json()).into_response())
}

async fn list_machines(State(s): State<ImageServerState>) -> ApiResult<Json<Value>> {
    let entries = s.mdb.entries().await?;
    Ok(Json(json!({
        "machines": entries.values().collect::<Vec<_>>(),
        "file": s.mdb.status(),
    })))
}

async fn set_machine(State(s): State<ImageServerState>, body: Bytes) -> ApiResult<Json<Value>> {
    let m: Machine = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("a machine in Dominator's MDB JSON: {e}")))?;
    s.mdb.set(m.clone(), Source::Api).await?;
    Ok(Json(serde_json::to_value(m).unwrap_or_default()))
}

#[derive(Deserialize)]
struct HostQuery {
    hostname: String,
}

async fn delete_machine(
    State(s): State<ImageServerState>,
    Query(q): Query<HostQuery>,
) -> ApiResult<Json<Value>> {
    s.mdb.delete(&q.hostname).await?;
    Ok(Json(json!({"deleted": q.hostname})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_past_the_clock_is_refused_not_wrapped() {
        assert_eq!(expiry(1_000, None).unwrap(), None);
        assert_eq!(expiry(1_000, Some(5)).unwrap(), Some(6_000));
        assert_eq!(
            expiry(1_000, Some(-5)).unwrap(),
            Some(1_000),
            "a past time is now"
        );
        for far in [i64::MAX, i64::MAX / 1000] {
            assert!(expiry(1_000, Some(far)).is_err(), "{far}");
        }
    }
}
