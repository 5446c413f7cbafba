//! Rate limits on the DHCP server, the one surface every host on the provisioning network
//! reaches without credentials. Pure: time is passed in (milliseconds on any clock; the
//! shell passes Unix milliseconds), and a clock that steps back is survived (see below).
//!
//! Two limits, because they stop different things:
//!
//! - **Per client** ([`ClientLimiter`]): a token bucket per `chaddr` (the lease table's key):
//!   `per_client_burst` requests at once, refilled at `per_client_per_sec`. It stops one
//!   client hammering the server (a firmware loop, a DISCOVER/DECLINE loop). It cannot stop a
//!   sender that changes its MAC with every packet: each new MAC starts with a full bucket.
//!   The table holds at most `max_tracked_clients` clients; when full, the client seen least
//!   recently is forgotten, so a flood of random MACs costs bounded memory (and a forgotten
//!   client only comes back with a full bucket: eviction errs on the side of serving).
//! - **New leases** ([`NewLeaseWindow`], one per subnet): across all clients of a subnet,
//!   at most `new_leases_per_window` addresses are newly taken from its pools in any window of
//!   `new_lease_window_secs` (a sliding window, exact). An address is *newly taken* when
//!   the server offers or ACKs a client an address that is not already its current
//!   address, its outstanding offer or its reservation — a stranger's first DISCOVER, an
//!   INIT-REBOOT for a free address by an unknown MAC, a known client hopping to another
//!   address. Renewals, a DORA's REQUEST after its OFFER, iPXE's and the ramdisk's DHCP after
//!   the firmware's, and returning clients getting their old address are not new. This is
//!   what bounds a random-MAC flood: it can take addresses no faster than the cap, while
//!   every machine the server already knows keeps being served. The pool's size remains the
//!   final bound; the cap turns "the pool is gone in milliseconds" into "gone no faster than
//!   N per window", and the log says so once per window.
//!
//! A request over a limit is dropped: no reply, nothing held, nothing stored.

use std::collections::VecDeque;
use std::num::{NonZeroU64, NonZeroUsize};

use lru::LruCache;

use crate::MacAddr;

/// How often (at most) a log line is due for one limited client, in milliseconds.
pub const CLIENT_REPORT_EVERY_MS: u64 = 60_000;

/// The largest `max_tracked_clients` and `new_leases_per_window` accepted (memory: about
/// 100 bytes per tracked client, 8 bytes per new lease in the window).
pub const MAX_TABLE: u64 = 1_000_000;

/// The rate-limit settings (`[dhcp]` and `[dhcp6]` in the appliance's configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests one client (by `chaddr`) may send at once; 0 turns the per-client limit off.
    pub per_client_burst: u32,
    /// Requests per second one client's budget refills by.
    pub per_client_per_sec: u32,
    /// Clients whose budget is remembered; beyond it the least recently seen is forgotten.
    pub max_tracked_clients: u32,
    /// Addresses newly taken from a subnet's pools, across all clients, in any window; 0: no
    /// cap.
    pub new_leases_per_window: u32,
    /// The window of `new_leases_per_window`, in seconds.
    pub new_lease_window_secs: u32,
}

impl Default for RateLimits {
    /// A machine's whole boot (firmware PXE, iPXE, ramdisk, installed system: four DORAs,
    /// each retransmitted now and then, seen twice where it reaches two listeners) is well
    /// under 20 requests, and no DHCP client retransmits faster than once a second, so
    /// 20 at once and 2/s is never reached by a healthy client. 1,024 new addresses per
    /// minute lets `bench/storm.sh`'s 1,000 machines (or five racks of 200) power on at once
    /// unthrottled, then holds a flood to about 17 addresses a second. 10,000 tracked clients
    /// is more than one appliance's fleet and costs about 1 MiB.
    fn default() -> Self {
        RateLimits {
            per_client_burst: 20,
            per_client_per_sec: 2,
            max_tracked_clients: 10_000,
            new_leases_per_window: 1024,
            new_lease_window_secs: 60,
        }
    }
}

/// A rate-limit setting that cannot work; named by its `[dhcp]` key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    #[error("per_client_per_sec must be at least 1 when per_client_burst is set")]
    ZeroRefill,
    #[error("max_tracked_clients must be between 1 and {MAX_TABLE} when per_client_burst is set")]
    TrackedClients,
    #[error("new_lease_window_secs must be at least 1 when new_leases_per_window is set")]
    ZeroWindow,
    #[error("new_leases_per_window must be at most {MAX_TABLE}")]
    TooManyNewLeases,
}

