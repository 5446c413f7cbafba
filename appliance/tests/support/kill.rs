//! Acknowledged leases survive SIGKILL at random moments: the harness both DHCP families
//! share. A copy of the test binary runs the protocol's load inside the client namespace
//! (clients exchange continuously, a new MAC for every exchange, each acknowledgement
//! appended to a file the moment it arrives) while the real `paddock serve` is SIGKILLed at
//! a random moment, round after round. Every acknowledgement was sent before the kill, so
//! after the restart its lease must be in the store with its MAC, and no address may ever
//! be acknowledged to two MACs. Killing only after the clients finish cannot see a reply
//! sent ahead of its commit; this can.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Appliance, Link, Scratch};

/// Set in the copy of the test binary that runs inside the client namespace: it makes the
/// test run the load (JSON [`LoadSpec`]) instead.
pub const LOAD_ENV: &str = "PADDOCK_TEST_DHCP_LOAD";
/// Replays a run (its kill schedule).
pub const SEED_ENV: &str = "PADDOCK_TEST_SEED";

/// What one round of load does.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct LoadSpec {
    pub interface: String,
    /// Exchanges in flight at once, each with a MAC of its own.
    pub clients: u8,
    pub round: u8,
    /// Every acknowledgement received is appended here as `<mac> <ip>`, one `write` each.
    pub acks: PathBuf,
    /// The load stops when this file exists.
    pub stop: PathBuf,
}

impl LoadSpec {
    /// The spec when this process is the load, not the test.
    pub fn from_env() -> Option<LoadSpec> {
        let spec = std::env::var(LOAD_ENV).ok()?;
        Some(serde_json::from_str(&spec).expect("load spec"))
    }

    /// The MAC of exchange `n` of client `slot`: locally administered, unique per round.
    pub fn mac(&self, slot: usize, n: u32) -> [u8; 6] {
        let n = n.to_be_bytes();
        let slot = u8::try_from(slot).expect("at most 255 clients");
        [0x02, self.round, slot, n[1], n[2], n[3]]
    }

    pub fn stopped(&self) -> bool {
        self.stop.exists()
    }
}

/// Rounds of load, each ended by a SIGKILL.
const ROUNDS: u8 = 6;
/// Exchanges in flight at once.
const CLIENTS: u8 = 32;

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

/// The acknowledgements a load recorded, as (address, MAC).
fn read_acks(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Only whole lines: the load may be writing the next one.
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    whole
        .lines()
        .map(|l| {
            let (mac, ip) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("acknowledgement line {l:?}"));
            (ip.to_string(), mac.to_string())
        })
        .collect()
}

/// Appends one acknowledgement to the load's file, in one `write`.
fn record_ack(file: &mut std::fs::File, mac: &[u8; 6], ip: impl std::fmt::Display) {
    use std::io::Write;
    let mac = paddock_inventory::MacAddr(*mac);
    file.write_all(format!("{mac} {ip}\n").as_bytes())
        .expect("record acknowledgement");
}

/// Runs the rounds against `app` (already serving on `link`): the load is the test binary's
/// `test` run again, and `stored` reads the appliance's bound leases (address → MAC) after
/// each restart.
pub fn run(
    link: &Link,
    scratch: &Scratch,
    app: &mut Appliance,
    test: &str,
    stored: &dyn Fn(&Link) -> BTreeMap<String, String>,
) {
    let seed = seed();
    eprintln!("seed {seed} (replay the kill schedule with {SEED_ENV}={seed})");
    let mut rng = Rng(seed);
    let exe = std::env::current_exe().expect("test binary");
    let mut acked: BTreeMap<String, String> = BTreeMap::new();
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
                "env {LOAD_ENV}='{}' {} --exact {} --nocapture --test-threads=1",
                serde_json::to_string(&spec).unwrap(),
                exe.display(),
                test
            ),
            &log,
        );
        let load_log = || std::fs::read_to_string(&log).unwrap_or_default();
        // Kill once the exchanges are flowing, at a random moment.
        let deadline = Instant::now() + Duration::from_secs(20);
        while read_acks(&spec.acks).len() < usize::from(CLIENTS) {
            assert!(
                Instant::now() < deadline,
                "round {round}: the load got no acknowledgements (seed {seed}):\n{}",
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
            if let Some(before) = acked.insert(ip.clone(), mac.clone()) {
                assert_eq!(
                    &before, mac,
                    "round {round}: {ip} was acknowledged to two MACs (seed {seed})"
                );
            }
        }
        app.restart(&link.server);
        let stored = stored(link);
        let lost: Vec<String> = acked
            .iter()
            .filter(|(ip, mac)| stored.get(*ip) != Some(*mac))
            .map(|(ip, mac)| format!("{ip} acknowledged to {mac}, stored: {:?}", stored.get(ip)))
            .collect();
        eprintln!(
            "round {round}: killed {} ms into the flow with {at_kill} acknowledgements received ({} in all); {} acknowledged leases checked",
            delay.as_millis(),
            acks.len(),
            acked.len()
        );
        assert!(
            lost.is_empty(),
            "round {round}: {} acknowledged lease(s) not in the store after kill -9 (seed {seed}; replay with {SEED_ENV}={seed}):\n{}",
            lost.len(),
            lost[..lost.len().min(20)].join("\n")
        );
    }
}

