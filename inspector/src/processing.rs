//! Processing posted introspection data for a node that lookup found (or enrolled): the
//! state check, Inspector's processing hooks, then the rules; and the outcome: the node as
//! it is to be stored (finished, or failed with Inspector's message), the processed data and
//! the timeline entries. Pure: no store, no clock. `service::introspection` checks what
//! rules gave the node against other nodes' MACs, names and BMC addresses
//! ([`Processing::refuse`]) and writes the [`Outcome`] in one transaction.

use std::sync::Arc;

use paddock_inventory::{DataError, IntrospectionData, MacAddr};
use serde_json::{Value, json};

use crate::hooks::{self, HookError};
use crate::node::{Introspection, Node, update_capabilities};
use crate::rules::{self, Rule, RuleFailure};
use crate::state::{Event, State};

/// Why processing fails an introspection: the node's `error`, in Inspector's words.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProcessingError {
    /// The ramdisk's own error, no usable interface, no disk for the root hints.
    #[error(transparent)]
    Hook(#[from] HookError),
    /// No inventory, or one without interfaces.
    #[error("{0}")]
    Inventory(Arc<DataError>),
    /// The node is not waiting for data (`process` is allowed from waiting or enrolling).
    #[error("no defined transition for event process from state {}", .0.as_str())]
    Transition(State),
    /// A rule failed, or a Python exception escaped a hook or a rule.
    #[error(transparent)]
    Rule(#[from] RuleFailure),
    /// Rules gave the node a MAC, name or BMC address another node has (Ironic's 409).
    #[error("Unexpected exception ConflictException during processing: {}", .0.message())]
    Conflict(Conflict),
}

impl From<DataError> for ProcessingError {
    fn from(e: DataError) -> Self {
        ProcessingError::Inventory(Arc::new(e))
    }
}

/// A MAC, name or BMC address a change wants that another node holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    Mac(MacAddr),
    Name(String),
    Bmc(String),
}

impl Conflict {
    /// Ironic's message (409).
    pub fn message(&self) -> String {
        match self {
            Conflict::Mac(m) => format!("A port with MAC address {m} already exists."),
            Conflict::Name(n) => format!("A node with name {n} already exists."),
            Conflict::Bmc(b) => format!("BMC address {b} belongs to another node."),
        }
    }

    /// Puts back in `new` what `old` had where the conflict is.
    pub fn revert(&self, new: &mut Node, old: &Node) {
        match self {
            Conflict::Mac(_) => new.macs.clone_from(&old.macs),
            Conflict::Name(_) => new.name.clone_from(&old.name),
            Conflict::Bmc(_) => new.bmc_address.clone_from(&old.bmc_address),
        }
    }
}

/// What processing starts from, besides the node and the rules.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub data: &'a IntrospectionData,
    /// The body as posted (stored as it came).
    pub body: &'a [u8],
    /// The body's JSON, parsed once with `data`: rules see it, not Paddock's reading of it.
    pub raw: &'a Value,
    /// The node was enrolled from this very data.
    pub enrolled: bool,
    /// A failure known before processing (the ramdisk's error, unusable interfaces).
    pub pre_failure: Option<&'a ProcessingError>,
    /// The data came with an agent's token: it speaks for the machine that owns this MAC
    /// alone, and adds no MAC to the node (an inventory can name any MAC it likes).
    pub speaker: Option<MacAddr>,
    /// Whether the BMC address the data reports may become the node's (the appliance would
    /// then send IPMI or Redfish to it): not when an agent reports one outside the
    /// networks the configuration names; an operator or a rule sets it instead.
    pub trust_bmc: bool,
}

/// One timeline entry of the node's processing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub message: String,
    pub error: bool,
}

impl Entry {
    fn new(kind: &'static str, message: impl Into<String>, error: bool) -> Self {
        Entry {
            kind,
            message: message.into(),
            error,
        }
    }
}

/// The node after the hooks and the rules, before the outcome is settled.
#[derive(Clone, Debug)]
pub struct Processing {
    /// The node with what the hooks and the rules set.
    pub node: Node,
    /// The node before the rules ran (what [`Processing::refuse`] reverts to); `None` when
    /// the hooks failed and no rule ran.
    pub before_rules: Option<Node>,
    /// The hooks' processed data (stored as `processed`).
    pub processed: Option<Value>,
    /// The rules whose conditions held.
    pub matched: Vec<String>,
    pub result: Result<(), ProcessingError>,
    /// The introspection state before processing.
    state: State,
    entries: Vec<Entry>,
}

