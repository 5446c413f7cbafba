//! DHCPv6 on the boot NIC, for an appliance reached over IPv6 (`paddock.url=http://[addr]…`):
//! busybox has no DHCPv6 client, so the agent runs [`paddock_dhcp::v6::Dhcp6Client`] over a
//! UDP socket and configures the address it is given with busybox `ip`. The on-link route
//! comes from the router advertisements (the prefix's on-link flag), as for any DHCPv6 host;
//! the address itself is a /128 (RFC 8415 does not give a prefix length).

use std::net::{Ipv6Addr, SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use paddock_dhcp::v6::{Binding6, Dhcp6Client, Step6};
use paddock_inventory::MacAddr;

/// RFC 8415 7.1: All_DHCP_Relay_Agents_and_Servers.
const SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
const CLIENT_PORT: u16 = 546;
const SERVER_PORT: u16 = 547;
/// `IFA_F_TENTATIVE` in `/proc/net/if_inet6`: duplicate address detection still runs.
const TENTATIVE: u32 = 0x40;
/// How long duplicate address detection may take (the kernel's default is one probe, 1 s).
const DAD_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Dhcp6Error {
    #[error("{0} has no interface index")]
    NoIndex(String),
    #[error("DHCPv6 socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("encoding a DHCPv6 message: {0}")]
    Encode(#[from] paddock_dhcp::v6::packet::Packet6Error),
    #[error("no DHCPv6 server bound an address within {0} s ({1})")]
    NoLease(u64, String),
    #[error("the address {address} did not pass duplicate address detection within {secs} s")]
    Tentative { address: Ipv6Addr, secs: u64 },
}

/// Leases an address on `ifname` (whose MAC is `mac`) within `within`, and adds it to the
/// interface once bound; `say` hears each step.
pub fn lease(
    ifname: &str,
    mac: MacAddr,
    within: Duration,
    say: &mut dyn FnMut(&str),
) -> Result<Binding6, Dhcp6Error> {
    let index = crate::collect::net::index_of(std::path::Path::new("/"), ifname)
        .ok_or_else(|| Dhcp6Error::NoIndex(ifname.to_string()))?;
    let socket =
        UdpSocket::bind((Ipv6Addr::UNSPECIFIED, CLIENT_PORT)).map_err(Dhcp6Error::Socket)?;
    socket
        .set_read_timeout(Some(Duration::from_millis(250)))
        .map_err(Dhcp6Error::Socket)?;
    let to = SocketAddrV6::new(SERVERS, SERVER_PORT, 0, index);
    let start = Instant::now();
    let deadline = start + within;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        .to_be_bytes();
    let mut client = Dhcp6Client::new(mac, [seed[1], seed[2], seed[3]]);
    // Hundredths of a second since the first Solicit, capped as RFC 8415 21.9 says.
    let elapsed = || u16::try_from(start.elapsed().as_millis() / 10).unwrap_or(u16::MAX);
    let mut last = String::from("no answer");
    let mut wait = Duration::from_secs(1);
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        // Until the link-local address has passed duplicate address detection the kernel
        // has no source for the Solicit; sending then fails and is simply tried again.
        let mut message = client.solicit(elapsed())?;
        let mut tries = 0;
        let round_end = Instant::now() + wait;
        while Instant::now() < round_end.min(deadline) {
            if !message.is_empty() {
                if let Err(e) = socket.send_to(&message, to) {
                    last = format!("sending: {e}");
                }
                message.clear();
            }
            let n = match socket.recv_from(&mut buf) {
                Ok((n, _)) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if let Some(again) = client.request(elapsed()) {
                        // The Request is sent again each second until the Reply comes.
                        tries += 1;
                        if tries % 4 == 0 {
                            message = again?;
                        }
                    }
                    continue;
                }
                Err(e) => return Err(Dhcp6Error::Socket(e)),
            };
            match client.receive(&buf[..n], elapsed()) {
                Step6::Send(request) => {
                    say("DHCPv6: advertised; requesting");
                    message = request;
                }
                Step6::Bound(b) => {
                    say(&format!(
                        "DHCPv6: bound {} (valid {} s)",
                        b.address, b.valid
                    ));
                    configure(ifname, &b)?;
                    return Ok(b);
                }
                Step6::Ignored(why) => last = why,
            }
        }
        wait = (wait * 2).min(Duration::from_secs(8));
    }
    Err(Dhcp6Error::NoLease(within.as_secs(), last))
}

/// Adds the address and waits for duplicate address detection to pass: the kernel does not
/// use a tentative address as a source.
fn configure(ifname: &str, b: &Binding6) -> Result<(), Dhcp6Error> {
    let until = Instant::now() + DAD_WAIT;
    let cidr = format!("{}/128", b.address);
    let valid = b.valid.to_string();
    let preferred = b.preferred.to_string();
    // Already there (a second lease of the same address) is fine.
    let _ = crate::busybox::busybox(&[
        "ip",
        "-6",
        "addr",
        "add",
        &cidr,
        "dev",
        ifname,
        "valid_lft",
        &valid,
        "preferred_lft",
        &preferred,
    ]);
    loop {
        let table = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
        if matches!(flags_of(&table, b.address), Some(f) if f & TENTATIVE == 0) {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(Dhcp6Error::Tentative {
                address: b.address,
                secs: DAD_WAIT.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The flags of `address` in `/proc/net/if_inet6` (address, index, prefix length, scope,
/// flags, name: all hex but the name).
fn flags_of(table: &str, address: Ipv6Addr) -> Option<u32> {
    let want: String = address
        .octets()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    table.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == want).then_some(())?;
        u32::from_str_radix(f.nth(3)?, 16).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_table_gives_the_flags() {
        let table = "\
20010002000000000000000000000105 02 80 00 40     eth0
fe80000000000000505400fffe0001aa 02 40 20 80     eth0
";
        assert_eq!(
            flags_of(table, "2001:2::105".parse().unwrap()),
            Some(TENTATIVE)
        );
        assert_eq!(
            flags_of(table, "fe80::5054:ff:fe00:1aa".parse().unwrap()),
            Some(0x80)
        );
        assert_eq!(flags_of(table, "2001:2::9".parse().unwrap()), None);
    }
}
