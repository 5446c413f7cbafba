//! The rate limits through the real shell: a [`DhcpService`] on a loopback UDP socket with a
//! SQLite store, and a test client acting as a relay (giaddr 127.0.0.1), so every answer is
//! unicast to the test's own socket. Needs SO_BINDTODEVICE on `lo` (root, or Linux ≥ 5.7).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Decodable, Decoder};
use paddock_dhcp::shell::{DhcpService, LEASE_PREFIX, Listener};
use paddock_dhcp::{AllowAll, BootPolicy, Leases, RateLimits, Server, ServerConfig, Subnet};
use paddock_store::Store;
use tokio::net::UdpSocket;

const RELAY: Ipv4Addr = Ipv4Addr::LOCALHOST;

struct Harness {
    service: Arc<DhcpService>,
    store: Arc<dyn Store>,
    sock: UdpSocket,
    server: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(name: &str, limits: RateLimits) -> Harness {
    limits.validate().expect("valid limits");
    let dir = std::env::temp_dir().join(format!("paddock-dhcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(paddock_store::SqliteStore::open(dir.join("store.db")).unwrap());
    let sock = UdpSocket::bind((RELAY, 0)).await.unwrap();
    let relay_port = sock.local_addr().unwrap().port();
    let leases = Leases::new(
        vec![Subnet::with_pool(
            "127.0.0.0/8".parse().unwrap(),
            Ipv4Addr::new(127, 0, 1, 1),
            Ipv4Addr::new(127, 0, 1, 250),
            3600,
        )],
        vec![],
    )
    .unwrap();
    let server = Server::new(
        leases,
        ServerConfig {
            boot: BootPolicy::new("http://127.0.0.1:8080", &Default::default()),
            client_port: 68,
            relay_port,
        },
    )
    .with_limits(limits);
    let service = DhcpService::new(
        server,
        store.clone(),
        Arc::new(AllowAll),
        None,
        paddock_dhcp::Relays::Any,
    )
    .await
    .unwrap();
    let port = free_port();
    let run = service.clone().run(vec![Listener {
        interface: "lo".into(),
        address: RELAY,
        port,
    }]);
    tokio::spawn(async move { run.await.expect("DHCP service") });
    let h = Harness {
        service,
        store,
        sock,
        server: SocketAddr::V4(SocketAddrV4::new(RELAY, port)),
        dir,
    };
    // Listening once a malformed packet is counted (it counts against no limit).
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.service.stats.malformed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the DHCP service never listened");
        h.sock.send_to(b"x", h.server).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h
}

fn mac(n: u32) -> [u8; 6] {
    let b = n.to_be_bytes();
    [0x02, 0x7e, b[0], b[1], b[2], b[3]]
}

fn request(kind: MessageType, mac: [u8; 6], xid: u32, opts: Vec<DhcpOption>) -> Vec<u8> {
    let u = Ipv4Addr::UNSPECIFIED;
    let mut m = Message::new_with_id(xid, u, u, u, RELAY, &mac);
    m.set_opcode(Opcode::BootRequest).set_hops(1);
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    for o in opts {
        m.opts_mut().insert(o);
    }
    paddock_dhcp::packet::encode(&m).unwrap()
}

impl Harness {
    async fn send(&self, packet: &[u8]) {
        self.sock.send_to(packet, self.server).await.unwrap();
    }

    /// Every answer that arrives until none has for `quiet`.
    async fn answers(&self, quiet: Duration) -> Vec<Message> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1500];
        while let Ok(Ok(n)) = tokio::time::timeout(quiet, self.sock.recv(&mut buf)).await {
            out.push(Message::decode(&mut Decoder::new(&buf[..n])).expect("our own reply"));
        }
        out
    }

    fn stat(&self, f: fn(&paddock_dhcp::shell::Stats) -> &std::sync::atomic::AtomicU64) -> u64 {
        f(&self.service.stats).load(Ordering::Relaxed)
    }
}

fn of_kind(answers: &[Message], kind: MessageType) -> Vec<&Message> {
    answers
        .iter()
        .filter(|m| m.opts().msg_type() == Some(kind))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hammering_discovers_is_limited_while_another_is_served() {
    let h = start(
        "hammer",
        RateLimits {
            per_client_burst: 5,
            per_client_per_sec: 1,
            max_tracked_clients: 100,
            ..RateLimits::OFF
        },
    )
    .await;
    let loud = mac(1);
    let started = Instant::now();
    for xid in 0..40 {
        h.send(&request(MessageType::Discover, loud, xid, vec![]))
            .await;
    }
    let sent_in = started.elapsed();
    // Another client, while the first is over its budget.
    h.send(&request(MessageType::Discover, mac(2), 1000, vec![]))
        .await;
    let answers = h.answers(Duration::from_millis(500)).await;
    let offers = of_kind(&answers, MessageType::Offer);
    let to = |m: [u8; 6]| offers.iter().filter(|o| o.chaddr()[..6] == m).count();
    // 5 at once, plus at most one a second refilled while the 40 were being sent.
    let refilled = usize::try_from(sent_in.as_secs()).unwrap();
    let loud_offers = to(loud);
    assert!(
        (5..=5 + refilled).contains(&loud_offers),
        "{loud_offers} offers to the hammering client in {sent_in:?}"
    );
    assert_eq!(to(mac(2)), 1, "the other client is served");
    let limited = h.stat(|s| &s.limited_client);
    assert_eq!(limited, 40 - loud_offers as u64);
    assert_eq!(h.stat(|s| &s.limited_new_leases), 0);
    // Limited requests are their own outcome, not "ignored".
    assert_eq!(h.stat(|s| &s.ignored), 0);
    assert_eq!(h.stat(|s| &s.offers), loud_offers as u64 + 1);

    // A second later, the budget has refilled by one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.send(&request(MessageType::Discover, loud, 2000, vec![]))
        .await;
    let answers = h.answers(Duration::from_millis(300)).await;
    assert_eq!(of_kind(&answers, MessageType::Offer).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_mac_flood_cannot_take_more_addresses_than_the_cap() {
    const CAP: u32 = 10;
    let h = start(
        "flood",
        RateLimits {
            new_leases_per_window: CAP,
            new_lease_window_secs: 60,
            ..RateLimits::default()
        },
    )
    .await;
    // 200 strangers DISCOVER, each once, as fast as the socket goes.
    for n in 0..200 {
        h.send(&request(MessageType::Discover, mac(100 + n), n, vec![]))
            .await;
    }
    let answers = h.answers(Duration::from_millis(500)).await;
    let offers = of_kind(&answers, MessageType::Offer);
    let offered: BTreeSet<Ipv4Addr> = offers.iter().map(|o| o.yiaddr()).collect();
    assert_eq!(
        offers.len(),
        CAP as usize,
        "only the cap's worth of strangers got offers"
    );
    assert_eq!(offered.len(), CAP as usize);
    assert_eq!(h.stat(|s| &s.limited_new_leases), 200 - u64::from(CAP));

    // 50 more strangers try INIT-REBOOT for free addresses (no DISCOVER): dropped, not NAKed,
    // nothing bound.
    for n in 0..50u8 {
        let ip = Ipv4Addr::new(127, 0, 1, 200 + n);
        h.send(&request(
            MessageType::Request,
            mac(1000 + u32::from(n)),
            5000 + u32::from(n),
            vec![DhcpOption::RequestedIpAddress(ip)],
        ))
        .await;
    }
    assert!(h.answers(Duration::from_millis(300)).await.is_empty());
    assert_eq!(h.stat(|s| &s.limited_new_leases), 250 - u64::from(CAP));

    // The clients that were offered an address complete their exchange: their REQUEST takes
    // no new address, so the cap does not stop them.
    for o in &offers {
        let chaddr: [u8; 6] = o.chaddr()[..6].try_into().unwrap();
        h.send(&request(
            MessageType::Request,
            chaddr,
            o.xid(),
            vec![
                DhcpOption::ServerIdentifier(RELAY),
                DhcpOption::RequestedIpAddress(o.yiaddr()),
            ],
        ))
        .await;
    }
    let answers = h.answers(Duration::from_millis(1000)).await;
    assert_eq!(of_kind(&answers, MessageType::Ack).len(), CAP as usize);

    // The store holds exactly the cap's worth of leases: the flood took no more.
    let stored = h.store.range(LEASE_PREFIX).await.unwrap();
    assert_eq!(stored.len(), CAP as usize);
    assert_eq!(h.service.leases().len(), CAP as usize);
    assert_eq!(h.stat(|s| &s.limited_client), 0);
}
