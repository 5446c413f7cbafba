//! Three appliance hosts on one etcd cluster (one member per host), on one provisioning
//! bridge. A sampler reads every host's pass chain every 100 ms throughout and must never
//! see two pass rules. TLS on: etcd with client certificates, every host's API over HTTPS,
//! agents with the tokens their boot scripts carry, subds over mutual TLS.

use std::time::{Duration, Instant};

use paddock_vm_tests::ha::HaLab;
use paddock_vm_tests::{Artifacts, Creds, VmSpec, node_with_mac, wait_every};
use serde_json::{Value, json};

fn artifacts() -> Artifacts {
    Artifacts::from_env().expect("build artifacts (scripts/test.sh builds them)")
}

/// One three-host lab at a time: each runs three appliances and three etcd members, and
/// on two cores, two labs at once starve etcd's heartbeats (the hosts would still never
/// both serve, but the timings the tests print would mean little).
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn start(name: &str) -> HaLab {
    let mut lab = HaLab::start(name, &artifacts(), 3).expect("HA lab");
    for i in 0..3 {
        lab.start_appliance(i).expect("appliance");
    }
    lab
}

/// Who leads once the lab's hosts have held their first election.
fn first_leader(lab: &HaLab) -> usize {
    lab.wait_leader(Duration::from_secs(20), None)
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()))
}

/// VM `vm`'s console and every host's log, for a failure message.
fn tails(lab: &HaLab, vm: usize) -> String {
    format!("{}\n{}", lab.vms[vm].console_text(), lab.logs())
}

/// SIGKILL the leader (no resignation): when it happened, and who leads once its lease ran out.
fn kill_leader(lab: &mut HaLab, leader: usize) -> (Instant, usize) {
    let t = Instant::now();
    lab.kill_appliance(leader);
    let next = lab
        .wait_leader(Duration::from_secs(15), Some(leader))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    (t, next)
}

