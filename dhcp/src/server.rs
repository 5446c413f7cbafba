//! The pure DHCP core: one request in, one [`Outcome`] out. No sockets, no clock, no disk.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::Encodable;
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};

use crate::leases::Binding;
use crate::pxe::{BootChoice, NoBoot, PxeRequest, arch_name};
use crate::ratelimit::{Limiter, RateLimits};
use crate::{BootPolicy, Lease, Leases, MacAddr, Relay};

/// Does this client get answers at all? The PXE filter plugs in here, so that relayed
/// requests (whose link-layer source is the relay) are filtered by `chaddr` too.
pub trait ClientPolicy: Send + Sync {
    fn admit(&self, mac: MacAddr) -> Admission;
    /// A DHCPv6 client whose MAC neither its DUID nor its source address gives: no list can
    /// name it (the kernel's PXE filter still sees its frames' source MAC).
    fn admit_unidentified(&self) -> Admission {
        Admission::Serve
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Serve,
    Ignore,
}

/// Serves everyone.
pub struct AllowAll;

impl ClientPolicy for AllowAll {
    fn admit(&self, _: MacAddr) -> Admission {
        Admission::Serve
    }
}

/// Fixed settings of the core.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub boot: BootPolicy,
    /// Port clients listen on (68).
    pub client_port: u16,
    /// Port relays listen on (67).
    pub relay_port: u16,
}

/// The lease change a reply depends on: it must be durable before the reply is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseChange {
    Put(Lease),
}

#[derive(Debug)]
pub struct Outcome {
    /// The request's message type, for metrics and logs.
    pub kind: Option<MessageType>,
    pub reply: Option<(Message, SocketAddrV4)>,
    pub change: Option<LeaseChange>,
    /// Leases released because their client bound another address: durable with `change`.
    pub released: Vec<Lease>,
    /// One line for the log: what was decided and why.
    pub note: String,
    /// For PXE clients: the boot file or URL they were given.
    pub boot: Option<String>,
    /// Dropped by a rate limit: no reply, nothing changed.
    pub limited: Option<Limited>,
}

/// Which rate limit dropped a request ([`crate::ratelimit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// The client's own budget (`per_client_burst`, `per_client_per_sec`).
    Client,
    /// The cap on addresses newly taken from the pools (`new_leases_per_window`).
    NewLeases,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    pub kind: LimitKind,
    /// A log line is due: this many requests were dropped by this limit (for this client,
    /// with [`LimitKind::Client`]) since the last line. `None` between lines.
    pub report: Option<u64>,
}

impl Outcome {
    /// A reply that changes nothing durable.
    fn replied(
        kind: Option<MessageType>,
        reply: (Message, SocketAddrV4),
        note: impl Into<String>,
    ) -> Self {
        Outcome {
            reply: Some(reply),
            ..Outcome::ignore(kind, note)
        }
    }

    fn ignore(kind: Option<MessageType>, note: impl Into<String>) -> Self {
        Outcome {
            kind,
            reply: None,
            change: None,
            released: Vec::new(),
            note: note.into(),
            boot: None,
            limited: None,
        }
    }

    fn limited(kind: Option<MessageType>, limit: LimitKind, report: Option<u64>) -> Self {
        Outcome {
            limited: Some(Limited {
                kind: limit,
                report,
            }),
            ..Outcome::ignore(kind, "dropped by a rate limit")
        }
    }
}

pub struct Server {
    pub leases: Leases,
    config: ServerConfig,
    limiter: Limiter,
}

fn pxe_request(msg: &Message) -> PxeRequest {
    let opts = msg.opts();
    let class = match opts.get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(c)) => c.as_slice(),
        _ => &[],
    };
    let user_class_ipxe = matches!(opts.get(OptionCode::UserClass),
        Some(DhcpOption::UserClass(u)) if u.windows(4).any(|w| w == b"iPXE"));
    PxeRequest {
        arch: match opts.get(OptionCode::ClientSystemArchitecture) {
            Some(DhcpOption::ClientSystemArchitecture(a)) => Some(u16::from(*a)),
            _ => None,
        },
        pxe_client: class.starts_with(b"PXEClient"),
        http_client: class.starts_with(b"HTTPClient"),
        ipxe: user_class_ipxe || opts.get(OptionCode::from(175u8)).is_some(),
    }
}

fn requested_ip(msg: &Message) -> Option<Ipv4Addr> {
    match msg.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    }
}

fn binding(msg: &Message) -> Binding {
    let opts = msg.opts();
    let client_id = match opts.get(OptionCode::ClientIdentifier) {
        Some(DhcpOption::ClientIdentifier(id)) => Some(hex::encode(id)),
        _ => None,
    };
    let hostname = match opts.get(OptionCode::Hostname) {
        Some(DhcpOption::Hostname(h)) => Some(h.chars().take(64).collect()),
        _ => None,
    };
    let relay = (!msg.giaddr().is_unspecified()).then(|| Relay {
        giaddr: msg.giaddr(),
        agent_info: opts
            .get(OptionCode::RelayAgentInformation)
            .and_then(|o| o.to_vec().ok())
            .map(|bytes| hex::encode(bytes.get(2..).unwrap_or_default())),
    });
    Binding {
        client_id,
        hostname,
        relay,
    }
}

