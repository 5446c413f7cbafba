//! DHCPv6 messages from the network: the option framing is walked before dhcproto decodes
//! anything, so a length that lies never reaches its decoder.

use std::net::Ipv6Addr;

use dhcproto::v6::Message;
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use crate::MacAddr;

/// The fixed header: message type and transaction id.
const HEADER_LEN: usize = 4;
/// A relay message's fixed header: type, hop count, link address, peer address.
const RELAY_HEADER_LEN: usize = 34;
const RELAY_FORW: u8 = 12;
const RELAY_REPL: u8 = 13;
/// RFC 8415 7.6: a relay forwards a message whose hop count is below this, adding one.
pub const HOP_COUNT_LIMIT: usize = 8;
/// So a message reaches the server in at most this many Relay-forwards (hop counts 0 to 8).
pub const MAX_RELAYS: usize = HOP_COUNT_LIMIT + 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Packet6Error {
    #[error("packet is {0} bytes; a DHCPv6 message has at least 4")]
    TooShort(usize),
    #[error("message type {0} is not one a client sends")]
    NotFromClient(u8),
    #[error("message type {0} is not one a server sends a client")]
    NotFromServer(u8),
    #[error("option {code} runs past the end of its container")]
    Truncated { code: u16 },
    #[error("option {code} has length {len}; it must be {want}")]
    BadLength {
        code: u16,
        len: usize,
        want: &'static str,
    },
    #[error("options nest deeper than {0}")]
    TooDeep(usize),
    #[error("relayed through more than {0} relays")]
    TooManyRelays(usize),
    #[error("a relay-forward message carries no relay message (option 9)")]
    NoRelayMessage,
    #[error("undecodable: {0}")]
    Decode(String),
    #[error("cannot encode reply: {0}")]
    Encode(String),
}

/// Options whose length the decoder trusts: each must be right before it decodes.
fn check_len(code: u16, len: usize) -> Result<(), Packet6Error> {
    let (want, ok): (&'static str, fn(usize) -> bool) = match code {
        // IA_NA, IA_TA, IA_PD: id and times, then options.
        3 | 25 => ("at least 12", |l| l >= 12),
        4 => ("at least 4", |l| l >= 4),
        5 => ("at least 24", |l| l >= 24),
        26 => ("at least 25", |l| l >= 25),
        6 => ("even", |l| l % 2 == 0),
        7 => ("1", |l| l == 1),
        8 => ("2", |l| l == 2),
        11 => ("at least 11", |l| l >= 11),
        12 => ("16", |l| l == 16),
        13 => ("at least 2", |l| l >= 2),
        14 | 20 => ("0", |l| l == 0),
        16 | 17 => ("at least 4", |l| l >= 4),
        19 => ("1", |l| l == 1),
        23 => ("a multiple of 16", |l| l % 16 == 0),
        32 => ("4", |l| l == 4),
        61 => ("a multiple of 2, at least 2", |l| l >= 2 && l % 2 == 0),
        _ => return Ok(()),
    };
    if ok(len) {
        Ok(())
    } else {
        Err(Packet6Error::BadLength { code, len, want })
    }
}

/// Where an option's own options start (IA_NA, IA_TA, IA_PD, IA Address, IA Prefix).
fn nested_at(code: u16) -> Option<usize> {
    match code {
        3 | 25 => Some(12),
        // Vendor-specific options are decoded as options after the enterprise number.
        4 | 17 => Some(4),
        5 => Some(24),
        26 => Some(25),
        _ => None,
    }
}

/// The first option of `buf`: its code, its body (within `buf`) and what follows it.
fn next_option(buf: &[u8]) -> Result<(u16, &[u8], &[u8]), Packet6Error> {
    let Some((head, rest)) = buf.split_first_chunk::<4>() else {
        return Err(Packet6Error::Truncated { code: 0 });
    };
    let code = u16::from_be_bytes([head[0], head[1]]);
    let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
    if rest.len() < len {
        return Err(Packet6Error::Truncated { code });
    }
    let (body, rest) = rest.split_at(len);
    Ok((code, body, rest))
}

fn walk(mut buf: &[u8], depth: usize) -> Result<(), Packet6Error> {
    if depth > 3 {
        return Err(Packet6Error::TooDeep(3));
    }
    while !buf.is_empty() {
        let (code, body, rest) = next_option(buf)?;
        let len = body.len();
        check_len(code, len)?;
        // A client's message carries no relay message; user and vendor class data are
        // opaque to this server but for their framing.
        match code {
            9 => {
                return Err(Packet6Error::BadLength {
                    code,
                    len,
                    want: "absent (only a relay-forward carries a relay message)",
                });
            }
            15 => walk_class(body, code)?,
            16 => walk_class(body.get(4..).unwrap_or_default(), code)?,
            _ => {}
        }
        if let Some(at) = nested_at(code) {
            walk(&body[at..], depth + 1)?;
        }
        buf = rest;
    }
    Ok(())
}