#[test]
fn leadership_moves_on_kill_partition_and_sigterm_and_never_doubles() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let mut lab = start("lead");
    let sampler = lab.sampler();
    let leader = first_leader(&lab);

    // Every host knows who leads.
    for i in 0..3 {
        let (status, body) = lab.api(i, "GET", "/api/v1/cluster", None).unwrap();
        assert_eq!(status, 200);
        let c: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(c["leading"], i == leader, "{c}");
        assert_eq!(c["leader"]["host"], format!("h{}", leader + 1), "{c}");
    }
    // SIGKILL: no resignation; another host leads once the lease runs out.
    let (t, second) = kill_leader(&mut lab, leader);
    println!(
        "ha: SIGKILL of the leader → new pass rule in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    // The killed host comes back as a follower: the leader does not change.
    lab.start_appliance(leader).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        lab.wait_leader(Duration::from_secs(1), None).unwrap(),
        second,
        "the old leader rejoined as a follower"
    );

    // Partition: the leader's etcd member is cut off; it drops its pass rule by itself.
    let t = Instant::now();
    lab.partition(second, true).unwrap();
    wait_every(
        "a partitioned leader to drop its pass rule",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || (!lab.pass_rules()[second]).then_some(()),
        || lab.logs(),
    );
    println!(
        "ha: partitioned leader dropped its pass rule after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let _during_partition = lab
        .wait_leader(Duration::from_secs(15), Some(second))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    lab.partition(second, false).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let now = lab.wait_leader(Duration::from_secs(10), None).unwrap();
    assert_ne!(now, second, "the healed host rejoined as a follower");
    let third = now;

    // SIGTERM: the leader closes its filter and resigns, so another takes over at once.
    let t = Instant::now();
    lab.stop_appliance(third);
    let fourth = lab
        .wait_leader(Duration::from_secs(10), Some(third))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    println!(
        "ha: SIGTERM of the leader → new pass rule in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    assert_ne!(fourth, third);
    assert!(
        !lab.pass_rules()[third],
        "a stopped host keeps its interface closed"
    );

    let (samples, max, doubles) = sampler.finish();
    println!("ha: sampler read {samples} times; at most {max} pass rule(s) at once");
    assert!(samples > 50);
    assert!(
        max <= 1,
        "two pass rules at once: {doubles:?}\n{}",
        lab.logs()
    );
}

/// An IPA-shaped inventory with one NIC.
fn inventory(mac: &str) -> Value {
    json!({
        "inventory": {
            "interfaces": [{"name": "eth0", "mac_address": mac, "ipv4_address": "198.18.0.99", "has_carrier": true}],
            "cpu": {"model_name": "test", "count": 2, "architecture": "x86_64"},
            "memory": {"total": 1_000_000_000u64, "physical_mb": 1024},
            "disks": [{"name": "/dev/vda", "size": 10u64 << 30, "rotational": true}],
            "system_vendor": {"product_name": "test", "serial_number": "", "manufacturer": "test"},
            "boot": {"current_boot_mode": "bios", "pxe_interface": mac},
            "hostname": "localhost"
        },
        "boot_interface": format!("01-{}", mac.replace(':', "-")),
    })
}

#[test]
fn killing_a_host_during_twenty_introspections_loses_none() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let mut lab = start("kill");
    let urls: Vec<String> = lab.hosts.iter().map(|h| h.url()).collect();
    let macs: Vec<String> = (0..20).map(|i| format!("52:54:00:77:00:{i:02x}")).collect();
    let mut uuids = Vec::new();
    for mac in &macs {
        let n = lab
            .api_json_any(
                "POST",
                "/api/v1/nodes",
                Some(&json!({"macs": [mac]}).to_string()),
            )
            .unwrap();
        let uuid = n["uuid"].as_str().unwrap().to_string();
        lab.api_json_any("POST", &format!("/v1/introspection/{uuid}"), None)
            .ok();
        uuids.push(uuid);
    }
    // Each agent's token, as its ramdisk gets it: on the kernel command line of the boot
    // script a host serves on plain HTTP (any host's token is good on every host: they share
    // the agent key through the store).
    let ca = lab.hosts[0].certs();
    let agents: Vec<Creds> = macs
        .iter()
        .enumerate()
        .map(|(i, mac)| {
            let url = format!("{}/boot/{mac}.ipxe", lab.hosts[i % 3].boot_url());
            let (status, script) = lab.client(&Creds::none(), &url, "GET", None);
            assert_eq!(status, 200, "{url}: {script}");
            let token = script
                .split_whitespace()
                .find_map(|w| w.strip_prefix("paddock.token="))
                .unwrap_or_else(|| panic!("no paddock.token in the boot script:\n{script}"));
            Creds::token_in(&ca, token)
        })
        .collect();
    // Twenty agents post their inventories, each to the hosts in turn (as the ramdisk does
    // when a host cannot be reached), while the leader is killed part-way through.
    // The leader dies: the harshest case (its DHCP and its pass rule go too).
    let victim = lab.wait_leader(Duration::from_secs(20), None).unwrap();
    let victim_pid = lab.appliance_pid(victim).unwrap();
    let lab_ref = &lab;
    let results: Vec<(String, u16)> = std::thread::scope(|s| {
        let handles: Vec<_> = macs
            .iter()
            .zip(&agents)
            .enumerate()
            .map(|(i, (mac, agent))| {
                let urls = urls.clone();
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(50 * i as u64));
                    let body = inventory(mac).to_string();
                    let mut k = i;
                    for _ in 0..60 {
                        let url = &urls[k % urls.len()];
                        let (status, _) = lab_ref.client(
                            agent,
                            &format!("{url}/v1/continue"),
                            "POST",
                            Some(&body),
                        );
                        match status {
                            200 => return (mac.clone(), 200),
                            0 | 500..=599 | 409 => {
                                k += 1;
                                std::thread::sleep(Duration::from_millis(300));
                            }
                            other => return (mac.clone(), other),
                        }
                    }
                    (mac.clone(), 0)
                })
            })
            .collect();
        // Part-way through the batch the leader dies (SIGKILL: mid-request for some agents).
        std::thread::sleep(Duration::from_millis(400));
        std::process::Command::new("kill")
            .args(["-9", &victim_pid.to_string()])
            .status()
            .unwrap();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    lab.kill_appliance(victim); // reap it
    // A host whose DHCP pool overlaps another's refuses to start (leases are shared).
    let other = (victim + 1) % 3;
    lab.hosts[victim].pool = Some((100 + 30 * other + 5, 100 + 30 * other + 9));
    let err = lab.start_appliance(victim).unwrap_err().to_string();
    assert!(err.contains("overlaps host"), "{err}");
    for (mac, status) in &results {
        assert_eq!(
            *status,
            200,
            "the agent for {mac} never got its inventory in\n{}",
            lab.logs()
        );
    }
    for uuid in &uuids {
        let n = lab
            .api_json_any("GET", &format!("/api/v1/nodes/{uuid}"), None)
            .unwrap();
        let st = n["introspection"]["state"].as_str().unwrap_or("");
        assert_eq!(st, "finished", "node {uuid}: {n}");
    }
}

