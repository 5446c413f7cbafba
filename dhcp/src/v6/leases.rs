//! DHCPv6 address leases (IA_NA): pure, with time (`now`, Unix seconds) passed in.
//!
//! A client is its DUID and the IAID of one identity association; the MAC (from a link-layer
//! DUID or the client's link-local address) is recorded beside it, for reservations and for
//! the node the machine becomes. Pools are address ranges that may be as wide as a /64, so a
//! free address is found by probing from a point that depends on the client (the same client
//! tends to get the same address again), never by walking the range.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv6Addr;

use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

use crate::MacAddr;
use crate::leases::{LeaseState, Misfit, first_clash, misfit};

/// How long an advertised address is held for the client it was advertised to.
pub const ADVERTISE_HOLD_SECS: u64 = 30;

/// How many addresses of a pool are tried from each starting point (the pool's search, then
/// the client's own) before the pool counts as full for it.
const PROBES: u128 = 4096;

/// An inclusive range of IPv6 addresses inside a subnet.
pub type Pool6 = crate::leases::Pool<Ipv6Addr>;

/// The number of addresses in a pool.
fn pool_len(p: &Pool6) -> u128 {
    u128::from(p.end) - u128::from(p.start) + 1
}

/// What the server hands out on one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet6 {
    pub network: Ipv6Net,
    pub pools: Vec<Pool6>,
    pub dns: Vec<Ipv6Addr>,
    pub domain: Option<String>,
    /// Seconds.
    pub preferred_lifetime: u32,
    /// Seconds; the lease lasts this long.
    pub valid_lifetime: u32,
}

/// A fixed address for one MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation6 {
    pub mac: MacAddr,
    pub ip: Ipv6Addr,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Subnet6Error {
    #[error("pool {start}-{end}: the start is after the end")]
    Reversed { start: Ipv6Addr, end: Ipv6Addr },
    #[error("pool {start}-{end} is not inside subnet {network}")]
    PoolOutside {
        start: Ipv6Addr,
        end: Ipv6Addr,
        network: Ipv6Net,
    },
    #[error("pools {0} and {1} overlap")]
    PoolOverlap(String, String),
    #[error("pool {start}-{end} is every IPv6 address; leave one out")]
    WholeSpace { start: Ipv6Addr, end: Ipv6Addr },
    #[error("subnets {a} and {b} overlap")]
    Overlap { a: Ipv6Net, b: Ipv6Net },
    #[error("the reservation of {ip} for {mac} is in no subnet")]
    ReservationOutside { mac: MacAddr, ip: Ipv6Addr },
    #[error("{ip} is reserved twice")]
    ReservedTwice { ip: Ipv6Addr },
    #[error("subnet {network}: the preferred lifetime is longer than the valid one")]
    Lifetimes { network: Ipv6Net },
}

impl Subnet6 {
    pub fn validate(&self) -> Result<(), Subnet6Error> {
        if self.preferred_lifetime > self.valid_lifetime {
            return Err(Subnet6Error::Lifetimes {
                network: self.network,
            });
        }
        let network = self.network;
        if let Some(m) = misfit(&self.pools, |ip| network.contains(ip)) {
            return Err(match m {
                Misfit::Reversed(Pool6 { start, end }) => Subnet6Error::Reversed { start, end },
                Misfit::Outside(Pool6 { start, end }) => Subnet6Error::PoolOutside {
                    start,
                    end,
                    network,
                },
                Misfit::Overlap(a, b) => Subnet6Error::PoolOverlap(a.to_string(), b.to_string()),
            });
        }
        // Its length would not fit in 128 bits.
        match self
            .pools
            .iter()
            .find(|p| u128::from(p.end) - u128::from(p.start) == u128::MAX)
        {
            Some(&Pool6 { start, end }) => Err(Subnet6Error::WholeSpace { start, end }),
            None => Ok(()),
        }
    }
}

/// A client's identity association: its DUID (hex) and the IAID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Client6 {
    pub duid: String,
    pub iaid: u32,
}

