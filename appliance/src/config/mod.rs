//! Configuration in two layers: the TOML file operators write ([`file`]) with flag and
//! environment [`overrides`], and the validated [`Config`] that everything after start-up
//! uses ([`validate`], one function per section). Every default is in [`defaults`], but for
//! the sections a domain defines and checks itself (`dhcp`, `dhcp6`, `dns`, `roles`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use paddock_dhcp::BootPolicy;

pub mod defaults;
pub mod file;
pub mod overrides;
mod validate;

pub use file::*;
pub use overrides::Overrides;

// Each section is defined by the domain that reads it; this module assembles them.
pub use crate::boot::{Discovery, TftpConfig};
pub use crate::cluster::ClusterConfig;
pub use crate::dhcp::DhcpConfig;
pub use crate::dominator::DominatorConfig;
pub use crate::images::ImagesConfig;
pub use crate::inspection::TimelineConfig;
pub use crate::provisioning::ProvisioningConfig;
pub use crate::pxe_filter::FirewallConfig;
pub use crate::security::{Reach, SecurityConfig, TlsConfig};

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
    /// `[http] max_connections_per_source` (0: no cap).
    pub http_max_per_source: usize,
    /// `[http] min_body_rate`, bytes per second (0: no minimum).
    pub http_min_body_rate: u64,
    /// `[http] shutdown_grace_secs`: how long SIGTERM waits for requests in flight.
    pub http_shutdown_grace: Duration,
    /// `[http] idle_timeout_secs`: how long a kept-alive connection waits for a request.
    pub http_idle_timeout: Duration,
    /// `[http] asset_lanes`: large boot assets sent at once (0: all).
    pub http_asset_lanes: usize,
    pub dhcp: Option<DhcpConfig>,
    pub tftp: Option<TftpConfig>,
    pub boot: BootPolicy,
    pub discovery: Discovery,
    /// `[boot.secure_boot]` and `[boot.arm64]` (`None`: both off): the machines GRUB boots
    /// over TFTP, its loaders and each CPU's kernel.
    pub grub_boot: Option<crate::boot::GrubBoot>,
    pub inspector: paddock_inspector::service::InspectorConfig,
    pub clean_up_period: Duration,
    pub firewall: Option<FirewallConfig>,
    pub images: ImagesConfig,
    /// `None`: the dominator is off.
    pub dominator: Option<DominatorConfig>,
    pub cluster: Option<ClusterConfig>,
    pub timeline: TimelineConfig,
    pub provisioning: ProvisioningConfig,
    /// `[power]`: the power-on throttle and the power-state sync.
    pub power: crate::power::PowerConfig,
    /// `None`: no hooks directory, the role loop is off.
    pub roles: Option<crate::roles::RolesConfig>,
    /// `None`: no DNS server.
    pub dns: Option<crate::dns::DnsConfig>,
    /// `None`: no DHCPv6 server.
    pub dhcp6: Option<crate::dhcp6::Dhcp6Config>,
    /// `[security]`.
    pub security: SecurityConfig,
}

impl Config {
    /// What one client may hold of either listener.
    pub fn listener_limits(&self) -> paddock_security::limits::Limits {
        let mut l = paddock_security::limits::Limits {
            max_per_source: self.http_max_per_source,
            min_body_rate: self.http_min_body_rate,
            idle_timeout: self.http_idle_timeout,
            ..Default::default()
        };
        if let SecurityConfig::Tls(t) = &self.security {
            l.max_connections = t.max_connections;
            l.handshake_timeout = t.header_timeout;
            l.header_read_timeout = t.header_timeout;
        }
        l
    }

    /// What the security domain reads beyond its own section: where this host is reached.
    pub fn reach(&self) -> Reach {
        Reach {
            security: self.security.clone(),
            http_listen: self.http_listen,
            public_url: self.public_url.clone(),
            agent_urls: self.discovery.agent_urls.clone(),
            host: self.cluster.as_ref().map(|c| c.host.clone()),
        }
    }

    /// This host's certificate directory: `[security] dir`, or its default under data_dir
    /// when the appliance runs insecure.
    pub fn certs_dir(&self) -> PathBuf {
        match &self.security {
            SecurityConfig::Tls(t) => t.dir.clone(),
            SecurityConfig::Insecure => self.data_dir.join(defaults::SECURITY_SUBDIR),
        }
    }