/// User and vendor class data: 2-byte lengths, each within the option.
fn walk_class(mut buf: &[u8], code: u16) -> Result<(), Packet6Error> {
    while !buf.is_empty() {
        let Some((len, rest)) = buf.split_first_chunk::<2>() else {
            return Err(Packet6Error::Truncated { code });
        };
        let len = usize::from(u16::from_be_bytes(*len));
        buf = rest.get(len..).ok_or(Packet6Error::Truncated { code })?;
    }
    Ok(())
}

/// Decodes a message a client sent (Solicit … Information-request), refusing bad framing.
pub fn decode_request6(buf: &[u8]) -> Result<Message, Packet6Error> {
    // 1 Solicit, 3 Request, 4 Confirm, 5 Renew, 6 Rebind, 8 Release, 9 Decline,
    // 11 Information-request.
    decode6(
        buf,
        |t| matches!(t, 1 | 3..=6 | 8 | 9 | 11),
        Packet6Error::NotFromClient,
    )
}

/// Decodes a message a server sent to a client (Advertise, Reply), refusing bad framing.
pub fn decode_reply6(buf: &[u8]) -> Result<Message, Packet6Error> {
    decode6(buf, |t| matches!(t, 2 | 7), Packet6Error::NotFromServer)
}

/// The walk, then the decoder, for a message of a type `wanted` accepts.
fn decode6(
    buf: &[u8],
    wanted: fn(u8) -> bool,
    unwanted: fn(u8) -> Packet6Error,
) -> Result<Message, Packet6Error> {
    if buf.len() < HEADER_LEN {
        return Err(Packet6Error::TooShort(buf.len()));
    }
    if !wanted(buf[0]) {
        return Err(unwanted(buf[0]));
    }
    walk(&buf[HEADER_LEN..], 0)?;
    Message::decode(&mut Decoder::new(buf)).map_err(|e| Packet6Error::Decode(e.to_string()))
}

/// One relay agent a client's message came through (RFC 8415 9.1), kept to answer back
/// through it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayHop {
    pub hop_count: u8,
    /// An address on the link the relay received the message on (unspecified: the relay
    /// names the link by its interface-id alone).
    pub link: Ipv6Addr,
    /// Where the relay received the message from: the client, or the next relay.
    pub peer: Ipv6Addr,
    /// Option 18, echoed in the answer.
    pub interface_id: Option<Vec<u8>>,
    /// Option 79 (RFC 6939) with an Ethernet address: the client's MAC as the relay saw it.
    pub client_mac: Option<MacAddr>,
}

/// A client's message as it reached the server, with the relays it came through, outermost
/// (the one that sent it to the server) first; none when it came straight from the client.
#[derive(Debug)]
pub struct Inbound6 {
    pub msg: Message,
    pub relays: Vec<RelayHop>,
}

/// Decodes what a client sent, directly or wrapped in Relay-forward messages, refusing bad
/// framing at every level.
pub fn decode_inbound6(buf: &[u8]) -> Result<Inbound6, Packet6Error> {
    let mut relays = Vec::new();
    let mut buf = buf;
    while buf.first() == Some(&RELAY_FORW) {
        if relays.len() == MAX_RELAYS {
            return Err(Packet6Error::TooManyRelays(MAX_RELAYS));
        }
        let (hop, inner) = relay_forward(buf)?;
        relays.push(hop);
        buf = inner;
    }
    Ok(Inbound6 {
        msg: decode_request6(buf)?,
        relays,
    })
}

/// One Relay-forward's header and options; returns the message it carries.
fn relay_forward(buf: &[u8]) -> Result<(RelayHop, &[u8]), Packet6Error> {
    let Some((head, mut opts)) = buf.split_first_chunk::<RELAY_HEADER_LEN>() else {
        return Err(Packet6Error::TooShort(buf.len()));
    };
    let addr = |at: usize| {
        let mut o = [0u8; 16];
        o.copy_from_slice(&head[at..at + 16]);
        Ipv6Addr::from(o)
    };
    let mut hop = RelayHop {
        hop_count: head[1],
        link: addr(2),
        peer: addr(18),
        interface_id: None,
        client_mac: None,
    };
    let mut inner = None;
    while !opts.is_empty() {
        let (code, body, rest) = next_option(opts)?;
        match code {
            9 if inner.is_none() => inner = Some(body),
            18 => hop.interface_id = Some(body.to_vec()),
            // Hardware type 1 (Ethernet), then the address.
            79 => {
                if let Some(([0, 1], mac)) = body.split_first_chunk::<2>()
                    && let Ok(mac) = <[u8; 6]>::try_from(mac)
                {
                    hop.client_mac = Some(MacAddr(mac));
                }
            }
            _ => {}
        }
        opts = rest;
    }
    Ok((hop, inner.ok_or(Packet6Error::NoRelayMessage)?))
}

