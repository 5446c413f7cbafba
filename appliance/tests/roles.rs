//! The role loop end to end: the real appliance leads alone, with BlacKnight's
//! simulation spec; every host is a network namespace whose agent (`paddock census hold
//! --host`) keeps the host's registration alive; the example hooks (`hooks/lib/sim.sh`)
//! start each instance as a `paddock census hold` process — inside the host's namespace for
//! the roles that run on a host — which registers the instance under a store lease.
//!
//! Kill one host's instances → minimum viable is back within one lease TTL plus one round;
//! add a host → capacity grows; kill hosts below the minimum → fail-stop, nothing started.

mod support;

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// The instances' lease TTL (the spec passes it to the hooks as `--ttl`).
const TTL_SECS: u64 = 4;
/// A round at least this often, and 200 ms after a census change.
const ROUND_SECS: u64 = 2;

struct Lab {
    link: Link,
    scratch: Scratch,
    appliance: Appliance,
    hosts: Vec<(Ns, Option<Child>)>,
}

impl Lab {
    /// Host `i` (1-based): a namespace on its own link to the appliance's, 198.18.<10+i>.2,
    /// with its agent registering the host.
    fn add_host(&mut self, i: usize) {
        let tag = self.link.tag.clone();
        let ns = Ns::new(format!("{tag}-h{i}"));
        let (a, b) = (format!("{tag}a{i}"), format!("{tag}b{i}"));
        connect(&self.link.server, &a, &ns, &b);
        let net = 10 + i;
        self.link
            .server
            .sh_ok(&format!("ip addr add 198.18.{net}.1/24 dev {a}"));
        ns.sh_ok(&format!(
            "ip addr add 198.18.{net}.2/24 dev {b} && ip route add default via 198.18.{net}.1"
        ));
        let agent = ns.spawn(
            &format!(
                "{} census hold --url {PUBLIC_URL} --host {} --ttl 2",
                env!("CARGO_BIN_EXE_paddock"),
                ns.name
            ),
            &self.scratch.path(&format!("agent-{i}.log")),
        );
        self.hosts.push((ns, Some(agent)));
    }

    /// SIGKILL of every process in host `i`'s namespace but its agent (the host stays).
    fn kill_instances(&self, i: usize) {
        let (ns, agent) = &self.hosts[i - 1];
        let keep = agent.as_ref().map(|c| c.id()).unwrap_or(0);
        sh_ok(&format!(
            "for p in $(ip netns pids {}); do [ \"$p\" = {keep} ] || kill -9 \"$p\"; done",
            ns.name
        ));
    }

    /// SIGKILL of everything in host `i`'s namespace: the host is dead.
    fn kill_host(&mut self, i: usize) {
        let (ns, agent) = &mut self.hosts[i - 1];
        sh_ok(&format!("ip netns pids {} | xargs -r kill -9", ns.name));
        if let Some(mut c) = agent.take() {
            let _ = c.wait();
        }
    }

    fn post(&self, path: &str, body: &Value) -> Resp {
        let body = body.to_string();
        http(
            &self.link.server,
            &self.scratch,
            "POST",
            path,
            Some(&body),
            &[],
        )
    }

    fn get(&self, path: &str) -> Value {
        let r = http(&self.link.server, &self.scratch, "GET", path, None, &[]);
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        r.json()
    }

