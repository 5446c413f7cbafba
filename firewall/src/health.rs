//! Whether the filter may hand out the right to serve PXE, after errors.
//!
//! A failed reconcile (or apply) closes the filter: the `pass` rule (one host) or the
//! `leader` element (several hosts) goes. Closing is not for good: the filter retries sooner
//! than its reconcile period, backing off ([`Health::next_retry`]), and the first
//! whole-table reconcile that succeeds opens it again, if this host may serve
//! ([`Health::renders_pass`], [`leader_element`]). An incremental update never reopens: it
//! checks too little of the table.
//!
//! Pure: the appliance's shell (`appliance/src/pxe_filter.rs`) keeps one [`Health`], feeds
//! it the outcome of every sync and applies what it says.

use std::time::{Duration, Instant};

use paddock_clock::Backoff;

/// The first retry after a failure; each further failure doubles the wait (jittered, so
/// that hosts closed by one outage do not all retry at once), up to the cap the caller gives
/// (the reconcile period).
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// Where the doubling stops whatever the caller's cap: sixteen doublings (about nine hours).
const LONGEST_RETRY: Duration = Duration::from_millis(500 << 16);

#[derive(Clone, Debug, Default)]
pub enum Health {
    /// The last sync succeeded: the right to serve may be held.
    #[default]
    Serving,
    /// A sync failed, and none has succeeded since: the right to serve is withheld.
    ClosedAfterError(Closed),
}

#[derive(Clone, Debug)]
pub struct Closed {
    /// What the latest failed attempt said.
    pub error: String,
    /// When the filter closed (Unix ms, for people; the first failure, not the latest).
    pub since_ms: i64,
    /// Failed attempts in a row (1 after the first failure).
    pub attempts: u32,
    /// When the latest attempt failed (monotonic: the retry schedule runs from it).
    pub failed_at: Instant,
    /// How long after `failed_at` the next attempt is due (before the caller's cap): drawn
    /// once per failure, so that every reading of the schedule agrees.
    pub retry_after: Duration,
    /// Seeded with the first failure's Unix ms rather than a random source: the core stays
    /// pure, and hosts closed by one outage (at different milliseconds) draw different waits.
    backoff: Backoff,
}

impl Closed {
    /// How long after the latest failure the next attempt is due.
    pub fn backoff(&self, cap: Duration) -> Duration {
        self.retry_after.min(cap)
    }
}

impl Health {
    pub fn is_serving(&self) -> bool {
        matches!(self, Health::Serving)
    }

    pub fn closed(&self) -> Option<&Closed> {
        match self {
            Health::Serving => None,
            Health::ClosedAfterError(c) => Some(c),
        }
    }

    /// An attempt failed at `now` (`now_ms`: the same instant as Unix ms). Returns whether
    /// this closed the filter (it was serving): the one transition worth a log line.
    pub fn failed(&mut self, error: impl Into<String>, now: Instant, now_ms: i64) -> bool {
        let error = error.into();
        match self {
            Health::Serving => {
                let mut backoff = Backoff::with_seed(FIRST_RETRY, LONGEST_RETRY, now_ms as u64);
                *self = Health::ClosedAfterError(Closed {
                    error,
                    since_ms: now_ms,
                    attempts: 1,
                    failed_at: now,
                    retry_after: backoff.next_delay(),
                    backoff,
                });
                true
            }
            Health::ClosedAfterError(c) => {
                c.error = error;
                c.attempts = c.attempts.saturating_add(1);
                c.failed_at = now;
                c.retry_after = c.backoff.next_delay();
                false
            }
        }
    }

    /// A whole-table reconcile succeeded. Returns what it had been closed by, if it was
    /// (the other transition worth a log line).
    pub fn succeeded(&mut self) -> Option<Closed> {
        match std::mem::take(self) {
            Health::Serving => None,
            Health::ClosedAfterError(c) => Some(c),
        }
    }

    /// How long from `now` until the next attempt to reopen is due (`None`: serving,
    /// nothing to retry). `cap` is the longest wait (the reconcile period).
    pub fn next_retry(&self, now: Instant, cap: Duration) -> Option<Duration> {
        let c = self.closed()?;
        Some((c.failed_at + c.backoff(cap)).saturating_duration_since(now))
    }

    /// Whether a sync should render the static pass rule (one host). `entitled`: this host
    /// may serve PXE at all (not stopping, and the leader when leadership is followed).
    /// `whole_table`: the sync is a reconcile that compares and repairs the whole table;
    /// if it succeeds the filter serves again, and if it fails nothing of it was applied.
    /// An incremental update renders the rule only while serving.
    pub fn renders_pass(&self, entitled: bool, whole_table: bool) -> bool {
        entitled && (whole_table || self.is_serving())
    }

    /// Whether this host serves PXE now (the DHCP side's decision), given `entitled`.
    pub fn may_serve(&self, entitled: bool) -> bool {
        entitled && self.is_serving()
    }
}

