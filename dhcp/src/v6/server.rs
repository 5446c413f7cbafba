//! The DHCPv6 protocol core (RFC 8415, addresses only): pure, from a decoded message, the
//! server's address on the link it arrived on, the client's source address and the time, to
//! a reply and the lease changes that must be durable before the reply leaves.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, OptionCode, Status, StatusCode,
    UnknownOption,
};

use super::leases::{Client6, Lease6, Leases6, Refusal6};
use super::packet::RelayHop;
use crate::MacAddr;
use crate::pxe::{Arch, is_http_boot};
use crate::ratelimit::{Limiter, RateLimits};
use crate::server::{Admission, ClientPolicy, LimitKind, Limited};

/// What machines that boot from the network are told (option 59, RFC 5970).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Boot6 {
    /// Client architecture (option 61) → boot file, as for DHCPv4.
    pub table: BTreeMap<Arch, String>,
    /// The appliance's HTTP base URL over IPv6 (`http://[addr]:port`), without a trailing `/`.
    pub public_url: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server6Config {
    /// The server's DUID (option 2), stable across restarts.
    pub duid: Vec<u8>,
    /// Boot files for PXE clients; `None`: addresses only.
    pub boot: Option<Boot6>,
}

/// How a client's message reached the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Via6 {
    /// An address on the client's link: the server's own there, or a relay's link address.
    /// It picks the subnet.
    pub link: Ipv6Addr,
    /// The server's own address where the message came in (named in `tftp://` boot URLs).
    pub server: Ipv6Addr,
    /// The client's address (its link-local one, which may carry its MAC).
    pub peer: Ipv6Addr,
    /// The client's MAC as a relay saw it (RFC 6939).
    pub client_mac: Option<MacAddr>,
}

impl Via6 {
    /// Straight from a client on the link where the server's address is `link`.
    pub fn direct(link: Ipv6Addr, peer: Ipv6Addr) -> Self {
        Via6 {
            link,
            server: link,
            peer,
            client_mac: None,
        }
    }

    /// How a message reached this server at `local` from `source`: straight from the
    /// client, or through `relays` (outermost first). The client's link is named by the link
    /// address of the relay closest to it that gives one (RFC 8415 13.1: a relay that names
    /// its link by interface-id alone gives `::`); the MAC only by the first-hop relay, the
    /// one that saw the client's frame (RFC 6939). `None` when no relay names a link.
    pub fn through(local: Ipv6Addr, source: Ipv6Addr, relays: &[RelayHop]) -> Option<Self> {
        let Some(closest) = relays.last() else {
            return Some(Via6::direct(local, source));
        };
        let link = relays
            .iter()
            .rev()
            .map(|r| r.link)
            .find(|l| !l.is_unspecified() && !l.is_unicast_link_local())?;
        Some(Via6 {
            link,
            server: local,
            peer: closest.peer,
            client_mac: closest.client_mac,
        })
    }
}

/// What to do with one message.
#[derive(Debug, Default)]
pub struct Outcome6 {
    pub reply: Option<Message>,
    /// Lease records to make durable before the reply is sent.
    pub changes: Vec<Lease6>,
    /// The boot file URL given, for the timeline.
    pub boot: Option<String>,
    /// The client's MAC, when its DUID or link-local address carries one.
    pub mac: Option<MacAddr>,
    /// The first address the reply gives (for the timeline).
    pub address: Option<Ipv6Addr>,
    /// What happened, for the log.
    pub note: String,
    /// Dropped by a rate limit: no reply, nothing changed.
    pub limited: Option<Limited>,
}

pub struct Server6 {
    pub leases: Leases6,
    config: Server6Config,
    limiter: Limiter,
}

impl Server6 {
    /// A server without rate limits; see [`Server6::with_limits`].
    pub fn new(leases: Leases6, config: Server6Config) -> Self {
        Server6 {
            leases,
            config,
            limiter: Limiter::new(RateLimits::OFF),
        }
    }

    /// The same server with `limits` (checked by the caller with [`RateLimits::validate`]),
    /// as DHCPv4 has them: per client (by the MAC of its DUID or link-local address) and
    /// on addresses newly given out per subnet.
    pub fn with_limits(mut self, limits: RateLimits) -> Self {
        self.limiter = Limiter::new(limits);
        self
    }

    pub fn limits(&self) -> &RateLimits {
        self.limiter.limits()
    }

    pub fn config(&self) -> &Server6Config {
        &self.config
    }

    /// Handles `msg`, which arrived straight from a client on the link where this server's
    /// address is `link`, from `peer`; see [`Server6::handle_via`].
    pub fn handle(
        &mut self,
        msg: &Message,
        link: Ipv6Addr,
        peer: Ipv6Addr,
        now_ms: u64,
        policy: &dyn ClientPolicy,
    ) -> Outcome6 {
        self.handle_via(msg, &Via6::direct(link, peer), now_ms, policy)
    }

