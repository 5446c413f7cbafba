//! Time as the pure cores see it: [`UnixMs`] instants, a [`Clock`] handed in (the system's
//! in the shells, a [`ManualClock`] in tests), and one [`Backoff`] for every retry loop.
//!
//! Nothing here sleeps: a shell asks the backoff how long to wait and waits itself, so a
//! test can drive the same code on a paused or manual clock.

mod backoff;

pub use backoff::Backoff;

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// An instant as milliseconds since the Unix epoch: what the store and the APIs carry.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct UnixMs(pub i64);

impl UnixMs {
    /// The instant `d` later (saturating: a far deadline stays far, never wraps).
    pub fn after(self, d: Duration) -> UnixMs {
        UnixMs(
            self.0
                .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long after `earlier` this is; zero when it is not later.
    pub fn since(self, earlier: UnixMs) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// Whole seconds since the epoch (what Inspector's API carries).
    pub fn secs(self) -> i64 {
        self.0.div_euclid(1000)
    }
}

/// Where a shell's "now" comes from; cores take the instant, shells take a clock.
pub trait Clock: Send + Sync {
    fn now(&self) -> UnixMs;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMs {
        now()
    }
}

/// The system's wall clock, read once (0 before the epoch).
pub fn now() -> UnixMs {
    UnixMs(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or(0),
    )
}

/// A clock that moves only when told: tests of expiry and holds run exactly and at once.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn at(t: UnixMs) -> Self {
        ManualClock(AtomicI64::new(t.0))
    }

    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set(&self, t: UnixMs) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMs {
        UnixMs(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_add_and_subtract_without_wrapping() {
        let t = UnixMs(1_000);
        assert_eq!(t.after(Duration::from_millis(500)), UnixMs(1_500));
        assert_eq!(
            UnixMs(i64::MAX - 1).after(Duration::from_secs(1)),
            UnixMs(i64::MAX)
        );
        assert_eq!(UnixMs(1_500).since(t), Duration::from_millis(500));
        assert_eq!(t.since(UnixMs(1_500)), Duration::ZERO);
        assert_eq!(UnixMs(1_999).secs(), 1);
        assert_eq!(UnixMs(-1).secs(), -1);
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::at(UnixMs(10));
        assert_eq!(c.now(), UnixMs(10));
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now(), UnixMs(2_010));
        c.set(UnixMs(5));
        assert_eq!(c.now(), UnixMs(5));
    }

    #[test]
    fn the_system_clock_is_after_2020() {
        assert!(SystemClock.now() > UnixMs(1_577_836_800_000));
    }
}
