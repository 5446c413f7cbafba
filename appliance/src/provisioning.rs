//! Provisioning in the appliance: each node's provisioning record, the operator's
//! requests, the ramdisk agent's protocol, the dominator's "synced", and the inspection rule
//! `set-image`. Every transition is decided by the birther's pure state machine
//! ([`Provisioning::apply`]); this module reads and writes the store around it.
//!
//! | key | value |
//! |---|---|
//! | `provisioning/<node uuid>` | [`Provisioning`] (JSON): the state, since when, last change |
//! | `provisioning-rules/<node uuid>` | [`WishTaken`]: the introspection whose `set-image` was acted on |
//!
//! Every change of a record is one compare-and-swap transaction on its mod revision (a lost
//! race is retried from a fresh read), with the transition's summary filed on the node's
//! timeline in the same transaction. A request the state refuses changes nothing (409 with
//! the state machine's message).
//!
//! Routes: operators `POST /api/v1/nodes/{node}/provision {"image"}`, `…/reimage
//! {"image"?}`, `…/clean`, `GET /api/v1/nodes/{node}/provisioning`; the agent
//! ([`paddock_birther::protocol`]) `POST /api/v1/provision/next`, `POST
//! /api/v1/provision/{node}/report`, `POST /api/v1/provision/{node}/register`, `GET
//! /api/v1/provision/{node}`.
//!
//! **`set-image`.** The inspector's rule action records the image on the introspection
//! ([`paddock_inspector::node::Introspection::set_image`]); it knows nothing of provisioning.
//! [`RuleWishes`], a node observer, sees the introspection finish (observers run before
//! `/v1/continue` answers, so the agent's next question already finds the node in `birth`)
//! and applies [`Event::ProvisionRequested`]; `provision/next` does the same if the observer
//! has not (another host, a store error). Which introspection's wish was acted on is kept
//! under `provisioning-rules/`, written in the record's transaction, so a wish is acted on
//! once: a node cleaned later is not provisioned again until a new introspection's rules
//! say so. A wish that cannot apply (the image is missing, the node is already provisioned)
//! is filed on the timeline as an error and not tried again.
//!
//! **The dominator's "synced".** While this host leads, [`start`] looks at the census
//! whenever a sub turns synced (and every second): a sub synced to the image of a node in
//! `birth` or `rebirth` (the sub named by the node's hostname, after the run registered)
//! gives [`Event::SubdSynced`] ([`synced_events`], pure). The ramdisk waiting for it asks
//! for its record with `?wait_sync_secs=N`: the answer is held until the record changes
//! (or N s pass), so the ramdisk learns of the sync as soon as it is stored.
//!
//! **Timeouts.** A run's clock starts at its first report from the ramdisk: `provision/next`
//! answering a mode applies [`Event::RunStarted`] (the time goes into the record's
//! `started_ms`), as does its first step. While this host leads, [`expire_runs`] looks every
//! [`expire_every`] (a tenth of the timeout, 1–30 s) for runs that have gone without a report for longer than `[provisioning]
//! step_timeout_secs` (`sync_timeout_secs` while the dominator syncs) and ends them in error
//! at the step that was due ([`Provisioning::expire`], pure): one fenced compare-and-swap
//! each, so a report that lands meanwhile wins. A node whose machine has not booted the
//! ramdisk yet (powered off) never times out.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_birther::protocol::{NextAnswer, NextRequest, RegisterRequest, ReportRequest};
use paddock_birther::{
    Event, Operation, Provisioning, Serve, Step, Timeouts, Transition, TransitionError,
};
use paddock_clock::Clock;
use paddock_image::Machine;
use paddock_imageserver::images::{ImageRecord, ImageServer};
use paddock_imageserver::mdb::{MdbService, Source};
use paddock_inspector::api::Speaker;
use paddock_inspector::node::Node;
use paddock_inspector::service::{
    Changed, Inspector, NodeObserver, Reaction, Subject, timeline_op,
};
use paddock_inventory::MacAddr;
use paddock_store::{Compare, Op, Revision, Store, StoreError, Txn};
use paddock_wire::ApiError;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const PREFIX: &str = "provisioning/";
pub const RULES: &str = "provisioning-rules/";
/// The timeline entries' kind.
const KIND: &str = "provisioning";

/// The introspection whose `set-image` wish was acted on (or found not to apply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WishTaken {
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub image: String,
}

/// The hostname of a node's installed system and of its MDB entry: its name, else
/// `node-<first 8 hex digits of its UUID>`.
pub fn hostname(node: &Node) -> String {
    match &node.name {
        Some(n) => n.clone(),
        None => format!("node-{}", &node.uuid.simple().to_string()[..8]),
    }
}

/// The 8 hex digits of `node-<8 hex>`, the hostname of a node without a name ([`hostname`]).
pub fn unnamed_hostname(host: &str) -> Option<&str> {
    let hex = host.strip_prefix("node-")?;
    let ok = hex.len() == 8 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then_some(hex)
}

/// The unnamed nodes by their hostnames (`node-<8 hex>`); two nodes whose UUIDs share the
/// first 8 hex digits are ambiguous and left out.
pub fn unnamed_hostnames(nodes: &[Node]) -> BTreeMap<String, Uuid> {
    let mut out = BTreeMap::new();
    let mut ambiguous = std::collections::BTreeSet::new();
    for n in nodes.iter().filter(|n| n.name.is_none()) {
        let host = hostname(n);
        if out.insert(host.clone(), n.uuid).is_some() {
            ambiguous.insert(host);
        }
    }
    out.retain(|h, _| !ambiguous.contains(h));
    out
}

/// The node a machine's hostname names (the dominator's timeline): its name or UUID, else the
/// unnamed node whose hostname is `node-<8 hex>`. Unnamed hostnames are learnt from one list
/// of the nodes and remembered, so a fleet of unnamed machines costs one list, not one per
/// change; a hostname not remembered (a node enrolled since) lists again.
#[derive(Default)]
pub struct NodesByHostname {
    unnamed: BTreeMap<String, Uuid>,
}

impl NodesByHostname {
    pub async fn find(
        &mut self,
        inspector: &Inspector,
        host: &str,
    ) -> std::result::Result<Option<Node>, paddock_inspector::service::InspectorError> {
        if let Some(v) = inspector.find(host).await? {
            return Ok(Some(v.node));
        }
        if unnamed_hostname(host).is_none() {
            return Ok(None);
        }
        if let Some(uuid) = self.unnamed.get(host)
            && let Some(v) = inspector.get(&uuid.to_string()).await?
            && hostname(&v.node) == host
        {
            return Ok(Some(v.node));
        }
        let nodes = inspector.list().await?;
        self.unnamed = unnamed_hostnames(&nodes);
        let uuid = self.unnamed.get(host).copied();
        Ok(nodes.into_iter().find(|n| Some(n.uuid) == uuid))
    }
}

