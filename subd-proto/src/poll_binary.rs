//! The binary Poll answer, for controllers: the same answer as the JSON one, with the tree
//! and the object cache in a compact form (object ids as 64 raw bytes, numbers as varints),
//! about half the JSON's size and a tenth of its decoding time. `curl` and anything else
//! that does not ask for it get JSON (subd decides which from `Accept`).
//!
//! The body is postcard 1 (its documented wire format: unsigned integers as LEB128
//! varints, signed ones zigzagged first, `Option` as a 0/1 byte before the value, a
//! sequence or byte string as its varint length before its elements), in this order:
//!
//! ```text
//! status   bytes: the answer as JSON without file_system and object_cache
//! scan     Option<(tree, cache)>: present when file_system_follows
//!   tree   seq<(u64 inode number, inode)> in increasing number order,
//!          seq<(string path, u64 inode number)> in increasing path order
//!   inode  enum: 0 directory(mode u32, uid u32, gid u32)
//!                1 regular(mode, uid, gid, mtime sec i64, mtime nsec u32, size u64,
//!                          Option<object id: bytes, 64 long>)
//!                2 symlink(uid, gid, target string)
//!                3 special(kind u8: 0 char, 1 block, 2 fifo, mode, uid, gid,
//!                          mtime sec i64, mtime nsec u32, rdev u64)
//!   cache  seq<object id> in increasing order
//! ```
//!
//! The status stays JSON: it is small, and JSON's defaults keep old and new subds and
//! controllers compatible as fields come and go. The version is in the media type.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use paddock_image::{FileSystem, Inode, Mtime, ObjectId, SpecialKind};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Serialize, Serializer};

use crate::PollResponse;

/// The media type a controller names in `Accept` to get the binary answer, and the
/// answer's `Content-Type`.
pub const POLL_MEDIA_TYPE: &str = "application/vnd.paddock.poll.v1";

/// Bytes that are not a binary Poll answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a bad binary Poll answer: {0}")]
pub struct BadAnswer(pub String);

/// The whole answer: [`encode_status`] then [`encode_scan`]. `status`'s
/// `file_system` and `object_cache` are not sent (the scan is).
pub fn encode(
    status: &PollResponse,
    scan: Option<(&FileSystem, &BTreeSet<ObjectId>)>,
) -> Result<Vec<u8>, BadAnswer> {
    let mut out = encode_status(status)?;
    out.extend_from_slice(&encode_scan(scan)?);
    Ok(out)
}

/// The answer's first part: the status. (A simulator that sends one tree many times
/// encodes [`encode_scan`] once and puts a fresh status before it.)
pub fn encode_status(status: &PollResponse) -> Result<Vec<u8>, BadAnswer> {
    let json = if status.file_system.is_some() || status.object_cache.is_some() {
        let mut bare = status.clone();
        bare.file_system = None;
        bare.object_cache = None;
        serde_json::to_vec(&bare)
    } else {
        serde_json::to_vec(status)
    }
    .map_err(|e| BadAnswer(e.to_string()))?;
    postcard::to_allocvec(&Raw(&json)).map_err(|e| BadAnswer(e.to_string()))
}

/// The answer's second part: the tree and the object cache, if they follow.
pub fn encode_scan(scan: Option<(&FileSystem, &BTreeSet<ObjectId>)>) -> Result<Vec<u8>, BadAnswer> {
    postcard::to_allocvec(&scan.map(|(fs, cache)| (TreeOut(fs), CacheOut(cache))))
        .map_err(|e| BadAnswer(e.to_string()))
}

/// Reads a binary answer; anything but exactly one well-formed answer is an error.
pub fn decode(bytes: &[u8]) -> Result<PollResponse, BadAnswer> {
    let bad = |e: postcard::Error| BadAnswer(format!("{e} ({} bytes)", bytes.len()));
    let (answer, rest) = postcard::take_from_bytes::<AnswerIn<'_>>(bytes).map_err(bad)?;
    if !rest.is_empty() {
        return Err(BadAnswer(format!("{} bytes after the answer", rest.len())));
    }
    let mut r: PollResponse =
        serde_json::from_slice(answer.status).map_err(|e| BadAnswer(format!("the status: {e}")))?;
    r.file_system = None;
    r.object_cache = None;
    if let Some((tree, cache)) = answer.scan {
        let tree = tree.into_tree()?;
        check_paths(&tree)?;
        r.file_system = Some(tree);
        let cache = cache
            .into_iter()
            .map(|i| i.id().map(|o| (o, ())))
            .collect::<Result<Vec<_>, _>>()?;
        r.object_cache = Some(increasing(cache, "object cache")?.into_keys().collect());
    }
    Ok(r)
}

