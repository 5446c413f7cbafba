//! Power control in the appliance: a node's BMC from its Ironic `driver_info`
//! (stored in the node record by the inspector, `Node::bmc` + `Node::driver_info`), the
//! drivers of `paddock-power` on blocking threads, the leader's power-on throttle, the
//! power API (`/api/v1/nodes/{node}/power`), Inspector's `manage_boot` and the periodic
//! power-state sync.
//!
//! Power-ons (PXE once, then on or reset) never run where they are asked for: they are
//! queued in the store (`power/queue/<uuid>`, one place per node) and the leader alone
//! starts them as its [`Throttle`] admits them, so at most `[power] max_power_ons` start in
//! any `interval_secs` across the appliance, whichever host took the request. Power-offs and
//! status run at once. Every action and every failure goes on the node's timeline (kind
//! `power`); the last known state is `power/state/<uuid>`.
//!
//! Credentials: the password leaves the node record only towards its BMC (`Secret`). Nothing
//! here serialises a `Bmc`: answers carry the protocol and address only
//! ([`BmcSummary`]), and node answers are `Node::view(Secrets::Masked)`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use paddock_inspector::node::{Node, Secrets};
use paddock_inspector::service::{
    Changed, ENROLL_DRIVER, Inspector, NODES, NodeObserver, Reaction, Subject, timeline_op,
};
use paddock_inspector::state::State as IState;
use paddock_power::{Bmc, ErrorKind, PowerError, PowerState, RetryPolicy, Throttle};
use paddock_store::{Compare, Op, Store, Txn};
use paddock_wire::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

/// Power-ons waiting for the leader's throttle, one key per node.
pub const QUEUE: &str = "power/queue/";
/// The last known power state of each node and its last action.
pub const STATE: &str = "power/state/";
/// The introspection (`started_at`) whose `manage_boot` power steps were taken, and which.
pub const INTROSPECTION: &str = "power/introspection/";
/// The timeline kind of every power entry.
pub const KIND: &str = "power";

/// `[power]`: the throttle and the state sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerConfig {
    /// Most power-ons started in any window of `interval`.
    pub max_power_ons: u32,
    pub interval: Duration,
    /// How often the leader reads every managed node's power state.
    pub sync_every: Duration,
    /// How long `POST …/power {"action": "on"}` waits for its turn and outcome before it
    /// answers 202 (queued).
    pub answer_within: Duration,
}

impl Default for PowerConfig {
    fn default() -> Self {
        PowerConfig {
            max_power_ons: POWER_MAX_POWER_ONS,
            interval: Duration::from_secs(POWER_INTERVAL_SECS),
            sync_every: Duration::from_secs(POWER_SYNC_SECS),
            answer_within: Duration::from_secs(60),
        }
    }
}

/// What a power action is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    On,
    Off,
    /// A hard reset when on, power on when off (Ironic's `reboot`).
    Cycle,
    Status,
}

impl Action {
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "on" => Action::On,
            "off" => Action::Off,
            "cycle" | "reboot" => Action::Cycle,
            "status" => Action::Status,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Action::On => "on",
            Action::Off => "off",
            Action::Cycle => "cycle",
            Action::Status => "status",
        }
    }
}

/// A power-on waiting in the queue for the throttle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    /// Names the outcome in the node's [`Record`].
    pub id: Uuid,
    /// `on` or `cycle`.
    pub action: Action,
    /// Make the next boot a network boot first (the ramdisk: introspection, provisioning).
    pub pxe_once: bool,
    /// Why, for the timeline ("introspection", "provisioning: clean", "operator").
    pub reason: String,
    /// The introspection (`started_at`) this boots: a failure ends it in error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introspection: Option<i64>,
    pub at_ms: u64,
}

/// The outcome of one action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub id: Uuid,
    pub action: Action,
    pub at_ms: u64,
    /// `None`: done.
    pub error: Option<String>,
}

/// `power/state/<uuid>`: what the node's BMC last said, and the last action.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// `on`, `off`, `powering on`, `powering off`; `None` until read.
    pub state: Option<String>,
    pub checked_ms: Option<u64>,
    /// The last status read's failure (cleared by a good read).
    pub error: Option<String>,
    pub last: Option<Outcome>,
}

/// The protocol and address of a node's BMC: what answers show (never credentials).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BmcSummary {
    pub driver: &'static str,
    pub address: String,
}

impl BmcSummary {
    pub fn of(bmc: &Bmc) -> BmcSummary {
        match bmc {
            Bmc::Redfish(r) => BmcSummary {
                driver: "redfish",
                address: r.address.clone(),
            },
            Bmc::Ipmi(i) => BmcSummary {
                driver: "ipmi",
                address: format!("{}:{}", i.host, i.port),
            },
        }
    }
}

/// The throttle as the API and metrics show it (this host's view: the leader's queue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThrottleView {
    /// Whether this host runs the throttle (it leads).
    pub leading: bool,
    /// Power-ons waiting.
    pub queued: usize,
    /// Unix ms when the next power-on may start (now or later); `None` on a follower.
    pub next_slot_ms: Option<u64>,
    pub max_power_ons: u32,
    pub interval_secs: u64,
}

fn now_ms() -> u64 {
    u64::try_from(paddock_wire::unix_ms()).unwrap_or(0)
}

/// The node's `driver_info` as Ironic holds it: the BMC settings (passwords in clear, for
/// the driver alone) with the other keys.
fn driver_info(node: &Node) -> Map<String, Value> {
    match node.view(Secrets::Plain).get("driver_info") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    }
}

/// The node's BMC: `None` when it has none to manage (no `redfish_address` or
/// `ipmi_address` in its `driver_info`, and no inspected BMC address under the `ipmi`
/// driver; or the `fake-hardware` driver auto-enrolled nodes get, which manages nothing,
/// as in Ironic); an error when its settings are unusable. Pure.
pub fn bmc_of(node: &Node) -> Option<Result<Bmc, PowerError>> {
    let driver = node.driver.as_deref().unwrap_or("");
    if driver == ENROLL_DRIVER {
        return None;
    }
    let configured = node.bmc.redfish.address.is_some() || node.bmc.ipmi.address.is_some();
    let inspected = driver.eq_ignore_ascii_case("ipmi") && node.bmc_address.is_some();
    if !configured && !inspected {
        return None;
    }
    Some(paddock_power::bmc_from_driver_info(
        node.driver.as_deref(),
        &driver_info(node),
        node.bmc_address.as_deref(),
    ))
}

/// Why a node's power cannot be managed, for answers and the timeline.
pub const NO_BMC: &str = "the node has no BMC to manage: set driver_info redfish_address (with redfish_username, redfish_password) or ipmi_address (with ipmi_username, ipmi_password), and a driver other than fake-hardware";

