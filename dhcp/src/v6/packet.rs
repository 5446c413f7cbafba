//! DHCPv6 messages from the network: the option framing is walked before dhcproto decodes
//! anything, so a length that lies never reaches its decoder.

use dhcproto::v6::Message;
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

/// The fixed header: message type and transaction id.
const HEADER_LEN: usize = 4;

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

fn walk(mut buf: &[u8], depth: usize) -> Result<(), Packet6Error> {
    if depth > 3 {
        return Err(Packet6Error::TooDeep(3));
    }
    while !buf.is_empty() {
        let Some((head, rest)) = buf.split_first_chunk::<4>() else {
            return Err(Packet6Error::Truncated { code: 0 });
        };
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let body = rest.get(..len).ok_or(Packet6Error::Truncated { code })?;
        check_len(code, len)?;
        // A relay message inside a client's message, or user/vendor class data, is opaque
        // to this server except for these containers.
        match code {
            9 => {
                return Err(Packet6Error::BadLength {
                    code,
                    len,
                    want: "absent (relayed messages are not served)",
                });
            }
            15 => walk_class(body, code)?,
            16 => walk_class(body.get(4..).unwrap_or_default(), code)?,
            _ => {}
        }
        if let Some(at) = nested_at(code) {
            walk(&body[at..], depth + 1)?;
        }
        buf = &rest[len..];
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
}
