//! subd over HTTP, in this process on temporary roots: Poll and generations, the client
//! lock, Fetch (temporary names, checks, speed share, background), the mutual exclusion of
//! Fetch/Update/Cleanup and the scanner pause, Update with triggers (stop before the change
//! window, start/reload after, old ∪ new, reboot, HighImpact), the health check, Cleanup,
//! GetFiles and the configuration.

mod support;

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use paddock_image::ObjectId;
use paddock_image::plan::{missing_objects, plan};
use paddock_subd::service::{PollResponse, UpdateReport};
use serde_json::{Value, json};
use support::*;

/// Fetch, Update and Cleanup are each refused (409) with `why`.
fn assert_all_busy(c: &Client, server: &str, why: &str) {
    for (method, body) in [
        ("Subd.Fetch", json!({"server": server, "objects": []})),
        ("Subd.Update", json!({"image_name": "x"})),
        ("Subd.Cleanup", json!({"objects": []})),
    ] {
        let (st, v) = c.call(method, &body);
        assert_eq!(st, 409, "{method}: {v}");
        assert_eq!(message(&v), why);
    }
}

/// Objects in a store directory, made from contents.
fn store_with(store: &Path, contents: &[&[u8]]) -> Vec<ObjectId> {
    contents
        .iter()
        .map(|c| {
            let id = ObjectId::of(c);
            let p = store.join(id.path());
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, c).unwrap();
            id
        })
        .collect()
}

/// A temporary root holding `files` (path, content; mode 0644), a subd on it with the test
/// configuration, and a client of it named `dom`.
fn subd_with(files: &[(&str, &[u8])]) -> (tempfile::TempDir, TestSubd, Client) {
    let d = tempfile::tempdir().unwrap();
    for (rel, content) in files {
        write(d.path(), rel, content, 0o644);
    }
    let s = TestSubd::start(test_config(d.path()));
    let c = s.client("dom");
    (d, s, c)
}

#[test]
fn poll_sends_the_tree_only_when_the_generation_changed() {
    let (d, _s, c) = subd_with(&[("etc/motd", b"hello\n")]);
    let root = d.path();
    let p = c.wait_scan(0);
    let g = p.generation;
    assert!(g >= 1 && p.file_system_follows);
    assert!(p.file_system.as_ref().unwrap().get("/etc/motd").is_some());
    assert!(p.object_cache.as_ref().unwrap().is_empty());
    assert!(p.start_time_ms > 0 && p.free_space.unwrap() > 0);

    // The same generation: status only.
    let p = c.poll(g);
    assert!(!p.file_system_follows && p.file_system.is_none() && p.object_cache.is_none());
    assert_eq!(p.generation, g);
    // A short poll never carries the tree.
    let v = c.ok(
        "Subd.Poll",
        &json!({"have_generation": 0, "short_poll_only": true}),
    );
    assert!(v.get("file_system").is_none() && v["file_system_follows"] == false);
    // An empty body is a full poll from generation 0.
    let v = c.ok("Subd.Poll", &Value::Null);
    assert_eq!(v["file_system_follows"], true);

    // Unchanged scans keep the generation; a change makes a new one.
    let n = p.scan_count;
    wait_until("two more scans", || c.poll(g).scan_count > n + 2);
    assert_eq!(c.poll(g).generation, g);
    write(root, "etc/motd", b"changed\n", 0o644);
    wait_until("a new generation", || c.poll(g).generation > g);
    let p = c.poll(g);
    assert!(p.file_system_follows);
    assert_eq!(
        p.file_system.unwrap().get("/etc/motd").unwrap().object(),
        Some(ObjectId::of(b"changed\n"))
    );
    // Bad bodies are refused with a message.
    let (st, v) = c.call("Subd.Poll", &json!({"have_generation": "x"}));
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("Subd.Poll"));
}

