//! The update planner, rule by rule, plus random trees applied with a model of subd.
//!
//! Every table case is also applied to the sub's tree by [`apply`] (a pure model of subd's
//! update, in the request's order); for full images the result must be the image's tree.

use std::collections::{BTreeMap, BTreeSet};

use paddock_image::plan::{UpdateRequest, missing_objects, plan, untouchable};
use paddock_image::tree::parent;
use paddock_image::{FileSystem, Filter, Image, Inode, Mtime, ObjectId, SpecialKind, Triggers};

// ---- trees -------------------------------------------------------------------------------

const CONTENTS: [&str; 5] = ["x", "y", "z", "w", "big"];

fn obj(content: &str) -> ObjectId {
    ObjectId::of(content.as_bytes())
}

fn label(o: &ObjectId) -> String {
    CONTENTS
        .iter()
        .find(|c| obj(c) == *o)
        .map_or_else(|| o.short(), |c| (*c).to_string())
}

fn reg(content: &str, mode: u32, uid: u32, mtime: i64) -> Inode {
    Inode::Regular {
        mode,
        uid,
        gid: 0,
        mtime: Mtime {
            sec: mtime,
            nsec: 0,
        },
        size: content.len() as u64,
        object: (!content.is_empty()).then(|| obj(content)),
    }
}

fn file(content: &str) -> Inode {
    reg(content, 0o644, 0, 1)
}

fn dir() -> Inode {
    dir_mode(0o755)
}

fn dir_mode(mode: u32) -> Inode {
    Inode::Directory {
        mode,
        uid: 0,
        gid: 0,
    }
}

fn symlink(target: &str) -> Inode {
    Inode::Symlink {
        uid: 0,
        gid: 0,
        target: target.into(),
    }
}

fn fifo() -> Inode {
    Inode::Special {
        special: SpecialKind::Fifo,
        mode: 0o600,
        uid: 0,
        gid: 0,
        mtime: Mtime { sec: 1, nsec: 0 },
        rdev: 0,
    }
}

/// A tree: the root (0755) and these entries, parents first.
fn tree(entries: &[(&str, Inode)]) -> FileSystem {
    let mut fs = FileSystem::with_root(0o755, 0, 0);
    for (p, i) in entries {
        fs.insert(p, i.clone()).unwrap();
    }
    fs.validate().unwrap();
    fs
}

/// Adds hard links `(new, existing)`.
fn links(mut fs: FileSystem, l: &[(&str, &str)]) -> FileSystem {
    for (new, existing) in l {
        fs.link(new, existing).unwrap();
    }
    fs.validate().unwrap();
    fs
}

fn image_with(fs: FileSystem, filter: Option<Filter>) -> Image {
    Image::new("test.0", fs, filter)
}

/// A full image with an empty filter: the sub must end up exactly this tree.
fn full(fs: FileSystem) -> Image {
    image_with(fs, Some(Filter::empty()))
}

fn sparse(fs: FileSystem) -> Image {
    image_with(fs, None)
}

fn filtered(fs: FileSystem, lines: &str) -> Image {
    image_with(fs, Some(Filter::parse(lines).unwrap()))
}

fn cache(contents: &[&str]) -> BTreeSet<ObjectId> {
    contents.iter().map(|c| obj(c)).collect()
}

// ---- a model of subd's update --------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Cached {
    /// A file of its own (fetched or copied).
    Fresh,
    /// Hard-linked from this inode of the sub (`CopyToCache { hardlink: true }`).
    Shared(u64),
}

fn remove_tree(fs: &mut FileSystem, p: &str) {
    let below = format!("{p}/");
    fs.paths.retain(|q, _| q != p && !q.starts_with(&below));
}

fn parent_is_dir(fs: &FileSystem, p: &str) -> Result<(), String> {
    match parent(p).and_then(|q| fs.get(q)) {
        Some(i) if i.is_dir() => Ok(()),
        _ => Err(format!("{p}: parent is not a directory")),
    }
}

/// Applies `req` to `sub` as subd does, with `cache ∪ fetched` in the object cache. Inodes
/// keep their identity (a cache file hard-linked from the sub is the same inode), so a
/// wrong `hardlink` or link shows up as a wrong hard-link grouping in the result.
fn apply(
    sub: &FileSystem,
    cache: &BTreeSet<ObjectId>,
    fetched: &BTreeSet<ObjectId>,
    req: &UpdateRequest,
) -> Result<FileSystem, String> {
    let mut fs = sub.clone();
    let mut next = fs.inodes.keys().next_back().copied().unwrap_or(0) + 1;
    let mut objects: BTreeMap<ObjectId, Vec<Cached>> = cache
        .iter()
        .chain(fetched)
        .map(|o| (*o, vec![Cached::Fresh]))
        .collect();
    let mut introduced = BTreeSet::new();
    // 1. Copy to cache.
    for c in &req.files_to_copy_to_cache {
        let ino = *fs
            .paths
            .get(&c.path)
            .ok_or_else(|| format!("copy: no {}", c.path))?;
        if fs.inodes[&ino].object() != Some(c.object) {
            return Err(format!(
                "copy: {} does not hold {}",
                c.path,
                label(&c.object)
            ));
        }
        let item = if c.hardlink {
            Cached::Shared(ino)
        } else {
            Cached::Fresh
        };
        if objects.insert(c.object, vec![item]).is_some() {
            return Err(format!("copy: {} already cached", label(&c.object)));
        }
        introduced.insert(c.object);
    }
    // 2. Multiply.
    for (o, n) in &req.multiply_used_objects {
        let v = objects
            .get_mut(o)
            .ok_or_else(|| format!("multiply: {} not cached", label(o)))?;
        if v.len() != 1 || *n < 2 {
            return Err(format!(
                "multiply: {} x{n} with {} copies",
                label(o),
                v.len()
            ));
        }
        v.extend((1..*n).map(|_| Cached::Fresh));
        introduced.insert(*o);
    }
    // 3. Directories.
    for (p, inode) in &req.directories_to_make {
        if !inode.is_dir() || p == "/" {
            return Err(format!("mkdir {p}: not a directory or the root"));
        }
        parent_is_dir(&fs, p)?;
        if fs.get(p).is_some_and(Inode::is_dir) {
            return Err(format!("mkdir {p}: already a directory"));
        }
        remove_tree(&mut fs, p);
        fs.inodes.insert(next, inode.clone());
        fs.paths.insert(p.clone(), next);
        next += 1;
    }
    // 4. Inodes.
    for (p, inode) in &req.inodes_to_make {
        if inode.is_dir() || p == "/" {
            return Err(format!("make {p}: a directory or the root"));
        }
        parent_is_dir(&fs, p)?;
        let ino = match inode.object() {
            Some(o) => match objects.get_mut(&o).and_then(Vec::pop) {
                None => return Err(format!("make {p}: {} not in the cache", label(&o))),
                Some(Cached::Fresh) => None,
                Some(Cached::Shared(s)) => {
                    if fs.paths.get(p) == Some(&s) {
                        return Err(format!("make {p}: renames an inode onto itself"));
                    }
                    if !fs.inodes[&s].same_content(inode) {
                        return Err(format!("make {p}: shared cache inode has other content"));
                    }
                    Some(s)
                }
            },
            None => None,
        };
        let ino = ino.unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        remove_tree(&mut fs, p);
        fs.inodes.insert(ino, inode.clone());
        fs.paths.insert(p.clone(), ino);
    }
    // 5. Hard links.
    for (new, target) in &req.hardlinks_to_make {
        let t = *fs
            .paths
            .get(target)
            .ok_or_else(|| format!("link {new}: no target {target}"))?;
        if fs.inodes[&t].is_dir() {
            return Err(format!("link {new}: target {target} is a directory"));
        }
        if fs.paths.get(new) == Some(&t) {
            return Err(format!("link {new}: already a name of {target}"));
        }
        parent_is_dir(&fs, new)?;
        remove_tree(&mut fs, new);
        if !fs.paths.contains_key(target) {
            return Err(format!("link {new}: replacing it removed {target}"));
        }
        fs.paths.insert(new.clone(), t);
    }
    // 6. Deletes.
    for p in &req.paths_to_delete {
        if p == "/" || !fs.paths.contains_key(p) {
            return Err(format!("delete {p}: the root or absent"));
        }
        remove_tree(&mut fs, p);
    }
    // 7. Metadata.
    for (p, inode) in &req.inodes_to_change {
        let ino = *fs
            .paths
            .get(p)
            .ok_or_else(|| format!("change {p}: absent"))?;
        if !fs.inodes[&ino].same_content(inode) {
            return Err(format!("change {p}: other kind or content"));
        }
        fs.inodes.insert(ino, inode.clone());
    }
    for o in introduced {
        if !objects[&o].is_empty() {
            return Err(format!(
                "{} copies of {} unused",
                objects[&o].len(),
                label(&o)
            ));
        }
    }
    let named: BTreeSet<u64> = fs.paths.values().copied().collect();
    fs.inodes.retain(|i, _| named.contains(i));
    fs.validate()
        .map_err(|e| format!("result is not a valid tree: {e}"))?;
    Ok(fs)
}

