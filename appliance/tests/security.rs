//! The access matrix against a running appliance with TLS on: every route of every
//! service, called with curl (a real TLS client) by every kind of caller, allowed or denied
//! exactly as the table below says. Also: the agent's boot-path material (CA fingerprint,
//! token), an agent token scoped to its own machine, the audit log through the CLI, and a
//! host that refuses to start without certificates.

mod support;

use std::collections::BTreeMap;

use support::*;

const HTTPS: &str = "https://198.18.0.1:8443";

/// Who calls. The letters are the table's columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// `a`: the admin certificate `paddock certs init` writes (`*.*`).
    Admin,
    /// `r`: a read-only certificate (`--role read-only`).
    ReadOnly,
    /// `t`: a read-only operator token (bearer).
    ReadOnlyToken,
    /// `i`: an image creator certificate.
    ImageCreator,
    /// `d`: a dominator certificate.
    Dominator,
    /// `s`: a provisioned machine's subd certificate.
    Subd,
    /// `g`: the ramdisk agent with the token its boot script carried.
    AgentToken,
    /// `n`: the agent without its token; any caller with no certificate and no token.
    Anonymous,
    /// A certificate from another CA: the handshake fails.
    OtherCa,
    /// An expired certificate from our CA: the handshake fails.
    Expired,
    /// A forged operator token.
    ForgedToken,
    /// Plain HTTP on the boot port: only boot files.
    PlainHttp,
    /// `o`: an agent token minted for another machine (52:54:00:5e:c0:09).
    OtherMachine,
    /// The admin certificate in a browser, on a page of another site: reads only.
    CrossSite,
    /// A certificate from our CA whose permitted-methods extension appears twice.
    DuplicateExtension,
}

const EVERYONE: [Who; 15] = [
    Who::Admin,
    Who::ReadOnly,
    Who::ReadOnlyToken,
    Who::ImageCreator,
    Who::Dominator,
    Who::Subd,
    Who::AgentToken,
    Who::Anonymous,
    Who::OtherCa,
    Who::Expired,
    Who::ForgedToken,
    Who::PlainHttp,
    Who::OtherMachine,
    Who::CrossSite,
    Who::DuplicateExtension,
];

impl Who {
    fn letter(self) -> Option<char> {
        Some(match self {
            Who::Admin => 'a',
            Who::ReadOnly => 'r',
            Who::ReadOnlyToken => 't',
            Who::ImageCreator => 'i',
            Who::Dominator => 'd',
            Who::Subd => 's',
            Who::AgentToken => 'g',
            Who::Anonymous => 'n',
            Who::OtherMachine => 'o',
            _ => return None,
        })
    }
}

