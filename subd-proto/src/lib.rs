//! What subd and its controllers say to each other: the requests and answers of subd's RPC
//! (`/rpc/Subd.*`), the [`Configuration`] a controller may set, and the binary Poll answer
//! ([`poll_binary`]). A crate of its own so that a controller (the dominator) needs these
//! types and their codec, not the whole agent; subd re-exports them where they always were.

pub mod poll_binary;

use std::collections::BTreeSet;

use paddock_image::filter::FilterError;
use paddock_image::{FileSystem, Filter, ObjectId};
use serde::{Deserialize, Serialize};

/// Dominator's default share of the link for fetches.
pub const DEFAULT_NETWORK_PERCENT: f64 = 10.0;
/// Dominator's default scan limits (`lib/constants`): media reads and CPU, in percent.
pub const DEFAULT_IO_PERCENT: f64 = 2.0;
pub const DEFAULT_CPU_PERCENT: f64 = 50.0;
/// Dominator's default scan exclusions (`lib/constants`).
pub const DEFAULT_EXCLUSIONS: [&str; 7] = [
    "/data/.*",
    "/home/.*",
    "/tmp/.*",
    "/var/log/.*",
    "/var/mail/.*",
    "/var/spool/.*",
    "/var/tmp/.*",
];
/// Error messages kept per update (the count is kept in full).
pub const MAX_ERRORS: usize = 100;

/// What a controller reads and sets (Dominator's `sub.Configuration`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Configuration {
    /// Scan CPU share after the first scan (× CPUs, capped at one CPU).
    pub cpu_percent: f64,
    /// Fetch share of the link (a request may ask for more).
    pub network_speed_percent: f64,
    /// Scan media reads after the first scan, as a share of the device speed.
    pub scan_speed_percent: f64,
    /// Scan exclusions (start-anchored regular expressions).
    pub scan_exclusions: Vec<String>,
    pub owner_groups: Vec<String>,
    pub owner_users: Vec<String>,
}

impl Default for Configuration {
    fn default() -> Self {
        Configuration {
            cpu_percent: DEFAULT_CPU_PERCENT,
            network_speed_percent: DEFAULT_NETWORK_PERCENT,
            scan_speed_percent: DEFAULT_IO_PERCENT,
            scan_exclusions: DEFAULT_EXCLUSIONS.iter().map(|s| s.to_string()).collect(),
            owner_groups: Vec::new(),
            owner_users: Vec::new(),
        }
    }
}