/// One address's record, as stored under `dhcp6/leases/<ip>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease6 {
    pub ip: Ipv6Addr,
    pub duid: String,
    pub iaid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    pub state: LeaseState,
    /// Unix seconds.
    pub expires: u64,
}

impl Lease6 {
    pub fn client(&self) -> Client6 {
        Client6 {
            duid: self.duid.clone(),
            iaid: self.iaid,
        }
    }

    /// Holds the address against other clients at `now`.
    fn holds(&self, now: u64) -> bool {
        self.state.holds(self.expires, now)
    }
}

/// Why an address cannot be bound for a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal6 {
    /// Not in this link's subnet.
    NotOnLink,
    /// Another client holds it, or it is reserved for another MAC.
    Taken,
}

/// The DHCPv6 lease table: subnets, reservations, leases and outstanding advertisements.
#[derive(Debug, Default)]
pub struct Leases6 {
    subnets: Vec<Subnet6>,
    reservations: HashMap<MacAddr, Ipv6Addr>,
    reserved_ips: HashMap<Ipv6Addr, MacAddr>,
    by_ip: BTreeMap<Ipv6Addr, Lease6>,
    by_client: HashMap<Client6, Ipv6Addr>,
    advertised: HashMap<Ipv6Addr, (Client6, u64)>,
    /// The address advertised to each client, the index of `advertised`.
    advertised_to: HashMap<Client6, Ipv6Addr>,
    /// Per subnet, per pool: the offset where the search for a free address starts, just
    /// past the last one handed out (the pool's length: its start again). New clients get
    /// addresses in order, as DHCPv4's scan gives them, so a batch of new leases lands on
    /// neighbouring keys of the store. With each client hashed to a place of its own, every
    /// lease dirtied a store page of its own, and those writes held DHCPv6 to about 16,000
    /// exchanges/s; in order it passed 24,000.
    cursors: Vec<Vec<u128>>,
    /// Leases released because their client bound another address, since the last
    /// [`Leases6::take_moved_from`]: changes as durable as the new binding.
    moved_from: Vec<Lease6>,
}

impl Leases6 {
    pub fn new(
        subnets: Vec<Subnet6>,
        reservations: Vec<Reservation6>,
    ) -> Result<Self, Subnet6Error> {
        for s in &subnets {
            s.validate()?;
        }
        let clash = |a: &Subnet6, b: &Subnet6| {
            a.network.contains(&b.network.network()) || b.network.contains(&a.network.network())
        };
        if let Some((a, b)) = first_clash(&subnets, clash) {
            return Err(Subnet6Error::Overlap {
                a: a.network,
                b: b.network,
            });
        }
        let cursors = subnets.iter().map(|s| vec![0; s.pools.len()]).collect();
        let mut t = Leases6 {
            subnets,
            cursors,
            ..Leases6::default()
        };
        for r in reservations {
            if !t.subnets.iter().any(|s| s.network.contains(&r.ip)) {
                return Err(Subnet6Error::ReservationOutside {
                    mac: r.mac,
                    ip: r.ip,
                });
            }
            if t.reserved_ips.insert(r.ip, r.mac).is_some() {
                return Err(Subnet6Error::ReservedTwice { ip: r.ip });
            }
            t.reservations.insert(r.mac, r.ip);
        }
        Ok(t)
    }

    pub fn subnets(&self) -> &[Subnet6] {
        &self.subnets
    }

    /// The subnet of the link whose server address is `link`.
    pub fn subnet_for(&self, link: Ipv6Addr) -> Option<usize> {
        self.subnets.iter().position(|s| s.network.contains(&link))
    }

    pub fn subnet(&self, idx: usize) -> &Subnet6 {
        &self.subnets[idx]
    }

