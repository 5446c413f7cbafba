//! The update planner: `plan(sub tree, sub object cache, image) → UpdateRequest`.
//!
//! Dominator's `dom/lib/buildUpdateRequest.go`, made exact: applying the request (in field
//! order, as documented on [`UpdateRequest`]) to the sub's tree yields the image's tree, with
//! its hard-link grouping, except where the rules below say a path is left alone:
//!
//! - a path the image's filter matches, and everything below it, is never created, changed or
//!   deleted, even when the image names it (see [`untouchable`]); so is `/.subd` and its
//!   contents. A sub directory holding such a path (in the sub's tree, or by the filter's
//!   word, [`Filter::holders`]: subd's scans leave filtered paths out) is never removed: when the image does not
//!   name it, only its other contents are deleted; when the image has a non-directory there,
//!   that path is not made (the directory stays);
//! - a sparse image (no filter) deletes nothing it does not name;
//! - `/` is never made or deleted, only its metadata changed;
//! - an identical inode is left alone (even if it also has names the update does not touch);
//!   a same-content inode gets its metadata changed in place, unless that would also change a
//!   name the update leaves alone (then the image's inode is made anew);
//! - content the image needs comes from the sub's object cache, else from a regular file
//!   already on the sub (copied into the cache), else it must be fetched first
//!   ([`missing_objects`]). Zero-size files need no object; a metadata-only change never
//!   needs a fetch.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::filter::Filter;
use crate::image::Image;
use crate::object::ObjectId;
use crate::tree::{FileSystem, Inode, parent};
use crate::triggers::Triggers;

/// subd's own directory on the sub: never scanned, never touched by an update.
pub const SUBD_DIR: &str = "/.subd";

/// Content to put into the object cache before the change window, from a regular file on the
/// sub (read before anything is changed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyToCache {
    /// The source file on the sub (never an [`untouchable`] path).
    pub path: String,
    /// Its content, which becomes `objects/<object path>`.
    pub object: ObjectId,
    /// Hard-link the source into the cache instead of copying it: every name of the source
    /// inode is deleted or replaced by this update, so nothing else sees the shared inode.
    pub hardlink: bool,
}

/// What subd must do to make its tree the image's, in the order it does it (the fields are in
/// that order). Paths are absolute and normalised. Each "make" step replaces whatever is at
/// its path (a directory there is removed with its contents), so a path whose kind changes is
/// listed once, in the step that makes its new inode, and not in `paths_to_delete` (which runs
/// later and would remove the new inode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpdateRequest {
    /// The image applied (written to the sub's patched-image record unless `sparse`).
    pub image_name: String,
    /// The image has no filter: extra paths on the sub are kept.
    pub sparse: bool,
    /// The image's triggers, matched against [`UpdateRequest::changed_paths`].
    pub triggers: Triggers,
    /// 1. Content needed by `inodes_to_make` that is not in the cache but is in a file on the
    ///    sub: copy (or hard-link) it into the cache. One source per object, sorted by path.
    pub files_to_copy_to_cache: Vec<CopyToCache>,
    /// 2. Objects that N > 1 entries of `inodes_to_make` use: make N − 1 extra copies in the
    ///    cache (`<object>~1~` … `<object>~N-1~`), since each rename into place consumes one.
    pub multiply_used_objects: BTreeMap<ObjectId, u64>,
    /// 3. Directories to create (mode, uid, gid from the inode), parents before children.
    ///    A non-directory at the path is removed first.
    pub directories_to_make: Vec<(String, Inode)>,
    /// 4. New inodes (regular files, symlinks, devices, fifos), one entry per inode, at its
    ///    first path; sorted by path. A regular file with content is renamed into place from
    ///    the cache (consuming one copy), an empty one is created; then its metadata is set.
    ///    Whatever is at the path (including a directory tree) is replaced.
    pub inodes_to_make: Vec<(String, Inode)>,
    /// 5. `(new path, existing path)`: make `new path` another name of the inode at `existing
    ///    path` (link to a temporary name, then rename over whatever is at `new path`). The
    ///    other names of multi-name inodes, and names re-pointed or split from the inode they
    ///    share on the sub. Sorted by new path. The existing path already names the wanted
    ///    inode when this step runs (a path kept as it is, or made in step 4).
    pub hardlinks_to_make: Vec<(String, String)>,
    /// 6. Paths to remove (recursively), only paths the image does not name and only with a
    ///    filter (never for a sparse image), never filtered paths or `/.subd`: a directory is
    ///    listed once, not its contents. Sorted.
    pub paths_to_delete: Vec<String>,
    /// 7. Same kind and content, other metadata (mode, uid, gid, mtime): set in place, nothing
    ///    fetched. One entry per path whose inode changes (all names of a hard-linked inode
    ///    that already share it), so triggers see each of them. Sorted; `/` may be here.
    pub inodes_to_change: Vec<(String, Inode)>,
    /// The paths of `inodes_to_change` whose change is only the mtime: not matched by
    /// triggers (Dominator's `checkNonMtimeChange`).
    pub mtime_only_changes: BTreeSet<String>,
    /// Paths of `inodes_to_make` whose new content is checked before it replaces the old:
    /// the program (an absolute path, then its arguments) runs with the new content's path
    /// appended; any exit but 0 keeps the old file and reports the check's output.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checks: BTreeMap<String, Vec<String>>,
}