/// The `set-image` wish of the node's last introspection, if it finished and its wish has
/// not been acted on yet (`taken`: what was).
pub fn rule_wish(node: &Node, taken: Option<&WishTaken>) -> Option<WishTaken> {
    let intro = node.introspection.as_ref()?;
    if intro.state != paddock_inspector::state::State::Finished {
        return None;
    }
    let wish = WishTaken {
        started_at: intro.started_at,
        finished_at: intro.finished_at,
        image: intro.set_image.clone()?,
    };
    let same =
        taken.is_some_and(|t| t.started_at == wish.started_at && t.finished_at == wish.finished_at);
    (!same).then_some(wish)
}

/// What `provision/next` answers for `node` with its `record` (`image`: the run's image
/// record, when there is a run; `computed`: the paths every machine gets as computed files,
/// which the dominator places in the run's sync: the filter given to subd keeps no line
/// naming only one of them, and the ramdisk writes none of them).
pub fn next_answer(
    node: &Node,
    record: &Provisioning,
    image: Option<&ImageRecord>,
    appliance_url: &str,
    subd_port: u16,
    computed: &[String],
) -> NextAnswer {
    let (mode, run_image) = match record.serve() {
        Serve::BirthRamdisk { image } => (Some(Operation::Birth), Some(image)),
        Serve::RebirthRamdisk { image } => (Some(Operation::Rebirth), Some(image)),
        Serve::CleanRamdisk => (Some(Operation::Clean), None),
        Serve::InspectionRamdisk | Serve::LocalDisk => (None, None),
    };
    let image = image.filter(|r| Some(&r.name) == run_image.as_ref());
    NextAnswer {
        node: Some(node.uuid.to_string()),
        mode,
        image: run_image,
        image_bytes: image.map_or(0, |r| r.bytes),
        hostname: hostname(node),
        root_device_hints: node
            .properties
            .get("root_device")
            .filter(|h| !h.is_null())
            .cloned(),
        subd_port,
        filter: image
            .and_then(|r| r.filter.as_ref())
            .map(|f| paddock_dominator::without_lines_naming(f.lines(), computed))
            .unwrap_or_default(),
        computed: match image {
            Some(_) => computed.to_vec(),
            None => Vec::new(),
        },
        appliance_url: appliance_url.to_string(),
        subd_trust: None,
    }
}

/// The dominator's census as provisioning reads it: hostname → the image its sub is synced
/// to.
pub type Synced = BTreeMap<String, String>;

/// Whether the record's run has registered its sub and waits for the dominator's sync.
pub fn waits_for_sync(p: &Provisioning) -> bool {
    match &p.state {
        paddock_birther::State::Birth(r) | paddock_birther::State::Rebirth(r) => {
            !r.synced && r.last_step.is_some_and(|s| s >= Step::Register)
        }
        _ => false,
    }
}

/// Which runs the census says are synced: a node in `birth` or `rebirth`, not synced yet,
/// whose run has registered its subd (before that, the census may still speak of the
/// system the run replaces), and whose hostname's sub is synced to the run's image.
/// `runs`: (node, its hostname, its record).
pub fn synced_events(synced: &Synced, runs: &[(Uuid, String, Provisioning)]) -> Vec<(Uuid, Event)> {
    runs.iter()
        .filter_map(|(uuid, host, record)| {
            let run = match &record.state {
                paddock_birther::State::Birth(r) | paddock_birther::State::Rebirth(r) => r,
                _ => return None,
            };
            let registered = run.last_step.is_some_and(|s| s >= Step::Register);
            (registered && !run.synced && synced.get(host) == Some(&run.image)).then(|| {
                (
                    *uuid,
                    Event::SubdSynced {
                        image: run.image.clone(),
                    },
                )
            })
        })
        .collect()
}

/// The MDB entry `register` puts: `existing` (its tags, owner groups and operator flags
/// kept) or a new one, with the address, the run's image as RequiredImage and the
/// `NodeUuid` tag. The address must be an IP address (the dominator connects to it).
pub fn register_machine(
    existing: Option<Machine>,
    hostname: &str,
    address: &str,
    image: &str,
    node: Uuid,
) -> std::result::Result<Machine, ProvisionError> {
    let ip: IpAddr = address
        .trim()
        .parse()
        .map_err(|_| ProvisionError::NotAnAddress(address.to_string()))?;
    let mut m = existing.unwrap_or_default();
    m.hostname = hostname.to_string();
    m.ip_address = ip.to_string();
    m.required_image = image.to_string();
    m.tags.insert("NodeUuid".into(), node.to_string());
    Ok(m)
}

