//! The power-on throttle (leader-only in the appliance): at most `limit` power-ons start in
//! any window of `interval`, across the appliance, so a rack does not trip its breaker when
//! many machines start at once. Nodes wait in one first-come queue, each node at most once
//! (asking again keeps its place), so no node is passed over. Pure: time (milliseconds on
//! any monotonic clock) is passed in; the shell calls [`Throttle::admit`] at
//! [`Throttle::next_wake`] and powers on what it returns.

use std::collections::VecDeque;
use std::time::Duration;

use crate::PowerError;

/// A power-on the throttle let through: when it was admitted and how it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started<K> {
    pub node: K,
    pub at_ms: u64,
    pub result: Result<(), PowerError>,
}

#[derive(Debug, Clone)]
pub struct Throttle<K> {
    limit: usize,
    interval_ms: u64,
    /// When each power-on of the current window was admitted, oldest first.
    admitted: VecDeque<u64>,
    queue: VecDeque<K>,
}

/// A throttle setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThrottleError {
    #[error("the power-on limit must be at least 1 per interval")]
    ZeroLimit,
    #[error("the power-on interval must be at least 1 ms")]
    ZeroInterval,
}

impl<K: PartialEq + Clone> Throttle<K> {
    pub fn new(limit: u32, interval: Duration) -> Result<Throttle<K>, ThrottleError> {
        // A limit beyond usize (16-bit targets) is no limit at all.
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if limit == 0 {
            return Err(ThrottleError::ZeroLimit);
        }
        let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        if interval_ms == 0 {
            return Err(ThrottleError::ZeroInterval);
        }
        Ok(Throttle {
            limit,
            interval_ms,
            admitted: VecDeque::new(),
            queue: VecDeque::new(),
        })
    }

    /// Queues `node` for a power-on; `false` if it was already waiting (it keeps its place).
    pub fn request(&mut self, node: K) -> bool {
        if self.queue.contains(&node) {
            return false;
        }
        self.queue.push_back(node);
        true
    }

    /// Takes `node` out of the queue (deleted, powered on by hand …); `false` if absent.
    pub fn cancel(&mut self, node: &K) -> bool {
        let before = self.queue.len();
        self.queue.retain(|n| n != node);
        self.queue.len() != before
    }

    /// The nodes whose power-on may start at `now`, in queue order; they count against the
    /// window from `now`.
    pub fn admit(&mut self, now: u64) -> Vec<K> {
        self.forget_before(now);
        let free = self.limit.saturating_sub(self.admitted.len());
        let n = free.min(self.queue.len());
        let out: Vec<K> = self.queue.drain(..n).collect();
        self.admitted.extend(std::iter::repeat_n(now, out.len()));
        out
    }

    /// How many nodes wait.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// `node`'s place in the queue (0: next), if it waits.
    pub fn position(&self, node: &K) -> Option<usize> {
        self.queue.iter().position(|n| n == node)
    }

    /// The earliest time at or after `now` when a power-on may start.
    pub fn next_slot(&self, now: u64) -> u64 {
        let live: Vec<u64> = self
            .admitted
            .iter()
            .copied()
            .filter(|t| t.saturating_add(self.interval_ms) > now)
            .collect();
        if live.len() < self.limit {
            return now;
        }
        // The window is full: a slot frees when the oldest of the last `limit` ages out.
        live[live.len() - self.limit].saturating_add(self.interval_ms)
    }

    /// When [`Throttle::admit`] will next have something to release: `None` with an empty
    /// queue.
    pub fn next_wake(&self, now: u64) -> Option<u64> {
        (!self.queue.is_empty()).then(|| self.next_slot(now))
    }

    /// The blocking shell (a CLI, the tests; the appliance runs the same steps in a task):
    /// powers on every queued node as the throttle admits it, through `power_on`, until the
    /// queue is empty. `clock` reads milliseconds on a monotonic clock, `sleep` waits.
    pub fn run_blocking(
        &mut self,
        clock: impl Fn() -> u64,
        sleep: impl Fn(Duration),
        mut power_on: impl FnMut(&K) -> Result<(), PowerError>,
    ) -> Vec<Started<K>> {
        let mut started = Vec::new();
        loop {
            let now = clock();
            for node in self.admit(now) {
                let result = power_on(&node);
                started.push(Started {
                    node,
                    at_ms: now,
                    result,
                });
            }
            match self.next_wake(clock()) {
                Some(wake) => sleep(Duration::from_millis(wake.saturating_sub(clock()))),
                None => return started,
            }
        }
    }

