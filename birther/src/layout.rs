//! The disk layout: one GPT that boots under either firmware — a BIOS boot partition for
//! GRUB's `i386-pc` core image, an EFI system partition, and a root ext4 filling the rest —
//! planned in sectors, aligned to 1 MiB, and rendered as the exact `sfdisk` script and the
//! `mkfs`/`grub-install` argument vectors a shell-free caller runs.
//!
//! Both boot partitions are always made, whatever firmware booted the ramdisk: a machine
//! switched between legacy BIOS and UEFI still boots its installed system.

use paddock_inventory::Disk;
use serde::{Deserialize, Serialize};

pub const MIB: u64 = 1 << 20;
/// Every partition starts and ends on a 1 MiB boundary (a multiple of any physical sector,
/// erase block or RAID stripe unit worth aligning to; what sfdisk and parted do by default).
pub const ALIGN_BYTES: u64 = MIB;
/// GRUB's core image (`i386-pc`) lives in the BIOS boot partition; 1 MiB holds it with room.
pub const BIOS_BOOT_BYTES: u64 = MIB;
/// The EFI system partition: FAT32 needs at least 65,525 clusters, so with 4 KiB sectors
/// (4Kn disks, one sector per cluster) it must be over 256 MiB once the FATs are counted;
/// 260 MiB is the size that works for both sector sizes (Microsoft's minimum for 4Kn).
pub const ESP_BYTES: u64 = 260 * MIB;
/// The smallest root file system planned: a minimal Debian with its kernel fits, an ext4
/// journal included.
pub const MIN_ROOT_BYTES: u64 = 512 * MIB;
/// A GPT's partition entry array: 128 entries of 128 bytes, at the start and again at the end.
const GPT_ENTRIES_BYTES: u64 = 128 * 128;

pub const BIOS_BOOT_TYPE: &str = "21686148-6449-6E6F-744E-656564454649";
pub const ESP_TYPE: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
pub const LINUX_FS_TYPE: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// The labels the file systems get (FAT: at most 11 characters; ext4: at most 16).
pub const ESP_LABEL: &str = "PADDOCK-ESP";
pub const ROOT_LABEL: &str = "paddock-root";
/// In the target: the first lines GRUB's UEFI image runs ([`efi_early_config`]); under
/// `/boot/grub`, which the image's filter leaves to the machine.
pub const EFI_EARLY_CONFIG: &str = "/boot/grub/paddock-efi.cfg";

/// The config embedded in GRUB's UEFI image: find the root file system by its label, then
/// load `/boot/grub` from it.
pub fn efi_early_config() -> String {
    format!("search --no-floppy --label {ROOT_LABEL} --set=root\nset prefix=($root)/boot/grub\n")
}

/// The ext4 features, named one by one rather than taken from whatever `mke2fs.conf` the
/// ramdisk carries: newer e2fsprogs turn on features (`orphan_file`, `metadata_csum_seed`)
/// that the GRUB of an older image cannot read, and a root GRUB cannot read does not boot.
pub const EXT4_FEATURES: &str = "none,has_journal,ext_attr,resize_inode,dir_index,filetype,extent,flex_bg,sparse_super,large_file,huge_file,dir_nlink,extra_isize,64bit,metadata_csum";

/// What an image must hold for a machine that enforces Secure Boot: each file, and the
/// Debian package that has it.
pub const SIGNED_CHAIN: [(&str, &str); 2] = [
    ("/usr/lib/shim/shimx64.efi.signed", "shim-signed"),
    (
        "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
        "grub-efi-amd64-signed",
    ),
];

/// The firmware that booted the ramdisk (the inventory's `boot.current_boot_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    Bios,
    Uefi,
}

impl Firmware {
    /// IPA's `current_boot_mode`: `bios` or `uefi`.
    pub fn from_boot_mode(mode: &str) -> Option<Firmware> {
        match mode.trim().to_ascii_lowercase().as_str() {
            "bios" => Some(Firmware::Bios),
            "uefi" => Some(Firmware::Uefi),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Firmware::Bios => "bios",
            Firmware::Uefi => "uefi",
        }
    }
}

/// What the layout depends on: the disk's size and its sector sizes, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub size_bytes: u64,
    pub logical_sector: u32,
    pub physical_sector: u32,
}