/// Several hosts: how long this host's element in the kernel's `leader` set may live, if
/// it may hold one at all: only while it leads, its tenure has time left (`tenure_left`,
/// from the elector's clock: `None` once it has passed or this host does not lead) and
/// the filter is not closed after an error. A recovery never serves on a stale tenure: a
/// leader deposed while closed gets nothing back.
pub fn leader_element(
    health: &Health,
    leading: bool,
    tenure_left: Option<Duration>,
) -> Option<Duration> {
    let left = tenure_left.filter(|d| !d.is_zero())?;
    health.may_serve(leading).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(10);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn closes_once_backs_off_and_reopens_once() {
        let t0 = Instant::now();
        let mut h = Health::default();
        assert_eq!(h.next_retry(t0, CAP), None, "serving: nothing to retry");
        assert!(h.failed("nft refused the batch: busy", t0, 1_000), "closes");
        // (failure at, the step doubled from the first retry); the delay from the failure
        // is the step jittered, [step/2, step], then capped.
        let steps = [
            (0, 500),
            (500, 1_000),
            (1_500, 2_000),
            (3_500, 4_000),
            (7_500, 8_000),
            (15_500, 16_000),
            (25_500, 32_000),
        ];
        for (i, (at, step)) in steps.iter().enumerate() {
            if i > 0 {
                assert!(!h.failed(format!("try {i}"), t0 + ms(*at), 9_999), "stays");
            }
            let c = h.closed().unwrap();
            assert_eq!(c.attempts, i as u32 + 1);
            assert_eq!(c.since_ms, 1_000, "since the first failure");
            let (lo, hi) = (ms(step / 2).min(CAP), ms(*step).min(CAP));
            let delay = h.next_retry(t0 + ms(*at), CAP).unwrap();
            assert!(
                delay >= lo && delay <= hi,
                "step {i}: {delay:?} outside [{lo:?}, {hi:?}]"
            );
            assert_eq!(
                h.next_retry(t0 + ms(*at) + hi + ms(5), CAP),
                Some(Duration::ZERO),
                "overdue: at once"
            );
        }
        assert_eq!(h.closed().unwrap().error, "try 6", "the latest error");
        let was = h.succeeded().expect("reopens");
        assert_eq!((was.attempts, was.since_ms), (7, 1_000));
        assert!(h.is_serving());
        assert!(h.succeeded().is_none(), "a second success is no transition");
        assert_eq!(h.next_retry(t0, CAP), None);
        // A new failure starts the schedule again.
        h.failed("again", t0 + ms(30_000), 31_000);
        let first = h.next_retry(t0 + ms(30_000), CAP).unwrap();
        assert!(
            first >= FIRST_RETRY / 2 && first <= FIRST_RETRY,
            "{first:?}"
        );
        // A short period caps even the first wait; an absurd run of failures does not overflow.
        assert_eq!(h.next_retry(t0 + ms(30_000), ms(200)), Some(ms(200)));
        for _ in 0..100 {
            h.failed("x", t0, 0);
        }
        let longest = h.closed().unwrap().backoff(Duration::MAX);
        assert!(
            longest >= ms(500 << 15) && longest <= ms(500 << 16),
            "{longest:?}"
        );
    }

    #[test]
    fn who_serves() {
        let closed = {
            let mut h = Health::default();
            h.failed("e", Instant::now(), 0);
            h
        };
        let serving = Health::Serving;
        // (health, entitled, whole-table reconcile, renders the pass rule, may serve now)
        let cases = [
            (&serving, true, false, true, true),
            (&serving, true, true, true, true),
            (&serving, false, true, false, false),
            // Closed: only a whole-table reconcile tries to reopen, and only if entitled.
            (&closed, true, false, false, false),
            (&closed, true, true, true, false),
            (&closed, false, true, false, false),
            (&closed, false, false, false, false),
        ];
        for (h, entitled, whole, pass, serves) in cases {
            assert_eq!(
                h.renders_pass(entitled, whole),
                pass,
                "{h:?} entitled={entitled} whole={whole}"
            );
            assert_eq!(h.may_serve(entitled), serves, "{h:?} entitled={entitled}");
        }
    }

    #[test]
    fn a_deposed_leader_gets_no_element_back() {
        let t0 = Instant::now();
        let left = Some(Duration::from_secs(2));
        let mut h = Health::default();
        // (leading, tenure left, element)
        let serving = [
            (true, left, left),
            (true, None, None),
            (true, Some(Duration::ZERO), None),
            (false, left, None),
            (false, None, None),
        ];
        for (leading, tenure, want) in serving {
            assert_eq!(
                leader_element(&h, leading, tenure),
                want,
                "{leading} {tenure:?}"
            );
        }
        // Closed after an error: no element whatever the tenure says.
        h.failed("nft cannot read table inet paddock: busy", t0, 0);
        for (leading, tenure, _) in serving {
            assert_eq!(leader_element(&h, leading, tenure), None);
        }
        // Deposed while closed (the elector stepped down, the tenure ran out); the table
        // then recovers: still nothing.
        assert!(h.succeeded().is_some());
        assert_eq!(leader_element(&h, false, None), None);
        assert_eq!(leader_element(&h, false, left), None);
        assert_eq!(leader_element(&h, true, None), None, "stale tenure");
        // Still leading with time left: the element comes back.
        assert_eq!(leader_element(&h, true, left), left);
    }
}
