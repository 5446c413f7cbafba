//! The PXE filter.
//!
//! A pure model ([`Filter`]: allow set, deny set, discovery policy for unknown MACs, pass
//! rule) is rendered into one nftables table, `inet paddock`, built with the `nftables`
//! crate's typed schema ([`Batch`]) and applied with `nft -j -f -` as one atomic batch:
//!
//! ```text
//! chain input      iifname <prov> udp dport {67, 69, 547, 4011} jump whitelist
//! chain whitelist  ether saddr @allow jump pass ; jump blacklist
//! chain blacklist  ether saddr @deny drop ; [discovery: jump pass] ; drop
//! chain pass       iifname @leader accept ; [this host alone serves PXE: accept]
//! ```
//!
//! With several hosts the leader's right to serve is an element of the `leader` set with a
//! timeout no later than its election lease could expire; the leader refreshes it
//! ([`Nft::refresh_leader`]). A leader that is killed stops refreshing, and its interface
//! closes by itself before another host can be elected.
//!
//! An empty `pass` chain returns, and the packet ends in `drop`: without the pass rule the
//! interface is closed (fail closed). Set membership changes are element adds and deletes,
//! never a rebuild.
//!
//! [`Nft::reconcile`] compares the whole table the kernel holds with the rendered one
//! ([`table`]): any chain, hook, priority, policy, rule or set definition that differs
//! rebuilds the table in one batch; differing membership alone is repaired by element
//! changes. A table nft cannot read is an error, never an empty table.
//!
//! A failure closes the filter until a reconcile succeeds again ([`health`]: retried with
//! back-off, the right to serve given back only to a host that may still serve).

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub mod health;
pub mod netlink;
pub mod table;

pub use health::{Closed, Health, leader_element};
pub use table::{Drift, Table, compare};

use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, SetItem};
use nftables::schema::{
    self, FlushObject, NfCmd, NfListObject, NfObject, Nftables, SetFlag, SetType, SetTypeValue,
};
use nftables::stmt::{JumpTarget, Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use paddock_inventory::MacAddr;

pub const TABLE: &str = "paddock";
/// DHCP, TFTP, DHCPv6 and PXE boot-server discovery (the `inet` table sees IPv4 and IPv6).
pub const PORTS: [u16; 4] = [67, 69, 547, 4011];

/// The filter's desired (or applied) state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Machines under introspection or being provisioned.
    pub allow: BTreeSet<MacAddr>,
    /// Every other known machine.
    pub deny: BTreeSet<MacAddr>,
    /// Unknown MACs may PXE-boot (discovery on).
    pub discovery: bool,
    /// This host may answer PXE (the leader's pass rule).
    pub pass: bool,
}

impl Filter {
    /// The state for these machines: `(mac, wanted)` where `wanted` means "may PXE-boot now".
    /// A MAC both wanted and not (two nodes) is allowed.
    pub fn from_machines(
        machines: impl IntoIterator<Item = (MacAddr, bool)>,
        discovery: bool,
        pass: bool,
    ) -> Self {
        let mut f = Filter {
            discovery,
            pass,
            ..Filter::default()
        };
        for (mac, wanted) in machines {
            if wanted {
                f.allow.insert(mac);
            } else {
                f.deny.insert(mac);
            }
        }
        f.deny.retain(|m| !f.allow.contains(m));
        f
    }

    /// The decision the DHCP server applies by `chaddr` (for relayed requests, whose
    /// link-layer source is the relay): the same as the ruleset's.
    pub fn admits(&self, mac: MacAddr) -> bool {
        self.admits_if(mac, self.pass)
    }

    /// The same decision with the right to serve given (several hosts: leadership).
    pub fn admits_if(&self, mac: MacAddr, pass: bool) -> bool {
        pass && (self.allow.contains(&mac) || (!self.deny.contains(&mac) && self.discovery))
    }
}

/// One change from the applied state to the desired one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Add(SetName, MacAddr),
    Delete(SetName, MacAddr),
    Discovery(bool),
    Pass(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SetName {
    Allow,
    Deny,
}

impl SetName {
    fn as_str(self) -> &'static str {
        match self {
            SetName::Allow => "allow",
            SetName::Deny => "deny",
        }
    }
}

