//! fs2objectcache (Dominator's `cmd/fs2objectcache`): turns an old root into an object
//! cache, so that a re-imaged machine keeps only bytes it has re-hashed.
//!
//! `ROOT/.subd` is removed and `ROOT/.subd/objects` made (0750). Then, on this file system
//! only: each regular file is hashed once per inode and renamed to
//! `.subd/objects/xx/yy/<hash>` (its other links are unlinked; a second file with the same
//! content is unlinked too; empty files are removed: the tree model needs no object for
//! them); symlinks, devices, fifos and sockets are removed; directories are removed bottom-up.
//! Mount points of other file systems are left alone (and so are the directories above them).

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::stat::{SFlag, fstat};
use paddock_image::ObjectId;

use crate::scan::{OBJECTS_DIR, READ_CHUNK, SUBD_DIR, hash_reader, kind, open_for_hashing};

/// What a conversion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Regular files (inodes) hashed.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Distinct objects now in the cache.
    pub objects: u64,
    /// Files whose content another file already provided (unlinked).
    pub duplicates: u64,
    /// Extra hard links unlinked.
    pub links: u64,
    /// Empty regular files removed.
    pub empty: u64,
    /// Symlinks, devices, fifos and sockets removed.
    pub others: u64,
    pub dirs: u64,
    /// Mount points of other file systems, left in place.
    pub other_fs: Vec<PathBuf>,
    /// What could not be done.
    pub errors: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("refusing to convert / (run fs2objectcache on an old root mounted elsewhere)")]
    Slash,
    #[error("{0}: not a directory")]
    NotDir(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ConvertError + '_ {
    move |source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Why one file could not be moved into the cache (a line of [`Summary::errors`]).
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
struct MoveError {
    path: PathBuf,
    problem: MoveProblem,
}

#[derive(Debug, thiserror::Error)]
enum MoveProblem {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Errno(#[from] nix::errno::Errno),
    #[error("changed during the conversion")]
    Changed,
    #[error("abandoned")]
    Abandoned,
}

struct FileJob {
    path: PathBuf,
    ino: u64,
}

/// Converts `root` with `threads` hashing threads.
pub fn convert(root: &Path, threads: usize) -> Result<Summary, ConvertError> {
    let meta = std::fs::metadata(root).map_err(io_err(root))?;
    if !meta.is_dir() {
        return Err(ConvertError::NotDir(root.to_path_buf()));
    }
    let root = std::fs::canonicalize(root).map_err(io_err(root))?;
    if root == Path::new("/") {
        return Err(ConvertError::Slash);
    }
    let dev = meta.dev();
    let subd = root.join(SUBD_DIR);
    match std::fs::symlink_metadata(&subd) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&subd).map_err(io_err(&subd))?,
        Ok(_) => std::fs::remove_file(&subd).map_err(io_err(&subd))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&subd)(e)),
    }
    let objects = root.join(OBJECTS_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(&objects)
        .map_err(io_err(&objects))?;

    // Walk (depth first; directories in pre-order, so reversed they come children first).
    let mut sum = Summary::default();
    let mut files: Vec<FileJob> = Vec::new();
    let mut extra: Vec<PathBuf> = Vec::new(); // other links of a hashed inode, empty files
    let mut others: Vec<PathBuf> = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                sum.errors.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let mut names: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        names.sort();
        for path in names {
            if path == subd {
                continue;
            }
            let m = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    sum.errors.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            if m.dev() != dev {
                sum.other_fs.push(path);
                continue;
            }
            let ft = m.file_type();
            if ft.is_dir() {
                dirs.push(path.clone());
                stack.push(path);
            } else if ft.is_file() {
                if m.len() == 0 {
                    sum.empty += 1;
                    extra.push(path);
                } else if !seen.insert(m.ino()) {
                    sum.links += 1;
                    extra.push(path);
                } else {
                    files.push(FileJob { path, ino: m.ino() });
                }
            } else {
                others.push(path);
            }
        }
    }

    // Hash and move into the cache.
    let next = AtomicUsize::new(0);
    let known: Mutex<HashSet<ObjectId>> = Mutex::new(HashSet::new());
    let results: Mutex<Vec<Result<(u64, bool), MoveError>>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, files.len().max(1)) {
            s.spawn(|| {
                let mut buf = vec![0u8; READ_CHUNK];
                while let Some(job) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let r = move_one(job, dev, &objects, &known, &mut buf);
                    results.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                }
            });
        }
    });
    for r in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        match r {
            Ok((bytes, dup)) => {
                sum.files += 1;
                sum.bytes += bytes;
                sum.duplicates += u64::from(dup);
            }
            Err(e) => sum.errors.push(e.to_string()),
        }
    }
    sum.objects = known.into_inner().unwrap_or_else(|e| e.into_inner()).len() as u64;

    // Remove the rest.
    for p in extra {
        if let Err(e) = std::fs::remove_file(&p) {
            sum.errors.push(format!("{}: {e}", p.display()));
        }
    }
    for p in others {
        match std::fs::remove_file(&p) {
            Ok(()) => sum.others += 1,
            Err(e) => sum.errors.push(format!("{}: {e}", p.display())),
        }
    }
    let keep: Vec<&Path> = sum.other_fs.iter().map(PathBuf::as_path).collect();
    for d in dirs.iter().rev() {
        if keep.iter().any(|k| k.starts_with(d)) {
            continue; // holds a mount point
        }
        match std::fs::remove_dir(d) {
            Ok(()) => sum.dirs += 1,
            Err(e) => sum.errors.push(format!("{}: {e}", d.display())),
        }
    }
    Ok(sum)
}

/// Hashes one file and renames it into the cache (or unlinks it when the object is already
/// there). Returns its size and whether it was a duplicate.
fn move_one(
    job: &FileJob,
    dev: u64,
    objects: &Path,
    known: &Mutex<HashSet<ObjectId>>,
    buf: &mut [u8],
) -> Result<(u64, bool), MoveError> {
    let fail = |problem: MoveProblem| MoveError {
        path: job.path.clone(),
        problem,
    };
    let fd = open_for_hashing(&job.path).map_err(|e| fail(e.into()))?;
    let st = fstat(fd.as_fd()).map_err(|e| fail(e.into()))?;
    if kind(&st) != SFlag::S_IFREG || st.st_ino != job.ino || st.st_dev != dev {
        return Err(fail(MoveProblem::Changed));
    }
    let mut file = File::from(fd);
    let (id, bytes) = hash_reader(&mut file, buf, u64::MAX, &mut |_| true)
        .map_err(|e| fail(e.into()))?
        .ok_or_else(|| fail(MoveProblem::Abandoned))?;
    drop(file);
    let fresh = known.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
    if !fresh {
        std::fs::remove_file(&job.path).map_err(|e| fail(e.into()))?;
        return Ok((bytes, true));
    }
    let dest = objects.join(id.path());
    if let Some(parent) = dest.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| fail(e.into()))?;
    }
    std::fs::rename(&job.path, &dest).map_err(|e| fail(e.into()))?;
    Ok((bytes, false))
}
