//! The renderer against the kernel: real nft in a network namespace the test creates.

use std::process::Command;
use std::time::Instant;

use paddock_firewall::{
    Change, Filter, Health, Nft, NftError, Reconciled, SetName, Table, diff, render_changes,
    render_closed, render_full,
};
use paddock_inventory::MacAddr;

struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Self {
        let name = format!("pdkfw{}-{tag}", std::process::id() % 100_000);
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        assert!(
            Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .unwrap()
                .success(),
            "ip netns add (run as root)"
        );
        Ns(name)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn mac(i: u32) -> MacAddr {
    let b = i.to_be_bytes();
    MacAddr([0x52, 0x54, 0x02, b[1], b[2], b[3]])
}

/// Runs nft in the namespace as an operator (or an accident) would.
fn nft_cli(ns: &Ns, args: &str) {
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("ip netns exec {} nft {args}", ns.0))
        .status()
        .unwrap();
    assert!(st.success(), "nft {args}");
}

/// Asserts the kernel holds `want`, naming a few differences rather than printing every
/// MAC of a big set. Listings are retried for a moment: the kernel dumps a big hash set in
/// parts, walking the hash again for each, and a part that runs while the hash is being
/// resized (just after many adds or deletes) can skip elements the set holds.
#[track_caller]
fn assert_holds(nft: &Nft, want: &Filter, what: &str) {
    let mut held = Filter::default();
    for _ in 0..20 {
        held = nft.read().unwrap().expect("the table exists");
        if &held == want {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let few = |a: &std::collections::BTreeSet<MacAddr>, b: &std::collections::BTreeSet<MacAddr>| {
        a.difference(b)
            .take(3)
            .map(MacAddr::to_string)
            .collect::<Vec<_>>()
    };
    panic!(
        "{what}: allow held {} wanted {} (extra {:?}, missing {:?}); deny held {} wanted {} (extra {:?}, missing {:?}); discovery {}/{}, pass {}/{}",
        held.allow.len(),
        want.allow.len(),
        few(&held.allow, &want.allow),
        few(&want.allow, &held.allow),
        held.deny.len(),
        want.deny.len(),
        few(&held.deny, &want.deny),
        few(&want.deny, &held.deny),
        held.discovery,
        want.discovery,
        held.pass,
        want.pass
    );
}

/// Many MACs through the netlink path: all added in one batch, half moved to the other
/// set, a refused batch that changes nothing, a flushed set repaired by the reconcile path
/// (read the kernel's table, send the difference), all removed. Each batch is one
/// atomic nfnetlink batch whose element lists are split across messages.
fn membership_at_scale(n: u32, tag: &str) {
    let ns = Ns::new(tag);
    let nft = Nft::in_netns(&ns.0);
    nft.apply(&render_closed("br0")).unwrap();
    let none = Filter::default();
    let all = Filter::from_machines((0..n).map(|i| (mac(i), false)), false, false);
    nft.apply_changes(&diff(&none, &all)).unwrap();
    assert_holds(&nft, &all, &format!("{n} added"));
    let moved = Filter::from_machines((0..n).map(|i| (mac(i), i % 2 == 0)), false, false);
    nft.apply_changes(&diff(&all, &moved)).unwrap();
    assert_holds(&nft, &moved, &format!("{n}: half moved"));
    // Every move back, then a delete of an element that is not there: the whole batch is
    // refused, its first messages included.
    let mut bad = diff(&moved, &all);
    bad.push(Change::Delete(SetName::Allow, mac(n + 1)));
    let e = nft.apply_changes(&bad).unwrap_err().to_string();
    assert!(e.contains("deleting 1 element(s) from set allow"), "{e}");
    assert_holds(&nft, &moved, &format!("{n}: refused batch"));
    // Drift: someone flushes the deny set; the reconcile path puts every element back.
    nft_cli(&ns, "flush set inet paddock deny");
    let done = nft.reconcile("br0", &moved, &moved).unwrap();
    assert!(!done.rebuilt, "membership alone goes over netlink");
    assert_eq!(
        done.drift.to_string(),
        format!(
            "set deny: {} element(s) missing, 0 not wanted",
            moved.deny.len()
        )
    );
    assert_holds(&nft, &moved, &format!("{n}: repaired"));
    nft.apply_changes(&diff(&moved, &none)).unwrap();
    assert_holds(&nft, &none, &format!("{n}: all removed"));
}

#[test]
fn ten_thousand_macs_over_netlink() {
    membership_at_scale(10_000, "e");
}

#[test]
fn a_hundred_thousand_macs_over_netlink() {
    membership_at_scale(100_000, "f");
}

#[test]
fn applied_state_reads_back_and_changes_are_incremental() {
    let ns = Ns::new("a");
    let nft = Nft::in_netns(&ns.0);
    assert_eq!(nft.read().unwrap(), None, "no table yet");
    nft.apply(&render_closed("br0")).unwrap();
    assert_eq!(
        nft.read().unwrap(),
        Some(Filter::default()),
        "closed: empty sets, no pass rule"
    );
    let a = Filter::from_machines(
        [(mac(1), true), (mac(2), false), (mac(3), false)],
        true,
        true,
    );
    nft.apply(&render_full("br0", &a)).unwrap();
    assert_eq!(nft.read().unwrap(), Some(a.clone()));
    let b = Filter::from_machines(
        [(mac(1), false), (mac(2), false), (mac(4), true)],
        false,
        false,
    );
    nft.apply(&render_changes(&diff(&a, &b))).unwrap();
    assert_eq!(nft.read().unwrap(), Some(b.clone()));
    // A batch nft refuses changes nothing, and its own error text comes back.
    let bad: paddock_firewall::Batch = serde_json::from_value(serde_json::json!({"nftables": [
        {"add": {"element": {"family": "inet", "table": "paddock", "name": "allow", "elem": ["52:54:00:00:00:77"]}}},
        {"add": {"element": {"family": "inet", "table": "paddock", "name": "nope", "elem": ["52:54:00:00:00:78"]}}}
    ]}))
    .unwrap();
    let e = nft.apply(&bad).unwrap_err().to_string();
    assert!(
        e.contains("nft refused the batch") && e.contains("No such file or directory"),
        "{e}"
    );
    assert_eq!(
        nft.read().unwrap(),
        Some(b),
        "the refused batch left nothing behind"
    );
}

/// Timings for 10,000 MACs (printed; bench/filter.sh compares against iptables).
#[test]
fn ten_thousand_macs() {
    let ns = Ns::new("b");
    let nft = Nft::in_netns(&ns.0);
    nft.apply(&render_closed("br0")).unwrap();
    let big = Filter::from_machines((0..10_000).map(|i| (mac(i), i % 10 == 0)), true, true);
    let t = Instant::now();
    nft.apply(&render_full("br0", &big)).unwrap();
    let full = t.elapsed();
    let mut one = big.clone();
    one.deny.insert(mac(20_000));
    let t = Instant::now();
    nft.apply(&render_changes(&diff(&big, &one))).unwrap();
    let add = t.elapsed();
    assert_eq!(nft.read().unwrap(), Some(one));
    println!(
        "nft: 10,000-MAC table {:.1} ms, one MAC added {:.1} ms",
        full.as_secs_f64() * 1e3,
        add.as_secs_f64() * 1e3
    );
}

/// Membership changes over the open netlink socket land exactly as nft's would, are atomic,
/// and a missing table is reported with the kernel's reason and changes nothing.
#[test]
fn membership_over_netlink() {
    let ns = Ns::new("c");
    let nft = Nft::in_netns(&ns.0);
    let e = nft
        .apply_changes(&[paddock_firewall::Change::Add(
            paddock_firewall::SetName::Deny,
            mac(1),
        )])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("inet paddock") && e.contains("No such file or directory"),
        "{e}"
    );
    nft.apply(&render_closed("br0")).unwrap();
    let a = Filter::from_machines((0..100).map(|i| (mac(i), i < 10)), true, true);
    nft.apply(&render_full("br0", &a)).unwrap();
    // Move ten machines from allow to deny and two from deny to allow, add and drop others.
    let b = Filter::from_machines(
        (5..120).map(|i| (mac(i), (10..12).contains(&i) || i >= 110)),
        true,
        true,
    );
    let changes = diff(&a, &b);
    assert!(changes.len() > 20);
    nft.apply_changes(&changes).unwrap();
    assert_eq!(nft.read().unwrap(), Some(b.clone()));
    // Back again, one at a time, as node changes arrive.
    for c in diff(&b, &a) {
        nft.apply_changes(&[c]).unwrap();
    }
    assert_eq!(nft.read().unwrap(), Some(a.clone()));
    // Deleting an element that is not there fails the whole batch: the add before it in the
    // same batch does not land either.
    let e = nft
        .apply_changes(&[
            paddock_firewall::Change::Add(paddock_firewall::SetName::Allow, mac(500)),
            paddock_firewall::Change::Delete(paddock_firewall::SetName::Deny, mac(501)),
        ])
        .unwrap_err()
        .to_string();
    assert!(e.contains("deleting 1 element(s) from set deny"), "{e}");
    assert_eq!(
        nft.read().unwrap(),
        Some(a),
        "the refused batch left nothing"
    );
    // The socket is reopened after an error and works again.
    nft.apply_changes(&[paddock_firewall::Change::Add(
        paddock_firewall::SetName::Deny,
        mac(600),
    )])
    .unwrap();
    assert!(nft.read().unwrap().unwrap().deny.contains(&mac(600)));
}

/// The leader's timed element: present for the timeout given, then gone by itself (a
/// leader that dies closes its interface without doing anything).
#[test]
fn the_leader_element_expires_by_itself() {
    let ns = Ns::new("d");
    let nft = Nft::in_netns(&ns.0);
    nft.apply(&render_closed("br0")).unwrap();
    let listed = || {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &ns.0, "nft", "-j", "list", "set", "inet", "paddock", "leader",
            ])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["nftables"][1]["set"]["elem"].clone()
    };
    assert!(listed().is_null(), "closed: no leader element");
    nft.refresh_leader("br0", Some(std::time::Duration::from_millis(600)))
        .unwrap();
    let e = listed();
    assert_eq!(e[0]["elem"]["val"], "br0", "{e}");
    // Refreshing replaces it (one batch: flush, add).
    nft.refresh_leader("br0", Some(std::time::Duration::from_millis(600)))
        .unwrap();
    assert_eq!(listed().as_array().map(|a| a.len()), Some(1));
    std::thread::sleep(std::time::Duration::from_millis(900));
    assert!(listed().is_null(), "expired: {}", listed());
    // Removed at once when leadership is lost.
    nft.refresh_leader("br0", Some(std::time::Duration::from_secs(60)))
        .unwrap();
    nft.refresh_leader("br0", None).unwrap();
    assert!(listed().is_null());
    // The static rule reads back as before; the leader rule is not mistaken for it.
    assert!(!nft.read().unwrap().unwrap().pass);
}