/// The longest path a sub's tree may name, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// A tree whose paths are each at most [`MAX_PATH_BYTES`] long: a longer one is a bad answer
/// rather than a path to judge, since every walk up its parents pays for its depth.
pub fn check_paths(tree: &FileSystem) -> Result<(), BadAnswer> {
    match tree.paths.keys().find(|p| p.len() > MAX_PATH_BYTES) {
        Some(p) => Err(BadAnswer(format!(
            "a path of {} bytes (at most {MAX_PATH_BYTES}): {:?}…",
            p.len(),
            p.get(..64).unwrap_or("")
        ))),
        None => Ok(()),
    }
}

/// A map from pairs that must come in strictly increasing key order (as encoded).
fn increasing<K: Ord + fmt::Debug, V>(
    pairs: impl IntoIterator<Item = (K, V)>,
    what: &str,
) -> Result<BTreeMap<K, V>, BadAnswer> {
    let pairs: Vec<(K, V)> = pairs.into_iter().collect();
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 >= w[1].0) {
        return Err(BadAnswer(format!(
            "{what}: {:?} after {:?} (not in increasing order)",
            w[1].0, w[0].0
        )));
    }
    // Sorted input: the map is built in one pass.
    Ok(pairs.into_iter().collect())
}

/// Bytes written as a postcard byte string (length, then the bytes).
struct Raw<'a>(&'a [u8]);

impl Serialize for Raw<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// An object id as 64 raw bytes.
#[derive(Clone, Copy)]
struct Id(ObjectId);

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0.0)
    }
}

/// An object id as read: bytes whose length is checked by [`IdIn::id`].
#[derive(Deserialize)]
#[serde(transparent)]
struct IdIn<'a>(#[serde(borrow)] &'a [u8]);

impl IdIn<'_> {
    fn id(self) -> Result<ObjectId, BadAnswer> {
        <[u8; 64]>::try_from(self.0)
            .map(ObjectId)
            .map_err(|_| BadAnswer(format!("an object id of {} bytes, not 64", self.0.len())))
    }
}

/// The answer as read: the status's JSON and the scan, borrowing from the body.
#[derive(Deserialize)]
struct AnswerIn<'a> {
    #[serde(borrow)]
    status: &'a [u8],
    #[serde(borrow)]
    scan: Option<(TreeIn<'a>, Vec<IdIn<'a>>)>,
}

/// An inode as it travels (its own enum, so the JSON form of [`Inode`] may change
/// without changing this one); `O` is the object id as written or as read.
#[derive(Serialize, Deserialize)]
enum WireInode<'a, O> {
    Directory {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Regular {
        mode: u32,
        uid: u32,
        gid: u32,
        sec: i64,
        nsec: u32,
        size: u64,
        object: Option<O>,
    },
    Symlink {
        uid: u32,
        gid: u32,
        #[serde(borrow)]
        target: Cow<'a, str>,
    },
    Special {
        kind: u8,
        mode: u32,
        uid: u32,
        gid: u32,
        sec: i64,
        nsec: u32,
        rdev: u64,
    },
}

impl<'a> From<&'a Inode> for WireInode<'a, Id> {
    fn from(i: &'a Inode) -> Self {
        match *i {
            Inode::Directory { mode, uid, gid } => WireInode::Directory { mode, uid, gid },
            Inode::Regular {
                mode,
                uid,
                gid,
                mtime,
                size,
                object,
            } => WireInode::Regular {
                mode,
                uid,
                gid,
                sec: mtime.sec,
                nsec: mtime.nsec,
                size,
                object: object.map(Id),
            },
            Inode::Symlink {
                uid,
                gid,
                ref target,
            } => WireInode::Symlink {
                uid,
                gid,
                target: Cow::Borrowed(target),
            },
            Inode::Special {
                special,
                mode,
                uid,
                gid,
                mtime,
                rdev,
            } => WireInode::Special {
                kind: match special {
                    SpecialKind::Char => 0,
                    SpecialKind::Block => 1,
                    SpecialKind::Fifo => 2,
                },
                mode,
                uid,
                gid,
                sec: mtime.sec,
                nsec: mtime.nsec,
                rdev,
            },
        }
    }
}

