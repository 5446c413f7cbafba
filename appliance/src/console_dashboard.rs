//! The console's dashboard (`/ui/dashboard`): the whole appliance at a glance — which host
//! this is and who leads, machines per introspection state and per provisioning state, what
//! is running now (introspections, installs, re-images, cleans), the PXE filter, the subs'
//! compliance, and the latest errors. Live like the machines list (any node or provisioning
//! change re-reads it).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use paddock_birther::{Provisioning, State as Prov};
use paddock_inspector::node::Node;

use super::{Console, Live, census, failure, page_with, state_cell, state_name};

/// How many entries the "running" and "errors" lists show.
const SHOWN: usize = 10;

/// What the dashboard shows, read once per request.
#[derive(Default)]
pub struct View {
    /// Which host this is and who leads, as a sentence.
    pub appliance: String,
    pub machines: usize,
    pub per_state: BTreeMap<&'static str, usize>,
    pub per_provisioning: BTreeMap<&'static str, usize>,
    /// Nodes being introspected, newest first.
    pub inspecting: Vec<Node>,
    /// (node, operation and image) of every install, re-image or clean under way.
    pub provisioning: Vec<(uuid::Uuid, String)>,
    /// (node, label, message), introspection errors then provisioning errors.
    pub errors: Vec<(uuid::Uuid, String, String)>,
    /// The PXE filter's state sentence, or `None` when it is off.
    pub filter: Option<String>,
    /// (synced, subs) and whether the dominator is paused.
    pub subs: (usize, usize),
    pub paused: bool,
    /// The power-on throttle: its queue and next slot.
    pub throttle: crate::power::ThrottleView,
}

/// Folds the nodes and their provisioning records (by node) into the view's counts and lists.
pub fn tally(view: &mut View, mut nodes: Vec<Node>, records: &BTreeMap<uuid::Uuid, Provisioning>) {
    nodes.sort_by_key(|n| std::cmp::Reverse(n.created_at));
    view.machines = nodes.len();
    let label: BTreeMap<uuid::Uuid, String> = nodes.iter().map(|n| (n.uuid, n.label())).collect();
    for n in &nodes {
        *view.per_state.entry(state_name(n)).or_insert(0) += 1;
        let record = records.get(&n.uuid);
        let prov = record.map_or("unknown", |r| r.state.name());
        *view.per_provisioning.entry(prov).or_insert(0) += 1;
        if let Some(e) = n.introspection.as_ref().and_then(|i| i.error.as_deref()) {
            view.errors
                .push((n.uuid, n.label(), format!("introspection: {e}")));
        }
    }
    view.inspecting = nodes.into_iter().filter(Node::inspecting).collect();
    for (uuid, r) in records {
        let what = match &r.state {
            Prov::Birth(run) => format!("install of {}", run.image),
            Prov::Rebirth(run) => format!("re-image to {}", run.image),
            Prov::Clean { .. } => "clean".to_string(),
            Prov::Error {
                operation,
                step,
                message,
                ..
            } => {
                let who = label.get(uuid).cloned().unwrap_or_else(|| uuid.to_string());
                view.errors.push((
                    *uuid,
                    who,
                    format!(
                        "{} failed at {}: {message}",
                        operation.as_str(),
                        step.as_str()
                    ),
                ));
                continue;
            }
            _ => continue,
        };
        view.provisioning.push((*uuid, what));
    }
}

fn counts(map: &BTreeMap<&'static str, usize>, link: bool) -> Markup {
    html! {
        table {
            @for (st, n) in map {
                tr {
                    td { @if link { a href={ "/ui?state=" (st) } { (crate::console_style::badge(st)) } } @else { (crate::console_style::badge(st)) } }
                    td { (n) }
                }
            }
        }
    }
}