/// The handle of a chain's rule `index` (from 0), as `nft -a` shows it.
fn rule_handle(ns: &Ns, chain: &str, index: usize) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns", "exec", &ns.0, "nft", "-j", "-a", "list", "chain", "inet", "paddock", chain,
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rules: Vec<u64> = v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["rule"]["handle"].as_u64())
        .collect();
    rules[index]
}

/// Whatever is deleted or changed in the table (a rule of any kind, a chain, a set, a
/// chain's policy, the table's flags), the reconcile path sees drift and rebuilds the
/// table, after which it sees none.
#[test]
fn the_reconcile_repairs_every_kind_of_drift() {
    let ns = Ns::new("g");
    let nft = Nft::in_netns(&ns.0);
    let f = Filter::from_machines((0..50).map(|i| (mac(i), i < 5)), true, true);
    let wanted = Table::rendered("br0", &f);
    // No table at all: built.
    let done = nft.reconcile("br0", &Filter::default(), &f).unwrap();
    assert!(done.rebuilt);
    assert_eq!(done.drift.structure, ["table inet paddock does not exist"]);
    assert_eq!(nft.read_table().unwrap(), Some(wanted.clone()));
    // The leader's timed element is not drift.
    nft.refresh_leader("br0", Some(std::time::Duration::from_secs(60)))
        .unwrap();
    assert_eq!(nft.reconcile("br0", &f, &f).unwrap(), Reconciled::default());
    // Handles change with every rebuild: a command is written when its case comes.
    type Command = fn(&Ns) -> String;
    fn delete_pass_rule(ns: &Ns, i: usize) -> String {
        let handle = rule_handle(ns, "pass", i);
        format!("delete rule inet paddock pass handle {handle}")
    }
    let cases: [(&str, Command, &str); 8] = [
        (
            "input rule",
            |_| "flush chain inet paddock input".into(),
            "chain input: 0 rule(s) instead of 1",
        ),
        (
            "leader rule",
            |ns| delete_pass_rule(ns, 0),
            "chain pass: 1 rule(s) instead of 2",
        ),
        (
            "pass rule",
            |ns| delete_pass_rule(ns, 1),
            "chain pass: 1 rule(s) instead of 2",
        ),
        (
            "input chain",
            |_| "'flush chain inet paddock input; delete chain inet paddock input'".into(),
            "chain input does not exist",
        ),
        (
            "a rule before Paddock's",
            |_| "insert rule inet paddock input accept".into(),
            "chain input: 2 rule(s) instead of 1",
        ),
        (
            "input policy",
            |_| {
                "'add chain inet paddock input { type filter hook input priority -150; policy drop; }'"
                    .into()
            },
            r#"chain input: {"hook":"input","policy":"drop","prio":-150,"type":"filter"} instead of"#,
        ),
        (
            "deny set redefined",
            |_| {
                "'flush chain inet paddock blacklist; delete set inet paddock deny; add set inet paddock deny { type ether_addr; flags interval; }'"
                    .into()
            },
            r#"set deny: {"flags":["interval"],"type":"ether_addr"} instead of {"type":"ether_addr"}"#,
        ),
        (
            "table dormant",
            |_| "'add table inet paddock { flags dormant; }'".into(),
            "table inet paddock: {\"flags\":",
        ),
    ];
    for (what, command, seen) in cases {
        let command = command(&ns);
        nft_cli(&ns, &command);
        let done = nft.reconcile("br0", &f, &f).unwrap();
        assert!(done.rebuilt, "{what}: {}", done.drift);
        assert!(
            done.drift.structure.iter().any(|s| s.starts_with(seen)),
            "{what}: {}",
            done.drift
        );
        assert_eq!(nft.read_table().unwrap(), Some(wanted.clone()), "{what}");
        assert_eq!(
            nft.reconcile("br0", &f, &f).unwrap(),
            Reconciled::default(),
            "{what}: repaired"
        );
    }
    // Membership alone: element changes, no rebuild.
    nft_cli(&ns, "flush set inet paddock allow");
    let done = nft.reconcile("br0", &f, &f).unwrap();
    assert!(!done.rebuilt);
    assert_eq!(
        done.drift.to_string(),
        "set allow: 5 element(s) missing, 0 not wanted"
    );
    assert_eq!(nft.read_table().unwrap(), Some(wanted));
}

