//! Kernel module lookup and dependency resolution over an extracted `lib/modules/<version>` tree.
//!
//! Debian's kernel packages do not ship `modules.dep` (their postinst runs `depmod`), so when it
//! is missing the dependencies are read from each module's own `.modinfo` ELF section
//! (`depends=` and `softdep=pre:`), which is what depmod itself reads for them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ModError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "kernel module `{0}` is not in this kernel (not in lib/modules/<version>/kernel, nor built in); check the name with `find lib/modules -name '{0}.ko*'`"
    )]
    Unknown(String),
    #[error("{path} is not a kernel module: {why}")]
    BadElf { path: PathBuf, why: String },
    #[error("module dependency cycle through `{0}`")]
    Cycle(String),
}

/// Module names compare with `-` and `_` equal (the kernel does the same).
pub fn canonical_name(name: &str) -> String {
    name.trim().replace('-', "_")
}

/// The name of a module file: `kernel/drivers/net/virtio_net.ko.xz` → `virtio_net`.
pub fn name_of(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = file
        .strip_suffix(".ko")
        .or_else(|| file.strip_suffix(".ko.xz"))
        .or_else(|| file.strip_suffix(".ko.zst"))
        .or_else(|| file.strip_suffix(".ko.gz"))?;
    Some(canonical_name(stem))
}

/// Every module of a kernel: canonical name → path relative to `lib/modules/<version>`.
#[derive(Clone, Debug, Default)]
pub struct ModuleIndex {
    pub dir: PathBuf,
    pub files: BTreeMap<String, String>,
    pub builtin: BTreeSet<String>,
    /// From `modules.dep` when the tree has one: name → dependency names.
    pub dep_file: Option<BTreeMap<String, Vec<String>>>,
}

impl ModuleIndex {
    /// Scans `dir` (a `lib/modules/<version>` directory).
    pub fn scan(dir: &Path) -> Result<Self, ModError> {
        let mut files = BTreeMap::new();
        walk(dir, &dir.join("kernel"), &mut files)?;
        let builtin = match std::fs::read_to_string(dir.join("modules.builtin")) {
            Ok(s) => s.lines().filter_map(name_of).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(e) => {
                return Err(ModError::Io {
                    path: dir.join("modules.builtin"),
                    source: e,
                });
            }
        };
        let dep_file = match std::fs::read_to_string(dir.join("modules.dep")) {
            Ok(s) => Some(parse_modules_dep(&s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(ModError::Io {
                    path: dir.join("modules.dep"),
                    source: e,
                });
            }
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            builtin,
            dep_file,
        })
    }

    /// Direct dependencies of one module (hard deps, then soft `pre:` deps that exist as files).
    fn deps_of(&self, name: &str) -> Result<Vec<String>, ModError> {
        if let Some(dep) = &self.dep_file
            && let Some(d) = dep.get(name)
        {
            return Ok(d.clone());
        }
        let rel = self
            .files
            .get(name)
            .ok_or_else(|| ModError::Unknown(name.to_string()))?;
        let path = self.dir.join(rel);
        let bytes = read_module(&path)?;
        let info = modinfo(&bytes).map_err(|why| ModError::BadElf {
            path: path.clone(),
            why: why.to_string(),
        })?;
        let mut out = Vec::new();
        for (k, v) in &info {
            match k.as_str() {
                "depends" => out.extend(v.split(',').filter(|s| !s.is_empty()).map(canonical_name)),
                "softdep" => out.extend(
                    softdep_pre(v)
                        .into_iter()
                        .map(|s| canonical_name(&s))
                        .filter(|s| self.files.contains_key(s)),
                ),
                _ => {}
            }
        }
        Ok(out)
    }

    /// The modules to load for `wanted`, dependencies first, each once. Built-in modules are
    /// skipped (returned in the second list); an unknown name is an error.
    pub fn resolve(&self, wanted: &[String]) -> Result<(Vec<String>, Vec<String>), ModError> {
        let mut order = Vec::new();
        let mut done = BTreeSet::new();
        let mut builtin = Vec::new();
        for w in wanted {
            let w = canonical_name(w);
            if !self.files.contains_key(&w) {
                if self.builtin.contains(&w) {
                    builtin.push(w);
                    continue;
                }
                return Err(ModError::Unknown(w));
            }
            self.visit(&w, &mut Vec::new(), &mut done, &mut order)?;
        }
        Ok((order, builtin))
    }