pub fn body(v: &View) -> Markup {
    html! {
        div data-live-region="dashboard" {
            p #appliance { (v.appliance) }
            h2 { "Machines (" (v.machines) ")" }
            @if v.machines == 0 {
                p { "No machines yet. Power on a machine on the provisioning network: it enrols itself." }
            } @else {
                div.columns {
                    section { h3 { "Introspection" } (counts(&v.per_state, true)) }
                    section { h3 { "Provisioning" } (counts(&v.per_provisioning, false)) }
                }
            }
            h2 { "Running now" }
            @if v.inspecting.is_empty() && v.provisioning.is_empty() {
                p { "Nothing: no introspection, install, re-image or clean under way." }
            } @else {
                ul #running {
                    @for n in v.inspecting.iter().take(SHOWN) {
                        li { a href={ "/ui/nodes/" (n.uuid) } { (n.label()) } " introspection " (state_cell(n)) }
                    }
                    @for (uuid, what) in v.provisioning.iter().take(SHOWN) {
                        li { a href={ "/ui/nodes/" (uuid) } { (uuid) } " " (what) }
                    }
                }
                @if v.inspecting.len() + v.provisioning.len() > 2 * SHOWN {
                    p { (v.inspecting.len()) " introspection(s) and " (v.provisioning.len()) " provisioning run(s) in all." }
                }
            }
            h2 { "PXE filter" }
            p { (v.filter.as_deref().unwrap_or("off ([firewall] enabled = false)")) " — " a href="/ui/firewall" { "details" } }
            h2 { "Power" }
            (super::power_page::throttle(&v.throttle))
            h2 { "Compliance" }
            p {
                (v.subs.0) " of " (v.subs.1) " sub(s) synced to their required image"
                @if v.paused { span.error { " — the dominator is paused" } }
                " — " a href="/ui/subs" { "subs" }
            }
            h2 { "Errors" }
            @if v.errors.is_empty() {
                p { "None." }
            } @else {
                table #errors {
                    @for (uuid, who, message) in v.errors.iter().take(SHOWN) {
                        tr { td { a href={ "/ui/nodes/" (uuid) } { (who) } } td.error { (message) } }
                    }
                }
                @if v.errors.len() > SHOWN { p { (v.errors.len()) " in all." } }
            }
        }
    }
}

/// `GET /ui/dashboard`.
pub async fn dashboard(State(s): State<Console>) -> Response {
    let nodes = match s.inspector.list().await {
        Ok(n) => n,
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.message),
    };
    let records: BTreeMap<uuid::Uuid, Provisioning> =
        match s.dominator.store.range(crate::provisioning::PREFIX).await {
            Ok(kvs) => kvs
                .into_iter()
                .filter_map(|kv| {
                    let uuid = kv.name_under(crate::provisioning::PREFIX)?;
                    Some((uuid, serde_json::from_slice(&kv.value).ok()?))
                })
                .collect(),
            Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
    let subs = census(&s.dominator);
    let synced = subs.iter().filter(|s| s.state.name() == "synced").count();
    let paused = matches!(
        s.dominator.store.get(crate::dominator::PAUSE).await,
        Ok(Some(_))
    );
    let mut view = View {
        appliance: super::appliance_sentence(&s),
        filter: s.filter.as_ref().map(|f| f.status().state),
        subs: (synced, subs.len()),
        paused,
        throttle: s.power.throttle_now().await,
        ..View::default()
    };
    tally(&mut view, nodes, &records);
    let live = Live {
        kind: "list",
        subjects: Vec::new(),
    };
    page_with("Dashboard", true, Some(live), body(&view)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_birther::state::Run;
    use paddock_birther::{Operation, Step};

    #[test]
    fn the_dashboard_counts_states_lists_runs_and_errors_escaped() {
        let hostile = r#"<script>alert("x")</script>"#;
        let mut a = Node::new(uuid::Uuid::from_u128(1), 1_700_000_000);
        a.name = Some("web-1".into());
        let b = Node::new(uuid::Uuid::from_u128(2), 1_700_000_001);
        let record = |state| Provisioning {
            state,
            since_ms: 0,
            updated_ms: 0,
            started_ms: None,
        };
        let records = BTreeMap::from([
            (
                a.uuid,
                record(Prov::Birth(Run {
                    image: "debian/a".into(),
                    previous_image: None,
                    last_step: None,
                    synced: false,
                })),
            ),
            (
                b.uuid,
                record(Prov::Error {
                    operation: Operation::Birth,
                    step: Step::Partition,
                    message: format!("sfdisk said {hostile}"),
                    image: None,
                }),
            ),
        ]);
        let mut view = View {
            subs: (1, 2),
            paused: true,
            ..View::default()
        };
        tally(&mut view, vec![a, b], &records);
        assert_eq!(view.machines, 2);
        assert_eq!(view.per_provisioning.get("birth"), Some(&1));
        assert_eq!(view.per_provisioning.get("error"), Some(&1));
        assert_eq!(view.provisioning.len(), 1);
        assert_eq!(view.errors.len(), 1);
        let html = body(&view).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("birth failed at partition: sfdisk said &lt;script&gt;"),
            "{html}"
        );
        assert!(html.contains("install of debian/a"), "{html}");
        assert!(html.contains("1 of 2 sub(s) synced"), "{html}");
        assert!(html.contains("the dominator is paused"), "{html}");
    }
}
