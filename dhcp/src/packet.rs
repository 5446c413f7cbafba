//! Turning bytes from the network into a DHCP request, refusing what could upset the decoder.
//!
//! dhcproto decodes most malformed input into an error, but a few inputs reach assertions or
//! unchecked slicing (a `debug_assert` on option 94's length; `chaddr()` slices by `hlen`).
//! Every packet is walked here first, so nothing from the network reaches those paths.

use dhcproto::v4::{Message, Opcode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

/// The fixed BOOTP header plus the magic cookie.
pub const HEADER_LEN: usize = 240;
const MAGIC: [u8; 4] = [99, 130, 83, 99];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    #[error("packet is {0} bytes; a DHCP message has at least 240")]
    TooShort(usize),
    #[error("not a BOOTREQUEST (op {0})")]
    NotRequest(u8),
    #[error("hardware address length {0} is over 16")]
    HlenTooLong(u8),
    #[error("no DHCP magic cookie")]
    NoMagic,
    #[error("option {code} runs past the end of the packet")]
    Truncated { code: u8 },
    #[error("option {code} has length {len}; it must be {want}")]
    BadLength {
        code: u8,
        len: usize,
        want: &'static str,
    },
    #[error("undecodable: {0}")]
    Decode(String),
    #[error("cannot encode reply: {0}")]
    Encode(String),
}

/// A length rule: its description, and the check.
type LenRule = (&'static str, fn(usize) -> bool);

/// Options whose length dhcproto trusts (or asserts on): they must be exactly right.
fn check_len(code: u8, len: usize) -> Result<(), PacketError> {
    let want: Option<LenRule> = match code {
        80 => Some(("0", |l| l == 0)),
        81 => Some(("at least 3", |l| l >= 3)),
        93 => Some(("a multiple of 2, at least 2", |l| l >= 2 && l % 2 == 0)),
        94 => Some(("3", |l| l == 3)),
        151 => Some(("at least 1", |l| l >= 1)),
        91 | 152..=155 => Some(("4", |l| l == 4)),
        156 | 157 => Some(("1", |l| l == 1)),
        _ => None,
    };
    match want {
        Some((want, ok)) if !ok(len) => Err(PacketError::BadLength { code, len, want }),
        _ => Ok(()),
    }
}

/// Checks the framing of a received packet without decoding it.
pub fn validate(buf: &[u8]) -> Result<(), PacketError> {
    if buf.len() < HEADER_LEN {
        return Err(PacketError::TooShort(buf.len()));
    }
    if buf[0] != 1 {
        return Err(PacketError::NotRequest(buf[0]));
    }
    if buf[2] > 16 {
        return Err(PacketError::HlenTooLong(buf[2]));
    }
    if buf[236..240] != MAGIC {
        return Err(PacketError::NoMagic);
    }
    // Consecutive options with the same code are one option (RFC 3396, as dhcproto decodes
    // them): lengths are checked on the concatenation.
    let mut run: Option<(u8, usize)> = None;
    let mut i = HEADER_LEN;
    while i < buf.len() {
        let code = buf[i];
        if code == 0 || code == 255 {
            if let Some((c, len)) = run.take() {
                check_len(c, len)?;
            }
            if code == 255 {
                break;
            }
            i += 1;
            continue;
        }
        let len = *buf.get(i + 1).ok_or(PacketError::Truncated { code })? as usize;
        if i + 2 + len > buf.len() {
            return Err(PacketError::Truncated { code });
        }
        run = match run {
            Some((c, total)) if c == code => Some((c, total + len)),
            Some((c, total)) => {
                check_len(c, total)?;
                Some((code, len))
            }
            None => Some((code, len)),
        };
        i += 2 + len;
    }
    if let Some((c, len)) = run {
        check_len(c, len)?;
    }
    Ok(())
}

/// Validates and decodes a request.
pub fn decode_request(buf: &[u8]) -> Result<Message, PacketError> {
    validate(buf)?;
    let msg =
        Message::decode(&mut Decoder::new(buf)).map_err(|e| PacketError::Decode(e.to_string()))?;
    if msg.opcode() != Opcode::BootRequest {
        return Err(PacketError::NotRequest(buf[0]));
    }
    Ok(msg)
}

pub fn encode(msg: &Message) -> Result<Vec<u8>, PacketError> {
    let mut out = Vec::with_capacity(576);
    msg.encode(&mut Encoder::new(&mut out))
        .map_err(|e| PacketError::Encode(e.to_string()))?;
    // Some PXE ROMs drop replies shorter than a BOOTP packet (300 bytes): pad.
    if out.len() < 300 {
        out.resize(300, 0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discover(opts: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[0] = 1;
        b[1] = 1;
        b[2] = 6;
        b[28..34].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        b[236..240].copy_from_slice(&MAGIC);
        b.extend_from_slice(&[53, 1, 1]);
        b.extend_from_slice(opts);
        b.push(255);
        b
    }

    #[test]
    fn good_packet_decodes() {
        // An option split in two (RFC 3396) is fine when the whole is right.
        let m = decode_request(&discover(&[93, 2, 0, 7, 94, 1, 1, 94, 2, 2, 1, 0])).unwrap();
        assert_eq!(m.chaddr(), &[0x52, 0x54, 0, 0, 0, 1]);
    }

    #[test]
    fn broken_packets_are_refused_with_a_reason() {
        let mut long_hlen = discover(&[]);
        long_hlen[2] = 200;
        let mut reply = discover(&[]);
        reply[0] = 2;
        let mut no_magic = discover(&[]);
        no_magic[236] = 0;
        let cases: Vec<(Vec<u8>, PacketError)> = vec![
            (vec![1; 10], PacketError::TooShort(10)),
            (long_hlen, PacketError::HlenTooLong(200)),
            (reply, PacketError::NotRequest(2)),
            (no_magic, PacketError::NoMagic),
            (
                discover(&[94, 2, 1, 2]),
                PacketError::BadLength {
                    code: 94,
                    len: 2,
                    want: "3",
                },
            ),
            (
                discover(&[80, 1, 0]),
                PacketError::BadLength {
                    code: 80,
                    len: 1,
                    want: "0",
                },
            ),
            (
                discover(&[151, 0]),
                PacketError::BadLength {
                    code: 151,
                    len: 0,
                    want: "at least 1",
                },
            ),
            (
                discover(&[12, 40, b'a']),
                PacketError::Truncated { code: 12 },
            ),
        ];
        for (buf, want) in cases {
            assert_eq!(decode_request(&buf).unwrap_err(), want);
        }
        let mut cut = discover(&[]);
        cut.pop();
        cut.push(12);
        assert_eq!(
            decode_request(&cut).unwrap_err(),
            PacketError::Truncated { code: 12 }
        );
    }
}
