//! The boot network is untrusted: whoever can PXE-boot and reach the boot port may speak
//! for one machine (the MAC its boot script's token was minted for) and nothing else, and
//! cannot hold the listeners or a browser's credentials. Each test plays that attacker
//! against the real `paddock serve` with TLS on, with curl and raw sockets in namespaces.

mod support;

use std::time::Instant;

use support::*;

const HTTPS: &str = "https://198.18.0.1:8443";
/// The attacker's machine: it fetched a boot script, so it holds a token for this MAC.
const MINE: &str = "52:54:00:77:00:01";
/// Another machine, enrolled by the operator.
const VICTIM: &str = "52:54:00:77:00:02";
/// A machine whose node is named `next`, like the route `provision/next`.
const NEXT: &str = "52:54:00:77:00:03";

struct Lab {
    link: Link,
    scratch: Scratch,
    app: Appliance,
    /// curl's arguments for the admin certificate.
    admin: String,
    /// curl's arguments for the CA alone.
    anonymous: String,
}

fn lab(extra: &str) -> Lab {
    lab_with(|_| "[dhcp]\nenabled = false\n".into(), extra)
}

/// A lab whose `[dhcp]` table `dhcp` writes (given the link).
fn lab_with(dhcp: impl Fn(&Link) -> String, extra: &str) -> Lab {
    require(&["curl", "python3"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n{}\
         [tftp]\nenabled = false\n[boot.discovery]\nkernel = \"{PUBLIC_URL}/boot/assets/vmlinuz\"\n\
         initrd = \"{PUBLIC_URL}/boot/assets/initrd.img\"\n[inspector]\nauto_enrol = true\n{extra}",
        scratch.path("data").display(),
        dhcp(&link)
    );
    let path = scratch.path("paddock.toml");
    std::fs::write(&path, &config).unwrap();
    link.server.sh_ok(&format!(
        "{} certs --config {} init",
        env!("CARGO_BIN_EXE_paddock"),
        path.display()
    ));
    let app = Appliance::start_secure(&link.server, &scratch, &config);
    let certs = scratch.path("data/certs");
    let anonymous = format!("--cacert {}", certs.join("ca.pem").display());
    let admin = format!(
        "{anonymous} --cert {} --key {}",
        certs.join("admin.pem").display(),
        certs.join("admin.key").display()
    );
    Lab {
        link,
        scratch,
        app,
        admin,
        anonymous,
    }
}

impl Lab {
    /// `curl -i` over HTTPS from the server's namespace; `args` carries the credentials,
    /// headers and body.
    fn call(&self, method: &str, path: &str, args: &str) -> Resp {
        curl(
            &self.link.server,
            &format!("curl -s -i -m 20 -X {method} {args} '{HTTPS}{path}'"),
        )
    }

    /// A JSON call with `auth`.
    fn json(&self, auth: &str, method: &str, path: &str, body: &str) -> Resp {
        let f = self.scratch.path(&format!("body-{}", rand_name()));
        std::fs::write(&f, body).unwrap();
        self.call(
            method,
            path,
            &format!(
                "{auth} -H 'Content-Type: application/json' --data-binary @{}",
                f.display()
            ),
        )
    }

    /// The token the boot script for `mac` carries, as a curl argument.
    fn token_for(&self, mac: &str) -> String {
        let script = self.link.server.sh_ok(&format!(
            "curl -sf {PUBLIC_URL}/boot/{}.ipxe",
            mac.replace(':', "-")
        ));
        let token = script
            .split_whitespace()
            .find_map(|w| w.strip_prefix("paddock.token="))
            .unwrap_or_else(|| panic!("no token in\n{script}"));
        format!("{} -H 'Authorization: Bearer {token}'", self.anonymous)
    }

    /// A new operator token (through the running appliance's API); `grant` is `--role R`
    /// or `--methods M`.
    fn operator_token(&self, name: &str, grant: &str) -> String {
        self.link
            .server
            .sh_ok(&format!(
                "{} certs --config {} token {name} {grant} --days 1",
                env!("CARGO_BIN_EXE_paddock"),
                self.scratch.path("paddock.toml").display()
            ))
            .trim()
            .to_string()
    }

    fn node(&self, name: &str) -> serde_json::Value {
        let r = self.call("GET", &format!("/api/v1/nodes/{name}"), &self.admin);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    fn create_node(&self, name: &str, mac: &str) -> String {
        let r = self.json(
            &self.admin,
            "POST",
            "/api/v1/nodes",
            &format!(r#"{{"name":"{name}","macs":["{mac}"]}}"#),
        );
        assert!(r.status < 300, "{} {}", r.status, r.body);
        r.json()["uuid"].as_str().unwrap().to_string()
    }
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::SeqCst).to_string()
}

#[test]
fn a_token_speaks_for_its_own_machine_alone() {
    let lab = lab("");
    let victim = lab.create_node("victim", VICTIM);
    lab.create_node("next", NEXT);
    let mine = lab.token_for(MINE);
    let refused = |r: &Resp, what: &str| {
        assert_eq!(r.status, 403, "{what}: {}", r.body);
        assert!(r.body.contains("agent token"), "{what}: {}", r.body);
    };

    // provision/next answers for the token's MAC only, whatever list the body sends: the
    // victim's answer (and with it a subd certificate) is out of reach.
    let next = lab.json(
        &mine,
        "POST",
        "/api/v1/provision/next",
        &format!(r#"{{"macs":["{VICTIM}","{MINE}"]}}"#),
    );
    assert_eq!(next.status, 200, "{}", next.body);
    assert!(next.json()["node"].is_null(), "{}", next.body);
    assert!(!next.body.contains(&victim) && !next.body.contains("subd_trust"));

    // A node's routes, by name, encoded name, UUID, or a node named like a route.
    let report = r#"{"event":{"event":"clean_done"}}"#;
    for path in [
        "/api/v1/provision/victim/report",
        "/api/v1/provision/%76ictim/report",
        "/api/v1/provision/next/report",
        &format!("/api/v1/provision/{victim}/report"),
    ] {
        refused(&lab.json(&mine, "POST", path, report), path);
    }
    let register = r#"{"address":"198.18.0.66"}"#;
    for path in [
        "/api/v1/provision/%76ictim/register",
        "/api/v1/provision/next/register",
    ] {
        refused(&lab.json(&mine, "POST", path, register), path);
    }
    for path in [
        "/api/v1/provision/%76ictim",
        "/api/v1/agent/%76ictim/next",
        "/api/v1/agent/next/next",
        "/api/v1/agent/nobody/next",
    ] {
        refused(&lab.call("GET", path, &mine), path);
    }
    // A timeline entry for another machine.
    let event = |mac: &str| format!(r#"{{"mac":"{mac}","step":"x","message":"hello"}}"#);
    refused(
        &lab.json(&mine, "POST", "/api/v1/agent/events", &event(VICTIM)),
        "events",
    );
    assert_eq!(
        lab.json(&mine, "POST", "/api/v1/agent/events", &event(MINE))
            .status,
        204
    );

    // /v1/continue: the victim is under introspection; an inventory listing the victim's
    // MAC beside the token's enrols the token's machine on its own, and takes nothing.
    let start = lab.call(
        "POST",
        "/v1/introspection/victim?manage_boot=false",
        &lab.admin,
    );
    assert_eq!(start.status, 202, "{}", start.body);
    let inv = |macs: &[&str]| inventory(macs, 2, 2048, &[20]).to_string();
    let took = lab.json(&mine, "POST", "/v1/continue", &inv(&[MINE, VICTIM]));
    assert_eq!(took.status, 200, "{}", took.body);
    let mine_uuid = took.json()["uuid"].as_str().unwrap().to_string();
    assert_ne!(mine_uuid, victim, "the victim's node was taken over");
    let v = lab.node("victim");
    assert_eq!(v["macs"], serde_json::json!([VICTIM]), "{v}");
    assert_eq!(
        lab.node(&mine_uuid)["macs"],
        serde_json::json!([MINE]),
        "agent data adds no MAC but the token's"
    );
    // An inventory that does not list the token's MAC at all.
    refused(
        &lab.json(&mine, "POST", "/v1/continue", &inv(&[VICTIM])),
        "continue without the token's MAC",
    );
    // The victim's boot script is still the victim's: nothing moved to MINE.
    let script = lab.link.server.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/boot/52-54-00-77-00-01.ipxe"
    ));
    assert!(!script.contains("victim"), "{script}");
    drop(lab.app);
}

#[test]
fn a_browser_cannot_be_made_to_call_for_its_operator() {
    let lab = lab("");
    lab.create_node("victim", VICTIM);
    let state = || {
        lab.call("GET", "/api/v1/nodes/victim/provisioning", &lab.admin)
            .body
    };
    let before = state();
    // A page on another site posts a form through a browser that holds the admin
    // certificate: refused, nothing done.
    let evil = "-H 'Origin: https://evil.example'";
    for (what, args) in [
        ("a form", format!("{evil} --data-urlencode x=1")),
        (
            "JSON from another site",
            format!("{evil} -H 'Content-Type: application/json' -d '{{}}'"),
        ),
        (
            "JSON, Sec-Fetch-Site cross-site",
            "-H 'Sec-Fetch-Site: cross-site' -H 'Content-Type: application/json' -d '{}'".into(),
        ),
        (
            "text/plain from our own origin",
            "-H 'Content-Type: text/plain' -d '{}'".into(),
        ),
    ] {
        let r = lab.call(
            "POST",
            "/api/v1/nodes/victim/clean",
            &format!("{} {args}", lab.admin),
        );
        assert_eq!(r.status, 403, "{what}: {}", r.body);
    }
    assert_eq!(state(), before, "a refused call changed the node");
    // Every answer forbids framing and sniffing.
    let page = lab.call("GET", "/ui", &lab.admin);
    assert_eq!(
        page.header("content-security-policy"),
        Some("frame-ancestors 'none'")
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));

    // The console's cookie: the same.
    let token = lab.operator_token("ops", "--role admin");
    let login = |args: &str, url: &str| {
        curl(
            &lab.link.server,
            &format!(
                "curl -s -i -m 10 {} {args} -X POST --data-urlencode token={token} '{url}/ui/login'",
                lab.anonymous
            ),
        )
    };
    assert_eq!(
        login(evil, HTTPS).status,
        403,
        "a sign-in from another site"
    );
    assert_eq!(
        login("", PUBLIC_URL).status,
        403,
        "a sign-in on plain HTTP would send the token in clear"
    );
    let ok = login("-H 'Origin: https://198.18.0.1:8443'", HTTPS);
    assert_eq!(ok.status, 303, "{}", ok.body);
    let cookie = ok
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let rules = || lab.call("GET", "/v1/rules", &lab.admin).body;
    let rules_before = rules();
    let rule = r#"{"description":"x","conditions":[],"actions":[{"action":"fail","message":"x"}]}"#;
    let with_cookie = |ct: &str| {
        let f = lab.scratch.path("rule.json");
        std::fs::write(&f, rule).unwrap();
        lab.call(
            "POST",
            "/v1/rules",
            &format!(
                "{} -H 'Cookie: {cookie}' -H 'Content-Type: {ct}' --data-binary @{}",
                lab.anonymous,
                f.display()
            ),
        )
    };
    let r = with_cookie("text/plain");
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(rules(), rules_before, "a text/plain post created a rule");
    // The same token sent on purpose (an Authorization header) is no browser's doing.
    let r = lab.call(
        "POST",
        "/v1/rules",
        &format!(
            "{} -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' -d '{rule}'",
            lab.anonymous
        ),
    );
    assert!(r.status < 300, "{} {}", r.status, r.body);
    drop(lab.app);
}

/// Holds `count` TCP connections to the boot port from `ns` without sending a byte; prints
/// how many the server had closed after `hold` seconds.
const HOLDER: &str = r#"
import socket, sys, time
count, hold = int(sys.argv[1]), float(sys.argv[2])
socks, failed, t0 = [], 0, time.time()
for _ in range(count):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("198.18.0.1", 8080))
        socks.append(s)
    except OSError:
        failed += 1
    if len(socks) == 1100:
        print("opened 1100", flush=True)
