//! Pausing and resuming the dominator from the console: every update (`POST /ui/subs`, as
//! `Dominator.Pause`/`Dominator.Resume`) and one sub's (`POST /ui/subs/{hostname}/pause`,
//! as `Dominator.PauseSub`/`ResumeSub`), through the dominator's own functions. A pause is
//! confirmed on a page that asks for its reason (the subs pages refresh themselves, so the
//! reason is not typed there); resuming is not destructive and needs no confirmation.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};

use super::{ActionForm, ActionPost, Console, SameOrigin, confirm_page, done_or_refused, failure};
use crate::dominator::{pause_all, pause_one, resume_all, resume_one};

/// The pause or resume button of `what` ("all updates", "this sub's updates"), posting to
/// `action`.
pub fn pause_form(action: &str, paused: bool, what: &str) -> Markup {
    let (verb, label) = if paused {
        ("resume", "Resume ")
    } else {
        ("pause", "Pause ")
    };
    html! {
        form.pause method="post" action=(action) {
            input type="hidden" name="action" value=(verb);
            button type="submit" { (label) (what) }
        }
    }
}

/// What a pause form asks: `None` to go on (resume, or a confirmed pause), else the
/// answer to give (a confirmation page, or a refusal).
fn ask(f: &ActionForm, action: &str, what: &str, back: &str) -> Option<Response> {
    match f.action.as_str() {
        "resume" => None,
        "pause" if f.confirmed() => None,
        "pause" => Some(confirm_page(
            "Pause updates?",
            html! { "Pause " (what) "? Nothing is updated until resumed; subs keep what they run." },
            action,
            &[("action", "pause")],
            html! {
                label { "Reason " input type="text" name="reason" required maxlength="500" size="60" value=(f.reason); }
                " "
            },
            "Pause",
            back,
        )),
        _ => Some(failure(
            StatusCode::BAD_REQUEST,
            "the dominator's actions are pause and resume",
        )),
    }
}

/// `POST /ui/subs` (`action=pause|resume`, `reason`): every update.
pub async fn all(
    State(s): State<Console>,
    _: SameOrigin,
    axum::Form(f): axum::Form<ActionForm>,
) -> Response {
    if let Some(answer) = ask(&f, "/ui/subs", "every sub's updates", "/ui/subs") {
        return answer;
    }
    let d = &s.dominator;
    if f.action == "pause" {
        done_or_refused("/ui/subs", pause_all(d, &f.reason).await)
    } else {
        done_or_refused("/ui/subs", resume_all(d).await)
    }
}

/// `POST /ui/subs/{hostname}/pause` (`action=pause|resume`, `reason`): one sub.
pub async fn one(
    State(s): State<Console>,
    ActionPost {
        target: hostname,
        form: f,
    }: ActionPost,
) -> Response {
    let back = format!("/ui/subs/{hostname}");
    let action = format!("{back}/pause");
    if let Some(answer) = ask(&f, &action, &format!("sub {hostname}"), &back) {
        return answer;
    }
    let d = &s.dominator;
    if f.action == "pause" {
        done_or_refused(&back, pause_one(d, &hostname, &f.reason).await)
    } else {
        done_or_refused(&back, resume_one(d, &hostname).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_button_says_what_it_does() {
        let html = pause_form("/ui/subs", false, "all updates").into_string();
        assert!(html.contains(r#"value="pause""#), "{html}");
        assert!(html.contains("Pause all updates"), "{html}");
        let html = pause_form("/ui/subs/h1/pause", true, "this sub's updates").into_string();
        assert!(html.contains(r#"value="resume""#), "{html}");
        assert!(html.contains(r#"action="/ui/subs/h1/pause""#), "{html}");
    }
}
