//! A file-system tree: an inode table and the paths that name the inodes.
//!
//! Paths are absolute and normalised (`/`, `/etc`, `/etc/passwd`; no trailing `/`, no `.`
//! or `..`). Several paths naming one regular, symlink or special inode are hard links; a
//! directory has exactly one path. Directory mtimes are not tracked and symlinks have no
//! mode or mtime, as in Dominator; a regular file's content is its object (none when empty).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::object::ObjectId;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mtime {
    pub sec: i64,
    pub nsec: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecialKind {
    Char,
    Block,
    Fifo,
}

/// One inode. `mode` holds the permission bits only (`0o7777`); the kind is the variant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Inode {
    Directory {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Regular {
        mode: u32,
        uid: u32,
        gid: u32,
        mtime: Mtime,
        size: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        object: Option<ObjectId>,
    },
    Symlink {
        uid: u32,
        gid: u32,
        target: String,
    },
    Special {
        special: SpecialKind,
        mode: u32,
        uid: u32,
        gid: u32,
        mtime: Mtime,
        rdev: u64,
    },
}

impl Inode {
    pub fn is_dir(&self) -> bool {
        matches!(self, Inode::Directory { .. })
    }

    /// The object holding this inode's bytes (regular files that are not empty).
    pub fn object(&self) -> Option<ObjectId> {
        match self {
            Inode::Regular { object, .. } => *object,
            _ => None,
        }
    }

    pub fn size(&self) -> u64 {
        match self {
            Inode::Regular { size, .. } => *size,
            _ => 0,
        }
    }

    /// Dominator's comparison (`lib/filesystem/compare.go`): every tracked attribute.
    pub fn same(&self, other: &Inode) -> bool {
        self == other
    }

    /// The same kind and content (object, symlink target, device number); only ownership,
    /// mode or mtime may differ: a metadata-only change, made without fetching anything.
    pub fn same_content(&self, other: &Inode) -> bool {
        match (self, other) {
            (Inode::Directory { .. }, Inode::Directory { .. }) => true,
            (
                Inode::Regular {
                    size: a, object: x, ..
                },
                Inode::Regular {
                    size: b, object: y, ..
                },
            ) => a == b && x == y,
            (Inode::Symlink { target: a, .. }, Inode::Symlink { target: b, .. }) => a == b,
            (
                Inode::Special {
                    special: a,
                    rdev: x,
                    ..
                },
                Inode::Special {
                    special: b,
                    rdev: y,
                    ..
                },
            ) => a == b && x == y,
            _ => false,
        }
    }

