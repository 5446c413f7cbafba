//! Bounded retries: transient failures ([`crate::ErrorKind::transient`]: unreachable, busy)
//! are tried again after growing pauses, at most `attempts` times in all; any other failure
//! ends at once (a wrong password tried again can lock the BMC's account). The pauses are
//! jittered: the BMCs of a rack that went down together are not all retried together.

use std::time::Duration;

use paddock_clock::Backoff;

use crate::PowerError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all, the first included (at least 1).
    pub attempts: u32,
    /// The pause after the first failure; each next pause doubles, up to `max_delay` (each
    /// jittered within [half, all] of its step).
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// 3 tries, pauses of 1 s and 2 s.
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// One try, no retry.
    pub const ONCE: RetryPolicy = RetryPolicy {
        attempts: 1,
        first_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
    };

    /// A fresh schedule of pauses for one operation's tries.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.first_delay, self.max_delay)
    }

    /// The pause before try number `failed + 1` after `failed` tries ended in `error` (the
    /// next of `backoff`), or `None` if there is none to make.
    pub fn delay_after(
        &self,
        failed: u32,
        error: &PowerError,
        backoff: &mut Backoff,
    ) -> Option<Duration> {
        if !error.kind.transient() || failed >= self.attempts.max(1) {
            return None;
        }
        Some(backoff.next_delay())
    }

    /// Runs `op` until it succeeds, fails for good, or the tries are spent; `sleep` makes
    /// the pauses (the real clock in the drivers, a recorder in tests).
    pub fn run<T>(
        &self,
        mut sleep: impl FnMut(Duration),
        mut op: impl FnMut() -> Result<T, PowerError>,
    ) -> Result<T, PowerError> {
        let mut backoff = self.backoff();
        let mut failed = 0;
        loop {
            match op() {
                Ok(v) => return Ok(v),
                Err(e) => {
                    failed += 1;
                    match self.delay_after(failed, &e, &mut backoff) {
                        Some(d) => sleep(d),
                        None if failed > 1 => {
                            return Err(PowerError {
                                message: format!("{} (after {failed} tries)", e.message),
                                ..e
                            });
                        }
                        None => return Err(e),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn err(kind: ErrorKind) -> PowerError {
        PowerError::new(kind, "x")
    }

    #[test]
    fn transient_failures_are_tried_a_bounded_number_of_times_with_growing_pauses() {
        let policy = RetryPolicy {
            attempts: 4,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(3),
        };
        let (mut slept, mut tries) = (Vec::new(), 0);
        let r: Result<(), _> = policy.run(
            |d| slept.push(d),
            || {
                tries += 1;
                Err(err(ErrorKind::Unreachable))
            },
        );
        assert_eq!(tries, 4);
        // 1 s doubling, capped at 3 s; each pause within [step/2, step].
        assert_eq!(slept.len(), 3, "{slept:?}");
        for (d, step) in slept.iter().zip([1_000, 2_000, 3_000]) {
            assert!(
                (step / 2..=step).contains(&d.as_millis()),
                "{d:?} outside its step of {step} ms"
            );
        }
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unreachable);
        assert_eq!(e.message, "x (after 4 tries)");
    }

    #[test]
    fn credentials_and_other_lasting_failures_are_never_retried() {
        for kind in [
            ErrorKind::Credentials,
            ErrorKind::Unsupported,
            ErrorKind::BadAnswer,
            ErrorKind::Refused,
            ErrorKind::Tls,
        ] {
            let mut tries = 0;
            let r: Result<(), _> = RetryPolicy::default().run(
                |_| panic!("no pause expected for {kind:?}"),
                || {
                    tries += 1;
                    Err(err(kind))
                },
            );
            assert_eq!((tries, r.unwrap_err().kind), (1, kind));
        }
    }

    #[test]
    fn a_success_after_a_busy_answer_is_a_success() {
        let mut answers = vec![Ok(7), Err(err(ErrorKind::Busy))];
        let mut slept = Vec::new();
        let r = RetryPolicy::default().run(|d| slept.push(d), || answers.pop().unwrap());
        assert_eq!(r, Ok(7));
        assert!(
            matches!(slept[..], [d] if d >= Duration::from_millis(500) && d <= Duration::from_secs(1)),
            "one pause of 1 s, jittered: {slept:?}"
        );
        let once: Result<(), _> =
            RetryPolicy::ONCE.run(|_| panic!("no pause"), || Err(err(ErrorKind::Busy)));
        assert_eq!(once.unwrap_err().message, "x");
    }
}