/// nft failing for any reason but a missing table is an error, never "no table".
#[test]
fn an_unreadable_table_is_an_error() {
    let nft = Nft::in_netns(&format!("pdkfw{}-gone", std::process::id() % 100_000));
    let e = nft.read_table().unwrap_err().to_string();
    assert!(
        e.starts_with("nft cannot read table inet paddock: ")
            && e.contains("Cannot open network namespace"),
        "{e}"
    );
    let e = nft
        .reconcile("br0", &Filter::default(), &Filter::default())
        .unwrap_err();
    assert!(matches!(e, NftError::Unreadable(_)), "{e:?}");
}

/// A transient failure closes the filter and the next reconcile that succeeds gives the
/// pass rule back: another process holds `inet paddock` as its own (`flags owner`: the
/// kernel refuses every change from anyone else) until it lets go, as a busy or racing
/// writer would. [`Health`] decides; this test plays the appliance's shell.
#[test]
fn a_failed_reconcile_closes_and_the_next_good_one_reopens() {
    use std::io::Write;
    use std::time::Duration;

    let ns = Ns::new("h");
    let nft = Nft::in_netns(&ns.0);
    let want = Filter::from_machines([(mac(1), true)], true, true);
    nft.apply(&render_full("br0", &want)).unwrap();
    let mut holder = Command::new("ip")
        .args(["netns", "exec", &ns.0, "nft", "-i"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    writeln!(
        holder.stdin.as_mut().unwrap(),
        "delete table inet paddock; add table inet paddock {{ flags owner; }}"
    )
    .unwrap();
    // nft 1.0.6 cannot print an owned table's flags as JSON (the listing breaks off: the
    // read fails); later versions list it, and the rebuild is refused.
    let owned = || match nft.read_table() {
        Ok(t) => t.is_some_and(|t| t.table.extra.contains_key("flags")),
        Err(e) => matches!(e, NftError::Output(_)),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !owned() {
        assert!(Instant::now() < deadline, "the owned table never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }

    let (t0, mut health) = (Instant::now(), Health::default());
    let e = nft.reconcile("br0", &want, &want).unwrap_err();
    assert!(
        matches!(&e, NftError::Refused(m) if m.contains("Operation not permitted"))
            || matches!(&e, NftError::Output(_)),
        "{e:?}"
    );
    assert!(health.failed(e.to_string(), t0, 0), "closes");
    assert!(
        !health.renders_pass(true, false) && !health.may_serve(true),
        "closed: no pass rule from an incremental update, none for the DHCP side"
    );
    // Retried while the owner holds on: still closed, and the wait grows.
    let e = nft.reconcile("br0", &want, &want).unwrap_err();
    assert!(!health.failed(e.to_string(), t0, 0), "already closed");
    // The second wait's step is 1 s, jittered within [0.5 s, 1 s].
    let wait = health.next_retry(t0, Duration::from_secs(10)).unwrap();
    assert!(
        wait >= Duration::from_millis(500) && wait <= Duration::from_secs(1),
        "{wait:?}"
    );
    assert!(
        nft.read().map_or(true, |t| !t.unwrap().pass),
        "no pass rule meanwhile"
    );

    // The owner lets go (its socket closes, the kernel drops its table).
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let pass = health.renders_pass(true, true);
    assert!(pass, "a whole-table reconcile tries to reopen");
    let done = nft
        .reconcile(
            "br0",
            &want,
            &Filter {
                pass,
                ..want.clone()
            },
        )
        .unwrap();
    assert!(done.rebuilt);
    assert_eq!(health.succeeded().map(|c| c.attempts), Some(2));
    assert!(health.may_serve(true));
    assert_holds(&nft, &want, "reopened");
}