impl Geometry {
    /// From an inventory disk (`logical_sectors`/`physical_sectors` are the sector sizes as
    /// sysfs gives them); a size not reported is 512 bytes, a physical size not reported the
    /// logical one.
    pub fn of_disk(disk: &Disk) -> Geometry {
        let size = |s: Option<u64>| s.and_then(|s| u32::try_from(s).ok());
        let logical = size(disk.logical_sectors).unwrap_or(512);
        Geometry {
            size_bytes: disk.size,
            logical_sector: logical,
            physical_sector: size(disk.physical_sectors).unwrap_or(logical),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    BiosBoot,
    Esp,
    Root,
}

/// One planned partition; `start` and `size` are in logical sectors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPartition {
    /// 1-based, as in the device name.
    pub number: u32,
    pub role: Role,
    /// The GPT partition name.
    pub name: String,
    pub type_guid: String,
    pub start: u64,
    pub size: u64,
    /// Its block device (`/dev/sda3`, `/dev/nvme0n1p3`, `/dev/disk/by-path/…-part3`).
    pub device: String,
}

/// A program to run without a shell: its argument vector, and what to write to its stdin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

impl Command {
    fn new(argv: &[&str]) -> Command {
        Command {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: None,
        }
    }
}

/// A boot-loader command, and whether the machine can boot without it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootLoaderStep {
    pub command: Command,
    /// `false`: the other firmware's loader, installed when the image carries it (so the
    /// machine still boots after a switch between BIOS and UEFI), its failure only logged.
    pub required: bool,
}

/// The whole plan for one disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub device: String,
    pub firmware: Firmware,
    /// The firmware enforces Secure Boot: the boot loader installed must be the signed chain
    /// (shim, then the image's signed GRUB), never an image made here.
    pub secure_boot: bool,
    pub geometry: Geometry,
    /// Whole logical sectors on the disk.
    pub total_sectors: u64,
    /// The range GPT allows partitions in (sectors outside it hold the tables; sfdisk writes
    /// 2048, its alignment, as the first usable sector in the header).
    pub first_usable: u64,
    pub last_usable: u64,
    /// Partition 1: GRUB's `i386-pc` core image.
    pub bios_boot: PlannedPartition,
    /// Partition 2: the EFI system partition (FAT32).
    pub esp: PlannedPartition,
    /// Partition 3: the root file system (ext4), to the last whole MiB of the disk.
    pub root: PlannedPartition,
    /// The `sfdisk` input (named-fields format) that writes this table.
    pub sfdisk_script: String,
}

/// Why a disk cannot be laid out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "disk {0:?} is not a device path: expected /dev/<name> (letters, digits and / _ . : + - only)"
    )]
    BadDevice(String),
    #[error(
        "sector sizes logical {logical} / physical {physical} bytes are not supported: the logical size must be 512 or 4096 and the physical a power of two from it up to 1 MiB"
    )]
    SectorSize { logical: u32, physical: u32 },
    #[error(
        "disk {device} has {have} bytes ({have_mib} MiB); the layout needs at least {needed} bytes ({needed_mib} MiB: 1 MiB BIOS boot, 260 MiB EFI system, 512 MiB root, the GPT): use a larger disk"
    )]
    TooSmall {
        device: String,
        have: u64,
        have_mib: u64,
        needed: u64,
        needed_mib: u64,
    },
}

fn check_sectors(logical: u32, physical: u32) -> Result<(), LayoutError> {
    let ok = matches!(logical, 512 | 4096)
        && physical.is_power_of_two()
        && physical >= logical
        && u64::from(physical) <= ALIGN_BYTES;
    if ok {
        Ok(())
    } else {
        Err(LayoutError::SectorSize { logical, physical })
    }
}

/// GPT sectors at each end beyond the protective MBR: the header and the entry array.
fn gpt_sectors(logical: u64) -> u64 {
    GPT_ENTRIES_BYTES / logical
}

/// Where the root partition starts, in bytes: after 1 MiB of GPT and alignment, the BIOS
/// boot partition and the EFI system partition.
const ROOT_START_BYTES: u64 = ALIGN_BYTES + BIOS_BOOT_BYTES + ESP_BYTES;

