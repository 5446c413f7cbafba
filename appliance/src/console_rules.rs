//! The console's introspection rules page (`/ui/rules`): every rule with its conditions and
//! actions, a form that creates one from its JSON (Inspector's `POST /v1/rules` body, checked
//! by the same validation, whose message the page shows above the text kept as typed), and
//! deletion with a confirmation step.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use paddock_inspector::rules::Rule;
use serde_json::Value;

use super::{
    ActionPost, Console, confirm_page, done_or_refused, failure, ms_iso, page, refused_origin,
    same_origin,
};

/// An example the form starts with: a rule that tags machines with a lot of memory.
const EXAMPLE: &str = r#"{
  "description": "big machines",
  "conditions": [{"op": "ge", "field": "memory_mb", "value": 65536}],
  "actions": [{"action": "add-trait", "name": "CUSTOM_BIG"}]
}"#;

fn json_text(v: &[Value]) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The page: the rules, then the form (with `error` above it and `text` in it).
pub fn body(rules: &[Rule], text: &str, error: Option<&str>) -> Markup {
    html! {
        @if rules.is_empty() {
            p { "No rules: every machine is enrolled as it is found." }
        } @else {
            table #rules {
                tr { th { "Rule" } th { "Description" } th { "Conditions" } th { "Actions" } th { "Created (UTC)" } th {} }
                @for r in rules {
                    tr data-rule=(r.uuid) {
                        td { code { (r.uuid) } }
                        td { (r.description.as_deref().unwrap_or("")) }
                        td { code { (json_text(&r.conditions)) } }
                        td { code { (json_text(&r.actions)) } }
                        td { (ms_iso(Some(r.created_at.saturating_mul(1000)))) }
                        td {
                            form method="post" action={ "/ui/rules/" (r.uuid) "/delete" } {
                                button type="submit" { "Delete…" }
                            }
                        }
                    }
                }
            }
        }
        h2 #new-rule { "New rule" }
        @if let Some(e) = error {
            p.error #rule-error role="alert" { (e) }
        }
        form method="post" action="/ui/rules" {
            p { label for="rule-json" { "The rule as JSON (as " code { "POST /v1/rules" } " takes it)" } }
            textarea #rule-json name="rule" rows="10" cols="80" { (text) }
            p { button type="submit" { "Create rule" } }
        }
    }
}

async fn render(s: &Console, text: &str, error: Option<&str>) -> Response {
    match s.inspector.rules().await {
        Ok(rules) => page("Introspection rules", false, body(&rules, text, error)).into_response(),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, &e.message),
    }
}

/// `GET /ui/rules`.
pub async fn list(State(s): State<Console>) -> Response {
    render(&s, EXAMPLE, None).await
}

#[derive(serde::Deserialize)]
pub struct RuleForm {
    #[serde(default)]
    rule: String,
}

/// `POST /ui/rules` (`rule=JSON`): created, then back to the list (303); refused, the page
/// again with the validation's message above the text as it was typed. That page answers
/// 200, as form pages do: the refusal is the page's content (browsers log a 4xx document as
/// a console error, and the API's `POST /v1/rules` gives the status).
pub async fn create(
    State(s): State<Console>,
    headers: HeaderMap,
    axum::Form(f): axum::Form<RuleForm>,
) -> Response {
    if !same_origin(&headers) {
        return refused_origin();
    }
    let value: Value = match serde_json::from_str(&f.rule) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!("The rule is not valid JSON: {e}");
            return render(&s, &f.rule, Some(&msg)).await;
        }
    };
    let now = paddock_inspector::service::now_secs();
    match s.inspector.create_rule(&value, now).await {
        Ok(_) => Redirect::to("/ui/rules").into_response(),
        Err(e) => render(&s, &f.rule, Some(&e.message)).await,
    }
}

/// `POST /ui/rules/{uuid}/delete`: without `confirm=yes`, a page asking to confirm; with
/// it, the rule is deleted and the list shown again.
pub async fn delete(
    State(s): State<Console>,
    ActionPost {
        target: uuid,
        form: f,
    }: ActionPost,
) -> Response {
    if !f.confirmed() {
        return confirm_page(
            "Delete a rule?",
            html! { "Delete rule " code { (uuid) } "? Machines already processed keep what it did." },
            &format!("/ui/rules/{uuid}/delete"),
            &[],
            maud::html! {},
            "Delete the rule",
            "/ui/rules",
        );
    }
    done_or_refused("/ui/rules", s.inspector.delete_rule(&uuid).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_page_escapes_rules_and_keeps_the_text_typed() {
        let hostile = r#"<script>alert("x")</script>"#;
        let rule: Rule = serde_json::from_value(serde_json::json!({
            "uuid": "0b6c2a4e-0000-0000-0000-000000000001",
            "description": hostile,
            "conditions": [{"op": "eq", "field": "x", "value": hostile}],
            "actions": [],
        }))
        .unwrap();
        let html = body(&[rule], hostile, Some(hostile)).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert_eq!(html.matches("&lt;script&gt;").count(), 4, "{html}");
        assert!(html.contains(r#"id="rule-error""#), "{html}");
        assert!(
            html.contains(r#"action="/ui/rules/0b6c2a4e-0000-0000-0000-000000000001/delete""#),
            "{html}"
        );
    }
}
