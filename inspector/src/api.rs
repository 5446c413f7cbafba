//! Ironic Inspector's v1 HTTP API (routes, status codes, headers, JSON shapes, microversions
//! 1.0–1.18), plus the agent endpoints Paddock's ramdisk uses.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_inventory::MacAddr;
use paddock_wire::ApiError;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::node::{Node, Secrets, iso};
use crate::patch;
use crate::rules::Rule;
use crate::service::{ErrorKind, Inspector, InspectorError, Subject, now_secs};
use crate::state::State as IState;

pub const VERSION_HEADER: &str = "X-OpenStack-Ironic-Inspector-API-Version";
pub const MIN_HEADER: &str = "X-OpenStack-Ironic-Inspector-API-Minimum-Version";
pub const MAX_HEADER: &str = "X-OpenStack-Ironic-Inspector-API-Maximum-Version";
pub const MAX_MINOR: u32 = 18;
/// Most introspection statuses one list request returns (`api_max_limit`).
pub const MAX_LIMIT: usize = 1000;

/// The microversion a request asked for (1.0–1.18).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32);

/// The HTTP status Inspector answers each kind of failure with: here, at the API's edge, and
/// nowhere else.
fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::Invalid => 400,
        ErrorKind::NotFound => 404,
        ErrorKind::Conflict => 409,
        ErrorKind::Store => 500,
        ErrorKind::NotLeader => 503,
        ErrorKind::Forbidden => 403,
    }
}

/// The machine an agent's credential speaks for, when the caller is an agent: the
/// appliance's access layer puts it in the request's extensions. The agent routes then act
/// for that MAC alone, whatever the body names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speaker(pub MacAddr);

impl Speaker {
    /// The node `ident` names (decoded, as the handler's own `Path` gave it), if this
    /// speaker owns one of its MACs. An unknown node refuses like another machine's, so a
    /// token learns nothing about which names exist; a store failure refuses too.
    pub async fn node(&self, api: &Inspector, ident: &str) -> Result<Node, ApiError> {
        match api.find(ident).await? {
            Some(v) if v.node.macs.contains(&self.0) || v.node.pxe_mac == Some(self.0) => {
                Ok(v.node)
            }
            _ => Err(err(
                403,
                format!(
                    "agent token: issued for another machine (node {ident:?} is not {}'s)",
                    self.0
                ),
            )),
        }
    }
}

impl From<InspectorError> for ApiError {
    fn from(e: InspectorError) -> Self {
        ApiError::new(status_of(e.kind), e.message)
    }
}

fn err(status: u16, message: impl Into<String>) -> ApiError {
    ApiError::new(status, message)
}

/// Parses the version header: absent or `latest` → 1.18; malformed → 400; out of range → 406.
pub fn parse_version(h: Option<&str>) -> Result<Version, ApiError> {
    let Some(h) = h.map(str::trim) else {
        return Ok(Version(MAX_MINOR));
    };
    if h.eq_ignore_ascii_case("latest") {
        return Ok(Version(MAX_MINOR));
    }
    let (major, minor) = h
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| {
            err(
                400,
                format!(
                    "Malformed API version: expected string in form of X.Y or latest, got {h:?}"
                ),
            )
        })?;
    if major != 1 || minor > MAX_MINOR {
        return Err(err(
            406,
            format!("Unsupported API version {h}, supported range is 1.0 to 1.{MAX_MINOR}"),
        ));
    }
    Ok(Version(minor))
}

