//! The run itself: every command from the birther's plan (no shell; each argument vector is
//! built by `paddock_birther::Layout` or by [`super`]), the mounts, subd, the chroot, the
//! identity files, the reports. Each step reports `StepDone`, or `StepFailed` with the
//! command and the tail of its standard error, and the run stops there.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::reboot::{RebootMode, reboot};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use paddock_birther::layout::{Command, Layout, Role};
use paddock_birther::probe::{self, Reuse};
use paddock_birther::{Event, Firmware, Geometry, Operation, Step, choose_root_disk, plan};
use paddock_inventory::{Disk, Inventory};

use super::client::{self, CallError};
use super::{
    Assignment, BOOT_PARAMS, IdentityFile, PATH, SyncStatus, TARGET, by_uuid_links, check_hostname,
    clean_commands, discard_command, failure_message, firmware, hostname, identity_files,
    machine_id, partitions_of, secure_boot, subd_argv, subd_port, sync_status, trust_files,
    zero_ranges,
};
use crate::console::Console;
use crate::http::{Client, Transport, Url};

/// How long subd may take to listen, partitions to appear.
const SUBD_START: Duration = Duration::from_secs(120);
const PARTITIONS_APPEAR: Duration = Duration::from_secs(15);
/// How long the appliance may hold a read of the record while the run waits for the sync
/// (it answers as soon as the record changes).
const SYNC_WAIT: Duration = Duration::from_secs(5);
/// The least time between two reads of the record (an appliance that answers at once).
const SYNC_POLL: Duration = Duration::from_secs(1);
const SYNC_PROGRESS: Duration = Duration::from_secs(30);
const SUBD_LOG: &str = "/run/paddock/subd.log";

/// A step that failed, with the message the report and the console carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub step: Step,
    pub message: String,
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} failed: {}", self.step.as_str(), self.message)
    }
}

fn fail<T>(step: Step, message: impl std::fmt::Display) -> Result<T, StepError> {
    Err(StepError {
        step,
        message: message.to_string(),
    })
}