/// What processing ends in: the node to store, its processed data and timeline entries.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The node, its introspection finished or in error.
    pub node: Node,
    pub processed: Option<Value>,
    /// In order: enrolled, inventory received, hooks, rules, finished or failed.
    pub entries: Vec<Entry>,
    pub result: Result<(), ProcessingError>,
}

/// Runs the state check, the processing hooks and the rules (in the order given) on `node`.
/// A failing rule leaves the changes made before it, as Inspector's do. The outcome is
/// [`Processing::conclude`]'s.
pub fn process(input: Input<'_>, node: Node, rules: &[Rule]) -> Processing {
    let state = node.state().unwrap_or(State::Finished);
    let mut entries = Vec::new();
    if input.enrolled {
        entries.push(Entry::new(
            "enrolled",
            "unknown machine enrolled from its inventory",
            false,
        ));
    }
    entries.push(Entry::new(
        "inventory-received",
        "inventory received",
        false,
    ));
    let mut processing = Processing {
        node,
        before_rules: None,
        processed: None,
        matched: Vec::new(),
        result: Ok(()),
        state,
        entries,
    };
    if !input.trust_bmc
        && let Some(b) = input
            .data
            .inventory
            .as_ref()
            .and_then(|i| crate::lookup::real_bmc(i.bmc_address.as_deref()))
    {
        processing.entries.push(Entry::new(
            "bmc-not-trusted",
            format!(
                "BMC address {b} reported by the machine is outside [power] bmc_networks: \
                 not used until an operator or a rule sets it"
            ),
            false,
        ));
    }
    match run_hooks(input, state, &mut processing.node) {
        Ok(processed) => {
            processing.entries.push(Entry::new(
                "hooks",
                "processing hooks ran: validate_interfaces, lldp_basic, root_disk_selection, scheduler, capabilities",
                false,
            ));
            let applied = rules::apply(rules, &processed, &processing.node);
            let before = std::mem::replace(&mut processing.node, applied.node);
            processing.before_rules = Some(before);
            processing.matched = applied.matched;
            processing.result = applied.failure.map_or(Ok(()), |f| Err(f.into()));
            processing.processed = Some(processed);
        }
        Err(e) => processing.result = Err(e),
    }
    processing
}

/// The hooks (`ramdisk_error` and interfaces first, then `validate_interfaces`,
/// `root_disk_selection`, `scheduler`, `capabilities`): sets the node's properties, MACs,
/// PXE MAC and BMC address; returns the processed data.
fn run_hooks(input: Input<'_>, state: State, node: &mut Node) -> Result<Value, ProcessingError> {
    if let Some(e) = input.pre_failure {
        return Err(e.clone());
    }
    // `process` is strict: only from waiting or enrolling.
    if state.next(Event::Process).is_none() {
        return Err(ProcessingError::Transition(state));
    }
    let data = input.data;
    let inv = data.inventory_checked()?;
    let ifaces = hooks::validate_interfaces(data, inv)?;
    let hints = node.properties.get("root_device");
    let root = hooks::root_disk_selection(data, inv, hints)?;
    let hinted = hints
        .and_then(Value::as_object)
        .is_some_and(|h| !h.is_empty());
    let processed = hooks::processed(input.raw, &ifaces, root.as_ref(), hinted, input.enrolled);
    node.properties.extend(hooks::properties(&processed));
    let caps = hooks::capabilities(inv);
    if !caps.is_empty() {
        let merged = update_capabilities(node.properties.get("capabilities"), &caps)
            .map_err(|e| rules::unexpected(&e))?;
        node.properties.insert("capabilities".into(), json!(merged));
    }
    if input.speaker.is_none() {
        for m in &ifaces.all_macs {
            if !node.macs.contains(m) {
                node.macs.push(*m);
            }
        }
    }
    for (mac, link) in &ifaces.links {
        node.ports
            .entry(mac.clone())
            .or_default()
            .local_link_connection = link.clone();
    }
    // The token's MAC is the one that PXE-booted: its boot script carried the token.
    node.pxe_mac = input.speaker.or(ifaces.pxe_mac).or(node.pxe_mac);
    if node.bmc_address.is_none() && input.trust_bmc {
        node.bmc_address = ifaces.bmc.clone();
    }
    Ok(processed)
}

