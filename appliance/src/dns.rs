//! Service-discovery DNS: the shell around `paddock_dns`. Every appliance host (leader or
//! not) serves the same zones from its own copy of the store: the machines (enrolled nodes,
//! their addresses from their DHCP leases, else their DHCP reservations), the role instances of the census and their
//! self-reported status, damped by the membership hysteresis, and the ports the applied
//! role spec declares (`dns = { ports = [...] }`) as SRV records.
//!
//! The zones are rebuilt whenever nodes, leases, census entries or the spec change (watched, not
//! polled; changes within [`DEBOUNCE`] are taken together), when a pending self-removal
//! falls due, and every [`SWEEP`] so that expired leases leave. The server answers from the
//! newest build, swapped in whole.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use ipnet::{IpNet, Ipv4Net};
use paddock_clock::UnixMs;
use paddock_dhcp::{Lease, LeaseState, MacAddr};
use paddock_dns::rrl::RateLimit;
use paddock_dns::server::{Limits, PeerBoard, Server};
use paddock_dns::wire::TransferAcl;
use paddock_dns::{
    Inputs, Machine, Member, Membership, Policy, Report, ServicePort, ZoneConfig, Zones,
};
use paddock_inspector::node::Node;
use paddock_store::Store;
use paddock_wire::ApiError;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::census::{INSTANCES, InstanceEntry, node_hostname};
use crate::runtime::{Context, Runtime};

/// `[dns] zone`'s default.
pub const DNS_ZONE: &str = "paddock.internal";
/// `[dns] ttl_secs`'s default: names follow live state, so caches must not hold them long.
pub const DNS_TTL_SECS: u32 = 30;
/// `[dns] port`'s default.
pub const DNS_PORT: u16 = 53;
/// Changes this close together are built into one zone.
const DEBOUNCE: Duration = Duration::from_millis(20);
/// The longest the zones go unrebuilt: leases expire without a store event.
const SWEEP: Duration = Duration::from_secs(30);

/// `[dns]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsFile {
    /// Serve DNS (default: off).
    pub enabled: Option<bool>,
    /// Addresses to answer on, UDP and TCP (default: the HTTP listener's address).
    pub listen: Vec<IpAddr>,
    /// The port on each ([`DNS_PORT`]).
    pub port: Option<u16>,
    /// The forward zone ([`DNS_ZONE`]).
    pub zone: Option<String>,
    /// Every record's TTL and the negative-answer TTL ([`DNS_TTL_SECS`]).
    pub ttl_secs: Option<u32>,
    /// Networks (CIDR) whose addresses may transfer the zones (AXFR, IXFR); none by default.
    pub allow_transfer: Vec<String>,
    /// Secondaries (`IP` or `IP:port`, port 53 by default) told of every new serial
    /// (NOTIFY); each may transfer the zones too.
    pub secondaries: Vec<String>,
    /// Subnets whose reverse zones are served (default: the DHCP subnets).
    pub reverse: Option<Vec<String>>,
    /// Answers per second to one source netblock (/24, /56) over UDP; 0: no limit (1000).
    pub responses_per_second: Option<u32>,
    /// Every N-th question over that rate gets an empty answer with TC (2; 0: none).
    pub rate_limit_slip: Option<u32>,
    /// The window of the self-removal limit, seconds (60).
    pub self_removal_window_secs: Option<u64>,
    /// How long the last member in service stays after it reports down, seconds (600).
    pub last_member_delay_secs: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// A machine's address where it holds no live lease: its DHCP reservation.
    pub reservations: BTreeMap<MacAddr, Ipv4Addr>,
    pub listen: Vec<SocketAddr>,
    pub zone: ZoneConfig,
    pub limits: Limits,
    pub policy: Policy,
}

/// What `[dns]` takes from the DHCP server's configuration.
#[derive(Debug, Default)]
pub struct FromDhcp {
    /// Their reverse zones are served unless `[dns] reverse` says otherwise.
    pub subnets: Vec<Ipv4Net>,
    pub reservations: Vec<paddock_dhcp::Reservation>,
}