    /// Puts back a stored lease (at start).
    pub fn restore(&mut self, lease: Lease6) {
        // The search goes on past the highest address restored, as it would have.
        if let Some((s, k, off)) = self.pool_offset(lease.ip) {
            let cursor = &mut self.cursors[s][k];
            *cursor = (*cursor).max(off + 1);
        }
        // A declined address is no longer its client's (as [`Leases6::decline`] left it), and
        // an address the client let go does not hide the one it holds, whatever the order.
        let client = lease.client();
        let holds_another = self
            .by_client
            .get(&client)
            .and_then(|ip| self.by_ip.get(ip))
            .is_some_and(|l| l.state == LeaseState::Bound);
        if lease.state == LeaseState::Bound
            || (lease.state != LeaseState::Declined && !holds_another)
        {
            self.by_client.insert(client, lease.ip);
        }
        self.by_ip.insert(lease.ip, lease);
    }

    /// Every lease record, by address.
    pub fn records(&self) -> impl Iterator<Item = &Lease6> {
        self.by_ip.values()
    }

    pub fn count(&self) -> usize {
        self.by_ip.len()
    }

    /// Whether `ip` may be given to `client` (with `mac`) on subnet `idx` at `now`.
    fn free_for(&self, ip: Ipv6Addr, client: &Client6, mac: Option<MacAddr>, now: u64) -> bool {
        if let Some(owner) = self.reserved_ips.get(&ip)
            && Some(*owner) != mac
        {
            return false;
        }
        // A declined address is in use by someone else on the link: not even the client that
        // found that out gets it back while the quarantine lasts.
        if let Some(l) = self.by_ip.get(&ip)
            && l.holds(now)
            && (l.client() != *client || l.state == LeaseState::Declined)
        {
            return false;
        }
        match self.advertised.get(&ip) {
            Some((other, until)) => other == client || *until <= now,
            None => true,
        }
    }

    /// The address for `client` on subnet `idx`: its reservation, the address it holds or
    /// held, the one advertised to it, or a free one from a pool; `None` when every pool is
    /// full for it.
    pub fn pick(
        &self,
        idx: usize,
        client: &Client6,
        mac: Option<MacAddr>,
        now: u64,
    ) -> Option<Ipv6Addr> {
        let subnet = &self.subnets[idx];
        if let Some(ip) = mac.and_then(|m| self.reservations.get(&m))
            && subnet.network.contains(ip)
        {
            return Some(*ip);
        }
        let had = self.by_client.get(client).copied().into_iter();
        let advertised = self
            .advertised_to
            .get(client)
            .filter(|ip| {
                self.advertised
                    .get(ip)
                    .is_some_and(|(c, until)| c == client && *until > now)
            })
            .copied();
        if let Some(ip) = had.chain(advertised).find(|ip| {
            subnet.pools.iter().any(|p| p.contains(*ip)) && self.free_for(*ip, client, mac, now)
        }) {
            return Some(ip);
        }
        // From the pool's search onwards; where a stretch there is all taken (the search
        // came round to addresses handed out long ago), from the client's own place.
        let seed = client_hash(client);
        for (k, pool) in subnet.pools.iter().enumerate() {
            let len = pool_len(pool);
            for first in [self.cursors[idx][k] % len, seed % len] {
                for i in 0..PROBES.min(len) {
                    let ip = Ipv6Addr::from(u128::from(pool.start) + (first + i) % len);
                    if self.free_for(ip, client, mac, now) {
                        return Some(ip);
                    }
                }
            }
        }
        None
    }

    /// The subnet, pool and offset in it of `ip`, if a pool holds it.
    fn pool_offset(&self, ip: Ipv6Addr) -> Option<(usize, usize, u128)> {
        self.subnets.iter().enumerate().find_map(|(s, subnet)| {
            let (k, pool) = subnet
                .pools
                .iter()
                .enumerate()
                .find(|(_, p)| p.contains(ip))?;
            Some((s, k, u128::from(ip) - u128::from(pool.start)))
        })
    }

