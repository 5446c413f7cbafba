//! subd's operations (Dominator's `sub/rpcd`), independent of the transport: Poll, Fetch,
//! Update, Cleanup, GetFiles, Get/SetConfiguration, the client lock, triggers and the
//! post-update health check.
//!
//! - Fetch, Update and Cleanup exclude each other: a second one is refused ("… in
//!   progress"), never queued. Fetch, Update and Cleanup from a client other than the lock's
//!   holder are refused, as is a locking Poll.
//! - Update and Cleanup pause the scanner for their whole run; Fetch, Update and Cleanup lift
//!   the scan limits until the end of the next scan (so the controller's wait for a fresh
//!   scan is short). Update needs a scan first (it was planned from one).
//! - Update: old triggers from [`crate::update::TRIGGERS_PREVIOUS`], the new ones saved
//!   there; prepare (copies into the cache); stop the services the old ∪ new triggers
//!   match (recorded first in [`STOPPED_SERVICES`]); the change window; record the image
//!   name ([`crate::update::PATCHED_IMAGE`], unless sparse); start/reload (or reboot); the
//!   health command; everything reported in the reply and in the next Poll.
//! - At start: leftovers of an interrupted update or fetch are removed, and services an
//!   interrupted update stopped are started again (they ran before it).

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use paddock_image::plan::{UpdateRequest, untouchable};
use paddock_image::tree::normalize;
use paddock_wire::unix_ms;
use serde::Serialize;

pub use paddock_subd_proto::{
    CleanupReply, CleanupRequest, Configuration, ConfigurationError, DEFAULT_NETWORK_PERCENT,
    FetchReply, FetchRequest, HealthCheck, PollRequest, PollResponse, ScanSummary, UpdateReport,
};

use crate::fetch::{self, FetchStats};
use crate::lock::{ClientLock, Locked};
use crate::scan::{OBJECTS_DIR, SUBD_DIR, Scan};
use crate::scanner::{Scanner, ScannerConfig, ScannerHandle};
use crate::triggers::{CommandOutcome, Verb, run_command, trigger_actions};
use crate::update::{
    self, Applier, ApplyOptions, Progress, patched_image, previous_triggers, record_image,
    save_triggers,
};

/// Services stopped by an update that has not finished (JSON list), relative to the root.
pub const STOPPED_SERVICES: &str = ".subd/stopped-services";
/// Most paths per GetFiles.
pub const MAX_GET_FILES: usize = 100_000;

/// How subd runs (command line); [`Configuration`] is what a controller may change.
#[derive(Clone, Debug)]
pub struct SubdConfig {
    pub root: PathBuf,
    /// The scanner's settings (its root is set to `root`; its exclusions and limits come
    /// from `configuration`).
    pub scanner: ScannerConfig,
    pub configuration: Configuration,
    /// Triggers run `trigger_command SERVICE stop|start|reload|restart`.
    pub trigger_command: Vec<String>,
    /// Run once a rebooting update's triggers succeeded.
    pub reboot_command: Vec<String>,
    /// Run after every update that does not reboot; its result is reported by Poll.
    pub health_command: Option<Vec<String>>,
    /// Triggers and health commands are killed after this long.
    pub command_timeout: Duration,
    /// The link speed in bytes/s (`None`: from /sys/class/net; unknown = fetches unlimited).
    pub link_bytes_per_sec: Option<u64>,
    /// Sleep after each update operation (test hook).
    pub step_delay: Duration,
    /// TLS for object servers (the CA, subd's certificate and key); `None`: plain HTTP.
    pub object_tls: Option<ureq::tls::TlsConfig>,
    /// How long a poll may wait for the scan it asks for.
    pub scan_wait_max: Duration,
}