impl WireInode<'_, IdIn<'_>> {
    fn into_inode(self) -> Result<Inode, BadAnswer> {
        Ok(match self {
            WireInode::Directory { mode, uid, gid } => Inode::Directory { mode, uid, gid },
            WireInode::Regular {
                mode,
                uid,
                gid,
                sec,
                nsec,
                size,
                object,
            } => Inode::Regular {
                mode,
                uid,
                gid,
                mtime: Mtime { sec, nsec },
                size,
                object: object.map(IdIn::id).transpose()?,
            },
            WireInode::Symlink { uid, gid, target } => Inode::Symlink {
                uid,
                gid,
                target: target.into_owned(),
            },
            WireInode::Special {
                kind,
                mode,
                uid,
                gid,
                sec,
                nsec,
                rdev,
            } => Inode::Special {
                special: match kind {
                    0 => SpecialKind::Char,
                    1 => SpecialKind::Block,
                    2 => SpecialKind::Fifo,
                    k => return Err(BadAnswer(format!("special file kind {k}"))),
                },
                mode,
                uid,
                gid,
                mtime: Mtime { sec, nsec },
                rdev,
            },
        })
    }
}

/// A tree written from where it is (no copy).
struct TreeOut<'a>(&'a FileSystem);

impl Serialize for TreeOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&InodesOut(&self.0.inodes))?;
        t.serialize_element(&self.0.paths)?;
        t.end()
    }
}

struct InodesOut<'a>(&'a BTreeMap<u64, Inode>);

impl Serialize for InodesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(n, i)| (n, WireInode::from(i))))
    }
}

struct CacheOut<'a>(&'a BTreeSet<ObjectId>);

impl Serialize for CacheOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|o| Id(*o)))
    }
}

#[derive(Deserialize)]
struct TreeIn<'a> {
    #[serde(borrow)]
    inodes: Vec<(u64, WireInode<'a, IdIn<'a>>)>,
    #[serde(borrow)]
    paths: Vec<(&'a str, u64)>,
}