impl RateLimits {
    /// The settings a configuration section gives (`per_client_burst`, `per_client_per_sec`,
    /// `max_tracked_clients`, `new_leases_per_window`, `new_lease_window_secs`, in that
    /// order), each unset one at its default; check the result with [`RateLimits::validate`].
    pub fn defaulted(
        [burst, per_sec, tracked, per_window, window_secs]: [Option<u32>; 5],
    ) -> RateLimits {
        let d = RateLimits::default();
        RateLimits {
            per_client_burst: burst.unwrap_or(d.per_client_burst),
            per_client_per_sec: per_sec.unwrap_or(d.per_client_per_sec),
            max_tracked_clients: tracked.unwrap_or(d.max_tracked_clients),
            new_leases_per_window: per_window.unwrap_or(d.new_leases_per_window),
            new_lease_window_secs: window_secs.unwrap_or(d.new_lease_window_secs),
        }
    }

    /// No limits at all (what [`crate::Server::new`] starts with).
    pub const OFF: RateLimits = RateLimits {
        per_client_burst: 0,
        per_client_per_sec: 0,
        max_tracked_clients: 0,
        new_leases_per_window: 0,
        new_lease_window_secs: 0,
    };

    pub fn validate(&self) -> Result<(), RateLimitError> {
        if self.per_client_burst > 0 {
            if self.per_client_per_sec == 0 {
                return Err(RateLimitError::ZeroRefill);
            }
            if self.max_tracked_clients == 0 || u64::from(self.max_tracked_clients) > MAX_TABLE {
                return Err(RateLimitError::TrackedClients);
            }
        }
        if self.new_leases_per_window > 0 {
            if self.new_lease_window_secs == 0 {
                return Err(RateLimitError::ZeroWindow);
            }
            if u64::from(self.new_leases_per_window) > MAX_TABLE {
                return Err(RateLimitError::TooManyNewLeases);
            }
        }
        Ok(())
    }
}

/// What a limit decided about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Drop the request. `report`: a log line is due, saying this many requests were dropped
    /// since the last line (this one included); `None` between lines.
    Drop {
        report: Option<u64>,
    },
}

/// Milli-requests: one request costs 1,000, and `per_sec` requests a second refill
/// `per_sec` milli-requests a millisecond.
const COST: u64 = 1000;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    milli: u64,
    last_ms: u64,
    /// Requests dropped since the last report.
    dropped: u64,
    reported_ms: Option<u64>,
}

/// Per-client token buckets in a table of bounded size, least recently seen evicted first
/// (O(1) per request).
#[derive(Debug)]
pub struct ClientLimiter {
    burst_milli: u64,
    per_sec: u64,
    table: LruCache<MacAddr, Bucket>,
}

impl ClientLimiter {
    /// `None` when the per-client limit is off (`per_client_burst` 0).
    pub fn new(limits: &RateLimits) -> Option<Self> {
        let burst = NonZeroU64::new(u64::from(limits.per_client_burst))?;
        let capacity = usize::try_from(limits.max_tracked_clients)
            .ok()
            .and_then(NonZeroUsize::new)
            .unwrap_or(NonZeroUsize::MIN);
        // Unbounded, then bounded: `LruCache::new` would size its map for the whole
        // capacity at once, and the table should cost memory only for the clients it has.
        let mut table = LruCache::unbounded();
        table.resize(capacity);
        Some(ClientLimiter {
            burst_milli: burst.get() * COST,
            per_sec: u64::from(limits.per_client_per_sec),
            table,
        })
    }

    /// Clients currently remembered.
    pub fn tracked(&self) -> usize {
        self.table.len()
    }

    /// Charges one request from `mac` at `now_ms`. A client not in the table starts with a
    /// full bucket; when the table is full, the least recently seen client is forgotten.
    pub fn check(&mut self, mac: MacAddr, now_ms: u64) -> Verdict {
        let (burst, per_sec) = (self.burst_milli, self.per_sec);
        let b = self.table.get_or_insert_mut(mac, || Bucket {
            milli: burst,
            last_ms: now_ms,
            dropped: 0,
            reported_ms: None,
        });
        // A clock that stepped back gives no refill, and refills resume from the new time.
        let elapsed = now_ms.saturating_sub(b.last_ms);
        b.milli = burst.min(b.milli.saturating_add(elapsed.saturating_mul(per_sec)));
        b.last_ms = now_ms;
        if b.milli >= COST {
            b.milli -= COST;
            return Verdict::Allow;
        }
        b.dropped += 1;
        let due = match b.reported_ms {
            None => true,
            Some(at) => now_ms < at || now_ms - at >= CLIENT_REPORT_EVERY_MS,
        };
        if !due {
            return Verdict::Drop { report: None };
        }
        let n = std::mem::take(&mut b.dropped);
        b.reported_ms = Some(now_ms);
        Verdict::Drop { report: Some(n) }
    }
}

