//! fs2objectcache on temporary roots, and the binaries' command lines.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use nix::sys::stat::Mode;
use paddock_image::{Filter, ObjectId};
use paddock_subd::fs2objectcache::{ConvertError, convert};
use paddock_subd::scan::{self, ScanOptions};

fn write(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

/// Every non-directory under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(
                    e.path()
                        .strip_prefix(dir)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out.sort();
    out
}

#[test]
fn converts_a_tree_into_a_verified_cache() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    write(root, "bin/busybox", &big);
    fs::hard_link(root.join("bin/busybox"), root.join("bin/sh")).unwrap();
    fs::hard_link(root.join("bin/busybox"), root.join("sbin-ls")).unwrap();
    write(root, "etc/a.conf", b"same bytes\n");
    write(root, "etc/b.conf", b"same bytes\n"); // a duplicate, not a link
    write(root, "etc/unique", b"only here\n");
    write(root, "var/empty-file", b"");
    write(root, "deep/er/and/deeper/leaf", b"leaf\n");
    symlink("busybox", root.join("bin/ls")).unwrap();
    symlink("/nowhere", root.join("dangling")).unwrap();
    nix::unistd::mkfifo(&root.join("etc/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    fs::create_dir_all(root.join("empty/dirs/only")).unwrap();
    // An old private dir, with a bogus object: removed first, never trusted.
    let bogus = ObjectId::of(b"claimed");
    write(
        root,
        &format!(".subd/objects/{}", bogus.path()),
        b"not what it claims",
    );

    let s = convert(root, 2).unwrap();
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(s.files, 5, "busybox, a.conf, b.conf, unique, leaf");
    assert_eq!(s.objects, 4);
    assert_eq!(s.duplicates, 1);
    assert_eq!(s.links, 2);
    assert_eq!(s.empty, 1);
    assert_eq!(s.others, 4, "2 symlinks, a fifo, a socket");
    assert_eq!(s.bytes, big.len() as u64 + 11 + 11 + 10 + 5);

    // Only the cache is left, each object named by its hash.
    let top: BTreeSet<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(top, BTreeSet::from([".subd".to_string()]));
    let objects = root.join(".subd/objects");
    let left = files_under(&root.join(".subd"));
    let want: BTreeSet<ObjectId> = [&big[..], b"same bytes\n", b"only here\n", b"leaf\n"]
        .iter()
        .map(|c| ObjectId::of(c))
        .collect();
    let got: BTreeSet<ObjectId> = left
        .iter()
        .map(|p| ObjectId::from_path(p.strip_prefix("objects/").unwrap()).unwrap())
        .collect();
    assert_eq!(got, want);
    assert_eq!(left.len(), 4);
    for id in &want {
        assert_eq!(
            ObjectId::of(&fs::read(objects.join(id.path())).unwrap()),
            *id
        );
    }
    assert!(!objects.join(bogus.path()).exists());

    // What subd's scanner then sees: an empty tree and the cache.
    let f = Filter::empty();
    let r = scan::scan(root, &ScanOptions::new(&f)).unwrap();
    assert_eq!(r.scan.fs.paths.len(), 1);
    assert_eq!(r.scan.objects, want);

    // Converting again changes nothing but the (emptied) cache: it is removed first.
    let again = convert(root, 1).unwrap();
    assert_eq!(again.files, 0);
    assert!(files_under(&root.join(".subd")).is_empty());
}

#[test]
fn refuses_slash_and_non_directories() {
    for p in ["/", "//", "/.", "/usr/.."] {
        assert!(
            matches!(convert(Path::new(p), 1), Err(ConvertError::Slash)),
            "{p}"
        );
    }
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "file", b"x");
    assert!(matches!(
        convert(&t.path().join("file"), 1),
        Err(ConvertError::NotDir(_))
    ));
    assert!(matches!(
        convert(&t.path().join("missing"), 1),
        Err(ConvertError::Io { .. })
    ));
    // A symlink to / is refused too.
    symlink("/", t.path().join("slash")).unwrap();
    assert!(matches!(
        convert(&t.path().join("slash"), 1),
        Err(ConvertError::Slash)
    ));
    assert_eq!(fs::read(t.path().join("file")).unwrap(), b"x");
}

#[test]
fn the_binaries() {
    let out = Command::new(env!("CARGO_BIN_EXE_fs2objectcache"))
        .arg("/")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to convert /"));

    let t = tempfile::tempdir().unwrap();
    write(t.path(), "a/b", b"bee\n");
    write(t.path(), "c", b"sea\n");
    let out = Command::new(env!("CARGO_BIN_EXE_paddock-subd-scan"))
        .arg(t.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.starts_with("scan files=2 bytes=8 objects=0 "),
        "{line}"
    );
    assert!(line.contains("complete=true"), "{line}");

    let out = Command::new(env!("CARGO_BIN_EXE_fs2objectcache"))
        .arg(t.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 files (8 bytes) → 2 objects"));
    let out = Command::new(env!("CARGO_BIN_EXE_paddock-subd-scan"))
        .arg(t.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("scan files=0 bytes=0 objects=2 "));
}
