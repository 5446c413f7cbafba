//! `paddock init`: a working configuration for this host, written from its interfaces.
//!
//! The pure part ([`plan`]) takes the host's IPv4 interfaces and the operator's choices and
//! returns the configuration text; the shell ([`run`]) reads the interfaces (getifaddrs, the
//! default route from /proc/net/route), asks which interface only when several qualify and a
//! terminal is attached, writes the file (never over an operator's file without `--force`),
//! checks it as `paddock config check` does, and runs `certs init`.

use std::io::IsTerminal;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use ipnet::Ipv4Net;

/// The first line of the configuration the package ships: a file that still begins with it
/// is the untouched default, which `init` may replace.
pub const PACKAGED_MARKER: &str = "# paddock: default configuration, replaced by `paddock init`";

/// Where the package keeps this host's configuration: what `init` writes, and what the
/// commands acting on this host's appliance read when no `--config` names another file.
pub const CONFIG: &str = "/etc/paddock/paddock.toml";
const DATA_DIR: &str = crate::config::defaults::DATA_DIR;
/// Where the package puts the discovery ramdisk (vmlinuz, initrd.img), served over HTTP.
const ASSETS_DIR: &str = "/usr/lib/paddock/ramdisk";
/// Debian's `ipxe` package.
const TFTP_ROOT: &str = "/usr/lib/ipxe";

/// What the operator may choose; unset fields are derived from the host.
#[derive(Clone, Debug, clap::Args)]
pub struct InitArgs {
    /// The provisioning network's interface (default: the only one with an IPv4 address).
    #[arg(long)]
    pub interface: Option<String>,
    /// The DHCP pool, `FIRST-LAST` (default: the upper half of the interface's subnet).
    #[arg(long)]
    pub pool: Option<String>,
    /// The router machines are given (default: this host's default gateway when it is on
    /// that subnet, else none).
    #[arg(long)]
    pub router: Option<Ipv4Addr>,
    /// Serve DNS for this zone from live state (and hand this host out as the DNS server).
    #[arg(long)]
    pub dns_zone: Option<String>,
    /// Where the file goes.
    #[arg(long, default_value = CONFIG)]
    pub config: PathBuf,
    #[arg(long, default_value = DATA_DIR)]
    pub data_dir: PathBuf,
    /// The discovery ramdisk (vmlinuz, initrd.img) and the loaders served over HTTP.
    #[arg(long, default_value = ASSETS_DIR)]
    pub assets_dir: PathBuf,
    /// The TFTP root: Debian's iPXE builds.
    #[arg(long, default_value = TFTP_ROOT)]
    pub tftp_root: PathBuf,
    /// Replace a configuration an operator has written.
    #[arg(long)]
    pub force: bool,
    /// Skip `paddock certs init` (the CA, this host's certificate, the admin certificate).
    #[arg(long)]
    pub no_certs: bool,
}

impl Default for InitArgs {
    fn default() -> Self {
        InitArgs {
            interface: None,
            pool: None,
            router: None,
            dns_zone: None,
            config: CONFIG.into(),
            data_dir: DATA_DIR.into(),
            assets_dir: ASSETS_DIR.into(),
            tftp_root: TFTP_ROOT.into(),
            force: false,
            no_certs: false,
        }
    }
}

/// An interface with an IPv4 address, as the host has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInterface {
    pub name: String,
    pub address: Ipv4Net,
}

/// What [`plan`] decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub interface: HostInterface,
    pub pool: (Ipv4Addr, Ipv4Addr),
    pub router: Option<Ipv4Addr>,
    pub text: String,
}

/// The interfaces a provisioning network can be on: IPv4, not loopback, not link-local.
pub fn candidates(all: &[HostInterface]) -> Vec<&HostInterface> {
    all.iter()
        .filter(|i| {
            let a = i.address.addr();
            !a.is_loopback() && !a.is_link_local() && i.address.prefix_len() < 31
        })
        .collect()
}

/// The upper half of `net`'s hosts, without the broadcast address: machines' leases stay
/// clear of the lower half, where hosts with fixed addresses usually are.
fn default_pool(net: Ipv4Net) -> (Ipv4Addr, Ipv4Addr) {
    let first = u32::from(net.network()) + 1;
    let last = u32::from(net.broadcast()) - 1;
    (
        Ipv4Addr::from(first + (last - first) / 2 + 1),
        Ipv4Addr::from(last),
    )
}