    /// What `paddock backup` (and the backup before a migration) reads on this host.
    pub fn backup_sources(
        &self,
        store: crate::backup::StoreSource,
        config_file: Option<PathBuf>,
        with_objects: bool,
    ) -> crate::backup::Sources {
        crate::backup::Sources {
            store,
            certs_dir: Some(self.certs_dir()),
            objects_dir: Some(self.images.dir.clone()),
            with_objects,
            config_file,
        }
    }

    /// The base URL the agent, subs and hooks call: HTTPS when TLS is on.
    pub fn api_url(&self) -> &str {
        match &self.security {
            SecurityConfig::Tls(t) => &t.public_url,
            SecurityConfig::Insecure => &self.public_url,
        }
    }
}

/// All problems found in a configuration, each with the setting it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.join("\n"))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// What `paddock config check` prints of a valid configuration: one line a subsystem.
pub fn summary(c: &Config) -> String {
    let mut out = format!(
        "  data_dir   {}\n  http       {} (public {})\n",
        c.data_dir.display(),
        c.http_listen,
        c.public_url
    );
    out += &match &c.security {
        SecurityConfig::Tls(t) => format!(
            "  https      {} (public {}), certificates in {}\n",
            t.listen,
            t.public_url,
            t.dir.display()
        ),
        SecurityConfig::Insecure => {
            "  security   INSECURE: plain HTTP, every method open to anyone\n".to_string()
        }
    };
    let dhcp = c.dhcp.as_ref().map(|d| {
        let counts = (d.subnets.len(), d.reservations.len());
        (&d.interfaces, d.port, counts, &d.relays)
    });
    let dhcp6 = c.dhcp6.as_ref().map(|d| {
        let counts = (d.subnets.len(), d.reservations.len());
        (&d.interfaces, d.port, counts, &d.relays)
    });
    for (name, served) in [("dhcp", dhcp), ("dhcp6", dhcp6)] {
        out += &match served {
            Some((interfaces, port, (subnets, reservations), relays)) => format!(
                "  {name:<10} on {} port {port}: {subnets} subnet(s), {reservations} \
                 reservation(s), relayed requests from {relays}\n",
                interfaces.join(","),
            ),
            None => format!("  {name:<10} off\n"),
        };
    }
    out += &match &c.tftp {
        Some(t) => {
            let listen: Vec<String> = t.listen.iter().map(|a| a.to_string()).collect();
            let roots: Vec<String> = t
                .server
                .roots
                .iter()
                .map(|r| r.display().to_string())
                .collect();
            format!(
                "  tftp       {} serving {}\n",
                listen.join(","),
                roots.join(":")
            )
        }
        None => "  tftp       off\n".to_string(),
    };
    // Valid, but a machine nobody knows yet would be told to retry every 30 s: say so where
    // the operator looks before starting.
    out += &match (&c.discovery.kernel, &c.discovery.initrd) {
        (Some(k), Some(i)) => format!("  discovery  {k} + {i}\n"),
        _ if c.dhcp.is_some() || c.dhcp6.is_some() => "  discovery  none: machines not yet \
             known are told to retry until [boot.discovery] kernel and initrd are set\n"
            .to_string(),
        _ => "  discovery  none\n".to_string(),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_inspector::service::TimelineLimits;

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
        assert!(summary(&c).contains("relayed requests from any source"));
        assert!(summary(&c).contains("  dhcp6      off\n"));
        assert!(
            summary(&c).contains("  discovery  none: machines not yet known are told to retry"),
            "{}",
            summary(&c)
        );
        let d = c.dhcp.unwrap();
        assert_eq!((d.port, d.subnets.len(), d.reservations.len()), (67, 1, 1));
        assert_eq!(
            d.relays,
            paddock_dhcp::Relays::Any,
            "relays from anyone unless listed"
        );
        assert_eq!(c.boot.table[&7], "ipxe.efi");
        assert!(c.tftp.is_none());
        let listed = GOOD.replace("[dhcp]\n", "[dhcp]\nrelays = [\"198.18.1.2\"]\n");
        let c = FileConfig::parse(&listed).unwrap().validate().unwrap();
        assert!(summary(&c).contains("relayed requests from 1 listed relay(s)"));
        let six = format!(
            "{GOOD}[dhcp6]\nenabled = true\ninterfaces = [\"br0\"]\nrelays = []\n\
             [[dhcp6.subnets]]\nnetwork = \"2001:2::/64\"\npools = [\"2001:2::100-2001:2::1ff\"]\n"
        );
        let text = summary(&FileConfig::parse(&six).unwrap().validate().unwrap());
        assert!(
            text.contains(
                "  dhcp6      on br0 port 547: 1 subnet(s), 0 reservation(s), relayed requests \
                 from 0 listed relay(s)\n"
            ),
            "{text}"
        );
        let d = c.dhcp.unwrap();
        assert!(d.relays.admits("198.18.1.2".parse().unwrap()));
        assert!(!d.relays.admits("198.18.1.3".parse().unwrap()));
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
relays = ["198.18.1.2", "2001:2::1"]
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
            "dhcp.relays[1]",
            "dhcp.subnets[0].pools[0]",
            "not inside subnet",
            "boot.arch.x",
            "tftp.root",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    /// What validation says of a configuration that must be refused.
    fn problems(text: &str) -> String {
        FileConfig::parse(text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    }

    /// An appliance whose assets directory is `assets` (also the TFTP root), with `boot`.
    fn grub_boot_config(assets: &std::path::Path, boot: &str) -> String {
        format!(
            r#"
[http]
listen = "198.18.0.1:8080"
assets_dir = "{assets}"
[dhcp]
enabled = false
[tftp]
root = "{assets}"
{boot}"#,
            assets = assets.display(),
        )
    }

    /// `[boot.secure_boot]`: the networks that boot the signed chain, its files, and the
    /// kernel and initrd as TFTP names under the assets directory (the TFTP server's last
    /// root); each missing piece is named.
    #[test]
    fn secure_boot_serves_the_signed_chain_over_tftp() {
        let dir = tempfile::tempdir().unwrap();
        let (shim, grub) = (dir.path().join("shim"), dir.path().join("grub"));
        std::fs::write(&shim, b"s").unwrap();
        std::fs::write(&grub, b"g").unwrap();
        let good = grub_boot_config(
            dir.path(),
            &format!(
                r#"[boot.discovery]
kernel = "http://198.18.0.1:8080/boot/assets/k/vmlinuz"
initrd = "http://198.18.0.1:8080/boot/assets/initrd.img"
[boot.secure_boot]
enabled = true
networks = ["198.18.0.16/28"]
shim = "{shim}"
grub = "{grub}"
"#,
                shim = shim.display(),
                grub = grub.display(),
            ),
        );
        let c = FileConfig::parse(&good).unwrap().validate().unwrap();
        let g = c.grub_boot.unwrap();
        let x86 = g.x86_64.unwrap();
        assert_eq!(
            (x86.kernel.as_str(), x86.initrd.as_str()),
            ("k/vmlinuz", "initrd.img")
        );
        assert_eq!(
            g.loaders,
            [
                ("shimx64.efi".to_string(), shim.clone()),
                ("grubx64.efi".to_string(), grub.clone())
            ]
        );
        assert!(g.arm64.is_none());
        assert!(c.boot.signs("198.18.0.20".parse().unwrap()));
        assert!(!c.boot.signs("198.18.0.40".parse().unwrap()));
        let roots = &c.tftp.unwrap().server.roots;
        assert_eq!(roots.last(), Some(&dir.path().to_path_buf()));
        assert_eq!(roots.len(), 2);
        // Off by default.
        let off = good.replace("enabled = true", "");
        let c = FileConfig::parse(&off).unwrap().validate().unwrap();
        assert!(c.grub_boot.is_none());
        assert!(!c.boot.signs("198.18.0.20".parse().unwrap()));
        let bad = good
            .replace(&shim.display().to_string(), "/nowhere/shim")
            .replace(
                "http://198.18.0.1:8080/boot/assets/k/vmlinuz",
                "http://elsewhere/vmlinuz",
            )
            .replace("198.18.0.16/28", "lan")
            .replace("[tftp]", "[tftp]\nenabled = false");
        let text = problems(&bad);
        for needle in [
            "boot.secure_boot.shim: /nowhere/shim is not a file (apt-get install shim-signed",
            "boot.secure_boot: GRUB and its kernel are served over TFTP; enable [tftp]",
            "boot.discovery.kernel must be an asset",
            "boot.secure_boot.networks[0]",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    /// `[boot.arm64]`: arm64 UEFI machines (architecture 11) are given GRUB, which boots the
    /// arm64 kernel and initrd named under the assets directory; the operator's own table
    /// entry wins, and a missing GRUB or a name leading out of the directory is refused.
    #[test]
    fn arm64_machines_boot_grub_and_the_arm64_ramdisk() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("aarch64")).unwrap();
        std::fs::write(dir.path().join("aarch64/grubaa64.efi"), b"g").unwrap();
        let good = grub_boot_config(dir.path(), "[boot.arm64]\nenabled = true\n");
        let c = FileConfig::parse(&good).unwrap().validate().unwrap();
        assert_eq!(
            c.boot.table.get(&11).map(String::as_str),
            Some("grubaa64.efi")
        );
        let g = c.grub_boot.unwrap();
        assert_eq!(
            g.loaders,
            [(
                "grubaa64.efi".to_string(),
                dir.path().join("aarch64/grubaa64.efi")
            )]
        );
        let arm = g.arm64.unwrap();
        assert_eq!(
            (
                arm.kernel.as_str(),
                arm.initrd.as_str(),
                arm.cmdline.as_str()
            ),
            ("aarch64/vmlinuz", "aarch64/initrd.img", "console=ttyAMA0")
        );
        assert!(g.x86_64.is_none());
        assert_eq!(
            c.tftp.unwrap().server.roots.last(),
            Some(&dir.path().to_path_buf())
        );
        let own = good.replace(
            "[boot.arm64]",
            "[boot.arch]\n11 = \"mine.efi\"\n[boot.arm64]",
        );
        let c = FileConfig::parse(&own).unwrap().validate().unwrap();
        assert_eq!(c.boot.table.get(&11).map(String::as_str), Some("mine.efi"));
        let bad = format!("{good}grub = \"/nowhere/grubaa64.efi\"\nkernel = \"../vmlinuz\"\n");
        let text = problems(&bad);
        for needle in [
            "boot.arm64.grub: /nowhere/grubaa64.efi is not a file (scripts/build-ramdisk.sh --arch aarch64",
            "boot.arm64.kernel: \"../vmlinuz\" is not a name under http.assets_dir",
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
        let text = problems(&bad);
        for needle in ["timeline.keep_per_subject", "timeline.prune_every_secs"] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        let e = FileConfig::parse("[timeline]\nkeep = 5\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `keep`"), "{e}");
    }

    #[test]
    fn http_lanes_and_idle_timeout() {
        let c = FileConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(c.http_asset_lanes, 32);
        assert_eq!(c.http_idle_timeout, Duration::from_secs(120));
        assert_eq!(c.listener_limits().idle_timeout, Duration::from_secs(120));
        let off = GOOD.replace(
            "[http]\n",
            "[http]\nasset_lanes = 0\nidle_timeout_secs = 30\n",
        );
        let c = FileConfig::parse(&off).unwrap().validate().unwrap();
        assert_eq!(c.http_asset_lanes, 0);
        assert_eq!(c.listener_limits().idle_timeout, Duration::from_secs(30));
        for (bad, setting) in [
            (
                "asset_lanes = 100000",
                "http.asset_lanes: 100000 is outside 0..=65536",
            ),
            (
                "idle_timeout_secs = 0",
                "http.idle_timeout_secs: must be at least 1",
            ),
        ] {
            let text = GOOD.replace("[http]\n", &format!("[http]\n{bad}\n"));
            let e = FileConfig::parse(&text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains(setting), "{bad}: {e}");
        }
    }

    #[test]
    fn the_dominator_high_impact_share() {
        let c = FileConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(c.dominator.unwrap().high_impact_share, 0.1);
        let one = format!("{GOOD}[dominator]\nhigh_impact_share = 1.0\n");
        let c = FileConfig::parse(&one).unwrap().validate().unwrap();
        assert_eq!(c.dominator.unwrap().high_impact_share, 1.0);
        for bad in ["0", "0.0", "1.5", "-0.1"] {
            let text = format!("{GOOD}[dominator]\nhigh_impact_share = {bad}\n");
            let e = FileConfig::parse(&text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("dominator.high_impact_share")
                    && e.contains("not above 0 and at most 1"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn power_throttle_and_sync() {
        let c = FileConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(c.power, crate::power::PowerConfig::default());
        assert_eq!(
            (c.power.max_power_ons, c.power.interval.as_secs()),
            (10, 10)
        );
        let text = format!("{GOOD}[power]\nmax_power_ons = 2\ninterval_secs = 10\nsync_secs = 5\n");
        let c = FileConfig::parse(&text).unwrap().validate().unwrap();
        assert_eq!(c.power.max_power_ons, 2);
        assert_eq!(c.power.sync_every, Duration::from_secs(5));
        let bad =
            format!("{GOOD}[power]\nmax_power_ons = 0\ninterval_secs = 0\nsync_secs = 99999999\n");
        assert_problems(
            &bad,
            &[
                "power.max_power_ons: must be at least 1",
                "power.interval_secs: must be at least 1",
                "power.sync_secs: 99999999 is more than 86400",
            ],
        );
    }

    /// `text` fails validation with (at least) every one of `needles`.
    fn assert_problems(text: &str, needles: &[&str]) {
        let problems = FileConfig::parse(text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        for needle in needles {
            assert!(
                problems.contains(needle),
                "missing {needle:?} in:\n{problems}"
            );
        }
    }

    /// Mistakes that used to pass the check and fail later (or name a setting the operator
    /// never wrote) are problems of the check, each with what to do.
    #[test]
    fn late_failures_are_caught_by_the_check() {
        assert_problems(
            &GOOD.replace("[http]\n", "[http]\nassets_dir = \"/nonexistent/assets\"\n"),
            &["http.assets_dir: /nonexistent/assets is not a directory"],
        );
        assert_problems(
            &format!(
                "{GOOD}[dhcp6]\nenabled = true\ninterfaces = [\"br0\"]\n\
                 public_url = \"[2001:2::1]:8080\"\n\
                 [[dhcp6.subnets]]\nnetwork = \"2001:2::/64\"\npools = [\"2001:2::100-2001:2::1ff\"]\n"
            ),
            &["dhcp6.public_url: \"[2001:2::1]:8080\" must start with http://"],
        );
        assert_problems(
            &GOOD.replace(
                "listen = \"198.18.0.1:8080\"",
                "listen = \"0.0.0.0:8080\"\npublic_url = \"http://198.18.0.1:8080\"",
            ),
            &["security.listen (unset: made from http.listen) is a wildcard address"],
        );
        assert_problems(
            &GOOD.replace(
                "ip = \"198.18.0.10\"",
                "ip = \"198.18.0.10\"\nhostname = \"r1 u1\"",
            ),
            &["dhcp.reservations[0].hostname: \"r1 u1\" is not a DNS label"],
        );
    }

    #[test]
    fn provisioning_timeouts() {
        let c = FileConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(
            c.provisioning.timeouts,
            paddock_birther::Timeouts {
                step_ms: 30 * 60 * 1000,
                sync_ms: 2 * 60 * 60 * 1000,
            }
        );
        let text =
            format!("{GOOD}[provisioning]\nstep_timeout_secs = 600\nsync_timeout_secs = 10800\n");
        let c = FileConfig::parse(&text).unwrap().validate().unwrap();
        assert_eq!(
            c.provisioning.timeouts,
            paddock_birther::Timeouts {
                step_ms: 600_000,
                sync_ms: 10_800_000,
            }
        );
        let bad = format!(
            "{GOOD}[provisioning]\nstep_timeout_secs = 0\nsync_timeout_secs = 99999999999\n"
        );
        assert_problems(
            &bad,
            &[
                "provisioning.step_timeout_secs: must be at least 1",
                "provisioning.sync_timeout_secs: 99999999999 is more than 30 days",
            ],
        );
        let e = FileConfig::parse("[provisioning]\ntimeout_secs = 5\n").unwrap_err();
        assert!(
            e.to_string().contains("unknown field `timeout_secs`"),
            "{e}"
        );
    }

    #[test]
    fn typos_are_errors_with_a_location() {
        let e = FileConfig::parse("[dhcp]\ninterface = [\"br0\"]\n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unknown field `interface`"), "{text}");
        assert!(text.contains("line 2"), "{text}");
    }
}
