//! Image upload from the console: `POST /ui/images?name=NAME` with the tarball as the raw
//! body (`application/x-tar`), sent by the page's script with a progress bar (the browser's
//! upload progress). The tarball streams into the image server's own `add` (the same ingest
//! as `paddock image add`), so nothing is buffered whole and every check of the ingest holds.
//! A form posted without the script (JavaScript off) carries no file and is refused with a
//! message naming the CLI.
//!
//! Deleting: `POST /ui/images/{name}` (`action=delete`) asks to confirm, then deletes
//! through the image server's own `delete` (as `ImageServer.DeleteImage`): the name is
//! retired; a refusal is shown with the API's status and message.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use futures_util::TryStreamExt;
use paddock_image::Triggers;
use serde_json::json;

use super::{ActionPost, Console, confirm_page, done_or_refused, failure, same_origin};

#[derive(serde::Deserialize)]
pub struct UploadQuery {
    #[serde(default)]
    name: String,
}

/// The answer the page's script reads: `{"name", "files", "bytes"}` or `{"error": {…}}`.
fn refusal(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": {"message": message.into()}}))).into_response()
}

/// `POST /ui/images?name=NAME`.
pub async fn upload(
    State(s): State<Console>,
    Query(q): Query<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !same_origin(&headers) {
        return refusal(
            StatusCode::FORBIDDEN,
            "an upload from another site was refused",
        );
    }
    let kind = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !matches!(kind, "application/x-tar" | "application/octet-stream") {
        return refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "uploading from the console needs JavaScript; or run `paddock image add NAME TARBALL`",
        );
    }
    let stream = body
        .into_data_stream()
        .map_err(|e| std::io::Error::other(e.to_string()));
    let tar = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let name = q.name.clone();
    let added = s
        .imageserver
        .images
        .add(
            q.name,
            Box::new(tar),
            None,
            Triggers::default(),
            "console".into(),
            None,
            Box::new(move |st| {
                tracing::debug!(image = %name, members = st.members, bytes = st.bytes, "console: adding image");
            }),
            paddock_wire::unix_ms(),
        )
        .await;
    match added {
        Ok(summary) => Json(json!({
            "name": summary.name,
            "members": summary.stats.members,
            "bytes": summary.stats.bytes,
        }))
        .into_response(),
        Err(e) => {
            let e = paddock_wire::ApiError::from(e);
            refusal(
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
                e.message,
            )
        }
    }
}

/// `POST /ui/images/{name}` with `action=delete`: a confirmation page, then (with
/// `confirm=yes`) the image deleted and the list shown again.
pub async fn delete(
    State(s): State<Console>,
    ActionPost {
        target: name,
        form: f,
    }: ActionPost,
) -> Response {
    if f.action != "delete" {
        return failure(
            StatusCode::BAD_REQUEST,
            "the only action on an image is delete",
        );
    }
    if !f.confirmed() {
        return confirm_page(
            "Delete an image?",
            maud::html! {
                "Delete image " code { (name) } "? Its name is retired: it cannot be used again. "
                "Subs that require it stop being updated to it."
            },
            &format!("/ui/images/{name}"),
            &[("action", "delete")],
            maud::html! {},
            "Delete the image",
            "/ui/images",
        );
    }
    let r = s
        .imageserver
        .images
        .delete(&name, paddock_wire::unix_ms())
        .await;
    done_or_refused("/ui/images", r)
}