impl Server {
    /// A server without rate limits; see [`Server::with_limits`].
    pub fn new(leases: Leases, config: ServerConfig) -> Self {
        Server {
            leases,
            config,
            limiter: Limiter::new(RateLimits::OFF),
        }
    }

    /// The same server with `limits` (checked by the caller with [`RateLimits::validate`]);
    /// the budgets start full.
    pub fn with_limits(mut self, limits: RateLimits) -> Self {
        self.limiter = Limiter::new(limits);
        self
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn limits(&self) -> &RateLimits {
        self.limiter.limits()
    }

    /// Clients whose request budget is remembered (at most `max_tracked_clients`).
    pub fn tracked_clients(&self) -> usize {
        self.limiter.tracked_clients()
    }

    /// Decides the answer to `msg`, which arrived on the interface whose address is `local`,
    /// at `now` (Unix seconds). [`Server::handle_ms`] with the time in seconds.
    pub fn handle(
        &mut self,
        msg: &Message,
        local: Ipv4Addr,
        now: u64,
        policy: &dyn ClientPolicy,
    ) -> Outcome {
        self.handle_ms(msg, local, now.saturating_mul(1000), policy)
    }

    /// Decides the answer to `msg`, which arrived on the interface whose address is `local`,
    /// at `now_ms` (Unix milliseconds: leases see the second, rate limits the millisecond).
    /// A request over a rate limit gets [`Outcome::limited`] and changes nothing.
    pub fn handle_ms(
        &mut self,
        msg: &Message,
        local: Ipv4Addr,
        now_ms: u64,
        policy: &dyn ClientPolicy,
    ) -> Outcome {
        let now = now_ms / 1000;
        let kind = msg.opts().msg_type();
        let Some(mac) = MacAddr::from_chaddr(msg.chaddr()) else {
            return Outcome::ignore(kind, "chaddr shorter than 6 bytes");
        };
        if policy.admit(mac) == Admission::Ignore {
            return Outcome::ignore(kind, format!("{mac} is not admitted by the PXE filter"));
        }
        let link = if msg.giaddr().is_unspecified() {
            local
        } else {
            msg.giaddr()
        };
        let Some(subnet) = self.leases.subnet_for(link) else {
            return Outcome::ignore(kind, format!("no subnet configured for link {link}"));
        };
        // Only requests the server would act on are charged: a client ignored anyway costs
        // nothing and takes no place in the table.
        if let Some(report) = self.limiter.over_client_budget(mac, now_ms) {
            return Outcome::limited(kind, LimitKind::Client, report);
        }
        match kind {
            Some(MessageType::Discover) => {
                let Some(pick) = self.leases.pick(subnet, mac, requested_ip(msg), now) else {
                    return Outcome::ignore(kind, format!("pool exhausted on subnet {link}"));
                };
                let new = !self.leases.is_theirs(mac, pick.ip);
                if new && let Some(report) = self.limiter.over_new_lease_cap(subnet, now_ms) {
                    return Outcome::limited(kind, LimitKind::NewLeases, report);
                }
                let ip = self.leases.hold(pick, mac, now);
                if new {
                    self.limiter.record_new_lease(subnet, now_ms);
                }
                let (reply, note, boot) =
                    self.reply(msg, MessageType::Offer, ip, subnet, local, mac);
                Outcome {
                    boot,
                    ..Outcome::replied(kind, reply, format!("offer {ip} to {mac}{note}"))
                }
            }
            Some(MessageType::Request) => self.request(msg, subnet, local, mac, now_ms),
            Some(MessageType::Release) => {
                let change = self.leases.release(mac, msg.ciaddr(), now);
                Outcome {
                    change: change.map(LeaseChange::Put),
                    ..Outcome::ignore(kind, format!("{mac} released {}", msg.ciaddr()))
                }
            }
            Some(MessageType::Decline) => {
                let Some(ip) = requested_ip(msg) else {
                    return Outcome::ignore(kind, "DECLINE without option 50");
                };
                let change = self.leases.decline(subnet, mac, ip, now);
                Outcome {
                    change: change.map(LeaseChange::Put),
                    ..Outcome::ignore(kind, format!("{mac} declined {ip}: quarantined"))
                }
            }
            Some(MessageType::Inform) => {
                if msg.ciaddr().is_unspecified() {
                    return Outcome::ignore(kind, "INFORM without ciaddr");
                }
                let (mut reply, note, _) = self.reply(
                    msg,
                    MessageType::Ack,
                    Ipv4Addr::UNSPECIFIED,
                    subnet,
                    local,
                    mac,
                );
                for code in [
                    OptionCode::AddressLeaseTime,
                    OptionCode::Renewal,
                    OptionCode::Rebinding,
                ] {
                    reply.0.opts_mut().remove(code);
                }
                let note = format!("inform {mac} at {}{note}", msg.ciaddr());
                Outcome::replied(kind, reply, note)
            }
            other => Outcome::ignore(kind, format!("message type {other:?} is not for a server")),
        }
    }

    fn request(
        &mut self,
        msg: &Message,
        subnet: usize,
        local: Ipv4Addr,
        mac: MacAddr,
        now_ms: u64,
    ) -> Outcome {
        let now = now_ms / 1000;
        let kind = Some(MessageType::Request);
        let server_id = match msg.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(id)) => Some(*id),
            _ => None,
        };
        let (ip, state) = match (server_id, requested_ip(msg), msg.ciaddr()) {
            (Some(id), _, _) if id != local => {
                self.leases.withdraw_offer(mac);
                return Outcome::ignore(kind, format!("{mac} chose server {id}"));
            }
            (Some(_), Some(ip), _) => (ip, "selecting"),
            (Some(_), None, _) => return Outcome::ignore(kind, "REQUEST without option 50"),
            (None, Some(ip), c) if c.is_unspecified() => (ip, "init-reboot"),
            (None, _, c) if !c.is_unspecified() => (c, "renewing"),
            _ => return Outcome::ignore(kind, "REQUEST with neither option 50 nor ciaddr"),
        };
        let new = !self.leases.is_theirs(mac, ip);
        if new && let Some(report) = self.limiter.over_new_lease_cap(subnet, now_ms) {
            return Outcome::limited(kind, LimitKind::NewLeases, report);
        }
        match self.leases.ack(subnet, mac, ip, binding(msg), now) {
            Ok(lease) => {
                if new {
                    self.limiter.record_new_lease(subnet, now_ms);
                }
                let (reply, note, boot) = self.reply(msg, MessageType::Ack, ip, subnet, local, mac);
                Outcome {
                    change: Some(LeaseChange::Put(lease)),
                    released: self.leases.take_moved_from(),
                    boot,
                    ..Outcome::replied(kind, reply, format!("ack {ip} to {mac} ({state}){note}"))
                }
            }
            Err(refusal) => {
                let reply = self.nak(msg, local);
                let note = format!("nak {ip} to {mac} ({state}): {refusal:?}");
                Outcome::replied(kind, reply, note)
            }
        }
    }

    /// Where a reply goes (RFC 2131 §4.1).
    fn destination(&self, req: &Message, yiaddr: Ipv4Addr, nak: bool) -> SocketAddrV4 {
        if !req.giaddr().is_unspecified() {
            SocketAddrV4::new(req.giaddr(), self.config.relay_port)
        } else if !nak && !req.ciaddr().is_unspecified() {
            SocketAddrV4::new(req.ciaddr(), self.config.client_port)
        } else {
            // Unicast to an unconfigured client needs an ARP entry we cannot safely add;
            // broadcast works for every client.
            let _ = yiaddr;
            SocketAddrV4::new(Ipv4Addr::BROADCAST, self.config.client_port)
        }
    }

    fn skeleton(
        &self,
        req: &Message,
        mtype: MessageType,
        yiaddr: Ipv4Addr,
        local: Ipv4Addr,
    ) -> Message {
        let mut r = Message::new_with_id(
            req.xid(),
            if mtype == MessageType::Ack {
                req.ciaddr()
            } else {
                Ipv4Addr::UNSPECIFIED
            },
            yiaddr,
            Ipv4Addr::UNSPECIFIED,
            req.giaddr(),
            req.chaddr(),
        );
        r.set_opcode(Opcode::BootReply)
            .set_htype(req.htype())
            .set_flags(Flags::new(u16::from(req.flags())));
        r.opts_mut().insert(DhcpOption::MessageType(mtype));
        r.opts_mut().insert(DhcpOption::ServerIdentifier(local));
        if let Some(agent) = req.opts().get(OptionCode::RelayAgentInformation) {
            // RFC 3046: the relay agent information is echoed back unchanged.
            r.opts_mut().insert(agent.clone());
        }
        r
    }

    fn nak(&self, req: &Message, local: Ipv4Addr) -> (Message, SocketAddrV4) {
        let mut r = self.skeleton(req, MessageType::Nak, Ipv4Addr::UNSPECIFIED, local);
        if !req.giaddr().is_unspecified() {
            // A NAK through a relay must be broadcast by the relay.
            r.set_flags(Flags::new(0x8000));
        }
        (r, self.destination(req, Ipv4Addr::UNSPECIFIED, true))
    }

    fn reply(
        &self,
        req: &Message,
        mtype: MessageType,
        yiaddr: Ipv4Addr,
        subnet: usize,
        local: Ipv4Addr,
        mac: MacAddr,
    ) -> ((Message, SocketAddrV4), String, Option<String>) {
        let s = self.leases.subnet(subnet);
        let mut r = self.skeleton(req, mtype, yiaddr, local);
        let opts = r.opts_mut();
        opts.insert(DhcpOption::SubnetMask(s.network.netmask()));
        if !s.routers.is_empty() {
            opts.insert(DhcpOption::Router(s.routers.clone()));
        }
        if !s.dns.is_empty() {
            opts.insert(DhcpOption::DomainNameServer(s.dns.clone()));
        }
        if let Some(d) = &s.domain {
            opts.insert(DhcpOption::DomainName(d.clone()));
        }
        if let Some(h) = self.leases.reserved_hostname(mac, yiaddr) {
            opts.insert(DhcpOption::Hostname(h.to_string()));
        }
        opts.insert(DhcpOption::AddressLeaseTime(s.lease_time));
        opts.insert(DhcpOption::Renewal(s.lease_time / 2));
        opts.insert(DhcpOption::Rebinding(s.lease_time / 8 * 7));
        let (note, boot) = self.boot_options(req, &mut r, mac, local);
        let to = self.destination(req, yiaddr, false);
        ((r, to), note, boot)
    }

    /// Adds the PXE answer to a reply; returns a note for the log and the boot file given.
    fn boot_options(
        &self,
        req: &Message,
        r: &mut Message,
        mac: MacAddr,
        local: Ipv4Addr,
    ) -> (String, Option<String>) {
        let pxe = pxe_request(req);
        let signed = self.config.boot.signs(r.yiaddr());
        let choice = match self.config.boot.choose(&pxe, mac, local, signed) {
            Ok(c) => c,
            Err(NoBoot::NotPxe) => return (String::new(), None),
            Err(NoBoot::UnknownArch(a)) => {
                let note = format!(
                    "; no boot file for client architecture {a} ({}): add it under [boot.arch]",
                    arch_name(a)
                );
                return (note, None);
            }
        };
        if let Some(DhcpOption::ClientMachineIdentifier(uuid)) =
            req.opts().get(OptionCode::ClientMachineIdentifier)
        {
            r.opts_mut()
                .insert(DhcpOption::ClientMachineIdentifier(uuid.clone()));
        }
        match choice {
            BootChoice::Tftp { server, file } => {
                r.set_siaddr(server);
                if file.len() < 128 {
                    r.set_fname_str(&file);
                }
                let opts = r.opts_mut();
                opts.insert(DhcpOption::TFTPServerName(server.to_string().into_bytes()));
                opts.insert(DhcpOption::BootfileName(file.clone().into_bytes()));
                if pxe.pxe_client {
                    opts.insert(DhcpOption::ClassIdentifier(b"PXEClient".to_vec()));
                    // PXE_DISCOVERY_CONTROL = 8: boot the file named here, no boot server discovery.
                    opts.insert(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
                }
                (format!("; boot {file} over TFTP from {server}"), Some(file))
            }
            BootChoice::Http { url, http_client } => {
                if url.len() < 128 {
                    r.set_fname_str(&url);
                }
                let opts = r.opts_mut();
                opts.insert(DhcpOption::BootfileName(url.clone().into_bytes()));
                if http_client {
                    opts.insert(DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()));
                }
                (format!("; boot {url}"), Some(url))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use dhcproto::v4::{Architecture, relay};

    use super::*;
    use crate::{LeaseState, Reservation, Subnet};

    const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];

    /// `MAC` takes `ip` with a REQUEST at time 0.
    fn bind(s: &mut Server, ip: Ipv4Addr) {
        s.handle(
            &msg(
                MessageType::Request,
                MAC,
                vec![DhcpOption::RequestedIpAddress(ip)],
            ),
            LOCAL,
            0,
            &AllowAll,
        );
    }

    fn server() -> Server {
        let subnet = |net: &str, a: [u8; 4], b: [u8; 4]| Subnet {
            routers: vec![LOCAL],
            dns: vec![LOCAL],
            domain: Some("lab".into()),
            ..Subnet::with_pool(net.parse().unwrap(), a.into(), b.into(), 3600)
        };
        let leases = Leases::new(
            vec![
                subnet("198.18.0.0/24", [198, 18, 0, 100], [198, 18, 0, 199]),
                subnet("198.19.5.0/24", [198, 19, 5, 10], [198, 19, 5, 20]),
            ],
            vec![Reservation {
                mac: MacAddr([0x52, 0x54, 0, 0, 0, 0x42]),
                ip: Ipv4Addr::new(198, 18, 0, 42),
                hostname: Some("fixed".into()),
            }],
        )
        .unwrap();
        Server::new(
            leases,
            ServerConfig {
                boot: BootPolicy::new("http://198.18.0.1:8080", &BTreeMap::new()),
                client_port: 68,
                relay_port: 67,
            },
        )
    }

    fn msg(mtype: MessageType, mac: [u8; 6], opts: Vec<DhcpOption>) -> Message {
        let mut m = Message::new_with_id(
            7,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &mac,
        );
        m.opts_mut().insert(DhcpOption::MessageType(mtype));
        for o in opts {
            m.opts_mut().insert(o);
        }
        m
    }

    /// The offer to a discover from MAC with `opts`.
    fn offer_to(s: &mut Server, opts: Vec<DhcpOption>) -> Message {
        let out = s.handle(&msg(MessageType::Discover, MAC, opts), LOCAL, 0, &AllowAll);
        out.reply.expect("an offer").0
    }

    /// The message's boot file option (67), as text.
    fn bootfile(m: &Message) -> Option<String> {
        match opt(m, OptionCode::BootfileName)? {
            DhcpOption::BootfileName(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// A message from a client that holds `ciaddr` (a renewal, a release, an inform).
    fn msg_from(mtype: MessageType, mac: [u8; 6], ciaddr: Ipv4Addr) -> Message {
        let mut m = msg(mtype, mac, vec![]);
        m.set_ciaddr(ciaddr);
        m
    }

    fn opt(m: &Message, code: OptionCode) -> Option<&DhcpOption> {
        m.opts().get(code)
    }

    #[test]
    fn dora_binds_a_lease_and_persists_only_the_ack() {
        let mut s = server();
        let out = s.handle(
            &msg(MessageType::Discover, MAC, vec![]),
            LOCAL,
            1000,
            &AllowAll,
        );
        let (offer, to) = out.reply.unwrap();
        assert!(out.change.is_none(), "an OFFER changes nothing durable");
        assert_eq!(to, SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
        assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
        let ip = offer.yiaddr();
        assert_eq!(ip, Ipv4Addr::new(198, 18, 0, 100));
        assert_eq!(
            opt(&offer, OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(LOCAL))
        );
        assert_eq!(
            opt(&offer, OptionCode::BootfileName),
            None,
            "not a PXE client"
        );

        let req = msg(
            MessageType::Request,
            MAC,
            vec![
                DhcpOption::ServerIdentifier(LOCAL),
                DhcpOption::RequestedIpAddress(ip),
            ],
        );
        let out = s.handle(&req, LOCAL, 1001, &AllowAll);
        let (ack, _) = out.reply.unwrap();
        assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
        assert_eq!(ack.yiaddr(), ip);
        assert_eq!(
            opt(&ack, OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(3600))
        );
        let Some(LeaseChange::Put(lease)) = out.change else {
            panic!("no lease change")
        };
        assert_eq!(
            (lease.ip, lease.state, lease.expires),
            (ip, LeaseState::Bound, 4601)
        );
    }

    #[test]
    fn request_for_another_server_withdraws_the_offer() {
        let mut s = server();
        s.handle(
            &msg(MessageType::Discover, MAC, vec![]),
            LOCAL,
            0,
            &AllowAll,
        );
        let req = msg(
            MessageType::Request,
            MAC,
            vec![
                DhcpOption::ServerIdentifier(Ipv4Addr::new(198, 18, 0, 2)),
                DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 0, 100)),
            ],
        );
        let out = s.handle(&req, LOCAL, 1, &AllowAll);
        assert!(out.reply.is_none() && out.change.is_none());
        // The address is free for the next client at once.
        let d = msg(
            MessageType::Discover,
            [2; 6],
            vec![DhcpOption::RequestedIpAddress(Ipv4Addr::new(
                198, 18, 0, 100,
            ))],
        );
        let out = s.handle(&d, LOCAL, 2, &AllowAll);
        assert_eq!(
            out.reply.unwrap().0.yiaddr(),
            Ipv4Addr::new(198, 18, 0, 100)
        );
    }

    #[test]
    fn init_reboot_for_a_taken_or_foreign_address_is_naked() {
        let mut s = server();
        let take = msg(
            MessageType::Request,
            [9; 6],
            vec![DhcpOption::RequestedIpAddress(Ipv4Addr::new(
                198, 18, 0, 150,
            ))],
        );
        assert!(s.handle(&take, LOCAL, 0, &AllowAll).change.is_some());
        for ip in [Ipv4Addr::new(198, 18, 0, 150), Ipv4Addr::new(10, 9, 9, 9)] {
            let req = msg(
                MessageType::Request,
                MAC,
                vec![DhcpOption::RequestedIpAddress(ip)],
            );
            let out = s.handle(&req, LOCAL, 1, &AllowAll);
            let (nak, to) = out.reply.unwrap();
            assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak), "{ip}");
            assert_eq!(to, SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
            assert!(out.change.is_none());
        }
    }

    #[test]
    fn renewal_is_unicast_to_ciaddr() {
        let mut s = server();
        let ip = Ipv4Addr::new(198, 18, 0, 120);
        bind(&mut s, ip);
        let renew = msg_from(MessageType::Request, MAC, ip);
        let out = s.handle(&renew, LOCAL, 1800, &AllowAll);
        let (ack, to) = out.reply.unwrap();
        assert_eq!(
            (ack.opts().msg_type(), ack.yiaddr(), ack.ciaddr()),
            (Some(MessageType::Ack), ip, ip)
        );
        assert_eq!(to, SocketAddrV4::new(ip, 68));
        let Some(LeaseChange::Put(l)) = out.change else {
            panic!()
        };
        assert_eq!(l.expires, 1800 + 3600);
    }

    #[test]
    fn relayed_requests_use_the_relay_subnet_and_record_option_82() {
        let mut s = server();
        let giaddr = Ipv4Addr::new(198, 19, 5, 1);
        let mut info = relay::RelayAgentInformation::default();
        info.insert(relay::RelayInfo::AgentCircuitId(b"port7".to_vec()));
        let mut d = msg(
            MessageType::Discover,
            MAC,
            vec![DhcpOption::RelayAgentInformation(info.clone())],
        );
        d.set_giaddr(giaddr);
        let (offer, to) = s.handle(&d, LOCAL, 0, &AllowAll).reply.unwrap();
        assert_eq!(to, SocketAddrV4::new(giaddr, 67));
        assert_eq!(offer.yiaddr(), Ipv4Addr::new(198, 19, 5, 10));
        assert_eq!(offer.giaddr(), giaddr);
        assert!(
            opt(&offer, OptionCode::RelayAgentInformation).is_some(),
            "82 echoed"
        );
        let mut r = msg(
            MessageType::Request,
            MAC,
            vec![
                DhcpOption::ServerIdentifier(LOCAL),
                DhcpOption::RequestedIpAddress(offer.yiaddr()),
                DhcpOption::RelayAgentInformation(info),
            ],
        );
        r.set_giaddr(giaddr);
        let out = s.handle(&r, LOCAL, 1, &AllowAll);
        let Some(LeaseChange::Put(l)) = out.change else {
            panic!()
        };
        let relay = l.relay.unwrap();
        assert_eq!(relay.giaddr, giaddr);
        // sub-option 1 (circuit id), length 5, "port7"
        assert_eq!(relay.agent_info.as_deref(), Some("0105706f727437"));
    }

    #[test]
    fn pxe_clients_get_boot_files_by_architecture() {
        let mut s = server();
        let cases: &[(u16, Option<&[u8]>, &str)] = &[
            (
                0,
                Some(b"PXEClient:Arch:00000:UNDI:002001"),
                "undionly.kpxe",
            ),
            (7, Some(b"PXEClient:Arch:00007:UNDI:003016"), "snponly.efi"),
            (9, Some(b"PXEClient:Arch:00009:UNDI:003016"), "snponly.efi"),
            (
                11,
                Some(b"PXEClient:Arch:00011:UNDI:003000"),
                "ipxe-arm64.efi",
            ),
        ];
        for (arch, class, file) in cases {
            let mut opts = vec![DhcpOption::ClientSystemArchitecture(Architecture::from(
                *arch,
            ))];
            if let Some(c) = class {
                opts.push(DhcpOption::ClassIdentifier(c.to_vec()));
            }
            let offer = offer_to(&mut s, opts);
            assert_eq!(offer.siaddr(), LOCAL, "arch {arch}");
            assert_eq!(offer.fname_str().unwrap().unwrap(), *file, "arch {arch}");
            assert_eq!(bootfile(&offer).as_deref(), Some(*file));
            assert_eq!(
                opt(&offer, OptionCode::TFTPServerName),
                Some(&DhcpOption::TFTPServerName(b"198.18.0.1".to_vec()))
            );
            assert_eq!(
                opt(&offer, OptionCode::ClassIdentifier),
                Some(&DhcpOption::ClassIdentifier(b"PXEClient".to_vec()))
            );
        }
        // UEFI HTTP boot: a URL, and HTTPClient echoed.
        let opts = vec![
            DhcpOption::ClientSystemArchitecture(Architecture::from(16)),
            DhcpOption::ClassIdentifier(b"HTTPClient:Arch:00016".to_vec()),
        ];
        let offer = offer_to(&mut s, opts);
        assert_eq!(
            bootfile(&offer).as_deref(),
            Some("http://198.18.0.1:8080/boot/assets/ipxe.efi")
        );
        assert_eq!(
            opt(&offer, OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()))
        );
    }

    #[test]
    fn ipxe_gets_the_script_url_so_there_is_no_boot_loop() {
        let mut s = server();
        for opts in [
            vec![DhcpOption::UserClass(b"iPXE".to_vec())],
            vec![DhcpOption::Unknown(dhcproto::v4::UnknownOption::new(
                OptionCode::from(175u8),
                vec![0xb1, 1, 1],
            ))],
        ] {
            let mut opts = opts;
            opts.push(DhcpOption::ClientSystemArchitecture(Architecture::from(0)));
            opts.push(DhcpOption::ClassIdentifier(
                b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
            ));
            let offer = offer_to(&mut s, opts);
            assert_eq!(
                bootfile(&offer).as_deref(),
                Some("http://198.18.0.1:8080/boot/52:54:00:00:00:01.ipxe")
            );
        }
    }

    #[test]
    fn reservations_and_the_client_policy() {
        struct DenyOne;
        impl ClientPolicy for DenyOne {
            fn admit(&self, mac: MacAddr) -> Admission {
                if mac.0 == MAC {
                    Admission::Ignore
                } else {
                    Admission::Serve
                }
            }
        }
        let mut s = server();
        let out = s.handle(&msg(MessageType::Discover, MAC, vec![]), LOCAL, 0, &DenyOne);
        assert!(out.reply.is_none(), "{}", out.note);
        let out = s.handle(
            &msg(MessageType::Discover, [0x52, 0x54, 0, 0, 0, 0x42], vec![]),
            LOCAL,
            0,
            &DenyOne,
        );
        let reply = out.reply.unwrap().0;
        assert_eq!(reply.yiaddr(), Ipv4Addr::new(198, 18, 0, 42));
        // The reservation's host name goes with it (option 12); nobody else is given one.
        assert_eq!(
            reply.opts().get(OptionCode::Hostname),
            Some(&DhcpOption::Hostname("fixed".into()))
        );
        let other = s.handle(
            &msg(MessageType::Discover, [0x52, 0x54, 0, 0, 0, 7], vec![]),
            LOCAL,
            0,
            &DenyOne,
        );
        assert!(
            other
                .reply
                .unwrap()
                .0
                .opts()
                .get(OptionCode::Hostname)
                .is_none()
        );
    }

    #[test]
    fn release_decline_and_inform() {
        let mut s = server();
        let ip = Ipv4Addr::new(198, 18, 0, 100);
        bind(&mut s, ip);
        let out = s.handle(
            &msg_from(MessageType::Release, MAC, ip),
            LOCAL,
            10,
            &AllowAll,
        );
        assert!(out.reply.is_none());
        assert!(matches!(
            out.change,
            Some(LeaseChange::Put(Lease {
                state: LeaseState::Released,
                ..
            }))
        ));

        let dec = msg(
            MessageType::Decline,
            MAC,
            vec![DhcpOption::RequestedIpAddress(ip)],
        );
        let out = s.handle(&dec, LOCAL, 11, &AllowAll);
        assert!(matches!(
            out.change,
            Some(LeaseChange::Put(Lease {
                state: LeaseState::Declined,
                ..
            }))
        ));

        let inf = msg_from(MessageType::Inform, [3; 6], Ipv4Addr::new(198, 18, 0, 77));
        let out = s.handle(&inf, LOCAL, 12, &AllowAll);
        let (ack, to) = out.reply.unwrap();
        assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(to, SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 77), 68));
        assert!(opt(&ack, OptionCode::AddressLeaseTime).is_none());
        assert!(out.change.is_none());
    }

    fn limited(out: &Outcome) -> Option<LimitKind> {
        out.limited.map(|l| l.kind)
    }

    fn discover(s: &mut Server, mac: [u8; 6], at_ms: u64) -> Outcome {
        s.handle_ms(
            &msg(MessageType::Discover, mac, vec![]),
            LOCAL,
            at_ms,
            &AllowAll,
        )
    }

    /// DISCOVER then REQUEST of what was offered; the ACKed address.
    fn dora(s: &mut Server, mac: [u8; 6], at_ms: u64) -> Option<Ipv4Addr> {
        let (offer, _) = discover(s, mac, at_ms).reply?;
        let req = msg(
            MessageType::Request,
            mac,
            vec![
                DhcpOption::ServerIdentifier(LOCAL),
                DhcpOption::RequestedIpAddress(offer.yiaddr()),
            ],
        );
        let (ack, _) = s.handle_ms(&req, LOCAL, at_ms, &AllowAll).reply?;
        (ack.opts().msg_type() == Some(MessageType::Ack)).then_some(ack.yiaddr())
    }

    #[test]
    fn a_hammering_client_is_dropped_while_others_are_served() {
        let mut s = server().with_limits(RateLimits {
            per_client_burst: 5,
            per_client_per_sec: 1,
            max_tracked_clients: 16,
            ..RateLimits::OFF
        });
        let outs: Vec<Outcome> = (0..8).map(|_| discover(&mut s, MAC, 1000)).collect();
        assert!(outs[..5].iter().all(|o| o.reply.is_some()));
        for (i, o) in outs[5..].iter().enumerate() {
            assert_eq!(limited(o), Some(LimitKind::Client));
            assert!(o.reply.is_none() && o.change.is_none());
            // Only the first drop asks for a log line.
            assert_eq!(o.limited.unwrap().report, (i == 0).then_some(1));
        }
        assert!(
            discover(&mut s, [2; 6], 1000).reply.is_some(),
            "another client"
        );
        // A second later the hammering client has one request again.
        assert!(discover(&mut s, MAC, 2000).reply.is_some());
        assert_eq!(
            limited(&discover(&mut s, MAC, 2000)),
            Some(LimitKind::Client)
        );
        // Clients ignored anyway (the policy) take no budget and no place in the table.
        let tracked = s.tracked_clients();
        struct DenyAll;
        impl ClientPolicy for DenyAll {
            fn admit(&self, _: MacAddr) -> Admission {
                Admission::Ignore
            }
        }
        s.handle_ms(
            &msg(MessageType::Discover, [7; 6], vec![]),
            LOCAL,
            3000,
            &DenyAll,
        );
        assert_eq!(s.tracked_clients(), tracked);
    }

    #[test]
    fn the_new_lease_cap_counts_only_addresses_newly_taken() {
        let mut s = server().with_limits(RateLimits {
            new_leases_per_window: 3,
            new_lease_window_secs: 10,
            ..RateLimits::OFF
        });
        // A full boot of one machine (PXE, then iPXE, then the ramdisk: three DORAs, and a
        // renewal) takes one new address.
        let ip = dora(&mut s, MAC, 0).unwrap();
        assert_eq!(dora(&mut s, MAC, 10), Some(ip));
        assert_eq!(dora(&mut s, MAC, 20), Some(ip));
        let renew = msg_from(MessageType::Request, MAC, ip);
        assert!(s.handle_ms(&renew, LOCAL, 30, &AllowAll).change.is_some());
        // A reservation takes nothing from the pool.
        assert_eq!(
            dora(&mut s, [0x52, 0x54, 0, 0, 0, 0x42], 40),
            Some(Ipv4Addr::new(198, 18, 0, 42))
        );
        // Strangers: two more fit, then they are dropped and nothing is held for them.
        assert!(discover(&mut s, [0x0a; 6], 50).reply.is_some());
        let init_reboot = |mac: [u8; 6], last: u8| {
            msg(
                MessageType::Request,
                mac,
                vec![DhcpOption::RequestedIpAddress(Ipv4Addr::new(
                    198, 18, 0, last,
                ))],
            )
        };
        let out = s.handle_ms(&init_reboot([0x0b; 6], 150), LOCAL, 60, &AllowAll);
        assert!(
            out.change.is_some(),
            "an INIT-REBOOT for a free address is a new lease"
        );
        let out = discover(&mut s, [0x0c; 6], 70);
        assert_eq!(limited(&out), Some(LimitKind::NewLeases));
        assert_eq!(out.limited.unwrap().report, Some(1));
        assert!(out.reply.is_none());
        let out = s.handle_ms(&init_reboot([0x0d; 6], 160), LOCAL, 80, &AllowAll);
        assert_eq!(limited(&out), Some(LimitKind::NewLeases));
        assert!(out.change.is_none(), "nothing bound");
        // Meanwhile every known client is served: the bound one, the one with an offer.
        assert_eq!(dora(&mut s, MAC, 90), Some(ip));
        assert!(dora(&mut s, [0x0a; 6], 100).is_some());
        // A known client moving to another free address takes a new one: capped too.
        let out = s.handle_ms(&init_reboot(MAC, 170), LOCAL, 110, &AllowAll);
        assert_eq!(limited(&out), Some(LimitKind::NewLeases));
        // Ten seconds after the first, a new address may be taken again.
        assert!(discover(&mut s, [0x0c; 6], 10_000).reply.is_some());
        assert_eq!(
            limited(&discover(&mut s, [0x0e; 6], 10_001)),
            Some(LimitKind::NewLeases)
        );
    }

    #[test]
    fn a_flood_on_one_segment_leaves_the_others_their_budget() {
        let mut s = server().with_limits(RateLimits {
            new_leases_per_window: 3,
            new_lease_window_secs: 60,
            ..RateLimits::OFF
        });
        // Made-up MACs on the local segment use up its budget ...
        for i in 0..10u8 {
            discover(&mut s, [0x02, 0, 0, 0, 1, i], 1_000 + u64::from(i));
        }
        assert_eq!(
            limited(&discover(&mut s, [0x02, 0, 0, 0, 2, 0], 1_100)),
            Some(LimitKind::NewLeases)
        );
        // ... and a machine behind a relay still gets its address.
        let mut d = msg(MessageType::Discover, [0x02, 0, 0, 0, 3, 0], vec![]);
        d.set_giaddr(Ipv4Addr::new(198, 19, 5, 1));
        let out = s.handle_ms(&d, LOCAL, 1_200, &AllowAll);
        assert!(out.limited.is_none(), "{:?}", out.limited);
        assert_eq!(out.reply.unwrap().0.yiaddr(), Ipv4Addr::new(198, 19, 5, 10));
    }

    #[test]
    fn a_discover_decline_loop_is_capped() {
        let mut s = server().with_limits(RateLimits {
            new_leases_per_window: 4,
            new_lease_window_secs: 60,
            ..RateLimits::OFF
        });
        let mut quarantined = 0;
        for t in 0..50 {
            let Some((offer, _)) = discover(&mut s, MAC, t * 100).reply else {
                continue;
            };
            let dec = msg(
                MessageType::Decline,
                MAC,
                vec![DhcpOption::RequestedIpAddress(offer.yiaddr())],
            );
            if s.handle_ms(&dec, LOCAL, t * 100 + 1, &AllowAll)
                .change
                .is_some()
            {
                quarantined += 1;
            }
        }
        assert_eq!(quarantined, 4, "one client cannot quarantine the pool");
    }

    #[test]
    fn handle_in_seconds_is_handle_ms_at_the_second() {
        let mut s = server().with_limits(RateLimits {
            per_client_burst: 1,
            per_client_per_sec: 1,
            max_tracked_clients: 8,
            ..RateLimits::OFF
        });
        let d = msg(MessageType::Discover, MAC, vec![]);
        assert!(s.handle(&d, LOCAL, 5, &AllowAll).reply.is_some());
        assert!(s.handle(&d, LOCAL, 5, &AllowAll).limited.is_some());
        assert!(s.handle(&d, LOCAL, 6, &AllowAll).reply.is_some());
        // Without limits (Server::new), nothing is ever limited.
        let mut s = server();
        assert!((0..1000).all(|_| s.handle(&d, LOCAL, 0, &AllowAll).limited.is_none()));
    }
}
