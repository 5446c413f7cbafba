//! The I/O shell around [`Server`]: one UDP socket per interface, lease persistence through the
//! [`Store`], and the rule that an ACK leaves only after its lease is durable.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use paddock_store::{Op, Store};
use tokio::net::UdpSocket;

use crate::batch::{Batch, Handler, Reply};
pub use crate::batch::{ShellError, Stats};
use crate::packet::{decode_request, encode};
use crate::server::{ClientPolicy, LeaseChange, LimitKind};
use crate::{Lease, MacAddr, Server};
use dhcproto::v4::MessageType;

/// Store prefix of lease records: `dhcp/leases/<ip>` → JSON [`Lease`].
pub const LEASE_PREFIX: &str = "dhcp/leases/";

/// One server socket: bound to `interface` (SO_BINDTODEVICE) on `0.0.0.0:port`, so it sees
/// broadcasts, and answering with `address` as its server identifier.
#[derive(Clone, Debug)]
pub struct Listener {
    pub interface: String,
    pub address: Ipv4Addr,
    pub port: u16,
}

/// A reply to a PXE client, of either DHCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    Offer,
    Ack,
    Nak,
    /// DHCPv6's answer to a Solicit.
    Advertise,
    /// DHCPv6's answer that binds.
    Reply,
}

/// Told about every PXE client answered (for the per-node timeline). Called on the packet
/// path: implementations must not block.
pub trait DhcpObserver: Send + Sync {
    fn pxe_answered(&self, mac: MacAddr, reply: Answered, ip: std::net::IpAddr, boot: &str);
}