/// The cap on addresses newly taken from the pools: at most `limit` in any window of
/// `window_ms` (the times of the window's new leases, oldest first).
#[derive(Debug)]
pub struct NewLeaseWindow {
    limit: usize,
    window_ms: u64,
    taken: VecDeque<u64>,
    dropped: u64,
    reported_ms: Option<u64>,
}

impl NewLeaseWindow {
    /// `None` when there is no cap (`new_leases_per_window` 0).
    pub fn new(limits: &RateLimits) -> Option<Self> {
        if limits.new_leases_per_window == 0 {
            return None;
        }
        Some(NewLeaseWindow {
            limit: usize::try_from(limits.new_leases_per_window).unwrap_or(usize::MAX),
            window_ms: u64::from(limits.new_lease_window_secs.max(1)) * 1000,
            taken: VecDeque::new(),
            dropped: 0,
            reported_ms: None,
        })
    }

    /// New leases counted in the window ending at `now_ms`.
    pub fn in_window(&mut self, now_ms: u64) -> usize {
        self.forget(now_ms);
        self.taken.len()
    }

    /// May a new lease be taken at `now_ms`? A `Drop` is counted (and reported at most once
    /// per window); an `Allow` must be followed by [`NewLeaseWindow::record`] if the lease is
    /// actually taken.
    pub fn check(&mut self, now_ms: u64) -> Verdict {
        self.forget(now_ms);
        if self.taken.len() < self.limit {
            return Verdict::Allow;
        }
        self.dropped += 1;
        let due = match self.reported_ms {
            None => true,
            Some(at) => now_ms < at || now_ms - at >= self.window_ms,
        };
        if !due {
            return Verdict::Drop { report: None };
        }
        self.reported_ms = Some(now_ms);
        Verdict::Drop {
            report: Some(std::mem::take(&mut self.dropped)),
        }
    }

    /// Counts a new lease taken at `now_ms`.
    pub fn record(&mut self, now_ms: u64) {
        self.taken.push_back(now_ms);
    }

    /// Forgets leases that left the window. Times after `now_ms` (the clock stepped back)
    /// are forgotten too: a step back frees the window rather than freezing it.
    fn forget(&mut self, now_ms: u64) {
        if self.taken.back().is_some_and(|&t| t > now_ms) {
            self.taken.clear();
        }
        while self
            .taken
            .front()
            .is_some_and(|&t| now_ms - t >= self.window_ms)
        {
            self.taken.pop_front();
        }
    }
}

/// Both limits of one server, as its core consults them: the per-client budgets and, per
/// subnet (by index), the new-lease window, so that a flood on one segment leaves every
/// other segment its own budget.
#[derive(Debug)]
pub struct Limiter {
    limits: RateLimits,
    clients: Option<ClientLimiter>,
    new_leases: std::collections::BTreeMap<usize, NewLeaseWindow>,
}

impl Limiter {
    /// Budgets start full.
    pub fn new(limits: RateLimits) -> Self {
        Limiter {
            limits,
            clients: ClientLimiter::new(&limits),
            new_leases: std::collections::BTreeMap::new(),
        }
    }

    pub fn limits(&self) -> &RateLimits {
        &self.limits
    }

    pub fn tracked_clients(&self) -> usize {
        self.clients.as_ref().map_or(0, ClientLimiter::tracked)
    }

    /// Charges one request from `mac`: `Some(report)` when it must be dropped.
    pub fn over_client_budget(&mut self, mac: MacAddr, now_ms: u64) -> Option<Option<u64>> {
        match self.clients.as_mut()?.check(mac, now_ms) {
            Verdict::Allow => None,
            Verdict::Drop { report } => Some(report),
        }
    }