/// The HTTP status of a power failure: the BMC's side is a gateway's failure (502), a
/// setting or an action the BMC does not offer is the request's (400), a refusal a
/// conflict (409).
pub fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::Unsupported => 400,
        ErrorKind::Refused => 409,
        ErrorKind::Unreachable
        | ErrorKind::Tls
        | ErrorKind::Credentials
        | ErrorKind::BadAnswer
        | ErrorKind::Busy => 502,
    }
}

/// A failed action as the API answers it.
fn api_error(node: &Node, action: &str, e: &PowerError) -> ApiError {
    ApiError::new(
        status_of(e.kind),
        format!("node {}: power {action}: {e}", node.label()),
    )
}

/// The power service: one per host; its throttle runs only while the host leads.
pub struct Power {
    pub store: Arc<dyn Store>,
    pub inspector: Arc<Inspector>,
    pub config: PowerConfig,
    pub retry: RetryPolicy,
    view: Mutex<ThrottleView>,
}

impl Power {
    pub fn new(
        store: Arc<dyn Store>,
        inspector: Arc<Inspector>,
        config: PowerConfig,
        retry: RetryPolicy,
    ) -> Arc<Power> {
        Arc::new(Power {
            store,
            inspector,
            view: Mutex::new(ThrottleView {
                max_power_ons: config.max_power_ons,
                interval_secs: config.interval.as_secs(),
                ..ThrottleView::default()
            }),
            config,
            retry,
        })
    }

    /// The throttle as this host sees it.
    pub fn throttle_view(&self) -> ThrottleView {
        *self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The throttle as `GET /api/v1/power` shows it: a follower counts the queue in the store.
    pub async fn throttle_now(&self) -> ThrottleView {
        let mut v = self.throttle_view();
        if !v.leading {
            // A follower knows the queue's length from the store, not the leader's window.
            v.queued = self.store.range(QUEUE).await.map_or(0, |q| q.len());
        }
        v
    }

    async fn node(&self, ident: &str) -> Result<Node, ApiError> {
        self.inspector
            .find(ident)
            .await?
            .map(|v| v.node)
            .ok_or_else(|| ApiError::not_found(format!("no node {ident}")))
    }

    /// The node's BMC, or the API error saying why there is none.
    fn bmc(node: &Node) -> Result<Bmc, ApiError> {
        match bmc_of(node) {
            None => Err(ApiError::new(
                409,
                format!("node {}: {NO_BMC}", node.label()),
            )),
            Some(Err(e)) => Err(ApiError::new(
                400,
                format!("node {}: BMC settings: {e}", node.label()),
            )),
            Some(Ok(b)) => Ok(b),
        }
    }

    /// Runs `f` with the node's driver on a blocking thread.
    async fn with_driver<T: Send + 'static>(
        &self,
        bmc: Bmc,
        f: impl FnOnce(&dyn paddock_power::PowerDriver) -> Result<T, PowerError> + Send + 'static,
    ) -> Result<T, PowerError> {
        let retry = self.retry;
        tokio::task::spawn_blocking(move || {
            let driver = bmc.driver(retry)?;
            f(driver.as_ref())
        })
        .await
        .unwrap_or_else(|e| {
            Err(PowerError::new(
                ErrorKind::BadAnswer,
                format!("the power call ended abnormally: {e}"),
            ))
        })
    }

    /// The node's `power/state/<uuid>` record (the default when none or unreadable).
    pub async fn record(&self, node: Uuid) -> Record {
        match self.store.get(&format!("{STATE}{node}")).await {
            Ok(Some(kv)) => serde_json::from_slice(&kv.value).unwrap_or_default(),
            _ => Record::default(),
        }
    }

