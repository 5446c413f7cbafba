//! The console's live half: `/ui/events`, a server-sent-event stream of what changed in the
//! store (nodes, their provisioning records, power records and queued power-ons, their
//! timelines, images, DHCP leases), and the small script embedded
//! in the binary that listens to it and re-reads the parts of the page marked live.
//!
//! The stream carries names only (a node's UUID, a timeline's subject), never text from the
//! network: the script fetches the page again from the server, which renders it through the
//! same escaping templates, and swaps in the marked regions. So the pages stay readable with
//! JavaScript off (they then refresh themselves with a `<noscript>` meta refresh), and every
//! host serves the same stream, since it follows the store's watches, not this host's memory.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use paddock_inspector::service::EVENTS;
use paddock_store::{Store, Watch};

use super::Console;

/// The script every console page loads (no build step: the file is the source).
pub const SCRIPT: &str = include_str!("../assets/console.js");

/// Prefixes whose changes the console shows live, with the SSE event each becomes. A node's
/// power record (rewritten at every power-state sync) is its own event, which only that
/// node's page follows; a power-on queued or started is a node event (the dashboard shows
/// the queue).
const FOLLOWED: [(&str, &str); 7] = [
    (paddock_inspector::service::NODES, "node"),
    (crate::provisioning::PREFIX, "node"),
    (crate::power::QUEUE, "node"),
    (crate::power::STATE, "power"),
    (EVENTS, "timeline"),
    (IMAGES, "image"),
    (paddock_dhcp::shell::LEASE_PREFIX, "lease"),
];

/// The image index's prefix (`images/<name>`, names may hold `/`).
const IMAGES: &str = "images/";

/// `GET /ui/assets/console.js`.
pub async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
        .into_response()
}

/// What a store key says changed: the SSE event name and the subject (a node's UUID, or
/// `mac-…` for a timeline filed by MAC before its node existed). `None`: not shown.
pub fn change_of(key: &str) -> Option<(&'static str, &str)> {
    FOLLOWED.iter().find_map(|(prefix, event)| {
        let rest = key.strip_prefix(prefix)?;
        let subject = rest.split('/').next().filter(|s| !s.is_empty())?;
        Some((*event, subject))
    })
}

/// One SSE event for a store key; the data is JSON with the subject only.
fn sse_event(key: &str) -> Option<Event> {
    let (name, subject) = change_of(key)?;
    Some(
        Event::default()
            .event(name)
            .data(serde_json::json!({ "subject": subject }).to_string()),
    )
}

/// The watches behind one `/ui/events` stream, merged into one channel. Every watch is in
/// place before this returns (so before the stream opens): a change made once the page says
/// "live" is never missed.
async fn follow(store: Arc<dyn Store>) -> tokio::sync::mpsc::Receiver<Event> {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let nodes = super::node_view::view(&store);
    for (prefix, _) in FOLLOWED {
        let first = store.watch(prefix, 0).await;
        let (store, tx, nodes) = (store.clone(), tx.clone(), nodes.clone());
        tokio::spawn(async move {
            // A lagged or failed watch restarts from now: the page re-reads itself on the
            // `resync` event, so nothing missed stays missing.
            let mut first = Some(first);
            loop {
                let watch = match first.take() {
                    Some(w) => w,
                    None => store.watch(prefix, 0).await,
                };
                let mut w: Watch = match watch {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::warn!(prefix, error = %e, "console: cannot watch; retrying");
                        if tx
                            .send(Event::default().event("resync").data("{}"))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                loop {
                    // A closed page ends its watches at once, even on a quiet prefix.
                    let next = tokio::select! {
                        next = w.next() => next,
                        () = tx.closed() => return,
                    };
                    let restart = matches!(next, Some(Err(_)));
                    // A node change is sent once the machines list's view holds it, so the
                    // page's re-read shows it.
                    if let Some(Ok(ev)) = &next
                        && prefix == paddock_inspector::service::NODES
                    {
                        nodes
                            .wait_applied(ev.kv.mod_revision, Duration::from_secs(1))
                            .await;
                    }
                    let ev = match next {
                        Some(Ok(ev)) => sse_event(&ev.kv.key),
                        Some(Err(e)) => {
                            tracing::debug!(prefix, error = %e, "console: watch restarts");
                            Some(Event::default().event("resync").data("{}"))
                        }
                        None => return,
                    };
                    if let Some(ev) = ev
                        && tx.send(ev).await.is_err()
                    {
                        return;
                    }
                    if restart {
                        break;
                    }
                }
            }
        });
    }
    rx
}

/// `GET /ui/events`: the live stream; a comment every 15 s keeps proxies from closing it.
pub async fn events(
    State(s): State<Console>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = follow(s.dominator.store.clone()).await;
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok(ev), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_events_naming_their_subject_only() {
        let uuid = "0b6c2a4e-0000-0000-0000-000000000001";
        let mac = "mac-525400000001";
        let table = [
            (format!("nodes/{uuid}"), Some(("node", uuid))),
            (format!("provisioning/{uuid}"), Some(("node", uuid))),
            (format!("power/queue/{uuid}"), Some(("node", uuid))),
            (format!("power/state/{uuid}"), Some(("power", uuid))),
            (format!("power/introspection/{uuid}"), None),
            (
                format!("events/{uuid}/000001700000000-0001"),
                Some(("timeline", uuid)),
            ),
            (
                format!("events/{mac}/000001700000000-0001"),
                Some(("timeline", mac)),
            ),
            ("images/debian/a".into(), Some(("image", "debian"))),
            (
                "dhcp/leases/198.18.0.100".into(),
                Some(("lease", "198.18.0.100")),
            ),
            ("node-macs/525400000001".into(), None),
            ("nodes/".into(), None),
        ];
        for (key, want) in table {
            assert_eq!(change_of(&key), want, "{key}");
        }
    }
}
