//! The whole `inet paddock` table as one comparable value, and the comparison the reconcile
//! loop runs: the table the kernel holds (as `nft -j list table` prints it) against the one
//! Paddock renders ([`crate::render_full`]).
//!
//! Both sides are read into the `nftables` crate's typed schema: a listing's objects
//! (`{"chain": {...}}`, parsed from nft's JSON) and a batch's `add` commands (already
//! typed). Every attribute counts (a table's flags, a chain's type, hook, priority and
//! policy, a set's type and flags, each rule's statements in order) except the kernel's
//! handles: what a listing says that the schema has no field for (nft 1.0.6 lists a dormant
//! table's `flags`, the schema has none) is kept beside the typed object ([`Object::extra`])
//! and counts as well. Objects Paddock never renders (another chain, a map, a counter) and
//! objects the schema cannot read count too. The one thing left out is the `leader` set's
//! element: the leader's timed right to serve, kept by [`crate::Nft::refresh_leader`] and
//! not by the reconcile loop.
//!
//! Pure: parsing, rendering and comparing touch no kernel; [`crate::Nft::reconcile`] is the
//! shell.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use nftables::expr::Expression;
use nftables::schema::{self, NfCmd, NfListObject, NfObject};
use paddock_inventory::MacAddr;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{Batch, Change, Filter, SetName, TABLE, diff, render_full};

/// The set whose element is the leader's timed right to serve (not compared).
pub const LEADER_SET: &str = "leader";

/// Attributes by name (an object's JSON keys).
pub type Attrs = BTreeMap<String, Value>;

/// The keys that name an object or place it, never compared as attributes (the kernel's
/// handle included); `elem` is compared as [`Set::elems`].
const IDENTITY: [&str; 6] = ["family", "table", "name", "chain", "handle", "elem"];

/// One object as typed by the schema (its handle left out), and what the listing said
/// beyond what the schema can hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Object<T> {
    pub typed: T,
    /// Attributes the schema has no field for, as listed (none in a rendered table).
    pub extra: Attrs,
}

impl<T: Serialize> Object<T> {
    /// Every attribute but the names and the handle, as JSON (what a drift message shows).
    pub fn attrs(&self) -> Attrs {
        let mut out: Attrs = match serde_json::to_value(&self.typed) {
            Ok(Value::Object(m)) => m
                .into_iter()
                .filter(|(k, _)| !IDENTITY.contains(&k.as_str()))
                .collect(),
            _ => Attrs::new(),
        };
        out.extend(self.extra.clone());
        out
    }
}

/// One nftables table: its own attributes, sets, chains with their rules, and anything
/// else it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// The table itself (a dormant table filters nothing).
    pub table: Object<schema::Table<'static>>,
    pub sets: BTreeMap<String, Set>,
    pub chains: BTreeMap<String, Chain>,
    /// Objects of other kinds (maps, counters, quotas, flowtables…) and objects the schema
    /// cannot read, as listed.
    pub others: Vec<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Set {
    /// Type, flags, and any size, policy, timeout or comment (no elements).
    pub def: Object<schema::Set<'static>>,
    /// The elements as nft writes them (MACs as `52:54:00:00:00:01`).
    pub elems: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// Type, hook, priority and policy of a base chain; none for a regular one.
    pub def: Object<schema::Chain<'static>>,
    /// Each rule (its statements, any comment), in order.
    pub rules: Vec<Object<schema::Rule<'static>>>,
}

