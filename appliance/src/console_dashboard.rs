//! The console's dashboard (`/ui/dashboard`), ordered by the question an operator comes
//! with: is anything wrong? Failures and stuck runs first (introspection and provisioning
//! errors, runs that stopped reporting, subs that fail), then what is happening (runs under
//! way, boots, enrolments and installs per minute, machines per state over the day), then
//! capacity (each role's minimum, target and count; DHCP pools; compliance; the power-on
//! queue). Live like the machines list (any node or provisioning change re-reads it).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use paddock_birther::{Provisioning, State as Prov};
use paddock_inspector::node::Node;

use super::charts::{self, Series};
use super::{Console, Live, census, failure, page_with, state_name};
use crate::console_history::Sample;
use crate::console_style::{badge, tone, when};

/// How many entries the "running" and "attention" lists show.
const SHOWN: usize = 10;

/// A run with no report for this long is stuck (a step's own timeout is longer; this is
/// the point an operator wants to look).
pub const STUCK_MS: u64 = 15 * 60 * 1000;

/// The activity chart's span, and the history charts'.
const ACTIVITY_MINUTES: usize = 60;
const HISTORY_MS: i64 = 6 * 3600 * 1000;
const HISTORY_POINTS: usize = 72;

/// Something that needs the operator: where, what, since when (Unix ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// A machine's page or a sub's.
    pub link: String,
    pub who: String,
    pub what: String,
    pub since_ms: Option<i64>,
}

/// What the dashboard shows, read once per request.
#[derive(Default)]
pub struct View {
    pub now_ms: i64,
    /// Which host this is and who leads, as a sentence.
    pub appliance: String,
    pub machines: usize,
    pub per_state: BTreeMap<&'static str, usize>,
    pub per_provisioning: BTreeMap<&'static str, usize>,
    /// Nodes being introspected, newest first.
    pub inspecting: Vec<Node>,
    /// (node, label, operation and image) of every install, re-image or clean under way.
    pub provisioning: Vec<(uuid::Uuid, String, String)>,
    /// Failures and stuck runs, the newest first.
    pub problems: Vec<Problem>,
    /// Introspections started, machines enrolled and installs finished (Unix ms each).
    pub boots: Vec<i64>,
    pub enrolments: Vec<i64>,
    pub installs: Vec<i64>,
    /// The PXE filter's state sentence, or `None` when it is off.
    pub filter: Option<String>,
    /// (synced, subs) and whether the dominator is paused.
    pub subs: (usize, usize),
    pub paused: bool,
    /// The power-on throttle: its queue and next slot.
    pub throttle: crate::power::ThrottleView,
    /// The samples of the last hours, oldest first.
    pub history: Vec<Sample>,
    /// DHCP pools: (network, held, size).
    pub pools: Vec<(String, u64, u64)>,
    /// The role plan for the live census: its outcome and each role's counts.
    pub capacity: Option<(String, BTreeMap<String, paddock_roles::engine::RoleCount>)>,
}

fn ms(secs: Option<i64>) -> Option<i64> {
    secs.map(|s| s.saturating_mul(1000))
}

