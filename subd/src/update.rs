//! The Update applier (Dominator's `sub/lib/update.go`): executes an
//! [`UpdateRequest`] against a root and its object cache `<root>/.subd/objects`.
//!
//! [`Applier::prepare`] runs before the change window: content for the update is copied (or
//! hard-linked) from files on the sub into the cache, checked against its hash on the way,
//! and objects that several new inodes use get `~1~ … ~N-1~` copies (each rename into place
//! consumes one). [`Applier::change`] is the change window, timed: make directories, make
//! inodes, make hard links, delete, change metadata, in the request's order.
//!
//! Every new inode is built under `.subd/` (an object from the cache, or `.subd/tmp-inode`
//! for an empty file, symlink, device or fifo), given its owner, mode and mtime there, and
//! renamed over its path: it appears whole, with its final permissions, in one step, and
//! nothing is ever left in the tree by a crash. A hard link is `link(existing,
//! .subd/tmp-hardlink)` then a rename over the new name. A directory where a non-directory
//! goes is removed first (the planner's "make replaces whatever is at the path").
//! Ownership is set with `lchown`, then the mode (chown clears set-id bits), then the mtime
//! (`utimensat`, not following symlinks; symlinks and directories have no tracked mtime).
//!
//! Errors do not abort: each is recorded (the first [`MAX_ERRORS`], and a count) and the
//! update goes on. Objects renamed into place are consumed, so a retry after a crash must
//! be planned afresh from a new scan (it re-copies or re-fetches what it needs); leftovers of
//! an interrupted update (`~`-suffixed cache names, `.subd/tmp-*`) are removed by
//! [`clean_leftovers`] when subd starts.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;
use paddock_image::plan::{UpdateRequest, untouchable};
use paddock_image::tree::normalize;
use paddock_image::triggers::TriggersError;
use paddock_image::{Filter, Inode, Mtime, ObjectHasher, ObjectId, SpecialKind, Triggers};

use crate::scan::{OBJECTS_DIR, SUBD_DIR};
use crate::vouch::{Key, Vouched};

/// Where the last full (non-sparse) image applied is recorded, relative to the root. Inside
/// `.subd` rather than `/var/lib`: a file in the tree that no image names would be deleted by
/// the next update unless every image's filter spared it.
pub const PATCHED_IMAGE: &str = ".subd/patched-image";
/// The previous update's triggers (JSON), relative to the root.
pub const TRIGGERS_PREVIOUS: &str = ".subd/triggers.previous";
/// Scratch names under the root's `.subd` (same file system as the root).
pub const TMP_INODE: &str = ".subd/tmp-inode";
pub const TMP_HARDLINK: &str = ".subd/tmp-hardlink";
pub use paddock_subd_proto::{ApplyStats, MAX_ERRORS, Progress};

/// How to apply.
#[derive(Default)]
pub struct ApplyOptions<'a> {
    /// Paths the scanner does not see (skipped: the planner cannot know their state).
    pub exclusions: Option<&'a Filter>,
    /// Sleep after each operation (a test hook: lets a test kill subd mid-update).
    pub step_delay: Duration,
    /// Told after each operation.
    pub progress: Option<&'a (dyn Fn(&Progress) + Sync)>,
    /// Vouches for objects the fetch hashed, carried along as each is put in the tree.
    pub vouched: Option<&'a Vouched>,
}

/// How long a file's check may run before it is killed (and the file kept as it was): a
/// configuration check reads a file and exits.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// A file's check that refused its new content.
#[derive(Debug, thiserror::Error)]
enum CheckRefused {
    #[error("its check {program} exited {code}: {first}")]
    Exited {
        program: String,
        code: i32,
        /// The first line it printed that is not blank.
        first: String,
    },
    #[error("its check {program} failed: {output}")]
    Failed { program: String, output: String },
}

