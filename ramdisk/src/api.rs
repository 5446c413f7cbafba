//! The agent's side of the appliance contract.
//!
//! * `POST /v1/continue` — the IPA introspection data; 200 `{"uuid": …}`. Retried like IPA:
//!   5 tries, backoff 5 → 30 s, on connection errors, 5xx and 409; any other status ≥ 300 is
//!   final.
//! * `GET /api/v1/agent/{uuid}/next` — `{"action": "poweroff" | "reboot" | "wait"}`.
//! * `POST /api/v1/agent/events` — `{"mac", "step", "message", "level": "info"|"error"}`,
//!   best effort.

use std::time::Duration;

use paddock_clock::Backoff;
use paddock_inventory::IntrospectionData;
use serde::{Deserialize, Serialize};

use crate::http::{HttpError, Response, Transport};

/// IPA's retry delays: 5 s doubling to 30 s, jittered so that a rack of machines booted
/// together does not retry together.
pub fn ipa_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(5), Duration::from_secs(30))
}
pub const CONTINUE_TRIES: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum ContinueError {
    #[error("the appliance refused the introspection data: HTTP {status}: {message}")]
    Rejected { status: u16, message: String },
    #[error("could not post the introspection data after {tries} tries; last error: {last}")]
    GaveUp { tries: u32, last: String },
    #[error("the appliance answered 200 without a node uuid: {0}")]
    BadReply(String),
    #[error("cannot encode the introspection data: {0}")]
    Encode(#[source] serde_json::Error),
}

/// What to do with one `/v1/continue` attempt's result.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Done(String),
    Retry(String),
    Final(u16, String),
}

pub fn classify_continue(r: &Result<Response, HttpError>) -> Verdict {
    match r {
        Err(e) => Verdict::Retry(e.to_string()),
        Ok(resp) if (200..300).contains(&resp.status) => {
            match serde_json::from_slice::<serde_json::Value>(&resp.body)
                .ok()
                .and_then(|v| v.get("uuid")?.as_str().map(str::to_string))
            {
                Some(u) if !u.is_empty() => Verdict::Done(u),
                _ => Verdict::Final(
                    resp.status,
                    format!("no uuid in {:?}", String::from_utf8_lossy(&resp.body)),
                ),
            }
        }
        Ok(resp) if resp.status == 409 || resp.status >= 500 => {
            Verdict::Retry(format!("HTTP {}: {}", resp.status, resp.error_message()))
        }
        Ok(resp) => Verdict::Final(resp.status, resp.error_message()),
    }
}

/// Posts the data, retrying as IPA does; `pause(delay, why)` is called before each retry.
pub fn post_continue(
    t: &mut dyn Transport,
    data: &IntrospectionData,
    tries: u32,
    backoff: &mut Backoff,
    pause: &mut dyn FnMut(Duration, &str),
) -> Result<String, ContinueError> {
    let body = serde_json::to_vec(data).map_err(ContinueError::Encode)?;
    let mut last = String::new();
    for attempt in 0..tries {
        match classify_continue(&t.send("POST", "/v1/continue", Some(&body))) {
            Verdict::Done(uuid) => return Ok(uuid),
            Verdict::Final(status, message) if (200..300).contains(&status) => {
                return Err(ContinueError::BadReply(message));
            }
            Verdict::Final(status, message) => {
                return Err(ContinueError::Rejected { status, message });
            }
            Verdict::Retry(why) => {
                last = why;
                if attempt + 1 < tries {
                    pause(backoff.next_delay(), &last);
                }
            }
        }
    }
    Err(ContinueError::GaveUp { tries, last })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Poweroff,
    Reboot,
    Wait,
}

#[derive(Debug, thiserror::Error)]
pub enum NextError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error(
        "cannot understand the answer {body:?}: want {{\"action\": \"poweroff\"|\"reboot\"|\"wait\"}}"
    )]
    Body { body: String },
}

#[derive(Deserialize)]
struct Next {
    action: Action,
}