    /// Handles `msg`, which came as `via` says, at `now_ms` (Unix milliseconds: leases see
    /// the second, rate limits the millisecond), admitted or not by `policy` (the deny list,
    /// the PXE filter, leadership).
    pub fn handle_via(
        &mut self,
        msg: &Message,
        via: &Via6,
        now_ms: u64,
        policy: &dyn ClientPolicy,
    ) -> Outcome6 {
        let Via6 {
            link,
            server: here,
            peer,
            client_mac,
        } = *via;
        let now = now_ms / 1000;
        let ignore = |note: &str| Outcome6 {
            note: note.to_string(),
            ..Outcome6::default()
        };
        let limited = |kind, report| Outcome6 {
            note: "dropped by a rate limit".into(),
            limited: Some(Limited { kind, report }),
            ..Outcome6::default()
        };
        let Some(duid) = client_duid(msg) else {
            return ignore("no client identifier");
        };
        // A relay's view of the client's MAC first: it saw the frame.
        let mac = client_mac
            .or_else(|| mac_of(&duid))
            .or_else(|| mac_of_link_local(peer));
        let admitted = match mac {
            Some(m) => policy.admit(m),
            None => policy.admit_unidentified(),
        };
        if admitted == Admission::Ignore {
            return ignore(&format!(
                "{} is not admitted by the PXE filter",
                mac.map_or("a client without a MAC".into(), |m| m.to_string())
            ));
        }
        let server_id = msg.opts().get(OptionCode::ServerId);
        let ours = matches!(server_id, Some(DhcpOption::ServerId(id)) if *id == self.config.duid);
        let kind = msg.msg_type();
        // RFC 8415 16: Solicit, Rebind and Confirm carry no server identifier; Request,
        // Renew, Release and Decline name this server. Anything else is not for us.
        let addressed = match kind {
            MessageType::Solicit | MessageType::Rebind | MessageType::Confirm => {
                server_id.is_none()
            }
            MessageType::Request
            | MessageType::Renew
            | MessageType::Release
            | MessageType::Decline => ours,
            MessageType::InformationRequest => server_id.is_none() || ours,
            _ => false,
        };
        if !addressed {
            return ignore("not addressed to this server");
        }
        let Some(idx) = self.leases.subnet_for(link) else {
            return ignore("no subnet for this link");
        };
        // Only requests the server would act on are charged, as in DHCPv4; a client whose
        // MAC is unknown has no budget of its own.
        if let Some(m) = mac
            && let Some(report) = self.limiter.over_client_budget(m, now_ms)
        {
            return limited(LimitKind::Client, report);
        }
        let hex_duid = hex::encode(&duid);
        let rapid =
            kind == MessageType::Solicit && msg.opts().get(OptionCode::RapidCommit).is_some();
        let reply_kind = if kind == MessageType::Solicit && !rapid {
            MessageType::Advertise
        } else {
            MessageType::Reply
        };
        // An address for a client the leases do not know is a new one: the cap counts it,
        // one for each such IA_NA, so that a message carrying many IAs takes no more than the
        // cap allows. Over the cap at the first, the message is dropped whole.
        let asks_new = matches!(
            kind,
            MessageType::Solicit | MessageType::Request | MessageType::Rebind
        );
        let new = asks_new
            && ianas(msg).any(|ia| {
                !self.leases.knows(&Client6 {
                    duid: hex_duid.clone(),
                    iaid: ia.id,
                })
            });
        if new && let Some(report) = self.limiter.over_new_lease_cap(idx, now_ms) {
            return limited(LimitKind::NewLeases, report);
        }
        let mut reply = Message::new_with_id(reply_kind, msg.xid());
        let mut changes = Vec::new();
        let mut given = Vec::new();
        for ia in ianas(msg) {
            let client = Client6 {
                duid: hex_duid.clone(),
                iaid: ia.id,
            };
            let fresh = asks_new && !self.leases.knows(&client);
            if fresh && self.limiter.over_new_lease_cap(idx, now_ms).is_some() {
                let refused = Err(Status::NoAddrsAvail);
                reply
                    .opts_mut()
                    .insert(DhcpOption::IANA(self.ia_answer(idx, ia, refused)));
                given.push(refused);
                continue;
            }
            let asked = ia_addresses(ia);
            let answer = match kind {
                MessageType::Solicit if !rapid => match self.leases.pick(idx, &client, mac, now) {
                    Some(ip) => {
                        self.leases.advertise(ip, &client, now);
                        Ok(ip)
                    }
                    None => Err(Status::NoAddrsAvail),
                },
                MessageType::Solicit | MessageType::Request => self.assign(idx, &client, mac, now),
                MessageType::Renew | MessageType::Rebind => {
                    let held = asked
                        .iter()
                        .find(|ip| self.leases.theirs(&client, **ip).is_some())
                        .copied();
                    // A Rebind reaches any server: one that lost the binding makes a new one
                    // when it can, as RFC 8415 18.3.5 allows.
                    let bound = match held {
                        Some(ip) => self
                            .leases
                            .bind(idx, &client, mac, ip, now)
                            .map_err(|_| Status::NoBinding),
                        None if kind == MessageType::Rebind => {
                            self.assign(idx, &client, mac, now).and_then(|ip| {
                                self.leases
                                    .theirs(&client, ip)
                                    .cloned()
                                    .ok_or(Status::NoBinding)
                            })
                        }
                        None => Err(Status::NoBinding),
                    };
                    bound.map(|lease| {
                        let ip = lease.ip;
                        changes.push(lease);
                        ip
                    })
                }
                MessageType::Release => {
                    for ip in &asked {
                        changes.extend(self.leases.release(&client, *ip));
                    }
                    continue;
                }
                MessageType::Decline => {
                    for ip in &asked {
                        changes.extend(self.leases.decline(idx, &client, *ip, now));
                    }
                    continue;
                }
                MessageType::Confirm => {
                    let subnet = self.leases.subnet(idx);
                    if asked.iter().any(|ip| !subnet.network.contains(ip)) {
                        status(reply.opts_mut(), Status::NotOnLink, "not on this link");
                        return Outcome6 {
                            changes,
                            note: "confirm: not on link".into(),
                            ..self.finish(idx, here, msg, reply, mac)
                        };
                    }
                    continue;
                }
                _ => continue,
            };
            let answer = match (kind, answer) {
                (MessageType::Solicit, Ok(ip)) if rapid => {
                    let lease = self.leases.theirs(&client, ip).cloned();
                    changes.extend(lease);
                    Ok(ip)
                }
                (MessageType::Request, Ok(ip)) => {
                    changes.extend(self.leases.theirs(&client, ip).cloned());
                    Ok(ip)
                }
                (_, a) => a,
            };
            if fresh && answer.is_ok() {
                self.limiter.record_new_lease(idx, now_ms);
            }
            reply
                .opts_mut()
                .insert(DhcpOption::IANA(self.ia_answer(idx, ia, answer)));
            given.push(answer);
        }
        if rapid {
            reply.opts_mut().insert(DhcpOption::RapidCommit);
        }
        match kind {
            MessageType::Release | MessageType::Decline | MessageType::Confirm => {
                status(reply.opts_mut(), Status::Success, "");
            }
            _ => {}
        }
        changes.extend(self.leases.take_moved_from());
        let note = format!(
            "{kind:?} → {reply_kind:?}: {}",
            given
                .iter()
                .map(|a| match a {
                    Ok(ip) => ip.to_string(),
                    Err(s) => format!("{s:?}"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        Outcome6 {
            changes,
            note,
            address: given.iter().find_map(|a| a.ok()),
            ..self.finish(idx, here, msg, reply, mac)
        }
    }

    /// Binds the address [`Leases6::pick`] chooses.
    fn assign(
        &mut self,
        idx: usize,
        client: &Client6,
        mac: Option<MacAddr>,
        now: u64,
    ) -> Result<Ipv6Addr, Status> {
        let ip = self
            .leases
            .pick(idx, client, mac, now)
            .ok_or(Status::NoAddrsAvail)?;
        match self.leases.bind(idx, client, mac, ip, now) {
            Ok(lease) => Ok(lease.ip),
            Err(Refusal6::NotOnLink | Refusal6::Taken) => Err(Status::NoAddrsAvail),
        }
    }

    /// The IA_NA of a reply: the address with the subnet's lifetimes (T1 at half the
    /// preferred lifetime, T2 at 80 %), or the status that says why there is none.
    fn ia_answer(&self, idx: usize, ia: &IANA, answer: Result<Ipv6Addr, Status>) -> IANA {
        let s = self.leases.subnet(idx);
        let mut opts = DhcpOptions::new();
        let (t1, t2) = match answer {
            Ok(ip) => {
                opts.insert(DhcpOption::IAAddr(IAAddr {
                    addr: ip,
                    preferred_life: s.preferred_lifetime,
                    valid_life: s.valid_lifetime,
                    opts: DhcpOptions::new(),
                }));
                (s.preferred_lifetime / 2, s.preferred_lifetime / 5 * 4)
            }
            Err(st) => {
                status(&mut opts, st, status_text(st));
                (0, 0)
            }
        };
        IANA {
            id: ia.id,
            t1,
            t2,
            opts,
        }
    }

    /// Adds the identifiers, DNS and boot options every reply carries (the caller adds the
    /// lease changes and the note).
    fn finish(
        &self,
        idx: usize,
        here: Ipv6Addr,
        msg: &Message,
        mut reply: Message,
        mac: Option<MacAddr>,
    ) -> Outcome6 {
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::ServerId(self.config.duid.clone()));
        if let Some(DhcpOption::ClientId(id)) = msg.opts().get(OptionCode::ClientId) {
            opts.insert(DhcpOption::ClientId(id.clone()));
        }
        let s = self.leases.subnet(idx);
        if !s.dns.is_empty() {
            opts.insert(DhcpOption::DomainNameServers(s.dns.clone()));
        }
        if let Some(d) = &s.domain {
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::DomainSearchList,
                dns_name(d),
            )));
        }
        let boot = self.boot_url(msg, here, mac);
        if let Some(url) = &boot {
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::OptBootfileUrl,
                url.clone().into_bytes(),
            )));
        }
        Outcome6 {
            reply: Some(reply),
            boot,
            mac,
            ..Outcome6::default()
        }
    }

    /// Option 59 for a PXE client (one that sent its architecture, option 61): iPXE gets its
    /// own script, HTTP-boot architectures an asset's URL, the others a TFTP URL at `here`,
    /// this server's address where the request came in.
    fn boot_url(&self, msg: &Message, here: Ipv6Addr, mac: Option<MacAddr>) -> Option<String> {
        let boot = self.config.boot.as_ref()?;
        let arch = match msg.opts().get(OptionCode::ClientArchType)? {
            DhcpOption::ClientArchType(a) => u16::from(*a.first()?),
            _ => return None,
        };
        let ipxe = match msg.opts().get(OptionCode::UserClass) {
            Some(DhcpOption::UserClass(u)) => u.data.iter().any(|d| d == b"iPXE"),
            _ => false,
        };
        if ipxe {
            return mac.map(|m| format!("{}/boot/{m}.ipxe", boot.public_url));
        }
        let file = boot.table.get(&arch)?;
        if is_http_boot(arch) {
            Some(format!("{}/boot/assets/{file}", boot.public_url))
        } else {
            // This server's TFTP, at its address where the request came in, as DHCPv4's
            // siaddr.
            Some(format!("tftp://[{here}]/{file}"))
        }
    }
}

