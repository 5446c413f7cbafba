//! Network interfaces: every `/sys/class/net` entry backed by a device (so not `lo`, bridges or
//! other virtual links), with what sysfs knows about it and the addresses the shell found.

use std::path::Path;

use paddock_inventory::Interface;

use super::{CollectError, Context, last_pci, list, read_opt, resolve};

pub fn collect(root: &Path, ctx: &Context) -> Result<Vec<Interface>, CollectError> {
    let mut out = Vec::new();
    for name in list(root, "/sys/class/net")? {
        let base = format!("/sys/class/net/{name}");
        let Some(device) = resolve(root, &format!("{base}/device")) else {
            continue;
        };
        let driver = resolve(root, &format!("{base}/device/driver"))
            .and_then(|p| p.rsplit('/').next().map(str::to_string));
        out.push(Interface {
            mac_address: read_opt(root, &format!("{base}/address")).map(|m| m.to_ascii_lowercase()),
            ipv4_address: ctx.ipv4.get(&name).cloned(),
            ipv6_address: ctx.ipv6.get(&name).cloned(),
            // Reading `carrier` of a down interface fails (EINVAL): no carrier.
            has_carrier: read_opt(root, &format!("{base}/carrier")).as_deref() == Some("1"),
            lldp: ctx.lldp.get(&name).cloned(),
            vendor: read_opt(root, &format!("{base}/device/vendor")),
            product: read_opt(root, &format!("{base}/device/device")),
            client_id: None,
            biosdevname: None,
            // -1 (unknown, e.g. virtio or no link) is not a speed.
            speed_mbps: read_opt(root, &format!("{base}/speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0),
            pci_address: last_pci(&device),
            driver,
            extra: Default::default(),
            name,
        });
    }
    Ok(out)
}

/// The interface whose MAC is `mac` (normalised, `aa:bb:…`), if any.
pub fn find_by_mac(root: &Path, mac: &str) -> Option<String> {
    list(root, "/sys/class/net").ok()?.into_iter().find(|n| {
        read_opt(root, &format!("/sys/class/net/{n}/address"))
            .is_some_and(|a| a.eq_ignore_ascii_case(mac))
    })
}

/// The kernel's index of interface `name` (`/sys/class/net/<name>/ifindex`).
pub fn index_of(root: &Path, name: &str) -> Option<u32> {
    read_opt(root, &format!("/sys/class/net/{name}/ifindex"))?
        .trim()
        .parse()
        .ok()
}

/// Every interface backed by a device, with its MAC: `(name, mac)`.
pub fn physical(root: &Path) -> Vec<(String, String)> {
    list(root, "/sys/class/net")
        .unwrap_or_default()
        .into_iter()
        .filter(|n| resolve(root, &format!("/sys/class/net/{n}/device")).is_some())
        .filter_map(|n| {
            let mac = read_opt(root, &format!("/sys/class/net/{n}/address"))?;
            Some((n, mac))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::collect::fixture::{link, mkdir, write};

    /// A NIC as sysfs shows it: the netdev under its device, `/sys/class/net/<if>` linking to it,
    /// `device` and `device/driver` links, and attribute files.
    pub(crate) fn nic(root: &Path, devdir: &str, name: &str, driver: &str, files: &[(&str, &str)]) {
        let dir = format!("{devdir}/net/{name}");
        mkdir(root, &dir);
        link(
            root,
            &format!("{dir}/device"),
            &format!("../../../{}", devdir.rsplit('/').next().unwrap()),
        );
        link(
            root,
            &format!("/sys/class/net/{name}"),
            &format!("../../devices{}", dir.trim_start_matches("/sys/devices")),
        );
        mkdir(root, &format!("/sys/bus/drivers/{driver}"));
        let depth = devdir.matches('/').count();
        link(
            root,
            &format!("{devdir}/driver"),
            &format!("{}bus/drivers/{driver}", "../".repeat(depth - 1)),
        );
        for (f, c) in files {
            write(root, &format!("{dir}/{f}"), c);
        }
    }

    pub(crate) fn fixture(root: &Path) {
        // virtio-net: device -> virtio0 under the PCI function (vendor/device are virtio's ids).
        nic(
            root,
            "/sys/devices/pci0000:00/0000:00:03.0/virtio0",
            "eth0",
            "virtio_net",
            &[
                ("address", "52:54:00:12:34:56\n"),
                ("carrier", "1\n"),
                ("speed", "-1\n"),
            ],
        );
        write(
            root,
            "/sys/devices/pci0000:00/0000:00:03.0/virtio0/vendor",
            "0x1af4\n",
        );
        write(
            root,
            "/sys/devices/pci0000:00/0000:00:03.0/virtio0/device",
            "0x0001\n",
        );
        // An Intel NIC directly on PCI, link down.
        nic(
            root,
            "/sys/devices/pci0000:00/0000:00:1c.0/0000:3b:00.1",
            "eth1",
            "igb",
            &[
                ("address", "A0:36:9F:00:00:01\n"),
                ("carrier", "0\n"),
                ("speed", "1000\n"),
            ],
        );
        write(
            root,
            "/sys/devices/pci0000:00/0000:00:1c.0/0000:3b:00.1/vendor",
            "0x8086\n",
        );
        write(
            root,
            "/sys/devices/pci0000:00/0000:00:1c.0/0000:3b:00.1/device",
            "0x1521\n",
        );
        // Virtual: lo has no device link.
        mkdir(root, "/sys/devices/virtual/net/lo");
        link(root, "/sys/class/net/lo", "../../devices/virtual/net/lo");
        write(
            root,
            "/sys/devices/virtual/net/lo/address",
            "00:00:00:00:00:00\n",
        );
    }

    #[test]
    fn interfaces_table() {
        let t = tempfile::tempdir().unwrap();
        fixture(t.path());
        let mut ctx = Context::default();
        ctx.ipv4.insert("eth0".into(), "198.18.0.100".into());
        ctx.ipv6.insert("eth0".into(), "2001:2:0:1::100".into());
        ctx.lldp
            .insert("eth1".into(), vec![(1, "0400112233".into())]);
        let ifs = collect(t.path(), &ctx).unwrap();
        let got: Vec<_> = ifs
            .iter()
            .map(|i| {
                (
                    i.name.as_str(),
                    i.mac_address.as_deref(),
                    i.ipv4_address.as_deref(),
                    i.ipv6_address.as_deref(),
                    i.has_carrier,
                    i.speed_mbps,
                    i.driver.as_deref(),
                    i.pci_address.as_deref(),
                    i.vendor.as_deref(),
                    i.product.as_deref(),
                    i.lldp.is_some(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "eth0",
                    Some("52:54:00:12:34:56"),
                    Some("198.18.0.100"),
                    Some("2001:2:0:1::100"),
                    true,
                    None,
                    Some("virtio_net"),
                    Some("0000:00:03.0"),
                    Some("0x1af4"),
                    Some("0x0001"),
                    false
                ),
                (
                    "eth1",
                    Some("a0:36:9f:00:00:01"),
                    None,
                    None,
                    false,
                    Some(1000),
                    Some("igb"),
                    Some("0000:3b:00.1"),
                    Some("0x8086"),
                    Some("0x1521"),
                    true
                ),
            ]
        );
        assert_eq!(
            find_by_mac(t.path(), "a0:36:9f:00:00:01").as_deref(),
            Some("eth1")
        );
        assert_eq!(find_by_mac(t.path(), "52:54:00:12:34:57"), None);
        assert_eq!(
            physical(t.path()),
            vec![
                ("eth0".to_string(), "52:54:00:12:34:56".to_string()),
                ("eth1".into(), "A0:36:9F:00:00:01".into())
            ]
        );
    }
}
