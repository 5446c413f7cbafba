//! The console's pages of the security domain: sign-in with an operator token, and the
//! audit log.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::security::Security;

pub fn router(sec: Arc<Security>) -> axum::Router {
    axum::Router::new()
        .route("/ui/audit", get(audit_page))
        .route("/ui/login", get(login_page).post(login))
        .with_state(sec)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login_page() -> Response {
    let body = maud::html! {
        p { "Paste an operator token (" code { "paddock certs token NAME --role read-only" } "), or use a client certificate." }
        form method="post" action="/ui/login" {
            label { "Token " input type="password" name="token" size="80" autocomplete="off"; }
            " " button type="submit" { "Sign in" }
        }
    };
    crate::console::page("Sign in", false, body).into_response()
}

async fn login(State(sec): State<Arc<Security>>, form: axum::Form<LoginForm>) -> Response {
    let tok = form.0.token.trim().to_string();
    match sec.operator_token(&tok).await {
        Ok(_) => Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, "/ui")
            .header(
                header::SET_COOKIE,
                format!("paddock_token={tok}; HttpOnly; Secure; SameSite=Strict; Path=/"),
            )
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()),
        Err(e) => (StatusCode::UNAUTHORIZED, format!("sign-in refused: {e}\n")).into_response(),
    }
}

/// `/ui/audit`: the newest entries, who did what to what, and the result.
async fn audit_page(State(sec): State<Arc<Security>>) -> Response {
    let entries = match sec.audit.log(200).await {
        Ok(e) => e,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let body = maud::html! {
        p { "Every mutating call (and every refused one by a known caller), newest first; "
            code { "paddock audit" } " shows the same." }
        table #audit {
            tr { th { "When (UTC)" } th { "Who" } th { "Proof" } th { "Method" } th { "On" } th { "Status" } th { "From" } }
            @for e in &entries {
                tr {
                    td { (httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(e.at_ms).unwrap_or(0)))) }
                    td { (e.who) }
                    td { (e.proof) }
                    td { code { (e.method) } }
                    td { code { (e.target) } }
                    td { (e.status) }
                    td { (e.peer) }
                }
            }
        }
    };
    crate::console::page("Audit log", false, body).into_response()
}