fn status(opts: &mut DhcpOptions, status: Status, msg: &str) {
    opts.insert(DhcpOption::StatusCode(StatusCode {
        status,
        msg: msg.to_string(),
    }));
}

fn status_text(s: Status) -> &'static str {
    match s {
        Status::NoAddrsAvail => "no addresses available",
        Status::NoBinding => "no binding for this client",
        Status::NotOnLink => "not on this link",
        _ => "",
    }
}

fn client_duid(msg: &Message) -> Option<Vec<u8>> {
    match msg.opts().get(OptionCode::ClientId)? {
        DhcpOption::ClientId(id) if !id.is_empty() => Some(id.clone()),
        _ => None,
    }
}

fn ianas(msg: &Message) -> impl Iterator<Item = &IANA> {
    msg.opts().iter().filter_map(|o| match o {
        DhcpOption::IANA(ia) => Some(ia),
        _ => None,
    })
}

fn ia_addresses(ia: &IANA) -> Vec<Ipv6Addr> {
    ia.opts
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IAAddr(a) => Some(a.addr),
            _ => None,
        })
        .collect()
}

/// The MAC in a link-layer DUID: DUID-LLT (type 1) or DUID-LL (type 3) of an Ethernet
/// (hardware type 1) interface.
pub fn mac_of(duid: &[u8]) -> Option<MacAddr> {
    let (kind, rest) = duid.split_first_chunk::<2>()?;
    let (hw, rest) = rest.split_first_chunk::<2>()?;
    if *hw != [0, 1] {
        return None;
    }
    let mac = match u16::from_be_bytes(*kind) {
        1 => rest.get(4..)?,
        3 => rest,
        _ => return None,
    };
    Some(MacAddr(mac.try_into().ok()?))
}