#[test]
fn a_vm_enrols_and_finishes_after_its_leader_is_killed() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let mut lab = start("vm");
    let sampler = lab.sampler();
    let leader = first_leader(&lab);
    let vm = lab.boot(VmSpec::bios("havm", "52:54:00:88:00:01")).unwrap();
    // Wait until the VM runs the discovery ramdisk (the agent prints its banner).
    wait_every(
        "the VM to reach the ramdisk",
        Duration::from_secs(150),
        Duration::from_millis(200),
        || {
            lab.vms[vm]
                .console_text()
                .contains("paddock-agent")
                .then_some(())
        },
        || tails(&lab, vm),
    );
    let (t, next) = kill_leader(&mut lab, leader);
    println!(
        "ha: leader h{} killed while the VM was in the ramdisk; h{} leads after {:.2} s",
        leader + 1,
        next + 1,
        t.elapsed().as_secs_f64()
    );
    let node = wait_every(
        "the VM's introspection to complete",
        Duration::from_secs(180),
        Duration::from_secs(1),
        || {
            let nodes = lab
                .api_json_any("GET", "/api/v1/nodes", None)
                .unwrap_or(Value::Null);
            node_with_mac(&nodes, "52:54:00:88:00:01")
                .filter(|n| {
                    matches!(
                        n["introspection"]["state"].as_str(),
                        Some("finished" | "error")
                    )
                })
                .cloned()
        },
        || tails(&lab, vm),
    );
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    println!(
        "ha: the VM's introspection finished {:.1} s after power-on",
        lab.vms[vm].powered_on.elapsed().as_secs_f64()
    );
    let (samples, max, doubles) = sampler.finish();
    assert!(samples > 50);
    assert!(
        max <= 1,
        "two pass rules at once: {doubles:?}\n{}",
        lab.logs()
    );
}

/// The images' filter and subd's exclusions.
const FILTER: [&str; 3] = ["/tmp/.*", "/var/log/.*", "/var/tmp/.*"];

fn images_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images")
}