/// Equal up to inode numbering: the same paths, inodes and hard-link groups.
fn same_tree(got: &FileSystem, want: &FileSystem) -> Result<(), String> {
    let (gn, wn) = (got.names(), want.names());
    let all: BTreeSet<&String> = got.paths.keys().chain(want.paths.keys()).collect();
    for p in all {
        let (g, w) = (got.get(p), want.get(p));
        if g != w {
            return Err(format!("{p}: got {g:?}, want {w:?}"));
        }
        let (g, w) = (&gn[&got.paths[p]], &wn[&want.paths[p]]);
        if g != w {
            return Err(format!("{p}: linked with {g:?}, want {w:?}"));
        }
    }
    Ok(())
}

// ---- table cases ---------------------------------------------------------------------------

/// The request as readable lines, in execution order.
fn summary(r: &UpdateRequest) -> Vec<String> {
    let mut out = Vec::new();
    for c in &r.files_to_copy_to_cache {
        let h = if c.hardlink { " hardlink" } else { "" };
        out.push(format!("copy {} {}{h}", c.path, label(&c.object)));
    }
    for (o, n) in &r.multiply_used_objects {
        out.push(format!("multiply {} {n}", label(o)));
    }
    out.extend(
        r.directories_to_make
            .iter()
            .map(|(p, _)| format!("mkdir {p}")),
    );
    out.extend(r.inodes_to_make.iter().map(|(p, _)| format!("make {p}")));
    out.extend(
        r.hardlinks_to_make
            .iter()
            .map(|(n, t)| format!("link {n} {t}")),
    );
    out.extend(r.paths_to_delete.iter().map(|p| format!("delete {p}")));
    for (p, _) in &r.inodes_to_change {
        let m = if r.mtime_only_changes.contains(p) {
            " mtime-only"
        } else {
            ""
        };
        out.push(format!("change {p}{m}"));
    }
    out
}

struct Case {
    name: &'static str,
    sub: FileSystem,
    cache: &'static [&'static str],
    image: Image,
    /// [`summary`] of the request.
    want: &'static [&'static str],
    /// Labels of [`missing_objects`].
    fetch: &'static [&'static str],
}

fn case(
    name: &'static str,
    sub: FileSystem,
    cache: &'static [&'static str],
    image: Image,
    want: &'static [&'static str],
    fetch: &'static [&'static str],
) -> Case {
    Case {
        name,
        sub,
        cache,
        image,
        want,
        fetch,
    }
}

/// Plans, checks the summary and the fetch list, applies; for a full image with an empty
/// filter the result must be the image's tree. Returns the request and the result.
fn check(c: &Case) -> (UpdateRequest, FileSystem) {
    let name = c.name;
    let cache = cache(c.cache);
    let req = plan(&c.sub, &cache, &c.image);
    assert_eq!(summary(&req), c.want, "case {name:?}");
    let missing = missing_objects(&c.sub, &cache, &c.image);
    let mut labels: Vec<String> = missing.iter().map(label).collect();
    labels.sort();
    assert_eq!(labels, c.fetch, "case {name:?}: missing objects");
    assert_eq!(req.image_name, c.image.name);
    assert_eq!(req.sparse, c.image.filter.is_none(), "case {name:?}");
    let out = apply(&c.sub, &cache, &missing, &req)
        .unwrap_or_else(|e| panic!("case {name:?}: {e}\n{req:#?}"));
    let subd = |fs: &FileSystem| fs.paths.keys().any(|p| untouchable(p, None));
    if c.image.filter.as_ref() == Some(&Filter::empty()) && !subd(&c.sub) && !subd(&c.image.fs) {
        same_tree(&out, &c.image.fs).unwrap_or_else(|e| panic!("case {name:?}: {e}"));
    }
    let again = apply(
        &out,
        &BTreeSet::new(),
        &BTreeSet::new(),
        &plan(&out, &cache, &c.image),
    );
    assert!(again.is_ok(), "case {name:?}: replanning fails");
    assert!(
        plan(&out, &cache, &c.image).is_empty(),
        "case {name:?}: a second update is not empty: {:?}",
        summary(&plan(&out, &cache, &c.image))
    );
    (req, out)
}

fn run(cases: &[Case]) {
    for c in cases {
        check(c);
    }
}

#[test]
fn identical_trees_give_an_empty_request() {
    let t = || {
        links(
            tree(&[
                ("/etc", dir()),
                ("/etc/a", file("x")),
                ("/etc/e", file("")),
                ("/l", symlink("/etc/a")),
                ("/p", fifo()),
            ]),
            &[("/etc/b", "/etc/a")],
        )
    };
    run(&[
        case("full", t(), &[], full(t()), &[], &[]),
        case("sparse", t(), &[], sparse(t()), &[], &[]),
        case("filtered", t(), &[], filtered(t(), "/etc/b$"), &[], &[]),
        case("only a root", tree(&[]), &[], full(tree(&[])), &[], &[]),
    ]);
    let r = plan(&t(), &BTreeSet::new(), &full(t()));
    assert!(r.is_empty() && r.changed_paths().is_empty());
}

#[test]
fn new_file_whose_object_is_in_the_cache_is_made_from_the_cache() {
    run(&[
        case(
            "new file",
            tree(&[]),
            &["x"],
            full(tree(&[("/a", file("x"))])),
            &["make /a"],
            &[],
        ),
        case(
            "changed content",
            tree(&[("/a", file("y"))]),
            &["x"],
            full(tree(&[("/a", file("x"))])),
            &["make /a"],
            &[],
        ),
        case(
            "cache preferred over a file on the sub",
            tree(&[("/a", file("x"))]),
            &["x"],
            full(tree(&[("/a", file("x")), ("/b", file("x"))])),
            &["make /b"],
            &[],
        ),
    ]);
}