/// Folds the nodes and their provisioning records (by node) into the view's counts, lists
/// and problems, at `view.now_ms`.
pub fn tally(view: &mut View, mut nodes: Vec<&Node>, records: &BTreeMap<uuid::Uuid, Provisioning>) {
    nodes.sort_by_key(|n| std::cmp::Reverse(n.created_at));
    view.machines = nodes.len();
    let now = u64::try_from(view.now_ms).unwrap_or(0);
    let label: BTreeMap<uuid::Uuid, String> = nodes.iter().map(|n| (n.uuid, n.label())).collect();
    for n in nodes.iter().copied() {
        *view.per_state.entry(state_name(n)).or_insert(0) += 1;
        let record = records.get(&n.uuid);
        let prov = record.map_or("unknown", |r| r.state.name());
        *view.per_provisioning.entry(prov).or_insert(0) += 1;
        view.enrolments.push(n.created_at.saturating_mul(1000));
        let i = n.introspection.as_ref();
        if let Some(started) = ms(i.and_then(|i| i.started_at)) {
            view.boots.push(started);
        }
        if let Some(e) = i.and_then(|i| i.error.as_deref()) {
            view.problems.push(Problem {
                link: format!("/ui/nodes/{}", n.uuid),
                who: n.label(),
                what: format!("introspection failed: {e}"),
                since_ms: ms(i.and_then(|i| i.finished_at)),
            });
        }
    }
    view.inspecting = nodes
        .into_iter()
        .filter(|n| n.inspecting())
        .cloned()
        .collect();
    for (uuid, r) in records {
        let who = label.get(uuid).cloned().unwrap_or_else(|| uuid.to_string());
        let link = format!("/ui/nodes/{uuid}");
        let what = match &r.state {
            Prov::Birth(run) => format!("install of {}", run.image),
            Prov::Rebirth(run) => format!("re-image to {}", run.image),
            Prov::Clean { .. } => "clean".to_string(),
            Prov::Healthy { .. } => {
                view.installs.push(i64::try_from(r.since_ms).unwrap_or(0));
                continue;
            }
            Prov::Error {
                operation,
                step,
                message,
                ..
            } => {
                view.problems.push(Problem {
                    link,
                    who,
                    what: format!(
                        "{} failed at {}: {message}",
                        operation.as_str(),
                        step.as_str()
                    ),
                    since_ms: i64::try_from(r.since_ms).ok(),
                });
                continue;
            }
            Prov::Unknown => continue,
        };
        let quiet = now.saturating_sub(r.updated_ms);
        if quiet >= STUCK_MS {
            let why = match r.started_ms {
                Some(_) => format!(
                    "{what}: no report for {}",
                    super::machine::duration(quiet / 1000)
                ),
                None => format!(
                    "{what}: requested {} ago; the machine has not booted the ramdisk",
                    super::machine::duration(quiet / 1000)
                ),
            };
            view.problems.push(Problem {
                link: link.clone(),
                who: who.clone(),
                what: why,
                since_ms: i64::try_from(r.updated_ms).ok(),
            });
        }
        view.provisioning.push((*uuid, who, what));
    }
    view.problems
        .sort_by_key(|p| std::cmp::Reverse(p.since_ms.unwrap_or(0)));
}

/// Subs that fail (their tone is bad), as problems.
pub fn sub_problems(subs: &[paddock_dominator::SubStatus]) -> Vec<Problem> {
    subs.iter()
        .filter(|s| tone(s.state.name()) == crate::console_style::Tone::Bad)
        .map(|s| Problem {
            link: format!("/ui/subs/{}", s.hostname),
            who: s.hostname.clone(),
            what: format!("sub {}", s.summary),
            since_ms: None,
        })
        .collect()
}

fn counts(map: &BTreeMap<&'static str, usize>, link: bool) -> Markup {
    html! {
        ul.counts {
            @for (st, n) in map {
                li {
                    @if link { a href={ "/ui?state=" (st) } { (badge(st)) } } @else { (badge(st)) }
                    " " strong { (n) }
                }
            }
        }
    }
}

/// The samples' series: one per provisioning state seen, then compliance, then the queue.
fn history_charts(v: &View) -> Markup {
    let times: Vec<i64> = v.history.iter().map(|s| s.at_ms).collect();
    let mut names: Vec<&'static str> = v
        .history
        .iter()
        .flat_map(|s| s.states.keys().copied())
        .collect();
    names.sort_unstable();
    names.dedup();
    let states: Vec<Series> = names
        .iter()
        .map(|name| Series {
            name: (*name).to_string(),
            values: v
                .history
                .iter()
                .map(|s| s.states.get(name).copied().unwrap_or(0))
                .collect(),
        })
        .collect();
    let compliance = [
        Series {
            name: "synced".into(),
            values: v.history.iter().map(|s| s.synced).collect(),
        },
        Series {
            name: "not synced".into(),
            values: v
                .history
                .iter()
                .map(|s| s.subs.saturating_sub(s.synced))
                .collect(),
        },
    ];
    let queue = [Series {
        name: "queued power-ons".into(),
        values: v.history.iter().map(|s| s.power_queue).collect(),
    }];
    html! {
        div.charts {
            (charts::stacked("chart-states", "Machines by provisioning state", &times, &states, v.now_ms))
            (charts::stacked("chart-compliance", "Fleet compliance (subs)", &times, &compliance, v.now_ms))
            (charts::stacked("chart-power", "Power-on queue", &times, &queue, v.now_ms))
        }
    }
}

