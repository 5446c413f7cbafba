//! SIGTERM drains: the real `paddock serve` is stopped while 50 API calls and an image
//! upload are in flight (curl sending their bodies slowly from another namespace). Every
//! call gets its answer and what it wrote is there after a restart; the upload is either
//! whole (it finished within the grace period) or absent (it did not); the process exits
//! within the grace period.

mod support;

use std::process::Child;
use std::time::{Duration, Instant};

use support::*;

const CALLS: usize = 50;
/// Each call's body: sent at 1 KiB/s, so each takes about 3 s.
const CALL_BODY: usize = 3 * 1024;

struct InFlight {
    calls: Vec<(Child, std::path::PathBuf)>,
    upload: (Child, std::path::PathBuf),
}

/// A tarball of `mib` MiB (a few files, random so nothing deduplicates), framed as
/// `ImageServer.AddImage` takes it: a JSON line, then the tar.
fn upload_body(scratch: &Scratch, name: &str, mib: usize) -> std::path::PathBuf {
    let root = scratch.path("image-root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/hostname"), "drain\n").unwrap();
    sh_ok(&format!(
        "head -c {}M /dev/urandom > {}/blob",
        mib,
        root.display()
    ));
    let tar = scratch.path("image.tar");
    sh_ok(&format!(
        "tar --numeric-owner -C {} -cf {} .",
        root.display(),
        tar.display()
    ));
    let body = scratch.path("upload.body");
    let mut bytes = format!("{{\"name\": \"{name}\"}}\n").into_bytes();
    bytes.extend(std::fs::read(&tar).unwrap());
    std::fs::write(&body, bytes).unwrap();
    body
}

/// Starts the 50 rule creations and the upload, each a curl in the client namespace that
/// writes the HTTP status it got (000: none) to its log.
fn start_in_flight(
    link: &Link,
    scratch: &Scratch,
    upload: &std::path::Path,
    rate: &str,
) -> InFlight {
    let calls = (0..CALLS)
        .map(|i| {
            let rule = format!(
                "{{\"description\": \"drain {i}\", \"conditions\": [], \"actions\": \
                 [{{\"action\": \"set-attribute\", \"path\": \"/extra/drain\", \"value\": \"{i}\"}}]}}"
            );
            let body = scratch.path(&format!("rule-{i}.json"));
            std::fs::write(&body, format!("{rule:<CALL_BODY$}")).unwrap();
            let log = scratch.path(&format!("rule-{i}.out"));
            let child = link.server.spawn(
                &format!(
                    "curl -s -o /dev/null -w '%{{http_code}}' --limit-rate 1K -m 60 \
                     -H 'Content-Type: application/json' --data-binary @{} {PUBLIC_URL}/v1/rules",
                    body.display()
                ),
                &log,
            );
            (child, log)
        })
        .collect();
    let log = scratch.path("upload.out");
    let child = link.server.spawn(
        &format!(
            "curl -s -o /dev/null -w '%{{http_code}}' --limit-rate {rate} -m 120 \
             -H 'Content-Type: application/octet-stream' --data-binary @{} \
             {PUBLIC_URL}/rpc/ImageServer.AddImage",
            upload.display()
        ),
        &log,
    );
    InFlight {
        calls,
        upload: (child, log),
    }
}

/// What curl wrote: the HTTP status, or 0 when it got none.
fn finish(mut c: (Child, std::path::PathBuf)) -> u16 {
    c.0.wait().unwrap();
    std::fs::read_to_string(&c.1)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

/// SIGTERM; how long the process took to exit.
fn terminate(app: &mut Appliance) -> Duration {
    let mut child = app.child.take().expect("running");
    let t = Instant::now();
    sh_ok(&format!("kill -TERM {}", child.id()));
    let status = child.wait().unwrap();
    let took = t.elapsed();
    assert!(
        status.success(),
        "paddock exited with {status}:\n{}",
        app.log_text()
    );
    took
}

fn config(link: &Link, scratch: &Scratch, grace_secs: u64) -> String {
    base_config(link, scratch, "[tftp]\nenabled = false\n").replacen(
        "[http]\n",
        &format!("[http]\nshutdown_grace_secs = {grace_secs}\n"),
        1,
    )
}

/// Waits until the appliance has read the start of every call (each connection's request
/// head), so that the signal lands with all of them in flight. A connection the kernel has
/// accepted but the appliance has not yet read from is idle to the server, and a draining
/// server rightly closes idle connections.
fn wait_connected(link: &Link, want: usize) {
    wait_for("every call read by the appliance", || {
        let out = link
            .server
            .sh_ok("ss -Htni state established '( sport = :8080 )'");
        let read = read_by_app(&out);
        read.len() >= want && read.iter().all(|&n| n > 0)
    });
}

/// For each connection in `ss -Htni` output: the bytes the application has read, that is
/// the bytes received less those still queued (Recv-Q). Each socket is a line with the
/// queues, then an indented line of details (`bytes_received` is absent while it is 0).
fn read_by_app(ss: &str) -> Vec<u64> {
    let mut read = Vec::new();
    let mut queued = None;
    for line in ss.lines() {
        if line.starts_with(char::is_whitespace) {
            let received = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("bytes_received:"))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if let Some(q) = queued.take() {
                read.push(received.saturating_sub(q));
            }
        } else {
            queued = line.split_whitespace().next().and_then(|q| q.parse().ok());
        }
    }
    read
}

