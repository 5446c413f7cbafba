//! The roles page of the console (`/ui/roles`): the applied spec, the census, a
//! preview of the plan for the live census (nothing is run), the rollouts, and the last
//! rounds with what each action did. Served by the roles router; maud escapes every value.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use paddock_inspector::node::iso;

use crate::console::{ActionPost, confirm_page};
use crate::dns::{DnsHandle, ServiceNames};
use crate::roles::plan_text;
use crate::roles::{Roles, SpecBody, describe};

const ROUNDS_SHOWN: usize = 5;

/// The page's state: the roles, and the DNS server's zones when DNS is on.
pub type PageState = (Arc<Roles>, Option<DnsHandle>);

pub async fn page(State((r, dns)): State<PageState>) -> Response {
    let spec = match r.stored_spec().await {
        Ok(s) => s,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let census = match r.census.view().await {
        Ok(c) => c,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let preview = match &spec {
        Some(_) => Some(r.preview(&SpecBody::default()).await),
        None => None,
    };
    // Each role with instances, and what DNS serves for its service.
    let roles: std::collections::BTreeSet<&str> =
        census.instances.iter().map(|i| i.role.as_str()).collect();
    let services: Vec<(&str, ServiceNames)> = dns
        .iter()
        .flat_map(|d| roles.iter().map(|role| (*role, d.service(role))))
        .collect();
    let mut rounds = r.rounds(ROUNDS_SHOWN).await.unwrap_or_default();
    rounds.reverse();
    let rollouts = crate::rollouts::load_all(r.store.as_ref())
        .await
        .unwrap_or_default();
    let markup = html! {
        @if r.config.is_none() {
            p { strong { "The role loop is off on this host ([roles] hooks_dir is not set)." } }
        }
        h2 { "Spec" }
        @match &spec {
            Some(s) => {
                p { code { (s.file) } ", applied " (iso(s.applied_ms / 1000)) " UTC" }
                details { summary { "text" } pre { (s.text) } }
            }
            None => p { "No spec applied: " code { "paddock spec apply FILE" } },
        }
        h2 { "Census: " (census.hosts.len()) " hosts alive, " (census.instances.len()) " instances" }
        p { @for h in &census.hosts { code { (h.host) } " " } }
        table {
            tr {
                th { "Role" } th { "Instance" } th { "Host" } th { "Since (UTC)" }
                @if dns.is_some() { th { "DNS name" } }
            }
            @for i in &census.instances {
                tr {
                    td { (i.role) }
                    td { code { (i.instance) } }
                    td { (i.host.as_deref().unwrap_or("-")) }
                    td { (iso(i.since_ms / 1000)) }
                    @if let Some(d) = &dns {
                        td { code { (d.instance_name(&i.instance).unwrap_or_else(|| "-".into())) } }
                    }
                }
            }
        }
        @if !rollouts.is_empty() {
            h2 { "Rollouts" }
            table {
                tr { th { "Role" } th { "From" } th { "To" } th { "Phase" } th { "Batches" } th { "In flight" } th { "Why" } th {} }
                @for (role, s) in &rollouts {
                    tr {
                        td { (role) }
                        td { code { (s.rollout.from) } }
                        td { code { (s.rollout.to) } }
                        td { (s.rollout.phase.name()) }
                        td { (s.rollout.batches) }
                        td { (s.rollout.batch.keys().cloned().collect::<Vec<_>>().join(", ")) }
                        td { (s.rollout.why.as_deref().unwrap_or("")) }
                        td {
                            @for c in commands(&s.rollout.phase) {
                                form.inline method="post" action={ "/ui/rollouts/" (role) "/" (c) } {
                                    button type="submit" { (c) }
                                }
                                " "
                            }
                        }
                    }
                }
            }
            @for (role, s) in &rollouts {
                details {
                    summary { "The rollout of " (role) ": its log (newest first)" }
                    ul {
                        @for e in s.rollout.log.iter().rev().take(LOG_SHOWN) {
                            li {
                                (paddock_inspector::node::iso(e.at.secs())) " "
                                @if let Some(h) = &e.host { code { (h) } ": " }
                                (e.text)
                            }
                        }
                    }
                }
            }
        }
        @if let Some(last) = rounds.iter().find(|r| !r.shadows.is_empty()) {
            h2 { "Shadow specs (round at " (iso(last.at_ms / 1000)) " UTC)" }
            p { "Planned every round against the same census and metrics; nothing of theirs runs." }
            table {
                tr { th { "Shadow" } th { "Role" } th { "Live" } th { "Shadow" } th { "Why (shadow)" } }
                @for (name, sh) in &last.shadows {
                    @let diff = crate::roles::shadow_differences(&last.plan, &sh.plan);
                    @if diff.is_empty() {
                        tr { td { (name) " " code { (sh.file) } } td colspan="4" { "the same counts as the live spec" } }
                    }
                    @for (role, live, theirs) in &diff {
                        tr {
                            td { (name) " " code { (sh.file) } }
                            td { (role) }
                            td { (live.map_or("-".into(), |v| v.to_string())) }
                            td { (theirs.map_or("-".into(), |v| v.to_string())) }
                            td { (sh.scale.get(role).map(|d| d.reason.as_str()).unwrap_or("")) }
                        }
                    }
                }
            }
        }
        @if dns.is_some() {
            h2 { "Services (DNS)" }
            table {
                tr { th { "Role" } th { "Names" } th { "In service" } th { "Out (not up)" } }
                @for (role, s) in &services {
                    tr {
                        td { (role) }
                        td { @for n in &s.names { code { (n) } " " } }
                        td { (s.in_service.join(", ")) }
                        td { (s.verifying.join(", ")) }
                    }
                }
            }
        }
        @if let Some(p) = &preview {
            h2 { "Plan preview (nothing is run)" }
            @match p {
                Ok(p) => pre { (plan_text(&p.plan, &p.commands)) },
                Err(e) => p { (e.message) },
            }
        }
        h2 { "Last rounds" }
        @for round in &rounds {
            h3 { (iso(round.at_ms / 1000)) " UTC" }
            pre {
                (plan_text(&round.plan, &round.results.iter().map(|x| x.argv.clone()).collect::<Vec<_>>()))
                @for x in &round.results { (describe(x)) "\n" }
            }
        }
    };
    crate::console::page("Roles", true, markup).into_response()
}

/// The newest entries of a rollout's log the page shows (`paddock rollout status ROLE`
/// prints them all).
const LOG_SHOWN: usize = 30;

/// The commands a rollout in `phase` takes, as its buttons name them.
fn commands(phase: &paddock_rollout::Phase) -> Vec<&'static str> {
    use paddock_rollout::Phase as P;
    match phase {
        P::Canary | P::Forward => vec!["pause", "revert"],
        P::Promoting => vec!["promote", "pause", "revert"],
        P::Paused { .. } => vec!["resume", "revert"],
        P::Failed => vec!["revert"],
        P::Reverting | P::Done | P::Reverted => Vec::new(),
    }
}

/// `POST /ui/rollouts/{role}/{promote|pause|resume|revert}`: as the API's command; pause
/// and revert ask to confirm first. Then back to the roles page, or the refusal.
async fn rollout_form(
    r: Arc<Roles>,
    post: ActionPost,
    command: paddock_rollout::Command,
) -> Response {
    use paddock_rollout::Command as C;
    let role = post.target;
    let name = match command {
        C::Promote => "promote",
        C::Pause => "pause",
        C::Resume => "resume",
        C::Revert => "revert",
    };
    if matches!(command, C::Pause | C::Revert) && !post.form.confirmed() {
        let what = if command == C::Pause {
            "The batch in flight lands; no new one starts until resumed."
        } else {
            "Every machine moved goes back to the last stable image."
        };
        return confirm_page(
            "Confirm a rollout command",
            html! { (name) " the rollout of " code { (role) } "? " (what) },
            &format!("/ui/rollouts/{role}/{name}"),
            &[],
            html! {},
            name,
            "/ui/roles",
        );
    }
    match crate::rollouts::command(r.store.clone(), role, command).await {
        Ok(_) => axum::response::Redirect::to("/ui/roles").into_response(),
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            let body = html! {
                p.error { (e.message) }
                p { a href="/ui/roles" { "Back to the roles" } }
            };
            (status, crate::console::page("Refused", false, body)).into_response()
        }
    }
}

pub async fn promote(State((r, _)): State<PageState>, post: ActionPost) -> Response {
    rollout_form(r, post, paddock_rollout::Command::Promote).await
}

pub async fn pause(State((r, _)): State<PageState>, post: ActionPost) -> Response {
    rollout_form(r, post, paddock_rollout::Command::Pause).await
}

pub async fn resume(State((r, _)): State<PageState>, post: ActionPost) -> Response {
    rollout_form(r, post, paddock_rollout::Command::Resume).await
}

pub async fn revert(State((r, _)): State<PageState>, post: ActionPost) -> Response {
    rollout_form(r, post, paddock_rollout::Command::Revert).await
}
