//! From the file to the validated [`Config`]: one function per section, each adding the
//! problems it finds (with the setting they concern) and its defaults from [`defaults`].

use std::collections::BTreeMap;
use std::fmt::Display;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::Ipv4Net;
use paddock_dhcp::BootPolicy;
use paddock_inspector::service::{InspectorConfig, NextAction, TimelineLimits};

use super::file::*;
use super::*;
use crate::setting::{parse, parse_each};

/// Problems found so far, each naming its setting.
type Problems = Vec<String>;

impl FileConfig {
    /// Checks everything and builds the internal configuration; reports every problem found.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let mut p = Problems::new();
        let http_listen: Option<SocketAddr> = parse(
            &mut p,
            "http.listen",
            self.http.listen.as_deref().unwrap_or(defaults::HTTP_LISTEN),
        );
        let public_url = public_url(&self.http, http_listen, &mut p);
        let log_format = log_format(self.log_format.as_deref(), &mut p);
        let mut boot = boot(&self.boot, &public_url, &mut p);
        let first_dhcp_interface = self.dhcp.interfaces.first().cloned();
        let dhcp = if self.dhcp.enabled.unwrap_or(crate::dhcp::ENABLED) {
            crate::dhcp::validate(self.dhcp, &mut p)
        } else {
            None
        };
        let dns_site = crate::dns::Site {
            peers: self
                .cluster
                .peers
                .iter()
                .filter_map(|u| u.parse::<axum::http::Uri>().ok()?.host()?.parse().ok())
                .collect(),
            subnets: dhcp
                .iter()
                .flat_map(|d| d.subnets.iter().map(|s| s.network))
                .collect(),
            reservations: dhcp
                .iter()
                .flat_map(|d| d.reservations.iter().cloned())
                .collect(),
        };
        let dns = crate::dns::validate(&self.dns, http_listen.map(|a| a.ip()), &dns_site, &mut p);
        let dhcp6 = crate::dhcp6::validate(&self.dhcp6, &mut p);
        let (mut inspector, clean_up_period) = inspector(&self.inspector, &public_url, &mut p);
        inspector.agent_bmc_networks = bmc_networks(&self.power.bmc_networks, &mut p);
        let firewall = firewall(
            &self.firewall,
            first_dhcp_interface,
            inspector.auto_enrol,
            &mut p,
        );
        let mut tftp = if self.tftp.enabled.unwrap_or(defaults::TFTP_ENABLED) {
            tftp(self.tftp, &mut p)
        } else {
            None
        };
        let grub_boot = grub_boot(
            &self.boot,
            &mut boot,
            self.http.assets_dir.as_deref(),
            &mut tftp,
            &mut p,
        );
        // Served at /boot/assets/: `serve` would stop at its start without it.
        if let Some(dir) = &self.http.assets_dir
            && !dir.is_dir()
        {
            p.push(format!(
                "http.assets_dir: {} is not a directory",
                dir.display()
            ));
        }
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| PathBuf::from(defaults::DATA_DIR));
        let images = images(&self.images, &data_dir, &mut p);
        let dominator = dominator(&self.dominator, &mut p);
        let timeline = timeline(&self.timeline, &mut p);
        let provisioning = provisioning(&self.provisioning, &mut p);
        let power = power(&self.power, &mut p);
        let cluster = cluster(&self.cluster, &mut p);
        let roles = crate::roles::validate(&self.roles, &data_dir, &mut p);
        let agent_urls = agent_urls(&self.cluster.peers, &public_url, &mut p);
        let security = security(&self.security, http_listen, &data_dir, &agent_urls, &mut p);
        let http_idle_timeout = http_idle_timeout(&self.http, &mut p);
        let http_asset_lanes = self.http.asset_lanes.unwrap_or(defaults::HTTP_ASSET_LANES);
        // More lanes than connections a listener holds would be no lanes at all.
        within("http.asset_lanes", http_asset_lanes, 0..=65_536, &mut p);
        let Some(http_listen) = http_listen else {
            return Err(ConfigError { problems: p });
        };
        if !p.is_empty() {
            return Err(ConfigError { problems: p });
        }
        Ok(Config {
            data_dir,
            log_format,
            http_listen,
            public_url,
            assets_dir: self.http.assets_dir,
            http_max_per_source: self
                .http
                .max_connections_per_source
                .unwrap_or(defaults::HTTP_MAX_CONNECTIONS_PER_SOURCE),
            http_min_body_rate: self
                .http
                .min_body_rate
                .unwrap_or(defaults::HTTP_MIN_BODY_RATE),
            http_shutdown_grace: Duration::from_secs(
                self.http
                    .shutdown_grace_secs
                    .unwrap_or(defaults::HTTP_SHUTDOWN_GRACE_SECS),
            ),
            http_idle_timeout,
            http_asset_lanes,
            dhcp,
            tftp,
            boot,
            discovery: Discovery {
                kernel: self.boot.discovery.kernel,
                initrd: self.boot.discovery.initrd,
                cmdline: self.boot.discovery.cmdline.unwrap_or_default(),
                agent_urls,
            },
            grub_boot,
            inspector,
            clean_up_period,
            firewall,
            images,
            dominator,
            cluster,
            timeline,
            provisioning,
            power,
            roles,
            dns,
            dhcp6,
            security,
        })
    }
}

