//! The per-node timeline: entries filed by node (or by MAC before a node is known), DHCP
//! answers with their renewals counted, and pruning.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use paddock_inventory::MacAddr;
use paddock_store::{Compare, Op, Txn};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ErrorKind, Inspector, InspectorError, Result, now_ms};
use crate::node::Node;

pub const EVENTS: &str = "events/";

/// One entry of a node's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    /// Unix milliseconds.
    pub at_ms: i64,
    pub kind: String,
    pub message: String,
    #[serde(default)]
    pub error: bool,
    /// How many times the same thing happened again since (DHCP renewals of one lease).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
    /// When it last happened again (Unix milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_at_ms: Option<i64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TimelineEvent {
    fn new(at_ms: i64, kind: &str, message: &str, error: bool) -> Self {
        TimelineEvent {
            at_ms,
            kind: kind.into(),
            message: message.into(),
            error,
            repeats: 0,
            last_at_ms: None,
        }
    }

    /// The entry as operators read it: repeats said in the message.
    pub fn shown(mut self) -> Self {
        if self.repeats > 0 {
            let last = self.last_at_ms.unwrap_or(self.at_ms);
            let times = if self.repeats == 1 { "time" } else { "times" };
            self.message = format!(
                "{} (renewed {} {times}, last at {}.{:03})",
                self.message,
                self.repeats,
                crate::node::iso(last.div_euclid(1000)),
                last.rem_euclid(1000)
            );
        }
        self
    }
}

/// Where a timeline entry is filed: by node once known, by MAC before.
#[derive(Clone, Copy, Debug)]
pub enum Subject {
    Node(Uuid),
    Mac(MacAddr),
}

fn event_key(subject: Subject, at_ms: i64, seq: u32) -> String {
    let who = match subject {
        Subject::Node(u) => u.to_string(),
        Subject::Mac(m) => format!("mac-{}", m.to_hex()),
    };
    format!("{EVENTS}{who}/{at_ms:015}-{seq:04}")
}

pub(super) fn event_op(
    subject: Subject,
    at_ms: i64,
    seq: u32,
    kind: &str,
    message: &str,
    error: bool,
) -> Op {
    let ev = TimelineEvent::new(at_ms, kind, message, error);
    Op::put(
        event_key(subject, at_ms, seq),
        serde_json::to_vec(&ev).unwrap_or_default(),
    )
}

/// The Unix ms to file an entry made at `now` (Unix seconds) under: the clock's own
/// millisecond while the clock is still in that second, so two reports within one second
/// get keys of their own (filed under the second alone, the second report's entries
/// replaced the first's); `now`'s first millisecond when `now` is not the clock's second
/// (a caller with its own time, as tests are).
pub(super) fn entry_ms(now: i64) -> i64 {
    let ms = now_ms();
    if ms.div_euclid(1000) == now {
        ms
    } else {
        now.saturating_mul(1000)
    }
}

/// A timeline entry for `subject` now, as an operation to put in another service's
/// transaction (the appliance's provisioning records file their transitions with it, so
/// the record and its entry change together).
pub fn timeline_op(subject: Subject, kind: &str, message: &str, error: bool) -> Op {
    event_op(subject, now_ms(), rand_seq() % 10_000, kind, message, error)
}

/// How much of the timeline is kept (`[timeline]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelineLimits {
    /// The newest entries kept for every node and every MAC.
    pub keep_per_subject: usize,
    /// Also keep every entry of each node's last introspection (from its start to its end,
    /// or to now while it runs), however many.
    pub keep_last_introspection: bool,
}

impl Default for TimelineLimits {
    fn default() -> Self {
        TimelineLimits {
            keep_per_subject: 200,
            keep_last_introspection: true,
        }
    }
}

/// The subject (`<uuid>` or `mac-<hex>`) and time (Unix ms) of a timeline key; `None` for a
/// key of another shape.
fn parse_event_key(key: &str) -> Option<(&str, i64)> {
    let (who, when) = key.strip_prefix(EVENTS)?.split_once('/')?;
    let (ms, seq) = when.split_once('-')?;
    seq.parse::<u32>().ok()?;
    Some((who, ms.parse().ok()?))
}

/// Times (Unix ms, from and to, inclusive) by timeline subject (`<uuid>` or `mac-<hex>`).
pub type Windows = HashMap<String, (i64, i64)>;