/// Why a request from the network is refused ([`validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("{0:?} is not a normalised absolute path")]
    NotNormalised(String),
    #[error("/ cannot be made, linked, copied or deleted")]
    Root,
    #[error("{0:?} is subd's own directory")]
    SubdDir(String),
    #[error("{path}: {why}")]
    Inode { path: String, why: &'static str },
    #[error("an object used more than a million times")]
    TooManyUses,
    #[error("the check of {path}: {why}")]
    Check { path: String, why: &'static str },
}

/// Checks that a request from the network names only normalised absolute paths outside
/// `/.subd`, `/` only as a metadata change, and well-formed inodes.
pub fn validate(req: &UpdateRequest) -> Result<(), InvalidRequest> {
    let path_ok = |p: &str, root_ok: bool| -> Result<(), InvalidRequest> {
        match normalize(p) {
            Ok(n) if n == p => {}
            _ => return Err(InvalidRequest::NotNormalised(p.to_string())),
        }
        if p == "/" && !root_ok {
            return Err(InvalidRequest::Root);
        }
        if untouchable(p, None) {
            return Err(InvalidRequest::SubdDir(p.to_string()));
        }
        Ok(())
    };
    let bad = |p: &str, why: &'static str| {
        Err(InvalidRequest::Inode {
            path: p.to_string(),
            why,
        })
    };
    const MODE: &str = "mode has more than permission bits";
    let inode_ok = |p: &str, i: &Inode, dir: bool| -> Result<(), InvalidRequest> {
        match i {
            Inode::Directory { mode, .. } => {
                if !dir {
                    return bad(p, "a directory among the inodes to make");
                }
                if mode & !0o7777 != 0 {
                    return bad(p, MODE);
                }
            }
            _ if dir => return bad(p, "not a directory among the directories to make"),
            Inode::Regular {
                mode, size, object, ..
            } => {
                if (*size == 0) != object.is_none() {
                    return bad(p, "an empty file has no object; any other has one");
                }
                if mode & !0o7777 != 0 {
                    return bad(p, MODE);
                }
            }
            Inode::Special { mode, .. } => {
                if mode & !0o7777 != 0 {
                    return bad(p, MODE);
                }
            }
            Inode::Symlink { target, .. } => {
                if target.is_empty() || target.contains('\0') {
                    return bad(p, "bad symlink target");
                }
            }
        }
        Ok(())
    };
    for c in &req.files_to_copy_to_cache {
        path_ok(&c.path, false)?;
    }
    for (p, i) in &req.directories_to_make {
        path_ok(p, false)?;
        inode_ok(p, i, true)?;
    }
    for (p, i) in &req.inodes_to_make {
        path_ok(p, false)?;
        inode_ok(p, i, false)?;
    }
    for (n, e) in &req.hardlinks_to_make {
        path_ok(n, false)?;
        path_ok(e, false)?;
    }
    for p in &req.paths_to_delete {
        path_ok(p, false)?;
    }
    for (p, i) in &req.inodes_to_change {
        path_ok(p, true)?;
        match i {
            Inode::Regular { mode, .. }
            | Inode::Directory { mode, .. }
            | Inode::Special { mode, .. }
                if mode & !0o7777 != 0 =>
            {
                return bad(p, MODE);
            }
            _ => {}
        }
    }
    if req.multiply_used_objects.values().any(|n| *n > 1_000_000) {
        return Err(InvalidRequest::TooManyUses);
    }
    for (p, argv) in &req.checks {
        let check = |why| {
            Err(InvalidRequest::Check {
                path: p.clone(),
                why,
            })
        };
        if !req.inodes_to_make.iter().any(|(q, _)| q == p) {
            return check("names no file the update makes");
        }
        match argv.first() {
            None => return check("names no program"),
            Some(prog) if !prog.starts_with('/') => {
                return check("its program must be an absolute path");
            }
            _ => {}
        }
        if argv.len() > 64 || argv.iter().any(|a| a.len() > 4096 || a.contains('\0')) {
            return check("at most 64 arguments of at most 4096 bytes, no NUL");
        }
    }
    Ok(())
}

