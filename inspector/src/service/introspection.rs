//! The introspection flow over the store: start, abort, continue (lookup, auto-enrolment,
//! then [`processing::process`] and one transaction recording its outcome), reprocessing
//! stored data, timeouts, and what a ramdisk does next.

use paddock_inventory::{IntrospectionData, MacAddr, normalise_mac};
use paddock_store::{Compare, Op, Revision};
use serde_json::Value;
use uuid::Uuid;

use super::records::{BMCS, DATA, Versioned, node_txn};
use super::timeline::{Subject, entry_ms, event_op};
use super::{ErrorKind, Inspector, InspectorError, NextAction, Result};
use crate::hooks;
use crate::lookup::{Lookup, lookup};
use crate::node::{Introspection, Node};
use crate::processing::{self, Input, ProcessingError};
use crate::state::{Event, State};

/// The driver auto-enrolled nodes get (Inspector's `[discovery] enroll_node_driver` default).
pub const ENROLL_DRIVER: &str = "fake-hardware";

impl Inspector {
    /// Applies one transition to the node's record ([`Inspector::update`]) and tells the
    /// observer.
    async fn transition(
        &self,
        ident: &str,
        change: impl FnMut(&mut Node, &mut Vec<Op>) -> Result<()>,
    ) -> Result<Node> {
        let (node, ()) = self.update(ident, change).await?;
        self.changed(&[node.uuid]).await;
        Ok(node)
    }