impl Processing {
    /// Rules gave the node something another node holds: it keeps its own, and processing
    /// fails (unless it failed already).
    pub fn refuse(&mut self, conflict: Conflict) {
        if let Some(before) = &self.before_rules {
            conflict.revert(&mut self.node, before);
        }
        if self.result.is_ok() {
            self.result = Err(ProcessingError::Conflict(conflict));
        }
    }

    /// Settles the introspection at `now` (Unix seconds): finished, or in error with the
    /// failure's message.
    pub fn conclude(self, now: i64) -> Outcome {
        let Processing {
            mut node,
            processed,
            matched,
            result,
            state,
            mut entries,
            ..
        } = self;
        if !matched.is_empty() {
            entries.push(Entry::new(
                "rules",
                format!("rules applied: {}", matched.join(", ")),
                false,
            ));
        }
        let intro = node.introspection.get_or_insert(Introspection {
            state,
            started_at: Some(now),
            finished_at: None,
            error: None,
            manage_boot: false,
            set_image: None,
        });
        intro.finished_at = Some(now);
        match &result {
            Ok(()) => {
                intro.state = State::Finished;
                intro.error = None;
                entries.push(Entry::new(
                    "introspection-finished",
                    "introspection finished",
                    false,
                ));
            }
            Err(e) => {
                let message = e.to_string();
                intro.state = State::Error;
                intro.error = Some(message.clone());
                entries.push(Entry::new("introspection-failed", message, true));
            }
        }
        Outcome {
            node,
            processed,
            entries,
            result,
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::node::Secrets;

    const NOW: i64 = 1_700_000_000;

    fn data(error: Option<&str>) -> (IntrospectionData, Vec<u8>) {
        let body = json!({
            "inventory": {
                "interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01", "ipv4_address": "198.18.0.10"}],
                "disks": [{"name": "/dev/vda", "size": 21_474_836_480_u64}],
                "memory": {"physical_mb": 2048},
                "cpu": {"count": 2, "architecture": "x86_64"},
                "bmc_address": "198.18.9.1"
            },
            "boot_interface": "52:54:00:00:00:01",
            "error": error,
        });
        let raw = serde_json::to_vec(&body).unwrap();
        (IntrospectionData::parse(&raw).unwrap(), raw)
    }

    fn node(state: Option<State>) -> Node {
        let mut n = Node::new(Uuid::nil(), NOW - 60);
        n.macs = vec!["52:54:00:00:00:01".parse().unwrap()];
        n.introspection = state.map(|state| Introspection {
            state,
            started_at: Some(NOW - 30),
            finished_at: None,
            error: None,
            manage_boot: true,
            set_image: None,
        });
        n
    }

    fn rule(description: &str, actions: Value) -> Rule {
        Rule {
            uuid: Uuid::nil(),
            description: Some(description.into()),
            scope: None,
            conditions: vec![
                json!({"op": "ge", "field": "memory_mb", "value": 1024, "invert": false, "multiple": "any"}),
            ],
            actions: actions.as_array().unwrap().clone(),
            created_at: 0,
        }
    }

