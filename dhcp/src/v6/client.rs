//! A DHCPv6 client's core (RFC 8415 18.2), the one the discovery ramdisk runs on an
//! IPv6-only network: Solicit (offering rapid commit), Advertise, Request, Reply, for one
//! IA_NA. Pure: the caller sends what it returns, feeds it what arrives, and owns the clock
//! and the retransmissions.

use std::net::Ipv6Addr;

use dhcproto::v6::{DhcpOption, IANA, Message, MessageType, ORO, OptionCode, Status, StatusCode};

use super::packet::{Packet6Error, decode_reply6, encode6};
use crate::MacAddr;

/// What a server bound: the address and how long it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding6 {
    pub address: Ipv6Addr,
    /// Seconds.
    pub preferred: u32,
    /// Seconds.
    pub valid: u32,
    /// The server's DUID.
    pub server: Vec<u8>,
    pub dns: Vec<Ipv6Addr>,
}

/// What to do after a message arrived.
#[derive(Debug, PartialEq, Eq)]
pub enum Step6 {
    /// Send this (the Request after an Advertise).
    Send(Vec<u8>),
    /// Done: configure the address.
    Bound(Binding6),
    /// Nothing to do; why, for the log.
    Ignored(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Soliciting,
    Requesting { server: Vec<u8>, address: Ipv6Addr },
    Bound,
}

pub struct Dhcp6Client {
    duid: Vec<u8>,
    iaid: u32,
    xid: [u8; 3],
    state: State,
}

impl Dhcp6Client {
    /// A client identified by DUID-LL of `mac` (the server reads the MAC back from it), its
    /// IA_NA named by the MAC's last four bytes; `xid` starts the transaction ids.
    pub fn new(mac: MacAddr, xid: [u8; 3]) -> Self {
        let mut duid = vec![0, 3, 0, 1];
        duid.extend(mac.0);
        let m = mac.0;
        Dhcp6Client {
            duid,
            iaid: u32::from_be_bytes([m[2], m[3], m[4], m[5]]),
            xid,
            state: State::Soliciting,
        }
    }

    /// A Solicit, starting over; `elapsed` is hundredths of a second since the first one.
    pub fn solicit(&mut self, elapsed: u16) -> Result<Vec<u8>, Packet6Error> {
        self.state = State::Soliciting;
        self.xid = next_xid(self.xid);
        let mut m = self.message(MessageType::Solicit, elapsed, None);
        m.opts_mut().insert(DhcpOption::RapidCommit);
        encode6(&m)
    }

    /// The Request again while waiting for its Reply (a retransmission keeps its id); `None`
    /// when no server has advertised yet.
    pub fn request(&self, elapsed: u16) -> Option<Result<Vec<u8>, Packet6Error>> {
        match &self.state {
            State::Requesting { server, address } => {
                let m = self.message(MessageType::Request, elapsed, Some((server, *address)));
                Some(encode6(&m))
            }
            _ => None,
        }
    }

    /// Takes a message from the network.
    pub fn receive(&mut self, buf: &[u8], elapsed: u16) -> Step6 {
        let msg = match decode_reply6(buf) {
            Ok(m) => m,
            Err(e) => return Step6::Ignored(format!("undecodable: {e}")),
        };
        if msg.xid() != self.xid {
            return Step6::Ignored("another transaction".into());
        }
        if !matches!(msg.opts().get(OptionCode::ClientId), Some(DhcpOption::ClientId(id)) if *id == self.duid)
        {
            return Step6::Ignored("for another client".into());
        }
        let Some(DhcpOption::ServerId(server)) = msg.opts().get(OptionCode::ServerId) else {
            return Step6::Ignored("no server identifier".into());
        };
        let server = server.clone();
        let answer = self.answer(&msg);
        match (msg.msg_type(), &self.state) {
            (MessageType::Advertise, State::Soliciting) => match answer {
                Ok((address, ..)) => {
                    self.state = State::Requesting { server, address };
                    match self.request(elapsed) {
                        Some(Ok(m)) => Step6::Send(m),
                        Some(Err(e)) => Step6::Ignored(e.to_string()),
                        None => Step6::Ignored("not requesting".into()),
                    }
                }
                Err(why) => Step6::Ignored(format!("advertise without an address: {why}")),
            },
            (MessageType::Reply, State::Soliciting)
                if msg.opts().get(OptionCode::RapidCommit).is_none() =>
            {
                Step6::Ignored("a reply to a solicit without rapid commit".into())
            }
            (MessageType::Reply, State::Soliciting | State::Requesting { .. }) => match answer {
                Ok((address, preferred, valid)) => {
                    self.state = State::Bound;
                    Step6::Bound(Binding6 {
                        address,
                        preferred,
                        valid,
                        server,
                        dns: match msg.opts().get(OptionCode::DomainNameServers) {
                            Some(DhcpOption::DomainNameServers(d)) => d.clone(),
                            _ => Vec::new(),
                        },
                    })
                }
                Err(why) => {
                    // RFC 8415 18.2.10.1: a refused Request starts over with a Solicit.
                    self.state = State::Soliciting;
                    Step6::Ignored(format!("refused: {why}"))
                }
            },
            (t, _) => Step6::Ignored(format!("{t:?} in this state")),
        }
    }

