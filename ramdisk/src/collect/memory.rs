//! Memory: `total` (bytes the OS can use, `/proc/meminfo`) and `physical_mb` (installed MiB:
//! the sum of the SMBIOS type 17 memory devices when the DMI table is readable, else `total`
//! rounded up to a multiple of 128 MiB, which is what the firmware and kernel hide).

use std::path::Path;

use paddock_inventory::Memory;

use super::{CollectError, at, read_req};

pub const DMI_TABLE: &str = "/sys/firmware/dmi/tables/DMI";

pub fn collect(root: &Path) -> Result<Memory, CollectError> {
    let text = read_req(root, "/proc/meminfo")?;
    let total = parse_meminfo_total(&text).ok_or_else(|| CollectError::Parse {
        path: "/proc/meminfo".into(),
        why: "no `MemTotal: <n> kB` line".into(),
    })?;
    let physical_mb = std::fs::read(at(root, DMI_TABLE))
        .ok()
        .and_then(|t| smbios_memory_mb(&t))
        .unwrap_or_else(|| round_up_mb(total));
    Ok(Memory {
        total: Some(total),
        physical_mb: Some(physical_mb),
        extra: Default::default(),
    })
}

/// `MemTotal` in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut it = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") | None => n.checked_mul(1024),
        _ => None,
    }
}

/// Bytes → MiB rounded up to a multiple of 128 MiB.
pub fn round_up_mb(total_bytes: u64) -> u64 {
    let mb = total_bytes.div_ceil(1 << 20);
    mb.div_ceil(128) * 128
}