/// `[security]`: TLS unless `insecure = true`.
fn security(
    f: &SecurityFile,
    http_listen: Option<SocketAddr>,
    data_dir: &std::path::Path,
    agent_urls: &[String],
    p: &mut Problems,
) -> SecurityConfig {
    if f.insecure.unwrap_or(false) {
        return SecurityConfig::Insecure;
    }
    let default_listen = http_listen.map(|a| SocketAddr::new(a.ip(), defaults::SECURITY_PORT));
    let listen = match &f.listen {
        Some(l) => parse(p, "security.listen", l),
        None => default_listen,
    };
    let public_url = match (&f.public_url, listen) {
        (Some(u), _) if u.starts_with("https://") => u.trim_end_matches('/').to_string(),
        (Some(u), _) => {
            p.push(format!(
                "security.public_url: {u:?} must start with https://"
            ));
            String::new()
        }
        (None, Some(a)) if !a.ip().is_unspecified() => format!("https://{a}"),
        (None, _) => {
            // Unset, `security.listen` is made from `http.listen`: say so, or the operator
            // looks for a setting they never wrote.
            let listen = if f.listen.is_some() {
                "security.listen"
            } else {
                "security.listen (unset: made from http.listen)"
            };
            p.push(format!("security.public_url: required when {listen} is a wildcard address, e.g. https://198.18.0.1:8443"));
            String::new()
        }
    };
    let port = listen.map_or(defaults::SECURITY_PORT, |a| a.port());
    let mut urls = vec![public_url.clone()];
    for u in agent_urls {
        if let Some(t) = tls_peer_url(u, port)
            && !urls.contains(&t)
        {
            urls.push(t);
        }
    }
    let agent_token_ttl = f
        .agent_token_ttl_secs
        .unwrap_or(defaults::SECURITY_AGENT_TOKEN_TTL_SECS);
    if agent_token_ttl < 60 {
        p.push("security.agent_token_ttl_secs: at least 60".into());
    }
    let max_connections = f
        .max_connections
        .unwrap_or(defaults::SECURITY_MAX_CONNECTIONS);
    if max_connections == 0 {
        p.push("security.max_connections: at least 1".into());
    }
    let header_timeout = f
        .header_timeout_secs
        .unwrap_or(defaults::SECURITY_HEADER_TIMEOUT_SECS);
    if header_timeout == 0 {
        p.push("security.header_timeout_secs: at least 1".into());
    }
    SecurityConfig::Tls(TlsConfig {
        dir: f
            .dir
            .clone()
            .unwrap_or_else(|| data_dir.join(defaults::SECURITY_SUBDIR)),
        listen: listen.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], port))),
        public_url,
        agent_urls: urls,
        inspector_noauth: f
            .inspector_noauth
            .unwrap_or(defaults::SECURITY_INSPECTOR_NOAUTH),
        agent_token_ttl: Duration::from_secs(agent_token_ttl),
        max_connections,
        header_timeout: Duration::from_secs(header_timeout),
    })
}