async fn versioning(mut req: Request, next: Next) -> Response {
    let header_value = req
        .headers()
        .get(VERSION_HEADER)
        .map(|v| v.to_str().unwrap_or("?"));
    let mut resp = match parse_version(header_value) {
        Ok(v) => {
            req.extensions_mut().insert(v);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    };
    let h = resp.headers_mut();
    h.insert(MIN_HEADER, HeaderValue::from_static("1.0"));
    h.insert(MAX_HEADER, HeaderValue::from_static("1.18"));
    resp
}

type Api = Arc<Inspector>;

/// The Inspector API router; the appliance merges it into its HTTP server.
pub fn router(inspector: Api) -> Router {
    let max_body = inspector.config.max_body_bytes;
    let v1 = Router::new()
        .route("/", get(root))
        .route("/v1", get(v1_index))
        .route("/v1/", get(v1_index))
        .route("/v1/introspection", get(list))
        .route("/v1/introspection/{node}", get(status).post(start))
        .route("/v1/introspection/{node}/abort", post(abort))
        .route("/v1/introspection/{node}/data", get(data))
        .route(
            "/v1/introspection/{node}/data/unprocessed",
            get(unprocessed).post(reapply),
        )
        .route(
            "/v1/continue",
            post(continue_).layer(DefaultBodyLimit::max(max_body)),
        )
        .route(
            "/v1/rules",
            get(list_rules).post(create_rule).delete(delete_rules),
        )
        .route("/v1/rules/{uuid}", get(get_rule).delete(delete_rule))
        .layer(middleware::from_fn(versioning));
    let agent = Router::new()
        .route("/api/v1/agent/events", post(agent_event))
        .route("/api/v1/agent/{node}/next", get(agent_next))
        .route("/api/v1/nodes", get(list_nodes).post(create_node))
        .route("/api/v1/nodes/{node}", get(show_node).patch(patch_node));
    v1.merge(agent).with_state(inspector)
}

fn base(api: &Inspector) -> &str {
    &api.config.public_url
}

async fn root(State(api): State<Api>) -> Json<Value> {
    Json(json!({"versions": [{"id": "1.18", "status": "CURRENT",
        "links": [{"rel": "self", "href": format!("{}/v1", base(&api))}]}]}))
}

async fn v1_index(State(api): State<Api>) -> Json<Value> {
    let b = base(&api);
    let res = |name: &str| json!({"name": name, "links": [{"rel": "self", "href": format!("{b}/v1/{name}")}]});
    Json(json!({"resources": [res("introspection"), res("continue"), res("rules")]}))
}

/// The introspection status object (`generate_introspection_status`): every field at every
/// version, as Inspector sends them (the version history says when a field appeared; Inspector
/// never hides one from an older client).
fn status_json(api: &Inspector, node: &Node) -> Value {
    let i = node.introspection.as_ref();
    json!({
        "uuid": node.uuid,
        "finished": i.is_some_and(|i| i.finished()),
        "state": i.map(|i| i.state.as_str()),
        "started_at": i.and_then(|i| i.started_at).map(iso),
        "finished_at": i.and_then(|i| i.finished_at).map(iso),
        "error": i.and_then(|i| i.error.clone()),
        "links": [{"rel": "self", "href": format!("{}/v1/introspection/{}", base(api), node.uuid)}],
    })
}

/// A node by UUID or name, at any version (Inspector's `node_cache.get_node`).
async fn node_for(api: &Inspector, ident: &str) -> Result<Node, ApiError> {
    let n = api
        .find(ident)
        .await?
        .ok_or_else(|| err(404, format!("Could not find node {ident} in cache")))?;
    Ok(n.node)
}

#[derive(Deserialize)]
struct StartQuery {
    manage_boot: Option<String>,
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "y" | "t" => Some(true),
        "0" | "false" | "no" | "off" | "n" | "f" => Some(false),
        _ => None,
    }
}

async fn start(
    State(api): State<Api>,
    Path(ident): Path<String>,
    Query(q): Query<StartQuery>,
) -> Result<Response, ApiError> {
    let manage_boot = match q.manage_boot.as_deref() {
        None => true,
        Some(s) => parse_bool(s)
            .ok_or_else(|| err(400, format!("Invalid boolean value for manage_boot: {s}")))?,
    };
    let node = node_for(&api, &ident).await?;
    api.start(&node.uuid.to_string(), manage_boot, now_secs())
        .await?;
    Ok((StatusCode::ACCEPTED, Json(json!({}))).into_response())
}

async fn status(
    State(api): State<Api>,
    Path(ident): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let node = node_for(&api, &ident).await?;
    if node.introspection.is_none() {
        return Err(err(404, format!("Could not find node {ident} in cache")));
    }
    Ok(Json(status_json(&api, &node)))
}

#[derive(Deserialize)]
struct ListQuery {
    marker: Option<String>,
    limit: Option<String>,
    state: Option<String>,
}

