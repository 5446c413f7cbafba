//! Service-discovery DNS: the shell around `paddock_dns`. `[dns]`'s settings, the server's
//! start, its API routes and its metrics. The loop that keeps the zones (from the store,
//! in step across the appliance's hosts) is [`crate::dns_zones`].

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use ipnet::{IpNet, Ipv4Net};
use paddock_dhcp::MacAddr;
use paddock_dns::rrl::RateLimit;
use paddock_dns::server::{Limits, PeerBoard, Server};
use paddock_dns::wire::TransferAcl;
use paddock_dns::{Policy, ZoneConfig, Zones};
use paddock_wire::ApiError;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::runtime::Runtime;
use crate::setting::parse_each;

/// `[dns] zone`'s default.
pub const DNS_ZONE: &str = "paddock.internal";
/// `[dns] ttl_secs`'s default: names follow live state, so caches must not hold them long.
pub const DNS_TTL_SECS: u32 = 30;
/// `[dns] port`'s default.
pub const DNS_PORT: u16 = 53;

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
    /// The zone's name servers, `ns1`, `ns2`… in address order (default: this host and
    /// the other appliance hosts, every one of which answers the same zone).
    pub name_servers: Option<Vec<Ipv4Addr>>,
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

/// What `[dns]` takes from the rest of the configuration.
#[derive(Debug, Default)]
pub struct Site {
    /// The DHCP subnets: their reverse zones are served unless `[dns] reverse` says
    /// otherwise.
    pub subnets: Vec<Ipv4Net>,
    /// The DHCP reservations.
    pub reservations: Vec<paddock_dhcp::Reservation>,
    /// The other appliance hosts' addresses (from `[cluster] peers`): name servers too,
    /// unless `[dns] name_servers` says otherwise.
    pub peers: Vec<Ipv4Addr>,
}