    /// Moves a pool's search past `ip` when a search found it for `client`: the address the
    /// client holds or held, the one advertised to it, or a reserved one leaves it where it
    /// is (a renewal must not send it back over addresses handed out since).
    fn hand_out(&mut self, ip: Ipv6Addr, client: &Client6) {
        if self.by_client.get(client) == Some(&ip)
            || self.advertised_to.get(client) == Some(&ip)
            || self.reserved_ips.contains_key(&ip)
        {
            return;
        }
        if let Some((s, k, off)) = self.pool_offset(ip) {
            self.cursors[s][k] = off + 1;
        }
    }

    /// Holds `ip` for `client` for [`ADVERTISE_HOLD_SECS`].
    pub fn advertise(&mut self, ip: Ipv6Addr, client: &Client6, now: u64) {
        self.hand_out(ip, client);
        if let Some(old) = self.advertised_to.insert(client.clone(), ip)
            && old != ip
        {
            self.advertised.remove(&old);
        }
        self.advertised
            .insert(ip, (client.clone(), now + ADVERTISE_HOLD_SECS));
    }

    /// Binds `ip` to `client` on subnet `idx` until `now` + the valid lifetime.
    pub fn bind(
        &mut self,
        idx: usize,
        client: &Client6,
        mac: Option<MacAddr>,
        ip: Ipv6Addr,
        now: u64,
    ) -> Result<Lease6, Refusal6> {
        let subnet = &self.subnets[idx];
        let reserved = mac.and_then(|m| self.reservations.get(&m)) == Some(&ip);
        if !subnet.network.contains(&ip)
            || !(reserved || subnet.pools.iter().any(|p| p.contains(ip)))
        {
            return Err(Refusal6::NotOnLink);
        }
        if !self.free_for(ip, client, mac, now) {
            return Err(Refusal6::Taken);
        }
        let lease = Lease6 {
            ip,
            duid: client.duid.clone(),
            iaid: client.iaid,
            mac,
            state: LeaseState::Bound,
            expires: now + u64::from(subnet.valid_lifetime),
        };
        self.hand_out(ip, client);
        // The client's previous address (another IA address, or before a reservation) is
        // let go: one address per identity association.
        if let Some(old) = self.by_client.insert(client.clone(), ip)
            && old != ip
            && let Some(l) = self.by_ip.get_mut(&old)
            && l.client() == *client
            && l.state == LeaseState::Bound
        {
            l.state = LeaseState::Released;
            self.moved_from.push(l.clone());
        }
        if let Some((held_for, _)) = self.advertised.remove(&ip) {
            self.advertised_to.remove(&held_for);
        }
        self.by_ip.insert(ip, lease.clone());
        Ok(lease)
    }

    /// The leases released since the last call because their clients bound other addresses
    /// (the store must hear of them with the new bindings, or a restart holds both).
    pub fn take_moved_from(&mut self) -> Vec<Lease6> {
        std::mem::take(&mut self.moved_from)
    }

    /// Whether the client holds, held or was advertised an address: one that is not asks
    /// for a new address (the new-lease cap counts it).
    pub fn knows(&self, client: &Client6) -> bool {
        self.by_client.contains_key(client) || self.advertised_to.contains_key(client)
    }

    /// The address the client holds or last held.
    pub fn address_of(&self, client: &Client6) -> Option<Ipv6Addr> {
        self.by_client.get(client).copied()
    }

    /// The client's own bound lease on `ip`, if it has one.
    pub fn theirs(&self, client: &Client6, ip: Ipv6Addr) -> Option<&Lease6> {
        self.by_ip
            .get(&ip)
            .filter(|l| l.client() == *client && l.state == LeaseState::Bound)
    }

    /// Marks the client's lease on `ip` released (kept for affinity).
    pub fn release(&mut self, client: &Client6, ip: Ipv6Addr) -> Option<Lease6> {
        self.theirs(client, ip)?;
        let l = self.by_ip.get_mut(&ip)?;
        l.state = LeaseState::Released;
        Some(l.clone())
    }

