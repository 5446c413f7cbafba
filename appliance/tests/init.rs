//! `paddock init` on a host whose provisioning network is a veth in a namespace: it finds
//! the interface, writes a configuration `paddock config check` accepts, makes the
//! certificates, and the appliance starts on it as written.

mod support;

use support::*;

#[test]
fn init_writes_a_configuration_the_appliance_serves_from() {
    require(&["curl"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = scratch.path("etc/paddock.toml");
    let assets = scratch.path("assets");
    std::fs::create_dir_all(&assets).unwrap();
    let init = format!(
        "{} init --config {} --data-dir {} --assets-dir {} --tftp-root /usr/lib/ipxe",
        env!("CARGO_BIN_EXE_paddock"),
        config.display(),
        scratch.path("data").display(),
        assets.display()
    );
    // A missing directory is named with the flag that changes it, and nothing is written.
    let missing = link.server.sh(&format!(
        "{} init --config {} --data-dir {} --assets-dir {}/nowhere < /dev/null",
        env!("CARGO_BIN_EXE_paddock"),
        config.display(),
        scratch.path("data").display(),
        assets.display()
    ));
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("nowhere does not exist") && err.contains("--assets-dir"),
        "{err}"
    );
    assert!(!config.exists());
    // No terminal and one interface with an address (the namespace's loopback does not count).
    let out = link.server.sh_ok(&format!("{init} < /dev/null"));
    assert!(
        out.contains(&format!("for {} 198.18.0.1/24", link.server_if)),
        "{out}"
    );
    assert!(out.contains("DHCP pool 198.18.0.128-198.18.0.254"), "{out}");
    assert!(
        out.contains("next: systemctl enable --now paddock"),
        "{out}"
    );
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.contains(&format!("interfaces = [\"{}\"]", link.server_if)),
        "{text}"
    );
    let check = link.server.sh_ok(&format!(
        "{} config check {}",
        env!("CARGO_BIN_EXE_paddock"),
        config.display()
    ));
    assert!(check.contains(": ok"), "{check}");
    // What `serve` would run with: the PADDOCK_* variables laid over the file.
    let overridden = link.server.sh_ok(&format!(
        "PADDOCK_PUBLIC_URL=http://198.18.0.9:8080 {} config check {}",
        env!("CARGO_BIN_EXE_paddock"),
        config.display()
    ));
    assert!(
        overridden.contains("(public http://198.18.0.9:8080)"),
        "{overridden}"
    );
    let certs = scratch.path("data/certs");
    for f in ["ca.pem", "host.pem", "admin.pem", "admin.key"] {
        assert!(certs.join(f).exists(), "{f} was not made");
    }

    // The operator's file is never replaced without --force.
    let again = link.server.sh(&format!("{init} < /dev/null"));
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("--force"),
        "{again:?}"
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), text);

    // It serves as written: DHCP on the interface, HTTPS with the CA init made.
    let mut app = Appliance::start_secure(&link.server, &scratch, &text);
    // The store `certs init` created was stamped with this release's schema from its first
    // key: nothing to migrate, no backup.
    assert!(
        !app.log_text().contains("store: migrated"),
        "{}",
        app.log_text()
    );
    assert!(!scratch.path("data/backups").exists());
    let health = link.server.sh_ok(&format!(
        "curl -sf -m 5 --cacert {} https://198.18.0.1:8443/healthz",
        certs.join("ca.pem").display()
    ));
    assert!(!health.trim().is_empty());
    let lease = udhcpc(&link, &scratch, "").expect("a lease from the pool init chose");
    let ip: std::net::Ipv4Addr = lease["ip"].parse().unwrap();
    assert!(ip >= std::net::Ipv4Addr::new(198, 18, 0, 128), "{lease:?}");
    assert_eq!(lease["serverid"], "198.18.0.1");
    app.stop();
}
