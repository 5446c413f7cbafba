//! DHCPv6's shell in the appliance: its configuration section (`[dhcp6]`), the listeners on
//! the configured interfaces, and the service.

use std::net::Ipv6Addr;
use std::sync::Arc;

use anyhow::Context;
use ipnet::Ipv6Net;
use paddock_dhcp::v6::shell::{Dhcp6Service, Listener6};
use paddock_dhcp::v6::{Boot6, Leases6, Pool6, Reservation6, Server6, Server6Config, Subnet6};
use paddock_inventory::MacAddr;
use serde::Deserialize;

use crate::runtime::Runtime;
use crate::setting::{parse, parse_each, ranges};

/// The DHCPv6 server port (RFC 8415 7.2).
pub const DHCP6_PORT: u16 = 547;
/// Seconds.
pub const PREFERRED_LIFETIME: u32 = 1800;
/// Seconds.
pub const VALID_LIFETIME: u32 = 3600;
/// Seconds between unsolicited router advertisements.
pub const RA_INTERVAL_SECS: u64 = 30;

/// `[dhcp6]`: off unless enabled.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dhcp6File {
    pub enabled: Option<bool>,
    pub interfaces: Vec<String>,
    pub port: Option<u16>,
    /// The appliance's HTTP base URL over IPv6 (`http://[addr]:port`) for boot file URLs;
    /// unset: addresses only, no boot files.
    pub public_url: Option<String>,
    /// Router advertisements on each interface (default on): they send hosts to DHCPv6 and
    /// give them the subnets as on-link. Off where a router already advertises.
    pub router_advertisements: Option<bool>,
    /// Seconds between unsolicited advertisements (default 30; solicitations are answered
    /// at once).
    pub ra_interval_secs: Option<u64>,
    /// Seconds hosts may use this host as their default router (default 0: none).
    pub router_lifetime: Option<u16>,
    pub subnets: Vec<Subnet6File>,
    pub reservations: Vec<Reservation6File>,
    /// MACs never answered (by the MAC of the client's DUID or link-local address).
    pub deny_macs: Vec<String>,
    /// The relays' own addresses: a Relay-forward from any other source is dropped. Unset:
    /// Relay-forwards from anyone; empty: from no one.
    pub relays: Option<Vec<String>>,
    /// The rate limits, as `[dhcp]` has them (same keys, same defaults).
    pub per_client_burst: Option<u32>,
    pub per_client_per_sec: Option<u32>,
    pub max_tracked_clients: Option<u32>,
    pub new_leases_per_window: Option<u32>,
    pub new_lease_window_secs: Option<u32>,
}

/// `[[dhcp6.subnets]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Subnet6File {
    pub network: String,
    /// `"start-end"` ranges inside the network.
    pub pools: Vec<String>,
    pub dns: Vec<String>,
    pub domain: Option<String>,
    pub preferred_lifetime: Option<u32>,
    pub valid_lifetime: Option<u32>,
}

/// `[[dhcp6.reservations]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Reservation6File {
    pub mac: String,
    pub ip: String,
}

#[derive(Clone, Debug)]
pub struct Dhcp6Config {
    pub interfaces: Vec<String>,
    pub port: u16,
    pub public_url: Option<String>,
    /// `None`: no router advertisements.
    pub ra: Option<RaConfig>,
    pub subnets: Vec<Subnet6>,
    pub reservations: Vec<Reservation6>,
    pub deny_macs: std::collections::BTreeSet<MacAddr>,
    pub rate_limits: paddock_dhcp::RateLimits,
    pub relays: paddock_dhcp::Relays,
}

/// Router advertisements.
#[derive(Clone, Copy, Debug)]
pub struct RaConfig {
    pub every: std::time::Duration,
    pub router_lifetime: u16,
}