    /// Changes the node's record (read, change, compare-and-swap, retried) with a timeline
    /// entry in the same transaction; best effort (logged).
    async fn note(&self, node: Uuid, entry: Option<(&str, bool)>, change: impl Fn(&mut Record)) {
        let key = format!("{STATE}{node}");
        for _ in 0..10 {
            let (mut rec, rev) = match self.store.get(&key).await {
                Ok(Some(kv)) => (
                    serde_json::from_slice(&kv.value).unwrap_or_default(),
                    kv.mod_revision,
                ),
                Ok(None) => (Record::default(), 0),
                Err(e) => {
                    tracing::warn!(%node, error = %e, "power: record not read");
                    return;
                }
            };
            change(&mut rec);
            let mut txn = Txn::default();
            txn.compare.push(Compare::ModRevision {
                key: key.clone(),
                revision: rev,
            });
            txn.success.push(Op::put(
                key.clone(),
                serde_json::to_vec(&rec).unwrap_or_default(),
            ));
            if let Some((message, error)) = entry {
                txn.success
                    .push(timeline_op(Subject::Node(node), KIND, message, error));
            }
            match self.store.txn(txn).await {
                Ok(r) if r.succeeded => return,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "power: record not written");
                    return;
                }
            }
        }
    }

    /// Records an action's outcome (`(id, action, the state it leaves)`) on the node's
    /// record and timeline.
    async fn done(
        &self,
        node: Uuid,
        (id, action, after): (Uuid, Action, PowerState),
        what: &str,
        why: &str,
        res: &Result<(), PowerError>,
    ) {
        let outcome = Outcome {
            id,
            action,
            at_ms: now_ms(),
            error: res.as_ref().err().map(ToString::to_string),
        };
        let message = match res {
            Ok(()) => format!("{what} through the BMC ({why})"),
            Err(e) => format!("{what} failed ({why}): {e}"),
        };
        self.note(node, Some((&message, res.is_err())), |r| {
            if outcome.error.is_none() {
                r.state = Some(after.to_string());
                r.checked_ms = Some(outcome.at_ms);
            }
            r.last = Some(outcome.clone());
        })
        .await;
    }

    /// Reads the node's power state from its BMC and records it.
    async fn status(&self, node: &Node, bmc: Bmc) -> Result<PowerState, PowerError> {
        let res = self.with_driver(bmc, |d| d.status()).await;
        let at = now_ms();
        let (state, error) = match &res {
            Ok(s) => (Some(s.to_string()), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let before = self.record(node.uuid).await;
        // The timeline hears of a change of state or of a new failure, not of every read.
        let entry = match (&state, &error) {
            (Some(s), _) if before.state.as_ref() != Some(s) => {
                Some((format!("power state: {s}"), false))
            }
            (_, Some(e)) if before.error.as_ref() != Some(e) => {
                Some((format!("power status: {e}"), true))
            }
            _ => None,
        };
        self.note(
            node.uuid,
            entry.as_ref().map(|(m, e)| (m.as_str(), *e)),
            |r| {
                if state.is_some() {
                    r.state.clone_from(&state);
                }
                r.error.clone_from(&error);
                r.checked_ms = Some(at);
            },
        )
        .await;
        res
    }

    /// Powers the node off now (no throttle: only power-ons are spaced).
    async fn power_off(&self, node: &Node, bmc: Bmc, why: &str) -> Result<(), PowerError> {
        let res = self.with_driver(bmc, |d| d.power_off()).await;
        let outcome = (Uuid::new_v4(), Action::Off, PowerState::Off);
        self.done(node.uuid, outcome, "power off", why, &res).await;
        tracing::info!(node = %node.uuid, result = ?res, "power: off");
        res
    }

    /// Queues a power-on for the leader's throttle (a node waits once: asking again while
    /// it waits keeps its place and its first request).
    pub async fn queue(&self, node: &Node, q: &Queued) -> Result<bool, ApiError> {
        let key = format!("{QUEUE}{}", node.uuid);
        let value = serde_json::to_vec(q).map_err(|e| ApiError::internal(e.to_string()))?;
        let created = self
            .store
            .create(&key, value)
            .await
            .map_err(|e| ApiError::internal(format!("store: {e}")))?;
        let message = if created {
            format!(
                "power {} queued for the throttle ({}{})",
                q.action.as_str(),
                q.reason,
                if q.pxe_once { ", PXE boot once" } else { "" }
            )
        } else {
            format!(
                "power {} asked again ({}): the node already waits for the throttle",
                q.action.as_str(),
                q.reason
            )
        };
        if let Err(e) = self
            .inspector
            .event(Subject::Node(node.uuid), KIND, &message, false)
            .await
        {
            tracing::warn!(node = %node.uuid, error = %e, "power: timeline entry not recorded");
        }
        Ok(created)
    }

    /// Queues a reboot into the ramdisk: PXE once, then reset (or on); logged on failure.
    async fn queue_ramdisk(&self, node: &Node, reason: &str, introspection: Option<i64>) {
        let q = Queued {
            id: Uuid::new_v4(),
            action: Action::Cycle,
            pxe_once: true,
            reason: reason.to_string(),
            introspection,
            at_ms: now_ms(),
        };
        if let Err(e) = self.queue(node, &q).await {
            tracing::warn!(node = %node.uuid, error = %e.message, "power: not queued");
            // On the node's timeline too: the request that asked for it is recorded, and
            // asking again changes nothing, so the operator must power the machine by hand.
            let _ = self
                .inspector
                .event(
                    Subject::Node(node.uuid),
                    KIND,
                    &format!(
                        "reboot into the ramdisk ({reason}) not queued: {}; power the machine \
                         on or cycle it (paddock node power {} cycle)",
                        e.message, node.uuid
                    ),
                    true,
                )
                .await;
        }
    }

    /// Runs one admitted power-on: PXE once when asked, then on or reset; the outcome is
    /// recorded, and a failed introspection boot ends that introspection in error.
    async fn start(&self, node_id: Uuid, q: Queued) {
        let node = match self.inspector.get(&node_id.to_string()).await {
            Ok(Some(v)) => v.node,
            Ok(None) => return, // deleted meanwhile
            Err(e) => {
                tracing::warn!(node = %node_id, error = %e, "power: node not read");
                return;
            }
        };
        let res = match bmc_of(&node) {
            None => Err(PowerError::new(ErrorKind::Unsupported, NO_BMC)),
            Some(Err(e)) => Err(e),
            Some(Ok(bmc)) => {
                let (pxe, action) = (q.pxe_once, q.action);
                self.with_driver(bmc, move |d| {
                    if pxe {
                        d.boot_pxe_once()?;
                    }
                    match action {
                        Action::Cycle => d.reboot(),
                        _ => d.power_on(),
                    }
                })
                .await
            }
        };
        let what = match (q.pxe_once, q.action) {
            (true, Action::Cycle) => "PXE boot once, then reboot",
            (true, _) => "PXE boot once, then power on",
            (false, Action::Cycle) => "reboot",
            (false, _) => "power on",
        };
        let outcome = (q.id, q.action, PowerState::On);
        self.done(node.uuid, outcome, what, &q.reason, &res).await;
        tracing::info!(node = %node.uuid, reason = %q.reason, result = ?res, "power: started");
        if let (Err(e), Some(started)) = (&res, q.introspection) {
            self.fail_introspection(
                node.uuid,
                started,
                &format!("Failed to power on the node: {e}"),
            )
            .await;
        }
    }

    /// Ends the node's introspection that started at `started` in error (Inspector does so
    /// when its power-on fails): one compare-and-swap on the node record with its timeline
    /// entry; nothing if that introspection is no longer running.
    async fn fail_introspection(&self, node: Uuid, started: i64, why: &str) {
        for _ in 0..10 {
            let Ok(Some(v)) = self.inspector.get(&node.to_string()).await else {
                return;
            };
            let mut n = v.node;
            let Some(i) = n.introspection.as_mut() else {
                return;
            };
            if !i.state.is_active() || i.started_at != Some(started) {
                return;
            }
            i.state = IState::Error;
            i.finished_at = Some(paddock_inspector::service::now_secs());
            i.error = Some(why.to_string());
            let key = format!("{NODES}{node}");
            let txn = Txn {
                compare: vec![Compare::ModRevision {
                    key: key.clone(),
                    revision: v.rev,
                }],
                success: vec![
                    Op::put(key, serde_json::to_vec(&n).unwrap_or_default()),
                    timeline_op(Subject::Node(node), "introspection-error", why, true),
                ],
                ..Txn::default()
            };
            match self.store.txn(txn).await {
                Ok(r) if r.succeeded => return,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "power: introspection error not recorded");
                    return;
                }
            }
        }
    }

    /// `manage_boot` (Inspector's semantics), told of every node change: an introspection
    /// that starts on a node with a BMC is queued for PXE once + power on; one that finishes
    /// (or is aborted) is powered off. Each step once per introspection
    /// (`power/introspection/<uuid>`, created or swapped by revision).
    async fn follow(self: &Arc<Self>, uuid: Uuid) {
        let Ok(Some(v)) = self.inspector.get(&uuid.to_string()).await else {
            return;
        };
        let node = v.node;
        let Some(intro) = node.introspection.clone() else {
            return;
        };
        let Some(started) = intro.started_at else {
            return;
        };
        if !intro.manage_boot {
            return;
        }
        let key = format!("{INTROSPECTION}{uuid}");
        let (done, rev): (Option<Steps>, i64) = match self.store.get(&key).await {
            Ok(Some(kv)) => (serde_json::from_slice(&kv.value).ok(), kv.mod_revision),
            Ok(None) => (None, 0),
            Err(_) => return,
        };
        let ended_well = intro.state == IState::Finished
            || (intro.state == IState::Error
                && intro.error.as_deref() == Some("Canceled by operator"));
        let step = match &done {
            Some(s) if s.started_at == started && s.off => return,
            Some(s) if s.started_at == started => {
                if intro.state.is_active() {
                    return;
                }
                "off"
            }
            _ if intro.state.is_active() => "boot",
            _ => return, // ended before we saw it start
        };
        let steps = Steps {
            started_at: started,
            off: step == "off",
        };
        let txn = Txn {
            compare: vec![Compare::ModRevision {
                key: key.clone(),
                revision: rev,
            }],
            success: vec![Op::put(key, serde_json::to_vec(&steps).unwrap_or_default())],
            ..Txn::default()
        };
        match self.store.txn(txn).await {
            Ok(r) if r.succeeded => {}
            _ => return, // another host took this step
        }
        if step == "boot" {
            match bmc_of(&node) {
                None => {
                    let _ = self
                        .inspector
                        .event(
                            Subject::Node(uuid),
                            KIND,
                            &format!("manage_boot: {NO_BMC}; power the node on by hand"),
                            false,
                        )
                        .await;
                }
                Some(Err(e)) => {
                    self.fail_introspection(
                        uuid,
                        started,
                        &format!("Failed to validate power: {e}"),
                    )
                    .await;
                }
                Some(Ok(bmc)) if node.macs.is_empty() => {
                    // Known by its BMC alone: its NICs from the BMC first, so the
                    // inventory it posts finds it (off the API's answer path).
                    let me = self.clone();
                    tokio::spawn(async move { me.learn_macs_then_boot(node, bmc, started).await });
                }
                Some(Ok(_)) => {
                    self.queue_ramdisk(&node, "introspection", Some(started))
                        .await;
                }
            }
            return;
        }
        // The introspection ended: nothing of it waits any more.
        let _ = self.store.delete(&format!("{QUEUE}{uuid}")).await;
        if !ended_well {
            return;
        }
        if let Some(Ok(bmc)) = bmc_of(&node) {
            let why = if intro.state == IState::Finished {
                "introspection finished"
            } else {
                "introspection aborted"
            };
            let _ = self.power_off(&node, bmc, why).await;
        }
    }

    /// For a node known only by its BMC: its NICs' MACs read from the BMC (Redfish
    /// `EthernetInterfaces`) and added to the node (Ironic's out-of-band inspection does the
    /// same), then its introspection boot queued; a BMC that lists none (IPMI never does)
    /// ends the introspection with what to do.
    async fn learn_macs_then_boot(self: Arc<Self>, node: Node, bmc: Bmc, started: i64) {
        let retry = self.retry;
        let found = match bmc {
            Bmc::Redfish(r) => tokio::task::spawn_blocking(move || redfish_macs(&r, retry))
                .await
                .unwrap_or_else(|e| Err(PowerError::new(ErrorKind::BadAnswer, e.to_string()))),
            Bmc::Ipmi(_) => Err(PowerError::new(
                ErrorKind::Unsupported,
                "IPMI does not list a machine's NICs",
            )),
        };
        let macs = match found {
            Ok(m) if !m.is_empty() => m,
            Ok(_) | Err(_) => {
                let why = match found {
                    Err(e) => e.to_string(),
                    Ok(_) => "its BMC lists no NIC".into(),
                };
                let msg = format!(
                    "Failed to find the node's MAC addresses: {why}; add the MAC of the NIC it boots from (macs)"
                );
                self.fail_introspection(node.uuid, started, &msg).await;
                return;
            }
        };
        let ops: Vec<Value> = macs
            .iter()
            .map(|m| json!({"op": "add", "path": "/macs/-", "value": m.to_string()}))
            .collect();
        let listed = macs.iter().map(ToString::to_string).collect::<Vec<_>>();
        match self
            .inspector
            .patch_node(&node.uuid.to_string(), &Value::Array(ops), None)
            .await
        {
            Ok(n) => {
                let _ = self
                    .inspector
                    .event(
                        Subject::Node(node.uuid),
                        KIND,
                        &format!("MACs read from the BMC: {}", listed.join(", ")),
                        false,
                    )
                    .await;
                self.queue_ramdisk(&n, "introspection", Some(started)).await;
            }
            Err(e) => {
                let msg = format!(
                    "Failed to record the MACs the BMC lists ({}): {e}",
                    listed.join(", ")
                );
                self.fail_introspection(node.uuid, started, &msg).await;
            }
        }
    }

    /// The leader's throttle: reads the queue, starts what it admits, publishes its view.
    /// Runs for ever; does nothing (and forgets its window) while this host does not lead.
    pub async fn run_throttle(self: Arc<Self>, leader: crate::leader::LeaderRx) {
        let epoch = Instant::now();
        let mono = || u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let new_throttle = || {
            Throttle::<Uuid>::new(self.config.max_power_ons, self.config.interval)
                .unwrap_or_else(|_| Throttle::new(1, Duration::from_secs(1)).expect("1 per 1 s"))
        };
        let mut throttle = new_throttle();
        let mut waiting: HashSet<Uuid> = HashSet::new();
        loop {
            let leadership = leader.borrow().clone();
            let Some(leadership) = leadership else {
                throttle = new_throttle();
                waiting.clear();
                self.publish(false, 0, None);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            let mut queued = match self.store.range(QUEUE).await {
                Ok(kvs) => kvs,
                Err(e) => {
                    tracing::warn!(error = %e, "power: queue not read");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            // First come, first served: by when each request was created.
            queued.sort_by_key(|kv| kv.create_revision);
            let mut requests = std::collections::HashMap::new();
            for kv in queued {
                let Some(id) = kv.name_under::<Uuid>(QUEUE) else {
                    continue;
                };
                match serde_json::from_slice::<Queued>(&kv.value) {
                    Ok(q) => {
                        if waiting.insert(id) {
                            throttle.request(id);
                        }
                        requests.insert(id, (q, kv.mod_revision));
                    }
                    Err(e) => {
                        tracing::warn!(key = %kv.key, error = %e, "power: unreadable request dropped");
                        let _ = self.store.delete(&kv.key).await;
                    }
                }
            }
            // Requests taken back (the introspection ended, the node went).
            for gone in waiting
                .iter()
                .filter(|id| !requests.contains_key(id))
                .copied()
                .collect::<Vec<_>>()
            {
                throttle.cancel(&gone);
                waiting.remove(&gone);
            }
            let now = mono();
            for id in throttle.admit(now) {
                waiting.remove(&id);
                let Some((q, rev)) = requests.remove(&id) else {
                    continue;
                };
                // Taken from the queue by the leader only (fenced), exactly as read.
                let mut txn = Txn::default();
                txn.compare.extend(leadership.fence());
                let key = format!("{QUEUE}{id}");
                txn.compare.push(Compare::ModRevision {
                    key: key.clone(),
                    revision: rev,
                });
                txn.success.push(Op::delete(key));
                match self.store.txn(txn).await {
                    Ok(r) if r.succeeded => {
                        let me = self.clone();
                        tokio::spawn(async move { me.start(id, q).await });
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(node = %id, error = %e, "power: request not taken"),
                }
            }
            let after = mono();
            let slot = throttle.next_slot(after);
            let unix = now_ms().saturating_add(slot.saturating_sub(after));
            self.publish(true, throttle.queue_len(), Some(unix));
            let wake = throttle
                .next_wake(after)
                .map_or(500, |w| w.saturating_sub(after))
                .clamp(50, 500);
            tokio::time::sleep(Duration::from_millis(wake)).await;
        }
    }

    fn publish(&self, leading: bool, queued: usize, next_slot_ms: Option<u64>) {
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.leading = leading;
        v.queued = queued;
        v.next_slot_ms = next_slot_ms;
    }

    /// The leader's periodic power-state sync: every managed node's status, at most
    /// `SYNC_AT_ONCE` BMCs at a time, recorded (`power/state/<uuid>`; the timeline hears of
    /// changes).
    pub async fn sync(&self) -> usize {
        use futures_util::StreamExt;
        let Ok(nodes) = self.inspector.list().await else {
            return 0;
        };
        let managed: Vec<(Node, Bmc)> = nodes
            .into_iter()
            .filter_map(|n| match bmc_of(&n) {
                Some(Ok(b)) => Some((n, b)),
                _ => None,
            })
            .collect();
        let count = managed.len();
        futures_util::stream::iter(managed)
            .for_each_concurrent(SYNC_AT_ONCE, |(n, b)| async move {
                let _ = self.status(&n, b).await;
            })
            .await;
        count
    }

    /// One action asked by an operator (API, CLI, console): status and off at once; on and cycle
    /// through the throttle, waiting up to `answer_within` for the outcome.
    pub async fn act(&self, ident: &str, action: Action) -> Result<Response, ApiError> {
        let node = self.node(ident).await?;
        let bmc = Self::bmc(&node)?;
        let summary = BmcSummary::of(&bmc);
        match action {
            Action::Status => {
                let state = self
                    .status(&node, bmc)
                    .await
                    .map_err(|e| api_error(&node, "status", &e))?;
                Ok(Json(self.answer(&node, &summary, Some(state)).await).into_response())
            }
            Action::Off => {
                self.power_off(&node, bmc, "operator")
                    .await
                    .map_err(|e| api_error(&node, "off", &e))?;
                Ok(Json(self.answer(&node, &summary, Some(PowerState::Off)).await).into_response())
            }
            Action::On | Action::Cycle => {
                let q = Queued {
                    id: Uuid::new_v4(),
                    action,
                    pxe_once: false,
                    reason: "operator".into(),
                    introspection: None,
                    at_ms: now_ms(),
                };
                self.queue(&node, &q).await?;
                let deadline = Instant::now() + self.config.answer_within;
                while Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let rec = self.record(node.uuid).await;
                    if let Some(last) = rec.last.filter(|l| l.id == q.id) {
                        return match last.error {
                            None => Ok(Json(
                                self.answer(&node, &summary, Some(PowerState::On)).await,
                            )
                            .into_response()),
                            Some(e) => Err(ApiError::new(
                                502,
                                format!("node {}: power {}: {e}", node.label(), action.as_str()),
                            )),
                        };
                    }
                }
                let mut a = self.answer(&node, &summary, None).await;
                a["queued"] = json!(true);
                Ok((StatusCode::ACCEPTED, Json(a)).into_response())
            }
        }
    }

    /// The node's power as answers show it: its BMC (protocol and address), the state, its
    /// record, and the throttle.
    async fn answer(&self, node: &Node, bmc: &BmcSummary, now: Option<PowerState>) -> Value {
        let rec = self.record(node.uuid).await;
        let waiting = self
            .store
            .get(&format!("{QUEUE}{}", node.uuid))
            .await
            .ok()
            .flatten()
            .is_some();
        json!({
            "node": node.uuid,
            "name": node.name,
            "bmc": bmc,
            "state": now.map(PowerState::as_str).map(str::to_string).or(rec.state.clone()),
            "checked_ms": rec.checked_ms,
            "error": rec.error,
            "last": rec.last,
            "waiting": waiting,
            "throttle": self.throttle_view(),
        })
    }

    /// `GET …/power` on a node with no BMC: what is known, without asking anyone.
    async fn unmanaged(&self, node: &Node) -> Value {
        json!({
            "node": node.uuid,
            "name": node.name,
            "bmc": null,
            "state": null,
            "error": NO_BMC,
            "throttle": self.throttle_view(),
        })
    }
}

/// The MACs of a Redfish System's NICs (`EthernetInterfaces`: `MACAddress`, else
/// `PermanentMACAddress`). Blocking.
fn redfish_macs(
    b: &paddock_power::RedfishBmc,
    retry: RetryPolicy,
) -> Result<Vec<paddock_inventory::MacAddr>, PowerError> {
    use paddock_power::TlsVerify;
    use paddock_power::redfish::{bmc_path, choose_system};
    let tls = match &b.tls {
        TlsVerify::Insecure => ureq::tls::TlsConfig::builder()
            .disable_verification(true)
            .build(),
        TlsVerify::Verify => ureq::tls::TlsConfig::builder().build(),
        TlsVerify::CaFile(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| PowerError::new(ErrorKind::Tls, format!("{}: {e}", path.display())))?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
                .build()
        }
    };
    // As the driver's client: no redirects (a BMC must not steer the appliance's requests
    // elsewhere), and the address checked as the driver checks it.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .max_redirects(0)
        .tls_config(tls)
        .build()
        .into();
    let base = paddock_power::base_url(&b.address)?;
    let auth = {
        use base64::Engine as _;
        let pair = format!(
            "{}:{}",
            b.credentials.username,
            b.credentials.password.expose()
        );
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    };
    let get = |path: &str| -> Result<Value, PowerError> {
        retry.run(std::thread::sleep, || {
            let mut resp = agent
                .get(&format!("{base}{path}"))
                .header("Authorization", &auth)
                .header("Accept", "application/json")
                .call()
                .map_err(|e| PowerError::new(ErrorKind::Unreachable, format!("GET {path}: {e}")))?;
            let status = resp.status().as_u16();
            let body = resp
                .body_mut()
                .with_config()
                .limit(4 << 20)
                .read_to_vec()
                .map_err(|e| PowerError::new(ErrorKind::BadAnswer, format!("GET {path}: {e}")))?;
            let r = paddock_power::redfish::Response {
                status,
                etag: None,
                body,
            };
            paddock_power::redfish::check(&format!("GET {path}"), &r)?;
            serde_json::from_slice(&r.body).map_err(|e| {
                PowerError::new(ErrorKind::BadAnswer, format!("GET {path}: not JSON: {e}"))
            })
        })
    };
    let system = choose_system(&get("/redfish/v1/Systems")?, b.system.as_deref())?;
    let sys = get(&system)?;
    let Some(nics) = sys["EthernetInterfaces"]["@odata.id"].as_str() else {
        return Ok(Vec::new());
    };
    let nics = get(&bmc_path("EthernetInterfaces", nics)?)?;
    let mut macs = Vec::new();
    // A machine has a few network interfaces; a BMC listing thousands gets its first ones
    // asked, not a request (with retries) for each.
    for m in nics["Members"]
        .as_array()
        .into_iter()
        .flatten()
        .take(MAX_NICS)
    {
        let Some(p) = m["@odata.id"].as_str() else {
            continue;
        };
        let nic = get(&bmc_path("an EthernetInterface", p)?)?;
        let mac = nic["MACAddress"]
            .as_str()
            .or(nic["PermanentMACAddress"].as_str())
            .and_then(|m| m.parse::<paddock_inventory::MacAddr>().ok());
        if let Some(mac) = mac
            && !macs.contains(&mac)
        {
            macs.push(mac);
        }
    }
    Ok(macs)
}

/// Network interfaces asked of a BMC's Redfish for their MACs, at most.
const MAX_NICS: usize = 64;

/// BMCs asked at once by the state sync.
const SYNC_AT_ONCE: usize = 8;

/// `power/introspection/<uuid>`: the `manage_boot` steps taken for one introspection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Steps {
    started_at: i64,
    /// Powered off (or, if it was not to be, passed) at its end.
    off: bool,
}

