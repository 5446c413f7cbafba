//! Birth, rebirth and clean: the ramdisk's side of provisioning. The decisions
//! live in `paddock_birther` (disk choice, layout, probe parsers, the state machine) and in
//! this module's pure helpers (the protocol's bodies, subd's argument vector, the files the
//! identity step writes, the clean commands); [`shell`] runs them on the machine.
//!
//! # The appliance's side of the contract
//!
//! * `POST /api/v1/provision/next {"macs": [...]}` → [`Assignment`] (`mode` `null`: nothing
//!   to do).
//! * `POST /api/v1/provision/{node}/report {"event": <paddock_birther::Event>}` (the event as
//!   serde writes it: `{"event": "step_done", "step": "partition"}`).
//! * `POST /api/v1/provision/{node}/register {"address": "<ip>"}`: the appliance writes the
//!   machine's MDB entry; the dominator then pushes the image to the subd this run started.
//! * `GET /api/v1/provision/{node}` → the node's provisioning record, polled until `synced`
//!   ([`sync_status`]).

pub mod client;
pub mod shell;

use paddock_birther::layout::Command;
use paddock_birther::probe::Signatures;
use paddock_birther::{Firmware, Operation};
use serde_json::Value;

/// Where the new root is mounted (its EFI system partition at `TARGET/boot/efi`).
pub const TARGET: &str = "/mnt/target";
/// The static subd of the ramdisk (started on the target, then copied into it).
pub const SUBD_BIN: &str = "/bin/paddock-subd";
/// The static fs2objectcache of the ramdisk (a re-image that keeps the root).
pub const FS2OBJECTCACHE_BIN: &str = "/bin/fs2objectcache";
/// The installed system's subd, its unit, and the link that enables it (the image's filter
/// names these paths, so the dominator never deletes them).
pub const INSTALLED_SUBD: &str = "/var/lib/paddock/paddock-subd";
pub const SUBD_UNIT: &str = "/etc/systemd/system/paddock-subd.service";
pub const SUBD_UNIT_LINK: &str = "/etc/systemd/system/multi-user.target.wants/paddock-subd.service";
/// subd's trust material (`NextAnswer::subd_trust`), in the ramdisk and in the target: the
/// directory (0700), the appliance's CA and subd's certificate (0644), subd's key (0600).
pub const SUBD_TRUST_DIR: &str = "/etc/paddock/subd";
pub const SUBD_CA: &str = "/etc/paddock/subd/ca.pem";
/// Whom subd takes calls from (the CA and the subd CA): `--client-ca`.
pub const SUBD_CLIENTS: &str = "/etc/paddock/subd/clients.pem";
pub const SUBD_CERT: &str = "/etc/paddock/subd/cert.pem";
pub const SUBD_KEY: &str = "/etc/paddock/subd/key.pem";
/// With trust material subd never scans it (so the dominator never deletes it), whatever
/// the image's filter says.
pub const SUBD_TRUST_EXCLUDE: &str = "/etc/paddock/subd(|/.*)$";
/// subd's port when the appliance names none (Dominator's).
pub const DEFAULT_SUBD_PORT: u16 = paddock_birther::protocol::SUBD_PORT;
/// The `PATH` every command runs with (the kernel gives `/init` none): the ramdisk's tools,
/// and in a chroot the image's (`grub-install` is in `/usr/sbin`).
pub const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// How much of a failed command's standard error a report carries.
pub const STDERR_TAIL_BYTES: usize = 1500;

/// The mode of a run, from `paddock.mode=` or the appliance's answer.
pub fn parse_mode(s: &str) -> Option<Operation> {
    match s.trim() {
        "birth" => Some(Operation::Birth),
        "rebirth" => Some(Operation::Rebirth),
        "clean" => Some(Operation::Clean),
        _ => None,
    }
}

/// The protocol's types are the birther's (`paddock_birther::protocol`), shared with the
/// appliance: `provision/next`'s answer is this run's assignment.
pub use paddock_birther::protocol::{
    NextAnswer as Assignment, NextRequest, RegisterRequest as Register, ReportRequest as Report,
    SubdTrust,
};

/// subd's port: the appliance's, or Dominator's when it names none (0).
pub fn subd_port(a: &Assignment) -> u16 {
    if a.subd_port == 0 {
        DEFAULT_SUBD_PORT
    } else {
        a.subd_port
    }
}

/// The host name to write: the appliance's, else the node's name.
pub fn hostname(a: &Assignment) -> String {
    match (a.hostname.trim(), &a.node) {
        ("", Some(node)) => node.clone(),
        (h, _) => h.to_string(),
    }
}

/// Where a run stands, from the record `GET /api/v1/provision/{node}` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncStatus {
    /// The dominator found subd synced to the image.
    Synced,
    /// Not yet: the state and the last step, for the console.
    Waiting(String),
    /// The run is over without this ramdisk: an error (the appliance's message), or the
    /// operator moved the node elsewhere (cleaned it, …).
    Stopped(String),
}

