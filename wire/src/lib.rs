//! What every Paddock HTTP API shares on the wire, written once:
//!
//! - [`ApiError`]: the `{"error": {"message": …}}` envelope (Ironic Inspector's shape, used by
//!   every API of ours) with its status, and [`error_message`] to read one back;
//! - [`frames`]: the length-prefixed stream that carries objects and files (an 8-byte
//!   big-endian length, then that many bytes, for each);
//! - [`unix_ms`]: timestamps are Unix milliseconds;
//! - [`rpc_url`]: where an RPC route (`/rpc/Service.Method`) of a server is.

pub mod frames;

use serde::{Deserialize, Serialize};

/// An error answer: a status and the message the envelope carries. Services return their
/// own domain errors; the API layer alone turns them into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(404, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, message)
    }

    /// The envelope, as sent.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorMessage {
                message: self.message.clone(),
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(feature = "server")]
impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        use axum::http::StatusCode;
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

/// `{"error": {"message": …}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorMessage,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMessage {
    pub message: String,
}

/// `?limit=N` on a list: at most N entries, newest first, capped at what is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub limit: Option<usize>,
}

impl Limit {
    /// The asked-for count, or `default` when none was asked, never more than `kept`.
    pub fn or(self, default: usize, kept: usize) -> usize {
        self.limit.unwrap_or(default).min(kept)
    }
}

/// The message of an error answer's body: the envelope's message when the body is one,
/// else the body itself (trimmed), so that a proxy's or a peer's plain text still reads.
pub fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => b.error.message,
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it): the clock crate's
/// wall clock, as the wire carries it.
pub fn unix_ms() -> i64 {
    paddock_clock::now().0
}

/// The URL of the RPC route `/rpc/<method>` (`Service.Method`) of the server at `address`:
/// under the URL given, or, for a bare `host:port`, over `https` when `tls` (else `http`).
pub fn rpc_url(address: &str, method: &str, tls: bool) -> String {
    let a = address.trim().trim_end_matches('/');
    if a.contains("://") {
        format!("{a}/rpc/{method}")
    } else {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://{a}/rpc/{method}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_round_trips_and_plain_text_reads_as_itself() {
        let e = ApiError::not_found("no node rack1-u0");
        let body = serde_json::to_vec(&e.body()).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"error": {"message": "no node rack1-u0"}})
        );
        assert_eq!(error_message(&body), "no node rack1-u0");
        assert_eq!(error_message(b"  Bad Gateway\n"), "Bad Gateway");
        assert_eq!(
            error_message(br#"{"error": "flat"}"#),
            r#"{"error": "flat"}"#
        );
    }

    #[test]
    fn unix_ms_is_now() {
        let a = unix_ms();
        assert!(a > 1_700_000_000_000, "{a}");
    }
}
