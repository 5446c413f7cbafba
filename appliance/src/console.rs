//! The web console (`/ui`): every appliance host serves it. Server-rendered HTML from
//! compile-time-checked `maud` templates, which escape every interpolated value. The machines
//! list and a machine's page update themselves through `/ui/events` (server-sent events, see
//! `console_live.rs`) and one small script embedded in the binary; with JavaScript off every
//! page still reads, and the live ones refresh themselves every 5 s instead.
//!
//! The console gets what it shows through [`Console`], not the HTTP layer's state, so that
//! `http` can route to it without a cycle.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use paddock_dhcp::shell::DhcpService;
use paddock_dominator::SubStatus;
use paddock_imageserver::api::ImageServerState;
use paddock_inspector::node::{Node, iso};
use paddock_inspector::service::{Inspector, TimelineEvent};
use paddock_inventory::IntrospectionData;
use serde_json::Value;

#[path = "console_charts.rs"]
mod charts;
#[path = "console_dashboard.rs"]
mod dashboard;
#[path = "console_images.rs"]
mod images_upload;
#[path = "console_list.rs"]
mod list;
#[path = "console_live.rs"]
mod live;
#[path = "console_machine.rs"]
mod machine;
#[path = "console_nodes.rs"]
mod node_view;
#[path = "console_power.rs"]
mod power_page;
#[path = "console_rules.rs"]
mod rules;
#[path = "console_subs.rs"]
mod subs_forms;

use crate::config::ClusterConfig;
use crate::console_style::bytes;
use crate::dominator::{Dominator, PAUSE, Pause, SUBS, SubControl};
use crate::provisioning::Provisioner;
use crate::pxe_filter::PxeFilter;
use paddock_birther::{Event, Provisioning, State as Prov};

/// What the console reads: the services it shows and this host's place in the appliance.
#[derive(Clone)]
pub struct Console {
    pub inspector: Arc<Inspector>,
    pub dhcp: Option<Arc<DhcpService>>,
    pub filter: Option<Arc<PxeFilter>>,
    pub imageserver: ImageServerState,
    pub leader: crate::leader::LeaderRx,
    /// Several hosts: which one this is, and the etcd cluster.
    pub cluster: Option<ClusterConfig>,
    /// The dominator's census (the leader's) and the store its controls live in.
    pub dominator: Dominator,
    /// Provisioning records and requests (the API's own service).
    pub provisioning: Arc<Provisioner>,
    /// BMCs: the node page's power record and buttons, the throttle on the dashboard.
    pub power: Arc<crate::power::Power>,
    /// The DNS server's zones, for a machine's names (`None`: DNS is off).
    pub dns: Option<crate::dns::DnsHandle>,
    /// The machines' computed files, for the sub page.
    pub computed: Arc<crate::computed::Renderer>,
    /// The role plan, for the dashboard's capacity.
    pub roles: Arc<crate::roles::Roles>,
    /// The dashboard's samples over time (filled by [`sample_every_minute`]).
    pub history: Arc<crate::console_history::History>,
}

/// Takes a sample for the dashboard's charts now and every minute, for as long as the
/// process runs.
pub fn sample_every_minute(console: Console) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(sample) = dashboard::sample(&console).await {
                console.history.record(sample);
            }
        }
    });
}

/// The console's routes under `/ui`.
pub fn router(console: Console) -> Router {
    Router::new()
        .route("/ui/firewall", get(firewall))
        .route("/ui", get(list::nodes))
        .route("/ui/", get(list::nodes))
        .route("/ui/nodes/{node}", get(node))
        .route("/ui/nodes/{node}/provision", post(provision_form))
        .route("/ui/nodes/{node}/reimage", post(reimage_form))
        .route("/ui/nodes/{node}/clean", post(clean_form))
        .route("/ui/nodes/{node}/power", post(power_page::form))
        .route(
            "/ui/nodes/{node}/introspect",
            post(
                |State(s): State<Console>, Path(n): Path<String>, h: axum::http::HeaderMap| {
                    introspection_form(s, n, h, false)
                },
            ),
        )
        .route(
            "/ui/nodes/{node}/abort",
            post(
                |State(s): State<Console>, Path(n): Path<String>, h: axum::http::HeaderMap| {
                    introspection_form(s, n, h, true)
                },
            ),
        )
        .route("/ui/dashboard", get(dashboard::dashboard))
        .route("/ui/events", get(live::events))
        .route("/ui/assets/console.js", get(live::script))
        .route("/ui/rules", get(rules::list).post(rules::create))
        .route("/ui/rules/{uuid}/delete", post(rules::delete))
        .route("/ui/leases", get(leases))
        .route("/ui/images", get(images).post(images_upload::upload))
        .route("/ui/images/{*name}", get(image).post(images_upload::delete))
        .route("/ui/mdb", get(mdb))
        .route("/ui/subs", get(subs).post(subs_forms::all))
        .route("/ui/subs/{hostname}/pause", post(subs_forms::one))
        .route("/ui/subs/{hostname}", get(sub))
        .route("/ui/subs/{hostname}/image", post(set_image))
        .merge(list::bulk_routes())
        .with_state(console)
}

pub(crate) fn page(title: &str, refresh: bool, body: Markup) -> Html<String> {
    page_with(title, refresh, None, body)
}

/// A page that updates itself: `kind` is `list` (any node change) or `node` (changes of
/// `subjects`: the node's UUID and its MACs' timelines). The parts to re-read carry a
/// `data-live-region` attribute.
pub(crate) struct Live {
    kind: &'static str,
    subjects: Vec<String>,
}