/// Validates `[dhcp6]`, naming each problem; `None` when it is off.
pub fn validate(f: &Dhcp6File, p: &mut Vec<String>) -> Option<Dhcp6Config> {
    if !f.enabled.unwrap_or(false) {
        return None;
    }
    if f.interfaces.is_empty() {
        p.push("dhcp6.interfaces: name at least one interface to serve".into());
    }
    if f.subnets.is_empty() {
        p.push("dhcp6.subnets: define at least one subnet".into());
    }
    let mut subnets = Vec::new();
    for (i, s) in f.subnets.iter().enumerate() {
        let at = format!("dhcp6.subnets[{i}]");
        let Some(network) = parse::<Ipv6Net>(p, &format!("{at}.network"), &s.network) else {
            continue;
        };
        let pools = ranges(
            p,
            &format!("{at}.pools"),
            &s.pools,
            "2001:db8::100-2001:db8::1ff",
        )
        .into_iter()
        .map(|(start, end)| Pool6 { start, end })
        .collect();
        let dns = parse_each::<Ipv6Addr>(p, &format!("{at}.dns"), &s.dns);
        let subnet = Subnet6 {
            network: network.trunc(),
            pools,
            dns,
            domain: s.domain.clone(),
            preferred_lifetime: s.preferred_lifetime.unwrap_or(PREFERRED_LIFETIME),
            valid_lifetime: s.valid_lifetime.unwrap_or(VALID_LIFETIME),
        };
        match subnet.validate() {
            Ok(()) => subnets.push(subnet),
            Err(e) => p.push(format!("{at}: {e}")),
        }
    }
    let reservations: Vec<Reservation6> = f
        .reservations
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let at = format!("dhcp6.reservations[{i}]");
            Some(Reservation6 {
                mac: parse::<MacAddr>(p, &format!("{at}.mac"), &r.mac)?,
                ip: parse(p, &format!("{at}.ip"), &r.ip)?,
            })
        })
        .collect();
    if let Err(e) = Leases6::new(subnets.clone(), reservations.clone()) {
        p.push(format!("dhcp6: {e}"));
    }
    let every = f.ra_interval_secs.unwrap_or(RA_INTERVAL_SECS);
    if !(4..=1800).contains(&every) {
        p.push(format!(
            "dhcp6.ra_interval_secs: {every} is outside 4..=1800 (RFC 4861's MaxRtrAdvInterval)"
        ));
    }
    // Boot file URLs (option 59) are made from it: one without a scheme boots nothing.
    if let Some(u) = &f.public_url
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        p.push(format!(
            "dhcp6.public_url: {u:?} must start with http:// or https://"
        ));
    }
    let relays = crate::dhcp::relays::<Ipv6Addr>("dhcp6.relays", f.relays.as_deref(), p);
    let deny_macs = parse_each::<MacAddr>(p, "dhcp6.deny_macs", &f.deny_macs)
        .into_iter()
        .collect();
    let rate_limits = crate::dhcp::rate_limits(
        "dhcp6",
        [
            f.per_client_burst,
            f.per_client_per_sec,
            f.max_tracked_clients,
            f.new_leases_per_window,
            f.new_lease_window_secs,
        ],
        p,
    );
    Some(Dhcp6Config {
        deny_macs,
        relays,
        rate_limits,
        interfaces: f.interfaces.clone(),
        port: f.port.unwrap_or(DHCP6_PORT),
        ra: f.router_advertisements.unwrap_or(true).then(|| RaConfig {
            every: std::time::Duration::from_secs(every),
            router_lifetime: f.router_lifetime.unwrap_or(0),
        }),
        public_url: f
            .public_url
            .as_ref()
            .map(|u| u.trim_end_matches('/').to_string()),
        subnets,
        reservations,
    })
}

