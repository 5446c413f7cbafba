//! The scanner on temporary roots (no root privileges needed, except the mount test).

use std::collections::BTreeSet;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::stat::Mode;
use paddock_image::{Filter, Inode, Mtime, ObjectId, SpecialKind};
use paddock_subd::scan::{self, ScanOptions, ScanResult, default_exclusions};
use paddock_subd::{Generations, Limits, Throttle};

fn write(root: &Path, rel: &str, content: &[u8], mode: u32) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, content).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

fn scan_with(root: &Path, filter: &Filter, threads: usize) -> ScanResult {
    let mut o = ScanOptions::new(filter);
    o.threads = threads;
    let r = scan::scan(root, &o).unwrap();
    assert!(r.stats.complete);
    r.scan.fs.validate().unwrap();
    r
}

fn plain(root: &Path) -> ScanResult {
    scan_with(root, &Filter::empty(), 2)
}

/// Bytes that are not all alike, so a one-byte change moves the hash.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn tree_matches_what_was_written() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let big = pattern(3 * (1 << 20) + 17, 1); // more than one read chunk
    write(root, "etc/passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644);
    write(root, "etc/shadow", b"secret\n", 0o640);
    write(root, "usr/bin/tool", &big, 0o4755);
    write(root, "usr/bin/empty", b"", 0o600);
    fs::set_permissions(root.join("usr/bin"), fs::Permissions::from_mode(0o711)).unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool-again")).unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("etc/tool-link")).unwrap();
    symlink("../usr/bin/tool", root.join("etc/alias")).unwrap();
    nix::unistd::mkfifo(&root.join("etc/pipe"), Mode::from_bits_truncate(0o600)).unwrap();
    fs::set_permissions(root.join("etc/pipe"), fs::Permissions::from_mode(0o620)).unwrap();
    fs::create_dir(root.join("empty-dir")).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000, 123_456_789);
    File::options()
        .write(true)
        .open(root.join("etc/passwd"))
        .unwrap()
        .set_times(FileTimes::new().set_modified(when))
        .unwrap();

    let r = plain(root);
    let fs_ = &r.scan.fs;
    let me = fs::metadata(root.join("etc/passwd")).unwrap();
    let paths: Vec<&str> = fs_.paths.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        [
            "/",
            "/empty-dir",
            "/etc",
            "/etc/alias",
            "/etc/passwd",
            "/etc/pipe",
            "/etc/shadow",
            "/etc/tool-link",
            "/usr",
            "/usr/bin",
            "/usr/bin/empty",
            "/usr/bin/tool",
            "/usr/bin/tool-again",
        ]
    );
    assert_eq!(
        fs_.get("/etc/passwd"),
        Some(&Inode::Regular {
            mode: 0o644,
            uid: me.uid(),
            gid: me.gid(),
            mtime: Mtime {
                sec: 1_600_000_000,
                nsec: 123_456_789
            },
            size: 26,
            object: Some(ObjectId::of(b"root:x:0:0::/root:/bin/sh\n")),
        })
    );
    let tool = fs_.get("/usr/bin/tool").unwrap();
    match tool {
        Inode::Regular {
            mode, size, object, ..
        } => {
            assert_eq!(*mode, 0o4755);
            assert_eq!(*size, big.len() as u64);
            assert_eq!(*object, Some(ObjectId::of(&big)));
        }
        other => panic!("{other:?}"),
    }
    // Three names, one inode.
    let ino = fs_.paths["/usr/bin/tool"];
    assert_eq!(fs_.paths["/usr/bin/tool-again"], ino);
    assert_eq!(fs_.paths["/etc/tool-link"], ino);
    assert_eq!(fs_.names()[&ino].len(), 3);
    assert!(matches!(
        fs_.get("/usr/bin/empty"),
        Some(Inode::Regular {
            mode: 0o600,
            size: 0,
            object: None,
            ..
        })
    ));
    assert!(matches!(
        fs_.get("/usr/bin"),
        Some(Inode::Directory { mode: 0o711, .. })
    ));
    assert!(matches!(
        fs_.get("/etc/alias"),
        Some(Inode::Symlink { target, .. }) if target == "../usr/bin/tool"
    ));
    assert!(matches!(
        fs_.get("/etc/pipe"),
        Some(Inode::Special {
            special: SpecialKind::Fifo,
            mode: 0o620,
            ..
        })
    ));
    // Each inode hashed once.
    assert_eq!(r.stats.files, 3);
    assert_eq!(r.stats.bytes, big.len() as u64 + 26 + 7);
    assert!(r.stats.unstable.is_empty() && r.stats.errors.is_empty());
    assert!(r.scan.objects.is_empty());
}

#[test]
fn thread_count_does_not_change_the_result() {
    let t = tempfile::tempdir().unwrap();
    for i in 0..200u32 {
        write(
            t.path(),
            &format!("d{}/f{i}", i % 7),
            &pattern(i as usize * 97, i as u8),
            0o644,
        );
    }
    let one = scan_with(t.path(), &Filter::empty(), 1);
    let four = scan_with(t.path(), &Filter::empty(), 4);
    assert_eq!(one.scan, four.scan);
    assert_eq!(one.stats.files, 199, "f0 is empty");
}

