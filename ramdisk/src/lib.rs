//! The Paddock introspection ramdisk.
//!
//! * The **agent** (`paddock-agent`, a static binary that is `/init`): mounts the API file
//!   systems, loads the listed kernel modules, finds the boot NIC (`BOOTIF`), gets an address
//!   by DHCP (busybox `udhcpc`; DHCPv6 of its own, [`dhcp6`], for an appliance at an IPv6 address), collects the inventory in the Ironic Python Agent format
//!   ([`paddock_inventory`]), posts it to `{paddock.url}/v1/continue`, then asks the appliance
//!   what to do next (power off, reboot, wait). It never exits. With `https://` appliance
//!   URLs it first fetches the appliance's CA and checks it against the fingerprint on the
//!   kernel command line ([`trust`]); with an agent token every call carries it.
//! * The **builder** ([`initramfs::build`]): a reproducible gzip'd `newc` cpio with the agent,
//!   busybox and the modules, plus Debian's kernel, extracted into a cache.
//!
//! Pure parts (command line, collectors over a root directory, LLDP, URLs, retry policy,
//! cpio, module resolution) are unit-tested; [`agent`] is the thin shell around them.

pub mod agent;
pub mod api;
pub mod busybox;
pub mod cmdline;
pub mod collect;
pub mod console;
pub mod dhcp6;
pub mod http;
pub mod initramfs;
pub mod lldp;
pub mod provision;
pub mod trust;
