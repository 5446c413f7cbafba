//! Address allocation and the lease table: pure, with time (`now`, Unix seconds) passed in.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::MacAddr;

/// How long an OFFERed address is held for the client that was offered it.
pub const OFFER_HOLD_SECS: u64 = 30;

/// An inclusive address range inside a subnet (IPv4, or IPv6 for DHCPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool<A = Ipv4Addr> {
    pub start: A,
    pub end: A,
}

impl<A: Copy + Ord> Pool<A> {
    pub(crate) fn contains(&self, ip: A) -> bool {
        (self.start..=self.end).contains(&ip)
    }
}

impl<A: std::fmt::Display> std::fmt::Display for Pool<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// Why a subnet's pools do not fit it (either family).
pub(crate) enum Misfit<A> {
    /// A pool whose start is after its end.
    Reversed(Pool<A>),
    /// A pool not inside the network.
    Outside(Pool<A>),
    /// Two pools sharing addresses: each shared address would count, and be tried, twice.
    Overlap(Pool<A>, Pool<A>),
}

/// The first misfit of `pools` in a network that holds the addresses `inside` says: a
/// reversed or outside pool in the order given, then the lowest two that overlap.
pub(crate) fn misfit<A: Copy + Ord>(
    pools: &[Pool<A>],
    inside: impl Fn(&A) -> bool,
) -> Option<Misfit<A>> {
    for &p in pools {
        if p.start > p.end {
            return Some(Misfit::Reversed(p));
        }
        if !inside(&p.start) || !inside(&p.end) {
            return Some(Misfit::Outside(p));
        }
    }
    let mut sorted = pools.to_vec();
    sorted.sort_by_key(|p| p.start);
    sorted
        .windows(2)
        .find(|w| w[1].start <= w[0].end)
        .map(|w| Misfit::Overlap(w[0], w[1]))
}

/// The first two of `items` (in order) that `clash`.
pub(crate) fn first_clash<T>(items: &[T], clash: impl Fn(&T, &T) -> bool) -> Option<(&T, &T)> {
    items
        .iter()
        .enumerate()
        .find_map(|(i, a)| items[i + 1..].iter().find(|b| clash(a, b)).map(|b| (a, b)))
}

impl Pool {
    /// Addresses in the pool: up to 2^32 (`0.0.0.0-255.255.255.255`), so not a `u32`.
    fn len(&self) -> u64 {
        u64::from(u32::from(self.end)) - u64::from(u32::from(self.start)) + 1
    }
}

/// A fixed address for one MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
}

/// A validated subnet: everything the server hands out on one link (or behind one relay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub network: Ipv4Net,
    pub pools: Vec<Pool>,
    pub exclude: BTreeSet<Ipv4Addr>,
    pub routers: Vec<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    /// Seconds.
    pub lease_time: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubnetError {
    #[error("pool {start}-{end}: the start is after the end")]
    Reversed { start: Ipv4Addr, end: Ipv4Addr },
    #[error("pool {start}-{end} is not inside subnet {network}")]
    PoolOutside {
        start: Ipv4Addr,
        end: Ipv4Addr,
        network: Ipv4Net,
    },
    #[error("pools {0} and {1} overlap")]
    Overlap(String, String),
    #[error("subnets {0} and {1} overlap; each address must belong to one subnet")]
    SubnetOverlap(Ipv4Net, Ipv4Net),
    #[error("reservation {ip} for {mac} is in no configured subnet")]
    ReservationOutside { mac: MacAddr, ip: Ipv4Addr },
    #[error("{ip} is reserved twice ({a} and {b})")]
    ReservedTwice {
        ip: Ipv4Addr,
        a: MacAddr,
        b: MacAddr,
    },
    #[error("{mac} has two reservations ({a} and {b})")]
    MacTwice {
        mac: MacAddr,
        a: Ipv4Addr,
        b: Ipv4Addr,
    },
    #[error("lease time must be at least 10 seconds, got {0}")]
    LeaseTime(u32),
}

impl Subnet {
    /// A subnet handing out the one pool `start..=end`, with no exclusions, routers, DNS
    /// servers or domain; callers that want those set them with struct update syntax.
    pub fn with_pool(network: Ipv4Net, start: Ipv4Addr, end: Ipv4Addr, lease_time: u32) -> Self {
        Self {
            network,
            pools: vec![Pool { start, end }],
            exclude: BTreeSet::new(),
            routers: vec![],
            dns: vec![],
            domain: None,
            lease_time,
        }
    }