    fn visit(
        &self,
        name: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<(), ModError> {
        if done.contains(name) || (!self.files.contains_key(name) && self.builtin.contains(name)) {
            return Ok(());
        }
        if stack.iter().any(|s| s == name) {
            return Err(ModError::Cycle(name.to_string()));
        }
        stack.push(name.to_string());
        for d in self.deps_of(name)? {
            self.visit(&d, stack, done, order)?;
        }
        stack.pop();
        done.insert(name.to_string());
        order.push(name.to_string());
        Ok(())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> Result<(), ModError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir != root.join("kernel") => {
            return Ok(());
        }
        Err(e) => {
            return Err(ModError::Io {
                path: dir.to_path_buf(),
                source: e,
            });
        }
    };
    for ent in rd {
        let ent = ent.map_err(|e| ModError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
        let p = ent.path();
        let ft = ent.file_type().map_err(|e| ModError::Io {
            path: p.clone(),
            source: e,
        })?;
        if ft.is_dir() {
            walk(root, &p, out)?;
        } else if let Ok(rel) = p.strip_prefix(root)
            && let Some(rel) = rel.to_str()
            && let Some(name) = name_of(rel)
        {
            out.insert(name, rel.to_string());
        }
    }
    Ok(())
}

/// `modules.dep` lines: `kernel/a/x.ko: kernel/b/y.ko kernel/c/z.ko`.
pub fn parse_modules_dep(s: &str) -> BTreeMap<String, Vec<String>> {
    s.lines()
        .filter_map(|l| {
            let (m, deps) = l.split_once(':')?;
            Some((
                name_of(m)?,
                deps.split_whitespace().filter_map(name_of).collect(),
            ))
        })
        .collect()
}

/// The `pre:` names of a `softdep=` value (`pre: a b post: c`).
pub fn softdep_pre(v: &str) -> Vec<String> {
    let mut pre = false;
    let mut out = Vec::new();
    for w in v.split_whitespace() {
        match w {
            "pre:" => pre = true,
            "post:" => pre = false,
            w if pre => out.push(w.to_string()),
            _ => {}
        }
    }
    out
}

/// A module file's bytes, decompressed (`.ko.xz`, `.ko.zst`, `.ko.gz`) with the host's
/// `xz`/`zstd`/`gzip` when needed: the ramdisk always carries plain `.ko` files, because
/// `finit_module` on compressed modules needs `CONFIG_MODULE_DECOMPRESS`.
pub fn read_module(path: &Path) -> Result<Vec<u8>, ModError> {
    let io = |e| ModError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let s = path.to_string_lossy();
    let tool = if s.ends_with(".ko.xz") {
        Some("xz")
    } else if s.ends_with(".ko.zst") {
        Some("zstd")
    } else if s.ends_with(".ko.gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => std::fs::read(path).map_err(io),
        Some(tool) => {
            let out = std::process::Command::new(tool)
                .arg("-dc")
                .arg(path)
                .output()
                .map_err(|e| ModError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        e.kind(),
                        format!("running `{tool} -dc` (install it): {e}"),
                    ),
                })?;
            if !out.status.success() {
                return Err(ModError::BadElf {
                    path: path.to_path_buf(),
                    why: format!(
                        "`{tool} -dc` failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
            Ok(out.stdout)
        }
    }
}

/// The path a module has inside the ramdisk: compression suffix dropped.
pub fn plain_path(rel: &str) -> String {
    for suf in [".ko.xz", ".ko.zst", ".ko.gz"] {
        if let Some(stem) = rel.strip_suffix(suf) {
            return format!("{stem}.ko");
        }
    }
    rel.to_string()
}

/// `len` bytes of `b` from `at`; `None` past its end, however large the offsets a file
/// claims (they are added without wrapping).
fn span(b: &[u8], at: usize, len: usize) -> Option<&[u8]> {
    b.get(at..at.checked_add(len)?)
}
fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(span(b, at, 2)?.try_into().ok()?))
}
fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(span(b, at, 4)?.try_into().ok()?))
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(span(b, at, 8)?.try_into().ok()?))
}

/// Why a file is not a module [`modinfo`] can read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    #[error("not a 64-bit little-endian ELF file")]
    NotElf64,
    #[error("section table out of bounds")]
    OutOfBounds,
    #[error("no .modinfo section")]
    NoModinfo,
}

