//! The `paddock-subd` binary: `kill -9` in the middle of an update's change window, a
//! restart, a fresh scan, plan and fetch, and a second update that converges on the image
//! (the refusal to start without TLS or `--insecure` is in `tls.rs`).

mod support;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use paddock_subd::service::UpdateReport;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_paddock-subd");

struct Running {
    child: Child,
    url: String,
}

fn start(root: &Path, dir: &Path, trigger: &Path, step_delay_ms: Option<u64>, n: u32) -> Running {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--root",
        root.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--insecure",
    ])
    .args(["--trigger-command", trigger.to_str().unwrap()])
    .args(["--no-default-exclusions", "--device-speed", "1073741824"])
    .args(["--link-speed", "1073741824", "--min-cycle-ms", "20"])
    .env("PADDOCK_LOG", "debug")
    .stdout(Stdio::piped())
    .stderr(fs::File::create(dir.join(format!("subd-{n}.log"))).unwrap());
    if let Some(ms) = step_delay_ms {
        cmd.env("PADDOCK_SUBD_TEST_STEP_DELAY_MS", ms.to_string());
    }
    let (child, addr) = spawn_listening(&mut cmd);
    Running {
        child,
        url: format!("http://{addr}"),
    }
}

/// Writes `count` files below `dir`: file `i`'s path and content are `file(i)`.
fn write_each(dir: &Path, count: usize, mode: u32, file: impl Fn(usize) -> (String, String)) {
    for i in 0..count {
        let (path, content) = file(i);
        write(dir, &path, content.as_bytes(), mode);
    }
}

#[test]
fn kill_9_during_an_update_then_a_restart_converges() {
    let (d, root, want, store) = dirs();
    // 120 files change content, 40 are removed, 40 arrive in new directories, a content
    // used three times, a hard-link group, a directory that becomes a file.
    write_each(&root, 160, 0o644, |i| {
        (format!("app/f{i:03}"), format!("old {i}\n"))
    });
    write_each(&want, 120, 0o644, |i| {
        (format!("app/f{i:03}"), format!("new {i}\n"))
    });
    write_each(&want, 40, 0o640, |i| {
        (format!("new/d{}/g{i:02}", i % 4), format!("g {i}\n"))
    });
    for i in 0..3 {
        write(&want, &format!("dup/{i}"), b"the same\n", 0o644);
    }
    write(&want, "bin/tool", &pattern(200_000, 5), 0o755);
    fs::hard_link(want.join("bin/tool"), want.join("bin/tool-alias")).unwrap();
    write(&root, "was-dir/x/y", b"y\n", 0o644);
    write(&want, "was-dir", b"a file now\n", 0o644);
    let scan = scan_tree(&want);
    store_objects(&want, &scan.fs, &store);
    let triggers = r#"[{"MatchLines": ["/app/.*"], "Service": "app"}]"#;
    let image = image_of("app.2", scan.fs, triggers);
    let log = d.path().join("trigger.log");
    let trigger = trigger_script(d.path(), &log, &root.join("new"));
    let rt = runtime();
    let (server, _) = object_server(&rt, &store);

    // First run, slowed down to 20 ms per operation; killed in the change window.
    let mut first = start(&root, d.path(), &trigger, Some(20), 1);
    let c = Client::new(&first.url, "dom");
    let req = plan_with_fetch(&c, &image, &server);
    assert!(
        req.inodes_to_make.len() >= 160,
        "{}",
        req.inodes_to_make.len()
    );
    let url = first.url.clone();
    let body = serde_json::to_value(&req).unwrap();
    let update = std::thread::spawn(move || {
        // Ends with the connection cut by the kill.
        let _ = agent()
            .post(format!("{url}/rpc/Subd.Update"))
            .send_json(&body);
    });
    wait_until("the update's change window", || {
        c.poll(0)
            .update_progress
            .is_some_and(|p| p.phase == "make inodes" && p.done >= 30)
    });
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    update.join().unwrap();
    // Half done: some new content is in place, some old content is still there.
    let half = scan_tree(&root);
    assert_ne!(canonical(&half.fs), canonical(&image.fs));
    assert_eq!(fs::read(root.join("app/f000")).unwrap(), b"new 0\n");
    assert_eq!(fs::read(root.join("app/f119")).unwrap(), b"old 119\n");
    assert_eq!(read_lines(&log), ["app stop old"]);
    assert!(root.join(".subd/stopped-services").exists());
    assert!(
        !leftovers(&root).is_empty(),
        "copies of the used-thrice object remain"
    );

    // Restart: leftovers removed, the stopped service started again; then the
    // controller's next round converges.
    let mut second = start(&root, d.path(), &trigger, None, 2);
    let c = Client::new(&second.url, "dom");
    let p = c.wait_scan(0);
    assert_eq!(p.recovered_services.len(), 1);
    assert!(p.recovered_services[0].ok && p.recovered_services[0].command.ends_with("app start"));
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
    assert!(!root.join(".subd/stopped-services").exists());
    let req = plan_with_fetch(&c, &image, &server);
    let report: UpdateReport =
        serde_json::from_value(c.ok("Subd.Update", &serde_json::to_value(&req).unwrap())).unwrap();
    assert!(report.error.is_none(), "{report:?}");
    println!(
        "second update: {} inodes made, {} deleted, change window {:.1} ms",
        report.apply.inodes_made, report.apply.deleted, report.apply.change_window_ms
    );
    let after = c.fresh_scan();
    assert_same_tree(&after.file_system.unwrap(), &image.fs);
    assert_same_dirs(&root, &want);
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
    assert_eq!(
        read_lines(&log),
        // Stopped before the change window (no /new yet), started again at restart (the
        // directories were made before the kill), stopped and started by the retry.
        [
            "app stop old",
            "app start new",
            "app stop new",
            "app start new"
        ]
    );
    assert_eq!(
        c.poll(0).last_successful_image_name.as_deref(),
        Some("app.2")
    );
    second.child.kill().unwrap();
    second.child.wait().unwrap();
}