/// One row a route: HTTP method, path, the Service.Method it is (`-` for none), who may
/// call it (`*` = public: anyone, on either listener; otherwise letters from
/// [`Who::letter`], `-` for nobody but the admin, who is always allowed). `#` starts a note.
const TABLE: &str = "
# Public.
GET    /healthz                                   -                                     *
GET    /boot/ca.pem                               -                                     *
GET    /boot/52-54-00-5e-c0-01.ipxe               -                                     *
GET    /                                          -                                     *
GET    /v1                                        -                                     *
GET    /ui/login                                  -                                     *
GET    /ui/assets/console.js                      -                                     *
# Paddock's API.
GET    /metrics                                   Metrics.Get                           rt
GET    /api/v1/leases                             Leases.List                           rt
GET    /api/v1/firewall                           Firewall.Get                          rt
GET    /api/v1/cluster                            Cluster.Get                           rt
GET    /api/v1/audit                              Audit.List                            rt
GET    /api/v1/tokens                             Tokens.List                           rt
POST   /api/v1/tokens                             Tokens.Create                         -
POST   /api/v1/tokens/revoke                      Tokens.Revoke                         -
POST   /api/v1/agent-tokens/rotate                Tokens.RotateAgentKey                 -
POST   /api/v1/agent-tokens/revoke                Tokens.RevokeAgent                    -
GET    /api/v1/nodes                              Nodes.List                            rt
POST   /api/v1/nodes                              Nodes.Create                          -
GET    /api/v1/nodes/ghost                        Nodes.Get                             rt
PATCH  /api/v1/nodes/ghost                        Nodes.Patch                           -
POST   /api/v1/nodes/ghost/provision              Provisioning.Provision                -
POST   /api/v1/nodes/ghost/reimage                Provisioning.Reimage                  -
POST   /api/v1/nodes/ghost/clean                  Provisioning.Clean                    -
GET    /api/v1/nodes/ghost/provisioning           Provisioning.Get                      rt
GET    /api/v1/nodes/ghost/power                  Power.Get                             rt
POST   /api/v1/nodes/ghost/power                  Power.Act                             -
GET    /api/v1/power                              Power.GetThrottle                     rt
GET    /api/v1/spec                               Spec.Get                              rt
POST   /api/v1/spec                               Spec.Apply                            -
POST   /api/v1/spec/plan                          Spec.Plan                             rt
GET    /api/v1/spec/rounds                        Spec.ListRounds                       rt
GET    /api/v1/census                             Census.List                           rt
POST   /api/v1/census/register                    Census.Register                       -
POST   /api/v1/census/keepalive                   Census.KeepAlive                      -
POST   /api/v1/census/revoke                      Census.Revoke                         -
POST   /api/v1/census/status                      Census.Status                         -
GET    /api/v1/dns/zone                           Dns.Zone                              rt
GET    /api/v1/dns/names/ghost                    Dns.Names                             rt
GET    /api/v1/dns/peers                          Dns.Peers                             rt
GET    /api/v1/rollouts                           Rollout.List                          rt
GET    /api/v1/rollouts/ghost                     Rollout.Status                        rt
GET    /api/v1/rollouts/ghost/history             Rollout.History                       rt
POST   /api/v1/rollouts/ghost/promote             Rollout.Promote                       -
POST   /api/v1/rollouts/ghost/pause               Rollout.Pause                         -
POST   /api/v1/rollouts/ghost/resume              Rollout.Resume                        -
POST   /api/v1/rollouts/ghost/revert              Rollout.Revert                        -
# Ironic Inspector v1.
GET    /v1/introspection                          Introspection.List                    rt
GET    /v1/introspection/ghost                    Introspection.Get                     rt
POST   /v1/introspection/ghost                    Introspection.Start                   -
POST   /v1/introspection/ghost/abort              Introspection.Abort                   -
GET    /v1/introspection/ghost/data               Introspection.GetData                 rt
GET    /v1/introspection/ghost/data/unprocessed   Introspection.GetData                 rt
POST   /v1/introspection/ghost/data/unprocessed   Introspection.Reapply                 -
GET    /v1/rules                                  Rules.List                            rt
POST   /v1/rules                                  Rules.Create                          -
DELETE /v1/rules                                  Rules.DeleteAll                       -
GET    /v1/rules/ghost                            Rules.Get                             rt
DELETE /v1/rules/ghost                            Rules.Delete                          -
# The ramdisk agent: a token opens a path that names a node only for its own machine
# (no node here is the token's, so those rows refuse it).
POST   /v1/continue                               Introspection.Continue                go
POST   /api/v1/agent/events                       Agent.Event                           go
GET    /api/v1/agent/ghost/next                   Agent.Next                            -
# `mine` is the `g` token's machine: its own, and no other machine's.
GET    /api/v1/agent/mine/next                    Agent.Next                            g
GET    /api/v1/agent/%6dine/next                  Agent.Next                            g
GET    /api/v1/provision/mine                     Provision.Show                        grt
POST   /api/v1/provision/next                     Provision.Next                        go
GET    /api/v1/provision/ghost                    Provision.Show                        rt
POST   /api/v1/provision/ghost/report             Provision.Report                      -
POST   /api/v1/provision/ghost/register           Provision.Register                    -
# Dominator's services.
POST   /rpc/ImageServer.AddImage                  ImageServer.AddImage                  i
GET    /rpc/ImageServer.ListImages                ImageServer.ListImages                rti
GET    /rpc/ImageServer.GetImage                  ImageServer.GetImage                  d
GET    /rpc/ImageServer.ShowImage                 ImageServer.ShowImage                 rt
POST   /rpc/ImageServer.DeleteImage               ImageServer.DeleteImage               -
POST   /rpc/ImageServer.ChangeImageExpiration     ImageServer.ChangeImageExpiration     -
POST   /rpc/ImageServer.CheckImage                ImageServer.CheckImage                i
POST   /rpc/ImageServer.DeleteUnreferencedObjects ImageServer.DeleteUnreferencedObjects -
POST   /rpc/ObjectServer.CheckObjects             ObjectServer.CheckObjects             i
POST   /rpc/ObjectServer.GetObjects               ObjectServer.GetObjects               ds
GET    /rpc/Mdb.GetMdb                            Mdb.GetMdb                            rt
GET    /rpc/Mdb.ListMachines                      Mdb.ListMachines                      rt
POST   /rpc/Mdb.SetMachine                        Mdb.SetMachine                        -
POST   /rpc/Mdb.DeleteMachine                     Mdb.DeleteMachine                     -
GET    /rpc/Dominator.ListSubs                    Dominator.ListSubs                    rt
GET    /rpc/Dominator.GetSub                      Dominator.GetSub                      rt
GET    /rpc/Dominator.Status                      Dominator.Status                      rt
POST   /rpc/Dominator.Pause                       Dominator.Pause                       -
POST   /rpc/Dominator.Resume                      Dominator.Resume                      -
POST   /rpc/Dominator.PauseSub                    Dominator.PauseSub                    -
POST   /rpc/Dominator.ResumeSub                   Dominator.ResumeSub                   -
POST   /rpc/Dominator.ClearSafety                 Dominator.ClearSafety                 -
POST   /rpc/Dominator.UpdateSub                   Dominator.UpdateSub                   -
POST   /rpc/Nope.Nope                             Http.Unlisted                         -
# The console: pages are Console.View, forms the methods they perform.
GET    /ui                                        Console.View                          rt
GET    /ui/nodes/ghost                            Console.View                          rt
GET    /ui/dashboard                              Console.View                          rt
GET    /ui/rules                                  Console.View                          rt
GET    /ui/images                                 Console.View                          rt
GET    /ui/subs                                   Console.View                          rt
GET    /ui/roles                                  Console.View                          rt
POST   /ui/rollouts/ghost/promote                 Rollout.Promote                       -
POST   /ui/rollouts/ghost/pause                   Rollout.Pause                         -
POST   /ui/rollouts/ghost/resume                  Rollout.Resume                        -
POST   /ui/rollouts/ghost/revert                  Rollout.Revert                        -
GET    /ui/leases                                 Console.View                          rt
GET    /ui/mdb                                    Console.View                          rt
GET    /ui/audit                                  Audit.List                            rt
POST   /ui/nodes/ghost/provision                  Provisioning.Provision                -
POST   /ui/nodes/ghost/reimage                    Provisioning.Reimage                  -
POST   /ui/nodes/ghost/clean                      Provisioning.Clean                    -
POST   /ui/nodes/ghost/power                      Power.Act                             -
POST   /ui/nodes/ghost/introspect                 Introspection.Start                   -
POST   /ui/nodes/ghost/abort                      Introspection.Abort                   -
POST   /ui/rules                                  Rules.Create                          -
POST   /ui/rules/ghost/delete                     Rules.Delete                          -
POST   /ui/images                                 ImageServer.AddImage                  i
POST   /ui/images/ghost                           ImageServer.DeleteImage               -
POST   /ui/subs                                   Dominator.Pause                       -
POST   /ui/subs/ghost/pause                       Dominator.PauseSub                    -
POST   /ui/subs/ghost/image                       Mdb.SetMachine                        -
";