#[test]
fn a_poll_can_wait_for_the_next_scan() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "etc/motd", b"hello\n", 0o644);
    let mut config = test_config(d.path());
    // No scan after the first but those asked for (a boost), and a short wait.
    config.scanner.min_cycle = Duration::from_secs(3600);
    config.scan_wait_max = Duration::from_secs(2);
    let s = TestSubd::start(config);
    let c = s.client("dom");
    let n = c.wait_scan(0).scan_count;
    let waiting = json!({"have_generation": 0, "wait_for_scan_after": n});

    // No scan comes: the answer after the sub's wait, without the tree it would have sent.
    let t = Instant::now();
    let v = c.ok("Subd.Poll", &waiting);
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(v["scan_count"], n);
    assert!(v["file_system_follows"] == false && v.get("file_system").is_none());

    // A scan starts while the poll waits: the answer comes with it, the tree included.
    let booster = s.client("dom");
    let boost = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        booster.ok("Subd.BoostScanLimit", &Value::Null);
    });
    let p: PollResponse = serde_json::from_value(c.ok("Subd.Poll", &waiting)).unwrap();
    boost.join().unwrap();
    assert!(p.scan_count > n && p.file_system_follows, "{p:?}");
    assert!(p.file_system.unwrap().get("/etc/motd").is_some());

    // A scan already past the one named: answered as any poll, the tree included.
    let p: PollResponse = serde_json::from_value(c.ok("Subd.Poll", &waiting)).unwrap();
    assert!(p.scan_count > n && p.file_system.is_some());
}

#[test]
fn the_client_lock_keeps_other_controllers_out() {
    let d = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let ids = store_with(store.path(), &[b"one", b"two"]);
    let s = TestSubd::start(test_config(d.path()));
    let (server, _) = object_server(&s.rt, store.path());
    let a = s.client("dominator-a");
    let b = s.client("dominator-b");
    a.wait_scan(0);
    // A takes the lock (asks for a minute, gets the 15 s cap).
    let p: PollResponse = serde_json::from_value(a.ok(
        "Subd.Poll",
        &json!({"have_generation": 0, "lock_for_ms": 60_000, "short_poll_only": true}),
    ))
    .unwrap();
    assert!(p.lock.held && p.lock.by_caller && p.lock.ms_left <= 15_000 && p.lock.ms_left > 14_000);
    // B sees it, and is kept out of everything that changes the machine.
    let p = b.poll(0);
    assert!(p.lock.held && !p.lock.by_caller);
    assert_eq!(p.lock.holder.as_deref(), Some("dominator-a"));
    let fetch = json!({"server": server, "objects": [ids[0]], "speed_percent": 100});
    for (method, body) in [
        ("Subd.Fetch", fetch.clone()),
        ("Subd.Update", json!({"image_name": "x"})),
        ("Subd.Cleanup", json!({"objects": []})),
        ("Subd.Poll", json!({"lock_for_ms": 1000})),
    ] {
        let (st, v) = b.call(method, &body);
        assert_eq!(st, 409, "{method}: {v}");
        assert!(message(&v).contains("another client (dominator-a)"), "{v}");
    }
    // A goes on.
    a.ok("Subd.Fetch", &fetch);
    // Once A lets it go (a lock of 1 ms), B may fetch.
    a.ok(
        "Subd.Poll",
        &json!({"lock_for_ms": 1, "short_poll_only": true}),
    );
    wait_until("A's lock to run out", || !b.poll(0).lock.held);
    let fetch_b =
        json!({"server": server, "objects": [ids[1]], "speed_percent": 100, "lock_for_ms": 5000});
    b.ok("Subd.Fetch", &fetch_b);
    assert!(b.poll(0).lock.by_caller, "a fetch can take the lock too");
}