/// The load's socket: bound to `at` on the spec's interface, with a short read timeout.
pub fn socket(spec: &LoadSpec, at: std::net::SocketAddr) -> std::net::UdpSocket {
    let sock = std::net::UdpSocket::bind(at).unwrap_or_else(|e| panic!("bind {at}: {e}"));
    nix::sys::socket::setsockopt(
        &sock,
        nix::sys::socket::sockopt::BindToDevice,
        &std::ffi::OsString::from(&spec.interface),
    )
    .expect("SO_BINDTODEVICE");
    sock.set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    sock
}

/// What one client exchange of a protocol's load does with the replies it gets.
pub trait Exchange {
    /// Whether `reply` belongs to this exchange (its transaction id).
    fn owns(&self, reply: &[u8]) -> bool;
    /// Takes one of its replies.
    fn take(&mut self, reply: &[u8]) -> Progress;
}

/// Where an exchange stands after a reply.
pub enum Progress {
    /// Send this next.
    Next(Vec<u8>),
    /// Done: the server acknowledged this address.
    Acknowledged(String),
    /// Done: the server said no.
    Refused,
    /// Not a reply that moves it.
    Nothing,
}

/// An exchange in flight: the MAC it is for and what it sent last.
struct Slot<E> {
    exchange: E,
    mac: [u8; 6],
    packet: Vec<u8>,
    sent: Instant,
    tries: u32,
}

/// Runs a round of load until [`LoadSpec::stopped`]: `spec.clients` exchanges at once over
/// `sock` (see [`socket`]), sent to `to`; `start(mac, n)` begins the `n`th exchange, for
/// `mac`, and gives its first packet. An exchange starts over, with a new MAC, when it is
/// acknowledged, refused, or unanswered after 3 tries 250 ms apart. Every acknowledgement is
/// recorded as it arrives.
pub fn drive<E: Exchange>(
    spec: &LoadSpec,
    sock: &std::net::UdpSocket,
    to: std::net::SocketAddr,
    mut start: impl FnMut([u8; 6], u32) -> (E, Vec<u8>),
) {
    let mut acks = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.acks)
        .expect("acknowledgement file");
    let mut started: u32 = 0;
    let mut begin = |slot: usize| {
        started += 1;
        let mac = spec.mac(slot, started);
        let (exchange, packet) = start(mac, started);
        sock.send_to(&packet, to).expect("send");
        Slot {
            exchange,
            mac,
            packet,
            sent: Instant::now(),
            tries: 1,
        }
    };
    let mut slots: Vec<Slot<E>> = (0..usize::from(spec.clients)).map(&mut begin).collect();
    let (mut acked, mut refused, mut abandoned) = (0u64, 0u64, 0u64);
    let mut buf = [0u8; 1500];
    let mut checked_stop = Instant::now();
    loop {
        if checked_stop.elapsed() > Duration::from_millis(50) {
            if spec.stopped() {
                break;
            }
            checked_stop = Instant::now();
        }
        match sock.recv(&mut buf) {
            Ok(n) => {
                let reply = &buf[..n];
                let Some(i) = slots.iter().position(|s| s.exchange.owns(reply)) else {
                    continue;
                };
                let s = &mut slots[i];
                match s.exchange.take(reply) {
                    Progress::Next(packet) => {
                        sock.send_to(&packet, to).expect("send");
                        s.packet = packet;
                        s.tries = 1;
                        s.sent = Instant::now();
                    }
                    Progress::Acknowledged(ip) => {
                        record_ack(&mut acks, &s.mac, ip);
                        acked += 1;
                        slots[i] = begin(i);
                    }
                    Progress::Refused => {
                        refused += 1;
                        slots[i] = begin(i);
                    }
                    Progress::Nothing => {}
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("receive: {e}"),
        }
        for (i, s) in slots.iter_mut().enumerate() {
            if s.sent.elapsed() < Duration::from_millis(250) {
                continue;
            }
            if s.tries >= 3 {
                abandoned += 1;
                *s = begin(i);
            } else {
                s.tries += 1;
                s.sent = Instant::now();
                sock.send_to(&s.packet, to).expect("resend");
            }
        }
    }
    eprintln!(
        "load round {}: {started} exchanges, {acked} acknowledged, {refused} refused, {abandoned} unanswered",
        spec.round
    );
}