/// The MAC in a modified EUI-64 link-local address (`fe80::XXXX:XXff:feXX:XXXX`), as
/// firmware that identifies itself by a DUID-UUID still forms its source address.
pub fn mac_of_link_local(ip: Ipv6Addr) -> Option<MacAddr> {
    let o = ip.octets();
    if o[..8] != [0xfe, 0x80, 0, 0, 0, 0, 0, 0] || o[11] != 0xff || o[12] != 0xfe {
        return None;
    }
    Some(MacAddr([o[8] ^ 0x02, o[9], o[10], o[13], o[14], o[15]]))
}

/// A domain name in DNS wire format (RFC 1035 3.1), for option 24.
fn dns_name(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        let bytes = &label.as_bytes()[..label.len().min(63)];
        out.push(u8::try_from(bytes.len()).unwrap_or(63));
        out.extend_from_slice(bytes);
    }
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v6::leases::{Pool6, Reservation6, Subnet6};
    use dhcproto::v6::{Architecture, ORO, UserClass};

    const NOW: u64 = 1_000_000;
    const LINK: &str = "2001:db8:1::1";

    fn server(boot: bool) -> Server6 {
        let subnet = Subnet6 {
            network: "2001:db8:1::/64".parse().unwrap(),
            pools: vec![Pool6 {
                start: "2001:db8:1::100".parse().unwrap(),
                end: "2001:db8:1::1ff".parse().unwrap(),
            }],
            dns: vec![LINK.parse().unwrap()],
            domain: Some("paddock.internal".into()),
            preferred_lifetime: 300,
            valid_lifetime: 600,
        };
        // A second link, reached through a relay.
        let relayed = Subnet6 {
            network: "2001:db8:2::/64".parse().unwrap(),
            pools: vec![Pool6 {
                start: "2001:db8:2::100".parse().unwrap(),
                end: "2001:db8:2::1ff".parse().unwrap(),
            }],
            ..subnet.clone()
        };
        let leases = Leases6::new(
            vec![subnet, relayed],
            vec![
                Reservation6 {
                    mac: MacAddr([0x52, 0x54, 0, 0, 0, 0x77]),
                    ip: "2001:db8:1::77".parse().unwrap(),
                },
                Reservation6 {
                    mac: MacAddr([0x52, 0x54, 0, 0, 0, 0x78]),
                    ip: "2001:db8:2::78".parse().unwrap(),
                },
            ],
        )
        .unwrap();
        Server6::new(
            leases,
            Server6Config {
                duid: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
                boot: boot.then(|| Boot6 {
                    table: crate::pxe::default_table(),
                    public_url: format!("http://[{LINK}]:8080"),
                }),
            },
        )
    }

    /// DUID-LL of 52:54:00:00:00:<n>.
    fn duid(n: u8) -> Vec<u8> {
        vec![0, 3, 0, 1, 0x52, 0x54, 0, 0, 0, n]
    }

    fn msg(kind: MessageType, n: u8, server: Option<&Server6>, addr: Option<Ipv6Addr>) -> Message {
        let mut m = Message::new_with_id(kind, [1, 2, n]);
        m.opts_mut().insert(DhcpOption::ClientId(duid(n)));
        if let Some(s) = server {
            m.opts_mut()
                .insert(DhcpOption::ServerId(s.config().duid.clone()));
        }
        let mut opts = DhcpOptions::new();
        if let Some(a) = addr {
            opts.insert(DhcpOption::IAAddr(IAAddr {
                addr: a,
                preferred_life: 0,
                valid_life: 0,
                opts: DhcpOptions::new(),
            }));
        }
        m.opts_mut().insert(DhcpOption::IANA(IANA {
            id: 7,
            t1: 0,
            t2: 0,
            opts,
        }));
        m
    }

    fn run(s: &mut Server6, m: &Message, now: u64) -> Outcome6 {
        s.handle(
            m,
            LINK.parse().unwrap(),
            "fe80::1".parse().unwrap(),
            now * 1000,
            &crate::AllowAll,
        )
    }

    fn address(o: &Outcome6) -> Result<Ipv6Addr, Status> {
        let reply = o.reply.as_ref().expect("a reply");
        let Some(DhcpOption::IANA(ia)) = reply.opts().get(OptionCode::IANA) else {
            panic!("no IA_NA in {reply:?}");
        };
        for o in ia.opts.iter() {
            match o {
                DhcpOption::IAAddr(a) => return Ok(a.addr),
                DhcpOption::StatusCode(s) => return Err(s.status),
                _ => {}
            }
        }
        panic!("empty IA_NA")
    }

    /// Solicit → Advertise (nothing durable), Request → Reply (the lease durable), Renew
    /// extends it, Release gives it back; the reply carries both identifiers and DNS.
    #[test]
    fn the_four_message_exchange_binds_and_renews() {
        let mut s = server(false);
        let adv = run(&mut s, &msg(MessageType::Solicit, 1, None, None), NOW);
        let reply = adv.reply.as_ref().unwrap();
        assert_eq!(reply.msg_type(), MessageType::Advertise);
        assert!(adv.changes.is_empty());
        let ip = address(&adv).unwrap();
        assert_eq!(
            reply.opts().get(OptionCode::ClientId),
            Some(&DhcpOption::ClientId(duid(1)))
        );
        assert!(reply.opts().get(OptionCode::ServerId).is_some());
        assert!(reply.opts().get(OptionCode::DomainNameServers).is_some());
        let req = msg(MessageType::Request, 1, Some(&s), Some(ip));
        let bound = run(&mut s, &req, NOW);
        assert_eq!(bound.reply.as_ref().unwrap().msg_type(), MessageType::Reply);
        assert_eq!(address(&bound), Ok(ip));
        assert_eq!(bound.changes.len(), 1);
        assert_eq!(bound.changes[0].expires, NOW + 600);
        assert_eq!(bound.mac, Some(MacAddr([0x52, 0x54, 0, 0, 0, 1])));
        let renew = msg(MessageType::Renew, 1, Some(&s), Some(ip));
        let renewed = run(&mut s, &renew, NOW + 200);
        assert_eq!(address(&renewed), Ok(ip));
        assert_eq!(renewed.changes[0].expires, NOW + 800);
        // Another client's Renew of that address has no binding.
        let theirs = msg(MessageType::Renew, 2, Some(&s), Some(ip));
        assert_eq!(address(&run(&mut s, &theirs, NOW)), Err(Status::NoBinding));
        let release = msg(MessageType::Release, 1, Some(&s), Some(ip));
        let released = run(&mut s, &release, NOW + 300);
        assert_eq!(
            released.changes[0].state,
            crate::leases::LeaseState::Released
        );
    }

    /// The deny list and the PXE filter (a [`ClientPolicy`]) apply to DHCPv6 by the MAC of
    /// the DUID; a client with no MAC is asked about as such.
    #[test]
    fn the_client_policy_admits_by_mac() {
        struct Deny(Option<MacAddr>);
        impl ClientPolicy for Deny {
            fn admit(&self, mac: MacAddr) -> Admission {
                if Some(mac) == self.0 {
                    Admission::Ignore
                } else {
                    Admission::Serve
                }
            }
            fn admit_unidentified(&self) -> Admission {
                Admission::Ignore
            }
        }
        let mut s = server(false);
        let link = LINK.parse().unwrap();
        let peer = "fe80::1".parse().unwrap();
        let denied = Deny(Some(MacAddr([0x52, 0x54, 0, 0, 0, 1])));
        let m1 = msg(MessageType::Solicit, 1, None, None);
        let o = s.handle(&m1, link, peer, NOW * 1000, &denied);
        assert!(
            o.reply.is_none() && o.note.contains("not admitted"),
            "{o:?}"
        );
        let m2 = msg(MessageType::Solicit, 2, None, None);
        assert!(
            s.handle(&m2, link, peer, NOW * 1000, &denied)
                .reply
                .is_some()
        );
        // A DUID-UUID from a source address that is not EUI-64: no MAC to judge by.
        let mut anon = Message::new_with_id(MessageType::Solicit, [9, 9, 9]);
        anon.opts_mut()
            .insert(DhcpOption::ClientId(vec![0, 4, 1, 2, 3, 4]));
        let o = s.handle(&anon, link, peer, NOW * 1000, &denied);
        assert!(o.reply.is_none(), "{o:?}");
    }

    /// A client over its burst is dropped (no reply, nothing changed) until its budget
    /// refills; the new-lease cap stops new clients but not one it already knows.
    #[test]
    fn rate_limits_drop_what_is_over_them() {
        let limits = RateLimits {
            per_client_burst: 2,
            per_client_per_sec: 1,
            max_tracked_clients: 100,
            new_leases_per_window: 2,
            new_lease_window_secs: 60,
        };
        let mut s = server(false).with_limits(limits);
        let solicit = |n| msg(MessageType::Solicit, n, None, None);
        assert!(run(&mut s, &solicit(1), NOW).reply.is_some());
        assert!(run(&mut s, &solicit(1), NOW).reply.is_some());
        let o = run(&mut s, &solicit(1), NOW);
        assert!(o.reply.is_none() && o.changes.is_empty());
        assert_eq!(
            o.limited.map(|l| (l.kind, l.report)),
            Some((LimitKind::Client, Some(1)))
        );
        assert!(
            run(&mut s, &solicit(1), NOW + 1).reply.is_some(),
            "refilled"
        );
        // Clients 1 and 2 took the window's two new addresses; 3 is a third.
        assert!(run(&mut s, &solicit(2), NOW + 2).reply.is_some());
        let o = run(&mut s, &solicit(3), NOW + 3);
        assert_eq!(
            o.limited.map(|l| l.kind),
            Some(LimitKind::NewLeases),
            "{o:?}"
        );
        // The known client 2 still binds the address it was advertised.
        let ip = address(&run(&mut s, &solicit(2), NOW + 4)).unwrap();
        let req = msg(MessageType::Request, 2, Some(&s), Some(ip));
        assert_eq!(address(&run(&mut s, &req, NOW + 5)), Ok(ip));
    }

    /// The new-lease cap counts addresses, not messages: one Solicit carrying five IA_NAs
    /// gets the window's two and a NoAddrsAvail for each of the others.
    #[test]
    fn the_new_lease_cap_counts_each_identity_association() {
        let limits = RateLimits {
            new_leases_per_window: 2,
            new_lease_window_secs: 60,
            ..RateLimits::OFF
        };
        let mut s = server(false).with_limits(limits);
        let mut solicit = msg(MessageType::Solicit, 1, None, None);
        for id in 8..12 {
            solicit.opts_mut().insert(DhcpOption::IANA(IANA {
                id,
                t1: 0,
                t2: 0,
                opts: DhcpOptions::new(),
            }));
        }
        let o = run(&mut s, &solicit, NOW);
        let reply = o.reply.expect("a reply");
        let answers: Vec<bool> = reply
            .opts()
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IANA(ia) => {
                    Some(ia.opts.iter().any(|o| matches!(o, DhcpOption::IAAddr(_))))
                }
                _ => None,
            })
            .collect();
        assert_eq!(answers.len(), 5, "{reply:?}");
        assert_eq!(answers.iter().filter(|a| **a).count(), 2, "{reply:?}");
        // The window is full: a new client is dropped whole.
        let o = run(&mut s, &msg(MessageType::Solicit, 2, None, None), NOW + 1);
        assert_eq!(o.limited.map(|l| l.kind), Some(LimitKind::NewLeases));
    }

    /// Messages for another server, or without a client identifier, are ignored.
    #[test]
    fn messages_for_others_are_ignored() {
        let mut s = server(false);
        let mut other = msg(MessageType::Request, 1, None, None);
        other
            .opts_mut()
            .insert(DhcpOption::ServerId(vec![0, 3, 0, 1, 9, 9, 9, 9, 9, 9]));
        assert!(run(&mut s, &other, NOW).reply.is_none());
        let solicit_to_us = msg(MessageType::Solicit, 1, Some(&server(false)), None);
        assert!(run(&mut s, &solicit_to_us, NOW).reply.is_none());
        let mut anon = Message::new(MessageType::Solicit);
        anon.opts_mut().insert(DhcpOption::ElapsedTime(0));
        assert!(run(&mut s, &anon, NOW).reply.is_none());
    }

    /// Rapid commit binds at once; a reserved MAC gets its address.
    #[test]
    fn rapid_commit_and_reservations() {
        let mut s = server(false);
        let mut m = msg(MessageType::Solicit, 0x77, None, None);
        m.opts_mut().insert(DhcpOption::RapidCommit);
        let o = run(&mut s, &m, NOW);
        let reply = o.reply.as_ref().unwrap();
        assert_eq!(reply.msg_type(), MessageType::Reply);
        assert!(reply.opts().get(OptionCode::RapidCommit).is_some());
        assert_eq!(address(&o), Ok("2001:db8:1::77".parse().unwrap()));
        assert_eq!(o.changes.len(), 1);
    }

    /// PXE clients get option 59 for their architecture; iPXE gets its script.
    #[test]
    fn pxe_clients_get_a_boot_file_url() {
        let mut s = server(true);
        let mut m = msg(MessageType::Solicit, 1, None, None);
        m.opts_mut()
            .insert(DhcpOption::ClientArchType(vec![Architecture::from(7)]));
        m.opts_mut().insert(DhcpOption::ORO(ORO {
            opts: vec![OptionCode::OptBootfileUrl],
        }));
        let o = run(&mut s, &m, NOW);
        assert_eq!(
            o.boot.as_deref(),
            Some("tftp://[2001:db8:1::1]/snponly.efi")
        );
        let mut m = msg(MessageType::Solicit, 2, None, None);
        m.opts_mut()
            .insert(DhcpOption::ClientArchType(vec![Architecture::from(16)]));
        assert_eq!(
            run(&mut s, &m, NOW).boot.as_deref(),
            Some("http://[2001:db8:1::1]:8080/boot/assets/ipxe.efi")
        );
        m.opts_mut().insert(DhcpOption::UserClass(UserClass {
            data: vec![b"iPXE".to_vec()],
        }));
        assert_eq!(
            run(&mut s, &m, NOW).boot.as_deref(),
            Some("http://[2001:db8:1::1]:8080/boot/52:54:00:00:00:02.ipxe")
        );
        let plain = msg(MessageType::Solicit, 3, None, None);
        assert_eq!(run(&mut s, &plain, NOW).boot, None);
    }

    /// A relayed message is served on the relay's link: that link's subnet, the relay's
    /// view of the client's MAC (a reservation there), and TFTP at the server's own address.
    #[test]
    fn relayed_messages_are_served_on_the_relays_link() {
        let mut s = server(true);
        let solicit = |n| {
            let mut m = msg(MessageType::Solicit, n, None, None);
            m.opts_mut().insert(DhcpOption::RapidCommit);
            m.opts_mut()
                .insert(DhcpOption::ClientArchType(vec![Architecture::from(7)]));
            m
        };
        let reserved = MacAddr([0x52, 0x54, 0, 0, 0, 0x78]);
        let via = Via6 {
            link: "2001:db8:2::1".parse().unwrap(),
            server: LINK.parse().unwrap(),
            peer: "fe80::1".parse().unwrap(),
            client_mac: Some(reserved),
        };
        let o = s.handle_via(&solicit(9), &via, NOW * 1000, &crate::AllowAll);
        assert_eq!(address(&o), Ok("2001:db8:2::78".parse().unwrap()));
        assert_eq!(o.mac, Some(reserved), "the relay's MAC before the DUID's");
        assert_eq!(
            o.boot.as_deref(),
            Some("tftp://[2001:db8:1::1]/snponly.efi")
        );
        // Without the relay's MAC: that link's pool.
        let plain = Via6 {
            client_mac: None,
            ..via
        };
        let o = s.handle_via(&solicit(10), &plain, NOW * 1000, &crate::AllowAll);
        let ip = address(&o).unwrap();
        assert!(ip.to_string().starts_with("2001:db8:2::1"), "{ip}");
        // A link no subnet holds is not served.
        let far = Via6 {
            link: "2001:db8:9::1".parse().unwrap(),
            ..via
        };
        assert!(
            s.handle_via(&solicit(11), &far, NOW * 1000, &crate::AllowAll)
                .reply
                .is_none()
        );
    }

    /// Which link and MAC a relayed message speaks for.
    #[test]
    fn relays_name_the_link_and_the_first_hop_the_mac() {
        let ip = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let hop = |link: &str, mac: Option<u8>| RelayHop {
            hop_count: 0,
            link: ip(link),
            peer: ip("fe80::5054:ff:fe00:9"),
            interface_id: None,
            client_mac: mac.map(|n| MacAddr([0x52, 0x54, 0, 0, 0, n])),
        };
        let (local, source) = (ip("2001:db8:1::1"), ip("2001:db8:1::2"));
        assert_eq!(
            Via6::through(local, source, &[]),
            Some(Via6::direct(local, source))
        );
        // Outermost first: the closest relay's link and MAC, and its peer (the client).
        let via = Via6::through(
            local,
            source,
            &[hop("2001:db8:3::1", Some(3)), hop("2001:db8:2::1", Some(2))],
        )
        .unwrap();
        assert_eq!(via.link, ip("2001:db8:2::1"));
        assert_eq!(via.server, local);
        assert_eq!(via.peer, ip("fe80::5054:ff:fe00:9"));
        assert_eq!(via.client_mac, Some(MacAddr([0x52, 0x54, 0, 0, 0, 2])));
        // A first hop that names its link by interface-id alone: the next relay's link; an
        // outer relay's MAC is not the client's.
        let via = Via6::through(
            local,
            source,
            &[hop("2001:db8:3::1", Some(3)), hop("::", None)],
        )
        .unwrap();
        assert_eq!(via.link, ip("2001:db8:3::1"));
        assert_eq!(via.client_mac, None);
        // No relay names a routable link.
        assert_eq!(
            Via6::through(local, source, &[hop("::", None), hop("fe80::1", None)]),
            None
        );
    }

    #[test]
    fn macs_come_from_link_layer_duids_and_link_local_addresses() {
        let mac = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(
            mac_of(&[0, 3, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56]),
            Some(mac)
        );
        assert_eq!(
            mac_of(&[0, 1, 0, 1, 1, 2, 3, 4, 0x52, 0x54, 0, 0x12, 0x34, 0x56]),
            Some(mac)
        );
        assert_eq!(mac_of(&[0, 4, 1, 2, 3]), None);
        assert_eq!(mac_of(&[0, 3]), None);
        assert_eq!(
            mac_of_link_local("fe80::5054:ff:fe12:3456".parse().unwrap()),
            Some(mac)
        );
        assert_eq!(mac_of_link_local("2001:db8::1".parse().unwrap()), None);
    }
}
