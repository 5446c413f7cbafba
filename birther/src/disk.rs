//! Which disk the image goes on: the node's root device hints, evaluated by
//! `paddock_inventory::hints` as the inspector's `root_disk_selection` hook does (so inspection
//! and birth can never disagree), then checked against what the image needs.

use paddock_inventory::hints::{default_root_disk, disk_matching};
use paddock_inventory::{Disk, Inventory};
use serde_json::Value;

use crate::layout::{self, MIB};

/// Why no disk can take the image. Every message says what the operator can do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DiskChoiceError {
    #[error(
        "the machine reports no disk: check that its disk controller's driver is in the ramdisk, or attach a disk"
    )]
    NoDisk,
    #[error(
        "root device hints must be a JSON object such as {{\"serial\": \"…\"}}, not {0}: fix the node's properties.root_device"
    )]
    BadHints(Value),
    #[error(
        "no disk satisfies the root device hints {hints}; disks: {disks}: fix the node's properties.root_device"
    )]
    NoDiskMatches { hints: Value, disks: String },
    #[error(
        "without root device hints the root disk is the smallest of at least 4 GiB, and there is none; disks: {disks}: set root device hints (properties.root_device) to choose one"
    )]
    NoDefaultDisk { disks: String },
    #[error(
        "disk {name} has {have} bytes ({have_mib} MiB), the image needs {needed} bytes ({needed_mib} MiB) with the boot partitions: choose a larger disk with root device hints (e.g. {{\"size\": \">= {needed_gib}\"}}) or a smaller image"
    )]
    TooSmall {
        name: String,
        have: u64,
        have_mib: u64,
        needed: u64,
        needed_mib: u64,
        needed_gib: u64,
    },
}

/// The disk to lay out: the one the node's root device `hints` choose (`None` or `{}`: the
/// smallest disk of at least 4 GiB, as Ironic), which must hold an image of `image_bytes`
/// (the bytes of its files) with the boot partitions ([`layout::disk_bytes_needed`]).
pub fn choose_root_disk(
    inventory: &Inventory,
    hints: Option<&Value>,
    image_bytes: u64,
) -> Result<Disk, DiskChoiceError> {
    if let Some(h) = hints.filter(|h| !h.is_null() && !h.is_object()) {
        return Err(DiskChoiceError::BadHints(h.clone()));
    }
    if inventory.disks.is_empty() {
        return Err(DiskChoiceError::NoDisk);
    }
    // The posted root_disk (the ramdisk's own guess) has no say here: hints or the default rule.
    let disk = match hints.and_then(Value::as_object).filter(|h| !h.is_empty()) {
        Some(h) => {
            disk_matching(&inventory.disks, h).ok_or_else(|| DiskChoiceError::NoDiskMatches {
                hints: Value::Object(h.clone()),
                disks: list(&inventory.disks),
            })?
        }
        None => {
            default_root_disk(&inventory.disks).ok_or_else(|| DiskChoiceError::NoDefaultDisk {
                disks: list(&inventory.disks),
            })?
        }
    }
    .clone();
    let logical = disk
        .logical_sectors
        .and_then(|s| u32::try_from(s).ok())
        .unwrap_or(512);
    let needed = layout::disk_bytes_needed(logical, layout::root_bytes_for_image(image_bytes));
    if disk.size < needed {
        return Err(DiskChoiceError::TooSmall {
            name: disk.name.clone(),
            have: disk.size,
            have_mib: disk.size / MIB,
            needed,
            needed_mib: needed.div_ceil(MIB),
            needed_gib: needed.div_ceil(1 << 30),
        });
    }
    Ok(disk)
}

