//! The inspector over the store: node records and their indexes, introspection start, abort,
//! continue (lookup, auto-enrol, hooks, rules), stored data, rules, timeouts, and the
//! per-node timeline. Every change is one compare-and-swap transaction on the node's record,
//! retried on conflict, so two hosts (or two requests) never both apply a transition.
//!
//! - [`records`]: store keys, node records and their indexes, the CAS every change uses;
//! - [`introspection`]: start, abort, continue, reprocess, timeouts (the pure part of
//!   processing is [`crate::processing`]);
//! - [`rule_store`]: rules in the store;
//! - [`timeline`]: the per-node timeline.
//!
//! Errors are [`InspectorError`]s: a domain [`ErrorKind`] and Inspector's message; the API
//! layer alone turns a kind into an HTTP status.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use paddock_inventory::MacAddr;
use paddock_store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use self::timeline::LastAnswer;

pub mod introspection;
pub mod records;
pub mod rule_store;
pub mod timeline;

pub use introspection::ENROLL_DRIVER;
pub use records::{BMCS, DATA, MACS, NAMES, NODES, Versioned};
pub use rule_store::RULES;
pub use timeline::{
    DhcpAnswer, DhcpReply, EVENTS, Subject, TimelineEvent, TimelineLimits, Windows,
    introspection_windows, timeline_op, timeline_prune,
};

/// Unix milliseconds now.
use paddock_wire::unix_ms as now_ms;

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
    /// Where a BMC an agent reports may be (`[power] bmc_networks`): a reported address
    /// elsewhere is not made the node's, so the appliance never contacts it on an
    /// agent's word. Without an agent token (insecure mode), every address is taken.
    pub agent_bmc_networks: Vec<ipnet::IpNet>,
}

impl Default for InspectorConfig {
    fn default() -> Self {
        InspectorConfig {
            auto_enrol: true,
            timeout_secs: 3600,
            max_body_bytes: 4 << 20,
            after_inspection: NextAction::Poweroff,
            public_url: String::new(),
            agent_bmc_networks: Vec::new(),
        }
    }
}

/// What kind of failure an [`InspectorError`] is, in the inspector's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request, the data or the transition is refused (a malformed body, a state that
    /// does not allow it, a failed processing).
    Invalid,
    /// No such node, rule or stored data.
    NotFound,
    /// Another node holds the MAC, name or BMC address; the record changed too often
    /// underneath; the rule exists.
    Conflict,
    /// This host is no longer the leader; the new leader does this work.
    NotLeader,
    /// The caller's credential does not speak for this machine (an agent token for
    /// another MAC).
    Forbidden,
    /// The store failed, or a record in it is unreadable.
    Store,
}

/// An inspector failure: its kind and Inspector's message (`message` is what clients see).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InspectorError {
    pub kind: ErrorKind,
    pub message: String,
}

impl InspectorError {
    pub fn of(kind: ErrorKind, message: impl Into<String>) -> Self {
        InspectorError {
            kind,
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::of(ErrorKind::Invalid, message)
    }
    fn conflict(message: impl Into<String>) -> Self {
        Self::of(ErrorKind::Conflict, message)
    }
    fn node_not_found(ident: &str) -> Self {
        Self::of(
            ErrorKind::NotFound,
            format!("Could not find node {ident} in cache"),
        )
    }
    fn busy() -> Self {
        Self::conflict("node is busy: too many concurrent changes, try again")
    }
}

impl From<StoreError> for InspectorError {
    fn from(e: StoreError) -> Self {
        InspectorError::of(ErrorKind::Store, format!("store error: {e}"))
    }
}

type Result<T> = std::result::Result<T, InspectorError>;

/// Which node records changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed<'a> {
    /// Not known which: look at every node.
    All,
    /// These (none: nothing changed).
    Nodes(&'a [Uuid]),
}

/// Told after every change of node records (the PXE filter follows them). Awaited before
/// the API call that caused the change returns.
/// What an observer's reaction to a change is: a future the inspector awaits.
pub type Reaction<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

pub trait NodeObserver: Send + Sync {
    fn nodes_changed<'a>(&'a self, changed: Changed<'a>) -> Reaction<'a>;
}

pub struct Inspector {
    store: Arc<dyn Store>,
    pub config: InspectorConfig,
    observer: std::sync::OnceLock<Arc<dyn NodeObserver>>,
    /// Every MAC's last DHCP answer, so that renewals are counted, not filed one by one.
    last_answers: Mutex<HashMap<MacAddr, LastAnswer>>,
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
        if let Some(o) = self.observer.get()
            && !nodes.is_empty()
        {
            o.nodes_changed(Changed::Nodes(nodes)).await;
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

pub fn now_secs() -> i64 {
    now_ms() / 1000
}