    fn message(
        &self,
        kind: MessageType,
        elapsed: u16,
        with: Option<(&Vec<u8>, Ipv6Addr)>,
    ) -> Message {
        let mut m = Message::new_with_id(kind, self.xid);
        let o = m.opts_mut();
        o.insert(DhcpOption::ClientId(self.duid.clone()));
        o.insert(DhcpOption::ElapsedTime(elapsed));
        o.insert(DhcpOption::ORO(ORO {
            opts: vec![OptionCode::DomainNameServers],
        }));
        let mut ia = IANA {
            id: self.iaid,
            t1: 0,
            t2: 0,
            opts: Default::default(),
        };
        if let Some((server, address)) = with {
            o.insert(DhcpOption::ServerId(server.clone()));
            ia.opts.insert(DhcpOption::IAAddr(dhcproto::v6::IAAddr {
                addr: address,
                preferred_life: 0,
                valid_life: 0,
                opts: Default::default(),
            }));
        }
        o.insert(DhcpOption::IANA(ia));
        m
    }

    /// Our IA_NA's address and lifetimes, or why there is none.
    fn answer(&self, msg: &Message) -> Result<(Ipv6Addr, u32, u32), NoAddress> {
        if let Some(DhcpOption::StatusCode(s)) = msg.opts().get(OptionCode::StatusCode)
            && s.status != Status::Success
        {
            return Err(NoAddress::Refused(describe(s)));
        }
        let ia = msg
            .opts()
            .iter()
            .find_map(|o| match o {
                DhcpOption::IANA(ia) if ia.id == self.iaid => Some(ia),
                _ => None,
            })
            .ok_or(NoAddress::NoIaNa)?;
        let mut refusal = None;
        for o in ia.opts.iter() {
            match o {
                DhcpOption::IAAddr(a) if a.valid_life > 0 => {
                    return Ok((a.addr, a.preferred_life, a.valid_life));
                }
                DhcpOption::StatusCode(s) => refusal = Some(describe(s)),
                _ => {}
            }
        }
        Err(refusal.map_or(NoAddress::Empty, NoAddress::Refused))
    }
}

/// Why a server's answer gave us no address.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum NoAddress {
    /// A status code other than success (its code and message).
    #[error("{0}")]
    Refused(String),
    #[error("no IA_NA of ours")]
    NoIaNa,
    #[error("an IA_NA without an address")]
    Empty,
}

fn describe(s: &StatusCode) -> String {
    format!("{:?} {:?}", s.status, s.msg)
}

