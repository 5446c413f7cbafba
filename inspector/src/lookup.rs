//! Which node is posting? Every node under introspection is scored by how many of the posted
//! attributes (MACs, BMC addresses) it matches; the single best wins, a tie is an error.

use paddock_inventory::MacAddr;
use uuid::Uuid;

use crate::node::Node;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(Uuid),
    NotFound,
    /// Several nodes share the best score.
    Tie(Vec<Uuid>),
}

/// BMC addresses that mean "no BMC".
pub fn real_bmc(addr: Option<&str>) -> Option<&str> {
    addr.map(str::trim)
        .filter(|a| !a.is_empty() && *a != "0.0.0.0" && *a != "::/0" && *a != "::")
}

pub fn lookup<'a>(
    candidates: impl IntoIterator<Item = &'a Node>,
    macs: &[MacAddr],
    bmcs: &[&str],
) -> Lookup {
    let mut best = 0;
    let mut winners = Vec::new();
    for node in candidates {
        let mut score = macs.iter().filter(|m| node.macs.contains(m)).count();
        if let Some(b) = real_bmc(node.bmc_address.as_deref())
            && bmcs.contains(&b)
        {
            score += 1;
        }
        if score == 0 {
            continue;
        }
        if score > best {
            best = score;
            winners.clear();
        }
        if score == best {
            winners.push(node.uuid);
        }
    }
    match winners.len() {
        0 => Lookup::NotFound,
        1 => Lookup::Found(winners[0]),
        _ => {
            winners.sort();
            Lookup::Tie(winners)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u128, macs: &[u8], bmc: Option<&str>) -> Node {
        let mut node = Node::new(Uuid::from_u128(n), 0);
        node.macs = macs
            .iter()
            .map(|m| MacAddr([0x52, 0x54, 0, 0, 0, *m]))
            .collect();
        node.bmc_address = bmc.map(String::from);
        node
    }
    fn mac(m: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, m])
    }

    #[test]
    fn scoring() {
        let a = node(1, &[1, 2], Some("198.18.9.1"));
        let b = node(2, &[3], Some("198.18.9.2"));
        let c = node(3, &[4], Some("198.18.9.2"));
        let nodes = [a, b, c];
        let cases: &[(&[u8], &[&str], Lookup)] = &[
            (&[1], &[], Lookup::Found(Uuid::from_u128(1))),
            (&[2, 3], &["198.18.9.1"], Lookup::Found(Uuid::from_u128(1))),
            (&[9], &["198.18.9.1"], Lookup::Found(Uuid::from_u128(1))),
            (&[9], &[], Lookup::NotFound),
            (
                &[],
                &["198.18.9.2"],
                Lookup::Tie(vec![Uuid::from_u128(2), Uuid::from_u128(3)]),
            ),
            (&[3], &["198.18.9.2"], Lookup::Found(Uuid::from_u128(2))),
        ];
        for (macs, bmcs, want) in cases {
            let macs: Vec<MacAddr> = macs.iter().map(|m| mac(*m)).collect();
            assert_eq!(&lookup(&nodes, &macs, bmcs), want, "{macs:?} {bmcs:?}");
        }
    }

    #[test]
    fn placeholder_bmc_addresses_match_nothing() {
        let a = node(1, &[], Some("0.0.0.0"));
        assert_eq!(lookup([&a], &[], &["0.0.0.0"]), Lookup::NotFound);
        assert_eq!(real_bmc(Some("::/0")), None);
        assert_eq!(real_bmc(Some(" 198.18.0.9 ")), Some("198.18.0.9"));
    }
}
