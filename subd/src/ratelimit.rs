//! Scan rate limits (Dominator's `lib/rateio`, `lib/fsrateio`, `lib/cpulimiter`).
//!
//! I/O is limited by what is actually read from the device: the scan threads report the
//! growth of `getrusage(RUSAGE_THREAD).ru_inblock` (512-byte blocks submitted to the block
//! layer, readahead included), so a page-cache hit costs nothing and a scan of a tree that
//! fits in memory runs at full speed. Where the kernel keeps no I/O accounting the bytes
//! read are charged instead ([`IoMeasure::Bytes`]). CPU is limited by thread CPU time (user
//! and system) against a share of one CPU.
//!
//! [`Limiter`] is pure (time is passed in): a virtual clock per limit runs ahead of real
//! time by the cost of what was used (`media bytes / rate`, `cpu / share`); the caller sleeps
//! until real time catches up. Idle time earns credit for at most [`Limiter::burst`], so a
//! long page-cache stretch does not buy a later burst of device reads. [`Throttle`] is the
//! shared shell: it sleeps in pieces of at most [`MAX_SLEEP`] and re-reads the limits after
//! each, so a lifted or raised limit takes effect at once.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeValLike;

/// The unit of `ru_inblock`.
pub const BLOCK_BYTES: u64 = 512;
/// The longest single sleep: limits are re-read after each piece.
pub const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Credit that idle time can earn.
pub const DEFAULT_BURST: Duration = Duration::from_millis(100);

/// The limits in force. `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    /// Media reads, bytes per second.
    pub io_bytes_per_sec: Option<f64>,
    /// CPU time per wall-clock time, summed over the scan's threads (1.0 = one whole CPU).
    pub cpu_share: Option<f64>,
}

impl Limits {
    pub const NONE: Limits = Limits {
        io_bytes_per_sec: None,
        cpu_share: None,
    };

    /// `percent` % of a device reading `device_bytes_per_sec`; `None` when the percentage is
    /// 100 or more (unlimited) or the device speed is unknown (0).
    pub fn io_percent(device_bytes_per_sec: u64, percent: f64) -> Option<f64> {
        (device_bytes_per_sec > 0 && percent < 100.0)
            .then(|| device_bytes_per_sec as f64 * percent.max(0.001) / 100.0)
    }

    /// `percent` % of one CPU; `None` (unlimited) at 100 % or more of `cpus` CPUs.
    pub fn cpu_percent(percent: f64, cpus: usize) -> Option<f64> {
        (percent < 100.0 * cpus.max(1) as f64).then(|| percent.max(0.1) / 100.0)
    }

    pub fn is_unlimited(&self) -> bool {
        self.io_bytes_per_sec.is_none() && self.cpu_share.is_none()
    }
}

/// What a thread used since it last reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// 512-byte blocks read from the device (`ru_inblock` growth).
    pub blocks: u64,
    /// Bytes returned by `read` (from the page cache or the device).
    pub bytes: u64,
    /// Thread CPU time (user + system).
    pub cpu: Duration,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.blocks += o.blocks;
        self.bytes += o.bytes;
        self.cpu += o.cpu;
    }
}

/// How media reads are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMeasure {
    /// `ru_inblock` blocks: page-cache hits are free.
    #[default]
    Blocks,
    /// Every byte read (the kernel keeps no per-task I/O accounting).
    Bytes,
}

/// The pure limiter. Times are durations since an origin the caller chooses.
#[derive(Clone, Debug)]
pub struct Limiter {
    limits: Limits,
    measure: IoMeasure,
    burst: Duration,
    io_due: Duration,
    cpu_due: Duration,
}

impl Limiter {
    pub fn new(limits: Limits, measure: IoMeasure) -> Self {
        Limiter {
            limits,
            measure,
            burst: DEFAULT_BURST,
            io_due: Duration::ZERO,
            cpu_due: Duration::ZERO,
        }
    }

