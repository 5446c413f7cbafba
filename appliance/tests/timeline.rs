//! The timeline stays bounded: DHCP renewals are counted on one entry, and pruning keeps the
//! newest entries of every node and MAC plus each node's last introspection.

mod support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use paddock_inspector::node::Node;
use paddock_inspector::service::{
    DhcpAnswer, DhcpReply, EVENTS, Inspector, InspectorConfig, TimelineLimits,
};
use paddock_inventory::MacAddr;
use paddock_store::{SqliteStore, Store};
use paddock_wire::unix_ms as now_ms;
use support::*;

/// `events/` keys per subject.
async fn entries_per_subject(store: &dyn Store) -> BTreeMap<String, usize> {
    let mut per = BTreeMap::new();
    for kv in store.range(EVENTS).await.unwrap() {
        let who = kv.key[EVENTS.len()..]
            .split('/')
            .next()
            .unwrap()
            .to_string();
        *per.entry(who).or_default() += 1;
    }
    per
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const MACS: u32 = 200;
const ANSWERS: usize = 100_000;

fn mac_of(i: u32) -> MacAddr {
    let b = i.to_be_bytes();
    MacAddr([0x52, 0x54, 0, b[1], b[2], b[3]])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_dhcp_answers_leave_a_bounded_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(SqliteStore::open(dir.path().join("store.db")).unwrap());
    let inspector = Inspector::new(store.clone(), InspectorConfig::default());
    let limits = TimelineLimits {
        keep_per_subject: 20,
        keep_last_introspection: true,
    };
    // Simulated time, in the past: 10 ms per answer.
    let t0 = now_ms() - 3_600_000;
    // MAC 0 belongs to a node under introspection since t0: all of its entries are kept.
    let mut node = Node::new(uuid::Uuid::new_v4(), t0 / 1000);
    node.macs = vec![mac_of(0)];
    inspector.create(&node).await.unwrap();
    let ident = node.uuid.to_string();
    inspector.start(&ident, false, t0 / 1000).await.unwrap();
    let introspected = format!("mac-{}", mac_of(0).to_hex());

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut leases: BTreeMap<u32, Ipv4Addr> = BTreeMap::new();
    let (mut answers, mut batch) = (0usize, Vec::new());
    let (mut most, mut prune_time, mut next_prune) = (0usize, Duration::ZERO, 10_000);
    // When the introspected machine's entries were made.
    let mut introspected_at = Vec::new();
    // Entries made (offers, and acks that are not renewals).
    let mut recorded = 0usize;
    let at = |n: usize| t0 + i64::try_from(n).unwrap() * 10;
    for step in 0.. {
        if answers >= ANSWERS {
            break;
        }
        // Every 100th step is a PXE boot of the machine under introspection.
        let i = if step % 100 == 0 {
            0
        } else {
            u32::try_from(rng.below(u64::from(MACS))).unwrap()
        };
        let mac = mac_of(i);
        let held = leases.get(&i).copied();
        let roll = rng.below(100);
        let ip = match held {
            // A new address now and then.
            Some(ip) if roll >= 3 => ip,
            _ => Ipv4Addr::from(0xc612_0000 + u32::try_from(rng.below(60_000)).unwrap()),
        };
        leases.insert(i, ip);
        let answer = |reply, n| DhcpAnswer {
            mac,
            reply,
            ip: ip.into(),
            boot: "undionly.kpxe".into(),
            at_ms: at(n),
        };
        // A PXE boot (first answer, one in ten, and the introspected machine): offer + ack;
        // otherwise a renewal, counted on the entry of the lease's ack.
        if held.is_none() || roll < 10 || i == 0 {
            recorded += 1;
            batch.push(answer(DhcpReply::Offer, answers));
            answers += 1;
        }
        // An ack of the lease held is a renewal: counted, not recorded.
        if held != Some(ip) || roll < 10 || i == 0 {
            recorded += 1;
        }
        if i == 0 {
            introspected_at.extend([at(answers - 1), at(answers)]);
        }
        batch.push(answer(DhcpReply::Ack, answers));
        answers += 1;
        if batch.len() >= 256 {
            inspector.dhcp_answered(&batch).await.unwrap();
            batch.clear();
        }
        if answers >= next_prune {
            next_prune += 10_000;
            inspector.dhcp_answered(&batch).await.unwrap();
            batch.clear();
            let started = Instant::now();
            inspector.prune_timeline(&limits, None).await.unwrap();
            prune_time = prune_time.max(started.elapsed());
            let per = entries_per_subject(store.as_ref()).await;
            most = most.max(per.values().sum());
            for (who, n) in &per {
                assert!(
                    *n <= limits.keep_per_subject || *who == introspected,
                    "{who} keeps {n} entries after {answers} answers"
                );
            }
        }
    }
    inspector.dhcp_answered(&batch).await.unwrap();
    inspector.prune_timeline(&limits, None).await.unwrap();
    let per = entries_per_subject(store.as_ref()).await;
    let total: usize = per.values().sum();
    let kept = per[&introspected];
    // Its PXE boots (offer and ack each) are all kept while its introspection runs.
    assert_eq!(kept, introspected_at.len());
    assert!(kept > 2 * limits.keep_per_subject, "{kept}");
    let bound = (per.len() - 1) * limits.keep_per_subject + kept;
    assert!(total <= bound, "{total} > {bound}");
    println!(
        "timeline: {ANSWERS} DHCP answers to {MACS} MACs: {recorded} entries made (the other \
         answers were renewals, counted), {total} kept (bound {bound}: {} per subject + {kept} \
         of the running introspection); at most {most} after a pruning; slowest pruning {:.0} ms",
        limits.keep_per_subject,
        prune_time.as_secs_f64() * 1e3
    );

    // The introspection ends half-way through: what came after it is no longer protected.
    let half = at(ANSWERS / 2);
    inspector.abort(&ident, half / 1000).await.unwrap();
    inspector.prune_timeline(&limits, None).await.unwrap();
    let per = entries_per_subject(store.as_ref()).await;
    let kept_after = per[&introspected];
    let end = half / 1000 * 1000 + 999;
    let during = introspected_at.iter().filter(|t| **t <= end).count();
    let after = introspected_at.len() - during;
    assert_eq!(
        kept_after,
        during + after.min(limits.keep_per_subject),
        "{during} during, {after} after"
    );
    println!(
        "timeline: after the introspection ended, its MAC keeps {kept_after} entries (its \
         introspection's and the newest {})",
        limits.keep_per_subject
    );
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A udhcpc script that takes the address (so that renewals can be unicast) and logs events.
fn renewing_script(scratch: &Scratch) -> std::path::PathBuf {
    let p = scratch.path("renew.sh");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\ncase \"$1\" in bound|renew)\n  ip addr flush dev \"$interface\"\n  \
             ip addr add \"$ip/$mask\" dev \"$interface\"\n  echo \"$1 $ip\" >> {}\n;; esac\n",
            scratch.path("events").display()
        ),
    )
    .unwrap();
    sh_ok(&format!("chmod +x {}", p.display()));
    p
}