/// Reads the provisioning record: its `state` and `synced`, at the top or under
/// `provisioning`/`record` (the record may come wrapped in the node's answer).
pub fn sync_status(body: &Value) -> SyncStatus {
    let rec = ["provisioning", "record"]
        .iter()
        .find_map(|k| body.get(k).filter(|v| v.get("state").is_some()))
        .unwrap_or(body);
    let state = rec.get("state").and_then(Value::as_str).unwrap_or("");
    let synced = rec.get("synced").and_then(Value::as_bool).unwrap_or(false);
    match state {
        "birth" | "rebirth" if synced => SyncStatus::Synced,
        "birth" | "rebirth" => {
            let last = rec
                .get("last_step")
                .and_then(Value::as_str)
                .unwrap_or("none");
            SyncStatus::Waiting(format!("{state}, last step {last}, not synced yet"))
        }
        "error" => {
            let step = rec.get("step").and_then(Value::as_str).unwrap_or("?");
            let msg = rec
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)");
            SyncStatus::Stopped(format!("the appliance reports step {step} failed: {msg}"))
        }
        "" => SyncStatus::Waiting(format!(
            "no provisioning state in the answer {}",
            clip(&body.to_string(), 200)
        )),
        other => SyncStatus::Stopped(format!(
            "the node is now in state {other}: this run is no longer wanted"
        )),
    }
}

/// What subd's last fetch brought, from its Poll answer (`last_fetch`), for the console: the
/// bytes that crossed the network for this install (a re-image's share of the image); then
/// where the rest of the time went, the update's apply and the last scan (`last_update`,
/// `last_scan`), when subd says.
pub fn fetch_summary(poll: &Value) -> String {
    let f = &poll["last_fetch"];
    let mut out = match (f["objects"].as_u64(), f["bytes"].as_u64()) {
        (Some(objects), Some(bytes)) => format!(
            "subd fetched {objects} objects, {bytes} bytes, in {:.1} s",
            f["seconds"].as_f64().unwrap_or(0.0)
        ),
        _ => "subd fetched nothing: every object was already on the disk".into(),
    };
    if let Some(ms) = poll["last_update"]["total_ms"].as_f64() {
        out.push_str(&format!("; applied in {:.1} s", ms / 1e3));
    }
    let scan = &poll["last_scan"];
    if let (Some(bytes), Some(seconds)) = (scan["bytes"].as_u64(), scan["seconds"].as_f64()) {
        out.push_str(&format!(
            "; its last scan hashed {:.0} MiB in {seconds:.1} s",
            bytes as f64 / f64::from(1u32 << 20)
        ));
        if let Some(n) = scan["vouched"].as_u64().filter(|n| *n > 0) {
            out.push_str(&format!(" ({n} files taken at their fetched hash)"));
        }
    }
    out
}

/// The filter's expressions: its lines without comments and blank lines.
pub fn filter_lines(filter: &[String]) -> Vec<&str> {
    filter
        .iter()
        .flat_map(|l| l.lines())
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect()
}

/// How subd serves: with trust material, TLS with the files [`trust_files`] writes (`--ca`,
/// `--client-ca`, `--cert`, `--key`); without, `--insecure` (an insecure appliance).
pub fn security_args(trusted: bool) -> Vec<&'static str> {
    if trusted {
        vec![
            "--ca",
            SUBD_CA,
            "--client-ca",
            SUBD_CLIENTS,
            "--cert",
            SUBD_CERT,
            "--key",
            SUBD_KEY,
        ]
    } else {
        vec!["--insecure"]
    }
}

/// subd in the ramdisk, keeping the target: on this machine's address (TLS with the trust
/// material, else plain HTTP), the image's filter as its exclusions, triggers and reboots
/// turned into no-ops (nothing of the image runs in the ramdisk; the installed system starts
/// its services itself) and the network and disk at full speed (nothing else runs on the
/// machine).
pub fn subd_argv(
    root: &str,
    address: &str,
    port: u16,
    filter: &[String],
    trusted: bool,
) -> Vec<String> {
    let mut argv: Vec<&str> = vec![SUBD_BIN];
    argv.extend(security_args(trusted));
    let listen = listen_addr(address, port);
    argv.extend([
        "--root",
        root,
        // The steps after the sync mount /dev, /proc and /sys (and efivarfs) in the target
        // for the boot loader's chroot. The scan does not cross mount points, so through the
        // target itself those directories would vanish and the dominator would "make" them
        // again, over the ramdisk's own. A private view of the target's file system alone
        // shows them as the image has them, as on the installed system.
        "--bind-root",
        "--listen",
        &listen,
        "--trigger-command",
        "/bin/busybox true",
        "--reboot-command",
        "/bin/busybox true",
        "--network-percent",
        "100",
        "--scan-percent",
        "100",
        "--cpu-percent",
        "100",
    ]);
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    push_excludes(&mut argv, filter, trusted);
    argv
}

