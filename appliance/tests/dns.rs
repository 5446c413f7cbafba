//! Service-discovery DNS asked by a real client: `dig` in the client's namespace against the
//! appliance's server, for a machine that took a DHCP lease and was enrolled, and for role
//! instances registered in the census.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const ZONE: &str = "paddock.internal";
/// The address the client asks from (may transfer the zones), and another on the same link
/// (may not).
const INSIDE: &str = "198.18.0.50";
const OUTSIDE: &str = "198.18.0.60";

struct Lab {
    link: Link,
    scratch: Scratch,
    appliance: Appliance,
}

impl Lab {
    /// The appliance with DNS on, `dns` added to its `[dns]` section.
    fn start(dns: &str) -> Lab {
        require(&["dig", "curl", "busybox"]);
        let link = Link::new();
        let scratch = Scratch::new(&link.tag);
        let extra = format!(
            "[tftp]\nenabled = false\n[dns]\nenabled = true\nlisten = [\"{SERVER_IP}\"]\n{dns}"
        );
        let appliance = Appliance::start(
            &link.server,
            &scratch,
            &base_config(&link, &scratch, &extra),
        );
        link.give_client_static_address();
        link.client
            .sh_ok(&format!("ip addr add {OUTSIDE}/24 dev {}", link.client_if));
        Lab {
            link,
            scratch,
            appliance,
        }
    }

