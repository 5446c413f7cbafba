//! The inspector over the store: node records and their indexes, introspection start, abort,
//! continue (lookup, auto-enrol, hooks, rules), stored data, rules, timeouts, and the
//! per-node timeline. Every change is one compare-and-swap transaction on the node's record,
//! retried on conflict, so two hosts (or two requests) never both apply a transition.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use paddock_inventory::MacAddr;
use paddock_inventory::{IntrospectionData, normalise_mac};
use paddock_store::{Compare, KeyValue, Op, Revision, Store, StoreError, Txn};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::hooks;
use crate::lookup::{Lookup, lookup, real_bmc};
use crate::node::{Introspection, Node, update_capabilities};
use crate::patch;
use crate::rules::{self, Rule};
use crate::state::{Event, State};

pub const NODES: &str = "nodes/";
pub const MACS: &str = "node-macs/";
pub const NAMES: &str = "node-names/";
pub const BMCS: &str = "node-bmc/";
pub const DATA: &str = "introspection-data/";
pub const RULES: &str = "rules/";
pub const EVENTS: &str = "events/";
/// The driver auto-enrolled nodes get (Inspector's `[discovery] enroll_node_driver` default).
pub const ENROLL_DRIVER: &str = "fake-hardware";

/// What the ramdisk does once its introspection has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NextAction {
    Poweroff,
    Reboot,
    Wait,
}

#[derive(Clone, Debug)]
pub struct InspectorConfig {
    /// Enrol machines that no node matches (on by default).
    pub auto_enrol: bool,
    /// Seconds an introspection may run before it ends in error ("Introspection timeout").
    pub timeout_secs: i64,
    /// Largest `/v1/continue` body accepted, bytes.
    pub max_body_bytes: usize,
    /// What a ramdisk whose introspection ended is told to do.
    pub after_inspection: NextAction,
    /// Base URL for `links` in API answers.
    pub public_url: String,
}

impl Default for InspectorConfig {
    fn default() -> Self {
        InspectorConfig {
            auto_enrol: true,
            timeout_secs: 3600,
            max_body_bytes: 4 << 20,
            after_inspection: NextAction::Poweroff,
            public_url: String::new(),
        }
    }
}

/// An error with the HTTP status Inspector gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectorError {
    pub status: u16,
    pub message: String,
}

impl InspectorError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        InspectorError {
            status,
            message: message.into(),
        }
    }
    fn bad(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
    fn not_found(ident: &str) -> Self {
        Self::new(404, format!("Could not find node {ident} in cache"))
    }
}

impl std::fmt::Display for InspectorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl From<StoreError> for InspectorError {
    fn from(e: StoreError) -> Self {
        InspectorError::new(500, format!("store error: {e}"))
    }
}

type Result<T> = std::result::Result<T, InspectorError>;

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

fn event_op(subject: Subject, at_ms: i64, seq: u32, kind: &str, message: &str, error: bool) -> Op {
    let ev = TimelineEvent::new(at_ms, kind, message, error);
    Op::put(
        event_key(subject, at_ms, seq),
        serde_json::to_vec(&ev).unwrap_or_default(),
    )
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

/// A reply the DHCP server gave a PXE client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DhcpReply {
    Offer,
    Ack,
    Nak,
}

/// One answer to a PXE client, as the DHCP server's observer reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhcpAnswer {
    pub mac: MacAddr,
    pub reply: DhcpReply,
    pub ip: Ipv4Addr,
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
            && self.reply == DhcpReply::Ack
            && previous.reply == DhcpReply::Ack
            && self.ip == previous.ip
            && self.boot == previous.boot
    }

    fn message(&self) -> String {
        format!("DHCP {:?} {}, boot {}", self.reply, self.ip, self.boot)
    }
}

/// A MAC, name or BMC address a change wants that another node holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Conflict {
    Mac(MacAddr),
    Name(String),
    Bmc(String),
}

impl Conflict {
    /// Ironic's message (409).
    fn message(&self) -> String {
        match self {
            Conflict::Mac(m) => format!("A port with MAC address {m} already exists."),
            Conflict::Name(n) => format!("A node with name {n} already exists."),
            Conflict::Bmc(b) => format!("BMC address {b} belongs to another node."),
        }
    }

    /// Puts back in `new` what `old` had where the conflict is.
    fn revert(&self, new: &mut Node, old: &Node) {
        match self {
            Conflict::Mac(_) => new.macs.clone_from(&old.macs),
            Conflict::Name(_) => new.name.clone_from(&old.name),
            Conflict::Bmc(_) => new.bmc_address.clone_from(&old.bmc_address),
        }
    }
}

