//! Disks: every `/sys/block` device except loop, ram, zram, device-mapper, optical, floppy and
//! nbd. There is no udev in the ramdisk, so `by_path`, `wwn` and `serial` are derived from
//! sysfs the way udev's `path_id`/`scsi_id` would name them.

use std::path::Path;

use paddock_inventory::Disk;

use super::{CollectError, last_pci, list, read_opt, resolve};

const SKIP_PREFIXES: &[&str] = &["loop", "ram", "zram", "dm-", "sr", "fd", "nbd"];

pub fn collect(root: &Path) -> Result<Vec<Disk>, CollectError> {
    let mut disks = Vec::new();
    for name in list(root, "/sys/block")? {
        if SKIP_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        disks.push(disk(root, &name)?);
    }
    Ok(disks)
}

fn disk(root: &Path, name: &str) -> Result<Disk, CollectError> {
    let base = format!("/sys/block/{name}");
    let sectors: u64 = read_opt(root, &format!("{base}/size"))
        .ok_or_else(|| CollectError::Parse {
            path: format!("{base}/size"),
            why: "missing or empty".into(),
        })?
        .parse()
        .map_err(|e| CollectError::Parse {
            path: format!("{base}/size"),
            why: format!("not a sector count: {e}"),
        })?;
    let devpath = resolve(root, &base).unwrap_or_default();
    let hctl = resolve(root, &format!("{base}/device"))
        .and_then(|p| p.rsplit('/').next().map(str::to_string))
        .filter(|c| is_hctl(c));
    let wwid = read_opt(root, &format!("{base}/device/wwid"))
        .or_else(|| read_opt(root, &format!("{base}/wwid")));
    let (wwn, wwn_with_extension, wwn_vendor_extension) =
        wwid.as_deref().map(parse_wwid).unwrap_or_default();
    let num = |f: &str| read_opt(root, &format!("{base}/queue/{f}")).and_then(|s| s.parse().ok());
    Ok(Disk {
        name: format!("/dev/{name}"),
        model: read_opt(root, &format!("{base}/device/model")),
        size: sectors.saturating_mul(512),
        rotational: read_opt(root, &format!("{base}/queue/rotational")).as_deref() == Some("1"),
        wwn,
        serial: serial(root, &base),
        vendor: read_opt(root, &format!("{base}/device/vendor")),
        wwn_with_extension,
        wwn_vendor_extension,
        by_path: by_path(root, &devpath, name, hctl.as_deref()),
        hctl,
        logical_sectors: num("logical_block_size"),
        physical_sectors: num("physical_block_size"),
        tran: transport(&devpath),
        extra: Default::default(),
    })
}

/// `0:0:0:0`
fn is_hctl(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// virtio-blk: `/sys/block/vda/serial`; NVMe: `device/serial`; SCSI/SATA: VPD page 0x80.
fn serial(root: &Path, base: &str) -> Option<String> {
    read_opt(root, &format!("{base}/serial"))
        .or_else(|| read_opt(root, &format!("{base}/device/serial")))
        .or_else(|| {
            let page = std::fs::read(super::at(root, &format!("{base}/device/vpd_pg80"))).ok()?;
            vpd_pg80_serial(&page)
        })
}

/// The unit serial number of a SCSI VPD page 0x80 (4-byte header, then ASCII).
pub fn vpd_pg80_serial(page: &[u8]) -> Option<String> {
    if page.len() < 4 || page[1] != 0x80 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([page[2], page[3]]));
    let s = String::from_utf8_lossy(page.get(4..4 + len)?)
        .trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_string();
    (!s.is_empty()).then_some(s)
}

/// A sysfs `wwid` as lsblk/udev show the WWN: `naa.5000c500a1b2c3d4` → `0x5000c500a1b2c3d4`
/// (a 32-digit NAA is split into the WWN and its vendor extension); `eui.`/NVMe ids are kept as
/// they are; T10 vendor ids are not WWNs.
/// Returns (wwn, wwn_with_extension, wwn_vendor_extension).
pub fn parse_wwid(wwid: &str) -> (Option<String>, Option<String>, Option<String>) {
    let w = wwid.trim();
    if let Some(naa) = w.strip_prefix("naa.") {
        let naa = naa.to_ascii_lowercase();
        if naa.len() == 32 {
            let (id, ext) = naa.split_at(16);
            return (
                Some(format!("0x{id}")),
                Some(format!("0x{naa}")),
                Some(format!("0x{ext}")),
            );
        }
        return (Some(format!("0x{naa}")), Some(format!("0x{naa}")), None);
    }
    if w.starts_with("eui.") || w.starts_with("nvme.") {
        return (Some(w.to_string()), Some(w.to_string()), None);
    }
    (None, None, None)
}

