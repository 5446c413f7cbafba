//! The reproducible initramfs builder: the static agent as `/init`, busybox (for `udhcpc` and
//! `ip`), the kernel modules the hardware needs (dependencies first, listed in
//! `/etc/paddock/modules`), and the kernel from Debian's `linux-image-amd64`, extracted into a
//! cache directory (never installed on the host).
//!
//! Same inputs → the same bytes: entries sorted, inode numbers assigned in order, uid/gid 0,
//! every mtime 0, and a gzip header with mtime 0 and no file name.

pub mod cpio;
pub mod kmod;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use cpio::{Archive, Kind};

/// The drivers a discovery ramdisk carries unless told otherwise: virtual and common server
/// NICs and disk controllers. `sd_mod` is here because without udev nobody loads it on demand,
/// and SATA/SCSI disks only appear as block devices with it.
pub const DEFAULT_MODULES: &[&str] = &[
    "virtio_net",
    "virtio_pci",
    "virtio_blk",
    "virtio_scsi",
    "e1000",
    "e1000e",
    "igb",
    "ixgbe",
    "ahci",
    "nvme",
    "sd_mod",
    // Birth and rebirth mount the new root (ext4, whose checksums need crc32c: without
    // modprobe nothing loads it on demand) and the EFI system partition (vfat with Debian's
    // default code page 437 and I/O character set ascii). No efivarfs: grub-install runs with
    // --no-nvram, and the module fails to load (ENODEV) on every BIOS machine.
    "ext4",
    "crc32c_generic",
    "vfat",
    "nls_cp437",
    "nls_ascii",
];

/// The host programs birth, rebirth and clean run (`paddock-ramdisk-build --tools`), carried
/// as `/usr/sbin/<name>` with their shared libraries: `sfdisk` (Debian's fdisk), `wipefs`,
/// `blkid`, `blkdiscard` (util-linux), `mkfs.ext4` (e2fsprogs), `mkfs.fat` (dosfstools).
pub const DEFAULT_TOOLS: &[&str] = &[
    "sfdisk",
    "wipefs",
    "blkid",
    "blkdiscard",
    "mkfs.ext4",
    "mkfs.fat",
];

/// Where [`find_tool`] looks for a tool named without a path.
pub const TOOL_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// busybox applets reached by name (the birther's boot-loader commands start with `chroot`).
pub const APPLET_LINKS: &[&str] = &["chroot"];

/// The udhcpc event script (busybox `udhcpc -s`): configures the address, the default route,
/// resolv.conf and the host name, and leaves the lease in `/run/paddock/dhcp-<if>` for the log.
pub const UDHCPC_SCRIPT: &str = r#"#!/bin/busybox sh
# udhcpc event script of the Paddock introspection ramdisk (written by paddock-ramdisk-build).
BB=/bin/busybox
case "$1" in
deconfig)
    $BB ip -4 addr flush dev "$interface"
    $BB ip link set dev "$interface" up
    ;;
bound|renew)
    $BB ip -4 addr flush dev "$interface"
    $BB ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do
        $BB ip route replace default via "$r" dev "$interface"
        break
    done
    : > /etc/resolv.conf
    [ -n "$domain" ] && echo "search $domain" >> /etc/resolv.conf
    for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
    [ -n "$hostname" ] && $BB hostname "$hostname"
    $BB mkdir -p /run/paddock
    echo "interface=$interface ip=$ip mask=$mask router=$router dns=$dns serverid=$serverid lease=$lease" > "/run/paddock/dhcp-$interface"
    ;;
esac
exit 0
"#;

const NSSWITCH: &str = "passwd: files\ngroup: files\nhosts: files dns\n";
const HOSTS: &str = "127.0.0.1 localhost\n::1 localhost\n";

/// Where the kernel comes from.
#[derive(Clone, Debug)]
pub enum KernelSource {
    /// A Debian package (a metapackage such as `linux-image-amd64` is resolved to the real
    /// `linux-image-<abi>-amd64` with `apt-cache depends`), downloaded and extracted into the cache.
    Apt { package: String },
    /// An already extracted package tree (holds `boot/vmlinuz-<v>` and `lib/modules/<v>`).
    Extracted(PathBuf),
}