#[test]
fn content_already_in_a_sub_file_is_copied_to_the_cache_not_fetched() {
    run(&[
        case(
            "duplicated: the source stays, so it is copied",
            tree(&[("/a", file("x"))]),
            &[],
            full(tree(&[("/a", file("x")), ("/b", file("x"))])),
            &["copy /a x", "make /b"],
            &[],
        ),
        case(
            "moved: the source goes away, so it is hard-linked",
            tree(&[("/a", file("x"))]),
            &[],
            full(tree(&[("/b", file("x"))])),
            &["copy /a x hardlink", "make /b", "delete /a"],
            &[],
        ),
        case(
            "replaced: the source path gets other content",
            tree(&[("/a", file("x"))]),
            &["y"],
            full(tree(&[("/a", file("y")), ("/b", file("x"))])),
            &["copy /a x hardlink", "make /a", "make /b"],
            &[],
        ),
        case(
            "swapped contents",
            tree(&[("/a", file("x")), ("/b", file("y"))]),
            &[],
            full(tree(&[("/a", file("y")), ("/b", file("x"))])),
            &[
                "copy /a x hardlink",
                "copy /b y hardlink",
                "make /a",
                "make /b",
            ],
            &[],
        ),
        case(
            "one source per object, a disappearing one preferred",
            tree(&[("/a", file("x")), ("/b", file("x"))]),
            &[],
            full(tree(&[("/a", file("x")), ("/c", file("x"))])),
            &["copy /b x hardlink", "make /c", "delete /b"],
            &[],
        ),
        case(
            "a source with a name that stays is copied",
            links(tree(&[("/a", file("x"))]), &[("/k", "/a")]),
            &[],
            full(tree(&[("/b", file("x")), ("/k", file("x"))])),
            &["copy /a x", "make /b", "delete /a"],
            &[],
        ),
        case(
            "a metadata change elsewhere does not stop a copy",
            tree(&[("/a", file("x"))]),
            &[],
            full(tree(&[("/a", reg("x", 0o600, 0, 1)), ("/b", file("x"))])),
            &["copy /a x", "make /b", "change /a"],
            &[],
        ),
    ]);
}

#[test]
fn changed_content_not_on_the_sub_must_be_fetched() {
    let sub = || tree(&[("/a", file("x"))]);
    run(&[
        case(
            "changed",
            sub(),
            &[],
            full(tree(&[("/a", file("y"))])),
            &["make /a"],
            &["y"],
        ),
        case(
            "changed and metadata too",
            sub(),
            &[],
            full(tree(&[("/a", reg("y", 0o600, 3, 9))])),
            &["make /a"],
            &["y"],
        ),
        case(
            "in the cache: nothing to fetch",
            sub(),
            &["y"],
            full(tree(&[("/a", file("y"))])),
            &["make /a"],
            &[],
        ),
        case(
            "several new objects",
            sub(),
            &["z"],
            full(tree(&[
                ("/a", file("y")),
                ("/b", file("w")),
                ("/c", file("z")),
            ])),
            &["make /a", "make /b", "make /c"],
            &["w", "y"],
        ),
    ]);
}

#[test]
fn metadata_only_change_is_made_in_place_without_its_object() {
    let sub = || tree(&[("/a", file("x")), ("/l", symlink("t")), ("/p", fifo())]);
    let img = |a: Inode| full(tree(&[("/a", a), ("/l", symlink("t")), ("/p", fifo())]));
    run(&[
        case(
            "mode",
            sub(),
            &[],
            img(reg("x", 0o600, 0, 1)),
            &["change /a"],
            &[],
        ),
        case(
            "uid",
            sub(),
            &[],
            img(reg("x", 0o644, 7, 1)),
            &["change /a"],
            &[],
        ),
        case(
            "mtime",
            sub(),
            &[],
            img(reg("x", 0o644, 0, 5)),
            &["change /a mtime-only"],
            &[],
        ),
        case(
            "all of them",
            sub(),
            &[],
            img(reg("x", 0o755, 2, 5)),
            &["change /a"],
            &[],
        ),
        case(
            "symlink owner",
            sub(),
            &[],
            full(tree(&[
                ("/a", file("x")),
                (
                    "/l",
                    Inode::Symlink {
                        uid: 5,
                        gid: 5,
                        target: "t".into(),
                    },
                ),
                ("/p", fifo()),
            ])),
            &["change /l"],
            &[],
        ),
        case(
            "directory mode",
            tree(&[("/d", dir())]),
            &[],
            full(tree(&[("/d", dir_mode(0o700))])),
            &["change /d"],
            &[],
        ),
        case(
            "every name of a hard-linked inode",
            links(tree(&[("/a", file("x"))]), &[("/b", "/a")]),
            &[],
            full(links(
                tree(&[("/a", reg("x", 0o600, 0, 1))]),
                &[("/b", "/a")],
            )),
            &["change /a", "change /b"],
            &[],
        ),
    ]);
}

#[test]
fn mtime_only_change_is_not_a_changed_path() {
    let sub = tree(&[("/a", file("x")), ("/b", file("y")), ("/p", fifo())]);
    let mut p2 = fifo();
    if let Inode::Special { mtime, .. } = &mut p2 {
        mtime.sec = 7;
    }
    let img = full(tree(&[
        ("/a", reg("x", 0o644, 0, 2)),
        ("/b", reg("y", 0o600, 0, 2)),
        ("/p", p2),
    ]));
    let (req, _) = check(&case(
        "mtime only",
        sub,
        &[],
        img,
        &["change /a mtime-only", "change /b", "change /p mtime-only"],
        &[],
    ));
    assert_eq!(req.changed_paths(), vec!["/b"]);
    assert!(!req.is_empty());
}

#[test]
fn extra_path_is_deleted() {
    run(&[
        case(
            "file",
            tree(&[("/a", file("x")), ("/b", file("y"))]),
            &[],
            full(tree(&[("/a", file("x"))])),
            &["delete /b"],
            &[],
        ),
        case(
            "symlink, fifo and empty file",
            tree(&[("/l", symlink("t")), ("/p", fifo()), ("/e", file(""))]),
            &[],
            full(tree(&[])),
            &["delete /e", "delete /l", "delete /p"],
            &[],
        ),
        case(
            "one name of a hard-linked inode",
            links(tree(&[("/a", file("x"))]), &[("/b", "/a")]),
            &[],
            full(tree(&[("/a", file("x"))])),
            &["delete /b"],
            &[],
        ),
    ]);
}

#[test]
fn sparse_image_keeps_extra_paths() {
    let sub = || {
        tree(&[
            ("/a", file("x")),
            ("/extra", file("y")),
            ("/d", dir()),
            ("/d/extra", file("z")),
            ("/gone", dir()),
            ("/gone/f", file("w")),
        ])
    };
    let (req, out) = check(&case(
        "sparse",
        sub(),
        &[],
        sparse(tree(&[
            ("/a", file("y")),
            ("/d", dir()),
            ("/d/new", file("x")),
        ])),
        &[
            "copy /a x hardlink",
            "copy /extra y",
            "make /a",
            "make /d/new",
        ],
        &[],
    ));
    assert!(req.sparse && req.paths_to_delete.is_empty());
    for p in ["/extra", "/d/extra", "/gone", "/gone/f"] {
        assert_eq!(out.get(p), sub().get(p), "{p} kept");
    }
    assert_eq!(out.get("/a"), Some(&file("y")));
    assert_eq!(out.get("/d/new"), Some(&file("x")));
    // The same image with a filter deletes them.
    check(&case(
        "not sparse",
        sub(),
        &[],
        full(tree(&[
            ("/a", file("y")),
            ("/d", dir()),
            ("/d/new", file("x")),
        ])),
        &[
            "copy /a x hardlink",
            "copy /extra y hardlink",
            "make /a",
            "make /d/new",
            "delete /d/extra",
            "delete /extra",
            "delete /gone",
        ],
        &[],
    ));
}