/// The observer the inspector tells of node changes: `manage_boot` follows them.
pub struct ManageBoot(pub Arc<Power>);

impl NodeObserver for ManageBoot {
    fn nodes_changed<'a>(&'a self, changed: Changed<'a>) -> Reaction<'a> {
        Box::pin(async move {
            let all: Vec<Uuid>;
            let nodes = match changed {
                Changed::Nodes(n) => n,
                Changed::All => match self.0.inspector.list().await {
                    Ok(list) => {
                        all = list.into_iter().map(|n| n.uuid).collect();
                        &all
                    }
                    Err(e) => {
                        tracing::warn!(error = %e.message, "power: cannot list nodes to follow");
                        return;
                    }
                },
            };
            for &uuid in nodes {
                self.0.follow(uuid).await;
            }
        })
    }
}

/// Asks the leader for a reboot into the ramdisk (PXE once, then reboot or on) of a node
/// whose provisioning run starts, if it has a BMC (else the operator powers it, as before);
/// its settings' failure goes on its timeline.
pub async fn boot_ramdisk(power: &Power, node: &Node, why: &str) {
    match bmc_of(node) {
        None => {}
        Some(Err(e)) => {
            let _ = power
                .inspector
                .event(
                    Subject::Node(node.uuid),
                    KIND,
                    &format!("cannot reboot into the ramdisk ({why}): BMC settings: {e}"),
                    true,
                )
                .await;
        }
        Some(Ok(_)) => power.queue_ramdisk(node, why, None).await,
    }
}