/// The rows of [`TABLE`]: (method, path, Service.Method, grants).
fn table() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    TABLE
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "a TABLE row has four columns: {l}");
            let none = |s: &'static str| if s == "-" { "" } else { s };
            (f[0], f[1], none(f[2]), none(f[3]))
        })
        .collect()
}

fn allowed(who: Who, method: &str, grants: &str) -> bool {
    grants == "*"
        || who == Who::Admin
        // A browser on another site may make the admin's certificate read, never change.
        || (who == Who::CrossSite && method == "GET")
        || who.letter().is_some_and(|c| grants.contains(c))
}

struct Setup {
    link: Link,
    scratch: Scratch,
    app: Appliance,
    /// `--cacert`, `--cert`, `--key`, `-H` arguments per caller.
    args: BTreeMap<&'static str, String>,
    agent_token: String,
}

fn cli(link: &Link, config: &std::path::Path, args: &str) -> String {
    link.server.sh_ok(&format!(
        "{} certs --config {} {args}",
        env!("CARGO_BIN_EXE_paddock"),
        config.display()
    ))
}

fn setup() -> Setup {
    require(&["curl", "openssl"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n[dhcp]\nenabled = false\n[tftp]\nenabled = false\n\
         [boot.discovery]\nkernel = \"{PUBLIC_URL}/boot/assets/vmlinuz\"\ninitrd = \"{PUBLIC_URL}/boot/assets/initrd.img\"\n\
         [inspector]\nauto_enrol = true\n",
        scratch.path("data").display()
    );
    let path = scratch.path("paddock.toml");
    std::fs::write(&path, &config).unwrap();
    let certs = scratch.path("data/certs");
    let init = cli(&link, &path, "init");
    assert!(init.contains("created the CA"), "{init}");
    // Starting again joins the same CA and writes a new host certificate.
    assert!(cli(&link, &path, "init").contains("joined the CA"));
    let out = scratch.path("issued");
    for (name, role) in [
        ("reader", "read-only"),
        ("builder", "image-creator"),
        ("dominator", "dominator"),
        ("web-1", "subd"),
    ] {
        cli(
            &link,
            &path,
            &format!("issue {name} --role {role} --out {}", out.display()),
        );
    }
    // A key and request made where no configuration is (an operator's own machine), the
    // request signed on the appliance's host.
    let carol = scratch.path("carol");
    link.server.sh_ok(&format!(
        "cd / && env -u PADDOCK_CONFIG {} certs request carol --out {}",
        env!("CARGO_BIN_EXE_paddock"),
        carol.display()
    ));
    cli(
        &link,
        &path,
        &format!(
            "issue carol --csr {0}/carol.csr --role read-only --out {0}",
            carol.display()
        ),
    );
    let ro_token = cli(&link, &path, "token viewer --role read-only")
        .trim()
        .to_string();
    assert!(ro_token.starts_with("po1."), "{ro_token}");
    let app = Appliance::start_secure(&link.server, &scratch, &config);

    // An expired certificate from our own CA (read from the store), and one from another CA.
    let store = paddock_store::SqliteStore::open(scratch.path("data/store.db")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let kv = rt
        .block_on(paddock_store::Store::get(&store, "security/ca"))
        .unwrap()
        .expect("the CA is in the store");
    let stored: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
    let ours = paddock_security::ca::Ca {
        cert_pem: stored["cert_pem"].as_str().unwrap().into(),
        key_pem: stored["key_pem"].as_str().unwrap().into(),
    };
    let admin_req = |name: &str| paddock_security::ca::Request {
        name: name.into(),
        methods: vec!["*.*".into()],
        days: 1,
        ..Default::default()
    };
    let now = time::OffsetDateTime::now_utc();
    let expired =
        paddock_security::ca::issue(&ours, &admin_req("old"), now - time::Duration::days(10))
            .unwrap();
    let other_ca = paddock_security::ca::new_ca("evil-ca", now, 10).unwrap();
    let other = paddock_security::ca::issue(&other_ca, &admin_req("mallory"), now).unwrap();
    // Two permitted-methods extensions, `Nodes.Get` then `*.*`: a parser that kept the last
    // would make this an admin.
    let twice = {
        use rcgen::{CertificateParams, CustomExtension, Issuer, KeyPair};
        let mut p = CertificateParams::new(vec![]).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "twice");
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(1);
        for list in [&["Nodes.Get"][..], &["*.*"][..]] {
            p.custom_extensions.push(CustomExtension::from_oid_content(
                paddock_security::methods::PERMITTED_METHODS_OID,
                paddock_security::methods::encode_strings(list),
            ));
        }
        let issuer =
            Issuer::from_ca_cert_pem(&ours.cert_pem, KeyPair::from_pem(&ours.key_pem).unwrap())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        paddock_security::ca::Issued {
            cert_pem: p.signed_by(&key, &issuer).unwrap().pem(),
            key_pem: key.serialize_pem(),
        }
    };
    for (name, c) in [("old", &expired), ("mallory", &other), ("twice", &twice)] {
        std::fs::write(out.join(format!("{name}.pem")), &c.cert_pem).unwrap();
        std::fs::write(out.join(format!("{name}.key")), &c.key_pem).unwrap();
    }

    // The agent's material, from the boot script served over plain HTTP.
    let script = link.server.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/boot/52-54-00-5e-c0-01.ipxe"
    ));
    let arg = |key: &str| {
        script
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("paddock.{key}=")))
            .unwrap_or_else(|| panic!("no paddock.{key} in\n{script}"))
            .to_string()
    };
    assert_eq!(arg("url"), HTTPS, "the agent calls the HTTPS listener");
    assert_eq!(arg("ca_url"), format!("{PUBLIC_URL}/boot/ca.pem"));
    let fp = link.server.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/boot/ca.pem | openssl x509 -outform der | sha256sum | cut -d' ' -f1"
    ));
    assert_eq!(
        arg("ca_fingerprint"),
        fp.trim(),
        "the fingerprint pins the served CA"
    );
    let agent_token = arg("token");
    let other_script = link.server.sh_ok(&format!(
        "curl -sf {PUBLIC_URL}/boot/52-54-00-5e-c0-09.ipxe"
    ));
    let other_token = other_script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("paddock.token="))
        .unwrap()
        .to_string();
    assert!(
        agent_token.starts_with("pa1.525400 5ec001".replace(' ', "").as_str()),
        "{agent_token}"
    );

    let ca = format!("--cacert {}", certs.join("ca.pem").display());
    let cert = |name: &str, dir: &std::path::Path| {
        format!(
            "{ca} --cert {} --key {}",
            dir.join(format!("{name}.pem")).display(),
            dir.join(format!("{name}.key")).display()
        )
    };
    let mut args = BTreeMap::new();
    args.insert("admin", cert("admin", &certs));
    args.insert("reader", cert("reader", &out));
    args.insert(
        "viewer",
        format!("{ca} -H 'Authorization: Bearer {ro_token}'"),
    );
    args.insert("builder", cert("builder", &out));
    args.insert("dominator", cert("dominator", &out));
    args.insert("web-1", cert("web-1", &out));
    args.insert(
        "agent",
        format!("{ca} -H 'Authorization: Bearer {agent_token}'"),
    );
    args.insert("anonymous", ca.clone());
    args.insert(
        "other-machine",
        format!("{ca} -H 'Authorization: Bearer {other_token}'"),
    );
    args.insert(
        "cross-site",
        format!("{} -H 'Sec-Fetch-Site: cross-site'", cert("admin", &certs)),
    );
    args.insert("twice", cert("twice", &out));
    args.insert("mallory", cert("mallory", &out));
    args.insert("old", cert("old", &out));
    args.insert(
        "forged",
        format!("{ca} -H 'Authorization: Bearer po1.{}'", "ab".repeat(32)),
    );
    Setup {
        link,
        scratch,
        app,
        args,
        agent_token,
    }
}