/// Applies a request in steps; see the module documentation.
pub struct Applier<'a> {
    root: PathBuf,
    objects: PathBuf,
    opts: ApplyOptions<'a>,
    /// Copies of each object consumed so far.
    used: BTreeMap<ObjectId, u64>,
    /// The request's checks (path → program), for [`Self::make_inode`].
    checks: BTreeMap<String, Vec<String>>,
    pub stats: ApplyStats,
}

impl<'a> Applier<'a> {
    pub fn new(root: &Path, opts: ApplyOptions<'a>) -> Self {
        Applier {
            root: root.to_path_buf(),
            objects: root.join(OBJECTS_DIR),
            opts,
            used: BTreeMap::new(),
            checks: BTreeMap::new(),
            stats: ApplyStats::default(),
        }
    }

    fn host(&self, p: &str) -> PathBuf {
        if p == "/" {
            self.root.clone()
        } else {
            self.root.join(&p[1..])
        }
    }

    fn excluded(&mut self, p: &str) -> bool {
        let x = self.opts.exclusions.is_some_and(|f| f.matches(p));
        if x {
            self.stats.excluded += 1;
        }
        x
    }

    fn step(&self, phase: &str, done: usize, total: usize) {
        if let Some(f) = self.opts.progress {
            f(&Progress {
                phase: phase.into(),
                done,
                total,
            });
        }
        if !self.opts.step_delay.is_zero() {
            std::thread::sleep(self.opts.step_delay);
        }
    }