    /// Checks the subnet on its own: pools ordered, inside the network, not overlapping.
    pub fn validate(&self) -> Result<(), SubnetError> {
        if self.lease_time < 10 {
            return Err(SubnetError::LeaseTime(self.lease_time));
        }
        let network = self.network;
        match misfit(&self.pools, |ip| network.contains(ip)) {
            Some(Misfit::Reversed(Pool { start, end })) => {
                Err(SubnetError::Reversed { start, end })
            }
            Some(Misfit::Outside(Pool { start, end })) => Err(SubnetError::PoolOutside {
                start,
                end,
                network,
            }),
            Some(Misfit::Overlap(a, b)) => Err(SubnetError::Overlap(a.to_string(), b.to_string())),
            None => Ok(()),
        }
    }

    fn in_pool(&self, ip: Ipv4Addr) -> bool {
        self.pools.iter().any(|p| p.contains(ip)) && !self.exclude.contains(&ip)
    }

    fn pool_len(&self) -> u64 {
        self.pools.iter().map(Pool::len).sum()
    }

    /// The `i`-th address of the concatenated pools.
    fn nth(&self, mut i: u64) -> Ipv4Addr {
        for p in &self.pools {
            if i < p.len() {
                let ip = u64::from(u32::from(p.start)) + i;
                return Ipv4Addr::from(u32::try_from(ip).expect("an index within the pool"));
            }
            i -= p.len();
        }
        unreachable!("index within pool_len")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// ACKed and in use until `expires`.
    Bound,
    /// Given back by the client; the address stays associated with it for affinity.
    Released,
    /// The client reported the address in use by someone else; quarantined until `expires`.
    Declined,
}

impl LeaseState {
    /// A record in this state, ending at `expires`, holds its address against other clients
    /// at `now` (both families read their records this way).
    pub(crate) fn holds(self, expires: u64, now: u64) -> bool {
        match self {
            LeaseState::Bound | LeaseState::Declined => expires > now,
            LeaseState::Released => false,
        }
    }
}

/// Where a relayed request came from (RFC 3046).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relay {
    pub giaddr: Ipv4Addr,
    /// Option 82 as received, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_info: Option<String>,
}

/// One address's record, as stored under `dhcp/leases/<ip>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub ip: Ipv4Addr,
    pub mac: MacAddr,
    pub state: LeaseState,
    /// Unix seconds.
    pub expires: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<Relay>,
}

impl Lease {
    /// Holds the address against other clients at `now`.
    fn holds(&self, now: u64) -> bool {
        self.state.holds(self.expires, now)
    }
}

/// Details recorded with an ACKed lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    pub client_id: Option<String>,
    pub hostname: Option<String>,
    pub relay: Option<Relay>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The address is not ours to give on this subnet.
    NotOnSubnet,
    /// Another client holds it (or it is reserved or quarantined).
    Taken,
}

/// An address chosen for an offer, not yet held ([`Leases::pick`], [`Leases::hold`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub ip: Ipv4Addr,
    /// Where the never-used scan of a subnet goes on next time, if it found this address.
    cursor: Option<(usize, u64)>,
}

/// The lease table of one server: subnets, reservations, leases and outstanding offers.
#[derive(Debug)]
pub struct Leases {
    subnets: Vec<Subnet>,
    reservations: HashMap<MacAddr, Reservation>,
    reserved_ips: HashMap<Ipv4Addr, MacAddr>,
    by_ip: HashMap<Ipv4Addr, Lease>,
    by_mac: HashMap<MacAddr, Ipv4Addr>,
    offers: HashMap<Ipv4Addr, (MacAddr, u64)>,
    offered_to: HashMap<MacAddr, Ipv4Addr>,
    cursors: Vec<u64>,
    /// Leases released because their client bound another address, since the last
    /// [`Leases::take_moved_from`]: changes as durable as the new binding.
    moved_from: Vec<Lease>,
}