impl TreeIn<'_> {
    fn into_tree(self) -> Result<FileSystem, BadAnswer> {
        let mut inodes = Vec::with_capacity(self.inodes.len());
        for (n, i) in self.inodes {
            inodes.push((n, i.into_inode()?));
        }
        Ok(FileSystem {
            inodes: increasing(inodes, "inodes")?,
            paths: increasing(
                self.paths.into_iter().map(|(p, n)| (p.to_string(), n)),
                "paths",
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use paddock_image::{FileSystem, Inode, Mtime, ObjectId, SpecialKind};

    use super::*;
    use crate::PollResponse;

    /// A tree with one of every kind of inode, a hard link and a file without content.
    fn tree() -> FileSystem {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        let mtime = Mtime {
            sec: -5,
            nsec: 999_999_999,
        };
        fs.insert(
            "/etc",
            Inode::Directory {
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        fs.insert(
            "/etc/motd",
            Inode::Regular {
                mode: 0o644,
                uid: 1000,
                gid: 100,
                mtime,
                size: 6,
                object: Some(ObjectId::of(b"hello\n")),
            },
        )
        .unwrap();
        fs.link("/etc/motd.link", "/etc/motd").unwrap();
        fs.insert(
            "/etc/empty",
            Inode::Regular {
                mode: 0o600,
                uid: 0,
                gid: 0,
                mtime,
                size: 0,
                object: None,
            },
        )
        .unwrap();
        fs.insert(
            "/etc/ß→link",
            Inode::Symlink {
                uid: 0,
                gid: 0,
                target: "motd".into(),
            },
        )
        .unwrap();
        for (p, special) in [
            ("/null", SpecialKind::Char),
            ("/sda", SpecialKind::Block),
            ("/fifo", SpecialKind::Fifo),
        ] {
            fs.insert(
                p,
                Inode::Special {
                    special,
                    mode: 0o666,
                    uid: 0,
                    gid: u32::MAX,
                    mtime,
                    rdev: u64::MAX,
                },
            )
            .unwrap();
        }
        fs
    }

    fn full_answer() -> PollResponse {
        PollResponse {
            generation: 7,
            scan_count: 9,
            start_time_ms: -1,
            free_space: Some(1 << 40),
            file_system_follows: true,
            last_fetch_error: Some("a reason".into()),
            file_system: Some(tree()),
            object_cache: Some(BTreeSet::from([ObjectId::of(b"a"), ObjectId::of(b"b")])),
            ..PollResponse::default()
        }
    }

    fn encode_whole(r: &PollResponse) -> Vec<u8> {
        encode(r, r.file_system.as_ref().zip(r.object_cache.as_ref())).unwrap()
    }

    #[test]
    fn the_binary_answer_round_trips_and_is_smaller_than_json() {
        let full = full_answer();
        let bytes = encode_whole(&full);
        assert_eq!(decode(&bytes).unwrap(), full);
        let json = serde_json::to_vec(&full).unwrap();
        assert!(
            bytes.len() < json.len(),
            "{} vs {}",
            bytes.len(),
            json.len()
        );
        // A status-only answer.
        let short = PollResponse {
            generation: 7,
            scan_count: 10,
            ..PollResponse::default()
        };
        assert_eq!(decode(&encode_whole(&short)).unwrap(), short);
        // The two parts, encoded apart, make the same answer.
        let mut parts = encode_status(&full).unwrap();
        parts.extend(
            encode_scan(full.file_system.as_ref().zip(full.object_cache.as_ref())).unwrap(),
        );
        assert_eq!(parts, bytes);
    }

    #[test]
    fn a_truncated_or_garbled_answer_is_an_error_not_a_panic() {
        let bytes = encode_whole(&full_answer());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).unwrap_err().0.contains("after the answer"));
        // Every single byte changed: an error or another answer, never a panic.
        for i in 0..bytes.len() {
            for x in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] = x;
                let _ = decode(&b);
            }
        }
        // Lengths far beyond the body.
        assert!(decode(&[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(decode(&[0x80; 20]).is_err());
        assert!(decode(b"{\"generation\": 1}").is_err());
    }

    /// A path longer than any a Linux file system names (a sub may send one without its
    /// parents) is refused, in the binary answer as in the JSON one's check.
    #[test]
    fn a_path_longer_than_path_max_is_refused() {
        let mut long = tree();
        let root = long.paths["/"];
        long.paths.insert("/a".repeat(2_500), root);
        let mut answer = encode_status(&PollResponse::default()).unwrap();
        answer.extend(encode_scan(Some((&long, &BTreeSet::new()))).unwrap());
        let e = decode(&answer).unwrap_err();
        assert!(e.0.contains("a path of 5000 bytes (at most 4096)"), "{e}");
        assert!(check_paths(&long).is_err());
        assert!(check_paths(&tree()).is_ok());
    }

    #[test]
    fn out_of_order_trees_and_bad_ids_are_refused() {
        // Paths in the wrong order (as a hand-made encoder might send them).
        let mut status = encode_status(&PollResponse::default()).unwrap();
        let scan = encode_scan(Some((&tree(), &BTreeSet::new()))).unwrap();
        let motd = scan.windows(9).position(|w| w == b"/etc/motd").unwrap();
        let mut swapped = scan.clone();
        // "/etc/motd" → "/etc/mott" sorts after "/etc/motd.link".
        swapped[motd + 8] = b't';
        status.extend(swapped);
        let e = decode(&status).unwrap_err();
        assert!(e.0.contains("not in increasing order"), "{e}");
        // An object id of 63 bytes.
        let mut b = encode_status(&PollResponse::default()).unwrap();
        b.extend([1, 0, 0, 1]); // a scan: no inodes, no paths, one cache entry …
        b.push(63);
        b.extend([0u8; 63]);
        assert!(matches!(decode(&b), Err(BadAnswer(m)) if m.contains("64")));
    }
}