/// The times of every node's last introspection, by the subjects its entries are filed
/// under: its UUID and its MACs.
pub fn introspection_windows(nodes: &[Node]) -> Windows {
    let mut windows = HashMap::new();
    for node in nodes {
        let Some(i) = &node.introspection else {
            continue;
        };
        let Some(start) = i.started_at else {
            continue;
        };
        let end = i
            .finished_at
            .map_or(i64::MAX, |f| f.saturating_mul(1000).saturating_add(999));
        let window = (start.saturating_mul(1000), end);
        windows.insert(node.uuid.to_string(), window);
        for mac in &node.macs {
            windows.insert(format!("mac-{}", mac.to_hex()), window);
        }
    }
    windows
}

/// The timeline keys to delete: for every subject, those older than its newest
/// `keep_per_subject`, unless they fall inside its introspection window (when kept). Keys
/// of another shape are never deleted.
pub fn timeline_prune<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    windows: &Windows,
    limits: &TimelineLimits,
) -> Vec<&'a str> {
    let mut subjects: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
    for key in keys {
        if let Some((who, at)) = parse_event_key(key) {
            subjects.entry(who).or_default().push((key, at));
        }
    }
    let mut doomed = Vec::new();
    for (who, mut entries) in subjects {
        // Zero-padded times: key order is time order.
        entries.sort_unstable_by_key(|(key, _)| *key);
        let excess = entries.len().saturating_sub(limits.keep_per_subject);
        let window = windows.get(who).filter(|_| limits.keep_last_introspection);
        doomed.extend(
            entries[..excess]
                .iter()
                .filter(|(_, at)| !window.is_some_and(|(from, to)| (from..=to).contains(&at)))
                .map(|(key, _)| *key),
        );
    }
    doomed
}

/// A reply the DHCP server gave a PXE client (DHCPv6's two: Advertise, Reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DhcpReply {
    Offer,
    Ack,
    Nak,
    Advertise,
    Reply,
}

impl DhcpReply {
    /// Whether it binds the address (and so may renew a lease).
    fn binds(self) -> bool {
        matches!(self, DhcpReply::Ack | DhcpReply::Reply)
    }

    fn protocol(self) -> &'static str {
        match self {
            DhcpReply::Advertise | DhcpReply::Reply => "DHCPv6",
            _ => "DHCP",
        }
    }
}

/// One answer to a PXE client, as the DHCP server's observer reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhcpAnswer {
    pub mac: MacAddr,
    pub reply: DhcpReply,
    pub ip: IpAddr,
    /// The boot file or URL given.
    pub boot: String,
    /// Unix milliseconds.
    pub at_ms: i64,
}

impl DhcpAnswer {
    /// Whether this answer renews the lease `previous` (the MAC's last answer) gave: the
    /// same address acknowledged again, with the same boot file. Anything else (a first
    /// answer, an offer — a PXE boot —, a NAK, a new address) is an entry of its own.
    pub fn renews(&self, previous: &DhcpAnswer) -> bool {
        self.mac == previous.mac
            && self.reply.binds()
            && previous.reply == self.reply
            && self.ip == previous.ip
            && self.boot == previous.boot
    }

    fn message(&self) -> String {
        format!(
            "{} {:?} {}, boot {}",
            self.reply.protocol(),
            self.reply,
            self.ip,
            self.boot
        )
    }
}

/// A MAC's last DHCP answer and the timeline entry it is filed in.
pub(super) struct LastAnswer {
    answer: DhcpAnswer,
    key: String,
    entry: TimelineEvent,
}

/// Most MACs whose last answer is remembered; past it the memory starts again (the next
/// renewal of each is then an entry of its own).
const REMEMBERED_MACS: usize = 65_536;

impl Inspector {
    /// Records a timeline entry (best effort callers may ignore the error).
    pub async fn event(
        &self,
        subject: Subject,
        kind: &str,
        message: &str,
        error: bool,
    ) -> Result<()> {
        let at = now_ms();
        let seq = rand_seq() % 10_000;
        self.store
            .txn(Txn {
                success: vec![event_op(subject, at, seq, kind, message, error)],
                ..Txn::default()
            })
            .await?;
        Ok(())
    }

    /// A node's timeline: its own entries and those filed under its MACs, oldest first.
    pub async fn timeline(&self, node: &Node) -> Result<Vec<TimelineEvent>> {
        let mut out = Vec::new();
        let mut prefixes = vec![format!("{EVENTS}{}/", node.uuid)];
        prefixes.extend(
            node.macs
                .iter()
                .map(|m| format!("{EVENTS}mac-{}/", m.to_hex())),
        );
        for p in prefixes {
            for kv in self.store.range(&p).await? {
                if let Ok(ev) = serde_json::from_slice::<TimelineEvent>(&kv.value) {
                    out.push(ev.shown());
                }
            }
        }
        out.sort_by_key(|e| e.at_ms);
        Ok(out)
    }

