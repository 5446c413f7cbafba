//! The read speed of the device under the root (Dominator's `lib/fsbench`).
//!
//! The device is found from the root's `st_dev`: `/sys/dev/block/MAJ:MIN/uevent` names it
//! (`DEVNAME` → `/dev/NAME`); file systems with anonymous device numbers (btrfs) fall back
//! to the mount source in `/proc/self/mountinfo`. It is read with `O_DIRECT` (no page cache)
//! in 1 MiB aligned chunks, up to 128 MiB. Where the device cannot be opened (a container,
//! a sandbox), the largest files of the root's file system are read with `O_DIRECT`
//! instead: the same media, through the file system. The result is cached in a file named after the
//! device number (hex) together with the kernel's boot id, so it is measured once per boot
//! even when the cache directory outlives a reboot (the default `/run/paddock-subd/fsbench`
//! is on tmpfs anyway).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::OFlag;
use nix::sys::stat::{major, minor};

use crate::ratelimit::{BLOCK_BYTES, IoMeasure, ThreadMeter};

pub const DEFAULT_CACHE_DIR: &str = "/run/paddock-subd/fsbench";
/// At most this much is read.
pub const MAX_BYTES: u64 = 128 << 20;
pub const CHUNK: usize = 1 << 20;
const ALIGN: usize = 4096;

/// A measured device speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpeed {
    pub bytes_per_sec: u64,
    /// `ru_inblock` blocks per second during the benchmark; 0 when the kernel keeps no
    /// per-task I/O accounting (the limiter then charges bytes read).
    pub blocks_per_sec: u64,
}

impl DeviceSpeed {
    pub fn io_measure(&self) -> IoMeasure {
        if self.blocks_per_sec > 0 {
            IoMeasure::Blocks
        } else {
            IoMeasure::Bytes
        }
    }

    /// The cache file's text: `bytes/s blocks/s boot-id`.
    pub fn to_cache(&self, boot_id: &str) -> String {
        format!(
            "{} {} {}\n",
            self.bytes_per_sec, self.blocks_per_sec, boot_id
        )
    }

    /// Parses a cache file; `None` when malformed or from another boot.
    pub fn from_cache(text: &str, boot_id: &str) -> Option<Self> {
        let mut f = text.split_whitespace();
        let bytes_per_sec = f.next()?.parse().ok()?;
        let blocks_per_sec = f.next()?.parse().ok()?;
        (f.next()? == boot_id && f.next().is_none() && bytes_per_sec > 0).then_some(DeviceSpeed {
            bytes_per_sec,
            blocks_per_sec,
        })
    }
}

/// The device number of the file system holding `root`.
pub fn device_number(root: &Path) -> io::Result<u64> {
    Ok(nix::sys::stat::stat(root)?.st_dev)
}

/// The block device holding `root`.
pub fn device_for(root: &Path) -> io::Result<PathBuf> {
    let dev = device_number(root)?;
    let (maj, min) = (major(dev), minor(dev));
    let uevent = format!("/sys/dev/block/{maj}:{min}/uevent");
    if let Ok(text) = std::fs::read_to_string(&uevent)
        && let Some(name) = text.lines().find_map(|l| l.strip_prefix("DEVNAME="))
    {
        return Ok(PathBuf::from("/dev").join(name));
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    mount_source(&mountinfo, maj, min)
        .map(PathBuf::from)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no block device for {} (device {maj}:{min})",
                    root.display()
                ),
            )
        })
}

/// The `/dev/…` source of a mount with device `maj:min` in a mountinfo text.
pub fn mount_source(mountinfo: &str, maj: u64, min: u64) -> Option<String> {
    let want = format!("{maj}:{min}");
    mountinfo.lines().find_map(|l| {
        let mut f = l.split(' ');
        if f.nth(2)? != want {
            return None;
        }
        let mut after = l.split(" - ").nth(1)?.split(' ');
        let source = after.nth(1)?;
        source.starts_with("/dev/").then(|| source.to_string())
    })
}

fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECT | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW).bits())
        .open(path)
}

/// Reads up to `max_bytes` of `device` with `O_DIRECT`; the speed and the `ru_inblock`
/// rate seen meanwhile.
pub fn measure(device: &Path, max_bytes: u64) -> io::Result<DeviceSpeed> {
    let file = open_direct(device)?;
    measure_reads(std::iter::once(Ok(file)), max_bytes, device)
}

/// Where a speed was measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Device(PathBuf),
    /// The device could not be opened (a container, no permission): the largest files
    /// under the root were read with `O_DIRECT` instead (this many).
    Files(usize),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Device(d) => write!(f, "{}", d.display()),
            Source::Files(n) => write!(f, "{n}-largest-files"),
        }
    }
}