    /// May `subnet` give out a new address at `now_ms`? `Some(report)` when not.
    pub fn over_new_lease_cap(&mut self, subnet: usize, now_ms: u64) -> Option<Option<u64>> {
        let window = match self.new_leases.entry(subnet) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(NewLeaseWindow::new(&self.limits)?)
            }
        };
        match window.check(now_ms) {
            Verdict::Allow => None,
            Verdict::Drop { report } => Some(report),
        }
    }

    /// Counts a new address `subnet` gave out.
    pub fn record_new_lease(&mut self, subnet: usize, now_ms: u64) {
        if let Some(w) = self.new_leases.get_mut(&subnet) {
            w.record(now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u32) -> MacAddr {
        let b = n.to_be_bytes();
        MacAddr([0x02, 0, b[0], b[1], b[2], b[3]])
    }

    fn limits(burst: u32, per_sec: u32, tracked: u32) -> RateLimits {
        RateLimits {
            per_client_burst: burst,
            per_client_per_sec: per_sec,
            max_tracked_clients: tracked,
            ..RateLimits::OFF
        }
    }

    fn window(n: u32, secs: u32) -> NewLeaseWindow {
        NewLeaseWindow::new(&RateLimits {
            new_leases_per_window: n,
            new_lease_window_secs: secs,
            ..RateLimits::OFF
        })
        .unwrap()
    }

    const A: Verdict = Verdict::Allow;
    const D: Verdict = Verdict::Drop { report: None };
    fn reported(n: u64) -> Verdict {
        Verdict::Drop { report: Some(n) }
    }

    #[test]
    fn a_client_gets_its_burst_then_its_rate() {
        // (burst, per second, request times in ms, verdicts)
        let cases: &[(u32, u32, &[u64], &[Verdict])] = &[
            (3, 1, &[0, 0, 0, 0, 0], &[A, A, A, reported(1), D]),
            // 1/s: a token after 1,000 ms, not before.
            (
                1,
                1,
                &[0, 999, 1000, 1500, 2000],
                &[A, reported(1), A, D, A],
            ),
            // 2/s: one every 500 ms, and the bucket never holds more than the burst.
            (2, 2, &[0, 0, 500, 600, 1000], &[A, A, A, reported(1), A]),
            (
                2,
                2,
                &[0, 100_000, 100_000, 100_000],
                &[A, A, A, reported(1)],
            ),
            // A clock stepping back refills nothing, and refills resume from there.
            (1, 1, &[5000, 3000, 3999, 4000], &[A, reported(1), D, A]),
        ];
        for (burst, per_sec, times, want) in cases {
            let mut l = ClientLimiter::new(&limits(*burst, *per_sec, 16)).unwrap();
            let got: Vec<Verdict> = times.iter().map(|t| l.check(mac(1), *t)).collect();
            assert_eq!(&got, want, "burst {burst}, {per_sec}/s, at {times:?}");
        }
    }

    #[test]
    fn clients_have_their_own_budgets() {
        let mut l = ClientLimiter::new(&limits(2, 1, 16)).unwrap();
        assert_eq!(l.check(mac(1), 0), A);
        assert_eq!(l.check(mac(1), 0), A);
        assert_eq!(l.check(mac(1), 0), reported(1));
        assert_eq!(l.check(mac(2), 0), A, "another client is still served");
        assert_eq!(l.check(mac(2), 0), A);
    }

    #[test]
    fn drops_are_reported_once_a_minute_per_client() {
        let mut l = ClientLimiter::new(&limits(1, 1, 16)).unwrap();
        assert_eq!(l.check(mac(1), 0), A);
        assert_eq!(l.check(mac(1), 0), reported(1));
        let mut quiet = 0;
        let mut t = 0;
        // Hammering at 10/s: one request a second is allowed, the rest dropped quietly.
        while t < CLIENT_REPORT_EVERY_MS - 100 {
            t += 100;
            match l.check(mac(1), t) {
                Verdict::Drop { report: None } => quiet += 1,
                Verdict::Allow => {}
                other => panic!("at {t}: {other:?}"),
            }
        }
        assert_eq!(quiet, 540);
        // A minute after the first line, the next one counts every drop since.
        assert_eq!(l.check(mac(1), CLIENT_REPORT_EVERY_MS + 1), A);
        assert_eq!(l.check(mac(1), CLIENT_REPORT_EVERY_MS + 2), reported(541));
        // Another client's line is its own.
        assert_eq!(l.check(mac(2), 10), A);
        assert_eq!(l.check(mac(2), 10), reported(1));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_least_recently_seen() {
        let mut l = ClientLimiter::new(&limits(1, 1, 3)).unwrap();
        for m in 1..=3 {
            assert_eq!(l.check(mac(m), 0), A);
        }
        // 1 is seen again (and dropped), so 2 is now the least recently seen.
        assert_eq!(l.check(mac(1), 1), reported(1));
        assert_eq!(l.check(mac(4), 2), A, "a fourth client pushes out 2");
        assert_eq!(l.tracked(), 3);
        assert_eq!(
            l.check(mac(2), 3),
            A,
            "2 was forgotten: a full bucket again"
        );
        // That pushed out 3; 1 and 4 are remembered, empty.
        assert_eq!(l.check(mac(4), 4), reported(1));
        assert_eq!(l.check(mac(1), 5), D);
        assert_eq!(l.check(mac(3), 6), A, "3 was forgotten");
    }

    #[test]
    fn a_random_mac_flood_costs_bounded_memory() {
        let mut l = ClientLimiter::new(&limits(20, 2, 1000)).unwrap();
        // A real client, busy enough to stay in the table.
        let me = mac(u32::MAX);
        let mut mine = Vec::new();
        for i in 0..200_000u32 {
            // A stranger every 10 ms; the real client once a second.
            let t = u64::from(i) * 10;
            assert_eq!(l.check(mac(i), t), A, "a stranger's first request");
            if i % 100 == 0 {
                mine.push(l.check(me, t));
            }
        }
        assert_eq!(l.tracked(), 1000);
        assert!(
            mine.iter().all(|v| *v == A),
            "the real client is never limited"
        );
    }

    #[test]
    fn the_new_lease_cap_is_a_sliding_window() {
        // (limit, window s, (time ms, taken if allowed), verdicts)
        let cases: &[(u32, u32, &[u64], &[Verdict])] = &[
            (2, 10, &[0, 1, 2, 3], &[A, A, reported(1), D]),
            // The first lease leaves the window 10 s after it was taken, not before.
            (
                2,
                10,
                &[0, 5000, 9999, 10_000, 10_001],
                &[A, A, reported(1), A, D],
            ),
            // One report per window.
            (
                1,
                1,
                &[0, 1, 2, 999, 1001, 1002],
                &[A, reported(1), D, D, A, reported(3)],
            ),
        ];
        for (n, secs, times, want) in cases {
            let mut w = window(*n, *secs);
            let got: Vec<Verdict> = times
                .iter()
                .map(|t| {
                    let v = w.check(*t);
                    if v == A {
                        w.record(*t);
                    }
                    v
                })
                .collect();
            assert_eq!(&got, want, "{n} per {secs} s at {times:?}");
        }
    }

    #[test]
    fn the_window_counts_only_what_was_taken() {
        let mut w = window(1, 10);
        // Allowed but not taken (the pool was full, the REQUEST was NAKed): nothing counted.
        assert_eq!(w.check(0), A);
        assert_eq!(w.check(1), A);
        w.record(1);
        assert_eq!(w.in_window(2), 1);
        assert_eq!(w.check(2), reported(1));
    }

    #[test]
    fn a_clock_stepping_back_frees_the_window_instead_of_freezing_it() {
        let mut w = window(1, 60);
        assert_eq!(w.check(3_600_000), A);
        w.record(3_600_000);
        assert_eq!(w.check(3_600_001), reported(1));
        // An hour back: the lease "from the future" is forgotten.
        assert_eq!(w.check(1000), A);
        w.record(1000);
        assert_eq!(w.check(2000), reported(1));
        // Early times (before one window since the epoch) work too.
        let mut w = window(2, 60);
        for t in [0, 0] {
            assert_eq!(w.check(t), A);
            w.record(t);
        }
        assert_eq!(w.check(59_999), reported(1));
        assert_eq!(w.check(60_000), A);
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(RateLimits::default().validate(), Ok(()));
        assert_eq!(RateLimits::OFF.validate(), Ok(()));
        type Change = fn(&mut RateLimits);
        let cases: &[(Change, RateLimitError)] = &[
            (|l| l.per_client_per_sec = 0, RateLimitError::ZeroRefill),
            (
                |l| l.max_tracked_clients = 0,
                RateLimitError::TrackedClients,
            ),
            (
                |l| l.max_tracked_clients = 2_000_000,
                RateLimitError::TrackedClients,
            ),
            (|l| l.new_lease_window_secs = 0, RateLimitError::ZeroWindow),
            (
                |l| l.new_leases_per_window = 2_000_000,
                RateLimitError::TooManyNewLeases,
            ),
        ];
        for (change, want) in cases {
            let mut l = RateLimits::default();
            change(&mut l);
            assert_eq!(l.validate().as_ref(), Err(want), "{l:?}");
        }
        // A limit that is off needs none of its other settings.
        assert_eq!(
            RateLimits {
                per_client_burst: 0,
                per_client_per_sec: 0,
                new_leases_per_window: 0,
                new_lease_window_secs: 0,
                ..RateLimits::default()
            }
            .validate(),
            Ok(())
        );
        assert!(ClientLimiter::new(&RateLimits::OFF).is_none());
        assert!(NewLeaseWindow::new(&RateLimits::OFF).is_none());
    }
}