/// `name (N MiB)`, for the messages.
fn list(disks: &[Disk]) -> String {
    let names: Vec<String> = disks
        .iter()
        .map(|d| format!("{} ({} MiB)", d.name, d.size / MIB))
        .collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GIB: u64 = 1 << 30;

    fn disk(name: &str, bytes: u64, serial: &str, logical: Option<u64>) -> Disk {
        Disk {
            name: name.into(),
            size: bytes,
            serial: Some(serial.into()),
            logical_sectors: logical,
            ..Disk::default()
        }
    }

    fn inventory(disks: Vec<Disk>) -> Inventory {
        Inventory {
            disks,
            ..Inventory::default()
        }
    }

    /// One row: the disks, the hints, the image's bytes → the disk's name or the start of the
    /// error.
    #[test]
    fn root_disk_table() {
        let three = || {
            vec![
                disk("/dev/vda", 20 * GIB, "AAA", None),
                disk("/dev/vdb", 8 * GIB, "BBB", Some(4096)),
                disk("/dev/vdc", 2 * GIB, "CCC", None),
            ]
        };
        type Row = (
            &'static str,
            Vec<Disk>,
            Option<Value>,
            u64,
            Result<&'static str, &'static str>,
        );
        let cases: Vec<Row> = vec![
            (
                "no hints: smallest ≥ 4 GiB",
                three(),
                None,
                GIB,
                Ok("/dev/vdb"),
            ),
            (
                "empty hints = none",
                three(),
                Some(json!({})),
                GIB,
                Ok("/dev/vdb"),
            ),
            (
                "null hints = none",
                three(),
                Some(Value::Null),
                GIB,
                Ok("/dev/vdb"),
            ),
            (
                "by serial",
                three(),
                Some(json!({"serial": "AAA"})),
                GIB,
                Ok("/dev/vda"),
            ),
            (
                "a hint may choose a disk under 4 GiB",
                three(),
                Some(json!({"name": "/dev/vdc"})),
                GIB,
                Ok("/dev/vdc"),
            ),
            (
                "size operator",
                three(),
                Some(json!({"size": ">= 10"})),
                GIB,
                Ok("/dev/vda"),
            ),
            (
                "no disk",
                vec![],
                None,
                GIB,
                Err("the machine reports no disk"),
            ),
            (
                "no disk, hints given",
                vec![],
                Some(json!({"serial": "AAA"})),
                GIB,
                Err("the machine reports no disk"),
            ),
            (
                "nothing matches",
                three(),
                Some(json!({"serial": "ZZZ"})),
                GIB,
                Err(
                    "no disk satisfies the root device hints {\"serial\":\"ZZZ\"}; disks: /dev/vda (20480 MiB)",
                ),
            ),
            (
                "unknown hint matches nothing",
                three(),
                Some(json!({"colour": "red"})),
                GIB,
                Err("no disk satisfies"),
            ),
            (
                "hints not an object",
                three(),
                Some(json!("/dev/vda")),
                GIB,
                Err("root device hints must be a JSON object"),
            ),
            (
                "no default disk",
                vec![disk("/dev/vdc", 2 * GIB, "CCC", None)],
                None,
                GIB,
                Err("without root device hints the root disk is the smallest of at least 4 GiB"),
            ),
            (
                "default disk too small for the image",
                three(),
                None,
                10 * GIB,
                Err("disk /dev/vdb has 8589934592 bytes (8192 MiB), the image needs"),
            ),
            (
                "hinted disk too small",
                three(),
                Some(json!({"serial": "CCC"})),
                2 * GIB,
                Err("disk /dev/vdc has"),
            ),
        ];
        for (what, disks, hints, image, want) in cases {
            let got = choose_root_disk(&inventory(disks), hints.as_ref(), image);
            if let Some((d, name)) = crate::table::row(what, got, want) {
                assert_eq!(d.name, name, "{what}");
            }
        }
    }

    /// The size check and the layout agree to the byte: a disk of exactly the bytes needed
    /// takes the image, one logical sector less does not, and the error says how much.
    #[test]
    fn too_small_is_exact_and_names_the_need() {
        let image = 3 * GIB;
        for logical in [512u32, 4096] {
            let needed = layout::disk_bytes_needed(logical, layout::root_bytes_for_image(image));
            let d = |bytes| inventory(vec![disk("/dev/sda", bytes, "S", Some(u64::from(logical)))]);
            let hints = json!({"name": "/dev/sda"});
            assert!(choose_root_disk(&d(needed), Some(&hints), image).is_ok());
            let e =
                choose_root_disk(&d(needed - u64::from(logical)), Some(&hints), image).unwrap_err();
            let DiskChoiceError::TooSmall {
                needed: said,
                needed_gib,
                ..
            } = e
            else {
                panic!("{e}")
            };
            assert_eq!(said, needed);
            assert!(
                e.to_string().contains(&format!("\">= {needed_gib}\"")),
                "{e}"
            );
        }
    }
}