impl UpdateRequest {
    /// True when there is nothing to do on the sub.
    pub fn is_empty(&self) -> bool {
        self.files_to_copy_to_cache.is_empty()
            && self.multiply_used_objects.is_empty()
            && self.directories_to_make.is_empty()
            && self.inodes_to_make.is_empty()
            && self.hardlinks_to_make.is_empty()
            && self.paths_to_delete.is_empty()
            && self.inodes_to_change.is_empty()
    }

    /// The paths triggers are matched against: created, hard-linked, deleted, or whose
    /// metadata changes other than the mtime alone. In execution order.
    pub fn changed_paths(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        out.extend(self.directories_to_make.iter().map(|(p, _)| p.as_str()));
        out.extend(self.inodes_to_make.iter().map(|(p, _)| p.as_str()));
        out.extend(self.hardlinks_to_make.iter().map(|(p, _)| p.as_str()));
        out.extend(self.paths_to_delete.iter().map(String::as_str));
        out.extend(
            self.inodes_to_change
                .iter()
                .map(|(p, _)| p.as_str())
                .filter(|p| !self.mtime_only_changes.contains(*p)),
        );
        out
    }

    /// The triggers this update fires, in the order they run.
    pub fn matched_triggers(&self) -> Vec<&crate::triggers::Trigger> {
        self.triggers.matching(self.changed_paths())
    }
}

/// The update that makes `sub` (the sub's scanned tree, whose object cache holds `cache`)
/// into `image`. Objects listed by [`missing_objects`] must be in the cache before it runs.
pub fn plan(sub: &FileSystem, cache: &BTreeSet<ObjectId>, image: &Image) -> UpdateRequest {
    Planner::new(sub, cache, image).run().0
}

/// The objects to fetch before the update: needed by inodes the update makes, not in the
/// cache, and in no regular file on the sub outside [`untouchable`] paths (a filtered file
/// may change under the update, so it is never a copy source).
pub fn missing_objects(
    sub: &FileSystem,
    cache: &BTreeSet<ObjectId>,
    image: &Image,
) -> BTreeSet<ObjectId> {
    Planner::new(sub, cache, image).run().1
}

/// True for a path no update touches: `/.subd` and below, and (when there is a filter) a
/// path the filter matches and everything below it. `/` is never filtered.
pub fn untouchable(path: &str, filter: Option<&Filter>) -> bool {
    // A loop up the parents, not a recursion: a path comes from a sub's tree or a request,
    // and its depth must not be the depth of the stack.
    let mut p = path;
    while p != "/" {
        if is_subd(p) || filter.is_some_and(|f| f.matches(p)) {
            return true;
        }
        match parent(p) {
            Some(q) => p = q,
            None => return false,
        }
    }
    false
}

fn is_subd(p: &str) -> bool {
    p.strip_prefix(SUBD_DIR)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// [`untouchable`] for every path of a tree (parents looked up, not recomputed).
fn protection<'a>(fs: &'a FileSystem, filter: Option<&Filter>) -> BTreeMap<&'a str, bool> {
    let mut out: BTreeMap<&'a str, bool> = BTreeMap::new();
    for p in fs.paths.keys() {
        let v = p != "/"
            && (is_subd(p)
                || filter.is_some_and(|f| f.matches(p))
                || parent(p).is_some_and(|q| {
                    out.get(q)
                        .copied()
                        .unwrap_or_else(|| untouchable(q, filter))
                }));
        out.insert(p.as_str(), v);
    }
    out
}

/// What the update does to a path of the sub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Left alone: untouchable, a sparse image's extra, a directory the image wants replaced
    /// or removed that holds untouchable paths.
    Untouched,
    /// A directory in both trees (its metadata may change).
    KeptDir,
    /// A non-directory where the image has a non-directory: kept if its inode is mapped to
    /// the image's inode there, else replaced.
    Matched,
    /// Replaced by what the image has at the path (a kind change).
    Replaced,
    /// In `paths_to_delete`.
    Deleted,
    /// Removed with a deleted or replaced ancestor.
    Gone,
}

struct Planner<'a> {
    sub: &'a FileSystem,
    img: &'a FileSystem,
    cache: &'a BTreeSet<ObjectId>,
    image: &'a Image,
}