pub(crate) fn page_with(
    title: &str,
    refresh: bool,
    live: Option<Live>,
    body: Markup,
) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    @if refresh && live.is_some() {
                        noscript { meta http-equiv="refresh" content="5"; }
                    } @else if refresh {
                        meta http-equiv="refresh" content="5";
                    }
                    title { (title) " · Paddock" }
                    // No favicon request (a 404 the browser would log as an error).
                    link rel="icon" href="data:,";
                    style { (PreEscaped(crate::console_style::STYLE)) }
                    @if live.is_some() { script src="/ui/assets/console.js" defer {} }
                }
                body data-live=[live.as_ref().map(|l| l.kind)]
                    data-subjects=[live.as_ref().map(|l| l.subjects.join(" "))] {
                    a.skip href="#main" { "Skip to content" }
                    nav aria-label="console" {
                        a href="/ui/dashboard" { "Dashboard" }
                        a href="/ui" { "Machines" }
                        a href="/ui/rules" { "Rules" }
                        a href="/ui/leases" { "Leases" }
                        a href="/ui/firewall" { "PXE filter" }
                        a href="/ui/images" { "Images" }
                        a href="/ui/mdb" { "MDB" }
                        a href="/ui/subs" { "Subs" }
                        a href="/ui/roles" { "Roles" }
                        a href="/ui/audit" { "Audit" }
                        a href="/metrics" { "Metrics" }
                        @if live.is_some() { span #live-status role="status" {} }
                    }
                    main #main tabindex="-1" {
                        h1 { (title) }
                        (body)
                    }
                }
            }
        }
        .into_string(),
    )
}

/// A failure reading what a page shows: the status and the error as text.
pub(crate) fn failure(status: StatusCode, error: &str) -> Response {
    (status, html! { (error) }.into_string()).into_response()
}

pub(crate) fn state_cell(n: &Node) -> Markup {
    let s = n.state().map_or("-", |s| s.as_str());
    crate::console_style::badge(s)
}

/// A scheduling property as text (strings without their quotes).
pub(crate) fn prop(n: &Node, k: &str) -> String {
    match n.properties.get(k) {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

pub(crate) fn macs(n: &Node) -> String {
    n.macs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn error_of(n: &Node) -> Option<&str> {
    n.introspection.as_ref().and_then(|i| i.error.as_deref())
}

pub(crate) fn state_name(n: &Node) -> &'static str {
    n.state().map_or("-", |s| s.as_str())
}

/// A value that may be absent (a number the agent did not send, no PXE NIC): `-`.
fn or_dash(n: Option<impl ToString>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

async fn node(State(s): State<Console>, Path(ident): Path<String>) -> Response {
    let v = match s.inspector.find(&ident).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            let body = html! { p { "No node " (ident) "." } };
            return (StatusCode::NOT_FOUND, page("Not found", false, body)).into_response();
        }
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.message),
    };
    let n = &v.node;
    let timeline: Vec<TimelineEvent> = s.inspector.timeline(n).await.unwrap_or_default();
    let data: Option<IntrospectionData> = s
        .inspector
        .data(&n.uuid.to_string(), true)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice::<IntrospectionData>(&b).ok());
    let i = n.introspection.as_ref();
    let provisioning = match s.provisioning.record(n).await {
        Ok((record, rev)) => Some((record, rev == 0)),
        Err(e) => {
            tracing::warn!(node = %n.uuid, error = %e, "console: provisioning record not read");
            None
        }
    };
    let images = list::image_names(&s).await;
    let power = power_page::section(&s, n).await;
    let uuid = n.uuid.to_string();
    let dns_names = s
        .dns
        .as_ref()
        .map(|d| d.names(&[crate::census::node_hostname(n).as_str(), uuid.as_str()]));
    let running = provisioning
        .as_ref()
        .is_some_and(|(r, _)| r.serve().ramdisk_mode().is_some());
    let sub = s
        .dominator
        .census
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&crate::census::node_hostname(n))
        .cloned();
    let run = provisioning
        .as_ref()
        .and_then(|(r, _)| machine::RunProgress::of(r, sub.as_ref()));
    let now_ms = paddock_clock::now().0;
    let at = |secs: Option<i64>| {
        html! { @if let Some(t) = secs { (crate::console_style::when(now_ms, t.saturating_mul(1000))) } }
    };
    let body = html! {
        // A run under way comes first. Its fetch progress lives in the dominator's memory,
        // not the store: the page reads it again every 2 s while the run goes.
        div data-live-region="progress" data-live-poll=[run.is_some().then_some("2000")] {
            @if let Some(run) = &run { (machine::progress(run)) }
        }
        div data-live-region="summary" {
        table #summary {
            tr { th { "UUID" } td { code { (n.uuid) } } }
            tr { th { "State" } td { (state_cell(n)) } }
            @if let Some(e) = error_of(n) { tr { th { "Error" } td class="error" { (e) } } }
            tr { th { "Introspection" } td {
                "started " (at(i.and_then(|i| i.started_at)))
                @if let Some(f) = i.and_then(|i| i.finished_at) { ", finished " (at(Some(f))) }
            } }
            tr { th { "Hardware" } td { (machine::headline(n)) } }
            tr { th { "MACs" } td { code { (macs(n)) } " (PXE " (or_dash(n.pxe_mac)) ")" } }
            tr { th { "BMC" } td { (n.bmc_address.as_deref().unwrap_or("-")) } }
            tr { th { "Traits" } td { (n.traits.join(", ")) } }
            @if let Some(names) = &dns_names {
                tr { th { "DNS names" } td {
                    @if names.is_empty() { "none (no name it can take: see paddock dns zone)" }
                    @for name in names { code { (name) } " " }
                } }
            }
        }
        details {
            summary { "Node properties (JSON)" }
            pre { (serde_json::to_string_pretty(&Value::Object(n.properties.clone())).unwrap_or_default()) }
            p { "Auto-discovered: " (n.auto_discovered) }
        }
        (introspection_forms(n))
        }
        div data-live-region="inventory" {
        @if let Some(data) = &data {
            h2 { "Hardware" }
            (machine::hardware(n, data))
        }
        }
        h2 { "Provisioning" }
        div data-live-region="provisioning" {
        @match &provisioning {
            Some((record, never)) => { (provisioning_body(n.uuid, record, *never, &images)) }
            None => { p.error { "The provisioning record could not be read." } }
        }
        }
        h2 { "Image compliance" }
        div data-live-region="compliance" {
            (machine::compliance(sub.as_ref()))
        }
        h2 { "Power" }
        div data-live-region="power" { (power) }
        h2 { "Timeline" }
        table #timeline data-live-region="timeline" {
            tr { th { "When" } th { "What" } th { "Details" } }
            @for e in &timeline {
                tr class=[e.error.then_some("error")] {
                    td { (crate::console_style::when(now_ms, e.at_ms)) }
                    td { (machine::event_kind(&e.kind, e.error)) }
                    td { (e.message) }
                }
            }
        }
    };
    let mut subjects = vec![n.uuid.to_string()];
    subjects.extend(n.macs.iter().map(|m| format!("mac-{}", m.to_hex())));
    let live = Live {
        kind: "node",
        subjects,
    };
    page_with(&n.label(), n.inspecting() || running, Some(live), body).into_response()
}