print("failed", failed, "in", round(time.time() - t0, 1), "s", flush=True)
print("connected", len(socks), flush=True)
time.sleep(hold)
closed = 0
for s in socks:
    s.setblocking(False)
    try:
        if s.recv(1) == b"":
            closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print("closed", closed, flush=True)
"#;

/// Sends a body of 1 MB at one byte a second over HTTPS; prints the seconds until the
/// server answered or closed.
const SLOW_BODY: &str = r#"
import socket, ssl, sys, time
ctx = ssl.create_default_context(cafile=sys.argv[1])
s = ctx.wrap_socket(socket.create_connection(("198.18.0.1", 8443)), server_hostname="198.18.0.1")
s.sendall(b"POST /ui/login HTTP/1.1\r\nHost: 198.18.0.1:8443\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000000\r\n\r\n")
t0 = time.time()
s.settimeout(1)
while time.time() - t0 < 60:
    try:
        s.sendall(b"t")
    except OSError:
        break
    try:
        if s.recv(4096) is not None:
            break
    except socket.timeout:
        pass
    except OSError:
        break
print("cut_after", round(time.time() - t0, 1), flush=True)
"#;

#[test]
fn one_source_cannot_hold_the_listeners() {
    // The default header timeout (10 s): a silent connection is held that long.
    let lab = lab("");
    lab.link.give_client_static_address();
    let holder = lab.scratch.path("holder.py");
    std::fs::write(&holder, HOLDER).unwrap();
    let log = lab.scratch.path("holder.log");
    let mut held = lab
        .link
        .client
        .spawn(&format!("python3 {} 2000 12", holder.display()), &log);
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("opened 1100")) {
        assert!(
            t0.elapsed().as_secs() < 60,
            "1,100 connections not opened in 60 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Another source's boot script while one source opens 1,100 connections (it holds its
    // share of 128; the rest are closed at accept).
    let t0 = Instant::now();
    let out = lab.link.server.sh_ok(&format!(
        "curl -sf -m 5 -o /dev/null -w '%{{http_code}}' {PUBLIC_URL}/boot/52-54-00-77-00-09.ipxe"
    ));
    let took = t0.elapsed();
    assert_eq!(out.trim(), "200");
    println!(
        "another source's boot script: {took:?} while one source had opened 1,100 connections"
    );
    assert!(took.as_secs_f64() < 1.0, "served in {took:?}");
    let _ = held.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    println!("{}", text.trim());
    let num = |key: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|n| n.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no {key} in {text}"))
    };
    // Every one is closed: beyond the source's share at accept, the rest when no
    // headers came within the header timeout (hyper's own timer never starts for them).
    assert_eq!(num("closed"), num("connected"), "{text}");

    // A body trickled at a byte a second is cut soon after its grace.
    let slow = lab.scratch.path("slow.py");
    std::fs::write(&slow, SLOW_BODY).unwrap();
    let out = lab.link.client.sh_ok(&format!(
        "python3 {} {}",
        slow.display(),
        lab.scratch.path("data/certs/ca.pem").display()
    ));
    let secs: f64 = out
        .trim()
        .strip_prefix("cut_after ")
        .unwrap_or_else(|| panic!("{out}"))
        .parse()
        .unwrap();
    println!("a body at 1 byte/s was cut after {secs} s");
    // The grace is the header timeout (10 s); a byte a second earns almost nothing more.
    assert!(secs < 15.0, "held for {secs} s");
    drop(lab.app);
}

