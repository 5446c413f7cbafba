//! The machines list (`/ui`) and its bulk actions (`POST /ui/nodes/bulk`). The list reads
//! the in-memory node view, filters by words, introspection state and provisioning state
//! (all kept in the URL), and shows a page of machines with their state, provisioning and
//! image, compliance, power and hardware. Machines are picked with checkboxes for an action
//! on all of them (power, introspect, provision or re-image with an image picker, clean):
//! confirmed on a page that names them, then done one by one through the same services as
//! the single-machine forms, with each machine's outcome shown.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use paddock_birther::{Event, Provisioning};
use paddock_inspector::node::Node;

use super::{
    Console, Live, confirm_page, dashboard, failure, macs, node_view, page, page_with, prop,
    refused_origin, same_origin, state_cell, state_name,
};
use crate::console_style::badge;

/// `GET /ui?q=&state=&prov=&page=`: the machines, newest first, a page at a time.
#[derive(Debug, Default, serde::Deserialize)]
pub struct NodesQuery {
    /// Words every shown machine matches (name, UUID, MAC, BMC, trait, architecture).
    #[serde(default)]
    pub q: String,
    /// Only machines in this introspection state (empty: any).
    #[serde(default)]
    pub state: String,
    /// Only machines in this provisioning state (empty: any).
    #[serde(default)]
    pub prov: String,
    /// 1-based.
    #[serde(default)]
    pub page: Option<usize>,
}

/// Machines per page.
pub const PER_PAGE: usize = 50;

/// The most machines one bulk action takes.
pub const MAX_BULK: usize = 1000;

/// Whether `n` matches every word of the search (case-insensitively).
fn matches_search(n: &Node, words: &[String]) -> bool {
    if words.is_empty() {
        return true;
    }
    let mut hay = format!(
        "{} {} {} {} {} {}",
        n.label(),
        n.uuid,
        macs(n),
        n.bmc_address.as_deref().unwrap_or(""),
        n.traits.join(" "),
        prop(n, "cpu_arch")
    );
    hay.make_ascii_lowercase();
    words.iter().all(|w| hay.contains(w.as_str()))
}

/// The machines list's selection: the page asked for (clamped) of the machines matching the
/// query, newest first (then by UUID, so pages are stable), with the number matching and the
/// count of every state among all machines (for the filter).
pub struct Selection {
    /// The page's machines (copied: 50 at most).
    pub shown: Vec<Node>,
    pub matching: usize,
    pub page: usize,
    pub pages: usize,
    pub states: BTreeMap<&'static str, usize>,
}

/// `prov`: every machine's provisioning state, when the query filters by one.
pub fn select_nodes(
    mut nodes: Vec<&Node>,
    q: &NodesQuery,
    prov: Option<&BTreeMap<uuid::Uuid, &'static str>>,
) -> Selection {
    nodes.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.uuid.cmp(&b.uuid)));
    let words: Vec<String> =
        q.q.split_whitespace()
            .map(str::to_ascii_lowercase)
            .collect();
    let mut states = BTreeMap::new();
    let mut matching = Vec::new();
    for n in nodes {
        *states.entry(state_name(n)).or_insert(0) += 1;
        let prov_ok = match prov {
            Some(p) if !q.prov.is_empty() => p.get(&n.uuid).copied().unwrap_or("unknown") == q.prov,
            _ => true,
        };
        if (q.state.is_empty() || q.state == state_name(n)) && prov_ok && matches_search(n, &words)
        {
            matching.push(n);
        }
    }
    let pages = matching.len().div_ceil(PER_PAGE).max(1);
    let page = q.page.unwrap_or(1).clamp(1, pages);
    let total = matching.len();
    let shown = matching
        .into_iter()
        .skip((page - 1) * PER_PAGE)
        .take(PER_PAGE)
        .cloned()
        .collect();
    Selection {
        shown,
        matching: total,
        page,
        pages,
        states,
    }
}