impl SubdConfig {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        SubdConfig {
            scanner: ScannerConfig::new(&root),
            root,
            configuration: Configuration::default(),
            trigger_command: vec!["service".into()],
            reboot_command: vec!["reboot".into()],
            health_command: None,
            command_timeout: Duration::from_secs(300),
            link_bytes_per_sec: None,
            step_delay: Duration::ZERO,
            object_tls: None,
            scan_wait_max: paddock_subd_proto::SCAN_WAIT_MAX,
        }
    }

    /// For subd run in-process on a small tree (tests, the dominator's among them): no scan
    /// exclusions, device and link speeds taken as 1 GiB/s instead of measured, and scan
    /// cycles 20 ms apart, so that changes are seen at once.
    pub fn for_tests(root: impl Into<PathBuf>) -> Self {
        let mut c = SubdConfig::new(root);
        c.configuration.scan_exclusions = Vec::new();
        c.scanner.device_speed = Some(1 << 30);
        c.scanner.fsbench_dir = c.root.join(".subd/fsbench-unused");
        c.scanner.min_cycle = Duration::from_millis(20);
        c.link_bytes_per_sec = Some(1 << 30);
        c
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SubdError {
    #[error(transparent)]
    Locked(#[from] Locked),
    #[error("{0} in progress")]
    Busy(&'static str),
    #[error("no scan yet: subd is not ready")]
    NotReady,
    #[error(transparent)]
    InvalidRequest(#[from] update::InvalidRequest),
    #[error(transparent)]
    Configuration(#[from] ConfigurationError),
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    #[error("{0}")]
    Bad(String),
    #[error("{0}")]
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Fetch,
    Update,
    Cleanup,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Fetch => "a fetch",
            Op::Update => "an update",
            Op::Cleanup => "a cleanup",
        }
    }
}

#[derive(Default)]
struct State {
    lock: ClientLock,
    busy: Option<Op>,
    configuration: Configuration,
    last_fetch: Option<FetchStats>,
    last_fetch_error: Option<String>,
    last_update: Option<UpdateReport>,
    last_update_error: Option<String>,
    last_update_had_trigger_failures: bool,
    last_successful_image: Option<String>,
    health: Option<HealthCheck>,
    progress: Option<Progress>,
    recovered: Vec<CommandOutcome>,
    /// Complete scans when the last update ended ([`PollResponse::scans_at_last_update`]).
    scans_at_last_update: u64,
}

/// The running subd.
pub struct Subd {
    config: SubdConfig,
    root: PathBuf,
    scanner: Scanner,
    state: Mutex<State>,
    origin: Instant,
    start_time_ms: i64,
    objects: fetch::ObjectClient,
    fetch_bytes: AtomicU64,
    link_speed: Option<u64>,
    /// Polls waiting for a scan now (each holds a blocking thread while it waits).
    waiting_polls: AtomicUsize,
}

/// At most this many polls wait for a scan at once; more are answered at once, as by a
/// subd that does not wait (one controller waits for one scan at a time).
const MAX_WAITING_POLLS: usize = 4;

/// A poll's place among [`MAX_WAITING_POLLS`], given back when dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn take(count: &'a AtomicUsize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_WAITING_POLLS).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiting(count))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Holds Fetch/Update/Cleanup exclusion; dropping it frees subd for the next.
struct OpGuard {
    subd: Arc<Subd>,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        let mut st = self.subd.lock_state();
        st.busy = None;
        st.progress = None;
    }
}

impl Subd {
    /// Prepares `<root>/.subd`, recovers from an interrupted update, starts the scanner.
    pub fn start(mut config: SubdConfig) -> io::Result<Arc<Subd>> {
        let root = config.root.clone();
        if !fs::metadata(&root)?.is_dir() {
            return Err(io::Error::other(format!(
                "{}: not a directory",
                root.display()
            )));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(root.join(OBJECTS_DIR))?;
        let cleaned = update::clean_leftovers(&root)?;
        if cleaned > 0 {
            tracing::info!(cleaned, "removed what an interrupted update or fetch left");
        }
        let exclusions = config.configuration.check().map_err(io::Error::other)?;
        config.scanner.root = root.clone();
        config.scanner.exclusions = exclusions;
        config.scanner.io_percent = config.configuration.scan_speed_percent;
        config.scanner.cpu_percent = config.configuration.cpu_percent;
        let link_speed = config
            .link_bytes_per_sec
            .or_else(|| fetch::link_speed(Path::new("/sys/class/net")));
        let recovered = restart_stopped_services(&root, &config);
        let scanner = Scanner::spawn(config.scanner.clone())?;
        let state = State {
            configuration: config.configuration.clone(),
            last_successful_image: patched_image(&root),
            recovered,
            ..State::default()
        };
        Ok(Arc::new(Subd {
            root,
            scanner,
            state: Mutex::new(state),
            origin: Instant::now(),
            start_time_ms: unix_ms(),
            objects: fetch::ObjectClient::new(config.object_tls.clone()),
            fetch_bytes: AtomicU64::new(0),
            waiting_polls: AtomicUsize::new(0),
            link_speed,
            config,
        }))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn scanner(&self) -> ScannerHandle {
        self.scanner.handle()
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clock(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Takes the Fetch/Update/Cleanup slot for `client` (checking, and with `lock_for_ms`
    /// taking, the client lock).
    fn begin(
        self: &Arc<Self>,
        op: Op,
        client: &str,
        lock_for_ms: u64,
    ) -> Result<OpGuard, SubdError> {
        let now = self.clock();
        let mut st = self.lock_state();
        st.lock.check(client, now)?;
        if let Some(b) = st.busy {
            return Err(SubdError::Busy(b.name()));
        }
        st.lock.acquire(client, lock_for_ms, now)?;
        st.busy = Some(op);
        st.progress = None;
        Ok(OpGuard { subd: self.clone() })
    }

    pub fn poll(&self, client: &str, req: &PollRequest) -> Result<PollResponse, SubdError> {
        let (mut r, scan) = self.poll_status(client, req)?;
        if let Some(scan) = scan {
            r.file_system = Some(scan.fs.clone());
            r.object_cache = Some(scan.objects.clone());
        }
        Ok(r)
    }

    /// [`Subd::poll`] without copying the tree: the answer's status (`file_system_follows`
    /// set, `file_system` and `object_cache` left out) and, when the tree follows, the scan
    /// it comes from (shared, for an encoder that writes it from there).
    pub fn poll_status(
        &self,
        client: &str,
        req: &PollRequest,
    ) -> Result<(PollResponse, Option<Arc<Scan>>), SubdError> {
        let handle = self.scanner.handle();
        if let Some(n) = req.wait_for_scan_after
            && let Some(_waiting) = Waiting::take(&self.waiting_polls)
        {
            handle.wait_for_scans(n.saturating_add(1), self.config.scan_wait_max);
        }
        let now = self.clock();
        let (latest, scan_count) = handle.latest_and_count();
        // The tree of a scan no newer than the one waited for is of no use to the caller.
        let scanned = req.wait_for_scan_after.is_none_or(|n| scan_count > n);
        let st = {
            let mut st = self.lock_state();
            if req.lock_for_ms > 0 {
                st.lock.acquire(client, req.lock_for_ms, now)?;
            }
            PollResponse {
                start_time_ms: self.start_time_ms,
                fetch_in_progress: st.busy == Some(Op::Fetch),
                update_in_progress: st.busy == Some(Op::Update),
                cleanup_in_progress: st.busy == Some(Op::Cleanup),
                update_progress: st.progress.clone(),
                last_fetch: st.last_fetch.clone(),
                last_fetch_error: st.last_fetch_error.clone(),
                last_update: st.last_update.clone(),
                last_update_error: st.last_update_error.clone(),
                last_update_had_trigger_failures: st.last_update_had_trigger_failures,
                last_successful_image_name: st.last_successful_image.clone(),
                last_health_check: st.health.clone(),
                recovered_services: st.recovered.clone(),
                scans_at_last_update: st.scans_at_last_update,
                lock: st.lock.state(client, now),
                configuration: st.configuration.clone(),
                ..PollResponse::default()
            }
        };
        let mut r = st;
        r.scan_count = scan_count;
        r.last_scan_error = handle.last_error();
        r.last_scan = handle.last_stats().map(|s| ScanSummary {
            files: s.files,
            bytes: s.bytes,
            vouched: s.vouched,
            seconds: s.elapsed.as_secs_f64(),
        });
        r.fetch_bytes = self.fetch_bytes.load(Ordering::Relaxed);
        r.free_space = nix::sys::statvfs::statvfs(&self.root)
            .ok()
            .map(|s| s.blocks_available() * s.fragment_size());
        let mut follows = None;
        if let Some((generation, scan)) = latest {
            r.generation = generation;
            if scanned && !req.short_poll_only && req.have_generation != generation {
                r.file_system_follows = true;
                follows = Some(scan);
            }
        }
        Ok((r, follows))
    }

    /// Fetches objects into the cache (in the background when `wait` is false).
    pub fn fetch(
        self: &Arc<Self>,
        client: &str,
        req: FetchRequest,
    ) -> Result<FetchReply, SubdError> {
        if req.server.trim().is_empty() {
            return Err(SubdError::Bad("fetch: no server".into()));
        }
        let guard = self.begin(Op::Fetch, client, req.lock_for_ms)?;
        self.scanner.handle().boost();
        let configured = self.lock_state().configuration.network_speed_percent;
        let rate = fetch::fetch_rate(self.link_speed, configured, req.speed_percent);
        self.fetch_bytes.store(0, Ordering::Relaxed);
        let me = self.clone();
        let job = move || -> Result<FetchReply, SubdError> {
            let before = me.scanner.handle().generation();
            let r = fetch::fetch(
                &me.objects,
                &req.server,
                &req.objects,
                &me.root.join(OBJECTS_DIR),
                rate,
                &me.fetch_bytes,
                Some(me.scanner.handle().vouched()),
            );
            // A background scan may have listed the fetched objects first: the generation
            // moved since the fetch began either way.
            let rescanned = me.scanner.handle().rescan_object_cache().unwrap_or(false);
            let new_generation = rescanned || me.scanner.handle().generation() > before;
            let mut st = me.lock_state();
            let out = match r {
                Ok(stats) => {
                    tracing::info!(
                        objects = stats.objects,
                        bytes = stats.bytes,
                        seconds = stats.seconds,
                        "fetched"
                    );
                    st.last_fetch = Some(stats.clone());
                    st.last_fetch_error = None;
                    Ok(FetchReply {
                        started: false,
                        stats: Some(stats),
                        new_generation,
                    })
                }
                Err(fetch::FetchFailure { done, error }) => {
                    tracing::warn!(
                        objects = done.objects,
                        bytes = done.bytes,
                        seconds = done.seconds,
                        "fetch failed, the objects stored so far kept: {error}"
                    );
                    st.last_fetch_error = Some(error.to_string());
                    Err(error.into())
                }
            };
            drop(st);
            drop(guard);
            out
        };
        if req.wait {
            job()
        } else {
            std::thread::Builder::new()
                .name("subd-fetch".into())
                .spawn(move || {
                    let _ = job();
                })
                .map_err(|e| SubdError::Failed(format!("starting the fetch: {e}")))?;
            Ok(FetchReply {
                started: true,
                ..FetchReply::default()
            })
        }
    }

    /// Applies an update (see the module documentation).
    pub fn update(
        self: &Arc<Self>,
        client: &str,
        req: UpdateRequest,
    ) -> Result<UpdateReport, SubdError> {
        update::validate(&req)?;
        let handle = self.scanner.handle();
        if handle.scan_count() == 0 {
            return Err(SubdError::NotReady);
        }
        let _guard = self.begin(Op::Update, client, 0)?;
        handle.boost();
        let pause = handle.pause();
        let t0 = Instant::now();
        let root = &self.root;
        let mut report = UpdateReport {
            image_name: req.image_name.clone(),
            sparse: req.sparse,
            ..UpdateReport::default()
        };
        let mut extra_errors: Vec<String> = Vec::new();
        let old = previous_triggers(root).unwrap_or_else(|e| {
            extra_errors.push(e.to_string());
            Default::default()
        });
        if let Err(e) = save_triggers(root, &req.triggers) {
            extra_errors.push(format!("saving the triggers: {e}"));
        }
        let exclusions = handle.exclusions();
        let progress = |p: &Progress| self.lock_state().progress = Some(p.clone());
        let mut applier = Applier::new(
            root,
            ApplyOptions {
                exclusions: Some(&exclusions),
                step_delay: self.config.step_delay,
                progress: Some(&progress),
                vouched: Some(handle.vouched()),
            },
        );
        applier.prepare(&req);

        let changed = req.changed_paths();
        let actions = trigger_actions(&old, &req.triggers, &changed);
        if actions.high_impact {
            tracing::warn!(image = %req.image_name, "a high-impact update");
        }
        let stopped: Vec<String> = actions.stop.iter().map(|a| a.service.clone()).collect();
        if !stopped.is_empty()
            && let Err(e) = write_json(&root.join(STOPPED_SERVICES), &stopped)
        {
            extra_errors.push(format!("recording the services to stop: {e}"));
        }
        for a in &actions.stop {
            let o = self.trigger(&a.service, a.verb);
            if !o.ok {
                report.trigger_failures = true;
            }
            report.trigger_runs.push(o);
        }

        applier.change(&req);
        tracing::info!(
            image = %req.image_name,
            change_window_ms = applier.stats.change_window_ms,
            errors = applier.stats.error_count,
            "update applied"
        );
        if !req.sparse {
            match record_image(root, &req.image_name) {
                Ok(()) => self.lock_state().last_successful_image = Some(req.image_name.clone()),
                Err(e) => extra_errors.push(format!("recording the image name: {e}")),
            }
        }

        let mut start_failed = false;
        for a in &actions.start {
            let o = self.trigger(&a.service, a.verb);
            if !o.ok && !a.ignore_failure {
                start_failed = true;
            }
            report.trigger_runs.push(o);
        }
        report.trigger_failures |= start_failed;
        let _ = fs::remove_file(root.join(STOPPED_SERVICES));
        if actions.reboot && !start_failed {
            let o = run_command(
                &self.config.reboot_command,
                &[],
                &[],
                self.config.command_timeout,
                &root.join(SUBD_DIR),
            );
            report.rebooting = true;
            if !o.ok {
                extra_errors.push(format!("reboot: {}", o.output.trim()));
            }
            report.trigger_runs.push(o);
        }
        report.triggers = actions;
        // Read while paused: no scan is under way, so every scan counted after this one
        // walked the tree this update left.
        self.lock_state().scans_at_last_update = handle.scan_count();
        drop(pause);

        if let (Some(cmd), false) = (&self.config.health_command, report.rebooting) {
            let o = run_command(
                cmd,
                &[],
                &[("PADDOCK_SUBD_IMAGE", req.image_name.as_str())],
                self.config.command_timeout,
                &root.join(SUBD_DIR),
            );
            report.health = Some(HealthCheck {
                image_name: req.image_name.clone(),
                at_ms: unix_ms(),
                outcome: o,
            });
        }
        report.apply = applier.stats;
        for e in extra_errors {
            report.apply.error(e);
        }
        report.error = report.apply.errors.last().cloned().or_else(|| {
            report
                .trigger_runs
                .iter()
                .rfind(|o| !o.ok)
                .map(|o| format!("trigger `{}` failed: {}", o.command, o.output.trim()))
        });
        report.total_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut st = self.lock_state();
        st.last_update_error = report.error.clone();
        st.last_update_had_trigger_failures = report.trigger_failures;
        if report.health.is_some() {
            st.health = report.health.clone();
        }
        st.last_update = Some(report.clone());
        Ok(report)
    }

    fn trigger(&self, service: &str, verb: Verb) -> CommandOutcome {
        let o = run_command(
            &self.config.trigger_command,
            &[service, verb.as_str()],
            &[],
            self.config.command_timeout,
            &self.root.join(SUBD_DIR),
        );
        if o.ok {
            tracing::info!(service, verb = verb.as_str(), "trigger ran");
        } else {
            tracing::warn!(service, verb = verb.as_str(), output = %o.output, "trigger failed");
        }
        o
    }

    /// Removes objects from the cache.
    pub fn cleanup(
        self: &Arc<Self>,
        client: &str,
        req: &CleanupRequest,
    ) -> Result<CleanupReply, SubdError> {
        let guard = self.begin(Op::Cleanup, client, 0)?;
        let handle = self.scanner.handle();
        handle.boost();
        let pause = handle.pause();
        let mut reply = CleanupReply::default();
        let objects = self.root.join(OBJECTS_DIR);
        for o in &req.objects {
            match fs::remove_file(objects.join(o.path())) {
                Ok(()) => reply.removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => reply.absent += 1,
                Err(e) => reply.errors.push(format!("{}: {e}", o.short())),
            }
        }
        drop(pause);
        let _ = handle.rescan_object_cache();
        drop(guard);
        Ok(reply)
    }

    pub fn configuration(&self) -> Configuration {
        self.lock_state().configuration.clone()
    }

    /// Changes the scan limits and exclusions (from the next scan) and the fetch share.
    pub fn set_configuration(&self, c: Configuration) -> Result<Configuration, SubdError> {
        let exclusions = c.check()?;
        let handle = self.scanner.handle();
        handle.set_limits(c.scan_speed_percent, c.cpu_percent);
        handle.set_exclusions(exclusions);
        self.lock_state().configuration = c.clone();
        Ok(c)
    }

    /// Lifts the scan limits until the end of the next scan.
    pub fn boost(&self) {
        self.scanner.handle().boost();
    }

    /// The host paths of files for GetFiles: each a normalised absolute path outside
    /// `/.subd` naming a regular file (not followed if a symlink).
    pub fn files_for(&self, paths: &[String]) -> Result<Vec<(String, PathBuf)>, SubdError> {
        if paths.len() > MAX_GET_FILES {
            return Err(SubdError::Bad(format!(
                "at most {MAX_GET_FILES} files per request"
            )));
        }
        let mut out = Vec::with_capacity(paths.len());
        for p in paths {
            if p.len() > paddock_subd_proto::poll_binary::MAX_PATH_BYTES {
                return Err(SubdError::Bad(format!(
                    "a path of {} bytes: longer than any file system names",
                    p.len()
                )));
            }
            if normalize(p).ok().as_deref() != Some(p.as_str()) || p == "/" {
                return Err(SubdError::Bad(format!(
                    "{p:?}: not a normalised absolute path"
                )));
            }
            if untouchable(p, None) {
                return Err(SubdError::Bad(format!("{p:?}: subd's own directory")));
            }
            let host = self.root.join(&p[1..]);
            match fs::symlink_metadata(&host) {
                Ok(m) if m.is_file() => out.push((p.clone(), host)),
                Ok(_) => return Err(SubdError::Bad(format!("{p}: not a regular file"))),
                Err(e) => return Err(SubdError::Bad(format!("{p}: {e}"))),
            }
        }
        Ok(out)
    }
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec(v).map_err(io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push("~");
    let tmp = PathBuf::from(tmp);
    {
        use std::io::Write;
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)
}

/// Starts the services an interrupted update stopped (they ran before it), then forgets
/// them.
fn restart_stopped_services(root: &Path, config: &SubdConfig) -> Vec<CommandOutcome> {
    let path = root.join(STOPPED_SERVICES);
    let Ok(text) = fs::read_to_string(&path) else {
        return Vec::new();
    };
    let services: Vec<String> = serde_json::from_str(&text).unwrap_or_default();
    let mut out = Vec::new();
    for s in &services {
        tracing::warn!(service = %s, "starting a service an interrupted update stopped");
        out.push(run_command(
            &config.trigger_command,
            &[s, Verb::Start.as_str()],
            &[],
            config.command_timeout,
            &root.join(SUBD_DIR),
        ));
    }
    let _ = fs::remove_file(&path);
    out
}