#[test]
fn secrets_at_rest_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mut lab = lab("");
    let mode = |p: &str| {
        std::fs::metadata(lab.scratch.path(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("data"), 0o700);
    assert_eq!(mode("data/store.db"), 0o600);
    assert_eq!(mode("data/certs/host.key"), 0o600);
    lab.app.stop();
    let key = lab.scratch.path("data/certs/host.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = lab.link.server.sh(&format!(
        "timeout 20 {} serve --config {}",
        env!("CARGO_BIN_EXE_paddock"),
        lab.scratch.path("paddock.toml").display()
    ));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600"), "{err}");
}

#[test]
fn a_flood_of_refusals_cannot_push_out_the_operators_history() {
    let lab = lab("");
    lab.create_node("kept", VICTIM);
    let viewer = lab.operator_token("viewer", "--role read-only");
    // An agent's write is audited as the agent's.
    let mine = lab.token_for(MINE);
    let inv = inventory(&[MINE], 2, 2048, &[20]).to_string();
    assert_eq!(
        lab.json(&mine, "POST", "/v1/continue", &inv).status,
        200,
        "enrolment"
    );
    // A thousand refused calls by a known caller, as fast as curl makes them.
    let t0 = Instant::now();
    lab.link.server.sh_ok(&format!(
        "curl -s -o /dev/null {} -H 'Authorization: Bearer {viewer}' -X DELETE '{HTTPS}/v1/rules?[1-1000]'",
        lab.anonymous
    ));
    println!("1,000 refused calls in {:?}", t0.elapsed());
    let log = lab
        .call("GET", "/api/v1/audit?limit=10000", &lab.admin)
        .json();
    let entries = log.as_array().unwrap();
    let refusals: Vec<_> = entries
        .iter()
        .filter(|e| e["who"] == "viewer" && e["method"] == "Rules.DeleteAll")
        .collect();
    let counted: u64 = refusals.iter().map(|e| e["count"].as_u64().unwrap()).sum();
    println!(
        "audit: {} entries in all; the refusals are {} entries counting {counted}",
        entries.len(),
        refusals.len()
    );
    assert_eq!(counted, 1000, "{refusals:?}");
    assert!(refusals.len() <= 2, "one entry a minute: {refusals:?}");
    assert!(
        entries
            .iter()
            .any(|e| e["who"] == "admin" && e["method"] == "Nodes.Create"),
        "the operator's entry is gone"
    );
    assert!(
        entries.iter().any(|e| e["who"] == format!("agent:{MINE}")
            && e["method"] == "Introspection.Continue"
            && e["status"] == 200),
        "the agent's write is not audited: {entries:?}"
    );
    drop(lab.app);
}