/// Counts a request a rate limit dropped and, when a report is due, says so in the log
/// (at most once a minute per client, once per window for the new-lease cap), with the
/// `limits` read only then.
pub(crate) fn limited(
    stats: &Stats,
    kind: LimitKind,
    mac: Option<MacAddr>,
    report: Option<u64>,
    limits: impl FnOnce() -> crate::RateLimits,
) {
    let counter = match kind {
        LimitKind::Client => &stats.limited_client,
        LimitKind::NewLeases => &stats.limited_new_leases,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let Some(dropped) = report else { return };
    let limits = limits();
    match (kind, mac) {
        (LimitKind::Client, Some(mac)) => tracing::warn!(
            %mac,
            dropped,
            burst = limits.per_client_burst,
            per_sec = limits.per_client_per_sec,
            "dhcp: client over its request budget; its requests are dropped (logged at most once a minute per client)"
        ),
        _ => tracing::warn!(
            dropped,
            limit = limits.new_leases_per_window,
            window_secs = limits.new_lease_window_secs,
            "dhcp: new-lease cap reached; requests that would take a new address are dropped (known clients are still served; logged at most once per window)"
        ),
    }
}

pub struct DhcpService {
    server: Mutex<Server>,
    store: Arc<dyn Store>,
    policy: Arc<dyn ClientPolicy>,
    observer: Option<Arc<dyn DhcpObserver>>,
    /// Where requests with `giaddr` set are heard from (checked on each one's source, before
    /// the server's lock).
    relays: crate::Relays,
    pub stats: Stats,
}

/// Unix seconds (0 before 1970).
pub fn unix_now() -> u64 {
    unix_now_ms() / 1000
}

/// Unix milliseconds (0 before 1970), from the clock crate's wall clock.
pub fn unix_now_ms() -> u64 {
    u64::try_from(paddock_clock::now().0).unwrap_or(0)
}

fn lease_key(ip: Ipv4Addr) -> String {
    format!("{LEASE_PREFIX}{ip}")
}

impl DhcpService {
    /// Builds the service and restores every stored lease into `server`; relayed requests
    /// are heard from `relays`.
    pub async fn new(
        mut server: Server,
        store: Arc<dyn Store>,
        policy: Arc<dyn ClientPolicy>,
        observer: Option<Arc<dyn DhcpObserver>>,
        relays: crate::Relays,
    ) -> Result<Arc<Self>, ShellError> {
        for lease in crate::batch::stored_leases::<Lease>(store.as_ref(), LEASE_PREFIX).await? {
            server.leases.restore(lease);
        }
        tracing::info!(leases = server.leases.len(), "dhcp: leases restored");
        Ok(Arc::new(DhcpService {
            relays,
            server: Mutex::new(server),
            store,
            policy,
            observer,
            stats: Stats::default(),
        }))
    }

    /// Each subnet's pool usage at `now` (Unix s): network, addresses held, pool size.
    pub fn usage(&self, now: u64) -> Vec<(ipnet::Ipv4Net, u64, u64)> {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        server.leases.usage(now)
    }

    /// A snapshot of every lease, for the API and the console.
    pub fn leases(&self) -> Vec<Lease> {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<Lease> = server.leases.iter().cloned().collect();
        v.sort_by_key(|l| l.ip);
        v
    }

    /// The address `mac` holds a bound lease on, if it does.
    pub fn bound_address(&self, mac: MacAddr) -> Option<std::net::Ipv4Addr> {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        server
            .leases
            .of_mac(mac)
            .filter(|l| l.state == crate::leases::LeaseState::Bound)
            .map(|l| l.ip)
    }

    /// Serves on every listener until the task is dropped.
    pub async fn run(self: Arc<Self>, listeners: Vec<Listener>) -> Result<(), ShellError> {
        let mut links = Vec::new();
        for l in listeners {
            let socket = bind(&l)?;
            tracing::info!(interface = %l.interface, address = %l.address, port = l.port, "dhcp: listening");
            let link = Link4 {
                service: self.clone(),
                local: l.address,
            };
            links.push((link, socket, l.interface));
        }
        let me = self.clone();
        crate::batch::run(links, move || {
            me.server
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .leases
                .expire_offers(unix_now())
        })
        .await
    }

    /// Handles one received packet: a reply that can go at once into `now`, lease changes
    /// (and the replies that wait for them) into `next`.
    fn packet(
        &self,
        data: &[u8],
        peer: SocketAddr,
        local: Ipv4Addr,
        now: &mut Vec<Reply>,
        next: &mut Batch,
    ) {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let msg = match decode_request(data) {
            Ok(m) => m,
            Err(e) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, error = %e, "dhcp: dropped malformed packet");
                return;
            }
        };
        if self
            .relays
            .refuses(!msg.giaddr().is_unspecified(), peer.ip())
        {
            self.stats.relay_refused.fetch_add(1, Ordering::Relaxed);
            let giaddr = msg.giaddr();
            tracing::debug!(%peer, %giaddr, "dhcp: dropped a relayed request from a source not in relays");
            return;
        }
        let outcome = {
            let mut server = self.server.lock().unwrap_or_else(|p| p.into_inner());
            server.handle_ms(&msg, local, unix_now_ms(), self.policy.as_ref())
        };
        if let Some(limited) = outcome.limited {
            // Counted per packet, logged at most once per client (or window) per report.
            let mac = MacAddr::from_chaddr(msg.chaddr());
            self::limited(&self.stats, limited.kind, mac, limited.report, || {
                *self
                    .server
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .limits()
            });
            return;
        }
        tracing::debug!(%peer, kind = ?outcome.kind, "dhcp: {}", outcome.note);
        let put = |lease: &Lease| {
            serde_json::to_vec(lease)
                .ok()
                .map(|v| Op::put(lease_key(lease.ip), v))
        };
        let change = outcome.change.and_then(|c| {
            let LeaseChange::Put(lease) = c;
            put(&lease)
        });
        let Some((reply, to)) = outcome.reply else {
            self.stats.ignored.fetch_add(1, Ordering::Relaxed);
            // RELEASE and DECLINE: stored with the next batch, nothing to send.
            next.ops.extend(change);
            return;
        };
        if let (Some(obs), Some(boot), Some(mac)) = (
            &self.observer,
            &outcome.boot,
            MacAddr::from_chaddr(msg.chaddr()),
        ) && let Some(kind) = reply.opts().msg_type()
        {
            let answered = match kind {
                MessageType::Offer => Some(Answered::Offer),
                MessageType::Ack => Some(Answered::Ack),
                MessageType::Nak => Some(Answered::Nak),
                _ => None,
            };
            if let Some(a) = answered {
                obs.pxe_answered(mac, a, reply.yiaddr().into(), boot);
            }
        }
        let counter = match reply.opts().msg_type() {
            Some(MessageType::Offer) => &self.stats.offers,
            Some(MessageType::Nak) => &self.stats.naks,
            _ => &self.stats.acks,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let bytes = match encode(&reply) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "dhcp: cannot encode reply");
                return;
            }
        };
        match change {
            None => now.push((bytes, to.into())),
            Some(op) => {
                // The address the client moved away from is released with the new binding,
                // in the same batch, durable before the reply leaves.
                next.ops.extend(outcome.released.iter().filter_map(put));
                next.ops.push(op);
                next.replies.push((bytes, to.into()));
            }
        }
    }
}

/// One listener's protocol for the shared packet loop: the service, and the address it
/// answers as on that link.
struct Link4 {
    service: Arc<DhcpService>,
    local: Ipv4Addr,
}

impl Handler for Link4 {
    fn packet(&self, data: &[u8], peer: SocketAddr, now: &mut Vec<Reply>, next: &mut Batch) {
        self.service.packet(data, peer, self.local, now, next)
    }

    fn store(&self) -> Arc<dyn Store> {
        self.service.store.clone()
    }

    fn stats(&self) -> &Stats {
        &self.service.stats
    }
}

fn bind(l: &Listener) -> Result<UdpSocket, ShellError> {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, l.port));
    crate::batch::server_socket(&l.interface, addr, |s| s.set_broadcast(true), |_| Ok(()))
}
