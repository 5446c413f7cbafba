//! Retry delays: the first, doubled on each failure up to a cap, each drawn with "equal
//! jitter" (half the step fixed, half random) so that many machines retrying after one
//! outage spread out instead of arriving together. For a peer that is down rather than
//! failing, [`Backoff::after_outage`] sizes the step by how long it has been down.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    step: Duration,
    rng: u64,
}

impl Backoff {
    /// Seeded from the system clock and the address of a stack value: distinct per process
    /// and per call site, which is all jitter needs.
    pub fn new(first: Duration, cap: Duration) -> Self {
        let marker = 0u8;
        let seed = crate::now().0.unsigned_abs() ^ ((&raw const marker) as u64).rotate_left(32);
        Self::with_seed(first, cap, seed)
    }

    /// A reproducible sequence (tests).
    pub fn with_seed(first: Duration, cap: Duration, seed: u64) -> Self {
        let first = first.max(Duration::from_millis(1));
        Backoff {
            first,
            cap: cap.max(first),
            step: first,
            rng: seed,
        }
    }

    /// The delay before the next attempt; each call doubles the step (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.cap);
        self.jittered(step)
    }

    /// The delay before the next attempt at a peer that has been unreachable for
    /// `down_for`: a quarter of that, between the first delay and the cap, with the same
    /// jitter. A peer that comes back (a machine that rebooted) is found within a quarter
    /// more of its outage, where doubling could wait as long again as the outage lasted;
    /// one that stays down is tried ever less often, and at the cap's pace in the end.
    pub fn after_outage(&mut self, down_for: Duration) -> Duration {
        self.jittered((down_for / 4).clamp(self.first, self.cap))
    }

    /// `step` with equal jitter: in `[step / 2, step]`.
    fn jittered(&mut self, step: Duration) -> Duration {
        let half = step / 2;
        let ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        let jitter = if ms == 0 { 0 } else { self.random() % (ms + 1) };
        (step - half) + Duration::from_millis(jitter)
    }

    /// After a success: the next failure starts from the first delay again.
    pub fn reset(&mut self) {
        self.step = self.first;
    }

    /// The step the next delay is drawn around (without jitter).
    pub fn step(&self) -> Duration {
        self.step
    }

    /// splitmix64: small, fast, and good enough to spread retries.
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn delays_double_up_to_the_cap_within_their_jitter() {
        let mut b = Backoff::with_seed(S, 8 * S, 7);
        for step in [1, 2, 4, 8, 8, 8] {
            let d = b.next_delay();
            let step = step * S;
            assert!(
                d >= step / 2 && d <= step,
                "{d:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
    }

    #[test]
    fn after_an_outage_the_step_is_a_quarter_of_it_within_first_and_cap() {
        let mut b = Backoff::with_seed(S, 300 * S, 5);
        for (down, step) in [(0, 1), (3, 1), (8, 2), (60, 15), (400, 100), (3_600, 300)] {
            let d = b.after_outage(down * S);
            let step = step * S;
            assert!(
                d >= step / 2 && d <= step,
                "down {down} s: {d:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
        // It leaves the doubling alone.
        assert_eq!(b.step(), S);
    }

    #[test]
    fn a_reset_starts_again_from_the_first_delay() {
        let mut b = Backoff::with_seed(S, 60 * S, 1);
        for _ in 0..5 {
            b.next_delay();
        }
        b.reset();
        assert_eq!(b.step(), S);
        assert!(b.next_delay() <= S);
    }

    #[test]
    fn two_seeds_spread_out() {
        let draws = |seed| {
            let mut b = Backoff::with_seed(10 * S, 10 * S, seed);
            (0..20).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        let (a, b) = (draws(1), draws(2));
        assert_ne!(a, b);
        assert!(
            a.iter().any(|d| *d != a[0]),
            "jitter varies the delay: {a:?}"
        );
    }

    #[test]
    fn a_zero_first_delay_still_waits() {
        let mut b = Backoff::with_seed(Duration::ZERO, Duration::ZERO, 3);
        assert!(b.next_delay() >= Duration::from_micros(500));
    }
}
