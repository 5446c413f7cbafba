//! Times Paddock's filter operations with real nft in a network namespace (used by
//! bench/filter.sh, which times iptables the same way).
//!
//! `paddock-filter-bench NETNS [COUNT]`: the whole table with COUNT MACs through nft, then
//! one MAC added and removed over netlink (the request path).
//!
//! `paddock-filter-bench netlink NETNS COUNT`: COUNT MACs through the netlink path: all
//! added in one batch, every tenth moved to the allow set, the deny set flushed behind
//! Paddock's back and repaired by the reconcile path ([`Nft::reconcile`]), a reconcile with
//! nothing to repair (the periodic loop's cost), all removed.

use std::process::Command;
use std::time::Instant;

use paddock_firewall::{Filter, Nft, diff, render_closed, render_full};
use paddock_inventory::MacAddr;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn mac(i: u32) -> MacAddr {
    let b = i.to_be_bytes();
    MacAddr([0x52, 0x54, 0x03, b[1], b[2], b[3]])
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["netlink", ns, count] => netlink(ns, count.parse()?),
        [ns] => whole_table(ns, 10_000),
        [ns, count] if ns != "netlink" => whole_table(ns, count.parse()?),
        _ => Err("usage: paddock-filter-bench NETNS [COUNT] | netlink NETNS COUNT".into()),
    }
}

fn whole_table(ns: &str, count: u32) -> Res<()> {
    let nft = Nft::in_netns(ns);
    nft.apply(&render_closed("pdkbench0"))?;
    let full = Filter::from_machines((0..count).map(|i| (mac(i), false)), true, true);
    let t = Instant::now();
    nft.apply(&render_full("pdkbench0", &full))?;
    let full_ms = ms_since(t);
    // One MAC in and out, nine times; the median of each (membership changes go over the
    // appliance's open netlink socket, as they do in `paddock serve`).
    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for k in 0..9 {
        let mut plus = full.clone();
        plus.deny.insert(mac(count + 1 + k));
        let t = Instant::now();
        nft.apply_changes(&diff(&full, &plus))?;
        adds.push(ms_since(t));
        let t = Instant::now();
        nft.apply_changes(&diff(&plus, &full))?;
        removes.push(ms_since(t));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (add_ms, remove_ms) = (median(&mut adds), median(&mut removes));
    expect(&nft, &full)?;
    println!(
        "filter paddock macs={count} full_ms={full_ms:.1} add_one_ms={add_ms:.1} remove_one_ms={remove_ms:.1}"
    );
    Ok(())
}

fn netlink(ns: &str, count: u32) -> Res<()> {
    let nft = Nft::in_netns(ns);
    nft.apply(&render_closed("pdkbench0"))?;
    let none = Filter::default();
    let all = Filter::from_machines((0..count).map(|i| (mac(i), false)), false, false);
    let t = Instant::now();
    nft.apply_changes(&diff(&none, &all))?;
    let add_all_ms = ms_since(t);
    expect(&nft, &all)?;
    let moved = Filter::from_machines((0..count).map(|i| (mac(i), i % 10 == 0)), false, false);
    let t = Instant::now();
    nft.apply_changes(&diff(&all, &moved))?;
    let move_ms = ms_since(t);
    expect(&nft, &moved)?;
    let flushed = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "flush set inet paddock deny"])
        .status()?;
    if !flushed.success() {
        return Err("nft flush set failed".into());
    }
    // The reconcile path: read the kernel's whole table, compare, send the difference.
    let t = Instant::now();
    let done = nft.reconcile("pdkbench0", &moved, &moved)?;
    let repair_ms = ms_since(t);
    if done.rebuilt || done.drift.elements.len() != moved.deny.len() {
        return Err(format!(
            "unexpected repair: {} (rebuilt: {})",
            done.drift, done.rebuilt
        )
        .into());
    }
    expect(&nft, &moved)?;
    // What the periodic loop costs when there is nothing to repair.
    let t = Instant::now();
    let idle = nft.reconcile("pdkbench0", &moved, &moved)?;
    let idle_ms = ms_since(t);
    if !idle.drift.is_empty() {
        return Err(format!("drift where there is none: {}", idle.drift).into());
    }
    let t = Instant::now();
    nft.apply_changes(&diff(&moved, &none))?;
    let remove_all_ms = ms_since(t);
    expect(&nft, &none)?;
    println!(
        "filter netlink macs={count} add_all_ms={add_all_ms:.1} move_ms={move_ms:.1} remove_all_ms={remove_all_ms:.1} repair_ms={repair_ms:.1} reconcile_idle_ms={idle_ms:.1}"
    );
    Ok(())
}

/// Checks the kernel holds `want` (outside the timings). A listing can miss elements of a
/// big set while the kernel resizes its hash, so a mismatch is read again for a moment.
fn expect(nft: &Nft, want: &Filter) -> Res<()> {
    let mut held = None;
    for _ in 0..20 {
        held = nft.read()?;
        if held.as_ref() == Some(want) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (a, d) = held.map_or((0, 0), |h| (h.allow.len(), h.deny.len()));
    Err(format!(
        "the kernel holds {a} allowed and {d} denied MACs, wanted {} and {}",
        want.allow.len(),
        want.deny.len()
    )
    .into())
}