fn activity_chart(v: &View) -> Markup {
    let (times, boots) = charts::per_minute(&v.boots, v.now_ms, ACTIVITY_MINUTES);
    let (_, enrolments) = charts::per_minute(&v.enrolments, v.now_ms, ACTIVITY_MINUTES);
    let (_, installs) = charts::per_minute(&v.installs, v.now_ms, ACTIVITY_MINUTES);
    let series = [
        Series {
            name: "introspections".into(),
            values: boots,
        },
        Series {
            name: "enrolments".into(),
            values: enrolments,
        },
        Series {
            name: "installs".into(),
            values: installs,
        },
    ];
    charts::stacked(
        "chart-activity",
        "Per minute, the last hour",
        &times,
        &series,
        v.now_ms,
    )
}

pub fn body(v: &View) -> Markup {
    let running = v.inspecting.len() + v.provisioning.len();
    html! {
        div data-live-region="dashboard" {
            p #appliance .muted { (v.appliance) }
            section #attention aria-labelledby="attention-h" {
                @if v.problems.is_empty() && !v.paused {
                    h2 #attention-h { (badge("ok")) " Nothing needs you" }
                    p.muted { "No failed introspection or run, no run stuck, no sub failing." }
                } @else {
                    h2 #attention-h { (badge("error")) " Needs attention (" (v.problems.len() + usize::from(v.paused)) ")" }
                    @if v.paused { p.banner { "The dominator is paused: no sub is updated. " a href="/ui/subs" { "Subs" } } }
                    table #errors {
                        tr { th { "Where" } th { "What" } th { "Since" } }
                        @for p in v.problems.iter().take(SHOWN) {
                            tr {
                                td { a href=(p.link) { (p.who) } }
                                td.error { (p.what) }
                                td { @if let Some(t) = p.since_ms { (when(v.now_ms, t)) } }
                            }
                        }
                    }
                    @if v.problems.len() > SHOWN { p { (v.problems.len()) " in all." } }
                }
            }
            div.cards.summary {
                div.card {
                    h3 { a href="/ui" { "Machines" } }
                    p.big { (v.machines) }
                    (counts(&v.per_provisioning, false))
                }
                div.card {
                    h3 { "Running now" }
                    p.big { (running) }
                    p.muted { (v.inspecting.len()) " introspection(s), " (v.provisioning.len()) " run(s)" }
                }
                div.card {
                    h3 { a href="/ui/subs" { "Compliance" } }
                    p.big { (v.subs.0) " / " (v.subs.1) }
                    p.muted { "subs synced to their required image" }
                }
                div.card {
                    h3 { a href="/ui/firewall" { "PXE filter" } }
                    p { (v.filter.as_deref().unwrap_or("off ([firewall] enabled = false)")) }
                }
            }
            h2 { "Activity" }
            @if running == 0 {
                p.muted { "Nothing running: no introspection, install, re-image or clean under way." }
            } @else {
                ul #running {
                    @for n in v.inspecting.iter().take(SHOWN) {
                        li { a href={ "/ui/nodes/" (n.uuid) } { (n.label()) } " introspection " (badge(state_name(n))) }
                    }
                    @for (uuid, who, what) in v.provisioning.iter().take(SHOWN) {
                        li { a href={ "/ui/nodes/" (uuid) } { (who) } " " (what) }
                    }
                }
                @if running > 2 * SHOWN { p { (running) " in all." } }
            }
            (activity_chart(v))
            (history_charts(v))
            h2 { "Capacity" }
            div.columns {
                section {
                    h3 { a href="/ui/roles" { "Roles" } }
                    @match &v.capacity {
                        None => { p.muted { "No role spec applied." } }
                        Some((outcome, roles)) => {
                            p { "Plan for the live census: " (badge(outcome)) }
                            table #capacity {
                                tr { th { "Role" } th { "Minimum" } th { "Target" } th { "Running" } }
                                @for (role, c) in roles {
                                    tr {
                                        td { (role) }
                                        td { (c.minimum) }
                                        td { (c.target) @if let Some(m) = c.max { span.muted { " (max " (m) ")" } } }
                                        td class=[(c.current < c.minimum).then_some("error")] { (c.current) }
                                    }
                                }
                            }
                        }
                    }
                }
                section {
                    (charts::meters("chart-pools", "DHCP pools", &v.pools))
                }
                section {
                    h3 { "Power" }
                    (super::power_page::throttle(&v.throttle))
                }
            }
            p { "Machines per introspection state: " }
            (counts(&v.per_state, true))
        }
    }
}