/// Why a provisioning call failed; [`ApiError`] gives each its status.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("no node {0}")]
    NoNode(String),
    #[error("no image {0:?}: add it first (paddock image add)")]
    NoImage(String),
    /// The state machine refuses the event; nothing changed.
    #[error(transparent)]
    Refused(#[from] TransitionError),
    #[error("{0}")]
    BadRequest(String),
    #[error("address {0:?} is not an IP address")]
    NotAnAddress(String),
    #[error("the provisioning record of node {0} changed too often underneath; try again")]
    Busy(Uuid),
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for ProvisionError {
    fn from(e: StoreError) -> Self {
        ProvisionError::Internal(format!("store: {e}"))
    }
}

impl From<ProvisionError> for ApiError {
    fn from(e: ProvisionError) -> Self {
        let status = match &e {
            ProvisionError::NoNode(_) | ProvisionError::NoImage(_) => 404,
            ProvisionError::Refused(TransitionError::BadImage(_))
            | ProvisionError::BadRequest(_)
            | ProvisionError::NotAnAddress(_) => 400,
            ProvisionError::Refused(_) | ProvisionError::Busy(_) => 409,
            ProvisionError::Internal(_) => 500,
        };
        ApiError::new(status, e.to_string())
    }
}

type Result<T> = std::result::Result<T, ProvisionError>;

/// The provisioning service: records, requests, the agent's protocol.
pub struct Provisioner {
    pub store: Arc<dyn Store>,
    pub inspector: Arc<Inspector>,
    pub images: Arc<ImageServer>,
    pub mdb: Arc<MdbService>,
    /// Given to the agent (`appliance_url`).
    pub public_url: String,
    /// Where subd listens (`[dominator] subd_port`).
    pub subd_port: u16,
    /// How long a run may go without a report (`[provisioning]`).
    pub timeouts: Timeouts,
    /// Issues subd's certificate for the machines it provisions (TLS on).
    pub security: Option<Arc<crate::security::Security>>,
    /// Reboots a node with a BMC into the ramdisk when an operator starts a run.
    pub power: Option<Arc<crate::power::Power>>,
    /// When a run's steps are stamped (the system's; a manual one in tests).
    pub clock: Arc<dyn Clock>,
    /// The paths every machine gets as computed files: the dominator places them in the
    /// run's sync, so the ramdisk neither excludes nor writes them.
    pub computed: Option<Arc<dyn ComputedPaths>>,
}

/// Which computed files every machine has (the spec's own `[[files]]`).
#[async_trait::async_trait]
pub trait ComputedPaths: Send + Sync {
    async fn every_machines(&self) -> Vec<String>;
}

/// One write: the record's transition, and the wish it acts on.
struct Write<'a> {
    node: Uuid,
    record_rev: Revision,
    transition: Option<&'a Transition>,
    wish: Option<(Revision, &'a WishTaken)>,
    /// A timeline entry of its own (a wish that could not apply).
    note: Option<String>,
    /// Leader-only writes: the leader key's revision.
    fence: Option<Compare>,
}

impl Provisioner {
    async fn node(&self, ident: &str) -> Result<Node> {
        self.inspector
            .find(ident)
            .await
            .map_err(|e| ProvisionError::Internal(e.message))?
            .map(|v| v.node)
            .ok_or_else(|| ProvisionError::NoNode(ident.to_string()))
    }

    /// The node's record and its revision; a node with none is `unknown` since it was
    /// created (revision 0: absent).
    pub async fn record(&self, node: &Node) -> Result<(Provisioning, Revision)> {
        match self.store.get(&format!("{PREFIX}{}", node.uuid)).await? {
            Some(kv) => {
                let p = serde_json::from_slice(&kv.value).map_err(|e| {
                    ProvisionError::Internal(format!("provisioning record {}: {e}", kv.key))
                })?;
                Ok((p, kv.mod_revision))
            }
            None => {
                let created = u64::try_from(node.created_at).unwrap_or(0) * 1000;
                Ok((Provisioning::new(created), 0))
            }
        }
    }

    /// The node's record; while its run waits for subd's sync, held until the record
    /// changes or `wait` passes (the ramdisk then learns of the sync when it is stored, not
    /// at its next poll).
    pub async fn record_when_changed(&self, node: &Node, wait: Duration) -> Result<Provisioning> {
        if wait.is_zero() {
            return Ok(self.record(node).await?.0);
        }
        // The watch replays from the store's revision before the read, so a change between
        // the read and the watch is not missed, whenever the store starts delivering.
        let from = self.store.revision().await? + 1;
        let (record, _) = self.record(node).await?;
        if !waits_for_sync(&record) {
            return Ok(record);
        }
        let key = format!("{PREFIX}{}", node.uuid);
        let Ok(mut changes) = self.store.watch(&key, from).await else {
            // No watch (its start compacted away): answered at once, read again later.
            return Ok(record);
        };
        // Any event, an error or the watch ending: read again.
        let _ = tokio::time::timeout(wait, changes.next()).await;
        Ok(self.record(node).await?.0)
    }

    /// What the node's boot script serves; `None`: the node has no record (it boots as it
    /// always did).
    pub async fn serve(&self, node: Uuid) -> Result<Option<Serve>> {
        let Some(kv) = self.store.get(&format!("{PREFIX}{node}")).await? else {
            return Ok(None);
        };
        let p: Provisioning = serde_json::from_slice(&kv.value).map_err(|e| {
            ProvisionError::Internal(format!("provisioning record {}: {e}", kv.key))
        })?;
        Ok(Some(p.serve()))
    }

    async fn image(&self, name: &str) -> Result<ImageRecord> {
        match self.images.record(name).await {
            Ok(Some(r)) if !r.deleted => Ok(r),
            Ok(_) => Err(ProvisionError::NoImage(name.to_string())),
            Err(e) => Err(ProvisionError::Internal(e.to_string())),
        }
    }

    /// Writes one change in one transaction; `false`: a compare failed (retry).
    async fn write(&self, w: Write<'_>) -> Result<bool> {
        let mut txn = Txn::default();
        txn.compare.extend(w.fence);
        if let Some(t) = w.transition {
            let key = format!("{PREFIX}{}", w.node);
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: w.record_rev,
            });
            let value = serde_json::to_vec(&t.record)
                .map_err(|e| ProvisionError::Internal(e.to_string()))?;
            txn.success.push(Op::put(key, value));
            let error = matches!(t.record.state, paddock_birther::State::Error { .. });
            txn.success
                .push(timeline_op(Subject::Node(w.node), KIND, &t.summary, error));
        }
        if let Some((rev, wish)) = w.wish {
            let key = format!("{RULES}{}", w.node);
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: rev,
            });
            let value =
                serde_json::to_vec(wish).map_err(|e| ProvisionError::Internal(e.to_string()))?;
            txn.success.push(Op::put(key, value));
        }
        if let Some(note) = &w.note {
            txn.success
                .push(timeline_op(Subject::Node(w.node), KIND, note, true));
        }
        if txn.success.is_empty() {
            return Ok(true);
        }
        Ok(self.store.txn(txn).await?.succeeded)
    }

    /// Applies `event` to the node's record: one compare-and-swap, retried from a fresh read
    /// when the record changed underneath. With `check_image`, a transition that starts a
    /// run needs its image in the image server (else nothing changes). A repeat changes
    /// nothing and writes nothing.
    pub async fn apply(&self, node: &Node, event: &Event, check_image: bool) -> Result<Transition> {
        for _ in 0..10 {
            let (current, rev) = self.record(node).await?;
            let t = current.apply(event, self.now_ms())?;
            if !t.changed {
                return Ok(t);
            }
            if check_image && let Some(image) = t.record.state.image() {
                self.image(image).await?;
            }
            let w = Write {
                node: node.uuid,
                record_rev: rev,
                transition: Some(&t),
                wish: None,
                note: None,
                fence: None,
            };
            if self.write(w).await? {
                tracing::info!(node = %node.uuid, summary = %t.summary, "provisioning");
                return Ok(t);
            }
        }
        Err(ProvisionError::Busy(node.uuid))
    }

    /// An operator's request (the API and the console alike): the node by UUID or name, then
    /// `event` through [`Provisioner::apply`] with the image checked.
    pub async fn request(&self, ident: &str, event: &Event) -> Result<(Node, Transition)> {
        let node = self.node(ident).await?;
        let t = self.apply(&node, event, true).await?;
        // A node in the ramdisk already (under introspection) goes on in the same boot.
        if let (true, Some(mode), Some(power)) = (
            t.changed && !node.inspecting(),
            t.record.serve().ramdisk_mode(),
            &self.power,
        ) {
            crate::power::boot_ramdisk(power, &node, &format!("provisioning: {mode}")).await;
        }
        Ok((node, t))
    }

    /// Acts on the `set-image` wish of the node's finished introspection, once: the node
    /// goes `unknown → birth` with the image, or the reason it cannot is filed on its
    /// timeline. Returns whether the record changed.
    pub async fn take_wish(&self, node: &Node) -> Result<bool> {
        if node
            .introspection
            .as_ref()
            .and_then(|i| i.set_image.as_ref())
            .is_none()
        {
            return Ok(false);
        }
        for _ in 0..10 {
            let marker = self.store.get(&format!("{RULES}{}", node.uuid)).await?;
            let taken: Option<WishTaken> = marker
                .as_ref()
                .and_then(|kv| serde_json::from_slice(&kv.value).ok());
            let Some(wish) = rule_wish(node, taken.as_ref()) else {
                return Ok(false);
            };
            let marker_rev = marker.map_or(0, |kv| kv.mod_revision);
            let (current, rev) = self.record(node).await?;
            let event = Event::ProvisionRequested {
                image: wish.image.clone(),
            };
            let outcome = match current.apply(&event, self.now_ms()) {
                Ok(t) => match self.image(&wish.image).await {
                    Ok(_) => Ok(t),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            let (transition, note) = match &outcome {
                Ok(t) => (t.changed.then_some(t), None),
                Err(e) => (
                    None,
                    Some(format!(
                        "rule set-image {}: not provisioned: {e}",
                        wish.image
                    )),
                ),
            };
            let w = Write {
                node: node.uuid,
                record_rev: rev,
                transition,
                wish: Some((marker_rev, &wish)),
                note,
                fence: None,
            };
            if self.write(w).await? {
                match &outcome {
                    Ok(t) => {
                        tracing::info!(node = %node.uuid, summary = %t.summary, "provisioning: rule set-image")
                    }
                    Err(e) => {
                        tracing::warn!(node = %node.uuid, error = %e, "provisioning: rule set-image not applied")
                    }
                }
                return Ok(transition.is_some());
            }
        }
        Err(ProvisionError::Busy(node.uuid))
    }

    /// `provision/next`: the node with any of `macs`, and what its agent must do.
    /// `provision/next` for the machine at `peer`: with TLS on, a run that starts subd gets
    /// subd's certificate (for the machine's name and address) and the CA.
    pub async fn next_for(
        &self,
        req: &NextRequest,
        peer: Option<std::net::IpAddr>,
    ) -> Result<NextAnswer> {
        let mut answer = self.next(req).await?;
        let runs_subd = matches!(answer.mode, Some(Operation::Birth | Operation::Rebirth));
        if let (true, Some(sec)) = (runs_subd, &self.security) {
            let node = answer.node.clone().unwrap_or_else(|| "sub".into());
            let mut sans = vec![answer.hostname.clone()];
            sans.extend(peer.map(|ip| ip.to_string()));
            sans.retain(|s| crate::security::valid_san(s));
            match sec.subd_trust(&[&answer.hostname, &node], &sans) {
                Ok(trust) => answer.subd_trust = trust,
                Err(e) => {
                    return Err(ProvisionError::Internal(format!(
                        "issuing subd's certificate for {node}: {e}"
                    )));
                }
            }
        }
        Ok(answer)
    }

    pub async fn next(&self, req: &NextRequest) -> Result<NextAnswer> {
        let mut node = None;
        for text in &req.macs {
            let mac: MacAddr = text
                .parse()
                .map_err(|e: paddock_inventory::MacParseError| {
                    ProvisionError::BadRequest(format!("mac {text:?}: {e}"))
                })?;
            if let Some(v) = self
                .inspector
                .by_mac(mac)
                .await
                .map_err(|e| ProvisionError::Internal(e.message))?
            {
                node = Some(v.node);
                break;
            }
        }
        let Some(node) = node else {
            return Ok(NextAnswer::nothing(&self.public_url));
        };
        // The one-boot path: the rule's wish, if the observer has not acted on it.
        if let Err(e) = self.take_wish(&node).await {
            tracing::warn!(node = %node.uuid, error = %e, "provisioning: rule set-image not applied");
        }
        let (mut record, _) = self.record(&node).await?;
        // The ramdisk is up and is told its mode: the run's clock starts.
        if record.serve().ramdisk_mode().is_some() && record.started_ms.is_none() {
            match self.apply(&node, &Event::RunStarted, false).await {
                Ok(t) => record = t.record,
                Err(e) => {
                    tracing::warn!(node = %node.uuid, error = %e, "provisioning: the run's start not recorded")
                }
            }
        }
        let image = match record.state.image() {
            Some(name) if record.serve().ramdisk_mode().is_some() => self
                .images
                .record(name)
                .await
                .map_err(|e| ProvisionError::Internal(e.to_string()))?,
            _ => None,
        };
        let computed = match (&self.computed, &image) {
            (Some(c), Some(_)) => c.every_machines().await,
            _ => Vec::new(),
        };
        Ok(next_answer(
            &node,
            &record,
            image.as_ref(),
            &self.public_url,
            self.subd_port,
            &computed,
        ))
    }

    /// `provision/{node}/register`: the MDB machine, then `register` done.
    pub async fn register(&self, node: &Node, address: &str) -> Result<Transition> {
        let (current, _) = self.record(node).await?;
        let event = Event::StepDone {
            step: Step::Register,
        };
        // Refused before anything is written.
        current.apply(&event, self.now_ms())?;
        let image = current
            .state
            .image()
            .ok_or_else(|| ProvisionError::BadRequest("no run to register".into()))?
            .to_string();
        let host = hostname(node);
        let existing = self
            .mdb
            .entries()
            .await
            .map_err(|e| ProvisionError::Internal(e.to_string()))?
            .remove(&host)
            .map(|e| e.machine);
        let machine = register_machine(existing, &host, address, &image, node.uuid)?;
        self.mdb
            .set(machine, Source::Api)
            .await
            .map_err(|e| ProvisionError::Internal(e.to_string()))?;
        tracing::info!(node = %node.uuid, %host, %address, %image, "provisioning: machine registered in the MDB");
        self.apply(node, &event, false).await
    }

    /// Every provisioning record with its node and revision (an unreadable one is skipped,
    /// with a warning).
    async fn records(&self) -> Result<Vec<(Uuid, Provisioning, Revision)>> {
        let mut out = Vec::new();
        for kv in self.store.range(PREFIX).await? {
            let Some(uuid) = kv.name_under::<Uuid>(PREFIX) else {
                continue;
            };
            match serde_json::from_slice::<Provisioning>(&kv.value) {
                Ok(p) => out.push((uuid, p, kv.mod_revision)),
                Err(e) => {
                    tracing::warn!(key = %kv.key, error = %e, "provisioning: unreadable record skipped")
                }
            }
        }
        Ok(out)
    }

    /// The runs in progress with their hostnames (a node is read only for a run that has
    /// registered and is not synced yet).
    async fn runs(&self) -> Result<Vec<(Uuid, String, Provisioning)>> {
        let mut out = Vec::new();
        for (uuid, p, _) in self.records().await? {
            if !waits_for_sync(&p) {
                continue;
            }
            if let Ok(Some(v)) = self.inspector.get(&uuid.to_string()).await {
                out.push((uuid, hostname(&v.node), p));
            }
        }
        Ok(out)
    }

    /// One look at the census: applies `subd_synced` to every run it shows synced.
    pub async fn census_synced(&self, census: &paddock_dominator::Census) -> Result<usize> {
        let synced: Synced = census
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|s| match &s.state {
                paddock_dominator::SubState::Synced { image } => {
                    Some((s.hostname.clone(), image.clone()))
                }
                _ => None,
            })
            .collect();
        if synced.is_empty() {
            return Ok(0);
        }
        let mut n = 0;
        for (uuid, event) in synced_events(&synced, &self.runs().await?) {
            let Some(v) = self
                .inspector
                .get(&uuid.to_string())
                .await
                .map_err(|e| ProvisionError::Internal(e.message))?
            else {
                continue;
            };
            match self.apply(&v.node, &event, false).await {
                Ok(t) if t.changed => n += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node = %uuid, error = %e, "provisioning: subd synced not recorded")
                }
            }
        }
        Ok(n)
    }
}