    /// Steps 1 and 2: content into the cache, and copies of multiply-used objects.
    pub fn prepare(&mut self, req: &UpdateRequest) {
        let t = Instant::now();
        if let Err(e) = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&self.objects)
        {
            self.stats
                .error(format!("creating {}: {e}", self.objects.display()));
        }
        let total = req.files_to_copy_to_cache.len();
        for (i, c) in req.files_to_copy_to_cache.iter().enumerate() {
            let src = self.host(&c.path);
            let dest = self.objects.join(c.object.path());
            match copy_into_cache(&src, &dest, c.object, c.hardlink) {
                Ok(()) => self.stats.copied_to_cache += 1,
                Err(e) => self.stats.error(format!(
                    "copying {} into the cache as {}: {e}",
                    c.path,
                    c.object.short()
                )),
            }
            self.step("copy to cache", i + 1, total);
        }
        let total = req.multiply_used_objects.len();
        for (i, (o, n)) in req.multiply_used_objects.iter().enumerate() {
            let base = self.objects.join(o.path());
            for k in 1..*n {
                let copy = copy_name(&base, k);
                match fs::copy(&base, &copy) {
                    Ok(_) => self.stats.copies_made += 1,
                    Err(e) => {
                        self.stats
                            .error(format!("copying object {} (~{k}~): {e}", o.short()));
                        break;
                    }
                }
            }
            self.step("multiply objects", i + 1, total);
        }
        self.stats.prepare_ms = t.elapsed().as_secs_f64() * 1e3;
    }

    /// Steps 3 to 7, the change window; returns its length.
    pub fn change(&mut self, req: &UpdateRequest) -> Duration {
        let t = Instant::now();
        self.checks = req.checks.clone();
        self.each(
            "make directories",
            &req.directories_to_make,
            first,
            |s, (p, inode)| s.make_dir(p, inode),
        );
        self.each(
            "make inodes",
            &req.inodes_to_make,
            first,
            |s, (p, inode)| s.make_inode(p, inode),
        );
        self.each(
            "make hard links",
            &req.hardlinks_to_make,
            first,
            |s, (new, existing)| s.make_link(new, existing),
        );
        self.each(
            "delete",
            &req.paths_to_delete,
            String::as_str,
            |s, p| match remove_sparing(&s.host(p), p, s.opts.exclusions) {
                Ok(()) => s.stats.deleted += 1,
                Err(e) => s.stats.error(format!("deleting {p}: {e}")),
            },
        );
        self.each(
            "change metadata",
            &req.inodes_to_change,
            first,
            |s, (p, inode)| {
                let h = s.host(p);
                if s.set_metadata(&h, p, inode) {
                    s.stats.changed += 1;
                }
            },
        );
        let d = t.elapsed();
        self.stats.change_window_ms = d.as_secs_f64() * 1e3;
        d
    }

    /// One phase of the change window: `apply` to each of `items` whose path (`path`) is not
    /// excluded, progress reported as `phase`.
    fn each<T>(
        &mut self,
        phase: &str,
        items: &[T],
        path: fn(&T) -> &str,
        mut apply: impl FnMut(&mut Self, &T),
    ) {
        for (i, item) in items.iter().enumerate() {
            if !self.excluded(path(item)) {
                apply(self, item);
            }
            self.step(phase, i + 1, items.len());
        }
    }

    fn make_dir(&mut self, p: &str, inode: &Inode) {
        let h = self.host(p);
        match fs::symlink_metadata(&h) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                if let Err(e) = fs::remove_file(&h) {
                    self.stats.error(format!("making directory {p}: {e}"));
                    return;
                }
                if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&h) {
                    self.stats.error(format!("making directory {p}: {e}"));
                    return;
                }
            }
            Err(_) => {
                if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&h) {
                    self.stats.error(format!("making directory {p}: {e}"));
                    return;
                }
            }
        }
        if self.set_metadata(&h, p, inode) {
            self.stats.dirs_made += 1;
        }
    }

    /// The next unused copy of an object (`~k~` copies first, the object itself last).
    fn take_object(&mut self, o: ObjectId) -> PathBuf {
        let base = self.objects.join(o.path());
        let k = self.used.entry(o).or_insert(0);
        *k += 1;
        if *k == 1 {
            base
        } else {
            copy_name(&base, *k - 1)
        }
    }

    fn make_inode(&mut self, p: &str, inode: &Inode) {
        let dest = self.host(p);
        let tmp = self.root.join(TMP_INODE);
        // An object's metadata before it is placed: a vouch for it follows it ([`Self::carry`]).
        let mut before = None;
        let src = match inode {
            Inode::Regular {
                object: Some(o), ..
            } => {
                let src = self.take_object(*o);
                match fs::symlink_metadata(&src) {
                    Ok(m) => before = Some(m),
                    Err(e) => {
                        self.stats.error(format!(
                            "making {p}: object {} is not in the cache: {e}",
                            o.short()
                        ));
                        return;
                    }
                }
                src
            }
            Inode::Regular { object: None, .. } => {
                let _ = fs::remove_file(&tmp);
                if let Err(e) = File::create_new(&tmp) {
                    self.stats.error(format!("making empty file {p}: {e}"));
                    return;
                }
                tmp
            }
            Inode::Symlink { target, .. } => {
                let _ = fs::remove_file(&tmp);
                if let Err(e) = std::os::unix::fs::symlink(target, &tmp) {
                    self.stats.error(format!("making symlink {p}: {e}"));
                    return;
                }
                tmp
            }
            Inode::Special {
                special,
                mode,
                rdev,
                ..
            } => {
                let _ = fs::remove_file(&tmp);
                let kind = match special {
                    SpecialKind::Char => SFlag::S_IFCHR,
                    SpecialKind::Block => SFlag::S_IFBLK,
                    SpecialKind::Fifo => SFlag::S_IFIFO,
                };
                let rdev = if *special == SpecialKind::Fifo {
                    0
                } else {
                    *rdev
                };
                if let Err(e) =
                    nix::sys::stat::mknod(&tmp, kind, Mode::from_bits_truncate(*mode), rdev)
                {
                    self.stats.error(format!("making {p}: mknod: {e}"));
                    return;
                }
                tmp
            }
            Inode::Directory { .. } => {
                self.stats
                    .error(format!("making {p}: a directory among the inodes"));
                return;
            }
        };
        self.set_metadata(&src, p, inode);
        if let Some(argv) = self.checks.get(p)
            && let Err(why) = self.check(argv, &src)
        {
            // The old file stays; so does the object, for the next try.
            self.stats
                .error(format!("making {p}: {why}; the old file is kept"));
            return;
        }
        match rename_over(&src, &dest) {
            Ok(()) => {
                self.stats.inodes_made += 1;
                self.carry(before.as_ref(), &dest);
            }
            Err(e) => self.stats.error(format!("making {p}: {e}")),
        }
    }

    /// Runs a file's check against its new content at `new` (before it is renamed into
    /// place): the program with `new` appended.
    fn check(&self, argv: &[String], new: &Path) -> Result<(), CheckRefused> {
        let scratch = self.root.join(SUBD_DIR);
        let new = new.to_string_lossy();
        let out = crate::triggers::run_command(argv, &[&new], &[], CHECK_TIMEOUT, &scratch);
        if out.ok {
            return Ok(());
        }
        let program = argv.first().cloned().unwrap_or_default();
        Err(match out.exit_code {
            Some(code) => CheckRefused::Exited {
                program,
                code,
                first: out
                    .output
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .to_string(),
            },
            None => CheckRefused::Failed {
                program,
                output: out.output.trim().to_string(),
            },
        })
    }

    /// The vouch for the file that was at `before` follows it to `now_at` (its ctime moved
    /// with our own rename, link or metadata change).
    fn carry(&self, before: Option<&fs::Metadata>, now_at: &Path) {
        if let (Some(v), Some(before), Ok(after)) =
            (self.opts.vouched, before, fs::symlink_metadata(now_at))
        {
            v.carry(Key::of_metadata(before), Key::of_metadata(&after));
        }
    }

    fn make_link(&mut self, new: &str, existing: &str) {
        let (hn, he) = (self.host(new), self.host(existing));
        let target = match fs::symlink_metadata(&he) {
            Ok(m) => m,
            Err(e) => {
                self.stats
                    .error(format!("linking {new} to {existing}: {existing}: {e}"));
                return;
            }
        };
        if let Ok(m) = fs::symlink_metadata(&hn)
            && (m.dev(), m.ino()) == (target.dev(), target.ino())
        {
            // Already a name of that inode (rename would then do nothing at all).
            self.stats.hardlinks_made += 1;
            return;
        }
        let tmp = self.root.join(TMP_HARDLINK);
        let _ = fs::remove_file(&tmp);
        if let Err(e) = fs::hard_link(&he, &tmp) {
            self.stats
                .error(format!("linking {new} to {existing}: {e}"));
            return;
        }
        match rename_over(&tmp, &hn) {
            Ok(()) => {
                self.stats.hardlinks_made += 1;
                self.carry(Some(&target), &hn);
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                self.stats
                    .error(format!("linking {new} to {existing}: {e}"));
            }
        }
    }

    /// Owner, then mode, then mtime, as the inode says; false if something failed.
    fn set_metadata(&mut self, host: &Path, p: &str, inode: &Inode) -> bool {
        let (uid, gid, mode, mtime): (u32, u32, Option<u32>, Option<Mtime>) = match inode {
            Inode::Directory { mode, uid, gid } => (*uid, *gid, Some(*mode), None),
            Inode::Regular {
                mode,
                uid,
                gid,
                mtime,
                ..
            }
            | Inode::Special {
                mode,
                uid,
                gid,
                mtime,
                ..
            } => (*uid, *gid, Some(*mode), Some(*mtime)),
            Inode::Symlink { uid, gid, .. } => (*uid, *gid, None, None),
        };
        let mut ok = true;
        if let Err(e) = std::os::unix::fs::lchown(host, Some(uid), Some(gid)) {
            ok = false;
            self.stats.error(format!("{p}: chown {uid}:{gid}: {e}"));
        }
        if let Some(mode) = mode
            && let Err(e) = fs::set_permissions(host, fs::Permissions::from_mode(mode))
        {
            ok = false;
            self.stats.error(format!("{p}: chmod {mode:o}: {e}"));
        }
        if let Some(m) = mtime {
            let when = TimeSpec::new(m.sec, i64::from(m.nsec));
            if let Err(e) = utimensat(
                nix::fcntl::AT_FDCWD,
                host,
                &TimeSpec::UTIME_OMIT,
                &when,
                UtimensatFlags::NoFollowSymlink,
            ) {
                ok = false;
                self.stats.error(format!("{p}: setting the mtime: {e}"));
            }
        }
        ok
    }
}

