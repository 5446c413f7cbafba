//! Router advertisements (RFC 4861 4.2) for the provisioning network: the Managed and Other
//! flags send hosts to DHCPv6 for their address and options, and the prefix information
//! option tells them the subnet is on-link (DHCPv6 addresses come without a prefix length).
//! The advertisement is built here, pure; [`spawn`] sends it every interval and in answer to
//! router solicitations.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use ipnet::Ipv6Net;
use socket2::{Domain, Protocol, Socket, Type};

use crate::MacAddr;

/// ICMPv6 types.
const ROUTER_SOLICITATION: u8 = 133;
const ROUTER_ADVERTISEMENT: u8 = 134;
/// All-nodes and all-routers (link-local scope).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// What one link's advertisements say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advert {
    /// The prefixes hosts learn as on-link.
    pub prefixes: Vec<Ipv6Net>,
    /// Seconds hosts may use this host as their default router; 0: it is none.
    pub router_lifetime: u16,
    /// Seconds the prefixes stay valid and preferred.
    pub valid_lifetime: u32,
    pub preferred_lifetime: u32,
    /// Whether hosts also form their own addresses from the prefixes (SLAAC).
    pub autonomous: bool,
    /// The interface's MAC, sent as the source link-layer address.
    pub mac: MacAddr,
}

impl Advert {
    /// The ICMPv6 message (the kernel fills in the checksum of a raw ICMPv6 socket).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![ROUTER_ADVERTISEMENT, 0, 0, 0];
        // Current hop limit 64; Managed and Other configuration; the router lifetime;
        // reachable time and retransmit timer unspecified.
        b.extend([64, 0b1100_0000]);
        b.extend(self.router_lifetime.to_be_bytes());
        b.extend([0; 8]);
        // Source link-layer address: type 1, length 1 (8 octets).
        b.extend([1, 1]);
        b.extend(self.mac.0);
        for p in &self.prefixes {
            // Prefix information: type 3, length 4 (32 octets).
            b.extend([3, 4, p.prefix_len()]);
            b.push(0b1000_0000 | if self.autonomous { 0b0100_0000 } else { 0 });
            b.extend(self.valid_lifetime.to_be_bytes());
            b.extend(self.preferred_lifetime.to_be_bytes());
            b.extend([0; 4]);
            b.extend(p.network().octets());
        }
        b
    }
}

/// Whether an ICMPv6 message is a router solicitation.
pub fn is_solicitation(msg: &[u8]) -> bool {
    msg.first() == Some(&ROUTER_SOLICITATION) && msg.get(1) == Some(&0)
}

#[derive(Debug, thiserror::Error)]
#[error("router advertisements on {interface}: {source}")]
pub struct RaError {
    pub interface: String,
    #[source]
    pub source: std::io::Error,
}

/// Opens the raw ICMPv6 socket of `interface` (index `index`): hop limit 255, as receivers
/// require of neighbour discovery, and joined to all-routers to hear solicitations.
fn open(interface: &str, index: u32) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    s.bind_device(Some(interface.as_bytes()))?;
    s.set_multicast_hops_v6(255)?;
    s.set_unicast_hops_v6(255)?;
    s.set_multicast_loop_v6(false)?;
    s.set_multicast_if_v6(index)?;
    s.join_multicast_v6(&ALL_ROUTERS, index)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Advertises on `interface` every `every` and, at most twice a second, in answer to a
/// solicitation, until the task is dropped.
pub async fn run(
    interface: String,
    index: u32,
    advert: Advert,
    every: Duration,
) -> Result<(), RaError> {
    let err = |source| RaError {
        interface: interface.clone(),
        source,
    };
    // tokio's datagram socket serves any datagram socket's send_to and recv_from; on a raw
    // ICMPv6 socket they carry whole ICMPv6 messages (IPv6 raw sockets give no IP header).
    let socket = tokio::net::UdpSocket::from_std(open(&interface, index).map_err(err)?.into())
        .map_err(err)?;
    let bytes = advert.to_bytes();
    let to = SocketAddr::V6(SocketAddrV6::new(ALL_NODES, 0, 0, index));
    let mut tick = tokio::time::interval(every);
    let mut buf = [0u8; 1500];
    let mut last_answer = tokio::time::Instant::now();
    tracing::info!(%interface, prefixes = ?advert.prefixes, "dhcp6: sending router advertisements");
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            got = socket.recv_from(&mut buf) => {
                let (n, _) = got.map_err(err)?;
                if !is_solicitation(&buf[..n]) || last_answer.elapsed() < Duration::from_millis(500) {
                    continue;
                }
                last_answer = tokio::time::Instant::now();
            }
        }
        if let Err(e) = socket.send_to(&bytes, to).await {
            tracing::warn!(%interface, error = %e, "dhcp6: router advertisement not sent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertisement_sends_hosts_to_dhcpv6_with_the_prefix_on_link() {
        let a = Advert {
            prefixes: vec!["2001:2:0:1::/64".parse().unwrap()],
            router_lifetime: 0,
            valid_lifetime: 3600,
            preferred_lifetime: 1800,
            autonomous: false,
            mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
        };
        let b = a.to_bytes();
        assert_eq!(b.len(), 16 + 8 + 32);
        assert_eq!(&b[..8], &[134, 0, 0, 0, 64, 0xc0, 0, 0]);
        assert_eq!(&b[16..24], &[1, 1, 0x52, 0x54, 0, 0, 0, 1]);
        let pio = &b[24..];
        assert_eq!(&pio[..4], &[3, 4, 64, 0x80], "on-link, not autonomous");
        assert_eq!(&pio[4..8], &3600u32.to_be_bytes());
        assert_eq!(&pio[8..12], &1800u32.to_be_bytes());
        assert_eq!(
            &pio[16..],
            &"2001:2:0:1::".parse::<Ipv6Addr>().unwrap().octets()
        );
        let slaac = Advert {
            autonomous: true,
            ..a
        };
        assert_eq!(slaac.to_bytes()[27], 0xc0);
        assert!(is_solicitation(&[133, 0, 0, 0, 0, 0, 0, 0]));
        assert!(!is_solicitation(&[134, 0]));
        assert!(!is_solicitation(&[]));
    }
}