/// The smallest disk (bytes) that holds the layout with a root of `root_bytes` (at least
/// [`MIN_ROOT_BYTES`]), for a logical sector size of `logical` bytes.
pub fn disk_bytes_needed(logical: u32, root_bytes: u64) -> u64 {
    let logical = u64::from(logical.max(1));
    let root = root_bytes
        .max(MIN_ROOT_BYTES)
        .checked_next_multiple_of(ALIGN_BYTES)
        .unwrap_or(u64::MAX);
    // The root's last sector must be usable: after it come the backup entries and header.
    ROOT_START_BYTES
        .saturating_add(root)
        .saturating_add((gpt_sectors(logical) + 1).saturating_mul(logical))
}

/// The root file system an image of `image_bytes` (its files' bytes) needs: the bytes, a
/// tenth more for ext4's inode tables, reserved blocks and directories, and 128 MiB for the
/// journal; at least [`MIN_ROOT_BYTES`].
pub fn root_bytes_for_image(image_bytes: u64) -> u64 {
    image_bytes
        .saturating_add(image_bytes / 10)
        .saturating_add(128 * MIB)
        .max(MIN_ROOT_BYTES)
}

/// The block device of partition `number` of `disk`: `/dev/sda` → `/dev/sda3`, a name ending
/// in a digit (`/dev/nvme0n1`, `/dev/mmcblk0`, `/dev/loop0`) → `…p3`, a udev link
/// (`/dev/disk/by-path/…`) → `…-part3`.
pub fn partition_device(disk: &str, number: u32) -> String {
    if disk.starts_with("/dev/disk/") {
        format!("{disk}-part{number}")
    } else if disk.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{disk}p{number}")
    } else {
        format!("{disk}{number}")
    }
}

fn check_device(device: &str) -> Result<(), LayoutError> {
    let ok = device.len() <= 255
        && device
            .strip_prefix("/dev/")
            .is_some_and(|rest| !rest.is_empty() && !rest.ends_with('/'))
        && device.split('/').all(|p| p != "." && p != "..")
        && device
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_.:+-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(LayoutError::BadDevice(device.chars().take(300).collect()))
    }
}

/// Plans `device` (the whole disk) of `geometry` for a machine whose firmware is `firmware`.
pub fn plan(device: &str, geometry: Geometry, firmware: Firmware) -> Result<Layout, LayoutError> {
    check_device(device)?;
    check_sectors(geometry.logical_sector, geometry.physical_sector)?;
    let l = u64::from(geometry.logical_sector);
    let total = geometry.size_bytes / l;
    let gpt = gpt_sectors(l);
    let first_usable = 2 + gpt;
    let align = ALIGN_BYTES / l;
    let needed = disk_bytes_needed(geometry.logical_sector, MIN_ROOT_BYTES);
    // The last usable sector: before the backup entries and the backup header.
    let Some(last_usable) = total
        .checked_sub(gpt + 2)
        .filter(|_| geometry.size_bytes >= needed)
    else {
        return Err(LayoutError::TooSmall {
            device: device.to_string(),
            have: geometry.size_bytes,
            have_mib: geometry.size_bytes / MIB,
            needed,
            needed_mib: needed.div_ceil(MIB),
        });
    };
    let root_start = ROOT_START_BYTES / l;
    // The root ends on an alignment boundary too, at or before the last usable sector.
    let root_end = (last_usable + 1) / align * align;
    let parts = [
        (
            Role::BiosBoot,
            "paddock-bios",
            BIOS_BOOT_TYPE,
            align,
            BIOS_BOOT_BYTES / l,
        ),
        (
            Role::Esp,
            "paddock-esp",
            ESP_TYPE,
            align + BIOS_BOOT_BYTES / l,
            ESP_BYTES / l,
        ),
        (
            Role::Root,
            "paddock-root",
            LINUX_FS_TYPE,
            root_start,
            root_end - root_start,
        ),
    ];
    let [bios_boot, esp, root] = parts.map(|(role, name, type_guid, start, size)| {
        let number = match role {
            Role::BiosBoot => 1,
            Role::Esp => 2,
            Role::Root => 3,
        };
        PlannedPartition {
            number,
            role,
            name: name.into(),
            type_guid: type_guid.into(),
            start,
            size,
            device: partition_device(device, number),
        }
    });
    let mut script = format!(
        "label: gpt\nunit: sectors\nsector-size: {}\n\n",
        geometry.logical_sector
    );
    for p in [&bios_boot, &esp, &root] {
        script.push_str(&format!(
            "start={}, size={}, type={}, name=\"{}\"\n",
            p.start, p.size, p.type_guid, p.name
        ));
    }
    Ok(Layout {
        device: device.to_string(),
        firmware,
        secure_boot: false,
        geometry,
        total_sectors: total,
        first_usable,
        last_usable,
        bios_boot,
        esp,
        root,
        sfdisk_script: script,
    })
}