/// What turns `from` into `to`. Removals come first so a MAC moving between sets is never in
/// both.
pub fn diff(from: &Filter, to: &Filter) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, a, b) in [
        (SetName::Allow, &from.allow, &to.allow),
        (SetName::Deny, &from.deny, &to.deny),
    ] {
        out.extend(a.difference(b).map(|m| Change::Delete(name, *m)));
    }
    for (name, a, b) in [
        (SetName::Allow, &from.allow, &to.allow),
        (SetName::Deny, &from.deny, &to.deny),
    ] {
        out.extend(b.difference(a).map(|m| Change::Add(name, *m)));
    }
    if from.discovery != to.discovery {
        out.push(Change::Discovery(to.discovery));
    }
    if from.pass != to.pass {
        out.push(Change::Pass(to.pass));
    }
    out
}

/// A batch: commands for `nft -j -f -`, typed by the `nftables` crate's schema.
pub type Batch = Nftables<'static>;

fn add(obj: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(obj))
}

fn table() -> schema::Table<'static> {
    schema::Table {
        family: NfFamily::INet,
        name: TABLE.into(),
        handle: None,
    }
}

fn chain(name: &str) -> schema::Chain<'static> {
    schema::Chain {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: name.to_string().into(),
        ..schema::Chain::default()
    }
}

fn set(name: &str, set_type: SetType) -> NfListObject<'static> {
    NfListObject::Set(Box::new(schema::Set {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: name.to_string().into(),
        set_type: SetTypeValue::Single(set_type),
        ..schema::Set::default()
    }))
}

fn rule(chain: &str, expr: Vec<Statement<'static>>) -> NfObject<'static> {
    add(NfListObject::Rule(schema::Rule {
        family: NfFamily::INet,
        table: TABLE.into(),
        chain: chain.to_string().into(),
        expr: expr.into(),
        ..schema::Rule::default()
    }))
}

fn equals(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn iifname() -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta {
        key: MetaKey::Iifname,
    }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

fn saddr_in(set: &str) -> Statement<'static> {
    equals(
        payload("ether", "saddr"),
        Expression::String(format!("@{set}").into()),
    )
}

fn jump(target: &'static str) -> Statement<'static> {
    Statement::Jump(JumpTarget {
        target: target.into(),
    })
}

fn blacklist_rules(discovery: bool) -> Vec<NfObject<'static>> {
    let mut v = vec![rule(
        "blacklist",
        vec![saddr_in("deny"), Statement::Drop(None)],
    )];
    if discovery {
        v.push(rule("blacklist", vec![jump("pass")]));
    }
    v.push(rule("blacklist", vec![Statement::Drop(None)]));
    v
}

/// The pass chain: the timed leader rule (several hosts: accepted while this host's
/// element in the `leader` set lives, so a leader that dies closes by itself), then the
/// static pass rule of a host that alone serves PXE.
fn pass_rules(pass: bool) -> Vec<NfObject<'static>> {
    let mut v = vec![rule(
        "pass",
        vec![
            equals(iifname(), Expression::String("@leader".into())),
            Statement::Accept(None),
        ],
    )];
    if pass {
        v.push(rule("pass", vec![Statement::Accept(None)]));
    }
    v
}

fn elements(set: SetName, macs: &[MacAddr]) -> NfListObject<'static> {
    NfListObject::Element(schema::Element {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: set.as_str().into(),
        elem: macs
            .iter()
            .map(|m| Expression::String(m.to_string().into()))
            .collect::<Vec<_>>()
            .into(),
    })
}

fn batch(cmds: Vec<NfObject<'static>>) -> Batch {
    Nftables {
        objects: cmds.into(),
    }
}