/// `text` (an OpenMetrics exposition) with the throttle's gauges added:
/// `paddock_power_queue` (power-ons waiting; the leader's queue) and
/// `paddock_power_next_slot_seconds` (until the next power-on may start; on the leader).
pub fn add_metrics(text: String, v: &ThrottleView) -> String {
    use prometheus_client::metrics::gauge::Gauge;
    let mut registry = prometheus_client::registry::Registry::default();
    let queued = Gauge::<i64>::default();
    queued.set(i64::try_from(v.queued).unwrap_or(i64::MAX));
    registry.register(
        "paddock_power_queue",
        "Power-ons waiting for the throttle (the leader's queue)",
        queued,
    );
    if let Some(slot) = v.next_slot_ms {
        let next = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        // Milliseconds to seconds: exact below 2^53 ms.
        let ms = slot.saturating_sub(now_ms());
        next.set(f64::from(u32::try_from(ms).unwrap_or(u32::MAX)) / 1000.0);
        registry.register(
            "paddock_power_next_slot_seconds",
            "Seconds until the throttle lets the next power-on start (0: now)",
            next,
        );
    }
    crate::metrics::append(text, &registry)
}

/// The periodic sync and the throttle, leader-only.
pub fn start(rt: &mut crate::runtime::Runtime, power: Arc<Power>) {
    let (p, l) = (power.clone(), rt.context().leader.clone());
    rt.spawn_future("power: throttle", async move {
        p.run_throttle(l).await;
        Ok(())
    });
    let every = power.config.sync_every;
    rt.every_while_leading("power: sync", every, move |_fence| {
        let power = power.clone();
        async move {
            let n = power.sync().await;
            tracing::debug!(nodes = n, "power: states synced");
        }
    });
}

