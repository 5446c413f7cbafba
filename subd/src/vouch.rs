//! Files whose bytes subd itself hashed moments ago, so the next scan need not read them again.
//!
//! A fetch hashes every object as it arrives and the update renames it into the tree; the
//! scan the dominator then waits for would read the same bytes back from the page cache and
//! hash them a second time, which proves nothing the first hash did not (on an install that
//! is every byte of the image). So the fetch *vouches* for each object it verified, keyed by
//! its inode's identity and its size, mtime and ctime; the applier *carries* a vouch across
//! its own renames, links and metadata changes (each moves the ctime); and the scan takes a
//! vouched file at its hash only while that key still matches. Userspace cannot set a ctime,
//! so any write, truncate, chmod, rename or link by anyone since is a miss, and the file is
//! read and hashed as always.
//!
//! A vouch is used once (the scan that takes it drops it) and holds for [`MAX_AGE`] from the
//! hash, carries included: long enough for a fetch, the update and the scan after it, too
//! short for the bytes to have gone from the page cache back to the media and rotted there
//! unseen. Every other scan hashes everything (the scan keeps no mtime shortcut), so
//! corruption on the media is still caught by the periodic scans.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::stat::FileStat;
use paddock_image::ObjectId;

/// How long a vouch holds from the hash.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// What must not have changed since a file was vouched for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Key {
    pub fn of_stat(st: &FileStat) -> Key {
        Key {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    pub fn of_metadata(m: &Metadata) -> Key {
        Key {
            dev: m.dev(),
            ino: m.ino(),
            size: i64::try_from(m.size()).unwrap_or(i64::MAX),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: Key,
    object: ObjectId,
    /// When the bytes were hashed.
    hashed: Instant,
}

/// The vouches, by inode; shared by the fetch, the applier and the scanner.
#[derive(Debug, Default)]
pub struct Vouched {
    entries: Mutex<HashMap<(u64, u64), Entry>>,
}

impl Vouched {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, u64), Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file at `key` holds `object`: its bytes were hashed to it at `now`.
    pub fn vouch(&self, key: Key, object: ObjectId, now: Instant) {
        self.lock().insert(
            (key.dev, key.ino),
            Entry {
                key,
                object,
                hashed: now,
            },
        );
    }

    /// The file vouched for at `before` is now at `after` (subd itself renamed, linked or
    /// changed the metadata of it). Nothing happens unless `before` matches the vouch and
    /// `after` is the same inode with the same size and mtime.
    pub fn carry(&self, before: Key, after: Key) {
        let mut entries = self.lock();
        let id = (before.dev, before.ino);
        let Some(e) = entries.get_mut(&id) else {
            return;
        };
        let same_bytes =
            (after.dev, after.ino, after.size) == (before.dev, before.ino, before.size);
        if e.key != before || !same_bytes {
            entries.remove(&id);
            return;
        }
        e.key = after;
    }

    /// The object of the file at `key` if it is vouched for with exactly that key and the
    /// vouch is younger than [`MAX_AGE`] at `now`; the vouch is used up either way.
    pub fn take(&self, key: Key, now: Instant) -> Option<ObjectId> {
        let e = self.lock().remove(&(key.dev, key.ino))?;
        (e.key == key && now.saturating_duration_since(e.hashed) < MAX_AGE).then_some(e.object)
    }

    /// Drops the vouches older than [`MAX_AGE`] at `now` (after each scan: objects fetched
    /// and never used would otherwise stay).
    pub fn expire(&self, now: Instant) {
        self.lock()
            .retain(|_, e| now.saturating_duration_since(e.hashed) < MAX_AGE);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64, size: i64, ctime: i64) -> Key {
        Key {
            dev: 1,
            ino,
            size,
            mtime: (100, 0),
            ctime: (ctime, 0),
        }
    }

    #[test]
    fn a_vouch_holds_only_while_nothing_changed_and_is_used_once() {
        let (v, t) = (Vouched::default(), Instant::now());
        let a = ObjectId::of(b"a");
        v.vouch(key(7, 1, 10), a, t);
        assert_eq!(
            v.take(key(7, 1, 11), t),
            None,
            "the ctime moved: someone touched it"
        );
        assert_eq!(v.take(key(7, 1, 10), t), None, "a miss used the vouch up");

        v.vouch(key(7, 1, 10), a, t);
        assert_eq!(v.take(key(7, 1, 10), t), Some(a));
        assert_eq!(v.take(key(7, 1, 10), t), None, "used once");
    }

    #[test]
    fn subd_carries_a_vouch_across_its_own_changes_only() {
        let (v, t) = (Vouched::default(), Instant::now());
        let a = ObjectId::of(b"a");
        v.vouch(key(7, 1, 10), a, t);
        v.carry(key(7, 1, 10), key(7, 1, 12));
        assert_eq!(
            v.take(key(7, 1, 12), t),
            Some(a),
            "renamed and chmod-ed by the applier"
        );

        v.vouch(key(7, 1, 10), a, t);
        v.carry(key(7, 1, 11), key(7, 1, 12));
        assert!(
            v.is_empty(),
            "changed by someone else before the applier looked"
        );

        v.vouch(key(7, 1, 10), a, t);
        v.carry(key(7, 1, 10), key(7, 2, 12));
        assert!(v.is_empty(), "other bytes after the carry");

        v.carry(key(8, 1, 10), key(8, 1, 12));
        assert!(v.is_empty(), "nothing to carry");
    }

    #[test]
    fn a_vouch_holds_for_max_age_from_the_hash_carries_included() {
        let (v, t) = (Vouched::default(), Instant::now());
        let a = ObjectId::of(b"a");
        v.vouch(key(7, 1, 10), a, t);
        v.carry(key(7, 1, 10), key(7, 1, 12));
        assert_eq!(
            v.take(key(7, 1, 12), t + MAX_AGE),
            None,
            "too old to vouch for"
        );

        v.vouch(key(7, 1, 10), a, t);
        v.vouch(key(8, 1, 10), a, t + MAX_AGE);
        v.expire(t + MAX_AGE);
        assert_eq!(v.len(), 1, "the older one expired");
        assert_eq!(v.take(key(8, 1, 10), t + MAX_AGE), Some(a));
    }
}