    /// role → hosts (`-` for none) of the live instances.
    fn census(&self) -> Vec<(String, String)> {
        let v = self.get("/api/v1/census");
        let mut out: Vec<(String, String)> = v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["role"].as_str().unwrap().to_string(),
                    i["host"].as_str().unwrap_or("-").to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn live_hosts(&self) -> usize {
        self.get("/api/v1/census")["hosts"]
            .as_array()
            .unwrap()
            .len()
    }
}

/// Polls `f` every 200 ms until it holds or `limit` passes; the time it took.
#[track_caller]
fn within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

fn sim_spec() -> String {
    let text = include_str!("../../spec/blacknight-sim.toml");
    // The roles that run on a host get a short lease, so a dead instance leaves quickly.
    let text = text.replace(
        "start = { hook = \"blacknight/start_nc.sh\", args = [\"h\"] }",
        "start = { hook = \"blacknight/start_nc.sh\", args = [\"h\", \"ttl\"] }",
    );
    format!("[args]\nttl = \"{TTL_SECS}\"\n\n{text}")
}

#[test]
fn the_leader_keeps_the_sim_at_minimum_viable_and_grows_it() {
    require(&["ip", "curl", "setsid"]);
    let link = Link::new();
    let scratch = Scratch::new(&format!("{}-roles", link.tag));
    let hooks = scratch.path("hooks");
    sh_ok(&format!(
        "cp -r {}/../hooks {}",
        env!("CARGO_MANIFEST_DIR"),
        hooks.display()
    ));
    let config = base_config(
        &link,
        &scratch,
        &format!(
            "[tftp]\nenabled = false\n[roles]\nhooks_dir = \"{}\"\nround_secs = {ROUND_SECS}\ndebounce_ms = 200\nregister_grace_secs = 5\nquarantine_secs = 5\n",
            hooks.display()
        ),
    );
    let appliance = Appliance::start(&link.server, &scratch, &config);
    let mut lab = Lab {
        link,
        scratch,
        appliance,
        hosts: Vec::new(),
    };
    for i in 1..=4 {
        lab.add_host(i);
    }
    within("4 live hosts", Duration::from_secs(15), || {
        lab.live_hosts() == 4
    });

    // A bad spec is refused with its line and field, and changes nothing.
    let bad = serde_json::json!({"file": "bad.toml", "text": "[roles.a]\nmin = 2\nmax = 1\nstart = { hook = \"x\" }\nstop = { hook = \"y\" }\n"});
    let r = lab.post("/api/v1/spec", &bad);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "bad.toml:3: roles.a.max: impossible bounds: min 2 is above max 1"
    );
    let r = http(
        &lab.link.server,
        &lab.scratch,
        "GET",
        "/api/v1/spec",
        None,
        &[],
    );
    assert_eq!(r.status, 404, "no spec was applied: {}", r.body);

    // The spec: 3 node controllers (the minimum), db, hadoop, 4 apps (what 3 node
    // controllers serve), and the secondary head on the fourth host.
    let spec = serde_json::json!({"file": "spec/blacknight-sim.toml", "text": sim_spec()});
    let r = lab.post("/api/v1/spec", &spec);
    assert_eq!(r.status, 200, "{}", r.body);
    let tag = lab.link.tag.clone();
    let h = |i: usize| format!("{tag}-h{i}");
    let steady = vec![
        ("app".to_string(), "-".to_string()),
        ("app".into(), "-".into()),
        ("app".into(), "-".into()),
        ("app".into(), "-".into()),
        ("db".into(), "-".into()),
        ("hadoop".into(), "-".into()),
        ("node_controller".into(), h(1)),
        ("node_controller".into(), h(2)),
        ("node_controller".into(), h(3)),
        ("secondary_head".into(), h(4)),
    ];
    within(
        "the sim at its steady state",
        Duration::from_secs(30),
        || lab.census() == steady,
    );
    // The live plan is empty now (and previewing runs nothing).
    let r = lab.post("/api/v1/spec/plan", &serde_json::json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["plan"]["actions"], serde_json::json!([]));
    assert_eq!(r.json()["plan"]["outcome"]["state"], "viable");
    // The console's page shows the same: the census, the preview, the rounds.
    let page = http(
        &lab.link.server,
        &lab.scratch,
        "GET",
        "/ui/roles",
        None,
        &[],
    );
    assert_eq!(page.status, 200);
    for want in [
        "spec/blacknight-sim.toml",
        "Census: 4 hosts alive, 10 instances",
        "Plan preview (nothing is run)",
        "outcome: viable",
        "start node_controller node_controller-1 on",
    ] {
        assert!(page.body.contains(want), "{want:?} not in\n{}", page.body);
    }