/// Start (or start again) and abort an introspection: the forms that apply to the node's
/// state (the state machine refuses the others anyway).
fn introspection_forms(n: &Node) -> Markup {
    html! {
        p {
            @if n.inspecting() {
                form.inline method="post" action={ "/ui/nodes/" (n.uuid) "/abort" } {
                    button type="submit" { "Abort introspection" }
                }
            } @else {
                form.inline method="post" action={ "/ui/nodes/" (n.uuid) "/introspect" } {
                    button type="submit" { "Start introspection" }
                }
            }
            @if crate::power::bmc_of(n).is_some() {
                " " small { "(through its BMC: PXE once, powered on; off when it ends)" }
            } @else {
                " " small { "(no BMC: the machine is inspected at its next PXE boot)" }
            }
        }
    }
}

/// Back to the node's page (303), or the refusal with the API's status and message.
fn node_answer<T>(ident: &str, result: Result<T, paddock_wire::ApiError>) -> Response {
    match result {
        Ok(_) => axum::response::Redirect::to(&format!("/ui/nodes/{ident}")).into_response(),
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            let body = html! {
                p.error { (e.message) }
                p { a href={ "/ui/nodes/" (ident) } { "Back to the node" } }
            };
            (status, page("Refused", false, body)).into_response()
        }
    }
}

/// `POST /ui/nodes/{node}/introspect` (as `POST /v1/introspection/{node}`, with Inspector's
/// `manage_boot` when the node has a BMC: the power engine boots it into the ramdisk; without
/// one, `manage_boot=false`: it is inspected at its next PXE boot) and
/// `POST /ui/nodes/{node}/abort`.
async fn introspection_form(
    s: Console,
    ident: String,
    headers: axum::http::HeaderMap,
    abort: bool,
) -> Response {
    if !same_origin(&headers) {
        return refused_origin();
    }
    let now = paddock_inspector::service::now_secs();
    let r = if abort {
        s.inspector.abort(&ident, now).await
    } else {
        let manage_boot = matches!(
            s.inspector.find(&ident).await,
            Ok(Some(v)) if crate::power::bmc_of(&v.node).is_some()
        );
        s.inspector.start(&ident, manage_boot, now).await
    };
    node_answer(&ident, r.map_err(paddock_wire::ApiError::from))
}

/// What the console's action forms post: the action (where a form has several), the
/// operator's reason (a pause), and `confirm=yes` once a destructive one is confirmed.
#[derive(serde::Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub confirm: String,
}

impl ActionForm {
    pub fn confirmed(&self) -> bool {
        self.confirm == "yes"
    }
}

/// The page that asks to confirm a destructive form: `question`, then a form posting the
/// same `fields` to `action` again with `confirm=yes` (and `extra`: what the operator adds
/// there, such as a reason), and a link back to `back`.
pub(crate) fn confirm_page(
    title: &str,
    question: Markup,
    action: &str,
    fields: &[(&str, &str)],
    extra: Markup,
    button: &str,
    back: &str,
) -> Response {
    let body = html! {
        p { (question) }
        form method="post" action=(action) {
            @for (name, value) in fields {
                input type="hidden" name=(name) value=(value);
            }
            (extra)
            input type="hidden" name="confirm" value="yes";
            button type="submit" { (button) } " "
            a href=(back) { "Cancel" }
        }
    };
    page(title, false, body).into_response()
}

/// Where a form goes once done (303 to `to`), or the API's refusal: its status and message.
fn done_or_refused<T, E: Into<paddock_wire::ApiError>>(to: &str, r: Result<T, E>) -> Response {
    match r {
        Ok(_) => axum::response::Redirect::to(to).into_response(),
        Err(e) => {
            let e: paddock_wire::ApiError = e.into();
            failure(
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
                &e.message,
            )
        }
    }
}

pub(crate) fn refused_origin() -> Response {
    failure(
        StatusCode::FORBIDDEN,
        "a form from another site was refused",
    )
}