impl Leases {
    pub fn new(subnets: Vec<Subnet>, reservations: Vec<Reservation>) -> Result<Self, SubnetError> {
        for s in &subnets {
            s.validate()?;
        }
        if let Some((a, b)) = first_clash(&subnets, |a, b| {
            a.network.contains(&b.network.network()) || b.network.contains(&a.network.network())
        }) {
            return Err(SubnetError::SubnetOverlap(a.network, b.network));
        }
        let mut by_mac = HashMap::new();
        let mut reserved_ips = HashMap::new();
        for r in reservations {
            if !subnets.iter().any(|s| s.network.contains(&r.ip)) {
                return Err(SubnetError::ReservationOutside {
                    mac: r.mac,
                    ip: r.ip,
                });
            }
            if let Some(other) = reserved_ips.insert(r.ip, r.mac) {
                return Err(SubnetError::ReservedTwice {
                    ip: r.ip,
                    a: other,
                    b: r.mac,
                });
            }
            let (mac, ip) = (r.mac, r.ip);
            if let Some(prev) = by_mac.insert(r.mac, r) {
                return Err(SubnetError::MacTwice {
                    mac,
                    a: prev.ip,
                    b: ip,
                });
            }
        }
        Ok(Leases {
            cursors: vec![0; subnets.len()],
            subnets,
            reservations: by_mac,
            reserved_ips,
            by_ip: HashMap::new(),
            by_mac: HashMap::new(),
            offers: HashMap::new(),
            offered_to: HashMap::new(),
            moved_from: Vec::new(),
        })
    }

    pub fn subnets(&self) -> &[Subnet] {
        &self.subnets
    }

    /// The subnet that serves a link: the one containing the relay's giaddr, or the address of
    /// the interface the request arrived on.
    pub fn subnet_for(&self, link: Ipv4Addr) -> Option<usize> {
        self.subnets.iter().position(|s| s.network.contains(&link))
    }

    pub fn subnet(&self, idx: usize) -> &Subnet {
        &self.subnets[idx]
    }

    /// Loads a stored lease (at start-up).
    pub fn restore(&mut self, lease: Lease) {
        // An address the client let go does not hide the one it holds, whatever the order.
        let holds_another = self
            .of_mac(lease.mac)
            .is_some_and(|l| l.state == LeaseState::Bound);
        if lease.state == LeaseState::Bound || !holds_another {
            self.by_mac.insert(lease.mac, lease.ip);
        }
        self.by_ip.insert(lease.ip, lease);
    }

    /// The host name reserved for `mac`, when `ip` is its reserved address.
    pub fn reserved_hostname(&self, mac: MacAddr, ip: Ipv4Addr) -> Option<&str> {
        self.reservations
            .get(&mac)
            .filter(|r| r.ip == ip)
            .and_then(|r| r.hostname.as_deref())
    }

    /// The lease `mac` holds, if any.
    pub fn of_mac(&self, mac: MacAddr) -> Option<&Lease> {
        self.by_mac.get(&mac).and_then(|ip| self.by_ip.get(ip))
    }