/// Measures the device under `root`; where it cannot be opened, through the largest
/// files (≥ 1 MiB) of the root's file system, read with `O_DIRECT`.
pub fn measure_root(root: &Path, max_bytes: u64) -> io::Result<(DeviceSpeed, Source)> {
    let device_err = match device_for(root).and_then(|d| measure(&d, max_bytes).map(|s| (s, d))) {
        Ok((s, d)) => return Ok((s, Source::Device(d))),
        Err(e) => e,
    };
    let files = largest_files(root, max_bytes)?;
    if files.is_empty() {
        return Err(io::Error::new(
            device_err.kind(),
            format!("the device: {device_err}; and no file of 1 MiB or more to read instead"),
        ));
    }
    let n = files.len();
    let s = measure_reads(files.iter().map(|p| open_direct(p)), max_bytes, root)?;
    Ok((s, Source::Files(n)))
}

/// Files of at least 1 MiB on the root's file system, largest first, enough to make up
/// `max_bytes` (the walk stops after 100,000 entries).
fn largest_files(root: &Path, max_bytes: u64) -> io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let dev = device_number(root)?;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    let mut visited = 0usize;
    'walk: while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            visited += 1;
            if visited > 100_000 {
                break 'walk;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && m.len() >= CHUNK as u64 {
                found.push((m.len(), e.path()));
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut total = 0;
    Ok(found
        .into_iter()
        .take_while(|(len, _)| {
            let more = total < max_bytes;
            total += len;
            more
        })
        .map(|(_, p)| p)
        .collect())
}

fn measure_reads(
    files: impl Iterator<Item = io::Result<File>>,
    max_bytes: u64,
    what: &Path,
) -> io::Result<DeviceSpeed> {
    let mut storage = vec![0u8; CHUNK + ALIGN];
    let off = storage.as_ptr().align_offset(ALIGN);
    let buf = &mut storage[off..off + CHUNK];
    let mut meter = ThreadMeter::start();
    let start = Instant::now();
    let mut total = 0u64;
    for file in files {
        let mut file = file?;
        while total < max_bytes {
            match read_full(&mut file, buf)? {
                0 => break,
                n => total += n as u64,
            }
        }
        if total >= max_bytes {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-6);
    let usage = meter.take(total);
    if total == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{}: nothing could be read", what.display()),
        ));
    }
    Ok(DeviceSpeed {
        bytes_per_sec: (total as f64 / secs) as u64,
        blocks_per_sec: if usage.blocks * BLOCK_BYTES >= total / 2 {
            (usage.blocks as f64 / secs) as u64
        } else {
            0 // the reads did not show in ru_inblock: no I/O accounting
        },
    })
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match f.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// The kernel's boot id (changes every boot).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The speed of the device under `root`: from `cache_dir/<dev-hex>` if measured this boot,
/// else measured now and cached (a cache that cannot be written is only logged).
pub fn read_speed(root: &Path, cache_dir: &Path) -> io::Result<DeviceSpeed> {
    let dev = device_number(root)?;
    let cache = cache_dir.join(format!("{dev:x}"));
    let boot = boot_id();
    if let Ok(text) = std::fs::read_to_string(&cache)
        && let Some(s) = DeviceSpeed::from_cache(&text, &boot)
    {
        return Ok(s);
    }
    let (speed, source) = measure_root(root, MAX_BYTES)?;
    tracing::info!(
        source = %source,
        bytes_per_sec = speed.bytes_per_sec,
        blocks_per_sec = speed.blocks_per_sec,
        "measured the device read speed"
    );
    let write = || -> io::Result<()> {
        std::fs::create_dir_all(cache_dir)?;
        let tmp = cache.with_extension("tmp");
        std::fs::write(&tmp, speed.to_cache(&boot))?;
        std::fs::rename(&tmp, &cache)
    };
    if let Err(e) = write() {
        tracing::warn!(cache = %cache.display(), "cannot cache the device speed: {e}");
    }
    Ok(speed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_text() {
        let s = DeviceSpeed {
            bytes_per_sec: 500_000_000,
            blocks_per_sec: 976_562,
        };
        let t = s.to_cache("b1");
        assert_eq!(t, "500000000 976562 b1\n");
        assert_eq!(DeviceSpeed::from_cache(&t, "b1"), Some(s));
        assert_eq!(DeviceSpeed::from_cache(&t, "b2"), None, "another boot");
        assert_eq!(DeviceSpeed::from_cache("12 x b1", "b1"), None);
        assert_eq!(DeviceSpeed::from_cache("0 0 b1", "b1"), None);
        assert_eq!(s.io_measure(), IoMeasure::Blocks);
        let no_acct = DeviceSpeed {
            blocks_per_sec: 0,
            ..s
        };
        assert_eq!(no_acct.io_measure(), IoMeasure::Bytes);
    }

    #[test]
    fn mountinfo_fallback() {
        let mi = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                  27 1 0:45 / / rw,relatime shared:1 - btrfs /dev/nvme0n1p2 rw,subvol=/@\n\
                  30 27 0:46 / /tmp rw - tmpfs tmpfs rw\n";
        assert_eq!(mount_source(mi, 0, 45).as_deref(), Some("/dev/nvme0n1p2"));
        assert_eq!(mount_source(mi, 0, 46), None, "tmpfs has no device");
        assert_eq!(mount_source(mi, 8, 1), None);
    }
}