fn parse_pool(text: &str, net: Ipv4Net) -> anyhow::Result<(Ipv4Addr, Ipv4Addr)> {
    let (a, b) = text
        .split_once('-')
        .with_context(|| format!("--pool {text:?}: expected FIRST-LAST"))?;
    let parse = |s: &str| {
        s.trim()
            .parse::<Ipv4Addr>()
            .with_context(|| format!("--pool: {s:?} is not an IPv4 address"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a > b {
        bail!("--pool {text}: the first address is after the last");
    }
    for x in [a, b] {
        if !net.contains(&x) || x == net.network() || x == net.broadcast() {
            bail!("--pool: {x} is not a host address of {net}");
        }
    }
    Ok((a, b))
}

/// The configuration for `args` on a host with `interfaces` and default gateway `gateway`;
/// `choose` picks among several interfaces (the shell asks on a terminal, or refuses).
pub fn plan(
    args: &InitArgs,
    interfaces: &[HostInterface],
    gateway: Option<(String, Ipv4Addr)>,
    choose: impl FnOnce(&[&HostInterface]) -> anyhow::Result<HostInterface>,
) -> anyhow::Result<Plan> {
    let usable = candidates(interfaces);
    let interface = match &args.interface {
        Some(name) => usable
            .iter()
            .find(|i| &i.name == name)
            .map(|i| (*i).clone())
            .with_context(|| {
                format!(
                    "interface {name} has no usable IPv4 address (found: {})",
                    names(&usable)
                )
            })?,
        None => match usable.as_slice() {
            [] => bail!(
                "no interface with an IPv4 address: give the provisioning network an address first"
            ),
            [one] => (*one).clone(),
            several => choose(several)?,
        },
    };
    let net = interface.address.trunc();
    let ip = interface.address.addr();
    let pool = match &args.pool {
        Some(p) => parse_pool(p, net)?,
        None => default_pool(net),
    };
    let router = args.router.or(gateway
        .filter(|(dev, gw)| dev == &interface.name && net.contains(gw))
        .map(|(_, gw)| gw));
    if let Some(r) = router
        && !net.contains(&r)
    {
        bail!("--router {r} is not on {net}");
    }
    let q = |p: &Path| toml_string(&p.display().to_string());
    let mut text = format!(
        "# Written by `paddock init` for {name} ({address}); `paddock config check` explains\n\
         # every key, and the README's \"Running the appliance\" shows the rest.\n\
         data_dir = {data}\n\n\
         [http]\nlisten = \"{ip}:8080\"\nassets_dir = {assets}\n\n\
         [security]\nlisten = \"{ip}:8443\"\n\n\
         [dhcp]\ninterfaces = [{iface}]\n\n\
         [[dhcp.subnets]]\nnetwork = \"{net}\"\npools = [\"{lo}-{hi}\"]\n",
        name = interface.name.escape_debug(),
        address = interface.address,
        data = q(&args.data_dir),
        assets = q(&args.assets_dir),
        iface = toml_string(&interface.name),
        lo = pool.0,
        hi = pool.1,
    );
    if pool.0 <= ip && ip <= pool.1 {
        text.push_str(&format!("exclude = [\"{ip}\"]\n"));
    }
    if let Some(r) = router {
        text.push_str(&format!("routers = [\"{r}\"]\n"));
    }
    if args.dns_zone.is_some() {
        text.push_str(&format!("dns = [\"{ip}\"]\n"));
    }
    text.push_str(&format!(
        "\n[tftp]\nlisten = [\"{ip}:69\"]\nroot = {}\n\n\
         [boot.discovery]\nkernel = \"http://{ip}:8080/boot/assets/vmlinuz\"\n\
         initrd = \"http://{ip}:8080/boot/assets/initrd.img\"\n",
        q(&args.tftp_root)
    ));
    if let Some(zone) = &args.dns_zone {
        text.push_str(&format!(
            "\n[dns]\nenabled = true\nzone = {}\n",
            toml_string(zone)
        ));
    }
    Ok(Plan {
        interface,
        pool,
        router,
        text,
    })
}

fn names(list: &[&HostInterface]) -> String {
    if list.is_empty() {
        return "none".into();
    }
    list.iter()
        .map(|i| format!("{} {}", i.name, i.address))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A TOML basic string: untrusted text (an interface's name, a path) never breaks the file.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// This host's IPv4 interfaces.
fn host_interfaces() -> anyhow::Result<Vec<HostInterface>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().context("listing the interfaces")? {
        let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
            continue;
        };
        let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) else {
            continue;
        };
        let prefix = u8::try_from(u32::from(m.ip()).leading_ones()).unwrap_or(32);
        if let Ok(net) = Ipv4Net::new(a.ip(), prefix) {
            out.push(HostInterface {
                name: ifa.interface_name,
                address: net,
            });
        }
    }
    Ok(out)
}

/// The default route's interface and gateway, from /proc/net/route.
fn default_gateway() -> Option<(String, Ipv4Addr)> {
    let text = std::fs::read_to_string("/proc/net/route").ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 3 || f[1] != "00000000" {
            return None;
        }
        let gw = u32::from_str_radix(f[2], 16).ok()?;
        // The kernel writes it in host byte order (little-endian here).
        Some((f[0].to_string(), Ipv4Addr::from(gw.swap_bytes())))
    })
}

