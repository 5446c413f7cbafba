//! The configuration file as operators write it: every section and key optional, unknown
//! keys errors. Defaults are applied by validation, from [`super::defaults`], but for the
//! sections a domain defines itself (`dhcp`, `dhcp6`, `dns`, `roles`), whose defaults sit
//! beside their keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;

/// The file as written. Every section and key is optional; unknown keys are errors, so a typo
/// never silently falls back to a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub log_format: Option<String>,
    pub http: HttpFile,
    pub dhcp: crate::dhcp::DhcpFile,
    pub tftp: TftpFile,
    pub boot: BootFile,
    pub inspector: InspectorFile,
    pub firewall: FirewallFile,
    pub images: ImagesFile,
    pub dominator: DominatorFile,
    pub cluster: ClusterFile,
    pub timeline: TimelineFile,
    pub provisioning: ProvisioningFile,
    pub power: PowerFile,
    pub roles: crate::roles::RolesFile,
    pub dns: crate::dns::DnsFile,
    pub dhcp6: crate::dhcp6::Dhcp6File,
    pub security: SecurityFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProvisioningFile {
    /// Seconds a run (birth, rebirth, clean) may go without a report from its ramdisk before it
    /// ends in error at its next step; counted from the run's first report, never from the
    /// request ([`super::defaults::PROVISIONING_STEP_TIMEOUT_SECS`]).
    pub step_timeout_secs: Option<u64>,
    /// Seconds from `register` until the dominator finds subd synced to the image
    /// ([`super::defaults::PROVISIONING_SYNC_TIMEOUT_SECS`]).
    pub sync_timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PowerFile {
    /// Power-ons (BMC) started in any window of `interval_secs`, across the appliance
    /// ([`super::defaults::POWER_MAX_POWER_ONS`]); the rest wait their turn, first come first
    /// served, on the leader.
    pub max_power_ons: Option<u32>,
    /// Seconds of that window ([`super::defaults::POWER_INTERVAL_SECS`]).
    pub interval_secs: Option<u64>,
    /// Seconds between the leader's reads of every managed node's power state
    /// ([`super::defaults::POWER_SYNC_SECS`]).
    pub sync_secs: Option<u64>,
    /// Networks (CIDR) where a BMC that a machine reports may be: one elsewhere is not
    /// contacted until an operator or a rule sets it (default: none).
    #[serde(default)]
    pub bmc_networks: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimelineFile {
    /// Entries kept for every node and every MAC, the newest (default: `TimelineLimits::default()`).
    pub keep_per_subject: Option<usize>,
    /// Also keep every entry of each node's last introspection, however many (default: `TimelineLimits::default()`).
    pub keep_last_introspection: Option<bool>,
    /// Seconds between prunings, on the leader ([`super::defaults::TIMELINE_PRUNE_EVERY_SECS`]).
    pub prune_every_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterFile {
    /// "sqlite" (one host, the default) or "etcd" (several hosts sharing an etcd cluster).
    pub store: Option<String>,
    /// The etcd members' client URLs, e.g. "http://198.18.0.11:2379".
    pub etcd_endpoints: Vec<String>,
    /// This host's name in the election and the console (default: the system's hostname).
    pub host: Option<String>,
    /// Seconds of the leader's lease ([`super::defaults::CLUSTER_LEASE_TTL_SECS`]): a dead leader is replaced after about this.
    pub lease_ttl_secs: Option<u64>,
    /// Every host's public URL; the discovery ramdisk is given all of them and fails over.
    pub peers: Vec<String>,
    /// TLS to etcd (`https://` endpoints): the members' CA, this host's client certificate
    /// and key, PEM files; all three or none.
    pub etcd_ca_file: Option<PathBuf>,
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DominatorFile {
    /// Keep every MDB machine that has a RequiredImage and an address on it ([`super::defaults::DOMINATOR_ENABLED`]); leader-only.
    pub enabled: Option<bool>,
    /// The port subd listens on ([`super::defaults::DOMINATOR_SUBD_PORT`]).
    pub subd_port: Option<u16>,
    /// Fetches, updates and cleanups at once, over the whole fleet ([`super::defaults::DOMINATOR_MAX_UPDATES`]).
    pub max_updates: Option<usize>,
    /// Polls at once ([`super::defaults::DOMINATOR_MAX_POLLS`]).
    pub max_polls: Option<usize>,
    /// Milliseconds between polls of a sub with nothing to do ([`super::defaults::DOMINATOR_POLL_INTERVAL_MS`]).
    pub poll_interval_ms: Option<u64>,
    /// Share of a sub's link its fetches may use, in percent ([`super::defaults::DOMINATOR_FETCH_SPEED_PERCENT`]).
    pub fetch_speed_percent: Option<f64>,
    /// Share of the subs that may run an update with a high-impact or reboot trigger at once, above 0 and at most 1; at least one such update may always run ([`super::defaults::DOMINATOR_HIGH_IMPACT_SHARE`]).
    pub high_impact_share: Option<f64>,
    /// A program asked, before an update that reboots a machine or runs a high-impact
    /// trigger, whether the machine may be disrupted now (an absolute path; the machine's
    /// data as JSON on stdin; exit 0 permits, any other exit denies, its first line of
    /// output says why). Roles' `disrupt` hooks are asked too. Unset: only those hooks.
    pub disruption_check: Option<PathBuf>,
    /// Seconds before a denied disruption is asked again ([`super::defaults::DOMINATOR_DISRUPTION_RETRY_SECS`]).
    pub disruption_retry_secs: Option<u64>,
    /// Seconds the check may take before it counts as a denial ([`super::defaults::DOMINATOR_DISRUPTION_TIMEOUT_SECS`]).
    pub disruption_timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesFile {
    /// The object store and image server's directory (default `<data_dir>/`[`super::defaults::IMAGES_SUBDIR`]).
    pub dir: Option<PathBuf>,
    /// An MDB file in Dominator's JSON to load and watch (replace it with write-then-rename).
    pub mdb_file: Option<PathBuf>,
    /// Seconds between checks of the MDB file ([`super::defaults::IMAGES_MDB_POLL_SECS`]).
    pub mdb_poll_secs: Option<u64>,
    /// Record machines that finish enrolment in the MDB ([`super::defaults::IMAGES_RECORD_ENROLLED`]).
    pub record_enrolled: Option<bool>,
    /// Seconds between checks for expired images ([`super::defaults::IMAGES_EXPIRE_CHECK_SECS`]).
    pub expire_check_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FirewallFile {
    /// Keep the PXE filter (nftables table `inet paddock`) in step with the nodes ([`super::defaults::FIREWALL_ENABLED`]).
    pub enabled: Option<bool>,
    /// The provisioning interface (default: the first DHCP interface).
    pub interface: Option<String>,
    /// Unknown MACs may PXE-boot (default: inspector.auto_enrol).
    pub discovery: Option<bool>,
    /// Seconds between reconciliations that repair drift ([`super::defaults::FIREWALL_RECONCILE_SECS`], at most 15).
    pub reconcile_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InspectorFile {
    /// Enrol machines no node matches (default: `InspectorConfig::default()`).
    pub auto_enrol: Option<bool>,
    /// Seconds before a running introspection ends in error (default: `InspectorConfig::default()`).
    pub timeout_secs: Option<i64>,
    /// How often timeouts are checked ([`super::defaults::INSPECTOR_CLEAN_UP_PERIOD_SECS`]).
    pub clean_up_period_secs: Option<u64>,
    /// Largest `/v1/continue` body in bytes (default: `InspectorConfig::default()`).
    pub max_body_bytes: Option<usize>,
    /// What the ramdisk does after introspection: poweroff, reboot or wait (default: `InspectorConfig::default()`).
    pub after_inspection: Option<String>,
}

/// `[security]`: TLS, certificates and tokens.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityFile {
    /// Serve everything on plain HTTP and let anyone call anything (Dominator's insecure
    /// mode; says so loudly at start). Default false: TLS, and `paddock serve` refuses to
    /// start until `paddock certs init` has run.
    pub insecure: Option<bool>,
    /// Where this host's certificate, key and the CA's certificate live
    /// (default `<data_dir>/`[`super::defaults::SECURITY_SUBDIR`]).
    pub dir: Option<PathBuf>,
    /// The HTTPS listen address: API, console, RPC, the agent's calls (default: the HTTP
    /// listen address on port [`super::defaults::SECURITY_PORT`]).
    pub listen: Option<String>,
    /// The HTTPS base URL as machines reach it (default: from `listen`).
    pub public_url: Option<String>,
    /// Let callers without a certificate or token use the Inspector v1 API, as Inspector's
    /// `noauth` strategy does ([`super::defaults::SECURITY_INSPECTOR_NOAUTH`]).
    pub inspector_noauth: Option<bool>,
    /// Seconds an agent token minted with a boot script stays valid
    /// ([`super::defaults::SECURITY_AGENT_TOKEN_TTL_SECS`]).
    pub agent_token_ttl_secs: Option<u64>,
    /// Connections at once per listener ([`super::defaults::SECURITY_MAX_CONNECTIONS`]).
    pub max_connections: Option<usize>,
    /// Seconds for a request's headers (and a TLS handshake) to arrive
    /// ([`super::defaults::SECURITY_HEADER_TIMEOUT_SECS`]).
    pub header_timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpFile {
    pub listen: Option<String>,
    pub public_url: Option<String>,
    pub assets_dir: Option<PathBuf>,
    /// Connections at once from one source address, per listener (0: no cap;
    /// [`super::defaults::HTTP_MAX_CONNECTIONS_PER_SOURCE`]).
    pub max_connections_per_source: Option<usize>,
    /// Bytes per second a request body must keep up once its grace (the header timeout)
    /// is spent (0: no minimum; [`super::defaults::HTTP_MIN_BODY_RATE`]).
    pub min_body_rate: Option<u64>,
    /// At SIGTERM, how long requests in flight may take to finish before the appliance
    /// exits anyway ([`super::defaults::HTTP_SHUTDOWN_GRACE_SECS`]).
    pub shutdown_grace_secs: Option<u64>,
    /// How long a kept-alive connection waits for its next request before it is closed
    /// ([`super::defaults::HTTP_IDLE_TIMEOUT_SECS`]).
    pub idle_timeout_secs: Option<u64>,
    /// Large boot assets sent at once; the others wait their turn, in order (0: all at
    /// once; [`super::defaults::HTTP_ASSET_LANES`]).
    pub asset_lanes: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TftpFile {
    pub enabled: Option<bool>,
    pub listen: Vec<String>,
    pub root: Option<PathBuf>,
    pub roots: Vec<PathBuf>,
    pub max_transfers: Option<usize>,
    pub block_size_limit: Option<u16>,
    pub window_size_limit: Option<u16>,
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BootFile {
    /// Option 93 value → boot file, overriding the built-in table.
    pub arch: BTreeMap<String, String>,
    pub tftp_server: Option<String>,
    pub discovery: DiscoveryFile,
    pub secure_boot: SecureBootFile,
    pub arm64: Arm64File,
}

/// `[boot.arm64]`: arm64 UEFI machines boot GRUB → the arm64 kernel and initrd over TFTP.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Arm64File {
    pub enabled: Option<bool>,
    /// The network GRUB ([`super::defaults::ARM64_GRUB`] under the assets directory).
    pub grub: Option<PathBuf>,
    /// Names under the assets directory ([`super::defaults::ARM64_KERNEL`], `ARM64_INITRD`).
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    /// Words added to the ramdisk's command line ([`super::defaults::ARM64_CMDLINE`]).
    pub cmdline: Option<String>,
}

/// `[boot.secure_boot]`: machines that enforce Secure Boot boot shim → signed GRUB → the
/// signed kernel over TFTP instead of iPXE.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecureBootFile {
    pub enabled: Option<bool>,
    /// Networks (CIDR) whose machines boot the signed chain; empty: every machine.
    pub networks: Vec<String>,
    /// The signed shim ([`super::defaults::SECURE_BOOT_SHIM`]).
    pub shim: Option<PathBuf>,
    /// The signed network GRUB ([`super::defaults::SECURE_BOOT_GRUB`]).
    pub grub: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryFile {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub cmdline: Option<String>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            problems: vec![format!("{}: cannot read: {e}", path.display())],
        })?;
        Self::parse(&text).map_err(|mut e| {
            e.problems = e
                .problems
                .into_iter()
                .map(|p| format!("{}: {p}", path.display()))
                .collect();
            e
        })
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError {
            problems: vec![e.to_string().trim_end().to_string()],
        })
    }
}