/// What went wrong running a command or touching the target's disks and files; each names
/// the command, the device or the path.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("an empty command")]
    EmptyCommand,
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("waiting for `{command}`: {source}")]
    Wait {
        command: String,
        source: std::io::Error,
    },
    /// The command ran and failed; `output` is its standard error, or its standard output
    /// when it wrote nothing on standard error.
    #[error("{}", failure_message(argv, &ended(*status), output))]
    Failed {
        argv: Vec<String>,
        status: std::process::ExitStatus,
        output: Vec<u8>,
    },
    #[error("{command} has no stdout")]
    NoStdout { command: String },
    #[error("busybox {command} {status}: {stderr}")]
    Busybox {
        command: &'static str,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("mkdir {path}: {source}")]
    Mkdir {
        path: String,
        source: std::io::Error,
    },
    #[error("chmod {path}: {source}")]
    Chmod {
        path: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("copying {from} to {to}: {source}")]
    Copy {
        from: String,
        to: String,
        source: std::io::Error,
    },
    #[error("linking {path} → {to}: {source}")]
    Symlink {
        path: String,
        to: String,
        source: std::io::Error,
    },
    /// `args` as `mount` would take them (`-t ext4 DEV DIR`, `--bind FROM DIR`).
    #[error("mount {args}: {source}")]
    Mount {
        args: String,
        source: nix::errno::Errno,
    },
    #[error("umount {path}: {source}")]
    Unmount {
        path: String,
        source: nix::errno::Errno,
    },
    /// `what` is the operation on the device (opening, sizing, seeking, zeroing, flushing).
    #[error("{what} {device}: {source}")]
    Device {
        what: &'static str,
        device: String,
        source: std::io::Error,
    },
    #[error("the table is written but {} did not appear within {} s", missing.join(", "), waited.as_secs())]
    PartitionsMissing {
        missing: Vec<String>,
        waited: Duration,
    },
    #[error(transparent)]
    Probe(#[from] probe::ProbeError),
    #[error(transparent)]
    DiskChoice(#[from] paddock_birther::DiskChoiceError),
    #[error(transparent)]
    Layout(#[from] paddock_birther::layout::LayoutError),
}

/// How a process ended, for [`ShellError::Failed`].
fn ended(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(c) => format!("exited with {c}"),
        None => format!("ended by {status}"),
    }
}

/// Runs `cmd` without a shell: a clean environment (`PATH`, `LC_ALL=C`), its stdin from the
/// plan, its output captured. A failure names the argument vector and the end of stderr.
pub fn run(cmd: &Command) -> Result<Vec<u8>, ShellError> {
    let Some((program, args)) = cmd.argv.split_first() else {
        return Err(ShellError::EmptyCommand);
    };
    let mut p = Process::new(program);
    p.args(args)
        .env_clear()
        .env("PATH", PATH)
        .env("LC_ALL", "C")
        .env("HOME", "/root")
        .stdin(if cmd.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = p.spawn().map_err(|source| ShellError::Spawn {
        command: cmd.argv.join(" "),
        source,
    })?;
    if let (Some(input), Some(mut w)) = (&cmd.stdin, child.stdin.take()) {
        // A program that exits without reading all of it fails below with its own message.
        let _ = w.write_all(input.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|source| ShellError::Wait {
            command: cmd.argv.join(" "),
            source,
        })?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        // Some tools (mkfs.fat, sfdisk) say why on stdout.
        let mut output = out.stderr;
        if output.iter().all(u8::is_ascii_whitespace) {
            output = out.stdout;
        }
        Err(ShellError::Failed {
            argv: cmd.argv.clone(),
            status: out.status,
            output,
        })
    }
}

fn cmd(argv: &[&str]) -> Command {
    Command {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: None,
    }
}

/// One run in the ramdisk.
pub struct Run<'a> {
    pub console: &'a Console,
    pub client: &'a mut dyn Transport,
    pub assignment: Assignment,
    /// The node's UUID (the routes' `{node}`).
    pub node: String,
    pub inventory: Inventory,
    /// This machine's DHCP address (subd listens on it; the MDB records it).
    pub address: String,
    /// subd, while it runs.
    subd: Option<Child>,
    /// Mounted by this run, innermost last.
    mounts: Vec<String>,
}

/// How a run ended well: what the machine does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Reboot,
    PowerOff,
}

impl<'a> Run<'a> {
    pub fn new(
        console: &'a Console,
        client: &'a mut dyn Transport,
        assignment: Assignment,
        inventory: Inventory,
        address: String,
    ) -> Self {
        Run {
            console,
            client,
            node: assignment.node.clone().unwrap_or_default(),
            assignment,
            inventory,
            address,
            subd: None,
            mounts: Vec::new(),
        }
    }

    fn say(&self, msg: &str) {
        self.console.say(msg);
    }

    /// Runs the assigned operation to its end. On a failure the step is reported failed (if
    /// the appliance can be reached), subd is stopped, and the error comes back for the
    /// console; nothing more is done.
    pub fn execute(&mut self) -> Result<Finish, StepError> {
        let op = self.assignment.mode.unwrap_or(Operation::Birth);
        self.say(&format!(
            "{} of node {} (image {}) begins",
            op.as_str(),
            self.node,
            self.assignment.image.as_deref().unwrap_or("-")
        ));
        if self.node.is_empty() {
            let message = "the appliance assigned a run but named no node".to_string();
            self.say(&message);
            return fail(Step::ChooseDisk, message);
        }
        let result = match op {
            Operation::Clean => self.clean(),
            Operation::Birth | Operation::Rebirth => self.birth(op),
        };
        if let Err(e) = &result {
            self.stop_subd();
            self.say(&format!("{e}"));
            let ev = Event::StepFailed {
                step: e.step,
                message: e.message.clone(),
            };
            if let Err(r) = self.report_event(&ev, 10) {
                self.say(&format!("(the failure could not be reported: {r})"));
            }
        }
        result
    }

    fn report_event(&mut self, ev: &Event, tries: u32) -> Result<(), CallError> {
        let console = self.console;
        client::report(&mut *self.client, &self.node, ev, tries, &mut |d, why| {
            console.say(&format!(
                "report failed ({why}); retrying in {} s",
                d.as_secs()
            ));
            std::thread::sleep(d);
        })
    }

    /// Reports `step` done. Retried until the appliance answers; a refusal stops the run (the
    /// appliance no longer wants it).
    fn done(&mut self, step: Step, detail: &str) -> Result<(), StepError> {
        self.say(&format!("step {}: done{detail}", step.as_str()));
        match self.report_event(&Event::StepDone { step }, 0) {
            Ok(()) => Ok(()),
            Err(e) => fail(step, format!("the appliance refused the report: {e}")),
        }
    }

    fn choose(&self, step: Step, image_bytes: u64) -> Result<Disk, StepError> {
        let hints = self.assignment.root_device_hints.as_ref();
        choose_root_disk(&self.inventory, hints, image_bytes).or_else(|e| fail(step, e.to_string()))
    }

    fn birth(&mut self, op: Operation) -> Result<Finish, StepError> {
        let Some(image) = self.assignment.image.clone() else {
            return fail(
                Step::ChooseDisk,
                "the appliance assigned no image to install",
            );
        };
        let hostname = hostname(&self.assignment);
        check_hostname(&hostname).or_else(|e| fail(Step::ChooseDisk, e.to_string()))?;

        // choose_disk
        let disk = self.choose(Step::ChooseDisk, self.assignment.image_bytes)?;
        let fw = firmware(Path::new("/sys/firmware/efi").exists());
        let mut layout = plan(&disk.name, Geometry::of_disk(&disk), fw)
            .or_else(|e| fail(Step::ChooseDisk, e.to_string()))?;
        layout.secure_boot =
            fw == Firmware::Uefi && secure_boot(&std::fs::read(BOOT_PARAMS).unwrap_or_default());
        self.done(
            Step::ChooseDisk,
            &format!(
                ": {} ({} MiB), {} firmware{}, image {image} ({} bytes)",
                disk.name,
                disk.size >> 20,
                fw.as_str(),
                if layout.secure_boot {
                    " enforcing Secure Boot"
                } else {
                    ""
                },
                self.assignment.image_bytes
            ),
        )?;

        // Re-image: keep the root when the disk holds this very layout with ext4 on it.
        let reuse = op == Operation::Rebirth && self.keeps_root(&layout);
        let commands = layout.commands(reuse);
        let (partition, filesystems): (Vec<Command>, Vec<Command>) = commands
            .into_iter()
            .partition(|c| c.argv.first().is_some_and(|p| p == "sfdisk"));

        // partition
        if !reuse {
            for c in &partition {
                run(c).or_else(|e| fail(Step::Partition, e))?;
            }
            self.wait_for_partitions(&layout)?;
            let table = read_table(&layout.device)
                .or_else(|e| fail(Step::Partition, e))?
                .ok_or_else(|| StepError {
                    step: Step::Partition,
                    message: format!(
                        "sfdisk wrote the table but `sfdisk --json {}` finds none",
                        layout.device
                    ),
                })?;
            if let Some(m) = probe::mismatch(&layout, &table) {
                return fail(
                    Step::Partition,
                    format!("the table read back is not the plan: {m}"),
                );
            }
            self.done(
                Step::Partition,
                &format!(": GPT on {}, checked", layout.device),
            )?;
        }

        // filesystems
        for c in &filesystems {
            run(c).or_else(|e| fail(Step::Filesystems, e))?;
        }
        self.link_uuids(&layout);
        self.done(
            Step::Filesystems,
            if reuse {
                ": EFI system partition made anew, root kept"
            } else {
                ": FAT32 EFI system partition, ext4 root"
            },
        )?;

        // Mount the root; a kept root becomes an object cache first.
        let root_dev = layout.partition(Role::Root).device.clone();
        let esp_dev = layout.partition(Role::Esp).device.clone();
        self.mount_fs(&root_dev, TARGET, "ext4")
            .or_else(|e| fail(Step::Filesystems, e))?;
        if reuse {
            let started = Instant::now();
            let out = run(&cmd(&[super::FS2OBJECTCACHE_BIN, TARGET]))
                .or_else(|e| fail(Step::ObjectCache, e))?;
            let summary = String::from_utf8_lossy(&out);
            let first = summary.lines().next().unwrap_or("").to_string();
            self.done(
                Step::ObjectCache,
                &format!(": {first} ({:.1} s)", started.elapsed().as_secs_f64()),
            )?;
        }
        let efi = format!("{TARGET}/boot/efi");
        std::fs::create_dir_all(&efi)
            .or_else(|e| fail(Step::Filesystems, format!("mkdir {efi}: {e}")))?;
        self.mount_fs(&esp_dev, &efi, "vfat")
            .or_else(|e| fail(Step::Filesystems, e))?;

        // start_subd, register, sync
        self.start_subd()?;
        self.done(
            Step::StartSubd,
            &format!(
                ": paddock-subd on {}:{}",
                self.address,
                subd_port(&self.assignment)
            ),
        )?;
        let console = self.console;
        let address = self.address.clone();
        client::register(&mut *self.client, &self.node, &address, 0, &mut |d, why| {
            console.say(&format!(
                "register failed ({why}); retrying in {} s",
                d.as_secs()
            ));
            std::thread::sleep(d);
        })
        .or_else(|e| fail(Step::Register, e.to_string()))?;
        // The appliance records the register step done itself.
        self.say(&format!("step register: done: {address} in the MDB"));
        self.wait_synced(&image)?;

        // boot_loader, identity
        self.boot_loader(&layout)?;
        self.done(Step::BootLoader, "")?;
        let mut random = [0u8; 16];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .or_else(|e| fail(Step::Identity, format!("reading /dev/urandom: {e}")))?;
        let trust = self.assignment.subd_trust.as_ref();
        let files = identity_files(
            &hostname,
            &machine_id(random),
            subd_port(&self.assignment),
            &self.assignment.filter,
            trust,
            &self.assignment.computed,
        );
        for f in &files {
            write_identity(TARGET, f).or_else(|e| fail(Step::Identity, e))?;
        }
        self.done(
            Step::Identity,
            &format!(
                ": host name {hostname}, paddock-subd enabled ({})",
                if trust.is_some() {
                    "TLS, trusting only the appliance"
                } else {
                    "insecure"
                }
            ),
        )?;

        // hand_over
        self.stop_subd();
        self.unmount_all().or_else(|e| fail(Step::HandOver, e))?;
        nix::unistd::sync();
        self.done(Step::HandOver, ": rebooting into the installed system")?;
        Ok(Finish::Reboot)
    }

    /// Reads the disk and asks the birther whether the root can stay; says why not.
    fn keeps_root(&mut self, layout: &Layout) -> bool {
        let table = match read_table(&layout.device) {
            Ok(t) => t,
            Err(e) => {
                self.say(&format!("cannot read the partition table: {e}"));
                None
            }
        };
        let root = &layout.partition(Role::Root).device;
        let signatures = if Path::new(root).exists() {
            match run(&cmd(&["blkid", "-p", "-o", "export", root])) {
                Ok(out) => probe::parse_blkid_export(&out).unwrap_or_else(|e| {
                    self.say(&format!("blkid: {e}"));
                    Vec::new()
                }),
                Err(e) => {
                    self.console.debug(&format!("blkid: {e}"));
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        match probe::reuse(layout, table.as_ref(), &signatures) {
            Reuse::Root { device } => {
                self.say(&format!(
                    "re-image keeps the root {device}: its files become the object cache"
                ));
                true
            }
            Reuse::Fresh { reason } => {
                self.say(&format!("re-image lays the disk out afresh: {reason}"));
                false
            }
        }
    }

    fn wait_for_partitions(&self, layout: &Layout) -> Result<(), StepError> {
        wait_for_partitions(layout).or_else(|e| fail(Step::Partition, e))
    }

    /// `/dev/disk/by-uuid` links for the new file systems (no udev here): the image's
    /// grub-mkconfig then names the root by UUID. Best effort.
    fn link_uuids(&self, layout: &Layout) {
        let esp = &layout.partition(Role::Esp).device;
        let root = &layout.partition(Role::Root).device;
        let out = match run(&cmd(&["blkid", "-o", "export", esp, root])) {
            Ok(o) => o,
            Err(e) => {
                self.say(&format!("warning: {e}"));
                return;
            }
        };
        let sigs = probe::parse_blkid_export(&out).unwrap_or_default();
        let _ = std::fs::create_dir_all("/dev/disk/by-uuid");
        for (link, dev) in by_uuid_links(&sigs) {
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(&dev, &link) {
                self.say(&format!("warning: cannot link {link} → {dev}: {e}"));
            }
        }
    }

    fn mount_fs(&mut self, dev: &str, at: &str, fstype: &str) -> Result<(), ShellError> {
        self.mount_at(dev, at, Some(fstype), MsFlags::empty())
    }

    fn bind(&mut self, from: &str, at: &str) -> Result<(), ShellError> {
        self.mount_at(from, at, None, MsFlags::MS_BIND)
    }

    /// Mounts `source` at `at` (made if missing) and remembers it for the unmount; an error
    /// names the mount as mount(8)'s arguments would.
    fn mount_at(
        &mut self,
        source: &str,
        at: &str,
        fstype: Option<&str>,
        flags: MsFlags,
    ) -> Result<(), ShellError> {
        mkdir(at)?;
        mount(Some(source), at, fstype, flags, None::<&str>).map_err(|e| ShellError::Mount {
            args: match fstype {
                Some(t) => format!("-t {t} {source} {at}"),
                None => format!("--bind {source} {at}"),
            },
            source: e,
        })?;
        self.mounts.push(at.to_string());
        Ok(())
    }

    /// Unmounts what this run mounted below `prefix` (innermost first).
    fn unmount_below(&mut self, prefix: &str) -> Result<(), ShellError> {
        while let Some(i) = self
            .mounts
            .iter()
            .rposition(|m| m == prefix || m.starts_with(&format!("{prefix}/")))
        {
            let m = self.mounts.remove(i);
            if let Err(e) = umount2(m.as_str(), MntFlags::empty()) {
                nix::unistd::sync();
                std::thread::sleep(Duration::from_secs(1));
                // The first failure says why; the retry's is usually the same.
                umount2(m.as_str(), MntFlags::empty()).map_err(|_| ShellError::Unmount {
                    path: m.clone(),
                    source: e,
                })?;
            }
        }
        Ok(())
    }

    fn unmount_all(&mut self) -> Result<(), ShellError> {
        self.unmount_below(TARGET)
    }

    fn start_subd(&mut self) -> Result<(), StepError> {
        // The ramdisk's own copy of subd's trust material, where the argument vector says.
        let trust = self.assignment.subd_trust.as_ref();
        for f in trust.map(trust_files).unwrap_or_default() {
            write_identity("", &f).or_else(|e| fail(Step::StartSubd, e))?;
        }
        let argv = subd_argv(
            TARGET,
            &self.address,
            subd_port(&self.assignment),
            &self.assignment.filter,
            trust.is_some(),
        );
        let log = File::create(SUBD_LOG)
            .or_else(|e| fail(Step::StartSubd, format!("creating {SUBD_LOG}: {e}")))?;
        let mut child = Process::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", PATH)
            .env("PADDOCK_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .or_else(|e| fail(Step::StartSubd, format!("cannot run {}: {e}", argv[0])))?;
        // subd prints `paddock-subd: listening on ADDR` once it serves.
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if line.starts_with("paddock-subd: listening on") {
                        let _ = tx.send(line);
                    }
                }
            });
        }
        let deadline = Instant::now() + SUBD_START;
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(line) => {
                    self.say(&line);
                    self.subd = Some(child);
                    return Ok(());
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = child.try_wait() {
                        return fail(
                            Step::StartSubd,
                            failure_message(&argv, &format!("{status}"), &log_tail()),
                        );
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return fail(
                        Step::StartSubd,
                        failure_message(
                            &argv,
                            &format!("did not listen within {} s", SUBD_START.as_secs()),
                            &log_tail(),
                        ),
                    );
                }
            }
        }
    }

    /// SIGTERM, then SIGKILL after 30 s (an update in progress finishes first).
    fn stop_subd(&mut self) {
        let Some(mut child) = self.subd.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.say("paddock-subd did not stop within 30 s; killing it");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Polls the node's record until the dominator reports subd synced; progress on the
    /// console. subd dying or the run ending on the appliance's side stops the wait.
    fn wait_synced(&mut self, image: &str) -> Result<(), StepError> {
        let started = Instant::now();
        let mut last_progress = Instant::now();
        self.say(&format!(
            "waiting for the dominator to push {image} to subd and find it synced"
        ));
        loop {
            if let Some(child) = self.subd.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.subd = None;
                return fail(
                    Step::Sync,
                    format!(
                        "paddock-subd ended ({status}) before the image was synced: {}",
                        String::from_utf8_lossy(&log_tail()).trim()
                    ),
                );
            }
            let asked = Instant::now();
            let last_seen = match client::record(&mut *self.client, &self.node, SYNC_WAIT) {
                Ok(body) => match sync_status(&body) {
                    SyncStatus::Synced => {
                        self.say(&format!(
                            "subd synced to {image} after {:.0} s; {}",
                            started.elapsed().as_secs_f64(),
                            self.subd_fetched()
                        ));
                        return Ok(());
                    }
                    SyncStatus::Waiting(w) => w,
                    SyncStatus::Stopped(why) => return fail(Step::Sync, why),
                },
                Err(e) if e.refused() => return fail(Step::Sync, e.to_string()),
                Err(e) => format!("cannot read the record: {e}"),
            };
            if last_progress.elapsed() >= SYNC_PROGRESS {
                last_progress = Instant::now();
                self.say(&format!(
                    "still waiting for the sync ({:.0} s): {last_seen}; target holds {} MiB",
                    started.elapsed().as_secs_f64(),
                    used_mib(TARGET)
                ));
            }
            // A held read has waited already; one answered at once waits here.
            std::thread::sleep(SYNC_POLL.saturating_sub(asked.elapsed()));
        }
    }

    /// What subd fetched, from its own Poll (for the console; the share of the image that
    /// crossed the network). With trust material over TLS, as subd's own certificate (it
    /// answers only if the appliance gave that certificate `Subd.Poll`). Best effort.
    fn subd_fetched(&self) -> String {
        let listen = super::listen_addr(&self.address, subd_port(&self.assignment));
        let trust = self.assignment.subd_trust.as_ref();
        let tls = match trust {
            None => None,
            // subd's own certificate comes from the subd CA, which `client_ca_pem` holds
            // (an older appliance's: from the CA itself).
            Some(t) => match paddock_security::tls::ureq_tls(
                if t.client_ca_pem.is_empty() {
                    &t.ca_pem
                } else {
                    &t.client_ca_pem
                },
                Some((t.cert_pem.as_str(), t.key_pem.as_str())),
            ) {
                Ok(c) => Some(c),
                Err(e) => return format!("subd's fetch statistics could not be read: {e}"),
            },
        };
        let scheme = if trust.is_some() { "https" } else { "http" };
        let poll = Url::parse(&format!("{scheme}://{listen}"))
            .ok()
            .and_then(|u| {
                Client::with_tls(
                    vec![u],
                    Duration::from_secs(5),
                    Duration::from_secs(30),
                    tls,
                )
            })
            .and_then(|mut c| {
                c.send(
                    "POST",
                    "/rpc/Subd.Poll",
                    Some(br#"{"short_poll_only": true}"#),
                )
                .ok()
            })
            .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok());
        match poll {
            Some(v) => super::fetch_summary(&v),
            None => "subd's fetch statistics could not be read".into(),
        }
    }

    /// The image's own GRUB, run in a chroot of the target with /dev, /proc and /sys bound.
    fn boot_loader(&mut self, layout: &Layout) -> Result<(), StepError> {
        let step = Step::BootLoader;
        if layout.secure_boot {
            // Say plainly what the image lacks, before grub-install fails on it.
            for (file, package) in paddock_birther::layout::SIGNED_CHAIN {
                if !Path::new(&format!("{TARGET}{file}")).is_file() {
                    return fail(
                        step,
                        format!(
                            "the machine enforces Secure Boot, but the image has no {file}: \
                             install {package} in the image"
                        ),
                    );
                }
            }
        }
        for d in ["dev", "proc", "sys"] {
            self.bind(&format!("/{d}"), &format!("{TARGET}/{d}"))
                .or_else(|e| fail(step, e))?;
        }
        let efivars = "/sys/firmware/efi/efivars";
        if Path::new(efivars).is_dir() {
            let at = format!("{TARGET}{efivars}");
            if let Err(e) = mount(
                Some("efivarfs"),
                at.as_str(),
                Some("efivarfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            ) {
                self.console
                    .debug(&format!("efivarfs not mounted in the target: {e}"));
            } else {
                self.mounts.push(at);
            }
        }
        // The config GRUB's UEFI image embeds (it finds the root by label).
        let early = format!("{TARGET}{}", paddock_birther::layout::EFI_EARLY_CONFIG);
        if let Some(dir) = Path::new(&early).parent() {
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&early, paddock_birther::layout::efi_early_config()))
                .map_err(|source| ShellError::Write {
                    path: early.clone(),
                    source,
                })
                .or_else(|e| fail(step, e))?;
        }
        let mut result = Ok(());
        for s in layout.boot_loader(TARGET) {
            self.say(&format!("running {}", s.command.argv.join(" ")));
            match run(&s.command) {
                Ok(_) => {}
                Err(e) if !s.required => self.say(&format!(
                    "optional: {e} (the machine boots with the booted firmware's loader)"
                )),
                Err(e) => {
                    result = fail(step, e);
                    break;
                }
            }
        }
        for d in ["sys", "proc", "dev"] {
            self.unmount_below(&format!("{TARGET}/{d}"))
                .or_else(|e| fail(step, e))?;
        }
        result
    }

    fn clean(&mut self) -> Result<Finish, StepError> {
        let step = Step::Wipe;
        let disk = self.choose(step, 0)?;
        let name = disk
            .name
            .rsplit('/')
            .next()
            .unwrap_or(&disk.name)
            .to_string();
        let entries: Vec<String> = std::fs::read_dir(format!("/sys/block/{name}"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let parts = partitions_of(&disk.name, &entries);
        self.say(&format!(
            "cleaning {} ({} MiB; partitions: {})",
            disk.name,
            disk.size >> 20,
            if parts.is_empty() {
                "none".into()
            } else {
                parts.join(", ")
            }
        ));
        for c in clean_commands(&disk.name, &parts) {
            run(&c).or_else(|e| fail(step, e))?;
        }
        zero_ends(&disk.name).or_else(|e| fail(step, e))?;
        match run(&discard_command(&disk.name)) {
            Ok(_) => self.say(&format!("{} discarded", disk.name)),
            Err(e) => self.say(&format!(
                "no discard ({e}); the table and signatures are gone"
            )),
        }
        nix::unistd::sync();
        self.done(step, &format!(": {} has no partition table", disk.name))?;
        self.report_event(&Event::CleanDone, 0)
            .or_else(|e| fail(step, format!("the appliance refused clean done: {e}")))?;
        Ok(Finish::PowerOff)
    }
}

/// Zeroes the disk's first and last MiB.
/// Waits until the kernel shows every partition of `layout` (no udev in the ramdisk).
fn wait_for_partitions(layout: &Layout) -> Result<(), ShellError> {
    let deadline = Instant::now() + PARTITIONS_APPEAR;
    loop {
        let missing: Vec<String> = layout
            .partitions()
            .iter()
            .map(|p| p.device.clone())
            .filter(|d| !Path::new(d).exists())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ShellError::PartitionsMissing {
                missing,
                waited: PARTITIONS_APPEAR,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The provisioning bench's baseline (`paddock.bench_tar=URL`, `bench/provision.sh`): the
/// disk laid out and formatted exactly as a birth does it, then the image's tarball streamed
/// onto the new root by busybox (`wget -O- URL | tar -x`, two processes joined by a pipe, no
/// shell). The console lines are the bench's clock: `baseline: begins`, `baseline: streamed`,
/// `baseline: synced`. Nothing is reported to the appliance.
pub fn baseline(console: &Console, inventory: &Inventory, url: &str) -> Result<(), ShellError> {
    let disk = choose_root_disk(inventory, None, 0)?;
    let fw = firmware(Path::new("/sys/firmware/efi").exists());
    let layout = plan(&disk.name, Geometry::of_disk(&disk), fw)?;
    console.say(&format!(
        "baseline: begins: {} ({} MiB), {} firmware, {url}",
        disk.name,
        disk.size >> 20,
        fw.as_str()
    ));
    let started = Instant::now();
    let commands = layout.commands(false);
    let (partition, filesystems): (Vec<Command>, Vec<Command>) = commands
        .into_iter()
        .partition(|c| c.argv.first().is_some_and(|p| p == "sfdisk"));
    for c in &partition {
        run(c)?;
    }
    wait_for_partitions(&layout)?;
    for c in &filesystems {
        run(c)?;
    }
    let root = layout.partition(Role::Root).device.clone();
    mkdir(TARGET)?;
    mount(
        Some(root.as_str()),
        TARGET,
        Some("ext4"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| ShellError::Mount {
        args: format!("{root} {TARGET}"),
        source,
    })?;
    console.say(&format!(
        "baseline: laid out and formatted in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    let streaming = Instant::now();
    let mut wget = spawn_busybox(&["wget", "-q", "-O-", url], Stdio::null(), Stdio::piped())?;
    let pipe = wget.stdout.take().ok_or_else(|| ShellError::NoStdout {
        command: "busybox wget".into(),
    })?;
    let tar = spawn_busybox(
        &["tar", "-x", "-C", TARGET],
        Stdio::from(pipe),
        Stdio::null(),
    )?;
    let tar_out = tar.wait_with_output().map_err(|source| ShellError::Wait {
        command: "busybox tar".into(),
        source,
    })?;
    let wget_out = wget.wait_with_output().map_err(|source| ShellError::Wait {
        command: "busybox wget".into(),
        source,
    })?;
    for (command, out) in [("wget", &wget_out), ("tar", &tar_out)] {
        if !out.status.success() {
            return Err(ShellError::Busybox {
                command,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    console.say(&format!(
        "baseline: streamed in {:.1} s; the root holds {} MiB",
        streaming.elapsed().as_secs_f64(),
        used_mib(TARGET)
    ));
    let syncing = Instant::now();
    nix::unistd::sync();
    console.say(&format!(
        "baseline: synced in {:.1} s (total {:.1} s)",
        syncing.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    umount2(TARGET, MntFlags::empty()).map_err(|source| ShellError::Unmount {
        path: TARGET.into(),
        source,
    })?;
    Ok(())
}

/// The ramdisk's busybox, through which every applet runs (the agent's too).
pub const BUSYBOX: &str = "/bin/busybox";

/// Starts busybox applet `args[0]` with its standard error captured (for the error message).
fn spawn_busybox(args: &[&str], stdin: Stdio, stdout: Stdio) -> Result<Child, ShellError> {
    Process::new(BUSYBOX)
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ShellError::Spawn {
            command: format!("busybox {}", args[0]),
            source,
        })
}

fn zero_ends(dev: &str) -> Result<(), ShellError> {
    let e = |what: &'static str, source: std::io::Error| ShellError::Device {
        what,
        device: dev.to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dev)
        .map_err(|err| e("opening", err))?;
    let size = f.seek(SeekFrom::End(0)).map_err(|err| e("sizing", err))?;
    for (offset, len) in zero_ranges(size) {
        f.seek(SeekFrom::Start(offset))
            .map_err(|err| e("seeking", err))?;
        let zeros = vec![0u8; usize::try_from(len).unwrap_or(0)];
        f.write_all(&zeros).map_err(|err| e("zeroing", err))?;
    }
    f.sync_all().map_err(|err| e("flushing", err))
}

/// `sfdisk --json DISK`: the table, `None` when the disk has none.
fn read_table(device: &str) -> Result<Option<probe::PartitionTable>, ShellError> {
    match run(&cmd(&["sfdisk", "--json", device])) {
        Ok(out) => Ok(Some(probe::parse_sfdisk_json(&out)?)),
        // sfdisk exits 1 with "does not contain a recognized partition table".
        Err(ShellError::Failed { output, .. })
            if String::from_utf8_lossy(&output).contains("partition table") =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn mkdir(path: &str) -> Result<(), ShellError> {
    std::fs::create_dir_all(path).map_err(|source| ShellError::Mkdir {
        path: path.to_string(),
        source,
    })
}

fn write_identity(target: &str, f: &IdentityFile) -> Result<(), ShellError> {
    let path = format!("{target}{}", f.path());
    if let Some(dir) = Path::new(&path).parent() {
        mkdir(&dir.to_string_lossy())?;
    }
    let set_mode = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
            ShellError::Chmod {
                path: path.clone(),
                source,
            }
        })
    };
    match f {
        IdentityFile::Dir { mode, .. } => {
            mkdir(&path)?;
            set_mode(*mode)
        }
        IdentityFile::File { contents, mode, .. } => {
            let _ = std::fs::remove_file(&path);
            // Created with its mode (a key is never readable by others, even for a moment);
            // set again after, as the umask may have taken bits away.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(*mode)
                .open(&path)
                .and_then(|mut w| w.write_all(contents))
                .map_err(|source| ShellError::Write {
                    path: path.clone(),
                    source,
                })?;
            set_mode(*mode)
        }
        IdentityFile::Copy { from, mode, .. } => {
            let _ = std::fs::remove_file(&path);
            std::fs::copy(from, &path).map_err(|source| ShellError::Copy {
                from: from.clone(),
                to: path.clone(),
                source,
            })?;
            set_mode(*mode)
        }
        IdentityFile::Symlink { target: to, .. } => {
            let _ = std::fs::remove_file(&path);
            std::os::unix::fs::symlink(to, &path).map_err(|source| ShellError::Symlink {
                path: path.clone(),
                to: to.clone(),
                source,
            })
        }
    }
}

/// The last part of subd's log.
fn log_tail() -> Vec<u8> {
    std::fs::read(SUBD_LOG).unwrap_or_default()
}

/// MiB used on the file system at `path` (for the progress lines).
fn used_mib(path: &str) -> u64 {
    nix::sys::statvfs::statvfs(path)
        .map(|s| (s.blocks().saturating_sub(s.blocks_free()) * s.fragment_size()) >> 20)
        .unwrap_or(0)
}

/// Ends the run as it asks: sync, then reboot or power off. Returns only on failure.
pub fn finish(how: Finish) -> nix::errno::Errno {
    nix::unistd::sync();
    let mode = match how {
        Finish::Reboot => RebootMode::RB_AUTOBOOT,
        Finish::PowerOff => RebootMode::RB_POWER_OFF,
    };
    let Err(e) = reboot(mode);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_without_a_shell_and_failures_say_why() {
        let out = run(&Command {
            argv: vec!["cat".into()],
            stdin: Some("label: gpt\n".into()),
        })
        .unwrap();
        assert_eq!(out, b"label: gpt\n");
        // `$HOME` is not expanded: there is no shell.
        assert_eq!(run(&cmd(&["echo", "$HOME;", "x"])).unwrap(), b"$HOME; x\n");
        let e = run(&cmd(&["ls", "/nonexistent-paddock"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("`ls /nonexistent-paddock` exited with 2: ls: cannot access"),
            "{e}"
        );
        let e = run(&cmd(&["no-such-program-paddock"]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot run `no-such-program-paddock`"), "{e}");
        assert!(matches!(
            run(&cmd(&[])).unwrap_err(),
            ShellError::EmptyCommand
        ));
    }

    #[test]
    fn identity_files_land_in_the_target() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_str().unwrap();
        std::fs::write(t.path().join("subd"), b"ELF").unwrap();
        let files = [
            IdentityFile::File {
                path: "/etc/hostname".into(),
                contents: b"web-1\n".to_vec(),
                mode: 0o644,
            },
            IdentityFile::Copy {
                path: "/var/lib/paddock/paddock-subd".into(),
                from: t.path().join("subd").display().to_string(),
                mode: 0o755,
            },
            IdentityFile::Symlink {
                path: "/etc/systemd/system/multi-user.target.wants/paddock-subd.service".into(),
                target: "../paddock-subd.service".into(),
            },
        ]
        .into_iter()
        .chain(trust_files(&super::super::SubdTrust {
            ca_pem: "CA".into(),
            client_ca_pem: String::new(),
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        }))
        .collect::<Vec<_>>();
        for _ in 0..2 {
            // Twice: a run started again overwrites what the first left.
            for f in &files {
                write_identity(root, f).unwrap();
            }
        }
        assert_eq!(
            std::fs::read(t.path().join("etc/hostname")).unwrap(),
            b"web-1\n"
        );
        let subd = t.path().join("var/lib/paddock/paddock-subd");
        assert_eq!(std::fs::read(&subd).unwrap(), b"ELF");
        assert_eq!(
            std::fs::metadata(&subd).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(
            std::fs::read_link(
                t.path()
                    .join("etc/systemd/system/multi-user.target.wants/paddock-subd.service")
            )
            .unwrap()
            .to_str(),
            Some("../paddock-subd.service")
        );
        let mode = |p: &str| {
            std::fs::metadata(t.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(
            [
                mode("etc/paddock/subd"),
                mode("etc/paddock/subd/ca.pem"),
                mode("etc/paddock/subd/cert.pem"),
                mode("etc/paddock/subd/key.pem")
            ],
            [0o700, 0o644, 0o644, 0o600]
        );
        assert_eq!(
            std::fs::read(t.path().join("etc/paddock/subd/key.pem")).unwrap(),
            b"KEY"
        );
    }

    /// The real tools on a loop device: the plan's table written and read back equal, the
    /// file systems made, the re-image decision keeping the root, and clean leaving no table.
    /// Needs root, losetup and the tools scripts/install-deps.sh installs (the suite runs as
    /// root, as CI does).
    #[test]
    fn loop_device_birth_and_clean() {
        use paddock_birther::Firmware;
        let t = tempfile::tempdir().unwrap();
        let img = t.path().join("disk.img");
        File::create(&img).unwrap().set_len(2 << 30).unwrap();
        let dev = String::from_utf8(
            run(&cmd(&[
                "losetup",
                "-f",
                "-P",
                "--show",
                img.to_str().unwrap(),
            ]))
            .unwrap(),
        )
        .unwrap()
        .trim()
        .to_string();
        struct Detach(String);
        impl Drop for Detach {
            fn drop(&mut self) {
                let _ = run(&cmd(&["losetup", "-d", &self.0]));
            }
        }
        let _detach = Detach(dev.clone());
        let geometry = Geometry {
            size_bytes: 2 << 30,
            logical_sector: 512,
            physical_sector: 512,
        };
        let layout = plan(&dev, geometry, Firmware::Uefi).unwrap();
        let commands = layout.commands(false);
        run(&commands[0]).unwrap();
        let table = read_table(&dev).unwrap().expect("a table");
        assert_eq!(probe::mismatch(&layout, &table), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !layout
            .partitions()
            .iter()
            .all(|p| Path::new(&p.device).exists())
        {
            if Instant::now() > deadline {
                // Some sandboxes' loop devices never scan partitions: make the file systems
                // on loop devices at the partitions' offsets instead (the same argv, the
                // device swapped), then stop.
                eprintln!("{dev}: the kernel shows no partition devices; mkfs on offset loops");
                for (c, role, fs) in [
                    (&commands[1], Role::Esp, "vfat"),
                    (&commands[2], Role::Root, "ext4"),
                ] {
                    let p = layout.partition(role);
                    let part = String::from_utf8(
                        run(&cmd(&[
                            "losetup",
                            "-f",
                            "--show",
                            "-o",
                            &(p.start * 512).to_string(),
                            "--sizelimit",
                            &(p.size * 512).to_string(),
                            &dev,
                        ]))
                        .unwrap(),
                    )
                    .unwrap()
                    .trim()
                    .to_string();
                    let _detach = Detach(part.clone());
                    let mut c = c.clone();
                    *c.argv.last_mut().unwrap() = part.clone();
                    run(&c).unwrap();
                    let sigs = probe::parse_blkid_export(
                        &run(&cmd(&["blkid", "-p", "-o", "export", &part])).unwrap(),
                    )
                    .unwrap();
                    assert_eq!(sigs[0].fs_type(), Some(fs), "{sigs:?}");
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for c in &commands[1..] {
            run(c).unwrap();
        }
        let root = &layout.partition(Role::Root).device;
        let sigs =
            probe::parse_blkid_export(&run(&cmd(&["blkid", "-p", "-o", "export", root])).unwrap())
                .unwrap();
        assert_eq!(
            probe::reuse(&layout, Some(&table), &sigs),
            Reuse::Root {
                device: root.clone()
            }
        );
        let both = run(&cmd(&[
            "blkid",
            "-o",
            "export",
            &layout.partition(Role::Esp).device,
            root,
        ]))
        .unwrap();
        let links = by_uuid_links(&probe::parse_blkid_export(&both).unwrap());
        assert_eq!(links.len(), 2, "{links:?}");
        let entries: Vec<String> =
            std::fs::read_dir(format!("/sys/block/{}", dev.trim_start_matches("/dev/")))
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .collect();
        let parts = partitions_of(&dev, &entries);
        assert_eq!(parts.len(), 3, "{entries:?}");
        for c in clean_commands(&dev, &parts) {
            run(&c).unwrap();
        }
        zero_ends(&dev).unwrap();
        assert_eq!(read_table(&dev).unwrap(), None);
    }

    #[test]
    fn zeroing_the_ends_of_a_file() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("disk");
        std::fs::write(&p, vec![0xaau8; 3 << 20]).unwrap();
        zero_ends(p.to_str().unwrap()).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert!(b[..1 << 20].iter().all(|x| *x == 0));
        assert!(b[1 << 20..2 << 20].iter().all(|x| *x == 0xaa));
        assert!(b[2 << 20..].iter().all(|x| *x == 0));
        assert_eq!(b.len(), 3 << 20);
    }
}