    /// `POST /v1/introspection/{node}`.
    pub async fn start(&self, ident: &str, manage_boot: bool, now: i64) -> Result<Node> {
        self.transition(ident, |node, ops| {
            let state = node.state().unwrap_or(State::Finished);
            // Starting a running introspection again leaves it waiting (as Inspector does).
            let next = match state {
                State::Waiting | State::Starting => State::Waiting,
                s => match s.next(Event::Start) {
                    Some(_) => State::Waiting,
                    None => {
                        return Err(InspectorError::invalid(format!(
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
                set_image: None,
            });
            ops.push(Op::DeletePrefix {
                prefix: format!("{DATA}{}/", node.uuid),
            });
            ops.push(event_op(
                Subject::Node(node.uuid),
                entry_ms(now),
                0,
                "introspection-started",
                "introspection started: the node boots the discovery ramdisk at its next PXE boot",
                false,
            ));
            Ok(())
        })
        .await
    }

    /// `POST /v1/introspection/{node}/abort`.
    pub async fn abort(&self, ident: &str, now: i64) -> Result<Node> {
        self.transition(ident, |node, ops| {
            let intro = node.introspection.as_mut().ok_or_else(|| {
                InspectorError::invalid(format!("Node {} is not being introspected", ident))
            })?;
            if intro.state.next(Event::Abort).is_none() {
                return Err(InspectorError::invalid(format!(
                    "Node {ident} can not be aborted in state {}",
                    intro.state.as_str()
                )));
            }
            // There is no power step to wait for: aborting ends at once (abort_end).
            end_in_error(
                intro,
                node.uuid,
                ops,
                now,
                "introspection-aborted",
                "Canceled by operator",
            );
            Ok(())
        })
        .await
    }

    /// `POST /v1/continue`: returns the node's UUID.
    pub async fn process(&self, body: &[u8], now: i64) -> Result<Uuid> {
        self.process_as(body, now, None).await
    }

    /// `POST /v1/continue` from an agent whose token speaks for `speaker`: the node is the
    /// one that owns that MAC (or a new one that owns it alone), never one the inventory's
    /// other MACs or BMC address name, and the data adds no MAC to it.
    pub async fn process_as(
        &self,
        body: &[u8],
        now: i64,
        speaker: Option<MacAddr>,
    ) -> Result<Uuid> {
        let res = self.process_inner(body, now, speaker).await;
        // A refused post changes no node; one whose processing failed is told where it
        // marks the node failed.
        if let Ok(uuid) = &res {
            self.changed(&[*uuid]).await;
        }
        res
    }

    async fn process_inner(&self, body: &[u8], now: i64, speaker: Option<MacAddr>) -> Result<Uuid> {
        let (data, raw) =
            IntrospectionData::read(body).map_err(|e| InspectorError::invalid(e.to_string()))?;
        let ramdisk_error = hooks::ramdisk_error(&data).err().map(ProcessingError::from);
        let interfaces = data
            .inventory_checked()
            .map_err(ProcessingError::from)
            .and_then(|inv| Ok(hooks::validate_interfaces(&data, inv)?));
        // Lookup attributes: every MAC and the BMC address (or just the PXE MAC when the
        // inventory is unusable, so the node can still be marked as failed).
        let (mut macs, mut bmcs): (Vec<MacAddr>, Vec<String>) = match &interfaces {
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
        // An agent's BMC address is data until an operator or a rule confirms it, unless
        // it lies in a network the configuration names.
        let reported_bmc = interfaces.as_ref().ok().and_then(|i| i.bmc.clone());
        let trust_bmc = speaker.is_none()
            || reported_bmc.as_deref().is_none_or(|b| {
                b.parse::<std::net::IpAddr>().is_ok_and(|ip| {
                    self.config
                        .agent_bmc_networks
                        .iter()
                        .any(|n| n.contains(&ip))
                })
            });
        if let Some(own) = speaker {
            // The token's machine must be the one reporting, and it is looked up by its
            // token's MAC alone.
            if !macs.contains(&own) {
                return Err(InspectorError::of(
                    ErrorKind::Forbidden,
                    format!("agent token: issued for {own}, which the inventory does not list"),
                ));
            }
            macs = vec![own];
            bmcs.clear();
        }
        if macs.is_empty() && bmcs.is_empty() {
            // Inspector runs its `ramdisk_error` hook first: what the ramdisk said is the
            // cause the operator needs, not the inventory it could therefore not send.
            let why = ramdisk_error
                .or(interfaces.err())
                .map_or_else(|| "no lookup attributes".into(), |e| e.to_string());
            return Err(InspectorError::invalid(why));
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
                    return Err(InspectorError::invalid(format!(
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
                        return Err(InspectorError::invalid(msg));
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
                        node.pxe_mac = speaker.or(i.pxe_mac);
                        if trust_bmc {
                            node.bmc_address = i.bmc.clone();
                        }
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
                        set_image: None,
                    });
                    (node, 0, true)
                }
                None => {
                    return Err(InspectorError::invalid(format!(
                        "Look up error: Could not find a node for attributes {{'bmc_address': {bmcs:?}, 'mac': {:?}}} (auto-enrolment is off)",
                        macs.iter().map(MacAddr::to_string).collect::<Vec<_>>()
                    )));
                }
            };
            let input = Input {
                data: &data,
                body,
                raw: &raw,
                enrolled,
                pre_failure: pre_failure.as_ref(),
                speaker,
                trust_bmc,
            };

            match self.record_processing(input, node, rev, now).await? {
                Recorded::Finished(uuid) => return Ok(uuid),
                Recorded::Failed(uuid, e) => {
                    self.changed(&[uuid]).await;
                    return Err(InspectorError::invalid(e.to_string()));
                }
                Recorded::Raced => continue, // lost a race with another writer: look up again
            }
        }
        Err(InspectorError::busy())
    }

    /// Processes the data for `old` (read at revision `rev`, or enrolled) and writes the
    /// outcome in one transaction: the node, its stored data and timeline entries.
    async fn record_processing(
        &self,
        input: Input<'_>,
        old: Node,
        rev: Revision,
        now: i64,
    ) -> Result<Recorded> {
        let rules = self.rules().await?;
        let mut processing = processing::process(input, old.clone(), &rules);
        // A MAC or name another node has: Ironic refuses the PATCH (409), Inspector fails
        // the processing; the node keeps its own.
        if let Some(before) = processing.before_rules.clone() {
            while let Some(c) = self.conflict(&before, &processing.node).await? {
                processing.refuse(c);
            }
        }
        let outcome = processing.conclude(now);
        let uuid = outcome.node.uuid;
        let at = entry_ms(now);
        let mut ops = vec![Op::put(
            format!("{DATA}{uuid}/unprocessed"),
            input.body.to_vec(),
        )];
        for (seq, e) in (1..).zip(&outcome.entries) {
            ops.push(event_op(
                Subject::Node(uuid),
                at,
                seq,
                e.kind,
                &e.message,
                e.error,
            ));
        }
        if let Some(processed) = &outcome.processed {
            ops.push(Op::put(
                format!("{DATA}{uuid}/processed"),
                serde_json::to_vec(processed).unwrap_or_default(),
            ));
        }
        let mut txn = node_txn(&outcome.node, (!input.enrolled).then_some(&old), rev);
        txn.success.extend(ops);
        if !self.store.txn(txn).await?.succeeded {
            return Ok(Recorded::Raced);
        }
        let result = outcome.result.as_ref().map_err(ToString::to_string);
        tracing::info!(node = %uuid, enrolled = input.enrolled, result = ?result, "inspector: inventory processed");
        Ok(match outcome.result {
            Ok(()) => Recorded::Finished(uuid),
            Err(e) => Recorded::Failed(uuid, e),
        })
    }

    /// Stored data: processed (`/data`) or as posted (`/data/unprocessed`).
    pub async fn data(&self, ident: &str, processed: bool) -> Result<Vec<u8>> {
        let v = self
            .find(ident)
            .await?
            .ok_or_else(|| InspectorError::node_not_found(ident))?;
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
                InspectorError::of(
                    ErrorKind::NotFound,
                    format!("Introspection data not found for node {}", v.node.uuid),
                )
            })
    }

    /// `POST /v1/introspection/{node}/data/unprocessed`: process stored (or given) data again.
    pub async fn reapply(&self, ident: &str, body: Option<Value>, now: i64) -> Result<()> {
        let v = self
            .find(ident)
            .await?
            .ok_or_else(|| InspectorError::node_not_found(ident))?;
        let raw = match body {
            Some(Value::Object(o)) => serde_json::to_vec(&Value::Object(o)).unwrap_or_default(),
            Some(_) => {
                return Err(InspectorError::invalid(
                    "Invalid data: expected a JSON object",
                ));
            }
            None => self.data(ident, false).await?,
        };
        let state = v.node.state().unwrap_or(State::Finished);
        if state.next(Event::Reapply).is_none() {
            return Err(InspectorError::conflict(format!(
                "Node {} is busy (state {})",
                v.node.uuid,
                state.as_str()
            )));
        }
        let (data, json) =
            IntrospectionData::read(&raw).map_err(|e| InspectorError::invalid(e.to_string()))?;
        let mut node = v.node.clone();
        if let Some(i) = node.introspection.as_mut() {
            i.state = State::Waiting;
        }
        let pre = hooks::ramdisk_error(&data).err().map(ProcessingError::from);
        let input = Input {
            data: &data,
            body: &raw,
            raw: &json,
            enrolled: false,
            pre_failure: pre.as_ref(),
            speaker: None,
            trust_bmc: true,
        };
        let res = match self.record_processing(input, node, v.rev, now).await? {
            Recorded::Raced => Err(InspectorError::conflict(
                "node changed during reapply, try again",
            )),
            // A failed processing is recorded on the node; the request itself succeeded.
            Recorded::Finished(_) | Recorded::Failed(..) => Ok(()),
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
                    end_in_error(
                        i,
                        node.uuid,
                        ops,
                        now,
                        "introspection-timeout",
                        "Introspection timeout",
                    );
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
            .ok_or_else(|| InspectorError::node_not_found(ident))?;
        Ok(self.action_for(&v.node))
    }

    /// What `node`'s ramdisk does next: wait while it is inspected, then as configured.
    pub fn action_for(&self, node: &Node) -> NextAction {
        if node.inspecting() {
            NextAction::Wait
        } else {
            self.config.after_inspection
        }
    }
}

/// Ends an introspection in error at `now` (Unix seconds) for `why`, filed on the node's
/// timeline as a `kind` entry in the same transaction (`ops`).
fn end_in_error(
    intro: &mut Introspection,
    node: Uuid,
    ops: &mut Vec<Op>,
    now: i64,
    kind: &str,
    why: &str,
) {
    intro.state = State::Error;
    intro.finished_at = Some(now);
    intro.error = Some(why.into());
    ops.push(event_op(
        Subject::Node(node),
        entry_ms(now),
        0,
        kind,
        why,
        true,
    ));
}

/// What recording a processing came to.
enum Recorded {
    /// Written: the introspection finished.
    Finished(Uuid),
    /// Written: the node's introspection failed, for this reason.
    Failed(Uuid, ProcessingError),
    /// The node's record changed underneath; nothing was written.
    Raced,
}