/// The plan's outcome as a state name (for its badge).
fn outcome_name(o: &paddock_roles::engine::Outcome) -> String {
    match o {
        paddock_roles::engine::Outcome::Optimal => "optimal".into(),
        paddock_roles::engine::Outcome::Viable => "viable".into(),
        paddock_roles::engine::Outcome::FailStop(_) => "fail_stop".into(),
    }
}

/// The provisioning records, by node.
pub async fn records(
    s: &Console,
) -> Result<BTreeMap<uuid::Uuid, Provisioning>, paddock_store::StoreError> {
    let kvs = s.dominator.store.range(crate::provisioning::PREFIX).await?;
    Ok(kvs
        .into_iter()
        .filter_map(|kv| {
            let uuid = kv.name_under(crate::provisioning::PREFIX)?;
            Some((uuid, serde_json::from_slice(&kv.value).ok()?))
        })
        .collect())
}

/// `GET /ui/dashboard`.
pub async fn dashboard(State(s): State<Console>) -> Response {
    let records = match records(&s).await {
        Ok(r) => r,
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let subs = census(&s.dominator);
    let synced = subs.iter().filter(|s| s.state.name() == "synced").count();
    let paused = matches!(
        s.dominator.store.get(crate::dominator::PAUSE).await,
        Ok(Some(_))
    );
    let now_ms = paddock_clock::now().0;
    let capacity = match s.roles.stored_spec().await {
        Ok(Some(_)) => s
            .roles
            .preview(&crate::roles::SpecBody::default())
            .await
            .ok()
            .map(|p| (outcome_name(&p.plan.outcome), p.plan.roles)),
        _ => None,
    };
    let pools = s
        .dhcp
        .as_ref()
        .map(|d| {
            d.usage(paddock_dhcp::shell::unix_now())
                .into_iter()
                .map(|(net, held, size)| (net.to_string(), held, size))
                .collect()
        })
        .unwrap_or_default();
    let mut view = View {
        now_ms,
        appliance: super::appliance_sentence(&s),
        filter: s.filter.as_ref().map(|f| f.status().state),
        subs: (synced, subs.len()),
        paused,
        throttle: s.power.throttle_now().await,
        history: s.history.since(now_ms - HISTORY_MS, HISTORY_POINTS),
        pools,
        capacity,
        ..View::default()
    };
    // The in-memory view (console_nodes.rs); the store itself until its first load is done.
    let view_nodes = super::node_view::view(&s.dominator.store);
    if view_nodes.ready(std::time::Duration::from_secs(2)).await {
        view_nodes.with(|nodes| tally(&mut view, nodes, &records));
    } else {
        match s.inspector.list().await {
            Ok(nodes) => tally(&mut view, nodes.iter().collect(), &records),
            Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.message),
        }
    }
    view.problems.extend(sub_problems(&subs));
    let live = Live {
        kind: "list",
        subjects: Vec::new(),
    };
    page_with("Dashboard", true, Some(live), body(&view)).into_response()
}

