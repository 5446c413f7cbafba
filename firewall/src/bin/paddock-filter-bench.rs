//! `paddock-filter-bench NETNS [COUNT]`: times Paddock's filter operations with real nft in
//! a network namespace (used by bench/filter.sh, which times iptables the same way).

use std::time::Instant;

use paddock_dhcp::MacAddr;
use paddock_firewall::{Filter, Nft, diff, render_closed, render_full};

fn mac(i: u32) -> MacAddr {
    MacAddr([0x52, 0x54, 0x03, (i >> 16) as u8, (i >> 8) as u8, i as u8])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let ns = args
        .next()
        .ok_or("usage: paddock-filter-bench NETNS [COUNT]")?;
    let count: u32 = args
        .next()
        .map(|c| c.parse())
        .transpose()?
        .unwrap_or(10_000);
    let nft = Nft::in_netns(&ns);
    nft.apply(&render_closed("pdkbench0"))?;
    let full = Filter::from_machines((0..count).map(|i| (mac(i), false)), true, true);
    let t = Instant::now();
    nft.apply(&render_full("pdkbench0", &full))?;
    let full_ms = t.elapsed().as_secs_f64() * 1e3;
    // One MAC in and out, nine times; the median of each (membership changes go over the
    // appliance's open netlink socket, as they do in `paddock serve`).
    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for k in 0..9 {
        let mut plus = full.clone();
        plus.deny.insert(mac(count + 1 + k));
        let t = Instant::now();
        nft.apply_changes(&diff(&full, &plus))?;
        adds.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        nft.apply_changes(&diff(&plus, &full))?;
        removes.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (add_ms, remove_ms) = (median(&mut adds), median(&mut removes));
    let back = nft.read()?.ok_or("table vanished")?;
    if back.deny.len() != count as usize {
        return Err(format!("read back {} MACs, wanted {count}", back.deny.len()).into());
    }
    println!(
        "filter paddock macs={count} full_ms={full_ms:.1} add_one_ms={add_ms:.1} remove_one_ms={remove_ms:.1}"
    );
    Ok(())
}