#[test]
fn subd_dir_is_skipped_and_the_object_cache_listed() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    write(root, "a/.subd/kept", b"not the private dir", 0o644);
    let ids: Vec<ObjectId> = (0..3u8).map(|i| ObjectId::of(&[i; 10])).collect();
    for id in &ids {
        write(root, &format!(".subd/objects/{}", id.path()), b"x", 0o644);
    }
    let tmp = ObjectId::of(b"in flight");
    write(root, &format!(".subd/objects/{}~", tmp.path()), b"x", 0o644);
    write(root, ".subd/objects/zz/yy/not-an-object", b"x", 0o644);
    write(root, ".subd/objects/readme", b"x", 0o644);
    let r = plain(root);
    assert!(r.scan.fs.paths.keys().all(|p| !p.starts_with("/.subd")));
    assert!(
        r.scan.fs.get("/a/.subd/kept").is_some(),
        "only /.subd is private"
    );
    assert_eq!(r.scan.objects, ids.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(
        scan::list_object_cache(&root.join("no-such-dir")).unwrap(),
        BTreeSet::new()
    );
}

#[test]
fn exclusions_are_honoured() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    for p in [
        "tmp/x",
        "var/log/syslog",
        "var/log/apt/history.log",
        "home/u/.bashrc",
        "var/lib/dpkg/status",
        "etc/fstab",
        "etc/fstab.bak",
    ] {
        write(root, p, p.as_bytes(), 0o644);
    }
    let r = scan_with(root, &default_exclusions(), 1);
    let paths: Vec<&str> = r.scan.fs.paths.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        [
            "/",
            "/etc",
            "/etc/fstab",
            "/etc/fstab.bak",
            "/home",
            "/tmp",
            "/var",
            "/var/lib",
            "/var/lib/dpkg",
            "/var/lib/dpkg/status",
            "/var/log",
        ]
    );
    // A directory that matches is skipped with everything below it.
    let f = Filter::parse("/etc/fstab$\n/var/lib$\n").unwrap();
    let r = scan_with(root, &f, 1);
    assert!(r.scan.fs.get("/etc/fstab").is_none());
    assert!(r.scan.fs.get("/etc/fstab.bak").is_some());
    assert!(r.scan.fs.get("/var/lib").is_none());
    assert!(r.scan.fs.get("/var/lib/dpkg/status").is_none());
    assert!(r.scan.fs.get("/var/log/syslog").is_some());
}

#[test]
fn sockets_are_skipped() {
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "run/file", b"x", 0o644);
    let _l = std::os::unix::net::UnixListener::bind(t.path().join("run/control.sock")).unwrap();
    let r = plain(t.path());
    assert!(r.scan.fs.get("/run/file").is_some());
    assert!(r.scan.fs.get("/run/control.sock").is_none());
    assert!(r.stats.errors.is_empty());
}

#[test]
fn corruption_keeping_size_and_mtime_is_caught() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let content = pattern(100_000, 7);
    write(root, "usr/lib/libc.so", &content, 0o755);
    write(root, "etc/hostname", b"node1\n", 0o644);
    let mut gens = Generations::default();
    assert_eq!(gens.generation(), 0);
    let first = plain(root);
    assert!(gens.record(first.scan.clone()));
    assert_eq!(gens.generation(), 1);

    // An unchanged rescan keeps the generation.
    assert!(!gens.record(plain(root).scan));
    assert_eq!((gens.generation(), gens.scan_count()), (1, 2));

    // Flip one byte; put size and mtime back as they were.
    let p = root.join("usr/lib/libc.so");
    let before = fs::metadata(&p).unwrap();
    let mut bad = content.clone();
    bad[54_321] ^= 0x40;
    fs::write(&p, &bad).unwrap();
    File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_times(FileTimes::new().set_modified(before.modified().unwrap()))
        .unwrap();
    let after = fs::metadata(&p).unwrap();
    assert_eq!(
        (after.len(), after.mtime(), after.mtime_nsec()),
        (before.len(), before.mtime(), before.mtime_nsec())
    );
    let second = plain(root);
    let (a, b) = (
        first.scan.fs.get("/usr/lib/libc.so").unwrap(),
        second.scan.fs.get("/usr/lib/libc.so").unwrap(),
    );
    assert!(a.same_but_mtime(b) || a != b);
    assert_eq!(b.object(), Some(ObjectId::of(&bad)));
    assert_ne!(a.object(), b.object());
    assert!(gens.record(second.scan));
    assert_eq!((gens.generation(), gens.scan_count()), (2, 3));
    let (g, latest) = gens.latest().unwrap();
    assert_eq!(g, 2);
    assert_eq!(
        latest.fs.get("/usr/lib/libc.so").unwrap().object(),
        Some(ObjectId::of(&bad))
    );

    // A change in the object cache alone is a new generation too.
    let id = ObjectId::of(b"fetched");
    write(
        root,
        &format!(".subd/objects/{}", id.path()),
        b"fetched",
        0o644,
    );
    assert!(gens.record(plain(root).scan));
    assert_eq!(gens.generation(), 3);
}