fn push_excludes(argv: &mut Vec<String>, filter: &[String], trusted: bool) {
    let lines = filter_lines(filter);
    if lines.is_empty() {
        // No filter: scan everything rather than Dominator's default exclusions, which the
        // image was not made with.
        argv.push("--no-default-exclusions".into());
    }
    let trust = trusted.then_some(SUBD_TRUST_EXCLUDE);
    for l in lines.into_iter().chain(trust) {
        argv.push("--exclude".into());
        argv.push(l.to_string());
    }
}

/// `host:port`, bracketing an IPv6 address.
pub fn listen_addr(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// One argument of a systemd `ExecStart=` line: double-quoted, with `\` and `"` escaped and
/// `$` and `%` doubled (systemd expands variables and specifiers inside quotes too).
pub fn systemd_quote(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    for c in arg.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '$' => out.push_str("$$"),
            '%' => out.push_str("%%"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The installed system's subd: the copy the birther leaves in `/var/lib/paddock`, on every
/// address, with the image's filter; TLS with the trust material the identity step installs,
/// else `--insecure`.
pub fn installed_subd_argv(port: u16, filter: &[String], trusted: bool) -> Vec<String> {
    let listen = format!("0.0.0.0:{port}");
    let mut argv: Vec<&str> = vec![INSTALLED_SUBD];
    argv.extend(security_args(trusted));
    argv.extend(["--root", "/", "--listen", &listen]);
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    push_excludes(&mut argv, filter, trusted);
    argv
}

/// `/etc/systemd/system/paddock-subd.service`.
pub fn subd_unit(port: u16, filter: &[String], trusted: bool) -> String {
    let exec: Vec<String> = installed_subd_argv(port, filter, trusted)
        .iter()
        .map(|a| systemd_quote(a))
        .collect();
    format!(
        "# Written by the Paddock birther: the subd that keeps this machine on its image.\n\
         [Unit]\n\
         Description=Paddock subd (keeps this machine on its image)\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         ExecStart={}\n\
         Restart=always\n\
         RestartSec=5\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        exec.join(" ")
    )
}

/// A file the identity step writes in the target.
#[derive(Clone, PartialEq, Eq)]
pub enum IdentityFile {
    /// A directory, made (with its parents) and given `mode`.
    Dir {
        path: String,
        mode: u32,
    },
    /// Created with `mode` (never readable by others first, even for a moment).
    File {
        path: String,
        contents: Vec<u8>,
        mode: u32,
    },
    /// Copied from the ramdisk.
    Copy {
        path: String,
        from: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// Never shows a file's contents (one is subd's private key).
impl std::fmt::Debug for IdentityFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdentityFile::Dir { path, mode } => write!(f, "Dir({path}, {mode:o})"),
            IdentityFile::File {
                path,
                contents,
                mode,
            } => write!(f, "File({path}, {} bytes, {mode:o})", contents.len()),
            IdentityFile::Copy { path, from, mode } => write!(f, "Copy({path} ← {from}, {mode:o})"),
            IdentityFile::Symlink { path, target } => write!(f, "Symlink({path} → {target})"),
        }
    }
}

impl IdentityFile {
    pub fn path(&self) -> &str {
        match self {
            IdentityFile::Dir { path, .. }
            | IdentityFile::File { path, .. }
            | IdentityFile::Copy { path, .. }
            | IdentityFile::Symlink { path, .. } => path,
        }
    }
}

/// Why a host name cannot be written.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "host name {0:?} is not a DNS name (letters, digits, '-' and '.', labels of 1–63 characters, at most 253 in all): fix the node's name or MDB hostname"
)]
pub struct BadHostname(pub String);

/// Checks a host name before it goes into `/etc/hostname`.
pub fn check_hostname(name: &str) -> Result<(), BadHostname> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(BadHostname(name.to_string()))
    }
}

/// A systemd machine id: 32 lower-case hex digits, a random UUID's (version 4) bits.
pub fn machine_id(mut random: [u8; 16]) -> String {
    random[6] = (random[6] & 0x0f) | 0x40;
    random[8] = (random[8] & 0x3f) | 0x80;
    random.iter().map(|b| format!("{b:02x}")).collect()
}

/// subd's trust material as files: the directory 0700, the CAs and subd's certificate 0644,
/// subd's key 0600. Written into the ramdisk's own `/etc/paddock/subd` before its subd starts,
/// and into the target's by the identity step.
pub fn trust_files(trust: &SubdTrust) -> Vec<IdentityFile> {
    vec![
        IdentityFile::Dir {
            path: SUBD_TRUST_DIR.into(),
            mode: 0o700,
        },
        IdentityFile::File {
            path: SUBD_CA.into(),
            contents: trust.ca_pem.clone().into_bytes(),
            mode: 0o644,
        },
        IdentityFile::File {
            path: SUBD_CLIENTS.into(),
            // An appliance without a subd CA sent none: its CA alone.
            contents: if trust.client_ca_pem.is_empty() {
                trust.ca_pem.clone()
            } else {
                trust.client_ca_pem.clone()
            }
            .into_bytes(),
            mode: 0o644,
        },
        IdentityFile::File {
            path: SUBD_CERT.into(),
            contents: trust.cert_pem.clone().into_bytes(),
            mode: 0o644,
        },
        IdentityFile::File {
            path: SUBD_KEY.into(),
            contents: trust.key_pem.clone().into_bytes(),
            mode: 0o600,
        },
    ]
}

