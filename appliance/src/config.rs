//! Configuration in two layers: the TOML file operators write (plus flag and environment
//! overrides), and the validated [`Config`] that everything after start-up uses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use ipnet::Ipv4Net;
use paddock_dhcp::{BootPolicy, Pool, Reservation, Subnet};
use paddock_inspector::service::{InspectorConfig, NextAction, TimelineLimits};
use paddock_inventory::MacAddr;
use serde::Deserialize;

/// The file as written. Every section and key is optional; unknown keys are errors, so a typo
/// never silently falls back to a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub log_format: Option<String>,
    pub http: HttpFile,
    pub dhcp: DhcpFile,
    pub tftp: TftpFile,
    pub boot: BootFile,
    pub inspector: InspectorFile,
    pub firewall: FirewallFile,
    pub images: ImagesFile,
    pub cluster: ClusterFile,
    pub timeline: TimelineFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimelineFile {
    /// Entries kept for every node and every MAC, the newest (default 200).
    pub keep_per_subject: Option<usize>,
    /// Also keep every entry of each node's last introspection, however many (default true).
    pub keep_last_introspection: Option<bool>,
    /// Seconds between prunings, on the leader (default 60).
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
    /// Seconds of the leader's lease (default 3): a dead leader is replaced after about this.
    pub lease_ttl_secs: Option<u64>,
    /// Every host's public URL; the discovery ramdisk is given all of them and fails over.
    pub peers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesFile {
    /// The object store and image server's directory (default `<data_dir>/images`).
    pub dir: Option<PathBuf>,
    /// An MDB file in Dominator's JSON to load and watch (replace it with write-then-rename).
    pub mdb_file: Option<PathBuf>,
    /// Seconds between checks of the MDB file (default 2).
    pub mdb_poll_secs: Option<u64>,
    /// Record machines that finish enrolment in the MDB (default true).
    pub record_enrolled: Option<bool>,
    /// Seconds between checks for expired images (default 60).
    pub expire_check_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FirewallFile {
    /// Keep the PXE filter (nftables table `inet paddock`) in step with the nodes (default false).
    pub enabled: Option<bool>,
    /// The provisioning interface (default: the first DHCP interface).
    pub interface: Option<String>,
    /// Unknown MACs may PXE-boot (default: inspector.auto_enrol).
    pub discovery: Option<bool>,
    /// Seconds between reconciliations that repair drift (default 10, at most 15).
    pub reconcile_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InspectorFile {
    /// Enrol machines no node matches (default true).
    pub auto_enrol: Option<bool>,
    /// Seconds before a running introspection ends in error (default 3600).
    pub timeout_secs: Option<i64>,
    /// How often timeouts are checked (default 10).
    pub clean_up_period_secs: Option<u64>,
    /// Largest `/v1/continue` body in bytes (default 4 MiB).
    pub max_body_bytes: Option<usize>,
    /// What the ramdisk does after introspection: poweroff, reboot or wait (default poweroff).
    pub after_inspection: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpFile {
    pub listen: Option<String>,
    pub public_url: Option<String>,
    pub assets_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DhcpFile {
    pub enabled: Option<bool>,
    pub interfaces: Vec<String>,
    pub port: Option<u16>,
    pub client_port: Option<u16>,
    pub relay_port: Option<u16>,
    pub deny_macs: Vec<String>,
    pub subnets: Vec<SubnetFile>,
    pub reservations: Vec<ReservationFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubnetFile {
    pub network: String,
    pub pools: Vec<String>,
    pub exclude: Vec<String>,
    pub routers: Vec<String>,
    pub dns: Vec<String>,
    pub domain: Option<String>,
    pub lease_time: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationFile {
    pub mac: String,
    pub ip: String,
    pub hostname: Option<String>,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryFile {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub cmdline: Option<String>,
}

/// Flags and environment variables; each overrides the file.
#[derive(Debug, Default, Clone, Args)]
pub struct Overrides {
    /// Where the store (leases, nodes) lives.
    #[arg(long, env = "PADDOCK_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Log format: human or json.
    #[arg(long, env = "PADDOCK_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// HTTP listen address (boot scripts, assets, API, console).
    #[arg(long, env = "PADDOCK_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// The HTTP base URL as machines reach it, e.g. http://198.18.0.1:8080.
    #[arg(long, env = "PADDOCK_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Directory served at /boot/assets/ (with Range support).
    #[arg(long, env = "PADDOCK_ASSETS_DIR")]
    pub assets_dir: Option<PathBuf>,
    /// Run the DHCP server.
    #[arg(long, env = "PADDOCK_DHCP_ENABLED")]
    pub dhcp_enabled: Option<bool>,
    /// Interfaces to serve DHCP on, comma-separated.
    #[arg(long, env = "PADDOCK_DHCP_INTERFACES", value_delimiter = ',')]
    pub dhcp_interfaces: Option<Vec<String>>,
    /// UDP port of the DHCP server.
    #[arg(long, env = "PADDOCK_DHCP_PORT")]
    pub dhcp_port: Option<u16>,
    /// Run the TFTP server.
    #[arg(long, env = "PADDOCK_TFTP_ENABLED")]
    pub tftp_enabled: Option<bool>,
    /// TFTP listen addresses (ip:port), comma-separated; one server per address.
    #[arg(long, env = "PADDOCK_TFTP_LISTEN", value_delimiter = ',')]
    pub tftp_listen: Option<Vec<String>>,
    /// TFTP roots, comma-separated, searched in order.
    #[arg(long, env = "PADDOCK_TFTP_ROOTS", value_delimiter = ',')]
    pub tftp_roots: Option<Vec<PathBuf>>,
    /// Most TFTP transfers at once.
    #[arg(long, env = "PADDOCK_TFTP_MAX_TRANSFERS")]
    pub tftp_max_transfers: Option<usize>,
    /// Discovery ramdisk kernel URL.
    #[arg(long, env = "PADDOCK_DISCOVERY_KERNEL")]
    pub discovery_kernel: Option<String>,
    /// Discovery ramdisk initrd URL.
    #[arg(long, env = "PADDOCK_DISCOVERY_INITRD")]
    pub discovery_initrd: Option<String>,
    /// Extra kernel command line for the discovery ramdisk.
    #[arg(long, env = "PADDOCK_DISCOVERY_CMDLINE")]
    pub discovery_cmdline: Option<String>,
    /// Timeline entries kept for every node and every MAC.
    #[arg(long, env = "PADDOCK_TIMELINE_KEEP_PER_SUBJECT")]
    pub timeline_keep_per_subject: Option<usize>,
    /// Also keep every timeline entry of each node's last introspection.
    #[arg(long, env = "PADDOCK_TIMELINE_KEEP_LAST_INTROSPECTION")]
    pub timeline_keep_last_introspection: Option<bool>,
    /// Seconds between timeline prunings.
    #[arg(long, env = "PADDOCK_TIMELINE_PRUNE_EVERY_SECS")]
    pub timeline_prune_every_secs: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub http_listen: SocketAddr,
    pub public_url: String,
    pub assets_dir: Option<PathBuf>,
    pub dhcp: Option<DhcpConfig>,
    pub tftp: Option<TftpConfig>,
    pub boot: BootPolicy,
    pub discovery: Discovery,
    pub inspector: paddock_inspector::service::InspectorConfig,
    pub clean_up_period: Duration,
    pub firewall: Option<FirewallConfig>,
    pub images: ImagesConfig,
    pub cluster: Option<ClusterConfig>,
    pub timeline: TimelineConfig,
}

/// What the timeline keeps, and how often the leader prunes it.
#[derive(Clone, Debug)]
pub struct TimelineConfig {
    pub limits: TimelineLimits,
    pub prune_every: Duration,
}

/// Several hosts on one etcd cluster (`None`: one host on the embedded store).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub etcd_endpoints: Vec<String>,
    pub host: String,
    pub lease_ttl: Duration,
}

#[derive(Clone, Debug)]
pub struct ImagesConfig {
    pub dir: PathBuf,
    pub mdb_file: Option<PathBuf>,
    pub mdb_poll: Duration,
    pub record_enrolled: bool,
    pub expire_check: Duration,
}

#[derive(Clone, Debug)]
pub struct FirewallConfig {
    pub interface: String,
    pub discovery: bool,
    pub reconcile: Duration,
}

#[derive(Clone, Debug)]
pub struct DhcpConfig {
    pub interfaces: Vec<String>,
    pub port: u16,
    pub client_port: u16,
    pub relay_port: u16,
    pub deny_macs: BTreeSet<MacAddr>,
    pub subnets: Vec<Subnet>,
    pub reservations: Vec<Reservation>,
}

#[derive(Clone, Debug)]
pub struct TftpConfig {
    pub listen: Vec<SocketAddr>,
    pub server: paddock_tftp::TftpConfig,
}

/// The discovery ramdisk entry of the boot script.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub cmdline: String,
    /// `paddock.url` for the agent when there are several hosts (this one first); empty:
    /// the public URL alone.
    pub agent_urls: Vec<String>,
}

/// All problems found in a configuration, each with the setting it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.join("\n"))]
pub struct ConfigError {
    pub problems: Vec<String>,
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

    pub fn apply(&mut self, o: &Overrides) {
        override_with(&mut self.data_dir, &o.data_dir);
        override_with(&mut self.log_format, &o.log_format);
        override_with(&mut self.http.listen, &o.http_listen);
        override_with(&mut self.http.public_url, &o.public_url);
        override_with(&mut self.http.assets_dir, &o.assets_dir);
        override_with(&mut self.dhcp.enabled, &o.dhcp_enabled);
        override_with(&mut self.dhcp.port, &o.dhcp_port);
        override_with(&mut self.tftp.enabled, &o.tftp_enabled);
        override_with(&mut self.tftp.max_transfers, &o.tftp_max_transfers);
        override_with(&mut self.boot.discovery.kernel, &o.discovery_kernel);
        override_with(&mut self.boot.discovery.initrd, &o.discovery_initrd);
        override_with(&mut self.boot.discovery.cmdline, &o.discovery_cmdline);
        override_with(
            &mut self.timeline.keep_per_subject,
            &o.timeline_keep_per_subject,
        );
        override_with(
            &mut self.timeline.keep_last_introspection,
            &o.timeline_keep_last_introspection,
        );
        override_with(
            &mut self.timeline.prune_every_secs,
            &o.timeline_prune_every_secs,
        );
        if let Some(v) = &o.dhcp_interfaces {
            self.dhcp.interfaces = v.clone();
        }
        if let Some(v) = &o.tftp_listen {
            self.tftp.listen = v.clone();
        }
        if let Some(v) = &o.tftp_roots {
            self.tftp.root = None;
            self.tftp.roots = v.clone();
        }
    }

    /// Checks everything and builds the internal configuration; reports every problem found.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let mut p = Vec::new();
        let http_listen: Option<SocketAddr> = parse_or(
            &mut p,
            "http.listen",
            self.http.listen.as_deref().unwrap_or("0.0.0.0:8080"),
        );
        let public_url = match &self.http.public_url {
            Some(u) if u.starts_with("http://") || u.starts_with("https://") => {
                u.trim_end_matches('/').to_string()
            }
            Some(u) => {
                p.push(format!(
                    "http.public_url: {u:?} must start with http:// or https://"
                ));
                String::new()
            }
            None => match http_listen {
                Some(a) if !a.ip().is_unspecified() => format!("http://{a}"),
                _ => {
                    p.push("http.public_url: required when http.listen is a wildcard address; set the URL machines use to reach this host, e.g. http://198.18.0.1:8080".into());
                    String::new()
                }
            },
        };
        let log_format = match self.log_format.as_deref().unwrap_or("human") {
            "human" => LogFormat::Human,
            "json" => LogFormat::Json,
            other => {
                p.push(format!(
                    "log_format: {other:?} is neither \"human\" nor \"json\""
                ));
                LogFormat::Human
            }
        };

        let mut overrides = BTreeMap::new();
        for (k, v) in &self.boot.arch {
            match k.parse::<u16>() {
                Ok(a) if !v.is_empty() => {
                    overrides.insert(a, v.clone());
                }
                Ok(_) => p.push(format!("boot.arch.{k}: the boot file name is empty")),
                Err(_) => p.push(format!("boot.arch.{k}: keys are option 93 numbers (0 BIOS, 7 x64 UEFI, 11 arm64 UEFI, 16 x64 HTTP …)")),
            }
        }
        let mut boot = BootPolicy::new(&public_url, &overrides);
        boot.tftp_server = self
            .boot
            .tftp_server
            .as_deref()
            .and_then(|s| parse_or(&mut p, "boot.tftp_server", s));

        let first_dhcp_interface = self.dhcp.interfaces.first().cloned();
        let dhcp = if self.dhcp.enabled.unwrap_or(true) {
            validate_dhcp(self.dhcp, &mut p)
        } else {
            None
        };
        let i = &self.inspector;
        let after_inspection = match i.after_inspection.as_deref().unwrap_or("poweroff") {
            "poweroff" => NextAction::Poweroff,
            "reboot" => NextAction::Reboot,
            "wait" => NextAction::Wait,
            other => {
                p.push(format!(
                    "inspector.after_inspection: {other:?} is not poweroff, reboot or wait"
                ));
                NextAction::Poweroff
            }
        };
        let timeout_secs = i.timeout_secs.unwrap_or(3600);
        if timeout_secs < 10 {
            p.push(format!(
                "inspector.timeout_secs: {timeout_secs} is too short (at least 10)"
            ));
        }
        let clean_up = i.clean_up_period_secs.unwrap_or(10);
        if clean_up == 0 {
            p.push("inspector.clean_up_period_secs: 0 would never time introspections out; use at least 1".into());
        }
        let inspector = InspectorConfig {
            auto_enrol: i.auto_enrol.unwrap_or(true),
            timeout_secs,
            max_body_bytes: i.max_body_bytes.unwrap_or(4 << 20),
            after_inspection,
            public_url: public_url.clone(),
        };
        let fw = &self.firewall;
        let firewall = if fw.enabled.unwrap_or(false) {
            let interface = fw.interface.clone().or(first_dhcp_interface);
            let reconcile = fw.reconcile_secs.unwrap_or(10);
            if !(1..=15).contains(&reconcile) {
                p.push(format!(
                    "firewall.reconcile_secs: {reconcile} is outside 1..=15"
                ));
            }
            match interface {
                Some(interface) => Some(FirewallConfig {
                    interface,
                    discovery: fw.discovery.unwrap_or(inspector.auto_enrol),
                    reconcile: Duration::from_secs(reconcile.clamp(1, 15)),
                }),
                None => {
                    p.push("firewall.interface: name the provisioning interface (there is no DHCP interface to default to)".into());
                    None
                }
            }
        } else {
            None
        };
        let tftp = if self.tftp.enabled.unwrap_or(true) {
            validate_tftp(self.tftp, &mut p)
        } else {
            None
        };
        let im = &self.images;
        let mdb_poll = im.mdb_poll_secs.unwrap_or(2);
        let expire_check = im.expire_check_secs.unwrap_or(60);
        let tl = &self.timeline;
        let defaults = TimelineLimits::default();
        let keep_per_subject = tl.keep_per_subject.unwrap_or(defaults.keep_per_subject);
        let prune_every = tl.prune_every_secs.unwrap_or(60);
        for (k, v) in [
            ("images.mdb_poll_secs", mdb_poll),
            ("images.expire_check_secs", expire_check),
            ("timeline.prune_every_secs", prune_every),
        ] {
            if v == 0 {
                p.push(format!("{k}: must be at least 1"));
            }
        }
        if keep_per_subject == 0 {
            p.push(
                "timeline.keep_per_subject: 0 would empty every timeline; keep at least 1".into(),
            );
        }
        let timeline = TimelineConfig {
            limits: TimelineLimits {
                keep_per_subject: keep_per_subject.max(1),
                keep_last_introspection: tl
                    .keep_last_introspection
                    .unwrap_or(defaults.keep_last_introspection),
            },
            prune_every: Duration::from_secs(prune_every.max(1)),
        };
        let cl = &self.cluster;
        let cluster = match cl.store.as_deref().unwrap_or("sqlite") {
            "sqlite" => {
                if !cl.etcd_endpoints.is_empty() {
                    p.push(
                        "cluster.etcd_endpoints: set cluster.store = \"etcd\" to use them".into(),
                    );
                }
                None
            }
            "etcd" => {
                if cl.etcd_endpoints.is_empty() {
                    p.push("cluster.etcd_endpoints: list the etcd members' client URLs".into());
                }
                for e in &cl.etcd_endpoints {
                    if !e.starts_with("http://") && !e.starts_with("https://") {
                        p.push(format!(
                            "cluster.etcd_endpoints: {e:?} must start with http:// or https://"
                        ));
                    }
                }
                let ttl = cl.lease_ttl_secs.unwrap_or(3);
                if !(2..=60).contains(&ttl) {
                    p.push(format!("cluster.lease_ttl_secs: {ttl} is outside 2..=60"));
                }
                let host = cl.host.clone().unwrap_or_else(|| {
                    std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .map(|h| h.trim().to_string())
                        .unwrap_or_else(|_| "paddock".into())
                });
                Some(ClusterConfig {
                    etcd_endpoints: cl.etcd_endpoints.clone(),
                    host,
                    lease_ttl: Duration::from_secs(ttl.clamp(2, 60)),
                })
            }
            other => {
                p.push(format!(
                    "cluster.store: {other:?} is neither \"sqlite\" nor \"etcd\""
                ));
                None
            }
        };
        for peer in &cl.peers {
            if !peer.starts_with("http://") && !peer.starts_with("https://") {
                p.push(format!(
                    "cluster.peers: {peer:?} must start with http:// or https://"
                ));
            }
        }
        let mut agent_urls = Vec::new();
        if !cl.peers.is_empty() {
            agent_urls.push(public_url.clone());
            for peer in &cl.peers {
                let peer = peer.trim_end_matches('/').to_string();
                if !agent_urls.contains(&peer) {
                    agent_urls.push(peer);
                }
            }
        }
        if !p.is_empty() {
            return Err(ConfigError { problems: p });
        }
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| PathBuf::from("/var/lib/paddock"));
        let images = ImagesConfig {
            dir: im.dir.clone().unwrap_or_else(|| data_dir.join("images")),
            mdb_file: im.mdb_file.clone(),
            mdb_poll: Duration::from_secs(mdb_poll.max(1)),
            record_enrolled: im.record_enrolled.unwrap_or(true),
            expire_check: Duration::from_secs(expire_check.max(1)),
        };
        Ok(Config {
            data_dir,
            log_format,
            http_listen: http_listen.expect("checked above"),
            public_url,
            assets_dir: self.http.assets_dir,
            dhcp,
            tftp,
            boot,
            discovery: Discovery {
                kernel: self.boot.discovery.kernel,
                initrd: self.boot.discovery.initrd,
                cmdline: self.boot.discovery.cmdline.unwrap_or_default(),
                agent_urls,
            },
            inspector,
            clean_up_period: Duration::from_secs(clean_up.max(1)),
            firewall,
            images,
            cluster,
            timeline,
        })
    }
}

fn override_with<T: Clone>(dst: &mut Option<T>, src: &Option<T>) {
    if src.is_some() {
        dst.clone_from(src);
    }
}

fn parse_or<T: std::str::FromStr>(p: &mut Vec<String>, what: &str, s: &str) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    match s.trim().parse() {
        Ok(v) => Some(v),
        Err(e) => {
            p.push(format!("{what}: {s:?}: {e}"));
            None
        }
    }
}

fn validate_dhcp(f: DhcpFile, p: &mut Vec<String>) -> Option<DhcpConfig> {
    let before = p.len();
    if f.interfaces.is_empty() {
        p.push("dhcp.interfaces: name at least one interface to serve on (or set dhcp.enabled = false)".into());
    }
    if f.subnets.is_empty() {
        p.push("dhcp.subnets: configure at least one subnet (network and pools)".into());
    }
    let mut subnets = Vec::new();
    for (i, s) in f.subnets.iter().enumerate() {
        let at = format!("dhcp.subnets[{i}]");
        let Some(network) = parse_or::<Ipv4Net>(p, &format!("{at}.network"), &s.network) else {
            continue;
        };
        let mut pools = Vec::new();
        for (j, range) in s.pools.iter().enumerate() {
            let Some((a, b)) = range.split_once('-') else {
                p.push(format!(
                    "{at}.pools[{j}]: {range:?} is not a range like 198.18.0.100-198.18.0.199"
                ));
                continue;
            };
            let start = parse_or::<Ipv4Addr>(p, &format!("{at}.pools[{j}]"), a);
            let end = parse_or::<Ipv4Addr>(p, &format!("{at}.pools[{j}]"), b);
            if let (Some(start), Some(end)) = (start, end) {
                pools.push(Pool { start, end });
            }
        }
        let ips = |p: &mut Vec<String>, what: &str, v: &[String]| -> Vec<Ipv4Addr> {
            v.iter()
                .enumerate()
                .filter_map(|(k, s)| parse_or(p, &format!("{at}.{what}[{k}]"), s))
                .collect()
        };
        let subnet = Subnet {
            network: network.trunc(),
            pools,
            exclude: ips(p, "exclude", &s.exclude).into_iter().collect(),
            routers: ips(p, "routers", &s.routers),
            dns: ips(p, "dns", &s.dns),
            domain: s.domain.clone(),
            lease_time: s.lease_time.unwrap_or(3600),
        };
        if let Err(e) = subnet.validate() {
            p.push(format!("{at}: {e}"));
        }
        subnets.push(subnet);
    }
    let mut reservations = Vec::new();
    for (i, r) in f.reservations.iter().enumerate() {
        let at = format!("dhcp.reservations[{i}]");
        let mac = parse_or::<MacAddr>(p, &format!("{at}.mac"), &r.mac);
        let ip = parse_or::<Ipv4Addr>(p, &format!("{at}.ip"), &r.ip);
        if let (Some(mac), Some(ip)) = (mac, ip) {
            reservations.push(Reservation {
                mac,
                ip,
                hostname: r.hostname.clone(),
            });
        }
    }
    let deny_macs = f
        .deny_macs
        .iter()
        .enumerate()
        .filter_map(|(i, m)| parse_or(p, &format!("dhcp.deny_macs[{i}]"), m))
        .collect();
    if p.len() == before
        && let Err(e) = paddock_dhcp::Leases::new(subnets.clone(), reservations.clone())
    {
        p.push(format!("dhcp: {e}"));
    }
    Some(DhcpConfig {
        interfaces: f.interfaces,
        port: f.port.unwrap_or(67),
        client_port: f.client_port.unwrap_or(68),
        relay_port: f.relay_port.unwrap_or(67),
        deny_macs,
        subnets,
        reservations,
    })
}

fn validate_tftp(f: TftpFile, p: &mut Vec<String>) -> Option<TftpConfig> {
    let mut roots = f.roots;
    if let Some(r) = f.root {
        roots.insert(0, r);
    }
    if roots.is_empty() {
        p.push("tftp.root: set the directory to serve (or tftp.enabled = false)".into());
    }
    for r in &roots {
        if !r.is_dir() {
            p.push(format!("tftp.root: {} is not a directory", r.display()));
        }
    }
    let listen_src = if f.listen.is_empty() {
        vec!["0.0.0.0:69".to_string()]
    } else {
        f.listen
    };
    let listen = listen_src
        .iter()
        .enumerate()
        .filter_map(|(i, s)| parse_or::<SocketAddr>(p, &format!("tftp.listen[{i}]"), s))
        .collect();
    if let Some(b) = f.block_size_limit
        && !(8..=65464).contains(&b)
    {
        p.push(format!(
            "tftp.block_size_limit: {b} is outside 8..=65464 (RFC 2348)"
        ));
    }
    if f.window_size_limit == Some(0) {
        p.push("tftp.window_size_limit: must be at least 1".into());
    }
    Some(TftpConfig {
        listen,
        server: paddock_tftp::TftpConfig {
            roots,
            max_transfers: f.max_transfers.unwrap_or(4096),
            block_size_limit: f.block_size_limit,
            window_size_limit: f.window_size_limit,
            timeout: Duration::from_secs(f.timeout_secs.unwrap_or(3).max(1)),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
data_dir = "/tmp/paddock"
[http]
listen = "198.18.0.1:8080"
[dhcp]
interfaces = ["br0"]
[[dhcp.subnets]]
network = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.199"]
exclude = ["198.18.0.150"]
routers = ["198.18.0.1"]
[[dhcp.reservations]]
mac = "52:54:00:00:00:01"
ip = "198.18.0.10"
[tftp]
enabled = false
[boot.arch]
7 = "ipxe.efi"
"#;

    #[test]
    fn a_good_file_validates() {
        let c = FileConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(c.public_url, "http://198.18.0.1:8080");
        let d = c.dhcp.unwrap();
        assert_eq!((d.port, d.subnets.len(), d.reservations.len()), (67, 1, 1));
        assert_eq!(c.boot.table[&7], "ipxe.efi");
        assert!(c.tftp.is_none());
    }

    #[test]
    fn overrides_win() {
        let mut f = FileConfig::parse(GOOD).unwrap();
        f.apply(&Overrides {
            dhcp_port: Some(1067),
            public_url: Some("http://198.18.0.9:80/".into()),
            ..Overrides::default()
        });
        let c = f.validate().unwrap();
        assert_eq!(c.dhcp.unwrap().port, 1067);
        assert_eq!(c.public_url, "http://198.18.0.9:80");
    }

    #[test]
    fn every_problem_is_reported_with_its_setting() {
        let bad = r#"
log_format = "xml"
[http]
listen = "nowhere"
[dhcp]
interfaces = []
deny_macs = ["zz"]
[[dhcp.subnets]]
network = "198.18.0.0/24"
pools = ["198.18.0.100", "198.18.0.200-198.18.1.5"]
[boot.arch]
x = "a"
"#;
        let e = FileConfig::parse(bad).unwrap().validate().unwrap_err();
        let text = e.to_string();
        for needle in [
            "log_format",
            "http.listen",
            "dhcp.interfaces",
            "dhcp.deny_macs[0]",
            "dhcp.subnets[0].pools[0]",
            "not inside subnet",
            "boot.arch.x",
            "tftp.root",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn the_timeline_keeps_what_it_is_told() {
        let c = FileConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(c.timeline.limits, TimelineLimits::default());
        assert_eq!(c.timeline.prune_every, Duration::from_secs(60));
        let text = format!(
            "{GOOD}[timeline]\nkeep_per_subject = 20\nkeep_last_introspection = false\nprune_every_secs = 5\n"
        );
        let mut f = FileConfig::parse(&text).unwrap();
        f.apply(&Overrides {
            timeline_keep_per_subject: Some(30),
            ..Overrides::default()
        });
        let c = f.validate().unwrap();
        assert_eq!(
            c.timeline.limits,
            TimelineLimits {
                keep_per_subject: 30,
                keep_last_introspection: false
            }
        );
        assert_eq!(c.timeline.prune_every, Duration::from_secs(5));
        let bad = format!("{GOOD}[timeline]\nkeep_per_subject = 0\nprune_every_secs = 0\n");
        let text = FileConfig::parse(&bad)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        for needle in ["timeline.keep_per_subject", "timeline.prune_every_secs"] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        let e = FileConfig::parse("[timeline]\nkeep = 5\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `keep`"), "{e}");
    }

    #[test]
    fn typos_are_errors_with_a_location() {
        let e = FileConfig::parse("[dhcp]\ninterface = [\"br0\"]\n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unknown field `interface`"), "{text}");
        assert!(text.contains("line 2"), "{text}");
    }
}
