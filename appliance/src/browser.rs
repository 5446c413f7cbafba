//! What a browser may send on an operator's behalf without the operator meaning it. A
//! browser attaches the console's cookie and, once chosen, a client certificate to any
//! request to this origin, including one a page on another site starts. So a request that
//! changes something and is authenticated that way (no `Authorization` header) must come
//! from our own pages: same origin, and, outside the console's forms, a body type that a
//! page elsewhere cannot send without a CORS preflight (which this server never grants).
//! Pure: headers in, a verdict out.

use axum::http::{HeaderMap, Method, header};

/// Whether the request came from a page of this origin: `Sec-Fetch-Site` (when the browser
/// sends it) says same-origin or none (typed by the operator), and `Origin` (when present)
/// names the host the request was sent to. A client that is not a browser sends neither.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let get = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, rest)| rest.trim_end_matches('/') == host),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// The body types a page on another site may send without a preflight.
fn simple_body(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
    )
}

/// Checks a request whose credential the browser attached by itself (the console's cookie,
/// or a client certificate without an `Authorization` header). `Err` says why it is refused.
pub fn check_ambient(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<(), AmbientRefusal> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let call = || (method.to_string(), path.to_string());
    if !same_origin(headers) {
        let (method, path) = call();
        return Err(AmbientRefusal::OtherSite { method, path });
    }
    // The console's forms are form posts by design; the API takes JSON or binary bodies.
    if !path.starts_with("/ui/") && simple_body(headers) {
        let (method, path) = call();
        return Err(AmbientRefusal::SimpleBody { method, path });
    }
    Ok(())
}

/// Why a request carrying a browser's ambient credential is refused.
#[derive(Debug, thiserror::Error)]
pub enum AmbientRefusal {
    #[error(
        "{method} {path}: a request from another site is refused (its Origin or \
         Sec-Fetch-Site is not this console's)"
    )]
    OtherSite { method: String, path: String },
    #[error(
        "{method} {path}: a form or text body is refused on the API with a cookie or a \
         browser's certificate; send application/json"
    )]
    SimpleBody { method: String, path: String },
}

/// Headers every answer carries: no framing by other sites, no content sniffing.
pub const HARDENING: [(&str, &str); 3] = [
    ("content-security-policy", "frame-ancestors 'none'"),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn what_a_browser_may_send_by_itself() {
        let host = ("host", "198.18.0.1:8443");
        let ours = ("origin", "https://198.18.0.1:8443");
        let theirs = ("origin", "https://evil.example");
        let json = ("content-type", "application/json");
        let form = ("content-type", "application/x-www-form-urlencoded");
        let text = ("content-type", "text/plain;charset=UTF-8");
        let cross = ("sec-fetch-site", "cross-site");
        let post = Method::POST;
        for (method, path, h, ok) in [
            (&Method::GET, "/api/v1/nodes", vec![host, theirs], true),
            (
                &post,
                "/api/v1/nodes/n/clean",
                vec![host, theirs, form],
                false,
            ),
            (
                &post,
                "/api/v1/nodes/n/clean",
                vec![host, ours, form],
                false,
            ),
            (&post, "/api/v1/nodes/n/clean", vec![host, ours, json], true),
            (&post, "/v1/rules", vec![host, text], false),
            (&post, "/v1/rules", vec![host, cross, json], false),
            (&post, "/rpc/Dominator.Resume", vec![host], true),
            (&post, "/ui/nodes/n/clean", vec![host, ours, form], true),
            (&post, "/ui/nodes/n/clean", vec![host, theirs, form], false),
            (&post, "/ui/login", vec![host, cross, form], false),
            (
                &post,
                "/ui/nodes/n/clean",
                vec![host, ("sec-fetch-site", "same-origin"), form],
                true,
            ),
        ] {
            assert_eq!(
                check_ambient(method, path, &headers(&h)).is_ok(),
                ok,
                "{method} {path} {h:?}"
            );
        }
    }
}