/// How often the leader looks for runs that timed out: a tenth of the shorter timeout, from
/// 1 s to 30 s (a run ends within 10 % of its timeout).
pub fn expire_every(t: &Timeouts) -> Duration {
    Duration::from_millis(t.step_ms.min(t.sync_ms) / 10)
        .clamp(Duration::from_secs(1), Duration::from_secs(30))
}

impl Provisioner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now().0).unwrap_or(0)
    }

    /// Ends in error every run that has gone without a report for longer than its timeout
    /// ([`Provisioning::expire`]): each in its own compare-and-swap on the record (a report
    /// that changed it meanwhile wins; the next look decides again) carrying `fence`.
    /// Returns how many ended.
    pub async fn expire_runs(&self, now_ms: u64, fence: Option<Compare>) -> Result<usize> {
        let mut n = 0;
        for (uuid, p, rev) in self.records().await? {
            let Some(t) = p.expire(now_ms, &self.timeouts) else {
                continue;
            };
            let w = Write {
                node: uuid,
                record_rev: rev,
                transition: Some(&t),
                wish: None,
                note: None,
                fence: fence.clone(),
            };
            if self.write(w).await? {
                tracing::warn!(node = %uuid, summary = %t.summary, "provisioning: run timed out");
                n += 1;
            }
        }
        Ok(n)
    }
}