/// `[dns]` → the server's settings (`None`: off). `http_ip` stands in for an unset listen
/// list and for the name server's address.
pub fn validate(
    f: &DnsFile,
    http_ip: Option<IpAddr>,
    dhcp: &FromDhcp,
    p: &mut Vec<String>,
) -> Option<DnsConfig> {
    let dhcp_subnets = &dhcp.subnets;
    if !f.enabled.unwrap_or(false) {
        return None;
    }
    let port = f.port.unwrap_or(DNS_PORT);
    let ips: Vec<IpAddr> = if f.listen.is_empty() {
        http_ip.into_iter().collect()
    } else {
        f.listen.clone()
    };
    let origin = match paddock_dns::name::absolute(f.zone.as_deref().unwrap_or(DNS_ZONE)) {
        Ok(o) => o,
        Err(e) => {
            p.push(format!("dns.zone: {e}"));
            return None;
        }
    };
    // The name server's address: the first IPv4 one answered on, else the HTTP listener's.
    let ns = ips
        .iter()
        .chain(http_ip.iter())
        .find_map(|ip| match ip {
            IpAddr::V4(v4) if !v4.is_unspecified() => Some(*v4),
            _ => None,
        })
        .unwrap_or(Ipv4Addr::LOCALHOST);
    let ttl = f.ttl_secs.unwrap_or(DNS_TTL_SECS);
    if !(1..=86_400).contains(&ttl) {
        p.push(format!("dns.ttl_secs: {ttl} must be 1 to 86400"));
    }
    let mut allow_transfer: Vec<IpNet> = parse_all("dns.allow_transfer", &f.allow_transfer, p);
    let secondaries: Vec<SocketAddr> = f
        .secondaries
        .iter()
        .filter_map(|t| {
            let parsed = t
                .parse::<SocketAddr>()
                .or_else(|_| t.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, DNS_PORT)));
            match parsed {
                Ok(a) => Some(a),
                Err(_) => {
                    p.push(format!("dns.secondaries: {t:?} is neither IP nor IP:port"));
                    None
                }
            }
        })
        .collect();
    allow_transfer.extend(secondaries.iter().map(|s| IpNet::from(s.ip())));
    let reverse = match &f.reverse {
        None => dhcp_subnets.to_vec(),
        Some(list) => parse_all("dns.reverse", list, p),
    };
    let mut secs = |name: &str, v: Option<u64>, default: u64| {
        let v = v.unwrap_or(default);
        if !(1..=86_400).contains(&v) {
            p.push(format!("dns.{name}: {v} must be 1 to 86400"));
        }
        Duration::from_secs(v)
    };
    let policy = Policy {
        window: secs("self_removal_window_secs", f.self_removal_window_secs, 60),
        last_member_delay: secs("last_member_delay_secs", f.last_member_delay_secs, 600),
    };
    Some(DnsConfig {
        reservations: dhcp.reservations.iter().map(|r| (r.mac, r.ip)).collect(),
        listen: ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect(),
        zone: ZoneConfig {
            hostmaster: format!("hostmaster.{origin}"),
            origin,
            ttl,
            name_servers: vec![("ns1".into(), ns)],
            reverse,
        },
        limits: Limits {
            transfer_acl: TransferAcl(allow_transfer),
            secondaries,
            rate: RateLimit {
                per_second: f
                    .responses_per_second
                    .unwrap_or(RateLimit::default().per_second),
                slip: f.rate_limit_slip.unwrap_or(RateLimit::default().slip),
            },
            ..Limits::default()
        },
        policy,
    })
}

/// Each of `texts` parsed; a problem for each that does not parse.
fn parse_all<T: std::str::FromStr>(field: &str, texts: &[String], p: &mut Vec<String>) -> Vec<T>
where
    T::Err: std::fmt::Display,
{
    texts
        .iter()
        .filter_map(|t| match t.parse() {
            Ok(v) => Some(v),
            Err(e) => {
                p.push(format!("{field}: {t:?}: {e}"));
                None
            }
        })
        .collect()
}

/// What the API reads of a running DNS server: its zones and its secondaries.
#[derive(Clone)]
pub struct DnsHandle {
    zones: watch::Receiver<Arc<Zones>>,
    peers: PeerBoard,
    stats: Arc<paddock_dns::stats::Stats>,
}

