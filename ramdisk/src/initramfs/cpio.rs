//! A minimal, reproducible writer for the `newc` cpio format the kernel unpacks as initramfs
//! (`Documentation/driver-api/early-userspace/buffer-format.rst`).
//!
//! Reproducible by construction: entries are written in byte order of their paths (so every
//! directory precedes its contents), inode numbers are assigned 1, 2, … in that order, and
//! uid, gid, mtime and device numbers are fixed by the caller, never read from the disk.

use std::collections::BTreeMap;

/// What an archive entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    /// A character device node (major, minor), e.g. `/dev/console` = (5, 1).
    CharDev(u32, u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// Permission bits only (the file type bits come from `kind`).
    pub perm: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;
const TRAILER: &str = "TRAILER!!!";

/// An archive being assembled: paths are relative (`bin/busybox`), without a leading `/`.
#[derive(Clone, Debug, Default)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
}

impl Archive {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) an entry, creating its missing parent directories (mode 0755).
    pub fn add(&mut self, path: &str, kind: Kind, perm: u32) {
        let path = path.trim_matches('/').to_string();
        let mut parent = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map(|(_, p)| p)
            .unwrap_or(&[])
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            self.entries.entry(parent.clone()).or_insert(Entry {
                kind: Kind::Dir,
                perm: 0o755,
            });
        }
        self.entries.insert(
            path,
            Entry {
                kind,
                perm: perm & 0o7777,
            },
        );
    }

    pub fn dir(&mut self, path: &str) {
        self.add(path, Kind::Dir, 0o755);
    }

    pub fn file(&mut self, path: &str, data: Vec<u8>, perm: u32) {
        self.add(path, Kind::File(data), perm);
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The archive as `newc` bytes, every entry owned by `0:0` with modification time `mtime`.
    /// `newc` sizes are 32 bits: an entry of 4 GiB or more (or a 4-billionth entry) is
    /// refused rather than written with a header that lies about it.
    pub fn to_bytes(&self, mtime: u32) -> Result<Vec<u8>, TooLarge> {
        let mut out = Vec::new();
        for (i, (path, entry)) in self.entries.iter().enumerate() {
            let too_large = |what: &'static str, n: usize| TooLarge {
                path: path.clone(),
                what,
                n,
            };
            let ino = u32::try_from(i + 1).map_err(|_| too_large("entries", i + 1))?;
            let (mode, nlink, data, rdev): (u32, u32, &[u8], (u32, u32)) = match &entry.kind {
                Kind::Dir => (S_IFDIR, 2, &[], (0, 0)),
                Kind::File(d) => (S_IFREG, 1, d, (0, 0)),
                Kind::Symlink(t) => (S_IFLNK, 1, t.as_bytes(), (0, 0)),
                Kind::CharDev(ma, mi) => (S_IFCHR, 1, &[], (*ma, *mi)),
            };
            let header = Header {
                ino,
                mode: mode | entry.perm,
                uid: 0,
                gid: 0,
                nlink,
                mtime,
                filesize: u32::try_from(data.len()).map_err(|_| too_large("bytes", data.len()))?,
                rdevmajor: rdev.0,
                rdevminor: rdev.1,
            };
            write_entry(&mut out, &header, path, data)?;
        }
        let trailer = Header {
            nlink: 1,
            ..Header::default()
        };
        write_entry(&mut out, &trailer, TRAILER, &[])?;
        Ok(out)
    }
}

/// An entry `newc`'s 32-bit header fields cannot describe.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {n} {what}, more than a newc cpio header can hold (at most 4,294,967,295)")]
pub struct TooLarge {
    pub path: String,
    pub what: &'static str,
    pub n: usize,
}