#[derive(Clone, Debug)]
pub struct BuildSpec {
    /// The static agent binary, which becomes `/init`.
    pub agent: PathBuf,
    /// A static busybox (`/bin/busybox`, Debian `busybox-static`), for `udhcpc` and `ip`.
    pub busybox: PathBuf,
    pub out_dir: PathBuf,
    /// Downloaded and extracted kernel packages.
    pub cache_dir: PathBuf,
    pub kernel: KernelSource,
    /// Driver names; their dependencies are added.
    pub modules: Vec<String>,
    /// The modification time written into every archive entry.
    pub mtime: u32,
    /// Dynamically linked host programs, carried as `usr/sbin/<file name>` with every
    /// library `ldd` names (at the path it names, the loader included).
    pub tools: Vec<PathBuf>,
    /// Static programs, carried as `bin/<file name>` (paddock-subd, fs2objectcache).
    pub programs: Vec<PathBuf>,
}

impl BuildSpec {
    /// A spec with the defaults: Debian's `linux-image-amd64`, `/bin/busybox`, [`DEFAULT_MODULES`].
    pub fn new(
        agent: impl Into<PathBuf>,
        out_dir: impl Into<PathBuf>,
        cache_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            agent: agent.into(),
            busybox: PathBuf::from("/bin/busybox"),
            out_dir: out_dir.into(),
            cache_dir: cache_dir.into(),
            kernel: KernelSource::Apt {
                package: "linux-image-amd64".into(),
            },
            modules: DEFAULT_MODULES.iter().map(|s| s.to_string()).collect(),
            mtime: 0,
            tools: Vec::new(),
            programs: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltRamdisk {
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
    pub kernel_version: String,
    /// Modules in the image, in load order (canonical names).
    pub modules: Vec<String>,
    /// Requested modules that are built into this kernel, so not carried.
    pub builtin: Vec<String>,
    /// Whether the package's modules were compressed (they are stored decompressed).
    pub decompressed_modules: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path} is not a static executable: {why}")]
    NotStatic {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("`{cmd}` failed: {why}")]
    Command { cmd: String, why: String },
    #[error("`ldd {}` failed: {source}", tool.display())]
    Ldd { tool: PathBuf, source: LddError },
    #[error(
        "cannot resolve package {package}: `apt-cache depends` names no linux-image-* dependency (output: {output:?}); pass the real package, e.g. linux-image-6.1.0-NN-amd64"
    )]
    NoKernelPackage { package: String, output: String },
    #[error(
        "{dir} holds no kernel: want exactly one lib/modules/<version> with a matching boot/vmlinuz-<version> (found {found:?})"
    )]
    NoKernel { dir: PathBuf, found: Vec<String> },
    #[error(transparent)]
    Modules(#[from] kmod::ModError),
    #[error("cannot pack the initramfs: {0}")]
    Pack(#[from] cpio::TooLarge),
}

fn read(path: &Path) -> Result<Vec<u8>, BuildError> {
    std::fs::read(path).map_err(|source| BuildError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a binary that goes into the image as /init's or the shell's: the ramdisk has no
/// dynamic loader, so it must be static.
fn read_static(what: &'static str, path: &Path) -> Result<Vec<u8>, BuildError> {
    let elf = read(path)?;
    check_static(&elf).map_err(|why| BuildError::NotStatic {
        what,
        path: path.to_path_buf(),
        why: why.to_string(),
    })?;
    Ok(elf)
}

fn run(cmd: &mut Command) -> Result<String, BuildError> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| BuildError::Command {
        cmd: shown.clone(),
        why: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(BuildError::Command {
            cmd: shown,
            why: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Builds `vmlinuz` and `initrd.img` in `spec.out_dir`.
pub fn build(spec: &BuildSpec) -> Result<BuiltRamdisk, BuildError> {
    let tree = match &spec.kernel {
        KernelSource::Extracted(dir) => dir.clone(),
        KernelSource::Apt { package } => extract_kernel_package(package, &spec.cache_dir)?,
    };
    let (version, vmlinuz_src) = find_kernel(&tree)?;
    let agent = read_static("agent", &spec.agent)?;
    let busybox = read_static("busybox", &spec.busybox)?;

    let moddir = tree.join("lib/modules").join(&version);
    let index = kmod::ModuleIndex::scan(&moddir)?;
    let (modules, builtin) = index.resolve(&spec.modules)?;

    let mut a = Archive::new();
    for d in [
        "dev", "proc", "sys", "run", "tmp", "root", "sbin", "usr/bin", "usr/sbin", "var",
    ] {
        a.dir(d);
    }
    // The kernel opens /dev/console for init's stdio before anything is mounted.
    a.add("dev/console", Kind::CharDev(5, 1), 0o600);
    a.add("dev/null", Kind::CharDev(1, 3), 0o666);
    a.file("init", agent, 0o755);
    a.file("bin/busybox", busybox, 0o755);
    a.add("bin/sh", Kind::Symlink("busybox".into()), 0o777);
    a.file(
        "etc/paddock/udhcpc.script",
        UDHCPC_SCRIPT.as_bytes().to_vec(),
        0o755,
    );
    a.file("etc/nsswitch.conf", NSSWITCH.as_bytes().to_vec(), 0o644);
    a.file("etc/hosts", HOSTS.as_bytes().to_vec(), 0o644);
    a.file(
        "etc/paddock/kernel-version",
        format!("{version}\n").into_bytes(),
        0o644,
    );

    let mut list = String::new();
    let mut decompressed = false;
    for m in &modules {
        let rel = index
            .files
            .get(m)
            .ok_or_else(|| kmod::ModError::Unknown(m.clone()))?;
        let plain = kmod::plain_path(rel);
        decompressed |= plain != *rel;
        let bytes = kmod::read_module(&moddir.join(rel))?;
        let inside = format!("lib/modules/{version}/{plain}");
        list.push_str(&format!("/{inside}\n"));
        a.file(&inside, bytes, 0o644);
    }
    a.file("etc/paddock/modules", list.into_bytes(), 0o644);

    for applet in APPLET_LINKS {
        a.add(
            &format!("bin/{applet}"),
            Kind::Symlink("busybox".into()),
            0o777,
        );
    }
    for p in &spec.programs {
        let bytes = read(p)?;
        check_static(&bytes).map_err(|why| BuildError::NotStatic {
            what: "program",
            path: p.clone(),
            why: why.to_string(),
        })?;
        a.file(&format!("bin/{}", file_name(p)?), bytes, 0o755);
    }
    let mut libraries = std::collections::BTreeSet::new();
    for t in &spec.tools {
        a.file(&format!("usr/sbin/{}", file_name(t)?), read(t)?, 0o755);
        let out = run(Command::new("ldd").arg(t))?;
        libraries.extend(parse_ldd(&out).map_err(|source| BuildError::Ldd {
            tool: t.clone(),
            source,
        })?);
    }
    for lib in &libraries {
        a.file(lib.trim_start_matches('/'), read(Path::new(lib))?, 0o755);
    }

    std::fs::create_dir_all(&spec.out_dir).map_err(|source| BuildError::Write {
        path: spec.out_dir.clone(),
        source,
    })?;
    let initrd = spec.out_dir.join("initrd.img");
    let gz = gzip(&a.to_bytes(spec.mtime)?).map_err(|source| BuildError::Write {
        path: initrd.clone(),
        source,
    })?;
    write_atomic(&initrd, &gz)?;
    let vmlinuz = spec.out_dir.join("vmlinuz");
    write_atomic(&vmlinuz, &read(&vmlinuz_src)?)?;
    Ok(BuiltRamdisk {
        vmlinuz,
        initrd,
        kernel_version: version,
        modules,
        builtin,
        decompressed_modules: decompressed,
    })
}

fn file_name(p: &Path) -> Result<String, BuildError> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| BuildError::Read {
            path: p.to_path_buf(),
            source: std::io::Error::other("no file name"),
        })
}

/// A tool named without a path, found in [`TOOL_DIRS`] (the first that holds it); a path is
/// taken as given.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    TOOL_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Why `ldd`'s output does not give a tool's libraries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LddError {
    /// The library `ldd` could not find.
    #[error("{0} not found")]
    NotFound(String),
    #[error("cannot read the ldd line {0:?}")]
    Unreadable(String),
}

/// The libraries `ldd` names (absolute paths, the loader included; the vDSO has no file).
/// A library `ldd` could not find is an error: the tool would not start in the ramdisk.
pub fn parse_ldd(out: &str) -> Result<Vec<String>, LddError> {
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("statically linked") || line.starts_with("linux-vdso") {
            continue;
        }
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(LddError::NotFound(name.trim().to_string()));
                }
                rest
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.push(path.to_string());
        } else if !path.is_empty() && !line.contains("=>") {
            return Err(LddError::Unreadable(line.to_string()));
        }
    }
    Ok(libs)
}