/// Percent-encodes a query value (everything but RFC 3986's unreserved characters).
pub fn query_value(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn nodes_link(q: &NodesQuery, page: usize) -> String {
    format!(
        "/ui?q={}&state={}&prov={}&page={page}",
        query_value(&q.q),
        query_value(&q.state),
        query_value(&q.prov)
    )
}

/// What a row shows besides the node itself: its provisioning record, power state and sub.
#[derive(Default)]
pub struct Row {
    pub provisioning: Option<Provisioning>,
    pub power: Option<String>,
    /// The sub's state name and summary (none: the machine runs no subd the dominator knows).
    pub sub: Option<(&'static str, String)>,
}

/// The provisioning states an operator filters by.
const PROV_STATES: [&str; 6] = ["unknown", "birth", "healthy", "rebirth", "clean", "error"];

/// Memory in GiB from the node's `memory_mb` property.
fn memory(n: &Node) -> String {
    n.properties
        .get("memory_mb")
        .and_then(serde_json::Value::as_u64)
        .map_or_else(
            || "-".into(),
            |mb| crate::console_style::bytes(mb.saturating_mul(1 << 20)),
        )
}

pub fn nodes_body(
    all: usize,
    sel: &Selection,
    q: &NodesQuery,
    rows: &BTreeMap<uuid::Uuid, Row>,
    images: &[String],
) -> Markup {
    let none = Row::default();
    html! {
        form.filter method="get" action="/ui" role="search" {
            label { "Search " input type="search" name="q" value=(q.q) placeholder="name, UUID, MAC, trait…"; }
            label { "State " select name="state" {
                option value="" { "any" }
                @for (st, n) in &sel.states {
                    option value=(st) selected[q.state == *st] { (st) " (" (n) ")" }
                }
            } }
            label { "Provisioning " select name="prov" {
                option value="" { "any" }
                @for st in PROV_STATES {
                    option value=(st) selected[q.prov == st] { (st) }
                }
            } }
            button type="submit" { "Show" }
        }
        form #bulk method="post" action="/ui/bulk/power-on" {
            div.bulk role="group" aria-label="bulk actions" {
                span { "The ticked machines (each asks to confirm): " }
                @for (value, text) in BulkAction::CHOICES {
                    button type="submit" formaction={ "/ui/bulk/" (value) } { (text) }
                }
                label { "Image " select name="image" {
                    option value="" { "(the image it has)" }
                    @for i in images { option value=(i) { (i) } }
                } }
            }
            div data-live-region="nodes" {
                @if all == 0 {
                    p { "No nodes yet. Power on a machine on the provisioning network: it enrols itself." }
                } @else {
                    p #node-count {
                        (sel.matching) " of " (all) " machine(s)"
                        @if sel.pages > 1 { ", page " (sel.page) " of " (sel.pages) }
                        " · "
                        @for (i, (st, n)) in sel.states.iter().enumerate() {
                            @if i > 0 { ", " }
                            (badge(st)) " " (n)
                        }
                    }
                    table #nodes {
                        tr {
                            th { input type="checkbox" data-select-all aria-label="select every machine on this page"; }
                            th { "Node" } th { "State" } th { "Provisioning" } th { "Compliance" } th { "Power" }
                            th { "CPUs" } th { "Memory" } th { "Disk GiB" } th { "NICs" } th { "Arch" }
                        }
                        @for n in &sel.shown {
                            @let row = rows.get(&n.uuid).unwrap_or(&none);
                            tr data-node=(n.uuid) {
                                td { input type="checkbox" name="node" value=(n.uuid) aria-label={ "select " (n.label()) }; }
                                td { a href={ "/ui/nodes/" (n.uuid) } { (n.label()) } }
                                td {
                                    (state_cell(n))
                                    @if let Some(e) = super::error_of(n) { div.error.why { (e) } }
                                }
                                td.prov {
                                    @match &row.provisioning {
                                        Some(p) => {
                                            (badge(p.state.name()))
                                            @if let Some(image) = p.state.image() { " " code { (image) } }
                                        }
                                        None => { (badge("unknown")) }
                                    }
                                }
                                td {
                                    @match &row.sub {
                                        Some((state, summary)) => { span title=(summary) { (badge(state)) } }
                                        None => { span.muted { "no subd" } }
                                    }
                                }
                                td { (row.power.as_deref().unwrap_or("-")) }
                                td { (prop(n, "cpus")) }
                                td { (memory(n)) }
                                td { (prop(n, "local_gb")) }
                                td { (n.macs.len()) }
                                td { (prop(n, "cpu_arch")) }
                            }
                        }
                    }
                    @if sel.pages > 1 {
                        p.pages {
                            @if sel.page > 1 { a rel="prev" href=(nodes_link(q, sel.page - 1)) { "← newer" } }
                            span { "page " (sel.page) " of " (sel.pages) }
                            @if sel.page < sel.pages { a rel="next" href=(nodes_link(q, sel.page + 1)) { "older →" } }
                        }
                    }
                }
            }
        }
    }
}

