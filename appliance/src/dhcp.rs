//! The DHCP server's shell in the appliance: its configuration section, the listeners on
//! the configured interfaces, disjoint pools across hosts, and the timeline entries it files.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context;
use ipnet::Ipv4Net;
use paddock_dhcp::shell::{Answered, DhcpObserver, DhcpService, Listener};
use paddock_dhcp::{BootPolicy, Leases, Pool, Relays, Reservation, Server, ServerConfig, Subnet};
use paddock_inspector::service::{DhcpAnswer, DhcpReply, Inspector};
use paddock_inventory::MacAddr;
use paddock_store::Store;
use paddock_wire::unix_ms as now_ms;
use serde::Deserialize;

use crate::runtime::Runtime;
use crate::setting::{parse, parse_each, ranges};

/// `[dhcp]` is on unless turned off.
pub const ENABLED: bool = true;
pub const PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
pub const RELAY_PORT: u16 = 67;
/// Seconds.
pub const LEASE_TIME: u32 = 3600;

/// `[dhcp]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DhcpFile {
    pub enabled: Option<bool>,
    pub interfaces: Vec<String>,
    pub port: Option<u16>,
    pub client_port: Option<u16>,
    pub relay_port: Option<u16>,
    pub deny_macs: Vec<String>,
    /// The relays' own addresses: a request with `giaddr` set from any other source is
    /// dropped. Unset: relayed requests from anyone; empty: from no one.
    pub relays: Option<Vec<String>>,
    pub subnets: Vec<SubnetFile>,
    pub reservations: Vec<ReservationFile>,
    /// Requests one client (by MAC) may send at once; 0 turns the per-client limit off
    /// (default: `paddock_dhcp::RateLimits::default()`, 20).
    pub per_client_burst: Option<u32>,
    /// Requests per second a client's budget refills by (default 2).
    pub per_client_per_sec: Option<u32>,
    /// Clients whose budget is remembered (default 10,000).
    pub max_tracked_clients: Option<u32>,
    /// Addresses newly handed out on each subnet, across all clients, per window; 0: no cap
    /// (default 1,024).
    pub new_leases_per_window: Option<u32>,
    /// That window, in seconds (default 60).
    pub new_lease_window_secs: Option<u32>,
}

/// `[[dhcp.subnets]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubnetFile {
    pub network: String,
    pub pools: Vec<String>,
    pub exclude: Vec<String>,
    pub routers: Vec<String>,
    pub dns: Vec<String>,
    pub domain: Option<String>,
    pub lease_time: Option<u32>,
}

/// `[[dhcp.reservations]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationFile {
    pub mac: String,
    pub ip: String,
    pub hostname: Option<String>,
}

#[derive(Clone, Debug)]
pub struct DhcpConfig {
    pub interfaces: Vec<String>,
    pub port: u16,
    pub client_port: u16,
    pub relay_port: u16,
    pub deny_macs: BTreeSet<MacAddr>,
    pub subnets: Vec<Subnet>,
    pub reservations: Vec<Reservation>,
    /// Per-client and new-lease rate limits.
    pub rate_limits: paddock_dhcp::RateLimits,
    pub relays: Relays,
}