/// The node's provisioning: its state, image, last step or failure, and the forms that
/// apply to it (provision when it has no image, re-image when it has one, clean unless it
/// is being cleaned; the state machine refuses the rest anyway). `never`: no record yet.
fn provisioning_body(
    node: uuid::Uuid,
    record: &Provisioning,
    never: bool,
    images: &[String],
) -> Markup {
    let state = record.state.name();
    let (last_step, synced) = match &record.state {
        Prov::Birth(r) | Prov::Rebirth(r) => (r.last_step.map(|s| s.as_str()), Some(r.synced)),
        Prov::Clean { last_step } => (last_step.map(|s| s.as_str()), None),
        _ => (None, None),
    };
    let select = |keep: bool| {
        html! {
            select name="image" {
                @if keep { option value="" { "(the image it has)" } }
                @for i in images {
                    @if Some(i.as_str()) == record.state.image() && !keep {
                        option value=(i) selected { (i) }
                    } @else {
                        option value=(i) { (i) }
                    }
                }
            }
        }
    };
    let provisioned = matches!(record.state, Prov::Healthy { .. } | Prov::Error { .. });
    html! {
        table {
            tr { th { "State" } td {
                (crate::console_style::badge(state))
                @if never { " (never provisioned by Paddock: it boots its local disk)" }
            } }
            tr { th { "Image" } td { (record.state.image().unwrap_or("-")) } }
            tr { th { "Since (UTC)" } td { (ms_iso(i64::try_from(record.since_ms).ok())) } }
            @if let Some(step) = last_step {
                tr { th { "Last step" } td { (step) } }
            }
            @if let Some(synced) = synced {
                tr { th { "Synced" } td { (if synced { "yes" } else { "not yet" }) } }
            }
            @if let Some(started) = record.started_ms {
                tr { th { "Ramdisk up since (UTC)" } td { (ms_iso(i64::try_from(started).ok())) } }
            }
            @if let Prov::Error { operation, step, message, .. } = &record.state {
                tr { th { "Error" } td class="error" {
                    (operation.as_str()) " failed at " (step.as_str()) ": " (message)
                } }
            }
        }
        @if matches!(record.state, Prov::Unknown | Prov::Error { .. }) {
            form method="post" action={ "/ui/nodes/" (node) "/provision" } {
                label { "Image " (select(false)) }
                " " button type="submit" { "Provision" }
            }
        }
        @if provisioned {
            form method="post" action={ "/ui/nodes/" (node) "/reimage" } {
                label { "Image " (select(true)) }
                " " button type="submit" { "Re-image" }
            }
        }
        @if !matches!(record.state, Prov::Clean { .. }) {
            form method="post" action={ "/ui/nodes/" (node) "/clean" } {
                button type="submit" { "Clean (wipe the disk)" }
            }
        }
        p {
            code { "paddock node provision " (node) " --image …" } ", "
            code { "paddock node reimage " (node) " [--image …]" } ", "
            code { "paddock node clean " (node) }
        }
    }
}

#[derive(serde::Deserialize)]
struct NodeImageForm {
    #[serde(default)]
    image: String,
}

/// A provisioning form: refused from another site; else the request through the API's
/// own [`Provisioner::request`], then back to the node's page (303), or the refusal with
/// the API's status and message (409: what the state allows instead).
async fn node_request(
    s: &Console,
    ident: &str,
    headers: &axum::http::HeaderMap,
    event: Event,
) -> Response {
    if !same_origin(headers) {
        return refused_origin();
    }
    match s.provisioning.request(ident, &event).await {
        Ok((node, _)) => node_answer(&node.uuid.to_string(), Ok::<_, paddock_wire::ApiError>(())),
        Err(e) => node_answer::<()>(ident, Err(paddock_wire::ApiError::from(e))),
    }
}

/// `POST /ui/nodes/{node}/provision` (`image=NAME`).
async fn provision_form(
    State(s): State<Console>,
    Path(ident): Path<String>,
    headers: axum::http::HeaderMap,
    axum::Form(f): axum::Form<NodeImageForm>,
) -> Response {
    node_request(
        &s,
        &ident,
        &headers,
        Event::ProvisionRequested { image: f.image },
    )
    .await
}

/// `POST /ui/nodes/{node}/reimage` (`image=NAME`, or empty: the image it has).
async fn reimage_form(
    State(s): State<Console>,
    Path(ident): Path<String>,
    headers: axum::http::HeaderMap,
    axum::Form(f): axum::Form<NodeImageForm>,
) -> Response {
    let image = (!f.image.is_empty()).then_some(f.image);
    node_request(&s, &ident, &headers, Event::ReimageRequested { image }).await
}

/// `POST /ui/nodes/{node}/clean`.
async fn clean_form(
    State(s): State<Console>,
    Path(ident): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    node_request(&s, &ident, &headers, Event::CleanRequested).await
}

/// Which host this is and who leads, as a sentence (the dashboard and the filter page).
fn appliance_sentence(s: &Console) -> String {
    let leads = s.leader.borrow().is_some();
    match &s.cluster {
        None => "one host: this host serves PXE".to_string(),
        Some(c) => format!(
            "host {} of several ({}): {}",
            c.host,
            c.etcd_endpoints.join(", "),
            if leads {
                "this host leads and serves PXE"
            } else {
                "a follower (another host serves PXE)"
            }
        ),
    }
}

async fn firewall(State(s): State<Console>) -> Response {
    let Some(f) = &s.filter else {
        let body = html! {
            p { "The PXE filter is off (" code { "[firewall] enabled = false" } ")." }
        };
        return page("PXE filter", false, body).into_response();
    };
    let st = f.status();
    let who = appliance_sentence(&s);
    let list = |macs: &[paddock_inventory::MacAddr]| {
        macs.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let body = html! {
        table {
            tr { th { "Appliance" } td { (who) } }
            tr { th { "Interface" } td { (st.interface) } }
            tr { th { "Pass rule" } td { (if st.pass { "present: this host answers PXE" } else { "absent: closed" }) } }
            tr { th { "Unknown MACs" } td { (if st.discovery { "allowed (discovery on)" } else { "blocked (discovery off)" }) } }
            tr { th { "Last sync (UTC)" } td { (st.last_sync_ms.map(|ms| iso(ms / 1000)).unwrap_or_default()) } }
            tr { th { "Syncs" } td { (st.syncs) } }
            tr { th { "Drift repaired" } td { (st.drift_repaired) } }
            tr { th { "Last error" } td class="error" { (st.last_error.as_deref().unwrap_or("")) } }
            tr { th { "Allow (" (st.allow.len()) ")" } td { code { (list(&st.allow)) } } }
            tr { th { "Deny (" (st.deny.len()) ")" } td { code { (list(&st.deny)) } } }
        }
    };
    page("PXE filter", true, body).into_response()
}

async fn leases(State(s): State<Console>) -> Response {
    let leases = s.dhcp.as_ref().map(|d| d.leases()).unwrap_or_default();
    let body = html! {
        p data-live-region="lease-count" { (leases.len()) " lease(s)" }
        table #leases data-live-region="leases" {
            tr { th { "IP" } th { "MAC" } th { "State" } th { "Expires (UTC)" } th { "Relay" } }
            @for l in &leases {
                tr {
                    td { (l.ip) }
                    td { code { (l.mac) } }
                    td { (format!("{:?}", l.state)) }
                    td { (iso(i64::try_from(l.expires).unwrap_or(i64::MAX))) }
                    td { (l.relay.as_ref().map(|r| r.giaddr.to_string()).unwrap_or_default()) }
                }
            }
        }
    };
    let live = Live {
        kind: "leases",
        subjects: Vec::new(),
    };
    page_with("DHCP leases", true, Some(live), body).into_response()
}