    fn kinds(o: &Outcome) -> Vec<&str> {
        o.entries.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn outcomes() {
        let set_rack = rule(
            "rack",
            json!([{"action": "set-attribute", "path": "/extra/rack", "value": "r{data[memory_mb]}"}]),
        );
        let fail = rule("stop", json!([{"action": "fail", "message": "no thanks"}]));
        let enrolling = {
            let mut n = node(Some(State::Enrolling));
            n.macs.clear();
            n
        };
        struct Case {
            name: &'static str,
            node: Node,
            rules: Vec<Rule>,
            enrolled: bool,
            ramdisk_error: Option<&'static str>,
            error: Option<&'static str>,
            entries: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "waiting node, a rule sets an attribute",
                node: node(Some(State::Waiting)),
                rules: vec![set_rack.clone()],
                enrolled: false,
                ramdisk_error: None,
                error: None,
                entries: &[
                    "inventory-received",
                    "hooks",
                    "rules",
                    "introspection-finished",
                ],
            },
            Case {
                name: "a rule fails the processing",
                node: node(Some(State::Waiting)),
                rules: vec![set_rack.clone(), fail.clone()],
                enrolled: false,
                ramdisk_error: None,
                error: Some("no thanks"),
                entries: &[
                    "inventory-received",
                    "hooks",
                    "rules",
                    "introspection-failed",
                ],
            },
            Case {
                name: "a new node enrolled",
                node: enrolling,
                rules: Vec::new(),
                enrolled: true,
                ramdisk_error: None,
                error: None,
                entries: &[
                    "enrolled",
                    "inventory-received",
                    "hooks",
                    "introspection-finished",
                ],
            },
            Case {
                name: "the ramdisk reported an error",
                node: node(Some(State::Waiting)),
                rules: vec![set_rack.clone()],
                enrolled: false,
                ramdisk_error: Some("disk on fire"),
                error: Some("Ramdisk reported error: disk on fire"),
                entries: &["inventory-received", "introspection-failed"],
            },
            Case {
                name: "a node not under introspection",
                node: node(Some(State::Finished)),
                rules: vec![set_rack],
                enrolled: false,
                ramdisk_error: None,
                error: Some("no defined transition for event process from state finished"),
                entries: &["inventory-received", "introspection-failed"],
            },
        ];
        for case in cases {
            let (data, body) = data(case.ramdisk_error);
            let raw: Value = serde_json::from_slice(&body).unwrap();
            let pre = hooks::ramdisk_error(&data).err().map(ProcessingError::from);
            let input = Input {
                data: &data,
                body: &body,
                raw: &raw,
                enrolled: case.enrolled,
                pre_failure: pre.as_ref(),
                speaker: None,
                trust_bmc: true,
            };
            let out = process(input, case.node, &case.rules).conclude(NOW);
            let name = case.name;
            let intro = out.node.introspection.clone().unwrap();
            assert_eq!(intro.finished_at, Some(NOW), "{name}");
            assert_eq!(
                out.result
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .as_deref(),
                case.error,
                "{name}"
            );
            assert_eq!(intro.error.as_deref(), case.error, "{name}");
            let want = if case.error.is_some() {
                State::Error
            } else {
                State::Finished
            };
            assert_eq!(intro.state, want, "{name}");
            assert_eq!(kinds(&out), case.entries, "{name}");
            if case.error.is_none() {
                assert_eq!(out.node.macs.len(), 1, "{name}: the inventory's MAC");
                assert_eq!(
                    out.node.bmc_address.as_deref(),
                    Some("198.18.9.1"),
                    "{name}"
                );
                assert_eq!(out.node.properties["memory_mb"], json!(2048), "{name}");
                assert!(out.processed.is_some(), "{name}");
            }
        }
    }

    /// The test data (no ramdisk error) processed for a waiting node with `rules`.
    fn waiting_with(rules: &[Rule]) -> Processing {
        let (data, body) = data(None);
        let raw: Value = serde_json::from_slice(&body).unwrap();
        let input = Input {
            data: &data,
            body: &body,
            raw: &raw,
            enrolled: false,
            pre_failure: None,
            speaker: None,
            trust_bmc: true,
        };
        process(input, node(Some(State::Waiting)), rules)
    }

    /// `body` as posted for a waiting node, processed with `rules`; `speaker`: the MAC of the
    /// agent's token.
    fn posted(body: &Value, speaker: Option<MacAddr>, rules: &[Rule]) -> Outcome {
        let raw = serde_json::to_vec(body).unwrap();
        let data = IntrospectionData::parse(&raw).unwrap();
        let input = Input {
            data: &data,
            body: &raw,
            raw: body,
            enrolled: false,
            pre_failure: None,
            speaker,
            trust_bmc: true,
        };
        process(input, node(Some(State::Waiting)), rules).conclude(NOW)
    }