/// The path of a `(path, …)` entry of a request.
fn first<U>(entry: &(String, U)) -> &str {
    &entry.0
}

/// `<object>~k~`: the k-th extra copy of an object.
fn copy_name(base: &Path, k: u64) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(format!("~{k}~"));
    PathBuf::from(s)
}

/// Renames `src` over `dest`; a directory at `dest` is removed first.
fn rename_over(src: &Path, dest: &Path) -> io::Result<()> {
    match fs::rename(src, dest) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error().map(Errno::from_raw),
                Some(Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOTDIR)
            ) && fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) =>
        {
            fs::remove_dir_all(dest)?;
            fs::rename(src, dest)
        }
        Err(e) => Err(e),
    }
}

/// [`remove_any`] of the tree's path `rel` at `p`, sparing what `exclusions` match beneath
/// a directory: those stay, with the directories that lead to them. (Scans leave excluded
/// paths out, so a directory the image does not have may still hold them.)
fn remove_sparing(p: &Path, rel: &str, exclusions: Option<&Filter>) -> io::Result<()> {
    let Some(ex) = exclusions else {
        return remove_any(p);
    };
    spare(p, rel, ex).map(drop)
}

/// Removes `p` but what `ex` matches beneath it; whether anything was spared.
fn spare(p: &Path, rel: &str, ex: &Filter) -> io::Result<bool> {
    let is_dir = match fs::symlink_metadata(p) {
        Ok(m) => m.is_dir(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if !is_dir {
        return remove_any(p).map(|()| false);
    }
    let mut spared = false;
    for entry in fs::read_dir(p)? {
        let entry = entry?;
        let name = entry.file_name();
        let child = format!("{}/{}", rel.trim_end_matches('/'), name.to_string_lossy());
        if ex.matches(&child) {
            spared = true;
        } else {
            spared |= spare(&entry.path(), &child, ex)?;
        }
    }
    if !spared {
        remove_any(p)?;
    }
    Ok(spared)
}

/// Removes a file, a symlink (not what it points to) or a directory tree; absent is fine.
pub fn remove_any(p: &Path) -> io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
    .or_else(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            Ok(())
        } else {
            Err(e)
        }
    })
}