    /// Files DHCP answers on their MACs' timelines, in the order given, in one transaction.
    /// A renewal of the lease a MAC's last answer gave ([`DhcpAnswer::renews`]) is counted on
    /// that answer's entry instead of adding one. Last answers are remembered in memory: after
    /// a restart (or on a new leader) the first renewal of each lease is an entry again.
    pub async fn dhcp_answered(&self, answers: &[DhcpAnswer]) -> Result<()> {
        let mut puts: BTreeMap<String, TimelineEvent> = BTreeMap::new();
        {
            let mut last = self.last_answers.lock().unwrap_or_else(|p| p.into_inner());
            for a in answers {
                match last.get_mut(&a.mac) {
                    Some(prev) if a.renews(&prev.answer) => {
                        prev.entry.repeats = prev.entry.repeats.saturating_add(1);
                        prev.entry.last_at_ms = Some(a.at_ms);
                        puts.insert(prev.key.clone(), prev.entry.clone());
                    }
                    _ => {
                        if last.len() >= REMEMBERED_MACS {
                            last.clear();
                        }
                        let key = event_key(Subject::Mac(a.mac), a.at_ms, rand_seq() % 10_000);
                        let entry = TimelineEvent::new(a.at_ms, "dhcp", &a.message(), false);
                        puts.insert(key.clone(), entry.clone());
                        last.insert(
                            a.mac,
                            LastAnswer {
                                answer: a.clone(),
                                key,
                                entry,
                            },
                        );
                    }
                }
            }
        }
        let puts: Vec<Op> = puts
            .into_iter()
            .map(|(key, entry)| Op::put(key, serde_json::to_vec(&entry).unwrap_or_default()))
            .collect();
        self.write_chunked(&puts, None).await?;
        Ok(())
    }

    /// Deletes the timeline entries `limits` do not keep ([`timeline_prune`]); returns how
    /// many. Leader-only work: every delete carries `fence` when given.
    pub async fn prune_timeline(
        &self,
        limits: &TimelineLimits,
        fence: Option<&Compare>,
    ) -> Result<usize> {
        let windows = introspection_windows(&self.list().await?);
        let entries = self.store.range(EVENTS).await?;
        let doomed = timeline_prune(entries.iter().map(|kv| kv.key.as_str()), &windows, limits);
        let deletes: Vec<Op> = doomed.iter().map(|k| Op::delete(*k)).collect();
        if !self.write_chunked(&deletes, fence).await? {
            return Err(InspectorError::of(
                ErrorKind::NotLeader,
                "this host is no longer the leader; the new leader prunes the timeline",
            ));
        }
        Ok(doomed.len())
    }

