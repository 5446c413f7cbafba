//! The pure DHCP core: one request in, one [`Outcome`] out. No sockets, no clock, no disk.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::Encodable;
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};

use crate::leases::Binding;
use crate::pxe::{BootChoice, NoBoot, PxeRequest, arch_name};
use crate::{BootPolicy, Lease, Leases, MacAddr, Relay};

/// Does this client get answers at all? The PXE filter plugs in here, so that relayed
/// requests (whose link-layer source is the relay) are filtered by `chaddr` too.
pub trait ClientPolicy: Send + Sync {
    fn admit(&self, mac: MacAddr) -> Admission;
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
    /// One line for the log: what was decided and why.
    pub note: String,
    /// For PXE clients: the boot file or URL they were given.
    pub boot: Option<String>,
}

impl Outcome {
    fn ignore(kind: Option<MessageType>, note: impl Into<String>) -> Self {
        Outcome {
            kind,
            reply: None,
            change: None,
            note: note.into(),
            boot: None,
        }
    }
}

pub struct Server {
    pub leases: Leases,
    config: ServerConfig,
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
    pub fn new(leases: Leases, config: ServerConfig) -> Self {
        Server { leases, config }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Decides the answer to `msg`, which arrived on the interface whose address is `local`,
    /// at `now` (Unix seconds).
    pub fn handle(
        &mut self,
        msg: &Message,
        local: Ipv4Addr,
        now: u64,
        policy: &dyn ClientPolicy,
    ) -> Outcome {
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
        match kind {
            Some(MessageType::Discover) => {
                let Some(ip) = self.leases.offer(subnet, mac, requested_ip(msg), now) else {
                    return Outcome::ignore(kind, format!("pool exhausted on subnet {link}"));
                };
                let (reply, note, boot) =
                    self.reply(msg, MessageType::Offer, ip, subnet, local, mac);
                Outcome {
                    kind,
                    reply: Some(reply),
                    change: None,
                    boot,
                    note: format!("offer {ip} to {mac}{note}"),
                }
            }
            Some(MessageType::Request) => self.request(msg, subnet, local, mac, now),
            Some(MessageType::Release) => {
                let change = self.leases.release(mac, msg.ciaddr(), now);
                Outcome {
                    kind,
                    boot: None,
                    note: format!("{mac} released {}", msg.ciaddr()),
                    reply: None,
                    change: change.map(LeaseChange::Put),
                }
            }
            Some(MessageType::Decline) => {
                let Some(ip) = requested_ip(msg) else {
                    return Outcome::ignore(kind, "DECLINE without option 50");
                };
                let change = self.leases.decline(subnet, mac, ip, now);
                Outcome {
                    kind,
                    boot: None,
                    note: format!("{mac} declined {ip}: quarantined"),
                    reply: None,
                    change: change.map(LeaseChange::Put),
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
                Outcome {
                    kind,
                    reply: Some(reply),
                    change: None,
                    boot: None,
                    note: format!("inform {mac} at {}{note}", msg.ciaddr()),
                }
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
        now: u64,
    ) -> Outcome {
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
        match self.leases.ack(subnet, mac, ip, binding(msg), now) {
            Ok(lease) => {
                let (reply, note, boot) = self.reply(msg, MessageType::Ack, ip, subnet, local, mac);
                Outcome {
                    kind,
                    reply: Some(reply),
                    change: Some(LeaseChange::Put(lease)),
                    boot,
                    note: format!("ack {ip} to {mac} ({state}){note}"),
                }
            }
            Err(refusal) => {
                let reply = self.nak(msg, local);
                Outcome {
                    kind,
                    reply: Some(reply),
                    change: None,
                    boot: None,
                    note: format!("nak {ip} to {mac} ({state}): {refusal:?}"),
                }
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
        let choice = match self.config.boot.choose(&pxe, mac, local) {
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
    use crate::{LeaseState, Pool, Reservation, Subnet};

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
            network: net.parse().unwrap(),
            pools: vec![Pool {
                start: a.into(),
                end: b.into(),
            }],
            exclude: Default::default(),
            routers: vec![LOCAL],
            dns: vec![LOCAL],
            domain: Some("lab".into()),
            lease_time: 3600,
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
        let mut renew = msg(MessageType::Request, MAC, vec![]);
        renew.set_ciaddr(ip);
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
            let (offer, _) = s
                .handle(&msg(MessageType::Discover, MAC, opts), LOCAL, 0, &AllowAll)
                .reply
                .unwrap();
            assert_eq!(offer.siaddr(), LOCAL, "arch {arch}");
            assert_eq!(offer.fname_str().unwrap().unwrap(), *file, "arch {arch}");
            assert_eq!(
                opt(&offer, OptionCode::BootfileName),
                Some(&DhcpOption::BootfileName(file.as_bytes().to_vec()))
            );
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
        let (offer, _) = s
            .handle(&msg(MessageType::Discover, MAC, opts), LOCAL, 0, &AllowAll)
            .reply
            .unwrap();
        assert_eq!(
            opt(&offer, OptionCode::BootfileName),
            Some(&DhcpOption::BootfileName(
                b"http://198.18.0.1:8080/boot/assets/ipxe.efi".to_vec()
            ))
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
            let (offer, _) = s
                .handle(&msg(MessageType::Discover, MAC, opts), LOCAL, 0, &AllowAll)
                .reply
                .unwrap();
            assert_eq!(
                opt(&offer, OptionCode::BootfileName),
                Some(&DhcpOption::BootfileName(
                    b"http://198.18.0.1:8080/boot/52:54:00:00:00:01.ipxe".to_vec()
                ))
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
        assert_eq!(out.reply.unwrap().0.yiaddr(), Ipv4Addr::new(198, 18, 0, 42));
    }

    #[test]
    fn release_decline_and_inform() {
        let mut s = server();
        let ip = Ipv4Addr::new(198, 18, 0, 100);
        bind(&mut s, ip);
        let mut rel = msg(MessageType::Release, MAC, vec![]);
        rel.set_ciaddr(ip);
        let out = s.handle(&rel, LOCAL, 10, &AllowAll);
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

        let mut inf = msg(MessageType::Inform, [3; 6], vec![]);
        inf.set_ciaddr(Ipv4Addr::new(198, 18, 0, 77));
        let out = s.handle(&inf, LOCAL, 12, &AllowAll);
        let (ack, to) = out.reply.unwrap();
        assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(to, SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 77), 68));
        assert!(opt(&ack, OptionCode::AddressLeaseTime).is_none());
        assert!(out.change.is_none());
    }
}
