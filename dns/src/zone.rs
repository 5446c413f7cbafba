//! The zones as a pure function of live state: `(configuration, machines, members, service
//! ports) → records`, the serial that moves only when the records do, and the answer a zone
//! gives to a question. The server answers from one built [`Zones`] at a time and swaps in
//! a new one when the state changes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::Ipv4Net;
use paddock_clock::UnixMs;

use crate::name;

/// What the zones are built from besides the live state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    /// The forward zone, absolute (`paddock.internal.`).
    pub origin: String,
    /// Every record's TTL, and the SOA's minimum (negative-answer TTL).
    pub ttl: u32,
    /// The zone's name servers: a label under the origin and its address.
    pub name_servers: Vec<(String, Ipv4Addr)>,
    /// The SOA's responsible mailbox, absolute (`hostmaster.paddock.internal.`).
    pub hostmaster: String,
    /// Subnets whose reverse zones are served (PTR to the machines' names).
    pub reverse: Vec<Ipv4Net>,
}

/// An enrolled machine: its name (the host name) and its addresses as known now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    pub uuid: String,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
}

/// A registered role instance; `host` is a machine's name, `in_service` what the
/// membership hysteresis decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub role: String,
    pub instance: String,
    pub host: Option<String>,
    pub in_service: bool,
}

/// A port a role's service declares: an SRV record per member in service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServicePort {
    pub port: u16,
    pub priority: u16,
    pub weight: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    pub machines: Vec<Machine>,
    pub members: Vec<Member>,
    /// Role → the ports its service declares.
    pub ports: BTreeMap<String, Vec<ServicePort>>,
}

/// Record types the zones hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RType {
    Soa,
    Ns,
    A,
    Aaaa,
    Txt,
    Srv,
    Ptr,
}

/// What a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QType {
    Type(RType),
    /// ANY: answered minimally, with one record set (RFC 8482).
    Any,
    /// A type the zones never hold (MX, CNAME …): NODATA where the name exists.
    Other,
}

/// A zone's start of authority: who serves it, who answers for it, its serial and timers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Soa {
    pub mname: String,
    pub rname: String,
    pub serial: u32,
    pub refresh: u32,
    pub retry: u32,
    pub expire: u32,
    pub minimum: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RData {
    Soa(Soa),
    Ns(String),
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Txt(String),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
    Ptr(String),
}

impl std::fmt::Display for RType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RType::Soa => "SOA",
            RType::Ns => "NS",
            RType::A => "A",
            RType::Aaaa => "AAAA",
            RType::Txt => "TXT",
            RType::Srv => "SRV",
            RType::Ptr => "PTR",
        })
    }
}

/// The data as a zone file writes it.
impl std::fmt::Display for RData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RData::Soa(s) => write!(
                f,
                "{} {} {} {} {} {} {}",
                s.mname, s.rname, s.serial, s.refresh, s.retry, s.expire, s.minimum
            ),
            RData::Ns(n) | RData::Ptr(n) => f.write_str(n),
            RData::A(a) => write!(f, "{a}"),
            RData::Aaaa(a) => write!(f, "{a}"),
            RData::Txt(t) => write!(f, "{t:?}"),
            RData::Srv {
                priority,
                weight,
                port,
                target,
            } => write!(f, "{priority} {weight} {port} {target}"),
        }
    }
}

impl RData {
    pub fn rtype(&self) -> RType {
        match self {
            RData::Soa(_) => RType::Soa,
            RData::Ns(_) => RType::Ns,
            RData::A(_) => RType::A,
            RData::Aaaa(_) => RType::Aaaa,
            RData::Txt(_) => RType::Txt,
            RData::Srv { .. } => RType::Srv,
            RData::Ptr(_) => RType::Ptr,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Record {
    pub name: String,
    pub ttl: u32,
    pub data: RData,
}

/// One zone: its apex, serial and records (the SOA is made from the serial on demand), and
/// the changes that led to it, for incremental transfers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    pub apex: String,
    pub serial: u32,
    pub ttl: u32,
    mname: String,
    rname: String,
    records: BTreeMap<String, BTreeSet<RData>>,
    /// Names that own no record but have names below them (`svc.<origin>`): NODATA, not
    /// NXDOMAIN (RFC 8020).
    empty_non_terminals: BTreeSet<String>,
    /// The last [`HISTORY`] changes, oldest first; each leads from one serial to the next.
    history: VecDeque<Arc<Delta>>,
}

/// One change of a zone, as an incremental transfer (RFC 1995) sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub from: u32,
    pub to: u32,
    pub removed: Vec<Record>,
    pub added: Vec<Record>,
}

/// A zone as one host serves it: its serial and a digest of its records, equal on every
/// host that built the same records (whatever its build).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub serial: u32,
    pub digest: String,
}