/// The next transaction id: a new one for each exchange (RFC 8415 16.1).
fn next_xid(x: [u8; 3]) -> [u8; 3] {
    let n = (u32::from_be_bytes([0, x[0], x[1], x[2]]) + 1) & 0x00ff_ffff;
    let [_, a, b, c] = n.to_be_bytes();
    [a, b, c]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v6::packet::decode_request6;
    use crate::v6::{Leases6, Pool6, Server6, Server6Config, Subnet6};

    const LINK: &str = "2001:2::1";
    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 7]);

    fn server() -> Server6 {
        let subnet = Subnet6 {
            network: "2001:2::/64".parse().unwrap(),
            pools: vec![Pool6 {
                start: "2001:2::100".parse().unwrap(),
                end: "2001:2::1ff".parse().unwrap(),
            }],
            dns: vec![LINK.parse().unwrap()],
            domain: None,
            preferred_lifetime: 300,
            valid_lifetime: 600,
        };
        Server6::new(
            Leases6::new(vec![subnet], vec![]).unwrap(),
            Server6Config {
                duid: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
                boot: None,
            },
        )
    }

    /// The server's answer to what the client sent, encoded.
    fn answer(s: &mut Server6, sent: &[u8]) -> (Vec<u8>, usize) {
        let m = decode_request6(sent).unwrap();
        let link = LINK.parse().unwrap();
        let o = s.handle(
            &m,
            link,
            "fe80::1".parse().unwrap(),
            1_000_000,
            &crate::AllowAll,
        );
        (encode6(&o.reply.unwrap()).unwrap(), o.changes.len())
    }

    /// Against the server's own core: Solicit, Advertise, Request, Reply, the lease made
    /// durable only by the Request; the MAC the server reads from the DUID is ours.
    #[test]
    fn it_binds_through_the_four_messages_with_the_server() {
        let mut s = server();
        // Without rapid commit (stripped here) the server advertises first.
        let mut c = Dhcp6Client::new(MAC, [0, 0, 9]);
        let sol = c.solicit(0).unwrap();
        let mut plain = decode_request6(&sol).unwrap();
        plain.opts_mut().remove(OptionCode::RapidCommit);
        let (adv, durable) = answer(&mut s, &encode6(&plain).unwrap());
        assert_eq!(durable, 0);
        let Step6::Send(req) = c.receive(&adv, 10) else {
            panic!("no request")
        };
        assert_eq!(
            c.request(10).unwrap().unwrap(),
            req,
            "a retransmission is the same"
        );
        let (reply, durable) = answer(&mut s, &req);
        assert_eq!(durable, 1);
        let Step6::Bound(b) = c.receive(&reply, 20) else {
            panic!("not bound")
        };
        assert!(
            "2001:2::/64"
                .parse::<ipnet::Ipv6Net>()
                .unwrap()
                .contains(&b.address)
        );
        assert_eq!((b.preferred, b.valid), (300, 600));
        assert_eq!(b.dns, vec![LINK.parse::<Ipv6Addr>().unwrap()]);
        let m = decode_request6(&req).unwrap();
        let Some(DhcpOption::ClientId(duid)) = m.opts().get(OptionCode::ClientId) else {
            panic!()
        };
        assert_eq!(crate::v6::server::mac_of(duid), Some(MAC));
    }

    /// With rapid commit the server's Reply to the Solicit binds at once.
    #[test]
    fn rapid_commit_binds_in_two_messages() {
        let mut s = server();
        let mut c = Dhcp6Client::new(MAC, [0, 0, 1]);
        let (reply, durable) = answer(&mut s, &c.solicit(0).unwrap());
        assert_eq!(durable, 1);
        assert!(matches!(c.receive(&reply, 5), Step6::Bound(_)));
    }

    /// Another transaction, another client, garbage, or a server with no address: nothing.
    #[test]
    fn what_is_not_ours_is_ignored() {
        let mut s = server();
        let mut c = Dhcp6Client::new(MAC, [0, 0, 1]);
        let mut other = Dhcp6Client::new(MacAddr([0x52, 0x54, 0, 0, 0, 8]), [0, 0, 1]);
        let (theirs, _) = answer(&mut s, &other.solicit(0).unwrap());
        c.solicit(0).unwrap();
        assert!(matches!(c.receive(&theirs, 1), Step6::Ignored(w) if w.contains("another client")));
        let mut stale = Dhcp6Client::new(MAC, [0, 0, 40]);
        let (old, _) = answer(&mut s, &stale.solicit(0).unwrap());
        assert!(matches!(c.receive(&old, 1), Step6::Ignored(w) if w.contains("transaction")));
        assert!(matches!(c.receive(&[7, 0, 0], 1), Step6::Ignored(w) if w.contains("undecodable")));
        // A Solicit is not a server's message.
        let solicit = c.solicit(0).unwrap();
        assert!(matches!(c.receive(&solicit, 1), Step6::Ignored(_)));
        assert_eq!(c.request(1), None);
    }

    #[test]
    fn transaction_ids_wrap() {
        assert_eq!(next_xid([0xff, 0xff, 0xff]), [0, 0, 0]);
        assert_eq!(next_xid([0, 0, 0xff]), [0, 1, 0]);
    }
}