/// With `[dns]` on: binds the listeners (a taken port stops `paddock serve` at start) and
/// runs the server and the loop that keeps its zones.
pub async fn start(rt: &mut Runtime, cfg: Option<&DnsConfig>) -> anyhow::Result<Option<DnsHandle>> {
    let Some(cfg) = cfg.cloned() else {
        return Ok(None);
    };
    let server = Server::bind(&cfg.listen).await?;
    tracing::info!(listen = ?server.local_addrs(), zone = %cfg.zone.origin, "dns: serving");
    let empty = Zones::build(&cfg.zone, &Inputs::default());
    let (tx, rx) = watch::channel(Arc::new(empty));
    let handle = DnsHandle {
        zones: rx.clone(),
        peers: server.peers(),
        stats: server.stats(),
    };
    let limits = cfg.limits.clone();
    rt.spawn_once("dns", move |ctx| async move {
        Ok(server.run(rx, limits, ctx.cancel).await?)
    });
    let cfg = Arc::new(cfg);
    rt.spawn("dns zones", crate::runtime::Policy::Restart, move |ctx| {
        keep_zones(ctx, cfg.clone(), tx.clone())
    });
    Ok(Some(handle))
}

impl DnsHandle {
    /// The names a machine or instance has now (every owner name of a record that names
    /// one of `subjects`: its name, its UUID name, its PTR), sorted.
    pub fn names(&self, subjects: &[&str]) -> Vec<String> {
        let zones = self.zones.borrow().clone();
        let own: Vec<String> = subjects
            .iter()
            .map(|s| format!("{}.", s.to_ascii_lowercase()))
            .collect();
        // Its own names and the PTRs to them; not the services it is a member of.
        let mut names: Vec<String> = subjects
            .iter()
            .flat_map(|s| zones.names_of(s))
            .filter(|r| {
                matches!(r.data, paddock_dns::RData::Ptr(_))
                    || own.iter().any(|o| r.name.starts_with(o.as_str()))
            })
            .map(|r| r.name)
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct Label {
    kind: &'static str,
}

/// `text` (OpenMetrics, ending in `# EOF`) with the DNS server's counters added:
/// `paddock_dns_questions_total{kind=<type>}`, `paddock_dns_answers_total{kind=<code or
/// dropped>}`, `paddock_dns_rate_limited_total{kind=slipped|dropped}`,
/// `paddock_dns_transfers_total{kind=full|incremental}`, and each zone's serial
/// `paddock_dns_serial{kind=<zone>}`.
pub fn add_metrics(text: String, dns: Option<&DnsHandle>) -> String {
    use paddock_dns::stats::{CODES, TYPES};
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use std::sync::atomic::Ordering::Relaxed;
    let Some(dns) = dns else {
        return text;
    };
    let st = &dns.stats;
    let mut registry = prometheus_client::registry::Registry::default();
    let family = |registry: &mut prometheus_client::registry::Registry, name, help| {
        let f = Family::<Label, Counter>::default();
        registry.register(name, help, f.clone());
        f
    };
    let questions = family(
        &mut registry,
        "paddock_dns_questions",
        "DNS questions by type",
    );
    let answers = family(&mut registry, "paddock_dns_answers", "DNS answers by code");
    let limited = family(
        &mut registry,
        "paddock_dns_rate_limited",
        "UDP questions over the rate limit: answered empty with TC, or not at all",
    );
    let transfers = family(
        &mut registry,
        "paddock_dns_transfers",
        "Zone transfers sent",
    );
    let counts = TYPES
        .iter()
        .zip(&st.questions)
        .map(|((kind, _), n)| (&questions, *kind, n))
        .chain(
            CODES
                .iter()
                .zip(&st.answers)
                .map(|(kind, n)| (&answers, *kind, n)),
        )
        .chain([
            (&limited, "slipped", &st.slipped),
            (&limited, "dropped", &st.limited),
            (&transfers, "full", &st.transfers_full),
            (&transfers, "incremental", &st.transfers_incremental),
        ]);
    for (f, kind, n) in counts {
        f.get_or_create(&Label { kind }).inc_by(n.load(Relaxed));
    }
    let serials = Family::<SerialLabel, Gauge>::default();
    registry.register(
        "paddock_dns_serial",
        "Each zone's SOA serial",
        serials.clone(),
    );
    for z in &dns.zones.borrow().zones {
        serials
            .get_or_create(&SerialLabel {
                zone: z.apex.clone(),
            })
            .set(i64::from(z.serial));
    }
    crate::metrics::append(text, &registry)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct SerialLabel {
    zone: String,
}

/// One record as the API shows it: zone-file fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordView {
    pub name: String,
    pub ttl: u32,
    #[serde(rename = "type")]
    pub rtype: String,
    pub data: String,
}

impl From<&paddock_dns::Record> for RecordView {
    fn from(r: &paddock_dns::Record) -> Self {
        RecordView {
            name: r.name.clone(),
            ttl: r.ttl,
            rtype: r.data.rtype().to_string(),
            data: r.data.to_string(),
        }
    }
}

/// `GET /api/v1/dns/zone`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZonesView {
    pub zones: Vec<ZoneView>,
    /// Machines and instances left out, and why.
    pub skipped: Vec<SkippedView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneView {
    pub apex: String,
    pub serial: u32,
    pub records: Vec<RecordView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedView {
    pub what: String,
    pub why: String,
}

/// `GET /api/v1/dns/peers`: one secondary's standing with one zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    pub peer: String,
    pub zone: String,
    /// The serial it is being (or was last) told of.
    pub announcing: Option<u32>,
    pub acknowledged: Option<u32>,
    /// The serial its last transfer brought it to, and when (Unix ms).
    pub transferred: Option<u32>,
    pub transferred_ms: Option<i64>,
    /// NOTIFYs sent for `announcing` without an answer.
    pub attempts: u32,
    pub given_up: bool,
}

/// `GET /api/v1/dns/names/{subject}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamesView {
    pub subject: String,
    pub records: Vec<RecordView>,
}

/// The routes; with DNS off each answers 404 saying so.
pub fn router(dns: Option<DnsHandle>) -> Router {
    Router::new()
        .route("/api/v1/dns/zone", get(zone))
        .route("/api/v1/dns/names/{subject}", get(names))
        .route("/api/v1/dns/peers", get(peers))
        .with_state(dns)
}

fn on(dns: Option<DnsHandle>) -> Result<DnsHandle, ApiError> {
    dns.ok_or_else(|| ApiError::not_found("DNS is off: set [dns] enabled = true"))
}

async fn zone(State(dns): State<Option<DnsHandle>>) -> Result<Json<ZonesView>, ApiError> {
    let zones = on(dns)?.zones.borrow().clone();
    Ok(Json(ZonesView {
        zones: zones
            .zones
            .iter()
            .map(|z| ZoneView {
                apex: z.apex.clone(),
                serial: z.serial,
                records: z.records().map(|r| RecordView::from(&r)).collect(),
            })
            .collect(),
        skipped: zones
            .skipped
            .iter()
            .map(|s| SkippedView {
                what: s.what.clone(),
                why: s.why.clone(),
            })
            .collect(),
    }))
}

async fn names(
    State(dns): State<Option<DnsHandle>>,
    Path(subject): Path<String>,
) -> Result<Json<NamesView>, ApiError> {
    let zones = on(dns)?.zones.borrow().clone();
    let records: Vec<RecordView> = zones
        .names_of(&subject)
        .iter()
        .map(RecordView::from)
        .collect();
    if records.is_empty() {
        return Err(ApiError::not_found(format!(
            "no name in the zones for {subject:?} (a machine's name or UUID, or an instance's name)"
        )));
    }
    Ok(Json(NamesView { subject, records }))
}

async fn peers(State(dns): State<Option<DnsHandle>>) -> Result<Json<Vec<PeerView>>, ApiError> {
    let board = on(dns)?.peers;
    let peers = board.lock().map(|b| b.clone()).unwrap_or_default();
    Ok(Json(
        peers
            .iter()
            .map(|p| PeerView {
                peer: p.peer.to_string(),
                zone: p.apex.clone(),
                announcing: p.announcing,
                acknowledged: p.acknowledged,
                transferred: p.transferred.map(|t| t.0),
                transferred_ms: p.transferred.map(|t| t.1.0),
                attempts: p.attempts,
                given_up: p.given_up,
            })
            .collect(),
    ))
}

/// Rebuilds the zones on every change until cancelled.
async fn keep_zones(
    ctx: Context,
    cfg: Arc<DnsConfig>,
    tx: watch::Sender<Arc<Zones>>,
) -> anyhow::Result<()> {
    let store = ctx.store.clone();
    let prefixes = [
        paddock_inspector::service::records::NODES,
        paddock_dhcp::shell::LEASE_PREFIX,
        INSTANCES,
        crate::roles::SPEC_KEY,
    ];
    let mut watches = Vec::new();
    for p in prefixes {
        watches.push(store.watch(p, 0).await?);
    }
    let mut membership = Membership::default();
    loop {
        let now = paddock_clock::now();
        let (inputs, registrations) = gather(store.as_ref(), &cfg.reservations, now).await?;
        let due = membership.observe(
            now,
            registrations
                .iter()
                .map(|(role, instance, report)| (role.as_str(), instance.as_str(), *report)),
            &cfg.policy,
        );
        let mut zones = Zones::build(&cfg.zone, &with_membership(inputs, &membership));
        let before = tx.borrow().clone();
        zones.stamp(Some(&before), now);
        if zones != *before {
            let serials: Vec<u32> = zones.zones.iter().map(|z| z.serial).collect();
            tracing::debug!(
                ?serials,
                names = zones.zones[0].names(),
                "dns: zones rebuilt"
            );
            for s in zones.skipped.iter().filter(|s| !before.skipped.contains(s)) {
                tracing::warn!(what = %s.what, why = %s.why, "dns: left out of the zone");
            }
            tx.send_replace(Arc::new(zones));
        }
        let wait = due.map_or(SWEEP, |t| t.since(now).min(SWEEP));
        let woke = tokio::select! {
            () = tokio::time::sleep(wait) => true,
            ev = next_event(&mut watches) => ev,
            () = ctx.cancel.cancelled() => return Ok(()),
        };
        if !woke {
            anyhow::bail!("the store's watch ended");
        }
        tokio::time::sleep(DEBOUNCE).await;
        for w in &mut watches {
            while let Ok(Some(_)) = tokio::time::timeout(Duration::ZERO, w.next()).await {}
        }
    }
}

/// The next event of any of the watches; `false` once one has ended.
async fn next_event(watches: &mut [paddock_store::Watch]) -> bool {
    let nexts = watches.iter_mut().map(|w| Box::pin(w.next()));
    let (ev, _, _) = futures_util::future::select_all(nexts).await;
    matches!(ev, Some(Ok(_)))
}

/// The machines as DNS sees them, and the census's instances with their word on their
/// health.
async fn gather(
    store: &dyn Store,
    reservations: &BTreeMap<MacAddr, Ipv4Addr>,
    now: UnixMs,
) -> anyhow::Result<(Inputs, Vec<(String, String, Report)>)> {
    let mut leases: BTreeMap<MacAddr, Lease> = BTreeMap::new();
    let now_secs = u64::try_from(now.secs()).unwrap_or(0);
    for kv in store.range(paddock_dhcp::shell::LEASE_PREFIX).await? {
        let Ok(l) = serde_json::from_slice::<Lease>(&kv.value) else {
            continue;
        };
        if l.state != LeaseState::Bound || l.expires <= now_secs {
            continue;
        }
        // A MAC with several live leases (a moved machine): the one that lasts longest.
        if leases.get(&l.mac).is_none_or(|o| o.expires < l.expires) {
            leases.insert(l.mac, l);
        }
    }
    let mut inputs = Inputs::default();
    for kv in store
        .range(paddock_inspector::service::records::NODES)
        .await?
    {
        let Ok(node) = serde_json::from_slice::<Node>(&kv.value) else {
            continue;
        };
        let macs = || node.pxe_mac.iter().chain(node.macs.iter());
        let ipv4 = macs()
            .find_map(|m| leases.get(m).map(|l| l.ip))
            .or_else(|| macs().find_map(|m| reservations.get(m).copied()));
        inputs.machines.push(Machine {
            name: node_hostname(&node),
            uuid: node.uuid.to_string(),
            ipv4,
            ipv6: None,
        });
    }
    inputs.ports = ports(store).await?;
    let mut registrations = Vec::new();
    for kv in store.range(INSTANCES).await? {
        let Ok(e) = serde_json::from_slice::<InstanceEntry>(&kv.value) else {
            continue;
        };
        let report = if e.says_up() {
            Report::Up
        } else {
            Report::Down
        };
        registrations.push((e.role.clone(), e.instance.clone(), report));
        inputs.members.push(Member {
            role: e.role,
            instance: e.instance,
            host: e.host,
            in_service: false,
        });
    }
    Ok((inputs, registrations))
}

/// Role → the ports its service declares, from the applied spec (none without one; a spec
/// in the store was validated when applied, so one that no longer parses is logged and
/// declares nothing).
async fn ports(store: &dyn Store) -> anyhow::Result<BTreeMap<String, Vec<ServicePort>>> {
    let Some(kv) = store.get(crate::roles::SPEC_KEY).await? else {
        return Ok(BTreeMap::new());
    };
    let stored: crate::roles::StoredSpec = serde_json::from_slice(&kv.value)?;
    let spec = match paddock_roles::Spec::parse(&stored.file, &stored.text) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "dns: the applied spec does not parse; no SRV records");
            return Ok(BTreeMap::new());
        }
    };
    Ok(spec
        .roles
        .into_iter()
        .filter(|(_, r)| !r.dns_ports.is_empty())
        .map(|(name, r)| {
            let ports = r
                .dns_ports
                .iter()
                .map(|p| ServicePort {
                    port: p.port,
                    priority: p.priority,
                    weight: p.weight,
                })
                .collect();
            (name, ports)
        })
        .collect())
}