/// A peer's HTTP URL → its HTTPS URL on `port` (every host listens on the same port).
fn tls_peer_url(u: &str, port: u16) -> Option<String> {
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))?;
    let hostport = rest.split('/').next()?;
    let host = match hostport.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => hostport,
    };
    Some(format!("https://{host}:{port}"))
}

/// `http.public_url`, or one made from `http.listen` when that names an address.
fn public_url(f: &HttpFile, listen: Option<SocketAddr>, p: &mut Problems) -> String {
    match &f.public_url {
        Some(u) if u.starts_with("http://") || u.starts_with("https://") => {
            u.trim_end_matches('/').to_string()
        }
        Some(u) => {
            p.push(format!(
                "http.public_url: {u:?} must start with http:// or https://"
            ));
            String::new()
        }
        None => match listen {
            Some(a) if !a.ip().is_unspecified() => format!("http://{a}"),
            _ => {
                p.push("http.public_url: required when http.listen is a wildcard address; set the URL machines use to reach this host, e.g. http://198.18.0.1:8080".into());
                String::new()
            }
        },
    }
}

fn log_format(f: Option<&str>, p: &mut Problems) -> LogFormat {
    match f.unwrap_or(defaults::LOG_FORMAT) {
        "human" => LogFormat::Human,
        "json" => LogFormat::Json,
        other => {
            p.push(format!(
                "log_format: {other:?} is neither \"human\" nor \"json\""
            ));
            LogFormat::Human
        }
    }
}

/// `[boot]`: the option 93 table's overrides and the TFTP server named in answers.
fn boot(f: &BootFile, public_url: &str, p: &mut Problems) -> BootPolicy {
    let mut overrides = BTreeMap::new();
    for (k, v) in &f.arch {
        match k.parse::<u16>() {
            Ok(a) if !v.is_empty() => {
                overrides.insert(a, v.clone());
            }
            Ok(_) => p.push(format!("boot.arch.{k}: the boot file name is empty")),
            Err(_) => p.push(format!("boot.arch.{k}: keys are option 93 numbers (0 BIOS, 7 x64 UEFI, 11 arm64 UEFI, 16 x64 HTTP …)")),
        }
    }
    let mut boot = BootPolicy::new(public_url, &overrides);
    boot.tftp_server = f
        .tftp_server
        .as_deref()
        .and_then(|s| parse(p, "boot.tftp_server", s));
    boot
}

/// `[boot.secure_boot]` and `[boot.arm64]`: the machines GRUB boots over TFTP. GRUB fetches
/// the kernel and initrd over TFTP (Debian's signed GRUB has no HTTP), so they must be
/// assets, and the assets directory becomes the TFTP server's last root.
fn grub_boot(
    f: &BootFile,
    boot: &mut BootPolicy,
    assets_dir: Option<&std::path::Path>,
    tftp: &mut Option<TftpConfig>,
    p: &mut Problems,
) -> Option<crate::boot::GrubBoot> {
    let mut grub = crate::boot::GrubBoot::default();
    secure_boot(f, boot, &mut grub, p);
    arm64(f, boot, &mut grub, assets_dir, p);
    if grub.loaders.is_empty() {
        return None;
    }
    let section = if f.secure_boot.enabled == Some(true) {
        "boot.secure_boot"
    } else {
        "boot.arm64"
    };
    match (tftp.as_mut(), assets_dir) {
        (Some(t), Some(dir)) => t.server.roots.push(dir.to_path_buf()),
        (None, _) => p.push(format!(
            "{section}: GRUB and its kernel are served over TFTP; enable [tftp]"
        )),
        (_, None) => p.push(format!(
            "{section}: set http.assets_dir, where the kernel and initrd are"
        )),
    }
    Some(grub)
}

