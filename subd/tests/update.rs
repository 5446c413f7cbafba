//! The Update applier on temporary roots: every step of Dominator's change sequence,
//! errors that do not abort, sparse images, scan exclusions, and retries after an
//! interruption at every single operation.

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use paddock_image::plan::{missing_objects, plan};
use paddock_image::{Filter, Image, Inode, Mtime, UpdateRequest};
use paddock_subd::update::{self, ApplyOptions, ApplyStats, InvalidRequest, Progress};
use support::*;

struct Scenario {
    _dirs: tempfile::TempDir,
    root: std::path::PathBuf,
    want: std::path::PathBuf,
    store: std::path::PathBuf,
    image: Image,
}

fn scenario(sparse: bool) -> Scenario {
    let (d, root, want, store) = dirs();
    old_tree(&root);
    new_tree(&want);
    let s = scan_tree(&want);
    store_objects(&want, &s.fs, &store);
    let mut image = image_of("scenario.1", s.fs, "[]");
    if sparse {
        image.filter = None;
    }
    Scenario {
        _dirs: d,
        root,
        want,
        store,
        image,
    }
}

/// Applies with the default options and asserts that nothing failed.
fn apply_cleanly(root: &Path, req: &UpdateRequest) -> ApplyStats {
    let stats = update::apply(root, req, ApplyOptions::default()).unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    stats
}

/// Applies, telling `progress` after each operation.
fn apply_with_progress(
    root: &Path,
    req: &UpdateRequest,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<ApplyStats, InvalidRequest> {
    update::apply(
        root,
        req,
        ApplyOptions {
            progress: Some(progress),
            ..ApplyOptions::default()
        },
    )
}

/// Scans the root, plans, puts the missing objects into its cache (a fetch).
fn plan_and_fetch(sc: &Scenario) -> UpdateRequest {
    let s = scan_tree(&sc.root);
    let missing = missing_objects(&s.fs, &s.objects, &sc.image);
    put_objects(&sc.store, &sc.root, &missing);
    let cache: BTreeSet<_> = s.objects.union(&missing).copied().collect();
    plan(&s.fs, &cache, &sc.image)
}

/// One of the update's errors is about `path` and says `what`.
/// A temporary sub root with subd's own directory and `files` (path, content; mode 0644).
fn sub_root(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join(".subd")).unwrap();
    for (rel, content) in files {
        write(d.path(), rel, content, 0o644);
    }
    d
}

fn assert_an_error_says(errors: &[String], path: &str, what: &str) {
    assert!(
        errors.iter().any(|e| e.contains(path) && e.contains(what)),
        "no error about {path} saying {what:?}: {errors:?}"
    );
}

