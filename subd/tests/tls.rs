//! The `paddock-subd` binary over mutual TLS: certificates from a CA made here
//! (`paddock_security::ca`), real TLS clients (ureq with `paddock_security::tls::ureq_tls`).
//!
//! - a dominator's certificate (`Subd.*`) polls, fetches from an `https://` object server
//!   (which subd calls with its own certificate) and updates;
//! - a certificate with only `Subd.Poll` polls, and its Update is a 403 naming the method
//!   and the user, with the tree unchanged; one without methods reaches `/healthz` only;
//! - no client certificate, a certificate from another CA, an expired one: no handshake;
//!   a client that does not trust subd's CA refuses subd;
//! - without `--ca`/`--cert`/`--key` and without `--insecure` subd does not start.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use paddock_security::ca::{self, Ca};
use paddock_security::tls;
use serde_json::json;
use support::*;
use time::{Duration as Days, OffsetDateTime};

const BIN: &str = env!("CARGO_BIN_EXE_paddock-subd");

/// A certificate and key written to `<dir>/<name>.{cert,key}.pem`.
struct Cert {
    cert: PathBuf,
    key: PathBuf,
    cert_pem: String,
    key_pem: String,
}

fn issue(
    dir: &Path,
    authority: &Ca,
    name: &str,
    methods: &[&str],
    now: OffsetDateTime,
    days: i64,
) -> Cert {
    let req = ca::Request {
        name: name.into(),
        methods: methods.iter().map(|m| m.to_string()).collect(),
        sans: vec!["127.0.0.1".into()],
        days,
        ..Default::default()
    };
    let issued = ca::issue(authority, &req, now).unwrap();
    let (cert, key) = (
        dir.join(format!("{name}.cert.pem")),
        dir.join(format!("{name}.key.pem")),
    );
    fs::write(&cert, &issued.cert_pem).unwrap();
    fs::write(&key, &issued.key_pem).unwrap();
    Cert {
        cert,
        key,
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    }
}

/// The CA (its PEM at `<dir>/ca.pem`) and subd's own certificate, which may fetch objects.
struct Pki {
    dir: PathBuf,
    ca: Ca,
    ca_file: PathBuf,
    subd: Cert,
}

impl Pki {
    fn new(dir: &Path) -> Self {
        let now = OffsetDateTime::now_utc();
        let authority = ca::new_ca("paddock-test-ca", now, 10).unwrap();
        let ca_file = dir.join("ca.pem");
        fs::write(&ca_file, &authority.cert_pem).unwrap();
        let subd = issue(
            dir,
            &authority,
            "subd-m1",
            &["ObjectServer.GetObjects"],
            now,
            2,
        );
        Pki {
            dir: dir.to_path_buf(),
            ca: authority,
            ca_file,
            subd,
        }
    }

    fn issue(&self, name: &str, methods: &[&str]) -> Cert {
        issue(
            &self.dir,
            &self.ca,
            name,
            methods,
            OffsetDateTime::now_utc(),
            2,
        )
    }

    /// An agent trusting `ca_pem`, presenting `cert` if given.
    fn agent_trusting(ca_pem: &str, cert: Option<&Cert>) -> ureq::Agent {
        let ours = cert.map(|c| (c.cert_pem.as_str(), c.key_pem.as_str()));
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls::ureq_tls(ca_pem, ours).unwrap())
            .build()
            .into()
    }

    fn agent(&self, cert: Option<&Cert>) -> ureq::Agent {
        Self::agent_trusting(&self.ca.cert_pem, cert)
    }
}