impl<'a> Planner<'a> {
    fn new(sub: &'a FileSystem, cache: &'a BTreeSet<ObjectId>, image: &'a Image) -> Self {
        Planner {
            sub,
            img: &image.fs,
            cache,
            image,
        }
    }

    fn run(&self) -> (UpdateRequest, BTreeSet<ObjectId>) {
        let (sub, img) = (self.sub, self.img);
        let filter = self.image.filter.as_ref();
        let sparse = filter.is_none();
        let mut req = UpdateRequest {
            image_name: self.image.name.clone(),
            sparse,
            triggers: self.image.triggers.clone(),
            ..UpdateRequest::default()
        };

        let sub_protected = protection(sub, filter);
        let img_protected = protection(img, filter);
        // Sub directories holding an untouchable path: never removed.
        let mut holds_protected: BTreeSet<&str> = BTreeSet::new();
        for (p, _) in sub_protected.iter().filter(|(_, v)| **v) {
            let mut q = parent(p);
            while let Some(a) = q {
                if !holds_protected.insert(a) {
                    break;
                }
                q = parent(a);
            }
        }
        // And those that may hold one the sub's scan left out (subd excludes filtered
        // paths from its scans: a directory holding only them looks empty).
        for holder in filter.map(Filter::holders).unwrap_or_default() {
            if let Some((p, _)) = sub.paths.get_key_value(holder.as_str()) {
                holds_protected.insert(p.as_str());
            }
        }

        // The image paths the update realises: not untouchable, not `/`, and not a
        // non-directory where the sub has a directory it may not remove.
        let mut wanted: BTreeMap<&'a str, u64> = BTreeMap::new();
        let mut blocked: BTreeSet<&'a str> = BTreeSet::new();
        for (p, ino) in &img.paths {
            if p == "/" || img_protected.get(p.as_str()).copied().unwrap_or(true) {
                continue;
            }
            let Some(inode) = img.inodes.get(ino) else {
                continue;
            };
            if !inode.is_dir()
                && sub.get(p).is_some_and(Inode::is_dir)
                && holds_protected.contains(p.as_str())
            {
                blocked.insert(p);
                continue;
            }
            wanted.insert(p, *ino);
        }

        // The fate of every sub path, parents first.
        let mut fate: BTreeMap<&'a str, Fate> = BTreeMap::new();
        for (p, ino) in &sub.paths {
            let p = p.as_str();
            if p == "/" {
                fate.insert(p, Fate::KeptDir);
                continue;
            }
            let sub_dir = sub.inodes.get(ino).is_some_and(Inode::is_dir);
            let parent_fate = parent(p).and_then(|q| fate.get(q)).copied();
            let f = if matches!(
                parent_fate,
                Some(Fate::Replaced | Fate::Deleted | Fate::Gone)
            ) {
                Fate::Gone
            } else if sub_protected.get(p).copied().unwrap_or(true) {
                Fate::Untouched
            } else if let Some(i) = wanted.get(p) {
                let img_dir = img.inodes.get(i).is_some_and(Inode::is_dir);
                match (img_dir, sub_dir) {
                    (true, true) => Fate::KeptDir,
                    (false, false) => Fate::Matched,
                    _ => Fate::Replaced,
                }
            } else if blocked.contains(p) || sparse || (sub_dir && holds_protected.contains(p)) {
                Fate::Untouched
            } else {
                Fate::Deleted
            };
            fate.insert(p, f);
        }

        // Root metadata, then directories.
        if let (Some(a @ Inode::Directory { .. }), Some(b @ Inode::Directory { .. })) =
            (sub.get("/"), img.get("/"))
            && a != b
        {
            req.inodes_to_change.push(("/".into(), b.clone()));
        }
        // Non-directory image inodes and their wanted names (sorted), in first-name order.
        let mut img_names: BTreeMap<u64, Vec<&'a str>> = BTreeMap::new();
        for (p, ino) in &wanted {
            let inode = &img.inodes[ino];
            if inode.is_dir() {
                if fate.get(p) == Some(&Fate::KeptDir) {
                    if sub.get(p) != Some(inode) {
                        req.inodes_to_change.push(((*p).into(), inode.clone()));
                    }
                } else {
                    req.directories_to_make.push(((*p).into(), inode.clone()));
                }
            } else {
                img_names.entry(*ino).or_default().push(p);
            }
        }
        let mut order: Vec<(u64, Vec<&'a str>)> = img_names.into_iter().collect();
        order.sort_by(|a, b| a.1[0].cmp(b.1[0]));

        // Map image inodes to sub inodes kept for them: identical ones first, then
        // same-content ones whose metadata may change without touching a name left alone.
        let sub_names = sub.names();
        let mut taken: BTreeSet<u64> = BTreeSet::new();
        let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
        for identical_pass in [true, false] {
            for (i, names) in &order {
                if mapped.contains_key(i) {
                    continue;
                }
                let want = &img.inodes[i];
                let mut best: Option<(u64, usize)> = None;
                for n in names {
                    if fate.get(n) != Some(&Fate::Matched) {
                        continue;
                    }
                    let s = sub.paths[*n];
                    let Some(have) = sub.inodes.get(&s) else {
                        continue;
                    };
                    if taken.contains(&s) {
                        continue;
                    }
                    let s_names = sub_names.get(&s).map(Vec::as_slice).unwrap_or_default();
                    let ok = if identical_pass {
                        have.same(want)
                    } else {
                        have.same_content(want)
                            && s_names.iter().all(|m| {
                                names.binary_search(m).is_ok()
                                    || fate.get(m) != Some(&Fate::Untouched)
                            })
                    };
                    if !ok {
                        continue;
                    }
                    let cover = s_names
                        .iter()
                        .filter(|m| names.binary_search(m).is_ok())
                        .count();
                    if best.is_none_or(|(_, c)| cover > c) {
                        best = Some((s, cover));
                    }
                }
                if let Some((s, _)) = best {
                    taken.insert(s);
                    mapped.insert(*i, s);
                }
            }
        }

        // Inodes: keep (links, metadata) or make (links), counting object uses.
        let mut uses: BTreeMap<ObjectId, u64> = BTreeMap::new();
        for (i, names) in &order {
            let want = &img.inodes[i];
            if let Some(&s) = mapped.get(i) {
                let have = &sub.inodes[&s];
                let rep = names
                    .iter()
                    .find(|n| sub.paths.get(**n) == Some(&s))
                    .copied()
                    .unwrap_or(names[0]);
                for n in names {
                    if sub.paths.get(*n) == Some(&s) {
                        if have != want {
                            req.inodes_to_change.push(((*n).into(), want.clone()));
                            if have.same_but_mtime(want) {
                                req.mtime_only_changes.insert((*n).into());
                            }
                        }
                    } else {
                        req.hardlinks_to_make.push(((*n).into(), rep.into()));
                    }
                }
            } else {
                let first = names[0];
                req.inodes_to_make.push((first.into(), want.clone()));
                if let Some(o) = want.object() {
                    *uses.entry(o).or_default() += 1;
                }
                for n in &names[1..] {
                    req.hardlinks_to_make.push(((*n).into(), first.into()));
                }
            }
        }
        req.paths_to_delete = fate
            .iter()
            .filter(|(_, f)| **f == Fate::Deleted)
            .map(|(p, _)| (*p).to_string())
            .collect();

        // Objects: from the cache, else copied from a file on the sub, else fetched.
        let mut missing = BTreeSet::new();
        let mut by_object: BTreeMap<ObjectId, Vec<u64>> = BTreeMap::new();
        for (s, inode) in &sub.inodes {
            if let Some(o) = inode.object()
                && uses.contains_key(&o)
                && !self.cache.contains(&o)
            {
                by_object.entry(o).or_default().push(*s);
            }
        }
        for (o, n) in &uses {
            if *n > 1 {
                req.multiply_used_objects.insert(*o, *n);
            }
            if self.cache.contains(o) {
                continue;
            }
            // Candidate sources (first readable name, whole inode goes away), by path: the
            // first whose inode goes away (hard-linked, no copy), else the first.
            let mut sources: Vec<(&str, bool)> = Vec::new();
            for s in by_object.get(o).map(Vec::as_slice).unwrap_or_default() {
                let names = sub_names.get(s).map(Vec::as_slice).unwrap_or_default();
                let Some(readable) = names
                    .iter()
                    .find(|m| !sub_protected.get(**m).copied().unwrap_or(true))
                else {
                    continue;
                };
                let goes_away = !taken.contains(s)
                    && names.iter().all(|m| {
                        matches!(
                            fate.get(m),
                            Some(Fate::Matched | Fate::Replaced | Fate::Deleted | Fate::Gone)
                        )
                    });
                sources.push((readable, goes_away));
            }
            sources.sort();
            let best = sources
                .iter()
                .find(|(_, h)| *h)
                .or(sources.first())
                .copied();
            match best {
                Some((path, hardlink)) => req.files_to_copy_to_cache.push(CopyToCache {
                    path: path.into(),
                    object: *o,
                    hardlink,
                }),
                None => {
                    missing.insert(*o);
                }
            }
        }

        req.files_to_copy_to_cache
            .sort_by(|a, b| a.path.cmp(&b.path));
        req.inodes_to_make.sort_by(|a, b| a.0.cmp(&b.0));
        req.hardlinks_to_make.sort();
        req.inodes_to_change.sort_by(|a, b| a.0.cmp(&b.0));
        (req, missing)
    }
}