/// The header fields of one `newc` entry that we set (devmajor/devminor and check are 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub ino: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub mtime: u32,
    pub filesize: u32,
    pub rdevmajor: u32,
    pub rdevminor: u32,
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn write_entry(out: &mut Vec<u8>, h: &Header, name: &str, data: &[u8]) -> Result<(), TooLarge> {
    let namesize = u32::try_from(name.len() + 1).map_err(|_| TooLarge {
        path: name.to_string(),
        what: "bytes of name",
        n: name.len() + 1,
    })?;
    let fields = [
        h.ino,
        h.mode,
        h.uid,
        h.gid,
        h.nlink,
        h.mtime,
        h.filesize,
        0,
        0,
        h.rdevmajor,
        h.rdevminor,
        namesize,
        0,
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
    Ok(())
}

/// One parsed entry (for tests and for inspecting a built image).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub name: String,
    pub header: Header,
    pub data: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("cpio archive truncated at byte {0}")]
    Truncated(usize),
    #[error("bad cpio magic at byte {0} (want 070701, newc)")]
    Magic(usize),
    #[error("bad hex field in cpio header at byte {0}")]
    Hex(usize),
    #[error("cpio archive has no TRAILER!!! entry")]
    NoTrailer,
}

/// Parses a `newc` archive up to its trailer (which is not returned).
pub fn parse(bytes: &[u8]) -> Result<Vec<Parsed>, ParseError> {
    let mut pos = 0usize;
    let mut out = Vec::new();
    let align = |p: usize| p.div_ceil(4) * 4;
    loop {
        let head = bytes
            .get(pos..pos + 110)
            .ok_or(ParseError::Truncated(pos))?;
        if &head[..6] != b"070701" {
            return Err(ParseError::Magic(pos));
        }
        let mut f = [0u32; 13];
        for (i, v) in f.iter_mut().enumerate() {
            let s = std::str::from_utf8(&head[6 + i * 8..14 + i * 8])
                .map_err(|_| ParseError::Hex(pos))?;
            *v = u32::from_str_radix(s, 16).map_err(|_| ParseError::Hex(pos))?;
        }
        let namesize = f[11] as usize;
        let name_start = pos + 110;
        let name_bytes = bytes
            .get(name_start..name_start + namesize)
            .ok_or(ParseError::Truncated(name_start))?;
        let name = String::from_utf8_lossy(name_bytes.strip_suffix(&[0]).unwrap_or(name_bytes))
            .into_owned();
        let data_start = align(name_start + namesize);
        let size = f[6] as usize;
        let data = bytes
            .get(data_start..data_start + size)
            .ok_or(ParseError::Truncated(data_start))?
            .to_vec();
        pos = align(data_start + size);
        if name == TRAILER {
            return Ok(out);
        }
        let header = Header {
            ino: f[0],
            mode: f[1],
            uid: f[2],
            gid: f[3],
            nlink: f[4],
            mtime: f[5],
            filesize: f[6],
            rdevmajor: f[9],
            rdevminor: f[10],
        };
        out.push(Parsed { name, header, data });
        if pos >= bytes.len() {
            return Err(ParseError::NoTrailer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Archive {
        let mut a = Archive::new();
        // Added out of order on purpose: output order must not depend on insertion order.
        a.file("etc/paddock/modules", b"a.ko\nb.ko\n".to_vec(), 0o644);
        a.file("init", vec![0x7f, b'E', b'L', b'F', 1, 2, 3], 0o755);
        a.add("bin/sh", Kind::Symlink("busybox".into()), 0o777);
        a.add("dev/console", Kind::CharDev(5, 1), 0o600);
        a.dir("proc");
        a
    }

    #[test]
    fn round_trip_keeps_every_header_field() {
        let bytes = sample().to_bytes(0).unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let parsed = parse(&bytes).unwrap();
        let got: Vec<(&str, Header, &[u8])> = parsed
            .iter()
            .map(|p| (p.name.as_str(), p.header.clone(), &p.data[..]))
            .collect();
        // Owner, group and mtime are 0 throughout; the size is the data's.
        let entry = |name, ino, mode, nlink, (rdevmajor, rdevminor), data: &'static [u8]| {
            let header = Header {
                ino,
                mode,
                nlink,
                filesize: data.len() as u32,
                rdevmajor,
                rdevminor,
                ..Header::default()
            };
            (name, header, data)
        };
        let want = vec![
            entry("bin", 1, 0o040755, 2, (0, 0), b""),
            entry("bin/sh", 2, 0o120777, 1, (0, 0), b"busybox"),
            entry("dev", 3, 0o040755, 2, (0, 0), b""),
            entry("dev/console", 4, 0o020600, 1, (5, 1), b""),
            entry("etc", 5, 0o040755, 2, (0, 0), b""),
            entry("etc/paddock", 6, 0o040755, 2, (0, 0), b""),
            entry(
                "etc/paddock/modules",
                7,
                0o100644,
                1,
                (0, 0),
                b"a.ko\nb.ko\n",
            ),
            entry(
                "init",
                8,
                0o100755,
                1,
                (0, 0),
                &[0x7f, b'E', b'L', b'F', 1, 2, 3],
            ),
            entry("proc", 9, 0o040755, 2, (0, 0), b""),
        ];
        assert_eq!(got, want);
        for p in &parsed {
            assert_eq!(p.header.filesize as usize, p.data.len());
        }
    }

    #[test]
    fn header_layout_matches_newc() {
        let mut a = Archive::new();
        a.file("x", b"hello".to_vec(), 0o644);
        let b = a.to_bytes(0x5f5e100).unwrap();
        // magic, ino 1, mode 0100644, uid, gid, nlink 1, mtime, size 5, 4 dev numbers, namesize 2, check
        let want_head = "070701\
            00000001000081a4000000000000000000000001\
            05f5e10000000005000000000000000000000000\
            000000000000000200000000";
        assert_eq!(std::str::from_utf8(&b[..110]).unwrap(), want_head);
        // name "x\0" ends at 112 (already aligned), data at 112..117, padded to 120.
        assert_eq!(&b[110..112], b"x\0");
        assert_eq!(&b[112..117], b"hello");
        assert_eq!(&b[117..120], &[0, 0, 0]);
        assert_eq!(&b[120..126], b"070701");
        assert!(
            std::str::from_utf8(&b[230..240])
                .unwrap()
                .starts_with("TRAILER!!!")
        );
    }

    #[test]
    fn output_is_byte_identical_whatever_the_insertion_order() {
        let mut b = Archive::new();
        b.dir("proc");
        b.add("dev/console", Kind::CharDev(5, 1), 0o600);
        b.add("bin/sh", Kind::Symlink("busybox".into()), 0o777);
        b.file("init", vec![0x7f, b'E', b'L', b'F', 1, 2, 3], 0o755);
        b.file("etc/paddock/modules", b"a.ko\nb.ko\n".to_vec(), 0o644);
        assert_eq!(sample().to_bytes(0).unwrap(), b.to_bytes(0).unwrap());
        assert_eq!(sample().to_bytes(0).unwrap(), sample().to_bytes(0).unwrap());
        assert_ne!(sample().to_bytes(0).unwrap(), sample().to_bytes(1).unwrap());
    }

    #[test]
    fn broken_archives_are_reported() {
        let bytes = sample().to_bytes(0).unwrap();
        assert_eq!(parse(&bytes[..50]), Err(ParseError::Truncated(0)));
        let mut bad = bytes.clone();
        bad[0] = b'1';
        assert_eq!(parse(&bad), Err(ParseError::Magic(0)));
        let mut bad = bytes.clone();
        bad[10] = b'z';
        assert_eq!(parse(&bad), Err(ParseError::Hex(0)));
        // Cut exactly before the trailer.
        let entries = parse(&bytes).unwrap();
        assert_eq!(entries.len(), 9);
        let trailer_at = bytes.len() - 124;
        assert_eq!(&bytes[trailer_at..trailer_at + 6], b"070701");
        assert_eq!(parse(&bytes[..trailer_at]), Err(ParseError::NoTrailer));
    }
}
