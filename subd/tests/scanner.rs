//! The scan loop: generations, pause, object-cache rescans, nice after the first scan.

use std::fs::{self, File, FileTimes};
use std::path::Path;
use std::time::Duration;

use paddock_image::{Filter, ObjectId};
use paddock_subd::{Scanner, ScannerConfig};

const WAIT: Duration = Duration::from_secs(30);

fn config(root: &Path, fsbench: &Path) -> ScannerConfig {
    let mut c = ScannerConfig::new(root);
    c.exclusions = Filter::empty();
    c.device_speed = Some(1 << 30);
    c.fsbench_dir = fsbench.to_path_buf();
    c.min_cycle = Duration::from_millis(20);
    c
}

/// The nice value of this process's thread `tid` (field 19 of its stat).
fn nice_of(tid: i32) -> Option<i64> {
    let stat = fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(16)?.parse().ok()
}

#[test]
fn generations_pause_and_cache_rescans() {
    let t = tempfile::tempdir().unwrap();
    let bench = tempfile::tempdir().unwrap();
    let root = t.path();
    fs::create_dir(root.join("etc")).unwrap();
    fs::write(root.join("etc/motd"), b"hello world\n").unwrap();
    let scanner = Scanner::spawn(config(root, bench.path())).unwrap();
    let h = scanner.handle();
    assert!(h.wait_for_scans(1, WAIT));
    let (g, s) = h.latest().unwrap();
    assert_eq!(g, 1);
    assert_eq!(
        s.fs.get("/etc/motd").unwrap().object(),
        Some(ObjectId::of(b"hello world\n"))
    );
    // Nice 15 once the first scan is done.
    assert!(h.wait_for_scans(2, WAIT));
    assert_eq!(nice_of(h.thread_id().unwrap()), Some(15));

    // Unchanged rescans keep the generation.
    let n = h.scan_count();
    assert!(h.wait_for_scans(n + 3, WAIT));
    assert_eq!(h.generation(), 1);

    // Paused: the thread stops (the hook says when), so the change below is seen only
    // after resuming.
    let guard = h.pause();
    assert!(h.wait_paused(WAIT), "the scanner stops for a pause");
    let n = h.scan_count();
    let p = root.join("etc/motd");
    let mtime = fs::metadata(&p).unwrap().modified().unwrap();
    fs::write(&p, b"HELLO world\n").unwrap();
    File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_times(FileTimes::new().set_modified(mtime))
        .unwrap();
    assert!(h.wait_paused(Duration::ZERO), "still stopped");
    assert_eq!(h.scan_count(), n, "no scan while paused");
    assert_eq!(h.generation(), 1);
    drop(guard);
    assert!(h.wait_for_scans(n + 1, WAIT));
    assert_eq!(h.generation(), 2, "the corrupted file is a new generation");
    assert_eq!(
        h.latest().unwrap().1.fs.get("/etc/motd").unwrap().object(),
        Some(ObjectId::of(b"HELLO world\n"))
    );

    // An object arriving in the cache (a fetch) bumps the generation at once.
    let guard = h.pause();
    let id = ObjectId::of(b"fetched");
    let obj = root.join(".subd/objects").join(id.path());
    fs::create_dir_all(obj.parent().unwrap()).unwrap();
    fs::write(&obj, b"fetched").unwrap();
    assert!(h.rescan_object_cache().unwrap());
    assert!(
        !h.rescan_object_cache().unwrap(),
        "no change the second time"
    );
    assert_eq!(h.generation(), 3);
    assert!(h.latest().unwrap().1.objects.contains(&id));
    drop(guard);
    let n = h.scan_count();
    assert!(h.wait_for_scans(n + 2, WAIT));
    assert_eq!(h.generation(), 3, "the full scan agrees with the rescan");
    let stats = h.last_stats().unwrap();
    assert!(stats.complete && stats.files == 1);
    assert_eq!(h.device_speed().unwrap().bytes_per_sec, 1 << 30);

    // Boost and new limits do not disturb the loop.
    h.boost();
    h.set_limits(10.0, 25.0);
    let n = h.scan_count();
    assert!(h.wait_for_scans(n + 2, WAIT));
    assert_eq!(h.generation(), 3);
    drop(scanner); // stops and joins the thread
}

#[test]
fn a_missing_root_is_reported_and_retried() {
    let t = tempfile::tempdir().unwrap();
    let bench = tempfile::tempdir().unwrap();
    let root = t.path().join("later");
    let scanner = Scanner::spawn(config(&root, bench.path())).unwrap();
    let h = scanner.handle();
    let deadline = std::time::Instant::now() + WAIT;
    while h.last_error().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(h.last_error().unwrap().contains("later"));
    assert_eq!(h.generation(), 0);
    assert!(h.latest().is_none());
    fs::create_dir(&root).unwrap();
    assert!(h.wait_for_scans(1, WAIT));
    assert_eq!(h.generation(), 1);
}