/// A boot file that must exist when the appliance starts (it is served from memory).
fn boot_file(
    key: &str,
    given: &Option<PathBuf>,
    default: PathBuf,
    how: &str,
    p: &mut Problems,
) -> PathBuf {
    let path = given.clone().unwrap_or(default);
    if !path.is_file() {
        p.push(format!("{key}: {} is not a file ({how})", path.display()));
    }
    path
}

/// `[boot.secure_boot]`: which x64 machines boot the signed chain, and its files.
fn secure_boot(
    f: &BootFile,
    boot: &mut BootPolicy,
    grub: &mut crate::boot::GrubBoot,
    p: &mut Problems,
) {
    let sb = &f.secure_boot;
    if !sb.enabled.unwrap_or(false) {
        return;
    }
    boot.signed = if sb.networks.is_empty() {
        paddock_dhcp::Signed::Everywhere
    } else {
        paddock_dhcp::Signed::In(
            parse_each::<Ipv4Net>(p, "boot.secure_boot.networks", &sb.networks)
                .into_iter()
                .collect(),
        )
    };
    let shim = boot_file(
        "boot.secure_boot.shim",
        &sb.shim,
        PathBuf::from(defaults::SECURE_BOOT_SHIM),
        "apt-get install shim-signed, or set the path",
        p,
    );
    let grubx64 = boot_file(
        "boot.secure_boot.grub",
        &sb.grub,
        PathBuf::from(defaults::SECURE_BOOT_GRUB),
        "apt-get install grub-efi-amd64-signed, or set the path",
        p,
    );
    grub.loaders.push(("shimx64.efi".into(), shim));
    grub.loaders.push(("grubx64.efi".into(), grubx64));
    let asset = |key: &str, url: &Option<String>, p: &mut Problems| {
        let name = url
            .as_deref()
            .and_then(|u| u.strip_prefix(&boot.asset_url("")))
            .filter(|n| !n.is_empty());
        if name.is_none() {
            p.push(format!(
                "boot.secure_boot: boot.discovery.{key} must be an asset ({}NAME): GRUB fetches it over TFTP",
                boot.asset_url("")
            ));
        }
        name.unwrap_or_default().to_string()
    };
    grub.x86_64 = Some(crate::boot::GrubKernel {
        kernel: asset("kernel", &f.discovery.kernel, p),
        initrd: asset("initrd", &f.discovery.initrd, p),
        cmdline: String::new(),
    });
}

/// `[boot.arm64]`: arm64 UEFI machines (client architecture 11) boot Debian's signed network
/// GRUB, then the arm64 kernel and initrd, all files that `scripts/build-ramdisk.sh --arch
/// aarch64` puts under `aarch64/` in the assets directory.
fn arm64(
    f: &BootFile,
    boot: &mut BootPolicy,
    grub: &mut crate::boot::GrubBoot,
    assets_dir: Option<&std::path::Path>,
    p: &mut Problems,
) {
    let a = &f.arm64;
    if !a.enabled.unwrap_or(false) {
        return;
    }
    let loader = boot_file(
        "boot.arm64.grub",
        &a.grub,
        assets_dir
            .unwrap_or(std::path::Path::new("."))
            .join(defaults::ARM64_GRUB),
        "scripts/build-ramdisk.sh --arch aarch64 builds it into the assets directory, or set the path",
        p,
    );
    let name = |key: &str, given: &Option<String>, default: &str, p: &mut Problems| {
        let n = given.as_deref().unwrap_or(default);
        if n.is_empty() || n.starts_with('/') || n.split('/').any(|c| c == "..") {
            p.push(format!(
                "boot.arm64.{key}: {n:?} is not a name under http.assets_dir"
            ));
        }
        n.to_string()
    };
    grub.arm64 = Some(crate::boot::GrubKernel {
        kernel: name("kernel", &a.kernel, defaults::ARM64_KERNEL, p),
        initrd: name("initrd", &a.initrd, defaults::ARM64_INITRD, p),
        cmdline: a
            .cmdline
            .clone()
            .unwrap_or_else(|| defaults::ARM64_CMDLINE.into()),
    });
    grub.loaders.push((ARM64_LOADER.into(), loader));
    // The operator's own table entry for arm64 UEFI wins.
    if !f.arch.contains_key("11") {
        boot.table.insert(11, ARM64_LOADER.into());
    }
}