/// The machine's identity, written in the target after the sync (paths the image's filter
/// leaves alone): its host name, a fresh machine id, subd's binary, its trust material (when
/// the appliance gave some) and its enabled unit; none of the `computed` paths, which the
/// dominator placed in the sync.
pub fn identity_files(
    hostname: &str,
    machine_id: &str,
    port: u16,
    filter: &[String],
    trust: Option<&SubdTrust>,
    computed: &[String],
) -> Vec<IdentityFile> {
    let mut files = vec![
        IdentityFile::File {
            path: "/etc/hostname".into(),
            contents: format!("{hostname}\n").into_bytes(),
            mode: 0o644,
        },
        IdentityFile::File {
            path: "/etc/machine-id".into(),
            contents: format!("{machine_id}\n").into_bytes(),
            mode: 0o444,
        },
        IdentityFile::Copy {
            path: INSTALLED_SUBD.into(),
            from: SUBD_BIN.into(),
            mode: 0o755,
        },
    ];
    files.extend(trust.map(trust_files).unwrap_or_default());
    files.extend([
        IdentityFile::File {
            path: SUBD_UNIT.into(),
            contents: subd_unit(port, filter, trust.is_some()).into_bytes(),
            mode: 0o644,
        },
        IdentityFile::Symlink {
            path: SUBD_UNIT_LINK.into(),
            target: "../paddock-subd.service".into(),
        },
    ]);
    files.retain(|f| !computed.iter().any(|c| c == f.path()));
    files
}

/// The firmware that booted the ramdisk: UEFI when the kernel shows `/sys/firmware/efi`.
pub fn firmware(efi_present: bool) -> Firmware {
    if efi_present {
        Firmware::Uefi
    } else {
        Firmware::Bios
    }
}

/// Where x86 Linux shows the boot parameters the EFI stub filled in.
pub const BOOT_PARAMS: &str = "/sys/kernel/boot_params/data";

/// Whether the firmware enforces Secure Boot, from the kernel's boot parameters: the
/// `secure_boot` byte (offset 0x1ec of `struct boot_params`) is 3 when the EFI stub found it
/// enabled (0 unset, 1 unknown, 2 disabled).
pub fn secure_boot(boot_params: &[u8]) -> bool {
    boot_params.get(0x1ec) == Some(&3)
}

/// A failed command, for the console and the report: its argument vector, how it ended and
/// the tail of its standard error.
pub fn failure_message(argv: &[String], ended: &str, stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let tail = if text.len() > STDERR_TAIL_BYTES {
        let mut at = text.len() - STDERR_TAIL_BYTES;
        while !text.is_char_boundary(at) {
            at += 1;
        }
        format!("…{}", &text[at..])
    } else {
        text.to_string()
    };
    let shown = argv.join(" ");
    if tail.is_empty() {
        format!("`{shown}` {ended} (no standard error)")
    } else {
        format!("`{shown}` {ended}: {tail}")
    }
}

/// `/dev/disk/by-uuid/<UUID>` → the device, for every file system blkid found: there is no
/// udev in the ramdisk, and the image's `grub-mkconfig` names the root by UUID only when that
/// link exists (else `root=/dev/sdX`, which a second disk can change).
pub fn by_uuid_links(signatures: &[Signatures]) -> Vec<(String, String)> {
    signatures
        .iter()
        .filter_map(|s| {
            let uuid = s.uuid()?;
            let dev = s.device()?;
            let uuid_ok = !uuid.is_empty()
                && uuid.len() <= 64
                && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            (uuid_ok && dev.starts_with("/dev/"))
                .then(|| (format!("/dev/disk/by-uuid/{uuid}"), dev.to_string()))
        })
        .collect()
}

/// The partitions of `disk` among the entries of `/sys/class/block` (or `/sys/block/<disk>`):
/// `vda` → `vda1`, `vda2`; `nvme0n1` → `nvme0n1p1`. Sorted, as device paths.
pub fn partitions_of(disk: &str, entries: &[String]) -> Vec<String> {
    let name = disk.rsplit('/').next().unwrap_or(disk);
    let prefix = if name.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{name}p")
    } else {
        name.to_string()
    };
    let mut parts: Vec<(u32, String)> = entries
        .iter()
        .filter_map(|e| {
            let n: u32 = e.strip_prefix(&prefix)?.parse().ok()?;
            Some((n, format!("/dev/{e}")))
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, p)| p).collect()
}

/// What clean runs: every partition's signatures erased, then the disk's (the tables; wipefs
/// erases the backup GPT too), before its first and last MiB are zeroed and it is discarded.
pub fn clean_commands(disk: &str, partitions: &[String]) -> Vec<Command> {
    partitions
        .iter()
        .map(String::as_str)
        .chain([disk])
        .map(|d| Command {
            argv: vec!["wipefs".into(), "-a".into(), d.into()],
            stdin: None,
        })
        .collect()
}

