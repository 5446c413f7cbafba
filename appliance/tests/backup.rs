//! `paddock backup` while the appliance is being written to, and `paddock restore` onto a
//! fresh data directory: the real binaries, TLS on, in a namespace.

mod support;

use std::io::BufRead;
use std::time::{Duration, Instant};

use support::*;

const HTTPS: &str = "https://198.18.0.1:8443";
const NODES: usize = 1000;

fn config(scratch: &Scratch, data: &str) -> String {
    format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n[dhcp]\nenabled = false\n\
         [tftp]\nenabled = false\n[boot.discovery]\nkernel = \"{PUBLIC_URL}/boot/assets/vmlinuz\"\n\
         initrd = \"{PUBLIC_URL}/boot/assets/initrd.img\"\n",
        scratch.path(data).display()
    )
}

fn paddock(ns: &Ns, args: &str) -> String {
    ns.sh_ok(&format!("{} {args}", env!("CARGO_BIN_EXE_paddock")))
}

/// Creates nodes b0000… one after another over one TLS connection, each only after the
/// last was acknowledged, and appends each acknowledged index to `acks`.
const WRITER: &str = r#"
import http.client, json, ssl, sys
certs, acks, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(cafile=certs + "/ca.pem")
ctx.load_cert_chain(certs + "/admin.pem", certs + "/admin.key")
conn = http.client.HTTPSConnection("198.18.0.1", 8443, context=ctx, timeout=30)
with open(acks, "w", buffering=1) as out:
    for i in range(count):
        body = json.dumps({"name": "b%04d" % i, "macs": ["52:54:00:b0:%02x:%02x" % (i >> 8, i & 255)]})
        conn.request("POST", "/api/v1/nodes", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status >= 300:
            sys.exit("node %d: HTTP %d" % (i, r.status))
        out.write("%d\n" % i)
"#;

fn acked(path: &std::path::Path) -> usize {
    std::fs::File::open(path)
        .map(|f| std::io::BufReader::new(f).lines().count())
        .unwrap_or(0)
}

#[test]
fn a_backup_taken_under_writes_restores_every_acknowledged_node_and_the_ca() {
    require(&["curl", "python3"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let original = config(&scratch, "data");
    let path = scratch.path("paddock.toml");
    std::fs::write(&path, &original).unwrap();
    paddock(
        &link.server,
        &format!("certs --config {} init", path.display()),
    );
    let mut app = Appliance::start_secure(&link.server, &scratch, &original);
    let certs = scratch.path("data/certs");
    let ca_pem = std::fs::read_to_string(certs.join("ca.pem")).unwrap();

    let script = scratch.path("writer.py");
    std::fs::write(&script, WRITER).unwrap();
    let acks = scratch.path("acks");
    let mut writer = link.server.spawn(
        &format!(
            "python3 {} {} {} {NODES}",
            script.display(),
            certs.display(),
            acks.display()
        ),
        &scratch.path("writer.log"),
    );
    wait_for("the first 200 nodes acknowledged", || acked(&acks) >= 200);
    let before = acked(&acks);
    let file = scratch.path("backup.tar");
    let out = paddock(
        &link.server,
        &format!("backup {} --config {}", file.display(), path.display()),
    );
    let during = acked(&acks);
    assert!(out.contains("keys at revision"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = writer.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the writer did not finish");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(scratch.path("writer.log")).unwrap_or_default()
    );
    assert_eq!(acked(&acks), NODES);
    assert!(
        during < NODES,
        "the backup must run while nodes are written ({during} acknowledged when it ended)"
    );
    app.stop();

    // A fresh data directory on the "new host", with its own configuration already there.
    let fresh = config(&scratch, "restored");
    let fresh_path = scratch.path("restored.toml");
    std::fs::write(&fresh_path, &fresh).unwrap();
    let out = paddock(
        &link.server,
        &format!(
            "restore {} --config {}",
            file.display(),
            fresh_path.display()
        ),
    );
    assert!(out.contains("restored"), "{out}");
    assert_eq!(
        std::fs::read_to_string(scratch.path("restored.toml.from-backup")).unwrap(),
        original,
        "the backup's configuration is put beside the one in place"
    );
    // Never twice onto the same store.
    let again = link.server.sh(&format!(
        "{} restore {} --config {}",
        env!("CARGO_BIN_EXE_paddock"),
        file.display(),
        fresh_path.display()
    ));
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds data"),
        "{again:?}"
    );

    let mut app = Appliance::start_secure(&link.server, &scratch, &fresh);
    // The operator's certificate from the old host still signs in, against the old CA.
    let admin = format!(
        "--cacert {} --cert {} --key {}",
        certs.join("ca.pem").display(),
        certs.join("admin.pem").display(),
        certs.join("admin.key").display()
    );
    let nodes = curl(
        &link.server,
        &format!("curl -s -i -m 30 {admin} {HTTPS}/api/v1/nodes"),
    );
    assert_eq!(nodes.status, 200, "{}", nodes.body);
    let mut restored: Vec<usize> = nodes
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str()?.strip_prefix('b')?.parse().ok())
        .collect();
    restored.sort_unstable();
    // Every node acknowledged before the backup began is back, and what is back is exactly
    // the first k writes: the snapshot is one moment, nothing torn or out of order.
    let k = restored.len();
    eprintln!("backup: {before} acknowledged when it began, {during} when it ended, {k} restored");
    assert!(
        k >= before,
        "{before} nodes were acknowledged before the backup, {k} restored"
    );
    assert!(
        k <= during,
        "{k} restored, {during} acknowledged by its end"
    );
    assert_eq!(restored, (0..k).collect::<Vec<_>>());

    // A machine's agent, as it boots against the restored appliance: its boot script names
    // the CA by fingerprint; the CA it downloads is the old host's and verifies the HTTPS
    // listener, where its token is taken.
    let boot = link.server.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/boot/52-54-00-b1-00-01.ipxe"
    ));
    let word = |name: &str| {
        boot.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in\n{boot}"))
            .to_string()
    };
    let ca_url = word("paddock.ca_url=");
    let downloaded = link
        .server
        .sh_ok(&format!("curl -sf {}", ca_url.split(',').next().unwrap()));
    assert_eq!(downloaded, ca_pem);
    let fetched = scratch.path("agent-ca.pem");
    std::fs::write(&fetched, &downloaded).unwrap();
    let fingerprint = link.server.sh_ok(&format!(
        "openssl x509 -in {} -outform DER | sha256sum",
        fetched.display()
    ));
    let fingerprint = fingerprint.split_whitespace().next().unwrap();
    assert!(
        word("paddock.ca_fingerprint=")
            .to_lowercase()
            .replace(':', "")
            .contains(fingerprint),
        "the script's fingerprint is not the CA's ({fingerprint}):\n{boot}"
    );
    let agent = curl(
        &link.server,
        &format!(
            "curl -s -i -m 20 --cacert {} -H 'Authorization: Bearer {}' \
             -H 'Content-Type: application/json' -d '{{\"macs\":[]}}' \
             -X POST {HTTPS}/api/v1/provision/next",
            fetched.display(),
            word("paddock.token=")
        ),
    );
    assert_eq!(agent.status, 200, "{}", agent.body);
    app.stop();
}