/// The TFTP name arm64 machines are given (and the name GRUB is served under).
const ARM64_LOADER: &str = "grubaa64.efi";

/// `[inspector]`, with the inspector's own defaults; and the clean-up period.
fn inspector(f: &InspectorFile, public_url: &str, p: &mut Problems) -> (InspectorConfig, Duration) {
    let d = InspectorConfig::default();
    let after_inspection = match f.after_inspection.as_deref() {
        None => d.after_inspection,
        Some("poweroff") => NextAction::Poweroff,
        Some("reboot") => NextAction::Reboot,
        Some("wait") => NextAction::Wait,
        Some(other) => {
            p.push(format!(
                "inspector.after_inspection: {other:?} is not poweroff, reboot or wait"
            ));
            d.after_inspection
        }
    };
    let timeout_secs = f.timeout_secs.unwrap_or(d.timeout_secs);
    if timeout_secs < 10 {
        p.push(format!(
            "inspector.timeout_secs: {timeout_secs} is too short (at least 10)"
        ));
    }
    let clean_up = f
        .clean_up_period_secs
        .unwrap_or(defaults::INSPECTOR_CLEAN_UP_PERIOD_SECS);
    if clean_up == 0 {
        p.push(
            "inspector.clean_up_period_secs: 0 would never time introspections out; use at least 1"
                .into(),
        );
    }
    let config = InspectorConfig {
        auto_enrol: f.auto_enrol.unwrap_or(d.auto_enrol),
        timeout_secs,
        max_body_bytes: f.max_body_bytes.unwrap_or(d.max_body_bytes),
        after_inspection,
        public_url: public_url.to_string(),
        agent_bmc_networks: Vec::new(),
    };
    (config, Duration::from_secs(clean_up.max(1)))
}

/// `[firewall]` (when enabled): the interface defaults to the first DHCP interface, the
/// discovery policy to auto-enrolment.
fn firewall(
    f: &FirewallFile,
    first_dhcp_interface: Option<String>,
    auto_enrol: bool,
    p: &mut Problems,
) -> Option<FirewallConfig> {
    if !f.enabled.unwrap_or(defaults::FIREWALL_ENABLED) {
        return None;
    }
    let interface = f.interface.clone().or(first_dhcp_interface);
    let reconcile = f
        .reconcile_secs
        .unwrap_or(defaults::FIREWALL_RECONCILE_SECS);
    within("firewall.reconcile_secs", reconcile, 1..=15, p);
    match interface {
        Some(interface) => Some(FirewallConfig {
            interface,
            discovery: f.discovery.unwrap_or(auto_enrol),
            reconcile: Duration::from_secs(reconcile.clamp(1, 15)),
        }),
        None => {
            p.push("firewall.interface: name the provisioning interface (there is no DHCP interface to default to)".into());
            None
        }
    }
}

/// A setting that must lie in `range`.
fn within<T>(what: &str, value: T, range: RangeInclusive<T>, p: &mut Problems)
where
    T: PartialOrd + Display,
{
    if !range.contains(&value) {
        let (lo, hi) = range.into_inner();
        p.push(format!("{what}: {value} is outside {lo}..={hi}"));
    }
}

