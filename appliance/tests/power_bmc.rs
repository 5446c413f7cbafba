//! Power throttling and BMC errors through the appliance: the real `paddock serve` drives
//! sushy-tools' Redfish emulators that `scripts/bmc-harness.sh` starts in its own network
//! namespace (198.19.60.0/24). Two appliances, each in a namespace of this test with a veth
//! into the harness's bridge (198.19.60.2 and .3; their API on 198.18.0.1 inside):
//!
//! - the throttle: ten nodes, the emulator's ten fake-driver machines (no VMs), asked to
//!   power on at once (`POST /api/v1/nodes/{node}/power`) with `[power] max_power_ons = 2`,
//!   `interval_secs = 10`; the emulator's own log shows the Resets spaced as configured;
//! - meanwhile, on the other appliance, a node whose BMC has a wrong password and one whose
//!   BMC is unreachable: the API answers the clear error and the node's timeline carries it.
//!
//! Needs root and `scripts/install-deps.sh`; the first run builds the emulators' venv (pip,
//! cached in /var/cache/paddock/bmc-venv).

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

/// An address on the harness's bridge that nobody holds.
const NOBODY: &str = "198.19.60.200";

/// `scripts/bmc-harness.sh run`: everything stops, and its namespace goes, when its stdin
/// closes.
struct Emulators {
    ns: String,
    info: HashMap<String, String>,
    stdin: Option<ChildStdin>,
    child: Child,
}