fn ms_iso(ms: Option<i64>) -> String {
    ms.map(|m| iso(m / 1000)).unwrap_or_else(|| "-".into())
}

/// The button that deletes an image (after a confirmation page).
fn delete_image_form(name: &str) -> Markup {
    html! {
        form.inline method="post" action={ "/ui/images/" (name) } {
            input type="hidden" name="action" value="delete";
            button type="submit" aria-label={ "Delete image " (name) } { "Delete" }
        }
    }
}

async fn images(State(s): State<Console>) -> Response {
    let list = match s.imageserver.images.list().await {
        Ok(l) => l,
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let deleted: Vec<&str> = list
        .iter()
        .filter(|r| r.deleted)
        .map(|r| r.name.as_str())
        .collect();
    let body = html! {
        p { "Add with " code { "paddock image add NAME TARBALL [--filter F] [--triggers T]" } ", or upload a tarball here." }
        form #upload data-upload method="post" action="/ui/images" {
            label { "Name " input type="text" name="name" required placeholder="debian/minbase.2"; }
            " "
            label { "Tarball " input type="file" name="tarball" required accept=".tar,application/x-tar"; }
            " " button type="submit" { "Upload" }
            " " progress #upload-progress value="0" max="100" aria-label="upload progress" hidden {}
            " " span #upload-status role="status" {}
            noscript { p { "Uploading needs JavaScript; the CLI works without it." } }
        }
        div data-live-region="images" {
        table #images {
            tr { th { "Image" } th { "Files" } th { "Bytes" } th { "Objects" } th { "Filter" } th { "Triggers" } th { "Created" } th { "Expires" } th { "Actions" } }
            @for r in list.iter().filter(|r| !r.deleted) {
                tr data-image=(r.name) {
                    td { a href={ "/ui/images/" (r.name) } { (r.name) } }
                    td { (r.files) }
                    td { (bytes(r.bytes)) }
                    td { (r.objects) }
                    td { (r.filter.as_ref().map_or("sparse (no filter)".to_string(), |f| format!("{} line(s)", f.lines().len()))) }
                    td { (r.triggers.list().len()) }
                    td { (ms_iso(Some(r.created_on_ms))) }
                    td { (ms_iso(r.expires_at_ms)) }
                    td { (delete_image_form(&r.name)) }
                }
            }
        }
        h2 { "Retired names" }
        p { (if deleted.is_empty() { "none".to_string() } else { deleted.join(", ") }) }
        }
    };
    let live = Live {
        kind: "images",
        subjects: Vec::new(),
    };
    page_with("Images", false, Some(live), body).into_response()
}

async fn image(State(s): State<Console>, Path(name): Path<String>) -> Response {
    let d = match s.imageserver.images.show(&name).await {
        Ok(d) => d,
        Err(e) => {
            // The image server's API gives its errors their status.
            let e = paddock_wire::ApiError::from(e);
            let status =
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return failure(status, &e.message);
        }
    };
    let r = &d.record;
    let flags = |t: &paddock_image::Trigger| {
        [
            (t.do_reload, "reload"),
            (t.do_reboot, "reboot"),
            (t.high_impact, "high impact"),
        ]
        .iter()
        .filter(|x| x.0)
        .map(|x| x.1)
        .collect::<Vec<_>>()
        .join(", ")
    };
    let body = html! {
        table {
            tr { th { "Files" } td { (r.files) } }
            tr { th { "Bytes" } td { (bytes(r.bytes)) } }
            tr { th { "Objects" } td {
                (r.objects) ": " (d.unique_objects) " only in this image (" (bytes(d.unique_bytes)) "), "
                (d.shared_objects) " shared with other images (" (bytes(d.shared_bytes)) "), "
                (d.missing_objects) " missing"
            } }
            tr { th { "Created" } td { (ms_iso(Some(r.created_on_ms))) " by " (if r.created_by.is_empty() { "-" } else { &r.created_by }) } }
            tr { th { "Expires" } td { (ms_iso(r.expires_at_ms)) } }
            tr { th { "Deleted" } td { (if r.deleted { ms_iso(r.deleted_on_ms) } else { "no".into() }) } }
        }
        @if !r.deleted { p { (delete_image_form(&name)) } }
        h2 { "Filter" }
        pre { (r.filter.as_ref().map_or("(none: a sparse image)".to_string(), |f| f.lines().join("\n"))) }
        h2 { "Triggers" }
        table {
            tr { th { "Service" } th { "Match" } th { "Flags" } }
            @for t in r.triggers.list() {
                tr { td { (t.service) } td { code { (t.match_lines.join(" ")) } } td { (flags(t)) } }
            }
        }
    };
    page(&format!("Image {name}"), false, body).into_response()
}