/// subd on `root` over TLS with `pki`'s material; killed when dropped.
struct Running {
    child: Child,
    url: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(root: &Path, pki: &Pki, log: &Path) -> Running {
    let mut cmd = Command::new(BIN);
    cmd.args(["--root", root.to_str().unwrap(), "--no-bind-root"])
        .args(["--listen", "127.0.0.1:0"])
        .args(["--ca", pki.ca_file.to_str().unwrap()])
        .args(["--cert", pki.subd.cert.to_str().unwrap()])
        .args(["--key", pki.subd.key.to_str().unwrap()])
        .args(["--no-default-exclusions", "--device-speed", "1073741824"])
        .args(["--link-speed", "1073741824", "--min-cycle-ms", "20"])
        .env("PADDOCK_LOG", "debug")
        .stderr(fs::File::create(log).unwrap());
    let (child, addr) = spawn_listening(&mut cmd);
    Running {
        child,
        url: format!("https://{addr}"),
    }
}

/// An image whose tree differs from the sub's: `etc/motd` changes, `app/new` arrives; its
/// objects in `store`.
fn old_and_new(root: &Path, want: &Path, store: &Path) -> paddock_image::Image {
    write(root, "etc/motd", b"old motd\n", 0o644);
    write(root, "etc/keep", b"same\n", 0o644);
    write(want, "etc/motd", b"new motd\n", 0o644);
    write(want, "etc/keep", b"same\n", 0o644);
    write(want, "app/new", &pattern(100_000, 7), 0o755);
    let scan = scan_tree(want);
    store_objects(want, &scan.fs, store);
    image_of("app.2", scan.fs, "[]")
}

/// An update to make over TLS: the sub at `root` and the image's tree at `want` (from
/// [`old_and_new`]), its objects in `store`, subd running on the sub with `pki`'s material,
/// and `dom`, a client with a certificate granting `Subd.*`.
struct Updating {
    root: PathBuf,
    want: PathBuf,
    store: PathBuf,
    image: paddock_image::Image,
    rt: tokio::runtime::Runtime,
    pki: Pki,
    subd: Running,
    dom: Client,
    // Last, so subd is stopped before its directories go.
    _dir: tempfile::TempDir,
}

fn updating() -> Updating {
    let (d, root, want, store) = dirs();
    let pki = Pki::new(d.path());
    let image = old_and_new(&root, &want, &store);
    let subd = start(&root, &pki, &d.path().join("subd.log"));
    let dominator = pki.issue("dominator", &["Subd.*"]);
    let dom = Client::with_agent(&subd.url, "dom", pki.agent(Some(&dominator)));
    Updating {
        root,
        want,
        store,
        image,
        rt: runtime(),
        pki,
        subd,
        dom,
        _dir: d,
    }
}

#[test]
fn a_dominator_certificate_polls_fetches_over_tls_and_updates() {
    let u = updating();
    // The object server trusts the same CA and wants ObjectServer.GetObjects.
    let server_cert = u.pki.issue("objectserver", &[]);
    let material = tls::Material {
        ca_pem: u.pki.ca.cert_pem.clone(),
        cert_pem: server_cert.cert_pem.clone(),
        key_pem: server_cert.key_pem.clone(),
    };
    let config = tls::server_config(&material, tls::ClientAuth::Required).unwrap();
    let (server, objects) = object_server_with(&u.rt, &u.store, Some(config));

    // A bare host:port is https:// for a subd with TLS material.
    let req = plan_with_fetch(&u.dom, &u.image, &server);
    // One request per fetch stream, every one made as subd's certificate.
    let callers = objects.callers.lock().unwrap().clone();
    assert!(
        !callers.is_empty() && callers.iter().all(|c| c == "subd-m1"),
        "{callers:?}"
    );
    let report = u
        .dom
        .ok("Subd.Update", &serde_json::to_value(&req).unwrap());
    assert!(report["error"].is_null(), "{report}");
    u.dom.fresh_scan();
    assert_same_dirs(&u.root, &u.want);
}

#[test]
fn a_certificate_without_subd_update_cannot_update() {
    let Updating {
        root,
        store,
        image,
        rt,
        pki,
        subd,
        dom,
        ..
    } = &updating();
    let (server, _) = object_server(rt, store);
    // Planned and fetched by the dominator (plain http:// to the object server, named so),
    // so the Update refused below is one that would change the tree.
    let req = plan_with_fetch(dom, image, &format!("http://{server}"));
    let before = dom.fresh_scan().file_system.unwrap();

    let watcher = pki.issue("alice", &["Subd.Poll"]);
    let alice = Client::with_agent(&subd.url, "alice", pki.agent(Some(&watcher)));
    assert!(alice.poll(0).file_system.is_some());
    let (status, v) = alice.call("Subd.Update", &serde_json::to_value(&req).unwrap());
    assert_eq!(status, 403, "{v}");
    assert_eq!(
        message(&v),
        r#"access to method Subd.Update denied to "alice""#
    );
    // Refused calls one after another: each refusal closes its connection (the body is
    // not read) and says so, so the next call is never sent on a closing connection.
    let methods = [
        "Subd.Fetch",
        "Subd.Cleanup",
        "Subd.SetConfiguration",
        "Subd.Nonexistent",
    ];
    for method in methods.iter().cycle().take(20) {
        let (status, v) = alice.call(method, &json!({}));
        assert_eq!(status, 403, "{method}: {v}");
        assert_eq!(
            message(&v),
            format!(r#"access to method {method} denied to "alice""#)
        );
    }
    // Nothing changed: the next full scan is the tree from before, the file still old.
    let after = dom.fresh_scan().file_system.unwrap();
    assert_same_tree(&after, &before);
    assert_eq!(fs::read(root.join("etc/motd")).unwrap(), b"old motd\n");
    assert!(!root.join("app/new").exists());

    // A certificate granting nothing reaches /healthz and nothing else.
    let nobody = pki.issue("nobody", &[]);
    let agent = pki.agent(Some(&nobody));
    let health = agent.get(format!("{}/healthz", subd.url)).call().unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let (status, v) = Client::with_agent(&subd.url, "nobody", agent).call("Subd.Poll", &json!({}));
    assert_eq!(status, 403, "{v}");
    assert_eq!(
        message(&v),
        r#"access to method Subd.Poll denied to "nobody""#
    );

    // The dominator still updates.
    dom.ok("Subd.Update", &serde_json::to_value(&req).unwrap());
    assert_eq!(fs::read(root.join("etc/motd")).unwrap(), b"new motd\n");
}

#[test]
fn no_certificate_another_ca_or_an_expired_one_gets_no_handshake() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    fs::create_dir(&root).unwrap();
    let pki = Pki::new(d.path());
    let log = d.path().join("subd.log");
    let subd = start(&root, &pki, &log);
    // subd's reason for a refused handshake, from its log (the client may see only the
    // connection closed).
    let refused_for = |reason: &str| {
        wait_until(&format!("subd refusing a handshake: {reason}"), || {
            fs::read_to_string(&log)
                .unwrap()
                .lines()
                .any(|l| l.contains("TLS handshake refused") && l.contains(reason))
        })
    };
    let poll = |agent: &ureq::Agent| {
        agent
            .post(format!("{}/rpc/Subd.Poll", subd.url))
            .send_json(json!({}))
            .map(|r| r.status().as_u16())
    };

    let good = pki.issue("dominator", &["Subd.*"]);
    assert_eq!(poll(&pki.agent(Some(&good))).unwrap(), 200);

    // No client certificate.
    let e = poll(&pki.agent(None)).unwrap_err();
    assert!(is_tls_failure(&e), "{e}");
    refused_for("peer sent no certificates");

    // A certificate from another CA (with the right methods and name).
    let now = OffsetDateTime::now_utc();
    let other = ca::new_ca("paddock-test-ca", now, 10).unwrap();
    let other_dir = d.path().join("other");
    fs::create_dir(&other_dir).unwrap();
    let stranger = issue(&other_dir, &other, "dominator", &["Subd.*"], now, 2);
    let e = poll(&pki.agent(Some(&stranger))).unwrap_err();
    assert!(is_tls_failure(&e), "{e}");
    // Same issuer name, another key.
    refused_for("invalid peer certificate: BadSignature");

    // An expired certificate from the right CA: valid for a day, ten days ago.
    let old = issue(
        &other_dir,
        &pki.ca,
        "expired",
        &["Subd.*"],
        now - Days::days(10),
        1,
    );
    let e = poll(&pki.agent(Some(&old))).unwrap_err();
    assert!(is_tls_failure(&e), "{e}");
    refused_for("certificate expired");

    // A client that does not trust subd's CA refuses subd (with a good certificate).
    let e = poll(&Pki::agent_trusting(&other.cert_pem, Some(&good))).unwrap_err();
    assert!(
        matches!(&e, ureq::Error::Io(io) if io.to_string().contains("BadSignature")),
        "{e:?}"
    );

    // Plain HTTP to the TLS port gets no answer either.
    let plain = agent().post(format!(
        "{}/rpc/Subd.Poll",
        subd.url.replace("https", "http")
    ));
    assert!(plain.send_json(json!({})).is_err());

    // And subd still serves the good one.
    assert_eq!(poll(&pki.agent(Some(&good))).unwrap(), 200);
}

/// A refused handshake: rustls's own error, or the connection closed by the peer's alert.
fn is_tls_failure(e: &ureq::Error) -> bool {
    matches!(e, ureq::Error::Rustls(_) | ureq::Error::Io(_))
}

#[test]
fn refuses_to_start_without_tls_material_unless_insecure() {
    let d = tempfile::tempdir().unwrap();
    let pki = Pki::new(d.path());
    let root = d.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["--root", root, "--no-bind-root", "--listen", "127.0.0.1:0"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&[]);
    assert!(
        err.contains("refusing to start without TLS")
            && err.contains("--ca FILE --cert FILE --key FILE")
            && err.contains("--insecure"),
        "{err}"
    );
    let ca_file = pki.ca_file.to_str().unwrap();
    let err = run(&["--ca", ca_file, "--cert", pki.subd.cert.to_str().unwrap()]);
    assert!(err.contains("all three of --ca, --cert and --key"), "{err}");
    let key = pki.subd.key.to_str().unwrap();
    let cert = pki.subd.cert.to_str().unwrap();
    let err = run(&["--insecure", "--ca", ca_file, "--cert", cert, "--key", key]);
    assert!(err.contains("exclude each other"), "{err}");
    // A file that is not what it should be is named.
    let err = run(&["--ca", key, "--cert", cert, "--key", key]);
    assert!(err.contains(key) && err.contains("no certificate"), "{err}");
    let err = run(&[
        "--ca",
        ca_file,
        "--cert",
        cert,
        "--key",
        "/nonexistent/key.pem",
    ]);
    assert!(err.contains("/nonexistent/key.pem"), "{err}");
    let out = Command::new(BIN).arg("--bogus").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument --bogus"));

    // --insecure starts, and says so before anything else.
    let log = d.path().join("insecure.log");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--root",
        root,
        "--no-bind-root",
        "--listen",
        "127.0.0.1:0",
        "--insecure",
    ])
    .stderr(fs::File::create(&log).unwrap());
    let (mut child, addr) = spawn_listening(&mut cmd);
    let health = agent()
        .get(format!("http://{addr}/healthz"))
        .call()
        .unwrap();
    assert!([200, 503].contains(&health.status().as_u16()));
    child.kill().unwrap();
    child.wait().unwrap();
    let err = fs::read_to_string(&log).unwrap();
    assert!(
        err.lines()
            .next()
            .is_some_and(|l| l.contains("WARNING: --insecure") && l.contains("every method open")),
        "{err}"
    );
}
