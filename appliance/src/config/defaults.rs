//! Every default of the sections the configuration module defines itself, once; the domains
//! that define their own sections (`dhcp`, `dhcp6`, `dns`, `roles`) keep theirs beside their
//! keys. Validation reads them from here and the file's documentation points here. The
//! inspector's own defaults (auto-enrolment, the introspection timeout of 3600 s, the 4 MiB
//! body limit, poweroff after inspection) and the timeline's (entries kept) are the inspector
//! crate's `InspectorConfig::default()` and `TimelineLimits::default()`, read as they are,
//! never restated.

pub const DATA_DIR: &str = "/var/lib/paddock";
pub const LOG_FORMAT: &str = "human";
pub const HTTP_LISTEN: &str = "0.0.0.0:8080";

pub const TFTP_ENABLED: bool = true;
/// Debian's `shim-signed`: shim signed by the UEFI CA that firmware trusts.
pub const SECURE_BOOT_SHIM: &str = "/usr/lib/shim/shimx64.efi.signed";
/// Debian's `grub-efi-amd64-signed`: the network GRUB, signed by Debian (shim trusts it).
pub const SECURE_BOOT_GRUB: &str = "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed";
/// `[boot.arm64]`: names under the assets directory, as `scripts/build-ramdisk.sh --arch
/// aarch64` lays them out (Debian's signed arm64 network GRUB, kernel and our initrd).
pub const ARM64_GRUB: &str = "aarch64/grubaa64.efi";
pub const ARM64_KERNEL: &str = "aarch64/vmlinuz";
pub const ARM64_INITRD: &str = "aarch64/initrd.img";
/// The serial console of arm64 servers and QEMU's `virt` machine (PL011).
pub const ARM64_CMDLINE: &str = "console=ttyAMA0";
pub const TFTP_LISTEN: &str = "0.0.0.0:69";
pub const TFTP_MAX_TRANSFERS: usize = 4096;
/// Seconds (at least 1).
pub const TFTP_TIMEOUT_SECS: u64 = 3;

/// Seconds between checks for introspections that timed out.
pub const INSPECTOR_CLEAN_UP_PERIOD_SECS: u64 = 10;

pub const FIREWALL_ENABLED: bool = false;
/// Seconds (1 to 15).
pub const FIREWALL_RECONCILE_SECS: u64 = 10;

/// The image directory under `data_dir`.
pub const IMAGES_SUBDIR: &str = "images";
pub const IMAGES_MDB_POLL_SECS: u64 = 2;
pub const IMAGES_RECORD_ENROLLED: bool = true;
pub const IMAGES_EXPIRE_CHECK_SECS: u64 = 60;

pub const TIMELINE_PRUNE_EVERY_SECS: u64 = 60;

/// Seconds a provisioning run may go without a report once its ramdisk has reported.
pub const PROVISIONING_STEP_TIMEOUT_SECS: u64 = 30 * 60;
/// Seconds from `register` until the dominator finds subd synced.
pub const PROVISIONING_SYNC_TIMEOUT_SECS: u64 = 2 * 60 * 60;

pub const DOMINATOR_ENABLED: bool = true;
/// subd's default port (Dominator's).
pub const DOMINATOR_SUBD_PORT: u16 = 6969;
pub const DOMINATOR_MAX_UPDATES: usize = 2;
pub const DOMINATOR_MAX_POLLS: usize = 200;
pub const DOMINATOR_POLL_INTERVAL_MS: u64 = 1_000;
pub const DOMINATOR_FETCH_SPEED_PERCENT: f64 = 10.0;
/// At most `max(1, floor(0.1 × subs))` updates with a high-impact or reboot trigger at once.
pub const DOMINATOR_HIGH_IMPACT_SHARE: f64 = 0.1;
/// Dominator asks its disruption manager again a minute after a denial.
pub const DOMINATOR_DISRUPTION_RETRY_SECS: u64 = 60;
pub const DOMINATOR_DISRUPTION_TIMEOUT_SECS: u64 = 30;

pub const CLUSTER_STORE: &str = "sqlite";
/// Seconds (2 to 60).
pub const CLUSTER_LEASE_TTL_SECS: u64 = 3;
/// This host's name when neither the file nor the kernel names it.
pub const CLUSTER_HOST: &str = "paddock";

/// `[security] dir` under `data_dir`.
pub const SECURITY_SUBDIR: &str = "certs";
/// The HTTPS port when `[security] listen` is not set.
pub const SECURITY_PORT: u16 = 8443;
pub const SECURITY_INSPECTOR_NOAUTH: bool = false;
/// Thirty minutes: an unclaimed agent token's life, and the longest pause between a claimed
/// one's uses.
pub const SECURITY_AGENT_TOKEN_TTL_SECS: u64 = 30 * 60;
/// A rack of 2,000 machines powered on together, each holding a connection while it waits
/// for an asset lane (`bench/storm.sh`), with room to spare.
pub const SECURITY_MAX_CONNECTIONS: usize = 4096;
pub const SECURITY_HEADER_TIMEOUT_SECS: u64 = 10;
/// A machine fetching its boot files holds a few connections; 128 leaves room for a NAT.
pub const HTTP_MAX_CONNECTIONS_PER_SOURCE: usize = 128;
/// 1 KiB/s: a ten-second stall after the grace is cut; any real upload is far faster.
pub const HTTP_MIN_BODY_RATE: u64 = 1024;
/// Ten seconds: an API call answers well within it, and a supervisor's stop timeout
/// (systemd's is 90 s) is far longer.
pub const HTTP_SHUTDOWN_GRACE_SECS: u64 = 10;
/// Above the dominator's and the agents' call intervals, so that they keep their connections
/// (and pay no TLS handshake per call), and above the 90 s the dominator's own client keeps
/// an idle connection, so that the client, not the server, closes it (a call never races
/// the server's close).
pub const HTTP_IDLE_TIMEOUT_SECS: u64 = 120;
/// Enough 1 Gb/s clients to fill a 25 Gb/s server link; `bench/storm.sh` measured 8 to 32
/// lanes best on a veth pair with two cores (and all at once slowest).
pub const HTTP_ASSET_LANES: usize = 32;

// Defaults of the sections a domain defines, where that domain keeps them.
pub use crate::power::{POWER_INTERVAL_SECS, POWER_MAX_POWER_ONS, POWER_SYNC_SECS};
pub use crate::roles::{
    ROLES_DEBOUNCE_MS, ROLES_HOOK_TIMEOUT_SECS, ROLES_QUARANTINE_SECS, ROLES_REGISTER_GRACE_SECS,
    ROLES_ROUND_SECS,
};