fn key(who: Who) -> &'static str {
    match who {
        Who::Admin => "admin",
        Who::ReadOnly => "reader",
        Who::ReadOnlyToken => "viewer",
        Who::ImageCreator => "builder",
        Who::Dominator => "dominator",
        Who::Subd => "web-1",
        Who::AgentToken => "agent",
        Who::Anonymous => "anonymous",
        Who::OtherCa => "mallory",
        Who::Expired => "old",
        Who::ForgedToken => "forged",
        Who::PlainHttp => "anonymous",
        Who::OtherMachine => "other-machine",
        Who::CrossSite => "cross-site",
        Who::DuplicateExtension => "twice",
    }
}

/// Every route for one caller, in one shell: (status, curl's exit code, body) per row.
fn call_all(s: &Setup, who: Who) -> Vec<(u16, i32, String)> {
    let dir = s.scratch.path(&format!("matrix-{}", key(who)));
    std::fs::create_dir_all(&dir).unwrap();
    let base = if who == Who::PlainHttp {
        PUBLIC_URL
    } else {
        HTTPS
    };
    let auth = if who == Who::PlainHttp {
        ""
    } else {
        &s.args[key(who)]
    };
    let mut script = String::new();
    let table = table();
    for (i, (method, path, _, _)) in table.iter().enumerate() {
        let body = if *method == "GET" || *method == "DELETE" {
            String::new()
        } else {
            // Bodies no handler accepts, so an allowed call changes nothing.
            "-H 'Content-Type: application/json' -H 'Origin: https://198.18.0.1:8443' --data-binary 'not json'".into()
        };
        script.push_str(&format!(
            "code=$(curl -s -m 10 -o {dir}/{i}.body -w '%{{http_code}} %{{redirect_url}}' -X {method} {auth} {body} '{base}{path}'); echo \"{i} $? $code\"\n",
            dir = dir.display()
        ));
    }
    let f = dir.join("calls.sh");
    std::fs::write(&f, script).unwrap();
    let out = s.link.server.sh(&format!("sh {}", f.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = vec![(0u16, -1i32, String::new()); table.len()];
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(i), Some(exit), Some(code)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let i: usize = i.parse().unwrap();
        let redirect = w.next().unwrap_or("").to_string();
        let body = std::fs::read_to_string(dir.join(format!("{i}.body"))).unwrap_or_default();
        rows[i] = (
            code.parse().unwrap_or(0),
            exit.parse().unwrap(),
            format!("{redirect} {body}"),
        );
    }
    rows
}

/// Whether the appliance refused the call (not whether the handler liked it).
fn refused(status: u16, exit: i32, body: &str) -> bool {
    exit != 0 && status == 0 // no TLS session, no answer
        || (status == 401 || status == 403)
            && (body.contains("access to method")
                || body.contains("needs a client certificate")
                || body.contains("token")
                || body.contains("only boot files")
                || body.contains("another site")
                || body.contains("appears more than once"))
        || status == 303 && body.contains("/ui/login")
}

#[test]
fn every_method_for_every_caller_is_allowed_or_denied_as_the_table_says() {
    let s = setup();
    // The `g` token's machine, enrolled.
    let body = s.scratch.path("mine.json");
    std::fs::write(&body, r#"{"name":"mine","macs":["52:54:00:5e:c0:01"]}"#).unwrap();
    let mine = curl(
        &s.link.server,
        &format!(
            "curl -s -i {} -H 'Content-Type: application/json' --data-binary @{} '{HTTPS}/api/v1/nodes'",
            s.args["admin"],
            body.display()
        ),
    );
    assert!(mine.status < 300, "{} {}", mine.status, mine.body);
    let (mut denied, mut unauthorised, mut allowed_ok, mut authorised) = (0, 0, 0, 0);
    let mut wrong = Vec::new();
    for who in EVERYONE {
        let rows = call_all(&s, who);
        for ((method, path, name, grants), (status, exit, body)) in table().into_iter().zip(rows) {
            let mut may = allowed(who, method, grants);
            // Over a failed handshake nothing is served, public or not.
            if matches!(who, Who::OtherCa | Who::Expired) {
                may = false;
                if grants == "*" {
                    assert!(
                        refused(status, exit, &body),
                        "{who:?} {method} {path}: a handshake should fail"
                    );
                    continue;
                }
            }
            // A forged token and the agent without one are anonymous callers; a certificate
            // whose extensions do not parse may call nothing.
            if matches!(who, Who::ForgedToken | Who::DuplicateExtension) && grants != "*" {
                may = false;
            }
            // Plain HTTP serves only what a PXE client fetches before it has the CA, and
            // health: a sign-in or an API answer there would travel in clear.
            if who == Who::PlainHttp && !(path.starts_with("/boot/") || path == "/healthz") {
                may = false;
            }
            let was_refused = refused(status, exit, &body);
            if may {
                authorised += 1;
                if was_refused {
                    wrong.push(format!(
                        "{who:?} {method} {path}: refused ({status} {body:.200})"
                    ));
                } else {
                    allowed_ok += 1;
                }
            } else {
                unauthorised += 1;
                if was_refused {
                    denied += 1;
                    // A caller the appliance knows is told which method it may not call.
                    if status == 403
                        && matches!(
                            who,
                            Who::ReadOnly
                                | Who::ReadOnlyToken
                                | Who::ImageCreator
                                | Who::Dominator
                                | Who::Subd
                        )
                        && !body.contains(&format!("access to method {name} denied"))
                    {
                        wrong.push(format!(
                            "{who:?} {method} {path}: the 403 does not name {name}: {body:.200}"
                        ));
                    }
                } else {
                    wrong.push(format!(
                        "{who:?} {method} {path}: allowed ({status} {exit} {body:.200})"
                    ));
                }
            }
        }
    }
    println!("denied {denied} of {unauthorised} unauthorised calls");
    println!("allowed {allowed_ok} of {authorised} authorised calls");
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(denied, unauthorised);
    assert!(
        unauthorised > 500,
        "the matrix is smaller than expected: {unauthorised}"
    );
    drop(s.app);
}

#[test]
fn agent_tokens_speak_only_for_their_machine_and_the_audit_log_records_who_did_what() {
    let s = setup();
    let admin = &s.args["admin"];
    let call = |auth: &str, method: &str, path: &str, body: &str| {
        let f = s.scratch.path(&format!("b-{}", path.replace('/', "_")));
        std::fs::write(&f, body).unwrap();
        curl(
            &s.link.server,
            &format!(
                "curl -s -i -X {method} {auth} -H 'Content-Type: application/json' --data-binary @{} '{HTTPS}{path}'",
                f.display()
            ),
        )
    };
    // Two nodes; the agent's token was minted for 52:54:00:5e:c0:01.
    let mine = call(
        admin,
        "POST",
        "/api/v1/nodes",
        r#"{"name":"mine","macs":["52:54:00:5e:c0:01"]}"#,
    );
    assert!(mine.status < 300, "{} {}", mine.status, mine.body);
    let theirs = call(
        admin,
        "POST",
        "/api/v1/nodes",
        r#"{"name":"theirs","macs":["52:54:00:5e:c0:02"]}"#,
    );
    assert!(theirs.status < 300, "{} {}", theirs.status, theirs.body);
    let agent = &s.args["agent"];
    let own = call(agent, "GET", "/api/v1/agent/mine/next", "");
    assert!(
        own.status != 401 && own.status != 403,
        "{} {}",
        own.status,
        own.body
    );
    let other = call(agent, "GET", "/api/v1/agent/theirs/next", "");
    assert_eq!(other.status, 403, "{}", other.body);
    assert!(other.body.contains("another machine"), "{}", other.body);
    // A token is not a certificate: it opens nothing else.
    assert_eq!(call(agent, "GET", "/api/v1/nodes", "").status, 403);
    // A tampered token is refused.
    let tampered = s.agent_token.replacen("525400", "525401", 1);
    let t = call(
        &format!(
            "{} -H 'Authorization: Bearer {tampered}'",
            s.args["anonymous"]
        ),
        "POST",
        "/v1/continue",
        "{}",
    );
    assert_eq!(t.status, 401, "{}", t.body);

    // The audit log: the admin's node creations, the reader's refused deletion.
    let denied = call(&s.args["reader"], "DELETE", "/v1/rules", "");
    assert_eq!(denied.status, 403);
    let out = s.link.server.sh_ok(&format!(
        "{} audit --api {HTTPS} --ca {} --cert {} --key {} --json",
        env!("CARGO_BIN_EXE_paddock"),
        s.scratch.path("data/certs/ca.pem").display(),
        s.scratch.path("data/certs/admin.pem").display(),
        s.scratch.path("data/certs/admin.key").display(),
    ));
    let log: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let has = |who: &str, method: &str, status: u64| {
        log.iter()
            .any(|e| e["who"] == who && e["method"] == method && e["status"] == status)
    };
    assert!(
        has("admin", "Nodes.Create", 201) || has("admin", "Nodes.Create", 200),
        "{out}"
    );
    assert!(has("reader", "Rules.DeleteAll", 403), "{out}");
    assert!(log.iter().all(|e| e["proof"] != "insecure"), "{out}");
    // The console: a token signs in (a cookie), and the audit page shows the reader's refusal.
    let viewer_token = s.args["viewer"]
        .rsplit("Bearer ")
        .next()
        .unwrap()
        .trim_end_matches('\'')
        .to_string();
    let login = curl(
        &s.link.server,
        &format!(
            "curl -s -i {} -X POST --data-urlencode token={viewer_token} '{HTTPS}/ui/login'",
            s.args["anonymous"]
        ),
    );
    assert_eq!(login.status, 303, "{}", login.body);
    let cookie = login
        .header("set-cookie")
        .expect("a session cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(cookie.starts_with("paddock_token=po1."), "{cookie}");
    let page = curl(
        &s.link.server,
        &format!(
            "curl -s -i {} -H 'Cookie: {cookie}' '{HTTPS}/ui/audit'",
            s.args["anonymous"]
        ),
    );
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("Rules.DeleteAll") && page.body.contains("reader"),
        "{}",
        page.body
    );
    let bad = curl(
        &s.link.server,
        &format!(
            "curl -s -i {} -X POST --data-urlencode token=po1.{} '{HTTPS}/ui/login'",
            s.args["anonymous"],
            "cd".repeat(32)
        ),
    );
    assert_eq!(bad.status, 401);
    // The table view, with a read-only token: it may read the log.
    let table = s.link.server.sh_ok(&format!(
        "{} audit --api {HTTPS} --ca {} --token {viewer_token}",
        env!("CARGO_BIN_EXE_paddock"),
        s.scratch.path("data/certs/ca.pem").display(),
    ));
    assert!(
        table.contains("Rules.DeleteAll") && table.contains("reader"),
        "{table}"
    );
    // Revoked, the token opens nothing.
    let config = s.scratch.path("paddock.toml");
    assert!(cli(&s.link, &config, "tokens").contains("viewer"));
    assert!(cli(&s.link, &config, "revoke viewer").contains("revoked 1"));
    let after = call(
        &format!(
            "{} -H 'Authorization: Bearer {viewer_token}'",
            s.args["anonymous"]
        ),
        "GET",
        "/api/v1/nodes",
        "",
    );
    assert_eq!(after.status, 401, "{}", after.body);
    assert!(after.body.contains("unknown token"), "{}", after.body);
    // Minted while the appliance runs (through its API: one writer per SQLite store), a
    // token works, and the store still takes writes afterwards.
    let fresh = cli(&s.link, &config, "token operator --role admin --days 1")
        .trim()
        .to_string();
    let with_fresh = format!("{} -H 'Authorization: Bearer {fresh}'", s.args["anonymous"]);
    let made = call(
        &with_fresh,
        "POST",
        "/api/v1/nodes",
        r#"{"name":"later","macs":["52:54:00:5e:c0:03"]}"#,
    );
    assert!(made.status < 300, "{} {}", made.status, made.body);
    // On the appliance's host its configuration names the API, its CA and the admin's
    // certificate: no --api, --ca or --cert.
    let paddock = format!(
        "env -u PADDOCK_API PADDOCK_CONFIG={} {}",
        config.display(),
        env!("CARGO_BIN_EXE_paddock")
    );
    let nodes = s.link.server.sh_ok(&format!("{paddock} node list"));
    assert!(nodes.contains("later"), "{nodes}");
    // Carol's certificate (her key stayed where she made it) reads, and changes nothing.
    let carol = s.scratch.path("carol");
    let as_carol = format!(
        "{paddock} node --cert {0}/carol.pem --key {0}/carol.key",
        carol.display()
    );
    let read = s.link.server.sh_ok(&format!("{as_carol} list"));
    assert!(read.contains("later"), "{read}");
    let refused = link_sh_err(&s, &format!("{as_carol} abort later"));
    assert!(refused.contains("403"), "{refused}");
    let err = link_sh_err(
        &s,
        &format!(
            "{} serve --config {}",
            env!("CARGO_BIN_EXE_paddock"),
            config.display()
        ),
    );
    assert!(err.contains("one paddock serve per data_dir"), "{err}");
    drop(s.app);
}

/// A command that must fail inside the server's namespace: its standard error.
fn link_sh_err(s: &Setup, cmd: &str) -> String {
    let out = s.link.server.sh(&format!("timeout 20 {cmd}"));
    assert!(!out.status.success(), "{cmd} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn without_certificates_tls_mode_refuses_to_start_and_says_how_to_fix_it() {
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n[dhcp]\nenabled = false\n[tftp]\nenabled = false\n",
        scratch.path("data").display()
    );
    let path = scratch.path("paddock.toml");
    std::fs::write(&path, &config).unwrap();
    let out = link.server.sh(&format!(
        "timeout 20 {} serve --config {}",
        env!("CARGO_BIN_EXE_paddock"),
        path.display()
    ));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("paddock certs init"), "{err}");
    assert!(err.contains("insecure"), "{err}");
}