/// Puts the content of `src` into the cache at `dest` (already there: nothing to do), after
/// checking it is the object `id`: hard-linked, or copied to `dest~` and renamed.
fn copy_into_cache(src: &Path, dest: &Path, id: ObjectId, hardlink: bool) -> io::Result<()> {
    if fs::symlink_metadata(dest).is_ok() {
        return Ok(());
    }
    if let Some(parent) = dest.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    let mut input = File::open(src)?;
    if !input.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut tmp_name = dest.as_os_str().to_owned();
    tmp_name.push("~");
    let tmp = PathBuf::from(tmp_name);
    let mut out = if hardlink {
        None
    } else {
        Some(File::create(&tmp)?)
    };
    let mut h = ObjectHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n])?;
        }
    }
    if h.finish() != id {
        drop(out);
        let _ = fs::remove_file(&tmp);
        return Err(io::Error::other(
            "its content changed since the scan (hash differs)",
        ));
    }
    if hardlink {
        match fs::hard_link(src, dest) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        return Ok(());
    }
    drop(out);
    fs::rename(&tmp, dest)
}

/// Applies a whole request without triggers (prepare, then the change window, then the
/// image record): what an update does to the file system.
pub fn apply(
    root: &Path,
    req: &UpdateRequest,
    opts: ApplyOptions,
) -> Result<ApplyStats, InvalidRequest> {
    validate(req)?;
    let mut a = Applier::new(root, opts);
    a.prepare(req);
    a.change(req);
    if !req.sparse
        && let Err(e) = record_image(root, &req.image_name)
    {
        a.stats.error(format!("recording the image name: {e}"));
    }
    Ok(a.stats)
}

