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
    let config = base_config(&link, &scratch, "[tftp]\nenabled = false\n")
        .replace("lease_time = 3600", "lease_time = 10");
    let app = Appliance::start(&link.server, &scratch, &config);
    let events = scratch.path("dhclient.events");
    let script = scratch.path("dhclient-script");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$reason\" in BOUND|RENEW|REBIND|REBOOT) ip addr replace $new_ip_address/24 dev $interface; echo \"$reason $new_ip_address\" >> {} ;; esac\nexit 0\n",
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
    assert!(first.starts_with("BOUND 198.18.0.1"), "{text}");
    let ip = first.split_whitespace().nth(1).unwrap();
    assert!(
        text.lines().any(|l| l == format!("RENEW {ip}")),
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

/// Set in the copy of this test binary that runs inside the client namespace: it turns
/// [`acked_leases_survive_sigkill_at_random_moments`] into the DHCP load (JSON [`LoadSpec`]).
const LOAD_ENV: &str = "PADDOCK_TEST_DHCP_LOAD";
/// Replays a run of [`acked_leases_survive_sigkill_at_random_moments`] (its kill schedule).
const SEED_ENV: &str = "PADDOCK_TEST_SEED";

/// What one round of DHCP load does.
#[derive(serde::Serialize, serde::Deserialize)]
struct LoadSpec {
    interface: String,
    /// Exchanges in flight at once, each with a MAC of its own.
    clients: u8,
    round: u8,
    /// Every ACK received is appended here as `<mac> <ip>`, one `write` each.
    acks: std::path::PathBuf,
    /// The load stops when this file exists.
    stop: std::path::PathBuf,
}

/// SplitMix64: a small seeded generator, so a failing kill schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={s:?} is not a number")),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
            t.as_secs().wrapping_mul(1_000_000_007) ^ u64::from(t.subsec_nanos())
        }
    }
}

/// The ACKs a load recorded, as (address, MAC).
fn read_acks(path: &std::path::Path) -> Vec<(std::net::Ipv4Addr, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Only whole lines: the load may be writing the next one.
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    whole
        .lines()
        .map(|l| {
            let (mac, ip) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("ACK line {l:?}"));
            (
                ip.parse().unwrap_or_else(|_| panic!("ACK line {l:?}")),
                mac.to_string(),
            )
        })
        .collect()
}