#[test]
fn fetch_writes_whole_checked_objects_at_the_speed_share() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let store = tempfile::tempdir().unwrap();
    let big = pattern(600_000, 9);
    let ids = store_with(store.path(), &[b"alpha\n", b"beta\n", &big]);
    let mut config = test_config(root);
    config.link_bytes_per_sec = Some(1_000_000);
    let s = TestSubd::start(config);
    let (server, control) = object_server(&s.rt, store.path());
    let c = s.client("dom");
    let g = c.wait_scan(0).generation;

    // Fast at 100 %.
    let t = Instant::now();
    let r = c.ok(
        "Subd.Fetch",
        &json!({"server": server, "objects": [ids[0], ids[1]], "speed_percent": 100}),
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(r["stats"]["objects"], 2);
    assert_eq!(r["new_generation"], true);
    for (id, bytes) in ids.iter().zip([&b"alpha\n"[..], b"beta\n"]) {
        assert_eq!(
            fs::read(root.join(".subd/objects").join(id.path())).unwrap(),
            bytes
        );
    }
    assert!(leftovers(root).is_empty());
    // The cache listing changed: a new generation, with the objects listed.
    let p = c.poll(g);
    assert!(p.generation > g);
    assert!(p.object_cache.unwrap().contains(&ids[0]));

    // 50 % of 1 MB/s: 600 kB takes about 1.2 s (less the limiter's 0.1 s burst).
    let t = Instant::now();
    let r = c.ok(
        "Subd.Fetch",
        &json!({"server": format!("http://{server}/"), "objects": [ids[2]], "speed_percent": 50}),
    );
    let took = t.elapsed();
    assert_eq!(r["stats"]["rate_limit"], 500_000.0);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // The configured share (10 %) is the floor of what a request gets.
    let cfg = c.ok("Subd.GetConfiguration", &Value::Null);
    assert_eq!(cfg["network_speed_percent"], 10.0);

    // A missing object fails the fetch; the error is in the next poll.
    let absent = ObjectId::of(b"absent");
    let (st, v) = c.call(
        "Subd.Fetch",
        &json!({"server": server, "objects": [absent], "speed_percent": 100}),
    );
    assert_eq!(st, 502, "{v}");
    assert!(message(&v).contains("404"), "{v}");
    assert!(c.poll(0).last_fetch_error.unwrap().contains("missing"));
    // Bytes that are not the object are not kept.
    let other = store_with(store.path(), &[b"gamma\n"]);
    control.corrupt.store(true, Ordering::SeqCst);
    let (st, v) = c.call(
        "Subd.Fetch",
        &json!({"server": server, "objects": other, "speed_percent": 100}),
    );
    control.corrupt.store(false, Ordering::SeqCst);
    assert_eq!(st, 502, "{v}");
    assert!(message(&v).contains("SHA-512"), "{v}");
    assert!(!root.join(".subd/objects").join(other[0].path()).exists());
    assert!(leftovers(root).is_empty(), "{:?}", leftovers(root));
    // No server at all.
    let (st, _) = c.call("Subd.Fetch", &json!({"server": "", "objects": []}));
    assert_eq!(st, 400);
}