/// The whole table for `f` on interface `iface`, replacing any previous one (one batch).
pub fn render_full(iface: &str, f: &Filter) -> Batch {
    let mut leader = set("leader", SetType::Ifname);
    if let NfListObject::Set(s) = &mut leader {
        s.flags = Some([SetFlag::Timeout].into());
    }
    let ports = PORTS
        .iter()
        .map(|p| SetItem::Element(Expression::Number(u32::from(*p))))
        .collect();
    let mut cmds = vec![
        add(NfListObject::Table(table())),
        NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(table()))),
        add(NfListObject::Table(table())),
        add(set("allow", SetType::EtherAddr)),
        add(set("deny", SetType::EtherAddr)),
        add(leader),
        add(NfListObject::Chain(schema::Chain {
            _type: Some(NfChainType::Filter),
            hook: Some(NfHook::Input),
            prio: Some(-150),
            policy: Some(NfChainPolicy::Accept),
            ..chain("input")
        })),
        add(NfListObject::Chain(chain("whitelist"))),
        add(NfListObject::Chain(chain("blacklist"))),
        add(NfListObject::Chain(chain("pass"))),
        rule(
            "input",
            vec![
                equals(iifname(), Expression::String(iface.to_string().into())),
                equals(
                    payload("udp", "dport"),
                    Expression::Named(NamedExpression::Set(ports)),
                ),
                jump("whitelist"),
            ],
        ),
        rule("whitelist", vec![saddr_in("allow"), jump("pass")]),
        rule("whitelist", vec![jump("blacklist")]),
    ];
    cmds.extend(blacklist_rules(f.discovery));
    cmds.extend(pass_rules(f.pass));
    for (set, macs) in [(SetName::Allow, &f.allow), (SetName::Deny, &f.deny)] {
        let macs: Vec<MacAddr> = macs.iter().copied().collect();
        if !macs.is_empty() {
            cmds.push(add(elements(set, &macs)));
        }
    }
    batch(cmds)
}

/// The closed table: nothing passes until the first full sync.
pub fn render_closed(iface: &str) -> Batch {
    render_full(iface, &Filter::default())
}