    pub fn get(&self, ip: Ipv4Addr) -> Option<&Lease> {
        self.by_ip.get(&ip)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.by_ip.values()
    }

    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }

    /// Each subnet's pools at `now`: (network, addresses held, addresses the pools offer,
    /// excluded ones left out). A released lease holds nothing; a declined one does until it
    /// expires.
    pub fn usage(&self, now: u64) -> Vec<(Ipv4Net, u64, u64)> {
        self.subnets
            .iter()
            .map(|s| {
                let in_pools = |ip: &Ipv4Addr| {
                    s.pools.iter().any(|p| p.contains(*ip)) && !s.exclude.contains(ip)
                };
                let size: u64 = s.pools.iter().map(Pool::len).sum::<u64>()
                    - s.exclude
                        .iter()
                        .filter(|ip| s.pools.iter().any(|p| p.contains(**ip)))
                        .count() as u64;
                let held = self
                    .by_ip
                    .values()
                    .filter(|l| in_pools(&l.ip) && l.holds(now))
                    .count() as u64;
                (s.network, held, size)
            })
            .collect()
    }

    /// May `mac` be given `ip` on subnet `idx` at `now`?
    fn usable(&self, idx: usize, mac: MacAddr, ip: Ipv4Addr, now: u64) -> Result<(), Refusal> {
        let subnet = &self.subnets[idx];
        let reserved_for = self.reserved_ips.get(&ip);
        match reserved_for {
            Some(owner) if *owner == mac => {
                if !subnet.network.contains(&ip) {
                    return Err(Refusal::NotOnSubnet);
                }
            }
            Some(_) => return Err(Refusal::Taken),
            None => {
                if !subnet.in_pool(ip) {
                    return Err(Refusal::NotOnSubnet);
                }
                // A client with a reservation on this subnet gets that address only.
                if let Some(r) = self.reservations.get(&mac)
                    && subnet.network.contains(&r.ip)
                {
                    return Err(Refusal::Taken);
                }
            }
        }
        if let Some(l) = self.by_ip.get(&ip)
            && l.holds(now)
            && (l.mac != mac || l.state == LeaseState::Declined)
        {
            return Err(Refusal::Taken);
        }
        if let Some((owner, until)) = self.offers.get(&ip)
            && *owner != mac
            && *until > now
        {
            return Err(Refusal::Taken);
        }
        Ok(())
    }

    /// Picks an address for a DISCOVER and holds it for [`OFFER_HOLD_SECS`]. Preference: the
    /// client's reservation, its current or last address, the address it asked for, an
    /// address never used, then one whose lease has ended.
    pub fn offer(
        &mut self,
        idx: usize,
        mac: MacAddr,
        requested: Option<Ipv4Addr>,
        now: u64,
    ) -> Option<Ipv4Addr> {
        let pick = self.pick(idx, mac, requested, now)?;
        Some(self.hold(pick, mac, now))
    }

    /// Is `ip` already `mac`'s: its current or last address, its outstanding offer, or its
    /// reservation? Giving a client anything else takes an address from the pool (what the
    /// new-lease cap counts, `crate::ratelimit`).
    pub fn is_theirs(&self, mac: MacAddr, ip: Ipv4Addr) -> bool {
        self.by_mac.get(&mac) == Some(&ip)
            || self.offered_to.get(&mac) == Some(&ip)
            || self.reservations.get(&mac).is_some_and(|r| r.ip == ip)
    }

    /// The address [`Leases::offer`] would give, without holding it: the caller may still
    /// decide not to (a rate limit), and then nothing has changed.
    pub fn pick(
        &self,
        idx: usize,
        mac: MacAddr,
        requested: Option<Ipv4Addr>,
        now: u64,
    ) -> Option<Pick> {
        let reserved = self
            .reservations
            .get(&mac)
            .map(|r| r.ip)
            .filter(|ip| self.subnets[idx].network.contains(ip));
        let plain = |ip: Ipv4Addr| Pick { ip, cursor: None };
        match reserved {
            Some(ip) => Some(ip)
                .filter(|ip| self.usable(idx, mac, *ip, now).is_ok())
                .map(plain),
            None => self
                .by_mac
                .get(&mac)
                .copied()
                .filter(|ip| self.usable(idx, mac, *ip, now).is_ok())
                .or_else(|| {
                    self.offered_to
                        .get(&mac)
                        .copied()
                        .filter(|ip| self.usable(idx, mac, *ip, now).is_ok())
                })
                .or_else(|| requested.filter(|ip| self.usable(idx, mac, *ip, now).is_ok()))
                .map(plain)
                .or_else(|| self.scan(idx, mac, now)),
        }
    }

    /// Holds a picked address for `mac` for [`OFFER_HOLD_SECS`].
    pub fn hold(&mut self, pick: Pick, mac: MacAddr, now: u64) -> Ipv4Addr {
        let Pick { ip, cursor } = pick;
        if let Some((idx, next)) = cursor {
            self.cursors[idx] = next;
        }
        self.offers.insert(ip, (mac, now + OFFER_HOLD_SECS));
        if let Some(old) = self.offered_to.insert(mac, ip)
            && old != ip
        {
            self.offers.remove(&old);
        }
        ip
    }

    fn scan(&self, idx: usize, mac: MacAddr, now: u64) -> Option<Pick> {
        let total = self.subnets[idx].pool_len();
        if total == 0 {
            return None;
        }
        let start = self.cursors[idx] % total;
        // First pass: addresses nobody has had, so returning clients keep theirs.
        for step in 0..total {
            let i = (start + step) % total;
            let ip = self.subnets[idx].nth(i);
            if !self.by_ip.contains_key(&ip) && self.usable(idx, mac, ip, now).is_ok() {
                return Some(Pick {
                    ip,
                    cursor: Some((idx, i + 1)),
                });
            }
        }
        // Second pass: addresses whose leases ended; the one that ended longest ago.
        let subnet = &self.subnets[idx];
        self.by_ip
            .values()
            .filter(|l| subnet.in_pool(l.ip) && !l.holds(now))
            .min_by_key(|l| (l.expires, l.ip))
            .map(|l| l.ip)
            .filter(|ip| self.usable(idx, mac, *ip, now).is_ok())
            .map(|ip| Pick { ip, cursor: None })
    }

    /// Binds `ip` to `mac` for a REQUEST; returns the lease to make durable before the ACK.
    pub fn ack(
        &mut self,
        idx: usize,
        mac: MacAddr,
        ip: Ipv4Addr,
        binding: Binding,
        now: u64,
    ) -> Result<Lease, Refusal> {
        self.usable(idx, mac, ip, now)?;
        let lease = Lease {
            ip,
            mac,
            state: LeaseState::Bound,
            expires: now + u64::from(self.subnets[idx].lease_time),
            client_id: binding.client_id,
            hostname: binding.hostname,
            relay: binding.relay,
        };
        self.offers.remove(&ip);
        self.offered_to.remove(&mac);
        self.forget_other_address(mac, ip);
        self.by_mac.insert(mac, ip);
        self.by_ip.insert(ip, lease.clone());
        Ok(lease)
    }

    /// A client moving to a new address gives up its old one.
    fn forget_other_address(&mut self, mac: MacAddr, ip: Ipv4Addr) {
        if let Some(old) = self.by_mac.get(&mac).copied()
            && old != ip
            && let Some(l) = self.by_ip.get_mut(&old)
            && l.mac == mac
            && l.state == LeaseState::Bound
        {
            l.state = LeaseState::Released;
            self.moved_from.push(l.clone());
        }
    }

    /// The leases released since the last call because their clients bound other addresses
    /// (the store must hear of them with the new bindings, or a restart holds both).
    pub fn take_moved_from(&mut self) -> Vec<Lease> {
        std::mem::take(&mut self.moved_from)
    }

    /// Drops an outstanding offer (the client chose another server).
    pub fn withdraw_offer(&mut self, mac: MacAddr) {
        if let Some(ip) = self.offered_to.remove(&mac) {
            self.offers.remove(&ip);
        }
    }

    /// RELEASE: the client gives the address back.
    pub fn release(&mut self, mac: MacAddr, ip: Ipv4Addr, now: u64) -> Option<Lease> {
        let l = self.by_ip.get_mut(&ip).filter(|l| l.mac == mac)?;
        l.state = LeaseState::Released;
        l.expires = now;
        Some(l.clone())
    }

    /// DECLINE: the address is in use by someone else; quarantine it for one lease time.
    pub fn decline(&mut self, idx: usize, mac: MacAddr, ip: Ipv4Addr, now: u64) -> Option<Lease> {
        let known = self.by_ip.get(&ip).is_some_and(|l| l.mac == mac)
            || self.offers.get(&ip).is_some_and(|(m, _)| *m == mac);
        if !known {
            return None;
        }
        self.offers.remove(&ip);
        self.offered_to.remove(&mac);
        if self.by_mac.get(&mac) == Some(&ip) {
            self.by_mac.remove(&mac);
        }
        let lease = Lease {
            ip,
            mac,
            state: LeaseState::Declined,
            expires: now + u64::from(self.subnets[idx].lease_time),
            client_id: None,
            hostname: None,
            relay: None,
        };
        self.by_ip.insert(ip, lease.clone());
        Some(lease)
    }

    /// Forgets offers that have run out (called now and then by the shell).
    pub fn expire_offers(&mut self, now: u64) {
        self.offers.retain(|_, (_, until)| *until > now);
        let offers = &self.offers;
        self.offered_to
            .retain(|mac, ip| offers.get(ip).is_some_and(|(m, _)| m == mac));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }
    fn ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, n)
    }
    fn subnet() -> Subnet {
        Subnet {
            network: "198.18.0.0/24".parse().unwrap(),
            pools: vec![Pool {
                start: ip(100),
                end: ip(104),
            }],
            exclude: [ip(101)].into(),
            routers: vec![ip(1)],
            dns: vec![],
            domain: None,
            lease_time: 600,
        }
    }
    fn table() -> Leases {
        Leases::new(
            vec![subnet()],
            vec![Reservation {
                mac: mac(9),
                ip: ip(50),
                hostname: None,
            }],
        )
        .unwrap()
    }

    #[test]
    fn allocates_in_order_skipping_exclusions_and_offers() {
        let mut t = table();
        assert_eq!(t.offer(0, mac(1), None, 0), Some(ip(100)));
        assert_eq!(t.offer(0, mac(2), None, 0), Some(ip(102)));
        // The same client asking again gets the same offer.
        assert_eq!(t.offer(0, mac(1), Some(ip(103)), 0), Some(ip(100)));
    }

    /// A client that binds another address lets the old one go, and says so with the new
    /// binding; restored in any order, the records give it the address it holds.
    #[test]
    fn a_client_moving_address_lets_the_old_one_go_durably() {
        let mut t = table();
        t.ack(0, mac(1), ip(100), Binding::default(), 0).unwrap();
        assert!(t.take_moved_from().is_empty());
        t.ack(0, mac(1), ip(104), Binding::default(), 0).unwrap();
        let moved = t.take_moved_from();
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(
            (moved[0].ip, moved[0].state),
            (ip(100), LeaseState::Released)
        );
        assert!(t.take_moved_from().is_empty(), "taken once");
        let mut records: Vec<Lease> = t.by_ip.values().cloned().collect();
        records.sort_by_key(|l| l.ip);
        for order in [records.clone(), records.into_iter().rev().collect()] {
            let mut again = table();
            for l in order {
                again.restore(l);
            }
            assert_eq!(again.of_mac(mac(1)).map(|l| l.ip), Some(ip(104)));
        }
    }

    /// A pool of every IPv4 address is 2^32 long: counted and searched without overflow.
    #[test]
    fn a_pool_of_the_whole_space_is_served() {
        let mut s = subnet();
        s.network = "0.0.0.0/0".parse().unwrap();
        s.pools = vec![Pool {
            start: Ipv4Addr::UNSPECIFIED,
            end: Ipv4Addr::BROADCAST,
        }];
        s.exclude.clear();
        s.validate().unwrap();
        let mut t = Leases::new(vec![s], vec![]).unwrap();
        assert_eq!(t.usage(0)[0].2, 1 << 32);
        assert!(t.offer(0, mac(1), None, 0).is_some());
        assert_eq!(
            t.offer(0, mac(2), Some(Ipv4Addr::BROADCAST), 0),
            Some(Ipv4Addr::BROADCAST)
        );
    }

    #[test]
    fn reservation_wins_and_is_never_given_to_others() {
        let mut t = table();
        assert_eq!(t.offer(0, mac(9), Some(ip(100)), 0), Some(ip(50)));
        assert_eq!(
            t.ack(0, mac(1), ip(50), Binding::default(), 0),
            Err(Refusal::Taken)
        );
        assert!(t.ack(0, mac(9), ip(50), Binding::default(), 0).is_ok());
        // A reserved client cannot take a pool address on its subnet.
        assert_eq!(
            t.ack(0, mac(9), ip(100), Binding::default(), 0),
            Err(Refusal::Taken)
        );
    }

    #[test]
    fn requested_address_is_honoured_when_free() {
        let mut t = table();
        assert_eq!(t.offer(0, mac(1), Some(ip(104)), 0), Some(ip(104)));
        assert_eq!(t.offer(0, mac(2), Some(ip(104)), 0), Some(ip(100)));
        assert_eq!(
            t.offer(0, mac(3), Some(ip(101)), 0),
            Some(ip(102)),
            "excluded"
        );
        assert_eq!(
            t.offer(0, mac(3), Some(ip(7)), 0),
            Some(ip(102)),
            "outside pool"
        );
    }

    #[test]
    fn ack_binds_and_returning_clients_keep_their_address() {
        let mut t = table();
        let l = t.ack(0, mac(1), ip(103), Binding::default(), 10).unwrap();
        assert_eq!((l.state, l.expires), (LeaseState::Bound, 610));
        assert_eq!(
            t.ack(0, mac(2), ip(103), Binding::default(), 20),
            Err(Refusal::Taken)
        );
        // Long after expiry, mac(1) still gets 103 back; others got fresh addresses meanwhile.
        assert_eq!(t.offer(0, mac(2), None, 5000), Some(ip(100)));
        assert_eq!(t.offer(0, mac(1), None, 5000), Some(ip(103)));
    }

    #[test]
    fn exhausted_pool_reuses_the_oldest_ended_lease() {
        let mut t = table();
        for (m, a) in [(1, 100), (2, 102), (3, 103), (4, 104)] {
            t.ack(0, mac(m), ip(a), Binding::default(), a as u64)
                .unwrap();
        }
        assert_eq!(t.offer(0, mac(5), None, 100), None, "all bound");
        t.release(mac(3), ip(103), 200).unwrap();
        assert_eq!(t.offer(0, mac(5), None, 201), Some(ip(103)));
        // After every lease expired, the one that ended first (103, released at 200) is reused.
        assert_eq!(t.offer(0, mac(6), None, 100_000), Some(ip(103)));
    }

    #[test]
    fn decline_quarantines_the_address() {
        let mut t = table();
        let a = t.offer(0, mac(1), None, 0).unwrap();
        assert_eq!(t.decline(0, mac(2), a, 0), None, "not offered to mac 2");
        let d = t.decline(0, mac(1), a, 0).unwrap();
        assert_eq!(d.state, LeaseState::Declined);
        assert_ne!(t.offer(0, mac(1), None, 1), Some(a));
        assert_eq!(
            t.ack(0, mac(1), a, Binding::default(), 1),
            Err(Refusal::Taken)
        );
        // After the quarantine the address is usable again.
        assert!(t.ack(0, mac(7), a, Binding::default(), 10_000).is_ok());
    }

    #[test]
    fn offers_expire() {
        let mut t = table();
        let a = t.offer(0, mac(1), None, 0).unwrap();
        assert_eq!(
            t.ack(0, mac(2), a, Binding::default(), 1),
            Err(Refusal::Taken)
        );
        assert!(
            t.ack(0, mac(2), a, Binding::default(), OFFER_HOLD_SECS + 1)
                .is_ok()
        );
    }

    #[test]
    fn restored_leases_survive_a_restart() {
        let mut t = table();
        let l = t.ack(0, mac(1), ip(104), Binding::default(), 0).unwrap();
        let mut t2 = table();
        t2.restore(l);
        assert_eq!(t2.offer(0, mac(1), None, 1), Some(ip(104)));
        assert_eq!(t2.offer(0, mac(2), Some(ip(104)), 1), Some(ip(100)));
    }

    #[test]
    fn validation_explains_the_problem() {
        let mut s = subnet();
        s.pools.push(Pool {
            start: ip(104),
            end: ip(110),
        });
        assert!(matches!(s.validate(), Err(SubnetError::Overlap(..))));
        let mut s = subnet();
        s.pools = vec![Pool {
            start: ip(10),
            end: Ipv4Addr::new(198, 18, 1, 1),
        }];
        assert!(matches!(s.validate(), Err(SubnetError::PoolOutside { .. })));
        let mut s = subnet();
        s.pools = vec![Pool {
            start: ip(10),
            end: ip(9),
        }];
        assert!(matches!(s.validate(), Err(SubnetError::Reversed { .. })));
        let r = |m, a| Reservation {
            mac: mac(m),
            ip: ip(a),
            hostname: None,
        };
        assert!(matches!(
            Leases::new(vec![subnet()], vec![r(1, 10), r(2, 10)]),
            Err(SubnetError::ReservedTwice { .. })
        ));
        assert!(matches!(
            Leases::new(vec![subnet()], vec![r(1, 10), r(1, 11)]),
            Err(SubnetError::MacTwice { .. })
        ));
        assert!(matches!(
            Leases::new(vec![subnet(), subnet()], vec![]),
            Err(SubnetError::SubnetOverlap(..))
        ));
    }

    #[test]
    fn usage_counts_held_addresses_of_each_pool() {
        let net: Ipv4Net = "198.18.0.0/24".parse().unwrap();
        let mut subnet = Subnet::with_pool(
            net,
            Ipv4Addr::new(198, 18, 0, 10),
            Ipv4Addr::new(198, 18, 0, 19),
            600,
        );
        subnet.exclude.insert(Ipv4Addr::new(198, 18, 0, 11));
        let mut leases = Leases::new(vec![subnet], vec![]).unwrap();
        let lease = |last: u8, state: LeaseState, expires: u64| Lease {
            ip: Ipv4Addr::new(198, 18, 0, last),
            mac: MacAddr([2, 0, 0, 0, 0, last]),
            state,
            expires,
            client_id: None,
            hostname: None,
            relay: None,
        };
        leases.restore(lease(10, LeaseState::Bound, 2000));
        leases.restore(lease(12, LeaseState::Bound, 500));
        leases.restore(lease(13, LeaseState::Released, 2000));
        leases.restore(lease(14, LeaseState::Declined, 2000));
        assert_eq!(leases.usage(1000), vec![(net, 2, 9)]);
    }
}