/// Changes kept per zone for incremental transfers; a secondary further behind gets the
/// whole zone.
pub const HISTORY: usize = 64;

/// A machine or instance left out of the zones, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub what: String,
    pub why: String,
}

/// The forward zone first, then the reverse zones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zones {
    pub zones: Vec<Zone>,
    pub skipped: Vec<Skipped>,
}

/// The answer to one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer<'a> {
    /// The records asked for, and the addresses of the names they point at (SRV targets,
    /// name servers) for the additional section.
    Records {
        zone: &'a Zone,
        answers: Vec<Record>,
        additional: Vec<Record>,
    },
    /// The name exists without records of the type: NOERROR, the SOA in authority.
    NoData { zone: &'a Zone },
    /// No such name in the zone: the SOA in authority.
    NxDomain { zone: &'a Zone },
    /// Not a name of any of our zones: REFUSED (never recursion).
    NotOurs,
}

/// SOA timers, as Triton CNS sets them: secondaries check every 30 s.
const REFRESH: u32 = 30;
const RETRY: u32 = 60;
const EXPIRE: u32 = 2_592_000;
/// Labels under the origin that hold the structured names.
const NODE: &str = "node";
const INST: &str = "inst";

/// The name an instance has in the zone of `origin` (`<instance>.inst.<origin>`), if its
/// name makes a label.
pub fn instance_name(origin: &str, instance: &str) -> Option<String> {
    let label = name::label(instance).ok()?;
    name::join(&format!("{label}.{INST}"), origin).ok()
}
const SVC: &str = "svc";

impl Zone {
    fn new(apex: String, cfg: &ZoneConfig, mname: &str) -> Zone {
        Zone {
            apex,
            serial: 0,
            ttl: cfg.ttl,
            mname: mname.to_string(),
            rname: cfg.hostmaster.clone(),
            records: BTreeMap::new(),
            empty_non_terminals: BTreeSet::new(),
            history: VecDeque::new(),
        }
    }

    /// The SOA as it was at `serial` (only the serial differs).
    pub fn soa_at(&self, serial: u32) -> Record {
        let mut soa = self.soa();
        if let RData::Soa(s) = &mut soa.data {
            s.serial = serial;
        }
        soa
    }

    /// The changes from `serial` to now, oldest first: empty when `serial` is the zone's,
    /// `None` when the history does not reach back to it.
    pub fn changes_since(&self, serial: u32) -> Option<Vec<Arc<Delta>>> {
        if serial == self.serial {
            return Some(Vec::new());
        }
        let start = self.history.iter().position(|d| d.from == serial)?;
        let chain: Vec<Arc<Delta>> = self.history.iter().skip(start).cloned().collect();
        let linked = chain.windows(2).all(|w| w[0].to == w[1].from);
        (linked && chain.last().map(|d| d.to) == Some(self.serial)).then_some(chain)
    }

    /// Whether `other` holds the same records, TTL and SOA names (serials aside).
    fn same_records(&self, other: &Zone) -> bool {
        self.records == other.records
            && self.ttl == other.ttl
            && self.mname == other.mname
            && self.rname == other.rname
    }

    /// SHA-256 (hex) of the zone in presentation form, serial aside: the TTL, the SOA's
    /// names, then every record in name and data order.
    pub fn digest(&self) -> String {
        use std::fmt::Write as _;
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut line = format!("{} {} {} {}\n", self.apex, self.ttl, self.mname, self.rname);
        ctx.update(line.as_bytes());
        for (name, set) in &self.records {
            for data in set {
                line.clear();
                let _ = writeln!(line, "{name} {} {data}", data.rtype());
                ctx.update(line.as_bytes());
            }
        }
        ctx.finish()
            .as_ref()
            .iter()
            .fold(String::with_capacity(64), |mut hex, b| {
                let _ = write!(hex, "{b:02x}");
                hex
            })
    }

    /// The records (without the SOA) as a set of `(name, data)`.
    fn set(&self) -> BTreeSet<(&str, &RData)> {
        self.records
            .iter()
            .flat_map(|(n, set)| set.iter().map(move |d| (n.as_str(), d)))
            .collect()
    }

    /// What changed from `old` to this zone.
    fn delta_from(&self, old: &Zone) -> Delta {
        let (was, is) = (old.set(), self.set());
        let record = |(name, data): &(&str, &RData), ttl: u32| Record {
            name: name.to_string(),
            ttl,
            data: (*data).clone(),
        };
        Delta {
            from: old.serial,
            to: self.serial,
            removed: was.difference(&is).map(|r| record(r, old.ttl)).collect(),
            added: is.difference(&was).map(|r| record(r, self.ttl)).collect(),
        }
    }

    fn add(&mut self, name: &str, data: RData) {
        self.records
            .entry(name.to_string())
            .or_default()
            .insert(data);
    }

    /// The zone's SOA record.
    pub fn soa(&self) -> Record {
        Record {
            name: self.apex.clone(),
            ttl: self.ttl,
            data: RData::Soa(Soa {
                mname: self.mname.clone(),
                rname: self.rname.clone(),
                serial: self.serial,
                refresh: REFRESH,
                retry: RETRY,
                expire: EXPIRE,
                minimum: self.ttl,
            }),
        }
    }

    /// Every record, SOA first: what a full transfer sends between its two SOAs.
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        std::iter::once(self.soa()).chain(self.records.iter().flat_map(move |(name, set)| {
            set.iter().map(move |data| Record {
                name: name.clone(),
                ttl: self.ttl,
                data: data.clone(),
            })
        }))
    }

    /// How many names own records.
    pub fn names(&self) -> usize {
        self.records.len()
    }

    fn rrset(&self, name: &str, t: RType) -> Vec<Record> {
        if t == RType::Soa {
            return if name == self.apex {
                vec![self.soa()]
            } else {
                Vec::new()
            };
        }
        self.records
            .get(name)
            .into_iter()
            .flatten()
            .filter(|d| d.rtype() == t)
            .map(|d| Record {
                name: name.to_string(),
                ttl: self.ttl,
                data: d.clone(),
            })
            .collect()
    }

    fn exists(&self, name: &str) -> bool {
        name == self.apex
            || self.records.contains_key(name)
            || self.empty_non_terminals.contains(name)
    }

    fn finish(&mut self) {
        let mut ents = BTreeSet::new();
        for name in self.records.keys() {
            let mut rest = name.as_str();
            while let Some((_, parent)) = rest.split_once('.') {
                if parent.len() <= self.apex.len() {
                    break;
                }
                if !self.records.contains_key(parent) {
                    ents.insert(parent.to_string());
                }
                rest = parent;
            }
        }
        self.empty_non_terminals = ents;
    }
}

