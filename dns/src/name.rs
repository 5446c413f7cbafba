//! Which texts may become DNS names, and the names of reverse zones.
//!
//! Names are kept as lower-case text with a trailing dot (`node-1.paddock.internal.`): DNS
//! compares names without regard to ASCII case, so one spelling keeps lookups exact.
//! Machine and instance names come from inventories and registrations, i.e. from outside:
//! each becomes exactly one label or is refused, never split into several.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// The longest label DNS allows (RFC 1035 §2.3.4).
pub const MAX_LABEL: usize = 63;
/// The longest name in its text form with the trailing dot (RFC 1035 §2.3.4: 255 octets on
/// the wire).
pub const MAX_NAME: usize = 254;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "{0:?} is not a DNS label: 1 to 63 of a-z, 0-9, '-' and '_', not beginning or ending with '-'"
    )]
    Label(String),
    #[error("{0:?} is longer than a DNS name may be (253 characters)")]
    TooLong(String),
    #[error("{0:?} is not a domain name: labels of a-z, 0-9, '-' and '_' joined by single dots")]
    Name(String),
}

/// `text` as one label, in lower case.
pub fn label(text: &str) -> Result<String, NameError> {
    let l = text.to_ascii_lowercase();
    let ok = !l.is_empty()
        && l.len() <= MAX_LABEL
        && !l.starts_with('-')
        && !l.ends_with('-')
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(l)
    } else {
        Err(NameError::Label(text.to_string()))
    }
}

/// `text` as an absolute name: lower case, with its trailing dot (given or not).
pub fn absolute(text: &str) -> Result<String, NameError> {
    let bare = text.strip_suffix('.').unwrap_or(text);
    if bare.is_empty() {
        return Err(NameError::Name(text.to_string()));
    }
    let mut out = String::with_capacity(bare.len() + 1);
    for part in bare.split('.') {
        out.push_str(&label(part).map_err(|_| NameError::Name(text.to_string()))?);
        out.push('.');
    }
    if out.len() > MAX_NAME {
        return Err(NameError::TooLong(text.to_string()));
    }
    Ok(out)
}

/// `label.parent` for an absolute `parent`, if it fits in a name.
pub fn join(label: &str, parent: &str) -> Result<String, NameError> {
    let name = format!("{label}.{parent}");
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong(name));
    }
    Ok(name)
}

/// Whether `name` is `zone` or lies below it (both absolute).
pub fn within(name: &str, zone: &str) -> bool {
    name == zone
        || (name.len() > zone.len()
            && name.ends_with(zone)
            && name.as_bytes()[name.len() - zone.len() - 1] == b'.')
}

/// The PTR owner name of an address: `4.3.2.1.in-addr.arpa.` for 1.2.3.4.
pub fn reverse_name(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("{d}.{c}.{b}.{a}.in-addr.arpa.")
}

/// The reverse zones that hold the PTRs of a subnet. Reverse zones are cut at octet
/// boundaries: a /24 is one zone, a /23 two /24 zones, a /15 two /16 zones; a subnet smaller
/// than a /24 is served from its whole /24 (RFC 2317's classless delegation is a matter
/// for the parent zone's operator, not for the names themselves).
pub fn reverse_zones(net: Ipv4Net) -> Vec<String> {
    let prefix = net.prefix_len();
    let cut = prefix.div_ceil(8).clamp(1, 3) * 8;
    let Ok(net) = Ipv4Net::new(net.network(), prefix.min(cut)) else {
        return Vec::new();
    };
    let Ok(subnets) = net.trunc().subnets(cut) else {
        return Vec::new();
    };
    subnets
        .map(|s| {
            let octets = s.network().octets();
            let kept = usize::from(cut / 8);
            let mut name = String::new();
            for o in octets[..kept].iter().rev() {
                name.push_str(&format!("{o}."));
            }
            name.push_str("in-addr.arpa.");
            name
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_one_lower_case_label_or_refused() {
        for (text, want) in [
            ("Node-1", Some("node-1")),
            ("db_primary", Some("db_primary")),
            ("a", Some("a")),
            ("", None),
            ("-a", None),
            ("a-", None),
            ("a.b", None),
            ("a b", None),
            ("<script>", None),
            ("ü", None),
        ] {
            assert_eq!(label(text).ok().as_deref(), want, "{text:?}");
        }
        assert!(label(&"a".repeat(63)).is_ok());
        assert!(label(&"a".repeat(64)).is_err());
    }

    #[test]
    fn absolute_names_end_in_a_dot_and_are_checked_label_by_label() {
        assert_eq!(absolute("Paddock.Internal").unwrap(), "paddock.internal.");
        assert_eq!(absolute("paddock.internal.").unwrap(), "paddock.internal.");
        for bad in ["", ".", "a..b", "a.-b", "a b.c"] {
            assert!(absolute(bad).is_err(), "{bad:?}");
        }
        let long = ["a".repeat(63).as_str(); 4].join(".");
        assert!(matches!(absolute(&long), Err(NameError::TooLong(_))));
        assert!(within("a.b.zone.", "zone."));
        assert!(within("zone.", "zone."));
        assert!(!within("azone.", "zone."));
        assert!(!within("zone.", "a.zone."));
    }

    #[test]
    fn reverse_zones_are_cut_at_octet_boundaries() {
        let z = |s: &str| reverse_zones(s.parse().unwrap());
        assert_eq!(z("198.18.0.0/24"), ["0.18.198.in-addr.arpa."]);
        assert_eq!(
            z("198.18.0.0/23"),
            ["0.18.198.in-addr.arpa.", "1.18.198.in-addr.arpa."]
        );
        assert_eq!(
            z("198.18.0.0/15"),
            ["18.198.in-addr.arpa.", "19.198.in-addr.arpa."]
        );
        assert_eq!(z("198.18.0.128/25"), ["0.18.198.in-addr.arpa."]);
        assert_eq!(z("10.0.0.0/8"), ["10.in-addr.arpa."]);
        assert_eq!(z("10.1.2.3/16"), ["1.10.in-addr.arpa."]);
        assert_eq!(z("0.0.0.0/0").len(), 256);
        assert_eq!(
            reverse_name("198.18.0.101".parse().unwrap()),
            "101.0.18.198.in-addr.arpa."
        );
    }
}
