//! DHCPv6 with a real client (ISC `dhclient -6`) against the real `paddock serve`, in network
//! namespaces with addresses from the IPv6 benchmarking range (2001:2::/48).

mod support;

use std::time::{Duration, Instant};

use support::*;

const SERVER_IP6: &str = "2001:2:0:1::1";

/// Waits until no address of `iface` in `ns` is tentative (duplicate address detection
/// done): dhclient binds to the link-local address, the server answers from its own.
fn wait_for_dad(ns: &Ns, iface: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ns.sh_ok(&format!("ip -6 addr show dev {iface}"));
        if out.contains("inet6 fe80") && !out.contains("tentative") {
            return;
        }
        assert!(Instant::now() < deadline, "{iface} stays tentative: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A link with IPv6 on the server end, and the appliance serving DHCPv6 there (short
/// lifetimes: T1, the renewal, comes at half the preferred lifetime), with `extra` TOML.
fn setup(extra: &str) -> (Link, Scratch, Appliance) {
    require(&["dhclient"]);
    setup_pool("2001:2:0:1::100-2001:2:0:1::1ff", "", extra)
}

/// [`setup`] with another pool, and `section` lines in `[dhcp6]`.
fn setup_pool(pool: &str, section: &str, extra: &str) -> (Link, Scratch, Appliance) {
    require(&["curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    link.server.sh_ok(&format!(
        "ip -6 addr add {SERVER_IP6}/64 dev {} nodad",
        link.server_if
    ));
    wait_for_dad(&link.server, &link.server_if);
    wait_for_dad(&link.client, &link.client_if);
    let config = base_config(
        &link,
        &scratch,
        &format!(
            r#"[tftp]
enabled = false
[dhcp6]
enabled = true
interfaces = ["{iface}"]
ra_interval_secs = 4
{section}[[dhcp6.subnets]]
network = "2001:2:0:1::/64"
pools = ["{pool}"]
dns = ["{SERVER_IP6}"]
preferred_lifetime = 6
valid_lifetime = 12
{extra}"#,
            iface = link.server_if
        ),
    );
    let app = Appliance::start(&link.server, &scratch, &config);
    (link, scratch, app)
}

/// dhclient -6 on `iface` of the client namespace, recording each event as
/// `<reason> <address>` in `<name>.events`.
fn dhclient6(
    link: &Link,
    scratch: &Scratch,
    iface: &str,
    name: &str,
) -> (Reap, std::path::PathBuf) {
    dhclient6_in(&link.client, scratch, iface, name)
}

/// [`dhclient6`] in namespace `ns`.
fn dhclient6_in(ns: &Ns, scratch: &Scratch, iface: &str, name: &str) -> (Reap, std::path::PathBuf) {
    let events = scratch.path(&format!("{name}.events"));
    let script = scratch.path(&format!("{name}.script"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$reason\" in BOUND6|RENEW6|REBIND6|REBOOT6) echo \"$reason $new_ip6_address\" >> {} ;; esac\nexit 0\n",
            events.display()
        ),
    )
    .unwrap();
    sh_ok(&format!("chmod +x {}", script.display()));
    let child = ns.spawn(
        &format!(
            "dhclient -6 -D LL -d -v -lf {lf} -pf {pf} -sf {sf} {iface}",
            lf = scratch.path(&format!("{name}.leases")).display(),
            pf = scratch.path(&format!("{name}.pid")).display(),
            sf = script.display(),
        ),
        &scratch.path(&format!("{name}.log")),
    );
    (Reap(child), events)
}

/// Waits for an event line starting with `reason`; returns every line so far.
fn wait_event(events: &std::path::Path, reason: &str, log: &std::path::Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let text = std::fs::read_to_string(events).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.iter().any(|l| l.starts_with(reason)) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} within 40 s; events: {lines:?}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn leases6(link: &Link) -> Vec<paddock_dhcp::v6::Lease6> {
    let text = link
        .server
        .sh_ok(&format!("curl -sf {PUBLIC_URL}/api/v1/leases6"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A lease from the pool, renewed at T1 for the same address, and stored with the client's
/// MAC (from its DUID-LL); a second client (a macvlan with its own MAC) gets another
/// address; a reserved MAC gets its reservation.
#[test]
fn dhclient6_gets_renews_and_reservations_hold() {
    let reserved_mac = "52:54:00:06:00:07";
    let (link, scratch, _app) = setup(&format!(
        "[[dhcp6.reservations]]\nmac = \"{reserved_mac}\"\nip = \"2001:2:0:1::77\"\n"
    ));
    let mac = client_mac(&link);
    let (first, events) = dhclient6(&link, &scratch, &link.client_if, "first");
    let lines = wait_event(&events, "RENEW6", &scratch.path("first.log"));
    let ip = lines[0]
        .strip_prefix("BOUND6 ")
        .unwrap_or_else(|| panic!("first event {lines:?}"))
        .to_string();
    let ip: std::net::Ipv6Addr = ip.parse().unwrap();
    assert!(
        (0x100..=0x1ff).contains(&(u128::from(ip) & 0xffff)),
        "{ip} is not from the pool"
    );
    assert!(
        lines.iter().any(|l| *l == format!("RENEW6 {ip}")),
        "renewed the same address: {lines:?}"
    );
    drop(first);
    let stored = leases6(&link);
    let lease = stored
        .iter()
        .find(|l| l.ip == ip)
        .expect("the lease stored");
    assert_eq!(lease.mac.map(|m| m.to_string()), Some(mac), "{stored:?}");
    assert_eq!(lease.state, paddock_dhcp::LeaseState::Bound);
    // Two more machines on the link: one ordinary, one with a reservation.
    for (iface, m) in [("mv1", "52:54:00:06:00:01"), ("mv2", reserved_mac)] {
        link.client.sh_ok(&format!(
            "ip link add {iface} link {} address {m} type macvlan mode bridge && ip link set {iface} up",
            link.client_if
        ));
        wait_for_dad(&link.client, iface);
    }
    let (second, events2) = dhclient6(&link, &scratch, "mv1", "second");
    let (third, events3) = dhclient6(&link, &scratch, "mv2", "third");
    let other = wait_event(&events2, "BOUND6", &scratch.path("second.log"));
    let fixed = wait_event(&events3, "BOUND6", &scratch.path("third.log"));
    drop(second);
    drop(third);
    assert_ne!(other[0], format!("BOUND6 {ip}"), "an address given twice");
    assert_eq!(fixed[0], "BOUND6 2001:2:0:1::77");
}

/// A bound lease survives SIGKILL (it was durable before the Reply left) and an orderly
/// restart; the client, asking again, keeps its address.
#[test]
fn dhcp6_leases_survive_kill_9() {
    let (link, scratch, mut app) = setup("");
    let (client, events) = dhclient6(&link, &scratch, &link.client_if, "c");
    let lines = wait_event(&events, "BOUND6", &scratch.path("c.log"));
    drop(client);
    let ip: std::net::Ipv6Addr = lines[0].strip_prefix("BOUND6 ").unwrap().parse().unwrap();
    app.kill9();
    app.restart(&link.server);
    assert!(
        leases6(&link).iter().any(|l| l.ip == ip),
        "the lease was lost by kill -9"
    );
    app.stop();
    app.restart(&link.server);
    assert!(leases6(&link).iter().any(|l| l.ip == ip));
    // The same client (its lease file and DUID) asks again after the restarts.
    let _ = std::fs::remove_file(&events);
    let (again, events) = dhclient6(&link, &scratch, &link.client_if, "c");
    let lines = wait_event(&events, "", &scratch.path("c.log"));
    drop(again);
    assert!(lines[0].ends_with(&format!(" {ip}")), "{lines:?}");
}

/// Whether a fresh dhclient -6 (a new lease file: it starts with a Solicit) on the client's
/// interface is bound within `within`. Waiting is the point: a real external client either
/// gets an answer in that time or none.
fn answered6(link: &Link, scratch: &Scratch, name: &str, within: Duration) -> bool {
    let (client, events) = dhclient6(link, scratch, &link.client_if, name);
    let deadline = Instant::now() + within;
    let bound = loop {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        if text.lines().any(|l| l.starts_with("BOUND6")) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(client);
    bound
}

/// The PXE filter covers DHCPv6: an unknown machine is answered (discovery), a known idle
/// one is not, and one under introspection is again.
#[test]
fn the_pxe_filter_blocks_and_admits_dhcpv6() {
    require(&["nft"]);
    let (link, scratch, _app) = setup("[firewall]\nenabled = true\n");
    assert!(
        answered6(&link, &scratch, "unknown", Duration::from_secs(20)),
        "an unknown machine, discovery on, gets a DHCPv6 answer"
    );
    let uuid = create_node(&link, &client_mac(&link));
    assert!(
        !answered6(&link, &scratch, "known", Duration::from_secs(8)),
        "a known idle machine gets no DHCPv6 answer"
    );
    link.server.sh_ok(&format!(
        "curl -sf -X POST {PUBLIC_URL}/v1/introspection/{uuid}"
    ));
    assert!(
        answered6(&link, &scratch, "inspecting", Duration::from_secs(20)),
        "a machine under introspection gets a DHCPv6 answer again"
    );
}

/// Router advertisements give hosts the subnet as on-link (the kernel's own client, with
/// its route's expiry from the prefix's valid lifetime), with the Managed flag that sends
/// them to DHCPv6, and no default route (router lifetime 0).
#[test]
fn router_advertisements_put_the_subnet_on_link() {
    let (link, _scratch, _app) = setup("");
    let iface = &link.client_if;
    // Link down and up: the kernel solicits at once, and the appliance answers.
    link.client.sh_ok(&format!(
        "ip link set {iface} down && ip link set {iface} up"
    ));
    let deadline = Instant::now() + Duration::from_secs(15);
    let route = loop {
        let out = link
            .client
            .sh_ok(&format!("ip -6 route show 2001:2:0:1::/64 dev {iface}"));
        if out.contains("expires") {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "no on-link route from a router advertisement within 15 s: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(route.starts_with("2001:2:0:1::/64"), "{route}");
    let default = link.client.sh_ok("ip -6 route show default");
    assert!(default.trim().is_empty(), "a default route: {default}");
}

/// DHCPv6 under SIGKILL at random moments ([`kill`]): every Reply that bound an address is
/// in the store after the restart, with the MAC of the client's DUID.
#[test]
fn bound_dhcp6_leases_survive_sigkill_at_random_moments() {
    if let Some(spec) = kill::LoadSpec::from_env() {
        return dhcp6_load(&spec);
    }
    // 65,536 addresses: every exchange of every round takes a new one.
    let (link, scratch, mut app) = setup_pool(
        "2001:2:0:1::1:0-2001:2:0:1::1:ffff",
        "new_leases_per_window = 0\n",
        "",
    );
    let stored = |link: &Link| {
        leases6(link)
            .into_iter()
            .filter(|l| l.state == paddock_dhcp::LeaseState::Bound)
            .filter_map(|l| Some((l.ip.to_string(), l.mac?.to_string())))
            .collect()
    };
    kill::run(
        &link,
        &scratch,
        &mut app,
        "bound_dhcp6_leases_survive_sigkill_at_random_moments",
        &stored,
    );
}

/// One client's exchange in the DHCPv6 load: a client of its own (the ramdisk's DHCPv6
/// client core, a DUID-LL of a new MAC each time).
struct Exchange6 {
    client: paddock_dhcp::v6::Dhcp6Client,
    xid: [u8; 3],
}

impl kill::Exchange for Exchange6 {
    fn owns(&self, reply: &[u8]) -> bool {
        reply.get(1..4) == Some(&self.xid[..])
    }

    fn take(&mut self, reply: &[u8]) -> kill::Progress {
        use paddock_dhcp::v6::Step6;
        match self.client.receive(reply, 0) {
            Step6::Send(request) => kill::Progress::Next(request),
            Step6::Bound(b) => kill::Progress::Acknowledged(b.address.to_string()),
            Step6::Ignored(why) if why.starts_with("refused") => kill::Progress::Refused,
            Step6::Ignored(_) => kill::Progress::Nothing,
        }
    }
}

/// The DHCPv6 load of one round, inside the client namespace ([`kill::drive`]) over one
/// socket on the interface's link-local address; half the exchanges ask for rapid commit,
/// half take the four messages.
fn dhcp6_load(spec: &kill::LoadSpec) {
    use dhcproto::v6::{Message, OptionCode};
    use dhcproto::{Decodable, Decoder};
    use paddock_dhcp::v6::Dhcp6Client;
    use paddock_dhcp::v6::packet::encode6;
    use std::net::{Ipv6Addr, SocketAddrV6};

    let sock = kill::socket(spec, (Ipv6Addr::UNSPECIFIED, 546).into());
    let index: u32 = std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", spec.interface))
        .expect("ifindex")
        .trim()
        .parse()
        .unwrap();
    let servers = SocketAddrV6::new("ff02::1:2".parse().unwrap(), 547, 0, index);
    kill::drive(spec, &sock, servers.into(), |mac, n| {
        let x = n.to_be_bytes();
        let mut client = Dhcp6Client::new(paddock_inventory::MacAddr(mac), [x[1], x[2], x[3]]);
        let mut solicit = client.solicit(0).expect("Solicit");
        if n.is_multiple_of(2) {
            let mut m = Message::decode(&mut Decoder::new(&solicit)).expect("our Solicit");
            m.opts_mut().remove(OptionCode::RapidCommit);
            solicit = encode6(&m).expect("Solicit");
        }
        let xid = [solicit[1], solicit[2], solicit[3]];
        (Exchange6 { client, xid }, solicit)
    });
}

/// `[dhcp6] deny_macs`: a denied machine gets no answer (the refusal is logged); another
/// MAC on the same link is served.
#[test]
fn denied_macs_get_no_dhcpv6_answer() {
    let denied = "52:54:00:06:00:99";
    require(&["dhclient"]);
    let (link, scratch, app) = setup_pool(
        "2001:2:0:1::100-2001:2:0:1::1ff",
        &format!("deny_macs = [\"{denied}\"]\n"),
        "",
    );
    let set_mac = |mac: &str| {
        link.client
            .sh_ok(&format!("ip link set {} address {mac}", link.client_if));
    };
    set_mac(denied);
    assert!(
        !answered6(&link, &scratch, "denied", Duration::from_secs(8)),
        "a denied MAC got a DHCPv6 lease"
    );
    assert!(
        app.log_text().contains("not admitted"),
        "the refusal is logged"
    );
    set_mac("52:54:00:06:00:98");
    assert!(
        answered6(&link, &scratch, "allowed", Duration::from_secs(20)),
        "another MAC is served"
    );
}

/// A client on a link of its own behind ISC's `dhcrelay -6` (with an interface-id): the
/// relay's link address picks that link's subnet, the answer goes back through the relay,
/// and the lease is stored with the client's MAC. Only a relay listed in `dhcp6.relays` is
/// heard: first another address is listed (the Relay-forwards are dropped and counted), then
/// the relay's own.
#[test]
fn dhclient6_is_served_through_a_relay() {
    require(&["dhclient", "dhcrelay"]);
    let (link, scratch, mut app) = setup_pool(
        "2001:2:0:1::100-2001:2:0:1::1ff",
        "relays = [\"2001:2:0:1::3\"]\n",
        "[[dhcp6.subnets]]\nnetwork = \"2001:2:0:2::/64\"\npools = [\"2001:2:0:2::100-2001:2:0:2::1ff\"]\n",
    );
    // The client namespace of the link is the relay's host; behind it, a LAN of its own.
    let relay = &link.client;
    relay.sh_ok(&format!(
        "ip -6 addr add 2001:2:0:1::2/64 dev {} nodad",
        link.client_if
    ));
    let lan = Ns::new(format!("{}-lan", link.tag));
    let (down, host_if) = (format!("{}r", link.tag), format!("{}h", link.tag));
    connect(relay, &down, &lan, &host_if);
    let host_mac = "52:54:00:06:02:01";
    lan.sh_ok(&format!("ip link set {host_if} address {host_mac}"));
    relay.sh_ok(&format!("ip -6 addr add 2001:2:0:2::1/64 dev {down} nodad"));
    wait_for_dad(relay, &down);
    wait_for_dad(&lan, &host_if);
    let _relay = Reap(relay.spawn(
        &format!(
            "dhcrelay -6 -d -I -pf {pf} -l {down} -u {SERVER_IP6}%{up}",
            pf = scratch.path("dhcrelay.pid").display(),
            up = link.client_if,
        ),
        &scratch.path("dhcrelay.log"),
    ));
    let (refused, _) = dhclient6_in(&lan, &scratch, &host_if, "refused");
    let deadline = Instant::now() + Duration::from_secs(30);
    while dhcp_packets(&link.server, "dhcp6", "relay_refused") == 0 {
        assert!(
            Instant::now() < deadline,
            "no Relay-forward counted as refused within 30 s:\n{}",
            std::fs::read_to_string(scratch.path("dhcrelay.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(refused);
    assert_eq!(
        dhcp_packets(&link.server, "dhcp6", "advertise"),
        0,
        "a Solicit through a relay not listed was answered"
    );
    app.stop();
    let config = std::fs::read_to_string(&app.config).unwrap();
    std::fs::write(
        &app.config,
        config.replace("2001:2:0:1::3", "2001:2:0:1::2"),
    )
    .unwrap();
    app.restart(&link.server);
    let (_client, events) = dhclient6_in(&lan, &scratch, &host_if, "relayed");
    let lines = wait_event(&events, "BOUND6", &scratch.path("relayed.log"));
    let ip: std::net::Ipv6Addr = lines[0]
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {lines:?}"));
    let pool = "2001:2:0:2::100".parse::<std::net::Ipv6Addr>().unwrap()
        ..="2001:2:0:2::1ff".parse().unwrap();
    assert!(
        pool.contains(&ip),
        "{ip} is not from the relayed link's pool"
    );
    let lease = leases6(&link)
        .into_iter()
        .find(|l| l.ip == ip)
        .unwrap_or_else(|| panic!("no stored lease for {ip}"));
    assert_eq!(
        lease.mac.map(|m| m.to_string()).as_deref(),
        Some(host_mac),
        "{lease:?}"
    );
}