/// The serial after `prev` for a change at `now`: the Unix time in seconds when that is
/// later than `prev` in serial arithmetic (RFC 1982), otherwise `prev + 1`, so that serials
/// strictly increase even for several changes in one second or a clock set back.
pub fn next_serial(prev: u32, now: UnixMs) -> u32 {
    let secs = u32::try_from(now.secs().rem_euclid(1 << 32)).unwrap_or(0);
    if serial_gt(secs, prev) {
        secs
    } else {
        prev.wrapping_add(1)
    }
}

/// The later of two serials (RFC 1982).
fn later(a: u32, b: u32) -> u32 {
    if serial_gt(a, b) { a } else { b }
}

/// `a > b` in RFC 1982 serial arithmetic.
pub fn serial_gt(a: u32, b: u32) -> bool {
    a != b && a.wrapping_sub(b) < (1 << 31)
}

impl Zones {
    /// The zones for `inputs`, with serial 0 until [`Zones::stamp`].
    pub fn build(cfg: &ZoneConfig, inputs: &Inputs) -> Zones {
        let mut b = Builder::new(cfg);
        let mut machines: Vec<&Machine> = inputs.machines.iter().collect();
        // In UUID order, so that a clash of names is settled the same way each time.
        machines.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        for m in machines {
            b.machine(m);
        }
        let mut members: Vec<&Member> = inputs.members.iter().collect();
        members.sort_by(|a, b| (&a.role, &a.instance).cmp(&(&b.role, &b.instance)));
        for m in members {
            let ports = inputs.ports.get(&m.role).map_or(&[][..], Vec::as_slice);
            b.member(m, ports);
        }
        b.finish()
    }

