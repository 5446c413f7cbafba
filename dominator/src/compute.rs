//! The "computing" step, pure: a sub's tree and object cache against its required image
//! (and its planned image) → the update to send, the objects to fetch, the objects to clean
//! up, and the [`PlanSummary`] the state machine decides on.
//!
//! What depends only on an image (its object map) is derived once per image
//! ([`PreparedImage`], shared by every sub on it). A sub that equals its image on every
//! path an update may touch — the usual answer to a full poll: the generation moved for a
//! filtered path, the object cache or a scan of an unchanged tree — is proved so by one
//! ordered walk of both trees ([`provably_unchanged`]) instead of the planner's lookups;
//! anything else is planned by `paddock_image::plan`, once (the objects to fetch are read
//! from its update, not planned again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use paddock_image::plan::{SUBD_DIR, UpdateRequest, plan};
use paddock_image::tree::parent;
use paddock_image::{FileSystem, Filter, Image, Inode, ObjectId};

use crate::sub::{PlanSummary, fetch_need};

/// An image with what planning needs of it beyond its tree, derived once.
#[derive(Debug)]
pub struct PreparedImage {
    pub image: Arc<Image>,
    /// The objects its tree needs, with their sizes.
    pub objects: BTreeMap<ObjectId, u64>,
}

impl PreparedImage {
    pub fn new(image: Arc<Image>) -> Self {
        let objects = image.fs.objects();
        PreparedImage { image, objects }
    }
}

/// What one computation produced for one sub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Computed {
    pub summary: PlanSummary,
    /// The update that makes the sub equal its image (empty when it already is).
    pub request: UpdateRequest,
    /// Objects of the required image the sub lacks (fetched before the update).
    pub fetch: Vec<ObjectId>,
    /// Objects of the planned image the sub lacks (fetched ahead, no update).
    pub preload: Vec<ObjectId>,
    /// Objects in the sub's cache neither image needs.
    pub unused: Vec<ObjectId>,
}

/// Plans `sub` (its tree and cache) against `required`, and notes what `planned` would
/// need. `free_bytes` is what the sub reported free, if it did.
pub fn compute(
    sub: &FileSystem,
    cache: &BTreeSet<ObjectId>,
    required: &PreparedImage,
    planned: Option<&PreparedImage>,
    free_bytes: Option<u64>,
) -> Computed {
    let image = &*required.image;
    let (request, fetch) = if provably_unchanged(sub, image) {
        let empty = UpdateRequest {
            image_name: image.name.clone(),
            sparse: image.filter.is_none(),
            ..UpdateRequest::default()
        };
        (empty, Vec::new())
    } else {
        let request = plan(sub, cache, image);
        let fetch = to_fetch(&request, cache);
        (request, fetch)
    };
    let fetch_bytes = fetch_need(
        fetch
            .iter()
            .map(|o| required.objects.get(o).copied().unwrap_or(0)),
    );
    let planned = planned.filter(|p| p.image.name != image.name);
    let preload: Vec<ObjectId> = planned
        .map(|p| {
            p.objects
                .keys()
                .filter(|o| !cache.contains(o) && !required.objects.contains_key(o))
                .copied()
                .collect()
        })
        .unwrap_or_default();
    let unused: Vec<ObjectId> = cache
        .iter()
        .filter(|o| {
            !required.objects.contains_key(o) && !planned.is_some_and(|p| p.objects.contains_key(o))
        })
        .copied()
        .collect();
    let summary = PlanSummary {
        image: image.name.clone(),
        empty: request.is_empty(),
        sparse: image.filter.is_none(),
        image_inodes: count(image.fs.inodes.len()),
        sub_inodes: count(sub.inodes.len()),
        deletions: count(request.paths_to_delete.len()),
        objects_to_fetch: count(fetch.len()),
        fetch_bytes,
        free_bytes,
        unused_cache_objects: count(unused.len()),
        planned_objects_to_fetch: count(preload.len()),
        planned_image: planned.map(|p| p.image.name.clone()),
        disruptive: request
            .matched_triggers()
            .iter()
            .any(|t| t.high_impact || t.do_reboot),
    };
    Computed {
        summary,
        request,
        fetch,
        preload,
        unused,
    }
}