#[test]
fn every_step_of_an_update() {
    let sc = scenario(false);
    let before = scan_tree(&sc.root);
    let missing = missing_objects(&before.fs, &before.objects, &sc.image);
    // New content is fetched; content already on the sub is not.
    assert!(missing.contains(&paddock_image::ObjectId::of(b"new motd\n")));
    assert!(missing.contains(&paddock_image::ObjectId::of(b"dup content\n")));
    assert!(!missing.contains(&paddock_image::ObjectId::of(b"moved content\n")));
    let req = plan_and_fetch(&sc);

    // The request exercises every step.
    let copies: Vec<(&str, bool)> = req
        .files_to_copy_to_cache
        .iter()
        .map(|c| (c.path.as_str(), c.hardlink))
        .collect();
    assert!(copies.contains(&("/opt/moved", true)), "{copies:?}");
    assert!(copies.contains(&("/opt/shared-src", false)), "{copies:?}");
    assert_eq!(
        req.multiply_used_objects
            .get(&paddock_image::ObjectId::of(b"dup content\n")),
        Some(&3)
    );
    let made = |p: &str| req.inodes_to_make.iter().any(|(q, _)| q == p);
    let dir_made = |p: &str| req.directories_to_make.iter().any(|(q, _)| q == p);
    assert!(dir_made("/file-to-dir") && dir_made("/newdir/sub") && dir_made("/srv"));
    assert!(made("/dir-to-file") && made("/was-file") && made("/etc/empty") && made("/link"));
    assert!(
        !req.hardlinks_to_make.is_empty(),
        "{:?}",
        req.hardlinks_to_make
    );
    assert!(req.paths_to_delete.contains(&"/gone".to_string()));
    assert!(req.paths_to_delete.contains(&"/opt/moved".to_string()));
    assert!(req.inodes_to_change.iter().any(|(p, _)| p == "/"));
    assert!(
        req.inodes_to_change
            .iter()
            .any(|(p, _)| p == "/etc/mode-change")
    );
    assert!(req.mtime_only_changes.contains("/etc/mtime-only"));

    let progress_calls = AtomicUsize::new(0);
    let phases = std::sync::Mutex::new(Vec::<String>::new());
    let progress = |p: &Progress| {
        progress_calls.fetch_add(1, Ordering::Relaxed);
        let mut ph = phases.lock().unwrap();
        if ph.last() != Some(&p.phase) {
            ph.push(p.phase.clone());
        }
    };
    let stats = apply_with_progress(&sc.root, &req, &progress).unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert_eq!(
        *phases.lock().unwrap(),
        [
            "copy to cache",
            "multiply objects",
            "make directories",
            "make inodes",
            "make hard links",
            "delete",
            "change metadata"
        ]
    );
    assert!(stats.change_window_ms > 0.0);
    assert_eq!(stats.copies_made, 2);

    let after = scan_tree(&sc.root);
    assert_same_tree(&after.fs, &sc.image.fs);
    let n = assert_same_dirs(&sc.root, &sc.want);
    assert!(n > 30, "{n}");
    assert!(leftovers(&sc.root).is_empty(), "{:?}", leftovers(&sc.root));
    // The hard-link group is one inode with three (four) names.
    let ino = |p: &str| fs::metadata(sc.root.join(p)).unwrap().ino();
    assert_eq!(ino("usr/bin/tool"), ino("usr/bin/tool3"));
    assert_eq!(ino("usr/bin/tool"), ino("hl-over-dir"));
    assert_ne!(ino("split1"), ino("split2"));
    // The image is recorded; a fresh plan has nothing left to do.
    assert_eq!(
        update::patched_image(&sc.root).as_deref(),
        Some("scenario.1")
    );
    let again = plan(&after.fs, &after.objects, &sc.image);
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn a_sparse_image_deletes_nothing_and_records_nothing() {
    let sc = scenario(true);
    let req = plan_and_fetch(&sc);
    assert!(req.sparse && req.paths_to_delete.is_empty());
    apply_cleanly(&sc.root, &req);
    assert!(sc.root.join("gone/deep/er/file").exists());
    assert!(sc.root.join("opt/moved").exists(), "copied, not moved");
    assert_eq!(
        fs::read(sc.root.join("srv/moved-here")).unwrap(),
        b"moved content\n"
    );
    assert_eq!(update::patched_image(&sc.root), None);
}

#[test]
fn errors_are_recorded_and_the_update_goes_on() {
    let sc = scenario(false);
    let s = scan_tree(&sc.root);
    // Planned as if the objects were fetched, but they are not.
    let missing = missing_objects(&s.fs, &s.objects, &sc.image);
    let cache: BTreeSet<_> = s.objects.union(&missing).copied().collect();
    let req = plan(&s.fs, &cache, &sc.image);
    let stats = update::apply(&sc.root, &req, ApplyOptions::default()).unwrap();
    assert!(stats.error_count >= 2, "{:?}", stats.errors);
    assert_an_error_says(&stats.errors, "/etc/motd", "not in the cache");
    // Everything else happened.
    assert!(!sc.root.join("gone").exists());
    let m = fs::metadata(sc.root.join("etc/mode-change")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(fs::read(sc.root.join("etc/motd")).unwrap(), b"old motd\n");
    assert_eq!(
        fs::read(sc.root.join("srv/moved-here")).unwrap(),
        b"moved content\n"
    );
    // A retry with the objects converges.
    let req = plan_and_fetch(&sc);
    apply_cleanly(&sc.root, &req);
    assert_same_tree(&scan_tree(&sc.root).fs, &sc.image.fs);
}

#[test]
fn excluded_paths_are_left_alone() {
    let sc = scenario(false);
    let req = plan_and_fetch(&sc);
    let ex = Filter::from_lines(["/srv/.*".to_string(), "/gone$".to_string()]).unwrap();
    let stats = update::apply(
        &sc.root,
        &req,
        ApplyOptions {
            exclusions: Some(&ex),
            ..ApplyOptions::default()
        },
    )
    .unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert!(stats.excluded >= 6, "{stats:?}");
    assert!(sc.root.join("srv").is_dir() && !sc.root.join("srv/copy").exists());
    assert!(sc.root.join("gone/deep/er/file").exists());
    assert_eq!(fs::read(sc.root.join("etc/motd")).unwrap(), b"new motd\n");
}

#[test]
fn content_changed_since_the_scan_is_not_cached() {
    let sc = scenario(false);
    let req = plan_and_fetch(&sc);
    // The source of a copy into the cache changes after the scan.
    fs::write(sc.root.join("opt/shared-src"), b"tampered\n").unwrap();
    let stats = update::apply(&sc.root, &req, ApplyOptions::default()).unwrap();
    assert_an_error_says(&stats.errors, "/opt/shared-src", "changed");
    assert!(
        !sc.root.join("srv/copy").exists(),
        "never made from wrong bytes"
    );
    assert!(leftovers(&sc.root).is_empty(), "{:?}", leftovers(&sc.root));
}

#[test]
fn links_and_replacements_in_place() {
    let d = sub_root(&[("a", b"a")]);
    let root = d.path();
    fs::hard_link(root.join("a"), root.join("b")).unwrap();
    fs::create_dir_all(root.join("c/d")).unwrap();
    let file = |mode| Inode::Regular {
        mode,
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        mtime: Mtime { sec: 5, nsec: 7 },
        size: 0,
        object: None,
    };
    let req = UpdateRequest {
        image_name: "x".into(),
        // An empty file over a directory tree.
        inodes_to_make: vec![("/c".into(), file(0o600))],
        // Already names of one inode: nothing to do, nothing left behind.
        hardlinks_to_make: vec![("/b".into(), "/a".into()), ("/e".into(), "/c".into())],
        ..UpdateRequest::default()
    };
    let stats = apply_cleanly(root, &req);
    let m = fs::symlink_metadata(root.join("c")).unwrap();
    assert!(m.is_file() && m.len() == 0 && m.mode() & 0o7777 == 0o600);
    assert_eq!((m.mtime(), m.mtime_nsec()), (5, 7));
    assert_eq!(m.ino(), fs::metadata(root.join("e")).unwrap().ino());
    assert!(leftovers(root).is_empty());
    assert_eq!(stats.hardlinks_made, 2);
}

/// An interruption after any single operation (the applier's thread dies there), then a
/// fresh scan, plan and fetch, and a second update: the tree is the image's.
#[test]
fn every_interruption_point_converges() {
    // Count the operations once.
    let count = {
        let sc = scenario(false);
        let req = plan_and_fetch(&sc);
        let n = AtomicUsize::new(0);
        let progress = |_: &Progress| {
            n.fetch_add(1, Ordering::Relaxed);
        };
        apply_with_progress(&sc.root, &req, &progress).unwrap();
        n.into_inner()
    };
    assert!(count > 20, "{count}");
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&"simulated crash") {
            default_hook(info);
        }
    }));
    for cut in 1..count {
        let sc = scenario(false);
        let req = plan_and_fetch(&sc);
        let n = AtomicUsize::new(0);
        let progress = |_: &Progress| {
            if n.fetch_add(1, Ordering::Relaxed) + 1 == cut {
                std::panic::panic_any("simulated crash");
            }
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            apply_with_progress(&sc.root, &req, &progress)
        }));
        assert!(r.is_err(), "cut {cut}: not interrupted");
        // What subd does at start, then the controller's next round.
        update::clean_leftovers(&sc.root).unwrap();
        let req = plan_and_fetch(&sc);
        let stats = update::apply(&sc.root, &req, ApplyOptions::default()).unwrap();
        assert!(stats.errors.is_empty(), "cut {cut}: {:?}", stats.errors);
        assert_same_tree(&scan_tree(&sc.root).fs, &sc.image.fs);
        assert!(leftovers(&sc.root).is_empty(), "cut {cut}");
    }
    let _ = std::panic::take_hook();
    println!(
        "interrupted and retried at each of {} operations",
        count - 1
    );
}