#[test]
fn filtered_path_is_never_touched() {
    let filter = "/var/log/.*\n/etc/local$\n/opt$\n";
    let sub = || {
        tree(&[
            ("/etc", dir()),
            ("/etc/local", file("x")),
            ("/opt", dir()),
            ("/opt/app", file("y")),
            ("/var", dir()),
            ("/var/log", dir()),
            ("/var/log/syslog", file("z")),
            ("/var/log/old", dir()),
            ("/var/log/old/1", file("w")),
        ])
    };
    let untouched = |out: &FileSystem, paths: &[&str]| {
        for p in paths {
            assert_eq!(out.get(p), sub().get(p), "{p} untouched");
        }
    };
    let all = [
        "/etc/local",
        "/opt",
        "/opt/app",
        "/var/log/syslog",
        "/var/log/old",
        "/var/log/old/1",
    ];
    // Present on the sub, absent from the image: not deleted.
    let (req, out) = check(&case(
        "absent from the image",
        sub(),
        &[],
        filtered(
            tree(&[("/etc", dir()), ("/var", dir()), ("/var/log", dir())]),
            filter,
        ),
        &[],
        &[],
    ));
    assert!(req.is_empty());
    untouched(&out, &all);
    // Different in the image (the image somehow holds them): not changed.
    let (_, out) = check(&case(
        "different in the image",
        sub(),
        &[],
        filtered(
            tree(&[
                ("/etc", dir_mode(0o700)),
                ("/etc/local", file("y")),
                ("/opt", dir_mode(0o700)),
                ("/opt/app", reg("y", 0o600, 0, 1)),
                ("/opt/new", file("w")),
                ("/var", dir()),
                ("/var/log", dir()),
                ("/var/log/syslog", symlink("x")),
                ("/var/log/old", file("")),
            ]),
            filter,
        ),
        &["change /etc"],
        &[],
    ));
    untouched(&out, &all);
    assert_eq!(out.get("/opt/new"), None, "below a filtered directory");
    // Absent from the sub, present in the image: not created.
    let (_, out) = check(&case(
        "absent from the sub",
        tree(&[]),
        &[],
        filtered(
            tree(&[
                ("/etc", dir()),
                ("/etc/local", file("x")),
                ("/etc/localtime", file("y")),
                ("/opt", dir()),
                ("/opt/app", file("y")),
            ]),
            filter,
        ),
        &["mkdir /etc", "make /etc/localtime"],
        &["y"],
    ));
    assert_eq!(out.get("/etc/local"), None);
    assert_eq!(out.get("/opt"), None);
    // A directory holding a filtered path is not removed, only its other contents.
    let (_, out) = check(&case(
        "directory holding a filtered path",
        {
            let mut s = sub();
            s.insert("/var/x", file("y")).unwrap();
            s.insert("/var/log/x", file("y")).unwrap();
            s
        },
        &[],
        filtered(tree(&[("/etc", dir())]), filter),
        &["delete /var/x"],
        &[],
    ));
    assert!(out.get("/var/log").is_some_and(Inode::is_dir));
    untouched(&out, &["/var/log/syslog", "/opt/app", "/etc/local"]);
    // The image wants a file where the sub's directory holds a filtered path: left alone.
    let (_, out) = check(&case(
        "kind change blocked by a filtered path",
        sub(),
        &[],
        filtered(
            links(
                tree(&[("/etc", dir()), ("/var", dir()), ("/var/log", file("x"))]),
                &[("/var/log2", "/var/log")],
            ),
            filter,
        ),
        &["make /var/log2"],
        &["x"],
    ));
    untouched(&out, &["/var/log", "/var/log/syslog"]);
    // A filtered file sharing an inode with an image path: its metadata is not changed.
    let sub2 = || {
        links(
            tree(&[("/etc", dir()), ("/etc/a", file("x"))]),
            &[("/etc/local", "/etc/a")],
        )
    };
    let (_, out) = check(&case(
        "hard-linked to a filtered path",
        sub2(),
        &[],
        filtered(
            tree(&[("/etc", dir()), ("/etc/a", reg("x", 0o600, 0, 1))]),
            filter,
        ),
        &["copy /etc/a x", "make /etc/a"],
        &[],
    ));
    assert_eq!(out.get("/etc/local"), Some(&file("x")));
    assert_eq!(out.get("/etc/a"), Some(&reg("x", 0o600, 0, 1)));
    // ... and an identical one is left alone, link and all.
    let (req, _) = check(&case(
        "identical and hard-linked to a filtered path",
        sub2(),
        &[],
        filtered(tree(&[("/etc", dir()), ("/etc/a", file("x"))]), filter),
        &[],
        &[],
    ));
    assert!(req.is_empty());
    // A filtered file is never the source of a copy.
    check(&case(
        "not a copy source",
        sub(),
        &[],
        filtered(tree(&[("/etc", dir()), ("/etc/b", file("x"))]), filter),
        &["make /etc/b"],
        &["x"],
    ));
    for (p, yes) in [
        ("/var/log/x/y", true),
        ("/var/log", false),
        ("/opt/a", true),
        ("/optx", false),
        ("/", false),
        ("/.subd", true),
        ("/.subd/objects", true),
        ("/.subdx", false),
    ] {
        assert_eq!(
            untouchable(p, Filter::parse(filter).ok().as_ref()),
            yes,
            "{p}"
        );
    }
    assert!(untouchable("/.subd/x", None) && !untouchable("/var/log/x", None));
}

#[test]
fn directory_is_deleted_once_with_its_contents() {
    let sub = || {
        tree(&[
            ("/a", file("x")),
            ("/d", dir()),
            ("/d/f", file("y")),
            ("/d/e", dir()),
            ("/d/e/g", file("z")),
            ("/d-x", file("w")),
        ])
    };
    let (req, _) = check(&case(
        "directory tree",
        sub(),
        &[],
        full(tree(&[("/a", file("x"))])),
        &["delete /d", "delete /d-x"],
        &[],
    ));
    assert_eq!(req.changed_paths(), vec!["/d", "/d-x"]);
    check(&case(
        "nested directory",
        sub(),
        &[],
        full(tree(&[
            ("/a", file("x")),
            ("/d", dir()),
            ("/d-x", file("w")),
        ])),
        &["delete /d/e", "delete /d/f"],
        &[],
    ));
}

#[test]
fn kind_change_replaces_the_path() {
    run(&[
        case(
            "file to directory",
            tree(&[("/a", file("x"))]),
            &[],
            full(tree(&[("/a", dir()), ("/a/b", file("x"))])),
            &["copy /a x hardlink", "mkdir /a", "make /a/b"],
            &[],
        ),
        case(
            "symlink to file",
            tree(&[("/a", symlink("t"))]),
            &["x"],
            full(tree(&[("/a", file("x"))])),
            &["make /a"],
            &[],
        ),
        case(
            "file to symlink",
            tree(&[("/a", file("x"))]),
            &[],
            full(tree(&[("/a", symlink("x"))])),
            &["make /a"],
            &[],
        ),
        case(
            "directory tree to file",
            tree(&[("/a", dir()), ("/a/b", file("x")), ("/a/c", dir())]),
            &[],
            full(tree(&[("/a", file("x"))])),
            &["copy /a/b x hardlink", "make /a"],
            &[],
        ),
        case(
            "directory to hard link",
            tree(&[("/a", file("x")), ("/b", dir()), ("/b/c", file("y"))]),
            &[],
            full(links(tree(&[("/a", file("x"))]), &[("/b", "/a")])),
            &["link /b /a"],
            &[],
        ),
        case(
            "file to fifo to empty file",
            tree(&[("/a", file("x")), ("/b", fifo())]),
            &[],
            full(tree(&[("/a", fifo()), ("/b", file(""))])),
            &["make /a", "make /b"],
            &[],
        ),
    ]);
}

