//! The PXE filter with real nftables in the appliance's namespace and a real DHCP client.

mod support;

use std::time::{Duration, Instant};

use support::*;

fn client_mac(link: &Link) -> String {
    link.client
        .sh_ok(&format!("cat /sys/class/net/{}/address", link.client_if))
        .trim()
        .to_string()
}

/// Creates a node for `mac` through the API; returns its UUID.
fn create_node(link: &Link, mac: &str) -> String {
    let created = link.server.sh_ok(&format!(
        "curl -sf -X POST -H 'content-type: application/json' -d '{{\"macs\":[\"{mac}\"]}}' {PUBLIC_URL}/api/v1/nodes"
    ));
    serde_json::from_str::<serde_json::Value>(&created).unwrap()["uuid"]
        .as_str()
        .unwrap()
        .to_string()
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
    require(&["busybox", "curl", "ip", "nft"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = base_config(
        &link,
        &scratch,
        "[tftp]\nenabled = false\n[firewall]\nenabled = true\nreconcile_secs = 1\n",
    );
    let mut app = Appliance::start(&link.server, &scratch, &config);
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
    require(&["busybox", "curl", "ip", "nft"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = base_config(
        &link,
        &scratch,
        "[tftp]\nenabled = false\n[firewall]\nenabled = true\ndiscovery = false\n",
    );
    let _app = Appliance::start(&link.server, &scratch, &config);
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
