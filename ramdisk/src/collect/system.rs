//! System vendor and firmware (`/sys/class/dmi/id`), boot mode, host name.

use std::path::Path;

use paddock_inventory::{Boot, Firmware, SystemVendor};

use super::{at, read_opt};

const DMI: &str = "/sys/class/dmi/id";

/// `None` on machines without DMI (the directory is missing).
pub fn vendor(root: &Path) -> Option<SystemVendor> {
    if !at(root, DMI).is_dir() {
        return None;
    }
    let f = |name: &str| read_opt(root, &format!("{DMI}/{name}"));
    Some(SystemVendor {
        product_name: f("product_name"),
        serial_number: f("product_serial"),
        manufacturer: f("sys_vendor"),
        firmware: Some(Firmware {
            vendor: f("bios_vendor"),
            version: f("bios_version"),
            build_date: f("bios_date"),
        }),
        extra: Default::default(),
    })
}

/// `uefi` when the kernel was started by EFI firmware, else `bios`.
pub fn boot(root: &Path, pxe_mac: Option<&str>) -> Boot {
    let mode = if at(root, "/sys/firmware/efi").is_dir() {
        "uefi"
    } else {
        "bios"
    };
    Boot {
        current_boot_mode: mode.into(),
        pxe_interface: pxe_mac.map(str::to_string),
    }
}

/// The kernel's host name; the unset `(none)` reads as `localhost`, as IPA reports it.
pub fn hostname(root: &Path) -> String {
    match read_opt(root, "/proc/sys/kernel/hostname") {
        Some(h) if h != "(none)" => h,
        _ => "localhost".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::fixture::{mkdir, write};

    #[test]
    fn vendor_boot_and_hostname() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        assert!(vendor(r).is_none());
        assert_eq!(hostname(r), "localhost");
        for (f, v) in [
            ("sys_vendor", "QEMU"),
            ("product_name", "Standard PC (i440FX + PIIX, 1996)"),
            ("bios_vendor", "SeaBIOS"),
            ("bios_version", "1.16.2-debian-1.16.2-1"),
            ("bios_date", "04/01/2014"),
        ] {
            write(r, &format!("{DMI}/{f}"), &format!("{v}\n"));
        }
        let v = vendor(r).unwrap();
        assert_eq!(v.manufacturer.as_deref(), Some("QEMU"));
        assert_eq!(
            v.product_name.as_deref(),
            Some("Standard PC (i440FX + PIIX, 1996)")
        );
        assert_eq!(v.serial_number, None);
        let fw = v.firmware.unwrap();
        assert_eq!(
            (
                fw.vendor.as_deref(),
                fw.version.as_deref(),
                fw.build_date.as_deref()
            ),
            (
                Some("SeaBIOS"),
                Some("1.16.2-debian-1.16.2-1"),
                Some("04/01/2014")
            )
        );

        let cases = [(false, "bios"), (true, "uefi")];
        for (efi, want) in cases {
            if efi {
                mkdir(r, "/sys/firmware/efi");
            }
            let b = boot(r, Some("52:54:00:12:34:56"));
            assert_eq!(b.current_boot_mode, want);
            assert_eq!(b.pxe_interface.as_deref(), Some("52:54:00:12:34:56"));
        }
        for (content, want) in [
            ("(none)\n", "localhost"),
            ("node-7\n", "node-7"),
            ("\n", "localhost"),
        ] {
            write(r, "/proc/sys/kernel/hostname", content);
            assert_eq!(hostname(r), want);
        }
    }
}