/// The objects to fetch before `request` runs: those of the inodes it makes that are
/// neither in the cache nor copied into it from a file on the sub (what
/// `paddock_image::plan::missing_objects` answers, without planning again).
fn to_fetch(request: &UpdateRequest, cache: &BTreeSet<ObjectId>) -> Vec<ObjectId> {
    let copied: BTreeSet<ObjectId> = request
        .files_to_copy_to_cache
        .iter()
        .map(|c| c.object)
        .collect();
    let needed: BTreeSet<ObjectId> = request
        .inodes_to_make
        .iter()
        .filter_map(|(_, i)| i.object())
        .filter(|o| !cache.contains(o) && !copied.contains(o))
        .collect();
    needed.into_iter().collect()
}

/// True only when planning `sub` against `image` gives an empty update (false may still
/// plan empty: the planner decides). Both trees are walked once in path order; every path
/// an update may touch (not `paddock_image::plan::untouchable`) must be in both with the same inode, the
/// same names sharing one inode on both sides, and no path only on one side (a sparse
/// image keeps the sub's extras, so those may be there). Untouchable paths may differ
/// in any way.
pub fn provably_unchanged(sub: &FileSystem, image: &Image) -> bool {
    let filter = image.filter.as_ref();
    let sparse = filter.is_none();
    let mut memo: HashMap<&str, bool> = HashMap::new();
    let mut is_protected = |p| protected(&mut memo, p, filter);
    let (sub_inodes, image_inodes) = (Inodes::of(&sub.inodes), Inodes::of(&image.fs.inodes));
    // Inode pairs named by equal paths: one sub inode per image inode and back.
    let (mut to_sub, mut to_image) = (Pairs::of(&image.fs.inodes), Pairs::of(&sub.inodes));
    let mut a = sub.paths.iter().peekable();
    let mut b = image.fs.paths.iter().peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => return true,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((p, _)), Some((q, _))) => p.as_str().cmp(q.as_str()),
        };
        match order {
            std::cmp::Ordering::Less => {
                // Only on the sub: kept by a sparse image when the update may not touch
                // it; deleted by a full image. (A directory holding an untouchable path
                // is left by the planner too, but rarely: let it decide.)
                let Some((p, _)) = a.next() else { return true };
                if !sparse && !is_protected(p) {
                    return false;
                }
            }
            std::cmp::Ordering::Greater => {
                // Only in the image: made, unless untouchable.
                let Some((q, _)) = b.next() else { return true };
                if !is_protected(q) {
                    return false;
                }
            }
            std::cmp::Ordering::Equal => {
                let (Some((p, s)), Some((_, i))) = (a.next(), b.next()) else {
                    return true;
                };
                let same = match (sub_inodes.get(*s), image_inodes.get(*i)) {
                    (Some(x), Some(y)) => x == y,
                    _ => false,
                };
                if !same {
                    if is_protected(p) {
                        continue;
                    }
                    return false;
                }
                // Names grouped otherwise on the two sides (a hard link to make or to
                // split): the planner decides.
                let linked = to_sub.pair(*i, *s) && to_image.pair(*s, *i);
                if !linked {
                    return false;
                }
            }
        }
    }
}

/// Whether inode numbers `0..=max` of a table of `len` inodes are few enough to index a
/// vector by (scanners and images number from 1 up).
fn dense(max: u64, len: usize) -> Option<usize> {
    let max = usize::try_from(max).ok()?;
    (max <= len.saturating_mul(4).saturating_add(64)).then_some(max)
}

/// A tree's inodes by number: a vector when the numbers are dense, else the tree's map
/// (the walk looks up one inode per path on each side).
enum Inodes<'a> {
    Dense(Vec<Option<&'a Inode>>),
    Map(&'a BTreeMap<u64, Inode>),
}

impl<'a> Inodes<'a> {
    fn of(inodes: &'a BTreeMap<u64, Inode>) -> Self {
        let max = inodes.keys().next_back().copied().unwrap_or(0);
        match dense(max, inodes.len()) {
            Some(max) => {
                let mut v = vec![None; max + 1];
                for (n, i) in inodes {
                    if let Some(slot) = usize::try_from(*n).ok().and_then(|n| v.get_mut(n)) {
                        *slot = Some(i);
                    }
                }
                Inodes::Dense(v)
            }
            None => Inodes::Map(inodes),
        }
    }

    fn get(&self, n: u64) -> Option<&'a Inode> {
        match self {
            Inodes::Dense(v) => usize::try_from(n).ok().and_then(|n| v.get(n).copied()?),
            Inodes::Map(m) => m.get(&n),
        }
    }
}