/// A share that must be above 0 and at most `max`.
fn share(what: &str, value: f64, max: f64, p: &mut Problems) {
    if !(value > 0.0 && value <= max) {
        p.push(format!("{what}: {value} is not above 0 and at most {max}"));
    }
}

/// `[http] idle_timeout_secs`: at least 1.
fn http_idle_timeout(f: &HttpFile, p: &mut Problems) -> Duration {
    let secs = f
        .idle_timeout_secs
        .unwrap_or(defaults::HTTP_IDLE_TIMEOUT_SECS);
    period("http.idle_timeout_secs", secs, p)
}

/// `value`, or `default` when not given, checked against `range`.
fn given_within(
    what: &str,
    value: Option<u64>,
    default: u64,
    range: RangeInclusive<u64>,
    p: &mut Problems,
) -> u64 {
    let v = value.unwrap_or(default);
    within(what, v, range, p);
    v
}

/// A period in seconds that must be at least 1.
fn period(what: &str, secs: u64, p: &mut Problems) -> Duration {
    if secs == 0 {
        p.push(format!("{what}: must be at least 1"));
    }
    Duration::from_secs(secs.max(1))
}

/// `[dominator]`.
fn dominator(f: &DominatorFile, p: &mut Problems) -> Option<DominatorConfig> {
    if !f.enabled.unwrap_or(defaults::DOMINATOR_ENABLED) {
        return None;
    }
    let max_updates = f.max_updates.unwrap_or(defaults::DOMINATOR_MAX_UPDATES);
    if max_updates == 0 {
        p.push("dominator.max_updates: must be at least 1".into());
    }
    let max_polls = f.max_polls.unwrap_or(defaults::DOMINATOR_MAX_POLLS);
    if max_polls == 0 {
        p.push("dominator.max_polls: must be at least 1".into());
    }
    let interval = given_within(
        "dominator.poll_interval_ms",
        f.poll_interval_ms,
        defaults::DOMINATOR_POLL_INTERVAL_MS,
        10..=3_600_000,
        p,
    );
    let speed = f
        .fetch_speed_percent
        .unwrap_or(defaults::DOMINATOR_FETCH_SPEED_PERCENT);
    share("dominator.fetch_speed_percent", speed, 100.0, p);
    let high_impact_share = f
        .high_impact_share
        .unwrap_or(defaults::DOMINATOR_HIGH_IMPACT_SHARE);
    share("dominator.high_impact_share", high_impact_share, 1.0, p);
    if let Some(c) = &f.disruption_check
        && !c.is_absolute()
    {
        p.push(format!(
            "dominator.disruption_check: {} must be an absolute path",
            c.display()
        ));
    }
    let retry = given_within(
        "dominator.disruption_retry_secs",
        f.disruption_retry_secs,
        defaults::DOMINATOR_DISRUPTION_RETRY_SECS,
        1..=86_400,
        p,
    );
    let timeout = given_within(
        "dominator.disruption_timeout_secs",
        f.disruption_timeout_secs,
        defaults::DOMINATOR_DISRUPTION_TIMEOUT_SECS,
        1..=3_600,
        p,
    );
    Some(DominatorConfig {
        subd_port: f.subd_port.unwrap_or(defaults::DOMINATOR_SUBD_PORT),
        max_updates,
        max_polls,
        poll_interval: Duration::from_millis(interval),
        fetch_speed_percent: speed,
        high_impact_share,
        disruption_check: f.disruption_check.clone(),
        disruption_retry: Duration::from_secs(retry),
        disruption_timeout: Duration::from_secs(timeout),
    })
}