/// Why a [`Configuration`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigurationError {
    #[error("{name} must be above 0 and at most 100, not {value}")]
    Percent { name: &'static str, value: f64 },
    #[error("scan_exclusions: {0}")]
    Exclusions(#[from] FilterError),
}

impl Configuration {
    /// Checks the percentages and compiles the exclusions.
    pub fn check(&self) -> Result<Filter, ConfigurationError> {
        for (name, value) in [
            ("cpu_percent", self.cpu_percent),
            ("network_speed_percent", self.network_speed_percent),
            ("scan_speed_percent", self.scan_speed_percent),
        ] {
            if !(value > 0.0 && value <= 100.0) {
                return Err(ConfigurationError::Percent { name, value });
            }
        }
        Ok(Filter::from_lines(self.scan_exclusions.iter().cloned())?)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PollRequest {
    /// The generation the caller has; the tree follows only when it differs.
    pub have_generation: u64,
    /// Take the client lock for this long (capped at 15 s); 0: none.
    pub lock_for_ms: u64,
    /// Never send the tree.
    pub short_poll_only: bool,
    /// Answer once a scan numbered above this one has completed, waiting at most the sub's
    /// own limit ([`SCAN_WAIT_MAX`] by default); if none completes by then, answer without
    /// the tree (it predates the scan waited for). What a controller sends after its update:
    /// one answer when the scan is done, rather than a tree polled again and again while it
    /// runs. A sub that does not know the field answers at once, as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for_scan_after: Option<u64>,
}

/// How long a poll waits for the scan it asks for ([`PollRequest::wait_for_scan_after`]) at
/// the most: well inside a controller's time limit for a poll.
pub const SCAN_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PollResponse {
    /// 0 before the first scan; changes only when the tree or the object cache does.
    pub generation: u64,
    /// Complete scans since start (a controller waits for it to move after an update).
    pub scan_count: u64,
    /// `scan_count` when the last update ended (0: none yet). While `scan_count` is no higher,
    /// the newest tree predates that update: a controller whose update call failed (its
    /// answer lost, the update perhaps applied) must not plan from it.
    pub scans_at_last_update: u64,
    pub start_time_ms: i64,
    pub fetch_in_progress: bool,
    pub update_in_progress: bool,
    pub cleanup_in_progress: bool,
    pub update_progress: Option<Progress>,
    /// Bytes the fetch in progress (or the last) has written.
    pub fetch_bytes: u64,
    pub last_fetch: Option<FetchStats>,
    pub last_fetch_error: Option<String>,
    pub last_update: Option<UpdateReport>,
    pub last_update_error: Option<String>,
    pub last_update_had_trigger_failures: bool,
    /// The last full image applied (recorded by subd in `.subd/patched-image`).
    pub last_successful_image_name: Option<String>,
    /// The health command's result after the last update (none configured: `None`).
    pub last_health_check: Option<HealthCheck>,
    pub last_scan_error: Option<String>,
    /// The last complete scan: what it hashed and how long it took.
    pub last_scan: Option<ScanSummary>,
    /// Services an interrupted update had stopped, started again when subd started.
    pub recovered_services: Vec<CommandOutcome>,
    pub lock: LockState,
    /// Bytes free for unprivileged users on the root's file system.
    pub free_space: Option<u64>,
    pub configuration: Configuration,
    pub file_system_follows: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_system: Option<FileSystem>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_cache: Option<BTreeSet<ObjectId>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FetchRequest {
    /// The image server (`host:port` or a URL).
    pub server: String,
    pub objects: Vec<ObjectId>,
    /// Share of the link (the configured share if that is more).
    #[serde(default)]
    pub speed_percent: f64,
    #[serde(default)]
    pub lock_for_ms: u64,
    /// Answer when done (default); false answers at once and reports in the next Poll.
    #[serde(default = "yes")]
    pub wait: bool,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FetchReply {
    /// Started in the background (`wait: false`).
    pub started: bool,
    pub stats: Option<FetchStats>,
    /// A newer generation exists than when the fetch began (the object cache listing
    /// changed, by this fetch's rescan or by a scan that ran meanwhile).
    pub new_generation: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CleanupRequest {
    pub objects: Vec<ObjectId>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupReply {
    pub removed: u64,
    pub absent: u64,
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// The image the update applied.
    pub image_name: String,
    pub at_ms: i64,
    pub outcome: CommandOutcome,
}

/// An update's result (the Update reply, and `last_update` in Poll).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateReport {
    pub image_name: String,
    pub sparse: bool,
    /// What the applier did, with the change window (`apply.change_window_ms`).
    pub apply: ApplyStats,
    pub total_ms: f64,
    pub triggers: TriggerActions,
    /// Every trigger command run, in order.
    pub trigger_runs: Vec<CommandOutcome>,
    pub trigger_failures: bool,
    /// The reboot command ran.
    pub rebooting: bool,
    pub health: Option<HealthCheck>,
    /// The last error (also `last_update_error` in Poll).
    pub error: Option<String>,
}

/// The lock as a caller sees it (reported by Poll).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockState {
    /// Someone holds it now.
    pub held: bool,
    /// The caller holds it.
    pub by_caller: bool,
    pub holder: Option<String>,
    pub ms_left: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FetchStats {
    pub objects: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// The pace asked for (bytes/s); `None`: unlimited.
    pub rate_limit: Option<f64>,
}

/// What one complete scan hashed, and how long it took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScanSummary {
    /// Regular files read and hashed, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Regular files taken at the hash subd computed as it wrote them, not read again.
    pub vouched: u64,
    pub seconds: f64,
}

/// Where the applier is (reported by Poll while an update runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub phase: String,
    pub done: usize,
    pub total: usize,
}

/// What the applier did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyStats {
    pub copied_to_cache: u64,
    pub copies_made: u64,
    pub dirs_made: u64,
    pub inodes_made: u64,
    pub hardlinks_made: u64,
    pub deleted: u64,
    pub changed: u64,
    /// Operations skipped because the scan exclusions cover their path.
    pub excluded: u64,
    pub prepare_ms: f64,
    /// The change window (directories through metadata).
    pub change_window_ms: f64,
    pub errors: Vec<String>,
    pub error_count: u64,
}

impl ApplyStats {
    /// Records an error (the first [`MAX_ERRORS`] kept, all counted).
    pub fn error(&mut self, msg: String) {
        tracing::warn!("update: {msg}");
        self.error_count += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(msg);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    Stop,
    Start,
    Reload,
    Restart,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Stop => "stop",
            Verb::Start => "start",
            Verb::Reload => "reload",
            Verb::Restart => "restart",
        }
    }
}

/// One `service NAME VERB`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub service: String,
    pub verb: Verb,
    /// A failure does not count (the `reboot` trigger's start).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_failure: bool,
}

impl Action {
    pub fn new(service: &str, verb: Verb) -> Self {
        Action {
            service: service.to_string(),
            verb,
            ignore_failure: false,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.service, self.verb.as_str())
    }
}

/// What an update does with services.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerActions {
    /// Before the change window.
    pub stop: Vec<Action>,
    /// After it (and after the image name is recorded).
    pub start: Vec<Action>,
    /// Reboot once `start` succeeded.
    pub reboot: bool,
    /// A matched trigger is HighImpact.
    pub high_impact: bool,
}

/// How a command went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandOutcome {
    /// The command line run.
    pub command: String,
    pub ok: bool,
    /// The exit code (`None`: killed by a signal, timed out, or not started).
    pub exit_code: Option<i32>,
    /// The first bytes of its standard output and error (subd keeps 4 KiB), or why it did not
    /// run.
    pub output: String,
    pub elapsed_ms: u64,
}