/// `[dns]` → the server's settings (`None`: off). `http_ip` stands in for an unset listen
/// list and for the name server's address.
pub fn validate(
    f: &DnsFile,
    http_ip: Option<IpAddr>,
    dhcp: &Site,
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
    let mut name_servers = f.name_servers.clone().unwrap_or_else(|| {
        let mut all = dhcp.peers.clone();
        all.push(ns);
        all
    });
    name_servers.sort();
    name_servers.dedup();
    if name_servers.is_empty() {
        p.push("dns.name_servers: the zone needs at least one".into());
    }
    let ttl = f.ttl_secs.unwrap_or(DNS_TTL_SECS);
    if !(1..=86_400).contains(&ttl) {
        p.push(format!("dns.ttl_secs: {ttl} must be 1 to 86400"));
    }
    let mut allow_transfer: Vec<IpNet> = parse_each(p, "dns.allow_transfer", &f.allow_transfer);
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
        Some(list) => parse_each(p, "dns.reverse", list),
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
            name_servers: name_servers
                .into_iter()
                .enumerate()
                .map(|(i, ip)| (format!("ns{}", i + 1), ip))
                .collect(),
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
    // No zone at all until the first build (questions are refused for those few
    // milliseconds): a zone served before it is built would carry a serial of its own,
    // out of step with the other hosts'.
    let nothing_yet = Zones {
        zones: Vec::new(),
        skipped: Vec::new(),
    };
    let (tx, rx) = watch::channel(Arc::new(nothing_yet));
    let handle = DnsHandle {
        zones: rx.clone(),
        peers: server.peers(),
        stats: server.stats(),
    };
    let limits = cfg.limits.clone();
    rt.spawn_once("dns", move |ctx| async move {
        Ok(server.run(rx, limits, ctx.cancel).await?)
    });
    let sources = Arc::new(crate::dns_zones::Sources {
        zone: cfg.zone,
        policy: cfg.policy,
        reservations: cfg.reservations,
    });
    rt.spawn("dns zones", crate::runtime::Policy::Restart, move |ctx| {
        crate::dns_zones::keep_zones(ctx, sources.clone(), tx.clone())
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

/// A role's service as DNS serves it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceNames {
    /// Its names that hold records: `<role>.svc.<zone>`, and `_<role>._tcp.<zone>` when
    /// it declares ports.
    pub names: Vec<String>,
    /// Instances in its records.
    pub in_service: Vec<String>,
    /// Instances out of them (`verifying:<instance>`).
    pub verifying: Vec<String>,
}

impl DnsHandle {
    /// The forward zone's origin (none before the first build).
    fn origin(&self) -> Option<String> {
        self.zones.borrow().zones.first().map(|z| z.apex.clone())
    }

    /// An instance's own name (`<instance>.inst.<zone>`), if the zone holds it.
    pub fn instance_name(&self, instance: &str) -> Option<String> {
        let label = paddock_dns::name::label(instance).ok()?;
        let name = format!("{label}.inst.{}", self.origin()?);
        let zones = self.zones.borrow().clone();
        let held = matches!(
            zones.answer(&name, paddock_dns::QType::Type(paddock_dns::RType::Txt)),
            paddock_dns::Answer::Records { .. }
        );
        held.then_some(name)
    }

    /// What DNS serves for `role`'s service.
    pub fn service(&self, role: &str) -> ServiceNames {
        let mut out = ServiceNames::default();
        let (Ok(label), Some(origin)) = (paddock_dns::name::label(role), self.origin()) else {
            return out;
        };
        let zones = self.zones.borrow().clone();
        let records = |name: &str, t: paddock_dns::RType| match zones
            .answer(name, paddock_dns::QType::Type(t))
        {
            paddock_dns::Answer::Records { answers, .. } => answers,
            _ => Vec::new(),
        };
        let svc = format!("{label}.svc.{origin}");
        for r in records(&svc, paddock_dns::RType::Txt) {
            if let paddock_dns::RData::Txt(t) = r.data {
                match t.strip_prefix("verifying:") {
                    Some(i) => out.verifying.push(i.to_string()),
                    None => out.in_service.push(t),
                }
            }
        }
        if !out.in_service.is_empty() || !out.verifying.is_empty() {
            out.names.push(svc);
        }
        let srv = format!("_{label}._tcp.{origin}");
        if !records(&srv, paddock_dns::RType::Srv).is_empty() {
            out.names.push(srv);
        }
        out
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
    /// The serial it answers with, asked when this view was made (none: no answer within
    /// [`PEER_WAIT`]).
    pub serving: Option<u32>,
}

/// How long `GET /api/v1/dns/peers` waits for each secondary's SOA.
pub const PEER_WAIT: Duration = Duration::from_millis(500);

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
    // Each secondary is asked at once, all together: the view waits PEER_WAIT at most.
    let serving = futures_util::future::join_all(
        peers
            .iter()
            .map(|p| paddock_dns::server::ask_serial(p.peer, &p.apex, PEER_WAIT)),
    )
    .await;
    Ok(Json(
        peers
            .iter()
            .zip(serving)
            .map(|(p, serving)| PeerView {
                serving,
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
        let dhcp = Site {
            subnets: subnets.clone(),
            reservations: vec![paddock_dhcp::Reservation {
                mac: "52:54:00:00:00:07".parse().unwrap(),
                ip: Ipv4Addr::new(198, 18, 0, 7),
                hostname: None,
            }],
            peers: Vec::new(),
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
        // Among several appliance hosts, each is a name server, numbered the same way on
        // every host (they serve one zone).
        let site = Site {
            peers: vec![Ipv4Addr::new(198, 18, 0, 3), Ipv4Addr::new(198, 18, 0, 2)],
            ..Site::default()
        };
        let c = validate(&file("enabled = true"), http, &site, &mut p).unwrap();
        let ns: Vec<(&str, String)> = c
            .zone
            .name_servers
            .iter()
            .map(|(n, ip)| (n.as_str(), ip.to_string()))
            .collect();
        assert_eq!(
            ns,
            [
                ("ns1", "198.18.0.1".to_string()),
                ("ns2", "198.18.0.2".to_string()),
                ("ns3", "198.18.0.3".to_string())
            ]
        );
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn every_bad_dns_setting_is_reported() {
        let mut p = Vec::new();
        let f = file(
            r#"enabled = true
zone = "a..b"
"#,
        );
        assert!(validate(&f, None, &Site::default(), &mut p).is_none());
        let f = file(
            r#"enabled = true
ttl_secs = 0
allow_transfer = ["nonsense", "198.18.0.0/24"]
secondaries = ["198.18.0.53", "198.18.0.54:5353", "ns2"]
reverse = ["198.18.0.0/33"]
self_removal_window_secs = 0
"#,
        );
        let c = validate(&f, None, &Site::default(), &mut p).unwrap();
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
            "dns.allow_transfer[0]: \"nonsense\"",
            "dns.reverse[0]: \"198.18.0.0/33\"",
            "dns.self_removal_window_secs: 0",
            "dns.secondaries: \"ns2\"",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
    }
}
