//! The scan loop (Dominator's `sub/scanner/scand.go`).
//!
//! On its own thread: measure the device once per boot (unless a speed is given), then scan
//! forever. The first scan runs flat out (all hashing threads, no limits); after it the
//! thread sets nice 15 (inherited by the hashing threads it starts later) and scans under
//! the configured I/O share of the device speed and CPU share, on one thread. Every complete
//! scan is compared with the last: the generation increases only when the tree or the object
//! cache differ ([`Generations`]). Each cycle lasts at least `min_cycle`. Readers take the
//! latest `(generation, Arc<Scan>)`; an update pauses the scanner ([`ScannerHandle::pause`]),
//! which abandons a scan in progress and waits for it to stop.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use paddock_image::Filter;

use crate::fsbench::{self, DeviceSpeed};
use crate::ratelimit::{Limits, Throttle};
use crate::scan::{self, OBJECTS_DIR, Scan, ScanOptions, ScanStats};
use crate::vouch::Vouched;

/// Dominator's defaults (`lib/constants`).
pub use paddock_subd_proto::{DEFAULT_CPU_PERCENT, DEFAULT_IO_PERCENT};
pub const DEFAULT_NICE: i32 = 15;
pub const DEFAULT_MIN_CYCLE: Duration = Duration::from_secs(1);
pub const DEFAULT_THREADS: usize = 2;

#[derive(Clone, Debug)]
pub struct ScannerConfig {
    pub root: PathBuf,
    pub exclusions: Filter,
    /// Media reads after the first scan, as a share of the device speed.
    pub io_percent: f64,
    /// CPU after the first scan: `cpu_percent × CPUs` % of one CPU, at most one whole CPU
    /// (Dominator's conversion of its aggregate percentage).
    pub cpu_percent: f64,
    /// The device read speed (bytes/s); `None` measures it (cached once per boot).
    pub device_speed: Option<u64>,
    pub fsbench_dir: PathBuf,
    /// Hashing threads for unthrottled scans (throttled scans use one).
    pub threads: usize,
    pub min_cycle: Duration,
    /// The scanner thread's nice value after the first scan.
    pub nice: i32,
}

impl ScannerConfig {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ScannerConfig {
            root: root.into(),
            exclusions: scan::default_exclusions(),
            io_percent: DEFAULT_IO_PERCENT,
            cpu_percent: DEFAULT_CPU_PERCENT,
            device_speed: None,
            fsbench_dir: PathBuf::from(fsbench::DEFAULT_CACHE_DIR),
            threads: DEFAULT_THREADS,
            min_cycle: DEFAULT_MIN_CYCLE,
            nice: DEFAULT_NICE,
        }
    }
}

/// The generation count (pure): 0 before the first scan, 1 after it, +1 for every scan that
/// differs from the one before.
#[derive(Clone, Debug, Default)]
pub struct Generations {
    generation: u64,
    scans: u64,
    latest: Option<Arc<Scan>>,
}