    /// Gives each zone its serial as a host alone does: `prev`'s where its records are the
    /// same, the next serial (see [`next_serial`]) where they changed, the time's where the
    /// zone is new; and carries `prev`'s history forward with the change, if any, at its end.
    pub fn stamp(&mut self, prev: Option<&Zones>, now: UnixMs) {
        self.stamp_in_step(prev, &BTreeMap::new(), true, now);
    }

    /// Gives each zone its serial in step with the other hosts of the appliance, so that
    /// all serve the same zone under the same serial. `published` is what the leading
    /// host last said it serves. A zone whose records are the published ones takes the
    /// published serial (when that is later than `prev`'s). Otherwise a host that may make
    /// serials (`own`: it leads, or has heard nothing from the leader for too long) moves
    /// past both `prev`'s and the published serial; one that may not answers `false`: it
    /// is not in step yet and keeps serving `prev` until the leader publishes these
    /// records (the zones are then not to be served). A serial never goes back.
    pub fn stamp_in_step(
        &mut self,
        prev: Option<&Zones>,
        published: &BTreeMap<String, Stamp>,
        own: bool,
        now: UnixMs,
    ) -> bool {
        for z in &mut self.zones {
            let o = prev.and_then(|p| p.zones.iter().find(|o| o.apex == z.apex));
            let base = o.map_or(0, |o| o.serial);
            let changed = o.is_none_or(|o| !o.same_records(z));
            let leader = published.get(&z.apex);
            let matches = leader.map(|l| l.digest == z.digest());
            z.serial = match (leader, matches) {
                (Some(l), Some(true)) if o.is_none() || serial_gt(l.serial, base) => l.serial,
                _ if !changed && (!own || matches != Some(false)) => base,
                _ if own => next_serial(leader.map_or(base, |l| later(l.serial, base)), now),
                _ => return false,
            };
            if let Some(o) = o {
                z.history = o.history.clone();
                if z.serial != o.serial {
                    let delta = z.delta_from(o);
                    z.history.push_back(Arc::new(delta));
                    while z.history.len() > HISTORY {
                        z.history.pop_front();
                    }
                }
            }
        }
        true
    }

    /// Each zone's serial and digest, by apex: what a leading host publishes.
    pub fn stamps(&self) -> BTreeMap<String, Stamp> {
        self.zones
            .iter()
            .map(|z| {
                let stamp = Stamp {
                    serial: z.serial,
                    digest: z.digest(),
                };
                (z.apex.clone(), stamp)
            })
            .collect()
    }

    /// Every record that names `subject` (a machine's name or UUID, or an instance's name):
    /// its own names' records, the PTRs pointing at them, and its entries in services.
    pub fn names_of(&self, subject: &str) -> Vec<Record> {
        let Ok(label) = name::label(subject) else {
            return Vec::new();
        };
        let Some(forward) = self.zones.first() else {
            return Vec::new();
        };
        let owners: Vec<String> = [
            label.clone(),
            format!("{label}.{NODE}"),
            format!("{label}.{INST}"),
        ]
        .iter()
        .filter_map(|l| name::join(l, &forward.apex).ok())
        .collect();
        let mut out: Vec<Record> = Vec::new();
        for z in &self.zones {
            for r in z.records() {
                let points_here = match &r.data {
                    RData::Ptr(t) | RData::Srv { target: t, .. } => owners.contains(t),
                    RData::Txt(t) => *t == label || t.strip_prefix("verifying:") == Some(&label),
                    _ => false,
                };
                if owners.contains(&r.name) || points_here {
                    out.push(r);
                }
            }
        }
        out
    }

    /// The zone a name belongs to: the one with the longest apex above it.
    pub fn zone_of(&self, qname: &str) -> Option<&Zone> {
        self.zones
            .iter()
            .filter(|z| name::within(qname, &z.apex))
            .max_by_key(|z| z.apex.len())
    }