    fn forget_before(&mut self, now: u64) {
        while let Some(&t) = self.admitted.front() {
            if t.saturating_add(self.interval_ms) > now {
                break;
            }
            self.admitted.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the throttle as the shell does: admit at every wake-up until the queue is empty.
    fn drive(t: &mut Throttle<String>, mut now: u64) -> Vec<(u64, String)> {
        let mut started = Vec::new();
        loop {
            started.extend(t.admit(now).into_iter().map(|n| (now, n)));
            match t.next_wake(now) {
                Some(w) => {
                    assert!(w > now, "a wake-up must move time on ({w} after {now})");
                    now = w;
                }
                None => return started,
            }
        }
    }

    #[test]
    fn ten_nodes_at_once_with_two_per_ten_seconds_start_in_pairs_ten_seconds_apart() {
        let mut t = Throttle::new(2, Duration::from_secs(10)).unwrap();
        for i in 0..10 {
            assert!(t.request(format!("node-{i}")));
        }
        assert_eq!(t.queue_len(), 10);
        assert_eq!(t.next_slot(0), 0);
        let started = drive(&mut t, 0);
        let times: Vec<u64> = started.iter().map(|(at, _)| at / 1000).collect();
        assert_eq!(times, [0, 0, 10, 10, 20, 20, 30, 30, 40, 40]);
        let order: Vec<&str> = started.iter().map(|(_, n)| n.as_str()).collect();
        let expected: Vec<String> = (0..10).map(|i| format!("node-{i}")).collect();
        assert_eq!(order, expected, "first come, first started");
        // No window of 10 s ever holds more than 2 starts.
        for (i, (a, _)) in started.iter().enumerate() {
            let in_window = started[i..].iter().filter(|(b, _)| *b < a + 10_000).count();
            assert!(in_window <= 2, "{in_window} starts in the 10 s from {a} ms");
        }
        assert_eq!(t.queue_len(), 0);
    }

    #[test]
    fn queue_length_and_next_slot_are_readable_while_waiting() {
        let mut t = Throttle::new(2, Duration::from_secs(10)).unwrap();
        for n in ["a", "b", "c", "d", "e"] {
            t.request(n.to_string());
        }
        assert_eq!(t.admit(1_000), ["a", "b"]);
        assert_eq!(t.queue_len(), 3);
        assert_eq!(t.position(&"c".to_string()), Some(0));
        assert_eq!(t.position(&"e".to_string()), Some(2));
        assert_eq!(t.next_slot(1_500), 11_000);
        assert_eq!(t.next_wake(1_500), Some(11_000));
        assert!(t.admit(10_999).is_empty(), "the window still holds two");
        assert_eq!(t.admit(11_000), ["c", "d"]);
        assert_eq!(t.next_slot(11_000), 21_000);
    }

    #[test]
    fn a_node_asking_again_keeps_its_place_and_a_cancelled_one_leaves() {
        let mut t = Throttle::new(1, Duration::from_secs(5)).unwrap();
        assert!(t.request("a"));
        assert!(t.request("b"));
        assert!(!t.request("a"), "already waiting");
        assert_eq!(t.queue_len(), 2);
        assert!(t.cancel(&"a"));
        assert!(!t.cancel(&"a"));
        assert_eq!(t.admit(0), ["b"]);
        assert_eq!(t.next_wake(0), None, "nothing waits");
        assert_eq!(t.next_slot(0), 5_000);
        assert_eq!(t.next_slot(5_000), 5_000);
    }

    #[test]
    fn starts_spread_over_a_window_free_slots_one_by_one() {
        let mut t = Throttle::new(2, Duration::from_secs(10)).unwrap();
        t.request(1);
        assert_eq!(t.admit(0), [1]);
        t.request(2);
        assert_eq!(t.admit(4_000), [2]);
        t.request(3);
        t.request(4);
        assert_eq!(t.next_wake(4_000), Some(10_000));
        assert_eq!(t.admit(10_000), [3]);
        assert_eq!(t.next_wake(10_000), Some(14_000));
        assert_eq!(t.admit(14_000), [4]);
    }

    #[test]
    fn the_blocking_shell_powers_on_as_admitted_and_sleeps_until_the_next_slot() {
        use std::cell::Cell;
        let mut t = Throttle::new(2, Duration::from_secs(10)).unwrap();
        for i in 0..5 {
            t.request(i);
        }
        let now = Cell::new(500u64);
        let slept = Cell::new(0u64);
        let started = t.run_blocking(
            || now.get(),
            |d| {
                let ms = u64::try_from(d.as_millis()).unwrap();
                slept.set(slept.get() + ms);
                now.set(now.get() + ms);
            },
            |&n| {
                now.set(now.get() + 30); // a power-on takes time
                if n == 3 {
                    Err(PowerError::new(crate::ErrorKind::Credentials, "no"))
                } else {
                    Ok(())
                }
            },
        );
        let at: Vec<(i32, u64)> = started.iter().map(|s| (s.node, s.at_ms)).collect();
        assert_eq!(
            at,
            [(0, 500), (1, 500), (2, 10_500), (3, 10_500), (4, 20_500)]
        );
        assert!(started[3].result.is_err() && started[4].result.is_ok());
        assert_eq!(
            slept.get(),
            20_000 - 2 * 60,
            "slept only until each next slot"
        );
        assert_eq!(t.queue_len(), 0);
    }

    #[test]
    fn a_limit_or_interval_of_zero_is_refused() {
        assert_eq!(
            Throttle::<u8>::new(0, Duration::from_secs(1)).unwrap_err(),
            ThrottleError::ZeroLimit
        );
        assert_eq!(
            Throttle::<u8>::new(1, Duration::ZERO).unwrap_err(),
            ThrottleError::ZeroInterval
        );
    }
}
