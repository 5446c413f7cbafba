//! What a switch says over LLDP, from the raw TLVs an agent posts (`[[type, "hex value"], …]`)
//! to Inspector's `lldp_processed` keys (its `lldp_basic` hook): the switch and port named,
//! their capabilities and management addresses, and the port's VLANs, link aggregation and MTU
//! (the IEEE 802.1 and 802.3 organisational TLVs). Pure; a TLV that cannot be read is skipped,
//! never an error, since a switch's bytes are not ours to refuse.

use serde_json::{Map, Value, json};

const IEEE_802_1: [u8; 3] = [0x00, 0x80, 0xc2];
const IEEE_802_3: [u8; 3] = [0x00, 0x12, 0x0f];

/// The System Capabilities TLV's bits, lowest first (IEEE 802.1AB-2009 table 8-4), as Inspector
/// names them.
const CAPABILITIES: [&str; 11] = [
    "Other",
    "Repeater",
    "Bridge",
    "WLAN",
    "Router",
    "Telephone",
    "DOCSIS",
    "Station",
    "CVLAN",
    "SVLAN",
    "TPMR",
];

/// Inspector's `lldp_processed` for one interface's TLVs.
pub fn processed(tlvs: &[(u8, String)]) -> Map<String, Value> {
    let mut out = Map::new();
    let mut vlans = Vec::new();
    let mut mgmt = Vec::new();
    for (typ, hex) in tlvs {
        let Some(v) = decode_hex(hex) else {
            continue;
        };
        let mut first = |key: &str, value: Value| {
            out.entry(key.to_string()).or_insert(value);
        };
        match typ {
            1 => {
                if let Some(id) = id(&v, 4, 5) {
                    first("switch_chassis_id", json!(id));
                }
            }
            2 => {
                if let Some(id) = id(&v, 3, 4) {
                    first("switch_port_id", json!(id));
                }
            }
            4 => first("switch_port_description", json!(text(&v))),
            5 => first("switch_system_name", json!(text(&v))),
            6 => first("switch_system_description", json!(text(&v))),
            7 if v.len() >= 4 => {
                let bits = |at: usize| u16::from_be_bytes([v[at], v[at + 1]]);
                first("switch_capabilities_support", json!(names(bits(0))));
                first("switch_capabilities_enabled", json!(names(bits(2))));
            }
            8 => mgmt.extend(management_address(&v)),
            127 if v.len() >= 4 => {
                let (oui, sub, body) = ([v[0], v[1], v[2]], v[3], &v[4..]);
                match (oui, sub) {
                    (IEEE_802_1, 1) if body.len() >= 2 => first(
                        "switch_port_untagged_vlan_id",
                        json!(u16::from_be_bytes([body[0], body[1]])),
                    ),
                    (IEEE_802_1, 3) => vlans.extend(vlan_name(body)),
                    (IEEE_802_3, 3) if body.len() >= 5 => {
                        first(
                            "switch_port_link_aggregation_support",
                            json!(body[0] & 1 != 0),
                        );
                        first(
                            "switch_port_link_aggregation_enabled",
                            json!(body[0] & 2 != 0),
                        );
                        first(
                            "switch_port_link_aggregation_id",
                            json!(u32::from_be_bytes([body[1], body[2], body[3], body[4]])),
                        );
                    }
                    (IEEE_802_3, 1) if !body.is_empty() => {
                        first(
                            "switch_port_autonegotiation_support",
                            json!(body[0] & 1 != 0),
                        );
                        first(
                            "switch_port_autonegotiation_enabled",
                            json!(body[0] & 2 != 0),
                        );
                    }
                    (IEEE_802_3, 4) if body.len() >= 2 => first(
                        "switch_port_mtu",
                        json!(u16::from_be_bytes([body[0], body[1]])),
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    if !mgmt.is_empty() {
        out.insert("switch_mgmt_addresses".into(), json!(mgmt));
    }
    if !vlans.is_empty() {
        out.insert("switch_port_vlans".into(), Value::Array(vlans));
    }
    out
}

/// The switch and the port a NIC is cabled to, for people: the switch's system name, else its
/// chassis ID; the port's ID when it is a name, else its description, else its ID (a switch
/// that names ports by MAC, as lldpd does, puts the name people use in the description).
pub fn switch_port(tlvs: &[(u8, String)]) -> Option<(String, String)> {
    let p = processed(tlvs);
    let text = |key: &str| {
        p.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let switch = text("switch_system_name").or_else(|| text("switch_chassis_id"))?;
    // Port ID subtypes 3 (MAC) and 4 (network address) are not names.
    let id_is_address = tlvs
        .iter()
        .find(|(typ, _)| *typ == 2)
        .and_then(|(_, hex)| decode_hex(hex))
        .is_some_and(|v| matches!(v.first(), Some(3 | 4)));
    let port = if id_is_address {
        text("switch_port_description").or_else(|| text("switch_port_id"))?
    } else {
        text("switch_port_id").or_else(|| text("switch_port_description"))?
    };
    Some((switch, port))
}

/// Ironic's `local_link_connection` of the port these TLVs were heard on, as Inspector's
/// `local_link_connection` hook makes it: `switch_id` (the chassis ID, when it is a MAC
/// address), `port_id` (the port ID) and `switch_info` (the system name). `None` when the
/// switch named no port.
pub fn local_link_connection(tlvs: &[(u8, String)]) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for (typ, hex) in tlvs {
        let Some(v) = decode_hex(hex) else {
            continue;
        };
        let (key, value) = match (typ, v.split_first()) {
            (1, Some((4, mac))) if mac.len() == 6 => ("switch_id", mac_text(mac)),
            (2, Some(_)) => ("port_id", id(&v, 3, 4).unwrap_or_default()),
            (5, _) => ("switch_info", text(&v)),
            _ => continue,
        };
        if !value.is_empty() {
            out.entry(key).or_insert(json!(value));
        }
    }
    out.contains_key("port_id").then_some(out)
}

/// A chassis or port ID: its subtype byte, then the ID; a MAC address (`mac`) reads as one, a
/// network address (`net`) as the address, anything else as text.
fn id(v: &[u8], mac: u8, net: u8) -> Option<String> {
    let (sub, rest) = v.split_first()?;
    Some(match (*sub, rest) {
        (s, r) if s == mac && r.len() == 6 => mac_text(r),
        (s, r) if s == net => address(r).unwrap_or_else(|| text(r)),
        (_, r) => text(r),
    })
}

/// An address with its IANA family first (1 IPv4, 2 IPv6, 6 802 MAC).
fn address(v: &[u8]) -> Option<String> {
    let (family, a) = v.split_first()?;
    match (*family, a.len()) {
        (1, 4) => Some(std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string()),
        (2, 16) => {
            let b: [u8; 16] = a.try_into().ok()?;
            Some(std::net::Ipv6Addr::from(b).to_string())
        }
        (6, 6) => Some(mac_text(a)),
        _ => None,
    }
}

/// The Management Address TLV: its length (family and address), then the address.
fn management_address(v: &[u8]) -> Option<String> {
    let (len, rest) = v.split_first()?;
    address(rest.get(..usize::from(*len))?)
}

/// The 802.1 VLAN Name TLV: the VLAN ID, the name's length, the name.
fn vlan_name(body: &[u8]) -> Option<Value> {
    let id = u16::from_be_bytes([*body.first()?, *body.get(1)?]);
    let len = usize::from(*body.get(2)?);
    let name = body.get(3..3 + len)?;
    Some(json!({"id": id, "name": text(name)}))
}

fn names(bits: u16) -> Vec<&'static str> {
    CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect()
}

fn mac_text(b: &[u8]) -> String {
    b.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A switch's text, without control characters.
fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v)
        .chars()
        .filter(|c| !c.is_control())
        .collect::<String>()
        .trim()
        .to_string()
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    let hex = hex.trim();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn tlv(t: u8, v: &[u8]) -> (u8, String) {
        (t, hex(v))
    }

    /// What lldpd sends as a switch (`configure system hostname tor-sw-1`, a port described
    /// `Ethernet1/7`), with the organisational TLVs a switch adds.
    fn switch() -> Vec<(u8, String)> {
        let mut vlan = vec![0x00, 0x80, 0xc2, 3, 0x00, 0x64, 4];
        vlan.extend(b"prov");
        vec![
            tlv(1, &[4, 0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc]),
            tlv(2, &[3, 0x52, 0x54, 0x00, 0xaa, 0xbb, 0x07]),
            tlv(3, &[0, 120]),
            tlv(5, b"tor-sw-1"),
            tlv(6, b"Debian GNU/Linux 12\n"),
            tlv(7, &[0, 0x14, 0, 0x10]),
            tlv(8, &[5, 1, 198, 18, 0, 1, 2, 0, 0, 0, 3, 0]),
            tlv(4, b"Ethernet1/7"),
            tlv(127, &[0x00, 0x80, 0xc2, 1, 0x00, 0x64]),
            tlv(127, &vlan),
            tlv(127, &[0x00, 0x12, 0x0f, 1, 3, 0x6c, 0x00, 0x00, 0x1e]),
            tlv(127, &[0x00, 0x12, 0x0f, 3, 1, 0, 0, 0, 0]),
            tlv(127, &[0x00, 0x12, 0x0f, 4, 0x05, 0xee]),
        ]
    }

    #[test]
    fn a_switch_is_read_as_inspector_reads_it() {
        assert_eq!(
            Value::Object(processed(&switch())),
            json!({
                "switch_chassis_id": "52:54:00:aa:bb:cc",
                "switch_port_id": "52:54:00:aa:bb:07",
                "switch_system_name": "tor-sw-1",
                "switch_system_description": "Debian GNU/Linux 12",
                "switch_capabilities_support": ["Bridge", "Router"],
                "switch_capabilities_enabled": ["Router"],
                "switch_mgmt_addresses": ["198.18.0.1"],
                "switch_port_description": "Ethernet1/7",
                "switch_port_untagged_vlan_id": 100,
                "switch_port_vlans": [{"id": 100, "name": "prov"}],
                "switch_port_autonegotiation_support": true,
                "switch_port_autonegotiation_enabled": true,
                "switch_port_link_aggregation_support": true,
                "switch_port_link_aggregation_enabled": false,
                "switch_port_link_aggregation_id": 0,
                "switch_port_mtu": 1518
            })
        );
        // The port ID is a MAC: people know the port by its description.
        assert_eq!(
            switch_port(&switch()),
            Some(("tor-sw-1".into(), "Ethernet1/7".into()))
        );
    }

    /// Names where the IDs are names (interface-name subtypes), and what is missing falls back.
    #[test]
    fn names_and_fallbacks() {
        let tlvs = vec![
            tlv(1, &[7, b's', b'w', b'1']),
            tlv(2, &[5, b'E', b't', b'h', b'1', b'/', b'7']),
        ];
        assert_eq!(switch_port(&tlvs), Some(("sw1".into(), "Eth1/7".into())));
        let only_description = vec![tlv(1, &[7, b's']), tlv(4, b"uplink 3")];
        assert_eq!(
            switch_port(&only_description),
            Some(("s".into(), "uplink 3".into()))
        );
        assert_eq!(switch_port(&[tlv(4, b"port")]), None, "no switch");
        // A port ID that is an address.
        let p = processed(&[tlv(2, &[4, 1, 10, 0, 0, 7])]);
        assert_eq!(p["switch_port_id"], "10.0.0.7");
    }

    /// The port's switch for Ironic: the chassis MAC, the port ID and the system name; a
    /// chassis named otherwise than by MAC gives no `switch_id`, and no port ID no link.
    #[test]
    fn the_local_link_connection_names_the_switch_and_port() {
        assert_eq!(
            local_link_connection(&switch()).map(Value::Object),
            Some(
                json!({"switch_id": "52:54:00:aa:bb:cc", "port_id": "52:54:00:aa:bb:07",
                        "switch_info": "tor-sw-1"})
            )
        );
        let named = [tlv(1, &[7, b's', b'w']), tlv(2, &[5, b'e', b'1'])];
        assert_eq!(
            local_link_connection(&named).map(Value::Object),
            Some(json!({"port_id": "e1"}))
        );
        assert_eq!(local_link_connection(&[tlv(5, b"sw")]), None);
        assert_eq!(local_link_connection(&[tlv(2, &[])]), None);
    }

    /// Bytes a switch got wrong are skipped, one TLV at a time; nothing panics.
    #[test]
    fn bad_tlvs_are_skipped() {
        let tlvs = vec![
            (1, "zz".to_string()),
            (2, "abc".to_string()),
            tlv(7, &[0]),
            tlv(8, &[200, 1]),
            tlv(127, &[0x00, 0x80]),
            tlv(127, &[0x00, 0x80, 0xc2, 3, 0, 1, 250, b'x']),
            tlv(127, &[0x00, 0x12, 0x0f, 4, 1]),
            tlv(2, &[]),
            tlv(5, b"\x1b[2Jsw\n"),
        ];
        assert_eq!(
            Value::Object(processed(&tlvs)),
            json!({"switch_system_name": "[2Jsw"})
        );
    }
}