/// `blkdiscard` of the whole disk (failure is ignored: not every device discards).
pub fn discard_command(disk: &str) -> Command {
    Command {
        argv: vec!["blkdiscard".into(), "-f".into(), disk.into()],
        stdin: None,
    }
}

/// The byte ranges clean zeroes: the first and the last MiB (the protective MBR and primary
/// GPT, the backup GPT), or the whole of a smaller disk. `(offset, length)`.
pub fn zero_ranges(size: u64) -> Vec<(u64, u64)> {
    const MIB: u64 = 1 << 20;
    if size <= 2 * MIB {
        return vec![(0, size)];
    }
    vec![(0, MIB), (size - MIB, MIB)]
}

/// At most `max` characters of `s`.
pub fn clip(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_birther::{Event, Step};
    use serde_json::json;

    fn filter() -> Vec<String> {
        [
            "# Written by the birther:",
            "/etc/hostname$",
            "",
            "/var/lib/paddock(|/.*)$",
            "/lost\\+found(|/.*)$",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("birth"), Some(Operation::Birth));
        assert_eq!(parse_mode("rebirth"), Some(Operation::Rebirth));
        assert_eq!(parse_mode(" clean"), Some(Operation::Clean));
        assert_eq!(parse_mode("healthy"), None);
        assert_eq!(parse_mode(""), None);
    }

    #[test]
    fn assignment_reads_the_contract() {
        let a: Assignment = serde_json::from_value(json!({
            "node": "n-1", "mode": "rebirth", "image": "bootable2", "image_bytes": 123,
            "hostname": "web-1", "root_device_hints": {"serial": "S1"}, "subd_port": 6969,
            "filter": ["/etc/hostname$"], "appliance_url": "http://198.18.0.1:8080"
        }))
        .unwrap();
        assert_eq!(a.mode, Some(Operation::Rebirth));
        assert_eq!(a.image.as_deref(), Some("bootable2"));
        assert_eq!(a.image_bytes, 123);
        assert_eq!(subd_port(&a), 6969);
        assert_eq!(hostname(&a), "web-1");
        assert_eq!(a.root_device_hints, Some(json!({"serial": "S1"})));
        let idle: Assignment = serde_json::from_value(
            json!({"node": null, "mode": null, "appliance_url": "http://a"}),
        )
        .unwrap();
        assert_eq!(idle.mode, None);
        assert_eq!(subd_port(&idle), DEFAULT_SUBD_PORT);
        assert_eq!(hostname(&idle), "");
        let unnamed = Assignment {
            node: Some("n-2".into()),
            subd_port: 0,
            ..idle
        };
        assert_eq!(hostname(&unnamed), "n-2");
        assert_eq!(subd_port(&unnamed), DEFAULT_SUBD_PORT);
        assert_eq!(
            serde_json::to_value(NextRequest {
                macs: vec!["52:54:00:12:34:56".into()]
            })
            .unwrap(),
            json!({"macs": ["52:54:00:12:34:56"]})
        );
    }

    #[test]
    fn report_bodies_are_the_birthers_events() {
        let cases = [
            (
                Event::StepDone {
                    step: Step::Partition,
                },
                json!({"event": {"event": "step_done", "step": "partition"}}),
            ),
            (
                Event::StepFailed {
                    step: Step::Filesystems,
                    message: "`mkfs.ext4 …` exited with 1".into(),
                },
                json!({"event": {"event": "step_failed", "step": "filesystems", "message": "`mkfs.ext4 …` exited with 1"}}),
            ),
            (
                Event::StepDone {
                    step: Step::HandOver,
                },
                json!({"event": {"event": "step_done", "step": "hand_over"}}),
            ),
            (Event::CleanDone, json!({"event": {"event": "clean_done"}})),
        ];
        for (event, want) in cases {
            let r = Report { event };
            assert_eq!(serde_json::to_value(&r).unwrap(), want);
            let back: Report = serde_json::from_value(want).unwrap();
            assert_eq!(back, r);
        }
        assert_eq!(
            serde_json::to_value(Register {
                address: "198.18.0.20".into()
            })
            .unwrap(),
            json!({"address": "198.18.0.20"})
        );
    }

    #[test]
    fn sync_status_table() {
        let cases = [
            (
                json!({"state": "birth", "image": "a", "synced": true}),
                SyncStatus::Synced,
            ),
            (
                json!({"provisioning": {"state": "rebirth", "image": "a", "synced": true}}),
                SyncStatus::Synced,
            ),
            (
                json!({"state": "birth", "image": "a", "last_step": "register", "synced": false}),
                SyncStatus::Waiting("birth, last step register, not synced yet".into()),
            ),
            (
                json!({"state": "error", "operation": "birth", "step": "sync", "message": "image a missing"}),
                SyncStatus::Stopped(
                    "the appliance reports step sync failed: image a missing".into(),
                ),
            ),
            (
                json!({"state": "clean"}),
                SyncStatus::Stopped(
                    "the node is now in state clean: this run is no longer wanted".into(),
                ),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(sync_status(&body), want, "{body}");
        }
        assert!(matches!(sync_status(&json!({})), SyncStatus::Waiting(_)));
    }

    #[test]
    fn fetch_summaries() {
        assert_eq!(
            fetch_summary(&json!({"last_fetch": {"objects": 12, "bytes": 3456, "seconds": 1.25}})),
            "subd fetched 12 objects, 3456 bytes, in 1.2 s"
        );
        assert_eq!(
            fetch_summary(&json!({"last_fetch": null})),
            "subd fetched nothing: every object was already on the disk"
        );
        assert_eq!(
            fetch_summary(&json!({
                "last_fetch": {"objects": 1, "bytes": 2, "seconds": 3.0},
                "last_update": {"total_ms": 1530.0},
                "last_scan": {"files": 7, "bytes": 3_145_728, "vouched": 5, "seconds": 0.44},
            })),
            "subd fetched 1 objects, 2 bytes, in 3.0 s; applied in 1.5 s; \
             its last scan hashed 3 MiB in 0.4 s (5 files taken at their fetched hash)"
        );
    }

    #[test]
    fn computed_paths_are_left_to_the_dominator() {
        let all = identity_files("web-1", "id", 6969, &filter(), None, &[]);
        assert!(all.iter().any(|f| f.path() == "/etc/hostname"));
        let computed = ["/etc/hostname".to_string()];
        let some = identity_files("web-1", "id", 6969, &filter(), None, &computed);
        assert!(some.iter().all(|f| f.path() != "/etc/hostname"));
        assert_eq!(some.len(), all.len() - 1);
    }

    #[test]
    fn subd_in_the_ramdisk() {
        let argv = subd_argv(TARGET, "198.18.0.20", 6969, &filter(), false);
        assert_eq!(
            argv.join(" "),
            "/bin/paddock-subd --insecure --root /mnt/target --bind-root --listen 198.18.0.20:6969 \
             --trigger-command /bin/busybox true --reboot-command /bin/busybox true \
             --network-percent 100 --scan-percent 100 --cpu-percent 100 \
             --exclude /etc/hostname$ --exclude /var/lib/paddock(|/.*)$ --exclude /lost\\+found(|/.*)$"
        );
        let none = subd_argv(TARGET, "fd00::5", 7000, &[], false);
        assert!(none.contains(&"[fd00::5]:7000".to_string()));
        assert_eq!(none.last().unwrap(), "--no-default-exclusions");
        // A filter given as one text with newlines is split.
        let joined = subd_argv(TARGET, "10.0.0.1", 1, &["/a$\n# c\n/b$\n".into()], false);
        assert_eq!(
            &joined[joined.len() - 4..],
            ["--exclude", "/a$", "--exclude", "/b$"]
        );
        // With trust material: TLS with the three files instead of --insecure, and the
        // trust directory never scanned.
        let tls = subd_argv(TARGET, "198.18.0.20", 6969, &filter(), true);
        assert_eq!(
            tls.join(" "),
            "/bin/paddock-subd --ca /etc/paddock/subd/ca.pem --client-ca /etc/paddock/subd/clients.pem \
             --cert /etc/paddock/subd/cert.pem --key /etc/paddock/subd/key.pem --root /mnt/target --bind-root \
             --listen 198.18.0.20:6969 \
             --trigger-command /bin/busybox true --reboot-command /bin/busybox true \
             --network-percent 100 --scan-percent 100 --cpu-percent 100 \
             --exclude /etc/hostname$ --exclude /var/lib/paddock(|/.*)$ --exclude /lost\\+found(|/.*)$ \
             --exclude /etc/paddock/subd(|/.*)$"
        );
        assert!(!tls.contains(&"--insecure".to_string()));
        let bare = subd_argv(TARGET, "10.0.0.1", 1, &[], true);
        assert_eq!(
            &bare[bare.len() - 3..],
            ["--no-default-exclusions", "--exclude", SUBD_TRUST_EXCLUDE]
        );
    }

    #[test]
    fn the_installed_subd() {
        assert_eq!(
            installed_subd_argv(6969, &[], false).join(" "),
            "/var/lib/paddock/paddock-subd --insecure --root / --listen 0.0.0.0:6969 \
             --no-default-exclusions"
        );
        assert_eq!(
            installed_subd_argv(7000, &["/etc/hostname$".into()], true).join(" "),
            "/var/lib/paddock/paddock-subd --ca /etc/paddock/subd/ca.pem \
             --client-ca /etc/paddock/subd/clients.pem --cert /etc/paddock/subd/cert.pem --key /etc/paddock/subd/key.pem --root / \
             --listen 0.0.0.0:7000 --exclude /etc/hostname$ --exclude /etc/paddock/subd(|/.*)$"
        );
        let unit = subd_unit(6969, &[], true);
        assert!(
            unit.contains(
                "ExecStart=\"/var/lib/paddock/paddock-subd\" \"--ca\" \"/etc/paddock/subd/ca.pem\" \
                 \"--client-ca\" \"/etc/paddock/subd/clients.pem\" \"--cert\" \"/etc/paddock/subd/cert.pem\" \"--key\" \"/etc/paddock/subd/key.pem\" \
                 \"--root\" \"/\" \"--listen\" \"0.0.0.0:6969\" \"--no-default-exclusions\" \
                 \"--exclude\" \"/etc/paddock/subd(|/.*)$$\"\n"
            ),
            "{unit}"
        );
        assert!(!unit.contains("insecure"));
    }

    #[test]
    fn the_unit_file() {
        let unit = subd_unit(6969, &filter(), false);
        assert_eq!(
            unit,
            "# Written by the Paddock birther: the subd that keeps this machine on its image.\n\
             [Unit]\n\
             Description=Paddock subd (keeps this machine on its image)\n\
             Wants=network-online.target\n\
             After=network-online.target\n\
             \n\
             [Service]\n\
             ExecStart=\"/var/lib/paddock/paddock-subd\" \"--insecure\" \"--root\" \"/\" \"--listen\" \"0.0.0.0:6969\" \
             \"--exclude\" \"/etc/hostname$$\" \"--exclude\" \"/var/lib/paddock(|/.*)$$\" \"--exclude\" \"/lost\\\\+found(|/.*)$$\"\n\
             Restart=always\n\
             RestartSec=5\n\
             \n\
             [Install]\n\
             WantedBy=multi-user.target\n"
        );
        assert_eq!(systemd_quote(r#"a"b%c"#), r#""a\"b%%c""#);
    }

    #[test]
    fn identity() {
        let files = identity_files("web-1", &machine_id([0xff; 16]), 6969, &filter(), None, &[]);
        let paths: Vec<&str> = files.iter().map(IdentityFile::path).collect();
        assert_eq!(
            paths,
            [
                "/etc/hostname",
                "/etc/machine-id",
                INSTALLED_SUBD,
                SUBD_UNIT,
                SUBD_UNIT_LINK
            ]
        );
        assert_eq!(
            files[0],
            IdentityFile::File {
                path: "/etc/hostname".into(),
                contents: b"web-1\n".to_vec(),
                mode: 0o644
            }
        );
        assert_eq!(
            files[1],
            IdentityFile::File {
                path: "/etc/machine-id".into(),
                contents: b"ffffffffffff4fffbfffffffffffffff\n".to_vec(),
                mode: 0o444
            }
        );
        assert_eq!(
            files[4],
            IdentityFile::Symlink {
                path: SUBD_UNIT_LINK.into(),
                target: "../paddock-subd.service".into()
            }
        );
        assert_eq!(machine_id([0; 16]), "00000000000040008000000000000000");
        match &files[3] {
            IdentityFile::File { contents, .. } => {
                assert!(String::from_utf8_lossy(contents).contains("\"--insecure\""))
            }
            f => panic!("{f:?}"),
        }

        // With trust material: the directory and the three files before the unit, which
        // names them.
        let trust = SubdTrust {
            ca_pem: "CA PEM".into(),
            client_ca_pem: String::new(),
            cert_pem: "CERT PEM".into(),
            key_pem: "KEY PEM".into(),
        };
        let tls = identity_files("web-1", "id", 6969, &filter(), Some(&trust), &[]);
        let tls_paths: Vec<&str> = tls.iter().map(IdentityFile::path).collect();
        assert_eq!(
            tls_paths,
            [
                "/etc/hostname",
                "/etc/machine-id",
                INSTALLED_SUBD,
                "/etc/paddock/subd",
                "/etc/paddock/subd/ca.pem",
                "/etc/paddock/subd/clients.pem",
                "/etc/paddock/subd/cert.pem",
                "/etc/paddock/subd/key.pem",
                SUBD_UNIT,
                SUBD_UNIT_LINK
            ]
        );
        assert_eq!(tls[3..8], trust_files(&trust)[..]);
        let modes: Vec<(&str, u32)> = tls[3..8]
            .iter()
            .map(|f| match f {
                IdentityFile::Dir { path, mode } => (path.as_str(), *mode),
                IdentityFile::File {
                    path,
                    contents,
                    mode,
                } => {
                    assert!(!contents.is_empty());
                    (path.as_str(), *mode)
                }
                f => panic!("{f:?}"),
            })
            .collect();
        assert_eq!(
            modes,
            [
                ("/etc/paddock/subd", 0o700),
                ("/etc/paddock/subd/ca.pem", 0o644),
                ("/etc/paddock/subd/clients.pem", 0o644),
                ("/etc/paddock/subd/cert.pem", 0o644),
                ("/etc/paddock/subd/key.pem", 0o600),
            ]
        );
        assert_eq!(
            tls[7],
            IdentityFile::File {
                path: SUBD_KEY.into(),
                contents: b"KEY PEM".to_vec(),
                mode: 0o600
            }
        );
        match &tls[8] {
            IdentityFile::File { contents, .. } => {
                let unit = String::from_utf8_lossy(contents);
                assert!(
                    unit.contains("\"--key\" \"/etc/paddock/subd/key.pem\""),
                    "{unit}"
                );
                assert!(!unit.contains("insecure"), "{unit}");
            }
            f => panic!("{f:?}"),
        }
        // Debug never shows a file's contents (the key).
        let shown = format!("{tls:?}");
        assert!(!shown.contains("KEY PEM"), "{shown}");
        assert!(
            shown.contains("File(/etc/paddock/subd/key.pem, 7 bytes, 600)"),
            "{shown}"
        );

        // Every path the identity step writes is one the bootable images' filter leaves alone.
        let image_filter = [
            "/etc/hostname$",
            "/etc/machine-id$",
            "/var/lib/paddock(|/.*)$",
            "/etc/paddock/subd(|/.*)$",
            "/etc/systemd/system/paddock-subd\\.service$",
            "/etc/systemd/system/multi-user\\.target\\.wants/paddock-subd\\.service$",
        ];
        let f =
            paddock_image::Filter::from_lines(image_filter.iter().map(|s| s.to_string())).unwrap();
        for p in paths.into_iter().chain(tls_paths) {
            assert!(f.matches(p), "{p} is not in the filter");
        }
    }

    #[test]
    fn host_names() {
        for ok in ["web-1", "a", "web-1.example.org", &"a".repeat(63)] {
            assert_eq!(check_hostname(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a..b",
            "a b",
            "a/b",
            "é",
            &"a".repeat(64),
            "a\n",
        ] {
            assert!(check_hostname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn failures_name_the_command_and_the_stderr_tail() {
        let argv: Vec<String> = ["mkfs.ext4", "-F", "/dev/vda3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            failure_message(&argv, "exited with 1", b"mke2fs: No such device\n"),
            "`mkfs.ext4 -F /dev/vda3` exited with 1: mke2fs: No such device"
        );
        assert_eq!(
            failure_message(&argv, "was killed by signal 9", b""),
            "`mkfs.ext4 -F /dev/vda3` was killed by signal 9 (no standard error)"
        );
        let long = format!("{}END", "é".repeat(2000));
        let m = failure_message(&argv, "exited with 1", long.as_bytes());
        assert!(m.ends_with("END") && m.contains('…'));
        assert!(m.len() < STDERR_TAIL_BYTES + 100);
    }

    #[test]
    fn by_uuid() {
        let s = paddock_birther::probe::parse_blkid_export(
            b"DEVNAME=/dev/vda2\nUUID=1A2B-3C4D\nTYPE=vfat\n\nDEVNAME=/dev/vda3\nUUID=0f1e2d3c-aaaa-bbbb-cccc-000000000001\nTYPE=ext4\n\nDEVNAME=/dev/vda1\nPART_ENTRY_TYPE=x\n\nDEVNAME=/dev/vda4\nUUID=../../etc\n",
        )
        .unwrap();
        assert_eq!(
            by_uuid_links(&s),
            [
                (
                    "/dev/disk/by-uuid/1A2B-3C4D".to_string(),
                    "/dev/vda2".to_string()
                ),
                (
                    "/dev/disk/by-uuid/0f1e2d3c-aaaa-bbbb-cccc-000000000001".to_string(),
                    "/dev/vda3".to_string()
                ),
            ]
        );
    }

    #[test]
    fn clean_touches_only_the_disk() {
        let entries: Vec<String> = ["vda", "vda1", "vda10", "vda2", "vdb", "vdb1", "loop0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let parts = partitions_of("/dev/vda", &entries);
        assert_eq!(parts, ["/dev/vda1", "/dev/vda2", "/dev/vda10"]);
        let nvme: Vec<String> = ["nvme0n1", "nvme0n1p1", "nvme0n10", "nvme0n1p2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            partitions_of("/dev/nvme0n1", &nvme),
            ["/dev/nvme0n1p1", "/dev/nvme0n1p2"]
        );
        let cmds: Vec<String> = clean_commands("/dev/vda", &parts)
            .iter()
            .map(|c| c.argv.join(" "))
            .collect();
        assert_eq!(
            cmds,
            [
                "wipefs -a /dev/vda1",
                "wipefs -a /dev/vda2",
                "wipefs -a /dev/vda10",
                "wipefs -a /dev/vda"
            ]
        );
        assert_eq!(
            discard_command("/dev/vda").argv.join(" "),
            "blkdiscard -f /dev/vda"
        );
        const MIB: u64 = 1 << 20;
        assert_eq!(zero_ranges(10 * MIB), [(0, MIB), (9 * MIB, MIB)]);
        assert_eq!(zero_ranges(MIB + 5), [(0, MIB + 5)]);
        assert_eq!(zero_ranges(0), [(0, 0)]);
    }

    #[test]
    fn firmware_from_sysfs() {
        assert_eq!(firmware(true), Firmware::Uefi);
        assert_eq!(firmware(false), Firmware::Bios);
        let mut params = vec![0u8; 4096];
        for (mode, on) in [(0, false), (1, false), (2, false), (3, true)] {
            params[0x1ec] = mode;
            assert_eq!(secure_boot(&params), on, "mode {mode}");
        }
        assert!(!secure_boot(&[]), "no boot parameters: not enforced");
    }
}