/// Validates `[dhcp]` (when enabled), naming each problem.
pub fn validate(f: DhcpFile, p: &mut Vec<String>) -> Option<DhcpConfig> {
    let before = p.len();
    if f.interfaces.is_empty() {
        p.push("dhcp.interfaces: name at least one interface to serve on (or set dhcp.enabled = false)".into());
    }
    if f.subnets.is_empty() {
        p.push("dhcp.subnets: configure at least one subnet (network and pools)".into());
    }
    let mut subnets = Vec::new();
    for (i, s) in f.subnets.iter().enumerate() {
        let at = format!("dhcp.subnets[{i}]");
        let Some(network) = parse::<Ipv4Net>(p, &format!("{at}.network"), &s.network) else {
            continue;
        };
        let pools = ranges(
            p,
            &format!("{at}.pools"),
            &s.pools,
            "198.18.0.100-198.18.0.199",
        )
        .into_iter()
        .map(|(start, end)| Pool { start, end })
        .collect();
        let ips = |p: &mut Vec<String>, what: &str, v: &[String]| -> Vec<Ipv4Addr> {
            parse_each(p, &format!("{at}.{what}"), v)
        };
        let subnet = Subnet {
            network: network.trunc(),
            pools,
            exclude: ips(p, "exclude", &s.exclude).into_iter().collect(),
            routers: ips(p, "routers", &s.routers),
            dns: ips(p, "dns", &s.dns),
            domain: s.domain.clone(),
            lease_time: s.lease_time.unwrap_or(LEASE_TIME),
        };
        if let Err(e) = subnet.validate() {
            p.push(format!("{at}: {e}"));
        }
        subnets.push(subnet);
    }
    let mut reservations = Vec::new();
    for (i, r) in f.reservations.iter().enumerate() {
        let at = format!("dhcp.reservations[{i}]");
        let mac = parse::<MacAddr>(p, &format!("{at}.mac"), &r.mac);
        let ip = parse::<Ipv4Addr>(p, &format!("{at}.ip"), &r.ip);
        // Sent to the machine as its host name (option 12): one DNS label.
        let hostname = r.hostname.as_deref().and_then(|h| {
            paddock_dns::name::label(h)
                .map_err(|e| p.push(format!("{at}.hostname: {e}")))
                .ok()
        });
        if let (Some(mac), Some(ip)) = (mac, ip) {
            reservations.push(Reservation { mac, ip, hostname });
        }
    }
    let relays = relays::<Ipv4Addr>("dhcp.relays", f.relays.as_deref(), p);
    let deny_macs = parse_each(p, "dhcp.deny_macs", &f.deny_macs)
        .into_iter()
        .collect();
    if p.len() == before
        && let Err(e) = paddock_dhcp::Leases::new(subnets.clone(), reservations.clone())
    {
        p.push(format!("dhcp: {e}"));
    }
    let rate_limits = rate_limits(
        "dhcp",
        [
            f.per_client_burst,
            f.per_client_per_sec,
            f.max_tracked_clients,
            f.new_leases_per_window,
            f.new_lease_window_secs,
        ],
        p,
    );
    if p.len() > before {
        return None;
    }
    Some(DhcpConfig {
        rate_limits,
        interfaces: f.interfaces,
        port: f.port.unwrap_or(PORT),
        client_port: f.client_port.unwrap_or(CLIENT_PORT),
        relay_port: f.relay_port.unwrap_or(RELAY_PORT),
        deny_macs,
        relays,
        subnets,
        reservations,
    })
}

/// The rate limits `[dhcp]` and `[dhcp6]` share (same keys, same defaults), in the order
/// [`paddock_dhcp::RateLimits::defaulted`] takes them: defaulted, and a problem named after
/// `section` when they do not hold together.
pub fn rate_limits(
    section: &str,
    keys: [Option<u32>; 5],
    p: &mut Vec<String>,
) -> paddock_dhcp::RateLimits {
    let limits = paddock_dhcp::RateLimits::defaulted(keys);
    if let Err(e) = limits.validate() {
        p.push(format!("{section}: {e}"));
    }
    limits
}

/// `relays` as written, for either family: unset, relayed requests from any source; listed
/// (each parsed as `A`), only from those.
pub fn relays<A>(what: &str, listed: Option<&[String]>, p: &mut Vec<String>) -> Relays
where
    A: FromStr + Into<IpAddr>,
    A::Err: std::fmt::Display,
{
    match listed {
        None => Relays::Any,
        Some(listed) => parse_each::<A>(p, what, listed).into_iter().collect(),
    }
}

/// What the DHCP services (both families) are started with besides their sections.
pub struct Start<'a> {
    pub boot: &'a BootPolicy,
    /// `Some(host)` when several hosts share the lease records.
    pub cluster_host: Option<&'a str>,
    pub policy: Arc<dyn paddock_dhcp::ClientPolicy>,
    pub inspector: Arc<Inspector>,
}