#[test]
fn sigterm_lets_calls_and_an_upload_in_flight_finish() {
    require(&["curl", "ip", "ss", "tar"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let mut app = Appliance::start(&link.server, &scratch, &config(&link, &scratch, 10));
    // 4 MiB at 2 MiB/s: about 2 s, inside the 10 s grace.
    let upload = upload_body(&scratch, "drain/whole", 4);
    let flight = start_in_flight(&link, &scratch, &upload, "2M");
    wait_connected(&link, CALLS + 1);
    let took = terminate(&mut app);

    let statuses: Vec<u16> = flight.calls.into_iter().map(finish).collect();
    assert!(
        statuses.iter().all(|s| *s == 201),
        "every call in flight gets its answer: {statuses:?}"
    );
    assert_eq!(
        finish(flight.upload),
        200,
        "the upload finished within the grace"
    );
    assert!(
        took < Duration::from_secs(10),
        "exited {took:?} after SIGTERM"
    );

    app.restart(&link.server);
    let rules = http(&link.server, &scratch, "GET", "/v1/rules", None, &[]).json();
    let mut drained: Vec<String> = rules["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["description"].as_str())
        .filter(|d| d.starts_with("drain "))
        .map(str::to_string)
        .collect();
    drained.sort();
    drained.dedup();
    assert_eq!(
        drained.len(),
        CALLS,
        "every answered call's rule is kept: {rules}"
    );
    let shown = http(
        &link.server,
        &scratch,
        "GET",
        "/rpc/ImageServer.ShowImage?name=drain/whole",
        None,
        &[],
    );
    assert_eq!(shown.status, 200, "{}", shown.error());
    assert_eq!(shown.json()["missing_objects"], 0, "the image is whole");
}

#[test]
fn an_upload_longer_than_the_grace_is_cut_and_left_absent() {
    require(&["curl", "ip", "ss", "tar"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let grace = Duration::from_secs(3);
    let mut app = Appliance::start(
        &link.server,
        &scratch,
        &config(&link, &scratch, grace.as_secs()),
    );
    // 16 MiB at 1 MiB/s: about 16 s, far past the 3 s grace.
    let upload = upload_body(&scratch, "drain/cut", 16);
    let flight = start_in_flight(&link, &scratch, &upload, "1M");
    wait_connected(&link, CALLS + 1);
    let took = terminate(&mut app);
    // The grace, plus the second the runtime gives the rest, plus process exit.
    assert!(
        took < grace + Duration::from_secs(2),
        "exited {took:?} after SIGTERM (grace {grace:?})"
    );
    let statuses: Vec<u16> = flight.calls.into_iter().map(finish).collect();
    assert!(
        statuses.iter().all(|s| *s == 201),
        "the calls (about 3 s each) finish within the grace: {statuses:?}"
    );
    let upload_status = finish(flight.upload);
    assert_ne!(upload_status, 200, "the upload could not have finished");

    app.restart(&link.server);
    let shown = http(
        &link.server,
        &scratch,
        "GET",
        "/rpc/ImageServer.ShowImage?name=drain/cut",
        None,
        &[],
    );
    assert_eq!(
        shown.status,
        404,
        "a cut upload leaves no image: {}",
        shown.error()
    );
    let listed = http(
        &link.server,
        &scratch,
        "GET",
        "/rpc/ImageServer.ListImages",
        None,
        &[],
    );
    assert!(!listed.body.contains("drain/cut"), "{}", listed.body);
}

/// Under systemd (`Type=notify`) the appliance says READY=1 once every listener answers, and
/// STOPPING=1 when SIGTERM starts the drain.
#[test]
fn the_service_manager_hears_ready_then_stopping() {
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let path = scratch.path("paddock.toml");
    std::fs::write(&path, config(&link, &scratch, 2)).unwrap();
    let socket_path = scratch.path("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut child = link.server.spawn(
        &format!(
            "env NOTIFY_SOCKET={} PADDOCK_INSECURE=true {} serve --config {}",
            socket_path.display(),
            env!("CARGO_BIN_EXE_paddock"),
            path.display()
        ),
        &scratch.path("paddock.log"),
    );
    let log = || std::fs::read_to_string(scratch.path("paddock.log")).unwrap_or_default();
    let mut buf = [0u8; 512];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification: {e}\n{}", log()));
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap().trim(), "READY=1");
    // Ready means serving: no retry needed.
    let health = link
        .server
        .sh(&format!("curl -sf -m 2 {PUBLIC_URL}/healthz"));
    assert!(health.status.success(), "{}", log());
    sh_ok(&format!("kill -TERM {}", child.id()));
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap().trim(), "STOPPING=1");
    assert!(child.wait().unwrap().success(), "{}", log());
}