/// The leader's work: ends the runs that timed out (every [`expire_every`]) and looks at
/// the census for runs it shows synced: each time `synced` says a sub turned synced, and
/// every second in any case.
pub fn start(
    rt: &mut crate::runtime::Runtime,
    p: Arc<Provisioner>,
    census: paddock_dominator::Census,
    synced: Arc<tokio::sync::Notify>,
) {
    let e = p.clone();
    rt.every_while_leading(
        "provisioning: timeouts",
        expire_every(&p.timeouts),
        move |fence| {
            let e = e.clone();
            async move {
                if let Err(err) = e.expire_runs(e.now_ms(), fence).await {
                    tracing::warn!(error = %err, "provisioning: the timeout check failed");
                }
            }
        },
    );
    rt.every_or_woken_while_leading(
        "provisioning: census",
        Duration::from_secs(1),
        Some(synced),
        move |_fence| {
            let (p, census) = (p.clone(), census.clone());
            async move {
                if let Err(e) = p.census_synced(&census).await {
                    tracing::warn!(error = %e, "provisioning: reading the census failed");
                }
            }
        },
    );
}

/// Acts on `set-image` wishes when an introspection finishes (a node observer: it runs
/// before `/v1/continue` answers). Only the nodes a change names are read.
pub struct RuleWishes(pub Arc<Provisioner>);

impl NodeObserver for RuleWishes {
    fn nodes_changed<'a>(&'a self, changed: Changed<'a>) -> Reaction<'a> {
        Box::pin(async move {
            // A wish acts when its node's introspection finishes, and the inspector names
            // every node it finishes: "not known which" holds no finished introspection.
            let Changed::Nodes(changed) = changed else {
                return;
            };
            for uuid in changed {
                let node = match self.0.inspector.get(&uuid.to_string()).await {
                    Ok(Some(v)) => v.node,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(node = %uuid, error = %e, "provisioning: node not read");
                        continue;
                    }
                };
                if let Err(e) = self.0.take_wish(&node).await {
                    tracing::warn!(node = %uuid, error = %e, "provisioning: rule set-image not applied");
                }
            }
        })
    }
}

pub fn router(p: Arc<Provisioner>) -> Router {
    Router::new()
        .route("/api/v1/nodes/{node}/provision", post(provision))
        .route("/api/v1/nodes/{node}/reimage", post(reimage))
        .route("/api/v1/nodes/{node}/clean", post(clean))
        .route("/api/v1/nodes/{node}/provisioning", get(show))
        .route("/api/v1/provision/next", post(next))
        .route("/api/v1/provision/{node}", get(show))
        .route("/api/v1/provision/{node}/report", post(report))
        .route("/api/v1/provision/{node}/register", post(register))
        .with_state(p)
}

type Api = State<Arc<Provisioner>>;

/// A JSON body; an empty one reads as `{}`.
fn body<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> std::result::Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("the body: {e}")))
}

#[derive(Deserialize)]
struct ImageBody {
    #[serde(default)]
    image: Option<String>,
}

async fn request(
    p: &Provisioner,
    ident: &str,
    event: Event,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    Ok(Json(p.request(ident, &event).await?.1.record))
}

async fn provision(
    State(p): Api,
    Path(ident): Path<String>,
    b: Bytes,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    let b: ImageBody = body(&b)?;
    let image = b
        .image
        .ok_or_else(|| ApiError::bad_request("name the image: {\"image\": NAME}"))?;
    request(&p, &ident, Event::ProvisionRequested { image }).await
}

async fn reimage(
    State(p): Api,
    Path(ident): Path<String>,
    b: Bytes,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    let b: ImageBody = body(&b)?;
    request(&p, &ident, Event::ReimageRequested { image: b.image }).await
}

async fn clean(
    State(p): Api,
    Path(ident): Path<String>,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    request(&p, &ident, Event::CleanRequested).await
}

/// The node a path names: for an agent, only if its token speaks for that node.
async fn path_node(
    p: &Provisioner,
    ident: &str,
    speaker: Option<axum::Extension<Speaker>>,
) -> std::result::Result<Node, ApiError> {
    match speaker {
        Some(axum::Extension(s)) => s.node(&p.inspector, ident).await,
        None => Ok(p.node(ident).await?),
    }
}

