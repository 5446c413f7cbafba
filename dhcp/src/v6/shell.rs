//! The I/O shell around [`Server6`]: one UDP socket per interface on port 547, joined to
//! All_DHCP_Relay_Agents_and_Servers (`ff02::1:2`), lease persistence through the [`Store`],
//! and the rule (shared with DHCPv4) that a reply leaves only after its leases are durable.
//! A message relayed to the server's address (Relay-forward) is served on the link its
//! relay names, and answered through the same relays (Relay-reply).

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use dhcproto::v6::MessageType;
use paddock_store::{Op, Store};
use tokio::net::UdpSocket;

use super::packet::{Inbound6, decode_inbound6, encode_relayed6, encode6};
use super::{Lease6, Server6, Via6};
use crate::batch::{Batch, Handler, Reply};
use crate::server::ClientPolicy;
use crate::shell::{Answered, DhcpObserver, ShellError, Stats, unix_now, unix_now_ms};

/// Store prefix of DHCPv6 lease records: `dhcp6/leases/<ip>` → JSON [`Lease6`].
pub const LEASE6_PREFIX: &str = "dhcp6/leases/";

/// All_DHCP_Relay_Agents_and_Servers (RFC 8415 7.1).
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

/// One server socket: bound to `interface` (kernel index `index`, MAC `mac`) on
/// `[::]:port`, joined to [`ALL_SERVERS`] there, serving the subnet that holds `address`
/// (this host's address on that link).
#[derive(Clone, Debug)]
pub struct Listener6 {
    pub interface: String,
    pub index: u32,
    pub mac: crate::MacAddr,
    pub address: Ipv6Addr,
    pub port: u16,
}

pub struct Dhcp6Service {
    server: Mutex<Server6>,
    store: Arc<dyn Store>,
    policy: Arc<dyn ClientPolicy>,
    observer: Option<Arc<dyn DhcpObserver>>,
    /// Where Relay-forwards are heard from (checked on each one's source, before the
    /// server's lock).
    relays: crate::Relays,
    pub stats: Stats,
}

fn lease_key(ip: Ipv6Addr) -> String {
    format!("{LEASE6_PREFIX}{ip}")
}

impl Dhcp6Service {
    /// Builds the service and restores every stored lease into `server`; `policy` admits
    /// clients (as DHCPv4's does), `observer` hears of PXE clients answered, and
    /// Relay-forwards are heard from `relays`.
    pub async fn new(
        mut server: Server6,
        store: Arc<dyn Store>,
        policy: Arc<dyn ClientPolicy>,
        observer: Option<Arc<dyn DhcpObserver>>,
        relays: crate::Relays,
    ) -> Result<Arc<Self>, ShellError> {
        for lease in crate::batch::stored_leases::<Lease6>(store.as_ref(), LEASE6_PREFIX).await? {
            server.leases.restore(lease);
        }
        tracing::info!(leases = server.leases.count(), "dhcp6: leases restored");
        Ok(Arc::new(Dhcp6Service {
            relays,
            server: Mutex::new(server),
            store,
            policy,
            observer,
            stats: Stats::default(),
        }))
    }

    /// A snapshot of every lease, for the API.
    pub fn leases(&self) -> Vec<Lease6> {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        server.leases.records().cloned().collect()
    }

    /// Serves on every listener until the task is dropped.
    pub async fn run(self: Arc<Self>, listeners: Vec<Listener6>) -> Result<(), ShellError> {
        let mut links = Vec::new();
        for l in listeners {
            let socket = bind(&l)?;
            tracing::info!(interface = %l.interface, address = %l.address, port = l.port, "dhcp6: listening");
            let link = Link6 {
                service: self.clone(),
                local: l.address,
            };
            links.push((link, socket, l.interface));
        }
        let me = self.clone();
        crate::batch::run(links, move || {
            let mut server = me.server.lock().unwrap_or_else(|p| p.into_inner());
            server.leases.expire_advertisements(unix_now());
        })
        .await
    }
}

/// One listener's protocol for the shared packet loop.
struct Link6 {
    service: Arc<Dhcp6Service>,
    local: Ipv6Addr,
}

impl Handler for Link6 {
    fn packet(&self, data: &[u8], peer: SocketAddr, now: &mut Vec<Reply>, next: &mut Batch) {
        let s = &self.service;
        s.stats.received.fetch_add(1, Ordering::Relaxed);
        let SocketAddr::V6(from) = peer else {
            return;
        };
        let Inbound6 { msg, relays } = match decode_inbound6(data) {
            Ok(m) => m,
            Err(e) => {
                s.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, error = %e, "dhcp6: dropped malformed packet");
                return;
            }
        };
        if s.relays.refuses(!relays.is_empty(), peer.ip()) {
            s.stats.relay_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "dhcp6: dropped a Relay-forward from a source not in relays");
            return;
        }
        let Some(via) = Via6::through(self.local, *from.ip(), &relays) else {
            s.stats.ignored.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "dhcp6: dropped a relayed message whose relays name no link address");
            return;
        };
        let outcome = s
            .server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .handle_via(&msg, &via, unix_now_ms(), s.policy.as_ref());
        if let Some(l) = outcome.limited {
            crate::shell::limited(&s.stats, l.kind, outcome.mac, l.report, || {
                *s.server.lock().unwrap_or_else(|p| p.into_inner()).limits()
            });
            return;
        }
        tracing::debug!(%peer, mac = ?outcome.mac, boot = ?outcome.boot, "dhcp6: {}", outcome.note);
        let Some(reply) = outcome.reply else {
            s.stats.ignored.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if let (Some(obs), Some(boot), Some(mac)) = (&s.observer, &outcome.boot, outcome.mac) {
            let answered = match reply.msg_type() {
                MessageType::Advertise => Answered::Advertise,
                _ => Answered::Reply,
            };
            // A client that asked for no address is shown with none.
            let ip = outcome.address.unwrap_or(Ipv6Addr::UNSPECIFIED);
            obs.pxe_answered(mac, answered, ip.into(), boot);
        }
        let counter = match reply.msg_type() {
            MessageType::Advertise => &s.stats.offers,
            _ => &s.stats.acks,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let bytes = match encode6(&reply).and_then(|b| encode_relayed6(b, &relays)) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "dhcp6: cannot encode reply");
                return;
            }
        };
        // Back where it came from: the client's own address and port on its link, or the
        // relay's (RFC 8415 19.3: a Relay-reply goes to the relay that forwarded).
        let to = SocketAddr::V6(SocketAddrV6::new(
            *from.ip(),
            from.port(),
            0,
            from.scope_id(),
        ));
        if outcome.changes.is_empty() {
            return now.push((bytes, to));
        }
        for lease in &outcome.changes {
            if let Ok(v) = serde_json::to_vec(lease) {
                next.ops.push(Op::put(lease_key(lease.ip), v));
            }
        }
        next.replies.push((bytes, to));
    }

    fn store(&self) -> Arc<dyn Store> {
        self.service.store.clone()
    }

    fn stats(&self) -> &Stats {
        &self.service.stats
    }
}

fn bind(l: &Listener6) -> Result<UdpSocket, ShellError> {
    let addr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, l.port, 0, 0));
    crate::batch::server_socket(
        &l.interface,
        addr,
        |s| s.set_only_v6(true),
        |s| s.join_multicast_v6(&ALL_SERVERS, l.index),
    )
}
