//! `paddock-failover [ROUNDS]`: three appliance hosts on a three-member etcd cluster (in
//! namespaces this creates); the leader is killed with SIGKILL ROUNDS times (default 10),
//! each time timed from the kill until another host holds the pass rule, then restarted
//! as a follower. A sampler reads every host's ruleset every 100 ms throughout. Prints
//! `failover p50=<s> max=<s> double_pass=<n>` (used by bench/failover.sh).

use std::time::{Duration, Instant};

use paddock_vm_tests::Artifacts;
use paddock_vm_tests::ha::HaLab;

fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(10);
    let mut lab = HaLab::start("failover", &Artifacts::from_env()?, 3)?;
    for i in 0..3 {
        lab.start_appliance(i)?;
    }
    let sampler = lab.sampler();
    let mut times = Vec::new();
    for round in 1..=rounds {
        let leader = lab.wait_leader(Duration::from_secs(30), None)?;
        // Let the cluster settle: every host up, leader stable.
        std::thread::sleep(Duration::from_secs(2));
        let t = Instant::now();
        lab.kill_appliance(leader);
        let next = lab.wait_leader(Duration::from_secs(30), Some(leader))?;
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "# round {round}: h{} killed, h{} leads after {s:.2} s",
            leader + 1,
            next + 1
        );
        times.push(s);
        lab.start_appliance(leader)?;
    }
    let (samples, max, doubles) = sampler.finish();
    times.sort_by(f64::total_cmp);
    let p50 = times[times.len() / 2];
    let worst = times.last().copied().unwrap_or(0.0);
    eprintln!("# sampler: {samples} samples, at most {max} pass rule(s) at once");
    println!(
        "failover p50={p50:.2} max={worst:.2} double_pass={}",
        doubles.len()
    );
    Ok(())
}