/// The `key=value` strings of an ELF64 little-endian module's `.modinfo` section, in order.
pub fn modinfo(elf: &[u8]) -> Result<Vec<(String, String)>, ElfError> {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err(ElfError::NotElf64);
    }
    let short = || ElfError::OutOfBounds;
    let shoff = usize::try_from(le_u64(elf, 0x28).ok_or_else(short)?).map_err(|_| short())?;
    let shentsize = usize::from(le_u16(elf, 0x3a).ok_or_else(short)?);
    let shnum = usize::from(le_u16(elf, 0x3c).ok_or_else(short)?);
    let shstrndx = usize::from(le_u16(elf, 0x3e).ok_or_else(short)?);
    let section = |i: usize| -> Result<(u32, usize, usize), ElfError> {
        let at = i
            .checked_mul(shentsize)
            .and_then(|o| o.checked_add(shoff))
            .ok_or_else(short)?;
        let field = |o: usize| {
            let v = le_u64(elf, at.checked_add(o).ok_or_else(short)?).ok_or_else(short)?;
            usize::try_from(v).map_err(|_| short())
        };
        let name = le_u32(elf, at).ok_or_else(short)?;
        Ok((name, field(0x18)?, field(0x20)?))
    };
    let (_, stroff, strsize) = section(shstrndx)?;
    let strtab = span(elf, stroff, strsize).ok_or_else(short)?;
    for i in 0..shnum {
        let (name, off, size) = section(i)?;
        let n = strtab
            .get(usize::try_from(name).map_err(|_| short())?..)
            .ok_or_else(short)?;
        let n = &n[..n.iter().position(|&b| b == 0).unwrap_or(n.len())];
        if n == b".modinfo" {
            let data = span(elf, off, size).ok_or_else(short)?;
            return Ok(data
                .split(|&b| b == 0)
                .filter_map(|kv| {
                    let kv = std::str::from_utf8(kv).ok()?;
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.to_string()))
                })
                .collect());
        }
    }
    Err(ElfError::NoModinfo)
}

