//! Which hosts may relay. A relayed request (DHCPv4 with `giaddr` set, a DHCPv6
//! Relay-forward) names the link it speaks for, so without a list any host that reaches the
//! server's port may ask for addresses and boot files on every served link. With the relays'
//! own addresses listed, a relayed request from any other source is dropped before it is
//! handled; requests that are not relayed are not affected.
//!
//! What is checked is the packet's source address: a filter, not authentication. A host
//! that can send with a listed relay's address still gets through, so spoofed sources must
//! be stopped where the network can tell (at its edge, or by the relays' own filters).

use std::collections::BTreeSet;
use std::net::IpAddr;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Relays {
    /// Relayed requests from any source: no list configured.
    #[default]
    Any,
    /// Relayed requests only from these source addresses (empty: none at all).
    Only(BTreeSet<IpAddr>),
}

impl Relays {
    /// A relayed request from `source` is handled.
    pub fn admits(&self, source: IpAddr) -> bool {
        match self {
            Relays::Any => true,
            Relays::Only(listed) => listed.contains(&source.to_canonical()),
        }
    }

    /// A request from `source` is dropped unheard: it is `relayed` and its source is not
    /// listed. A request straight from a client never is.
    pub fn refuses(&self, relayed: bool, source: IpAddr) -> bool {
        relayed && !self.admits(source)
    }
}

/// Where relayed requests are heard from, for a summary line.
impl std::fmt::Display for Relays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Relays::Any => f.write_str("any source"),
            Relays::Only(listed) => write!(f, "{} listed relay(s)", listed.len()),
        }
    }
}

impl<A: Into<IpAddr>> FromIterator<A> for Relays {
    /// The listed relays (an empty list admits none).
    fn from_iter<I: IntoIterator<Item = A>>(iter: I) -> Self {
        Relays::Only(iter.into_iter().map(|a| a.into().to_canonical()).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn any_admits_every_source_and_a_list_only_its_own() {
        let relay = IpAddr::from(Ipv4Addr::new(198, 18, 1, 2));
        let other = IpAddr::from(Ipv4Addr::new(198, 18, 1, 3));
        assert!(Relays::Any.admits(relay) && Relays::Any.admits(other));
        let listed: Relays = [Ipv4Addr::new(198, 18, 1, 2)].into_iter().collect();
        assert!(listed.admits(relay));
        assert!(!listed.admits(other));
        let none: Relays = std::iter::empty::<Ipv4Addr>().collect();
        assert!(!none.admits(relay), "an empty list admits no relay");
    }

    #[test]
    fn only_relayed_requests_are_judged() {
        let listed: Relays = [Ipv4Addr::new(198, 18, 1, 2)].into_iter().collect();
        let client = IpAddr::from(Ipv4Addr::new(198, 18, 1, 50));
        assert!(
            !listed.refuses(false, client),
            "a client's own request is heard"
        );
        assert!(listed.refuses(true, client), "a relayed one from it is not");
        assert!(!listed.refuses(true, Ipv4Addr::new(198, 18, 1, 2).into()));
        assert!(!Relays::Any.refuses(true, client));
    }

    #[test]
    fn a_v4_relay_is_known_by_its_v4_mapped_address_too() {
        let listed: Relays = [Ipv4Addr::new(198, 18, 1, 2)].into_iter().collect();
        let mapped = Ipv4Addr::new(198, 18, 1, 2).to_ipv6_mapped();
        assert!(listed.admits(IpAddr::V6(mapped)));
        let v6: Relays = ["2001:2:0:1::2".parse::<Ipv6Addr>().unwrap()]
            .into_iter()
            .collect();
        assert!(v6.admits("2001:2:0:1::2".parse().unwrap()));
        assert!(!v6.admits("2001:2:0:1::3".parse().unwrap()));
    }
}
