//! The birther: what puts an image on a machine's disk (Dominator's MachineBirthing, which
//! Dominator designed and never built). This crate holds its pure cores — no I/O, no clock
//! (time is passed in), no randomness — so each decision is a function tested with tables;
//! the shell that runs in the ramdisk (mounts, spawning `sfdisk`/`mkfs`/`grub-install`,
//! fs2objectcache, subd, the HTTP reports) translates between these and the world.
//!
//! | module | decides | from |
//! |---|---|---|
//! | [`disk`] | which disk the image goes on ([`choose_root_disk`]) | the inventory, the node's root device hints, the image's size |
//! | [`layout`] | the GPT (BIOS boot, EFI system, root ext4) in sectors, the `sfdisk` script, the `mkfs` and `grub-install` argument vectors ([`plan`]) | the disk's size and sector sizes, the firmware kind |
//! | [`probe`] | what is on the disk now, and whether a re-image keeps the root ([`probe::reuse`]) | `sfdisk --json` and `blkid -o export` output (untrusted: fuzzed) |
//! | [`protocol`] | nothing: the agent's HTTP requests and the appliance's answers (serde types both sides use) | — |
//! | [`state`] | the node's provisioning state and what its boot script serves ([`Provisioning::apply`]) | operator requests, the ramdisk's step reports, the dominator's "synced", the time |
//!
//! # The flow
//!
//! **Fresh install, in one boot.** The machine PXE-boots the inspection ramdisk; the agent
//! posts its inventory; the inspector processes it (its `root_disk_selection` hook records
//! the disk the node's hints choose). If the node has an image by then (the operator's
//! `provision`, or a rule), its record goes `unknown → birth` ([`Event::ProvisionRequested`])
//! and the agent, asking what next, goes on in birth mode without rebooting:
//!
//! 1. `choose_disk` — [`choose_root_disk`] (pure) on the agent's inventory.
//! 2. `partition` — [`plan`] (pure), then the shell runs [`Layout::commands`] (`sfdisk` with
//!    the script on stdin, no shell), reads the table back with `sfdisk --json`
//!    ([`probe::parse_sfdisk_json`], pure) and checks it is the plan ([`probe::mismatch`]).
//! 3. `filesystems` — the `mkfs` commands of the same list; `blkid -o export`
//!    ([`probe::parse_blkid_export`], pure) gives the UUIDs the identity step writes.
//! 4. `start_subd`, `register` — shell: mount root at the target and the EFI system partition
//!    at `target/boot/efi`, start subd on the target, record the machine in the MDB
//!    (hostname, address, RequiredImage).
//! 5. `sync` — the dominator sees an almost empty sub and pushes the image; its "synced"
//!    report is [`Event::SubdSynced`]. Until then nothing may depend on the image's files.
//! 6. `boot_loader` — [`Layout::boot_loader`] (pure argv): the image's own `grub-install`,
//!    the booted firmware's loader first, the other's too when the image carries it.
//! 7. `identity` — shell: hostname, network, subd's configuration and trust material.
//! 8. `hand_over` — the report makes the node `healthy` (its boot script now serves the local
//!    disk), then the ramdisk reboots into the installed system, whose own subd answers
//!    from the same MDB entry.
//!
//! **Re-image.** `paddock node reimage` makes a healthy node `rebirth`; at its next boot it
//! gets the ramdisk in rebirth mode. After `choose_disk` and [`plan`], the shell reads the
//! disk (`sfdisk --json`, `blkid`) and [`probe::reuse`] (pure) decides: the disk holds this
//! very layout with an ext4 root → keep the table and the root ([`Layout::commands`] with
//! `reuse_root`: only the EFI system partition is made anew), mount it, run fs2objectcache on
//! it (`object_cache`: only verified objects remain, under `.subd/objects`), then steps 4–8,
//! and the dominator fetches only what the old system lacked; anything else → laid out
//! afresh, as a birth, with the reason on the timeline.
//!
//! **Clean.** `clean` (from any state) serves the ramdisk in clean mode; it wipes the disk
//! (`wipe`: discard, or the table and signatures overwritten) and [`Event::CleanDone`]
//! returns the node to `unknown`.
//!
//! A failure at any step ([`Event::StepFailed`], or [`Provisioning::expire`] when a run stops
//! reporting) ends in `error` with the step and the message; the node then waits in the
//! inspection ramdisk, which never writes to a disk. Only the chosen disk is ever named in
//! a command ([`Layout`] builds every device path from it).
//!
//! # Dependencies
//!
//! Pure ones only (the agent links this crate): root device hints are evaluated by
//! `paddock_inventory::hints`, the same code the inspector's `root_disk_selection` hook
//! uses, so inspection and birth cannot disagree about the disk.

#[cfg(test)]
mod table;

pub mod disk;
pub mod layout;
pub mod probe;
pub mod protocol;
pub mod state;

pub use disk::{DiskChoiceError, choose_root_disk};
pub use layout::{Command, Firmware, Geometry, Layout, LayoutError, Role, plan};
pub use probe::{PartitionTable, ProbeError, Reuse, Signatures};
pub use state::{
    Event, Operation, Provisioning, Serve, State, Step, Timeouts, Transition, TransitionError,
};