#[test]
fn ownership_is_set_or_the_failure_recorded() {
    let d = sub_root(&[("f", b"f")]);
    let root = d.path();
    let m = fs::metadata(root.join("f")).unwrap();
    let req = UpdateRequest {
        image_name: "x".into(),
        inodes_to_change: vec![(
            "/f".into(),
            Inode::Regular {
                mode: 0o640,
                uid: 4242,
                gid: 4243,
                mtime: Mtime { sec: 9, nsec: 0 },
                size: 1,
                object: Some(paddock_image::ObjectId::of(b"f")),
            },
        )],
        ..UpdateRequest::default()
    };
    let stats = update::apply(root, &req, ApplyOptions::default()).unwrap();
    let after = fs::metadata(root.join("f")).unwrap();
    if is_root() {
        assert!(stats.errors.is_empty(), "{:?}", stats.errors);
        assert_eq!((after.uid(), after.gid()), (4242, 4243));
    } else {
        assert!(stats.errors[0].contains("chown"), "{:?}", stats.errors);
        assert_eq!(after.uid(), m.uid());
    }
    // The rest of the metadata is set either way.
    assert_eq!(after.mode() & 0o7777, 0o640);
    assert_eq!(after.mtime(), 9);
}

/// A file's check runs against the new content before it replaces the old: a check that
/// fails keeps the old file (and reports why), one that passes lets the new one in. A
/// request whose check names no file it makes, or a relative program, is refused.
#[test]
fn a_files_check_guards_its_replacement() {
    let (_d, root, want, store) = dirs();
    write(&root, "etc/app.conf", b"port = 1\n", 0o644);
    fs::create_dir_all(root.join(".subd")).unwrap();
    write(&want, "etc/app.conf", b"port = oops\n", 0o644);
    let image = image_of("checked.1", scan_tree(&want).fs, "[]");
    store_objects(&want, &image.fs, &store);
    let s = scan_tree(&root);
    let missing = missing_objects(&s.fs, &s.objects, &image);
    put_objects(&store, &root, &missing);
    let mut req = plan(&s.fs, &missing, &image);
    // The check refuses any file that says "oops" (grep -q finds it: exit 0 → refuse).
    let refuse_oops = |argv: &mut Vec<String>| {
        argv.extend(
            [
                "/bin/sh",
                "-c",
                "! grep -q oops \"$0\" || { echo bad port; exit 3; }",
            ]
            .map(String::from),
        );
    };
    let mut argv = Vec::new();
    refuse_oops(&mut argv);
    req.checks.insert("/etc/app.conf".into(), argv.clone());
    let stats = update::apply(&root, &req, ApplyOptions::default()).unwrap();
    assert_an_error_says(&stats.errors, "/etc/app.conf", "exited 3: bad port");
    assert_eq!(fs::read(root.join("etc/app.conf")).unwrap(), b"port = 1\n");

    // A good file passes the same check.
    write(&want, "etc/app.conf", b"port = 2\n", 0o644);
    let image = image_of("checked.2", scan_tree(&want).fs, "[]");
    store_objects(&want, &image.fs, &store);
    let s = scan_tree(&root);
    let missing = missing_objects(&s.fs, &s.objects, &image);
    put_objects(&store, &root, &missing);
    let mut req = plan(&s.fs, &s.objects.union(&missing).copied().collect(), &image);
    req.checks.insert("/etc/app.conf".into(), argv.clone());
    apply_cleanly(&root, &req);
    assert_eq!(fs::read(root.join("etc/app.conf")).unwrap(), b"port = 2\n");

    // Bad checks are refused whole.
    let mut bad = req.clone();
    bad.checks.insert("/etc/other".into(), argv);
    assert!(matches!(
        update::validate(&bad),
        Err(InvalidRequest::Check { .. })
    ));
    let mut bad = req.clone();
    bad.checks.insert("/etc/app.conf".into(), vec!["sh".into()]);
    assert!(update::validate(&bad).is_err());
}