async fn list(State(api): State<Api>, Query(q): Query<ListQuery>) -> Result<Json<Value>, ApiError> {
    let limit = match q.limit.as_deref() {
        None => MAX_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(0) => MAX_LIMIT,
            Ok(n) if n <= MAX_LIMIT => n,
            Ok(n) => {
                return Err(err(
                    400,
                    format!("Limit is over API max limit: {n} > {MAX_LIMIT}"),
                ));
            }
            Err(_) => {
                return Err(err(
                    400,
                    format!("Invalid limit value {l:?}: expected a non-negative integer"),
                ));
            }
        },
    };
    let states = match q.state.as_deref() {
        None => None,
        Some(s) => Some(
            s.split(',')
                .map(|x| {
                    IState::parse(x.trim()).ok_or_else(|| err(400, format!("Invalid state {x:?}")))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let mut nodes: Vec<Node> = api
        .list()
        .await?
        .into_iter()
        .filter(|n| n.introspection.is_some())
        .filter(|n| {
            states
                .as_ref()
                .is_none_or(|s| n.state().is_some_and(|st| s.contains(&st)))
        })
        .collect();
    nodes.sort_by_key(|n| {
        std::cmp::Reverse((n.introspection.as_ref().and_then(|i| i.started_at), n.uuid))
    });
    if let Some(m) = &q.marker {
        let m = uuid::Uuid::parse_str(m)
            .map_err(|_| err(400, format!("Invalid UUID value {m} for marker")))?;
        let pos = nodes
            .iter()
            .position(|n| n.uuid == m)
            .ok_or_else(|| err(400, format!("Marker not found: {m}")))?;
        nodes.drain(..=pos);
    }
    nodes.truncate(limit);
    Ok(Json(
        json!({"introspection": nodes.iter().map(|n| status_json(&api, n)).collect::<Vec<_>>()}),
    ))
}

async fn abort(State(api): State<Api>, Path(ident): Path<String>) -> Result<Response, ApiError> {
    let node = node_for(&api, &ident).await?;
    api.abort(&node.uuid.to_string(), now_secs()).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

fn json_bytes(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

async fn data(State(api): State<Api>, Path(ident): Path<String>) -> Result<Response, ApiError> {
    let node = node_for(&api, &ident).await?;
    Ok(json_bytes(api.data(&node.uuid.to_string(), true).await?))
}

async fn unprocessed(
    State(api): State<Api>,
    Path(ident): Path<String>,
) -> Result<Response, ApiError> {
    let node = node_for(&api, &ident).await?;
    Ok(json_bytes(api.data(&node.uuid.to_string(), false).await?))
}

async fn reapply(
    State(api): State<Api>,
    Path(ident): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let node = node_for(&api, &ident).await?;
    let body = if body.is_empty() {
        None
    } else {
        Some(
            serde_json::from_slice::<Value>(&body)
                .map_err(|e| err(400, format!("Invalid JSON body: {e}")))?,
        )
    };
    api.reapply(&node.uuid.to_string(), body, now_secs())
        .await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

async fn continue_(
    State(api): State<Api>,
    speaker: Option<axum::Extension<Speaker>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body.map_err(|e| {
        let status = e.status().as_u16();
        if status == 413 {
            err(
                413,
                format!(
                    "Request body is larger than {} bytes (inspector.max_body_bytes)",
                    api.config.max_body_bytes
                ),
            )
        } else {
            err(status, e.body_text())
        }
    })?;
    let speaker = speaker.map(|axum::Extension(s)| s.0);
    let uuid = api.process_as(&body, now_secs(), speaker).await?;
    Ok(Json(json!({"uuid": uuid})))
}

fn rule_json(api: &Inspector, r: &Rule, full: bool) -> Value {
    let mut v = json!({
        "uuid": r.uuid,
        "description": r.description,
        "scope": r.scope,
        "links": [{"rel": "self", "href": format!("{}/v1/rules/{}", base(api), r.uuid)}],
    });
    if full {
        v["conditions"] = json!(r.conditions);
        v["actions"] = json!(r.actions);
    }
    v
}

async fn list_rules(State(api): State<Api>) -> Result<Json<Value>, ApiError> {
    // In creation order, as Inspector lists them (`rules.get_all`, by `created_at`).
    let rules = api.rules().await?;
    Ok(Json(
        json!({"rules": rules.iter().map(|r| rule_json(&api, r, false)).collect::<Vec<_>>()}),
    ))
}

async fn create_rule(
    State(api): State<Api>,
    axum::Extension(v): axum::Extension<Version>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Value =
        serde_json::from_slice(&body).map_err(|e| err(400, format!("Invalid JSON body: {e}")))?;
    let rule = api.create_rule(&body, now_secs()).await?;
    let status = if v.0 >= 6 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(rule_json(&api, &rule, true))).into_response())
}

async fn get_rule(
    State(api): State<Api>,
    Path(uuid): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(rule_json(&api, &api.rule(&uuid).await?, true)))
}

fn no_content() -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (header::CONTENT_TYPE, "text/plain"),
            (header::CONTENT_LENGTH, "0"),
        ],
    )
        .into_response()
}