/// The longest `GET /api/v1/provision/{node}?wait_sync_secs=N` is held: well inside the
/// default shutdown grace (10 s), so a drain lets a held read finish (with a shorter grace
/// it is cut, and the ramdisk reads again).
const MAX_SYNC_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Default, serde::Deserialize)]
struct ShowQuery {
    /// While the run waits for subd's sync, hold the answer until the record changes, at
    /// most this long (capped at [`MAX_SYNC_WAIT`]).
    wait_sync_secs: Option<u64>,
}

async fn show(
    State(p): Api,
    speaker: Option<axum::Extension<Speaker>>,
    Path(ident): Path<String>,
    Query(q): Query<ShowQuery>,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    let node = path_node(&p, &ident, speaker).await?;
    let wait = Duration::from_secs(q.wait_sync_secs.unwrap_or(0)).min(MAX_SYNC_WAIT);
    Ok(Json(p.record_when_changed(&node, wait).await?))
}

async fn next(
    State(p): Api,
    peer: Option<axum::Extension<paddock_security::tls::Peer>>,
    speaker: Option<axum::Extension<Speaker>>,
    b: Bytes,
) -> std::result::Result<Json<NextAnswer>, ApiError> {
    let mut req: NextRequest = body(&b)?;
    // An agent token speaks for its own machine alone: the node is looked up by the
    // token's MAC, whatever list the body sends.
    if let Some(axum::Extension(Speaker(mac))) = speaker {
        req.macs = vec![mac.to_string()];
    }
    Ok(Json(
        p.next_for(&req, peer.map(|axum::Extension(p)| p.addr.ip()))
            .await?,
    ))
}

async fn report(
    State(p): Api,
    speaker: Option<axum::Extension<Speaker>>,
    Path(ident): Path<String>,
    b: Bytes,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    // Whom the caller may speak for is settled before its body is read.
    let node = path_node(&p, &ident, speaker).await?;
    let req: ReportRequest = body(&b)?;
    if !req.agent_may_send() {
        return Err(ApiError::bad_request(format!(
            "{} is not a report the agent sends (step_done, step_failed, clean_done)",
            req.event.name()
        )));
    }
    Ok(Json(p.apply(&node, &req.event, false).await?.record))
}

async fn register(
    State(p): Api,
    speaker: Option<axum::Extension<Speaker>>,
    peer: Option<axum::Extension<paddock_security::tls::Peer>>,
    Path(ident): Path<String>,
    b: Bytes,
) -> std::result::Result<Json<Provisioning>, ApiError> {
    let agent = speaker.is_some();
    let node = path_node(&p, &ident, speaker).await?;
    let req: RegisterRequest = body(&b)?;
    // The dominator will call the registered address: an agent registers the one it calls
    // from, never another host it would have the appliance reach.
    if agent
        && let Some(axum::Extension(peer)) = peer
        && req.address.parse::<IpAddr>().ok() != Some(peer.addr.ip())
    {
        return Err(ApiError::new(
            403,
            format!(
                "agent token: a machine registers its own address ({}), not {:?}",
                peer.addr.ip(),
                req.address
            ),
        ));
    }
    Ok(Json(p.register(&node, &req.address).await?.record))
}

