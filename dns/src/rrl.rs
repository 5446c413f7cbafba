//! Response rate limiting over UDP, so that the server cannot be made to flood an address
//! (a spoofed source) with answers larger than the questions.
//!
//! A token bucket per source netblock (IPv4 /24, IPv6 /56: one attacker rarely holds more,
//! and a victim's neighbours share its fate as with BIND's RRL): `per_second` answers,
//! bursts up to the same number. Past it, every `slip`-th question still gets a truncated
//! empty answer (TC), which a real client follows to TCP, where no source can be spoofed;
//! the rest get nothing. The table is bounded (least recently seen forgotten first), so a
//! flood from many sources costs bounded memory. Pure: time is passed in.

use std::net::IpAddr;
use std::num::NonZeroUsize;

use lru::LruCache;
use paddock_clock::UnixMs;

/// Netblocks tracked at once.
const TRACKED: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Answers per second per netblock (and the burst); 0 turns the limit off.
    pub per_second: u32,
    /// Every `slip`-th question over the limit is answered empty with TC; 0: none is.
    pub slip: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_second: 1_000,
            slip: 2,
        }
    }
}

/// What to do with one question over UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Answer,
    /// An empty answer with TC: come back over TCP.
    Slip,
    Drop,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens, in thousandths of an answer.
    milli: u64,
    at: UnixMs,
    /// Questions over the limit so far (for the slip).
    over: u64,
}

pub struct Limiter {
    limit: RateLimit,
    table: LruCache<[u8; 8], Bucket>,
}

/// The netblock a source belongs to.
fn netblock(ip: IpAddr) -> [u8; 8] {
    let mut key = [0u8; 8];
    match ip {
        IpAddr::V4(v4) => {
            key[0] = 4;
            key[1..4].copy_from_slice(&v4.octets()[..3]);
        }
        IpAddr::V6(v6) => {
            key[0] = 6;
            key[1..8].copy_from_slice(&v6.octets()[..7]);
        }
    }
    key
}

impl Limiter {
    pub fn new(limit: RateLimit) -> Self {
        let cap = NonZeroUsize::new(TRACKED).unwrap_or(NonZeroUsize::MIN);
        Limiter {
            limit,
            table: LruCache::new(cap),
        }
    }

    /// The verdict for a question from `source` at `now`.
    pub fn check(&mut self, source: IpAddr, now: UnixMs) -> Verdict {
        let per_second = u64::from(self.limit.per_second);
        if per_second == 0 {
            return Verdict::Answer;
        }
        let full = per_second * 1_000;
        let b = self.table.get_or_insert_mut(netblock(source), || Bucket {
            milli: full,
            at: now,
            over: 0,
        });
        // Refill by the time passed (a clock stepping back refills nothing).
        let elapsed = u64::try_from(now.since(b.at).as_millis()).unwrap_or(u64::MAX);
        b.milli = b
            .milli
            .saturating_add(elapsed.saturating_mul(per_second))
            .min(full);
        b.at = now.max(b.at);
        if b.milli >= 1_000 {
            b.milli -= 1_000;
            return Verdict::Answer;
        }
        b.over += 1;
        let slip = u64::from(self.limit.slip);
        if slip > 0 && b.over.is_multiple_of(slip) {
            Verdict::Slip
        } else {
            Verdict::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn count(l: &mut Limiter, source: &str, at: i64, n: usize) -> [usize; 3] {
        let mut c = [0; 3];
        for _ in 0..n {
            match l.check(ip(source), UnixMs(at)) {
                Verdict::Answer => c[0] += 1,
                Verdict::Slip => c[1] += 1,
                Verdict::Drop => c[2] += 1,
            }
        }
        c
    }

    #[test]
    fn a_burst_past_the_rate_is_slipped_and_dropped_then_refilled() {
        let mut l = Limiter::new(RateLimit {
            per_second: 100,
            slip: 2,
        });
        // 300 at once: 100 answered; of the 200 over, every second slips.
        assert_eq!(count(&mut l, "198.18.0.9", 0, 300), [100, 100, 100]);
        // 250 ms later, 25 tokens back.
        assert_eq!(count(&mut l, "198.18.0.9", 250, 25)[0], 25);
        assert_eq!(count(&mut l, "198.18.0.9", 250, 1)[0], 0);
        // A full second later, a full bucket (never more).
        assert_eq!(count(&mut l, "198.18.0.9", 5_000, 150)[0], 100);
    }

    #[test]
    fn netblocks_share_a_bucket_and_others_are_apart() {
        let mut l = Limiter::new(RateLimit {
            per_second: 10,
            slip: 0,
        });
        assert_eq!(count(&mut l, "198.18.0.9", 0, 10)[0], 10);
        assert_eq!(count(&mut l, "198.18.0.200", 0, 5), [0, 0, 5], "same /24");
        assert_eq!(count(&mut l, "198.18.1.9", 0, 10)[0], 10, "another /24");
        assert_eq!(count(&mut l, "2001:db8::1", 0, 10)[0], 10);
        assert_eq!(count(&mut l, "2001:db8::ffff:1", 0, 1)[0], 0, "same /56");
        assert_eq!(
            count(&mut l, "2001:db8:0:100::1", 0, 1)[0],
            1,
            "another /56"
        );
    }

    #[test]
    fn zero_is_no_limit_and_a_clock_stepping_back_refills_nothing() {
        let mut off = Limiter::new(RateLimit {
            per_second: 0,
            slip: 2,
        });
        assert_eq!(count(&mut off, "198.18.0.9", 0, 100_000)[0], 100_000);
        let mut l = Limiter::new(RateLimit {
            per_second: 10,
            slip: 0,
        });
        assert_eq!(count(&mut l, "198.18.0.9", 10_000, 10)[0], 10);
        assert_eq!(count(&mut l, "198.18.0.9", 0, 5)[0], 0);
        // Time is measured from the latest instant seen, not from the step back.
        assert_eq!(count(&mut l, "198.18.0.9", 10_500, 10)[0], 5);
    }
}