/// Clients exchange continuously (a few dozen at once, a new MAC for every exchange) while
/// the real `paddock serve` is SIGKILLed at random moments, again and again. Every ACK a
/// client received was sent before the kill, so its lease must be in the store after the
/// restart, with its MAC; and no address may ever be ACKed to two MACs. Killing only after
/// the clients finish (as `leases_survive_restart_and_kill_9` does) cannot see an ACK sent
/// ahead of its commit; this can.
#[test]
fn acked_leases_survive_sigkill_at_random_moments() {
    if let Ok(spec) = std::env::var(LOAD_ENV) {
        let spec: LoadSpec = serde_json::from_str(&spec).expect("load spec");
        return dhcp_load(&spec);
    }
    require(&["curl", "ip"]);
    const ROUNDS: u8 = 6;
    const CLIENTS: u8 = 32;
    let seed = seed();
    eprintln!("seed {seed} (replay the kill schedule with {SEED_ENV}={seed})");
    let mut rng = Rng(seed);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    // A /16 pool: every exchange of every round takes a new address.
    let config = base_config(&link, &scratch, "[tftp]\nenabled = false\n")
        .replace("[dhcp]\n", "[dhcp]\nnew_leases_per_window = 0\n")
        .replace("198.18.0.0/24", "198.18.0.0/16")
        .replace("198.18.0.100-198.18.0.199", "198.18.1.0-198.18.255.254");
    let mut app = Appliance::start(&link.server, &scratch, &config);
    let exe = std::env::current_exe().expect("test binary");
    let mut acked: std::collections::BTreeMap<std::net::Ipv4Addr, String> = Default::default();
    for round in 0..ROUNDS {
        let spec = LoadSpec {
            interface: link.client_if.clone(),
            clients: CLIENTS,
            round,
            acks: scratch.path(&format!("acks.{round}")),
            stop: scratch.path(&format!("stop.{round}")),
        };
        let log = scratch.path(&format!("load.{round}.log"));
        let mut load = link.client.spawn(
            &format!(
                "env {LOAD_ENV}='{}' {} --exact acked_leases_survive_sigkill_at_random_moments --nocapture --test-threads=1",
                serde_json::to_string(&spec).unwrap(),
                exe.display()
            ),
            &log,
        );
        let load_log = || std::fs::read_to_string(&log).unwrap_or_default();
        // Kill once the exchanges are flowing, at a random moment.
        let deadline = Instant::now() + Duration::from_secs(20);
        while read_acks(&spec.acks).len() < usize::from(CLIENTS) {
            assert!(
                Instant::now() < deadline,
                "round {round}: the load got no ACKs (seed {seed}):\n{}",
                load_log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let delay = Duration::from_millis(rng.below(800));
        std::thread::sleep(delay);
        app.kill9();
        let at_kill = read_acks(&spec.acks).len();
        std::fs::write(&spec.stop, b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = load.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: the load did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "round {round}: the load failed:\n{}",
            load_log()
        );
        let acks = read_acks(&spec.acks);
        for (ip, mac) in &acks {
            if let Some(before) = acked.insert(*ip, mac.clone()) {
                assert_eq!(
                    &before, mac,
                    "round {round}: {ip} was ACKed to two MACs (seed {seed})"
                );
            }
        }
        app.restart(&link.server);
        let leases = link
            .server
            .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/leases"));
        let leases: Vec<paddock_dhcp::Lease> = serde_json::from_str(&leases).expect("lease JSON");
        let stored: std::collections::BTreeMap<_, _> = leases
            .iter()
            .filter(|l| l.state == paddock_dhcp::LeaseState::Bound)
            .map(|l| (l.ip, l.mac.to_string()))
            .collect();
        let lost: Vec<String> = acked
            .iter()
            .filter(|(ip, mac)| stored.get(*ip) != Some(*mac))
            .map(|(ip, mac)| format!("{ip} ACKed to {mac}, stored: {:?}", stored.get(ip)))
            .collect();
        eprintln!(
            "round {round}: killed {} ms into the flow with {at_kill} ACKs received ({} in all); {} ACKed leases checked",
            delay.as_millis(),
            acks.len(),
            acked.len()
        );
        assert!(
            lost.is_empty(),
            "round {round}: {} ACKed lease(s) not in the store after kill -9 (seed {seed}; replay with {SEED_ENV}={seed}):\n{}",
            lost.len(),
            lost[..lost.len().min(20)].join("\n")
        );
    }
}

/// One client exchange: DISCOVER → OFFER → REQUEST → ACK, for one MAC.
struct Exchange {
    mac: [u8; 6],
    xid: u32,
    /// The REQUEST once an OFFER came; the DISCOVER before.
    packet: Vec<u8>,
    requesting: bool,
    sent: Instant,
    tries: u32,
}

/// The DHCP load of one round, run inside the client namespace: `spec.clients` exchanges at
/// once over one socket bound to the interface (no address, so packets leave from 0.0.0.0
/// as a PXE ROM's do, and answers come by broadcast), each starting over with a new MAC when
/// it ends (ACK, NAK, or no answer after 3 tries). Encoded and decoded with dhcproto.
fn dhcp_load(spec: &LoadSpec) {
    use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
    use dhcproto::{Decodable, Decoder, Encodable, Encoder};
    use std::io::Write;
    use std::net::{Ipv4Addr, UdpSocket};

    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 68)).expect("bind 0.0.0.0:68");
    nix::sys::socket::setsockopt(
        &sock,
        nix::sys::socket::sockopt::BindToDevice,
        &std::ffi::OsString::from(&spec.interface),
    )
    .expect("SO_BINDTODEVICE");
    sock.set_broadcast(true).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut acks = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.acks)
        .expect("ACK file");
    let server = std::net::SocketAddr::from((Ipv4Addr::BROADCAST, 67));
    let encode = |m: &Message| {
        let mut out = Vec::new();
        m.encode(&mut Encoder::new(&mut out)).expect("encode");
        out
    };
    let message = |xid: u32, mac: &[u8; 6], kind: MessageType, opts: Vec<DhcpOption>| {
        let unspecified = Ipv4Addr::UNSPECIFIED;
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
        encode(&m)
    };
    let mut started: u32 = 0;
    let mut start = |slot: u8| {
        started += 1;
        let n = started.to_be_bytes();
        let mac = [0x02, spec.round, slot, n[1], n[2], n[3]];
        let xid = (u32::from(spec.round) << 24) | (started & 0x00ff_ffff);
        let packet = message(xid, &mac, MessageType::Discover, vec![]);
        sock.send_to(&packet, server).expect("send DISCOVER");
        Exchange {
            mac,
            xid,
            packet,
            requesting: false,
            sent: Instant::now(),
            tries: 1,
        }
    };
    let mut slots: Vec<Exchange> = (0..spec.clients).map(&mut start).collect();
    let (mut acked, mut naks, mut abandoned) = (0u64, 0u64, 0u64);
    let mut buf = [0u8; 1500];
    let mut checked_stop = Instant::now();
    loop {
        if checked_stop.elapsed() > Duration::from_millis(50) {
            if spec.stop.exists() {
                break;
            }
            checked_stop = Instant::now();
        }
        match sock.recv(&mut buf) {
            Ok(n) => {
                let Ok(reply) = Message::decode(&mut Decoder::new(&buf[..n])) else {
                    continue;
                };
                let Some(i) = slots.iter().position(|e| e.xid == reply.xid()) else {
                    continue;
                };
                let e = &mut slots[i];
                if reply.opcode() != Opcode::BootReply
                    || reply.chaddr().get(..6) != Some(&e.mac[..])
                {
                    continue;
                }
                match (reply.opts().msg_type(), e.requesting) {
                    (Some(MessageType::Offer), false) => {
                        let Some(DhcpOption::ServerIdentifier(id)) =
                            reply.opts().get(OptionCode::ServerIdentifier)
                        else {
                            panic!("OFFER without a server identifier: {reply:?}");
                        };
                        e.packet = message(
                            e.xid,
                            &e.mac,
                            MessageType::Request,
                            vec![
                                DhcpOption::RequestedIpAddress(reply.yiaddr()),
                                DhcpOption::ServerIdentifier(*id),
                            ],
                        );
                        e.requesting = true;
                        e.tries = 1;
                        e.sent = Instant::now();
                        sock.send_to(&e.packet, server).expect("send REQUEST");
                    }
                    (Some(MessageType::Ack), true) => {
                        let mac = paddock_inventory::MacAddr::from_chaddr(&e.mac).expect("6 bytes");
                        acks.write_all(format!("{mac} {}\n", reply.yiaddr()).as_bytes())
                            .expect("record ACK");
                        acked += 1;
                        slots[i] = start(u8::try_from(i).expect("at most 255 clients"));
                    }
                    (Some(MessageType::Nak), true) => {
                        naks += 1;
                        slots[i] = start(u8::try_from(i).expect("at most 255 clients"));
                    }
                    _ => {}
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("receive: {e}"),
        }
        for (i, e) in slots.iter_mut().enumerate() {
            if e.sent.elapsed() < Duration::from_millis(250) {
                continue;
            }
            if e.tries >= 3 {
                abandoned += 1;
                *e = start(u8::try_from(i).expect("at most 255 clients"));
            } else {
                e.tries += 1;
                e.sent = Instant::now();
                sock.send_to(&e.packet, server).expect("resend");
            }
        }
    }
    eprintln!(
        "load round {}: {started} exchanges, {acked} ACKs, {naks} NAKs, {abandoned} unanswered",
        spec.round
    );
}

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
    let config = subnets_config(&sr, &scratch, subnets, "[tftp]\nenabled = false\n");
    let _app = Appliance::start(&link.server, &scratch, &config);
    // ISC dhcrelay: -a adds option 82 (circuit id = the client-side interface name).
    let mut dhcrelay = relay.spawn(
        &format!("dhcrelay -d -4 -a -iu {rs} -id {rc} 198.18.1.1"),
        &scratch.path("dhcrelay.log"),
    );
    std::thread::sleep(Duration::from_millis(500));
    let udhcpc_on = |iface: &str| {
        let script = udhcpc_script(&scratch);
        link.client.sh(&format!(
            "busybox udhcpc -i {iface} -n -q -f -t 5 -T 1 -A 1 -s {}",
            script.display()
        ))
    };
    let out = udhcpc_on(&cr);
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
    let metrics = link.server.sh_ok(&format!("curl -sf {PUBLIC_URL}/metrics"));
    let malformed: u64 = metrics
        .lines()
        .find(|l| l.contains("outcome=\"malformed\""))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .expect("malformed counter");
    assert!(
        malformed > 1000,
        "most of the corpus is refused as malformed: {malformed}\n{metrics}"
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