/// gzip with a fixed header (mtime 0, no name) and a fixed level, so the bytes only depend on
/// the input.
pub fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(3)
        .write(Vec::new(), flate2::Compression::new(9));
    enc.write_all(data)?;
    enc.finish()
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    let tmp = path.with_extension("tmp");
    let w = |source| BuildError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, bytes).map_err(w)?;
    std::fs::rename(&tmp, path).map_err(w)
}

/// Why a file cannot be `/init` ([`check_static`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StaticError {
    #[error("not a 64-bit little-endian ELF file")]
    NotElf64,
    #[error("program header table out of bounds")]
    OutOfBounds,
    #[error("ELF type {0} is not an executable")]
    NotExecutable(u16),
    #[error(
        "it has an ELF interpreter (dynamically linked); build with RUSTFLAGS=\"-C target-feature=+crt-static\" --target x86_64-unknown-linux-gnu"
    )]
    Interpreter,
}

/// Refuses anything but an ELF executable without an interpreter (a dynamically linked `/init`
/// fails with "No such file or directory" and the kernel panics).
pub fn check_static(elf: &[u8]) -> Result<(), StaticError> {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err(StaticError::NotElf64);
    }
    let bad = || StaticError::OutOfBounds;
    let etype = u16::from_le_bytes([*elf.get(16).ok_or_else(bad)?, *elf.get(17).ok_or_else(bad)?]);
    if etype != 2 && etype != 3 {
        return Err(StaticError::NotExecutable(etype));
    }
    let phoff = u64::from_le_bytes(
        elf.get(0x20..0x28)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let phentsize = u16::from_le_bytes(
        elf.get(0x36..0x38)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let phnum = u16::from_le_bytes(
        elf.get(0x38..0x3a)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    let phoff = usize::try_from(phoff).map_err(|_| bad())?;
    for i in 0..usize::from(phnum) {
        let at = phoff + i * usize::from(phentsize);
        let ptype = u32::from_le_bytes(
            elf.get(at..at + 4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        if ptype == 3 {
            return Err(StaticError::Interpreter);
        }
    }
    Ok(())
}

/// The kernel version of an extracted package tree and its `boot/vmlinuz-<version>`.
pub fn find_kernel(tree: &Path) -> Result<(String, PathBuf), BuildError> {
    let mods = tree.join("lib/modules");
    let mut found = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&mods) {
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str() {
                found.push(n.to_string());
            }
        }
    }
    found.sort();
    let with_kernel: Vec<&String> = found
        .iter()
        .filter(|v| tree.join(format!("boot/vmlinuz-{v}")).is_file())
        .collect();
    match with_kernel.as_slice() {
        [v] => Ok(((*v).clone(), tree.join(format!("boot/vmlinuz-{v}")))),
        _ => Err(BuildError::NoKernel {
            dir: tree.to_path_buf(),
            found,
        }),
    }
}

/// The real package behind a metapackage, from `apt-cache depends` output: the first
/// `Depends: linux-image-…` (alternatives marked `|` included).
pub fn real_kernel_package(apt_cache_depends: &str) -> Option<String> {
    apt_cache_depends.lines().find_map(|l| {
        let l = l.trim().trim_start_matches('|');
        let dep = l.strip_prefix("Depends:")?.trim();
        let dep = dep.trim_start_matches('<').trim_end_matches('>');
        dep.starts_with("linux-image-").then(|| dep.to_string())
    })
}

/// Resolves, downloads and extracts a kernel package into `cache/<package>/` (skipped when that
/// directory is complete), returning the extracted tree.
pub fn extract_kernel_package(package: &str, cache: &Path) -> Result<PathBuf, BuildError> {
    std::fs::create_dir_all(cache).map_err(|source| BuildError::Write {
        path: cache.to_path_buf(),
        source,
    })?;
    // A real image package is named by its ABI (`linux-image-6.1.0-56-amd64`); anything else
    // is a metapackage that depends on one.
    let is_real = package
        .strip_prefix("linux-image-")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    let real = if is_real {
        package.to_string()
    } else {
        let out = run(Command::new("apt-cache").arg("depends").arg(package))?;
        real_kernel_package(&out).ok_or_else(|| BuildError::NoKernelPackage {
            package: package.to_string(),
            output: out,
        })?
    };
    let tree = cache.join(&real);
    let marker = tree.join(".paddock-extracted");
    if marker.is_file() {
        return Ok(tree);
    }
    let deb = match find_deb(cache, &real)? {
        Some(d) => d,
        None => {
            run(Command::new("apt-get")
                .arg("download")
                .arg(&real)
                .current_dir(cache))?;
            find_deb(cache, &real)?.ok_or_else(|| BuildError::Command {
                cmd: format!("apt-get download {real}"),
                why: format!("no {real}_*.deb appeared in {}", cache.display()),
            })?
        }
    };
    let tmp = cache.join(format!("{real}.partial"));
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
    let w = |source| BuildError::Write {
        path: tree.clone(),
        source,
    };
    std::fs::write(
        tmp.join(".paddock-extracted"),
        format!("{}\n", deb.display()),
    )
    .map_err(w)?;
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::rename(&tmp, &tree).map_err(w)?;
    Ok(tree)
}

fn find_deb(cache: &Path, package: &str) -> Result<Option<PathBuf>, BuildError> {
    let rd = std::fs::read_dir(cache).map_err(|source| BuildError::Read {
        path: cache.to_path_buf(),
        source,
    })?;
    let prefix = format!("{package}_");
    let mut debs: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .collect();
    debs.sort();
    Ok(debs.pop())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metapackage_resolution() {
        let cases = [
            (
                "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n",
                Some("linux-image-6.1.0-56-amd64"),
            ),
            (
                "linux-image-amd64\n |Depends: linux-image-6.1.0-56-amd64\n  Depends: linux-image-6.1.0-56-amd64-unsigned\n",
                Some("linux-image-6.1.0-56-amd64"),
            ),
            (
                "linux-image-amd64\n  Depends: <linux-image-6.1.0-9-amd64>\n",
                Some("linux-image-6.1.0-9-amd64"),
            ),
            (
                "linux-image-6.1.0-56-amd64\n  Depends: kmod\n  Depends: linux-base\n",
                None,
            ),
            ("", None),
        ];
        for (out, want) in cases {
            assert_eq!(real_kernel_package(out).as_deref(), want, "{out}");
        }
    }

    /// A minimal static ELF executable header (no program headers → no interpreter).
    pub(crate) fn fake_static_exe(payload: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        e[16] = 2; // ET_EXEC
        e.extend_from_slice(payload);
        e
    }

    fn with_interp() -> Vec<u8> {
        let mut e = vec![0u8; 64 + 56];
        e[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        e[16] = 3; // ET_DYN
        e[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        e[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        e[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        e[64..68].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        e
    }

    #[test]
    fn ldd_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd4b3f2000)\n\
                   \tlibblkid.so.1 => /lib/x86_64-linux-gnu/libblkid.so.1 (0x00007f0b1c6a0000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0b1c4bf000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f0b1c72a000)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libblkid.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
        assert_eq!(
            parse_ldd("\tnot a dynamic executable\n").unwrap_err(),
            LddError::Unreadable("not a dynamic executable".into())
        );
        assert_eq!(
            parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err(),
            LddError::NotFound("libfoo.so.1".into())
        );
        assert_eq!(
            parse_ldd("\tstatically linked\n").unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(find_tool("/x/y"), Some(PathBuf::from("/x/y")));
        assert_eq!(find_tool("no-such-tool-paddock"), None);
    }

    #[test]
    fn only_static_executables_become_init() {
        assert_eq!(check_static(&fake_static_exe(b"x")), Ok(()));
        assert!(
            check_static(&with_interp())
                .unwrap_err()
                .to_string()
                .contains("dynamically linked")
        );
        assert!(
            check_static(b"#!/bin/sh\n")
                .unwrap_err()
                .to_string()
                .contains("not a 64-bit")
        );
        let mut rel = fake_static_exe(b"");
        rel[16] = 1;
        assert!(
            check_static(&rel)
                .unwrap_err()
                .to_string()
                .contains("not an executable")
        );
    }

    fn fake_tree(dir: &Path, compressed: bool) {
        let v = "6.1.0-99-amd64";
        std::fs::create_dir_all(dir.join("boot")).unwrap();
        std::fs::write(dir.join(format!("boot/vmlinuz-{v}")), b"KERNEL").unwrap();
        let m = dir.join(format!("lib/modules/{v}/kernel/drivers"));
        std::fs::create_dir_all(m.join("net")).unwrap();
        std::fs::create_dir_all(m.join("virtio")).unwrap();
        let net = kmod::fake_module(&[("depends", "virtio,virtio_ring")]);
        if compressed {
            let mut c = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            c.write_all(&net).unwrap();
            std::fs::write(m.join("net/virtio_net.ko.gz"), c.finish().unwrap()).unwrap();
        } else {
            std::fs::write(m.join("net/virtio_net.ko"), &net).unwrap();
        }
        std::fs::write(
            m.join("virtio/virtio.ko"),
            kmod::fake_module(&[("depends", "")]),
        )
        .unwrap();
        std::fs::write(
            m.join("virtio/virtio_ring.ko"),
            kmod::fake_module(&[("depends", "")]),
        )
        .unwrap();
        std::fs::write(
            dir.join(format!("lib/modules/{v}/modules.builtin")),
            "kernel/drivers/block/loop.ko\n",
        )
        .unwrap();
    }

    fn spec(t: &Path, out: &str) -> BuildSpec {
        std::fs::write(t.join("agent"), fake_static_exe(b"agent")).unwrap();
        std::fs::write(t.join("busybox"), fake_static_exe(b"busybox")).unwrap();
        let mut s = BuildSpec::new(t.join("agent"), t.join(out), t.join("cache"));
        s.busybox = t.join("busybox");
        s.kernel = KernelSource::Extracted(t.join("tree"));
        s.modules = vec!["virtio_net".into(), "loop".into()];
        s
    }

    fn inflate(path: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()),
            &mut out,
        )
        .unwrap();
        out
    }

    #[test]
    fn build_is_reproducible_and_complete() {
        let t = tempfile::tempdir().unwrap();
        fake_tree(&t.path().join("tree"), false);
        let with_tools = |out: &str| {
            let mut s = spec(t.path(), out);
            std::fs::write(t.path().join("paddock-subd"), fake_static_exe(b"subd")).unwrap();
            s.programs = vec![t.path().join("paddock-subd")];
            // A dynamically linked tool of the host (ldd resolves its libraries).
            s.tools = vec![find_tool("ls").unwrap()];
            s
        };
        let a = build(&with_tools("out-a")).unwrap();
        let b = build(&with_tools("out-b")).unwrap();
        assert_eq!(
            std::fs::read(&a.initrd).unwrap(),
            std::fs::read(&b.initrd).unwrap()
        );
        assert_eq!(std::fs::read(&a.vmlinuz).unwrap(), b"KERNEL");
        assert_eq!(a.kernel_version, "6.1.0-99-amd64");
        assert_eq!(a.modules, vec!["virtio", "virtio_ring", "virtio_net"]);
        assert_eq!(a.builtin, vec!["loop"]);
        assert!(!a.decompressed_modules);
        // gzip header: magic, deflate, no flags, mtime 0.
        let gz = std::fs::read(&a.initrd).unwrap();
        assert_eq!(&gz[..8], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]);

        let entries = cpio::parse(&inflate(&a.initrd)).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        for want in [
            "init",
            "bin/busybox",
            "bin/sh",
            "dev/console",
            "etc/paddock/udhcpc.script",
            "etc/paddock/modules",
            "etc/nsswitch.conf",
            "etc/hosts",
            "proc",
            "sys",
            "run",
            "tmp",
            "lib/modules/6.1.0-99-amd64/kernel/drivers/net/virtio_net.ko",
            "bin/chroot",
            "bin/paddock-subd",
            "usr/sbin/ls",
            "lib64/ld-linux-x86-64.so.2",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(
            names.iter().any(|n| n.ends_with("/libc.so.6")),
            "the tools' libraries: {names:?}"
        );
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        let list = entries
            .iter()
            .find(|e| e.name == "etc/paddock/modules")
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&list.data),
            "/lib/modules/6.1.0-99-amd64/kernel/drivers/virtio/virtio.ko\n\
             /lib/modules/6.1.0-99-amd64/kernel/drivers/virtio/virtio_ring.ko\n\
             /lib/modules/6.1.0-99-amd64/kernel/drivers/net/virtio_net.ko\n"
        );
        assert!(
            entries
                .iter()
                .all(|e| e.header.mtime == 0 && e.header.uid == 0 && e.header.gid == 0)
        );
        let init = entries.iter().find(|e| e.name == "init").unwrap();
        assert_eq!(init.header.mode, 0o100755);
    }

    #[test]
    fn compressed_modules_are_stored_plain() {
        let t = tempfile::tempdir().unwrap();
        fake_tree(&t.path().join("tree"), true);
        let a = build(&spec(t.path(), "out")).unwrap();
        assert!(a.decompressed_modules);
        let entries = cpio::parse(&inflate(&a.initrd)).unwrap();
        let m = entries
            .iter()
            .find(|e| e.name == "lib/modules/6.1.0-99-amd64/kernel/drivers/net/virtio_net.ko")
            .unwrap();
        assert_eq!(
            kmod::modinfo(&m.data).unwrap()[0],
            ("depends".to_string(), "virtio,virtio_ring".to_string())
        );
    }

    #[test]
    fn bad_inputs_are_explained() {
        let t = tempfile::tempdir().unwrap();
        fake_tree(&t.path().join("tree"), false);
        let mut s = spec(t.path(), "out");
        s.modules = vec!["nosuchdriver".into()];
        assert!(
            build(&s)
                .unwrap_err()
                .to_string()
                .contains("`nosuchdriver` is not in this kernel")
        );
        let mut s = spec(t.path(), "out");
        std::fs::write(t.path().join("dyn"), with_interp()).unwrap();
        s.agent = t.path().join("dyn");
        let e = build(&s).unwrap_err().to_string();
        assert!(e.contains("agent") && e.contains("crt-static"), "{e}");
        let mut s = spec(t.path(), "out");
        s.kernel = KernelSource::Extracted(t.path().join("nope"));
        assert!(
            build(&s)
                .unwrap_err()
                .to_string()
                .contains("holds no kernel")
        );
    }
}