impl Layout {
    pub fn partition(&self, role: Role) -> &PlannedPartition {
        match role {
            Role::BiosBoot => &self.bios_boot,
            Role::Esp => &self.esp,
            Role::Root => &self.root,
        }
    }

    /// The partitions in table order.
    pub fn partitions(&self) -> [&PlannedPartition; 3] {
        [&self.bios_boot, &self.esp, &self.root]
    }

    /// `sfdisk` writing the table, the script on its stdin. `--wipe always` and
    /// `--wipe-partitions always` erase old signatures on the disk and in the new partitions,
    /// so no stale file system or RAID superblock is found later.
    pub fn partition_command(&self) -> Command {
        let mut c = Command::new(&[
            "sfdisk",
            "--wipe",
            "always",
            "--wipe-partitions",
            "always",
            &self.device,
        ]);
        c.stdin = Some(self.sfdisk_script.clone());
        c
    }

    /// `mkfs.fat` for the EFI system partition.
    pub fn mkfs_esp(&self) -> Command {
        let sector = self.geometry.logical_sector.to_string();
        Command::new(&[
            "mkfs.fat",
            "-F",
            "32",
            "-S",
            &sector,
            "-n",
            ESP_LABEL,
            &self.esp.device,
        ])
    }

    /// `mkfs.ext4` for the root ([`EXT4_FEATURES`]).
    pub fn mkfs_root(&self) -> Command {
        Command::new(&[
            "mkfs.ext4",
            "-F",
            "-q",
            "-L",
            ROOT_LABEL,
            "-O",
            EXT4_FEATURES,
            &self.root.device,
        ])
    }

    /// What lays the disk out, in order. `reuse_root` (a re-image whose disk holds this
    /// layout with an ext4 root, see [`crate::probe::reuse`]): the table and the root file
    /// system stay, only the EFI system partition is made anew.
    pub fn commands(&self, reuse_root: bool) -> Vec<Command> {
        if reuse_root {
            vec![self.mkfs_esp()]
        } else {
            vec![self.partition_command(), self.mkfs_esp(), self.mkfs_root()]
        }
    }