/// Every machine's provisioning state (a record's absence: `unknown`).
async fn provisioning_states(
    s: &Console,
) -> Result<BTreeMap<uuid::Uuid, &'static str>, paddock_store::StoreError> {
    Ok(dashboard::records(s)
        .await?
        .into_iter()
        .map(|(u, r)| (u, r.state.name()))
        .collect())
}

/// The rows' extras for the machines shown: each read on its own (a page is 50 machines).
async fn rows_of(s: &Console, shown: &[Node]) -> BTreeMap<uuid::Uuid, Row> {
    let census = &s.dominator.census;
    let reads = shown.iter().map(|n| async move {
        let provisioning = s.provisioning.record(n).await.ok().map(|(r, _)| r);
        let power = s.power.record(n.uuid).await.state;
        let sub = census
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&crate::census::node_hostname(n))
            .map(|st| (st.state.name(), st.summary.clone()));
        (
            n.uuid,
            Row {
                provisioning,
                power,
                sub,
            },
        )
    });
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .collect()
}

/// The images a machine may be given (not deleted), for the pickers.
pub async fn image_names(s: &Console) -> Vec<String> {
    s.imageserver
        .images
        .list()
        .await
        .map(|l| {
            l.into_iter()
                .filter(|r| !r.deleted)
                .map(|r| r.name)
                .collect()
        })
        .unwrap_or_default()
}

/// `GET /ui`.
pub async fn nodes(
    State(s): State<Console>,
    axum::extract::Query(q): axum::extract::Query<NodesQuery>,
) -> Response {
    let prov = if q.prov.is_empty() {
        None
    } else {
        match provisioning_states(&s).await {
            Ok(p) => Some(p),
            Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        }
    };
    // The in-memory view (console_nodes.rs); the store itself until its first load is done.
    let view = node_view::view(&s.dominator.store);
    let (all, sel) = if view.ready(std::time::Duration::from_secs(2)).await {
        view.with(|nodes| (nodes.len(), select_nodes(nodes, &q, prov.as_ref())))
    } else {
        let stored = match s.inspector.list().await {
            Ok(n) => n,
            Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.message),
        };
        (
            stored.len(),
            select_nodes(stored.iter().collect(), &q, prov.as_ref()),
        )
    };
    let rows = rows_of(&s, &sel.shown).await;
    let images = image_names(&s).await;
    let live = Live {
        kind: "list",
        subjects: Vec::new(),
    };
    page_with(
        "Machines",
        true,
        Some(live),
        nodes_body(all, &sel, &q, &rows, &images),
    )
    .into_response()
}

/// What a bulk action does to each machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkAction {
    PowerOn,
    PowerOff,
    PowerCycle,
    Introspect,
    Provision,
    Reimage,
    Clean,
}