/// Writes a file under the root atomically and durably (temporary name, fsync, rename, fsync
/// of the directory: without the last, a power cut may keep the old name).
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push("~");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Records the image applied ([`PATCHED_IMAGE`]), once what the update wrote is durable:
/// files it renamed into place (from the cache, or copied there during the update) must not
/// come back empty after a power cut under a record that says the image is in place. One
/// sync covers every file system the image spans.
pub fn record_image(root: &Path, name: &str) -> io::Result<()> {
    nix::unistd::sync();
    write_atomically(&root.join(PATCHED_IMAGE), format!("{name}\n").as_bytes())
}

/// The last full image applied.
pub fn patched_image(root: &Path) -> Option<String> {
    fs::read_to_string(root.join(PATCHED_IMAGE))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Why the previous update's triggers cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PreviousTriggersError {
    #[error("{TRIGGERS_PREVIOUS}: {0}")]
    Parse(#[from] TriggersError),
    #[error("{TRIGGERS_PREVIOUS}: {0}")]
    Io(#[from] io::Error),
}

/// The triggers of the previous update (none: empty).
pub fn previous_triggers(root: &Path) -> Result<Triggers, PreviousTriggersError> {
    match fs::read_to_string(root.join(TRIGGERS_PREVIOUS)) {
        Ok(s) => Ok(Triggers::parse(&s)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Triggers::default()),
        Err(e) => Err(e.into()),
    }
}

pub fn save_triggers(root: &Path, t: &Triggers) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(t).map_err(io::Error::other)?;
    write_atomically(&root.join(TRIGGERS_PREVIOUS), &json)
}

/// Removes what an interrupted update or fetch leaves: `~`-suffixed names in the object
/// cache (partial fetches and copies, extra copies of multiply-used objects) and the
/// scratch names in `.subd`. Returns how many were removed.
pub fn clean_leftovers(root: &Path) -> io::Result<u64> {
    let mut n = 0;
    for scratch in [TMP_INODE, TMP_HARDLINK] {
        if fs::symlink_metadata(root.join(scratch)).is_ok() {
            remove_any(&root.join(scratch))?;
            n += 1;
        }
    }
    for entry in fs::read_dir(root.join(SUBD_DIR))? {
        let e = entry?;
        let name = e.file_name();
        let s = name.to_string_lossy();
        if s.ends_with('~') || s.starts_with("command-output.") {
            remove_any(&e.path())?;
            n += 1;
        }
    }
    let objects = root.join(OBJECTS_DIR);
    let top = match fs::read_dir(&objects) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(n),
        Err(e) => return Err(e),
    };
    for a in top {
        let a = a?;
        if !a.file_type()?.is_dir() {
            continue;
        }
        for b in fs::read_dir(a.path())? {
            let b = b?;
            if !b.file_type()?.is_dir() {
                continue;
            }
            for c in fs::read_dir(b.path())? {
                let c = c?;
                if c.file_name().to_string_lossy().ends_with('~') {
                    remove_any(&c.path())?;
                    n += 1;
                }
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_image::plan::CopyToCache;

    #[test]
    fn deleting_a_directory_spares_what_the_exclusions_match_beneath_it() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in ["etc/paddock/subd", "etc/old/deep"] {
            fs::create_dir_all(r.join(d)).unwrap();
        }
        for f in [
            "etc/paddock/subd/key.pem",
            "etc/paddock/stale",
            "etc/old/deep/x",
        ] {
            fs::write(r.join(f), "x").unwrap();
        }
        let ex = Filter::parse("/etc/paddock/subd(|/.*)$\n").unwrap();
        remove_sparing(&r.join("etc/paddock"), "/etc/paddock", Some(&ex)).unwrap();
        assert!(
            r.join("etc/paddock/subd/key.pem").exists(),
            "the identity stays"
        );
        assert!(!r.join("etc/paddock/stale").exists());
        remove_sparing(&r.join("etc/old"), "/etc/old", Some(&ex)).unwrap();
        assert!(
            !r.join("etc/old").exists(),
            "nothing spared: all of it goes"
        );
        remove_sparing(&r.join("etc/none"), "/etc/none", Some(&ex)).unwrap();
        remove_sparing(&r.join("etc/paddock"), "/etc/paddock", None).unwrap();
        assert!(
            !r.join("etc/paddock").exists(),
            "no exclusions: the whole tree"
        );
    }

    #[test]
    fn requests_from_the_network_are_checked() {
        let file = Inode::Regular {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: Mtime::default(),
            size: 0,
            object: None,
        };
        let dir = Inode::Directory {
            mode: 0o755,
            uid: 0,
            gid: 0,
        };
        let ok = UpdateRequest {
            inodes_to_make: vec![("/etc/x".into(), file.clone())],
            inodes_to_change: vec![("/".into(), dir.clone())],
            ..UpdateRequest::default()
        };
        assert_eq!(validate(&ok), Ok(()));
        let make = |path: &str, inode: &Inode| UpdateRequest {
            inodes_to_make: vec![(path.into(), inode.clone())],
            ..UpdateRequest::default()
        };
        let delete = |path: &str| UpdateRequest {
            paths_to_delete: vec![path.into()],
            ..UpdateRequest::default()
        };
        let bad: Vec<UpdateRequest> = vec![
            make("/etc/../x", &file),
            make("etc/x", &file),
            delete("/.subd/objects"),
            delete("/"),
            UpdateRequest {
                hardlinks_to_make: vec![("/a".into(), "/.subd/x".into())],
                ..UpdateRequest::default()
            },
            UpdateRequest {
                files_to_copy_to_cache: vec![CopyToCache {
                    path: "/a//b".into(),
                    object: ObjectId::of(b"x"),
                    hardlink: false,
                }],
                ..UpdateRequest::default()
            },
            make("/d", &dir),
            UpdateRequest {
                directories_to_make: vec![("/d".into(), file.clone())],
                ..UpdateRequest::default()
            },
            UpdateRequest {
                inodes_to_change: vec![(
                    "/d".into(),
                    Inode::Directory {
                        mode: 0o40755,
                        uid: 0,
                        gid: 0,
                    },
                )],
                ..UpdateRequest::default()
            },
        ];
        // The refusals read as they always have (they reach the controller as 400s).
        let why = [
            r#""/etc/../x" is not a normalised absolute path"#,
            r#""etc/x" is not a normalised absolute path"#,
            r#""/.subd/objects" is subd's own directory"#,
            "/ cannot be made, linked, copied or deleted",
            r#""/.subd/x" is subd's own directory"#,
            r#""/a//b" is not a normalised absolute path"#,
            "/d: a directory among the inodes to make",
            "/d: not a directory among the directories to make",
            "/d: mode has more than permission bits",
        ];
        assert_eq!(bad.len(), why.len());
        for (i, (r, why)) in bad.iter().zip(why).enumerate() {
            let e = validate(r).expect_err(&format!("case {i} accepted"));
            assert_eq!(e.to_string(), why, "case {i}");
        }
    }

    #[test]
    fn copy_names() {
        assert_eq!(
            copy_name(Path::new("/c/ab/cd/ef"), 2),
            PathBuf::from("/c/ab/cd/ef~2~")
        );
    }
}