#[test]
fn stopped_or_out_of_time_scans_are_incomplete() {
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "a/b", b"x", 0o644);
    let f = Filter::empty();
    let stop = AtomicBool::new(true);
    let mut o = ScanOptions::new(&f);
    o.stop = Some(&stop);
    assert!(!scan::scan(t.path(), &o).unwrap().stats.complete);
    let mut o = ScanOptions::new(&f);
    o.deadline = Some(Instant::now());
    assert!(!scan::scan(t.path(), &o).unwrap().stats.complete);
    assert!(scan::scan(&t.path().join("a/b"), &ScanOptions::new(&f)).is_err());
    assert!(scan::scan(&t.path().join("missing"), &ScanOptions::new(&f)).is_err());
}

#[test]
fn page_cache_hits_are_not_throttled() {
    // A 1 byte/s I/O limit would take weeks if the 4 MiB read here were charged; read from
    // the page cache (just written), it costs nothing.
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "big", &pattern(4 << 20, 3), 0o644);
    let _ = fs::read(t.path().join("big")).unwrap();
    let throttle = Throttle::new(
        Limits {
            io_bytes_per_sec: Some(1.0),
            cpu_share: None,
        },
        paddock_subd::ratelimit::IoMeasure::Blocks,
    );
    let f = Filter::empty();
    let mut o = ScanOptions::new(&f);
    o.throttle = Some(&throttle);
    o.deadline = Some(Instant::now() + Duration::from_secs(20));
    let r = scan::scan(t.path(), &o).unwrap();
    assert!(r.stats.complete, "{:?}", r.stats);
    assert_eq!(r.stats.media_bytes, 0);
    assert_eq!(r.stats.bytes, 4 << 20);
}

#[test]
fn cpu_share_slows_the_scan() {
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "big", &pattern(64 << 20, 5), 0o644);
    let f = Filter::empty();
    let free = {
        let o = ScanOptions::new(&f);
        scan::scan(t.path(), &o).unwrap().stats
    };
    let throttle = Throttle::new(
        Limits {
            io_bytes_per_sec: None,
            cpu_share: Some(0.25),
        },
        paddock_subd::ratelimit::IoMeasure::Blocks,
    );
    let mut o = ScanOptions::new(&f);
    o.throttle = Some(&throttle);
    let limited = scan::scan(t.path(), &o).unwrap().stats;
    assert!(limited.complete);
    // CPU time / wall time stays near the share (the walk and the burst allowance aside).
    let share = limited.cpu.as_secs_f64() / limited.elapsed.as_secs_f64();
    assert!(share < 0.4, "share {share:.2}; {limited:?}");
    // The throttle is what slowed it: the limited scan slept, the free one never did. (Its
    // wall time is not compared with the free scan's: another process on the machine can
    // stretch either. Sleeping longer than its CPU time needs only a third of a core.)
    assert_eq!(free.slept, Duration::ZERO, "{free:?}");
    assert!(
        limited.slept > limited.cpu,
        "a quarter share sleeps about three times its CPU: {limited:?}"
    );
}

#[test]
fn other_file_systems_are_not_crossed() {
    if fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "etc/x", b"x", 0o644);
    fs::create_dir_all(t.path().join("mnt/other")).unwrap();
    let mnt = t.path().join("mnt/other");
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "paddock-test"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs");
        return;
    }
    fs::write(mnt.join("inside"), b"y").unwrap();
    let r = plain(t.path());
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    assert!(r.scan.fs.get("/etc/x").is_some());
    assert!(r.scan.fs.get("/mnt").is_some());
    assert!(
        r.scan.fs.get("/mnt/other").is_none(),
        "the mount point is skipped"
    );
    assert!(r.scan.fs.get("/mnt/other/inside").is_none());
}

/// A directory tree deeper than a poll answer may carry (someone's `mkdir -p` of long names):
/// the paths past 4,096 bytes are left out and said, the rest is scanned, so the machine's
/// answer stays one the dominator takes.
#[test]
fn paths_longer_than_a_poll_answer_carries_are_left_out() {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::mkdirat;
    let t = tempfile::tempdir().unwrap();
    let name = "d".repeat(200);
    let mut dir = open(
        t.path(),
        OFlag::O_DIRECTORY | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .unwrap();
    for _ in 0..24 {
        mkdirat(&dir, name.as_str(), Mode::from_bits_truncate(0o755)).unwrap();
        dir = openat(
            &dir,
            name.as_str(),
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .unwrap();
    }
    write(t.path(), "etc/motd", b"hello\n", 0o644);
    let r = scan::scan(t.path(), &ScanOptions::new(&Filter::empty())).unwrap();
    let longest = r.scan.fs.paths.keys().map(String::len).max().unwrap();
    assert!(longest <= 4096, "{longest}");
    assert!(longest > 3800, "the levels that fit are kept: {longest}");
    assert!(r.scan.fs.paths.contains_key("/etc/motd"));
    assert!(
        r.stats
            .errors
            .iter()
            .any(|e| e.contains("bytes (left out)")),
        "{:?}",
        r.stats.errors
    );
}