    /// Applies `ops` in transactions of at most [`MAX_TXN_OPS`], each guarded by `fence` when
    /// given; false (and the rest left undone) once the fence fails.
    async fn write_chunked(&self, ops: &[Op], fence: Option<&Compare>) -> Result<bool> {
        for chunk in ops.chunks(MAX_TXN_OPS) {
            let txn = Txn {
                compare: fence.into_iter().cloned().collect(),
                success: chunk.to_vec(),
                failure: Vec::new(),
            };
            if !self.store.txn(txn).await?.succeeded {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Most operations per timeline transaction (etcd refuses more than 128 by default).
const MAX_TXN_OPS: usize = 100;

/// A per-call sequence number so two entries in the same millisecond do not collide.
pub(super) fn rand_seq() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Introspection;
    use crate::state::State;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);

    /// An answer giving 198.18.0.`host` and `undionly.kpxe`.
    fn answer(reply: DhcpReply, host: u8) -> DhcpAnswer {
        DhcpAnswer {
            mac: MAC,
            reply,
            ip: std::net::Ipv4Addr::new(198, 18, 0, host).into(),
            boot: "undionly.kpxe".into(),
            at_ms: 0,
        }
    }

    #[test]
    fn only_the_same_lease_acknowledged_again_is_a_renewal() {
        use DhcpReply::*;
        let held = answer(Ack, 100);
        let other_mac = DhcpAnswer {
            mac: MacAddr([0x52, 0x54, 0, 0, 0, 2]),
            ..held.clone()
        };
        let other_boot = DhcpAnswer {
            boot: "snponly.efi".into(),
            ..held.clone()
        };
        let cases = [
            (&held, &held, true),
            // A PXE boot starts with an offer; the ACK after an offer is an entry too.
            (&held, &answer(Offer, 100), false),
            (&answer(Offer, 100), &held, false),
            // A new address, a new boot file, a NAK, another machine: entries.
            (&held, &answer(Ack, 101), false),
            (&held, &other_boot, false),
            (&held, &answer(Nak, 100), false),
            (&answer(Nak, 100), &held, false),
            (&held, &other_mac, false),
        ];
        for (previous, now, renews) in cases {
            assert_eq!(now.renews(previous), renews, "{previous:?} then {now:?}");
        }
    }

    #[test]
    fn repeats_are_said_in_the_message() {
        let mut ev = TimelineEvent::new(1_502_886_121_000, "dhcp", "DHCP Ack 198.18.0.100", false);
        assert_eq!(ev.clone().shown().message, "DHCP Ack 198.18.0.100");
        ev.repeats = 1;
        ev.last_at_ms = Some(1_502_886_181_250);
        assert_eq!(
            ev.clone().shown().message,
            "DHCP Ack 198.18.0.100 (renewed 1 time, last at 2017-08-16T12:23:01.250)"
        );
        ev.repeats = 57;
        assert!(ev.shown().message.contains("(renewed 57 times, last at "));
    }

    fn key(who: &str, at_ms: i64, seq: u32) -> String {
        format!("{EVENTS}{who}/{at_ms:015}-{seq:04}")
    }

    #[test]
    fn pruning_keeps_the_newest_per_subject_and_the_last_introspection() {
        let limits = |keep, intro| TimelineLimits {
            keep_per_subject: keep,
            keep_last_introspection: intro,
        };
        let a: Vec<String> = (1..=5)
            .map(|t| key("mac-525400000001", t * 1000, 0))
            .collect();
        let b: Vec<String> = (1..=3).map(|t| key("node-b", t * 1000, 7)).collect();
        let odd = format!("{EVENTS}mac-525400000001/garbage");
        let all: Vec<&str> = a
            .iter()
            .chain(&b)
            .map(String::as_str)
            .chain([odd.as_str()])
            .collect();
        let window: Windows = [("mac-525400000001".to_string(), (2000, 3999))].into();
        let none = HashMap::new();
        fn s(v: &[String], r: std::ops::Range<usize>) -> Vec<&str> {
            v[r].iter().map(String::as_str).collect()
        }
        let cases: [(TimelineLimits, &Windows, Vec<&str>); 5] = [
            // Enough room: nothing goes (and never a key of another shape).
            (limits(5, true), &none, vec![]),
            // The newest two of each subject stay.
            (limits(2, true), &none, [s(&a, 0..3), s(&b, 0..1)].concat()),
            // Entries of the last introspection stay however old.
            (
                limits(2, true),
                &window,
                [s(&a, 0..1), s(&b, 0..1)].concat(),
            ),
            (
                limits(2, false),
                &window,
                [s(&a, 0..3), s(&b, 0..1)].concat(),
            ),
            (
                limits(0, true),
                &window,
                [s(&a, 0..1), s(&a, 3..5), s(&b, 0..3)].concat(),
            ),
        ];
        for (limits, windows, want) in cases {
            let mut got = timeline_prune(all.iter().copied(), windows, &limits);
            got.sort_unstable();
            let mut want = want;
            want.sort_unstable();
            assert_eq!(got, want, "{limits:?} {windows:?}");
        }
    }

    #[test]
    fn a_window_runs_from_the_start_to_the_end_or_to_now() {
        let mut done = Node::new(Uuid::from_u128(1), 0);
        done.macs = vec![MAC];
        done.introspection = Some(Introspection {
            state: State::Finished,
            started_at: Some(10),
            finished_at: Some(20),
            error: None,
            manage_boot: true,
            set_image: None,
        });
        let mut running = Node::new(Uuid::from_u128(2), 0);
        running.introspection = Some(Introspection {
            state: State::Waiting,
            started_at: Some(30),
            finished_at: None,
            error: None,
            manage_boot: true,
            set_image: None,
        });
        let never = Node::new(Uuid::from_u128(3), 0);
        let w = introspection_windows(&[done.clone(), running.clone(), never.clone()]);
        assert_eq!(w[&done.uuid.to_string()], (10_000, 20_999));
        assert_eq!(w["mac-525400000001"], (10_000, 20_999));
        assert_eq!(w[&running.uuid.to_string()], (30_000, i64::MAX));
        assert!(!w.contains_key(&never.uuid.to_string()));
        assert_eq!(w.len(), 3);
    }
}