    pub fn with_burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    pub fn burst(&self) -> Duration {
        self.burst
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn measure(&self) -> IoMeasure {
        self.measure
    }

    /// Changes the limits; debt run up under the old ones is forgiven.
    pub fn set_limits(&mut self, now: Duration, limits: Limits) {
        self.limits = limits;
        self.io_due = self.io_due.min(now);
        self.cpu_due = self.cpu_due.min(now);
    }

    /// The bytes a usage report counts against the I/O limit.
    pub fn media_bytes(&self, usage: Usage) -> u64 {
        match self.measure {
            IoMeasure::Blocks => usage.blocks * BLOCK_BYTES,
            IoMeasure::Bytes => usage.bytes,
        }
    }

    /// Records a usage report made at `now`; returns how long to sleep.
    pub fn charge(&mut self, now: Duration, usage: Usage) -> Duration {
        let floor = now.saturating_sub(self.burst);
        if let Some(rate) = self.limits.io_bytes_per_sec {
            let cost = secs(self.media_bytes(usage) as f64 / rate.max(1.0));
            self.io_due = self.io_due.max(floor) + cost;
        }
        if let Some(share) = self.limits.cpu_share {
            let cost = secs(usage.cpu.as_secs_f64() / share.max(0.001));
            self.cpu_due = self.cpu_due.max(floor) + cost;
        }
        self.delay(now)
    }

    /// How long the caller still has to sleep at `now` (under the current limits).
    pub fn delay(&self, now: Duration) -> Duration {
        let mut due = Duration::ZERO;
        if self.limits.io_bytes_per_sec.is_some() {
            due = due.max(self.io_due);
        }
        if self.limits.cpu_share.is_some() {
            due = due.max(self.cpu_due);
        }
        due.saturating_sub(now)
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX / 4)
}

/// The limiter shared by a scan's threads, against the real clock.
#[derive(Debug)]
pub struct Throttle {
    origin: Instant,
    limiter: Mutex<Limiter>,
}

impl Throttle {
    pub fn new(limits: Limits, measure: IoMeasure) -> Self {
        Throttle {
            origin: Instant::now(),
            limiter: Mutex::new(Limiter::new(limits, measure)),
        }
    }

    pub fn unlimited() -> Self {
        Self::new(Limits::NONE, IoMeasure::Blocks)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits()
    }

    pub fn is_unlimited(&self) -> bool {
        self.limits().is_unlimited()
    }

    pub fn set_limits(&self, limits: Limits) {
        let now = self.now();
        self.lock().set_limits(now, limits);
    }

    pub fn set_measure(&self, measure: IoMeasure) {
        let mut l = self.lock();
        let (limits, burst) = (l.limits(), l.burst());
        *l = Limiter::new(limits, measure).with_burst(burst);
    }

    pub fn media_bytes(&self, usage: Usage) -> u64 {
        self.lock().media_bytes(usage)
    }

    /// Charges `usage` and sleeps as long as the limits require, in pieces of at most
    /// [`MAX_SLEEP`]; returns early once `stop()` is true. Returns the time slept.
    pub fn pace(&self, usage: Usage, stop: &dyn Fn() -> bool) -> Duration {
        let start = Instant::now();
        let mut d = {
            let now = self.now();
            self.lock().charge(now, usage)
        };
        while !d.is_zero() && !stop() {
            std::thread::sleep(d.min(MAX_SLEEP));
            let now = self.now();
            d = self.lock().delay(now);
        }
        start.elapsed()
    }
}

/// The calling thread's `(ru_inblock, user + system CPU time)`; zeros if unavailable.
pub fn thread_usage() -> (u64, Duration) {
    match getrusage(UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let cpu = u.user_time().num_microseconds() + u.system_time().num_microseconds();
            (
                u64::try_from(u.block_reads()).unwrap_or(0),
                Duration::from_micros(u64::try_from(cpu).unwrap_or(0)),
            )
        }
        Err(_) => (0, Duration::ZERO),
    }
}

/// Per-thread usage deltas. Create it on the thread that reads.
#[derive(Debug)]
pub struct ThreadMeter {
    blocks: u64,
    cpu: Duration,
}

impl ThreadMeter {
    pub fn start() -> Self {
        let (blocks, cpu) = thread_usage();
        ThreadMeter { blocks, cpu }
    }

