//! The HTTP face of the appliance: boot scripts and assets, the API, health and metrics.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use paddock_dhcp::MacAddr;
use paddock_dhcp::shell::DhcpService;
use serde::Deserialize;
use tower_http::services::ServeDir;

use crate::boot;
use crate::config::Config;
use crate::nodes::{Node, NodeError, NodeState, Nodes};

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub nodes: Nodes,
    pub dhcp: Option<Arc<DhcpService>>,
}

pub fn router(state: AppState) -> Router {
    let mut r = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/boot/{name}", get(boot_script))
        .route("/api/v1/leases", get(leases))
        .route("/api/v1/nodes", get(list_nodes).post(create_node));
    if let Some(dir) = &state.config.assets_dir {
        // ServeDir answers Range requests (206) and refuses paths that leave the directory.
        r = r.nest_service("/boot/assets", ServeDir::new(dir));
    }
    r.with_state(state)
}

/// An error for API callers: a status and a JSON body `{"error": {"message": …}}`.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"message": self.1}});
        (self.0, Json(body)).into_response()
    }
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        let status = match e {
            NodeError::MacTaken(_) => StatusCode::CONFLICT,
            NodeError::NoMac => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

async fn boot_script(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let ipxe = |body: String| {
        ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
    };
    if name == "autoexec.ipxe" || name == "boot.ipxe" {
        return Ok(ipxe(boot::chain_script(&s.config.public_url)));
    }
    let Some(mac) = name.strip_suffix(".ipxe") else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no boot file {name:?}; scripts are /boot/<mac>.ipxe"),
        ));
    };
    let mac: MacAddr = mac.parse().map_err(|e: paddock_dhcp::mac::MacParseError| {
        ApiError(StatusCode::BAD_REQUEST, e.to_string())
    })?;
    let node = s.nodes.by_mac(mac).await?;
    tracing::info!(%mac, known = node.is_some(), "boot: script served");
    Ok(ipxe(boot::script(
        mac,
        node.as_ref(),
        &s.config.discovery,
        &s.config.public_url,
    )))
}

async fn leases(State(s): State<AppState>) -> Response {
    let leases = s.dhcp.as_ref().map(|d| d.leases()).unwrap_or_default();
    Json(leases).into_response()
}

async fn list_nodes(State(s): State<AppState>) -> Result<Json<Vec<Node>>, ApiError> {
    Ok(Json(s.nodes.list().await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewNode {
    macs: Vec<String>,
    name: Option<String>,
    state: Option<NodeState>,
}

async fn create_node(
    State(s): State<AppState>,
    body: Result<Json<NewNode>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Node>), ApiError> {
    let Json(req) = body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let macs = req
        .macs
        .iter()
        .map(|m| m.parse::<MacAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let node = Node {
        uuid: uuid::Uuid::new_v4(),
        name: req.name,
        macs,
        state: req.state.unwrap_or(NodeState::Inspecting),
    };
    s.nodes.create(&node).await?;
    Ok((StatusCode::CREATED, Json(node)))
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut out = String::new();
    if let Some(d) = &s.dhcp {
        let st = &d.stats;
        let _ = writeln!(
            out,
            "# HELP paddock_dhcp_packets_total DHCP packets by outcome."
        );
        let _ = writeln!(out, "# TYPE paddock_dhcp_packets_total counter");
        for (what, c) in [
            ("received", &st.received),
            ("malformed", &st.malformed),
            ("ignored", &st.ignored),
            ("offer", &st.offers),
            ("ack", &st.acks),
            ("nak", &st.naks),
            ("persist_error", &st.persist_errors),
        ] {
            let _ = writeln!(
                out,
                "paddock_dhcp_packets_total{{outcome=\"{what}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