fn lines_of(scratch: &Scratch, event: &str) -> usize {
    std::fs::read_to_string(scratch.path("events"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(event))
        .count()
}

#[test]
fn real_renewals_are_counted_and_the_timeline_is_pruned() {
    require(&["busybox", "curl", "ip"]);
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let keep = 4;
    let _app = Appliance::start(
        &link.server,
        &scratch,
        &base_config(
            &link,
            &scratch,
            &format!(
                "[tftp]\nenabled = false\n[timeline]\nkeep_per_subject = {keep}\nprune_every_secs = 1\n"
            ),
        ),
    );
    let mac = "52:54:00:7e:00:01";
    link.client.sh_ok(&format!(
        "ip link set {0} down && ip link set {0} address {mac} && ip link set {0} up",
        link.client_if
    ));
    let created = http(
        &link.server,
        &scratch,
        "POST",
        "/api/v1/nodes",
        Some(&format!(r#"{{"macs": ["{mac}"]}}"#)),
        &[],
    );
    assert_eq!(created.status, 201, "{}", created.body);
    let uuid = created.json()["uuid"].as_str().unwrap().to_string();
    let timeline = || -> Vec<serde_json::Value> {
        http(
            &link.server,
            &scratch,
            "GET",
            &format!("/api/v1/nodes/{uuid}"),
            None,
            &[],
        )
        .json()["timeline"]
            .as_array()
            .unwrap()
            .clone()
    };

    // A PXE client that stays bound and renews its lease three times.
    let script = renewing_script(&scratch);
    let pxe = "-V PXEClient:Arch:00000:UNDI:002001 -x 0x5d:0000";
    let mut client = link.client.spawn(
        &format!(
            "busybox udhcpc -i {} -f -t 5 -T 1 -A 1 -s {} {pxe}",
            link.client_if,
            script.display()
        ),
        &scratch.path("udhcpc.log"),
    );
    wait_for("the lease", || {
        (lines_of(&scratch, "bound") == 1).then_some(())
    });
    for n in 1..=3 {
        sh_ok(&format!("kill -USR1 {}", client.id()));
        wait_for("a renewal", || {
            (lines_of(&scratch, "renew") == n).then_some(())
        });
    }
    let entry = wait_for("three renewals counted", || {
        timeline().into_iter().find(|e| {
            e["kind"] == "dhcp"
                && e["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("renewed 3 times")
        })
    });
    println!("timeline entry: {}", entry["message"]);
    assert_eq!(entry["repeats"], 3, "{entry}");
    assert!(
        entry["message"]
            .as_str()
            .unwrap()
            .starts_with("DHCP Ack 198.18.0.1"),
        "{entry}"
    );
    let _ = client.kill();
    let _ = client.wait();

    // Every new boot is an entry (offer and ack); the leader prunes the MAC's timeline to
    // the newest `keep` (the node's own "created" entry is its only one).
    for _ in 0..4 {
        udhcpc(&link, &scratch, pxe).expect("a lease");
    }
    let last = wait_for("pruning", || {
        let t = timeline();
        (t.len() <= keep + 1).then_some(t)
    });
    assert!(last.iter().any(|e| e["kind"] == "created"), "{last:?}");
    let dhcp = last.iter().filter(|e| e["kind"] == "dhcp").count();
    assert_eq!(dhcp, keep, "{last:?}");
}