    /// Blocks and CPU time since the last call (or `start`); `bytes` is the caller's.
    pub fn take(&mut self, bytes: u64) -> Usage {
        let (blocks, cpu) = thread_usage();
        let u = Usage {
            blocks: blocks.saturating_sub(self.blocks),
            bytes,
            cpu: cpu.saturating_sub(self.cpu),
        };
        self.blocks = blocks;
        self.cpu = cpu;
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn io(rate: f64) -> Limits {
        Limits {
            io_bytes_per_sec: Some(rate),
            cpu_share: None,
        }
    }

    #[test]
    fn sleep_comes_from_blocks_not_bytes() {
        let mut l = Limiter::new(io(10.0 * MB as f64), IoMeasure::Blocks).with_burst(ms(0));
        // 100 MB from the page cache: no blocks, no sleep.
        let hit = Usage {
            blocks: 0,
            bytes: 100 * MB,
            cpu: ms(50),
        };
        assert_eq!(l.charge(ms(10), hit), Duration::ZERO);
        // 1 MB from the device (1,953.125 blocks), however few bytes were returned: 100 ms.
        let miss = Usage {
            blocks: MB / BLOCK_BYTES,
            bytes: 4096,
            cpu: ms(0),
        };
        let d = l.charge(ms(10), miss);
        assert!(d.abs_diff(ms(100)) < ms(1), "{d:?}");
        // Time passing pays the debt.
        assert!(l.delay(ms(60)).abs_diff(ms(50)) < ms(1));
        assert_eq!(l.delay(ms(200)), Duration::ZERO);
    }

    #[test]
    fn bytes_are_charged_without_io_accounting() {
        let mut l = Limiter::new(io(MB as f64), IoMeasure::Bytes).with_burst(ms(0));
        let d = l.charge(
            ms(0),
            Usage {
                blocks: 0,
                bytes: MB / 2,
                cpu: ms(0),
            },
        );
        assert!(d.abs_diff(ms(500)) < ms(1));
    }

    #[test]
    fn idle_credit_is_capped_by_the_burst() {
        let mut l = Limiter::new(io(MB as f64), IoMeasure::Blocks).with_burst(ms(100));
        let one_mb = Usage {
            blocks: MB / BLOCK_BYTES,
            ..Usage::default()
        };
        // After ten idle seconds a 1 MB read (1 s of budget) still waits 0.9 s.
        let d = l.charge(Duration::from_secs(10), one_mb);
        assert!(d.abs_diff(ms(900)) < ms(1), "{d:?}");
        // Reads that arrive while in debt queue behind it.
        let d = l.charge(Duration::from_secs(10), one_mb);
        assert!(d.abs_diff(ms(1900)) < ms(1), "{d:?}");
        // The rate over a long run is the limit.
        let mut l = Limiter::new(io(MB as f64), IoMeasure::Blocks).with_burst(ms(100));
        let start = Duration::from_secs(1);
        let mut now = start;
        for _ in 0..100 {
            now += l.charge(
                now,
                Usage {
                    blocks: 100_000 / BLOCK_BYTES,
                    ..Usage::default()
                },
            );
        }
        // 100 × 99,840 bytes at 1 MB/s, less the first burst.
        let took = now - start;
        assert!(took.abs_diff(ms(9884)) < ms(5), "{took:?}");
    }

    #[test]
    fn cpu_share() {
        let lim = Limits {
            io_bytes_per_sec: None,
            cpu_share: Some(0.25),
        };
        let mut l = Limiter::new(lim, IoMeasure::Blocks).with_burst(ms(100));
        // 100 ms of CPU (used over the last 100 ms, within the burst allowance) at a 25 %
        // share needs 400 ms of wall time: 300 ms more.
        let d = l.charge(
            ms(100),
            Usage {
                cpu: ms(100),
                ..Usage::default()
            },
        );
        assert!(d.abs_diff(ms(300)) < ms(1), "{d:?}");
        // I/O is unlimited here: blocks cost nothing.
        let d = l.charge(
            ms(400),
            Usage {
                blocks: 1 << 30,
                ..Usage::default()
            },
        );
        assert_eq!(d, Duration::ZERO);
    }

    #[test]
    fn lifting_a_limit_forgives_the_debt() {
        let mut l = Limiter::new(io(1000.0), IoMeasure::Blocks).with_burst(ms(0));
        let d = l.charge(
            ms(0),
            Usage {
                blocks: 1000,
                ..Usage::default()
            },
        );
        assert!(d > Duration::from_secs(500));
        l.set_limits(ms(1), Limits::NONE);
        assert_eq!(l.delay(ms(1)), Duration::ZERO);
        l.set_limits(ms(2), io(1000.0));
        assert_eq!(l.delay(ms(2)), Duration::ZERO, "old debt is gone");
    }

    #[test]
    fn percentages() {
        assert_eq!(Limits::io_percent(100 * MB, 2.0), Some(2.0 * MB as f64));
        assert_eq!(Limits::io_percent(100 * MB, 100.0), None);
        assert_eq!(Limits::io_percent(0, 2.0), None);
        assert_eq!(Limits::cpu_percent(50.0, 2), Some(0.5));
        assert_eq!(Limits::cpu_percent(200.0, 2), None);
        assert!(Limits::NONE.is_unlimited());
    }

    #[test]
    fn throttle_sleeps_and_stops() {
        let t = Throttle::new(io(1_000_000.0), IoMeasure::Blocks);
        let u = Usage {
            blocks: 400_000 / BLOCK_BYTES, // 0.4 s of budget, less the 0.1 s burst
            ..Usage::default()
        };
        let slept = t.pace(u, &|| false);
        assert!(slept >= ms(250) && slept < ms(1000), "{slept:?}");
        // A stop request cuts a long sleep short.
        let u = Usage {
            blocks: 100_000_000 / BLOCK_BYTES,
            ..Usage::default()
        };
        let slept = t.pace(u, &|| true);
        assert!(slept < ms(100), "{slept:?}");
        // Lifting the limits ends the wait.
        t.set_limits(Limits::NONE);
        assert!(t.pace(u, &|| false) < ms(100));
        let mut m = ThreadMeter::start();
        let u = m.take(7);
        assert_eq!(u.bytes, 7);
    }
}
