//! The content-addressed object store: `<root>/objects/xx/yy/<rest>` (the same layout as
//! subd's cache), one file per SHA-512, written once.
//!
//! An object is written to `<root>/tmp/` and hard-linked into place: `link(2)` fails when
//! the name exists, so of any number of concurrent writers of the same object exactly one
//! creates it and the others compare bytes (a different content under the same hash is a
//! collision, reported, never stored). Objects are not fsynced one by one; callers
//! [`ObjectStore::sync`] once (syncfs) before recording anything that refers to them.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use paddock_image::{ObjectHasher, ObjectId};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object store I/O at {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error(
        "hash collision: object {0} is already stored with different bytes (nothing was written)"
    )]
    Collision(Box<ObjectId>),
    #[error("object bytes hash to {actual}, not the expected {expected}")]
    WrongHash {
        expected: Box<ObjectId>,
        actual: Box<ObjectId>,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ObjectError + '_ {
    move |source| ObjectError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[derive(Debug)]
pub struct ObjectStore {
    root: PathBuf,
    objects: PathBuf,
    tmp: PathBuf,
    counter: AtomicU64,
}

impl ObjectStore {
    /// Opens (creating) the store under `root`; leftovers in `tmp/` from a crash are removed.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        let root = root.into();
        let objects = root.join("objects");
        let tmp = root.join("tmp");
        fs::create_dir_all(&objects).map_err(io_at(&objects))?;
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_at(&tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
        Ok(ObjectStore {
            root,
            objects,
            tmp,
            counter: AtomicU64::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, id: &ObjectId) -> PathBuf {
        self.objects.join(id.path())
    }

    /// The stored object's size, `None` when it is not stored.
    pub fn size(&self, id: &ObjectId) -> Option<u64> {
        fs::metadata(self.path(id)).ok().map(|m| m.len())
    }

    pub fn contains(&self, id: &ObjectId) -> bool {
        self.path(id).is_file()
    }

    pub fn open_object(&self, id: &ObjectId) -> Result<File, ObjectError> {
        let p = self.path(id);
        File::open(&p).map_err(io_at(&p))
    }

    fn tmp_name(&self) -> PathBuf {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.tmp.join(format!("{}-{n}", std::process::id()))
    }

    /// Stores bytes whose hash the caller computed. `Ok(true)` when this call created the
    /// object, `Ok(false)` when it was already there with the same bytes.
    pub fn put(&self, id: ObjectId, bytes: &[u8]) -> Result<bool, ObjectError> {
        let dest = self.path(&id);
        if dest.exists() {
            return self.same_bytes(&id, &dest, bytes).map(|()| false);
        }
        let tmp = self.tmp_name();
        let res = (|| {
            let mut f = File::create_new(&tmp).map_err(io_at(&tmp))?;
            f.write_all(bytes).map_err(io_at(&tmp))?;
            drop(f);
            self.link_into_place(&id, &tmp, &dest, || Ok(bytes.to_vec()))
        })();
        let _ = fs::remove_file(&tmp);
        res
    }

    /// Stores a stream (for objects too large to hold in memory): written to a temporary
    /// file while hashing. Returns the id, the size, and whether it was new.
    pub fn put_reader(
        &self,
        mut r: impl Read,
        expected: Option<ObjectId>,
    ) -> Result<(ObjectId, u64, bool), ObjectError> {
        let tmp = self.tmp_name();
        let res = (|| {
            let mut f = File::create_new(&tmp).map_err(io_at(&tmp))?;
            let mut h = ObjectHasher::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut size = 0u64;
            loop {
                let n = r.read(&mut buf).map_err(io_at(&tmp))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                f.write_all(&buf[..n]).map_err(io_at(&tmp))?;
                size += n as u64;
            }
            drop(f);
            let id = h.finish();
            if let Some(e) = expected.filter(|e| *e != id) {
                return Err(ObjectError::WrongHash {
                    expected: Box::new(e),
                    actual: Box::new(id),
                });
            }
            let dest = self.path(&id);
            let new = if dest.exists() {
                self.same_file(&id, &dest, &tmp)?;
                false
            } else {
                self.link_into_place(&id, &tmp, &dest, || fs::read(&tmp).map_err(io_at(&tmp)))?
            };
            Ok((id, size, new))
        })();
        let _ = fs::remove_file(&tmp);
        res
    }

    fn link_into_place(
        &self,
        id: &ObjectId,
        tmp: &Path,
        dest: &Path,
        bytes: impl FnOnce() -> Result<Vec<u8>, ObjectError>,
    ) -> Result<bool, ObjectError> {
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        match fs::hard_link(tmp, dest) {
            Ok(()) => Ok(true),
            // Another writer won the race: the object must hold the same bytes.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.same_bytes(id, dest, &bytes()?).map(|()| false)
            }
            Err(e) => Err(io_at(dest)(e)),
        }
    }

    fn same_bytes(&self, id: &ObjectId, dest: &Path, bytes: &[u8]) -> Result<(), ObjectError> {
        let meta = fs::metadata(dest).map_err(io_at(dest))?;
        if meta.len() != bytes.len() as u64 {
            return Err(ObjectError::Collision(Box::new(*id)));
        }
        let mut f = File::open(dest).map_err(io_at(dest))?;
        let mut buf = vec![0u8; (1 << 20).min(bytes.len().max(1))];
        let mut off = 0;
        loop {
            let n = f.read(&mut buf).map_err(io_at(dest))?;
            if n == 0 {
                break;
            }
            if off + n > bytes.len() || buf[..n] != bytes[off..off + n] {
                return Err(ObjectError::Collision(Box::new(*id)));
            }
            off += n;
        }
        if off == bytes.len() {
            Ok(())
        } else {
            Err(ObjectError::Collision(Box::new(*id)))
        }
    }

    fn same_file(&self, id: &ObjectId, dest: &Path, other: &Path) -> Result<(), ObjectError> {
        let (mut a, mut b) = (
            File::open(dest).map_err(io_at(dest))?,
            File::open(other).map_err(io_at(other))?,
        );
        let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
        loop {
            let n = read_full(&mut a, &mut x).map_err(io_at(dest))?;
            let m = read_full(&mut b, &mut y).map_err(io_at(other))?;
            if n != m || x[..n] != y[..m] {
                return Err(ObjectError::Collision(Box::new(*id)));
            }
            if n == 0 {
                return Ok(());
            }
        }
    }

    /// Re-reads an object and checks its hash.
    pub fn verify(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        let p = self.path(id);
        let mut f = File::open(&p).map_err(io_at(&p))?;
        let mut h = ObjectHasher::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(io_at(&p))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(h.finish() == *id)
    }

    pub fn delete(&self, id: &ObjectId) -> Result<(), ObjectError> {
        let p = self.path(id);
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_at(&p)(e)),
        }
    }

    /// Every stored object with its size (names that are not objects are skipped).
    pub fn list(&self) -> Result<Vec<(ObjectId, u64)>, ObjectError> {
        let mut out = Vec::new();
        for a in read_dir_sorted(&self.objects)? {
            for b in read_dir_sorted(&a)? {
                for c in read_dir_sorted(&b)? {
                    let rel = c.strip_prefix(&self.objects).unwrap_or(&c);
                    if let Some(id) = rel.to_str().and_then(ObjectId::from_path) {
                        let len = fs::metadata(&c).map_err(io_at(&c))?.len();
                        out.push((id, len));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Makes everything written so far durable (one syncfs for the store's file system).
    pub fn sync(&self) -> Result<(), ObjectError> {
        let d = File::open(&self.objects).map_err(io_at(&self.objects))?;
        nix::unistd::syncfs(&d).map_err(|e| io_at(&self.objects)(e.into()))
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let k = f.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n)
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>, ObjectError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_at(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_content_and_collisions_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = ObjectStore::open(d.path()).unwrap();
        let id = ObjectId::of(b"abc");
        assert!(s.put(id, b"abc").unwrap());
        assert!(!s.put(id, b"abc").unwrap());
        assert_eq!(s.size(&id), Some(3));
        // Same hash, other bytes (forged): refused, the stored object untouched.
        assert!(matches!(s.put(id, b"abd"), Err(ObjectError::Collision(_))));
        assert!(matches!(s.put(id, b"abcd"), Err(ObjectError::Collision(_))));
        assert_eq!(fs::read(s.path(&id)).unwrap(), b"abc");
        let (id2, n, new) = s.put_reader(&b"hello"[..], None).unwrap();
        assert_eq!((id2, n, new), (ObjectId::of(b"hello"), 5, true));
        let (_, _, new) = s.put_reader(&b"hello"[..], Some(id2)).unwrap();
        assert!(!new);
        assert!(matches!(
            s.put_reader(&b"x"[..], Some(id2)),
            Err(ObjectError::WrongHash { .. })
        ));
        let mut l = s.list().unwrap();
        l.sort();
        let mut want = vec![(id, 3), (id2, 5)];
        want.sort();
        assert_eq!(l, want);
        assert!(s.verify(&id).unwrap());
        fs::write(s.path(&id), b"xyz").unwrap();
        assert!(!s.verify(&id).unwrap(), "corruption is found");
        s.delete(&id).unwrap();
        s.delete(&id).unwrap();
        assert!(!s.contains(&id));
        assert_eq!(
            fs::read_dir(d.path().join("tmp")).unwrap().count(),
            0,
            "no temporaries left"
        );
        s.sync().unwrap();
    }

    #[test]
    fn concurrent_writers_create_one_object() {
        let d = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(ObjectStore::open(d.path()).unwrap());
        let data = vec![7u8; 100_000];
        let id = ObjectId::of(&data);
        let created: usize = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    let (s, data) = (s.clone(), &data);
                    sc.spawn(move || s.put(id, data).unwrap() as usize)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(created, 1);
        assert_eq!(s.list().unwrap(), vec![(id, 100_000)]);
    }
}