impl Emulators {
    fn start(scratch: &Scratch) -> Emulators {
        let ns = format!("pwbmc-{}", std::process::id());
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/bmc-harness.sh");
        let mut child = Command::new("bash")
            .args([script, "run", &ns])
            .arg(scratch.path("bmc"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run scripts/bmc-harness.sh");
        let stdin = child.stdin.take();
        let mut ready = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        let info = ready
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("scripts/bmc-harness.sh did not start: {ready:?}"))
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Emulators {
            ns,
            info,
            stdin,
            child,
        }
    }

    fn get(&self, key: &str) -> &str {
        &self.info[key]
    }

    /// A node-creation body: a Redfish node (its boot NIC `mac`) with its BMC at `address`
    /// (System `system`).
    fn node(&self, name: &str, mac: &str, address: &str, system: &str, password: &str) -> String {
        json!({"name": name, "macs": [mac], "driver": "redfish", "driver_info": {
            "redfish_address": address, "redfish_system_id": system,
            "redfish_username": self.get("user"), "redfish_password": password}})
        .to_string()
    }
}

impl Drop for Emulators {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// An appliance in its own namespace: API on 198.18.0.1 there, and `bridge_ip` on a veth
/// into the harness's bridge.
fn appliance(emu: &Emulators, tag: char, bridge_ip: &str) -> (Ns, Scratch, Appliance) {
    let ns = Ns::new(format!("{}{tag}", emu.ns));
    let (inside, outside) = (
        format!("pwb{tag}{}", std::process::id()),
        format!("pwb{tag}h"),
    );
    ns.sh_ok(&format!("ip addr add {SERVER_IP}/32 dev lo"));
    sh_ok(&format!(
        "ip link add {inside} netns {} type veth peer name {outside} netns {} && \
         ip -n {} link set {outside} master br0 up && \
         ip -n {} addr add {bridge_ip}/24 dev {inside} && ip -n {} link set {inside} up",
        ns.name, emu.ns, emu.ns, ns.name, ns.name
    ));
    let own = Scratch::new(&format!("{}{tag}", emu.ns));
    let config = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"{SERVER_IP}:8080\"\n[dhcp]\nenabled = false\n\
         [tftp]\nenabled = false\n[power]\nmax_power_ons = 2\ninterval_secs = 10\n",
        own.path("data").display()
    );
    let app = Appliance::start(&ns, &own, &config);
    (ns, own, app)
}

/// The seconds of day of each `POST …/Actions/ComputerSystem.Reset` the emulator answered
/// (werkzeug's access log: `… [24/Nov/2026 04:20:01] "POST …" 204`), sorted.
fn reset_times(log: &str) -> Vec<u32> {
    let mut at: Vec<u32> = log
        .lines()
        .filter(|l| l.contains("/Actions/ComputerSystem.Reset") && l.contains("\" 204"))
        .filter_map(|l| l.split_once('[')?.1.split_once(']'))
        .filter_map(|(stamp, _)| {
            let mut hms = stamp.rsplit(' ').next()?.split(':');
            let mut next = || hms.next()?.parse::<u32>().ok();
            Some(next()? * 3600 + next()? * 60 + next()?)
        })
        .collect();
    at.sort_unstable();
    at
}

#[test]
fn through_the_appliance_power_ons_are_spaced_and_bad_bmcs_fail_clearly() {
    require(&["curl", "ip", "bash"]);
    let total = Instant::now();
    let scratch = Scratch::new(&format!("power-bmc-{}", std::process::id()));
    let emu = Emulators::start(&scratch);
    eprintln!(
        "bmc harness ready in {:.1} s",
        total.elapsed().as_secs_f64()
    );
    let (throttled, _a_dir, _a) = appliance(&emu, 'a', "198.19.60.2");
    let (other, _b_dir, _b) = appliance(&emu, 'b', "198.19.60.3");
    let (throttled, other) = (&throttled, &other);
    let post = |ns: &Ns, path: &str, body: &str| http(ns, &scratch, "POST", path, Some(body), &[]);

    let ip = emu.get("ip");
    let fake = format!("http://{ip}:{}", emu.get("fake"));
    let count: usize = emu.get("fakes").parse().unwrap();
    let password = emu.get("password");
    for i in 0..count {
        let system = format!("0f000000-0000-4000-8000-{i:012}");
        let r = post(
            throttled,
            "/api/v1/nodes",
            &emu.node(
                &format!("fake-{i}"),
                &format!("52:54:00:19:61:{i:02x}"),
                &fake,
                &system,
                password,
            ),
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let bad = [
        (
            "wrong-password",
            fake.clone(),
            "wrong BMC credentials",
            "HTTP 401",
        ),
        (
            "unreachable",
            format!("http://{NOBODY}:8000"),
            "BMC unreachable",
            "check the BMC address and that the BMC is up",
        ),
    ];
    for (n, (name, address, _, _)) in bad.iter().enumerate() {
        let pw = if *name == "wrong-password" {
            "not-the-password"
        } else {
            password
        };
        let system = "0f000000-0000-4000-8000-000000000000";
        let mac = format!("52:54:00:19:62:{n:02x}");
        let r = post(
            other,
            "/api/v1/nodes",
            &emu.node(name, &mac, address, system, pw),
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }

    // All at once: ten power-ons on the throttled appliance, the two bad BMCs on the other.
    let on = r#"{"action":"on"}"#;
    let started = Instant::now();
    let (answers, failures) = std::thread::scope(|s| {
        let ons: Vec<_> = (0..count)
            .map(|i| {
                let path = format!("/api/v1/nodes/fake-{i}/power");
                s.spawn(move || post(throttled, &path, on))
            })
            .collect();
        let bads: Vec<_> = bad
            .iter()
            .map(|(name, ..)| {
                let path = format!("/api/v1/nodes/{name}/power");
                s.spawn(move || (post(other, &path, on), started.elapsed()))
            })
            .collect();
        // Meanwhile the throttle is visible: the first pair started, eight wait their turn.
        std::thread::sleep(Duration::from_secs(3));
        let v = http(throttled, &scratch, "GET", "/api/v1/power", None, &[]).json();
        let now_ms = u64::try_from(paddock_wire::unix_ms()).unwrap();
        let next_in = v["next_slot_ms"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(now_ms);
        eprintln!(
            "GET /api/v1/power at 3 s: queued={} next slot in {:.1} s",
            v["queued"],
            next_in as f64 / 1000.0
        );
        assert_eq!(
            (v["leading"].as_bool(), v["queued"].as_u64()),
            (Some(true), Some(8)),
            "{v}"
        );
        assert!((1..=10_000).contains(&next_in), "{v}");
        (
            ons.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<Resp>>(),
            bads.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<(Resp, Duration)>>(),
        )
    });

    // Acceptance 3: each bad BMC is a clear API error and an entry on the node's timeline.
    for ((name, _, kind, detail), (r, took)) in bad.iter().zip(&failures) {
        assert_eq!(r.status, 502, "{name}: {}", r.body);
        let message = r.error();
        eprintln!(
            "power on {name}: HTTP {} in {:.1} s: {message}",
            r.status,
            took.as_secs_f64()
        );
        assert!(
            message.starts_with(&format!("node {name}: power on: {kind}"))
                && message.contains(detail),
            "{name}: {message}"
        );
        assert!(!r.body.contains("not-the-password") && !r.body.contains(password));
        let node = http(
            other,
            &scratch,
            "GET",
            &format!("/api/v1/nodes/{name}"),
            None,
            &[],
        );
        let entry = format!("power on failed (operator): {kind}");
        assert!(
            node.body.contains(&entry),
            "{name}'s timeline: {}",
            node.body
        );
    }

    // Acceptance 2: every power-on succeeded, at the times the emulator logged.
    for (i, r) in answers.iter().enumerate() {
        assert_eq!(r.status, 200, "fake-{i}: {}", r.body);
        assert_eq!(r.json()["state"], "on", "fake-{i}: {}", r.body);
    }
    let waited = started.elapsed();
    let log = std::fs::read_to_string(emu.get("fakelog")).unwrap();
    let at = reset_times(&log);
    assert_eq!(
        at.len(),
        count,
        "one Reset per machine in the emulator's log:\n{log}"
    );
    let times: Vec<u32> = at.iter().map(|t| t - at[0]).collect();
    eprintln!("power throttle times_s={times:?} (2 per 10 s, the emulator's log)");
    for w in times.windows(3) {
        // Whole-second stamps: a 10 s spacing can read as 9.
        assert!(w[2] - w[0] >= 9, "3 power-ons within 10 s: {times:?}");
    }
    assert!((39..=45).contains(&times[count - 1]), "{times:?}");
    eprintln!(
        "ten power-ons answered in {:.1} s; whole test {:.1} s",
        waited.as_secs_f64(),
        total.elapsed().as_secs_f64()
    );
}