impl BulkAction {
    /// The form's values and what the picker says, in its order.
    pub const CHOICES: [(&'static str, &'static str); 7] = [
        ("power-on", "Power on"),
        ("power-off", "Power off"),
        ("power-cycle", "Power cycle"),
        ("introspect", "Introspect"),
        ("provision", "Provision with the image"),
        ("reimage", "Re-image"),
        ("clean", "Clean (wipe the disks)"),
    ];

    fn parse(s: &str) -> Option<BulkAction> {
        Some(match s {
            "power-on" => BulkAction::PowerOn,
            "power-off" => BulkAction::PowerOff,
            "power-cycle" => BulkAction::PowerCycle,
            "introspect" => BulkAction::Introspect,
            "provision" => BulkAction::Provision,
            "reimage" => BulkAction::Reimage,
            "clean" => BulkAction::Clean,
            _ => return None,
        })
    }

    fn value(self) -> &'static str {
        Self::CHOICES[self as usize].0
    }

    fn text(self) -> &'static str {
        Self::CHOICES[self as usize].1
    }
}

/// Why a bulk action's form was refused (nothing was done).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BulkError {
    #[error("no action called {0:?}")]
    Action(String),
    #[error("no machine selected: tick the machines first")]
    NoMachine,
    #[error("{0} machines selected; one action takes at most {MAX_BULK}")]
    TooMany(usize),
    #[error("provisioning needs an image: pick one")]
    NoImage,
}

/// A bulk action's form, read.
#[derive(Debug, PartialEq, Eq)]
pub struct Bulk {
    pub nodes: Vec<String>,
    pub action: BulkAction,
    pub image: String,
    pub confirmed: bool,
}

impl Bulk {
    /// Reads the action (the route's last segment) and the form (`node=…` repeated,
    /// `image`, `confirm`): a clear error for an unknown action, no machine, too many, or a
    /// provision without an image.
    pub fn parse(action: &str, body: &[u8]) -> Result<Bulk, BulkError> {
        let action =
            BulkAction::parse(action).ok_or_else(|| BulkError::Action(action.to_string()))?;
        let mut nodes = Vec::new();
        let (mut image, mut confirmed) = (String::new(), false);
        for (k, v) in form_urlencoded::parse(body) {
            match &*k {
                "node" => nodes.push(v.into_owned()),
                "image" => image = v.into_owned(),
                "confirm" => confirmed = v == "yes",
                _ => {}
            }
        }
        if nodes.is_empty() {
            return Err(BulkError::NoMachine);
        }
        if nodes.len() > MAX_BULK {
            return Err(BulkError::TooMany(nodes.len()));
        }
        nodes.sort();
        nodes.dedup();
        if action == BulkAction::Provision && image.is_empty() {
            return Err(BulkError::NoImage);
        }
        Ok(Bulk {
            nodes,
            action,
            image,
            confirmed,
        })
    }
}

/// Does the action to one machine; the error as the API would say it.
async fn one(s: &Console, ident: &str, b: &Bulk) -> Result<(), paddock_wire::ApiError> {
    use crate::power::Action as Power;
    let power = |a| async move { s.power.act(ident, a).await.map(|_| ()) };
    let request = |e: Event| async move {
        s.provisioning
            .request(ident, &e)
            .await
            .map(|_| ())
            .map_err(paddock_wire::ApiError::from)
    };
    match b.action {
        BulkAction::PowerOn => power(Power::On).await,
        BulkAction::PowerOff => power(Power::Off).await,
        BulkAction::PowerCycle => power(Power::Cycle).await,
        BulkAction::Introspect => {
            let manage_boot = matches!(
                s.inspector.find(ident).await,
                Ok(Some(v)) if crate::power::bmc_of(&v.node).is_some()
            );
            let now = paddock_inspector::service::now_secs();
            s.inspector
                .start(ident, manage_boot, now)
                .await
                .map(|_| ())
                .map_err(paddock_wire::ApiError::from)
        }
        BulkAction::Provision => {
            request(Event::ProvisionRequested {
                image: b.image.clone(),
            })
            .await
        }
        BulkAction::Reimage => {
            let image = (!b.image.is_empty()).then(|| b.image.clone());
            request(Event::ReimageRequested { image }).await
        }
        BulkAction::Clean => request(Event::CleanRequested).await,
    }
}

