//! A machine's power on its console page: the power record (state, when checked, the last
//! action and its error), its BMC's protocol and address (never credentials), and the
//! on/off/cycle/status buttons, which post through the API's own `Power::act`. Off and
//! cycle ask to confirm first, as deleting a rule does.

use axum::extract::State;
use axum::response::Response;
use maud::{Markup, html};
use paddock_inspector::node::Node;

use super::{ActionPost, Console, confirm_page, node_answer};
use crate::power::{Action, BmcSummary, Record, ThrottleView, bmc_of};

/// A Unix-ms time as the console shows it (`-` when unknown).
fn at(ms: Option<u64>) -> String {
    ms.map_or_else(
        || "-".to_string(),
        |ms| {
            let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
            paddock_inspector::node::iso(secs)
        },
    )
}

/// What the page knows of the node's BMC: none, bad settings (the reason), or its summary.
pub enum Managed {
    No,
    Bad(String),
    Yes(BmcSummary),
}

impl Managed {
    pub fn of(n: &Node) -> Managed {
        match bmc_of(n) {
            None => Managed::No,
            Some(Err(e)) => Managed::Bad(e.to_string()),
            Some(Ok(b)) => Managed::Yes(BmcSummary::of(&b)),
        }
    }
}

/// The power part of a machine's page.
pub fn body(node: uuid::Uuid, managed: &Managed, rec: &Record) -> Markup {
    html! {
        @match managed {
            Managed::No => {
                p #power-none { "No BMC: Paddock cannot power this machine on or off. Set its driver_info (redfish_address or ipmi_address, with credentials) to manage it." }
            }
            Managed::Bad(why) => {
                p.error #power-bad { "The BMC settings are not usable: " (why) }
            }
            Managed::Yes(bmc) => {
                table #power {
                    tr { th { "BMC" } td { (bmc.driver) " " code { (bmc.address) } } }
                    tr { th { "State" } td.state { (rec.state.as_deref().unwrap_or("unknown")) } }
                    tr { th { "Checked (UTC)" } td { (at(rec.checked_ms)) } }
                    @if let Some(e) = &rec.error {
                        tr { th { "Status error" } td.error { (e) } }
                    }
                    @if let Some(last) = &rec.last {
                        tr {
                            th { "Last action" }
                            td {
                                (last.action.as_str()) " at " (at(Some(last.at_ms)))
                                @match &last.error {
                                    None => { " — done" }
                                    Some(e) => { " — " span.error { (e) } }
                                }
                            }
                        }
                    }
                }
                p {
                    @for action in [Action::On, Action::Off, Action::Cycle, Action::Status] {
                        form.inline method="post" action={ "/ui/nodes/" (node) "/power" } {
                            input type="hidden" name="action" value=(action.as_str());
                            button type="submit" { "Power " (action.as_str()) }
                        }
                        " "
                    }
                    small { "(on and cycle wait for the power-on throttle)" }
                }
            }
        }
    }
}

/// The power section of the node page, read now (the record only: no BMC call).
pub async fn section(s: &Console, n: &Node) -> Markup {
    let managed = Managed::of(n);
    let rec = match managed {
        Managed::Yes(_) => s.power.record(n.uuid).await,
        _ => Record::default(),
    };
    body(n.uuid, &managed, &rec)
}

/// The throttle's line on the dashboard.
pub fn throttle(v: &ThrottleView) -> Markup {
    html! {
        p #throttle {
            (v.queued) " power-on(s) queued; at most " (v.max_power_ons) " per " (v.interval_secs) " s; "
            @if v.leading {
                "next slot " (v.next_slot_ms.map_or_else(|| "now".to_string(), |ms| format!("{} UTC", at(Some(ms)))))
            } @else {
                "the leader runs the throttle"
            }
        }
    }
}

/// `POST /ui/nodes/{node}/power` (`action=on|off|cycle|status`): as
/// `POST /api/v1/nodes/{node}/power`; off and cycle without `confirm=yes` answer a page
/// asking to confirm. Then back to the node's page, or the API's refusal.
pub async fn form(
    State(s): State<Console>,
    ActionPost {
        target: ident,
        form: f,
    }: ActionPost,
) -> Response {
    let Some(action) = Action::parse(&f.action) else {
        return node_answer::<()>(
            &ident,
            Err(paddock_wire::ApiError::bad_request(format!(
                "unknown power action {:?}: on, off, cycle or status",
                f.action
            ))),
        );
    };
    if matches!(action, Action::Off | Action::Cycle) && !f.confirmed() {
        let what = action.as_str();
        return confirm_page(
            "Confirm a power action",
            html! { "Power " (what) " machine " code { (ident) } "? Whatever it is running stops at once." },
            &format!("/ui/nodes/{ident}/power"),
            &[("action", what)],
            maud::html! {},
            &format!("Power {what}"),
            &format!("/ui/nodes/{ident}"),
        );
    }
    node_answer(&ident, s.power.act(&ident, action).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::Outcome;

    #[test]
    fn the_power_part_escapes_bmc_text_and_shows_buttons_only_with_a_bmc() {
        let hostile = r#"<script>alert("x")</script>"#;
        let node = uuid::Uuid::nil();
        let rec = Record {
            state: Some(hostile.into()),
            checked_ms: Some(1_700_000_000_000),
            error: Some(hostile.into()),
            last: Some(Outcome {
                id: uuid::Uuid::nil(),
                action: Action::Cycle,
                at_ms: 1_700_000_000_000,
                error: Some(hostile.into()),
            }),
        };
        let bmc = Managed::Yes(BmcSummary {
            driver: "redfish",
            address: hostile.into(),
        });
        let html = body(node, &bmc, &rec).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert_eq!(html.matches("&lt;script&gt;").count(), 4, "{html}");
        for a in ["on", "off", "cycle", "status"] {
            assert!(html.contains(&format!(r#"value="{a}""#)), "{a}: {html}");
        }
        assert!(html.contains(&format!(r#"action="/ui/nodes/{node}/power""#)));

        let none = body(node, &Managed::No, &Record::default()).into_string();
        assert!(none.contains("No BMC"), "{none}");
        assert!(!none.contains("<form"), "{none}");
        let bad = body(node, &Managed::Bad(hostile.into()), &Record::default()).into_string();
        assert!(!bad.contains("<script>") && !bad.contains("<form"), "{bad}");
    }

    #[test]
    fn the_throttle_line() {
        let v = ThrottleView {
            leading: true,
            queued: 3,
            next_slot_ms: Some(1_700_000_000_000),
            max_power_ons: 2,
            interval_secs: 10,
        };
        let html = throttle(&v).into_string();
        assert!(html.contains("3 power-on(s) queued"), "{html}");
        assert!(html.contains("2 per 10 s"), "{html}");
        assert!(html.contains("next slot 2023-11-14"), "{html}");
        let follower = throttle(&ThrottleView::default()).into_string();
        assert!(follower.contains("the leader runs"), "{follower}");
    }
}