/// A MAC's last DHCP answer and the timeline entry it is filed in.
struct LastAnswer {
    answer: DhcpAnswer,
    key: String,
    entry: TimelineEvent,
}

/// Most MACs whose last answer is remembered; past it the memory starts again (the next
/// renewal of each is then an entry of its own).
const REMEMBERED_MACS: usize = 65_536;

fn parse_node(kv: &KeyValue) -> Result<Node> {
    serde_json::from_slice(&kv.value)
        .map_err(|e| InspectorError::new(500, format!("node record {} is unreadable: {e}", kv.key)))
}

/// Builds the transaction that writes `node` (created when `rev` is 0, else only if it still
/// has revision `rev`) and keeps its MAC, name and BMC indexes in step with `old`.
fn node_txn(node: &Node, old: Option<&Node>, rev: Revision) -> Txn {
    let mut txn = Txn::default();
    txn.compare.push(Compare::ModRevision {
        key: format!("{NODES}{}", node.uuid),
        revision: rev,
    });
    txn.success.push(Op::put(
        format!("{NODES}{}", node.uuid),
        serde_json::to_vec(node).unwrap_or_default(),
    ));
    let id = node.uuid.to_string().into_bytes();
    let old_macs: Vec<MacAddr> = old.map(|o| o.macs.clone()).unwrap_or_default();
    for mac in &node.macs {
        if !old_macs.contains(mac) {
            let key = format!("{MACS}{mac}");
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: 0,
            });
            txn.success.push(Op::put(key, id.clone()));
        }
    }
    for mac in &old_macs {
        if !node.macs.contains(mac) {
            txn.success.push(Op::delete(format!("{MACS}{mac}")));
        }
    }
    let mut index = |prefix: &str, new: Option<&str>, old: Option<&str>| {
        if new == old {
            return;
        }
        if let Some(o) = old {
            txn.success.push(Op::delete(format!("{prefix}{o}")));
        }
        if let Some(n) = new {
            let key = format!("{prefix}{n}");
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: 0,
            });
            txn.success.push(Op::put(key, id.clone()));
        }
    };
    index(
        NAMES,
        node.name.as_deref(),
        old.and_then(|o| o.name.as_deref()),
    );
    index(
        BMCS,
        real_bmc(node.bmc_address.as_deref()),
        old.and_then(|o| real_bmc(o.bmc_address.as_deref())),
    );
    txn
}

/// Told after every change of node records (the PXE filter follows them). Awaited before
/// the API call that caused the change returns. `changed` names the nodes whose records
/// changed; empty means "not known: look at every node".
pub trait NodeObserver: Send + Sync {
    fn nodes_changed<'a>(
        &'a self,
        changed: &'a [Uuid],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
}

pub struct Inspector {
    store: Arc<dyn Store>,
    pub config: InspectorConfig,
    observer: std::sync::OnceLock<Arc<dyn NodeObserver>>,
    /// Every MAC's last DHCP answer, so that renewals are counted, not filed one by one.
    last_answers: Mutex<HashMap<MacAddr, LastAnswer>>,
}

/// A node with the revision its record had when read.
pub struct Versioned {
    pub node: Node,
    pub rev: Revision,
}

impl Inspector {
    pub fn new(store: Arc<dyn Store>, config: InspectorConfig) -> Self {
        Inspector {
            store,
            config,
            observer: std::sync::OnceLock::new(),
            last_answers: Mutex::default(),
        }
    }

    /// Sets the observer of node changes (once).
    pub fn observe(&self, observer: Arc<dyn NodeObserver>) {
        let _ = self.observer.set(observer);
    }