pub fn parse_next(r: Response) -> Result<Action, NextError> {
    if !(200..300).contains(&r.status) {
        return Err(NextError::Status {
            status: r.status,
            message: r.error_message(),
        });
    }
    serde_json::from_slice::<Next>(&r.body)
        .map(|n| n.action)
        .map_err(|_| NextError::Body {
            body: String::from_utf8_lossy(&r.body).chars().take(200).collect(),
        })
}

pub fn next_action(t: &mut dyn Transport, uuid: &str) -> Result<Action, NextError> {
    parse_next(t.send("GET", &format!("/api/v1/agent/{uuid}/next"), None)?)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub mac: String,
    pub step: String,
    pub message: String,
    pub level: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot encode the event: {0}")]
    Encode(#[source] serde_json::Error),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("HTTP {status}: {message}")]
    Status { status: u16, message: String },
}

/// Posts one event; the caller ignores failures.
pub fn report(t: &mut dyn Transport, ev: &Event) -> Result<(), ReportError> {
    let body = serde_json::to_vec(ev).map_err(ReportError::Encode)?;
    let r = t.send("POST", "/api/v1/agent/events", Some(&body))?;
    if (200..300).contains(&r.status) {
        Ok(())
    } else {
        Err(ReportError::Status {
            status: r.status,
            message: r.error_message(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Replays scripted results and records requests.
    pub(crate) struct Script {
        pub replies: VecDeque<Result<Response, HttpError>>,
        pub requests: Vec<(String, String, Option<Vec<u8>>)>,
    }

    impl Script {
        pub(crate) fn new(replies: Vec<Result<Response, HttpError>>) -> Self {
            Self {
                replies: replies.into(),
                requests: Vec::new(),
            }
        }
    }

    impl Transport for Script {
        fn send(
            &mut self,
            method: &str,
            path: &str,
            body: Option<&[u8]>,
        ) -> Result<Response, HttpError> {
            self.requests
                .push((method.into(), path.into(), body.map(<[u8]>::to_vec)));
            self.replies.pop_front().unwrap_or_else(|| {
                Err(HttpError::Exchange {
                    addr: "script".into(),
                    source: ureq::Error::Other("script exhausted".into()),
                })
            })
        }
    }

    pub(crate) fn resp(status: u16, body: &str) -> Result<Response, HttpError> {
        Ok(Response {
            status,
            body: body.as_bytes().to_vec(),
        })
    }

    pub(crate) fn refused() -> Result<Response, HttpError> {
        Err(HttpError::Connect {
            addr: "198.18.0.1:8080".into(),
            source: ureq::Error::Io(std::io::ErrorKind::ConnectionRefused.into()),
        })
    }

    /// Each pause lies within its step's jitter: [step/2, step], the steps in seconds.
    pub(crate) fn assert_jittered(pauses: &[Duration], steps: &[u64], what: &str) {
        assert_eq!(pauses.len(), steps.len(), "{what}: {pauses:?}");
        for (d, step) in pauses.iter().zip(steps) {
            let step = Duration::from_secs(*step);
            assert!(
                *d >= step / 2 && *d <= step,
                "{what}: {d:?} outside [{:?}, {step:?}] in {pauses:?}",
                step / 2
            );
        }
    }

    #[test]
    fn backoff_is_ipa_like() {
        let mut b = ipa_backoff();
        let d: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        assert_jittered(&d, &[5, 10, 20, 30, 30, 30], "IPA");
    }

    #[test]
    fn continue_retry_table() {
        let uuid = r#"{"uuid":"11111111-1111-1111-1111-111111111111"}"#;
        struct Case {
            what: &'static str,
            replies: Vec<Result<Response, HttpError>>,
            want: Result<&'static str, &'static str>,
            pauses: &'static [u64],
        }
        let cases = vec![
            Case {
                what: "first try",
                replies: vec![resp(200, uuid)],
                want: Ok("11111111-1111-1111-1111-111111111111"),
                pauses: &[],
            },
            Case {
                what: "5xx, refused and 409 are retried",
                replies: vec![
                    resp(503, "busy"),
                    refused(),
                    resp(409, r#"{"error":{"message":"locked"}}"#),
                    resp(200, uuid),
                ],
                want: Ok("11111111-1111-1111-1111-111111111111"),
                pauses: &[5, 10, 20],
            },
            Case {
                what: "400 is final",
                replies: vec![
                    resp(500, ""),
                    resp(
                        400,
                        r#"{"error":{"message":"Look up error: Could not find a node for attributes"}}"#,
                    ),
                ],
                want: Err(
                    "refused the introspection data: HTTP 400: Look up error: Could not find a node for attributes",
                ),
                pauses: &[5],
            },
            Case {
                what: "five failures give up",
                replies: vec![
                    refused(),
                    refused(),
                    refused(),
                    resp(502, "bad gateway"),
                    resp(500, "boom"),
                ],
                want: Err("after 5 tries; last error: HTTP 500: boom"),
                pauses: &[5, 10, 20, 30],
            },
            Case {
                what: "200 without uuid",
                replies: vec![resp(200, "{}")],
                want: Err("without a node uuid"),
                pauses: &[],
            },
        ];
        for c in cases {
            let mut s = Script::new(c.replies);
            let mut pauses = Vec::new();
            let data = IntrospectionData {
                error: Some("x".into()),
                ..Default::default()
            };
            let got = post_continue(
                &mut s,
                &data,
                CONTINUE_TRIES,
                &mut ipa_backoff(),
                &mut |d, _| pauses.push(d),
            );
            match (&got, c.want) {
                (Ok(u), Ok(w)) => assert_eq!(u, w, "{}", c.what),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{}: {e}", c.what),
                _ => panic!("{}: got {got:?}", c.what),
            }
            assert_jittered(&pauses, c.pauses, c.what);
            let (m, p, body) = &s.requests[0];
            assert_eq!((m.as_str(), p.as_str()), ("POST", "/v1/continue"));
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(body.as_ref().unwrap()).unwrap()["error"],
                "x"
            );
        }
    }

    #[test]
    fn next_actions() {
        type Case = (Result<Response, HttpError>, Result<Action, &'static str>);
        let cases: Vec<Case> = vec![
            (resp(200, r#"{"action":"poweroff"}"#), Ok(Action::Poweroff)),
            (
                resp(200, r#"{"action":"reboot","extra":1}"#),
                Ok(Action::Reboot),
            ),
            (resp(200, r#"{"action":"wait"}"#), Ok(Action::Wait)),
            (resp(200, r#"{"action":"dance"}"#), Err("cannot understand")),
            (
                resp(404, r#"{"error":{"message":"no such node"}}"#),
                Err("HTTP 404: no such node"),
            ),
            (refused(), Err("cannot connect")),
        ];
        for (reply, want) in cases {
            let mut s = Script::new(vec![reply]);
            let got = next_action(&mut s, "u-1");
            assert_eq!(s.requests[0].1, "/api/v1/agent/u-1/next");
            match (got, want) {
                (Ok(a), Ok(w)) => assert_eq!(a, w),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} vs {w}"),
                (g, w) => panic!("got {g:?} want {w:?}"),
            }
        }
    }

    #[test]
    fn events_are_posted_as_json() {
        let mut s = Script::new(vec![resp(204, ""), resp(404, "nope"), refused()]);
        let ev = Event {
            mac: "52:54:00:12:34:56".into(),
            step: "booted".into(),
            message: "hi".into(),
            level: "info".into(),
        };
        assert!(report(&mut s, &ev).is_ok());
        assert_eq!(
            report(&mut s, &ev).unwrap_err().to_string(),
            "HTTP 404: nope"
        );
        assert!(report(&mut s, &ev).is_err());
        let body: serde_json::Value =
            serde_json::from_slice(s.requests[0].2.as_ref().unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"mac": "52:54:00:12:34:56", "step": "booted", "message": "hi", "level": "info"})
        );
        assert_eq!(s.requests[0].1, "/api/v1/agent/events");
    }
}