/// Provisioning: how long a run may go without a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProvisioningConfig {
    pub timeouts: paddock_birther::Timeouts,
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_birther::State as P;
    use paddock_birther::state::Run;
    use paddock_inspector::node::Introspection;
    use paddock_inspector::state::State as I;

    fn node(name: Option<&str>) -> Node {
        let mut n = Node::new(
            Uuid::from_u128(0x0b6c_2a4e_1111_2222_3333_4444_5555_6666),
            0,
        );
        n.name = name.map(String::from);
        n
    }

    fn record(state: P) -> Provisioning {
        Provisioning {
            state,
            since_ms: 1,
            updated_ms: 2,
            started_ms: None,
        }
    }

    fn run(image: &str, last_step: Option<Step>, synced: bool) -> Run {
        Run {
            image: image.into(),
            previous_image: None,
            last_step,
            synced,
        }
    }

    fn image(name: &str, filter: Option<&str>) -> ImageRecord {
        serde_json::from_value(serde_json::json!({
            "name": name, "created_on_ms": 0, "bytes": 12345,
            "filter": filter.map(|f| vec![f]),
        }))
        .unwrap()
    }

    #[test]
    fn hostnames() {
        assert_eq!(hostname(&node(Some("r1u7"))), "r1u7");
        assert_eq!(hostname(&node(None)), "node-0b6c2a4e");
        assert_eq!(unnamed_hostname("node-0b6c2a4e"), Some("0b6c2a4e"));
        for not in [
            "r1u7",
            "node-0b6c2a4",
            "node-0b6c2a4e0",
            "node-0B6C2A4E",
            "node-0b6c2a4g",
            "Node-0b6c2a4e",
            "node-",
        ] {
            assert_eq!(unnamed_hostname(not), None, "{not}");
        }
    }

    /// The dominator's timeline finds an unnamed node by its `node-<8 hex>` hostname.
    #[test]
    fn unnamed_nodes_by_hostname() {
        let at = |u: u128, name: Option<&str>| {
            let mut n = Node::new(Uuid::from_u128(u), 0);
            n.name = name.map(String::from);
            n
        };
        let nodes = [
            at(0x0b6c_2a4e_0000_0000_0000_0000_0000_0001, None),
            // Named: found by its name, never by the hex form.
            at(0x1111_1111_0000_0000_0000_0000_0000_0001, Some("r1")),
            // Two unnamed nodes sharing the first 8 hex digits: ambiguous, neither.
            at(0x2222_2222_0000_0000_0000_0000_0000_0001, None),
            at(0x2222_2222_0000_0000_0000_0000_0000_0002, None),
        ];
        let got = unnamed_hostnames(&nodes);
        assert_eq!(
            got,
            BTreeMap::from([(
                "node-0b6c2a4e".to_string(),
                Uuid::from_u128(0x0b6c_2a4e_0000_0000_0000_0000_0000_0001)
            )])
        );
        for host in got.keys() {
            assert!(unnamed_hostname(host).is_some());
        }
    }

    #[test]
    fn a_wish_is_acted_on_once_per_introspection() {
        let mut n = node(None);
        assert_eq!(rule_wish(&n, None), None, "no introspection");
        let intro = |state, set_image: Option<&str>, started| Introspection {
            state,
            started_at: Some(started),
            finished_at: (state == I::Finished).then_some(started + 5),
            error: None,
            manage_boot: true,
            set_image: set_image.map(String::from),
        };
        n.introspection = Some(intro(I::Waiting, Some("a"), 10));
        assert_eq!(rule_wish(&n, None), None, "not finished");
        n.introspection = Some(intro(I::Error, Some("a"), 10));
        assert_eq!(rule_wish(&n, None), None, "failed");
        n.introspection = Some(intro(I::Finished, None, 10));
        assert_eq!(rule_wish(&n, None), None, "no wish");
        n.introspection = Some(intro(I::Finished, Some("a"), 10));
        let w = rule_wish(&n, None).unwrap();
        assert_eq!(
            w,
            WishTaken {
                started_at: Some(10),
                finished_at: Some(15),
                image: "a".into()
            }
        );
        assert_eq!(rule_wish(&n, Some(&w)), None, "taken");
        // A new introspection with the same wish is a new wish.
        n.introspection = Some(intro(I::Finished, Some("a"), 20));
        assert_eq!(rule_wish(&n, Some(&w)).unwrap().started_at, Some(20));
    }

    #[test]
    fn what_next_answers() {
        let mut n = node(Some("r1"));
        n.properties
            .insert("root_device".into(), serde_json::json!({"serial": "disk0"}));
        let a = image("debian/a", Some("/tmp/.*"));
        let birth = record(P::Birth(run("debian/a", None, false)));
        let got = next_answer(&n, &birth, Some(&a), "http://p", 6969, &[]);
        assert_eq!(
            got.node.as_deref(),
            Some("0b6c2a4e-1111-2222-3333-444455556666")
        );
        assert_eq!(got.mode, Some(Operation::Birth));
        assert_eq!(got.image.as_deref(), Some("debian/a"));
        assert_eq!(got.image_bytes, 12345);
        assert_eq!(got.hostname, "r1");
        assert_eq!(got.filter, ["/tmp/.*"]);
        assert_eq!(
            got.root_device_hints,
            Some(serde_json::json!({"serial": "disk0"}))
        );
        assert_eq!(
            (got.subd_port, got.appliance_url.as_str()),
            (6969, "http://p")
        );
        // A computed /etc/hostname: the dominator places it, subd does not exclude it.
        let named = image("debian/a", Some("/etc/hostname$"));
        let hostname = ["/etc/hostname".to_string()];
        let got = next_answer(&n, &birth, Some(&named), "http://p", 6969, &hostname);
        assert!(got.filter.is_empty(), "{:?}", got.filter);
        assert_eq!(got.computed, hostname);
        let got = next_answer(&n, &birth, Some(&a), "http://p", 6969, &hostname);
        assert_eq!(got.filter, ["/tmp/.*"]);
        let rebirth = record(P::Rebirth(run("debian/a", Some(Step::ChooseDisk), false)));
        assert_eq!(
            next_answer(&n, &rebirth, Some(&a), "http://p", 1, &[]).mode,
            Some(Operation::Rebirth)
        );
        // Another image's record is not this run's.
        let other = next_answer(
            &n,
            &birth,
            Some(&image("debian/b", None)),
            "http://p",
            1,
            &[],
        );
        assert_eq!((other.image_bytes, other.filter.len()), (0, 0));
        let clean = next_answer(
            &n,
            &record(P::Clean { last_step: None }),
            None,
            "u",
            1,
            &hostname,
        );
        assert!(clean.computed.is_empty(), "a clean writes no system");
        assert_eq!((clean.mode, clean.image), (Some(Operation::Clean), None));
        for idle in [
            P::Unknown,
            P::Healthy {
                image: "debian/a".into(),
            },
            P::Error {
                operation: Operation::Birth,
                step: Step::Partition,
                message: "m".into(),
                image: Some("debian/a".into()),
            },
        ] {
            let got = next_answer(&n, &record(idle.clone()), Some(&a), "u", 1, &[]);
            assert_eq!((got.mode, got.image.as_deref()), (None, None), "{idle:?}");
            assert_eq!(got.hostname, "r1");
        }
    }

    #[test]
    fn the_census_says_which_runs_are_synced() {
        let u = |n: u128| Uuid::from_u128(n);
        let synced: Synced = [
            ("a".to_string(), "img/1".to_string()),
            ("b".to_string(), "img/1".to_string()),
            ("c".to_string(), "img/1".to_string()),
            ("d".to_string(), "img/1".to_string()),
            ("e".to_string(), "img/1".to_string()),
        ]
        .into();
        let runs = vec![
            // Registered, synced to its image: yes.
            (
                u(1),
                "a".into(),
                record(P::Birth(run("img/1", Some(Step::Register), false))),
            ),
            // Another image.
            (
                u(2),
                "b".into(),
                record(P::Birth(run("img/2", Some(Step::Register), false))),
            ),
            // Not registered yet: the census may speak of the old system.
            (
                u(3),
                "c".into(),
                record(P::Rebirth(run("img/1", Some(Step::StartSubd), false))),
            ),
            // Already synced.
            (
                u(4),
                "d".into(),
                record(P::Birth(run("img/1", Some(Step::BootLoader), true))),
            ),
            // Not in the census as synced.
            (
                u(5),
                "z".into(),
                record(P::Birth(run("img/1", Some(Step::Register), false))),
            ),
            // Not a run.
            (
                u(6),
                "e".into(),
                record(P::Healthy {
                    image: "img/1".into(),
                }),
            ),
            // A rebirth, registered: yes.
            (
                u(7),
                "e".into(),
                record(P::Rebirth(run("img/1", Some(Step::Register), false))),
            ),
        ];
        let got = synced_events(&synced, &runs);
        let want = |n| {
            (
                u(n),
                Event::SubdSynced {
                    image: "img/1".into(),
                },
            )
        };
        assert_eq!(got, vec![want(1), want(7)]);
        // Each applies: the run is synced.
        for (i, (_, _, r)) in runs.iter().enumerate() {
            if let Some((_, e)) = got.iter().find(|(id, _)| *id == runs[i].0) {
                let t = r.apply(e, 10).unwrap();
                assert!(t.changed);
            }
        }
    }

    #[test]
    fn the_registered_machine() {
        let u = Uuid::from_u128(9);
        let m = register_machine(None, "r1", " 198.18.0.150 ", "img/1", u).unwrap();
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"Hostname": "r1", "IpAddress": "198.18.0.150",
                "RequiredImage": "img/1", "Tags": {"NodeUuid": u.to_string()}})
        );
        let existing = Machine {
            hostname: "r1".into(),
            ip_address: "198.18.0.9".into(),
            required_image: "img/0".into(),
            owner_groups: vec!["ops".into()],
            ..Machine::default()
        };
        let m = register_machine(Some(existing), "r1", "fd00::9", "img/1", u).unwrap();
        assert_eq!(
            (
                m.ip_address.as_str(),
                m.required_image.as_str(),
                m.owner_groups.len()
            ),
            ("fd00::9", "img/1", 1)
        );
        for bad in ["", "198.18.0.150:22", "host; rm -rf /", "198.18.0.999"] {
            assert!(
                register_machine(None, "r1", bad, "img/1", u).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_timeout_check_runs_often_enough() {
        let every = |step_ms, sync_ms| expire_every(&Timeouts { step_ms, sync_ms }).as_millis();
        assert_eq!(every(30 * 60_000, 120 * 60_000), 30_000);
        assert_eq!(every(60_000, 120 * 60_000), 6_000);
        assert_eq!(every(120 * 60_000, 100_000), 10_000);
        assert_eq!(every(2_000, 4_000), 1_000);
    }

    #[test]
    fn errors_have_their_status() {
        let status = |e: ProvisionError| ApiError::from(e).status;
        assert_eq!(status(ProvisionError::NoNode("x".into())), 404);
        assert_eq!(status(ProvisionError::NoImage("x".into())), 404);
        assert_eq!(
            status(ProvisionError::Refused(TransitionError::NotProvisioned)),
            409
        );
        assert_eq!(
            status(ProvisionError::Refused(TransitionError::BadImage(
                paddock_image::image::check_name("../x").unwrap_err()
            ))),
            400
        );
        assert_eq!(status(ProvisionError::BadRequest("x".into())), 400);
        assert_eq!(status(ProvisionError::Busy(Uuid::nil())), 409);
    }

    /// The shell on a manual clock: a powered-off machine's run never times out, and once
    /// its ramdisk asks, the step timeout holds to the millisecond.
    /// A provisioner over a real store in `dir`, its node `r1` created.
    async fn provisioner(dir: &std::path::Path, clock: Arc<dyn Clock>) -> (Provisioner, Node) {
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.join("s.db")).unwrap());
        let inspector = Arc::new(Inspector::new(store.clone(), Default::default()));
        let objects = paddock_imageserver::objects::ObjectStore::open(dir.join("objects")).unwrap();
        let p = Provisioner {
            store: store.clone(),
            inspector: inspector.clone(),
            images: ImageServer::new(store.clone(), Arc::new(objects)),
            mdb: MdbService::new(store.clone(), None),
            public_url: "http://198.18.0.1:8080".into(),
            subd_port: 6969,
            timeouts: Timeouts {
                step_ms: 2_000,
                sync_ms: 600_000,
            },
            security: None,
            power: None,
            clock,
            computed: None,
        };
        let mut n = node(Some("r1"));
        n.macs = vec!["52:54:00:00:00:01".parse().unwrap()];
        inspector.create(&n).await.unwrap();
        (p, n)
    }

    /// The ramdisk of `n`'s run (requested) asks, lays the disk out, starts subd and
    /// registers it.
    async fn up_to_register(p: &Provisioner, n: &Node) {
        let next = NextRequest {
            macs: vec!["52:54:00:00:00:01".into()],
        };
        p.next(&next).await.unwrap();
        for step in [
            Step::ChooseDisk,
            Step::Partition,
            Step::Filesystems,
            Step::StartSubd,
        ] {
            p.apply(n, &Event::StepDone { step }, false).await.unwrap();
        }
        p.register(n, "198.18.0.150").await.unwrap();
    }

    #[tokio::test]
    async fn a_run_times_out_only_once_its_ramdisk_has_asked() {
        use paddock_clock::{ManualClock, UnixMs};
        let dir = tempfile::tempdir().unwrap();
        const T0: u64 = 1_000_000;
        let clock = Arc::new(ManualClock::at(UnixMs(1_000_000)));
        let (p, n) = provisioner(dir.path(), clock.clone()).await;
        let provision = Event::ProvisionRequested {
            image: "test/a".into(),
        };
        p.apply(&n, &provision, false).await.unwrap();
        // Powered off: however late, there is nothing to time out.
        clock.advance(Duration::from_secs(3_600));
        assert_eq!(p.expire_runs(T0 + 86_400_000, None).await.unwrap(), 0);
        // The ramdisk asks: the step's clock starts at its first call.
        let started = T0 + 3_600_000;
        let next = NextRequest {
            macs: vec!["52:54:00:00:00:01".into()],
        };
        let answer = p.next(&next).await.unwrap();
        assert_eq!(answer.mode, Some(paddock_birther::Operation::Birth));
        assert_eq!(p.expire_runs(started + 2_000, None).await.unwrap(), 0);
        assert_eq!(p.record(&n).await.unwrap().0.state.name(), "birth");
        assert_eq!(p.expire_runs(started + 2_001, None).await.unwrap(), 1);
        let (record, _) = p.record(&n).await.unwrap();
        assert_eq!(record.state.name(), "error", "{record:?}");
        assert_eq!(
            p.expire_runs(started + 10_000, None).await.unwrap(),
            0,
            "once"
        );

        // Again, up to register: waiting for the sync, only the sync timeout applies.
        clock.set(UnixMs(2_000_000));
        p.apply(&n, &provision, false).await.unwrap();
        up_to_register(&p, &n).await;
        assert_eq!(p.expire_runs(2_000_000 + 600_000, None).await.unwrap(), 0);
        let (syncing, _) = p.record(&n).await.unwrap();
        assert_eq!(syncing.state.name(), "birth", "{syncing:?}");
        assert_eq!(p.expire_runs(2_000_000 + 600_001, None).await.unwrap(), 1);
    }

    /// A ramdisk's held read: answered as soon as the sync is stored while the run waits
    /// for it, at the end of the wait when nothing changes, and at once when the run waits
    /// for nothing.
    #[tokio::test]
    async fn a_held_record_read_answers_when_the_sync_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let (p, n) = provisioner(dir.path(), Arc::new(paddock_clock::SystemClock)).await;
        let long = Duration::from_secs(60);
        // No run: nothing to wait for.
        let started = std::time::Instant::now();
        let record = p.record_when_changed(&n, long).await.unwrap();
        assert_eq!(record.state.name(), "unknown");
        assert!(started.elapsed() < long / 2, "{:?}", started.elapsed());

        let image = "test/a";
        p.apply(
            &n,
            &Event::ProvisionRequested {
                image: image.into(),
            },
            false,
        )
        .await
        .unwrap();
        up_to_register(&p, &n).await;
        assert!(waits_for_sync(&p.record(&n).await.unwrap().0));

        // Nothing changes: the whole wait, then the same record.
        let short = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let record = p.record_when_changed(&n, short).await.unwrap();
        assert!(started.elapsed() >= short, "{:?}", started.elapsed());
        assert!(waits_for_sync(&record));

        // The sync is stored while the read is held: the read answers with it.
        let p = Arc::new(p);
        let held = {
            let (p, n) = (p.clone(), n.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                (
                    p.record_when_changed(&n, long).await.unwrap(),
                    started.elapsed(),
                )
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !held.is_finished(),
            "the read is held while nothing changes"
        );
        let synced = Event::SubdSynced {
            image: image.into(),
        };
        p.apply(&n, &synced, false).await.unwrap();
        let (record, took) = held.await.unwrap();
        assert!(!waits_for_sync(&record), "{record:?}");
        assert!(took < long / 2, "{took:?}");
    }
}
