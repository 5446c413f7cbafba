//! DHCP with real clients (busybox udhcpc, ISC dhclient, ISC dhcrelay) against the real
//! `paddock serve`, each test in its own network namespaces.

mod support;

use std::time::{Duration, Instant};

use support::*;

#[test]
fn pxe_clients_get_the_boot_file_for_their_architecture() {
    require(&["busybox", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let _app = Appliance::start(
        &link.server,
        &scratch,
        &base_config(&link, &scratch, "[tftp]\nenabled = false\n"),
    );
    let cases: &[(u16, &str, &str)] = &[
        (0, "PXEClient:Arch:00000:UNDI:002001", "undionly.kpxe"),
        (7, "PXEClient:Arch:00007:UNDI:003016", "snponly.efi"),
        (9, "PXEClient:Arch:00009:UNDI:003016", "snponly.efi"),
        (11, "PXEClient:Arch:00011:UNDI:003016", "ipxe-arm64.efi"),
    ];
    for (arch, class, file) in cases {
        let env = udhcpc(
            &link,
            &scratch,
            &format!("-x 0x5d:{arch:04x} -V {class} -O 66 -O 67"),
        )
        .unwrap_or_else(|| panic!("no lease for arch {arch}"));
        assert_eq!(
            env.get("bootfile").map(String::as_str),
            Some(*file),
            "arch {arch}: {env:?}"
        );
        assert_eq!(
            env.get("boot_file").map(String::as_str),
            Some(*file),
            "arch {arch}: file field"
        );
        assert_eq!(
            env.get("siaddr").map(String::as_str),
            Some(SERVER_IP),
            "arch {arch}"
        );
        assert_eq!(
            env.get("tftp").map(String::as_str),
            Some(SERVER_IP),
            "arch {arch}: option 66"
        );
        assert_eq!(
            env.get("vendor").map(String::as_str),
            Some("PXEClient"),
            "arch {arch}: option 60"
        );
    }
    // UEFI HTTP boot (16): a URL, and option 60 HTTPClient.
    let env = udhcpc(
        &link,
        &scratch,
        "-x 0x5d:0010 -V HTTPClient:Arch:00016:UNDI:003000 -O 67",
    )
    .expect("lease for arch 16");
    assert_eq!(
        env.get("bootfile").map(String::as_str),
        Some("http://198.18.0.1:8080/boot/assets/ipxe.efi")
    );
    assert_eq!(env.get("vendor").map(String::as_str), Some("HTTPClient"));
    // iPXE (option 77 "iPXE") gets its own script's URL, whatever its arch: no boot loop.
    let mac = client_mac(&link);
    let env = udhcpc(
        &link,
        &scratch,
        "-x 0x5d:0000 -V PXEClient:Arch:00000:UNDI:002001 -x 0x4d:69505845 -O 67",
    )
    .expect("lease for iPXE");
    assert_eq!(
        env.get("bootfile").cloned(),
        Some(format!("{PUBLIC_URL}/boot/{mac}.ipxe"))
    );
    // Every PXE answer is on the machine's timeline, which its node shows once enrolled.
    let uuid = create_node(&link, &mac);
    let node = link
        .server
        .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/nodes/{uuid}"));
    assert!(
        node.contains("boot undionly.kpxe") && node.contains("boot snponly.efi"),
        "{node}"
    );
    // A plain DHCP client gets an address and no boot file.
    let env = udhcpc(&link, &scratch, "").expect("lease for plain client");
    assert!(!env.contains_key("bootfile"), "{env:?}");
    assert!(env["ip"].starts_with("198.18.0.1"), "{env:?}");
}

#[test]
fn denied_macs_get_no_answer() {
    require(&["busybox", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let mac = client_mac(&link);
    let extra = "[tftp]\nenabled = false\n";
    let config = base_config(&link, &scratch, extra)
        .replace("[dhcp]\n", &format!("[dhcp]\ndeny_macs = [\"{mac}\"]\n"));
    let app = Appliance::start(&link.server, &scratch, &config);
    assert!(
        udhcpc(&link, &scratch, "").is_none(),
        "a denied MAC got a lease"
    );
    assert!(
        app.log_text().contains("not admitted"),
        "the refusal is logged"
    );
    // Another MAC on the same link is served.
    link.client.sh_ok(&format!(
        "ip link set {} address 52:54:00:aa:00:02",
        link.client_if
    ));
    assert!(udhcpc(&link, &scratch, "").is_some());
}

#[test]
fn dhclient_gets_and_renews_a_lease() {
    require(&["dhclient", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    // The client's reservation names it: dhclient hears the name as option 12.
    let mac = mac_of(&link.client, &link.client_if);
    let config = base_config(&link, &scratch, "[tftp]\nenabled = false\n")
        .replace("lease_time = 3600", "lease_time = 10")
        + &format!(
            "[[dhcp.reservations]]\nmac = \"{mac}\"\nip = \"198.18.0.10\"\nhostname = \"rack1-u7\"\n"
        );
    let app = Appliance::start(&link.server, &scratch, &config);
    let events = scratch.path("dhclient.events");
    let script = scratch.path("dhclient-script");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$reason\" in BOUND|RENEW|REBIND|REBOOT) ip addr replace $new_ip_address/24 dev $interface; echo \"$reason $new_ip_address $new_host_name\" >> {} ;; esac\nexit 0\n",
            events.display()
        ),
    )
    .unwrap();
    sh_ok(&format!("chmod +x {}", script.display()));
    let mut dhclient = link.client.spawn(
        &format!(
            "dhclient -d -v -lf {lf} -pf {pf} -sf {sf} {iface}",
            lf = scratch.path("dhclient.leases").display(),
            pf = scratch.path("dhclient.pid").display(),
            sf = script.display(),
            iface = link.client_if
        ),
        &scratch.path("dhclient.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let text = loop {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        if text.lines().any(|l| l.starts_with("RENEW")) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no renewal within 40 s; events: {text:?}\n{}",
            std::fs::read_to_string(scratch.path("dhclient.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let _ = dhclient.kill();
    let _ = dhclient.wait();
    let first = text.lines().next().unwrap();
    assert_eq!(first, "BOUND 198.18.0.10 rack1-u7", "{text}");
    let ip = first.split_whitespace().nth(1).unwrap();
    assert!(
        text.lines().any(|l| l == format!("RENEW {ip} rack1-u7")),
        "renewed the same address: {text}"
    );
    assert!(
        app.log_text().contains("(renewing)"),
        "the server saw a RENEWING request"
    );
}

/// Gets a lease for `mac` with udhcpc and returns the address.
fn lease_for(link: &Link, scratch: &Scratch, mac: &str) -> String {
    link.client
        .sh_ok(&format!("ip link set {} address {mac}", link.client_if));
    let env = udhcpc(link, scratch, "").unwrap_or_else(|| panic!("no lease for {mac}"));
    env["ip"].clone()
}

#[test]
fn leases_survive_restart_and_kill_9() {
    require(&["busybox", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let mut app = Appliance::start(
        &link.server,
        &scratch,
        &base_config(&link, &scratch, "[tftp]\nenabled = false\n"),
    );
    let a = "52:54:00:00:0a:01";
    let b = "52:54:00:00:0b:02";
    let ip_a = lease_for(&link, &scratch, a);
    // SIGKILL right after the ACK: the lease was durable before the ACK left.
    app.kill9();
    app.restart(&link.server);
    let ip_b = lease_for(&link, &scratch, b);
    assert_ne!(ip_a, ip_b, "the restarted server gave A's address to B");
    assert_eq!(
        lease_for(&link, &scratch, a),
        ip_a,
        "A keeps its address after kill -9"
    );
    // And across an orderly restart.
    app.stop();
    app.restart(&link.server);
    assert_eq!(lease_for(&link, &scratch, a), ip_a);
    assert_eq!(lease_for(&link, &scratch, b), ip_b);
    let leases = link
        .server
        .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/leases"));
    assert!(leases.contains(a) && leases.contains(b), "{leases}");
}

/// DHCPv4 under SIGKILL at random moments ([`kill`]): every ACK a client received is in
/// the store after the restart, with its MAC.
#[test]
fn acked_leases_survive_sigkill_at_random_moments() {
    if let Some(spec) = kill::LoadSpec::from_env() {
        return dhcp_load(&spec);
    }
    require(&["curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    // A /16 pool: every exchange of every round takes a new address.
    let config = base_config(&link, &scratch, "[tftp]\nenabled = false\n")
        .replace("[dhcp]\n", "[dhcp]\nnew_leases_per_window = 0\n")
        .replace("198.18.0.0/24", "198.18.0.0/16")
        .replace("198.18.0.100-198.18.0.199", "198.18.1.0-198.18.255.254");
    let mut app = Appliance::start(&link.server, &scratch, &config);
    let stored = |link: &Link| {
        let leases = link
            .server
            .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/leases"));
        let leases: Vec<paddock_dhcp::Lease> = serde_json::from_str(&leases).expect("lease JSON");
        leases
            .iter()
            .filter(|l| l.state == paddock_dhcp::LeaseState::Bound)
            .map(|l| (l.ip.to_string(), l.mac.to_string()))
            .collect()
    };
    kill::run(
        &link,
        &scratch,
        &mut app,
        "acked_leases_survive_sigkill_at_random_moments",
        &stored,
    );
}

/// One client exchange: DISCOVER → OFFER → REQUEST → ACK, for one MAC, encoded and decoded
/// with dhcproto.
struct Exchange4 {
    mac: [u8; 6],
    xid: u32,
    /// Whether an OFFER came and the REQUEST went.
    requesting: bool,
}

impl Exchange4 {
    fn message(
        xid: u32,
        mac: &[u8; 6],
        kind: dhcproto::v4::MessageType,
        opts: Vec<dhcproto::v4::DhcpOption>,
    ) -> Vec<u8> {
        use dhcproto::v4::{DhcpOption, Flags, Message, OptionCode};
        use dhcproto::{Encodable, Encoder};
        let unspecified = std::net::Ipv4Addr::UNSPECIFIED;
        let mut m =
            Message::new_with_id(xid, unspecified, unspecified, unspecified, unspecified, mac);
        m.set_flags(Flags::default().set_broadcast());
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::AddressLeaseTime,
        ]));
        for o in opts {
            m.opts_mut().insert(o);
        }
        let mut out = Vec::new();
        m.encode(&mut Encoder::new(&mut out)).expect("encode");
        out
    }
}

impl kill::Exchange for Exchange4 {
    fn owns(&self, reply: &[u8]) -> bool {
        reply.get(4..8) == Some(&self.xid.to_be_bytes()[..])
    }

    fn take(&mut self, reply: &[u8]) -> kill::Progress {
        use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
        use dhcproto::{Decodable, Decoder};
        let Ok(reply) = Message::decode(&mut Decoder::new(reply)) else {
            return kill::Progress::Nothing;
        };
        if reply.opcode() != Opcode::BootReply || reply.chaddr().get(..6) != Some(&self.mac[..]) {
            return kill::Progress::Nothing;
        }
        match (reply.opts().msg_type(), self.requesting) {
            (Some(MessageType::Offer), false) => {
                let Some(DhcpOption::ServerIdentifier(id)) =
                    reply.opts().get(OptionCode::ServerIdentifier)
                else {
                    panic!("OFFER without a server identifier: {reply:?}");
                };
                self.requesting = true;
                kill::Progress::Next(Self::message(
                    self.xid,
                    &self.mac,
                    MessageType::Request,
                    vec![
                        DhcpOption::RequestedIpAddress(reply.yiaddr()),
                        DhcpOption::ServerIdentifier(*id),
                    ],
                ))
            }
            (Some(MessageType::Ack), true) => {
                kill::Progress::Acknowledged(reply.yiaddr().to_string())
            }
            (Some(MessageType::Nak), true) => kill::Progress::Refused,
            _ => kill::Progress::Nothing,
        }
    }
}

/// The DHCP load of one round, run inside the client namespace ([`kill::drive`]) over one
/// socket bound to the interface with no address, so packets leave from 0.0.0.0 as a PXE
/// ROM's do, and answers come by broadcast.
fn dhcp_load(spec: &kill::LoadSpec) {
    use std::net::Ipv4Addr;
    let sock = kill::socket(spec, (Ipv4Addr::UNSPECIFIED, 68).into());
    sock.set_broadcast(true).unwrap();
    let server = std::net::SocketAddr::from((Ipv4Addr::BROADCAST, 67));
    kill::drive(spec, &sock, server, |mac, n| {
        let xid = (u32::from(spec.round) << 24) | (n & 0x00ff_ffff);
        let discover = Exchange4::message(xid, &mac, dhcproto::v4::MessageType::Discover, vec![]);
        let exchange = Exchange4 {
            mac,
            xid,
            requesting: false,
        };
        (exchange, discover)
    });
}

/// Only the relays listed in `dhcp.relays` are heard: first with another address listed (the
/// relayed requests are dropped and counted), then with the relay's own.
#[test]
fn relayed_requests_are_answered_to_the_relay_with_option_82_recorded() {
    require(&["busybox", "dhcrelay", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    // client --(198.19.5.0/24)-- relay --(198.18.0.0/24)-- server
    let relay = Ns::new(format!("{}-rly", link.tag));
    let (rc, rs, sr, cr) = (
        format!("{}rc", link.tag),
        format!("{}rs", link.tag),
        format!("{}sr", link.tag),
        format!("{}cr", link.tag),
    );
    connect(&link.client, &cr, &relay, &rc);
    connect(&relay, &rs, &link.server, &sr);
    relay.sh_ok(&format!(
        "ip addr add 198.19.5.1/24 dev {rc} && ip addr add 198.18.1.2/24 dev {rs}"
    ));
    link.server.sh_ok(&format!(
        "ip addr add 198.18.1.1/24 dev {sr} && ip route add 198.19.5.0/24 via 198.18.1.2"
    ));
    // The server's own link, and the relayed clients' subnet behind the relay.
    let subnets = r#"[[dhcp.subnets]]
network = "198.18.1.0/24"
pools = ["198.18.1.100-198.18.1.110"]
[[dhcp.subnets]]
network = "198.19.5.0/24"
pools = ["198.19.5.10-198.19.5.20"]
routers = ["198.19.5.1"]
"#;
    let config = |relay: &str| {
        let dhcp = format!("relays = [\"{relay}\"]\n{subnets}");
        subnets_config(&sr, &scratch, &dhcp, "[tftp]\nenabled = false\n")
    };
    let mut app = Appliance::start(&link.server, &scratch, &config("198.18.1.3"));
    // ISC dhcrelay: -a adds option 82 (circuit id = the client-side interface name).
    let mut dhcrelay = relay.spawn(
        &format!("dhcrelay -d -4 -a -iu {rs} -id {rc} 198.18.1.1"),
        &scratch.path("dhcrelay.log"),
    );
    std::thread::sleep(Duration::from_millis(500));
    let udhcpc_on = |iface: &str, tries: u32| {
        let script = udhcpc_script(&scratch);
        link.client.sh(&format!(
            "busybox udhcpc -i {iface} -n -q -f -t {tries} -T 1 -A 1 -s {}",
            script.display()
        ))
    };
    // Two DISCOVERs (udhcpc's answer wait is a second each): the counter says they arrived.
    let refused = udhcpc_on(&cr, 2);
    assert!(
        !refused.status.success(),
        "a lease through a relay that is not listed"
    );
    let dropped = dhcp_packets(&link.server, "dhcp", "relay_refused");
    assert!(dropped >= 1, "the relayed DISCOVERs are counted: {dropped}");
    assert_eq!(dhcp_packets(&link.server, "dhcp", "offer"), 0);
    app.stop();
    std::fs::write(&app.config, config("198.18.1.2")).unwrap();
    app.restart(&link.server);
    let out = udhcpc_on(&cr, 5);
    let _ = dhcrelay.kill();
    let _ = dhcrelay.wait();
    assert!(
        out.status.success(),
        "no lease through the relay: {}\nrelay log: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(scratch.path("dhcrelay.log")).unwrap_or_default()
    );
    let env = env_map(&std::fs::read_to_string(scratch.path("udhcpc.bound.env")).unwrap());
    assert!(
        env["ip"].starts_with("198.19.5."),
        "address from the relay's subnet: {env:?}"
    );
    assert_eq!(env.get("router").map(String::as_str), Some("198.19.5.1"));
    // The lease records the relay and its option 82 (sub-option 1 = circuit id = rc's name).
    let leases = link
        .server
        .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/leases"));
    let leases: serde_json::Value = serde_json::from_str(&leases).expect("lease JSON");
    let lease = leases
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ip"] == env["ip"].as_str())
        .expect("lease stored");
    assert_eq!(lease["relay"]["giaddr"], "198.19.5.1");
    let circuit: String = rc.bytes().map(|b| format!("{b:02x}")).collect();
    let info = lease["relay"]["agent_info"]
        .as_str()
        .expect("option 82 recorded");
    assert!(
        info.starts_with(&format!("01{:02x}{circuit}", rc.len())),
        "circuit id {rc} in {info}"
    );
}

#[test]
fn malformed_packets_never_stop_the_server() {
    require(&["python3", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    link.give_client_static_address();
    let app = Appliance::start(
        &link.server,
        &scratch,
        &base_config(&link, &scratch, "[tftp]\nenabled = false\n")
            .replace("[dhcp]\n", "[dhcp]\nper_client_burst = 0\n"),
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/dhcp_corpus.py");
    let out = link
        .client
        .sh_ok(&format!("python3 {script} {SERVER_IP} 198.18.0.50"));
    let mut words = out.split_whitespace();
    let ip = words.next().unwrap().to_string();
    let sent: usize = words.next().unwrap().parse().unwrap();
    assert!(sent > 3000, "corpus size {sent}");
    assert!(ip.starts_with("198.18.0.1"), "{out}");
    let malformed = dhcp_packets(&link.server, "dhcp", "malformed");
    assert!(
        malformed > 1000,
        "most of the corpus is refused as malformed: {malformed}"
    );
    // The relayed lease recorded option 82 exactly as sent.
    let leases = link
        .server
        .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/leases"));
    let leases: serde_json::Value = serde_json::from_str(&leases).unwrap();
    let lease = leases
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ip"] == ip.as_str())
        .expect("lease stored");
    assert_eq!(lease["mac"], "52:54:00:c0:ff:ee");
    assert_eq!(lease["relay"]["giaddr"], "198.18.0.50");
    assert_eq!(
        lease["relay"]["agent_info"],
        "0106657468372f310208737769746368 2d39".replace(' ', "")
    );
    assert!(!app.log_text().contains("panicked"));
}
