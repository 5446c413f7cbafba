//! LLDP (IEEE 802.1AB): parse a frame's TLVs into IPA's `lldp: [[type, "hex value"], …]` shape.
//! The parser is pure; the listener (AF_PACKET) lives in the agent shell.

pub const ETHERTYPE_LLDP: u16 = 0x88cc;
const ETHERTYPE_VLAN: u16 = 0x8100;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LldpError {
    #[error("frame too short for an Ethernet header ({0} bytes)")]
    Short(usize),
    #[error("ethertype {0:#06x} is not LLDP (0x88cc)")]
    NotLldp(u16),
    #[error("TLV of type {typ} at byte {at} claims {len} bytes, only {left} left")]
    Truncated {
        typ: u8,
        at: usize,
        len: usize,
        left: usize,
    },
}

/// The TLVs of an LLDP Ethernet frame (one 802.1Q tag allowed), up to the End TLV, which is not
/// included, as `(type, lowercase hex of the value)`.
pub fn parse_frame(frame: &[u8]) -> Result<Vec<(u8, String)>, LldpError> {
    if frame.len() < 14 {
        return Err(LldpError::Short(frame.len()));
    }
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([frame[off], frame[off + 1]]);
    if ethertype == ETHERTYPE_VLAN {
        off += 4;
        let et = frame
            .get(off..off + 2)
            .ok_or(LldpError::Short(frame.len()))?;
        ethertype = u16::from_be_bytes([et[0], et[1]]);
    }
    if ethertype != ETHERTYPE_LLDP {
        return Err(LldpError::NotLldp(ethertype));
    }
    parse_tlvs(&frame[off + 2..], off + 2)
}

/// TLVs of an LLDPDU; `base` is the offset of `pdu` in the frame, for error messages.
pub fn parse_tlvs(pdu: &[u8], base: usize) -> Result<Vec<(u8, String)>, LldpError> {
    let mut out = Vec::new();
    let mut i = 0usize;
    while i + 2 <= pdu.len() {
        let head = u16::from_be_bytes([pdu[i], pdu[i + 1]]);
        let typ = u8::try_from(head >> 9).unwrap_or(u8::MAX);
        let len = usize::from(head & 0x1ff);
        if typ == 0 {
            break;
        }
        let value = pdu.get(i + 2..i + 2 + len).ok_or(LldpError::Truncated {
            typ,
            at: base + i,
            len,
            left: pdu.len().saturating_sub(i + 2),
        })?;
        out.push((typ, hex(value)));
        i += 2 + len;
    }
    Ok(out)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(typ: u8, value: &[u8]) -> Vec<u8> {
        let head = (u16::from(typ) << 9) | u16::try_from(value.len()).unwrap();
        let mut v = head.to_be_bytes().to_vec();
        v.extend_from_slice(value);
        v
    }

    /// A switch's frame: chassis id (MAC), port id (interface name), TTL 120, system name,
    /// an 802.1 port VLAN id (org-specific), End.
    fn frame(vlan_tag: bool) -> Vec<u8> {
        let mut f = vec![
            0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55,
        ];
        if vlan_tag {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
        }
        f.extend_from_slice(&[0x88, 0xcc]);
        f.extend(tlv(1, &[4, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55]));
        f.extend(tlv(2, b"\x05Ethernet1/7"));
        f.extend(tlv(3, &[0x00, 0x78]));
        f.extend(tlv(5, b"leaf-01"));
        f.extend(tlv(127, &[0x00, 0x80, 0xc2, 0x01, 0x00, 0x64]));
        f.extend(tlv(0, &[]));
        f.extend_from_slice(&[0, 0, 0, 0]); // Ethernet padding after End
        f
    }

    #[test]
    fn parses_a_hand_made_frame() {
        let want: Vec<(u8, String)> = vec![
            (1, "04001122334455".into()),
            (2, "0545746865726e6574312f37".into()),
            (3, "0078".into()),
            (5, "6c6561662d3031".into()),
            (127, "0080c2010064".into()),
        ];
        assert_eq!(parse_frame(&frame(false)).unwrap(), want);
        assert_eq!(parse_frame(&frame(true)).unwrap(), want);
        // The IPA JSON shape.
        assert_eq!(
            serde_json::to_string(&want[..1]).unwrap(),
            r#"[[1,"04001122334455"]]"#
        );
    }

    #[test]
    fn bad_frames() {
        assert_eq!(parse_frame(&[0; 10]), Err(LldpError::Short(10)));
        let mut ip = frame(false);
        ip[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(parse_frame(&ip), Err(LldpError::NotLldp(0x0800)));
        let f = frame(false);
        // Cut inside the system name TLV (starts at 14 + 9 + 14 + 4 = 41, 7 bytes of value).
        assert_eq!(
            parse_frame(&f[..45]),
            Err(LldpError::Truncated {
                typ: 5,
                at: 41,
                len: 7,
                left: 2
            })
        );
        // No End TLV: everything present is still returned.
        assert_eq!(parse_frame(&f[..41]).unwrap().len(), 3);
    }
}