#[test]
fn fetch_update_and_cleanup_exclude_each_other() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    for i in 0..40 {
        write(
            root,
            &format!("data/f{i}"),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    let store = tempfile::tempdir().unwrap();
    let ids = store_with(store.path(), &[b"first", b"second"]);
    let mut config = test_config(root);
    config.step_delay = Duration::from_millis(40);
    let s = TestSubd::start(config);
    let (server, control) = object_server(&s.rt, store.path());
    let c = s.client("dom");
    let p = c.wait_scan(0);

    // A fetch in the background, stalled after its first object.
    control.stall.store(true, Ordering::SeqCst);
    let v = c.ok(
        "Subd.Fetch",
        &json!({"server": server, "objects": ids, "speed_percent": 100, "wait": false}),
    );
    assert_eq!(v["started"], true);
    wait_until("the first object", || c.poll(0).fetch_bytes >= 5);
    assert!(c.poll(0).fetch_in_progress);
    assert_all_busy(&c, &server, "a fetch in progress");
    control.stall.store(false, Ordering::SeqCst);
    wait_until("the fetch", || !c.poll(0).fetch_in_progress);
    let p2 = c.poll(0);
    assert_eq!(p2.last_fetch.unwrap().objects, 2);
    assert!(p2.last_fetch_error.is_none());

    // An update (slowed down: 40 ms per operation) pauses the scanner and keeps the
    // others out.
    let mut want = p.file_system.clone().unwrap();
    let gone: Vec<String> = want
        .paths
        .keys()
        .filter(|k| k.starts_with("/data/f"))
        .cloned()
        .collect();
    for k in &gone {
        want.paths.remove(k);
    }
    want.inodes
        .retain(|i, _| want.paths.values().any(|v| v == i));
    let image = image_of("smaller", want, "[]");
    let req = plan(&p.file_system.unwrap(), &p.object_cache.unwrap(), &image);
    assert_eq!(req.paths_to_delete.len(), 40);
    let url = s.url.clone();
    let t = std::thread::spawn(move || {
        Client::new(&url, "dom").ok("Subd.Update", &serde_json::to_value(&req).unwrap())
    });
    wait_until("the update", || {
        c.poll(0)
            .update_progress
            .is_some_and(|p| p.phase == "delete" && p.done >= 3)
    });
    let scans = c.poll(0).scan_count;
    assert_all_busy(&c, &server, "an update in progress");
    assert!(
        s.subd.scanner().wait_paused(WAIT),
        "the scanner stops for the update"
    );
    let p = c.poll(0);
    assert!(p.update_in_progress);
    assert_eq!(p.scan_count, scans, "no scan during an update");
    let report: UpdateReport = serde_json::from_value(t.join().unwrap()).unwrap();
    assert_eq!(report.apply.deleted, 40);
    assert!(report.apply.change_window_ms >= 40.0 * 40.0);
    wait_until("a scan after the update", || c.poll(0).scan_count > scans);
    assert!(!c.poll(0).update_in_progress);
}

#[test]
fn updates_run_triggers_and_the_health_check() {
    let (d, root, want, store) = dirs();
    write(&root, "usr/sbin/web", b"web 1\n", 0o755);
    write(&root, "etc/web/web.conf", b"conf 1\n", 0o644);
    write(&root, "usr/sbin/legacy", b"legacy\n", 0o755);
    write(&root, "usr/sbin/db", b"db 1\n", 0o755);
    let log = d.path().join("trigger.log");
    let marker = root.join("etc/web/new-marker");
    let health_out = d.path().join("health.out");
    let mut config = test_config(&root);
    config.trigger_command = trigger_command(d.path(), &log, &marker);
    config.health_command = Some(vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo \"healthy $PADDOCK_SUBD_IMAGE\"; echo ran > '{}'",
            health_out.display()
        ),
    ]);
    let s = TestSubd::start(config);
    let (server, _) = object_server(&s.rt, &store);
    let c = s.client("dom");

    let update_to = |name: &str, triggers: &str, sparse: bool| -> UpdateReport {
        let p = c.fresh_scan();
        let scan = scan_tree(&want);
        store_objects(&want, &scan.fs, &store);
        let mut image = image_of(name, scan.fs, triggers);
        if sparse {
            image.filter = None;
        }
        let (fs_, cache) = (p.file_system.unwrap(), p.object_cache.unwrap());
        let missing = missing_objects(&fs_, &cache, &image);
        c.ok(
            "Subd.Fetch",
            &json!({"server": server, "objects": missing, "speed_percent": 100}),
        );
        let p = c.poll(0);
        let req = plan(&p.file_system.unwrap(), &p.object_cache.unwrap(), &image);
        let v = c.ok("Subd.Update", &serde_json::to_value(&req).unwrap());
        serde_json::from_value(v).unwrap()
    };

    // First image: web (stop/start on its binary, reload on its config), legacy, db.
    let t1 = r#"[
        {"MatchLines": ["/usr/sbin/web"], "Service": "web"},
        {"MatchLines": ["/etc/web/.*"], "Service": "web", "DoReload": true},
        {"MatchLines": ["/usr/sbin/legacy"], "Service": "legacy"},
        {"MatchLines": ["/usr/sbin/db"], "Service": "db", "HighImpact": true}
    ]"#;
    write(&want, "usr/sbin/web", b"web 1\n", 0o755);
    write(&want, "etc/web/web.conf", b"conf 2\n", 0o644);
    write(&want, "etc/web/new-marker", b"", 0o644);
    write(&want, "usr/sbin/legacy", b"legacy\n", 0o755);
    write(&want, "usr/sbin/db", b"db 1\n", 0o755);
    for p in ["usr/sbin/web", "usr/sbin/legacy", "usr/sbin/db"] {
        let m = fs::metadata(root.join(p)).unwrap().modified().unwrap();
        fs::File::options()
            .write(true)
            .open(want.join(p))
            .unwrap()
            .set_times(fs::FileTimes::new().set_modified(m))
            .unwrap();
    }
    let r = update_to("img.1", t1, false);
    assert!(r.error.is_none(), "{r:?}");
    // Config only: web reloaded, not stopped; after the change (the marker is there).
    assert_eq!(read_lines(&log), ["web reload new"]);
    assert!(!r.triggers.high_impact && !r.trigger_failures);
    let h = r.health.clone().unwrap();
    assert!(
        h.outcome.ok && h.outcome.output == "healthy img.1\n",
        "{h:?}"
    );
    assert!(health_out.exists());
    // Reported in the next poll, with the image recorded.
    let p = c.poll(0);
    assert_eq!(p.last_health_check.unwrap().image_name, "img.1");
    assert_eq!(p.last_successful_image_name.as_deref(), Some("img.1"));
    assert!(
        fs::read_to_string(root.join(".subd/triggers.previous"))
            .unwrap()
            .contains("legacy")
    );
    fs::remove_file(&log).unwrap();

    // Second image: web's binary changes, legacy is removed (its old trigger stops it and
    // nothing starts it), db changes (high impact), and a trigger that fails.
    let t2 = r#"[
        {"MatchLines": ["/usr/sbin/web"], "Service": "web"},
        {"MatchLines": ["/etc/web/.*"], "Service": "web", "DoReload": true},
        {"MatchLines": ["/usr/sbin/db"], "Service": "db", "HighImpact": true},
        {"MatchLines": ["/usr/sbin/flaky"], "Service": "fail-flaky"}
    ]"#;
    fs::remove_file(want.join("etc/web/new-marker")).unwrap();
    write(&want, "usr/sbin/web", b"web 2\n", 0o755);
    fs::remove_file(want.join("usr/sbin/legacy")).unwrap();
    write(&want, "usr/sbin/db", b"db 2\n", 0o755);
    write(&want, "usr/sbin/flaky", b"flaky\n", 0o755);
    fs::write(&marker, b"").unwrap(); // present until the update deletes it
    let r = update_to("img.2", t2, false);
    // Stops saw the old tree (marker present), starts the new one (marker gone).
    assert_eq!(
        read_lines(&log),
        [
            "db stop new",
            "fail-flaky stop new",
            "legacy stop new",
            "web stop new",
            "db start old",
            "fail-flaky start old",
            "web start old",
        ]
    );
    assert!(r.triggers.high_impact && r.trigger_failures);
    assert!(r.error.unwrap().contains("fail-flaky"));
    let p = c.poll(0);
    assert!(p.last_update_had_trigger_failures);
    assert!(p.last_update_error.unwrap().contains("fail-flaky"));
    assert!(p.last_update.unwrap().apply.change_window_ms > 0.0);
    assert!(!root.join(".subd/stopped-services").exists());
    fs::remove_file(&log).unwrap();

    // A sparse image: the record stays at the last full image.
    write(&want, "etc/extra", b"x\n", 0o644);
    let r = update_to("sparse.1", "[]", true);
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(
        c.poll(0).last_successful_image_name.as_deref(),
        Some("img.2")
    );
    assert!(read_lines(&log).is_empty());
}