/// `GET /ui/mdb?q=&page=`: the MDB's machines, a page at a time.
#[derive(Default, serde::Deserialize)]
struct MdbQuery {
    /// Words every shown machine matches (hostname, address, images, tags).
    #[serde(default)]
    q: String,
    #[serde(default)]
    page: Option<usize>,
}

async fn mdb(
    State(s): State<Console>,
    axum::extract::Query(q): axum::extract::Query<MdbQuery>,
) -> Response {
    let entries = match s.imageserver.mdb.entries().await {
        Ok(e) => e,
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let words: Vec<String> =
        q.q.split_whitespace()
            .map(str::to_ascii_lowercase)
            .collect();
    let matching: Vec<_> = entries
        .values()
        .filter(|e| {
            let m = &e.machine;
            let mut hay = format!(
                "{} {} {} {} {}",
                m.hostname,
                m.ip_address,
                m.required_image,
                m.planned_image,
                m.tags
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            hay.make_ascii_lowercase();
            words.iter().all(|w| hay.contains(w.as_str()))
        })
        .collect();
    let pages = matching.len().div_ceil(list::PER_PAGE).max(1);
    let page_no = q.page.unwrap_or(1).clamp(1, pages);
    let link = |p: usize| format!("/ui/mdb?q={}&page={p}", list::query_value(&q.q));
    let st = s.imageserver.mdb.status();
    let body = html! {
        p {
            @match &st.path {
                None => {
                    "No MDB file is configured (" code { "[images] mdb_file" } "); machines come from the API and enrolment."
                }
                Some(path) => {
                    "File " code { (path) } ": " (st.machines) " machine(s), last loaded " (ms_iso(st.last_load_ms))
                    @if let Some(e) = &st.last_error { " — " span class="error" { (e) } }
                }
            }
        }
        form.filter method="get" action="/ui/mdb" role="search" {
            label { "Search " input type="search" name="q" value=(q.q) placeholder="hostname, address, image, tag"; }
            button type="submit" { "Show" }
        }
        p { (matching.len()) " of " (entries.len()) " machine(s)" @if pages > 1 { ", page " (page_no) " of " (pages) } }
        table #mdb {
            tr { th { "Hostname" } th { "IpAddress" } th { "RequiredImage" } th { "PlannedImage" } th { "Updates" } th { "Tags" } th { "Source" } }
            @for e in matching.iter().skip((page_no - 1) * list::PER_PAGE).take(list::PER_PAGE) {
                @let m = &e.machine;
                tr {
                    td { (m.hostname) }
                    td { (m.ip_address) }
                    td { (m.required_image) }
                    td { (m.planned_image) }
                    td { (if m.disable_updates { "disabled" } else { "" }) }
                    td { (m.tags.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")) }
                    td { (format!("{:?}", e.source)) }
                }
            }
        }
        @if pages > 1 {
            p.pages {
                @if page_no > 1 { a rel="prev" href=(link(page_no - 1)) { "← previous" } }
                span { "page " (page_no) " of " (pages) }
                @if page_no < pages { a rel="next" href=(link(page_no + 1)) { "next →" } }
            }
        }
    };
    page("MDB", true, body).into_response()
}

/// What the subs pages know of the dominator besides the census.
struct DominatorView {
    enabled: bool,
    leading: bool,
    pause: Option<Pause>,
}

/// Reads a JSON record of the dominator's controls (`None` when absent or unreadable).
async fn control<T: serde::de::DeserializeOwned>(
    d: &Dominator,
    key: &str,
) -> Result<Option<T>, Response> {
    match d.store.get(key).await {
        Ok(kv) => Ok(kv.and_then(|kv| serde_json::from_slice(&kv.value).ok())),
        Err(e) => Err(failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())),
    }
}

async fn dominator_view(d: &Dominator) -> Result<DominatorView, Response> {
    let leading = d.leader.borrow().is_some();
    Ok(DominatorView {
        enabled: d.enabled,
        leading,
        pause: control(d, PAUSE).await?,
    })
}

/// The banners above the subs pages: disabled, not leading, paused (with the reason).
fn dominator_banners(v: &DominatorView) -> Markup {
    html! {
        @if !v.enabled {
            p.banner { "The dominator is off (" code { "[dominator] enabled = false" } ")." }
        } @else if !v.leading {
            p.banner { "This host does not lead: the subs' states are the leader's; open its console." }
        }
        @if let Some(p) = &v.pause {
            p.banner {
                strong { "The dominator is paused" } " since " (ms_iso(Some(p.at_ms))) " UTC: " (p.reason)
                " — every update is held (" code { "paddock dominator resume" } ")."
            }
        }
    }
}

fn sub_state(s: &SubStatus) -> Markup {
    crate::console_style::badge(s.state.name())
}

/// The compliance overview: subs per state, then every sub; machines without a required
/// image (enrolled, never given one: no subd to keep) are named apart, not as subs.
fn subs_body(v: &DominatorView, all: &[SubStatus]) -> Markup {
    let (idle, subs): (Vec<&SubStatus>, Vec<&SubStatus>) = all
        .iter()
        .partition(|s| matches!(s.state, paddock_dominator::SubState::NoImage));
    let mut counts = std::collections::BTreeMap::new();
    for s in &subs {
        *counts.entry(s.state.name()).or_insert(0usize) += 1;
    }
    let synced = counts.get("synced").copied().unwrap_or(0);
    html! {
        (dominator_banners(v))
        (subs_forms::pause_form("/ui/subs", v.pause.is_some(), "all updates"))
        p { (synced) " of " (subs.len()) " sub(s) synced to their required image." }
        table {
            tr { th { "State" } th { "Subs" } }
            @for (state, n) in &counts {
                tr { td { (crate::console_style::badge(state)) } td { (n) } }
            }
        }
        h2 { "Subs" }
        table {
            tr { th { "Hostname" } th { "Address" } th { "Required image" } th { "State" } th { "Summary" } th { "Failures" } }
            @for s in &subs {
                tr {
                    td { a href={ "/ui/subs/" (s.hostname) } { (s.hostname) } }
                    td { code { (s.address) } }
                    td { (s.required_image.as_deref().unwrap_or("-")) }
                    td { (sub_state(s)) }
                    td { (s.summary) }
                    td { (s.failures) }
                }
            }
        }
        @if !idle.is_empty() {
            p.muted {
                (idle.len()) " machine(s) in the MDB have no required image (nothing to keep them on): "
                @for (k, s) in idle.iter().enumerate() {
                    @if k > 0 { ", " }
                    a href={ "/ui/subs/" (s.hostname) } { (s.hostname) }
                }
            }
        }
    }
}

fn census(d: &Dominator) -> Vec<SubStatus> {
    d.census
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect()
}

async fn subs(State(s): State<Console>) -> Response {
    let v = match dominator_view(&s.dominator).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let subs = census(&s.dominator);
    page(
        &format!("Subs ({})", subs.len()),
        true,
        subs_body(&v, &subs),
    )
    .into_response()
}

/// One sub: its state with the reason, and what operators decided for it.
fn sub_body(
    v: &DominatorView,
    s: &SubStatus,
    c: &SubControl,
    images: &[String],
    files: &[crate::computed::FileStatus],
) -> Markup {
    let now = paddock_wire::unix_ms();
    html! {
        (dominator_banners(v))
        table {
            tr { th { "Address" } td { code { (s.address) } } }
            tr { th { "Required image" } td { (s.required_image.as_deref().unwrap_or("-")) } }
            tr { th { "State" } td { (sub_state(s)) } }
            tr { th { "Summary" } td { (s.summary) } }
            tr { th { "Failures" } td { (s.failures) } }
            tr { th { "Paused" } td { (c.paused.as_deref().unwrap_or("no")) } }
            tr { th { "Safety clearances" } td { (c.safety_clearance) } }
        }
        form method="post" action={ "/ui/subs/" (s.hostname) "/image" } {
            label { "Required image " select name="image" {
                @for i in images {
                    @if Some(i.as_str()) == s.required_image.as_deref() {
                        option value=(i) selected { (i) }
                    } @else {
                        option value=(i) { (i) }
                    }
                }
            } }
            " " button type="submit" { "Set" }
        }
        (subs_forms::pause_form(&format!("/ui/subs/{}/pause", s.hostname), c.paused.is_some(), "this sub's updates"))
        @if !files.is_empty() {
            h2 { "Computed files" }
            table {
                tr { th { "Path" } th { "Made from" } th { "Object" } th { "Bytes" } th { "Since" } }
                @for f in files {
                    tr {
                        td { code { (f.path) } }
                        td {
                            (f.source)
                            @if let Some(r) = &f.role { " (role " (r) ")" }
                        }
                        @match &f.error {
                            Some(e) => td.error colspan="3" { "cannot be made: " (e) },
                            None => {
                                td { code { (f.object.map(|o| o.short()).unwrap_or_default()) } }
                                td { (f.size) }
                                td { (crate::console_style::when(now, f.since_ms)) }
                            },
                        }
                    }
                }
            }
        }
        p {
            code { "paddock sub update " (s.hostname) " --image …" } ", "
            code { "paddock sub pause " (s.hostname) " --reason …" } ", "
            code { "paddock sub resume " (s.hostname) } ", "
            code { "paddock sub clear-safety " (s.hostname) } ", "
            code { "paddock sub files " (s.hostname) }
        }
    }
}

async fn sub(State(s): State<Console>, Path(hostname): Path<String>) -> Response {
    let v = match dominator_view(&s.dominator).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let found = s
        .dominator
        .census
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&hostname)
        .cloned();
    let Some(st) = found else {
        let body = html! {
            (dominator_banners(&v))
            p { "No sub " (hostname) " in the census: it is not in the MDB with an address, or this host does not lead." }
        };
        return (StatusCode::NOT_FOUND, page("Not found", false, body)).into_response();
    };
    let c: SubControl = match control(&s.dominator, &format!("{SUBS}{hostname}")).await {
        Ok(c) => c.unwrap_or_default(),
        Err(r) => return r,
    };
    let images: Vec<String> = match s.dominator.images.list().await {
        Ok(l) => l
            .into_iter()
            .filter(|r| !r.deleted)
            .map(|r| r.name)
            .collect(),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let files = s.computed.files(&hostname);
    page(
        &format!("Sub {hostname}"),
        true,
        sub_body(&v, &st, &c, &images, &files),
    )
    .into_response()
}

#[derive(serde::Deserialize)]
struct ImageForm {
    image: String,
}

/// A request from this console's own pages: an extractor that refuses any other site's
/// (403, nothing done) before the handler runs, so a form handler cannot forget to check.
pub struct SameOrigin;

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SameOrigin {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Response> {
        if same_origin(&parts.headers) {
            Ok(SameOrigin)
        } else {
            Err(refused_origin())
        }
    }
}

/// A console form post about one thing (`/ui/…/{thing}/…`): the thing the path names and
/// the form, from this console's own pages (another site's post is refused, 403, before the
/// handler runs and before its body is read).
pub struct ActionPost {
    pub target: String,
    pub form: ActionForm,
}

impl<S: Send + Sync> axum::extract::FromRequest<S> for ActionPost {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Response> {
        use axum::extract::FromRequestParts;
        let (mut parts, body) = req.into_parts();
        SameOrigin::from_request_parts(&mut parts, state).await?;
        let Path(target) = Path::<String>::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let req = axum::extract::Request::from_parts(parts, body);
        let axum::Form(form) = axum::Form::<ActionForm>::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(ActionPost { target, form })
    }
}

/// A form post from another site is refused: a page elsewhere must not be able to re-image
/// machines through an operator's browser.
pub(crate) fn same_origin(headers: &axum::http::HeaderMap) -> bool {
    crate::browser::same_origin(headers)
}

/// `POST /ui/subs/{hostname}/image` (`image=NAME`): the sub's RequiredImage, then back to
/// its page.
async fn set_image(
    State(s): State<Console>,
    Path(hostname): Path<String>,
    headers: axum::http::HeaderMap,
    axum::Form(f): axum::Form<ImageForm>,
) -> Response {
    if !same_origin(&headers) {
        return refused_origin();
    }
    let r = crate::dominator::set_required_image(&s.dominator, &hostname, &f.image).await;
    done_or_refused(&format!("/ui/subs/{hostname}"), r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_everywhere_it_lands() {
        let hostile = r#"<script>alert("x&y")</script>'"#;
        let html = page(hostile, false, html! { p { (hostile) } }).0;
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;"),
            "{html}"
        );
    }

    /// The node page's provisioning part: the state with its details, and the forms that
    /// apply, each posting to the node's own route; text from the network is escaped.
    #[test]
    fn the_provisioning_part_of_the_node_page() {
        use paddock_birther::state::Run;
        use paddock_birther::{Operation, Step};
        let node = uuid::Uuid::from_u128(0x0b6c_2a4e_0000_0000_0000_0000_0000_0001);
        let images = ["debian/a".to_string(), "debian/b".to_string()];
        let record = |state| Provisioning {
            state,
            since_ms: 1_700_000_000_000,
            updated_ms: 1_700_000_000_000,
            started_ms: None,
        };
        let forms = |html: &str| {
            ["provision", "reimage", "clean"]
                .into_iter()
                .filter(|f| html.contains(&format!(r#"action="/ui/nodes/{node}/{f}""#)))
                .collect::<Vec<_>>()
        };
        let never = provisioning_body(node, &record(Prov::Unknown), true, &images).into_string();
        assert!(never.contains("never provisioned by Paddock"), "{never}");
        assert_eq!(forms(&never), ["provision", "clean"]);
        assert!(
            never.contains(r#"<option value="debian/b">debian/b</option>"#),
            "{never}"
        );

        let mut birth = record(Prov::Birth(Run {
            image: "debian/a".into(),
            previous_image: None,
            last_step: Some(Step::Register),
            synced: false,
        }));
        birth.started_ms = Some(1_700_000_000_000);
        let html = provisioning_body(node, &birth, false, &images).into_string();
        for text in [
            "birth",
            "debian/a",
            "register",
            "not yet",
            "Ramdisk up since",
        ] {
            assert!(html.contains(text), "{text}: {html}");
        }
        assert_eq!(forms(&html), ["clean"]);

        let healthy = record(Prov::Healthy {
            image: "debian/a".into(),
        });
        let html = provisioning_body(node, &healthy, false, &images).into_string();
        assert_eq!(forms(&html), ["reimage", "clean"]);
        assert!(
            html.contains(r#"<option value="">(the image it has)</option>"#),
            "{html}"
        );

        let hostile = r#"<script>alert("x")</script>"#;
        let failed = record(Prov::Error {
            operation: Operation::Birth,
            step: Step::Partition,
            message: format!("sfdisk said {hostile}"),
            image: Some("debian/a".into()),
        });
        let html = provisioning_body(node, &failed, false, &images).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("birth failed at partition: sfdisk said &lt;script&gt;"),
            "{html}"
        );
        assert_eq!(forms(&html), ["provision", "reimage", "clean"]);
        let cleaning = record(Prov::Clean { last_step: None });
        let html = provisioning_body(node, &cleaning, false, &images).into_string();
        assert!(forms(&html).is_empty(), "{html}");
    }

    #[test]
    fn the_subs_page_escapes_what_subs_said() {
        use paddock_dominator::SubState;
        let hostile = r#"<script>alert("x&y")</script>"#;
        let st = crate::dominator::test_sub(
            "web-1",
            SubState::Unreachable {
                error: hostile.into(),
            },
        );
        let synced = crate::dominator::test_sub(
            "web-2",
            SubState::Synced {
                image: "debian/minbase.1".into(),
            },
        );
        let v = DominatorView {
            enabled: true,
            leading: true,
            pause: Some(Pause {
                reason: format!("freeze {hostile}"),
                at_ms: 0,
            }),
        };
        let html = page("Subs", true, subs_body(&v, &[st.clone(), synced])).0;
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("unreachable: &lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;"),
            "{html}"
        );
        assert!(html.contains("The dominator is paused"), "{html}");
        assert!(html.contains("freeze &lt;script&gt;"), "{html}");
        assert!(html.contains("1 of 2 sub(s) synced"), "{html}");
        assert!(
            html.contains(r#"<a href="/ui/subs/web-1">web-1</a>"#),
            "{html}"
        );
        assert!(html.contains(r#"<a href="/ui/subs">Subs</a>"#), "{html}");
        let files = [
            crate::computed::FileStatus {
                path: "/etc/hostname".into(),
                role: None,
                source: "template hostname.j2".into(),
                object: Some(paddock_image::ObjectId::of(b"web-1\n")),
                size: 6,
                since_ms: 0,
                error: None,
            },
            crate::computed::FileStatus {
                path: "/etc/app/<b>".into(),
                role: Some("app".into()),
                source: "template app.j2".into(),
                object: None,
                size: 0,
                since_ms: 0,
                error: Some(format!("app.j2:2: undefined variable {hostile}")),
            },
        ];
        let one =
            sub_body(&v, &st, &SubControl::default(), &["minbase".into()], &files).into_string();
        assert!(!one.contains("<script>") && !one.contains("<b>"), "{one}");
        assert!(one.contains("&lt;script&gt;"), "{one}");
        assert!(one.contains("<h2>Computed files</h2>"), "{one}");
        assert!(one.contains("template app.j2 (role app)"), "{one}");
        assert!(
            one.contains("cannot be made: app.j2:2: undefined variable &lt;script&gt;"),
            "{one}"
        );
    }
}
