//! The provisioning routes of the appliance, over any [`Transport`] (the agent's client, or
//! a script in tests), with the retry policy: connection errors and 5xx are retried with
//! backoff, any other answer that is not 2xx is final (the appliance refused: the run stops;
//! 409 is the node's state refusing the event, 400 a body or event the agent may not send).

use std::time::Duration;

use paddock_birther::Event;
use paddock_clock::Backoff;
use serde::Serialize;
use serde_json::Value;

use super::{Assignment, NextRequest, Register, Report};
use crate::http::{HttpError, Response, Transport};

/// Reports and registration: 1 s doubling to 15 s, jittered (a rack provisioned at once
/// does not retry at once).
pub fn backoff() -> Backoff {
    Backoff::new(Duration::from_secs(1), Duration::from_secs(15))
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{what}: the appliance answered HTTP {status}: {message}")]
    Refused {
        what: String,
        status: u16,
        message: String,
    },
    #[error("{what}: no answer after {tries} tries; last: {last}")]
    GaveUp {
        what: String,
        tries: u32,
        last: String,
    },
    #[error("{what}: cannot read the answer: {why}")]
    BadAnswer { what: String, why: String },
}

impl CallError {
    /// The appliance answered and refused (as opposed to not answering).
    pub fn refused(&self) -> bool {
        matches!(self, CallError::Refused { .. })
    }
}