/// Binds the listeners and runs the server (fatal, as DHCPv4: an
/// appliance that cannot answer must not look healthy).
pub async fn start(
    rt: &mut Runtime,
    d: &Dhcp6Config,
    s: crate::dhcp::Start<'_>,
) -> anyhow::Result<Arc<Dhcp6Service>> {
    let store = rt.context().store.clone();
    // As DHCPv4's: several hosts share the lease records, and a new leader knows the leases
    // it loaded at its start, so each host hands out addresses from pools of its own.
    if let Some(host) = s.cluster_host {
        let mine: Vec<(Ipv6Addr, Ipv6Addr)> = d
            .subnets
            .iter()
            .flat_map(|s| s.pools.iter())
            .map(|p| (p.start, p.end))
            .collect();
        crate::pool_claims::claim(&store, "pools6", host, &mine, |a| *a).await?;
    }
    let listeners = d
        .interfaces
        .iter()
        .map(|i| {
            let sys = |what: &str| {
                std::fs::read_to_string(format!("/sys/class/net/{i}/{what}"))
                    .with_context(|| format!("dhcp6: reading {what} of {i}"))
            };
            Ok(Listener6 {
                interface: i.clone(),
                index: sys("ifindex")?.trim().parse()?,
                mac: sys("address")?
                    .trim()
                    .parse()
                    .map_err(|e| anyhow::anyhow!("dhcp6: the MAC of {i}: {e}"))?,
                address: interface_address(i, d)?,
                port: d.port,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let first = listeners.first().context("dhcp6.interfaces is empty")?;
    let leases = Leases6::new(d.subnets.clone(), d.reservations.clone())?;
    let server = Server6::new(
        leases,
        Server6Config {
            duid: server_duid(first.mac),
            boot: d.public_url.as_ref().map(|u| Boot6 {
                table: s.boot.table.clone(),
                public_url: u.clone(),
            }),
        },
    )
    .with_limits(d.rate_limits);
    if let Some(ra) = d.ra {
        for l in &listeners {
            advertise(rt, l, d, ra);
        }
    }
    let observer = Arc::new(crate::dhcp::TimelineObserver::start(rt, s.inspector));
    let service =
        Dhcp6Service::new(server, store, s.policy, Some(observer), d.relays.clone()).await?;
    let run = service.clone().run(listeners);
    rt.spawn_future("dhcp6", async move { run.await.context("DHCPv6 server") });
    Ok(service)
}

/// Sends router advertisements on a listener's link for the subnets that hold its address
/// (a failure to open the raw socket stops the appliance, as DHCPv6's own would).
fn advertise(rt: &mut Runtime, l: &Listener6, d: &Dhcp6Config, ra: RaConfig) {
    let on_link: Vec<&Subnet6> = d
        .subnets
        .iter()
        .filter(|s| s.network.contains(&l.address))
        .collect();
    let advert = paddock_dhcp::v6::ra::Advert {
        prefixes: on_link.iter().map(|s| s.network).collect(),
        router_lifetime: ra.router_lifetime,
        valid_lifetime: on_link
            .iter()
            .map(|s| s.valid_lifetime)
            .max()
            .unwrap_or(VALID_LIFETIME),
        preferred_lifetime: on_link
            .iter()
            .map(|s| s.preferred_lifetime)
            .max()
            .unwrap_or(PREFERRED_LIFETIME),
        autonomous: false,
        mac: l.mac,
    };
    let run = paddock_dhcp::v6::ra::run(l.interface.clone(), l.index, advert, ra.every);
    rt.spawn_future("router advertisements", async move {
        run.await.context("router advertisements")
    });
}

/// The server's DUID: DUID-LL (type 3, Ethernet) of its first interface, the same after
/// every restart, so clients that renew find the server they bound with.
fn server_duid(mac: MacAddr) -> Vec<u8> {
    let mut duid = vec![0, 3, 0, 1];
    duid.extend(mac.0);
    duid
}

/// The interface's address in one of the subnets: it names the link's subnet.
fn interface_address(interface: &str, d: &Dhcp6Config) -> anyhow::Result<Ipv6Addr> {
    nix::ifaddrs::getifaddrs()
        .context("listing interface addresses")?
        .filter(|a| a.interface_name == interface)
        .filter_map(|a| a.address?.as_sockaddr_in6().map(|s| s.ip()))
        .find(|ip| d.subnets.iter().any(|s| s.network.contains(ip)))
        .with_context(|| {
            format!("interface {interface} has no IPv6 address in a dhcp6 subnet; add one or remove it from dhcp6.interfaces")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_validated_with_every_problem_named() {
        let good: Dhcp6File = toml::from_str(
            r#"
enabled = true
interfaces = ["br0"]
public_url = "http://[2001:db8:1::1]:8080/"
[[subnets]]
network = "2001:db8:1::/64"
pools = ["2001:db8:1::100-2001:db8:1::1ff"]
dns = ["2001:db8:1::1"]
[[reservations]]
mac = "52:54:00:00:00:01"
ip = "2001:db8:1::10"
"#,
        )
        .unwrap();
        let mut p = Vec::new();
        let c = validate(&good, &mut p).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.port, 547);
        assert_eq!(c.public_url.as_deref(), Some("http://[2001:db8:1::1]:8080"));
        assert_eq!(c.subnets[0].valid_lifetime, VALID_LIFETIME);
        assert_eq!(c.reservations.len(), 1);
        let bad: Dhcp6File = toml::from_str(
            r#"
enabled = true
[[subnets]]
network = "2001:db8:1::/64"
pools = ["2001:db8:2::1-2001:db8:2::9", "nonsense"]
dns = ["10.0.0.1"]
preferred_lifetime = 9000
[[reservations]]
mac = "nope"
ip = "2001:db8:1::10"
"#,
        )
        .unwrap();
        let mut p = Vec::new();
        validate(&bad, &mut p);
        let text = p.join("\n");
        for needle in [
            "dhcp6.interfaces",
            "dhcp6.subnets[0].pools[1]: \"nonsense\" is not a range like",
            "dhcp6.subnets[0].dns[0]",
            "dhcp6.subnets[0]: subnet 2001:db8:1::/64: the preferred lifetime",
            "dhcp6.reservations[0].mac",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        let off = Dhcp6File::default();
        assert!(validate(&off, &mut Vec::new()).is_none());
    }
}