impl Generations {
    /// Records a complete scan; true when it starts a new generation.
    pub fn record(&mut self, scan: Scan) -> bool {
        self.scans += 1;
        if self.latest.as_deref() == Some(&scan) {
            return false;
        }
        self.generation += 1;
        self.latest = Some(Arc::new(scan));
        true
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn scan_count(&self) -> u64 {
        self.scans
    }

    pub fn latest(&self) -> Option<(u64, Arc<Scan>)> {
        self.latest.clone().map(|s| (self.generation, s))
    }
}

#[derive(Default)]
struct State {
    gens: Generations,
    last_stats: Option<ScanStats>,
    last_error: Option<String>,
    pauses: usize,
    scanning: bool,
    /// The thread is waiting for the pauses to end (it starts no scan until they do).
    parked: bool,
    /// The scanner thread's kernel id, once it runs.
    thread_id: Option<i32>,
    shutdown: bool,
    boost: bool,
    io_percent: f64,
    cpu_percent: f64,
    /// The scan exclusions (from the config, changed by `set_exclusions`).
    exclusions: Option<Filter>,
    device: Option<DeviceSpeed>,
    /// Object-cache listings taken since start ([`ScannerHandle::rescan_object_cache`]).
    object_rescans: u64,
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    /// Abandon the scan in progress (pause or shutdown requested).
    stop: AtomicBool,
    throttle: Throttle,
    /// Files the fetch and the applier hashed as they wrote them, for the next scan.
    vouched: Arc<Vouched>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The running scanner; dropping it stops the thread.
pub struct Scanner {
    handle: ScannerHandle,
    thread: Option<JoinHandle<()>>,
}

/// A cheap handle for readers and for the update path.
#[derive(Clone)]
pub struct ScannerHandle {
    shared: Arc<Shared>,
    config: Arc<ScannerConfig>,
}

/// Holds the scanner paused; dropping it resumes scanning.
pub struct PauseGuard {
    shared: Arc<Shared>,
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.pauses -= 1;
        if st.pauses == 0 && !st.shutdown {
            self.shared.stop.store(false, Ordering::SeqCst);
        }
        self.shared.cond.notify_all();
    }
}

impl Scanner {
    pub fn spawn(config: ScannerConfig) -> std::io::Result<Scanner> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                io_percent: config.io_percent,
                cpu_percent: config.cpu_percent,
                exclusions: Some(config.exclusions.clone()),
                ..State::default()
            }),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            throttle: Throttle::unlimited(),
            vouched: Arc::new(Vouched::default()),
        });
        let handle = ScannerHandle {
            shared,
            config: Arc::new(config),
        };
        let h = handle.clone();
        let thread = std::thread::Builder::new()
            .name("subd-scanner".into())
            .spawn(move || run(h))?;
        Ok(Scanner {
            handle,
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> ScannerHandle {
        self.handle.clone()
    }
}

impl Drop for Scanner {
    fn drop(&mut self) {
        {
            let mut st = self.handle.shared.lock();
            st.shutdown = true;
            self.handle.shared.stop.store(true, Ordering::SeqCst);
            self.handle.shared.cond.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ScannerHandle {
    /// The latest scan and its generation (`None` before the first scan).
    pub fn latest(&self) -> Option<(u64, Arc<Scan>)> {
        self.shared.lock().gens.latest()
    }

    /// [`Self::latest`] and [`Self::scan_count`] read together: the count is that of the
    /// scans up to and including the tree returned, never one ahead of it.
    pub fn latest_and_count(&self) -> (Option<(u64, Arc<Scan>)>, u64) {
        let st = self.shared.lock();
        (st.gens.latest(), st.gens.scan_count())
    }

    pub fn generation(&self) -> u64 {
        self.shared.lock().gens.generation()
    }

    /// Complete scans so far.
    pub fn scan_count(&self) -> u64 {
        self.shared.lock().gens.scan_count()
    }

    /// The files subd vouches for until the next scans ([`crate::vouch`]).
    pub fn vouched(&self) -> &Arc<Vouched> {
        &self.shared.vouched
    }

    pub fn last_stats(&self) -> Option<ScanStats> {
        self.shared.lock().last_stats.clone()
    }

    pub fn last_error(&self) -> Option<String> {
        self.shared.lock().last_error.clone()
    }

    /// The device speed in use (`None` until known, or if it cannot be measured).
    pub fn device_speed(&self) -> Option<DeviceSpeed> {
        self.shared.lock().device
    }

    /// Waits until at least `count` scans are complete; false on timeout.
    pub fn wait_for_scans(&self, count: u64, timeout: Duration) -> bool {
        self.wait_until(timeout, |st| st.gens.scan_count() >= count, |_| false)
    }

    /// Waits until the scanner thread has stopped for a pause: from then until every
    /// [`PauseGuard`] is dropped it starts no scan. False on timeout (and at once when no
    /// pause is held). For tests and for callers that must know the tree is left alone.
    pub fn wait_paused(&self, timeout: Duration) -> bool {
        self.wait_until(timeout, |st| st.parked, |st| st.pauses == 0)
    }

    /// Waits (on the state's condition variable) until `done`; false on timeout, at
    /// shutdown or once `hopeless`.
    fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&State) -> bool,
        hopeless: impl Fn(&State) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while !done(&st) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || st.shutdown || hopeless(&st) {
                return false;
            }
            st = self
                .shared
                .cond
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// The scanner thread's kernel id (`/proc/self/task/<id>`), once it runs.
    pub fn thread_id(&self) -> Option<i32> {
        self.shared.lock().thread_id
    }

    /// Pauses scanning: a scan in progress is abandoned, and this returns once it has
    /// stopped. Scanning resumes when every guard is dropped.
    pub fn pause(&self) -> PauseGuard {
        let mut st = self.shared.lock();
        st.pauses += 1;
        self.shared.stop.store(true, Ordering::SeqCst);
        while st.scanning {
            st = self.shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        PauseGuard {
            shared: self.shared.clone(),
        }
    }

    /// Lists the object cache again (after a fetch); a change starts a new generation.
    /// Returns whether it did; false before the first scan.
    pub fn rescan_object_cache(&self) -> std::io::Result<bool> {
        let objects = scan::list_object_cache(&self.config.root.join(OBJECTS_DIR))?;
        let mut st = self.shared.lock();
        st.object_rescans += 1;
        let Some((_, latest)) = st.gens.latest() else {
            return Ok(false);
        };
        if latest.objects == objects {
            return Ok(false);
        }
        let next = Scan {
            fs: latest.fs.clone(),
            objects,
        };
        let changed = st.gens.record(next);
        self.shared.cond.notify_all();
        Ok(changed)
    }

    /// Lifts the I/O and CPU limits until the end of the next complete scan.
    pub fn boost(&self) {
        let mut st = self.shared.lock();
        st.boost = true;
        self.shared.throttle.set_limits(Limits::NONE);
        self.shared.cond.notify_all();
    }

    /// The scan exclusions in force.
    pub fn exclusions(&self) -> Filter {
        let st = self.shared.lock();
        st.exclusions
            .clone()
            .unwrap_or_else(|| self.config.exclusions.clone())
    }

    /// Changes the scan exclusions (from the next scan on).
    pub fn set_exclusions(&self, exclusions: Filter) {
        self.shared.lock().exclusions = Some(exclusions);
    }

    /// Changes the limits (from the next scan on, or at once if one is running throttled).
    pub fn set_limits(&self, io_percent: f64, cpu_percent: f64) {
        let mut st = self.shared.lock();
        st.io_percent = io_percent;
        st.cpu_percent = cpu_percent;
        if !st.boost && !self.shared.throttle.is_unlimited() {
            let limits = limits_for(&st);
            self.shared.throttle.set_limits(limits);
        }
    }
}

fn limits_for(st: &State) -> Limits {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Limits {
        io_bytes_per_sec: st
            .device
            .and_then(|d| Limits::io_percent(d.bytes_per_sec, st.io_percent)),
        cpu_share: Limits::cpu_percent((st.cpu_percent * cpus as f64).min(100.0), 1),
    }
}

fn run(h: ScannerHandle) {
    let shared = &h.shared;
    let cfg = &h.config;
    let device = match cfg.device_speed {
        Some(b) => Some(DeviceSpeed {
            bytes_per_sec: b,
            blocks_per_sec: b / crate::ratelimit::BLOCK_BYTES,
        }),
        None => match fsbench::read_speed(&cfg.root, &cfg.fsbench_dir) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(root = %cfg.root.display(), "device speed unknown, scans are not I/O-limited: {e}");
                None
            }
        },
    };
    if let Some(d) = device {
        shared.throttle.set_measure(d.io_measure());
    }
    {
        let mut st = shared.lock();
        st.device = device;
        st.thread_id = Some(nix::unistd::gettid().as_raw());
    }
    let mut first = true;
    loop {
        let boost;
        let limits;
        let rescans_at_start;
        let exclusions;
        {
            let mut st = shared.lock();
            while st.pauses > 0 && !st.shutdown {
                st.parked = true;
                shared.cond.notify_all();
                st = shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.parked = false;
            if st.shutdown {
                return;
            }
            st.scanning = true;
            rescans_at_start = st.object_rescans;
            boost = st.boost;
            exclusions = st
                .exclusions
                .clone()
                .unwrap_or_else(|| cfg.exclusions.clone());
            limits = if first || boost {
                Limits::NONE
            } else {
                limits_for(&st)
            };
            shared.throttle.set_limits(limits);
        }
        let started = Instant::now();
        let mut opts = ScanOptions::new(&exclusions);
        opts.threads = if limits.is_unlimited() {
            cfg.threads
        } else {
            1
        };
        opts.throttle = Some(&shared.throttle);
        opts.stop = Some(&shared.stop);
        opts.vouched = Some(&shared.vouched);
        let res = scan::scan(&cfg.root, &opts);
        {
            let mut st = shared.lock();
            st.scanning = false;
            match res {
                Ok(mut r) if r.stats.complete => {
                    // A fetch or cleanup that ended during this scan listed the object cache
                    // after it changed; this scan's own listing may predate that (a fetch
                    // half done), and must not take the newer one back.
                    if st.object_rescans != rescans_at_start
                        && let Some((_, latest)) = st.gens.latest()
                    {
                        r.scan.objects = latest.objects.clone();
                    }
                    let changed = st.gens.record(r.scan);
                    shared.vouched.expire(Instant::now());
                    tracing::debug!(
                        generation = st.gens.generation(),
                        changed,
                        files = r.stats.files,
                        bytes = r.stats.bytes,
                        vouched = r.stats.vouched,
                        seconds = r.stats.elapsed.as_secs_f64(),
                        "scan complete"
                    );
                    st.last_stats = Some(r.stats);
                    st.last_error = None;
                    if boost {
                        st.boost = false;
                    }
                }
                Ok(_) => {} // abandoned for a pause or shutdown
                Err(e) => {
                    tracing::warn!("scan failed: {e}");
                    st.last_error = Some(e.to_string());
                }
            }
            shared.cond.notify_all();
        }
        if first && shared.lock().gens.scan_count() > 0 {
            first = false;
            if let Err(e) = rustix::process::setpriority_process(None, cfg.nice) {
                tracing::warn!("cannot set the scanner's nice value to {}: {e}", cfg.nice);
            }
        }
        // A boost (a fetch, update or cleanup: someone waits for the scan after it) starts
        // the next scan without waiting out the cycle; an update's pause holds it until the
        // update ends.
        let until = started + cfg.min_cycle;
        let mut st = shared.lock();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if st.shutdown || st.boost || left.is_zero() {
                break;
            }
            st = shared
                .cond
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