#[test]
fn a_rebooting_update_stops_nothing_and_reboots_only_if_its_triggers_succeed() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    fs::create_dir(&root).unwrap();
    write(&root, "boot/vmlinuz", b"kernel 1\n", 0o644);
    write(&root, "usr/sbin/web", b"web 1\n", 0o755);
    let log = d.path().join("trigger.log");
    let rebooted = d.path().join("rebooted");
    let mut config = test_config(&root);
    config.trigger_command = trigger_command(d.path(), &log, &d.path().join("none"));
    config.reboot_command = vec!["touch".into(), rebooted.display().to_string()];
    config.health_command = Some(vec!["true".into()]);
    let s = TestSubd::start(config);
    let c = s.client("dom");
    let store = tempfile::tempdir().unwrap();
    let (server, _) = object_server(&s.rt, store.path());
    let run = |kernel: &[u8], web: &[u8], triggers: &str| -> UpdateReport {
        let p = c.fresh_scan();
        let mut fs_ = p.file_system.clone().unwrap();
        let ids = store_with(store.path(), &[kernel, web]);
        for (path, id, len) in [
            ("/boot/vmlinuz", ids[0], kernel.len()),
            ("/usr/sbin/web", ids[1], web.len()),
        ] {
            let ino = fs_.paths[path];
            if let Some(paddock_image::Inode::Regular { object, size, .. }) =
                fs_.inodes.get_mut(&ino)
            {
                *object = Some(id);
                *size = len as u64;
            }
        }
        let image = image_of("k", fs_, triggers);
        let missing = missing_objects(
            p.file_system.as_ref().unwrap(),
            p.object_cache.as_ref().unwrap(),
            &image,
        );
        c.ok(
            "Subd.Fetch",
            &json!({"server": server, "objects": missing, "speed_percent": 100}),
        );
        let p = c.poll(0);
        let req = plan(&p.file_system.unwrap(), &p.object_cache.unwrap(), &image);
        serde_json::from_value(c.ok("Subd.Update", &serde_json::to_value(&req).unwrap())).unwrap()
    };
    let triggers = r#"[
        {"MatchLines": ["/boot/.*"], "Service": "kernel", "DoReboot": true, "HighImpact": true},
        {"MatchLines": ["/boot/.*"], "Service": "reboot", "DoReboot": true},
        {"MatchLines": ["/usr/sbin/web"], "Service": "web"}
    ]"#;
    let r = run(b"kernel 2\n", b"web 2\n", triggers);
    assert_eq!(read_lines(&log), ["kernel start old", "reboot start old"]);
    assert!(r.rebooting && r.triggers.reboot && r.triggers.high_impact);
    assert!(rebooted.exists());
    assert!(r.health.is_none(), "no health check before a reboot");
    fs::remove_file(&log).unwrap();
    fs::remove_file(&rebooted).unwrap();

    // A rebooting trigger fails: no reboot.
    let failing = r#"[{"MatchLines": ["/boot/.*"], "Service": "fail-kernel", "DoReboot": true}]"#;
    let r = run(b"kernel 3\n", b"web 2\n", failing);
    assert_eq!(read_lines(&log), ["fail-kernel start old"]);
    assert!(!r.rebooting && r.trigger_failures && !rebooted.exists());
}