/// Asks on the terminal which of `several` to use.
fn ask(several: &[&HostInterface]) -> anyhow::Result<HostInterface> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "several interfaces have IPv4 addresses ({}): choose one with --interface",
            names(several)
        );
    }
    eprintln!("Which interface is the provisioning network?");
    for (n, i) in several.iter().enumerate() {
        eprintln!("  {}) {} {}", n + 1, i.name, i.address);
    }
    eprint!("number: ");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let n: usize = line.trim().parse().context("not a number")?;
    several
        .get(n.wrapping_sub(1))
        .map(|i| (*i).clone())
        .context("no such interface")
}

/// The configuration the package ships.
const PACKAGED: &str = include_str!("../../packaging/debian/paddock.toml");

/// Whether the file at `path` is the package's default configuration, untouched: the whole
/// file, as operators edit a conffile in place and keep its first lines.
pub fn is_packaged_default(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t == PACKAGED)
}

/// Whether `path` may be written: absent, the packaged default, or `force`.
fn may_write(path: &Path, force: bool) -> anyhow::Result<()> {
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        Ok(_) if force => Ok(()),
        Ok(text) if text == PACKAGED => Ok(()),
        Ok(_) => bail!(
            "{} exists and was written by someone: keep it, or run again with --force",
            path.display()
        ),
    }
}