/// `[images]`.
fn images(f: &ImagesFile, data_dir: &std::path::Path, p: &mut Problems) -> ImagesConfig {
    let mdb_poll = period(
        "images.mdb_poll_secs",
        f.mdb_poll_secs.unwrap_or(defaults::IMAGES_MDB_POLL_SECS),
        p,
    );
    let expire_check = period(
        "images.expire_check_secs",
        f.expire_check_secs
            .unwrap_or(defaults::IMAGES_EXPIRE_CHECK_SECS),
        p,
    );
    ImagesConfig {
        dir: f
            .dir
            .clone()
            .unwrap_or_else(|| data_dir.join(defaults::IMAGES_SUBDIR)),
        mdb_file: f.mdb_file.clone(),
        mdb_poll,
        record_enrolled: f
            .record_enrolled
            .unwrap_or(defaults::IMAGES_RECORD_ENROLLED),
        expire_check,
    }
}

/// `[timeline]`, with the inspector's default limits.
fn timeline(f: &TimelineFile, p: &mut Problems) -> TimelineConfig {
    let d = TimelineLimits::default();
    let keep_per_subject = f.keep_per_subject.unwrap_or(d.keep_per_subject);
    let prune_every = period(
        "timeline.prune_every_secs",
        f.prune_every_secs
            .unwrap_or(defaults::TIMELINE_PRUNE_EVERY_SECS),
        p,
    );
    if keep_per_subject == 0 {
        p.push("timeline.keep_per_subject: 0 would empty every timeline; keep at least 1".into());
    }
    TimelineConfig {
        limits: TimelineLimits {
            keep_per_subject: keep_per_subject.max(1),
            keep_last_introspection: f
                .keep_last_introspection
                .unwrap_or(d.keep_last_introspection),
        },
        prune_every,
    }
}

/// `[provisioning]`: the run timeouts, each from 1 s to 30 days.
fn provisioning(f: &ProvisioningFile, p: &mut Problems) -> ProvisioningConfig {
    const MAX_SECS: u64 = 30 * 24 * 60 * 60;
    let mut ms = |what: &str, secs: Option<u64>, default: u64| {
        let secs = secs.unwrap_or(default);
        if secs > MAX_SECS {
            p.push(format!("provisioning.{what}: {secs} is more than 30 days"));
        }
        period(&format!("provisioning.{what}"), secs.min(MAX_SECS), p).as_millis() as u64
    };
    let step_ms = ms(
        "step_timeout_secs",
        f.step_timeout_secs,
        defaults::PROVISIONING_STEP_TIMEOUT_SECS,
    );
    let sync_ms = ms(
        "sync_timeout_secs",
        f.sync_timeout_secs,
        defaults::PROVISIONING_SYNC_TIMEOUT_SECS,
    );
    ProvisioningConfig {
        timeouts: paddock_birther::Timeouts { step_ms, sync_ms },
    }
}

/// `[power]`: at least one power-on per window of 1 s to 1 h; a sync every 1 s to 1 day.
fn power(f: &PowerFile, p: &mut Problems) -> crate::power::PowerConfig {
    let max_power_ons = f.max_power_ons.unwrap_or(defaults::POWER_MAX_POWER_ONS);
    if max_power_ons == 0 {
        p.push("power.max_power_ons: must be at least 1".into());
    }
    let mut secs = |what: &str, v: Option<u64>, default: u64, max: u64| {
        let v = v.unwrap_or(default);
        if v > max {
            p.push(format!("power.{what}: {v} is more than {max}"));
        }
        period(&format!("power.{what}"), v.min(max), p)
    };
    let interval = secs(
        "interval_secs",
        f.interval_secs,
        defaults::POWER_INTERVAL_SECS,
        3600,
    );
    let sync_every = secs("sync_secs", f.sync_secs, defaults::POWER_SYNC_SECS, 86_400);
    crate::power::PowerConfig {
        max_power_ons: max_power_ons.max(1),
        interval,
        sync_every,
        ..crate::power::PowerConfig::default()
    }
}