    /// Installing the image's GRUB from inside the target (mounted at `target`, with the EFI
    /// system partition at `target/boot/efi` and `/dev`, `/proc`, `/sys` bound in): the
    /// loader of the firmware that booted first (required), then the other one (best effort),
    /// then the configuration. The UEFI loader goes to the removable path
    /// (`EFI/BOOT/BOOTX64.EFI`) with no NVRAM entry: firmware finds it without one, and a new
    /// entry would go first in the boot order, ahead of the network boot Paddock relies on
    /// to re-image the machine.
    pub fn boot_loader(&self, target: &str) -> Vec<BootLoaderStep> {
        let bios = Command::new(&[
            "chroot",
            target,
            "grub-install",
            "--target=i386-pc",
            &self.device,
        ]);
        let uefi = Command::new(&[
            "chroot",
            target,
            "grub-install",
            "--target=x86_64-efi",
            "--efi-directory=/boot/efi",
            "--removable",
            "--no-nvram",
        ]);
        // grub-install's removable image names its root relative to the device it was
        // loaded from (`(,gpt3)`); loaded by iPXE from the ESP (the UEFI local boot) that
        // device is unknown and GRUB stops at its rescue prompt. This image finds the root
        // by its label instead, whoever loads it.
        let uefi_image = Command::new(&[
            "chroot",
            target,
            "grub-mkimage",
            "--format=x86_64-efi",
            "--output=/boot/efi/EFI/BOOT/BOOTX64.EFI",
            &format!("--config={EFI_EARLY_CONFIG}"),
            "--prefix=/boot/grub",
            "part_gpt",
            "ext2",
            "search",
            "search_label",
            "normal",
            "configfile",
        ]);
        let step = |command, required| BootLoaderStep { command, required };
        // Under Secure Boot the image's signed shim goes to the removable path, and its
        // signed GRUB beside it with a `grub.cfg` that finds the root by UUID (Debian's
        // grub-install with shim-signed and grub-efi-amd64-signed in the image). The image
        // made above is unsigned: the firmware would refuse it.
        let mut signed = uefi.clone();
        signed.argv.push("--uefi-secure-boot".into());
        let (first, second) = match self.firmware {
            Firmware::Bios => (
                vec![step(bios, true)],
                vec![step(uefi, false), step(uefi_image, false)],
            ),
            Firmware::Uefi if self.secure_boot => {
                (vec![step(signed, true)], vec![step(bios, false)])
            }
            Firmware::Uefi => (
                vec![step(uefi, true), step(uefi_image, true)],
                vec![step(bios, false)],
            ),
        };
        let config = Command::new(&[
            "chroot",
            target,
            "grub-mkconfig",
            "-o",
            "/boot/grub/grub.cfg",
        ]);
        first
            .into_iter()
            .chain(second)
            .chain([step(config, true)])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;

    fn geometry(size_bytes: u64, logical: u32, physical: u32) -> Geometry {
        Geometry {
            size_bytes,
            logical_sector: logical,
            physical_sector: physical,
        }
    }

    /// Checks that hold for every plan: order, alignment, no overlap, inside the usable
    /// range, the root fills the disk to the last aligned MiB, and every command names only
    /// this disk and its partitions.
    fn check_invariants(l: &Layout) {
        let ls = u64::from(l.geometry.logical_sector);
        let align = MIB / ls;
        let mut next = l.first_usable;
        for p in l.partitions() {
            assert_eq!(p.start % align, 0, "{p:?} start aligned");
            assert_eq!(p.size % align, 0, "{p:?} size aligned");
            assert!(p.start >= next, "{p:?} overlaps or precedes the GPT");
            assert!(p.size > 0);
            next = p.start + p.size;
        }
        assert!(
            next - 1 <= l.last_usable,
            "the root ends inside the usable range"
        );
        assert!(
            l.last_usable + 1 - next < align,
            "the root leaves less than 1 MiB unused"
        );
        assert_eq!(l.last_usable, l.total_sectors - 1 - 16384 / ls - 1);
        assert!(
            (l.partition(Role::Root).size * ls) >= MIN_ROOT_BYTES,
            "root at least the minimum"
        );
        let mut all = l.commands(false);
        all.extend(l.boot_loader("/target").into_iter().map(|s| s.command));
        for c in &all {
            for a in c.argv.iter().filter(|a| a.starts_with("/dev/")) {
                assert!(a.starts_with(&l.device), "{c:?} names another device");
            }
        }
    }

    /// Disk sizes × sector sizes × firmware: the partitions (start, size in sectors) or the
    /// error.
    #[test]
    fn layout_table() {
        type Row = (
            &'static str,
            Geometry,
            Result<[(u64, u64); 3], &'static str>,
        );
        let rows: Vec<Row> = vec![
            (
                "tiny: error says how much",
                geometry(100 * MIB, 512, 512),
                Err(
                    "disk /dev/sda has 104857600 bytes (100 MiB); the layout needs at least 811614720 bytes (775 MiB",
                ),
            ),
            (
                "zero bytes",
                geometry(0, 512, 512),
                Err("disk /dev/sda has 0 bytes"),
            ),
            (
                "2 GiB, 512",
                geometry(2 * GIB, 512, 512),
                Ok([(2048, 2048), (4096, 532480), (536576, (2047 - 262) * 2048)]),
            ),
            (
                "2 GiB, 512e (4096 physical): same sectors",
                geometry(2 * GIB, 512, 4096),
                Ok([(2048, 2048), (4096, 532480), (536576, (2047 - 262) * 2048)]),
            ),
            (
                "2 GiB, 4Kn",
                geometry(2 * GIB, 4096, 4096),
                Ok([(256, 256), (512, 66560), (67072, (2047 - 262) * 256)]),
            ),
            (
                "1 TiB, 512",
                geometry(TIB, 512, 512),
                Ok([
                    (2048, 2048),
                    (4096, 532480),
                    (536576, (1024 * 1024 - 1 - 262) * 2048),
                ]),
            ),
            (
                "1 TiB, 4Kn",
                geometry(TIB, 4096, 4096),
                Ok([
                    (256, 256),
                    (512, 66560),
                    (67072, (1024 * 1024 - 1 - 262) * 256),
                ]),
            ),
            (
                "not a whole MiB: the root ends on the last whole MiB",
                geometry(2 * GIB + 3 * MIB / 2 + 7, 512, 512),
                Ok([
                    (2048, 2048),
                    (4096, 532480),
                    (536576, (2048 + 1 - 262) * 2048),
                ]),
            ),
            (
                "logical 1024",
                geometry(2 * GIB, 1024, 1024),
                Err("sector sizes logical 1024 / physical 1024 bytes are not supported"),
            ),
            (
                "physical below logical",
                geometry(2 * GIB, 4096, 512),
                Err("sector sizes logical 4096 / physical 512"),
            ),
            (
                "physical not a power of two",
                geometry(2 * GIB, 512, 3072),
                Err("sector sizes logical 512 / physical 3072"),
            ),
            (
                "physical zero (not reported and not defaulted)",
                geometry(2 * GIB, 512, 0),
                Err("sector sizes logical 512 / physical 0"),
            ),
            (
                "physical over the alignment",
                geometry(2 * GIB, 512, 2 << 20),
                Err("sector sizes logical 512 / physical 2097152"),
            ),
        ];
        for firmware in [Firmware::Bios, Firmware::Uefi] {
            for (what, g, want) in &rows {
                let got = plan("/dev/sda", *g, firmware);
                if let Some((l, want)) = crate::table::row(what, got, *want) {
                    let have: Vec<(u64, u64)> =
                        l.partitions().iter().map(|p| (p.start, p.size)).collect();
                    assert_eq!(have, want, "{what} {firmware:?}");
                    assert_eq!(l.firmware, firmware);
                    check_invariants(&l);
                }
            }
        }
    }

    /// The smallest disk that takes the layout is exactly `disk_bytes_needed`.
    #[test]
    fn the_needed_size_is_exact() {
        for logical in [512u32, 4096] {
            let needed = disk_bytes_needed(logical, 0);
            let l = plan(
                "/dev/sda",
                geometry(needed, logical, logical),
                Firmware::Bios,
            )
            .unwrap();
            assert_eq!(
                l.partition(Role::Root).size * u64::from(logical),
                MIN_ROOT_BYTES
            );
            check_invariants(&l);
            let short = needed - u64::from(logical);
            let e = plan(
                "/dev/sda",
                geometry(short, logical, logical),
                Firmware::Bios,
            )
            .unwrap_err();
            assert!(
                matches!(e, LayoutError::TooSmall { needed: n, .. } if n == needed),
                "{e}"
            );
        }
        assert_eq!(disk_bytes_needed(512, u64::MAX), u64::MAX, "saturates");
        assert_eq!(root_bytes_for_image(0), MIN_ROOT_BYTES);
        assert_eq!(root_bytes_for_image(10 * GIB), 11 * GIB + 128 * MIB);
        assert_eq!(root_bytes_for_image(u64::MAX), u64::MAX);
    }

    #[test]
    fn sfdisk_script_and_mkfs_are_exact() {
        let l = plan("/dev/sda", geometry(2 * GIB, 512, 4096), Firmware::Uefi).unwrap();
        assert_eq!(
            l.sfdisk_script,
            "label: gpt\n\
             unit: sectors\n\
             sector-size: 512\n\
             \n\
             start=2048, size=2048, type=21686148-6449-6E6F-744E-656564454649, name=\"paddock-bios\"\n\
             start=4096, size=532480, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=\"paddock-esp\"\n\
             start=536576, size=3655680, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=\"paddock-root\"\n"
        );
        let cmds = l.commands(false);
        let argv: Vec<String> = cmds.iter().map(|c| c.argv.join(" ")).collect();
        assert_eq!(
            argv,
            [
                "sfdisk --wipe always --wipe-partitions always /dev/sda",
                "mkfs.fat -F 32 -S 512 -n PADDOCK-ESP /dev/sda2",
                &format!("mkfs.ext4 -F -q -L paddock-root -O {EXT4_FEATURES} /dev/sda3"),
            ]
        );
        assert_eq!(cmds[0].stdin.as_deref(), Some(l.sfdisk_script.as_str()));
        assert!(cmds[1..].iter().all(|c| c.stdin.is_none()));
        assert_eq!(l.commands(true), [l.mkfs_esp()], "re-image keeps the root");
        let fourk = plan("/dev/nvme0n1", geometry(TIB, 4096, 4096), Firmware::Bios).unwrap();
        assert_eq!(
            fourk.mkfs_esp().argv.join(" "),
            "mkfs.fat -F 32 -S 4096 -n PADDOCK-ESP /dev/nvme0n1p2"
        );
        assert!(fourk.sfdisk_script.contains("sector-size: 4096\n"));
    }

    #[test]
    fn boot_loader_runs_the_booted_firmware_first() {
        let at = |f| {
            let l = plan("/dev/vda", geometry(2 * GIB, 512, 512), f).unwrap();
            l.boot_loader("/mnt/target")
                .into_iter()
                .map(|s| (s.command.argv.join(" "), s.required))
                .collect::<Vec<_>>()
        };
        let bios = "chroot /mnt/target grub-install --target=i386-pc /dev/vda".to_string();
        let uefi = "chroot /mnt/target grub-install --target=x86_64-efi --efi-directory=/boot/efi --removable --no-nvram".to_string();
        let cfg = "chroot /mnt/target grub-mkconfig -o /boot/grub/grub.cfg".to_string();
        let image = "chroot /mnt/target grub-mkimage --format=x86_64-efi --output=/boot/efi/EFI/BOOT/BOOTX64.EFI --config=/boot/grub/paddock-efi.cfg --prefix=/boot/grub part_gpt ext2 search search_label normal configfile".to_string();
        assert_eq!(
            at(Firmware::Bios),
            [
                (bios.clone(), true),
                (uefi.clone(), false),
                (image.clone(), false),
                (cfg.clone(), true)
            ]
        );
        assert_eq!(
            at(Firmware::Uefi),
            [
                (uefi.clone(), true),
                (image, true),
                (bios.clone(), false),
                (cfg.clone(), true)
            ]
        );
        let mut sb = plan("/dev/vda", geometry(2 * GIB, 512, 512), Firmware::Uefi).unwrap();
        sb.secure_boot = true;
        let steps: Vec<_> = sb
            .boot_loader("/mnt/target")
            .into_iter()
            .map(|s| (s.command.argv.join(" "), s.required))
            .collect();
        assert_eq!(
            steps,
            [
                (format!("{uefi} --uefi-secure-boot"), true),
                (bios, false),
                (cfg, true)
            ]
        );
        assert_eq!(
            efi_early_config(),
            "search --no-floppy --label paddock-root --set=root\nset prefix=($root)/boot/grub\n"
        );
    }

    #[test]
    fn device_names() {
        let cases = [
            ("/dev/sda", 3, "/dev/sda3"),
            ("/dev/vdb", 1, "/dev/vdb1"),
            ("/dev/nvme0n1", 2, "/dev/nvme0n1p2"),
            ("/dev/mmcblk0", 3, "/dev/mmcblk0p3"),
            ("/dev/loop7", 1, "/dev/loop7p1"),
            (
                "/dev/disk/by-path/pci-0000:00:04.0",
                3,
                "/dev/disk/by-path/pci-0000:00:04.0-part3",
            ),
        ];
        for (disk, n, want) in cases {
            assert_eq!(partition_device(disk, n), want);
        }
        let g = geometry(2 * GIB, 512, 512);
        for bad in [
            "",
            "sda",
            "/dev/",
            "/dev/sda/",
            "/dev/../etc/passwd",
            "/dev/sda b",
            "/dev/sda\n",
            "/tmp/disk",
        ] {
            assert!(
                matches!(plan(bad, g, Firmware::Bios), Err(LayoutError::BadDevice(_))),
                "{bad:?}"
            );
        }
        assert!(plan("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", g, Firmware::Bios).is_ok());
    }

    #[test]
    fn firmware_and_geometry_from_the_inventory() {
        assert_eq!(Firmware::from_boot_mode("uefi"), Some(Firmware::Uefi));
        assert_eq!(Firmware::from_boot_mode(" BIOS "), Some(Firmware::Bios));
        assert_eq!(Firmware::from_boot_mode(""), None);
        let d = Disk {
            size: 2 * GIB,
            logical_sectors: Some(4096),
            ..Disk::default()
        };
        assert_eq!(Geometry::of_disk(&d), geometry(2 * GIB, 4096, 4096));
        let d = Disk {
            size: GIB,
            logical_sectors: None,
            physical_sectors: Some(4096),
            ..Disk::default()
        };
        assert_eq!(Geometry::of_disk(&d), geometry(GIB, 512, 4096));
        let d = Disk {
            logical_sectors: Some(u64::MAX),
            ..Disk::default()
        };
        assert_eq!(Geometry::of_disk(&d).logical_sector, 512, "unreadable: 512");
    }
}