/// `reply` (an encoded Advertise or Reply) wrapped for the relays it goes back through, the
/// innermost first, as Relay-reply messages (RFC 8415 19.3): each relay's hop count, link and
/// peer addresses and interface-id as it sent them.
pub fn encode_relayed6(reply: Vec<u8>, relays: &[RelayHop]) -> Result<Vec<u8>, Packet6Error> {
    let mut out = reply;
    for hop in relays.iter().rev() {
        let mut m = Vec::with_capacity(out.len() + RELAY_HEADER_LEN + 32);
        m.push(RELAY_REPL);
        m.push(hop.hop_count);
        m.extend(hop.link.octets());
        m.extend(hop.peer.octets());
        if let Some(id) = &hop.interface_id {
            put_option(&mut m, 18, id)?;
        }
        put_option(&mut m, 9, &out)?;
        out = m;
    }
    Ok(out)
}

fn put_option(m: &mut Vec<u8>, code: u16, body: &[u8]) -> Result<(), Packet6Error> {
    let len = u16::try_from(body.len()).map_err(|_| {
        Packet6Error::Encode(format!("option {code} would be {} bytes", body.len()))
    })?;
    m.extend(code.to_be_bytes());
    m.extend(len.to_be_bytes());
    m.extend(body);
    Ok(())
}