#[test]
fn hard_links_are_made() {
    run(&[
        case(
            "new inode with two names",
            tree(&[]),
            &["x"],
            full(links(tree(&[("/a", file("x"))]), &[("/b", "/a")])),
            &["make /a", "link /b /a"],
            &[],
        ),
        case(
            "separate identical files become one inode",
            tree(&[("/a", file("x")), ("/b", file("x"))]),
            &[],
            full(links(tree(&[("/a", file("x"))]), &[("/b", "/a")])),
            &["link /b /a"],
            &[],
        ),
        case(
            "a new name for a kept inode",
            tree(&[("/d", dir()), ("/d/a", file("x"))]),
            &[],
            full(links(
                tree(&[("/d", dir()), ("/d/a", file("x")), ("/e", dir())]),
                &[("/e/b", "/d/a")],
            )),
            &["mkdir /e", "link /e/b /d/a"],
            &[],
        ),
        case(
            "re-pointed to another inode",
            links(
                tree(&[("/a", file("x")), ("/c", file("y"))]),
                &[("/b", "/a")],
            ),
            &[],
            full(links(
                tree(&[("/a", file("x")), ("/c", file("y"))]),
                &[("/b", "/c")],
            )),
            &["link /b /c"],
            &[],
        ),
        case(
            "the kept name is not the first",
            tree(&[("/b", file("x"))]),
            &[],
            full(links(tree(&[("/a", file("x"))]), &[("/b", "/a")])),
            &["link /a /b"],
            &[],
        ),
        case(
            "linked with a metadata change",
            tree(&[("/a", file("x")), ("/b", file("x"))]),
            &[],
            full(links(
                tree(&[("/a", reg("x", 0o600, 0, 1))]),
                &[("/b", "/a")],
            )),
            &["link /b /a", "change /a"],
            &[],
        ),
    ]);
}

#[test]
fn hard_link_is_split() {
    run(&[
        case(
            "two names become two identical files",
            links(tree(&[("/a", file("x"))]), &[("/b", "/a")]),
            &[],
            full(tree(&[("/a", file("x")), ("/b", file("x"))])),
            &["copy /a x", "make /b"],
            &[],
        ),
        case(
            "two names become different files",
            links(tree(&[("/a", file("x"))]), &[("/b", "/a")]),
            &[],
            full(tree(&[("/a", file("x")), ("/b", reg("x", 0o600, 0, 1))])),
            &["copy /a x", "make /b"],
            &[],
        ),
        case(
            "one name gets new content",
            links(tree(&[("/a", file("x"))]), &[("/b", "/a"), ("/c", "/a")]),
            &["y"],
            full(links(
                tree(&[("/a", file("x")), ("/c", file("y"))]),
                &[("/b", "/a")],
            )),
            &["make /c"],
            &[],
        ),
        case(
            "metadata change of a name that is split off",
            links(tree(&[("/a", file("x"))]), &[("/b", "/a")]),
            &[],
            full(tree(&[
                ("/a", reg("x", 0o600, 0, 1)),
                ("/b", reg("x", 0o640, 0, 1)),
            ])),
            &["copy /a x", "make /b", "change /a"],
            &[],
        ),
    ]);
}

#[test]
fn multiply_used_objects_are_copied_per_new_inode() {
    let (req, _) = check(&case(
        "three new inodes, one object",
        tree(&[]),
        &["x"],
        full(links(
            tree(&[
                ("/a", file("x")),
                ("/b", reg("x", 0o600, 0, 1)),
                ("/c", reg("x", 0o600, 1, 1)),
            ]),
            &[("/a2", "/a")],
        )),
        &[
            "multiply x 3",
            "make /a",
            "make /b",
            "make /c",
            "link /a2 /a",
        ],
        &[],
    ));
    assert_eq!(req.multiply_used_objects[&obj("x")], 3);
    run(&[
        case(
            "copied from the sub, then multiplied",
            tree(&[("/s", file("x"))]),
            &[],
            full(tree(&[
                ("/a", file("x")),
                ("/b", file("x")),
                ("/s", file("x")),
            ])),
            &["copy /s x", "multiply x 2", "make /a", "make /b"],
            &[],
        ),
        case(
            "fetched, then multiplied",
            tree(&[]),
            &[],
            full(tree(&[("/a", file("y")), ("/b", file("y"))])),
            &["multiply y 2", "make /a", "make /b"],
            &["y"],
        ),
        case(
            "a hard-linked source, then multiplied",
            tree(&[("/s", file("x"))]),
            &[],
            full(tree(&[("/a", file("x")), ("/b", file("x"))])),
            &[
                "copy /s x hardlink",
                "multiply x 2",
                "make /a",
                "make /b",
                "delete /s",
            ],
            &[],
        ),
        case(
            "zero-size files are not objects",
            tree(&[]),
            &[],
            full(tree(&[("/a", file("")), ("/b", file(""))])),
            &["make /a", "make /b"],
            &[],
        ),
    ]);
}

#[test]
fn zero_size_files_need_no_object() {
    run(&[
        case(
            "new empty file",
            tree(&[]),
            &[],
            full(tree(&[("/e", file(""))])),
            &["make /e"],
            &[],
        ),
        case(
            "emptied file",
            tree(&[("/e", file("x"))]),
            &[],
            full(tree(&[("/e", file(""))])),
            &["make /e"],
            &[],
        ),
        case(
            "empty file's mode",
            tree(&[("/e", file(""))]),
            &[],
            full(tree(&[("/e", reg("", 0o600, 0, 1))])),
            &["change /e"],
            &[],
        ),
    ]);
}

/// subd leaves filtered paths out of its scans: a directory that holds only its own
/// identity (`/etc/paddock/subd`, filtered) looks empty in the tree, and an image without it
/// must not delete it (with the identity inside: the machine's subd would not start again).
#[test]
fn a_directory_whose_filtered_contents_the_scan_left_out_is_not_deleted() {
    let sub = tree(&[
        ("/etc", dir()),
        ("/etc/paddock", dir()),
        ("/etc/stale", file("s")),
        ("/var", dir()),
        ("/var/junk", dir()),
    ]);
    let filter = Filter::parse("/etc/paddock/subd(|/.*)$\n").unwrap();
    let img = image_with(tree(&[("/etc", dir()), ("/var", dir())]), Some(filter));
    let req = plan(&sub, &BTreeSet::new(), &img);
    assert_eq!(
        req.paths_to_delete,
        ["/etc/stale", "/var/junk"],
        "{:?}",
        summary(&req)
    );
    // Once planned against the tree it leaves, nothing is left to do.
    let out = apply(&sub, &BTreeSet::new(), &BTreeSet::new(), &req).unwrap();
    assert!(plan(&out, &BTreeSet::new(), &img).is_empty());
}