    /// Equal except possibly for the mtime (trigger matching ignores mtime-only changes).
    pub fn same_but_mtime(&self, other: &Inode) -> bool {
        match (self, other) {
            (
                Inode::Regular {
                    mode: m1,
                    uid: u1,
                    gid: g1,
                    size: s1,
                    object: o1,
                    ..
                },
                Inode::Regular {
                    mode: m2,
                    uid: u2,
                    gid: g2,
                    size: s2,
                    object: o2,
                    ..
                },
            ) => (m1, u1, g1, s1, o1) == (m2, u2, g2, s2, o2),
            (
                Inode::Special {
                    special: k1,
                    mode: m1,
                    uid: u1,
                    gid: g1,
                    rdev: r1,
                    ..
                },
                Inode::Special {
                    special: k2,
                    mode: m2,
                    uid: u2,
                    gid: g2,
                    rdev: r2,
                    ..
                },
            ) => (k1, m1, u1, g1, r1) == (k2, m2, u2, g2, r2),
            _ => self == other,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    #[error("path {0:?} is not absolute")]
    NotAbsolute(String),
    #[error("path {0:?} has a `..` component")]
    DotDot(String),
    #[error("path {0:?} has a NUL byte")]
    Nul(String),
    #[error("path {0:?} is already in the tree")]
    Exists(String),
    #[error("the parent of {0:?} is not a directory in the tree")]
    NoParent(String),
    #[error("{0:?} is not in the tree")]
    Missing(String),
    #[error("{0:?} is a directory; directories cannot be hard-linked")]
    DirectoryLink(String),
    #[error("{path:?}: {why}")]
    Invalid { path: String, why: String },
}

/// Normalises a path inside an image: absolute, `.` and empty components dropped; `..` and
/// NUL refused. A relative path (as in a tar member) is taken relative to the root.
pub fn normalize(path: &str) -> Result<String, TreeError> {
    if path.contains('\0') {
        return Err(TreeError::Nul(path.into()));
    }
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(TreeError::DotDot(path.into())),
            p => {
                out.push('/');
                out.push_str(p);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// The parent of a normalised path (`None` for the root).
pub fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

/// A tree. Inode numbers are the tree's own (not the source file system's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSystem {
    pub inodes: BTreeMap<u64, Inode>,
    pub paths: BTreeMap<String, u64>,
}

impl FileSystem {
    /// A tree holding only its root directory.
    pub fn with_root(mode: u32, uid: u32, gid: u32) -> Self {
        let mut fs = FileSystem::default();
        fs.inodes.insert(1, Inode::Directory { mode, uid, gid });
        fs.paths.insert("/".into(), 1);
        fs
    }

    fn next_ino(&self) -> u64 {
        self.inodes.keys().next_back().map_or(1, |n| n + 1)
    }

    /// Adds a new inode at `path` (normalised); the parent must be a directory already.
    /// Adding a directory that exists updates its metadata (tar archives may name a
    /// directory after its contents).
    pub fn insert(&mut self, path: &str, inode: Inode) -> Result<u64, TreeError> {
        let path = normalize(path)?;
        if let Some(&ino) = self.paths.get(&path) {
            if inode.is_dir() && self.inodes.get(&ino).is_some_and(Inode::is_dir) {
                self.inodes.insert(ino, inode);
                return Ok(ino);
            }
            return Err(TreeError::Exists(path));
        }
        self.check_parent(&path)?;
        let ino = self.next_ino();
        self.inodes.insert(ino, inode);
        self.paths.insert(path, ino);
        Ok(ino)
    }

    /// Makes `path` another name for the inode at `existing` (a hard link).
    pub fn link(&mut self, path: &str, existing: &str) -> Result<u64, TreeError> {
        let path = normalize(path)?;
        let existing = normalize(existing)?;
        let ino = *self
            .paths
            .get(&existing)
            .ok_or_else(|| TreeError::Missing(existing.clone()))?;
        if self.inodes.get(&ino).is_some_and(Inode::is_dir) {
            return Err(TreeError::DirectoryLink(existing));
        }
        if self.paths.contains_key(&path) {
            return Err(TreeError::Exists(path));
        }
        self.check_parent(&path)?;
        self.paths.insert(path, ino);
        Ok(ino)
    }

    fn check_parent(&self, path: &str) -> Result<(), TreeError> {
        let p = parent(path).ok_or_else(|| TreeError::Exists(path.into()))?;
        match self.paths.get(p).and_then(|i| self.inodes.get(i)) {
            Some(i) if i.is_dir() => Ok(()),
            _ => Err(TreeError::NoParent(path.into())),
        }
    }

    pub fn get(&self, path: &str) -> Option<&Inode> {
        self.paths.get(path).and_then(|i| self.inodes.get(i))
    }

    /// Every path naming each inode, in path order.
    pub fn names(&self) -> BTreeMap<u64, Vec<&str>> {
        let mut m: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for (p, i) in &self.paths {
            m.entry(*i).or_default().push(p);
        }
        m
    }

    /// The objects the tree needs, with their sizes.
    pub fn objects(&self) -> BTreeMap<ObjectId, u64> {
        self.inodes
            .values()
            .filter_map(|i| i.object().map(|o| (o, i.size())))
            .collect()
    }

    /// Bytes of regular-file content (each inode once, however many names it has).
    pub fn total_bytes(&self) -> u64 {
        self.inodes.values().map(Inode::size).sum()
    }

    /// Checks the invariants: a root directory, normalised paths, every parent a directory,
    /// every inode named, no hard-linked directory, non-empty regular files with an object,
    /// empty ones without, permission bits only in modes.
    pub fn validate(&self) -> Result<(), TreeError> {
        match self.get("/") {
            Some(i) if i.is_dir() => {}
            _ => return Err(TreeError::Missing("/".into())),
        }
        let names = self.names();
        for (ino, inode) in &self.inodes {
            let Some(paths) = names.get(ino) else {
                return Err(TreeError::Invalid {
                    path: format!("inode {ino}"),
                    why: "no path names it".into(),
                });
            };
            if inode.is_dir() && paths.len() > 1 {
                return Err(TreeError::DirectoryLink(paths[0].into()));
            }
            let bad = |why: &str| TreeError::Invalid {
                path: paths[0].into(),
                why: why.into(),
            };
            match inode {
                Inode::Regular {
                    size, object, mode, ..
                } => {
                    if (*size == 0) != object.is_none() {
                        return Err(bad("an empty file has no object; any other has one"));
                    }
                    if mode & !0o7777 != 0 {
                        return Err(bad("mode has more than permission bits"));
                    }
                }
                Inode::Directory { mode, .. } | Inode::Special { mode, .. } => {
                    if mode & !0o7777 != 0 {
                        return Err(bad("mode has more than permission bits"));
                    }
                }
                Inode::Symlink { target, .. } => {
                    if target.is_empty() || target.contains('\0') {
                        return Err(bad("bad symlink target"));
                    }
                }
            }
        }
        for (path, ino) in &self.paths {
            if normalize(path)? != *path {
                return Err(TreeError::Invalid {
                    path: path.clone(),
                    why: "not normalised".into(),
                });
            }
            if !self.inodes.contains_key(ino) {
                return Err(TreeError::Invalid {
                    path: path.clone(),
                    why: format!("names inode {ino}, which is not in the table"),
                });
            }
            if path != "/" {
                self.check_parent(path)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(n: u8) -> Inode {
        Inode::Regular {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: Mtime { sec: 1, nsec: 0 },
            size: 1,
            object: Some(ObjectId::of(&[n])),
        }
    }

    fn dir() -> Inode {
        Inode::Directory {
            mode: 0o755,
            uid: 0,
            gid: 0,
        }
    }

    #[test]
    fn normalising() {
        assert_eq!(normalize("./etc//passwd").unwrap(), "/etc/passwd");
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(normalize("./").unwrap(), "/");
        assert_eq!(normalize("usr/bin/").unwrap(), "/usr/bin");
        assert!(matches!(
            normalize("a/../../etc"),
            Err(TreeError::DotDot(_))
        ));
        assert!(matches!(normalize("a\0b"), Err(TreeError::Nul(_))));
        assert_eq!(parent("/etc/passwd"), Some("/etc"));
        assert_eq!(parent("/etc"), Some("/"));
        assert_eq!(parent("/"), None);
    }

    #[test]
    fn building_and_validating() {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        assert!(matches!(
            fs.insert("/etc/passwd", file(1)),
            Err(TreeError::NoParent(_))
        ));
        fs.insert("/etc", dir()).unwrap();
        let a = fs.insert("/etc/passwd", file(1)).unwrap();
        assert!(matches!(
            fs.insert("/etc/passwd", file(2)),
            Err(TreeError::Exists(_))
        ));
        assert_eq!(fs.link("/etc/passwd-", "/etc/passwd").unwrap(), a);
        assert!(matches!(
            fs.link("/x", "/etc"),
            Err(TreeError::DirectoryLink(_))
        ));
        assert!(matches!(
            fs.link("/etc/passwd/x", "/etc/passwd"),
            Err(TreeError::NoParent(_))
        ));
        // A directory named again (tar lists it after its contents) takes the new metadata.
        fs.insert(
            "/etc",
            Inode::Directory {
                mode: 0o700,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        assert_eq!(
            fs.get("/etc"),
            Some(&Inode::Directory {
                mode: 0o700,
                uid: 0,
                gid: 0
            })
        );
        fs.validate().unwrap();
        assert_eq!(fs.objects().len(), 1);
        assert_eq!(fs.total_bytes(), 1);
        assert_eq!(fs.names()[&a], vec!["/etc/passwd", "/etc/passwd-"]);
        let json = serde_json::to_string(&fs).unwrap();
        assert_eq!(serde_json::from_str::<FileSystem>(&json).unwrap(), fs);

        let mut broken = fs.clone();
        broken.inodes.insert(
            a,
            Inode::Regular {
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime: Mtime::default(),
                size: 0,
                object: Some(ObjectId::of(b"")),
            },
        );
        assert!(broken.validate().is_err());
        let mut broken = fs.clone();
        broken.paths.insert("/etc/../x".into(), a);
        assert!(broken.validate().is_err());
    }

    #[test]
    fn comparisons() {
        let a = file(1);
        let mut b = a.clone();
        if let Inode::Regular { mtime, .. } = &mut b {
            mtime.sec = 2;
        }
        assert!(!a.same(&b) && a.same_but_mtime(&b) && a.same_content(&b));
        let mut c = a.clone();
        if let Inode::Regular { uid, .. } = &mut c {
            *uid = 5;
        }
        assert!(!a.same_but_mtime(&c) && a.same_content(&c));
        assert!(!a.same_content(&file(2)));
        assert!(!a.same_content(&dir()));
    }
}