/// A batch for these changes: element adds/deletes, and the blacklist or pass chain
/// rewritten when the policy or the pass rule changes.
pub fn render_changes(changes: &[Change]) -> Batch {
    let mut cmds = Vec::new();
    for set in [SetName::Allow, SetName::Deny] {
        for adding in [false, true] {
            let macs: Vec<MacAddr> = changes
                .iter()
                .filter_map(|c| match *c {
                    Change::Delete(s, m) if !adding && s == set => Some(m),
                    Change::Add(s, m) if adding && s == set => Some(m),
                    _ => None,
                })
                .collect();
            if !macs.is_empty() {
                let obj = elements(set, &macs);
                cmds.push(NfObject::CmdObject(if adding {
                    NfCmd::Add(obj)
                } else {
                    NfCmd::Delete(obj)
                }));
            }
        }
    }
    for c in changes {
        let (name, rules) = match c {
            Change::Discovery(on) => ("blacklist", blacklist_rules(*on)),
            Change::Pass(on) => ("pass", pass_rules(*on)),
            _ => continue,
        };
        cmds.push(NfObject::CmdObject(NfCmd::Flush(FlushObject::Chain(
            chain(name),
        ))));
        cmds.extend(rules);
    }
    batch(cmds)
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run nft (apt-get install nftables): {0}")]
    Spawn(std::io::Error),
    #[error("nft refused the batch: {0}")]
    Refused(String),
    #[error("nft printed something that is not its JSON: {0}")]
    Output(String),
    #[error("cannot write the batch as nft's JSON: {0}")]
    Encode(serde_json::Error),
    #[error("nft cannot read table inet {TABLE}: {0}")]
    Unreadable(String),
    #[error("{0}")]
    Netlink(#[from] netlink::Error),
}

/// How to run `nft`: on this host, or inside a network namespace (tests, labs).
///
/// Set membership changes go over a netlink socket that stays open ([`netlink::SetLink`]);
/// everything else through the `nft` program.
#[derive(Clone, Debug)]
pub struct Nft {
    argv: Vec<String>,
    netns: Option<String>,
    link: Arc<Mutex<Option<netlink::SetLink>>>,
}

impl Nft {
    pub fn local() -> Self {
        Nft {
            argv: vec!["nft".into()],
            netns: None,
            link: Arc::default(),
        }
    }

    pub fn in_netns(ns: &str) -> Self {
        Nft {
            argv: ["ip", "netns", "exec", ns, "nft"]
                .map(String::from)
                .to_vec(),
            netns: Some(ns.to_string()),
            link: Arc::default(),
        }
    }

    /// Several hosts: keeps this host's element in the `leader` set alive for `timeout`
    /// from now (`None`: removes it; the pass chain then accepts nothing for the leader).
    pub fn refresh_leader(&self, iface: &str, timeout: Option<Duration>) -> Result<(), NftError> {
        self.with_link(|l| l.refresh_leader(iface, timeout))
    }

    /// Runs `f` on the open netlink socket (opening it first if needed). After an error
    /// the socket is dropped: a fresh one next time, never one in an unknown state.
    fn with_link(
        &self,
        f: impl FnOnce(&mut netlink::SetLink) -> Result<(), netlink::Error>,
    ) -> Result<(), NftError> {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        if link.is_none() {
            let opened = match &self.netns {
                None => netlink::SetLink::open(),
                Some(ns) => netlink::SetLink::open_in_netns(ns),
            };
            *link = Some(opened.map_err(NftError::Netlink)?);
        }
        let res = link.as_mut().map_or(Ok(()), f).map_err(NftError::Netlink);
        if res.is_err() {
            *link = None;
        }
        res
    }

    /// Applies changes from [`diff`] atomically: membership-only changes as one netlink
    /// batch (no process, no deletion stall), anything touching rules with nft.
    pub fn apply_changes(&self, changes: &[Change]) -> Result<(), NftError> {
        let elements: Option<Vec<netlink::Element>> = changes
            .iter()
            .map(|c| match *c {
                Change::Add(set, mac) => Some(netlink::Element {
                    add: true,
                    set,
                    mac,
                }),
                Change::Delete(set, mac) => Some(netlink::Element {
                    add: false,
                    set,
                    mac,
                }),
                Change::Discovery(_) | Change::Pass(_) => None,
            })
            .collect();
        let Some(elements) = elements else {
            return self.apply(&render_changes(changes));
        };
        self.with_link(|l| l.apply(&elements))
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]);
        c
    }

    /// Applies a batch with `nft -j -f -` (atomic: all or nothing), returning nft's own
    /// error text when it refuses.
    pub fn apply(&self, batch: &Batch) -> Result<(), NftError> {
        let json = serde_json::to_vec(batch).map_err(NftError::Encode)?;
        let mut child = self
            .command()
            .args(["-j", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(NftError::Spawn)?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(&json).map_err(NftError::Spawn)?;
        }
        let out = child.wait_with_output().map_err(NftError::Spawn)?;
        if !out.status.success() {
            return Err(NftError::Refused(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        Ok(())
    }

    /// Reads the table the kernel holds (`None`: it does not exist). Any other failure of
    /// nft is an error, never an empty table.
    pub fn read_table(&self) -> Result<Option<Table>, NftError> {
        let out = self
            .command()
            .args(["-j", "list", "table", "inet", TABLE])
            .output()
            .map_err(NftError::Spawn)?;
        parse_listing(
            out.status.success(),
            &out.stdout,
            &String::from_utf8_lossy(&out.stderr),
        )
    }

    /// The filter the kernel's table implements, as far as Paddock's model can say
    /// ([`Table::filter`]; `None`: no table).
    pub fn read(&self) -> Result<Option<Filter>, NftError> {
        Ok(self.read_table()?.map(|t| t.filter()))
    }

    /// Brings the kernel's table to the one rendered for `want` on `iface`: the whole table
    /// is compared; a difference outside set membership (or no table) rebuilds it in one nft
    /// batch, a difference in membership alone is sent as element changes over netlink.
    /// `last` is what was applied before: the returned drift is how the kernel's table had
    /// moved away from it behind Paddock's back.
    pub fn reconcile(
        &self,
        iface: &str,
        last: &Filter,
        want: &Filter,
    ) -> Result<Reconciled, NftError> {
        let wanted = Table::rendered(iface, want);
        let held = self.read_settled(&wanted)?;
        let drift = compare(held.as_ref(), &Table::rendered(iface, last));
        let repair = compare(held.as_ref(), &wanted);
        let rebuilt = !repair.structure.is_empty();
        if rebuilt {
            self.apply(&render_full(iface, want))?;
        } else if !repair.elements.is_empty() {
            self.apply_changes(&repair.elements)?;
        }
        Ok(Reconciled { drift, rebuilt })
    }

    /// Reads the table; a listing that is not `wanted` is only believed once a second one
    /// agrees with it. The kernel dumps a big hash set in parts, walking the hash again for
    /// each, and a part that runs while the hash is being resized (just after many adds or
    /// deletes) can skip elements the set holds.
    fn read_settled(&self, wanted: &Table) -> Result<Option<Table>, NftError> {
        let mut held = self.read_table()?;
        for _ in 0..SETTLE_READS {
            if held.as_ref() == Some(wanted) {
                break;
            }
            let again = self.read_table()?;
            if again == held {
                break;
            }
            held = again;
            std::thread::sleep(SETTLE_PAUSE);
        }
        Ok(held)
    }
}

/// How many listings [`Nft::reconcile`] reads at most to see two agree, and the pause
/// between them.
const SETTLE_READS: usize = 5;
const SETTLE_PAUSE: Duration = Duration::from_millis(50);

/// What [`Nft::reconcile`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// How the kernel's table differed from what was applied before (empty: no drift).
    pub drift: Drift,
    /// The table was rebuilt with nft (its `leader` element with it: refresh it).
    pub rebuilt: bool,
}

/// What `nft -j list table inet paddock` said: its exit status, output and error text. A
/// missing table is `None`; any other failure is [`NftError::Unreadable`].
pub fn parse_listing(
    success: bool,
    stdout: &[u8],
    stderr: &str,
) -> Result<Option<Table>, NftError> {
    if !success {
        let missing = stderr
            .lines()
            .any(|l| l.starts_with("Error: No such file or directory"))
            && stderr.contains(&format!("list table inet {TABLE}"));
        return if missing {
            Ok(None)
        } else {
            Err(NftError::Unreadable(stderr.trim().to_string()))
        };
    }
    let v: serde_json::Value =
        serde_json::from_slice(stdout).map_err(|e| NftError::Output(e.to_string()))?;
    Table::from_listing(v)
        .map(Some)
        .ok_or_else(|| NftError::Output("a listing without the table".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    #[test]
    fn the_model() {
        let f = Filter::from_machines(
            [
                (mac(1), true),
                (mac(2), false),
                (mac(3), false),
                (mac(3), true),
            ],
            true,
            true,
        );
        assert_eq!(f.allow, [mac(1), mac(3)].into());
        assert_eq!(f.deny, [mac(2)].into());
        let cases = [
            (true, true, mac(1), true),
            (true, true, mac(2), false),
            (true, true, mac(9), true),
            (false, true, mac(9), false),
            (false, true, mac(1), true),
            (true, false, mac(1), false),
            (true, false, mac(9), false),
        ];
        for (discovery, pass, m, want) in cases {
            let f = Filter {
                discovery,
                pass,
                ..f.clone()
            };
            assert_eq!(f.admits(m), want, "discovery={discovery} pass={pass} {m}");
        }
    }

    #[test]
    fn diff_moves_macs_between_sets_without_overlap() {
        let a = Filter::from_machines([(mac(1), true), (mac(2), false)], true, false);
        let b = Filter::from_machines([(mac(1), false), (mac(3), true)], false, true);
        assert_eq!(
            diff(&a, &b),
            [
                Change::Delete(SetName::Allow, mac(1)),
                Change::Delete(SetName::Deny, mac(2)),
                Change::Add(SetName::Allow, mac(3)),
                Change::Add(SetName::Deny, mac(1)),
                Change::Discovery(false),
                Change::Pass(true),
            ]
        );
        assert!(diff(&b, &b).is_empty());
    }

    #[test]
    fn only_a_missing_table_reads_as_none() {
        // nft's own words (1.0.6; later versions add "; did you mean …" to the first line),
        // and what `ip netns exec` and an unprivileged nft print.
        let missing = [
            "Error: No such file or directory\nlist table inet paddock\n                 ^^^^^^^\n",
            "Error: No such file or directory; did you mean table \u{2018}paddock\u{2019} in family ip?\nlist table inet paddock\n                 ^^^^^^^\n",
        ];
        for stderr in missing {
            assert!(
                matches!(parse_listing(false, b"", stderr), Ok(None)),
                "{stderr}"
            );
        }
        let unreadable = [
            "Cannot open network namespace \"pdk-gone\": No such file or directory\n",
            "Operation not permitted (you must be root)\nnetlink: Error: cache initialization failed: Operation not permitted\n",
            "Error: No such file or directory\nlist table inet other\n                 ^^^^^\n",
            "",
        ];
        for stderr in unreadable {
            let e = parse_listing(false, b"", stderr).unwrap_err();
            assert!(matches!(e, NftError::Unreadable(_)), "{stderr}: {e:?}");
            assert!(
                e.to_string()
                    .starts_with("nft cannot read table inet paddock: "),
                "{e}"
            );
        }
        for stdout in [&b"not json"[..], br#"{"nftables": [{"metainfo": {}}]}"#] {
            assert!(matches!(
                parse_listing(true, stdout, ""),
                Err(NftError::Output(_))
            ));
        }
        let closed = render_closed("br0");
        let listed = json!({"nftables": [
            {"table": {"family": "inet", "name": "paddock", "handle": 1}},
            {"chain": {"family": "inet", "table": "paddock", "name": "pass", "handle": 2}}
        ]});
        let t = parse_listing(true, listed.to_string().as_bytes(), "")
            .unwrap()
            .unwrap();
        assert!(!compare(Some(&t), &Table::from_batch(&closed)).is_empty());
    }

    #[test]
    fn rendering() {
        let f = Filter::from_machines([(mac(1), true), (mac(2), false)], true, true);
        let doc = serde_json::to_value(render_full("br0", &f)).unwrap();
        let full = doc.to_string();
        // Single key-value needles only: the order of keys within an object depends on
        // whether serde_json preserves insertion order (a feature another crate may enable).
        for needle in [
            r#""hook":"input""#,
            r#""right":"br0""#,
            r#""right":{"set":[67,69,547,4011]}"#,
        ] {
            assert!(full.contains(needle), "{needle} missing from {full}");
        }
        let cmds = doc["nftables"].as_array().unwrap();
        let added = |what: &str| -> Vec<&serde_json::Value> {
            cmds.iter()
                .filter_map(|c| c.get("add")?.get(what))
                .collect()
        };
        assert!(
            cmds.iter()
                .any(|c| c["delete"]["table"]["name"] == "paddock"),
            "{full}"
        );
        let rules = added("rule");
        assert!(
            rules.iter().any(|r| r["chain"] == "whitelist"
                && r["expr"][0]["match"]["right"] == "@allow"
                && r["expr"][1]["jump"]["target"] == "pass"),
            "{full}"
        );
        assert!(
            rules
                .iter()
                .any(|r| r["chain"] == "pass" && r["expr"] == serde_json::json!([{"accept": null}])),
            "{full}"
        );
        let elements = added("element");
        for (set, m) in [
            ("allow", "52:54:00:00:00:01"),
            ("deny", "52:54:00:00:00:02"),
        ] {
            assert!(
                elements
                    .iter()
                    .any(|e| e["name"] == set && e["elem"] == serde_json::json!([m])),
                "{set}: {full}"
            );
        }
        let closed = serde_json::to_value(render_closed("br0")).unwrap();
        let closed = closed.to_string();
        assert!(
            !closed.contains(r#""expr":[{"accept":null}]"#),
            "closed: no static pass rule"
        );
        assert!(
            !closed.contains("\"elem\""),
            "closed: no element, the leader's included"
        );
        // The leader rule accepts only while the leader set holds an element (several hosts).
        assert!(
            closed.contains(r#""name":"leader","table":"paddock","type":"ifname""#)
                || closed.contains(r#""flags":["timeout"]"#),
            "{closed}"
        );
        let leader_rule = json!([
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "@leader"}},
            {"accept": null}
        ]);
        let closed_doc = serde_json::to_value(render_closed("br0")).unwrap();
        assert!(
            closed_doc["nftables"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["add"]["rule"]["chain"] == "pass"
                    && c["add"]["rule"]["expr"] == leader_rule),
            "{closed}"
        );
        // Compared as JSON values: key order within objects is not part of the format.
        let changes = render_changes(&[Change::Add(SetName::Deny, mac(5)), Change::Pass(false)]);
        assert_eq!(
            serde_json::to_value(changes).unwrap(),
            serde_json::from_str::<serde_json::Value>(r#"{"nftables":[{"add":{"element":{"elem":["52:54:00:00:00:05"],"family":"inet","name":"deny","table":"paddock"}}},{"flush":{"chain":{"family":"inet","name":"pass","table":"paddock"}}},{"add":{"rule":{"chain":"pass","expr":[{"match":{"left":{"meta":{"key":"iifname"}},"op":"==","right":"@leader"}},{"accept":null}],"family":"inet","table":"paddock"}}}]}"#)
            .unwrap()
        );
    }
}