/// Binds the listeners and runs the server (fatal: an appliance that cannot answer DHCP
/// must not look healthy).
pub async fn start(
    rt: &mut Runtime,
    d: &DhcpConfig,
    s: Start<'_>,
) -> anyhow::Result<Arc<DhcpService>> {
    let store = rt.context().store.clone();
    if let Some(host) = s.cluster_host {
        claim_pools(&store, host, d).await?;
    }
    let listeners = d
        .interfaces
        .iter()
        .map(|i| {
            Ok(Listener {
                interface: i.clone(),
                address: interface_address(i, d)?,
                port: d.port,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let leases = Leases::new(d.subnets.clone(), d.reservations.clone())?;
    let server = Server::new(
        leases,
        ServerConfig {
            boot: s.boot.clone(),
            client_port: d.client_port,
            relay_port: d.relay_port,
        },
    )
    .with_limits(d.rate_limits);
    let observer = Arc::new(TimelineObserver::start(rt, s.inspector));
    let service =
        DhcpService::new(server, store, s.policy, Some(observer), d.relays.clone()).await?;
    let run = service.clone().run(listeners);
    rt.spawn_future("dhcp", async move { run.await.context("DHCP server") });
    Ok(service)
}

/// Files "PXE client answered" entries in the machine's timeline, off the packet path: the
/// answers go, in order, to one task that files whatever has queued up in one write
/// (renewals counted, see `Inspector::dhcp_answered`).
pub(crate) struct TimelineObserver(tokio::sync::mpsc::Sender<DhcpAnswer>);

/// Answers waiting to be filed; past this (a store that stopped answering) they are dropped.
const TIMELINE_QUEUE: usize = 65_536;
/// Answers filed per write.
const TIMELINE_BATCH: usize = 256;

impl TimelineObserver {
    pub(crate) fn start(rt: &mut Runtime, inspector: Arc<Inspector>) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel(TIMELINE_QUEUE);
        rt.spawn_future("dhcp timeline", async move {
            let mut batch = Vec::with_capacity(TIMELINE_BATCH);
            while rx.recv_many(&mut batch, TIMELINE_BATCH).await > 0 {
                if let Err(e) = inspector.dhcp_answered(&batch).await {
                    tracing::warn!(answers = batch.len(), error = %e, "dhcp: timeline entries not recorded");
                }
                batch.clear();
            }
            // Every sender is gone: the DHCP server stopped, which stops the appliance.
            std::future::pending().await
        });
        TimelineObserver(tx)
    }
}

impl DhcpObserver for TimelineObserver {
    fn pxe_answered(&self, mac: MacAddr, reply: Answered, ip: IpAddr, boot: &str) {
        let reply = match reply {
            Answered::Offer => DhcpReply::Offer,
            Answered::Ack => DhcpReply::Ack,
            Answered::Nak => DhcpReply::Nak,
            Answered::Advertise => DhcpReply::Advertise,
            Answered::Reply => DhcpReply::Reply,
        };
        let answer = DhcpAnswer {
            mac,
            reply,
            ip,
            boot: boot.to_string(),
            at_ms: now_ms(),
        };
        if let Err(e) = self.0.try_send(answer) {
            tracing::warn!(%mac, error = %e, "dhcp: timeline entry not recorded");
        }
    }
}

/// The IPv4 address that identifies this server on `interface`: the first one inside a
/// configured subnet, else the first one.
fn interface_address(interface: &str, cfg: &DhcpConfig) -> anyhow::Result<Ipv4Addr> {
    let addrs: Vec<Ipv4Addr> = nix::ifaddrs::getifaddrs()
        .context("listing interface addresses")?
        .filter(|a| a.interface_name == interface)
        .filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
        .collect();
    addrs
        .iter()
        .find(|ip| cfg.subnets.iter().any(|s| s.network.contains(*ip)))
        .or(addrs.first())
        .copied()
        .with_context(|| format!("interface {interface} has no IPv4 address; add one or remove it from dhcp.interfaces"))
}

/// Several hosts share the lease records, so their DHCP pools must not overlap: each host
/// records its pools under `cluster/pools/<host>` (as numbers, the form older releases
/// wrote) and refuses to start when another host's pools overlap its own.
async fn claim_pools(store: &Arc<dyn Store>, host: &str, d: &DhcpConfig) -> anyhow::Result<()> {
    let mine: Vec<(u32, u32)> = d
        .subnets
        .iter()
        .flat_map(|s| s.pools.iter())
        .map(|p| (u32::from(p.start), u32::from(p.end)))
        .collect();
    crate::pool_claims::claim(store, "pools", host, &mine, |a| Ipv4Addr::from(*a)).await
}