/// Inode number → the inode number first paired with it (the other tree's).
enum Pairs {
    Dense(Vec<u64>),
    Map(HashMap<u64, u64, BuildHasherDefault<MulHasher>>),
}

impl Pairs {
    /// For the numbers of `inodes`.
    fn of(inodes: &BTreeMap<u64, Inode>) -> Self {
        let max = inodes.keys().next_back().copied().unwrap_or(0);
        match dense(max, inodes.len()) {
            Some(max) => Pairs::Dense(vec![u64::MAX; max + 1]),
            None => Pairs::Map(HashMap::with_capacity_and_hasher(
                inodes.len(),
                BuildHasherDefault::default(),
            )),
        }
    }

    /// Pairs `from` with `to` unless it is paired with another number already.
    fn pair(&mut self, from: u64, to: u64) -> bool {
        match self {
            Pairs::Dense(v) => match usize::try_from(from).ok().and_then(|n| v.get_mut(n)) {
                Some(slot) if *slot == u64::MAX => {
                    *slot = to;
                    true
                }
                Some(slot) => *slot == to,
                None => false,
            },
            Pairs::Map(m) => *m.entry(from).or_insert(to) == to,
        }
    }
}

/// Hashes an inode number by one multiplication (SipHash, the default, was most of the
/// walk's time; a sub choosing colliding numbers could only slow its own plan).
#[derive(Default)]
struct MulHasher(u64);