pub fn router(power: Arc<Power>) -> Router {
    Router::new()
        .route("/api/v1/nodes/{node}/power", get(show).post(act))
        .route("/api/v1/power", get(throttle))
        .with_state(power)
}

async fn show(State(p): State<Arc<Power>>, Path(ident): Path<String>) -> Response {
    let node = match p.node(&ident).await {
        Ok(n) => n,
        Err(e) => return e.into_response(),
    };
    if bmc_of(&node).is_none() {
        return Json(p.unmanaged(&node).await).into_response();
    }
    p.act(&ident, Action::Status)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
struct ActBody {
    action: String,
}

async fn act(State(p): State<Arc<Power>>, Path(ident): Path<String>, body: Bytes) -> Response {
    let res = async {
        let b: ActBody = serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body: {e}; give {{\"action\": \"on\"|\"off\"|\"cycle\"|\"status\"}}"
            ))
        })?;
        let action = Action::parse(&b.action).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown power action {:?}: on, off, cycle or status",
                b.action
            ))
        })?;
        p.act(&ident, action).await
    }
    .await;
    res.unwrap_or_else(IntoResponse::into_response)
}

async fn throttle(State(p): State<Arc<Power>>) -> Json<ThrottleView> {
    Json(p.throttle_now().await)
}

