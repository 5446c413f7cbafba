//! Ironic Inspector's introspection state machine (`introspection_state.py`), as a table.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Starting,
    Waiting,
    Processing,
    Finished,
    Error,
    Reapplying,
    Enrolling,
    Aborting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Start,
    Wait,
    Process,
    Finish,
    Error,
    Timeout,
    Abort,
    AbortEnd,
    Reapply,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Waiting => "waiting",
            State::Processing => "processing",
            State::Finished => "finished",
            State::Error => "error",
            State::Reapplying => "reapplying",
            State::Enrolling => "enrolling",
            State::Aborting => "aborting",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "starting" => State::Starting,
            "waiting" => State::Waiting,
            "processing" => State::Processing,
            "finished" => State::Finished,
            "error" => State::Error,
            "reapplying" => State::Reapplying,
            "enrolling" => State::Enrolling,
            "aborting" => State::Aborting,
            _ => return None,
        })
    }

    /// An introspection is running: the node boots the ramdisk and is looked up on continue.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            State::Starting
                | State::Waiting
                | State::Processing
                | State::Enrolling
                | State::Reapplying
                | State::Aborting
        )
    }

    /// The transition table of the reference; `None` means "no defined transition".
    pub fn next(self, event: Event) -> Option<State> {
        use Event as E;
        use State as S;
        Some(match (self, event) {
            (S::Starting, E::Wait) => S::Waiting,
            (S::Starting, E::Error | E::Timeout) => S::Error,
            (S::Waiting, E::Process) => S::Processing,
            (S::Waiting, E::Start) => S::Starting,
            (S::Waiting, E::Abort) => S::Aborting,
            (S::Waiting, E::Timeout) => S::Error,
            (S::Processing, E::Finish) => S::Finished,
            (S::Processing, E::Error | E::Timeout) => S::Error,
            (S::Enrolling, E::Process) => S::Processing,
            (S::Enrolling, E::Error | E::Timeout) => S::Error,
            (S::Reapplying, E::Finish) => S::Finished,
            (S::Reapplying, E::Reapply) => S::Reapplying,
            (S::Reapplying, E::Error | E::Timeout) => S::Error,
            (S::Aborting, E::AbortEnd | E::Timeout) => S::Error,
            (S::Finished, E::Start) => S::Starting,
            (S::Finished, E::Reapply) => S::Reapplying,
            (S::Finished, E::Finish) => S::Finished,
            (S::Error, E::Start) => S::Starting,
            (S::Error, E::Reapply) => S::Reapplying,
            (S::Error, E::Abort | E::Error) => S::Error,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_table() {
        use Event as E;
        use State as S;
        let all_events = [
            E::Start,
            E::Wait,
            E::Process,
            E::Finish,
            E::Error,
            E::Timeout,
            E::Abort,
            E::AbortEnd,
            E::Reapply,
        ];
        let table: &[(S, &[(E, S)])] = &[
            (
                S::Starting,
                &[
                    (E::Wait, S::Waiting),
                    (E::Error, S::Error),
                    (E::Timeout, S::Error),
                ],
            ),
            (
                S::Waiting,
                &[
                    (E::Process, S::Processing),
                    (E::Start, S::Starting),
                    (E::Abort, S::Aborting),
                    (E::Timeout, S::Error),
                ],
            ),
            (
                S::Processing,
                &[
                    (E::Finish, S::Finished),
                    (E::Error, S::Error),
                    (E::Timeout, S::Error),
                ],
            ),
            (
                S::Enrolling,
                &[
                    (E::Process, S::Processing),
                    (E::Error, S::Error),
                    (E::Timeout, S::Error),
                ],
            ),
            (
                S::Reapplying,
                &[
                    (E::Finish, S::Finished),
                    (E::Reapply, S::Reapplying),
                    (E::Error, S::Error),
                    (E::Timeout, S::Error),
                ],
            ),
            (
                S::Aborting,
                &[(E::AbortEnd, S::Error), (E::Timeout, S::Error)],
            ),
            (
                S::Finished,
                &[
                    (E::Start, S::Starting),
                    (E::Reapply, S::Reapplying),
                    (E::Finish, S::Finished),
                ],
            ),
            (
                S::Error,
                &[
                    (E::Start, S::Starting),
                    (E::Reapply, S::Reapplying),
                    (E::Abort, S::Error),
                    (E::Error, S::Error),
                ],
            ),
        ];
        for (from, allowed) in table {
            for e in all_events {
                let want = allowed.iter().find(|(ev, _)| *ev == e).map(|(_, to)| *to);
                assert_eq!(from.next(e), want, "{from:?} --{e:?}-->");
            }
            assert_eq!(State::parse(from.as_str()), Some(*from));
        }
    }
}