/// The installed memory in MiB: the sum of the sizes of every SMBIOS type 17 (Memory Device)
/// structure in a raw DMI table. `None` when the table has no populated memory device.
pub fn smbios_memory_mb(table: &[u8]) -> Option<u64> {
    let mut total: u64 = 0;
    let mut i = 0usize;
    while i + 4 <= table.len() {
        let typ = table[i];
        let len = usize::from(table[i + 1]);
        if len < 4 || i + len > table.len() {
            break;
        }
        let s = &table[i..i + len];
        if typ == 17 && len >= 0x0e {
            let size = u16::from_le_bytes([s[0x0c], s[0x0d]]);
            let mb = match size {
                0 | 0xffff => 0, // empty slot / unknown
                0x7fff if len >= 0x20 => u64::from(
                    u32::from_le_bytes([s[0x1c], s[0x1d], s[0x1e], s[0x1f]]) & 0x7fff_ffff,
                ),
                sz if sz & 0x8000 != 0 => u64::from(sz & 0x7fff) / 1024, // KiB granularity
                sz => u64::from(sz),
            };
            total += mb;
        }
        if typ == 127 {
            break;
        }
        // Skip the formatted area, then the string set, which ends with two NULs.
        let mut j = i + len;
        while j + 1 < table.len() && !(table[j] == 0 && table[j + 1] == 0) {
            j += 1;
        }
        i = j + 2;
    }
    (total > 0).then_some(total)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::collect::fixture;

    /// A type 17 structure (SMBIOS 3.x layout, 0x28 bytes) with the given Size and Extended Size.
    pub(crate) fn type17(size: u16, extended: u32, strings: &[&str]) -> Vec<u8> {
        let mut s = vec![0u8; 0x28];
        s[0] = 17;
        s[1] = 0x28;
        s[0x0c..0x0e].copy_from_slice(&size.to_le_bytes());
        s[0x1c..0x20].copy_from_slice(&extended.to_le_bytes());
        push_strings(&mut s, strings);
        s
    }

    fn push_strings(s: &mut Vec<u8>, strings: &[&str]) {
        if strings.is_empty() {
            s.extend_from_slice(&[0, 0]);
        }
        for st in strings {
            s.extend_from_slice(st.as_bytes());
            s.push(0);
        }
        if !strings.is_empty() {
            s.push(0);
        }
    }

    pub(crate) fn structure(typ: u8, len: u8, strings: &[&str]) -> Vec<u8> {
        let mut s = vec![0u8; usize::from(len)];
        s[0] = typ;
        s[1] = len;
        push_strings(&mut s, strings);
        s
    }

    /// What QEMU's SMBIOS for `-m 512` looks like: BIOS, system, one DIMM of 512 MB, end.
    pub(crate) fn qemu_512() -> Vec<u8> {
        let mut t = structure(
            0,
            0x18,
            &["SeaBIOS", "1.16.2-debian-1.16.2-1", "04/01/2014"],
        );
        t.extend(structure(
            1,
            0x1b,
            &["QEMU", "Standard PC (i440FX + PIIX, 1996)", "pc-i440fx-7.2"],
        ));
        t.extend(type17(512, 0, &["DIMM 0", "QEMU"]));
        t.extend(structure(127, 4, &[]));
        t
    }

    #[test]
    fn smbios_type_17_table() {
        let cat = |parts: &[Vec<u8>]| parts.concat();
        let end = structure(127, 4, &[]);
        let cases: Vec<(&str, Vec<u8>, Option<u64>)> = vec![
            ("qemu -m 512", qemu_512(), Some(512)),
            (
                "two DIMMs and an empty slot",
                cat(&[
                    type17(16384, 0, &["A"]),
                    type17(0, 0, &[]),
                    type17(16384, 0, &["B"]),
                    end.clone(),
                ]),
                Some(32768),
            ),
            (
                "extended size (64 GiB)",
                cat(&[type17(0x7fff, 65536, &[]), end.clone()]),
                Some(65536),
            ),
            (
                "KiB granularity",
                cat(&[type17(0x8000 | 2048, 0, &[]), end.clone()]),
                Some(2),
            ),
            (
                "unknown size",
                cat(&[type17(0xffff, 0, &[]), end.clone()]),
                None,
            ),
            (
                "no type 17",
                cat(&[structure(1, 0x1b, &["x"]), end.clone()]),
                None,
            ),
            (
                "after end-of-table ignored",
                cat(&[end.clone(), type17(1024, 0, &[])]),
                None,
            ),
            ("truncated", type17(1024, 0, &[])[..10].to_vec(), None),
            ("empty", vec![], None),
        ];
        for (what, table, want) in cases {
            assert_eq!(smbios_memory_mb(&table), want, "{what}");
        }
    }

    #[test]
    fn meminfo_and_rounding() {
        let cases = [
            (
                "MemTotal:         470268 kB\nMemFree: 1 kB\n",
                Some(470268 * 1024),
            ),
            ("MemFree: 1 kB\nMemTotal: 2048 kB\n", Some(2048 * 1024)),
            ("MemFree: 1 kB\n", None),
            ("MemTotal: lots kB\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_meminfo_total(text), want, "{text}");
        }
        let rounding = [
            (470268 * 1024, 512),
            (512 << 20, 512),
            ((512 << 20) + 1, 640),
            (1, 128),
            (2_105_864_192, 2048),
        ];
        for (bytes, mb) in rounding {
            assert_eq!(round_up_mb(bytes), mb, "{bytes}");
        }
    }

    #[test]
    fn physical_mb_from_dmi_else_rounded_total() {
        let t = tempfile::tempdir().unwrap();
        fixture::write(t.path(), "/proc/meminfo", "MemTotal:         470268 kB\n");
        let m = collect(t.path()).unwrap();
        assert_eq!((m.total, m.physical_mb), (Some(470268 * 1024), Some(512)));
        let mut big = type17(0x7fff, 65536, &[]);
        big.extend(structure(127, 4, &[]));
        fixture::write_bytes(t.path(), DMI_TABLE, &big);
        assert_eq!(collect(t.path()).unwrap().physical_mb, Some(65536));
        fixture::write(t.path(), "/proc/meminfo", "nothing\n");
        assert!(
            collect(t.path())
                .unwrap_err()
                .to_string()
                .contains("MemTotal")
        );
    }
}