    #[test]
    fn an_agents_data_adds_no_mac_to_the_node() {
        let body = json!({
            "inventory": {
                "interfaces": [
                    {"name": "eth0", "mac_address": "52:54:00:00:00:01"},
                    {"name": "eth1", "mac_address": "52:54:00:00:00:99"}
                ],
                "disks": [{"name": "/dev/vda", "size": 21_474_836_480_u64}],
                "memory": {"physical_mb": 2048},
                "cpu": {"count": 2, "architecture": "x86_64"}
            },
            "boot_interface": "52:54:00:00:00:99",
        });
        let own: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        for (speaker, want_macs) in [(Some(own), 1), (None, 2)] {
            let out = posted(&body, speaker, &[]);
            assert!(out.result.is_ok(), "{:?}", out.result);
            assert_eq!(out.node.macs.len(), want_macs, "speaker {speaker:?}");
            if speaker.is_some() {
                assert_eq!(out.node.pxe_mac, Some(own), "the token's MAC booted");
            }
        }
    }

    /// `lldp_basic`: the switch port an agent heard is in the processed data where
    /// Inspector puts it, and a rule in Kayobe's style names the node from it.
    #[test]
    fn lldp_is_processed_and_a_rule_names_the_node_by_its_switch_port() {
        let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        for (description, name) in [("Ethernet1/7", None), ("compute-0", Some("compute-0"))] {
            let body = json!({
                "inventory": {
                    "interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01",
                                    "lldp": [[1, "04525400aabbcc"], [2, "0465746831"], [3, "0078"],
                                             [5, hex("tor-sw-1")], [4, hex(description)], [0, ""]]}],
                    "disks": [{"name": "/dev/vda", "size": 21_474_836_480_u64}],
                    "memory": {"physical_mb": 2048},
                    "cpu": {"count": 2, "architecture": "x86_64"}
                },
                "boot_interface": "52:54:00:00:00:01",
            });
            let field = "data://all_interfaces.eth0.lldp_processed.switch_port_description";
            let kayobe = Rule {
                uuid: Uuid::nil(),
                description: Some("name from the switch port".into()),
                scope: None,
                conditions: vec![
                    json!({"op": "matches", "field": field, "value": "^compute-[0-9]+"}),
                ],
                actions: vec![json!({"action": "set-attribute", "path": "name",
                    "value": "{data[all_interfaces][eth0][lldp_processed][switch_port_description]}"})],
                created_at: 0,
            };
            let out = posted(&body, None, &[kayobe]);
            assert!(out.result.is_ok(), "{:?}", out.result);
            let lldp = &out.processed.unwrap()["all_interfaces"]["eth0"]["lldp_processed"];
            assert_eq!(lldp["switch_port_description"], description, "{lldp}");
            assert_eq!(lldp["switch_system_name"], "tor-sw-1");
            assert_eq!(lldp["switch_chassis_id"], "52:54:00:aa:bb:cc");
            assert_eq!(lldp["switch_port_id"], "eth1");
            assert_eq!(out.node.name.as_deref(), name);
            // The port's local_link_connection, as Ironic's port has it.
            let port = &out.node.ports["52:54:00:00:00:01"];
            assert_eq!(
                Value::Object(port.local_link_connection.clone()),
                json!({"switch_id": "52:54:00:aa:bb:cc", "port_id": "eth1",
                       "switch_info": "tor-sw-1"})
            );
        }
    }

    #[test]
    fn a_rule_sets_the_attribute_it_names() {
        let rules = [rule(
            "rack",
            json!([{"action": "set-attribute", "path": "/extra/rack", "value": "r{data[memory_mb]}"}]),
        )];
        let out = waiting_with(&rules).conclude(NOW);
        assert_eq!(out.node.view(Secrets::Masked)["extra"]["rack"], "r2048");
        assert_eq!(out.entries[2].message, "rules applied: rack");
    }

    #[test]
    fn a_refused_rule_change_is_reverted_and_fails() {
        let rules = [rule(
            "name",
            json!([{"action": "set-attribute", "path": "/name", "value": "taken"}]),
        )];
        let mut p = waiting_with(&rules);
        assert_eq!(p.node.name.as_deref(), Some("taken"));
        p.refuse(Conflict::Name("taken".into()));
        let out = p.conclude(NOW);
        assert_eq!(out.node.name, None);
        assert_eq!(
            out.node.introspection.unwrap().error.as_deref(),
            Some(
                "Unexpected exception ConflictException during processing: A node with name taken already exists."
            )
        );
    }
}