/// `POST /ui/bulk/<action>`, a route per action (the access table names each one's method).
pub fn bulk_routes() -> axum::Router<Console> {
    BulkAction::CHOICES
        .iter()
        .fold(axum::Router::new(), |r, (value, _)| {
            r.route(&format!("/ui/bulk/{value}"), axum::routing::post(bulk))
        })
}

/// A bulk action: first a page naming the machines and the action to confirm; confirmed,
/// the action on each machine in turn and a page with each one's outcome.
async fn bulk(
    State(s): State<Console>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !same_origin(&headers) {
        return refused_origin();
    }
    let action = uri.path().rsplit('/').next().unwrap_or_default();
    let b = match Bulk::parse(action, &body) {
        Ok(b) => b,
        Err(e) => {
            let body = html! { p.error { (e) } p { a href="/ui" { "Back to the machines" } } };
            return (StatusCode::BAD_REQUEST, page("Nothing done", false, body)).into_response();
        }
    };
    let image_text = match (b.action, b.image.as_str()) {
        (BulkAction::Provision | BulkAction::Reimage, "") => " (each keeps its image)".into(),
        (BulkAction::Provision | BulkAction::Reimage, i) => format!(" with {i}"),
        _ => String::new(),
    };
    if !b.confirmed {
        let mut fields: Vec<(&str, &str)> = b.nodes.iter().map(|n| ("node", n.as_str())).collect();
        fields.push(("image", b.image.as_str()));
        let question = html! {
            (b.action.text()) (image_text) ": " strong { (b.nodes.len()) " machine(s)" } "?"
            ul { @for n in b.nodes.iter().take(PER_PAGE) { li { code { (n) } } } }
            @if b.nodes.len() > PER_PAGE { (b.nodes.len() - PER_PAGE) " more." }
        };
        return confirm_page(
            "Confirm",
            question,
            &format!("/ui/bulk/{}", b.action.value()),
            &fields,
            html! {},
            b.action.text(),
            "/ui",
        );
    }
    let mut outcomes = Vec::with_capacity(b.nodes.len());
    for n in &b.nodes {
        outcomes.push((n, one(&s, n, &b).await));
    }
    let failed = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    let body = html! {
        p #bulk-summary {
            (b.action.text()) (image_text) ": " (outcomes.len() - failed) " done, " (failed) " refused."
        }
        table #bulk-outcomes {
            tr { th { "Machine" } th { "Outcome" } }
            @for (n, r) in &outcomes {
                tr {
                    td { a href={ "/ui/nodes/" (n) } { (n) } }
                    td { @match r {
                        Ok(()) => { (badge("done")) }
                        Err(e) => { (badge("failed")) " " span.error { (e.message) } }
                    } }
                }
            }
        }
        p { a href="/ui" { "Back to the machines" } }
    };
    page("Bulk action", false, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machines list: newest first, searched by every word, filtered by state, paged
    /// with the page clamped; links keep the query, percent-encoded.
    #[test]
    fn the_machines_list_is_searched_filtered_and_paged() {
        let nodes: Vec<Node> = (0..120u128)
            .map(|i| {
                let mut n = Node::new(uuid::Uuid::from_u128(i), 1_700_000_000 + i as i64);
                n.name = Some(format!("rack{}-node{i}", i % 3));
                n
            })
            .collect();
        let q = |q: &str, state: &str, page: Option<usize>| NodesQuery {
            q: q.into(),
            state: state.into(),
            prov: String::new(),
            page,
        };
        let sel = select_nodes(nodes.iter().collect(), &q("", "", None), None);
        assert_eq!((sel.matching, sel.page, sel.pages), (120, 1, 3));
        assert_eq!(sel.shown.len(), PER_PAGE);
        assert_eq!(sel.shown[0].name.as_deref(), Some("rack2-node119"));
        let sel = select_nodes(nodes.iter().collect(), &q("", "", Some(9)), None);
        assert_eq!((sel.page, sel.shown.len()), (3, 20));
        let sel = select_nodes(nodes.iter().collect(), &q("RACK1 node1", "", None), None);
        // rack1: i % 3 == 1, and "node1" in the name: 1, 10, 13, 16, 19, 100, 103, …
        assert!(sel.shown.iter().all(|n| {
            let name = n.name.as_deref().unwrap();
            name.starts_with("rack1-") && name.contains("node1")
        }));
        assert_eq!(sel.matching, 12);
        let sel = select_nodes(nodes.iter().collect(), &q("", "finished", None), None);
        assert_eq!(sel.matching, 0);
        assert_eq!(sel.states.values().sum::<usize>(), 120);
        // By provisioning state: two machines are healthy, the rest have no record.
        let prov: BTreeMap<uuid::Uuid, &'static str> = [
            (uuid::Uuid::from_u128(3), "healthy"),
            (uuid::Uuid::from_u128(7), "healthy"),
        ]
        .into();
        let mut healthy = q("", "", None);
        healthy.prov = "healthy".into();
        let sel = select_nodes(nodes.iter().collect(), &healthy, Some(&prov));
        assert_eq!(sel.matching, 2);
        healthy.prov = "unknown".into();
        assert_eq!(
            select_nodes(nodes.iter().collect(), &healthy, Some(&prov)).matching,
            118
        );
        assert_eq!(
            nodes_link(&q("a b&c", "", None), 2),
            "/ui?q=a%20b%26c&state=&prov=&page=2"
        );
        let html = nodes_body(
            120,
            &select_nodes(nodes.iter().collect(), &q("", "", Some(2)), None),
            &q("", "", Some(2)),
            &BTreeMap::new(),
            &["debian/<a>".to_string()],
        )
        .into_string();
        assert!(
            html.contains(r#"rel="prev" href="/ui?q=&amp;state=&amp;prov=&amp;page=1""#),
            "{html}"
        );
        assert!(html.contains(r#"data-live-region="nodes""#), "{html}");
        assert!(html.contains("debian/&lt;a&gt;"), "{html}");
        assert_eq!(html.matches(r#"name="node""#).count(), PER_PAGE, "{html}");
    }

    #[test]
    fn a_bulk_form_is_read_or_refused_clearly() {
        let b = Bulk::parse(
            "reimage",
            b"node=b&node=a&node=a&image=debian%2Fa&confirm=yes",
        )
        .unwrap();
        assert_eq!(
            b,
            Bulk {
                nodes: vec!["a".into(), "b".into()],
                action: BulkAction::Reimage,
                image: "debian/a".into(),
                confirmed: true,
            }
        );
        for (action, body, error) in [
            ("explode", &b"node=a"[..], "no action called \"explode\""),
            ("clean", b"image=x", "no machine selected"),
            ("provision", b"node=a", "provisioning needs an image"),
        ] {
            let e = Bulk::parse(action, body).unwrap_err().to_string();
            assert!(e.contains(error), "{e}");
        }
        let many: String = (0..=MAX_BULK).map(|i| format!("node={i}&")).collect();
        let e = Bulk::parse("clean", many.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 1000"), "{e}");
        for (value, _) in BulkAction::CHOICES {
            assert_eq!(BulkAction::parse(value).unwrap().value(), value);
        }
    }
}