    /// Quarantines `ip`, which the client found in use, for the subnet's valid lifetime.
    pub fn decline(
        &mut self,
        idx: usize,
        client: &Client6,
        ip: Ipv6Addr,
        now: u64,
    ) -> Option<Lease6> {
        self.theirs(client, ip)?;
        let valid = u64::from(self.subnets[idx].valid_lifetime);
        self.by_client.remove(client);
        let l = self.by_ip.get_mut(&ip)?;
        l.state = LeaseState::Declined;
        l.expires = now + valid;
        Some(l.clone())
    }

    /// Forgets advertisements whose hold ran out.
    pub fn expire_advertisements(&mut self, now: u64) {
        self.advertised.retain(|_, (_, until)| *until > now);
        let advertised = &self.advertised;
        self.advertised_to
            .retain(|client, ip| advertised.get(ip).is_some_and(|(c, _)| c == client));
    }
}

/// FNV-1a over the client's identity: where its own search of a pool starts.
fn client_hash(c: &Client6) -> u128 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in c.duid.bytes().chain(c.iaid.to_be_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u128::from(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    fn subnet() -> Subnet6 {
        Subnet6 {
            network: "2001:db8:1::/64".parse().unwrap(),
            pools: vec![Pool6 {
                start: "2001:db8:1::100".parse().unwrap(),
                end: "2001:db8:1::103".parse().unwrap(),
            }],
            dns: vec![],
            domain: None,
            preferred_lifetime: 300,
            valid_lifetime: 600,
        }
    }

    fn client(n: u8) -> Client6 {
        Client6 {
            duid: format!("00030001525400000{n:03}"),
            iaid: 1,
        }
    }

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    /// Every client gets its own address until the pool is full; a client asking again gets
    /// the address it holds; an expired or released address is given again.
    #[test]
    fn addresses_are_unique_and_sticky() {
        let mut t = Leases6::new(vec![subnet()], vec![]).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..4 {
            let ip = t.pick(0, &client(n), Some(mac(n)), NOW).unwrap();
            t.bind(0, &client(n), Some(mac(n)), ip, NOW).unwrap();
            assert!(seen.insert(ip), "{ip} given twice");
        }
        assert_eq!(t.pick(0, &client(9), None, NOW), None, "the pool is full");
        let ip0 = t.address_of(&client(0)).unwrap();
        assert_eq!(t.pick(0, &client(0), Some(mac(0)), NOW), Some(ip0));
        assert_eq!(t.bind(0, &client(9), None, ip0, NOW), Err(Refusal6::Taken));
        // After the valid lifetime the address is free again.
        assert!(t.pick(0, &client(9), None, NOW + 601).is_some());
        t.release(&client(1), t.address_of(&client(1)).unwrap())
            .unwrap();
        assert!(t.pick(0, &client(9), None, NOW).is_some());
    }

    fn pool_of(len: u128) -> Subnet6 {
        let start: Ipv6Addr = "2001:db8:1::1:0".parse().unwrap();
        Subnet6 {
            pools: vec![Pool6 {
                start,
                end: Ipv6Addr::from(u128::from(start) + len - 1),
            }],
            ..subnet()
        }
    }

    fn nth(t: &Leases6, i: u128) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(t.subnet(0).pools[0].start) + i)
    }

    fn bound(ip: Ipv6Addr, n: u8) -> Lease6 {
        Lease6 {
            ip,
            duid: client(n).duid,
            iaid: 1,
            mac: None,
            state: LeaseState::Bound,
            expires: NOW + 600,
        }
    }

    /// New clients get a pool's addresses in order, advertised or bound at once (rapid
    /// commit). A renewal, a client asking again, a release or a reservation inside the pool
    /// does not send the search back: an address given up behind it waits while fresh ones
    /// remain.
    #[test]
    fn new_clients_get_addresses_in_order() {
        let fixed = "2001:db8:1::1:80".parse().unwrap();
        let reservation = Reservation6 {
            mac: mac(7),
            ip: fixed,
        };
        let mut t = Leases6::new(vec![pool_of(256)], vec![reservation]).unwrap();
        for n in 0..3 {
            let ip = t.pick(0, &client(n), None, NOW).unwrap();
            assert_eq!(ip, nth(&t, u128::from(n)));
            t.advertise(ip, &client(n), NOW);
            // Asked again before its Request: the same address.
            assert_eq!(t.pick(0, &client(n), None, NOW), Some(ip));
            t.advertise(ip, &client(n), NOW);
        }
        for n in 0..3 {
            let ip = t.pick(0, &client(n), None, NOW).unwrap();
            assert_eq!(t.bind(0, &client(n), None, ip, NOW).unwrap().ip, ip);
        }
        let ip = t.pick(0, &client(3), None, NOW).unwrap();
        assert_eq!(t.bind(0, &client(3), None, ip, NOW).unwrap().ip, nth(&t, 3));
        t.release(&client(1), nth(&t, 1)).unwrap();
        t.bind(0, &client(0), None, nth(&t, 0), NOW + 100).unwrap();
        let ip = t.pick(0, &client(7), Some(mac(7)), NOW).unwrap();
        assert_eq!(
            t.bind(0, &client(7), Some(mac(7)), ip, NOW).unwrap().ip,
            fixed
        );
        assert_eq!(t.pick(0, &client(4), None, NOW), Some(nth(&t, 4)));
    }

    /// Where the search comes round to a long stretch of taken addresses, the address found
    /// from the client's own place is where it goes on from: the next client does not probe
    /// the stretch again.
    #[test]
    fn the_search_goes_on_from_where_a_fallback_found_room() {
        let mut t = Leases6::new(vec![pool_of(10_000)], vec![]).unwrap();
        for i in (0..=4200).chain([9999]) {
            t.restore(bound(nth(&t, i), 1));
        }
        let first = t.pick(0, &client(8), None, NOW).unwrap();
        t.advertise(first, &client(8), NOW);
        let off = u128::from(first) - u128::from(nth(&t, 0));
        assert!((4201..9998).contains(&off), "{first}");
        assert_eq!(t.pick(0, &client(9), None, NOW), Some(nth(&t, off + 1)));
    }

    /// After a restart the search goes on past the highest address restored.
    #[test]
    fn restored_leases_move_the_search_past_them() {
        let mut t = Leases6::new(vec![pool_of(256)], vec![]).unwrap();
        for (n, i) in [(0, 16), (1, 2), (2, 3)] {
            t.restore(bound(nth(&t, i), n));
        }
        assert_eq!(t.pick(0, &client(9), None, NOW), Some(nth(&t, 17)));
    }

    /// A declined address is in use on the link: nobody gets it while its quarantine lasts,
    /// not the client that declined it either, and a restart keeps it so.
    #[test]
    fn a_declined_address_goes_to_nobody_even_after_a_restart() {
        let mut t = Leases6::new(vec![subnet()], vec![]).unwrap();
        let a = t.pick(0, &client(1), None, NOW).unwrap();
        t.bind(0, &client(1), None, a, NOW).unwrap();
        assert!(t.decline(0, &client(1), a, NOW).is_some());
        assert_ne!(t.pick(0, &client(1), None, NOW), Some(a));
        assert_eq!(t.bind(0, &client(1), None, a, NOW), Err(Refusal6::Taken));
        let mut again = Leases6::new(vec![subnet()], vec![]).unwrap();
        for l in t.records() {
            again.restore(l.clone());
        }
        assert_eq!(again.address_of(&client(1)), None);
        assert_ne!(again.pick(0, &client(1), None, NOW), Some(a));
        // Once the quarantine is over the address is free again.
        assert!(again.bind(0, &client(2), None, a, NOW + 601).is_ok());
    }

    /// A client that binds another address lets the old one go, and says so with the new
    /// binding; restored in any order, the records give it the address it holds.
    #[test]
    fn a_client_moving_address_lets_the_old_one_go_durably() {
        let mut t = Leases6::new(vec![subnet()], vec![]).unwrap();
        let (a, b) = (nth(&t, 0), nth(&t, 1));
        t.bind(0, &client(1), None, a, NOW).unwrap();
        assert!(t.take_moved_from().is_empty());
        t.bind(0, &client(1), None, b, NOW).unwrap();
        let moved = t.take_moved_from();
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!((moved[0].ip, moved[0].state), (a, LeaseState::Released));
        assert!(t.take_moved_from().is_empty(), "taken once");
        let records: Vec<Lease6> = t.records().cloned().collect();
        for order in [records.clone(), records.into_iter().rev().collect()] {
            let mut again = Leases6::new(vec![subnet()], vec![]).unwrap();
            for l in order {
                again.restore(l);
            }
            assert_eq!(again.address_of(&client(1)), Some(b));
        }
    }

    /// A reservation is given to its MAC only, even outside the pools.
    #[test]
    fn reservations_go_to_their_mac() {
        let fixed: Ipv6Addr = "2001:db8:1::10".parse().unwrap();
        let mut t = Leases6::new(
            vec![subnet()],
            vec![Reservation6 {
                mac: mac(7),
                ip: fixed,
            }],
        )
        .unwrap();
        assert_eq!(t.pick(0, &client(7), Some(mac(7)), NOW), Some(fixed));
        assert!(t.bind(0, &client(7), Some(mac(7)), fixed, NOW).is_ok());
        assert_eq!(
            t.bind(0, &client(8), Some(mac(8)), fixed, NOW),
            Err(Refusal6::NotOnLink)
        );
        let bad = Leases6::new(
            vec![subnet()],
            vec![Reservation6 {
                mac: mac(7),
                ip: "2001:db8:2::1".parse().unwrap(),
            }],
        );
        assert!(matches!(bad, Err(Subnet6Error::ReservationOutside { .. })));
    }

    /// An advertised address is held for its client; another client gets another one.
    #[test]
    fn advertised_addresses_are_held() {
        let mut t = Leases6::new(vec![subnet()], vec![]).unwrap();
        let a = t.pick(0, &client(1), None, NOW).unwrap();
        t.advertise(a, &client(1), NOW);
        let b = t.pick(0, &client(2), None, NOW).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.pick(0, &client(1), None, NOW), Some(a));
        t.expire_advertisements(NOW + ADVERTISE_HOLD_SECS);
        assert!(
            t.bind(0, &client(2), None, a, NOW + ADVERTISE_HOLD_SECS)
                .is_ok()
        );
    }

    #[test]
    fn bad_subnets_are_refused() {
        let mut s = subnet();
        s.pools[0].end = "2001:db8:2::1".parse().unwrap();
        assert!(matches!(
            s.validate(),
            Err(Subnet6Error::PoolOutside { .. })
        ));
        let mut s = subnet();
        s.network = "::/0".parse().unwrap();
        s.pools[0].start = Ipv6Addr::UNSPECIFIED;
        s.pools[0].end = Ipv6Addr::from(u128::MAX);
        assert!(matches!(s.validate(), Err(Subnet6Error::WholeSpace { .. })));
        let mut s = subnet();
        s.preferred_lifetime = 700;
        assert!(matches!(s.validate(), Err(Subnet6Error::Lifetimes { .. })));
        // Two pools sharing an address: it would count, and be tried, twice.
        let mut s = subnet();
        let (start, end) = (s.pools[0].start, s.pools[0].end);
        s.pools.push(Pool6 { start: end, end });
        assert_eq!(
            s.validate(),
            Err(Subnet6Error::PoolOverlap(
                format!("{start}-{end}"),
                format!("{end}-{end}")
            ))
        );
        s.pools[1].start = s.pools[1].end;
        s.pools[0].end = Ipv6Addr::from(u128::from(end) - 1);
        assert_eq!(s.validate(), Ok(()), "pools that touch do not overlap");
        assert!(matches!(
            Leases6::new(vec![subnet(), subnet()], vec![]),
            Err(Subnet6Error::Overlap { .. })
        ));
    }
}
