//! Which hosts may relay. A relayed request (DHCPv4 with `giaddr` set, a DHCPv6
//! Relay-forward) names the link it speaks for, so without a list any host that reaches the
//! server's port may ask for addresses and boot files on every served link. With the relays'
//! own addresses listed, a relayed request from any other source is dropped before it is
//! handled; requests straight from clients on the served links are not affected.
//!
//! The source address is what is checked: the answer to a relayed request goes to the relay
//! (DHCPv4: `giaddr`, port 67; DHCPv6: the Relay-forward's source), so a host that forges a
//! listed relay's address never sees the answer.

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