    // Kill h2's node controller (h2 itself lives on): its lease expires, the next round
    // starts a node controller again on the idle host.
    let last_round = lab.get("/api/v1/spec/rounds?limit=1")[0]["at_ms"]
        .as_i64()
        .unwrap();
    lab.kill_instances(2);
    let killed = Instant::now();
    let restarted_on_h2 = |lab: &Lab| {
        let rounds = lab.get("/api/v1/spec/rounds?limit=50");
        rounds.as_array().unwrap().iter().any(|r| {
            r["at_ms"].as_i64().unwrap() > last_round
                && r["results"].as_array().unwrap().iter().any(|x| {
                    x["ok"] == true
                        && x["action"]["kind"] == "start"
                        && x["action"]["role"] == "node_controller"
                        && x["action"]["why"] == "minimum"
                        && x["action"]["host"] == h(2).as_str()
                })
        })
    };
    assert!(!restarted_on_h2(&lab));
    within(
        "minimum viable restored on h2",
        Duration::from_secs(TTL_SECS + ROUND_SECS + 3),
        || restarted_on_h2(&lab) && lab.census() == steady,
    );
    eprintln!(
        "restored {:.1} s after the kill (TTL {TTL_SECS} s, round {ROUND_SECS} s)",
        killed.elapsed().as_secs_f64()
    );

    // A fifth host: a fourth node controller, and the apps it serves (ceil(6/2 + 1/2 + 1/2)
    // = 4).
    lab.add_host(5);
    within("growth onto h5", Duration::from_secs(20), || {
        let c = lab.census();
        c.contains(&("node_controller".into(), h(5)))
            && c.iter().filter(|(r, _)| r == "app").count() == 6
    });

    // Hosts die until too few remain for the minimum: fail-stop, nothing started.
    for i in 1..=4 {
        lab.kill_host(i);
    }
    within("only h5 alive", Duration::from_secs(15), || {
        lab.live_hosts() == 1
    });
    // The dead hosts' instances leave as their leases expire (the secondary head's is the
    // hooks' default 10 s).
    within(
        "no instance on a dead host",
        Duration::from_secs(15),
        || {
            lab.census()
                .iter()
                .all(|(_, host)| host == "-" || *host == h(5))
        },
    );
    within("the fail-stop round", Duration::from_secs(20), || {
        let rounds = lab.get("/api/v1/spec/rounds?limit=5");
        rounds.as_array().unwrap().iter().any(|r| {
            r["plan"]["outcome"]["state"] == "fail_stop"
                && r["plan"]["actions"] == serde_json::json!([])
                && r["results"] == serde_json::json!([])
        })
    });
    // The leader runs exactly a round's actions, and while the census stays as it is every
    // later plan is this one (the engine is a function of spec and census): the plan is
    // fail-stop with no actions, so nothing starts or stops, without waiting rounds out.
    let plan = lab.post("/api/v1/spec/plan", &serde_json::json!({})).json();
    assert_eq!(plan["plan"]["outcome"]["state"], "fail_stop");
    assert_eq!(plan["plan"]["actions"], serde_json::json!([]), "{plan}");
    let reason = plan["plan"]["outcome"]["reason"].as_str().unwrap();
    assert!(
        reason
            .starts_with("minimum viable cannot be reached: node_controller needs 2 more host(s)"),
        "{reason}"
    );
    let log = lab.appliance.log_text();
    assert!(log.contains("fail-stop"), "the log says so:\n{log}");
}

/// `paddock spec check` reads files only: it works with no appliance to reach and no
/// credentials (here: an HTTPS API whose CA file does not exist).
#[test]
fn spec_check_needs_no_appliance() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/appliance.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paddock"))
        .args(["spec", "check"])
        .arg(&spec)
        .env("PADDOCK_API", "https://198.18.0.254:1")
        .env("PADDOCK_CA", "/nonexistent/ca.pem")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