/// Regular files and symlinks under `root` (not the filtered paths nor `.subd`): path →
/// (mode, contents or link target).
fn files(root: &std::path::Path) -> std::collections::BTreeMap<String, (u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel == ".subd"
                || ["tmp/", "var/log/", "var/tmp/"]
                    .iter()
                    .any(|f| rel.starts_with(f))
            {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p);
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, (m.mode(), t.display().to_string().into_bytes()));
            } else if m.is_file() {
                out.insert(rel, (m.mode(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// `paddock` on host `i`'s namespace against its API.
fn cli(lab: &HaLab, i: usize, args: &str) -> String {
    let out = paddock_vm_tests::sh(&format!(
        "ip netns exec {} env {} {} {args}",
        lab.hosts[i].ns,
        lab.admin().cli_env(&lab.hosts[i].url()),
        artifacts().paddock.display()
    ))
    .unwrap();
    assert!(
        out.status.success(),
        "paddock {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// hostname → summary, from host `i`'s dominator (empty unless it leads).
fn census(lab: &HaLab, i: usize) -> std::collections::BTreeMap<String, String> {
    let Ok((200, body)) = lab.api(i, "GET", "/rpc/Dominator.ListSubs", None) else {
        return Default::default();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["hostname"].as_str().unwrap_or("").to_string(),
                s["summary"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn wait_synced(lab: &HaLab, i: usize, subs: usize, image: &str, secs: u64) -> Duration {
    let t = Instant::now();
    let want = format!("synced to {image}");
    loop {
        let c = census(lab, i);
        if c.len() == subs && c.values().all(|s| *s == want) {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "not every sub is {want:?} on h{} after {secs} s: {c:#?}\n{}",
            i + 1,
            lab.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_dominator_carries_on_under_a_new_leader() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let dir = images_dir();
    assert!(
        dir.join("minbase2.tar").exists(),
        "{} is missing: run scripts/test-images.sh (scripts/test.sh does)",
        dir.display()
    );
    let subd = artifacts().paddock.with_file_name("paddock-subd");
    assert!(
        subd.exists(),
        "{} (cargo build -p paddock-subd)",
        subd.display()
    );
    let mut lab = HaLab::start("dom", &artifacts(), 3).expect("HA lab");
    lab.extra_config =
        "[dominator]\npoll_interval_ms = 200\nmax_updates = 2\nfetch_speed_percent = 99\n".into();
    for i in 0..3 {
        lab.start_appliance(i).expect("appliance");
    }
    let leader = first_leader(&lab);

    // Both images are added through a follower: the objects land on that host only, and
    // replication must bring them to the others.
    let via = (leader + 1) % 3;
    let filter = lab.dir.join("filter");
    std::fs::write(&filter, FILTER.join("\n") + "\n").unwrap();
    for name in ["minbase", "minbase2"] {
        cli(
            &lab,
            via,
            &format!(
                "image add {name} {} --filter {}",
                dir.join(format!("{name}.tar")).display(),
                filter.display()
            ),
        );
    }
    let t = Instant::now();
    for i in 0..3 {
        loop {
            let (s, body) = lab
                .api(i, "GET", "/rpc/ImageServer.ShowImage?name=minbase2", None)
                .unwrap_or((0, String::new()));
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            if s == 200 && v["missing_objects"] == 0 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "minbase2 not replicated to h{}: {s} {body}\n{}",
                i + 1,
                lab.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    println!(
        "ha: both images complete on every host {:.1} s after they were added on h{}",
        t.elapsed().as_secs_f64(),
        via + 1
    );

    // Two subds in the fabric, on copies of minbase under /dev/shm, "linked" at 500 kB/s and
    // fetching at 99 % of that (100 % means unlimited): minbase2's 15 MB of new objects take
    // about 30 s, long enough to kill the leader during the fetch.
    let roots = std::path::Path::new("/dev/shm").join(format!("paddock-ha-{}", lab.net));
    std::fs::create_dir_all(&roots).unwrap();
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(roots.clone());
    let subs: Vec<(String, String)> = (0..2)
        .map(|i| (format!("sub{i}"), format!("198.18.0.{}", 3 + i)))
        .collect();
    // Each sub's certificate (role subd: it may fetch objects), issued on host 1 and
    // answering for its address, as the birther installs one on a machine it provisions.
    let sub_certs = lab.dir.join("subs");
    for (host, ip) in &subs {
        paddock_vm_tests::certs(
            &lab.hosts[0].ns,
            &artifacts().paddock,
            &lab.hosts[0].config(),
            &format!(
                "issue {host} --role subd --san {ip} --out {}",
                sub_certs.display()
            ),
        )
        .unwrap();
    }
    let ca_pem = lab.hosts[0].certs().join("ca.pem");
    for (host, ip) in &subs {
        let root = roots.join(host);
        paddock_vm_tests::sh_ok(&format!(
            "cp -a {} {} && ip -n {net} addr add {ip}/24 dev br0",
            dir.join("minbase").display(),
            root.display(),
            net = lab.net
        ))
        .unwrap();
        let excludes: String = FILTER.iter().map(|f| format!(" --exclude '{f}'")).collect();
        let log = lab.dir.join(format!("{host}.log"));
        paddock_vm_tests::sh_ok(&format!(
            "ip netns exec {net} env PADDOCK_LOG=info {subd} --ca {ca} --cert {certs}/{host}.pem \
             --key {certs}/{host}.key --root {root} --listen {ip}:6969 --trigger-command /bin/true --reboot-command /bin/true \
             --device-speed 1073741824 --link-speed 500000 --min-cycle-ms 100 \
             --scan-percent 100 --cpu-percent 100{excludes} >{log} 2>&1 &",
            net = lab.net,
            subd = subd.display(),
            ca = ca_pem.display(),
            certs = sub_certs.display(),
            root = root.display(),
            log = log.display()
        ))
        .unwrap();
    }
    let set = |image: &str| {
        for (host, ip) in &subs {
            let body = json!({"Hostname": host, "IpAddress": ip, "RequiredImage": image});
            let v = lab
                .api_json_any("POST", "/rpc/Mdb.SetMachine", Some(&body.to_string()))
                .unwrap();
            assert!(v.is_object() || v.is_null(), "{v}");
        }
    };
    set("minbase");
    let took = wait_synced(&lab, leader, 2, "minbase", 180);
    println!(
        "ha: 2 subs synced to minbase under h{} in {:.1} s",
        leader + 1,
        took.as_secs_f64()
    );

    set("minbase2");
    let t = Instant::now();
    loop {
        let fetching = subs.iter().any(|(_, ip)| {
            let (_, body) = lab.client(
                &lab.admin(),
                &format!("https://{ip}:6969/rpc/Subd.Poll"),
                "POST",
                Some(r#"{"have_generation": 0, "short_poll_only": true}"#),
            );
            serde_json::from_str::<Value>(&body).is_ok_and(|v| v["fetch_in_progress"] == true)
        });
        if fetching {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no sub ever fetched minbase2: {:#?}\n{}",
            census(&lab, leader),
            lab.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = census(&lab, leader);
    let (t, next) = kill_leader(&mut lab, leader);
    println!(
        "ha: h{} killed during a fetch ({before:?}); h{} leads after {:.2} s",
        leader + 1,
        next + 1,
        t.elapsed().as_secs_f64()
    );
    let took = wait_synced(&lab, next, 2, "minbase2", 480);
    println!(
        "ha: under h{} both subs synced to minbase2 {:.1} s after the kill",
        next + 1,
        t.elapsed().as_secs_f64().max(took.as_secs_f64())
    );
    let want = files(&dir.join("minbase2"));
    assert!(want.len() > 3000, "{}", want.len());
    for (host, _) in &subs {
        let got = files(&roots.join(host));
        let differ: Vec<&String> = want
            .keys()
            .chain(got.keys())
            .filter(|k| want.get(*k) != got.get(*k))
            .take(5)
            .collect();
        assert!(
            differ.is_empty(),
            "{host} differs from minbase2: {differ:?}"
        );
    }
}

/// What host `i` answers for `name`/`rtype` (dig +short, asked from its own namespace),
/// sorted; `None` when it does not answer.
fn dig(lab: &HaLab, i: usize, name: &str, rtype: &str) -> Option<Vec<String>> {
    let h = &lab.hosts[i];
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", &h.ns, "dig", "+short", "+time=1", "+tries=1",
        ])
        .arg(format!("@{}", h.ip))
        .args([name, rtype])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_matches('"').to_string())
        .collect();
    lines.sort();
    Some(lines)
}

/// Host `i`'s forward zone serial.
fn dns_serial(lab: &HaLab, i: usize) -> Option<u32> {
    let soa = dig(lab, i, "paddock.internal", "SOA")?;
    soa.first()?.split_whitespace().nth(2)?.parse().ok()
}

/// Waits until every running host answers `want` for the db service, all under one
/// serial: that serial.
fn same_everywhere(lab: &HaLab, want: &[&str], secs: u64) -> u32 {
    let running: Vec<usize> = (0..3).filter(|i| lab.appliance_pid(*i).is_some()).collect();
    wait_every(
        &format!("{want:?} under one serial on hosts {running:?}"),
        Duration::from_secs(secs),
        Duration::from_millis(100),
        || {
            let serials: Vec<Option<u32>> = running.iter().map(|i| dns_serial(lab, *i)).collect();
            let answers: Vec<_> = running
                .iter()
                .map(|i| dig(lab, *i, "db.svc.paddock.internal", "TXT"))
                .collect();
            // The serials again: a change between the two questions would pair the new
            // records with the old serial.
            let again: Vec<Option<u32>> = running.iter().map(|i| dns_serial(lab, *i)).collect();
            let one = serials[0].filter(|s| serials.iter().all(|o| *o == Some(*s)))?;
            if again != serials {
                return None;
            }
            answers
                .iter()
                .all(|a| {
                    a.as_ref()
                        .is_some_and(|v| v.iter().map(String::as_str).eq(want.iter().copied()))
                })
                .then_some(one)
        },
        || {
            let views: Vec<String> = running
                .iter()
                .map(|i| {
                    format!(
                        "h{}: serial {:?}, {:?}",
                        i + 1,
                        dns_serial(lab, *i),
                        dig(lab, *i, "db.svc.paddock.internal", "TXT")
                    )
                })
                .collect();
            format!("{}\n{}", views.join("\n"), lab.logs())
        },
    )
}

/// Every host answers DNS from its own copy of the store, with the same records under the
/// same serial. The leader's hysteresis decides for all, and a host that takes over the
/// lead goes on from where it was: a self-removal the window held back stays held back.
#[test]
fn every_host_serves_one_zone_under_one_serial_across_a_leader_change() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let mut lab = HaLab::start("dns", &artifacts(), 3).expect("HA lab");
    lab.extra_config = "[dns]\nenabled = true\nself_removal_window_secs = 20\n".into();
    for i in 0..3 {
        lab.start_appliance(i).expect("appliance");
    }
    let leader = first_leader(&lab);
    let via = (leader + 1) % 3;
    let call = |lab: &HaLab, i: usize, path: &str, body: Value| -> Value {
        let (status, text) = lab
            .api(i, "POST", path, Some(&body.to_string()))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    };
    let register = |lab: &HaLab, i: usize, instance: &str| -> u64 {
        let body = json!({"role": "db", "instance": instance, "host": "none", "ttl_secs": 600});
        call(lab, i, "/api/v1/census/register", body)["lease"]
            .as_u64()
            .expect("a lease")
    };
    let leases: Vec<u64> = ["db1", "db2", "db3"]
        .iter()
        .map(|n| register(&lab, via, n))
        .collect();
    let s1 = same_everywhere(&lab, &["db1", "db2", "db3"], 20);

    // db1 says it is down: one self-removal of three members is allowed at once.
    let report = |lab: &HaLab, i: usize, lease: u64| {
        let body = json!({"lease": lease, "status": "down"});
        call(lab, i, "/api/v1/census/status", body);
    };
    // (The removal takes effect after this instant: the window ends 20 s after it at
    // the earliest.)
    let reported = Instant::now();
    report(&lab, via, leases[0]);
    let s2 = same_everywhere(&lab, &["db2", "db3", "verifying:db1"], 10);
    println!(
        "ha dns: a self-removal on every host under one serial in {:.2} s",
        reported.elapsed().as_secs_f64()
    );
    assert!(s2 > s1, "{s2} after {s1}");
    // db2 too, within the window: it stays, on every host, and the serial with it.
    report(&lab, via, leases[1]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        same_everywhere(&lab, &["db2", "db3", "verifying:db1"], 5),
        s2
    );

    // The leader dies. Its successor resumes the window: db2 still stands.
    let (_, next) = kill_leader(&mut lab, leader);
    assert!(
        reported.elapsed() < Duration::from_secs(15),
        "the election took too long for the window to be tested"
    );
    assert_eq!(
        same_everywhere(&lab, &["db2", "db3", "verifying:db1"], 5),
        s2
    );
    // A new member, registered on the new leader: every host, one new serial.
    register(&lab, next, "db4");
    let t = Instant::now();
    let s3 = same_everywhere(&lab, &["db2", "db3", "db4", "verifying:db1"], 10);
    println!(
        "ha dns: a new member on both hosts under one serial in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    assert!(s3 > s2, "{s3} after {s2}");
    // The old leader comes back as a follower and serves the same zone at once.
    lab.start_appliance(leader).expect("appliance");
    assert_eq!(
        same_everywhere(&lab, &["db2", "db3", "db4", "verifying:db1"], 20),
        s3
    );
    // The window ends: db2 leaves, on every host, not before.
    let s4 = same_everywhere(&lab, &["db3", "db4", "verifying:db1", "verifying:db2"], 40);
    let held = reported.elapsed();
    println!(
        "ha dns: the held-back removal took effect {:.1} s after the first",
        held.as_secs_f64()
    );
    assert!(held >= Duration::from_secs(20), "db2 left after {held:?}");
    assert!(s4 > s3);
}