    /// The answer to `qname`/`qtype` (`qname` absolute, any case).
    pub fn answer(&self, qname: &str, qtype: QType) -> Answer<'_> {
        let qname = qname.to_ascii_lowercase();
        let Some(zone) = self.zone_of(&qname) else {
            return Answer::NotOurs;
        };
        if !zone.exists(&qname) {
            return Answer::NxDomain { zone };
        }
        let answers = match qtype {
            QType::Type(t) => zone.rrset(&qname, t),
            QType::Any => {
                let first = zone
                    .records
                    .get(&qname)
                    .and_then(|set| set.iter().next())
                    .map(RData::rtype);
                match first {
                    Some(t) => zone.rrset(&qname, t),
                    None => zone.rrset(&qname, RType::Soa),
                }
            }
            QType::Other => Vec::new(),
        };
        if answers.is_empty() {
            return Answer::NoData { zone };
        }
        let mut additional = Vec::new();
        let mut targets = BTreeSet::new();
        for r in &answers {
            if let RData::Srv { target, .. } | RData::Ns(target) = &r.data {
                targets.insert(target.clone());
            }
        }
        for t in targets {
            if let Some(z) = self.zone_of(&t) {
                additional.extend(z.rrset(&t, RType::A));
                additional.extend(z.rrset(&t, RType::Aaaa));
            }
        }
        Answer::Records {
            zone,
            answers,
            additional,
        }
    }
}

/// The zones being built: the forward zone and what the reverse zones will need.
struct Builder<'a> {
    cfg: &'a ZoneConfig,
    forward: Zone,
    ns_names: Vec<String>,
    /// Labels machines may not take: the structured names' and the name servers'.
    reserved: BTreeSet<String>,
    /// Machines by their label.
    hosts: BTreeMap<String, &'a Machine>,
    /// Instances' labels → their role: one name, one instance.
    instances: BTreeMap<String, &'a str>,
    /// Address → the name its PTR points at (the first machine to hold it).
    ptrs: BTreeMap<Ipv4Addr, String>,
    skipped: Vec<Skipped>,
}

impl<'a> Builder<'a> {
    fn new(cfg: &'a ZoneConfig) -> Self {
        let origin = cfg.origin.as_str();
        let servers: Vec<(String, Ipv4Addr)> = cfg
            .name_servers
            .iter()
            .filter_map(|(l, a)| Some((name::join(&name::label(l).ok()?, origin).ok()?, *a)))
            .collect();
        let mname = servers
            .first()
            .map_or_else(|| origin.to_string(), |(n, _)| n.clone());
        let mut forward = Zone::new(origin.to_string(), cfg, &mname);
        for (ns, address) in &servers {
            forward.add(origin, RData::Ns(ns.clone()));
            forward.add(ns, RData::A(*address));
        }
        let mut reserved: BTreeSet<String> = [NODE, INST, SVC].map(String::from).into();
        reserved.extend(cfg.name_servers.iter().map(|(l, _)| l.to_ascii_lowercase()));
        Builder {
            cfg,
            forward,
            ns_names: servers.into_iter().map(|(n, _)| n).collect(),
            reserved,
            hosts: BTreeMap::new(),
            instances: BTreeMap::new(),
            ptrs: BTreeMap::new(),
            skipped: Vec::new(),
        }
    }

    fn skip(&mut self, what: String, why: impl ToString) {
        let why = why.to_string();
        self.skipped.push(Skipped { what, why });
    }

    /// `<name>.<origin>` and `<uuid>.node.<origin>`: A, AAAA, TXT with the UUID.
    fn machine(&mut self, m: &'a Machine) {
        let origin = self.cfg.origin.as_str();
        let what = format!("machine {:?} ({})", m.name, m.uuid);
        let (label, uuid) = match name::label(&m.name).and_then(|l| Ok((l, name::label(&m.uuid)?)))
        {
            Ok(pair) => pair,
            Err(e) => return self.skip(what, e),
        };
        if self.reserved.contains(&label) {
            return self.skip(
                what,
                format!("{label:?} is a name the zone keeps for itself"),
            );
        }
        if let Some(other) = self.hosts.get(&label) {
            let why = format!("the name {label:?} belongs to machine {}", other.uuid);
            return self.skip(what, why);
        }
        let names = (
            name::join(&label, origin),
            name::join(&format!("{uuid}.{NODE}"), origin),
        );
        let (Ok(primary), Ok(by_uuid)) = names else {
            return self.skip(what, "its name would be longer than DNS allows");
        };
        for n in [&primary, &by_uuid] {
            self.forward.add(n, RData::Txt(m.uuid.clone()));
            self.addresses(n, m);
        }
        if let Some(a) = m.ipv4 {
            self.ptrs.entry(a).or_insert(primary);
        }
        self.hosts.insert(label, m);
    }