/// Power-ons started in any window of `POWER_INTERVAL_SECS`, appliance-wide.
pub const POWER_MAX_POWER_ONS: u32 = 10;
/// Seconds of the power-on throttle's window.
pub const POWER_INTERVAL_SECS: u64 = 10;
/// Seconds between the leader's reads of every managed node's power state.
pub const POWER_SYNC_SECS: u64 = 60;

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_power::{Credentials, TlsVerify};
    use tower::ServiceExt;

    const SECRET: &str = "s3cret-never-shown-9f2c";

    fn node_with(driver: Option<&str>, info: Value) -> Node {
        let mut n = Node::new(Uuid::from_u128(7), 0);
        n.driver = driver.map(str::to_string);
        let ops: Vec<Value> = info
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| json!({"op": "add", "path": format!("/driver_info/{k}"), "value": v}))
            .collect();
        let opts = paddock_inspector::patch::Options {
            ident: "n",
            reset_interfaces: None,
        };
        paddock_inspector::patch::patch(&n, &Value::Array(ops), &opts).unwrap()
    }

    #[test]
    fn a_nodes_bmc_comes_from_its_driver_info() {
        let n = node_with(
            Some("redfish"),
            json!({"redfish_address": "http://198.18.0.5:8000", "redfish_username": "admin",
                   "redfish_password": SECRET, "redfish_verify_ca": false,
                   "redfish_system_id": "/redfish/v1/Systems/abc"}),
        );
        let Some(Ok(Bmc::Redfish(r))) = bmc_of(&n) else {
            panic!("a redfish BMC")
        };
        assert_eq!(r.address, "http://198.18.0.5:8000");
        assert_eq!(r.credentials, Credentials::new("admin", SECRET));
        assert_eq!(r.tls, TlsVerify::Insecure);
        assert_eq!(r.system.as_deref(), Some("/redfish/v1/Systems/abc"));
        let shown = format!("{:?} {:?}", bmc_of(&n), BmcSummary::of(&Bmc::Redfish(r)));
        assert!(!shown.contains(SECRET), "{shown}");

        let n = node_with(
            Some("ipmi"),
            json!({"ipmi_address": "198.18.0.6", "ipmi_port": "6230", "ipmi_username": "u",
                   "ipmi_password": "p"}),
        );
        let Some(Ok(Bmc::Ipmi(i))) = bmc_of(&n) else {
            panic!("an IPMI BMC")
        };
        assert_eq!((i.host.as_str(), i.port), ("198.18.0.6", 6230));
    }

    #[test]
    fn nodes_without_a_bmc_or_on_fake_hardware_are_not_managed_and_bad_settings_are_errors() {
        assert!(bmc_of(&node_with(None, json!({}))).is_none());
        let mut enrolled = node_with(Some(ENROLL_DRIVER), json!({"ipmi_address": "10.0.0.1"}));
        enrolled.bmc_address = Some("10.0.0.1".into());
        assert!(bmc_of(&enrolled).is_none(), "fake-hardware manages nothing");
        let mut inspected = node_with(Some("ipmi"), json!({"ipmi_username": "u"}));
        inspected.bmc_address = Some("198.18.0.9".into());
        let Some(Ok(Bmc::Ipmi(i))) = bmc_of(&inspected) else {
            panic!("the inspected address over IPMI")
        };
        assert_eq!(i.host, "198.18.0.9");
        let bad = node_with(
            Some("ipmi"),
            json!({"ipmi_address": "198.18.0.6", "ipmi_port": "99999"}),
        );
        let e = bmc_of(&bad).unwrap().unwrap_err();
        assert!(e.message.contains("ipmi_port"), "{e}");
        assert_eq!(status_of(e.kind), 400);
    }

    #[test]
    fn the_throttle_is_in_the_metrics() {
        let v = ThrottleView {
            leading: true,
            queued: 3,
            next_slot_ms: Some(now_ms() + 4_000),
            max_power_ons: 2,
            interval_secs: 10,
        };
        let text = add_metrics("# EOF\n".into(), &v);
        assert!(text.contains("paddock_power_queue 3\n"), "{text}");
        let next: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("paddock_power_next_slot_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((3.0..=4.0).contains(&next), "{text}");
        assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
        let follower = add_metrics("# EOF\n".into(), &ThrottleView::default());
        assert!(!follower.contains("next_slot"), "{follower}");
    }

    #[test]
    fn actions_and_statuses() {
        for a in ["on", "off", "cycle", "status"] {
            assert_eq!(Action::parse(a).unwrap().as_str(), a);
        }
        assert_eq!(Action::parse("reboot"), Some(Action::Cycle));
        assert_eq!(Action::parse("explode"), None);
        assert_eq!(status_of(ErrorKind::Credentials), 502);
        assert_eq!(status_of(ErrorKind::Unreachable), 502);
        assert_eq!(status_of(ErrorKind::Refused), 409);
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        power: Arc<Power>,
        app: Router,
    }

    fn fixture() -> Fixture {
        fixture_with(PowerConfig {
            answer_within: Duration::from_secs(20),
            ..PowerConfig::default()
        })
    }

    fn fixture_with(config: PowerConfig) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let inspector = Arc::new(Inspector::new(store.clone(), Default::default()));
        let retry = RetryPolicy {
            attempts: 1,
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(10),
        };
        let power = Power::new(store, inspector.clone(), config, retry);
        inspector.observe(Arc::new(ManageBoot(power.clone())));
        let app = paddock_inspector::api::router(inspector).merge(router(power.clone()));
        Fixture {
            _dir: dir,
            power,
            app,
        }
    }

    async fn call(app: &Router, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            ))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `POST /api/v1/nodes/{node}/power {"action"}`.
    async fn power(app: &Router, node: &str, action: &str) -> (u16, String) {
        let path = format!("/api/v1/nodes/{node}/power");
        call(app, "POST", &path, Some(json!({"action": action}))).await
    }

    /// A port on loopback that nothing listens on: connections are refused at once.
    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn no_answer_ever_shows_the_bmc_password_and_a_dead_bmc_is_a_clear_error() {
        let f = fixture();
        let port = closed_port();
        let (st, created) = call(
            &f.app,
            "POST",
            "/api/v1/nodes",
            Some(
                json!({"name": "r1u1", "bmc_address": "127.0.0.1", "driver": "redfish",
                "driver_info": {"redfish_address": format!("http://127.0.0.1:{port}"),
                    "redfish_username": "admin", "redfish_password": SECRET}}),
            ),
        )
        .await;
        assert_eq!(st, 201, "{created}");
        // Every answer that shows the node or its power: never the password.
        let mut answers = vec![created];
        for path in [
            "/api/v1/nodes",
            "/api/v1/nodes/r1u1",
            "/api/v1/nodes/r1u1/power",
            "/api/v1/power",
        ] {
            answers.push(call(&f.app, "GET", path, None).await.1);
        }
        let patched = call(
            &f.app,
            "PATCH",
            "/api/v1/nodes/r1u1",
            Some(json!([{"op": "add", "path": "/extra/rack", "value": "r1"}])),
        )
        .await;
        assert_eq!(patched.0, 200, "{}", patched.1);
        answers.push(patched.1);
        let (st, off) = power(&f.app, "r1u1", "off").await;
        assert_eq!(st, 502, "{off}");
        assert!(
            off.contains("node r1u1: power off: BMC unreachable"),
            "a clear error: {off}"
        );
        answers.push(off);
        let shown = call(&f.app, "GET", "/api/v1/nodes/r1u1", None).await.1;
        assert!(
            shown.contains("power off failed (operator): BMC unreachable"),
            "the failure is on the timeline: {shown}"
        );
        answers.push(shown);
        for a in &answers {
            assert!(!a.contains(SECRET), "the password leaked: {a}");
        }
        assert!(answers[2].contains("******"), "masked as Ironic does");
        let (st, bad) = power(&f.app, "r1u1", "explode").await;
        assert_eq!(st, 400, "{bad}");
        assert!(
            f.power.throttle_view().next_slot_ms.is_none(),
            "not running"
        );
    }

    #[tokio::test]
    async fn the_leaders_throttle_starts_queued_power_ons_in_order_and_spaced() {
        let f = fixture_with(PowerConfig {
            max_power_ons: 2,
            interval: Duration::from_secs(1),
            ..PowerConfig::default()
        });
        let port = closed_port();
        let mut nodes = Vec::new();
        for i in 0..6 {
            let (st, body) = call(
                &f.app,
                "POST",
                "/api/v1/nodes",
                Some(
                    json!({"name": format!("n{i}"), "bmc_address": format!("198.18.9.{i}"),
                    "driver": "redfish", "driver_info": {
                        "redfish_address": format!("http://127.0.0.1:{port}")}}),
                ),
            )
            .await;
            assert_eq!(st, 201, "{body}");
            let node: Node = serde_json::from_str(&body).unwrap();
            let q = Queued {
                id: Uuid::new_v4(),
                action: Action::On,
                pxe_once: false,
                reason: "test".into(),
                introspection: None,
                at_ms: now_ms(),
            };
            assert!(f.power.queue(&node, &q).await.unwrap());
            assert!(!f.power.queue(&node, &q).await.unwrap(), "one place each");
            nodes.push(node.uuid);
        }
        let (_tx, rx) = tokio::sync::watch::channel(Some(crate::leader::Leadership::Sole));
        let task = tokio::spawn(f.power.clone().run_throttle(rx));
        let t = Instant::now();
        let done = loop {
            let mut at = Vec::new();
            for n in &nodes {
                if let Some(last) = f.power.record(*n).await.last {
                    at.push((last.at_ms, *n));
                }
            }
            if at.len() == nodes.len() {
                break at;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{at:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        task.abort();
        let mut at = done;
        at.sort();
        let order: Vec<Uuid> = at.iter().map(|(_, n)| *n).collect();
        let first = at[0].0;
        let ms: Vec<u64> = at.iter().map(|(t, _)| t - first).collect();
        // Pairs a window apart (the outcomes land a BMC call after the admission).
        for i in 0..ms.len() - 2 {
            assert!(ms[i + 2] - ms[i] >= 900, "3 power-ons within 1 s: {ms:?}");
        }
        assert!(ms[5] < 3_500, "{ms:?}");
        // First come, first served, within each pair's window.
        for (pair, chunk) in order.chunks(2).enumerate() {
            let mut want = nodes[pair * 2..pair * 2 + 2].to_vec();
            let mut got = chunk.to_vec();
            want.sort();
            got.sort();
            assert_eq!(got, want, "pair {pair}: {ms:?}");
        }
        assert!(f.power.store.range(QUEUE).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn manage_boot_queues_a_pxe_power_on_for_the_throttle_and_a_failure_ends_the_introspection()
     {
        let f = fixture();
        let port = closed_port();
        let (st, body) = call(
            &f.app,
            "POST",
            "/api/v1/nodes",
            Some(
                json!({"name": "r1u2", "macs": ["52:54:00:00:00:42"], "driver": "redfish",
                "driver_info": {"redfish_address": format!("http://127.0.0.1:{port}"),
                    "redfish_username": "admin", "redfish_password": SECRET}}),
            ),
        )
        .await;
        assert_eq!(st, 201, "{body}");
        // A node with no BMC: manage_boot does nothing but say so.
        let (st, _) = call(
            &f.app,
            "POST",
            "/api/v1/nodes",
            Some(json!({"name": "bare", "macs": ["52:54:00:00:00:43"]})),
        )
        .await;
        assert_eq!(st, 201);
        for n in ["r1u2", "bare"] {
            let (st, b) = call(&f.app, "POST", &format!("/v1/introspection/{n}"), None).await;
            assert_eq!(st, 202, "{b}");
        }
        let queue = f.power.store.range(QUEUE).await.unwrap();
        assert_eq!(queue.len(), 1, "only the node with a BMC waits");
        let q: Queued = serde_json::from_slice(&queue[0].value).unwrap();
        assert!(q.pxe_once && q.action == Action::Cycle && q.introspection.is_some());
        let bare = call(&f.app, "GET", "/api/v1/nodes/bare", None).await.1;
        assert!(bare.contains("power the node on by hand"), "{bare}");
        // The leader's throttle takes it; the BMC does not answer: the introspection ends.
        let (tx, rx) = tokio::sync::watch::channel(Some(crate::leader::Leadership::Sole));
        let task = tokio::spawn(f.power.clone().run_throttle(rx));
        let t = Instant::now();
        let status = loop {
            let (_, s) = call(&f.app, "GET", "/v1/introspection/r1u2", None).await;
            if s.contains("\"error\"") && !s.contains("\"error\":null") {
                break s;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "still {s}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            status.contains("Failed to power on the node: BMC unreachable"),
            "{status}"
        );
        assert!(f.power.store.range(QUEUE).await.unwrap().is_empty());
        let v = f.power.throttle_view();
        assert!(
            v.leading && v.queued == 0 && v.next_slot_ms.is_some(),
            "{v:?}"
        );
        let node = call(&f.app, "GET", "/api/v1/nodes/r1u2", None).await.1;
        assert!(
            node.contains("PXE boot once, then reboot failed (introspection)"),
            "{node}"
        );
        assert!(!node.contains(SECRET));
        drop(tx);
        task.abort();
    }
}