/// Builds a minimal ELF64 file with a `.modinfo` section (tests, and the builder's tests).
#[doc(hidden)]
pub fn fake_module(modinfo: &[(&str, &str)]) -> Vec<u8> {
    let mut info = Vec::new();
    for (k, v) in modinfo {
        info.extend_from_slice(format!("{k}={v}").as_bytes());
        info.push(0);
    }
    let shstr = b"\0.modinfo\0.shstrtab\0".to_vec();
    let mut elf = vec![0u8; 64];
    elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
    elf[6] = 1;
    elf[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    let info_off = elf.len();
    elf.extend_from_slice(&info);
    let str_off = elf.len();
    elf.extend_from_slice(&shstr);
    while !elf.len().is_multiple_of(8) {
        elf.push(0);
    }
    let shoff = elf.len();
    let mut sh = |name: u32, off: usize, size: usize| {
        let mut s = [0u8; 64];
        s[..4].copy_from_slice(&name.to_le_bytes());
        s[4..8].copy_from_slice(&(if name == 0 { 0u32 } else { 1 }).to_le_bytes());
        s[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        s[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        elf.extend_from_slice(&s);
    };
    sh(0, 0, 0);
    sh(1, info_off, info.len());
    sh(10, str_off, shstr.len());
    elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    elf[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
    elf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_module_files() {
        let cases = [
            ("kernel/drivers/net/virtio_net.ko", Some("virtio_net")),
            (
                "kernel/drivers/nvme/host/nvme-core.ko.xz",
                Some("nvme_core"),
            ),
            ("kernel/block/t10-pi.ko.zst", Some("t10_pi")),
            ("kernel/x/y.ko.gz", Some("y")),
            ("kernel/x/README", None),
        ];
        for (p, want) in cases {
            assert_eq!(name_of(p).as_deref(), want, "{p}");
        }
        assert_eq!(plain_path("kernel/a/b.ko.xz"), "kernel/a/b.ko");
        assert_eq!(plain_path("kernel/a/b.ko"), "kernel/a/b.ko");
    }

    #[test]
    fn modinfo_is_read_from_the_elf_section() {
        let elf = fake_module(&[
            ("license", "GPL"),
            ("depends", "virtio_ring,virtio,net_failover"),
            ("softdep", "pre: crc32c post: x"),
        ]);
        let info = modinfo(&elf).unwrap();
        assert_eq!(
            info,
            vec![
                ("license".to_string(), "GPL".to_string()),
                ("depends".into(), "virtio_ring,virtio,net_failover".into()),
                ("softdep".into(), "pre: crc32c post: x".into()),
            ]
        );
        assert_eq!(modinfo(b"not an elf").unwrap_err(), ElfError::NotElf64);
        assert_eq!(modinfo(&elf[..70]).unwrap_err(), ElfError::OutOfBounds);
        // Offsets near the top of the address space: refused, not wrapped around.
        let mut huge = elf.clone();
        huge[0x28..0x30].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert_eq!(modinfo(&huge).unwrap_err(), ElfError::OutOfBounds);
        assert!(
            ElfError::OutOfBounds
                .to_string()
                .contains("section table out of bounds")
        );
        assert_eq!(softdep_pre("pre: a b post: c"), vec!["a", "b"]);
        assert_eq!(softdep_pre("post: c"), Vec::<String>::new());
    }

    #[test]
    fn modules_dep_lines() {
        let dep = parse_modules_dep(
            "kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko\n\
             kernel/net/core/failover.ko:\n",
        );
        assert_eq!(dep["virtio_net"], vec!["net_failover", "failover"]);
        assert!(dep["failover"].is_empty());
    }

    fn tree(mods: &[(&str, &str)], builtin: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for (path, depends) in mods {
            let p = t.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, fake_module(&[("depends", depends)])).unwrap();
        }
        std::fs::write(t.path().join("modules.builtin"), builtin).unwrap();
        t
    }

    #[test]
    fn resolution_puts_dependencies_first_once() {
        let t = tree(
            &[
                (
                    "kernel/drivers/net/virtio_net.ko",
                    "virtio_ring,virtio,net_failover",
                ),
                ("kernel/drivers/net/net_failover.ko", "failover"),
                ("kernel/net/core/failover.ko", ""),
                ("kernel/drivers/virtio/virtio.ko", ""),
                ("kernel/drivers/virtio/virtio_ring.ko", ""),
                (
                    "kernel/drivers/virtio/virtio_pci.ko",
                    "virtio_ring,virtio_pci_modern_dev,virtio",
                ),
                ("kernel/drivers/virtio/virtio_pci_modern_dev.ko", ""),
                ("kernel/drivers/nvme/host/nvme.ko", "nvme-core"),
                ("kernel/drivers/nvme/host/nvme-core.ko", ""),
            ],
            "kernel/drivers/net/loopback.ko\n",
        );
        let idx = ModuleIndex::scan(t.path()).unwrap();
        let cases: &[(&[&str], &[&str], &[&str])] = &[
            (
                &["virtio_net"],
                &[
                    "virtio_ring",
                    "virtio",
                    "failover",
                    "net_failover",
                    "virtio_net",
                ],
                &[],
            ),
            (
                &["virtio_pci", "virtio_net"],
                &[
                    "virtio_ring",
                    "virtio_pci_modern_dev",
                    "virtio",
                    "virtio_pci",
                    "failover",
                    "net_failover",
                    "virtio_net",
                ],
                &[],
            ),
            (&["nvme", "loopback"], &["nvme_core", "nvme"], &["loopback"]),
            (&["nvme-core", "nvme_core"], &["nvme_core"], &[]),
        ];
        for (want, order, builtin) in cases {
            let wanted: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            let (o, b) = idx.resolve(&wanted).unwrap();
            assert_eq!(o, *order, "{want:?}");
            assert_eq!(b, *builtin, "{want:?}");
        }
        let e = idx
            .resolve(&["e1000x".to_string()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`e1000x` is not in this kernel"), "{e}");
    }

    #[test]
    fn cycles_and_modules_dep_are_handled() {
        let t = tree(&[("kernel/a.ko", "b"), ("kernel/b.ko", "a")], "");
        let idx = ModuleIndex::scan(t.path()).unwrap();
        assert!(
            idx.resolve(&["a".into()])
                .unwrap_err()
                .to_string()
                .contains("cycle")
        );
        // modules.dep, when present, wins over .modinfo.
        std::fs::write(
            t.path().join("modules.dep"),
            "kernel/a.ko: kernel/b.ko\nkernel/b.ko:\n",
        )
        .unwrap();
        let idx = ModuleIndex::scan(t.path()).unwrap();
        assert_eq!(idx.resolve(&["a".into()]).unwrap().0, vec!["b", "a"]);
    }
}