#[test]
fn a_subd_certificate_cannot_stand_in_for_the_appliance() {
    require(&["openssl", "tar"]);
    let lab = lab("");
    lab.link.give_client_static_address();
    let certs = lab.scratch.path("data/certs");
    let cli = |args: &str| {
        lab.link.server.sh(&format!(
            "PADDOCK_API={HTTPS} PADDOCK_CA={c}/ca.pem PADDOCK_CERT={c}/admin.pem \
             PADDOCK_KEY={c}/admin.key {} {args}",
            env!("CARGO_BIN_EXE_paddock"),
            c = certs.display()
        ))
    };
    // A tiny image, and a machine whose node is named like the appliance's own address (a
    // naming rule fed by what machines report could do that).
    let root = lab.scratch.path("root");
    sh_ok(&format!(
        "mkdir -p {r}/etc {r}/tmp && echo hi > {r}/etc/motd && tar -C {r} -cf {r}.tar etc tmp",
        r = root.display()
    ));
    let add = cli(&format!("image add test/a {}.tar", root.display()));
    assert!(add.status.success(), "{add:?}");
    lab.create_node("127.0.0.1", MINE);
    let p = lab.json(
        &lab.admin,
        "POST",
        "/api/v1/nodes/127.0.0.1/provision",
        r#"{"image":"test/a"}"#,
    );
    assert_eq!(p.status, 200, "{}", p.body);
    // The machine's ramdisk asks what to do, from its own address, 198.18.0.50.
    let token = lab.token_for(MINE);
    let body = lab.scratch.path("next.json");
    std::fs::write(&body, format!(r#"{{"macs":["{MINE}"]}}"#)).unwrap();
    let next = curl(
        &lab.link.client,
        &format!(
            "curl -s -i -m 20 {token} -H 'Content-Type: application/json' --data-binary @{} \
             -X POST '{HTTPS}/api/v1/provision/next'",
            body.display()
        ),
    );
    assert_eq!(next.status, 200, "{}", next.body);
    let trust = &next.json()["subd_trust"];
    let file = |name: &str, key: &str| {
        let p = lab.scratch.path(name);
        std::fs::write(&p, trust[key].as_str().unwrap()).unwrap();
        p
    };
    let (cert, key, clients) = (
        file("subd.pem", "cert_pem"),
        file("subd.key", "key_pem"),
        file("clients.pem", "client_ca_pem"),
    );
    let text = sh_ok(&format!("openssl x509 -noout -text -in {}", cert.display()));
    assert!(text.contains("IP Address:198.18.0.50"), "{text}");
    assert!(
        !text.contains("127.0.0.1")
            && !text.contains("198.18.0.1,")
            && !text.contains("198.18.0.1\n"),
        "the certificate names the appliance:\n{text}"
    );
    // The machine serves with it on its address: a client of the appliance refuses it.
    let server_log = lab.scratch.path("s_server.log");
    let mut server = lab.link.client.spawn(
        &format!(
            "openssl s_server -accept 198.18.0.50:9443 -cert {} -key {} -www -naccept 10",
            cert.display(),
            key.display()
        ),
        &server_log,
    );
    let url = "https://198.18.0.50:9443";
    wait_for("the impostor to listen", || {
        lab.link
            .server
            .sh(&format!("curl -s -k -o /dev/null {url}"))
            .status
            .success()
    });
    // It is a working TLS server for whoever trusts the subd CA (the dominator; `certs
    // init` wrote it beside ca.pem) ...
    for roots in [clients, certs.join("subd-ca.pem")] {
        lab.link.server.sh_ok(&format!(
            "curl -sf -o /dev/null --cacert {} {url}",
            roots.display()
        ));
    }
    // ... and not the appliance for curl with the appliance's CA, nor for the CLI.
    let c = lab.link.server.sh(&format!(
        "curl -s -o /dev/null --cacert {}/ca.pem {url}",
        certs.display()
    ));
    assert_eq!(
        c.status.code(),
        Some(60),
        "curl accepted a subd certificate"
    );
    let out = lab.link.server.sh(&format!(
        "PADDOCK_API={url} PADDOCK_CA={c}/ca.pem PADDOCK_CERT={c}/admin.pem \
         PADDOCK_KEY={c}/admin.key {} audit",
        env!("CARGO_BIN_EXE_paddock"),
        c = certs.display()
    ));
    assert!(!out.status.success(), "the CLI accepted a subd certificate");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let _ = server.kill();
    let _ = server.wait();
    drop(lab.app);
}

#[test]
fn a_token_is_never_issued_with_more_than_its_issuer_holds() {
    let lab = lab("");
    let minter = lab.operator_token("minter", "--methods Tokens.Create,Nodes.Get");
    let auth = format!("{} -H 'Authorization: Bearer {minter}'", lab.anonymous);
    let ask = |methods: &str| {
        lab.json(
            &auth,
            "POST",
            "/api/v1/tokens",
            &format!(r#"{{"name":"made","methods":"{methods}","days":1}}"#),
        )
    };
    for more in ["*.*", "Nodes.*", "Nodes.Get,Nodes.Patch", "Tokens.*"] {
        let r = ask(more);
        assert_eq!(r.status, 403, "{more}: {}", r.body);
        assert!(r.body.contains("more than its issuer"), "{}", r.body);
    }
    assert_eq!(ask("Nodes.Get").status, 201);
    let names = lab.call("GET", "/api/v1/tokens", &lab.admin).body;
    assert_eq!(names.matches("\"made\"").count(), 1, "{names}");
    drop(lab.app);
}

#[test]
fn an_agent_token_is_claimed_once_and_can_be_voided() {
    let lab = lab("");
    lab.link.give_client_static_address();
    lab.create_node("mine", MINE);
    // Under introspection, so that its boot script boots the ramdisk with a token.
    let start = lab.call(
        "POST",
        "/v1/introspection/mine?manage_boot=false",
        &lab.admin,
    );
    assert_eq!(start.status, 202, "{}", start.body);
    let events = |ns: &Ns, auth: &str| {
        let f = lab.scratch.path(&format!("event-{}", rand_name()));
        std::fs::write(
            &f,
            format!(r#"{{"mac":"{MINE}","step":"x","message":"m"}}"#),
        )
        .unwrap();
        curl(
            ns,
            &format!(
                "curl -s -i -m 10 {auth} -H 'Content-Type: application/json' --data-binary @{} \
                 -X POST '{HTTPS}/api/v1/agent/events'",
                f.display()
            ),
        )
    };
    // The first caller claims the token; the same token from another address is refused,
    // and the machine's timeline says so.
    let token = lab.token_for(MINE);
    assert_eq!(events(&lab.link.server, &token).status, 204);
    assert_eq!(events(&lab.link.server, &token).status, 204);
    let stolen = events(&lab.link.client, &token);
    assert_eq!(stolen.status, 401, "{}", stolen.body);
    assert!(
        stolen.body.contains("claimed by 198.18.0.1"),
        "{}",
        stolen.body
    );
    let page = lab.call("GET", "/ui/nodes/mine", &lab.admin).body;
    assert!(page.contains("agent-token-conflict"), "{page}");

    let certs = |args: &str| {
        lab.link.server.sh_ok(&format!(
            "{} certs --config {} {args}",
            env!("CARGO_BIN_EXE_paddock"),
            lab.scratch.path("paddock.toml").display()
        ))
    };
    // Revoked for the node: every token minted so far is void; a new boot's works.
    let before = lab.token_for(MINE);
    // Revocation voids tokens minted at or before its millisecond: step past it.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert!(certs("revoke-agent mine").contains("52:54:00:77:00:01"));
    for t in [&token, &before] {
        let r = events(&lab.link.server, t);
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(r.body.contains("revoked"), "{}", r.body);
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    let fresh = lab.token_for(MINE);
    assert_eq!(events(&lab.link.server, &fresh).status, 204);
    // A new signing key: every outstanding token is void, new ones work.
    assert!(certs("rotate-agent-key").contains("rotated"));
    let r = events(&lab.link.server, &fresh);
    assert_eq!(r.status, 401, "{}", r.body);
    let after = lab.token_for(MINE);
    assert_eq!(events(&lab.link.server, &after).status, 204);
    drop(lab.app);
}

#[test]
fn a_boot_script_carries_a_token_only_to_the_machines_lease() {
    require(&["busybox"]);
    let lab = lab_with(
        |link| {
            format!(
                "[dhcp]\nenabled = true\ninterfaces = [\"{}\"]\n[[dhcp.subnets]]\n\
                 network = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.199\"]\n\
                 routers = [\"{SERVER_IP}\"]\nlease_time = 3600\n",
                link.server_if
            )
        },
        "",
    );
    let (link, scratch) = (&lab.link, &lab.scratch);
    let mac = link
        .client
        .sh_ok(&format!("cat /sys/class/net/{}/address", link.client_if))
        .trim()
        .to_string();
    let lease = udhcpc(link, scratch, "").expect("a lease");
    let ip = lease["ip"].clone();
    link.client
        .sh_ok(&format!("ip addr add {ip}/24 dev {}", link.client_if));
    let script = |ns: &Ns| {
        ns.sh_ok(&format!(
            "curl -sf {PUBLIC_URL}/boot/{}.ipxe",
            mac.replace(':', "-")
        ))
    };
    // Fetched by another host on the network: the script boots, but carries no token.
    let elsewhere = script(&link.server);
    assert!(elsewhere.contains("#!ipxe"), "{elsewhere}");
    assert!(!elsewhere.contains("paddock.token="), "{elsewhere}");
    // Fetched from the lease's address: a token, and it works from there.
    let own = script(&link.client);
    let token = own
        .split_whitespace()
        .find_map(|w| w.strip_prefix("paddock.token="))
        .unwrap_or_else(|| panic!("no token for the lease's address:\n{own}"))
        .to_string();
    let ca = scratch.path("data/certs/ca.pem");
    let call = |ns: &Ns| {
        curl(
            ns,
            &format!(
                "curl -s -i -m 10 --cacert {} -H 'Authorization: Bearer {token}' \
                 -H 'Content-Type: application/json' -d '{{\"macs\":[]}}' \
                 -X POST 'https://198.18.0.1:8443/api/v1/provision/next'",
                ca.display()
            ),
        )
    };
    assert_eq!(call(&link.client).status, 200);
    // A made-up MAC's script (no lease here) leaves no timeline row: a node made for it
    // later shows none, while the leased machine's node shows its script.
    lab.link.server.sh_ok(&format!(
        "curl -sf -o /dev/null {PUBLIC_URL}/boot/52-54-00-77-00-0a.ipxe"
    ));
    let rows = |mac: &str, name: &str| {
        lab.create_node(name, mac);
        lab.node(name)["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "boot-script")
            .count()
    };
    assert_eq!(rows("52:54:00:77:00:0a", "made-up"), 0);
    assert!(rows(&mac, "leased") >= 1);
    // The lease's address is not the caller's: refused, whoever claimed first.
    let r = call(&link.server);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.body.contains(&format!("lease is {ip}")), "{}", r.body);
    drop(lab.app);
}

#[test]
fn the_appliance_reaches_out_only_where_its_configuration_says() {
    let lab = lab("[power]\nbmc_networks = [\"198.18.9.0/24\"]\n");
    let post = |mac: &str, bmc: &str| {
        let mut inv = inventory(&[mac], 2, 2048, &[20]);
        inv["inventory"]["bmc_address"] = serde_json::json!(bmc);
        let r = lab.json(
            &lab.token_for(mac),
            "POST",
            "/v1/continue",
            &inv.to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        lab.node(r.json()["uuid"].as_str().unwrap())
    };
    // A BMC outside the configured networks is data: not the node's, so never contacted.
    let outside = post(MINE, "198.18.0.77");
    assert!(outside["bmc_address"].is_null(), "{outside}");
    let page = lab.call(
        "GET",
        &format!("/ui/nodes/{}", outside["uuid"].as_str().unwrap()),
        &lab.admin,
    );
    assert!(page.body.contains("bmc-not-trusted"), "{}", page.body);
    let inside = post(NEXT, "198.18.9.5");
    assert_eq!(inside["bmc_address"], "198.18.9.5", "{inside}");
    // The address the inventory reports (198.18.0.150) is outside this appliance's
    // provisioning subnets (it gives no leases here): the MDB entry the dominator would
    // poll leaves it out.
    let mdb = lab.call("GET", "/rpc/Mdb.GetMdb", &lab.admin);
    assert_eq!(mdb.status, 200, "{}", mdb.body);
    let label = outside["uuid"].as_str().unwrap();
    assert!(mdb.body.contains(label), "{}", mdb.body);
    assert!(!mdb.body.contains("198.18.0.150"), "{}", mdb.body);
    // The dominator will poll what a machine registers: only the address it calls from.
    // (Its token first: an idle node's script boots the disk and carries none.)
    let token = lab.token_for(VICTIM);
    lab.create_node("mine-reg", VICTIM);
    let r = lab.json(
        &token,
        "POST",
        "/api/v1/provision/mine-reg/register",
        r#"{"address":"198.18.0.99"}"#,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("its own address"), "{}", r.body);
    drop(lab.app);
}
