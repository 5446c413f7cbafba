//! Hardware collectors. Each one is a pure function of a root directory (`/` in the ramdisk, a
//! fixture tree in tests) plus the few facts the shell gathers from syscalls ([`Context`]).

pub mod cpu;
pub mod disks;
pub mod memory;
pub mod net;
pub mod pci;
pub mod system;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use paddock_inventory::{Disk, Inventory};

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot understand {path}: {why}")]
    Parse { path: String, why: String },
}

/// What the shell learnt from syscalls, which the collectors cannot read from files.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The boot NIC's MAC (`aa:bb:…`), from `BOOTIF`.
    pub boot_mac: Option<String>,
    /// Interface name → IPv4 address (from `getifaddrs`).
    pub ipv4: BTreeMap<String, String>,
    /// Interface name → IPv6 address ([`ipv6_by_interface`]).
    pub ipv6: BTreeMap<String, String>,
    /// Interface name → LLDP TLVs heard on it (only when LLDP listening was asked for).
    pub lldp: BTreeMap<String, Vec<(u8, String)>>,
    /// `x86_64`, …
    pub architecture: String,
}

/// Each interface's IPv6 address as the inventory reports it: the first global one (what
/// DHCPv6 or SLAAC gave it), else its link-local one, which every IPv6 interface has.
pub fn ipv6_by_interface(
    addrs: impl Iterator<Item = (String, std::net::Ipv6Addr)>,
) -> BTreeMap<String, String> {
    let mut best: BTreeMap<String, std::net::Ipv6Addr> = BTreeMap::new();
    let link_local = |ip: &std::net::Ipv6Addr| ip.segments()[0] & 0xffc0 == 0xfe80;
    for (name, ip) in addrs {
        if ip.is_loopback() || ip.is_multicast() {
            continue;
        }
        match best.get(&name) {
            Some(have) if !link_local(have) || link_local(&ip) => {}
            _ => {
                best.insert(name, ip);
            }
        }
    }
    best.into_iter()
        .map(|(n, ip)| (n, ip.to_string()))
        .collect()
}

/// The inventory and the messages of every collector that failed (IPA posts anyway, with
/// those messages in `error`).
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub inventory: Inventory,
    pub errors: Vec<String>,
}

/// Runs the `default` collector set over `root`.
pub fn collect(root: &Path, ctx: &Context) -> Collected {
    fn ok<T>(errors: &mut Vec<String>, what: &str, r: Result<T, CollectError>) -> Option<T> {
        r.map_err(|e| errors.push(format!("{what} collector: {e}")))
            .ok()
    }
    let mut errors = Vec::new();
    let interfaces = ok(&mut errors, "interfaces", net::collect(root, ctx)).unwrap_or_default();
    let cpu = ok(&mut errors, "cpu", cpu::collect(root, &ctx.architecture));
    let memory = ok(&mut errors, "memory", memory::collect(root));
    let disks = ok(&mut errors, "disks", disks::collect(root)).unwrap_or_default();
    let inventory = Inventory {
        interfaces,
        cpu,
        memory,
        disks,
        bmc_address: None,
        bmc_v6address: None,
        system_vendor: system::vendor(root),
        boot: Some(system::boot(root, ctx.boot_mac.as_deref())),
        hostname: Some(system::hostname(root)),
        extra: Default::default(),
    };
    Collected { inventory, errors }
}

/// IPA's default root disk guess: the smallest disk of at least 4 GiB.
pub fn root_disk(disks: &[Disk]) -> Option<Disk> {
    disks
        .iter()
        .filter(|d| d.size >= 4 << 30)
        .min_by_key(|d| d.size)
        .cloned()
}

/// `root` + an absolute path inside it.
pub(crate) fn at(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// A file's contents, trimmed; `None` when missing, unreadable or empty.
pub(crate) fn read_opt(root: &Path, path: &str) -> Option<String> {
    let s = std::fs::read_to_string(at(root, path)).ok()?;
    let s = s.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// A file's contents, or an error naming it.
pub(crate) fn read_req(root: &Path, path: &str) -> Result<String, CollectError> {
    std::fs::read_to_string(at(root, path)).map_err(|source| CollectError::Read {
        path: path.to_string(),
        source,
    })
}

/// The directory entries' names, sorted; a missing directory is empty.
pub(crate) fn list(root: &Path, path: &str) -> Result<Vec<String>, CollectError> {
    let rd = match std::fs::read_dir(at(root, path)) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CollectError::Read {
                path: path.to_string(),
                source,
            });
        }
    };
    let mut names: Vec<String> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

/// Where a sysfs symlink really points, as an absolute path inside `root`
/// (`/sys/devices/pci0000:00/0000:00:04.0/virtio1/block/vda`).
pub(crate) fn resolve(root: &Path, path: &str) -> Option<String> {
    let real = std::fs::canonicalize(at(root, path)).ok()?;
    let root = std::fs::canonicalize(root).ok()?;
    let rel = real.strip_prefix(&root).ok()?;
    Some(format!("/{}", rel.to_str()?))
}