pub fn encode6(msg: &Message) -> Result<Vec<u8>, Packet6Error> {
    let mut out = Vec::with_capacity(256);
    msg.encode(&mut Encoder::new(&mut out))
        .map_err(|e| Packet6Error::Encode(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_that_lies_is_refused() {
        // Solicit, xid, client id of 2 bytes.
        let good = [1, 0, 0, 1, 0, 1, 0, 2, 0xab, 0xcd];
        assert!(decode_request6(&good).is_ok());
        assert_eq!(decode_request6(&good[..3]), Err(Packet6Error::TooShort(3)));
        let mut long = good;
        long[7] = 9;
        assert_eq!(
            decode_request6(&long),
            Err(Packet6Error::Truncated { code: 1 })
        );
        // An Advertise is not from a client.
        assert_eq!(
            decode_request6(&[2, 0, 0, 1]),
            Err(Packet6Error::NotFromClient(2))
        );
        // IA_NA shorter than its fixed part; elapsed time of 3 bytes.
        assert!(matches!(
            decode_request6(&[1, 0, 0, 1, 0, 3, 0, 4, 0, 0, 0, 1]),
            Err(Packet6Error::BadLength { code: 3, .. })
        ));
        assert!(matches!(
            decode_request6(&[1, 0, 0, 1, 0, 8, 0, 3, 0, 0, 0]),
            Err(Packet6Error::BadLength { code: 8, .. })
        ));
        // An IA address inside an IA_NA that runs past the IA_NA.
        let mut nested = vec![1, 0, 0, 1, 0, 3, 0, 16];
        nested.extend([0; 12]);
        nested.extend([0, 5, 0, 24]);
        assert!(matches!(
            decode_request6(&nested),
            Err(Packet6Error::Truncated { code: 5 })
        ));
        // Found by the fuzzer: a vendor class (16) shorter than its enterprise number made
        // the decoder subtract past zero.
        let crash = [
            6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 3, 0, 0, 0, 0, 16, 0, 0, 0, 3, 0, 40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5,
            0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 150, 0, 0, 0, 0, 0, 252, 0, 0,
        ];
        assert!(decode_request6(&crash).is_err());
        let short_class = [1, 0, 0, 1, 0, 16, 0, 2, 0, 0];
        assert!(matches!(
            decode_request6(&short_class),
            Err(Packet6Error::BadLength { code: 16, .. })
        ));
        // A status code inside vendor options is decoded as an option too.
        let vendor = [1, 0, 0, 1, 0, 17, 0, 8, 0, 0, 0, 9, 0, 13, 0, 0];
        assert!(matches!(
            decode_request6(&vendor),
            Err(Packet6Error::BadLength { code: 13, .. })
        ));
    }

    /// A Relay-forward: the header, options 18 and 79, and the client's message in option
    /// 9; `inner` may itself be a Relay-forward.
    fn relay_forward(hop: u8, link: &str, inner: &[u8], extra: &[(u16, &[u8])]) -> Vec<u8> {
        let mut m = vec![12, hop];
        m.extend(link.parse::<Ipv6Addr>().unwrap().octets());
        m.extend("fe80::5054:ff:fe00:7".parse::<Ipv6Addr>().unwrap().octets());
        for (code, body) in extra {
            put_option(&mut m, *code, body).unwrap();
        }
        put_option(&mut m, 9, inner).unwrap();
        m
    }

    #[test]
    fn relayed_messages_are_unwrapped_and_answers_wrapped_back() {
        let solicit = [1, 0, 0, 1, 0, 1, 0, 2, 0xab, 0xcd];
        let mac: &[u8] = &[0, 1, 0x52, 0x54, 0, 0, 0, 7];
        let inner = relay_forward(0, "2001:2:0:2::1", &solicit, &[(18, b"eth7"), (79, mac)]);
        let outer = relay_forward(1, "2001:2:0:3::1", &inner, &[(37, b"remote")]);
        let got = decode_inbound6(&outer).unwrap();
        assert_eq!(got.msg.xid(), [0, 0, 1]);
        assert_eq!(got.relays.len(), 2);
        assert_eq!(got.relays[0].hop_count, 1);
        assert_eq!(got.relays[0].interface_id, None);
        let closest = &got.relays[1];
        assert_eq!(closest.link, "2001:2:0:2::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(
            closest.peer,
            "fe80::5054:ff:fe00:7".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(closest.interface_id.as_deref(), Some(&b"eth7"[..]));
        assert_eq!(closest.client_mac, Some(MacAddr([0x52, 0x54, 0, 0, 0, 7])));
        // Straight from a client: no relays.
        assert!(decode_inbound6(&solicit).unwrap().relays.is_empty());

        // The answer goes back through both, each with its own header and interface-id.
        let advertise = vec![2, 0, 0, 1];
        let wrapped = encode_relayed6(advertise.clone(), &got.relays).unwrap();
        let mut want_inner = vec![13, 0];
        want_inner.extend(closest.link.octets());
        want_inner.extend(closest.peer.octets());
        put_option(&mut want_inner, 18, b"eth7").unwrap();
        put_option(&mut want_inner, 9, &advertise).unwrap();
        let mut want = vec![13, 1];
        want.extend(got.relays[0].link.octets());
        want.extend(got.relays[0].peer.octets());
        put_option(&mut want, 9, &want_inner).unwrap();
        assert_eq!(wrapped, want);
    }

    #[test]
    fn bad_relay_framing_is_refused() {
        let solicit = [1, 0, 0, 1, 0, 1, 0, 2, 0xab, 0xcd];
        let good = relay_forward(0, "2001:2:0:2::1", &solicit, &[]);
        assert_eq!(
            decode_inbound6(&good[..20]).unwrap_err(),
            Packet6Error::TooShort(20)
        );
        // No option 9.
        assert_eq!(
            decode_inbound6(&good[..34]).unwrap_err(),
            Packet6Error::NoRelayMessage
        );
        // Option 9 longer than the message.
        let mut long = good.clone();
        long[37] += 1;
        assert_eq!(
            decode_inbound6(&long).unwrap_err(),
            Packet6Error::Truncated { code: 9 }
        );
        // The carried message is walked as any client's.
        let lying = relay_forward(0, "2001:2:0:2::1", &[1, 0, 0, 1, 0, 1, 0, 9, 0xab], &[]);
        assert_eq!(
            decode_inbound6(&lying).unwrap_err(),
            Packet6Error::Truncated { code: 1 }
        );
        // A server's message inside is not a client's.
        let advertise = relay_forward(0, "2001:2:0:2::1", &[2, 0, 0, 1], &[]);
        assert_eq!(
            decode_inbound6(&advertise).unwrap_err(),
            Packet6Error::NotFromClient(2)
        );
        // More relays than RFC 8415 allows.
        let mut deep = solicit.to_vec();
        for hop in 0..HOP_COUNT_LIMIT {
            deep = relay_forward(u8::try_from(hop).unwrap(), "2001:2:0:2::1", &deep, &[]);
        }
        assert_eq!(
            decode_inbound6(&deep).unwrap().relays.len(),
            HOP_COUNT_LIMIT
        );
        deep = relay_forward(8, "2001:2:0:2::1", &deep, &[]);
        assert_eq!(decode_inbound6(&deep).unwrap().relays.len(), MAX_RELAYS);
        deep = relay_forward(9, "2001:2:0:2::1", &deep, &[]);
        assert_eq!(
            decode_inbound6(&deep).unwrap_err(),
            Packet6Error::TooManyRelays(MAX_RELAYS)
        );
        // An answer too large for a relay's option 9 is refused, not cut.
        let hop = decode_inbound6(&good).unwrap().relays;
        assert!(matches!(
            encode_relayed6(vec![2; 70_000], &hop),
            Err(Packet6Error::Encode(_))
        ));
    }
}