    fn addresses(&mut self, name: &str, host: &Machine) {
        if let Some(a) = host.ipv4 {
            self.forward.add(name, RData::A(a));
        }
        if let Some(a) = host.ipv6 {
            self.forward.add(name, RData::Aaaa(a));
        }
    }

    /// `<instance>.inst.<origin>` (its host's addresses, TXT with its role), and its part of
    /// `<role>.svc.<origin>` and `_<role>._tcp.<origin>`.
    fn member(&mut self, m: &'a Member, ports: &[ServicePort]) {
        let origin = self.cfg.origin.as_str();
        let what = format!("instance {:?} of role {:?}", m.instance, m.role);
        let (role, label) =
            match name::label(&m.role).and_then(|r| Ok((r, name::label(&m.instance)?))) {
                Ok(pair) => pair,
                Err(e) => return self.skip(what, e),
            };
        if let Some(other) = self.instances.get(&label) {
            let why = format!("the name {label:?} belongs to an instance of role {other:?}");
            return self.skip(what, why);
        }
        let names = (
            name::join(&format!("{label}.{INST}"), origin),
            name::join(&format!("{role}.{SVC}"), origin),
        );
        let (Ok(inst), Ok(svc)) = names else {
            return self.skip(what, "its names would be longer than DNS allows");
        };
        self.instances.insert(label.clone(), &m.role);
        let host = m
            .host
            .as_deref()
            .and_then(|h| self.hosts.get(&h.to_ascii_lowercase()).copied());
        self.forward.add(&inst, RData::Txt(m.role.clone()));
        if let Some(h) = host {
            self.addresses(&inst, h);
        }
        if !m.in_service {
            self.forward
                .add(&svc, RData::Txt(format!("verifying:{label}")));
            return;
        }
        self.forward.add(&svc, RData::Txt(label));
        let Some(h) = host.filter(|h| h.ipv4.is_some() || h.ipv6.is_some()) else {
            return;
        };
        self.addresses(&svc, h);
        // RFC 2782's name too, where `_<role>` still fits in a label.
        let srv = name::label(&format!("_{role}"))
            .ok()
            .and_then(|l| name::join(&format!("{l}._tcp"), origin).ok());
        for p in ports {
            let data = RData::Srv {
                priority: p.priority,
                weight: p.weight,
                port: p.port,
                target: inst.clone(),
            };
            if let Some(srv) = &srv {
                self.forward.add(srv, data.clone());
            }
            self.forward.add(&svc, data);
        }
    }

    /// The forward zone, then a reverse zone per octet-aligned block of the configured
    /// subnets with the PTRs of the machines' addresses inside them.
    fn finish(mut self) -> Zones {
        self.forward.finish();
        let mut zones = vec![self.forward];
        let mut apexes = BTreeSet::new();
        for net in &self.cfg.reverse {
            for apex in name::reverse_zones(*net) {
                if apexes.insert(apex.clone()) {
                    let mut z = Zone::new(apex.clone(), self.cfg, &zones[0].mname);
                    for ns in &self.ns_names {
                        z.add(&apex, RData::Ns(ns.clone()));
                    }
                    zones.push(z);
                }
            }
        }
        for (address, target) in self.ptrs {
            if !self.cfg.reverse.iter().any(|n| n.contains(&address)) {
                continue;
            }
            let owner = name::reverse_name(address);
            let zone = zones[1..]
                .iter_mut()
                .filter(|z| name::within(&owner, &z.apex))
                .max_by_key(|z| z.apex.len());
            if let Some(z) = zone {
                z.add(&owner, RData::Ptr(target));
            }
        }
        for z in &mut zones[1..] {
            z.finish();
        }
        Zones {
            zones,
            skipped: self.skipped,
        }
    }
}