/// Whether a path component is a PCI address (`0000:00:1f.2`).
pub(crate) fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The PCI device nearest to the end of a sysfs device path.
pub(crate) fn last_pci(devpath: &str) -> Option<String> {
    devpath
        .split('/')
        .rev()
        .find(|c| is_pci_address(c))
        .map(str::to_string)
}

#[cfg(test)]
pub(crate) mod fixture {
    //! Fake `/sys` and `/proc` trees for the collector tests.
    use std::path::Path;

    pub fn write(root: &Path, path: &str, content: &str) {
        let p = super::at(root, path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn write_bytes(root: &Path, path: &str, content: &[u8]) {
        let p = super::at(root, path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn mkdir(root: &Path, path: &str) {
        std::fs::create_dir_all(super::at(root, path)).unwrap();
    }

    /// A symlink at `path` pointing to `target` (relative, as sysfs does).
    pub fn link(root: &Path, path: &str, target: &str) {
        let p = super::at(root, path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A global address wins over the link-local one, whichever comes first; an interface
    /// with only a link-local address reports that; loopback and multicast never.
    #[test]
    fn ipv6_addresses_prefer_global_ones() {
        let addrs = [
            ("eth0", "fe80::5054:ff:fe12:3456"),
            ("eth0", "2001:2:0:1::100"),
            ("eth0", "2001:2:0:1::101"),
            ("eth1", "2001:2:0:2::5"),
            ("eth1", "fe80::1"),
            ("eth2", "fe80::2"),
            ("lo", "::1"),
        ]
        .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()));
        let got = ipv6_by_interface(addrs.into_iter());
        let want: BTreeMap<String, String> = [
            ("eth0", "2001:2:0:1::100"),
            ("eth1", "2001:2:0:2::5"),
            ("eth2", "fe80::2"),
        ]
        .map(|(n, ip)| (n.to_string(), ip.to_string()))
        .into_iter()
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn pci_addresses() {
        let cases = [
            ("0000:00:1f.2", true),
            ("0000:3b:00.0", true),
            ("pci0000:00", false),
            ("0000:00:1f", false),
            ("0000:0g:1f.2", false),
            ("virtio1", false),
        ];
        for (s, want) in cases {
            assert_eq!(is_pci_address(s), want, "{s}");
        }
        assert_eq!(
            last_pci("/sys/devices/pci0000:00/0000:00:1c.0/0000:01:00.0/nvme/nvme0/nvme0n1")
                .as_deref(),
            Some("0000:01:00.0")
        );
        assert_eq!(last_pci("/sys/devices/virtual/block/loop0"), None);
    }

    #[test]
    fn root_disk_is_the_smallest_of_at_least_4_gib() {
        let d = |name: &str, size: u64| Disk {
            name: name.into(),
            size,
            ..Default::default()
        };
        let cases: &[(&[Disk], Option<&str>)] = &[
            (
                &[
                    d("/dev/sda", 500 << 30),
                    d("/dev/sdb", 100 << 30),
                    d("/dev/sdc", 1 << 30),
                ],
                Some("/dev/sdb"),
            ),
            (&[d("/dev/sda", 4 << 30)], Some("/dev/sda")),
            (&[d("/dev/sda", (4 << 30) - 512)], None),
            (&[], None),
        ];
        for (disks, want) in cases {
            assert_eq!(root_disk(disks).map(|d| d.name).as_deref(), *want);
        }
    }

    #[test]
    fn a_failing_collector_is_reported_and_the_rest_still_collected() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        // No /proc at all: cpu and memory fail, the rest still yields an inventory.
        fixture::write(r, "/proc/sys/kernel/hostname", "node1\n");
        let c = collect(
            r,
            &Context {
                architecture: "x86_64".into(),
                boot_mac: Some("52:54:00:12:34:56".into()),
                ..Default::default()
            },
        );
        assert_eq!(c.errors.len(), 2, "{:?}", c.errors);
        assert!(
            c.errors[0].starts_with("cpu collector: cannot read /proc/cpuinfo"),
            "{:?}",
            c.errors
        );
        assert!(
            c.errors[1].starts_with("memory collector: cannot read /proc/meminfo"),
            "{:?}",
            c.errors
        );
        assert_eq!(c.inventory.hostname.as_deref(), Some("node1"));
        let boot = c.inventory.boot.unwrap();
        assert_eq!(
            (
                boot.current_boot_mode.as_str(),
                boot.pxe_interface.as_deref()
            ),
            ("bios", Some("52:54:00:12:34:56"))
        );
        assert!(c.inventory.cpu.is_none());
    }
}