async fn delete_rule(
    State(api): State<Api>,
    Path(uuid): Path<String>,
) -> Result<Response, ApiError> {
    api.delete_rule(&uuid).await?;
    Ok(no_content())
}

async fn delete_rules(State(api): State<Api>) -> Result<Response, ApiError> {
    api.delete_rules().await?;
    Ok(no_content())
}

// ---- Paddock's own: agent and nodes ----

#[derive(Deserialize)]
struct AgentEvent {
    mac: String,
    step: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    level: Option<String>,
}

async fn agent_event(
    State(api): State<Api>,
    speaker: Option<axum::Extension<Speaker>>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let ev: AgentEvent =
        serde_json::from_slice(&body).map_err(|e| err(400, format!("Invalid agent event: {e}")))?;
    let mac: MacAddr = ev
        .mac
        .parse()
        .or_else(|_| {
            paddock_inventory::normalise_mac(&ev.mac)
                .ok_or(())
                .and_then(|m| m.parse().map_err(|_| ()))
        })
        .map_err(|_| err(400, format!("Invalid MAC {:?}", ev.mac)))?;
    if let Some(axum::Extension(Speaker(own))) = speaker
        && own != mac
    {
        return Err(err(
            403,
            format!("agent token: issued for {own}, not for {mac}"),
        ));
    }
    let error = ev.level.as_deref() == Some("error");
    let step: String = ev.step.chars().take(64).collect();
    let msg: String = ev.message.chars().take(2000).collect();
    api.event(Subject::Mac(mac), &format!("ramdisk-{step}"), &msg, error)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn agent_next(
    State(api): State<Api>,
    speaker: Option<axum::Extension<Speaker>>,
    Path(ident): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let action = match speaker {
        // An agent's own node, found once while checking its token speaks for it.
        Some(axum::Extension(s)) => api.action_for(&s.node(&api, &ident).await?),
        None => api.next_action(&ident).await?,
    };
    Ok(Json(json!({"action": action})))
}

/// A node as the API shows it: Ironic's attributes, BMC passwords as `******`.
fn node_json(node: &Node) -> Value {
    node.view(Secrets::Masked)
}

async fn list_nodes(State(api): State<Api>) -> Result<Json<Value>, ApiError> {
    let mut nodes = api.list().await?;
    nodes.sort_by_key(|n| n.created_at);
    Ok(Json(Value::Array(nodes.iter().map(node_json).collect())))
}

async fn show_node(
    State(api): State<Api>,
    Path(ident): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let v = api
        .find(&ident)
        .await?
        .ok_or_else(|| err(404, format!("Could not find node {ident}")))?;
    let timeline = api.timeline(&v.node).await?;
    let mut out = node_json(&v.node);
    out["timeline"] = json!(timeline);
    Ok(Json(out))
}

/// Paddock's own creation fields; every other key is an Ironic node attribute, set as a
/// PATCH `add` would set it.
const CREATE_FIELDS: [&str; 3] = ["macs", "name", "bmc_address"];

async fn create_node(State(api): State<Api>, body: Bytes) -> Result<Response, ApiError> {
    let req: serde_json::Map<String, Value> =
        serde_json::from_slice(&body).map_err(|e| err(400, format!("Invalid node: {e}")))?;
    let macs = match req.get("macs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|m| {
                m.as_str()
                    .ok_or_else(|| err(400, format!("Invalid node: MAC {m} is not a string")))?
                    .parse::<MacAddr>()
                    .map_err(|e| err(400, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(err(
                400,
                format!("Invalid node: macs must be a list, not {other}"),
            ));
        }
    };
    let text = |k: &str| match req.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(err(
            400,
            format!("Invalid node: {k} must be a string, not {other}"),
        )),
    };
    let (name, bmc_address) = (text("name")?, text("bmc_address")?);
    if macs.is_empty() && bmc_address.is_none() {
        return Err(err(
            400,
            "a node needs at least one MAC address or a BMC address",
        ));
    }
    if let Some(name) = &name {
        crate::node::check_name(name).map_err(|e| err(400, e.to_string()))?;
    }
    let mut node = Node::new(uuid::Uuid::new_v4(), now_secs());
    node.macs = macs;
    node.name = name;
    node.bmc_address = bmc_address;
    let ops: Vec<Value> = req
        .iter()
        .filter(|(k, _)| !CREATE_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| json!({"op": "add", "path": format!("/{k}"), "value": v}))
        .collect();
    if !ops.is_empty() {
        let opts = patch::Options {
            ident: "new",
            reset_interfaces: None,
        };
        node = patch::patch(&node, &Value::Array(ops), &opts)
            .map_err(|e| err(400, format!("Invalid node: {e}")))?;
    }
    api.create(&node).await?;
    Ok((StatusCode::CREATED, Json(node_json(&node))).into_response())
}

#[derive(Deserialize)]
struct PatchQuery {
    reset_interfaces: Option<String>,
}

/// An error as Ironic's API shapes it (`error_message`, a JSON text with `faultstring`), and
/// as Paddock's (`error.message`), so either client reads it.
fn ironic_error(e: ApiError) -> Response {
    let fault = json!({"faultstring": e.message, "faultcode": "Client", "debuginfo": null});
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        Json(json!({"error": {"message": e.message}, "error_message": fault.to_string()})),
    )
        .into_response()
}