/// An element as nft writes it: a string as is, anything else as its JSON.
fn expression_text(e: &Expression<'_>) -> String {
    match e {
        Expression::String(s) => s.to_string(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// A listed element read through the schema. A plain string (every MAC) is taken as it is:
/// it is what the schema's string expression holds, and trying the schema's every variant
/// on 100,000 of them cost a third of the reconcile.
fn element_text(e: &Value) -> String {
    if let Value::String(s) = e {
        return s.clone();
    }
    match serde::Deserialize::deserialize(e) {
        Ok(Expression::String(s)) => s.into_owned(),
        _ => e.to_string(),
    }
}

/// Whether a listed attribute reads back the same from the typed object (flags are a set:
/// their order is not the kernel's, and one flag may be written without the array).
fn same(back: Option<&Value>, listed: &Value) -> bool {
    let sorted = |v: &Value| -> Option<Vec<String>> {
        let mut items: Vec<String> = match v {
            Value::Array(a) => a.iter().map(Value::to_string).collect(),
            Value::String(_) => vec![v.to_string()],
            _ => return None,
        };
        items.sort();
        Some(items)
    };
    back.is_some_and(|b| b == listed || sorted(b).is_some_and(|b| Some(b) == sorted(listed)))
}

/// Reads one listed object of `kind` (its elements taken out) through the schema: the
/// typed object and the attributes it could not hold. `None`: the schema cannot read it.
fn typed(kind: &str, obj: &Map<String, Value>) -> Option<(NfListObject<'static>, Attrs)> {
    let mut input = obj.clone();
    if kind == "element" {
        input.insert("elem".into(), Value::Array(Vec::new()));
    }
    let wrapped = Value::Object(Map::from_iter([(kind.to_string(), Value::Object(input))]));
    let typed: NfListObject<'static> = serde_json::from_value(wrapped).ok()?;
    let back = serde_json::to_value(&typed).ok()?;
    let back = back.get(kind)?;
    let extra = obj
        .iter()
        .filter(|(k, v)| !IDENTITY.contains(&k.as_str()) && !same(back.get(k.as_str()), v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some((typed, extra))
}

impl Table {
    /// Takes in one typed object with the attributes the schema could not hold and the
    /// elements listed with it.
    fn absorb(&mut self, obj: NfListObject<'static>, extra: Attrs, listed: Vec<String>) {
        match obj {
            NfListObject::Table(mut t) => {
                t.handle = None;
                self.table = Object { typed: t, extra };
            }
            NfListObject::Set(mut s) => {
                s.handle = None;
                let elems = s.elem.take();
                let name = s.name.to_string();
                self.sets.entry(name.clone()).or_default().def = Object { typed: *s, extra };
                self.add_elements(&name, elems.iter().flat_map(|e| e.iter()), listed);
            }
            NfListObject::Element(e) => self.add_elements(&e.name, e.elem.iter(), listed),
            NfListObject::Chain(mut c) => {
                c.handle = None;
                let chain = self.chains.entry(c.name.to_string()).or_default();
                chain.def = Object { typed: c, extra };
            }
            NfListObject::Rule(mut r) => {
                r.handle = None;
                let chain = self.chains.entry(r.chain.to_string()).or_default();
                chain.rules.push(Object { typed: r, extra });
            }
            other => {
                let mut v = serde_json::to_value(&other).unwrap_or_default();
                if let Some(m) = v
                    .as_object_mut()
                    .and_then(|m| m.values_mut().next())
                    .and_then(Value::as_object_mut)
                {
                    m.extend(extra);
                }
                self.others.push(v);
            }
        }
    }

    fn add_elements<'e>(
        &mut self,
        set: &str,
        typed: impl Iterator<Item = &'e Expression<'static>>,
        listed: Vec<String>,
    ) {
        if set == LEADER_SET {
            return;
        }
        let elems = &mut self.sets.entry(set.to_string()).or_default().elems;
        elems.extend(typed.map(expression_text));
        elems.extend(listed);
    }

    /// The table from `nft -j list table inet paddock`'s output (`None`: it lists no table).
    pub fn from_listing(listing: Value) -> Option<Table> {
        let (mut table, mut listed) = (Table::default(), false);
        let Value::Object(mut doc) = listing else {
            return None;
        };
        let Some(Value::Array(items)) = doc.remove("nftables") else {
            return None;
        };
        for item in items {
            let Value::Object(item) = item else { continue };
            for (kind, obj) in item {
                listed |= kind == "table";
                if kind != "metainfo" {
                    table.absorb_listed(&kind, obj);
                }
            }
        }
        listed.then_some(table)
    }

    /// Takes in one listed object: through the schema when it can read it, as listed when
    /// it cannot (or when it is of a kind Paddock never renders).
    fn absorb_listed(&mut self, kind: &str, obj: Value) {
        let kinds = ["table", "set", "element", "chain", "rule"];
        let Value::Object(mut obj) = obj else {
            self.others
                .push(Value::Object(Map::from_iter([(kind.to_string(), obj)])));
            return;
        };
        let elem = obj.remove("elem");
        let parsed = kinds.contains(&kind).then(|| typed(kind, &obj)).flatten();
        match parsed {
            Some((typed, extra)) => {
                let is_leader = obj.get("name").and_then(Value::as_str) == Some(LEADER_SET);
                let elems = match &elem {
                    Some(Value::Array(items)) if !is_leader => {
                        items.iter().map(element_text).collect()
                    }
                    Some(single) if !is_leader => vec![element_text(single)],
                    _ => Vec::new(),
                };
                self.absorb(typed, extra, elems);
            }
            None => {
                if let Some(elem) = elem {
                    obj.insert("elem".into(), elem);
                }
                let item = Map::from_iter([(kind.to_string(), Value::Object(obj))]);
                self.others.push(Value::Object(item));
            }
        }
    }

    /// The table a batch leaves behind, for a batch that builds the table from nothing
    /// (`add` and `delete table` commands, as [`render_full`] writes).
    pub fn from_batch(batch: &Batch) -> Table {
        let mut table = Table::default();
        for cmd in batch.objects.iter() {
            match cmd {
                NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(_))) => {
                    table = Table::default();
                }
                NfObject::CmdObject(NfCmd::Add(obj)) => {
                    table.absorb(obj.clone(), Attrs::new(), Vec::new());
                }
                _ => {}
            }
        }
        table
    }

    /// The table Paddock renders for `f` on `iface`.
    pub fn rendered(iface: &str, f: &Filter) -> Table {
        Table::from_batch(&render_full(iface, f))
    }

    /// The MACs in one of the membership sets (what does not read as a MAC is left out).
    pub fn macs(&self, set: SetName) -> BTreeSet<MacAddr> {
        self.sets
            .get(set.as_str())
            .into_iter()
            .flat_map(|s| &s.elems)
            .filter_map(|e| e.parse().ok())
            .collect()
    }

    /// The filter this table implements, as far as Paddock's model can say: the sets'
    /// MACs, and whether the blacklist and pass chains are exactly the ones rendered with
    /// discovery and the static pass rule on.
    pub fn filter(&self) -> Filter {
        let on = Table::rendered(
            "",
            &Filter {
                discovery: true,
                pass: true,
                ..Filter::default()
            },
        );
        let rules = |t: &Table, chain: &str| t.chains.get(chain).map(|c| c.rules.clone());
        Filter {
            allow: self.macs(SetName::Allow),
            deny: self.macs(SetName::Deny),
            discovery: rules(self, "blacklist") == rules(&on, "blacklist"),
            pass: rules(self, "pass") == rules(&on, "pass"),
        }
    }
}

/// How the table the kernel holds differs from the wanted one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Differences outside set membership (the table, chains, rules, set definitions,
    /// foreign objects), described. Any one means the table is rebuilt.
    pub structure: Vec<String>,
    /// The element deletes and adds that turn the held allow and deny sets into the
    /// wanted ones.
    pub elements: Vec<Change>,
}

impl Drift {
    pub fn is_empty(&self) -> bool {
        self.structure.is_empty() && self.elements.is_empty()
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = self.structure.clone();
        for set in [SetName::Allow, SetName::Deny] {
            let count = |add: bool| {
                self.elements
                    .iter()
                    .filter(|c| match c {
                        Change::Add(s, _) => add && *s == set,
                        Change::Delete(s, _) => !add && *s == set,
                        _ => false,
                    })
                    .count()
            };
            let (missing, extra) = (count(true), count(false));
            if missing + extra > 0 {
                parts.push(format!(
                    "set {}: {missing} element(s) missing, {extra} not wanted",
                    set.as_str()
                ));
            }
        }
        if parts.is_empty() {
            return f.write_str("no drift");
        }
        f.write_str(&parts.join("; "))
    }
}

/// JSON text with every object's keys in sorted order, whatever order the value holds them
/// in (serde_json keeps insertion order when another crate of the build enables
/// `preserve_order`), so a drift message reads the same in every build.
fn canonical_text(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let keys: std::collections::BTreeMap<&String, &Value> = m.iter().collect();
                Value::Object(
                    keys.into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sorted(v)).unwrap_or_default()
}

fn show(a: &Attrs) -> String {
    canonical_text(&Value::Object(a.clone().into_iter().collect()))
}

/// Notes `what`'s attributes if they differ.
fn attrs_differ<T: Serialize + PartialEq>(
    out: &mut Vec<String>,
    what: &str,
    held: &Object<T>,
    want: &Object<T>,
) {
    if held != want {
        out.push(format!(
            "{what}: {} instead of {}",
            show(&held.attrs()),
            show(&want.attrs())
        ));
    }
}

/// Notes each wanted `kind` (chain, set) that is missing and each held one that is not
/// wanted; `each` compares those in both.
fn by_name<T>(
    out: &mut Vec<String>,
    kind: &str,
    held: &BTreeMap<String, T>,
    want: &BTreeMap<String, T>,
    each: fn(&mut Vec<String>, &str, &T, &T),
) {
    for (name, w) in want {
        match held.get(name) {
            None => out.push(format!("{kind} {name} does not exist")),
            Some(h) => each(out, name, h, w),
        }
    }
    out.extend(
        held.keys()
            .filter(|n| !want.contains_key(*n))
            .map(|n| format!("{kind} {n} is not Paddock's")),
    );
}

fn chain_differs(out: &mut Vec<String>, name: &str, h: &Chain, w: &Chain) {
    attrs_differ(out, &format!("chain {name}"), &h.def, &w.def);
    if h.rules.len() != w.rules.len() {
        out.push(format!(
            "chain {name}: {} rule(s) instead of {}",
            h.rules.len(),
            w.rules.len()
        ));
    } else if let Some(i) = h.rules.iter().zip(&w.rules).position(|(a, b)| a != b) {
        out.push(format!(
            "chain {name}: rule {} is {} instead of {}",
            i + 1,
            show(&h.rules[i].attrs()),
            show(&w.rules[i].attrs())
        ));
    }
}

/// A set's definition; the elements of a set other than allow and deny; an element of
/// allow or deny that is not a MAC. (Membership itself is [`Drift::elements`].)
fn set_differs(out: &mut Vec<String>, name: &str, h: &Set, w: &Set) {
    attrs_differ(out, &format!("set {name}"), &h.def, &w.def);
    let membership = [SetName::Allow, SetName::Deny]
        .iter()
        .any(|s| s.as_str() == name);
    if !membership {
        if h.elems != w.elems {
            out.push(format!("set {name}: elements differ"));
        }
    } else if let Some(odd) = h.elems.iter().find(|e| e.parse::<MacAddr>().is_err()) {
        out.push(format!("set {name} holds {odd}, not a MAC"));
    }
}

/// How `held` (`None`: the kernel holds no such table) differs from `want`.
pub fn compare(held: Option<&Table>, want: &Table) -> Drift {
    let Some(held) = held else {
        return Drift {
            structure: vec![format!("table inet {TABLE} does not exist")],
            elements: Vec::new(),
        };
    };
    let mut out = Vec::new();
    attrs_differ(
        &mut out,
        &format!("table inet {TABLE}"),
        &held.table,
        &want.table,
    );
    by_name(&mut out, "chain", &held.chains, &want.chains, chain_differs);
    by_name(&mut out, "set", &held.sets, &want.sets, set_differs);
    if held.others != want.others {
        out.push(format!(
            "the table holds {} object(s) Paddock does not render: {}",
            held.others.len(),
            canonical_text(&Value::Array(held.others.clone()))
        ));
    }
    let membership = |t: &Table| Filter {
        allow: t.macs(SetName::Allow),
        deny: t.macs(SetName::Deny),
        ..Filter::default()
    };
    Drift {
        structure: out,
        elements: diff(&membership(held), &membership(want)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nftables::schema::SetFlag;
    use nftables::stmt::Statement;
    use serde_json::json;

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    /// `nft -j list table inet paddock` (nft 1.0.6) after `render_full("br0", …)` with 01
    /// allowed, 02 and 0a denied, discovery and the pass rule on, and a leader element.
    const LISTING: &str = r#"{"nftables":[{"metainfo":{"version":"1.0.6","release_name":"Lester Gooch #5","json_schema_version":1}},{"table":{"family":"inet","name":"paddock","handle":2}},{"set":{"family":"inet","name":"allow","table":"paddock","type":"ether_addr","handle":1,"elem":["52:54:00:00:00:01"]}},{"set":{"family":"inet","name":"deny","table":"paddock","type":"ether_addr","handle":2,"elem":["52:54:00:00:00:02","52:54:00:00:00:0a"]}},{"set":{"family":"inet","name":"leader","table":"paddock","type":"ifname","handle":3,"flags":["timeout"],"elem":[{"elem":{"val":"br0","timeout":60,"expires":59}}]}},{"chain":{"family":"inet","table":"paddock","name":"input","handle":4,"type":"filter","hook":"input","prio":-150,"policy":"accept"}},{"chain":{"family":"inet","table":"paddock","name":"whitelist","handle":5}},{"chain":{"family":"inet","table":"paddock","name":"blacklist","handle":6}},{"chain":{"family":"inet","table":"paddock","name":"pass","handle":7}},{"rule":{"family":"inet","table":"paddock","chain":"input","handle":9,"expr":[{"match":{"op":"==","left":{"meta":{"key":"iifname"}},"right":"br0"}},{"match":{"op":"==","left":{"payload":{"protocol":"udp","field":"dport"}},"right":{"set":[67,69,547,4011]}}},{"jump":{"target":"whitelist"}}]}},{"rule":{"family":"inet","table":"paddock","chain":"whitelist","handle":10,"expr":[{"match":{"op":"==","left":{"payload":{"protocol":"ether","field":"saddr"}},"right":"@allow"}},{"jump":{"target":"pass"}}]}},{"rule":{"family":"inet","table":"paddock","chain":"whitelist","handle":11,"expr":[{"jump":{"target":"blacklist"}}]}},{"rule":{"family":"inet","table":"paddock","chain":"blacklist","handle":12,"expr":[{"match":{"op":"==","left":{"payload":{"protocol":"ether","field":"saddr"}},"right":"@deny"}},{"drop":null}]}},{"rule":{"family":"inet","table":"paddock","chain":"blacklist","handle":13,"expr":[{"jump":{"target":"pass"}}]}},{"rule":{"family":"inet","table":"paddock","chain":"blacklist","handle":14,"expr":[{"drop":null}]}},{"rule":{"family":"inet","table":"paddock","chain":"pass","handle":15,"expr":[{"match":{"op":"==","left":{"meta":{"key":"iifname"}},"right":"@leader"}},{"accept":null}]}},{"rule":{"family":"inet","table":"paddock","chain":"pass","handle":16,"expr":[{"accept":null}]}}]}"#;

    fn filter() -> Filter {
        Filter::from_machines(
            [(mac(1), true), (mac(2), false), (mac(10), false)],
            true,
            true,
        )
    }

    fn listed() -> Table {
        Table::from_listing(serde_json::from_str(LISTING).unwrap()).unwrap()
    }

    #[test]
    fn the_kernels_listing_reads_as_the_rendered_table() {
        let want = Table::rendered("br0", &filter());
        assert_eq!(listed(), want);
        assert!(compare(Some(&listed()), &want).is_empty());
        assert_eq!(listed().filter(), filter());
        assert_eq!(want.chains.len(), 4);
        assert_eq!(want.chains["input"].def.typed.prio, Some(-150));
        assert_eq!(
            want.sets["leader"].def.typed.flags,
            Some([SetFlag::Timeout].into())
        );
        // Without the table object nothing is listed.
        assert_eq!(
            Table::from_listing(json!({"nftables": [{"metainfo": {}}]})),
            None
        );
        // A closed table: no elements, no static pass rule, discovery off.
        let closed = Table::rendered("br0", &Filter::default());
        assert_eq!(closed.filter(), Filter::default());
        assert_eq!(
            closed.chains["pass"].rules.len(),
            1,
            "the leader rule alone"
        );
    }

    #[test]
    fn every_kind_of_drift_is_seen() {
        let want = Table::rendered("br0", &filter());
        type Edit = fn(&mut Table);
        let cases: [(&str, Edit, &[&str]); 15] = [
            ("nothing", |_| {}, &[]),
            (
                "input rule deleted",
                |t| t.chains.get_mut("input").unwrap().rules.clear(),
                &["chain input: 0 rule(s) instead of 1"],
            ),
            (
                "leader rule deleted",
                |t| {
                    t.chains.get_mut("pass").unwrap().rules.remove(0);
                },
                &["chain pass: 1 rule(s) instead of 2"],
            ),
            (
                "pass rule deleted",
                |t| {
                    t.chains.get_mut("pass").unwrap().rules.pop();
                },
                &["chain pass: 1 rule(s) instead of 2"],
            ),
            (
                "whitelist chain deleted",
                |t| {
                    t.chains.remove("whitelist");
                },
                &["chain whitelist does not exist"],
            ),
            (
                "a rule changed in place",
                |t| {
                    t.chains.get_mut("blacklist").unwrap().rules[2].typed.expr =
                        vec![Statement::Accept(None)].into();
                },
                &[
                    r#"chain blacklist: rule 3 is {"expr":[{"accept":null}]} instead of {"expr":[{"drop":null}]}"#,
                ],
            ),
            (
                "input priority moved",
                |t| {
                    t.chains.get_mut("input").unwrap().def.typed.prio = Some(0);
                },
                &[
                    r#"chain input: {"hook":"input","policy":"accept","prio":0,"type":"filter"} instead of {"hook":"input","policy":"accept","prio":-150,"type":"filter"}"#,
                ],
            ),
            (
                "input hook gone (a regular chain)",
                |t| {
                    let c = &mut t.chains.get_mut("input").unwrap().def.typed;
                    (c._type, c.hook, c.prio, c.policy) = (None, None, None, None);
                },
                &[
                    r#"chain input: {} instead of {"hook":"input","policy":"accept","prio":-150,"type":"filter"}"#,
                ],
            ),
            (
                "a foreign chain",
                |t| {
                    t.chains.insert("sneaky".into(), Chain::default());
                },
                &["chain sneaky is not Paddock's"],
            ),
            (
                "deny set made an interval set",
                |t| {
                    t.sets.get_mut("deny").unwrap().def.typed.flags =
                        Some([SetFlag::Interval].into());
                },
                &[
                    r#"set deny: {"flags":["interval"],"type":"ether_addr"} instead of {"type":"ether_addr"}"#,
                ],
            ),
            (
                "a foreign set",
                |t| {
                    t.sets.insert("extra".into(), Set::default());
                },
                &["set extra is not Paddock's"],
            ),
            (
                "an element that is not a MAC",
                |t| {
                    t.sets
                        .get_mut("deny")
                        .unwrap()
                        .elems
                        .insert("10.0.0.1".into());
                },
                &["set deny holds 10.0.0.1, not a MAC"],
            ),
            (
                "table made dormant",
                |t| {
                    t.table.extra.insert("flags".into(), json!("dormant"));
                },
                &[r#"table inet paddock: {"flags":"dormant"} instead of {}"#],
            ),
            (
                "a counter in the table",
                |t| t.others.push(json!({"counter": {"name": "c"}})),
                &[
                    r#"the table holds 1 object(s) Paddock does not render: [{"counter":{"name":"c"}}]"#,
                ],
            ),
            (
                "membership only: the leader element is not drift",
                |t| {
                    t.sets.get_mut("leader").unwrap().elems.clear();
                },
                &[],
            ),
        ];
        for (what, edit, structure) in cases {
            let mut held = want.clone();
            edit(&mut held);
            let d = compare(Some(&held), &want);
            assert_eq!(d.structure, structure, "{what}");
            assert!(d.elements.is_empty(), "{what}: {:?}", d.elements);
            assert_eq!(d.is_empty(), structure.is_empty(), "{what}");
        }
        let d = compare(None, &want);
        assert_eq!(d.structure, ["table inet paddock does not exist"]);
    }

    /// What the schema cannot hold still counts: an attribute it has no field for (nft
    /// 1.0.6 lists a dormant table's flags) and an object it cannot read at all.
    #[test]
    fn what_the_schema_cannot_hold_is_drift() {
        let want = Table::rendered("br0", &filter());
        let edit = |from: &str, to: &str| {
            assert!(LISTING.contains(from), "{from}");
            let listing = LISTING.replace(from, to);
            let held = Table::from_listing(serde_json::from_str(&listing).unwrap()).unwrap();
            compare(Some(&held), &want).structure
        };
        assert_eq!(
            edit(r#""handle":2}}"#, r#""handle":2,"flags":"dormant"}}"#),
            [r#"table inet paddock: {"flags":"dormant"} instead of {}"#]
        );
        assert_eq!(
            edit(r#"[{"drop":null}]"#, r#"[{"frobnicate":null}]"#),
            [
                "chain blacklist: 2 rule(s) instead of 3",
                r#"the table holds 1 object(s) Paddock does not render: [{"rule":{"chain":"blacklist","expr":[{"frobnicate":null}],"family":"inet","handle":14,"table":"paddock"}}]"#
            ]
        );
        assert_eq!(
            edit(
                r#""handle":3,"flags":["timeout"]"#,
                r#""handle":3,"flags":"timeout""#
            ),
            Vec::<String>::new(),
            "one flag written as a string is the same flag"
        );
    }

    #[test]
    fn membership_drift_is_element_changes() {
        let want = Table::rendered("br0", &filter());
        let mut held = want.clone();
        let deny = &mut held.sets.get_mut("deny").unwrap().elems;
        deny.clear();
        deny.insert(mac(1).to_string());
        held.sets
            .get_mut("allow")
            .unwrap()
            .elems
            .insert(mac(7).to_string());
        let d = compare(Some(&held), &want);
        assert!(d.structure.is_empty(), "{d}");
        assert_eq!(
            d.elements,
            [
                Change::Delete(SetName::Allow, mac(7)),
                Change::Delete(SetName::Deny, mac(1)),
                Change::Add(SetName::Deny, mac(2)),
                Change::Add(SetName::Deny, mac(10)),
            ]
        );
        assert_eq!(
            d.to_string(),
            "set allow: 0 element(s) missing, 1 not wanted; set deny: 2 element(s) missing, 1 not wanted"
        );
        assert_eq!(Drift::default().to_string(), "no drift");
        // A deleted set: structure (the table is rebuilt), its elements counted as missing.
        let mut held = want.clone();
        held.sets.remove("allow");
        let d = compare(Some(&held), &want);
        assert_eq!(d.structure, ["set allow does not exist"]);
        assert_eq!(d.elements, [Change::Add(SetName::Allow, mac(1))]);
    }
}