/// `[power] bmc_networks`: CIDRs.
fn bmc_networks(list: &[String], p: &mut Problems) -> Vec<ipnet::IpNet> {
    list.iter()
        .filter_map(|n| match n.parse::<ipnet::IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                p.push(format!(
                    "power.bmc_networks: {n:?} is not a network (like \"198.18.9.0/24\")"
                ));
                None
            }
        })
        .collect()
}

fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://")
}

/// `[cluster]`: `None` for one host on SQLite, else the etcd cluster and this host's name.
fn cluster(f: &ClusterFile, p: &mut Problems) -> Option<ClusterConfig> {
    match f.store.as_deref().unwrap_or(defaults::CLUSTER_STORE) {
        "sqlite" => {
            if !f.etcd_endpoints.is_empty() {
                p.push("cluster.etcd_endpoints: set cluster.store = \"etcd\" to use them".into());
            }
            None
        }
        "etcd" => {
            if f.etcd_endpoints.is_empty() {
                p.push("cluster.etcd_endpoints: list the etcd members' client URLs".into());
            }
            for e in f.etcd_endpoints.iter().filter(|e| !is_url(e)) {
                p.push(format!(
                    "cluster.etcd_endpoints: {e:?} must start with http:// or https://"
                ));
            }
            let ttl = f.lease_ttl_secs.unwrap_or(defaults::CLUSTER_LEASE_TTL_SECS);
            within("cluster.lease_ttl_secs", ttl, 2..=60, p);
            let host = f.host.clone().unwrap_or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| defaults::CLUSTER_HOST.into())
            });
            let etcd_tls = match (&f.etcd_ca_file, &f.etcd_cert_file, &f.etcd_key_file) {
                (Some(c), Some(r), Some(k)) => Some((c.clone(), r.clone(), k.clone())),
                (None, None, None) => None,
                _ => {
                    p.push("cluster.etcd_ca_file, etcd_cert_file, etcd_key_file: give all three (TLS to etcd) or none".into());
                    None
                }
            };
            Some(ClusterConfig {
                etcd_tls,
                etcd_endpoints: f.etcd_endpoints.clone(),
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
    }
}

/// `cluster.peers`: the agent's `paddock.url` list, this host first (empty: this host alone).
fn agent_urls(peers: &[String], public_url: &str, p: &mut Problems) -> Vec<String> {
    for peer in peers.iter().filter(|peer| !is_url(peer)) {
        p.push(format!(
            "cluster.peers: {peer:?} must start with http:// or https://"
        ));
    }
    let mut urls = Vec::new();
    if !peers.is_empty() {
        urls.push(public_url.to_string());
        for peer in peers {
            let peer = peer.trim_end_matches('/').to_string();
            if !urls.contains(&peer) {
                urls.push(peer);
            }
        }
    }
    urls
}

/// `[tftp]` (when enabled).
fn tftp(f: TftpFile, p: &mut Problems) -> Option<TftpConfig> {
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
        vec![defaults::TFTP_LISTEN.to_string()]
    } else {
        f.listen
    };
    let listen = parse_each::<SocketAddr>(p, "tftp.listen", &listen_src);
    if let Some(b) = f.block_size_limit {
        // RFC 2348's bounds.
        within("tftp.block_size_limit", b, 8..=65464, p);
    }
    if f.window_size_limit == Some(0) {
        p.push("tftp.window_size_limit: must be at least 1".into());
    }
    Some(TftpConfig {
        listen,
        server: paddock_tftp::TftpConfig {
            roots,
            max_transfers: f.max_transfers.unwrap_or(defaults::TFTP_MAX_TRANSFERS),
            block_size_limit: f.block_size_limit,
            window_size_limit: f.window_size_limit,
            timeout: Duration::from_secs(
                f.timeout_secs.unwrap_or(defaults::TFTP_TIMEOUT_SECS).max(1),
            ),
        },
    })
}