#[test]
fn cleanup_get_files_and_configuration() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    write(root, "etc/a", b"file a\n", 0o644);
    write(root, "etc/b", &pattern(300_000, 3), 0o600);
    std::os::unix::fs::symlink("a", root.join("etc/link")).unwrap();
    let ids = store_with(&root.join(".subd/objects"), &[b"cached 1", b"cached 2"]);
    let s = TestSubd::start(test_config(root));
    let c = s.client("dom");
    let p = c.wait_scan(0);
    assert_eq!(p.object_cache.unwrap().len(), 2);

    // Cleanup removes cached objects (absent ones are counted) and bumps the generation.
    let absent = ObjectId::of(b"never");
    let v = c.ok("Subd.Cleanup", &json!({"objects": [ids[0], absent]}));
    assert_eq!(
        (v["removed"].as_u64(), v["absent"].as_u64()),
        (Some(1), Some(1))
    );
    let p2 = c.poll(p.generation);
    assert!(p2.generation > p.generation);
    assert_eq!(
        p2.object_cache.unwrap().into_iter().collect::<Vec<_>>(),
        [ids[1]]
    );

    // GetFiles: length-prefixed contents, in order.
    let resp = agent()
        .post(format!("{}/rpc/Subd.GetFiles", s.url))
        .send_json(json!({"paths": ["/etc/b", "/etc/a"]}))
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body = resp
        .into_body()
        .with_config()
        .limit(1 << 30)
        .read_to_vec()
        .unwrap();
    let mut rest = &body[..];
    for want in [pattern(300_000, 3), b"file a\n".to_vec()] {
        let n = u64::from_be_bytes(rest[..8].try_into().unwrap()) as usize;
        assert_eq!(&rest[8..8 + n], &want[..]);
        rest = &rest[8 + n..];
    }
    assert!(rest.is_empty());
    for bad in [
        "/etc/link",
        "/etc",
        "/etc/none",
        "/.subd/objects",
        "etc/a",
        "/etc/../etc/a",
    ] {
        let (st, v) = c.call("Subd.GetFiles", &json!({"paths": ["/etc/a", bad]}));
        assert_eq!(st, 400, "{bad}: {v}");
    }

    // Configuration: read, refuse nonsense, change the exclusions (seen by the next scan).
    let mut cfg = c.ok("Subd.GetConfiguration", &Value::Null);
    assert_eq!(cfg["scan_speed_percent"], 2.0);
    cfg["scan_speed_percent"] = json!(0);
    let (st, v) = c.call("Subd.SetConfiguration", &cfg);
    assert_eq!(st, 400, "{v}");
    cfg["scan_speed_percent"] = json!(5);
    cfg["scan_exclusions"] = json!(["/etc/b$"]);
    let (st, v) = c.call("Subd.SetConfiguration", &json!({"scan_exclusions": ["("]}));
    assert_eq!(st, 400, "{v}");
    let v = c.ok("Subd.SetConfiguration", &cfg);
    assert_eq!(v["scan_speed_percent"], 5.0);
    wait_until("the exclusion", || {
        let p = c.poll(0);
        p.file_system.is_some_and(|f| f.get("/etc/b").is_none())
    });
    assert_eq!(c.poll(0).configuration.scan_exclusions, ["/etc/b$"]);
    c.ok("Subd.BoostScanLimit", &Value::Null);
    let health = agent().get(format!("{}/healthz", s.url)).call().unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

#[test]
fn bad_updates_are_refused_before_anything_changes() {
    let (d, _s, c) = subd_with(&[("etc/a", b"a\n")]);
    let root = d.path();
    c.wait_scan(0);
    for body in [
        json!({"paths_to_delete": ["/etc/../.."]}),
        json!({"paths_to_delete": ["/.subd"]}),
        json!({"paths_to_delete": ["/"]}),
        json!({"inodes_to_make": [["/x", {"kind": "directory", "mode": 493, "uid": 0, "gid": 0}]]}),
        json!({"hardlinks_to_make": 7}),
    ] {
        let (st, v) = c.call("Subd.Update", &body);
        assert_eq!(st, 400, "{body}: {v}");
    }
    assert!(root.join("etc/a").exists());
    assert!(c.poll(0).last_update.is_none());
}