#[test]
fn subd_directory_is_never_touched() {
    let sub = || {
        tree(&[
            ("/.subd", dir()),
            ("/.subd/objects", dir()),
            ("/.subd/objects/o", file("x")),
            ("/a", file("y")),
        ])
    };
    for img in [
        full(tree(&[])),
        full(tree(&[("/.subd", file("z")), ("/b", file("x"))])),
        full(tree(&[
            ("/.subd", dir_mode(0o700)),
            ("/.subd/new", file("z")),
        ])),
    ] {
        let req = plan(&sub(), &BTreeSet::new(), &img);
        assert!(
            req.changed_paths().iter().all(|p| !p.starts_with("/.subd")),
            "{:?}",
            summary(&req)
        );
        assert!(
            req.files_to_copy_to_cache
                .iter()
                .all(|c| !c.path.starts_with("/.subd"))
        );
        let missing = missing_objects(&sub(), &BTreeSet::new(), &img);
        let out = apply(&sub(), &BTreeSet::new(), &missing, &req).unwrap();
        for p in ["/.subd", "/.subd/objects", "/.subd/objects/o"] {
            assert_eq!(out.get(p), sub().get(p));
        }
    }
    let (_, out) = check(&case(
        "image names /.subd",
        sub(),
        &[],
        full(tree(&[("/.subd", file("z")), ("/b", file("x"))])),
        &["make /b", "delete /a"],
        &["x"],
    ));
    assert_eq!(out.get("/.subd/objects/o"), Some(&file("x")));
}

#[test]
fn parents_are_made_before_children() {
    let (req, _) = check(&case(
        "deep tree",
        tree(&[("/a", file("x"))]),
        &["y"],
        full(tree(&[
            ("/a", dir()),
            ("/a/b", dir()),
            ("/a/b/c", dir()),
            ("/a/b/c/f", file("y")),
            ("/a-b", dir()),
            ("/a/a", dir()),
            ("/z", dir()),
            ("/z/l", symlink("/a/b/c/f")),
        ])),
        &[
            "mkdir /a",
            "mkdir /a-b",
            "mkdir /a/a",
            "mkdir /a/b",
            "mkdir /a/b/c",
            "mkdir /z",
            "make /a/b/c/f",
            "make /z/l",
        ],
        &[],
    ));
    for (i, (p, _)) in req.directories_to_make.iter().enumerate() {
        let q = parent(p).unwrap();
        assert!(
            q == "/" || req.directories_to_make[..i].iter().any(|(d, _)| d == q),
            "{p} before its parent"
        );
    }
}

#[test]
fn root_metadata_changes_but_root_is_never_made_or_deleted() {
    let (req, _) = check(&case(
        "root mode",
        tree(&[("/a", file("x"))]),
        &[],
        full({
            let mut t = tree(&[("/a", file("x"))]);
            let root = t.paths["/"];
            t.inodes.insert(
                root,
                Inode::Directory {
                    mode: 0o700,
                    uid: 0,
                    gid: 0,
                },
            );
            t
        }),
        &["change /"],
        &[],
    ));
    assert_eq!(req.changed_paths(), vec!["/"]);
    let (req, _) = check(&case(
        "everything removed",
        tree(&[("/a", file("x")), ("/d", dir())]),
        &[],
        full(tree(&[])),
        &["delete /a", "delete /d"],
        &[],
    ));
    assert!(!req.paths_to_delete.iter().any(|p| p == "/"));
}

#[test]
fn changed_paths_feed_triggers() {
    let triggers = Triggers::parse(
        r#"[{"MatchLines": ["/etc/ssh/.*"], "Service": "ssh", "DoReload": true},
            {"MatchLines": ["/usr/sbin/sshd"], "Service": "sshd"},
            {"MatchLines": ["/etc/cron.*"], "Service": "cron"},
            {"MatchLines": ["/etc/motd"], "Service": "motd"}]"#,
    )
    .unwrap();
    let sub = tree(&[
        ("/etc", dir()),
        ("/etc/cron", file("x")),
        ("/etc/motd", file("y")),
        ("/etc/ssh", dir()),
        ("/etc/ssh/a", file("z")),
        ("/usr", dir()),
        ("/usr/sbin", dir()),
        ("/usr/sbin/sshd", file("w")),
    ]);
    let mut image = full(tree(&[
        ("/etc", dir()),
        ("/etc/motd", reg("y", 0o644, 0, 9)),
        ("/etc/ssh", dir()),
        ("/usr", dir()),
        ("/usr/sbin", dir()),
        ("/usr/sbin/sshd", reg("w", 0o755, 0, 1)),
    ]));
    image.triggers = triggers.clone();
    let req = plan(&sub, &BTreeSet::new(), &image);
    assert_eq!(req.triggers, triggers);
    assert_eq!(
        req.changed_paths(),
        vec!["/etc/cron", "/etc/ssh/a", "/usr/sbin/sshd"]
    );
    let fired: Vec<&str> = req
        .matched_triggers()
        .iter()
        .map(|t| t.service.as_str())
        .collect();
    assert_eq!(
        fired,
        vec!["cron", "ssh", "sshd"],
        "motd's change is mtime only"
    );
}