/// `paddock init` (see the module documentation).
pub async fn run(args: &InitArgs) -> anyhow::Result<()> {
    may_write(&args.config, args.force)?;
    // Both are served from the first start: said here with the flag that changes them,
    // rather than as a validation problem of the file init would write.
    for (what, dir, flag) in [
        ("assets directory", &args.assets_dir, "--assets-dir"),
        ("TFTP root", &args.tftp_root, "--tftp-root"),
    ] {
        if !dir.is_dir() {
            bail!(
                "the {what} {} does not exist: install what provides it (the paddock package \
                 ships the ramdisk, Debian's ipxe the TFTP root), or name another with {flag}",
                dir.display()
            );
        }
    }
    let plan = plan(args, &host_interfaces()?, default_gateway(), ask)?;
    // Checked before anything is written: what init writes, `config check` accepts.
    let cfg = crate::config::FileConfig::parse(&plan.text)
        .and_then(crate::config::FileConfig::validate)
        .map_err(|e| {
            anyhow::anyhow!(
                "the configuration init made is invalid: {}",
                e.problems.join("; ")
            )
        })?;
    if let Some(dir) = args.config.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = args.config.with_extension("toml.new");
    std::fs::write(&tmp, &plan.text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.config)
        .with_context(|| format!("writing {}", args.config.display()))?;
    println!(
        "wrote {} for {} {}: DHCP pool {}-{}{}",
        args.config.display(),
        plan.interface.name,
        plan.interface.address,
        plan.pool.0,
        plan.pool.1,
        plan.router
            .map(|r| format!(", router {r}"))
            .unwrap_or_default()
    );
    if !args.no_certs {
        crate::certs_cli::run(
            &cfg,
            crate::certs_cli::CertsCmd::Init {
                sans: Vec::new(),
                admin: "admin".into(),
            },
        )
        .await
        .context("certs init")?;
    }
    println!(
        "next: systemctl enable --now paddock   (or: paddock serve --config {})",
        args.config.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, cidr: &str) -> HostInterface {
        HostInterface {
            name: name.into(),
            address: cidr.parse().unwrap(),
        }
    }

    fn host() -> Vec<HostInterface> {
        vec![iface("lo", "127.0.0.1/8"), iface("eth1", "198.18.0.1/24")]
    }

    /// Defaults with directories that exist (validation checks the TFTP root).
    fn args() -> InitArgs {
        let dir = std::env::temp_dir();
        InitArgs {
            assets_dir: dir.clone(),
            tftp_root: dir,
            ..InitArgs::default()
        }
    }

    fn never(_: &[&HostInterface]) -> anyhow::Result<HostInterface> {
        panic!("nothing to choose")
    }

    #[test]
    fn one_interface_gives_a_configuration_config_check_accepts() {
        let p = plan(&args(), &host(), None, never).unwrap();
        assert_eq!(p.interface.name, "eth1");
        assert_eq!(
            p.pool,
            (
                "198.18.0.128".parse().unwrap(),
                "198.18.0.254".parse().unwrap()
            )
        );
        assert_eq!(p.router, None);
        let cfg = crate::config::FileConfig::parse(&p.text)
            .and_then(crate::config::FileConfig::validate)
            .unwrap_or_else(|e| panic!("{:?}\n{}", e.problems, p.text));
        assert_eq!(cfg.http_listen, "198.18.0.1:8080".parse().unwrap());
        assert!(cfg.dhcp.is_some());
    }

    #[test]
    fn the_gateway_is_the_router_only_on_that_interface() {
        let gw = Some(("eth1".to_string(), "198.18.0.254".parse().unwrap()));
        let p = plan(&args(), &host(), gw, never).unwrap();
        assert_eq!(p.router, Some("198.18.0.254".parse().unwrap()));
        assert!(p.text.contains("routers = [\"198.18.0.254\"]"));
        let elsewhere = Some(("eth0".to_string(), "10.0.0.1".parse().unwrap()));
        let p = plan(&args(), &host(), elsewhere, never).unwrap();
        assert_eq!(p.router, None);
    }

    #[test]
    fn choices_are_checked_against_the_subnet() {
        let with = |pool: &str| InitArgs {
            pool: Some(pool.into()),
            ..args()
        };
        let p = plan(&with("198.18.0.1-198.18.0.20"), &host(), None, never).unwrap();
        assert!(p.text.contains("exclude = [\"198.18.0.1\"]"), "{}", p.text);
        for bad in [
            "198.18.1.1-198.18.1.9",
            "198.18.0.9-198.18.0.2",
            "x-y",
            "198.18.0.0-198.18.0.5",
        ] {
            assert!(plan(&with(bad), &host(), None, never).is_err(), "{bad}");
        }
        let r = InitArgs {
            router: Some("10.0.0.1".parse().unwrap()),
            ..args()
        };
        assert!(plan(&r, &host(), None, never).is_err());
        let named = InitArgs {
            interface: Some("eth9".into()),
            ..args()
        };
        let err = plan(&named, &host(), None, never).unwrap_err().to_string();
        assert!(err.contains("eth1 198.18.0.1/24"), "{err}");
    }

    #[test]
    fn several_interfaces_are_chosen_between_and_none_is_an_error() {
        let mut two = host();
        two.push(iface("eth2", "198.19.0.1/16"));
        let p = plan(&args(), &two, None, |list| {
            assert_eq!(list.len(), 2);
            Ok(list[1].clone())
        })
        .unwrap();
        assert_eq!(p.interface.name, "eth2");
        let only_lo = vec![iface("lo", "127.0.0.1/8"), iface("eth0", "169.254.3.4/16")];
        assert!(plan(&args(), &only_lo, None, never).is_err());
    }

    #[test]
    fn a_zone_turns_dns_on_and_hands_this_host_out() {
        let args = InitArgs {
            dns_zone: Some("lab.example".into()),
            ..args()
        };
        let p = plan(&args, &host(), None, never).unwrap();
        let cfg = crate::config::FileConfig::parse(&p.text)
            .and_then(crate::config::FileConfig::validate)
            .unwrap_or_else(|e| panic!("{:?}", e.problems));
        assert!(cfg.dns.is_some());
        assert!(p.text.contains("dns = [\"198.18.0.1\"]"));
    }

    #[test]
    fn names_and_paths_cannot_break_the_file() {
        let evil = vec![iface("eth\"]\nx = [\"", "198.18.0.1/24")];
        let args = InitArgs {
            data_dir: "/var/lib/\"paddock".into(),
            ..args()
        };
        let p = plan(&args, &evil, None, never).unwrap();
        let v: toml::Value = toml::from_str(&p.text).unwrap();
        assert_eq!(v["data_dir"].as_str(), Some("/var/lib/\"paddock"));
        assert!(v.get("x").is_none());
    }

    #[test]
    fn the_packaged_configuration_carries_the_marker_and_passes_its_check() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/debian/paddock.toml");
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(text.lines().next(), Some(PACKAGED_MARKER));
        crate::config::FileConfig::parse(&text)
            .and_then(crate::config::FileConfig::validate)
            .unwrap_or_else(|e| panic!("{:?}", e.problems));
    }

    #[test]
    fn only_an_absent_or_packaged_file_is_replaced_without_force() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("paddock.toml");
        may_write(&f, false).unwrap();
        std::fs::write(&f, PACKAGED).unwrap();
        may_write(&f, false).unwrap();
        assert!(is_packaged_default(&f));
        // Edited in place, its first line kept: an operator's file now.
        std::fs::write(&f, format!("{PACKAGED}dhcp.enabled = true\n")).unwrap();
        assert!(may_write(&f, false).is_err());
        assert!(!is_packaged_default(&f));
        std::fs::write(&f, "data_dir = \"/mine\"\n").unwrap();
        assert!(may_write(&f, false).is_err());
        may_write(&f, true).unwrap();
    }
}