/// `PATCH /api/v1/nodes/{node}`: Ironic's node PATCH (a JSON patch list, `?reset_interfaces=`).
async fn patch_node(
    State(api): State<Api>,
    Path(ident): Path<String>,
    Query(q): Query<PatchQuery>,
    body: Bytes,
) -> Response {
    let res = async {
        let reset_interfaces = match q.reset_interfaces.as_deref() {
            None => None,
            Some(s) => Some(parse_bool(s).ok_or_else(|| {
                err(
                    400,
                    format!("Invalid value for reset_interfaces: {s}: expected a boolean"),
                )
            })?),
        };
        let ops: Value = serde_json::from_slice(&body)
            .map_err(|e| err(400, format!("Invalid JSON patch: {e}")))?;
        if api.find(&ident).await?.is_none() {
            return Err(err(404, format!("Node {ident} could not be found.")));
        }
        Ok(api.patch_node(&ident, &ops, reset_interfaces).await?)
    }
    .await;
    match res {
        Ok(node) => Json(node_json(&node)).into_response(),
        Err(e) => ironic_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_header() {
        assert_eq!(parse_version(None), Ok(Version(18)));
        assert_eq!(parse_version(Some("latest")), Ok(Version(18)));
        assert_eq!(parse_version(Some("1.5")), Ok(Version(5)));
        assert_eq!(parse_version(Some("1.x")).unwrap_err().status, 400);
        assert_eq!(parse_version(Some("one")).unwrap_err().status, 400);
        assert_eq!(parse_version(Some("1.19")).unwrap_err().status, 406);
        assert_eq!(parse_version(Some("2.0")).unwrap_err().status, 406);
    }

    #[test]
    fn every_kind_has_inspectors_status() {
        let kinds = [
            (ErrorKind::Invalid, 400),
            (ErrorKind::NotFound, 404),
            (ErrorKind::Conflict, 409),
            (ErrorKind::Store, 500),
            (ErrorKind::NotLeader, 503),
        ];
        for (kind, status) in kinds {
            let e = InspectorError::of(kind, "Could not find node r1u1 in cache");
            assert_eq!(
                ApiError::from(e.clone()),
                ApiError::new(status, "Could not find node r1u1 in cache")
            );
        }
    }
}