    /// `dig` from the client's namespace, from `source`, with `args` (the name, type and
    /// options): its whole text.
    fn dig_from(&self, source: &str, args: &str) -> String {
        let out = self.link.client.sh(&format!(
            "dig @{SERVER_IP} -b {source} +time=2 +tries=1 {args}"
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn dig(&self, args: &str) -> String {
        self.dig_from(INSIDE, args)
    }

    /// `dig +short`: the answer's data, sorted.
    fn short(&self, name: &str, t: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .dig(&format!("+short {name} {t}"))
            .lines()
            .map(str::to_string)
            .collect();
        v.sort();
        v
    }

    fn api(&self, method: &str, path: &str, body: serde_json::Value) -> Resp {
        http(
            &self.link.client,
            &self.scratch,
            method,
            path,
            Some(&body.to_string()),
            &[],
        )
    }

    /// Enrols a machine by name (no lease: its name has a TXT, no address); its UUID.
    fn enrol(&self, name: &str, mac: &str) -> String {
        let r = self.api(
            "POST",
            "/api/v1/nodes",
            json!({"macs": [mac], "name": name}),
        );
        assert_eq!(r.status, 201, "{r:?}");
        r.json()["uuid"].as_str().unwrap().to_string()
    }

    /// Registers an instance; its store lease.
    fn register(&self, role: &str, instance: &str, host: &str, status: Option<&str>) -> u64 {
        let mut body = json!({"role": role, "instance": instance, "host": host, "ttl_secs": 600});
        if let Some(s) = status {
            body["status"] = json!(s);
        }
        let r = self.api("POST", "/api/v1/census/register", body);
        assert_eq!(r.status, 200, "{r:?}");
        r.json()["lease"].as_u64().expect("a lease")
    }
}

impl Lab {
    /// What the instance under `lease` says of itself.
    fn report(&self, lease: u64, status: Option<&str>) {
        let r = self.api(
            "POST",
            "/api/v1/census/status",
            json!({"lease": lease, "status": status}),
        );
        assert_eq!(r.status, 200, "{r:?}");
    }
}

/// The forward zone's serial as the appliance serves it.
fn ours_serial(lab: &Lab) -> u32 {
    let soa = lab.dig(&format!("+short SOA {ZONE}"));
    soa.split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no serial in {soa:?}"))
}

/// Waits at most `within` for `f`; how long it took.
fn within(what: &str, within: Duration, f: impl FnMut() -> bool) -> Duration {
    within_or(what, within, f, String::new)
}

/// [`within`], with `context()` in the failure's message.
fn within_or(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> bool,
    context: impl Fn() -> String,
) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < within,
            "not within {within:?}: {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn a_leased_and_enrolled_machine_and_its_services_answer_by_name() {
    let lab = Lab::start(&format!(
        "allow_transfer = [\"{INSIDE}/32\"]\nresponses_per_second = 100\n\
         [[dhcp.reservations]]\nmac = \"52:54:00:53:00:09\"\nip = \"198.18.0.9\"\n"
    ));
    // The machine: a DHCP lease from the appliance, then enrolment under a name.
    let mac = lab
        .link
        .client
        .sh_ok(&format!(
            "cat /sys/class/net/{}/address",
            lab.link.client_if
        ))
        .trim()
        .to_string();
    let lease = udhcpc(&lab.link, &lab.scratch, "").expect("a lease");
    let ip = lease["ip"].clone();
    let want_ip = vec![ip.clone()];
    let r = lab.api(
        "POST",
        "/api/v1/nodes",
        json!({"macs": [mac], "name": "rack4-slot7"}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let uuid = r.json()["uuid"].as_str().unwrap().to_string();
    let name = format!("rack4-slot7.{ZONE}");
    within(
        "the enrolled machine's name",
        Duration::from_secs(10),
        || lab.short(&name, "A") == want_ip,
    );
    assert_eq!(lab.short(&name, "TXT"), [format!("\"{uuid}\"")]);
    assert_eq!(lab.short(&format!("{uuid}.node.{ZONE}"), "A"), want_ip);
    assert_eq!(
        lab.short(&format!("-x {ip}"), ""),
        [format!("{name}.")],
        "PTR in the DHCP subnet's reverse zone"
    );
    assert_eq!(lab.short(&name, "AAAA"), Vec::<String>::new());
    // A machine with no lease but a DHCP reservation: the reserved address.
    lab.enrol("gamma", "52:54:00:53:00:09");
    within(
        "the reserved machine's name",
        Duration::from_secs(1),
        || lab.short(&format!("gamma.{ZONE}"), "A") == ["198.18.0.9"],
    );

    // Negative answers: authoritative, with the SOA; other zones refused.
    let nx = lab.dig(&format!("nobody.{ZONE} A"));
    assert!(nx.contains("status: NXDOMAIN"), "{nx}");
    assert!(nx.contains("flags: qr aa"), "{nx}");
    let soa = nx
        .split(";; AUTHORITY SECTION:")
        .nth(1)
        .unwrap_or_else(|| panic!("no authority section: {nx}"));
    assert!(
        soa.contains(&format!("{ZONE}.")) && soa.contains("SOA"),
        "{nx}"
    );
    let nodata = lab.dig(&format!("{name} MX"));
    assert!(
        nodata.contains("status: NOERROR") && nodata.contains("ANSWER: 0"),
        "{nodata}"
    );
    let refused = lab.dig("example.com A");
    assert!(refused.contains("status: REFUSED"), "{refused}");
    // ANY: one record set, not all of them (RFC 8482).
    let any = lab.dig(&format!("+noall +answer {name} ANY"));
    let types: std::collections::BTreeSet<&str> = any
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(types.len(), 1, "{any}");

    // The spec declares web's ports: SRV at the service name and at _web._tcp.
    let spec = "[roles.web]\nstart = { hook = \"web.sh\" }\nstop = { hook = \"web.sh\" }\n\
                dns = { ports = [8080, { port = 8443, priority = 10, weight = 5 }] }\n";
    let r = lab.api(
        "POST",
        "/api/v1/spec",
        json!({"file": "spec/web.toml", "text": spec}),
    );
    assert_eq!(r.status, 200, "{r:?}");

    // Role instances: registered on the machine, they get names within a second.
    let start = Instant::now();
    let leases: Vec<u64> = (1..=3)
        .map(|i| {
            let said = (i == 3).then_some("up");
            lab.register("web", &format!("web{i}"), "rack4-slot7", said)
        })
        .collect();
    let took = within(
        "three instances in the service",
        Duration::from_secs(1),
        || lab.short(&format!("web.svc.{ZONE}"), "TXT") == ["\"web1\"", "\"web2\"", "\"web3\""],
    );
    eprintln!("registered → in DNS: {:?}", start.elapsed().max(took));
    assert_eq!(lab.short(&format!("web2.inst.{ZONE}"), "A"), want_ip);
    let srv = lab.short(&format!("_web._tcp.{ZONE}"), "SRV");
    assert_eq!(srv.len(), 6, "two ports × three members: {srv:?}");
    assert!(
        srv.contains(&format!("10 5 8443 web2.inst.{ZONE}.")),
        "{srv:?}"
    );
    assert!(
        srv.contains(&format!("0 0 8080 web1.inst.{ZONE}.")),
        "{srv:?}"
    );
    assert_eq!(lab.short(&format!("web.svc.{ZONE}"), "SRV"), srv);
    let with_additional = lab.dig(&format!("+noall +additional _web._tcp.{ZONE} SRV"));
    assert!(
        with_additional.contains(&format!("web3.inst.{ZONE}.")) && with_additional.contains(&ip),
        "the targets' addresses in the additional section: {with_additional}"
    );
    assert_eq!(lab.short(&format!("web.svc.{ZONE}"), "A"), want_ip);
    // One reports down: out of the service at once (1 of 3 may leave per window), its own
    // name kept; a second one down waits for the window.
    lab.report(leases[0], Some("down"));
    within("web1 out of service", Duration::from_secs(1), || {
        lab.short(&format!("web.svc.{ZONE}"), "TXT")
            == ["\"verifying:web1\"", "\"web2\"", "\"web3\""]
    });
    assert_eq!(lab.short(&format!("web1.inst.{ZONE}"), "A"), want_ip);
    let hostile = lab.api(
        "POST",
        "/api/v1/census/status",
        json!({"lease": leases[1], "status": "<script>"}),
    );
    assert_eq!(hostile.status, 400, "{hostile:?}");
    lab.report(leases[1], Some("draining"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lab.short(&format!("web.svc.{ZONE}"), "TXT"),
        ["\"verifying:web1\"", "\"web2\"", "\"web3\""],
        "the second self-removal waits for the window"
    );
    // The roles page shows each instance's name and who stands in the service.
    let page = http(
        &lab.link.client,
        &lab.scratch,
        "GET",
        "/ui/roles",
        None,
        &[],
    );
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body
            .contains(&format!("<code>web2.inst.{ZONE}.</code>")),
        "{}",
        page.body
    );
    let services = page.body.split("Services (DNS)").nth(1).unwrap_or_default();
    assert!(
        services.contains(&format!("<code>web.svc.{ZONE}.</code>"))
            && services.contains(&format!("<code>_web._tcp.{ZONE}.</code>"))
            && services.contains("<td>web2, web3</td><td>web1</td>"),
        "{services}"
    );
    // A hard removal (the registration revoked) is immediate, window or not.
    let r = lab.api("POST", "/api/v1/census/revoke", json!({"lease": leases[2]}));
    assert!(r.status < 300, "{r:?}");
    within("web3 gone", Duration::from_secs(1), || {
        lab.short(&format!("web3.inst.{ZONE}"), "A").is_empty()
    });
    let nx = lab.dig(&format!("web3.inst.{ZONE} A"));
    assert!(nx.contains("status: NXDOMAIN"), "{nx}");

    // Many members: more addresses than 512 bytes hold, so UDP without EDNS is truncated.
    for i in 0..60 {
        lab.register("big", &format!("big{i}"), "rack4-slot7", None);
    }
    within("sixty members", Duration::from_secs(5), || {
        lab.short(&format!("big.svc.{ZONE}"), "TXT").len() == 60
    });
    let tc = lab.dig(&format!("+noedns +ignore big.svc.{ZONE} TXT"));
    assert!(tc.contains(" tc"), "{tc}");
    let tcp = lab.dig(&format!("+tcp +short big.svc.{ZONE} TXT"));
    assert_eq!(tcp.lines().count(), 60, "{tcp}");

    // Zone transfers: only from the ACL.
    let axfr = lab.dig(&format!("AXFR {ZONE}"));
    assert!(axfr.contains(&format!("{name}.")), "{axfr}");
    assert_eq!(
        axfr.lines().filter(|l| l.contains("\tSOA\t")).count(),
        2,
        "SOA first and last: {axfr}"
    );
    let refused = lab.dig_from(OUTSIDE, &format!("AXFR {ZONE}"));
    assert!(
        refused.contains("Transfer failed") || refused.contains("REFUSED"),
        "{refused}"
    );
    assert!(!refused.contains(&format!("{name}.")), "{refused}");

    // The machine's page shows its names.
    let page = http(
        &lab.link.client,
        &lab.scratch,
        "GET",
        &format!("/ui/nodes/{uuid}"),
        None,
        &[],
    )
    .body;
    for n in [
        format!("{name}."),
        format!("{uuid}.node.{ZONE}."),
        format!("{}.0.18.198.in-addr.arpa.", ip.rsplit('.').next().unwrap()),
    ] {
        assert!(
            page.contains(&format!("<code>{n}</code>")),
            "{n} not on the page: {page}"
        );
    }

    // What the server counted, on /metrics.
    let metrics = http(&lab.link.client, &lab.scratch, "GET", "/metrics", None, &[]).body;
    let count = |line: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} not in {metrics}"))
    };
    assert!(
        count("paddock_dns_questions_total{kind=\"A\"}") >= 10,
        "{metrics}"
    );
    assert!(
        count("paddock_dns_answers_total{kind=\"NXDOMAIN\"}") >= 2,
        "{metrics}"
    );
    assert!(
        count("paddock_dns_answers_total{kind=\"REFUSED\"}") >= 1,
        "{metrics}"
    );
    assert_eq!(
        count("paddock_dns_transfers_total{kind=\"full\"}"),
        1,
        "{metrics}"
    );
    assert!(
        metrics.contains("paddock_dns_serial{zone=\"paddock.internal.\"}"),
        "{metrics}"
    );
}

/// A real BIND `named`, configured as a secondary of the appliance, transfers the zone at
/// start (AXFR), then follows each change from the appliance's NOTIFY by an incremental
/// transfer (IXFR), and answers the new names itself.
#[test]
fn a_bind_secondary_follows_the_zone_by_notify_and_ixfr() {
    require(&["named"]);
    // The secondary at INSIDE is allowed to transfer because it is a secondary.
    let lab = Lab::start(&format!("secondaries = [\"{INSIDE}\"]\n"));
    let alpha = lab.enrol("alpha", "52:54:00:53:00:01");
    let dir = lab.scratch.path("named");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let conf = format!(
        r#"options {{
    directory "{d}";
    pid-file "{d}/named.pid";
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on port 53 {{ {INSIDE}; }};
    listen-on-v6 {{ none; }};
    recursion no;
    dnssec-validation no;
    notify no;
}};
zone "{ZONE}" {{
    type secondary;
    primaries {{ {SERVER_IP}; }};
    allow-notify {{ {SERVER_IP}; }};
    file "{d}/{ZONE}.db";
}};
"#
    );
    std::fs::write(dir.join("named.conf"), conf).unwrap();
    let log = lab.scratch.path("named.log");
    let mut named = lab
        .link
        .client
        .spawn(&format!("named -g -n 1 -c {d}/named.conf"), &log);
    let ask_named = |name: &str, t: &str| -> String {
        let out = lab.link.client.sh(&format!(
            "dig @{INSIDE} +time=1 +tries=1 +short {name}.{ZONE} {t}"
        ));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let named_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let first = within_or(
        "named's first transfer",
        Duration::from_secs(20),
        || ask_named("alpha", "TXT") == format!("\"{alpha}\""),
        || format!("named's log:\n{}", named_log()),
    );
    eprintln!("named answered from its first transfer after {first:?}");
    // A change: the appliance NOTIFYs, named transfers the difference.
    let start = Instant::now();
    let beta = lab.enrol("beta", "52:54:00:53:00:02");
    let took = within("beta at the secondary", Duration::from_secs(10), || {
        ask_named("beta", "TXT") == format!("\"{beta}\"")
    });
    eprintln!(
        "enrolled → answered by the secondary: {:?}",
        start.elapsed().max(took)
    );
    let text = named_log();
    assert!(
        text.contains("notify from") && text.contains(SERVER_IP),
        "named got no NOTIFY: {text}"
    );
    // The appliance sent the change alone (IXFR), not the zone again.
    let ours = without_colours(&lab.appliance.log_text());
    let transfers: Vec<&str> = ours
        .lines()
        .filter(|l| l.contains("dns: zone transferred") && l.contains(INSIDE))
        .collect();
    assert!(transfers.len() >= 2, "{ours}");
    assert!(
        transfers.last().unwrap().contains("incremental=true"),
        "{transfers:#?}"
    );
    // Operators see it: the secondary's standing, and a machine's names.
    let cli = |args: &str| {
        lab.link.client.sh_ok(&format!(
            "PADDOCK_API={PUBLIC_URL} {} dns {args}",
            env!("CARGO_BIN_EXE_paddock")
        ))
    };
    let peers = cli("peers");
    let serial = ours_serial(&lab);
    let row = peers
        .lines()
        .find(|l| l.starts_with(&format!("{INSIDE}:53")) && l.contains(&format!("{ZONE}.")))
        .unwrap_or_else(|| panic!("{peers}"));
    assert!(row.ends_with("ok"), "{row}");
    // The serial it serves (asked of named itself) is ours, as are the ones announced,
    // answered and transferred.
    let serials: Vec<&str> = row.split_whitespace().skip(2).take(4).collect();
    let ours = serial.to_string();
    assert_eq!(serials, [ours.as_str(); 4], "{row}");
    let names = cli("names beta");
    assert!(
        names.contains(&format!("beta.{ZONE}.")) && names.contains(&beta),
        "{names}"
    );
    let zone = cli("zone");
    assert!(
        zone.contains(&format!("; {ZONE}. serial {serial}")),
        "{zone}"
    );
    // The secondary's copy equals ours.
    let ours = lab.dig(&format!("+short SOA {ZONE}"));
    let theirs = lab
        .link
        .client
        .sh_ok(&format!("dig @{INSIDE} +short SOA {ZONE}"));
    assert_eq!(ours.trim(), theirs.trim());
    let _ = named.kill();
    let _ = named.wait();
}

/// A burst of questions from one source over UDP: answered up to the rate, then every
/// second one slips through empty with TC (a real client retries over TCP), the rest get
/// nothing; TCP is not limited.
#[test]
fn a_flood_from_one_source_is_rate_limited() {
    require(&["python3"]);
    let lab = Lab::start("responses_per_second = 50\nrate_limit_slip = 2\n");
    let script = lab.scratch.path("flood.py");
    std::fs::write(
        &script,
        format!(
            r#"import socket, struct, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{INSIDE}", 0))
q = lambda i: struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + b"\x03ns1\x07paddock\x08internal\x00\x00\x01\x00\x01"
for i in range(400):
    s.sendto(q(i), ("{SERVER_IP}", 53))
    if i % 20 == 19:
        time.sleep(0.002)  # the server's socket buffer holds a few hundred at most
s.settimeout(1.0)
full = tc = 0
try:
    while True:
        data, _ = s.recvfrom(4096)
        flags, ancount = struct.unpack(">H", data[2:4])[0], struct.unpack(">H", data[6:8])[0]
        if flags & 0x0200:
            tc += 1
        elif ancount:
            full += 1
except socket.timeout:
    pass
print(full, tc)
"#
        ),
    )
    .unwrap();
    // The first query has an answer once the server is up.
    within("the server answers", Duration::from_secs(10), || {
        !lab.short(&format!("ns1.{ZONE}"), "A").is_empty()
    });
    std::thread::sleep(Duration::from_secs(1));
    let out = lab
        .link
        .client
        .sh_ok(&format!("python3 {}", script.display()));
    let counts: Vec<usize> = out.split_whitespace().map(|n| n.parse().unwrap()).collect();
    let (full, tc) = (counts[0], counts[1]);
    // 50 in the bucket and what refilled (50/s) while the 400 went out; of the rest, every
    // second slips (a few may be lost in the sockets' buffers).
    assert!((50..=100).contains(&full), "answered {full}, slipped {tc}");
    let over = 400 - full;
    assert!(
        tc <= over / 2 + 1 && tc + 30 >= over / 2,
        "answered {full}, slipped {tc}"
    );
    let metrics = http(&lab.link.client, &lab.scratch, "GET", "/metrics", None, &[]).body;
    assert!(
        metrics.contains(&format!(
            "paddock_dns_rate_limited_total{{kind=\"slipped\"}} {tc}"
        )),
        "{metrics}"
    );
    // TCP from the same source is answered.
    assert_eq!(
        lab.short(&format!("+tcp ns1.{ZONE}"), "A"),
        [SERVER_IP.to_string()]
    );
}