    async fn changed(&self, nodes: &[Uuid]) {
        if let Some(o) = self.observer.get() {
            o.nodes_changed(nodes).await;
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    async fn by_index(&self, prefix: &str, key: &str) -> Result<Option<Versioned>> {
        match self.store.get(&format!("{prefix}{key}")).await? {
            Some(kv) => self.get(&String::from_utf8_lossy(&kv.value)).await,
            None => Ok(None),
        }
    }

    /// A node by UUID.
    pub async fn get(&self, uuid: &str) -> Result<Option<Versioned>> {
        match self.store.get(&format!("{NODES}{uuid}")).await? {
            Some(kv) => Ok(Some(Versioned {
                node: parse_node(&kv)?,
                rev: kv.mod_revision,
            })),
            None => Ok(None),
        }
    }

    /// A node by UUID or name.
    pub async fn find(&self, ident: &str) -> Result<Option<Versioned>> {
        if Uuid::parse_str(ident).is_ok()
            && let Some(v) = self.get(&ident.to_ascii_lowercase()).await?
        {
            return Ok(Some(v));
        }
        self.by_index(NAMES, ident).await
    }

    pub async fn by_mac(&self, mac: MacAddr) -> Result<Option<Versioned>> {
        self.by_index(MACS, &mac.to_string()).await
    }

    pub async fn list(&self) -> Result<Vec<Node>> {
        self.store
            .range(NODES)
            .await?
            .iter()
            .map(parse_node)
            .collect()
    }

    /// Creates a node; refuses (409) if a MAC, the name or the BMC address is already taken.
    pub async fn create(&self, node: &Node) -> Result<()> {
        if let Some(n) = &node.name
            && Uuid::parse_str(n).is_ok()
        {
            return Err(InspectorError::bad("a node name cannot be a UUID"));
        }
        let mut txn = node_txn(node, None, 0);
        let at = now_ms();
        txn.success.push(event_op(
            Subject::Node(node.uuid),
            at,
            0,
            "created",
            "node created",
            false,
        ));
        if self.store.txn(txn).await?.succeeded {
            self.changed(&[node.uuid]).await;
            return Ok(());
        }
        for mac in &node.macs {
            if self.store.get(&format!("{MACS}{mac}")).await?.is_some() {
                return Err(InspectorError::new(
                    409,
                    format!("MAC {mac} already belongs to another node"),
                ));
            }
        }
        if let Some(n) = &node.name
            && self.store.get(&format!("{NAMES}{n}")).await?.is_some()
        {
            return Err(InspectorError::new(
                409,
                format!("a node named {n} already exists"),
            ));
        }
        Err(InspectorError::new(
            409,
            "the node conflicts with an existing one (UUID or BMC address)",
        ))
    }

    /// `PATCH /api/v1/nodes/{node}`: a JSON patch with Ironic's semantics ([`patch::patch`])
    /// applied in one compare-and-swap on the node's record and its MAC, name and BMC
    /// indexes; a lost race is retried from a fresh read, a MAC or name another node has is
    /// refused (409).
    pub async fn patch_node(
        &self,
        ident: &str,
        ops: &Value,
        reset_interfaces: Option<bool>,
    ) -> Result<Node> {
        let paths: Vec<&str> = ops
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("path").and_then(Value::as_str))
            .collect();
        let message = format!("node updated: {}", paths.join(", "));
        let opts = patch::Options {
            ident,
            reset_interfaces,
        };
        let res = self
            .update(ident, |node, extra| {
                *node = patch::patch(node, ops, &opts).map_err(|e| InspectorError::bad(e.0))?;
                let seq = rand_seq() % 10_000;
                extra.push(event_op(
                    Subject::Node(node.uuid),
                    now_ms(),
                    seq,
                    "updated",
                    &message,
                    false,
                ));
                Ok(())
            })
            .await;
        let node = match res {
            Ok((node, ())) => node,
            Err(e) if e.status == 409 => {
                return Err(self.taken(ident, ops, &opts).await?.unwrap_or(e));
            }
            Err(e) => return Err(e),
        };
        self.changed(&[node.uuid]).await;
        Ok(node)
    }

    /// Which MAC or name a refused patch wanted that another node has (Ironic's 409s).
    async fn taken(
        &self,
        ident: &str,
        ops: &Value,
        opts: &patch::Options<'_>,
    ) -> Result<Option<InspectorError>> {
        let Some(v) = self.find(ident).await? else {
            return Ok(None);
        };
        let Ok(new) = patch::patch(&v.node, ops, opts) else {
            return Ok(None);
        };
        Ok(self
            .conflict(&v.node, &new)
            .await?
            .map(|c| InspectorError::new(409, c.message())))
    }

    /// The first MAC, name or BMC address `new` has and `old` had not that another node
    /// holds (its index names another UUID).
    async fn conflict(&self, old: &Node, new: &Node) -> Result<Option<Conflict>> {
        let held = |prefix: &str, key: String| {
            let store = self.store.clone();
            let key = format!("{prefix}{key}");
            let me = new.uuid.to_string();
            async move {
                Ok::<_, InspectorError>(
                    store
                        .get(&key)
                        .await?
                        .is_some_and(|kv| kv.value != me.as_bytes()),
                )
            }
        };
        for mac in new.macs.iter().filter(|m| !old.macs.contains(m)) {
            if held(MACS, mac.to_string()).await? {
                return Ok(Some(Conflict::Mac(*mac)));
            }
        }
        if let Some(name) = new.name.as_ref().filter(|n| old.name.as_ref() != Some(*n))
            && held(NAMES, name.clone()).await?
        {
            return Ok(Some(Conflict::Name(name.clone())));
        }
        if let Some(bmc) = real_bmc(new.bmc_address.as_deref())
            .filter(|b| real_bmc(old.bmc_address.as_deref()) != Some(*b))
            && held(BMCS, bmc.to_string()).await?
        {
            return Ok(Some(Conflict::Bmc(bmc.to_string())));
        }
        Ok(None)
    }

    /// Applies `change` to the node's current record in one CAS transaction, retrying on
    /// conflicting writes; `change` may add ops (data, events) to the same transaction.
    async fn update<T>(
        &self,
        ident: &str,
        change: impl FnMut(&mut Node, &mut Vec<Op>) -> Result<T>,
    ) -> Result<(Node, T)> {
        self.update_fenced(ident, None, change).await
    }

    /// [`Inspector::update`] guarded by a leader's fence: the write happens only while the
    /// fence (a compare on the leader key's revision) holds.
    async fn update_fenced<T>(
        &self,
        ident: &str,
        fence: Option<&Compare>,
        mut change: impl FnMut(&mut Node, &mut Vec<Op>) -> Result<T>,
    ) -> Result<(Node, T)> {
        for _ in 0..16 {
            let v = self
                .find(ident)
                .await?
                .ok_or_else(|| InspectorError::not_found(ident))?;
            let old = v.node.clone();
            let mut node = v.node;
            let mut extra = Vec::new();
            let out = change(&mut node, &mut extra)?;
            let mut txn = node_txn(&node, Some(&old), v.rev);
            txn.success.extend(extra);
            txn.compare.extend(fence.cloned());
            if self.store.txn(txn).await?.succeeded {
                return Ok((node, out));
            }
            if let Some(Compare::ModRevision { key, revision }) = fence {
                let now = self.store.get(key).await?.map_or(0, |kv| kv.mod_revision);
                if now != *revision {
                    return Err(InspectorError::new(
                        503,
                        "this host is no longer the leader; the new leader does this work",
                    ));
                }
            }
            if self
                .get(&node.uuid.to_string())
                .await?
                .is_some_and(|cur| cur.rev == v.rev)
            {
                return Err(InspectorError::new(
                    409,
                    "the change conflicts with another node's MAC, name or BMC address",
                ));
            }
        }
        Err(InspectorError::new(
            409,
            "node is busy: too many concurrent changes, try again",
        ))
    }

    /// `POST /v1/introspection/{node}`.
    pub async fn start(&self, ident: &str, manage_boot: bool, now: i64) -> Result<Node> {
        let (node, _) = self
            .update(ident, |node, ops| {
                let state = node.state().unwrap_or(State::Finished);
                // Starting a running introspection again leaves it waiting (as Inspector does).
                let next = match state {
                    State::Waiting | State::Starting => State::Waiting,
                    s => match s.next(Event::Start) {
                        Some(_) => State::Waiting,
                        None => {
                            return Err(InspectorError::bad(format!(
                                "Node {} cannot start introspection in state {}",
                                node.uuid,
                                s.as_str()
                            )));
                        }
                    },
                };
                node.introspection = Some(Introspection {
                    state: next,
                    started_at: Some(now),
                    finished_at: None,
                    error: None,
                    manage_boot,
                });
                ops.push(Op::DeletePrefix {
                    prefix: format!("{DATA}{}/", node.uuid),
                });
                ops.push(event_op(
                    Subject::Node(node.uuid),
                    now * 1000,
                    0,
                    "introspection-started",
                    "introspection started: the node boots the discovery ramdisk at its next PXE boot",
                    false,
                ));
                Ok(())
            })
            .await?;
        self.changed(&[node.uuid]).await;
        Ok(node)
    }

    /// `POST /v1/introspection/{node}/abort`.
    pub async fn abort(&self, ident: &str, now: i64) -> Result<Node> {
        let (node, _) = self
            .update(ident, |node, ops| {
                let intro = node.introspection.as_mut().ok_or_else(|| {
                    InspectorError::bad(format!("Node {} is not being introspected", ident))
                })?;
                if intro.state.next(Event::Abort).is_none() {
                    return Err(InspectorError::bad(format!(
                        "Node {ident} can not be aborted in state {}",
                        intro.state.as_str()
                    )));
                }
                // There is no power step to wait for: aborting ends at once (abort_end).
                intro.state = State::Error;
                intro.finished_at = Some(now);
                intro.error = Some("Canceled by operator".into());
                ops.push(event_op(
                    Subject::Node(node.uuid),
                    now * 1000,
                    0,
                    "introspection-aborted",
                    "Canceled by operator",
                    true,
                ));
                Ok(())
            })
            .await?;
        self.changed(&[node.uuid]).await;
        Ok(node)
    }

    /// `POST /v1/continue`: returns the node's UUID.
    pub async fn process(&self, body: &[u8], now: i64) -> Result<Uuid> {
        let res = self.process_inner(body, now).await;
        // A failure may have marked a node we cannot name here: look at every node.
        match &res {
            Ok(uuid) => self.changed(&[*uuid]).await,
            Err(_) => self.changed(&[]).await,
        }
        res
    }

    async fn process_inner(&self, body: &[u8], now: i64) -> Result<Uuid> {
        let data =
            IntrospectionData::parse(body).map_err(|e| InspectorError::bad(e.to_string()))?;
        let ramdisk_error = hooks::ramdisk_error(&data).err();
        let inventory = data.inventory_checked();
        let interfaces = inventory
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|inv| hooks::validate_interfaces(&data, inv));
        // Lookup attributes: every MAC and the BMC address (or just the PXE MAC when the
        // inventory is unusable, so the node can still be marked as failed).
        let (macs, bmcs): (Vec<MacAddr>, Vec<String>) = match &interfaces {
            Ok(i) => (i.all_macs.clone(), i.bmc.iter().cloned().collect()),
            Err(_) => (
                data.boot_interface
                    .as_deref()
                    .and_then(normalise_mac)
                    .and_then(|m| m.parse().ok())
                    .into_iter()
                    .collect(),
                Vec::new(),
            ),
        };
        if macs.is_empty() && bmcs.is_empty() {
            // Inspector runs its `ramdisk_error` hook first: what the ramdisk said is the
            // cause the operator needs, not the inventory it could therefore not send.
            let why = ramdisk_error
                .or(interfaces.err())
                .unwrap_or_else(|| "no lookup attributes".into());
            return Err(InspectorError::bad(why));
        }
        let pre_failure = ramdisk_error.or(interfaces.as_ref().err().cloned());
        for _ in 0..16 {
            // Candidates: every node matching any attribute.
            let mut known: Vec<Versioned> = Vec::new();
            for mac in &macs {
                if let Some(v) = self.by_mac(*mac).await?
                    && !known.iter().any(|k| k.node.uuid == v.node.uuid)
                {
                    known.push(v);
                }
            }
            for b in &bmcs {
                if let Some(v) = self.by_index(BMCS, b).await?
                    && !known.iter().any(|k| k.node.uuid == v.node.uuid)
                {
                    known.push(v);
                }
            }
            let bmc_refs: Vec<&str> = bmcs.iter().map(String::as_str).collect();
            let active = known
                .iter()
                .filter(|k| k.node.inspecting())
                .map(|k| &k.node);
            let found = match lookup(active, &macs, &bmc_refs) {
                Lookup::Found(u) => known.into_iter().find(|k| k.node.uuid == u),
                Lookup::Tie(nodes) => {
                    return Err(InspectorError::bad(format!(
                        "Multiple nodes match the same number of attributes: {}",
                        nodes
                            .iter()
                            .map(Uuid::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                Lookup::NotFound => {
                    if let Some(k) = known.first() {
                        // Déjà vu: the same data posted again after success is answered again.
                        if let Some(prev) = self
                            .store
                            .get(&format!("{DATA}{}/unprocessed", k.node.uuid))
                            .await?
                            && prev.value == body
                            && k.node.state() == Some(State::Finished)
                        {
                            return Ok(k.node.uuid);
                        }
                        let state = k.node.state().map_or("never introspected", State::as_str);
                        let msg = format!(
                            "Node {} is not under introspection (state: {state}); start an introspection first",
                            k.node.uuid
                        );
                        self.event(Subject::Node(k.node.uuid), "inventory-refused", &msg, true)
                            .await?;
                        return Err(InspectorError::bad(msg));
                    }
                    None
                }
            };
            let (node, rev, enrolled) = match found {
                Some(v) => (v.node, v.rev, false),
                None if self.config.auto_enrol => {
                    let mut node = Node::new(Uuid::new_v4(), now);
                    node.macs = macs.clone();
                    if let Ok(i) = &interfaces {
                        node.pxe_mac = i.pxe_mac;
                        node.bmc_address = i.bmc.clone();
                    }
                    // Inspector's `enroll` hook: its default driver, the BMC as ipmi_address.
                    node.driver = Some(ENROLL_DRIVER.into());
                    node.bmc.ipmi.address = node.bmc_address.clone();
                    node.auto_discovered = true;
                    node.introspection = Some(Introspection {
                        state: State::Enrolling,
                        started_at: Some(now),
                        finished_at: None,
                        error: None,
                        manage_boot: false,
                    });
                    (node, 0, true)
                }
                None => {
                    return Err(InspectorError::bad(format!(
                        "Look up error: Could not find a node for attributes {{'bmc_address': {bmcs:?}, 'mac': {:?}}} (auto-enrolment is off)",
                        macs.iter().map(MacAddr::to_string).collect::<Vec<_>>()
                    )));
                }
            };
            match self
                .finish_processing(&data, body, node, rev, enrolled, pre_failure.clone(), now)
                .await?
            {
                Some(Ok(uuid)) => return Ok(uuid),
                Some(Err(e)) => return Err(e),
                None => continue, // lost a race with another writer: look up again
            }
        }
        Err(InspectorError::new(
            409,
            "node is busy: too many concurrent changes, try again",
        ))
    }

    /// Runs the post-lookup steps and writes the result in one transaction. `None`: the
    /// node changed underneath (retry); `Some(Err)`: processing failed and the node was
    /// marked so.
    #[allow(clippy::too_many_arguments)]
    async fn finish_processing(
        &self,
        data: &IntrospectionData,
        body: &[u8],
        old: Node,
        rev: Revision,
        enrolled: bool,
        pre_failure: Option<String>,
        now: i64,
    ) -> Result<Option<Result<Uuid>>> {
        let mut node = old.clone();
        let uuid = node.uuid;
        let at = now * 1000;
        let mut ops = vec![Op::put(format!("{DATA}{uuid}/unprocessed"), body.to_vec())];
        let mut seq = 0;
        let mut log = |ops: &mut Vec<Op>, kind: &str, msg: &str, error: bool| {
            seq += 1;
            ops.push(event_op(Subject::Node(uuid), at, seq, kind, msg, error));
        };
        if enrolled {
            log(
                &mut ops,
                "enrolled",
                "unknown machine enrolled from its inventory",
                false,
            );
        }
        log(&mut ops, "inventory-received", "inventory received", false);
        let state = node.state().unwrap_or(State::Finished);
        let outcome: std::result::Result<(), String> = (|| {
            if let Some(e) = pre_failure {
                return Err(e);
            }
            // `process` is strict: only from waiting or enrolling.
            if state.next(Event::Process).is_none() {
                return Err(format!(
                    "no defined transition for event process from state {}",
                    state.as_str()
                ));
            }
            let inv = data.inventory_checked().map_err(|e| e.to_string())?;
            let ifaces = hooks::validate_interfaces(data, inv)?;
            let hints = node.properties.get("root_device");
            let root = hooks::root_disk_selection(data, inv, hints)?;
            let hinted = hints
                .and_then(Value::as_object)
                .is_some_and(|h| !h.is_empty());
            // Rules see the body as posted, not as Paddock's types read it.
            let raw: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let processed = hooks::processed(&raw, &ifaces, root.as_ref(), hinted, enrolled);
            node.properties.extend(hooks::properties(&processed));
            let caps = hooks::capabilities(inv);
            if !caps.is_empty() {
                let merged = update_capabilities(node.properties.get("capabilities"), &caps)
                    .map_err(|e| rules::unexpected(&e))?;
                node.properties.insert("capabilities".into(), json!(merged));
            }
            for m in &ifaces.all_macs {
                if !node.macs.contains(m) {
                    node.macs.push(*m);
                }
            }
            node.pxe_mac = ifaces.pxe_mac.or(node.pxe_mac);
            if node.bmc_address.is_none() {
                node.bmc_address = ifaces.bmc.clone();
            }
            log(
                &mut ops,
                "hooks",
                "processing hooks ran: validate_interfaces, root_disk_selection, scheduler, capabilities",
                false,
            );
            ops.push(Op::put(
                format!("{DATA}{uuid}/processed"),
                serde_json::to_vec(&processed).unwrap_or_default(),
            ));
            Ok(())
        })();
        let outcome = match outcome {
            Ok(()) => {
                let rules = self.rules().await?;
                let processed: Value = serde_json::from_slice(
                    ops.iter()
                        .find_map(|o| match o {
                            Op::Put { key, value, .. } if key.ends_with("/processed") => {
                                Some(value.as_slice())
                            }
                            _ => None,
                        })
                        .unwrap_or(b"{}"),
                )
                .unwrap_or(Value::Null);
                // A failing rule leaves the changes made before it, as Inspector's do.
                let applied = rules::apply(&rules, &processed, &node);
                let before_rules = std::mem::replace(&mut node, applied.node);
                let mut failure = applied.failure;
                // A MAC or name another node has: Ironic refuses the PATCH (409), Inspector
                // fails the processing; the node keeps its own.
                while let Some(c) = self.conflict(&before_rules, &node).await? {
                    c.revert(&mut node, &before_rules);
                    failure.get_or_insert_with(|| {
                        format!(
                            "Unexpected exception ConflictException during processing: {}",
                            c.message()
                        )
                    });
                }
                if !applied.matched.is_empty() {
                    log(
                        &mut ops,
                        "rules",
                        &format!("rules applied: {}", applied.matched.join(", ")),
                        false,
                    );
                }
                failure.map_or(Ok(()), Err)
            }
            Err(e) => Err(e),
        };
        let intro = node.introspection.get_or_insert(Introspection {
            state,
            started_at: Some(now),
            finished_at: None,
            error: None,
            manage_boot: false,
        });
        intro.finished_at = Some(now);
        match &outcome {
            Ok(()) => {
                intro.state = State::Finished;
                intro.error = None;
                log(
                    &mut ops,
                    "introspection-finished",
                    "introspection finished",
                    false,
                );
            }
            Err(e) => {
                intro.state = State::Error;
                intro.error = Some(e.clone());
                log(&mut ops, "introspection-failed", e, true);
            }
        }
        let mut txn = node_txn(&node, (!enrolled).then_some(&old), rev);
        txn.success.extend(ops);
        if !self.store.txn(txn).await?.succeeded {
            return Ok(None);
        }
        tracing::info!(node = %uuid, enrolled, result = ?outcome, "inspector: inventory processed");
        Ok(Some(outcome.map(|_| uuid).map_err(InspectorError::bad)))
    }

    /// Stored data: processed (`/data`) or as posted (`/data/unprocessed`).
    pub async fn data(&self, ident: &str, processed: bool) -> Result<Vec<u8>> {
        let v = self
            .find(ident)
            .await?
            .ok_or_else(|| InspectorError::not_found(ident))?;
        let which = if processed {
            "processed"
        } else {
            "unprocessed"
        };
        self.store
            .get(&format!("{DATA}{}/{which}", v.node.uuid))
            .await?
            .map(|kv| kv.value)
            .ok_or_else(|| {
                InspectorError::new(
                    404,
                    format!("Introspection data not found for node {}", v.node.uuid),
                )
            })
    }

    /// `POST /v1/introspection/{node}/data/unprocessed`: process stored (or given) data again.
    pub async fn reapply(&self, ident: &str, body: Option<Value>, now: i64) -> Result<()> {
        let v = self
            .find(ident)
            .await?
            .ok_or_else(|| InspectorError::not_found(ident))?;
        let raw = match body {
            Some(Value::Object(o)) => serde_json::to_vec(&Value::Object(o)).unwrap_or_default(),
            Some(_) => return Err(InspectorError::bad("Invalid data: expected a JSON object")),
            None => self.data(ident, false).await?,
        };
        let state = v.node.state().unwrap_or(State::Finished);
        if state.next(Event::Reapply).is_none() {
            return Err(InspectorError::new(
                409,
                format!("Node {} is busy (state {})", v.node.uuid, state.as_str()),
            ));
        }
        let data =
            IntrospectionData::parse(&raw).map_err(|e| InspectorError::bad(e.to_string()))?;
        let mut node = v.node.clone();
        if let Some(i) = node.introspection.as_mut() {
            i.state = State::Waiting;
        }
        let pre = hooks::ramdisk_error(&data).err();
        let res = match self
            .finish_processing(&data, &raw, node, v.rev, false, pre, now)
            .await?
        {
            None => Err(InspectorError::new(
                409,
                "node changed during reapply, try again",
            )),
            Some(_) => Ok(()),
        };
        self.changed(&[v.node.uuid]).await;
        res
    }

    /// Ends introspections that ran past the timeout; returns how many.
    pub async fn expire(&self, now: i64) -> Result<usize> {
        self.expire_fenced(now, None).await
    }

    /// [`Inspector::expire`] as leader-only work: every write carries the leader's fence.
    pub async fn expire_fenced(&self, now: i64, fence: Option<&Compare>) -> Result<usize> {
        let mut expired = Vec::new();
        for node in self.list().await? {
            let overdue = node.introspection.as_ref().is_some_and(|i| {
                i.state.is_active()
                    && i.started_at
                        .is_some_and(|s| s + self.config.timeout_secs <= now)
            });
            if !overdue {
                continue;
            }
            let res = self
                .update_fenced(&node.uuid.to_string(), fence, |node, ops| {
                    let Some(i) = node.introspection.as_mut() else {
                        return Ok(false);
                    };
                    if !i.state.is_active() || i.state.next(Event::Timeout).is_none() {
                        return Ok(false); // someone finished it meanwhile
                    }
                    i.state = State::Error;
                    i.finished_at = Some(now);
                    i.error = Some("Introspection timeout".into());
                    ops.push(event_op(
                        Subject::Node(node.uuid),
                        now * 1000,
                        0,
                        "introspection-timeout",
                        "Introspection timeout",
                        true,
                    ));
                    Ok(true)
                })
                .await;
            match res {
                Ok((_, true)) => expired.push(node.uuid),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node = %node.uuid, error = %e, "inspector: timeout not recorded")
                }
            }
        }
        if !expired.is_empty() {
            self.changed(&expired).await;
        }
        Ok(expired.len())
    }

    /// What a ramdisk should do now.
    pub async fn next_action(&self, ident: &str) -> Result<NextAction> {
        let v = self
            .find(ident)
            .await?
            .ok_or_else(|| InspectorError::not_found(ident))?;
        Ok(if v.node.inspecting() {
            NextAction::Wait
        } else {
            self.config.after_inspection
        })
    }

    // ---- rules ----

    /// Every rule, in creation order (the store's, so rules created in the same second, as
    /// a rules file imports them, keep their order), which is the order they apply in.
    pub async fn rules(&self) -> Result<Vec<Rule>> {
        let mut kvs = self.store.range(RULES).await?;
        kvs.sort_by_key(|kv| kv.create_revision);
        kvs.iter()
            .map(|kv| {
                serde_json::from_slice(&kv.value).map_err(|e| {
                    InspectorError::new(500, format!("rule {} is unreadable: {e}", kv.key))
                })
            })
            .collect()
    }

    pub async fn rule(&self, uuid: &str) -> Result<Rule> {
        let kv = self
            .store
            .get(&format!("{RULES}{uuid}"))
            .await?
            .ok_or_else(|| InspectorError::new(404, format!("Rule {uuid} was not found")))?;
        serde_json::from_slice(&kv.value).map_err(|e| InspectorError::new(500, e.to_string()))
    }

    pub async fn create_rule(&self, body: &Value, now: i64) -> Result<Rule> {
        rules::validate(body).map_err(InspectorError::bad)?;
        // An empty UUID is none (`if body.get('uuid')`).
        let uuid = match body
            .get("uuid")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
        {
            Some(u) => Uuid::parse_str(u)
                .map_err(|_| InspectorError::bad(format!("Invalid UUID value {u}")))?,
            None => Uuid::new_v4(),
        };
        let fill = |c: &Value| {
            let mut c = c.clone();
            if let Value::Object(m) = &mut c {
                m.entry("invert").or_insert(json!(false));
                m.entry("multiple").or_insert(json!("any"));
            }
            c
        };
        let rule = Rule {
            uuid,
            description: body
                .get("description")
                .and_then(Value::as_str)
                .map(String::from),
            scope: body.get("scope").and_then(Value::as_str).map(String::from),
            conditions: body
                .get("conditions")
                .and_then(Value::as_array)
                .map(|c| c.iter().map(fill).collect())
                .unwrap_or_default(),
            actions: body["actions"].as_array().cloned().unwrap_or_default(),
            created_at: now,
        };
        let created = self
            .store
            .create(
                &format!("{RULES}{uuid}"),
                serde_json::to_vec(&rule).unwrap_or_default(),
            )
            .await?;
        if !created {
            return Err(InspectorError::new(
                409,
                format!("Rule with UUID {uuid} already exists"),
            ));
        }
        Ok(rule)
    }

    pub async fn delete_rule(&self, uuid: &str) -> Result<()> {
        let txn = Txn {
            compare: vec![Compare::ModRevision {
                key: format!("{RULES}{uuid}"),
                revision: 0,
            }],
            success: vec![],
            failure: vec![Op::delete(format!("{RULES}{uuid}"))],
        };
        if self.store.txn(txn).await?.succeeded {
            return Err(InspectorError::new(
                404,
                format!("Rule {uuid} was not found"),
            ));
        }
        Ok(())
    }

    pub async fn delete_rules(&self) -> Result<()> {
        self.store
            .txn(Txn {
                success: vec![Op::DeletePrefix {
                    prefix: RULES.into(),
                }],
                ..Txn::default()
            })
            .await?;
        Ok(())
    }

    // ---- timeline ----

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
            return Err(InspectorError::new(
                503,
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
fn rand_seq() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn now_secs() -> i64 {
    now_ms() / 1000
}

#[cfg(test)]
mod timeline_tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);

    /// An answer giving 198.18.0.`host` and `undionly.kpxe`.
    fn answer(reply: DhcpReply, host: u8) -> DhcpAnswer {
        DhcpAnswer {
            mac: MAC,
            reply,
            ip: Ipv4Addr::new(198, 18, 0, host),
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
        });
        let mut running = Node::new(Uuid::from_u128(2), 0);
        running.introspection = Some(Introspection {
            state: State::Waiting,
            started_at: Some(30),
            finished_at: None,
            error: None,
            manage_boot: true,
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
