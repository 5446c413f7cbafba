//! An appliance upgraded in place. `tests/fixtures/store-<rev>.tar.gz` is a data directory
//! written by an earlier release's `paddock serve` (`scripts/store-fixture.sh` made it, with
//! that release's binary): its CA and certificates, two nodes, a DHCP lease taken by udhcpc,
//! an image, an introspection rule and an operator token. Today's binary must migrate it with
//! all of that intact, keep a backup of the store as it was, and leave the file so that the
//! earlier release refuses it.

mod support;

use std::path::{Path, PathBuf};

use support::*;

/// The release the fixture comes from: the last commit before store versions.
const FIXTURE: &str = "5180068";
const HTTPS: &str = "https://198.18.0.1:8443";

fn fixture(ext: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/store-{FIXTURE}.{ext}"))
}

fn config(link: &Link, data: &Path) -> String {
    format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n[dhcp]\ninterfaces = [\"{}\"]\n\
         [[dhcp.subnets]]\nnetwork = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.199\"]\n\
         lease_time = 1000000000\n[tftp]\nenabled = false\n[boot.discovery]\n\
         kernel = \"{PUBLIC_URL}/boot/assets/vmlinuz\"\ninitrd = \"{PUBLIC_URL}/boot/assets/initrd.img\"\n",
        data.display(),
        link.server_if
    )
}

#[test]
fn a_store_of_the_previous_release_is_migrated_with_everything_in_it() {
    require(&["curl", "tar"]);
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("json")).unwrap()).unwrap();
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let data = scratch.path("data");
    std::fs::create_dir_all(&data).unwrap();
    sh_ok(&format!(
        "tar --numeric-owner -C {} -xzf {}",
        data.display(),
        fixture("tar.gz").display()
    ));
    let mut app = Appliance::start_secure(&link.server, &scratch, &config(&link, &data));
    assert!(
        app.log_text().contains("store: migrated"),
        "{}",
        app.log_text()
    );

    // The store as it was, kept before the first step.
    let backups: Vec<_> = std::fs::read_dir(data.join("backups"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    let manifest: serde_json::Value = serde_json::from_str(&sh_ok(&format!(
        "tar -xOf {} manifest.json",
        backups[0].display()
    )))
    .unwrap();
    assert_eq!(manifest["schema"], serde_json::Value::Null, "{manifest}");
    assert!(manifest["keys"].as_u64().unwrap() > 5, "{manifest}");

    // Everything the old appliance held, through the API, with the old certificates.
    let certs = data.join("certs");
    let admin = format!(
        "--cacert {} --cert {} --key {}",
        certs.join("ca.pem").display(),
        certs.join("admin.pem").display(),
        certs.join("admin.key").display()
    );
    let get = |auth: &str, path: &str| {
        let r = curl(
            &link.server,
            &format!("curl -s -i -m 20 {auth} '{HTTPS}{path}'"),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.json()
    };
    for node in expected["nodes"].as_array().unwrap() {
        let found = get(
            &admin,
            &format!("/api/v1/nodes/{}", node["name"].as_str().unwrap()),
        );
        assert_eq!(found["uuid"], node["uuid"], "{found}");
    }
    let leases = get(&admin, "/api/v1/leases");
    let lease = &expected["lease"];
    assert!(
        leases
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["mac"] == lease["mac"] && l["ip"] == lease["ip"]),
        "{lease} not in {leases}"
    );
    let rule = get(
        &admin,
        &format!("/v1/rules/{}", expected["rule"].as_str().unwrap()),
    );
    assert_eq!(rule["description"], "rack from the fixture", "{rule}");
    let token = format!(
        "--cacert {} -H 'Authorization: Bearer {}'",
        certs.join("ca.pem").display(),
        expected["token"].as_str().unwrap().trim()
    );
    get(&token, "/api/v1/nodes");
    let image = link.server.sh_ok(&format!(
        "PADDOCK_API={HTTPS} PADDOCK_CA={} PADDOCK_CERT={} PADDOCK_KEY={} {} image show {}",
        certs.join("ca.pem").display(),
        certs.join("admin.pem").display(),
        certs.join("admin.key").display(),
        env!("CARGO_BIN_EXE_paddock"),
        expected["image"].as_str().unwrap()
    ));
    assert!(image.contains(" 0 missing)"), "{image}");
    let shown = link.server.sh_ok(&format!(
        "{} certs --config {} show",
        env!("CARGO_BIN_EXE_paddock"),
        app.config.display()
    ));
    assert!(
        shown.contains(expected["ca_fingerprint"].as_str().unwrap()),
        "{shown}"
    );
    app.stop();

    // The earlier release runs these statements at every open: on the migrated file they
    // are refused, with the reason.
    let open = std::fs::read_to_string(fixture("open.sql")).unwrap();
    let conn = rusqlite::Connection::open(data.join("store.db")).unwrap();
    let err = conn.execute_batch(&open).unwrap_err().to_string();
    assert!(err.contains("opened by a newer paddock"), "{err}");
    drop(conn);

    // Today's binary starts on it again: nothing more to migrate, no second backup.
    app.restart(&link.server);
    assert!(
        !app.log_text().contains("store: migrated"),
        "{}",
        app.log_text()
    );
    assert_eq!(std::fs::read_dir(data.join("backups")).unwrap().count(), 1);
    app.stop();
}