/// `inputs` with each member in or out of service as the membership decided.
fn with_membership(mut inputs: Inputs, membership: &Membership) -> Inputs {
    for m in &mut inputs.members {
        m.in_service = membership.in_service(&m.role, &m.instance);
    }
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(toml_text: &str) -> DnsFile {
        toml::from_str(toml_text).expect("parses")
    }

    #[test]
    fn dns_is_off_unless_enabled_and_defaults_follow_http_and_dhcp() {
        let http: Option<IpAddr> = Some("198.18.0.1".parse().unwrap());
        let subnets: Vec<Ipv4Net> = vec!["198.18.0.0/24".parse().unwrap()];
        let dhcp = FromDhcp {
            subnets: subnets.clone(),
            reservations: vec![paddock_dhcp::Reservation {
                mac: "52:54:00:00:00:07".parse().unwrap(),
                ip: Ipv4Addr::new(198, 18, 0, 7),
                hostname: None,
            }],
        };
        let mut p = Vec::new();
        assert!(validate(&file(""), http, &dhcp, &mut p).is_none());
        let c = validate(&file("enabled = true"), http, &dhcp, &mut p).unwrap();
        assert_eq!(c.reservations.len(), 1);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.listen, ["198.18.0.1:53".parse::<SocketAddr>().unwrap()]);
        assert_eq!(c.zone.origin, "paddock.internal.");
        assert_eq!(c.zone.reverse, subnets);
        assert_eq!(
            c.zone.name_servers,
            [("ns1".to_string(), Ipv4Addr::new(198, 18, 0, 1))]
        );
        assert!(
            c.limits.transfer_acl.0.is_empty(),
            "no transfers by default"
        );
        assert_eq!(c.policy, Policy::default());
    }

    #[test]
    fn every_bad_dns_setting_is_reported() {
        let mut p = Vec::new();
        let f = file(
            r#"enabled = true
zone = "a..b"
"#,
        );
        assert!(validate(&f, None, &FromDhcp::default(), &mut p).is_none());
        let f = file(
            r#"enabled = true
ttl_secs = 0
allow_transfer = ["nonsense", "198.18.0.0/24"]
secondaries = ["198.18.0.53", "198.18.0.54:5353", "ns2"]
reverse = ["198.18.0.0/33"]
self_removal_window_secs = 0
"#,
        );
        let c = validate(&f, None, &FromDhcp::default(), &mut p).unwrap();
        assert_eq!(
            c.limits.secondaries,
            [
                "198.18.0.53:53".parse::<SocketAddr>().unwrap(),
                "198.18.0.54:5353".parse().unwrap()
            ]
        );
        // The secondaries may transfer too.
        assert_eq!(c.limits.transfer_acl.0.len(), 3);
        let text = p.join("\n");
        for want in [
            "dns.zone",
            "dns.ttl_secs: 0",
            "dns.allow_transfer: \"nonsense\"",
            "dns.reverse: \"198.18.0.0/33\"",
            "dns.self_removal_window_secs: 0",
            "dns.secondaries: \"ns2\"",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
    }
}