/// `sata`, `nvme`, `usb` from the device path; `None` for virtio and the unknown.
pub fn transport(devpath: &str) -> Option<String> {
    let comps: Vec<&str> = devpath.split('/').collect();
    if comps.iter().any(|c| is_usb_interface(c)) {
        Some("usb".into())
    } else if comps
        .iter()
        .any(|c| c.starts_with("ata") && c[3..].parse::<u32>().is_ok())
    {
        Some("sata".into())
    } else if comps.contains(&"nvme") {
        Some("nvme".into())
    } else {
        None
    }
}

/// A USB interface in a sysfs path: `1-2:1.0`, `2-1.4:1.0`.
fn is_usb_interface(c: &str) -> bool {
    let Some((port, cfg)) = c.split_once(':') else {
        return false;
    };
    let Some((bus, ports)) = port.split_once('-') else {
        return false;
    };
    bus.parse::<u32>().is_ok()
        && ports.split('.').all(|p| p.parse::<u32>().is_ok())
        && cfg
            .split_once('.')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
}

/// The `/dev/disk/by-path/…` name udev (systemd 252, Debian 12) gives the disk, computed from
/// its sysfs device path: `pci-0000:00:04.0` (virtio-blk), `pci-0000:00:1f.2-ata-1` (SATA),
/// `pci-0000:01:00.0-nvme-1` (NVMe namespace 1), `pci-0000:00:05.0-scsi-0:0:0:0` (SCSI),
/// `pci-0000:00:14.0-usb-0:2:1.0-scsi-0:0:0:0` (USB). `None` when there is no PCI device.
pub fn by_path(root: &Path, devpath: &str, name: &str, hctl: Option<&str>) -> Option<String> {
    let pci = last_pci(devpath)?;
    let comps: Vec<&str> = devpath.split('/').collect();
    let after: &[&str] = comps
        .iter()
        .position(|c| *c == pci)
        .map(|i| &comps[i + 1..])
        .unwrap_or(&[]);
    let scsi = || {
        hctl.and_then(|h| h.split_once(':'))
            .map(|(_, ctl)| format!("-scsi-0:{ctl}"))
            .unwrap_or_default()
    };
    let mut path = format!("/dev/disk/by-path/pci-{pci}");
    if let Some(ata) = after
        .iter()
        .find(|c| c.starts_with("ata") && c[3..].parse::<u32>().is_ok())
    {
        // udev names the port by its port_no, which is usually the number in ataN.
        let prefix = &comps[..comps.iter().position(|c| c == ata).unwrap_or(0) + 1].join("/");
        let port = read_opt(root, &format!("{prefix}/ata_port/{ata}/port_no"))
            .unwrap_or_else(|| ata[3..].to_string());
        path.push_str(&format!("-ata-{port}"));
    } else if after.contains(&"nvme") {
        let nsid = read_opt(root, &format!("/sys/block/{name}/nsid")).or_else(|| {
            name.rsplit_once('n')
                .map(|(_, n)| n.to_string())
                .filter(|n| n.parse::<u32>().is_ok())
        })?;
        path.push_str(&format!("-nvme-{nsid}"));
    } else if let Some(usb) = after.iter().find(|c| is_usb_interface(c)) {
        let (_, ports) = usb.split_once('-')?;
        path.push_str(&format!("-usb-0:{ports}{}", scsi()));
    } else if hctl.is_some() {
        path.push_str(&scsi());
    }
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::fixture::{link, mkdir, write, write_bytes};

    /// Lays out one block device the way sysfs does: the device directory under /sys/devices,
    /// `/sys/block/<name>` linking to it, and `device` linking to the parent device.
    fn block(root: &Path, devdir: &str, name: &str, sectors: u64, files: &[(&str, &str)]) {
        let dir = format!("{devdir}/block/{name}");
        mkdir(root, &dir);
        write(root, &format!("{dir}/size"), &format!("{sectors}\n"));
        let ups = "../".repeat(3);
        link(
            root,
            &format!("{dir}/device"),
            &format!("{ups}{}", devdir.rsplit('/').next().unwrap()),
        );
        link(
            root,
            &format!("/sys/block/{name}"),
            &format!("..{}", dir.trim_start_matches("/sys")),
        );
        for (f, content) in files {
            write(root, &format!("{dir}/{f}"), content);
        }
    }

    #[test]
    fn disks_table() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        // virtio-blk at 00:04.0 (the QEMU smoke VM's disk).
        block(
            r,
            "/sys/devices/pci0000:00/0000:00:04.0/virtio1",
            "vda",
            2_252_800,
            &[
                ("serial", "PDKRD-SMOKE-1\n"),
                ("queue/rotational", "1\n"),
                ("queue/logical_block_size", "512\n"),
                ("queue/physical_block_size", "512\n"),
            ],
        );
        write(
            r,
            "/sys/devices/pci0000:00/0000:00:04.0/virtio1/vendor",
            "0x1af4\n",
        );
        // A SATA SSD behind AHCI with a VPD serial and a NAA WWN.
        block(
            r,
            "/sys/devices/pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0",
            "sda",
            1_953_525_168,
            &[
                ("queue/rotational", "0\n"),
                ("queue/logical_block_size", "512\n"),
                ("queue/physical_block_size", "4096\n"),
            ],
        );
        let sd = "/sys/devices/pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0";
        write(r, &format!("{sd}/model"), "Samsung SSD 870 \n");
        write(r, &format!("{sd}/vendor"), "ATA     \n");
        write(r, &format!("{sd}/wwid"), "naa.5002538f41234567\n");
        let mut pg80 = vec![0u8, 0x80, 0, 15];
        pg80.extend_from_slice(b"S5SUNF0R123456 ");
        write_bytes(r, &format!("{sd}/vpd_pg80"), &pg80);
        write(
            r,
            "/sys/devices/pci0000:00/0000:00:1f.2/ata3/ata_port/ata3/port_no",
            "3\n",
        );
        // NVMe namespace 1 behind a bridge.
        block(
            r,
            "/sys/devices/pci0000:00/0000:00:1c.0/0000:01:00.0/nvme/nvme0",
            "nvme0n1",
            7_814_037_168,
            &[("wwid", "eui.0025388b91b3c3a1\n"), ("nsid", "1\n")],
        );
        write(
            r,
            "/sys/devices/pci0000:00/0000:00:1c.0/0000:01:00.0/nvme/nvme0/serial",
            "S4EWNX0R  \n",
        );
        write(
            r,
            "/sys/devices/pci0000:00/0000:00:1c.0/0000:01:00.0/nvme/nvme0/model",
            "Samsung SSD 980 PRO 4TB\n",
        );
        // virtio-scsi LUN.
        block(
            r,
            "/sys/devices/pci0000:00/0000:00:05.0/virtio2/host0/target0:0:1/0:0:1:0",
            "sdb",
            8_388_608,
            &[],
        );
        // Skipped: loop, dm, optical, ram.
        for n in ["loop0", "dm-0", "sr0", "ram0", "zram0"] {
            block(r, "/sys/devices/virtual", n, 100, &[]);
        }

        let disks = collect(r).unwrap();
        let got: Vec<_> = disks
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.size,
                    d.rotational,
                    d.model.as_deref(),
                    d.vendor.as_deref(),
                    d.serial.as_deref(),
                    d.wwn.as_deref(),
                    d.hctl.as_deref(),
                    d.by_path.as_deref(),
                    d.tran.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "/dev/nvme0n1",
                    7_814_037_168 * 512,
                    false,
                    Some("Samsung SSD 980 PRO 4TB"),
                    None,
                    Some("S4EWNX0R"),
                    Some("eui.0025388b91b3c3a1"),
                    None,
                    Some("/dev/disk/by-path/pci-0000:01:00.0-nvme-1"),
                    Some("nvme")
                ),
                (
                    "/dev/sda",
                    1_953_525_168 * 512,
                    false,
                    Some("Samsung SSD 870"),
                    Some("ATA"),
                    Some("S5SUNF0R123456"),
                    Some("0x5002538f41234567"),
                    Some("2:0:0:0"),
                    Some("/dev/disk/by-path/pci-0000:00:1f.2-ata-3"),
                    Some("sata")
                ),
                (
                    "/dev/sdb",
                    8_388_608 * 512,
                    false,
                    None,
                    None,
                    None,
                    None,
                    Some("0:0:1:0"),
                    Some("/dev/disk/by-path/pci-0000:00:05.0-scsi-0:0:1:0"),
                    None
                ),
                (
                    "/dev/vda",
                    2_252_800 * 512,
                    true,
                    None,
                    Some("0x1af4"),
                    Some("PDKRD-SMOKE-1"),
                    None,
                    None,
                    Some("/dev/disk/by-path/pci-0000:00:04.0"),
                    None
                ),
            ]
        );
        assert_eq!(
            (disks[1].logical_sectors, disks[1].physical_sectors),
            (Some(512), Some(4096))
        );
    }

    #[test]
    fn a_disk_without_a_size_is_an_error_naming_the_file() {
        let t = tempfile::tempdir().unwrap();
        block(
            t.path(),
            "/sys/devices/pci0000:00/0000:00:04.0/virtio1",
            "vda",
            1,
            &[],
        );
        write(
            t.path(),
            "/sys/devices/pci0000:00/0000:00:04.0/virtio1/block/vda/size",
            "many\n",
        );
        let e = collect(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("/sys/block/vda/size") && e.contains("not a sector count"),
            "{e}"
        );
    }

    #[test]
    fn wwids_and_vpd() {
        let cases = [
            (
                "naa.5000C500A1B2C3D4",
                (Some("0x5000c500a1b2c3d4"), Some("0x5000c500a1b2c3d4"), None),
            ),
            (
                "naa.600508b1001c7e6b2e2b3c0c5f2c1d3a",
                (
                    Some("0x600508b1001c7e6b"),
                    Some("0x600508b1001c7e6b2e2b3c0c5f2c1d3a"),
                    Some("0x2e2b3c0c5f2c1d3a"),
                ),
            ),
            (
                "eui.0025388b91b3c3a1",
                (
                    Some("eui.0025388b91b3c3a1"),
                    Some("eui.0025388b91b3c3a1"),
                    None,
                ),
            ),
            ("t10.ATA     QEMU HARDDISK     QM00001", (None, None, None)),
        ];
        for (w, (a, b, c)) in cases {
            let (x, y, z) = parse_wwid(w);
            assert_eq!((x.as_deref(), y.as_deref(), z.as_deref()), (a, b, c), "{w}");
        }
        assert_eq!(
            vpd_pg80_serial(&[0, 0x80, 0, 4, b'A', b'B', b' ', 0]).as_deref(),
            Some("AB")
        );
        assert_eq!(vpd_pg80_serial(&[0, 0x83, 0, 2, b'A', b'B']), None);
        assert_eq!(vpd_pg80_serial(&[0, 0x80, 0, 9, b'A']), None);
    }

    #[test]
    fn by_path_for_usb_and_no_pci() {
        let r = Path::new("/nonexistent");
        let usb = "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-2/1-2:1.0/host6/target6:0:0/6:0:0:0/block/sdc";
        assert_eq!(
            by_path(r, usb, "sdc", Some("6:0:0:0")).as_deref(),
            Some("/dev/disk/by-path/pci-0000:00:14.0-usb-0:2:1.0-scsi-0:0:0:0")
        );
        assert_eq!(transport(usb).as_deref(), Some("usb"));
        assert_eq!(
            by_path(r, "/sys/devices/virtual/block/md0", "md0", None),
            None
        );
        // No port_no file: the number of ataN.
        let sata = "/sys/devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda";
        assert_eq!(
            by_path(r, sata, "sda", Some("0:0:0:0")).as_deref(),
            Some("/dev/disk/by-path/pci-0000:00:1f.2-ata-1")
        );
    }
}