#[test]
fn request_round_trips_through_json() {
    let sub = links(tree(&[("/a", file("x")), ("/d", dir())]), &[("/b", "/a")]);
    let mut image = full(tree(&[
        ("/a", reg("x", 0o600, 0, 1)),
        ("/c", file("x")),
        ("/e", file("x")),
        ("/f", dir()),
        ("/l", symlink("a")),
    ]));
    image.triggers = Triggers::parse(r#"[{"MatchLines": ["/c"], "Service": "c"}]"#).unwrap();
    let req = plan(&sub, &BTreeSet::new(), &image);
    assert!(!req.files_to_copy_to_cache.is_empty() && !req.multiply_used_objects.is_empty());
    let json = serde_json::to_string(&req).unwrap();
    let back: UpdateRequest = serde_json::from_str(&json).unwrap();
    assert_eq!(back, req);
    assert_eq!(
        serde_json::from_str::<UpdateRequest>("{}").unwrap(),
        UpdateRequest::default()
    );
    assert!(UpdateRequest::default().is_empty());
}

// ---- random trees --------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }

    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

fn random_dir(r: &mut Rng) -> Inode {
    Inode::Directory {
        mode: *r.pick(&[0o755, 0o700]),
        uid: *r.pick(&[0, 1]),
        gid: 0,
    }
}

fn random_leaf(r: &mut Rng) -> Inode {
    let mode = *r.pick(&[0o644, 0o600]);
    let uid = *r.pick(&[0, 1]);
    let mtime = Mtime {
        sec: *r.pick(&[1, 2]),
        nsec: 0,
    };
    match r.below(10) {
        0..=5 => {
            let c = *r.pick(&["", "x", "y", "z"]);
            Inode::Regular {
                mode,
                uid,
                gid: 0,
                mtime,
                size: c.len() as u64,
                object: (!c.is_empty()).then(|| obj(c)),
            }
        }
        6 | 7 => Inode::Symlink {
            uid,
            gid: 0,
            target: r.pick(&["t1", "t2"]).to_string(),
        },
        8 => Inode::Special {
            special: SpecialKind::Fifo,
            mode,
            uid,
            gid: 0,
            mtime,
            rdev: 0,
        },
        _ => Inode::Special {
            special: SpecialKind::Char,
            mode,
            uid,
            gid: 0,
            mtime,
            rdev: *r.pick(&[1, 2]),
        },
    }
}

/// Another inode with the same kind and content, other metadata (maybe).
fn remeta(r: &mut Rng, i: &Inode) -> Inode {
    let mut i = i.clone();
    match &mut i {
        Inode::Directory { mode, uid, .. } => {
            *mode = *r.pick(&[0o755, 0o700]);
            *uid = *r.pick(&[0, 1]);
        }
        Inode::Regular {
            mode, uid, mtime, ..
        }
        | Inode::Special {
            mode, uid, mtime, ..
        } => {
            *mode = *r.pick(&[0o644, 0o600]);
            *uid = *r.pick(&[0, 1]);
            mtime.sec = *r.pick(&[1, 2]);
        }
        Inode::Symlink { uid, .. } => *uid = *r.pick(&[0, 1]),
    }
    i
}

const NAMES: [&str; 3] = ["a", "b", "c"];

fn join(d: &str, n: &str) -> String {
    if d == "/" {
        format!("/{n}")
    } else {
        format!("{d}/{n}")
    }
}

fn non_dirs(fs: &FileSystem) -> Vec<String> {
    fs.paths
        .iter()
        .filter(|(_, i)| !fs.inodes[i].is_dir())
        .map(|(p, _)| p.clone())
        .collect()
}

fn fill(r: &mut Rng, fs: &mut FileSystem, d: &str, depth: u32) {
    for n in NAMES {
        if r.chance(1, 2) {
            continue;
        }
        let p = join(d, n);
        let leaves = non_dirs(fs);
        if depth < 2 && r.chance(1, 3) {
            fs.insert(&p, random_dir(r)).unwrap();
            fill(r, fs, &p, depth + 1);
        } else if !leaves.is_empty() && r.chance(1, 4) {
            fs.link(&p, r.pick::<String>(&leaves)).unwrap();
        } else {
            fs.insert(&p, random_leaf(r)).unwrap();
        }
    }
}

fn random_tree(r: &mut Rng) -> FileSystem {
    let mut fs = FileSystem::default();
    fs.inodes.insert(1, random_dir(r));
    fs.paths.insert("/".into(), 1);
    fill(r, &mut fs, "/", 0);
    fs
}

fn gc(fs: &mut FileSystem) {
    let named: BTreeSet<u64> = fs.paths.values().copied().collect();
    fs.inodes.retain(|i, _| named.contains(i));
}

fn new_ino(fs: &FileSystem) -> u64 {
    fs.inodes.keys().next_back().copied().unwrap_or(0) + 1
}

/// A few random edits of `a`: metadata, content, kind, deletion, addition, split, link.
fn mutate(r: &mut Rng, a: &FileSystem) -> FileSystem {
    let mut b = a.clone();
    for _ in 0..1 + r.below(4) {
        let paths: Vec<String> = b.paths.keys().filter(|p| *p != "/").cloned().collect();
        let leaves = non_dirs(&b);
        let op = r.below(9);
        if op == 0 || paths.is_empty() {
            let root = b.paths["/"];
            let i = remeta(r, &b.inodes[&root]);
            b.inodes.insert(root, i);
            continue;
        }
        let p = r.pick(&paths).clone();
        match op {
            1 => {
                let ino = b.paths[&p];
                let i = remeta(r, &b.inodes[&ino]);
                b.inodes.insert(ino, i);
            }
            2 => {
                remove_tree(&mut b, &p);
                let i = if r.chance(1, 4) {
                    random_dir(r)
                } else {
                    random_leaf(r)
                };
                let n = new_ino(&b);
                b.inodes.insert(n, i);
                b.paths.insert(p, n);
            }
            3 => remove_tree(&mut b, &p),
            4 => {
                let dirs: Vec<String> = b
                    .paths
                    .iter()
                    .filter(|(_, i)| b.inodes[i].is_dir())
                    .map(|(p, _)| p.clone())
                    .collect();
                let name = *r.pick(&["a", "b", "c", "d"]);
                let q = join(r.pick::<String>(&dirs), name);
                if !b.paths.contains_key(&q) && q.matches('/').count() <= 3 {
                    let i = random_leaf(r);
                    b.insert(&q, i).unwrap();
                }
            }
            5 => {
                if let Some(q) = leaves.get(r.below(leaves.len().max(1) as u64) as usize) {
                    let ino = b.paths[q];
                    let i = if r.chance(1, 2) {
                        b.inodes[&ino].clone()
                    } else {
                        remeta(r, &b.inodes[&ino])
                    };
                    let n = new_ino(&b);
                    b.inodes.insert(n, i);
                    b.paths.insert(q.clone(), n);
                }
            }
            7 | 8 => {
                // Move (7) or duplicate (8) a leaf to a new name in some directory.
                let dirs: Vec<String> = b
                    .paths
                    .iter()
                    .filter(|(_, i)| b.inodes[i].is_dir())
                    .map(|(p, _)| p.clone())
                    .collect();
                let name = *r.pick(&["a", "b", "c", "d"]);
                let q = join(r.pick::<String>(&dirs), name);
                if let Some(from) = leaves.get(r.below(leaves.len().max(1) as u64) as usize)
                    && !b.paths.contains_key(&q)
                    && q.matches('/').count() <= 3
                {
                    let ino = b.paths[from];
                    let i = b.inodes[&ino].clone();
                    if op == 7 {
                        b.paths.remove(from);
                    }
                    let n = new_ino(&b);
                    b.inodes.insert(n, i);
                    b.paths.insert(q, n);
                }
            }
            _ => {
                if leaves.len() >= 2 {
                    let (x, y) = (r.pick(&leaves).clone(), r.pick(&leaves).clone());
                    let t = b.paths[&y];
                    b.paths.insert(x, t);
                }
            }
        }
        gc(&mut b);
    }
    b
}

/// The same tree with other inode numbers (the planner must not compare them across trees).
fn renumber(fs: &FileSystem, by: u64) -> FileSystem {
    FileSystem {
        inodes: fs.inodes.iter().map(|(i, n)| (i + by, n.clone())).collect(),
        paths: fs.paths.iter().map(|(p, i)| (p.clone(), i + by)).collect(),
    }
}

/// A random (sub, cache, image tree) triple: the image is an edit of the sub or unrelated.
fn random_case(r: &mut Rng) -> (FileSystem, BTreeSet<ObjectId>, FileSystem) {
    let a = random_tree(r);
    let b = if r.chance(2, 3) {
        mutate(r, &a)
    } else {
        random_tree(r)
    };
    let b = renumber(&b, 1000);
    a.validate().unwrap();
    b.validate().unwrap();
    let cache = ["x", "y", "z"]
        .into_iter()
        .filter(|_| r.chance(1, 4))
        .map(obj)
        .collect();
    (a, cache, b)
}

/// Checks of any request: objects, and no path in two steps.
fn check_request(
    filter: Option<&Filter>,
    sub: &FileSystem,
    cache: &BTreeSet<ObjectId>,
    req: &UpdateRequest,
    missing: &BTreeSet<ObjectId>,
) -> Result<(), String> {
    let made: BTreeSet<ObjectId> = req
        .inodes_to_make
        .iter()
        .filter_map(|(_, i)| i.object())
        .collect();
    let on_sub: BTreeSet<ObjectId> = sub
        .paths
        .iter()
        .filter(|(p, _)| !untouchable(p, filter))
        .filter_map(|(_, i)| sub.inodes[i].object())
        .collect();
    for o in missing {
        if cache.contains(o) || on_sub.contains(o) || !made.contains(o) {
            return Err(format!("{} should not be fetched", label(o)));
        }
    }
    for o in &made {
        if !cache.contains(o)
            && !missing.contains(o)
            && !req.files_to_copy_to_cache.iter().any(|c| c.object == *o)
        {
            return Err(format!("{} comes from nowhere", label(o)));
        }
    }
    let mut seen = BTreeSet::new();
    for p in req
        .changed_paths()
        .into_iter()
        .chain(req.inodes_to_change.iter().map(|(p, _)| p.as_str()))
    {
        if !seen.insert(p) && !req.inodes_to_change.iter().any(|(q, _)| q == p) {
            return Err(format!("{p} in two steps"));
        }
    }
    Ok(())
}

fn dump(sub: &FileSystem, image: &FileSystem, req: &UpdateRequest) -> String {
    let show = |fs: &FileSystem| {
        fs.paths
            .iter()
            .map(|(p, i)| format!("  {p} #{i} {:?}", fs.inodes[i]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "sub:\n{}\nimage:\n{}\nrequest: {:#?}",
        show(sub),
        show(image),
        summary(req)
    )
}

#[test]
fn random_full_images_apply_exactly() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut nonempty = 0;
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for n in 0..1000 {
        let (sub, cache, b) = random_case(&mut r);
        let image = full(b.clone());
        let req = plan(&sub, &cache, &image);
        let missing = missing_objects(&sub, &cache, &image);
        let ctx = || format!("case {n}\n{}", dump(&sub, &b, &req));
        check_request(image.filter.as_ref(), &sub, &cache, &req, &missing)
            .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        let out = apply(&sub, &cache, &missing, &req).unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        same_tree(&out, &b).unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        if same_tree(&sub, &b).is_ok() {
            assert!(req.is_empty(), "{}", ctx());
        } else {
            nonempty += 1;
            assert!(!req.is_empty(), "{}", ctx());
        }
        // Planning the result against the image again: nothing left to do.
        let again = plan(&out, &BTreeSet::new(), &image);
        assert!(again.is_empty(), "{:?}\n{}", summary(&again), ctx());
        assert_eq!(plan(&sub, &cache, &image), req, "deterministic");
        let kinds = |i: &Inode| std::mem::discriminant(i);
        for (k, hit) in [
            ("copy", !req.files_to_copy_to_cache.is_empty()),
            (
                "hard-linked copy",
                req.files_to_copy_to_cache.iter().any(|c| c.hardlink),
            ),
            ("multiply", !req.multiply_used_objects.is_empty()),
            ("mkdir", !req.directories_to_make.is_empty()),
            ("make", !req.inodes_to_make.is_empty()),
            ("link", !req.hardlinks_to_make.is_empty()),
            ("delete", !req.paths_to_delete.is_empty()),
            ("change", !req.inodes_to_change.is_empty()),
            ("mtime only", !req.mtime_only_changes.is_empty()),
            ("fetch", !missing.is_empty()),
            (
                "kind change",
                req.inodes_to_make
                    .iter()
                    .chain(&req.directories_to_make)
                    .any(|(p, i)| sub.get(p).is_some_and(|s| kinds(s) != kinds(i))),
            ),
            (
                "split",
                req.inodes_to_make.iter().any(|(p, _)| {
                    sub.paths.get(p).is_some_and(|i| {
                        sub.names()[i]
                            .iter()
                            .any(|q| out.paths.get(*q).is_some_and(|j| out.paths[p] != *j))
                    })
                }),
            ),
        ] {
            *seen.entry(k).or_insert(0) += u32::from(hit);
        }
    }
    assert!(nonempty > 850, "{nonempty}");
    for (k, n) in &seen {
        assert!(
            *n >= 15,
            "the random cases exercise {k:?} only {n} times: {seen:?}"
        );
    }
}

#[test]
fn random_sparse_images_keep_extras() {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    for n in 0..300 {
        let (sub, cache, b) = random_case(&mut r);
        let image = sparse(b.clone());
        let req = plan(&sub, &cache, &image);
        let missing = missing_objects(&sub, &cache, &image);
        let ctx = || format!("case {n}\n{}", dump(&sub, &b, &req));
        assert!(req.sparse && req.paths_to_delete.is_empty(), "{}", ctx());
        check_request(image.filter.as_ref(), &sub, &cache, &req, &missing)
            .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        let out = apply(&sub, &cache, &missing, &req).unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        for p in b.paths.keys() {
            assert_eq!(out.get(p), b.get(p), "{p}\n{}", ctx());
        }
        for p in sub.paths.keys().filter(|p| !b.paths.contains_key(*p)) {
            // An extra survives unless the image has a non-directory at one of its ancestors.
            let mut q = parent(p);
            let mut replaced = false;
            while let Some(a) = q {
                replaced |= b.get(a).is_some_and(|i| !i.is_dir());
                q = parent(a);
            }
            if !replaced {
                assert_eq!(out.get(p), sub.get(p), "extra {p}\n{}", ctx());
            }
        }
        assert!(plan(&out, &BTreeSet::new(), &image).is_empty(), "{}", ctx());
    }
}

#[test]
fn random_filtered_images_leave_filtered_paths_alone() {
    let mut r = Rng(0xdead_beef_cafe_f00d);
    let filters = ["/a/b", "/c$", "/b/.*", "/a$\n/c/a", "!\n/a", ".*c$"];
    for n in 0..400 {
        let (mut sub, cache, mut b) = random_case(&mut r);
        if r.chance(1, 3) {
            sub.insert("/.subd", dir()).unwrap();
            sub.insert("/.subd/o", file("x")).unwrap();
            if r.chance(1, 2) && !b.paths.contains_key("/.subd") {
                b.insert("/.subd", file("y")).unwrap();
            }
        }
        let f = Filter::parse(r.pick::<&str>(&filters)).unwrap();
        let image = image_with(b.clone(), Some(f.clone()));
        let req = plan(&sub, &cache, &image);
        let missing = missing_objects(&sub, &cache, &image);
        let ctx = || format!("case {n} filter {:?}\n{}", f.lines(), dump(&sub, &b, &req));
        check_request(image.filter.as_ref(), &sub, &cache, &req, &missing)
            .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        for p in req.changed_paths() {
            assert!(!untouchable(p, Some(&f)), "touches {p}\n{}", ctx());
        }
        let out = apply(&sub, &cache, &missing, &req).unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
        // A directory that holds a filtered path, in the sub's tree or (as a scan that left
        // them out would show it) by the filter's word.
        let holders = f.holders();
        let guarded = |p: &str| {
            holders.contains(p)
                || sub
                    .paths
                    .keys()
                    .any(|q| untouchable(q, Some(&f)) && q.starts_with(&format!("{p}/")))
        };
        for p in sub.paths.keys().filter(|p| untouchable(p, Some(&f))) {
            assert_eq!(out.get(p), sub.get(p), "filtered {p}\n{}", ctx());
        }
        for p in b.paths.keys().filter(|p| !untouchable(p, Some(&f))) {
            let blocked = sub.get(p).is_some_and(Inode::is_dir)
                && !b.get(p).is_some_and(Inode::is_dir)
                && guarded(p);
            if !blocked {
                assert_eq!(out.get(p), b.get(p), "{p}\n{}", ctx());
            }
        }
        for p in out.paths.keys() {
            assert!(
                b.paths.contains_key(p) || untouchable(p, Some(&f)) || guarded(p),
                "extra {p} kept\n{}",
                ctx()
            );
        }
        assert!(plan(&out, &BTreeSet::new(), &image).is_empty(), "{}", ctx());
    }
}