/// One call, retried: `tries` attempts (0: until an answer), `pause(delay, why)` between them.
pub fn call(
    t: &mut dyn Transport,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    tries: u32,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<Response, CallError> {
    let what = format!("{method} {path}");
    let mut backoff = backoff();
    let mut attempt = 0u32;
    loop {
        let why = match t.send(method, path, body) {
            Ok(r) if (200..300).contains(&r.status) => return Ok(r),
            // 409 is the state machine's refusal (final), not a lock to wait for.
            Ok(r) if r.status >= 500 => {
                format!("HTTP {}: {}", r.status, r.error_message())
            }
            Ok(r) => {
                return Err(CallError::Refused {
                    what,
                    status: r.status,
                    message: r.error_message(),
                });
            }
            Err(e @ (HttpError::Resolve { .. } | HttpError::Connect { .. })) => e.to_string(),
            Err(e @ HttpError::Exchange { .. }) => e.to_string(),
        };
        attempt += 1;
        if tries != 0 && attempt >= tries {
            return Err(CallError::GaveUp {
                what,
                tries,
                last: why,
            });
        }
        pause(backoff.next_delay(), &why);
    }
}

/// A JSON `POST`, retried as [`call`].
fn post<T: Serialize>(
    t: &mut dyn Transport,
    path: &str,
    body: &T,
    tries: u32,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<Response, CallError> {
    // These bodies are plain structs of strings: serialising cannot fail.
    let body = serde_json::to_vec(body).unwrap_or_default();
    call(t, "POST", path, Some(&body), tries, pause)
}

/// `POST /api/v1/provision/next`: what this machine (known by its MACs) is to do.
pub fn next(
    t: &mut dyn Transport,
    macs: &[String],
    tries: u32,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<Assignment, CallError> {
    let path = "/api/v1/provision/next";
    let macs = NextRequest {
        macs: macs.to_vec(),
    };
    let r = post(t, path, &macs, tries, pause)?;
    serde_json::from_slice(&r.body).map_err(|e| CallError::BadAnswer {
        what: format!("POST {path}"),
        why: format!(
            "{e} in {}",
            super::clip(&String::from_utf8_lossy(&r.body), 300)
        ),
    })
}

/// `POST /api/v1/provision/{node}/report`.
pub fn report(
    t: &mut dyn Transport,
    node: &str,
    event: &Event,
    tries: u32,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<(), CallError> {
    let path = format!("/api/v1/provision/{node}/report");
    let report = Report {
        event: event.clone(),
    };
    post(t, &path, &report, tries, pause).map(|_| ())
}

/// `POST /api/v1/provision/{node}/register`.
pub fn register(
    t: &mut dyn Transport,
    node: &str,
    address: &str,
    tries: u32,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<(), CallError> {
    let path = format!("/api/v1/provision/{node}/register");
    let address = Register {
        address: address.to_string(),
    };
    post(t, &path, &address, tries, pause).map(|_| ())
}

/// `GET /api/v1/provision/{node}?wait_sync_secs=N`: the node's provisioning record (one
/// try). While the run waits for subd's sync the appliance holds the answer until the
/// record changes, up to `wait` (whole seconds; an appliance that does not hold answers at
/// once).
pub fn record(t: &mut dyn Transport, node: &str, wait: Duration) -> Result<Value, CallError> {
    let path = format!("/api/v1/provision/{node}?wait_sync_secs={}", wait.as_secs());
    let r = call(t, "GET", &path, None, 1, &mut |_, _| {})?;
    serde_json::from_slice(&r.body).map_err(|e| CallError::BadAnswer {
        what: format!("GET {path}"),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tests::{Script, assert_jittered, refused, resp};
    use paddock_birther::{Operation, Step};
    use serde_json::json;

    #[test]
    fn next_asks_with_the_macs() {
        let mut s = Script::new(vec![
            refused(),
            resp(503, "starting"),
            resp(
                200,
                r#"{"node":"n-1","mode":"birth","image":"bootable","image_bytes":5,"hostname":"web-1","subd_port":6969,"filter":["/etc/hostname$"],"appliance_url":"http://p"}"#,
            ),
        ]);
        let mut pauses = Vec::new();
        let a = next(&mut s, &["52:54:00:00:00:01".into()], 0, &mut |d, _| {
            pauses.push(d)
        })
        .unwrap();
        assert_eq!(a.mode, Some(Operation::Birth));
        assert_eq!(a.node.as_deref(), Some("n-1"));
        assert_jittered(&pauses, &[1, 2], "next");
        let (m, p, body) = &s.requests[0];
        assert_eq!((m.as_str(), p.as_str()), ("POST", "/api/v1/provision/next"));
        assert_eq!(
            serde_json::from_slice::<Value>(body.as_ref().unwrap()).unwrap(),
            json!({"macs": ["52:54:00:00:00:01"]})
        );
        let mut s = Script::new(vec![resp(200, "not json")]);
        let e = next(&mut s, &[], 1, &mut |_, _| {}).unwrap_err();
        assert!(e.to_string().contains("cannot read the answer"), "{e}");
    }

    #[test]
    fn reports_retry_until_an_answer_and_stop_on_a_refusal() {
        let ev = Event::StepDone {
            step: Step::StartSubd,
        };
        let mut s = Script::new(vec![refused(), resp(500, "boom"), resp(204, "")]);
        report(&mut s, "n-1", &ev, 0, &mut |_, _| {}).unwrap();
        assert_eq!(s.requests.len(), 3);
        assert_eq!(s.requests[2].1, "/api/v1/provision/n-1/report");
        assert_eq!(
            serde_json::from_slice::<Value>(s.requests[2].2.as_ref().unwrap()).unwrap(),
            json!({"event": {"event": "step_done", "step": "start_subd"}})
        );
        let mut s = Script::new(vec![resp(
            400,
            r#"{"error":{"message":"step done does not apply to a node in clean"}}"#,
        )]);
        let e = report(&mut s, "n-1", &ev, 0, &mut |_, _| {}).unwrap_err();
        assert!(e.refused());
        assert_eq!(
            e.to_string(),
            "POST /api/v1/provision/n-1/report: the appliance answered HTTP 400: step done does not apply to a node in clean"
        );
        let mut s = Script::new(vec![refused(), refused(), refused()]);
        let e = report(&mut s, "n-1", &ev, 3, &mut |_, _| {}).unwrap_err();
        assert!(
            !e.refused() && e.to_string().contains("after 3 tries"),
            "{e}"
        );
    }

    #[test]
    fn register_and_record() {
        let mut s = Script::new(vec![
            resp(200, "{}"),
            resp(200, r#"{"state":"birth","synced":true}"#),
        ]);
        register(&mut s, "n-1", "198.18.0.20", 0, &mut |_, _| {}).unwrap();
        assert_eq!(s.requests[0].1, "/api/v1/provision/n-1/register");
        assert_eq!(
            serde_json::from_slice::<Value>(s.requests[0].2.as_ref().unwrap()).unwrap(),
            json!({"address": "198.18.0.20"})
        );
        let r = record(&mut s, "n-1", Duration::from_secs(5)).unwrap();
        assert_eq!(
            super::super::sync_status(&r),
            super::super::SyncStatus::Synced
        );
        assert_eq!(
            (s.requests[1].0.as_str(), s.requests[1].1.as_str()),
            ("GET", "/api/v1/provision/n-1?wait_sync_secs=5")
        );
    }
}