/// One sample of the appliance for the charts over time.
pub async fn sample(s: &Console) -> Option<Sample> {
    let nodes = super::node_view::view(&s.dominator.store);
    // Before the view's first load it holds no machine: no sample rather than a false zero.
    if !nodes.ready(std::time::Duration::from_secs(2)).await {
        return None;
    }
    let records = records(s).await.ok()?;
    let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
    nodes.with(|nodes| {
        for n in nodes {
            let st = records.get(&n.uuid).map_or("unknown", |r| r.state.name());
            *states.entry(st).or_insert(0) += 1;
        }
    });
    let subs = census(&s.dominator);
    let synced = subs.iter().filter(|s| s.state.name() == "synced").count();
    Some(Sample {
        at_ms: paddock_clock::now().0,
        states,
        synced: synced as u64,
        subs: subs.len() as u64,
        power_queue: s.power.throttle_now().await.queued as u64,
    })
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
            now_ms: 1000,
            ..View::default()
        };
        tally(&mut view, vec![&a, &b], &records);
        assert_eq!(view.machines, 2);
        assert_eq!(view.per_provisioning.get("birth"), Some(&1));
        assert_eq!(view.per_provisioning.get("error"), Some(&1));
        assert_eq!(view.provisioning.len(), 1);
        assert_eq!(view.problems.len(), 1);
        assert_eq!(view.enrolments, vec![1_700_000_001_000, 1_700_000_000_000]);
        let html = body(&view).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("birth failed at partition: sfdisk said &lt;script&gt;"),
            "{html}"
        );
        assert!(html.contains("install of debian/a"), "{html}");
        assert!(html.contains("1 / 2"), "{html}");
        assert!(html.contains("The dominator is paused"), "{html}");
        assert!(html.contains("Needs attention (2)"), "{html}");
        // The install that has not reported for the stuck time joins the problems.
        let mut later = View {
            now_ms: i64::try_from(STUCK_MS).unwrap() + 60_000,
            ..View::default()
        };
        tally(&mut later, vec![&a, &b], &records);
        let stuck: Vec<&str> = later.problems.iter().map(|p| p.what.as_str()).collect();
        assert!(
            stuck.contains(&"install of debian/a: requested 16 min 0 s ago; the machine has not booted the ramdisk"),
            "{stuck:?}"
        );
        let calm = body(&View::default()).into_string();
        assert!(calm.contains("Nothing needs you"), "{calm}");
    }

    /// However long the history and large the fleet, the dashboard stays light: the charts
    /// draw at most HISTORY_POINTS samples and the lists show SHOWN entries.
    #[test]
    fn a_day_of_history_at_ten_thousand_machines_stays_a_light_page() {
        let history = crate::console_history::History::default();
        let states = ["unknown", "birth", "healthy", "rebirth", "clean", "error"];
        for minute in 0..crate::console_history::KEPT as i64 {
            history.record(Sample {
                at_ms: minute * 60_000,
                states: states.iter().map(|s| (*s, 1666 + minute as u64)).collect(),
                synced: 9000,
                subs: 10_000,
                power_queue: 12,
            });
        }
        let now_ms = crate::console_history::KEPT as i64 * 60_000;
        let events: Vec<i64> = (0..10_000).map(|i| now_ms - i * 300).collect();
        let view = View {
            now_ms,
            machines: 10_000,
            history: history.since(now_ms - HISTORY_MS, HISTORY_POINTS),
            boots: events.clone(),
            enrolments: events.clone(),
            installs: events,
            problems: (0..10_000)
                .map(|i| Problem {
                    link: format!("/ui/nodes/{i}"),
                    who: format!("node-{i}"),
                    what: "install of debian/a: no report for 20 min 0 s".into(),
                    since_ms: Some(now_ms),
                })
                .collect(),
            pools: (0..8)
                .map(|i| (format!("198.18.{i}.0/24"), 200, 250))
                .collect(),
            ..View::default()
        };
        assert_eq!(view.history.len(), HISTORY_POINTS);
        let html = body(&view).into_string();
        assert!(html.len() < 100 * 1024, "{} bytes", html.len());
        assert!(html.contains("10000 in all."), "the problems are counted");
    }
}
