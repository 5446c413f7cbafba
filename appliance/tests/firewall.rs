//! The PXE filter with real nftables in the appliance's namespace and a real DHCP client.

mod support;

use std::time::{Duration, Instant};

use support::*;

/// The appliance in a fresh namespace pair with the filter on, TFTP off, and `extra`
/// appended to `[firewall]`.
fn start_with_filter(extra: &str) -> (Link, Scratch, Appliance) {
    require(&["busybox", "curl", "ip", "nft"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = base_config(
        &link,
        &scratch,
        &format!("[tftp]\nenabled = false\n[firewall]\nenabled = true\n{extra}"),
    );
    let app = Appliance::start(&link.server, &scratch, &config);
    (link, scratch, app)
}

fn status(link: &Link) -> serde_json::Value {
    serde_json::from_str(
        &link
            .server
            .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/firewall")),
    )
    .unwrap()
}

#[test]
fn the_filter_follows_node_state_repairs_drift_and_fails_closed() {
    let (link, scratch, mut app) = start_with_filter("reconcile_secs = 1\n");
    let mac = client_mac(&link);
    // Unknown MAC, discovery on: answered.
    assert!(
        udhcpc(&link, &scratch, "").is_some(),
        "unknown MAC with discovery on gets an answer"
    );
    let st = status(&link);
    assert_eq!(
        (st["pass"].as_bool(), st["discovery"].as_bool()),
        (Some(true), Some(true)),
        "{st}"
    );
    // Enrolled and not under introspection: denied, in the kernel set, before the API returns.
    let uuid = create_node(&link, &mac);
    let deny = link.server.sh_ok("nft list set inet paddock deny");
    assert!(deny.contains(&mac), "{deny}");
    assert!(
        udhcpc(&link, &scratch, "").is_none(),
        "a known idle machine gets no answer"
    );
    // Under introspection: allowed again.
    link.server.sh_ok(&format!(
        "curl -sf -X POST {PUBLIC_URL}/v1/introspection/{uuid}"
    ));
    assert!(
        link.server
            .sh_ok("nft list set inet paddock allow")
            .contains(&mac)
    );
    assert!(
        udhcpc(&link, &scratch, "").is_some(),
        "a machine under introspection is answered"
    );
    // Someone flushes a set: the reconcile loop puts it back.
    link.server.sh_ok("nft flush set inet paddock allow");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !link
        .server
        .sh_ok("nft list set inet paddock allow")
        .contains(&mac)
    {
        assert!(Instant::now() < deadline, "drift not repaired");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(status(&link)["drift_repaired"].as_u64().unwrap() >= 1);
    let cli = link.server.sh_ok(&format!(
        "{} firewall status --api {PUBLIC_URL}",
        env!("CARGO_BIN_EXE_paddock")
    ));
    assert!(
        cli.contains("pass rule       present") && cli.contains(&mac),
        "{cli}"
    );
    let page = link
        .server
        .sh_ok(&format!("curl -sf {PUBLIC_URL}/ui/firewall"));
    assert!(page.contains("Drift repaired") && page.contains(&mac));
    // SIGTERM: the pass rule goes, the table stays, nothing passes.
    app.stop();
    let pass = link.server.sh_ok("nft list chain inet paddock pass");
    assert!(
        !pass.lines().any(|l| l.trim() == "accept"),
        "no static pass rule: {pass}"
    );
    let leader = link.server.sh_ok("nft list set inet paddock leader");
    assert!(!leader.contains("elements"), "no leader element: {leader}");
    assert!(
        link.server
            .sh_ok("nft list set inet paddock allow")
            .contains(&mac),
        "the sets stay"
    );
}

#[test]
fn discovery_off_blocks_unknown_macs() {
    let (link, scratch, _app) = start_with_filter("discovery = false\n");
    assert!(
        udhcpc(&link, &scratch, "").is_none(),
        "unknown MAC with discovery off gets no answer"
    );
    let mac = client_mac(&link);
    let uuid = create_node(&link, &mac);
    link.server.sh_ok(&format!(
        "curl -sf -X POST {PUBLIC_URL}/v1/introspection/{uuid}"
    ));
    assert!(
        udhcpc(&link, &scratch, "").is_some(),
        "allowed once under introspection"
    );
}

fn pass_rule_present(link: &Link) -> bool {
    let out = link.server.sh("nft list chain inet paddock pass");
    out.status.success()
        && String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == "accept")
}

/// A transient failure closes the filter, and it reopens by itself: another process holds
/// `inet paddock` as its own for a while (`flags owner`: the kernel refuses everyone
/// else's changes, and nft 1.0.6 cannot even list it), as a busy kernel or an operator's
/// racing `nft` would. Meanwhile nothing is answered and the status says why; once it
/// lets go, the pass rule is back within seconds (retries back off from 0.5 s), long
/// before the 15 s reconcile period, with no restart.
#[test]
fn after_a_failed_reconcile_the_pass_rule_returns_by_itself() {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let (link, scratch, app) = start_with_filter("reconcile_secs = 15\n");
    assert!(pass_rule_present(&link));
    let st = status(&link);
    assert_eq!(
        (st["state"].as_str(), st["pass"].as_bool()),
        (Some("serving"), Some(true)),
        "{st}"
    );
    assert!(udhcpc(&link, &scratch, "").is_some(), "serving: answered");

    let mut holder = Command::new("ip")
        .args(["netns", "exec", &link.server.name, "nft", "-i"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nft -i");
    writeln!(
        holder.stdin.as_mut().unwrap(),
        "delete table inet paddock; add table inet paddock {{ flags owner; }}"
    )
    .unwrap();
    wait_for("the table held by another process", || {
        link.server
            .sh_ok("nft list table inet paddock")
            .contains("flags owner")
    });
    // A node change goes to the kernel at once, fails, and the reconcile it falls back on
    // fails too: closed.
    let other = "52:54:00:12:34:56";
    create_node(&link, other);
    let closed = |st: &serde_json::Value| {
        st["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("closed after an error: "))
    };
    wait_for("the filter to close", || closed(&status(&link)));
    assert!(!pass_rule_present(&link));
    assert!(udhcpc(&link, &scratch, "").is_none(), "closed: no answer");
    let st = status(&link);
    let state = st["state"].as_str().unwrap();
    assert!(
        closed(&st) && state.contains(", since ") && state.ends_with(" UTC, retrying"),
        "{st}"
    );
    assert_eq!(st["pass"], false, "{st}");
    assert!(st["last_error"].is_string(), "{st}");
    // Retried meanwhile, sooner than the period: the first attempts come 0.5 s, 1.5 s and
    // 3.5 s after closing (udhcpc alone took 3 s).
    let attempts = st["closed_after_error"]["attempts"].as_u64().unwrap();
    assert!(attempts >= 3, "{st}");

    // The other process lets go (its socket closes, the kernel drops its table).
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let released = Instant::now();
    wait_for("the pass rule to return", || pass_rule_present(&link));
    // Whatever the back-off had reached (≤ 8 s after the fourth attempt), well before 15 s.
    assert!(
        released.elapsed() < Duration::from_secs(9),
        "{:?}",
        released.elapsed()
    );
    let st = status(&link);
    assert_eq!(st["state"], "serving", "{st}");
    assert!(
        st["closed_after_error"].is_null() && st["last_error"].is_null(),
        "{st}"
    );
    assert!(
        link.server
            .sh_ok("nft list set inet paddock deny")
            .contains(other),
        "the node changed while closed is in the rebuilt table"
    );
    assert!(
        udhcpc(&link, &scratch, "").is_some(),
        "serving again: answered"
    );
    // Each transition is logged once, not once per retry.
    let log = app.log_text();
    for line in [
        "pxe filter: closed after an error; retrying until a reconcile succeeds",
        "pxe filter: a reconcile succeeded after an error; serving PXE again",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line}:\n{log}");
    }
}

/// A known node is refused PXE while idle; put in `birth` (not under introspection) its MAC
/// is admitted, in the kernel's allow set and by the DHCP side, as soon as the record
/// changes; it loses it when the run hands over and the node is `healthy`. The run is real
/// as far as the appliance goes: a `paddock-subd` (`cargo build -p paddock-subd` first) on
/// an empty root, synced by the dominator.
#[test]
fn a_node_in_birth_may_pxe_boot_until_it_is_healthy() {
    require(&["tar"]);
    let (link, scratch, _app) = start_with_filter("reconcile_secs = 15\n");
    let api = |method: &str, path: &str, body: &str| -> serde_json::Value {
        let out = link.server.sh_ok(&format!(
            "curl -sf -X {method} -H 'content-type: application/json' -d '{body}' {PUBLIC_URL}{path}"
        ));
        serde_json::from_str(&out).unwrap_or(serde_json::Value::Null)
    };
    // An image to install.
    let root = scratch.path("root");
    sh_ok(&format!(
        "mkdir -p {r}/etc {r}/usr/bin && echo 'root:x:0:0::/root:/bin/sh' > {r}/etc/passwd && echo hi > {r}/usr/bin/hello",
        r = root.display()
    ));
    let tar = scratch.path("image.tar");
    sh_ok(&format!(
        "tar -C {} -cf {} etc usr",
        root.display(),
        tar.display()
    ));
    link.server.sh_ok(&format!(
        "PADDOCK_API={PUBLIC_URL} {} image add test/a {}",
        env!("CARGO_BIN_EXE_paddock"),
        tar.display()
    ));
    let mac = client_mac(&link);
    let uuid = create_node(&link, &mac);
    let in_set = |set: &str| {
        link.server
            .sh_ok(&format!("nft list set inet paddock {set}"))
            .contains(&mac)
    };
    assert!(in_set("deny") && !in_set("allow"));
    assert!(udhcpc(&link, &scratch, "").is_none(), "idle: refused");

    // birth: admitted, though no introspection runs.
    api(
        "POST",
        &format!("/api/v1/nodes/{uuid}/provision"),
        r#"{"image": "test/a"}"#,
    );
    // Within 3 s: the watch on provisioning/, not the 15 s reconcile.
    let soon = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(3);
        while !f() {
            assert!(Instant::now() < deadline, "not within 3 s: {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    soon("the MAC in the allow set", &|| {
        in_set("allow") && !in_set("deny")
    });
    assert!(
        udhcpc(&link, &scratch, "").is_some(),
        "a node in birth is answered"
    );
    let st = status(&link);
    assert!(st["allow"].to_string().contains(&mac), "{st}");

    // The run: steps, subd on an empty root, the dominator's sync, the hand-over.
    let report = |step: &str| {
        api(
            "POST",
            &format!("/api/v1/provision/{uuid}/report"),
            &format!(r#"{{"event": {{"event": "step_done", "step": "{step}"}}}}"#),
        )
    };
    for step in ["choose_disk", "partition", "filesystems"] {
        report(step);
    }
    let _subd = start_subd(&link.server, &scratch, &scratch.path("target"), "");
    report("start_subd");
    api(
        "POST",
        &format!("/api/v1/provision/{uuid}/register"),
        r#"{"address": "127.0.0.2"}"#,
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    while api("GET", &format!("/api/v1/provision/{uuid}"), "")["synced"] != true {
        assert!(
            Instant::now() < deadline,
            "the dominator did not sync the node"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(in_set("allow"), "still admitted while the run goes on");
    for step in ["boot_loader", "identity", "hand_over"] {
        report(step);
    }
    let record = api("GET", &format!("/api/v1/nodes/{uuid}/provisioning"), "");
    assert_eq!(record["state"], "healthy", "{record}");

    // healthy: refused again, in the kernel and by the DHCP side.
    soon("the MAC back in the deny set", &|| {
        in_set("deny") && !in_set("allow")
    });
    assert!(
        udhcpc(&link, &scratch, "").is_none(),
        "a healthy node boots its disk: refused"
    );
}