impl Hasher for MulHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// `paddock_image::plan::untouchable`, remembering the answer for each path and its parents.
/// Walks up from `p` to the first answer known (or `/`), then records it for every path on
/// the way: a loop, not a recursion, since the tree is the sub's and its depth must not be
/// the stack's.
fn protected<'a>(memo: &mut HashMap<&'a str, bool>, p: &'a str, filter: Option<&Filter>) -> bool {
    let own = |q: &str| {
        q.strip_prefix(SUBD_DIR)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            || filter.is_some_and(|f| f.matches(q))
    };
    let mut unknown = Vec::new();
    let mut at = Some(p);
    let v = loop {
        let Some(q) = at else { break false };
        if q == "/" {
            break false;
        }
        if let Some(v) = memo.get(q) {
            break *v;
        }
        if own(q) {
            memo.insert(q, true);
            break true;
        }
        unknown.push(q);
        at = parent(q);
    };
    for q in unknown {
        memo.insert(q, v);
    }
    v
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::file;
    use paddock_image::plan::untouchable;

    /// A path 20,000 levels deep (a sub's tree need not name the parents), judged on a
    /// thread with a 256 KiB stack, which a recursion per level would overflow: the answer
    /// comes from a loop, and is remembered for every path on the way up to `/`.
    #[test]
    fn a_deep_path_is_judged_without_recursion() {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let deep = format!("/.subd{}", "/a".repeat(20_000));
                let mut memo = HashMap::new();
                assert!(protected(&mut memo, &deep, None));
                assert!(untouchable(&deep, None));
                let elsewhere = "/a".repeat(20_000);
                let mut memo = HashMap::new();
                assert!(!protected(&mut memo, &elsewhere, None));
                assert_eq!(memo.len(), 20_000, "every path from it up to /a");
                assert!(!untouchable(&elsewhere, None));
            })
            .unwrap()
            .join()
            .unwrap();
    }

    fn tree(files: &[(&str, &str)]) -> FileSystem {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        for (path, content) in files {
            fs.insert(path, file(content)).unwrap();
        }
        fs
    }

    fn image(name: &str, files: &[(&str, &str)], sparse: bool) -> PreparedImage {
        let filter = (!sparse).then(|| Filter::parse("").unwrap());
        PreparedImage::new(Arc::new(image_of(name, tree(files), filter)))
    }

    fn image_of(name: &str, fs: FileSystem, filter: Option<Filter>) -> Image {
        Image::new(name, fs, filter)
    }

    fn id(content: &str) -> ObjectId {
        ObjectId::of(content.as_bytes())
    }

    #[test]
    fn an_equal_sub_plans_empty_and_a_drifted_one_fetches_only_what_it_lacks() {
        let img = image("m", &[("/a", "alpha"), ("/b", "beta")], false);
        let same = compute(&img.image.fs, &BTreeSet::new(), &img, None, None);
        assert!(same.summary.empty, "{:?}", same.request);
        assert!(same.fetch.is_empty());

        // /b drifted to other bytes; /a is right; "beta" is nowhere on the sub.
        let sub = tree(&[("/a", "alpha"), ("/b", "drift"), ("/extra", "x")]);
        let c = compute(&sub, &BTreeSet::new(), &img, None, Some(1 << 20));
        assert!(!c.summary.empty);
        assert_eq!(c.fetch, vec![id("beta")]);
        assert_eq!(
            (c.summary.objects_to_fetch, c.summary.fetch_bytes),
            (1, 4096)
        );
        assert_eq!(c.summary.deletions, 1, "{:?}", c.request.paths_to_delete);
        assert_eq!((c.summary.image_inodes, c.summary.sub_inodes), (3, 4));
        assert_eq!(c.summary.free_bytes, Some(1 << 20));
        // Already in the cache: nothing to fetch.
        let cache = BTreeSet::from([id("beta")]);
        assert!(compute(&sub, &cache, &img, None, None).fetch.is_empty());
    }

    #[test]
    fn the_planned_image_is_preloaded_and_the_cache_cleaned_of_what_neither_needs() {
        let required = image("m", &[("/a", "alpha")], false);
        let planned = image("next", &[("/a", "alpha"), ("/n", "new")], false);
        let cache = BTreeSet::from([id("stale"), id("new")]);
        let c = compute(&required.image.fs, &cache, &required, Some(&planned), None);
        assert!(c.summary.empty);
        assert_eq!(c.unused, vec![id("stale")]);
        assert!(c.preload.is_empty(), "already cached");
        let c = compute(
            &required.image.fs,
            &BTreeSet::new(),
            &required,
            Some(&planned),
            None,
        );
        assert_eq!(c.preload, vec![id("new")]);
        assert_eq!(c.summary.planned_objects_to_fetch, 1);
    }

    #[test]
    fn a_sparse_image_keeps_extras_and_says_so() {
        let img = image("s", &[("/a", "alpha")], true);
        let sub = tree(&[("/a", "alpha"), ("/mine", "keep")]);
        let c = compute(&sub, &BTreeSet::new(), &img, None, None);
        assert!(c.summary.sparse);
        assert!(c.summary.empty, "{:?}", c.request);
        assert_eq!(c.summary.deletions, 0);
    }

    fn dir() -> Inode {
        Inode::Directory {
            mode: 0o755,
            uid: 0,
            gid: 0,
        }
    }

    /// A machine-like tree, its inodes numbered by the order of `files` (so two orders give
    /// the same tree with other inode numbers).
    fn machine(reverse: bool) -> FileSystem {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        for d in ["/etc", "/usr", "/usr/bin", "/var", "/var/log"] {
            fs.insert(d, dir()).unwrap();
        }
        let mut files = vec![
            ("/etc/motd", "hello"),
            ("/etc/passwd", "root"),
            ("/usr/bin/a", "tool"),
            ("/usr/bin/b", "other"),
            ("/var/log/syslog", "log"),
        ];
        if reverse {
            files.reverse();
        }
        for (p, c) in files {
            fs.insert(p, file(c)).unwrap();
        }
        fs.link("/usr/bin/a2", "/usr/bin/a").unwrap();
        fs.insert(
            "/usr/bin/sh",
            Inode::Symlink {
                uid: 0,
                gid: 0,
                target: "a".into(),
            },
        )
        .unwrap();
        fs
    }

    /// What the planner alone answers (two runs: plan and missing_objects).
    fn slow(
        sub: &FileSystem,
        cache: &BTreeSet<ObjectId>,
        image: &Image,
    ) -> (UpdateRequest, Vec<ObjectId>) {
        (
            plan(sub, cache, image),
            paddock_image::plan::missing_objects(sub, cache, image)
                .into_iter()
                .collect(),
        )
    }

    #[test]
    fn the_walk_proves_only_empty_plans_and_compute_agrees_with_the_planner() {
        let base = machine(false);
        // (what, proved against the filtered image, proved against the sparse one, edit)
        type Edit = Box<dyn Fn(&mut FileSystem)>;
        let edits: Vec<(&str, bool, bool, Edit)> = vec![
            ("identical", true, true, Box::new(|_| {})),
            (
                "other inode numbers",
                true,
                true,
                Box::new(|fs| *fs = machine(true)),
            ),
            (
                "inode numbers far apart (no vector index)",
                true,
                true,
                Box::new(|fs| {
                    let far = |n: u64| n * 1_000_003;
                    fs.inodes = std::mem::take(&mut fs.inodes)
                        .into_iter()
                        .map(|(n, i)| (far(n), i))
                        .collect();
                    fs.paths.values_mut().for_each(|n| *n = far(*n));
                }),
            ),
            (
                "a new log file (filtered)",
                true,
                true,
                Box::new(|fs| {
                    fs.insert("/var/log/new", file("x")).unwrap();
                }),
            ),
            (
                "a changed log file (filtered)",
                true,
                false,
                Box::new(|fs| {
                    let ino = fs.paths["/var/log/syslog"];
                    fs.inodes.insert(ino, file("rotated"));
                }),
            ),
            (
                "subd's own directory",
                true,
                true,
                Box::new(|fs| {
                    fs.insert("/.subd", dir()).unwrap();
                    fs.insert("/.subd/state", file("s")).unwrap();
                }),
            ),
            (
                "a mode changed",
                false,
                false,
                Box::new(|fs| {
                    let ino = fs.paths["/etc/motd"];
                    if let Some(Inode::Regular { mode, .. }) = fs.inodes.get_mut(&ino) {
                        *mode = 0o600;
                    }
                }),
            ),
            (
                "the root's mode changed",
                false,
                false,
                Box::new(|fs| {
                    fs.inodes.insert(
                        1,
                        Inode::Directory {
                            mode: 0o700,
                            uid: 0,
                            gid: 0,
                        },
                    );
                }),
            ),
            (
                "an extra file",
                false,
                true,
                Box::new(|fs| {
                    fs.insert("/etc/extra", file("x")).unwrap();
                }),
            ),
            (
                "a file gone",
                false,
                false,
                Box::new(|fs| {
                    fs.paths.remove("/etc/passwd");
                    fs.inodes.retain(|_, i| i.object() != Some(id("root")));
                }),
            ),
            (
                "a hard link split",
                false,
                false,
                Box::new(|fs| {
                    fs.paths.remove("/usr/bin/a2");
                    fs.insert("/usr/bin/a2", file("tool")).unwrap();
                }),
            ),
            (
                "an extra hard link to a file the image has apart",
                false,
                false,
                Box::new(|fs| {
                    fs.paths.remove("/etc/passwd");
                    fs.link("/etc/passwd", "/usr/bin/b").unwrap();
                    let ino = fs.paths["/usr/bin/b"];
                    fs.inodes.insert(ino, file("root"));
                }),
            ),
            (
                "a directory where the image has a file",
                false,
                false,
                Box::new(|fs| {
                    fs.paths.remove("/etc/motd");
                    fs.insert("/etc/motd", dir()).unwrap();
                }),
            ),
        ];
        for (filter, sparse) in [(Some("/var/log/"), false), (None, true)] {
            let img = PreparedImage::new(Arc::new(image_of(
                "m",
                base.clone(),
                filter.map(|f| Filter::parse(f).unwrap()),
            )));
            for (what, filtered, in_sparse, edit) in &edits {
                let mut sub = base.clone();
                edit(&mut sub);
                let cache = BTreeSet::from([id("stale")]);
                let mut memo = HashMap::new();
                for p in sub.paths.keys().chain(img.image.fs.paths.keys()) {
                    let f = img.image.filter.as_ref();
                    assert_eq!(protected(&mut memo, p, f), untouchable(p, f), "{p}");
                }
                let proved = provably_unchanged(&sub, &img.image);
                let (request, missing) = slow(&sub, &cache, &img.image);
                assert!(!proved || request.is_empty(), "{what}: {request:?}");
                let expected = if sparse { in_sparse } else { filtered };
                assert_eq!(proved, *expected, "{what} (sparse {sparse})");
                let c = compute(&sub, &cache, &img, None, None);
                assert_eq!(c.fetch, missing, "{what}");
                assert_eq!(to_fetch(&request, &cache), missing, "{what}");
                assert_eq!(c.summary.empty, request.is_empty(), "{what}");
                assert_eq!(c.summary.deletions, count(request.paths_to_delete.len()));
                if !proved {
                    assert_eq!(c.request, request, "{what}");
                }
            }
        }
    }
}
